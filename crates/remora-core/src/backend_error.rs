//! The error of a call to the backend (containerd), in the words of the ports that make the
//! calls (`lifecycle::backend`, `images::backend`): a leaf (std only), so the core decides on
//! containerd's answers without knowing gRPC. The containerd adapter makes one from a
//! `tonic::Status` (`containerd::error`), and the CRI adapter turns one into a gRPC code
//! (`cri::error`).

use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;

/// A failed call to the backend.
#[derive(Debug, Error, Clone)]
pub enum BackendError {
    /// containerd did not answer within the deadline.
    #[error("containerd at {} did not answer within {after:?}", address.display())]
    Timeout {
        /// containerd's socket.
        address: PathBuf,
        /// The deadline.
        after: Duration,
    },
    /// The call failed (connection refused, socket missing, or an error answer).
    #[error("containerd at {} failed {op}: {message}", address.display())]
    Call {
        /// containerd's socket.
        address: PathBuf,
        /// The containerd RPC, e.g. `Version.Version`.
        op: &'static str,
        /// What containerd (or the transport) answered.
        code: BackendCode,
        /// Its message, including the transport's cause when the connection failed.
        message: String,
    },
}

/// What a failed call answered: containerd's error classes (its `errdefs`, which it sends as
/// gRPC codes), one for each code a failed call can carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendCode {
    /// The call was cancelled.
    Cancelled,
    /// An error containerd does not classify (an OCI runtime's refusal, a shim's error).
    Unknown,
    /// The request was malformed.
    InvalidArgument,
    /// The call's deadline passed.
    DeadlineExceeded,
    /// The object does not exist.
    NotFound,
    /// The object already exists.
    AlreadyExists,
    /// The caller may not do this.
    PermissionDenied,
    /// A resource (space, a quota) ran out.
    ResourceExhausted,
    /// The object is not in a state that allows the call.
    FailedPrecondition,
    /// The call was aborted (a conflict).
    Aborted,
    /// A value was out of range.
    OutOfRange,
    /// containerd does not implement the call.
    Unimplemented,
    /// containerd failed internally.
    Internal,
    /// containerd (or the transport to it) is unavailable for now.
    Unavailable,
    /// Data was lost or corrupted.
    DataLoss,
    /// The caller is not authenticated.
    Unauthenticated,
}

/// gRPC's numbering of the codes (containerd's and NRI's plugins' wire codes): the one table
/// both directions read.
const GRPC_NUMBERS: [(i32, BackendCode); 16] = [
    (1, BackendCode::Cancelled),
    (2, BackendCode::Unknown),
    (3, BackendCode::InvalidArgument),
    (4, BackendCode::DeadlineExceeded),
    (5, BackendCode::NotFound),
    (6, BackendCode::AlreadyExists),
    (7, BackendCode::PermissionDenied),
    (8, BackendCode::ResourceExhausted),
    (9, BackendCode::FailedPrecondition),
    (10, BackendCode::Aborted),
    (11, BackendCode::OutOfRange),
    (12, BackendCode::Unimplemented),
    (13, BackendCode::Internal),
    (14, BackendCode::Unavailable),
    (15, BackendCode::DataLoss),
    (16, BackendCode::Unauthenticated),
];

impl BackendCode {
    /// The code gRPC's number `n` stands for: `None` for 0 (OK, no error), `Unknown` for a
    /// number gRPC does not define, as gRPC reads one.
    pub fn from_grpc_number(n: i32) -> Option<BackendCode> {
        if n == 0 {
            return None;
        }
        Some(
            GRPC_NUMBERS
                .iter()
                .find(|(number, _)| *number == n)
                .map_or(BackendCode::Unknown, |(_, code)| *code),
        )
    }

    /// gRPC's number for this code.
    pub fn grpc_number(self) -> i32 {
        GRPC_NUMBERS
            .iter()
            .find(|(_, code)| *code == self)
            // Every variant is in the table (the test `every_code_has_one_number` checks it);
            // 2 is gRPC's Unknown.
            .map_or(2, |(number, _)| *number)
    }
}

impl BackendError {
    /// Whether containerd answered that the object does not exist (lifecycle treats a task or
    /// record that is already gone as done).
    pub fn is_not_found(&self) -> bool {
        self.code() == Some(BackendCode::NotFound)
    }

    /// Whether containerd answered that the object already exists (an unpack that lost the
    /// race to commit a snapshot chain another pull committed first).
    pub fn is_already_exists(&self) -> bool {
        self.code() == Some(BackendCode::AlreadyExists)
    }

    /// Whether containerd (or the transport to it) answered that it is unavailable for now:
    /// a content ref locked by another writer, or containerd not reachable.
    pub fn is_unavailable(&self) -> bool {
        self.code() == Some(BackendCode::Unavailable)
    }

    /// Whether containerd refused to commit written content because its digest or size did
    /// not match the descriptor (`Content.Write` answering `FailedPrecondition`): the bytes
    /// written were wrong, not merely incomplete.
    pub fn is_content_commit_refused(&self) -> bool {
        match self {
            BackendError::Call { op, code, .. } => {
                *op == "Content.Write" && *code == BackendCode::FailedPrecondition
            }
            BackendError::Timeout { .. } => false,
        }
    }

    /// containerd's message for a failed call; `None` for a timeout.
    pub fn message(&self) -> Option<&str> {
        match self {
            BackendError::Timeout { .. } => None,
            BackendError::Call { message, .. } => Some(message),
        }
    }

    /// Whether containerd answered that its connection to the task's shim is closed: the
    /// shim died while containerd kept running. containerd passes its ttrpc client's
    /// `ErrClosed` on unmapped (code Unknown, "ttrpc: closed"); the transport failing between
    /// remora and containerd is `Unavailable` instead, so the two are told apart.
    pub fn is_shim_gone(&self) -> bool {
        match self {
            BackendError::Call { code, message, .. } => {
                *code == BackendCode::Unknown && message.contains("ttrpc: closed")
            }
            BackendError::Timeout { .. } => false,
        }
    }

    /// What containerd (or the transport) answered; `None` for a timeout.
    pub fn code(&self) -> Option<BackendCode> {
        match self {
            BackendError::Timeout { .. } => None,
            BackendError::Call { code, .. } => Some(*code),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(code: BackendCode) -> BackendError {
        BackendError::Call {
            address: "/run/c.sock".into(),
            op: "Tasks.Kill",
            code,
            message: "m".into(),
        }
    }

    #[test]
    fn a_closed_shim_connection_is_told_apart_from_an_unreachable_containerd() {
        let closed = BackendError::Call {
            address: "/run/c.sock".into(),
            op: "Tasks.Wait",
            code: BackendCode::Unknown,
            message: "ttrpc: closed".into(),
        };
        assert!(closed.is_shim_gone());
        assert!(!call(BackendCode::Unavailable).is_shim_gone());
        assert!(!call(BackendCode::Unknown).is_shim_gone());
        let transport = BackendError::Call {
            address: "/run/c.sock".into(),
            op: "Tasks.Wait",
            code: BackendCode::Unavailable,
            message: "ttrpc: closed".into(),
        };
        assert!(!transport.is_shim_gone());
    }

    #[test]
    fn every_code_has_one_number() {
        for (number, code) in GRPC_NUMBERS {
            assert_eq!(code.grpc_number(), number, "{code:?}");
            assert_eq!(BackendCode::from_grpc_number(number), Some(code));
        }
        assert_eq!(BackendCode::from_grpc_number(0), None);
        assert_eq!(
            BackendCode::from_grpc_number(17),
            Some(BackendCode::Unknown)
        );
        assert_eq!(
            BackendCode::from_grpc_number(-1),
            Some(BackendCode::Unknown)
        );
    }

    #[test]
    fn not_found_is_told_apart() {
        assert!(call(BackendCode::NotFound).is_not_found());
        assert!(!call(BackendCode::Unavailable).is_not_found());
        let timeout = BackendError::Timeout {
            address: "/run/c.sock".into(),
            after: Duration::from_secs(1),
        };
        assert!(!timeout.is_not_found());
        assert_eq!(timeout.code(), None);
    }

    #[test]
    fn already_exists_and_unavailable_are_told_apart() {
        assert!(call(BackendCode::AlreadyExists).is_already_exists());
        assert!(!call(BackendCode::NotFound).is_already_exists());
        assert!(call(BackendCode::Unavailable).is_unavailable());
        assert!(!call(BackendCode::Unknown).is_unavailable());
        let timeout = BackendError::Timeout {
            address: "/run/c.sock".into(),
            after: Duration::from_secs(1),
        };
        assert!(!timeout.is_already_exists());
        assert!(!timeout.is_unavailable());
        assert_eq!(timeout.message(), None);
    }

    #[test]
    fn only_a_refused_content_commit_is_one() {
        let refused = |op, code| BackendError::Call {
            address: "/run/c.sock".into(),
            op,
            code,
            message: "unexpected commit digest".into(),
        };
        assert!(
            refused("Content.Write", BackendCode::FailedPrecondition).is_content_commit_refused()
        );
        assert!(!refused("Content.Write", BackendCode::NotFound).is_content_commit_refused());
        assert!(
            !refused("Leases.Delete", BackendCode::FailedPrecondition).is_content_commit_refused()
        );
        assert_eq!(
            refused("Content.Write", BackendCode::NotFound).message(),
            Some("unexpected commit digest")
        );
    }
}
