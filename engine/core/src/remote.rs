//! Keys whose partition is not on this host, read from their owner's shard server without
//! Python (docs/architecture.md §5): the same coalescing as `qstate.router.coalesce` (keys of
//! one shard asked at once leave together in one MultiGet, at most two calls in flight per
//! group, at most `max_shard_queue` keys waiting per shard: beyond, a 429 at once), on
//! channels that send the cluster token and speak TLS when the router's callers do.
//!
//! Only the answers of a partition its owner holds (FOUND, ABSENT) are given here; anything
//! else (the owner down, restoring, moving, refusing, none named yet) the caller hands to
//! Python, which follows the routing table, asks a follower, and words the 503.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::oneshot;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::codec::Value;
use crate::local::Hit;
use crate::read::Window;
use crate::shardpb::{window, KeyQuery, KeyResult, KeyStatus, LookupReply, LookupRequest};

/// Keys per MultiGet (a shard takes at most 10,000).
pub const MAX_BATCH: usize = 2000;
const MAX_INFLIGHT: usize = 2;
const MULTI_GET: &str = "/qstate.shard.v1.Shard/MultiGet";

/// Keys asked of one shard, their answers to come.
pub struct Asked(Vec<oneshot::Receiver<Result<KeyResult, ()>>>);

impl Asked {
    /// Each key's answer, in order.
    pub async fn answers(self) -> Result<Vec<Hit>, Failed> {
        let mut out = Vec::with_capacity(self.0.len());
        for r in self.0 {
            match r.await {
                Ok(Ok(kr)) => out.push(hit(kr).ok_or(Failed::Handover)?),
                _ => return Err(Failed::Handover),
            }
        }
        Ok(out)
    }
}

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

/// Why a remote read did not give a key's answer.
#[derive(Debug)]
pub enum Failed {
    /// `max_shard_queue` keys already wait for this shard: answered 429 at once
    Overloaded(usize),
    /// anything else: Python asks again and words the answer
    Handover,
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
}

type Waiter = oneshot::Sender<Result<KeyResult, ()>>;

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
    state: Mutex<State>,
}

/// What to ask: the operator, the state, the range and how many windows a key.
pub struct Ask<'a> {
    pub job: &'a str,
    pub operator: &'a str,
    pub state: &'a str,
    pub range: Option<(i64, i64)>,
    pub limit: u32,
}

impl Remote {
    pub fn new(callers: Callers) -> Arc<Remote> {
        Arc::new(Remote { callers, state: Mutex::new(State::default()) })
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
        let c = ep.connect_lazy();
        st.channels.insert(address.to_string(), c.clone());
        Some(c)
    }

    /// Keys (with their partitions) asked of the shard at `address`: queued now, in the
    /// group they leave with; `answers` waits for them. Err: the shard's queue is full.
    pub fn ask(self: &Arc<Self>, address: &str, ask: &Ask<'_>, keys: Vec<KeyQuery>) -> Result<Asked, Failed> {
        let group = Group {
            address: address.to_string(),
            job: ask.job.to_string(),
            operator: ask.operator.to_string(),
            state: ask.state.to_string(),
            range: ask.range,
            limit: if ask.range.is_some() { ask.limit } else { 0 },
        };
        let mut rx = Vec::with_capacity(keys.len());
        {
            let mut st = self.state.lock();
            // as `ShardCaller.lookup` adds keys one by one: refused at the first that finds the
            // queue full (what it says: how many wait then)
            let waiting = st.waiting.get(address).copied().unwrap_or(0);
            if waiting >= self.callers.max_queue {
                return Err(Failed::Overloaded(waiting));
            }
            if waiting + keys.len() > self.callers.max_queue {
                return Err(Failed::Overloaded(self.callers.max_queue));
            }
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
                tokio::spawn(async move {
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
            // an address no channel can be made to: every waiter is handed over
            if let Some(p) = st.groups.remove(&group) {
                let n = p.keys.len();
                leave(&mut st, &group.address, n);
            }
            return;
        };
        let mut calls = Vec::new();
        {
            let Some(p) = st.groups.get_mut(&group) else { return };
            p.scheduled = false;
            while !p.keys.is_empty() && p.inflight < MAX_INFLIGHT {
                let n = p.keys.len().min(MAX_BATCH);
                let keys: Vec<KeyQuery> = p.keys.drain(..n).collect();
                let waiters: Vec<Waiter> = p.waiters.drain(..n).collect();
                p.inflight += 1;
                calls.push((keys, waiters));
            }
        }
        for (keys, _) in &calls {
            leave(&mut st, &group.address, keys.len());
        }
        drop(st);
        for (keys, waiters) in calls {
            let me = self.clone();
            let (group, channel) = (group.clone(), channel.clone());
            tokio::spawn(async move {
                let got = me.call(channel, &group, keys).await;
                match got {
                    Some(reply) if reply.results.len() == waiters.len() => {
                        for (w, r) in waiters.into_iter().zip(reply.results) {
                            let _ = w.send(Ok(r));
                        }
                    }
                    _ => {
                        for w in waiters {
                            let _ = w.send(Err(()));
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

    async fn call(&self, channel: Channel, g: &Group, keys: Vec<KeyQuery>) -> Option<LookupReply> {
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
            savepoint: String::new(),
        };
        let mut req = tonic::Request::new(msg);
        req.set_timeout(self.callers.timeout);
        if let Some(t) = &self.callers.token {
            let v: MetadataValue<_> = format!("Bearer {t}").parse().ok()?;
            req.metadata_mut().insert("authorization", v);
        }
        let mut grpc = tonic::client::Grpc::new(channel);
        let fut = async {
            grpc.ready().await.ok()?;
            let codec = tonic_prost::ProstCodec::<LookupRequest, LookupReply>::default();
            grpc.unary(req, PathAndQuery::from_static(MULTI_GET), codec).await.ok()
        };
        tokio::time::timeout(self.callers.timeout, fut).await.ok().flatten().map(tonic::Response::into_inner)
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

/// A shard's answer about one key as a hit: FOUND and ABSENT only (the others are Python's).
fn hit(r: KeyResult) -> Option<Hit> {
    let status = KeyStatus::try_from(r.status).ok()?;
    if status != KeyStatus::Found && status != KeyStatus::Absent {
        return None;
    }
    let windows = r
        .windows
        .iter()
        .map(|w| Window {
            start: w.windowed.then_some(w.start_ms),
            end: w.windowed.then_some(w.end_ms),
            value: match w.value {
                Some(window::Value::IntValue(v)) => Value::Long(v),
                Some(window::Value::DoubleValue(v)) => Value::Double(v),
                None => Value::Null,
            },
        })
        .collect();
    Some(Hit {
        found: status == KeyStatus::Found,
        batch: r.batch,
        watermark_ms: r.watermark_ms,
        windows,
        next_from: r.next_from_ms,
    })
}
