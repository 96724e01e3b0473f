//! systemd service notifications (`sd_notify`): `READY=1` once remora serves, `STOPPING=1`
//! when it starts shutting down.
//!
//! With `Type=notify` (the packaged `remora.service`), systemd counts the unit as started only
//! when the main process sends `READY=1` on the datagram socket named by `$NOTIFY_SOCKET`.
//! remora sends it after its first recovery pass, when the CRI server is up: a kubelet ordered
//! `After=remora.service` then never meets a runtime that answers `NotFound` for pods that
//! exist. The protocol is one datagram of `KEY=VALUE` lines to a unix socket; a name starting
//! with `@` is in the abstract namespace. That is small enough that no crate is needed
//! (libsystemd's `sd_notify` does the same).
//!
//! Without `$NOTIFY_SOCKET` (not started by systemd, or `Type=exec`) nothing is sent.

use std::ffi::{OsStr, OsString};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

use thiserror::Error;

/// The environment variable systemd sets for `Type=notify` services.
pub const NOTIFY_SOCKET_ENV: &str = "NOTIFY_SOCKET";

/// How long a notification may block when systemd's socket queue is full: systemd reads it
/// at once, so a longer wait means systemd is stuck, and remora must not stall with it.
const SEND_TIMEOUT: Duration = Duration::from_secs(2);

/// Failures of service notification. None is fatal: remora serves the same without systemd.
#[derive(Debug, Error)]
pub enum NotifyError {
    /// `$NOTIFY_SOCKET` is neither an absolute path nor an abstract name (`@name`).
    #[error("${NOTIFY_SOCKET_ENV} is {value:?}: not an absolute socket path or an @abstract name")]
    UnsupportedAddress {
        /// The variable's value.
        value: OsString,
    },
    /// The address is too long or otherwise not a unix socket address.
    #[error("${NOTIFY_SOCKET_ENV} {value:?} is not a usable unix socket address: {source}")]
    InvalidAddress {
        /// The variable's value.
        value: OsString,
        source: std::io::Error,
    },
    /// Creating the sending socket or sending the datagram failed.
    #[error("cannot send {state:?} to the service manager at {value:?}: {source}")]
    Send {
        /// The notification.
        state: String,
        /// `$NOTIFY_SOCKET`'s value.
        value: OsString,
        source: std::io::Error,
    },
}

/// Sends notifications to the service manager's socket.
#[derive(Debug)]
pub struct Notifier {
    /// `$NOTIFY_SOCKET` as given, for messages.
    value: OsString,
    addr: SocketAddr,
}

impl Notifier {
    /// The notifier `$NOTIFY_SOCKET` names, `None` when it is unset or empty.
    pub fn from_env() -> Result<Option<Notifier>, NotifyError> {
        match std::env::var_os(NOTIFY_SOCKET_ENV) {
            Some(value) if !value.is_empty() => Notifier::from_address(&value).map(Some),
            _ => Ok(None),
        }
    }

    /// A notifier for `value`, in `$NOTIFY_SOCKET`'s syntax: an absolute path, or `@name` for
    /// an abstract socket (the `@` stands for the leading NUL byte).
    pub fn from_address(value: &OsStr) -> Result<Notifier, NotifyError> {
        let bytes = value.as_bytes();
        let addr = match bytes.first() {
            Some(b'/') => SocketAddr::from_pathname(value),
            Some(b'@') => SocketAddr::from_abstract_name(&bytes[1..]),
            // systemd 253+ may also name an AF_VSOCK address ("vsock:CID:PORT"), used for
            // virtual machines; remora runs on the host.
            _ => {
                return Err(NotifyError::UnsupportedAddress {
                    value: value.to_owned(),
                })
            }
        }
        .map_err(|source| NotifyError::InvalidAddress {
            value: value.to_owned(),
            source,
        })?;
        Ok(Notifier {
            value: value.to_owned(),
            addr,
        })
    }

    /// Sends `state` (newline-separated `KEY=VALUE` assignments) as one datagram.
    pub fn notify(&self, state: &str) -> Result<(), NotifyError> {
        let send_err = |source| NotifyError::Send {
            state: state.to_owned(),
            value: self.value.clone(),
            source,
        };
        let socket = UnixDatagram::unbound().map_err(send_err)?;
        socket
            .set_write_timeout(Some(SEND_TIMEOUT))
            .map_err(send_err)?;
        let sent = socket
            .send_to_addr(state.as_bytes(), &self.addr)
            .map_err(send_err)?;
        // A datagram is sent whole or not at all; a short count would be a kernel surprise.
        if sent != state.len() {
            return Err(send_err(std::io::Error::new(
                std::io::ErrorKind::WriteZero,
                format!("sent {sent} of {} bytes", state.len()),
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receive(socket: &UnixDatagram) -> String {
        socket
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut buf = [0u8; 256];
        let n = socket.recv(&mut buf).unwrap();
        String::from_utf8(buf[..n].to_vec()).unwrap()
    }

    #[test]
    fn sends_one_datagram_to_a_path_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let listener = UnixDatagram::bind(&path).unwrap();
        let notifier = Notifier::from_address(path.as_os_str()).unwrap();
        notifier.notify("READY=1").unwrap();
        notifier.notify("STOPPING=1\nSTATUS=bye").unwrap();
        assert_eq!(receive(&listener), "READY=1");
        assert_eq!(receive(&listener), "STOPPING=1\nSTATUS=bye");
    }

    #[test]
    fn at_sign_names_an_abstract_socket() {
        // Abstract names are host-wide (per network namespace): make this one unique.
        let name = format!("remora-notify-test-{}", std::process::id());
        let listener =
            UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap())
                .unwrap();
        let notifier = Notifier::from_address(OsStr::new(&format!("@{name}"))).unwrap();
        notifier.notify("READY=1").unwrap();
        assert_eq!(receive(&listener), "READY=1");
    }

    #[test]
    fn relative_and_vsock_addresses_are_refused() {
        for value in ["notify.sock", "vsock:2:1234"] {
            match Notifier::from_address(OsStr::new(value)) {
                Err(NotifyError::UnsupportedAddress { value: v }) => assert_eq!(v, value),
                other => panic!("{value}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_path_too_long_for_a_socket_is_refused() {
        let long = format!("/{}", "x".repeat(200));
        assert!(matches!(
            Notifier::from_address(OsStr::new(&long)),
            Err(NotifyError::InvalidAddress { .. })
        ));
    }

    #[test]
    fn sending_to_a_missing_socket_fails_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent.sock");
        let notifier = Notifier::from_address(path.as_os_str()).unwrap();
        let err = notifier.notify("READY=1").unwrap_err();
        assert!(matches!(err, NotifyError::Send { .. }), "{err:?}");
        assert!(err.to_string().contains("absent.sock"), "{err}");
    }
}
