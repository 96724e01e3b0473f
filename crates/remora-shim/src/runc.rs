//! The OCI runtime's command line: `runc` (or `crun`, which takes the same subset) driven as a
//! child process, every child waited through the [`Reaper`].
//!
//! Here: [`Runc`], its calls and their errors; `call` builds a call's command line, `message`
//! reads the runtime's error message and what it says, `blocking` runs the runtime without
//! tokio for the one-shot actions ([`run_blocking`]).
//!
//! # Design
//!
//! - **Children.** Each call spawns the runtime with `std::process::Command`, its three streams
//!   set explicitly, watches the pid with [`Reaper::watch_spawned`] right after `spawn` (an exit
//!   that comes first is kept by the reaper), drops the `Child` unwaited, and awaits the exit.
//!   Never `tokio::process`: its `waitpid(pid)` would race the reaper's `waitpid(-1)`.
//! - **Streams.** `create` and `exec` hand the container's [`Stdio`] to the
//!   runtime as its 0/1/2 (others `/dev/null`): runc passes its own streams on to the container's
//!   process. Their stderr is therefore the container's, never captured, and their error message
//!   comes from the runtime's log. Every other call gets pipes for stdout (`state`, `ps`,
//!   `features` parse it) and stderr, read on the runtime's reactor through
//!   `tokio::net::unix::pipe` — no thread per call — concurrently with the wait, so a full pipe
//!   cannot stall the runtime.
//! - **Error messages.** Global flags `--log <bundle>/log.json --log-format json` when the bundle
//!   is known. On failure the message is runc's own: the last `"level":"error"` line's `msg`
//!   among the lines this call appended to the log (read from the length the log had before the
//!   call: the file keeps every earlier call's lines), else the last `level=error` message of its
//!   stderr, else its stderr trimmed. "container does not exist" / "container not found" from a
//!   call on an existing container is [`RuncError::NotFound`].
//! - **Bundles** are kept per id: `create` records the bundle, `delete` forgets it, and
//!   [`Runc::remember_bundle`] records one for a container this instance did not create (the shim's
//!   `delete` action after a restart). A call for an unknown id runs without `--log`.
//! - **Pids.** `create` and `exec` return the pid the runtime wrote to the pid file (the spec'd
//!   API returned `()`; `runc.create(..).await?;` still compiles). The exec process file goes
//!   into the bundle (the temp dir for an unknown id) and is removed on every path out.
//! - **Timeouts.** Every call is bounded ([`Timeouts`]: [`LONG_CALL_TIMEOUT`] for `create`,
//!   `start` and `exec`, which run OCI hooks and set up the container; [`SHORT_CALL_TIMEOUT`]
//!   for the rest), so a hung runtime cannot hold a container's lifecycle lock for good. A call
//!   that times out is [`RuncError::Timeout`], naming the command and the container. The bound
//!   covers reading the pipes too: a runtime that left a descendant holding them open no
//!   longer keeps the call waiting.
//! - **The guard.** The runtime is spawned as the leader of a process group of its own, and a
//!   guard (`RuntimeGuard`) holds its watch from `spawn` on. When the call times out, or is
//!   dropped (a ttrpc deadline, a cancelled caller) before the runtime's exit is in, the guard
//!   SIGKILLs the group: the runtime and what it started (`runc init` stages, hooks). As Go's
//!   `exec.CommandContext` in go-runc, but for the whole group. Once the exit is in, the guard
//!   signals nothing: the container's init (which `runc init` moves to a session of its own,
//!   and which a runtime that did not `setsid` would leave in the group) is not the call's to
//!   kill. The reaper reaps the killed processes; the check and the kill run under its lock
//!   ([`Reaper::kill_group`]), so the group id cannot have been reused and nothing is reaped
//!   twice.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use slog::{debug, warn, Logger};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::oneshot;

use crate::reaper::{Exit, Reaper};
use crate::Stdio;

mod blocking;
mod call;
mod message;

pub use blocking::run_blocking;
use call::{argv, Call};
use message::{is_not_found, last_log_error, read_log_from, stderr_message};

/// Why an OCI runtime call failed.
#[derive(Debug, thiserror::Error)]
pub enum RuncError {
    /// The runtime says the container does not exist.
    #[error("container {id} does not exist ({command})")]
    NotFound {
        /// The runtime command, e.g. `runc kill`.
        command: String,
        /// The container.
        id: String,
    },
    /// The runtime ran and failed; `message` is its own error message.
    #[error("{command} of container {id:?} failed (exit status {status}): {message}")]
    Failed {
        /// The runtime command, e.g. `runc create`.
        command: String,
        /// The container (empty for `features`).
        id: String,
        /// Its exit status (128 + signal if killed).
        status: u32,
        /// The runtime's error message.
        message: String,
    },
    /// The runtime binary could not be started.
    #[error("starting the OCI runtime {binary:?}: {source}")]
    Spawn {
        /// The runtime binary.
        binary: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A pipe to or from the runtime could not be made or read.
    #[error("{command} of container {id:?}: its {stream}: {source}")]
    Pipe {
        /// The runtime command.
        command: String,
        /// The container.
        id: String,
        /// Which stream: stdin, stdout or stderr.
        stream: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The runtime did not finish within its bound; it was killed with its process group.
    #[error("{command} of container {id:?} did not finish within {after:?}; the runtime (pid {pid}) and its process group were killed")]
    Timeout {
        /// The runtime command, e.g. `runc create`.
        command: String,
        /// The container (empty for `features`).
        id: String,
        /// The bound it overran.
        after: Duration,
        /// The runtime process.
        pid: u32,
    },
    /// The reaper stopped before the runtime's exit was seen.
    #[error("{command} of container {id:?}: the reaper stopped before its exit (pid {pid})")]
    ReaperGone {
        /// The runtime command.
        command: String,
        /// The container.
        id: String,
        /// The runtime process.
        pid: u32,
    },
    /// The runtime's output could not be parsed.
    #[error("{command} of container {id:?}: unexpected output {output:?}: {source}")]
    Parse {
        /// The runtime command.
        command: String,
        /// The container.
        id: String,
        /// The output, as text.
        output: String,
        #[source]
        source: serde_json::Error,
    },
    /// The OCI process file for `exec` could not be written.
    #[error("writing the exec process file {path:?}: {source}")]
    ProcessFile {
        /// The file.
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A pid file could not be read.
    #[error("reading the pid file {path:?}: {source}")]
    PidFile {
        /// The file.
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A pid file does not hold a pid.
    #[error("the pid file {path:?} holds {content:?}, not a pid")]
    BadPidFile {
        /// The file.
        path: PathBuf,
        /// What it holds.
        content: String,
    },
}

impl RuncError {
    /// Whether the runtime refused because the container's process is no longer running (runc
    /// and crun: "container not running", "process already finished"): for a signal, the
    /// process has finished. Read from the runtime's own message, as [`RuncError::NotFound`] is.
    pub fn is_not_running(&self) -> bool {
        match self {
            RuncError::Failed { message, .. } => message::is_not_running(message),
            _ => false,
        }
    }
}

/// The bound of `create`, `start` and `exec`: they run the OCI hooks (`prestart`,
/// `createRuntime`, `poststart`…) and set up mounts, cgroups and namespaces, which a loaded
/// node can make slow. Two minutes, as `runtime_request_timeout` is kubelet's.
pub const LONG_CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// The bound of every other command (`kill`, `delete`, `state`, `ps`, `pause`, `resume`,
/// `update`, `features`): runc answers them in milliseconds; a forced delete waits for the
/// kill, a pause for the freezer.
pub const SHORT_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a killed runtime gets to be reaped before a timed-out call returns (SIGKILL ends
/// it at once unless it sits in an uninterruptible sleep).
const KILLED_GRACE: Duration = Duration::from_secs(5);

/// How long runtime commands may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// `create`, `start`, `exec`.
    pub long: Duration,
    /// Every other command.
    pub short: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            long: LONG_CALL_TIMEOUT,
            short: SHORT_CALL_TIMEOUT,
        }
    }
}

/// Options of `create`.
#[derive(Debug, Default)]
pub struct CreateOpts {
    /// Where the runtime writes the init process's pid.
    pub pid_file: PathBuf,
    /// The console socket, for a container with a terminal.
    pub console_socket: Option<PathBuf>,
    /// The container's streams (the runtime's own 0/1/2, passed on).
    pub stdio: Stdio,
    /// `--no-pivot`: no pivot_root (rootfs on a ramdisk).
    pub no_pivot: bool,
    /// `--no-new-keyring`: keep the caller's session keyring.
    pub no_new_keyring: bool,
}

/// Options of `exec` (always detached).
#[derive(Debug, Default)]
pub struct ExecOpts {
    /// Where the runtime writes the exec process's pid.
    pub pid_file: PathBuf,
    /// The console socket, for a process with a terminal.
    pub console_socket: Option<PathBuf>,
    /// The process's streams (the runtime's own 0/1/2, passed on).
    pub stdio: Stdio,
}

/// `runc state`; only the tests observe a container through it.
#[cfg(test)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    /// The init process's pid (0 once stopped).
    pub pid: u32,
    /// `created`, `running`, `paused` or `stopped`.
    pub status: String,
}

/// The OCI runtime's command line for one runtime root.
pub struct Runc {
    binary: PathBuf,
    root: PathBuf,
    systemd_cgroup: bool,
    reaper: Reaper,
    log: Logger,
    timeouts: Timeouts,
    /// Bundles by container id, for `--log <bundle>/log.json`.
    bundles: Mutex<HashMap<String, PathBuf>>,
    /// Numbers exec process files, unique within this process.
    process_files: AtomicU64,
}

impl Runc {
    /// `binary` (e.g. "runc" looked up in PATH, or an absolute path), `root` (its --root state
    /// dir), `systemd_cgroup` (--systemd-cgroup).
    pub fn new(
        binary: PathBuf,
        root: PathBuf,
        systemd_cgroup: bool,
        reaper: Reaper,
        log: Logger,
    ) -> Runc {
        Runc {
            binary,
            root,
            systemd_cgroup,
            reaper,
            log,
            timeouts: Timeouts::default(),
            bundles: Mutex::new(HashMap::new()),
            process_files: AtomicU64::new(0),
        }
    }

    /// The same runtime with other bounds on its commands (the tests' short bounds).
    #[cfg(test)]
    pub fn with_timeouts(mut self, timeouts: Timeouts) -> Runc {
        self.timeouts = timeouts;
        self
    }

    /// Records the bundle of a container this instance did not create, so that calls on it log
    /// to `<bundle>/log.json` (and their errors carry runc's message from there).
    pub fn remember_bundle(&self, id: &str, bundle: &Path) {
        self.bundles().insert(id.to_owned(), bundle.to_owned());
    }

    /// `runc create --bundle B --pid-file P [--console-socket S] [--no-pivot] [--no-new-keyring]
    /// ID`; returns the init process's pid, read from the pid file.
    ///
    /// The init process starts after this call began: take `Instant::now()` before it and watch
    /// the pid with [`Reaper::watch_spawned`] to tell its exit from a stale one.
    pub async fn create(
        &self,
        id: &str,
        bundle: &Path,
        opts: CreateOpts,
    ) -> Result<u32, RuncError> {
        // Remembered before the call: a failed create is cleaned up with `delete`, which then
        // logs to the same file.
        self.remember_bundle(id, bundle);
        let call = Call::Create {
            id,
            bundle,
            pid_file: &opts.pid_file,
            console_socket: opts.console_socket.as_deref(),
            no_pivot: opts.no_pivot,
            no_new_keyring: opts.no_new_keyring,
        };
        self.run(&call, Streams::Container(opts.stdio)).await?;
        read_pid_file(&opts.pid_file)
    }

    /// `runc start ID`.
    pub async fn start(&self, id: &str) -> Result<(), RuncError> {
        self.run(&Call::Start { id }, Streams::piped())
            .await
            .map(drop)
    }

    /// `runc exec --process F --detach --pid-file P [--console-socket S] ID`, `process_json` (an
    /// OCI Process) written to F for the call and removed afterwards; returns the exec process's
    /// pid, read from the pid file.
    pub async fn exec(
        &self,
        id: &str,
        process_json: &[u8],
        opts: ExecOpts,
    ) -> Result<u32, RuncError> {
        let dir = self.bundle_of(id).unwrap_or_else(std::env::temp_dir);
        let n = self.process_files.fetch_add(1, Ordering::Relaxed);
        let process_file = ProcessFile::write(
            dir.join(format!(".exec-process-{}-{n}.json", std::process::id())),
            process_json,
        )?;
        let call = Call::Exec {
            id,
            process_file: &process_file.path,
            pid_file: &opts.pid_file,
            console_socket: opts.console_socket.as_deref(),
        };
        self.run(&call, Streams::Container(opts.stdio)).await?;
        drop(process_file);
        read_pid_file(&opts.pid_file)
    }

    /// `runc kill [--all] ID SIGNAL`.
    pub async fn kill(&self, id: &str, signal: u32, all: bool) -> Result<(), RuncError> {
        let call = Call::Kill { id, signal, all };
        self.run(&call, Streams::piped()).await.map(drop)
    }

    /// `runc delete [--force] ID`; forgets the container's bundle once deleted.
    pub async fn delete(&self, id: &str, force: bool) -> Result<(), RuncError> {
        self.run(&Call::Delete { id, force }, Streams::piped())
            .await?;
        self.bundles().remove(id);
        Ok(())
    }

    /// `runc state ID` (the tests' observer; the shim keeps its own records).
    #[cfg(test)]
    pub async fn state(&self, id: &str) -> Result<State, RuncError> {
        let call = Call::State { id };
        let out = self.run(&call, Streams::piped()).await?;
        let state: RawState = self.parse(&call, &out)?;
        Ok(State {
            pid: state.pid,
            status: state.status,
        })
    }

    /// `runc ps --format json ID`: the pids of the container's processes.
    pub async fn ps(&self, id: &str) -> Result<Vec<u32>, RuncError> {
        let call = Call::Ps { id };
        let out = self.run(&call, Streams::piped()).await?;
        // Go encodes an empty list as `null`.
        let pids: Option<Vec<u32>> = self.parse(&call, &out)?;
        Ok(pids.unwrap_or_default())
    }

    /// `runc pause ID`.
    pub async fn pause(&self, id: &str) -> Result<(), RuncError> {
        self.run(&Call::Pause { id }, Streams::piped())
            .await
            .map(drop)
    }

    /// `runc resume ID`.
    pub async fn resume(&self, id: &str) -> Result<(), RuncError> {
        self.run(&Call::Resume { id }, Streams::piped())
            .await
            .map(drop)
    }

    /// `runc features`: its JSON as is (runc ≥ 1.1). Only the tests ask.
    #[cfg(test)]
    pub async fn features(&self) -> Result<Vec<u8>, RuncError> {
        self.run(&Call::Features, Streams::piped()).await
    }

    /// `runc update --resources - ID`, `resources_json` (OCI LinuxResources) on its stdin.
    pub async fn update(&self, id: &str, resources_json: &[u8]) -> Result<(), RuncError> {
        let streams = Streams::Piped {
            input: Some(resources_json),
        };
        self.run(&Call::Update { id }, streams).await.map(drop)
    }

    /// Runs one runtime command to its exit, within its bound; its stdout if it succeeded (empty
    /// for `create` and `exec`, whose stdout is the container's).
    async fn run(&self, call: &Call<'_>, streams: Streams<'_>) -> Result<Vec<u8>, RuncError> {
        let id = call.id();
        let log_file = call
            .bundle()
            .map(Path::to_owned)
            .or_else(|| self.bundle_of(id))
            .map(|bundle| bundle.join("log.json"));
        // The log keeps every earlier call's lines: this call's start where it ends now.
        let log_start = log_file
            .as_deref()
            .and_then(|path| std::fs::metadata(path).ok())
            .map_or(0, |meta| meta.len());

        let mut command = runtime_command(&self.binary);
        command.args(argv(
            &self.root,
            self.systemd_cgroup,
            log_file.as_deref(),
            call,
        ));
        let piped = match streams {
            Streams::Container(stdio) => {
                command
                    .stdin(child_stream(stdio.stdin))
                    .stdout(child_stream(stdio.stdout))
                    .stderr(child_stream(stdio.stderr));
                None
            }
            Streams::Piped { input } => {
                let stdin = match input {
                    Some(input) => {
                        let (stdin, child_stdin): (pipe::Sender, _) = self.pipe(call, "stdin")?;
                        command.stdin(child_stdin);
                        Some((stdin, input))
                    }
                    None => {
                        command.stdin(std::process::Stdio::null());
                        None
                    }
                };
                let (stdout, child_stdout): (pipe::Receiver, _) = self.pipe(call, "stdout")?;
                let (stderr, child_stderr): (pipe::Receiver, _) = self.pipe(call, "stderr")?;
                command.stdout(child_stdout).stderr(child_stderr);
                Some((stdin, stdout, stderr))
            }
        };

        let spawned_at = Instant::now();
        let child = command.spawn().map_err(|source| RuncError::Spawn {
            binary: self.binary.clone(),
            source,
        })?;
        let pid = child.id();
        // From here on, a dropped call kills the runtime (see the module docs).
        let mut guard = RuntimeGuard {
            reaper: &self.reaper,
            pid: pid as i32,
            exit: self.reaper.watch_spawned(pid as i32, spawned_at),
            exited: None,
            killed: false,
            command: call.name(),
            id,
            log: &self.log,
        };
        // Not waited on: the reaper reaps it. Dropping the command closes this process's copies
        // of the child's ends, so the pipes see EOF when the child (and its heirs) close theirs.
        drop(child);
        drop(command);
        debug!(self.log, "OCI runtime started";
            "command" => call.name(), "container_id" => id, "pid" => pid);

        let limit = call.timeout(&self.timeouts);
        let finished = tokio::time::timeout(limit, async {
            match piped {
                None => Ok::<_, RuncError>((guard.wait().await, Vec::new(), Vec::new())),
                Some((stdin, stdout, stderr)) => {
                    let (_, exit, stdout, stderr) = tokio::join!(
                        async {
                            if let Some((pipe, input)) = stdin {
                                // A write error means the runtime stopped reading, which it
                                // only does when it fails: its exit status and message say why.
                                let _ = write_all(pipe, input).await;
                            }
                        },
                        guard.wait(),
                        read_all(stdout),
                        read_all(stderr),
                    );
                    let stdout =
                        stdout.map_err(|source| self.pipe_error(call, "stdout", source))?;
                    let stderr =
                        stderr.map_err(|source| self.pipe_error(call, "stderr", source))?;
                    Ok((exit, stdout, stderr))
                }
            }
        })
        .await;
        let Ok(finished) = finished else {
            guard.kill();
            // The reaper reaps it; bounded, in case it cannot die at once.
            let _ = tokio::time::timeout(KILLED_GRACE, guard.wait()).await;
            return Err(RuncError::Timeout {
                command: self.command(call),
                id: id.to_owned(),
                after: limit,
                pid,
            });
        };
        let (exit, stdout, stderr) = finished?;
        let exit = exit.ok_or_else(|| RuncError::ReaperGone {
            command: self.command(call),
            id: id.to_owned(),
            pid,
        })?;
        debug!(self.log, "OCI runtime exited";
            "command" => call.name(), "container_id" => id, "pid" => pid, "status" => exit.status);
        if exit.status == 0 {
            return Ok(stdout);
        }

        let message = log_file
            .as_deref()
            .and_then(|path| read_log_from(path, log_start))
            .and_then(|log| last_log_error(&log))
            .or_else(|| stderr_message(&String::from_utf8_lossy(&stderr)))
            .unwrap_or_else(|| "no error message".to_owned());
        if call.on_existing_container() && is_not_found(&message) {
            return Err(RuncError::NotFound {
                command: self.command(call),
                id: id.to_owned(),
            });
        }
        Err(RuncError::Failed {
            command: self.command(call),
            id: id.to_owned(),
            status: exit.status,
            message,
        })
    }

    /// A pipe for one of the child's streams: (this end, the child's end) — read end first for
    /// stdout/stderr, write end first for stdin. Close-on-exec: only the copy `Command` dups
    /// onto 0/1/2 reaches the child.
    fn pipe<E: ParentEnd>(
        &self,
        call: &Call<'_>,
        stream: &'static str,
    ) -> Result<(E, std::process::Stdio), RuncError> {
        let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC)
            .map_err(|errno| self.pipe_error(call, stream, errno.into()))?;
        E::make(read, write).map_err(|source| self.pipe_error(call, stream, source))
    }

    fn pipe_error(
        &self,
        call: &Call<'_>,
        stream: &'static str,
        source: std::io::Error,
    ) -> RuncError {
        RuncError::Pipe {
            command: self.command(call),
            id: call.id().to_owned(),
            stream,
            source,
        }
    }

    fn parse<T: serde::de::DeserializeOwned>(
        &self,
        call: &Call<'_>,
        out: &[u8],
    ) -> Result<T, RuncError> {
        serde_json::from_slice(out).map_err(|source| RuncError::Parse {
            command: self.command(call),
            id: call.id().to_owned(),
            output: String::from_utf8_lossy(out).into_owned(),
            source,
        })
    }

    /// "runc create": the binary's file name and the subcommand, for error messages.
    fn command(&self, call: &Call<'_>) -> String {
        let binary = self
            .binary
            .file_name()
            .unwrap_or(self.binary.as_os_str())
            .to_string_lossy();
        format!("{binary} {}", call.name())
    }

    fn bundle_of(&self, id: &str) -> Option<PathBuf> {
        self.bundles().get(id).cloned()
    }

    fn bundles(&self) -> std::sync::MutexGuard<'_, HashMap<String, PathBuf>> {
        // Only inserts and removes run under the lock: a poisoned map is still consistent.
        self.bundles.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Reads a pid file written by the runtime (`--pid-file`): the pid, trimmed.
/// The environment variable systemd names its notification socket in. runc given one relays
/// the container's `sd_notify` through a socket of its own under its state directory, whose
/// path (`<root>/<64-hex id>/notify/notify.sock`) is longer than a unix socket address may be
/// under containerd's `/run/containerd/runc/<namespace>`: every create fails with "bind:
/// invalid argument". containerd under systemd (`Type=notify`) has it set and its shims
/// inherit it; containerd's own shim drops it for runc too (go-runc).
pub(crate) const NOTIFY_SOCKET_ENV: &str = "NOTIFY_SOCKET";

/// A command running the OCI runtime `binary`: in a process group of its own (so that a
/// call's guard can kill what the runtime started with it) and without systemd's
/// [`NOTIFY_SOCKET_ENV`].
fn runtime_command(binary: &Path) -> Command {
    let mut command = Command::new(binary);
    command.process_group(0).env_remove(NOTIFY_SOCKET_ENV);
    command
}

pub fn read_pid_file(path: &Path) -> Result<u32, RuncError> {
    let content = std::fs::read_to_string(path).map_err(|source| RuncError::PidFile {
        path: path.to_owned(),
        source,
    })?;
    match content.trim().parse::<u32>() {
        Ok(pid) if pid > 0 => Ok(pid),
        _ => Err(RuncError::BadPidFile {
            path: path.to_owned(),
            content,
        }),
    }
}

/// Kills the runtime's process group if its call ends (times out, or is dropped) before the
/// runtime's exit is in (module docs, "The guard").
struct RuntimeGuard<'a> {
    reaper: &'a Reaper,
    /// The runtime, leader of its own process group.
    pid: i32,
    /// Its exit, from the reaper.
    exit: oneshot::Receiver<Exit>,
    /// Its exit once received (the receiver must not be polled again after that).
    exited: Option<Exit>,
    /// Whether the group was killed already.
    killed: bool,
    command: &'static str,
    id: &'a str,
    log: &'a Logger,
}

impl RuntimeGuard<'_> {
    /// The runtime's exit; `None` if the reaper stopped first.
    async fn wait(&mut self) -> Option<Exit> {
        if self.exited.is_none() && !self.exit.is_terminated() {
            self.exited = (&mut self.exit).await.ok();
        }
        self.exited
    }

    /// SIGKILLs the runtime's group unless its exit is in.
    fn kill(&mut self) {
        if self.exited.is_some() || self.exit.is_terminated() || self.killed {
            return;
        }
        self.killed = true;
        if let Err(e) = self.reaper.kill_group(self.pid, &self.exit) {
            // Not expected (EPERM on our own child?); the call's own error says it timed out.
            warn!(self.log, "killing the OCI runtime's process group failed";
                "command" => self.command, "container_id" => self.id, "pid" => self.pid,
                "error" => %e);
        }
    }
}

impl Drop for RuntimeGuard<'_> {
    fn drop(&mut self) {
        if self.exited.is_some() || self.exit.is_terminated() || self.killed {
            return;
        }
        // The call was dropped while the runtime ran: nobody else will hear of it.
        self.kill();
        warn!(self.log, "OCI runtime call abandoned before the runtime ended; killed it and its process group";
            "command" => self.command, "container_id" => self.id, "pid" => self.pid);
    }
}

/// The streams of one runtime call.
enum Streams<'a> {
    /// `create` / `exec`: the container's streams become the runtime's 0/1/2.
    Container(Stdio),
    /// Everything else: stdout and stderr captured, `input` (if any) written to stdin.
    Piped { input: Option<&'a [u8]> },
}

impl Streams<'_> {
    fn piped() -> Self {
        Streams::Piped { input: None }
    }
}

/// One end of a pipe, kept by this process and driven by the tokio reactor.
trait ParentEnd: Sized {
    /// This end and the child's, from a fresh pipe's (read, write) ends.
    fn make(read: OwnedFd, write: OwnedFd) -> std::io::Result<(Self, std::process::Stdio)>;
}

impl ParentEnd for pipe::Receiver {
    fn make(read: OwnedFd, write: OwnedFd) -> std::io::Result<(Self, std::process::Stdio)> {
        Ok((pipe::Receiver::from_owned_fd(read)?, write.into()))
    }
}

impl ParentEnd for pipe::Sender {
    fn make(read: OwnedFd, write: OwnedFd) -> std::io::Result<(Self, std::process::Stdio)> {
        Ok((pipe::Sender::from_owned_fd(write)?, read.into()))
    }
}

fn child_stream(fd: Option<OwnedFd>) -> std::process::Stdio {
    fd.map_or_else(std::process::Stdio::null, Into::into)
}

async fn read_all(mut pipe: pipe::Receiver) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    pipe.read_to_end(&mut buf).await?;
    Ok(buf)
}

async fn write_all(mut pipe: pipe::Sender, input: &[u8]) -> std::io::Result<()> {
    pipe.write_all(input).await
    // Dropped here: the runtime sees EOF.
}

/// The exec process file, removed when dropped (on every path out of `exec`).
struct ProcessFile {
    path: PathBuf,
}

impl ProcessFile {
    fn write(path: PathBuf, content: &[u8]) -> Result<ProcessFile, RuncError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|source| RuncError::ProcessFile {
                path: path.clone(),
                source,
            })?;
        // Made by this call from here on: removed by the guard on every path out.
        let guard = ProcessFile { path };
        file.write_all(content)
            .map_err(|source| RuncError::ProcessFile {
                path: guard.path.clone(),
                source,
            })?;
        Ok(guard)
    }
}

impl Drop for ProcessFile {
    fn drop(&mut self) {
        // Nothing to do if it is gone already (or was never made).
        let _ = std::fs::remove_file(&self.path);
    }
}

/// `runc state`'s JSON, the fields used.
#[cfg(test)]
#[derive(serde::Deserialize)]
struct RawState {
    #[serde(default)]
    pid: u32,
    status: String,
}

#[cfg(test)]
mod tests;
