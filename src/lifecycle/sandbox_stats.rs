//! PodSandboxStats and ListPodSandboxStats: a pod's CPU, memory, processes and pressure, its
//! network interfaces, and the stats of each of its containers.
//!
//! - **CPU, memory, processes, pressure**: from the pod's cgroup, its `CgroupParent` (kubelet
//!   makes one per pod, e.g. `/kubepods/besteffort/pod<uid>`, or under the systemd driver a
//!   slice such as `kubepods-besteffort-pod<uid>.slice`, and every container of the pod is
//!   created under it), as containerd and CRI-O read it. A pod without a cgroup parent (created
//!   by crictl or critest) has no cgroup of its own: its figures are then the sum of its pause
//!   process's cgroup and its running containers' cgroups, without pressure (it does not add
//!   up).
//! - **Network**: `/proc/<pause pid>/net/dev` — the pause process lives in the pod's network
//!   namespace, so its view of `/proc/net/dev` is the pod's, read without entering it. A pod
//!   without a pause container: a running container's view, else read by a thread that joins
//!   its network namespace. As
//!   containerd: loopback left out, `eth0` the default interface (else the first one), and a
//!   host-network pod reports no network stats (the host's interfaces are not the pod's).
//! - **Containers**: every container of the pod, each read by the one path ContainerStats
//!   uses ([`Pods::stats_of`]).
//!
//! A pod without a pause container has no pause process in the sum of its parts.
//!
//! A pod that is not ready has no pause process and no network to read: PodSandboxStats
//! answers `UNAVAILABLE` for it (containerd's `ErrUnavailable`), and ListPodSandboxStats leaves
//! it out instead of failing the whole list.

use slog::debug;
use thiserror::Error;

use super::cgroup_stats::CgroupStats;
use super::container_stats::Stats;
pub use super::stats_read::{InterfaceStats, NetworkStats};
use super::stats_sampler::{sandbox_target, Need, Readings};
use super::Pods;
use crate::store::{ContainerSnapshot, SandboxFilter, SandboxSnapshot, SandboxState, StoreError};

/// One pod's stats.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxStats {
    /// The pod.
    pub sandbox: SandboxSnapshot,
    /// When measured (ns since the epoch).
    pub timestamp_ns: i64,
    /// The pod's CPU, memory and processes.
    pub cgroup: CgroupStats,
    /// The CPU use of its cgroup between two readings, in nanocores (`None` for a pod without
    /// a cgroup of its own, or at its first reading).
    pub usage_nano_cores: Option<u64>,
    /// Its network; `None` for a host-network pod.
    pub network: Option<NetworkStats>,
    /// Its containers' stats.
    pub containers: Vec<Stats>,
}

/// Why a pod's stats cannot be read.
#[derive(Debug, Error)]
pub enum StatsError {
    /// The pod is not ready (stopped, or its pause process exited): nothing left to measure.
    #[error("pod sandbox {id} is not ready: it has no stats")]
    NotReady {
        /// The pod.
        id: String,
    },
    /// No such pod.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Pods {
    /// PodSandboxStats.
    pub async fn sandbox_stats(&self, id: &str) -> Result<SandboxStats, StatsError> {
        let sandbox = self.sandboxes.get(id)?.snapshot();
        let (mut stats, _) = self
            .stats_of_sandboxes(vec![sandbox], &Need::default())
            .await;
        stats
            .pop()
            .unwrap_or_else(|| Err(StatsError::NotReady { id: id.to_string() }))
    }

    /// ListPodSandboxStats over the ready pods passing `filter` (its state is ignored: only
    /// ready pods have stats). A pod that stops while it is measured is left out.
    pub async fn list_sandbox_stats(&self, filter: &SandboxFilter) -> Vec<SandboxStats> {
        self.list_sandbox_stats_with(filter, &Need::default())
            .await
            .0
    }

    /// ListPodSandboxStats, with the readings (their extras if `need` asks for them).
    pub(crate) async fn list_sandbox_stats_with(
        &self,
        filter: &SandboxFilter,
        need: &Need,
    ) -> (Vec<SandboxStats>, Readings) {
        let filter = SandboxFilter {
            state: Some(SandboxState::Ready),
            ..filter.clone()
        };
        let (stats, readings) = self
            .stats_of_sandboxes(self.sandboxes.list(&filter), need)
            .await;
        let mut out = Vec::with_capacity(stats.len());
        for s in stats {
            match s {
                Ok(s) => out.push(s),
                Err(e) => {
                    debug!(self.log, "pod left out of the stats list"; "reason" => %e)
                }
            }
        }
        (out, readings)
    }

    /// The stats of `sandboxes`, in their order, from one answer of the sampler.
    async fn stats_of_sandboxes(
        &self,
        sandboxes: Vec<SandboxSnapshot>,
        need: &Need,
    ) -> (Vec<Result<SandboxStats, StatsError>>, Readings) {
        let mut pods = Vec::with_capacity(sandboxes.len());
        let mut targets = Vec::new();
        for sandbox in sandboxes {
            let mut containers: Vec<_> = self
                .containers_store
                .by_sandbox(&sandbox.metadata.id)
                .iter()
                .map(|c| c.snapshot())
                .collect();
            containers.sort_by(|a, b| a.metadata.id.cmp(&b.metadata.id));
            match sandbox_target(&sandbox, &containers) {
                Some(t) => {
                    targets.push((t, containers));
                    pods.push(Ok(sandbox));
                }
                None => pods.push(Err(StatsError::NotReady {
                    id: sandbox.metadata.id.clone(),
                })),
            }
        }
        let readings = self.readings(need, &[], &targets).await;
        let mut targets = targets.into_iter();
        let mut out = Vec::with_capacity(pods.len());
        for pod in pods {
            let result = match (pod, targets.next()) {
                (Ok(sandbox), Some((_, containers))) => {
                    self.sandbox_from(sandbox, containers, &readings).await
                }
                (Err(e), _) => Err(e),
                // One target per Ok pod, in their order: there is no Ok pod without one.
                (Ok(sandbox), None) => Err(StatsError::NotReady {
                    id: sandbox.metadata.id.clone(),
                }),
            };
            out.push(result);
        }
        (out, readings)
    }

    /// A ready pod's stats from `readings`.
    async fn sandbox_from(
        &self,
        sandbox: SandboxSnapshot,
        containers: Vec<ContainerSnapshot>,
        readings: &Readings,
    ) -> Result<SandboxStats, StatsError> {
        let id = &sandbox.metadata.id;
        let not_ready = || StatsError::NotReady { id: id.clone() };
        let reading = readings
            .sandboxes
            .get(id)
            .filter(|r| r.pid == sandbox.status.pid)
            .ok_or_else(not_ready)?;
        let mut stats = Vec::with_capacity(containers.len());
        for c in containers {
            stats.push(self.stats_from(c, readings).await);
        }
        let f = &reading.figures;
        let (cgroup, usage_nano_cores) = match f.own {
            Some(own) => (own, reading.usage_nano_cores),
            // No cgroup of its own: the sum of its pause process's and its containers'.
            None => (
                CgroupStats::sum(f.pause.iter().chain(stats.iter().map(|c| &c.cgroup))),
                None,
            ),
        };
        // The pause process may have exited since it was read: its figures are then not the
        // pod's.
        if self
            .sandboxes
            .get(id)
            .map(|s| s.status().state != SandboxState::Ready)
            .unwrap_or(true)
        {
            return Err(not_ready());
        }
        Ok(SandboxStats {
            timestamp_ns: reading.timestamp_ns,
            cgroup,
            usage_nano_cores,
            network: f.network.clone(),
            containers: stats,
            sandbox,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::cgroup_stats::CgroupFs;
    use super::super::stats_read::{own_cgroup, parse_net_dev};
    use super::*;
    use crate::spec::CgroupDriver;

    const NET_DEV: &str = "\
Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:    1400      14    0    0    0     0          0         0     1400      14    0    0    0     0       0          0
  eth0: 5245092    3721    1    2    0     0          0         0   228818    2207    3    4    0     0       0          0
  net1:      10       1    0    0    0     0          0         0       20       2    0    0    0     0       0          0
";

    #[test]
    fn net_dev_without_loopback() {
        let ifs = parse_net_dev(NET_DEV);
        assert_eq!(ifs.len(), 2, "{ifs:?}");
        assert_eq!(
            ifs[0],
            InterfaceStats {
                name: "eth0".into(),
                rx_bytes: 5245092,
                rx_packets: 3721,
                rx_errors: 1,
                rx_dropped: 2,
                tx_bytes: 228818,
                tx_packets: 2207,
                tx_errors: 3,
                tx_dropped: 4,
            }
        );
        assert_eq!((ifs[1].name.as_str(), ifs[1].tx_bytes), ("net1", 20));
        assert!(parse_net_dev("garbage\nx: 1 2\n").is_empty());
    }

    #[test]
    fn default_interface_is_eth0_else_the_first() {
        let mut n = NetworkStats {
            timestamp_ns: 1,
            interfaces: parse_net_dev(NET_DEV),
        };
        n.interfaces.reverse();
        assert_eq!(n.default_interface().unwrap().name, "eth0");
        n.interfaces.retain(|i| i.name != "eth0");
        assert_eq!(n.default_interface().unwrap().name, "net1");
        n.interfaces.clear();
        assert!(n.default_interface().is_none());
    }

    fn write(dir: &std::path::Path, file: &str, text: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(file), text).unwrap();
    }

    #[test]
    fn own_cgroup_is_its_parents_if_it_exists() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        write(
            &r.join("memory/kubepods/pod9"),
            "memory.usage_in_bytes",
            "4096\n",
        );
        write(&r.join("cpuacct/kubepods/pod9"), "cpuacct.usage", "77\n");
        let fs = CgroupFs::at(r.to_path_buf(), 100, remora_host::cgroup::Hierarchy::V1);
        let fs_driver = CgroupDriver::Cgroupfs;
        let s = own_cgroup(&fs, fs_driver, "/kubepods/pod9").expect("the pod's cgroup");
        assert_eq!(s.memory.map(|m| m.usage), Some(4096));
        assert_eq!(s.cpu.map(|c| c.usage_ns), Some(77));
        assert_eq!(s.pids, None, "the fixture has no pids controller");
        assert_eq!(own_cgroup(&fs, fs_driver, ""), None, "no parent");
        assert_eq!(
            own_cgroup(&fs, fs_driver, "/kubepods/missing"),
            None,
            "a parent that does not exist"
        );
    }

    #[test]
    fn own_cgroup_of_a_systemd_slice_is_where_systemd_puts_it() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        write(
            &r.join(
                "memory/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod9.slice",
            ),
            "memory.usage_in_bytes",
            "8192\n",
        );
        let fs = CgroupFs::at(r.to_path_buf(), 100, remora_host::cgroup::Hierarchy::V1);
        let s = own_cgroup(&fs, CgroupDriver::Systemd, "kubepods-besteffort-pod9.slice");
        assert_eq!(s.and_then(|s| s.memory).map(|m| m.usage), Some(8192));
        // No parent: the default slice is not the pod's.
        assert_eq!(own_cgroup(&fs, CgroupDriver::Systemd, ""), None);
    }
}
