//! SPDY/3.1 frames as the Kubernetes clients (moby/spdystream) write and read them: the
//! control frames a stream multiplexer needs and data frames. Header blocks are one zlib
//! stream per direction for the whole connection, primed with the SPDY dictionary and
//! sync-flushed after every block, so each end keeps one compressor and one decompressor.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

use super::spdy_dictionary::DICTIONARY;

const VERSION: u16 = 3;
pub const FLAG_FIN: u8 = 0x01;
/// A frame is refused past this: every Kubernetes frame is far smaller, and a length field of
/// up to 16 MiB would otherwise let a caller make the daemon buffer that much.
pub const MAX_FRAME: usize = 1 << 20;
/// Decompressed header blocks larger than this are refused (a zlib bomb in a header block).
const MAX_HEADER_BLOCK: usize = 64 * 1024;

const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const SETTINGS: u16 = 4;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const HEADERS: u16 = 8;
const WINDOW_UPDATE: u16 = 9;

/// The status of a GOAWAY sent for a frame that makes no sense.
pub const RST_PROTOCOL_ERROR: u32 = 1;

pub type Headers = Vec<(String, String)>;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    SynStream {
        stream: u32,
        fin: bool,
        headers: Headers,
    },
    SynReply {
        stream: u32,
        fin: bool,
        headers: Headers,
    },
    RstStream {
        stream: u32,
        status: u32,
    },
    Settings,
    Ping {
        id: u32,
    },
    GoAway {
        last_good: u32,
        status: u32,
    },
    Headers {
        stream: u32,
        fin: bool,
        headers: Headers,
    },
    WindowUpdate {
        stream: u32,
        delta: u32,
    },
    Data {
        stream: u32,
        fin: bool,
        data: Bytes,
    },
    /// A control frame type this end has no use for; skipped as the protocol asks.
    Unknown,
}

impl Frame {
    /// The value of header `name` (header names compare without case: Go writes them
    /// lowercased, and some senders do not).
    pub fn header<'a>(headers: &'a Headers, name: &str) -> Option<&'a str> {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Debug, PartialEq, Eq)]
pub struct FrameError(pub String);

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn bad(msg: impl Into<String>) -> FrameError {
    FrameError(msg.into())
}

/// Both directions' header compression state of one connection.
pub struct Codec {
    inflate: Decompress,
    deflate: Compress,
}

impl Default for Codec {
    fn default() -> Self {
        let mut deflate = Compress::new(Compression::best(), true);
        deflate
            .set_dictionary(DICTIONARY)
            .expect("priming a fresh compressor with a dictionary cannot fail");
        Self {
            inflate: Decompress::new(true),
            deflate,
        }
    }
}

impl Codec {
    /// Takes one whole frame off the front of `buf`; `Ok(None)` until a whole frame is there.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        if buf.len() < 8 {
            return Ok(None);
        }
        let length = (u32::from_be_bytes([0, buf[5], buf[6], buf[7]])) as usize;
        if length > MAX_FRAME {
            return Err(bad(format!("frame of {length} bytes is over the limit")));
        }
        if buf.len() < 8 + length {
            return Ok(None);
        }
        let head = buf.split_to(8);
        let mut body = buf.split_to(length).freeze();
        let flags = head[4];
        let fin = flags & FLAG_FIN != 0;
        if head[0] & 0x80 == 0 {
            let stream = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) & 0x7fff_ffff;
            return Ok(Some(Frame::Data {
                stream,
                fin,
                data: body,
            }));
        }
        let version = u16::from_be_bytes([head[0] & 0x7f, head[1]]);
        if version != VERSION {
            return Err(bad(format!("SPDY version {version} is not 3")));
        }
        let kind = u16::from_be_bytes([head[2], head[3]]);
        let need = |n: usize, body: &Bytes| match body.len() >= n {
            true => Ok(()),
            false => Err(bad(format!("control frame {kind} is too short"))),
        };
        let frame = match kind {
            SYN_STREAM => {
                need(10, &body)?;
                let stream = body.get_u32() & 0x7fff_ffff;
                body.advance(6); // associated stream, priority, slot: unused by Kubernetes
                Frame::SynStream {
                    stream,
                    fin,
                    headers: self.headers(&body)?,
                }
            }
            SYN_REPLY | HEADERS => {
                need(4, &body)?;
                let stream = body.get_u32() & 0x7fff_ffff;
                let headers = self.headers(&body)?;
                match kind {
                    SYN_REPLY => Frame::SynReply {
                        stream,
                        fin,
                        headers,
                    },
                    _ => Frame::Headers {
                        stream,
                        fin,
                        headers,
                    },
                }
            }
            RST_STREAM => {
                need(8, &body)?;
                Frame::RstStream {
                    stream: body.get_u32() & 0x7fff_ffff,
                    status: body.get_u32(),
                }
            }
            SETTINGS => Frame::Settings,
            PING => {
                need(4, &body)?;
                Frame::Ping { id: body.get_u32() }
            }
            GOAWAY => {
                need(8, &body)?;
                Frame::GoAway {
                    last_good: body.get_u32() & 0x7fff_ffff,
                    status: body.get_u32(),
                }
            }
            WINDOW_UPDATE => {
                need(8, &body)?;
                Frame::WindowUpdate {
                    stream: body.get_u32() & 0x7fff_ffff,
                    delta: body.get_u32() & 0x7fff_ffff,
                }
            }
            _ => Frame::Unknown,
        };
        Ok(Some(frame))
    }

    fn headers(&mut self, block: &[u8]) -> Result<Headers, FrameError> {
        let raw = self.inflate_block(block)?;
        parse_name_values(&raw)
    }

    fn inflate_block(&mut self, mut input: &[u8]) -> Result<Vec<u8>, FrameError> {
        let mut out = Vec::with_capacity(256);
        loop {
            if out.len() == out.capacity() {
                if out.len() >= MAX_HEADER_BLOCK {
                    return Err(bad("header block is over the limit"));
                }
                out.reserve(out.len().max(256));
            }
            let before = self.inflate.total_in();
            let produced = out.len();
            let res = self
                .inflate
                .decompress_vec(input, &mut out, FlushDecompress::Sync);
            let used = (self.inflate.total_in() - before) as usize;
            input = &input[used..];
            match res {
                Ok(Status::StreamEnd) => return Ok(out),
                Ok(_) => {
                    if input.is_empty() && out.len() < out.capacity() {
                        return Ok(out);
                    }
                    if used == 0 && out.len() == produced && out.len() < out.capacity() {
                        return Err(bad("header block does not decompress"));
                    }
                }
                Err(e) if e.needs_dictionary().is_some() => {
                    self.inflate
                        .set_dictionary(DICTIONARY)
                        .map_err(|e| bad(format!("header dictionary: {e}")))?;
                }
                Err(e) => return Err(bad(format!("header block: {e}"))),
            }
        }
    }

    fn deflate_block(&mut self, input: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(input.len() / 2 + 64);
        let mut rest = input;
        loop {
            if out.len() == out.capacity() {
                out.reserve(out.len().max(64));
            }
            let before = self.deflate.total_in();
            self.deflate
                .compress_vec(rest, &mut out, FlushCompress::Sync)
                .expect("deflate into a growing buffer cannot fail");
            rest = &rest[(self.deflate.total_in() - before) as usize..];
            if rest.is_empty() && out.len() < out.capacity() {
                return out;
            }
        }
    }

    /// The bytes of `frame` on the wire.
    pub fn encode(&mut self, frame: &Frame) -> Bytes {
        let mut out = BytesMut::new();
        let control = |out: &mut BytesMut, kind: u16, flags: u8, body: &[u8]| {
            out.put_u16(0x8000 | VERSION);
            out.put_u16(kind);
            out.put_u8(flags);
            out.put_uint(body.len() as u64, 3);
            out.put_slice(body);
        };
        let fin_flag = |fin: bool| if fin { FLAG_FIN } else { 0 };
        match frame {
            Frame::Data { stream, fin, data } => {
                out.put_u32(stream & 0x7fff_ffff);
                out.put_u8(fin_flag(*fin));
                out.put_uint(data.len() as u64, 3);
                out.put_slice(data);
            }
            Frame::SynStream {
                stream,
                fin,
                headers,
            } => {
                let mut body = BytesMut::new();
                body.put_u32(*stream);
                body.put_u32(0);
                body.put_u16(0);
                body.put_slice(&self.deflate_block(&name_values(headers)));
                control(&mut out, SYN_STREAM, fin_flag(*fin), &body);
            }
            Frame::SynReply {
                stream,
                fin,
                headers,
            }
            | Frame::Headers {
                stream,
                fin,
                headers,
            } => {
                let kind = match frame {
                    Frame::SynReply { .. } => SYN_REPLY,
                    _ => HEADERS,
                };
                let mut body = BytesMut::new();
                body.put_u32(*stream);
                body.put_slice(&self.deflate_block(&name_values(headers)));
                control(&mut out, kind, fin_flag(*fin), &body);
            }
            Frame::RstStream { stream, status } => {
                let mut body = [0u8; 8];
                body[..4].copy_from_slice(&stream.to_be_bytes());
                body[4..].copy_from_slice(&status.to_be_bytes());
                control(&mut out, RST_STREAM, 0, &body);
            }
            Frame::Settings => control(&mut out, SETTINGS, 0, &0u32.to_be_bytes()),
            Frame::Ping { id } => control(&mut out, PING, 0, &id.to_be_bytes()),
            Frame::GoAway { last_good, status } => {
                let mut body = [0u8; 8];
                body[..4].copy_from_slice(&last_good.to_be_bytes());
                body[4..].copy_from_slice(&status.to_be_bytes());
                control(&mut out, GOAWAY, 0, &body);
            }
            Frame::WindowUpdate { stream, delta } => {
                let mut body = [0u8; 8];
                body[..4].copy_from_slice(&stream.to_be_bytes());
                body[4..].copy_from_slice(&delta.to_be_bytes());
                control(&mut out, WINDOW_UPDATE, 0, &body);
            }
            Frame::Unknown => {}
        }
        out.freeze()
    }
}

/// The uncompressed name/value block: a count, then length-prefixed names and values.
fn name_values(headers: &Headers) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(headers.len() as u32).to_be_bytes());
    for (k, v) in headers {
        out.extend_from_slice(&(k.len() as u32).to_be_bytes());
        out.extend_from_slice(k.to_ascii_lowercase().as_bytes());
        out.extend_from_slice(&(v.len() as u32).to_be_bytes());
        out.extend_from_slice(v.as_bytes());
    }
    out
}

fn parse_name_values(mut raw: &[u8]) -> Result<Headers, FrameError> {
    let take = |raw: &mut &[u8]| -> Result<Vec<u8>, FrameError> {
        if raw.len() < 4 {
            return Err(bad("header block is cut short"));
        }
        let n = u32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]) as usize;
        if raw.len() < 4 + n {
            return Err(bad("header block is cut short"));
        }
        let v = raw[4..4 + n].to_vec();
        *raw = &raw[4 + n..];
        Ok(v)
    };
    if raw.len() < 4 {
        return Err(bad("header block is cut short"));
    }
    let count = u32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]) as usize;
    raw = &raw[4..];
    let mut out = Vec::new();
    for _ in 0..count {
        let k = take(&mut raw)?;
        let v = take(&mut raw)?;
        // Several values of one name travel NUL-separated; the first is the one that counts.
        let v = v.split(|b| *b == 0).next().unwrap_or_default().to_vec();
        out.push((
            String::from_utf8_lossy(&k).into_owned(),
            String::from_utf8_lossy(&v).into_owned(),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn decode_all(codec: &mut Codec, bytes: &[u8]) -> Vec<Frame> {
        let mut buf = BytesMut::from(bytes);
        let mut out = Vec::new();
        while let Some(f) = codec.decode(&mut buf).unwrap() {
            out.push(f);
        }
        assert!(buf.is_empty(), "{} bytes left over", buf.len());
        out
    }

    /// Written by moby/spdystream's framer: SYN_STREAM 1 (streamType=error), SYN_STREAM 3
    /// (streamType=stdout, unidirectional) sharing its compression context, then DATA "hi\n"
    /// with FIN on stream 3.
    const FROM_GO: &str = "80030001000000290000000100000000000078f9e3c6a7c26260606004a7b392a2d4\
        c45c6851c29a0a0a6800000000ffff800300010200001900000003000000000000c22ac5565c92925f5a0200\
        0000ffff000000030100000368690a";

    #[test]
    fn frames_written_by_the_go_framer_are_read() {
        let mut codec = Codec::default();
        let frames = decode_all(&mut codec, &hex(FROM_GO));
        assert_eq!(
            frames,
            vec![
                Frame::SynStream {
                    stream: 1,
                    fin: false,
                    headers: vec![("streamtype".into(), "error".into())]
                },
                Frame::SynStream {
                    stream: 3,
                    fin: false,
                    headers: vec![("streamtype".into(), "stdout".into())]
                },
                Frame::Data {
                    stream: 3,
                    fin: true,
                    data: Bytes::from_static(b"hi\n")
                },
            ]
        );
        let Frame::SynStream { headers, .. } = &frames[0] else {
            unreachable!()
        };
        assert_eq!(Frame::header(headers, "streamType"), Some("error"));
    }

    #[test]
    fn header_blocks_round_trip_through_the_dictionary_compression() {
        let mut writer = Codec::default();
        let mut reader = Codec::default();
        let frames = vec![
            Frame::SynReply {
                stream: 1,
                fin: false,
                headers: vec![],
            },
            Frame::SynStream {
                stream: 2,
                fin: true,
                headers: vec![
                    ("streamtype".into(), "data".into()),
                    ("port".into(), "8080".into()),
                    ("requestid".into(), "0".into()),
                ],
            },
            Frame::Headers {
                stream: 2,
                fin: false,
                headers: vec![("x".into(), "y".repeat(5000))],
            },
            Frame::Data {
                stream: 2,
                fin: false,
                data: Bytes::from_static(b"payload"),
            },
            Frame::RstStream {
                stream: 2,
                status: 3,
            },
            Frame::Ping { id: 7 },
            Frame::GoAway {
                last_good: 5,
                status: 0,
            },
            Frame::WindowUpdate {
                stream: 1,
                delta: 65536,
            },
        ];
        let mut wire = Vec::new();
        for f in &frames {
            wire.extend_from_slice(&writer.encode(f));
        }
        // The compressed header block really used the dictionary: the stream's zlib header
        // carries the FDICT flag and the dictionary's id.
        assert_eq!(wire[13] & 0x20, 0x20, "zlib header without a dictionary");
        assert_eq!(decode_all(&mut reader, &wire), frames);
    }

    #[test]
    fn a_frame_split_across_reads_waits_for_its_rest() {
        let mut codec = Codec::default();
        let bytes = hex(FROM_GO);
        let mut buf = BytesMut::from(&bytes[..20]);
        assert_eq!(codec.decode(&mut buf).unwrap(), None);
        buf.extend_from_slice(&bytes[20..]);
        assert!(matches!(
            codec.decode(&mut buf).unwrap(),
            Some(Frame::SynStream { stream: 1, .. })
        ));
    }

    #[test]
    fn hand_built_control_frames_are_read() {
        let mut codec = Codec::default();
        let wire = [
            // PING id 9
            0x80, 0x03, 0x00, 0x06, 0x00, 0x00, 0x00, 0x04, 0, 0, 0, 9,
            // SETTINGS with one entry (initial window size)
            0x80, 0x03, 0x00, 0x04, 0x00, 0x00, 0x00, 0x0c, 0, 0, 0, 1, 0, 0, 0, 7, 0, 1, 0, 0,
            // RST_STREAM stream 3, CANCEL
            0x80, 0x03, 0x00, 0x03, 0x00, 0x00, 0x00, 0x08, 0, 0, 0, 3, 0, 0, 0, 5,
            // an unknown control type 12 with a 2-byte body
            0x80, 0x03, 0x00, 0x0c, 0x00, 0x00, 0x00, 0x02, 1, 2,
            // DATA stream 5, FIN, empty
            0x00, 0x00, 0x00, 0x05, 0x01, 0x00, 0x00, 0x00,
        ];
        assert_eq!(
            decode_all(&mut codec, &wire),
            vec![
                Frame::Ping { id: 9 },
                Frame::Settings,
                Frame::RstStream {
                    stream: 3,
                    status: 5
                },
                Frame::Unknown,
                Frame::Data {
                    stream: 5,
                    fin: true,
                    data: Bytes::new()
                },
            ]
        );
    }

    #[test]
    fn bad_frames_are_refused() {
        let mut codec = Codec::default();
        // SPDY/2
        let mut buf = BytesMut::from(&[0x80, 0x02, 0x00, 0x06, 0, 0, 0, 4, 0, 0, 0, 1][..]);
        assert!(codec.decode(&mut buf).is_err());
        // over the size limit
        let mut buf = BytesMut::from(&[0x00, 0x00, 0x00, 0x01, 0, 0xff, 0xff, 0xff][..]);
        assert!(codec.decode(&mut buf).is_err());
        // a PING too short to hold its id
        let mut buf = BytesMut::from(&[0x80, 0x03, 0x00, 0x06, 0, 0, 0, 2, 0, 0][..]);
        assert!(codec.decode(&mut buf).is_err());
        // a header block that is not zlib
        let mut buf = BytesMut::from(
            &[
                0x80, 0x03, 0x00, 0x02, 0, 0, 0, 8, 0, 0, 0, 1, 0xde, 0xad, 0xbe, 0xef,
            ][..],
        );
        assert!(codec.decode(&mut buf).is_err());
    }
}
