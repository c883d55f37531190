//! The engine a router process holds: the partitions it reads in-process (`local`), what
//! Python's routing table pushed (`table`), the client tokens (`book`), the settings the
//! router runs with, the owners' shards (`remote`), its own runtime, and the counts Python
//! exports. Every front reads through it (`read`, docs/architecture.md §5).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::auth::Book;
use crate::local::Local;
use crate::metrics::Metrics;
use crate::remote::{Callers, Remote};
use crate::settings::Settings;
use crate::table::Table;

/// Asks the control plane (Python's routing table) to read the assignment and specs again:
/// `true` forces it past its least interval. It answers by `Engine::refreshed`.
pub type Refresher = Box<dyn Fn(bool) + Send + Sync>;

pub struct Engine {
    pub local: Local,
    pub table: ArcSwap<Table>,
    pub book: ArcSwapOption<Book>,
    pub settings: ArcSwap<Settings>,
    pub metrics: Metrics,
    /// the owners of partitions elsewhere, over gRPC (None until Python says how to call them)
    pub remote: ArcSwapOption<Remote>,
    /// where the engine's own work runs: calls to shards, reads Python awaits
    pub runtime: std::mem::ManuallyDrop<tokio::runtime::Runtime>,
    refresher: ArcSwapOption<Refresher>,
    /// bumped by every refresh the control plane finishes
    refreshes: watch::Sender<u64>,
    /// a refresh asked and not yet done (whether it was forced)
    asked: Mutex<Option<bool>>,
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
    pub fn new(scratch: PathBuf, cache_bytes: usize, settings: Settings) -> std::io::Result<Engine> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("qstate-engine")
            .enable_all()
            .build()?;
        Ok(Engine {
            local: Local::new(scratch, cache_bytes),
            table: ArcSwap::from_pointee(Table::default()),
            book: ArcSwapOption::empty(),
            settings: ArcSwap::from_pointee(settings),
            metrics: Metrics::default(),
            remote: ArcSwapOption::empty(),
            runtime: std::mem::ManuallyDrop::new(runtime),
            refresher: ArcSwapOption::empty(),
            refreshes: watch::channel(0).0,
            asked: Mutex::new(None),
            follower: Mutex::new(None),
        })
    }

    /// How to call shard servers (Python's callers: the cluster token, TLS, the bounds).
    pub fn set_callers(&self, callers: Callers) {
        self.remote.store(Some(Remote::new(callers, self.runtime.handle().clone())));
    }

    pub fn set_refresher(&self, r: Refresher) {
        self.refresher.store(Some(Arc::new(r)));
    }

    /// The control plane finished a refresh asked for (its table, changed or not, pushed).
    pub fn refreshed(&self) {
        *self.asked.lock() = None;
        self.refreshes.send_modify(|n| *n += 1);
    }

    /// Ask the control plane to read the routing table again and wait for it to answer (at
    /// most the shard timeout): what a read does when its operator is unknown, a partition has
    /// no owner, or an owner says it moved. Nothing to ask: returns at once.
    pub async fn refresh(&self, force: bool) {
        let Some(r) = self.refresher.load_full() else { return };
        let mut rx = self.refreshes.subscribe();
        let seen = *rx.borrow_and_update();
        let ask = {
            let mut asked = self.asked.lock();
            // one refresh at a time: a forced one is asked beside one that was not
            let ask = asked.is_none_or(|forced| force && !forced);
            if ask {
                *asked = Some(force);
            }
            ask
        };
        if ask {
            r(force); // not under the lock: the control plane may answer before it returns
        }
        let wait = self.settings.load().shard_timeout;
        let _ = tokio::time::timeout(wait, rx.wait_for(|n| *n > seen)).await;
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
            // a panic in a pass (a planted one, a bug) loses that pass, not the follower
            let pass = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| engine.local.keep_up(FOLLOW_IDLE)));
            match pass {
                Ok(took) => {
                    for d in took {
                        engine.metrics.catchup("follower", d);
                    }
                }
                Err(_) => engine.metrics.panicked("follower"),
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
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop_follower();
        // SAFETY: taken once, here; nothing uses the runtime after the engine is dropped.
        // Shut down without waiting: the last reference may go on one of its own threads.
        unsafe { std::mem::ManuallyDrop::take(&mut self.runtime) }.shutdown_background();
    }
}

pub type Shared = Arc<Engine>;
