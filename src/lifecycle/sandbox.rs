//! Pod sandboxes: RunPodSandbox, StopPodSandbox, RemovePodSandbox, and the pause task's exit
//! monitor.
//!
//! # RunPodSandbox, all or nothing
//! name reserved → pause image present → netns created → CNI ADD → pod files (+ shm tmpfs)
//! → rootfs snapshot → OCI spec → containerd container record → task created and started →
//! indexed as Ready, with an exit monitor on the pause task.
//!
//! Every step that makes something registers its undo; if a later step fails, the undos run in
//! reverse, each bounded by its own timeout. The whole operation runs in a task of its own, so
//! a kubelet that gives up (cancelling the RPC) cannot interrupt it half way and skip the
//! rollback: the caller's cancellation is never the cleanup's.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use slog::{info, warn, Logger};
use thiserror::Error;

use super::backend::{
    ContainerRecord, Containers, LocalImages, PodNetwork, TaskSpec, TaskStatus, Tasks,
};
use super::container::IoTable;
use super::events::EventKind;
use super::sandbox_files::{self, Dns, FilesError, FilesRequest};
use crate::containerd::error::ContainerdError;
use crate::images::backend::{Leases, Snapshots};
use crate::images::manifest::ImageConfig as OciImageConfig;
use crate::images::pull::PullError;
use crate::images::store::ImageInfo;
use crate::net::netns::NetnsError;
use crate::net::{NetError, PodNetInfo, PortMapping};
use crate::spec::{self, HostFacts, ImageConfig, NamespaceMode, SandboxConfig, SpecError};
use crate::store::persist::SANDBOX_EXTENSION;
use crate::store::{
    encode_extension, generate_id, sandbox_name_key, to_labels, ContainerStore, ExitOutcome,
    IdError, NameError, NameIndex, Sandbox, SandboxMetadata, SandboxStatus, SandboxStore,
    StoreError,
};

/// Bound on each rollback step and on each teardown step of Stop/Remove.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long StopPodSandbox waits for the killed pause task to exit.
const KILL_WAIT: Duration = Duration::from_secs(10);

/// Why a sandbox operation failed.
#[derive(Debug, Error)]
pub enum SandboxError {
    /// The runtime handler is not configured.
    #[error("runtime handler {0:?} is not configured (only \"\" and \"runc\" are)")]
    UnknownRuntimeHandler(String),
    /// The pod's name is taken.
    #[error("pod sandbox name is in use: {0}")]
    Name(#[from] NameError),
    /// No id could be generated.
    #[error(transparent)]
    Id(#[from] IdError),
    /// The pause image could not be pulled.
    #[error("sandbox image: {0}")]
    Image(Box<PullError>),
    /// The pause image's config is unreadable.
    #[error("sandbox image {image}: invalid config: {reason}")]
    ImageConfig {
        /// The image.
        image: String,
        /// Why.
        reason: String,
    },
    /// Creating or removing the network namespace failed.
    #[error("network namespace: {0}")]
    Netns(#[from] NetnsError),
    /// CNI failed.
    #[error("pod network: {0}")]
    Network(Box<NetError>),
    /// The pod's files could not be made.
    #[error(transparent)]
    Files(#[from] FilesError),
    /// The spec could not be generated.
    #[error("pod spec: {0}")]
    Spec(#[from] SpecError),
    /// The spec could not be serialised.
    #[error("pod spec: cannot serialise: {0}")]
    Encode(String),
    /// containerd failed.
    #[error(transparent)]
    Containerd(#[from] ContainerdError),
    /// The index refused.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The operation's task panicked or was aborted.
    #[error("pod sandbox operation did not complete: {0}")]
    Aborted(String),
    /// A container of the pod could not be stopped or removed.
    #[error("container of the pod: {0}")]
    Container(String),
    /// The intent could not be recorded (see [`super::journal`]).
    #[error("cannot record the pod sandbox operation in {}: {reason}", path.display())]
    Journal {
        /// The intents dir.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A test failpoint fired.
    #[error("{0}")]
    Failpoint(String),
}

/// A RunPodSandbox request in domain terms.
#[derive(Debug, Clone, Default)]
pub struct RunSandbox {
    /// The pod config.
    pub config: SandboxConfig,
    /// `metadata.attempt`.
    pub attempt: u32,
    /// Pod labels.
    pub labels: HashMap<String, String>,
    /// DNS config; `None` → the host's resolv.conf.
    pub dns: Option<Dns>,
    /// Host port mappings.
    pub port_mappings: Vec<PortMapping>,
    /// Runtime handler ("" = default).
    pub runtime_handler: String,
    /// The raw request config, kept on the record.
    pub config_json: Vec<u8>,
}

/// `Task.Wait` that survives containerd restarts: a wait broken by a lost connection is
/// retried with backoff (the shim keeps the exit status until the task is deleted, so the
/// real exit is still there when containerd is back) for as long as `still_waiting` holds.
pub(crate) async fn wait_through_outages(
    tasks: &dyn Tasks,
    id: &str,
    still_waiting: impl Fn() -> bool,
) -> Result<super::backend::Exit, ContainerdError> {
    let mut backoff =
        crate::backoff::Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
    loop {
        match tasks.wait(id).await {
            Ok(exit) => return Ok(exit),
            // The task is gone (deleted by Stop/Remove, or lost): nothing to wait for.
            Err(
                e @ ContainerdError::Call {
                    code: tonic::Code::NotFound,
                    ..
                },
            ) => return Err(e),
            Err(e) => {
                if !still_waiting() {
                    return Err(e);
                }
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    }
}

/// The lease that protects object `id`'s rootfs snapshot while it is being created.
pub(crate) fn creation_lease_id(id: &str) -> String {
    format!("remora-create-{id}")
}

/// SIGKILLs every process of task `id`, waits (at most [`KILL_WAIT`]) for it to exit and
/// deletes it: the teardown of a task nobody will use (a rollback, a half-made object).
pub(crate) async fn kill_and_delete(tasks: &dyn Tasks, id: &str) -> Result<(), ContainerdError> {
    let _ = tasks.kill(id, libc::SIGKILL as u32, true).await;
    let _ = tokio::time::timeout(KILL_WAIT, tasks.wait(id)).await;
    tasks.delete(id).await.map(|_| ())
}

/// An undo action registered by a step that made something.
pub(crate) type UndoFuture = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;
/// A named undo action.
pub(crate) type UndoStep = (&'static str, UndoFuture);

/// Runs undo actions in reverse order, each bounded by its own timeout, logging failures.
/// Returns whether every step succeeded.
pub(crate) async fn run_undo(steps: Vec<UndoStep>, log: &Logger) -> bool {
    let mut clean = true;
    for (what, step) in steps.into_iter().rev() {
        match tokio::time::timeout(CLEANUP_TIMEOUT, step).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                clean = false;
                warn!(log, "rollback step failed"; "step" => what, "error" => e)
            }
            Err(_) => {
                clean = false;
                warn!(log, "rollback step timed out"; "step" => what)
            }
        }
    }
    clean
}

/// Pods: the sandbox index and what sandboxes are made of.
pub struct Pods {
    /// The sandbox index.
    pub sandboxes: SandboxStore,
    /// The container index.
    containers_store: ContainerStore,
    /// IO of started containers.
    io: IoTable,
    /// Lifecycle events for GetContainerEvents.
    pub events: super::events::EventBus,
    /// Pod name reservations.
    pub names: Arc<NameIndex>,
    containers: Arc<dyn Containers>,
    tasks: Arc<dyn Tasks>,
    snapshots: Arc<dyn Snapshots>,
    leases: Arc<dyn Leases>,
    images: Arc<dyn LocalImages>,
    network: Arc<dyn PodNetwork>,
    /// Where pods' network namespaces are (the network makes them there).
    netns_dir: PathBuf,
    /// Where exit monitors queue the exits they see (set once the event monitor runs).
    pub(crate) exit_queue:
        std::sync::OnceLock<crate::events::queue::OrderedQueue<crate::containerd::events::Event>>,
    /// Containers whose exit monitor is attached (their exits reach the queue from it).
    pub(crate) monitored: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Intents of operations in flight, and stale ones from before a crash.
    journal: super::journal::Journal,
    /// When this remora started (older leases of its own are orphans).
    started_at: SystemTime,
    host: HostFacts,
    state_dir: PathBuf,
    sandbox_image: String,
    snapshotter: String,
    runtime_type: String,
    log: Logger,
}

/// What pods are made of: containerd's services, the local images and the pod network.
pub struct Backends {
    /// containerd's container records.
    pub containers: Arc<dyn Containers>,
    /// containerd's tasks.
    pub tasks: Arc<dyn Tasks>,
    /// containerd's snapshots.
    pub snapshots: Arc<dyn Snapshots>,
    /// containerd's leases.
    pub leases: Arc<dyn Leases>,
    /// The local images (and the pause image's pull).
    pub images: Arc<dyn LocalImages>,
    /// Network namespaces and CNI.
    pub network: Arc<dyn PodNetwork>,
}

/// What [`Pods::new`] needs.
pub struct PodsConfig {
    /// Volatile state dir (`<state_dir>/sandboxes/<id>` holds pod files).
    pub state_dir: PathBuf,
    /// The pause image.
    pub sandbox_image: String,
    /// Snapshotter.
    pub snapshotter: String,
    /// containerd runtime for the default handler.
    pub runtime_type: String,
}

/// An exit time from containerd as ns since the epoch, or now if containerd gave none.
pub(crate) fn exit_ns(at: Option<SystemTime>) -> i64 {
    at.and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_nanos() as i64)
        .unwrap_or_else(now_ns)
}

pub(crate) fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

impl Pods {
    /// Pods over `backends`. Pod network namespaces are expected in `<state_dir>/netns`.
    pub fn new(config: PodsConfig, backends: Backends, host: HostFacts, log: Logger) -> Self {
        // No CreateContainer runs yet: a temp mount there is a killed one's.
        let cleared = super::journal::clear_temp_mounts(&config.state_dir.join("tmpmounts"));
        if cleared > 0 {
            info!(log, "removed temporary mounts left by a crash"; "count" => cleared);
        }
        Self {
            sandboxes: SandboxStore::new(),
            containers_store: ContainerStore::new(),
            io: IoTable::default(),
            events: super::events::EventBus::default(),
            names: Arc::new(NameIndex::new()),
            containers: backends.containers,
            tasks: backends.tasks,
            snapshots: backends.snapshots,
            leases: backends.leases,
            images: backends.images,
            network: backends.network,
            netns_dir: config.state_dir.join("netns"),
            exit_queue: std::sync::OnceLock::new(),
            monitored: Default::default(),
            journal: super::journal::Journal::open(config.state_dir.join("pending")),
            started_at: SystemTime::now(),
            host,
            state_dir: config.state_dir,
            sandbox_image: config.sandbox_image,
            snapshotter: config.snapshotter,
            runtime_type: config.runtime_type,
            log,
        }
    }

    /// Routes exit monitors' exits through the event queue (ordered per container, retried).
    pub fn set_exit_queue(
        &self,
        queue: crate::events::queue::OrderedQueue<crate::containerd::events::Event>,
    ) {
        let _ = self.exit_queue.set(queue);
    }

    /// The netns path pod `id` would have, if it exists.
    pub(crate) fn netns_path_of(&self, id: &str) -> String {
        let p = self.netns_dir.join(id);
        if p.exists() {
            p.display().to_string()
        } else {
            String::new()
        }
    }

    pub(crate) fn journal(&self) -> &super::journal::Journal {
        &self.journal
    }

    pub(crate) fn started_at(&self) -> SystemTime {
        self.started_at
    }

    pub(crate) fn sandbox_dir(&self, id: &str) -> PathBuf {
        self.state_dir.join("sandboxes").join(id)
    }

    /// The container index.
    pub fn containers_store(&self) -> &ContainerStore {
        &self.containers_store
    }

    pub(crate) fn io(&self) -> &IoTable {
        &self.io
    }

    pub(crate) fn state_dir(&self) -> &std::path::Path {
        &self.state_dir
    }

    pub(crate) fn log(&self) -> &Logger {
        &self.log
    }

    pub(crate) fn snapshots(&self) -> Arc<dyn crate::images::backend::Snapshots> {
        self.snapshots.clone()
    }

    pub(crate) fn snapshotter(&self) -> &str {
        &self.snapshotter
    }

    pub(crate) fn containers(&self) -> Arc<dyn Containers> {
        self.containers.clone()
    }

    pub(crate) fn tasks(&self) -> Arc<dyn Tasks> {
        self.tasks.clone()
    }

    pub(crate) fn host(&self) -> &HostFacts {
        &self.host
    }

    pub(crate) fn runtime_type(&self) -> &str {
        &self.runtime_type
    }

    /// A lease that protects a new rootfs snapshot from containerd's GC until the container
    /// record that references it exists (deleted by the caller on success, by the undo on
    /// failure; containerd expires it if remora dies in between).
    pub(crate) async fn creation_lease(
        &self,
        id: &str,
        undo: &mut Vec<UndoStep>,
    ) -> Result<String, ContainerdError> {
        let lease = creation_lease_id(id);
        let leases = self.leases.clone();
        leases.create(&lease, 3600).await?;
        let l = lease.clone();
        undo.push((
            "delete creation lease",
            Box::pin(async move { leases.delete(&l, false).await.map_err(|e| e.to_string()) }),
        ));
        Ok(lease)
    }

    /// The containerd leases service.
    pub(crate) fn leases(&self) -> Arc<dyn crate::images::backend::Leases> {
        self.leases.clone()
    }

    /// A local image by any reference form or id.
    pub(crate) fn find_image(&self, image: &str) -> Option<ImageInfo> {
        self.images.find(image)
    }

    fn runtime_for(&self, handler: &str) -> Result<String, SandboxError> {
        match handler {
            "" | "runc" => Ok(self.runtime_type.clone()),
            other => Err(SandboxError::UnknownRuntimeHandler(other.to_string())),
        }
    }

    async fn sandbox_image(&self) -> Result<ImageInfo, SandboxError> {
        if let Some(info) = self.images.get(&self.sandbox_image) {
            return Ok(info);
        }
        self.images
            .pull(&self.sandbox_image)
            .await
            .map_err(|e| SandboxError::Image(Box::new(e)))
    }

    /// RunPodSandbox. Returns the sandbox id.
    pub async fn run_sandbox(self: &Arc<Self>, req: RunSandbox) -> Result<String, SandboxError> {
        let me = self.clone();
        // Own task: a cancelled RPC must not cut the operation (and its rollback) short.
        tokio::spawn(async move {
            let id = generate_id()?;
            let log = me.log.new(slog::o!("pod_id" => id.clone()));
            let cfg = &req.config;
            let host_network = cfg.security.namespaces.network == NamespaceMode::Node;
            let intent = super::journal::Intent::Sandbox {
                id: id.clone(),
                name: cfg.name.clone(),
                namespace: cfg.namespace.clone(),
                uid: cfg.uid.clone(),
                netns_path: (!host_network).then(|| me.netns_dir.join(&id)),
            };
            me.journal
                .begin(&intent)
                .map_err(|e| SandboxError::Journal {
                    path: me.journal.dir().to_path_buf(),
                    reason: e.to_string(),
                })?;
            let mut undo: Vec<UndoStep> = Vec::new();
            let result = me.run_inner(&id, &req, &mut undo, &log).await;
            if let Err(e) = &result {
                warn!(log, "RunPodSandbox failed; rolling back"; "error" => %e, "steps" => undo.len());
                if !run_undo(undo, &log).await {
                    // e.g. containerd went away mid-call: the sweep after it is back finishes.
                    me.journal.defer(intent);
                    return result.map(|()| id);
                }
            }
            me.journal.end(&id);
            result.map(|()| id)
        })
        .await
        .map_err(|e| SandboxError::Aborted(e.to_string()))?
    }

    async fn run_inner(
        self: &Arc<Self>,
        id: &str,
        req: &RunSandbox,
        undo: &mut Vec<UndoStep>,
        log: &Logger,
    ) -> Result<(), SandboxError> {
        let cfg = &req.config;
        let runtime = self.runtime_for(&req.runtime_handler)?;
        let name_key = sandbox_name_key(&cfg.name, &cfg.namespace, &cfg.uid, req.attempt);
        let reservation = self.names.reserve_guarded(&name_key, id)?;

        let image = self.sandbox_image().await?;
        let image_config = image_config(&image).map_err(|reason| SandboxError::ImageConfig {
            image: self.sandbox_image.clone(),
            reason,
        })?;

        let ns = &cfg.security.namespaces;
        let host_network = ns.network == NamespaceMode::Node;
        let mut netns_path = None;
        let mut ips = Vec::new();
        if !host_network {
            let path = self.network.create_netns(id).await?;
            let (network, p) = (self.network.clone(), path.clone());
            undo.push((
                "remove network namespace",
                Box::pin(async move { network.remove_netns(&p).await.map_err(|e| e.to_string()) }),
            ));
            let info = PodNetInfo {
                id: id.to_string(),
                name: cfg.name.clone(),
                namespace: cfg.namespace.clone(),
                uid: cfg.uid.clone(),
                port_mappings: req.port_mappings.clone(),
                netns_path: path.clone(),
                bandwidth: None,
                dns: None,
            };
            // PodNetwork::setup undoes its own partial ADD; once it succeeded, DEL is ours.
            let result = self
                .network
                .setup(&info)
                .await
                .map_err(|e| SandboxError::Network(Box::new(e)))?;
            ips = result;
            let me = self.clone();
            undo.push((
                "CNI DEL",
                Box::pin(
                    async move { me.network.teardown(&info).await.map_err(|e| e.to_string()) },
                ),
            ));
            netns_path = Some(path);
        }
        crate::failpoint::hit("sandbox.after_network", &cfg.name)
            .await
            .map_err(SandboxError::Failpoint)?;

        // No hostname asked for: the node's, as containerd does (pod names can be longer than
        // a hostname may be).
        let hostname = if cfg.hostname.is_empty() {
            self.host.node_hostname.clone()
        } else {
            cfg.hostname.clone()
        };
        let dir = self.sandbox_dir(id);
        let files = sandbox_files::prepare(
            &dir,
            &FilesRequest {
                hostname: hostname.clone(),
                dns: req.dns.clone(),
                host_network,
                host_ipc: ns.ipc == NamespaceMode::Node,
            },
        )?;
        let d = dir.clone();
        undo.push((
            "remove pod files",
            Box::pin(async move {
                tokio::task::spawn_blocking(move || sandbox_files::remove(&d))
                    .await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| e.to_string())
            }),
        ));

        let lease = self.creation_lease(id, undo).await?;
        let snapshots = self.snapshots.clone();
        let mounts = snapshots
            .prepare(&lease, &self.snapshotter, id, &image.chain_id)
            .await?;
        {
            let (snaps, snapshotter, key) =
                (snapshots.clone(), self.snapshotter.clone(), id.to_string());
            undo.push((
                "remove rootfs snapshot",
                Box::pin(async move {
                    snaps
                        .remove(&snapshotter, &key)
                        .await
                        .map_err(|e| e.to_string())
                }),
            ));
        }
        crate::failpoint::hit("sandbox.after_snapshot", &cfg.name)
            .await
            .map_err(SandboxError::Failpoint)?;

        let mut sandbox_cfg = cfg.clone();
        sandbox_cfg.hostname = hostname.clone();
        let spec = spec::sandbox_spec(&spec::SandboxInputs {
            id,
            config: &sandbox_cfg,
            image: &image_config,
            image_name: &self.sandbox_image,
            rootfs: None,
            netns_path: netns_path.as_deref(),
            files: &files,
            host: &self.host,
            unprivileged_ports: false,
            unprivileged_icmp: false,
        })?;
        let spec_json =
            serde_json::to_vec(&spec).map_err(|e| SandboxError::Encode(e.to_string()))?;

        let mut ip_strings: Vec<String> = ips.iter().map(|ip| ip.to_string()).collect();
        let primary = if ip_strings.is_empty() {
            String::new()
        } else {
            ip_strings.remove(0)
        };
        let metadata = SandboxMetadata {
            id: id.to_string(),
            name: cfg.name.clone(),
            namespace: cfg.namespace.clone(),
            uid: cfg.uid.clone(),
            attempt: req.attempt,
            labels: req.labels.clone(),
            annotations: cfg.annotations.clone(),
            runtime_handler: req.runtime_handler.clone(),
            created_at: now_ns(),
            netns_path: netns_path
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            ip: primary,
            additional_ips: ip_strings,
            hostname,
            log_directory: cfg.log_directory.clone(),
            namespace_options: ns.clone(),
            cgroup_parent: cfg.cgroup_parent.clone(),
            config_json: req.config_json.clone(),
        };
        self.containers
            .create(ContainerRecord {
                id: id.to_string(),
                image: self.sandbox_image.clone(),
                labels: to_labels(&metadata),
                spec: spec_json,
                runtime,
                snapshotter: self.snapshotter.clone(),
                snapshot_key: id.to_string(),
                extensions: HashMap::from([(
                    SANDBOX_EXTENSION.to_string(),
                    encode_extension(&metadata),
                )]),
            })
            .await?;
        {
            let (containers, key) = (self.containers.clone(), id.to_string());
            undo.push((
                "delete container record",
                Box::pin(async move { containers.delete(&key).await.map_err(|e| e.to_string()) }),
            ));
        }

        self.tasks
            .create(TaskSpec {
                container_id: id.to_string(),
                rootfs: mounts,
                ..Default::default()
            })
            .await?;
        {
            let (tasks, key) = (self.tasks.clone(), id.to_string());
            undo.push((
                "delete task",
                Box::pin(async move {
                    kill_and_delete(tasks.as_ref(), &key)
                        .await
                        .map_err(|e| e.to_string())
                }),
            ));
        }
        crate::failpoint::hit("sandbox.after_task", &cfg.name)
            .await
            .map_err(SandboxError::Failpoint)?;
        let pid = self.tasks.start(id).await?;
        // The container record now holds the snapshot; the creation lease can go.
        self.leases.delete(&lease, false).await?;

        let sandbox = Sandbox::new(metadata, SandboxStatus::ready(pid));
        self.sandboxes.add(sandbox.clone())?;
        reservation.keep();
        undo.clear();
        self.monitor_exit(sandbox);
        self.events.emit(id, id, EventKind::Created, now_ns());
        self.events.emit(id, id, EventKind::Started, now_ns());
        info!(log, "pod sandbox running"; "pid" => pid, "name" => &cfg.name, "namespace" => &cfg.namespace);
        Ok(())
    }

    /// Records the pause task's exit when it happens (Task.Wait is the truth for exits).
    pub(crate) fn monitor_exit(self: &Arc<Self>, sandbox: Sandbox) {
        let tasks = self.tasks.clone();
        let log = self.log.new(slog::o!("pod_id" => sandbox.id().to_string()));
        tokio::spawn(async move {
            match wait_through_outages(tasks.as_ref(), sandbox.id(), || {
                sandbox.status().exit_code.is_none()
            })
            .await
            {
                Ok(exit) => {
                    let at = exit_ns(exit.at);
                    if sandbox.record_exit(exit.status as i32, at) == ExitOutcome::Recorded {
                        info!(log, "pod sandbox task exited"; "exit_status" => exit.status);
                    }
                }
                // The connection to containerd broke: the recovery issue re-attaches monitors.
                Err(e) => warn!(log, "lost the wait on the pod sandbox task"; "error" => %e),
            }
        });
    }

    /// StopPodSandbox: pause task killed and deleted, network torn down, NotReady. Idempotent;
    /// an unknown id is success (kubelet retries stops of pods it already removed).
    pub async fn stop_sandbox(self: &Arc<Self>, id: &str) -> Result<(), SandboxError> {
        let sandbox = match self.sandboxes.get(id) {
            Ok(s) => s,
            Err(StoreError::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let me = self.clone();
        tokio::spawn(async move { me.stop_inner(&sandbox).await })
            .await
            .map_err(|e| SandboxError::Aborted(e.to_string()))?
    }

    async fn stop_inner(&self, sandbox: &Sandbox) -> Result<(), SandboxError> {
        let id = sandbox.id();
        let log = self.log.new(slog::o!("pod_id" => id.to_string()));
        // The pod's containers go first (kubelet has stopped them gracefully already).
        for c in self.containers_store.by_sandbox(id) {
            if let Err(e) = self.stop_inner_container(&c).await {
                warn!(log, "cannot stop a container of the pod"; "container_id" => c.id(), "error" => %e);
                return Err(SandboxError::Container(e.to_string()));
            }
        }
        if let Some(state) = self.tasks.state(id).await? {
            if state.status != TaskStatus::Stopped {
                match self.tasks.kill(id, libc::SIGKILL as u32, true).await {
                    Ok(()) => {}
                    Err(ContainerdError::Call {
                        code: tonic::Code::NotFound,
                        ..
                    }) => {}
                    Err(e) => return Err(e.into()),
                }
                if tokio::time::timeout(KILL_WAIT, self.tasks.wait(id))
                    .await
                    .is_err()
                {
                    warn!(log, "pause task did not exit after SIGKILL"; "waited_s" => KILL_WAIT.as_secs());
                }
            }
            if let Some(exit) = self.tasks.delete(id).await? {
                let at = exit_ns(exit.at);
                // First exit wins: the exit monitor may have recorded it already.
                let _ = sandbox.record_exit(exit.status as i32, at);
            }
        }
        let meta = sandbox.metadata();
        if !meta.netns_path.is_empty() {
            self.teardown_network(
                id,
                &meta.name,
                &meta.namespace,
                &meta.uid,
                std::path::Path::new(&meta.netns_path),
            )
            .await?;
        }
        let dir = self.sandbox_dir(id);
        tokio::task::spawn_blocking(move || sandbox_files::unmount_shm(&dir))
            .await
            .map_err(|e| SandboxError::Aborted(e.to_string()))??;
        sandbox.set_not_ready();
        self.events.emit(id, id, EventKind::Stopped, now_ns());
        info!(log, "pod sandbox stopped");
        Ok(())
    }

    /// CNI DEL for pod `id`, then its netns removed. Both are idempotent.
    pub(crate) async fn teardown_network(
        &self,
        id: &str,
        name: &str,
        namespace: &str,
        uid: &str,
        netns_path: &std::path::Path,
    ) -> Result<(), SandboxError> {
        let info = PodNetInfo {
            id: id.to_string(),
            name: name.to_string(),
            namespace: namespace.to_string(),
            uid: uid.to_string(),
            port_mappings: Vec::new(),
            netns_path: netns_path.to_path_buf(),
            bandwidth: None,
            dns: None,
        };
        self.network
            .teardown(&info)
            .await
            .map_err(|e| SandboxError::Network(Box::new(e)))?;
        self.network.remove_netns(netns_path).await?;
        Ok(())
    }

    /// RemovePodSandbox: stopped if needed, then every trace removed (task, container record,
    /// snapshot, files, netns, name). Idempotent; an unknown id is success.
    pub async fn remove_sandbox(self: &Arc<Self>, id: &str) -> Result<(), SandboxError> {
        let sandbox = match self.sandboxes.get(id) {
            Ok(s) => s,
            Err(StoreError::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let me = self.clone();
        tokio::spawn(async move {
            me.stop_inner(&sandbox).await?;
            let id = sandbox.id().to_string();
            for c in me.containers_store.by_sandbox(&id) {
                me.remove_container_inner(&c)
                    .await
                    .map_err(|e| SandboxError::Container(e.to_string()))?;
            }
            me.containers.delete(&id).await?;
            me.snapshots.remove(&me.snapshotter, &id).await?;
            let dir = me.sandbox_dir(&id);
            tokio::task::spawn_blocking(move || sandbox_files::remove(&dir))
                .await
                .map_err(|e| SandboxError::Aborted(e.to_string()))??;
            me.names.release(&sandbox.metadata().name_key());
            match me.sandboxes.delete(&id) {
                Ok(_) | Err(StoreError::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            me.events.emit(&id, &id, EventKind::Deleted, now_ns());
            info!(me.log, "pod sandbox removed"; "pod_id" => &id);
            Ok(())
        })
        .await
        .map_err(|e| SandboxError::Aborted(e.to_string()))?
    }
}

/// The spec-relevant parts of an image's config.
pub fn image_config(image: &ImageInfo) -> Result<ImageConfig, String> {
    let parsed = OciImageConfig::parse(image.config_json.as_bytes()).map_err(|e| e.to_string())?;
    let c = parsed.config;
    Ok(ImageConfig {
        user: c.user.unwrap_or_default(),
        env: c.env,
        entrypoint: c.entrypoint,
        cmd: c.cmd,
        working_dir: c.working_dir.unwrap_or_default(),
        stop_signal: c.stop_signal.unwrap_or_default(),
    })
}
