//! The client side of one exec or attach session, as the streaming server hands it to the
//! runtime: the streams the client opened (already negotiated: SPDY or WebSocket is invisible
//! here), terminal resizes, and a token that fires when the client is gone.
//!
//! Why a transport-neutral type in `io`: the runtime (lifecycle) must not know about HTTP,
//! SPDY or WebSocket, and the streaming server must not know about FIFOs or containerd.

use std::pin::Pin;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// A stream the client writes (stdin). EOF when the client closed it.
pub type ClientRead = Pin<Box<dyn AsyncRead + Send>>;
/// A stream the client reads (stdout, stderr). `shutdown` ends it for the client.
pub type ClientWrite = Pin<Box<dyn AsyncWrite + Send>>;

/// A terminal size the client asked for (kubelet's `remotecommand.TerminalSize`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TermSize {
    /// Columns.
    pub width: u16,
    /// Rows.
    pub height: u16,
}

/// The client's side of an exec or attach.
pub struct SessionIo {
    /// What the client types, if the request asked for stdin.
    pub stdin: Option<ClientRead>,
    /// Where the process's stdout goes, if asked for.
    pub stdout: Option<ClientWrite>,
    /// Where the process's stderr goes, if asked for (never with a TTY: all output is stdout).
    pub stderr: Option<ClientWrite>,
    /// Terminal resizes, with a TTY. The first one is the initial size, if the client sent it.
    pub resize: Option<mpsc::Receiver<TermSize>>,
    /// Cancelled when the client's connection is gone: the runtime ends the session (an exec
    /// process is killed, an attach detaches).
    pub gone: CancellationToken,
}

impl std::fmt::Debug for SessionIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionIo")
            .field("stdin", &self.stdin.is_some())
            .field("stdout", &self.stdout.is_some())
            .field("stderr", &self.stderr.is_some())
            .field("resize", &self.resize.is_some())
            .finish()
    }
}
