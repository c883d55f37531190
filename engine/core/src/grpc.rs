//! The gRPC face of the read core: the public API's `Get` and `MultiGet` (proto/qstate.proto)
//! from the request's bytes to the answer's bytes, or the failure as gRPC says it (its code,
//! message and trailers: `errors::Failure::trailers`). grpcio stays the server for now: Python
//! hands the bytes and the caller's `authorization` here and sends what comes back
//! (docs/architecture.md §5, one read core).

use prost::Message;

use crate::auth::Book;
use crate::errors::Failure;
use crate::partition::codec::Value;
use crate::publicpb::{window, GetRequest, MultiGetRequest, StateValue, Window};
use crate::read::{Ask, Hit, Outcome};
use crate::time::FAR;

/// Which method.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Get,
    MultiGet,
}

impl Method {
    pub fn name(self) -> &'static str {
        match self {
            Method::Get => "Get",
            Method::MultiGet => "MultiGet",
        }
    }
}

/// Both ends absent: the latest window; else an absent end is open.
fn range(from: Option<i64>, to: Option<i64>) -> Option<(i64, i64)> {
    if from.is_none() && to.is_none() {
        return None;
    }
    Some((from.unwrap_or(-FAR).clamp(-FAR, FAR), to.unwrap_or(FAR).clamp(-FAR, FAR)))
}

/// The request as the core's `Ask` (its job and operator checked against the caller's token
/// first, when the router asks for tokens), or the refusal.
pub fn ask(method: Method, raw: &[u8], book: Option<&Book>, authorization: Option<&[u8]>) -> Result<Ask, Failure> {
    let who = |job: &str, op: &str| -> Result<(), Failure> {
        match book {
            Some(b) => b.authenticate(authorization)?.check(job, Some(op)),
            None => Ok(()),
        }
    };
    let bad = |e: prost::DecodeError| Failure::invalid(format!("the request is not a {}Request: {e}", method.name()));
    match method {
        Method::Get => {
            let r = GetRequest::decode(raw).map_err(bad)?;
            who(&r.job, &r.operator)?;
            Ok(Ask {
                job: r.job,
                operator: r.operator,
                states: vec![r.state],
                keys: vec![r.key],
                point: true,
                range: range(r.from_ms, r.to_ms),
                limit: r.limit.map(i64::from),
                min_batch: r.min_batch,
                savepoint: r.savepoint,
                local: true,
                allow_stale: r.allow_stale,
                ..Ask::default()
            })
        }
        Method::MultiGet => {
            let r = MultiGetRequest::decode(raw).map_err(bad)?;
            who(&r.job, &r.operator)?;
            let several = !r.states.is_empty();
            if several && !r.state.is_empty() {
                return Err(Failure::invalid("name the states in 'states', or one in 'state': not both"));
            }
            Ok(Ask {
                job: r.job,
                operator: r.operator,
                states: if several { r.states } else { vec![r.state] },
                several,
                keys: r.keys,
                range: range(r.from_ms, r.to_ms),
                limit: r.limit.map(i64::from),
                min_batch: r.min_batch,
                savepoint: r.savepoint,
                local: true,
                allow_stale: r.allow_stale,
                ..Ask::default()
            })
        }
    }
}

/// One key's answer as a `StateValue`.
pub fn value(job: &str, operator: &str, state: &str, key: &str, h: &Hit) -> StateValue {
    StateValue {
        job: job.to_string(),
        operator: operator.to_string(),
        state: state.to_string(),
        key: key.to_string(),
        found: h.found,
        batch: h.batch,
        watermark_ms: h.watermark_ms,
        windows: h
            .windows
            .iter()
            .map(|w| Window {
                start_ms: w.start,
                end_ms: w.start.map(|_| w.end.unwrap_or(0)),
                value: match w.value {
                    Value::Null => None,
                    Value::Long(v) => Some(window::Value::IntValue(v)),
                    Value::Double(v) => Some(window::Value::DoubleValue(v)),
                },
            })
            .collect(),
        next_from_ms: h.next_from,
    }
}

/// The method's answer bytes: `Get` of a key with no data is NOT_FOUND as of its batch.
/// Written from the hits as `value(..).encode_to_vec()` would write them (the tests hold them
/// to it), without a `StateValue` of owned copies of four names a key.
pub fn answer(method: Method, read: Result<Outcome, Failure>) -> Result<Vec<u8>, Failure> {
    let o = read?;
    let spec = &o.entry.op.spec;
    match method {
        Method::Get => {
            let (h, key, state) = (&o.hits[0][0], &o.keys[0], o.state_name(0));
            if !h.found {
                return Err(Failure::absent(key, &spec.job, &spec.operator, state, h.batch, h.watermark_ms));
            }
            let v = Named { job: &spec.job, operator: &spec.operator, state, key, hit: h };
            let mut buf = Vec::with_capacity(v.len());
            v.put(&mut buf);
            Ok(buf)
        }
        Method::MultiGet => {
            let named = |(state, key, hit)| Named { job: &spec.job, operator: &spec.operator, state, key, hit };
            let total: usize = o.by_key().map(|x| wire::framed(1, named(x).len())).sum();
            let mut buf = Vec::with_capacity(total);
            for x in o.by_key() {
                let v = named(x);
                wire::frame(1, v.len(), &mut buf);
                v.put(&mut buf);
            }
            Ok(buf)
        }
    }
}

/// One key's `StateValue`, borrowed: what `value` builds, encoded in place.
struct Named<'a> {
    job: &'a str,
    operator: &'a str,
    state: &'a str,
    key: &'a str,
    hit: &'a Hit,
}

impl Named<'_> {
    fn len(&self) -> usize {
        let h = self.hit;
        let mut n = wire::str_len(1, self.job)
            + wire::str_len(2, self.operator)
            + wire::str_len(3, self.state)
            + wire::str_len(4, self.key);
        if h.found {
            n += wire::key_len(5) + 1;
        }
        n += wire::i64_len(6, h.batch) + wire::i64_len(7, h.watermark_ms);
        n += h.windows.iter().map(|w| wire::framed(8, window_len(w))).sum::<usize>();
        n + h.next_from.map_or(0, |v| wire::key_len(9) + wire::varint_len(v))
    }

    fn put(&self, buf: &mut Vec<u8>) {
        let h = self.hit;
        wire::put_str(1, self.job, buf);
        wire::put_str(2, self.operator, buf);
        wire::put_str(3, self.state, buf);
        wire::put_str(4, self.key, buf);
        if h.found {
            wire::put_varint_field(5, 1, buf);
        }
        wire::put_i64(6, h.batch, buf);
        wire::put_i64(7, h.watermark_ms, buf);
        for w in &h.windows {
            wire::frame(8, window_len(w), buf);
            if let Some(start) = w.start {
                wire::put_varint_field(1, start, buf);
                wire::put_varint_field(2, w.end.unwrap_or(0), buf);
            }
            match w.value {
                Value::Null => {}
                Value::Long(v) => wire::put_varint_field(3, v, buf),
                Value::Double(v) => {
                    prost::encoding::encode_key(4, prost::encoding::WireType::SixtyFourBit, buf);
                    buf.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
        if let Some(v) = h.next_from {
            wire::put_varint_field(9, v, buf);
        }
    }
}

/// A `Window`'s bytes: its start and end when windowed (both, as `value` sets them), its value.
fn window_len(w: &crate::partition::read::Window) -> usize {
    let ends = w.start.map_or(0, |s| {
        wire::key_len(1) + wire::varint_len(s) + wire::key_len(2) + wire::varint_len(w.end.unwrap_or(0))
    });
    ends + match w.value {
        Value::Null => 0,
        Value::Long(v) => wire::key_len(3) + wire::varint_len(v),
        Value::Double(_) => wire::key_len(4) + 8,
    }
}

/// Protobuf's wire rules for the fields above (proto3: an empty string and a zero int64 are
/// left out; an `optional` or `oneof` field is written when set, zero or not).
mod wire {
    use prost::encoding::{encode_key, encode_varint, encoded_len_varint, WireType};

    pub use prost::encoding::key_len;

    pub fn varint_len(v: i64) -> usize {
        encoded_len_varint(v as u64)
    }

    pub fn str_len(tag: u32, s: &str) -> usize {
        if s.is_empty() {
            0
        } else {
            framed(tag, s.len())
        }
    }

    pub fn i64_len(tag: u32, v: i64) -> usize {
        if v == 0 {
            0
        } else {
            key_len(tag) + varint_len(v)
        }
    }

    /// A length-delimited field of `len` bytes, with its key and length.
    pub fn framed(tag: u32, len: usize) -> usize {
        key_len(tag) + encoded_len_varint(len as u64) + len
    }

    pub fn frame(tag: u32, len: usize, buf: &mut Vec<u8>) {
        encode_key(tag, WireType::LengthDelimited, buf);
        encode_varint(len as u64, buf);
    }

    pub fn put_str(tag: u32, s: &str, buf: &mut Vec<u8>) {
        if !s.is_empty() {
            frame(tag, s.len(), buf);
            buf.extend_from_slice(s.as_bytes());
        }
    }

    pub fn put_i64(tag: u32, v: i64, buf: &mut Vec<u8>) {
        if v != 0 {
            put_varint_field(tag, v, buf);
        }
    }

    pub fn put_varint_field(tag: u32, v: i64, buf: &mut Vec<u8>) {
        encode_key(tag, WireType::Varint, buf);
        encode_varint(v as u64, buf);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::partition::read::Window as Read;
    use crate::publicpb::MultiGetResponse;

    fn a_value() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<i64>().prop_map(Value::Long),
            prop_oneof![any::<f64>(), Just(0.0), Just(-0.0)].prop_map(Value::Double),
        ]
    }

    fn a_hit() -> impl Strategy<Value = Hit> {
        let window = (prop::option::of(any::<i64>()), prop::option::of(any::<i64>()), a_value())
            .prop_map(|(start, end, value)| Read { start, end, value });
        let edge = prop_oneof![Just(0i64), Just(-1), Just(i64::MIN), any::<i64>()];
        (any::<bool>(), edge.clone(), edge, prop::collection::vec(window, 0..4), prop::option::of(any::<i64>()))
            .prop_map(|(found, batch, watermark_ms, windows, next_from)| Hit {
                found,
                batch,
                watermark_ms,
                windows,
                next_from,
            })
    }

    proptest! {
        /// The bytes written in place are prost's own for the same message, so a client's
        /// decoder cannot tell them apart.
        #[test]
        fn answers_are_prosts_bytes(
            names in prop::collection::vec("[a-zé/_]{0,12}", 4),
            hits in prop::collection::vec(a_hit(), 0..5),
        ) {
            let (job, operator, state) = (&names[0], &names[1], &names[2]);
            let keys: Vec<String> = (0..hits.len()).map(|i| format!("{}{i}", names[3])).collect();
            let mut many = Vec::new();
            for (k, h) in keys.iter().zip(&hits) {
                let one = Named { job, operator, state, key: k, hit: h };
                let mut buf = Vec::new();
                one.put(&mut buf);
                let want = value(job, operator, state, k, h).encode_to_vec();
                prop_assert_eq!(one.len(), want.len());
                prop_assert_eq!(&buf, &want);
                wire::frame(1, one.len(), &mut many);
                one.put(&mut many);
            }
            let results = keys.iter().zip(&hits).map(|(k, h)| value(job, operator, state, k, h)).collect();
            prop_assert_eq!(many, MultiGetResponse { results }.encode_to_vec());
        }
    }
}
