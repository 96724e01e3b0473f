//! `binary://` and `binary-v2://` logging binaries: started with the process's output pipes
//! on fds 3 and 4 (Go's `NewBinaryCmd` protocol), waited for until ready (fd 5), signalled
//! through a pidfd (never a pid that may have been reused).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::Duration;

use super::fd::{blocking_pipe, pipe, read_some, register};
use super::IoError;

/// How long `prepare` waits for a logging binary to say it is ready.
const LOGGER_READY_TIMEOUT: Duration = Duration::from_secs(10);
/// A `binary://` logging binary the shim started.
pub(super) struct LoggerProcess {
    pub(super) pid: i32,
    /// A pidfd, so signals reach this process even after the reaper reaped it and the pid was
    /// reused (they then fail with ESRCH). `None` on kernels without pidfd_open (< 5.3).
    pidfd: Option<OwnedFd>,
}

impl LoggerProcess {
    pub(super) fn signal(&self, signal: libc::c_int) {
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
pub(super) struct BinaryIo {
    pub(super) logger: LoggerProcess,
    /// The child's stdout (write end): the process's, or the terminal copy's.
    pub(super) stdout: OwnedFd,
    /// The child's stderr (write end).
    pub(super) stderr: OwnedFd,
}

pub(super) async fn start_binary(
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
