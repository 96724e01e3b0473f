//! The limits every HTTP listener of remora's puts on its clients (the streaming server and the
//! metrics endpoint): both are reachable by anything that can connect to their address, so
//! what one client can hold is bounded whoever it is.
//!
//! - **Header-read timeout** (hyper's, which needs hyper's timer): a connection that has not
//!   sent a whole request head within it is closed, so a client that connects and sends a few
//!   bytes (or nothing) holds no fd and no task for long.
//! - **Buffer bound**: hyper buffers at most [`MAX_BUF`] of a request head.
//! - **No keep-alive**: a connection serves one request; after a response that is not an
//!   upgrade it closes ([`close_unless_upgrade`]). Nothing remora serves needs a second
//!   request on a connection.
//! - **Connection cap** ([`ConnectionCap`]): connections accepted over the cap are closed at
//!   once (and counted), rather than queued: a flood costs accepts, not memory or fds held.
//!   A connection's permit lives as long as the connection, upgraded sessions included.
//! - **Idle timeout** for upgraded sessions ([`IdleTimeout`]): a session on which nothing was
//!   read or written for that long is ended (kubelet's `streamingConnectionIdleTimeout`,
//!   4 h by default).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::TokioTimer;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// The most hyper buffers of one connection's request head (hyper's minimum is 8 KiB; a
/// kubelet or crictl request is well under 4 KiB).
pub const MAX_BUF: usize = 64 * 1024;

/// An HTTP/1.1 server connection builder with remora's limits: hyper's tokio timer (without
/// which the header-read timeout is ignored), `header_read_timeout` and [`MAX_BUF`].
///
/// Keep-alive is left to the caller: hyper's `keep_alive(false)` also appends
/// `Connection: close` to a 101 answer, which WebSocket clients refuse; a server with
/// upgrades answers its other responses with [`close_unless_upgrade`] instead.
pub fn http1_builder(header_read_timeout: Duration) -> http1::Builder {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .max_buf_size(MAX_BUF);
    builder
}

/// Marks `resp` as the connection's last unless it is an upgrade (101): hyper then closes the
/// connection once it is written.
pub fn close_unless_upgrade<B>(resp: &mut hyper::Response<B>) {
    if resp.status() != hyper::StatusCode::SWITCHING_PROTOCOLS {
        resp.headers_mut().insert(
            hyper::header::CONNECTION,
            hyper::header::HeaderValue::from_static("close"),
        );
    }
}

/// At most so many connections at once; a connection is admitted with a permit it keeps.
#[derive(Debug, Clone)]
pub struct ConnectionCap {
    permits: Arc<Semaphore>,
}

impl ConnectionCap {
    /// A cap of `max` connections (at least one).
    pub fn new(max: usize) -> Self {
        ConnectionCap {
            permits: Arc::new(Semaphore::new(max.clamp(1, Semaphore::MAX_PERMITS))),
        }
    }

    /// A permit for one more connection, or `None` when `max` are open: the caller closes it.
    pub fn try_admit(&self) -> Option<OwnedSemaphorePermit> {
        self.permits.clone().try_acquire_owned().ok()
    }
}

/// A plain-text content type, for the small answers of [`serve_requests`]' listeners.
pub const TEXT_PLAIN: &str = "text/plain; charset=utf-8";

/// An answer of `status` whose body, `body`, is of `content_type`.
pub fn answer(
    status: hyper::StatusCode,
    content_type: &'static str,
    body: impl Into<bytes::Bytes>,
) -> hyper::Response<http_body_util::Full<bytes::Bytes>> {
    let mut resp = hyper::Response::new(http_body_util::Full::new(body.into()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    resp
}

/// A 405 for a method the resource does not take, with the `Allow` header naming the ones it
/// does (RFC 9110 §15.5.6: a 405 must carry it).
pub fn method_not_allowed(
    allow: &'static str,
) -> hyper::Response<http_body_util::Full<bytes::Bytes>> {
    let mut resp = answer(
        hyper::StatusCode::METHOD_NOT_ALLOWED,
        TEXT_PLAIN,
        format!("only {allow}\n"),
    );
    resp.headers_mut().insert(
        hyper::header::ALLOW,
        hyper::header::HeaderValue::from_static(allow),
    );
    resp
}

/// A listener [`serve_requests`] takes connections from: TCP (the metrics endpoint) or a unix
/// socket (the status socket).
pub trait Accept: Send + 'static {
    /// One accepted connection.
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// The next connection and its peer, for the log.
    fn accept_one(&self) -> impl Future<Output = std::io::Result<(Self::Io, String)>> + Send;
}

impl Accept for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;
    async fn accept_one(&self) -> std::io::Result<(Self::Io, String)> {
        let (stream, peer) = self.accept().await?;
        Ok((stream, peer.to_string()))
    }
}

impl Accept for tokio::net::UnixListener {
    type Io = tokio::net::UnixStream;
    async fn accept_one(&self) -> std::io::Result<(Self::Io, String)> {
        let (stream, _) = self.accept().await?;
        // Unix peers have no address; the credentials say who it is.
        let peer = match stream.peer_cred() {
            Ok(cred) => format!("pid {:?} uid {}", cred.pid(), cred.uid()),
            Err(_) => "unix peer".to_string(),
        };
        Ok((stream, peer))
    }
}

/// The limits of a listener that answers one small request per connection.
#[derive(Debug, Clone, Copy)]
pub struct RequestLimits {
    /// How long a client gets to send its request head.
    pub header_read_timeout: Duration,
    /// How long one connection may last, answer included.
    pub connection_timeout: Duration,
    /// Connections open at once; more are closed at once.
    pub max_connections: usize,
}

/// Answers requests on `listener` with `respond` until `stop` turns true: one request per
/// connection, within `limits`; a connection over the cap is closed at once and `refused` is
/// called. `what` names the listener in the log.
pub async fn serve_requests<L, F>(
    listener: L,
    limits: RequestLimits,
    respond: F,
    refused: impl Fn() + Send + 'static,
    mut stop: tokio::sync::watch::Receiver<bool>,
    log: slog::Logger,
    what: &'static str,
) where
    L: Accept,
    F: Fn(
            &hyper::Request<hyper::body::Incoming>,
        ) -> hyper::Response<http_body_util::Full<bytes::Bytes>>
        + Clone
        + Send
        + Sync
        + 'static,
{
    let cap = ConnectionCap::new(limits.max_connections);
    loop {
        let accepted = tokio::select! {
            a = listener.accept_one() => a,
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() {
                    return;
                }
                continue;
            }
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors, say: the listener itself stays usable.
                slog::warn!(log, "cannot accept a connection"; "listener" => what, "error" => %e);
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(permit) = cap.try_admit() else {
            refused();
            slog::debug!(log, "connection refused: too many open"; "listener" => what, "peer" => &peer, "max" => limits.max_connections);
            drop(stream);
            continue;
        };
        let respond = respond.clone();
        let log = log.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let service = hyper::service::service_fn(move |req| {
                let resp = respond(&req);
                async move { Ok::<_, std::convert::Infallible>(resp) }
            });
            let conn = http1_builder(limits.header_read_timeout)
                .keep_alive(false)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            match tokio::time::timeout(limits.connection_timeout, conn).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    slog::debug!(log, "connection ended with an error"; "listener" => what, "peer" => &peer, "error" => %e)
                }
                Err(_) => {
                    slog::debug!(log, "connection timed out"; "listener" => what, "peer" => &peer)
                }
            }
        });
    }
}

/// An io that fails with `TimedOut` once nothing was read from or written to it for
/// `timeout`. The deadline is checked when a read waits (every session here keeps a read
/// pending while it runs), and pushed back lazily: progress records an instant, and the timer
/// is reset only when it fires early.
pub struct IdleTimeout<T> {
    io: T,
    timeout: Duration,
    last: Instant,
    timer: Pin<Box<Sleep>>,
    expired: bool,
    /// The connection's permit ([`ConnectionCap`]): released when the session's io goes.
    _permit: Option<Arc<OwnedSemaphorePermit>>,
}

impl<T> IdleTimeout<T> {
    /// Wraps `io`; the clock starts now.
    pub fn new(io: T, timeout: Duration) -> Self {
        let now = Instant::now();
        IdleTimeout {
            io,
            timeout,
            last: now,
            timer: Box::pin(tokio::time::sleep_until(deadline(now, timeout))),
            expired: false,
            _permit: None,
        }
    }

    /// Keeps `permit` until this io is dropped: an upgraded session counts against its
    /// listener's cap for as long as it runs, not only while its HTTP request is served.
    pub fn holding(mut self, permit: Arc<OwnedSemaphorePermit>) -> Self {
        self._permit = Some(permit);
        self
    }

    /// Whether the idle deadline has passed (registering the waker if not).
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> bool {
        if self.expired {
            return true;
        }
        loop {
            if self.timer.as_mut().poll(cx).is_pending() {
                return false;
            }
            let due = deadline(self.last, self.timeout);
            if due <= Instant::now() {
                self.expired = true;
                return true;
            }
            // There was progress since the timer was set: wait for the new deadline.
            self.timer.as_mut().reset(due);
        }
    }
}

/// `from + timeout`, or far in the future when that overflows (a huge configured timeout).
fn deadline(from: Instant, timeout: Duration) -> Instant {
    from.checked_add(timeout)
        .unwrap_or_else(|| from + Duration::from_secs(100 * 365 * 24 * 3600))
}

fn idle_error() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "connection idle for longer than the idle timeout",
    )
}

impl<T: AsyncRead + Unpin> AsyncRead for IdleTimeout<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.expired {
            return Poll::Ready(Err(idle_error()));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    this.last = Instant::now();
                }
                Poll::Ready(r)
            }
            Poll::Pending => {
                if this.poll_expired(cx) {
                    Poll::Ready(Err(idle_error()))
                } else {
                    Poll::Pending
                }
            }
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for IdleTimeout<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if this.expired {
            return Poll::Ready(Err(idle_error()));
        }
        let n = ready!(Pin::new(&mut this.io).poll_write(cx, buf))?;
        if n > 0 {
            this.last = Instant::now();
        }
        Poll::Ready(Ok(n))
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn the_cap_admits_up_to_max_and_again_once_a_permit_is_dropped() {
        let cap = ConnectionCap::new(2);
        let a = cap.try_admit().expect("first");
        let _b = cap.try_admit().expect("second");
        assert!(cap.try_admit().is_none(), "third over the cap");
        drop(a);
        assert!(cap.try_admit().is_some(), "room again");
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_io_times_out_and_progress_pushes_the_deadline_back() {
        let (near, mut far) = tokio::io::duplex(1024);
        let mut io = IdleTimeout::new(near, Duration::from_secs(10));
        let start = Instant::now();
        // Traffic at 6 s and 12 s: not idle for 10 s until 22 s.
        let writer = tokio::spawn(async move {
            for _ in 0..2 {
                tokio::time::sleep(Duration::from_secs(6)).await;
                far.write_all(b"x").await.unwrap();
            }
            far
        });
        let mut buf = [0u8; 8];
        assert_eq!(io.read(&mut buf).await.unwrap(), 1);
        assert_eq!(io.read(&mut buf).await.unwrap(), 1);
        // Bounded: without the timeout the read would wait forever (virtual time).
        let err = tokio::time::timeout(Duration::from_secs(3600), io.read(&mut buf))
            .await
            .expect("the idle read ends")
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        assert_eq!(start.elapsed(), Duration::from_secs(22));
        assert!(io.write(b"y").await.is_err(), "writes fail once expired");
        drop(writer.await.unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn writes_count_as_activity() {
        let (near, mut far) = tokio::io::duplex(1024);
        let mut io = IdleTimeout::new(near, Duration::from_secs(10));
        let start = Instant::now();
        tokio::time::sleep(Duration::from_secs(8)).await;
        io.write_all(b"out").await.unwrap();
        let mut got = [0u8; 3];
        far.read_exact(&mut got).await.unwrap();
        let err = tokio::time::timeout(Duration::from_secs(3600), io.read(&mut [0u8; 8]))
            .await
            .expect("the idle read ends")
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        assert_eq!(start.elapsed(), Duration::from_secs(18));
    }
}
