//! The connection task and the state it shares with the stream handles.
//!
//! One spawned task drives the connection: a read loop (decode frames, act on them) and a
//! write loop (drain the outbound queue into the socket), polled together; whichever ends
//! first ends the session. Stream handles never touch the socket: they lock [`State`], move
//! bytes in or out of it and wake the task. The lock is a plain mutex held for a few field
//! updates, never across an await.
//!
//! Backpressure, the part that keeps memory bounded:
//! - Inbound: each stream buffers at most [`RECV_LIMIT`] (payload plus a per-frame cost).
//!   When a data frame arrives for a full stream, the read loop waits until that stream's
//!   reader drains it: the socket is not read meanwhile. This is head-of-line blocking across
//!   the session's streams, the only bound a spdystream client leaves us (it ignores window
//!   updates, see below), and what kubelet's own spdystream server does too (its frame
//!   workers block on an unbuffered channel per stream).
//! - Outbound: writers wait while the queue holds [`OUT_SOFT_LIMIT`] bytes or more; control
//!   frames the read loop answers with (SYN_REPLY, PING, RST_STREAM) bypass that, and the read
//!   loop stops reading while the queue exceeds [`OUT_HARD_LIMIT`], so a client that floods
//!   pings without reading the answers cannot grow it without bound either.
//!
//! Flow control: moby/spdystream, the client of kubectl/crictl, parses WINDOW_UPDATE and
//! SETTINGS but acts on neither — it never sends WINDOW_UPDATE, never limits what it sends,
//! and drops the ones it gets ("unhandled frame type"). Enforcing SPDY's default 64 KiB
//! windows would stall every transfer against it after 64 KiB. So the send windows are always
//! accounted (initial window, SETTINGS_INITIAL_WINDOW_SIZE, WINDOW_UPDATE per stream and for
//! the session, stream 0) but only enforced once the peer shows it speaks flow control: a
//! SETTINGS with INITIAL_WINDOW_SIZE, or any WINDOW_UPDATE. From then on the server also
//! credits what its readers consumed with WINDOW_UPDATEs (per stream and per session, every
//! half window). A client that enforces windows without ever announcing it could be overrun
//! before its first WINDOW_UPDATE arrives; inbound windows are not policed (the buffer bound
//! above is what protects the server).
//!
//! While the read loop waits for room it still reads the socket, up to a bounded read-ahead,
//! only to notice a client that hangs up: then the session ends at once (what was not yet
//! buffered for a reader is dropped with it). Past the read-ahead, EOF hides behind unread
//! bytes, so the waiting loop pings the client every few seconds (even ids; spdystream echoes
//! them): a peer that is gone makes the write, or the next read, fail.
//!
//! Ending: [`Shared::begin_close`] (our GOAWAY, or the client's) stops new streams and writes;
//! the write loop then drains the queue, shuts the socket down and returns. A decode error
//! sends GOAWAY(PROTOCOL_ERROR) the same way. EOF or an I/O error ends at once. In every case
//! [`Shared::finish`] marks the session ended and wakes every handle: readers return what they
//! buffered and then EOF, writers fail, `Incoming` yields `None`.

use std::collections::{HashMap, VecDeque};
use std::future::poll_fn;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Poll, Waker};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use slog::{debug, Logger};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{watch, Notify};

use super::frame::{
    self, Decoder, Encoder, Frame, FrameError, FLAG_FIN, FLAG_UNIDIRECTIONAL, GOAWAY_OK,
    GOAWAY_PROTOCOL_ERROR, RST_PROTOCOL_ERROR, RST_REFUSED_STREAM, SETTINGS_INITIAL_WINDOW_SIZE,
};
use super::header::Headers;

/// The largest data frame the server sends (client-go's io.Copy sends 32 KiB ones too).
pub(crate) const MAX_DATA_FRAME: usize = 32 * 1024;
/// What one stream may buffer from the client before the socket is no longer read.
pub(crate) const RECV_LIMIT: usize = 256 * 1024;
/// What a buffered frame costs beyond its payload (so tiny frames are bounded too).
pub(crate) const FRAME_COST: usize = 64;
/// Inbound data frames smaller than this are copied out of the read buffer, so a few small
/// buffered frames cannot pin many large read buffers.
const COPY_BELOW: usize = 16 * 1024;
/// Writers wait while this much is queued for the socket.
pub(crate) const OUT_SOFT_LIMIT: usize = 256 * 1024;
/// The read loop stops reading while this much is queued (control answers included).
pub(crate) const OUT_HARD_LIMIT: usize = 1024 * 1024;
/// SPDY's default initial window (stream and session).
pub(crate) const DEFAULT_WINDOW: i64 = 64 * 1024;
/// Streams alive at once; more are refused (REFUSED_STREAM).
pub(crate) const MAX_STREAMS: usize = 1024;
/// How long `close` lets the queue drain before dropping the connection.
pub(crate) const CLOSE_GRACE: Duration = Duration::from_secs(10);
/// Our GOAWAY status for `close`.
pub(crate) const CLOSE_STATUS: u32 = GOAWAY_OK;
/// What the read loop asks of the socket at once.
const READ_CHUNK: usize = 64 * 1024;
/// What the read loop reads ahead, undecoded, while a frame waits for room.
const READ_AHEAD: usize = 256 * 1024;
/// How often a read loop waiting for room pings the client (see `read_loop`).
const PROBE_EVERY: Duration = Duration::from_secs(5);
/// At most this much is taken off the queue per socket write batch.
const WRITE_BATCH: usize = 256 * 1024;

/// Why a session's connection ended abnormally.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The client sent bytes that are not SPDY/3.1.
    #[error("protocol error: {0}")]
    Protocol(#[from] FrameError),
    /// The socket failed.
    #[error("connection: {0}")]
    Io(#[from] io::Error),
}

/// What a session's task and handles share.
pub(crate) struct Shared {
    state: Mutex<State>,
    pub(crate) log: Logger,
    ended: watch::Sender<bool>,
    force: Notify,
}

/// One stream's share of the state.
#[derive(Default)]
pub(crate) struct StreamState {
    recv: VecDeque<Bytes>,
    /// Buffered payload plus [`FRAME_COST`] per buffered frame.
    recv_cost: usize,
    remote_fin: bool,
    reset: bool,
    reader_gone: bool,
    writer_gone: bool,
    reader: Option<Waker>,
    /// The read loop, waiting for room in `recv`.
    drain: Option<Waker>,
    /// Consumed by the reader, not yet credited to the client.
    unacked: u64,
    /// What the client lets us send on this stream (accounted always, enforced with `peer_fc`).
    window: i64,
    local_fin: bool,
    writer: Option<Waker>,
    /// The queue sequence number of this stream's last queued frame.
    last_seq: u64,
}

/// The session's state.
pub(crate) struct State {
    streams: HashMap<u32, StreamState>,
    out: VecDeque<Bytes>,
    /// Queued plus being written.
    out_bytes: usize,
    /// Frames ever queued / ever written (and flushed).
    pushed: u64,
    written: u64,
    write_task: Option<Waker>,
    read_task: Option<Waker>,
    incoming: VecDeque<(u32, Headers)>,
    incoming_waker: Option<Waker>,
    incoming_gone: bool,
    /// The highest stream id accepted.
    last_id: u32,
    /// No new streams, no new writes; the write loop ends once the queue is empty.
    closing: bool,
    /// The connection is gone.
    ended: bool,
    /// The client showed it speaks flow control: windows enforced, credits sent.
    peer_fc: bool,
    initial_window: i64,
    session_window: i64,
    session_unacked: u64,
}

impl Shared {
    pub(crate) fn new(log: Logger) -> Self {
        Shared {
            state: Mutex::new(State {
                streams: HashMap::new(),
                out: VecDeque::new(),
                out_bytes: 0,
                pushed: 0,
                written: 0,
                write_task: None,
                read_task: None,
                incoming: VecDeque::new(),
                incoming_waker: None,
                incoming_gone: false,
                last_id: 0,
                closing: false,
                ended: false,
                peer_fc: false,
                initial_window: DEFAULT_WINDOW,
                session_window: DEFAULT_WINDOW,
                session_unacked: 0,
            }),
            log,
            ended: watch::Sender::new(false),
            force: Notify::new(),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain counters and queues: still usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stops new streams and writes; the write loop drains the queue and closes. With
    /// `goaway`, our GOAWAY (with that status) is queued first.
    pub(crate) fn begin_close(&self, goaway: Option<u32>) {
        let mut st = self.lock();
        if st.closing || st.ended {
            return;
        }
        st.closing = true;
        if let Some(status) = goaway {
            let last_good_id = st.last_id;
            st.push_plain(&Frame::GoAway {
                last_good_id,
                status,
            });
        }
        wake(&mut st.write_task);
        wake(&mut st.incoming_waker);
        st.wake_writers();
    }

    /// Marks the session ended and wakes every handle.
    fn finish(&self) {
        let mut st = self.lock();
        st.ended = true;
        st.closing = true;
        st.out.clear();
        st.out_bytes = 0;
        for s in st.streams.values_mut() {
            wake(&mut s.reader);
            wake(&mut s.writer);
            wake(&mut s.drain);
        }
        wake(&mut st.incoming_waker);
        wake(&mut st.write_task);
        wake(&mut st.read_task);
        drop(st);
        self.ended.send_replace(true);
    }

    /// Resolves once the connection has ended.
    pub(crate) async fn ended(&self) {
        let mut rx = self.ended.subscribe();
        // An error means the sender is gone, which cannot outlive `self`: ended either way.
        let _ = rx.wait_for(|ended| *ended).await;
    }

    /// Drops the connection without waiting for the queue (after `close`'s grace).
    pub(crate) fn force_end(&self) {
        self.force.notify_one();
    }
}

fn wake(w: &mut Option<Waker>) {
    if let Some(w) = w.take() {
        w.wake();
    }
}

fn broken(msg: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, msg)
}

impl State {
    fn push(&mut self, frame: Bytes) {
        self.out_bytes += frame.len();
        self.out.push_back(frame);
        self.pushed += 1;
        wake(&mut self.write_task);
    }

    /// Queues a frame without a header block (these cannot fail to encode but for ids out of
    /// range, which the session never produces; such a frame is dropped).
    fn push_plain(&mut self, f: &Frame) {
        if let Ok(bytes) = frame::plain_bytes(f) {
            self.push(bytes);
        }
    }

    fn wake_writers(&mut self) {
        for s in self.streams.values_mut() {
            wake(&mut s.writer);
        }
    }

    /// Counts `n` bytes of stream `id` as consumed, crediting the client once it uses flow
    /// control.
    fn credit(&mut self, id: u32, n: usize) {
        let half = (DEFAULT_WINDOW / 2) as u64;
        let mut frames = Vec::new();
        if let Some(s) = self.streams.get_mut(&id) {
            s.unacked = s.unacked.saturating_add(n as u64);
            if self.peer_fc && s.unacked >= half && !s.remote_fin && !s.reset {
                frames.push((id, s.unacked));
                s.unacked = 0;
            }
        }
        self.session_unacked = self.session_unacked.saturating_add(n as u64);
        if self.peer_fc && self.session_unacked >= half {
            frames.push((0, self.session_unacked));
            self.session_unacked = 0;
        }
        if self.closing || self.ended {
            return;
        }
        for (stream_id, delta) in frames {
            let delta = delta.min(0x7fff_ffff) as u32;
            self.push_plain(&Frame::WindowUpdate { stream_id, delta });
        }
    }

    fn maybe_remove(&mut self, id: u32) {
        if self
            .streams
            .get(&id)
            .is_some_and(|s| s.reader_gone && s.writer_gone)
        {
            self.streams.remove(&id);
        }
    }

    /// The stream's reader is gone: what it buffered, and what comes later, is discarded.
    pub(crate) fn release_reader(&mut self, id: u32) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        s.reader_gone = true;
        let discarded: usize = s.recv.drain(..).map(|b| b.len()).sum();
        s.recv_cost = 0;
        wake(&mut s.drain);
        self.credit(id, discarded);
        self.maybe_remove(id);
    }

    /// The stream's writer is gone: FIN unless already finished.
    pub(crate) fn release_writer(&mut self, id: u32) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        s.writer_gone = true;
        let fin = !s.local_fin && !s.reset && !self.ended;
        s.local_fin = true;
        if fin {
            self.push_fin(id);
        }
        self.maybe_remove(id);
    }

    fn push_fin(&mut self, id: u32) {
        // Ids come from accepted SYN_STREAMs (31-bit, non-zero): encoding cannot fail.
        if let Ok(f) = frame::data_frame(id, true, &[]) {
            self.push(f);
            let seq = self.pushed;
            if let Some(s) = self.streams.get_mut(&id) {
                s.last_seq = seq;
            }
        }
    }

    /// What stream `id` holds buffered (payload plus per-frame cost).
    #[cfg(test)]
    pub(crate) fn stream_buffered(&self, id: u32) -> usize {
        self.streams.get(&id).map_or(0, |s| s.recv_cost)
    }

    /// What is queued for the socket or being written.
    #[cfg(test)]
    pub(crate) fn queued_bytes(&self) -> usize {
        self.out_bytes
    }

    /// The next stream the client opened, if any.
    pub(crate) fn poll_incoming(&mut self, waker: &Waker) -> Poll<Option<(u32, Headers)>> {
        if let Some(next) = self.incoming.pop_front() {
            return Poll::Ready(Some(next));
        }
        if self.closing || self.ended {
            return Poll::Ready(None);
        }
        self.incoming_waker = Some(waker.clone());
        Poll::Pending
    }

    /// `Incoming` is gone: streams not taken yet are finished, later ones too.
    pub(crate) fn release_incoming(&mut self) {
        self.incoming_gone = true;
        let pending: Vec<u32> = self.incoming.drain(..).map(|(id, _)| id).collect();
        for id in pending {
            self.release_reader(id);
            self.release_writer(id);
        }
    }

    /// A reader's read.
    pub(crate) fn poll_read(
        &mut self,
        id: u32,
        waker: &Waker,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let ended = self.ended;
        let Some(s) = self.streams.get_mut(&id) else {
            return Poll::Ready(Ok(()));
        };
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        if let Some(front) = s.recv.front_mut() {
            let n = front.len().min(buf.remaining());
            buf.put_slice(&front.split_to(n));
            s.recv_cost -= n;
            if front.is_empty() {
                s.recv.pop_front();
                s.recv_cost -= FRAME_COST;
            }
            if s.recv_cost < RECV_LIMIT {
                wake(&mut s.drain);
            }
            self.credit(id, n);
            return Poll::Ready(Ok(()));
        }
        if s.remote_fin {
            return Poll::Ready(Ok(()));
        }
        if s.reset {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "stream reset by the client",
            )));
        }
        if ended {
            return Poll::Ready(Ok(()));
        }
        s.reader = Some(waker.clone());
        Poll::Pending
    }

    /// A writer's write: at most one data frame, within the windows once enforced.
    pub(crate) fn poll_write(
        &mut self,
        id: u32,
        waker: &Waker,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.ended || self.closing {
            return Poll::Ready(Err(broken("session closed")));
        }
        let Some(s) = self.streams.get_mut(&id) else {
            return Poll::Ready(Err(broken("stream gone")));
        };
        if s.reset {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "stream reset by the client",
            )));
        }
        if s.local_fin {
            return Poll::Ready(Err(broken("stream already finished")));
        }
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        if self.out_bytes >= OUT_SOFT_LIMIT {
            s.writer = Some(waker.clone());
            return Poll::Pending;
        }
        let mut n = buf.len().min(MAX_DATA_FRAME);
        if self.peer_fc {
            let room = s.window.min(self.session_window);
            if room <= 0 {
                s.writer = Some(waker.clone());
                return Poll::Pending;
            }
            n = n.min(room as usize);
        }
        let frame = match frame::data_frame(id, false, &buf[..n]) {
            Ok(f) => f,
            Err(e) => return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidInput, e))),
        };
        s.window -= n as i64;
        self.session_window -= n as i64;
        self.push(frame);
        let seq = self.pushed;
        if let Some(s) = self.streams.get_mut(&id) {
            s.last_seq = seq;
        }
        Poll::Ready(Ok(n))
    }

    /// A writer's flush: until its frames are written to the socket.
    pub(crate) fn poll_flush(&mut self, id: u32, waker: &Waker) -> Poll<io::Result<()>> {
        let (ended, written) = (self.ended, self.written);
        let Some(s) = self.streams.get_mut(&id) else {
            return Poll::Ready(Ok(()));
        };
        if s.last_seq <= written {
            return Poll::Ready(Ok(()));
        }
        if ended {
            return Poll::Ready(Err(broken("session ended before the data was sent")));
        }
        s.writer = Some(waker.clone());
        Poll::Pending
    }

    /// A writer's shutdown: FIN (once), then flush.
    pub(crate) fn poll_shutdown(&mut self, id: u32, waker: &Waker) -> Poll<io::Result<()>> {
        let ended = self.ended;
        let Some(s) = self.streams.get_mut(&id) else {
            return Poll::Ready(Ok(()));
        };
        if !s.local_fin {
            if ended {
                return Poll::Ready(Err(broken("session ended")));
            }
            s.local_fin = true;
            if !s.reset {
                self.push_fin(id);
            }
        }
        self.poll_flush(id, waker)
    }
}

/// Runs the session on `io` until it ends.
pub(crate) async fn run<T>(io: T, shared: Arc<Shared>)
where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (rd, wr) = tokio::io::split(io);
    let reader = read_loop(rd, &shared);
    let writer = write_loop(wr, &shared);
    tokio::pin!(reader, writer);
    tokio::select! {
        r = &mut reader => match r {
            Ok(()) => debug!(shared.log, "spdy: client closed the connection"),
            Err(SessionError::Protocol(e @ FrameError::Truncated(_))) => {
                debug!(shared.log, "spdy: client closed the connection inside a frame"; "error" => %e);
            }
            Err(SessionError::Protocol(e)) => {
                debug!(shared.log, "spdy: protocol error; going away"; "error" => %e);
                shared.begin_close(Some(GOAWAY_PROTOCOL_ERROR));
                tokio::select! {
                    _ = tokio::time::timeout(CLOSE_GRACE, &mut writer) => {}
                    _ = shared.force.notified() => {}
                }
            }
            Err(e) => debug!(shared.log, "spdy: connection read failed"; "error" => %e),
        },
        w = &mut writer => match w {
            Ok(()) => debug!(shared.log, "spdy: session closed"),
            Err(e) => debug!(shared.log, "spdy: connection write failed"; "error" => %e),
        },
        _ = shared.force.notified() => debug!(shared.log, "spdy: connection dropped after the close grace"),
    }
    shared.finish();
}

async fn write_loop<W: AsyncWrite + Unpin>(wr: W, shared: &Shared) -> io::Result<()> {
    // Small frames (replies, pings, FINs) coalesce; data frames are larger than the buffer
    // and go straight through.
    let mut wr = BufWriter::with_capacity(8 * 1024, wr);
    let mut batch: Vec<Bytes> = Vec::new();
    loop {
        let close = poll_fn(|cx| {
            let mut st = shared.lock();
            if st.ended {
                return Poll::Ready(Err(broken("session ended")));
            }
            let mut size = 0;
            while size < WRITE_BATCH {
                let Some(f) = st.out.pop_front() else { break };
                size += f.len();
                batch.push(f);
            }
            if !batch.is_empty() {
                return Poll::Ready(Ok(false));
            }
            if st.closing {
                return Poll::Ready(Ok(true));
            }
            st.write_task = Some(cx.waker().clone());
            Poll::Pending
        })
        .await?;
        if close {
            wr.flush().await?;
            wr.shutdown().await?;
            return Ok(());
        }
        let mut size = 0;
        let count = batch.len() as u64;
        for f in batch.drain(..) {
            size += f.len();
            wr.write_all(&f).await?;
        }
        wr.flush().await?;
        let mut st = shared.lock();
        st.out_bytes = st.out_bytes.saturating_sub(size);
        st.written += count;
        // Writers wait for room or for their flush: wake them all (there are few streams).
        st.wake_writers();
        if st.out_bytes <= OUT_HARD_LIMIT {
            wake(&mut st.read_task);
        }
    }
}

async fn read_loop<R: AsyncRead + Unpin>(mut rd: R, shared: &Shared) -> Result<(), SessionError> {
    let mut decoder = Decoder::new();
    let mut encoder = Encoder::new()?;
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    // Our pings' ids are even (the client's are odd).
    let mut ping_id = 0u32;
    loop {
        while let Some(frame) = decoder.decode(&mut buf)? {
            // Handling may wait (a full stream). Meanwhile the socket is still read, up to
            // READ_AHEAD, so that a client that hangs up is noticed (and `closed` resolves)
            // even while nobody reads that stream.
            // Past the read-ahead, a hang-up hides behind unread bytes: a PING now and then
            // makes a closed peer's TCP answer with a reset, which the socket then reports.
            let handling = handle(frame, shared, &mut encoder);
            let probe = tokio::time::sleep(PROBE_EVERY);
            tokio::pin!(handling, probe);
            loop {
                if buf.capacity() - buf.len() < 4096 && buf.len() < READ_AHEAD {
                    buf.reserve(READ_CHUNK);
                }
                // Biased: a frame handled at once (the usual case) polls nothing else.
                tokio::select! {
                    biased;
                    () = &mut handling => break,
                    n = rd.read_buf(&mut buf), if buf.len() < READ_AHEAD => {
                        if n? == 0 {
                            // What is not buffered for a reader yet is lost: the client is gone.
                            return Ok(());
                        }
                    }
                    () = &mut probe => {
                        ping_id = if ping_id >= 0x7fff_fffe { 2 } else { ping_id + 2 };
                        shared.lock().push_plain(&Frame::Ping { id: ping_id });
                        probe.as_mut().reset(tokio::time::Instant::now() + PROBE_EVERY);
                    }
                }
            }
        }
        // Answers the client is not reading pile up: stop reading until they drain.
        poll_fn(|cx| {
            let mut st = shared.lock();
            if st.out_bytes <= OUT_HARD_LIMIT || st.ended {
                Poll::Ready(())
            } else {
                st.read_task = Some(cx.waker().clone());
                Poll::Pending
            }
        })
        .await;
        if buf.capacity() - buf.len() < READ_CHUNK / 4 {
            buf.reserve(READ_CHUNK);
        }
        if rd.read_buf(&mut buf).await? == 0 {
            if buf.is_empty() {
                return Ok(());
            }
            return Err(FrameError::Truncated(buf.len()).into());
        }
    }
}

async fn handle(frame: Frame, shared: &Shared, encoder: &mut Encoder) {
    let log = &shared.log;
    match frame {
        Frame::Data {
            stream_id,
            fin,
            data,
        } => deliver(shared, stream_id, fin, data).await,
        Frame::Headers { stream_id, fin, .. } => {
            // Trailing headers carry nothing kubelet's protocols use; their FIN counts.
            if fin {
                deliver(shared, stream_id, true, Bytes::new()).await;
            }
        }
        Frame::SynStream {
            stream_id,
            flags,
            headers,
            ..
        } => open(shared, encoder, stream_id, flags, headers),
        Frame::SynReply { stream_id, .. } => {
            debug!(log, "spdy: SYN_REPLY from the client ignored (the server opens no streams)"; "stream" => stream_id);
        }
        Frame::RstStream { stream_id, status } => {
            debug!(log, "spdy: stream reset by the client"; "stream" => stream_id, "status" => status);
            let mut st = shared.lock();
            if let Some(s) = st.streams.get_mut(&stream_id) {
                s.reset = true;
                wake(&mut s.reader);
                wake(&mut s.writer);
                wake(&mut s.drain);
            }
        }
        Frame::Settings { settings, .. } => {
            let mut st = shared.lock();
            for s in settings {
                if s.id == SETTINGS_INITIAL_WINDOW_SIZE {
                    let new = i64::from(s.value & 0x7fff_ffff);
                    let diff = new - st.initial_window;
                    st.initial_window = new;
                    for stream in st.streams.values_mut() {
                        stream.window += diff;
                    }
                    st.peer_fc = true;
                    st.wake_writers();
                }
            }
        }
        Frame::WindowUpdate { stream_id, delta } => {
            let mut st = shared.lock();
            st.peer_fc = true;
            if stream_id == 0 {
                st.session_window += i64::from(delta);
                st.wake_writers();
            } else if let Some(s) = st.streams.get_mut(&stream_id) {
                s.window += i64::from(delta);
                wake(&mut s.writer);
            }
        }
        Frame::Ping { id } => {
            // Odd ids are the client's; even ones would answer pings this server never sends.
            if id % 2 == 1 {
                let mut st = shared.lock();
                if !st.ended {
                    st.push_plain(&Frame::Ping { id });
                }
            }
        }
        Frame::GoAway {
            last_good_id,
            status,
        } => {
            debug!(log, "spdy: client going away"; "last_good_stream" => last_good_id, "status" => status);
            shared.begin_close(None);
        }
        Frame::Unknown { kind, len, .. } => {
            debug!(log, "spdy: unknown control frame skipped"; "type" => kind, "length" => len);
        }
    }
}

/// A SYN_STREAM: replied to and queued for `Incoming`, or refused.
fn open(shared: &Shared, encoder: &mut Encoder, id: u32, flags: u8, headers: Headers) {
    let log = &shared.log;
    let mut st = shared.lock();
    if st.closing || st.ended {
        debug!(log, "spdy: stream opened while going away; ignored"; "stream" => id);
        return;
    }
    if id.is_multiple_of(2) || id <= st.last_id {
        debug!(log, "spdy: stream id not odd and increasing; refused"; "stream" => id, "last" => st.last_id);
        st.push_plain(&Frame::RstStream {
            stream_id: id,
            status: RST_PROTOCOL_ERROR,
        });
        return;
    }
    st.last_id = id;
    if st.streams.len() >= MAX_STREAMS {
        debug!(log, "spdy: too many streams; refused"; "stream" => id);
        st.push_plain(&Frame::RstStream {
            stream_id: id,
            status: RST_REFUSED_STREAM,
        });
        return;
    }
    let mut reply = Vec::with_capacity(32);
    let replied = encoder.encode(
        &Frame::SynReply {
            stream_id: id,
            fin: false,
            headers: Vec::new(),
        },
        &mut reply,
    );
    if let Err(e) = replied {
        // An empty block on a valid id: not expected; the stream is refused instead.
        debug!(log, "spdy: reply not encoded; stream refused"; "stream" => id, "error" => %e);
        st.push_plain(&Frame::RstStream {
            stream_id: id,
            status: RST_REFUSED_STREAM,
        });
        return;
    }
    st.push(Bytes::from(reply));
    let window = st.initial_window;
    st.streams.insert(
        id,
        StreamState {
            remote_fin: flags & FLAG_FIN != 0,
            local_fin: flags & FLAG_UNIDIRECTIONAL != 0,
            window,
            ..StreamState::default()
        },
    );
    if st.incoming_gone {
        st.release_reader(id);
        st.release_writer(id);
    } else {
        st.incoming.push_back((id, headers));
        wake(&mut st.incoming_waker);
    }
}

/// A data frame (or a FIN) for stream `id`: buffered for its reader, waiting for room.
async fn deliver(shared: &Shared, id: u32, fin: bool, data: Bytes) {
    let data = if data.len() < COPY_BELOW {
        Bytes::copy_from_slice(&data)
    } else {
        data
    };
    let mut data = Some(data);
    poll_fn(|cx| {
        let mut guard = shared.lock();
        let st = &mut *guard;
        if st.ended {
            return Poll::Ready(());
        }
        let Some(s) = st.streams.get_mut(&id) else {
            debug!(shared.log, "spdy: data for a stream not open; dropped"; "stream" => id);
            return Poll::Ready(());
        };
        if s.remote_fin || s.reset {
            debug!(shared.log, "spdy: data after the stream's FIN or reset; dropped"; "stream" => id);
            return Poll::Ready(());
        }
        if s.reader_gone {
            s.remote_fin |= fin;
            let n = data.take().map_or(0, |d| d.len());
            st.credit(id, n);
            return Poll::Ready(());
        }
        if s.recv_cost >= RECV_LIMIT {
            s.drain = Some(cx.waker().clone());
            return Poll::Pending;
        }
        if let Some(d) = data.take().filter(|d| !d.is_empty()) {
            s.recv_cost += d.len() + FRAME_COST;
            s.recv.push_back(d);
        }
        s.remote_fin |= fin;
        wake(&mut s.reader);
        Poll::Ready(())
    })
    .await
}
