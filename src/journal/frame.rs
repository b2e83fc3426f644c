//! The journal's bytes on disk: its lines, compressed as one zstd stream per run, cut into
//! frames that each end on a whole record.
//!
//! ```text
//! file    = frame+
//! frame   = tag:u8 len:u32 (little-endian) payload[len]
//! tag     = 'S'  the payload starts a new zstd stream (a header: a file's, a process's start)
//!         | 'C'  the payload continues the stream of the frame before it
//! ```
//!
//! Every payload is flushed, so it decompresses (given the stream before it) to whole lines
//! and nothing else: one `write(2)` per frame, and a process killed mid-write leaves at most
//! one frame short of its length, which the next process cuts off. The stream keeps its
//! window across frames, so a pod, a status or a VM list written again costs a few bytes of
//! back-reference instead of its full text. The lines themselves, and the hash chain over
//! them, are exactly those described in [`super::record`].

use std::io::{self, Read};

use zstd::stream::raw::{Decoder, Encoder, InBuffer, Operation, OutBuffer};

pub const SEGMENT: u8 = b'S';
pub const CONTINUE: u8 = b'C';
pub const HEAD_LEN: usize = 5;

/// What zstd's decoder asks for next when it stands between two blocks.
const BLOCK_HEADER_LEN: usize = 3;

/// A frame decompresses to at most this much: a header's state snapshot of a few thousand
/// pods is a few MiB. More is a damaged or hostile file, not a journal.
pub const MAX_LINES_PER_FRAME: usize = 256 << 20;

/// Level 3 is zstd's default: on a journal's repetitive lines it keeps a record at a small
/// fraction of its text for a few microseconds.
const LEVEL: i32 = 3;

/// A journal file of this format starts with a frame; one of the line format starts with `{`.
pub fn is_framed(first_byte: u8) -> bool {
    first_byte == SEGMENT
}

pub struct Compressor {
    enc: Encoder<'static>,
    scratch: Vec<u8>,
}

impl Compressor {
    pub fn new() -> io::Result<Compressor> {
        Ok(Compressor {
            enc: Encoder::new(LEVEL)?,
            scratch: vec![0u8; 64 * 1024],
        })
    }

    /// Appends to `out` one frame holding `lines` (whole lines). `segment` starts a new stream,
    /// which a reader can decode without anything before it.
    pub fn frame(&mut self, lines: &[u8], segment: bool, out: &mut Vec<u8>) -> io::Result<()> {
        if segment {
            self.enc.reinit()?;
        }
        let head = out.len();
        out.push(if segment { SEGMENT } else { CONTINUE });
        out.extend_from_slice(&[0; 4]);
        let mut input = InBuffer::around(lines);
        while input.pos() < lines.len() {
            let mut o = OutBuffer::around(&mut self.scratch[..]);
            self.enc.run(&mut input, &mut o)?;
            let n = o.pos();
            out.extend_from_slice(&self.scratch[..n]);
        }
        loop {
            let mut o = OutBuffer::around(&mut self.scratch[..]);
            let left = self.enc.flush(&mut o)?;
            let n = o.pos();
            out.extend_from_slice(&self.scratch[..n]);
            if left == 0 {
                break;
            }
        }
        let len = u32::try_from(out.len() - head - HEAD_LEN)
            .map_err(|_| io::Error::other("a journal frame over 4 GiB"))?;
        out[head + 1..head + HEAD_LEN].copy_from_slice(&len.to_le_bytes());
        Ok(())
    }
}

/// Why a frame cannot be read.
#[derive(Debug)]
pub enum FrameError {
    Io(io::Error),
    /// The file ends inside this frame: its writer was stopped mid-write.
    Torn,
    /// The payload is not a continuation of the stream, or not whole lines.
    Corrupt(String),
}

pub struct Decompressor {
    dec: Decoder<'static>,
    /// A segment frame has been seen: continuation frames have a stream to continue.
    in_stream: bool,
}

/// Room made in the output before each decoder call.
const DECODE_STEP: usize = 64 * 1024;

impl Decompressor {
    pub fn new() -> io::Result<Decompressor> {
        Ok(Decompressor {
            dec: Decoder::new()?,
            in_stream: false,
        })
    }

    /// Decompresses one frame's payload, appending its lines to `out`; on an error `out` is
    /// left as it was, so what it holds is whole frames only.
    pub fn frame(&mut self, tag: u8, payload: &[u8], out: &mut Vec<u8>) -> Result<(), FrameError> {
        let start = out.len();
        let r = self.frame_into(tag, payload, out);
        if r.is_err() {
            out.truncate(start);
        }
        r
    }

    fn frame_into(&mut self, tag: u8, payload: &[u8], out: &mut Vec<u8>) -> Result<(), FrameError> {
        match tag {
            SEGMENT => {
                self.dec.reinit().map_err(FrameError::Io)?;
                self.in_stream = true;
            }
            CONTINUE if self.in_stream => {}
            CONTINUE => {
                return Err(FrameError::Corrupt(
                    "a continuation frame with no stream frame before it".into(),
                ))
            }
            other => {
                return Err(FrameError::Corrupt(format!(
                    "unknown frame tag 0x{other:02x} (expected 'S' or 'C')"
                )))
            }
        }
        let start = out.len();
        let corrupt = |e: io::Error| FrameError::Corrupt(format!("does not decompress: {e}"));
        let mut input = InBuffer::around(payload);
        let mut hint;
        loop {
            let (taken, before) = (input.pos(), out.len());
            // Straight into `out`'s spare room: no second copy of every line.
            out.reserve(DECODE_STEP);
            let room = out.capacity();
            let mut o = OutBuffer::around_pos(&mut *out, before);
            hint = self.dec.run(&mut input, &mut o).map_err(corrupt)?;
            let n = out.len() - before;
            if n == 0 && input.pos() == taken && taken < payload.len() {
                return Err(FrameError::Corrupt("the decoder makes no progress".into()));
            }
            if out.len() - start > MAX_LINES_PER_FRAME {
                return Err(FrameError::Corrupt(format!(
                    "decompresses to more than {} MiB",
                    MAX_LINES_PER_FRAME >> 20
                )));
            }
            // Done once every input byte is taken and the decoder had room to spare: it has
            // nothing more buffered.
            if input.pos() == payload.len() && out.len() < room {
                break;
            }
        }
        // The writer flushes every frame: its last block ends with it, and the decoder then
        // asks for the next block's header and nothing more. A frame whose last block claims
        // bytes beyond it (a changed size) would otherwise swallow the frames after it.
        if hint != BLOCK_HEADER_LEN {
            return Err(FrameError::Corrupt(
                "a block runs past the end of its frame".into(),
            ));
        }
        if out.len() == start || !out.ends_with(b"\n") {
            return Err(FrameError::Corrupt(
                "does not decompress to whole lines".into(),
            ));
        }
        Ok(())
    }
}

/// The next frame of `r`: `None` at a clean end.
pub fn read_frame(r: &mut impl Read, payload: &mut Vec<u8>) -> Result<Option<u8>, FrameError> {
    let mut head = [0u8; HEAD_LEN];
    let mut got = 0;
    while got < HEAD_LEN {
        match r.read(&mut head[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(FrameError::Torn),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as u64;
    payload.clear();
    // `take` grows the buffer with what is there, so a huge length read from a damaged file
    // allocates no more than the file holds.
    let n = r.take(len).read_to_end(payload).map_err(FrameError::Io)? as u64;
    if n < len {
        return Err(FrameError::Torn);
    }
    Ok(Some(head[0]))
}

/// The frames of a framed file, one after the other, decompressed.
pub struct FrameReader<R> {
    rd: R,
    dec: Decompressor,
    payload: Vec<u8>,
}

impl<R: Read> FrameReader<R> {
    pub fn new(rd: R) -> io::Result<FrameReader<R>> {
        Ok(FrameReader {
            rd,
            dec: Decompressor::new()?,
            payload: Vec::new(),
        })
    }

    /// Appends the next frame's lines to `out`; `Ok(false)` at a clean end.
    pub fn next_frame(&mut self, out: &mut Vec<u8>) -> Result<bool, FrameError> {
        match read_frame(&mut self.rd, &mut self.payload)? {
            None => Ok(false),
            Some(tag) => self.dec.frame(tag, &self.payload, out).map(|()| true),
        }
    }
}

/// The first `limit` bytes of a framed file's first line, for the header's fixed prefix,
/// without decompressing the state snapshot behind it.
pub fn first_bytes(r: &mut impl Read, limit: usize) -> Option<Vec<u8>> {
    let mut head = [0u8; HEAD_LEN];
    r.read_exact(&mut head).ok()?;
    if head[0] != SEGMENT {
        return None;
    }
    let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as u64;
    let mut payload = Vec::new();
    r.take(len.min(64 * 1024)).read_to_end(&mut payload).ok()?;
    let mut dec = Decoder::new().ok()?;
    let mut out = vec![0u8; limit];
    let mut input = InBuffer::around(&payload);
    let mut o = OutBuffer::around(&mut out[..]);
    while o.pos() < limit && input.pos() < payload.len() {
        let before = (input.pos(), o.pos());
        dec.run(&mut input, &mut o).ok()?;
        if (input.pos(), o.pos()) == before {
            break;
        }
    }
    let n = o.pos();
    out.truncate(n);
    Some(out)
}

/// Frames whole journal lines as the writer would: a header line starts a new stream, every
/// other line continues it. For tools and tests that build or edit a journal as text.
pub fn frame_lines(text: &[u8]) -> io::Result<Vec<u8>> {
    let mut c = Compressor::new()?;
    let mut out = Vec::new();
    for line in text.split_inclusive(|&b| b == b'\n') {
        c.frame(line, line.starts_with(b"{\"kind\":\"header\""), &mut out)?;
    }
    Ok(out)
}

/// The lines of a journal file's bytes, whichever format it is in, up to the first frame that
/// cannot be read (`Err` carries the lines before it).
pub fn lines_of_file(bytes: &[u8]) -> Result<Vec<u8>, (Vec<u8>, FrameError)> {
    if !bytes.first().is_some_and(|&b| is_framed(b)) {
        return Ok(bytes.to_vec());
    }
    let mut frames = FrameReader::new(bytes).map_err(|e| (Vec::new(), FrameError::Io(e)))?;
    let mut out = Vec::new();
    loop {
        match frames.next_frame(&mut out) {
            Ok(true) => {}
            Ok(false) => return Ok(out),
            Err(e) => return Err((out, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(parts: &[(&[u8], bool)]) -> Vec<u8> {
        let mut c = Compressor::new().unwrap();
        let mut out = Vec::new();
        for (lines, segment) in parts {
            c.frame(lines, *segment, &mut out).unwrap();
        }
        out
    }

    fn lines_of(bytes: &[u8]) -> Result<Vec<Vec<u8>>, FrameError> {
        let mut r = bytes;
        let mut d = Decompressor::new().unwrap();
        let mut payload = Vec::new();
        let mut all = Vec::new();
        while let Some(tag) = read_frame(&mut r, &mut payload)? {
            let mut out = Vec::new();
            d.frame(tag, &payload, &mut out)?;
            all.push(out);
        }
        Ok(all)
    }

    #[test]
    fn frames_give_back_their_lines_and_a_repeat_costs_little() {
        let pod = b"{\"kind\":\"event\",\"pod\":{\"namespace\":\"default\",\"name\":\"web\",\"annotations\":{\"vm.cocoonstack.io/id\":\"V001\"}}}\n";
        let bytes = frames(&[
            (b"{\"kind\":\"header\"}\n", true),
            (pod, false),
            (pod, false),
        ]);
        let got = lines_of(&bytes).unwrap();
        assert_eq!(
            got,
            vec![
                b"{\"kind\":\"header\"}\n".to_vec(),
                pod.to_vec(),
                pod.to_vec()
            ]
        );
        let mut r = &bytes[..];
        let mut p = Vec::new();
        let sizes: Vec<usize> =
            std::iter::from_fn(|| read_frame(&mut r, &mut p).unwrap().map(|_| p.len())).collect();
        assert!(sizes[2] < pod.len() / 4, "a repeated line: {sizes:?}");
    }

    #[test]
    fn a_second_segment_decodes_without_the_first() {
        let bytes = frames(&[
            (b"a\n", true),
            (b"b\n", false),
            (b"c\n", true),
            (b"d\n", false),
        ]);
        let mut r = &bytes[..];
        let mut p = Vec::new();
        // Skip the first segment's two frames, then read the second on a fresh decompressor.
        read_frame(&mut r, &mut p).unwrap();
        read_frame(&mut r, &mut p).unwrap();
        assert_eq!(lines_of(r).unwrap(), vec![b"c\n".to_vec(), b"d\n".to_vec()]);
    }

    #[test]
    fn a_short_file_is_torn_and_a_changed_byte_is_caught() {
        let bytes = frames(&[(b"first line\n", true), (b"second line\n", false)]);
        for cut in 1..bytes.len() {
            let r = lines_of(&bytes[..cut]);
            let whole_frames = r.is_ok();
            assert!(
                whole_frames || matches!(r, Err(FrameError::Torn)),
                "cut at {cut}"
            );
        }
        assert!(matches!(
            lines_of(b"C\x01\0\0\0x"),
            Err(FrameError::Corrupt(_))
        ));
        assert!(matches!(
            lines_of(b"X\0\0\0\0"),
            Err(FrameError::Corrupt(_))
        ));
        let mut changed = 0;
        for i in HEAD_LEN..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x20;
            if lines_of(&b).ok() != Some(vec![b"first line\n".to_vec(), b"second line\n".to_vec()])
            {
                changed += 1;
            }
        }
        // A flipped byte in a length makes the frame torn or shifts the next one; in a payload
        // it changes what decompresses. The line hashes catch the rest.
        assert!(changed > 0);
    }

    #[test]
    fn the_first_bytes_of_the_first_line_come_without_the_rest() {
        let mut big = b"{\"kind\":\"header\",\"version\":6,\"file_no\":3,".to_vec();
        big.extend(std::iter::repeat_n(b'x', 1 << 20));
        big.extend_from_slice(b"}\n");
        let bytes = frames(&[(&big, true)]);
        let got = first_bytes(&mut &bytes[..], 64).unwrap();
        assert_eq!(got, big[..64].to_vec());
    }
}
