//! Reading keys' windows from one partition's RocksDB: the latest window, or the windows
//! starting in `[from, to)` oldest first, at most `limit`; a sliding window made from its
//! panes. The shard's Python reader (`qstate.partition.reader`) reads the same bytes the same
//! way: `tests/service/partition/test_readers.py` holds the two equal.
//! The caller knows which batch the instance holds (it does not change while read:
//! docs/architecture.md §5), so no snapshot is taken.

use rocksdb::{DBRawIteratorWithThreadMode, DB};

use crate::partition::codec::{Codec, Corrupt, Value};
use crate::partition::layout::{enc_time, key_prefix, pane_of, start_of, tag_of, NO_WINDOW};
use crate::partition::meta::Meta;
use crate::partition::windows::{first_window_of, last_window_of, ALL_WINDOWS};
use crate::spec::OperatorSpec;

/// One window of one state, as read.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Window {
    pub start: Option<i64>,
    pub end: Option<i64>,
    pub value: Value,
}

/// What a read needs of its operator: the spec, its codec, the state asked.
pub struct Reading<'a> {
    pub spec: &'a OperatorSpec,
    pub codec: &'a Codec,
    pub state: usize,
}

type Iter<'a> = DBRawIteratorWithThreadMode<'a, DB>;

#[derive(Debug)]
pub enum ReadError {
    /// bytes that do not parse as the layout says
    Corrupt(String),
    /// RocksDB failed (files moving under a secondary: the partition is reopened)
    Db(String),
}

impl From<Corrupt> for ReadError {
    fn from(c: Corrupt) -> Self {
        ReadError::Corrupt(c.0.to_string())
    }
}

impl From<rocksdb::Error> for ReadError {
    fn from(e: rocksdb::Error) -> Self {
        ReadError::Db(e.into_string())
    }
}

/// Each key's windows, in order, from one instance holding the batch of `meta`.
pub fn read_many(
    db: &DB,
    r: &Reading<'_>,
    meta: &Meta,
    keys: &[&str],
    range: Option<(i64, i64)>,
    limit: usize,
) -> Result<Vec<Vec<Window>>, ReadError> {
    let mut it = db.raw_iterator();
    let mut last = Entry::default();
    let mut out = Vec::with_capacity(keys.len());
    for key in keys {
        let prefix = key_prefix(key);
        let ws = if r.spec.panes() {
            let cutoff = i128::from(meta.watermark_ms) - i128::from(r.spec.retention_ms);
            sliding(&mut it, r, &prefix, range, limit, cutoff)?
        } else if let Some((lo, hi)) = range {
            between(&mut it, r, &prefix, lo, hi, limit)?
        } else {
            latest(&mut it, r, &prefix, &mut last)?
        };
        it.status()?;
        out.push(ws);
    }
    Ok(out)
}

/// Each key's latest window in each of `states` (per state, then per key), as `read_many`
/// reads them state by state with no range from a spec without panes, but with one seek of
/// each key: the states of one operator share a record (docs/architecture.md §2).
pub fn read_latest_states(
    db: &DB,
    spec: &OperatorSpec,
    codec: &Codec,
    states: &[usize],
    keys: &[&str],
) -> Result<Vec<Vec<Vec<Window>>>, ReadError> {
    let mut it = db.raw_iterator();
    let mut last = Entry::default();
    let mut out: Vec<Vec<Vec<Window>>> = states.iter().map(|_| Vec::with_capacity(keys.len())).collect();
    for key in keys {
        let found = last_entry(&mut it, &key_prefix(key), &mut last);
        it.status()?;
        for (windows, &state) in out.iter_mut().zip(states) {
            let r = Reading { spec, codec, state };
            windows.push(if found { vec![window(&r, &last.0, &last.1)?] } else { vec![] });
        }
    }
    Ok(out)
}

fn window(r: &Reading<'_>, k: &[u8], v: &[u8]) -> Result<Window, ReadError> {
    let (end, value) = r.codec.answer_of(v, r.state)?;
    let start = start_of(k);
    Ok(if start != NO_WINDOW {
        Window { start: Some(start), end: Some(end), value }
    } else {
        Window { start: None, end: None, value }
    })
}

fn latest(it: &mut Iter<'_>, r: &Reading<'_>, prefix: &[u8], last: &mut Entry) -> Result<Vec<Window>, ReadError> {
    Ok(if last_entry(it, prefix, last) { vec![window(r, &last.0, &last.1)?] } else { vec![] })
}

/// A key's entry as copied out of the iterator (key, value).
type Entry = (Vec<u8>, Vec<u8>);

/// Entries `last_entry` steps over forward from a key's first before it seeks back from the
/// key's end instead. A step forward in a memtable's skiplist follows one link, where a step
/// back searches from its head: `seek_for_prev` cost three searches a key and most of a
/// `:batchGet`'s time (the profile in loadtest/results/router.md); most keys hold a few
/// windows, and a key holding more costs these steps and one seek more than before.
const FORWARD_STEPS: usize = 4;

/// Copies the last entry under `prefix` into `last`; false when there is none.
fn last_entry(it: &mut Iter<'_>, prefix: &[u8], last: &mut Entry) -> bool {
    let mut found = false;
    it.seek(prefix);
    for _ in 0..FORWARD_STEPS {
        match (it.key(), it.value()) {
            (Some(k), Some(v)) if k.starts_with(prefix) => {
                copy_entry(last, k, v);
                found = true;
            }
            _ => return found,
        }
        it.next();
    }
    if !it.key().is_some_and(|k| k.starts_with(prefix)) {
        return found;
    }
    let mut seek = prefix.to_vec();
    seek.extend_from_slice(&[0xff; 8]);
    it.seek_for_prev(&seek);
    match (it.key(), it.value()) {
        (Some(k), Some(v)) if k.starts_with(prefix) => {
            copy_entry(last, k, v);
            true
        }
        _ => found,
    }
}

fn copy_entry(last: &mut Entry, k: &[u8], v: &[u8]) {
    last.0.clear();
    last.0.extend_from_slice(k);
    last.1.clear();
    last.1.extend_from_slice(v);
}

fn between(
    it: &mut Iter<'_>,
    r: &Reading<'_>,
    prefix: &[u8],
    lo: i64,
    hi: i64,
    limit: usize,
) -> Result<Vec<Window>, ReadError> {
    let mut out = Vec::new();
    let mut seek = prefix.to_vec();
    seek.extend_from_slice(&enc_time(lo));
    let mut stop = prefix.to_vec();
    stop.extend_from_slice(&enc_time(hi));
    it.seek(&seek);
    while out.len() < limit {
        let (Some(k), Some(v)) = (it.key(), it.value()) else { break };
        if k >= stop.as_slice() || !k.starts_with(prefix) {
            break;
        }
        out.push(window(r, k, v)?);
        it.next();
    }
    Ok(out)
}

fn sliding(
    it: &mut Iter<'_>,
    r: &Reading<'_>,
    prefix: &[u8],
    range: Option<(i64, i64)>,
    limit: usize,
    cutoff: i128,
) -> Result<Vec<Window>, ReadError> {
    let w = &r.spec.window;
    let (size, slide) = (i128::from(w.size_ms), i128::from(w.slide()));
    let (mut lo, hi) = match range {
        None => {
            let mut seek = prefix.to_vec();
            seek.extend_from_slice(&[0xff; 16]);
            it.seek_for_prev(&seek);
            match it.key() {
                Some(k) if k.starts_with(prefix) => {
                    let newest = last_window_of(i128::from(pane_of(k)), slide);
                    (newest, newest + 1)
                }
                _ => return Ok(vec![]),
            }
        }
        Some((lo, hi)) => (i128::from(lo), i128::from(hi)),
    };
    // a window that ended at or before the retention cutoff is gone, though some of its
    // panes may still serve newer windows
    lo = lo.max(cutoff - size + 1);
    if lo >= hi {
        return Ok(vec![]);
    }
    let first_pane = i64::try_from(lo).map_err(|_| ReadError::Corrupt("a range beyond int64".into()))?;
    let stop = i64::try_from((hi + size).min(i128::from(i64::MAX))).expect("clamped");
    let mut seek = prefix.to_vec();
    seek.extend_from_slice(&enc_time(first_pane));
    let mut end_key = prefix.to_vec();
    end_key.extend_from_slice(&enc_time(stop));
    it.seek(&seek);
    let mut keys: Vec<Vec<u8>> = Vec::new();
    let mut values: Vec<Vec<u8>> = Vec::new();
    while let (Some(k), Some(v)) = (it.key(), it.value()) {
        if k >= end_key.as_slice() || !k.starts_with(prefix) {
            break;
        }
        keys.push(k.to_vec());
        values.push(v.to_vec());
        it.next();
    }
    if keys.is_empty() {
        return Ok(vec![]);
    }
    // each window start with the panes (in key order) that count in it
    let mut members: std::collections::BTreeMap<i128, Vec<usize>> = Default::default();
    for (n, k) in keys.iter().enumerate() {
        let (pane, tag) = (i128::from(pane_of(k)), tag_of(k));
        let mut first = first_window_of(pane, size, slide).max(lo);
        if tag != ALL_WINDOWS {
            first = first.max(i128::from(tag));
        }
        first += (-first).rem_euclid(slide); // align up
        let last = last_window_of(pane, slide).min(hi - 1);
        let mut s = first;
        while s <= last {
            members.entry(s).or_default().push(n);
            s += slide;
        }
    }
    let mut out = Vec::new();
    for (s, idx) in members.into_iter().take(limit) {
        let panes: Vec<&[u8]> = idx.iter().map(|&i| values[i].as_slice()).collect();
        let value = r.codec.fold_answer(&panes, r.state)?;
        let start = i64::try_from(s).map_err(|_| ReadError::Corrupt("a window beyond int64".into()))?;
        let end = i64::try_from(s + size).map_err(|_| ReadError::Corrupt("a window beyond int64".into()))?;
        out.push(Window { start: Some(start), end: Some(end), value });
    }
    Ok(out)
}

/// At most `limit` of `windows` (read with `limit + 1`) and where the next page starts.
pub fn page(mut windows: Vec<Window>, limit: usize) -> (Vec<Window>, Option<i64>) {
    if windows.len() <= limit {
        return (windows, None);
    }
    let next = windows[limit].start;
    windows.truncate(limit);
    (windows, next)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;
    use rocksdb::{Options, DB};

    use super::*;

    proptest! {
        /// The last entry of each key, stepping forward or seeking back, is the last one
        /// written and not deleted, among keys holding 0 to 15 windows, some flushed to a
        /// table file and some in the memtable.
        #[test]
        fn the_last_entry_is_the_newest_window_left(
            writes in proptest::collection::vec((0u8..6, -3i64..12, any::<bool>()), 0..120),
            flush_at in 0usize..120,
        ) {
            let dir = tempfile::tempdir().expect("tempdir");
            let mut opts = Options::default();
            opts.create_if_missing(true);
            let db = DB::open(&opts, dir.path()).expect("open");
            let mut truth: BTreeMap<(u8, i64), Vec<u8>> = BTreeMap::new();
            for (n, (key, start, delete)) in writes.iter().enumerate() {
                if n == flush_at {
                    db.flush().expect("flush");
                }
                let mut k = key_prefix(&"k".repeat(usize::from(*key)));
                k.extend_from_slice(&enc_time(*start));
                if *delete {
                    db.delete(&k).expect("delete");
                    truth.remove(&(*key, *start));
                } else {
                    let v = n.to_be_bytes().to_vec();
                    db.put(&k, &v).expect("put");
                    truth.insert((*key, *start), v);
                }
            }
            let mut it = db.raw_iterator();
            let mut last = Entry::default();
            for key in 0u8..6 {
                let prefix = key_prefix(&"k".repeat(usize::from(key)));
                let want = truth.range((key, i64::MIN)..=(key, i64::MAX)).next_back();
                let found = last_entry(&mut it, &prefix, &mut last);
                prop_assert_eq!(found, want.is_some());
                if let Some(((_, start), v)) = want {
                    prop_assert_eq!(start_of(&last.0), *start);
                    prop_assert_eq!(&last.1, v);
                }
            }
        }
    }
}
