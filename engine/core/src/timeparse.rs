//! Times and numbers in a query, as `qstate.router.wire` reads them (its `parse_time`,
//! `parse_limit`, `parse_min_batch`, `time_range`). Anything they would refuse is `None`
//! here: the request goes to Python, which words the 400.

/// Python's `str.strip()` of ASCII text: spaces, `\t\n\x0b\x0c\r` and `\x1c`-`\x1f`.
pub fn py_strip(s: &str) -> &str {
    s.trim_matches(|c: char| c == ' ' || ('\t'..='\r').contains(&c) || ('\x1c'..='\x1f').contains(&c))
}

pub const FAR: i128 = 1 << 62;

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

/// `YYYY-MM-DD[THH:MM[:SS[.f{1,6}]][Z|±HH:MM]]` as `int(datetime.fromisoformat(..)
/// .timestamp() * 1000)` (a naive time is UTC): the float arithmetic included.
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
            if sec.len() < 2 {
                return None;
            }
            let ss = digits(&sec[0..2], 2, 2)?;
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
                let f = digits(&frac[..n], 1, 6)?;
                us += f * 10i128.pow(6 - n as u32);
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
    // timestamp(): total microseconds / 10**6 (correctly rounded), then * 1000 and int()
    let seconds = us as f64 / 1e6;
    if (us as f64) as i128 != us {
        return None;
    }
    Some(((seconds * 1000.0).trunc()) as i128)
}

/// `parse_time`: epoch milliseconds, `now[±N unit]` (a space counts as `+`), or ISO-8601.
pub fn parse_time(value: &str, now_ms: i64) -> Option<i128> {
    let v = py_strip(value);
    if let Some(e) = v.strip_prefix('-').map_or_else(|| digits(v, 1, 19), |d| digits(d, 1, 19).map(|x| -x)) {
        return Some(e);
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

/// `time_range(from, to)`: None without either; an open end is ±FAR, every end clamped.
pub fn time_range(from: Option<&str>, to: Option<&str>, now_ms: i64) -> Option<Option<(i64, i64)>> {
    let lo = match from {
        Some(f) => Some(parse_time(f, now_ms)?),
        None => None,
    };
    let hi = match to {
        Some(t) => Some(parse_time(t, now_ms)?),
        None => None,
    };
    if lo.is_none() && hi.is_none() {
        return Some(None);
    }
    let clamp = |v: i128| v.clamp(-FAR, FAR) as i64;
    Some(Some((clamp(lo.unwrap_or(-FAR)), clamp(hi.unwrap_or(FAR)))))
}

/// `parse_limit` without the bound check: a whole number of at most 9 digits.
pub fn parse_count(value: &str, max_digits: usize) -> Option<i64> {
    let v = py_strip(value);
    digits(v, 1, max_digits).map(|x| x as i64)
}

/// Python's `f"{x:g}"`.
pub fn py_g(x: f64) -> String {
    if x == 0.0 {
        return if x.is_sign_negative() { "-0".into() } else { "0".into() };
    }
    if !x.is_finite() {
        return if x.is_nan() {
            "nan".into()
        } else if x > 0.0 {
            "inf".into()
        } else {
            "-inf".into()
        };
    }
    let sci = format!("{x:.5e}"); // 6 significant digits, rounded as printf does
    let (m, e) = sci.split_once('e').expect("exponent");
    let e: i32 = e.parse().expect("exponent");
    if (-4..6).contains(&e) {
        let decimals = (5 - e).max(0) as usize;
        let s = format!("{x:.decimals$}");
        let s = if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s };
        s
    } else {
        let m = if m.contains('.') { m.trim_end_matches('0').trim_end_matches('.') } else { m };
        format!("{m}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times() {
        assert_eq!(parse_time("1700000000000", 0), Some(1_700_000_000_000));
        assert_eq!(parse_time(" -5 ", 0), Some(-5));
        assert_eq!(parse_time("now-1h", 10_000_000), Some(10_000_000 - 3_600_000));
        assert_eq!(parse_time("now 5m", 0), Some(300_000));
        assert_eq!(parse_time("2026-01-01T10:00:00Z", 0), Some(1_767_261_600_000));
        assert_eq!(parse_time("2026-01-01", 0), Some(1_767_225_600_000));
        assert_eq!(parse_time("2026-02-30", 0), None);
        assert_eq!(parse_time("2024-02-29T00:00:00.5+01:00", 0), Some(1_709_161_200_500));
        assert_eq!(parse_time("nowish", 0), None);
        assert_eq!(parse_time("12345678901234567890", 0), None);
    }

    #[test]
    fn g_as_python() {
        assert_eq!(py_g(1.0), "1");
        assert_eq!(py_g(0.5), "0.5");
        assert_eq!(py_g(2.25), "2.25");
        assert_eq!(py_g(0.123456789), "0.123457");
        assert_eq!(py_g(1e-5), "1e-05");
        assert_eq!(py_g(1234567.0), "1.23457e+06");
        assert_eq!(py_g(100000.0), "100000");
    }
}
