//! Answers as bytes: what the Python router writes with orjson (`qstate.router.wire`),
//! byte for byte (the property test tests/service/router/test_native_front.py holds them
//! equal): orjson's float and string forms, and Python's `repr` of an ASCII string for the
//! messages that quote a key.

use crate::codec::Value;
use crate::local::Hit;

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

/// `answer_fields(...)` of one key, as orjson writes it (a `StateAnswer`'s fields in order).
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

/// Python's `repr()` of an ASCII string; None for any other (only Python words those).
pub fn py_repr(s: &str) -> Option<String> {
    if !s.is_ascii() {
        return None;
    }
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            c => out.push_str(&format!("\\x{:02x}", c as u32)),
        }
    }
    out.push(quote);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(v: f64) -> String {
        let mut out = Vec::new();
        push_f64(&mut out, v);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn floats_as_orjson() {
        // each pair printed by orjson 3.13
        for (v, s) in [
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (1.5, "1.5"),
            (0.1, "0.1"),
            (1e-7, "1e-7"),
            (1e-5, "0.00001"),
            (1e-4, "0.0001"),
            (123456.789, "123456.789"),
            (5e-324, "5e-324"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (-0.0, "-0.0"),
            (100.0, "100.0"),
            (1e21, "1e+21"),
            (12345678901234567.0, "1.2345678901234568e+16"),
            (2.5e-8, "2.5e-8"),
            (9007199254740992.0, "9007199254740992.0"),
            (30000000000.0, "30000000000.0"),
            (4.35e-6, "4.35e-6"),
            (f64::NAN, "null"),
            (f64::NEG_INFINITY, "null"),
        ] {
            assert_eq!(f(v), s, "{v:e}");
        }
    }

    #[test]
    fn strings_as_orjson() {
        let mut out = Vec::new();
        push_str(&mut out, "a\u{0}\u{1f}\u{7f}\"\\\n\t\r\u{8}\u{c}\u{2028} é");
        assert_eq!(out, b"\"a\\u0000\\u001f\x7f\\\"\\\\\\n\\t\\r\\b\\f\xe2\x80\xa8 \xc3\xa9\"");
    }

    #[test]
    fn repr_as_python() {
        assert_eq!(py_repr("tw-1").unwrap(), "'tw-1'");
        assert_eq!(py_repr("it's").unwrap(), "\"it's\"");
        assert_eq!(py_repr("a'b\"c").unwrap(), "'a\\'b\"c'");
        assert_eq!(py_repr("\u{1}\u{7f}\\").unwrap(), "'\\x01\\x7f\\\\'");
        assert_eq!(py_repr("é"), None);
    }
}
