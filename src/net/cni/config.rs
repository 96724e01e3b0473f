//! CNI network configuration: which pod network is configured, and is it usable?
//!
//! Follows libcni's rules for picking the network: the files in the conf dir ending in
//! `.conf`, `.conflist` or `.json`, in lexical order; the first one is the pod network. A
//! `.conflist` must name the network and list at least one plugin; a `.conf` is a single plugin
//! with a `type`. Each plugin binary must exist in one of the bin dirs, so NetworkReady does not
//! claim a network that would fail on the first pod.
//!
//! The loaded [`Network`] also carries the plugin configs as raw JSON ([`NetworkConfigList`]):
//! plugins own their config schema, so remora passes every key through untouched and only adds
//! the keys the CNI spec makes the runtime's job (see [`super`]).

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use thiserror::Error;

/// The pod network that would be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Network {
    /// Network name (`name` in the config).
    pub name: String,
    /// The file it came from.
    pub file: PathBuf,
    /// Plugin types in chain order.
    pub plugins: Vec<String>,
    /// The full config, normalized to a list (a single `.conf` becomes a one-plugin list, as
    /// libcni's `ConfListFromConf` does).
    pub config: NetworkConfigList,
}

/// A network config list as the plugins will see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkConfigList {
    /// `cniVersion` of the list (empty if the file has none; checked when plugins run).
    pub cni_version: String,
    /// `disableCheck`: the network opts out of CHECK.
    pub disable_check: bool,
    /// Each plugin's config object, in chain order, exactly as written in the file.
    pub plugins: Vec<Map<String, Value>>,
}

/// Why no usable pod network is configured.
#[derive(Debug, Error)]
pub enum CniError {
    /// The conf dir cannot be listed.
    #[error("cannot read CNI conf dir {}: {source}", dir.display())]
    ReadDir {
        /// The directory.
        dir: PathBuf,
        source: std::io::Error,
    },
    /// No config file in the dir.
    #[error("no CNI network config (.conf, .conflist, .json) found in {}", dir.display())]
    NoConfig {
        /// The directory.
        dir: PathBuf,
    },
    /// The chosen file is not a valid network config.
    #[error("invalid CNI network config {}: {reason}", file.display())]
    Invalid {
        /// The file.
        file: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A plugin binary is missing.
    #[error("CNI plugin {plugin:?} of network {network:?} not found in {dirs}")]
    PluginMissing {
        /// The network.
        network: String,
        /// The plugin type.
        plugin: String,
        /// The searched dirs, comma-separated.
        dirs: String,
    },
}

/// Loads the pod network from `conf_dir` and checks its plugins exist in `bin_dirs`.
pub fn load_network(conf_dir: &Path, bin_dirs: &[PathBuf]) -> Result<Network, CniError> {
    let entries = std::fs::read_dir(conf_dir).map_err(|source| CniError::ReadDir {
        dir: conf_dir.to_path_buf(),
        source,
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_file()
                && matches!(
                    p.extension().and_then(|e| e.to_str()),
                    Some("conf" | "conflist" | "json")
                )
        })
        .collect();
    files.sort();
    let file = files.into_iter().next().ok_or_else(|| CniError::NoConfig {
        dir: conf_dir.to_path_buf(),
    })?;
    let network = parse_network(&file)?;
    for plugin in &network.plugins {
        if !bin_dirs.iter().any(|d| d.join(plugin).is_file()) {
            return Err(CniError::PluginMissing {
                network: network.name.clone(),
                plugin: plugin.clone(),
                dirs: bin_dirs
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
    }
    Ok(network)
}

fn parse_network(file: &Path) -> Result<Network, CniError> {
    let invalid = |reason: String| CniError::Invalid {
        file: file.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(file).map_err(|e| invalid(e.to_string()))?;
    let is_list = file.extension().and_then(|e| e.to_str()) == Some("conflist");
    let root: Map<String, Value> =
        serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?;
    let str_field = |key: &str| {
        root.get(key)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let name = str_field("name");
    let cni_version = str_field("cniVersion");
    let (disable_check, plugin_confs) = if is_list {
        let plugins = match root.get("plugins") {
            Some(Value::Array(items)) if !items.is_empty() => items,
            _ => return Err(invalid("\"plugins\" is missing or empty".into())),
        };
        let mut confs = Vec::with_capacity(plugins.len());
        for (i, p) in plugins.iter().enumerate() {
            match p {
                Value::Object(m) => confs.push(m.clone()),
                _ => return Err(invalid(format!("plugin {i} is not an object"))),
            }
        }
        let disable_check = root.get("disableCheck").and_then(Value::as_bool) == Some(true);
        (disable_check, confs)
    } else {
        (false, vec![root.clone()])
    };
    if name.is_empty() {
        return Err(invalid("\"name\" is missing".into()));
    }
    let plugins: Vec<String> = plugin_confs
        .iter()
        .map(|c| {
            c.get("type")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        })
        .collect();
    if let Some(i) = plugins.iter().position(|p| p.is_empty()) {
        return Err(invalid(format!("plugin {i} has no \"type\"")));
    }
    if let Some(p) = plugins
        .iter()
        .find(|p| p.contains('/') || p.as_str() == "..")
    {
        return Err(invalid(format!("plugin type {p:?} is not a plain name")));
    }
    Ok(Network {
        name,
        file: file.to_path_buf(),
        plugins,
        config: NetworkConfigList {
            cni_version,
            disable_check,
            plugins: plugin_confs,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn bins(names: &[&str]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for n in names {
            fs::write(d.path().join(n), b"#!/bin/sh\n").unwrap();
        }
        d
    }

    #[test]
    fn picks_first_file_in_lexical_order() {
        let conf = tempfile::tempdir().unwrap();
        let bin = bins(&["bridge", "portmap", "loopback"]);
        fs::write(
            conf.path().join("20-b.conflist"),
            r#"{"cniVersion":"1.0.0","name":"second","plugins":[{"type":"loopback"}]}"#,
        )
        .unwrap();
        fs::write(
            conf.path().join("10-a.conflist"),
            r#"{"cniVersion":"1.0.0","name":"first","plugins":[{"type":"bridge"},{"type":"portmap"}]}"#,
        )
        .unwrap();
        fs::write(conf.path().join("00-readme.txt"), "ignored").unwrap();
        let n = load_network(conf.path(), &[bin.path().to_path_buf()]).unwrap();
        assert_eq!(n.name, "first");
        assert_eq!(n.plugins, vec!["bridge", "portmap"]);
    }

    #[test]
    fn single_plugin_conf() {
        let conf = tempfile::tempdir().unwrap();
        let bin = bins(&["bridge"]);
        fs::write(
            conf.path().join("10-net.conf"),
            r#"{"cniVersion":"0.4.0","name":"net","type":"bridge"}"#,
        )
        .unwrap();
        let n = load_network(conf.path(), &[bin.path().to_path_buf()]).unwrap();
        assert_eq!(n.plugins, vec!["bridge"]);
        assert_eq!(n.config.cni_version, "0.4.0");
        assert_eq!(n.config.plugins.len(), 1);
        assert_eq!(n.config.plugins[0]["type"], "bridge");
    }

    #[test]
    fn conflist_keeps_plugin_configs_verbatim() {
        let conf = tempfile::tempdir().unwrap();
        let bin = bins(&["bridge", "portmap"]);
        fs::write(
            conf.path().join("10.conflist"),
            r#"{"cniVersion":"1.0.0","name":"n","disableCheck":true,"plugins":[
                {"type":"bridge","bridge":"cni0","ipam":{"type":"host-local","subnet":"10.1.0.0/16"}},
                {"type":"portmap","capabilities":{"portMappings":true}}]}"#,
        )
        .unwrap();
        let n = load_network(conf.path(), &[bin.path().to_path_buf()]).unwrap();
        assert_eq!(n.config.cni_version, "1.0.0");
        assert!(n.config.disable_check);
        assert_eq!(n.config.plugins[0]["ipam"]["subnet"], "10.1.0.0/16");
        assert_eq!(n.config.plugins[1]["capabilities"]["portMappings"], true);
    }

    #[test]
    fn empty_or_missing_dir_is_not_ready() {
        let conf = tempfile::tempdir().unwrap();
        let err = load_network(conf.path(), &[]).unwrap_err();
        assert!(matches!(err, CniError::NoConfig { .. }), "{err}");
        let err = load_network(&conf.path().join("absent"), &[]).unwrap_err();
        assert!(matches!(err, CniError::ReadDir { .. }), "{err}");
    }

    #[test]
    fn invalid_configs_are_named() {
        let bin = bins(&["bridge"]);
        for (file, text, needle) in [
            ("a.conflist", "{not json", "a.conflist"),
            ("a.conflist", r#"{"name":"x","plugins":[]}"#, "plugins"),
            ("a.conflist", r#"{"plugins":[{"type":"bridge"}]}"#, "name"),
            ("a.conf", r#"{"name":"x"}"#, "type"),
            (
                "a.conflist",
                r#"{"name":"x","plugins":[1]}"#,
                "not an object",
            ),
            (
                "a.conflist",
                r#"{"name":"x","plugins":[{"type":"../bridge"}]}"#,
                "plain name",
            ),
        ] {
            let conf = tempfile::tempdir().unwrap();
            fs::write(conf.path().join(file), text).unwrap();
            let err = load_network(conf.path(), &[bin.path().to_path_buf()]).unwrap_err();
            assert!(matches!(err, CniError::Invalid { .. }), "{text}: {err}");
            assert!(err.to_string().contains(needle), "{text}: {err}");
        }
    }

    #[test]
    fn missing_plugin_binary_is_not_ready() {
        let conf = tempfile::tempdir().unwrap();
        let bin = bins(&["bridge"]);
        fs::write(
            conf.path().join("10.conflist"),
            r#"{"name":"n","plugins":[{"type":"bridge"},{"type":"portmap"}]}"#,
        )
        .unwrap();
        let err = load_network(conf.path(), &[bin.path().to_path_buf()]).unwrap_err();
        assert!(err.to_string().contains("portmap"), "{err}");
    }
}
