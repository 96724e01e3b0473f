//! kubelet's remote command protocol (exec and attach) over SPDY or WebSocket: which streams
//! the client opens, how resizes arrive, and how the outcome is reported on the error stream.
//!
//! The protocol versions, as kubelet's `cri/streaming/remotecommand` serves them:
//!
//! | version | SPDY (`X-Stream-Protocol-Version`) | WebSocket subprotocol | error stream |
//! |---|---|---|---|
//! | v5 | `v5.channel.k8s.io` | `v5.channel.k8s.io` (+ stdin close signal) | JSON `Status` |
//! | v4 | `v4.channel.k8s.io` | `v4.channel.k8s.io`, `v4.base64.channel.k8s.io` | JSON `Status` |
//! | v3 | `v3.channel.k8s.io` (resize) | — | text |
//! | v2 | `channel.k8s.io` | `channel.k8s.io`, `base64.channel.k8s.io` | text |
//!
//! On SPDY the client opens one stream per channel (header `streamType`); on WebSocket the
//! channels are fixed: 0 stdin, 1 stdout, 2 stderr, 3 error, 4 resize. Either way the runtime
//! gets one [`SessionIo`], so exec and attach never know the transport.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use slog::{debug, Logger};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{spdy, ws};
use crate::io::{ClientRead, ClientWrite, SessionIo, TermSize};

/// A version of the remote command protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Version {
    /// `channel.k8s.io`: no resize, error stream as text.
    V2,
    /// `v3.channel.k8s.io`: resize.
    V3,
    /// `v4.channel.k8s.io`: the error stream carries a JSON `Status` with the exit code.
    V4,
    /// `v5.channel.k8s.io`: v4, and on WebSocket the client may close stdin.
    V5,
}

impl Version {
    fn resize(self) -> bool {
        self >= Version::V3
    }
    fn json_status(self) -> bool {
        self >= Version::V4
    }
}

/// SPDY protocol versions, in the server's order of preference.
pub const SPDY_PROTOCOLS: &[(&str, Version)] = &[
    ("v5.channel.k8s.io", Version::V5),
    ("v4.channel.k8s.io", Version::V4),
    ("v3.channel.k8s.io", Version::V3),
    ("channel.k8s.io", Version::V2),
];

/// WebSocket subprotocols: version and framing.
pub const WS_PROTOCOLS: &[(&str, Version, ws::Framing)] = &[
    ("v5.channel.k8s.io", Version::V5, ws::Framing::Binary),
    ("v4.channel.k8s.io", Version::V4, ws::Framing::Binary),
    ("v4.base64.channel.k8s.io", Version::V4, ws::Framing::Base64),
    ("channel.k8s.io", Version::V2, ws::Framing::Binary),
    ("base64.channel.k8s.io", Version::V2, ws::Framing::Base64),
];

/// The streams a request asked for (from the cached CRI request, not from the client's URL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Attach stdin.
    pub stdin: bool,
    /// Attach stdout.
    pub stdout: bool,
    /// Attach stderr (never with a TTY).
    pub stderr: bool,
    /// A terminal.
    pub tty: bool,
}

impl Options {
    fn stderr(self) -> bool {
        self.stderr && !self.tty
    }
}

/// How a session ended, for the error stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The command ran to the end (exit code 0), or an attach ended.
    Success,
    /// The command exited with a non-zero code.
    Exited(i32),
    /// The runtime failed; the message goes to the client.
    Failed(String),
}

/// Why the client's streams could not be gathered.
#[derive(Debug, thiserror::Error)]
pub enum GatherError {
    /// Not every expected stream arrived within the stream creation timeout.
    #[error("timed out after {timeout:?} waiting for the client to create streams (got {got} of {expected})")]
    Timeout {
        /// The timeout.
        timeout: Duration,
        /// Streams received.
        got: usize,
        /// Streams expected.
        expected: usize,
    },
    /// The connection ended before every expected stream arrived.
    #[error("the client went away before creating its streams (got {got} of {expected})")]
    Gone {
        /// Streams received.
        got: usize,
        /// Streams expected.
        expected: usize,
    },
}

/// The connection a session runs on, for closing it and noticing the client leave.
#[derive(Clone)]
pub enum Conn {
    /// A SPDY session.
    Spdy(spdy::Session),
    /// A channel-multiplexed WebSocket.
    Ws(std::sync::Arc<ws::ChannelConn>),
}

impl Conn {
    /// Resolves once the client's connection is gone.
    pub async fn closed(&self) {
        match self {
            Conn::Spdy(s) => s.closed().await,
            Conn::Ws(c) => c.closed().await,
        }
    }
    /// Closes the connection after what is queued.
    pub async fn close(&self) {
        match self {
            Conn::Spdy(s) => s.close().await,
            Conn::Ws(c) => c.close().await,
        }
    }
}

/// The client's streams, gathered, before the runtime runs.
pub struct Gathered {
    /// What the runtime gets.
    pub io: SessionIo,
    /// Reports the outcome once the runtime is done.
    pub finisher: Finisher,
}

/// Where a session's outcome goes, and the connection to close after it.
pub struct Finisher {
    error: Option<ClientWrite>,
    version: Version,
    conn: Conn,
    /// The server's halves of streams only the client writes (SPDY stdin and resize), held
    /// open until the end: client-go takes the server's FIN on stdin as the end of the session
    /// and closes its stdin, which would hang up an interactive shell.
    held: Vec<spdy::StreamWriter>,
}

impl Finisher {
    /// Reports `outcome` on the error stream and closes the connection.
    pub async fn finish(mut self, outcome: &Outcome, log: &Logger) {
        if let Some(mut err) = self.error.take() {
            let msg = encode_outcome(outcome, self.version);
            if !msg.is_empty() {
                if let Err(e) = err.write_all(&msg).await {
                    debug!(log, "cannot write the outcome to the error stream"; "error" => %e);
                }
            }
            let _ = err.shutdown().await;
        }
        self.held.clear();
        self.conn.close().await;
    }
}

/// A watcher that cancels `gone` once `conn` ends.
fn watch_gone(conn: &Conn) -> CancellationToken {
    let gone = CancellationToken::new();
    let token = gone.clone();
    let conn = conn.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = conn.closed() => token.cancel(),
            _ = token.cancelled() => {}
        }
    });
    gone
}

/// Reads the client's resize messages: a sequence of JSON objects `{"Width":..,"Height":..}`.
fn resize_reader(mut stream: ClientRead, log: Logger) -> mpsc::Receiver<TermSize> {
    let (tx, rx) = mpsc::channel(8);
    tokio::spawn(async move {
        let mut pending: Vec<u8> = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            let n = match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            pending.extend_from_slice(&buf[..n]);
            loop {
                let mut de = serde_json::Deserializer::from_slice(&pending).into_iter::<Size>();
                match de.next() {
                    Some(Ok(size)) => {
                        let used = de.byte_offset();
                        pending.drain(..used);
                        let size = TermSize {
                            width: size.width,
                            height: size.height,
                        };
                        if tx.send(size).await.is_err() {
                            return;
                        }
                    }
                    Some(Err(e)) if e.is_eof() => break,
                    None => {
                        pending.clear();
                        break;
                    }
                    Some(Err(e)) => {
                        // kubelet stops reading resizes at the first bad message; so do we.
                        debug!(log, "bad resize message; ignoring further resizes"; "error" => %e);
                        return;
                    }
                }
            }
            if pending.len() > 64 * 1024 {
                debug!(log, "resize message too long; ignoring further resizes");
                return;
            }
        }
    });
    rx
}

/// kubelet's `remotecommand.TerminalSize`.
#[derive(Debug, Deserialize)]
struct Size {
    #[serde(rename = "Width")]
    width: u16,
    #[serde(rename = "Height")]
    height: u16,
}

/// Gathers the streams of a SPDY session: waits (up to `timeout`) for one stream per channel
/// the request asked for, plus the error stream and, with a TTY, the resize stream.
pub async fn gather_spdy(
    session: spdy::Session,
    mut incoming: spdy::Incoming,
    version: Version,
    opts: Options,
    timeout: Duration,
    log: &Logger,
) -> Result<Gathered, GatherError> {
    let mut expected = 1;
    expected += usize::from(opts.stdin) + usize::from(opts.stdout) + usize::from(opts.stderr());
    if opts.tty && version.resize() {
        expected += 1;
    }
    let (mut stdin, mut stdout, mut stderr, mut error, mut resize) = (None, None, None, None, None);
    let mut held = Vec::new();
    let mut got = 0;
    let deadline = tokio::time::Instant::now() + timeout;
    while got < expected {
        let stream = match tokio::time::timeout_at(deadline, incoming.next()).await {
            Err(_) => {
                return Err(GatherError::Timeout {
                    timeout,
                    got,
                    expected,
                })
            }
            Ok(None) => return Err(GatherError::Gone { got, expected }),
            Ok(Some(s)) => s,
        };
        let kind = stream.header("streamtype").unwrap_or("").to_string();
        let (r, w) = stream.split();
        let slot_taken = match kind.as_str() {
            "error" => error.replace(Box::pin(w) as ClientWrite).is_some(),
            "stdin" => {
                held.push(w);
                stdin.replace(Box::pin(r) as ClientRead).is_some()
            }
            "stdout" => stdout.replace(Box::pin(w) as ClientWrite).is_some(),
            "stderr" => stderr.replace(Box::pin(w) as ClientWrite).is_some(),
            "resize" => {
                held.push(w);
                resize.replace(Box::pin(r) as ClientRead).is_some()
            }
            other => {
                debug!(log, "unexpected stream type; ignored"; "stream_type" => other);
                continue;
            }
        };
        if !slot_taken {
            got += 1;
        }
    }
    // The rest of the session's streams are not ours: keep draining them so they never block.
    tokio::spawn(async move { while incoming.next().await.is_some() {} });
    let conn = Conn::Spdy(session);
    let gone = watch_gone(&conn);
    let resize = match resize {
        Some(r) if opts.tty => Some(resize_reader(r, log.clone())),
        _ => None,
    };
    Ok(Gathered {
        io: SessionIo {
            stdin: stdin.filter(|_| opts.stdin),
            stdout: stdout.filter(|_| opts.stdout),
            stderr: stderr.filter(|_| opts.stderr()),
            resize,
            gone,
        },
        finisher: Finisher {
            error,
            version,
            conn,
            held,
        },
    })
}

/// The WebSocket channels of a remote command session (kubelet's `createChannels`).
pub fn ws_channels(opts: Options) -> Vec<ws::ChannelKind> {
    use ws::ChannelKind::{Ignore, Read, Write};
    vec![
        if opts.stdin { Read } else { Ignore },
        if opts.stdout { Write } else { Ignore },
        if opts.stderr() { Write } else { Ignore },
        Write,
        Read,
    ]
}

/// Sets up the session of a WebSocket connection whose channels are `ws_channels(opts)`.
pub async fn gather_ws(
    conn: ws::ChannelConn,
    channels: Vec<ws::Channel>,
    version: Version,
    opts: Options,
    log: &Logger,
) -> Gathered {
    let mut channels = channels.into_iter();
    let mut next = || {
        channels.next().unwrap_or(ws::Channel {
            reader: None,
            writer: None,
        })
    };
    let stdin = next().reader;
    let mut stdout = next().writer;
    let mut stderr = next().writer;
    let mut error = next().writer;
    let resize = next().reader;
    // kubelet sends an empty message on the lowest writable channel: the client's sign that
    // the connection is established.
    let ready = if opts.stdout {
        stdout.as_mut()
    } else if opts.stderr() {
        stderr.as_mut()
    } else {
        error.as_mut()
    };
    if let Some(w) = ready {
        // One write of nothing: the channel writer sends it as a message of just the channel byte.
        if let Err(e) = w.write(&[]).await {
            debug!(log, "cannot send the ready message"; "error" => %e);
        }
    }
    let conn = Conn::Ws(std::sync::Arc::new(conn));
    let gone = watch_gone(&conn);
    Gathered {
        io: SessionIo {
            stdin: stdin.filter(|_| opts.stdin),
            stdout: stdout.filter(|_| opts.stdout),
            stderr: stderr.filter(|_| opts.stderr()),
            resize: resize
                .filter(|_| opts.tty)
                .map(|r| resize_reader(r, log.clone())),
            gone,
        },
        finisher: Finisher {
            error,
            version,
            conn,
            held: Vec::new(),
        },
    }
}

/// kubelet's `metav1.Status`, the fields the error stream uses.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Status {
    metadata: serde_json::Map<String, serde_json::Value>,
    status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    details: Option<Details>,
    #[serde(skip_serializing_if = "Option::is_none")]
    code: Option<u16>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Details {
    causes: Vec<Cause>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Cause {
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    message: String,
}

/// What the error stream carries for `outcome`: v4+ a JSON `Status` (client-go turns
/// `NonZeroExitCode` into an exit code), before v4 the error text (nothing on success).
pub fn encode_outcome(outcome: &Outcome, version: Version) -> Vec<u8> {
    let status = match outcome {
        Outcome::Success => Status {
            metadata: Default::default(),
            status: "Success".into(),
            message: None,
            reason: None,
            details: None,
            code: None,
        },
        Outcome::Exited(code) => Status {
            metadata: Default::default(),
            status: "Failure".into(),
            message: Some(format!(
                "command terminated with non-zero exit code: exit status {code}"
            )),
            reason: Some("NonZeroExitCode".into()),
            details: Some(Details {
                causes: vec![Cause {
                    reason: Some("ExitCode".into()),
                    message: code.to_string(),
                }],
            }),
            code: None,
        },
        Outcome::Failed(msg) => Status {
            metadata: Default::default(),
            status: "Failure".into(),
            message: Some(format!("Internal error occurred: {msg}")),
            reason: Some("InternalError".into()),
            details: Some(Details {
                causes: vec![Cause {
                    reason: None,
                    message: msg.clone(),
                }],
            }),
            code: Some(500),
        },
    };
    if version.json_status() {
        // A plain struct of strings and maps: serialization cannot fail.
        serde_json::to_vec(&status).unwrap_or_default()
    } else {
        match outcome {
            Outcome::Success => Vec::new(),
            _ => status.message.unwrap_or_default().into_bytes(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_reach_the_client_as_client_go_reads_them() {
        let v: serde_json::Value =
            serde_json::from_slice(&encode_outcome(&Outcome::Exited(5), Version::V4)).unwrap();
        assert_eq!(v["status"], "Failure");
        assert_eq!(v["reason"], "NonZeroExitCode");
        assert_eq!(v["details"]["causes"][0]["reason"], "ExitCode");
        assert_eq!(v["details"]["causes"][0]["message"], "5");
        let v: serde_json::Value =
            serde_json::from_slice(&encode_outcome(&Outcome::Success, Version::V5)).unwrap();
        assert_eq!(v, serde_json::json!({"metadata": {}, "status": "Success"}));
    }

    #[test]
    fn before_v4_the_error_stream_is_text_and_silent_on_success() {
        assert!(encode_outcome(&Outcome::Success, Version::V3).is_empty());
        let text = encode_outcome(&Outcome::Failed("boom".into()), Version::V2);
        assert_eq!(text, b"Internal error occurred: boom");
    }

    #[test]
    fn websocket_channels_follow_the_request() {
        use ws::ChannelKind::*;
        let opts = Options {
            stdin: true,
            stdout: true,
            stderr: true,
            tty: true,
        };
        assert_eq!(ws_channels(opts), vec![Read, Write, Ignore, Write, Read]);
        let opts = Options {
            stdin: false,
            stdout: true,
            stderr: true,
            tty: false,
        };
        assert_eq!(ws_channels(opts), vec![Ignore, Write, Write, Write, Read]);
    }

    #[tokio::test]
    async fn resizes_are_decoded_across_reads_and_stop_at_garbage() {
        let (mut client, server) = tokio::io::duplex(64);
        let log = Logger::root(slog::Discard, slog::o!());
        let mut rx = resize_reader(Box::pin(server), log);
        client.write_all(b"{\"Width\":80,\"Hei").await.unwrap();
        client
            .write_all(b"ght\":24}\n{\"Width\":100,\"Height\":50}")
            .await
            .unwrap();
        assert_eq!(
            rx.recv().await,
            Some(TermSize {
                width: 80,
                height: 24
            })
        );
        assert_eq!(
            rx.recv().await,
            Some(TermSize {
                width: 100,
                height: 50
            })
        );
        client.write_all(b"not json").await.unwrap();
        assert_eq!(rx.recv().await, None);
    }
}
