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
//! report them). Metrics come from the stats sampler's last sample (at most its period old,
//! [`super::stats_sampler`]); their timestamp is 0 ("gathered live" in the CRI contract:
//! kubelet then stamps them itself).

use std::collections::HashMap;

use super::cgroup_stats::CgroupStats;
use super::container_stats::Stats;
use super::sandbox_stats::{InterfaceStats, SandboxStats};
use super::stats_read::ContainerExtras;
use super::stats_sampler::Need;
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
const DISK: &[&str] = &["pod", "namespace", "container", "id", "image", "device"];
const BLKIO: &[&str] = &[
    "pod",
    "namespace",
    "container",
    "id",
    "image",
    "device",
    "major",
    "minor",
    "operation",
];
const MEMORY_FAILURES: &[&str] = &[
    "pod",
    "namespace",
    "container",
    "id",
    "image",
    "failure_type",
    "scope",
];
const ULIMIT: &[&str] = &["pod", "namespace", "container", "id", "image", "ulimit"];

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
const CPU_CFS_PERIODS_TOTAL: Descriptor = d(
    "container_cpu_cfs_periods_total",
    "Number of elapsed enforcement period intervals.",
    BASE,
    Counter,
);
const CPU_CFS_THROTTLED_PERIODS_TOTAL: Descriptor = d(
    "container_cpu_cfs_throttled_periods_total",
    "Number of throttled period intervals.",
    BASE,
    Counter,
);
const CPU_CFS_THROTTLED_SECONDS_TOTAL: Descriptor = d(
    "container_cpu_cfs_throttled_seconds_total",
    "Total time duration the container has been throttled.",
    BASE,
    Counter,
);
const MEMORY_KERNEL_USAGE: Descriptor = d(
    "container_memory_kernel_usage",
    "Size of kernel memory allocated to the container in bytes.",
    BASE,
    Gauge,
);
const MEMORY_SWAP: Descriptor = d(
    "container_memory_swap",
    "Container swap usage in bytes.",
    BASE,
    Gauge,
);
const MEMORY_TOTAL_ACTIVE_FILE_BYTES: Descriptor = d(
    "container_memory_total_active_file_bytes",
    "Amount of active file cache memory in bytes.",
    BASE,
    Gauge,
);
const MEMORY_TOTAL_INACTIVE_FILE_BYTES: Descriptor = d(
    "container_memory_total_inactive_file_bytes",
    "Amount of inactive file cache memory in bytes.",
    BASE,
    Gauge,
);
const MEMORY_FAILURES_TOTAL: Descriptor = d(
    "container_memory_failures_total",
    "Cumulative count of memory allocation failures.",
    MEMORY_FAILURES,
    Counter,
);
const OOM_EVENTS_TOTAL: Descriptor = d(
    "container_oom_events_total",
    "Count of out of memory events observed for the container.",
    BASE,
    Counter,
);
const FS_INODES_FREE: Descriptor = d(
    "container_fs_inodes_free",
    "Number of available inodes.",
    DISK,
    Gauge,
);
const FS_INODES_TOTAL: Descriptor = d(
    "container_fs_inodes_total",
    "Number of inodes.",
    DISK,
    Gauge,
);
const FS_LIMIT_BYTES: Descriptor = d(
    "container_fs_limit_bytes",
    "Number of bytes that can be consumed by the container on this filesystem.",
    DISK,
    Gauge,
);
const FS_USAGE_BYTES: Descriptor = d(
    "container_fs_usage_bytes",
    "Number of bytes that are consumed by the container on this filesystem.",
    DISK,
    Gauge,
);
const FS_READS_BYTES_TOTAL: Descriptor = d(
    "container_fs_reads_bytes_total",
    "Cumulative count of bytes read.",
    DISK,
    Counter,
);
const FS_READS_TOTAL: Descriptor = d(
    "container_fs_reads_total",
    "Cumulative count of reads completed.",
    DISK,
    Counter,
);
const FS_WRITES_BYTES_TOTAL: Descriptor = d(
    "container_fs_writes_bytes_total",
    "Cumulative count of bytes written.",
    DISK,
    Counter,
);
const FS_WRITES_TOTAL: Descriptor = d(
    "container_fs_writes_total",
    "Cumulative count of writes completed.",
    DISK,
    Counter,
);
const BLKIO_DEVICE_USAGE_TOTAL: Descriptor = d(
    "container_blkio_device_usage_total",
    "Blkio device bytes usage.",
    BLKIO,
    Counter,
);
const FILE_DESCRIPTORS: Descriptor = d(
    "container_file_descriptors",
    "Number of open file descriptors for the container.",
    BASE,
    Gauge,
);
const SOCKETS: Descriptor = d(
    "container_sockets",
    "Number of open sockets for the container.",
    BASE,
    Gauge,
);
const THREADS: Descriptor = d(
    "container_threads",
    "Number of threads running inside the container.",
    BASE,
    Gauge,
);
const THREADS_MAX: Descriptor = d(
    "container_threads_max",
    "Maximum number of threads allowed inside the container (0: unlimited).",
    BASE,
    Gauge,
);
const ULIMITS_SOFT: Descriptor = d(
    "container_ulimits_soft",
    "Soft ulimit values for the container root process (not reported by remora yet).",
    ULIMIT,
    Gauge,
);
const LAST_SEEN: Descriptor = d(
    "container_last_seen",
    "Last time a container was seen by the exporter.",
    BASE,
    Gauge,
);
const SPEC_CPU_PERIOD: Descriptor = d(
    "container_spec_cpu_period",
    "CPU period of the container.",
    BASE,
    Gauge,
);
const SPEC_CPU_SHARES: Descriptor = d(
    "container_spec_cpu_shares",
    "CPU share of the container.",
    BASE,
    Gauge,
);
const SPEC_MEMORY_RESERVATION_LIMIT_BYTES: Descriptor = d(
    "container_spec_memory_reservation_limit_bytes",
    "Memory reservation limit for the container (not reported: CRI sets none).",
    BASE,
    Gauge,
);
const SPEC_MEMORY_SWAP_LIMIT_BYTES: Descriptor = d(
    "container_spec_memory_swap_limit_bytes",
    "Memory swap limit for the container (0: unlimited).",
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

/// Every metric ListPodSandboxMetrics reports: the descriptors containerd 2.3 lists, in its
/// order of groups. `container_ulimits_soft` and `container_spec_memory_reservation_limit_bytes`
/// are listed (as containerd does) but have no values yet: remora does not read the root
/// process's limits, and CRI sets no memory reservation.
pub static DESCRIPTORS: &[Descriptor] = &[
    CPU_USER_SECONDS_TOTAL,
    CPU_SYSTEM_SECONDS_TOTAL,
    CPU_USAGE_SECONDS_TOTAL,
    CPU_CFS_PERIODS_TOTAL,
    CPU_CFS_THROTTLED_PERIODS_TOTAL,
    CPU_CFS_THROTTLED_SECONDS_TOTAL,
    MEMORY_CACHE,
    MEMORY_RSS,
    MEMORY_KERNEL_USAGE,
    MEMORY_MAPPED_FILE,
    MEMORY_SWAP,
    MEMORY_FAILCNT,
    MEMORY_USAGE_BYTES,
    MEMORY_MAX_USAGE_BYTES,
    MEMORY_WORKING_SET_BYTES,
    MEMORY_TOTAL_ACTIVE_FILE_BYTES,
    MEMORY_TOTAL_INACTIVE_FILE_BYTES,
    MEMORY_FAILURES_TOTAL,
    OOM_EVENTS_TOTAL,
    NETWORK_RECEIVE_BYTES_TOTAL,
    NETWORK_RECEIVE_PACKETS_TOTAL,
    NETWORK_RECEIVE_PACKETS_DROPPED_TOTAL,
    NETWORK_RECEIVE_ERRORS_TOTAL,
    NETWORK_TRANSMIT_BYTES_TOTAL,
    NETWORK_TRANSMIT_PACKETS_TOTAL,
    NETWORK_TRANSMIT_PACKETS_DROPPED_TOTAL,
    NETWORK_TRANSMIT_ERRORS_TOTAL,
    FS_INODES_FREE,
    FS_INODES_TOTAL,
    FS_LIMIT_BYTES,
    FS_USAGE_BYTES,
    FS_READS_BYTES_TOTAL,
    FS_READS_TOTAL,
    FS_WRITES_BYTES_TOTAL,
    FS_WRITES_TOTAL,
    BLKIO_DEVICE_USAGE_TOTAL,
    PROCESSES,
    FILE_DESCRIPTORS,
    SOCKETS,
    THREADS_MAX,
    THREADS,
    ULIMITS_SOFT,
    LAST_SEEN,
    START_TIME_SECONDS,
    SPEC_CPU_PERIOD,
    SPEC_CPU_SHARES,
    SPEC_MEMORY_LIMIT_BYTES,
    SPEC_MEMORY_RESERVATION_LIMIT_BYTES,
    SPEC_MEMORY_SWAP_LIMIT_BYTES,
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
        // cgroup v2 has no failcnt: 0, as containerd reports it there.
        e.push(&MEMORY_FAILCNT, &[], Some(m.failcnt.unwrap_or(0)));
        // cAdvisor reports an unlimited container as 0.
        e.push(&SPEC_MEMORY_LIMIT_BYTES, &[], Some(m.limit.unwrap_or(0)));
        // containerd's failure types and scope (the container's own cgroup).
        e.push(
            &MEMORY_FAILURES_TOTAL,
            &["pgfault", "container"],
            Some(m.page_faults),
        );
        e.push(
            &MEMORY_FAILURES_TOTAL,
            &["pgmajfault", "container"],
            Some(m.major_page_faults),
        );
    }
    e.push(&PROCESSES, &[], c.pids);
    // The pids controller counts tasks, that is threads.
    e.push(&THREADS, &[], c.pids);
}

/// The metrics from [`ContainerExtras`].
fn extra_metrics(e: &mut Emit<'_>, x: &ContainerExtras) {
    let c = &x.cgroup;
    if let Some(t) = c.throttling {
        e.push(&CPU_CFS_PERIODS_TOTAL, &[], Some(t.periods));
        e.push(
            &CPU_CFS_THROTTLED_PERIODS_TOTAL,
            &[],
            Some(t.throttled_periods),
        );
        e.push(
            &CPU_CFS_THROTTLED_SECONDS_TOTAL,
            &[],
            Some(t.throttled_ns / NS_PER_S),
        );
    }
    e.push(&MEMORY_KERNEL_USAGE, &[], c.kernel_usage);
    e.push(&MEMORY_SWAP, &[], c.swap);
    e.push(&MEMORY_TOTAL_ACTIVE_FILE_BYTES, &[], c.active_file);
    e.push(&MEMORY_TOTAL_INACTIVE_FILE_BYTES, &[], c.inactive_file);
    e.push(&OOM_EVENTS_TOTAL, &[], c.oom_kills);
    e.push(&THREADS_MAX, &[], c.pids_max);
    e.push(&SPEC_CPU_PERIOD, &[], c.cpu_period);
    e.push(&SPEC_CPU_SHARES, &[], c.cpu_shares);
    e.push(&SPEC_MEMORY_SWAP_LIMIT_BYTES, &[], c.memory_swap_limit);
    for d in &c.io {
        let dev = [d.device.as_str()];
        e.push(&FS_READS_BYTES_TOTAL, &dev, Some(d.read_bytes));
        e.push(&FS_WRITES_BYTES_TOTAL, &dev, Some(d.write_bytes));
        e.push(&FS_READS_TOTAL, &dev, Some(d.reads));
        e.push(&FS_WRITES_TOTAL, &dev, Some(d.writes));
        let (major, minor) = (d.major.to_string(), d.minor.to_string());
        for (op, v) in [("Read", d.read_bytes), ("Write", d.write_bytes)] {
            e.push(
                &BLKIO_DEVICE_USAGE_TOTAL,
                &[d.device.as_str(), &major, &minor, op],
                Some(v),
            );
        }
    }
    if let Some((fds, sockets)) = x.descriptors {
        e.push(&FILE_DESCRIPTORS, &[], Some(fds));
        e.push(&SOCKETS, &[], Some(sockets));
    }
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

/// The root filesystem's device label (containerd's: the writable layer is "/").
const ROOTFS_DEVICE: &str = "/";

fn container_metrics(
    pod: &[String; 2],
    s: &Stats,
    extras: Option<&ContainerExtras>,
    now_s: u64,
) -> Vec<Metric> {
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
    e.push(&LAST_SEEN, &[], Some(now_s));
    if let Some((bytes, inodes, _)) = &s.writable {
        e.push(&FS_USAGE_BYTES, &[ROOTFS_DEVICE], Some(*bytes));
        e.push(&FS_INODES_TOTAL, &[ROOTFS_DEVICE], Some(*inodes));
    }
    if let Some(x) = extras {
        if let Some((limit, inodes_free)) = x.filesystem {
            e.push(&FS_LIMIT_BYTES, &[ROOTFS_DEVICE], Some(limit));
            e.push(&FS_INODES_FREE, &[ROOTFS_DEVICE], Some(inodes_free));
        }
        extra_metrics(&mut e, x);
    }
    e.out
}

/// A pod's metrics: its network's, and each running container's (with its extras, by
/// container id, where read), `now_s` the time in seconds (`container_last_seen`).
pub fn pod_metrics(
    stats: &SandboxStats,
    extras: &HashMap<String, ContainerExtras>,
    now_s: u64,
) -> PodMetrics {
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
        .map(|c| {
            let id = &c.container.metadata.id;
            (
                id.clone(),
                container_metrics(&pod, c, extras.get(id), now_s),
            )
        })
        .collect();
    PodMetrics {
        pod_id: meta.id.clone(),
        metrics: e.out,
        containers,
    }
}

impl super::Pods {
    /// ListPodSandboxMetrics: the metrics of every ready pod (the pods ListPodSandboxStats
    /// lists), from the sampler's readings with each running container's extras.
    pub async fn list_sandbox_metrics(&self) -> Vec<PodMetrics> {
        let need = Need {
            extras: true,
            writable_root: self
                .snapshot_usage
                .latest()
                .await
                .ok()
                .and_then(|c| c.root.clone()),
        };
        let (stats, readings) = self
            .list_sandbox_stats_with(&Default::default(), &need)
            .await;
        let extras: HashMap<String, ContainerExtras> = readings
            .containers
            .iter()
            .filter_map(|(id, r)| Some((id.clone(), r.figures.extras.clone()?)))
            .collect();
        let now_s = (super::now_ns().max(0) as u64) / NS_PER_S;
        stats
            .iter()
            .map(|s| pod_metrics(s, &extras, now_s))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::cgroup_metrics::CgroupExtras;
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
            usage_nano_cores: None,
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
            usage_nano_cores: None,
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
        let p = pod_metrics(&stats(), &HashMap::new(), 0);
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
            8 + 17,
            "8 network metrics and 17 of the running container without its extras"
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
        let p = pod_metrics(&stats(), &HashMap::new(), 0);
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
        assert!(pod_metrics(&s, &HashMap::new(), 0).metrics.is_empty());
    }

    /// critest v1.37.0's `expectedMetricDescriptorNames` (pkg/validate/pod.go): the cAdvisor
    /// metrics kubelet serves with the legacy stats provider.
    const CRITEST_EXPECTED: &[&str] = &[
        "container_blkio_device_usage_total",
        "container_cpu_cfs_periods_total",
        "container_cpu_cfs_throttled_periods_total",
        "container_cpu_cfs_throttled_seconds_total",
        "container_cpu_system_seconds_total",
        "container_cpu_usage_seconds_total",
        "container_cpu_user_seconds_total",
        "container_file_descriptors",
        "container_fs_inodes_free",
        "container_fs_inodes_total",
        "container_fs_limit_bytes",
        "container_fs_reads_bytes_total",
        "container_fs_reads_total",
        "container_fs_usage_bytes",
        "container_fs_writes_bytes_total",
        "container_fs_writes_total",
        "container_last_seen",
        "container_memory_cache",
        "container_memory_failcnt",
        "container_memory_failures_total",
        "container_memory_kernel_usage",
        "container_memory_mapped_file",
        "container_memory_max_usage_bytes",
        "container_memory_rss",
        "container_memory_swap",
        "container_memory_usage_bytes",
        "container_memory_working_set_bytes",
        "container_network_receive_bytes_total",
        "container_network_receive_errors_total",
        "container_network_receive_packets_dropped_total",
        "container_network_receive_packets_total",
        "container_network_transmit_bytes_total",
        "container_network_transmit_errors_total",
        "container_network_transmit_packets_dropped_total",
        "container_network_transmit_packets_total",
        "container_oom_events_total",
        "container_processes",
        "container_sockets",
        "container_spec_cpu_period",
        "container_spec_cpu_shares",
        "container_spec_memory_limit_bytes",
        "container_spec_memory_swap_limit_bytes",
        "container_start_time_seconds",
        "container_threads",
        "container_threads_max",
    ];

    /// Listed, never valued (see [`DESCRIPTORS`]).
    const UNREPORTED: &[&str] = &[
        "container_ulimits_soft",
        "container_spec_memory_reservation_limit_bytes",
    ];

    fn busy_extras() -> ContainerExtras {
        use crate::lifecycle::cgroup_metrics::{DeviceIo, Throttling};
        ContainerExtras {
            cgroup: CgroupExtras {
                throttling: Some(Throttling {
                    periods: 10,
                    throttled_periods: 2,
                    throttled_ns: 3_200_000_000,
                }),
                kernel_usage: Some(4096),
                swap: Some(0),
                active_file: Some(7),
                inactive_file: Some(8),
                oom_kills: Some(1),
                pids_max: Some(0),
                cpu_period: Some(100_000),
                cpu_shares: Some(1024),
                memory_swap_limit: Some(64 << 20),
                io: vec![DeviceIo {
                    device: "/dev/sda".into(),
                    major: 8,
                    minor: 0,
                    read_bytes: 4096,
                    write_bytes: 8192,
                    reads: 1,
                    writes: 2,
                }],
                procs: vec![1],
            },
            descriptors: Some((5, 1)),
            filesystem: Some((1 << 30, 1000)),
        }
    }

    #[test]
    fn critests_expected_descriptors_are_listed_and_each_has_values_with_its_labels() {
        for name in CRITEST_EXPECTED {
            assert!(
                DESCRIPTORS.iter().any(|d| d.name == *name),
                "{name} not listed"
            );
        }
        let mut s = stats();
        s.containers[0].writable = Some((300, 12, "/var/lib/snapshots".into()));
        let extras = HashMap::from([("c1".to_string(), busy_extras())]);
        let p = pod_metrics(&s, &extras, 1_700_000_123);
        let all: Vec<&Metric> = p
            .metrics
            .iter()
            .chain(p.containers.iter().flat_map(|(_, m)| m))
            .collect();
        for d in DESCRIPTORS {
            let values: Vec<_> = all.iter().filter(|m| m.name == d.name).collect();
            if UNREPORTED.contains(&d.name) {
                assert!(values.is_empty(), "{}", d.name);
                continue;
            }
            assert!(!values.is_empty(), "{} has no value", d.name);
            for m in values {
                assert_eq!(m.label_values.len(), d.label_keys.len(), "{m:?}");
                assert_eq!(m.kind, d.kind, "{m:?}");
            }
        }
        let (_, m) = &p.containers[0];
        assert_eq!(find(m, "container_last_seen").value, 1_700_000_123);
        assert_eq!(
            find(m, "container_cpu_cfs_throttled_seconds_total").value,
            3
        );
        let fs = find(m, "container_fs_usage_bytes");
        assert_eq!((fs.value, fs.label_values[5].as_str()), (300, "/"));
        assert_eq!(find(m, "container_fs_limit_bytes").value, 1 << 30);
        assert_eq!(find(m, "container_sockets").value, 1);
        let blkio: Vec<_> = m
            .iter()
            .filter(|m| m.name == "container_blkio_device_usage_total")
            .map(|m| (m.label_values[5..].to_vec(), m.value))
            .collect();
        assert_eq!(
            blkio,
            [
                (
                    vec![
                        "/dev/sda".to_string(),
                        "8".into(),
                        "0".into(),
                        "Read".into()
                    ],
                    4096
                ),
                (
                    vec![
                        "/dev/sda".to_string(),
                        "8".into(),
                        "0".into(),
                        "Write".into()
                    ],
                    8192
                ),
            ]
        );
        let faults: Vec<_> = m
            .iter()
            .filter(|m| m.name == "container_memory_failures_total")
            .map(|m| m.label_values[5..].to_vec())
            .collect();
        assert_eq!(
            faults,
            [
                vec!["pgfault".to_string(), "container".into()],
                vec!["pgmajfault".to_string(), "container".into()],
            ]
        );
    }
}
