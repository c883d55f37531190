//! Keys whose partition is read from another process: its owner's (or a follower's) shard
//! server over gRPC (docs/architecture.md §5). Keys of one shard asked at once leave together
//! in one MultiGet (at most `MAX_BATCH` keys a call, two calls in flight per group and lane),
//! at most `max_shard_queue` keys wait per shard (beyond: 429 at once), on channels that send
//! the cluster token and speak TLS when the router's callers do.
//!
//! Where the calls run (a `Lane`): a front thread (a current-thread runtime: the HTTP front's,
//! the gRPC port's) has its own lane, whose channels and calls live on that thread, so a
//! forwarded read is coalesced, sent and answered without waking another thread (measured:
//! 29.3 µs of router CPU a forwarded GET on the engine's runtime, 21.3 on the asking thread;
//! loadtest/results/cluster_reads.md, 2026-12-07). Every other caller (reads Python awaits,
//! on the engine's runtime) shares the engine's lane. A lane ends with its thread; the queue
//! bound is the shard's, over every lane.
//!
//! This module reports what each server said (`Answered`); what to make of it (a move, a
//! restore, a follower) is the read core's (`read::fetch`).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::runtime::{Handle, RuntimeFlavor};
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
    channels: HashMap<String, Channel>,
}

/// Where calls run: one runtime's groups and channels (the module's docs).
struct Lane {
    remote: Weak<Remote>,
    runtime: Handle,
    state: Mutex<State>,
}

pub struct Remote {
    /// tells this remote's lanes from another's in a thread's list (`lane`)
    id: u64,
    callers: Callers,
    /// the lane of callers that are not a front thread (the engine's runtime)
    shared: Arc<Lane>,
    /// keys queued and not yet sent, per shard address, over every lane
    waiting: Mutex<HashMap<String, usize>>,
}

impl Drop for Lane {
    /// Keys still queued when a lane goes (its runtime ended under them: a front stopped)
    /// leave the shard's queue, which would otherwise stay that much fuller for good.
    fn drop(&mut self) {
        let Some(remote) = self.remote.upgrade() else { return };
        for (g, p) in self.state.get_mut().groups.drain() {
            remote.leave(&g.address, p.keys.len());
        }
    }
}

static REMOTES: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// This thread's lanes, one per remote it asked through; dropped with the thread.
    static LANES: RefCell<Vec<(u64, Arc<Lane>)>> = const { RefCell::new(Vec::new()) };
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
    /// Calls of callers that are not front threads run on `runtime` (the engine's).
    pub fn new(callers: Callers, runtime: Handle) -> Arc<Remote> {
        Arc::new_cyclic(|me| Remote {
            id: REMOTES.fetch_add(1, Ordering::Relaxed),
            callers,
            shared: Arc::new(Lane { remote: me.clone(), runtime, state: Mutex::new(State::default()) }),
            waiting: Mutex::new(HashMap::new()),
        })
    }

    /// The asking thread's lane: its own when it runs a current-thread runtime (a front
    /// thread), else the shared one.
    fn lane(self: &Arc<Self>) -> Arc<Lane> {
        let Ok(here) = Handle::try_current() else { return self.shared.clone() };
        if here.runtime_flavor() != RuntimeFlavor::CurrentThread {
            return self.shared.clone();
        }
        LANES.with_borrow_mut(|lanes| {
            if let Some((_, l)) = lanes.iter().find(|(id, l)| *id == self.id && l.runtime.id() == here.id()) {
                return l.clone();
            }
            // lanes of remotes replaced since (new callers), and of runtimes this thread ran
            // before (a channel's tasks ended with its runtime), go with the first new one
            lanes.retain(|(_, l)| l.remote.strong_count() > 0 && l.runtime.id() == here.id());
            let lane =
                Arc::new(Lane { remote: Arc::downgrade(self), runtime: here, state: Mutex::new(State::default()) });
            lanes.push((self.id, lane.clone()));
            lane
        })
    }

    fn channel(&self, lane: &Lane, st: &mut State, address: &str) -> Option<Channel> {
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
            let _g = lane.runtime.enter(); // its connection's tasks live on the lane's runtime
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
        self.room(self.waiting.lock().get(address).copied().unwrap_or(0), n)
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
            let mut waiting = self.waiting.lock();
            // refused at the first key that finds the queue full (what it says: how many wait)
            self.room(waiting.get(address).copied().unwrap_or(0), keys.len())?;
            *waiting.entry(address.to_string()).or_default() += keys.len();
        }
        let lane = self.lane();
        {
            let mut st = lane.state.lock();
            let p = st.groups.entry(group.clone()).or_default();
            for k in keys {
                let (tx, r) = oneshot::channel();
                p.keys.push(k);
                p.waiters.push(tx);
                rx.push(r);
            }
            if !p.scheduled && p.inflight < MAX_INFLIGHT {
                p.scheduled = true;
                let (me, on) = (self.clone(), lane.clone());
                // after the requests parsed with this one have joined
                lane.runtime.spawn(async move {
                    tokio::task::yield_now().await;
                    me.flush(&on, group);
                });
            }
        }
        Ok(Asked(rx))
    }

    fn flush(self: &Arc<Self>, lane: &Arc<Lane>, group: Group) {
        let mut st = lane.state.lock();
        let Some(channel) = self.channel(lane, &mut st, &group.address) else {
            // an address no channel can be made to: every waiter hears the shard is down
            if let Some(p) = st.groups.remove(&group) {
                self.leave(&group.address, p.keys.len());
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
        drop(st);
        self.leave(&group.address, left);
        for (keys, waiters) in calls {
            let (me, on) = (self.clone(), lane.clone());
            let (group, channel) = (group.clone(), channel.clone());
            lane.runtime.spawn(async move {
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
                    let mut st = on.state.lock();
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
                    me.flush(&on, group);
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

impl Remote {
    /// `n` keys of the shard at `address` left its queue (sent, or nobody waits for them).
    fn leave(&self, address: &str, n: usize) {
        let mut waiting = self.waiting.lock();
        if let Some(w) = waiting.get_mut(address) {
            *w = w.saturating_sub(n);
            if *w == 0 {
                waiting.remove(address);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote(engine: &tokio::runtime::Runtime) -> Arc<Remote> {
        Remote::new(
            Callers { timeout: Duration::from_secs(1), max_queue: 10, ..Callers::default() },
            engine.handle().clone(),
        )
    }

    fn current_thread() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime")
    }

    #[test]
    fn a_front_thread_keeps_its_lane_and_a_new_runtime_gets_a_new_one() {
        let engine = tokio::runtime::Builder::new_multi_thread().worker_threads(1).build().expect("a runtime");
        let r = remote(&engine);
        let first = current_thread();
        let (a, b) = first.block_on(async { (r.lane(), r.lane()) });
        assert!(Arc::ptr_eq(&a, &b), "one lane a thread while its runtime runs");
        assert!(!Arc::ptr_eq(&a, &r.shared), "a front thread's own lane");
        assert_eq!(a.runtime.id(), first.handle().id());
        drop(first);
        // the same thread, a runtime after it: channels made on the first would be dead
        let second = current_thread();
        let c = second.block_on(async { r.lane() });
        assert!(!Arc::ptr_eq(&a, &c), "a lane of the runtime that runs now");
        assert_eq!(c.runtime.id(), second.handle().id());
        assert_eq!(LANES.with_borrow(|l| l.len()), 1, "the dead runtime's lane went");
    }

    #[test]
    fn other_callers_share_the_engines_lane() {
        let engine = tokio::runtime::Builder::new_multi_thread().worker_threads(1).build().expect("a runtime");
        let r = remote(&engine);
        assert!(Arc::ptr_eq(&r.lane(), &r.shared), "no runtime: the engine's");
        let r2 = r.clone();
        let on_engine = engine.block_on(async move { engine_lane(&r2).await });
        assert!(on_engine, "the engine's runtime: the engine's lane");
    }

    async fn engine_lane(r: &Arc<Remote>) -> bool {
        Arc::ptr_eq(&r.lane(), &r.shared)
    }

    #[test]
    fn a_replaced_remote_leaves_no_lane_behind() {
        let engine = tokio::runtime::Builder::new_multi_thread().worker_threads(1).build().expect("a runtime");
        let rt = current_thread();
        let old = remote(&engine);
        rt.block_on(async { old.lane() });
        drop(old);
        let new = remote(&engine);
        rt.block_on(async { new.lane() });
        assert_eq!(LANES.with_borrow(|l| l.len()), 1, "the old remote's lane went with the first new one");
    }

    #[test]
    fn keys_queued_on_a_runtime_that_ended_leave_the_shards_queue() {
        let engine = tokio::runtime::Builder::new_multi_thread().worker_threads(1).build().expect("a runtime");
        let r = remote(&engine);
        let ask = Ask { job: "j", operator: "o", state: "s", range: None, limit: 0, savepoint: None, partitions: 1 };
        let keys = |n: usize| (0..n).map(|i| KeyQuery { key: format!("k{i}"), partition: 0 }).collect::<Vec<_>>();
        let front = current_thread();
        // asked, and the runtime gone before its flush ran: nobody will send these keys
        let asked = front.enter();
        let Ok(kept) = r.ask("127.0.0.1:9", &ask, keys(10)) else { panic!("no room for 10 keys") };
        drop(asked);
        assert_eq!(r.fits("127.0.0.1:9", 1), Err(10), "the queue is full");
        drop(front);
        drop(kept);
        LANES.with_borrow_mut(|l| l.clear()); // what the thread's end does
        assert_eq!(r.fits("127.0.0.1:9", 10), Ok(()), "the dead lane's keys left the queue");
    }
}
