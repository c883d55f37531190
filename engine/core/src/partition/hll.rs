//! HyperLogLog sketches (`approx_count_distinct`): the same DataSketches C++ library the
//! Python shard unions them with (`datasketches`), so estimates and unions are the same
//! numbers (`tests/vectors/values.json`).

use apache_datasketches::hll::{HllSketch, HllUnion, TargetHllType};

use crate::partition::codec::Corrupt;

/// `round(hll_sketch.deserialize(blob).get_estimate())`, 0 without a sketch; Python's round
/// is half to even.
pub fn estimate(blob: Option<&[u8]>) -> Result<i64, Corrupt> {
    match blob {
        None | Some([]) => Ok(0),
        Some(b) => {
            let s = HllSketch::deserialize(b).map_err(|_| Corrupt("an unreadable sketch"))?;
            Ok(s.get_estimate().round_ties_even() as i64)
        }
    }
}

/// `codec._union`: two sketches' union as HLL_8 updatable bytes; an absent or empty side
/// gives the other (`if not a: return b; if not b: return a`).
pub fn union(a: Option<Vec<u8>>, b: Option<Vec<u8>>, lg_k: u8) -> Result<Option<Vec<u8>>, Corrupt> {
    let a = match a {
        Some(a) if !a.is_empty() => a,
        _ => return Ok(b),
    };
    let b = match b {
        Some(b) if !b.is_empty() => b,
        _ => return Ok(Some(a)),
    };
    let bad = |_| Corrupt("an unreadable sketch");
    let mut u = HllUnion::new(lg_k).map_err(bad)?;
    u.update_sketch(&HllSketch::deserialize(&a).map_err(bad)?);
    u.update_sketch(&HllSketch::deserialize(&b).map_err(bad)?);
    Ok(Some(u.get_result(TargetHllType::Hll8).serialize_updatable()))
}
