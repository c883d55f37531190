//! The engine a router process holds: the partitions it reads in-process (`local`), what
//! Python's routing table pushed (`table`), the client tokens (`book`), the settings the
//! router runs with, and the counts Python exports. Both the native front and Python's own
//! reads (`qstate.router.reads`) read through it (docs/architecture.md §5).

use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::{ArcSwap, ArcSwapOption};

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
}

impl Engine {
    pub fn new(scratch: PathBuf, cache_bytes: usize) -> Engine {
        Engine {
            local: Local::new(scratch, cache_bytes),
            table: ArcSwap::from_pointee(Table::default()),
            book: ArcSwapOption::empty(),
            settings: ArcSwap::from_pointee(Settings::default()),
            metrics: Metrics::default(),
            remote: ArcSwapOption::empty(),
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
        let inst = self.local.instance(owner, &pid)?;
        self.local.read(owner, &pid, &inst, &entry.op, state, keys, range, limit)
    }
}

pub type Shared = Arc<Engine>;
