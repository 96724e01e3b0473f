//! Containers on the test bed: real containerd, runc and CNI; images from the test registry.

use std::time::Duration;

use remora::cri::v1;
use tonic::Code;

use crate::cri::{self, container_config as container};
use crate::harness::{wait_until, BedRemora};

struct Pod<'a> {
    bed: &'a BedRemora,
    id: String,
    config: v1::PodSandboxConfig,
}

async fn start_pod<'a>(bed: &'a BedRemora, name: &str, log_dir: &std::path::Path) -> Pod<'a> {
    cri::pull(&bed.remora, "busybox")
        .await
        .expect("pull busybox");
    let config = cri::pod_config(name, log_dir, false);
    let id = cri::run_pod(&bed.remora, &config)
        .await
        .expect("RunPodSandbox");
    Pod { bed, id, config }
}

impl Pod<'_> {
    async fn create(&self, c: v1::ContainerConfig) -> Result<String, tonic::Status> {
        cri::create(&self.bed.remora, &self.id, &self.config, c).await
    }

    async fn start(&self, id: &str) {
        cri::start(&self.bed.remora, id).await;
    }

    async fn status(&self, id: &str) -> Result<v1::ContainerStatus, tonic::Status> {
        cri::status(&self.bed.remora, id).await
    }

    async fn wait_exited(&self, id: &str) -> v1::ContainerStatus {
        cri::wait_exited(&self.bed.remora, id, Duration::from_secs(30)).await
    }

    async fn remove_pod(&self) {
        cri::remove_pod(&self.bed.remora, &self.id).await;
    }
}

#[tokio::test]
async fn exit_codes_reasons_and_the_cri_log() {
    let bed = BedRemora::start_with_network();
    let logs = crate::harness::scratch();
    let pod = start_pod(&bed, "exits", logs.path()).await;

    let ok = pod
        .create(container("ok", &["sh", "-c", "echo out; echo err >&2"]))
        .await
        .expect("create");
    let fail = pod
        .create(container("fail", &["sh", "-c", "exit 3"]))
        .await
        .expect("create");
    assert_eq!(
        pod.status(&ok).await.unwrap().state,
        v1::ContainerState::ContainerCreated as i32
    );
    pod.start(&ok).await;
    pod.start(&fail).await;

    let s = pod.wait_exited(&ok).await;
    assert_eq!((s.exit_code, s.reason.as_str()), (0, "Completed"));
    assert!(s.started_at > 0 && s.finished_at >= s.started_at);
    let s = pod.wait_exited(&fail).await;
    assert_eq!((s.exit_code, s.reason.as_str()), (3, "Error"));

    // CRI log format: `<RFC3339Nano> <stream> <P|F> <line>`.
    let log = std::fs::read_to_string(logs.path().join("ok.log")).expect("log file");
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), 2, "{log}");
    let re =
        regex::Regex::new(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z (stdout|stderr) F (out|err)$")
            .unwrap();
    for l in &lines {
        assert!(re.is_match(l), "{l:?}");
    }
    assert!(
        log.contains("stdout F out") && log.contains("stderr F err"),
        "{log}"
    );

    // The exited tasks are deleted (no shim left) right after the exit is recorded; the
    // container records stay until removal.
    wait_until(
        "the exited tasks to be deleted",
        Duration::from_secs(10),
        || async {
            let tasks = bed.ctr(&["tasks", "ls"]);
            !tasks.contains(&ok) && !tasks.contains(&fail)
        },
    )
    .await;
    let records = bed.ctr_ids(&["containers", "ls", "-q"]);
    assert!(
        records.contains(&ok) && records.contains(&fail),
        "{records:?}"
    );
    pod.remove_pod().await;
    let records = bed.ctr_ids(&["containers", "ls", "-q"]);
    assert!(
        records.is_empty(),
        "RemovePodSandbox removed its containers: {records:?}"
    );
}

#[tokio::test]
async fn stop_a_running_container_then_remove_it() {
    let bed = BedRemora::start_with_network();
    let logs = crate::harness::scratch();
    let pod = start_pod(&bed, "stops", logs.path()).await;
    // A container that ignores SIGTERM: the stop escalates to SIGKILL after the timeout.
    let id = pod
        .create(container(
            "stubborn",
            &["sh", "-c", "trap '' TERM; while true; do sleep 1; done"],
        ))
        .await
        .expect("create");
    // One that does not: SIGTERM ends it.
    let polite = pod
        .create(container("polite", &["sleep", "3600"]))
        .await
        .expect("create");
    pod.start(&id).await;
    pod.start(&polite).await;
    assert_eq!(
        pod.status(&id).await.unwrap().state,
        v1::ContainerState::ContainerRunning as i32
    );
    let mut rt = bed.remora.runtime();
    rt.stop_container(v1::StopContainerRequest {
        container_id: id.clone(),
        timeout: 1,
    })
    .await
    .expect("StopContainer");
    let s = pod.status(&id).await.unwrap();
    assert_eq!(s.state, v1::ContainerState::ContainerExited as i32);
    assert_eq!(s.exit_code, 137, "killed by SIGKILL after the timeout");
    rt.stop_container(v1::StopContainerRequest {
        container_id: polite.clone(),
        timeout: 10,
    })
    .await
    .expect("StopContainer");
    assert_eq!(
        pod.status(&polite).await.unwrap().exit_code,
        143,
        "ended by SIGTERM"
    );
    // Idempotent, and for unknown ids too.
    rt.stop_container(v1::StopContainerRequest {
        container_id: id.clone(),
        timeout: 1,
    })
    .await
    .expect("stop again");
    rt.stop_container(v1::StopContainerRequest {
        container_id: "f".repeat(64),
        timeout: 1,
    })
    .await
    .expect("stop unknown");

    rt.remove_container(v1::RemoveContainerRequest {
        container_id: id.clone(),
    })
    .await
    .expect("RemoveContainer");
    assert_eq!(pod.status(&id).await.unwrap_err().code(), Code::NotFound);
    // The record and snapshot go right behind the answer (see `container_remove`).
    wait_until(
        "the record and rootfs snapshot removed",
        Duration::from_secs(30),
        || async {
            !bed.ctr_ids(&["containers", "ls", "-q"]).contains(&id)
                && !bed.ctr(&["snapshots", "ls"]).contains(&id)
        },
    )
    .await;
    rt.remove_container(v1::RemoveContainerRequest {
        container_id: id.clone(),
    })
    .await
    .expect("remove again");
    pod.remove_pod().await;
}

#[tokio::test]
async fn create_errors_are_typed() {
    let bed = BedRemora::start_with_network();
    let logs = crate::harness::scratch();
    let pod = start_pod(&bed, "errors", logs.path()).await;
    let id = pod
        .create(container("one", &["true"]))
        .await
        .expect("create");
    let err = pod
        .create(container("one", &["true"]))
        .await
        .expect_err("same name");
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");

    let mut absent = container("absent", &["true"]);
    absent.image.as_mut().unwrap().image = "registry.k8s.io/remora-it/not-pulled:1".into();
    let err = pod.create(absent).await.expect_err("image not present");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");

    let err = cri::create(
        &bed.remora,
        &"0".repeat(64),
        &pod.config,
        container("orphan", &["true"]),
    )
    .await
    .expect_err("unknown pod");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");

    let mut nameless = container("x", &["true"]);
    nameless.metadata = None;
    let err = pod.create(nameless).await.expect_err("no metadata");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");

    // Only the first container exists, in containerd too.
    let records = bed.ctr_ids(&["containers", "ls", "-q"]);
    assert_eq!(
        records.len(),
        2,
        "the pod's pause container and one container: {records:?}"
    );
    assert!(records.contains(&id));
    pod.remove_pod().await;
}

#[tokio::test]
async fn reopen_container_log_after_rotation() {
    let bed = BedRemora::start_with_network();
    let logs = crate::harness::scratch();
    let pod = start_pod(&bed, "rotate", logs.path()).await;
    let id = pod
        .create(container(
            "ticker",
            &[
                "sh",
                "-c",
                "i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.1; done",
            ],
        ))
        .await
        .expect("create");
    pod.start(&id).await;
    let log = logs.path().join("ticker.log");
    wait_until("first lines", Duration::from_secs(10), || async {
        std::fs::read_to_string(&log).is_ok_and(|s| s.lines().count() >= 2)
    })
    .await;
    let rotated = logs.path().join("ticker.log.1");
    std::fs::rename(&log, &rotated).unwrap();
    bed.remora
        .runtime()
        .reopen_container_log(v1::ReopenContainerLogRequest {
            container_id: id.clone(),
        })
        .await
        .expect("ReopenContainerLog");
    wait_until("lines in the new file", Duration::from_secs(10), || async {
        std::fs::read_to_string(&log).is_ok_and(|s| s.lines().count() >= 2)
    })
    .await;
    let old = std::fs::read_to_string(&rotated).unwrap();
    let new = std::fs::read_to_string(&log).unwrap();
    let last_old: u32 = old
        .lines()
        .last()
        .unwrap()
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let first_new: u32 = new
        .lines()
        .next()
        .unwrap()
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        first_new > last_old,
        "the new file continues where the old one ended"
    );
    pod.remove_pod().await;
}

#[tokio::test]
async fn exec_sync_output_exit_code_and_timeout() {
    let bed = BedRemora::start_with_network();
    let logs = crate::harness::scratch();
    let pod = start_pod(&bed, "execs", logs.path()).await;
    let id = pod
        .create(container("target", &["sleep", "3600"]))
        .await
        .expect("create");
    let mut rt = bed.remora.runtime();
    let exec = |cmd: &[&str], timeout: i64| v1::ExecSyncRequest {
        container_id: id.clone(),
        cmd: cmd.iter().map(|s| s.to_string()).collect(),
        timeout,
    };
    // Not running yet.
    let err = rt
        .exec_sync(exec(&["true"], 5))
        .await
        .expect_err("created, not running");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    pod.start(&id).await;

    let r = rt
        .exec_sync(exec(&["sh", "-c", "echo out; echo err >&2; exit 7"], 10))
        .await
        .expect("ExecSync")
        .into_inner();
    assert_eq!(r.stdout, b"out\n");
    assert_eq!(r.stderr, b"err\n");
    assert_eq!(r.exit_code, 7);

    let err = rt
        .exec_sync(exec(&["sleep", "30"], 1))
        .await
        .expect_err("times out");
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
    // The timed-out process was killed: only the container's own sleep is left.
    let r = rt
        .exec_sync(exec(&["sh", "-c", "ps | grep -c '[s]leep 30'"], 10))
        .await
        .expect("ExecSync")
        .into_inner();
    assert_eq!(String::from_utf8_lossy(&r.stdout).trim(), "0");
    pod.remove_pod().await;
}

#[tokio::test]
async fn stats_of_running_and_created_containers() {
    let bed = BedRemora::start_with_network();
    let logs = crate::harness::scratch();
    let pod = start_pod(&bed, "stats", logs.path()).await;
    let running = pod
        .create(container("busy", &["sleep", "3600"]))
        .await
        .expect("create");
    let created = pod
        .create(container("idle", &["true"]))
        .await
        .expect("create");
    pod.start(&running).await;
    let mut rt = bed.remora.runtime();
    let s = rt
        .container_stats(v1::ContainerStatsRequest {
            container_id: running.clone(),
        })
        .await
        .expect("ContainerStats")
        .into_inner()
        .stats
        .expect("stats");
    assert_eq!(s.attributes.as_ref().unwrap().id, running);
    let cpu = s.cpu.expect("cpu");
    assert!(cpu.timestamp > 0);
    assert!(cpu.usage_core_nano_seconds.expect("cpu usage").value > 0);
    let mem = s.memory.expect("memory");
    assert!(mem.working_set_bytes.expect("working set").value > 0);
    let layer = s.writable_layer.expect("writable layer");
    assert!(layer.fs_id.unwrap().mountpoint.ends_with("overlayfs"));

    let all = rt
        .list_container_stats(v1::ListContainerStatsRequest { filter: None })
        .await
        .expect("ListContainerStats")
        .into_inner()
        .stats;
    let ids: Vec<String> = all
        .iter()
        .map(|s| s.attributes.as_ref().unwrap().id.clone())
        .collect();
    assert!(ids.contains(&running) && ids.contains(&created), "{ids:?}");
    let idle = all
        .iter()
        .find(|s| s.attributes.as_ref().unwrap().id == created)
        .unwrap();
    assert!(
        idle.cpu.as_ref().unwrap().usage_core_nano_seconds.is_none(),
        "not running: no CPU figure"
    );
    pod.remove_pod().await;
}

/// The Linux resources ContainerStatus reports for container `id`.
async fn reported_resources(
    remora: &crate::harness::Remora,
    id: &str,
) -> v1::LinuxContainerResources {
    remora
        .runtime()
        .container_status(v1::ContainerStatusRequest {
            container_id: id.into(),
            verbose: false,
        })
        .await
        .expect("ContainerStatus")
        .into_inner()
        .status
        .and_then(|s| s.resources)
        .and_then(|r| r.linux)
        .expect("linux resources reported")
}

#[tokio::test]
async fn update_container_resources_changes_the_cgroup() {
    let bed = BedRemora::start_with_network();
    let logs = crate::harness::scratch();
    let pod = start_pod(&bed, "resize", logs.path()).await;
    let id = pod
        .create(container("resized", &["sleep", "3600"]))
        .await
        .expect("create");
    pod.start(&id).await;
    let mut rt = bed.remora.runtime();
    // ContainerStatus reports the resources the spec applies, unset ones as zero (the
    // container asked for no memory limit), then the update merged in.
    let before = reported_resources(&bed.remora, &id).await;
    assert_eq!(before.memory_limit_in_bytes, 0, "{before:?}");
    rt.update_container_resources(v1::UpdateContainerResourcesRequest {
        container_id: id.clone(),
        linux: Some(v1::LinuxContainerResources {
            memory_limit_in_bytes: 64 * 1024 * 1024,
            cpu_shares: 512,
            ..Default::default()
        }),
        ..Default::default()
    })
    .await
    .expect("UpdateContainerResources");
    let after = reported_resources(&bed.remora, &id).await;
    assert_eq!(
        (after.memory_limit_in_bytes, after.cpu_shares),
        (64 * 1024 * 1024, 512),
        "{after:?}"
    );
    assert_eq!(
        (after.cpu_period, after.cpu_quota, after.oom_score_adj),
        (before.cpu_period, before.cpu_quota, before.oom_score_adj),
        "what the update leaves out is kept"
    );
    let r = rt
        .exec_sync(v1::ExecSyncRequest {
            container_id: id.clone(),
            cmd: vec![
                "cat".into(),
                "/sys/fs/cgroup/memory/memory.limit_in_bytes".into(),
                "/sys/fs/cgroup/cpu/cpu.shares".into(),
            ],
            timeout: 10,
        })
        .await
        .expect("ExecSync")
        .into_inner();
    assert_eq!(String::from_utf8_lossy(&r.stdout), "67108864\n512\n");
    let err = rt
        .update_container_resources(v1::UpdateContainerResourcesRequest {
            container_id: id.clone(),
            linux: Some(v1::LinuxContainerResources {
                cpu_shares: -1,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect_err("negative shares");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    pod.remove_pod().await;
}

#[tokio::test]
async fn get_container_events_streams_the_lifecycle() {
    use tokio_stream::StreamExt;
    let bed = BedRemora::start_with_network();
    let logs = crate::harness::scratch();
    let mut events = bed
        .remora
        .runtime()
        .get_container_events(v1::GetEventsRequest {})
        .await
        .expect("GetContainerEvents")
        .into_inner();
    let pod = start_pod(&bed, "events", logs.path()).await;
    let id = pod
        .create(container("brief", &["true"]))
        .await
        .expect("create");
    pod.start(&id).await;
    pod.wait_exited(&id).await;
    bed.remora
        .runtime()
        .remove_container(v1::RemoveContainerRequest {
            container_id: id.clone(),
        })
        .await
        .expect("remove");

    let mut seen = Vec::new();
    while seen.len() < 4 {
        let e = tokio::time::timeout(Duration::from_secs(10), events.next())
            .await
            .expect("an event within 10 s")
            .expect("stream open")
            .expect("event");
        if e.container_id == id {
            assert_eq!(
                e.pod_sandbox_status.as_ref().map(|s| s.id.clone()),
                Some(pod.id.clone()),
                "the pod's status comes with the event"
            );
            seen.push(e.container_event_type);
        }
    }
    use v1::ContainerEventType as T;
    assert_eq!(
        seen,
        vec![
            T::ContainerCreatedEvent as i32,
            T::ContainerStartedEvent as i32,
            T::ContainerStoppedEvent as i32,
            T::ContainerDeletedEvent as i32
        ]
    );

    // PodSandboxStatus carries a timestamp and every container's status (kubelet's evented
    // PLEG reads the pod's containers from it instead of listing them), newest first (kubelet
    // 1.37 takes a container's restart count from the first status with its name).
    let mut kept = Vec::new();
    // Five, so that an unordered answer matches by chance once in 120 runs.
    for name in ["kept", "kept-2", "kept-3", "kept-4", "kept-5"] {
        kept.push(
            pod.create(container(name, &["sleep", "3600"]))
                .await
                .expect("create"),
        );
    }
    kept.reverse();
    let status = bed
        .remora
        .runtime()
        .pod_sandbox_status(v1::PodSandboxStatusRequest {
            pod_sandbox_id: pod.id.clone(),
            verbose: false,
        })
        .await
        .expect("PodSandboxStatus")
        .into_inner();
    assert!(status.timestamp > 0, "timestamp set");
    let ids: Vec<&str> = status
        .containers_statuses
        .iter()
        .map(|c| c.id.as_str())
        .collect();
    assert_eq!(ids, kept, "the pod's containers, newest first");

    // The pod's own Deleted event still carries the pod's (last) status.
    pod.remove_pod().await;
    loop {
        let e = tokio::time::timeout(Duration::from_secs(10), events.next())
            .await
            .expect("the pod's Deleted event within 10 s")
            .expect("stream open")
            .expect("event");
        if e.container_id == pod.id && e.container_event_type == T::ContainerDeletedEvent as i32 {
            let s = e.pod_sandbox_status.expect("a removed pod's status");
            assert_eq!(s.id, pod.id);
            assert_eq!(
                s.metadata.map(|m| m.name),
                Some(pod.config.metadata.as_ref().unwrap().name.clone())
            );
            break;
        }
    }
}

#[tokio::test]
async fn oom_users_readonly_rootfs_and_capabilities() {
    let bed = BedRemora::start_with_network();
    let logs = crate::harness::scratch();
    let pod = start_pod(&bed, "security", logs.path()).await;
    let mut rt = bed.remora.runtime();
    let exec = |id: &str, cmd: &str| v1::ExecSyncRequest {
        container_id: id.to_string(),
        cmd: vec!["sh".into(), "-c".into(), cmd.into()],
        timeout: 10,
    };

    // OOM: a shell that doubles a string until the 32 MiB limit kills it.
    let mut hog = container(
        "hog",
        &[
            "sh",
            "-c",
            "s=xxxxxxxxxxxxxxxx; while true; do s=\"$s$s\"; done",
        ],
    );
    hog.linux = Some(v1::LinuxContainerConfig {
        resources: Some(v1::LinuxContainerResources {
            memory_limit_in_bytes: 32 * 1024 * 1024,
            ..Default::default()
        }),
        ..Default::default()
    });
    let hog = pod.create(hog).await.expect("create");
    pod.start(&hog).await;
    let s = pod.wait_exited(&hog).await;
    assert_eq!((s.exit_code, s.reason.as_str()), (137, "OOMKilled"));

    // Users by number and by name (from the image's /etc/passwd).
    let mut by_uid = container("uid", &["sleep", "3600"]);
    by_uid.linux = Some(v1::LinuxContainerConfig {
        security_context: Some(v1::LinuxContainerSecurityContext {
            run_as_user: Some(v1::Int64Value { value: 1234 }),
            run_as_group: Some(v1::Int64Value { value: 5678 }),
            ..Default::default()
        }),
        ..Default::default()
    });
    let by_uid = pod.create(by_uid).await.expect("create");
    pod.start(&by_uid).await;
    let r = rt
        .exec_sync(exec(&by_uid, "id -u; id -g"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(String::from_utf8_lossy(&r.stdout), "1234\n5678\n");

    let mut by_name = container("name", &["sleep", "3600"]);
    by_name.linux = Some(v1::LinuxContainerConfig {
        security_context: Some(v1::LinuxContainerSecurityContext {
            run_as_username: "nobody".into(),
            ..Default::default()
        }),
        ..Default::default()
    });
    let by_name = pod.create(by_name).await.expect("create");
    pod.start(&by_name).await;
    let r = rt
        .exec_sync(exec(&by_name, "id -un"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(String::from_utf8_lossy(&r.stdout), "nobody\n");

    // Read-only rootfs and dropped capabilities.
    let mut locked = container("locked", &["sleep", "3600"]);
    locked.linux = Some(v1::LinuxContainerConfig {
        security_context: Some(v1::LinuxContainerSecurityContext {
            readonly_rootfs: true,
            capabilities: Some(v1::Capability {
                drop_capabilities: vec!["ALL".into()],
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    let locked = pod.create(locked).await.expect("create");
    pod.start(&locked).await;
    let r = rt
        .exec_sync(exec(&locked, "touch /newfile"))
        .await
        .unwrap()
        .into_inner();
    assert_ne!(r.exit_code, 0, "the root filesystem is read-only");
    let r = rt
        .exec_sync(exec(&locked, "grep CapEff /proc/self/status"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        String::from_utf8_lossy(&r.stdout).trim(),
        "CapEff:\t0000000000000000"
    );
    pod.remove_pod().await;
}

/// kubelet bind-mounts regular files into every container (`/etc/hosts`,
/// `/dev/termination-log`): an existing file, a symlink to one and a missing source (created
/// as a directory, containerd's rule) all work, and `readonly` is honoured on a file.
#[tokio::test]
async fn bind_mount_sources_files_symlinks_and_missing_ones() {
    let bed = BedRemora::start_with_network();
    let logs = crate::harness::scratch();
    let host = crate::harness::scratch();
    let pod = start_pod(&bed, "mounts", logs.path()).await;
    let mut rt = bed.remora.runtime();
    let exec = |id: &str, cmd: &str| v1::ExecSyncRequest {
        container_id: id.to_string(),
        cmd: vec!["sh".into(), "-c".into(), cmd.into()],
        timeout: 10,
    };

    let rw_file = host.path().join("termination-log");
    std::fs::write(&rw_file, "").unwrap();
    let ro_file = host.path().join("etc-hosts");
    std::fs::write(&ro_file, "10.1.2.3 from-the-host\n").unwrap();
    let target = host.path().join("target.txt");
    std::fs::write(&target, "through a symlink\n").unwrap();
    let link = host.path().join("link.txt");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let missing = host.path().join("not/yet/there");
    let mount = |host_path: &std::path::Path, container_path: &str, readonly: bool| v1::Mount {
        host_path: host_path.display().to_string(),
        container_path: container_path.into(),
        readonly,
        ..Default::default()
    };
    let mut c = container("mounts", &["sleep", "3600"]);
    c.mounts = vec![
        mount(&rw_file, "/dev/termination-log", false),
        mount(&ro_file, "/etc/hosts", true),
        mount(&link, "/data/linked.txt", true),
        mount(&missing, "/made", false),
    ];
    let id = pod
        .create(c)
        .await
        .expect("CreateContainer with file mounts");
    pod.start(&id).await;

    // A writable file: what the container writes reaches the host file.
    let r = rt
        .exec_sync(exec(&id, "echo bye > /dev/termination-log"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.exit_code, 0, "{}", String::from_utf8_lossy(&r.stderr));
    assert_eq!(std::fs::read_to_string(&rw_file).unwrap(), "bye\n");

    // A read-only file: readable, not writable.
    let r = rt
        .exec_sync(exec(&id, "cat /etc/hosts"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        String::from_utf8_lossy(&r.stdout),
        "10.1.2.3 from-the-host\n"
    );
    let r = rt
        .exec_sync(exec(&id, "echo x >> /etc/hosts"))
        .await
        .unwrap()
        .into_inner();
    assert_ne!(r.exit_code, 0, "a readonly file mount must refuse writes");
    assert_eq!(
        std::fs::read_to_string(&ro_file).unwrap(),
        "10.1.2.3 from-the-host\n"
    );

    // A symlinked source mounts its target.
    let r = rt
        .exec_sync(exec(&id, "cat /data/linked.txt"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(String::from_utf8_lossy(&r.stdout), "through a symlink\n");

    // A missing source was created as a directory and is shared with the host.
    assert!(missing.is_dir(), "missing source created as a directory");
    let r = rt
        .exec_sync(exec(&id, "echo hi > /made/f"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.exit_code, 0, "{}", String::from_utf8_lossy(&r.stderr));
    assert_eq!(std::fs::read_to_string(missing.join("f")).unwrap(), "hi\n");

    // A symlink to nothing is refused with the path named, and nothing is left behind.
    let dangling = host.path().join("dangling");
    std::os::unix::fs::symlink(host.path().join("nowhere"), &dangling).unwrap();
    let mut bad = container("dangling", &["sleep", "3600"]);
    bad.mounts = vec![mount(&dangling, "/x", false)];
    let err = pod.create(bad).await.expect_err("dangling symlink source");
    assert!(
        err.message().contains(&dangling.display().to_string()),
        "{err:?}"
    );
    assert!(!host.path().join("nowhere").exists());
    pod.remove_pod().await;
}

/// Recursive read-only mounts: with `recursive_read_only` a submount of the mount's source
/// (a tmpfs here) is read-only too, without it only the top mount is; the handler's
/// `RuntimeStatus` features say rro is supported (runc has the `rro` option, the kernel
/// `mount_setattr`), and the CRI's invalid combinations are refused naming the field.
#[tokio::test]
async fn recursive_read_only_mounts_cover_submounts() {
    let bed = BedRemora::start_with_network();
    let logs = crate::harness::scratch();
    let host = crate::harness::scratch();
    let status = bed
        .remora
        .runtime()
        .status(v1::StatusRequest { verbose: false })
        .await
        .expect("Status")
        .into_inner();
    let default = status
        .runtime_handlers
        .iter()
        .find(|h| h.name.is_empty())
        .expect("the default handler is reported under \"\"");
    // The pinned runc lists the `rro` option and this kernel has mount_setattr; crun 1.8 has
    // no `features` command, so its handler claims nothing.
    let supported = crate::harness::it_handler() != "crun";
    assert_eq!(
        default
            .features
            .as_ref()
            .expect("features")
            .recursive_read_only_mounts,
        supported,
        "{status:?}"
    );
    assert!(
        status
            .features
            .as_ref()
            .is_some_and(|f| f.supplemental_groups_policy),
        "{status:?}"
    );

    let sub = host.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    nix::mount::mount(
        Some("tmpfs"),
        &sub,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=1m"),
    )
    .expect("mount a tmpfs under the host path");
    /// Unmounts the tmpfs however the test ends.
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        }
    }
    let _unmount = Unmount(sub.clone());
    let pod = start_pod(&bed, "rro", logs.path()).await;
    let mut rt = bed.remora.runtime();
    let touch = |id: &str| v1::ExecSyncRequest {
        container_id: id.to_string(),
        cmd: vec!["sh".into(), "-c".into(), "touch /mnt/sub/f 2>&1".into()],
        timeout: 10,
    };
    let mount = |recursive: bool| v1::Mount {
        host_path: host.path().display().to_string(),
        container_path: "/mnt".into(),
        readonly: true,
        recursive_read_only: recursive,
        ..Default::default()
    };

    let mut plain = container("ro", &["sleep", "3600"]);
    plain.mounts = vec![mount(false)];
    let plain = pod.create(plain).await.expect("create with a ro mount");
    pod.start(&plain).await;
    let r = rt.exec_sync(touch(&plain)).await.unwrap().into_inner();
    assert_eq!(
        r.exit_code,
        0,
        "ro alone leaves the submount writable: {}",
        String::from_utf8_lossy(&r.stdout)
    );

    let mut rro = container("rro", &["sleep", "3600"]);
    rro.mounts = vec![mount(true)];
    if !supported {
        let err = pod
            .create(rro)
            .await
            .expect_err("rro on a handler without it");
        assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
        pod.remove_pod().await;
        return;
    }
    let rro = pod.create(rro).await.expect("create with an rro mount");
    pod.start(&rro).await;
    let status = pod.status(&rro).await.expect("ContainerStatus");
    assert!(status.mounts[0].recursive_read_only, "{status:?}");
    let r = rt.exec_sync(touch(&rro)).await.unwrap().into_inner();
    assert_ne!(r.exit_code, 0, "rro makes the submount read-only too");
    assert!(
        String::from_utf8_lossy(&r.stdout).contains("Read-only file system"),
        "{}",
        String::from_utf8_lossy(&r.stdout)
    );

    for (readonly, propagation, what) in [
        (false, v1::MountPropagation::PropagationPrivate, "readonly"),
        (
            true,
            v1::MountPropagation::PropagationHostToContainer,
            "PROPAGATION_PRIVATE",
        ),
        (
            true,
            v1::MountPropagation::PropagationBidirectional,
            "PROPAGATION_PRIVATE",
        ),
    ] {
        let mut bad = container("bad-rro", &["sleep", "3600"]);
        bad.mounts = vec![v1::Mount {
            readonly,
            propagation: propagation as i32,
            ..mount(true)
        }];
        let err = pod.create(bad).await.expect_err("an invalid rro mount");
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(
            err.message()
                .contains("config.mounts[0].recursive_read_only")
                && err.message().contains(what),
            "{err:?}"
        );
    }
    pod.remove_pod().await;
}

/// SupplementalGroupsPolicy: `Merge` adds the groups the image's `/etc/group` gives the user,
/// `Strict` only the configured ones; the first process, an exec'd one and
/// `ContainerStatus.user` agree.
#[tokio::test]
async fn supplemental_groups_policies_merge_and_strict() {
    const IMAGE: &str = "gcr.io/k8s-staging-cri-tools/test-image-predefined-group:latest";
    let bed = BedRemora::start_with_network();
    let logs = crate::harness::scratch();
    let pod = start_pod(&bed, "groups", logs.path()).await;
    cri::pull(&bed.remora, IMAGE)
        .await
        .expect("pull the predefined-group image");
    let mut rt = bed.remora.runtime();
    for (policy, want) in [
        (v1::SupplementalGroupsPolicy::Merge, vec![1000, 1234, 50000]),
        (v1::SupplementalGroupsPolicy::Strict, vec![1000, 1234]),
    ] {
        let mut c = container(&format!("{policy:?}").to_lowercase(), &["sleep", "3600"]);
        c.image = Some(cri::image_spec(IMAGE));
        c.linux = Some(v1::LinuxContainerConfig {
            security_context: Some(v1::LinuxContainerSecurityContext {
                run_as_user: Some(v1::Int64Value { value: 1000 }),
                supplemental_groups: vec![1234],
                supplemental_groups_policy: policy as i32,
                ..Default::default()
            }),
            ..Default::default()
        });
        let id = pod.create(c).await.expect("create");
        pod.start(&id).await;
        let r = rt
            .exec_sync(v1::ExecSyncRequest {
                container_id: id.clone(),
                cmd: vec!["id".into(), "-G".into()],
                timeout: 10,
            })
            .await
            .unwrap()
            .into_inner();
        let mut seen: Vec<i64> = String::from_utf8_lossy(&r.stdout)
            .split_whitespace()
            .map(|g| g.parse().expect("a gid"))
            .collect();
        seen.sort_unstable();
        assert_eq!(seen, want, "{policy:?}: id -G");
        let user = pod
            .status(&id)
            .await
            .expect("ContainerStatus")
            .user
            .and_then(|u| u.linux)
            .expect("ContainerStatus.user.linux");
        let mut groups = user.supplemental_groups.clone();
        groups.sort_unstable();
        assert_eq!(
            (user.uid, user.gid, groups),
            (1000, 1000, want),
            "{policy:?}"
        );
    }
    pod.remove_pod().await;
}

/// Image volumes: an image's files appear read-only at the mount; ContainerStatus names the
/// image as asked and as resolved; an image not pulled is NOT_FOUND naming the mount; removal
/// leaves no mount and no view snapshot.
#[tokio::test]
async fn image_volumes_mount_an_image_read_only() {
    let bed = BedRemora::start_with_network();
    let logs = crate::harness::scratch();
    let pod = start_pod(&bed, "imagevol", logs.path()).await;
    let mut rt = bed.remora.runtime();
    let volume = |image: &str| v1::Mount {
        container_path: "/image".into(),
        readonly: true,
        image: Some(cri::image_spec(image)),
        ..Default::default()
    };

    // An image volume is read-only by definition: asking for it writable is refused, naming
    // the field (containerd refuses it too), not quietly made read-only.
    let mut writable = container("writable", &["sleep", "3600"]);
    writable.mounts = vec![v1::Mount {
        readonly: false,
        ..volume("busybox")
    }];
    let err = pod
        .create(writable)
        .await
        .expect_err("a writable image volume");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("config.mounts[0].readonly"),
        "{err:?}"
    );

    let mut absent = container("absent", &["sleep", "3600"]);
    absent.mounts = vec![volume("docker.io/library/never-pulled:1")];
    let err = pod.create(absent).await.expect_err("an image not pulled");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert!(
        err.message().contains("/image") && err.message().contains("never-pulled"),
        "{err:?}"
    );

    let mut c = container("vol", &["sleep", "3600"]);
    c.mounts = vec![volume("busybox")];
    let id = pod.create(c).await.expect("create with an image volume");
    pod.start(&id).await;
    let run = |cmd: &str| v1::ExecSyncRequest {
        container_id: id.clone(),
        cmd: vec!["sh".into(), "-c".into(), cmd.into()],
        timeout: 10,
    };
    let r = rt
        .exec_sync(run("test -x /image/bin/busybox && echo present"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(String::from_utf8_lossy(&r.stdout), "present\n");
    let r = rt
        .exec_sync(run("touch /image/x 2>&1"))
        .await
        .unwrap()
        .into_inner();
    assert_ne!(r.exit_code, 0, "an image volume is read-only");
    assert!(
        String::from_utf8_lossy(&r.stdout).contains("Read-only file system"),
        "{}",
        String::from_utf8_lossy(&r.stdout)
    );
    let status = pod.status(&id).await.expect("ContainerStatus");
    let image = status.mounts[0].image.as_ref().expect("the mount's image");
    assert_eq!(image.user_specified_image, "busybox");
    assert!(image.image.contains("@sha256:"), "{image:?}");
    // `image_ref` (cri-api v0.37) is what PullImage answered, as critest compares it.
    let pulled = cri::pull(&bed.remora, "busybox")
        .await
        .expect("pull busybox");
    assert_eq!(image.image_ref, pulled);
    let view = format!("{id}-imagevolume-0");
    assert!(
        bed.ctr(&["snapshots", "ls"]).contains(&view),
        "the view snapshot exists"
    );

    pod.remove_pod().await;
    assert!(
        !bed.ctr(&["snapshots", "ls"]).contains(&view),
        "the view snapshot is removed with the container"
    );
    let dir = bed.state_dir().join("image-volumes").join(&id);
    assert!(!dir.exists(), "{} is left", dir.display());
    assert!(
        !crate::testbed::mount_points()
            .iter()
            .any(|m| m.contains(&id)),
        "no mount names the container"
    );
}

/// An image volume's sub path (cri-api v0.33 `Mount.image_sub_path`): the container sees that
/// directory of the image at the mount, read-only, and nothing above it; a sub path that is
/// missing, a file, or climbs to a host directory the image lacks is INVALID_ARGUMENT naming
/// the field, and leaves no mount, no view snapshot and no directory behind.
#[tokio::test]
async fn image_volume_sub_paths_show_one_directory_and_hostile_ones_leave_nothing() {
    let mut bed = BedRemora::start_with_network();
    let logs = crate::harness::scratch();
    let pod = start_pod(&bed, "subpath", logs.path()).await;
    let mut rt = bed.remora.runtime();
    let volume = |sub_path: &str| v1::Mount {
        container_path: "/image".into(),
        readonly: true,
        image: Some(cri::image_spec("busybox")),
        image_sub_path: sub_path.into(),
        ..Default::default()
    };
    let views = || {
        bed.ctr(&["snapshots", "ls"])
            .lines()
            .filter(|l| l.contains("-imagevolume-"))
            .count()
    };
    let volume_dir = bed.state_dir().join("image-volumes");
    let volume_mounts = || crate::testbed::mount_points_under(&volume_dir);

    // The state dir exists on the host, not in the image: `..` must not reach it.
    let host_dir = format!("../../../..{}", bed.state_dir().display());
    for (sub_path, why) in [
        ("no/such/dir", "does not exist"),
        ("bin/busybox", "is not a directory"),
        (host_dir.as_str(), "does not exist"),
    ] {
        let mut c = container("hostile", &["sleep", "3600"]);
        c.mounts = vec![volume(sub_path)];
        let err = pod.create(c).await.expect_err(sub_path);
        assert_eq!(err.code(), Code::InvalidArgument, "{sub_path:?}: {err:?}");
        assert!(
            err.message().contains("config.mounts[0].image_sub_path")
                && err.message().contains(why),
            "{sub_path:?}: {err:?}"
        );
        assert_eq!(views(), 0, "{sub_path:?}: a view snapshot is left");
        assert_eq!(volume_mounts(), Vec::<String>::new(), "{sub_path:?}");
        let left: Vec<_> = std::fs::read_dir(&volume_dir)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "{sub_path:?}: {left:?} left");
    }

    let mut c = container("etc", &["sleep", "3600"]);
    c.mounts = vec![volume("etc")];
    let id = pod.create(c).await.expect("create with a sub path");
    pod.start(&id).await;
    let run = |cmd: &str| v1::ExecSyncRequest {
        container_id: id.clone(),
        cmd: vec!["sh".into(), "-c".into(), cmd.into()],
        timeout: 10,
    };
    let r = rt
        .exec_sync(run(
            "test -f /image/passwd && test ! -e /image/etc && test ! -e /image/bin && echo etc",
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        String::from_utf8_lossy(&r.stdout),
        "etc\n",
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
    let r = rt
        .exec_sync(run("touch /image/x 2>&1"))
        .await
        .unwrap()
        .into_inner();
    assert!(
        String::from_utf8_lossy(&r.stdout).contains("Read-only file system"),
        "{}",
        String::from_utf8_lossy(&r.stdout)
    );
    let status = pod.status(&id).await.expect("ContainerStatus");
    assert_eq!(status.mounts[0].image_sub_path, "etc");
    assert_eq!(volume_mounts().len(), 2, "the view and the sub path's bind");
    let pod_id = pod.id.clone();
    drop(pod);

    // The record keeps the sub path and the image id across a restart of remora.
    bed.crash();
    bed.restart();
    wait_until(
        "the index to be rebuilt",
        Duration::from_secs(15),
        || async { cri::status(&bed.remora, &id).await.is_ok() },
    )
    .await;
    let status = cri::status(&bed.remora, &id)
        .await
        .expect("ContainerStatus");
    let pulled = cri::pull(&bed.remora, "busybox")
        .await
        .expect("pull busybox");
    assert_eq!(status.mounts[0].image_sub_path, "etc");
    assert_eq!(
        status.mounts[0]
            .image
            .as_ref()
            .map(|i| i.image_ref.as_str()),
        Some(pulled.as_str())
    );

    cri::remove_pod(&bed.remora, &pod_id).await;
    let views = bed
        .ctr(&["snapshots", "ls"])
        .lines()
        .filter(|l| l.contains("-imagevolume-"))
        .count();
    assert_eq!(views, 0, "the view snapshot is removed with the container");
    assert_eq!(volume_mounts(), Vec::<String>::new());
    assert!(!volume_dir.join(&id).exists());
}

/// The Stream* RPCs (cri-api v0.36, KEP-5825) answer what their List* counterparts answer, in
/// non-empty messages; the RPCs remora does not implement answer UNIMPLEMENTED naming
/// themselves.
#[tokio::test]
async fn stream_rpcs_answer_what_the_lists_answer() {
    let bed = BedRemora::start_with_network();
    let logs = crate::harness::scratch();
    let pod = start_pod(&bed, "streams", logs.path()).await;
    let id = pod
        .create(container("sleeper", &["sleep", "3600"]))
        .await
        .expect("create");
    pod.start(&id).await;
    let mut rt = bed.remora.runtime();

    let listed = rt
        .list_containers(v1::ListContainersRequest::default())
        .await
        .expect("list containers")
        .into_inner()
        .containers;
    let mut s = rt
        .stream_containers(v1::StreamContainersRequest::default())
        .await
        .expect("stream containers")
        .into_inner();
    let mut streamed = Vec::new();
    while let Some(m) = s.message().await.expect("a message") {
        assert!(!m.containers.is_empty(), "an empty message");
        streamed.extend(m.containers);
    }
    assert_eq!(streamed, listed);

    let listed = cri::list_pods(&bed.remora).await;
    let mut s = rt
        .stream_pod_sandboxes(v1::StreamPodSandboxesRequest::default())
        .await
        .expect("stream pods")
        .into_inner();
    let mut streamed = Vec::new();
    while let Some(m) = s.message().await.expect("a message") {
        streamed.extend(m.pod_sandboxes);
    }
    assert_eq!(streamed, listed);

    let mut images = bed.remora.images();
    let listed = images
        .list_images(v1::ListImagesRequest::default())
        .await
        .expect("list images")
        .into_inner()
        .images;
    let mut s = images
        .stream_images(v1::StreamImagesRequest::default())
        .await
        .expect("stream images")
        .into_inner();
    let mut streamed = Vec::new();
    while let Some(m) = s.message().await.expect("a message") {
        streamed.extend(m.images);
    }
    assert_eq!(streamed, listed);

    // Stats are read anew for each call: the same containers, not the same figures.
    let mut s = rt
        .stream_container_stats(v1::StreamContainerStatsRequest::default())
        .await
        .expect("stream container stats")
        .into_inner();
    let mut ids = Vec::new();
    while let Some(m) = s.message().await.expect("a message") {
        ids.extend(
            m.container_stats
                .into_iter()
                .filter_map(|c| c.attributes.map(|a| a.id)),
        );
    }
    assert!(ids.contains(&id), "{ids:?}");

    pod.remove_pod().await;
}

/// A CDI spec `vendor.example/dev=null`: the host's /dev/null at /dev/cdi-null, env
/// `CDI_TEST=<value>` and `mount_dir` mounted read-only at /cdi-mount.
fn cdi_spec(value: &str, mount_dir: &std::path::Path) -> String {
    format!(
        r#"{{"cdiVersion":"0.6.0","kind":"vendor.example/dev","devices":[{{"name":"null",
  "containerEdits":{{"env":["CDI_TEST={value}"],
  "deviceNodes":[{{"path":"/dev/cdi-null","hostPath":"/dev/null"}}],
  "mounts":[{{"hostPath":"{}","containerPath":"/cdi-mount","options":["ro","rbind"]}}]}}}}]}}"#,
        mount_dir.display()
    )
}

/// Writes `text` to `path` through a rename, as drivers replace spec files.
fn replace_file(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write spec");
    std::fs::rename(&tmp, path).expect("rename spec");
}

#[tokio::test]
async fn cdi_devices_reach_the_container() {
    let cdi = crate::harness::scratch();
    let specs = cdi.path().join("specs");
    let mount_dir = cdi.path().join("mounted");
    std::fs::create_dir_all(&specs).unwrap();
    std::fs::create_dir_all(&mount_dir).unwrap();
    std::fs::write(mount_dir.join("marker"), "from-the-cdi-mount\n").unwrap();
    let spec_file = specs.join("vendor-example.json");
    replace_file(&spec_file, &cdi_spec("1", &mount_dir));
    let bed = BedRemora::start_with_network_and(&format!(
        "[cdi]\nspec_dirs = [\"/nonexistent-cdi-dir\", \"{}\"]\n",
        specs.display()
    ));
    let logs = crate::harness::scratch();
    let pod = start_pod(&bed, "cdi", logs.path()).await;
    let script = "stat -c 'node %t:%T' /dev/cdi-null && echo x > /dev/cdi-null && echo wrote; \
                  echo env CDI_TEST=$CDI_TEST; cat /cdi-mount/marker";
    let with_device = |name: &str, device: &str| {
        let mut c = container(name, &["sh", "-c", script]);
        c.cdi_devices = vec![v1::CdiDevice {
            name: device.into(),
        }];
        c
    };

    let first = pod
        .create(with_device("first", "vendor.example/dev=null"))
        .await
        .expect("create with a CDI device");
    pod.start(&first).await;
    let s = pod.wait_exited(&first).await;
    let log = std::fs::read_to_string(logs.path().join("first.log")).expect("log file");
    assert_eq!(s.exit_code, 0, "{log}");
    for want in ["node 1:3", "wrote", "env CDI_TEST=1", "from-the-cdi-mount"] {
        assert!(log.contains(want), "{want:?} in {log}");
    }

    // Unknown: refused by name, nothing made in containerd.
    let before = bed.ctr_ids(&["containers", "ls", "-q"]);
    let snapshots_before = bed.ctr(&["snapshots", "ls"]);
    let err = pod
        .create(with_device("unknown", "vendor.example/dev=nope"))
        .await
        .expect_err("unknown CDI device");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("vendor.example/dev=nope")
            && err.message().contains("config.cdi_devices[0]"),
        "{err:?}"
    );
    assert_eq!(bed.ctr_ids(&["containers", "ls", "-q"]), before);
    assert_eq!(bed.ctr(&["snapshots", "ls"]), snapshots_before);

    // The spec file changed: the next container sees the new edits.
    replace_file(&spec_file, &cdi_spec("2", &mount_dir));
    let second = pod
        .create(with_device("second", "vendor.example/dev=null"))
        .await
        .expect("create after the spec changed");
    pod.start(&second).await;
    let s = pod.wait_exited(&second).await;
    let log = std::fs::read_to_string(logs.path().join("second.log")).expect("log file");
    assert_eq!(s.exit_code, 0, "{log}");
    assert!(log.contains("env CDI_TEST=2"), "{log}");
    pod.remove_pod().await;
}

/// RSS and PSS (KiB) of a process, from `/proc/<pid>/smaps_rollup`.
fn rss_pss_kib(pid: i32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).expect("smaps_rollup");
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in smaps_rollup: {text}"))
    };
    (field("Rss:"), field("Pss:"))
}

/// remora's shim does not grow with what its pod has run (issue 29): after a warm-up (20
/// ExecSyncs, 2 container restarts), 200 more ExecSyncs and 20 more restarts (StopContainer,
/// RemoveContainer, CreateContainer, StartContainer) leave the shim's RSS within 256 KiB of
/// where the warm-up left it. A shim that kept anything per exec or per container (a task, a
/// pipe, a map entry, an event) would grow by more than that over 220 of them.
#[tokio::test]
async fn remoras_shim_does_not_grow_with_execs_and_restarts() {
    let bed = BedRemora::start_with_network();
    let logs = crate::harness::scratch();
    cri::pull(&bed.remora, "busybox")
        .await
        .expect("pull busybox");
    let config = cri::pod_config("shim-memory", logs.path(), false);
    let pod = bed
        .remora
        .runtime()
        .run_pod_sandbox(v1::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: "remora".into(),
        })
        .await
        .expect("RunPodSandbox with handler remora")
        .into_inner()
        .pod_sandbox_id;
    let mut id = cri::create_and_start(
        &bed.remora,
        &pod,
        &config,
        container("c", &["sleep", "3600"]),
    )
    .await;
    let mut attempt = 0;
    execs_and_restarts(&bed, &pod, &config, &mut id, &mut attempt, 20, 2).await;
    let shim = crate::harness::shim_pid("containerd-shim-remora-v2", &bed.namespace, &pod)
        .expect("the pod's shim (remora's)");
    let before = rss_pss_kib(shim);
    execs_and_restarts(&bed, &pod, &config, &mut id, &mut attempt, 200, 20).await;
    let after = rss_pss_kib(shim);
    eprintln!(
        "remora's shim: RSS {} → {} KiB, PSS {} → {} KiB over 200 execs and 20 restarts",
        before.0, after.0, before.1, after.1
    );
    assert!(
        after.0 <= before.0 + 256,
        "the shim grew from {} to {} KiB RSS over 200 execs and 20 restarts",
        before.0,
        after.0
    );
    cri::remove_pod(&bed.remora, &pod).await;
}

/// `execs` ExecSyncs of `true` in container `id`, then `restarts` times: the container stopped,
/// removed, and created and started again as the next attempt (`id` follows it).
async fn execs_and_restarts(
    bed: &BedRemora,
    pod: &str,
    config: &v1::PodSandboxConfig,
    id: &mut String,
    attempt: &mut u32,
    execs: usize,
    restarts: usize,
) {
    let mut rt = bed.remora.runtime();
    for _ in 0..execs {
        let r = rt
            .exec_sync(v1::ExecSyncRequest {
                container_id: id.clone(),
                cmd: vec!["true".into()],
                timeout: 10,
            })
            .await
            .expect("ExecSync")
            .into_inner();
        assert_eq!(r.exit_code, 0);
    }
    for _ in 0..restarts {
        rt.stop_container(v1::StopContainerRequest {
            container_id: id.clone(),
            timeout: 0,
        })
        .await
        .expect("StopContainer");
        rt.remove_container(v1::RemoveContainerRequest {
            container_id: id.clone(),
        })
        .await
        .expect("RemoveContainer");
        *attempt += 1;
        let mut c = container("c", &["sleep", "3600"]);
        c.metadata.as_mut().expect("metadata").attempt = *attempt;
        *id = cri::create_and_start(&bed.remora, pod, config, c).await;
    }
}
