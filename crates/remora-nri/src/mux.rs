//! NRI's connection multiplexer, runtime side: many virtual connections over one socket.
//!
//! An NRI plugin and the runtime talk over a single Unix socket, the *trunk*, which carries
//! two ttrpc connections in opposite directions: on [`PLUGIN_SERVICE_CONN`] the runtime is the
//! ttrpc client of the plugin, on [`RUNTIME_SERVICE_CONN`] it serves ttrpc to the plugin.
//! Every frame on the trunk is
//!
//! ```text
//! +----------------+----------------+---------------------+
//! | conn id: u32be | length: u32be  | payload (length B)  |
//! +----------------+----------------+---------------------+
//! ```
//!
//! with connection id 0 reserved and the payload at most one ttrpc message
//! ([`MAX_PAYLOAD`]). Opening a connection is local: nothing is sent, each side assumes the
//! other opens the same id. [`Conn`] is a tokio `AsyncRead + AsyncWrite` that ttrpc's
//! `Socket::new` can wrap.
//!
//! # Design
//!
//! One reader task reads frames off the trunk and queues each payload on its connection's
//! slot; one writer task drains a shared queue of whole frames into the trunk, so frames of
//! different connections never interleave mid-frame. Both tasks and every [`Conn`] share a
//! [`std::sync::Mutex`]ed state held only for short, non-awaiting sections; wakers in that
//! state carry the hand-offs. Closing records a reason once, wakes every waiter and tells both
//! tasks to stop; they drop their halves of the trunk, which closes it.
//!
//! Each `poll_write` of up to [`MAX_PAYLOAD`] bytes becomes exactly one frame, larger ones are
//! cut at [`MAX_PAYLOAD`]. The boundaries matter for interoperation: containerd's Go ttrpc
//! reads a connection through a 4 KiB `bufio.Reader`, and NRI's Go mux fails a read whose
//! buffer is smaller than the next frame. ttrpc-rust writes the message header with the first
//! page of the payload, then the rest, so frames it produces through a `Conn` fit the reads the
//! Go side makes. Coalescing writes here would break that.
//!
//! # Bounds against a hostile peer
//!
//! - A frame's length is checked against [`MAX_PAYLOAD`] before anything is allocated for it.
//! - A connection queues at most [`READ_QUEUE_FRAMES`] unread frames (NRI's figure) and
//!   [`READ_QUEUE_BYTES`] unread bytes (remora's: NRI's frame count alone allows a GiB); one
//!   more closes the trunk, as NRI's Go mux does for the frame count.
//! - Data for an id nobody opened yet is queued for it (the peer may write before we open),
//!   for at most [`MAX_UNOPENED_CONNS`] such ids; data for a further id closes the trunk.
//! - Data for a connection whose [`Conn`] was dropped is discarded.
//!
//! So inbound memory is at most (opened ids + [`MAX_UNOPENED_CONNS`]) times
//! [`READ_QUEUE_BYTES`] plus a frame, and the one frame being read: about 120 MiB a plugin. Outbound, writers wait once
//! [`WRITE_QUEUE_BYTES`] are queued for the trunk, so that side holds at most
//! [`WRITE_QUEUE_BYTES`] plus one frame.
//!
//! Every wait ends when the trunk closes: reads return what was already queued and then EOF
//! (the peer hung up, or [`Mux::close`]) or an error (a protocol or I/O failure, whose queued
//! data is dropped); writes and flushes fail with [`io::ErrorKind::BrokenPipe`].
//!
//! Differences from NRI's Go mux (v0.12.2): it allocates a frame from its claimed length
//! unchecked, silently drops frames for id 0 and for ids not opened yet (here id 0 closes the
//! trunk and the others are queued, bounded), and passes empty frames on as empty reads (here
//! they are dropped: to an `AsyncRead` reader an empty read means EOF).

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use slog::{debug, o, warn, Logger};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::{watch, Notify};

#[cfg(test)]
mod tests;

/// A virtual connection's id on the trunk. 0 is reserved.
pub type ConnId = u32;

/// The connection on which the runtime is the ttrpc client of the plugin's service.
pub const PLUGIN_SERVICE_CONN: ConnId = 1;

/// The connection on which the runtime serves ttrpc (its runtime service) to the plugin.
pub const RUNTIME_SERVICE_CONN: ConnId = 2;

/// The reserved connection id: a frame for it is a protocol error.
const RESERVED_CONN: ConnId = 0;

/// Frame header: connection id and payload length, both u32 big-endian.
const HEADER_LEN: usize = 8;

/// The largest payload of a frame, as a u32 to compare with the wire's length field.
const MAX_PAYLOAD_U32: u32 = 4 * 1024 * 1024 + 10;

/// The largest payload of a frame: one ttrpc message, a 10-byte header and at most 4 MiB.
pub const MAX_PAYLOAD: usize = MAX_PAYLOAD_U32 as usize;

/// Unread frames a connection may queue; one more closes the trunk (NRI's figure).
pub const READ_QUEUE_FRAMES: usize = 256;

/// Unread bytes a connection may queue; a frame past them closes the trunk. NRI bounds frames
/// only (256 of 4 MiB each, a GiB); four whole messages is more than a ttrpc peer waiting for
/// answers ever has in flight.
pub const READ_QUEUE_BYTES: usize = 4 * MAX_PAYLOAD;

/// Ids not opened yet that may have data queued at once; data for one more closes the trunk.
/// NRI uses two ids in all, so a peer that needs more is not speaking NRI.
pub const MAX_UNOPENED_CONNS: usize = 4;

/// Bytes queued for the trunk past which writers wait for the writer task.
pub const WRITE_QUEUE_BYTES: usize = 2 * (HEADER_LEN + MAX_PAYLOAD);

/// Why [`Mux::open`] failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Connection id 0 is reserved.
    #[error("connection id 0 is reserved")]
    Reserved,
    /// The id was opened before on this mux (ids are not reused, even once their [`Conn`] is
    /// dropped: data that arrived in between would go to the wrong reader).
    #[error("connection {0} was already opened")]
    AlreadyOpened(ConnId),
    /// The trunk is closed.
    #[error("the trunk is closed")]
    Closed,
}

/// A failure that closed the trunk.
#[derive(Debug, thiserror::Error)]
pub enum TrunkError {
    /// A frame claimed a payload larger than [`MAX_PAYLOAD`].
    #[error("a frame for connection {conn} claims {len} bytes, more than the {MAX_PAYLOAD} a frame may carry")]
    FrameTooLarge {
        /// The frame's connection id.
        conn: ConnId,
        /// The length it claimed.
        len: u32,
    },
    /// A frame for the reserved connection id 0.
    #[error("a frame for the reserved connection id 0")]
    ReservedConn,
    /// A connection had [`READ_QUEUE_FRAMES`] frames unread when another arrived.
    #[error("connection {conn} has {READ_QUEUE_FRAMES} frames unread and another arrived")]
    QueueOverflow {
        /// The connection whose queue overflowed.
        conn: ConnId,
    },
    /// A connection had more than [`READ_QUEUE_BYTES`] bytes unread.
    #[error("connection {conn} has {queued} bytes unread, more than {READ_QUEUE_BYTES}")]
    QueueBytesOverflow {
        /// The connection whose queue overflowed.
        conn: ConnId,
        /// The bytes it would have queued with the frame that arrived.
        queued: usize,
    },
    /// Data for more than [`MAX_UNOPENED_CONNS`] ids nobody opened.
    #[error("data for connection {conn}, while {MAX_UNOPENED_CONNS} ids nobody opened already have data queued")]
    TooManyUnopened {
        /// The id that would have been one too many.
        conn: ConnId,
    },
    /// The trunk ended in the middle of a frame.
    #[error("the trunk ended in the middle of a frame")]
    Truncated,
    /// Reading the trunk failed.
    #[error("reading the trunk")]
    Read(#[source] io::Error),
    /// Writing the trunk failed.
    #[error("writing the trunk")]
    Write(#[source] io::Error),
}

/// Why the trunk closed.
#[derive(Debug, Clone)]
pub enum CloseReason {
    /// The peer closed its end: the trunk reached EOF between frames.
    PeerClosed,
    /// [`Mux::close`] was called or the [`Mux`] dropped.
    Local,
    /// A protocol or I/O failure; the mux has logged it.
    Failed(Arc<TrunkError>),
}

/// The runtime's end of an NRI trunk; owns it. Dropping the `Mux` closes the trunk.
pub struct Mux {
    shared: Arc<Shared>,
}

/// One virtual connection on a [`Mux`]'s trunk.
///
/// Reads return the peer's payloads in order, possibly in pieces. Writes are framed; one write
/// of at most [`MAX_PAYLOAD`] bytes is one frame. `poll_flush` is ready once everything written
/// so far is queued for the trunk (see its comment). `poll_shutdown` waits until it is on the
/// trunk and refuses further writes; it sends
/// nothing (NRI's protocol has no half-close). Dropping a `Conn` discards data arriving for it
/// afterwards; frames it already wrote still go out.
pub struct Conn {
    id: ConnId,
    shared: Arc<Shared>,
    /// The write sequence number of this connection's last queued frame.
    last_seq: u64,
    /// `poll_shutdown` was called.
    write_shut: bool,
}

struct Shared {
    state: Mutex<State>,
    /// Wakes the writer task: frames were queued or the trunk closed.
    writer: Notify,
    /// The close reason once closed, for async waiters; `state.closed` is the authority.
    closed_tx: watch::Sender<Option<CloseReason>>,
    log: Logger,
}

struct State {
    slots: HashMap<ConnId, Slot>,
    /// Slots with kind [`SlotKind::Unopened`].
    unopened: usize,
    closed: Option<CloseReason>,
    /// Whole frames, header included, for the writer task.
    writes: VecDeque<Vec<u8>>,
    /// Bytes in `writes` plus those the writer task is writing.
    write_bytes: usize,
    /// Frames ever queued for the trunk; the last one's sequence number.
    queued_seq: u64,
    /// Sequence number up to which frames are written to the trunk and flushed.
    written_seq: u64,
}

#[derive(PartialEq, Eq)]
enum SlotKind {
    /// Data arrived before anyone opened the id.
    Unopened,
    /// A [`Conn`] holds it.
    Open,
    /// Its [`Conn`] was dropped: data for it is discarded.
    Retired,
}

struct Slot {
    kind: SlotKind,
    /// Unread payloads, none of them empty.
    frames: VecDeque<Vec<u8>>,
    /// Bytes in `frames`, the front one's already read ones included.
    queued_bytes: usize,
    /// Bytes of `frames.front()` already read.
    offset: usize,
    read_waker: Option<Waker>,
    /// Waits for room in the write queue, or for a flush.
    write_waker: Option<Waker>,
}

impl Slot {
    fn new(kind: SlotKind) -> Self {
        Slot {
            kind,
            frames: VecDeque::new(),
            queued_bytes: 0,
            offset: 0,
            read_waker: None,
            write_waker: None,
        }
    }
}

impl Mux {
    /// Starts multiplexing `trunk`, with a reader and a writer task on the current tokio
    /// runtime. `log` gets the trunk's close, once; `None` logs nothing.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime (`tokio::spawn`'s requirement).
    pub fn new<T>(trunk: T, log: Option<Logger>) -> Mux
    where
        T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let (closed_tx, _) = watch::channel(None);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                slots: HashMap::new(),
                unopened: 0,
                closed: None,
                writes: VecDeque::new(),
                write_bytes: 0,
                queued_seq: 0,
                written_seq: 0,
            }),
            writer: Notify::new(),
            closed_tx,
            log: log.unwrap_or_else(|| Logger::root(slog::Discard, o!())),
        });
        let (rd, wr) = tokio::io::split(trunk);
        tokio::spawn(read_trunk(shared.clone(), rd));
        tokio::spawn(write_trunk(shared.clone(), wr));
        Mux { shared }
    }

    /// The virtual connection `id`, with whatever the peer already sent on it. Sends nothing.
    pub fn open(&self, id: ConnId) -> Result<Conn, OpenError> {
        if id == RESERVED_CONN {
            return Err(OpenError::Reserved);
        }
        let mut st = self.shared.state();
        if st.closed.is_some() {
            return Err(OpenError::Closed);
        }
        let State {
            slots, unopened, ..
        } = &mut *st;
        match slots.entry(id) {
            Entry::Vacant(e) => {
                e.insert(Slot::new(SlotKind::Open));
            }
            Entry::Occupied(mut e) => {
                let slot = e.get_mut();
                if slot.kind != SlotKind::Unopened {
                    return Err(OpenError::AlreadyOpened(id));
                }
                slot.kind = SlotKind::Open;
                *unopened -= 1;
            }
        }
        Ok(Conn {
            id,
            shared: self.shared.clone(),
            last_seq: 0,
            write_shut: false,
        })
    }

    /// Closes the trunk: queued reads still return their data, then EOF; writes fail.
    pub fn close(&self) {
        self.shared.close(CloseReason::Local);
    }

    /// Why the trunk closed, if it has.
    pub fn close_reason(&self) -> Option<CloseReason> {
        self.shared.state().closed.clone()
    }

    /// Resolves once the trunk is closed, with the reason. Holds no borrow of the `Mux`, so it
    /// can be spawned; if the `Mux` is dropped first it resolves with [`CloseReason::Local`].
    pub fn closed(&self) -> impl Future<Output = CloseReason> + Send + 'static {
        let mut rx = self.shared.closed_tx.subscribe();
        async move {
            match rx.wait_for(Option::is_some).await {
                Ok(reason) => reason.clone().unwrap_or(CloseReason::Local),
                // The sender lives in `Shared`, gone only once the Mux, every Conn and both
                // tasks are; the Mux's drop closed the trunk before that.
                Err(_) => CloseReason::Local,
            }
        }
    }
}

impl Drop for Mux {
    fn drop(&mut self) {
        self.shared.close(CloseReason::Local);
    }
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        // No section under this lock panics on input; should one panic anyway, its state is
        // still consistent enough to close and report.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records `reason` unless already closed, wakes every waiter and stops both tasks.
    fn close(&self, reason: CloseReason) {
        let wakers: Vec<Waker> = {
            let mut st = self.state();
            if st.closed.is_some() {
                return;
            }
            st.closed = Some(reason.clone());
            st.writes.clear();
            let failed = matches!(reason, CloseReason::Failed(_));
            st.slots
                .values_mut()
                .flat_map(|slot| {
                    if failed {
                        slot.frames.clear();
                        slot.queued_bytes = 0;
                        slot.offset = 0;
                    }
                    [slot.read_waker.take(), slot.write_waker.take()]
                })
                .flatten()
                .collect()
        };
        match &reason {
            CloseReason::Failed(e) => {
                warn!(self.log, "NRI trunk closed"; "error" => %ErrorChain(e))
            }
            CloseReason::PeerClosed => debug!(self.log, "NRI trunk closed by the plugin"),
            CloseReason::Local => debug!(self.log, "NRI trunk closed"),
        }
        self.closed_tx.send_replace(Some(reason));
        self.writer.notify_one();
        wakers.into_iter().for_each(Waker::wake);
    }

    async fn wait_closed(&self) {
        let mut rx = self.closed_tx.subscribe();
        // Err only if the sender is gone, and `self` holds it.
        let _ = rx.wait_for(Option::is_some).await;
    }

    /// Queues a payload from the trunk for its connection.
    fn deliver(&self, conn: ConnId, payload: Vec<u8>) -> Result<(), TrunkError> {
        let waker = {
            let mut st = self.state();
            // Closed while this frame was read: a failure dropped the queues for good.
            if st.closed.is_some() {
                return Ok(());
            }
            let State {
                slots, unopened, ..
            } = &mut *st;
            let slot = match slots.entry(conn) {
                Entry::Occupied(e) => e.into_mut(),
                Entry::Vacant(e) => {
                    if *unopened >= MAX_UNOPENED_CONNS {
                        return Err(TrunkError::TooManyUnopened { conn });
                    }
                    *unopened += 1;
                    e.insert(Slot::new(SlotKind::Unopened))
                }
            };
            if slot.kind == SlotKind::Retired {
                return Ok(());
            }
            if slot.frames.len() >= READ_QUEUE_FRAMES {
                return Err(TrunkError::QueueOverflow { conn });
            }
            let queued = slot.queued_bytes + payload.len();
            if queued > READ_QUEUE_BYTES {
                return Err(TrunkError::QueueBytesOverflow { conn, queued });
            }
            slot.queued_bytes = queued;
            slot.frames.push_back(payload);
            slot.read_waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
        Ok(())
    }
}

/// The reader task: frames from the trunk to the connections' queues, until either closes.
async fn read_trunk<R: AsyncRead + Unpin>(shared: Arc<Shared>, mut rd: R) {
    tokio::select! {
        reason = read_frames(&shared, &mut rd) => shared.close(reason),
        () = shared.wait_closed() => {}
    }
}

async fn read_frames<R: AsyncRead + Unpin>(shared: &Shared, rd: &mut R) -> CloseReason {
    let failed = |e| CloseReason::Failed(Arc::new(e));
    loop {
        let mut header = [0u8; HEADER_LEN];
        let mut got = 0;
        while got < HEADER_LEN {
            match rd.read(&mut header[got..]).await {
                Ok(0) if got == 0 => return CloseReason::PeerClosed,
                Ok(0) => return failed(TrunkError::Truncated),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return failed(TrunkError::Read(e)),
            }
        }
        let [c0, c1, c2, c3, l0, l1, l2, l3] = header;
        let conn = ConnId::from_be_bytes([c0, c1, c2, c3]);
        let len = u32::from_be_bytes([l0, l1, l2, l3]);
        if conn == RESERVED_CONN {
            return failed(TrunkError::ReservedConn);
        }
        if len > MAX_PAYLOAD_U32 {
            return failed(TrunkError::FrameTooLarge { conn, len });
        }
        // len <= MAX_PAYLOAD, which fits any usize tokio runs on.
        let mut payload = vec![0u8; len as usize];
        match rd.read_exact(&mut payload).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return failed(TrunkError::Truncated)
            }
            Err(e) => return failed(TrunkError::Read(e)),
        }
        // An empty payload carries nothing, and an empty read would be EOF to the reader.
        if payload.is_empty() {
            continue;
        }
        if let Err(e) = shared.deliver(conn, payload) {
            return failed(e);
        }
    }
}

/// The writer task: queued frames to the trunk, until it fails or the mux closes.
async fn write_trunk<W: AsyncWrite + Unpin>(shared: Arc<Shared>, mut wr: W) {
    tokio::select! {
        res = write_frames(&shared, &mut wr) => {
            if let Err(e) = res {
                shared.close(CloseReason::Failed(Arc::new(TrunkError::Write(e))));
            }
        }
        () = shared.wait_closed() => {}
    }
}

/// Returns `Ok` once the mux is closed.
async fn write_frames<W: AsyncWrite + Unpin>(shared: &Shared, wr: &mut W) -> io::Result<()> {
    loop {
        let (batch, seq) = loop {
            {
                let mut st = shared.state();
                if st.closed.is_some() {
                    return Ok(());
                }
                if !st.writes.is_empty() {
                    break (st.writes.drain(..).collect::<Vec<_>>(), st.queued_seq);
                }
            }
            // `notify_one` stores a permit when nobody waits, so a frame queued between the
            // check above and this await is not missed.
            shared.writer.notified().await;
        };
        let mut bytes = 0;
        for frame in &batch {
            wr.write_all(frame).await?;
            bytes += frame.len();
        }
        wr.flush().await?;
        let wakers: Vec<Waker> = {
            let mut st = shared.state();
            st.write_bytes = st.write_bytes.saturating_sub(bytes);
            st.written_seq = seq;
            st.slots
                .values_mut()
                .filter_map(|slot| slot.write_waker.take())
                .collect()
        };
        wakers.into_iter().for_each(Waker::wake);
    }
}

fn broken_pipe(reason: Option<&CloseReason>) -> io::Error {
    match reason {
        Some(CloseReason::Failed(e)) => io::Error::new(io::ErrorKind::BrokenPipe, e.clone()),
        _ => io::Error::new(io::ErrorKind::BrokenPipe, "the NRI trunk is closed"),
    }
}

fn not_connected() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "NRI connection slot missing")
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let mut st = this.shared.state();
        let State { slots, closed, .. } = &mut *st;
        // A Conn's slot stays in the map as long as the Conn; an error rather than a panic
        // should that ever change.
        let Some(slot) = slots.get_mut(&this.id) else {
            return Poll::Ready(Err(not_connected()));
        };
        if let Some(front) = slot.frames.front() {
            let rest = &front[slot.offset..];
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            slot.offset += n;
            if slot.offset == front.len() {
                slot.queued_bytes -= front.len();
                slot.frames.pop_front();
                slot.offset = 0;
            }
            return Poll::Ready(Ok(()));
        }
        match closed {
            None => {
                slot.read_waker = Some(cx.waker().clone());
                Poll::Pending
            }
            Some(CloseReason::Failed(e)) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                e.clone(),
            ))),
            Some(_) => Poll::Ready(Ok(())),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.write_shut {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "NRI connection shut down for writing",
            )));
        }
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let mut st = this.shared.state();
        if st.closed.is_some() {
            return Poll::Ready(Err(broken_pipe(st.closed.as_ref())));
        }
        if st.write_bytes >= WRITE_QUEUE_BYTES {
            let Some(slot) = st.slots.get_mut(&this.id) else {
                return Poll::Ready(Err(not_connected()));
            };
            slot.write_waker = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let n = buf.len().min(MAX_PAYLOAD);
        let mut frame = Vec::with_capacity(HEADER_LEN + n);
        frame.extend_from_slice(&this.id.to_be_bytes());
        // n <= MAX_PAYLOAD, which fits a u32.
        frame.extend_from_slice(&(n as u32).to_be_bytes());
        frame.extend_from_slice(&buf[..n]);
        st.write_bytes += frame.len();
        st.writes.push_back(frame);
        st.queued_seq += 1;
        this.last_seq = st.queued_seq;
        drop(st);
        this.shared.writer.notify_one();
        Poll::Ready(Ok(n))
    }

    /// Ready once what was written is queued for the trunk (as a socket's flush is once the
    /// kernel has it), not once the writer task wrote it: ttrpc's client abandons a write
    /// whose flush is still pending when the request's answer arrives, and closes the whole
    /// connection for it — and a plugin can answer before the writer task has marked the
    /// frame written. The queue is bounded by `poll_write`; `poll_shutdown` waits for the
    /// trunk.
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let st = self.shared.state();
        match &st.closed {
            Some(_) if st.written_seq < self.last_seq => {
                Poll::Ready(Err(broken_pipe(st.closed.as_ref())))
            }
            _ => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let flushed = std::task::ready!(self.as_mut().poll_written(cx));
        self.write_shut = true;
        Poll::Ready(flushed)
    }
}

impl Conn {
    /// Waits until everything written so far is on the trunk.
    fn poll_written(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let mut st = this.shared.state();
        if st.written_seq >= this.last_seq {
            return Poll::Ready(Ok(()));
        }
        if st.closed.is_some() {
            return Poll::Ready(Err(broken_pipe(st.closed.as_ref())));
        }
        let Some(slot) = st.slots.get_mut(&this.id) else {
            return Poll::Ready(Err(not_connected()));
        };
        slot.write_waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        let mut st = self.shared.state();
        if let Some(slot) = st.slots.get_mut(&self.id) {
            slot.kind = SlotKind::Retired;
            slot.frames.clear();
            slot.queued_bytes = 0;
            slot.offset = 0;
            slot.read_waker = None;
            slot.write_waker = None;
        }
    }
}

/// An error with its sources, `: `-separated, for the log.
struct ErrorChain<'a>(&'a TrunkError);

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = std::error::Error::source(self.0);
        while let Some(e) = source {
            write!(f, ": {e}")?;
            source = e.source();
        }
        Ok(())
    }
}
