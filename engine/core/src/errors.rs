//! Every read error, once: its class (the name `qstate.core.errors` gives it, which clients
//! read back), its message and detail, and each protocol's form of it: HTTP's status, body
//! `{"error": <class>, "message": ..., **detail}` and headers (Retry-After for 503 and 429,
//! `WWW-Authenticate: Bearer` for 401), gRPC's code and trailers (`qstate-error`,
//! `qstate-detail`, `retry-after-ms`), and what the router's metrics count it as
//! (docs/architecture.md §5, one read core). The classes' statuses and codes are pinned
//! against Python's by `tests/vectors/errors.json`.

use crate::http::json::{push_f64, push_i64, push_str};

/// gRPC status codes the classes map to (`tonic::Code`'s numbers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    InvalidArgument = 3,
    NotFound = 5,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    Aborted = 10,
    FailedPrecondition = 9,
    Internal = 13,
    Unavailable = 14,
    DataLoss = 15,
    Unauthenticated = 16,
}

impl Code {
    pub fn name(self) -> &'static str {
        match self {
            Code::InvalidArgument => "INVALID_ARGUMENT",
            Code::NotFound => "NOT_FOUND",
            Code::PermissionDenied => "PERMISSION_DENIED",
            Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
            Code::Aborted => "ABORTED",
            Code::FailedPrecondition => "FAILED_PRECONDITION",
            Code::Internal => "INTERNAL",
            Code::Unavailable => "UNAVAILABLE",
            Code::DataLoss => "DATA_LOSS",
            Code::Unauthenticated => "UNAUTHENTICATED",
        }
    }
}

/// The classes of `qstate.core.errors`, every one (a shard's refusal passes through by its
/// class): (name, HTTP status, gRPC code).
pub const CLASSES: [(&str, u16, Code); 20] = [
    ("QStateError", 500, Code::Internal),
    ("InvalidRequest", 400, Code::InvalidArgument),
    ("InvalidAddress", 400, Code::InvalidArgument),
    ("TooLarge", 413, Code::InvalidArgument),
    ("Unauthenticated", 401, Code::Unauthenticated),
    ("Forbidden", 403, Code::PermissionDenied),
    ("NotFound", 404, Code::NotFound),
    ("UnknownOperator", 404, Code::NotFound),
    ("Unavailable", 503, Code::Unavailable),
    ("Overloaded", 429, Code::ResourceExhausted),
    ("StaleEpoch", 409, Code::Aborted),
    ("NotOwner", 409, Code::FailedPrecondition),
    ("DeltaMismatch", 500, Code::DataLoss),
    ("CorruptState", 500, Code::DataLoss),
    ("EngineFailed", 500, Code::Internal),
    ("CommitFailed", 503, Code::Unavailable),
    ("Fenced", 409, Code::Aborted),
    ("StartFailed", 500, Code::Internal),
    ("BrokerError", 500, Code::Internal),
    ("BadRecord", 400, Code::InvalidArgument),
];

/// A detail field's value.
#[derive(Clone, Debug, PartialEq)]
pub enum Detail {
    Int(i64),
    Float(f64),
    Str(String),
    /// JSON as another process wrote it (a shard's detail, passed through)
    Raw(String),
}

/// What the router's metrics count an answer as (`qstate_router_refused_total`,
/// `qstate_router_unavailable_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counted {
    Nothing,
    Refused(&'static str),
    Unavailable(&'static str),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Failure {
    /// the class's name in `qstate.core.errors` (one of `CLASSES`)
    pub class: &'static str,
    pub message: String,
    pub detail: Vec<(String, Detail)>,
    /// `Unavailable.reason`: the fixed word its metric is labelled with
    pub reason: Option<&'static str>,
}

pub type Result<T> = std::result::Result<T, Failure>;

/// What a caught panic said (its payload, when it is a string).
pub fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_default()
}

/// `s` shown in a message: its first `n` characters as a JSON string.
pub fn quoted(s: &str, n: usize) -> String {
    let shown: String = s.chars().take(n).collect();
    let mut out = Vec::with_capacity(shown.len() + 2);
    push_str(&mut out, &shown);
    String::from_utf8(out).expect("UTF-8 in, UTF-8 out")
}

/// Whole seconds for Retry-After: at least 1, rounded half to even.
fn retry_after(s: f64) -> String {
    (s.round_ties_even() as i64).max(1).to_string()
}

/// Seconds as a message writes them: at most 3 decimals, no trailing zeros (`1`, `0.05`).
pub fn seconds(s: f64) -> String {
    let t = format!("{s:.3}");
    t.trim_end_matches('0').trim_end_matches('.').to_string()
}

impl Failure {
    fn new(class: &'static str, message: impl Into<String>) -> Failure {
        Failure { class, message: message.into(), detail: Vec::new(), reason: None }
    }

    fn with(mut self, name: &str, v: Detail) -> Failure {
        self.detail.push((name.to_string(), v));
        self
    }

    pub fn invalid(message: impl Into<String>) -> Failure {
        Failure::new("InvalidRequest", message)
    }

    pub fn invalid_address(message: impl Into<String>) -> Failure {
        Failure::new("InvalidAddress", message)
    }

    pub fn unauthenticated(message: &str) -> Failure {
        Failure::new("Unauthenticated", message)
    }

    pub fn forbidden(message: String) -> Failure {
        Failure::new("Forbidden", message)
    }

    pub fn too_large(limit_bytes: usize) -> Failure {
        Failure::new(
            "TooLarge",
            format!("request body over {limit_bytes} bytes (QSTATE_MAX_BODY_BYTES); send fewer keys per request"),
        )
        .with("limit_bytes", Detail::Int(limit_bytes as i64))
    }

    pub fn overloaded(message: String, retry_after_s: f64) -> Failure {
        Failure::new("Overloaded", message).with("retry_after_s", Detail::Float(retry_after_s))
    }

    /// The 404 of a key with no data: as of which batch.
    pub fn absent(key: &str, job: &str, operator: &str, state: &str, batch: i64, watermark: i64) -> Failure {
        Failure::new(
            "NotFound",
            format!("key {} has no data in {job}/{operator}/{state} as of batch {batch}", quoted(key, 200)),
        )
        .with("batch", Detail::Int(batch))
        .with("watermark", Detail::Int(watermark))
    }

    pub fn unknown(message: String, names: &[(&str, &str)]) -> Failure {
        let mut f = Failure::new("UnknownOperator", message);
        for (k, v) in names {
            f = f.with(k, Detail::Str(v.to_string()));
        }
        f
    }

    /// A 503: its reason (the metric's label), the partition, and the batch it has if known.
    pub fn unavailable(
        message: String,
        retry_after_s: f64,
        reason: &'static str,
        partition: Option<u32>,
        batch: Option<i64>,
    ) -> Failure {
        let mut f = Failure::new("Unavailable", message).with("retry_after_s", Detail::Float(retry_after_s));
        if let Some(p) = partition {
            f = f.with("partition", Detail::Int(i64::from(p)));
        }
        if let Some(b) = batch {
            f = f.with("batch", Detail::Int(b));
        }
        f.reason = Some(reason);
        f
    }

    /// Bytes of a partition that do not parse as its layout says (a 500: its shard restores it).
    pub fn corrupt(message: String) -> Failure {
        Failure::new("CorruptState", message)
    }

    /// A path that names no route (the app's own answer to one: Starlette's 404).
    pub fn no_route() -> Failure {
        Failure::new("NotFound", "Not Found")
    }

    /// A panic caught inside the engine: a 500 that says where, never a crash.
    pub fn engine(message: String) -> Failure {
        Failure::new("EngineFailed", message)
    }

    /// A refusal another qstate process answered with (a shard's trailers: its class and
    /// detail as JSON), passed on as it came; an unknown class is `QStateError`.
    pub fn remote(class: &str, message: String, detail_json: Option<&str>) -> Failure {
        let class = CLASSES.iter().find(|(c, _, _)| *c == class).map_or("QStateError", |(c, _, _)| *c);
        let mut f = Failure::new(class, message);
        if let Some(Ok(serde_json::Value::Object(fields))) = detail_json.map(serde_json::from_str::<serde_json::Value>)
        {
            for (k, v) in fields {
                f.detail.push((k, Detail::Raw(v.to_string())));
            }
        }
        f
    }

    fn class_row(&self) -> (u16, Code) {
        CLASSES.iter().find(|(c, _, _)| *c == self.class).map_or((500, Code::Internal), |(_, s, c)| (*s, *c))
    }

    pub fn http_status(&self) -> u16 {
        self.class_row().0
    }

    pub fn grpc_code(&self) -> Code {
        self.class_row().1
    }

    pub fn retry_after_s(&self) -> Option<f64> {
        self.detail.iter().find_map(|(k, v)| match v {
            Detail::Float(s) if k == "retry_after_s" => Some(*s),
            _ => None,
        })
    }

    pub fn counted(&self) -> Counted {
        match self.class {
            "Unauthenticated" => Counted::Refused("unauthenticated"),
            "Forbidden" => Counted::Refused("forbidden"),
            "TooLarge" => Counted::Refused("too-large"),
            "Overloaded" => Counted::Refused("overloaded"),
            "Unavailable" => Counted::Unavailable(self.reason.unwrap_or("unavailable")),
            _ => Counted::Nothing,
        }
    }

    /// The detail as a JSON object's fields (`,"name":value` each).
    fn push_detail(&self, out: &mut Vec<u8>) {
        for (k, v) in &self.detail {
            out.push(b',');
            push_str(out, k);
            out.push(b':');
            match v {
                Detail::Int(x) => push_i64(out, *x),
                Detail::Float(x) => push_f64(out, *x),
                Detail::Str(s) => push_str(out, s),
                Detail::Raw(j) => out.extend_from_slice(j.as_bytes()),
            }
        }
    }

    /// The HTTP body: `{"error": <class>, "message": ..., **detail}`.
    pub fn body(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.message.len() + 64);
        out.extend_from_slice(b"{\"error\":");
        push_str(&mut out, self.class);
        out.extend_from_slice(b",\"message\":");
        push_str(&mut out, &self.message);
        self.push_detail(&mut out);
        out.push(b'}');
        out
    }

    /// The HTTP headers beside the JSON content type: Retry-After, WWW-Authenticate.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut h = Vec::new();
        if let Some(s) = self.retry_after_s() {
            h.push(("retry-after", retry_after(s)));
        }
        if self.class == "Unauthenticated" {
            h.push(("www-authenticate", "Bearer".to_string()));
        }
        h
    }

    /// gRPC's trailing metadata: the class and detail (`qstate.core.errors.from_grpc` reads
    /// them back into the same class) and, for a 503 or 429, `retry-after-ms`.
    pub fn trailers(&self) -> Vec<(&'static str, String)> {
        let mut detail = Vec::new();
        detail.push(b'{');
        self.push_detail(&mut detail);
        if detail.len() > 1 {
            detail.remove(1); // the first field's comma
        }
        detail.push(b'}');
        let mut t = vec![
            ("qstate-error", self.class.to_string()),
            ("qstate-detail", String::from_utf8(detail).expect("UTF-8")),
        ];
        if let Some(s) = self.retry_after_s() {
            t.push(("retry-after-ms", ((s * 1000.0) as i64).to_string()));
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vectors;

    /// tests/vectors/errors.json: every class's status and code as `qstate.core.errors` has
    /// them, and error bodies as Python writes them.
    #[test]
    fn as_the_vectors_say() {
        let v = vectors::load("errors.json");
        let classes = v["classes"].as_array().expect("classes");
        assert_eq!(classes.len(), CLASSES.len(), "a class on one side only");
        for c in classes {
            let class = c["class"].as_str().expect("class");
            let row = CLASSES.iter().find(|(n, _, _)| *n == class).unwrap_or_else(|| panic!("{class} missing"));
            assert_eq!(u64::from(row.1), c["http"].as_u64().expect("http"), "{class}");
            assert_eq!(row.2.name(), c["grpc"].as_str().expect("grpc"), "{class}");
        }
        for b in v["bodies"].as_array().expect("bodies") {
            let class =
                CLASSES.iter().map(|(n, _, _)| *n).find(|n| *n == b["class"].as_str().unwrap()).expect("a class");
            let detail = b["detail"]
                .as_array()
                .expect("detail")
                .iter()
                .map(|kv| {
                    let (k, v) = (kv[0].as_str().expect("name").to_string(), &kv[1]);
                    let d = if let Some(i) = v.as_i64().filter(|_| !v.is_f64()) {
                        Detail::Int(i)
                    } else if let Some(f) = v.as_f64() {
                        Detail::Float(f)
                    } else {
                        Detail::Str(v.as_str().expect("a detail").to_string())
                    };
                    (k, d)
                })
                .collect();
            let f =
                Failure { class, message: b["message"].as_str().expect("message").to_string(), detail, reason: None };
            assert_eq!(String::from_utf8(f.body()).unwrap(), b["body"].as_str().expect("body"));
        }
    }

    #[test]
    fn bodies_and_forms() {
        let f = Failure::unavailable("down".into(), 1.0, "shard-down", Some(3), Some(7));
        assert_eq!(
            String::from_utf8(f.body()).unwrap(),
            r#"{"error":"Unavailable","message":"down","retry_after_s":1.0,"partition":3,"batch":7}"#
        );
        assert_eq!(f.http_status(), 503);
        assert_eq!(f.headers(), vec![("retry-after", "1".to_string())]);
        assert_eq!(f.counted(), Counted::Unavailable("shard-down"));
        assert_eq!(f.trailers()[1].1, r#"{"retry_after_s":1.0,"partition":3,"batch":7}"#);
        assert_eq!(f.trailers()[2], ("retry-after-ms", "1000".to_string()));
        let u = Failure::unauthenticated("who?");
        assert_eq!(u.headers(), vec![("www-authenticate", "Bearer".to_string())]);
        assert_eq!(u.trailers()[1].1, "{}");
        let r = Failure::remote("NotFound", "no savepoint".into(), Some(r#"{"job": "j"}"#));
        assert_eq!(String::from_utf8(r.body()).unwrap(), r#"{"error":"NotFound","message":"no savepoint","job":"j"}"#);
        assert_eq!(Failure::remote("Nope", "x".into(), None).http_status(), 500);
    }

    #[test]
    fn quoting() {
        assert_eq!(quoted("a\"b", 80), r#""a\"b""#);
        assert_eq!(quoted(&"é".repeat(300), 200).chars().count(), 202);
        assert_eq!(seconds(1.0), "1");
        assert_eq!(seconds(0.05), "0.05");
        assert_eq!(seconds(2.5), "2.5");
    }
}
