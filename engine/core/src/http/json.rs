//! Answers as JSON bytes, written here for every front (docs/architecture.md §5, one read
//! core). Numbers and strings take orjson's forms, which the router's Python answers (top-N,
//! watch events) are written in too: `tests/vectors/json.json` pins the two writers to the
//! same bytes for doubles and strings.

use crate::partition::codec::Value;
use crate::read::Hit;

pub fn push_i64(out: &mut Vec<u8>, v: i64) {
    out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
}

/// orjson's form of a double: the shortest digits that read back as it; plain decimal for
/// decimal exponents in [-5, 16), else `d.ddde±x`; NaN and ±inf are null.
pub fn push_f64(out: &mut Vec<u8>, v: f64) {
    if !v.is_finite() {
        out.extend_from_slice(b"null");
        return;
    }
    let mut buf = ryu::Buffer::new();
    let s = buf.format_finite(v);
    let (neg, s) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    let (mantissa, exp) = match s.split_once('e') {
        Some((m, e)) => (m, e.parse::<i32>().expect("ryu's exponent")),
        None => (s, 0),
    };
    // digits without the point, and the decimal exponent of the first digit
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let mut digits: String = format!("{int}{frac}");
    let mut e = exp + int.len() as i32 - 1;
    let lead = digits.len() - digits.trim_start_matches('0').len();
    if lead == digits.len() {
        // zero
        out.extend_from_slice(if neg { b"-0.0" } else { b"0.0" });
        return;
    }
    digits.drain(..lead);
    e -= lead as i32;
    let digits = digits.trim_end_matches('0');
    if neg {
        out.push(b'-');
    }
    if (-5..16).contains(&e) {
        if e < 0 {
            out.extend_from_slice(b"0.");
            out.extend(std::iter::repeat_n(b'0', (-e - 1) as usize));
            out.extend_from_slice(digits.as_bytes());
        } else {
            let point = e as usize + 1;
            if digits.len() <= point {
                out.extend_from_slice(digits.as_bytes());
                out.extend(std::iter::repeat_n(b'0', point - digits.len()));
                out.extend_from_slice(b".0");
            } else {
                out.extend_from_slice(&digits.as_bytes()[..point]);
                out.push(b'.');
                out.extend_from_slice(&digits.as_bytes()[point..]);
            }
        }
    } else {
        out.push(digits.as_bytes()[0]);
        if digits.len() > 1 {
            out.push(b'.');
            out.extend_from_slice(&digits.as_bytes()[1..]);
        }
        out.push(b'e');
        if e > 0 {
            out.push(b'+');
        }
        push_i64(out, i64::from(e));
    }
}

/// A JSON string as orjson writes it: `"` and `\` escaped, control characters as `\b \t \n
/// \f \r` or `\u00xx`, everything else as is (UTF-8).
pub fn push_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let b = s.as_bytes();
    let mut start = 0;
    for (i, &c) in b.iter().enumerate() {
        let esc: &[u8] = match c {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\t' => b"\\t",
            b'\r' => b"\\r",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&b[start..i]);
        if esc.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(b"\\u00");
            out.push(HEX[(c >> 4) as usize]);
            out.push(HEX[(c & 15) as usize]);
        } else {
            out.extend_from_slice(esc);
        }
        start = i + 1;
    }
    out.extend_from_slice(&b[start..]);
    out.push(b'"');
}

fn push_opt(out: &mut Vec<u8>, v: Option<i64>) {
    match v {
        Some(v) => push_i64(out, v),
        None => out.extend_from_slice(b"null"),
    }
}

pub fn push_value(out: &mut Vec<u8>, v: Value) {
    match v {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Long(x) => push_i64(out, x),
        Value::Double(x) => push_f64(out, x),
    }
}

/// One key's answer, a `StateAnswer`'s fields in their order (`qstate.core.answer`).
pub fn push_answer(out: &mut Vec<u8>, job: &str, operator: &str, state: &str, key: &str, h: &Hit) {
    out.extend_from_slice(b"{\"job\":");
    push_str(out, job);
    out.extend_from_slice(b",\"operator\":");
    push_str(out, operator);
    out.extend_from_slice(b",\"state\":");
    push_str(out, state);
    out.extend_from_slice(b",\"key\":");
    push_str(out, key);
    out.extend_from_slice(if h.found { b",\"found\":true" } else { b",\"found\":false" });
    out.extend_from_slice(b",\"batch\":");
    push_i64(out, h.batch);
    out.extend_from_slice(b",\"watermark\":");
    push_i64(out, h.watermark_ms);
    out.extend_from_slice(b",\"windows\":[");
    for (i, w) in h.windows.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"start\":");
        push_opt(out, w.start);
        out.extend_from_slice(b",\"end\":");
        push_opt(out, w.end);
        out.extend_from_slice(b",\"value\":");
        push_value(out, w.value);
        out.push(b'}');
    }
    out.extend_from_slice(b"],\"next_from\":");
    push_opt(out, h.next_from);
    out.push(b'}');
}

/// `{"results": [...]}` of `answers` (state, key, hit) in order: a `BatchAnswer`.
pub fn results<'a>(
    job: &str,
    operator: &str,
    answers: impl ExactSizeIterator<Item = (&'a str, &'a str, &'a Hit)>,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + 200 * answers.len());
    out.extend_from_slice(b"{\"results\":[");
    for (i, (state, k, h)) in answers.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        push_answer(&mut out, job, operator, state, k, h);
    }
    out.extend_from_slice(b"]}");
    out
}

/// A key's windows as points `[{"time": ..., "value": ...}]` (a `Series`, for dashboards): a
/// window's start, or the batch's watermark for state without windows.
pub fn series(h: &Hit) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + 40 * h.windows.len());
    out.push(b'[');
    for (i, w) in h.windows.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"time\":");
        push_i64(&mut out, w.start.unwrap_or(h.watermark_ms));
        out.extend_from_slice(b",\"value\":");
        push_value(&mut out, w.value);
        out.push(b'}');
    }
    out.push(b']');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vectors;

    /// tests/vectors/json.json: doubles and strings as the answers write them (orjson's
    /// forms: the router's Python writes its own answers with orjson, pytest holds it to the
    /// same file).
    #[test]
    fn as_the_vectors_say() {
        let v = vectors::load("json.json");
        for case in v["doubles"].as_array().expect("doubles") {
            let bits = u64::from_str_radix(case["bits"].as_str().expect("bits"), 16).expect("hex");
            let mut out = Vec::new();
            push_f64(&mut out, f64::from_bits(bits));
            assert_eq!(String::from_utf8(out).unwrap(), case["json"].as_str().expect("json"), "{bits:x}");
        }
        for case in v["strings"].as_array().expect("strings") {
            let mut out = Vec::new();
            push_str(&mut out, &vectors::text(&case["value"]));
            assert_eq!(String::from_utf8(out).unwrap(), case["json"].as_str().expect("json"));
        }
    }
}
