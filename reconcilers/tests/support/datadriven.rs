//! raft-rs style golden files: blocks of command lines, `----`, then the expected output up
//! to a blank line. Lines starting with `#` outside blocks are comments and survive rewrites.

pub enum Chunk {
    Raw(String),
    Block {
        /// 1-based line of the first command, for messages.
        line: usize,
        commands: Vec<String>,
        expected: Vec<String>,
    },
}

pub fn parse(text: &str) -> Vec<Chunk> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i];
        if l.trim().is_empty() || l.starts_with('#') {
            out.push(Chunk::Raw(l.to_string()));
            i += 1;
            continue;
        }
        let line = i + 1;
        let mut commands = Vec::new();
        while i < lines.len() && lines[i] != "----" {
            commands.push(lines[i].to_string());
            i += 1;
        }
        assert!(i < lines.len(), "line {line}: block without ----");
        i += 1;
        let mut expected = Vec::new();
        while i < lines.len() && !lines[i].trim().is_empty() {
            expected.push(lines[i].to_string());
            i += 1;
        }
        out.push(Chunk::Block {
            line,
            commands,
            expected,
        });
    }
    out
}

pub fn format(chunks: &[Chunk]) -> String {
    let mut s = String::new();
    for c in chunks {
        match c {
            Chunk::Raw(l) => {
                s += l;
                s.push('\n');
            }
            Chunk::Block {
                commands, expected, ..
            } => {
                for l in commands.iter().chain(std::iter::once(&"----".to_string())) {
                    s += l;
                    s.push('\n');
                }
                for l in expected {
                    s += l;
                    s.push('\n');
                }
            }
        }
    }
    s
}

/// Splits a command line on blanks; double quotes group (and are removed), `\"` escapes.
pub fn tokenize(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut any = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if quoted && chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            '"' => {
                quoted = !quoted;
                any = true;
            }
            c if c.is_whitespace() && !quoted => {
                if any || !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
                any = false;
            }
            c => cur.push(c),
        }
    }
    if any || !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// A line diff (LCS) of expected vs actual, `-`/`+` marked.
pub fn diff(expected: &[String], actual: &[String]) -> String {
    let (n, m) = (expected.len(), actual.len());
    let mut t = vec![vec![0u32; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            t[i][j] = if expected[i] == actual[j] {
                t[i + 1][j + 1] + 1
            } else {
                t[i + 1][j].max(t[i][j + 1])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    let mut s = String::new();
    while i < n || j < m {
        if i < n && j < m && expected[i] == actual[j] {
            s += &format!("   {}\n", expected[i]);
            i += 1;
            j += 1;
        } else if j < m && (i == n || t[i][j + 1] >= t[i + 1][j]) {
            s += &format!(" + {}\n", actual[j]);
            j += 1;
        } else {
            s += &format!(" - {}\n", expected[i]);
            i += 1;
        }
    }
    s
}
