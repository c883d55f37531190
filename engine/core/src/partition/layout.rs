//! Byte layout of one partition's RocksDB (`qstate.partition.layout`, which writes it):
//!
//! `d | len(key):u16 | key | start:u64`            -> value (`codec`)
//! `d | len(key):u16 | key | pane:u64 | tag:u64`   -> value of a (sub-)pane of a sliding window
//! `m`                                             -> the META record (`meta`)
//!
//! Times are epoch ms shifted by 2**63 so big-endian bytes sort like signed integers.

pub const DATA: u8 = b'd';
pub const META: &[u8] = b"m";
/// The start of non-windowed state.
pub const NO_WINDOW: i64 = i64::MIN;

pub fn enc_time(ms: i64) -> [u8; 8] {
    ((ms as u64) ^ (1u64 << 63)).to_be_bytes()
}

pub fn dec_time(b: &[u8]) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    (u64::from_be_bytes(a) ^ (1u64 << 63)) as i64
}

/// Where a key's entries begin: `d | len | key`.
pub fn key_prefix(key: &str) -> Vec<u8> {
    let k = key.as_bytes();
    let mut out = Vec::with_capacity(3 + k.len() + 16);
    out.push(DATA);
    out.extend_from_slice(&(k.len() as u16).to_be_bytes());
    out.extend_from_slice(k);
    out
}

/// The start of a window's data key (its last 8 bytes).
pub fn start_of(data: &[u8]) -> i64 {
    dec_time(&data[data.len() - 8..])
}

/// The pane start of a pane's data key.
pub fn pane_of(data: &[u8]) -> i64 {
    dec_time(&data[data.len() - 16..data.len() - 8])
}

/// The tag of a pane's data key.
pub fn tag_of(data: &[u8]) -> i64 {
    dec_time(&data[data.len() - 8..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_sort_as_signed() {
        assert!(enc_time(-1) < enc_time(0));
        assert!(enc_time(i64::MIN) < enc_time(i64::MIN + 1));
        assert_eq!(dec_time(&enc_time(-123)), -123);
        assert_eq!(dec_time(&enc_time(i64::MAX)), i64::MAX);
    }
}
