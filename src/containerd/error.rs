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
