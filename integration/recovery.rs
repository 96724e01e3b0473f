//! remora restarts: the index is rebuilt from containerd, exits that happened while remora was
//! down are recorded with their real codes, running containers keep being watched and logged.

use std::time::Duration;

use k8s_cri::v1;

use crate::harness::{scratch, wait_until, BedRemora};

#[tokio::test]
async fn pods_and_containers_survive_a_remora_crash() {
    let mut bed = BedRemora::start_with_network();
    let logs = scratch();
    let mut img = bed.remora.images();
    img.pull_image(v1::PullImageRequest {
        image: Some(v1::ImageSpec {
            image: "busybox".into(),
            ..Default::default()
        }),
        ..Default::default()
    })
    .await
    .expect("pull");
    let pod_config = v1::PodSandboxConfig {
        metadata: Some(v1::PodSandboxMetadata {
            name: "survivor".into(),
            uid: "uid-survivor".into(),
            namespace: "remora-it".into(),
            attempt: 0,
        }),
        log_directory: logs.path().display().to_string(),
        linux: Some(v1::LinuxPodSandboxConfig::default()),
        ..Default::default()
    };
    let mut rt = bed.remora.runtime();
    let pod = rt
        .run_pod_sandbox(v1::RunPodSandboxRequest {
            config: Some(pod_config.clone()),
            runtime_handler: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .pod_sandbox_id;
    let mk = |name: &str, cmd: &[&str]| v1::CreateContainerRequest {
        pod_sandbox_id: pod.clone(),
        config: Some(v1::ContainerConfig {
            metadata: Some(v1::ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            image: Some(v1::ImageSpec {
                image: "busybox".into(),
                ..Default::default()
            }),
            command: cmd.iter().map(|s| s.to_string()).collect(),
            log_path: format!("{name}.log"),
            linux: Some(v1::LinuxContainerConfig::default()),
            ..Default::default()
        }),
        sandbox_config: Some(pod_config.clone()),
    };
    let long = rt
        .create_container(mk(
            "long",
            &["sh", "-c", "while true; do echo alive; sleep 0.2; done"],
        ))
        .await
        .unwrap()
        .into_inner()
        .container_id;
    let short = rt
        .create_container(mk("short", &["sh", "-c", "sleep 2; exit 5"]))
        .await
        .unwrap()
        .into_inner()
        .container_id;
    for id in [&long, &short] {
        rt.start_container(v1::StartContainerRequest {
            container_id: id.clone(),
        })
        .await
        .unwrap();
    }

    bed.crash();
    // "short" exits while remora is down.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log_before = std::fs::read_to_string(logs.path().join("long.log")).unwrap_or_default();
    bed.restart();
    let mut rt = bed.remora.runtime();

    let status = |id: String| {
        let mut rt = rt.clone();
        async move {
            rt.container_status(v1::ContainerStatusRequest {
                container_id: id,
                verbose: false,
            })
            .await
            .map(|r| r.into_inner().status.expect("status"))
        }
    };
    wait_until("the index to be rebuilt", Duration::from_secs(15), || {
        let short = short.clone();
        async move { status(short).await.is_ok() }
    })
    .await;
    let s = status(short.clone()).await.unwrap();
    assert_eq!(s.state, v1::ContainerState::ContainerExited as i32);
    assert_eq!(
        (s.exit_code, s.reason.as_str()),
        (5, "Error"),
        "the real exit, recorded after the restart"
    );
    let s = status(long.clone()).await.unwrap();
    assert_eq!(s.state, v1::ContainerState::ContainerRunning as i32);
    let pods = rt
        .list_pod_sandbox(v1::ListPodSandboxRequest { filter: None })
        .await
        .unwrap()
        .into_inner()
        .items;
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
    let err = rt
        .run_pod_sandbox(v1::RunPodSandboxRequest {
            config: Some(pod_config.clone()),
            runtime_handler: String::new(),
        })
        .await
        .expect_err("name still taken");
    assert_eq!(err.code(), tonic::Code::AlreadyExists);
    rt.stop_pod_sandbox(v1::StopPodSandboxRequest {
        pod_sandbox_id: pod.clone(),
    })
    .await
    .unwrap();
    rt.remove_pod_sandbox(v1::RemovePodSandboxRequest {
        pod_sandbox_id: pod.clone(),
    })
    .await
    .unwrap();
    assert!(bed.ctr_ids(&["containers", "ls", "-q"]).is_empty());
}

#[tokio::test]
async fn containers_dying_during_a_containerd_outage_are_never_left_running() {
    use tokio_stream::StreamExt;
    // A private containerd we can stop; images through the test bed's mirrors; host-network
    // pods, so no CNI is needed.
    let mut bed = crate::harness::Bed::start(&format!(
        "[images]\nconfig_path = \"{}\"\n",
        crate::harness::TESTBED_CERTS
    ));
    let logs = scratch();
    let mut img = bed.remora.images();
    img.pull_image(v1::PullImageRequest {
        image: Some(v1::ImageSpec {
            image: "busybox".into(),
            ..Default::default()
        }),
        ..Default::default()
    })
    .await
    .expect("pull");
    let mut rt = bed.remora.runtime();
    let mut events = rt
        .get_container_events(v1::GetEventsRequest {})
        .await
        .unwrap()
        .into_inner();
    let pod_config = v1::PodSandboxConfig {
        metadata: Some(v1::PodSandboxMetadata {
            name: "outage".into(),
            uid: "uid-outage".into(),
            namespace: "remora-it".into(),
            attempt: 0,
        }),
        log_directory: logs.path().display().to_string(),
        linux: Some(v1::LinuxPodSandboxConfig {
            security_context: Some(v1::LinuxSandboxSecurityContext {
                namespace_options: Some(v1::NamespaceOption {
                    network: v1::NamespaceMode::Node as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let pod = rt
        .run_pod_sandbox(v1::RunPodSandboxRequest {
            config: Some(pod_config.clone()),
            runtime_handler: String::new(),
        })
        .await
        .expect("RunPodSandbox")
        .into_inner()
        .pod_sandbox_id;
    let mut ids = Vec::new();
    for (name, cmd) in [
        ("e11", "sleep 3; exit 11"),
        ("e12", "sleep 3; exit 12"),
        ("e13", "sleep 3; exit 13"),
        ("long", "sleep 3600"),
    ] {
        let id = rt
            .create_container(v1::CreateContainerRequest {
                pod_sandbox_id: pod.clone(),
                config: Some(v1::ContainerConfig {
                    metadata: Some(v1::ContainerMetadata {
                        name: name.into(),
                        attempt: 0,
                    }),
                    image: Some(v1::ImageSpec {
                        image: "busybox".into(),
                        ..Default::default()
                    }),
                    command: vec!["sh".into(), "-c".into(), cmd.into()],
                    log_path: format!("{name}.log"),
                    linux: Some(v1::LinuxContainerConfig::default()),
                    ..Default::default()
                }),
                sandbox_config: Some(pod_config.clone()),
            })
            .await
            .expect("create")
            .into_inner()
            .container_id;
        rt.start_container(v1::StartContainerRequest {
            container_id: id.clone(),
        })
        .await
        .expect("start");
        ids.push(id);
    }

    // containerd goes away; the three short containers exit while it is down.
    bed.containerd.stop();
    tokio::time::sleep(Duration::from_secs(6)).await;
    bed.containerd.restart();
    let status_rt = rt.clone();
    let status = |id: String| {
        let mut rt = status_rt.clone();
        async move {
            rt.container_status(v1::ContainerStatusRequest {
                container_id: id,
                verbose: false,
            })
            .await
            .map(|r| r.into_inner().status.expect("status"))
        }
    };
    // containerd 2.3.4 deletes, at start-up, the tasks whose process exited while it was down
    // ("cleaning leaked shim process"), and their exit status with them: remora must not keep
    // reporting them RUNNING, and must not invent an exit code. Each is either EXITED with its
    // real code (if containerd still had it) or UNKNOWN.
    for (i, code) in [11, 12, 13].into_iter().enumerate() {
        let id = ids[i].clone();
        wait_until(
            "the dead container to stop being RUNNING",
            Duration::from_secs(30),
            || {
                let id = id.clone();
                async move {
                    status(id)
                        .await
                        .is_ok_and(|s| s.state != v1::ContainerState::ContainerRunning as i32)
                }
            },
        )
        .await;
        let s = status(id).await.unwrap();
        assert_eq!(
            (s.state, s.exit_code),
            (v1::ContainerState::ContainerExited as i32, code),
            "the real exit, asked of the shim after containerd came back: {s:?}"
        );
    }
    // The long one is still watched: stopping it records its exit.
    let long = ids[3].clone();
    assert_eq!(
        status(long.clone()).await.unwrap().state,
        v1::ContainerState::ContainerRunning as i32
    );
    rt.stop_container(v1::StopContainerRequest {
        container_id: long.clone(),
        timeout: 1,
    })
    .await
    .expect("stop");
    assert_eq!(
        status(long.clone()).await.unwrap().state,
        v1::ContainerState::ContainerExited as i32
    );

    // Each exit was reported once.
    let mut stopped = std::collections::HashMap::<String, usize>::new();
    while let Ok(Some(Ok(e))) =
        tokio::time::timeout(Duration::from_millis(500), events.next()).await
    {
        if e.container_event_type == v1::ContainerEventType::ContainerStoppedEvent as i32 {
            *stopped.entry(e.container_id).or_default() += 1;
        }
    }
    for id in &ids {
        assert_eq!(
            stopped.get(id),
            Some(&1),
            "one STOPPED event for {id}: {stopped:?}"
        );
    }
    rt.stop_pod_sandbox(v1::StopPodSandboxRequest {
        pod_sandbox_id: pod.clone(),
    })
    .await
    .unwrap();
    rt.remove_pod_sandbox(v1::RemovePodSandboxRequest {
        pod_sandbox_id: pod,
    })
    .await
    .unwrap();
}
