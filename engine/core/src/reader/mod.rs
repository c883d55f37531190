//! The owner's reader (docs/architecture.md §5, cluster reads): the shard server's partitions
//! answered to other hosts' routers natively, on the engine's threads, in the shard's own
//! `MultiGet` form (proto/shard.proto), so a router's call is the same whoever answers it.
//! The shard's process holds it: it knows at once what it holds, what is restoring and what
//! moved away, and pushes that here (`set_ready`, `set_restoring`); the reads themselves are
//! the engine's, from RocksDB secondaries of the shard's own primaries (`local`), as a
//! co-located router reads them, without the GIL.
//!
//! A partition the shard does not hold (or held and dropped: its marker is gone) answers
//! NOT_OWNED, one being restored RESTORING, exactly as the shard's Python `MultiGet`, which
//! stays behind the shard's own port for savepoint reads only (their files are built from
//! storage by Python's `qstate.shard.savepoints`).
//!
//! - `serve`: the gRPC server (tonic) on the reader's port, the cluster token, TLS.

pub mod serve;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use parking_lot::Mutex;

use crate::address::{check_key, partition_of, PartitionId};
use crate::engine::Engine;
use crate::errors::Failure;
use crate::local::Miss;
use crate::metrics::Histogram;
use crate::partition::codec::Value;
use crate::read::fetch::here_keys;
use crate::read::Hit;
use crate::shardpb::{window, KeyResult, KeyStatus, LookupReply, LookupRequest, Window};

/// Keys one call may ask (the shard's `MAX_KEYS`, `qstate.shard.server`).
pub const MAX_KEYS: usize = 10_000;

/// The bounds (seconds) of a MultiGet call's latency on a shard server, whoever answers it:
/// the reader's `qstate_shard_reader_seconds` and the shard's Python
/// `qstate_shard_lookup_seconds` (`qstate._engine.LOOKUP_BUCKETS`), so that one dashboard
/// panel sums them (deploy/grafana/generate.py).
pub const BUCKETS: [f64; 8] = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05];

/// A call's latency, counted since the reader started (the last bucket +Inf).
pub type Latency = Histogram<{ BUCKETS.len() + 1 }>;

/// What the host's shard holds, as the reader answers it.
pub struct Reader {
    /// the shard's address: the name `Local` knows its partitions under
    pub owner: Arc<str>,
    restoring: ArcSwap<HashSet<PartitionId>>,
    /// keys answered, by status (FOUND, ABSENT, NOT_OWNED, RESTORING)
    counts: [AtomicU64; 4],
    /// calls answered (a refusal included)
    calls: AtomicU64,
    /// calls a panic ended (answered INTERNAL)
    pub panics: AtomicU64,
    latency: Mutex<Latency>,
}

impl Reader {
    pub fn new(owner: &str) -> Reader {
        Reader {
            owner: Arc::from(owner),
            restoring: ArcSwap::from_pointee(HashSet::new()),
            counts: Default::default(),
            calls: AtomicU64::new(0),
            panics: AtomicU64::new(0),
            latency: Mutex::new(Latency::default()),
        }
    }

    /// The partitions the shard holds and is restoring (or opening): RESTORING until ready.
    pub fn set_restoring(&self, restoring: HashSet<PartitionId>) {
        self.restoring.store(Arc::new(restoring));
    }

    /// Keys answered so far, by status name, the calls, the panics caught and the calls'
    /// latency (counters: read at each scrape).
    pub fn counts(&self) -> (Vec<(&'static str, u64)>, u64, u64, Latency) {
        let keys = ["FOUND", "ABSENT", "NOT_OWNED", "RESTORING"]
            .into_iter()
            .zip(&self.counts)
            .map(|(name, c)| (name, c.load(Ordering::Relaxed)))
            .collect();
        let latency = self.latency.lock().clone();
        (keys, self.calls.load(Ordering::Relaxed), self.panics.load(Ordering::Relaxed), latency)
    }

    fn count(&self, status: KeyStatus, n: usize) {
        let i = match status {
            KeyStatus::Found => 0,
            KeyStatus::Absent => 1,
            KeyStatus::NotOwned => 2,
            _ => 3,
        };
        self.counts[i].fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// A `MultiGet` answered from this host's partitions, or the refusal the shard's Python would
/// give (its class in the trailers); its time counted, a refusal's too.
pub async fn multi_get(engine: &Arc<Engine>, reader: &Reader, req: LookupRequest) -> Result<LookupReply, Failure> {
    reader.calls.fetch_add(1, Ordering::Relaxed);
    let began = Instant::now();
    let answer = answer(engine, reader, req).await;
    reader.latency.lock().observe_on(&BUCKETS, began.elapsed().as_secs_f64());
    answer
}

async fn answer(engine: &Arc<Engine>, reader: &Reader, req: LookupRequest) -> Result<LookupReply, Failure> {
    if !req.savepoint.is_empty() {
        return Err(Failure::invalid(
            "a savepoint is read by the shard server's own port, not by its reader (docs/architecture.md §5)",
        ));
    }
    if req.keys.len() > MAX_KEYS {
        return Err(Failure::invalid(format!("at most {MAX_KEYS} keys per call")));
    }
    let mut results: Vec<KeyResult> =
        req.keys.iter().map(|kq| KeyResult { key: kq.key.clone(), ..KeyResult::default() }).collect();
    let table = engine.table.load();
    let Some(entry) = table.get(&req.job, &req.operator).cloned() else {
        // an operator none of whose partitions this shard holds
        reader.count(KeyStatus::NotOwned, results.len());
        for r in &mut results {
            r.status = KeyStatus::NotOwned as i32;
        }
        return Ok(LookupReply { results });
    };
    drop(table);
    let spec = &entry.op.spec;
    let Some(state) = spec.states.get_index_of(&req.state) else {
        return Err(Failure::remote(
            "UnknownOperator",
            format!("operator {}/{} has no state {:?}", spec.job, spec.operator, req.state),
            None,
        ));
    };
    let count = routed_by(spec.partitions, req.partitions)?;
    for kq in &req.keys {
        check_key(&kq.key)?;
        if kq.partition >= count || partition_of(&kq.key, count) != kq.partition {
            let shown: String = kq.key.chars().take(80).collect();
            return Err(Failure::invalid(format!("key {shown:?} is not in partition {}", kq.partition)));
        }
    }
    if req.range && req.to_ms <= req.from_ms {
        return Err(Failure::invalid("to_ms must be greater than from_ms"));
    }
    let cfg = engine.settings.load();
    let limit = if req.limit == 0 { cfg.max_windows } else { (req.limit as usize).min(cfg.max_windows) };
    let range = req.range.then_some((req.from_ms, req.to_ms));
    let mut groups: Vec<(u32, Vec<usize>)> = Vec::new();
    for (i, kq) in req.keys.iter().enumerate() {
        match groups.iter_mut().find(|(p, _)| *p == kq.partition) {
            Some((_, idx)) => idx.push(i),
            None => groups.push((kq.partition, vec![i])),
        }
    }
    let restoring = reader.restoring.load();
    for (p, idx) in groups {
        let id = PartitionId { job: spec.job.clone(), operator: spec.operator.clone(), partition: p };
        let keys: Vec<&str> = idx.iter().map(|&i| req.keys[i].key.as_str()).collect();
        let status = if restoring.contains(&id) {
            Err(KeyStatus::Restoring)
        } else {
            match here_keys(engine, &reader.owner, &id, &entry.op, state, &keys, range, limit).await {
                Ok(hits) => Ok(hits),
                Err(Miss::NotHere) => Err(KeyStatus::NotOwned), // not held, or dropped under the read
                Err(Miss::Failed(m)) => {
                    return Err(Failure::unavailable(
                        format!("partition {id} failed to read here ({m}); ask again"),
                        cfg.retry_after_s,
                        "shard-down",
                        Some(p),
                        None,
                    ))
                }
                Err(Miss::Corrupt(m)) => {
                    return Err(Failure::corrupt(format!(
                        "partition {id}: {m}; its shard restores it from its snapshot and deltas"
                    )))
                }
            }
        };
        match status {
            Ok(hits) => {
                for (&i, h) in idx.iter().zip(hits) {
                    let s = if h.found { KeyStatus::Found } else { KeyStatus::Absent };
                    reader.count(s, 1);
                    result(&mut results[i], s, h);
                }
            }
            Err(s) => {
                reader.count(s, idx.len());
                for &i in &idx {
                    results[i].status = s as i32;
                }
            }
        }
    }
    Ok(LookupReply { results })
}

/// The partition count a call's keys are checked by: the caller's, when it and the shard's
/// spec are multiples of each other. An offline rescale (`qstate.control.rescale`) has the new
/// partitions held and ready before the spec says so, and the shard re-reads its spec only at
/// the job's next epoch: a router that routes by the new count meanwhile asks for partitions
/// past the shard's (they are held, and answer), and one that has not refreshed asks for the
/// old ones (which still hold their keys). Any other count is a caller's mistake.
fn routed_by(ours: u32, callers: u32) -> Result<u32, Failure> {
    if callers == 0 || callers == ours {
        return Ok(ours);
    }
    if callers.is_multiple_of(ours) || ours.is_multiple_of(callers) {
        return Ok(callers);
    }
    Err(Failure::invalid(format!(
        "the caller routes by {callers} partitions and this shard by {ours}: neither is a multiple of the other"
    )))
}

/// A hit in the shard's form (the inverse of `read::fetch`'s reading of it).
fn result(r: &mut KeyResult, status: KeyStatus, h: Hit) {
    r.status = status as i32;
    r.batch = h.batch;
    r.watermark_ms = h.watermark_ms;
    r.next_from_ms = h.next_from;
    r.windows = h
        .windows
        .into_iter()
        .map(|w| Window {
            windowed: w.start.is_some(),
            start_ms: w.start.unwrap_or(0),
            end_ms: w.end.unwrap_or(0),
            value: match w.value {
                Value::Long(v) => Some(window::Value::IntValue(v)),
                Value::Double(v) => Some(window::Value::DoubleValue(v)),
                Value::Null => None,
            },
        })
        .collect();
}

#[cfg(test)]
mod tests {
    use super::routed_by;

    #[test]
    fn a_call_is_checked_by_the_callers_count_only_across_a_rescale() {
        assert_eq!(routed_by(4, 0).unwrap(), 4); // an older router: the shard's own
        assert_eq!(routed_by(4, 4).unwrap(), 4);
        assert_eq!(routed_by(4, 8).unwrap(), 8); // the spec doubled, not yet re-read here
        assert_eq!(routed_by(8, 4).unwrap(), 4); // a router that has not refreshed
        assert!(routed_by(4, 6).is_err());
    }
}
