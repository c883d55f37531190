//! Values between Python and the engine (an answer's value, a hit's fields), and the module's
//! functions that Python's own routes and the tests call so a rule is written once, in the
//! engine: times, the read routes, an answer's JSON and protobuf bytes, stored values decoded
//! and a partition's windows read as the engine reads them.

use std::path::PathBuf;

use prost::Message;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use qstate_engine_core::grpc;
use qstate_engine_core::http::{self, json};
use qstate_engine_core::local::Operator;
use qstate_engine_core::partition::codec::{Codec, Value};
use qstate_engine_core::partition::read::Window;
use qstate_engine_core::read::Hit;
use qstate_engine_core::spec::OperatorSpec;

use crate::bridge::py_err;

pub fn value(py: Python<'_>, v: Value) -> Py<PyAny> {
    match v {
        Value::Null => py.None(),
        Value::Long(x) => x.into_pyobject(py).expect("int").into_any().unbind(),
        Value::Double(x) => x.into_pyobject(py).expect("float").into_any().unbind(),
    }
}

fn value_of(v: &Bound<'_, PyAny>) -> PyResult<Value> {
    if v.is_none() {
        Ok(Value::Null)
    } else if let Ok(i) = v.extract::<i64>() {
        if v.is_instance_of::<pyo3::types::PyFloat>() {
            return Ok(Value::Double(v.extract::<f64>()?));
        }
        Ok(Value::Long(i))
    } else {
        Ok(Value::Double(v.extract::<f64>()?))
    }
}

/// A hit as Python's `qstate.router.hits.Hit` fields: (found, batch, watermark, windows
/// [(start, end, value)], next_from).
pub fn hit_tuple(py: Python<'_>, h: &Hit) -> PyResult<Py<PyAny>> {
    let ws = PyList::empty(py);
    for w in &h.windows {
        ws.append((w.start, w.end, value(py, w.value)))?;
    }
    Ok((h.found, h.batch, h.watermark_ms, ws, h.next_from).into_pyobject(py)?.into_any().unbind())
}

/// A hit from Python's fields (the watch hub's, encoded for an event).
pub fn hit_of(
    found: bool,
    batch: i64,
    watermark: i64,
    windows: &Bound<'_, PyList>,
    next_from: Option<i64>,
) -> PyResult<Hit> {
    let mut ws = Vec::with_capacity(windows.len());
    for w in windows.iter() {
        let (start, end, v): (Option<i64>, Option<i64>, Bound<'_, PyAny>) = w.extract()?;
        ws.push(Window { start, end, value: value_of(&v)? });
    }
    Ok(Hit { found, batch, watermark_ms: watermark, windows: ws, next_from })
}

/// A time parameter (`from`, `to`, a top-N's `window`) as epoch ms (`now_ms`: the clock's
/// when None); raises InvalidRequest saying which forms a time takes.
#[pyfunction]
#[pyo3(signature = (name, value, now_ms=None))]
pub fn parse_time(py: Python<'_>, name: &str, value: &str, now_ms: Option<i64>) -> PyResult<i64> {
    let now = now_ms.unwrap_or_else(qstate_engine_core::time::now_ms);
    qstate_engine_core::time::parse_time(name, value, now).map_err(|f| py_err(py, &f))
}

/// The read route a request is (its template), by its method and raw path, as the read core
/// and the native front tell them; None: not a read.
#[pyfunction]
pub fn read_route(method: &str, raw_path: &str) -> Option<&'static str> {
    http::route(method, raw_path).map(|t| t.route.template())
}

/// One key's answer as JSON (a `StateAnswer`): the bytes every read answers with, for the
/// watch hub's events.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn answer_json<'py>(
    py: Python<'py>,
    job: &str,
    operator: &str,
    state: &str,
    key: &str,
    found: bool,
    batch: i64,
    watermark: i64,
    windows: &Bound<'py, PyList>,
    next_from: Option<i64>,
) -> PyResult<Bound<'py, PyBytes>> {
    let h = hit_of(found, batch, watermark, windows, next_from)?;
    let mut out = Vec::with_capacity(256);
    json::push_answer(&mut out, job, operator, state, key, &h);
    Ok(PyBytes::new(py, &out))
}

/// One key's answer as a serialized `qstate.v1.StateValue`, for the watch hub's gRPC events.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn state_value<'py>(
    py: Python<'py>,
    job: &str,
    operator: &str,
    state: &str,
    key: &str,
    found: bool,
    batch: i64,
    watermark: i64,
    windows: &Bound<'py, PyList>,
    next_from: Option<i64>,
) -> PyResult<Bound<'py, PyBytes>> {
    let h = hit_of(found, batch, watermark, windows, next_from)?;
    Ok(PyBytes::new(py, &grpc::value(job, operator, state, key, &h).encode_to_vec()))
}

/// Bytes of stored values decoded as the engine reads them (tests: `tests/vectors`): the
/// `state`-th answer of one value, or of several folded as a window's panes.
#[pyfunction]
pub fn decode_value(
    py: Python<'_>,
    spec: &[u8],
    state: usize,
    values: Vec<Vec<u8>>,
) -> PyResult<(Option<i64>, Py<PyAny>)> {
    let spec = OperatorSpec::from_json(spec).map_err(PyValueError::new_err)?;
    let codec = Codec::new(&spec);
    if values.len() == 1 && !spec.panes() {
        let (end, v) = codec.answer_of(&values[0], state).map_err(|c| PyValueError::new_err(c.0))?;
        return Ok((Some(end), value(py, v)));
    }
    let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
    let v = codec.fold_answer(&refs, state).map_err(|c| PyValueError::new_err(c.0))?;
    Ok((None, value(py, v)))
}

/// Keys' windows read from a partition's RocksDB folder opened read-only, as the engine reads
/// a secondary (tests: the differential property against the shard's reader): per key
/// (windows [(start, end, value)], next_from), and the META's (batch, watermark).
#[pyfunction]
#[pyo3(signature = (path, spec, state, keys, range, limit))]
#[allow(clippy::type_complexity)]
pub fn read_partition(
    py: Python<'_>,
    path: PathBuf,
    spec: &[u8],
    state: usize,
    keys: Vec<String>,
    range: Option<(i64, i64)>,
    limit: usize,
) -> PyResult<((i64, i64), Vec<Py<PyAny>>)> {
    let spec = OperatorSpec::from_json(spec).map_err(PyValueError::new_err)?;
    let op = Operator::new(spec);
    let got = py.detach(|| qstate_engine_core::local::read_folder(&path, &op, state, &keys, range, limit));
    let (meta, per_key) = got.map_err(PyValueError::new_err)?;
    let mut out = Vec::with_capacity(per_key.len());
    for (windows, next_from) in per_key {
        let ws = PyList::empty(py);
        for w in &windows {
            ws.append((w.start, w.end, value(py, w.value)))?;
        }
        out.push((ws, next_from).into_pyobject(py)?.into_any().unbind());
    }
    Ok((meta, out))
}
