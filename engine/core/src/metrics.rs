//! The router's Prometheus series for what the engine answers (docs/metrics.md): kept here
//! as counts since the last `take`, which Python adds to the same prometheus_client series
//! it exports (summed across `--workers` like every other), so a dashboard sees one router
//! whoever answered; and what only the engine knows: which front requests it answered itself
//! and which it handed to the app (`qstate_router_front_requests_total`), and the panics it
//! caught (`qstate_router_engine_panics_total`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

/// The latency buckets (seconds) of the router's histograms, the last one +Inf: Python makes
/// its histograms with these (`qstate._engine.LATENCY_BUCKETS`).
pub const BUCKETS: [f64; 10] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0];

/// Observations counted on `N - 1` bounds and +Inf (the router's: `BUCKETS`).
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram<const N: usize = 11> {
    /// per bucket (not cumulative: prometheus_client keeps them so), the last +Inf
    pub counts: [u64; N],
    pub sum: f64,
}

impl<const N: usize> Default for Histogram<N> {
    fn default() -> Self {
        Histogram { counts: [0; N], sum: 0.0 }
    }
}

impl<const N: usize> Histogram<N> {
    /// Count `s` in the first bucket whose bound (`N - 1` of them) it does not pass.
    pub fn observe_on(&mut self, bounds: &[f64], s: f64) {
        debug_assert_eq!(bounds.len() + 1, N);
        let i = bounds.iter().position(|&b| s <= b).unwrap_or(bounds.len());
        self.counts[i] += 1;
        self.sum += s;
    }
}

impl Histogram {
    fn observe(&mut self, s: f64) {
        self.observe_on(&BUCKETS, s);
    }
}

/// Everything counted since the last take.
#[derive(Debug, Default)]
pub struct Taken {
    pub requests: Vec<(&'static str, &'static str, u16, u64)>,
    pub latency: Vec<(&'static str, Histogram)>,
    pub reads: Vec<(&'static str, u64)>,
    pub unavailable: Vec<(&'static str, u64)>,
    pub refused: Vec<(&'static str, u64)>,
    /// partitions caught up with their shard's commits, by who did it: "read" (a read
    /// waited for it) or "follower" (off the read path)
    pub catchups: Vec<(&'static str, Histogram)>,
    /// front requests by route template (or "other") and who answered: "engine" or "app"
    pub front: Vec<(&'static str, &'static str, u64)>,
    /// panics caught, by where: "front", "accept", "call", "follower"
    pub panics: Vec<(&'static str, u64)>,
    /// keys asked of shard servers whose answers have not come yet (a gauge, now)
    pub keys_waiting: u64,
    /// gRPC calls answered on the engine's gRPC port, by method and code name
    pub grpc: Vec<(&'static str, &'static str, u64)>,
    pub grpc_latency: Vec<(&'static str, Histogram)>,
}

#[derive(Default)]
struct Counts {
    requests: HashMap<(&'static str, &'static str, u16), u64>,
    latency: HashMap<&'static str, Histogram>,
    unavailable: HashMap<&'static str, u64>,
    refused: HashMap<&'static str, u64>,
    catchups: HashMap<&'static str, Histogram>,
    front: HashMap<(&'static str, &'static str), u64>,
    panics: HashMap<&'static str, u64>,
    grpc: HashMap<(&'static str, &'static str), u64>,
    grpc_latency: HashMap<&'static str, Histogram>,
}

#[derive(Default)]
pub struct Metrics {
    counts: Mutex<Counts>,
    local_reads: AtomicU64,
    remote_reads: AtomicU64,
    follower_reads: AtomicU64,
    keys_waiting: AtomicU64,
}

/// Keys asked of a shard server, counted waiting until dropped (answered or given up).
pub struct Waiting<'a>(&'a AtomicU64, u64);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(self.1, Ordering::Relaxed);
    }
}

impl Metrics {
    /// One request answered here: its route template, method, status and latency.
    pub fn request(&self, route: &'static str, method: &'static str, status: u16, seconds: f64) {
        let mut c = self.counts.lock();
        *c.requests.entry((route, method, status)).or_default() += 1;
        c.latency.entry(route).or_default().observe(seconds);
    }

    /// One gRPC call answered on the engine's port: its method, code and latency.
    pub fn grpc(&self, method: &'static str, code: &'static str, seconds: f64) {
        let mut c = self.counts.lock();
        *c.grpc.entry((method, code)).or_default() += 1;
        c.grpc_latency.entry(method).or_default().observe(seconds);
    }

    /// A request of the native front, by route and who answered it ("engine" or "app").
    pub fn front(&self, route: &'static str, by: &'static str) {
        *self.counts.lock().front.entry((route, by)).or_default() += 1;
    }

    /// A panic caught at `at`.
    pub fn panicked(&self, at: &'static str) {
        *self.counts.lock().panics.entry(at).or_default() += 1;
    }

    /// An error answer, as what it counts for.
    pub fn failure(&self, f: &crate::errors::Failure) {
        match f.counted() {
            crate::errors::Counted::Nothing => {}
            crate::errors::Counted::Refused(r) => self.refused(r),
            crate::errors::Counted::Unavailable(r) => self.unavailable(r),
        }
    }

    pub fn refused(&self, reason: &'static str) {
        *self.counts.lock().refused.entry(reason).or_default() += 1;
    }

    pub fn unavailable(&self, reason: &'static str) {
        *self.counts.lock().unavailable.entry(reason).or_default() += 1;
    }

    /// One partition caught up (or opened) by `by` ("read", "follower"), taking `took`.
    pub fn catchup(&self, by: &'static str, took: std::time::Duration) {
        self.counts.lock().catchups.entry(by).or_default().observe(took.as_secs_f64());
    }

    pub fn local_reads(&self, n: u64) {
        self.local_reads.fetch_add(n, Ordering::Relaxed);
    }

    pub fn remote_reads(&self, n: u64) {
        self.remote_reads.fetch_add(n, Ordering::Relaxed);
    }

    /// `n` keys asked of a shard server until the guard is dropped.
    pub fn waiting(&self, n: u64) -> Waiting<'_> {
        self.keys_waiting.fetch_add(n, Ordering::Relaxed);
        Waiting(&self.keys_waiting, n)
    }

    pub fn follower_reads(&self, n: u64) {
        self.follower_reads.fetch_add(n, Ordering::Relaxed);
    }

    pub fn take(&self) -> Taken {
        let c = std::mem::take(&mut *self.counts.lock());
        let reads = [
            ("local", self.local_reads.swap(0, Ordering::Relaxed)),
            ("remote", self.remote_reads.swap(0, Ordering::Relaxed)),
            ("follower", self.follower_reads.swap(0, Ordering::Relaxed)),
        ];
        Taken {
            requests: c.requests.into_iter().map(|((r, m, s), n)| (r, m, s, n)).collect(),
            latency: c.latency.into_iter().collect(),
            reads: reads.into_iter().filter(|(_, n)| *n > 0).collect(),
            unavailable: c.unavailable.into_iter().collect(),
            refused: c.refused.into_iter().collect(),
            catchups: c.catchups.into_iter().collect(),
            front: c.front.into_iter().map(|((r, b), n)| (r, b, n)).collect(),
            panics: c.panics.into_iter().collect(),
            keys_waiting: self.keys_waiting.load(Ordering::Relaxed),
            grpc: c.grpc.into_iter().map(|((m, code), n)| (m, code, n)).collect(),
            grpc_latency: c.grpc_latency.into_iter().collect(),
        }
    }
}
