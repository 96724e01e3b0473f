//! Every wait here has a deadline; nothing sleeps to synchronise. Where a test needs to know the
//! reader task got past some frame, it sends a marker frame behind it on an opened connection
//! and reads that: the reader task handles frames in order.

use std::collections::VecDeque;
use std::time::Duration;

use super::*;

const DEADLINE: Duration = Duration::from_secs(10);

async fn within<F: Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(DEADLINE, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: no result within {DEADLINE:?}"))
}

fn frame(conn: ConnId, payload: &[u8]) -> Vec<u8> {
    let mut f = conn.to_be_bytes().to_vec();
    f.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_be_bytes());
    f.extend_from_slice(payload);
    f
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

async fn read_to_end(conn: &mut Conn) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    within("read to end", conn.read_to_end(&mut out)).await?;
    Ok(out)
}

async fn read_n(conn: &mut Conn, n: usize) -> Vec<u8> {
    let mut out = vec![0; n];
    within("read_exact", conn.read_exact(&mut out))
        .await
        .expect("read_exact");
    out
}

/// Waits, yielding to the mux's tasks, until `cond` holds of the mux's state.
async fn state_reaches(mux: &Mux, what: &str, cond: impl Fn(&State) -> bool) {
    within(what, async {
        while !cond(&mux.shared.state()) {
            tokio::task::yield_now().await;
        }
    })
    .await
}

/// A trunk whose reads return exactly the given chunks, one per read, then EOF; writes vanish.
struct Scripted {
    chunks: VecDeque<Vec<u8>>,
}

impl AsyncRead for Scripted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        // An empty chunk would read as EOF.
        while self.chunks.front().is_some_and(Vec::is_empty) {
            self.chunks.pop_front();
        }
        if let Some(mut chunk) = self.chunks.pop_front() {
            let n = chunk.len().min(buf.remaining());
            buf.put_slice(&chunk[..n]);
            if n < chunk.len() {
                self.chunks.push_front(chunk.split_off(n));
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Scripted {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        Poll::Ready(Ok(b.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// A mux on one end of a duplex pipe, the raw other end for the test to play the peer.
fn mux_and_peer() -> (Mux, tokio::io::DuplexStream) {
    let (ours, peer) = tokio::io::duplex(64 * 1024);
    (Mux::new(ours, None), peer)
}

fn assert_failed(reason: &CloseReason, check: impl Fn(&TrunkError) -> bool) {
    match reason {
        CloseReason::Failed(e) if check(e) => {}
        other => panic!("unexpected close reason {other:?}"),
    }
}

/// The peer sees its end of the trunk close: reads hit EOF (whatever was still in flight
/// before is skipped).
async fn assert_peer_sees_eof(peer: &mut tokio::io::DuplexStream) {
    let mut sink = Vec::new();
    within("peer EOF", peer.read_to_end(&mut sink))
        .await
        .expect("peer read");
}

#[tokio::test]
async fn frames_cut_at_every_byte_arrive_intact_and_in_order() {
    let long = pattern(300, 7);
    let stream: Vec<u8> = [
        frame(1, b"hello"),
        frame(2, b"world!"),
        frame(1, &long),
        frame(2, b""),
        frame(1, b"x"),
        frame(2, &pattern(20, 3)),
    ]
    .concat();
    let want1 = [b"hello".as_slice(), &long, b"x"].concat();
    let want2 = [b"world!".as_slice(), &pattern(20, 3)].concat();

    let splits = (0..=stream.len())
        .map(|cut| vec![stream[..cut].to_vec(), stream[cut..].to_vec()])
        // And every byte on its own.
        .chain(std::iter::once(stream.iter().map(|b| vec![*b]).collect()));
    for chunks in splits {
        let cuts: Vec<usize> = chunks.iter().map(Vec::len).collect();
        let mux = Mux::new(
            Scripted {
                chunks: chunks.into(),
            },
            None,
        );
        let mut c1 = mux.open(1).unwrap();
        let mut c2 = mux.open(2).unwrap();
        assert_eq!(
            read_to_end(&mut c1).await.unwrap(),
            want1,
            "chunks {cuts:?}"
        );
        assert_eq!(
            read_to_end(&mut c2).await.unwrap(),
            want2,
            "chunks {cuts:?}"
        );
        assert!(matches!(
            within("closed", mux.closed()).await,
            CloseReason::PeerClosed
        ));
    }
}

#[tokio::test]
async fn two_conns_round_trip_both_ways_between_two_muxes() {
    let (a, b) = tokio::io::duplex(4096);
    let (runtime, plugin) = (Mux::new(a, None), Mux::new(b, None));
    let mut r1 = runtime.open(PLUGIN_SERVICE_CONN).unwrap();
    let mut r2 = runtime.open(RUNTIME_SERVICE_CONN).unwrap();
    let mut p1 = plugin.open(PLUGIN_SERVICE_CONN).unwrap();
    let mut p2 = plugin.open(RUNTIME_SERVICE_CONN).unwrap();

    // Larger than the duplex buffer, so both directions are in flight together.
    let (q1, q2, a1, a2) = (
        pattern(10_000, 1),
        pattern(9_000, 2),
        pattern(11_000, 3),
        pattern(8_000, 4),
    );
    let runtime_side = async {
        r1.write_all(&q1).await.unwrap();
        r2.write_all(&q2).await.unwrap();
        r1.flush().await.unwrap();
        r2.flush().await.unwrap();
        (
            read_n(&mut r1, a1.len()).await,
            read_n(&mut r2, a2.len()).await,
        )
    };
    let plugin_side = async {
        let got1 = read_n(&mut p1, q1.len()).await;
        p1.write_all(&a1).await.unwrap();
        let got2 = read_n(&mut p2, q2.len()).await;
        p2.write_all(&a2).await.unwrap();
        p1.flush().await.unwrap();
        p2.flush().await.unwrap();
        (got1, got2)
    };
    let ((back1, back2), (got1, got2)) = within("round trip", async {
        tokio::join!(runtime_side, plugin_side)
    })
    .await;
    assert_eq!(got1, q1);
    assert_eq!(got2, q2);
    assert_eq!(back1, a1);
    assert_eq!(back2, a2);
    assert!(runtime.close_reason().is_none());
    assert!(plugin.close_reason().is_none());
}

#[tokio::test]
async fn a_frame_of_max_payload_is_accepted_one_more_byte_closes_the_trunk() {
    let (mux, mut peer) = mux_and_peer();
    let mut c1 = mux.open(1).unwrap();
    let mut c2 = mux.open(2).unwrap();

    let big = pattern(MAX_PAYLOAD, 9);
    let writer = async { peer.write_all(&frame(1, &big)).await.unwrap() };
    let (got, ()) = within("max frame", async {
        tokio::join!(read_n(&mut c1, MAX_PAYLOAD), writer)
    })
    .await;
    assert!(got == big, "the max-size frame arrived altered");
    assert!(mux.close_reason().is_none());

    // Only once that frame was read: the failure drops what is queued.
    peer.write_all(&1u32.to_be_bytes()).await.unwrap();
    peer.write_all(&(MAX_PAYLOAD_U32 + 1).to_be_bytes())
        .await
        .unwrap();

    let reason = within("closed", mux.closed()).await;
    assert_failed(
        &reason,
        |e| matches!(e, TrunkError::FrameTooLarge { conn: 1, len } if *len == MAX_PAYLOAD_U32 + 1),
    );
    for c in [&mut c1, &mut c2] {
        let err = read_to_end(c).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionAborted);
    }
    assert_peer_sees_eof(&mut peer).await;
}

#[tokio::test]
async fn a_huge_claimed_length_closes_the_trunk_without_waiting_for_the_payload() {
    let (mux, mut peer) = mux_and_peer();
    let mut c1 = mux.open(1).unwrap();
    peer.write_all(&[0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff])
        .await
        .unwrap();
    let reason = within("closed", mux.closed()).await;
    assert_failed(&reason, |e| matches!(e, TrunkError::FrameTooLarge { .. }));
    assert!(read_to_end(&mut c1).await.is_err());
    assert_peer_sees_eof(&mut peer).await;
}

#[tokio::test]
async fn a_frame_for_conn_id_0_closes_the_trunk() {
    let (mux, mut peer) = mux_and_peer();
    let mut c1 = mux.open(1).unwrap();
    peer.write_all(&[frame(1, b"before"), frame(0, b"bad"), frame(1, b"after")].concat())
        .await
        .unwrap();
    let reason = within("closed", mux.closed()).await;
    assert_failed(&reason, |e| matches!(e, TrunkError::ReservedConn));
    // A protocol error drops what was queued: the reader gets the error.
    assert!(read_to_end(&mut c1).await.is_err());
    assert_peer_sees_eof(&mut peer).await;
}

#[tokio::test]
async fn data_for_an_unopened_conn_is_queued_until_it_is_opened() {
    let (mux, mut peer) = mux_and_peer();
    let mut marker = mux.open(1).unwrap();
    peer.write_all(&[frame(7, b"early "), frame(7, b"bird"), frame(1, b"marker")].concat())
        .await
        .unwrap();
    // The marker arrived, so both frames for 7 were handled before it.
    assert_eq!(read_n(&mut marker, 6).await, b"marker");

    let mut late = mux.open(7).unwrap();
    assert_eq!(read_n(&mut late, 10).await, b"early bird");
    peer.write_all(&frame(7, b"!")).await.unwrap();
    assert_eq!(read_n(&mut late, 1).await, b"!");
    assert!(mux.close_reason().is_none());
}

#[tokio::test]
async fn data_for_too_many_unopened_ids_closes_the_trunk() {
    let (mux, mut peer) = mux_and_peer();
    let mut marker = mux.open(1).unwrap();
    let unopened: Vec<u8> = (0..MAX_UNOPENED_CONNS)
        .flat_map(|i| frame(10 + i as ConnId, b"x"))
        .collect();
    peer.write_all(&[unopened, frame(1, b"m")].concat())
        .await
        .unwrap();
    assert_eq!(read_n(&mut marker, 1).await, b"m");
    assert!(mux.close_reason().is_none());

    peer.write_all(&frame(99, b"x")).await.unwrap();
    let reason = within("closed", mux.closed()).await;
    assert_failed(&reason, |e| {
        matches!(e, TrunkError::TooManyUnopened { conn: 99 })
    });
}

/// Plays the overflow on `conn`, opened as `open` says, with conn 2 as the marker.
async fn overflow(open: bool) {
    let (mux, mut peer) = mux_and_peer();
    let _c1 = open.then(|| mux.open(1).unwrap());
    let mut marker = mux.open(2).unwrap();

    let full: Vec<u8> = (0..READ_QUEUE_FRAMES)
        .flat_map(|_| frame(1, b"q"))
        .collect();
    peer.write_all(&[full, frame(2, b"m")].concat())
        .await
        .unwrap();
    assert_eq!(read_n(&mut marker, 1).await, b"m");
    assert!(
        mux.close_reason().is_none(),
        "{READ_QUEUE_FRAMES} frames fit"
    );

    peer.write_all(&frame(1, b"one too many")).await.unwrap();
    let reason = within("closed", mux.closed()).await;
    assert_failed(&reason, |e| {
        matches!(e, TrunkError::QueueOverflow { conn: 1 })
    });
    assert!(read_to_end(&mut marker).await.is_err());
    assert_peer_sees_eof(&mut peer).await;
}

#[tokio::test]
async fn an_open_conns_queue_overflow_closes_the_trunk() {
    overflow(true).await;
}

#[tokio::test]
async fn an_unopened_conns_queue_overflow_closes_the_trunk() {
    overflow(false).await;
}

#[tokio::test]
async fn a_conns_unread_bytes_past_their_bound_close_the_trunk() {
    let (mux, mut peer) = mux_and_peer();
    let _c1 = mux.open(1).unwrap();
    let mut marker = mux.open(2).unwrap();
    let big = pattern(MAX_PAYLOAD, 7);
    for _ in 0..READ_QUEUE_BYTES / MAX_PAYLOAD {
        peer.write_all(&frame(1, &big)).await.unwrap();
    }
    peer.write_all(&frame(2, b"m")).await.unwrap();
    assert_eq!(read_n(&mut marker, 1).await, b"m");
    assert!(mux.close_reason().is_none(), "{READ_QUEUE_BYTES} bytes fit");

    peer.write_all(&frame(1, b"x")).await.unwrap();
    let reason = within("closed", mux.closed()).await;
    assert_failed(&reason, |e| {
        matches!(e, TrunkError::QueueBytesOverflow { conn: 1, .. })
    });
}

#[tokio::test]
async fn reading_frees_queue_room() {
    let (mux, mut peer) = mux_and_peer();
    let mut c1 = mux.open(1).unwrap();
    let frames = 3 * READ_QUEUE_FRAMES;
    let writer = async {
        for _ in 0..frames {
            peer.write_all(&frame(1, b"ab")).await.unwrap();
        }
    };
    let (got, ()) = within("drain", async {
        tokio::join!(read_n(&mut c1, 2 * frames), writer)
    })
    .await;
    assert_eq!(got, b"ab".repeat(frames));
    assert!(mux.close_reason().is_none());
}

/// Frames as the raw peer reads them off the trunk.
async fn read_frames_raw(peer: &mut tokio::io::DuplexStream, n: usize) -> Vec<(ConnId, Vec<u8>)> {
    let mut frames = Vec::new();
    for _ in 0..n {
        let mut header = [0u8; HEADER_LEN];
        within("frame header", peer.read_exact(&mut header))
            .await
            .unwrap();
        let conn = ConnId::from_be_bytes(header[..4].try_into().unwrap());
        let len = u32::from_be_bytes(header[4..].try_into().unwrap());
        let mut payload = vec![0; len as usize];
        within("frame payload", peer.read_exact(&mut payload))
            .await
            .unwrap();
        frames.push((conn, payload));
    }
    frames
}

#[tokio::test]
async fn a_write_larger_than_a_frame_is_split_and_reassembled() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let (runtime, plugin) = (Mux::new(a, None), Mux::new(b, None));
    let mut tx = runtime.open(2).unwrap();
    let mut rx = plugin.open(2).unwrap();
    let data = pattern(2 * MAX_PAYLOAD + 123, 5);
    let writer = async {
        tx.write_all(&data).await.unwrap();
        tx.flush().await.unwrap();
    };
    let (got, ()) = within("reassembly", async {
        tokio::join!(read_n(&mut rx, data.len()), writer)
    })
    .await;
    assert!(got == data, "reassembled data differs");
}

#[tokio::test]
async fn writes_become_frames_of_at_most_max_payload_never_interleaved() {
    let (mux, mut peer) = mux_and_peer();
    let mut c1 = mux.open(1).unwrap();
    let mut c2 = mux.open(2).unwrap();
    let (d1, d2) = (vec![0xaa; MAX_PAYLOAD + 10], vec![0xbb; 2 * MAX_PAYLOAD]);
    let write1 = async {
        c1.write_all(&d1).await.unwrap();
        c1.write_all(b"tail").await.unwrap();
        c1.flush().await.unwrap();
    };
    let write2 = async {
        c2.write_all(&d2).await.unwrap();
        c2.flush().await.unwrap();
    };
    let (frames, (), ()) = within("frames", async {
        tokio::join!(read_frames_raw(&mut peer, 5), write1, write2)
    })
    .await;

    let of = |id| -> Vec<usize> {
        frames
            .iter()
            .filter(|(c, _)| *c == id)
            .map(|(_, p)| p.len())
            .collect()
    };
    // One write of at most MAX_PAYLOAD bytes is one frame, a longer one is cut at MAX_PAYLOAD.
    assert_eq!(of(1), [MAX_PAYLOAD, 10, 4]);
    assert_eq!(of(2), [MAX_PAYLOAD, MAX_PAYLOAD]);
    for (conn, payload) in &frames {
        let byte = if *conn == 1 { 0xaa } else { 0xbb };
        let body = if payload.as_slice() == b"tail" {
            &[][..]
        } else {
            payload
        };
        assert!(body.iter().all(|b| *b == byte), "conn {conn}: mixed frame");
    }
}

#[tokio::test]
async fn trunk_eof_delivers_what_was_queued_then_ends_reads_and_fails_writes() {
    let (mux, mut peer) = mux_and_peer();
    let mut c1 = mux.open(1).unwrap();
    let mut c2 = mux.open(2).unwrap();
    peer.write_all(&frame(1, b"last words")).await.unwrap();
    drop(peer);

    assert!(matches!(
        within("closed", mux.closed()).await,
        CloseReason::PeerClosed
    ));
    assert_eq!(read_to_end(&mut c1).await.unwrap(), b"last words");
    assert_eq!(read_to_end(&mut c2).await.unwrap(), b"");
    let err = within("write", c2.write_all(b"anyone?")).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    assert!(matches!(mux.open(3), Err(OpenError::Closed)));
}

#[tokio::test]
async fn a_pending_read_ends_when_the_trunk_closes() {
    let (mux, peer) = mux_and_peer();
    let mut c1 = mux.open(1).unwrap();
    let reader = tokio::spawn(async move { read_to_end(&mut c1).await });
    state_reaches(&mux, "reader parked", |st| {
        st.slots.get(&1).is_some_and(|s| s.read_waker.is_some())
    })
    .await;
    drop(peer);
    let got = within("reader", reader).await.unwrap().unwrap();
    assert!(got.is_empty());
}

#[tokio::test]
async fn a_write_waiting_for_queue_room_fails_when_the_trunk_closes() {
    // The peer never reads: the duplex fills, then the write queue, then the write waits.
    let (ours, peer) = tokio::io::duplex(16);
    let mux = Mux::new(ours, None);
    let mut c1 = mux.open(1).unwrap();
    let writer = tokio::spawn(async move {
        let data = vec![1u8; 4 * (HEADER_LEN + MAX_PAYLOAD)];
        c1.write_all(&data).await
    });
    state_reaches(&mux, "writer parked", |st| {
        st.slots.get(&1).is_some_and(|s| s.write_waker.is_some())
    })
    .await;
    mux.close();
    let err = within("writer", writer).await.unwrap().unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    drop(peer);
}

#[tokio::test]
async fn close_ends_reads_fails_writes_and_closes_the_trunk() {
    let (mux, mut peer) = mux_and_peer();
    let mut c1 = mux.open(1).unwrap();
    let closed = mux.closed();
    mux.close();
    assert!(matches!(within("closed", closed).await, CloseReason::Local));
    assert_eq!(read_to_end(&mut c1).await.unwrap(), b"");
    let err = within("write", c1.write_all(b"x")).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    assert_peer_sees_eof(&mut peer).await;
}

#[tokio::test]
async fn dropping_the_mux_closes_the_trunk() {
    let (mux, mut peer) = mux_and_peer();
    let mut c1 = mux.open(1).unwrap();
    let closed = mux.closed();
    drop(mux);
    assert!(matches!(within("closed", closed).await, CloseReason::Local));
    assert_eq!(read_to_end(&mut c1).await.unwrap(), b"");
    assert_peer_sees_eof(&mut peer).await;
}

#[tokio::test]
async fn a_dropped_conns_data_is_discarded_and_does_not_wedge_others() {
    let (mux, mut peer) = mux_and_peer();
    let c1 = mux.open(1).unwrap();
    let mut c2 = mux.open(2).unwrap();
    drop(c1);
    // More than a queue's worth for the dropped conn: discarded, not an overflow.
    let flood: Vec<u8> = (0..2 * READ_QUEUE_FRAMES)
        .flat_map(|_| frame(1, b"z"))
        .collect();
    peer.write_all(&[flood, frame(2, b"still here")].concat())
        .await
        .unwrap();
    assert_eq!(read_n(&mut c2, 10).await, b"still here");
    c2.write_all(b"and back").await.unwrap();
    within("flush", c2.flush()).await.unwrap();
    assert_eq!(
        read_frames_raw(&mut peer, 1).await,
        [(2, b"and back".to_vec())]
    );
    assert!(mux.close_reason().is_none());
}

#[tokio::test]
async fn shutdown_refuses_writes_on_that_conn_only() {
    let (mux, mut peer) = mux_and_peer();
    let mut c1 = mux.open(1).unwrap();
    let mut c2 = mux.open(2).unwrap();
    c1.write_all(b"bye").await.unwrap();
    within("shutdown", c1.shutdown()).await.unwrap();
    let err = c1.write_all(b"more").await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    c2.write_all(b"hi").await.unwrap();
    within("flush", c2.flush()).await.unwrap();
    assert_eq!(
        read_frames_raw(&mut peer, 2).await,
        [(1, b"bye".to_vec()), (2, b"hi".to_vec())]
    );
    // Reading still works after a write shutdown.
    peer.write_all(&frame(1, b"ok")).await.unwrap();
    assert_eq!(read_n(&mut c1, 2).await, b"ok");
}

#[tokio::test]
async fn opening_an_id_twice_or_id_0_is_an_error() {
    let (mux, _peer) = mux_and_peer();
    let c1 = mux.open(1).unwrap();
    assert!(matches!(mux.open(1), Err(OpenError::AlreadyOpened(1))));
    drop(c1);
    assert!(matches!(mux.open(1), Err(OpenError::AlreadyOpened(1))));
    assert!(matches!(mux.open(0), Err(OpenError::Reserved)));
    assert!(mux.open(2).is_ok());
}

#[test]
fn conn_is_what_ttrpc_socket_new_needs() {
    fn socket_like<T: AsyncRead + AsyncWrite + Send + Sync + Unpin + 'static>() {}
    socket_like::<Conn>();
    fn spawnable<T: Send + 'static>(_: &T) {}
    let (ours, _peer) = tokio::io::duplex(1);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let _guard = rt.enter();
    spawnable(&Mux::new(ours, None).closed());
}

/// ttrpc's client writes a request (write, then flush) and, if the answer arrives while the
/// flush is still pending, drops the write and closes its whole connection ("cancelled during
/// write"). A plugin can answer before the mux's writer task has marked the frame written, so
/// a flush must be ready once the frame is queued. On a current-thread runtime the writer task
/// cannot run between the write and the flush here: a flush waiting for it is pending.
#[tokio::test(flavor = "current_thread")]
async fn a_flush_is_ready_once_the_frame_is_queued_before_the_writer_task_runs() {
    let (mux, mut peer) = mux_and_peer();
    let mut conn = mux.open(1).expect("open");
    let written = std::future::poll_fn(|cx| Pin::new(&mut conn).poll_write(cx, b"request"));
    assert!(matches!(futures::poll!(written), Poll::Ready(Ok(7))));
    let flushed = std::future::poll_fn(|cx| Pin::new(&mut conn).poll_flush(cx));
    assert!(
        matches!(futures::poll!(flushed), Poll::Ready(Ok(()))),
        "the flush waits for the writer task"
    );
    // And the frame does go out.
    let mut got = vec![0u8; HEADER_LEN + 7];
    within("the frame on the trunk", peer.read_exact(&mut got))
        .await
        .expect("read");
    assert_eq!(got, frame(1, b"request"));
    // Shutdown still waits for the trunk, and then refuses writes.
    within("shutdown", conn.shutdown()).await.expect("shutdown");
    assert!(conn.write_all(b"more").await.is_err());
}
