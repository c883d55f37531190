"""The control plane: which shard server owns and follows which partition. Membership and
leases, placement (make-before-break), epochs that fence stale writers, the standby that moves
partitions while a job's driver is down, and the offline rescale of a partition count
(docs/architecture.md §4). Nothing here imports a job: jobs and tools drive it."""
