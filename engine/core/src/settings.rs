//! The settings the engine answers under: `qstate.core.config.Settings`, the one place qstate
//! reads its configuration from, pushed by Python when the router starts (`qstate.router.engine`).
//! There is no default here: a setting the engine used with a value of its own would be a
//! second source of it (docs/architecture.md §5, one read core).

use std::time::Duration;

/// What a router answers under (QSTATE_ names in brackets).
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// keys of one batch read [MAX_BATCH_KEYS]
    pub max_batch_keys: usize,
    /// windows a key's range answer holds at most, and the default `limit` [MAX_WINDOWS]
    pub max_windows: usize,
    /// keys × limit one range read may ask for [MAX_REQUEST_WINDOWS]
    pub max_request_windows: usize,
    /// how long a read waits for its `min_batch` [MIN_BATCH_WAIT_S]
    pub min_batch_wait: Duration,
    /// Retry-After of a 503 or 429 [RETRY_AFTER_S]
    pub retry_after_s: f64,
    /// largest request body [MAX_BODY_BYTES]
    pub max_body_bytes: usize,
    /// requests served at once [MAX_CONCURRENT_REQUESTS]
    pub max_concurrent: usize,
    /// /metrics answers without a token [METRICS_PUBLIC]
    pub metrics_public: bool,
    /// deadline of one call to a shard [SHARD_TIMEOUT_S]
    pub shard_timeout: Duration,
    /// keys waiting for one shard [MAX_SHARD_QUEUE]
    pub max_shard_queue: usize,
    /// a planted fault (`QSTATE_FAULT`, docs/runbook.md): a panic at a named point, for tests
    pub fault: Option<Fault>,
}

/// How often a read below its `min_batch` is read again: a commit is a batch a second or so,
/// so a few polls per batch (docs/architecture.md §5, read your writes).
pub const MIN_BATCH_POLL: Duration = Duration::from_millis(50);

/// A planted panic (`QSTATE_FAULT=POINT@N[:OPERATOR]`, `qstate.core.process.faults`): the
/// engine's half of the chaos tests' fault points, which show that a panic stays inside.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// a read of a partition at batch N (of OPERATOR) panics: `router.read-panic@N[:OP]`
    ReadPanic { batch: i64, operator: Option<String> },
    /// the acceptor panics at its Nth connection: `router.accept-panic@N`
    AcceptPanic { nth: u64 },
}

impl Fault {
    /// `POINT@N[:OPERATOR]` for the engine's points; None for any other point (the shard's and
    /// the driver's are theirs) or an empty setting. Python checked the syntax (`faults.parse`).
    pub fn parse(text: &str) -> Option<Fault> {
        let (point, rest) = text.trim().split_once('@')?;
        let (n, operator) = match rest.split_once(':') {
            Some((n, op)) => (n, Some(op.to_string())),
            None => (rest, None),
        };
        let n: i64 = n.parse().ok()?;
        match point {
            "router.read-panic" => Some(Fault::ReadPanic { batch: n, operator }),
            "router.accept-panic" => Some(Fault::AcceptPanic { nth: u64::try_from(n).ok()? }),
            _ => None,
        }
    }
}

impl Settings {
    /// A planted read panic for this read of `operator` at `batch`: panics (tests only).
    pub fn read_fault(&self, operator: &str, batch: i64) {
        if let Some(Fault::ReadPanic { batch: b, operator: op }) = &self.fault {
            if *b == batch && op.as_deref().is_none_or(|o| o == operator) {
                panic!("planted fault router.read-panic@{batch} ({operator}): QSTATE_FAULT");
            }
        }
    }
}

#[cfg(test)]
pub mod testing {
    use super::*;

    /// Settings for the engine's own tests: `qstate.core.config`'s defaults, as
    /// tests/vectors/settings.json holds them (pytest keeps that file equal to config.py).
    pub fn settings() -> Settings {
        let v = crate::vectors::load("settings.json");
        let n = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k}")) as usize;
        let s = |k: &str| Duration::from_secs_f64(v[k].as_f64().unwrap_or_else(|| panic!("{k}")));
        Settings {
            max_batch_keys: n("max_batch_keys"),
            max_windows: n("max_windows"),
            max_request_windows: n("max_request_windows"),
            min_batch_wait: s("min_batch_wait_s"),
            retry_after_s: v["retry_after_s"].as_f64().expect("retry_after_s"),
            max_body_bytes: n("max_body_bytes"),
            max_concurrent: n("max_concurrent_requests"),
            metrics_public: v["metrics_public"].as_bool().expect("metrics_public"),
            shard_timeout: s("shard_timeout_s"),
            max_shard_queue: n("max_shard_queue"),
            fault: Fault::parse(v["fault"].as_str().expect("fault")),
        }
    }

    #[test]
    fn faults() {
        assert_eq!(
            Fault::parse("router.read-panic@3:views_1m"),
            Some(Fault::ReadPanic { batch: 3, operator: Some("views_1m".into()) })
        );
        assert_eq!(Fault::parse("router.accept-panic@2"), Some(Fault::AcceptPanic { nth: 2 }));
        assert_eq!(Fault::parse("shard.after-write@12"), None);
        assert_eq!(Fault::parse(""), None);
    }
}
