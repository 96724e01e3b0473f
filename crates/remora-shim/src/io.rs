//! A process's standard streams as the shim runs them: what containerd asks for in
//! `CreateTaskRequest` / `ExecProcessRequest` (`stdin`, `stdout`, `stderr`, `terminal`).
//!
//! | stream string | what the shim does |
//! |---|---|
//! | `""` | not connected (the runtime gives the process /dev/null) |
//! | `/path` or `fifo:///path` (a FIFO) | a pipe per stream; the shim copies pipe → FIFO (stdout, stderr) and FIFO → pipe (stdin) |
//! | `/path` (a regular file) | appended to, like a FIFO's copy (containerd's Go shim does the same) |
//! | `file:///path` (on stdout) | stdout *and* stderr appended to that file, made with its parent dirs |
//! | `binary:///logger?k=v` / `binary-v2://…` (on stdout) | a logging binary reads both streams itself (below) |
//! | `terminal = true` | a console socket for runc; the pty master runc sends back is copied to stdout and from stdin |
//!
//! # Design rationale
//!
//! - **Copies are tasks on the shim's (current-thread) tokio runtime**, one per stream, over
//!   [`AsyncFd`]s on non-blocking fds, with 4 KiB buffers: one shim runs per pod, so a thread
//!   or a 64 KiB buffer per stream would show in its memory. 4 KiB is also `PIPE_BUF`, the size
//!   up to which a pipe write is atomic, which containerd's shim chose for the same reason.
//!   Only the shim's ends are made non-blocking: the pipes come from `pipe2`, so each end is its
//!   own open file description and the child's ends stay blocking, as programs expect.
//! - **An output FIFO's reader may come and go** (remora re-opens its FIFOs after a restart). The
//!   shim opens each output FIFO for reading too and keeps that fd unread, as the Go shim does,
//!   so the FIFO always has a reader: a write never fails with `EPIPE`, it only waits while the
//!   FIFO's buffer is full, until a reader is back. Opening the reader first also makes the
//!   non-blocking open of the writer succeed without waiting for the client.
//! - **Stdin stays open until `CloseIO`.** The shim opens the stdin FIFO for reading and also
//!   keeps a write end of it (the Go shim's `openStdin`): a FIFO's reader sees EOF as soon as no
//!   writer is left, and containerd's clients close and re-open their writer (attach, a client
//!   restart). [`ProcessIo::close_stdin`] drops that write end: once the client's writers are
//!   gone too, the copy reads EOF, after delivering what was written before, and closes the
//!   process's stdin (pipe) or shuts the console down (terminal: the pty master is closed, so
//!   the terminal hangs up, as the Go shim's `epollConsole.Shutdown` + `Close` do).
//! - **Exit ordering.** The shim holds no write end of a stdout/stderr pipe once the runtime
//!   has the child's ends ([`ProcessIo::take_stdio`] hands them over, `start_copying` drops any
//!   not taken), so the copies see EOF when the process and everything that inherited its
//!   streams are gone; [`ProcessIo::wait_drained`] lets the service publish the exit only
//!   after that, bounded because a daemonized grandchild can keep a stream open forever.
//! - **A copy that cannot write keeps reading.** When a sink fails (a full disk, a broken
//!   logger pipe) the error is logged once and the rest of the stream is read and discarded, so
//!   the process never blocks on a full pipe and the drain still completes.
//! - **The logging binary is not waited for here**: the shim's reaper reaps every child, so
//!   waiting here would race it. Its pid is handed out ([`ProcessIo::logger_pid`]) for the
//!   caller to watch; this module keeps a pidfd of it only to signal it without the risk of
//!   hitting a reused pid (SIGKILL when it never gets ready, SIGTERM on drop as the Go shim's
//!   `binaryIO.Close` does, so that it flushes and exits).
//! - **SIGPIPE**: a write to a pipe whose reader is gone (the process's stdin after it exited)
//!   returns `EPIPE`, handled as "the reader is gone", because Rust's runtime ignores SIGPIPE in
//!   main binaries (the shim's and the test binary's). `std::process::Command` restores the
//!   default disposition in the children it starts.

use std::fs::{File, OpenOptions};
use std::io::{self, IoSliceMut, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
use slog::{debug, warn, Logger};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::Stdio;

/// Size of a copy buffer: `PIPE_BUF`, so a chunk written to a pipe or FIFO is written whole.
const COPY_BUF: usize = 4096;
/// How long `start_copying` waits for runc's pty master; runc sends it before `create` / `exec`
/// returns, so it is normally already queued.
const MASTER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `prepare` waits for a logging binary to say it is ready.
const LOGGER_READY_TIMEOUT: Duration = Duration::from_secs(10);
/// `sizeof(sockaddr_un.sun_path)`: a socket path must be shorter (it ends with a NUL).
const SUN_PATH_LEN: usize = 108;
/// How many names `prepare` tries for a console socket before giving up.
const CONSOLE_SOCKET_TRIES: u32 = 16;

/// Numbers console sockets made by this process, so that concurrent `prepare`s in one work
/// dir never pick the same name (the pid separates shims).
static CONSOLE_SOCKET_SEQ: AtomicU64 = AtomicU64::new(0);

/// What can go wrong setting up or running a process's IO.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    /// A stream string names a scheme this shim does not serve (or one a stream cannot use,
    /// such as `binary://` for stdin).
    #[error("{stream}: unsupported stdio URI scheme {scheme:?} in {uri:?}")]
    UnsupportedScheme {
        /// stdin, stdout or stderr.
        stream: &'static str,
        /// The scheme.
        scheme: String,
        /// The whole string.
        uri: String,
    },
    /// A stream string could not be parsed.
    #[error("{stream}: malformed stdio URI {uri:?}: {reason}")]
    BadUri {
        /// stdin, stdout or stderr.
        stream: &'static str,
        /// The whole string.
        uri: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A plain stdio path is not a FIFO (stdout and stderr may also name a regular file).
    #[error("{stream}: stdio path {path} is not a FIFO (nor, for stdout/stderr, a regular file)")]
    NotFifo {
        /// stdin, stdout or stderr.
        stream: &'static str,
        /// The path.
        path: PathBuf,
    },
    /// Opening a FIFO, a log file or its directory failed.
    #[error("{stream}: opening {what} {path}: {source}")]
    Open {
        /// stdin, stdout or stderr.
        stream: &'static str,
        /// What was opened ("FIFO for writing", "log file", ...).
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// Making a pipe, or making the shim's end of it non-blocking, failed.
    #[error("{stream}: making a pipe: {source}")]
    Pipe {
        /// stdin, stdout, stderr or "logger readiness".
        stream: &'static str,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The child's pipe ends could not be given to the process's owner.
    #[error("chown of the stdio pipes to {uid}:{gid}: {source}")]
    Chown {
        /// The owner uid.
        uid: u32,
        /// The owner gid.
        gid: u32,
        /// The error.
        #[source]
        source: nix::Error,
    },
    /// Registering an fd with the tokio reactor failed.
    #[error("{stream}: registering {what} with the tokio reactor: {source}")]
    Register {
        /// stdin, stdout, stderr or "console".
        stream: &'static str,
        /// Which fd.
        what: &'static str,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// Starting a `binary://` logging binary failed.
    #[error("starting logging binary {path}: {source}")]
    LoggerSpawn {
        /// The binary.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The logging binary did not signal readiness in time; it was killed (SIGKILL).
    #[error(
        "logging binary {path} (pid {pid}) did not signal readiness within {timeout:?}; killed"
    )]
    LoggerTimeout {
        /// The binary.
        path: PathBuf,
        /// Its pid (the reaper reaps it).
        pid: i32,
        /// How long the shim waited.
        timeout: Duration,
    },
    /// A `binary-v2://` logging binary closed its readiness pipe without writing to it (it
    /// probably crashed); it was killed (SIGKILL).
    #[error("logging binary {path} (pid {pid}) closed fd 5 without signalling readiness (binary-v2); killed")]
    LoggerNotReady {
        /// The binary.
        path: PathBuf,
        /// Its pid (the reaper reaps it).
        pid: i32,
    },
    /// Reading the logging binary's readiness pipe failed; it was killed (SIGKILL).
    #[error("reading the readiness pipe of logging binary {path} (pid {pid}): {source}; killed")]
    LoggerReady {
        /// The binary.
        path: PathBuf,
        /// Its pid (the reaper reaps it).
        pid: i32,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The console socket path would not fit in a `sockaddr_un`.
    #[error("console socket path {path} is {len} bytes, a unix socket path must be under {SUN_PATH_LEN}")]
    ConsoleSocketPathTooLong {
        /// The path.
        path: PathBuf,
        /// Its length.
        len: usize,
    },
    /// Binding the console socket failed.
    #[error("binding console socket {path}: {source}")]
    ConsoleSocketBind {
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// No pty master arrived on the console socket in time.
    #[error("no pty master arrived on console socket {path} within {timeout:?}")]
    ConsoleTimeout {
        /// The socket.
        path: PathBuf,
        /// How long the shim waited.
        timeout: Duration,
    },
    /// Accepting or reading the console socket's connection failed.
    #[error("receiving the pty master on console socket {path}: {source}")]
    ConsoleReceive {
        /// The socket.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The runtime's message on the console socket carried no file descriptor.
    #[error("console socket {path}: the runtime's message carried no file descriptor")]
    ConsoleNoFd {
        /// The socket.
        path: PathBuf,
    },
    /// `resize` on a process without a terminal.
    #[error("the process has no terminal")]
    NoTerminal,
    /// `resize` before the pty master was received, or after the console was shut down.
    #[error("the process's terminal is not open (pty master not received yet, or closed)")]
    ConsoleClosed,
    /// `TIOCSWINSZ` failed.
    #[error("setting the terminal window size to {width}x{height}: {source}")]
    Resize {
        /// Columns asked for.
        width: u32,
        /// Rows asked for.
        height: u32,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// `start_copying` was called twice.
    #[error("the copies of this process's IO were already started")]
    AlreadyStarted,
}

/// The streams containerd asked for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IoSpec {
    /// stdin: a FIFO path (or `fifo://` URI), or empty.
    pub stdin: String,
    /// stdout: a FIFO or file path, a `fifo://`, `file://`, `binary://` or `binary-v2://` URI,
    /// or empty.
    pub stdout: String,
    /// stderr: as stdout; ignored when stdout is a `file://` or `binary://` URI (both streams
    /// go there) and with a terminal.
    pub stderr: String,
    /// Run the process on a pty (a console socket for the runtime).
    pub terminal: bool,
    /// Owner (uid, gid) of the child's pipe ends, if not the shim: a user-namespaced
    /// container's root on the host, which must be able to reopen them (`/dev/stdout`), as the
    /// Go shim's `IoUid`/`IoGid`.
    pub owner: Option<(u32, u32)>,
}

/// One process's IO.
pub struct ProcessIo {
    log: Logger,
    /// The child's ends, until the runtime takes them.
    child: Stdio,
    /// The shim's ends, waiting for `start_copying`.
    pending: Option<Pending>,
    /// The console socket, while it exists.
    console: Option<ConsoleSocket>,
    terminal: bool,
    logger: Option<LoggerProcess>,
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for ProcessIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessIo")
            .field("terminal", &self.terminal)
            .field("console_socket", &self.console_socket())
            .field("logger_pid", &self.logger_pid())
            .field("copies", &self.tasks.len())
            .finish_non_exhaustive()
    }
}

// The service keeps a ProcessIo across awaits of its (Send) ttrpc futures.
const _: () = {
    const fn send_and_sync<T: Send + Sync>() {}
    send_and_sync::<ProcessIo>();
};

/// State the copy tasks share with the [`ProcessIo`].
struct Shared {
    /// The shim's write end of the stdin FIFO, kept until `close_stdin`.
    stdin_keep: Mutex<Option<OwnedFd>>,
    /// The pty master, once received; taken when the console is shut down.
    master: Mutex<Option<Arc<AsyncFd<OwnedFd>>>>,
    /// Set when the console is shut down: the terminal's output copy stops.
    console_down: watch::Sender<bool>,
    /// Output copies (stdout, stderr, or the terminal's) that have not finished yet.
    outputs_left: watch::Sender<usize>,
}

/// Locks a mutex, ignoring poisoning: the guarded values (an optional fd) cannot be left
/// half-updated by a panic.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The shim's ends of a process's streams, between `prepare` and `start_copying`.
enum Pending {
    Pipes {
        /// stdout's pipe read end and where it goes.
        stdout: Option<(AsyncFd<OwnedFd>, Arc<Sink>)>,
        /// stderr's pipe read end and where it goes.
        stderr: Option<(AsyncFd<OwnedFd>, Arc<Sink>)>,
        /// The stdin FIFO's read end and the pipe's write end.
        stdin: Option<(AsyncFd<OwnedFd>, AsyncFd<OwnedFd>)>,
    },
    Terminal {
        /// Where the pty's output goes.
        stdout: Option<Arc<Sink>>,
        /// The stdin FIFO's read end.
        stdin: Option<AsyncFd<OwnedFd>>,
    },
}

/// Where an output stream is written.
struct Sink {
    kind: SinkKind,
    /// For the logs.
    name: String,
    /// Serializes chunks when stdout and stderr share the sink: a chunk is written whole.
    write_lock: tokio::sync::Mutex<()>,
}

enum SinkKind {
    /// An output FIFO: the non-blocking write end, and a read end kept (never read) so that
    /// the FIFO always has a reader.
    Fifo {
        writer: AsyncFd<OwnedFd>,
        _reader: OwnedFd,
    },
    /// A regular file, opened for append. Written with blocking writes on the runtime's
    /// thread: epoll does not take regular files, and an append of at most 4 KiB to a local
    /// file does not block for long.
    File(File),
    /// A pipe to a logging binary (a terminal's output with a `binary://` stdout).
    Pipe(AsyncFd<OwnedFd>),
}

impl Sink {
    async fn write_all(&self, buf: &[u8]) -> io::Result<()> {
        let _chunk = self.write_lock.lock().await;
        match &self.kind {
            SinkKind::Fifo { writer, .. } | SinkKind::Pipe(writer) => write_all(writer, buf).await,
            SinkKind::File(file) => (&*file).write_all(buf),
        }
    }
}

/// A unix listener runc connects to with `--console-socket`; its file is removed on drop.
struct ConsoleSocket {
    listener: Option<UnixListener>,
    path: PathBuf,
}

impl Drop for ConsoleSocket {
    fn drop(&mut self) {
        // The listener is closed by its own drop; only the name is left on disk.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A `binary://` logging binary the shim started.
struct LoggerProcess {
    pid: i32,
    /// A pidfd, so signals reach this process even after the reaper reaped it and the pid was
    /// reused (they then fail with ESRCH). `None` on kernels without pidfd_open (< 5.3).
    pidfd: Option<OwnedFd>,
}

impl LoggerProcess {
    fn signal(&self, signal: libc::c_int) {
        if let Some(pidfd) = &self.pidfd {
            // SAFETY: pidfd_send_signal with a valid pidfd, no siginfo and no flags.
            unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    pidfd.as_raw_fd(),
                    signal,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                );
            }
        }
    }
}

/// An output target parsed from a stream string.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// A plain path or `fifo://`: a FIFO, or an existing regular file.
    Path(PathBuf),
    /// `file://`: a file appended to, made with its parent dirs.
    File(PathBuf),
    /// `binary://` / `binary-v2://`: a logging binary.
    Binary {
        path: PathBuf,
        args: Vec<String>,
        /// `binary-v2`: readiness needs a byte on fd 5, not just its close.
        strict_ready: bool,
    },
}

/// Parses one stream string; `None` for an empty one.
fn parse_target(stream: &'static str, s: &str) -> Result<Option<Target>, IoError> {
    if s.is_empty() {
        return Ok(None);
    }
    let bad = |reason| IoError::BadUri {
        stream,
        uri: s.to_string(),
        reason,
    };
    let Some((scheme, rest)) = s.split_once("://") else {
        return Ok(Some(Target::Path(PathBuf::from(s))));
    };
    if s.starts_with('/') {
        // An absolute path that happens to contain "://".
        return Ok(Some(Target::Path(PathBuf::from(s))));
    }
    let rest = rest.split_once('#').map_or(rest, |(before, _)| before);
    let (rest, query) = match rest.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (rest, None),
    };
    // Skip the authority: `binary:///x` has none, and Go's url.Parse ignores it for the path.
    let path = rest
        .find('/')
        .map(|i| &rest[i..])
        .ok_or_else(|| bad("no absolute path"))?;
    let path = PathBuf::from(percent_decode(path, false).ok_or_else(|| bad("bad %-escape"))?);
    match scheme {
        "fifo" => Ok(Some(Target::Path(path))),
        "file" => Ok(Some(Target::File(path))),
        "binary" | "binary-v2" => {
            let mut args = Vec::new();
            for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
                let (key, value) = match pair.split_once('=') {
                    Some((k, v)) => (k, Some(v)),
                    None => (pair, None),
                };
                args.push(percent_decode(key, true).ok_or_else(|| bad("bad %-escape"))?);
                if let Some(value) = value {
                    args.push(percent_decode(value, true).ok_or_else(|| bad("bad %-escape"))?);
                }
            }
            Ok(Some(Target::Binary {
                path,
                args,
                strict_ready: scheme == "binary-v2",
            }))
        }
        _ => Err(IoError::UnsupportedScheme {
            stream,
            scheme: scheme.to_string(),
            uri: s.to_string(),
        }),
    }
}

/// Decodes %XX escapes (and `+` as a space in a query, as Go's `url.QueryUnescape`).
fn percent_decode(s: &str, query: bool) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' if query => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// Makes a pipe; `shim_reads` says which end is the shim's, made non-blocking. Returns
/// (shim's end, child's end), both close-on-exec.
fn pipe(stream: &'static str, shim_reads: bool) -> Result<(OwnedFd, OwnedFd), IoError> {
    let (r, w) = blocking_pipe(stream)?;
    let (shim, child) = if shim_reads { (r, w) } else { (w, r) };
    set_nonblocking(&shim).map_err(|source| IoError::Pipe { stream, source })?;
    Ok((shim, child))
}

/// Makes a pipe with both ends blocking, close-on-exec: (read end, write end).
fn blocking_pipe(stream: &'static str) -> Result<(OwnedFd, OwnedFd), IoError> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| IoError::Pipe {
        stream,
        source: e.into(),
    })
}

fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: fcntl on an fd we own, with integer arguments only.
    unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

fn register(
    stream: &'static str,
    what: &'static str,
    fd: OwnedFd,
) -> Result<AsyncFd<OwnedFd>, IoError> {
    // SAFETY: an OwnedFd is an open fd that stays open, and is the same fd, for as long as it
    // lives; the AsyncFd owns it and never replaces it.
    unsafe { AsyncFd::register(fd) }.map_err(|e| IoError::Register {
        stream,
        what,
        source: e.into(),
    })
}

/// Opens a FIFO for reading or writing, non-blocking (and close-on-exec, as std always does).
fn open_fifo(
    stream: &'static str,
    what: &'static str,
    path: &Path,
    write: bool,
) -> Result<OwnedFd, IoError> {
    OpenOptions::new()
        .read(!write)
        .write(write)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map(OwnedFd::from)
        .map_err(|source| IoError::Open {
            stream,
            what,
            path: path.to_path_buf(),
            source,
        })
}

fn is_fifo(stream: &'static str, path: &Path) -> Result<bool, IoError> {
    std::fs::metadata(path)
        .map(|m| m.file_type().is_fifo())
        .map_err(|source| IoError::Open {
            stream,
            what: "stdio path",
            path: path.to_path_buf(),
            source,
        })
}

/// Opens an output target that the shim copies to.
fn open_sink(stream: &'static str, target: &Target) -> Result<Sink, IoError> {
    let (kind, path) = match target {
        Target::Path(path) if is_fifo(stream, path)? => {
            // The reader first: then the non-blocking open of the writer cannot fail with
            // ENXIO (no reader), whether or not the client has opened its end yet.
            let reader = open_fifo(stream, "FIFO for reading", path, false)?;
            let writer = open_fifo(stream, "FIFO for writing", path, true)?;
            let kind = SinkKind::Fifo {
                writer: register(stream, "FIFO writer", writer)?,
                _reader: reader,
            };
            (kind, path)
        }
        Target::Path(path) => {
            if !std::fs::metadata(path)
                .map(|m| m.is_file())
                .unwrap_or(false)
            {
                return Err(IoError::NotFifo {
                    stream,
                    path: path.clone(),
                });
            }
            (SinkKind::File(open_append(stream, path, false)?), path)
        }
        Target::File(path) => {
            if let Some(dir) = path.parent() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(dir)
                    .map_err(|source| IoError::Open {
                        stream,
                        what: "log file directory",
                        path: dir.to_path_buf(),
                        source,
                    })?;
            }
            (SinkKind::File(open_append(stream, path, true)?), path)
        }
        // prepare starts a logger for these instead; refuse rather than panic if that changes.
        Target::Binary { path, .. } => {
            return Err(IoError::UnsupportedScheme {
                stream,
                scheme: "binary".to_string(),
                uri: path.display().to_string(),
            })
        }
    };
    Ok(Sink {
        kind,
        name: path.display().to_string(),
        write_lock: tokio::sync::Mutex::new(()),
    })
}

fn open_append(stream: &'static str, path: &Path, create: bool) -> Result<File, IoError> {
    OpenOptions::new()
        .append(true)
        .create(create)
        .mode(0o644)
        .open(path)
        .map_err(|source| IoError::Open {
            stream,
            what: "log file",
            path: path.to_path_buf(),
            source,
        })
}

/// Opens the stdin FIFO: a non-blocking reader for the copy, and the write end the shim keeps
/// until `close_stdin` (see the module docs).
fn open_stdin(path: &Path) -> Result<(AsyncFd<OwnedFd>, OwnedFd), IoError> {
    const STREAM: &str = "stdin";
    if !is_fifo(STREAM, path)? {
        return Err(IoError::NotFifo {
            stream: STREAM,
            path: path.to_path_buf(),
        });
    }
    let reader = open_fifo(STREAM, "FIFO for reading", path, false)?;
    let keep = open_fifo(STREAM, "FIFO for writing", path, true)?;
    Ok((register(STREAM, "FIFO reader", reader)?, keep))
}

/// Creates `dir` mode 0700, or sets 0700 on it when it exists with another mode: the shim's
/// own directory of console sockets (a `mkdir` by the umask made it 0755).
pub fn make_private_dir(dir: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "exists and is not a directory",
        ));
    }
    if meta.permissions().mode() & 0o7777 != 0o700 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// Binds the console socket at a fresh short name in `dir`.
fn bind_console_socket(dir: &Path) -> Result<ConsoleSocket, IoError> {
    let mut tries = 0;
    loop {
        let seq = CONSOLE_SOCKET_SEQ.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("pty-{}-{seq}.sock", std::process::id()));
        let len = path.as_os_str().len();
        if len >= SUN_PATH_LEN {
            return Err(IoError::ConsoleSocketPathTooLong { path, len });
        }
        match UnixListener::bind(&path) {
            Ok(listener) => {
                // runc connects as root; nobody else may hand the shim a terminal.
                if let Err(source) =
                    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                {
                    let _ = std::fs::remove_file(&path);
                    return Err(IoError::ConsoleSocketBind { path, source });
                }
                return Ok(ConsoleSocket {
                    listener: Some(listener),
                    path,
                });
            }
            // A stale socket of a dead shim that had this pid: take the next name.
            Err(e) if e.kind() == io::ErrorKind::AddrInUse && tries < CONSOLE_SOCKET_TRIES => {
                tries += 1;
            }
            Err(source) => return Err(IoError::ConsoleSocketBind { path, source }),
        }
    }
}

/// Accepts runc's connection and receives the pty master it sends (one message, one fd).
async fn receive_master(listener: &UnixListener, path: &Path) -> Result<OwnedFd, IoError> {
    let receive_err = |source| IoError::ConsoleReceive {
        path: path.to_path_buf(),
        source,
    };
    let (stream, _) = listener.accept().await.map_err(receive_err)?;
    let fd = stream
        .async_io(Interest::READABLE, || recv_fd(stream.as_raw_fd()))
        .await
        .map_err(receive_err)?;
    fd.ok_or_else(|| IoError::ConsoleNoFd {
        path: path.to_path_buf(),
    })
}

/// One `recvmsg` on the console connection: the first fd of its SCM_RIGHTS, if any (extra
/// fds are closed). The payload (the pty's name) is not used.
fn recv_fd(socket: RawFd) -> io::Result<Option<OwnedFd>> {
    let mut name = [0u8; 4096];
    let mut iov = [IoSliceMut::new(&mut name)];
    let mut space = nix::cmsg_space!([RawFd; 4]);
    let msg = recvmsg::<()>(
        socket,
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let mut received = Vec::new();
    for cmsg in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg {
            // SAFETY: the kernel just installed these fds in this process for us; nothing
            // else owns them.
            received.extend(
                fds.into_iter()
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
            );
        }
    }
    Ok(received.into_iter().next())
}

/// Reads what is there (0 at EOF), waiting for readiness.
async fn read_some(fd: &AsyncFd<OwnedFd>, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        let mut guard = fd.readable().await?;
        match guard.try_io(|inner| nix::unistd::read(inner.get_ref(), buf).map_err(io::Error::from))
        {
            Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
            Ok(result) => return result,
            Err(_would_block) => continue,
        }
    }
}

/// Writes all of `buf`, waiting for room.
async fn write_all(fd: &AsyncFd<OwnedFd>, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        let mut guard = fd.writable().await?;
        match guard
            .try_io(|inner| nix::unistd::write(inner.get_ref(), buf).map_err(io::Error::from))
        {
            Ok(Ok(n)) => buf = &buf[n..],
            Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
    Ok(())
}

/// Copies an output source (a pipe's read end or the pty master) to its sink until EOF. A pty
/// master reads EIO once the last slave fd is closed: that is its EOF.
async fn copy_out(src: &AsyncFd<OwnedFd>, is_pty: bool, sink: &Sink, stream: &str, log: &Logger) {
    let mut buf = vec![0u8; COPY_BUF];
    let mut sink_ok = true;
    loop {
        let n = match read_some(src, &mut buf).await {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if is_pty && e.raw_os_error() == Some(libc::EIO) => break,
            Err(e) => {
                warn!(log, "reading the process's output failed; the copy stops";
                    "stream" => stream, "error" => %e);
                break;
            }
        };
        if sink_ok {
            if let Err(e) = sink.write_all(&buf[..n]).await {
                warn!(log, "writing the process's output failed; the rest of the stream is discarded";
                    "stream" => stream, "path" => &sink.name, "error" => %e);
                sink_ok = false;
            }
        }
    }
    debug!(log, "output copy done"; "stream" => stream, "path" => &sink.name);
}

/// Copies the stdin FIFO to the process (a pipe's write end or the pty master) until EOF on
/// the FIFO (after `close_stdin` and the client's close) or until the process is gone.
async fn copy_in(src: &AsyncFd<OwnedFd>, dst: &AsyncFd<OwnedFd>, log: &Logger) {
    let mut buf = vec![0u8; COPY_BUF];
    loop {
        let n = match read_some(src, &mut buf).await {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => {
                warn!(log, "reading the stdin FIFO failed; stdin is closed"; "error" => %e);
                break;
            }
        };
        match write_all(dst, &buf[..n]).await {
            Ok(()) => {}
            // The process (every holder of its stdin) is gone: nothing more to deliver.
            Err(e)
                if e.raw_os_error() == Some(libc::EPIPE) || e.raw_os_error() == Some(libc::EIO) =>
            {
                break
            }
            Err(e) => {
                warn!(log, "writing the process's stdin failed; stdin is closed"; "error" => %e);
                break;
            }
        }
    }
    debug!(log, "stdin copy done");
}

/// Counts an output copy as finished when dropped (done or aborted).
struct OutputDone(Arc<Shared>);

impl Drop for OutputDone {
    fn drop(&mut self) {
        self.0
            .outputs_left
            .send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// Starts a logging binary (Go's `NewBinaryCmd` protocol): argv from the URI's query, an
/// environment of only `CONTAINER_ID` and `CONTAINER_NAMESPACE`, /dev/null on 0-2, and fds
/// 3 (stdout's read end), 4 (stderr's read end), 5 (the readiness pipe's write end).
fn spawn_logger(
    path: &Path,
    args: &[String],
    id: &str,
    namespace: &str,
    fds: [&OwnedFd; 3],
) -> io::Result<LoggerProcess> {
    let raw = fds.map(|fd| fd.as_raw_fd());
    let mut cmd = std::process::Command::new(path);
    cmd.args(args)
        .env_clear()
        .env("CONTAINER_ID", id)
        .env("CONTAINER_NAMESPACE", namespace)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: the closure runs in the forked child before exec and only calls fcntl and dup2,
    // which are async-signal-safe; io::Error::last_os_error does not allocate.
    unsafe {
        cmd.pre_exec(move || {
            // Move the sources above 5 first, so that placing one cannot overwrite another
            // that happens to sit at 3, 4 or 5. The copies are close-on-exec.
            let mut high = [0; 3];
            for (h, fd) in high.iter_mut().zip(raw) {
                *h = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 10);
                if *h < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            for (target, h) in (3..).zip(high) {
                // dup2 clears close-on-exec on the target: the logger inherits 3, 4, 5.
                if libc::dup2(h, target) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    // The shim's reaper runs on this (current-thread) runtime's thread, which spawn blocks:
    // std's own wait for a child whose exec failed cannot be raced by it. The Child is dropped
    // without waiting: the reaper reaps the logger.
    let child = cmd.spawn()?;
    let pid = i32::try_from(child.id()).unwrap_or(i32::MAX);
    // SAFETY: pidfd_open(pid, 0) returns a new fd or -1; the pid is our unreaped child (it
    // cannot be reaped before this runtime thread yields).
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let pidfd = (pidfd >= 0).then(|| {
        // SAFETY: a fresh fd returned by pidfd_open (always close-on-exec).
        unsafe { OwnedFd::from_raw_fd(pidfd as RawFd) }
    });
    Ok(LoggerProcess { pid, pidfd })
}

/// The pipes and logger of a `binary://` stdout.
struct BinaryIo {
    logger: LoggerProcess,
    /// The child's stdout (write end): the process's, or the terminal copy's.
    stdout: OwnedFd,
    /// The child's stderr (write end).
    stderr: OwnedFd,
}

async fn start_binary(
    path: &Path,
    args: &[String],
    strict_ready: bool,
    id: &str,
    namespace: &str,
) -> Result<BinaryIo, IoError> {
    // Blocking on both ends: the read ends are the logger's, the write ends the process's
    // (for a terminal, prepare makes the stdout write end, then the shim's, non-blocking).
    let (out_r, out_w) = blocking_pipe("stdout")?;
    let (err_r, err_w) = blocking_pipe("stderr")?;
    let (ready_r, ready_w) = pipe("logger readiness", true)?;
    let logger =
        spawn_logger(path, args, id, namespace, [&out_r, &err_r, &ready_w]).map_err(|source| {
            IoError::LoggerSpawn {
                path: path.to_path_buf(),
                source,
            }
        })?;
    // The logger has its copies now. Ours of the readiness pipe's write end must go, or its
    // close never shows; those of the read ends too, so a dead logger shows as EPIPE.
    drop((out_r, err_r, ready_w));
    let pid = logger.pid;
    let ready = async {
        let ready_r = register("logger readiness", "pipe", ready_r)?;
        let mut byte = [0u8; 1];
        match tokio::time::timeout(LOGGER_READY_TIMEOUT, read_some(&ready_r, &mut byte)).await {
            Err(_) => Err(IoError::LoggerTimeout {
                path: path.to_path_buf(),
                pid,
                timeout: LOGGER_READY_TIMEOUT,
            }),
            Ok(Err(source)) => Err(IoError::LoggerReady {
                path: path.to_path_buf(),
                pid,
                source,
            }),
            // binary: a close is ready (backward compatibility); binary-v2 needs a byte.
            Ok(Ok(0)) if strict_ready => Err(IoError::LoggerNotReady {
                path: path.to_path_buf(),
                pid,
            }),
            Ok(Ok(_)) => Ok(()),
        }
    };
    if let Err(e) = ready.await {
        logger.signal(libc::SIGKILL);
        return Err(e);
    }
    Ok(BinaryIo {
        logger,
        stdout: out_w,
        stderr: err_w,
    })
}

impl ProcessIo {
    /// Before `runc create` / `runc exec`: opens the FIFOs / file / logger and makes the
    /// pipes, or the console socket for a terminal. `id`/`namespace` go to a binary logger's
    /// env; `work_dir` holds the console socket (keep it short: the socket path must be
    /// under 108 bytes). Everything made is released again when this fails.
    pub async fn prepare(
        spec: &IoSpec,
        id: &str,
        namespace: &str,
        work_dir: &Path,
        log: slog::Logger,
    ) -> Result<ProcessIo, IoError> {
        let stdin_path = match parse_target("stdin", &spec.stdin)? {
            None => None,
            Some(Target::Path(path)) => Some(path),
            Some(_) => {
                return Err(IoError::UnsupportedScheme {
                    stream: "stdin",
                    scheme: spec.stdin.split("://").next().unwrap_or("").to_string(),
                    uri: spec.stdin.clone(),
                })
            }
        };
        let stdout = parse_target("stdout", &spec.stdout)?;
        // As containerd's shim: a file:// or binary:// stdout takes both streams.
        let stderr = match &stdout {
            Some(Target::File(_) | Target::Binary { .. }) => stdout.clone(),
            _ if spec.terminal => None,
            _ => match parse_target("stderr", &spec.stderr)? {
                Some(Target::Binary { .. }) => {
                    return Err(IoError::UnsupportedScheme {
                        stream: "stderr",
                        scheme: spec.stderr.split("://").next().unwrap_or("").to_string(),
                        uri: spec.stderr.clone(),
                    })
                }
                other => other,
            },
        };

        let (stdin, stdin_keep) = match &stdin_path {
            Some(path) => {
                let (reader, keep) = open_stdin(path)?;
                (Some(reader), Some(keep))
            }
            None => (None, None),
        };

        let mut child = Stdio::default();
        let mut logger = None;
        let mut console = None;
        let mut outputs = 0;
        let pending = if spec.terminal {
            let stdout = match &stdout {
                None => None,
                Some(Target::Binary {
                    path,
                    args,
                    strict_ready,
                }) => {
                    // The pty's output goes to the logger's stdout pipe; its stderr pipe is
                    // closed at once (a terminal has no stderr).
                    let binary = start_binary(path, args, *strict_ready, id, namespace).await?;
                    logger = Some(binary.logger);
                    set_nonblocking(&binary.stdout).map_err(|source| IoError::Pipe {
                        stream: "stdout",
                        source,
                    })?;
                    Some(Arc::new(Sink {
                        kind: SinkKind::Pipe(register("stdout", "logger pipe", binary.stdout)?),
                        name: path.display().to_string(),
                        write_lock: tokio::sync::Mutex::new(()),
                    }))
                }
                Some(target) => Some(Arc::new(open_sink("stdout", target)?)),
            };
            outputs = usize::from(stdout.is_some());
            console = Some(bind_console_socket(work_dir)?);
            Pending::Terminal { stdout, stdin }
        } else if let Some(Target::Binary {
            path,
            args,
            strict_ready,
        }) = &stdout
        {
            // The logger reads the pipes itself: nothing to copy out.
            let binary = start_binary(path, args, *strict_ready, id, namespace).await?;
            logger = Some(binary.logger);
            child.stdout = Some(binary.stdout);
            child.stderr = Some(binary.stderr);
            let stdin = match stdin {
                Some(reader) => Some(stdin_pipe(reader, &mut child)?),
                None => None,
            };
            Pending::Pipes {
                stdout: None,
                stderr: None,
                stdin,
            }
        } else {
            let out_sink = stdout
                .as_ref()
                .map(|t| open_sink("stdout", t).map(Arc::new))
                .transpose()?;
            let err_sink = match (&stderr, &out_sink) {
                // Same target as stdout: one sink, chunks serialized by its lock.
                (Some(t), Some(sink)) if Some(t) == stdout.as_ref() => Some(sink.clone()),
                (Some(t), _) => Some(Arc::new(open_sink("stderr", t)?)),
                (None, _) => None,
            };
            let out_pair = |stream, sink: Option<Arc<Sink>>, slot: &mut Option<OwnedFd>| {
                sink.map(|sink| {
                    let (shim, child_end) = pipe(stream, true)?;
                    *slot = Some(child_end);
                    Ok::<_, IoError>((register(stream, "pipe", shim)?, sink))
                })
                .transpose()
            };
            let stdout = out_pair("stdout", out_sink, &mut child.stdout)?;
            let stderr = out_pair("stderr", err_sink, &mut child.stderr)?;
            outputs = usize::from(stdout.is_some()) + usize::from(stderr.is_some());
            let stdin = match stdin {
                Some(reader) => Some(stdin_pipe(reader, &mut child)?),
                None => None,
            };
            Pending::Pipes {
                stdout,
                stderr,
                stdin,
            }
        };
        if let Some((uid, gid)) = spec.owner {
            for fd in [&child.stdin, &child.stdout, &child.stderr]
                .into_iter()
                .flatten()
            {
                nix::unistd::fchown(
                    fd,
                    Some(nix::unistd::Uid::from_raw(uid)),
                    Some(nix::unistd::Gid::from_raw(gid)),
                )
                .map_err(|source| IoError::Chown { uid, gid, source })?;
            }
        }

        Ok(ProcessIo {
            log,
            child,
            pending: Some(pending),
            console,
            terminal: spec.terminal,
            logger,
            shared: Arc::new(Shared {
                stdin_keep: Mutex::new(stdin_keep),
                master: Mutex::new(None),
                console_down: watch::Sender::new(false),
                outputs_left: watch::Sender::new(outputs),
            }),
            tasks: Vec::new(),
        })
    }

    /// The child's ends for the runtime (taken once; empty for a terminal). The caller must
    /// drop them once the runtime has started (the shim must hold no write end of the
    /// process's stdout/stderr, or the copies never see EOF).
    pub fn take_stdio(&mut self) -> Stdio {
        std::mem::take(&mut self.child)
    }

    /// The console socket path for `--console-socket`, when a terminal was asked for.
    pub fn console_socket(&self) -> Option<&Path> {
        self.console.as_ref().map(|c| c.path.as_path())
    }

    /// After the runtime returned: receives the pty master (terminal) and starts the copies.
    /// Bounded wait for the master (runc sends it before `create` returns). Child ends not
    /// taken by [`ProcessIo::take_stdio`] are closed here.
    pub async fn start_copying(&mut self) -> Result<(), IoError> {
        let pending = self.pending.take().ok_or(IoError::AlreadyStarted)?;
        self.child = Stdio::default();
        match pending {
            Pending::Pipes {
                stdout,
                stderr,
                stdin,
            } => {
                for (stream, pair) in [("stdout", stdout), ("stderr", stderr)] {
                    if let Some((src, sink)) = pair {
                        let done = OutputDone(self.shared.clone());
                        let log = self.log.clone();
                        self.tasks.push(tokio::spawn(async move {
                            copy_out(&src, false, &sink, stream, &log).await;
                            drop(done);
                        }));
                    }
                }
                if let Some((src, dst)) = stdin {
                    let log = self.log.clone();
                    self.tasks.push(tokio::spawn(async move {
                        copy_in(&src, &dst, &log).await;
                        // Dropping `dst` closes the pipe: the process reads EOF.
                    }));
                }
            }
            Pending::Terminal { stdout, stdin } => {
                let master = self.receive_console().await?;
                *lock(&self.shared.master) = Some(master.clone());
                if let Some(sink) = stdout {
                    let done = OutputDone(self.shared.clone());
                    let mut down = self.shared.console_down.subscribe();
                    let (log, master) = (self.log.clone(), master.clone());
                    self.tasks.push(tokio::spawn(async move {
                        tokio::select! {
                            () = copy_out(&master, true, &sink, "stdout", &log) => {}
                            // The console was shut down (stdin closed): stop, so the master
                            // can close.
                            _ = down.wait_for(|down| *down) => {}
                        }
                        drop(done);
                    }));
                }
                if let Some(src) = stdin {
                    let (log, shared) = (self.log.clone(), self.shared.clone());
                    self.tasks.push(tokio::spawn(async move {
                        copy_in(&src, &master, &log).await;
                        // Stdin closed: shut the console down as containerd's shim does. The
                        // master closes when the output copy has dropped it too; the
                        // terminal then hangs up.
                        lock(&shared.master).take();
                        shared.console_down.send_replace(true);
                        debug!(log, "console shut down after stdin closed");
                    }));
                }
            }
        }
        Ok(())
    }

    /// Waits (bounded) for runc's connection on the console socket and takes the pty master
    /// it sends; the socket is removed afterwards.
    async fn receive_console(&mut self) -> Result<Arc<AsyncFd<OwnedFd>>, IoError> {
        // A terminal ProcessIo always has a console socket (prepare made both together).
        let Some(console) = self.console.as_mut() else {
            return Err(IoError::NoTerminal);
        };
        let listener = console.listener.take().ok_or(IoError::AlreadyStarted)?;
        let path = console.path.clone();
        let received = tokio::time::timeout(MASTER_TIMEOUT, receive_master(&listener, &path)).await;
        // One master per process: the socket is done with, whatever happened.
        drop(listener);
        let _ = std::fs::remove_file(&path);
        let master = received.map_err(|_| IoError::ConsoleTimeout {
            path: path.clone(),
            timeout: MASTER_TIMEOUT,
        })??;
        set_nonblocking(&master).map_err(|source| IoError::ConsoleReceive {
            path: path.clone(),
            source,
        })?;
        Ok(Arc::new(register("stdout", "pty master", master)?))
    }

    /// Window size of the terminal (no-op error `IoError::NoTerminal` without one).
    pub fn resize(&self, width: u32, height: u32) -> Result<(), IoError> {
        if !self.terminal {
            return Err(IoError::NoTerminal);
        }
        let master = lock(&self.shared.master)
            .clone()
            .ok_or(IoError::ConsoleClosed)?;
        let size = libc::winsize {
            ws_row: u16::try_from(height).unwrap_or(u16::MAX),
            ws_col: u16::try_from(width).unwrap_or(u16::MAX),
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ reads a winsize from a valid pointer; the fd is open (we hold
        // an Arc of it).
        let rc = unsafe { libc::ioctl(master.get_ref().as_raw_fd(), libc::TIOCSWINSZ, &size) };
        if rc < 0 {
            return Err(IoError::Resize {
                width,
                height,
                source: io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    /// Closes the process's stdin (CloseIO): the shim drops its write end of the stdin FIFO,
    /// so the copy reads EOF once the client's writers are gone too (after delivering what
    /// they wrote), then closes the pipe's write end, or for a terminal shuts the console
    /// down (the pty master is closed and the terminal hangs up, as containerd's shim does).
    pub fn close_stdin(&self) {
        if lock(&self.shared.stdin_keep).take().is_some() {
            debug!(self.log, "stdin closed (CloseIO)");
        }
    }

    /// Resolves when the output copies have reached EOF (the process and all holders of its
    /// stdout/stderr are gone), or `within` passed; true when drained. True at once when no
    /// output is copied (unconnected streams, a `binary://` logger); false (after `within`)
    /// when output is connected but `start_copying` was never called.
    pub async fn wait_drained(&self, within: Duration) -> bool {
        let mut left = self.shared.outputs_left.subscribe();
        let drained = tokio::time::timeout(within, left.wait_for(|n| *n == 0))
            .await
            .is_ok_and(|seen| seen.is_ok());
        drained
    }

    /// Pid of a `binary://` logger the shim started, for the reaper.
    pub fn logger_pid(&self) -> Option<i32> {
        self.logger.as_ref().map(|l| l.pid)
    }
}

/// Makes the stdin pipe: the child's read end goes into `child`, the copy gets
/// (FIFO reader, pipe write end).
fn stdin_pipe(
    reader: AsyncFd<OwnedFd>,
    child: &mut Stdio,
) -> Result<(AsyncFd<OwnedFd>, AsyncFd<OwnedFd>), IoError> {
    let (shim, child_end) = pipe("stdin", false)?;
    child.stdin = Some(child_end);
    Ok((reader, register("stdin", "pipe", shim)?))
}

impl Drop for ProcessIo {
    /// Stops the copies (their fds close as the tasks are dropped), removes the console
    /// socket (by `ConsoleSocket`'s drop), and asks a logging binary to flush and exit.
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        if let Some(logger) = &self.logger {
            logger.signal(libc::SIGTERM);
        }
    }
}

#[cfg(test)]
mod tests;
