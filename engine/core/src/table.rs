//! What Python's routing table knows, pushed to the engine when it changes
//! (docs/architecture.md §5, the seam): each operator's spec and each partition's owner.
//! An operator the table does not know is asked of Python (which refreshes from storage).

use std::collections::HashMap;
use std::sync::Arc;

use crate::local::Operator;

pub struct Entry {
    pub op: Operator,
    /// per partition: the owner's address (None: unassigned)
    pub owners: Vec<Option<Arc<str>>>,
    /// per partition: its followers' addresses
    pub followers: Vec<Vec<Arc<str>>>,
}

#[derive(Default)]
pub struct Table {
    jobs: HashMap<String, HashMap<String, Arc<Entry>>>,
}

impl Table {
    pub fn insert(&mut self, entry: Entry) {
        let (job, operator) = (entry.op.spec.job.clone(), entry.op.spec.operator.clone());
        self.jobs.entry(job).or_default().insert(operator, Arc::new(entry));
    }

    pub fn get(&self, job: &str, operator: &str) -> Option<&Arc<Entry>> {
        self.jobs.get(job)?.get(operator)
    }

    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }
}
