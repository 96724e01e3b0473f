//! Version, Status, RuntimeConfig, and UNIMPLEMENTED for everything not built yet.

use std::time::Duration;

use remora::cri::v1;
use tonic::Code;

use crate::cri;
use crate::harness::{wait_until, Bed};

fn condition(resp: &v1::StatusResponse, kind: &str) -> v1::RuntimeCondition {
    resp.status
        .as_ref()
        .expect("status present")
        .conditions
        .iter()
        .find(|c| c.r#type == kind)
        .unwrap_or_else(|| panic!("no {kind} condition in {resp:?}"))
        .clone()
}

#[tokio::test]
async fn version_names_remora_and_cri_v1() {
    let bed = Bed::start("");
    let v = bed
        .remora
        .runtime()
        .version(v1::VersionRequest {
            version: "v1".into(),
        })
        .await
        .expect("Version")
        .into_inner();
    assert_eq!(v.runtime_name, "remora");
    assert_eq!(v.runtime_api_version, "v1");
    assert_eq!(v.version, "0.1.0");
    assert_eq!(v.runtime_version, env!("CARGO_PKG_VERSION"));
}

#[tokio::test]
async fn runtime_config_reports_the_configured_cgroup_driver() {
    let bed = Bed::start("");
    let rc = bed
        .remora
        .runtime()
        .runtime_config(v1::RuntimeConfigRequest {})
        .await
        .expect("RuntimeConfig")
        .into_inner();
    assert_eq!(
        rc.linux.expect("linux config").cgroup_driver,
        v1::CgroupDriver::Cgroupfs as i32
    );

    let bed = Bed::start("[runtime]\ncgroup_driver = \"systemd\"\n");
    let rc = bed
        .remora
        .runtime()
        .runtime_config(v1::RuntimeConfigRequest {})
        .await
        .expect("RuntimeConfig")
        .into_inner();
    assert_eq!(
        rc.linux.expect("linux config").cgroup_driver,
        v1::CgroupDriver::Systemd as i32
    );
}

#[tokio::test]
async fn runtime_ready_flips_when_containerd_stops_and_returns() {
    let mut bed = Bed::start("");
    let status = cri::runtime_status(&bed.remora, false).await;
    let ready = condition(&status, "RuntimeReady");
    assert!(ready.status, "{ready:?}");
    assert!(status.info.is_empty(), "info is only for verbose requests");

    bed.containerd.stop();
    let status = cri::runtime_status(&bed.remora, false).await;
    let ready = condition(&status, "RuntimeReady");
    assert!(!ready.status, "containerd is stopped: {ready:?}");
    assert_eq!(ready.reason, "ContainerdUnreachable");
    assert!(
        ready
            .message
            .contains(&bed.containerd.socket().display().to_string()),
        "message names containerd's socket: {}",
        ready.message
    );

    bed.containerd.restart();
    wait_until(
        "RuntimeReady after containerd restart",
        Duration::from_secs(20),
        || async {
            condition(
                &cri::runtime_status(&bed.remora, false).await,
                "RuntimeReady",
            )
            .status
        },
    )
    .await;
    // remora logged the outage once and each recovery once, not every probe. The log is
    // written asynchronously: wait for the recovery's line before counting.
    wait_until(
        "the recovery's log line",
        Duration::from_secs(20),
        || async {
            bed.remora
                .log_text()
                .matches("containerd is reachable")
                .count()
                >= 2
        },
    )
    .await;
    let log = bed.remora.log_text();
    assert_eq!(log.matches("containerd is unreachable").count(), 1, "{log}");
    assert_eq!(log.matches("containerd is reachable").count(), 2, "{log}");
}

#[tokio::test]
async fn containerd_down_at_start_is_reported_then_picked_up() {
    let dir = crate::harness::scratch();
    let mut containerd = crate::harness::Containerd::start(dir.path());
    containerd.stop();
    let _ = std::fs::remove_file(containerd.socket());
    let socket = dir.path().join("remora.sock");
    let config =
        crate::harness::remora_config(&socket, &containerd.socket(), &dir.path().join("net.d"), "");
    let remora = crate::harness::Remora::start(dir.path(), &config, &socket);
    // remora serves even though containerd is absent.
    let v = remora
        .runtime()
        .version(v1::VersionRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(v.runtime_name, "remora");
    let s = cri::runtime_status(&remora, false).await;
    assert!(!condition(&s, "RuntimeReady").status);

    containerd.restart();
    wait_until(
        "RuntimeReady once containerd starts",
        Duration::from_secs(20),
        || async { condition(&cri::runtime_status(&remora, false).await, "RuntimeReady").status },
    )
    .await;
    drop(remora);
    drop(containerd);
}

#[tokio::test]
async fn network_ready_follows_the_cni_conf_dir() {
    let bed = Bed::start("");
    let s = cri::runtime_status(&bed.remora, false).await;
    let net = condition(&s, "NetworkReady");
    assert!(!net.status);
    assert_eq!(net.reason, "NetworkPluginNotReady");

    let conf_dir = bed.dir.path().join("net.d");
    std::fs::create_dir_all(&conf_dir).unwrap();
    std::fs::write(
        conf_dir.join("10-test.conflist"),
        r#"{"cniVersion":"1.0.0","name":"test","plugins":[{"type":"bridge","bridge":"t0"},{"type":"portmap","capabilities":{"portMappings":true}}]}"#,
    )
    .unwrap();
    let s = cri::runtime_status(&bed.remora, true).await;
    let net = condition(&s, "NetworkReady");
    assert!(net.status, "{net:?}");
    let info: serde_json::Value = serde_json::from_str(&s.info["network"]).unwrap();
    assert_eq!(info["name"], "test");
    let config: serde_json::Value = serde_json::from_str(&s.info["config"]).unwrap();
    assert_eq!(
        config["cni"]["conf_dir"],
        conf_dir.display().to_string(),
        "verbose info carries the effective config"
    );

    std::fs::remove_file(conf_dir.join("10-test.conflist")).unwrap();
    let s = cri::runtime_status(&bed.remora, false).await;
    assert!(!condition(&s, "NetworkReady").status);
}

/// kubelet's pod CIDR reaches the network: with `[cni] conf_template`, UpdateRuntimeConfig
/// renders the conf dir's network from it and NetworkReady turns true; a bad CIDR is
/// INVALID_ARGUMENT naming it; no CIDR, or a network already there, changes nothing.
#[tokio::test]
async fn update_runtime_config_renders_the_cni_template() {
    let templates = crate::harness::scratch();
    let template = templates.path().join("net.json");
    std::fs::write(
        &template,
        r#"{"cniVersion":"1.0.0","name":"from-template","plugins":[{"type":"bridge",
  "bridge":"rmt0","ipam":{"type":"host-local","ranges":{{.PodCIDRRanges}},
  "routes":{{.Routes}}}}]}"#,
    )
    .unwrap();
    let bed = Bed::start_edited("", |config| {
        config.replacen(
            "bin_dirs = [\"/usr/lib/cni\"]\n",
            &format!(
                "bin_dirs = [\"/usr/lib/cni\"]\nconf_template = \"{}\"\n",
                template.display()
            ),
            1,
        )
    });
    let update = |cidr: &str| v1::UpdateRuntimeConfigRequest {
        runtime_config: Some(v1::RuntimeConfig {
            network_config: Some(v1::NetworkConfig {
                pod_cidr: cidr.into(),
            }),
        }),
    };
    let mut rt = bed.remora.runtime();
    let s = cri::runtime_status(&bed.remora, false).await;
    assert!(!condition(&s, "NetworkReady").status);

    rt.update_runtime_config(v1::UpdateRuntimeConfigRequest::default())
        .await
        .expect("no CIDR: nothing to do");
    let err = rt
        .update_runtime_config(update("10.77.0.0/99"))
        .await
        .expect_err("a bad CIDR");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("10.77.0.0/99"), "{err:?}");
    assert!(
        !condition(
            &cri::runtime_status(&bed.remora, false).await,
            "NetworkReady"
        )
        .status
    );

    rt.update_runtime_config(update("10.77.0.0/24"))
        .await
        .expect("UpdateRuntimeConfig");
    let s = cri::runtime_status(&bed.remora, true).await;
    assert!(condition(&s, "NetworkReady").status, "{s:?}");
    let info: serde_json::Value = serde_json::from_str(&s.info["network"]).unwrap();
    assert_eq!(info["name"], "from-template");
    let file = bed.dir.path().join("net.d/10-remora-net.conflist");
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(
        written["plugins"][0]["ipam"]["ranges"],
        serde_json::json!([[{"subnet": "10.77.0.0/24"}]])
    );

    // The network is there now: a later CIDR leaves it alone, as containerd does.
    rt.update_runtime_config(update("10.78.0.0/24"))
        .await
        .expect("UpdateRuntimeConfig with a network present");
    assert!(!std::fs::read_to_string(&file)
        .unwrap()
        .contains("10.78.0.0"));
}

#[tokio::test]
async fn status_lists_the_runtime_handlers_and_the_default_under_the_empty_name() {
    let names = |s: &v1::StatusResponse| -> Vec<String> {
        s.runtime_handlers.iter().map(|h| h.name.clone()).collect()
    };
    let bed = Bed::start("[runtime]\ndefault_handler = \"remora\"\n");
    let s = cri::runtime_status(&bed.remora, false).await;
    assert_eq!(names(&s), ["crun", "remora", "", "runc"]);
    // Asked of each OCI runtime (`runc features`): the pinned runc has the rro option and
    // idmapped mounts (and this kernel mount_setattr and idmapped overlay layers); crun 1.8
    // cannot say, so it claims nothing.
    for h in &s.runtime_handlers {
        let f = h.features.as_ref().expect("features present");
        assert_eq!(f.recursive_read_only_mounts, h.name != "crun", "{h:?}");
        assert_eq!(f.user_namespaces, h.name != "crun", "{h:?}");
    }
    assert!(
        s.features
            .as_ref()
            .is_some_and(|f| f.supplemental_groups_policy
                && f.user_namespaces_host_network
                && f.mount_options),
        "{s:?}"
    );

    let bed = Bed::start(
        "[runtime]\ndefault_handler = \"fast\"\n\
         [runtime.handlers.fast]\nruntime_type = \"io.containerd.remora.v2\"\n",
    );
    let s = cri::runtime_status(&bed.remora, false).await;
    assert_eq!(names(&s), ["fast", ""]);
}

/// Asserts `result` is UNIMPLEMENTED naming `rpc`.
fn assert_unimplemented<T: std::fmt::Debug>(rpc: &str, result: Result<T, tonic::Status>) {
    match result {
        Ok(v) => panic!("{rpc} succeeded but is not implemented: {v:?}"),
        Err(s) => {
            assert_eq!(s.code(), Code::Unimplemented, "{rpc}: {s:?}");
            assert!(
                s.message().contains(rpc),
                "{rpc}: message {:?} must name the RPC",
                s.message()
            );
        }
    }
}

#[tokio::test]
async fn every_rpc_not_built_yet_is_unimplemented_with_its_name() {
    let bed = Bed::start("");
    let mut rt = bed.remora.runtime();
    assert_unimplemented(
        "CheckpointContainer",
        rt.checkpoint_container(v1::CheckpointContainerRequest::default())
            .await,
    );
}
