//! The gRPC face of the read core: the public API's `Get` and `MultiGet` (proto/qstate.proto)
//! from the request's bytes to the answer's bytes, or the failure as gRPC says it (its code,
//! message and trailers: `errors::Failure::trailers`). grpcio stays the server for now: Python
//! hands the bytes and the caller's `authorization` here and sends what comes back
//! (docs/architecture.md §5, one read core).

use prost::Message;

use crate::auth::Book;
use crate::errors::Failure;
use crate::partition::codec::Value;
use crate::publicpb::{window, GetRequest, MultiGetRequest, MultiGetResponse, StateValue, Window};
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
pub fn answer(method: Method, read: Result<Outcome, Failure>) -> Result<Vec<u8>, Failure> {
    let o = read?;
    let spec = &o.entry.op.spec;
    match method {
        Method::Get => {
            let (h, key, state) = (&o.hits[0][0], &o.keys[0], o.state_name(0));
            if !h.found {
                return Err(Failure::absent(key, &spec.job, &spec.operator, state, h.batch, h.watermark_ms));
            }
            Ok(value(&spec.job, &spec.operator, state, key, h).encode_to_vec())
        }
        Method::MultiGet => {
            let results = o.by_key().map(|(s, k, h)| value(&spec.job, &spec.operator, s, k, h)).collect();
            Ok(MultiGetResponse { results }.encode_to_vec())
        }
    }
}
