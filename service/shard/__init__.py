"""Shard servers: RocksDB shards for the partitions a server owns, behind an internal gRPC API."""
