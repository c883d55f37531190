//! One partition's format as the engine reads it (docs/architecture.md §5, "Value layout"):
//! the key layout, the value layout and its sketches, the META record, the commit marker,
//! window arithmetic, and a key's windows read from a RocksDB instance. The shard writes the
//! format (`qstate.partition`); `tests/vectors/values.json` pins the bytes both read.

pub mod codec;
pub mod hll;
pub mod layout;
pub mod marker;
pub mod meta;
pub mod read;
pub mod windows;
