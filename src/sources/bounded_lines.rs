//! Lines of a child's stdout, read with a cap on what one line may hold in memory: a line over
//! the cap is skipped as it streams past (only its length is kept), so a runaway writer costs
//! at most the cap, never the whole line.

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// One line without its `\n` (or `\r\n`).
    Text(String),
    /// A line longer than the cap, of this many bytes: none of it was kept.
    TooLong(usize),
    /// The end of the stream.
    End,
}

pub struct BoundedLines<R> {
    inner: R,
    max: usize,
    buf: Vec<u8>,
}

impl<R: AsyncBufRead + Unpin> BoundedLines<R> {
    pub fn new(inner: R, max: usize) -> Self {
        Self {
            inner,
            max,
            buf: Vec::new(),
        }
    }

    /// The next line. Text that is not UTF-8 is an `InvalidData` error, as with tokio's
    /// `lines()`; a last line without `\n` still counts as a line.
    pub async fn next_line(&mut self) -> std::io::Result<Line> {
        self.buf.clear();
        let mut len = 0usize;
        let mut ended = false;
        loop {
            let available = self.inner.fill_buf().await?;
            if available.is_empty() {
                if len == 0 {
                    return Ok(Line::End);
                }
                break;
            }
            let (chunk, used) = match available.iter().position(|&b| b == b'\n') {
                Some(i) => {
                    ended = true;
                    (&available[..i], i + 1)
                }
                None => (available, available.len()),
            };
            len += chunk.len();
            if len <= self.max {
                // Grows by doubling like any Vec, but never past the cap.
                let want = len.max(self.buf.capacity() * 2).min(self.max);
                self.buf.reserve_exact(want - self.buf.len());
                self.buf.extend_from_slice(chunk);
            } else {
                self.buf.clear();
            }
            self.inner.consume(used);
            if ended {
                break;
            }
        }
        if len > self.max {
            return Ok(Line::TooLong(len));
        }
        if self.buf.last() == Some(&b'\r') {
            self.buf.pop();
        }
        String::from_utf8(std::mem::take(&mut self.buf))
            .map(Line::Text)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    }

    /// How much memory the line buffer holds.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.buf.capacity()
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::BufReader;

    use super::*;

    #[tokio::test]
    async fn an_over_long_line_is_skipped_and_the_next_one_still_arrives() {
        const MAX: usize = 1 << 10;
        let mut input = vec![b'x'; 64 * MAX];
        input.extend_from_slice(b"\n{\"event\":\"ADDED\"}\r\nlast");
        // Small reads, so the over-long line arrives in many pieces.
        let mut lines = BoundedLines::new(BufReader::with_capacity(100, &input[..]), MAX);
        assert_eq!(lines.next_line().await.unwrap(), Line::TooLong(64 * MAX));
        assert!(lines.held() <= MAX, "held {} bytes", lines.held());
        assert_eq!(
            lines.next_line().await.unwrap(),
            Line::Text("{\"event\":\"ADDED\"}".into())
        );
        assert_eq!(lines.next_line().await.unwrap(), Line::Text("last".into()));
        assert_eq!(lines.next_line().await.unwrap(), Line::End);
    }

    #[tokio::test]
    async fn a_line_of_exactly_the_cap_is_kept() {
        let input = [vec![b'y'; 300], b"\n".to_vec()].concat();
        let mut lines = BoundedLines::new(BufReader::with_capacity(7, &input[..]), 300);
        assert_eq!(
            lines.next_line().await.unwrap(),
            Line::Text("y".repeat(300))
        );
        assert!(lines.held() <= 300);
        assert_eq!(lines.next_line().await.unwrap(), Line::End);
    }

    #[tokio::test]
    async fn text_that_is_not_utf8_is_an_error() {
        let input = b"\xff\xfe\n";
        let mut lines = BoundedLines::new(&input[..], 100);
        let err = lines.next_line().await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
    }
}
