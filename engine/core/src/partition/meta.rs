//! A partition's META record (`qstate.partition.meta`): the batch its state reflects, that
//! batch's watermark, the epoch that wrote it and the rank index's version, written in the
//! same WriteBatch as the batch's rows.

use serde::Deserialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Meta {
    #[serde(default = "minus_one")]
    pub last_batch: i64,
    #[serde(default)]
    pub watermark_ms: i64,
    #[serde(default)]
    pub epoch: i64,
    #[serde(default)]
    pub ranks: i64,
}

fn minus_one() -> i64 {
    -1
}

impl Default for Meta {
    fn default() -> Self {
        Meta { last_batch: -1, watermark_ms: 0, epoch: 0, ranks: 0 }
    }
}

impl Meta {
    /// The record's Meta; a partition that never committed (no record) is `Meta::default()`.
    pub fn decode(raw: Option<&[u8]>) -> Result<Meta, String> {
        match raw {
            None => Ok(Meta::default()),
            Some(b) => serde_json::from_slice(b).map_err(|e| format!("META record: {e}")),
        }
    }
}
