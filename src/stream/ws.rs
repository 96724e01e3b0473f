//! WebSocket for the streaming server: kubelet's channel protocols and the SPDY tunnel.
//! API skeleton: bodies are being written.

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::io::{ClientRead, ClientWrite};

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

/// A running channel-multiplexed WebSocket connection.
pub struct ChannelConn {}

impl ChannelConn {
    /// Resolves once the WebSocket has closed or broken.
    pub async fn closed(&self) {
        unimplemented!("ChannelConn::closed")
    }
    /// Sends a close frame (normal closure) after all queued frames, and ends the connection.
    pub async fn close(&self) {
        unimplemented!("ChannelConn::close")
    }
}

/// Runs the channel protocol over `io`, an upgraded connection after the server's 101 answer.
/// Returns one [`Channel`] per entry of `options.channels`, by channel number.
pub fn channels<T>(io: T, options: ChannelOptions, log: slog::Logger) -> (ChannelConn, Vec<Channel>)
where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let _ = (io, options, log);
    unimplemented!("ws::channels")
}

/// A byte stream tunnelled in binary WebSocket messages (`SPDY/3.1+portforward.k8s.io`: each
/// write is one message; reads concatenate messages). EOF at a close frame.
pub struct Tunnel {}

impl Tunnel {
    /// Wraps `io`, an upgraded connection after the server's 101 answer.
    pub fn new<T>(io: T) -> Tunnel
    where
        T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let _ = io;
        unimplemented!("Tunnel::new")
    }
}

impl AsyncRead for Tunnel {
    fn poll_read(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        _buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        unimplemented!("Tunnel::poll_read")
    }
}

impl AsyncWrite for Tunnel {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        _buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        unimplemented!("Tunnel::poll_write")
    }
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        unimplemented!("Tunnel::poll_flush")
    }
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        unimplemented!("Tunnel::poll_shutdown")
    }
}

/// The `Sec-WebSocket-Accept` value for a client's `Sec-WebSocket-Key`.
pub fn accept_key(key: &[u8]) -> String {
    let _ = key;
    unimplemented!("ws::accept_key")
}
