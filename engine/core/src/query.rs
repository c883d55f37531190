//! One read as the engine answers it, checked as `qstate.router.request.StateQuery.of`
//! checks it, whichever front asked (HTTP here, gRPC through Python): a read the engine
//! cannot answer exactly as Python would (a name or key refused, an unknown operator or
//! state, an empty range, a limit beyond the bounds, a savepoint) is None, and Python
//! answers it (docs/architecture.md §5, native front).

use std::sync::Arc;

use crate::address::{is_key, is_name};
use crate::engine::{Engine, Settings};
use crate::table::Entry;

pub struct Read {
    pub entry: Arc<Entry>,
    pub state: usize,
    pub keys: Vec<String>,
    pub range: Option<(i64, i64)>,
    pub limit: usize,
    pub min_batch: Option<i64>,
}

/// `StateQuery.of` (less the key count, which each front bounds): the read, or None.
#[allow(clippy::too_many_arguments)]
pub fn check(
    engine: &Engine,
    cfg: &Settings,
    job: &str,
    operator: &str,
    state: &str,
    keys: Vec<String>,
    range: Option<(i64, i64)>,
    limit: Option<i64>,
    min_batch: Option<i64>,
) -> Option<Read> {
    if !is_name(job) || !is_name(operator) || !is_name(state) || !keys.iter().all(|k| is_key(k)) {
        return None;
    }
    let table = engine.table.load();
    let entry = table.get(job, operator)?.clone();
    let state = entry.op.spec.state_index(state)?;
    if let Some((lo, hi)) = range {
        if hi <= lo {
            return None;
        }
    }
    let mut limit = limit;
    if range.is_some() && !keys.is_empty() {
        // keys × limit within the request's budget (QSTATE_MAX_REQUEST_WINDOWS): without a
        // limit, a batch gets what fits
        let budget = cfg.max_request_windows as i64;
        match limit {
            None => limit = Some(1.max((cfg.max_windows as i64).min(budget / keys.len() as i64))),
            Some(l) if (keys.len() as i64).saturating_mul(l) > budget => return None,
            Some(_) => {}
        }
    }
    let limit = limit.unwrap_or(cfg.max_windows as i64);
    if !(1..=cfg.max_windows as i64).contains(&limit) {
        return None;
    }
    if min_batch.is_some_and(|m| m < 0) {
        return None;
    }
    Some(Read { entry, state, keys, range, limit: limit as usize, min_batch })
}
