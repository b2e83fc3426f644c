//! `--html`: the rows as one self-contained page. No external asset and no network: the style
//! is inline, and the only script filters rows by name and opens or closes them all. Each
//! row is a `<details>`, closed, with its counts and phases in the summary, so a journal of
//! thousands of pods opens as a list of thousands of lines.
//!
//! Every text from the journal (pod names, messages, argv) goes through `escape`: a journal
//! is written from what the API server and cocoon said, and a page must not run it.

use std::io::{self, Write};

use reconcilers::pod::PodKey;

use super::owners::Owner;
use super::rows::{Cause, Entry, Kind, Row, Rows};
use super::timeline::clock;

const STYLE: &str = "body{font:13px/1.4 system-ui,sans-serif;margin:1em;color:#222}\
h1{font-size:1.3em;margin:0 0 .3em}\
details{border-top:1px solid #ddd}\
summary{cursor:pointer;padding:2px 0}\
summary .k{font-weight:600}\
summary .u,summary .n{color:#666;font-size:.9em;margin-left:.6em}\
summary .ph{margin-left:.6em;color:#05a}\
summary .st{margin-left:.6em;color:#073}\
ol{list-style:none;margin:0 0 .5em;padding:0 0 0 1.2em;font:12px/1.35 ui-monospace,monospace}\
li{margin:1px 0;white-space:pre-wrap;word-break:break-all}\
li.o>.v{color:#888}li.n{color:#a50}li.d{color:#666;font-weight:600}\
time,.s{color:#888;margin-right:.6em}\
b{color:#05a;margin-left:.8em}em{color:#a0a;margin-left:.8em}\
li p{margin:0 0 0 2.2em}li p::before{content:'\\2192  ';color:#aaa}\
.c{color:#00c}.s2{color:#073}.a{color:#350}.e{color:#a50}.t{color:#777}.p{color:#777}\
.x{color:#c00}.r{color:#609}.m{color:#555}.w{color:#a50;font-weight:600}\
.l{margin-left:2.2em;color:#666}\
#bar{margin:.6em 0}#bar input{width:20em}";

const SCRIPT: &str = "const q=document.getElementById('q');\
const rows=[...document.querySelectorAll('details[data-pod]')];\
q.oninput=()=>{const s=q.value;for(const r of rows)r.hidden=!!s&&!r.dataset.pod.includes(s)};\
function all(o){for(const r of document.querySelectorAll('details'))if(!r.hidden)r.open=o}";

/// `&`, `<`, `>` and both quotes: enough for text and for quoted attribute values.
pub fn escape(s: &str, out: &mut String) {
    let mut start = 0;
    for (i, b) in s.bytes().enumerate() {
        let rep = match b {
            b'&' => "&amp;",
            b'<' => "&lt;",
            b'>' => "&gt;",
            b'"' => "&quot;",
            b'\'' => "&#39;",
            _ => continue,
        };
        out.push_str(&s[start..i]);
        out.push_str(rep);
        start = i + 1;
    }
    out.push_str(&s[start..]);
}

fn class(k: Kind) -> &'static str {
    match k {
        Kind::Cocoon => "c",
        Kind::Status => "s2",
        Kind::Annotate => "a",
        Kind::Event => "e",
        Kind::Timer => "t",
        Kind::Probe => "p",
        Kind::Delete => "x",
        Kind::Registry => "r",
        Kind::Other => "m",
        Kind::Note => "w",
    }
}

fn phase_name(p: Option<&'static str>) -> &'static str {
    p.unwrap_or("removed")
}

/// The page's heading: what was replayed and the verdict.
pub struct Heading<'a> {
    pub title: &'a str,
    pub verdict: &'a str,
    /// Show only this pod's rows.
    pub only: Option<&'a PodKey>,
}

pub fn write(rows: &Rows, heading: &Heading<'_>, out: &mut dyn Write) -> io::Result<()> {
    let mut order: Vec<&Row> = rows.rows[1..]
        .iter()
        .filter(|r| heading.only.is_none_or(|k| r.owner.key() == Some(k)))
        .collect();
    // Key order; a name used again by a later pod keeps the order the pods came in.
    order.sort_by(|a, b| a.owner.key().cmp(&b.owner.key()));
    let mut s = String::with_capacity(1 << 16);
    s.push_str("<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8><title>");
    escape(heading.title, &mut s);
    s.push_str("</title><style>");
    s.push_str(STYLE);
    s.push_str("</style></head><body>\n<h1>");
    escape(heading.title, &mut s);
    s.push_str("</h1>\n<p class=verdict>");
    escape(heading.verdict, &mut s);
    s.push_str(&format!(
        "</p>\n<div id=bar><input id=q placeholder='filter pods by namespace/name'> \
         <button onclick='all(true)'>open all</button> \
         <button onclick='all(false)'>close all</button> {} pods</div>\n",
        order.len()
    ));
    if heading.only.is_none() {
        row(&rows.rows[0], &mut s);
    }
    for r in order {
        row(r, &mut s);
        if s.len() > 1 << 20 {
            out.write_all(s.as_bytes())?;
            s.clear();
        }
    }
    s.push_str("<script>");
    s.push_str(SCRIPT);
    s.push_str("</script>\n</body></html>\n");
    out.write_all(s.as_bytes())
}

fn row(r: &Row, s: &mut String) {
    let c = &r.counts;
    match &r.owner {
        Owner::Node => s.push_str("<details class=node><summary><span class=k>node</span>"),
        Owner::Pod { key, uid } => {
            s.push_str("<details data-pod=\"");
            escape(&key.to_string(), s);
            s.push_str("\" data-uid=\"");
            escape(uid, s);
            s.push_str("\"><summary><span class=k>");
            escape(&key.to_string(), s);
            s.push_str("</span><span class=u>");
            escape(if uid.is_empty() { "(uid unknown)" } else { uid }, s);
            s.push_str("</span>");
        }
    }
    s.push_str(&format!(
        "<span class=n>{} events · {} actions · {} cocoon · {} statuses · {} Events",
        c.events, c.actions, c.cocoon, c.statuses, c.k8s_events
    ));
    if c.folded > 0 {
        s.push_str(&format!(" · {} folded", c.folded));
    }
    s.push_str("</span>");
    if !r.phases.is_empty() {
        s.push_str("<span class=ph>");
        let names: Vec<&str> = r.phases.iter().map(|p| phase_name(*p)).collect();
        // A pod that fails and retries for hours must not make its summary a page long.
        let shown = if names.len() > 12 {
            let mut v = names[..5].to_vec();
            v.push("…");
            v.extend_from_slice(&names[names.len() - 5..]);
            v
        } else {
            names
        };
        escape(&shown.join(" → "), s);
        s.push_str("</span>");
    }
    if let Some(st) = &r.last_status {
        s.push_str("<span class=st>");
        escape(st, s);
        s.push_str("</span>");
    }
    s.push_str("</summary><ol>");
    let mut day = String::new();
    for e in &r.entries {
        let (d, _) = clock(e.at);
        if d != day {
            s.push_str("<li class=d>");
            s.push_str(&d);
            s.push_str("</li>");
            day = d;
        }
        entry(e, s);
    }
    s.push_str("</ol></details>\n");
}

fn entry(e: &Entry, s: &mut String) {
    s.push_str(match e.cause {
        Cause::Own => "<li>",
        Cause::Other => "<li class=o>",
        Cause::Note => "<li class=n>",
    });
    line(e, s);
    if e.times > 1 {
        s.push_str(&format!("<em>×{}</em>", e.times));
    }
    items(e, s);
    if let Some(last) = &e.last {
        s.push_str("<div class=l>last: ");
        line(last, s);
        items(last, s);
        s.push_str("</div>");
    }
    s.push_str("</li>");
}

fn line(e: &Entry, s: &mut String) {
    let (_, time) = clock(e.at);
    s.push_str(&format!(
        "<time>{time}</time><span class=s>{}</span>",
        e.seq
    ));
    s.push_str("<span class=v>");
    escape(&e.event, s);
    s.push_str("</span>");
    if let Some((from, to)) = e.phase {
        s.push_str(&format!(
            "<b>phase {} → {}</b>",
            from.unwrap_or("(new)"),
            phase_name(to)
        ));
    }
}

fn items(e: &Entry, s: &mut String) {
    for (k, text) in &e.items {
        s.push_str("<p class=");
        s.push_str(class(*k));
        s.push('>');
        escape(text, s);
        s.push_str("</p>");
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn escapes_markup_and_quotes() {
        let mut s = String::new();
        super::escape("a<b>&\"c'd", &mut s);
        assert_eq!(s, "a&lt;b&gt;&amp;&quot;c&#39;d");
    }
}
