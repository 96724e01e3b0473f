//! Containers: CreateContainer, StartContainer, StopContainer, RemoveContainer,
//! ReopenContainerLog, and each container's exit monitor and log copiers.
//!
//! The state machine lives in [`crate::store`]; this file does the containerd and host work
//! around each transition. As for sandboxes, every mutating operation runs in a task of its
//! own (a cancelled RPC cannot cut it short) and rolls back what it made when it fails.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use slog::{info, warn};
use thiserror::Error;

use super::backend::{ContainerRecord, TaskSpec, TaskStatus};
use super::events::EventKind;
use super::mount::with_temp_mount;
use super::sandbox::{exit_ns, image_config, now_ns, Pods};
use crate::containerd::error::ContainerdError;
use crate::images::store::ImageInfo;
use crate::io::{copy_stream, FifoSet, FifoSpec, LogWriter, StreamKind};
use crate::spec::{self, ContainerConfig, HostDevice, SandboxFiles, SandboxInfo};
use crate::store::persist::CONTAINER_EXTENSION;
use crate::store::{
    container_name_key, encode_extension, generate_id, to_labels, Container, ContainerMetadata,
    ContainerState, ContainerStatus, ExitOutcome, SandboxState, StoreError,
};

/// How long StopContainer waits after SIGKILL for the exit.
const KILL_WAIT: Duration = Duration::from_secs(10);

/// Why a container operation failed.
#[derive(Debug, Error)]
pub enum ContainerError {
    /// The pod does not exist.
    #[error("pod sandbox {0:?} not found")]
    SandboxNotFound(String),
    /// The pod is not ready.
    #[error("pod sandbox {0} is not ready")]
    SandboxNotReady(String),
    /// The image is not present (kubelet pulls before it creates).
    #[error("image {0:?} not found: pull it first")]
    ImageNotFound(String),
    /// The name is taken.
    #[error("container name is in use: {0}")]
    Name(#[from] crate::store::NameError),
    /// The image config is unreadable.
    #[error("image {image}: invalid config: {reason}")]
    ImageConfig {
        /// The image.
        image: String,
        /// Why.
        reason: String,
    },
    /// The root filesystem could not be mounted to resolve the user.
    #[error("reading the container's root filesystem: {0}")]
    Rootfs(String),
    /// The spec could not be generated (a bad request).
    #[error("container spec: {0}")]
    Spec(#[from] spec::SpecError),
    /// A host-side step failed.
    #[error("cannot {action} {}: {reason}", path.display())]
    Host {
        /// What.
        action: &'static str,
        /// Where.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The spec could not be serialised.
    #[error("container spec: cannot serialise: {0}")]
    Encode(String),
    /// containerd failed.
    #[error(transparent)]
    Containerd(#[from] ContainerdError),
    /// The index refused (not found, wrong state).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The intent could not be recorded (see [`super::journal`]).
    #[error("cannot record the container operation in {}: {reason}", path.display())]
    Journal {
        /// The intents dir.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A test failpoint fired.
    #[error("{0}")]
    Failpoint(String),
    /// The container is in the wrong state for the operation.
    #[error(transparent)]
    Transition(#[from] crate::store::TransitionError),
    /// The operation's task panicked or was aborted.
    #[error("container operation did not complete: {0}")]
    Aborted(String),
    /// The container is not running (ReopenContainerLog, ExecSync).
    #[error("container {0} is not running")]
    NotRunning(String),
    /// ExecSync without a command.
    #[error("the command to execute is empty")]
    EmptyCommand,
    /// ExecSync's timeout passed; the process was killed.
    #[error("command timed out after {0:?} and was killed")]
    ExecTimeout(Duration),
}

/// A CreateContainer request in domain terms.
#[derive(Debug, Clone)]
pub struct CreateRequest {
    /// Pod sandbox id (full or unique prefix).
    pub sandbox_id: String,
    /// The container config.
    pub config: ContainerConfig,
    /// Store metadata prepared by the adapter (id and sandbox id are filled in here).
    pub metadata: ContainerMetadata,
    /// The image the container asks for (any reference form or id).
    pub image: String,
    /// PID namespace target container id (for `NamespaceMode::Target`).
    pub target_id: Option<String>,
    /// The pod's config as the request carries it (converted by the adapter); `None` → what
    /// the sandbox's record says.
    pub sandbox_config: Option<spec::SandboxConfig>,
}

/// The IO of a started container: its FIFOs and log writer.
pub struct ContainerIo {
    fifos: FifoSet,
    log: Option<Arc<LogWriter>>,
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

/// The pod's config from what its record keeps, for a request that carries none.
fn fallback_sandbox_config(meta: &crate::store::SandboxMetadata) -> spec::SandboxConfig {
    spec::SandboxConfig {
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        uid: meta.uid.clone(),
        hostname: meta.hostname.clone(),
        log_directory: meta.log_directory.clone(),
        cgroup_parent: meta.cgroup_parent.clone(),
        annotations: meta.annotations.clone(),
        ..Default::default()
    }
}

/// `stat`s a host device node for the spec's device list.
fn host_device(path: &Path) -> std::io::Result<HostDevice> {
    use nix::sys::stat::{major, minor, stat, SFlag};
    let st = stat(path).map_err(std::io::Error::from)?;
    let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
    let kind = if kind == SFlag::S_IFBLK {
        spec::DeviceKind::Block
    } else if kind == SFlag::S_IFCHR {
        spec::DeviceKind::Char
    } else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} is not a device", path.display()),
        ));
    };
    Ok(HostDevice {
        kind,
        major: major(st.st_rdev) as i64,
        minor: minor(st.st_rdev) as i64,
        file_mode: st.st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
    })
}

impl Pods {
    pub(crate) fn io_dir(&self, id: &str) -> PathBuf {
        self.state_dir().join("io").join(id)
    }

    /// CreateContainer. Returns the container id.
    pub async fn create_container(
        self: &Arc<Self>,
        req: CreateRequest,
    ) -> Result<String, ContainerError> {
        let me = self.clone();
        tokio::spawn(async move {
            let id = generate_id().map_err(|e| ContainerError::Encode(e.to_string()))?;
            let intent = super::journal::Intent::Container { id: id.clone() };
            me.journal()
                .begin(&intent)
                .map_err(|e| ContainerError::Journal {
                    path: me.journal().dir().to_path_buf(),
                    reason: e.to_string(),
                })?;
            let mut undo: Vec<super::sandbox::UndoStep> = Vec::new();
            let result = me.create_inner(&id, req, &mut undo).await;
            if let Err(e) = &result {
                let log = me.log().new(slog::o!("container_id" => id.clone()));
                warn!(log, "CreateContainer failed; rolling back"; "error" => %e);
                if !super::sandbox::run_undo(undo, &log).await {
                    // e.g. containerd went away mid-call: the sweep after it is back finishes.
                    me.journal().defer(intent);
                    return result.map(|()| id);
                }
            }
            me.journal().end(&id);
            result.map(|()| id)
        })
        .await
        .map_err(|e| ContainerError::Aborted(e.to_string()))?
    }

    async fn create_inner(
        self: &Arc<Self>,
        id: &str,
        req: CreateRequest,
        undo: &mut Vec<super::sandbox::UndoStep>,
    ) -> Result<(), ContainerError> {
        let sandbox = match self.sandboxes.get(&req.sandbox_id) {
            Ok(s) => s,
            Err(StoreError::NotFound { .. }) => {
                return Err(ContainerError::SandboxNotFound(req.sandbox_id.clone()))
            }
            Err(e) => return Err(e.into()),
        };
        let sb = sandbox.snapshot();
        if sb.status.state != SandboxState::Ready {
            return Err(ContainerError::SandboxNotReady(sandbox.id().to_string()));
        }
        let image: ImageInfo = self
            .find_image(&req.image)
            .ok_or_else(|| ContainerError::ImageNotFound(req.image.clone()))?;
        let image_cfg = image_config(&image).map_err(|reason| ContainerError::ImageConfig {
            image: req.image.clone(),
            reason,
        })?;

        let mut metadata = req.metadata.clone();
        metadata.id = id.to_string();
        metadata.sandbox_id = sandbox.id().to_string();
        metadata.image.id = image.id.clone();
        metadata.image.reference = image
            .repo_digests
            .iter()
            .next()
            .cloned()
            .unwrap_or_else(|| image.id.clone());
        if metadata.image.requested.is_empty() {
            metadata.image.requested = req.image.clone();
        }
        let name_key = container_name_key(
            &metadata.name,
            &sb.metadata.name,
            &sb.metadata.namespace,
            &sb.metadata.uid,
            metadata.attempt,
        );
        let reservation = self.names.reserve_guarded(&name_key, id)?;

        let lease = self.creation_lease(id, undo).await?;
        let snapshots = self.snapshots();
        let snapshotter = self.snapshotter().to_string();
        let mounts = snapshots
            .prepare(&lease, &snapshotter, id, &image.chain_id)
            .await?;
        {
            let (snaps, sn, key) = (snapshots.clone(), snapshotter.clone(), id.to_string());
            undo.push((
                "remove rootfs snapshot",
                Box::pin(async move { snaps.remove(&sn, &key).await.map_err(|e| e.to_string()) }),
            ));
        }
        crate::failpoint::hit("container.after_snapshot", &metadata.name)
            .await
            .map_err(ContainerError::Failpoint)?;

        let target_pid = match &req.target_id {
            Some(t) => Some(self.containers_store().get(t)?.snapshot().status.pid),
            None => None,
        };
        let sandbox_dir = self.sandbox_dir(sandbox.id());
        let host_ipc = sb.metadata.namespace_options.ipc == spec::NamespaceMode::Node;
        let info = SandboxInfo {
            id: sandbox.id().to_string(),
            pid: sb.status.pid,
            netns_path: (!sb.metadata.netns_path.is_empty())
                .then(|| PathBuf::from(&sb.metadata.netns_path)),
            config: req
                .sandbox_config
                .clone()
                .unwrap_or_else(|| fallback_sandbox_config(&sb.metadata)),
            files: SandboxFiles {
                hosts: Some(sandbox_dir.join("hosts")),
                resolv_conf: Some(sandbox_dir.join("resolv.conf")),
                hostname: Some(sandbox_dir.join("hostname")),
                shm: Some(if host_ipc {
                    PathBuf::from("/dev/shm")
                } else {
                    sandbox_dir.join("shm")
                }),
            },
        };
        let host = self.host().clone();
        let config = req.config.clone();
        let tmp = self.state_dir().join("tmpmounts").join(id);
        let id_owned = id.to_string();
        let generated = tokio::task::spawn_blocking(move || {
            with_temp_mount(&mounts, &tmp, |rootfs| {
                spec::container_spec(&spec::ContainerInputs {
                    id: &id_owned,
                    config: &config,
                    image: &image_cfg,
                    sandbox: &info,
                    rootfs,
                    target_pid,
                    host: &host,
                    device_lookup: &host_device,
                })
            })
        })
        .await
        .map_err(|e| ContainerError::Aborted(e.to_string()))?
        .map_err(ContainerError::Rootfs)??;
        for dir in &generated.host_dirs_to_create {
            std::fs::create_dir_all(dir).map_err(|e| ContainerError::Host {
                action: "create bind mount source",
                path: dir.clone(),
                reason: e.to_string(),
            })?;
        }
        let spec_json = serde_json::to_vec(&generated.spec)
            .map_err(|e| ContainerError::Encode(e.to_string()))?;

        let container = Container::new(metadata.clone(), ContainerStatus::created(now_ns()));
        let snapshot = container.snapshot();
        self.containers()
            .create(ContainerRecord {
                id: id.to_string(),
                image: image.id.clone(),
                labels: to_labels(&snapshot),
                spec: spec_json,
                runtime: self.runtime_type().to_string(),
                snapshotter,
                snapshot_key: id.to_string(),
                extensions: HashMap::from([(
                    CONTAINER_EXTENSION.to_string(),
                    encode_extension(&snapshot),
                )]),
            })
            .await?;
        {
            let (containers, key) = (self.containers(), id.to_string());
            undo.push((
                "delete container record",
                Box::pin(async move { containers.delete(&key).await.map_err(|e| e.to_string()) }),
            ));
        }
        crate::failpoint::hit("container.after_record", &metadata.name)
            .await
            .map_err(ContainerError::Failpoint)?;
        self.containers_store().add(container)?;
        // The container record now holds the snapshot; the creation lease can go. Best effort:
        // containerd expires it anyway, and the container exists now.
        if let Err(e) = self.leases().delete(&lease, false).await {
            warn!(self.log(), "cannot delete the creation lease"; "container_id" => id, "error" => %e);
        }
        reservation.keep();
        undo.clear();
        self.events
            .emit(id, sandbox.id(), EventKind::Created, now_ns());
        info!(self.log(), "container created"; "container_id" => id, "pod_id" => sandbox.id(), "image" => &req.image);
        Ok(())
    }

    /// StartContainer.
    pub async fn start_container(self: &Arc<Self>, id: &str) -> Result<(), ContainerError> {
        let container = self.containers_store().get(id)?;
        let me = self.clone();
        tokio::spawn(async move {
            container.begin_start()?;
            let result = me.start_inner(&container).await;
            if let Err(e) = &result {
                let _ = container.start_failed(&e.to_string(), now_ns());
                let cid = container.id().to_string();
                let _ = me.tasks().delete(&cid).await;
                if let Some(io) = me.io().remove(&cid) {
                    let _ = io.fifos.remove();
                }
            }
            result
        })
        .await
        .map_err(|e| ContainerError::Aborted(e.to_string()))?
    }

    async fn start_inner(self: &Arc<Self>, container: &Container) -> Result<(), ContainerError> {
        let id = container.id().to_string();
        let meta = container.metadata().clone();
        let sandbox = self.sandboxes.get(&meta.sandbox_id)?;
        if sandbox.status().state != SandboxState::Ready {
            return Err(ContainerError::SandboxNotReady(meta.sandbox_id.clone()));
        }
        let dir = self.io_dir(&id);
        let fifos = FifoSet::create(
            &dir,
            &id,
            FifoSpec {
                stdin: meta.stdin,
                tty: meta.tty,
            },
        )
        .map_err(|e| ContainerError::Host {
            action: "create FIFOs in",
            path: dir.clone(),
            reason: e.to_string(),
        })?;
        let log = if meta.log_path.is_empty() {
            None
        } else {
            Some(Arc::new(
                LogWriter::open(&meta.log_path, Some(crate::io::DEFAULT_MAX_LINE_SIZE))
                    .await
                    .map_err(|e| ContainerError::Host {
                        action: "open the log file",
                        path: PathBuf::from(&meta.log_path),
                        reason: e.to_string(),
                    })?,
            ))
        };
        // Open our read ends before the shim opens its write ends; copy into the CRI log.
        let mut copiers = Vec::new();
        let streams: &[StreamKind] = if meta.tty {
            &[StreamKind::Stdout]
        } else {
            &[StreamKind::Stdout, StreamKind::Stderr]
        };
        for &stream in streams {
            let reader = match stream {
                StreamKind::Stdout => fifos.open_stdout(),
                StreamKind::Stderr => fifos.open_stderr(),
            }
            .map_err(|e| ContainerError::Host {
                action: "open FIFO in",
                path: dir.clone(),
                reason: e.to_string(),
            })?;
            if let Some(w) = &log {
                copiers.push(copy_stream(reader, stream, w.clone()));
            } else {
                // No log path: still drain, so the container never blocks on a full pipe.
                copiers.push(tokio::spawn(async move {
                    let mut reader = reader;
                    let _ = tokio::io::copy(&mut reader, &mut tokio::io::sink()).await;
                    crate::io::CopySummary::default()
                }));
            }
        }
        let io = Arc::new(ContainerIo {
            fifos,
            log: log.clone(),
        });
        self.io().insert(&id, io.clone());

        let stdio = io.fifos.task_stdio();
        let mounts = self.snapshots().mounts(self.snapshotter(), &id).await?;
        self.tasks()
            .create(TaskSpec {
                container_id: id.clone(),
                rootfs: mounts,
                stdin: stdio.stdin,
                stdout: stdio.stdout,
                stderr: stdio.stderr,
                terminal: stdio.terminal,
            })
            .await?;
        // Taken before the start: a process that exits at once must not finish before it
        // started (its exit time comes from containerd).
        let started_at = now_ns();
        // Marked before the start: a `/tasks/exit` hint for a process that exits at once must
        // leave the exit to the monitor (which drains the output first).
        self.set_monitored(&id, true);
        let pid = match self.tasks().start(&id).await {
            Ok(pid) => pid,
            Err(e) => {
                self.set_monitored(&id, false);
                return Err(e.into());
            }
        };
        container.record_started(pid, started_at)?;
        self.persist(container).await;
        self.monitor_container_exit(container.clone(), copiers);
        self.events
            .emit(&id, &meta.sandbox_id, EventKind::Started, now_ns());
        info!(self.log(), "container started"; "container_id" => &id, "pid" => pid);
        Ok(())
    }

    fn set_monitored(&self, id: &str, on: bool) {
        let mut m = self.monitored.lock().unwrap_or_else(|p| p.into_inner());
        if on {
            m.insert(id.to_string());
        } else {
            m.remove(id);
        }
    }

    /// Whether container `id`'s exit monitor is attached.
    pub(crate) fn is_monitored(&self, id: &str) -> bool {
        self.monitored
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(id)
    }

    /// Records container `id`'s exit (status and time from containerd): persisted as EXITED,
    /// the task deleted, then RUNNING → EXITED in the index once (later calls find it
    /// recorded) with one STOPPED event, and the log closed. Idempotent, so the event queue may
    /// retry it; an error (containerd unreachable, or the `exit.handle` failpoint) asks for a
    /// retry.
    pub(crate) async fn handle_exit(
        &self,
        id: &str,
        status: u32,
        at: Option<std::time::SystemTime>,
    ) -> Result<(), String> {
        let Ok(container) = self.containers_store().get(id) else {
            return Ok(()); // removed meanwhile
        };
        crate::failpoint::hit("exit.handle", &container.metadata().name).await?;
        // Durable first: the record says EXITED before the task (the shim holding the exit
        // status) goes, so a crash in between loses nothing. Then the task is deleted, and only
        // then the exit becomes visible: Stop/RemoveContainer wait for it, so their own
        // Tasks.Delete finds the task gone instead of racing this one into a shim that is
        // shutting down ("ttrpc: closed"), as containerd's CRI orders it too.
        let mut exited = container.snapshot();
        if exited.status.record_exit(status as i32, exit_ns(at)) == ExitOutcome::Recorded {
            self.persist_snapshot(id, &exited).await;
        }
        self.tasks().delete(id).await.map_err(|e| e.to_string())?;
        if container.record_exit(status as i32, exit_ns(at)) == ExitOutcome::Recorded {
            info!(self.log(), "container exited"; "container_id" => id, "exit_code" => status);
            self.events.emit(
                id,
                &container.metadata().sandbox_id,
                EventKind::Stopped,
                exit_ns(at),
            );
        }
        if let Some(io) = self.io().get(id) {
            if let Some(w) = &io.log {
                w.close().await;
            }
        }
        Ok(())
    }

    /// A running container whose task vanished (with its exit status): UNKNOWN, persisted, one
    /// STOPPED event. Returns false if it was not running (nothing done). The transition is
    /// atomic, so of the exit monitor and recovery only one does it.
    pub(crate) async fn mark_vanished(&self, container: &Container) -> bool {
        if !container.mark_unknown_if_running() {
            return false;
        }
        warn!(self.log(), "container task vanished; its exit status is unknown"; "container_id" => container.id());
        self.persist(container).await;
        self.events.emit(
            container.id(),
            &container.metadata().sandbox_id,
            EventKind::Stopped,
            now_ns(),
        );
        true
    }

    /// Records IO handles of a container (used by recovery).
    pub(crate) fn register_io(&self, id: &str, fifos: FifoSet, log: Option<Arc<LogWriter>>) {
        self.io().insert(id, Arc::new(ContainerIo { fifos, log }));
    }

    /// Writes the container's current snapshot to its containerd record (best effort: the
    /// record is how a restarted remora learns an exit that containerd no longer keeps).
    pub(crate) async fn persist(&self, container: &Container) {
        self.persist_snapshot(container.id(), &container.snapshot())
            .await;
    }

    async fn persist_snapshot(&self, id: &str, snapshot: &crate::store::ContainerSnapshot) {
        if let Err(e) = self
            .containers()
            .set_extension(id, CONTAINER_EXTENSION, encode_extension(snapshot))
            .await
        {
            warn!(self.log(), "cannot update the container record"; "container_id" => id, "error" => %e);
        }
    }

    pub(crate) fn monitor_container_exit(
        self: &Arc<Self>,
        container: Container,
        copiers: Vec<tokio::task::JoinHandle<crate::io::CopySummary>>,
    ) {
        let me = self.clone();
        me.set_monitored(container.id(), true);
        tokio::spawn(async move {
            let id = container.id().to_string();
            let log = me.log().new(slog::o!("container_id" => id.clone()));
            let tasks = me.tasks();
            let waiting = container.clone();
            match super::sandbox::wait_through_outages(tasks.as_ref(), &id, move || {
                waiting.state() == ContainerState::Running
            })
            .await
            {
                Ok(exit) => {
                    // Output written just before the exit is still in the pipes: let the
                    // copiers drain to EOF before recording the exit.
                    for c in copiers {
                        let _ = tokio::time::timeout(Duration::from_secs(2), c).await;
                    }
                    me.set_monitored(&id, false);
                    // Recorded by the event queue, in order with the container's other events
                    // and retried with backoff if handling fails; directly without a queue.
                    match me.exit_queue.get() {
                        Some(q) => q.push(
                            &id,
                            crate::containerd::events::Event::ContainerExited {
                                container_id: id.clone(),
                                exit_status: exit.status,
                                exited_at: exit.at,
                            },
                        ),
                        None => {
                            if let Err(e) = me.handle_exit(&id, exit.status, exit.at).await {
                                warn!(log, "cannot record the exit"; "error" => e);
                            }
                        }
                    }
                }
                Err(e) => {
                    me.set_monitored(&id, false);
                    // The task vanished while the container ran: containerd 2.x, restarted
                    // after the process exited, deletes such tasks at start-up ("cleaning
                    // leaked shim process") and the exit status with them. Report UNKNOWN
                    // rather than a made-up exit code, and never RUNNING for a dead process.
                    if !me.mark_vanished(&container).await {
                        warn!(log, "lost the wait on the container task"; "error" => %e);
                    }
                }
            }
        });
    }

    /// StopContainer: the image's stop signal (or SIGTERM), `timeout` seconds, then SIGKILL.
    /// Idempotent; an unknown id is success.
    pub async fn stop_container(
        self: &Arc<Self>,
        id: &str,
        timeout: Duration,
    ) -> Result<(), ContainerError> {
        let container = match self.containers_store().get(id) {
            Ok(c) => c,
            Err(StoreError::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let me = self.clone();
        tokio::spawn(async move { me.stop_container_inner(&container, timeout).await })
            .await
            .map_err(|e| ContainerError::Aborted(e.to_string()))?
    }

    /// Stops a container of a pod being stopped (no grace: kubelet already stopped it).
    pub(crate) async fn stop_inner_container(
        &self,
        container: &Container,
    ) -> Result<(), ContainerError> {
        self.stop_container_inner(container, Duration::ZERO).await
    }

    pub(crate) async fn stop_container_inner(
        &self,
        container: &Container,
        timeout: Duration,
    ) -> Result<(), ContainerError> {
        let id = container.id().to_string();
        let Some(state) = self.tasks().state(&id).await? else {
            return Ok(());
        };
        if state.status == TaskStatus::Stopped {
            // Exited, but the exit monitor may still be draining output before it records
            // the exit: callers (RemoveContainer, ContainerStatus after Stop) need it recorded.
            let _ = tokio::time::timeout(KILL_WAIT, self.wait_exit(container)).await;
            return Ok(());
        }
        let signal = self.stop_signal(container);
        if !timeout.is_zero() {
            self.kill_ignoring_gone(&id, signal).await?;
            if tokio::time::timeout(timeout, self.wait_exit(container))
                .await
                .is_ok()
            {
                return Ok(());
            }
        }
        self.kill_ignoring_gone(&id, libc::SIGKILL as u32).await?;
        if tokio::time::timeout(KILL_WAIT, self.wait_exit(container))
            .await
            .is_err()
        {
            warn!(self.log(), "container did not exit after SIGKILL"; "container_id" => &id);
        }
        Ok(())
    }

    async fn kill_ignoring_gone(&self, id: &str, signal: u32) -> Result<(), ContainerError> {
        match self
            .tasks()
            .kill(id, signal, signal == libc::SIGKILL as u32)
            .await
        {
            Ok(()) => Ok(()),
            Err(ContainerdError::Call {
                code: tonic::Code::NotFound,
                ..
            }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Resolves when the exit monitor has recorded the container's exit.
    async fn wait_exit(&self, container: &Container) {
        loop {
            if container.state() != ContainerState::Running {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn stop_signal(&self, container: &Container) -> u32 {
        let image = self.find_image(&container.metadata().image.id);
        let name = image
            .and_then(|i| image_config(&i).ok())
            .map(|c| c.stop_signal)
            .unwrap_or_default();
        parse_signal(&name).unwrap_or(libc::SIGTERM as u32)
    }

    /// RemoveContainer: a running container is killed first. Idempotent; an unknown id is
    /// success.
    pub async fn remove_container(self: &Arc<Self>, id: &str) -> Result<(), ContainerError> {
        let container = match self.containers_store().get(id) {
            Ok(c) => c,
            Err(StoreError::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let me = self.clone();
        tokio::spawn(async move { me.remove_container_inner(&container).await })
            .await
            .map_err(|e| ContainerError::Aborted(e.to_string()))?
    }

    pub(crate) async fn remove_container_inner(
        &self,
        container: &Container,
    ) -> Result<(), ContainerError> {
        let id = container.id().to_string();
        if container.state() == ContainerState::Running {
            self.stop_container_inner(container, Duration::ZERO).await?;
            // The exit is recorded by the monitor; removal needs it.
            let _ = tokio::time::timeout(KILL_WAIT, self.wait_exit(container)).await;
        }
        container.begin_removal()?;
        let result = async {
            let _ = self.tasks().delete(&id).await?;
            self.containers().delete(&id).await?;
            self.snapshots().remove(self.snapshotter(), &id).await?;
            if let Some(io) = self.io().remove(&id) {
                let _ = io.fifos.remove();
            }
            let _ = std::fs::remove_dir_all(self.io_dir(&id));
            Ok::<(), ContainerError>(())
        }
        .await;
        if let Err(e) = result {
            container.abort_removal();
            return Err(e);
        }
        let meta = container.metadata();
        if let Ok(sb) = self.sandboxes.get(&meta.sandbox_id) {
            let sb = sb.snapshot();
            self.names.release(&container_name_key(
                &meta.name,
                &sb.metadata.name,
                &sb.metadata.namespace,
                &sb.metadata.uid,
                meta.attempt,
            ));
        }
        match self.containers_store().delete(&id) {
            Ok(_) | Err(StoreError::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        self.events
            .emit(&id, &meta.sandbox_id, EventKind::Deleted, now_ns());
        info!(self.log(), "container removed"; "container_id" => &id);
        Ok(())
    }

    /// UpdateContainerResources: new limits applied to the running task's cgroup. (The spec on
    /// the containerd record keeps the limits of creation; a restarted task would get those.)
    pub async fn update_container_resources(
        &self,
        id: &str,
        resources: &spec::Resources,
    ) -> Result<(), ContainerError> {
        let container = self.containers_store().get(id)?;
        let linux = spec::resources::linux_resources(resources, self.host())?;
        let json = serde_json::to_vec(&linux).map_err(|e| ContainerError::Encode(e.to_string()))?;
        if container.state() == ContainerState::Running {
            self.tasks().update_resources(container.id(), json).await?;
        }
        Ok(())
    }

    /// ReopenContainerLog: a new log file at the same path (kubelet rotated the old one).
    pub async fn reopen_container_log(&self, id: &str) -> Result<(), ContainerError> {
        let container = self.containers_store().get(id)?;
        if container.state() != ContainerState::Running {
            return Err(ContainerError::NotRunning(container.id().to_string()));
        }
        if let Some(io) = self.io().get(container.id()) {
            if let Some(w) = &io.log {
                w.reopen().await.map_err(|e| ContainerError::Host {
                    action: "reopen the log file",
                    path: w.path().to_path_buf(),
                    reason: e.to_string(),
                })?;
            }
        }
        Ok(())
    }
}

/// A signal by name (`SIGTERM`, `TERM`) or number (`15`).
pub fn parse_signal(s: &str) -> Option<u32> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    if let Ok(n) = s.parse::<u32>() {
        return Some(n);
    }
    let name = s.to_ascii_uppercase();
    let name = name.strip_prefix("SIG").unwrap_or(&name);
    let n = match name {
        "HUP" => libc::SIGHUP,
        "INT" => libc::SIGINT,
        "QUIT" => libc::SIGQUIT,
        "KILL" => libc::SIGKILL,
        "USR1" => libc::SIGUSR1,
        "USR2" => libc::SIGUSR2,
        "TERM" => libc::SIGTERM,
        "STOP" => libc::SIGSTOP,
        "WINCH" => libc::SIGWINCH,
        "PWR" => libc::SIGPWR,
        _ => return None,
    };
    Some(n as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_by_name_or_number() {
        assert_eq!(parse_signal("SIGTERM"), Some(15));
        assert_eq!(parse_signal("quit"), Some(3));
        assert_eq!(parse_signal("9"), Some(9));
        assert_eq!(parse_signal(""), None);
        assert_eq!(parse_signal("SIGBOGUS"), None);
    }
}
