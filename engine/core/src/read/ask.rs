//! What a front asks (`Ask`), and its checks under the router's bounds: the names and keys
//! (docs/architecture.md §2), the range, the windows a request may read, `limit`,
//! `min_batch`, a savepoint, and an operator and states the routing table knows. The result
//! is one `Read` per state, each carried unchanged to the partitions; or the 400 (what to fix)
//! or 404 (what is unknown) that says why not.

use std::sync::Arc;

use crate::address::{check_key, check_name};
use crate::engine::Engine;
use crate::errors::{quoted, Failure};
use crate::settings::Settings;
use crate::table::{Entry, Table};

/// A read as a front asks it, in no protocol's form.
#[derive(Clone, Debug, Default)]
pub struct Ask {
    pub job: String,
    pub operator: String,
    /// one state (`state`), or several (`states`, `several` set) of the operator
    pub states: Vec<String>,
    pub several: bool,
    pub keys: Vec<String>,
    /// a point read: one key (a batch read holds at most `max_batch_keys`)
    pub point: bool,
    /// windows starting in `[from, to)`; None: the latest window
    pub range: Option<(i64, i64)>,
    pub limit: Option<i64>,
    pub min_batch: Option<i64>,
    pub savepoint: Option<String>,
    /// co-located partitions read in-process; false: every key from its owner
    pub local: bool,
    /// a follower may answer when the owner cannot (down, restoring, moving), as of its own
    /// batch (Kafka Streams' stale stores); false: that read is the owner's 503
    pub allow_stale: bool,
}

/// One state's read, checked.
#[derive(Clone)]
pub struct Read {
    pub entry: Arc<Entry>,
    pub state: usize,
    pub keys: Arc<Vec<String>>,
    pub range: Option<(i64, i64)>,
    /// windows per key in a range answer, 1..=max_windows
    pub limit: usize,
    pub min_batch: Option<i64>,
    pub savepoint: Option<String>,
    pub local: bool,
    pub allow_stale: bool,
}

impl Read {
    pub fn state_name(&self) -> &str {
        self.entry.op.spec.states.get_index(self.state).expect("a state of the spec").0
    }
}

/// The checks that need no routing table, in the order a client fixes them; the limit each
/// state's read gets.
fn plain(ask: &Ask, cfg: &Settings) -> Result<usize, Failure> {
    let (n, most) = (ask.keys.len(), cfg.max_batch_keys);
    if ask.several {
        let s = ask.states.len();
        if s == 0 {
            return Err(Failure::invalid("'states' is empty: name at least one state of the operator"));
        }
        if let Some(twice) = ask.states.iter().enumerate().find(|(i, st)| ask.states[..*i].contains(st)) {
            return Err(Failure::invalid(format!("'states' names {} twice: name each once", quoted(twice.1, 80))));
        }
        if n.saturating_mul(s) > most {
            return Err(Failure::invalid(format!(
                "{n} keys × {s} states = {} answers: at most {most} per request (QSTATE_MAX_BATCH_KEYS)",
                n * s
            )));
        }
    } else if !ask.point && n > most {
        return Err(Failure::invalid(format!("{n} keys: at most {most} per request (QSTATE_MAX_BATCH_KEYS)")));
    }
    check_name("job", &ask.job)?;
    check_name("operator", &ask.operator)?;
    for s in &ask.states {
        check_name("state", s)?;
    }
    for k in &ask.keys {
        check_key(k)?;
    }
    if let Some((lo, hi)) = ask.range {
        if hi <= lo {
            return Err(Failure::invalid(format!("empty time range: 'to' ({hi}) must be after 'from' ({lo})")));
        }
    }
    // the request's windows (keys × limit) within its budget, shared evenly between its states;
    // a batch range read without a limit gets what fits
    let budget = (cfg.max_request_windows / ask.states.len().max(1)) as i64;
    let most_windows = cfg.max_windows as i64;
    let mut limit = ask.limit;
    if ask.range.is_some() && n > 0 {
        match limit {
            None => limit = Some(1.max(most_windows.min(budget / n as i64))),
            Some(l) if (n as i64).saturating_mul(l) > budget => {
                return Err(Failure::invalid(format!(
                    "{n} keys × limit {l} = {} windows: one request reads at most {budget} \
                     (QSTATE_MAX_REQUEST_WINDOWS); ask fewer keys or a smaller limit, and page on with 'next_from'",
                    (n as i64).saturating_mul(l)
                )))
            }
            Some(_) => {}
        }
    }
    let limit = limit.unwrap_or(most_windows);
    if !(1..=most_windows).contains(&limit) {
        return Err(Failure::invalid(format!(
            "'limit' is {limit}: ask for 1 to {most_windows} windows per key (QSTATE_MAX_WINDOWS), and page on with 'next_from'"
        )));
    }
    if let Some(m) = ask.min_batch {
        if m < 0 {
            return Err(Failure::invalid(format!("'min_batch' is {m}: a batch number, 0 or more")));
        }
    }
    if let Some(sp) = &ask.savepoint {
        check_name("savepoint name", sp)?;
        if ask.min_batch.is_some() {
            return Err(Failure::invalid(
                "'min_batch' and 'savepoint' together: a savepoint is as of its own batch; ask one or the other",
            ));
        }
    }
    Ok(limit as usize)
}

/// The 404 of a job, operator or state the table does not know (None: it knows them all): the
/// words of every route's, the top-N's and watch's too (`qstate.router.query`).
pub fn unknown_of(table: &Table, job: &str, op: &str, state: Option<&str>) -> Option<Failure> {
    if let Some(entry) = table.get(job, op) {
        let s = state?;
        let spec = &entry.op.spec;
        if spec.state_index(s).is_some() {
            return None;
        }
        let has: Vec<&str> = spec.states.keys().map(String::as_str).collect();
        return Some(Failure::unknown(
            format!(
                "operator {}/{} has no state {}; it has {}",
                spec.job,
                spec.operator,
                quoted(s, 80),
                has.join(", ")
            ),
            &[("job", job), ("operator", op), ("state", s)],
        ));
    }
    Some(unknown(table, job, op))
}

/// The 404 of an operator (or job) the table does not know.
fn unknown(table: &Table, job: &str, op: &str) -> Failure {
    if table.has_job(job) {
        return Failure::unknown(
            format!("job {} has no operator {}", quoted(job, 80), quoted(op, 80)),
            &[("job", job), ("operator", op)],
        );
    }
    let known = if table.is_empty() {
        format!(
            "this router serves no job yet (checkpoint storage {} holds none: a job registers its operators there when it starts)",
            table.storage
        )
    } else if !table.disclose_jobs {
        format!("GET /v1/jobs lists the jobs of checkpoint storage {} that your token may read", table.storage)
    } else {
        let names: Vec<String> = table.job_names().into_iter().map(|j| quoted(j, 80)).collect();
        format!("this router serves {} (from checkpoint storage {})", names.join(", "), table.storage)
    };
    Failure::unknown(format!("unknown job {}: {known}", quoted(job, 80)), &[("job", job)])
}

/// The reads, given the table: Ok(None) when it does not know the operator.
fn reads(table: &Table, ask: &Ask, limit: usize) -> Option<Result<Vec<Read>, Failure>> {
    let entry = table.get(&ask.job, &ask.operator)?.clone();
    let keys = Arc::new(ask.keys.clone());
    let mut out = Vec::with_capacity(ask.states.len());
    for s in &ask.states {
        let Some(state) = entry.op.spec.state_index(s) else {
            return Some(Err(unknown_of(table, &ask.job, &ask.operator, Some(s)).expect("a state it does not have")));
        };
        out.push(Read {
            entry: entry.clone(),
            state,
            keys: keys.clone(),
            range: ask.range,
            limit,
            min_batch: ask.min_batch,
            savepoint: ask.savepoint.clone(),
            local: ask.local,
            allow_stale: ask.allow_stale,
        });
    }
    Some(Ok(out))
}

/// The checks with the table as it is; None: the operator is unknown to it (`check` asks the
/// control plane to refresh it first).
pub fn check_now(engine: &Engine, ask: &Ask) -> Option<Result<Vec<Read>, Failure>> {
    let limit = match plain(ask, &engine.settings.load()) {
        Ok(l) => l,
        Err(f) => return Some(Err(f)),
    };
    reads(&engine.table.load(), ask, limit)
}

/// The checks; an operator the table does not know is looked up in storage once (a refresh)
/// before it is a 404.
pub async fn check(engine: &Engine, ask: &Ask) -> Result<Vec<Read>, Failure> {
    if let Some(r) = check_now(engine, ask) {
        return r;
    }
    engine.refresh(false).await;
    let table = engine.table.load();
    let limit = plain(ask, &engine.settings.load())?;
    reads(&table, ask, limit).unwrap_or_else(|| Err(unknown(&table, &ask.job, &ask.operator)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::testing::settings;

    fn ask(keys: &[&str]) -> Ask {
        Ask {
            job: "j".into(),
            operator: "o".into(),
            states: vec!["s".into()],
            keys: keys.iter().map(|k| k.to_string()).collect(),
            local: true,
            ..Ask::default()
        }
    }

    #[test]
    fn bounds() {
        let cfg = Settings { max_request_windows: 100, max_windows: 30, ..settings() };
        assert_eq!(plain(&ask(&["a"]), &cfg), Ok(30));
        let ranged = Ask { range: Some((0, 10)), ..ask(&["a", "b", "c", "d", "e"]) };
        assert_eq!(plain(&ranged, &cfg), Ok(20), "a batch range read without a limit gets what fits");
        let over = Ask { limit: Some(21), ..ranged.clone() };
        assert!(plain(&over, &cfg).unwrap_err().message.contains("QSTATE_MAX_REQUEST_WINDOWS"));
        let several = Ask { several: true, states: vec!["s".into(), "t".into()], ..ranged.clone() };
        assert_eq!(plain(&several, &cfg), Ok(10), "the budget shared by the states");
        let twice = Ask { several: true, states: vec!["s".into(), "s".into()], ..ask(&["a"]) };
        assert_eq!(plain(&twice, &cfg).unwrap_err().message, "'states' names \"s\" twice: name each once");
        let empty = Ask { range: Some((5, 5)), ..ask(&["a"]) };
        assert_eq!(plain(&empty, &cfg).unwrap_err().message, "empty time range: 'to' (5) must be after 'from' (5)");
        let both = Ask { savepoint: Some("sp".into()), min_batch: Some(1), ..ask(&["a"]) };
        assert!(plain(&both, &cfg).unwrap_err().message.starts_with("'min_batch' and 'savepoint' together"));
        let big: Vec<String> = (0..1001).map(|i| i.to_string()).collect();
        let refs: Vec<&str> = big.iter().map(String::as_str).collect();
        assert_eq!(
            plain(&ask(&refs), &settings()).unwrap_err().message,
            "1001 keys: at most 1000 per request (QSTATE_MAX_BATCH_KEYS)"
        );
    }
}
