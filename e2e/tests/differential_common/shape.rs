//! What of an answer the differential tests compare: JSON by shape, and the final error
//! line with what differs between two roots masked.

use serde_json::{Map, Value};

use std::path::Path;

use super::path;

/// Keys whose string values are fixed by the argv, so both sides must agree on them.
const FIXED_STRINGS: &[&str] = &[
    "state",
    "hypervisor",
    "event",
    "name",
    "description",
    "image",
    "image_type",
    "type",
    "role",
    "serial",
    "backend",
    "network",
];

/// Keys whose numbers are fixed by the argv.
const FIXED_NUMBERS: &[&str] = &[
    "cpu",
    "memory",
    "storage",
    "nics",
    "queue_size",
    "disk_queue_size",
    "num_queues",
    "version",
];

/// Objects keyed by ids: only how many entries they hold is compared.
const ID_KEYED: &[&str] = &["snapshot_ids", "image_blob_ids"];

/// The shape of a JSON document: its keys at each level, the type of each value, and the
/// values that are fixed for an argv. A `pid` reads `"pid:0"` or `"pid:live"`, since a clone
/// record's zero pid is part of the contract.
pub fn shape(v: &Value) -> Value {
    shape_at(None, v)
}

fn shape_at(key: Option<&str>, v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            if key.is_some_and(|k| ID_KEYED.contains(&k)) {
                return Value::String(format!("{} id(s)", m.len()));
            }
            let mut out = Map::new();
            for (k, v) in m {
                out.insert(k.clone(), shape_at(Some(k), v));
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(|v| shape_at(None, v)).collect()),
        Value::String(s) if key.is_some_and(|k| FIXED_STRINGS.contains(&k)) => {
            Value::String(s.clone())
        }
        Value::String(_) => Value::String("<string>".into()),
        Value::Number(n) if key == Some("pid") => Value::String(
            if n.as_i64() == Some(0) {
                "pid:0"
            } else {
                "pid:live"
            }
            .into(),
        ),
        Value::Number(n) if key.is_some_and(|k| FIXED_NUMBERS.contains(&k)) => {
            Value::Number(n.clone())
        }
        Value::Number(_) => Value::String("<number>".into()),
        Value::Bool(b) => Value::Bool(*b),
        Value::Null => Value::Null,
    }
}

/// The final error line with what differs between two roots masked: cocoon's 26-character
/// base32 ids and the side's directory.
pub fn masked(line: &str, dir: &Path) -> String {
    let line = line.replace(&path(dir), "<dir>");
    let mut out = String::new();
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        let is_id = word.len() == 26
            && word
                .chars()
                .all(|c| c.is_ascii_uppercase() || ('2'..='7').contains(&c));
        out.push_str(if is_id { "<ID>" } else { word });
        word.clear();
    };
    for c in line.chars() {
        if c.is_ascii_alphanumeric() {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out
}
