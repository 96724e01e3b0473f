//! Why a lifecycle operation failed: [`SandboxError`] and [`ContainerError`], and what a
//! rollback that did not complete adds to them ([`RollbackError`]). Each keeps its cause as
//! its `source`; the CRI layer maps them to gRPC codes.

use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;

use super::apparmor::AppArmorError;
use super::mount::MountError;
use super::sandbox_files::FilesError;
use crate::backend_error::BackendError;
use crate::failpoint::Fired;
use crate::images::pull::PullError;
use crate::io::{FifoError, LogError};
use crate::net::netns::NetnsError;
use crate::net::NetError;
use crate::spec::SpecError;
use crate::store::{IdError, NameError, StoreError, TransitionError};

/// Why a sandbox operation failed.
#[derive(Debug, Error)]
pub enum SandboxError {
    /// The runtime handler is not configured (`[runtime.handlers.<name>]`).
    #[error("runtime handler {0:?} is not configured")]
    UnknownRuntimeHandler(String),
    /// The pod asks for a user namespace of its own and its handler cannot make one (its OCI
    /// runtime has no idmapped mounts, see `crate::oci::features`).
    #[error("runtime handler {0:?} does not support user namespaces")]
    UserNamespacesUnsupported(String),
    /// The snapshotter gave a user-namespaced pod's rootfs no idmap (`uidmap=`/`gidmap=`): it
    /// cannot shift its layers' ownership on this host.
    #[error("snapshotter {0:?} cannot idmap a rootfs for a user namespace on this host")]
    SnapshotterCannotIdmap(String),
    /// The pod's name is taken.
    #[error("pod sandbox name is in use: {0}")]
    Name(#[from] NameError),
    /// No id could be generated.
    #[error(transparent)]
    Id(#[from] IdError),
    /// The pause image could not be pulled.
    #[error("sandbox image: {0}")]
    Image(#[source] Box<PullError>),
    /// Creating or removing the network namespace failed.
    #[error("network namespace: {0}")]
    Netns(#[from] NetnsError),
    /// CNI failed.
    #[error("pod network: {0}")]
    Network(#[source] Box<NetError>),
    /// The pod's files could not be made.
    #[error(transparent)]
    Files(#[from] FilesError),
    /// The spec could not be generated.
    #[error("pod spec: {0}")]
    Spec(#[from] SpecError),
    /// The AppArmor profile the pod asks for cannot be used (not loaded).
    #[error(transparent)]
    AppArmor(#[from] AppArmorError),
    /// The spec could not be serialised.
    #[error("pod spec: cannot serialise: {0}")]
    Encode(#[source] serde_json::Error),
    /// containerd failed.
    #[error(transparent)]
    Containerd(#[from] BackendError),
    /// The index refused.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The operation's task panicked or was aborted.
    #[error("pod sandbox operation did not complete: {0}")]
    Aborted(#[source] tokio::task::JoinError),
    /// A container of the pod could not be stopped or removed.
    #[error("container {id} of the pod: {source}")]
    Container {
        /// The container.
        id: String,
        source: Box<ContainerError>,
    },
    /// The intent could not be recorded (see [`super::journal`]).
    #[error("cannot record the pod sandbox operation in {}: {source}", path.display())]
    Journal {
        /// The intents dir.
        path: PathBuf,
        source: std::io::Error,
    },
    /// A removed container of the pod still has containerd objects being cleaned up (see
    /// `container_remove`): the pod's own cannot go before them. Retriable.
    #[error("container {container} of the pod is still being removed: {last_error}")]
    RemovalPending {
        /// The container.
        container: String,
        /// Its cleanup's last error.
        last_error: String,
    },
    /// The pod is not ready (PortForward).
    #[error("pod sandbox {0} is not ready")]
    NotReady(String),
    /// A port-forward connection into the pod could not be made.
    #[error("cannot connect to port {port} in the pod's network namespace: {source}")]
    Forward {
        /// The port.
        port: u16,
        source: std::io::Error,
    },
    /// A test failpoint fired.
    #[error(transparent)]
    Failpoint(#[from] Fired),
    /// An NRI plugin failed RunPodSandbox.
    #[error(transparent)]
    Nri(#[from] super::nri::NriError),
    /// Steps running concurrently with `{0}` stopped before making anything more because it
    /// failed: its own error is the operation's, this one only tells the branch's caller why
    /// the branch ended early.
    #[error("stopped: {0}, running beside, failed")]
    StoppedBeside(&'static str),
    /// The operation failed and undoing what it had made failed too (the intent stays, for
    /// the sweep): both are reported.
    #[error("{source}; {rollback}")]
    RolledBackPartly {
        /// The failure that started the rollback.
        source: Box<SandboxError>,
        /// The undo steps that failed.
        rollback: RollbackError,
    },
}

/// Why a container operation failed.
#[derive(Debug, Error)]
pub enum ContainerError {
    /// The pod does not exist.
    #[error("pod sandbox {0:?} not found")]
    SandboxNotFound(String),
    /// The pod is not ready.
    #[error("pod sandbox {0} is not ready")]
    SandboxNotReady(String),
    /// The pod's runtime handler is no longer configured (the config changed since the pod
    /// started): its containers cannot run with the pod's shim.
    #[error("pod sandbox {pod}: its runtime handler {handler:?} is no longer configured")]
    PodHandlerGone {
        /// The pod.
        pod: String,
        /// The handler recorded for it.
        handler: String,
    },
    /// A recursive read-only mount was asked of a handler whose OCI runtime (or kernel) cannot
    /// make one (`RuntimeStatus` says so; kubelet checks before asking).
    #[error(
        "mount {mount}: runtime handler {handler:?} does not support recursive read-only mounts"
    )]
    RecursiveReadOnlyUnsupported {
        /// The pod's handler (`""` = the default).
        handler: String,
        /// The mount's container path.
        mount: String,
    },
    /// The container asks for another user namespace than its pod's (containerd: "user
    /// namespace config for sandbox is different from container").
    #[error("config.linux.security_context.namespace_options.userns_options: the container's user namespace ({container}) differs from its pod's ({pod})")]
    UserNamespaceMismatch {
        /// The container's, described.
        container: String,
        /// The pod's, described.
        pod: String,
    },
    /// The snapshotter gave a user-namespaced container's rootfs no idmap.
    #[error("snapshotter {0:?} cannot idmap a rootfs for a user namespace on this host")]
    SnapshotterCannotIdmap(String),
    /// An image volume's image is not present (kubelet pulls it before it creates).
    #[error("image volume {mount}: image {image:?} not found: pull it first")]
    ImageVolumeNotFound {
        /// The mount's container path.
        mount: String,
        /// The image asked for.
        image: String,
    },
    /// An image volume's view could not be mounted on the host.
    #[error("image volume {mount}: {source}")]
    ImageVolumeMount {
        /// The mount's container path.
        mount: String,
        #[source]
        source: super::mount::MountError,
    },
    /// An image volume's sub path names nothing mountable in the image, or could not be
    /// bound (`source` says which).
    #[error("{field} {sub_path:?}: {source}")]
    ImageSubPath {
        /// CRI path of the field, `config.mounts[N].image_sub_path`.
        field: String,
        /// The sub path asked for (at most 4096 bytes: the CRI conversion bounds it).
        sub_path: String,
        #[source]
        source: super::mount::SubPathError,
    },
    /// A mount's propagation cannot work with its source's mount (containerd's
    /// `ensureShared` / `ensureSharedOrSlave`).
    #[error("mount {mount}: propagation {propagation:?} needs its source on a shared mount{}: {source}", if matches!(propagation, crate::spec::MountPropagation::HostToContainer) { " or a slave one" } else { "" })]
    MountPropagation {
        /// The mount's container path.
        mount: String,
        /// What it asked for.
        propagation: crate::spec::MountPropagation,
        /// Why not.
        #[source]
        source: super::mountinfo::PropagationError,
    },
    /// The host's mount table could not be read for a propagation check.
    #[error("cannot read {path} to check mount {mount}'s propagation: {source}")]
    MountTable {
        /// The mount's container path.
        mount: String,
        /// What was read.
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The image is not present (kubelet pulls before it creates).
    #[error("image {0:?} not found: pull it first")]
    ImageNotFound(String),
    /// The name is taken.
    #[error("container name is in use: {0}")]
    Name(#[from] NameError),
    /// No id could be generated.
    #[error(transparent)]
    Id(#[from] IdError),
    /// The root filesystem could not be mounted to resolve the user.
    #[error("reading the container's root filesystem: {0}")]
    Rootfs(#[from] MountError),
    /// The spec could not be generated (a bad request).
    #[error("container spec: {0}")]
    Spec(#[from] SpecError),
    /// CDI devices that cannot be resolved or applied.
    #[error(transparent)]
    Cdi(#[from] crate::cdi::CdiError),
    /// The AppArmor profile the container would run under cannot be used: a `localhost/`
    /// profile that is not loaded, or remora's default that could not be loaded.
    #[error(transparent)]
    AppArmor(#[from] AppArmorError),
    /// A host-side step failed.
    #[error("cannot {action} {}: {source}", path.display())]
    Host {
        /// What.
        action: &'static str,
        /// Where.
        path: PathBuf,
        source: std::io::Error,
    },
    /// The container's FIFOs could not be made or opened.
    #[error("cannot {action} {}: {source}", path.display())]
    Fifo {
        /// What.
        action: &'static str,
        /// Where.
        path: PathBuf,
        source: FifoError,
    },
    /// The container's CRI log could not be opened.
    #[error("cannot {action} {}: {source}", path.display())]
    Log {
        /// What.
        action: &'static str,
        /// Where.
        path: PathBuf,
        source: LogError,
    },
    /// The spec could not be serialised.
    #[error("container spec: cannot serialise: {0}")]
    Encode(#[source] serde_json::Error),
    /// containerd failed.
    #[error(transparent)]
    Containerd(#[from] BackendError),
    /// The index refused (not found, wrong state).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The intent could not be recorded (see [`super::journal`]).
    #[error("cannot record the container operation in {}: {source}", path.display())]
    Journal {
        /// The intents dir.
        path: PathBuf,
        source: std::io::Error,
    },
    /// A test failpoint fired.
    #[error(transparent)]
    Failpoint(#[from] Fired),
    /// An NRI plugin failed the call, or its adjustment could not be applied.
    #[error(transparent)]
    Nri(#[from] super::nri::NriError),
    /// The container is in the wrong state for the operation.
    #[error(transparent)]
    Transition(#[from] TransitionError),
    /// The operation's task panicked or was aborted.
    #[error("container operation did not complete: {0}")]
    Aborted(#[source] tokio::task::JoinError),
    /// The container is not running (ReopenContainerLog, ExecSync).
    #[error("container {0} is not running")]
    NotRunning(String),
    /// ExecSync without a command.
    #[error("the command to execute is empty")]
    EmptyCommand,
    /// ExecSync's timeout passed; the process was killed.
    #[error("command timed out after {0:?} and was killed")]
    ExecTimeout(Duration),
    /// The operation failed and undoing what it had made failed too (the intent stays, for
    /// the sweep): both are reported.
    #[error("{source}; {rollback}")]
    RolledBackPartly {
        /// The failure that started the rollback.
        source: Box<ContainerError>,
        /// The undo steps that failed.
        rollback: RollbackError,
    },
}

/// Why one undo step failed.
#[derive(Debug, Error)]
pub enum UndoError {
    /// containerd failed.
    #[error(transparent)]
    Containerd(#[from] BackendError),
    /// The network namespace could not be removed.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// CNI DEL failed.
    #[error(transparent)]
    Network(#[from] NetError),
    /// The pod's files could not be removed.
    #[error(transparent)]
    Files(#[from] FilesError),
    /// A file-system step failed.
    #[error("cannot remove {}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        source: std::io::Error,
    },
    /// The step's blocking task panicked.
    #[error("the step did not complete: {0}")]
    Aborted(#[from] tokio::task::JoinError),
    /// The step did not finish within its bound.
    #[error("timed out after {0:?}")]
    TimedOut(Duration),
}

/// One undo step that failed.
#[derive(Debug)]
pub struct FailedUndo {
    /// The step, e.g. "remove rootfs snapshot".
    pub step: &'static str,
    pub error: UndoError,
}

/// The undo steps of a rollback that failed (the others ran).
#[derive(Debug, Error)]
#[error("rollback incomplete: {}", self.describe())]
pub struct RollbackError {
    /// The failed steps, in the order they ran.
    pub failed: Vec<FailedUndo>,
}

impl RollbackError {
    fn describe(&self) -> String {
        self.failed
            .iter()
            .map(|f| format!("{}: {}", f.step, f.error))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// An error a transaction ([`super::tx`]) can end in: its own, or one that carries a
/// rollback's failures beside itself, or the transaction's intent not written, or its task
/// aborted.
pub(crate) trait WithRollback: Sized {
    /// `self`, with `rollback` reported beside it.
    fn with_rollback(self, rollback: RollbackError) -> Self;
    /// The intent could not be written to the journal dir `path`: nothing was made.
    fn journal(path: PathBuf, source: std::io::Error) -> Self;
    /// The operation's task panicked or was cancelled.
    fn aborted(source: tokio::task::JoinError) -> Self;
}

impl WithRollback for SandboxError {
    fn with_rollback(self, rollback: RollbackError) -> Self {
        SandboxError::RolledBackPartly {
            source: Box::new(self),
            rollback,
        }
    }

    fn journal(path: PathBuf, source: std::io::Error) -> Self {
        SandboxError::Journal { path, source }
    }

    fn aborted(source: tokio::task::JoinError) -> Self {
        SandboxError::Aborted(source)
    }
}

impl WithRollback for ContainerError {
    fn with_rollback(self, rollback: RollbackError) -> Self {
        ContainerError::RolledBackPartly {
            source: Box::new(self),
            rollback,
        }
    }

    fn journal(path: PathBuf, source: std::io::Error) -> Self {
        ContainerError::Journal { path, source }
    }

    fn aborted(source: tokio::task::JoinError) -> Self {
        ContainerError::Aborted(source)
    }
}

impl From<PullError> for SandboxError {
    fn from(e: PullError) -> Self {
        SandboxError::Image(Box::new(e))
    }
}

impl From<NetError> for SandboxError {
    fn from(e: NetError) -> Self {
        SandboxError::Network(Box::new(e))
    }
}
