//! The router's public gRPC port (docs/architecture.md §5, native gRPC reads): `Get` and
//! `MultiGet` of `qstate.v1.QueryableState` answered here through the read core (`grpc`),
//! on the engine's threads; every other call (`Watch`, `Top`, admin, health, reflection) goes
//! to the Python server (grpc.aio, the API's definition) on a private Unix socket, streamed
//! both ways with its trailers. What a caller sees is what grpc.aio answered before: the
//! same codes, messages, trailers (`qstate-error`, `qstate-detail`, `retry-after-ms`), token
//! rules and largest message (`QSTATE_MAX_BODY_BYTES`: RESOURCE_EXHAUSTED beyond it).

use std::convert::Infallible;
use std::net::TcpListener as StdListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::{BufMut, Bytes, BytesMut};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::header::{HeaderMap, HeaderValue, CONTENT_TYPE};
use hyper::{Request, Response, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tonic::body::Body;
use tonic::codegen::BoxFuture;

use super::upstream::Connector;
use crate::engine::Engine;
use crate::errors::{panic_message, Failure};
use crate::grpc::{self, Method};
use crate::grpc_threads::{self, status, Served};
use crate::read;

const GET: &str = "/qstate.v1.QueryableState/Get";
const MULTI_GET: &str = "/qstate.v1.QueryableState/MultiGet";

pub struct GrpcPortConfig {
    pub listener: StdListener,
    /// PEM certificate chain and key: TLS
    pub tls: Option<(Vec<u8>, Vec<u8>)>,
    /// the Python gRPC server's Unix socket
    pub upstream: PathBuf,
    /// threads serving the port (`grpc_threads`)
    pub threads: usize,
}

/// The running port; `stop` (or dropping it) ends it.
pub struct GrpcPort {
    served: Served,
}

impl GrpcPort {
    pub fn start(engine: Arc<Engine>, cfg: GrpcPortConfig) -> std::io::Result<GrpcPort> {
        let app = {
            // the app's connections live on the engine's runtime, whichever thread asks
            let _g = engine.runtime.enter();
            Client::builder(TokioExecutor::new()).http2_only(true).build(Connector::new(cfg.upstream))
        };
        let svc = Svc(Arc::new(Inner { engine, app, inflight: AtomicUsize::new(0) }));
        let served = grpc_threads::serve("qstate-grpc", cfg.listener, cfg.threads, cfg.tls, svc)?;
        Ok(GrpcPort { served })
    }

    pub fn stop(&mut self) {
        self.served.stop();
    }
}

struct Inner {
    engine: Arc<Engine>,
    app: Client<Connector, Body>,
    /// read calls under way (at most `QSTATE_MAX_CONCURRENT_REQUESTS`, as grpc.aio's
    /// `maximum_concurrent_rpcs` held them)
    inflight: AtomicUsize,
}

/// One read call of those under way, given back when dropped.
struct Slot<'a>(&'a AtomicUsize);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[derive(Clone)]
struct Svc(Arc<Inner>);

/// Why a read call was not answered: the read core's failure, or the call's own fault as
/// gRPC itself says it (a message too large, compressed, broken off).
enum Refused {
    Read(Failure),
    Call(tonic::Status),
}

impl tower_service::Service<Request<Body>> for Svc {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let inner = self.0.clone();
        Box::pin(async move {
            let method = match req.uri().path() {
                GET => Some(Method::Get),
                MULTI_GET => Some(Method::MultiGet),
                _ => None,
            };
            let Some(method) = method else {
                inner.engine.metrics.front("grpc:other", "app");
                return Ok(inner.forward(req).await);
            };
            inner.engine.metrics.front(if method == Method::Get { "grpc:Get" } else { "grpc:MultiGet" }, "engine");
            let t0 = Instant::now();
            let slot = Slot(&inner.inflight);
            if inner.inflight.fetch_add(1, Ordering::AcqRel) >= inner.engine.settings.load().max_concurrent {
                inner.engine.metrics.grpc(method.name(), "RESOURCE_EXHAUSTED", t0.elapsed().as_secs_f64());
                return Ok(tonic::Status::resource_exhausted("Concurrent RPC limit exceeded!").into_http());
            }
            let engine = inner.engine.clone();
            // a panic in a read (a planted one, a bug) answers this call, never ends the port
            let got = tokio::spawn(async move { read_call(&engine, method, req).await }).await;
            let got = got.unwrap_or_else(|j| {
                inner.engine.metrics.panicked("grpc");
                let what = if j.is_panic() { panic_message(&*j.into_panic()) } else { String::new() };
                Err(Refused::Read(Failure::engine(format!(
                    "the router's read engine failed ({what}); it goes on answering"
                ))))
            });
            let code = match &got {
                Ok(_) => "OK",
                Err(Refused::Read(f)) => {
                    inner.engine.metrics.failure(f);
                    f.grpc_code().name()
                }
                Err(Refused::Call(s)) => code_name(s.code()),
            };
            inner.engine.metrics.grpc(method.name(), code, t0.elapsed().as_secs_f64());
            drop(slot);
            Ok(match got {
                Ok((bytes, named)) => answered(bytes, &named),
                Err(Refused::Read(f)) => status(&f).into_http(),
                Err(Refused::Call(s)) => s.into_http(),
            })
        })
    }
}

/// The code's name as grpc's `StatusCode` names it (the metric's `code` label).
fn code_name(c: tonic::Code) -> &'static str {
    match c {
        tonic::Code::InvalidArgument => "INVALID_ARGUMENT",
        tonic::Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        tonic::Code::Unimplemented => "UNIMPLEMENTED",
        tonic::Code::Cancelled => "CANCELLED",
        _ => "INTERNAL",
    }
}

impl Inner {
    /// The Python server's answer, streamed with its trailers; UNAVAILABLE when it cannot be
    /// reached (starting or stopping).
    async fn forward(&self, req: Request<Body>) -> Response<Body> {
        let (mut parts, body) = req.into_parts();
        let pq = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        parts.uri = match format!("http://qstate-app{pq}").parse::<Uri>() {
            Ok(u) => u,
            Err(_) => return tonic::Status::unimplemented("no such method").into_http(),
        };
        match self.app.request(Request::from_parts(parts, body)).await {
            Ok(resp) => resp.map(Body::new),
            Err(_) => tonic::Status::unavailable(
                "this router's gRPC application is not answering (starting or stopping); retry",
            )
            .into_http(),
        }
    }
}

/// The one message of a unary call, at most the router's largest body (as grpc.aio's
/// `grpc.max_receive_message_length` refused it: RESOURCE_EXHAUSTED).
async fn message(engine: &Engine, body: Body) -> Result<Bytes, Refused> {
    let limit = engine.settings.load().max_body_bytes;
    let too_large = || {
        Refused::Call(tonic::Status::resource_exhausted(format!(
            "Received message larger than max (QSTATE_MAX_BODY_BYTES: {limit} bytes)"
        )))
    };
    let mut body = body;
    let mut buf = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else { return Err(Refused::Call(tonic::Status::cancelled("the request broke off"))) };
        if let Ok(chunk) = frame.into_data() {
            if buf.len() + chunk.len() > limit + 5 {
                return Err(too_large());
            }
            buf.extend_from_slice(&chunk);
        }
    }
    if buf.len() < 5 || buf.len() != 5 + u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize {
        return Err(Refused::Call(tonic::Status::internal("the request is not one whole gRPC message")));
    }
    if buf[0] != 0 {
        return Err(Refused::Call(tonic::Status::unimplemented(
            "a compressed request: this router reads requests uncompressed",
        )));
    }
    Ok(buf.freeze().slice(5..))
}

/// A read's answer bytes and the trailing metadata naming its owner (`Outcome::owner_headers`).
async fn read_call(
    engine: &Arc<Engine>,
    method: Method,
    req: Request<Body>,
) -> Result<(Vec<u8>, Vec<(&'static str, String)>), Refused> {
    // the last one, as grpc.aio's metadata read it (`qstate.router.auth.GrpcAuth`)
    let auth = req.headers().get_all("authorization").iter().next_back().map(|v| v.as_bytes().to_vec());
    let raw = message(engine, req.into_body()).await?;
    let book = engine.book.load_full();
    let ask = grpc::ask(method, &raw, book.as_deref(), auth.as_deref()).map_err(Refused::Read)?;
    let read = read::answer(engine, ask).await;
    let named = read.as_ref().map(read::Outcome::owner_headers).unwrap_or_default();
    grpc::answer(method, read).map(|b| (b, named)).map_err(Refused::Read)
}

fn grpc_headers() -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    h
}

/// An answer: its message, then the trailers that say OK (and `named`: its owner).
fn answered(bytes: Vec<u8>, named: &[(&'static str, String)]) -> Response<Body> {
    let mut framed = BytesMut::with_capacity(5 + bytes.len());
    framed.put_u8(0);
    framed.put_u32(bytes.len() as u32);
    framed.extend_from_slice(&bytes);
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    for (k, v) in named {
        if let Ok(v) = HeaderValue::from_str(v) {
            trailers.insert(*k, v);
        }
    }
    let frames = [Ok::<_, tonic::Status>(Frame::data(framed.freeze())), Ok(Frame::trailers(trailers))];
    let mut r = Response::new(Body::new(StreamBody::new(futures::stream::iter(frames))));
    *r.headers_mut() = grpc_headers();
    r
}
