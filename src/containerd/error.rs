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

    /// Whether containerd answered that the object already exists (an unpack that lost the
    /// race to commit a snapshot chain another pull committed first).
    pub fn is_already_exists(&self) -> bool {
        self.code() == Some(Code::AlreadyExists)
    }

    /// Whether containerd (or the transport to it) answered that it is unavailable for now:
    /// a content ref locked by another writer, or containerd not reachable.
    pub fn is_unavailable(&self) -> bool {
        self.code() == Some(Code::Unavailable)
    }

    /// Whether containerd refused to commit written content because its digest or size did
    /// not match the descriptor (`Content.Write` answering `FailedPrecondition`): the bytes
    /// written were wrong, not merely incomplete.
    pub fn is_content_commit_refused(&self) -> bool {
        match self {
            ContainerdError::Call { op, code, .. } => {
                *op == "Content.Write" && *code == Code::FailedPrecondition
            }
            ContainerdError::Timeout { .. } => false,
        }
    }

    /// containerd's message for a failed call; `None` for a timeout.
    pub fn message(&self) -> Option<&str> {
        match self {
            ContainerdError::Timeout { .. } => None,
            ContainerdError::Call { message, .. } => Some(message),
        }
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

    #[test]
    fn already_exists_and_unavailable_are_told_apart() {
        assert!(call(Code::AlreadyExists).is_already_exists());
        assert!(!call(Code::NotFound).is_already_exists());
        assert!(call(Code::Unavailable).is_unavailable());
        assert!(!call(Code::Unknown).is_unavailable());
        let timeout = ContainerdError::Timeout {
            address: "/run/c.sock".into(),
            after: Duration::from_secs(1),
        };
        assert!(!timeout.is_already_exists());
        assert!(!timeout.is_unavailable());
        assert_eq!(timeout.message(), None);
    }

    #[test]
    fn only_a_refused_content_commit_is_one() {
        let refused = |op, code| ContainerdError::Call {
            address: "/run/c.sock".into(),
            op,
            code,
            message: "unexpected commit digest".into(),
        };
        assert!(refused("Content.Write", Code::FailedPrecondition).is_content_commit_refused());
        assert!(!refused("Content.Write", Code::NotFound).is_content_commit_refused());
        assert!(!refused("Leases.Delete", Code::FailedPrecondition).is_content_commit_refused());
        assert_eq!(
            refused("Content.Write", Code::NotFound).message(),
            Some("unexpected commit digest")
        );
    }
}
