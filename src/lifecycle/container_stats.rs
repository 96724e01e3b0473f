//! ContainerStats and ListContainerStats: CPU, memory, processes and pressure (PSI) from the
//! container's cgroup (found through its init process's `/proc/<pid>/cgroup`, read by
//! [`super::cgroup_stats`]), writable layer usage from the snapshotter.

use std::path::PathBuf;

use super::cgroup_stats::{CgroupFs, CgroupStats};
use super::{now_ns, ContainerError, Pods};
use crate::store::{ContainerSnapshot, ContainerState};

/// One container's stats.
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    /// The container.
    pub container: ContainerSnapshot,
    /// When measured (ns since the epoch).
    pub timestamp_ns: i64,
    /// Its cgroup's CPU, memory and process figures (running containers only: a container
    /// that is not running has no cgroup, and all of them are `None`).
    pub cgroup: CgroupStats,
    /// Writable layer bytes and inodes, and the snapshotter root.
    pub writable: Option<(u64, u64, PathBuf)>,
}

/// The cgroup figures of process `pid` (a container's init, a pod's pause process); nothing if
/// it is gone.
pub(crate) fn process_cgroup(fs: &CgroupFs, pid: u32) -> CgroupStats {
    match std::fs::read_to_string(format!("/proc/{pid}/cgroup")) {
        Ok(text) => fs.read(&fs.path_of_process(&text)),
        Err(_) => CgroupStats::default(),
    }
}

impl Pods {
    /// A container's stats: the one reading behind ContainerStats, ListContainerStats and the
    /// containers of PodSandboxStats and ListPodSandboxMetrics.
    pub(crate) async fn stats_of(&self, container: ContainerSnapshot) -> Stats {
        let timestamp_ns = now_ns();
        let cgroup =
            if container.status.state == ContainerState::Running && container.status.pid != 0 {
                process_cgroup(&CgroupFs::host(), container.status.pid)
            } else {
                CgroupStats::default()
            };
        let writable = self.snapshot_usage.of(&container.metadata.id).await;
        Stats {
            container,
            timestamp_ns,
            cgroup,
            writable,
        }
    }

    /// ContainerStats.
    pub async fn container_stats(&self, id: &str) -> Result<Stats, ContainerError> {
        let c = self.containers_store.get(id)?;
        Ok(self.stats_of(c.snapshot()).await)
    }

    /// ListContainerStats over the containers passing `filter`.
    pub async fn list_container_stats(&self, filter: &crate::store::ContainerFilter) -> Vec<Stats> {
        let mut out = Vec::new();
        for c in self.containers_store.list(filter, &self.sandboxes) {
            out.push(self.stats_of(c).await);
        }
        out
    }
}
