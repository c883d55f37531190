//! Keys whose partition is read from another process: its owner's (or a follower's) shard
//! server over gRPC (docs/architecture.md §5). Keys of one shard asked at once leave together
//! in one MultiGet (at most `MAX_BATCH` keys a call, two calls in flight per group), at most
//! `max_shard_queue` keys wait per shard (beyond: 429 at once), on channels that send the
//! cluster token and speak TLS when the router's callers do. The calls run on the engine's own
//! runtime, whichever thread asks, so a channel outlives the request that opened it.
//!
//! This module reports what each server said (`Answered`); what to make of it (a move, a
//! restore, a follower) is the read core's (`read::fetch`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::errors::Failure;
use crate::shardpb::{KeyQuery, KeyResult, LookupReply, LookupRequest};

/// Keys per MultiGet (a shard takes at most 10,000).
pub const MAX_BATCH: usize = 2000;
const MAX_INFLIGHT: usize = 2;
const MULTI_GET: &str = "/qstate.shard.v1.Shard/MultiGet";

/// How the router's callers reach shard servers (`qstate.core.transport.security`).
#[derive(Clone, Debug, Default)]
pub struct Callers {
    /// the cluster token, sent as `authorization: Bearer ...`
    pub token: Option<String>,
    /// PEM CA bundle: TLS to the shards when set
    pub tls_ca: Option<Vec<u8>>,
    /// the name certificates are checked against, instead of the address dialled
    pub tls_server_name: Option<String>,
    pub timeout: Duration,
    pub max_queue: usize,
}

/// Why a call gave no answers.
#[derive(Clone, Debug)]
pub enum CallFailed {
    /// the server did not answer in `timeout`
    Timeout,
    /// it could not be reached (or no channel could be made to it)
    Down,
    /// it refused this router's cluster token
    Unauthenticated,
    /// it refused the request, naming why (its class and detail, from the trailers)
    Refused(Failure),
}

/// What one server said about keys asked of it.
pub type Answered = Result<Vec<KeyResult>, CallFailed>;

/// Keys asked of one shard, their answers to come.
pub struct Asked(Vec<oneshot::Receiver<Result<KeyResult, CallFailed>>>);

impl Asked {
    /// Each key's result, in order, or the call's failure.
    pub async fn answers(self) -> Answered {
        let mut out = Vec::with_capacity(self.0.len());
        for r in self.0 {
            match r.await {
                Ok(Ok(kr)) => out.push(kr),
                Ok(Err(f)) => return Err(f),
                Err(_) => return Err(CallFailed::Down), // the call's task ended without a word
            }
        }
        Ok(out)
    }
}

/// One group of keys that leave together: same shard and the same question.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Group {
    address: String,
    job: String,
    operator: String,
    state: String,
    range: Option<(i64, i64)>,
    limit: u32,
    savepoint: String,
    partitions: u32,
}

type Waiter = oneshot::Sender<Result<KeyResult, CallFailed>>;

#[derive(Default)]
struct Pending {
    keys: Vec<KeyQuery>,
    waiters: Vec<Waiter>,
    inflight: usize,
    scheduled: bool,
}

#[derive(Default)]
struct State {
    groups: HashMap<Group, Pending>,
    waiting: HashMap<String, usize>,
    channels: HashMap<String, Channel>,
}

pub struct Remote {
    callers: Callers,
    runtime: Handle,
    state: Mutex<State>,
}

/// What to ask: the operator, the state, the range, how many windows a key, a savepoint.
pub struct Ask<'a> {
    pub job: &'a str,
    pub operator: &'a str,
    pub state: &'a str,
    pub range: Option<(i64, i64)>,
    pub limit: u32,
    pub savepoint: Option<&'a str>,
    /// the partition count the keys were routed by (the caller's spec)
    pub partitions: u32,
}

impl Remote {
    /// Calls run on `runtime` (the engine's).
    pub fn new(callers: Callers, runtime: Handle) -> Arc<Remote> {
        Arc::new(Remote { callers, runtime, state: Mutex::new(State::default()) })
    }

    fn channel(&self, st: &mut State, address: &str) -> Option<Channel> {
        if let Some(c) = st.channels.get(address) {
            return Some(c.clone());
        }
        let scheme = if self.callers.tls_ca.is_some() { "https" } else { "http" };
        let mut ep = Endpoint::from_shared(format!("{scheme}://{address}")).ok()?;
        ep = ep.tcp_nodelay(true).http2_adaptive_window(true);
        if let Some(ca) = &self.callers.tls_ca {
            let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
            let host = self
                .callers
                .tls_server_name
                .clone()
                .unwrap_or_else(|| address.rsplit_once(':').map_or(address, |(h, _)| h).to_string());
            tls = tls.domain_name(host);
            ep = ep.tls_config(tls).ok()?;
        }
        let c = {
            let _g = self.runtime.enter(); // its connection's tasks live on the engine's runtime
            ep.connect_lazy()
        };
        st.channels.insert(address.to_string(), c.clone());
        Some(c)
    }

    /// Whether `n` more keys fit the queue of the shard at `address` now. Err: how many wait
    /// (or the cap, when `n` alone is beyond it). The read core asks it of a request's keys
    /// for one shard together, so a batch that cannot fit is refused whole, before any of its
    /// partitions is queued (`read::fetch::keys`).
    pub fn fits(&self, address: &str, n: usize) -> Result<(), usize> {
        self.room(self.state.lock().waiting.get(address).copied().unwrap_or(0), n)
    }

    /// Whether `n` more keys fit a queue that `waiting` keys are in (`fits`, `ask`).
    fn room(&self, waiting: usize, n: usize) -> Result<(), usize> {
        if waiting >= self.callers.max_queue {
            return Err(waiting);
        }
        if waiting + n > self.callers.max_queue {
            return Err(self.callers.max_queue);
        }
        Ok(())
    }

    /// Keys (with their partitions) asked of the shard at `address`: queued now, in the group
    /// they leave with; `answers` waits for them. Err: the shard's queue is full (how many
    /// keys wait for it).
    pub fn ask(self: &Arc<Self>, address: &str, ask: &Ask<'_>, keys: Vec<KeyQuery>) -> Result<Asked, usize> {
        let group = Group {
            address: address.to_string(),
            job: ask.job.to_string(),
            operator: ask.operator.to_string(),
            state: ask.state.to_string(),
            range: ask.range,
            limit: if ask.range.is_some() { ask.limit } else { 0 },
            savepoint: ask.savepoint.unwrap_or_default().to_string(),
            partitions: ask.partitions,
        };
        let mut rx = Vec::with_capacity(keys.len());
        {
            let mut st = self.state.lock();
            // refused at the first key that finds the queue full (what it says: how many wait)
            self.room(st.waiting.get(address).copied().unwrap_or(0), keys.len())?;
            *st.waiting.entry(address.to_string()).or_default() += keys.len();
            let p = st.groups.entry(group.clone()).or_default();
            for k in keys {
                let (tx, r) = oneshot::channel();
                p.keys.push(k);
                p.waiters.push(tx);
                rx.push(r);
            }
            if !p.scheduled && p.inflight < MAX_INFLIGHT {
                p.scheduled = true;
                let me = self.clone();
                // after the requests parsed with this one have joined
                self.runtime.spawn(async move {
                    tokio::task::yield_now().await;
                    me.flush(group);
                });
            }
        }
        Ok(Asked(rx))
    }

    fn flush(self: &Arc<Self>, group: Group) {
        let mut st = self.state.lock();
        let Some(channel) = self.channel(&mut st, &group.address) else {
            // an address no channel can be made to: every waiter hears the shard is down
            if let Some(p) = st.groups.remove(&group) {
                leave(&mut st, &group.address, p.keys.len());
                for w in p.waiters {
                    let _ = w.send(Err(CallFailed::Down));
                }
            }
            return;
        };
        let mut calls = Vec::new();
        let mut left = 0; // keys that leave the shard's queue: sent, or nobody waits for them
        {
            let Some(p) = st.groups.get_mut(&group) else { return };
            p.scheduled = false;
            // lookups nobody waits for any more (their request went away): not sent at all
            let before = p.keys.len();
            let (keys, waiters): (Vec<_>, Vec<_>) = std::mem::take(&mut p.keys)
                .into_iter()
                .zip(std::mem::take(&mut p.waiters))
                .filter(|(_, w)| !w.is_closed())
                .unzip();
            left += before - keys.len();
            (p.keys, p.waiters) = (keys, waiters);
            while !p.keys.is_empty() && p.inflight < MAX_INFLIGHT {
                let n = p.keys.len().min(MAX_BATCH);
                let keys: Vec<KeyQuery> = p.keys.drain(..n).collect();
                let waiters: Vec<Waiter> = p.waiters.drain(..n).collect();
                p.inflight += 1;
                left += n;
                calls.push((keys, waiters));
            }
        }
        if st.groups.get(&group).is_some_and(|p| p.keys.is_empty() && p.inflight == 0) {
            st.groups.remove(&group);
        }
        leave(&mut st, &group.address, left);
        drop(st);
        for (keys, waiters) in calls {
            let me = self.clone();
            let (group, channel) = (group.clone(), channel.clone());
            self.runtime.spawn(async move {
                match me.call(channel, &group, keys).await {
                    Ok(reply) if reply.results.len() == waiters.len() => {
                        for (w, r) in waiters.into_iter().zip(reply.results) {
                            let _ = w.send(Ok(r));
                        }
                    }
                    Ok(_) => {
                        let f = CallFailed::Refused(Failure::engine(format!(
                            "shard {} answered a MultiGet with another number of keys than asked",
                            group.address
                        )));
                        for w in waiters {
                            let _ = w.send(Err(f.clone()));
                        }
                    }
                    Err(f) => {
                        for w in waiters {
                            let _ = w.send(Err(f.clone()));
                        }
                    }
                }
                let again = {
                    let mut st = me.state.lock();
                    match st.groups.get_mut(&group) {
                        Some(p) => {
                            p.inflight -= 1;
                            if !p.keys.is_empty() && !p.scheduled {
                                p.scheduled = true;
                                true
                            } else {
                                if p.keys.is_empty() && p.inflight == 0 {
                                    st.groups.remove(&group);
                                }
                                false
                            }
                        }
                        None => false,
                    }
                };
                if again {
                    me.flush(group);
                }
            });
        }
    }

    async fn call(&self, channel: Channel, g: &Group, keys: Vec<KeyQuery>) -> Result<LookupReply, CallFailed> {
        let (from_ms, to_ms) = g.range.unwrap_or((0, 0));
        let msg = LookupRequest {
            job: g.job.clone(),
            operator: g.operator.clone(),
            state: g.state.clone(),
            keys,
            range: g.range.is_some(),
            from_ms,
            to_ms,
            limit: g.limit,
            savepoint: g.savepoint.clone(),
            partitions: g.partitions,
        };
        let mut req = tonic::Request::new(msg);
        req.set_timeout(self.callers.timeout);
        if let Some(t) = &self.callers.token {
            let v: MetadataValue<_> = format!("Bearer {t}").parse().map_err(|_| CallFailed::Unauthenticated)?;
            req.metadata_mut().insert("authorization", v);
        }
        let mut grpc = tonic::client::Grpc::new(channel);
        let fut = async {
            grpc.ready().await.map_err(|_| CallFailed::Down)?;
            let codec = tonic_prost::ProstCodec::<LookupRequest, LookupReply>::default();
            grpc.unary(req, PathAndQuery::from_static(MULTI_GET), codec).await.map_err(|s| failed(&s))
        };
        match tokio::time::timeout(self.callers.timeout, fut).await {
            Ok(r) => r.map(tonic::Response::into_inner),
            Err(_) => Err(CallFailed::Timeout),
        }
    }
}

/// A gRPC status as what it says of the call: a transport condition, or the server's refusal
/// with the class and detail its trailers name (`qstate.core.errors.grpc_trailers`).
fn failed(s: &tonic::Status) -> CallFailed {
    match s.code() {
        tonic::Code::DeadlineExceeded => CallFailed::Timeout,
        tonic::Code::Unavailable | tonic::Code::Cancelled | tonic::Code::Unknown => CallFailed::Down,
        tonic::Code::Unauthenticated => CallFailed::Unauthenticated,
        _ => {
            let meta = s.metadata();
            let class = meta.get("qstate-error").and_then(|v| v.to_str().ok()).unwrap_or("");
            let detail = meta.get("qstate-detail").and_then(|v| v.to_str().ok());
            let class = if class.is_empty() { by_code(s.code()) } else { class };
            CallFailed::Refused(Failure::remote(class, s.message().to_string(), detail))
        }
    }
}

/// The class a refusal without trailers is (`qstate.core.errors._BY_CODE`).
fn by_code(code: tonic::Code) -> &'static str {
    match code {
        tonic::Code::InvalidArgument => "InvalidRequest",
        tonic::Code::NotFound => "NotFound",
        tonic::Code::Aborted => "StaleEpoch",
        tonic::Code::FailedPrecondition => "NotOwner",
        tonic::Code::DataLoss => "DeltaMismatch",
        tonic::Code::PermissionDenied => "Forbidden",
        _ => "QStateError",
    }
}

fn leave(st: &mut State, address: &str, n: usize) {
    if let Some(w) = st.waiting.get_mut(address) {
        *w = w.saturating_sub(n);
        if *w == 0 {
            st.waiting.remove(address);
        }
    }
}
