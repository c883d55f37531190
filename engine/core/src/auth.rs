//! Client tokens at the router's doors (docs/architecture.md §7): who is asking and whether
//! their token's scopes cover what a request names, before any lookup, for every protocol: the
//! native front and the Python app's wrapper (`qstate.router.auth`) ask `authorize` of a path,
//! gRPC's methods `authenticate` then `Principal::check`. Python keeps the tokens file
//! (`qstate.core.transport.tokens`: written hashed, re-read within a second of a change) and
//! pushes its entries here; a request handed to the app carries the principal found here.

use std::collections::BTreeSet;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::errors::Failure;

pub const ALL: &str = "*";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    pub name: String,
    pub scopes: BTreeSet<String>,
}

impl Principal {
    pub fn allows(&self, job: &str, operator: Option<&str>) -> bool {
        if self.scopes.contains(ALL) || self.scopes.contains(job) {
            return true;
        }
        match operator {
            None => self.scopes.iter().any(|s| s.starts_with(&format!("{job}/"))),
            Some(op) => self.scopes.contains(&format!("{job}/{op}")),
        }
    }

    fn listed(&self) -> String {
        self.scopes.iter().cloned().collect::<Vec<_>>().join(", ")
    }

    pub fn check(&self, job: &str, operator: Option<&str>) -> Result<(), Failure> {
        if self.allows(job, operator) {
            return Ok(());
        }
        let asked = match operator {
            None => job.to_string(),
            Some(op) => format!("{job}/{op}"),
        };
        Err(Failure::forbidden(format!("token '{}' may read {}; not {asked}", self.name, self.listed())))
    }

    pub fn check_all(&self, what: &str) -> Result<(), Failure> {
        if self.scopes.contains(ALL) {
            return Ok(());
        }
        Err(Failure::forbidden(format!(
            "token '{}' may read {}; {what} needs a token with scope *",
            self.name,
            self.listed()
        )))
    }

    /// How the principal travels to Python on a request handed over: `name scope,scope`
    /// (names and scopes hold neither spaces nor commas).
    pub fn header(&self) -> String {
        format!("{} {}", self.name, self.scopes.iter().cloned().collect::<Vec<_>>().join(","))
    }
}

/// The tokens a router accepts, by the hex SHA-256 of each.
#[derive(Default)]
pub struct Book {
    pub entries: Vec<(String, Principal)>,
}

/// A header's token trimmed of whitespace: ASCII's, and latin-1's NEL (0x85) and NBSP (0xa0).
fn trim(b: &[u8]) -> &[u8] {
    let ws = |c: &u8| matches!(c, b' ' | b'\t'..=b'\r' | 0x85 | 0xa0);
    let start = b.iter().position(|c| !ws(c)).unwrap_or(b.len());
    let end = b.iter().rposition(|c| !ws(c)).map_or(start, |e| e + 1);
    &b[start..end]
}

/// The token of `Bearer <token>` (the scheme in any case), or None.
fn bearer(header: Option<&[u8]>) -> Option<&[u8]> {
    let h = header?;
    if h.is_empty() {
        return None;
    }
    let (scheme, token) = match h.iter().position(|&c| c == b' ') {
        Some(i) => (&h[..i], &h[i + 1..]),
        None => (h, &h[h.len()..]),
    };
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return None;
    }
    let t = trim(token);
    (!t.is_empty()).then_some(t)
}

impl Book {
    /// Who sends `header` (`Authorization`, or gRPC's `authorization` metadata): its bytes are
    /// latin-1 characters, hashed as their UTF-8 (what `qstate token add` stored).
    pub fn authenticate(&self, header: Option<&[u8]>) -> Result<&Principal, Failure> {
        let Some(token) = bearer(header) else {
            return Err(Failure::unauthenticated(
                "a token is needed: send Authorization: Bearer <token> (gRPC: metadata authorization)",
            ));
        };
        let utf8: String = token.iter().map(|&c| c as char).collect();
        let digest = hex(&Sha256::digest(utf8.as_bytes()));
        let mut found = None;
        for (known, p) in &self.entries {
            // every stored hash compared, in constant time
            if bool::from(known.as_bytes().ct_eq(digest.as_bytes())) {
                found = Some(p);
            }
        }
        found.ok_or_else(|| Failure::unauthenticated("the token is not valid (unknown, revoked or mistyped)"))
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

const OPEN: [&str; 7] =
    ["/healthz", "/readyz", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json", "/favicon.ico"];

/// A path anyone may ask: probes, the API's documents, the /ui page's files, and /metrics
/// while public.
pub fn is_open(path: &str, metrics_public: bool) -> bool {
    OPEN.contains(&path) || path == "/ui" || path.starts_with("/ui/") || (metrics_public && path == "/metrics")
}

/// The job and operator a data path asks for: `/v1/state|series|top|watch/{job}/{op}/...`,
/// `/v1/state/{job}/{op}:batchGet`, `/v1/jobs/{job}[/position]` (operator None).
pub fn target_of(path: &str) -> Option<(&str, Option<&str>)> {
    let parts: Vec<&str> = path.splitn(6, '/').collect();
    if parts.len() == 5 && parts[1] == "v1" && parts[2] == "state" {
        if let Some(op) = parts[4].strip_suffix(":batchGet") {
            return Some((parts[3], Some(op))); // several states of one operator
        }
    }
    if parts.len() >= 5 && parts[1] == "v1" && ["state", "series", "top", "watch"].contains(&parts[2]) {
        return Some((parts[3], Some(parts[4])));
    }
    // a job's cluster map: its scope (the map names the operators the token may read)
    if parts.len() == 4 && parts[1] == "v1" && parts[2] == "cluster" && !parts[3].is_empty() {
        return Some((parts[3], None));
    }
    if (parts.len() == 4 || parts.len() == 5)
        && parts[1] == "v1"
        && parts[2] == "jobs"
        && !parts[3].is_empty()
        && (parts.len() == 4 || parts[4] == "position")
    {
        return Some((parts[3], None));
    }
    None
}

/// At the door of every HTTP request: None for a path anyone may ask (`is_open`), else
/// `authorize`'s principal or refusal.
pub fn door<'a>(
    book: &'a Book,
    header: Option<&[u8]>,
    path: &str,
    metrics_public: bool,
) -> Result<Option<&'a Principal>, Failure> {
    if is_open(path, metrics_public) {
        return Ok(None);
    }
    authorize(book, header, path).map(Some)
}

/// The principal, or the 401/403 to answer: a path that names a job needs its scope, the
/// cluster view and any other path scope `*` (the job list filters itself; /metrics takes any
/// valid token). `path` is the decoded path.
pub fn authorize<'a>(book: &'a Book, header: Option<&[u8]>, path: &str) -> Result<&'a Principal, Failure> {
    let p = book.authenticate(header)?;
    if let Some((job, op)) = target_of(path) {
        p.check(job, op)?;
    } else if path == "/v1/cluster" {
        p.check_all("the cluster view (every job's partitions)")?;
    } else if path != "/v1/jobs" && path != "/metrics" {
        let what: String = path.chars().take(100).collect();
        p.check_all(&what)?;
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        assert_eq!(target_of("/v1/state/j/o/s/k"), Some(("j", Some("o"))));
        assert_eq!(target_of("/v1/top/j/o/s"), Some(("j", Some("o"))));
        assert_eq!(target_of("/v1/state/j/o:batchGet"), Some(("j", Some("o"))));
        assert_eq!(target_of("/v1/state/j/o/s:batchGet"), Some(("j", Some("o"))));
        assert_eq!(target_of("/v1/jobs/j"), Some(("j", None)));
        assert_eq!(target_of("/v1/jobs/j/position"), Some(("j", None)));
        assert_eq!(target_of("/v1/jobs/j/other"), None);
        assert_eq!(target_of("/v1/jobs"), None);
        assert_eq!(target_of("/v1/cluster/j"), Some(("j", None)));
        assert_eq!(target_of("/v1/cluster"), None, "the whole cluster: scope *");
        assert_eq!(target_of("/v1/cluster/"), None);
        assert_eq!(target_of("/v1/jobs/"), None);
    }

    #[test]
    fn bearer_tokens() {
        assert_eq!(bearer(Some(b"Bearer abc")), Some(&b"abc"[..]));
        assert_eq!(bearer(Some(b"bEaReR  abc \xa0")), Some(&b"abc"[..]));
        assert_eq!(bearer(Some(b"Basic abc")), None);
        assert_eq!(bearer(Some(b"Bearer")), None);
        assert_eq!(bearer(Some(b"Bearer ")), None);
    }
}
