//! `qstate_engine` (imported as `qstate._engine`): the thin Python face of the read engine
//! (docs/architecture.md §5). Python pushes what it knows (settings, the routing table,
//! co-located servers and their ready partitions, client tokens, how to call shards) and asks
//! the read core for answers: HTTP's (`http`), gRPC's (`grpc`) and hits (`read`, the watch
//! hub's). A read that must wait settles an asyncio future from an engine thread; every RocksDB
//! call, wait and encoding runs without the GIL. No panic crosses into Python: each is raised as
//! `qstate.errors.EngineFailed`, a failure as the `qstate.errors` class it names.

mod bridge;
mod engine;
mod face;
mod principal;
mod values;

use pyo3::prelude::*;

#[pymodule]
fn qstate_engine(m: &Bound<'_, PyModule>) -> PyResult<()> {
    bridge::init(m)?;
    face::init(m)
}
