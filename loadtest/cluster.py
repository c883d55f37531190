"""Repeat the multi-host scenarios and tabulate them: lost, doubled, time to answer again.

    sudo python -m loadtest.cluster --repeats 3

Runs ``pytest tests/cluster -s`` (root: it builds hosts as network namespaces,
``loadtest.netns``) ``--repeats`` times, each on a fresh cluster: a Spark standalone master,
two worker hosts each with a shard server, the driver, the router and the Kafka broker on
hosts of their own (tests/cluster/harness.py). Scenarios: a worker host's link cut for
10 s, a worker host killed whole, and a worker host killed while the job is down (the
standby, `qstate coordinator`, moves its partitions). Appends the table to ``--out``.
"""

from __future__ import annotations

from loadtest.chaos import repeat


def main() -> None:
    repeat("loadtest.cluster", ["tests/cluster"], "cluster",
           "6 hosts as network namespaces; ~2K tweet events/s over 100K ids, ≤3 s out of "
           "order, 1% late; P=8; Spark standalone, 2 workers × 2 cores, a shard per worker; "
           "lease 10 s (tests/chaos/harness.py LEASE_S)", __doc__.split("\n")[0])


if __name__ == "__main__":
    main()
