//! What lifecycle asks of NRI: [`NriHooks`], called at each pod and container event, and the
//! rules of where (the places containerd's CRI and CRI-O call NRI):
//!
//! | event | where | a failure |
//! |---|---|---|
//! | RunPodSandbox | pod made (network, holder or pause task started), before it is indexed | the call fails, everything made is undone |
//! | StopPodSandbox | the pod's containers stopped, before its pause/holder task is killed; once per pod | logged |
//! | RemovePodSandbox | after the pod left the index | logged |
//! | UpdatePodSandbox | before the new resources are recorded | the call fails, nothing changed |
//! | PostUpdatePodSandbox | after they are recorded | logged |
//! | CreateContainer | the OCI spec made, before the containerd record; the merged adjustment applied to the spec | the call fails, everything made is undone (a later step's failure sends StopContainer and RemoveContainer, as containerd does) |
//! | PostCreateContainer | after the container is indexed | logged |
//! | StartContainer | task created, before it starts | the call fails (the task is deleted; StopContainer is sent for any failed start) |
//! | PostStartContainer | after the start | logged |
//! | UpdateContainer | before the new resources are applied; the plugins' changes merged in | the call fails, nothing changed |
//! | PostUpdateContainer | after they are applied | logged |
//! | StopContainer | the exit recorded durably, before it is visible (so before StopContainer answers); once per container | logged |
//! | RemoveContainer | after the container left the index | logged |
//!
//! Visibility: a pod or container created with a hook is indexed only after its hook returned
//! (it is not listed, and its status is NotFound, while a plugin is deciding), and the hook
//! runs under [`NriHooks::block_sync`] until it is indexed, so a plugin registering meanwhile
//! learns of it exactly once: in its Synchronize or by the event.

use async_trait::async_trait;
use thiserror::Error;

use crate::backend_error::BackendCode;
use crate::spec;
use crate::store::{ContainerSnapshot, SandboxSnapshot};

/// Why an NRI hook failed the CRI call it belongs to.
#[derive(Debug, Error)]
pub enum NriError {
    /// A plugin refused the event, did not answer in time, or lost its connection.
    #[error("NRI plugin {plugin} failed {event}: {message}")]
    Plugin {
        /// The plugin, as `<idx>-<name>`.
        plugin: String,
        /// The event.
        event: String,
        /// The plugin's own status code (gRPC's classes: NRI speaks ttrpc, whose codes are
        /// gRPC's), or `Unavailable` when it did not answer; the CRI call fails with the same
        /// code. `None`: the plugin failed the call with OK (0), passed through as containerd
        /// would.
        code: Option<BackendCode>,
        /// What it said.
        message: String,
    },
    /// The plugins' replies conflict, or one asks for something NRI does not allow.
    #[error("NRI plugins' replies to {event}: {message}")]
    Merge {
        /// The event.
        event: String,
        /// Why (naming the plugins and the field).
        message: String,
    },
    /// The merged adjustment cannot be applied to the container's spec.
    #[error("NRI adjustment: {0}")]
    Adjust(#[from] spec::nri::AdjustError),
}

impl NriError {
    /// The code of the failed CRI call (the CRI adapter turns it into a gRPC code).
    pub fn code(&self) -> Option<BackendCode> {
        match self {
            NriError::Plugin { code, .. } => *code,
            // The node's plugins, not the caller's request.
            NriError::Merge { .. } | NriError::Adjust(_) => Some(BackendCode::FailedPrecondition),
        }
    }
}

/// A held block on plugin synchronization (see [`NriHooks::block_sync`]); released on drop.
pub struct SyncBlock(#[allow(dead_code)] Box<dyn Send + Sync>);

impl SyncBlock {
    /// Wraps the implementation's guard.
    pub fn new(guard: impl Send + Sync + 'static) -> Self {
        SyncBlock(Box::new(guard))
    }
}

/// The NRI events of pods and containers. Every call is bounded by the plugins' request
/// timeout; the events that cannot fail log their plugins' errors.
#[async_trait]
pub trait NriHooks: Send + Sync + 'static {
    /// No plugin is synchronized while the block is held. Held from before a hook of an object
    /// being created until the object is indexed; never two at once in one operation.
    async fn block_sync(&self) -> SyncBlock;
    /// RunPodSandbox.
    async fn run_pod_sandbox(&self, pod: &SandboxSnapshot) -> Result<(), NriError>;
    /// StopPodSandbox.
    async fn stop_pod_sandbox(&self, pod: &SandboxSnapshot);
    /// RemovePodSandbox.
    async fn remove_pod_sandbox(&self, pod: &SandboxSnapshot);
    /// UpdatePodSandbox (UpdatePodSandboxResources), with what the request carries.
    async fn update_pod_sandbox(
        &self,
        pod: &SandboxSnapshot,
        overhead: Option<&spec::Resources>,
        resources: Option<&spec::Resources>,
    ) -> Result<(), NriError>;
    /// PostUpdatePodSandbox.
    async fn post_update_pod_sandbox(&self, pod: &SandboxSnapshot);
    /// CreateContainer: the plugins' adjustments merged and applied to `spec` (unchanged on
    /// error). Updates and evictions of other containers they ask for are applied after.
    async fn create_container(
        &self,
        pod: &SandboxSnapshot,
        container: &ContainerSnapshot,
        spec: &mut oci_spec::runtime::Spec,
    ) -> Result<(), NriError>;
    /// PostCreateContainer.
    async fn post_create_container(&self, pod: &SandboxSnapshot, container: &ContainerSnapshot);
    /// StartContainer.
    async fn start_container(
        &self,
        pod: &SandboxSnapshot,
        container: &ContainerSnapshot,
    ) -> Result<(), NriError>;
    /// PostStartContainer.
    async fn post_start_container(&self, pod: &SandboxSnapshot, container: &ContainerSnapshot);
    /// UpdateContainer: the resources to apply, `requested` with the plugins' changes.
    async fn update_container(
        &self,
        pod: &SandboxSnapshot,
        container: &ContainerSnapshot,
        requested: &spec::Resources,
    ) -> Result<spec::Resources, NriError>;
    /// PostUpdateContainer.
    async fn post_update_container(&self, pod: &SandboxSnapshot, container: &ContainerSnapshot);
    /// StopContainer.
    async fn stop_container(&self, pod: &SandboxSnapshot, container: &ContainerSnapshot);
    /// RemoveContainer.
    async fn remove_container(&self, pod: &SandboxSnapshot, container: &ContainerSnapshot);
}
