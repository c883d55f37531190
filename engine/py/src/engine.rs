//! `Engine`: one per router process (and one per shard server, for its reader). Python pushes what it knows (settings, the routing table,
//! co-located servers and their ready partitions, client tokens, how to call shards) and asks
//! the read core for answers: HTTP's (`http`), gRPC's (`grpc`) and hits (`read`).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::TcpListener;
use std::os::fd::FromRawFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use qstate_engine_core::address::PartitionId;
use qstate_engine_core::auth::{door, Book, Principal as CorePrincipal};
use qstate_engine_core::engine::Engine as Core;
use qstate_engine_core::errors::{seconds, Failure};
use qstate_engine_core::front::grpc_port::{GrpcPort, GrpcPortConfig};
use qstate_engine_core::front::{Front, FrontConfig};
use qstate_engine_core::grpc::{self, Method};
use qstate_engine_core::http;
use qstate_engine_core::local::{LocalServer, Operator};
use qstate_engine_core::metrics::Histogram;
use qstate_engine_core::read::{self as core_read, Ask, Now, Outcome};
use qstate_engine_core::reader::serve::{ReaderConfig, ReaderServer};
use qstate_engine_core::reader::Reader;
use qstate_engine_core::remote::Callers;
use qstate_engine_core::settings::{Fault, Settings};
use qstate_engine_core::spec::OperatorSpec;
use qstate_engine_core::table::{self, Entry, Table};

use crate::bridge::{guard, py_err, runtime, spawn, Later};

/// The route label of a request no route matched (Python's `_Measured` says the same).
const UNMATCHED: &str = "unmatched";
use crate::principal::Principal;
use crate::values::hit_tuple;

fn settings_of(d: &Bound<'_, PyDict>) -> PyResult<Settings> {
    let get = |k: &str| -> PyResult<Bound<'_, PyAny>> {
        d.get_item(k)?.ok_or_else(|| PyValueError::new_err(format!("settings: {k} missing")))
    };
    let secs = |k: &str| -> PyResult<Duration> {
        let s: f64 = get(k)?.extract()?;
        Duration::try_from_secs_f64(s).map_err(|_| PyValueError::new_err(format!("settings: {k} = {s}")))
    };
    let fault: String = get("fault")?.extract()?;
    Ok(Settings {
        max_batch_keys: get("max_batch_keys")?.extract()?,
        max_windows: get("max_windows")?.extract()?,
        max_request_windows: get("max_request_windows")?.extract()?,
        min_batch_wait: secs("min_batch_wait_s")?,
        retry_after_s: get("retry_after_s")?.extract()?,
        max_body_bytes: get("max_body_bytes")?.extract()?,
        max_concurrent: get("max_concurrent_requests")?.extract()?,
        metrics_public: get("metrics_public")?.extract()?,
        shard_timeout: secs("shard_timeout_s")?,
        max_shard_queue: get("max_shard_queue")?.extract()?,
        fault: Fault::parse(&fault),
    })
}

#[pyclass(module = "qstate_engine", frozen)]
pub struct Engine {
    core: Arc<Core>,
    front: parking_lot::Mutex<Option<Front>>,
    /// the owner's reader, in a shard server's process
    reader: parking_lot::Mutex<Option<ReaderServer>>,
    /// the router's public gRPC port
    grpc_port: parking_lot::Mutex<Option<GrpcPort>>,
}

type Op = (Vec<u8>, Vec<Option<String>>, Vec<Vec<String>>);
/// (job, operator, per partition the owner's (server id, read URL or ""), None: unassigned)
type Named = (String, String, Vec<OwnerName>);
/// A partition's owner as answers name it: (server id, read URL or ""), None: unassigned.
type OwnerName = Option<(String, String)>;

fn http_tuple(py: Python<'_>, a: http::Answer) -> PyResult<Py<PyAny>> {
    Ok((a.status, a.headers, PyBytes::new(py, &a.body)).into_pyobject(py)?.into_any().unbind())
}

/// gRPC's answer: ("ok", bytes) or ("error", code name, message, trailers).
fn grpc_tuple(py: Python<'_>, got: Result<Vec<u8>, Failure>) -> PyResult<Py<PyAny>> {
    Ok(match got {
        Ok(b) => ("ok", PyBytes::new(py, &b)).into_pyobject(py)?.into_any().unbind(),
        Err(f) => {
            ("error", f.grpc_code().name(), f.message.clone(), f.trailers()).into_pyobject(py)?.into_any().unbind()
        }
    })
}

fn hits_list(py: Python<'_>, o: &Outcome) -> PyResult<Py<PyAny>> {
    let out = PyList::empty(py);
    for h in &o.hits[0] {
        out.append(hit_tuple(py, h)?)?;
    }
    Ok(out.into_any().unbind())
}

type Make = Box<dyn FnOnce(Python<'_>, Result<Outcome, Failure>) -> PyResult<Py<PyAny>> + Send>;

impl Engine {
    /// A read's answer now, or (None) later: `later` settled with what `make` makes of it.
    fn answer(
        &self,
        py: Python<'_>,
        ask: Result<Ask, Failure>,
        later: Later,
        make: Make,
    ) -> PyResult<Option<Py<PyAny>>> {
        let core = self.core.clone();
        let now = guard(py, Some(&core), || {
            Ok(py.detach(|| match ask {
                Err(f) => Now::Done(Err(f)),
                Ok(a) => core_read::answer_now(&core, a),
            }))
        })?;
        match now {
            Now::Done(r) => guard(py, Some(&core), || make(py, r)).map(Some),
            Now::Later(l) => {
                let c = core.clone();
                spawn(&core, later, async move { core_read::finish(&c, l).await }, make);
                Ok(None)
            }
        }
    }
}

#[pymethods]
impl Engine {
    /// `scratch`: a folder for the secondaries' own files; `cache_bytes`: their shared block
    /// cache; `settings`: the router's (`qstate.router.engine.engine_settings`).
    #[new]
    fn new(scratch: PathBuf, cache_bytes: usize, settings: &Bound<'_, PyDict>) -> PyResult<Self> {
        let core =
            Core::new(scratch, cache_bytes, settings_of(settings)?).map_err(|e| PyOSError::new_err(e.to_string()))?;
        Ok(Engine {
            core: Arc::new(core),
            front: parking_lot::Mutex::new(None),
            reader: parking_lot::Mutex::new(None),
            grpc_port: parking_lot::Mutex::new(None),
        })
    }

    /// The routing table: per operator its spec (`OperatorSpec.to_json()`), each partition's
    /// owner (None: unassigned) and followers; the storage it came from, and whether an unknown
    /// job's 404 may name the jobs served.
    /// `readers`: (a shard server's address, its reader's) for the servers that have one: a
    /// live read of their partitions is asked there (docs/architecture.md §5, cluster reads).
    /// `named`: per operator (job, operator, per partition its owner's (server id, the URL of a
    /// router on its node, "" if none), None where unassigned), which answers name
    /// (`qstate-owner`, docs/architecture.md §5, cluster map).
    #[pyo3(signature = (ops, storage, disclose_jobs, readers=None, named=None))]
    fn set_table(
        &self,
        py: Python<'_>,
        ops: Vec<Op>,
        storage: String,
        disclose_jobs: bool,
        readers: Option<Vec<(String, String)>>,
        named: Option<Vec<Named>>,
    ) -> PyResult<()> {
        guard(py, Some(&self.core), || {
            let mut t = Table::new(storage, disclose_jobs);
            t.readers = readers.unwrap_or_default().into_iter().collect();
            let mut named: HashMap<(String, String), Vec<OwnerName>> =
                named.unwrap_or_default().into_iter().map(|(j, o, n)| ((j, o), n)).collect();
            for (spec, owners, followers) in ops {
                let spec = OperatorSpec::from_json(&spec).map_err(PyValueError::new_err)?;
                let names = named.remove(&(spec.job.clone(), spec.operator.clone())).unwrap_or_default();
                let names = names
                    .into_iter()
                    .map(|n| {
                        n.map(|(id, url)| table::Named {
                            id: Arc::from(id),
                            url: (!url.is_empty()).then(|| Arc::from(url)),
                        })
                    })
                    .collect();
                t.insert(Entry {
                    op: Operator::new(spec),
                    owners: owners.into_iter().map(|o| o.map(Arc::from)).collect(),
                    followers: followers.into_iter().map(|f| f.into_iter().map(Arc::from).collect()).collect(),
                    named: names,
                });
            }
            self.core.table.store(Arc::new(t));
            Ok(())
        })
    }

    /// Called (from an engine thread, with the GIL) with `force` when a read needs the routing
    /// table read again; the router answers with `refreshed()` once it has.
    fn set_refresher(&self, refresher: Py<PyAny>) {
        self.core.set_refresher(Box::new(move |force| {
            Python::attach(|py| {
                if let Err(e) = refresher.call1(py, (force,)) {
                    e.print(py);
                }
            })
        }));
    }

    /// A refresh asked for is done (its table, if it changed, pushed).
    fn refreshed(&self) {
        self.core.refreshed();
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
                        (h, CorePrincipal { name, scopes: scopes.into_iter().collect::<BTreeSet<_>>() })
                    })
                    .collect(),
            })
        }));
    }

    /// How to reach shard servers: the cluster token, TLS (a PEM CA bundle, the name
    /// certificates are checked against); the deadline and queue bound are the settings'.
    #[pyo3(signature = (token, tls_ca, tls_server_name))]
    fn set_callers(&self, token: Option<String>, tls_ca: Option<Vec<u8>>, tls_server_name: Option<String>) {
        let cfg = self.core.settings.load();
        self.core.set_callers(Callers {
            token,
            tls_ca,
            tls_server_name,
            timeout: cfg.shard_timeout,
            max_queue: cfg.max_shard_queue,
        });
    }

    /// An HTTP read from the request's method (a HEAD is read as its GET), raw path, query,
    /// content type and body: (status, headers, body) now, or None and `fut` settled with it
    /// later; the request counted in `qstate_router_http_requests_total` and its latency, as
    /// the native front counts its own. A path the core reads as no read route (its names are
    /// raw segments) is a 404 counted `unmatched`, as the native front hands such a path to
    /// the app, which has no route for it.
    #[allow(clippy::too_many_arguments)]
    fn http(
        &self,
        py: Python<'_>,
        method: &str,
        raw_path: &str,
        query: &str,
        content_type: Option<&[u8]>,
        body: &[u8],
        loop_: Py<PyAny>,
        fut: Py<PyAny>,
    ) -> PyResult<Option<Py<PyAny>>> {
        // counted here as the native front counts its reads: by route, method, status and time
        let t0 = Instant::now();
        let label = http::method_label(method);
        let routed = if method == "HEAD" { "GET" } else { method }; // its GET (the server sends no body)
        let Some(target) = http::route(routed, raw_path) else {
            let a = http::Answer::of_failure(&Failure::no_route());
            self.core.metrics.request(UNMATCHED, label, a.status, t0.elapsed().as_secs_f64());
            return http_tuple(py, a).map(Some);
        };
        let route = target.route;
        let ask = http::ask(target, query, content_type, body, self.core.settings.load().max_windows);
        let core = self.core.clone();
        let make: Make = Box::new(move |py, r| {
            if let Err(f) = &r {
                core.metrics.failure(f);
            }
            let a = http::answer(route, r);
            core.metrics.request(route.template(), label, a.status, t0.elapsed().as_secs_f64());
            http_tuple(py, a)
        });
        self.answer(py, ask, Later { loop_, fut }, make)
    }

    /// A gRPC `Get` or `MultiGet` (`method`) from the request's bytes and the caller's
    /// `authorization` metadata: ("ok", bytes) or ("error", code, message, trailers) now, or
    /// None and `fut` settled with it later.
    fn grpc(
        &self,
        py: Python<'_>,
        method: &str,
        request: &[u8],
        authorization: Option<&[u8]>,
        loop_: Py<PyAny>,
        fut: Py<PyAny>,
    ) -> PyResult<Option<Py<PyAny>>> {
        let method = match method {
            "Get" => Method::Get,
            "MultiGet" => Method::MultiGet,
            other => return Err(runtime(format!("not a read method: {other}"))),
        };
        let book = self.core.book.load_full();
        let ask = grpc::ask(method, request, book.as_deref(), authorization);
        let core = self.core.clone();
        let make: Make = Box::new(move |py, r| {
            let got = grpc::answer(method, r);
            if let Err(f) = &got {
                core.metrics.failure(f);
            }
            grpc_tuple(py, got)
        });
        self.answer(py, ask, Later { loop_, fut }, make)
    }

    /// The latest window of each of `keys` in `state` (`local` False: from the owners, not
    /// co-located files), as hits (found, batch, watermark, windows, next_from): now, or None
    /// and `fut` settled with them later; a failure raises (or settles) its qstate error.
    #[allow(clippy::too_many_arguments)]
    fn read(
        &self,
        py: Python<'_>,
        job: String,
        operator: String,
        state: String,
        keys: Vec<String>,
        local: bool,
        loop_: Py<PyAny>,
        fut: Py<PyAny>,
    ) -> PyResult<Option<Py<PyAny>>> {
        let ask = Ask { job, operator, states: vec![state], keys, local, ..Ask::default() };
        let make: Make = Box::new(|py, r| match r {
            Ok(o) => hits_list(py, &o),
            Err(f) => Err(py_err(py, &f)),
        });
        self.answer(py, Ok(ask), Later { loop_, fut }, make)
    }

    /// Who sends `header` (Authorization) and whether they may ask for `path` (decoded): the
    /// principal; None when the router asks for no tokens or anyone may ask for the path; raises
    /// Unauthenticated (401) or Forbidden (403).
    fn authorize(&self, py: Python<'_>, path: &str, header: Option<&[u8]>) -> PyResult<Option<Principal>> {
        let Some(book) = self.core.book.load_full() else { return Ok(None) };
        let public = self.core.settings.load().metrics_public;
        door(&book, header, path, public).map(|p| p.map(|p| Principal(p.clone()))).map_err(|f| py_err(py, &f))
    }

    /// Who sends `header` (gRPC's authorization metadata), None when no tokens are asked for;
    /// raises Unauthenticated.
    fn authenticate(&self, py: Python<'_>, header: Option<&[u8]>) -> PyResult<Option<Principal>> {
        let Some(book) = self.core.book.load_full() else { return Ok(None) };
        book.authenticate(header).map(|p| Some(Principal(p.clone()))).map_err(|f| py_err(py, &f))
    }

    /// The error of a refusal before any read (`too-large`, `overloaded`), in this router's
    /// words and bounds (`qstate.router.limits`, which holds the Python front's budget).
    fn refusal(&self, py: Python<'_>, kind: &str) -> PyResult<Py<PyAny>> {
        let cfg = self.core.settings.load();
        let f = match kind {
            "too-large" => Failure::too_large(cfg.max_body_bytes),
            "overloaded" => Failure::overloaded(
                format!(
                    "this router serves {} requests at once (QSTATE_MAX_CONCURRENT_REQUESTS); retry after {} s",
                    cfg.max_concurrent,
                    seconds(cfg.retry_after_s)
                ),
                cfg.retry_after_s,
            ),
            other => return Err(runtime(format!("no refusal {other}"))),
        };
        Ok(py_err(py, &f).into_value(py).into_any())
    }

    /// The 503 of a partition that cannot answer (`reason`: no-owner, shard-down,
    /// shard-timeout, shard-refused, restoring, moving) in the read core's words, for the
    /// router's top-N reads; `stale_hint`: a follower holds a copy the caller did not allow.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (reason, job, operator, partition, address, stale_hint=false))]
    fn unavailable(
        &self,
        py: Python<'_>,
        reason: &str,
        job: String,
        operator: String,
        partition: u32,
        address: &str,
        stale_hint: bool,
    ) -> PyResult<Py<PyAny>> {
        let reason = ["no-owner", "shard-down", "shard-timeout", "shard-refused", "restoring", "moving"]
            .into_iter()
            .find(|r| *r == reason)
            .ok_or_else(|| runtime(format!("no reason {reason}")))?;
        let mut f =
            core_read::fetch::unavailable(&self.core, reason, &PartitionId { job, operator, partition }, address);
        if stale_hint {
            f = core_read::fetch::with_stale_hint(f);
        }
        Ok(py_err(py, &f).into_value(py).into_any())
    }

    /// The 404 of a job, operator or state the routing table does not know, in the read core's
    /// words; None when it knows them (the top-N's and watch's routes ask).
    #[pyo3(signature = (job, operator, state=None))]
    fn unknown(&self, py: Python<'_>, job: &str, operator: &str, state: Option<&str>) -> Option<Py<PyAny>> {
        let f = core_read::ask::unknown_of(&self.core.table.load(), job, operator, state)?;
        Some(py_err(py, &f).into_value(py).into_any())
    }

    /// The 503 of a partition behind `min_batch` after the wait, in the read core's words.
    fn behind(
        &self,
        py: Python<'_>,
        job: String,
        operator: String,
        partition: u32,
        batch: i64,
        want: i64,
    ) -> Py<PyAny> {
        let f = core_read::fetch::behind(&self.core, &PartitionId { job, operator, partition }, batch, want);
        py_err(py, &f).into_value(py).into_any()
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

    /// Serve the router's public gRPC port on the listening socket `fd`: `Get` and
    /// `MultiGet` answered by the read core, every other call passed to the Python gRPC
    /// server on the Unix socket `upstream`; TLS when a certificate and key are given.
    #[pyo3(signature = (upstream, fd, threads, tls_cert=None, tls_key=None))]
    fn serve_grpc(
        &self,
        py: Python<'_>,
        upstream: PathBuf,
        fd: i32,
        threads: usize,
        tls_cert: Option<PathBuf>,
        tls_key: Option<PathBuf>,
    ) -> PyResult<()> {
        // SAFETY: a listening socket Python holds for this process and hands over (a copy)
        let listener = unsafe { TcpListener::from_raw_fd(libc_dup(fd)?) };
        let tls = pem_pair(tls_cert, tls_key)?;
        let core = self.core.clone();
        let port = py
            .detach(|| GrpcPort::start(core, GrpcPortConfig { listener, tls, upstream, threads }))
            .map_err(|e| PyOSError::new_err(e.to_string()))?;
        *self.grpc_port.lock() = Some(port);
        Ok(())
    }

    /// Stop the gRPC port: no new call, those under way have a second.
    fn stop_grpc(&self, py: Python<'_>) {
        let port = self.grpc_port.lock().take();
        if let Some(mut p) = port {
            py.detach(|| p.stop());
        }
    }

    /// Serve the owner's reader (docs/architecture.md §5, cluster reads): other hosts'
    /// routers' `MultiGet` of the partitions the shard server `owner` (this process) holds,
    /// on `host:port`, asking callers for `token`, with TLS when a certificate and key are
    /// given. The port bound.
    #[pyo3(signature = (owner, threads, host="127.0.0.1", port=0, tls_cert=None, tls_key=None, token=None))]
    #[allow(clippy::too_many_arguments)]
    fn serve_reader(
        &self,
        py: Python<'_>,
        owner: &str,
        threads: usize,
        host: &str,
        port: u16,
        tls_cert: Option<PathBuf>,
        tls_key: Option<PathBuf>,
        token: Option<String>,
    ) -> PyResult<u16> {
        let listener =
            TcpListener::bind((host, port)).map_err(|e| PyOSError::new_err(format!("{host}:{port}: {e}")))?;
        let bound = listener.local_addr().map_err(|e| PyOSError::new_err(e.to_string()))?.port();
        let tls = pem_pair(tls_cert, tls_key)?;
        let core = self.core.clone();
        let server = py
            .detach(|| ReaderServer::start(core, Reader::new(owner), ReaderConfig { listener, tls, token, threads }))
            .map_err(|e| PyOSError::new_err(e.to_string()))?;
        *self.reader.lock() = Some(server);
        Ok(bound)
    }

    /// The partitions the reader's shard holds but is restoring (they answer RESTORING).
    fn set_restoring(&self, partitions: Vec<(String, String, u32)>) {
        if let Some(r) = &*self.reader.lock() {
            r.reader.set_restoring(
                partitions
                    .into_iter()
                    .map(|(job, operator, partition)| PartitionId { job, operator, partition })
                    .collect(),
            );
        }
    }

    /// What the reader answered so far: keys by status, calls, panics caught, and the calls'
    /// latency: each bucket's count (not cumulative, +Inf last, on `LOOKUP_BUCKETS`), the sum.
    #[allow(clippy::type_complexity)]
    fn reader_counts(&self) -> (Vec<(&'static str, u64)>, u64, u64, (Vec<u64>, f64)) {
        let counts = self.reader.lock().as_ref().map(|r| r.reader.counts()).unwrap_or_default();
        let (keys, calls, panics, latency) = counts;
        (keys, calls, panics, (latency.counts.to_vec(), latency.sum))
    }

    /// Stop the front: no new connection, the requests under way finish (at most `grace_s`).
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
        d.set_item("front", t.front)?;
        d.set_item("panics", t.panics)?;
        d.set_item("keys_waiting", t.keys_waiting)?;
        d.set_item("grpc", t.grpc)?;
        d.set_item("grpc_latency", histograms(t.grpc_latency))?;
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
        self.stop_grpc(py);
        let reader = self.reader.lock().take();
        if let Some(mut r) = reader {
            py.detach(|| r.stop());
        }
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

/// A certificate chain and key read from their PEM files, when both are given.
fn pem_pair(cert: Option<PathBuf>, key: Option<PathBuf>) -> PyResult<Option<(Vec<u8>, Vec<u8>)>> {
    let read = |p: &PathBuf| std::fs::read(p).map_err(|e| PyOSError::new_err(format!("{}: {e}", p.display())));
    match (cert, key) {
        (Some(c), Some(k)) => Ok(Some((read(&c)?, read(&k)?))),
        _ => Ok(None),
    }
}

fn libc_dup(fd: i32) -> PyResult<i32> {
    let d = unsafe { libc::dup(fd) };
    if d < 0 {
        return Err(PyOSError::new_err(std::io::Error::last_os_error().to_string()));
    }
    Ok(d)
}
