//! The partitions a router reads in-process: those of shard servers on its host, while
//! their owner reports them ready and its process lives (docs/architecture.md §5). Python
//! pushes what it learns (the co-located servers from storage, each one's ready partitions
//! from the router's Describe poller); every other read goes to the owner over gRPC.

pub mod secondary;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use rocksdb::{BlockBasedOptions, Cache, Options};

use crate::address::PartitionId;
use crate::partition::codec::Codec;
use crate::partition::marker::partition_dir;
use crate::partition::read::{page, read_latest_states, read_many, ReadError, Reading, Window};
use crate::read::Hit;
use crate::spec::OperatorSpec;
use secondary::{Follow, Instance, Partition};

/// A shard server on this host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalServer {
    pub address: String,
    pub data_dir: PathBuf,
    pub pid: i32,
}

/// An operator as the engine reads it.
pub struct Operator {
    pub spec: OperatorSpec,
    pub codec: Codec,
}

impl Operator {
    pub fn new(spec: OperatorSpec) -> Operator {
        let codec = Codec::new(&spec);
        Operator { spec, codec }
    }
}

#[derive(Default)]
struct State {
    servers: HashMap<String, LocalServer>,
    ready: HashMap<String, HashSet<PartitionId>>,
    open: HashMap<(String, PartitionId), Arc<Partition>>,
}

pub struct Local {
    scratch: PathBuf,
    // partitions opened so far: each one's scratch folder is its own (`lookup`)
    partitions_opened: AtomicU64,
    opts: Arc<Options>,
    state: RwLock<State>,
}

/// Why a local read did not answer.
#[derive(Debug)]
pub enum Miss {
    /// not on this host, not ready, its process gone, its marker gone: ask the owner
    NotHere,
    /// RocksDB failed under the read (files moving): the partition was closed; ask the owner
    Failed(String),
    /// bytes that do not parse as the partition's layout (the owner's would not either)
    Corrupt(String),
}

fn alive(pid: i32) -> bool {
    // signal 0: exists (EPERM: exists, not ours)
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// What every secondary instance of a shard's partition is opened with (the router's own
/// also share one block cache: `Local::new`).
fn secondary_options() -> Options {
    let mut opts = Options::default();
    opts.set_max_open_files(-1); // required by secondary instances
    opts
}

impl Local {
    /// `cache_bytes`: one LRU block cache every secondary shares.
    pub fn new(scratch: PathBuf, cache_bytes: usize) -> Local {
        let mut opts = secondary_options();
        let mut table = BlockBasedOptions::default();
        table.set_block_cache(&Cache::new_lru_cache(cache_bytes));
        opts.set_block_based_table_factory(&table);
        Local {
            scratch,
            partitions_opened: AtomicU64::new(0),
            opts: Arc::new(opts),
            state: RwLock::new(State::default()),
        }
    }

    /// The co-located servers (their partitions close when a server goes or restarts).
    pub fn set_servers(&self, servers: Vec<LocalServer>) {
        let mut st = self.state.write();
        let next: HashMap<String, LocalServer> = servers.into_iter().map(|s| (s.address.clone(), s)).collect();
        let old = std::mem::take(&mut st.servers);
        st.open.retain(|(address, _), _| next.get(address).is_some_and(|s| old.get(address) == Some(s)));
        st.servers = next;
    }

    /// The partitions `address` reports ready (the others close).
    pub fn set_ready(&self, address: &str, ready: HashSet<PartitionId>) {
        let mut st = self.state.write();
        st.open.retain(|(a, pid), _| a != address || ready.contains(pid));
        st.ready.insert(address.to_string(), ready);
    }

    pub fn close(&self) {
        let mut st = self.state.write();
        st.open.clear();
        let _ = std::fs::remove_dir_all(&self.scratch);
    }

    /// The partition when it is read here (its owner on this host, alive, reporting it
    /// ready), opened on first use; None: ask the owner.
    pub fn lookup(&self, owner: &str, pid: &PartitionId) -> Option<Arc<Partition>> {
        let key = (owner.to_string(), pid.clone());
        {
            let st = self.state.read();
            let server = st.servers.get(owner)?;
            if !st.ready.get(owner).is_some_and(|r| r.contains(pid)) || !alive(server.pid) {
                return None;
            }
            if let Some(p) = st.open.get(&key) {
                return Some(p.clone());
            }
        }
        let mut st = self.state.write();
        let server = st.servers.get(owner)?;
        let primary = partition_dir(&server.data_dir, &pid.job, &pid.operator, pid.partition);
        // a folder of its own: a partition closed while a reader or the follower still holds
        // it removes its folder when dropped, after a new one for the same key was opened
        let scratch =
            partition_dir(&self.scratch.join(owner.replace(':', "_")), &pid.job, &pid.operator, pid.partition)
                .join(format!("g{}", self.partitions_opened.fetch_add(1, Ordering::Relaxed)));
        let p =
            st.open.entry(key).or_insert_with(|| Arc::new(Partition::new(primary, scratch, self.opts.clone()))).clone();
        Some(p)
    }

    fn drop_partition(&self, owner: &str, pid: &PartitionId) {
        self.state.write().open.remove(&(owner.to_string(), pid.clone()));
    }

    /// The instance to read when it is current as of the marker (one `stat`, no RocksDB
    /// work); Ok(None): a catch-up is due (`instance`).
    pub fn current(&self, owner: &str, pid: &PartitionId, p: &Partition) -> Result<Option<Arc<Instance>>, Miss> {
        p.current().map_err(|e| self.missed(owner, pid, e))
    }

    fn missed(&self, owner: &str, pid: &PartitionId, e: Follow) -> Miss {
        self.drop_partition(owner, pid);
        match e {
            Follow::Gone(_) => Miss::NotHere,
            Follow::Db(m) => Miss::Failed(m),
        }
    }

    /// The instance to read `pid` from, fresh as of its marker, or why not; may catch the
    /// partition up (how long it took: `Partition::follow`), or wait for the one catching it
    /// up (blocking).
    pub fn instance(&self, owner: &str, pid: &PartitionId) -> Result<(Arc<Instance>, Option<Duration>), Miss> {
        let p = self.lookup(owner, pid).ok_or(Miss::NotHere)?;
        match p.current() {
            Ok(Some(inst)) => Ok((inst, None)),
            Ok(None) => p.follow(),
            Err(e) => Err(e),
        }
        .map_err(|e| self.missed(owner, pid, e))
    }

    /// The follower's pass (`Engine::start_follower`): every open partition read within
    /// `idle` caught up with its marker now, off the read path; how long each catch-up took.
    /// A partition whose marker is gone or whose files fail closes, as a read would close it.
    pub fn keep_up(&self, idle: Duration) -> Vec<Duration> {
        let open: Vec<((String, PartitionId), Arc<Partition>)> =
            self.state.read().open.iter().map(|(k, p)| (k.clone(), p.clone())).collect();
        let mut took = Vec::new();
        for ((owner, pid), p) in open {
            match p.keep_up(idle) {
                Ok(Some(d)) => took.push(d),
                Ok(None) => {}
                Err(e) => {
                    self.missed(&owner, &pid, e);
                }
            }
        }
        took
    }

    /// Whether `pid` would be read here (without opening it): for a caller that must choose
    /// a thread before reading.
    pub fn is_here(&self, owner: &str, pid: &PartitionId) -> bool {
        let st = self.state.read();
        st.servers.get(owner).is_some_and(|s| alive(s.pid)) && st.ready.get(owner).is_some_and(|r| r.contains(pid))
    }

    /// Keys of one partition read from `inst` in each of `states` (per state, then per key),
    /// paged at `limit`: the latest windows with one seek of each key's record for all of them
    /// (`read_latest_states`), a range or a sliding window state by state.
    // the partition (owner, pid, inst) and the read as the core carries it: a struct for them
    // would be built only to be taken apart here
    #[allow(clippy::too_many_arguments)]
    pub fn read_states(
        &self,
        owner: &str,
        pid: &PartitionId,
        inst: &Instance,
        op: &Operator,
        states: &[usize],
        keys: &[&str],
        range: Option<(i64, i64)>,
        limit: usize,
    ) -> Result<Vec<Vec<Hit>>, Miss> {
        let per_state = if range.is_none() && !op.spec.panes() {
            read_latest_states(inst.db(), &op.spec, &op.codec, states, keys)
        } else {
            states
                .iter()
                .map(|&state| {
                    let r = Reading { spec: &op.spec, codec: &op.codec, state };
                    read_many(inst.db(), &r, &inst.meta, keys, range, limit + 1)
                })
                .collect()
        };
        self.hits(owner, pid, inst, per_state, limit)
    }

    /// Windows read from `inst` (per state, then per key) as hits paged at `limit`; a
    /// failed read closes the partition.
    fn hits(
        &self,
        owner: &str,
        pid: &PartitionId,
        inst: &Instance,
        read: Result<Vec<Vec<Vec<Window>>>, ReadError>,
        limit: usize,
    ) -> Result<Vec<Vec<Hit>>, Miss> {
        match read {
            Ok(per_state) => Ok(per_state
                .into_iter()
                .map(|per_key| {
                    per_key
                        .into_iter()
                        .map(|ws| {
                            let (windows, next_from) = page(ws, limit);
                            Hit {
                                found: !windows.is_empty(),
                                batch: inst.meta.last_batch,
                                watermark_ms: inst.meta.watermark_ms,
                                windows,
                                next_from,
                            }
                        })
                        .collect()
                })
                .collect()),
            Err(ReadError::Corrupt(why)) => Err(Miss::Corrupt(why)),
            Err(ReadError::Db(m)) => {
                self.drop_partition(owner, pid);
                Err(Miss::Failed(m))
            }
        }
    }
}

/// Keys' windows from a partition's folder, with its META's (batch, watermark): the engine's
/// reader on bytes a shard wrote, for tools and the tests that hold it to the shard's own
/// reader (`tests/service/partition/test_readers.py`). Opened as the router opens a
/// co-located partition (a secondary instance in a scratch folder of its own, caught up with
/// the marker's batch), never read-only: a read-only open of a live primary can list a table
/// file that a compaction under way then deletes ("Can't access 000009.sst", seen in CI).
#[allow(clippy::type_complexity)]
pub fn read_folder(
    path: &std::path::Path,
    op: &Operator,
    state: usize,
    keys: &[String],
    range: Option<(i64, i64)>,
    limit: usize,
) -> Result<((i64, i64), Vec<(Vec<Window>, Option<i64>)>), String> {
    static OPENED: AtomicU64 = AtomicU64::new(0);
    let n = OPENED.fetch_add(1, Ordering::Relaxed);
    let scratch = std::env::temp_dir().join(format!("qstate-read-folder-{}-{n}", std::process::id()));
    // its scratch folder goes when `p` is dropped
    let p = Partition::new(path.to_path_buf(), scratch, Arc::new(secondary_options()));
    let (inst, _) = p.follow().map_err(|e| format!("{}: {e:?}", path.display()))?;
    let meta = &inst.meta;
    let r = Reading { spec: &op.spec, codec: &op.codec, state };
    let ks: Vec<&str> = keys.iter().map(String::as_str).collect();
    let per_key = read_many(inst.db(), &r, meta, &ks, range, limit + 1).map_err(|e| format!("{e:?}"))?;
    Ok(((meta.last_batch, meta.watermark_ms), per_key.into_iter().map(|ws| page(ws, limit)).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_opened_again_gets_a_folder_of_its_own() {
        let tmp = std::env::temp_dir().join(format!("qstate-local-{}", std::process::id()));
        let local = Local::new(tmp.join("scratch"), 1 << 20);
        let server = LocalServer { address: "a:1".into(), data_dir: tmp.join("data"), pid: std::process::id() as i32 };
        local.set_servers(vec![server]);
        let pid = PartitionId { job: "j".into(), operator: "op".into(), partition: 3 };
        local.set_ready("a:1", HashSet::from([pid.clone()]));
        let first = local.lookup("a:1", &pid).expect("here");
        local.drop_partition("a:1", &pid); // closed while `first` is still held
        let second = local.lookup("a:1", &pid).expect("here");
        assert_ne!(first.scratch(), second.scratch());
        assert_eq!(first.primary(), second.primary());
        local.close();
    }
}
