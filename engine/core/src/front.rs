//! The router's public HTTP port (docs/architecture.md §5, native front): the point GET and
//! `:batchGet` of partitions read on this host are answered here, on tokio's threads; every
//! other request goes to the Python app (FastAPI, the API's definition) over a private Unix
//! socket, streamed both ways (watch's Server-Sent Events included). Tokens, the request
//! budget (one in-flight limit for both paths, the body limit) and the metrics are kept
//! here for every request, so both paths see the same rules.

use std::borrow::Cow;
use std::convert::Infallible;
use std::io;
use std::net::TcpListener as StdListener;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Either, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{HeaderName, HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use crate::address::{partition_of, PartitionId};
use crate::engine::{Engine, Settings};
use crate::errors::{Counted, ErrorAnswer};
use crate::json::{push_answer, py_repr};
use crate::local::{Hit, Miss};
use crate::query::{self, Read};
use crate::remote::{Ask, Failed};
use crate::shardpb::KeyQuery;
use crate::spec::OperatorSpec;
use crate::timeparse::{parse_count, py_g, py_strip, time_range};
use crate::tokens::{authorize, is_open};
use crate::upstream::Upstream;

pub const STATE_ROUTE: &str = "/v1/state/{job}/{operator}/{state}/{key}";
pub const BATCH_ROUTE: &str = "/v1/state/{job}/{operator}/{state}:batchGet";
pub const STATES_BATCH_ROUTE: &str = "/v1/state/{job}/{operator}:batchGet";
/// How the principal a request was let in with travels to Python (never from outside: the
/// front removes it from every request it is sent).
pub const PRINCIPAL_HEADER: &str = "x-qstate-principal";
const MIN_BATCH_POLL: Duration = Duration::from_millis(50);
const JSON: &str = "application/json";

type Answer = Response<Guarded<Either<Full<Bytes>, Incoming>>>;

/// A response body that holds the request's in-flight slot until it is sent whole (a
/// proxied answer streams), as `qstate.router.limits` holds it for the app's whole call.
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

/// One of the requests in flight (`QSTATE_MAX_CONCURRENT_REQUESTS`).
pub struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

struct Ctx {
    engine: Arc<Engine>,
    upstream: Upstream,
    inflight: Arc<AtomicUsize>,
}

fn full(status: u16, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = StatusCode::from_u16(status).expect("a status");
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(JSON));
    r
}

fn error(e: &ErrorAnswer) -> Response<Full<Bytes>> {
    let mut r = full(e.status, e.body.clone());
    if let Some(ra) = &e.retry_after {
        r.headers_mut().insert("retry-after", HeaderValue::from_str(ra).expect("digits"));
    }
    if e.bearer {
        r.headers_mut().insert("www-authenticate", HeaderValue::from_static("Bearer"));
    }
    r
}

fn count(engine: &Engine, e: &ErrorAnswer) {
    match e.counted {
        Counted::Nothing => {}
        Counted::Refused(r) => engine.metrics.refused(r),
        Counted::Unavailable(r) => engine.metrics.unavailable(r),
    }
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// `parse_qsl(query.decode("latin-1"))` into a dict (the last of a repeated name wins; an
/// empty value is no value) for the names a read takes; None where Python could read the
/// query otherwise than here (bytes beyond ASCII, an escape that is not UTF-8).
struct Params {
    from: Option<String>,
    to: Option<String>,
    limit: Option<String>,
    min_batch: Option<String>,
    savepoint: bool,
}

fn params(query: Option<&str>) -> Option<Params> {
    let mut p = Params { from: None, to: None, limit: None, min_batch: None, savepoint: false };
    let Some(q) = query else { return Some(p) };
    if !q.is_ascii() {
        return None;
    }
    for pair in q.split('&') {
        if pair.is_empty() {
            continue;
        }
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let dec = |s: &str| -> Option<String> {
            let plus = s.replace('+', " ");
            let b: Cow<'_, [u8]> = percent_encoding::percent_decode_str(&plus).into();
            let s = std::str::from_utf8(&b).ok()?.to_string();
            s.is_ascii().then_some(s)
        };
        let (name, value) = (dec(name)?, dec(value)?);
        if value.is_empty() {
            continue; // keep_blank_values=False
        }
        match name.as_str() {
            "from" => p.from = Some(value),
            "to" => p.to = Some(value),
            "limit" => p.limit = Some(value),
            "min_batch" => p.min_batch = Some(value),
            "savepoint" => p.savepoint = true,
            _ => {}
        }
    }
    Some(p)
}

/// The read a GET or `:batchGet` asks for (its query parameters read as Python reads them),
/// checked as `StateQuery.of` checks it; None: Python answers.
fn check_read(
    engine: &Engine,
    cfg: &Settings,
    job: &str,
    operator: &str,
    state: &str,
    keys: Vec<String>,
    p: &Params,
) -> Option<Read> {
    if p.savepoint {
        return None; // read by the owner from storage (docs/architecture.md §4)
    }
    let range = time_range(p.from.as_deref(), p.to.as_deref(), now_ms())?;
    let limit = match &p.limit {
        Some(l) => Some(parse_count(l, 9)?),
        None => None,
    };
    let min_batch = match &p.min_batch {
        Some(m) => Some(parse_count(m, 18)?),
        None => None,
    };
    query::check(engine, cfg, job, operator, state, keys, range, limit, min_batch)
}

/// The keys a request read, by path: counted (`qstate_router_shard_reads_total`) only once
/// the front answers the request itself. A request handed to Python midway (a partition it
/// cannot read here, an absent key only Python words) is read again there and counted by
/// the app, as the Python front counts it: counted here too, it would count twice.
#[derive(Default)]
struct Tally {
    local: u64,
    remote: u64,
}

impl Tally {
    /// Add what was read to the engine's counts, and start again from zero.
    fn count(&mut self, engine: &Engine) {
        engine.metrics.local_reads(std::mem::take(&mut self.local));
        engine.metrics.remote_reads(std::mem::take(&mut self.remote));
    }
}

/// The keys `which` of `r` (indices into its keys) by partition, partitions in the order
/// their first key comes.
fn by_partition(r: &Read, which: impl IntoIterator<Item = usize>) -> Vec<(u32, Vec<usize>)> {
    let mut groups: Vec<(u32, Vec<usize>)> = Vec::new();
    for i in which {
        let p = partition_of(&r.keys[i], r.entry.op.spec.partitions);
        match groups.iter_mut().find(|(q, _)| *q == p) {
            Some((_, idx)) => idx.push(i),
            None => groups.push((p, vec![i])),
        }
    }
    groups
}

/// Each key's hit, in the keys' order: from its partition's files when it is on this host,
/// else from its owner's shard server (coalesced, `remote`); None when any key is one only
/// Python answers (no owner named, an owner that cannot answer, a value only Python words):
/// the request goes to Python, which asks again.
async fn read_keys(
    ctx: &Arc<Ctx>,
    r: &Read,
    keys: &[usize],
    tally: &mut Tally,
) -> Option<Result<Vec<Hit>, ErrorAnswer>> {
    let spec = &r.entry.op.spec;
    let groups = by_partition(r, keys.iter().copied());
    let engine = &ctx.engine;
    let mut hits: Vec<Option<Hit>> = vec![None; r.keys.len()];
    // keys read elsewhere, by owner: one ask each, which the coalescer joins with others
    let mut elsewhere: Vec<(Arc<str>, Vec<usize>, Vec<KeyQuery>)> = Vec::new();
    for (p, idx) in groups {
        let owner = r.entry.owners.get(p as usize)?.clone()?;
        let pid = PartitionId { job: spec.job.clone(), operator: spec.operator.clone(), partition: p };
        let Some(part) = engine.local.lookup(&owner, &pid) else {
            let queries: Vec<KeyQuery> =
                idx.iter().map(|&i| KeyQuery { key: r.keys[i].clone(), partition: p }).collect();
            match elsewhere.iter_mut().find(|(o, _, _)| *o == owner) {
                Some((_, at, qs)) => {
                    at.extend(&idx);
                    qs.extend(queries);
                }
                None => elsewhere.push((owner, idx, queries)),
            }
            continue;
        };
        let ks: Vec<&str> = idx.iter().map(|&i| r.keys[i].as_str()).collect();
        let got = match engine.local.current(&owner, &pid, &part) {
            Ok(Some(inst)) => {
                let h = engine.local.read(&owner, &pid, &inst, &r.entry.op, r.state, &ks, r.range, r.limit);
                if h.is_ok() {
                    tally.local += ks.len() as u64;
                }
                h
            }
            Ok(None) => {
                // a catch-up, or a wait for the reader doing it (milliseconds of RocksDB
                // work): off the threads that answer
                let (c, entry, keys) =
                    (ctx.clone(), r.entry.clone(), ks.iter().map(|k| k.to_string()).collect::<Vec<_>>());
                let (state, range, limit) = (r.state, r.range, r.limit);
                let h = tokio::task::spawn_blocking(move || {
                    let ks: Vec<&str> = keys.iter().map(String::as_str).collect();
                    c.engine.read_local(&owner, &entry, p, state, &ks, range, limit)
                })
                .await
                .ok()?;
                if h.is_ok() {
                    tally.local += ks.len() as u64;
                }
                h
            }
            Err(m) => Err(m),
        };
        match got {
            Ok(found) => {
                for (i, h) in idx.into_iter().zip(found) {
                    hits[i] = Some(h);
                }
            }
            Err(Miss::NotHere | Miss::Unsupported(_) | Miss::Failed(_)) => return None,
        }
    }
    if !elsewhere.is_empty() {
        let remote = engine.remote.load_full()?;
        let state = spec.states.get_index(r.state).expect("state").0;
        let ask = Ask { job: &spec.job, operator: &spec.operator, state, range: r.range, limit: r.limit as u32 };
        let cfg = engine.settings.load();
        let mut asked = Vec::with_capacity(elsewhere.len());
        for (owner, idx, queries) in elsewhere {
            tally.remote += queries.len() as u64;
            match remote.ask(&owner, &ask, queries) {
                Ok(a) => asked.push((idx, a)),
                Err(Failed::Overloaded(waiting)) => {
                    return Some(Err(ErrorAnswer::overloaded(
                        format!(
                            "{waiting} keys already wait for shard {owner} (QSTATE_MAX_SHARD_QUEUE); retry after {} s",
                            py_g(cfg.retry_after_s)
                        ),
                        cfg.retry_after_s,
                    )))
                }
                Err(Failed::Handover) => return None,
            }
        }
        // every shard was asked above; their answers come together
        for (idx, a) in asked {
            let found = a.answers().await.ok()?;
            for (i, h) in idx.into_iter().zip(found) {
                hits[i] = Some(h);
            }
        }
    }
    keys.iter().map(|&i| hits[i].take()).collect::<Option<Vec<_>>>().map(Ok)
}

/// Reads until every key has `min_batch` (each partition read again every 50 ms, at most
/// `min_batch_wait_s`), as `QueryService._at_least`: Ok(hits), or the 503 naming the batch
/// a partition has.
async fn at_least(
    ctx: &Arc<Ctx>,
    r: &Read,
    cfg: &Settings,
    mut hits: Vec<Hit>,
    tally: &mut Tally,
) -> Option<Result<Vec<Hit>, ErrorAnswer>> {
    let Some(want) = r.min_batch else { return Some(Ok(hits)) };
    let behind: Vec<usize> = (0..hits.len()).filter(|&i| hits[i].batch < want).collect();
    if behind.is_empty() {
        return Some(Ok(hits));
    }
    let wait = Duration::from_secs_f64(cfg.min_batch_wait_s);
    let deadline = Instant::now() + wait;
    let mut left = behind;
    while Instant::now() < deadline {
        // a read waiting for its batch shows while it waits: each read again is counted as
        // it is made (docs/architecture.md §5), the reads before it with it
        tally.count(&ctx.engine);
        tokio::time::sleep(MIN_BATCH_POLL).await;
        let again = match read_keys(ctx, r, &left, tally).await? {
            Ok(h) => h,
            Err(e) => return Some(Err(e)),
        };
        let mut still = Vec::new();
        for (i, h) in left.into_iter().zip(again) {
            if h.batch < want {
                still.push(i);
            }
            hits[i] = h;
        }
        left = still;
        if left.is_empty() {
            return Some(Ok(hits));
        }
    }
    let i = left[0];
    let spec = &r.entry.op.spec;
    let p = partition_of(&r.keys[i], spec.partitions);
    let pid = format!("{}/{}/{p}", spec.job, spec.operator);
    let batch = hits[i].batch;
    Some(Err(ErrorAnswer::unavailable(
        format!(
            "partition {pid} is at batch {batch}, not yet at min_batch {want} (waited {}s, QSTATE_MIN_BATCH_WAIT_S)",
            py_g(cfg.min_batch_wait_s)
        ),
        cfg.retry_after_s,
        "behind",
        i64::from(p),
        Some(batch),
    )))
}

/// Every key of `r`, at or past its `min_batch` (`read_keys`, then `at_least`): the hits, or
/// the error to answer; None: Python answers.
async fn read_all(
    ctx: &Arc<Ctx>,
    r: &Read,
    cfg: &Settings,
    tally: &mut Tally,
) -> Option<Result<Vec<Hit>, ErrorAnswer>> {
    let all: Vec<usize> = (0..r.keys.len()).collect();
    match read_keys(ctx, r, &all, tally).await? {
        Ok(hits) => at_least(ctx, r, cfg, hits, tally).await,
        Err(e) => Some(Err(e)),
    }
}

async fn native_get(
    ctx: &Arc<Ctx>,
    path: &str,
    query: Option<&str>,
    tally: &mut Tally,
) -> Option<(u16, Response<Full<Bytes>>)> {
    let rest = path.strip_prefix("/v1/state/")?;
    let parts: Vec<&str> = rest.splitn(4, '/').collect();
    if parts.len() != 4 || parts[3].is_empty() {
        return None;
    }
    let cfg = ctx.engine.settings.load();
    let p = params(query)?;
    let r = check_read(&ctx.engine, &cfg, parts[0], parts[1], parts[2], vec![parts[3].to_string()], &p)?;
    let hits = match read_all(ctx, &r, &cfg, tally).await? {
        Ok(h) => h,
        Err(e) => return Some((e.status, answer_error(ctx, &e))),
    };
    let h = &hits[0];
    let spec = &r.entry.op.spec;
    let state = spec.states.get_index(r.state).expect("state").0;
    if !h.found {
        let shown: String = r.keys[0].chars().take(200).collect();
        let e = ErrorAnswer::absent(
            format!(
                "key {} has no data in {}/{}/{state} as of batch {}",
                py_repr(&shown)?,
                spec.job,
                spec.operator,
                h.batch
            ),
            h.batch,
            h.watermark_ms,
        );
        return Some((404, answer_error(ctx, &e)));
    }
    let mut out = Vec::with_capacity(256);
    push_answer(&mut out, &spec.job, &spec.operator, state, &r.keys[0], h);
    Some((200, full(200, out)))
}

fn answer_error(ctx: &Arc<Ctx>, e: &ErrorAnswer) -> Response<Full<Bytes>> {
    count(&ctx.engine, e);
    error(e)
}

/// `body` as `T` when it is a JSON object of exactly `fields` (FastAPI's body models forbid
/// others); None for any other body (Python words its 400).
fn body_of<T: serde::de::DeserializeOwned>(body: &[u8], fields: &[&str]) -> Option<T> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let obj = v.as_object()?;
    if obj.len() != fields.len() || !fields.iter().all(|f| obj.contains_key(*f)) {
        return None;
    }
    serde_json::from_value(v).ok()
}

/// Every key 1 to 1024 characters: pydantic counts characters (max_length 1024), check_key
/// counts bytes; both hold.
fn keys_fit(keys: &[String]) -> bool {
    keys.iter().all(|k| !k.is_empty() && k.chars().count() <= 1024)
}

/// `{"keys": [str, ...]}` and nothing else (`BatchGetIn`); None for any other body.
fn batch_keys(body: &[u8]) -> Option<Vec<String>> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct In {
        keys: Vec<String>,
    }
    let In { keys } = body_of(body, &["keys"])?;
    keys_fit(&keys).then_some(keys)
}

/// `{"keys": [str, ...], "states": [str, ...]}` and nothing else (`StatesBatchGetIn`); None
/// for any other body.
fn states_batch_body(body: &[u8]) -> Option<(Vec<String>, Vec<String>)> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct In {
        keys: Vec<String>,
        states: Vec<String>,
    }
    let In { keys, states } = body_of(body, &["keys", "states"])?;
    keys_fit(&keys).then_some((keys, states))
}

/// Whether FastAPI, which answers `:batchGet` in Python (the fast path serves only the point
/// GET), reads the request's body and query as `batch_keys` and `params` do: its body is
/// JSON only under a JSON content type (`strict_content_type`: `application/json` or
/// `application/*+json`, read as `email.message` reads the header); its query keeps blank
/// values (`from=` last is a 400 there, not an absent parameter); and pydantic strips a
/// number of ASCII whitespace only, not the `\x1c`-`\x1f` that `str.strip` takes too.
/// Otherwise the request is FastAPI's to answer.
fn read_as_fastapi(content_type: Option<&[u8]>, query: Option<&str>) -> bool {
    let Some(ct) = content_type.and_then(|c| std::str::from_utf8(c).ok()).filter(|c| c.is_ascii()) else {
        return false;
    };
    let media = py_strip(ct.split(';').next().unwrap_or("")).to_ascii_lowercase();
    let json = match media.split_once('/') {
        Some((main, sub)) if !sub.contains('/') => main == "application" && (sub == "json" || sub.ends_with("+json")),
        _ => false,
    };
    if !json {
        return false;
    }
    let mut last: Vec<(&str, String)> = Vec::new();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let dec = |s: &str| percent_encoding::percent_decode_str(&s.replace('+', " ")).decode_utf8_lossy().into_owned();
        let name = dec(name);
        if let Some(known) = ["from", "to", "limit", "min_batch", "savepoint"].into_iter().find(|k| *k == name) {
            last.retain(|(k, _)| *k != known);
            last.push((known, dec(value)));
        }
    }
    last.iter().all(|(name, value)| {
        let pydantic = value.trim_matches([' ', '\t', '\n', '\x0b', '\x0c', '\r']);
        !value.is_empty() && (!matches!(*name, "limit" | "min_batch") || pydantic == py_strip(value))
    })
}

/// The names of a batch read's path, `/v1/state/{job}/{operator}/{state}:batchGet` (three)
/// or `/v1/state/{job}/{operator}:batchGet` (several states: two); None for any other path.
fn batch_names(path: &str) -> Option<Vec<&str>> {
    let names: Vec<&str> = path.strip_prefix("/v1/state/")?.strip_suffix(":batchGet")?.split('/').collect();
    matches!(names.len(), 2 | 3).then_some(names)
}

/// `{"results": [...]}` of `answers` (state, key, hit) in order, as `batch_answer_json`.
fn results<'a>(spec: &OperatorSpec, answers: impl ExactSizeIterator<Item = (&'a str, &'a str, &'a Hit)>) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + 200 * answers.len());
    out.extend_from_slice(b"{\"results\":[");
    for (i, (state, k, h)) in answers.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        push_answer(&mut out, &spec.job, &spec.operator, state, k, h);
    }
    out.extend_from_slice(b"]}");
    out
}

async fn native_batch(
    ctx: &Arc<Ctx>,
    (job, operator, state): (&str, &str, &str),
    query: Option<&str>,
    body: &[u8],
    tally: &mut Tally,
) -> Option<(u16, Response<Full<Bytes>>)> {
    let cfg = ctx.engine.settings.load();
    let keys = batch_keys(body)?;
    if keys.len() > cfg.max_batch_keys {
        return None;
    }
    let p = params(query)?;
    let r = check_read(&ctx.engine, &cfg, job, operator, state, keys, &p)?;
    let hits = match read_all(ctx, &r, &cfg, tally).await? {
        Ok(h) => h,
        Err(e) => return Some((e.status, answer_error(ctx, &e))),
    };
    let spec = &r.entry.op.spec;
    let state = spec.states.get_index(r.state).expect("state").0.as_str();
    let answers = r.keys.iter().zip(&hits).map(|(k, h)| (state, k.as_str(), h));
    Some((200, full(200, results(spec, answers))))
}

/// Every state of `reads` (one operator's, the same keys, range, limit and min_batch) with
/// one read of each key's record for all of them (`Local::read_states`), when every key's
/// partition is on this host and current and no answer is behind `min_batch`; None: read
/// them state by state (`read_all`), which catches up, asks owners and waits. Per state,
/// then per key.
fn read_states_here(ctx: &Ctx, reads: &[Read], tally: &mut Tally) -> Option<Vec<Vec<Hit>>> {
    let first = reads.first()?;
    let spec = &first.entry.op.spec;
    let states: Vec<usize> = reads.iter().map(|r| r.state).collect();
    let local = &ctx.engine.local;
    let mut hits: Vec<Vec<Option<Hit>>> = vec![vec![None; first.keys.len()]; reads.len()];
    for (p, idx) in by_partition(first, 0..first.keys.len()) {
        let owner = first.entry.owners.get(p as usize)?.clone()?;
        let pid = PartitionId { job: spec.job.clone(), operator: spec.operator.clone(), partition: p };
        let part = local.lookup(&owner, &pid)?;
        let inst = local.current(&owner, &pid, &part).ok()??;
        let ks: Vec<&str> = idx.iter().map(|&i| first.keys[i].as_str()).collect();
        let got =
            local.read_states(&owner, &pid, &inst, &first.entry.op, &states, &ks, first.range, first.limit).ok()?;
        for (per_state, found) in hits.iter_mut().zip(got) {
            for (&i, h) in idx.iter().zip(found) {
                per_state[i] = Some(h);
            }
        }
    }
    let per_state =
        hits.into_iter().map(|hs| hs.into_iter().collect::<Option<Vec<Hit>>>()).collect::<Option<Vec<_>>>()?;
    if let Some(want) = first.min_batch {
        if per_state.iter().flatten().any(|h| h.batch < want) {
            return None;
        }
    }
    tally.local += (first.keys.len() * reads.len()) as u64;
    Some(per_state)
}

/// Several states of one operator (`QueryService.multi_states`): every key in each state,
/// key by key in the states' order, a key's states as of one batch. Python answers what
/// this does not: a request `states_batch` refuses, and a key whose states a commit landed
/// between (Python reads them again at the newest batch).
async fn native_states_batch(
    ctx: &Arc<Ctx>,
    (job, operator): (&str, &str),
    query: Option<&str>,
    body: &[u8],
    tally: &mut Tally,
) -> Option<(u16, Response<Full<Bytes>>)> {
    let cfg = ctx.engine.settings.load();
    let (keys, states) = states_batch_body(body)?;
    let n = states.len();
    if n == 0
        || keys.len().saturating_mul(n) > cfg.max_batch_keys
        || states.iter().enumerate().any(|(i, s)| states[..i].contains(s))
    {
        return None;
    }
    let p = params(query)?;
    // the request's windows shared evenly between its states, as `states_batch` shares them
    let shared = Settings { max_request_windows: cfg.max_request_windows / n, ..Settings::clone(&cfg) };
    let reads = states
        .iter()
        .map(|s| check_read(&ctx.engine, &shared, job, operator, s, keys.clone(), &p))
        .collect::<Option<Vec<Read>>>()?;
    let per_state = match read_states_here(ctx, &reads, tally) {
        Some(hits) => hits,
        None => {
            let mut per_state = Vec::with_capacity(n);
            for r in &reads {
                match read_all(ctx, r, &cfg, tally).await? {
                    Ok(h) => per_state.push(h),
                    Err(e) => return Some((e.status, answer_error(ctx, &e))),
                }
            }
            per_state
        }
    };
    if (0..keys.len()).any(|i| per_state.iter().any(|h| h[i].batch != per_state[0][i].batch)) {
        return None;
    }
    let spec = &reads[0].entry.op.spec;
    let named: Vec<&str> = reads.iter().map(|r| spec.states.get_index(r.state).expect("state").0.as_str()).collect();
    // key by key, each key's states in the order asked
    let answer = |a: usize| {
        let (key, state) = (a / n, a % n);
        (named[state], keys[key].as_str(), &per_state[state][key])
    };
    Some((200, full(200, results(spec, (0..keys.len() * n).map(answer)))))
}

/// `unquote(raw_path)` as uvicorn gives it to the app; None where that could differ (bytes
/// beyond ASCII, an escape that is not UTF-8): such a request is Python's.
fn decoded_path(raw: &str) -> Option<Cow<'_, str>> {
    if !raw.is_ascii() {
        return None;
    }
    if !raw.contains('%') {
        return Some(Cow::Borrowed(raw));
    }
    let b: Vec<u8> = percent_encoding::percent_decode_str(raw).collect();
    String::from_utf8(b).ok().map(Cow::Owned)
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

fn method_label(m: &Method) -> &'static str {
    match *m {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        _ => "other",
    }
}

fn guarded(r: Response<Full<Bytes>>, slot: Option<Slot>) -> Answer {
    r.map(|b| Guarded { inner: Either::Left(b), _slot: slot })
}

async fn handle(ctx: Arc<Ctx>, req: Request<Incoming>) -> Result<Answer, Infallible> {
    let t0 = Instant::now();
    let engine = ctx.engine.clone();
    let cfg = engine.settings.load_full();
    let (mut parts, body) = req.into_parts();
    parts.headers.remove(PRINCIPAL_HEADER);
    let raw_path = parts.uri.path().to_string();
    let path = decoded_path(&raw_path);

    // who is asking, before anything else (`qstate.router.auth`, outermost)
    let mut principal = None;
    if let Some(book) = engine.book.load_full() {
        match path.as_deref() {
            Some(p) if !is_open(p, cfg.metrics_public) => {
                let header = parts.headers.get("authorization").map(HeaderValue::as_bytes);
                match authorize(&book, header, p) {
                    Ok(who) => principal = Some(who.header()),
                    Err(e) => return Ok(guarded(answer_error(&ctx, &e), None)),
                }
            }
            // a path only Python decodes: it authenticates the request itself
            _ => {}
        }
    }

    // the budget (`qstate.router.limits`): one in-flight count for both paths
    let p = path.as_deref().unwrap_or(&raw_path);
    let exempt = matches!(p, "/healthz" | "/readyz" | "/metrics")
        || (parts.method == Method::GET && p.starts_with("/v1/watch/"));
    let mut slot = None;
    let mut data = Bytes::new();
    if !exempt {
        if ctx.inflight.load(Ordering::Acquire) >= cfg.max_concurrent {
            let e = ErrorAnswer::overloaded(
                format!(
                    "this router serves {} requests at once (QSTATE_MAX_CONCURRENT_REQUESTS); retry after {} s",
                    cfg.max_concurrent,
                    py_g(cfg.retry_after_s)
                ),
                cfg.retry_after_s,
            );
            return Ok(guarded(answer_error(&ctx, &e), None));
        }
        let declared = parts.headers.get(CONTENT_LENGTH).map(HeaderValue::as_bytes);
        let too_large = || {
            ErrorAnswer::too_large(
                format!(
                    "request body over {} bytes (QSTATE_MAX_BODY_BYTES); send fewer keys per request",
                    cfg.max_body_bytes
                ),
                cfg.max_body_bytes as i64,
            )
        };
        if let Some(d) = declared {
            if !d.is_empty()
                && d.iter().all(u8::is_ascii_digit)
                && std::str::from_utf8(d)
                    .ok()
                    .and_then(|s| s.parse::<u128>().ok())
                    .is_none_or(|n| n > cfg.max_body_bytes as u128)
            {
                return Ok(guarded(answer_error(&ctx, &too_large()), None));
            }
        }
        ctx.inflight.fetch_add(1, Ordering::AcqRel);
        slot = Some(Slot(ctx.inflight.clone()));
        let bodiless =
            matches!(parts.method, Method::GET | Method::HEAD | Method::OPTIONS | Method::DELETE) && declared.is_none();
        if !bodiless {
            match read_body(body, cfg.max_body_bytes).await {
                Received::Whole(b) => data = b,
                Received::TooLarge => return Ok(guarded(answer_error(&ctx, &too_large()), slot)),
                // the client went away while sending
                Received::Gone => return Ok(guarded(full(400, Vec::new()), slot)),
            }
        }
    } else {
        let bodiless = parts.headers.get(CONTENT_LENGTH).is_none();
        if !bodiless {
            if let Received::Whole(b) = read_body(body, cfg.max_body_bytes).await {
                data = b;
            }
        }
    }

    // answered here, or by Python
    if let Some(p) = path.as_deref() {
        let query = parts.uri.query();
        let mut tally = Tally::default();
        let native = match parts.method {
            Method::GET if p.starts_with("/v1/state/") => {
                native_get(&ctx, p, query, &mut tally).await.map(|a| (STATE_ROUTE, a))
            }
            // a POST handed over reads its content type and query here too: microseconds
            Method::POST if read_as_fastapi(parts.headers.get(CONTENT_TYPE).map(HeaderValue::as_bytes), query) => {
                match batch_names(p).as_deref() {
                    Some(&[job, operator, state]) => {
                        native_batch(&ctx, (job, operator, state), query, &data, &mut tally)
                            .await
                            .map(|a| (BATCH_ROUTE, a))
                    }
                    Some(&[job, operator]) => native_states_batch(&ctx, (job, operator), query, &data, &mut tally)
                        .await
                        .map(|a| (STATES_BATCH_ROUTE, a)),
                    _ => None,
                }
            }
            _ => None,
        };
        if let Some((route, (status, resp))) = native {
            tally.count(&engine);
            engine.metrics.request(route, method_label(&parts.method), status, t0.elapsed().as_secs_f64());
            return Ok(guarded(resp, slot));
        }
    }
    if let Some(p) = principal {
        parts.headers.insert(HeaderName::from_static(PRINCIPAL_HEADER), HeaderValue::from_str(&p).expect("ASCII"));
    }
    let resp = ctx.upstream.forward(parts, data).await;
    Ok(resp.map(|b| Guarded { inner: b, _slot: slot }))
}

/// The running front: its threads, and how to stop them.
///
/// Each thread runs a runtime of its own (tokio's current-thread flavour) and serves the
/// connections handed to it, start to end; the first thread also accepts, and hands each new
/// connection to the thread with the fewest open. A request then wakes one thread, the one
/// its connection lives on: under tokio's multi-thread runtime every wake-up from a socket
/// also woke an idle worker to look for work to steal, 2.2 context switches and 78 µs of CPU
/// a one-key read against 1.0 and 46 µs here (docs/architecture.md §5, the native front).
pub struct Front {
    stop: watch::Sender<bool>,
    end: watch::Sender<bool>,
    done: std::sync::mpsc::Receiver<()>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

pub struct FrontConfig {
    pub listener: StdListener,
    pub tls: Option<(PathBuf, PathBuf)>,
    pub upstream: PathBuf,
    pub threads: usize,
}

/// A front thread as the acceptor sees it: where its connections go, and how many it has.
struct Lane {
    conns: mpsc::UnboundedSender<std::net::TcpStream>,
    open: Arc<AtomicUsize>,
}

impl Front {
    pub fn start(engine: Arc<Engine>, cfg: FrontConfig) -> io::Result<Front> {
        let tls = match &cfg.tls {
            Some((cert, key)) => Some(crate::tls::acceptor(cert, key)?),
            None => None,
        };
        cfg.listener.set_nonblocking(true)?;
        let (done_tx, done) = std::sync::mpsc::channel();
        // dropped on an error below: the threads started end with it
        let mut front = Front { stop: watch::channel(false).0, end: watch::channel(false).0, done, threads: vec![] };
        let inflight = Arc::new(AtomicUsize::new(0));
        let n = cfg.threads.max(1);
        let (mut lanes, mut inboxes) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for _ in 0..n {
            let (conns, inbox) = mpsc::unbounded_channel();
            let open = Arc::new(AtomicUsize::new(0));
            lanes.push(Lane { conns, open: open.clone() });
            inboxes.push((inbox, open));
        }
        let mut acceptor = Some((cfg.listener, lanes));
        for (inbox, open) in inboxes {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let accepting = match acceptor.take() {
                Some((listener, lanes)) => {
                    let _g = runtime.enter();
                    Some((TcpListener::from_std(listener)?, lanes))
                }
                None => None,
            };
            // a thread's own connection to the app (hyper's pool spawns on the runtime asking)
            let ctx = Arc::new(Ctx {
                engine: engine.clone(),
                upstream: Upstream::new(cfg.upstream.clone()),
                inflight: inflight.clone(),
            });
            let (tls, stopped, mut ended, done_tx) =
                (tls.clone(), front.stop.subscribe(), front.end.subscribe(), done_tx.clone());
            let thread = std::thread::Builder::new().name("qstate-front".into()).spawn(move || {
                runtime.block_on(async {
                    let accept = async {
                        if let Some((listener, lanes)) = accepting {
                            accept(listener, lanes, stopped.clone()).await;
                        }
                    };
                    tokio::select! {
                        _ = async { tokio::join!(accept, serve(ctx, inbox, open, tls, stopped.clone())) } => {}
                        _ = ended.wait_for(|e| *e) => {}
                    }
                });
                let _ = done_tx.send(());
                // the engine's channels to other shards may live on this runtime: it ends
                // when every thread has (or the grace is over)
                runtime.block_on(async {
                    let _ = ended.wait_for(|e| *e).await;
                });
                runtime.shutdown_timeout(Duration::from_millis(100));
            })?;
            front.threads.push(thread);
        }
        Ok(front)
    }

    /// Stop accepting, let the requests under way finish (at most `grace`), then end.
    pub fn stop(&mut self, grace: Duration) {
        self.stop.send_replace(true);
        let until = Instant::now() + grace;
        for _ in 0..self.threads.len() {
            if self.done.recv_timeout(until.saturating_duration_since(Instant::now())).is_err() {
                break;
            }
        }
        self.end.send_replace(true);
        // each thread's runtime is gone (and with it the listener and the connections) when
        // this returns; a request still under way is dropped at its next await
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        self.stop(Duration::from_millis(0));
    }
}

/// The accept loop (on the first thread): each connection to the thread with the fewest open,
/// so that keep-alive clients spread over the threads (accepting on every thread at once left
/// one thread with all of wrk's 32 connections, the one awake when they came).
async fn accept(listener: TcpListener, lanes: Vec<Lane>, mut stopped: watch::Receiver<bool>) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stopped.wait_for(|s| *s) => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            // one connection gone before it was taken: the next
            Err(e) if matches!(e.kind(), io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset) => continue,
            // out of file descriptors or memory: a pause, not a loop spinning on the error
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let Ok(stream) = stream.into_std() else { continue };
        let lane = lanes.iter().min_by_key(|l| l.open.load(Ordering::Relaxed)).expect("a thread");
        lane.open.fetch_add(1, Ordering::Relaxed);
        let _ = lane.conns.send(stream);
    }
}

/// One thread's connections, each served here until it closes; on `stop`, no new one, and
/// the ones open finish what they are answering.
async fn serve(
    ctx: Arc<Ctx>,
    mut inbox: mpsc::UnboundedReceiver<std::net::TcpStream>,
    open: Arc<AtomicUsize>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    mut stopped: watch::Receiver<bool>,
) {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.keep_alive(true).pipeline_flush(true).timer(hyper_util::rt::TokioTimer::new());
    loop {
        let handed = tokio::select! {
            s = inbox.recv() => s,
            _ = stopped.wait_for(|s| *s) => break,
        };
        let Some(stream) = handed else { break };
        // counted open until its task ends, however it ends
        let opened = Opened(open.clone());
        let Ok(stream) = TcpStream::from_std(stream) else { continue };
        let c = ctx.clone();
        let service = hyper::service::service_fn(move |req| handle(c.clone(), req));
        match &tls {
            None => {
                let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
                tokio::spawn(async move {
                    let _ = conn.await;
                    drop(opened);
                });
            }
            Some(acceptor) => {
                let (acceptor, http, w) = (acceptor.clone(), http.clone(), graceful.watcher());
                tokio::spawn(async move {
                    if let Ok(s) = acceptor.accept(stream).await {
                        let _ = w.watch(http.serve_connection(TokioIo::new(s), service)).await;
                    }
                    drop(opened);
                });
            }
        }
    }
    graceful.shutdown().await;
}

/// One connection of a thread's count, given back when dropped.
struct Opened(Arc<AtomicUsize>);

impl Drop for Opened {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_as_parse_qsl() {
        let p = params(Some("limit=5&from=now-1h&limit=7&to=&x=1")).unwrap();
        assert_eq!(p.limit.as_deref(), Some("7"));
        assert_eq!(p.from.as_deref(), Some("now-1h"));
        assert_eq!(p.to, None);
        let p = params(Some("from=now+5m")).unwrap();
        assert_eq!(p.from.as_deref(), Some("now 5m"));
        assert!(params(Some("from=%FF")).is_none());
    }

    #[test]
    fn batch_requests_as_fastapi_reads_them() {
        let json = Some(&b"application/json"[..]);
        assert!(read_as_fastapi(json, None));
        assert!(read_as_fastapi(json, Some("limit=5&from=0&x=&limit=&limit=2")));
        for ct in ["Application/JSON; charset=utf-8", " application/merge-patch+json ", "application/json;"] {
            assert!(read_as_fastapi(Some(ct.as_bytes()), Some("to=9")), "{ct}");
        }
        // not JSON to FastAPI (strict_content_type): its 400, not a read
        for ct in [
            "",
            "text/plain",
            "application/ json",
            "application/json/x",
            "application/jsonx",
            "json",
            "application/json\u{e9}",
        ] {
            assert!(!read_as_fastapi(Some(ct.as_bytes()), None), "{ct}");
        }
        assert!(!read_as_fastapi(None, None));
        // a blank value last is a value to FastAPI (keep_blank_values=True)
        for q in ["limit", "from=", "to=5&to=", "min_batch=", "savepoint=", "li%6Dit="] {
            assert!(!read_as_fastapi(json, Some(q)), "{q}");
        }
        // pydantic strips a number of ASCII whitespace, not of \x1c-\x1f
        assert!(read_as_fastapi(json, Some("limit=%202%0B&min_batch=%092")));
        assert!(!read_as_fastapi(json, Some("limit=%1C2")));
        assert!(!read_as_fastapi(json, Some("min_batch=2%1F")));
        assert!(read_as_fastapi(json, Some("from=%1C5")), "a time is str.strip()ped by both");
    }

    #[test]
    fn batch_bodies() {
        assert_eq!(batch_keys(br#"{"keys": ["a", "b"]}"#), Some(vec!["a".into(), "b".into()]));
        assert_eq!(batch_keys(br#"{"keys": [], "x": 1}"#), None);
        assert_eq!(batch_keys(br#"{"keys": [1]}"#), None);
        assert_eq!(batch_keys(br#"{"keys": [""]}"#), None);
        assert_eq!(batch_keys(br#"["a"]"#), None);
    }

    #[test]
    fn states_batch_bodies() {
        let both = |k: &[&str], s: &[&str]| {
            Some((k.iter().map(|x| x.to_string()).collect(), s.iter().map(|x| x.to_string()).collect()))
        };
        assert_eq!(states_batch_body(br#"{"keys": ["a"], "states": ["v", "w"]}"#), both(&["a"], &["v", "w"]));
        assert_eq!(states_batch_body(br#"{"states": [], "keys": []}"#), both(&[], &[]));
        assert_eq!(states_batch_body(br#"{"keys": ["a"]}"#), None);
        assert_eq!(states_batch_body(br#"{"keys": ["a"], "states": "v"}"#), None);
        assert_eq!(states_batch_body(br#"{"keys": ["a"], "states": ["v"], "x": 1}"#), None);
        assert_eq!(states_batch_body(br#"{"keys": [""], "states": ["v"]}"#), None);
    }
}
