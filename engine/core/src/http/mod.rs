//! The HTTP face of the read core: which requests are reads (`route`), a read request as an
//! `Ask` (`ask`: its raw path, query and body parsed here, once, whichever server received
//! it), and the answer's status, headers and JSON body (`answer`). The native front and the
//! FastAPI routes (`qstate.router.routes.state`, over uvicorn) both call these, so both answer
//! alike by construction (docs/architecture.md §5, one read core).

pub mod json;

use std::borrow::Cow;

use crate::address::not_utf8;
use crate::errors::{quoted, Failure};
use crate::read::{Ask, Outcome};
use crate::time::{now_ms, parse_count, time_range};

/// The read routes: their templates (the `route` label of `qstate_router_http_requests_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// `GET /v1/state/{job}/{operator}/{state}/{key}`: one key
    Point,
    /// `POST /v1/state/{job}/{operator}/{state}:batchGet`: many keys of one state
    Batch,
    /// `POST /v1/state/{job}/{operator}:batchGet`: many keys of several states
    States,
    /// `GET /v1/series/{job}/{operator}/{state}/{key}`: one key's windows as points
    Series,
}

impl Route {
    pub fn template(self) -> &'static str {
        match self {
            Route::Point => "/v1/state/{job}/{operator}/{state}/{key}",
            Route::Batch => "/v1/state/{job}/{operator}/{state}:batchGet",
            Route::States => "/v1/state/{job}/{operator}:batchGet",
            Route::Series => "/v1/series/{job}/{operator}/{state}/{key}",
        }
    }

    pub fn method(self) -> &'static str {
        match self {
            Route::Point | Route::Series => "GET",
            Route::Batch | Route::States => "POST",
        }
    }
}

/// A request's method as the metrics label it (`qstate.router.metrics.METHODS`, else
/// `other`): a label per method a client invents would be a series per method.
pub fn method_label(method: &str) -> &'static str {
    match method {
        "GET" => "GET",
        "POST" => "POST",
        "HEAD" => "HEAD",
        "OPTIONS" => "OPTIONS",
        "PUT" => "PUT",
        "PATCH" => "PATCH",
        "DELETE" => "DELETE",
        _ => "other",
    }
}

/// A read request's route and its raw path's parts, split once (`route`): the names, raw
/// (the third empty for `States`), and the key, raw (maybe empty; a point or series read).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target<'a> {
    pub route: Route,
    names: [&'a str; 3],
    key: &'a str,
}

const NAME: &str = "a name in the path";

/// The read a request is, by its method and raw path (names are path segments, each
/// non-empty, split before they are decoded; a key is everything after the third name, maybe
/// empty); None: not a read.
pub fn route<'a>(method: &str, raw_path: &'a str) -> Option<Target<'a>> {
    let point = |prefix: &str, route: Route| {
        let mut s = raw_path.strip_prefix(prefix)?.splitn(4, '/');
        let names = [s.next()?, s.next()?, s.next()?];
        let key = s.next()?;
        names.iter().all(|n| !n.is_empty()).then_some(Target { route, names, key })
    };
    match method {
        "GET" if raw_path.starts_with("/v1/state/") => point("/v1/state/", Route::Point),
        "GET" if raw_path.starts_with("/v1/series/") => point("/v1/series/", Route::Series),
        "POST" => {
            let names: Vec<&str> = raw_path.strip_prefix("/v1/state/")?.strip_suffix(":batchGet")?.split('/').collect();
            if names.iter().any(|n| n.is_empty()) {
                return None;
            }
            match names[..] {
                [job, operator, state] => Some(Target { route: Route::Batch, names: [job, operator, state], key: "" }),
                [job, operator] => Some(Target { route: Route::States, names: [job, operator, ""], key: "" }),
                _ => None,
            }
        }
        _ => None,
    }
}

/// A path segment percent-decoded (`what` names it in the 400 when it is not UTF-8).
fn decoded<'a>(segment: &'a str, what: &str) -> Result<Cow<'a, str>, Failure> {
    percent_encoding::percent_decode_str(segment).decode_utf8().map_err(|_| not_utf8(what))
}

/// A query string's name or value: `+` is a space, then percent-decoded.
fn query_part(s: &str) -> Result<String, Failure> {
    let plus = s.replace('+', " ");
    percent_encoding::percent_decode_str(&plus)
        .decode_utf8()
        .map(Cow::into_owned)
        .map_err(|_| Failure::invalid("the query string is not UTF-8 once percent-decoded: send UTF-8"))
}

/// The query parameters a read takes: the last of a repeated name counts, an empty value is
/// no value, other names are ignored.
#[derive(Default)]
struct Params {
    from: Option<String>,
    to: Option<String>,
    limit: Option<String>,
    min_batch: Option<String>,
    savepoint: Option<String>,
    allow_stale: Option<String>,
}

fn params(query: &str) -> Result<Params, Failure> {
    let mut p = Params::default();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let (name, value) = (query_part(name)?, query_part(value)?);
        if value.is_empty() {
            continue;
        }
        match name.as_str() {
            "from" => p.from = Some(value),
            "to" => p.to = Some(value),
            "limit" => p.limit = Some(value),
            "min_batch" => p.min_batch = Some(value),
            "savepoint" => p.savepoint = Some(value),
            "allow_stale" => p.allow_stale = Some(value),
            _ => {}
        }
    }
    Ok(p)
}

/// A query flag, spelled as the API's definition (FastAPI, pydantic's bool) takes one.
fn flag(v: &str) -> Option<bool> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "on" | "t" | "true" | "y" | "yes" => Some(true),
        "0" | "off" | "f" | "false" | "n" | "no" => Some(false),
        _ => None,
    }
}

/// Whether a content type is JSON's: `application/json` or `application/<x>+json`, any
/// parameters after `;`.
fn is_json(content_type: Option<&[u8]>) -> bool {
    let Some(ct) = content_type.and_then(|c| std::str::from_utf8(c).ok()) else { return false };
    let media = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    match media.split_once('/') {
        Some((main, sub)) => main == "application" && !sub.contains('/') && (sub == "json" || sub.ends_with("+json")),
        None => false,
    }
}

/// A batch read's body: `{"keys": [...]}`, with `"states": [...]` for several states.
fn body_of(body: &[u8], several: bool) -> Result<(Vec<String>, Vec<String>), Failure> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Keys {
        keys: Vec<String>,
    }
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct States {
        keys: Vec<String>,
        states: Vec<String>,
    }
    let shape =
        if several { r#"{"keys": [<key>, ...], "states": [<state>, ...]}"# } else { r#"{"keys": [<key>, ...]}"# };
    let bad = |e: serde_json::Error| Failure::invalid(format!("the body must be JSON {shape}: {e}"));
    if several {
        let States { keys, states } = serde_json::from_slice(body).map_err(bad)?;
        Ok((keys, states))
    } else {
        let Keys { keys } = serde_json::from_slice(body).map_err(bad)?;
        Ok((keys, Vec::new()))
    }
}

/// The request as the core's `Ask`, or the 400 that says what to fix.
/// `route` is `route(method, raw_path)`'s; `max_windows` the bound a refused `limit`'s message
/// names.
pub fn ask(
    target: Target<'_>,
    query: &str,
    content_type: Option<&[u8]>,
    body: &[u8],
    max_windows: usize,
) -> Result<Ask, Failure> {
    let p = params(query)?;
    let now = now_ms();
    let range = time_range(p.from.as_deref(), p.to.as_deref(), now)?;
    let limit = match &p.limit {
        None => None,
        Some(l) => Some(parse_count(l, 9).ok_or_else(|| {
            Failure::invalid(format!(
                "'limit' must be a whole number of windows from 1 to {max_windows}, not {}",
                quoted(l, 80)
            ))
        })?),
    };
    let min_batch = match &p.min_batch {
        None => None,
        Some(m) => Some(parse_count(m, 18).ok_or_else(|| {
            Failure::invalid(format!("'min_batch' must be a batch number, 0 or more, not {}", quoted(m, 80)))
        })?),
    };
    let allow_stale = match &p.allow_stale {
        None => false,
        Some(v) => flag(v)
            .ok_or_else(|| Failure::invalid(format!("'allow_stale' must be true or false, not {}", quoted(v, 80))))?,
    };
    let mut ask = Ask { range, limit, min_batch, savepoint: p.savepoint, local: true, allow_stale, ..Ask::default() };
    let name = |n: &str| decoded(n, NAME).map(Cow::into_owned);
    let [job, operator, state] = target.names;
    ask.job = name(job)?;
    ask.operator = name(operator)?;
    match target.route {
        Route::Point | Route::Series => {
            ask.states = vec![name(state)?];
            ask.keys = vec![decoded(target.key, "the key")?.into_owned()];
            ask.point = true;
        }
        Route::Batch | Route::States => {
            if !is_json(content_type) {
                return Err(Failure::invalid(
                    "a batch read's body is JSON: send it with content-type: application/json",
                ));
            }
            let several = target.route == Route::States;
            let (keys, states) = body_of(body, several)?;
            ask.keys = keys;
            if several {
                ask.states = states;
                ask.several = true;
            } else {
                ask.states = vec![name(state)?];
            }
        }
    }
    Ok(ask)
}

/// An HTTP answer: status, headers beside the JSON content type, body.
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn of_failure(f: &Failure) -> Answer {
        Answer { status: f.http_status(), headers: f.headers(), body: f.body() }
    }
}

/// The route's answer to a read: a point read of a key with no data is the 404 that says as
/// of which batch; a series cut at its limit says where the next page starts (`Next-From`).
pub fn answer(route: Route, read: Result<Outcome, Failure>) -> Answer {
    let o = match read {
        Ok(o) => o,
        Err(f) => return Answer::of_failure(&f),
    };
    let spec = &o.entry.op.spec;
    let owner = o.owner_headers();
    let ok = |body, headers| Answer { status: 200, headers, body };
    match route {
        Route::Point | Route::Series => {
            let (h, key, state) = (&o.hits[0][0], &o.keys[0], o.state_name(0));
            if route == Route::Series {
                let next = h.next_from.map(|n| vec![("next-from", n.to_string())]).unwrap_or_default();
                return ok(json::series(h), next);
            }
            if !h.found {
                let mut a = Answer::of_failure(&Failure::absent(
                    key,
                    &spec.job,
                    &spec.operator,
                    state,
                    h.batch,
                    h.watermark_ms,
                ));
                a.headers.extend(owner);
                return a;
            }
            let mut out = Vec::with_capacity(256);
            json::push_answer(&mut out, &spec.job, &spec.operator, state, key, h);
            ok(out, owner)
        }
        Route::Batch | Route::States => ok(json::results(&spec.job, &spec.operator, o.by_key()), owner),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routed(method: &str, raw_path: &str) -> Option<Route> {
        route(method, raw_path).map(|t| t.route)
    }

    fn asked(method: &str, raw_path: &str, query: &str, ct: Option<&[u8]>, body: &[u8]) -> Result<Ask, Failure> {
        ask(route(method, raw_path).expect("a read route"), query, ct, body, 10)
    }

    #[test]
    fn routes() {
        assert_eq!(routed("GET", "/v1/state/j/o/s/k"), Some(Route::Point));
        assert_eq!(routed("GET", "/v1/state/j/o/s/a/b"), Some(Route::Point));
        assert_eq!(routed("GET", "/v1/state/j/o/s/"), Some(Route::Point), "an empty key: the core's 400");
        assert_eq!(routed("GET", "/v1/state/j/o/s"), None);
        assert_eq!(routed("GET", "/v1/state//o/s/k"), None, "a name is never empty");
        assert_eq!(routed("POST", "/v1/state/j//s:batchGet"), None);
        assert_eq!(routed("HEAD", "/v1/state/j/o/s/k"), None);
        assert_eq!(routed("GET", "/v1/series/j/o/s/k"), Some(Route::Series));
        assert_eq!(routed("POST", "/v1/state/j/o/s:batchGet"), Some(Route::Batch));
        assert_eq!(routed("POST", "/v1/state/j/o:batchGet"), Some(Route::States));
        assert_eq!(routed("POST", "/v1/state/j:batchGet"), None);
        assert_eq!(routed("POST", "/v1/state/j/o/s/k"), None);
        assert_eq!(routed("POST", "/v1/state/j/o/s/x:batchGet"), None);
        let t = route("GET", "/v1/state/j%2E/o/s/a/b").unwrap();
        assert_eq!((t.names, t.key), (["j%2E", "o", "s"], "a/b"));
    }

    #[test]
    fn requests() {
        let a = asked("GET", "/v1/state/j/o/s/a%2Fb%20c", "limit=5&from=0&limit=7&to=&x=1", None, b"").unwrap();
        assert_eq!((a.job.as_str(), a.states[0].as_str(), a.keys[0].as_str()), ("j", "s", "a/b c"));
        assert_eq!((a.limit, a.range), (Some(7), Some((0, crate::time::FAR))));
        assert_eq!(asked("GET", "/v1/state/j/o/s/%FF", "", None, b"").unwrap_err().class, "InvalidAddress");
        assert!(asked("GET", "/v1/state/j/o/s/k", "limit=x", None, b"").is_err());
        assert!(
            !asked("GET", "/v1/state/j/o/s/k", "", None, b"").unwrap().allow_stale,
            "the owner's answer unless asked"
        );
        assert!(asked("GET", "/v1/state/j/o/s/k", "allow_stale=True", None, b"").unwrap().allow_stale);
        assert!(!asked("GET", "/v1/state/j/o/s/k", "allow_stale=1&allow_stale=off", None, b"").unwrap().allow_stale);
        assert!(asked("GET", "/v1/state/j/o/s/k", "allow_stale=maybe", None, b"").is_err());
        let json = Some(&b"application/json; charset=utf-8"[..]);
        let b = asked("POST", "/v1/state/j/o:batchGet", "", json, br#"{"keys": ["a"], "states": ["v", "w"]}"#).unwrap();
        assert_eq!(
            (b.keys, b.states, b.several),
            (vec!["a".to_string()], vec!["v".to_string(), "w".to_string()], true)
        );
        for body in
            [&br#"{"keys": ["a"], "x": 1}"#[..], br#"{"keys": [1]}"#, br#"["a"]"#, b"", br#"{"keys": ["\ud800"]}"#]
        {
            assert_eq!(asked("POST", "/v1/state/j/o/s:batchGet", "", json, body).unwrap_err().class, "InvalidRequest");
        }
        assert!(asked("POST", "/v1/state/j/o/s:batchGet", "", Some(b"text/plain"), br#"{"keys": []}"#).is_err());
        assert!(is_json(Some(b"application/problem+json")));
        assert!(!is_json(Some(b"application/jsonx")));
    }
}
