//! What the stats sampler reads, and nothing above it: one process's cgroup, a pod's own
//! cgroup, a network namespace's counters and a container's metrics-only figures. Blocking
//! reads of cgroupfs and procfs, each bounded ([`super::cgroup_stats::read_small`]). The stats
//! and metrics RPCs (`container_stats`, `sandbox_stats`, `sandbox_metrics`) build on the
//! sampler's readings; this module is below all of them, so that none is both above and below
//! another.

use std::path::Path;

use super::cgroup_metrics::{count_descriptors, filesystem_of, CgroupExtras};
use super::cgroup_stats::{read_small, CgroupFs, CgroupPath, CgroupStats};
use super::now_ns;
use crate::spec::cgroups::pod_cgroup_dir;
use crate::spec::CgroupDriver;

/// The cgroup figures of process `pid` (a container's init, a pod's pause process); nothing if
/// it is gone.
pub(crate) fn process_cgroup(fs: &CgroupFs, pid: u32) -> CgroupStats {
    match read_small(Path::new(&format!("/proc/{pid}/cgroup"))) {
        Some(text) => fs.read(&fs.path_of_process(&text)),
        None => CgroupStats::default(),
    }
}

/// A pod's own cgroup figures: its cgroup parent's (a path, or a slice under `driver`), if it
/// has one that exists.
pub(crate) fn own_cgroup(fs: &CgroupFs, driver: CgroupDriver, parent: &str) -> Option<CgroupStats> {
    let dir = pod_cgroup_dir(driver, parent)?;
    let path = fs.path_of_dir(&dir);
    fs.exists(&path).then(|| fs.read(&path))
}

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
pub(crate) fn network_of(pid: u32) -> Option<NetworkStats> {
    let text = read_small(Path::new(&format!("/proc/{pid}/net/dev")))?;
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
/// without a running container), read from inside it by a thread of its own:
/// `/proc/thread-self/net/dev` is the reading thread's namespace's. Blocking.
pub(crate) fn network_in(netns: &Path) -> Option<NetworkStats> {
    let text =
        crate::net::netns::run_in(netns, || read_small(Path::new("/proc/thread-self/net/dev")))
            .ok()??;
    Some(network_now(&text))
}

/// What a running container's metrics read beyond its stats.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ContainerExtras {
    /// The metrics-only figures of its cgroup.
    pub cgroup: CgroupExtras,
    /// Open file descriptors and sockets of its processes.
    pub descriptors: Option<(u64, u64)>,
    /// Size and free inodes of the filesystem of its writable layer.
    pub filesystem: Option<(u64, u64)>,
}

/// Reads a running container's [`ContainerExtras`]: its cgroup at `path` (`None`: its init
/// process is gone), its writable layer's snapshotter root `writable_root`. Blocking:
/// cgroupfs, procfs and `statvfs`.
pub fn read_extras(
    fs: &CgroupFs,
    path: Option<&CgroupPath>,
    writable_root: Option<&Path>,
) -> ContainerExtras {
    let cgroup = path.map(|p| fs.read_extras(p)).unwrap_or_default();
    let descriptors = (!cgroup.procs.is_empty()).then(|| count_descriptors(&cgroup.procs));
    ContainerExtras {
        descriptors,
        filesystem: writable_root
            .filter(|p| !p.as_os_str().is_empty())
            .and_then(filesystem_of),
        cgroup,
    }
}
