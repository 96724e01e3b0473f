//! ListMetricDescriptors and ListPodSandboxMetrics: a pod's stats ([`SandboxStats`], the same
//! reading PodSandboxStats answers with) as cAdvisor-named metrics, which kubelet serves on
//! `/metrics/cadvisor` when its `PodAndContainerStatsFromCRI` gate is on.
//!
//! Names, help and label keys follow containerd's CRI (which follows cAdvisor): labels `pod`,
//! `namespace`, `container`, `id`, `image`, plus `interface` for network metrics. Network
//! metrics are the pod's (one series per interface, `container` and `image` empty, `id` the
//! pod's), the others each running container's. kubelet drops a metric whose name was not in
//! the descriptors it read once at start, and a metric with the wrong number of label values:
//! [`DESCRIPTORS`] is static and each metric is built from its descriptor's label keys.
//!
//! CRI carries values as integers: seconds counters are whole seconds (as containerd and CRI-O
//! report them). Metrics are read when asked for, so their timestamp is 0 ("gathered live" in
//! the CRI contract: kubelet then stamps them itself).

use super::cgroup_stats::CgroupStats;
use super::container_stats::Stats;
use super::sandbox_stats::{InterfaceStats, SandboxStats};
use crate::store::ContainerState;

/// Whether a metric only grows or goes up and down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// A cumulative count.
    Counter,
    /// A value at one moment.
    Gauge,
}

/// A metric's name, help text and label keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Descriptor {
    /// cAdvisor's name.
    pub name: &'static str,
    /// What it measures.
    pub help: &'static str,
    /// The label keys, in the order of every metric's label values.
    pub label_keys: &'static [&'static str],
    /// Counter or gauge.
    pub kind: MetricKind,
}

const BASE: &[&str] = &["pod", "namespace", "container", "id", "image"];
const NETWORK: &[&str] = &["pod", "namespace", "container", "id", "image", "interface"];

const fn d(
    name: &'static str,
    help: &'static str,
    label_keys: &'static [&'static str],
    kind: MetricKind,
) -> Descriptor {
    Descriptor {
        name,
        help,
        label_keys,
        kind,
    }
}

use MetricKind::{Counter, Gauge};

const CPU_USAGE_SECONDS_TOTAL: Descriptor = d(
    "container_cpu_usage_seconds_total",
    "Cumulative CPU time consumed in seconds.",
    BASE,
    Counter,
);
const CPU_USER_SECONDS_TOTAL: Descriptor = d(
    "container_cpu_user_seconds_total",
    "Cumulative user CPU time consumed in seconds.",
    BASE,
    Counter,
);
const CPU_SYSTEM_SECONDS_TOTAL: Descriptor = d(
    "container_cpu_system_seconds_total",
    "Cumulative system CPU time consumed in seconds.",
    BASE,
    Counter,
);
const MEMORY_USAGE_BYTES: Descriptor = d(
    "container_memory_usage_bytes",
    "Current memory usage in bytes, including all memory regardless of when it was accessed.",
    BASE,
    Gauge,
);
const MEMORY_WORKING_SET_BYTES: Descriptor = d(
    "container_memory_working_set_bytes",
    "Current working set in bytes: usage minus inactive file cache.",
    BASE,
    Gauge,
);
const MEMORY_RSS: Descriptor = d(
    "container_memory_rss",
    "Size of RSS in bytes: anonymous and swap cache memory.",
    BASE,
    Gauge,
);
const MEMORY_CACHE: Descriptor = d(
    "container_memory_cache",
    "Number of bytes of page cache memory.",
    BASE,
    Gauge,
);
const MEMORY_MAPPED_FILE: Descriptor = d(
    "container_memory_mapped_file",
    "Size of memory mapped files in bytes.",
    BASE,
    Gauge,
);
const MEMORY_MAX_USAGE_BYTES: Descriptor = d(
    "container_memory_max_usage_bytes",
    "Maximum memory usage recorded in bytes.",
    BASE,
    Gauge,
);
const MEMORY_FAILCNT: Descriptor = d(
    "container_memory_failcnt",
    "Number of times memory usage hit the limit (cgroup v1).",
    BASE,
    Counter,
);
const SPEC_MEMORY_LIMIT_BYTES: Descriptor = d(
    "container_spec_memory_limit_bytes",
    "Memory limit for the container in bytes (0: unlimited).",
    BASE,
    Gauge,
);
const PROCESSES: Descriptor = d(
    "container_processes",
    "Number of processes running inside the container.",
    BASE,
    Gauge,
);
const START_TIME_SECONDS: Descriptor = d(
    "container_start_time_seconds",
    "Start time of the container since unix epoch in seconds.",
    BASE,
    Gauge,
);
const NETWORK_RECEIVE_BYTES_TOTAL: Descriptor = d(
    "container_network_receive_bytes_total",
    "Cumulative count of bytes received.",
    NETWORK,
    Counter,
);
const NETWORK_RECEIVE_PACKETS_TOTAL: Descriptor = d(
    "container_network_receive_packets_total",
    "Cumulative count of packets received.",
    NETWORK,
    Counter,
);
const NETWORK_RECEIVE_PACKETS_DROPPED_TOTAL: Descriptor = d(
    "container_network_receive_packets_dropped_total",
    "Cumulative count of packets dropped while receiving.",
    NETWORK,
    Counter,
);
const NETWORK_RECEIVE_ERRORS_TOTAL: Descriptor = d(
    "container_network_receive_errors_total",
    "Cumulative count of errors encountered while receiving.",
    NETWORK,
    Counter,
);
const NETWORK_TRANSMIT_BYTES_TOTAL: Descriptor = d(
    "container_network_transmit_bytes_total",
    "Cumulative count of bytes transmitted.",
    NETWORK,
    Counter,
);
const NETWORK_TRANSMIT_PACKETS_TOTAL: Descriptor = d(
    "container_network_transmit_packets_total",
    "Cumulative count of packets transmitted.",
    NETWORK,
    Counter,
);
const NETWORK_TRANSMIT_PACKETS_DROPPED_TOTAL: Descriptor = d(
    "container_network_transmit_packets_dropped_total",
    "Cumulative count of packets dropped while transmitting.",
    NETWORK,
    Counter,
);
const NETWORK_TRANSMIT_ERRORS_TOTAL: Descriptor = d(
    "container_network_transmit_errors_total",
    "Cumulative count of errors encountered while transmitting.",
    NETWORK,
    Counter,
);

/// Every metric ListPodSandboxMetrics reports.
pub static DESCRIPTORS: &[Descriptor] = &[
    CPU_USAGE_SECONDS_TOTAL,
    CPU_USER_SECONDS_TOTAL,
    CPU_SYSTEM_SECONDS_TOTAL,
    MEMORY_USAGE_BYTES,
    MEMORY_WORKING_SET_BYTES,
    MEMORY_RSS,
    MEMORY_CACHE,
    MEMORY_MAPPED_FILE,
    MEMORY_MAX_USAGE_BYTES,
    MEMORY_FAILCNT,
    SPEC_MEMORY_LIMIT_BYTES,
    PROCESSES,
    START_TIME_SECONDS,
    NETWORK_RECEIVE_BYTES_TOTAL,
    NETWORK_RECEIVE_PACKETS_TOTAL,
    NETWORK_RECEIVE_PACKETS_DROPPED_TOTAL,
    NETWORK_RECEIVE_ERRORS_TOTAL,
    NETWORK_TRANSMIT_BYTES_TOTAL,
    NETWORK_TRANSMIT_PACKETS_TOTAL,
    NETWORK_TRANSMIT_PACKETS_DROPPED_TOTAL,
    NETWORK_TRANSMIT_ERRORS_TOTAL,
];

/// One value of a metric.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metric {
    /// Its descriptor's name.
    pub name: &'static str,
    /// Counter or gauge (its descriptor's).
    pub kind: MetricKind,
    /// Label values, in the order of the descriptor's keys.
    pub label_values: Vec<String>,
    /// The value.
    pub value: u64,
}

/// A pod's metrics and its containers'.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodMetrics {
    /// The pod.
    pub pod_id: String,
    /// Pod-level metrics (network).
    pub metrics: Vec<Metric>,
    /// Per running container: its id and metrics.
    pub containers: Vec<(String, Vec<Metric>)>,
}

/// Collects metrics that share the label values `base` (plus `extra`, for the keys beyond the
/// base ones).
struct Emit<'a> {
    base: &'a [String],
    out: Vec<Metric>,
}

impl Emit<'_> {
    fn push(&mut self, d: &Descriptor, extra: &[&str], value: Option<u64>) {
        let Some(value) = value else { return };
        let mut label_values = self.base.to_vec();
        label_values.extend(extra.iter().map(|s| s.to_string()));
        self.out.push(Metric {
            name: d.name,
            kind: d.kind,
            label_values,
            value,
        });
    }
}

const NS_PER_S: u64 = 1_000_000_000;

fn cgroup_metrics(e: &mut Emit<'_>, c: &CgroupStats) {
    if let Some(cpu) = c.cpu {
        e.push(&CPU_USAGE_SECONDS_TOTAL, &[], Some(cpu.usage_ns / NS_PER_S));
        e.push(
            &CPU_USER_SECONDS_TOTAL,
            &[],
            cpu.user_ns.map(|n| n / NS_PER_S),
        );
        e.push(
            &CPU_SYSTEM_SECONDS_TOTAL,
            &[],
            cpu.system_ns.map(|n| n / NS_PER_S),
        );
    }
    if let Some(m) = c.memory {
        e.push(&MEMORY_USAGE_BYTES, &[], Some(m.usage));
        e.push(&MEMORY_WORKING_SET_BYTES, &[], Some(m.working_set));
        e.push(&MEMORY_RSS, &[], Some(m.rss));
        e.push(&MEMORY_CACHE, &[], Some(m.cache));
        e.push(&MEMORY_MAPPED_FILE, &[], Some(m.mapped_file));
        e.push(&MEMORY_MAX_USAGE_BYTES, &[], m.max_usage);
        e.push(&MEMORY_FAILCNT, &[], m.failcnt);
        // cAdvisor reports an unlimited container as 0.
        e.push(&SPEC_MEMORY_LIMIT_BYTES, &[], Some(m.limit.unwrap_or(0)));
    }
    e.push(&PROCESSES, &[], c.pids);
}

fn network_metrics(e: &mut Emit<'_>, i: &InterfaceStats) {
    let iface = [i.name.as_str()];
    e.push(&NETWORK_RECEIVE_BYTES_TOTAL, &iface, Some(i.rx_bytes));
    e.push(&NETWORK_RECEIVE_PACKETS_TOTAL, &iface, Some(i.rx_packets));
    e.push(
        &NETWORK_RECEIVE_PACKETS_DROPPED_TOTAL,
        &iface,
        Some(i.rx_dropped),
    );
    e.push(&NETWORK_RECEIVE_ERRORS_TOTAL, &iface, Some(i.rx_errors));
    e.push(&NETWORK_TRANSMIT_BYTES_TOTAL, &iface, Some(i.tx_bytes));
    e.push(&NETWORK_TRANSMIT_PACKETS_TOTAL, &iface, Some(i.tx_packets));
    e.push(
        &NETWORK_TRANSMIT_PACKETS_DROPPED_TOTAL,
        &iface,
        Some(i.tx_dropped),
    );
    e.push(&NETWORK_TRANSMIT_ERRORS_TOTAL, &iface, Some(i.tx_errors));
}

fn container_metrics(pod: &[String; 2], s: &Stats) -> Vec<Metric> {
    let m = &s.container.metadata;
    let base = [
        pod[0].clone(),
        pod[1].clone(),
        m.name.clone(),
        m.id.clone(),
        m.image.requested.clone(),
    ];
    let mut e = Emit {
        base: &base,
        out: Vec::new(),
    };
    cgroup_metrics(&mut e, &s.cgroup);
    let started = s.container.status.started_at;
    e.push(
        &START_TIME_SECONDS,
        &[],
        (started > 0).then_some(started as u64 / NS_PER_S),
    );
    e.out
}

/// A pod's metrics: its network's, and each running container's.
pub fn pod_metrics(stats: &SandboxStats) -> PodMetrics {
    let meta = &stats.sandbox.metadata;
    let pod = [meta.name.clone(), meta.namespace.clone()];
    let base = [
        pod[0].clone(),
        pod[1].clone(),
        String::new(),
        meta.id.clone(),
        String::new(),
    ];
    let mut e = Emit {
        base: &base,
        out: Vec::new(),
    };
    for i in stats.network.iter().flat_map(|n| &n.interfaces) {
        network_metrics(&mut e, i);
    }
    let containers = stats
        .containers
        .iter()
        .filter(|c| c.container.status.state == ContainerState::Running)
        .map(|c| (c.container.metadata.id.clone(), container_metrics(&pod, c)))
        .collect();
    PodMetrics {
        pod_id: meta.id.clone(),
        metrics: e.out,
        containers,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::lifecycle::cgroup_stats::{CpuStats, MemoryStats};
    use crate::lifecycle::sandbox_stats::NetworkStats;
    use crate::store::{ContainerMetadata, ContainerSnapshot, ContainerStatus};
    use crate::store::{SandboxMetadata, SandboxSnapshot, SandboxStatus};

    fn container(id: &str, state: ContainerState, cgroup: CgroupStats) -> Stats {
        let mut status = ContainerStatus::created(1);
        status.state = state;
        status.started_at = 1_700_000_000_500_000_000;
        let mut metadata = ContainerMetadata {
            id: id.into(),
            sandbox_id: "pod1".into(),
            name: format!("name-{id}"),
            ..Default::default()
        };
        metadata.image.requested = "busybox".into();
        Stats {
            container: ContainerSnapshot {
                metadata: Arc::new(metadata),
                status,
            },
            timestamp_ns: 5,
            cgroup,
            writable: None,
        }
    }

    fn stats() -> SandboxStats {
        let busy = CgroupStats {
            cpu: Some(CpuStats {
                usage_ns: 2_700_000_000,
                user_ns: Some(2_000_000_000),
                system_ns: Some(700_000_000),
            }),
            memory: Some(MemoryStats {
                usage: 100,
                working_set: 90,
                limit: None,
                max_usage: Some(120),
                failcnt: Some(0),
                ..Default::default()
            }),
            pids: Some(3),
            ..Default::default()
        };
        SandboxStats {
            sandbox: SandboxSnapshot {
                metadata: Arc::new(SandboxMetadata {
                    id: "pod1".into(),
                    name: "web".into(),
                    namespace: "prod".into(),
                    ..Default::default()
                }),
                status: SandboxStatus::ready(9),
            },
            timestamp_ns: 5,
            cgroup: busy,
            network: Some(NetworkStats {
                timestamp_ns: 5,
                interfaces: vec![InterfaceStats {
                    name: "eth0".into(),
                    rx_bytes: 1000,
                    tx_bytes: 2000,
                    ..Default::default()
                }],
            }),
            containers: vec![
                container("c1", ContainerState::Running, busy),
                container("c2", ContainerState::Exited, CgroupStats::default()),
            ],
        }
    }

    fn find<'a>(metrics: &'a [Metric], name: &str) -> &'a Metric {
        metrics
            .iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("{name} missing from {metrics:?}"))
    }

    #[test]
    fn every_metric_is_described_with_matching_labels() {
        let p = pod_metrics(&stats());
        let all = p
            .metrics
            .iter()
            .chain(p.containers.iter().flat_map(|(_, m)| m));
        let mut n = 0;
        for m in all {
            let d = DESCRIPTORS
                .iter()
                .find(|d| d.name == m.name)
                .unwrap_or_else(|| panic!("{} has no descriptor", m.name));
            assert_eq!(m.label_values.len(), d.label_keys.len(), "{m:?}");
            assert_eq!(m.kind, d.kind, "{m:?}");
            n += 1;
        }
        assert_eq!(
            n,
            8 + 13,
            "8 network metrics and 13 of the running container"
        );
        let mut names: Vec<_> = DESCRIPTORS.iter().map(|d| d.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(
            names.len(),
            DESCRIPTORS.len(),
            "descriptor names are unique"
        );
    }

    #[test]
    fn pod_network_and_running_containers() {
        let p = pod_metrics(&stats());
        assert_eq!(p.pod_id, "pod1");
        let rx = find(&p.metrics, "container_network_receive_bytes_total");
        assert_eq!(rx.value, 1000);
        assert_eq!(rx.kind, MetricKind::Counter);
        assert_eq!(rx.label_values, ["web", "prod", "", "pod1", "", "eth0"]);
        assert_eq!(
            find(&p.metrics, "container_network_transmit_bytes_total").value,
            2000
        );

        assert_eq!(p.containers.len(), 1, "the exited container has no metrics");
        let (id, m) = &p.containers[0];
        assert_eq!(id, "c1");
        let cpu = find(m, "container_cpu_usage_seconds_total");
        assert_eq!(cpu.value, 2, "whole seconds");
        assert_eq!(
            cpu.label_values,
            ["web", "prod", "name-c1", "c1", "busybox"]
        );
        assert_eq!(find(m, "container_memory_working_set_bytes").value, 90);
        assert_eq!(
            find(m, "container_memory_working_set_bytes").kind,
            MetricKind::Gauge
        );
        assert_eq!(find(m, "container_spec_memory_limit_bytes").value, 0);
        assert_eq!(find(m, "container_processes").value, 3);
        assert_eq!(find(m, "container_start_time_seconds").value, 1_700_000_000);
    }

    #[test]
    fn a_host_network_pod_has_no_network_metrics() {
        let mut s = stats();
        s.network = None;
        assert!(pod_metrics(&s).metrics.is_empty());
    }
}
