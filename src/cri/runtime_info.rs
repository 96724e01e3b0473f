//! Version, Status and RuntimeConfig: what remora is and whether it can run pods now.

use std::collections::BTreeMap;

use crate::config::{CgroupDriver, Config};
use crate::containerd::health::HealthMonitor;
use crate::cri::error::CriError;
use crate::lifecycle::RuntimeHandlers;
use crate::net::cni;

/// The runtime name reported by `Version`.
pub const RUNTIME_NAME: &str = "remora";
/// `VersionResponse.version`: the version of the kubelet runtime API, which the CRI defines as
/// "0.1.0" for every v1 runtime.
pub const KUBELET_API_VERSION: &str = "0.1.0";
/// The CRI API version served.
pub const CRI_API_VERSION: &str = "v1";
/// Condition type: the runtime can run containers.
pub const RUNTIME_READY: &str = "RuntimeReady";
/// Condition type: pod networking is configured.
pub const NETWORK_READY: &str = "NetworkReady";

/// `Version`'s answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionInfo {
    /// The kubelet runtime API version.
    pub version: &'static str,
    /// `remora`.
    pub runtime_name: &'static str,
    /// remora's own version.
    pub runtime_version: &'static str,
    /// `v1`.
    pub runtime_api_version: &'static str,
}

/// One runtime condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    /// `RuntimeReady` or `NetworkReady`.
    pub kind: &'static str,
    /// Whether the condition holds.
    pub status: bool,
    /// CamelCase reason when it does not.
    pub reason: String,
    /// Human-readable detail when it does not.
    pub message: String,
}

/// One runtime handler as `Status` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerInfo {
    /// The CRI handler name; `""` is the default handler.
    pub name: String,
    /// Whether the handler supports recursive read-only mounts.
    pub recursive_read_only_mounts: bool,
    /// Whether the handler supports user namespaces (with idmap mounts).
    pub user_namespaces: bool,
}

/// `Status`'s answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusReport {
    /// RuntimeReady then NetworkReady.
    pub conditions: Vec<Condition>,
    /// The configured handlers in name order, the default one repeated under `""` right after
    /// it (as containerd's CRI reports them, `internal/cri/server/status.go`).
    pub handlers: Vec<HandlerInfo>,
    /// Whether `SupplementalGroupsPolicy` (`Merge` and `Strict`) is honoured: always, the
    /// image's `/etc/group` is read for `Merge` and left out for `Strict`
    /// ([`crate::spec::user`]).
    pub supplemental_groups_policy: bool,
    /// Whether a pod can have a user namespace of its own on the host's network: always on
    /// Linux, as in containerd 2.3 (the host's `/sys` is bound read-only in place of a sysfs
    /// mount, [`crate::spec`]); a handler without user namespaces still refuses such a pod.
    pub user_namespaces_host_network: bool,
    /// Whether `Mount.mount_options` (`noexec`, `nodev`, `nosuid`) are applied: always, on the
    /// bind ([`crate::cri::convert`]); the OCI runtime remounts the bind with them.
    pub mount_options: bool,
    /// JSON values by key; filled only for verbose requests.
    pub info: BTreeMap<String, String>,
}

/// `Version`.
pub fn version() -> VersionInfo {
    VersionInfo {
        version: KUBELET_API_VERSION,
        runtime_name: RUNTIME_NAME,
        runtime_version: env!("CARGO_PKG_VERSION"),
        runtime_api_version: CRI_API_VERSION,
    }
}

/// `Status`: RuntimeReady is true only if containerd answers a probe made now; NetworkReady only
/// if a valid CNI network config with all its plugins is present now.
pub async fn status(
    config: &Config,
    health: &HealthMonitor,
    handlers: &RuntimeHandlers,
    verbose: bool,
) -> Result<StatusReport, CriError> {
    let containerd = health.probe().await;
    let runtime = match &containerd {
        Ok(_) => ready(RUNTIME_READY),
        Err(e) => Condition {
            kind: RUNTIME_READY,
            status: false,
            reason: "ContainerdUnreachable".into(),
            message: e.to_string(),
        },
    };

    let cni_conf = config.cni.clone();
    // Reading the conf dir is blocking file I/O; keep it off the async workers.
    let network_result = tokio::task::spawn_blocking(move || {
        cni::load_network(&cni_conf.conf_dir, &cni_conf.bin_dirs)
    })
    .await;
    let network_result = match network_result {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(join) => Err(format!("loading the CNI config panicked: {join}")),
    };
    let network = match &network_result {
        Ok(_) => ready(NETWORK_READY),
        Err(msg) => Condition {
            kind: NETWORK_READY,
            status: false,
            reason: "NetworkPluginNotReady".into(),
            message: format!("network plugin is not ready: {msg}"),
        },
    };

    let mut info = BTreeMap::new();
    if verbose {
        info.insert("config".into(), config.to_json());
        let containerd_info = match &containerd {
            Ok(v) => serde_json::json!({
                "address": config.containerd.address,
                "namespace": config.containerd.namespace,
                "version": v.version,
                "revision": v.revision,
            }),
            Err(e) => serde_json::json!({
                "address": config.containerd.address,
                "namespace": config.containerd.namespace,
                "error": e.to_string(),
            }),
        };
        info.insert("containerd".into(), containerd_info.to_string());
        let network_info = match &network_result {
            Ok(n) => serde_json::json!({"name": n.name, "file": n.file, "plugins": n.plugins}),
            Err(msg) => serde_json::json!({ "error": msg }),
        };
        info.insert("network".into(), network_info.to_string());
    }
    Ok(StatusReport {
        conditions: vec![runtime, network],
        handlers: runtime_handlers(handlers),
        supplemental_groups_policy: true,
        user_namespaces_host_network: true,
        mount_options: true,
        info,
    })
}

/// The handlers `Status` reports: one per configured handler with what its OCI runtime
/// supports (probed at start-up, [`crate::oci::features`]), and the default one
/// again under the name `""`.
pub fn runtime_handlers(handlers: &RuntimeHandlers) -> Vec<HandlerInfo> {
    let mut out = Vec::new();
    for (name, features) in handlers.features() {
        let info = HandlerInfo {
            name: name.to_string(),
            recursive_read_only_mounts: features.recursive_read_only_mounts,
            user_namespaces: features.user_namespaces,
        };
        let is_default = name == handlers.default_name();
        out.push(info.clone());
        if is_default {
            out.push(HandlerInfo {
                name: String::new(),
                ..info
            });
        }
    }
    out
}

/// `UpdateRuntimeConfig`: kubelet names the node's pod CIDRs (comma-separated); the network
/// config is rendered from `[cni] conf_template` unless a usable one is already loaded
/// ([`cni::template`]).
pub async fn update_runtime_config(
    config: &Config,
    pod_cidrs: &str,
) -> Result<cni::template::Applied, CriError> {
    let cni_conf = config.cni.clone();
    let cidrs = pod_cidrs.to_string();
    tokio::task::spawn_blocking(move || {
        let ready = cni::load_network(&cni_conf.conf_dir, &cni_conf.bin_dirs).is_ok();
        cni::template::apply(&cni_conf.conf_dir, &cni_conf.conf_template, &cidrs, ready)
    })
    .await
    .map_err(|_| CriError::Aborted {
        what: "rendering the CNI config template",
    })?
    .map_err(CriError::CniTemplate)
}

/// `RuntimeConfig`: the cgroup driver kubelet must use.
pub fn runtime_config(config: &Config) -> CgroupDriver {
    config.runtime.cgroup_driver
}

fn ready(kind: &'static str) -> Condition {
    Condition {
        kind,
        status: true,
        reason: String::new(),
        message: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend_error::BackendError;
    use crate::containerd::health::ProbeSchedule;
    use crate::containerd::{ContainerdVersion, VersionApi};
    use crate::lifecycle::handlers::HandlerFeatures;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    struct Switch(AtomicBool);

    #[async_trait::async_trait]
    impl VersionApi for Switch {
        async fn version(&self, timeout: Duration) -> Result<ContainerdVersion, BackendError> {
            if self.0.load(Ordering::SeqCst) {
                Ok(ContainerdVersion {
                    version: "v2.3.4".into(),
                    revision: "abc".into(),
                })
            } else {
                Err(BackendError::Timeout {
                    address: "/run/c.sock".into(),
                    after: timeout,
                })
            }
        }
    }

    fn runtime(
        up: bool,
        conf_dir: &std::path::Path,
        bin_dir: &std::path::Path,
    ) -> ((Config, HealthMonitor), Arc<Switch>) {
        let mut config = Config::default();
        config.cni.conf_dir = conf_dir.to_path_buf();
        config.cni.bin_dirs = vec![bin_dir.to_path_buf()];
        let switch = Arc::new(Switch(AtomicBool::new(up)));
        let log = slog::Logger::root(slog::Discard, slog::o!());
        let health = HealthMonitor::new(
            switch.clone(),
            ProbeSchedule {
                timeout: Duration::from_secs(1),
                interval: Duration::from_secs(5),
                down_interval: Duration::from_millis(100),
            },
            log,
        );
        ((config, health), switch)
    }

    fn handlers_of(c: &Config, features: &[(&str, HandlerFeatures)]) -> RuntimeHandlers {
        let features = features.iter().map(|(n, f)| (n.to_string(), *f)).collect();
        crate::server::runtime_handlers(&c.runtime, &features)
    }

    #[test]
    fn handlers_are_reported_with_the_default_repeated_under_the_empty_name() {
        let mut config = Config::default();
        let names = |c: &Config| -> Vec<String> {
            runtime_handlers(&handlers_of(c, &[]))
                .into_iter()
                .map(|h| h.name)
                .collect()
        };
        assert_eq!(names(&config), ["crun", "remora", "", "runc"]);
        config.runtime.default_handler = "crun".into();
        assert_eq!(names(&config), ["crun", "", "remora", "runc"]);
        config.runtime.handlers.remove("remora");
        config.runtime.handlers.remove("runc");
        assert_eq!(names(&config), ["crun", ""]);
        assert!(runtime_handlers(&handlers_of(&config, &[]))
            .iter()
            .all(|h| !h.recursive_read_only_mounts && !h.user_namespaces));
    }

    #[test]
    fn handler_features_are_reported_as_probed_the_default_twice() {
        let config = Config::default();
        let rro = HandlerFeatures {
            recursive_read_only_mounts: true,
            user_namespaces: false,
        };
        let report = runtime_handlers(&handlers_of(&config, &[("runc", rro), ("remora", rro)]));
        let rro_of = |name: &str| {
            report
                .iter()
                .find(|h| h.name == name)
                .map(|h| h.recursive_read_only_mounts)
        };
        assert_eq!(rro_of("runc"), Some(true));
        assert_eq!(rro_of(""), Some(true), "the default handler is runc");
        assert_eq!(rro_of("remora"), Some(true));
        assert_eq!(
            rro_of("crun"),
            Some(false),
            "crun was not probed as supporting it"
        );
    }

    #[test]
    fn version_names_remora_and_v1() {
        let v = version();
        assert_eq!(v.runtime_name, "remora");
        assert_eq!(v.runtime_api_version, "v1");
        assert_eq!(v.version, "0.1.0");
        assert_eq!(v.runtime_version, env!("CARGO_PKG_VERSION"));
    }

    #[tokio::test]
    async fn runtime_ready_follows_containerd_and_network_follows_cni_conf() {
        let conf = tempfile::tempdir().unwrap();
        let bin = tempfile::tempdir().unwrap();
        let (rt, switch) = runtime(false, conf.path(), bin.path());

        let handlers = handlers_of(&rt.0, &[]);
        let s = status(&rt.0, &rt.1, &handlers, false).await.unwrap();
        assert_eq!(s.conditions[0].kind, RUNTIME_READY);
        assert!(!s.conditions[0].status);
        assert_eq!(s.conditions[0].reason, "ContainerdUnreachable");
        assert!(
            s.conditions[0].message.contains("/run/c.sock"),
            "{}",
            s.conditions[0].message
        );
        assert_eq!(s.conditions[1].kind, NETWORK_READY);
        assert!(!s.conditions[1].status);
        assert!(s.conditions[1].message.contains("no CNI network config"));
        assert!(s.info.is_empty(), "info must be empty unless verbose");
        // Handlers do not depend on containerd being reachable.
        assert_eq!(s.handlers, runtime_handlers(&handlers));
        assert_eq!(s.handlers.len(), 4);
        assert!(s.supplemental_groups_policy);
        assert!(s.user_namespaces_host_network && s.mount_options);

        switch.0.store(true, Ordering::SeqCst);
        std::fs::write(bin.path().join("bridge"), "").unwrap();
        std::fs::write(
            conf.path().join("10.conflist"),
            r#"{"name":"pods","plugins":[{"type":"bridge"}]}"#,
        )
        .unwrap();
        let s = status(&rt.0, &rt.1, &handlers, true).await.unwrap();
        assert!(s.conditions[0].status && s.conditions[0].reason.is_empty());
        assert!(s.conditions[1].status, "{:?}", s.conditions[1]);
        let cfg: serde_json::Value = serde_json::from_str(&s.info["config"]).unwrap();
        assert_eq!(cfg["containerd"]["namespace"], "remora");
        let ctd: serde_json::Value = serde_json::from_str(&s.info["containerd"]).unwrap();
        assert_eq!(ctd["version"], "v2.3.4");
        let net: serde_json::Value = serde_json::from_str(&s.info["network"]).unwrap();
        assert_eq!(net["name"], "pods");
    }
}
