//! The stats side: container and pod stats, metric descriptors and metrics → CRI messages, and
//! the ListPodSandboxStats filter.

use crate::cri::v1;

use super::non_empty;
use super::status::{container as container_item, pod_sandbox_metadata};
use crate::lifecycle::cgroup_stats::{CgroupStats, PsiData, PsiStats};
use crate::lifecycle::container_stats::Stats;
use crate::lifecycle::sandbox_metrics::{Descriptor, Metric, MetricKind, PodMetrics};
use crate::lifecycle::sandbox_stats::{InterfaceStats, NetworkStats, SandboxStats};
use crate::store::SandboxFilter;

fn u(value: u64) -> Option<v1::UInt64Value> {
    Some(v1::UInt64Value { value })
}

fn psi_data(d: &PsiData) -> v1::PsiData {
    v1::PsiData {
        // The kernel counts µs, CRI nanoseconds (as containerd converts it).
        total: d.total_us.saturating_mul(1000),
        // Both in %.
        avg10: d.avg10,
        avg60: d.avg60,
        avg300: d.avg300,
    }
}

fn psi(p: &PsiStats) -> v1::PsiStats {
    v1::PsiStats {
        full: p.full.as_ref().map(psi_data),
        some: p.some.as_ref().map(psi_data),
    }
}

/// IO pressure, the one thing IoUsage carries: none without it (cgroup v1, PSI off).
fn io(c: &CgroupStats, timestamp: i64) -> Option<v1::IoUsage> {
    c.pressure.io.as_ref().map(|p| v1::IoUsage {
        timestamp,
        psi: Some(psi(p)),
    })
}

fn cpu(c: &CgroupStats, usage_nano_cores: Option<u64>, timestamp: i64) -> v1::CpuUsage {
    v1::CpuUsage {
        timestamp,
        usage_core_nano_seconds: c.cpu.and_then(|c| u(c.usage_ns)),
        // A rate needs two readings of the same process, which the stats sampler keeps: a
        // caller asking twice within its period gets the same reading twice, from which it
        // could compute no rate of its own (kubelet computes one where this is left out).
        usage_nano_cores: usage_nano_cores.and_then(u),
        psi: c.pressure.cpu.as_ref().map(psi),
    }
}

fn memory(c: &CgroupStats, timestamp: i64) -> v1::MemoryUsage {
    let m = c.memory;
    v1::MemoryUsage {
        timestamp,
        working_set_bytes: m.and_then(|m| u(m.working_set)),
        // "the memory limit - workingSetBytes", so only where there is a limit.
        available_bytes: m.and_then(|m| u(m.limit?.saturating_sub(m.working_set))),
        usage_bytes: m.and_then(|m| u(m.usage)),
        rss_bytes: m.and_then(|m| u(m.rss)),
        page_faults: m.and_then(|m| u(m.page_faults)),
        major_page_faults: m.and_then(|m| u(m.major_page_faults)),
        psi: c.pressure.memory.as_ref().map(psi),
    }
}

/// A container's stats as ContainerStats reports them.
pub fn container_stats(s: &Stats) -> v1::ContainerStats {
    let c = container_item(&s.container);
    v1::ContainerStats {
        attributes: Some(v1::ContainerAttributes {
            id: c.id,
            metadata: c.metadata,
            labels: c.labels,
            annotations: c.annotations,
        }),
        cpu: Some(cpu(&s.cgroup, s.usage_nano_cores, s.timestamp_ns)),
        memory: Some(memory(&s.cgroup, s.timestamp_ns)),
        writable_layer: s
            .writable
            .as_ref()
            .map(|(bytes, inodes, root)| v1::FilesystemUsage {
                timestamp: s.timestamp_ns,
                fs_id: Some(v1::FilesystemIdentifier {
                    mountpoint: root.display().to_string(),
                }),
                used_bytes: u(*bytes),
                inodes_used: u(*inodes),
            }),
        swap: None,
        io: io(&s.cgroup, s.timestamp_ns),
    }
}

fn interface(i: &InterfaceStats) -> v1::NetworkInterfaceUsage {
    v1::NetworkInterfaceUsage {
        name: i.name.clone(),
        rx_bytes: u(i.rx_bytes),
        rx_errors: u(i.rx_errors),
        tx_bytes: u(i.tx_bytes),
        tx_errors: u(i.tx_errors),
    }
}

/// The default interface, and the others in `interfaces` ("excluding the default", as
/// api.proto has it).
fn network(n: &NetworkStats) -> v1::NetworkUsage {
    let default = n.default_interface();
    v1::NetworkUsage {
        timestamp: n.timestamp_ns,
        default_interface: default.map(interface),
        interfaces: n
            .interfaces
            .iter()
            .filter(|i| Some(i.name.as_str()) != default.map(|d| d.name.as_str()))
            .map(interface)
            .collect(),
    }
}

/// A pod's stats as PodSandboxStats reports them (Linux).
pub fn pod_sandbox_stats(s: &SandboxStats) -> v1::PodSandboxStats {
    let m = &s.sandbox.metadata;
    v1::PodSandboxStats {
        attributes: Some(v1::PodSandboxAttributes {
            id: m.id.clone(),
            metadata: Some(pod_sandbox_metadata(m)),
            labels: m.labels.clone(),
            annotations: m.annotations.clone(),
        }),
        linux: Some(v1::LinuxPodSandboxStats {
            cpu: Some(cpu(&s.cgroup, s.usage_nano_cores, s.timestamp_ns)),
            memory: Some(memory(&s.cgroup, s.timestamp_ns)),
            network: s.network.as_ref().map(network),
            process: Some(v1::ProcessUsage {
                timestamp: s.timestamp_ns,
                process_count: s.cgroup.pids.and_then(u),
            }),
            containers: s.containers.iter().map(container_stats).collect(),
            io: io(&s.cgroup, s.timestamp_ns),
        }),
        windows: None,
    }
}

/// `ListPodSandboxStatsRequest.filter` → [`SandboxFilter`] (id or unique id prefix, and labels).
pub fn sandbox_stats_filter(f: Option<&v1::PodSandboxStatsFilter>) -> SandboxFilter {
    f.map(|f| SandboxFilter {
        id: non_empty(&f.id),
        state: None,
        label_selector: f.label_selector.clone(),
    })
    .unwrap_or_default()
}

/// A metric descriptor.
pub fn metric_descriptor(d: &Descriptor) -> v1::MetricDescriptor {
    v1::MetricDescriptor {
        name: d.name.to_string(),
        help: d.help.to_string(),
        label_keys: d.label_keys.iter().map(|k| k.to_string()).collect(),
    }
}

fn metric(m: &Metric) -> v1::Metric {
    v1::Metric {
        name: m.name.to_string(),
        // Read when asked for: "0 if the metric was gathered live".
        timestamp: 0,
        metric_type: match m.kind {
            MetricKind::Counter => v1::MetricType::Counter,
            MetricKind::Gauge => v1::MetricType::Gauge,
        } as i32,
        label_values: m.label_values.clone(),
        value: u(m.value),
    }
}

/// A pod's metrics.
pub fn pod_sandbox_metrics(p: &PodMetrics) -> v1::PodSandboxMetrics {
    v1::PodSandboxMetrics {
        pod_sandbox_id: p.pod_id.clone(),
        metrics: p.metrics.iter().map(metric).collect(),
        container_metrics: p
            .containers
            .iter()
            .map(|(id, metrics)| v1::ContainerMetrics {
                container_id: id.clone(),
                metrics: metrics.iter().map(metric).collect(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::lifecycle::cgroup_stats::{MemoryStats, Pressure};
    use crate::store::{ContainerMetadata, ContainerSnapshot, ContainerStatus};
    use crate::store::{SandboxMetadata, SandboxSnapshot, SandboxStatus};

    fn data(total_us: u64, avg10: f64) -> Option<PsiData> {
        Some(PsiData {
            total_us,
            avg10,
            avg60: avg10 / 2.0,
            avg300: avg10 / 4.0,
        })
    }

    /// A cgroup v2 reading with pressure on every resource; cpu without `full` (before 5.13).
    fn pressed() -> CgroupStats {
        CgroupStats {
            pressure: Pressure {
                cpu: Some(PsiStats {
                    some: data(1_500, 12.0),
                    full: None,
                }),
                memory: Some(PsiStats {
                    some: data(20, 2.0),
                    full: data(10, 1.0),
                }),
                io: Some(PsiStats {
                    some: data(300, 4.0),
                    full: data(200, 3.0),
                }),
            },
            ..Default::default()
        }
    }

    fn cri_data(total: u64, avg10: f64) -> Option<v1::PsiData> {
        Some(v1::PsiData {
            total,
            avg10,
            avg60: avg10 / 2.0,
            avg300: avg10 / 4.0,
        })
    }

    fn container(cgroup: CgroupStats) -> Stats {
        Stats {
            container: ContainerSnapshot {
                metadata: Arc::new(ContainerMetadata {
                    id: "c1".into(),
                    sandbox_id: "pod1".into(),
                    ..Default::default()
                }),
                status: ContainerStatus::created(1),
            },
            timestamp_ns: 7,
            cgroup,
            usage_nano_cores: None,
            writable: None,
        }
    }

    #[test]
    fn container_pressure_in_nanoseconds_and_percent() {
        let c = container_stats(&container(pressed()));
        assert_eq!(
            c.cpu.and_then(|c| c.psi),
            Some(v1::PsiStats {
                some: cri_data(1_500_000, 12.0),
                full: None,
            }),
            "total µs → ns; no full line, no full"
        );
        assert_eq!(
            c.memory.and_then(|m| m.psi),
            Some(v1::PsiStats {
                some: cri_data(20_000, 2.0),
                full: cri_data(10_000, 1.0),
            })
        );
        assert_eq!(
            c.io,
            Some(v1::IoUsage {
                timestamp: 7,
                psi: Some(v1::PsiStats {
                    some: cri_data(300_000, 4.0),
                    full: cri_data(200_000, 3.0),
                }),
            })
        );
    }

    #[test]
    fn no_pressure_no_psi_and_no_io() {
        let c = container_stats(&container(CgroupStats::default()));
        assert_eq!(c.cpu.and_then(|c| c.psi), None);
        assert_eq!(c.memory.and_then(|m| m.psi), None);
        assert_eq!(c.io, None, "IoUsage carries pressure alone");
        let huge = CgroupStats {
            pressure: Pressure {
                cpu: Some(PsiStats {
                    some: data(u64::MAX, 0.0),
                    full: None,
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(
            cpu(&huge, None, 1)
                .psi
                .and_then(|p| p.some)
                .map(|d| d.total),
            Some(u64::MAX),
            "saturates rather than wraps"
        );
    }

    #[test]
    fn the_cpu_rate_is_the_readings_and_absent_without_one() {
        let mut s = container(CgroupStats::default());
        let cpu = |s: &Stats| container_stats(s).cpu.expect("cpu").usage_nano_cores;
        assert_eq!(cpu(&s), None, "a first reading has no rate");
        s.usage_nano_cores = Some(250_000_000);
        assert_eq!(cpu(&s), Some(v1::UInt64Value { value: 250_000_000 }));
    }

    #[test]
    fn pod_pressure_is_the_pod_cgroup_s() {
        let s = SandboxStats {
            sandbox: SandboxSnapshot {
                metadata: Arc::new(SandboxMetadata {
                    id: "pod1".into(),
                    ..Default::default()
                }),
                status: SandboxStatus::ready(9),
            },
            timestamp_ns: 8,
            cgroup: pressed(),
            usage_nano_cores: None,
            network: None,
            containers: vec![container(CgroupStats::default())],
        };
        let linux = pod_sandbox_stats(&s).linux.expect("linux");
        assert_eq!(
            linux
                .io
                .map(|io| (io.timestamp, io.psi.and_then(|p| p.full))),
            Some((8, cri_data(200_000, 3.0)))
        );
        assert_eq!(
            linux.memory.and_then(|m| m.psi).and_then(|p| p.some),
            cri_data(20_000, 2.0)
        );
        assert_eq!(
            linux.cpu.and_then(|c| c.psi).and_then(|p| p.some),
            cri_data(1_500_000, 12.0)
        );
        assert_eq!(linux.containers[0].io, None, "the container's own: none");
    }

    fn iface(name: &str, rx: u64) -> InterfaceStats {
        InterfaceStats {
            name: name.into(),
            rx_bytes: rx,
            ..Default::default()
        }
    }

    #[test]
    fn the_default_interface_is_not_repeated_among_the_others() {
        let n = network(&NetworkStats {
            timestamp_ns: 7,
            interfaces: vec![iface("net1", 1), iface("eth0", 2), iface("net2", 3)],
        });
        assert_eq!(n.timestamp, 7);
        let d = n.default_interface.expect("default");
        assert_eq!(
            (d.name.as_str(), d.rx_bytes.map(|v| v.value)),
            ("eth0", Some(2))
        );
        let others: Vec<_> = n.interfaces.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(others, ["net1", "net2"]);
    }

    #[test]
    fn available_memory_only_under_a_limit() {
        let mut c = CgroupStats {
            memory: Some(MemoryStats {
                usage: 100,
                working_set: 60,
                ..Default::default()
            }),
            ..Default::default()
        };
        let m = memory(&c, 1);
        assert_eq!(m.working_set_bytes.map(|v| v.value), Some(60));
        assert_eq!(
            m.available_bytes, None,
            "unlimited: nothing to subtract from"
        );
        c.memory = c.memory.map(|m| MemoryStats {
            limit: Some(1000),
            ..m
        });
        assert_eq!(memory(&c, 1).available_bytes.map(|v| v.value), Some(940));
        let none = memory(&CgroupStats::default(), 1);
        assert!(none.usage_bytes.is_none() && none.working_set_bytes.is_none());
    }

    #[test]
    fn metrics_are_typed_and_gathered_live() {
        let m = metric(&Metric {
            name: "container_processes",
            kind: MetricKind::Gauge,
            label_values: vec!["a".into()],
            value: 4,
        });
        assert_eq!(m.metric_type, v1::MetricType::Gauge as i32);
        assert_eq!(m.timestamp, 0);
        assert_eq!(m.value.map(|v| v.value), Some(4));
    }

    #[test]
    fn stats_filter_keeps_id_and_labels_and_ignores_state() {
        let f = sandbox_stats_filter(Some(&v1::PodSandboxStatsFilter {
            id: "abc".into(),
            label_selector: [("app".to_string(), "web".to_string())].into(),
        }));
        assert_eq!(f.id.as_deref(), Some("abc"));
        assert_eq!(f.label_selector.get("app").map(String::as_str), Some("web"));
        assert_eq!(f.state, None);
        assert_eq!(sandbox_stats_filter(None), SandboxFilter::default());
        assert_eq!(
            sandbox_stats_filter(Some(&v1::PodSandboxStatsFilter::default())).id,
            None,
            "an empty id filters nothing"
        );
    }
}
