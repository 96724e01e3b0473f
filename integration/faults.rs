//! remora dies at the worst moment (failpoints: `REMORA_FAILPOINTS`), or handling an exit
//! keeps failing: after a restart nothing is half made, and every exit is recorded once.

use std::path::Path;
use std::time::{Duration, Instant};

use remora::cri::v1;
use tokio_stream::StreamExt;

use crate::cri;
use crate::harness::{
    certs_dir, push_image, scratch, wait_until, BedRemora, HoldingProxy, PushedImage,
};
use crate::testbed::TESTBED_CERTS;

/// The test bed network's host-local IPAM dir (see scripts/testbed.sh).
const IPAM_DIR: &str = "/run/remora-testbed/cni/networks/remora-testbed";

/// Ids of the operations that were in flight when remora died (its intent files).
fn pending_ids(bed: &BedRemora) -> Vec<String> {
    std::fs::read_dir(bed.state_dir().join("pending"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| {
                    e.file_name()
                        .to_str()
                        .and_then(|n| n.strip_suffix(".json"))
                        .map(String::from)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Keys of active (container rootfs) snapshots in the remora's namespace.
fn active_snapshots(bed: &BedRemora) -> Vec<String> {
    bed.ctr(&["snapshots", "ls"])
        .lines()
        .skip(1)
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            (cols.last() == Some(&"Active")).then(|| cols[0].to_string())
        })
        .collect()
}

/// remora's leases in its namespace.
fn remora_leases(bed: &BedRemora) -> Vec<String> {
    bed.ctr_ids(&["leases", "ls", "-q"])
        .into_iter()
        .filter(|l| l.starts_with("remora-"))
        .collect()
}

/// Whether the test bed's IPAM holds an address for container `id`.
fn ipam_holds(id: &str) -> bool {
    std::fs::read_dir(IPAM_DIR)
        .map(|d| {
            d.flatten()
                .any(|e| std::fs::read_to_string(e.path()).is_ok_and(|s| s.contains(id)))
        })
        .unwrap_or(false)
}

/// Whether a CNI plugin run for pod `id` is still running (its `CNI_CONTAINERID`).
fn cni_plugin_running(id: &str) -> bool {
    let want = format!("CNI_CONTAINERID={id}");
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten().any(|e| {
                std::fs::read(e.path().join("environ"))
                    .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == want.as_bytes()))
            })
        })
        .unwrap_or(false)
}

/// Restarts remora without failpoints and waits until its sweep consumed every intent.
async fn restart_and_sweep(bed: &mut BedRemora, what: &str) {
    bed.restart();
    let bed = &*bed;
    wait_until(what, Duration::from_secs(30), || async {
        pending_ids(bed).is_empty()
    })
    .await;
}

/// Restarts remora with `failpoint=kill` armed.
fn arm(bed: &mut BedRemora, failpoint: &str) {
    bed.crash();
    bed.restart_env(&[("REMORA_FAILPOINTS", &format!("{failpoint}=kill"))]);
}

/// After a call that hit the armed failpoint: remora died of it; returns the id of the
/// operation it left half made.
fn killed(bed: &mut BedRemora, failpoint: &str, result: Result<String, tonic::Status>) -> String {
    let err = result.expect_err("remora dies in the middle of the call");
    assert!(
        matches!(
            err.code(),
            tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Internal
        ),
        "{failpoint}: {err:?}"
    );
    let status = bed.remora.wait_exit(Duration::from_secs(10));
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "{failpoint}: killed by its failpoint"
    );
    let ids = pending_ids(bed);
    assert_eq!(
        ids.len(),
        1,
        "{failpoint}: one operation in flight: {ids:?}"
    );
    ids[0].clone()
}

#[tokio::test]
async fn remora_killed_mid_run_pod_sandbox_leaves_nothing_after_restart() {
    let mut bed = BedRemora::start_with_network();
    let logs = scratch();
    for point in [
        "sandbox.after_network",
        "sandbox.after_snapshot",
        "sandbox.after_task",
    ] {
        let name = format!("half-{}", point.replace(['.', '_'], "-"));
        let config = cri::pod_config(&name, logs.path(), false);
        arm(&mut bed, point);
        let r = cri::run_pod(&bed.remora, &config).await;
        let id = killed(&mut bed, point, r);

        // Half made, as the failpoint's place says. CNI ADD runs beside the pause container's
        // creation: at `after_network` the other branch may have made anything up to the task
        // (or died in the middle of a containerd call); at `after_snapshot` CNI ADD may be
        // running still: its plugins outlive remora, as they would any crash, and the sweep
        // waits for them (its DEL must come after them).
        let netns = bed.state_dir().join("netns").join(&id);
        assert!(netns.exists(), "{point}: the pod's netns exists");
        if point != "sandbox.after_snapshot" {
            assert!(ipam_holds(&id), "{point}: CNI ADD allocated an address");
        }
        if point != "sandbox.after_network" {
            assert!(active_snapshots(&bed).contains(&id), "{point}: snapshot");
        }
        if point == "sandbox.after_task" {
            assert!(bed.ctr_ids(&["containers", "ls", "-q"]).contains(&id));
            assert!(
                bed.ctr(&["tasks", "ls"]).contains(&id),
                "a created pause task"
            );
        }

        restart_and_sweep(&mut bed, "the sweep of the half-made pod").await;
        assert!(
            !cni_plugin_running(&id),
            "{point}: DEL came after ADD's plugins"
        );
        assert!(!netns.exists(), "{point}: netns removed");
        assert!(!ipam_holds(&id), "{point}: CNI DEL released the address");
        assert!(!active_snapshots(&bed).contains(&id), "{point}: snapshot");
        assert!(
            bed.ctr_ids(&["containers", "ls", "-q"]).is_empty(),
            "{point}"
        );
        assert!(!bed.ctr(&["tasks", "ls"]).contains(&id), "{point}: task");
        assert_eq!(remora_leases(&bed), Vec::<String>::new(), "{point}: leases");
        assert!(!bed.state_dir().join("sandboxes").join(&id).exists());
        let pods = cri::list_pods(&bed.remora).await;
        assert!(pods.is_empty(), "{point}: kubelet never sees it: {pods:?}");

        // The name was never taken for good: the pod can be made now.
        let pod = cri::run_pod(&bed.remora, &config)
            .await
            .expect("RunPodSandbox");
        cri::remove_pod(&bed.remora, &pod).await;
    }
}

/// RunPodSandbox with the handler `remora` (remora's shim, the only one that runs a pod without
/// a pause container), whatever the suite's default handler.
async fn run_on_remoras_shim(
    bed: &BedRemora,
    config: &v1::PodSandboxConfig,
) -> Result<String, tonic::Status> {
    bed.remora
        .runtime()
        .run_pod_sandbox(v1::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: "remora".into(),
        })
        .await
        .map(|r| r.into_inner().pod_sandbox_id)
}

/// The same for a pod without a pause container (PID mode CONTAINER, kubelet's usual pod):
/// killed after CNI ADD (its files may be made) and after its record; its pinned UTS and IPC
/// namespaces go with its netns in the sweep.
#[tokio::test]
async fn remora_killed_mid_run_of_a_pod_without_pause_leaves_nothing_after_restart() {
    let mut bed = BedRemora::start_with_network();
    let logs = scratch();
    let mounts_of = |id: &str| {
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(id))
            .count()
    };
    for point in ["sandbox.after_network", "sandbox.after_record"] {
        let name = format!("half-pinned-{}", point.replace(['.', '_'], "-"));
        let mut config = cri::pod_config(&name, logs.path(), false);
        config
            .linux
            .get_or_insert_with(Default::default)
            .security_context = Some(v1::LinuxSandboxSecurityContext {
            namespace_options: Some(v1::NamespaceOption {
                pid: v1::NamespaceMode::Container as i32,
                ..Default::default()
            }),
            ..Default::default()
        });
        arm(&mut bed, point);
        let r = run_on_remoras_shim(&bed, &config).await;
        let id = killed(&mut bed, point, r);

        let netns = bed.state_dir().join("netns").join(&id);
        assert!(netns.exists(), "{point}: the pod's netns exists");
        for pin in ["uts", "ipc"] {
            assert!(
                bed.state_dir()
                    .join("netns")
                    .join(format!("{id}.{pin}"))
                    .exists(),
                "{point}: {pin} pinned"
            );
        }
        assert!(ipam_holds(&id), "{point}: CNI ADD allocated an address");
        if point == "sandbox.after_record" {
            assert!(bed.ctr_ids(&["containers", "ls", "-q"]).contains(&id));
        }
        assert!(!bed.ctr(&["tasks", "ls"]).contains(&id), "{point}: no task");

        restart_and_sweep(&mut bed, "the sweep of the half-made pod").await;
        assert_eq!(mounts_of(&id), 0, "{point}: netns, pins and shm unmounted");
        assert!(!netns.exists(), "{point}: netns removed");
        assert!(!ipam_holds(&id), "{point}: CNI DEL released the address");
        assert!(
            bed.ctr_ids(&["containers", "ls", "-q"]).is_empty(),
            "{point}"
        );
        assert!(!bed.state_dir().join("sandboxes").join(&id).exists());
        let pods = cri::list_pods(&bed.remora).await;
        assert!(pods.is_empty(), "{point}: kubelet never sees it: {pods:?}");

        let pod = run_on_remoras_shim(&bed, &config)
            .await
            .expect("RunPodSandbox");
        cri::remove_pod(&bed.remora, &pod).await;
    }
}

/// A remora killed while its CNI ADD waits in the IPAM plugin (here host-local behind a
/// wrapper that starts it 4 s late): bridge has the pod's netns open and allocates the address
/// only after the crash. The restarted remora's DEL must come after that, or the address
/// stays reserved for a pod that does not exist.
#[tokio::test]
async fn remora_killed_while_cni_add_waits_for_ipam_leaves_no_address_after_restart() {
    use std::os::unix::fs::PermissionsExt;

    let bins = scratch();
    let slow = bins.path().join("slow-host-local");
    std::fs::write(
        &slow,
        "#!/bin/sh\n# host-local, 4 s late on ADD\n\
         [ \"$CNI_COMMAND\" = ADD ] && sleep 4\nexec /usr/lib/cni/host-local\n",
    )
    .expect("write the IPAM wrapper");
    std::fs::set_permissions(&slow, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let conf = scratch();
    let bed_list = std::fs::read_to_string(
        Path::new(crate::testbed::TESTBED_CNI).join("10-remora-testbed.conflist"),
    )
    .expect("the test bed's network config");
    let list = bed_list.replacen(
        "\"type\": \"host-local\"",
        "\"type\": \"slow-host-local\"",
        1,
    );
    assert_ne!(list, bed_list, "the test bed's network uses host-local");
    std::fs::write(conf.path().join("10-slow-ipam.conflist"), list).expect("write the config");

    let mut bed = BedRemora::start_with_cni(conf.path(), bins.path());
    let logs = scratch();
    let config = cri::pod_config("late-ipam", logs.path(), false);
    let point = "sandbox.after_snapshot";
    arm(&mut bed, point);
    let r = cri::run_pod(&bed.remora, &config).await;
    let id = killed(&mut bed, point, r);
    assert!(
        cni_plugin_running(&id),
        "the killed remora's CNI ADD is still in its IPAM plugin"
    );
    assert!(!ipam_holds(&id), "no address yet");

    restart_and_sweep(&mut bed, "the sweep of the pod whose ADD outlived remora").await;
    assert!(
        !cni_plugin_running(&id),
        "the sweep's DEL came before the ADD's plugins ended"
    );
    assert!(
        !ipam_holds(&id),
        "CNI DEL came after the allocation and released it"
    );
    assert!(
        !bed.state_dir().join("netns").join(&id).exists(),
        "netns removed"
    );
    let pods = cri::list_pods(&bed.remora).await;
    assert!(pods.is_empty(), "kubelet never sees it: {pods:?}");
}

#[tokio::test]
async fn remora_killed_mid_create_container_leaves_nothing_after_restart() {
    let mut bed = BedRemora::start_with_network();
    let logs = scratch();
    cri::pull(&bed.remora, "busybox").await.expect("pull");
    let pod_config = cri::pod_config("half-containers", logs.path(), true);
    let pod = cri::run_pod(&bed.remora, &pod_config)
        .await
        .expect("RunPodSandbox");
    for point in ["container.after_snapshot", "container.after_record"] {
        arm(&mut bed, point);
        let r = cri::create(
            &bed.remora,
            &pod,
            &pod_config,
            cri::shell_container("half", "sleep 60"),
        )
        .await;
        let id = killed(&mut bed, point, r);
        assert!(active_snapshots(&bed).contains(&id), "{point}: snapshot");
        assert_eq!(
            bed.ctr_ids(&["containers", "ls", "-q"]).contains(&id),
            point == "container.after_record",
            "{point}: record"
        );

        restart_and_sweep(&mut bed, "the sweep of the half-made container").await;
        assert!(!active_snapshots(&bed).contains(&id), "{point}: snapshot");
        assert_eq!(
            bed.ctr_ids(&["containers", "ls", "-q"]),
            vec![pod.clone()],
            "{point}: only the pod's record"
        );
        assert_eq!(remora_leases(&bed), Vec::<String>::new(), "{point}: leases");
        assert!(
            std::fs::read_dir(bed.state_dir().join("tmpmounts"))
                .map(|d| d.count() == 0)
                .unwrap_or(true),
            "{point}: no temporary mount left"
        );
        // The pod is still there and ready, and the name is free.
        let s = cri::pod_status(&bed.remora, &pod)
            .await
            .expect("pod status");
        assert_eq!(s.state, v1::PodSandboxState::SandboxReady as i32);
        let c = cri::create(
            &bed.remora,
            &pod,
            &pod_config,
            cri::shell_container("half", "sleep 60"),
        )
        .await
        .expect("the name is free");
        bed.remora
            .runtime()
            .remove_container(v1::RemoveContainerRequest { container_id: c })
            .await
            .expect("remove");
    }
    cri::remove_pod(&bed.remora, &pod).await;
}

/// RemoveContainer answers once the container left every CRI view; its containerd objects go
/// right behind the answer. remora killed in between (after the answer, before the cleanup):
/// the restarted remora finishes the cleanup and never shows the container again.
#[tokio::test]
async fn remora_killed_after_remove_container_answered_finishes_the_removal_after_restart() {
    let mut bed = BedRemora::start_with_network();
    let logs = scratch();
    cri::pull(&bed.remora, "busybox").await.expect("pull");
    let pod_config = cri::pod_config("half-removed", logs.path(), true);
    let pod = cri::run_pod(&bed.remora, &pod_config)
        .await
        .expect("RunPodSandbox");
    let id = cri::create_and_start(
        &bed.remora,
        &pod,
        &pod_config,
        cri::shell_container("doomed", "sleep 60"),
    )
    .await;
    // The pause leaves the answer time to reach us; then remora dies mid-cleanup.
    bed.crash();
    bed.restart_env(&[(
        "REMORA_FAILPOINTS",
        "container.remove_cleanup=pause(500);container.remove_cleanup=kill",
    )]);
    bed.remora
        .runtime()
        .remove_container(v1::RemoveContainerRequest {
            container_id: id.clone(),
        })
        .await
        .expect("RemoveContainer answers before its cleanup");
    let status = bed.remora.wait_exit(Duration::from_secs(10));
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "killed by its failpoint"
    );
    assert_eq!(pending_ids(&bed), vec![id.clone()], "the removal's intent");
    assert!(
        bed.ctr_ids(&["containers", "ls", "-q"]).contains(&id),
        "the record is left for the restart"
    );

    restart_and_sweep(&mut bed, "the sweep of the half-removed container").await;
    assert_eq!(
        bed.ctr_ids(&["containers", "ls", "-q"]),
        vec![pod.clone()],
        "only the pod's record"
    );
    assert!(!active_snapshots(&bed).contains(&id), "rootfs snapshot");
    assert!(!bed.ctr(&["tasks", "ls"]).contains(&id), "task");
    let err = cri::status(&bed.remora, &id)
        .await
        .expect_err("the removed container stays removed");
    assert_eq!(err.code(), tonic::Code::NotFound, "{err:?}");
    cri::remove_pod(&bed.remora, &pod).await;
}

#[tokio::test]
async fn remora_killed_mid_pull_leaves_no_lease_or_content_after_restart() {
    let mut bed = BedRemora::start_pulling_layers_with(Path::new(TESTBED_CERTS), "remora");
    let image = push_image(3, 256 * 1024).await;
    let (reference, blobs) = pull_killed_at(&mut bed, &image, "pull.after_blob").await;
    let content_before = bed.ctr_ids(&["content", "ls", "-q"]);
    assert!(
        blobs.iter().any(|d| content_before.contains(d)),
        "a blob of the image was stored before the kill: {content_before:?}"
    );

    bed.restart();
    assert_pull_left_nothing(&bed, &blobs).await;
    // And the pull works now.
    cri::pull(&bed.remora, &reference)
        .await
        .expect("pull after restart");
}

#[tokio::test]
async fn remora_killed_while_containerd_downloads_a_layer_leaves_nothing_after_restart() {
    // containerd's Transfer service downloads the layers through a registry that stops
    // sending each one after 1.5 MiB; remora dies at containerd's first download report
    // (containerd writes a download in 1 MiB steps, so a layer reports progress only past
    // the first MiB).
    let proxy = HoldingProxy::start(3 << 19);
    let certs = certs_dir(&[("registry.k8s.io", &format!("http://{}", proxy.addr))]);
    let mut bed = BedRemora::start_pulling_layers_with(certs.path(), "transfer");
    let image = push_image(3, 3 << 20).await;
    let (reference, blobs) = pull_killed_at(&mut bed, &image, "pull.transfer_downloading").await;
    let stored = bed.ctr_ids(&["content", "ls", "-q"]);
    assert!(
        stored.contains(&image.manifest) && stored.contains(&image.config),
        "remora stored the manifest and config before the transfer: {stored:?}"
    );

    bed.restart();
    assert_pull_left_nothing(&bed, &blobs).await;
    // And the pull works now, through the same registry.
    proxy.release();
    cri::pull(&bed.remora, &reference)
        .await
        .expect("pull after restart");
}

/// Pulls `image` with `failpoint` armed: remora dies of it mid-pull, leaving the pull's
/// leases. Returns the image's reference and blobs.
async fn pull_killed_at(
    bed: &mut BedRemora,
    image: &PushedImage,
    failpoint: &str,
) -> (String, Vec<String>) {
    let blobs: Vec<String> = image
        .layers
        .iter()
        .chain([&image.config, &image.manifest])
        .cloned()
        .collect();
    arm(bed, failpoint);
    let err = cri::pull(&bed.remora, &image.reference)
        .await
        .expect_err("remora dies mid-pull");
    assert!(
        matches!(err.code(), tonic::Code::Unavailable | tonic::Code::Unknown),
        "{err:?}"
    );
    let status = bed.remora.wait_exit(Duration::from_secs(10));
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "killed by {failpoint}"
    );
    assert!(!remora_leases(bed).is_empty(), "the pull left its leases");
    (image.reference.clone(), blobs)
}

/// After a restart that followed a kill mid-pull: the pull's leases go, and with them every
/// blob, ingest and snapshot of the image; no image record was made.
async fn assert_pull_left_nothing(bed: &BedRemora, blobs: &[String]) {
    wait_until("orphaned leases to go", Duration::from_secs(30), || async {
        remora_leases(bed).is_empty()
    })
    .await;
    let content = bed.ctr_ids(&["content", "ls", "-q"]);
    for d in blobs {
        assert!(!content.contains(d), "blob {d} collected with its lease");
    }
    // Line counts include the listings' header line.
    wait_until("no ingest left", Duration::from_secs(30), || async {
        bed.ctr(&["content", "active"]).lines().count() <= 1
    })
    .await;
    wait_until("no snapshot left", Duration::from_secs(30), || async {
        bed.ctr_ids(&["snapshots", "ls"]).len() <= 1
    })
    .await;
    assert!(
        bed.ctr_ids(&["images", "ls", "-q"]).is_empty(),
        "no image record"
    );
}

#[tokio::test]
async fn exits_while_remora_is_down_are_recorded_once_with_real_codes_and_oom() {
    let mut bed = BedRemora::start_with_network();
    let logs = scratch();
    cri::pull(&bed.remora, "busybox").await.expect("pull");
    let pod_config = cri::pod_config("down-exits", logs.path(), true);
    let pod = cri::run_pod(&bed.remora, &pod_config)
        .await
        .expect("RunPodSandbox");
    // Each waits for a file the test creates while remora is down.
    let gate = |code: &str| format!("while [ ! -e /tmp/go ]; do sleep 0.1; done; exit {code}");
    let mut hog = cri::shell_container(
        "hog",
        "while [ ! -e /tmp/go ]; do sleep 0.1; done; s=xxxxxxxxxxxxxxxx; while true; do s=\"$s$s\"; done",
    );
    hog.linux = Some(v1::LinuxContainerConfig {
        resources: Some(v1::LinuxContainerResources {
            memory_limit_in_bytes: 32 * 1024 * 1024,
            ..Default::default()
        }),
        ..Default::default()
    });
    let ok = cri::create_and_start(
        &bed.remora,
        &pod,
        &pod_config,
        cri::shell_container("ok", &gate("0")),
    )
    .await;
    let fail = cri::create_and_start(
        &bed.remora,
        &pod,
        &pod_config,
        cri::shell_container("fail", &gate("1")),
    )
    .await;
    let hog = cri::create_and_start(&bed.remora, &pod, &pod_config, hog).await;
    let ids = [ok.clone(), fail.clone(), hog.clone()];

    bed.crash();
    for id in &ids {
        bed.ctr(&["tasks", "exec", "--exec-id", "gate", id, "touch", "/tmp/go"]);
    }
    // Deterministic: wait until containerd reports all three stopped (nobody deletes them).
    wait_until(
        "the three tasks to stop",
        Duration::from_secs(30),
        || async {
            let tasks = bed.ctr(&["tasks", "ls"]);
            ids.iter().all(|id| {
                tasks
                    .lines()
                    .any(|l| l.starts_with(id.as_str()) && l.contains("STOPPED"))
            })
        },
    )
    .await;
    bed.restart();
    let mut events = bed
        .remora
        .runtime()
        .get_container_events(v1::GetEventsRequest {})
        .await
        .expect("events")
        .into_inner();
    for (id, code, reason) in [
        (&ok, 0, "Completed"),
        (&fail, 1, "Error"),
        (&hog, 137, "OOMKilled"),
    ] {
        let s = cri::wait_exited(&bed.remora, id, Duration::from_secs(30)).await;
        assert_eq!(
            (s.exit_code, s.reason.as_str()),
            (code, reason),
            "recorded after the restart: {s:?}"
        );
        assert!(s.finished_at >= s.started_at, "{s:?}");
    }
    // A subscriber after the restart sees each exit once.
    let stopped = cri::count_stopped(&mut events, Duration::from_secs(2)).await;
    for id in &ids {
        assert_eq!(
            stopped.get(id),
            Some(&1),
            "one STOPPED for {id}: {stopped:?}"
        );
    }
    // Another restart records nothing twice.
    bed.crash();
    bed.restart();
    let mut events = bed
        .remora
        .runtime()
        .get_container_events(v1::GetEventsRequest {})
        .await
        .expect("events")
        .into_inner();
    let s = cri::status(&bed.remora, &fail).await.expect("status");
    assert_eq!(
        (s.state, s.exit_code),
        (v1::ContainerState::ContainerExited as i32, 1)
    );
    if let Ok(Some(Ok(e))) = tokio::time::timeout(Duration::from_secs(2), events.next()).await {
        panic!("no event for exits recorded before: {e:?}");
    }
    cri::remove_pod(&bed.remora, &pod).await;
    assert!(bed.ctr_ids(&["containers", "ls", "-q"]).is_empty());
}

#[tokio::test]
async fn a_failing_exit_is_retried_in_order_without_delaying_others() {
    let mut bed = BedRemora::start_with_network();
    let logs = scratch();
    let busybox = cri::pull(&bed.remora, "busybox").await.expect("pull");
    bed.crash();
    // Recording the victim's exit fails three times: retried after 1 s, 2 s and 4 s.
    bed.restart_env(&[("REMORA_FAILPOINTS", "exit.handle=fail(3)@victim")]);
    let pod_config = cri::pod_config("retries", logs.path(), true);
    let pod = cri::run_pod(&bed.remora, &pod_config)
        .await
        .expect("RunPodSandbox");
    let mut events = bed
        .remora
        .runtime()
        .get_container_events(v1::GetEventsRequest {})
        .await
        .expect("events")
        .into_inner();
    let script =
        |code: u8| format!("while [ ! -e /tmp/go ]; do sleep 0.05; done; echo bye; exit {code}");
    let victim = cri::create_and_start(
        &bed.remora,
        &pod,
        &pod_config,
        cri::shell_container("victim", &script(7)),
    )
    .await;
    let bystander = cri::create_and_start(
        &bed.remora,
        &pod,
        &pod_config,
        cri::shell_container("bystander", &script(8)),
    )
    .await;
    let running = v1::ContainerState::ContainerRunning as i32;
    let exited = v1::ContainerState::ContainerExited as i32;

    let t0 = Instant::now();
    for id in [&victim, &bystander] {
        bed.ctr(&["tasks", "exec", "--exec-id", "go", id, "touch", "/tmp/go"]);
    }
    // The bystander's exit is recorded while the victim's is still failing.
    let b = cri::wait_exited(&bed.remora, &bystander, Duration::from_secs(10)).await;
    let bystander_latency = t0.elapsed();
    assert_eq!(b.exit_code, 8);
    let v = cri::status(&bed.remora, &victim).await.expect("status");
    assert_eq!(v.state, running, "the victim's exit is still being retried");

    // Image events are not held up either: a tag made by another client appears.
    let tag = format!("registry.k8s.io/remora-it/retag:{}", std::process::id());
    let source = bed
        .ctr_ids(&["images", "ls", "-q"])
        .into_iter()
        .find(|n| n.contains("busybox") && !n.contains('@'))
        .expect("busybox record");
    bed.ctr(&["images", "tag", &source, &tag]);
    wait_until(
        "the new tag to be indexed",
        Duration::from_secs(5),
        || async {
            bed.remora
                .images()
                .image_status(v1::ImageStatusRequest {
                    image: Some(cri::image_spec(&tag)),
                    verbose: false,
                })
                .await
                .is_ok_and(|r| r.into_inner().image.is_some_and(|i| i.id == busybox))
        },
    )
    .await;
    let image_latency = t0.elapsed();
    assert_eq!(
        cri::status(&bed.remora, &victim)
            .await
            .expect("status")
            .state,
        running,
        "the image event was not queued behind the victim"
    );

    // The victim's exit is recorded after its retries, once, with its real code.
    let v = cri::wait_exited(&bed.remora, &victim, Duration::from_secs(30)).await;
    let victim_latency = t0.elapsed();
    assert_eq!(v.exit_code, 7);
    assert!(
        victim_latency >= Duration::from_secs(7),
        "three failures back off 1 + 2 + 4 s: {victim_latency:?}"
    );
    let log = std::fs::read_to_string(logs.path().join("victim.log")).unwrap_or_default();
    assert!(log.contains("bye"), "its output reached the log: {log:?}");
    let retries = || {
        bed.remora
            .log_text()
            .lines()
            .filter(|l| l.contains("event handling failed; retrying") && l.contains(&victim))
            .count()
    };
    // The log is written asynchronously: wait for the third line, then check there is no fourth.
    wait_until(
        "three failed attempts logged",
        Duration::from_secs(20),
        || {
            let n = retries();
            async move { n >= 3 }
        },
    )
    .await;
    assert_eq!(retries(), 3, "three failed attempts logged");
    let stopped = cri::count_stopped(&mut events, Duration::from_secs(1)).await;
    assert_eq!(stopped.get(&victim), Some(&1), "{stopped:?}");
    assert_eq!(stopped.get(&bystander), Some(&1), "{stopped:?}");
    assert_eq!(
        cri::status(&bed.remora, &victim)
            .await
            .expect("status")
            .state,
        exited
    );
    println!(
        "exit handling: bystander recorded after {bystander_latency:?}, image tag indexed after \
         {image_latency:?}, victim (3 failures) after {victim_latency:?}"
    );
    bed.ctr(&["images", "rm", &tag]);
    cri::remove_pod(&bed.remora, &pod).await;
}

#[tokio::test]
async fn a_rollback_cut_short_by_a_containerd_outage_is_finished_when_it_is_back() {
    // RunPodSandbox fails after its pause task exists; containerd is stopped just before, so
    // the rollback cannot delete anything. The intent stays, and the sweep after containerd
    // is back removes task, record and snapshot.
    let mut bed = crate::harness::Bed::start(&format!(
        "[images]\nconfig_path = \"{}\"\n",
        crate::testbed::TESTBED_CERTS
    ));
    let logs = scratch();
    // The pause image first, so the failing call does not pull.
    let warm = cri::pod_config("warm", logs.path(), true);
    let pod = cri::run_pod(&bed.remora, &warm)
        .await
        .expect("RunPodSandbox");
    cri::remove_pod(&bed.remora, &pod).await;
    bed.restart_remora_env(&[(
        "REMORA_FAILPOINTS",
        "sandbox.after_task=pause(3000)@cut;sandbox.after_task=fail(1)@cut",
    )]);
    let config = cri::pod_config("cut-short", logs.path(), true);
    let socket = bed.remora.socket.clone();
    let call = {
        let config = config.clone();
        tokio::spawn(async move {
            let mut rt = remora::cri::v1::runtime_service_client::RuntimeServiceClient::new(
                remora::grpc::unix_channel(&socket, Duration::from_secs(5)),
            );
            rt.run_pod_sandbox(v1::RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            })
            .await
        })
    };
    wait_until(
        "the failpoint to pause",
        Duration::from_secs(20),
        || async {
            bed.remora
                .log_text()
                .contains("failpoint sandbox.after_task")
        },
    )
    .await;
    bed.containerd.stop();
    let err = call
        .await
        .expect("join")
        .expect_err("the failpoint fails the call");
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    let pending = std::fs::read_dir(bed.dir.path().join("state/pending"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(pending, 1, "the unfinished rollback keeps its intent");
    // The log is written asynchronously: wait for the line rather than read it at once.
    wait_until(
        "the failed rollback step to be logged",
        Duration::from_secs(20),
        || async { bed.remora.log_text().contains("rollback step failed") },
    )
    .await;

    bed.containerd.restart();
    wait_until(
        "the sweep to finish the rollback",
        Duration::from_secs(30),
        || async {
            std::fs::read_dir(bed.dir.path().join("state/pending"))
                .map(|d| d.count() == 0)
                .unwrap_or(true)
        },
    )
    .await;
    assert_eq!(bed.ctr(&["containers", "ls", "-q"]).trim(), "");
    assert_eq!(bed.ctr(&["tasks", "ls", "-q"]).trim(), "");
    let pods = cri::list_pods(&bed.remora).await;
    assert!(pods.is_empty(), "{pods:?}");
    // And the name is free (the failpoint has fired its one failure).
    let pod = cri::run_pod(&bed.remora, &config)
        .await
        .expect("RunPodSandbox");
    cri::remove_pod(&bed.remora, &pod).await;
}

/// containerd is stopped for 15 s while containers exit 0, 3, by OOM (32 MiB limit) and by a
/// SIGKILL from the host, and one keeps running. After containerd is back every exit is
/// recorded exactly (`OOMKilled` included) and the runner still runs. Returns how long after
/// containerd answered again each exit was visible, for the report (not asserted: a timing).
async fn exits_across_a_containerd_outage(handler: &str) -> Vec<(&'static str, Duration)> {
    let mut bed = crate::harness::Bed::start(&format!(
        "[images]\nconfig_path = \"{}\"\n[runtime]\ndefault_handler = \"{handler}\"\n",
        crate::testbed::TESTBED_CERTS
    ));
    let logs = scratch();
    let gate = scratch();
    cri::pull(&bed.remora, "busybox").await.expect("pull");
    let pod_config = cri::pod_config(&format!("outage-{handler}"), logs.path(), true);
    let pod = cri::run_pod(&bed.remora, &pod_config)
        .await
        .expect("RunPodSandbox");
    // Each waits for a file the test creates on the host while containerd is down.
    let gated = |name: &str, then: &str| {
        let mut c = cri::shell_container(
            name,
            &format!("while [ ! -e /gate/go ]; do sleep 0.1; done; {then}"),
        );
        c.mounts = vec![v1::Mount {
            container_path: "/gate".into(),
            host_path: gate.path().display().to_string(),
            readonly: true,
            ..Default::default()
        }];
        c
    };
    let mut hog = gated("hog", "s=xxxxxxxxxxxxxxxx; while true; do s=\"$s$s\"; done");
    hog.linux = Some(v1::LinuxContainerConfig {
        resources: Some(v1::LinuxContainerResources {
            memory_limit_in_bytes: 32 * 1024 * 1024,
            ..Default::default()
        }),
        ..Default::default()
    });
    let mut ids = Vec::new();
    for c in [
        gated("ok", "exit 0"),
        gated("three", "exit 3"),
        hog,
        cri::shell_container("killed", "sleep 3600"),
        cri::shell_container("runner", "sleep 3600"),
    ] {
        ids.push(cri::create_and_start(&bed.remora, &pod, &pod_config, c).await);
    }
    let pid_of = |tasks: &str, id: &str| -> i32 {
        tasks
            .lines()
            .find(|l| l.starts_with(id))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no pid for {id} in {tasks}"))
    };
    let tasks = bed.ctr(&["tasks", "ls"]);
    let pids: Vec<i32> = ids.iter().map(|id| pid_of(&tasks, id)).collect();

    bed.containerd.stop();
    std::fs::write(gate.path().join("go"), b"").expect("open the gate");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pids[3]),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the container from the host");
    wait_until(
        "the four containers' processes to end",
        Duration::from_secs(60),
        || async {
            pids[..4].iter().all(|p| {
                std::fs::read_to_string(format!("/proc/{p}/stat"))
                    .map(|s| s.contains(") Z "))
                    .unwrap_or(true)
            })
        },
    )
    .await;
    // The outage itself: long enough for a reconnect backoff to reach its 10 s cap, which
    // remora's return must not depend on.
    tokio::time::sleep(Duration::from_secs(15)).await;
    bed.containerd.restart();
    let back = Instant::now();

    let mut seen = Vec::new();
    for (i, (name, code, reason)) in [
        ("ok", 0, "Completed"),
        ("three", 3, "Error"),
        ("hog", 137, "OOMKilled"),
        ("killed", 137, "Error"),
    ]
    .into_iter()
    .enumerate()
    {
        let s = cri::wait_exited(&bed.remora, &ids[i], Duration::from_secs(60)).await;
        seen.push((name, back.elapsed()));
        assert_eq!(
            (s.exit_code, s.reason.as_str()),
            (code, reason),
            "{handler}: {name} after the outage: {s:?}"
        );
    }
    let runner = cri::status(&bed.remora, &ids[4]).await.expect("status");
    assert_eq!(
        runner.state,
        v1::ContainerState::ContainerRunning as i32,
        "{handler}: the runner survives the outage: {runner:?}"
    );
    cri::remove_pod(&bed.remora, &pod).await;
    assert_eq!(bed.ctr(&["containers", "ls", "-q"]).trim(), "");
    seen
}

#[tokio::test]
async fn exits_across_a_containerd_outage_are_exact_with_remoras_shim() {
    let seen = exits_across_a_containerd_outage("remora").await;
    eprintln!("remora shim: exits visible after containerd's return: {seen:?}");
}

#[tokio::test]
async fn exits_across_a_containerd_outage_are_exact_with_the_go_shim() {
    let seen = exits_across_a_containerd_outage("runc").await;
    eprintln!("Go runc shim: exits visible after containerd's return: {seen:?}");
}

/// The pids of processes in a cgroup of container `id` (its id is in every cgroup path of
/// its processes, whichever driver and parent).
fn pids_of_container(id: &str) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    dir.filter_map(|e| {
        let pid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        cgroups.contains(id).then_some(pid)
    })
    .collect()
}

/// The pod's shim is SIGKILLed while its pod runs. remora puts a pod's containers in the
/// pod's shim through containerd's `sandbox` field, for which containerd has no dead-shim
/// cleanup: remora reaps them itself. A container that had exited keeps its real code; one
/// still running is killed (no process is left behind) and ends with 137, the code
/// containerd's cleanup reports for an unsandboxed task (one whose process had already ended
/// would be UNKNOWN: its code died with the shim). Nothing is left in containerd once the pod
/// is removed. With `remora_down`, the
/// shim dies while remora is down (killed), and the restarted remora's recovery finds it.
async fn a_killed_shim_leaves_real_codes_and_no_process(
    handler: &str,
    shim_binary: &str,
    remora_down: bool,
) {
    let mut bed = BedRemora::start_with_network();
    let logs = scratch();
    cri::pull(&bed.remora, "busybox").await.expect("pull");
    let pod_config = cri::pod_config("shim-killed", logs.path(), false);
    let pod = bed
        .remora
        .runtime()
        .run_pod_sandbox(v1::RunPodSandboxRequest {
            config: Some(pod_config.clone()),
            runtime_handler: handler.into(),
        })
        .await
        .expect("RunPodSandbox")
        .into_inner()
        .pod_sandbox_id;
    let done = cri::create_and_start(
        &bed.remora,
        &pod,
        &pod_config,
        cri::shell_container("done", "exit 3"),
    )
    .await;
    // In a PID namespace of its own: the pause's death (containerd's cleanup kills it) does
    // not take it along, so only the reaping can end it.
    let mut sleeper = cri::shell_container("sleeper", "sleep 3600");
    sleeper.linux = Some(v1::LinuxContainerConfig {
        security_context: Some(v1::LinuxContainerSecurityContext {
            namespace_options: Some(v1::NamespaceOption {
                pid: v1::NamespaceMode::Container as i32,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    let sleeper = cri::create_and_start(&bed.remora, &pod, &pod_config, sleeper).await;
    let s = cri::wait_exited(&bed.remora, &done, Duration::from_secs(30)).await;
    assert_eq!(s.exit_code, 3, "{s:?}");
    assert!(
        !pids_of_container(&sleeper).is_empty(),
        "the sleeper's process is found by its cgroup"
    );

    let shim = crate::harness::shim_pid(shim_binary, &bed.namespace, &pod).expect("the pod's shim");
    if remora_down {
        bed.crash();
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(shim),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the shim");
    if remora_down {
        wait_until("the shim to be gone", Duration::from_secs(30), || async {
            !std::path::Path::new(&format!("/proc/{shim}")).exists()
        })
        .await;
        bed.restart();
    }
    wait_until(
        "the sleeper to be recorded as ended",
        Duration::from_secs(60),
        || async {
            cri::status(&bed.remora, &sleeper)
                .await
                .map(|s| s.state != v1::ContainerState::ContainerRunning as i32)
                .unwrap_or(false)
        },
    )
    .await;
    let s = cri::status(&bed.remora, &sleeper).await.expect("status");
    assert_eq!(
        (s.state, s.exit_code),
        (v1::ContainerState::ContainerExited as i32, 137),
        "the sleeper was killed by the reaping (137, as containerd's cleanup reports): {s:?}"
    );
    wait_until(
        "no process of the sleeper to be left",
        Duration::from_secs(30),
        || async { pids_of_container(&sleeper).is_empty() },
    )
    .await;
    let s = cri::status(&bed.remora, &done).await.expect("status");
    assert_eq!(s.exit_code, 3, "the recorded exit is kept: {s:?}");
    cri::remove_pod(&bed.remora, &pod).await;
    assert!(bed.ctr_ids(&["containers", "ls", "-q"]).is_empty());
    assert!(bed.ctr_ids(&["tasks", "ls", "-q"]).is_empty());
}

#[tokio::test]
async fn a_killed_remora_shim_leaves_real_codes_and_no_process() {
    a_killed_shim_leaves_real_codes_and_no_process("remora", "containerd-shim-remora-v2", false)
        .await;
}

#[tokio::test]
async fn a_killed_go_shim_leaves_real_codes_and_no_process() {
    a_killed_shim_leaves_real_codes_and_no_process("runc", "containerd-shim-runc-v2", false).await;
}

#[tokio::test]
async fn a_shim_killed_while_remora_is_down_leaves_real_codes_and_no_process() {
    a_killed_shim_leaves_real_codes_and_no_process("runc", "containerd-shim-runc-v2", true).await;
}
