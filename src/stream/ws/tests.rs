//! The channel protocols and the tunnel against tungstenite's client side, over an in-memory
//! duplex pipe.

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use super::*;

type Client = WebSocketStream<DuplexStream>;

/// Fails a test that hangs (instead of letting it hang).
async fn within<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .expect("the test timed out")
}

fn log() -> Logger {
    Logger::root(slog::Discard, slog::o!())
}

async fn open(
    framing: Framing,
    close_signal: bool,
    kinds: &[ChannelKind],
) -> (ChannelConn, Vec<Channel>, Client) {
    let (server, client) = tokio::io::duplex(64 * 1024);
    let options = ChannelOptions {
        framing,
        close_signal,
        channels: kinds.to_vec(),
    };
    let (conn, chans) = channels(server, options, log());
    let client = WebSocketStream::from_raw_socket(client, Role::Client, None).await;
    (conn, chans, client)
}

fn take_reader(chans: &mut [Channel], n: usize) -> ClientRead {
    chans[n].reader.take().unwrap()
}

fn take_writer(chans: &mut [Channel], n: usize) -> ClientWrite {
    chans[n].writer.take().unwrap()
}

/// The next message from the server that is not a ping or pong.
async fn next(client: &mut Client) -> Message {
    loop {
        match client.next().await.unwrap().unwrap() {
            Message::Ping(_) | Message::Pong(_) => continue,
            m => return m,
        }
    }
}

fn bin(bytes: &[u8]) -> Message {
    Message::binary(bytes.to_vec())
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 % 251) as u8).collect()
}

#[tokio::test]
async fn binary_frames_carry_a_channel_byte_both_ways() {
    within(async {
        use ChannelKind::*;
        let (_conn, mut chans, mut client) =
            open(Framing::Binary, false, &[Read, Write, Write]).await;
        assert!(
            chans[0].writer.is_none() && chans[1].reader.is_none() && chans[2].reader.is_none()
        );
        let mut stdin = take_reader(&mut chans, 0);
        let mut stdout = take_writer(&mut chans, 1);
        let mut stderr = take_writer(&mut chans, 2);

        client.send(bin(b"\x00abc")).await.unwrap();
        let mut buf = [0u8; 3];
        stdin.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"abc");

        stdout.write_all(b"out").await.unwrap();
        stderr.write_all(b"err").await.unwrap();
        assert_eq!(next(&mut client).await, bin(b"\x01out"));
        assert_eq!(next(&mut client).await, bin(b"\x02err"));
    })
    .await;
}

#[tokio::test]
async fn base64_frames_are_a_digit_then_base64() {
    within(async {
        use ChannelKind::*;
        let (_conn, mut chans, mut client) = open(Framing::Base64, false, &[Read, Write]).await;
        let mut stdin = take_reader(&mut chans, 0);
        let mut stdout = take_writer(&mut chans, 1);

        client.send(Message::text("0YWJj")).await.unwrap();
        // kubelet takes the same in a binary message too.
        client.send(bin(b"0ZGVm")).await.unwrap();
        // Bad base64 is dropped; line breaks are skipped as Go's decoder does.
        client.send(Message::text("0!!!")).await.unwrap();
        client.send(Message::text("0eHl6\r\n")).await.unwrap();
        let mut buf = [0u8; 9];
        stdin.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"abcdefxyz");

        stdout.write_all(b"out").await.unwrap();
        assert_eq!(next(&mut client).await, Message::text("1b3V0"));
    })
    .await;
}

#[tokio::test]
async fn an_empty_write_sends_just_the_channel_prefix() {
    within(async {
        use ChannelKind::*;
        for (framing, ready) in [
            (Framing::Binary, bin(&[1])),
            (Framing::Base64, Message::text("1")),
        ] {
            let (_conn, mut chans, mut client) = open(framing, false, &[Ignore, Write]).await;
            let mut stdout = take_writer(&mut chans, 1);
            assert_eq!(stdout.write(&[]).await.unwrap(), 0);
            assert_eq!(next(&mut client).await, ready, "{framing:?}");
        }
    })
    .await;
}

#[tokio::test]
async fn big_writes_are_sent_in_chunks() {
    within(async {
        let (_conn, mut chans, mut client) =
            open(Framing::Binary, false, &[ChannelKind::Write]).await;
        let mut w = take_writer(&mut chans, 0);
        let data = pattern(100_000);
        let sent = data.clone();
        tokio::spawn(async move { w.write_all(&sent).await.unwrap() });
        let mut got = Vec::new();
        let mut messages = 0;
        while got.len() < data.len() {
            let Message::Binary(m) = next(&mut client).await else {
                panic!("not binary");
            };
            assert_eq!(m[0], 0);
            assert!(m.len() <= MAX_CHUNK + 1, "a message of {} bytes", m.len());
            got.extend_from_slice(&m[1..]);
            messages += 1;
        }
        assert_eq!(got, data);
        assert_eq!(messages, data.len().div_ceil(MAX_CHUNK));
    })
    .await;
}

#[tokio::test]
async fn the_v5_close_signal_ends_that_reader_only() {
    within(async {
        use ChannelKind::*;
        let kinds = [Read, Write, Write, Write, Read];
        let (_conn, mut chans, mut client) = open(Framing::Binary, true, &kinds).await;
        let mut stdin = take_reader(&mut chans, 0);
        let mut resize = take_reader(&mut chans, 4);
        let mut stdout = take_writer(&mut chans, 1);

        client.send(bin(b"\x00in")).await.unwrap();
        client.send(bin(&[255, 0])).await.unwrap();
        // Late data for the closed channel is dropped.
        client.send(bin(b"\x00late")).await.unwrap();
        client.send(bin(b"\x04rs")).await.unwrap();
        let mut got = Vec::new();
        stdin.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"in");
        let mut buf = [0u8; 2];
        resize.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"rs");

        // The rest of the connection goes on.
        client.send(bin(b"\x04more")).await.unwrap();
        let mut buf = [0u8; 4];
        resize.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"more");
        stdout.write_all(b"ok").await.unwrap();
        assert_eq!(next(&mut client).await, bin(b"\x01ok"));
    })
    .await;
}

#[tokio::test]
async fn without_the_close_signal_255_is_just_an_unknown_channel() {
    within(async {
        let (_conn, mut chans, mut client) =
            open(Framing::Binary, false, &[ChannelKind::Read]).await;
        let mut stdin = take_reader(&mut chans, 0);
        client.send(bin(&[255, 0])).await.unwrap();
        client.send(bin(b"\x00a")).await.unwrap();
        client.close(None).await.unwrap();
        let mut got = Vec::new();
        stdin.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"a");
    })
    .await;
}

#[tokio::test]
async fn a_malformed_close_signal_ends_the_connection_with_a_protocol_error() {
    within(async {
        for bad in [vec![255u8, 0, 1], vec![255, 7]] {
            let (conn, mut chans, mut client) =
                open(Framing::Binary, true, &[ChannelKind::Read]).await;
            let mut stdin = take_reader(&mut chans, 0);
            client.send(bin(&bad)).await.unwrap();
            let Message::Close(Some(frame)) = next(&mut client).await else {
                panic!("no close frame for {bad:?}");
            };
            assert_eq!(frame.code, CloseCode::Protocol);
            // Reading on answers the close; the server then ends.
            assert!(client.next().await.is_none());
            conn.closed().await;
            let mut got = Vec::new();
            stdin.read_to_end(&mut got).await.unwrap();
            assert!(got.is_empty());
        }
    })
    .await;
}

#[tokio::test]
async fn frames_for_ignored_unknown_and_write_only_channels_are_dropped() {
    within(async {
        use ChannelKind::*;
        let (_conn, mut chans, mut client) =
            open(Framing::Binary, false, &[Ignore, Read, Write]).await;
        assert!(chans[0].reader.is_none() && chans[0].writer.is_none());
        let mut r = take_reader(&mut chans, 1);
        for m in [&b"\x00x"[..], b"\x09y", b"\x02w", b"", b"\x01", b"\x01z"] {
            client.send(bin(m)).await.unwrap();
        }
        client.close(None).await.unwrap();
        let mut got = Vec::new();
        r.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"z");
    })
    .await;
}

#[tokio::test]
async fn the_client_closing_ends_readers_and_the_connection() {
    within(async {
        use ChannelKind::*;
        let (conn, mut chans, mut client) = open(Framing::Binary, false, &[Read, Write]).await;
        let mut stdin = take_reader(&mut chans, 0);
        let mut stdout = take_writer(&mut chans, 1);
        client.close(None).await.unwrap();
        let mut got = Vec::new();
        stdin.read_to_end(&mut got).await.unwrap();
        assert!(got.is_empty());
        conn.closed().await;
        // The server answered the close before it went.
        assert!(matches!(next(&mut client).await, Message::Close(_)));
        assert!(client.next().await.is_none());
        assert!(stdout.write_all(b"late").await.is_err());
    })
    .await;
}

#[tokio::test]
async fn a_broken_connection_ends_readers_and_the_connection() {
    within(async {
        let (conn, mut chans, client) = open(Framing::Binary, false, &[ChannelKind::Read]).await;
        let mut stdin = take_reader(&mut chans, 0);
        drop(client);
        conn.closed().await;
        let mut got = Vec::new();
        stdin.read_to_end(&mut got).await.unwrap();
        assert!(got.is_empty());
    })
    .await;
}

#[tokio::test]
async fn close_sends_a_normal_close_after_what_was_queued() {
    within(async {
        let (conn, mut chans, mut client) =
            open(Framing::Binary, false, &[ChannelKind::Write]).await;
        let mut w = take_writer(&mut chans, 0);
        w.write_all(b"bye").await.unwrap();
        let closing = tokio::spawn(async move {
            conn.close().await;
            conn
        });
        assert_eq!(next(&mut client).await, bin(b"\x00bye"));
        let Message::Close(Some(frame)) = next(&mut client).await else {
            panic!("no close frame");
        };
        assert_eq!(frame.code, CloseCode::Normal);
        // Reading on sends the client's answer; the server then drops the connection.
        assert!(client.next().await.is_none());
        let conn = closing.await.unwrap();
        conn.closed().await;
        assert!(w.write_all(b"late").await.is_err());
    })
    .await;
}

#[tokio::test]
async fn pings_are_answered() {
    within(async {
        let (_conn, _chans, mut client) = open(Framing::Binary, false, &[ChannelKind::Read]).await;
        client
            .send(Message::Ping(Bytes::from_static(b"hb")))
            .await
            .unwrap();
        assert_eq!(
            client.next().await.unwrap().unwrap(),
            Message::Pong(Bytes::from_static(b"hb"))
        );
    })
    .await;
}

#[tokio::test]
async fn megabytes_cross_a_read_write_channel_both_ways() {
    within(async {
        let (_conn, mut chans, client) =
            open(Framing::Binary, false, &[ChannelKind::ReadWrite]).await;
        let mut r = take_reader(&mut chans, 0);
        let mut w = take_writer(&mut chans, 0);
        // The server echoes.
        tokio::spawn(async move {
            let mut buf = vec![0u8; 100_000];
            loop {
                let n = r.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                w.write_all(&buf[..n]).await.unwrap();
            }
        });
        let data = pattern(4 << 20);
        let (mut sink, mut stream) = client.split();
        let sent = data.clone();
        let sender = tokio::spawn(async move {
            for chunk in sent.chunks(20_000) {
                let mut m = vec![0u8];
                m.extend_from_slice(chunk);
                sink.send(Message::binary(m)).await.unwrap();
            }
            sink
        });
        let mut got = Vec::with_capacity(data.len());
        while got.len() < data.len() {
            match stream.next().await.unwrap().unwrap() {
                Message::Binary(m) => {
                    assert_eq!(m[0], 0);
                    got.extend_from_slice(&m[1..]);
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(got == data, "the echo differs");
        drop(sender.await.unwrap());
    })
    .await;
}

#[tokio::test]
async fn a_reader_that_does_not_read_holds_up_neither_writes_nor_its_data() {
    within(async {
        use ChannelKind::*;
        let (_conn, mut chans, mut client) = open(Framing::Binary, false, &[Read, Write]).await;
        let mut stdin = take_reader(&mut chans, 0);
        let mut stdout = take_writer(&mut chans, 1);
        let count = READ_QUEUE * 3;
        for i in 0..count {
            client.send(bin(&[0, i as u8])).await.unwrap();
        }
        let guard = Duration::from_secs(10);
        tokio::time::timeout(guard, async {
            stdout.write_all(b"still").await.unwrap();
            assert_eq!(next(&mut client).await, bin(b"\x01still"));
        })
        .await
        .expect("writes waited for the reader");
        let mut got = vec![0u8; count];
        stdin.read_exact(&mut got).await.unwrap();
        assert_eq!(got, (0..count as u8).collect::<Vec<_>>());
    })
    .await;
}

#[tokio::test]
async fn a_message_over_the_limit_is_refused_with_a_close_not_buffered() {
    within(async {
        // Sent whole, as one frame, and as fragments (each small, the message too big).
        for fragmented in [false, true] {
            let (conn, mut chans, mut client) =
                open(Framing::Binary, false, &[ChannelKind::Read]).await;
            let mut stdin = take_reader(&mut chans, 0);
            let mut big = vec![0u8];
            big.extend_from_slice(&pattern(MAX_MESSAGE));
            if fragmented {
                use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
                use tokio_tungstenite::tungstenite::protocol::frame::{Frame, FrameHeader};
                let pieces: Vec<&[u8]> = big.chunks(64 * 1024).collect();
                let last = pieces.len() - 1;
                for (i, piece) in pieces.into_iter().enumerate() {
                    let header = FrameHeader {
                        is_final: i == last,
                        opcode: OpCode::Data(if i == 0 { Data::Binary } else { Data::Continue }),
                        ..FrameHeader::default()
                    };
                    let frame = Frame::from_payload(header, Bytes::copy_from_slice(piece));
                    // The server may close before the last fragments: sends may fail.
                    if client.send(Message::Frame(frame)).await.is_err() {
                        break;
                    }
                }
            } else {
                // Refused from the frame header: the server may close before all is written.
                let _ = client.send(Message::binary(big)).await;
            }
            let Message::Close(Some(frame)) = next(&mut client).await else {
                panic!("no close frame (fragmented: {fragmented})");
            };
            assert_eq!(frame.code, CloseCode::Size, "fragmented: {fragmented}");
            conn.closed().await;
            let mut got = Vec::new();
            stdin.read_to_end(&mut got).await.unwrap();
            assert!(got.is_empty(), "{} bytes reached the reader", got.len());
        }
    })
    .await;
}

#[tokio::test]
async fn a_message_at_the_limit_is_delivered() {
    within(async {
        let (_conn, mut chans, mut client) =
            open(Framing::Binary, false, &[ChannelKind::Read]).await;
        let mut stdin = take_reader(&mut chans, 0);
        let data = pattern(MAX_MESSAGE - 1);
        let mut m = vec![0u8];
        m.extend_from_slice(&data);
        client.send(Message::binary(m)).await.unwrap();
        let mut got = vec![0u8; data.len()];
        stdin.read_exact(&mut got).await.unwrap();
        assert!(got == data);
    })
    .await;
}

/// Virtual time: the runtime advances the clock only once every task waits, so the timeout
/// below fires exactly when the client can send no more.
#[tokio::test(start_paused = true)]
async fn a_reader_that_does_not_read_holds_at_most_its_byte_budget() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let (_conn, mut chans, mut client) = open(Framing::Binary, false, &[ChannelKind::Read]).await;
    let mut stdin = take_reader(&mut chans, 0);
    const MESSAGE: usize = 512 * 1024;
    const COUNT: usize = 16;
    let sent = Arc::new(AtomicUsize::new(0));
    let counted = sent.clone();
    let mut sender = tokio::spawn(async move {
        for i in 0..COUNT {
            let mut m = vec![0u8];
            m.extend_from_slice(&vec![i as u8; MESSAGE]);
            client.send(Message::binary(m)).await.unwrap();
            counted.fetch_add(1, Ordering::SeqCst);
        }
        client
    });
    let stalled = tokio::time::timeout(Duration::from_secs(60), &mut sender).await;
    assert!(
        stalled.is_err(),
        "the client sent all {COUNT} messages into a reader that does not read"
    );
    // The queue (READ_BYTES), the message held for it, the one being read, and the pipe.
    let buffered = sent.load(Ordering::SeqCst) * MESSAGE;
    assert!(
        buffered <= READ_BYTES + 2 * MESSAGE + 128 * 1024,
        "{buffered} bytes sent into a reader that does not read"
    );
    // Nothing was lost: all of it arrives once the reader reads.
    let mut got = vec![0u8; COUNT * MESSAGE];
    stdin.read_exact(&mut got).await.unwrap();
    for (i, chunk) in got.chunks(MESSAGE).enumerate() {
        assert!(chunk.iter().all(|b| *b == i as u8), "message {i}");
    }
    drop(sender.await.unwrap());
}

async fn tunnel() -> (Tunnel, Client) {
    let (server, client) = tokio::io::duplex(64 * 1024);
    let tunnel = Tunnel::new(server);
    let client = WebSocketStream::from_raw_socket(client, Role::Client, None).await;
    (tunnel, client)
}

#[tokio::test]
async fn the_tunnel_has_no_prefix_and_reads_concatenate_messages() {
    within(async {
        let (mut tunnel, mut client) = tunnel().await;
        client.send(bin(b"hel")).await.unwrap();
        client.send(bin(b"lo")).await.unwrap();
        let mut buf = [0u8; 5];
        tunnel.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"hello");
        tunnel.write_all(b"abc").await.unwrap();
        tunnel.flush().await.unwrap();
        assert_eq!(next(&mut client).await, bin(b"abc"));
    })
    .await;
}

#[tokio::test]
async fn the_tunnel_reads_eof_at_a_close_and_shutdown_sends_one() {
    within(async {
        let (mut tunnel, mut client) = tunnel().await;
        client.send(bin(b"x")).await.unwrap();
        client
            .close(Some(CloseFrame {
                code: CloseCode::Normal,
                reason: "".into(),
            }))
            .await
            .unwrap();
        let mut got = Vec::new();
        tunnel.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"x");

        let (mut tunnel, mut client) = self::tunnel().await;
        tunnel.shutdown().await.unwrap();
        let Message::Close(Some(frame)) = next(&mut client).await else {
            panic!("no close frame");
        };
        assert_eq!(frame.code, CloseCode::Normal);
    })
    .await;
}

#[tokio::test]
async fn the_tunnel_refuses_text_messages() {
    within(async {
        let (mut tunnel, mut client) = tunnel().await;
        client.send(Message::text("hi")).await.unwrap();
        let mut buf = [0u8; 2];
        let err = tunnel.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
    })
    .await;
}

#[tokio::test]
async fn megabytes_cross_the_tunnel_both_ways() {
    within(async {
        let (tunnel, client) = tunnel().await;
        let (mut r, mut w) = tokio::io::split(tunnel);
        let echo = tokio::spawn(async move {
            let n = tokio::io::copy(&mut r, &mut w).await.unwrap();
            w.shutdown().await.unwrap();
            n
        });
        let data = pattern(4 << 20);
        let (mut sink, mut stream) = client.split();
        let sent = data.clone();
        let sender = tokio::spawn(async move {
            for chunk in sent.chunks(30_000) {
                sink.send(Message::binary(chunk.to_vec())).await.unwrap();
            }
            sink
        });
        let mut got = Vec::with_capacity(data.len());
        let mut largest = 0;
        while got.len() < data.len() {
            match stream.next().await.unwrap().unwrap() {
                Message::Binary(m) => {
                    largest = largest.max(m.len());
                    got.extend_from_slice(&m);
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(got == data, "the echo differs");
        assert!(largest <= MAX_CHUNK, "a message of {largest} bytes");
        // The client closing ends the echo, whose shutdown closes back.
        let mut sink = sender.await.unwrap();
        sink.close().await.unwrap();
        assert_eq!(echo.await.unwrap(), data.len() as u64);
        assert!(matches!(
            stream.next().await,
            Some(Ok(Message::Close(_))) | None
        ));
    })
    .await;
}

#[test]
fn the_accept_key_is_rfc_6455s() {
    assert_eq!(
        accept_key(b"dGhlIHNhbXBsZSBub25jZQ=="),
        "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
    );
}

/// Channel frames: any bytes, in either framing, with or without the v5 close signal, for any
/// set of channels: routing never panics, data goes only to a channel the session reads and
/// is never longer than the message (base64 decodes shorter), and a close signal only names a
/// channel that exists.
#[test]
fn arbitrary_channel_frames_never_panic_the_router() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let kinds = prop_oneof![
        Just(ChannelKind::Read),
        Just(ChannelKind::Write),
        Just(ChannelKind::ReadWrite),
        Just(ChannelKind::Ignore),
    ];
    let message = prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..256),
        // Channel digit then base64-ish text, line breaks included.
        (0u8..12, "[A-Za-z0-9+/=\r\n]{0,64}").prop_map(|(c, t)| {
            let mut m = vec![b'0'.wrapping_add(c)];
            m.extend_from_slice(t.as_bytes());
            m
        }),
        (any::<u8>()).prop_map(|c| vec![CLOSE_SIGNAL, c]),
    ];
    let strategy = (
        any::<bool>(),
        any::<bool>(),
        proptest::collection::vec(kinds, 0..6),
        proptest::collection::vec(message, 1..8),
    );
    TestRunner::new(Config {
        cases: 512,
        failure_persistence: None,
        ..Config::default()
    })
    .run(&strategy, |(base64, close_signal, kinds, messages)| {
        let readers = kinds
            .iter()
            .map(|k| {
                matches!(k, ChannelKind::Read | ChannelKind::ReadWrite).then(|| {
                    let (tx, _rx) = mpsc::channel(1);
                    ReaderTx {
                        tx,
                        budget: Arc::new(Semaphore::new(READ_BYTES)),
                    }
                })
            })
            .collect();
        let task = ConnTask {
            options: ChannelOptions {
                framing: if base64 {
                    Framing::Base64
                } else {
                    Framing::Binary
                },
                close_signal,
                channels: kinds.clone(),
            },
            readers,
            log: log(),
        };
        for m in messages {
            let len = m.len();
            match task.route(Bytes::from(m)) {
                Route::Nothing | Route::Fail(_) => {}
                Route::CloseChannel(n) => {
                    prop_assert!(close_signal && n < kinds.len());
                }
                Route::Deliver(n, data) => {
                    prop_assert!(matches!(
                        kinds[n],
                        ChannelKind::Read | ChannelKind::ReadWrite
                    ));
                    prop_assert!(!data.is_empty() && data.len() < len);
                }
            }
        }
        Ok(())
    })
    .unwrap();
}
