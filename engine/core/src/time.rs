//! Times and counts in a read's query (docs/querying.md, "Times"): epoch milliseconds
//! (Grafana's `${__from}`), relative to now (`now`, `now-1h`, `now+5m`: a `+` left unencoded in
//! a query string arrives as a space, so a space counts as `+`), or ISO-8601 (a naive time is
//! UTC). The OpenAPI document states the same forms as a pattern (`qstate.router.routes`), which
//! `tests/vectors/times.json` holds to this parser.

use crate::errors::{quoted, Failure};

/// An open end of a time range; every end is clamped within ±FAR, so no time a client can
/// write overflows an int64.
pub const FAR: i64 = 1 << 62;

/// ASCII whitespace a value is trimmed of: space, `\t \n \x0b \x0c \r`.
pub fn trim(s: &str) -> &str {
    s.trim_matches(|c: char| c == ' ' || ('\t'..='\r').contains(&c))
}

fn digits(s: &str, min: usize, max: usize) -> Option<i128> {
    if s.len() < min || s.len() > max || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse::<i128>().ok()
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
}

fn month_days(y: i64, m: i64) -> i64 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        _ => 28,
    }
}

/// `YYYY-MM-DD[THH:MM[:SS[.f{1,6}]][Z|±HH:MM]]`: the millisecond it falls in (a naive time is
/// UTC), or None.
fn iso(s: &str) -> Option<i128> {
    let b = s.as_bytes();
    if b.len() < 10 || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let (y, m, d) = (digits(&s[0..4], 4, 4)? as i64, digits(&s[5..7], 2, 2)? as i64, digits(&s[8..10], 2, 2)? as i64);
    if !(1..=12).contains(&m) || d < 1 || d > month_days(y, m) || y < 1 {
        return None;
    }
    let mut us: i128 = i128::from(days_from_civil(y, m, d)) * 86_400_000_000;
    let mut rest = &s[10..];
    if let Some(t) = rest.strip_prefix('T') {
        let tb = t.as_bytes();
        if tb.len() < 5 || tb[2] != b':' {
            return None;
        }
        let (hh, mm) = (digits(&t[0..2], 2, 2)?, digits(&t[3..5], 2, 2)?);
        if hh > 23 || mm > 59 {
            return None;
        }
        us += (hh * 3600 + mm * 60) * 1_000_000;
        rest = &t[5..];
        if let Some(sec) = rest.strip_prefix(':') {
            let ss = digits(sec.get(0..2)?, 2, 2)?;
            if ss > 59 {
                return None;
            }
            us += ss * 1_000_000;
            rest = &sec[2..];
            if let Some(frac) = rest.strip_prefix('.') {
                let n = frac.bytes().take_while(u8::is_ascii_digit).count();
                if !(1..=6).contains(&n) {
                    return None;
                }
                us += digits(&frac[..n], 1, 6)? * 10i128.pow(6 - n as u32);
                rest = &frac[n..];
            }
        }
        if rest == "Z" {
            rest = "";
        } else if let Some(sign) = rest.chars().next().filter(|c| *c == '+' || *c == '-') {
            let off = &rest[1..];
            if off.len() != 5 || off.as_bytes()[2] != b':' {
                return None;
            }
            let (oh, om) = (digits(&off[0..2], 2, 2)?, digits(&off[3..5], 2, 2)?);
            if oh > 23 || om > 59 {
                return None;
            }
            let o = (oh * 3600 + om * 60) * 1_000_000;
            us += if sign == '+' { -o } else { o };
            rest = "";
        }
    }
    if !rest.is_empty() {
        return None;
    }
    Some(us.div_euclid(1000))
}

/// A time as epoch ms (unclamped: 19 digits reach beyond int64), or None.
fn parse(value: &str, now_ms: i64) -> Option<i128> {
    let v = trim(value);
    if !v.is_ascii() {
        return None; // every form is ASCII (and the slicing below is by bytes)
    }
    let epoch = match v.strip_prefix('-') {
        Some(d) => digits(d, 1, 19).map(|x| -x),
        None => digits(v, 1, 19),
    };
    if epoch.is_some() {
        return epoch;
    }
    if let Some(rel) = v.strip_prefix("now") {
        if rel.is_empty() {
            return Some(i128::from(now_ms));
        }
        let sign = match rel.as_bytes()[0] {
            b'-' => -1,
            b'+' | b' ' => 1,
            _ => return None,
        };
        let rel = &rel[1..];
        let n = rel.bytes().take_while(u8::is_ascii_digit).count();
        let count = digits(&rel[..n], 1, 12)?;
        let unit: i128 = match &rel[n..] {
            "ms" => 1,
            "s" => 1000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "w" => 604_800_000,
            _ => return None,
        };
        return Some(i128::from(now_ms) + sign * count * unit);
    }
    iso(v)
}

/// The time parameter `name` (`from`, `to`, `window`) as epoch ms clamped within ±FAR, or the
/// 400 saying which forms a time takes.
pub fn parse_time(name: &str, value: &str, now_ms: i64) -> Result<i64, Failure> {
    match parse(value, now_ms) {
        Some(t) => Ok(t.clamp(-i128::from(FAR), i128::from(FAR)) as i64),
        None => Err(Failure::invalid(format!(
            "'{name}' must be epoch milliseconds (at most 19 digits), ISO-8601 (e.g. \
             2026-01-01T10:00:00Z) or relative to now (now-1h; units ms s m h d w), not {}",
            quoted(value, 80)
        ))),
    }
}

/// `from` and `to` as a range, `[from, to)`: None without either (the latest window); an
/// open end is ±FAR.
pub fn time_range(from: Option<&str>, to: Option<&str>, now_ms: i64) -> Result<Option<(i64, i64)>, Failure> {
    let lo = from.map(|f| parse_time("from", f, now_ms)).transpose()?;
    let hi = to.map(|t| parse_time("to", t, now_ms)).transpose()?;
    Ok(match (lo, hi) {
        (None, None) => None,
        (lo, hi) => Some((lo.unwrap_or(-FAR), hi.unwrap_or(FAR))),
    })
}

/// A whole number of at most `max_digits` digits (ASCII whitespace around it allowed).
pub fn parse_count(value: &str, max_digits: usize) -> Option<i64> {
    digits(trim(value), 1, max_digits).map(|x| x as i64)
}

pub fn now_ms() -> i64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vectors;

    /// tests/vectors/times.json: each string a time parameter may hold, what it means (at a
    /// fixed now) or that it is refused; pytest holds the OpenAPI pattern to the same file.
    #[test]
    fn as_the_vectors_say() {
        let v = vectors::load("times.json");
        let now = v["now_ms"].as_i64().expect("now");
        for case in v["times"].as_array().expect("times") {
            let text = vectors::text(&case["value"]);
            let got = parse_time("from", &text, now).ok();
            assert_eq!(got, case["ms"].as_i64(), "{text:?}");
        }
    }

    #[test]
    fn refusals_say_what_a_time_is() {
        let e = parse_time("to", "nowish", 0).unwrap_err();
        assert_eq!(e.class, "InvalidRequest");
        assert!(e.message.starts_with("'to' must be epoch milliseconds"), "{}", e.message);
        assert!(e.message.ends_with("not \"nowish\""), "{}", e.message);
    }
}
