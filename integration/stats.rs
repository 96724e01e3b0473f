//! Pod stats and CRI metrics on the test bed: the numbers move when a container burns CPU,
//! allocates memory, and when traffic reaches the pod's network namespace.

use std::time::Duration;

use remora::cri::v1;
use tonic::Code;

use crate::cri;
use crate::harness::{unique, wait_until, BedRemora};

const LIMIT: Duration = Duration::from_secs(60);

/// Removes the pod cgroup `parent` (and its own parent) the containers were created under, in
/// every mounted hierarchy (runc makes it in each, `name=systemd` and the hybrid `unified` one
/// included; kubelet, not the runtime, removes a pod's cgroup).
struct CgroupParent(String);

impl Drop for CgroupParent {
    fn drop(&mut self) {
        let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
            return;
        };
        for h in hierarchies.flatten() {
            let pod = h.path().join(self.0.trim_start_matches('/'));
            let _ = std::fs::remove_dir(&pod);
            if let Some(top) = pod.parent() {
                let _ = std::fs::remove_dir(top);
            }
        }
    }
}

async fn pod_stats(bed: &BedRemora, id: &str) -> Result<v1::PodSandboxStats, tonic::Status> {
    bed.remora
        .runtime()
        .pod_sandbox_stats(v1::PodSandboxStatsRequest {
            pod_sandbox_id: id.into(),
        })
        .await
        .map(|r| r.into_inner().stats.expect("stats"))
}

fn linux(s: &v1::PodSandboxStats) -> &v1::LinuxPodSandboxStats {
    s.linux.as_ref().expect("linux stats")
}

fn cpu_ns(c: &Option<v1::CpuUsage>) -> u64 {
    c.as_ref()
        .and_then(|c| c.usage_core_nano_seconds.as_ref())
        .map_or(0, |v| v.value)
}

fn working_set(m: &Option<v1::MemoryUsage>) -> u64 {
    m.as_ref()
        .and_then(|m| m.working_set_bytes.as_ref())
        .map_or(0, |v| v.value)
}

fn container<'a>(s: &'a v1::PodSandboxStats, id: &str) -> &'a v1::ContainerStats {
    linux(s)
        .containers
        .iter()
        .find(|c| c.attributes.as_ref().is_some_and(|a| a.id == id))
        .unwrap_or_else(|| panic!("container {id} missing from the pod's stats"))
}

fn eth0(s: &v1::PodSandboxStats) -> (u64, u64) {
    let n = linux(s).network.as_ref().expect("network stats");
    let i = n.default_interface.as_ref().expect("default interface");
    assert_eq!(i.name, "eth0");
    (
        i.rx_bytes.as_ref().map_or(0, |v| v.value),
        i.tx_bytes.as_ref().map_or(0, |v| v.value),
    )
}

fn exec(id: &str, cmd: &[&str]) -> v1::ExecSyncRequest {
    v1::ExecSyncRequest {
        container_id: id.into(),
        cmd: cmd.iter().map(|s| s.to_string()).collect(),
        timeout: 10,
    }
}

/// A kubelet-like pod (its own cgroup parent) with a CPU burner capped at 20% of a CPU and a
/// container that is made to allocate 32 MiB: pod and container CPU and memory grow between
/// readings, and so do the pod's eth0 counters when datagrams reach it.
#[tokio::test]
async fn pod_stats_move_with_cpu_memory_and_network() {
    // Dropped after the bed (whose teardown removes the pod), so on a failure too.
    let name = unique("stats");
    let parent = CgroupParent(format!("/remora-it-{name}/pod{name}"));
    let bed = BedRemora::start_with_network();
    let logs = crate::harness::scratch();
    cri::pull(&bed.remora, "busybox")
        .await
        .expect("pull busybox");
    let mut config = cri::pod_config(&name, logs.path(), false);
    config.labels.insert("stats-test".into(), name.clone());
    config.linux.as_mut().expect("linux config").cgroup_parent = parent.0.clone();
    let pod = cri::run_pod(&bed.remora, &config)
        .await
        .expect("RunPodSandbox");

    let mut burn = cri::shell_container("burn", "while :; do :; done");
    burn.linux = Some(v1::LinuxContainerConfig {
        resources: Some(v1::LinuxContainerResources {
            cpu_period: 100_000,
            cpu_quota: 20_000,
            ..Default::default()
        }),
        ..Default::default()
    });
    let burn = cri::create_and_start(&bed.remora, &pod, &config, burn).await;
    let mem = cri::create_and_start(
        &bed.remora,
        &pod,
        &config,
        cri::container_config("mem", &["sleep", "3600"]),
    )
    .await;

    let first = pod_stats(&bed, &pod).await.expect("PodSandboxStats");
    let attrs = first.attributes.as_ref().expect("attributes");
    assert_eq!(attrs.id, pod);
    assert_eq!(attrs.labels.get("stats-test"), Some(&name));
    assert_eq!(
        attrs.metadata.as_ref().map(|m| m.name.as_str()),
        Some(name.as_str())
    );
    let l = linux(&first);
    assert!(l.cpu.as_ref().unwrap().timestamp > 0);
    assert!(working_set(&l.memory) > 0, "{:?}", l.memory);
    let processes = l.process.as_ref().and_then(|p| p.process_count.as_ref());
    // pause + the burner's shell + the other's shell (and its sleep, now and then).
    assert!(processes.map_or(0, |p| p.value) >= 3, "{:?}", l.process);
    assert_eq!(l.containers.len(), 2);
    let (rx0, tx0) = eth0(&first);

    // CPU: the burner's time and the pod's grow, and from the second sample on (10 s apart)
    // both have a rate: the burner's capped at 20% of a CPU.
    let (burn0, pod_cpu0) = (cpu_ns(&container(&first, &burn).cpu), cpu_ns(&l.cpu));
    let rate = |c: &Option<v1::CpuUsage>| {
        c.as_ref()
            .and_then(|c| c.usage_nano_cores.as_ref())
            .map(|v| v.value)
    };
    wait_until("CPU time to grow by 100 ms, with a rate", LIMIT, || async {
        let s = pod_stats(&bed, &pod).await.expect("PodSandboxStats");
        let burner = rate(&container(&s, &burn).cpu);
        cpu_ns(&container(&s, &burn).cpu) > burn0 + 100_000_000
            && cpu_ns(&linux(&s).cpu) > pod_cpu0 + 100_000_000
            && burner.is_some_and(|r| r > 50_000_000 && r < 400_000_000)
            && rate(&linux(&s).cpu).is_some_and(|r| r > 50_000_000)
    })
    .await;

    // Memory: 32 MiB written to the pod's /dev/shm (a tmpfs: memory, charged to the cgroup
    // of the process that writes it, and kept until the file goes) shows in the container's
    // and the pod's working set.
    let mem0 = working_set(&container(&first, &mem).memory);
    let pod_mem0 = working_set(&l.memory);
    let r = bed
        .remora
        .runtime()
        .exec_sync(exec(
            &mem,
            &[
                "dd",
                "if=/dev/zero",
                "of=/dev/shm/fill",
                "bs=1048576",
                "count=32",
            ],
        ))
        .await
        .expect("ExecSync")
        .into_inner();
    assert_eq!(r.exit_code, 0, "{r:?}");
    // Stats are sampled at most every 10 s: the growth shows by the next sample.
    let grown = 24 << 20;
    wait_until(
        "the container's and the pod's working set to grow",
        LIMIT,
        || async {
            let s = pod_stats(&bed, &pod).await.expect("PodSandboxStats");
            working_set(&container(&s, &mem).memory) > mem0 + grown
                && working_set(&linux(&s).memory) > pod_mem0 + grown
        },
    )
    .await;

    // Network: datagrams sent to the pod's IP arrive on its eth0.
    let ip = cri::pod_status(&bed.remora, &pod)
        .await
        .expect("PodSandboxStatus")
        .network
        .expect("network")
        .ip;
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").expect("bind");
    for _ in 0..100 {
        socket
            .send_to(&[7u8; 1000], (ip.as_str(), 9))
            .expect("send a datagram");
    }
    wait_until("eth0 counters to move", LIMIT, || async {
        let (rx, tx) = eth0(&pod_stats(&bed, &pod).await.expect("PodSandboxStats"));
        rx >= rx0 + 100 * 1000 && tx > tx0
    })
    .await;

    // The list: by label, by id prefix.
    let list = |filter: v1::PodSandboxStatsFilter| {
        let mut rt = bed.remora.runtime();
        async move {
            rt.list_pod_sandbox_stats(v1::ListPodSandboxStatsRequest {
                filter: Some(filter),
            })
            .await
            .expect("ListPodSandboxStats")
            .into_inner()
            .stats
            .into_iter()
            .map(|s| s.attributes.unwrap().id)
            .collect::<Vec<_>>()
        }
    };
    let by_label = list(v1::PodSandboxStatsFilter {
        label_selector: [("stats-test".to_string(), name.clone())].into(),
        ..Default::default()
    })
    .await;
    assert_eq!(by_label, std::slice::from_ref(&pod));
    let by_prefix = list(v1::PodSandboxStatsFilter {
        id: pod[..12].to_string(),
        ..Default::default()
    })
    .await;
    assert_eq!(by_prefix, std::slice::from_ref(&pod));
    let none = list(v1::PodSandboxStatsFilter {
        label_selector: [("stats-test".to_string(), "other".to_string())].into(),
        ..Default::default()
    })
    .await;
    assert!(none.is_empty(), "{none:?}");

    cri::remove_pod(&bed.remora, &pod).await;
    drop(bed);
    drop(parent);
}

/// The metrics kubelet exports: every metric named in the descriptors with as many label
/// values as keys; the pod's network counters and its container's figures are there.
#[tokio::test]
async fn pod_metrics_follow_their_descriptors() {
    let bed = BedRemora::start_with_network();
    let logs = crate::harness::scratch();
    cri::pull(&bed.remora, "busybox")
        .await
        .expect("pull busybox");
    let name = unique("metrics");
    let config = cri::pod_config(&name, logs.path(), false);
    let pod = cri::run_pod(&bed.remora, &config)
        .await
        .expect("RunPodSandbox");
    let sleeper = cri::create_and_start(
        &bed.remora,
        &pod,
        &config,
        cri::container_config("sleeper", &["sleep", "3600"]),
    )
    .await;
    let mut rt = bed.remora.runtime();
    let descriptors = rt
        .list_metric_descriptors(v1::ListMetricDescriptorsRequest {})
        .await
        .expect("ListMetricDescriptors")
        .into_inner()
        .descriptors;
    let keys = |name: &str| {
        descriptors
            .iter()
            .find(|d| d.name == name)
            .unwrap_or_else(|| panic!("no descriptor for {name}"))
            .label_keys
            .clone()
    };
    assert_eq!(
        keys("container_network_receive_bytes_total"),
        ["pod", "namespace", "container", "id", "image", "interface"]
    );

    let pods = rt
        .list_pod_sandbox_metrics(v1::ListPodSandboxMetricsRequest {})
        .await
        .expect("ListPodSandboxMetrics")
        .into_inner()
        .pod_metrics;
    let p = pods
        .iter()
        .find(|p| p.pod_sandbox_id == pod)
        .expect("the pod's metrics");
    let all = p
        .metrics
        .iter()
        .chain(p.container_metrics.iter().flat_map(|c| &c.metrics));
    for m in all {
        assert_eq!(m.label_values.len(), keys(&m.name).len(), "{m:?}");
    }
    let rx = p
        .metrics
        .iter()
        .find(|m| {
            m.name == "container_network_receive_bytes_total"
                && m.label_values.last().map(String::as_str) == Some("eth0")
        })
        .expect("eth0 receive bytes");
    assert_eq!(rx.metric_type, v1::MetricType::Counter as i32);
    assert_eq!(
        rx.label_values[..2],
        [name.clone(), "remora-it".to_string()]
    );
    assert_eq!(rx.label_values[3], pod);

    let c = p
        .container_metrics
        .iter()
        .find(|c| c.container_id == sleeper)
        .expect("the container's metrics");
    let ws = c
        .metrics
        .iter()
        .find(|m| m.name == "container_memory_working_set_bytes")
        .expect("working set");
    assert_eq!(ws.metric_type, v1::MetricType::Gauge as i32);
    assert!(ws.value.as_ref().map_or(0, |v| v.value) > 0, "{ws:?}");
    assert_eq!(
        ws.label_values[2..],
        ["sleeper".to_string(), sleeper.clone(), "busybox".into()]
    );
    // Every descriptor has a value for a running container on this host, but the two
    // remora lists without values and the block IO ones (none when nothing reached a disk).
    let valued: std::collections::HashSet<&str> = p
        .metrics
        .iter()
        .chain(c.metrics.iter())
        .map(|m| m.name.as_str())
        .collect();
    let missing: Vec<&str> = descriptors
        .iter()
        .map(|d| d.name.as_str())
        .filter(|n| !valued.contains(n))
        .filter(|n| {
            ![
                "container_ulimits_soft",
                "container_spec_memory_reservation_limit_bytes",
                "container_blkio_device_usage_total",
                "container_fs_reads_bytes_total",
                "container_fs_reads_total",
                "container_fs_writes_bytes_total",
                "container_fs_writes_total",
            ]
            .contains(n)
        })
        .collect();
    assert!(missing.is_empty(), "no values for {missing:?}");
    // One task once runc's init (several Go threads) has exec'd sleep.
    wait_until("sleep to be the container's only task", LIMIT, || async {
        let pods = bed
            .remora
            .runtime()
            .list_pod_sandbox_metrics(v1::ListPodSandboxMetricsRequest {})
            .await
            .expect("ListPodSandboxMetrics")
            .into_inner()
            .pod_metrics;
        pods.iter()
            .filter(|p| p.pod_sandbox_id == pod)
            .flat_map(|p| &p.container_metrics)
            .filter(|c| c.container_id == sleeper)
            .flat_map(|c| &c.metrics)
            .find(|m| m.name == "container_processes")
            .and_then(|m| m.value.as_ref())
            .map(|v| v.value)
            == Some(1)
    })
    .await;
    cri::remove_pod(&bed.remora, &pod).await;
}

/// A host-network pod without a cgroup parent: no network stats, CPU and memory summed over
/// its pause process and containers. Unknown ids are NOT_FOUND; a stopped pod's stats are
/// UNAVAILABLE (containerd's answer), and the list leaves it out without failing.
#[tokio::test]
async fn host_network_and_stopped_pods() {
    let bed = BedRemora::start_with_network();
    let logs = crate::harness::scratch();
    cri::pull(&bed.remora, "busybox")
        .await
        .expect("pull busybox");
    let name = unique("hoststats");
    let config = cri::pod_config(&name, logs.path(), true);
    let pod = cri::run_pod(&bed.remora, &config)
        .await
        .expect("RunPodSandbox");
    let c = cri::create_and_start(
        &bed.remora,
        &pod,
        &config,
        cri::container_config("sleeper", &["sleep", "3600"]),
    )
    .await;
    let s = pod_stats(&bed, &pod).await.expect("PodSandboxStats");
    assert!(
        linux(&s).network.is_none(),
        "host network: no pod network stats"
    );
    let pod_ws = working_set(&linux(&s).memory);
    let c_ws = working_set(&container(&s, &c).memory);
    assert!(
        c_ws > 0 && pod_ws > c_ws,
        "pause + sleeper: {pod_ws} vs {c_ws}"
    );
    // Tasks, as `pids.current` counts them: right after StartContainer, runc's init (several
    // Go threads) may not have exec'd sleep yet, so wait for the count to settle.
    wait_until(
        "pause and sleep to be the pod's only tasks",
        LIMIT,
        || async {
            let s = pod_stats(&bed, &pod).await.expect("PodSandboxStats");
            linux(&s)
                .process
                .as_ref()
                .and_then(|p| p.process_count.as_ref())
                .map(|v| v.value)
                == Some(2)
        },
    )
    .await;

    let err = pod_stats(&bed, "0123456789abcdef-no-such-pod")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");

    bed.remora
        .runtime()
        .stop_pod_sandbox(v1::StopPodSandboxRequest {
            pod_sandbox_id: pod.clone(),
        })
        .await
        .expect("StopPodSandbox");
    let err = pod_stats(&bed, &pod).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(err.message().contains("not ready"), "{err:?}");
    let listed = bed
        .remora
        .runtime()
        .list_pod_sandbox_stats(v1::ListPodSandboxStatsRequest { filter: None })
        .await
        .expect("ListPodSandboxStats with a stopped pod")
        .into_inner()
        .stats;
    assert!(
        listed
            .iter()
            .all(|s| s.attributes.as_ref().unwrap().id != pod),
        "the stopped pod is left out"
    );
    cri::remove_pod(&bed.remora, &pod).await;
}
