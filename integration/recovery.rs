//! remora restarts: the index is rebuilt from containerd, exits that happened while remora was
//! down are recorded with their real codes, running containers keep being watched and logged.

use std::time::Duration;

use remora::cri::v1;

use crate::cri;
use crate::harness::{scratch, wait_until, BedRemora};

#[tokio::test]
async fn pods_and_containers_survive_a_remora_crash() {
    let mut bed = BedRemora::start_with_network();
    let logs = scratch();
    cri::pull(&bed.remora, "busybox").await.expect("pull");
    let pod_config = cri::pod_config("survivor", logs.path(), false);
    let pod = cri::run_pod(&bed.remora, &pod_config).await.unwrap();
    let long = cri::create_and_start(
        &bed.remora,
        &pod,
        &pod_config,
        cri::shell_container("long", "while true; do echo alive; sleep 0.2; done"),
    )
    .await;
    let short = cri::create_and_start(
        &bed.remora,
        &pod,
        &pod_config,
        cri::shell_container("short", "sleep 2; exit 5"),
    )
    .await;

    bed.crash();
    // "short" exits while remora is down.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log_before = std::fs::read_to_string(logs.path().join("long.log")).unwrap_or_default();
    bed.restart();

    wait_until(
        "the index to be rebuilt",
        Duration::from_secs(15),
        || async { cri::status(&bed.remora, &short).await.is_ok() },
    )
    .await;
    let s = cri::status(&bed.remora, &short).await.unwrap();
    assert_eq!(s.state, v1::ContainerState::ContainerExited as i32);
    assert_eq!(
        (s.exit_code, s.reason.as_str()),
        (5, "Error"),
        "the real exit, recorded after the restart"
    );
    let s = cri::status(&bed.remora, &long).await.unwrap();
    assert_eq!(s.state, v1::ContainerState::ContainerRunning as i32);
    let pods = crate::cri::list_pods(&bed.remora).await;
    assert_eq!(pods.len(), 1);
    assert_eq!(pods[0].state, v1::PodSandboxState::SandboxReady as i32);

    // The running container's output keeps reaching its log file.
    wait_until(
        "new log lines after the restart",
        Duration::from_secs(10),
        || async {
            std::fs::read_to_string(logs.path().join("long.log"))
                .is_ok_and(|s| s.lines().count() > log_before.lines().count() + 2)
        },
    )
    .await;

    // The name stays reserved, and everything can be stopped and removed.
    let err = cri::run_pod(&bed.remora, &pod_config)
        .await
        .expect_err("name still taken");
    assert_eq!(err.code(), tonic::Code::AlreadyExists);
    cri::remove_pod(&bed.remora, &pod).await;
    assert!(bed.ctr_ids(&["containers", "ls", "-q"]).is_empty());
}

#[tokio::test]
async fn exits_during_a_containerd_outage_are_recorded_once_with_real_codes() {
    // A private containerd we can stop; images through the test bed's mirrors; host-network
    // pods, so no CNI is needed.
    let mut bed = crate::harness::Bed::start(&format!(
        "[images]\nconfig_path = \"{}\"\n",
        crate::testbed::TESTBED_CERTS
    ));
    let logs = scratch();
    cri::pull(&bed.remora, "busybox").await.expect("pull");
    let mut events = bed
        .remora
        .runtime()
        .get_container_events(v1::GetEventsRequest {})
        .await
        .unwrap()
        .into_inner();
    // Ten pods with one container each; three of them exit (11, 12, 13) while containerd is
    // down: each waits for a file the test creates through runc once containerd is stopped.
    let mut pods = Vec::new();
    let mut ids = Vec::new();
    for i in 0..10 {
        let config = cri::pod_config(&format!("outage-{i}"), logs.path(), true);
        let pod = cri::run_pod(&bed.remora, &config)
            .await
            .expect("RunPodSandbox");
        let script = if i < 3 {
            format!(
                "while [ ! -e /tmp/go ]; do sleep 0.1; done; exit {}",
                11 + i
            )
        } else {
            "sleep 3600".to_string()
        };
        let id = cri::create_and_start(
            &bed.remora,
            &pod,
            &config,
            cri::shell_container(&format!("c{i}"), &script),
        )
        .await;
        pods.push(pod);
        ids.push(id);
    }

    bed.containerd.stop();
    let runc_root = bed.runc_root();
    for id in &ids[..3] {
        let out = std::process::Command::new(crate::harness::oci_binary_of(
            &crate::harness::it_handler(),
        ))
        .args(["--root", &runc_root, "exec", id, "touch", "/tmp/go"])
        .output()
        .expect("runc exec");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    let back = std::time::Instant::now();
    bed.containerd.restart();
    for (i, id) in ids[..3].iter().enumerate() {
        let s = cri::wait_exited(&bed.remora, id, Duration::from_secs(60)).await;
        assert_eq!(
            (s.exit_code, s.reason.as_str()),
            (11 + i as i32, "Error"),
            "the real exit, asked of the shim after containerd came back: {s:?}"
        );
    }
    let recorded_after = back.elapsed();
    let resync_ms: Vec<String> = bed
        .remora
        .log_text()
        .lines()
        .filter(|l| l.contains("resync complete"))
        .map(String::from)
        .collect();
    println!(
        "containerd back → 3 exits recorded: {recorded_after:?}; resyncs: {:?}",
        resync_ms
    );
    // The seven others still run and are watched.
    for id in &ids[3..] {
        let s = cri::status(&bed.remora, id).await.expect("status");
        assert_eq!(
            s.state,
            v1::ContainerState::ContainerRunning as i32,
            "{s:?}"
        );
    }
    let mut rt = bed.remora.runtime();
    rt.stop_container(v1::StopContainerRequest {
        container_id: ids[3].clone(),
        timeout: 1,
    })
    .await
    .expect("stop");
    assert_eq!(
        cri::status(&bed.remora, &ids[3]).await.unwrap().state,
        v1::ContainerState::ContainerExited as i32
    );

    // Each exit was reported once.
    let stopped = crate::cri::count_stopped(&mut events, Duration::from_millis(500)).await;
    for id in &ids[..4] {
        assert_eq!(
            stopped.get(id),
            Some(&1),
            "one STOPPED event for {id}: {stopped:?}"
        );
    }
    for pod in &pods {
        cri::remove_pod(&bed.remora, pod).await;
    }
}

#[tokio::test]
async fn recovery_reads_more_records_than_fit_in_a_default_grpc_message() {
    // Six pods with 400 KiB of annotations each: containerd keeps them in the spec and in
    // remora's metadata (twice), so listing the records answers well over tonic's default
    // 4 MiB message limit.
    let mut bed = BedRemora::start();
    let logs = scratch();
    let mut pods = Vec::new();
    for i in 0..6 {
        let mut config = cri::pod_config(&format!("big-{i}"), logs.path(), true);
        config
            .annotations
            .insert("example.com/big".into(), "x".repeat(400 * 1024));
        pods.push(
            cri::run_pod(&bed.remora, &config)
                .await
                .expect("RunPodSandbox"),
        );
    }
    bed.crash();
    bed.restart();
    let listed = crate::cri::list_pods(&bed.remora).await;
    assert_eq!(listed.len(), 6, "every pod recovered");
    assert!(listed
        .iter()
        .all(|p| p.annotations.get("example.com/big").map(String::len) == Some(400 * 1024)));
    for pod in &pods {
        cri::remove_pod(&bed.remora, pod).await;
    }
    assert!(bed.ctr_ids(&["containers", "ls", "-q"]).is_empty());
}

#[tokio::test]
async fn records_whose_metadata_cannot_be_read_are_unknown_and_removable() {
    // Records in remora's namespace with remora's labels but no readable metadata (made
    // here with ctr; in life: a newer remora's format, a damaged record).
    let mut bed = BedRemora::start();
    cri::pull(&bed.remora, "busybox").await.expect("pull");
    let image = bed
        .ctr_ids(&["images", "ls", "-q"])
        .into_iter()
        .find(|n| n.contains("busybox") && !n.contains('@'))
        .expect("busybox record");
    let pod = format!("{:0>64}", "deadbeef1");
    let ctr = format!("{:0>64}", "deadbeef2");
    bed.ctr(&[
        "containers",
        "create",
        "--label",
        "io.cri-containerd.kind=sandbox",
        "--label",
        "io.kubernetes.pod.name=ghost",
        "--label",
        "io.kubernetes.pod.namespace=remora-it",
        &image,
        &pod,
    ]);
    bed.ctr(&[
        "containers",
        "create",
        "--label",
        "io.cri-containerd.kind=container",
        "--label",
        "io.kubernetes.container.name=mystery",
        "--label",
        &format!("io.kubernetes.sandbox.id={pod}"),
        &image,
        &ctr,
    ]);
    bed.crash();
    bed.restart();
    let mut rt = bed.remora.runtime();
    let c = cri::status(&bed.remora, &ctr).await.expect("status");
    assert_eq!(
        c.state,
        v1::ContainerState::ContainerUnknown as i32,
        "{c:?}"
    );
    assert_eq!(c.metadata.map(|m| m.name).as_deref(), Some("mystery"));
    let p = cri::pod_status(&bed.remora, &pod)
        .await
        .expect("pod status");
    assert_eq!(p.state, v1::PodSandboxState::SandboxNotready as i32);
    assert_eq!(p.metadata.map(|m| m.name).as_deref(), Some("ghost"));

    rt.stop_container(v1::StopContainerRequest {
        container_id: ctr.clone(),
        timeout: 0,
    })
    .await
    .expect("stop an UNKNOWN container");
    rt.remove_container(v1::RemoveContainerRequest {
        container_id: ctr.clone(),
    })
    .await
    .expect("remove an UNKNOWN container");
    cri::remove_pod(&bed.remora, &pod).await;
    assert!(bed.ctr_ids(&["containers", "ls", "-q"]).is_empty());
    let snapshots = bed.ctr(&["snapshots", "ls"]);
    assert!(
        !snapshots.contains(&ctr) && !snapshots.contains(&pod),
        "{snapshots}"
    );
}

#[tokio::test]
async fn orphaned_exit_keepers_are_swept_at_start() {
    use containerd_client::services::v1::sandbox::store_client::StoreClient;
    use containerd_client::services::v1::sandbox::{StoreCreateRequest, StoreListRequest};
    // An exit keeper whose container record is gone (remora died between deleting the record
    // and its keeper), made directly in containerd's sandbox store.
    let mut bed = BedRemora::start();
    let channel = remora::grpc::unix_channel(
        std::path::Path::new(crate::testbed::TESTBED_CONTAINERD),
        Duration::from_secs(5),
    );
    fn in_ns<T>(ns: &str, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        r.metadata_mut()
            .insert("containerd-namespace", ns.parse().expect("namespace"));
        r
    }
    let ns = bed.namespace.clone();
    let mut store = StoreClient::new(channel);
    let orphan = format!("{:0>64}", "0rphan");
    store
        .create(in_ns(
            &ns,
            StoreCreateRequest {
                sandbox: Some(containerd_client::types::Sandbox {
                    sandbox_id: orphan.clone(),
                    labels: [("dev.remora.exit-keeper".to_string(), "true".to_string())].into(),
                    runtime: Some(containerd_client::types::sandbox::Runtime {
                        name: "dev.remora.exit-keeper".into(),
                        options: None,
                    }),
                    ..Default::default()
                }),
            },
        ))
        .await
        .expect("create a keeper");
    let list = |mut store: StoreClient<tonic::transport::Channel>| {
        let req = in_ns(&ns, StoreListRequest { filters: vec![] });
        async move {
            store
                .list(req)
                .await
                .expect("list")
                .into_inner()
                .list
                .into_iter()
                .map(|s| s.sandbox_id)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(list(store.clone()).await, vec![orphan.clone()]);
    bed.crash();
    bed.restart();
    wait_until("the orphaned keeper to go", Duration::from_secs(10), || {
        let store = store.clone();
        let list = &list;
        async move { list(store).await.is_empty() }
    })
    .await;
}
