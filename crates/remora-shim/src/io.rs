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
//! [`ProcessIo`] (here) puts together the module's parts: `target` (what a stream string names,
//! and opening it), `copy` (the copy loops), `fd` (the non-blocking fds they run on), `console`
//! (terminals through the console socket) and `logger` (`binary://` logging binaries).
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

use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use slog::{debug, Logger};
use tokio::io::unix::AsyncFd;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::Stdio;

mod console;
mod copy;
mod fd;
mod logger;
mod target;

pub use console::make_private_dir;
use console::{bind_console_socket, ConsoleSocket, SUN_PATH_LEN};
use copy::{copy_in, copy_out, OutputDone};
use fd::{pipe, register, set_nonblocking};
use logger::{start_binary, LoggerProcess};
use target::{open_sink, open_stdin, parse_target, Sink, SinkKind, Target};

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
        let Streams {
            stdin: stdin_path,
            stdout,
            stderr,
        } = Streams::parse(spec)?;

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
        if let Some(owner) = spec.owner {
            chown_child_ends(&child, owner)?;
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

/// What a process's three stream strings name, as containerd's shim reads them.
struct Streams {
    /// The stdin FIFO (stdin takes a path or `fifo://` only).
    stdin: Option<PathBuf>,
    stdout: Option<Target>,
    /// stdout's target when stdout is `file://` or `binary://` (both streams go there); none
    /// with a terminal.
    stderr: Option<Target>,
}

impl Streams {
    fn parse(spec: &IoSpec) -> Result<Streams, IoError> {
        let stdin = match parse_target("stdin", &spec.stdin)? {
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
        Ok(Streams {
            stdin,
            stdout,
            stderr,
        })
    }
}

/// Gives the child's pipe ends to the process's owner (`IoSpec::owner`).
fn chown_child_ends(child: &Stdio, (uid, gid): (u32, u32)) -> Result<(), IoError> {
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
    Ok(())
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
