//! One error type for the whole CLI: either a message printed as `Error: <msg>` with exit 1,
//! or a bare exit code (`vm exec` relays the guest command's status without an `Error:` line).

use std::fmt;

#[derive(Debug)]
pub enum Error {
    Msg(String),
    Exit(i32),
}

pub type Result<T> = std::result::Result<T, Error>;

pub fn fail<T>(msg: impl Into<String>) -> Result<T> {
    Err(Error::Msg(msg.into()))
}

impl Error {
    /// Wraps the message like Go's `fmt.Errorf("prefix: %w", err)`, so texts read like cocoon's.
    pub fn wrap(self, prefix: impl fmt::Display) -> Error {
        match self {
            Error::Msg(m) => Error::Msg(format!("{prefix}: {m}")),
            other => other,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Msg(m) => f.write_str(m),
            Error::Exit(c) => write!(f, "exit status {c}"),
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Msg(go_io_text(&e))
    }
}

impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error::Msg(e.to_string())
    }
}

/// Go spells OS errors in lower case without the "(os error N)" suffix Rust appends.
pub fn go_io_text(e: &std::io::Error) -> String {
    let s = e.to_string();
    let s = match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    };
    let mut c = s.chars();
    match c.next() {
        Some(first) => first.to_lowercase().collect::<String>() + c.as_str(),
        None => s,
    }
}

pub trait Context<T> {
    fn ctx(self, prefix: impl fmt::Display) -> Result<T>;
}

impl<T, E: Into<Error>> Context<T> for std::result::Result<T, E> {
    fn ctx(self, prefix: impl fmt::Display) -> Result<T> {
        self.map_err(|e| e.into().wrap(prefix))
    }
}
