//! The CRI socket server: socket ownership, serving, and clean shutdown.
//!
//! One remora per socket: a lock file `<socket>.lock` is held (flock) for the daemon's life.
//! Because the kernel drops the lock when its holder dies, a lock we can take means any socket
//! file left at the path is stale and may be replaced; a lock we cannot take means a live remora
//! serves there, and we refuse to start rather than steal its socket. The socket is created
//! mode 0660 and removed on clean shutdown (only if it is still the one we bound).

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::cri::v1::image_service_server::ImageServiceServer;
use crate::cri::v1::runtime_service_server::RuntimeServiceServer;
use nix::fcntl::{Flock, FlockArg};
use slog::{info, warn, Logger};
use thiserror::Error;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;

use crate::config::{
    CgroupDriver, Config, LayerApplier, PauseContainer, PullLayers, RuntimeConfig,
};
use crate::containerd::health::{HealthMonitor, ProbeSchedule};
use crate::containerd::Client;
use crate::cri::service::CriService;
use crate::cri::Subsystems;
use crate::events;
use crate::events::monitor::{ImageEvents, Resync, RuntimeEvents, Subscription};
use crate::events::queue::{OrderedQueue, QueueConfig};
use crate::host_network::HostNetwork;
use crate::images::apply::LocalDiffer;
use crate::images::backend::Differ;
use crate::images::pull::{Backend, PullConfig, Puller, TransferConfig};
use crate::images::registry::{RegistryClient, RegistryConfig};
use crate::images::resolver::ResolverConfig;
use crate::images::store::ImageIndex;
use crate::images::ImageRuntime;
use crate::lifecycle::backend::{RuncOptions, ShimRuntime};
use crate::lifecycle::handlers::HandlerFeatures;
use crate::lifecycle::host::host_facts;
use crate::lifecycle::{Backends, HandlerRuntime, Pods, PodsConfig, RuntimeHandlers};
use crate::metrics::{GaugeFamily, Metrics};
use crate::net::{PodNetwork, PodNetworkConfig};
use crate::notify::Notifier;
use crate::oci::features as oci_features;
use crate::stream::server::{StreamConfig, StreamServer, TlsFiles};

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
        /// The failed action's error.
        source: std::io::Error,
    },
    /// Installing a signal handler failed.
    #[error("cannot install {signal} handler: {source}")]
    Signal {
        /// The signal.
        signal: &'static str,
        /// The handler installation's error.
        source: std::io::Error,
    },
    /// The NRI socket could not be set up.
    #[error("cannot host NRI plugins: {0}")]
    Nri(#[source] remora_nri::registry::RegistryError),
    /// The registry client could not be set up (TLS backend).
    #[error("cannot set up the registry client: {0}")]
    Registry(#[source] Box<crate::images::registry::client::RegistryError>),
    /// The digest resolver's settings are unusable.
    #[error("invalid [images] resolver settings: {0}")]
    Resolver(#[from] crate::images::resolver::ConfigError),
    /// `[streaming] address` is not an address.
    #[error(transparent)]
    Streaming(crate::config::ConfigError),
    /// The streaming server cannot listen.
    #[error(transparent)]
    StreamingBind(#[from] crate::stream::server::StartError),
    /// `[metrics] address` is not an address.
    #[error(transparent)]
    Metrics(crate::config::ConfigError),
    /// The metrics endpoint cannot listen.
    #[error(transparent)]
    MetricsBind(#[from] crate::metrics::StartError),
    /// The gRPC server stopped with an error.
    #[error("CRI gRPC server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
    /// A state directory could not be made private (mode 0700).
    #[error("cannot {action} state directory {}: {source}", path.display())]
    StateDir {
        /// What was being done ("create", "stat", "chmod 0700").
        action: &'static str,
        /// The directory.
        path: PathBuf,
        /// The failed action's error.
        source: std::io::Error,
    },
    /// A configured state directory exists and is not a directory.
    #[error("state directory {} exists and is not a directory", .0.display())]
    StateDirNotDir(PathBuf),
}

/// Mode of remora's own state directories (`state_dir`, `root_dir`): root only, as
/// containerd's since CVE-2024-25621. They hold every pod's files (its 1777 `/dev/shm`), the
/// image volumes and temporary rootfs mounts, container FIFOs and the CNI cache; a local user
/// who could traverse them could reach all of that.
pub const PRIVATE_DIR_MODE: u32 = 0o700;

/// Creates `dir` (and missing parents) with mode 0700, or sets 0700 on it when it exists with
/// another mode (a remora before this fix, or an admin's `mkdir`, made it 0755). Returns the
/// mode it had when that was changed. A symlink is followed (an admin may point the state
/// elsewhere); what it points at must be a directory.
pub fn make_private_dir(dir: &Path) -> Result<Option<u32>, ServerError> {
    let err = |action: &'static str| {
        let path = dir.to_path_buf();
        move |source| ServerError::StateDir {
            action,
            path,
            source,
        }
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(PRIVATE_DIR_MODE)
        .create(dir)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => ServerError::StateDirNotDir(dir.to_path_buf()),
            _ => err("create")(e),
        })?;
    let meta = std::fs::metadata(dir).map_err(err("stat"))?;
    if !meta.is_dir() {
        return Err(ServerError::StateDirNotDir(dir.to_path_buf()));
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode == PRIVATE_DIR_MODE {
        return Ok(None);
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(PRIVATE_DIR_MODE))
        .map_err(err("chmod 0700"))?;
    Ok(Some(mode))
}

/// Largest CRI message accepted or sent, as kubelet's own client allows.
const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;
/// How long in-flight requests (and open event streams) get to finish after SIGTERM/SIGINT.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Owns the socket path for the daemon's life: holds the lock, removes the socket on drop.
pub struct SocketGuard {
    /// Held, never read: dropping it removes the socket.
    _placed: PlacedSocket,
    /// Held, never read: dropping it releases the lock.
    _lock: Flock<File>,
}

/// A socket remora bound; dropping it removes the socket if it is still ours.
pub struct PlacedSocket {
    socket: PathBuf,
    /// (device, inode, ctime) of the socket we bound, so drop removes only our own socket
    /// (inode numbers alone are reused at once by a socket bound after ours was removed).
    identity: (u64, u64, i64, i64),
}

impl Drop for PlacedSocket {
    fn drop(&mut self) {
        if let Ok(meta) = std::fs::symlink_metadata(&self.socket) {
            if identity(&meta) == self.identity {
                let _ = std::fs::remove_file(&self.socket);
            }
        }
    }
}

fn identity(meta: &std::fs::Metadata) -> (u64, u64, i64, i64) {
    (meta.dev(), meta.ino(), meta.ctime(), meta.ctime_nsec())
}

fn socket_err(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> ServerError {
    let path = path.to_path_buf();
    move |source| ServerError::Socket {
        action,
        path,
        source,
    }
}

/// Takes ownership of `socket`: locks it, replaces a stale socket file, binds, sets mode 0660.
pub fn bind_socket(socket: &Path) -> Result<(SocketGuard, tokio::net::UnixListener), ServerError> {
    if let Some(dir) = socket.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(dir)
            .map_err(socket_err("create directory", dir))?;
    }
    let mut lock_path = socket.as_os_str().to_owned();
    lock_path.push(".lock");
    let lock_path = PathBuf::from(lock_path);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&lock_path)
        .map_err(socket_err("open lock file", &lock_path))?;
    let mut lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => lock,
        Err((mut file, nix::errno::Errno::EWOULDBLOCK)) => {
            let mut pid = String::new();
            let _ = file.read_to_string(&mut pid);
            let pid = pid.trim();
            return Err(ServerError::AlreadyRunning {
                socket: socket.to_path_buf(),
                pid: if pid.is_empty() {
                    "unknown".into()
                } else {
                    pid.to_string()
                },
            });
        }
        Err((_, errno)) => {
            return Err(ServerError::Socket {
                action: "lock",
                path: lock_path,
                source: errno.into(),
            })
        }
    };
    lock.set_len(0)
        .map_err(socket_err("write lock file", &lock_path))?;
    lock.rewind()
        .map_err(socket_err("write lock file", &lock_path))?;
    writeln!(&mut *lock, "{}", std::process::id())
        .map_err(socket_err("write lock file", &lock_path))?;

    // We hold the lock, so whatever is at the socket path was left by a dead process.
    let (placed, listener) = place_socket(socket, 0o660)?;
    Ok((
        SocketGuard {
            _placed: placed,
            _lock: lock,
        },
        listener,
    ))
}

/// Binds a unix socket at `socket` with `mode`, replacing what is there (the caller holds the
/// CRI socket's lock, so that was left by a dead remora).
pub fn place_socket(
    socket: &Path,
    mode: u32,
) -> Result<(PlacedSocket, tokio::net::UnixListener), ServerError> {
    match std::fs::remove_file(socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(socket_err("remove stale socket", socket)(e)),
    }
    // Bound under a temporary name and renamed into place once it has its mode, so the socket
    // is never reachable with the umask's mode in between.
    let mut tmp = socket.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let std_listener =
        std::os::unix::net::UnixListener::bind(&tmp).map_err(socket_err("bind", &tmp))?;
    let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))
        .map_err(socket_err("set the mode of", &tmp))
        .and_then(|()| {
            std::fs::rename(&tmp, socket).map_err(socket_err("rename into place", socket))
        });
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    let meta = std::fs::symlink_metadata(socket).map_err(socket_err("stat", socket))?;
    std_listener
        .set_nonblocking(true)
        .map_err(socket_err("set non-blocking", socket))?;
    let listener = tokio::net::UnixListener::from_std(std_listener)
        .map_err(socket_err("listen on", socket))?;
    Ok((
        PlacedSocket {
            socket: socket.to_path_buf(),
            identity: identity(&meta),
        },
        listener,
    ))
}

/// Builds the image side: registry client, puller (with its resolver and coalescers) and the
/// index, over containerd's services.
fn image_runtime(
    config: &Config,
    client: &Client,
    metrics: &Metrics,
    log: &Logger,
) -> Result<ImageRuntime, ServerError> {
    let img = &config.images;
    let shared = Arc::new(client.clone());
    let differ: Arc<dyn Differ> = match img.layer_applier {
        LayerApplier::Containerd => shared.clone(),
        LayerApplier::Remora => Arc::new(LocalDiffer::new(shared.clone())),
    };
    let backend = Backend {
        content: shared.clone(),
        images: shared.clone(),
        leases: shared.clone(),
        snapshots: shared.clone(),
        differ,
        transfer: shared,
    };
    let registry = Arc::new(
        RegistryClient::new(RegistryConfig {
            config_path: Some(img.config_path.clone()),
            // Count progress in windows of a twelfth of the stall period (5 s for 1 min).
            stall_window: (img.stall_timeout / 12).max(std::time::Duration::from_millis(100)),
            stall_min_bytes: img.stall_min_bytes,
            stall_timeout: img.stall_timeout,
            ..RegistryConfig::default()
        })
        .map_err(|e| ServerError::Registry(Box::new(e)))?,
    );
    let index = Arc::new(ImageIndex::new());
    let puller = Puller::new(
        PullConfig {
            snapshotter: img.snapshotter.clone(),
            os: std::env::consts::OS.to_string(),
            architecture: std::env::consts::ARCH.to_string(),
            max_concurrent_downloads: img.max_concurrent_downloads,
            max_concurrent_downloads_per_host: img.max_concurrent_downloads_per_host,
            transfer: (img.pull_layers == PullLayers::Transfer).then(|| TransferConfig {
                host_dir: img.config_path.clone(),
                stall_min_bytes: img.stall_min_bytes,
                stall_timeout: img.stall_timeout,
            }),
        },
        backend.clone(),
        registry,
        index.clone(),
        ResolverConfig {
            workers: img.resolver_workers,
            workers_per_host: img.resolver_workers_per_host,
            rate_per_sec: f64::from(img.resolver_rate),
            burst: img.resolver_rate,
            ttl: img.digest_cache_ttl,
            resolve_timeout: img.resolve_timeout,
            ..ResolverConfig::default()
        },
        metrics.clone(),
        log.new(slog::o!("component" => "images")),
    )?;
    Ok(ImageRuntime {
        index,
        puller,
        backend,
    })
}

/// What each configured handler's OCI runtime supports, asked of each distinct runtime binary
/// once (`<binary> features`, `oci_features`). A runtime that cannot answer supports no
/// optional feature; that is logged once here, at start-up.
pub async fn probe_handler_features(
    config: &RuntimeConfig,
    log: &Logger,
) -> BTreeMap<String, HandlerFeatures> {
    let kernel = oci_features::kernel_version();
    let mut by_binary: BTreeMap<&str, HandlerFeatures> = BTreeMap::new();
    for h in config.handlers.values() {
        let binary = oci_features::runtime_binary(h.binary_name.as_deref());
        if by_binary.contains_key(binary) {
            continue;
        }
        let features = match oci_features::probe(binary, kernel).await {
            Ok(f) => f,
            Err(e) => {
                info!(log, "OCI runtime does not report its features; its handlers claim none"; "runtime" => binary, "error" => %e);
                HandlerFeatures::default()
            }
        };
        by_binary.insert(binary, features);
    }
    config
        .handlers
        .iter()
        .map(|(name, h)| {
            let binary = oci_features::runtime_binary(h.binary_name.as_deref());
            (
                name.clone(),
                by_binary.get(binary).copied().unwrap_or_default(),
            )
        })
        .collect()
}

/// The configured runtime handlers as lifecycle uses them, with their `features`
/// ([`probe_handler_features`]; a handler missing there supports nothing optional). A handler
/// gets shim options (`containerd.runc.v1.Options`) only when it sets something: a binary, a
/// root, or systemd cgroups; otherwise none are sent and the shim keeps its defaults, as
/// before handlers.
pub fn runtime_handlers(
    config: &RuntimeConfig,
    features: &BTreeMap<String, HandlerFeatures>,
) -> RuntimeHandlers {
    let systemd = config.cgroup_driver == CgroupDriver::Systemd;
    let by_name = config
        .handlers
        .iter()
        .map(|(name, h)| {
            let options =
                (h.binary_name.is_some() || h.root.is_some() || systemd).then(|| RuncOptions {
                    binary_name: h.binary_name.clone().unwrap_or_default(),
                    root: h
                        .root
                        .as_ref()
                        .map(|p| p.display().to_string())
                        .unwrap_or_default(),
                    systemd_cgroup: systemd,
                    ..RuncOptions::default()
                });
            let runtime = HandlerRuntime {
                runtime: ShimRuntime {
                    name: h.runtime_type.clone(),
                    options,
                },
                runtime_path: h
                    .runtime_path
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
                features: features.get(name).copied().unwrap_or_default(),
                pass_through: crate::spec::PassThrough {
                    pod: h.pod_annotations.clone(),
                    container: h.container_annotations.clone(),
                },
                // Only remora's shim can hold a pod without a process (its holder task).
                pause_always: h.pause_container.unwrap_or(config.pause_container)
                    == PauseContainer::Always
                    || h.runtime_type != crate::config::REMORA_RUNTIME_TYPE,
            };
            (name.clone(), runtime)
        })
        .collect();
    RuntimeHandlers::new(&config.default_handler, by_name)
}

/// Builds the pod side: network namespaces, CNI, host facts, over containerd's containers and
/// tasks.
fn pods(
    config: &Config,
    client: &Client,
    images: &Arc<ImageRuntime>,
    features: &BTreeMap<String, HandlerFeatures>,
    log: &Logger,
) -> Pods {
    let cni = PodNetwork::new(PodNetworkConfig {
        conf_dir: config.cni.conf_dir.clone(),
        bin_dirs: config.cni.bin_dirs.clone(),
        cache_dir: config.server.root_dir.join("cni-cache"),
        plugin_timeout: config.cni.plugin_timeout,
    });
    let netns_dir = config.server.state_dir.join("netns");
    let shared = Arc::new(client.clone());
    let host = host_facts(match config.runtime.cgroup_driver {
        CgroupDriver::Cgroupfs => crate::spec::CgroupDriver::Cgroupfs,
        CgroupDriver::Systemd => crate::spec::CgroupDriver::Systemd,
    });
    Pods::new(
        PodsConfig {
            state_dir: config.server.state_dir.clone(),
            sandbox_image: config.images.sandbox_image.clone(),
            snapshotter: config.images.snapshotter.clone(),
            handlers: runtime_handlers(&config.runtime, features),
            cdi: Arc::new(crate::cdi::Registry::new(
                config.cdi.enabled,
                config.cdi.spec_dirs.clone(),
                log.new(slog::o!("component" => "cdi")),
            )),
        },
        Backends {
            containers: shared.clone(),
            tasks: shared,
            snapshots: images.backend.snapshots.clone(),
            leases: images.backend.leases.clone(),
            images: images.clone(),
            network: Arc::new(HostNetwork::new(cni, netns_dir)),
            oci: Arc::new(crate::oci::cli::OciCli::new(&config.containerd.namespace)),
            apparmor: Arc::new(crate::lifecycle::apparmor::AppArmor::host(
                &config.server.state_dir,
                log.new(slog::o!("component" => "apparmor")),
            )),
            stats: Arc::new(crate::lifecycle::stats_sampler::HostSource::new(
                host.cgroup_driver,
            )),
        },
        host,
        log.new(slog::o!("component" => "pods")),
    )
}

/// Subscribes to containerd's `/images/` events (the start of the event monitor): the image
/// index follows records created or deleted by any client, and is rebuilt after each gap.
fn spawn_event_monitor(
    subscription: Subscription,
    client: &Client,
    pods: &Arc<Pods>,
    stop: watch::Receiver<bool>,
    log: &Logger,
    ready: tokio::sync::oneshot::Sender<()>,
    handler: Arc<ImageEvents>,
) -> tokio::task::JoinHandle<()> {
    let metrics = &subscription.metrics;
    let log = log.new(slog::o!("component" => "events"));
    let hook_log = log.clone();
    let dispatcher = Arc::new(RuntimeEvents {
        images: handler.clone(),
        pods: pods.clone(),
        log: log.clone(),
    });
    let retries = metrics.clone();
    let handled = metrics.clone();
    let queue = OrderedQueue::new(dispatcher, QueueConfig::default())
        .with_failure_hook(Arc::new(
            move |id: &str, attempt: u32, err: &str, delay: std::time::Duration| {
                retries.event_retry();
                warn!(hook_log, "event handling failed; retrying"; "subject" => id, "attempt" => attempt, "error" => err, "retry_in_ms" => delay.as_millis() as u64);
            },
        ))
        .with_handled_hook(Arc::new(move |event: &crate::containerd::event_stream::Event| {
            handled.event_handled(event.topic());
        }));
    let weak = queue.downgrade();
    metrics.add_gauges(move || {
        let Some(queue) = weak.upgrade() else {
            return Vec::new();
        };
        let stats = queue.stats();
        vec![
            GaugeFamily::single(
                "events_pending",
                "Events waiting in the ordered event queue (being handled or retried included)",
                None,
                stats.pending as f64,
            ),
            GaugeFamily::single(
                "event_ids_in_backoff",
                "IDs whose oldest event failed and waits for its retry",
                None,
                stats.ids_in_backoff as f64,
            ),
            GaugeFamily::single(
                "event_oldest_pending_age",
                "How long the oldest pending event has waited (0 when none waits)",
                Some(prometheus_client::registry::Unit::Seconds),
                stats.oldest_pending.map_or(0.0, |d| d.as_secs_f64()),
            ),
        ]
    });
    pods.set_exit_queue(Arc::new(queue.clone()));
    let resync_log = log.clone();
    let resync_queue = queue.clone();
    let resync_pods = pods.clone();
    let resync: Resync = Arc::new(move || {
        let handler = handler.clone();
        let queue = resync_queue.clone();
        let log = resync_log.clone();
        let pods = resync_pods.clone();
        Box::pin(async move {
            let started = std::time::Instant::now();
            // What a crash left half made goes first, so recovery does not index it.
            pods.sweep_half_made().await;
            // Pods and containers next: their exits missed during a gap are recorded here.
            // A failed pass leaves pods unknown to kubelet: retry a few times with backoff
            // before giving up until the next reconnect.
            let mut delay = remora_host::backoff::Backoff::new(
                std::time::Duration::from_millis(500),
                std::time::Duration::from_secs(8),
            );
            for attempt in 1..=RECOVERY_ATTEMPTS {
                match pods.recover().await {
                    Ok(_) => break,
                    Err(e) if attempt < RECOVERY_ATTEMPTS => {
                        warn!(log, "pod recovery failed; retrying"; "attempt" => attempt, "error" => %e);
                        tokio::time::sleep(delay.next_delay()).await;
                    }
                    Err(e) => {
                        warn!(log, "pod recovery failed; it is retried when the event stream reconnects"; "attempts" => attempt, "error" => %e);
                    }
                }
            }
            if let Err(e) = handler.resync(&queue).await {
                warn!(log, "image resync failed; it is retried when the event stream reconnects"; "error" => %e);
            }
            info!(log, "resync complete"; "took_ms" => started.elapsed().as_millis() as u64);
        })
    });
    tokio::spawn(events::monitor::run(
        Arc::new(client.clone()),
        subscription,
        queue,
        resync,
        stop,
        log,
        Some(ready),
    ))
}

/// The streaming server's view of the pods.
struct PodStreams(Arc<Pods>);

#[async_trait::async_trait]
impl crate::stream::server::StreamBackend for PodStreams {
    async fn exec(
        &self,
        container_id: &str,
        cmd: Vec<String>,
        tty: bool,
        io: crate::io::SessionIo,
    ) -> Result<i32, String> {
        self.0
            .exec_stream(container_id, cmd, tty, io)
            .await
            .map_err(|e| e.to_string())
    }

    async fn attach(&self, container_id: &str, io: crate::io::SessionIo) -> Result<(), String> {
        self.0
            .attach(container_id, io)
            .await
            .map_err(|e| e.to_string())
    }

    async fn port_forward(&self, pod_id: &str, port: u16) -> Result<tokio::net::TcpStream, String> {
        self.0
            .port_forward(pod_id, port)
            .await
            .map_err(|e| e.to_string())
    }
}

/// Recovery passes tried per resync before waiting for the next reconnect.
const RECOVERY_ATTEMPTS: u32 = 5;

/// How long start-up waits for the first recovery pass before serving anyway.
const INITIAL_RECOVERY_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Sends `state` to systemd when remora runs under it; a failure is logged here and ignored
/// (remora serves the same either way).
fn notify_service_manager(notifier: Option<&Notifier>, state: &str, log: &Logger) {
    if let Some(notifier) = notifier {
        if let Err(e) = notifier.notify(state) {
            warn!(log, "cannot notify the service manager"; "error" => %e);
        }
    }
}

/// Runs the daemon until SIGTERM or SIGINT.
pub async fn run(config: Config, log: Logger) -> Result<(), ServerError> {
    let (mut sigterm, mut sigint) = shutdown_signals()?;

    // systemd (Type=notify) learns when remora serves; without $NOTIFY_SOCKET this is None.
    let notifier = Notifier::from_env().unwrap_or_else(|e| {
        warn!(log, "cannot notify the service manager; it will not see remora ready"; "error" => %e);
        None
    });

    // Before the socket (which lives in state_dir by default) and before anything is made in
    // them.
    make_state_dirs_private(&config, &log)?;
    let (guard, listener) = bind_socket(&config.server.socket)?;
    let cd = &config.containerd;
    let client = Client::new(&cd.address, &cd.namespace, cd.probe_timeout);
    let health = health_monitor(&config, &client, &log);
    let (stop_tx, stop_rx) = watch::channel(false);
    let monitor = tokio::spawn(health.clone().run(stop_rx.clone()));

    let metrics = Metrics::new();
    // Bound before anything starts, so a taken address fails the start at once.
    let metrics_listener = match config.metrics.socket_addr().map_err(ServerError::Metrics)? {
        Some(address) => Some(crate::metrics::bind(address).await?),
        None => None,
    };
    let images = Arc::new(image_runtime(&config, &client, &metrics, &log)?);
    let features = probe_handler_features(&config.runtime, &log).await;
    let pods = Arc::new(pods(&config, &client, &images, &features, &log));
    let weak_pods = Arc::downgrade(&pods);
    metrics.add_gauges(move || {
        weak_pods
            .upgrade()
            .map(|pods| pods.state_gauges())
            .unwrap_or_default()
    });
    pods.stats_sampler().set_observer(Box::new(metrics.clone()));
    pods.set_reachability(Box::new(health.reachability()));
    // In the background: a create that needs the profile meanwhile waits for this load.
    tokio::spawn({
        let pods = pods.clone();
        async move { pods.load_default_apparmor().await }
    });
    let image_events = image_events(&images);
    // The image index first, before any event is dispatched (kubelet creates containers from
    // images it believes present); a containerd that is not up yet is resynced later.
    if let Err(e) = image_events.load_all().await {
        warn!(log, "cannot load the image index yet; it is resynced when containerd answers"; "error" => %e);
    }
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let events = spawn_event_monitor(
        subscription(&config, &pods, &metrics),
        &client,
        &pods,
        stop_rx.clone(),
        &log,
        ready_tx,
        image_events,
    );
    await_initial_recovery(ready_rx, &log).await;
    // After the first recovery, so a plugin's Synchronize sees the pods it rebuilt; before
    // CRI is served, so no pod or container is made without its hooks.
    let nri = start_nri(&config, &pods, &log)?;

    let (streaming, stream_listener) = StreamServer::bind(
        streaming_config(&config)?,
        Arc::new(PodStreams(pods.clone())),
        metrics.clone(),
        log.new(slog::o!("component" => "streaming")),
    )
    .await
    .map_err(ServerError::StreamingBind)?;
    let stream_server = tokio::spawn(streaming.clone().serve(stream_listener, stop_rx.clone()));
    // The status socket (`remora pulls`) and the pull progress log.
    let (status_socket, status_listener) =
        place_socket(&crate::status::socket_path(&config.server.socket), 0o600)?;
    let progress = images.puller.progress().clone();
    tokio::spawn(crate::images::progress::log_loop(
        progress.clone(),
        stop_rx.clone(),
        log.new(slog::o!("component" => "pulls")),
    ));
    let status_server = tokio::spawn(crate::status::serve(
        progress,
        status_listener,
        stop_rx.clone(),
        log.new(slog::o!("component" => "status")),
    ));
    let metrics_server = metrics_listener.map(|listener| {
        tokio::spawn(crate::metrics::serve(
            metrics.clone(),
            listener,
            stop_rx.clone(),
            log.new(slog::o!("component" => "metrics")),
        ))
    });

    let rt = Subsystems {
        config: Arc::new(config.clone()),
        health,
        images,
        pods,
        streaming,
        log: log.clone(),
        metrics,
    };
    let deadlines = crate::cri::deadline::DeadlineLayer::new(
        log.new(slog::o!("component" => "cri")),
        rt.metrics.clone(),
    );
    let mut server = spawn_cri_server(CriService::new(rt), deadlines, listener, stop_rx);
    info!(log, "serving CRI v1";
        "remora_version" => env!("CARGO_PKG_VERSION"),
        "socket" => %config.server.socket.display(),
        "containerd" => %config.containerd.address.display(),
        "namespace" => &config.containerd.namespace);
    // After the first recovery (or its bounded wait) and with the server up: a unit ordered
    // after remora.service starts only once remora answers with its index rebuilt.
    notify_service_manager(notifier.as_ref(), "READY=1", &log);

    let signal_name = tokio::select! {
        result = &mut server => {
            // The server stopped on its own: that is a failure (or a panic in it).
            let _ = stop_tx.send(true);
            if let Some(nri) = &nri {
                nri.stop().await;
            }
            let _ = monitor.await;
            let _ = events.await;
            drop(guard);
            return match result {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(ServerError::Serve(e)),
                Err(join) => Err(ServerError::Socket {
                    action: "serve",
                    path: config.server.socket.clone(),
                    source: std::io::Error::other(join.to_string()),
                }),
            };
        }
        _ = sigterm.recv() => "SIGTERM",
        _ = sigint.recv() => "SIGINT",
    };
    info!(log, "shutting down"; "signal" => signal_name);
    notify_service_manager(notifier.as_ref(), "STOPPING=1", &log);
    let _ = stop_tx.send(true);
    match tokio::time::timeout(SHUTDOWN_GRACE, &mut server).await {
        Ok(_) => {}
        Err(_) => {
            warn!(log, "requests still open after the shutdown grace period; closing them"; "grace_s" => SHUTDOWN_GRACE.as_secs());
            server.abort();
        }
    }
    // Plugins told to shut down once no CRI call can reach them.
    if let Some(nri) = &nri {
        nri.stop().await;
    }
    let _ = monitor.await;
    let _ = events.await;
    let _ = stream_server.await;
    let _ = status_server.await;
    if let Some(server) = metrics_server {
        let _ = server.await;
    }
    release_netns_dir(&config, &log);
    drop(status_socket);
    drop(guard);
    info!(log, "stopped");
    Ok(())
}

/// Starts hosting NRI plugins (`[nri]`) and hooks them into `pods`; `None` when NRI is off.
fn start_nri(
    config: &Config,
    pods: &Arc<Pods>,
    log: &Logger,
) -> Result<Option<Arc<remora_nri::registry::Registry>>, ServerError> {
    let log = log.new(slog::o!("component" => "nri"));
    if !config.nri.enable {
        info!(
            log,
            "NRI is off ([nri] enable = false): no plugins are hosted"
        );
        return Ok(None);
    }
    let view = Arc::new(crate::nri::PodsView::new(pods, log.clone()));
    let mut nri = remora_nri::registry::Config::new(
        &config.nri.socket_path,
        "remora",
        env!("CARGO_PKG_VERSION"),
    );
    nri.registration_timeout = config.nri.registration_timeout;
    nri.request_timeout = config.nri.request_timeout;
    let dir = |p: &std::path::Path| (!p.as_os_str().is_empty()).then(|| p.to_path_buf());
    nri.plugin_path = dir(&config.nri.plugin_path);
    nri.plugin_config_path = dir(&config.nri.plugin_config_path);
    let registry =
        remora_nri::registry::Registry::start(nri, view.clone(), view.clone(), log.clone())
            .map_err(ServerError::Nri)?;
    pods.set_nri(Arc::new(crate::nri::Nri::new(registry.clone(), view, log)));
    Ok(Some(registry))
}

/// The image index's handler of containerd's image events, for this host's platform.
fn image_events(images: &ImageRuntime) -> Arc<ImageEvents> {
    Arc::new(ImageEvents {
        images: images.backend.images.clone(),
        content: images.backend.content.clone(),
        index: images.index.clone(),
        os: std::env::consts::OS.to_string(),
        architecture: std::env::consts::ARCH.to_string(),
    })
}

/// The event topics remora follows (image changes, OOMs and exits), in its namespace.
fn subscription(config: &Config, pods: &Pods, metrics: &Metrics) -> Subscription {
    let cd = &config.containerd;
    Subscription {
        topics: vec!["/images/", "/tasks/oom", "/tasks/exit"],
        namespace: cd.namespace.clone(),
        backoff_min: cd.reconnect_backoff_min,
        backoff_max: cd.reconnect_backoff_max,
        reachability: pods.reachability(),
        metrics: metrics.clone(),
    }
}

/// SIGTERM and SIGINT, either of which stops the daemon.
fn shutdown_signals() -> Result<(Signal, Signal), ServerError> {
    let sigterm = signal(SignalKind::terminate()).map_err(|source| ServerError::Signal {
        signal: "SIGTERM",
        source,
    })?;
    let sigint = signal(SignalKind::interrupt()).map_err(|source| ServerError::Signal {
        signal: "SIGINT",
        source,
    })?;
    Ok((sigterm, sigint))
}

/// Makes the state and root dirs (mode 0700), fixing a wider mode with a warning.
fn make_state_dirs_private(config: &Config, log: &Logger) -> Result<(), ServerError> {
    for dir in [&config.server.state_dir, &config.server.root_dir] {
        if let Some(was) = make_private_dir(dir)? {
            warn!(log, "state directory was reachable by other users; set its mode to 0700"; "path" => %dir.display(), "was" => format!("{was:o}"));
        }
    }
    Ok(())
}

/// The monitor of containerd's reachability, probing on the configured schedule.
fn health_monitor(config: &Config, client: &Client, log: &Logger) -> Arc<HealthMonitor> {
    let cd = &config.containerd;
    Arc::new(HealthMonitor::new(
        Arc::new(client.clone()),
        ProbeSchedule {
            timeout: cd.probe_timeout,
            interval: cd.probe_interval,
            down_interval: cd.down_probe_interval,
        },
        log.new(slog::o!("component" => "containerd-health")),
    ))
}

/// Answer nothing before the index is rebuilt from containerd (callers wait in the socket's
/// backlog): a kubelet asking right after a restart must not hear NotFound for pods that
/// exist. Bounded, in case recovery hangs on a containerd that stopped answering.
async fn await_initial_recovery(ready: tokio::sync::oneshot::Receiver<()>, log: &Logger) {
    if tokio::time::timeout(INITIAL_RECOVERY_WAIT, ready)
        .await
        .is_err()
    {
        warn!(log, "initial recovery is taking long; serving meanwhile"; "waited_s" => INITIAL_RECOVERY_WAIT.as_secs());
    }
}

/// The streaming server's settings from the configuration.
fn streaming_config(config: &Config) -> Result<StreamConfig, ServerError> {
    Ok(StreamConfig {
        address: config
            .streaming
            .socket_addr()
            .map_err(ServerError::Streaming)?,
        token_ttl: config.streaming.token_ttl,
        stream_creation_timeout: config.streaming.stream_creation_timeout,
        header_read_timeout: config.streaming.header_read_timeout,
        max_connections: config.streaming.max_connections,
        idle_timeout: config.streaming.idle_timeout,
        tls: (!config.streaming.tls_cert_file.is_empty()).then(|| TlsFiles {
            cert: config.streaming.tls_cert_file.clone().into(),
            key: config.streaming.tls_key_file.clone().into(),
        }),
    })
}

/// Serves CRI's runtime and image services on `listener` until `stop` turns true.
fn spawn_cri_server(
    service: CriService,
    deadlines: crate::cri::deadline::DeadlineLayer,
    listener: tokio::net::UnixListener,
    mut stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<Result<(), tonic::transport::Error>> {
    tokio::spawn(
        tonic::transport::Server::builder()
            .layer(deadlines)
            .add_service(
                RuntimeServiceServer::new(service.clone())
                    .max_decoding_message_size(MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(MAX_MESSAGE_BYTES),
            )
            .add_service(
                ImageServiceServer::new(service)
                    .max_decoding_message_size(MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(MAX_MESSAGE_BYTES),
            )
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                let _ = stop.wait_for(|stop| *stop).await;
            }),
    )
}

/// Unmounts the network namespace directory's self-bind mount at a clean shutdown, unless
/// pods kept running hold namespaces in it ([`crate::net::netns::release_dir`]).
fn release_netns_dir(config: &Config, log: &Logger) {
    let netns_dir = config.server.state_dir.join("netns");
    match crate::net::netns::release_dir(&netns_dir) {
        Ok(true) => info!(log, "netns directory unmounted"; "path" => %netns_dir.display()),
        Ok(false) => {}
        Err(e) => warn!(log, "cannot unmount the netns directory"; "error" => %e),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn state_dirs_are_made_private_and_a_wider_mode_is_fixed() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let mode =
            |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        // Made anew, parents included.
        let fresh = tmp.path().join("a/b/state");
        assert_eq!(super::make_private_dir(&fresh).unwrap(), None);
        assert_eq!(mode(&fresh), 0o700);
        // Left 0755 by an older remora: fixed, and the old mode reported.
        let old = tmp.path().join("old");
        std::fs::create_dir(&old).unwrap();
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(super::make_private_dir(&old).unwrap(), Some(0o755));
        assert_eq!(mode(&old), 0o700);
        assert_eq!(super::make_private_dir(&old).unwrap(), None);
        // A file where the directory should be is refused, naming it.
        let file = tmp.path().join("file");
        std::fs::write(&file, b"").unwrap();
        let e = super::make_private_dir(&file).unwrap_err();
        assert!(
            matches!(&e, super::ServerError::StateDirNotDir(p) if p == &file),
            "{e}"
        );
    }

    #[test]
    fn handlers_get_options_only_when_they_set_something() {
        use crate::config::{CgroupDriver, RuntimeConfig, RuntimeHandler};
        let mut config = RuntimeConfig::default();
        config.handlers.insert(
            "rooted".into(),
            RuntimeHandler {
                root: Some("/run/rooted".into()),
                runtime_path: Some("/opt/bin/containerd-shim-remora-v2".into()),
                ..RuntimeHandler::of_type("io.containerd.remora.v2")
            },
        );
        let h = super::runtime_handlers(&config, &BTreeMap::new());
        // Pods without a pause container only where remora's shim can hold them.
        assert!(!h.resolve("remora").unwrap().1.pause_always);
        assert!(h.resolve("runc").unwrap().1.pause_always, "the Go shim");
        let mut always = config.clone();
        always.pause_container = crate::config::PauseContainer::Always;
        let h2 = super::runtime_handlers(&always, &BTreeMap::new());
        assert!(h2.resolve("remora").unwrap().1.pause_always);
        let mut own = always.clone();
        if let Some(r) = own.handlers.get_mut("remora") {
            r.pause_container = Some(crate::config::PauseContainer::WhenNeeded);
        }
        let h3 = super::runtime_handlers(&own, &BTreeMap::new());
        assert!(
            !h3.resolve("remora").unwrap().1.pause_always,
            "the handler's own key"
        );
        let h = super::runtime_handlers(&config, &BTreeMap::new());
        assert_eq!(h.default_name(), "remora");
        assert_eq!(h.resolve("").unwrap().0, "remora");
        let (_, runc) = h.resolve("runc").unwrap();
        assert_eq!(runc.runtime.name, "io.containerd.runc.v2");
        assert_eq!(runc.runtime.options, None);
        assert_eq!(runc.runtime_path, "");
        let (_, crun) = h.resolve("crun").unwrap();
        assert_eq!(crun.runtime.name, "io.containerd.remora.v2");
        let crun_opts = crun.runtime.options.clone().unwrap();
        assert_eq!(
            (crun_opts.binary_name.as_str(), crun_opts.root.as_str()),
            ("crun", "")
        );
        assert!(!crun_opts.systemd_cgroup);
        let (_, rooted) = h.resolve("rooted").unwrap();
        let opts = rooted.runtime.options.clone().unwrap();
        assert_eq!(
            (opts.binary_name.as_str(), opts.root.as_str()),
            ("", "/run/rooted")
        );
        assert_eq!(rooted.runtime_path, "/opt/bin/containerd-shim-remora-v2");

        // systemd cgroups reach every handler's shim, the plain runc one included.
        config.cgroup_driver = CgroupDriver::Systemd;
        let h = super::runtime_handlers(&config, &BTreeMap::new());
        for name in ["runc", "remora", "crun", "rooted"] {
            let (_, rt) = h.resolve(name).unwrap();
            assert_eq!(
                rt.runtime.options.as_ref().map(|o| o.systemd_cgroup),
                Some(true),
                "{name}"
            );
        }
    }

    use super::*;

    #[tokio::test]
    async fn socket_is_0660_and_a_second_bind_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("sub/remora.sock");
        let (guard, _listener) = bind_socket(&sock).unwrap();
        let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o660);
        match bind_socket(&sock) {
            Err(ServerError::AlreadyRunning { pid, .. }) => {
                assert_eq!(pid, std::process::id().to_string())
            }
            Err(e) => panic!("wrong error: {e}"),
            Ok(_) => panic!("second bind succeeded"),
        }
        drop(guard);
        assert!(
            !sock.exists(),
            "socket must be removed when the guard drops"
        );
    }

    #[tokio::test]
    async fn stale_socket_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("remora.sock");
        // A socket file with no process behind it, as a crashed remora leaves.
        drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
        assert!(sock.exists());
        let (_guard, _listener) = bind_socket(&sock).unwrap();
        assert!(std::os::unix::net::UnixStream::connect(&sock).is_ok());
    }

    #[tokio::test]
    async fn guard_does_not_remove_a_socket_it_did_not_bind() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("remora.sock");
        let (guard, listener) = bind_socket(&sock).unwrap();
        drop(listener);
        std::fs::remove_file(&sock).unwrap();
        let _other = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        drop(guard);
        assert!(sock.exists());
    }
}
