//! Where two JSON values differ, as readable paths: a State snapshot is too large to print
//! whole, so a divergence names the fields instead.

use serde_json::Value;

/// Up to `limit` differences, each `path: left ≠ right`.
pub fn differences(left: &Value, right: &Value, limit: usize) -> Vec<String> {
    let mut out = Vec::new();
    walk("", left, right, limit, &mut out);
    out
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 80 {
        let cut: String = s.chars().take(77).collect();
        format!("{cut}…")
    } else {
        s
    }
}

fn walk(path: &str, l: &Value, r: &Value, limit: usize, out: &mut Vec<String>) {
    if out.len() >= limit || l == r {
        return;
    }
    match (l, r) {
        (Value::Object(a), Value::Object(b)) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let p = format!("{path}.{k}");
                match (a.get(k), b.get(k)) {
                    (Some(x), Some(y)) => walk(&p, x, y, limit, out),
                    (x, y) => {
                        let show = |v: Option<&Value>| v.map_or("(absent)".into(), short);
                        out.push(format!("{p}: {} ≠ {}", show(x), show(y)));
                    }
                }
                if out.len() >= limit {
                    return;
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                walk(&format!("{path}[{i}]"), x, y, limit, out);
            }
        }
        _ => out.push(format!(
            "{}: {} ≠ {}",
            if path.is_empty() { "." } else { path },
            short(l),
            short(r)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_the_differing_leaves() {
        let a = json!({"pods": {"a/b": {"ready": true, "n": [1, 2]}}, "x": 1});
        let b = json!({"pods": {"a/b": {"ready": false, "n": [1, 3]}}, "y": 1});
        assert_eq!(
            differences(&a, &b, 10),
            vec![
                ".pods.a/b.n[1]: 2 ≠ 3",
                ".pods.a/b.ready: true ≠ false",
                ".x: 1 ≠ (absent)",
                ".y: (absent) ≠ 1",
            ]
        );
        assert_eq!(differences(&a, &b, 1).len(), 1);
        assert!(differences(&a, &a, 10).is_empty());
    }
}
