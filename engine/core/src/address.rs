//! Addresses and partitioning (docs/architecture.md §2). The jobs and the shard check names
//! and compute partitions in Python too (`qstate.core.address`): both are pinned by
//! `tests/vectors/address.json` (partitions of fixed keys as Spark computes them, names and
//! keys with the messages that refuse them), which `cargo test` and pytest read.

use xxhash_rust::xxh64::xxh64;

use crate::errors::{quoted, Failure};

pub const SEED: u64 = 42;
pub const MAX_KEY_BYTES: usize = 1024;

/// `pmod(xxhash64(utf8(key), seed=42), partitions)` on the signed 64-bit hash: Spark SQL's
/// `pmod(xxhash64(key), P)` for a string column.
pub fn partition_of(key: &str, partitions: u32) -> u32 {
    let h = xxh64(key.as_bytes(), SEED) as i64;
    h.rem_euclid(i64::from(partitions)) as u32
}

/// `[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}`.
pub fn is_name(value: &str) -> bool {
    let b = value.as_bytes();
    if b.is_empty() || b.len() > 64 {
        return false;
    }
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    word(b[0]) && b[1..].iter().all(|&c| word(c) || c == b'.' || c == b'-')
}

/// `value` as a name of `kind` (job, operator, state, savepoint name), or the 400 saying what
/// a name may be.
pub fn check_name(kind: &str, value: &str) -> Result<(), Failure> {
    if is_name(value) {
        return Ok(());
    }
    Err(Failure::invalid_address(format!(
        "invalid {kind} {}: use 1-64 characters from A-Z a-z 0-9 _ . - (not starting with . or -)",
        quoted(value, 80)
    )))
}

/// A key is 1 to 1024 bytes of UTF-8 (a `&str` is always UTF-8), or the 400 saying so.
pub fn check_key(key: &str) -> Result<(), Failure> {
    if key.is_empty() {
        return Err(Failure::invalid_address(format!("empty key: a key is 1 to {MAX_KEY_BYTES} bytes of UTF-8")));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(Failure::invalid_address(format!(
            "key is {} bytes of UTF-8; at most {MAX_KEY_BYTES} are allowed",
            key.len()
        )));
    }
    Ok(())
}

/// The 400 of a key (or name) whose bytes are not UTF-8.
pub fn not_utf8(what: &str) -> Failure {
    Failure::invalid_address(format!("{what} is not valid UTF-8: send it as UTF-8, percent-encoded in a path"))
}

/// One partition of one operator.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PartitionId {
    pub job: String,
    pub operator: String,
    pub partition: u32,
}

impl std::fmt::Display for PartitionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.job, self.operator, self.partition)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vectors;

    /// tests/vectors/address.json: the partitions Spark gives fixed keys, and which names and
    /// keys are refused with which message (Python's `qstate.core.address` reads the same file).
    #[test]
    fn as_the_vectors_say() {
        let v = vectors::load("address.json");
        for case in v["partitions"].as_array().expect("partitions") {
            let key = vectors::text(&case["key"]);
            let p = case["partitions"].as_u64().expect("P") as u32;
            assert_eq!(
                u64::from(partition_of(&key, p)),
                case["partition"].as_u64().expect("partition"),
                "{key:?} of {p}"
            );
        }
        for case in v["names"].as_array().expect("names") {
            let name = vectors::text(&case["value"]);
            let got = check_name("job", &name).err().map(|f| f.message);
            assert_eq!(got.as_deref(), case["message"].as_str(), "{name:?}");
        }
        for case in v["keys"].as_array().expect("keys") {
            let key = vectors::text(&case["value"]);
            assert_eq!(key.len() as u64, case["bytes"].as_u64().expect("bytes"), "{key:?}");
            let got = check_key(&key).err().map(|f| f.message);
            assert_eq!(got.as_deref(), case["message"].as_str(), "{key:?}");
        }
    }
}
