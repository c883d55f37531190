//! The error answers the native front gives, as `qstate.router.wire.error_response` makes
//! them from `qstate.core.errors`: the status of the class, the body `{"error": <class>,
//! "message": ..., **detail}`, Retry-After for 503 and 429, `WWW-Authenticate: Bearer` for
//! 401. Only the errors of a valid request the engine answers itself are here; every other
//! refusal is worded by Python (the request is handed to it).

use crate::json::{push_f64, push_i64, push_str};

/// What the answer counts as in the router's metrics (`count_error`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Counted {
    Nothing,
    Refused(&'static str),
    Unavailable(&'static str),
}

#[derive(Clone, Debug)]
pub struct ErrorAnswer {
    pub status: u16,
    pub body: Vec<u8>,
    pub retry_after: Option<String>,
    pub bearer: bool,
    pub counted: Counted,
}

enum Detail<'a> {
    Int(&'a str, i64),
    Float(&'a str, f64),
}

fn body(class: &str, message: &str, detail: &[Detail<'_>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(message.len() + 64);
    out.extend_from_slice(b"{\"error\":");
    push_str(&mut out, class);
    out.extend_from_slice(b",\"message\":");
    push_str(&mut out, message);
    for d in detail {
        out.push(b',');
        match *d {
            Detail::Int(k, v) => {
                push_str(&mut out, k);
                out.push(b':');
                push_i64(&mut out, v);
            }
            Detail::Float(k, v) => {
                push_str(&mut out, k);
                out.push(b':');
                push_f64(&mut out, v);
            }
        }
    }
    out.push(b'}');
    out
}

/// `retry_after`: whole seconds, at least 1 (Python's round: half to even).
fn retry_after(s: f64) -> String {
    (s.round_ties_even() as i64).max(1).to_string()
}

impl ErrorAnswer {
    pub fn unauthenticated(message: &str) -> ErrorAnswer {
        ErrorAnswer {
            status: 401,
            body: body("Unauthenticated", message, &[]),
            retry_after: None,
            bearer: true,
            counted: Counted::Refused("unauthenticated"),
        }
    }

    pub fn forbidden(message: String) -> ErrorAnswer {
        ErrorAnswer {
            status: 403,
            body: body("Forbidden", &message, &[]),
            retry_after: None,
            bearer: false,
            counted: Counted::Refused("forbidden"),
        }
    }

    pub fn overloaded(message: String, retry_after_s: f64) -> ErrorAnswer {
        ErrorAnswer {
            status: 429,
            body: body("Overloaded", &message, &[Detail::Float("retry_after_s", retry_after_s)]),
            retry_after: Some(retry_after(retry_after_s)),
            bearer: false,
            counted: Counted::Refused("overloaded"),
        }
    }

    pub fn too_large(message: String, limit_bytes: i64) -> ErrorAnswer {
        ErrorAnswer {
            status: 413,
            body: body("TooLarge", &message, &[Detail::Int("limit_bytes", limit_bytes)]),
            retry_after: None,
            bearer: false,
            counted: Counted::Refused("too-large"),
        }
    }

    /// The 404 of a key with no data, as of a batch.
    pub fn absent(message: String, batch: i64, watermark: i64) -> ErrorAnswer {
        ErrorAnswer {
            status: 404,
            body: body("NotFound", &message, &[Detail::Int("batch", batch), Detail::Int("watermark", watermark)]),
            retry_after: None,
            bearer: false,
            counted: Counted::Nothing,
        }
    }

    /// A 503 with its reason and detail (`Unavailable(message, retry_after_s, reason=...,
    /// partition=..., batch=...)`: detail in that order).
    pub fn unavailable(
        message: String,
        retry_after_s: f64,
        reason: &'static str,
        partition: i64,
        batch: Option<i64>,
    ) -> ErrorAnswer {
        let mut d = vec![Detail::Float("retry_after_s", retry_after_s), Detail::Int("partition", partition)];
        if let Some(b) = batch {
            d.push(Detail::Int("batch", b));
        }
        ErrorAnswer {
            status: 503,
            body: body("Unavailable", &message, &d),
            retry_after: Some(retry_after(retry_after_s)),
            bearer: false,
            counted: Counted::Unavailable(reason),
        }
    }
}
