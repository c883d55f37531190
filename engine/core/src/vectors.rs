//! The language-neutral test vectors (`tests/vectors/*.json`, docs/architecture.md §5): the
//! rules that must exist in Python too (the partition function, names and keys, the value
//! layout, times, JSON's forms, error classes) pinned to the same inputs and golden bytes,
//! read by `cargo test` here and by pytest (`tests/vectors/test_vectors.py`).

use std::path::PathBuf;

use serde_json::Value;

pub fn load(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/vectors").join(name);
    let raw = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&raw).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A vector's text: a string, or `{"repeat": s, "times": n}` (then `"then": t` appended) for
/// long ones.
pub fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Object(o) => {
            let s = o["repeat"].as_str().expect("repeat").repeat(o["times"].as_u64().expect("times") as usize);
            s + o.get("then").and_then(Value::as_str).unwrap_or("")
        }
        other => panic!("not a vector's text: {other}"),
    }
}

/// Bytes written as hex.
pub fn hex(v: &Value) -> Vec<u8> {
    let s = v.as_str().expect("hex");
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex")).collect()
}
