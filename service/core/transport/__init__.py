"""Transport and trust: TLS and tokens, the shard client, gRPC health, Kafka client settings,
values on the wire and files written safely (docs/architecture.md §1)."""
