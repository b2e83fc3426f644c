//! cloud-hypervisor's `key=value,key=value` option syntax (`--disk path=…,readonly=on`), with
//! its rule that commas inside `[…]` or `"…"` do not split (`queue_affinity=[0@[0],1@[1]]`).

use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    values: BTreeMap<String, String>,
}

impl Options {
    /// Parses `input` accepting only `known` keys; an unknown key fails as cloud-hypervisor's
    /// parser does, naming it.
    pub fn parse(input: &str, known: &[&str]) -> Result<Options, String> {
        let mut values = BTreeMap::new();
        for item in split_commas(input)? {
            if item.is_empty() {
                continue;
            }
            let (key, value) = match item.split_once('=') {
                Some((k, v)) => (k.to_string(), v.to_string()),
                None => (item.clone(), String::new()),
            };
            if !known.contains(&key.as_str()) {
                return Err(format!("unknown option: {key}"));
            }
            values.insert(key, value);
        }
        Ok(Options { values })
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.values.get(key).map(String::as_str)
    }

    /// `on`/`true` and `off`/`false`, as cloud-hypervisor's `Toggle`.
    pub fn toggle(&self, key: &str) -> Result<Option<bool>, String> {
        match self.get(key) {
            None => Ok(None),
            Some("on") | Some("true") | Some("") => Ok(Some(true)),
            Some("off") | Some("false") => Ok(Some(false)),
            Some(other) => Err(format!("invalid value for {key}: {other}")),
        }
    }

    pub fn number(&self, key: &str) -> Result<Option<u64>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => parse_size(v)
                .map(Some)
                .ok_or_else(|| format!("invalid value for {key}: {v}")),
        }
    }
}

/// Sizes may carry cloud-hypervisor's K/M/G suffixes (binary units).
fn parse_size(v: &str) -> Option<u64> {
    let (digits, mult) = match v.chars().last()? {
        'K' | 'k' => (&v[..v.len() - 1], 1u64 << 10),
        'M' | 'm' => (&v[..v.len() - 1], 1 << 20),
        'G' | 'g' => (&v[..v.len() - 1], 1 << 30),
        _ => (v, 1),
    };
    digits.parse::<u64>().ok()?.checked_mul(mult)
}

fn split_commas(s: &str) -> Result<Vec<String>, String> {
    let mut list = Vec::new();
    let mut depth = 0u32;
    let mut in_quotes = false;
    let mut current = String::new();
    for c in s.trim().chars() {
        match c {
            '"' => in_quotes = !in_quotes,
            _ if in_quotes => {}
            '[' => depth += 1,
            ']' => {
                depth = depth
                    .checked_sub(1)
                    .ok_or_else(|| format!("invalid syntax: {s}"))?;
            }
            ',' if depth == 0 => {
                list.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    list.push(current);
    if in_quotes || depth != 0 {
        return Err(format!("invalid syntax: {s}"));
    }
    Ok(list)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brackets_protect_commas() {
        let o = Options::parse(
            "path=/a,queue_affinity=[0@[0],1@[1]],num_queues=2",
            &["path", "queue_affinity", "num_queues"],
        )
        .unwrap();
        assert_eq!(o.get("queue_affinity"), Some("[0@[0],1@[1]]"));
        assert_eq!(o.number("num_queues").unwrap(), Some(2));
    }

    #[test]
    fn unknown_key_is_named() {
        let e = Options::parse("path=/a,bogus=1", &["path"]).unwrap_err();
        assert_eq!(e, "unknown option: bogus");
    }

    #[test]
    fn sizes_and_toggles() {
        let o = Options::parse("size=1G,hugepages=on", &["size", "hugepages"]).unwrap();
        assert_eq!(o.number("size").unwrap(), Some(1 << 30));
        assert_eq!(o.toggle("hugepages").unwrap(), Some(true));
        assert!(Options::parse("a=[", &["a"]).is_err());
    }
}
