//! Each key's hit, from its partition (docs/architecture.md §5): on this host, from the
//! owner's files (a RocksDB secondary: `local`), while the owner reports it ready and lives;
//! else from the owner's shard server (`remote`, coalesced), following a move once; when the
//! owner cannot answer (down, restoring, moving, none yet) and the caller allows staleness,
//! from a follower that serves it, as of its own batch; else the 503 that names the partition
//! and why. A savepoint is always read by a shard server (its files are not the live ones).

use std::sync::Arc;

use futures::future::join_all;

use crate::address::{partition_of, PartitionId};
use crate::engine::Engine;
use crate::errors::{seconds, Failure};
use crate::local::{Miss, Operator};
use crate::partition::codec::Value;
use crate::partition::read::Window;
use crate::read::{Hit, Read};
use crate::remote::{Ask as RemoteAsk, CallFailed};
use crate::shardpb::{window, KeyQuery, KeyResult, KeyStatus};
use crate::table::Table;

/// The keys `which` (indices into `keys`) by partition, partitions in the order their first
/// key comes.
pub fn by_partition(
    keys: &[String],
    partitions: u32,
    which: impl IntoIterator<Item = usize>,
) -> Vec<(u32, Vec<usize>)> {
    let mut groups: Vec<(u32, Vec<usize>)> = Vec::new();
    for i in which {
        let p = partition_of(&keys[i], partitions);
        match groups.iter_mut().find(|(q, _)| *q == p) {
            Some((_, idx)) => idx.push(i),
            None => groups.push((p, vec![i])),
        }
    }
    groups
}

fn pid(r: &Read, partition: u32) -> PartitionId {
    let spec = &r.entry.op.spec;
    PartitionId { job: spec.job.clone(), operator: spec.operator.clone(), partition }
}

/// Every state's hits when each key's partition is read here and current (no catch-up, no
/// shard): per state, then per key. Ok(None): some partition is not (nothing was read).
pub fn now(engine: &Engine, reads: &[Read]) -> Result<Option<Vec<Vec<Hit>>>, Failure> {
    let Some(first) = reads.first() else { return Ok(Some(Vec::new())) };
    if !first.local || first.savepoint.is_some() {
        return Ok(None);
    }
    let spec = &first.entry.op.spec;
    let local = &engine.local;
    // every partition's instance first: a read is made only when all of them are current
    let mut here = Vec::new();
    for (p, idx) in by_partition(&first.keys, spec.partitions, 0..first.keys.len()) {
        let Some(owner) = first.entry.owner(p) else { return Ok(None) };
        let id = pid(first, p);
        let Some(part) = local.lookup(&owner, &id) else { return Ok(None) };
        let Ok(Some(inst)) = local.current(&owner, &id, &part) else { return Ok(None) };
        here.push((owner, id, inst, idx));
    }
    let mut hits: Vec<Vec<Option<Hit>>> = vec![vec![None; first.keys.len()]; reads.len()];
    let states: Vec<usize> = reads.iter().map(|r| r.state).collect();
    let cfg = engine.settings.load();
    for (owner, id, inst, idx) in here {
        cfg.read_fault(&spec.operator, inst.meta.last_batch);
        let ks: Vec<&str> = idx.iter().map(|&i| first.keys[i].as_str()).collect();
        let got = match local.read_states(&owner, &id, &inst, &first.entry.op, &states, &ks, first.range, first.limit) {
            Ok(g) => g,
            Err(Miss::NotHere | Miss::Failed(_)) => return Ok(None), // its files moved: the owner answers
            Err(Miss::Corrupt(m)) => return Err(corrupt(&id, &m)),
        };
        engine.metrics.local_reads((ks.len() * reads.len()) as u64);
        for (per_state, found) in hits.iter_mut().zip(got) {
            for (&i, h) in idx.iter().zip(found) {
                per_state[i] = Some(h);
            }
        }
    }
    Ok(Some(hits.into_iter().map(|hs| hs.into_iter().map(|h| h.expect("every key read")).collect()).collect()))
}

/// Every state's hits, however each partition must be read (per state, then per key).
pub async fn all(engine: &Arc<Engine>, reads: &[Read]) -> Result<Vec<Vec<Hit>>, Failure> {
    let mut out = Vec::with_capacity(reads.len());
    for r in reads {
        out.push(keys(engine, r, &(0..r.keys.len()).collect::<Vec<_>>()).await?);
    }
    Ok(out)
}

/// The hits of keys `which` of one state's read, in that order: each partition read at once
/// (on this host, or asked of its owner), the first failure in key order answered.
pub async fn keys(engine: &Arc<Engine>, r: &Read, which: &[usize]) -> Result<Vec<Hit>, Failure> {
    let groups = by_partition(&r.keys, r.entry.op.spec.partitions, which.iter().copied());
    fits(engine, r, &groups)?;
    let got = join_all(groups.iter().map(|(p, idx)| partition(engine, r, *p, idx))).await;
    let mut hits: Vec<Option<Hit>> = vec![None; r.keys.len()];
    for ((_, idx), g) in groups.iter().zip(got) {
        for (&i, h) in idx.iter().zip(g?) {
            hits[i] = Some(h);
        }
    }
    Ok(which.iter().map(|&i| hits[i].take().expect("every key read")).collect())
}

/// A read's keys for each shard server it must ask fit that server's queue together
/// (QSTATE_MAX_SHARD_QUEUE): else the whole read is refused at once, 429, with nothing queued
/// (docs/architecture.md §5), rather than some partitions queued and the rest refused.
fn fits(engine: &Engine, r: &Read, groups: &[(u32, Vec<usize>)]) -> Result<(), Failure> {
    let Some(remote) = engine.remote.load_full() else { return Ok(()) };
    let table = engine.table.load();
    let mut per: Vec<(Arc<str>, usize)> = Vec::new();
    for (p, idx) in groups {
        let Some(owner) = r.entry.owner(*p) else { continue };
        if r.local && r.savepoint.is_none() && engine.local.is_here(&owner, &pid(r, *p)) {
            continue;
        }
        let to = asked_at(&table, r, &owner);
        match per.iter_mut().find(|(a, _)| &**a == to) {
            Some((_, n)) => *n += idx.len(),
            None => per.push((to.into(), idx.len())),
        }
    }
    for (address, n) in per {
        if let Err(waiting) = remote.fits(&address, n) {
            return Err(queue_full(engine, waiting, &address));
        }
    }
    Ok(())
}

/// Where the server `address` is asked for `r`'s keys: a live read at the server's reader
/// when it has one, a savepoint at its own port.
fn asked_at<'a>(table: &'a Table, r: &Read, address: &'a str) -> &'a str {
    if r.savepoint.is_none() {
        table.read_address(address)
    } else {
        address
    }
}

fn queue_full(engine: &Engine, waiting: usize, address: &str) -> Failure {
    let s = engine.settings.load().retry_after_s;
    Failure::overloaded(
        format!(
            "{waiting} keys already wait for shard {address} (QSTATE_MAX_SHARD_QUEUE); retry after {} s",
            seconds(s)
        ),
        s,
    )
}

/// Keys `idx` of partition `p`: from the files here when the owner is on this host, else (or
/// when they fail) from a shard server.
async fn partition(engine: &Arc<Engine>, r: &Read, p: u32, idx: &[usize]) -> Result<Vec<Hit>, Failure> {
    let id = pid(r, p);
    if r.local && r.savepoint.is_none() {
        if let Some(owner) = r.entry.owner(p) {
            if engine.local.is_here(&owner, &id) {
                match here(engine, r, &owner, &id, idx).await {
                    Ok(hits) => return Ok(hits),
                    Err(Miss::Corrupt(m)) => return Err(corrupt(&id, &m)),
                    Err(Miss::NotHere | Miss::Failed(_)) => {} // the owner answers
                }
            }
        }
    }
    match from_owner(engine, r, &id, idx).await {
        Err(f) if f.class == "Unavailable" && r.allow_stale => {
            from_follower(engine, r, &id, idx).await.unwrap_or(Err(f))
        }
        Err(f) if f.class == "Unavailable" && !followers(engine, r, &id).is_empty() => Err(with_stale_hint(f)),
        got => got,
    }
}

/// The owner's 503 when a follower holds a copy the caller did not allow: it says how to read
/// that copy (docs/querying.md, "When the owner cannot answer").
pub fn with_stale_hint(mut f: Failure) -> Failure {
    f.message
        .push_str("; a follower holds a copy of it: ask with allow_stale=true to read that copy, as of its own batch");
    f
}

/// The addresses of partition `id`'s followers in the routing table now.
fn followers(engine: &Engine, r: &Read, id: &PartitionId) -> Vec<Arc<str>> {
    let spec = &r.entry.op.spec;
    engine.table.load().get(&spec.job, &spec.operator).map(|e| e.followers(id.partition).to_vec()).unwrap_or_default()
}

/// Keys of a partition on this host (`here_keys`), as the read `r` asks them.
async fn here(
    engine: &Arc<Engine>,
    r: &Read,
    owner: &Arc<str>,
    id: &PartitionId,
    idx: &[usize],
) -> Result<Vec<Hit>, Miss> {
    let ks: Vec<&str> = idx.iter().map(|&i| r.keys[i].as_str()).collect();
    here_keys(engine, owner, id, &r.entry.op, r.state, &ks, r.range, r.limit).await
}

/// Keys of a partition on this host, in one state: current (one `stat`), or caught up first,
/// off the thread that answers (a catch-up is milliseconds of RocksDB work, or a wait for the
/// reader doing it). The owner's reader reads so too (`reader`).
#[allow(clippy::too_many_arguments)]
pub async fn here_keys(
    engine: &Arc<Engine>,
    owner: &Arc<str>,
    id: &PartitionId,
    op: &Operator,
    state: usize,
    keys: &[&str],
    range: Option<(i64, i64)>,
    limit: usize,
) -> Result<Vec<Hit>, Miss> {
    let local = &engine.local;
    let part = local.lookup(owner, id).ok_or(Miss::NotHere)?;
    let inst = match local.current(owner, id, &part)? {
        Some(inst) => inst,
        None => {
            let (e, o, i) = (engine.clone(), owner.clone(), id.clone());
            let (inst, took) = tokio::task::spawn_blocking(move || e.local.instance(&o, &i))
                .await
                .map_err(|j| Miss::Failed(format!("a catch-up failed: {j}")))??;
            if let Some(d) = took {
                engine.metrics.catchup("read", d);
            }
            inst
        }
    };
    engine.settings.load().read_fault(&id.operator, inst.meta.last_batch);
    let mut hits = local.read_states(owner, id, &inst, op, &[state], keys, range, limit)?;
    engine.metrics.local_reads(keys.len() as u64);
    Ok(hits.remove(0))
}

fn corrupt(id: &PartitionId, why: &str) -> Failure {
    Failure::corrupt(format!("partition {id}: {why}; its shard restores it from its snapshot and deltas"))
}

/// A 503 of a partition that cannot answer now, by reason (`qstate_router_unavailable_total`):
/// also what the router's top-N says of one (`qstate.router.top`).
pub fn unavailable(engine: &Engine, reason: &'static str, id: &PartitionId, address: &str) -> Failure {
    let message = match reason {
        "no-owner" => format!(
            "partition {id} has no shard server yet: the job's coordinator places partitions on the shard \
             servers registered in checkpoint storage; start one (`qstate shard`) if none runs, and see \
             `qstate state inspect`"
        ),
        "shard-down" => format!("shard {address} holding partition {id} is unavailable (UNAVAILABLE)"),
        "shard-timeout" => format!("shard {address} holding partition {id} is unavailable (DEADLINE_EXCEEDED)"),
        "shard-refused" => {
            format!("shard {address} holding partition {id} refused this router (a cluster token that differs)")
        }
        "restoring" => format!("partition {id} is being restored on {address}"),
        _ => format!("partition {id} is moving between shard servers"),
    };
    Failure::unavailable(message, engine.settings.load().retry_after_s, reason, Some(id.partition), None)
}

/// The 503 of a read whose partition did not reach its `min_batch` in time: the batch it has.
pub fn behind(engine: &Engine, id: &PartitionId, batch: i64, want: i64) -> Failure {
    let cfg = engine.settings.load();
    Failure::unavailable(
        format!(
            "partition {id} is at batch {batch}, not yet at min_batch {want} (waited {}s, QSTATE_MIN_BATCH_WAIT_S)",
            seconds(cfg.min_batch_wait.as_secs_f64())
        ),
        cfg.retry_after_s,
        "behind",
        Some(id.partition),
        Some(batch),
    )
}

fn owner_now(engine: &Engine, r: &Read, partition: u32) -> Option<Arc<str>> {
    let spec = &r.entry.op.spec;
    engine.table.load().get(&spec.job, &spec.operator).and_then(|e| e.owner(partition))
}

/// What one server answered about keys of one partition, asked now.
async fn ask(
    engine: &Engine,
    r: &Read,
    address: &str,
    id: &PartitionId,
    idx: &[usize],
) -> Result<Vec<KeyResult>, Asked> {
    let Some(remote) = engine.remote.load_full() else { return Err(Asked::Failed(CallFailed::Down)) };
    let q = RemoteAsk {
        job: &id.job,
        operator: &id.operator,
        state: r.state_name(),
        range: r.range,
        limit: r.limit as u32,
        savepoint: r.savepoint.as_deref(),
        partitions: r.entry.op.spec.partitions,
    };
    let queries = idx.iter().map(|&i| KeyQuery { key: r.keys[i].clone(), partition: id.partition }).collect();
    let table = engine.table.load();
    let to = asked_at(&table, r, address);
    let asked = remote.ask(to, &q, queries).map_err(Asked::Full)?;
    drop(table);
    let _waiting = engine.metrics.waiting(idx.len() as u64);
    asked.answers().await.map_err(Asked::Failed)
}

enum Asked {
    /// this many keys already wait for the shard (QSTATE_MAX_SHARD_QUEUE)
    Full(usize),
    Failed(CallFailed),
}

/// From the partition's owner: a move is followed once (a new owner named by the routing
/// table after a refresh), a restore or a move under way is a 503, a full queue a 429.
async fn from_owner(engine: &Engine, r: &Read, id: &PartitionId, idx: &[usize]) -> Result<Vec<Hit>, Failure> {
    let mut address = r.entry.owner(id.partition);
    for attempt in 0..2 {
        if attempt > 0 || address.is_none() {
            address = owner_now(engine, r, id.partition);
            if address.is_none() {
                engine.refresh(false).await;
                address = owner_now(engine, r, id.partition);
            }
        }
        let Some(a) = address.clone() else { return Err(unavailable(engine, "no-owner", id, "")) };
        engine.metrics.remote_reads(idx.len() as u64);
        match ask(engine, r, &a, id, idx).await {
            Err(Asked::Full(waiting)) => return Err(queue_full(engine, waiting, &a)),
            Err(Asked::Failed(f @ (CallFailed::Timeout | CallFailed::Down))) => {
                if attempt == 0 {
                    engine.refresh(false).await;
                    if owner_now(engine, r, id.partition).as_deref() != Some(&*a) {
                        continue; // moved: ask the new owner
                    }
                }
                let reason = if matches!(f, CallFailed::Timeout) { "shard-timeout" } else { "shard-down" };
                return Err(unavailable(engine, reason, id, &a));
            }
            Err(Asked::Failed(CallFailed::Unauthenticated)) => {
                eprintln!("qstate router: shard {a} refused this router: its QSTATE_CLUSTER_TOKEN differs");
                return Err(unavailable(engine, "shard-refused", id, &a));
            }
            Err(Asked::Failed(CallFailed::Refused(f))) => return Err(f),
            Ok(results) => {
                if results.iter().any(|k| k.status == KeyStatus::Restoring as i32) {
                    return Err(unavailable(engine, "restoring", id, &a));
                }
                if results.iter().any(|k| k.status == KeyStatus::NotOwned as i32) {
                    engine.refresh(true).await;
                    continue;
                }
                return hits(results).ok_or_else(|| {
                    Failure::engine(format!(
                        "shard {a} answered partition {id} with a status this router does not know"
                    ))
                });
            }
        }
    }
    Err(unavailable(engine, "moving", id, ""))
}

/// From the first follower that serves the partition (its answer says its batch); None when
/// none does.
async fn from_follower(
    engine: &Engine,
    r: &Read,
    id: &PartitionId,
    idx: &[usize],
) -> Option<Result<Vec<Hit>, Failure>> {
    for address in followers(engine, r, id) {
        engine.metrics.follower_reads(idx.len() as u64);
        if let Ok(results) = ask(engine, r, &address, id, idx).await {
            if let Some(h) = hits(results) {
                return Some(Ok(h));
            }
        }
    }
    None
}

/// Results of a partition its server holds (FOUND, ABSENT) as hits; None for any other.
fn hits(results: Vec<KeyResult>) -> Option<Vec<Hit>> {
    results
        .into_iter()
        .map(|r| {
            let found = match KeyStatus::try_from(r.status).ok()? {
                KeyStatus::Found => true,
                KeyStatus::Absent => false,
                _ => return None,
            };
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
            Some(Hit { found, batch: r.batch, watermark_ms: r.watermark_ms, windows, next_from: r.next_from_ms })
        })
        .collect()
}
