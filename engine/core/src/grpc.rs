//! The public gRPC API's point and batch reads (`Get`, `MultiGet` of proto/qstate.proto) of
//! partitions on this host, answered by the engine: the request's bytes in, the answer's
//! bytes out, encoded once (docs/architecture.md §5). grpcio stays the server: Python checks
//! the caller's token and hands the bytes here, then sends what comes back. Anything else
//! (a partition read elsewhere, a min_batch not reached, a key with no data, a savepoint, a
//! request Python would refuse) is None: Python's own path answers it, as before.

use prost::Message;

use crate::address::partition_of;
use crate::codec::Value;
use crate::engine::Engine;
use crate::local::Hit;
use crate::publicpb::{window, GetRequest, MultiGetRequest, MultiGetResponse, StateValue, Window};
use crate::query::{self, Read};
use crate::timeparse::FAR;

/// `_range(req)`: both ends absent, the latest window; else an absent end is open.
fn range(from: Option<i64>, to: Option<i64>) -> Option<(i64, i64)> {
    if from.is_none() && to.is_none() {
        return None;
    }
    Some((from.unwrap_or(-FAR as i64), to.unwrap_or(FAR as i64)))
}

/// Each key's hit, from partitions on this host only, at or past `min_batch`. Not counted:
/// a request Python answers after all reads its keys again and counts them then, so only an
/// answer sent from here counts its keys (`answered`).
fn read(engine: &Engine, r: &Read) -> Option<Vec<Hit>> {
    let spec = &r.entry.op.spec;
    let mut groups: Vec<(u32, Vec<usize>)> = Vec::new();
    for (i, k) in r.keys.iter().enumerate() {
        let p = partition_of(k, spec.partitions);
        match groups.iter_mut().find(|(q, _)| *q == p) {
            Some((_, idx)) => idx.push(i),
            None => groups.push((p, vec![i])),
        }
    }
    let mut hits: Vec<Option<Hit>> = vec![None; r.keys.len()];
    for (p, idx) in groups {
        let owner = r.entry.owners.get(p as usize)?.clone()?;
        let keys: Vec<&str> = idx.iter().map(|&i| r.keys[i].as_str()).collect();
        let found = engine.read_local(&owner, &r.entry, p, r.state, &keys, r.range, r.limit).ok()?;
        for (i, h) in idx.into_iter().zip(found) {
            if r.min_batch.is_some_and(|m| h.batch < m) {
                return None; // Python waits for it
            }
            hits[i] = Some(h);
        }
    }
    hits.into_iter().collect()
}

fn value(r: &Read, key: &str, h: Hit) -> StateValue {
    let spec = &r.entry.op.spec;
    StateValue {
        job: spec.job.clone(),
        operator: spec.operator.clone(),
        state: spec.states.get_index(r.state).expect("state").0.clone(),
        key: key.to_string(),
        found: h.found,
        batch: h.batch,
        watermark_ms: h.watermark_ms,
        windows: h
            .windows
            .iter()
            .map(|w| Window {
                start_ms: w.start,
                end_ms: w.start.map(|_| w.end.unwrap_or(0)),
                value: match w.value {
                    Value::Null => None,
                    Value::Long(v) => Some(window::Value::IntValue(v)),
                    Value::Double(v) => Some(window::Value::DoubleValue(v)),
                },
            })
            .collect(),
        next_from_ms: h.next_from,
    }
}

/// `Get`'s answer bytes, or None (Python's path answers).
pub fn get(engine: &Engine, raw: &[u8]) -> Option<Vec<u8>> {
    let req = GetRequest::decode(raw).ok()?;
    if req.savepoint.is_some() {
        return None;
    }
    let cfg = engine.settings.load();
    let limit = req.limit.map(i64::from);
    let r = query::check(
        engine,
        &cfg,
        &req.job,
        &req.operator,
        &req.state,
        vec![req.key],
        range(req.from_ms, req.to_ms),
        limit,
        req.min_batch,
    )?;
    let h = read(engine, &r)?.pop()?;
    if !h.found {
        return None; // NOT_FOUND, worded by Python
    }
    engine.metrics.local_reads(1);
    Some(value(&r, &r.keys[0], h).encode_to_vec())
}

/// `MultiGet`'s answer bytes, or None (Python's path answers).
pub fn multi_get(engine: &Engine, raw: &[u8]) -> Option<Vec<u8>> {
    let req = MultiGetRequest::decode(raw).ok()?;
    let cfg = engine.settings.load();
    // several states of one operator: Python's rounds keep a key's states at one batch
    if req.savepoint.is_some() || req.keys.len() > cfg.max_batch_keys || !req.states.is_empty() {
        return None;
    }
    let limit = req.limit.map(i64::from);
    let r = query::check(
        engine,
        &cfg,
        &req.job,
        &req.operator,
        &req.state,
        req.keys,
        range(req.from_ms, req.to_ms),
        limit,
        req.min_batch,
    )?;
    let hits = read(engine, &r)?;
    engine.metrics.local_reads(r.keys.len() as u64);
    let results = r.keys.iter().zip(hits).map(|(k, h)| value(&r, k, h)).collect();
    Some(MultiGetResponse { results }.encode_to_vec())
}
