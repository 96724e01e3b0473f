//! Where plugin connections come from: the socket (created, bound, accepted on, within
//! [`MAX_PLUGINS`] and [`MAX_PENDING_REGISTRATIONS`]) and the plugin directory, whose
//! plugins are launched each with a connected socket (`launch`). Each connection gets its
//! own handshake task.

use std::io;
use std::os::unix::fs::{DirBuilderExt as _, FileTypeExt as _, PermissionsExt as _};
use std::path::Path;
use std::sync::{Arc, Weak};
use std::time::Duration;

use slog::{info, o, warn};
use tokio::net::UnixListener;
use tokio::sync::watch;

use super::handshake::Launched;
use super::{
    launch, lock, stopping, Registry, RegistryError, MAX_PENDING_REGISTRATIONS, MAX_PLUGINS,
};

impl Registry {
    /// Launches the plugins of the plugin directory, each with a handshake task. Logs what it
    /// skips, once each.
    pub(super) fn launch_plugins(self: &Arc<Self>) {
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
}

/// Accepts connections until the shutdown signal or the registry's drop.
pub(super) async fn accept_loop(
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
pub(super) fn bind(path: &Path) -> Result<UnixListener, RegistryError> {
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
