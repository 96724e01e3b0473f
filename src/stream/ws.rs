//! WebSocket for the streaming server: kubelet's channel protocols and the SPDY tunnel.
//!
//! The HTTP side (`server.rs`) answers the upgrade with 101 itself ([`accept_key`] gives its
//! `Sec-WebSocket-Accept`) and hands the upgraded io here, where tungstenite speaks WebSocket
//! over it without a handshake of its own.
//!
//! # Channels ([`channels`])
//!
//! kubelet's `wsstream.Conn`: every message carries one channel's data, prefixed by the
//! channel number — a byte for binary framing, an ASCII digit (`'0' + n`) followed by the data
//! in standard base64 for the `base64.*` protocols (sent as text messages; received either
//! way, as kubelet accepts both). As in kubelet, empty messages and frames for unknown
//! channels, for channels the session does not read, or with bad base64 are dropped; with the
//! v5 close signal (`[255, n]`, only for `v5.channel.k8s.io`) the client ends channel `n`,
//! and a malformed one (wrong length, unknown channel) is a protocol error that ends the
//! connection.
//!
//! One task owns the WebSocket. Writers queue whole messages on one bounded queue (so frames
//! leave in the order they were written, and a close queued after them leaves last); each
//! write sends one message of at most [`MAX_CHUNK`] bytes of data, and a write of nothing
//! sends a message of just the channel prefix — kubelet's "ready" signal. Shutting a writer
//! down sends nothing (the protocol has no frame for it). Each reader has its own bounded
//! queue of messages; when one is full the task stops reading the socket until the reader
//! catches up (as kubelet's pipes do), and keeps sending meanwhile. A reader ends (EOF) at the
//! channel's close signal or when the connection ends. A reader's queue is bounded in messages
//! ([`READ_QUEUE`]) and in bytes ([`READ_BYTES`]); a message of more than [`MAX_MESSAGE`] is
//! refused with a close (1009) before it is buffered. Pings are answered by tungstenite as
//! the task reads; a close from the client is answered and ends the connection; a close from
//! us ([`ChannelConn::close`]) waits, for a while, for the client's answer.
//!
//! # Tunnel ([`Tunnel`])
//!
//! `SPDY/3.1+portforward.k8s.io` (client-go's `TunnelingConnection`): a plain byte stream in
//! binary messages, with no prefix byte: each write is one message, reads concatenate the
//! messages' payloads. It is driven by whoever polls it (the SPDY session), without a task.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use bytes::{Buf, Bytes};
use futures_util::{Sink, SinkExt, Stream, StreamExt};
use slog::{debug, Logger};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

use crate::io::{ClientRead, ClientWrite};

/// The most data one write sends in one message (client-go's own buffers are 32 KiB).
pub const MAX_CHUNK: usize = 32 * 1024;
/// The largest message accepted from a client; a larger one (or a frame announcing more) is
/// answered with a close (1009, message too big) before its payload is buffered. client-go
/// writes what its io.Copy reads, 32 KiB at a time.
pub(crate) const MAX_MESSAGE: usize = 1 << 20;
/// The largest frame of a message accepted from a client.
const MAX_FRAME: usize = MAX_MESSAGE;
/// Messages queued for one reader before the socket is no longer read...
const READ_QUEUE: usize = 8;
/// ...and bytes: a reader's queue holds at most this much payload (at least one message of
/// [`MAX_MESSAGE`] always fits an empty queue).
pub(crate) const READ_BYTES: usize = MAX_MESSAGE;
/// Messages queued for sending before writers wait.
const WRITE_QUEUE: usize = 16;
/// How long a close of ours waits for the client's answer.
const CLOSE_WAIT: Duration = Duration::from_secs(5);
/// v5's close signal: `[CLOSE_SIGNAL, channel]`.
const CLOSE_SIGNAL: u8 = 255;

/// How channel frames are encoded: `*.channel.k8s.io` / `portforward.k8s.io` binary frames, or
/// the `base64.*` text frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// Binary messages: one channel byte, then the data.
    Binary,
    /// Text messages: the channel as an ASCII digit, then the data in base64.
    Base64,
}

/// What one channel carries, seen from the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChannelKind {
    /// The client writes (stdin, resize); the server reads.
    Read,
    /// The server writes (stdout, stderr, error).
    Write,
    /// Both (port-forward data).
    ReadWrite,
    /// Not used by this session: frames from the client on it are dropped.
    Ignore,
}

/// One channel's ends, as asked in its [`ChannelKind`].
pub struct Channel {
    /// What the client sends on this channel (Read, ReadWrite); EOF at a v5 close signal for
    /// the channel, or when the WebSocket closes.
    pub reader: Option<ClientRead>,
    /// Frames to the client on this channel (Write, ReadWrite).
    pub writer: Option<ClientWrite>,
}

/// Options of one channel-multiplexed WebSocket connection.
#[derive(Debug, Clone)]
pub struct ChannelOptions {
    /// Frame encoding.
    pub framing: Framing,
    /// `v5.channel.k8s.io`: the client may send `[255, channel]` to close a channel it writes.
    pub close_signal: bool,
    /// One entry per channel, by channel number.
    pub channels: Vec<ChannelKind>,
}

/// What the connection task is asked to send.
enum Out {
    /// One message.
    Frame(Message),
    /// A normal close, after what was queued before it.
    Close,
}

/// A running channel-multiplexed WebSocket connection.
pub struct ChannelConn {
    out: mpsc::Sender<Out>,
    /// Its sender lives as long as the connection task: `changed()` fails once it is gone.
    done: watch::Receiver<()>,
}

impl ChannelConn {
    /// Resolves once the WebSocket has closed or broken.
    pub async fn closed(&self) {
        let mut done = self.done.clone();
        // Nothing is ever sent: this only returns once the task has dropped its sender.
        while done.changed().await.is_ok() {}
    }
    /// Sends a close frame (normal closure) after all queued frames, and ends the connection.
    pub async fn close(&self) {
        // If the task is gone the connection already ended.
        let _ = self.out.send(Out::Close).await;
        self.closed().await;
    }
}

/// The WebSocket settings of both protocols: messages up to [`MAX_MESSAGE`], and each message
/// written to the socket as soon as it is sent.
fn config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE))
        .max_frame_size(Some(MAX_FRAME))
        .write_buffer_size(0)
}

/// The io of a WebSocket, boxed so that [`Tunnel`] needs no type parameter.
trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}
type Ws = WebSocketStream<Box<dyn Io>>;

/// Runs the channel protocol over `io`, an upgraded connection after the server's 101 answer.
/// Returns one [`Channel`] per entry of `options.channels`, by channel number.
pub fn channels<T>(io: T, options: ChannelOptions, log: Logger) -> (ChannelConn, Vec<Channel>)
where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (out_tx, out_rx) = mpsc::channel(WRITE_QUEUE);
    let (done_tx, done_rx) = watch::channel(());
    let mut readers = Vec::with_capacity(options.channels.len());
    let mut ends = Vec::with_capacity(options.channels.len());
    for (n, kind) in options.channels.iter().enumerate() {
        let (read, write) = match kind {
            ChannelKind::Read => (true, false),
            ChannelKind::Write => (false, true),
            ChannelKind::ReadWrite => (true, true),
            ChannelKind::Ignore => (false, false),
        };
        let reader: Option<ClientRead> = if read {
            let (tx, rx) = mpsc::channel(READ_QUEUE);
            readers.push(Some(ReaderTx {
                tx,
                budget: Arc::new(Semaphore::new(READ_BYTES)),
            }));
            Some(Box::pin(ChannelReader {
                rx,
                current: Bytes::new(),
                permit: None,
            }))
        } else {
            readers.push(None);
            None
        };
        let writer: Option<ClientWrite> = write.then(|| {
            Box::pin(ChannelWriter {
                out: tokio_util::sync::PollSender::new(out_tx.clone()),
                // Channel numbers are one byte; past 255 they wrap around, as kubelet's do.
                channel: (n % 256) as u8,
                framing: options.framing,
                shut: false,
            }) as ClientWrite
        });
        ends.push(Channel { reader, writer });
    }
    let task = ConnTask {
        options,
        readers,
        log,
    };
    tokio::spawn(async move {
        let ws = WebSocketStream::from_raw_socket(
            Box::new(io) as Box<dyn Io>,
            Role::Server,
            Some(config()),
        )
        .await;
        task.run(ws, out_rx).await;
        drop(done_tx);
    });
    (
        ChannelConn {
            out: out_tx,
            done: done_rx,
        },
        ends,
    )
}

/// One chunk of a reader's queue and its share of the queue's byte budget.
type Chunk = (Bytes, OwnedSemaphorePermit);

/// The connection task's end of a reader's queue.
#[derive(Clone)]
struct ReaderTx {
    tx: mpsc::Sender<Chunk>,
    /// [`READ_BYTES`] permits, one per queued byte: released as the reader consumes them.
    budget: Arc<Semaphore>,
}

/// The permits `data` takes of a reader's budget (messages are at most [`MAX_MESSAGE`], so
/// this is their length).
fn cost(data: &Bytes) -> u32 {
    u32::try_from(data.len().min(READ_BYTES)).unwrap_or(u32::MAX)
}

impl ReaderTx {
    /// Queues `data` if both the queue and the budget have room; gives it back if not.
    fn try_deliver(&self, data: Bytes) -> Result<(), Option<Bytes>> {
        let Ok(permit) = self.budget.clone().try_acquire_many_owned(cost(&data)) else {
            return Err(Some(data));
        };
        match self.tx.try_send((data, permit)) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full((data, _))) => Err(Some(data)),
            // The session dropped this reader: it reads no more.
            Err(mpsc::error::TrySendError::Closed(_)) => Err(None),
        }
    }

    /// Queues `data` once there is room (dropped if the reader is gone).
    async fn deliver(&self, data: Bytes) {
        let Ok(permit) = self.budget.clone().acquire_many_owned(cost(&data)).await else {
            return;
        };
        if let Ok(slot) = self.tx.reserve().await {
            slot.send((data, permit));
        }
    }
}

/// The connection task's state.
struct ConnTask {
    options: ChannelOptions,
    /// By channel: where the client's data for it goes, while it is read.
    readers: Vec<Option<ReaderTx>>,
    log: Logger,
}

/// What the connection task waited for.
enum Event {
    Out(Option<Out>),
    In(Option<Result<Message, WsError>>),
    /// A held message was handed to its reader (or the reader is gone).
    Delivered,
}

/// What to do with one message from the client.
enum Route {
    Nothing,
    /// Data for a reader.
    Deliver(usize, Bytes),
    /// The client ended its side of a channel.
    CloseChannel(usize),
    /// A protocol error: the connection ends.
    Fail(&'static str),
}

impl ConnTask {
    async fn run(mut self, mut ws: Ws, mut out: mpsc::Receiver<Out>) {
        // A message the socket gave for a reader whose queue was full: the socket is not read
        // again until it is handed over.
        let mut held: Option<(ReaderTx, Bytes)> = None;
        let ending = loop {
            let event = tokio::select! {
                o = out.recv() => Event::Out(o),
                m = ws.next(), if held.is_none() => Event::In(m),
                _ = async {
                    if let Some((reader, data)) = &held {
                        reader.deliver(data.clone()).await;
                    }
                }, if held.is_some() => Event::Delivered,
            };
            match event {
                Event::Delivered => held = None,
                Event::Out(Some(Out::Frame(m))) => {
                    if let Err(e) = ws.send(m).await {
                        debug!(self.log, "WebSocket send failed"; "error" => %e);
                        break None;
                    }
                }
                // Closed on purpose, or everything that could write is gone.
                Event::Out(Some(Out::Close)) | Event::Out(None) => break Some(CloseCode::Normal),
                Event::In(None) => break None,
                // A frame or message over the limits: refused before its payload is read.
                Event::In(Some(Err(WsError::Capacity(e)))) => {
                    debug!(self.log, "WebSocket message too big; closing"; "error" => %e);
                    break Some(CloseCode::Size);
                }
                Event::In(Some(Err(e))) => {
                    debug!(self.log, "WebSocket receive failed"; "error" => %e);
                    break None;
                }
                // Pings are answered, and a close from the client too, by tungstenite on the
                // next read; after a close the stream ends.
                Event::In(Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_)))) => {}
                Event::In(Some(Ok(Message::Close(_)))) => {}
                Event::In(Some(Ok(m))) => match self.route(m.into_data()) {
                    Route::Nothing => {}
                    Route::CloseChannel(n) => self.readers[n] = None,
                    Route::Fail(why) => {
                        debug!(self.log, "WebSocket protocol error"; "error" => why);
                        break Some(CloseCode::Protocol);
                    }
                    Route::Deliver(n, data) => {
                        if let Some(reader) = &self.readers[n] {
                            match reader.try_deliver(data) {
                                Ok(()) => {}
                                Err(Some(data)) => held = Some((reader.clone(), data)),
                                Err(None) => self.readers[n] = None,
                            }
                        }
                    }
                },
            }
        };
        // Every reader ends here (EOF), whatever is left unread.
        drop(held);
        self.readers.clear();
        if let Some(code) = ending {
            let frame = CloseFrame {
                code,
                reason: "".into(),
            };
            if let Err(e) = ws.send(Message::Close(Some(frame))).await {
                debug!(self.log, "cannot send the WebSocket close"; "error" => %e);
                return;
            }
            // The client answers the close; whatever else it still sends is dropped.
            let answered = tokio::time::timeout(CLOSE_WAIT, async {
                while let Some(Ok(_)) = ws.next().await {}
            })
            .await;
            if answered.is_err() {
                debug!(self.log, "the client did not answer the WebSocket close");
            }
        }
    }

    /// Where one message from the client goes (kubelet's `Conn.handle`).
    fn route(&self, data: Bytes) -> Route {
        let Some(&first) = data.first() else {
            return Route::Nothing;
        };
        let channels = self.readers.len();
        if self.options.close_signal && first == CLOSE_SIGNAL {
            if data.len() != 2 {
                return Route::Fail("a close signal is followed by exactly one channel byte");
            }
            let n = usize::from(data[1]);
            if n >= channels {
                return Route::Fail("a close signal for a channel that does not exist");
            }
            return Route::CloseChannel(n);
        }
        let n = usize::from(match self.options.framing {
            Framing::Binary => first,
            Framing::Base64 => first.wrapping_sub(b'0'),
        });
        if n >= channels {
            debug!(self.log, "WebSocket frame for an unknown channel dropped"; "channel" => n);
            return Route::Nothing;
        }
        if self.readers[n].is_none() {
            return Route::Nothing;
        }
        let payload = data.slice(1..);
        let payload = match self.options.framing {
            Framing::Binary => payload,
            Framing::Base64 => {
                // Go's decoder skips line breaks.
                let decoded = if payload.contains(&b'\n') || payload.contains(&b'\r') {
                    let clean: Vec<u8> = payload
                        .iter()
                        .copied()
                        .filter(|b| *b != b'\n' && *b != b'\r')
                        .collect();
                    BASE64.decode(clean)
                } else {
                    BASE64.decode(&payload)
                };
                match decoded {
                    Ok(d) => Bytes::from(d),
                    Err(e) => {
                        debug!(self.log, "WebSocket frame with bad base64 dropped"; "channel" => n, "error" => %e);
                        return Route::Nothing;
                    }
                }
            }
        };
        if payload.is_empty() {
            // Nothing to read; an empty chunk would read as EOF.
            return Route::Nothing;
        }
        Route::Deliver(n, payload)
    }
}

/// The message that carries `data` on `channel`.
fn frame(channel: u8, framing: Framing, data: &[u8]) -> Message {
    match framing {
        Framing::Binary => {
            let mut m = Vec::with_capacity(data.len() + 1);
            m.push(channel);
            m.extend_from_slice(data);
            Message::binary(m)
        }
        Framing::Base64 => {
            let mut m = String::with_capacity(data.len().div_ceil(3) * 4 + 2);
            // As Go's `string('0'+n)`: the code point, UTF-8 encoded.
            m.push(char::from(b'0'.wrapping_add(channel)));
            BASE64.encode_string(data, &mut m);
            Message::text(m)
        }
    }
}

fn broken(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::BrokenPipe, what.to_string())
}

/// The server's end of a channel the client writes.
struct ChannelReader {
    rx: mpsc::Receiver<Chunk>,
    /// What is left of the last message.
    current: Bytes,
    /// Its share of the queue's budget, released once it is read.
    permit: Option<OwnedSemaphorePermit>,
}

impl AsyncRead for ChannelReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        while self.current.is_empty() {
            self.permit = None;
            match ready!(self.rx.poll_recv(cx)) {
                Some((data, permit)) => {
                    self.current = data;
                    self.permit = Some(permit);
                }
                None => return Poll::Ready(Ok(())),
            }
        }
        let n = self.current.len().min(buf.remaining());
        buf.put_slice(&self.current[..n]);
        self.current.advance(n);
        if self.current.is_empty() {
            self.permit = None;
        }
        Poll::Ready(Ok(()))
    }
}

/// The server's end of a channel it writes.
struct ChannelWriter {
    out: tokio_util::sync::PollSender<Out>,
    channel: u8,
    framing: Framing,
    shut: bool,
}

impl AsyncWrite for ChannelWriter {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.shut {
            return Poll::Ready(Err(broken("write on a channel that was shut down")));
        }
        if ready!(self.out.poll_reserve(cx)).is_err() {
            return Poll::Ready(Err(broken("the WebSocket connection is closed")));
        }
        let n = buf.len().min(MAX_CHUNK);
        let message = frame(self.channel, self.framing, &buf[..n]);
        if self.out.send_item(Out::Frame(message)).is_err() {
            return Poll::Ready(Err(broken("the WebSocket connection is closed")));
        }
        Poll::Ready(Ok(n))
    }
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        // Queued messages are sent in order by the connection task; there is nothing to wait
        // for here that `ChannelConn::close` does not wait for.
        if self.out.get_ref().is_some_and(|s| s.is_closed()) {
            return Poll::Ready(Err(broken("the WebSocket connection is closed")));
        }
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.shut = true;
        self.out.close();
        Poll::Ready(Ok(()))
    }
}

/// A byte stream tunnelled in binary WebSocket messages (`SPDY/3.1+portforward.k8s.io`: each
/// write is one message; reads concatenate messages). EOF at a close frame.
pub struct Tunnel {
    state: TunnelState,
    /// What is left of the last message read.
    current: Bytes,
    read_done: bool,
    close_sent: bool,
}

enum TunnelState {
    /// Wrapping the io (done on the first poll: it needs a task context).
    Starting(Pin<Box<dyn Future<Output = Ws> + Send>>),
    Open(Box<Ws>),
}

impl Tunnel {
    /// Wraps `io`, an upgraded connection after the server's 101 answer.
    pub fn new<T>(io: T) -> Tunnel
    where
        T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let io: Box<dyn Io> = Box::new(io);
        Tunnel {
            state: TunnelState::Starting(Box::pin(WebSocketStream::from_raw_socket(
                io,
                Role::Server,
                Some(config()),
            ))),
            current: Bytes::new(),
            read_done: false,
            close_sent: false,
        }
    }

    fn ws(&mut self, cx: &mut Context<'_>) -> Poll<&mut Ws> {
        if let TunnelState::Starting(f) = &mut self.state {
            let ws = ready!(f.as_mut().poll(cx));
            self.state = TunnelState::Open(Box::new(ws));
        }
        match &mut self.state {
            TunnelState::Open(ws) => Poll::Ready(&mut **ws),
            // Replaced just above.
            TunnelState::Starting(_) => Poll::Pending,
        }
    }
}

fn io_error(e: WsError) -> std::io::Error {
    match e {
        WsError::Io(e) => e,
        WsError::ConnectionClosed | WsError::AlreadyClosed => broken("the WebSocket is closed"),
        e => std::io::Error::other(e),
    }
}

impl AsyncRead for Tunnel {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        while this.current.is_empty() {
            if this.read_done {
                return Poll::Ready(Ok(()));
            }
            let ws = ready!(this.ws(cx));
            match ready!(Pin::new(ws).poll_next(cx)) {
                // After a close (answered on this next read) the stream ends.
                None => this.read_done = true,
                Some(Ok(Message::Binary(data))) => this.current = data,
                Some(Ok(Message::Text(_))) => {
                    this.read_done = true;
                    return Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "text message in a WebSocket tunnel",
                    )));
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    this.read_done = true;
                    return Poll::Ready(Err(io_error(e)));
                }
            }
        }
        let n = this.current.len().min(buf.remaining());
        buf.put_slice(&this.current[..n]);
        this.current.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Tunnel {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let mut ws = Pin::new(ready!(this.ws(cx)));
        ready!(ws.as_mut().poll_ready(cx)).map_err(io_error)?;
        let n = buf.len().min(MAX_CHUNK);
        ws.as_mut()
            .start_send(Message::binary(Bytes::copy_from_slice(&buf[..n])))
            .map_err(io_error)?;
        // The message is written eagerly (no write buffer); what the socket did not take yet
        // goes with the next write or flush.
        Poll::Ready(Ok(n))
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let ws = ready!(self.get_mut().ws(cx));
        Pin::new(ws).poll_flush(cx).map_err(io_error)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let close_sent = this.close_sent;
        let mut ws = Pin::new(ready!(this.ws(cx)));
        if !close_sent {
            ready!(ws.as_mut().poll_ready(cx)).map_err(io_error)?;
            let frame = CloseFrame {
                code: CloseCode::Normal,
                reason: "".into(),
            };
            match ws.as_mut().start_send(Message::Close(Some(frame))) {
                // Already closed by the client: nothing more to say.
                Ok(()) | Err(WsError::ConnectionClosed | WsError::AlreadyClosed) => {}
                Err(e) => return Poll::Ready(Err(io_error(e))),
            }
            this.close_sent = true;
            ws = Pin::new(ready!(this.ws(cx)));
        }
        match ready!(ws.poll_flush(cx)) {
            Ok(()) | Err(WsError::ConnectionClosed | WsError::AlreadyClosed) => Poll::Ready(Ok(())),
            Err(e) => Poll::Ready(Err(io_error(e))),
        }
    }
}

/// The `Sec-WebSocket-Accept` value for a client's `Sec-WebSocket-Key`.
pub fn accept_key(key: &[u8]) -> String {
    tokio_tungstenite::tungstenite::handshake::derive_accept_key(key)
}

#[cfg(test)]
mod tests;
