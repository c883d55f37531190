//! The commit marker a shard rewrites after every commit (`qstate.partition.files`):
//! `{data_dir}/{server_id}/{job}/{operator}/p{partition:05d}/QSTATE_COMMITTED` holding
//! `"{incarnation} {last batch}"`. No marker: the partition is not (any more) served there.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

pub const MARKER: &str = "QSTATE_COMMITTED";

pub fn partition_dir(server_dir: &Path, job: &str, operator: &str, partition: u32) -> PathBuf {
    server_dir.join(job).join(operator).join(format!("p{partition:05}"))
}

/// What changes whenever the marker is rewritten (a new file each time): inode, mtime, size.
pub type Signature = (u64, i64, u64);

pub fn signature(file: &Path) -> std::io::Result<Signature> {
    let m = std::fs::metadata(file)?;
    Ok((m.ino(), m.mtime() * 1_000_000_000 + m.mtime_nsec(), m.size()))
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Marker {
    pub incarnation: String,
    pub batch: i64,
}

pub fn read_marker(dir: &Path) -> std::io::Result<Marker> {
    let text = std::fs::read_to_string(dir.join(MARKER))?;
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, format!("marker {text:?}"));
    let (token, batch) = text.rsplit_once(' ').ok_or_else(bad)?;
    let batch = batch.trim().parse::<i64>().map_err(|_| bad())?;
    Ok(Marker { incarnation: token.to_string(), batch })
}
