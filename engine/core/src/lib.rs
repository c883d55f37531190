//! qstate's read engine (docs/architecture.md §5): the read core every front of a router
//! calls (`read`, with its HTTP and gRPC faces `http` and `grpc`), the partitions it reads on
//! its host (`local`, RocksDB secondaries of the shards' primaries, in the format of
//! `partition`), the owners' shards it asks for the others (`remote`), the native HTTP
//! front that holds the router's public port (`front`), and the owner's reader a shard server
//! answers other hosts' routers with (`reader`). Plain Rust: the PyO3 face is the crate
//! `qstate-engine-py` (module `qstate._engine`).

pub mod address;
pub mod auth;
pub mod engine;
pub mod errors;
pub mod front;
pub mod grpc;
pub mod grpc_threads;
pub mod http;
pub mod local;
pub mod metrics;
pub mod partition;
pub mod read;
pub mod reader;
pub mod remote;
pub mod settings;
pub mod spec;
pub mod table;
pub mod time;

#[cfg(test)]
mod vectors;

/// The shards' internal API (proto/shard.proto).
#[allow(clippy::all, clippy::pedantic)]
pub mod shardpb {
    include!(concat!(env!("OUT_DIR"), "/qstate.shard.v1.rs"));
}

/// The public API (proto/qstate.proto).
#[allow(clippy::all, clippy::pedantic)]
pub mod publicpb {
    include!(concat!(env!("OUT_DIR"), "/qstate.v1.rs"));
}
