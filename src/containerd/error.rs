//! The error of a call to containerd: a leaf (std and tonic only), so every layer above may
//! use it without a cycle.

use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;
use tonic::Code;

/// A failed call to containerd.
#[derive(Debug, Error, Clone)]
pub enum ContainerdError {
    /// containerd did not answer within the deadline.
    #[error("containerd at {} did not answer within {after:?}", address.display())]
    Timeout {
        /// containerd's socket.
        address: PathBuf,
        /// The deadline.
        after: Duration,
    },
    /// The call failed (connection refused, socket missing, or an error status).
    #[error("containerd at {} failed {op}: {message}", address.display())]
    Call {
        /// containerd's socket.
        address: PathBuf,
        /// The containerd RPC, e.g. `Version.Version`.
        op: &'static str,
        /// The gRPC code containerd (or the transport) returned.
        code: Code,
        /// Its message, including the transport's cause when the connection failed.
        message: String,
    },
}

impl ContainerdError {
    /// Whether containerd answered that the object does not exist (lifecycle treats a task or
    /// record that is already gone as done).
    pub fn is_not_found(&self) -> bool {
        self.code() == Some(Code::NotFound)
    }

    /// Whether containerd answered that its connection to the task's shim is closed: the
    /// shim died while containerd kept running. containerd passes its ttrpc client's
    /// `ErrClosed` on unmapped (code Unknown, "ttrpc: closed"); the transport failing between
    /// remora and containerd is `Unavailable` instead, so the two are told apart.
    pub fn is_shim_gone(&self) -> bool {
        match self {
            ContainerdError::Call { code, message, .. } => {
                *code == Code::Unknown && message.contains("ttrpc: closed")
            }
            ContainerdError::Timeout { .. } => false,
        }
    }

    /// The gRPC code containerd (or the transport) returned; `None` for a timeout.
    pub fn code(&self) -> Option<Code> {
        match self {
            ContainerdError::Timeout { .. } => None,
            ContainerdError::Call { code, .. } => Some(*code),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(code: Code) -> ContainerdError {
        ContainerdError::Call {
            address: "/run/c.sock".into(),
            op: "Tasks.Kill",
            code,
            message: "m".into(),
        }
    }

    #[test]
    fn a_closed_shim_connection_is_told_apart_from_an_unreachable_containerd() {
        let closed = ContainerdError::Call {
            address: "/run/c.sock".into(),
            op: "Tasks.Wait",
            code: Code::Unknown,
            message: "ttrpc: closed".into(),
        };
        assert!(closed.is_shim_gone());
        assert!(!call(Code::Unavailable).is_shim_gone());
        assert!(!call(Code::Unknown).is_shim_gone());
        let transport = ContainerdError::Call {
            address: "/run/c.sock".into(),
            op: "Tasks.Wait",
            code: Code::Unavailable,
            message: "ttrpc: closed".into(),
        };
        assert!(!transport.is_shim_gone());
    }

    #[test]
    fn not_found_is_told_apart() {
        assert!(call(Code::NotFound).is_not_found());
        assert!(!call(Code::Unavailable).is_not_found());
        let timeout = ContainerdError::Timeout {
            address: "/run/c.sock".into(),
            after: Duration::from_secs(1),
        };
        assert!(!timeout.is_not_found());
        assert_eq!(timeout.code(), None);
    }
}
