//! The classes and functions of `qstate_engine`, registered: `Engine` (`engine.rs`),
//! `Principal` (`principal.rs`) and the functions of `values.rs`.

use pyo3::prelude::*;

use qstate_engine_core::metrics::BUCKETS;
use qstate_engine_core::reader;
use qstate_engine_core::settings::MIN_BATCH_POLL;

use crate::engine::Engine;
use crate::principal::Principal;
use crate::values::{answer_json, decode_value, parse_time, read_partition, read_route, state_value};

pub fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Engine>()?;
    m.add_class::<Principal>()?;
    m.add("LATENCY_BUCKETS", BUCKETS.to_vec())?;
    m.add("LOOKUP_BUCKETS", reader::BUCKETS.to_vec())?;
    m.add("MIN_BATCH_POLL_S", MIN_BATCH_POLL.as_secs_f64())?;
    m.add_function(wrap_pyfunction!(parse_time, m)?)?;
    m.add_function(wrap_pyfunction!(read_route, m)?)?;
    m.add_function(wrap_pyfunction!(answer_json, m)?)?;
    m.add_function(wrap_pyfunction!(state_value, m)?)?;
    m.add_function(wrap_pyfunction!(decode_value, m)?)?;
    m.add_function(wrap_pyfunction!(read_partition, m)?)?;
    Ok(())
}
