//! SPDY/3.1, the server side, as kubelet's streaming clients speak it (moby/spdystream, under
//! client-go's `httpstream/spdy`, under kubectl and crictl).
//!
//! Only what a kubelet-style server needs: the client opens every stream (odd ids), the
//! server answers each SYN_STREAM with an empty SYN_REPLY and hands the stream out; it never
//! opens streams, and pings only to probe a client while it cannot read from it. [`frame`] and [`header`] are the codec (header blocks on one
//! zlib stream per direction, with the SPDY/3 dictionary); [`session`] is the connection task,
//! its backpressure and its flow-control policy (accounted always, enforced only once the
//! client shows it speaks it, because spdystream does not — see there).
//!
//! Handles are cheap views on the session's shared state: a [`StreamReader`] reads what the
//! session buffered for it, a [`StreamWriter`] queues data frames; neither touches the socket.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

mod frame;
mod header;
mod session;
#[cfg(test)]
mod tests;

use header::Headers;
use session::Shared;

/// Serves one SPDY/3.1 session on `io`, as the server: answers every SYN_STREAM the client
/// sends with a SYN_REPLY and yields it through [`Incoming`].
pub fn serve<T>(io: T, log: slog::Logger) -> (Session, Incoming)
where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let shared = Arc::new(Shared::new(log));
    tokio::spawn(session::run(io, shared.clone()));
    (
        Session {
            shared: shared.clone(),
        },
        Incoming { shared },
    )
}

/// A handle on a running session.
#[derive(Clone)]
pub struct Session {
    shared: Arc<Shared>,
}

impl Session {
    /// Ends the session: GOAWAY, then the connection is closed once queued frames are written.
    /// Returns once it is closed; a client that does not read gets [`session::CLOSE_GRACE`]
    /// before the connection is dropped regardless.
    pub async fn close(&self) {
        self.shared.begin_close(Some(session::CLOSE_STATUS));
        if tokio::time::timeout(session::CLOSE_GRACE, self.shared.ended())
            .await
            .is_err()
        {
            self.shared.force_end();
            self.shared.ended().await;
        }
    }
    /// Resolves once the connection has ended (closed by either side, or broken).
    pub async fn closed(&self) {
        self.shared.ended().await
    }
}

/// The streams the client opens, in order.
pub struct Incoming {
    shared: Arc<Shared>,
}

impl Incoming {
    /// The next stream the client opened (already replied to); `None` once the session ended.
    pub async fn next(&mut self) -> Option<Stream> {
        let (id, headers) =
            std::future::poll_fn(|cx| self.shared.lock().poll_incoming(cx.waker())).await?;
        Some(Stream {
            id,
            headers,
            reader: StreamReader {
                shared: self.shared.clone(),
                id,
            },
            writer: StreamWriter {
                shared: self.shared.clone(),
                id,
            },
        })
    }
}

impl Drop for Incoming {
    fn drop(&mut self) {
        self.shared.lock().release_incoming();
    }
}

/// One stream opened by the client.
pub struct Stream {
    id: u32,
    headers: Headers,
    reader: StreamReader,
    writer: StreamWriter,
}

impl Stream {
    /// The stream's id.
    pub fn id(&self) -> u32 {
        self.id
    }
    /// A header of the SYN_STREAM (names are lower case in SPDY/3), e.g. `streamtype`.
    /// Of a name sent several times, or of NUL-joined values, the first value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.split('\0').next().unwrap_or_default())
    }
    /// Splits into the half the client writes and the half the client reads.
    pub fn split(self) -> (StreamReader, StreamWriter) {
        (self.reader, self.writer)
    }
}

/// What the client sends on a stream; EOF at its FIN (or RST, or session end).
///
/// After an RST_STREAM, what was buffered is still returned; then EOF if the client had sent
/// FIN, else a `ConnectionReset` error. Dropping the reader discards what the client sends
/// on the stream from then on.
pub struct StreamReader {
    shared: Arc<Shared>,
    id: u32,
}

impl AsyncRead for StreamReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        self.shared.lock().poll_read(self.id, cx.waker(), buf)
    }
}

impl Drop for StreamReader {
    fn drop(&mut self) {
        self.shared.lock().release_reader(self.id);
    }
}

/// What the server sends on a stream; `shutdown` sends FIN. Dropping without shutdown sends FIN too.
///
/// A write queues one data frame of at most 32 KiB and waits while the session's queue is
/// full (or, with a client that uses flow control, while its window is closed); `flush`
/// waits until this stream's frames are written to the connection. Writes fail once the
/// client reset the stream or the session is closing.
pub struct StreamWriter {
    shared: Arc<Shared>,
    id: u32,
}

impl AsyncWrite for StreamWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.shared.lock().poll_write(self.id, cx.waker(), buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.shared.lock().poll_flush(self.id, cx.waker())
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.shared.lock().poll_shutdown(self.id, cx.waker())
    }
}

impl Drop for StreamWriter {
    fn drop(&mut self) {
        self.shared.lock().release_writer(self.id);
    }
}
