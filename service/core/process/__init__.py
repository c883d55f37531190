"""A process's own plumbing: starting children (start), readiness probes, the JVM, planted
faults (docs/architecture.md §1)."""
