"""What every qstate process shares: the primitives here (address, config, errors, windows,
answer) and three groups: ``records`` (what is kept in checkpoint storage), ``transport``
(transport and trust) and ``process`` (a process's own plumbing); docs/architecture.md §1."""
