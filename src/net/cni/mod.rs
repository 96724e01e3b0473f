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
//!
//! Layout: [`config`] loads the network configuration (which network, is it usable);
//! [`invoke`] runs one plugin (stdin, `CNI_*` environment, timeout, process group, errors);
//! [`result`] parses what ADD returns; [`cache`] keeps the ADD result on disk for DEL and
//! CHECK; [`template`] writes the network config from a template once kubelet names the pod
//! CIDRs; this file holds the ADD/DEL/CHECK chains over a list ([`CniExec`]).

pub mod cache;
pub mod config;
pub mod invoke;
pub mod orphans;
pub mod result;
pub mod template;
#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Map, Value};
use thiserror::Error;

use cache::{read_cache, write_cache, CacheEntry, CACHE_KIND};
pub use config::{load_network, CniError, Network};
pub use invoke::{cni_args, plugin_stdin};
pub use result::{CniResult, Interface};

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

    /// The limit of one plugin run.
    pub fn timeout(&self) -> Duration {
        self.timeout
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
    #[cfg(test)]
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
}

/// Whether `version` (one of [`SUPPORTED_VERSIONS`]) is at least 0.4.0: CHECK exists, and DEL
/// gets `prevResult`.
fn at_least_040(version: &str) -> bool {
    matches!(version, "0.4.0" | "1.0.0")
}

fn plugin_type(plugin: &Map<String, Value>) -> &str {
    // config::load_network rejects lists with a plugin lacking a string `type`; should one get here
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
