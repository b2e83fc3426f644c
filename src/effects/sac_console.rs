//! One SAC console connection: lines out, answers in. SAC has no framing but its prompt, so an
//! answer is whatever the console printed before the next `SAC>`. The console echoes what it
//! receives and mixes CR, LF and CRLF, so nothing here depends on line ends or on reads lining
//! up with lines.

use std::fmt;
use std::io;
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::time::Instant;

const PROMPT: &[u8] = b"SAC>";

/// A console that prints without pause (a boot log, a stuck key) costs at most this much
/// memory. Only the tail matters: the prompt and the answer just before it.
pub(crate) const MAX_BUFFERED: usize = 64 * 1024;

#[derive(Debug)]
pub(crate) enum ConsoleError {
    TimedOut,
    Closed,
    Io(io::Error),
}

impl fmt::Display for ConsoleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConsoleError::TimedOut => f.write_str("timed out"),
            ConsoleError::Closed => f.write_str("the console closed the connection"),
            ConsoleError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl From<io::Error> for ConsoleError {
    fn from(e: io::Error) -> Self {
        ConsoleError::Io(e)
    }
}

pub(crate) struct Console {
    stream: UnixStream,
    buf: Vec<u8>,
    /// The bytes of `buf` already searched for a prompt: a console that prints a byte at a
    /// time is not searched again from the start for every byte.
    searched: usize,
    /// Output was dropped to stay within `MAX_BUFFERED` (counted once per dialog).
    pub(crate) trimmed: bool,
}

impl Console {
    pub(crate) async fn connect(socket: &Path) -> io::Result<Console> {
        Ok(Console {
            stream: UnixStream::connect(socket).await?,
            buf: Vec::new(),
            searched: 0,
            trimmed: false,
        })
    }

    /// Sends an empty line and waits until `by` for any prompt. Everything before it (a boot
    /// banner, the echo, earlier output) is dropped.
    pub(crate) async fn prompt(&mut self, by: Instant) -> Result<(), ConsoleError> {
        self.send("", by).await?;
        loop {
            if self.take_segment().is_some() {
                return Ok(());
            }
            self.read(by).await?;
        }
    }

    /// Sends `line` and returns SAC's answer: the text (the echo included) before the next
    /// prompt, passing over texts that answer nothing we sent. Those are blank (a prompt owed
    /// to an earlier empty line: several CRLFs sent to a slow console each earn one) or only
    /// `EVENT:` notices, which SAC prints on its own, prompt and all, while Windows boots.
    /// Both arrive before the echo of this line, so they are never mistaken for its answer.
    pub(crate) async fn command(
        &mut self,
        line: &str,
        within: Duration,
    ) -> Result<String, ConsoleError> {
        let by = Instant::now() + within;
        self.send(line, by).await?;
        loop {
            while let Some(text) = self.take_segment() {
                if !unsolicited(&text) {
                    return Ok(text);
                }
            }
            self.read(by).await?;
        }
    }

    async fn send(&mut self, line: &str, by: Instant) -> Result<(), ConsoleError> {
        let bytes = format!("{line}\r\n");
        match tokio::time::timeout_at(by, self.stream.write_all(bytes.as_bytes())).await {
            Ok(r) => Ok(r?),
            Err(_) => Err(ConsoleError::TimedOut),
        }
    }

    /// The text before the first prompt in the buffer, removed with its prompt.
    fn take_segment(&mut self) -> Option<String> {
        // A prompt may straddle what was searched and what came since.
        let from = self.searched.saturating_sub(PROMPT.len() - 1);
        let Some(at) = self.buf[from..]
            .windows(PROMPT.len())
            .position(|w| w == PROMPT)
        else {
            self.searched = self.buf.len();
            return None;
        };
        let at = from + at;
        let text = String::from_utf8_lossy(&self.buf[..at]).into_owned();
        self.buf.drain(..at + PROMPT.len());
        self.searched = 0;
        Some(text)
    }

    /// One read into the buffer. Called only when the buffer holds no whole prompt, so
    /// trimming it to its tail loses nothing but old output (a prompt split across reads
    /// stays whole: it is at the very end).
    async fn read(&mut self, by: Instant) -> Result<(), ConsoleError> {
        let dropped = keep_tail(&mut self.buf, MAX_BUFFERED);
        self.searched = self.searched.saturating_sub(dropped);
        self.trimmed |= dropped > 0;
        let mut chunk = [0u8; 4096];
        match tokio::time::timeout_at(by, self.stream.read(&mut chunk)).await {
            Err(_) => Err(ConsoleError::TimedOut),
            Ok(Err(e)) => Err(ConsoleError::Io(e)),
            Ok(Ok(0)) => Err(ConsoleError::Closed),
            Ok(Ok(n)) => {
                self.buf.extend_from_slice(&chunk[..n]);
                Ok(())
            }
        }
    }
}

fn unsolicited(text: &str) -> bool {
    text.split(['\r', '\n'])
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .all(|l| l.starts_with("EVENT:"))
}

/// Trims `buf` to its last `max` bytes; returns how many went.
pub(crate) fn keep_tail(buf: &mut Vec<u8>, max: usize) -> usize {
    let over = buf.len().saturating_sub(max);
    buf.drain(..over);
    over
}

/// The `Net: N, Ip=<IPv4>` entries of an `i` answer, in listing order. The IPv6 lines SAC
/// prints for the same interfaces (`Net: N, Ip=fe80::…`) are left out.
pub(crate) fn listed_ipv4(answer: &str) -> Vec<(u32, Ipv4Addr)> {
    answer
        .split(['\r', '\n'])
        .filter_map(|line| {
            let rest = &line[line.find("Net:")? + "Net:".len()..];
            let (net, rest) = rest.split_once(',')?;
            let net = net.trim().parse::<u32>().ok()?;
            let ip = rest.trim_start().strip_prefix("Ip=")?;
            let ip = ip.split_whitespace().next()?.parse::<Ipv4Addr>().ok()?;
            Some((net, ip))
        })
        .collect()
}

/// Interface numbers with an IPv4 entry, each once, in order of first appearance. SAC's
/// numbers are Windows interface indices and say nothing about NIC positions; the order of the
/// listing is all there is to go by.
pub(crate) fn distinct_nets(listed: &[(u32, Ipv4Addr)]) -> Vec<u32> {
    let mut nets: Vec<u32> = Vec::new();
    for (net, _) in listed {
        if !nets.contains(net) {
            nets.push(*net);
        }
    }
    nets
}
