"""A process's own plumbing: starting children (start), how it forks (forks), readiness
probes, the JVM, planted faults (docs/architecture.md §1)."""
