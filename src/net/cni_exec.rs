//! Running CNI plugins as the CNI spec (1.0.0) asks of a runtime, the way libcni does it.
//!
//! - ADD runs the list's plugins in order. Each gets its own config on stdin with `name` and
//!   `cniVersion` of the list injected, `prevResult` = the previous plugin's result (absent for
//!   the first), and `runtimeConfig` holding the capability arguments it declares in
//!   `capabilities` (`portMappings`, `bandwidth`, `dns`, ...). The last result is the network's
//!   result; it is cached on disk under `<cache_dir>/<network>-<container id>-<ifname>`.
//! - DEL runs the plugins in reverse order with `prevResult` = the cached ADD result (CNI ≥
//!   0.4.0). It uses the cached config and capability arguments, not the current conf dir: it
//!   must undo what ADD did even if the network config changed since. The cache entry is removed
//!   only after every plugin succeeded, so a retried DEL still has it.
//! - CHECK (CNI ≥ 0.4.0) runs the plugins in order with the cached result.
//!
//! Each plugin run is bounded by a timeout. A plugin runs in its own process group, and the whole
//! group is killed if the run times out or its future is dropped: plugins start helper plugins
//! (bridge runs host-local), and those must not outlive an abandoned call either.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use thiserror::Error;
use tokio::io::AsyncWriteExt;

use crate::cni::Network;

/// CNI versions whose results this code parses, and which Debian's plugins (v1.1.1) accept.
pub const SUPPORTED_VERSIONS: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0"];

/// A CNI command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CniCommand {
    /// Attach the container to the network.
    Add,
    /// Detach it and release what ADD allocated.
    Del,
    /// Verify the attachment is as ADD left it.
    Check,
}

impl CniCommand {
    /// The `CNI_COMMAND` value.
    pub fn as_str(self) -> &'static str {
        match self {
            CniCommand::Add => "ADD",
            CniCommand::Del => "DEL",
            CniCommand::Check => "CHECK",
        }
    }
}

impl std::fmt::Display for CniCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why running a network's plugins failed.
#[derive(Debug, Error)]
pub enum CniExecError {
    /// The network's `cniVersion` is not one remora can speak.
    #[error("network {network:?} has cniVersion {version:?}; supported: {}", SUPPORTED_VERSIONS.join(", "))]
    UnsupportedVersion {
        /// The network.
        network: String,
        /// Its declared version.
        version: String,
    },
    /// CHECK is not defined for the network's version.
    #[error("CNI CHECK needs cniVersion 0.4.0 or later; network {network:?} has {version:?}")]
    CheckUnsupported {
        /// The network.
        network: String,
        /// Its declared version.
        version: String,
    },
    /// CHECK needs the ADD result and there is none.
    #[error("no cached ADD result for network {network:?}, container {container_id}")]
    NoCachedResult {
        /// The network.
        network: String,
        /// The container.
        container_id: String,
    },
    /// The list has no plugins.
    #[error("network {network:?} has no plugins")]
    NoPlugins {
        /// The network.
        network: String,
    },
    /// A value cannot be passed to plugins (in `CNI_ARGS` or a cache file name).
    #[error("invalid CNI argument {key}={value:?}: {reason}")]
    InvalidArg {
        /// Which argument.
        key: String,
        /// Its value.
        value: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// The plugin binary is in none of the bin dirs.
    #[error("CNI plugin {plugin:?} not found in {dirs}")]
    PluginNotFound {
        /// The plugin type.
        plugin: String,
        /// The searched dirs, comma-separated.
        dirs: String,
    },
    /// The plugin could not be started, fed or waited for.
    #[error("cannot run CNI plugin {plugin:?} ({command}): {source}")]
    Spawn {
        /// The plugin type.
        plugin: String,
        /// The command.
        command: CniCommand,
        /// Why.
        source: std::io::Error,
    },
    /// The plugin did not finish in time; it and its children were killed.
    #[error("CNI plugin {plugin:?} ({command}) did not finish within {after:?}")]
    Timeout {
        /// The plugin type.
        plugin: String,
        /// The command.
        command: CniCommand,
        /// The limit.
        after: Duration,
    },
    /// The plugin reported an error the way the spec says (non-zero exit, JSON on stdout).
    #[error("CNI plugin {plugin:?} ({command}) failed with code {code}: {msg}{}", if details.is_empty() { String::new() } else { format!(" ({details})") })]
    Plugin {
        /// The plugin type.
        plugin: String,
        /// The command.
        command: CniCommand,
        /// The spec's error code (1-99 reserved by the spec, 100+ plugin-specific).
        code: u32,
        /// The message.
        msg: String,
        /// Optional details.
        details: String,
    },
    /// The plugin exited non-zero without a spec error on stdout.
    #[error("CNI plugin {plugin:?} ({command}) exited with {status}: {output}")]
    Exited {
        /// The plugin type.
        plugin: String,
        /// The command.
        command: CniCommand,
        /// The exit status.
        status: String,
        /// What it printed (stdout, then stderr), trimmed.
        output: String,
    },
    /// ADD succeeded but its output is not a result remora understands.
    #[error("CNI plugin {plugin:?} returned an invalid result: {reason}")]
    InvalidResult {
        /// The plugin type.
        plugin: String,
        /// What is wrong.
        reason: String,
    },
    /// The result cache could not be written or removed.
    #[error("cannot {action} CNI result cache {}: {source}", path.display())]
    Cache {
        /// What was being done.
        action: &'static str,
        /// The cache file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// What the plugins are told about the container (libcni's `RuntimeConf`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Attachment {
    /// `CNI_CONTAINERID`: the sandbox ID.
    pub container_id: String,
    /// `CNI_NETNS`; `None` when the namespace is already gone (allowed for DEL only).
    pub netns: Option<PathBuf>,
    /// `CNI_IFNAME`, e.g. `eth0`.
    pub ifname: String,
    /// `CNI_ARGS` pairs, in order.
    pub args: Vec<(String, String)>,
    /// Capability arguments, by capability name; each plugin gets those it declares.
    pub capability_args: Map<String, Value>,
}

/// A plugin chain's result (CNI 0.3.0 – 1.0.0 format).
#[derive(Debug, Clone, PartialEq)]
pub struct CniResult {
    /// `cniVersion` of the result.
    pub cni_version: String,
    /// Interfaces created or configured.
    pub interfaces: Vec<Interface>,
    /// Addresses assigned.
    pub ips: Vec<IpConfig>,
    /// Routes added.
    pub routes: Vec<Route>,
    /// DNS settings the plugins suggest.
    pub dns: Dns,
    /// The result as the plugin printed it; passed on as `prevResult` unchanged, so fields this
    /// type does not model survive.
    pub raw: Value,
}

/// An interface in a result.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Interface {
    /// Interface name.
    pub name: String,
    /// MAC address, if reported.
    #[serde(default)]
    pub mac: String,
    /// The namespace path for interfaces inside the container; empty for host-side ones.
    #[serde(default)]
    pub sandbox: String,
}

/// An address in a result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpConfig {
    /// The address.
    pub address: IpAddr,
    /// Its prefix length.
    pub prefix_len: u8,
    /// The gateway, if any.
    pub gateway: Option<IpAddr>,
    /// Index into `interfaces` of the interface holding it.
    pub interface: Option<usize>,
}

/// A route in a result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Destination network address.
    pub dst: IpAddr,
    /// Destination prefix length.
    pub dst_prefix_len: u8,
    /// Next hop; `None` means the interface's default gateway.
    pub gw: Option<IpAddr>,
}

/// DNS settings in a result.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Dns {
    /// Name servers.
    pub nameservers: Vec<String>,
    /// Local domain.
    pub domain: String,
    /// Search domains.
    pub search: Vec<String>,
    /// resolv.conf options.
    pub options: Vec<String>,
}

impl CniResult {
    /// Parses a result printed by a plugin.
    pub fn parse(raw: Value) -> Result<Self, String> {
        #[derive(Deserialize)]
        struct RawIp {
            address: String,
            #[serde(default)]
            gateway: Option<String>,
            #[serde(default)]
            interface: Option<usize>,
        }
        #[derive(Deserialize)]
        struct RawRoute {
            dst: String,
            #[serde(default)]
            gw: Option<String>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct RawResult {
            #[serde(default)]
            cni_version: String,
            #[serde(default)]
            interfaces: Vec<Interface>,
            #[serde(default)]
            ips: Vec<RawIp>,
            #[serde(default)]
            routes: Vec<RawRoute>,
            #[serde(default)]
            dns: Dns,
        }
        let r: RawResult = serde_json::from_value(raw.clone()).map_err(|e| e.to_string())?;
        let opt_ip = |s: &Option<String>| -> Result<Option<IpAddr>, String> {
            match s.as_deref() {
                None | Some("") => Ok(None),
                Some(s) => s
                    .parse()
                    .map(Some)
                    .map_err(|_| format!("{s:?} is not an IP address")),
            }
        };
        let mut ips = Vec::with_capacity(r.ips.len());
        for i in &r.ips {
            let (address, prefix_len) = parse_cidr(&i.address)?;
            if let Some(idx) = i.interface {
                if idx >= r.interfaces.len() {
                    return Err(format!(
                        "ip {} names interface {idx}, but there are {}",
                        i.address,
                        r.interfaces.len()
                    ));
                }
            }
            ips.push(IpConfig {
                address,
                prefix_len,
                gateway: opt_ip(&i.gateway)?,
                interface: i.interface,
            });
        }
        let mut routes = Vec::with_capacity(r.routes.len());
        for rt in &r.routes {
            let (dst, dst_prefix_len) = parse_cidr(&rt.dst)?;
            routes.push(Route {
                dst,
                dst_prefix_len,
                gw: opt_ip(&rt.gw)?,
            });
        }
        Ok(Self {
            cni_version: r.cni_version,
            interfaces: r.interfaces,
            ips,
            routes,
            dns: r.dns,
            raw,
        })
    }

    /// The pod's addresses, primary first, chosen as containerd does: the addresses on the
    /// sandbox interface `ifname` (all addresses if the result does not say which interface
    /// holds them), in result order except that the first IPv4 address leads.
    pub fn pod_ips(&self, ifname: &str) -> Vec<IpAddr> {
        let on_ifname = |c: &&IpConfig| {
            c.interface
                .and_then(|i| self.interfaces.get(i))
                .is_some_and(|i| i.name == ifname && !i.sandbox.is_empty())
        };
        let mut ips: Vec<IpAddr> = self
            .ips
            .iter()
            .filter(on_ifname)
            .map(|c| c.address)
            .collect();
        if ips.is_empty() && self.ips.iter().all(|c| c.interface.is_none()) {
            ips = self.ips.iter().map(|c| c.address).collect();
        }
        if let Some(v4) = ips.iter().position(|ip| ip.is_ipv4()) {
            let first = ips.remove(v4);
            ips.insert(0, first);
        }
        ips
    }
}

fn parse_cidr(s: &str) -> Result<(IpAddr, u8), String> {
    let bad = || format!("{s:?} is not an address/prefix");
    let (addr, len) = s.split_once('/').ok_or_else(bad)?;
    let addr: IpAddr = addr.parse().map_err(|_| bad())?;
    let len: u8 = len.parse().map_err(|_| bad())?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    if len > max {
        return Err(bad());
    }
    Ok((addr, len))
}

/// Whether `version` (one of [`SUPPORTED_VERSIONS`]) is at least 0.4.0: CHECK exists, and DEL
/// gets `prevResult`.
fn at_least_040(version: &str) -> bool {
    matches!(version, "0.4.0" | "1.0.0")
}

/// The stdin config for one plugin of a list (libcni's `buildOneConfig` + `injectRuntimeConfig`).
pub fn plugin_stdin(
    network: &str,
    cni_version: &str,
    plugin: &Map<String, Value>,
    prev_result: Option<&Value>,
    capability_args: &Map<String, Value>,
) -> Value {
    let mut conf = plugin.clone();
    conf.insert("name".into(), Value::String(network.to_string()));
    conf.insert("cniVersion".into(), Value::String(cni_version.to_string()));
    match prev_result {
        Some(prev) => {
            conf.insert("prevResult".into(), prev.clone());
        }
        None => {
            conf.remove("prevResult");
        }
    }
    let declared = plugin.get("capabilities").and_then(Value::as_object);
    let runtime: Map<String, Value> = declared
        .into_iter()
        .flatten()
        .filter(|(_, on)| on.as_bool() == Some(true))
        .filter_map(|(cap, _)| capability_args.get(cap).map(|v| (cap.clone(), v.clone())))
        .collect();
    // As libcni: runtimeConfig is replaced, not merged, and only set when there is something
    // to pass, so a plugin without capabilities sees its config as written.
    if !runtime.is_empty() {
        conf.insert("runtimeConfig".into(), Value::Object(runtime));
    }
    Value::Object(conf)
}

/// `CNI_ARGS`: `K=V` pairs joined by `;`. Plugins split on `;` and `=`, so neither may appear
/// inside a key or value.
pub fn cni_args(args: &[(String, String)]) -> Result<String, CniExecError> {
    let mut out = Vec::with_capacity(args.len());
    for (k, v) in args {
        for s in [k, v] {
            if s.contains(';') || s.contains('=') {
                return Err(CniExecError::InvalidArg {
                    key: k.clone(),
                    value: v.clone(),
                    reason: "contains ';' or '='",
                });
            }
        }
        out.push(format!("{k}={v}"));
    }
    Ok(out.join(";"))
}

/// The `CNI_*` environment of one plugin run.
pub fn plugin_env(
    command: CniCommand,
    rt: &Attachment,
    bin_dirs: &[PathBuf],
) -> Result<Vec<(&'static str, String)>, CniExecError> {
    let path = bin_dirs
        .iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(":");
    Ok(vec![
        ("CNI_COMMAND", command.as_str().to_string()),
        ("CNI_CONTAINERID", rt.container_id.clone()),
        (
            "CNI_NETNS",
            rt.netns
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
        ),
        ("CNI_IFNAME", rt.ifname.clone()),
        ("CNI_ARGS", cni_args(&rt.args)?),
        ("CNI_PATH", path),
    ])
}

/// A spec error as printed by a failing plugin.
#[derive(Debug, Deserialize)]
struct ErrorBody {
    code: u32,
    #[serde(default)]
    msg: String,
    #[serde(default)]
    details: String,
}

/// The on-disk cache entry for one attachment.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CacheEntry {
    kind: String,
    network_name: String,
    container_id: String,
    if_name: String,
    cni_version: String,
    plugins: Vec<Map<String, Value>>,
    capability_args: Map<String, Value>,
    result: Value,
}

const CACHE_KIND: &str = "remoraCniCacheV1";

/// Runs CNI plugins from a set of bin dirs, caching ADD results in a directory.
#[derive(Debug, Clone)]
pub struct CniExec {
    bin_dirs: Vec<PathBuf>,
    cache_dir: PathBuf,
    timeout: Duration,
}

impl CniExec {
    /// Plugins are looked up in `bin_dirs` in order; results are cached in `cache_dir`; each
    /// plugin run may take at most `timeout`.
    pub fn new(bin_dirs: Vec<PathBuf>, cache_dir: PathBuf, timeout: Duration) -> Self {
        Self {
            bin_dirs,
            cache_dir,
            timeout,
        }
    }

    /// Where the ADD result of this attachment is cached.
    pub fn cache_path(&self, network: &str, rt: &Attachment) -> Result<PathBuf, CniExecError> {
        for (key, value) in [
            ("network", network),
            ("container id", rt.container_id.as_str()),
            ("ifname", rt.ifname.as_str()),
        ] {
            if value.is_empty() || value.contains('/') || value == ".." {
                return Err(CniExecError::InvalidArg {
                    key: key.into(),
                    value: value.into(),
                    reason: "must be a non-empty plain name",
                });
            }
        }
        Ok(self
            .cache_dir
            .join(format!("{network}-{}-{}", rt.container_id, rt.ifname)))
    }

    /// CNI ADD of the whole list; returns the last plugin's result and caches it. On error,
    /// whatever the plugins that ran allocated is still allocated: the caller runs DEL.
    pub async fn add(&self, net: &Network, rt: &Attachment) -> Result<CniResult, CniExecError> {
        let version = supported_version(net)?;
        let cache = self.cache_path(&net.name, rt)?;
        let mut prev: Option<(String, Value)> = None;
        for plugin in &net.config.plugins {
            let kind = plugin_type(plugin);
            let stdin = plugin_stdin(
                &net.name,
                version,
                plugin,
                prev.as_ref().map(|(_, v)| v),
                &rt.capability_args,
            );
            let out = self.run(CniCommand::Add, kind, &stdin, rt).await?;
            let value: Value =
                serde_json::from_slice(&out).map_err(|e| CniExecError::InvalidResult {
                    plugin: kind.to_string(),
                    reason: format!("not JSON: {e}"),
                })?;
            prev = Some((kind.to_string(), value));
        }
        let (last, raw) = prev.ok_or_else(|| CniExecError::NoPlugins {
            network: net.name.clone(),
        })?;
        let result =
            CniResult::parse(raw.clone()).map_err(|reason| CniExecError::InvalidResult {
                plugin: last,
                reason,
            })?;
        let entry = CacheEntry {
            kind: CACHE_KIND.into(),
            network_name: net.name.clone(),
            container_id: rt.container_id.clone(),
            if_name: rt.ifname.clone(),
            cni_version: version.to_string(),
            plugins: net.config.plugins.clone(),
            capability_args: rt.capability_args.clone(),
            result: raw,
        };
        write_cache(&cache, &entry).await?;
        Ok(result)
    }

    /// CNI DEL of the whole list, in reverse order. Uses the cached ADD (config, capability
    /// arguments, result) when there is one, else `net` and `rt` as given with no `prevResult`.
    /// Succeeds when nothing is attached; `rt.netns` may be `None` if the namespace is gone.
    pub async fn del(&self, net: &Network, rt: &Attachment) -> Result<(), CniExecError> {
        let cache = self.cache_path(&net.name, rt)?;
        let cached = read_cache(&cache).await;
        let (version, plugins, caps, prev) = match &cached {
            Some(c) => (
                c.cni_version.as_str(),
                &c.plugins,
                &c.capability_args,
                Some(&c.result),
            ),
            None => (
                supported_version(net)?,
                &net.config.plugins,
                &rt.capability_args,
                None,
            ),
        };
        // 0.3.x DEL had no prevResult.
        let prev = prev.filter(|_| at_least_040(version));
        for plugin in plugins.iter().rev() {
            let kind = plugin_type(plugin);
            let stdin = plugin_stdin(&net.name, version, plugin, prev, caps);
            self.run(CniCommand::Del, kind, &stdin, rt).await?;
        }
        match tokio::fs::remove_file(&cache).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(CniExecError::Cache {
                action: "remove",
                path: cache,
                source,
            }),
        }
    }

    /// CNI CHECK of the whole list against the cached ADD result. A network with
    /// `disableCheck` passes without running anything.
    pub async fn check(&self, net: &Network, rt: &Attachment) -> Result<(), CniExecError> {
        let version = supported_version(net)?;
        if !at_least_040(version) {
            return Err(CniExecError::CheckUnsupported {
                network: net.name.clone(),
                version: version.to_string(),
            });
        }
        if net.config.disable_check {
            return Ok(());
        }
        let cache = self.cache_path(&net.name, rt)?;
        let cached = read_cache(&cache)
            .await
            .ok_or_else(|| CniExecError::NoCachedResult {
                network: net.name.clone(),
                container_id: rt.container_id.clone(),
            })?;
        for plugin in &net.config.plugins {
            let kind = plugin_type(plugin);
            let stdin = plugin_stdin(
                &net.name,
                version,
                plugin,
                Some(&cached.result),
                &cached.capability_args,
            );
            self.run(CniCommand::Check, kind, &stdin, rt).await?;
        }
        Ok(())
    }

    /// Runs one plugin; returns its stdout on success.
    async fn run(
        &self,
        command: CniCommand,
        plugin: &str,
        stdin: &Value,
        rt: &Attachment,
    ) -> Result<Vec<u8>, CniExecError> {
        let bin = self
            .bin_dirs
            .iter()
            .map(|d| d.join(plugin))
            .find(|p| !plugin.is_empty() && p.is_file())
            .ok_or_else(|| CniExecError::PluginNotFound {
                plugin: plugin.to_string(),
                dirs: self
                    .bin_dirs
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        let env = plugin_env(command, rt, &self.bin_dirs)?;
        let spawn_err = |source| CniExecError::Spawn {
            plugin: plugin.to_string(),
            command,
            source,
        };
        let input = serde_json::to_vec(stdin).map_err(|e| spawn_err(e.into()))?;

        // The plugin inherits remora's environment (it needs PATH to find iptables and the
        // like); all six CNI_ variables are always set, so none leaks in from outside.
        let mut cmd = tokio::process::Command::new(&bin);
        cmd.envs(env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Own group: a signal to remora's group (Ctrl-C in a terminal) does not hit a plugin
            // mid-change, and the group can be killed as a whole.
            .process_group(0)
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(spawn_err)?;
        let mut group = GroupKiller(child.id());
        let child_stdin = child.stdin.take();
        let feed = async move {
            if let Some(mut s) = child_stdin {
                s.write_all(&input).await?;
                s.shutdown().await?;
            }
            Ok::<(), std::io::Error>(())
        };
        let run = async {
            let (fed, out) = tokio::join!(feed, child.wait_with_output());
            let out = out?;
            // A plugin may exit without reading its stdin (EPIPE); its exit status and output
            // say what happened, so a feeding error only matters if it otherwise succeeded.
            if out.status.success() {
                fed?;
            }
            Ok::<_, std::io::Error>(out)
        };
        let out = match tokio::time::timeout(self.timeout, run).await {
            Ok(out) => out.map_err(spawn_err)?,
            Err(_) => {
                return Err(CniExecError::Timeout {
                    plugin: plugin.to_string(),
                    command,
                    after: self.timeout,
                })
            }
        };
        group.0 = None;
        if out.status.success() {
            return Ok(out.stdout);
        }
        if let Ok(e) = serde_json::from_slice::<ErrorBody>(&out.stdout) {
            return Err(CniExecError::Plugin {
                plugin: plugin.to_string(),
                command,
                code: e.code,
                msg: e.msg,
                details: e.details,
            });
        }
        let text = |b: &[u8]| String::from_utf8_lossy(b).trim().to_string();
        let output = [text(&out.stdout), text(&out.stderr)]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join("; ");
        Err(CniExecError::Exited {
            plugin: plugin.to_string(),
            command,
            status: out.status.to_string(),
            output,
        })
    }
}

/// Kills a plugin's process group unless disarmed (pid set to `None`) after the plugin
/// finished; so it fires when a run times out or its future is dropped. The group cannot have
/// been reused then: either the leader is not yet reaped, or members still hold our pipes open.
struct GroupKiller(Option<u32>);

impl Drop for GroupKiller {
    fn drop(&mut self) {
        if let Some(pid) = self.0.and_then(|p| i32::try_from(p).ok()) {
            // ESRCH (group already gone) is the good case; nothing else can be done here.
            let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

fn plugin_type(plugin: &Map<String, Value>) -> &str {
    // crate::cni rejects lists with a plugin lacking a string `type`; should one get here
    // anyway, the empty name fails the lookup with PluginNotFound.
    plugin.get("type").and_then(Value::as_str).unwrap_or("")
}

fn supported_version(net: &Network) -> Result<&str, CniExecError> {
    let v = net.config.cni_version.as_str();
    if SUPPORTED_VERSIONS.contains(&v) {
        Ok(v)
    } else {
        Err(CniExecError::UnsupportedVersion {
            network: net.name.clone(),
            version: v.to_string(),
        })
    }
}

async fn write_cache(path: &Path, entry: &CacheEntry) -> Result<(), CniExecError> {
    let err = |action, source| CniExecError::Cache {
        action,
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent() {
        tokio::fs::create_dir_all(dir)
            .await
            .map_err(|e| err("create the directory of", e))?;
    }
    let bytes = serde_json::to_vec(entry).map_err(|e| err("encode", e.into()))?;
    // Write then rename, so a crash never leaves a half-written entry for DEL to trip on.
    let tmp = path.with_extension("tmp");
    tokio::fs::write(&tmp, bytes)
        .await
        .map_err(|e| err("write", e))?;
    tokio::fs::rename(&tmp, path)
        .await
        .map_err(|e| err("write", e))
}

/// Reads a cache entry. An unreadable or foreign entry counts as absent: DEL must still be
/// able to run (plugins tolerate a missing `prevResult`), and CHECK reports it as missing.
async fn read_cache(path: &Path) -> Option<CacheEntry> {
    let bytes = tokio::fs::read(path).await.ok()?;
    let entry: CacheEntry = serde_json::from_slice(&bytes).ok()?;
    (entry.kind == CACHE_KIND && SUPPORTED_VERSIONS.contains(&entry.cni_version.as_str()))
        .then_some(entry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::NetworkConfigList;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => panic!("not an object"),
        }
    }

    #[test]
    fn stdin_injects_name_version_prev_result_and_declared_capabilities() {
        let plugin = obj(json!({
            "type": "portmap",
            "capabilities": {"portMappings": true, "bandwidth": false},
            "snat": true,
            "runtimeConfig": {"stale": 1},
        }));
        let caps = obj(json!({
            "portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}],
            "bandwidth": {"ingressRate": 1},
            "dns": {"servers": ["10.0.0.10"]},
        }));
        let prev = json!({"cniVersion": "1.0.0", "ips": [{"address": "10.1.0.2/24"}]});
        let conf = plugin_stdin("net", "1.0.0", &plugin, Some(&prev), &caps);
        assert_eq!(conf["name"], "net");
        assert_eq!(conf["cniVersion"], "1.0.0");
        assert_eq!(conf["type"], "portmap");
        assert_eq!(conf["snat"], true);
        assert_eq!(conf["prevResult"], prev);
        // Only the declared-and-enabled capability, replacing any runtimeConfig in the file.
        assert_eq!(
            conf["runtimeConfig"],
            json!({"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]})
        );
    }

    #[test]
    fn first_plugin_gets_no_prev_result_and_no_runtime_config_without_capabilities() {
        let plugin =
            obj(json!({"type": "bridge", "prevResult": {"bogus": 1}, "cniVersion": "0.1.0"}));
        let caps = obj(json!({"portMappings": []}));
        let conf = plugin_stdin("n", "0.4.0", &plugin, None, &caps);
        assert!(conf.get("prevResult").is_none());
        assert!(conf.get("runtimeConfig").is_none());
        assert_eq!(conf["cniVersion"], "0.4.0");
    }

    #[test]
    fn env_and_cni_args() {
        let rt = Attachment {
            container_id: "abc".into(),
            netns: Some("/run/remora/netns/abc".into()),
            ifname: "eth0".into(),
            args: vec![
                ("K8S_POD_NAMESPACE".into(), "default".into()),
                ("K8S_POD_NAME".into(), "web".into()),
                ("IgnoreUnknown".into(), "1".into()),
            ],
            capability_args: Map::new(),
        };
        let env = plugin_env(
            CniCommand::Add,
            &rt,
            &["/opt/cni/bin".into(), "/usr/lib/cni".into()],
        )
        .unwrap();
        let get = |k: &str| env.iter().find(|(n, _)| *n == k).unwrap().1.clone();
        assert_eq!(get("CNI_COMMAND"), "ADD");
        assert_eq!(get("CNI_CONTAINERID"), "abc");
        assert_eq!(get("CNI_NETNS"), "/run/remora/netns/abc");
        assert_eq!(get("CNI_IFNAME"), "eth0");
        assert_eq!(
            get("CNI_ARGS"),
            "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;IgnoreUnknown=1"
        );
        assert_eq!(get("CNI_PATH"), "/opt/cni/bin:/usr/lib/cni");

        let gone = Attachment { netns: None, ..rt };
        let env = plugin_env(CniCommand::Del, &gone, &[]).unwrap();
        assert!(env.contains(&("CNI_NETNS", String::new())));

        let bad = cni_args(&[("K".into(), "a;b".into())]).unwrap_err();
        assert!(matches!(bad, CniExecError::InvalidArg { .. }), "{bad}");
    }

    #[test]
    fn parses_a_1_0_0_result_and_picks_ipv4_first() {
        let raw = json!({
            "cniVersion": "1.0.0",
            "interfaces": [
                {"name": "cni0", "mac": "aa:bb:cc:dd:ee:01"},
                {"name": "veth1234", "mac": "aa:bb:cc:dd:ee:02"},
                {"name": "eth0", "mac": "aa:bb:cc:dd:ee:03", "sandbox": "/run/netns/x"}
            ],
            "ips": [
                {"address": "fd00::5/64", "gateway": "fd00::1", "interface": 2},
                {"address": "10.1.0.5/24", "gateway": "10.1.0.1", "interface": 2},
                {"address": "10.9.0.1/24", "interface": 0}
            ],
            "routes": [{"dst": "0.0.0.0/0"}, {"dst": "10.2.0.0/16", "gw": "10.1.0.254"}],
            "dns": {"nameservers": ["10.0.0.10"], "search": ["svc.cluster.local"]}
        });
        let r = CniResult::parse(raw.clone()).unwrap();
        assert_eq!(r.raw, raw);
        assert_eq!(r.interfaces.len(), 3);
        assert_eq!(r.interfaces[2].sandbox, "/run/netns/x");
        assert_eq!(r.ips[1].address, "10.1.0.5".parse::<IpAddr>().unwrap());
        assert_eq!(r.ips[1].prefix_len, 24);
        assert_eq!(r.ips[1].gateway, Some("10.1.0.1".parse().unwrap()));
        assert_eq!(r.routes[0].dst_prefix_len, 0);
        assert_eq!(r.routes[1].gw, Some("10.1.0.254".parse().unwrap()));
        assert_eq!(r.dns.nameservers, vec!["10.0.0.10"]);
        // The host bridge's address is not a pod IP; IPv4 leads.
        let ips: Vec<String> = r.pod_ips("eth0").iter().map(|i| i.to_string()).collect();
        assert_eq!(ips, vec!["10.1.0.5", "fd00::5"]);
    }

    #[test]
    fn parses_a_0_3_1_result_without_interface_indices() {
        let raw = json!({
            "cniVersion": "0.3.1",
            "ips": [{"version": "4", "address": "10.22.0.7/16", "gateway": "10.22.0.1"}],
            "dns": {}
        });
        let r = CniResult::parse(raw).unwrap();
        assert_eq!(
            r.pod_ips("eth0"),
            vec!["10.22.0.7".parse::<IpAddr>().unwrap()]
        );
    }

    #[test]
    fn rejects_malformed_results() {
        for bad in [
            json!({"ips": [{"address": "10.1.0.5"}]}),
            json!({"ips": [{"address": "10.1.0.5/33"}]}),
            json!({"ips": [{"address": "nope/24"}]}),
            json!({"ips": [{"address": "10.1.0.5/24", "interface": 3}]}),
            json!({"routes": [{"dst": "0.0.0.0/0", "gw": "x"}]}),
            json!({"ips": "not a list"}),
        ] {
            assert!(CniResult::parse(bad.clone()).is_err(), "{bad}");
        }
    }

    fn network(version: &str, plugins: Vec<Value>) -> Network {
        let plugins: Vec<Map<String, Value>> = plugins.into_iter().map(obj).collect();
        Network {
            name: "testnet".into(),
            file: "/dev/null".into(),
            plugins: plugins.iter().map(|p| plugin_type(p).to_string()).collect(),
            config: NetworkConfigList {
                cni_version: version.into(),
                disable_check: false,
                plugins,
            },
        }
    }

    fn attachment(id: &str) -> Attachment {
        Attachment {
            container_id: id.into(),
            netns: Some("/nonexistent/netns".into()),
            ifname: "eth0".into(),
            args: vec![("IgnoreUnknown".into(), "1".into())],
            capability_args: Map::new(),
        }
    }

    /// A fake plugin: a shell script.
    fn fake_plugin(dir: &Path, name: &str, script: &str) {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn exec_in(bin: &Path, cache: &Path, timeout: Duration) -> CniExec {
        CniExec::new(vec![bin.to_path_buf()], cache.to_path_buf(), timeout)
    }

    #[tokio::test]
    async fn add_chains_prev_result_and_del_runs_in_reverse_with_the_cached_result() {
        let bin = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let log = bin.path().join("log");
        let log_s = log.display();
        let result = |ip: &str| {
            format!(
                r#"{{"cniVersion":"1.0.0","interfaces":[{{"name":"eth0","sandbox":"/x"}}],"ips":[{{"address":"{ip}/24","interface":0}}]}}"#
            )
        };
        fake_plugin(
            bin.path(),
            "first",
            &format!(
                "cat > /dev/null; echo \"first $CNI_COMMAND\" >> {log_s}\n\
                 [ \"$CNI_COMMAND\" = ADD ] && echo '{}'\nexit 0",
                result("10.250.0.8")
            ),
        );
        // The second plugin logs its stdin (to show prevResult) and replaces the result.
        fake_plugin(
            bin.path(),
            "second",
            &format!(
                "in=$(cat); echo \"second $CNI_COMMAND $in\" >> {log_s}\n\
                 [ \"$CNI_COMMAND\" = ADD ] && echo '{}'\nexit 0",
                result("10.250.0.9")
            ),
        );
        let exec = exec_in(bin.path(), cache.path(), Duration::from_secs(10));
        let net = network(
            "1.0.0",
            vec![json!({"type": "first"}), json!({"type": "second"})],
        );
        let rt = attachment("c1");
        let r = exec.add(&net, &rt).await.unwrap();
        assert_eq!(
            r.pod_ips("eth0"),
            vec!["10.250.0.9".parse::<IpAddr>().unwrap()]
        );
        let cached = exec.cache_path("testnet", &rt).unwrap();
        assert!(cached.is_file());

        exec.del(&net, &rt).await.unwrap();
        assert!(!cached.exists());
        let log = std::fs::read_to_string(&log).unwrap();
        let lines: Vec<&str> = log.lines().collect();
        assert_eq!(lines[0], "first ADD");
        assert!(lines[1].starts_with("second ADD "), "{log}");
        assert!(lines[1].contains("\"prevResult\":{"), "{log}");
        assert!(lines[1].contains("10.250.0.8"), "{log}");
        assert!(lines[2].starts_with("second DEL "), "{log}");
        assert!(
            lines[2].contains("10.250.0.9"),
            "DEL must carry the cached result: {log}"
        );
        assert_eq!(lines[3], "first DEL");

        // DEL again (nothing cached): still succeeds, now without prevResult.
        exec.del(&net, &rt).await.unwrap();
        let log = std::fs::read_to_string(bin.path().join("log")).unwrap();
        let last_second = log.lines().rfind(|l| l.starts_with("second DEL")).unwrap();
        assert!(!last_second.contains("prevResult"), "{log}");
    }

    #[tokio::test]
    async fn plugin_errors_are_typed() {
        let bin = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        fake_plugin(
            bin.path(),
            "failer",
            "cat > /dev/null; echo '{\"cniVersion\":\"1.0.0\",\"code\":7,\"msg\":\"no addresses\",\"details\":\"pool empty\"}'; exit 1",
        );
        fake_plugin(bin.path(), "crasher", "echo boom >&2; exit 3");
        fake_plugin(bin.path(), "garbage", "cat > /dev/null; echo not-json");
        let exec = exec_in(bin.path(), cache.path(), Duration::from_secs(10));
        let rt = attachment("c2");
        let err = exec
            .add(&network("1.0.0", vec![json!({"type": "failer"})]), &rt)
            .await
            .unwrap_err();
        match &err {
            CniExecError::Plugin {
                plugin,
                command,
                code,
                msg,
                details,
            } => {
                assert_eq!(plugin, "failer");
                assert_eq!(*command, CniCommand::Add);
                assert_eq!(*code, 7);
                assert_eq!(msg, "no addresses");
                assert_eq!(details, "pool empty");
            }
            other => panic!("{other}"),
        }
        let err = exec
            .add(&network("1.0.0", vec![json!({"type": "crasher"})]), &rt)
            .await
            .unwrap_err();
        assert!(
            matches!(&err, CniExecError::Exited { output, .. } if output == "boom"),
            "{err}"
        );
        let err = exec
            .add(&network("1.0.0", vec![json!({"type": "garbage"})]), &rt)
            .await
            .unwrap_err();
        assert!(matches!(err, CniExecError::InvalidResult { .. }), "{err}");
        let err = exec
            .add(&network("1.0.0", vec![json!({"type": "absent"})]), &rt)
            .await
            .unwrap_err();
        assert!(matches!(err, CniExecError::PluginNotFound { .. }), "{err}");
        let err = exec
            .add(&network("0.2.0", vec![json!({"type": "failer"})]), &rt)
            .await
            .unwrap_err();
        assert!(
            matches!(err, CniExecError::UnsupportedVersion { .. }),
            "{err}"
        );
        // Nothing was cached by the failed ADDs.
        assert_eq!(std::fs::read_dir(cache.path()).unwrap().count(), 0);
    }

    #[tokio::test]
    async fn a_hung_plugin_is_killed_with_its_children_on_timeout() {
        let bin = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let pidfile = bin.path().join("child.pid");
        // The plugin starts a child (as bridge starts host-local) and both hang.
        fake_plugin(
            bin.path(),
            "hang",
            &format!("sleep 600 & echo $! > {}; wait", pidfile.display()),
        );
        let exec = exec_in(bin.path(), cache.path(), Duration::from_millis(500));
        let err = exec
            .add(
                &network("1.0.0", vec![json!({"type": "hang"})]),
                &attachment("c3"),
            )
            .await
            .unwrap_err();
        assert!(matches!(err, CniExecError::Timeout { .. }), "{err}");
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // The grandchild got SIGKILL with the group; it disappears (or is a zombie until its
        // new parent reaps it).
        let gone = (0..50).any(|_| {
            let alive = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|s| !s.contains(") Z "))
                .unwrap_or(false);
            if alive {
                std::thread::sleep(Duration::from_millis(100));
            }
            !alive
        });
        assert!(gone, "child {pid} of a timed-out plugin survived");
    }

    #[tokio::test]
    async fn check_needs_0_4_0_and_a_cached_result() {
        let bin = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let exec = exec_in(bin.path(), cache.path(), Duration::from_secs(10));
        let rt = attachment("c4");
        let err = exec
            .check(&network("0.3.1", vec![json!({"type": "x"})]), &rt)
            .await
            .unwrap_err();
        assert!(
            matches!(err, CniExecError::CheckUnsupported { .. }),
            "{err}"
        );
        let err = exec
            .check(&network("1.0.0", vec![json!({"type": "x"})]), &rt)
            .await
            .unwrap_err();
        assert!(matches!(err, CniExecError::NoCachedResult { .. }), "{err}");
    }
}
