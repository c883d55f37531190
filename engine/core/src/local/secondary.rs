//! One co-located partition read as a RocksDB secondary instance of its shard's primary
//! (docs/architecture.md §5). Freshness: the shard rewrites its commit marker after every
//! commit; a read `stat`s it and follows the primary when it changed (or 100 ms passed: an
//! inode reused within a timestamp tick could hide one rewrite that long).
//!
//! An answer never mixes two batches: an instance is never caught up while it is read.
//! Two instances take turns: readers hold the serving one (an `Arc`) while the other is
//! caught up with the WAL, then the caught-up one serves and the old one waits for the next
//! batch. The reader that notices the change does the catch-up; a reader that finds it under
//! way waits for it (milliseconds): a read begun after a commit's marker was written answers
//! that batch or a later one, never the one before, as reads one at a time would.
//!
//! So that reads rarely do that catch-up themselves, the engine's follower (`Local::keep_up`)
//! checks the markers of partitions read lately every few milliseconds and catches them up
//! off the read path; a read then finds its partition current (one `stat`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use parking_lot::Mutex;
use rocksdb::{Options, DB};

use crate::partition::layout::META;
use crate::partition::marker::{read_marker, signature, Marker, Signature, MARKER};
use crate::partition::meta::Meta;

pub const MARKER_RECHECK: Duration = Duration::from_millis(100);
/// Fresh opens tried before a read goes to the owner instead (`Partition::open`).
const OPEN_TRIES: usize = 4;

/// Milliseconds since the first call: the clock of `Partition::read_at`.
fn now_ms() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// One secondary instance and the batch it holds (it changes only while nobody reads it).
pub struct Instance {
    db: std::mem::ManuallyDrop<DB>,
    pub meta: Meta,
    pub marker: Marker,
    dir: PathBuf,
}

impl Instance {
    pub fn db(&self) -> &DB {
        &self.db
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        // closed before its folder goes
        unsafe { std::mem::ManuallyDrop::drop(&mut self.db) };
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[derive(Debug)]
pub enum Follow {
    /// the marker is gone or unreadable: the partition is not served from here (any more)
    Gone(std::io::Error),
    Db(String),
}

impl From<rocksdb::Error> for Follow {
    fn from(e: rocksdb::Error) -> Self {
        Follow::Db(e.into_string())
    }
}

struct Seen {
    signature: Signature,
    at: Instant,
}

pub struct Partition {
    primary: PathBuf,
    marker_file: PathBuf,
    scratch: PathBuf,
    opts: Arc<Options>,
    serving: ArcSwapOption<Instance>,
    // held while an instance is caught up or opened; the one waiting for the next batch
    standby: Mutex<Option<Arc<Instance>>>,
    seen: Mutex<Option<Seen>>,
    opened: AtomicU64,
    // when it was last asked for (now_ms): the follower keeps up only partitions read lately
    read_at: AtomicU64,
}

fn read_meta(db: &DB) -> Result<Meta, Follow> {
    let raw = db.get_pinned(META)?;
    Meta::decode(raw.as_deref()).map_err(Follow::Db)
}

impl Partition {
    pub fn new(primary: PathBuf, scratch: PathBuf, opts: Arc<Options>) -> Partition {
        let marker_file = primary.join(MARKER);
        Partition {
            primary,
            marker_file,
            scratch,
            opts,
            serving: ArcSwapOption::empty(),
            standby: Mutex::new(None),
            seen: Mutex::new(None),
            opened: AtomicU64::new(0),
            read_at: AtomicU64::new(now_ms()),
        }
    }

    pub fn primary(&self) -> &Path {
        &self.primary
    }

    /// The folder of this partition's own instances (removed when it is dropped).
    pub fn scratch(&self) -> &Path {
        &self.scratch
    }

    /// The serving instance when it is current as of the marker (one `stat`), else None:
    /// call `follow`. Err: the marker is gone.
    pub fn current(&self) -> Result<Option<Arc<Instance>>, Follow> {
        self.read_at.store(now_ms(), Ordering::Relaxed);
        self.fresh()
    }

    /// `current` without counting as a read (the follower's check).
    fn fresh(&self) -> Result<Option<Arc<Instance>>, Follow> {
        let sig = signature(&self.marker_file).map_err(Follow::Gone)?;
        let fresh = matches!(&*self.seen.lock(),
            Some(s) if s.signature == sig && s.at.elapsed() <= MARKER_RECHECK);
        Ok(if fresh { self.serving.load_full() } else { None })
    }

    /// The instance to read after `current` said None: caught up with the marker, by this
    /// reader or by the one it waits for. Never the instance served before the marker changed:
    /// a reader that did not wait for a catch-up under way would answer the batch before a
    /// commit it began after (tests/service/router/test_local.py).
    ///
    /// With the instance, how long this caller spent catching up or opening one (None: done
    /// by the one it waited for, or nothing to do): the catch-up histogram.
    pub fn follow(&self) -> Result<(Arc<Instance>, Option<Duration>), Follow> {
        let mut standby = self.standby.lock();
        // maybe done by the reader we waited for
        if let Some(cur) = self.fresh()? {
            return Ok((cur, None));
        }
        let began = Instant::now();
        let sig = signature(&self.marker_file).map_err(Follow::Gone)?;
        let marker = read_marker(&self.primary).map_err(Follow::Gone)?;
        let cur = self.serving.load_full();
        let (next, took) = match cur {
            Some(cur) if cur.marker == marker => (cur, None),
            Some(cur) if cur.marker.incarnation == marker.incarnation => {
                let next = self.caught_up(standby.take(), &marker)?;
                self.serving.store(Some(next.clone()));
                *standby = Some(cur);
                (next, Some(began.elapsed()))
            }
            // a first read, or a new incarnation (the folder was restored): a fresh instance
            _ => {
                *standby = None;
                let next = Arc::new(self.open(&marker)?);
                self.serving.store(Some(next.clone()));
                (next, Some(began.elapsed()))
            }
        };
        *self.seen.lock() = Some(Seen { signature: sig, at: Instant::now() });
        Ok((next, took))
    }

    /// The follower's turn: when the partition was read within `idle` and its marker moved
    /// (or was not looked at for `MARKER_RECHECK`), follow it now, so the next read need
    /// not. Ok(None): nothing to do, or another did it.
    pub fn keep_up(&self, idle: Duration) -> Result<Option<Duration>, Follow> {
        let since = now_ms().saturating_sub(self.read_at.load(Ordering::Relaxed));
        if self.serving.load().is_none() || since > idle.as_millis() as u64 || self.fresh()?.is_some() {
            return Ok(None);
        }
        Ok(self.follow()?.1)
    }

    /// `standby` caught up with the primary's WAL (a fresh instance when it is still read,
    /// or when catching up did not reach the marker's batch: seen after a flush and
    /// checkpoint on a restored primary).
    fn caught_up(&self, standby: Option<Arc<Instance>>, marker: &Marker) -> Result<Arc<Instance>, Follow> {
        if let Some(s) = standby {
            if let Ok(mut inst) = Arc::try_unwrap(s) {
                inst.db.try_catch_up_with_primary()?;
                inst.meta = read_meta(&inst.db)?;
                inst.marker = marker.clone();
                if inst.meta.last_batch >= marker.batch {
                    return Ok(Arc::new(inst));
                }
            }
        }
        Ok(Arc::new(self.open(marker)?))
    }

    /// A fresh instance that holds the marker's batch. An open that straddles a flush of the
    /// primary can read the MANIFEST before the flush's table file is in it and list the WALs
    /// after the flushed one is deleted, and hold neither (facebook/rocksdb#5323): an empty
    /// or older state served as the marker's batch. So each open is caught up once at once;
    /// one whose table files changed meanwhile, or that holds an older batch than the marker,
    /// is dropped and opened again. Err after `OPEN_TRIES`: the read asks the owner.
    fn open(&self, marker: &Marker) -> Result<Instance, Follow> {
        let mut seen = Vec::new();
        for n in 0..OPEN_TRIES {
            if n > 0 {
                std::thread::sleep(Duration::from_millis(n as u64)); // the flush under way ends
            }
            let mut inst = self.open_once(marker)?;
            let before = table_files(inst.db())?;
            inst.db.try_catch_up_with_primary()?;
            if table_files(inst.db())? == before {
                inst.meta = read_meta(inst.db())?;
                if inst.meta.last_batch >= marker.batch {
                    return Ok(inst);
                }
            }
            seen.push(inst.meta.last_batch);
        }
        Err(Follow::Db(format!(
            "{}: {OPEN_TRIES} secondary instances opened while its files moved held batches {seen:?}, \
             not the marker's {}",
            self.primary.display(),
            marker.batch
        )))
    }

    fn open_once(&self, marker: &Marker) -> Result<Instance, Follow> {
        let n = self.opened.fetch_add(1, Ordering::Relaxed);
        let dir = self.scratch.join(format!("i{n}"));
        std::fs::create_dir_all(&dir).map_err(Follow::Gone)?;
        let db = match DB::open_as_secondary(&self.opts, &self.primary, &dir) {
            Ok(db) => db,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e.into());
            }
        };
        // its folder goes with it from here on, whatever fails next
        let mut inst =
            Instance { db: std::mem::ManuallyDrop::new(db), meta: Meta::default(), marker: marker.clone(), dir };
        inst.meta = read_meta(inst.db())?;
        Ok(inst)
    }
}

/// The table files an instance reads: they change when the primary flushes or compacts.
fn table_files(db: &DB) -> Result<Vec<String>, Follow> {
    let mut names: Vec<String> = db.live_files()?.into_iter().map(|f| f.name).collect();
    names.sort_unstable();
    Ok(names)
}

impl Drop for Partition {
    fn drop(&mut self) {
        self.serving.store(None);
        *self.standby.get_mut() = None;
        let _ = std::fs::remove_dir_all(&self.scratch);
    }
}

#[cfg(test)]
mod tests {
    use rocksdb::{WriteBatch, DB};

    use super::*;

    /// One batch as a shard commits it: its puts and META in one write, then the marker.
    fn commit(db: &DB, dir: &Path, batch: i64, puts: &[(&[u8], &[u8])]) {
        let mut wb = WriteBatch::default();
        for (k, v) in puts {
            wb.put(k, v);
        }
        wb.put(META, format!(r#"{{"last_batch":{batch}}}"#));
        db.write(wb).expect("write");
        let tmp = dir.join(".marker.tmp");
        std::fs::write(&tmp, format!("tok {batch}")).expect("marker");
        std::fs::rename(&tmp, dir.join(MARKER)).expect("marker");
    }

    fn value(inst: &Instance, key: &[u8]) -> Option<Vec<u8>> {
        inst.db().get(key).expect("get")
    }

    /// A shard's primary in `tmp` and the engine's partition over it.
    fn primary_and_partition(tmp: &Path) -> (PathBuf, Arc<DB>, Partition) {
        let primary = tmp.join("p");
        let mut po = Options::default();
        po.create_if_missing(true);
        po.set_max_manifest_file_size(16 << 10); // a new MANIFEST often: opens stay quick
        let db = Arc::new(DB::open(&po, &primary).expect("open"));
        let mut so = Options::default();
        so.set_max_open_files(-1);
        let p = Partition::new(primary.clone(), tmp.join("s"), Arc::new(so));
        (primary, db, p)
    }

    /// A secondary caught up across a flush of the primary (a snapshot's checkpoint does
    /// one) reads the flushed values, not what it had replayed from the WAL before
    /// (facebook/rocksdb#14444: a caught-up memtable shadows them).
    #[test]
    fn a_catch_up_across_a_flush_reads_the_flushed_values() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (primary, db, p) = primary_and_partition(tmp.path());
        commit(&db, &primary, 1, &[(b"k", b"v1")]);
        let (a, _) = p.follow().expect("first instance");
        assert_eq!(value(&a, b"k").as_deref(), Some(&b"v1"[..]));
        drop(a);
        commit(&db, &primary, 2, &[(b"j", b"w2")]);
        let (b, _) = p.follow().expect("second instance"); // the first waits as standby
        drop(b);
        commit(&db, &primary, 3, &[(b"k", b"v3")]);
        db.flush().expect("flush");
        commit(&db, &primary, 4, &[(b"j", b"w4")]);
        let (c, _) = p.follow().expect("the first, caught up");
        assert_eq!(c.meta.last_batch, 4);
        assert_eq!(value(&c, b"k").as_deref(), Some(&b"v3"[..]));
        assert_eq!(value(&c, b"j").as_deref(), Some(&b"w4"[..]));
    }

    /// An instance read while the primary commits and flushes (deleting the WAL it flushed)
    /// holds the batch of the marker read before, never an older one, and its values are
    /// those of its META's batch: an open can list the files between a flush's two steps
    /// and see neither (`Partition::open`).
    #[test]
    fn an_instance_read_during_flushes_holds_the_markers_batch() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (primary, db, p) = primary_and_partition(tmp.path());
        commit(&db, &primary, 0, &[(b"k", b"0")]);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (db, primary, stop) = (db.clone(), primary.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut b = 1;
                while !stop.load(Ordering::Relaxed) {
                    let v = b.to_string();
                    commit(&db, &primary, b, &[(b"k", v.as_bytes())]);
                    db.flush().expect("flush");
                    b += 1;
                    std::thread::sleep(Duration::from_micros(500));
                }
            })
        };
        let (mut short, mut torn) = (Vec::new(), Vec::new());
        let (reads, mut held) = (400, 0);
        for _ in 0..reads {
            let marker = read_marker(&primary).expect("marker");
            // a fresh open, or the standby caught up: both must hold the marker's batch; a
            // follow may give up (files moving under every open it tries: the read then goes
            // to the owner), which checks nothing, so enough of them must hold an instance
            if let Ok((inst, _)) = p.follow() {
                held += 1;
                if inst.meta.last_batch < marker.batch {
                    short.push((inst.meta.last_batch, marker.batch));
                }
                let k = value(&inst, b"k").map(|v| String::from_utf8(v).expect("utf-8"));
                if k != Some(inst.meta.last_batch.to_string()) {
                    torn.push((inst.meta.last_batch, k)); // k is written with each META
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        writer.join().expect("writer");
        assert!(held >= reads / 4, "only {held} of {reads} follows held an instance: too few to say anything");
        assert!(
            short.is_empty(),
            "of {held} instances held, these held an older batch than the marker (held, marker): {short:?}"
        );
        assert!(torn.is_empty(), "a value of another batch than META's (META, value): {torn:?}");
    }
}
