//! The engine a router process holds: the partitions it reads in-process (`local`), what
//! Python's routing table pushed (`table`), the client tokens (`book`), the settings the
//! router runs with, and the counts Python exports. Both the native front and Python's own
//! reads (`qstate.router.reads`) read through it (docs/architecture.md §5).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};
use parking_lot::Mutex;

use crate::address::PartitionId;
use crate::local::{Hit, Local, Miss};
use crate::metrics::Metrics;
use crate::remote::Remote;
use crate::table::{Entry, Table};
use crate::tokens::Book;

/// The bounds a router answers under (`qstate.core.config.Settings`, pushed once).
#[derive(Clone, Debug)]
pub struct Settings {
    pub max_batch_keys: usize,
    pub max_windows: usize,
    pub max_request_windows: usize,
    pub min_batch_wait_s: f64,
    pub retry_after_s: f64,
    pub max_body_bytes: usize,
    pub max_concurrent: usize,
    pub metrics_public: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_batch_keys: 1000,
            max_windows: 1000,
            max_request_windows: 100_000,
            min_batch_wait_s: 5.0,
            retry_after_s: 1.0,
            max_body_bytes: 1 << 20,
            max_concurrent: 256,
            metrics_public: true,
        }
    }
}

pub struct Engine {
    pub local: Local,
    pub table: ArcSwap<Table>,
    pub book: ArcSwapOption<Book>,
    pub settings: ArcSwap<Settings>,
    pub metrics: Metrics,
    /// the owners of partitions elsewhere, over gRPC (None: every such read is Python's)
    pub remote: ArcSwapOption<Remote>,
    follower: Mutex<Option<Follower>>,
}

/// The thread that keeps partitions read lately caught up (`Local::keep_up`).
struct Follower {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

/// A partition not read for this long is no longer kept up: its next read catches it up.
pub const FOLLOW_IDLE: Duration = Duration::from_secs(10);

impl Engine {
    pub fn new(scratch: PathBuf, cache_bytes: usize) -> Engine {
        Engine {
            local: Local::new(scratch, cache_bytes),
            table: ArcSwap::from_pointee(Table::default()),
            book: ArcSwapOption::empty(),
            settings: ArcSwap::from_pointee(Settings::default()),
            metrics: Metrics::default(),
            remote: ArcSwapOption::empty(),
            follower: Mutex::new(None),
        }
    }

    /// Every `every`, catch up the partitions read within `FOLLOW_IDLE` whose shard
    /// committed (docs/architecture.md §5): a read then rarely waits for a catch-up. The
    /// thread holds the engine only during a pass; it ends at `stop_follower` or when the
    /// engine is dropped.
    pub fn start_follower(self: &Arc<Self>, every: Duration) -> std::io::Result<()> {
        let mut slot = self.follower.lock();
        if slot.is_some() {
            return Ok(());
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (weak, flag) = (Arc::downgrade(self), stop.clone());
        let thread = std::thread::Builder::new().name("qstate-follow".into()).spawn(move || loop {
            std::thread::park_timeout(every);
            if flag.load(Ordering::Acquire) {
                break;
            }
            let Some(engine) = weak.upgrade() else { break };
            for took in engine.local.keep_up(FOLLOW_IDLE) {
                engine.metrics.catchup("follower", took);
            }
        })?;
        *slot = Some(Follower { stop, thread });
        Ok(())
    }

    /// End the follower (after its pass under way), before the partitions close.
    pub fn stop_follower(&self) {
        let follower = self.follower.lock().take();
        if let Some(f) = follower {
            f.stop.store(true, Ordering::Release);
            f.thread.thread().unpark();
            let _ = f.thread.join();
        }
    }

    /// Keys of one partition of `entry`'s operator from its owner's files on this host, as
    /// of one batch (the one its marker names when the read began, or a later one), paged at
    /// `limit`; blocking (a catch-up may run, or be waited for). Not counted in `metrics`:
    /// whoever answers counts the keys it answered (the front and `grpc` what they send,
    /// Python what it reads through `LocalReader`), since a request handed over after a read
    /// is read again there, and the engine's counts join Python's series (`add_engine_counts`).
    // the arguments: the partition, then the read as Python's `read_local` passes it through
    #[allow(clippy::too_many_arguments)]
    pub fn read_local(
        &self,
        owner: &str,
        entry: &Entry,
        partition: u32,
        state: usize,
        keys: &[&str],
        range: Option<(i64, i64)>,
        limit: usize,
    ) -> Result<Vec<Hit>, Miss> {
        let pid = PartitionId { job: entry.op.spec.job.clone(), operator: entry.op.spec.operator.clone(), partition };
        let (inst, took) = self.local.instance(owner, &pid)?;
        if let Some(d) = took {
            self.metrics.catchup("read", d);
        }
        self.local.read(owner, &pid, &inst, &entry.op, state, keys, range, limit)
    }
}

pub type Shared = Arc<Engine>;
