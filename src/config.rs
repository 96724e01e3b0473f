//! remora's configuration: a TOML file (default `/etc/remora/config.toml`) in which every key
//! has a default.
//!
//! Unknown keys are rejected (`deny_unknown_fields`), and values that parse but make no sense
//! (an empty namespace, a relative socket path, a zero timeout) are rejected by [`Config::validate`]
//! with the dotted key name, so a typo never silently falls back to a default.
//!
//! [`DEFAULT_TOML`] is the documented default file that `remora config default` prints. A unit
//! test parses it and compares it with [`Config::default`], so the two cannot drift apart;
//! another (`src/docs.rs`) keeps docs/config.md, the configuration reference, equal to it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use thiserror::Error;

/// Where remora looks for its config file when `--config` is not given.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/remora/config.toml";

/// A config file that cannot be used.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The read's error.
        source: std::io::Error,
    },
    /// The file is not valid TOML, has an unknown key, or a value of the wrong type.
    #[error("invalid config in {origin}: {message}")]
    Parse {
        /// The file (or "built-in defaults").
        origin: String,
        /// The parser's message, which names the key and line.
        message: String,
    },
    /// A value that parses but cannot work.
    #[error("invalid config: `{key}` {reason}")]
    Invalid {
        /// Dotted key name, e.g. `containerd.namespace`.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// The full default configuration, every key documented. Printed by `remora config default`.
pub const DEFAULT_TOML: &str = r#"# remora configuration. Every key is optional; the values shown are the defaults.
# Unknown keys and invalid values are rejected at start with a message naming the key.

[server]
# Unix socket on which remora serves the CRI v1 RuntimeService and ImageService.
# The socket is created with mode 0660, owned by the user remora runs as (root).
# A lock file "<socket>.lock" beside it keeps a second remora off the same socket.
socket = "/run/remora/remora.sock"
# Persistent state (CNI result cache). Mode 0700 (set at start if it is wider).
root_dir = "/var/lib/remora"
# Volatile state: pod network namespaces, pod files (hostname, hosts, resolv.conf, /dev/shm),
# image volumes, container FIFOs. Mode 0700 (set at start if it is wider): only root reaches
# what is below, the socket above included when it is there.
state_dir = "/run/remora"

[log]
# Minimum level logged: "trace", "debug", "info", "warning", "error" or "critical".
level = "info"
# "text" for human-readable lines, "json" for one JSON object per line. Logs go to stderr.
format = "text"

[containerd]
# containerd's gRPC socket.
address = "/run/containerd/containerd.sock"
# containerd namespace that holds remora's objects. Kept apart from containerd's own CRI
# plugin ("k8s.io") so that both can run on one containerd without touching each other.
namespace = "remora"
# How long a health probe (containerd's Version call) may take before containerd counts as
# unreachable. Status reports RuntimeReady=false while probes fail.
probe_timeout = "2s"
# While containerd is reachable, remora probes it this often.
probe_interval = "5s"
# While containerd is unreachable (or a broken event stream suggests it is), remora probes it
# this often, never less often however long it stays away: its first answer reconnects the
# event stream, resyncs pods and wakes exit monitors at once.
down_probe_interval = "200ms"
# When containerd answers probes but subscribing to its events keeps failing, remora retries
# with exponential backoff: first after reconnect_backoff_min, doubling each time...
reconnect_backoff_min = "100ms"
# ...up to at most reconnect_backoff_max between attempts.
reconnect_backoff_max = "10s"

[images]
# The pause image that holds each pod's namespaces; pulled on first use.
sandbox_image = "registry.k8s.io/pause:3.10"
# Snapshotter that image layers are unpacked into (and container rootfs snapshots made from).
snapshotter = "overlayfs"
# containerd-style registry hosts directory: <config_path>/<host>/hosts.toml configures
# mirrors, TLS and plain-HTTP hosts per registry (see containerd's docs/hosts.md).
config_path = "/etc/remora/certs.d"
# Who downloads and unpacks image layers: "transfer", containerd's Transfer service (the
# layer bytes go from the registry straight into containerd; containerd's transfer plugin
# settings bound its downloads), or "remora", remora's own registry client, writing them
# into containerd's content store and applying them through its Diff service. Either way
# remora resolves tags and fetches and checks manifests and configs itself.
pull_layers = "transfer"
# Who applies the layers remora downloads (pull_layers = "remora"; with "transfer",
# containerd applies its own): "containerd", its Diff service, or "remora", remora's own
# applier, which reads each blob from containerd's content store and writes the snapshot's
# directory itself (gzip, zstd or plain; containerd's whiteout, ownership, xattr and path
# rules; see docs/design.md). The diff ID is checked against the image config either way.
layer_applier = "containerd"
# Layer downloads running at once with pull_layers = "remora", across all pulls and
# registries (with "transfer", containerd's transfer plugin settings bound them).
max_concurrent_downloads = 12
# Of those, the most that download from one registry at once (a value above
# max_concurrent_downloads counts as max_concurrent_downloads). A registry that trickles
# its layers holds only this many slots: a pull from another registry finds one free unless
# max_concurrent_downloads / max_concurrent_downloads_per_host registries trickle at the
# same moment.
max_concurrent_downloads_per_host = 3
# A download that receives fewer than stall_min_bytes within stall_timeout is aborted
# (a trickle does not keep it alive). A layer download also has an overall deadline that
# follows from this floor: 4 × (30s + stall_timeout) + 6s + stall_timeout for each
# stall_min_bytes of its size (docs/design.md). 0 turns both off.
stall_min_bytes = 65536
# The period over which stall_min_bytes must arrive.
stall_timeout = "1m"
# How long a tag's resolved digest is reused before the registry is asked again.
digest_cache_ttl = "10s"
# Tag-to-digest resolutions running at once, across all registries.
resolver_workers = 32
# Of those, the most that run against one registry at once (a value above resolver_workers
# counts as resolver_workers). A registry that never answers holds only this many until
# resolve_timeout: a lookup at another registry starts at once unless resolver_workers /
# resolver_workers_per_host registries stall at the same moment. Registries with lookups
# queued take turns, the one holding the fewest first.
resolver_workers_per_host = 4
# Tag-to-digest resolutions started per second, at most, per registry.
resolver_rate = 10
# Overall deadline of one tag-to-digest resolution (its requests, retries, token fetches).
resolve_timeout = "1m"

[runtime]
# Cgroup driver: "cgroupfs" or "systemd", the same as kubelet's cgroupDriver (remora reports
# it to kubelet through the RuntimeConfig RPC). "cgroupfs": a pod's cgroup_parent is a path,
# and a container's cgroup is <parent>/<id>. "systemd": cgroup_parent is a slice name
# (kubepods-burstable-pod<uid>.slice; a path stands for its last component, which must be a
# slice name, else the pod is refused naming the field), each pause and
# container process runs in scope remora-<id>.scope of that slice (of system.slice for a pod
# without one), and every handler's shim is told to use systemd cgroups (SystemdCgroup).
cgroup_driver = "cgroupfs"
# The runtime handler of pods whose RunPodSandbox names none (handler ""). It must be one
# of the handlers below. Every container of a pod runs with the pod's handler. "remora",
# remora's own shim, takes a tenth of the RSS and a sixteenth of the PSS per pod that "runc",
# containerd's Go shim, takes (docs/benchmarks.md).
default_handler = "remora"
# Which pods get a pause container. "when-needed" (CRI-O's drop_infra_ctr): only a pod that
# shares one PID namespace among its containers (shareProcessNamespace), has a user namespace
# of its own or uses the host's network; any other pod's IPC and UTS namespaces are pinned by
# bind mounts beside its network namespace, with its hostname and sysctls set, and its
# containers join them. Such a pod costs no pause process, pause image, rootfs snapshot or
# runc run: a task with no process holds its shim. Only remora's shim can hold a pod so; pods
# of other handlers (containerd's Go shim) always get a pause container. "always": every pod,
# as containerd does. PodSandboxStatus reports pid 0 for a pod without one; such a pod turns
# NotReady only when stopped or when its shim dies, where a pod whose pause process is killed
# does too. A handler's own pause_container key overrides this for its pods.
pause_container = "when-needed"

# Runtime handlers, by CRI handler name (lowercase letters, digits, '.', '_', '-'). A pod
# naming a handler that is not listed here is refused with INVALID_ARGUMENT.
# The three below are the built-in handlers. A [runtime.handlers.*] table in the config file
# replaces all of them: list every handler you want, the built-in ones included.
[runtime.handlers.runc]
# containerd runtime (shim) type: io.containerd.runc.v2 is containerd's Go runc shim,
# io.containerd.remora.v2 is remora's own shim (containerd-shim-remora-v2, found in PATH).
# Optional keys: runtime_path, an absolute path to the shim binary (containerd then runs
# it instead of looking runtime_type up); binary_name, the OCI runtime the shim runs
# ("runc", "crun" or a path); root, the OCI runtime's state directory (--root);
# pod_annotations and container_annotations, the pod and container annotations passed into
# the OCI spec, which the OCI runtime reads (runc and crun act on org.systemd.property.* and
# run.oci.*): lists of patterns where '*' and '?' match any characters but '/', e.g.
# ["io.katacontainers.*"]. Empty by default: no pod author's annotation reaches the runtime;
# pause_container, "always" or "when-needed", overrides [runtime] pause_container for the
# handler's pods (a VM-based runtime needs a sandbox container).
runtime_type = "io.containerd.runc.v2"

[runtime.handlers.remora]
# remora's shim, running runc.
runtime_type = "io.containerd.remora.v2"
# The OCI runtime remora's shim runs.
binary_name = "runc"

[runtime.handlers.crun]
# remora's shim, running crun.
runtime_type = "io.containerd.remora.v2"
# The OCI runtime remora's shim runs.
binary_name = "crun"

[cni]
# Directory of CNI network configs (.conf, .conflist, .json). The first file in lexical
# order is the pod network; NetworkReady is true only while a valid one is loaded.
conf_dir = "/etc/cni/net.d"
# Directories searched, in order, for the CNI plugin binaries the network config names.
bin_dirs = ["/opt/cni/bin", "/usr/lib/cni"]
# Bound on one CNI plugin run.
plugin_timeout = "1m"
# A network config template, rendered into conf_dir/10-remora-net.conflist when kubelet
# names the node's pod CIDRs (UpdateRuntimeConfig) and no usable network config is there
# yet, as containerd's conf_template. Placeholders: {{.PodCIDR}} (the first CIDR),
# {{.PodCIDRRanges}} (a JSON array of host-local range sets, one per CIDR) and {{.Routes}}
# (a JSON array of default routes, one per address family). Empty: remora writes nothing.
conf_template = ""

[cdi]
# CDI (Container Device Interface) devices: ContainerConfig.cdi_devices and the device names
# in cdi.k8s.io/* container annotations, from device plugins and DRA drivers
# (containerd's enable_cdi). false: a container asking for a CDI device is refused.
enabled = true
# Directories of CDI spec files (*.json, *.yaml). A device defined in a later directory
# overrides one of the same name in an earlier one; two files of one directory defining the
# same device make it unusable. Files are re-read when they change; an invalid one is skipped
# with a warning. These directories are trusted, root-owned configuration: a spec file can
# give a container any host device, mount or hook.
spec_dirs = ["/etc/cdi", "/var/run/cdi"]

[streaming]
# Where the streaming server for exec, attach and port-forward listens ("ip:port"; port 0
# picks a free port). Exec, Attach and PortForward answer URLs on it; kubelet proxies the
# client's stream there from the node, so loopback is enough. It serves SPDY/3.1 and
# WebSocket, and has no authentication of its own: the URLs carry single-use tokens. Keep
# it on loopback.
address = "127.0.0.1:0"
# How long a URL handed out by Exec, Attach or PortForward stays valid (single use).
token_ttl = "1m"
# How long a client gets, after connecting, to open all of its streams.
stream_creation_timeout = "30s"
# How long a client gets to send its request head after connecting (after the TLS handshake).
header_read_timeout = "10s"
# Connections open at once, exec/attach/port-forward sessions included; more are closed at
# once and counted in remora_listener_connections_refused_total.
max_connections = 512
# A session on which nothing was read or written for this long is closed (kubelet's
# streamingConnectionIdleTimeout, 4h by default).
idle_timeout = "4h"
# TLS for the streaming server: a PEM certificate chain (leaf first), set together with
# tls_key_file. With them the URLs handed out are https://; empty: plain http.
tls_cert_file = ""
# The PEM private key of tls_cert_file.
tls_key_file = ""

[metrics]
# Where to serve Prometheus metrics ("ip:port", e.g. "127.0.0.1:9338"): GET /metrics answers
# in the OpenMetrics text format (CRI calls, pulls, the digest resolver, the event queue,
# pods and containers by state). Empty: no metrics endpoint. It has no authentication: keep
# it on loopback or behind a firewall.
address = ""

[nri]
# NRI (Node Resource Interface): remora hosts NRI plugins (resource managers, device
# injectors, OCI hook injectors, policy agents) and calls them at each pod and container
# event, as containerd's CRI and CRI-O do. See docs/nri.md. false: no socket, no plugins.
enable = true
# The unix socket external plugins connect to (NRI's Go stub: stub.WithSocketPath). Its
# directory is made with mode 0700, the socket with 0600: only root may connect, and a
# plugin may change every container's spec. Not containerd's /var/run/nri/nri.sock, so both
# runtimes can host NRI on one node.
socket_path = "/var/run/nri/remora.sock"
# Plugins remora starts itself, as NRI does: each executable "<idx>-<name>" here (idx two
# digits) is run with its end of a socket pair as fd 3 (NRI_PLUGIN_SOCKET=3), and is sent its
# config file from plugin_config_path ("<idx>-<name>.conf", else "<name>.conf", at most
# 1 MiB) in Configure. It is killed when it fails to register, loses its connection, or
# remora stops. Empty: none.
plugin_path = "/opt/nri/plugins"
# Where those plugins' config files are. Empty: none sent.
plugin_config_path = "/etc/nri/conf.d"
# How long a plugin has to register after it connects or is started.
registration_timeout = "5s"
# How long a plugin has to answer one request (a Synchronize: all of its parts). A plugin
# that does not answer in time is disconnected; if the event was RunPodSandbox,
# CreateContainer, UpdateContainerResources or StartContainer, that CRI call fails.
request_timeout = "2s"
"#;

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The CRI server.
    pub server: ServerConfig,
    /// Logging.
    pub log: LogConfig,
    /// The containerd connection.
    pub containerd: ContainerdConfig,
    /// Image pulling and storage.
    pub images: ImagesConfig,
    /// Runtime-wide settings reported to kubelet.
    pub runtime: RuntimeConfig,
    /// Pod networking.
    pub cni: CniConfig,
    /// CDI devices.
    pub cdi: CdiConfig,
    /// The streaming server (exec, attach, port-forward).
    pub streaming: StreamingConfig,
    /// The Prometheus metrics endpoint.
    pub metrics: MetricsConfig,
    /// NRI plugins.
    pub nri: NriConfig,
}

/// `[nri]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NriConfig {
    /// Whether remora hosts NRI plugins.
    pub enable: bool,
    /// The socket external plugins connect to.
    pub socket_path: PathBuf,
    /// Where plugins remora starts itself are; empty: none.
    pub plugin_path: PathBuf,
    /// Where those plugins' config files are; empty: none.
    pub plugin_config_path: PathBuf,
    /// How long a plugin has to register.
    #[serde(with = "humantime_serde")]
    pub registration_timeout: Duration,
    /// How long a plugin has to answer one request.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
}

impl Default for NriConfig {
    fn default() -> Self {
        Self {
            enable: true,
            socket_path: PathBuf::from("/var/run/nri/remora.sock"),
            plugin_path: PathBuf::from("/opt/nri/plugins"),
            plugin_config_path: PathBuf::from("/etc/nri/conf.d"),
            registration_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(2),
        }
    }
}

/// `[metrics]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// `ip:port` of the metrics endpoint; empty: off.
    pub address: String,
}

impl MetricsConfig {
    /// The endpoint's address, `None` when it is off (validated at load).
    pub fn socket_addr(&self) -> Result<Option<std::net::SocketAddr>, ConfigError> {
        if self.address.is_empty() {
            return Ok(None);
        }
        self.address
            .parse()
            .map(Some)
            .map_err(|e| ConfigError::Invalid {
                key: "metrics.address".into(),
                reason: format!(
                    "{:?} is not an ip:port address (or \"\" for off): {e}",
                    self.address
                ),
            })
    }
}

/// `[server]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// The CRI unix socket.
    pub socket: PathBuf,
    /// Persistent state directory.
    pub root_dir: PathBuf,
    /// Volatile state directory.
    pub state_dir: PathBuf,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            socket: PathBuf::from("/run/remora/remora.sock"),
            root_dir: PathBuf::from("/var/lib/remora"),
            state_dir: PathBuf::from("/run/remora"),
        }
    }
}

/// Minimum log level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    /// Everything.
    Trace,
    /// Per-request detail.
    Debug,
    /// Lifecycle events.
    Info,
    /// Degraded but working.
    Warning,
    /// Failed operations.
    Error,
    /// remora cannot go on.
    Critical,
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable key=value lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// `[log]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// Minimum level.
    pub level: LogLevel,
    /// Line format.
    pub format: LogFormat,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            level: LogLevel::Info,
            format: LogFormat::Text,
        }
    }
}

/// `[containerd]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ContainerdConfig {
    /// containerd's gRPC socket.
    pub address: PathBuf,
    /// The containerd namespace for remora's objects.
    pub namespace: String,
    /// Timeout of one health probe.
    #[serde(with = "humantime_serde")]
    pub probe_timeout: Duration,
    /// Probe period while containerd is reachable.
    #[serde(with = "humantime_serde")]
    pub probe_interval: Duration,
    /// Probe period while containerd is unreachable (fixed, not grown).
    #[serde(with = "humantime_serde")]
    pub down_probe_interval: Duration,
    /// First re-subscription delay while containerd answers but its event stream fails.
    #[serde(with = "humantime_serde")]
    pub reconnect_backoff_min: Duration,
    /// Cap of the retry delay.
    #[serde(with = "humantime_serde")]
    pub reconnect_backoff_max: Duration,
}

impl Default for ContainerdConfig {
    fn default() -> Self {
        Self {
            address: PathBuf::from("/run/containerd/containerd.sock"),
            namespace: "remora".to_string(),
            probe_timeout: Duration::from_secs(2),
            probe_interval: Duration::from_secs(5),
            down_probe_interval: Duration::from_millis(200),
            reconnect_backoff_min: Duration::from_millis(100),
            reconnect_backoff_max: Duration::from_secs(10),
        }
    }
}

/// `[images]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ImagesConfig {
    /// The pause image.
    pub sandbox_image: String,
    /// Snapshotter for layers and rootfs.
    pub snapshotter: String,
    /// hosts.toml directory.
    pub config_path: PathBuf,
    /// Who downloads and unpacks layers.
    pub pull_layers: PullLayers,
    /// Who applies the layers remora downloads.
    pub layer_applier: LayerApplier,
    /// Concurrent layer downloads, all registries.
    pub max_concurrent_downloads: usize,
    /// Concurrent layer downloads from one registry.
    pub max_concurrent_downloads_per_host: usize,
    /// Stall threshold in bytes per `stall_timeout`.
    pub stall_min_bytes: u64,
    /// Stall period.
    #[serde(with = "humantime_serde")]
    pub stall_timeout: Duration,
    /// Digest cache lifetime.
    #[serde(with = "humantime_serde")]
    pub digest_cache_ttl: Duration,
    /// Resolver workers, all registries.
    pub resolver_workers: usize,
    /// Resolver workers one registry may hold.
    pub resolver_workers_per_host: usize,
    /// Resolutions started per second.
    pub resolver_rate: u32,
    /// Overall deadline of one resolution.
    #[serde(with = "humantime_serde")]
    pub resolve_timeout: Duration,
}

impl Default for ImagesConfig {
    fn default() -> Self {
        Self {
            sandbox_image: "registry.k8s.io/pause:3.10".to_string(),
            snapshotter: "overlayfs".to_string(),
            config_path: PathBuf::from("/etc/remora/certs.d"),
            pull_layers: PullLayers::Transfer,
            layer_applier: LayerApplier::Containerd,
            max_concurrent_downloads: 12,
            max_concurrent_downloads_per_host: 3,
            stall_min_bytes: 65536,
            stall_timeout: Duration::from_secs(60),
            digest_cache_ttl: Duration::from_secs(10),
            resolver_workers: 32,
            resolver_workers_per_host: 4,
            resolver_rate: 10,
            resolve_timeout: crate::images::resolver::RESOLVE_TIMEOUT,
        }
    }
}

/// Who downloads and unpacks image layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PullLayers {
    /// containerd's Transfer service.
    Transfer,
    /// remora's registry client, through containerd's content store and Diff service.
    Remora,
}

/// Who applies the layers remora downloads (`pull_layers = "remora"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LayerApplier {
    /// containerd's Diff service.
    Containerd,
    /// remora's own applier (`images::apply`), over containerd's content store.
    Remora,
}

/// Cgroup driver, reported to kubelet; it decides the form of cgroup parents and of a
/// container's `linux.cgroupsPath` (see `spec::cgroups`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupDriver {
    /// Cgroups managed directly through cgroupfs.
    Cgroupfs,
    /// Cgroups managed through systemd.
    Systemd,
}

/// Which pods get a pause container (`[runtime] pause_container`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PauseContainer {
    /// Only pods that need one: a shared PID namespace, a user namespace of their own, or the
    /// host's network.
    WhenNeeded,
    /// Every pod.
    Always,
}

/// `[runtime]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// Cgroup driver.
    pub cgroup_driver: CgroupDriver,
    /// The handler of pods that name none (CRI handler `""`).
    pub default_handler: String,
    /// Which pods get a pause container; a handler's own key overrides it.
    pub pause_container: PauseContainer,
    /// Runtime handlers by CRI handler name. A `[runtime.handlers.*]` table in the file
    /// replaces the built-in set ([`RuntimeConfig::builtin_handlers`]) as a whole: serde's
    /// struct-level `default` fills the field only when the key is absent.
    pub handlers: BTreeMap<String, RuntimeHandler>,
}

/// `[runtime.handlers.<name>]`: how pods of one CRI runtime handler run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeHandler {
    /// containerd runtime (shim) type, e.g. `io.containerd.runc.v2`.
    pub runtime_type: String,
    /// Absolute path of the shim binary; containerd runs it instead of resolving
    /// `runtime_type` (sent as `CreateTaskRequest.runtime_path`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_path: Option<PathBuf>,
    /// The OCI runtime the shim runs (`runc`, `crun` or a path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binary_name: Option<String>,
    /// The OCI runtime's state directory (`--root`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<PathBuf>,
    /// Pod annotations passed to the OCI spec of the pod's pause container and of each of its
    /// containers, as patterns (`*`, `?`; containerd's `pod_annotations`). Empty: none.
    /// Everything else stays out of the spec, which the OCI runtime reads
    /// (`crate::spec::passthrough`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_annotations: Vec<String>,
    /// Container annotations passed to the container's OCI spec, as patterns (containerd's
    /// `container_annotations`). Empty: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub container_annotations: Vec<String>,
    /// Overrides `[runtime] pause_container` for this handler's pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_container: Option<PauseContainer>,
}

impl RuntimeHandler {
    /// A handler of `runtime_type` with no options.
    pub fn of_type(runtime_type: &str) -> Self {
        Self {
            runtime_type: runtime_type.to_string(),
            runtime_path: None,
            binary_name: None,
            root: None,
            pod_annotations: Vec::new(),
            container_annotations: Vec::new(),
            pause_container: None,
        }
    }
}

/// containerd's Go runc shim.
pub const RUNC_RUNTIME_TYPE: &str = "io.containerd.runc.v2";
/// remora's shim, `containerd-shim-remora-v2`.
pub const REMORA_RUNTIME_TYPE: &str = "io.containerd.remora.v2";

impl RuntimeConfig {
    /// The handlers used when the file has no `[runtime.handlers.*]` table: `runc` (Go shim),
    /// `remora` (remora's shim running runc) and `crun` (remora's shim running crun).
    pub fn builtin_handlers() -> BTreeMap<String, RuntimeHandler> {
        let with_binary = |binary: &str| RuntimeHandler {
            binary_name: Some(binary.to_string()),
            ..RuntimeHandler::of_type(REMORA_RUNTIME_TYPE)
        };
        BTreeMap::from([
            (
                "runc".to_string(),
                RuntimeHandler::of_type(RUNC_RUNTIME_TYPE),
            ),
            ("remora".to_string(), with_binary("runc")),
            ("crun".to_string(), with_binary("crun")),
        ])
    }
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            cgroup_driver: CgroupDriver::Cgroupfs,
            default_handler: "remora".to_string(),
            pause_container: PauseContainer::WhenNeeded,
            handlers: Self::builtin_handlers(),
        }
    }
}

/// Whether `name` can be a CRI runtime handler name in remora's config: non-empty, lowercase
/// letters, digits, `.`, `_`, `-` (it becomes part of dotted config keys and log fields).
pub fn valid_handler_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-'))
}

/// `[cni]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CniConfig {
    /// Network config directory.
    pub conf_dir: PathBuf,
    /// Plugin binary directories, searched in order.
    pub bin_dirs: Vec<PathBuf>,
    /// Bound on one plugin run.
    #[serde(with = "humantime_serde")]
    pub plugin_timeout: Duration,
    /// Network config template for `UpdateRuntimeConfig` (empty: none).
    pub conf_template: PathBuf,
}

impl Default for CniConfig {
    fn default() -> Self {
        Self {
            conf_dir: PathBuf::from("/etc/cni/net.d"),
            bin_dirs: vec![PathBuf::from("/opt/cni/bin"), PathBuf::from("/usr/lib/cni")],
            plugin_timeout: Duration::from_secs(60),
            conf_template: PathBuf::new(),
        }
    }
}

/// `[cdi]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CdiConfig {
    /// Whether CDI devices are given to containers.
    pub enabled: bool,
    /// Spec directories, lowest priority first.
    pub spec_dirs: Vec<PathBuf>,
}

impl Default for CdiConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            spec_dirs: vec![PathBuf::from("/etc/cdi"), PathBuf::from("/var/run/cdi")],
        }
    }
}

/// `[streaming]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StreamingConfig {
    /// `ip:port` the streaming server listens on; port 0 picks a free port.
    pub address: String,
    /// How long a URL handed out by Exec, Attach or PortForward stays valid.
    #[serde(with = "humantime_serde")]
    pub token_ttl: Duration,
    /// How long a client gets, after connecting, to open all its streams.
    #[serde(with = "humantime_serde")]
    pub stream_creation_timeout: Duration,
    /// How long a client gets to send its request head.
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// Connections open at once (sessions included); more are closed at once.
    pub max_connections: usize,
    /// A session idle (nothing read or written) for this long is closed; kubelet's
    /// `streamingConnectionIdleTimeout`, 4 h by default.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// PEM certificate chain for TLS; empty: no TLS.
    pub tls_cert_file: String,
    /// PEM private key of `tls_cert_file`.
    pub tls_key_file: String,
}

impl Default for StreamingConfig {
    fn default() -> Self {
        Self {
            address: "127.0.0.1:0".into(),
            token_ttl: Duration::from_secs(60),
            stream_creation_timeout: Duration::from_secs(30),
            header_read_timeout: Duration::from_secs(10),
            max_connections: 512,
            idle_timeout: Duration::from_secs(4 * 3600),
            tls_cert_file: String::new(),
            tls_key_file: String::new(),
        }
    }
}

impl StreamingConfig {
    /// The listening address, parsed (validated at load).
    pub fn socket_addr(&self) -> Result<std::net::SocketAddr, ConfigError> {
        self.address.parse().map_err(|e| ConfigError::Invalid {
            key: "streaming.address".into(),
            reason: format!("{:?} is not an ip:port address: {e}", self.address),
        })
    }
}

impl Config {
    /// Parses and validates a TOML document. `origin` names it in errors (a path, or
    /// "built-in defaults").
    pub fn from_toml(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            origin: origin.to_string(),
            // toml's message already names the key (`unknown field `foo``) and the line.
            message: e.to_string(),
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Loads the config. An explicitly given path must exist; the default path may be absent,
    /// in which case every key takes its default.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        let (path, explicit) = match path {
            Some(p) => (p, true),
            None => (Path::new(DEFAULT_CONFIG_PATH), false),
        };
        match std::fs::read_to_string(path) {
            Ok(text) => Self::from_toml(&text, &path.display().to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => {
                let config = Config::default();
                config.validate()?;
                Ok(config)
            }
            Err(source) => Err(ConfigError::Read {
                path: path.to_path_buf(),
                source,
            }),
        }
    }

    /// Checks values that deserialize but cannot work, naming the offending key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_server()?;
        self.validate_containerd()?;
        if self.images.sandbox_image.is_empty() {
            return Err(invalid("images.sandbox_image", "must not be empty"));
        }
        self.validate_handlers()?;
        self.streaming.socket_addr()?;
        self.metrics.socket_addr()?;
        self.validate_streaming()?;
        if self.cni.plugin_timeout.is_zero() {
            return Err(invalid("cni.plugin_timeout", "must be greater than zero"));
        }
        self.validate_images()?;
        self.validate_nri()?;
        self.validate_host_dirs()
    }

    /// `[nri]`: an absolute socket path that fits in `sockaddr_un`, absolute plugin
    /// directories (or empty), timeouts above zero and at most a minute (a plugin holding a
    /// CRI call longer is a wedged node).
    fn validate_nri(&self) -> Result<(), ConfigError> {
        let nri = &self.nri;
        absolute("nri.socket_path", &nri.socket_path)?;
        let len = nri.socket_path.as_os_str().len();
        if len > 107 {
            return Err(invalid(
                "nri.socket_path",
                format!("is {len} bytes long; a unix socket path may be at most 107"),
            ));
        }
        for (key, dir) in [
            ("nri.plugin_path", &nri.plugin_path),
            ("nri.plugin_config_path", &nri.plugin_config_path),
        ] {
            if !dir.as_os_str().is_empty() {
                absolute(key, dir)?;
            }
        }
        for (key, d) in [
            ("nri.registration_timeout", nri.registration_timeout),
            ("nri.request_timeout", nri.request_timeout),
        ] {
            if d.is_zero() {
                return Err(invalid(key, "must be greater than zero"));
            }
            if d > Duration::from_secs(60) {
                return Err(invalid(key, "must be at most 1m"));
            }
        }
        Ok(())
    }

    /// `[server]`: absolute paths, a socket path that fits in `sockaddr_un`.
    fn validate_server(&self) -> Result<(), ConfigError> {
        absolute("server.socket", &self.server.socket)?;
        // sockaddr_un holds 108 bytes including the NUL terminator.
        let socket_len = self.server.socket.as_os_str().len();
        if socket_len > 107 {
            return Err(invalid(
                "server.socket",
                format!("is {socket_len} bytes long; a unix socket path may be at most 107"),
            ));
        }
        absolute("server.root_dir", &self.server.root_dir)?;
        absolute("server.state_dir", &self.server.state_dir)?;
        Ok(())
    }

    /// `[containerd]`: address, namespace, non-zero probe and backoff durations, min ≤ max.
    fn validate_containerd(&self) -> Result<(), ConfigError> {
        absolute("containerd.address", &self.containerd.address)?;
        let ns = &self.containerd.namespace;
        // containerd's namespace rule: a DNS-label-like identifier, dots allowed.
        let ns_ok = !ns.is_empty()
            && ns.len() <= 76
            && ns.starts_with(|c: char| c.is_ascii_alphabetic())
            && ns.chars().all(|c| {
                c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.')
            });
        if !ns_ok {
            return Err(invalid(
                "containerd.namespace",
                format!(
                    "{ns:?} is not a valid containerd namespace (lowercase letters, digits, '-', '_', '.'; starting with a letter; at most 76 characters)"
                ),
            ));
        }
        for (key, d) in [
            ("containerd.probe_timeout", self.containerd.probe_timeout),
            ("containerd.probe_interval", self.containerd.probe_interval),
            (
                "containerd.down_probe_interval",
                self.containerd.down_probe_interval,
            ),
            (
                "containerd.reconnect_backoff_min",
                self.containerd.reconnect_backoff_min,
            ),
            (
                "containerd.reconnect_backoff_max",
                self.containerd.reconnect_backoff_max,
            ),
        ] {
            if d.is_zero() {
                return Err(invalid(key, "must be greater than zero"));
            }
        }
        if self.containerd.reconnect_backoff_max < self.containerd.reconnect_backoff_min {
            return Err(invalid(
                "containerd.reconnect_backoff_max",
                "must not be smaller than containerd.reconnect_backoff_min",
            ));
        }
        Ok(())
    }

    /// `[streaming]` beyond its address: TLS files paired, non-zero timeouts, a sane header
    /// timeout, at least one connection.
    fn validate_streaming(&self) -> Result<(), ConfigError> {
        if self.streaming.tls_cert_file.is_empty() != self.streaming.tls_key_file.is_empty() {
            return Err(invalid(
                "streaming.tls_cert_file",
                "tls_cert_file and tls_key_file must be set together (or neither)",
            ));
        }
        for (key, d) in [
            ("streaming.token_ttl", self.streaming.token_ttl),
            (
                "streaming.stream_creation_timeout",
                self.streaming.stream_creation_timeout,
            ),
            (
                "streaming.header_read_timeout",
                self.streaming.header_read_timeout,
            ),
            ("streaming.idle_timeout", self.streaming.idle_timeout),
        ] {
            if d.is_zero() {
                return Err(invalid(key, "must be greater than zero"));
            }
        }
        // hyper adds it to an Instant (which panics on overflow): keep it sane.
        if self.streaming.header_read_timeout > Duration::from_secs(3600) {
            return Err(invalid(
                "streaming.header_read_timeout",
                "must be at most 1h",
            ));
        }
        if self.streaming.max_connections == 0 {
            return Err(invalid("streaming.max_connections", "must be at least 1"));
        }
        Ok(())
    }

    /// `[images]` beyond the sandbox image: snapshotter, config path, non-zero counts and
    /// timeouts.
    fn validate_images(&self) -> Result<(), ConfigError> {
        let img = &self.images;
        if img.snapshotter.is_empty() {
            return Err(invalid("images.snapshotter", "must not be empty"));
        }
        absolute("images.config_path", &img.config_path)?;
        for (key, n) in [
            (
                "images.max_concurrent_downloads",
                img.max_concurrent_downloads,
            ),
            (
                "images.max_concurrent_downloads_per_host",
                img.max_concurrent_downloads_per_host,
            ),
            ("images.resolver_workers", img.resolver_workers),
            (
                "images.resolver_workers_per_host",
                img.resolver_workers_per_host,
            ),
            ("images.resolver_rate", img.resolver_rate as usize),
        ] {
            if n == 0 {
                return Err(invalid(key, "must be at least 1"));
            }
        }
        // A per-host value above its total counts as the total (a config that lowered only
        // the total stays valid).
        if img.resolve_timeout.is_zero() {
            return Err(invalid(
                "images.resolve_timeout",
                "must be greater than zero",
            ));
        }
        if img.stall_timeout.is_zero() {
            return Err(invalid("images.stall_timeout", "must be greater than zero"));
        }
        Ok(())
    }

    /// The CNI and CDI directories: absolute, at least one CNI plugin directory.
    fn validate_host_dirs(&self) -> Result<(), ConfigError> {
        absolute("cni.conf_dir", &self.cni.conf_dir)?;
        if self.cni.bin_dirs.is_empty() {
            return Err(invalid("cni.bin_dirs", "must name at least one directory"));
        }
        for dir in &self.cni.bin_dirs {
            absolute("cni.bin_dirs", dir)?;
        }
        for dir in &self.cdi.spec_dirs {
            absolute("cdi.spec_dirs", dir)?;
        }
        Ok(())
    }

    fn validate_handlers(&self) -> Result<(), ConfigError> {
        let rt = &self.runtime;
        if rt.handlers.is_empty() {
            return Err(ConfigError::Invalid {
                key: "runtime.handlers".into(),
                reason: "must name at least one handler".into(),
            });
        }
        for (name, h) in &rt.handlers {
            let key = |field: &str| format!("runtime.handlers.{name}{field}");
            let invalid = |field: &str, reason: String| ConfigError::Invalid {
                key: key(field),
                reason,
            };
            if !valid_handler_name(name) {
                return Err(invalid(
                    "",
                    format!("{name:?} is not a valid handler name (lowercase letters, digits, '.', '_', '-'; not empty)"),
                ));
            }
            if h.runtime_type.is_empty() {
                return Err(invalid(".runtime_type", "must not be empty".into()));
            }
            if let Some(p) = &h.runtime_path {
                if !p.is_absolute() {
                    return Err(invalid(
                        ".runtime_path",
                        format!(
                            "must be an absolute path, got {:?}",
                            p.display().to_string()
                        ),
                    ));
                }
            }
            if h.binary_name.as_deref() == Some("") {
                return Err(invalid(".binary_name", "must not be empty".into()));
            }
            if let Some(p) = &h.root {
                if !p.is_absolute() {
                    return Err(invalid(
                        ".root",
                        format!(
                            "must be an absolute path, got {:?}",
                            p.display().to_string()
                        ),
                    ));
                }
            }
            for (field, patterns) in [
                (".pod_annotations", &h.pod_annotations),
                (".container_annotations", &h.container_annotations),
            ] {
                for p in patterns {
                    crate::spec::passthrough::check_pattern(p).map_err(|r| invalid(field, r))?;
                }
            }
        }
        if !rt.handlers.contains_key(&rt.default_handler) {
            let known: Vec<&str> = rt.handlers.keys().map(String::as_str).collect();
            return Err(ConfigError::Invalid {
                key: "runtime.default_handler".into(),
                reason: format!(
                    "names {:?}, which is not a configured handler (configured: {})",
                    rt.default_handler,
                    known.join(", ")
                ),
            });
        }
        Ok(())
    }

    /// The effective config as JSON (for `Status` with `verbose`).
    pub fn to_json(&self) -> String {
        // Serializing plain structs of strings, paths, numbers and enums cannot fail; if it
        // somehow did, an error text in the verbose info is better than failing Status.
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

/// A [`ConfigError::Invalid`] naming `key`.
fn invalid(key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.to_string(),
        reason: reason.into(),
    }
}

/// `key`'s path `p` must be absolute.
fn absolute(key: &str, p: &Path) -> Result<(), ConfigError> {
    if p.is_absolute() {
        Ok(())
    } else {
        Err(invalid(
            key,
            format!(
                "must be an absolute path, got {:?}",
                p.display().to_string()
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documented_defaults_match_code_defaults() {
        let parsed = Config::from_toml(DEFAULT_TOML, "DEFAULT_TOML").unwrap();
        assert_eq!(parsed, Config::default());
    }

    #[test]
    fn every_key_in_the_default_file_is_documented() {
        // Each `key = value` line must follow a comment line, so `remora config default` is a
        // complete reference.
        let lines: Vec<&str> = DEFAULT_TOML.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let line = line.trim();
            if line.contains(" = ") && !line.starts_with('#') {
                let prev = lines[i - 1].trim();
                assert!(
                    prev.starts_with('#'),
                    "key line {line:?} has no comment above it"
                );
            }
        }
    }

    #[test]
    fn empty_file_gives_defaults() {
        assert_eq!(Config::from_toml("", "t").unwrap(), Config::default());
    }

    #[test]
    fn unknown_key_is_rejected_by_name() {
        let err = Config::from_toml("[containerd]\nadress = \"/x\"\n", "t").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("adress"), "{msg}");
        let err = Config::from_toml("bogus = 1\n", "t").unwrap_err();
        assert!(err.to_string().contains("bogus"), "{err}");
    }

    #[test]
    fn bad_values_are_rejected_with_the_key() {
        let cases = [
            ("[runtime]\ncgroup_driver = \"cgroupz\"\n", "cgroup_driver"),
            ("[containerd]\nnamespace = \"\"\n", "containerd.namespace"),
            (
                "[containerd]\nnamespace = \"Bad NS\"\n",
                "containerd.namespace",
            ),
            (
                "[containerd]\nprobe_timeout = \"0s\"\n",
                "containerd.probe_timeout",
            ),
            ("[containerd]\nprobe_timeout = \"soon\"\n", "probe_timeout"),
            ("[server]\nsocket = \"relative.sock\"\n", "server.socket"),
            ("[cni]\nbin_dirs = []\n", "cni.bin_dirs"),
            ("[cdi]\nspec_dirs = [\"cdi\"]\n", "cdi.spec_dirs"),
            (
                "[images]\nmax_concurrent_downloads = 0\n",
                "images.max_concurrent_downloads",
            ),
            (
                "[images]\nmax_concurrent_downloads_per_host = 0\n",
                "images.max_concurrent_downloads_per_host",
            ),
            (
                "[images]\nresolver_workers_per_host = 0\n",
                "images.resolver_workers_per_host",
            ),
            ("[images]\nsnapshotter = \"\"\n", "images.snapshotter"),
            (
                "[streaming]\nheader_read_timeout = \"0s\"\n",
                "streaming.header_read_timeout",
            ),
            (
                "[streaming]\nheader_read_timeout = \"300years\"\n",
                "streaming.header_read_timeout",
            ),
            (
                "[streaming]\nmax_connections = 0\n",
                "streaming.max_connections",
            ),
            (
                "[streaming]\nidle_timeout = \"0s\"\n",
                "streaming.idle_timeout",
            ),
            ("[log]\nlevel = \"loud\"\n", "level"),
            (
                "[containerd]\nreconnect_backoff_min = \"20s\"\nreconnect_backoff_max = \"1s\"\n",
                "containerd.reconnect_backoff_max",
            ),
            (
                "[streaming]\ntls_cert_file = \"/etc/remora/cert.pem\"\n",
                "streaming.tls_cert_file",
            ),
            (
                "[streaming]\ntls_key_file = \"/etc/remora/key.pem\"\n",
                "streaming.tls_cert_file",
            ),
            ("[metrics]\naddress = \"localhost\"\n", "metrics.address"),
            ("[nri]\nsocket_path = \"nri.sock\"\n", "nri.socket_path"),
            ("[nri]\nplugin_path = \"plugins\"\n", "nri.plugin_path"),
            (
                "[nri]\nplugin_config_path = \"conf.d\"\n",
                "nri.plugin_config_path",
            ),
            ("[nri]\nrequest_timeout = \"0s\"\n", "nri.request_timeout"),
            (
                "[nri]\nregistration_timeout = \"2h\"\n",
                "nri.registration_timeout",
            ),
            ("[metrics]\nadress = \"127.0.0.1:9338\"\n", "adress"),
        ];
        for (text, key) in cases {
            let err = Config::from_toml(text, "t").expect_err(text);
            assert!(err.to_string().contains(key), "{text:?} -> {err}");
        }
    }

    #[test]
    fn overlong_socket_path_is_rejected() {
        let text = format!("[server]\nsocket = \"/{}\"\n", "a".repeat(120));
        let err = Config::from_toml(&text, "t").unwrap_err();
        assert!(err.to_string().contains("server.socket"), "{err}");
    }

    #[test]
    fn overlong_nri_socket_path_is_rejected_and_empty_plugin_dirs_are_none() {
        let text = format!("[nri]\nsocket_path = \"/{}\"\n", "a".repeat(120));
        let err = Config::from_toml(&text, "t").unwrap_err();
        assert!(err.to_string().contains("nri.socket_path"), "{err}");
        let config = Config::from_toml(
            "[nri]\nplugin_path = \"\"\nplugin_config_path = \"\"\n",
            "t",
        )
        .unwrap();
        assert!(config.nri.plugin_path.as_os_str().is_empty());
    }

    #[test]
    fn explicit_missing_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.toml");
        let err = Config::load(Some(&missing)).unwrap_err();
        assert!(err.to_string().contains("nope.toml"), "{err}");
    }

    #[test]
    fn builtin_handlers_are_runc_remora_and_crun() {
        let c = Config::default();
        assert_eq!(c.runtime.default_handler, "remora");
        let h = &c.runtime.handlers;
        assert_eq!(h.len(), 3);
        assert_eq!(h["runc"], RuntimeHandler::of_type("io.containerd.runc.v2"));
        assert_eq!(h["remora"].runtime_type, "io.containerd.remora.v2");
        assert_eq!(h["remora"].binary_name.as_deref(), Some("runc"));
        assert_eq!(h["crun"].runtime_type, "io.containerd.remora.v2");
        assert_eq!(h["crun"].binary_name.as_deref(), Some("crun"));
    }

    #[test]
    fn a_handlers_table_replaces_the_builtin_ones() {
        let text = "[runtime]\ndefault_handler = \"fast\"\n\
                    [runtime.handlers.fast]\nruntime_type = \"io.containerd.remora.v2\"\n\
                    runtime_path = \"/opt/bin/shim\"\nbinary_name = \"/usr/bin/crun\"\nroot = \"/run/crun\"\n";
        let c = Config::from_toml(text, "t").unwrap();
        assert_eq!(c.runtime.handlers.len(), 1, "{:?}", c.runtime.handlers);
        let fast = &c.runtime.handlers["fast"];
        assert_eq!(
            fast.runtime_path.as_deref(),
            Some(Path::new("/opt/bin/shim"))
        );
        assert_eq!(fast.binary_name.as_deref(), Some("/usr/bin/crun"));
        assert_eq!(fast.root.as_deref(), Some(Path::new("/run/crun")));
        // The default handler must be among the configured ones: "remora" is gone now.
        let err = Config::from_toml(
            "[runtime.handlers.fast]\nruntime_type = \"io.containerd.remora.v2\"\n",
            "t",
        )
        .unwrap_err();
        assert!(err.to_string().contains("runtime.default_handler"), "{err}");
        assert!(err.to_string().contains("fast"), "{err}");
    }

    #[test]
    fn handlers_pass_no_annotations_unless_listed() {
        let c = Config::default();
        assert!(c
            .runtime
            .handlers
            .values()
            .all(|h| h.pod_annotations.is_empty() && h.container_annotations.is_empty()));
        let c = Config::from_toml(
            "[runtime]\ndefault_handler = \"runc\"\n\
             [runtime.handlers.runc]\nruntime_type = \"x\"\n\
             pod_annotations = [\"io.katacontainers.*\"]\ncontainer_annotations = [\"run.oci.foo\"]\n",
            "t",
        )
        .unwrap();
        let h = &c.runtime.handlers["runc"];
        assert_eq!(h.pod_annotations, ["io.katacontainers.*"]);
        assert_eq!(h.container_annotations, ["run.oci.foo"]);
    }

    #[test]
    fn bad_handlers_are_rejected_with_the_key() {
        let cases = [
            (
                "[runtime]\ndefault_handler = \"kata\"\n",
                "runtime.default_handler",
            ),
            (
                "[runtime.handlers.Big]\nruntime_type = \"x\"\n[runtime.handlers.runc]\nruntime_type = \"x\"\n",
                "runtime.handlers.Big",
            ),
            (
                "[runtime.handlers.runc]\nruntime_type = \"\"\n",
                "runtime.handlers.runc.runtime_type",
            ),
            (
                "[runtime.handlers.runc]\nruntime_type = \"x\"\nruntime_path = \"shim\"\n",
                "runtime.handlers.runc.runtime_path",
            ),
            (
                "[runtime.handlers.runc]\nruntime_type = \"x\"\nroot = \"run/runc\"\n",
                "runtime.handlers.runc.root",
            ),
            (
                "[runtime.handlers.runc]\nruntime_type = \"x\"\nbinary_name = \"\"\n",
                "runtime.handlers.runc.binary_name",
            ),
            (
                "[runtime.handlers.runc]\nruntime_type = \"x\"\nbinry_name = \"crun\"\n",
                "binry_name",
            ),
            (
                "[runtime.handlers.runc]\nruntime_type = \"x\"\npod_annotations = [\"a[b]\"]\n",
                "runtime.handlers.runc.pod_annotations",
            ),
            (
                "[runtime.handlers.runc]\nruntime_type = \"x\"\ncontainer_annotations = [\"\"]\n",
                "runtime.handlers.runc.container_annotations",
            ),
            ("[runtime]\nhandlers = {}\n", "runtime.handlers"),
            ("[runtime]\nruntime_type = \"x\"\n", "runtime_type"),
        ];
        for (text, key) in cases {
            let err = Config::from_toml(text, "t").expect_err(text);
            assert!(err.to_string().contains(key), "{text:?} -> {err}");
        }
    }

    #[test]
    fn handler_names_follow_the_cri_rule() {
        for ok in ["runc", "remora", "kata-qemu", "gvisor.v1", "a_b", "0"] {
            assert!(valid_handler_name(ok), "{ok}");
        }
        for bad in ["", "Runc", "a b", "a/b", "ü"] {
            assert!(!valid_handler_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn metrics_are_off_by_default_and_take_an_address() {
        assert_eq!(Config::default().metrics.socket_addr().unwrap(), None);
        let c = Config::from_toml("[metrics]\naddress = \"127.0.0.1:9338\"\n", "t").unwrap();
        assert_eq!(
            c.metrics.socket_addr().unwrap(),
            Some("127.0.0.1:9338".parse().unwrap())
        );
    }

    #[test]
    fn durations_parse_human_form() {
        let c = Config::from_toml("[containerd]\nprobe_timeout = \"1500ms\"\n", "t").unwrap();
        assert_eq!(c.containerd.probe_timeout, Duration::from_millis(1500));
    }
}
