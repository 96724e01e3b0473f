//! Tests of the codec (round trips, one zlib stream per direction, interop with an
//! independent zlib, malformed and truncated input, a property over arbitrary bytes) and of
//! sessions driven by a small client written with the same codec over `tokio::io::duplex`.
//!
//! Where a test must know that nothing more can happen (a writer blocked by backpressure),
//! it runs on paused time: the runtime advances the clock only once every task is idle, so
//! a timer firing means quiescence, not a guess at how long things take.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, ReadHalf, WriteHalf};

use super::frame::{self, Decoder, Encoder, Frame, FrameError, Setting, MAX_PAYLOAD};
use super::header::{self, HeaderError, DICTIONARY};
use super::session::{self, MAX_DATA_FRAME, OUT_SOFT_LIMIT, RECV_LIMIT};
use super::*;

fn h(pairs: &[(&str, &str)]) -> Headers {
    pairs
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

fn encode_all(frames: &[Frame]) -> Vec<u8> {
    let mut enc = Encoder::new().unwrap();
    let mut out = Vec::new();
    for f in frames {
        enc.encode(f, &mut out).unwrap();
    }
    out
}

fn decode_all(bytes: &[u8]) -> Result<Vec<Frame>, FrameError> {
    let mut dec = Decoder::new();
    let mut buf = BytesMut::from(bytes);
    let mut frames = Vec::new();
    while let Some(f) = dec.decode(&mut buf)? {
        frames.push(f);
    }
    assert!(buf.is_empty(), "{} bytes left undecoded", buf.len());
    Ok(frames)
}

fn every_frame() -> Vec<Frame> {
    vec![
        Frame::SynStream {
            stream_id: 1,
            associated_id: 0,
            priority: 0,
            slot: 0,
            flags: 0,
            headers: h(&[
                ("streamtype", "error"),
                ("port", "8080"),
                ("requestid", "0"),
            ]),
        },
        Frame::SynStream {
            stream_id: 3,
            associated_id: 1,
            priority: 7,
            slot: 9,
            flags: frame::FLAG_FIN | frame::FLAG_UNIDIRECTIONAL,
            headers: h(&[("streamtype", "data"), ("multi", "a\0b")]),
        },
        Frame::SynReply {
            stream_id: 1,
            fin: false,
            headers: Vec::new(),
        },
        Frame::SynReply {
            stream_id: 3,
            fin: true,
            headers: h(&[("status", "200")]),
        },
        Frame::Data {
            stream_id: 1,
            fin: false,
            data: Bytes::from_static(b"hello"),
        },
        Frame::Data {
            stream_id: 0x7fff_ffff,
            fin: true,
            data: Bytes::new(),
        },
        Frame::RstStream {
            stream_id: 5,
            status: 5,
        },
        Frame::Settings {
            flags: frame::FLAG_CLEAR_SETTINGS,
            settings: vec![
                Setting {
                    flags: 1,
                    id: 7,
                    value: 1 << 20,
                },
                Setting {
                    flags: 0,
                    id: 4,
                    value: 100,
                },
            ],
        },
        Frame::Settings {
            flags: 0,
            settings: Vec::new(),
        },
        Frame::Ping { id: 1 },
        Frame::Ping { id: u32::MAX },
        Frame::GoAway {
            last_good_id: 7,
            status: 1,
        },
        Frame::Headers {
            stream_id: 1,
            fin: true,
            headers: h(&[("x-trailer", "yes")]),
        },
        Frame::WindowUpdate {
            stream_id: 0,
            delta: 65536,
        },
        Frame::WindowUpdate {
            stream_id: 9,
            delta: 0x7fff_ffff,
        },
        Frame::Unknown {
            kind: 10,
            flags: 3,
            len: 12,
        },
    ]
}

#[test]
fn dictionary_is_the_spdy3_one() {
    assert_eq!(DICTIONARY.len(), 1423);
    assert_eq!(&DICTIONARY[..11], b"\0\0\0\x07options");
    assert!(DICTIONARY.ends_with(b",*,enq=0."));
    // The Adler-32 a peer's zlib header names (FDICT): set_dictionary returns it.
    let mut c = Compress::new(Compression::default(), true);
    assert_eq!(c.set_dictionary(&DICTIONARY).unwrap(), 0xe3c6_a7c2);
}

#[test]
fn every_frame_type_round_trips() {
    let frames = every_frame();
    let bytes = encode_all(&frames);
    assert_eq!(decode_all(&bytes).unwrap(), frames);
}

#[test]
fn frames_split_anywhere_wait_for_more_bytes() {
    let frames = every_frame();
    let bytes = encode_all(&frames);
    for cut in 0..bytes.len() {
        let mut dec = Decoder::new();
        let mut buf = BytesMut::from(&bytes[..cut]);
        let mut got = Vec::new();
        while let Some(f) = dec.decode(&mut buf).unwrap() {
            got.push(f);
        }
        // The prefix yields whole frames only, then the rest completes the sequence.
        buf.extend_from_slice(&bytes[cut..]);
        while let Some(f) = dec.decode(&mut buf).unwrap() {
            got.push(f);
        }
        assert_eq!(got, frames, "cut at {cut}");
    }
}

#[test]
fn wire_layout_of_plain_frames() {
    let mut out = Vec::new();
    frame::encode_plain(&Frame::Ping { id: 0x0102_0304 }, &mut out).unwrap();
    assert_eq!(out, [0x80, 3, 0, 6, 0, 0, 0, 4, 1, 2, 3, 4]);
    out.clear();
    frame::encode_plain(
        &Frame::GoAway {
            last_good_id: 5,
            status: 0,
        },
        &mut out,
    )
    .unwrap();
    assert_eq!(out, [0x80, 3, 0, 7, 0, 0, 0, 8, 0, 0, 0, 5, 0, 0, 0, 0]);
    let data = frame::data_frame(3, true, b"ab").unwrap();
    assert_eq!(&data[..], [0, 0, 0, 3, 1, 0, 0, 2, b'a', b'b']);
    assert_eq!(
        frame::encode_plain(&Frame::Ping { id: 1 }, &mut Vec::new()),
        Ok(())
    );
    assert_eq!(
        frame::encode_plain(
            &Frame::SynReply {
                stream_id: 1,
                fin: false,
                headers: Vec::new()
            },
            &mut Vec::new()
        ),
        Err(FrameError::NeedsEncoder)
    );
}

#[test]
fn encoding_refuses_what_the_fields_cannot_hold() {
    let big = vec![0u8; MAX_PAYLOAD + 1];
    assert_eq!(
        frame::data_frame(1, false, &big),
        Err(FrameError::TooLarge(MAX_PAYLOAD + 1))
    );
    assert!(frame::data_frame(1, false, &big[..MAX_PAYLOAD]).is_ok());
    assert_eq!(
        frame::data_frame(0x8000_0001, false, b"x"),
        Err(FrameError::StreamId(0x8000_0001))
    );
    assert_eq!(
        frame::data_frame(0, false, b"x"),
        Err(FrameError::ZeroStreamId("DATA"))
    );
}

#[test]
fn header_blocks_continue_one_zlib_stream() {
    let frames: Vec<Frame> = (0..6)
        .map(|i| Frame::SynStream {
            stream_id: 2 * i + 1,
            associated_id: 0,
            priority: 0,
            slot: 0,
            flags: 0,
            headers: h(&[("streamtype", "stdout"), ("n", &i.to_string())]),
        })
        .collect();
    let bytes = encode_all(&frames);
    assert_eq!(decode_all(&bytes).unwrap(), frames);
    // The second block alone, on a fresh decoder, has no zlib header: it is not a stream of
    // its own, so a per-block decompressor would fail.
    let mut dec = Decoder::new();
    let mut buf = BytesMut::from(&bytes[..]);
    let first = dec.decode(&mut buf).unwrap();
    assert!(first.is_some());
    let mut fresh = Decoder::new();
    assert!(matches!(
        fresh.decode(&mut buf),
        Err(FrameError::Header(HeaderError::Inflate(_)))
    ));
    // Later blocks also compress smaller than the first: they reuse its window.
    let mut enc = Encoder::new().unwrap();
    let mut sizes = Vec::new();
    for f in &frames[..2] {
        let mut out = Vec::new();
        enc.encode(f, &mut out).unwrap();
        sizes.push(out.len());
    }
    assert!(sizes[1] < sizes[0], "{sizes:?}");
}

/// A raw SYN_STREAM around an already compressed block.
fn syn_stream_raw(id: u32, block: &[u8]) -> Vec<u8> {
    let len = 10 + block.len() as u32;
    let mut out = vec![0x80, 3, 0, 1];
    out.extend_from_slice(&len.to_be_bytes());
    out[4] = 0;
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    out.extend_from_slice(block);
    out
}

fn independent_compress(c: &mut Compress, raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len() + 128);
    let before = c.total_in();
    c.compress_vec(raw, &mut out, FlushCompress::Sync).unwrap();
    assert_eq!((c.total_in() - before) as usize, raw.len());
    out
}

#[test]
fn decodes_blocks_of_an_independent_zlib_with_the_dictionary() {
    let mut c = Compress::new(Compression::best(), true);
    c.set_dictionary(&DICTIONARY).unwrap();
    let mut wire = Vec::new();
    let sets = [
        h(&[("streamtype", "stdin")]),
        h(&[("streamtype", "resize"), ("x", "y")]),
        h(&[]),
    ];
    for (i, headers) in sets.iter().enumerate() {
        let mut raw = Vec::new();
        header::write_block(headers, &mut raw).unwrap();
        let block = independent_compress(&mut c, &raw);
        wire.extend(syn_stream_raw(2 * i as u32 + 1, &block));
    }
    let frames = decode_all(&wire).unwrap();
    let got: Vec<&Headers> = frames
        .iter()
        .map(|f| match f {
            Frame::SynStream { headers, .. } => headers,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(got, sets.iter().collect::<Vec<_>>());
}

#[test]
fn our_blocks_decode_with_an_independent_zlib() {
    let mut enc = Encoder::new().unwrap();
    let mut d = Decompress::new(true);
    for i in 0..3 {
        let headers = h(&[("status", "200"), ("i", &i.to_string())]);
        let mut out = Vec::new();
        enc.encode(
            &Frame::SynReply {
                stream_id: 1,
                fin: false,
                headers: headers.clone(),
            },
            &mut out,
        )
        .unwrap();
        let mut block = &out[12..];
        let mut raw = Vec::with_capacity(4096);
        loop {
            let before = d.total_in();
            match d.decompress_vec(block, &mut raw, FlushDecompress::Sync) {
                Ok(_) => {}
                Err(e) if e.needs_dictionary().is_some() => {
                    d.set_dictionary(&DICTIONARY).unwrap();
                }
                Err(e) => panic!("{e}"),
            }
            block = &block[(d.total_in() - before) as usize..];
            if block.is_empty() {
                break;
            }
        }
        assert_eq!(header::parse_block(&raw).unwrap(), headers);
    }
}

#[test]
fn another_dictionary_is_refused() {
    let mut c = Compress::new(Compression::default(), true);
    c.set_dictionary(b"not the spdy dictionary").unwrap();
    let mut raw = Vec::new();
    header::write_block(&h(&[("a", "b")]), &mut raw).unwrap();
    let block = independent_compress(&mut c, &raw);
    assert!(matches!(
        decode_all(&syn_stream_raw(1, &block)),
        Err(FrameError::Header(HeaderError::Inflate(_)))
    ));
}

#[test]
fn header_names_are_lower_cased_and_blocks_checked() {
    let mut raw = Vec::new();
    header::write_block(&h(&[("StreamType", "stdin")]), &mut raw).unwrap();
    assert_eq!(
        header::parse_block(&raw).unwrap(),
        h(&[("streamtype", "stdin")])
    );
    raw.push(0);
    assert_eq!(header::parse_block(&raw), Err(HeaderError::Trailing(1)));
    // A count far beyond what the bytes can hold, a length past the end.
    assert_eq!(
        header::parse_block(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]),
        Err(HeaderError::Truncated)
    );
    assert_eq!(
        header::parse_block(&[0, 0, 0, 1, 0, 0, 0, 9, b'a', 0, 0, 0, 0]),
        Err(HeaderError::Truncated)
    );
    assert_eq!(header::parse_block(&[0, 0]), Err(HeaderError::Truncated));
}

#[test]
fn a_compression_bomb_is_refused() {
    let mut c = Compress::new(Compression::best(), true);
    c.set_dictionary(&DICTIONARY).unwrap();
    let mut raw = Vec::new();
    let value = "a".repeat(header::MAX_HEADER_BLOCK * 4);
    header::write_block(&h(&[("x", &value)]), &mut raw).unwrap();
    let block = independent_compress(&mut c, &raw);
    assert!(block.len() < 16 * 1024, "{}", block.len());
    assert_eq!(
        decode_all(&syn_stream_raw(1, &block)),
        Err(FrameError::Header(HeaderError::TooLarge))
    );
}

#[test]
fn a_bomb_never_makes_the_decompressor_allocate_past_its_bound() {
    // 8 MiB of one byte: a few KiB compressed, which the old reservation (twice the input,
    // growing by doubling) let reach half a megabyte and more before the check.
    let mut enc = header::HeaderEncoder::new().unwrap();
    let mut block = Vec::new();
    enc.encode(&h(&[("x", &"\0".repeat(8 << 20))]), &mut block)
        .unwrap();
    let mut dec = Decoder::new();
    let mut buf = BytesMut::from(&syn_stream_raw(1, &block)[..]);
    assert_eq!(
        dec.decode(&mut buf),
        Err(FrameError::Header(HeaderError::TooLarge))
    );
    assert!(
        dec.header_capacity() <= header::MAX_HEADER_BLOCK + 1,
        "{} bytes allocated",
        dec.header_capacity()
    );
}

#[test]
fn a_control_frame_longer_than_any_header_block_is_refused_from_its_header() {
    let mut head = vec![0x80, 3, 0, 1, 0];
    head.extend_from_slice(&[0xff, 0xff, 0xff]);
    let mut buf = BytesMut::from(&head[..]);
    assert_eq!(
        Decoder::new().decode(&mut buf),
        Err(FrameError::Length {
            kind: "control",
            len: 0xff_ffff
        })
    );
    assert!(buf.capacity() < 1024, "{}", buf.capacity());
}

#[test]
fn a_data_frame_is_buffered_as_it_arrives_not_as_it_claims() {
    let mut buf = BytesMut::from(&frame::data_header(1, false, MAX_PAYLOAD).unwrap()[..]);
    let mut dec = Decoder::new();
    assert_eq!(dec.decode(&mut buf), Ok(None));
    assert!(
        buf.capacity() <= frame::RESERVE_STEP + frame::HEADER_LEN,
        "{} bytes reserved for a frame of which 8 arrived",
        buf.capacity()
    );
    // Its bytes, as they come, still make the frame.
    let payload = pattern(MAX_PAYLOAD, 3);
    for chunk in payload.chunks(1 << 20) {
        buf.extend_from_slice(chunk);
        if buf.len() < frame::HEADER_LEN + MAX_PAYLOAD {
            assert_eq!(dec.decode(&mut buf), Ok(None));
        }
    }
    let Some(Frame::Data { data, .. }) = dec.decode(&mut buf).unwrap() else {
        panic!("no data frame");
    };
    assert!(data == payload);
}

fn control_raw(kind: u16, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![0x80, 3];
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&((u32::from(flags) << 24) | payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

#[test]
fn malformed_frames_are_errors() {
    let cases: Vec<(Vec<u8>, FrameError)> = vec![
        (
            {
                let mut f = control_raw(6, 0, &[0, 0, 0, 1]);
                f[1] = 2;
                f
            },
            FrameError::Version(2),
        ),
        (
            control_raw(6, 0, &[0, 0, 0, 1, 0]),
            FrameError::Length {
                kind: "PING",
                len: 5,
            },
        ),
        (
            control_raw(3, 0, &[0, 0, 0, 1]),
            FrameError::Length {
                kind: "RST_STREAM",
                len: 4,
            },
        ),
        (
            control_raw(3, 0, &[0, 0, 0, 0, 0, 0, 0, 1]),
            FrameError::ZeroStreamId("RST_STREAM"),
        ),
        (
            control_raw(7, 0, &[0, 0, 0, 1]),
            FrameError::Length {
                kind: "GOAWAY",
                len: 4,
            },
        ),
        (
            control_raw(9, 0, &[0, 0, 0, 1, 0, 0, 1]),
            FrameError::Length {
                kind: "WINDOW_UPDATE",
                len: 7,
            },
        ),
        (
            control_raw(4, 0, &[0, 0, 0, 2, 0, 0, 0, 7, 0, 0, 0, 1]),
            FrameError::Length {
                kind: "SETTINGS",
                len: 12,
            },
        ),
        (
            control_raw(4, 0, &[0, 0]),
            FrameError::Length {
                kind: "SETTINGS",
                len: 2,
            },
        ),
        (
            control_raw(1, 0, &[0, 0, 0, 1, 0, 0, 0, 0, 0]),
            FrameError::Length {
                kind: "SYN_STREAM",
                len: 9,
            },
        ),
        (
            control_raw(2, 0, &[0, 0, 0]),
            FrameError::Length {
                kind: "SYN_REPLY",
                len: 3,
            },
        ),
        (
            control_raw(8, 0, &[0, 0, 0, 0, 0x78]),
            FrameError::ZeroStreamId("HEADERS"),
        ),
        (
            vec![0, 0, 0, 0, 0, 0, 0, 1, b'x'],
            FrameError::ZeroStreamId("DATA"),
        ),
    ];
    for (bytes, want) in cases {
        assert_eq!(decode_all(&bytes), Err(want), "{bytes:?}");
    }
    // A header block that is not zlib, and one cut inside its deflate data.
    assert!(matches!(
        decode_all(&syn_stream_raw(1, b"garbage!")),
        Err(FrameError::Header(_))
    ));
    let whole = encode_all(&every_frame()[..1]);
    let block = &whole[18..];
    assert!(matches!(
        decode_all(&syn_stream_raw(1, &block[..block.len() / 2])),
        Err(FrameError::Header(_))
    ));
    assert!(matches!(
        decode_all(&syn_stream_raw(1, &[])),
        Err(FrameError::Header(_))
    ));
}

#[test]
fn unknown_control_frames_are_skipped() {
    let mut bytes = control_raw(10, 0, b"credential-ish");
    bytes.extend(control_raw(0xffff, 0xff, &[]));
    bytes.extend(encode_all(&[Frame::Ping { id: 3 }]));
    let frames = decode_all(&bytes).unwrap();
    assert_eq!(
        frames,
        vec![
            Frame::Unknown {
                kind: 10,
                flags: 0,
                len: 14
            },
            Frame::Unknown {
                kind: 0xffff,
                flags: 0xff,
                len: 0
            },
            Frame::Ping { id: 3 },
        ]
    );
}

fn config() -> Config {
    Config {
        cases: 512,
        failure_persistence: None,
        ..Config::default()
    }
}

/// Arbitrary bytes, alone or after valid frames, split anywhere: the decoder returns frames,
/// asks for more, or fails; it never panics, and never takes more bytes than it was given.
#[test]
fn arbitrary_bytes_never_panic_the_decoder() {
    let valid = encode_all(&every_frame());
    let strategy = (
        any::<bool>(),
        vec(any::<u8>(), 0..2048),
        vec(0usize..4096, 0..4),
        // Biased towards frame-header-like bytes; some claim large lengths.
        vec(
            (
                any::<bool>(),
                0u16..12,
                any::<u8>(),
                prop_oneof![0u32..64, 0u32..(1 << 24)],
            ),
            0..4,
        ),
    );
    TestRunner::new(config())
        .run(&strategy, |(prefix, noise, cuts, heads)| {
            let mut input = Vec::new();
            if prefix {
                input.extend_from_slice(&valid);
            }
            for (control, kind, flags, len) in heads {
                if control {
                    // A header claiming the length, with at most 64 bytes of it.
                    let mut frame = control_raw(kind, flags, &vec![0xa5; len.min(64) as usize]);
                    frame[5..8].copy_from_slice(&len.to_be_bytes()[1..]);
                    input.extend(frame);
                } else {
                    input.extend_from_slice(&1u32.to_be_bytes());
                    input.extend_from_slice(&((u32::from(flags) << 24) | len).to_be_bytes());
                }
            }
            input.extend_from_slice(&noise);
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(input.len())).collect();
            cuts.sort();
            cuts.push(input.len());
            let mut dec = Decoder::new();
            let mut buf = BytesMut::new();
            let mut fed = 0;
            let mut taken = 0;
            'feed: for cut in cuts {
                buf.extend_from_slice(&input[fed..cut]);
                fed = cut;
                loop {
                    let before = buf.len();
                    let decoded = dec.decode(&mut buf);
                    // Bounded allocation: room beyond what arrived is a step at most, and the
                    // header decompressor stays within its bound.
                    prop_assert!(
                        buf.capacity() <= 2 * (fed + frame::RESERVE_STEP) + 64,
                        "{} bytes reserved after {} fed",
                        buf.capacity(),
                        fed
                    );
                    prop_assert!(dec.header_capacity() <= header::MAX_HEADER_BLOCK + 1);
                    match decoded {
                        Ok(Some(_)) => {
                            prop_assert!(buf.len() < before);
                            taken += before - buf.len();
                        }
                        Ok(None) => break,
                        Err(_) => break 'feed,
                    }
                }
            }
            prop_assert!(taken <= input.len());
            Ok(())
        })
        .unwrap();
}

/// Header blocks: valid zlib streams (with the dictionary) of arbitrary raw blocks, some
/// corrupted, some highly compressible and large; decoding never panics, allocates within
/// its bound, and what decodes is what was encoded.
#[test]
fn arbitrary_header_blocks_never_panic_and_stay_bounded() {
    let strategy = (
        vec(any::<u8>(), 0..512),
        // A run of one byte (up to 512 KiB): compresses to little, decompresses to a lot.
        (any::<u8>(), 0usize..(1 << 19)),
        // Corrupt the compressed bytes at these offsets.
        vec((any::<usize>(), any::<u8>()), 0..3),
        any::<bool>(),
    );
    TestRunner::new(Config {
        cases: 128,
        ..config()
    })
    .run(&strategy, |(noise, (byte, run), corrupt, raw_only)| {
        let mut dec = header::HeaderDecoder::new();
        if raw_only {
            // Not zlib at all.
            let _ = dec.decode(&noise);
        } else {
            let mut c = Compress::new(Compression::fast(), true);
            c.set_dictionary(&DICTIONARY).unwrap();
            let mut raw = noise.clone();
            raw.extend(std::iter::repeat_n(byte, run));
            let mut block = independent_compress(&mut c, &raw);
            let intact = corrupt.is_empty();
            for (at, b) in corrupt {
                if !block.is_empty() {
                    let at = at % block.len();
                    block[at] ^= b | 1;
                }
            }
            let decoded = dec.decode(&block);
            if intact && raw.len() <= header::MAX_HEADER_BLOCK {
                prop_assert_eq!(decoded, header::parse_block(&raw));
            } else if intact {
                prop_assert_eq!(decoded, Err(HeaderError::TooLarge));
            }
        }
        prop_assert!(dec.capacity() <= header::MAX_HEADER_BLOCK + 1);
        Ok(())
    })
    .unwrap();
}

/// Random frames round trip through one encoder and one decoder.
#[test]
fn random_frames_round_trip() {
    let headers = vec(("[a-z-]{1,12}", "[ -~]{0,40}"), 0..5);
    let frame = prop_oneof![
        (1u32..0x7fff_ffff, any::<bool>(), vec(any::<u8>(), 0..300)).prop_map(|(id, fin, d)| {
            Frame::Data {
                stream_id: id,
                fin,
                data: d.into(),
            }
        }),
        (
            1u32..0x7fff_ffff,
            0u8..8,
            any::<u8>(),
            0u8..4,
            headers.clone()
        )
            .prop_map(|(id, priority, slot, flags, headers)| Frame::SynStream {
                stream_id: id,
                associated_id: 0,
                priority,
                slot,
                flags,
                headers,
            }),
        (1u32..0x7fff_ffff, any::<bool>(), headers).prop_map(|(id, fin, headers)| {
            Frame::SynReply {
                stream_id: id,
                fin,
                headers,
            }
        }),
        (1u32..0x7fff_ffff, any::<u32>()).prop_map(|(id, status)| Frame::RstStream {
            stream_id: id,
            status
        }),
        any::<u32>().prop_map(|id| Frame::Ping { id }),
        (0u32..0x7fff_ffff, 0u32..0x7fff_ffff).prop_map(|(id, delta)| Frame::WindowUpdate {
            stream_id: id,
            delta
        }),
    ];
    TestRunner::new(Config {
        cases: 128,
        ..config()
    })
    .run(&vec(frame, 1..12), |frames| {
        let bytes = encode_all(&frames);
        prop_assert_eq!(decode_all(&bytes).unwrap(), frames);
        Ok(())
    })
    .unwrap();
}

// ---- sessions ----

const T: Duration = Duration::from_secs(20);

struct ClientTx {
    wr: WriteHalf<DuplexStream>,
    enc: Encoder,
}

impl ClientTx {
    async fn send(&mut self, f: Frame) {
        let mut out = Vec::new();
        self.enc.encode(&f, &mut out).unwrap();
        self.wr.write_all(&out).await.unwrap();
    }

    async fn open(&mut self, id: u32, headers: &[(&str, &str)], flags: u8) {
        self.send(Frame::SynStream {
            stream_id: id,
            associated_id: 0,
            priority: 0,
            slot: 0,
            flags,
            headers: h(headers),
        })
        .await;
    }

    async fn data(&mut self, id: u32, fin: bool, data: &[u8]) {
        self.send(Frame::Data {
            stream_id: id,
            fin,
            data: Bytes::copy_from_slice(data),
        })
        .await;
    }
}

struct ClientRx {
    rd: ReadHalf<DuplexStream>,
    dec: Decoder,
    buf: BytesMut,
}

impl ClientRx {
    /// The next frame, `None` at EOF.
    async fn next(&mut self) -> Option<Frame> {
        tokio::time::timeout(T, async {
            loop {
                if let Some(f) = self.dec.decode(&mut self.buf).unwrap() {
                    return Some(f);
                }
                if self.rd.read_buf(&mut self.buf).await.unwrap() == 0 {
                    assert!(self.buf.is_empty(), "EOF inside a frame");
                    return None;
                }
            }
        })
        .await
        .expect("a frame from the server in time")
    }

    async fn expect(&mut self) -> Frame {
        self.next().await.expect("a frame, not EOF")
    }
}

fn log() -> slog::Logger {
    slog::Logger::root(slog::Discard, slog::o!())
}

fn setup(capacity: usize) -> (Session, Incoming, ClientTx, ClientRx) {
    let (server, client) = tokio::io::duplex(capacity);
    let (session, incoming) = serve(server, log());
    let (rd, wr) = tokio::io::split(client);
    (
        session,
        incoming,
        ClientTx {
            wr,
            enc: Encoder::new().unwrap(),
        },
        ClientRx {
            rd,
            dec: Decoder::new(),
            buf: BytesMut::new(),
        },
    )
}

async fn next_stream(incoming: &mut Incoming) -> Stream {
    tokio::time::timeout(T, incoming.next())
        .await
        .expect("a stream in time")
        .expect("a stream, not the end")
}

fn reply(id: u32) -> Frame {
    Frame::SynReply {
        stream_id: id,
        fin: false,
        headers: Vec::new(),
    }
}

fn data(id: u32, fin: bool, d: &[u8]) -> Frame {
    Frame::Data {
        stream_id: id,
        fin,
        data: Bytes::copy_from_slice(d),
    }
}

#[tokio::test]
async fn a_stream_is_replied_read_to_fin_and_written_back() {
    let (_session, mut incoming, mut tx, mut rx) = setup(64 * 1024);
    tx.open(1, &[("streamtype", "stdin"), ("Port", "80")], 0)
        .await;
    assert_eq!(rx.expect().await, reply(1));
    let stream = next_stream(&mut incoming).await;
    assert_eq!(stream.id(), 1);
    assert_eq!(stream.header("streamtype"), Some("stdin"));
    assert_eq!(stream.header("port"), Some("80"));
    assert_eq!(stream.header("requestid"), None);
    let (mut r, mut w) = stream.split();
    tx.data(1, false, b"hel").await;
    tx.data(1, true, b"lo").await;
    let mut got = Vec::new();
    tokio::time::timeout(T, r.read_to_end(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, b"hello");
    w.write_all(b"world").await.unwrap();
    w.shutdown().await.unwrap();
    assert_eq!(rx.expect().await, data(1, false, b"world"));
    assert_eq!(rx.expect().await, data(1, true, b""));
    // After shutdown, writes fail.
    assert!(w.write_all(b"x").await.is_err());
}

#[tokio::test]
async fn a_half_closed_syn_stream_is_still_replied() {
    let (_session, mut incoming, mut tx, mut rx) = setup(64 * 1024);
    tx.open(1, &[("streamtype", "error")], frame::FLAG_FIN)
        .await;
    assert_eq!(rx.expect().await, reply(1));
    let (mut r, mut w) = next_stream(&mut incoming).await.split();
    let mut got = Vec::new();
    tokio::time::timeout(T, r.read_to_end(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert!(got.is_empty());
    w.write_all(b"oops").await.unwrap();
    drop(w);
    assert_eq!(rx.expect().await, data(1, false, b"oops"));
    // Dropped without shutdown: FIN anyway.
    assert_eq!(rx.expect().await, data(1, true, b""));
}

#[tokio::test]
async fn streams_come_in_order_and_bad_ids_are_reset() {
    let (_session, mut incoming, mut tx, mut rx) = setup(64 * 1024);
    tx.open(3, &[("n", "3")], 0).await;
    tx.open(2, &[("n", "2")], 0).await;
    tx.open(1, &[("n", "1")], 0).await;
    tx.open(5, &[("n", "5")], 0).await;
    assert_eq!(rx.expect().await, reply(3));
    for id in [2, 1] {
        assert_eq!(
            rx.expect().await,
            Frame::RstStream {
                stream_id: id,
                status: frame::RST_PROTOCOL_ERROR
            }
        );
    }
    assert_eq!(rx.expect().await, reply(5));
    assert_eq!(next_stream(&mut incoming).await.header("n"), Some("3"));
    assert_eq!(next_stream(&mut incoming).await.header("n"), Some("5"));
}

#[tokio::test]
async fn pings_are_echoed_and_unknown_frames_skipped() {
    let (_session, _incoming, mut tx, mut rx) = setup(64 * 1024);
    tx.send(Frame::Unknown {
        kind: 10,
        flags: 0,
        len: 20,
    })
    .await;
    // An even id would answer a ping of ours: not echoed.
    tx.send(Frame::Ping { id: 2 }).await;
    tx.send(Frame::Ping { id: 7 }).await;
    tx.send(Frame::Settings {
        flags: 0,
        settings: vec![Setting {
            flags: 0,
            id: 4,
            value: 10,
        }],
    })
    .await;
    tx.send(Frame::Ping { id: 9 }).await;
    assert_eq!(rx.expect().await, Frame::Ping { id: 7 });
    assert_eq!(rx.expect().await, Frame::Ping { id: 9 });
}

#[tokio::test]
async fn close_sends_goaway_then_ends_the_connection() {
    let (session, mut incoming, mut tx, mut rx) = setup(64 * 1024);
    tx.open(1, &[], 0).await;
    tx.open(3, &[], 0).await;
    assert_eq!(rx.expect().await, reply(1));
    assert_eq!(rx.expect().await, reply(3));
    let (_r1, mut w1) = next_stream(&mut incoming).await.split();
    w1.write_all(b"queued before close").await.unwrap();
    tokio::time::timeout(T, session.close()).await.unwrap();
    tokio::time::timeout(T, session.closed()).await.unwrap();
    assert_eq!(rx.expect().await, data(1, false, b"queued before close"));
    assert_eq!(
        rx.expect().await,
        Frame::GoAway {
            last_good_id: 3,
            status: frame::GOAWAY_OK
        }
    );
    assert_eq!(rx.next().await, None);
    assert!(w1.write_all(b"late").await.is_err());
    // Stream 3 was accepted before close: still handed out, then the end.
    assert!(incoming.next().await.is_some());
    assert!(incoming.next().await.is_none());
}

#[tokio::test]
async fn client_goaway_ends_the_session() {
    let (session, mut incoming, mut tx, mut rx) = setup(64 * 1024);
    tx.open(1, &[], 0).await;
    assert_eq!(rx.expect().await, reply(1));
    let (mut r, mut w) = next_stream(&mut incoming).await.split();
    tx.data(1, false, b"last words").await;
    tx.send(Frame::GoAway {
        last_good_id: 0,
        status: 0,
    })
    .await;
    tokio::time::timeout(T, session.closed()).await.unwrap();
    assert!(tokio::time::timeout(T, incoming.next())
        .await
        .unwrap()
        .is_none());
    // What the client sent before going away is still read, then EOF.
    let mut got = Vec::new();
    r.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, b"last words");
    assert!(w.write_all(b"x").await.is_err());
    assert_eq!(rx.next().await, None);
}

#[tokio::test]
async fn client_disconnect_resolves_closed_and_ends_readers() {
    let (session, mut incoming, mut tx, mut rx) = setup(64 * 1024);
    tx.open(1, &[], 0).await;
    assert_eq!(rx.expect().await, reply(1));
    let (mut r, mut w) = next_stream(&mut incoming).await.split();
    tx.data(1, false, b"partial").await;
    let mut first = [0u8; 7];
    tokio::time::timeout(T, r.read_exact(&mut first))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&first, b"partial");
    let reading = tokio::spawn(async move {
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).await.map(|_| rest)
    });
    drop((tx, rx));
    tokio::time::timeout(T, session.closed()).await.unwrap();
    let rest = tokio::time::timeout(T, reading)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(rest.is_empty());
    assert!(w.write_all(b"x").await.is_err());
    assert!(incoming.next().await.is_none());
}

#[tokio::test]
async fn rst_stream_ends_the_reader_with_an_error_and_fails_writes() {
    let (session, mut incoming, mut tx, mut rx) = setup(64 * 1024);
    tx.open(1, &[], 0).await;
    tx.open(3, &[], 0).await;
    assert_eq!(rx.expect().await, reply(1));
    assert_eq!(rx.expect().await, reply(3));
    let (mut r1, mut w1) = next_stream(&mut incoming).await.split();
    let (mut r3, _w3) = next_stream(&mut incoming).await.split();
    tx.data(1, false, b"abc").await;
    tx.send(Frame::RstStream {
        stream_id: 1,
        status: 5,
    })
    .await;
    // Stream 3 delivers after the reset: the reset has been processed.
    tx.data(3, true, b"z").await;
    let mut z = Vec::new();
    tokio::time::timeout(T, r3.read_to_end(&mut z))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(z, b"z");
    let mut got = [0u8; 3];
    r1.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"abc");
    let err = r1.read(&mut [0u8; 8]).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset);
    assert_eq!(
        w1.write_all(b"x").await.unwrap_err().kind(),
        std::io::ErrorKind::ConnectionReset
    );
    // The session goes on.
    tx.send(Frame::Ping { id: 1 }).await;
    assert_eq!(rx.expect().await, Frame::Ping { id: 1 });
    drop(session);
}

#[tokio::test]
async fn a_protocol_error_sends_goaway_and_closes() {
    let (session, _incoming, mut tx, mut rx) = setup(64 * 1024);
    tx.open(1, &[], 0).await;
    assert_eq!(rx.expect().await, reply(1));
    tx.wr
        .write_all(&control_raw(6, 0, &[0, 0, 0, 1, 0]))
        .await
        .unwrap();
    assert_eq!(
        rx.expect().await,
        Frame::GoAway {
            last_good_id: 1,
            status: frame::GOAWAY_PROTOCOL_ERROR
        }
    );
    assert_eq!(rx.next().await, None);
    tokio::time::timeout(T, session.closed()).await.unwrap();
}

#[tokio::test]
async fn eof_inside_a_frame_ends_the_session() {
    let (session, _incoming, mut tx, _rx) = setup(64 * 1024);
    let ping = encode_all(&[Frame::Ping { id: 1 }]);
    tx.wr.write_all(&ping[..5]).await.unwrap();
    tx.wr.shutdown().await.unwrap();
    tokio::time::timeout(T, session.closed()).await.unwrap();
}

#[tokio::test]
async fn dropped_incoming_still_replies_and_finishes_new_streams() {
    let (_session, incoming, mut tx, mut rx) = setup(64 * 1024);
    drop(incoming);
    tx.open(1, &[], 0).await;
    assert_eq!(rx.expect().await, reply(1));
    assert_eq!(rx.expect().await, data(1, true, b""));
    // Data for it is discarded, the session goes on.
    tx.data(1, false, b"ignored").await;
    tx.send(Frame::Ping { id: 3 }).await;
    assert_eq!(rx.expect().await, Frame::Ping { id: 3 });
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 13) as u8)
        .collect()
}

/// Several MiB each way on one stream at once, with a client that never sends
/// WINDOW_UPDATE (like spdystream): nothing stalls, data frames stay small, and the server
/// sends no WINDOW_UPDATE to a client that did not show it uses flow control.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_transfers_both_ways_without_window_updates() {
    const N: usize = 6 << 20;
    let (_session, mut incoming, mut tx, mut rx) = setup(64 * 1024);
    tx.open(1, &[("streamtype", "data")], 0).await;
    assert_eq!(rx.expect().await, reply(1));
    let (mut r, mut w) = next_stream(&mut incoming).await.split();
    let up = pattern(N, 1);
    let down = pattern(N, 2);
    let up_sent = up.clone();
    let client_send = tokio::spawn(async move {
        for chunk in up_sent.chunks(32 * 1024) {
            tx.data(1, false, chunk).await;
        }
        tx.data(1, true, b"").await;
        tx
    });
    let client_recv = tokio::spawn(async move {
        let mut got = Vec::with_capacity(N);
        let mut largest = 0;
        loop {
            match rx.expect().await {
                Frame::Data {
                    stream_id: 1,
                    fin,
                    data,
                } => {
                    largest = largest.max(data.len());
                    got.extend_from_slice(&data);
                    if fin {
                        return (got, largest);
                    }
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    });
    let down_sent = down.clone();
    let server_write = tokio::spawn(async move {
        w.write_all(&down_sent).await.unwrap();
        w.shutdown().await.unwrap();
    });
    let mut got = Vec::with_capacity(N);
    tokio::time::timeout(T, r.read_to_end(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert!(got == up, "upload differs");
    tokio::time::timeout(T, server_write)
        .await
        .unwrap()
        .unwrap();
    let (received, largest) = tokio::time::timeout(T, client_recv).await.unwrap().unwrap();
    assert!(received == down, "download differs");
    assert!(largest <= MAX_DATA_FRAME, "{largest}");
    client_send.await.unwrap();
}

/// A reader that is not read: the session buffers at most its limit, and the client's
/// writes block (the socket is no longer read); reading releases everything in order.
#[tokio::test(start_paused = true)]
async fn an_unread_stream_bounds_what_is_buffered() {
    const N: usize = 4 << 20;
    let (session, mut incoming, mut tx, mut rx) = setup(16 * 1024);
    tx.open(1, &[], 0).await;
    assert_eq!(rx.expect().await, reply(1));
    let (mut r, _w) = next_stream(&mut incoming).await.split();
    let up = pattern(N, 3);
    let sent = up.clone();
    let mut client_send = tokio::spawn(async move {
        for chunk in sent.chunks(32 * 1024) {
            tx.data(1, false, chunk).await;
        }
        tx.data(1, true, b"").await;
        tx
    });
    // Quiescence: paused time only advances once every task waits.
    assert!(
        tokio::time::timeout(Duration::from_secs(60), &mut client_send)
            .await
            .is_err()
    );
    let buffered = session.shared.lock().stream_buffered(1);
    assert!(buffered >= RECV_LIMIT, "{buffered}");
    assert!(
        buffered <= RECV_LIMIT + 32 * 1024 + session::FRAME_COST,
        "{buffered}"
    );
    let mut got = Vec::with_capacity(N);
    tokio::time::timeout(T, r.read_to_end(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert!(got == up, "data differs");
    client_send.await.unwrap();
}

/// A client that does not read: writers wait once the queue is full instead of queueing the
/// whole transfer.
#[tokio::test(start_paused = true)]
async fn a_slow_client_makes_writers_wait() {
    const N: usize = 4 << 20;
    let (session, mut incoming, mut tx, mut rx) = setup(16 * 1024);
    tx.open(1, &[], 0).await;
    assert_eq!(rx.expect().await, reply(1));
    let (_r, mut w) = next_stream(&mut incoming).await.split();
    let down = pattern(N, 4);
    let sent = down.clone();
    let mut server_write = tokio::spawn(async move {
        w.write_all(&sent).await.unwrap();
        w.shutdown().await.unwrap();
    });
    assert!(
        tokio::time::timeout(Duration::from_secs(60), &mut server_write)
            .await
            .is_err()
    );
    let queued = session.shared.lock().queued_bytes();
    assert!(queued >= OUT_SOFT_LIMIT, "{queued}");
    assert!(queued <= OUT_SOFT_LIMIT + MAX_DATA_FRAME + 64, "{queued}");
    let mut got = Vec::with_capacity(N);
    loop {
        match rx.expect().await {
            Frame::Data { data, fin, .. } => {
                got.extend_from_slice(&data);
                if fin {
                    break;
                }
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(got == down, "data differs");
    server_write.await.unwrap();
    drop(tx);
}

/// A client that announces flow control (SETTINGS_INITIAL_WINDOW_SIZE) is not overrun: the
/// server sends its window, waits for WINDOW_UPDATE, and credits what it read.
#[tokio::test(start_paused = true)]
async fn a_client_using_flow_control_gets_it() {
    let (_session, mut incoming, mut tx, mut rx) = setup(256 * 1024);
    tx.send(Frame::Settings {
        flags: 0,
        settings: vec![Setting {
            flags: 0,
            id: frame::SETTINGS_INITIAL_WINDOW_SIZE,
            value: 1000,
        }],
    })
    .await;
    tx.open(1, &[], 0).await;
    assert_eq!(rx.expect().await, reply(1));
    let (mut r, mut w) = next_stream(&mut incoming).await.split();
    let mut server_write = tokio::spawn(async move {
        w.write_all(&[7u8; 5000]).await.unwrap();
        w.shutdown().await.unwrap();
    });
    assert_eq!(rx.expect().await, data(1, false, &[7u8; 1000]));
    assert!(
        tokio::time::timeout(Duration::from_secs(60), &mut server_write)
            .await
            .is_err()
    );
    tx.send(Frame::WindowUpdate {
        stream_id: 1,
        delta: 4000,
    })
    .await;
    assert_eq!(rx.expect().await, data(1, false, &[7u8; 4000]));
    assert_eq!(rx.expect().await, data(1, true, b""));
    server_write.await.unwrap();

    // Inbound: what the reader consumed is credited, per stream and for the session.
    tx.data(1, false, &[1u8; 40 * 1024]).await;
    let mut got = vec![0u8; 40 * 1024];
    r.read_exact(&mut got).await.unwrap();
    let mut updates = vec![rx.expect().await, rx.expect().await];
    updates.sort_by_key(|f| match f {
        Frame::WindowUpdate { stream_id, .. } => *stream_id,
        _ => u32::MAX,
    });
    assert_eq!(
        updates,
        vec![
            Frame::WindowUpdate {
                stream_id: 0,
                delta: 40 * 1024
            },
            Frame::WindowUpdate {
                stream_id: 1,
                delta: 40 * 1024
            },
        ]
    );
}

/// The session window (SPDY/3.1, stream 0) is enforced too once flow control is on.
#[tokio::test(start_paused = true)]
async fn the_session_window_is_enforced_with_flow_control() {
    let (_session, mut incoming, mut tx, mut rx) = setup(256 * 1024);
    tx.send(Frame::WindowUpdate {
        stream_id: 0,
        delta: 0,
    })
    .await;
    tx.open(1, &[], 0).await;
    assert_eq!(rx.expect().await, reply(1));
    let (_r, mut w) = next_stream(&mut incoming).await.split();
    // Stream window: 64 KiB + a large update; the session window stays 64 KiB.
    tx.send(Frame::WindowUpdate {
        stream_id: 1,
        delta: 1 << 20,
    })
    .await;
    let mut server_write = tokio::spawn(async move {
        w.write_all(&vec![9u8; 100 * 1024]).await.unwrap();
        w
    });
    let mut got = 0;
    while got < 64 * 1024 {
        match rx.expect().await {
            Frame::Data { data, .. } => got += data.len(),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(got, 64 * 1024);
    assert!(
        tokio::time::timeout(Duration::from_secs(60), &mut server_write)
            .await
            .is_err()
    );
    tx.send(Frame::WindowUpdate {
        stream_id: 0,
        delta: 36 * 1024,
    })
    .await;
    while got < 100 * 1024 {
        match rx.expect().await {
            Frame::Data { data, .. } => got += data.len(),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(got, 100 * 1024);
    server_write.await.unwrap();
}

/// A client hanging up is noticed even while the read loop waits for room on a stream that
/// nobody reads and the read-ahead is full (the probing PING's write fails): `closed`
/// resolves and the reader ends after what it buffered.
#[tokio::test(start_paused = true)]
async fn a_hang_up_is_noticed_while_a_stream_is_full() {
    let (session, mut incoming, mut tx, mut rx) = setup(16 * 1024);
    tx.open(1, &[], 0).await;
    assert_eq!(rx.expect().await, reply(1));
    let (mut r, _w) = next_stream(&mut incoming).await.split();
    let mut client_send = tokio::spawn(async move {
        for _ in 0..64 {
            tx.data(1, false, &[5u8; 32 * 1024]).await;
        }
        tx
    });
    assert!(
        tokio::time::timeout(Duration::from_secs(60), &mut client_send)
            .await
            .is_err()
    );
    assert!(session.shared.lock().stream_buffered(1) >= RECV_LIMIT);
    // The wait pings the client (even ids), which a live client answers.
    match rx.expect().await {
        Frame::Ping { id } => assert_eq!(id % 2, 0),
        other => panic!("unexpected {other:?}"),
    }
    client_send.abort();
    assert!(client_send.await.is_err_and(|e| e.is_cancelled()));
    drop(rx);
    tokio::time::timeout(T, session.closed()).await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(T, r.read_to_end(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert!(got.len() >= RECV_LIMIT - 32 * 1024 && got.iter().all(|b| *b == 5));
}
