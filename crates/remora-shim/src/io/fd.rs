//! The non-blocking fd plumbing the copies, the console and the loggers run on: pipes, the
//! tokio reactor's registration, reads and writes that wait for readiness.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use tokio::io::unix::AsyncFd;

use super::IoError;

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
