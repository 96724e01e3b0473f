//! SPDY/3.1 frames: the 8-byte frame header, the control frames a session uses and data
//! frames, decoded from and encoded to bytes.
//!
//! Every frame starts with two 32-bit words. A control frame: the control bit, a 15-bit
//! version (3), a 16-bit type; then 8 bits of flags and a 24-bit payload length. A data
//! frame: a clear control bit and a 31-bit stream id; then flags and the 24-bit length.
//!
//! Decoding works on a buffer of what the socket gave so far: [`Decoder::decode`] returns
//! `Ok(None)` until a whole frame is there, so a frame split across reads is never an
//! error, while one whose fields contradict its length is. A data payload is split off the
//! read buffer without copying. Unknown control types are skipped (the spec says to ignore
//! them; CREDENTIAL is one). Header blocks go through the session's one zlib stream per
//! direction ([`super::header`]), so the decoder and encoder are stateful and must see the
//! frames in wire order.
//!
//! Lengths are the peer's claims: a control frame longer than [`MAX_CONTROL_PAYLOAD`] is an
//! error as soon as its header is there, and room for a frame still arriving is reserved
//! [`RESERVE_STEP`] at a time, never from its length (a data frame may be up to 16 MiB, as
//! spdystream allows, but only the bytes actually sent are buffered).

use bytes::{Buf, Bytes, BytesMut};

use super::header::{HeaderDecoder, HeaderEncoder, HeaderError, Headers, MAX_HEADER_BLOCK};

/// The protocol version in every control frame.
pub(crate) const VERSION: u16 = 3;
/// The largest payload a frame can carry (24-bit length).
pub(crate) const MAX_PAYLOAD: usize = (1 << 24) - 1;
/// The frame header's size.
pub(crate) const HEADER_LEN: usize = 8;
/// The largest control frame payload accepted: a header block never needs more than its
/// decompressed bound (deflate adds a few bytes per 16 KiB at worst), the other control frames
/// are a few words. Checked from the frame header, before anything is buffered for it.
pub(crate) const MAX_CONTROL_PAYLOAD: usize = MAX_HEADER_BLOCK + 1024;
/// What the decoder reserves at most, at once, for a frame still arriving: a frame's length
/// is the peer's claim, so room is made as its bytes come, not from the claim.
pub(crate) const RESERVE_STEP: usize = 64 * 1024;

/// The FIN flag (data frames, SYN_STREAM, SYN_REPLY, HEADERS).
pub(crate) const FLAG_FIN: u8 = 0x01;
/// SYN_STREAM's UNIDIRECTIONAL flag.
pub(crate) const FLAG_UNIDIRECTIONAL: u8 = 0x02;
/// SETTINGS' CLEAR_SETTINGS flag (ignored by the session; the tests send it).
#[cfg(test)]
pub(crate) const FLAG_CLEAR_SETTINGS: u8 = 0x01;

const TYPE_SYN_STREAM: u16 = 1;
const TYPE_SYN_REPLY: u16 = 2;
const TYPE_RST_STREAM: u16 = 3;
const TYPE_SETTINGS: u16 = 4;
const TYPE_PING: u16 = 6;
const TYPE_GOAWAY: u16 = 7;
const TYPE_HEADERS: u16 = 8;
const TYPE_WINDOW_UPDATE: u16 = 9;

/// RST_STREAM status: PROTOCOL_ERROR.
pub(crate) const RST_PROTOCOL_ERROR: u32 = 1;
/// RST_STREAM status: REFUSED_STREAM.
pub(crate) const RST_REFUSED_STREAM: u32 = 3;
/// GOAWAY status: OK.
pub(crate) const GOAWAY_OK: u32 = 0;
/// GOAWAY status: PROTOCOL_ERROR.
pub(crate) const GOAWAY_PROTOCOL_ERROR: u32 = 1;
/// SETTINGS id: INITIAL_WINDOW_SIZE.
pub(crate) const SETTINGS_INITIAL_WINDOW_SIZE: u32 = 7;

const STREAM_ID_MASK: u32 = 0x7fff_ffff;

/// One setting of a SETTINGS frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Setting {
    pub flags: u8,
    /// 24-bit id.
    pub id: u32,
    pub value: u32,
}

/// A decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Frame {
    Data {
        stream_id: u32,
        fin: bool,
        data: Bytes,
    },
    SynStream {
        stream_id: u32,
        associated_id: u32,
        /// 3-bit priority.
        priority: u8,
        slot: u8,
        flags: u8,
        headers: Headers,
    },
    SynReply {
        stream_id: u32,
        fin: bool,
        headers: Headers,
    },
    RstStream {
        stream_id: u32,
        status: u32,
    },
    Settings {
        flags: u8,
        settings: Vec<Setting>,
    },
    Ping {
        id: u32,
    },
    GoAway {
        last_good_id: u32,
        status: u32,
    },
    Headers {
        stream_id: u32,
        fin: bool,
        headers: Headers,
    },
    WindowUpdate {
        stream_id: u32,
        delta: u32,
    },
    /// A control frame of a type this codec does not know; skipped.
    Unknown {
        kind: u16,
        flags: u8,
        len: u32,
    },
}

/// What makes bytes not a SPDY/3.1 frame, or a frame not encodable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    /// A control frame of another protocol version.
    #[error("unsupported SPDY version {0}")]
    Version(u16),
    /// A control frame whose length does not fit its type.
    #[error("{kind} frame with a bad length {len}")]
    Length {
        /// The frame type.
        kind: &'static str,
        /// The length it declared.
        len: u32,
    },
    /// Stream id 0 where a stream is required.
    #[error("{0} frame on stream 0")]
    ZeroStreamId(&'static str),
    /// A header block that does not decode.
    #[error(transparent)]
    Header(#[from] HeaderError),
    /// The connection ended inside a frame.
    #[error("connection ended inside a frame ({0} bytes buffered)")]
    Truncated(usize),
    /// A payload longer than the 24-bit length field can say.
    #[error("payload of {0} bytes exceeds the 24-bit frame length")]
    TooLarge(usize),
    /// A frame with a header block given to [`encode_plain`].
    #[error("frame with a header block needs the session's encoder")]
    NeedsEncoder,
    /// A stream id with the high bit set.
    #[error("stream id {0} exceeds 31 bits")]
    StreamId(u32),
}

/// Decodes frames; holds the inbound header zlib stream.
pub(crate) struct Decoder {
    headers: HeaderDecoder,
}

impl Decoder {
    pub(crate) fn new() -> Self {
        Decoder {
            headers: HeaderDecoder::new(),
        }
    }

    /// What the header decompressor holds allocated.
    #[cfg(test)]
    pub(crate) fn header_capacity(&self) -> usize {
        self.headers.capacity()
    }

    /// The next whole frame at the front of `buf`, removed from it; `Ok(None)` if `buf` does
    /// not hold a whole frame yet. After an error the session's header stream is unusable.
    pub(crate) fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        let Some(head) = buf.first_chunk::<HEADER_LEN>() else {
            return Ok(None);
        };
        let word = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
        let flags = head[4];
        let len = u32::from_be_bytes([0, head[5], head[6], head[7]]);
        if word & 0x8000_0000 != 0 && len as usize > MAX_CONTROL_PAYLOAD {
            return Err(FrameError::Length {
                kind: "control",
                len,
            });
        }
        let total = HEADER_LEN + len as usize;
        if buf.len() < total {
            buf.reserve((total - buf.len()).min(RESERVE_STEP));
            return Ok(None);
        }
        let mut frame = buf.split_to(total);
        frame.advance(HEADER_LEN);
        if word & 0x8000_0000 == 0 {
            let stream_id = word & STREAM_ID_MASK;
            if stream_id == 0 {
                return Err(FrameError::ZeroStreamId("DATA"));
            }
            return Ok(Some(Frame::Data {
                stream_id,
                fin: flags & FLAG_FIN != 0,
                data: frame.freeze(),
            }));
        }
        let version = ((word >> 16) & 0x7fff) as u16;
        if version != VERSION {
            return Err(FrameError::Version(version));
        }
        let kind = (word & 0xffff) as u16;
        self.control(kind, flags, &frame).map(Some)
    }

    fn control(&mut self, kind: u16, flags: u8, p: &[u8]) -> Result<Frame, FrameError> {
        let len = p.len() as u32;
        let bad = |kind| FrameError::Length { kind, len };
        let word = |i: usize| u32::from_be_bytes([p[i], p[i + 1], p[i + 2], p[i + 3]]);
        let fin = flags & FLAG_FIN != 0;
        Ok(match kind {
            TYPE_SYN_STREAM => {
                if p.len() < 10 {
                    return Err(bad("SYN_STREAM"));
                }
                let stream_id = nonzero(word(0) & STREAM_ID_MASK, "SYN_STREAM")?;
                Frame::SynStream {
                    stream_id,
                    associated_id: word(4) & STREAM_ID_MASK,
                    priority: p[8] >> 5,
                    slot: p[9],
                    flags,
                    headers: self.headers.decode(&p[10..])?,
                }
            }
            TYPE_SYN_REPLY | TYPE_HEADERS => {
                let name = if kind == TYPE_SYN_REPLY {
                    "SYN_REPLY"
                } else {
                    "HEADERS"
                };
                if p.len() < 4 {
                    return Err(bad(name));
                }
                let stream_id = nonzero(word(0) & STREAM_ID_MASK, name)?;
                let headers = self.headers.decode(&p[4..])?;
                if kind == TYPE_SYN_REPLY {
                    Frame::SynReply {
                        stream_id,
                        fin,
                        headers,
                    }
                } else {
                    Frame::Headers {
                        stream_id,
                        fin,
                        headers,
                    }
                }
            }
            TYPE_RST_STREAM => {
                if p.len() != 8 {
                    return Err(bad("RST_STREAM"));
                }
                Frame::RstStream {
                    stream_id: nonzero(word(0) & STREAM_ID_MASK, "RST_STREAM")?,
                    status: word(4),
                }
            }
            TYPE_SETTINGS => {
                if p.len() < 4 {
                    return Err(bad("SETTINGS"));
                }
                let count = word(0) as usize;
                if (p.len() - 4) / 8 != count || !(p.len() - 4).is_multiple_of(8) {
                    return Err(bad("SETTINGS"));
                }
                let settings = (0..count)
                    .map(|i| {
                        let at = 4 + i * 8;
                        let id = word(at);
                        Setting {
                            flags: (id >> 24) as u8,
                            id: id & 0x00ff_ffff,
                            value: word(at + 4),
                        }
                    })
                    .collect();
                Frame::Settings { flags, settings }
            }
            TYPE_PING => {
                if p.len() != 4 {
                    return Err(bad("PING"));
                }
                Frame::Ping { id: word(0) }
            }
            TYPE_GOAWAY => {
                if p.len() != 8 {
                    return Err(bad("GOAWAY"));
                }
                Frame::GoAway {
                    last_good_id: word(0) & STREAM_ID_MASK,
                    status: word(4),
                }
            }
            TYPE_WINDOW_UPDATE => {
                if p.len() != 8 {
                    return Err(bad("WINDOW_UPDATE"));
                }
                Frame::WindowUpdate {
                    stream_id: word(0) & STREAM_ID_MASK,
                    delta: word(4) & 0x7fff_ffff,
                }
            }
            kind => Frame::Unknown { kind, flags, len },
        })
    }
}

fn nonzero(id: u32, kind: &'static str) -> Result<u32, FrameError> {
    if id == 0 {
        Err(FrameError::ZeroStreamId(kind))
    } else {
        Ok(id)
    }
}

/// Encodes frames; holds the outbound header zlib stream.
pub(crate) struct Encoder {
    headers: HeaderEncoder,
    scratch: Vec<u8>,
}

impl Encoder {
    pub(crate) fn new() -> Result<Self, FrameError> {
        Ok(Encoder {
            headers: HeaderEncoder::new()?,
            scratch: Vec::new(),
        })
    }

    /// Appends `frame`'s bytes to `out`. Frames with header blocks must be encoded in the
    /// order they are sent, as they continue this encoder's zlib stream.
    pub(crate) fn encode(&mut self, frame: &Frame, out: &mut Vec<u8>) -> Result<(), FrameError> {
        let p = &mut self.scratch;
        p.clear();
        let (kind, flags) = match frame {
            Frame::SynStream {
                stream_id,
                associated_id,
                priority,
                slot,
                flags,
                headers,
            } => {
                p.extend_from_slice(&id31(*stream_id)?.to_be_bytes());
                p.extend_from_slice(&id31(*associated_id)?.to_be_bytes());
                p.push((priority & 0x7) << 5);
                p.push(*slot);
                self.headers.encode(headers, p)?;
                (TYPE_SYN_STREAM, *flags)
            }
            Frame::SynReply {
                stream_id,
                fin,
                headers,
            } => {
                p.extend_from_slice(&id31(*stream_id)?.to_be_bytes());
                self.headers.encode(headers, p)?;
                (TYPE_SYN_REPLY, fin_flag(*fin))
            }
            Frame::Headers {
                stream_id,
                fin,
                headers,
            } => {
                p.extend_from_slice(&id31(*stream_id)?.to_be_bytes());
                self.headers.encode(headers, p)?;
                (TYPE_HEADERS, fin_flag(*fin))
            }
            other => return encode_plain(other, out),
        };
        control(kind, flags, p, out)
    }
}

/// Appends the bytes of a frame that carries no header block (it needs no zlib state, so
/// any task can build it); a frame with a header block is refused as [`FrameError::NeedsEncoder`].
pub(crate) fn encode_plain(frame: &Frame, out: &mut Vec<u8>) -> Result<(), FrameError> {
    let mut p = Vec::new();
    let (kind, flags) = match frame {
        Frame::Data {
            stream_id,
            fin,
            data,
        } => {
            let head = data_header(*stream_id, *fin, data.len())?;
            out.extend_from_slice(&head);
            out.extend_from_slice(data);
            return Ok(());
        }
        Frame::SynStream { .. } | Frame::SynReply { .. } | Frame::Headers { .. } => {
            return Err(FrameError::NeedsEncoder)
        }
        Frame::RstStream { stream_id, status } => {
            p.extend_from_slice(&id31(*stream_id)?.to_be_bytes());
            p.extend_from_slice(&status.to_be_bytes());
            (TYPE_RST_STREAM, 0)
        }
        Frame::Settings { flags, settings } => {
            let count =
                u32::try_from(settings.len()).map_err(|_| FrameError::TooLarge(settings.len()))?;
            p.extend_from_slice(&count.to_be_bytes());
            for s in settings {
                let id = (u32::from(s.flags) << 24) | (s.id & 0x00ff_ffff);
                p.extend_from_slice(&id.to_be_bytes());
                p.extend_from_slice(&s.value.to_be_bytes());
            }
            (TYPE_SETTINGS, *flags)
        }
        Frame::Ping { id } => {
            p.extend_from_slice(&id.to_be_bytes());
            (TYPE_PING, 0)
        }
        Frame::GoAway {
            last_good_id,
            status,
        } => {
            p.extend_from_slice(&id31(*last_good_id)?.to_be_bytes());
            p.extend_from_slice(&status.to_be_bytes());
            (TYPE_GOAWAY, 0)
        }
        Frame::WindowUpdate { stream_id, delta } => {
            p.extend_from_slice(&id31(*stream_id)?.to_be_bytes());
            p.extend_from_slice(&(delta & 0x7fff_ffff).to_be_bytes());
            (TYPE_WINDOW_UPDATE, 0)
        }
        // For tests: the type with a zero payload of the length.
        Frame::Unknown { kind, flags, len } => {
            p.resize(*len as usize, 0);
            (*kind, *flags)
        }
    };
    control(kind, flags, &p, out)
}

/// A plain frame as its own buffer, ready to queue.
pub(crate) fn plain_bytes(frame: &Frame) -> Result<Bytes, FrameError> {
    let mut out = Vec::with_capacity(HEADER_LEN + 8);
    encode_plain(frame, &mut out)?;
    Ok(Bytes::from(out))
}

fn control(kind: u16, flags: u8, payload: &[u8], out: &mut Vec<u8>) -> Result<(), FrameError> {
    if payload.len() > MAX_PAYLOAD {
        return Err(FrameError::TooLarge(payload.len()));
    }
    let word = 0x8000_0000 | (u32::from(VERSION) << 16) | u32::from(kind);
    out.extend_from_slice(&word.to_be_bytes());
    // Fits: checked against MAX_PAYLOAD (24 bits) above.
    out.extend_from_slice(&((u32::from(flags) << 24) | payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    Ok(())
}

fn fin_flag(fin: bool) -> u8 {
    if fin {
        FLAG_FIN
    } else {
        0
    }
}

fn id31(id: u32) -> Result<u32, FrameError> {
    if id > STREAM_ID_MASK {
        Err(FrameError::StreamId(id))
    } else {
        Ok(id)
    }
}

/// The 8-byte header of a data frame of `len` bytes on `stream_id`.
pub(crate) fn data_header(
    stream_id: u32,
    fin: bool,
    len: usize,
) -> Result<[u8; HEADER_LEN], FrameError> {
    if len > MAX_PAYLOAD {
        return Err(FrameError::TooLarge(len));
    }
    if stream_id == 0 {
        return Err(FrameError::ZeroStreamId("DATA"));
    }
    let mut head = [0u8; HEADER_LEN];
    head[..4].copy_from_slice(&id31(stream_id)?.to_be_bytes());
    head[4..].copy_from_slice(&((u32::from(fin_flag(fin)) << 24) | len as u32).to_be_bytes());
    Ok(head)
}

/// A whole data frame, header and payload in one buffer (the one copy of the payload).
pub(crate) fn data_frame(stream_id: u32, fin: bool, payload: &[u8]) -> Result<Bytes, FrameError> {
    let head = data_header(stream_id, fin, payload.len())?;
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&head);
    out.extend_from_slice(payload);
    Ok(Bytes::from(out))
}
