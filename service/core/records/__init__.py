"""What qstate keeps in checkpoint storage and how it is laid out: the storage backends, paths,
the catalog of batches, manifests, deltas, the partition assignment, savepoints and operator
specs (docs/architecture.md §1)."""
