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

//! # Files
//!
//! - this file: the [`Registry`], its public types, start and stop, the active list;
//! - `accept`: where connections come from, the socket (bind, accept loop) and the plugin
//!   directory (`launch`: scanning it and running its plugins);
//! - `handshake`: a connection's way to an active plugin: registration, Configure,
//!   Synchronize in chunks;
//! - `runtime_service`: the Runtime service a plugin calls (RegisterPlugin,
//!   UpdateContainers);
//! - `events`: one call per NRI event, from one table of the events' differences;
//! - `call`: one request to one plugin within a deadline, and how it failed.

use std::io;
use std::os::unix::fs::FileTypeExt as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use slog::{debug, info, o, warn, Logger};
use tokio::sync::{watch, OwnedRwLockReadGuard, OwnedSemaphorePermit, RwLock, Semaphore};
use ttrpc::asynchronous::Server;

use self::accept::{accept_loop, bind};
use self::call::context;
use crate::api;
use crate::mux::Mux;

mod accept;
mod call;
mod events;
mod handshake;
mod launch;
mod runtime_service;

#[cfg(test)]
mod tests;

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

    fn publish(&self, plugins: &[Arc<Plugin>]) {
        self.active
            .send_replace(plugins.iter().map(|p| p.name.clone()).collect());
    }

    fn is_active(&self, name: &str) -> bool {
        lock(&self.plugins).iter().any(|p| p.name == name)
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        // Ends the accept task and pending handshakes.
        self.shutdown.send_replace(true);
    }
}

/// Resolves once the registry is stopping (or gone). Returns nothing, unlike `wait_for`,
/// whose `Ref` result is not `Send` and would make a `select!` holding it not `Send`.
async fn stopping(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// Locks a std mutex held only in short sections that do not panic; a poisoned one is still
/// consistent (every section leaves it so), so its data is used.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
