//! SPDY/3.1, the server side, as kubelet's streaming clients speak it (moby/spdystream).
//! API skeleton: bodies are being written.

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Serves one SPDY/3.1 session on `io`, as the server: answers every SYN_STREAM the client
/// sends with a SYN_REPLY and yields it through [`Incoming`].
pub fn serve<T>(io: T, log: slog::Logger) -> (Session, Incoming)
where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let _ = (io, log);
    unimplemented!("spdy::serve")
}

/// A handle on a running session.
#[derive(Clone)]
pub struct Session {}

impl Session {
    /// Ends the session: GOAWAY, then the connection is closed once queued frames are written.
    pub async fn close(&self) {
        unimplemented!("Session::close")
    }
    /// Resolves once the connection has ended (closed by either side, or broken).
    pub async fn closed(&self) {
        unimplemented!("Session::closed")
    }
}

/// The streams the client opens, in order.
pub struct Incoming {}

impl Incoming {
    /// The next stream the client opened (already replied to); `None` once the session ended.
    pub async fn next(&mut self) -> Option<Stream> {
        unimplemented!("Incoming::next")
    }
}

/// One stream opened by the client.
pub struct Stream {}

impl Stream {
    /// The stream's id.
    pub fn id(&self) -> u32 {
        unimplemented!("Stream::id")
    }
    /// A header of the SYN_STREAM (names are lower case in SPDY/3), e.g. `streamtype`.
    pub fn header(&self, name: &str) -> Option<&str> {
        let _ = name;
        unimplemented!("Stream::header")
    }
    /// Splits into the half the client writes and the half the client reads.
    pub fn split(self) -> (StreamReader, StreamWriter) {
        unimplemented!("Stream::split")
    }
}

/// What the client sends on a stream; EOF at its FIN (or RST, or session end).
pub struct StreamReader {}

impl AsyncRead for StreamReader {
    fn poll_read(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        _buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        unimplemented!("StreamReader::poll_read")
    }
}

/// What the server sends on a stream; `shutdown` sends FIN. Dropping without shutdown sends FIN too.
pub struct StreamWriter {}

impl AsyncWrite for StreamWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        _buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        unimplemented!("StreamWriter::poll_write")
    }
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        unimplemented!("StreamWriter::poll_flush")
    }
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        unimplemented!("StreamWriter::poll_shutdown")
    }
}
