//! One request on the native front: who is asking (`auth`, before anything else), its budget
//! (one in-flight count for both paths, `QSTATE_MAX_CONCURRENT_REQUESTS`; the body limit,
//! counted as it arrives), then the read core for a read (`http::route`) or the Python app
//! for everything else, counted by who answered (`qstate_router_front_requests_total`). A
//! panic anywhere in it is a 500 with a JSON body and a count; the front goes on.

use std::convert::Infallible;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use futures::FutureExt;
use http_body_util::{BodyExt, Either, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{HeaderName, HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};

use super::upstream::Upstream;
use crate::auth::door;
use crate::engine::Engine;
use crate::errors::{panic_message, seconds, Failure};
use crate::http;
use crate::read;

/// How the principal a request was let in with travels to the app (never from outside: the
/// front removes it from every request it is sent).
pub const PRINCIPAL_HEADER: &str = "x-qstate-principal";
const JSON: &str = "application/json";
/// The `route` label of a request that is not a read (the app's to answer).
const OTHER: &str = "other";

/// How a connection reached the front: the address it connected to, and whether it speaks TLS.
#[derive(Clone, Copy)]
pub struct Reached {
    pub address: Option<std::net::SocketAddr>,
    pub tls: bool,
}

pub struct Ctx {
    pub engine: Arc<Engine>,
    pub upstream: Upstream,
    pub inflight: Arc<AtomicUsize>,
}

type Answer = Response<Guarded<Either<Full<Bytes>, Incoming>>>;

/// A response body that holds the request's in-flight slot until it is sent whole (a
/// proxied answer streams).
pub struct Guarded<B> {
    inner: B,
    _slot: Option<Slot>,
}

impl<B: Body + Unpin> Body for Guarded<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// One of the requests in flight.
pub struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

fn full(status: u16, headers: &[(&'static str, String)], body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(JSON));
    for (k, v) in headers {
        if let Ok(v) = HeaderValue::from_str(v) {
            h.insert(*k, v);
        }
    }
    r
}

fn guarded(r: Response<Full<Bytes>>, slot: Option<Slot>) -> Answer {
    r.map(|b| Guarded { inner: Either::Left(b), _slot: slot })
}

/// `f` answered, and counted as what it is.
fn failed(engine: &Engine, f: &Failure) -> Response<Full<Bytes>> {
    engine.metrics.failure(f);
    let a = http::Answer::of_failure(f);
    full(a.status, &a.headers, a.body)
}

enum Received {
    Whole(Bytes),
    TooLarge,
    Gone,
}

/// How much more of a body over the limit is read (and dropped) before the 413 is sent: a
/// client still sending would otherwise see its connection cut before it reads the answer.
const DRAIN_BYTES: usize = 16 << 20;

/// The request's body, at most `limit` bytes (counted as it arrives: a chunked body is
/// refused as surely as one that declared its length).
async fn read_body(mut body: Incoming, limit: usize) -> Received {
    let mut buf = bytes::BytesMut::new();
    let mut seen = 0usize;
    loop {
        match body.frame().await {
            None => break,
            Some(Err(_)) => return Received::Gone,
            Some(Ok(frame)) => {
                if let Ok(chunk) = frame.into_data() {
                    seen += chunk.len();
                    if seen <= limit {
                        buf.extend_from_slice(&chunk);
                    } else if seen > limit + DRAIN_BYTES {
                        return Received::TooLarge;
                    }
                }
            }
        }
    }
    if seen > limit {
        Received::TooLarge
    } else {
        Received::Whole(buf.freeze())
    }
}

/// A request, answered; a panic in it is a 500 (`EngineFailed`) and a count, never a
/// connection closed without a word.
pub async fn handle(ctx: Arc<Ctx>, req: Request<Incoming>, reached: Reached) -> Result<Answer, Infallible> {
    let t0 = Instant::now();
    let engine = ctx.engine.clone();
    // the path split once: the read it is (if any) holds its raw parts
    let raw_path = req.uri().path().to_owned();
    let method = http::method_label(req.method().as_str());
    let target = http::route(method, &raw_path);
    let label = target.map_or(OTHER, |t| t.route.template());
    match AssertUnwindSafe(answer(ctx, req, target, reached, t0)).catch_unwind().await {
        Ok(a) => Ok(a),
        Err(panic) => {
            engine.metrics.panicked("front");
            engine.metrics.front(label, "engine");
            let what = panic_message(&*panic);
            let f = Failure::engine(format!(
                "the router's read engine failed while answering this request ({what}); it goes on answering others"
            ));
            let r = failed(&engine, &f);
            // a read is counted by its route as its other answers are (the app never sees it)
            if let Some(t) = target {
                engine.metrics.request(t.route.template(), method, r.status().as_u16(), t0.elapsed().as_secs_f64());
            }
            Ok(guarded(r, None))
        }
    }
}

/// `target`: the read the request is, by its method and raw path (`http::route`), or None.
async fn answer(
    ctx: Arc<Ctx>,
    req: Request<Incoming>,
    target: Option<http::Target<'_>>,
    reached: Reached,
    t0: Instant,
) -> Answer {
    let engine = &ctx.engine;
    let cfg = engine.settings.load_full();
    let (mut parts, body) = req.into_parts();
    parts.headers.remove(PRINCIPAL_HEADER);
    // the path as the app routes it (percent-decoded): what a token's scopes are checked on,
    // in both fronts (`auth::target_of`), and which paths are exempt from the budget
    let path = percent_encoding::percent_decode_str(parts.uri.path()).decode_utf8_lossy();
    let method = http::method_label(parts.method.as_str());
    // answered here (a read, or a refusal at the door), counted by its route
    let label = target.map_or(OTHER, |t| t.route.template());
    let here = |r: Response<Full<Bytes>>, slot: Option<Slot>| {
        engine.metrics.front(label, "engine");
        guarded(r, slot)
    };

    let declared = parts.headers.get(CONTENT_LENGTH).map(HeaderValue::as_bytes);
    let over = declared.and_then(|d| std::str::from_utf8(d).ok()).and_then(|s| s.trim().parse::<u128>().ok());
    let over = over.is_some_and(|n| n > cfg.max_body_bytes as u128);
    let bodiless = matches!(parts.method, Method::GET | Method::HEAD | Method::OPTIONS | Method::DELETE)
        && declared.is_none()
        && !parts.headers.contains_key(hyper::header::TRANSFER_ENCODING);

    // who is asking, before anything else
    let mut principal = None;
    if let Some(book) = engine.book.load_full() {
        let header = parts.headers.get("authorization").map(HeaderValue::as_bytes);
        match door(&book, header, &path, cfg.metrics_public) {
            Ok(who) => principal = who.map(|p| p.header()),
            Err(f) => {
                // a body within the limit is read (and dropped) before the refusal, as the
                // Python front's server does: hyper closes a connection whose body it has not
                // seen the end of, and a pipelined request behind it would get no answer
                if !bodiless && !over {
                    let _ = read_body(body, cfg.max_body_bytes).await;
                }
                return here(failed(engine, &f), None);
            }
        }
    }

    // the budget: one in-flight count for both paths (probes, /metrics and watches exempt)
    let exempt = matches!(&*path, "/healthz" | "/readyz" | "/metrics")
        || (parts.method == Method::GET && path.starts_with("/v1/watch/"));
    let mut slot = None;
    let mut data = Bytes::new();
    if !exempt {
        if ctx.inflight.load(Ordering::Acquire) >= cfg.max_concurrent {
            let f = Failure::overloaded(
                format!(
                    "this router serves {} requests at once (QSTATE_MAX_CONCURRENT_REQUESTS); retry after {} s",
                    cfg.max_concurrent,
                    seconds(cfg.retry_after_s)
                ),
                cfg.retry_after_s,
            );
            return here(failed(engine, &f), None);
        }
        if over {
            return here(failed(engine, &Failure::too_large(cfg.max_body_bytes)), None);
        }
        ctx.inflight.fetch_add(1, Ordering::AcqRel);
        slot = Some(Slot(ctx.inflight.clone()));
    }
    if !bodiless {
        match read_body(body, cfg.max_body_bytes).await {
            Received::Whole(b) => data = b,
            Received::TooLarge => return here(failed(engine, &Failure::too_large(cfg.max_body_bytes)), slot),
            // the client went away while sending: nobody reads an answer
            Received::Gone => return here(full(400, &[], Vec::new()), slot),
        }
    }

    // a read: the core answers it
    if let Some(target) = target {
        let route = target.route;
        let ct = parts.headers.get(CONTENT_TYPE).map(HeaderValue::as_bytes);
        let a = match http::ask(target, parts.uri.query().unwrap_or(""), ct, &data, cfg.max_windows) {
            Ok(ask) => {
                let got = read::answer(engine, ask).await;
                if let Err(f) = &got {
                    engine.metrics.failure(f);
                }
                http::answer(route, got)
            }
            Err(f) => {
                engine.metrics.failure(&f);
                http::Answer::of_failure(&f)
            }
        };
        engine.metrics.request(route.template(), method, a.status, t0.elapsed().as_secs_f64());
        return here(full(a.status, &a.headers, a.body), slot);
    }

    // anything else: the app
    if let Some(p) = principal {
        if let Ok(v) = HeaderValue::from_str(&p) {
            parts.headers.insert(HeaderName::from_static(PRINCIPAL_HEADER), v);
        }
    }
    engine.metrics.front(OTHER, "app");
    // what the app builds its URLs of (a redirect): the host the client asked, else the
    // address it reached, and the scheme it spoke (uvicorn reads X-Forwarded-Proto of the
    // front alone: the header from outside is dropped)
    for h in ["x-forwarded-proto", "x-forwarded-for", "x-forwarded-host", "forwarded"] {
        parts.headers.remove(h);
    }
    if !parts.headers.contains_key(hyper::header::HOST) {
        if let Some(v) = reached.address.and_then(|a| HeaderValue::from_str(&a.to_string()).ok()) {
            parts.headers.insert(hyper::header::HOST, v);
        }
    }
    if reached.tls {
        parts.headers.insert(HeaderName::from_static("x-forwarded-proto"), HeaderValue::from_static("https"));
    }
    let resp = ctx.upstream.forward(parts, data).await;
    resp.map(|b| Guarded { inner: b, _slot: slot })
}
