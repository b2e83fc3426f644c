//! JSON on stdout the way Go's encoding/json writes it: 2-space pretty documents ending in a
//! newline, compact event lines, and `<`, `>`, `&`, U+2028/9 escaped as `\u003c`-style.

use serde::Serialize;
use std::io::Write;

use crate::error::Result;

pub fn go_escape(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for ch in json.chars() {
        match ch {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

pub fn pretty<T: Serialize>(v: &T) -> Result<String> {
    Ok(go_escape(&serde_json::to_string_pretty(v)?) + "\n")
}

pub fn compact<T: Serialize>(v: &T) -> Result<String> {
    Ok(go_escape(&serde_json::to_string(v)?) + "\n")
}

pub fn print_pretty<T: Serialize>(v: &T) -> Result<()> {
    emit(&pretty(v)?)
}

pub fn emit(s: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(s.as_bytes())?;
    out.flush()?;
    Ok(())
}

/// Free-form log line on stderr; callers only substring-match stderr, so the shape is loose.
pub fn log(scope: &str, msg: impl std::fmt::Display) {
    let ts = crate::timefmt::rfc3339_nano(crate::timefmt::now_ns());
    eprintln!("{ts} INFO [{scope}] {msg}");
}

pub fn warn(scope: &str, msg: impl std::fmt::Display) {
    let ts = crate::timefmt::rfc3339_nano(crate::timefmt::now_ns());
    eprintln!("{ts} WARN [{scope}] {msg}");
}

#[cfg(test)]
mod tests {
    #[test]
    fn escapes_like_go() {
        assert_eq!(
            super::go_escape(r#"{"a":"<b>&"}"#),
            r#"{"a":"\u003cb\u003e\u0026"}"#
        );
    }
}
