//! The stored value of one (key, window) and what a client reads of it
//! (`qstate.partition.codec`, whose encoder the shard writes with; docs/architecture.md §3
//! and "Value layout" in §5). A value is a fixed-size little-endian record followed by one
//! length-prefixed blob per sketch:
//!
//! `end:i8 | per aggregate: count n:i8 | sum, min, max, value v:i8|f8 has:u1
//!  | avg s:f8 n:i8 | approx_count_distinct (none: its sketch is a blob)`
//! `then per approx_count_distinct: len:u4 | DataSketches HLL bytes`
//!
//! A value written before aggregates were added to its operator is shorter: the added
//! fields read as zero (no value, a count of 0) and no sketch. The arithmetic of `fold`
//! (the panes of a sliding window) is numpy's, bit for bit: sums of doubles are numpy's
//! pairwise sum, long sums saturate at the bound they cross (§3, "Arithmetic never wraps").

use crate::partition::hll;
use crate::spec::{AggKind, Aggregate, OperatorSpec, StateType};

pub const OVERFLOWED: u8 = 2;

/// A value a client reads: an integer, a double, or none.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    Null,
    Long(i64),
    Double(f64),
}

/// Bytes of a stored value that do not parse (a sketch that does not deserialize).
#[derive(Debug, PartialEq, Eq)]
pub struct Corrupt(pub &'static str);

/// Where one aggregate's fields sit in the fixed record.
#[derive(Clone, Copy, Debug)]
enum Slot {
    Count { n: usize },
    Avg { sum: usize, n: usize },
    Sketch { index: usize },
    Num { v: usize, has: usize, long: bool },
}

#[derive(Clone, Debug)]
pub struct Codec {
    slots: Vec<(Aggregate, Slot)>,
    pub width: usize,
    sketches: usize,
}

/// Whether a record keeps `agg`'s value as int64, else float64.
fn stored_as_long(agg: &Aggregate) -> bool {
    agg.kind == AggKind::Count || (agg.kind != AggKind::Avg && agg.ty == StateType::Long)
}

fn i64_at(b: &[u8], at: usize) -> i64 {
    i64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn f64_at(b: &[u8], at: usize) -> f64 {
    f64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// `Aggregate.typed`: the answer in the aggregate's declared type.
fn typed_long(agg: &Aggregate, v: i64) -> Value {
    match agg.ty {
        StateType::Long => Value::Long(v),
        StateType::Double => Value::Double(v as f64),
    }
}

/// `Aggregate.typed` of a double: a long answer truncates toward zero and saturates at the
/// int64 bounds (a long average whose double sum left them), NaN is no value
/// (`tests/vectors/values.json` holds Python's to the same).
fn typed_double(agg: &Aggregate, v: f64) -> Value {
    match agg.ty {
        StateType::Double => Value::Double(v),
        StateType::Long if v.is_nan() => Value::Null,
        // `as` truncates toward zero and saturates
        StateType::Long => Value::Long(v as i64),
    }
}

impl Codec {
    pub fn new(spec: &OperatorSpec) -> Codec {
        let mut at = 8; // end
        let mut sketches = 0;
        let mut slots = Vec::with_capacity(spec.states.len());
        for a in spec.states.values() {
            let slot = match a.kind {
                AggKind::Count => {
                    at += 8;
                    Slot::Count { n: at - 8 }
                }
                AggKind::Avg => {
                    at += 16;
                    Slot::Avg { sum: at - 16, n: at - 8 }
                }
                AggKind::ApproxCountDistinct => {
                    sketches += 1;
                    Slot::Sketch { index: sketches - 1 }
                }
                _ => {
                    at += 9;
                    Slot::Num { v: at - 9, has: at - 1, long: stored_as_long(a) }
                }
            };
            slots.push((a.clone(), slot));
        }
        Codec { slots, width: at, sketches }
    }

    /// The fixed part of a value, zero-padded when written before aggregates were added.
    fn fixed<'a>(&self, v: &'a [u8], buf: &'a mut Vec<u8>) -> &'a [u8] {
        if v.len() >= self.width {
            &v[..self.width]
        } else {
            buf.clear();
            buf.extend_from_slice(v);
            buf.resize(self.width, 0);
            buf
        }
    }

    /// The value's `index`-th sketch, as `Codec._blobs` slices it (clamped, like Python).
    fn blob<'a>(&self, v: &'a [u8], index: usize) -> Option<&'a [u8]> {
        let mut pos = self.width;
        for i in 0..self.sketches {
            if pos + 4 > v.len() {
                return None; // added since the value was written (and every later one too)
            }
            let size = u32::from_le_bytes(v[pos..pos + 4].try_into().expect("4 bytes")) as usize;
            let lo = (pos + 4).min(v.len());
            let hi = (pos + 4).saturating_add(size).min(v.len());
            if i == index {
                return Some(&v[lo..hi.max(lo)]);
            }
            pos += 4 + size;
        }
        None
    }

    /// One stored value's `end` and its `state`-th answer (`Codec.answers_of`).
    pub fn answer_of(&self, value: &[u8], state: usize) -> Result<(i64, Value), Corrupt> {
        let mut buf = Vec::new();
        let f = self.fixed(value, &mut buf);
        let end = i64_at(f, 0);
        let (agg, slot) = &self.slots[state];
        let v = match *slot {
            Slot::Count { n } => typed_long(agg, i64_at(f, n)),
            Slot::Avg { sum, n } => {
                let n = i64_at(f, n);
                if n == 0 {
                    Value::Null
                } else {
                    typed_double(agg, f64_at(f, sum) / n as f64)
                }
            }
            Slot::Sketch { index } => typed_long(agg, hll::estimate(self.blob(value, index))?),
            Slot::Num { v, has, long } => {
                if f[has] == 0 {
                    Value::Null
                } else if long {
                    typed_long(agg, i64_at(f, v))
                } else {
                    typed_double(agg, f64_at(f, v))
                }
            }
        };
        Ok((end, v))
    }

    /// Several stored values of one key combined into one (the panes of a window, in key
    /// order), as `Codec.fold` then `Codec.answers` do: the `state`-th answer.
    pub fn fold_answer(&self, values: &[&[u8]], state: usize) -> Result<Value, Corrupt> {
        let (agg, slot) = &self.slots[state];
        let mut buf = Vec::new();
        let mut fixed: Vec<Vec<u8>> = Vec::with_capacity(values.len());
        for v in values {
            fixed.push(self.fixed(v, &mut buf).to_vec());
        }
        Ok(match *slot {
            Slot::Count { n } => {
                // numpy's int64 sum wraps (a count never gets near it)
                typed_long(agg, fixed.iter().fold(0i64, |s, f| s.wrapping_add(i64_at(f, n))))
            }
            Slot::Avg { sum, n } => {
                let sums: Vec<f64> = fixed.iter().map(|f| f64_at(f, sum)).collect();
                let count = fixed.iter().fold(0i64, |s, f| s.wrapping_add(i64_at(f, n)));
                if count == 0 {
                    Value::Null
                } else {
                    typed_double(agg, numpy_sum(&sums) / count as f64)
                }
            }
            Slot::Sketch { index } => {
                let mut merged: Option<Vec<u8>> = None;
                for (i, v) in values.iter().enumerate() {
                    let blob = self.blob(v, index).map(<[u8]>::to_vec);
                    merged = if i == 0 { blob } else { hll::union(merged, blob, agg.lg_k)? };
                }
                typed_long(agg, hll::estimate(merged.as_deref())?)
            }
            Slot::Num { v, has, long } => {
                let with: Vec<&Vec<u8>> = fixed.iter().filter(|f| f[has] >= 1).collect();
                if with.is_empty() {
                    return Ok(Value::Null);
                }
                match (agg.kind, long) {
                    (AggKind::Sum, true) => Value::Long(saturating_sum(with.iter().map(|f| i64_at(f, v)))),
                    (AggKind::Sum, false) => {
                        let vals: Vec<f64> = with.iter().map(|f| f64_at(f, v)).collect();
                        typed_double(agg, numpy_sum(&vals))
                    }
                    (AggKind::Min | AggKind::Max, true) => {
                        let it = with.iter().map(|f| i64_at(f, v));
                        let x = if agg.kind == AggKind::Min { it.min() } else { it.max() };
                        typed_long(agg, x.expect("non-empty"))
                    }
                    (AggKind::Min | AggKind::Max, false) => {
                        let vals: Vec<f64> = with.iter().map(|f| f64_at(f, v)).collect();
                        let x = if agg.kind == AggKind::Min { fmin_reduce(&vals) } else { maximum_reduce(&vals) };
                        // a zero is +0.0, as the shard's fold answers it (numpy's reduce keeps
                        // either zero, by its SIMD blocking): -0.0 + 0.0 == +0.0
                        typed_double(agg, x + 0.0)
                    }
                    _ => return Err(Corrupt("a Spark-state value in panes")),
                }
            }
        })
    }
}

/// A long sum in order, exact, then the bound it crossed (a record at a bound is saturated).
fn saturating_sum(vals: impl Iterator<Item = i64>) -> i64 {
    let mut total: i128 = 0;
    for v in vals {
        if v == i64::MAX || v == i64::MIN {
            return v;
        }
        total += i128::from(v);
        if total >= i128::from(i64::MAX) || total <= i128::from(i64::MIN) {
            return if total > 0 { i64::MAX } else { i64::MIN };
        }
    }
    total as i64
}

/// numpy's `add.reduce` of a float64 array: `0.0 + pairwise(a)` (measured against numpy 2.4:
/// tests/service/partition/test_vectors.py holds the two equal).
pub fn numpy_sum(a: &[f64]) -> f64 {
    0.0 + pairwise(a)
}

fn pairwise(a: &[f64]) -> f64 {
    let n = a.len();
    if n < 8 {
        let mut res = -0.0;
        for x in a {
            res += x;
        }
        res
    } else if n <= 128 {
        let mut r = [0.0f64; 8];
        r.copy_from_slice(&a[..8]);
        let mut i = 8;
        while i < n - (n % 8) {
            for j in 0..8 {
                r[j] += a[i + j];
            }
            i += 8;
        }
        let mut res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        while i < n {
            res += a[i];
            i += 1;
        }
        res
    } else {
        let mut n2 = n / 2;
        n2 -= n2 % 8;
        pairwise(&a[..n2]) + pairwise(&a[n2..])
    }
}

/// `np.fmin.reduce`: NaN is skipped unless every value is NaN.
fn fmin_reduce(a: &[f64]) -> f64 {
    a[1..].iter().fold(a[0], |acc, &x| if acc <= x || x.is_nan() { acc } else { x })
}

/// `np.maximum.reduce`: NaN wins.
fn maximum_reduce(a: &[f64]) -> f64 {
    a[1..].iter().fold(a[0], |acc, &x| if acc >= x || acc.is_nan() { acc } else { x })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vectors;

    /// The answer a vector states: none, `{"i64": "digits"}`, `{"f64": "bits as hex"}`.
    fn expected(v: &serde_json::Value) -> Value {
        match v {
            serde_json::Value::Null => Value::Null,
            serde_json::Value::Object(o) if o.contains_key("i64") => {
                Value::Long(o["i64"].as_str().expect("digits").parse().expect("i64"))
            }
            serde_json::Value::Object(o) => {
                Value::Double(f64::from_bits(u64::from_str_radix(o["f64"].as_str().expect("bits"), 16).expect("hex")))
            }
            other => panic!("not an answer: {other}"),
        }
    }

    fn same(a: Value, b: Value) -> bool {
        match (a, b) {
            (Value::Double(x), Value::Double(y)) => x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
            _ => a == b,
        }
    }

    /// tests/vectors/values.json: stored values as the shard writes them, and each state's
    /// answer, of one value or a window's panes folded (the shard's Python reads the same).
    #[test]
    fn as_the_vectors_say() {
        let v = vectors::load("values.json");
        for case in v["cases"].as_array().expect("cases") {
            let name = case["name"].as_str().expect("name");
            let spec = OperatorSpec::from_json(case["spec"].to_string().as_bytes()).expect("spec");
            let codec = Codec::new(&spec);
            let values: Vec<Vec<u8>> = case["values"].as_array().expect("values").iter().map(vectors::hex).collect();
            let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
            for (state, want) in case["answers"].as_array().expect("answers").iter().enumerate() {
                let got = if values.len() == 1 && !spec.panes() {
                    let (end, got) = codec.answer_of(&values[0], state).expect("a value");
                    assert_eq!(Some(end), case["end"].as_i64(), "{name}: end");
                    got
                } else {
                    codec.fold_answer(&refs, state).expect("panes")
                };
                assert!(same(got, expected(want)), "{name}, state {state}: {got:?} != {want}");
            }
        }
    }

    #[test]
    fn saturates() {
        assert_eq!(saturating_sum([1, 2, 3].into_iter()), 6);
        assert_eq!(saturating_sum([i64::MAX - 1, 5, -100].into_iter()), i64::MAX);
        assert_eq!(saturating_sum([i64::MIN, 5].into_iter()), i64::MIN);
        assert_eq!(saturating_sum([-5, i64::MIN + 3].into_iter()), i64::MIN);
    }

    #[test]
    fn numpy_sum_keeps_zero_sign_as_numpy() {
        assert_eq!(numpy_sum(&[-0.0]).to_bits(), 0.0f64.to_bits());
        assert_eq!(numpy_sum(&[]).to_bits(), 0.0f64.to_bits());
    }

    #[test]
    fn nan_rules() {
        assert_eq!(fmin_reduce(&[f64::NAN, 2.0, 1.0]), 1.0);
        assert!(fmin_reduce(&[f64::NAN, f64::NAN]).is_nan());
        assert!(maximum_reduce(&[1.0, f64::NAN, 2.0]).is_nan());
    }
}
