//! The read core over a real partition: a RocksDB primary written here as a shard writes one
//! (its rows, META and commit marker), read through the engine's secondaries. What these hold:
//! a read answers as of one batch; `min_batch` waits for a commit and says the batch it has
//! when none comes; a key's states meet at one batch; an operator the table does not know is
//! asked of the control plane once; a planted fault panics where it says.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rocksdb::{Options, WriteBatch, DB};

use super::*;
use crate::address::PartitionId;
use crate::local::{LocalServer, Operator};
use crate::partition::codec::Value;
use crate::partition::layout::{enc_time, key_prefix, META};
use crate::partition::marker::{partition_dir, MARKER};
use crate::settings::testing::settings;
use crate::settings::{Fault, Settings};
use crate::spec::OperatorSpec;
use crate::table::{Entry, Table};

const OWNER: &str = "127.0.0.1:1";

struct World {
    _tmp: tempfile::TempDir,
    engine: Arc<Engine>,
    db: DB,
    dir: PathBuf,
}

/// One partition (P = 1) of an operator with two counts, `a` and `b`, owned by a shard on this
/// host (this process).
fn world(cfg: Settings) -> World {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = tmp.path().join("server");
    let dir = partition_dir(&server, "j", "o", 0);
    std::fs::create_dir_all(&dir).expect("dir");
    let mut opts = Options::default();
    opts.create_if_missing(true);
    let db = DB::open(&opts, &dir).expect("primary");
    let engine = Arc::new(Engine::new(tmp.path().join("scratch"), 1 << 20, cfg).expect("engine"));
    let w = World { _tmp: tmp, engine, db, dir };
    w.table(true);
    w.engine.local.set_servers(vec![LocalServer {
        address: OWNER.into(),
        data_dir: server,
        pid: std::process::id() as i32,
    }]);
    w.engine
        .local
        .set_ready(OWNER, HashSet::from([PartitionId { job: "j".into(), operator: "o".into(), partition: 0 }]));
    w
}

fn spec() -> OperatorSpec {
    OperatorSpec::from_json(
        br#"{"job": "j", "operator": "o", "key": "k", "partitions": 1, "retention_ms": 0,
            "states": {"a": {"kind": "count", "type": "long"}, "b": {"kind": "count", "type": "long"}},
            "window": {"kind": "tumbling", "size_ms": 10}}"#,
    )
    .expect("spec")
}

impl World {
    /// The routing table: knowing the operator, or not.
    fn table(&self, knows: bool) {
        let mut t = Table::new("storage".into(), true);
        if knows {
            t.insert(Entry {
                op: Operator::new(spec()),
                owners: vec![Some(Arc::from(OWNER))],
                followers: vec![vec![]],
                named: vec![],
            });
        }
        self.engine.table.store(Arc::new(t));
    }

    /// Batch `batch` as a shard commits it: each key's window 0 with counts (a, b), META and
    /// the batch in one write, then the marker.
    fn commit(&self, batch: i64, rows: &[(&str, i64, i64)]) {
        let mut wb = WriteBatch::default();
        for (key, a, b) in rows {
            let mut k = key_prefix(key);
            k.extend_from_slice(&enc_time(0));
            let mut v = 10i64.to_le_bytes().to_vec(); // the window's end
            v.extend_from_slice(&a.to_le_bytes());
            v.extend_from_slice(&b.to_le_bytes());
            wb.put(k, v);
        }
        wb.put(META, format!(r#"{{"last_batch":{batch},"watermark_ms":0}}"#));
        self.db.write(wb).expect("write");
        marker(&self.dir, batch);
    }
}

fn marker(dir: &Path, batch: i64) {
    let tmp = dir.join(".marker.tmp");
    std::fs::write(&tmp, format!("tok {batch}")).expect("marker");
    std::fs::rename(&tmp, dir.join(MARKER)).expect("marker");
}

fn ask(keys: &[&str], states: &[&str], min_batch: Option<i64>) -> Ask {
    Ask {
        job: "j".into(),
        operator: "o".into(),
        states: states.iter().map(|s| s.to_string()).collect(),
        several: states.len() > 1,
        keys: keys.iter().map(|k| k.to_string()).collect(),
        min_batch,
        local: true,
        ..Ask::default()
    }
}

fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime").block_on(f)
}

fn counts(o: &Outcome) -> Vec<(i64, Value)> {
    o.by_key().map(|(_, _, h)| (h.batch, h.windows.last().map_or(Value::Null, |w| w.value))).collect()
}

#[test]
fn a_read_answers_the_batch_committed_and_every_state_of_it() {
    let w = world(settings());
    w.commit(3, &[("k1", 1, 10), ("k2", 2, 20)]);
    let o = block_on(answer(&w.engine, ask(&["k1", "k2", "nope"], &["a", "b"], None))).expect("an answer");
    assert_eq!(
        counts(&o),
        vec![
            (3, Value::Long(1)),
            (3, Value::Long(10)),
            (3, Value::Long(2)),
            (3, Value::Long(20)),
            (3, Value::Null),
            (3, Value::Null)
        ]
    );
    assert!(!o.hits[0][2].found, "a key with no data is absent as of the batch");
    // a later commit is the next read's answer, read here (no shard answers on this host)
    w.commit(4, &[("k1", 5, 50)]);
    let o = block_on(answer(&w.engine, ask(&["k1"], &["a"], None))).expect("an answer");
    assert_eq!(counts(&o), vec![(4, Value::Long(5))]);
}

#[test]
fn min_batch_waits_for_its_commit() {
    let w = world(settings());
    w.commit(1, &[("k", 1, 1)]);
    let engine = w.engine.clone();
    let read = std::thread::spawn(move || block_on(answer(&engine, ask(&["k"], &["a"], Some(2)))));
    w.commit(2, &[("k", 2, 2)]);
    let o = read.join().expect("the reader").expect("an answer");
    assert_eq!(counts(&o), vec![(2, Value::Long(2))]);
}

#[test]
fn min_batch_not_reached_says_the_batch_it_has() {
    let w = world(Settings { min_batch_wait: Duration::from_millis(120), ..settings() });
    w.commit(1, &[("k", 1, 1)]);
    let f = block_on(answer(&w.engine, ask(&["k"], &["a"], Some(7)))).err().expect("a 503");
    assert_eq!((f.class, f.reason, f.http_status()), ("Unavailable", Some("behind"), 503));
    assert_eq!(
        f.message,
        "partition j/o/0 is at batch 1, not yet at min_batch 7 (waited 0.12s, QSTATE_MIN_BATCH_WAIT_S)"
    );
}

#[test]
fn states_read_apart_are_read_again_at_the_newest_batch() {
    let w = world(settings());
    w.commit(5, &[("k", 50, 500)]);
    let reads = block_on(ask::check(&w.engine, &ask(&["k"], &["a", "b"], None))).expect("reads");
    // as if a commit had landed between the two states' reads: `a` at 4, `b` at 5
    let old = Hit { found: true, batch: 4, watermark_ms: 0, windows: vec![], next_from: None };
    let new = Hit { batch: 5, ..old.clone() };
    let o = block_on(wait::settle(&w.engine, &reads, vec![vec![old], vec![new]])).expect("an answer");
    assert_eq!(counts(&o), vec![(5, Value::Long(50)), (5, Value::Long(500))]);
}

#[test]
fn states_that_never_meet_are_a_503_never_a_mixed_answer() {
    let w = world(settings());
    w.commit(5, &[("k", 50, 500)]);
    let reads = block_on(ask::check(&w.engine, &ask(&["k"], &["a", "b"], None))).expect("reads");
    let at = |b| Hit { found: true, batch: b, watermark_ms: 0, windows: vec![], next_from: None };
    let rounds = AtomicUsize::new(0);
    // every read again lands between two commits
    let again = |_: &[Read]| {
        let n = rounds.fetch_add(1, Ordering::Relaxed) as i64;
        std::future::ready(Ok(vec![vec![at(10 + 2 * n)], vec![at(11 + 2 * n)]]))
    };
    let f = block_on(wait::settle_with(&w.engine, &reads, vec![vec![at(4)], vec![at(5)]], again)).err().expect("a 503");
    assert_eq!((f.class, f.reason), ("Unavailable", Some("behind")));
    assert!(
        f.message.starts_with("the states of key \"k\" answered at batches [12, 13] in each of 3 reads"),
        "{}",
        f.message
    );
    assert_eq!(rounds.load(Ordering::Relaxed), wait::STATE_ROUNDS - 1);
}

#[test]
fn an_operator_the_table_does_not_know_is_asked_of_the_control_plane_once() {
    let w = world(settings());
    w.commit(1, &[("k", 1, 1)]);
    w.table(false);
    let asked = Arc::new(AtomicUsize::new(0));
    let (a, engine) = (asked.clone(), Arc::downgrade(&w.engine));
    // the control plane: reads storage (here: learns the operator), pushes the table, says so
    w.engine.set_refresher(Box::new(move |_force| {
        a.fetch_add(1, Ordering::Relaxed);
        if let Some(e) = engine.upgrade() {
            let mut t = Table::new("storage".into(), true);
            t.insert(Entry {
                op: Operator::new(spec()),
                owners: vec![Some(Arc::from(OWNER))],
                followers: vec![vec![]],
                named: vec![],
            });
            e.table.store(Arc::new(t));
            e.refreshed();
        }
    }));
    let o = block_on(answer(&w.engine, ask(&["k"], &["a"], None))).expect("an answer after the refresh");
    assert_eq!(counts(&o), vec![(1, Value::Long(1))]);
    assert_eq!(asked.load(Ordering::Relaxed), 1);
    // a job storage does not know either: the 404 that names what this router serves
    let f = block_on(answer(&w.engine, Ask { job: "nojob".into(), ..ask(&["k"], &["a"], None) })).err().expect("a 404");
    assert_eq!(f.message, r#"unknown job "nojob": this router serves "j" (from checkpoint storage storage)"#);
    assert_eq!(asked.load(Ordering::Relaxed), 2);
}

#[test]
fn a_planted_read_fault_panics_where_it_says() {
    let w = world(Settings { fault: Some(Fault::ReadPanic { batch: 2, operator: Some("o".into()) }), ..settings() });
    w.commit(1, &[("k", 1, 1)]);
    assert!(block_on(answer(&w.engine, ask(&["k"], &["a"], None))).is_ok(), "another batch reads");
    w.commit(2, &[("k", 2, 2)]);
    let e = w.engine.clone();
    let caught =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| block_on(answer(&e, ask(&["k"], &["a"], None)))));
    assert!(caught.is_err(), "the read of batch 2 panics");
}
