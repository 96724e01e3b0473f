//! The plugin registry: NRI's runtime-side "adaptation" core (containerd/nri
//! `pkg/adaptation`), for external plugins that connect to remora's NRI socket and for the
//! plugins it launches from its plugin directory (`launch`).
//!
//! [`Registry::start`] launches the plugin directory's plugins, each with a connected socket,
//! binds the socket and accepts plugins. Each connection, accepted or launched, runs NRI's
//! handshake:
//!
//! ```text
//!  accept ──► mux; serve Runtime on conn 2, client on conn 1
//!     │
//!     ▼  plugin calls RegisterPlugin(name, idx)      (within registration_timeout)
//!  registered ──► remora calls Configure ──► event mask     (request_timeout)
//!     │
//!     ▼  write side of the sync lock: snapshot, Synchronize in chunks  (request_timeout in all)
//!  active (sorted by index, then name) ──► called for the events in its mask
//!     │
//!     ▼  call timed out, connection lost, or stop()
//!  removed (logged once, trunk closed)
//! ```
//!
//! A failure anywhere before "active" closes the connection and is logged once. A launched
//! plugin is registered under its file's index and name, whatever it sends, is sent its
//! configuration file in Configure, and is killed and reaped when its handshake fails, when it
//! is removed, and on [`Registry::stop`]; its exit is logged once, and nothing it does fails
//! the registry's start.
//!
//! # Sync blocking
//!
//! A plugin that joins late is told about existing pods and containers by Synchronize, and
//! about later ones by events. An object created while the plugin registers must reach it
//! exactly one way. So every CRI mutation that creates an object and runs its NRI hook holds a
//! [`SyncBlock`] ([`Registry::block_sync`], the read side of a lock) from before the object is
//! visible to the [`SyncSource`] until its hook returned; registration takes the write side
//! around the snapshot, the Synchronize calls and the plugin's activation. Either the object is
//! in the snapshot and the hook ran before the plugin was active, or the object came later and
//! the hook sees the plugin. Do not take a second `SyncBlock` while holding one: a registration
//! waiting for the write side would deadlock the two. A registration holds the write side for
//! at most `request_timeout` once it has it.
//!
//! # Failures (as NRI v0.12.2 `pkg/adaptation/plugin.go`)
//!
//! - A plugin answering an event with an error status fails the call for RunPodSandbox,
//!   UpdatePodSandbox, CreateContainer, UpdateContainer and StartContainer ([`HookError`],
//!   naming the plugin and the event); for the other events it is logged and the remaining
//!   plugins are still called.
//! - A plugin that does not answer within `request_timeout`, or whose connection failed, is
//!   removed from the registry and its trunk closed (NRI's `isFatalError` path). NRI then goes
//!   on without it; here the five events above fail ([`HookError`] with UNAVAILABLE, as issue
//!   30 asks: nothing is made without a plugin's say), the others go on. Later calls skip it.
//! - A plugin that answers an event RPC with UNIMPLEMENTED (a stub older than the dedicated
//!   RPCs) gets the deprecated `StateChange` instead, for the events NRI does this for.
//!
//! The responses with adjustments or updates (CreateContainer, UpdateContainer,
//! StopContainer) are returned per plugin in call order; merging them is the caller's job.
//! Updates a plugin returns from Synchronize, and those it requests with UpdateContainers,
//! go to the [`RuntimeHandle`].

use std::future::Future;
use std::io;
use std::os::unix::fs::{DirBuilderExt as _, FileTypeExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use futures::stream::{self, StreamExt as _};
use protobuf::{Enum as _, Message as _};
use slog::{debug, info, o, warn, Logger};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{oneshot, watch, OwnedRwLockReadGuard, OwnedSemaphorePermit, RwLock, Semaphore};
use tokio::time::Instant;
use ttrpc::asynchronous::transport::{Listener, Socket};
use ttrpc::asynchronous::{Client, Server, TtrpcContext};

use crate::api;
use crate::mux::{Mux, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};

mod launch;

pub use launch::{MAX_LAUNCHED_PLUGINS, MAX_PLUGIN_CONFIG_LEN, MAX_PLUGIN_DIR_ENTRIES};

/// How long a connected plugin has to call RegisterPlugin (NRI's default).
pub const DEFAULT_REGISTRATION_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a plugin has to answer one request (NRI's default).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Plugins connected at once, registered or not, launched ones included; a further
/// connection is closed at once.
pub const MAX_PLUGINS: usize = 64;
/// Connections between accept and activation at once; a further one is closed at once.
pub const MAX_PENDING_REGISTRATIONS: usize = 8;
/// The longest plugin name accepted, in bytes.
pub const MAX_PLUGIN_NAME_LEN: usize = 256;
/// The NRI version remora speaks: the api.proto it was compiled from.
pub const NRI_VERSION: &str = "v0.12.2";

/// The most a Synchronize request's payload may take: ttrpc's 4 MiB message limit less room
/// for ttrpc's request envelope (service and method names, timeout, metadata).
const SYNC_MESSAGE_BUDGET: usize = (4 << 20) - (16 << 10);

/// Every event a plugin may subscribe to: bits 0..=13 for events 1..=14 (NRI's `ValidEvents`).
const VALID_EVENTS: u32 = (1 << (api::Event::LAST as u32 - 1)) - 1;

/// The registry's configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// The Unix socket plugins connect to.
    pub socket_path: PathBuf,
    /// How long a connected plugin has to register.
    pub registration_timeout: Duration,
    /// How long a plugin has to answer a request (Synchronize: all its chunks together).
    pub request_timeout: Duration,
    /// The runtime name sent in Configure.
    pub runtime_name: String,
    /// The runtime version sent in Configure.
    pub runtime_version: String,
    /// The directory whose plugins are launched at start (NRI's `plugin_path`,
    /// `/opt/nri/plugins`); None launches none.
    pub plugin_path: Option<PathBuf>,
    /// The directory of the launched plugins' configuration files (NRI's
    /// `plugin_config_path`, `/etc/nri/conf.d`); None gives them none.
    pub plugin_config_path: Option<PathBuf>,
}

impl Config {
    /// A configuration with NRI's default timeouts that launches no plugins.
    pub fn new(
        socket_path: impl Into<PathBuf>,
        runtime_name: impl Into<String>,
        runtime_version: impl Into<String>,
    ) -> Config {
        Config {
            socket_path: socket_path.into(),
            registration_timeout: DEFAULT_REGISTRATION_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            runtime_name: runtime_name.into(),
            runtime_version: runtime_version.into(),
            plugin_path: None,
            plugin_config_path: None,
        }
    }
}

/// The runtime's current pods and containers, for a new plugin's Synchronize. Called with the
/// write side of the sync lock held (see the module docs), so it must not block on a
/// [`SyncBlock`].
pub trait SyncSource: Send + Sync + 'static {
    /// Every pod sandbox and container the runtime knows now.
    fn snapshot(&self) -> (Vec<api::PodSandbox>, Vec<api::Container>);
}

/// The runtime, for container updates plugins ask for outside an event: those a plugin
/// returns from Synchronize and those it sends with UpdateContainers.
#[async_trait::async_trait]
pub trait RuntimeHandle: Send + Sync + 'static {
    /// Applies `updates` and `evictions`; returns the updates that failed.
    async fn update_containers(
        &self,
        updates: Vec<api::ContainerUpdate>,
        evictions: Vec<api::ContainerEviction>,
    ) -> Vec<api::ContainerUpdate>;
}

/// Why the registry could not start.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The socket path has no parent directory.
    #[error("NRI socket path {0} has no parent directory")]
    NoParent(PathBuf),
    /// Creating the socket's directory failed.
    #[error("creating NRI socket directory {path}: {source}")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The failure.
        source: io::Error,
    },
    /// Something other than a socket is in the socket's place.
    #[error("{0} exists and is not a socket")]
    NotASocket(PathBuf),
    /// Inspecting or removing a stale socket failed.
    #[error("removing stale NRI socket {path}: {source}")]
    RemoveStale {
        /// The socket.
        path: PathBuf,
        /// The failure.
        source: io::Error,
    },
    /// Binding the socket failed.
    #[error("binding NRI socket {path}: {source}")]
    Bind {
        /// The socket.
        path: PathBuf,
        /// The failure.
        source: io::Error,
    },
    /// Restricting the socket's mode failed.
    #[error("setting the mode of NRI socket {path}: {source}")]
    Chmod {
        /// The socket.
        path: PathBuf,
        /// The failure.
        source: io::Error,
    },
}

/// A plugin refused an event that fails on error (RunPodSandbox, UpdatePodSandbox, CreateContainer,
/// UpdateContainer, StartContainer), or did not answer it in time or lost its connection (code
/// UNAVAILABLE; the plugin is then dropped).
#[derive(Debug, thiserror::Error)]
#[error("NRI plugin {plugin} failed {event:?}: {code:?}: {message}")]
pub struct HookError {
    /// The plugin, as `<idx>-<name>`.
    pub plugin: String,
    /// The event it failed.
    pub event: api::Event,
    /// The ttrpc status code it answered with.
    pub code: ttrpc::Code,
    /// The status message it answered with.
    pub message: String,
}

/// The read side of the sync lock: while it is held no plugin is being synchronized. See the
/// module docs for the contract.
pub struct SyncBlock {
    _guard: OwnedRwLockReadGuard<()>,
}

/// The plugin registry. Create with [`Registry::start`], end with [`Registry::stop`]
/// (dropping it stops accepting but does not send Shutdown to plugins).
pub struct Registry {
    config: Config,
    log: Logger,
    sync: Arc<dyn SyncSource>,
    runtime: Arc<dyn RuntimeHandle>,
    sync_lock: Arc<RwLock<()>>,
    /// Active plugins, sorted by (index, name). Held only for short non-awaiting sections.
    plugins: Mutex<Vec<Arc<Plugin>>>,
    /// The active plugins' names in call order, for observers.
    active: watch::Sender<Vec<String>>,
    connected: Arc<Semaphore>,
    pending: Arc<Semaphore>,
    shutdown: watch::Sender<bool>,
    accept_task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    next_conn: AtomicU64,
    /// The processes of the plugins launched at start, until [`Registry::stop`].
    launched: Mutex<Vec<Arc<launch::Process>>>,
}

/// One active plugin.
struct Plugin {
    /// `<idx>-<name>`, as NRI names plugins.
    name: String,
    idx: String,
    base: String,
    events: u32,
    client: api::PluginClient,
    mux: Mux,
    /// Serves the Runtime service on conn 2; dropping it shuts that connection down.
    _server: Mutex<Server>,
    /// Set once the plugin is removed, so removal is logged once.
    removed: AtomicBool,
    /// Set once the StateChange fallback was logged.
    warned_state_change: AtomicBool,
    /// One call at a time to this plugin (see [`Registry::call_plugin`]).
    turn: tokio::sync::Mutex<()>,
    log: Logger,
    _connected: OwnedSemaphorePermit,
    /// A launched plugin's process, killed when the plugin is removed.
    process: Option<Arc<launch::Process>>,
}

/// A launched plugin, for its handshake: who it is and what it is configured with.
struct Launched {
    idx: String,
    base: String,
    config: String,
    process: Arc<launch::Process>,
}

/// How one call to one plugin failed.
enum CallError {
    /// The plugin answered with an error status.
    Status(ttrpc::Status),
    /// No answer in time, or the connection failed: the plugin is to be removed.
    Fatal(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Status(s) => write!(f, "{:?}: {}", s.code(), s.message()),
            CallError::Fatal(why) => f.write_str(why),
        }
    }
}

/// Why a connection did not become an active plugin; logged once by the handshake task.
#[derive(Debug, thiserror::Error)]
enum HandshakeError {
    #[error("opening a multiplexed connection: {0}")]
    Open(#[from] crate::mux::OpenError),
    #[error("serving the runtime service: {0}")]
    Serve(ttrpc::Error),
    #[error("did not register within {0:?}")]
    RegistrationTimeout(Duration),
    #[error("registration refused: {0}")]
    Invalid(String),
    #[error("connection closed")]
    Closed,
    #[error("the registry is stopping")]
    Stopping,
    #[error("a plugin {0} is already registered")]
    Duplicate(String),
    #[error("Configure failed: {0}")]
    Configure(String),
    #[error("Configure returned unknown events 0x{0:x}")]
    BadEvents(u32),
    #[error("a {0}-byte object does not fit in a Synchronize message")]
    Oversized(usize),
    #[error("Synchronize failed: {0}")]
    Synchronize(String),
    #[error("plugin does not handle split Synchronize requests")]
    SplitSync,
}

impl Registry {
    /// Launches the plugins of `config.plugin_path` (see `launch`: what is skipped, bounds),
    /// binds `config.socket_path` and accepts plugins in a task. Creates the socket's
    /// directory (mode 0700) if missing, replaces a stale socket (only a socket), and sets the
    /// socket's mode to 0600. Must be called within a tokio runtime.
    ///
    /// Does not wait for the launched plugins: each registers in its own task, as an accepted
    /// connection does (watch [`Registry::plugins`]). Nothing about them fails the start: a
    /// plugin that cannot be launched, exits or never registers is logged.
    ///
    /// The socket exists with the umask's mode between bind and chmod; in a 0700 directory
    /// nobody else can reach it meanwhile.
    pub fn start(
        config: Config,
        sync: Arc<dyn SyncSource>,
        runtime: Arc<dyn RuntimeHandle>,
        log: Logger,
    ) -> Result<Arc<Registry>, RegistryError> {
        let listener = bind(&config.socket_path)?;
        let log = log.new(o!("nri_socket" => config.socket_path.display().to_string()));
        info!(log, "NRI: accepting plugins");
        let (shutdown, shutdown_rx) = watch::channel(false);
        let registry = Arc::new(Registry {
            config,
            log,
            sync,
            runtime,
            sync_lock: Arc::new(RwLock::new(())),
            plugins: Mutex::new(Vec::new()),
            active: watch::Sender::new(Vec::new()),
            connected: Arc::new(Semaphore::new(MAX_PLUGINS)),
            pending: Arc::new(Semaphore::new(MAX_PENDING_REGISTRATIONS)),
            shutdown,
            accept_task: Mutex::new(None),
            next_conn: AtomicU64::new(1),
            launched: Mutex::new(Vec::new()),
        });
        // Before accepting: the launched plugins take their connection slots first.
        registry.launch_plugins();
        let task = tokio::spawn(accept_loop(
            Arc::downgrade(&registry),
            listener,
            shutdown_rx,
        ));
        *lock(&registry.accept_task) = Some(task);
        Ok(registry)
    }

    /// Stops accepting, sends Shutdown to every active plugin (each bounded by the request
    /// timeout, all at once, errors ignored as NRI does), closes them, kills the launched
    /// plugins and waits (a request timeout at most) until they are reaped, and removes the
    /// socket.
    pub async fn stop(&self) {
        self.shutdown.send_replace(true);
        let task = lock(&self.accept_task).take();
        if let Some(task) = task {
            // The task ends on the shutdown signal; a panic in it was already reported.
            let _ = task.await;
        }
        let plugins = std::mem::take(&mut *lock(&self.plugins));
        self.publish(&[]);
        let timeout = self.config.request_timeout;
        futures::future::join_all(plugins.iter().map(|plugin| async move {
            plugin.removed.store(true, Ordering::SeqCst);
            // In its turn (see `call_plugin`), all within the request timeout.
            let result = tokio::time::timeout(timeout, async {
                let _turn = plugin.turn.lock().await;
                plugin
                    .client
                    .shutdown(context(timeout), &api::Empty::new())
                    .await
            })
            .await;
            debug!(plugin.log, "NRI: plugin shut down"; "result" => ?result.map(|r| r.is_ok()));
            plugin.mux.close();
        }))
        .await;
        let launched = std::mem::take(&mut *lock(&self.launched));
        futures::future::join_all(launched.iter().map(|process| async move {
            process.kill();
            if tokio::time::timeout(timeout, process.reaped())
                .await
                .is_err()
            {
                // Its watcher goes on waiting; the process is reaped when it dies.
                warn!(self.log, "NRI: a launched plugin was not reaped in time after SIGKILL";
                    "pid" => process.pid);
            }
        }))
        .await;
        match std::fs::symlink_metadata(&self.config.socket_path) {
            Ok(meta) if meta.file_type().is_socket() => {
                if let Err(err) = std::fs::remove_file(&self.config.socket_path) {
                    warn!(self.log, "NRI: removing the socket failed"; "error" => %err);
                }
            }
            _ => {}
        }
        info!(self.log, "NRI: stopped");
    }

    /// Blocks plugin synchronization until the returned guard is dropped. See the module docs.
    pub async fn block_sync(&self) -> SyncBlock {
        SyncBlock {
            _guard: self.sync_lock.clone().read_owned().await,
        }
    }

    /// The active plugins as `<idx>-<name>`, in call order.
    pub fn plugins(&self) -> Vec<String> {
        self.active.borrow().clone()
    }

    /// Watches [`Registry::plugins`].
    pub fn watch_plugins(&self) -> watch::Receiver<Vec<String>> {
        self.active.subscribe()
    }

    /// RunPodSandbox: a plugin's error fails it.
    pub async fn run_pod_sandbox(&self, pod: &api::PodSandbox) -> Result<(), HookError> {
        let mut req = api::RunPodSandboxRequest::new();
        req.pod = Some(pod.clone()).into();
        self.dispatch(Call::RunPodSandbox(req)).await.map(drop)
    }

    /// UpdatePodSandbox: a plugin's error fails it (as NRI's adaptation and containerd do).
    pub async fn update_pod_sandbox(
        &self,
        pod: &api::PodSandbox,
        overhead: Option<&api::LinuxResources>,
        resources: Option<&api::LinuxResources>,
    ) -> Result<(), HookError> {
        let mut req = api::UpdatePodSandboxRequest::new();
        req.pod = Some(pod.clone()).into();
        req.overhead_linux_resources = overhead.cloned().into();
        req.linux_resources = resources.cloned().into();
        self.dispatch(Call::UpdatePodSandbox(req)).await.map(drop)
    }

    /// PostUpdatePodSandbox; plugin errors are logged.
    pub async fn post_update_pod_sandbox(&self, pod: &api::PodSandbox) {
        let mut req = api::PostUpdatePodSandboxRequest::new();
        req.pod = Some(pod.clone()).into();
        self.notify(Call::PostUpdatePodSandbox(req)).await;
    }

    /// StopPodSandbox; plugin errors are logged.
    pub async fn stop_pod_sandbox(&self, pod: &api::PodSandbox) {
        let mut req = api::StopPodSandboxRequest::new();
        req.pod = Some(pod.clone()).into();
        self.notify(Call::StopPodSandbox(req)).await;
    }

    /// RemovePodSandbox; plugin errors are logged.
    pub async fn remove_pod_sandbox(&self, pod: &api::PodSandbox) {
        let mut req = api::RemovePodSandboxRequest::new();
        req.pod = Some(pod.clone()).into();
        self.notify(Call::RemovePodSandbox(req)).await;
    }

    /// CreateContainer: each subscribed plugin's response, in call order; a plugin's error
    /// fails it.
    pub async fn create_container(
        &self,
        pod: &api::PodSandbox,
        container: &api::Container,
    ) -> Result<Vec<(String, api::CreateContainerResponse)>, HookError> {
        let mut req = api::CreateContainerRequest::new();
        req.pod = Some(pod.clone()).into();
        req.container = Some(container.clone()).into();
        let replies = self.dispatch(Call::CreateContainer(req)).await?;
        Ok(replies
            .into_iter()
            .filter_map(|(name, reply)| match reply {
                Reply::CreateContainer(r) => Some((name, r)),
                _ => None,
            })
            .collect())
    }

    /// PostCreateContainer; plugin errors are logged.
    pub async fn post_create_container(&self, pod: &api::PodSandbox, container: &api::Container) {
        let mut req = api::PostCreateContainerRequest::new();
        req.pod = Some(pod.clone()).into();
        req.container = Some(container.clone()).into();
        self.notify(Call::PostCreateContainer(req)).await;
    }

    /// StartContainer: a plugin's error fails it.
    pub async fn start_container(
        &self,
        pod: &api::PodSandbox,
        container: &api::Container,
    ) -> Result<(), HookError> {
        let mut req = api::StartContainerRequest::new();
        req.pod = Some(pod.clone()).into();
        req.container = Some(container.clone()).into();
        self.dispatch(Call::StartContainer(req)).await.map(drop)
    }

    /// PostStartContainer; plugin errors are logged.
    pub async fn post_start_container(&self, pod: &api::PodSandbox, container: &api::Container) {
        let mut req = api::PostStartContainerRequest::new();
        req.pod = Some(pod.clone()).into();
        req.container = Some(container.clone()).into();
        self.notify(Call::PostStartContainer(req)).await;
    }

    /// UpdateContainer: each subscribed plugin's response, in call order; a plugin's error
    /// fails it.
    pub async fn update_container(
        &self,
        pod: &api::PodSandbox,
        container: &api::Container,
        resources: &api::LinuxResources,
    ) -> Result<Vec<(String, api::UpdateContainerResponse)>, HookError> {
        let mut req = api::UpdateContainerRequest::new();
        req.pod = Some(pod.clone()).into();
        req.container = Some(container.clone()).into();
        req.linux_resources = Some(resources.clone()).into();
        let replies = self.dispatch(Call::UpdateContainer(req)).await?;
        Ok(replies
            .into_iter()
            .filter_map(|(name, reply)| match reply {
                Reply::UpdateContainer(r) => Some((name, r)),
                _ => None,
            })
            .collect())
    }

    /// PostUpdateContainer; plugin errors are logged.
    pub async fn post_update_container(&self, pod: &api::PodSandbox, container: &api::Container) {
        let mut req = api::PostUpdateContainerRequest::new();
        req.pod = Some(pod.clone()).into();
        req.container = Some(container.clone()).into();
        self.notify(Call::PostUpdateContainer(req)).await;
    }

    /// StopContainer: each subscribed plugin's response, in call order; plugin errors are
    /// logged.
    pub async fn stop_container(
        &self,
        pod: &api::PodSandbox,
        container: &api::Container,
    ) -> Vec<(String, api::StopContainerResponse)> {
        let mut req = api::StopContainerRequest::new();
        req.pod = Some(pod.clone()).into();
        req.container = Some(container.clone()).into();
        self.notify(Call::StopContainer(req))
            .await
            .into_iter()
            .filter_map(|(name, reply)| match reply {
                Reply::StopContainer(r) => Some((name, r)),
                _ => None,
            })
            .collect()
    }

    /// RemoveContainer; plugin errors are logged.
    pub async fn remove_container(&self, pod: &api::PodSandbox, container: &api::Container) {
        let mut req = api::RemoveContainerRequest::new();
        req.pod = Some(pod.clone()).into();
        req.container = Some(container.clone()).into();
        self.notify(Call::RemoveContainer(req)).await;
    }

    /// Dispatches an event whose plugin errors are only logged.
    async fn notify(&self, call: Call) -> Vec<(String, Reply)> {
        debug_assert!(!call.fails_on_error());
        // An event that does not fail on error never returns Err: `dispatch` logs instead.
        self.dispatch(call).await.unwrap_or_default()
    }

    /// Calls the active plugins subscribed to `call`'s event, in order.
    async fn dispatch(&self, call: Call) -> Result<Vec<(String, Reply)>, HookError> {
        let event = call.event();
        let bit = event_bit(event);
        let plugins: Vec<Arc<Plugin>> = lock(&self.plugins)
            .iter()
            .filter(|p| p.events & bit != 0)
            .cloned()
            .collect();
        let mut replies = Vec::with_capacity(plugins.len());
        for plugin in plugins {
            match self.call_plugin(&plugin, &call).await {
                Ok(reply) => replies.push((plugin.name.clone(), reply)),
                Err(CallError::Fatal(why)) => {
                    self.remove(&plugin, &format!("{event:?} failed: {why}"));
                    // NRI goes on without the plugin; issue 30 asks that the call fail, as it
                    // does when the plugin answers with an error: a pod or container is not
                    // made without the plugin having had its say. Later calls skip it.
                    if call.fails_on_error() {
                        return Err(HookError {
                            plugin: plugin.name.clone(),
                            event,
                            code: ttrpc::Code::UNAVAILABLE,
                            message: format!("the plugin was dropped: {why}"),
                        });
                    }
                }
                Err(CallError::Status(status)) if call.fails_on_error() => {
                    return Err(HookError {
                        plugin: plugin.name.clone(),
                        event,
                        code: status.code(),
                        message: status.message().to_string(),
                    });
                }
                Err(err @ CallError::Status(_)) => {
                    warn!(plugin.log, "NRI: plugin failed an event";
                        "event" => ?event, "error" => %err);
                }
            }
        }
        Ok(replies)
    }

    /// One call to one plugin within the request timeout, with NRI's StateChange fallback.
    ///
    /// One at a time per plugin, waiting for its turn within the same timeout: ttrpc's client
    /// numbers a request before it is queued for writing, so two calls at once can reach the
    /// plugin out of order, and Go's ttrpc server refuses a stream id lower than the last one
    /// ("StreamID cannot be re-used and must increment"), failing the call. NRI's adaptation
    /// holds one lock around every event, so its plugins never see two calls at once either.
    async fn call_plugin(&self, plugin: &Plugin, call: &Call) -> Result<Reply, CallError> {
        let deadline = Instant::now() + self.config.request_timeout;
        let Ok(_turn) = tokio::time::timeout_at(deadline, plugin.turn.lock()).await else {
            return Err(CallError::Fatal(
                "no answer within the request timeout (an earlier call to it was pending)".into(),
            ));
        };
        match bounded(deadline, call.invoke(&plugin.client, deadline)).await {
            Err(CallError::Status(status)) if status.code() == ttrpc::Code::UNIMPLEMENTED => {
                let Some(change) = call.state_change() else {
                    return Err(CallError::Status(status));
                };
                if !plugin.warned_state_change.swap(true, Ordering::Relaxed) {
                    warn!(plugin.log, "NRI: plugin uses the deprecated StateChange";
                        "event" => ?call.event());
                }
                bounded(
                    deadline,
                    plugin.client.state_change(context_until(deadline), &change),
                )
                .await
                .map(|_| Reply::Empty)
            }
            other => other,
        }
    }

    /// Removes `plugin` from the active list, closes its trunk and kills its process if it
    /// was launched (as NRI); logs once.
    fn remove(&self, plugin: &Arc<Plugin>, why: &str) {
        if plugin.removed.swap(true, Ordering::SeqCst) {
            return;
        }
        let mut plugins = lock(&self.plugins);
        plugins.retain(|p| !Arc::ptr_eq(p, plugin));
        self.publish(&plugins);
        drop(plugins);
        plugin.mux.close();
        if let Some(process) = &plugin.process {
            process.kill();
        }
        warn!(plugin.log, "NRI: plugin removed"; "reason" => why);
    }

    /// Launches the plugins of the plugin directory, each with a handshake task. Logs what it
    /// skips, once each.
    fn launch_plugins(self: &Arc<Self>) {
        let Some(dir) = &self.config.plugin_path else {
            return;
        };
        let log = self
            .log
            .new(o!("nri_plugin_path" => dir.display().to_string()));
        let scan = match launch::scan(dir, self.config.plugin_config_path.as_deref()) {
            Ok(scan) => scan,
            Err(err) => {
                slog::error!(log, "NRI: launching no plugins"; "error" => %err);
                return;
            }
        };
        for (name, skip) in &scan.skipped {
            let name = name.to_string_lossy();
            if skip.benign() {
                info!(log, "NRI: not a plugin, skipped"; "file" => %name, "reason" => %skip);
            } else if matches!(skip, launch::Skip::Config { .. }) {
                slog::error!(log, "NRI: plugin not launched"; "file" => %name, "reason" => %skip);
            } else {
                warn!(log, "NRI: plugin not launched"; "file" => %name, "reason" => %skip);
            }
        }
        for found in scan.found {
            let plugin_log = log.new(o!("plugin" => found.name.clone()));
            // At most MAX_LAUNCHED_PLUGINS, of MAX_PLUGINS slots all free before accepting.
            let Ok(connected) = self.connected.clone().try_acquire_owned() else {
                warn!(plugin_log, "NRI: plugin not launched: too many plugins";
                    "max" => MAX_PLUGINS);
                continue;
            };
            let (child, stream) = match launch::spawn(&found) {
                Ok(spawned) => spawned,
                Err(err) => {
                    warn!(plugin_log, "NRI: launching a plugin failed"; "error" => %err);
                    continue;
                }
            };
            let pid = child.id().unwrap_or_default();
            let plugin_log = plugin_log.new(o!("pid" => pid));
            info!(plugin_log, "NRI: plugin launched"; "config_bytes" => found.config.len());
            let process = launch::Process::watch(child, plugin_log);
            lock(&self.launched).push(process.clone());
            let launched = Launched {
                idx: found.idx,
                base: found.base,
                config: found.config,
                process,
            };
            tokio::spawn(
                self.clone()
                    .handshake(stream, connected, None, Some(launched)),
            );
        }
    }

    fn publish(&self, plugins: &[Arc<Plugin>]) {
        self.active
            .send_replace(plugins.iter().map(|p| p.name.clone()).collect());
    }

    /// Runs a new connection's handshake; logs its outcome once. A launched plugin's is
    /// `launched`; it holds no pending-registration slot (`launch` bounds their number).
    async fn handshake(
        self: Arc<Self>,
        stream: UnixStream,
        connected: OwnedSemaphorePermit,
        _pending: Option<OwnedSemaphorePermit>,
        launched: Option<Launched>,
    ) {
        let conn = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let mut log = self.log.new(o!("plugin_conn" => conn));
        let process = launched.as_ref().map(|l| l.process.clone());
        if let Some(l) = &launched {
            log = log.new(o!("launched" => format!("{}-{}", l.idx, l.base),
                "pid" => l.process.pid));
        }
        if let Err(err) = self
            .clone()
            .register(stream, connected, launched, &log)
            .await
        {
            warn!(log, "NRI: plugin connection refused"; "error" => %err);
            if let Some(process) = process {
                process.kill();
            }
        }
    }

    async fn register(
        self: Arc<Self>,
        stream: UnixStream,
        connected: OwnedSemaphorePermit,
        launched: Option<Launched>,
        log: &Logger,
    ) -> Result<(), HandshakeError> {
        let mut shutdown = self.shutdown.subscribe();
        let mux = Mux::new(stream, Some(log.clone()));
        let runtime_conn = mux.open(RUNTIME_SERVICE_CONN)?;
        let plugin_conn = mux.open(PLUGIN_SERVICE_CONN)?;

        let (registered_tx, registered_rx) = oneshot::channel();
        let (identity, config, process) = match launched {
            Some(l) => (Some((l.idx, l.base)), l.config, Some(l.process)),
            None => (None, String::new(), None),
        };
        let service = Arc::new(RuntimeService {
            registered: Mutex::new(Some(registered_tx)),
            identity,
            name: OnceLock::new(),
            runtime: self.runtime.clone(),
            active: self.active.subscribe(),
            log: log.clone(),
        });
        // One connection, then a stream that ends when the trunk closes, so the server's
        // accept task ends with the plugin. (`Server::shutdown`, which would panic on an ended
        // stream, is never called: dropping the server notifies its connection instead.)
        let closed = mux.closed();
        let incoming = stream::iter([Ok(runtime_conn)])
            .chain(stream::once(closed).filter_map(|_| async { None }));
        let mut server = Server::new()
            .register_service(api::create_runtime(service))
            .add_listener(Listener::new(incoming));
        server.start().await.map_err(HandshakeError::Serve)?;
        let client = api::PluginClient::new(Client::new(Socket::new(plugin_conn)));

        let timeout = self.config.registration_timeout;
        let (idx, base) = tokio::select! {
            registered = registered_rx => match registered {
                Ok(Ok(id)) => id,
                Ok(Err(why)) => {
                    // The refusal is a status the server is still writing: give it until the
                    // plugin hangs up or a request timeout passes, then close.
                    let _ = tokio::time::timeout(self.config.request_timeout, mux.closed()).await;
                    return Err(HandshakeError::Invalid(why));
                }
                Err(_) => return Err(HandshakeError::Closed),
            },
            _ = mux.closed() => return Err(HandshakeError::Closed),
            _ = tokio::time::sleep(timeout) => {
                return Err(HandshakeError::RegistrationTimeout(timeout));
            }
            _ = stopping(&mut shutdown) => return Err(HandshakeError::Stopping),
        };
        let name = format!("{idx}-{base}");
        let log = log.new(o!("plugin" => name.clone()));
        info!(log, "NRI: plugin registered");
        if self.is_active(&name) {
            return Err(HandshakeError::Duplicate(name));
        }

        let events = self.configure(&client, config).await?;
        let plugin = Arc::new(Plugin {
            name,
            idx,
            base,
            events,
            client,
            mux,
            _server: Mutex::new(server),
            removed: AtomicBool::new(false),
            warned_state_change: AtomicBool::new(false),
            turn: tokio::sync::Mutex::new(()),
            log,
            _connected: connected,
            process,
        });

        let closed = plugin.mux.closed();
        let updates = {
            let _write = tokio::select! {
                write = self.sync_lock.clone().write_owned() => write,
                _ = plugin.mux.closed() => return Err(HandshakeError::Closed),
                _ = stopping(&mut shutdown) => return Err(HandshakeError::Stopping),
            };
            let (pods, containers) = self.sync.snapshot();
            let updates = self.synchronize(&plugin, pods, containers).await?;
            let mut plugins = lock(&self.plugins);
            if *self.shutdown.borrow() {
                return Err(HandshakeError::Stopping);
            }
            if plugins.iter().any(|p| p.name == plugin.name) {
                return Err(HandshakeError::Duplicate(plugin.name.clone()));
            }
            let at = plugins.partition_point(|p| (&p.idx, &p.base) <= (&plugin.idx, &plugin.base));
            plugins.insert(at, plugin.clone());
            self.publish(&plugins);
            updates
        };
        info!(plugin.log, "NRI: plugin synchronized and active";
            "events" => format!("0x{:x}", plugin.events));

        // Removed when its trunk closes, whoever closed it. Weak both ways: a registry dropped
        // without stop() drops its plugins, and their muxes close their trunks.
        let registry = Arc::downgrade(&self);
        let watched = Arc::downgrade(&plugin);
        tokio::spawn(async move {
            closed.await;
            if let (Some(registry), Some(plugin)) = (registry.upgrade(), watched.upgrade()) {
                registry.remove(&plugin, "connection closed");
            }
        });

        if !updates.is_empty() {
            let failed = self.runtime.update_containers(updates, Vec::new()).await;
            if !failed.is_empty() {
                warn!(plugin.log, "NRI: updates from Synchronize failed"; "failed" => failed.len());
            }
        }
        Ok(())
    }

    fn is_active(&self, name: &str) -> bool {
        lock(&self.plugins).iter().any(|p| p.name == name)
    }

    /// Configure with `config` (a launched plugin's file, else empty); returns the plugin's
    /// event mask, NRI's full set for 0.
    async fn configure(
        &self,
        client: &api::PluginClient,
        config: String,
    ) -> Result<u32, HandshakeError> {
        let mut req = api::ConfigureRequest::new();
        req.config = config;
        req.runtime_name = self.config.runtime_name.clone();
        req.runtime_version = self.config.runtime_version.clone();
        req.registration_timeout = millis(self.config.registration_timeout);
        req.request_timeout = millis(self.config.request_timeout);
        req.NRI_version = NRI_VERSION.to_string();
        let deadline = Instant::now() + self.config.request_timeout;
        let resp = bounded(deadline, client.configure(context_until(deadline), &req))
            .await
            .map_err(|e| HandshakeError::Configure(e.to_string()))?;
        // The wire's int32, as the bit set it is.
        let events = resp.events as u32;
        if events == 0 {
            return Ok(VALID_EVENTS);
        }
        if events & !VALID_EVENTS != 0 {
            return Err(HandshakeError::BadEvents(events & !VALID_EVENTS));
        }
        Ok(events)
    }

    /// Synchronize in chunks under ttrpc's message limit, all within one request timeout.
    async fn synchronize(
        &self,
        plugin: &Plugin,
        pods: Vec<api::PodSandbox>,
        containers: Vec<api::Container>,
    ) -> Result<Vec<api::ContainerUpdate>, HandshakeError> {
        let chunks = sync_chunks(pods, containers, SYNC_MESSAGE_BUDGET)?;
        debug!(plugin.log, "NRI: synchronizing"; "messages" => chunks.len());
        let deadline = Instant::now() + self.config.request_timeout;
        let mut updates = Vec::new();
        for req in chunks {
            let resp = bounded(
                deadline,
                plugin.client.synchronize(context_until(deadline), &req),
            )
            .await
            .map_err(|e| HandshakeError::Synchronize(e.to_string()))?;
            if req.more && (resp.more != req.more || !resp.update.is_empty()) {
                return Err(HandshakeError::SplitSync);
            }
            updates = resp.update;
        }
        Ok(updates)
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        // Ends the accept task and pending handshakes.
        self.shutdown.send_replace(true);
    }
}

/// A registration's outcome: (idx, name), or why it was refused.
type Registration = Result<(String, String), String>;

/// The runtime service one plugin connection is served.
struct RuntimeService {
    /// Taken by the first RegisterPlugin.
    registered: Mutex<Option<oneshot::Sender<Registration>>>,
    /// A launched plugin's (idx, name), from its file name: what it registers as, whatever
    /// it sends (NRI checks and uses the request's only for external plugins).
    identity: Option<(String, String)>,
    name: OnceLock<String>,
    runtime: Arc<dyn RuntimeHandle>,
    /// The active plugins' names, so an external plugin taking a name in use is told why.
    active: watch::Receiver<Vec<String>>,
    log: Logger,
}

#[async_trait::async_trait]
impl api::Runtime for RuntimeService {
    async fn register_plugin(
        &self,
        _ctx: &TtrpcContext,
        req: api::RegisterPluginRequest,
    ) -> ttrpc::Result<api::Empty> {
        let Some(tx) = lock(&self.registered).take() else {
            return Err(status(
                ttrpc::Code::FAILED_PRECONDITION,
                "plugin already registered",
            ));
        };
        if let Some((idx, base)) = &self.identity {
            if (&req.plugin_idx, &req.plugin_name) != (idx, base) {
                debug!(self.log, "NRI: launched plugin registered as another; its file name counts";
                    "sent_idx" => &req.plugin_idx, "sent_name" => &req.plugin_name);
            }
            // Set once: `registered` was still there.
            let _ = self.name.set(format!("{idx}-{base}"));
            // The handshake may have given up already; it logged that.
            let _ = tx.send(Ok((idx.clone(), base.clone())));
            return Ok(api::Empty::new());
        }
        let name = format!("{}-{}", req.plugin_idx, req.plugin_name);
        // Checked again when it is activated: two registering at once are not both let in.
        if self.active.borrow().contains(&name) {
            let why = format!("a plugin named {name} is already registered");
            let _ = tx.send(Err(why.clone()));
            return Err(status(ttrpc::Code::ALREADY_EXISTS, why));
        }
        match check_registration(&req.plugin_idx, &req.plugin_name) {
            Ok(()) => {
                // Set once: `registered` was still there.
                let _ = self.name.set(name);
                // The handshake may have given up already; it logged that.
                let _ = tx.send(Ok((req.plugin_idx, req.plugin_name)));
                Ok(api::Empty::new())
            }
            Err(why) => {
                let _ = tx.send(Err(why.clone()));
                Err(status(ttrpc::Code::INVALID_ARGUMENT, why))
            }
        }
    }

    async fn update_containers(
        &self,
        _ctx: &TtrpcContext,
        req: api::UpdateContainersRequest,
    ) -> ttrpc::Result<api::UpdateContainersResponse> {
        let Some(name) = self.name.get() else {
            return Err(status(
                ttrpc::Code::FAILED_PRECONDITION,
                "UpdateContainers before RegisterPlugin",
            ));
        };
        info!(self.log, "NRI: plugin requested container updates"; "plugin" => name,
            "updates" => req.update.len(), "evictions" => req.evict.len());
        let mut resp = api::UpdateContainersResponse::new();
        resp.failed = self.runtime.update_containers(req.update, req.evict).await;
        Ok(resp)
    }
}

/// NRI's checks (`api.CheckPluginIndex`, `api.CheckPluginName`), plus a length bound.
fn check_registration(idx: &str, name: &str) -> Result<(), String> {
    if idx.len() != 2 || !idx.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("invalid plugin index {idx:?}, must be 2 digits"));
    }
    if name.is_empty() {
        return Err("empty plugin name".to_string());
    }
    if name.len() > MAX_PLUGIN_NAME_LEN {
        return Err(format!(
            "plugin name longer than {MAX_PLUGIN_NAME_LEN} bytes"
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '+')))
    {
        return Err(format!("invalid character {c:?} in plugin name {name:?}"));
    }
    Ok(())
}

/// Resolves once the registry is stopping (or gone). Returns nothing, unlike `wait_for`,
/// whose `Ref` result is not `Send` and would make a `select!` holding it not `Send`.
async fn stopping(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// Accepts connections until the shutdown signal or the registry's drop.
async fn accept_loop(
    registry: Weak<Registry>,
    listener: UnixListener,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stopping(&mut shutdown) => return,
        };
        let Some(registry) = registry.upgrade() else {
            return;
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(err) => {
                warn!(registry.log, "NRI: accepting a plugin connection failed"; "error" => %err);
                drop(registry);
                // Back off so a persistent failure (EMFILE) does not spin.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(connected) = registry.connected.clone().try_acquire_owned() else {
            warn!(registry.log, "NRI: plugin connection refused: too many plugins";
                "max" => MAX_PLUGINS);
            continue;
        };
        let Ok(pending) = registry.pending.clone().try_acquire_owned() else {
            warn!(registry.log, "NRI: plugin connection refused: too many registrations pending";
                "max" => MAX_PENDING_REGISTRATIONS);
            continue;
        };
        tokio::spawn(registry.handshake(stream, connected, Some(pending), None));
    }
}

/// Creates the socket's directory (0700) if missing, removes a stale socket, binds, chmods
/// 0600.
fn bind(path: &Path) -> Result<UnixListener, RegistryError> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .ok_or_else(|| RegistryError::NoParent(path.to_path_buf()))?;
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| RegistryError::CreateDir {
                path: dir.to_path_buf(),
                source,
            })?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            std::fs::remove_file(path).map_err(|source| RegistryError::RemoveStale {
                path: path.to_path_buf(),
                source,
            })?;
        }
        Ok(_) => return Err(RegistryError::NotASocket(path.to_path_buf())),
        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(RegistryError::RemoveStale {
                path: path.to_path_buf(),
                source,
            })
        }
    }
    let listener = UnixListener::bind(path).map_err(|source| RegistryError::Bind {
        path: path.to_path_buf(),
        source,
    })?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|source| {
        RegistryError::Chmod {
            path: path.to_path_buf(),
            source,
        }
    })?;
    Ok(listener)
}

/// Splits a snapshot into Synchronize requests each at most `budget` bytes encoded, `more`
/// set on all but the last; one request (maybe empty) at least.
fn sync_chunks(
    pods: Vec<api::PodSandbox>,
    containers: Vec<api::Container>,
    budget: usize,
) -> Result<Vec<api::SynchronizeRequest>, HandshakeError> {
    // The `more` field: a tag byte and a value byte.
    const MORE_FIELD: usize = 2;
    let mut chunks = Vec::new();
    let mut current = api::SynchronizeRequest::new();
    let mut size = MORE_FIELD;
    let fits = |len: usize| len + MORE_FIELD <= budget;
    for pod in pods {
        let field = field_size(pod.compute_size());
        if !fits(field) {
            return Err(HandshakeError::Oversized(field));
        }
        if size + field > budget {
            chunks.push(std::mem::take(&mut current));
            size = MORE_FIELD;
        }
        size += field;
        current.pods.push(pod);
    }
    for container in containers {
        let field = field_size(container.compute_size());
        if !fits(field) {
            return Err(HandshakeError::Oversized(field));
        }
        if size + field > budget {
            chunks.push(std::mem::take(&mut current));
            size = MORE_FIELD;
        }
        size += field;
        current.containers.push(container);
    }
    chunks.push(current);
    let last = chunks.len() - 1;
    for chunk in &mut chunks[..last] {
        chunk.more = true;
    }
    Ok(chunks)
}

/// The encoded size of a length-delimited field of `len` bytes: tag, length varint, bytes.
fn field_size(len: u64) -> usize {
    let len = usize::try_from(len).unwrap_or(usize::MAX);
    1 + varint_len(len) + len
}

fn varint_len(mut n: usize) -> usize {
    let mut bytes = 1;
    while n >= 0x80 {
        n >>= 7;
        bytes += 1;
    }
    bytes
}

/// An event's bit in a plugin's mask.
fn event_bit(event: api::Event) -> u32 {
    match event.value() {
        e @ 1..=31 => 1 << (e - 1),
        _ => 0,
    }
}

/// One NRI event, as its request.
enum Call {
    RunPodSandbox(api::RunPodSandboxRequest),
    UpdatePodSandbox(api::UpdatePodSandboxRequest),
    PostUpdatePodSandbox(api::PostUpdatePodSandboxRequest),
    StopPodSandbox(api::StopPodSandboxRequest),
    RemovePodSandbox(api::RemovePodSandboxRequest),
    CreateContainer(api::CreateContainerRequest),
    PostCreateContainer(api::PostCreateContainerRequest),
    StartContainer(api::StartContainerRequest),
    PostStartContainer(api::PostStartContainerRequest),
    UpdateContainer(api::UpdateContainerRequest),
    PostUpdateContainer(api::PostUpdateContainerRequest),
    StopContainer(api::StopContainerRequest),
    RemoveContainer(api::RemoveContainerRequest),
}

/// A plugin's answer to a [`Call`]; `Empty` for the events that return nothing.
enum Reply {
    Empty,
    CreateContainer(api::CreateContainerResponse),
    UpdateContainer(api::UpdateContainerResponse),
    StopContainer(api::StopContainerResponse),
}

impl Call {
    fn event(&self) -> api::Event {
        use api::Event as E;
        match self {
            Call::RunPodSandbox(_) => E::RUN_POD_SANDBOX,
            Call::UpdatePodSandbox(_) => E::UPDATE_POD_SANDBOX,
            Call::PostUpdatePodSandbox(_) => E::POST_UPDATE_POD_SANDBOX,
            Call::StopPodSandbox(_) => E::STOP_POD_SANDBOX,
            Call::RemovePodSandbox(_) => E::REMOVE_POD_SANDBOX,
            Call::CreateContainer(_) => E::CREATE_CONTAINER,
            Call::PostCreateContainer(_) => E::POST_CREATE_CONTAINER,
            Call::StartContainer(_) => E::START_CONTAINER,
            Call::PostStartContainer(_) => E::POST_START_CONTAINER,
            Call::UpdateContainer(_) => E::UPDATE_CONTAINER,
            Call::PostUpdateContainer(_) => E::POST_UPDATE_CONTAINER,
            Call::StopContainer(_) => E::STOP_CONTAINER,
            Call::RemoveContainer(_) => E::REMOVE_CONTAINER,
        }
    }

    /// Whether a plugin's error status fails the runtime's call.
    fn fails_on_error(&self) -> bool {
        matches!(
            self,
            Call::RunPodSandbox(_)
                | Call::UpdatePodSandbox(_)
                | Call::CreateContainer(_)
                | Call::UpdateContainer(_)
                | Call::StartContainer(_)
        )
    }

    /// The deprecated StateChange for this event, for the events NRI falls back for
    /// (pkg/adaptation/plugin_type.go): those that return nothing, except UpdatePodSandbox.
    fn state_change(&self) -> Option<api::StateChangeEvent> {
        let (pod, container) = match self {
            Call::RunPodSandbox(r) => (&r.pod, None),
            Call::PostUpdatePodSandbox(r) => (&r.pod, None),
            Call::StopPodSandbox(r) => (&r.pod, None),
            Call::RemovePodSandbox(r) => (&r.pod, None),
            Call::PostCreateContainer(r) => (&r.pod, Some(&r.container)),
            Call::StartContainer(r) => (&r.pod, Some(&r.container)),
            Call::PostStartContainer(r) => (&r.pod, Some(&r.container)),
            Call::PostUpdateContainer(r) => (&r.pod, Some(&r.container)),
            Call::RemoveContainer(r) => (&r.pod, Some(&r.container)),
            Call::UpdatePodSandbox(_)
            | Call::CreateContainer(_)
            | Call::UpdateContainer(_)
            | Call::StopContainer(_) => return None,
        };
        let mut change = api::StateChangeEvent::new();
        change.event = self.event().into();
        change.pod = pod.clone();
        if let Some(container) = container {
            change.container = container.clone();
        }
        Some(change)
    }

    /// The plugin RPC for this event, with a ttrpc timeout ending at `deadline`.
    fn invoke<'a>(
        &'a self,
        client: &'a api::PluginClient,
        deadline: Instant,
    ) -> impl Future<Output = ttrpc::Result<Reply>> + Send + 'a {
        let ctx = context_until(deadline);
        async move {
            Ok(match self {
                Call::RunPodSandbox(r) => {
                    client.run_pod_sandbox(ctx, r).await.map(|_| Reply::Empty)?
                }
                Call::UpdatePodSandbox(r) => client
                    .update_pod_sandbox(ctx, r)
                    .await
                    .map(|_| Reply::Empty)?,
                Call::PostUpdatePodSandbox(r) => client
                    .post_update_pod_sandbox(ctx, r)
                    .await
                    .map(|_| Reply::Empty)?,
                Call::StopPodSandbox(r) => client
                    .stop_pod_sandbox(ctx, r)
                    .await
                    .map(|_| Reply::Empty)?,
                Call::RemovePodSandbox(r) => client
                    .remove_pod_sandbox(ctx, r)
                    .await
                    .map(|_| Reply::Empty)?,
                Call::CreateContainer(r) => {
                    Reply::CreateContainer(client.create_container(ctx, r).await?)
                }
                Call::PostCreateContainer(r) => client
                    .post_create_container(ctx, r)
                    .await
                    .map(|_| Reply::Empty)?,
                Call::StartContainer(r) => {
                    client.start_container(ctx, r).await.map(|_| Reply::Empty)?
                }
                Call::PostStartContainer(r) => client
                    .post_start_container(ctx, r)
                    .await
                    .map(|_| Reply::Empty)?,
                Call::UpdateContainer(r) => {
                    Reply::UpdateContainer(client.update_container(ctx, r).await?)
                }
                Call::PostUpdateContainer(r) => client
                    .post_update_container(ctx, r)
                    .await
                    .map(|_| Reply::Empty)?,
                Call::StopContainer(r) => {
                    Reply::StopContainer(client.stop_container(ctx, r).await?)
                }
                Call::RemoveContainer(r) => client
                    .remove_container(ctx, r)
                    .await
                    .map(|_| Reply::Empty)?,
            })
        }
    }
}

/// Runs a plugin call until `deadline`: ttrpc's own timeout is in the context, this one
/// bounds the whole future whatever the transport does. A status is the plugin's answer;
/// anything else (no answer, a transport failure) is fatal for the plugin.
async fn bounded<T>(
    deadline: Instant,
    call: impl Future<Output = ttrpc::Result<T>>,
) -> Result<T, CallError> {
    match tokio::time::timeout_at(deadline, call).await {
        Ok(Ok(reply)) => Ok(reply),
        Ok(Err(ttrpc::Error::RpcStatus(status))) => Err(CallError::Status(status)),
        Ok(Err(err)) => Err(CallError::Fatal(err.to_string())),
        Err(_) => Err(CallError::Fatal(
            "no answer within the request timeout".into(),
        )),
    }
}

/// A ttrpc context whose timeout ends at `deadline` (at least a millisecond: 0 means none).
fn context_until(deadline: Instant) -> ttrpc::context::Context {
    context(deadline.saturating_duration_since(Instant::now()))
}

fn context(timeout: Duration) -> ttrpc::context::Context {
    let nanos = i64::try_from(timeout.as_nanos())
        .unwrap_or(i64::MAX)
        .max(1_000_000);
    ttrpc::context::with_timeout(nanos)
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn status(code: ttrpc::Code, message: impl ToString) -> ttrpc::Error {
    ttrpc::Error::RpcStatus(ttrpc::get_status(code, message))
}

/// Locks a std mutex held only in short sections that do not panic; a poisoned one is still
/// consistent (every section leaves it so), so its data is used.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;
    use std::time::Duration;

    use tokio::sync::mpsc;
    use tokio::time::timeout;

    use super::*;

    /// A bound on every wait: a wedged registry fails the test instead of hanging it.
    const DEADLINE: Duration = Duration::from_secs(10);
    /// Generous for in-process fakes, so that a loaded machine (the test command runs four
    /// test threads on two cores) does not make a plugin that answers look silent.
    const REGISTRATION_TIMEOUT: Duration = Duration::from_secs(2);
    const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

    fn discard() -> Logger {
        Logger::root(slog::Discard, o!())
    }

    /// What a fake plugin was sent, tagged with its name.
    #[derive(Clone, Debug, PartialEq)]
    enum Seen {
        Configured {
            runtime: String,
            request_timeout: i64,
            config: String,
        },
        Synced {
            pods: Vec<String>,
            containers: Vec<String>,
            more: bool,
        },
        Event(api::Event, String),
        StateChange(api::Event, String),
        Shutdown,
    }

    /// How a fake plugin answers events.
    #[derive(Clone, Copy)]
    enum Answer {
        Ok,
        Fail,
        Hang,
        Unimplemented,
        /// Never answers Synchronize; answers events.
        HangInSync,
        /// Answers events after yielding a while, counting the calls it is in at once
        /// ([`MAX_OVERLAP`]; one test uses it).
        Overlap,
    }

    static IN_FLIGHT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    static MAX_OVERLAP: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    /// A plugin that records what it is sent and answers events as told.
    struct FakePlugin {
        name: String,
        events: i32,
        answer: Answer,
        seen: Sink,
    }

    /// Where a fake plugin records what it is sent: the test's channel, or, in a launched
    /// child process ([`launched_plugin_child`]), a file, written before the plugin answers.
    enum Sink {
        Channel(mpsc::UnboundedSender<(String, Seen)>),
        File(Mutex<std::fs::File>),
    }

    impl Sink {
        /// Records one item; an error if nobody is listening (then nobody needs it).
        fn send(&self, (name, seen): (String, Seen)) -> Result<(), ()> {
            match self {
                Sink::Channel(tx) => tx.send((name, seen)).map_err(drop),
                Sink::File(file) => {
                    use std::io::Write as _;
                    writeln!(lock(file), "{name} {seen:?}").map_err(drop)
                }
            }
        }
    }

    impl FakePlugin {
        async fn event(&self, event: api::Event, id: &str) -> ttrpc::Result<()> {
            // The test may have stopped listening; then nobody needs the record.
            let _ = self
                .seen
                .send((self.name.clone(), Seen::Event(event, id.into())));
            match self.answer {
                Answer::Ok | Answer::HangInSync => Ok(()),
                Answer::Fail => Err(status(ttrpc::Code::UNKNOWN, "refused by the fake")),
                Answer::Hang => std::future::pending().await,
                Answer::Overlap => {
                    let now = IN_FLIGHT.fetch_add(1, Ordering::SeqCst) + 1;
                    MAX_OVERLAP.fetch_max(now, Ordering::SeqCst);
                    for _ in 0..50 {
                        tokio::task::yield_now().await;
                    }
                    IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
                    Ok(())
                }
                Answer::Unimplemented => Err(status(ttrpc::Code::UNIMPLEMENTED, "old stub")),
            }
        }
    }

    #[async_trait::async_trait]
    impl api::Plugin for FakePlugin {
        async fn configure(
            &self,
            _ctx: &TtrpcContext,
            req: api::ConfigureRequest,
        ) -> ttrpc::Result<api::ConfigureResponse> {
            let _ = self.seen.send((
                self.name.clone(),
                Seen::Configured {
                    runtime: req.runtime_name,
                    request_timeout: req.request_timeout,
                    config: req.config,
                },
            ));
            let mut resp = api::ConfigureResponse::new();
            resp.events = self.events;
            Ok(resp)
        }

        async fn synchronize(
            &self,
            _ctx: &TtrpcContext,
            req: api::SynchronizeRequest,
        ) -> ttrpc::Result<api::SynchronizeResponse> {
            let _ = self.seen.send((
                self.name.clone(),
                Seen::Synced {
                    pods: req.pods.iter().map(|p| p.id.clone()).collect(),
                    containers: req.containers.iter().map(|c| c.id.clone()).collect(),
                    more: req.more,
                },
            ));
            if matches!(self.answer, Answer::HangInSync) {
                std::future::pending::<()>().await;
            }
            let mut resp = api::SynchronizeResponse::new();
            resp.more = req.more;
            Ok(resp)
        }

        async fn shutdown(
            &self,
            _ctx: &TtrpcContext,
            _req: api::Empty,
        ) -> ttrpc::Result<api::Empty> {
            let _ = self.seen.send((self.name.clone(), Seen::Shutdown));
            Ok(api::Empty::new())
        }

        async fn run_pod_sandbox(
            &self,
            _ctx: &TtrpcContext,
            req: api::RunPodSandboxRequest,
        ) -> ttrpc::Result<api::RunPodSandboxResponse> {
            self.event(api::Event::RUN_POD_SANDBOX, &req.pod.id).await?;
            Ok(api::RunPodSandboxResponse::new())
        }

        async fn stop_pod_sandbox(
            &self,
            _ctx: &TtrpcContext,
            req: api::StopPodSandboxRequest,
        ) -> ttrpc::Result<api::StopPodSandboxResponse> {
            self.event(api::Event::STOP_POD_SANDBOX, &req.pod.id)
                .await?;
            Ok(api::StopPodSandboxResponse::new())
        }

        async fn create_container(
            &self,
            _ctx: &TtrpcContext,
            req: api::CreateContainerRequest,
        ) -> ttrpc::Result<api::CreateContainerResponse> {
            self.event(api::Event::CREATE_CONTAINER, &req.container.id)
                .await?;
            let mut resp = api::CreateContainerResponse::new();
            let mut adjust = api::ContainerAdjustment::new();
            adjust
                .annotations
                .insert("adjusted-by".into(), self.name.clone());
            resp.adjust = Some(adjust).into();
            Ok(resp)
        }

        async fn remove_container(
            &self,
            _ctx: &TtrpcContext,
            req: api::RemoveContainerRequest,
        ) -> ttrpc::Result<api::RemoveContainerResponse> {
            self.event(api::Event::REMOVE_CONTAINER, &req.container.id)
                .await?;
            Ok(api::RemoveContainerResponse::new())
        }

        async fn state_change(
            &self,
            _ctx: &TtrpcContext,
            req: api::StateChangeEvent,
        ) -> ttrpc::Result<api::Empty> {
            let _ = self.seen.send((
                self.name.clone(),
                Seen::StateChange(req.event.enum_value_or_default(), req.pod.id.clone()),
            ));
            Ok(api::Empty::new())
        }
    }

    /// A snapshot fixed by the test.
    #[derive(Default)]
    struct FixedSnapshot {
        pods: Vec<api::PodSandbox>,
        containers: Vec<api::Container>,
    }

    impl SyncSource for FixedSnapshot {
        fn snapshot(&self) -> (Vec<api::PodSandbox>, Vec<api::Container>) {
            (self.pods.clone(), self.containers.clone())
        }
    }

    /// A snapshot the test changes as it goes, as the runtime's objects do.
    #[derive(Default)]
    struct SharedSnapshot(Mutex<FixedSnapshot>);

    impl SyncSource for SharedSnapshot {
        fn snapshot(&self) -> (Vec<api::PodSandbox>, Vec<api::Container>) {
            lock(&self.0).snapshot()
        }
    }

    /// Records the updates it is asked for; reports the first of each batch as failed.
    #[derive(Default)]
    struct RecordingRuntime {
        updates: Mutex<Vec<(Vec<String>, Vec<String>)>>,
    }

    #[async_trait::async_trait]
    impl RuntimeHandle for RecordingRuntime {
        async fn update_containers(
            &self,
            updates: Vec<api::ContainerUpdate>,
            evictions: Vec<api::ContainerEviction>,
        ) -> Vec<api::ContainerUpdate> {
            lock(&self.updates).push((
                updates.iter().map(|u| u.container_id.clone()).collect(),
                evictions.iter().map(|e| e.container_id.clone()).collect(),
            ));
            updates.into_iter().take(1).collect()
        }
    }

    struct Harness {
        _dir: tempfile::TempDir,
        path: PathBuf,
        registry: Arc<Registry>,
        runtime: Arc<RecordingRuntime>,
        seen_tx: mpsc::UnboundedSender<(String, Seen)>,
        seen: mpsc::UnboundedReceiver<(String, Seen)>,
    }

    fn harness(snapshot: FixedSnapshot) -> Harness {
        harness_with(Arc::new(snapshot), REQUEST_TIMEOUT)
    }

    fn harness_with(sync: Arc<dyn SyncSource>, request_timeout: Duration) -> Harness {
        let dir = tempfile::tempdir().expect("tempdir");
        start_harness(dir, sync, request_timeout, false)
    }

    /// A harness that launches the plugins `prepare` puts in `<dir>/plugins`, configured from
    /// `<dir>/conf.d`.
    fn launching_harness(prepare: impl FnOnce(&Path)) -> Harness {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("plugins")).expect("mkdir");
        std::fs::create_dir(dir.path().join("conf.d")).expect("mkdir");
        prepare(dir.path());
        start_harness(
            dir,
            Arc::new(FixedSnapshot::default()),
            REQUEST_TIMEOUT,
            true,
        )
    }

    fn start_harness(
        dir: tempfile::TempDir,
        sync: Arc<dyn SyncSource>,
        request_timeout: Duration,
        launch: bool,
    ) -> Harness {
        let path = dir.path().join("nri").join("nri.sock");
        let mut config = Config::new(&path, "remora", "0.1.0");
        config.registration_timeout = REGISTRATION_TIMEOUT;
        config.request_timeout = request_timeout;
        if launch {
            config.plugin_path = Some(dir.path().join("plugins"));
            config.plugin_config_path = Some(dir.path().join("conf.d"));
        }
        let runtime = Arc::new(RecordingRuntime::default());
        let registry = Registry::start(config, sync, runtime.clone(), discard())
            .expect("starting the registry");
        let (seen_tx, seen) = mpsc::unbounded_channel();
        Harness {
            _dir: dir,
            path,
            registry,
            runtime,
            seen_tx,
            seen,
        }
    }

    /// A fake plugin's end of its connection: its mux, the server of its Plugin service
    /// (kept alive), and its client of remora's Runtime service.
    struct PluginEnd {
        mux: Mux,
        _server: Server,
        runtime: api::RuntimeClient,
    }

    impl Harness {
        /// Connects a fake plugin without registering it.
        async fn connect(&self, name: &str, events: i32, answer: Answer) -> PluginEnd {
            let stream = UnixStream::connect(&self.path).await.expect("connect");
            let fake = FakePlugin {
                name: name.into(),
                events,
                answer,
                seen: Sink::Channel(self.seen_tx.clone()),
            };
            serve_fake(stream, fake).await
        }

        /// Connects and registers a fake plugin as `<idx>-<name>` and waits until it is
        /// active.
        async fn plugin(&self, idx: &str, name: &str, events: i32, answer: Answer) -> PluginEnd {
            let full = format!("{idx}-{name}");
            let end = self.connect(&full, events, answer).await;
            register(&end, idx, name).await.expect("RegisterPlugin");
            let mut active = self.registry.watch_plugins();
            timeout(DEADLINE, active.wait_for(|names| names.contains(&full)))
                .await
                .expect("the plugin becomes active in time")
                .expect("the registry is alive");
            end
        }

        /// Takes what the fake plugins recorded so far (everything they were sent before the
        /// registry's last awaited call returned).
        fn drain(&mut self) -> Vec<(String, Seen)> {
            let mut seen = Vec::new();
            while let Ok(item) = self.seen.try_recv() {
                seen.push(item);
            }
            seen
        }

        async fn next_seen(&mut self) -> (String, Seen) {
            timeout(DEADLINE, self.seen.recv())
                .await
                .expect("the plugin is sent something in time")
                .expect("senders alive")
        }
    }

    /// Serves `fake` on a plugin's connection to the registry.
    async fn serve_fake(stream: UnixStream, fake: FakePlugin) -> PluginEnd {
        let mux = Mux::new(stream, None);
        let plugin_conn = mux.open(PLUGIN_SERVICE_CONN).expect("open conn 1");
        let runtime_conn = mux.open(RUNTIME_SERVICE_CONN).expect("open conn 2");
        // Pending after the one connection: ttrpc's accept loop expects a live listener.
        let incoming = stream::iter([Ok(plugin_conn)]).chain(stream::pending());
        let mut server = Server::new()
            .register_service(api::create_plugin(Arc::new(fake)))
            .add_listener(Listener::new(incoming));
        server.start().await.expect("plugin server");
        PluginEnd {
            mux,
            _server: server,
            runtime: api::RuntimeClient::new(Client::new(Socket::new(runtime_conn))),
        }
    }

    async fn register(end: &PluginEnd, idx: &str, name: &str) -> ttrpc::Result<api::Empty> {
        let mut req = api::RegisterPluginRequest::new();
        req.plugin_idx = idx.into();
        req.plugin_name = name.into();
        req.NRI_version = NRI_VERSION.into();
        end.runtime
            .register_plugin(ttrpc::context::with_timeout(5_000_000_000), &req)
            .await
    }

    async fn wait_closed(end: &PluginEnd) {
        timeout(DEADLINE, end.mux.closed())
            .await
            .expect("remora closes the plugin's connection in time");
    }

    fn mask(events: &[api::Event]) -> i32 {
        events.iter().map(|e| 1 << (e.value() - 1)).sum()
    }

    fn pod(id: &str) -> api::PodSandbox {
        let mut pod = api::PodSandbox::new();
        pod.id = id.into();
        pod
    }

    fn container(id: &str, pod: &str) -> api::Container {
        let mut c = api::Container::new();
        c.id = id.into();
        c.pod_sandbox_id = pod.into();
        c
    }

    #[tokio::test]
    async fn a_plugin_registers_is_configured_and_synchronized_with_the_snapshot() {
        let mut h = harness(FixedSnapshot {
            pods: vec![pod("p1")],
            containers: vec![container("c1", "p1"), container("c2", "p1")],
        });
        // Events 0: NRI's "every event".
        let _end = h.plugin("10", "logger", 0, Answer::Ok).await;
        assert_eq!(h.registry.plugins(), ["10-logger"]);
        assert_eq!(
            h.drain(),
            [
                (
                    "10-logger".to_string(),
                    Seen::Configured {
                        runtime: "remora".into(),
                        request_timeout: 2000,
                        config: String::new(),
                    }
                ),
                (
                    "10-logger".to_string(),
                    Seen::Synced {
                        pods: vec!["p1".into()],
                        containers: vec!["c1".into(), "c2".into()],
                        more: false
                    }
                ),
            ]
        );
        // Subscribed to everything: RemoveContainer reaches it.
        timeout(
            DEADLINE,
            h.registry
                .remove_container(&pod("p1"), &container("c1", "p1")),
        )
        .await
        .expect("in time");
        assert_eq!(
            h.drain(),
            [(
                "10-logger".to_string(),
                Seen::Event(api::Event::REMOVE_CONTAINER, "c1".into())
            )]
        );
    }

    #[tokio::test]
    async fn a_plugin_that_never_registers_is_closed_after_the_registration_timeout() {
        let mut h = harness(FixedSnapshot::default());
        let started = Instant::now();
        let end = h.connect("silent", 0, Answer::Ok).await;
        wait_closed(&end).await;
        assert!(
            started.elapsed() >= REGISTRATION_TIMEOUT,
            "{:?}",
            started.elapsed()
        );
        assert!(h.registry.plugins().is_empty());
        assert_eq!(h.drain(), [], "never configured");
    }

    #[tokio::test]
    async fn a_bad_index_or_name_is_refused_and_the_connection_closed() {
        // A short request timeout: remora waits that long for a refused plugin to hang up.
        let mut h = harness_with(
            Arc::new(FixedSnapshot::default()),
            Duration::from_millis(200),
        );
        let long = "x".repeat(MAX_PLUGIN_NAME_LEN + 1);
        for (idx, name) in [
            ("1", "ok"),
            ("100", "ok"),
            ("1a", "ok"),
            ("٣٣", "ok"),
            ("10", ""),
            ("10", "a/b"),
            ("10", "a b"),
            ("10", long.as_str()),
        ] {
            let end = h.connect("bad", 0, Answer::Ok).await;
            match register(&end, idx, name).await {
                Err(ttrpc::Error::RpcStatus(s)) => {
                    assert_eq!(s.code(), ttrpc::Code::INVALID_ARGUMENT, "{idx:?} {name:?}");
                }
                other => panic!("{idx:?} {name:?} registered: {other:?}"),
            }
            wait_closed(&end).await;
        }
        assert!(h.registry.plugins().is_empty());
        assert_eq!(h.drain(), [], "never configured");
        // The longest name is fine.
        let longest = "x".repeat(MAX_PLUGIN_NAME_LEN);
        let _end = h.plugin("99", &longest, 0, Answer::Ok).await;
    }

    /// Go's ttrpc server refuses a request whose stream id is below the last one it saw, and
    /// two calls at once on one client can be written out of order: critest's concurrent
    /// creates failed StartContainer with "StreamID cannot be re-used and must increment".
    /// A plugin gets one call at a time.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_plugin_gets_one_call_at_a_time_from_concurrent_events() {
        let h = harness(FixedSnapshot::default());
        let _p = h.plugin("10", "overlap", 0, Answer::Overlap).await;
        let runs = (0..16).map(|i| {
            let (registry, p) = (h.registry.clone(), pod(&format!("p{i}")));
            tokio::spawn(async move { registry.run_pod_sandbox(&p).await })
        });
        for run in futures::future::join_all(runs).await {
            run.expect("the task").expect("RunPodSandbox");
        }
        assert_eq!(MAX_OVERLAP.load(Ordering::SeqCst), 1, "calls at once");
    }

    #[tokio::test]
    async fn a_second_plugin_with_the_same_index_and_name_is_refused() {
        let h = harness(FixedSnapshot::default());
        let _first = h.plugin("10", "dup", 0, Answer::Ok).await;
        let second = h.connect("10-dup", 0, Answer::Ok).await;
        // The plugin is told why, then its connection closes.
        let err = register(&second, "10", "dup")
            .await
            .expect_err("a name in use is refused");
        match err {
            ttrpc::Error::RpcStatus(s) => {
                assert_eq!(s.code(), ttrpc::Code::ALREADY_EXISTS, "{s:?}");
                assert!(s.message().contains("10-dup"), "{s:?}");
            }
            other => panic!("{other:?}"),
        }
        wait_closed(&second).await;
        assert_eq!(h.registry.plugins(), ["10-dup"]);
    }

    #[tokio::test]
    async fn plugins_are_called_in_index_order_and_only_for_their_events() {
        let mut h = harness(FixedSnapshot::default());
        use api::Event as E;
        // Registered out of order.
        let _b = h
            .plugin(
                "20",
                "b",
                mask(&[E::RUN_POD_SANDBOX, E::STOP_POD_SANDBOX]),
                Answer::Ok,
            )
            .await;
        let _a = h
            .plugin(
                "10",
                "a",
                mask(&[E::RUN_POD_SANDBOX, E::CREATE_CONTAINER]),
                Answer::Ok,
            )
            .await;
        assert_eq!(h.registry.plugins(), ["10-a", "20-b"]);
        h.drain();

        let r = &h.registry;
        timeout(DEADLINE, r.run_pod_sandbox(&pod("p1")))
            .await
            .expect("in time")
            .expect("RunPodSandbox");
        timeout(DEADLINE, r.stop_pod_sandbox(&pod("p1")))
            .await
            .expect("in time");
        let created = timeout(
            DEADLINE,
            r.create_container(&pod("p1"), &container("c1", "p1")),
        )
        .await
        .expect("in time")
        .expect("CreateContainer");
        timeout(DEADLINE, r.remove_pod_sandbox(&pod("p1")))
            .await
            .expect("in time");
        assert_eq!(
            h.drain(),
            [
                ("10-a".into(), Seen::Event(E::RUN_POD_SANDBOX, "p1".into())),
                ("20-b".into(), Seen::Event(E::RUN_POD_SANDBOX, "p1".into())),
                ("20-b".into(), Seen::Event(E::STOP_POD_SANDBOX, "p1".into())),
                ("10-a".into(), Seen::Event(E::CREATE_CONTAINER, "c1".into())),
            ]
        );
        assert_eq!(created.len(), 1);
        assert_eq!(created[0].0, "10-a");
        assert_eq!(created[0].1.adjust.annotations["adjusted-by"], "10-a");
    }

    #[tokio::test]
    async fn a_plugin_error_fails_run_pod_sandbox_naming_the_plugin_but_only_logs_on_stop() {
        let mut h = harness(FixedSnapshot::default());
        use api::Event as E;
        let events = mask(&[E::RUN_POD_SANDBOX, E::STOP_POD_SANDBOX]);
        let _bad = h.plugin("10", "bad", events, Answer::Fail).await;
        let _good = h.plugin("20", "good", events, Answer::Ok).await;
        h.drain();

        let err = timeout(DEADLINE, h.registry.run_pod_sandbox(&pod("p1")))
            .await
            .expect("in time")
            .expect_err("the plugin's error fails RunPodSandbox");
        assert_eq!(err.plugin, "10-bad");
        assert_eq!(err.event, E::RUN_POD_SANDBOX);
        assert_eq!(err.code, ttrpc::Code::UNKNOWN);
        assert!(err.to_string().contains("10-bad"), "{err}");
        // The plugins after the failing one are not called.
        assert_eq!(
            h.drain(),
            [(
                "10-bad".into(),
                Seen::Event(E::RUN_POD_SANDBOX, "p1".into())
            )]
        );

        // StopPodSandbox: logged, the next plugin still called, the failing one kept.
        timeout(DEADLINE, h.registry.stop_pod_sandbox(&pod("p1")))
            .await
            .expect("in time");
        assert_eq!(
            h.drain(),
            [
                (
                    "10-bad".into(),
                    Seen::Event(E::STOP_POD_SANDBOX, "p1".into())
                ),
                (
                    "20-good".into(),
                    Seen::Event(E::STOP_POD_SANDBOX, "p1".into())
                ),
            ]
        );
        assert_eq!(h.registry.plugins(), ["10-bad", "20-good"]);
    }

    #[tokio::test]
    async fn a_hanging_plugin_is_dropped_after_the_request_timeout() {
        let mut h = harness(FixedSnapshot::default());
        use api::Event as E;
        let events = mask(&[E::RUN_POD_SANDBOX]);
        let hang = h.plugin("10", "hang", events, Answer::Hang).await;
        let _good = h.plugin("20", "good", events, Answer::Ok).await;
        h.drain();

        let started = Instant::now();
        // Unlike NRI (which goes on without it), the call fails naming the plugin, which is
        // dropped.
        let err = timeout(DEADLINE, h.registry.run_pod_sandbox(&pod("p1")))
            .await
            .expect("bounded by the request timeout, not wedged")
            .expect_err("the hung plugin fails the call");
        let took = started.elapsed();
        assert!(took >= REQUEST_TIMEOUT, "{took:?}");
        assert!(took < REQUEST_TIMEOUT * 3, "{took:?}");
        assert_eq!(err.plugin, "10-hang");
        assert_eq!(err.event, E::RUN_POD_SANDBOX);
        assert_eq!(err.code, ttrpc::Code::UNAVAILABLE);
        assert_eq!(h.registry.plugins(), ["20-good"]);
        wait_closed(&hang).await;
        assert_eq!(
            h.drain(),
            [(
                "10-hang".into(),
                Seen::Event(E::RUN_POD_SANDBOX, "p1".into())
            )]
        );

        // Later calls skip it.
        timeout(REQUEST_TIMEOUT, h.registry.run_pod_sandbox(&pod("p2")))
            .await
            .expect("quick without the hung plugin")
            .expect("RunPodSandbox");
        assert_eq!(
            h.drain(),
            [(
                "20-good".into(),
                Seen::Event(E::RUN_POD_SANDBOX, "p2".into())
            )]
        );
    }

    #[tokio::test]
    async fn a_plugin_whose_connection_closes_is_dropped() {
        let h = harness(FixedSnapshot::default());
        let _a = h.plugin("10", "a", 0, Answer::Ok).await;
        let b = h.plugin("20", "b", 0, Answer::Ok).await;
        b.mux.close();
        let mut active = h.registry.watch_plugins();
        timeout(DEADLINE, active.wait_for(|names| *names == ["10-a"]))
            .await
            .expect("dropped in time")
            .expect("registry alive");
        timeout(DEADLINE, h.registry.run_pod_sandbox(&pod("p1")))
            .await
            .expect("in time")
            .expect("RunPodSandbox without the closed plugin");
    }

    #[tokio::test]
    async fn synchronize_splits_a_snapshot_bigger_than_a_message_and_it_arrives_whole() {
        // 40 containers of 256 KiB annotations: about 10 MiB, three messages.
        let containers: Vec<api::Container> = (0..40)
            .map(|i| {
                let mut c = container(&format!("c{i}"), "p1");
                c.annotations.insert("big".into(), "x".repeat(256 << 10));
                c
            })
            .collect();
        let want: Vec<String> = containers.iter().map(|c| c.id.clone()).collect();
        let mut h = harness(FixedSnapshot {
            pods: vec![pod("p1"), pod("p2")],
            containers,
        });
        let _end = h.plugin("10", "big", 0, Answer::Ok).await;

        let mut pods = Vec::new();
        let mut got = Vec::new();
        let mut mores = Vec::new();
        for (_, seen) in h.drain() {
            if let Seen::Synced {
                pods: p,
                containers: c,
                more,
            } = seen
            {
                pods.extend(p);
                got.extend(c);
                mores.push(more);
            }
        }
        assert_eq!(pods, ["p1", "p2"]);
        assert_eq!(got, want);
        assert_eq!(mores, [true, true, false]);
    }

    #[test]
    fn sync_chunks_stay_under_the_budget_and_keep_order() {
        let pods: Vec<api::PodSandbox> = (0..30).map(|i| pod(&format!("pod-{i:03}"))).collect();
        let containers: Vec<api::Container> = (0..50)
            .map(|i| container(&format!("ctr-{i:03}"), "pod-000"))
            .collect();
        let budget = 300;
        let chunks = sync_chunks(pods.clone(), containers.clone(), budget).expect("chunks");
        assert!(chunks.len() > 3, "{}", chunks.len());
        for (i, chunk) in chunks.iter().enumerate() {
            let size = usize::try_from(chunk.compute_size()).unwrap();
            assert!(size <= budget, "chunk {i}: {size}");
            assert_eq!(chunk.more, i + 1 < chunks.len());
        }
        let all_pods: Vec<_> = chunks.iter().flat_map(|c| c.pods.clone()).collect();
        let all_ctrs: Vec<_> = chunks.iter().flat_map(|c| c.containers.clone()).collect();
        assert_eq!(all_pods, pods);
        assert_eq!(all_ctrs, containers);

        assert_eq!(sync_chunks(vec![], vec![], budget).expect("empty").len(), 1);
        let mut huge = pod("huge");
        huge.name = "x".repeat(budget);
        assert!(matches!(
            sync_chunks(vec![huge], vec![], budget),
            Err(HandshakeError::Oversized(_))
        ));
    }

    #[tokio::test]
    async fn the_socket_is_0600_in_a_0700_directory_and_a_stale_one_is_replaced() {
        let h = harness(FixedSnapshot::default());
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode(&h.path), 0o600);
        assert_eq!(mode(h.path.parent().unwrap()), 0o700);
        h.registry.stop().await;
        assert!(!h.path.exists(), "stop removes the socket");

        // A stale socket (bound, nobody listening) is replaced; a regular file is not.
        let stale = std::os::unix::net::UnixListener::bind(&h.path).expect("stale socket");
        drop(stale);
        let config = Config::new(&h.path, "remora", "0.1.0");
        let again = Registry::start(
            config.clone(),
            Arc::new(FixedSnapshot::default()),
            h.runtime.clone(),
            discard(),
        )
        .expect("replaces the stale socket");
        again.stop().await;
        std::fs::write(&h.path, b"not a socket").expect("file");
        match Registry::start(
            config,
            Arc::new(FixedSnapshot::default()),
            h.runtime.clone(),
            discard(),
        ) {
            Err(RegistryError::NotASocket(p)) => assert_eq!(p, h.path),
            Err(other) => panic!("wrong error {other}"),
            Ok(_) => panic!("started over a regular file"),
        }
        assert_eq!(std::fs::read(&h.path).expect("file kept"), b"not a socket");
    }

    #[tokio::test]
    async fn stop_sends_shutdown_and_closes_the_plugins() {
        let mut h = harness(FixedSnapshot::default());
        let end = h.plugin("10", "a", 0, Answer::Ok).await;
        h.drain();
        timeout(DEADLINE, h.registry.stop())
            .await
            .expect("stops in time");
        assert_eq!(h.drain(), [("10-a".into(), Seen::Shutdown)]);
        wait_closed(&end).await;
        assert!(h.registry.plugins().is_empty());
        assert!(!h.path.exists());
        assert!(
            UnixStream::connect(&h.path).await.is_err(),
            "no longer accepting"
        );
    }

    #[tokio::test]
    async fn an_old_plugin_gets_state_change_when_an_rpc_is_unimplemented() {
        let mut h = harness(FixedSnapshot::default());
        let _old = h
            .plugin(
                "10",
                "old",
                mask(&[api::Event::RUN_POD_SANDBOX]),
                Answer::Unimplemented,
            )
            .await;
        h.drain();
        timeout(DEADLINE, h.registry.run_pod_sandbox(&pod("p1")))
            .await
            .expect("in time")
            .expect("StateChange answered");
        assert_eq!(
            h.drain(),
            [
                (
                    "10-old".into(),
                    Seen::Event(api::Event::RUN_POD_SANDBOX, "p1".into())
                ),
                (
                    "10-old".into(),
                    Seen::StateChange(api::Event::RUN_POD_SANDBOX, "p1".into())
                ),
            ]
        );
    }

    #[tokio::test]
    async fn update_containers_from_a_plugin_reaches_the_runtime() {
        let h = harness(FixedSnapshot::default());
        let end = h.connect("10-up", 0, Answer::Ok).await;
        let mut req = api::UpdateContainersRequest::new();
        let mut update = api::ContainerUpdate::new();
        update.container_id = "c1".into();
        req.update.push(update);
        let mut evict = api::ContainerEviction::new();
        evict.container_id = "c2".into();
        req.evict.push(evict);
        let ctx = || ttrpc::context::with_timeout(5_000_000_000);
        // Not before registration.
        match end.runtime.update_containers(ctx(), &req).await {
            Err(ttrpc::Error::RpcStatus(s)) => {
                assert_eq!(s.code(), ttrpc::Code::FAILED_PRECONDITION);
            }
            other => panic!("accepted before registration: {other:?}"),
        }
        register(&end, "10", "up").await.expect("RegisterPlugin");
        let resp = end
            .runtime
            .update_containers(ctx(), &req)
            .await
            .expect("UpdateContainers");
        assert_eq!(resp.failed.len(), 1);
        assert_eq!(resp.failed[0].container_id, "c1");
        assert_eq!(
            *lock(&h.runtime.updates),
            [(vec!["c1".to_string()], vec!["c2".to_string()])]
        );
    }

    #[tokio::test]
    async fn configure_is_the_first_request_a_plugin_gets() {
        // Nothing reaches a plugin before Configure, not even Synchronize.
        let mut h = harness(FixedSnapshot::default());
        let _end = h.plugin("10", "a", 0, Answer::Ok).await;
        let (name, first) = h.next_seen().await;
        assert_eq!(name, "10-a");
        assert!(matches!(first, Seen::Configured { .. }), "{first:?}");
    }

    #[tokio::test]
    async fn a_registration_waits_for_sync_blocks_and_its_snapshot_has_what_they_created() {
        let objects = Arc::new(SharedSnapshot::default());
        lock(&objects.0).pods.push(pod("before"));
        let mut h = harness_with(objects.clone(), REQUEST_TIMEOUT);
        use api::Event as E;

        // A CRI mutation in flight: it holds the block while it creates a pod and runs its hook.
        let block = timeout(DEADLINE, h.registry.block_sync())
            .await
            .expect("no registration holds the write side");
        let end = h
            .connect("10-late", mask(&[E::RUN_POD_SANDBOX]), Answer::Ok)
            .await;
        register(&end, "10", "late").await.expect("RegisterPlugin");
        assert!(matches!(h.next_seen().await.1, Seen::Configured { .. }));
        lock(&objects.0).pods.push(pod("during"));
        // The hook of the pod being created does not see the plugin: it is not active yet.
        timeout(DEADLINE, h.registry.run_pod_sandbox(&pod("during")))
            .await
            .expect("in time")
            .expect("RunPodSandbox");
        // Nor is the plugin synchronized while the block is held (a bounded wait for nothing).
        let early = timeout(Duration::from_millis(200), h.seen.recv()).await;
        assert!(early.is_err(), "sent while blocked: {early:?}");
        drop(block);

        // Synchronize then has both pods, and the hook above was not sent: each pod reached
        // the plugin exactly once.
        assert_eq!(
            h.next_seen().await,
            (
                "10-late".into(),
                Seen::Synced {
                    pods: vec!["before".into(), "during".into()],
                    containers: vec![],
                    more: false
                }
            )
        );
        let mut active = h.registry.watch_plugins();
        timeout(DEADLINE, active.wait_for(|names| *names == ["10-late"]))
            .await
            .expect("active in time")
            .expect("registry alive");
        timeout(DEADLINE, h.registry.run_pod_sandbox(&pod("after")))
            .await
            .expect("in time")
            .expect("RunPodSandbox");
        assert_eq!(
            h.drain(),
            [(
                "10-late".into(),
                Seen::Event(E::RUN_POD_SANDBOX, "after".into())
            )]
        );
    }

    #[tokio::test]
    async fn a_plugin_hanging_in_synchronize_holds_sync_blocks_off_for_one_request_timeout() {
        let mut h = harness(FixedSnapshot::default());
        let end = h.connect("10-stuck", 0, Answer::HangInSync).await;
        register(&end, "10", "stuck").await.expect("RegisterPlugin");
        assert!(matches!(h.next_seen().await.1, Seen::Configured { .. }));
        assert!(matches!(h.next_seen().await.1, Seen::Synced { .. }));
        // Registration holds the write side now; a CRI mutation waits at most about a request
        // timeout for it.
        let started = Instant::now();
        let block = timeout(REQUEST_TIMEOUT * 3, h.registry.block_sync())
            .await
            .expect("the hung Synchronize gives the lock back");
        assert!(started.elapsed() <= REQUEST_TIMEOUT * 3);
        drop(block);
        wait_closed(&end).await;
        assert!(h.registry.plugins().is_empty());
    }

    /// The environment variable naming the file [`launched_plugin_child`] records to.
    const CHILD_RECORD_ENV: &str = "REMORA_NRI_TEST_RECORD";

    /// Not a test of its own: the test binary run as a launched plugin, by a script in a plugin
    /// directory ([`self_plugin`]). It serves a fake plugin on NRI's fd 3, registers under
    /// another name than its file's, records what it is sent in `$REMORA_NRI_TEST_RECORD` and
    /// runs until killed. Run by the test harness (no such variable), it passes at once.
    #[test]
    fn launched_plugin_child() {
        let Some(record) = std::env::var_os(CHILD_RECORD_ENV) else {
            return;
        };
        assert_eq!(std::env::var("NRI_PLUGIN_SOCKET").as_deref(), Ok("3"));
        let name = format!(
            "{}-{}",
            std::env::var("NRI_PLUGIN_IDX").expect("NRI_PLUGIN_IDX"),
            std::env::var("NRI_PLUGIN_NAME").expect("NRI_PLUGIN_NAME")
        );
        let file = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(record)
            .expect("the record file");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        rt.block_on(async {
            use std::os::fd::FromRawFd as _;
            // SAFETY: fd 3 is the socket the registry passed (NRI_PLUGIN_SOCKET says so) and
            // nothing else in this process owns it.
            let socket = unsafe { std::os::unix::net::UnixStream::from_raw_fd(3) };
            socket.set_nonblocking(true).expect("nonblocking");
            let stream = UnixStream::from_std(socket).expect("a tokio socket");
            let fake = FakePlugin {
                name,
                events: 0,
                answer: Answer::Ok,
                seen: Sink::File(Mutex::new(file)),
            };
            let end = serve_fake(stream, fake).await;
            // Not its file's name: the registry goes by the file.
            register(&end, "99", "impostor")
                .await
                .expect("RegisterPlugin");
            std::future::pending::<()>().await;
        });
    }

    /// A script `dir/name` that records its pid in `dir/<name>.pid` and runs this test binary
    /// as [`launched_plugin_child`], recording to `dir/<name>.record`.
    fn self_plugin(dir: &Path, name: &str) {
        let exe = std::env::current_exe().expect("the test binary");
        let script = format!(
            "#!/bin/sh\necho $$ > '{pid}'\n{CHILD_RECORD_ENV}='{record}' exec '{exe}' \
             --exact registry::tests::launched_plugin_child --quiet\n",
            pid = dir.join(format!("{name}.pid")).display(),
            record = dir.join(format!("{name}.record")).display(),
            exe = exe.display(),
        );
        script_plugin(dir, name, &script);
    }

    fn script_plugin(dir: &Path, name: &str, script: &str) {
        let path = dir.join(name);
        std::fs::write(&path, script).expect("write the script");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }

    fn read_pid(path: &Path) -> u32 {
        std::fs::read_to_string(path)
            .expect("the pid file")
            .trim()
            .parse()
            .expect("a pid")
    }

    /// Whether `pid` is gone: no process, not even a zombie waiting to be reaped.
    fn reaped(pid: u32) -> bool {
        !Path::new(&format!("/proc/{pid}")).exists()
    }

    fn launched(h: &Harness) -> Vec<Arc<launch::Process>> {
        lock(&h.registry.launched).clone()
    }

    #[tokio::test]
    async fn a_launched_plugin_registers_under_its_file_name_and_is_killed_and_reaped_on_stop() {
        let mut dir = PathBuf::new();
        let h = launching_harness(|d| {
            dir = d.to_path_buf();
            self_plugin(&d.join("plugins"), "10-self");
            // No 10-self.conf: the name's configuration is used.
            std::fs::write(d.join("conf.d").join("self.conf"), "the config").expect("conf");
        });
        let plugins = dir.join("plugins");
        let mut active = h.registry.watch_plugins();
        timeout(DEADLINE, active.wait_for(|names| *names == ["10-self"]))
            .await
            .expect("the launched plugin registers in time")
            .expect("registry alive");
        timeout(DEADLINE, h.registry.run_pod_sandbox(&pod("p1")))
            .await
            .expect("in time")
            .expect("RunPodSandbox");
        let pid = read_pid(&plugins.join("10-self.pid"));
        assert!(!reaped(pid), "running");

        timeout(DEADLINE, h.registry.stop())
            .await
            .expect("stops in time");
        // stop() returns once the plugin is reaped.
        assert!(reaped(pid), "pid {pid} killed and reaped by stop()");
        assert!(launched(&h).is_empty());
        let record = std::fs::read_to_string(plugins.join("10-self.record")).expect("record");
        let configured = Seen::Configured {
            runtime: "remora".into(),
            request_timeout: 2000,
            config: "the config".into(),
        };
        let synced = Seen::Synced {
            pods: vec![],
            containers: vec![],
            more: false,
        };
        let run = Seen::Event(api::Event::RUN_POD_SANDBOX, "p1".into());
        let want: Vec<String> = [configured, synced, run, Seen::Shutdown]
            .iter()
            .map(|seen| format!("10-self {seen:?}"))
            .collect();
        assert_eq!(record.lines().collect::<Vec<_>>(), want);
    }

    #[tokio::test]
    async fn a_launched_plugin_that_exits_at_once_is_reaped_and_the_registry_goes_on() {
        let mut dir = PathBuf::new();
        let h = launching_harness(|d| {
            dir = d.join("plugins");
            let pid = dir.join("10-quit.pid");
            script_plugin(
                &dir,
                "10-quit",
                &format!("#!/bin/sh\necho $$ > '{}'\nexit 3\n", pid.display()),
            );
        });
        let processes = launched(&h);
        assert_eq!(processes.len(), 1);
        let status = timeout(DEADLINE, processes[0].reaped())
            .await
            .expect("reaped in time")
            .expect("an exit status");
        assert_eq!(status.code(), Some(3));
        assert!(reaped(read_pid(&dir.join("10-quit.pid"))));
        // The registry is fine: an external plugin registers and is called.
        let _end = h.plugin("20", "external", 0, Answer::Ok).await;
        assert_eq!(h.registry.plugins(), ["20-external"]);
        timeout(DEADLINE, h.registry.run_pod_sandbox(&pod("p1")))
            .await
            .expect("in time")
            .expect("RunPodSandbox");
        timeout(DEADLINE, h.registry.stop())
            .await
            .expect("stops in time");
    }

    #[tokio::test]
    async fn a_launched_plugin_that_never_registers_is_killed_and_reaped_after_the_timeout() {
        let mut dir = PathBuf::new();
        let started = Instant::now();
        let h = launching_harness(|d| {
            dir = d.join("plugins");
            let pid = dir.join("10-mute.pid");
            script_plugin(
                &dir,
                "10-mute",
                &format!(
                    "#!/bin/sh\necho $$ > '{}'\nexec /bin/sleep 1000\n",
                    pid.display()
                ),
            );
        });
        let processes = launched(&h);
        assert_eq!(processes.len(), 1);
        let status = timeout(DEADLINE, processes[0].reaped())
            .await
            .expect("killed in time")
            .expect("an exit status");
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
        assert!(started.elapsed() >= REGISTRATION_TIMEOUT);
        assert!(reaped(read_pid(&dir.join("10-mute.pid"))));
        assert!(h.registry.plugins().is_empty());
    }

    /// What a launched script saw: its environment (less the shell's own PWD) and its file
    /// descriptors (number → target).
    fn what_it_saw(dir: &Path, name: &str) -> (Vec<String>, Vec<(String, String)>) {
        let env = std::fs::read_to_string(dir.join(format!("{name}.env"))).expect("env");
        let mut env: Vec<String> = env
            .lines()
            .filter(|l| !l.starts_with("PWD="))
            .map(String::from)
            .collect();
        env.sort();
        let fds = std::fs::read_to_string(dir.join(format!("{name}.fds"))).expect("fds");
        let mut fds: Vec<(String, String)> = fds
            .lines()
            .filter_map(|l| l.split_once(" -> "))
            .map(|(left, target)| {
                let fd = left.rsplit(' ').next().unwrap_or_default();
                (fd.to_string(), target.to_string())
            })
            .collect();
        fds.sort();
        (env, fds)
    }

    #[tokio::test]
    async fn launched_plugins_get_nris_environment_only_and_their_socket_as_fd_3_only() {
        let mut dir = PathBuf::new();
        let h = launching_harness(|d| {
            dir = d.join("plugins");
            for name in ["10-a", "20-b"] {
                let out = dir.join(name);
                script_plugin(
                    &dir,
                    name,
                    &format!(
                        // The shell's descriptors as they are: listed by a child that
                        // opens its output file itself (a redirection would be the shell's,
                        // and a pipeline's pipe is the shell's too while it sets it up).
                        "#!/bin/sh\n/usr/bin/env > '{out}.env'\n\
                         /usr/bin/find /proc/$$/fd/ -mindepth 1 -fprintf '{out}.fds' '%f -> %l\\n'\n\
                         exit 0\n",
                        out = out.display()
                    ),
                );
            }
        });
        let processes = launched(&h);
        assert_eq!(processes.len(), 2);
        for process in &processes {
            let status = timeout(DEADLINE, process.reaped())
                .await
                .expect("reaped in time")
                .expect("an exit status");
            assert!(status.success(), "{status}");
        }
        for (name, idx, base) in [("10-a", "10", "a"), ("20-b", "20", "b")] {
            let (env, fds) = what_it_saw(&dir, name);
            assert_eq!(
                env,
                [
                    format!("NRI_PLUGIN_IDX={idx}"),
                    format!("NRI_PLUGIN_NAME={base}"),
                    "NRI_PLUGIN_SOCKET=3".to_string(),
                ],
                "{name}"
            );
            let sockets: Vec<&str> = fds
                .iter()
                .filter(|(_, target)| target.starts_with("socket:"))
                .map(|(fd, _)| fd.as_str())
                .collect();
            // Its own end as fd 3; not remora's end, nor the other plugin's.
            assert_eq!(sockets, ["3"], "{name}: {fds:?}");
            for fd in ["0", "1", "2"] {
                assert!(
                    fds.contains(&(fd.to_string(), "/dev/null".to_string())),
                    "{name}: {fds:?}"
                );
            }
            // Nothing else of remora's, nor what the test process inherited: above fd 3 only
            // the shell's own descriptor of its script.
            let script = dir.join(name).display().to_string();
            for (fd, target) in &fds {
                assert!(
                    ["0", "1", "2", "3"].contains(&fd.as_str()) || *target == script,
                    "{name}: fd {fd} -> {target}: {fds:?}"
                );
            }
        }
        timeout(DEADLINE, h.registry.stop())
            .await
            .expect("stops in time");
    }
}
