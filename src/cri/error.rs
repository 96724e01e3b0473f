//! The error of a CRI operation, and the one place where it becomes a gRPC status
//! (`From<CriError> for tonic::Status`).
//!
//! Each failure has a named variant (no catch-all string variant). The layers below return
//! their own errors (`BackendError`, `PullError`, `SandboxError`, `ContainerError`,
//! `StoreError`); this module maps them to gRPC codes.

use crate::cdi::CdiError;
use thiserror::Error;
use tonic::Code;

use crate::backend_error::{BackendCode, BackendError};
use crate::images::pull::{PullError, TransferFailure};
use crate::images::registry::client::RegistryError;
use crate::io::cri_log::LogError;
use crate::lifecycle::sandbox_stats::StatsError;
use crate::lifecycle::ContainerError;
use crate::lifecycle::SandboxError;
use crate::net::cni::template::TemplateError;
use crate::store::StoreError;

/// A CRI request that cannot be mapped to domain types. Reported as `INVALID_ARGUMENT`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConvertError {
    /// A required field is absent or empty.
    #[error("{field} is required")]
    Missing {
        /// CRI path of the field, e.g. `config.metadata.name`.
        field: String,
    },
    /// An enum field holds a number the CRI proto does not define.
    #[error("{field} has unknown value {value}")]
    UnknownEnum {
        /// CRI path of the field.
        field: String,
        /// The number received.
        value: i32,
    },
    /// A field's value is malformed.
    #[error("invalid {field} {value:?}: {reason}")]
    Invalid {
        /// CRI path of the field.
        field: String,
        /// The value received.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An env value (bytes in CRI) is not UTF-8, which an OCI runtime config cannot carry.
    #[error("{field} (env {key:?}) is not valid UTF-8: an OCI runtime config cannot carry it")]
    EnvNotUtf8 {
        /// CRI path of the value, e.g. `config.envs[3].value`.
        field: String,
        /// The env variable's name (the value is not shown: it may be a secret).
        key: String,
    },
    /// The field asks for a feature remora does not implement.
    #[error("{field} is not supported by remora")]
    Unsupported {
        /// CRI path of the field.
        field: String,
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
    Containerd(#[from] BackendError),
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
    Convert(#[from] ConvertError),
    /// A pod sandbox operation failed.
    #[error(transparent)]
    Sandbox(Box<SandboxError>),
    /// A container operation failed.
    #[error(transparent)]
    Container(Box<ContainerError>),
    /// The sandbox or container index refused.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A pod's stats could not be read.
    #[error(transparent)]
    Stats(#[from] StatsError),
    /// The streaming server cannot take another request now.
    #[error(transparent)]
    Streaming(#[from] crate::stream::token::TokenError),
    /// The CNI config template could not be applied (`UpdateRuntimeConfig`).
    #[error(transparent)]
    CniTemplate(TemplateError),
    /// A `GetContainerEvents` subscriber fell behind and missed events: its stream ends so
    /// that the client relists.
    #[error(transparent)]
    EventsLost(#[from] crate::lifecycle::container_events::EventsLost),
    /// Blocking work on remora's behalf panicked or was cancelled.
    #[error("{what} was aborted")]
    Aborted {
        /// What was being done.
        what: &'static str,
    },
}

fn pull_code(e: &PullError) -> Code {
    match e {
        PullError::Reference(_) => Code::InvalidArgument,
        PullError::Registry(r) => match r {
            RegistryError::NotFound { .. } => Code::NotFound,
            RegistryError::AccessDenied { .. } => Code::PermissionDenied,
            RegistryError::Verify { .. } => Code::DataLoss,
            // Like the oversized manifests and configs of `PullError::Manifest`: the image is
            // one remora will not read into memory, whatever the caller retries.
            RegistryError::TooLarge { .. } => Code::FailedPrecondition,
            // A registry redirecting where remora will not go (https → http): its setup, not
            // a passing failure.
            RegistryError::RedirectRefused { .. } => Code::FailedPrecondition,
            // A token answer over remora's limit: as an oversized manifest.
            RegistryError::Auth {
                source: crate::images::registry::auth::AuthError::TokenTooLarge { .. },
                ..
            } => Code::FailedPrecondition,
            r if r.is_retriable() => Code::Unavailable,
            RegistryError::Stalled { .. } => Code::Unavailable,
            _ => Code::Unknown,
        },
        PullError::Containerd { source, .. } => containerd_error_code(source),
        PullError::Transfer {
            failure, source, ..
        } => match failure {
            // As when remora's own client finds the bytes wrong, or the registry missing them.
            TransferFailure::Verify => Code::DataLoss,
            TransferFailure::NotFound => Code::NotFound,
            TransferFailure::Unreachable => Code::Unavailable,
            TransferFailure::Other => containerd_error_code(source),
        },
        PullError::TransferStalled { .. } => Code::Unavailable,
        PullError::DownloadsBusy { .. } | PullError::LayerDeadline { .. } => Code::Unavailable,
        PullError::ShuttingDown { .. } => Code::Unavailable,
        // A lookup that panicked or hung: the registry's fault, worth retrying later.
        PullError::Resolver { .. } => Code::Unavailable,
        // Includes `ManifestError::TooLarge`: a manifest or config over remora's limits.
        PullError::Manifest { .. } | PullError::Unpack { .. } => Code::FailedPrecondition,
    }
}

fn containerd_error_code(e: &BackendError) -> Code {
    match e {
        BackendError::Timeout { .. } => Code::Unavailable,
        BackendError::Call { code, .. } => containerd_code(*code),
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
            CriError::Containerd(BackendError::Timeout { .. }) => Code::Unavailable,
            CriError::Containerd(BackendError::Call { code, .. }) => containerd_code(*code),
            CriError::InvalidArgument { .. } => Code::InvalidArgument,
            CriError::Pull(e) => pull_code(e),
            CriError::Convert(_) => Code::InvalidArgument,
            CriError::Store(e) => store_code(e),
            CriError::Streaming(crate::stream::token::TokenError::Full(_)) => {
                Code::ResourceExhausted
            }
            CriError::Streaming(crate::stream::token::TokenError::Random(_)) => Code::Internal,
            CriError::Container(e) => container_code(e),
            CriError::Sandbox(e) => sandbox_code(e),
            CriError::CniTemplate(e) => match e {
                TemplateError::InvalidCidr { .. } => Code::InvalidArgument,
                TemplateError::ReadTemplate { .. } | TemplateError::NotJson { .. } => {
                    Code::FailedPrecondition
                }
                TemplateError::Write { .. } => Code::Internal,
            },
            CriError::Aborted { .. } => Code::Internal,
            // Retry at a higher level: relist, then subscribe again.
            CriError::EventsLost(_) => Code::Aborted,
            // containerd answers ErrUnavailable for the stats of a pod that is not ready.
            CriError::Stats(StatsError::NotReady { .. }) => Code::Unavailable,
            CriError::Stats(StatsError::Store(e)) => store_code(e),
        }
    }
}

fn container_code(e: &ContainerError) -> Code {
    match e {
        ContainerError::SandboxNotFound(_)
        | ContainerError::ImageNotFound(_)
        | ContainerError::ImageVolumeNotFound { .. } => Code::NotFound,
        ContainerError::SandboxNotReady(_)
        | ContainerError::NotRunning(_)
        | ContainerError::PodHandlerGone { .. }
        | ContainerError::RecursiveReadOnlyUnsupported { .. }
        | ContainerError::SnapshotterCannotIdmap(_) => Code::FailedPrecondition,
        // A sub path that names nothing mountable in the image is the request's fault.
        ContainerError::ImageSubPath { source, .. } if source.is_invalid() => Code::InvalidArgument,
        ContainerError::EmptyCommand
        | ContainerError::UserNamespaceMismatch { .. }
        | ContainerError::MountPropagation { .. } => Code::InvalidArgument,
        // A snapshotter whose mounts remora cannot mount is a node's configuration.
        ContainerError::Rootfs(m) | ContainerError::ImageVolumeMount { source: m, .. }
            if m.is_unsupported() =>
        {
            Code::FailedPrecondition
        }
        // Something other than a regular file at the log path: refused, not followed.
        ContainerError::Log {
            source:
                LogError::Symlink { .. } | LogError::DirSymlink { .. } | LogError::NotRegular { .. },
            ..
        } => Code::FailedPrecondition,
        ContainerError::ExecTimeout(_) => Code::DeadlineExceeded,
        ContainerError::Name(_) => Code::AlreadyExists,
        ContainerError::Spec(_) => Code::InvalidArgument,
        ContainerError::Cdi(c) => match c {
            CdiError::Unresolvable { .. } | CdiError::Ambiguous { .. } => Code::InvalidArgument,
            // The node's configuration or devices, not the request.
            CdiError::Disabled { .. }
            | CdiError::HostDevice { .. }
            | CdiError::TypeMismatch { .. } => Code::FailedPrecondition,
            CdiError::Build(_) => Code::Internal,
        },
        // The node's state (a profile not loaded), not the request's fault.
        ContainerError::AppArmor(_) => Code::FailedPrecondition,
        ContainerError::Containerd(c) => containerd_error_code(c),
        ContainerError::Store(st) => store_code(st),
        ContainerError::Transition(_) => Code::FailedPrecondition,
        // A failed rollback does not change what the caller did wrong (or not).
        ContainerError::RolledBackPartly { source, .. } => container_code(source),
        ContainerError::Id(_)
        | ContainerError::Rootfs(_)
        | ContainerError::ImageVolumeMount { .. }
        | ContainerError::ImageSubPath { .. }
        | ContainerError::Host { .. }
        | ContainerError::Fifo { .. }
        | ContainerError::Log { .. }
        | ContainerError::Encode(_)
        | ContainerError::Aborted(_)
        | ContainerError::Journal { .. }
        | ContainerError::MountTable { .. } => Code::Internal,
        ContainerError::Failpoint(_) => Code::Unavailable,
        ContainerError::Nri(n) => plugin_code(n.code()),
    }
}

fn sandbox_code(e: &SandboxError) -> Code {
    match e {
        SandboxError::UnknownRuntimeHandler(_) => Code::InvalidArgument,
        SandboxError::UserNamespacesUnsupported(_) | SandboxError::SnapshotterCannotIdmap(_) => {
            Code::FailedPrecondition
        }
        SandboxError::Name(_) => Code::AlreadyExists,
        SandboxError::Image(p) => pull_code(p),
        SandboxError::Spec(_) => Code::InvalidArgument,
        SandboxError::AppArmor(_) => Code::FailedPrecondition,
        SandboxError::Containerd(c) => containerd_error_code(c),
        SandboxError::Store(st) => store_code(st),
        SandboxError::RolledBackPartly { source, .. } => sandbox_code(source),
        SandboxError::NotReady(_) => Code::FailedPrecondition,
        SandboxError::Forward { .. } | SandboxError::RemovalPending { .. } => Code::Unavailable,
        SandboxError::Id(_)
        | SandboxError::Netns(_)
        | SandboxError::Network(_)
        | SandboxError::Files(_)
        | SandboxError::Encode(_)
        | SandboxError::Aborted(_)
        | SandboxError::StoppedBeside(_)
        | SandboxError::Container { .. }
        | SandboxError::Journal { .. } => Code::Internal,
        SandboxError::Failpoint(_) => Code::Unavailable,
        SandboxError::Nri(n) => plugin_code(n.code()),
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

/// An NRI plugin's code passes through to the CRI call unchanged (`None`: OK).
fn plugin_code(code: Option<BackendCode>) -> Code {
    code.map_or(Code::Ok, |c| Code::from_i32(c.grpc_number()))
}

fn containerd_code(code: BackendCode) -> Code {
    match code {
        // Transport failures (made `Unavailable` where they are seen: `Client::call_error`)
        // and containerd shutting down are retriable for kubelet. containerd's own `Unknown`
        // (an OCI runtime's refusal, a shim's error) stays `Unknown`, as containerd's CRI
        // answers it: it is no outage, and a retry meets the same refusal.
        BackendCode::Unavailable | BackendCode::Cancelled => Code::Unavailable,
        other => Code::from_i32(other.grpc_number()),
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
    fn an_image_sub_path_not_in_the_image_is_invalid_argument_naming_the_field() {
        use crate::lifecycle::mount::SubPathError;
        let s: tonic::Status = CriError::from(ContainerError::ImageSubPath {
            field: "config.mounts[2].image_sub_path".into(),
            sub_path: "not-existing".into(),
            source: SubPathError::Missing,
        })
        .into();
        assert_eq!(s.code(), Code::InvalidArgument);
        assert_eq!(
            s.message(),
            "config.mounts[2].image_sub_path \"not-existing\": does not exist in the image"
        );
        // The host's failure to bind it is not the request's fault.
        let s: tonic::Status = CriError::from(ContainerError::ImageSubPath {
            field: "config.mounts[2].image_sub_path".into(),
            sub_path: "etc".into(),
            source: SubPathError::NoOpenat2,
        })
        .into();
        assert_eq!(s.code(), Code::Internal);
    }

    #[test]
    fn an_apparmor_profile_not_loaded_is_failed_precondition_naming_it() {
        use crate::lifecycle::apparmor::{AppArmorError, LoadError};
        let s: tonic::Status = CriError::from(ContainerError::AppArmor(AppArmorError::NotLoaded {
            name: "non-existent-profile".into(),
        }))
        .into();
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert_eq!(
            s.message(),
            "apparmor profile \"non-existent-profile\" is not loaded"
        );
        let s: tonic::Status = CriError::from(ContainerError::AppArmor(
            AppArmorError::DefaultUnavailable {
                name: "remora-default".into(),
                source: LoadError::Rejected {
                    status: "exit status: 1".into(),
                    output: "Permission denied".into(),
                },
            },
        ))
        .into();
        assert_eq!(s.code(), Code::FailedPrecondition);
        for part in ["\"remora-default\"", "apparmor_parser", "Permission denied"] {
            assert!(s.message().contains(part), "{part}: {}", s.message());
        }
        let s: tonic::Status = CriError::from(SandboxError::AppArmor(AppArmorError::NotLoaded {
            name: "p".into(),
        }))
        .into();
        assert_eq!(s.code(), Code::FailedPrecondition);
    }

    #[test]
    fn lost_events_are_aborted_and_say_to_relist() {
        let s: tonic::Status =
            CriError::from(crate::lifecycle::container_events::EventsLost { missed: 3 }).into();
        assert_eq!(s.code(), Code::Aborted);
        assert!(
            s.message().contains("3 container events were lost"),
            "{}",
            s.message()
        );
        assert!(s.message().contains("relist"), "{}", s.message());
    }

    #[test]
    fn each_code_containerd_answers_reaches_the_cri_caller_as_before() {
        // Through the port's words and back: containerd's code, except that its `Cancelled`
        // (containerd shutting down) is retriable `Unavailable`.
        for code in [
            Code::Cancelled,
            Code::Unknown,
            Code::InvalidArgument,
            Code::DeadlineExceeded,
            Code::NotFound,
            Code::AlreadyExists,
            Code::PermissionDenied,
            Code::ResourceExhausted,
            Code::FailedPrecondition,
            Code::Aborted,
            Code::OutOfRange,
            Code::Unimplemented,
            Code::Internal,
            Code::Unavailable,
            Code::DataLoss,
            Code::Unauthenticated,
        ] {
            let s: tonic::Status = CriError::from(BackendError::Call {
                address: "/run/c.sock".into(),
                op: "Tasks.Start",
                code: crate::containerd::error::backend_code(code),
                message: "m".into(),
            })
            .into();
            let expected = match code {
                Code::Cancelled => Code::Unavailable,
                other => other,
            };
            assert_eq!(s.code(), expected, "{code:?}");
        }
    }

    #[test]
    fn containerd_transport_failure_is_unavailable_and_its_unknown_stays_unknown() {
        let s: tonic::Status = CriError::from(BackendError::Call {
            address: "/run/c.sock".into(),
            op: "Version.Version",
            code: BackendCode::Unavailable,
            message: "transport error".into(),
        })
        .into();
        assert_eq!(s.code(), Code::Unavailable);
        assert!(s.message().contains("/run/c.sock"));
        // runc refusing a create reaches remora as containerd's Unknown: no outage.
        let s: tonic::Status = CriError::from(BackendError::Call {
            address: "/run/c.sock".into(),
            op: "Tasks.Create",
            code: BackendCode::Unknown,
            message: "failed to create shim task: OCI runtime create failed".into(),
        })
        .into();
        assert_eq!(s.code(), Code::Unknown);
        let s: tonic::Status = CriError::from(BackendError::Call {
            address: "/run/c.sock".into(),
            op: "Containers.Get",
            code: BackendCode::NotFound,
            message: "no such container".into(),
        })
        .into();
        assert_eq!(s.code(), Code::NotFound);
    }

    #[test]
    fn an_image_over_remora_limits_is_failed_precondition_naming_blob_size_and_limit() {
        use crate::images::manifest::{ManifestError, MAX_CONFIG_SIZE};
        let digest = format!("sha256:{}", "ab".repeat(32));
        let s: tonic::Status = CriError::from(PullError::Manifest {
            reference: "registry.k8s.io/big:1".into(),
            source: std::sync::Arc::new(ManifestError::TooLarge {
                what: "image config",
                digest: digest.clone(),
                size: MAX_CONFIG_SIZE + 1,
                limit: MAX_CONFIG_SIZE,
            }),
        })
        .into();
        assert_eq!(s.code(), Code::FailedPrecondition);
        for part in [
            "registry.k8s.io/big:1",
            "image config",
            digest.as_str(),
            &(MAX_CONFIG_SIZE + 1).to_string(),
            &MAX_CONFIG_SIZE.to_string(),
        ] {
            assert!(s.message().contains(part), "{part}: {}", s.message());
        }
        let s: tonic::Status = CriError::from(PullError::Registry(RegistryError::TooLarge {
            reference: "registry.k8s.io/big:1".into(),
            host: "127.0.0.1:5000".into(),
            what: "manifest 1".into(),
            size: 5 << 20,
            limit: 4 << 20,
        }))
        .into();
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert!(s.message().contains("manifest 1"), "{}", s.message());
    }

    #[test]
    fn a_cgroup_parent_the_driver_cannot_use_is_invalid_argument_naming_the_field() {
        let s: tonic::Status = CriError::from(SandboxError::Spec(
            crate::spec::SpecError::InvalidCgroupParent {
                parent: "/kubepods/pod1".into(),
                reason: "not a slice",
            },
        ))
        .into();
        assert_eq!(s.code(), Code::InvalidArgument);
        assert!(s.message().contains("cgroup_parent"), "{}", s.message());
        assert!(s.message().contains("/kubepods/pod1"), "{}", s.message());
    }
}
