//! The copy loops (an output source to its sink, the stdin FIFO to the process) and the
//! non-blocking fd plumbing they run on: pipes, reactor registration, reads and writes that
//! wait for readiness.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use slog::{debug, warn, Logger};
use tokio::io::unix::AsyncFd;

use super::target::Sink;
use super::{IoError, Shared};

/// Size of a copy buffer: `PIPE_BUF`, so a chunk written to a pipe or FIFO is written whole.
const COPY_BUF: usize = 4096;
/// Makes a pipe; `shim_reads` says which end is the shim's, made non-blocking. Returns
/// (shim's end, child's end), both close-on-exec.
pub(super) fn pipe(stream: &'static str, shim_reads: bool) -> Result<(OwnedFd, OwnedFd), IoError> {
    let (r, w) = blocking_pipe(stream)?;
    let (shim, child) = if shim_reads { (r, w) } else { (w, r) };
    set_nonblocking(&shim).map_err(|source| IoError::Pipe { stream, source })?;
    Ok((shim, child))
}

/// Makes a pipe with both ends blocking, close-on-exec: (read end, write end).
pub(super) fn blocking_pipe(stream: &'static str) -> Result<(OwnedFd, OwnedFd), IoError> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| IoError::Pipe {
        stream,
        source: e.into(),
    })
}

pub(super) fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: fcntl on an fd we own, with integer arguments only.
    unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

pub(super) fn register(
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

/// Reads what is there (0 at EOF), waiting for readiness.
pub(super) async fn read_some(fd: &AsyncFd<OwnedFd>, buf: &mut [u8]) -> io::Result<usize> {
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
pub(super) async fn write_all(fd: &AsyncFd<OwnedFd>, mut buf: &[u8]) -> io::Result<()> {
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
pub(super) async fn copy_out(
    src: &AsyncFd<OwnedFd>,
    is_pty: bool,
    sink: &Sink,
    stream: &str,
    log: &Logger,
) {
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
pub(super) async fn copy_in(src: &AsyncFd<OwnedFd>, dst: &AsyncFd<OwnedFd>, log: &Logger) {
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
pub(super) struct OutputDone(pub(super) Arc<Shared>);

impl Drop for OutputDone {
    fn drop(&mut self) {
        self.0
            .outputs_left
            .send_modify(|n| *n = n.saturating_sub(1));
    }
}
