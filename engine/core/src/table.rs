//! What Python's routing table knows, pushed to the engine when it changes
//! (docs/architecture.md §5, the seam): each operator's spec and each partition's owner and
//! followers, and what an unknown job's 404 may say (the storage the router reads, and
//! whether it may name the jobs it serves). An operator the table does not know makes the
//! read ask the control plane to refresh it (`Engine::refresh`) before it answers 404.

use std::collections::HashMap;
use std::sync::Arc;

use crate::local::Operator;

pub struct Entry {
    pub op: Operator,
    /// per partition: the owner's address (None: unassigned)
    pub owners: Vec<Option<Arc<str>>>,
    /// per partition: its followers' addresses
    pub followers: Vec<Vec<Arc<str>>>,
    /// per partition: its owner as the cluster map names it (None: not named; empty: none
    /// given), which an answer says (`qstate-owner`) so a client with a stale map learns it
    pub named: Vec<Option<Named>>,
}

/// A partition's owner as clients know it (docs/architecture.md §5, cluster map): its server
/// id, and a router on its node that reads it in-process (None: no router registered there).
#[derive(Clone, Debug, PartialEq)]
pub struct Named {
    pub id: Arc<str>,
    pub url: Option<Arc<str>>,
}

impl Entry {
    pub fn named(&self, partition: u32) -> Option<&Named> {
        self.named.get(partition as usize)?.as_ref()
    }

    pub fn owner(&self, partition: u32) -> Option<Arc<str>> {
        self.owners.get(partition as usize).cloned().flatten()
    }

    pub fn followers(&self, partition: u32) -> &[Arc<str>] {
        self.followers.get(partition as usize).map_or(&[], Vec::as_slice)
    }
}

#[derive(Default)]
pub struct Table {
    jobs: HashMap<String, HashMap<String, Arc<Entry>>>,
    /// the checkpoint storage the router reads (named in an unknown job's 404)
    pub storage: String,
    /// whether an unknown job's 404 may name the jobs served (not where client tokens scope
    /// what a caller may see)
    pub disclose_jobs: bool,
    /// a shard server's address -> its reader's, for those that have one (their live reads
    /// are asked there, natively: `reader`; a savepoint still of the server's own port)
    pub readers: HashMap<String, String>,
}

impl Table {
    pub fn new(storage: String, disclose_jobs: bool) -> Table {
        Table { jobs: HashMap::new(), storage, disclose_jobs, readers: HashMap::new() }
    }

    pub fn insert(&mut self, entry: Entry) {
        let (job, operator) = (entry.op.spec.job.clone(), entry.op.spec.operator.clone());
        self.jobs.entry(job).or_default().insert(operator, Arc::new(entry));
    }

    pub fn get(&self, job: &str, operator: &str) -> Option<&Arc<Entry>> {
        self.jobs.get(job)?.get(operator)
    }

    pub fn has_job(&self, job: &str) -> bool {
        self.jobs.contains_key(job)
    }

    /// The jobs served, sorted.
    pub fn job_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.jobs.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// Where a live read of `address`'s partitions is asked: its reader, else its own port.
    pub fn read_address<'a>(&'a self, address: &'a str) -> &'a str {
        self.readers.get(address).map_or(address, String::as_str)
    }

    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }
}
