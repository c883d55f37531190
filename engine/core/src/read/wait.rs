//! What a read waits for once its keys are read (docs/architecture.md §5):
//!
//! - `min_batch` (read your writes): a key read below it is read again every
//!   `MIN_BATCH_POLL` until its partition has the batch, at most `QSTATE_MIN_BATCH_WAIT_S`,
//!   then 503 `behind` naming the first key still behind in the request's order and the batch
//!   its partition has;
//! - a key's several states at one batch (a feature vector never mixes two): a key whose
//!   states a commit landed between is read again, every state with `min_batch` at the newest
//!   batch seen, at most `STATE_ROUNDS` times, then 503 `behind`.

use std::sync::Arc;

use tokio::time::Instant;

use crate::address::{partition_of, PartitionId};
use crate::engine::Engine;
use crate::errors::{quoted, Failure};
use crate::read::fetch::{self, behind};
use crate::read::{Hit, Outcome, Read};
use crate::settings::MIN_BATCH_POLL;

/// Reads of a several-states request before it answers 503.
pub const STATE_ROUNDS: usize = 3;

/// The first key whose states are at different batches.
fn mixed(hits: &[Vec<Hit>]) -> Option<usize> {
    let first = hits.first()?;
    (0..first.len()).find(|&k| hits.iter().any(|hs| hs[k].batch != first[k].batch))
}

fn outcome(reads: &[Read], hits: Vec<Vec<Hit>>) -> Outcome {
    let first = &reads[0];
    Outcome {
        entry: first.entry.clone(),
        states: reads.iter().map(|r| r.state).collect(),
        keys: first.keys.clone(),
        hits,
    }
}

/// The outcome when there is nothing to wait for; else the hits back, for `settle`.
pub fn settled(reads: &[Read], hits: Vec<Vec<Hit>>) -> Result<Outcome, Vec<Vec<Hit>>> {
    let below = reads[0].min_batch.is_some_and(|w| hits.iter().flatten().any(|h| h.batch < w));
    if below || mixed(&hits).is_some() {
        return Err(hits);
    }
    Ok(outcome(reads, hits))
}

/// `hits` of one state's read, with each key below `want` read again until it has it.
async fn at_least(engine: &Arc<Engine>, r: &Read, want: Option<i64>, hits: &mut [Hit]) -> Result<(), Failure> {
    let Some(want) = want else { return Ok(()) };
    let mut left: Vec<usize> = (0..hits.len()).filter(|&i| hits[i].batch < want).collect();
    if left.is_empty() {
        return Ok(());
    }
    let deadline = Instant::now() + engine.settings.load().min_batch_wait;
    while Instant::now() < deadline {
        tokio::time::sleep(MIN_BATCH_POLL).await;
        let again = fetch::keys(engine, r, &left).await?;
        let mut still = Vec::new();
        for (i, h) in left.into_iter().zip(again) {
            if h.batch < want {
                still.push(i);
            }
            hits[i] = h;
        }
        left = still;
        if left.is_empty() {
            return Ok(());
        }
    }
    let i = left[0];
    let spec = &r.entry.op.spec;
    let id = PartitionId {
        job: spec.job.clone(),
        operator: spec.operator.clone(),
        partition: partition_of(&r.keys[i], spec.partitions),
    };
    Err(behind(engine, &id, hits[i].batch, want))
}

/// The outcome once every key has `min_batch` and each key's states are at one batch.
pub async fn settle(engine: &Arc<Engine>, reads: &[Read], hits: Vec<Vec<Hit>>) -> Result<Outcome, Failure> {
    settle_with(engine, reads, hits, |r| again(engine, r)).await
}

/// Every state read again (one seek a key when every partition is here and current).
async fn again(engine: &Arc<Engine>, reads: &[Read]) -> Result<Vec<Vec<Hit>>, Failure> {
    match fetch::now(engine, reads)? {
        Some(h) => Ok(h),
        None => fetch::all(engine, reads).await,
    }
}

/// `settle`, each state read again by `again` (its tests write those reads).
pub async fn settle_with<'a, F, Fut>(
    engine: &Arc<Engine>,
    reads: &'a [Read],
    mut hits: Vec<Vec<Hit>>,
    mut again: F,
) -> Result<Outcome, Failure>
where
    F: FnMut(&'a [Read]) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<Vec<Hit>>, Failure>>,
{
    let mut floor = reads[0].min_batch;
    let mut round = 1;
    loop {
        for (r, hs) in reads.iter().zip(hits.iter_mut()) {
            at_least(engine, r, floor, hs).await?;
        }
        let Some(k) = mixed(&hits) else { return Ok(outcome(reads, hits)) };
        if round == STATE_ROUNDS {
            let mut seen: Vec<i64> = hits.iter().map(|hs| hs[k].batch).collect();
            seen.sort_unstable();
            seen.dedup();
            let shown: Vec<String> = seen.iter().map(i64::to_string).collect();
            return Err(Failure::unavailable(
                format!(
                    "the states of key {} answered at batches [{}] in each of {STATE_ROUNDS} reads: the job commits \
                     faster than a read goes round; retry",
                    quoted(&reads[0].keys[k], 200),
                    shown.join(", ")
                ),
                engine.settings.load().retry_after_s,
                "behind",
                None,
                None,
            ));
        }
        // every state again, at the newest batch this round saw
        round += 1;
        floor = hits.iter().flatten().map(|h| h.batch).max();
        hits = again(reads).await?;
    }
}
