//! `qstate_engine` (imported as `qstate._engine`): the thin Python face of the read engine (docs/architecture.md §5).
//! Python pushes what it knows (settings, the routing table, co-located servers and their
//! ready partitions, client tokens) and reads through it; every RocksDB call and the
//! native front run without the GIL. No panic crosses into Python: a panic in a call is
//! raised as `RuntimeError` (pyo3's `PanicException`), a failure as the matching OSError or
//! ValueError.

use std::collections::{BTreeSet, HashSet};
use std::net::TcpListener;
use std::os::fd::FromRawFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use qstate_engine_core::address::PartitionId;
use qstate_engine_core::codec::Value;
use qstate_engine_core::engine::{Engine as Core, Settings};
use qstate_engine_core::front::{Front, FrontConfig};
use qstate_engine_core::local::{LocalServer, Miss, Operator};
use qstate_engine_core::metrics::Histogram;
use qstate_engine_core::remote::{Callers, Remote};
use qstate_engine_core::spec::OperatorSpec;
use qstate_engine_core::table::{Entry, Table};
use qstate_engine_core::tokens::{Book, Principal};

fn value(py: Python<'_>, v: Value) -> Py<PyAny> {
    match v {
        Value::Null => py.None(),
        Value::Long(x) => x.into_pyobject(py).expect("int").into_any().unbind(),
        Value::Double(x) => x.into_pyobject(py).expect("float").into_any().unbind(),
    }
}

#[pyclass(module = "qstate_engine", frozen)]
struct Engine {
    core: Arc<Core>,
    front: parking_lot::Mutex<Option<Front>>,
}

type Op = (Vec<u8>, Vec<Option<String>>, Vec<Vec<String>>);

#[pymethods]
impl Engine {
    /// `scratch`: a folder for the secondaries' own files; `cache_bytes`: their shared block
    /// cache.
    #[new]
    fn new(scratch: PathBuf, cache_bytes: usize) -> Self {
        Engine { core: Arc::new(Core::new(scratch, cache_bytes)), front: parking_lot::Mutex::new(None) }
    }

    #[allow(clippy::too_many_arguments)]
    fn set_settings(
        &self,
        max_batch_keys: usize,
        max_windows: usize,
        max_request_windows: usize,
        min_batch_wait_s: f64,
        retry_after_s: f64,
        max_body_bytes: usize,
        max_concurrent: usize,
        metrics_public: bool,
    ) {
        self.core.settings.store(Arc::new(Settings {
            max_batch_keys,
            max_windows,
            max_request_windows,
            min_batch_wait_s,
            retry_after_s,
            max_body_bytes,
            max_concurrent,
            metrics_public,
        }));
    }

    /// The routing table: per operator its spec (`OperatorSpec.to_json()`), each partition's
    /// owner (None: unassigned) and followers.
    fn set_table(&self, ops: Vec<Op>) -> PyResult<()> {
        let mut t = Table::default();
        for (spec, owners, followers) in ops {
            let spec = OperatorSpec::from_json(&spec).map_err(PyValueError::new_err)?;
            t.insert(Entry {
                op: Operator::new(spec),
                owners: owners.into_iter().map(|o| o.map(Arc::from)).collect(),
                followers: followers.into_iter().map(|f| f.into_iter().map(Arc::from).collect()).collect(),
            });
        }
        self.core.table.store(Arc::new(t));
        Ok(())
    }

    /// The shard servers on this host: (address, data folder, pid).
    fn set_servers(&self, servers: Vec<(String, PathBuf, i32)>) {
        self.core.local.set_servers(
            servers.into_iter().map(|(address, data_dir, pid)| LocalServer { address, data_dir, pid }).collect(),
        );
    }

    /// The partitions `address` serves now (its Describe: not restoring).
    fn set_ready(&self, address: &str, partitions: Vec<(String, String, u32)>) {
        let ready: HashSet<PartitionId> =
            partitions.into_iter().map(|(job, operator, partition)| PartitionId { job, operator, partition }).collect();
        self.core.local.set_ready(address, ready);
    }

    /// The client tokens (sha256 hex, name, scopes), or None: the router asks for none.
    fn set_tokens(&self, tokens: Option<Vec<(String, String, Vec<String>)>>) {
        self.core.book.store(tokens.map(|t| {
            Arc::new(Book {
                entries: t
                    .into_iter()
                    .map(|(h, name, scopes)| {
                        (h, Principal { name, scopes: scopes.into_iter().collect::<BTreeSet<_>>() })
                    })
                    .collect(),
            })
        }));
    }

    /// How to reach shard servers for partitions elsewhere: the cluster token, TLS (a PEM CA
    /// bundle, the name certificates are checked against), the deadline of a lookup, the
    /// most keys waiting for one shard.
    #[pyo3(signature = (token, tls_ca, tls_server_name, timeout_s, max_queue))]
    fn set_callers(
        &self,
        token: Option<String>,
        tls_ca: Option<Vec<u8>>,
        tls_server_name: Option<String>,
        timeout_s: f64,
        max_queue: usize,
    ) {
        self.core.remote.store(Some(Remote::new(Callers {
            token,
            tls_ca,
            tls_server_name,
            timeout: Duration::from_secs_f64(timeout_s),
            max_queue,
        })));
    }

    /// Keys of one partition from its owner's files on this host, as of one batch:
    /// (batch, watermark, per key (found, windows [(start, end, value)], next_from)), or None
    /// (ask the owner). `limit`: windows per key of a range (the answer says where the next
    /// page starts). The batch is the one the partition's marker named when the read began
    /// or a later one (a catch-up under way is waited for).
    #[allow(clippy::too_many_arguments)]
    fn read_local<'py>(
        &self,
        py: Python<'py>,
        owner: &str,
        job: &str,
        operator: &str,
        partition: u32,
        state: &str,
        keys: Vec<String>,
        range: Option<(i64, i64)>,
        limit: usize,
    ) -> PyResult<Option<Bound<'py, PyList>>> {
        let table = self.core.table.load_full();
        let Some(entry) = table.get(job, operator).cloned() else { return Ok(None) };
        let Some(state) = entry.op.spec.state_index(state) else { return Ok(None) };
        let core = self.core.clone();
        let got = py.detach(|| {
            let ks: Vec<&str> = keys.iter().map(String::as_str).collect();
            // Python counts its reads (`qstate.router.reads`)
            core.read_local(owner, &entry, partition, state, &ks, range, limit)
        });
        let hits = match got {
            Ok(h) => h,
            Err(Miss::NotHere | Miss::Unsupported(_) | Miss::Failed(_)) => return Ok(None),
        };
        let out = PyList::empty(py);
        for h in hits {
            let ws = PyList::empty(py);
            for w in &h.windows {
                ws.append((w.start, w.end, value(py, w.value)))?;
            }
            out.append((h.found, h.batch, h.watermark_ms, ws, h.next_from))?;
        }
        Ok(Some(out))
    }

    /// The answer's bytes to a gRPC `Get` (`multi`: `MultiGet`) of partitions on this host,
    /// from the request's bytes, or None: Python's own path answers it.
    fn grpc_read<'py>(&self, py: Python<'py>, request: &[u8], multi: bool) -> Option<Bound<'py, PyBytes>> {
        let core = self.core.clone();
        let got = py.detach(|| {
            if multi {
                qstate_engine_core::grpc::multi_get(&core, request)
            } else {
                qstate_engine_core::grpc::get(&core, request)
            }
        })?;
        Some(PyBytes::new(py, &got))
    }

    /// Serve the router's public HTTP port: the listening socket `fd` (a parent's, with
    /// `--workers`) or `host:port` bound here; requests the engine does not answer go to the
    /// app on the Unix socket `upstream`. The port bound.
    #[pyo3(signature = (upstream, threads, fd=None, host="127.0.0.1", port=0, tls_cert=None, tls_key=None))]
    #[allow(clippy::too_many_arguments)]
    fn serve(
        &self,
        py: Python<'_>,
        upstream: PathBuf,
        threads: usize,
        fd: Option<i32>,
        host: &str,
        port: u16,
        tls_cert: Option<PathBuf>,
        tls_key: Option<PathBuf>,
    ) -> PyResult<u16> {
        let listener = match fd {
            // SAFETY: the fd is a listening socket Python holds for this process and hands over
            Some(fd) => unsafe { TcpListener::from_raw_fd(libc_dup(fd)?) },
            None => TcpListener::bind((host, port)).map_err(|e| PyOSError::new_err(format!("{host}:{port}: {e}")))?,
        };
        let bound = listener.local_addr().map_err(|e| PyOSError::new_err(e.to_string()))?.port();
        let tls = match (tls_cert, tls_key) {
            (Some(c), Some(k)) => Some((c, k)),
            _ => None,
        };
        let core = self.core.clone();
        let front = py
            .detach(|| Front::start(core, FrontConfig { listener, tls, upstream, threads }))
            .map_err(|e| PyOSError::new_err(e.to_string()))?;
        *self.front.lock() = Some(front);
        Ok(bound)
    }

    /// Stop the front: no new connection, the requests under way finish (at most
    /// `grace_s`).
    fn stop(&self, py: Python<'_>, grace_s: f64) {
        let front = self.front.lock().take();
        if let Some(mut f) = front {
            py.detach(|| f.stop(Duration::from_secs_f64(grace_s.max(0.0))));
        }
    }

    /// What the engine counted since the last call (the router adds it to its series).
    fn take_metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let t = self.core.metrics.take();
        let d = PyDict::new(py);
        d.set_item("requests", t.requests)?;
        d.set_item("latency", histograms(t.latency))?;
        d.set_item("reads", t.reads)?;
        d.set_item("unavailable", t.unavailable)?;
        d.set_item("refused", t.refused)?;
        d.set_item("catchups", histograms(t.catchups))?;
        Ok(d)
    }

    /// Start the follower: every `every_s`, the partitions read lately are caught up with
    /// their shard's commits off the read path (docs/architecture.md §5).
    fn start_follower(&self, every_s: f64) -> PyResult<()> {
        let every = Duration::try_from_secs_f64(every_s)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| PyValueError::new_err("every_s must be a positive number of seconds"))?;
        self.core.start_follower(every).map_err(|e| PyOSError::new_err(e.to_string()))
    }

    /// Whether the engine has a routing table to answer by.
    fn ready(&self) -> bool {
        !self.core.table.load().is_empty()
    }

    /// Close every partition and remove the scratch folder.
    fn close(&self, py: Python<'_>) {
        self.stop(py, 0.0);
        py.detach(|| {
            self.core.stop_follower();
            self.core.local.close()
        });
    }
}

/// Histograms by label as `qstate.router.metrics.add_engine_counts` takes them: the label,
/// each bucket's count (not cumulative, +Inf last) and the sum.
fn histograms(by: Vec<(&'static str, Histogram)>) -> Vec<(&'static str, Vec<u64>, f64)> {
    by.into_iter().map(|(label, h)| (label, h.counts.to_vec(), h.sum)).collect()
}

fn libc_dup(fd: i32) -> PyResult<i32> {
    let d = unsafe { libc::dup(fd) };
    if d < 0 {
        return Err(PyOSError::new_err(std::io::Error::last_os_error().to_string()));
    }
    Ok(d)
}

/// Bytes of a shared test vector, decoded as the engine reads them (tests only): the
/// `state`-th answer of one stored value, or of several folded as panes.
#[pyfunction]
fn decode_value(py: Python<'_>, spec: &[u8], state: usize, values: Vec<Vec<u8>>) -> PyResult<(Option<i64>, Py<PyAny>)> {
    let spec = OperatorSpec::from_json(spec).map_err(PyValueError::new_err)?;
    let codec = qstate_engine_core::codec::Codec::new(&spec);
    if values.len() == 1 && !spec.panes() {
        let (end, v) = codec.answer_of(&values[0], state).map_err(|u| PyValueError::new_err(u.0))?;
        return Ok((Some(end), value(py, v)));
    }
    let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
    let v = codec.fold_answer(&refs, state).map_err(|u| PyValueError::new_err(u.0))?;
    Ok((None, value(py, v)))
}

/// The JSON bytes the native front writes for a double (tests only).
#[pyfunction]
fn float_json<'py>(py: Python<'py>, v: f64) -> Bound<'py, PyBytes> {
    let mut out = Vec::new();
    qstate_engine_core::json::push_f64(&mut out, v);
    PyBytes::new(py, &out)
}

#[pymodule]
fn qstate_engine(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Engine>()?;
    m.add_function(wrap_pyfunction!(decode_value, m)?)?;
    m.add_function(wrap_pyfunction!(float_json, m)?)?;
    Ok(())
}
