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

use super::cgroup_stats::{CgroupFs, CgroupStats};
use super::container_stats::{process_cgroup, Stats};
use super::{now_ns, Pods};
use crate::spec::cgroups::pod_cgroup_dir;
use crate::spec::CgroupDriver;
use crate::store::{SandboxFilter, SandboxSnapshot, SandboxState, StoreError};

/// The interface kubelet and containerd take as a pod's own.
pub const DEFAULT_INTERFACE: &str = "eth0";

/// Counters of one network interface, from `/proc/net/dev`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct InterfaceStats {
    /// Interface name.
    pub name: String,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Packets received.
    pub rx_packets: u64,
    /// Receive errors.
    pub rx_errors: u64,
    /// Packets dropped on receive.
    pub rx_dropped: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Packets sent.
    pub tx_packets: u64,
    /// Transmit errors.
    pub tx_errors: u64,
    /// Packets dropped on transmit.
    pub tx_dropped: u64,
}

/// The interfaces of a pod's network namespace, loopback left out, in the kernel's order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NetworkStats {
    /// When read (ns since the epoch).
    pub timestamp_ns: i64,
    /// The interfaces.
    pub interfaces: Vec<InterfaceStats>,
}

impl NetworkStats {
    /// The pod's default interface: `eth0`, else the first one.
    pub fn default_interface(&self) -> Option<&InterfaceStats> {
        self.interfaces
            .iter()
            .find(|i| i.name == DEFAULT_INTERFACE)
            .or_else(|| self.interfaces.first())
    }
}

/// One pod's stats.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxStats {
    /// The pod.
    pub sandbox: SandboxSnapshot,
    /// When measured (ns since the epoch).
    pub timestamp_ns: i64,
    /// The pod's CPU, memory and processes.
    pub cgroup: CgroupStats,
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

/// The interfaces in the text of a `/proc/net/dev`, loopback left out.
pub fn parse_net_dev(text: &str) -> Vec<InterfaceStats> {
    // Two header lines, then `name: rx bytes packets errs drop fifo frame compressed multicast
    // tx bytes packets errs drop fifo colls carrier compressed`.
    text.lines()
        .filter_map(|line| {
            let (name, counters) = line.split_once(':')?;
            let name = name.trim();
            let v: Vec<u64> = counters
                .split_whitespace()
                .map(str::parse)
                .collect::<Result<_, _>>()
                .ok()?;
            if name == "lo" || v.len() < 16 {
                return None;
            }
            Some(InterfaceStats {
                name: name.to_string(),
                rx_bytes: v[0],
                rx_packets: v[1],
                rx_errors: v[2],
                rx_dropped: v[3],
                tx_bytes: v[8],
                tx_packets: v[9],
                tx_errors: v[10],
                tx_dropped: v[11],
            })
        })
        .collect()
}

/// The network of the namespace process `pid` is in.
fn network_of(pid: u32) -> Option<NetworkStats> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/net/dev")).ok()?;
    Some(network_now(&text))
}

/// The network stats of a `/proc/.../net/dev` text, read now.
fn network_now(net_dev: &str) -> NetworkStats {
    NetworkStats {
        timestamp_ns: now_ns(),
        interfaces: parse_net_dev(net_dev),
    }
}

/// The interfaces of the network namespace at `netns` (a pod without a pause container and
/// without a running container), read from inside it: `/proc/thread-self/net/dev` is the
/// reading thread's namespace's.
async fn network_in(netns: std::path::PathBuf) -> Option<NetworkStats> {
    let text = tokio::task::spawn_blocking(move || {
        crate::net::netns::run_in(&netns, || {
            std::fs::read_to_string("/proc/thread-self/net/dev").ok()
        })
    })
    .await
    .ok()?
    .ok()??;
    Some(network_now(&text))
}

impl Pods {
    /// PodSandboxStats.
    pub async fn sandbox_stats(&self, id: &str) -> Result<SandboxStats, StatsError> {
        let sandbox = self.sandboxes.get(id)?.snapshot();
        self.stats_of_sandbox(sandbox).await
    }

    /// ListPodSandboxStats over the ready pods passing `filter` (its state is ignored: only
    /// ready pods have stats). A pod that stops while it is measured is left out.
    pub async fn list_sandbox_stats(&self, filter: &SandboxFilter) -> Vec<SandboxStats> {
        let filter = SandboxFilter {
            state: Some(SandboxState::Ready),
            ..filter.clone()
        };
        let mut out = Vec::new();
        for sandbox in self.sandboxes.list(&filter) {
            let id = sandbox.metadata.id.clone();
            match self.stats_of_sandbox(sandbox).await {
                Ok(s) => out.push(s),
                Err(e) => {
                    debug!(self.log, "pod left out of the stats list"; "pod_id" => id, "reason" => %e)
                }
            }
        }
        out
    }

    async fn stats_of_sandbox(&self, sandbox: SandboxSnapshot) -> Result<SandboxStats, StatsError> {
        let pid = sandbox.status.pid;
        let pinned = sandbox.metadata.pinned_namespaces;
        if sandbox.status.state != SandboxState::Ready || (pid == 0 && !pinned) {
            return Err(StatsError::NotReady {
                id: sandbox.metadata.id.clone(),
            });
        }
        let timestamp_ns = now_ns();
        let mut containers = Vec::new();
        for c in self.containers_store.by_sandbox(&sandbox.metadata.id) {
            containers.push(self.stats_of(c.snapshot()).await);
        }
        containers.sort_by(|a, b| a.container.metadata.id.cmp(&b.container.metadata.id));
        let fs = CgroupFs::host();
        let driver = self.host.cgroup_driver;
        let cgroup = pod_cgroup(&fs, driver, &sandbox.metadata.cgroup_parent, || {
            let pause = (pid != 0).then(|| process_cgroup(&fs, pid));
            CgroupStats::sum(pause.iter().chain(containers.iter().map(|c| &c.cgroup)))
        });
        // A pod with a network namespace of its own has its path recorded; a host-network pod
        // has none.
        let network = if sandbox.metadata.netns_path.is_empty() {
            None
        } else if pid != 0 {
            network_of(pid)
        } else {
            // No pause process: a running container's view, else the namespace's own.
            let running = containers
                .iter()
                .map(|c| &c.container.status)
                .find(|s| s.state == crate::store::status::ContainerState::Running && s.pid != 0);
            match running {
                Some(s) => network_of(s.pid),
                None => network_in(std::path::PathBuf::from(&sandbox.metadata.netns_path)).await,
            }
        };
        // The pause process may have exited while we read: its figures are then not the pod's.
        if self
            .sandboxes
            .get(&sandbox.metadata.id)
            .map(|s| s.status().state != SandboxState::Ready)
            .unwrap_or(true)
        {
            return Err(StatsError::NotReady {
                id: sandbox.metadata.id.clone(),
            });
        }
        Ok(SandboxStats {
            sandbox,
            timestamp_ns,
            cgroup,
            network,
            containers,
        })
    }
}

/// A pod's cgroup figures: its cgroup parent's (a path, or a slice under `driver`), if it has
/// one that exists; `sum_of_parts` otherwise.
fn pod_cgroup(
    fs: &CgroupFs,
    driver: CgroupDriver,
    parent: &str,
    sum_of_parts: impl FnOnce() -> CgroupStats,
) -> CgroupStats {
    if let Some(dir) = pod_cgroup_dir(driver, parent) {
        let path = fs.path_of_dir(&dir);
        if fs.exists(&path) {
            return fs.read(&path);
        }
    }
    sum_of_parts()
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn pod_cgroup_from_its_parent_else_the_sum_of_its_parts() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        write(
            &r.join("memory/kubepods/pod9"),
            "memory.usage_in_bytes",
            "4096\n",
        );
        write(&r.join("cpuacct/kubepods/pod9"), "cpuacct.usage", "77\n");
        let fs = CgroupFs::at(r.to_path_buf(), 100, remora_host::cgroup::Hierarchy::V1);
        let parts = || CgroupStats {
            pids: Some(5),
            ..Default::default()
        };
        let fs_driver = CgroupDriver::Cgroupfs;
        let s = pod_cgroup(&fs, fs_driver, "/kubepods/pod9", parts);
        assert_eq!(s.memory.map(|m| m.usage), Some(4096));
        assert_eq!(s.cpu.map(|c| c.usage_ns), Some(77));
        assert_eq!(s.pids, None, "the fixture has no pids controller");
        assert_eq!(
            pod_cgroup(&fs, fs_driver, "", parts).pids,
            Some(5),
            "no parent"
        );
        assert_eq!(
            pod_cgroup(&fs, fs_driver, "/kubepods/missing", parts).pids,
            Some(5),
            "a parent that does not exist"
        );
    }

    #[test]
    fn pod_cgroup_of_a_systemd_slice_is_where_systemd_puts_it() {
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
        let parts = CgroupStats::default;
        let s = pod_cgroup(
            &fs,
            CgroupDriver::Systemd,
            "kubepods-besteffort-pod9.slice",
            parts,
        );
        assert_eq!(s.memory.map(|m| m.usage), Some(8192));
        // No parent: the default slice is not the pod's.
        assert_eq!(
            pod_cgroup(&fs, CgroupDriver::Systemd, "", parts).memory,
            None
        );
    }
}
