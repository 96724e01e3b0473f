//! Pod sandbox and container lifecycle: [`Pods`], and its operations in files named for the
//! CRI RPC they serve.
//!
//! The crate is Linux-only, so Linux files carry no `_linux` suffix (and no path attribute).
//!
//! | RPC | file |
//! |---|---|
//! | RunPodSandbox | `sandbox_run.rs` |
//! | StopPodSandbox | `sandbox_stop.rs` |
//! | RemovePodSandbox | `sandbox_remove.rs` |
//! | CreateContainer | `container_create.rs` |
//! | StartContainer | `container_start.rs` |
//! | StopContainer | `container_stop.rs` |
//! | RemoveContainer | `container_remove.rs` |
//! | UpdateContainerResources, ReopenContainerLog | `container_update.rs` |
//! | (a container's exit) | `container_exit.rs` |
//! | ExecSync | `container_exec.rs` |
//! | ContainerStats, ListContainerStats | `container_stats.rs` |
//! | PodSandboxStats, ListPodSandboxStats | `sandbox_stats.rs` |
//! | ListMetricDescriptors, ListPodSandboxMetrics | `sandbox_metrics.rs` |
//! | (the readings behind the stats RPCs) | `stats_sampler.rs` |
//! | (restart: sweep and recovery) | `recover.rs` |
//!
//! - `backend`: what lifecycle needs from below, as narrow traits (containerd's records and
//!   tasks, the local images, the pod network); `crate::host_network` implements the
//!   pod network, `crate::oci` the OCI runtime's command line.
//! - `tx`: a mutating operation's intent (`journal`) and undo list; `error`: why an
//!   operation failed, with a failed rollback reported beside the failure.
//! - `sandbox_files`: the hostname/hosts/resolv.conf files and `/dev/shm` a pod shares;
//!   `mount`: temporary mounts; `host`: facts about this host that specs depend on;
//!   [`apparmor`]: the profile a container runs under is loaded (remora's default loaded
//!   if missing).
//! - `cgroup_stats`: a cgroup's CPU, memory and process figures (v1 and v2), behind every
//!   stats RPC; `stats_sampler`: those figures read at most once per period for all callers.
//!
//! Every mutating operation runs in a task of its own, so a kubelet that gives up (cancelling
//! the RPC) cannot interrupt it half way and skip the rollback: the caller's cancellation is
//! never the cleanup's.

pub mod apparmor;
pub(crate) mod backend;
pub(crate) mod cgroup_metrics;
pub(crate) mod cgroup_stats;
mod container_create;
pub(crate) mod container_events;
pub(crate) mod container_exec;
mod container_exit;
mod container_remove;
mod container_start;
pub(crate) mod container_stats;
mod container_stop;
mod container_stream;
mod container_update;
pub(crate) mod error;
pub(crate) mod handlers;
pub(crate) mod host;
mod image_volume;
pub(crate) mod journal;
pub(crate) mod mount;
pub(crate) mod mountinfo;
pub(crate) mod nri;
pub(crate) mod recover;
pub(crate) mod sandbox_files;
pub(crate) mod sandbox_metrics;
mod sandbox_remove;
mod sandbox_run;
pub(crate) mod sandbox_stats;
mod sandbox_stop;
mod sandbox_update;
pub(crate) mod snapshot_usage;
pub(crate) mod stats_read;
pub(crate) mod stats_sampler;
#[cfg(test)]
mod tests;
mod timing;
mod tx;
pub(crate) mod userns;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use slog::{info, Logger};

use crate::images::backend::{Leases, Snapshots};
use crate::images::store::ImageInfo;
use crate::io::{FifoSet, LogWriter};
use crate::spec::{HostFacts, ImageConfig};
use crate::store::{ContainerStore, NameIndex, SandboxStore};

use backend::Exit;
pub(crate) use backend::{Containers, LocalImages, OciRuntime, PodNetwork, Tasks};
pub(crate) use container_create::CreateRequest;
pub(crate) use error::{ContainerError, SandboxError, UndoError};
pub(crate) use handlers::{HandlerRuntime, RuntimeHandlers};
pub(crate) use sandbox_run::RunSandbox;

use crate::backend_error::BackendError;

/// How long a SIGKILLed task gets to exit.
const KILL_WAIT: Duration = Duration::from_secs(10);

/// Pods: the sandbox and container indexes, and what sandboxes and containers are made of.
///
/// Its fields are private to [`crate::lifecycle`], whose files (one per RPC) all see them.
pub struct Pods {
    /// The sandbox index.
    pub sandboxes: SandboxStore,
    /// The container index.
    containers_store: ContainerStore,
    /// IO of started containers.
    io: IoTable,
    /// Lifecycle events for GetContainerEvents.
    pub events: container_events::EventBus,
    /// Pod and container name reservations.
    pub names: Arc<NameIndex>,
    containers: Arc<dyn Containers>,
    tasks: Arc<dyn Tasks>,
    snapshots: Arc<dyn Snapshots>,
    /// Snapshot disk usage, walked at most once per period (ImageFsInfo, stats).
    snapshot_usage: Arc<snapshot_usage::SnapshotUsage>,
    /// Cgroup and network readings, sampled at most once per period (the stats RPCs).
    stats_sampler: Arc<stats_sampler::StatsSampler>,
    leases: Arc<dyn Leases>,
    images: Arc<dyn LocalImages>,
    network: Arc<dyn PodNetwork>,
    oci: Arc<dyn OciRuntime>,
    apparmor: Arc<apparmor::AppArmor>,
    /// Where pods' network namespaces are (the network makes them there).
    netns_dir: PathBuf,
    /// Where exit monitors queue the exits they see (set once the event monitor runs).
    exit_queue: OnceLock<Arc<dyn backend::ExitQueue>>,
    /// containerd's reachability, for exit monitors waiting out an outage.
    reachability: OnceLock<Box<dyn backend::Reachability>>,
    /// Containers whose exit monitor is attached (their exits reach the queue from it).
    monitored: Mutex<HashSet<String>>,
    /// Containers whose exit is being recorded (`handle_exit` running, its task delete last).
    exiting: container_exit::ExitsInFlight,
    /// Removed containers whose containerd objects are being cleaned up.
    removals: container_remove::Removals,
    /// Intents of operations in flight, and stale ones from before a crash.
    journal: journal::Journal,
    /// When this remora started (older leases of its own are orphans).
    started_at: SystemTime,
    /// Held while a sandbox record's metadata is rewritten after creation, so two
    /// UpdatePodSandboxResources calls cannot write their records in one order and their
    /// in-memory copies in the other.
    sandbox_updates: tokio::sync::Mutex<()>,
    host: HostFacts,
    state_dir: PathBuf,
    sandbox_image: String,
    snapshotter: String,
    handlers: RuntimeHandlers,
    cdi: Arc<crate::cdi::Registry>,
    /// NRI's hooks, once the registry runs (never set when `[nri] enable = false`).
    nri: OnceLock<Arc<dyn nri::NriHooks>>,
    /// Pods and containers whose StopPodSandbox / StopContainer NRI event was sent: each is
    /// sent once, and forgotten on removal.
    nri_stopped: Mutex<HashSet<String>>,
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
    /// The OCI runtime's command line (for containers whose shim died).
    pub oci: Arc<dyn OciRuntime>,
    /// The host's AppArmor profiles (checked before a create when the host has AppArmor).
    pub apparmor: Arc<apparmor::AppArmor>,
    /// The cgroup and network reads behind the stats RPCs.
    pub stats: Arc<dyn stats_sampler::StatsSource>,
}

/// What [`Pods::new`] needs.
pub struct PodsConfig {
    /// Volatile state dir (`<state_dir>/sandboxes/<id>` holds pod files).
    pub state_dir: PathBuf,
    /// The pause image.
    pub sandbox_image: String,
    /// Snapshotter.
    pub snapshotter: String,
    /// The runtime handlers pods can ask for.
    pub handlers: RuntimeHandlers,
    /// CDI spec registry (devices containers ask for by name).
    pub cdi: Arc<crate::cdi::Registry>,
}

/// The IO of a started container: its FIFOs, log writer, and remora's end of its stdin.
pub struct ContainerIo {
    fifos: FifoSet,
    log: Option<Arc<LogWriter>>,
    /// Written by attach sessions; opened on the first one (see `container_stream`).
    stdin: tokio::sync::Mutex<container_stream::StdinEnd>,
}

impl ContainerIo {
    pub(crate) fn new(fifos: FifoSet, log: Option<Arc<LogWriter>>) -> Self {
        Self {
            fifos,
            log,
            stdin: tokio::sync::Mutex::new(container_stream::StdinEnd::Unopened),
        }
    }
}

/// Live IO of started containers, by id.
#[derive(Default)]
pub struct IoTable {
    inner: Mutex<HashMap<String, Arc<ContainerIo>>>,
}

impl IoTable {
    fn insert(&self, id: &str, io: Arc<ContainerIo>) {
        self.lock().insert(id.to_string(), io);
    }

    fn get(&self, id: &str) -> Option<Arc<ContainerIo>> {
        self.lock().get(id).cloned()
    }

    fn remove(&self, id: &str) -> Option<Arc<ContainerIo>> {
        self.lock().remove(id)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<ContainerIo>>> {
        // Only map operations run under this lock.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Pods {
    /// Pods over `backends`. Pod network namespaces are expected in `<state_dir>/netns`.
    pub fn new(config: PodsConfig, backends: Backends, host: HostFacts, log: Logger) -> Self {
        // No CreateContainer runs yet: a temp mount there is a killed one's.
        let cleared = journal::clear_temp_mounts(&config.state_dir.join("tmpmounts"));
        if cleared > 0 {
            info!(log, "removed temporary mounts left by a crash"; "count" => cleared);
        }
        let snapshot_usage = Arc::new(snapshot_usage::SnapshotUsage::new(
            backends.snapshots.clone(),
            config.snapshotter.clone(),
            snapshot_usage::COLLECT_PERIOD,
            log.new(slog::o!("component" => "snapshot-usage")),
        ));
        let stats_sampler = stats_sampler::StatsSampler::new(
            backends.stats,
            stats_sampler::Limits::default(),
            log.new(slog::o!("component" => "stats")),
        );
        Self {
            sandboxes: SandboxStore::new(),
            containers_store: ContainerStore::new(),
            io: IoTable::default(),
            events: container_events::EventBus::default(),
            names: Arc::new(NameIndex::new()),
            containers: backends.containers,
            tasks: backends.tasks,
            snapshots: backends.snapshots,
            snapshot_usage,
            stats_sampler,
            leases: backends.leases,
            images: backends.images,
            network: backends.network,
            oci: backends.oci,
            apparmor: backends.apparmor,
            netns_dir: config.state_dir.join("netns"),
            exit_queue: OnceLock::new(),
            monitored: Default::default(),
            exiting: Default::default(),
            removals: Default::default(),
            reachability: OnceLock::new(),
            journal: journal::Journal::open(config.state_dir.join("pending")),
            started_at: SystemTime::now(),
            sandbox_updates: tokio::sync::Mutex::new(()),
            host,
            state_dir: config.state_dir,
            sandbox_image: config.sandbox_image,
            snapshotter: config.snapshotter,
            handlers: config.handlers,
            cdi: config.cdi,
            nri: OnceLock::new(),
            nri_stopped: Mutex::new(HashSet::new()),
            log,
        }
    }

    /// Calls `hooks` at every pod and container event from now on (see [`nri`]). Set once.
    pub(crate) fn set_nri(&self, hooks: Arc<dyn nri::NriHooks>) {
        let _ = self.nri.set(hooks);
    }

    /// NRI's hooks, if NRI is on.
    pub(crate) fn nri(&self) -> Option<&Arc<dyn nri::NriHooks>> {
        self.nri.get()
    }

    /// Whether the NRI stop event of pod or container `id` is still to be sent; the first
    /// call for an id says yes.
    fn nri_first_stop(&self, id: &str) -> bool {
        // Only set operations run under this lock.
        self.nri_stopped
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.to_string())
    }

    /// Forgets pod or container `id`'s NRI stop (it was removed).
    fn nri_forget(&self, id: &str) {
        self.nri_stopped
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
    }

    /// Snapshot disk usage (ImageFsInfo sums it; container stats read their writable layer).
    pub fn snapshot_usage(&self) -> &Arc<snapshot_usage::SnapshotUsage> {
        &self.snapshot_usage
    }

    /// The stats sampler (the metrics endpoint observes its collections).
    pub fn stats_sampler(&self) -> &Arc<stats_sampler::StatsSampler> {
        &self.stats_sampler
    }

    /// Tells exit monitors when containerd is back after an outage (set once the health
    /// monitor runs; without it they retry on their own backoff alone).
    pub fn set_reachability(&self, reachability: Box<dyn backend::Reachability>) {
        let _ = self.reachability.set(reachability);
    }

    /// A handle on containerd's reachability (one that never fires without a monitor).
    pub(crate) fn reachability(&self) -> Box<dyn backend::Reachability> {
        match self.reachability.get() {
            Some(r) => r.handle(),
            None => Box::new(backend::NeverBack),
        }
    }

    /// Routes exit monitors' exits through the event queue (ordered per container, retried).
    pub fn set_exit_queue(&self, queue: Arc<dyn backend::ExitQueue>) {
        let _ = self.exit_queue.set(queue);
    }

    /// Loads remora's default AppArmor profile if the host has AppArmor and the kernel does
    /// not have the profile (at start; a failure is logged there and answered to each
    /// create that needs the profile).
    pub async fn load_default_apparmor(&self) {
        if self.host.apparmor_enabled {
            let _ = self.apparmor.ensure_default().await;
        }
    }

    /// Checks, before anything is made, that the AppArmor profile the spec will name is
    /// loaded (remora's default loaded if missing): runc would refuse it only at start, with
    /// a runtime error. `default_applies`: an unprivileged process that asks for nothing gets
    /// the default profile (containers; a pod's pause process gets only what it asks for).
    /// A request the spec refuses anyway (a profile on a host without AppArmor) passes here.
    async fn check_apparmor(
        &self,
        sec: &crate::spec::SecurityContext,
        default_applies: bool,
    ) -> Result<(), apparmor::AppArmorError> {
        if sec.apparmor.is_none() && !default_applies {
            return Ok(());
        }
        match crate::spec::security::apparmor_profile(
            sec.apparmor.as_ref(),
            sec.privileged,
            self.host.apparmor_enabled,
        ) {
            Ok(Some(profile)) => self.apparmor.require(&profile).await,
            Ok(None) | Err(_) => Ok(()),
        }
    }

    /// The container index.
    pub fn containers_store(&self) -> &ContainerStore {
        &self.containers_store
    }

    /// Gauges of current state for the metrics endpoint: pods and containers by state (every
    /// state present, zeros included, so a series never vanishes), and the exit monitors
    /// attached. Read at scrape time; takes the stores' read locks briefly.
    pub fn state_gauges(&self) -> Vec<crate::metrics::GaugeFamily> {
        use crate::store::{ContainerFilter, ContainerState, SandboxFilter, SandboxState};
        let mut pods = [0usize; 3];
        for sb in self.sandboxes.list(&SandboxFilter::default()) {
            pods[match sb.status.state {
                SandboxState::Ready => 0,
                SandboxState::NotReady => 1,
                SandboxState::Unknown => 2,
            }] += 1;
        }
        let mut containers = [0usize; 4];
        for c in self
            .containers_store
            .list(&ContainerFilter::default(), &self.sandboxes)
        {
            containers[match c.status.state {
                ContainerState::Created => 0,
                ContainerState::Running => 1,
                ContainerState::Exited => 2,
                ContainerState::Unknown => 3,
            }] += 1;
        }
        let by_state = |names: &[&'static str], counts: &[usize]| {
            names
                .iter()
                .zip(counts)
                .map(|(name, n)| (vec![("state", name.to_string())], *n as f64))
                .collect()
        };
        let monitors = self
            .monitored
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len();
        vec![
            crate::metrics::GaugeFamily {
                name: "pods",
                help: "Pod sandboxes by state",
                unit: None,
                samples: by_state(&["ready", "notready", "unknown"], &pods),
            },
            crate::metrics::GaugeFamily {
                name: "containers",
                help: "Containers by state",
                unit: None,
                samples: by_state(&["created", "running", "exited", "unknown"], &containers),
            },
            crate::metrics::GaugeFamily::single(
                "exit_monitors",
                "Containers whose exit monitor is attached",
                None,
                monitors as f64,
            ),
        ]
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

    pub(crate) fn sandbox_dir(&self, id: &str) -> PathBuf {
        self.state_dir.join("sandboxes").join(id)
    }

    /// Container `id` (or a unique prefix of it), if it is running; `NotRunning` otherwise.
    pub(crate) fn running_container(
        &self,
        id: &str,
    ) -> Result<crate::store::Container, ContainerError> {
        let container = self.containers_store.get(id)?;
        if container.state() != crate::store::ContainerState::Running {
            return Err(ContainerError::NotRunning(container.id().to_string()));
        }
        Ok(container)
    }

    pub(crate) fn io_dir(&self, id: &str) -> PathBuf {
        self.state_dir.join("io").join(id)
    }

    /// A local image by any reference form or id.
    pub(crate) fn find_image(&self, image: &str) -> Option<ImageInfo> {
        self.images.find(image)
    }

    /// A lease that protects a new rootfs snapshot from containerd's GC until the container
    /// record that references it exists (deleted by the caller on success, by the undo on
    /// failure; containerd expires it if remora dies in between).
    pub(crate) async fn creation_lease(
        &self,
        tx: &mut impl tx::UndoLog,
    ) -> Result<String, BackendError> {
        let lease = creation_lease_id(tx.id());
        self.leases.create(&lease, 3600).await?;
        let (leases, l) = (self.leases.clone(), lease.clone());
        tx.on_undo("delete creation lease", async move {
            leases.delete(&l, false).await
        });
        Ok(lease)
    }

    /// The runtime of pod `pod`'s handler `handler` (as recorded in its metadata), which every
    /// container of the pod runs with.
    pub(crate) fn pod_runtime(
        &self,
        pod: &str,
        handler: &str,
    ) -> Result<&HandlerRuntime, ContainerError> {
        self.handlers
            .resolve(handler)
            .map(|(_, rt)| rt)
            .map_err(|name| ContainerError::PodHandlerGone {
                pod: pod.to_string(),
                handler: name,
            })
    }

    /// The runtime handlers.
    pub fn handlers(&self) -> &RuntimeHandlers {
        &self.handlers
    }

    /// Sends `signal` to task `id` (to every process of it for SIGKILL); a task already gone
    /// is not an error, nor is one whose shim is gone (a container's exit monitor reaps it,
    /// containerd cleans up after an unsandboxed one).
    pub(crate) async fn kill_ignoring_gone(
        &self,
        id: &str,
        signal: u32,
    ) -> Result<(), BackendError> {
        match self
            .tasks
            .kill(id, signal, signal == libc::SIGKILL as u32)
            .await
        {
            Err(e) if e.is_not_found() || e.is_shim_gone() => Ok(()),
            other => other,
        }
    }
}

/// `Task.Wait` that survives containerd restarts: a wait broken by a lost connection is
/// retried (the shim keeps the exit status until the task is deleted, so the real exit is still
/// there when containerd is back) for as long as `still_waiting` holds — at once when the health
/// monitor sees containerd answer again, or after a backoff if it never left. With
/// `shim_gone_ends_it`, containerd saying the task's shim is gone ends the wait too (the
/// caller reaps what the shim left; see [`BackendError::is_shim_gone`]); without it, the
/// wait goes on until containerd's own dead-shim cleanup deletes the task.
pub(crate) async fn wait_through_outages(
    tasks: &dyn Tasks,
    id: &str,
    mut reachability: Box<dyn backend::Reachability>,
    shim_gone_ends_it: bool,
    still_waiting: impl Fn() -> bool,
) -> Result<Exit, BackendError> {
    let mut backoff =
        remora_host::backoff::Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
    loop {
        reachability.mark_seen();
        match tasks.wait(id).await {
            Ok(exit) => return Ok(exit),
            // The task is gone (deleted by Stop/Remove, or lost): nothing to wait for.
            Err(e) if e.is_not_found() => return Err(e),
            Err(e) if shim_gone_ends_it && e.is_shim_gone() => return Err(e),
            Err(e) => {
                if !still_waiting() {
                    return Err(e);
                }
                reachability.suspect();
                tokio::select! {
                    _ = tokio::time::sleep(backoff.next_delay()) => {}
                    _ = reachability.back() => {}
                }
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
pub(crate) async fn kill_and_delete(tasks: &dyn Tasks, id: &str) -> Result<(), BackendError> {
    let _ = tasks.kill(id, libc::SIGKILL as u32, true).await;
    let _ = tokio::time::timeout(KILL_WAIT, tasks.wait(id)).await;
    tasks.delete(id).await.map(|_| ())
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

/// The spec-relevant parts of an image's config (parsed when the image was indexed).
pub fn image_config(image: &ImageInfo) -> ImageConfig {
    let c = &image.config.config;
    ImageConfig {
        user: c.user.clone().unwrap_or_default(),
        env: c.env.clone(),
        entrypoint: c.entrypoint.clone(),
        cmd: c.cmd.clone(),
        working_dir: c.working_dir.clone().unwrap_or_default(),
        stop_signal: c.stop_signal.clone().unwrap_or_default(),
    }
}

/// Runs blocking file-system work off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, tokio::task::JoinError> {
    tokio::task::spawn_blocking(f).await
}
