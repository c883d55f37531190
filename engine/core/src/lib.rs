//! qstate's read engine (docs/architecture.md §5): reads the partitions a router reads on
//! its host (RocksDB secondaries of the shards' primaries), and answers the router's hot
//! reads on its public HTTP port, handing every other request to the Python app. Plain
//! Rust: the PyO3 face is the crate `qstate-engine-py` (module `qstate._engine`).

pub mod address;
pub mod codec;
pub mod engine;
pub mod errors;
pub mod front;
pub mod grpc;
pub mod hll;
pub mod json;
pub mod layout;
pub mod local;
pub mod marker;
pub mod meta;
pub mod metrics;
pub mod query;
pub mod read;
pub mod remote;
pub mod secondary;
pub mod spec;
pub mod table;
pub mod timeparse;
pub mod tls;
pub mod tokens;
pub mod upstream;
pub mod windows;

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
