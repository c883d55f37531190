//! The read core: every point, batch and several-states read of the router, whichever front
//! asked (the native HTTP front, the FastAPI routes, gRPC `Get`/`MultiGet`, the watch hub),
//! is checked, read and answered here, once (docs/architecture.md §5, one read core):
//!
//! - `ask`: what a front asks (`Ask`) checked under the router's bounds into reads (`Read`,
//!   one per state) of an operator the routing table knows, or the 400/404 that says why not;
//! - `fetch`: each key's hit from its partition, on this host (`local`) or from its owner's
//!   shard server (`remote`), following a move once, from a follower when the owner cannot
//!   answer, or the 503 naming the partition;
//! - `wait`: read again until every key has `min_batch`, and a key's several states at one
//!   batch.
//!
//! The faces (`http`, `grpc`) make an `Ask` of their protocol's request and write the
//! `Outcome` (or the `Failure`) in their protocol's bytes.

pub mod ask;
pub mod fetch;
#[cfg(test)]
mod tests;
pub mod wait;

use std::sync::Arc;

use crate::address::partition_of;
use crate::engine::Engine;
use crate::errors::Failure;
use crate::partition::read::Window;
use crate::table::{Entry, Named};

pub use ask::{Ask, Read};

/// The headers (and gRPC trailing metadata) that name a read's owner (`Outcome::owner`).
pub const OWNER: &str = "qstate-owner";
pub const OWNER_URL: &str = "qstate-owner-url";

/// One key's answer in one state, as of one batch.
#[derive(Clone, Debug, PartialEq)]
pub struct Hit {
    pub found: bool,
    pub batch: i64,
    pub watermark_ms: i64,
    pub windows: Vec<Window>,
    /// a range cut at its limit: where the next page starts
    pub next_from: Option<i64>,
}

/// What a read answered: the operator, the states asked (their indices, in order), the keys,
/// and per state each key's hit (a key's states at one batch).
pub struct Outcome {
    pub entry: Arc<Entry>,
    pub states: Vec<usize>,
    pub keys: Arc<Vec<String>>,
    pub hits: Vec<Vec<Hit>>,
}

impl Outcome {
    pub fn state_name(&self, i: usize) -> &str {
        self.entry.op.spec.states.get_index(self.states[i]).expect("a state of the spec").0
    }

    /// The owner of every key read, as the cluster map names it (None: keys of several
    /// owners, or one not named): the answer says it (`qstate-owner`), so a client whose map
    /// is stale learns where to ask (docs/architecture.md §5, cluster map).
    pub fn owner(&self) -> Option<&Named> {
        let parts = self.entry.op.spec.partitions;
        let mut named = self.keys.iter().map(|k| self.entry.named(partition_of(k, parts)));
        let first = named.next()??;
        named.all(|n| n.is_some_and(|n| n.id == first.id)).then_some(first)
    }

    /// `owner` as an answer's headers (HTTP) or trailing metadata (gRPC): `qstate-owner` (its
    /// server id) and `qstate-owner-url` (a router on its node); none when `owner` is None.
    pub fn owner_headers(&self) -> Vec<(&'static str, String)> {
        let Some(n) = self.owner() else { return Vec::new() };
        let mut h = vec![(OWNER, n.id.to_string())];
        if let Some(url) = &n.url {
            h.push((OWNER_URL, url.to_string()));
        }
        h
    }

    /// Key by key, each key's states in the order asked: (state, key, hit).
    pub fn by_key(&self) -> impl ExactSizeIterator<Item = (&str, &str, &Hit)> {
        let n = self.states.len();
        (0..self.keys.len() * n).map(move |a| {
            let (k, s) = (a / n, a % n);
            (self.state_name(s), self.keys[k].as_str(), &self.hits[s][k])
        })
    }
}

/// How far a read got without waiting (`answer_now`).
pub enum Now {
    Done(Result<Outcome, Failure>),
    /// it must wait (a refresh, a shard, a catch-up, `min_batch`): `finish` goes on from here
    Later(Later),
}

/// A read that must wait, with what it has done so far (nothing is done twice).
pub struct Later {
    ask: Ask,
    reads: Option<Vec<Read>>,
    hits: Option<Vec<Vec<Hit>>>,
}

/// The whole read: checks, keys, `min_batch`, a key's states at one batch.
pub async fn answer(engine: &Arc<Engine>, ask: Ask) -> Result<Outcome, Failure> {
    match answer_now(engine, ask) {
        Now::Done(r) => r,
        Now::Later(l) => finish(engine, l).await,
    }
}

/// As much of `answer` as needs no wait, on the calling thread: the whole answer when every
/// partition is on this host and current, the operator known and no `min_batch` to wait for.
pub fn answer_now(engine: &Arc<Engine>, ask: Ask) -> Now {
    let reads = match ask::check_now(engine, &ask) {
        None => return Now::Later(Later { ask, reads: None, hits: None }),
        Some(Err(f)) => return Now::Done(Err(f)),
        Some(Ok(r)) => r,
    };
    let hits = match fetch::now(engine, &reads) {
        Ok(Some(h)) => h,
        Ok(None) => return Now::Later(Later { ask, reads: Some(reads), hits: None }),
        Err(f) => return Now::Done(Err(f)),
    };
    match wait::settled(&reads, hits) {
        Ok(outcome) => Now::Done(Ok(outcome)),
        Err(hits) => Now::Later(Later { ask, reads: Some(reads), hits: Some(hits) }),
    }
}

/// The rest of a read `answer_now` could not finish.
pub async fn finish(engine: &Arc<Engine>, later: Later) -> Result<Outcome, Failure> {
    let reads = match later.reads {
        Some(r) => r,
        None => ask::check(engine, &later.ask).await?,
    };
    let hits = match later.hits {
        Some(h) => h,
        None => fetch::all(engine, &reads).await?,
    };
    wait::settle(engine, &reads, hits).await
}
