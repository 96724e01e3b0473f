//! Pods with a user namespace of their own, on the test bed (the pinned runc, the overlayfs
//! snapshotter's idmapped layers, the handler of `REMORA_IT_HANDLER`).

use std::path::PathBuf;
use std::time::Duration;

use remora::cri::v1;
use tonic::Code;

use crate::cri;
use crate::harness::BedRemora;

/// Host IDs of the test pods (0 inside): above anything the test machines hand out.
const HOST_ID: u32 = 1_200_000;
const LENGTH: u32 = 65536;

fn userns() -> v1::UserNamespace {
    let map = vec![v1::IdMapping {
        container_id: 0,
        host_id: HOST_ID,
        length: LENGTH,
    }];
    v1::UserNamespace {
        mode: v1::NamespaceMode::Pod as i32,
        uids: map.clone(),
        gids: map,
    }
}

fn with_userns(mut config: v1::PodSandboxConfig) -> v1::PodSandboxConfig {
    let linux = config.linux.get_or_insert_with(Default::default);
    let sc = linux.security_context.get_or_insert_with(Default::default);
    sc.namespace_options
        .get_or_insert_with(Default::default)
        .userns_options = Some(userns());
    config
}

#[tokio::test]
async fn a_user_namespaced_pod_sees_its_maps_and_owns_its_rootfs_and_files() {
    let bed = BedRemora::start_with_network();
    let status = cri::runtime_status(&bed.remora, false).await;
    let default = status
        .runtime_handlers
        .iter()
        .find(|h| h.name.is_empty())
        .expect("the default handler");
    assert!(
        default.features.as_ref().is_some_and(|f| f.user_namespaces),
        "the pinned runc has idmapped mounts: {status:?}"
    );
    cri::pull(&bed.remora, "busybox").await.expect("pull");
    let logs = crate::harness::scratch();
    let config = with_userns(cri::pod_config("userns", logs.path(), false));
    let pod = cri::run_pod(&bed.remora, &config)
        .await
        .expect("RunPodSandbox");

    // What the container sees: the maps, its rootfs, pod files and /dev/shm owned by its root
    // (idmapped, not `nobody`), a file it writes is its root's.
    let mut c = cri::shell_container(
        "probe",
        "cat /proc/self/uid_map /proc/self/gid_map; id -u; \
         ls -lnd / /bin /etc/hosts /etc/resolv.conf /dev/shm | awk '{print $3, $4, $NF}'; \
         touch /tmp/mine && ls -ln /tmp/mine | awk '{print $3, $4, $NF}'; \
         echo reopened > /dev/stdout",
    );
    c.linux
        .get_or_insert_with(Default::default)
        .security_context
        .get_or_insert_with(Default::default)
        .namespace_options = config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.clone());
    let id = cri::create_and_start(&bed.remora, &pod, &config, c).await;
    let s = cri::wait_exited(&bed.remora, &id, Duration::from_secs(30)).await;
    let log = std::fs::read_to_string(logs.path().join("probe.log")).expect("log");
    let out: Vec<String> = log
        .lines()
        .filter_map(|l| l.splitn(4, ' ').nth(3))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    assert_eq!(s.exit_code, 0, "{log}");
    assert_eq!(
        out,
        [
            format!("0 {HOST_ID} {LENGTH}"),
            format!("0 {HOST_ID} {LENGTH}"),
            "0".to_string(),
            "0 0 /".to_string(),
            "0 0 /bin".to_string(),
            "0 0 /dev/shm".to_string(),
            "0 0 /etc/hosts".to_string(),
            "0 0 /etc/resolv.conf".to_string(),
            "0 0 /tmp/mine".to_string(),
            // Its stdout reopened by path: the shim's pipe is usable by the pod's root.
            "reopened".to_string(),
        ],
        "{log}"
    );

    // The pod's network namespace and its pinned owner are gone with the pod.
    let verbose = bed
        .remora
        .runtime()
        .pod_sandbox_status(v1::PodSandboxStatusRequest {
            pod_sandbox_id: pod.clone(),
            verbose: true,
        })
        .await
        .expect("PodSandboxStatus")
        .into_inner();
    let info: serde_json::Value =
        serde_json::from_str(&verbose.info["info"]).expect("verbose info");
    let netns = PathBuf::from(info["netnsPath"].as_str().expect("netnsPath"));
    let mut pin = netns.clone().into_os_string();
    pin.push(".userns");
    let pin = PathBuf::from(pin);
    assert!(netns.exists() && pin.exists(), "{netns:?} {pin:?}");
    cri::remove_pod(&bed.remora, &pod).await;
    assert!(!netns.exists() && !pin.exists(), "{netns:?} {pin:?}");
}

#[tokio::test]
async fn a_handler_without_user_namespaces_refuses_such_a_pod_and_makes_nothing() {
    // crun 1.8 cannot say what it supports (no `features` command): its handler claims nothing.
    let bed = BedRemora::start_with_network();
    let logs = crate::harness::scratch();
    let config = with_userns(cri::pod_config("userns-crun", logs.path(), false));
    let err = bed
        .remora
        .runtime()
        .run_pod_sandbox(v1::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: "crun".into(),
        })
        .await
        .expect_err("crun cannot run a user-namespaced pod here");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("user namespaces"), "{err:?}");
    assert!(cri::list_pods(&bed.remora).await.is_empty());
}
