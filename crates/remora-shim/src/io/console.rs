//! Terminals: the console socket runc connects to with `--console-socket`, the pty master it
//! sends back (SCM_RIGHTS), the terminal's window size, and the shim's private directory of
//! console sockets.

use std::io::{self, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::net::UnixListener;

use super::fd::{register, set_nonblocking};
use super::{lock, IoError, ProcessIo};

/// How long `start_copying` waits for runc's pty master; runc sends it before `create` / `exec`
/// returns, so it is normally already queued.
const MASTER_TIMEOUT: Duration = Duration::from_secs(10);
/// `sizeof(sockaddr_un.sun_path)`: a socket path must be shorter (it ends with a NUL).
pub(super) const SUN_PATH_LEN: usize = 108;
/// How many names `prepare` tries for a console socket before giving up.
const CONSOLE_SOCKET_TRIES: u32 = 16;

/// Numbers console sockets made by this process, so that concurrent `prepare`s in one work
/// dir never pick the same name (the pid separates shims).
static CONSOLE_SOCKET_SEQ: AtomicU64 = AtomicU64::new(0);

/// A unix listener runc connects to with `--console-socket`; its file is removed on drop.
pub(super) struct ConsoleSocket {
    pub(super) listener: Option<UnixListener>,
    pub(super) path: PathBuf,
}

impl Drop for ConsoleSocket {
    fn drop(&mut self) {
        // The listener is closed by its own drop; only the name is left on disk.
        let _ = std::fs::remove_file(&self.path);
    }
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
pub(super) fn bind_console_socket(dir: &Path) -> Result<ConsoleSocket, IoError> {
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

impl ProcessIo {
    /// Waits (bounded) for runc's connection on the console socket and takes the pty master
    /// it sends; the socket is removed afterwards.
    pub(super) async fn receive_console(&mut self) -> Result<Arc<AsyncFd<OwnedFd>>, IoError> {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_console_dir_is_made_private_and_a_wider_mode_is_fixed() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        let fresh = tmp.path().join("a/console");
        make_private_dir(&fresh).unwrap();
        assert_eq!(mode(&fresh), 0o700);
        std::fs::set_permissions(&fresh, std::fs::Permissions::from_mode(0o755)).unwrap();
        make_private_dir(&fresh).unwrap();
        assert_eq!(mode(&fresh), 0o700);
    }
}
