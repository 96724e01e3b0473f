//! What pod and container lifecycle needs from below, as narrow traits defined here by their
//! user: containerd's container records and tasks (one implementation over containerd's gRPC
//! API, `crate::containerd::runtime`), the local images, and the pod network. Snapshots and
//! leases come through the image side's traits (`crate::images::backend`). Recording fakes
//! of all of them drive the rollback unit tests.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::backend_error::BackendError;
use crate::images::backend::Mount;
use crate::images::pull::PullError;
use crate::images::store::ImageInfo;
use crate::net::cni::orphans::Orphans;
use crate::net::netns::NetnsError;
use crate::net::{NetError, PodNetInfo};

/// A containerd container record: metadata only, no process.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ContainerRecord {
    /// Container id (the CRI sandbox or container id).
    pub id: String,
    /// Image reference it was created from.
    pub image: String,
    /// Labels (kind, pod and container names; used for filtering in containerd).
    pub labels: HashMap<String, String>,
    /// The OCI runtime spec as JSON.
    pub spec: Vec<u8>,
    /// containerd runtime (shim) and its options.
    pub runtime: ShimRuntime,
    /// Snapshotter of the rootfs.
    pub snapshotter: String,
    /// Snapshot key of the rootfs.
    pub snapshot_key: String,
    /// containerd's `sandbox` field of the record: the pod's id for a container, "" for a
    /// pause container or a pod's holder task (and for containers made by remora before 0.1). With it, containerd
    /// creates the container's task in the pod's shim (found through the pause task's exit
    /// keeper, a sandbox-store record; a pod without a pause container has a holder task
    /// there instead) instead of running the shim binary's `start`, and
    /// does not shut the shim down on the container's task delete. It also loads that shim
    /// without its dead-shim cleanup: remora reaps a sandboxed container whose shim died
    /// itself (`Pods::reap_after_dead_shim`).
    pub sandbox: String,
    /// Extensions: key → JSON bytes (remora's full CRI metadata lives here).
    pub extensions: HashMap<String, Vec<u8>>,
}

/// The containerd runtime (shim) a container record names, with its options.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShimRuntime {
    /// Runtime type, e.g. `io.containerd.runc.v2`.
    pub name: String,
    /// Options for the shim; `None` sends none (the shim's defaults).
    pub options: Option<RuncOptions>,
}

/// The subset of containerd's `containerd.runc.v1.Options` remora sets. Both containerd's Go
/// runc shim and remora's shim read them from the container record's runtime options.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RuncOptions {
    /// The OCI runtime binary ("" = the shim's default, runc).
    pub binary_name: String,
    /// The OCI runtime's `--root` ("" = its default).
    pub root: String,
    /// Cgroups through systemd.
    pub systemd_cgroup: bool,
    /// Owner uid of the process's stdio pipes (task options only): a user-namespaced
    /// container's root on the host, so it can reopen `/dev/stdout` (containerd's
    /// `WithUIDOwner`). 0 with `io_gid` 0: the shim's own.
    pub io_uid: u32,
    /// Owner gid of the stdio pipes.
    pub io_gid: u32,
}

/// How to start a task.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TaskSpec {
    /// The container to start a task for.
    pub container_id: String,
    /// Rootfs mounts (from the snapshot).
    pub rootfs: Vec<Mount>,
    /// stdin FIFO path ("" for none).
    pub stdin: String,
    /// stdout FIFO path ("" for none).
    pub stdout: String,
    /// stderr FIFO path ("" for none).
    pub stderr: String,
    /// Allocate a terminal.
    pub terminal: bool,
    /// Absolute path of the shim binary to run ("" = containerd resolves the record's runtime
    /// type).
    pub runtime_path: String,
    /// Task options; `None`: the shim gets the record's runtime options. They replace those
    /// (containerd's rule), so they carry the handler's too.
    pub options: Option<RuncOptions>,
}

/// Process state as containerd reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskStatus {
    /// Created, not started.
    Created,
    /// Running.
    Running,
    /// Exited, not yet deleted.
    Stopped,
    /// Paused or pausing.
    Paused,
    /// Unknown to the shim.
    Unknown,
}

/// A task's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskState {
    /// Status.
    pub status: TaskStatus,
    /// Init process pid.
    pub pid: u32,
    /// Exit status (meaningful when stopped).
    pub exit_status: u32,
    /// When it exited (when stopped).
    pub exited_at: Option<SystemTime>,
}

/// An exit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    /// Exit status (128 + signal for a signalled process, as containerd reports it).
    pub status: u32,
    /// When.
    pub at: Option<SystemTime>,
}

/// Where exit monitors queue the exits they see, so that an exit is recorded in order with
/// the container's other events and retried with backoff (the event monitor's queue, which
/// hands it back to [`crate::lifecycle::Pods::handle_exit`]).
pub trait ExitQueue: Send + Sync {
    /// Queues the exit of container `container_id`'s init process.
    fn push_exit(&self, container_id: &str, exit: Exit);
}

/// containerd's reachability, for those who wait out an outage (the health monitor's handle,
/// `crate::containerd::health`): each handle remembers which transitions it has seen.
#[async_trait::async_trait]
pub trait Reachability: Send + Sync + std::fmt::Debug {
    /// Something failed as if containerd were gone: probe now rather than at the next tick.
    fn suspect(&self);
    /// Forgets transitions published so far: [`Reachability::back`] waits for a later one.
    fn mark_seen(&mut self);
    /// Resolves at the next transition to reachable not yet seen by this handle (containerd
    /// answering after it did not).
    async fn back(&mut self);
    /// Another handle on the same monitor, having seen what this one has.
    fn handle(&self) -> Box<dyn Reachability>;
}

impl Clone for Box<dyn Reachability> {
    fn clone(&self) -> Self {
        self.handle()
    }
}

/// A [`Reachability`] without a monitor (tests, tools): it never reports containerd back.
#[derive(Debug, Clone, Copy)]
pub struct NeverBack;

#[async_trait::async_trait]
impl Reachability for NeverBack {
    fn suspect(&self) {}
    fn mark_seen(&mut self) {}
    async fn back(&mut self) {
        std::future::pending().await
    }
    fn handle(&self) -> Box<dyn Reachability> {
        Box::new(NeverBack)
    }
}

/// containerd's container records.
#[async_trait::async_trait]
pub trait Containers: Send + Sync + 'static {
    /// Creates a record; `AlreadyExists` if the id is taken.
    async fn create(&self, record: ContainerRecord) -> Result<(), BackendError>;
    /// One record, or `None`.
    async fn get(&self, id: &str) -> Result<Option<ContainerRecord>, BackendError>;
    /// All records in the namespace.
    async fn list(&self) -> Result<Vec<ContainerRecord>, BackendError>;
    /// Replaces one extension of a record.
    async fn set_extension(&self, id: &str, key: &str, value: Vec<u8>) -> Result<(), BackendError>;
    /// Deletes a record; absent is not an error.
    async fn delete(&self, id: &str) -> Result<(), BackendError>;
    /// Drops bookkeeping the backend keeps per task whose container record is gone (left by
    /// a crash between deleting the record and the bookkeeping); returns how many. Backends
    /// that keep none have nothing to do.
    async fn sweep_orphans(&self) -> Result<usize, BackendError> {
        Ok(0)
    }
}

/// What the OCI runtime knew of a container it force-deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForceDeleted {
    /// It was running (or paused): its processes were SIGKILLed.
    WasRunning,
    /// It had exited (or was created, never started): nothing was killed.
    WasStopped,
    /// The runtime had no such container.
    Unknown,
}

/// The OCI runtime's (runc's, crun's) own command line, for the one thing no shim is left to
/// do: a container whose shim died while containerd kept running (see
/// [`ContainerRecord::sandbox`]).
#[async_trait::async_trait]
pub trait OciRuntime: Send + Sync + 'static {
    /// `<runtime> --root <root>/<namespace> delete --force <id>` with the binary and root the
    /// shim used (`runtime`'s options, else the shims' defaults): SIGKILLs the container's
    /// processes, removes its cgroup and state. Says what the runtime knew of it first.
    async fn force_delete(
        &self,
        runtime: &ShimRuntime,
        id: &str,
    ) -> Result<ForceDeleted, OciCliError>;
}

/// A failed command of the OCI runtime.
#[derive(Debug, thiserror::Error)]
pub enum OciCliError {
    /// The binary could not be started.
    #[error("cannot run {binary} {command}: {source}")]
    Spawn {
        /// The runtime binary.
        binary: String,
        /// Its subcommand.
        command: &'static str,
        source: std::io::Error,
    },
    /// It did not finish in time.
    #[error("{binary} {command} did not finish within {after:?}")]
    Timeout {
        /// The runtime binary.
        binary: String,
        /// Its subcommand.
        command: &'static str,
        /// The limit.
        after: std::time::Duration,
    },
    /// It failed.
    #[error("{binary} {command} failed ({status}): {stderr}")]
    Failed {
        /// The runtime binary.
        binary: String,
        /// Its subcommand.
        command: &'static str,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// What it printed on stderr.
        stderr: String,
    },
}

/// containerd's tasks (running processes of containers).
#[async_trait::async_trait]
pub trait Tasks: Send + Sync + 'static {
    /// Creates the task (the shim starts, the process is created but not started); returns
    /// the pid.
    async fn create(&self, spec: TaskSpec) -> Result<u32, BackendError>;
    /// Starts the created task; returns the pid.
    async fn start(&self, container_id: &str) -> Result<u32, BackendError>;
    /// Sends `signal` to the init process (`all`: to every process of the container).
    async fn kill(&self, container_id: &str, signal: u32, all: bool) -> Result<(), BackendError>;
    /// Waits for the init process to exit. Returns at once if it already has.
    async fn wait(&self, container_id: &str) -> Result<Exit, BackendError>;
    /// The task's state, or `None` if there is no task.
    async fn state(&self, container_id: &str) -> Result<Option<TaskState>, BackendError>;
    /// Deletes the (stopped) task and its shim; `None` if there was no task.
    async fn delete(&self, container_id: &str) -> Result<Option<Exit>, BackendError>;
    /// Adds process `exec_id` (an OCI process spec as JSON) to the running task, with stdio
    /// FIFOs as in [`TaskSpec`]. Not started yet.
    async fn exec(
        &self,
        container_id: &str,
        exec_id: &str,
        process: Vec<u8>,
        stdio: ExecStdio,
    ) -> Result<(), BackendError>;
    /// Starts exec process `exec_id`; returns its pid.
    async fn start_exec(&self, container_id: &str, exec_id: &str) -> Result<u32, BackendError>;
    /// Waits for exec process `exec_id` to exit.
    async fn wait_exec(&self, container_id: &str, exec_id: &str) -> Result<Exit, BackendError>;
    /// Signals exec process `exec_id`.
    async fn kill_exec(
        &self,
        container_id: &str,
        exec_id: &str,
        signal: u32,
    ) -> Result<(), BackendError>;
    /// Sets the terminal size (columns, rows) of process `exec_id` ("" for the init process).
    async fn resize_pty(
        &self,
        container_id: &str,
        exec_id: &str,
        size: (u32, u32),
    ) -> Result<(), BackendError>;
    /// Closes the stdin of process `exec_id` ("" for the init process): the process reads EOF
    /// once what is already in its stdin FIFO is read. The shims keep the FIFO open
    /// themselves, so closing remora's end alone is not enough.
    async fn close_stdin(&self, container_id: &str, exec_id: &str) -> Result<(), BackendError>;
    /// Applies new resource limits (an OCI `LinuxResources` as JSON) to the running task.
    async fn update_resources(
        &self,
        container_id: &str,
        resources: Vec<u8>,
    ) -> Result<(), BackendError>;
    /// Deletes exec process `exec_id`; absent is not an error.
    async fn delete_exec(&self, container_id: &str, exec_id: &str) -> Result<(), BackendError>;
}

/// Stdio of an exec process (FIFO paths; "" for none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecStdio {
    /// stdin FIFO.
    pub stdin: String,
    /// stdout FIFO.
    pub stdout: String,
    /// stderr FIFO.
    pub stderr: String,
    /// Allocate a terminal.
    pub terminal: bool,
}

/// The local images lifecycle reads (image configs, snapshot parents), and the pull of the
/// pause image. Implemented by the image side (`crate::images::ImageRuntime`).
#[async_trait::async_trait]
pub trait LocalImages: Send + Sync + 'static {
    /// A local image by any reference form or id.
    fn find(&self, image: &str) -> Option<ImageInfo>;
    /// A local image by its exact reference.
    fn get(&self, reference: &str) -> Option<ImageInfo>;
    /// Pulls `reference` anonymously (the pause image).
    async fn pull(&self, reference: &str) -> Result<ImageInfo, PullError>;
}

/// The pod network as sandboxes use it: a network namespace per pod and CNI ADD/DEL in it.
/// Implemented over the host by [`crate::host_network::HostNetwork`].
#[async_trait::async_trait]
pub trait PodNetwork: Send + Sync + 'static {
    /// Creates pod `id`'s network namespace; returns its path. With `user` (a pod with a user
    /// namespace of its own), the namespace is owned by a new user namespace with those maps,
    /// pinned beside it (`crate::spec::namespaces::userns_pin`) and removed with it.
    async fn create_netns(
        &self,
        id: &str,
        user: Option<&crate::spec::UserNamespace>,
    ) -> Result<PathBuf, NetnsError>;
    /// Removes a network namespace, and the namespaces pinned beside it; absent is not an
    /// error.
    async fn remove_netns(&self, path: &Path) -> Result<(), NetnsError>;
    /// For a pod without a pause container: new IPC and UTS namespaces with the pod's hostname
    /// and sysctls (its `net.*` ones set in the network namespace at `netns`), pinned beside
    /// it (`crate::net::netns::pin_pod_namespaces`) and removed with it.
    async fn pin_namespaces(
        &self,
        netns: &Path,
        pod: crate::net::netns::PodNamespaces,
    ) -> Result<(), NetnsError>;
    /// CNI ADD (undoing its own partial ADD on failure); returns the pod's addresses, primary
    /// first.
    async fn setup(&self, pod: &PodNetInfo) -> Result<Vec<IpAddr>, NetError>;
    /// CNI DEL; idempotent.
    async fn teardown(&self, pod: &PodNetInfo) -> Result<(), NetError>;
    /// Waits until no CNI plugin a crashed remora started for pod `id` is running (killing
    /// them after the plugin timeout); returns how many were found and killed. For the sweep
    /// of a half-made pod, before its DEL.
    async fn await_orphaned_plugins(&self, id: &str) -> Result<Orphans, NetError>;
}
