//! remora's typed errors, and the one place where they become gRPC statuses.
//!
//! Each failure has a named variant (no catch-all string variant). Library code returns these;
//! only `main` uses `anyhow`. [`CriError`] is what CRI operations return; its
//! `From<CriError> for tonic::Status` impl below is the single mapping to gRPC codes.

use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;
use tonic::Code;

use crate::images::pull::PullError;
use crate::images::registry::client::RegistryError;
use crate::lifecycle::container::ContainerError;
use crate::lifecycle::sandbox::SandboxError;
use crate::store::StoreError;

/// A config file that cannot be used.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML, has an unknown key, or a value of the wrong type.
    #[error("invalid config in {origin}: {message}")]
    Parse {
        /// The file (or "built-in defaults").
        origin: String,
        /// The parser's message, which names the key and line.
        message: String,
    },
    /// A value that parses but cannot work.
    #[error("invalid config: `{key}` {reason}")]
    Invalid {
        /// Dotted key name, e.g. `containerd.namespace`.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// Failures setting up or running the CRI socket server.
#[derive(Debug, Error)]
pub enum ServerError {
    /// Another live remora holds the socket's lock.
    #[error("another remora (pid {pid}) is already serving on {}; refusing to start", socket.display())]
    AlreadyRunning {
        /// The contested socket.
        socket: PathBuf,
        /// The holder's pid as written in the lock file ("unknown" if unreadable).
        pid: String,
    },
    /// A file-system step of the socket setup failed.
    #[error("cannot {action} {}: {source}", path.display())]
    Socket {
        /// What was being done ("create directory", "lock", "bind", ...).
        action: &'static str,
        /// The path involved.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Installing a signal handler failed.
    #[error("cannot install {signal} handler: {source}")]
    Signal {
        /// The signal.
        signal: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// The registry client could not be set up (TLS backend).
    #[error("cannot set up the registry client: {0}")]
    Registry(Box<RegistryError>),
    /// The digest resolver's settings are unusable.
    #[error("invalid [images] resolver settings: {0}")]
    Resolver(#[from] crate::images::resolver::ConfigError),
    /// The gRPC server stopped with an error.
    #[error("CRI gRPC server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
}

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

/// The error of a CRI operation. Converted to a gRPC status only by `From<CriError>`.
#[derive(Debug, Error)]
pub enum CriError {
    /// The RPC is part of CRI v1 but remora does not implement it yet.
    #[error("{service}/{rpc} is not implemented by remora yet")]
    Unimplemented {
        /// `RuntimeService` or `ImageService`.
        service: &'static str,
        /// The RPC name.
        rpc: &'static str,
    },
    /// containerd could not be reached or failed.
    #[error(transparent)]
    Containerd(#[from] ContainerdError),
    /// The caller's deadline passed before the operation finished.
    #[error("{rpc}: deadline exceeded")]
    DeadlineExceeded {
        /// The RPC.
        rpc: &'static str,
    },
    /// A request field is missing or malformed.
    #[error("invalid {what}: {reason}")]
    InvalidArgument {
        /// The field, e.g. `image.image`.
        what: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// An image pull failed.
    #[error("pulling image failed: {0}")]
    Pull(Box<PullError>),
    /// The request could not be converted (a missing or malformed field).
    #[error("invalid request: {0}")]
    Convert(#[from] crate::cri::convert::ConvertError),
    /// A pod sandbox operation failed.
    #[error(transparent)]
    Sandbox(Box<SandboxError>),
    /// A container operation failed.
    #[error(transparent)]
    Container(Box<ContainerError>),
    /// The sandbox or container index refused.
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn pull_code(e: &PullError) -> Code {
    match e {
        PullError::Reference(_) => Code::InvalidArgument,
        PullError::Registry(r) => match r {
            RegistryError::NotFound { .. } => Code::NotFound,
            RegistryError::AccessDenied { .. } => Code::PermissionDenied,
            RegistryError::Verify { .. } => Code::DataLoss,
            r if r.is_retriable() => Code::Unavailable,
            RegistryError::Stalled { .. } => Code::Unavailable,
            _ => Code::Unknown,
        },
        PullError::Containerd { source, .. } => containerd_error_code(source),
        PullError::ShuttingDown { .. } => Code::Unavailable,
        PullError::Manifest { .. } | PullError::Unpack { .. } => Code::FailedPrecondition,
    }
}

fn containerd_error_code(e: &ContainerdError) -> Code {
    match e {
        ContainerdError::Timeout { .. } => Code::Unavailable,
        ContainerdError::Call { code, .. } => containerd_code(*code),
    }
}

fn store_code(e: &StoreError) -> Code {
    match e {
        StoreError::NotFound { .. } => Code::NotFound,
        StoreError::AlreadyExists { .. } => Code::AlreadyExists,
        StoreError::Ambiguous { .. } => Code::InvalidArgument,
        StoreError::Transition(_) => Code::FailedPrecondition,
    }
}

impl CriError {
    /// The gRPC code this error maps to.
    pub fn code(&self) -> Code {
        match self {
            CriError::Unimplemented { .. } => Code::Unimplemented,
            CriError::Containerd(ContainerdError::Timeout { .. }) => Code::Unavailable,
            CriError::Containerd(ContainerdError::Call { code, .. }) => containerd_code(*code),
            CriError::InvalidArgument { .. } => Code::InvalidArgument,
            CriError::DeadlineExceeded { .. } => Code::DeadlineExceeded,
            CriError::Pull(e) => pull_code(e),
            CriError::Convert(_) => Code::InvalidArgument,
            CriError::Store(e) => store_code(e),
            CriError::Container(e) => match e.as_ref() {
                ContainerError::SandboxNotFound(_) | ContainerError::ImageNotFound(_) => {
                    Code::NotFound
                }
                ContainerError::SandboxNotReady(_) | ContainerError::NotRunning(_) => {
                    Code::FailedPrecondition
                }
                ContainerError::EmptyCommand => Code::InvalidArgument,
                ContainerError::ExecTimeout(_) => Code::DeadlineExceeded,
                ContainerError::Name(_) => Code::AlreadyExists,
                ContainerError::Spec(_) => Code::InvalidArgument,
                ContainerError::Containerd(c) => containerd_error_code(c),
                ContainerError::Store(st) => store_code(st),
                ContainerError::Transition(_) => Code::FailedPrecondition,
                ContainerError::ImageConfig { .. }
                | ContainerError::Rootfs(_)
                | ContainerError::Host { .. }
                | ContainerError::Encode(_)
                | ContainerError::Aborted(_)
                | ContainerError::Journal { .. } => Code::Internal,
                ContainerError::Failpoint(_) => Code::Unavailable,
            },
            CriError::Sandbox(e) => match e.as_ref() {
                SandboxError::UnknownRuntimeHandler(_) => Code::InvalidArgument,
                SandboxError::Name(_) => Code::AlreadyExists,
                SandboxError::Image(p) => pull_code(p),
                SandboxError::Spec(_) => Code::InvalidArgument,
                SandboxError::Containerd(c) => containerd_error_code(c),
                SandboxError::Store(st) => store_code(st),
                SandboxError::Id(_)
                | SandboxError::ImageConfig { .. }
                | SandboxError::Netns(_)
                | SandboxError::Network(_)
                | SandboxError::Files(_)
                | SandboxError::Encode(_)
                | SandboxError::Aborted(_)
                | SandboxError::Container(_)
                | SandboxError::Journal { .. } => Code::Internal,
                SandboxError::Failpoint(_) => Code::Unavailable,
            },
        }
    }
}

impl From<PullError> for CriError {
    fn from(e: PullError) -> Self {
        CriError::Pull(Box::new(e))
    }
}

impl From<ContainerError> for CriError {
    fn from(e: ContainerError) -> Self {
        CriError::Container(Box::new(e))
    }
}

impl From<SandboxError> for CriError {
    fn from(e: SandboxError) -> Self {
        CriError::Sandbox(Box::new(e))
    }
}

fn containerd_code(code: Code) -> Code {
    match code {
        // Transport failures and containerd shutting down are retriable for kubelet.
        Code::Unavailable | Code::Unknown | Code::Cancelled => Code::Unavailable,
        other => other,
    }
}

impl From<CriError> for tonic::Status {
    fn from(e: CriError) -> Self {
        tonic::Status::new(e.code(), e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unimplemented_names_the_rpc() {
        let s: tonic::Status = CriError::Unimplemented {
            service: "RuntimeService",
            rpc: "RunPodSandbox",
        }
        .into();
        assert_eq!(s.code(), Code::Unimplemented);
        assert!(
            s.message().contains("RuntimeService/RunPodSandbox"),
            "{}",
            s.message()
        );
    }

    #[test]
    fn containerd_transport_failure_is_unavailable() {
        let s: tonic::Status = CriError::from(ContainerdError::Call {
            address: "/run/c.sock".into(),
            op: "Version.Version",
            code: Code::Unknown,
            message: "transport error".into(),
        })
        .into();
        assert_eq!(s.code(), Code::Unavailable);
        assert!(s.message().contains("/run/c.sock"));
        let s: tonic::Status = CriError::from(ContainerdError::Call {
            address: "/run/c.sock".into(),
            op: "Containers.Get",
            code: Code::NotFound,
            message: "no such container".into(),
        })
        .into();
        assert_eq!(s.code(), Code::NotFound);
    }
}
