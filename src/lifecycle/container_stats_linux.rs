//! ContainerStats and ListContainerStats: CPU and memory from the container's cgroup (v1, read
//! through its init process's `/proc/<pid>/cgroup`), writable layer usage from the snapshotter.

use std::collections::HashMap;
use std::path::PathBuf;

use super::{now_ns, ContainerError, Pods};
use crate::store::{ContainerSnapshot, ContainerState};

/// Memory figures of a cgroup (bytes, except the fault counters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryStats {
    /// `memory.usage_in_bytes`.
    pub usage: u64,
    /// Usage minus inactive file cache, as kubelet and cAdvisor define it.
    pub working_set: u64,
    /// Anonymous and swap cache memory (`total_rss`).
    pub rss: u64,
    /// `total_pgfault`.
    pub page_faults: u64,
    /// `total_pgmajfault`.
    pub major_page_faults: u64,
}

/// One container's stats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stats {
    /// The container.
    pub container: ContainerSnapshot,
    /// When measured (ns since the epoch).
    pub timestamp_ns: i64,
    /// Cumulative CPU time in ns (running containers only).
    pub cpu_ns: Option<u64>,
    /// Memory (running containers only).
    pub memory: Option<MemoryStats>,
    /// Writable layer bytes and inodes, and the snapshotter root.
    pub writable: Option<(u64, u64, PathBuf)>,
}

/// The cgroup v1 path of each controller of `pid`.
fn cgroup_paths(pid: u32) -> HashMap<String, String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let mut out = HashMap::new();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next(), parts.next(), parts.next());
        if let (Some(controllers), Some(path)) = (controllers, path) {
            for c in controllers.split(',') {
                out.insert(c.to_string(), path.to_string());
            }
        }
    }
    out
}

fn read_u64(path: PathBuf) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn memory_stats(dir: PathBuf) -> Option<MemoryStats> {
    let usage = read_u64(dir.join("memory.usage_in_bytes"))?;
    let stat = std::fs::read_to_string(dir.join("memory.stat")).unwrap_or_default();
    let get = |key: &str| {
        stat.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    Some(MemoryStats {
        usage,
        working_set: usage.saturating_sub(get("total_inactive_file")),
        rss: get("total_rss"),
        page_faults: get("total_pgfault"),
        major_page_faults: get("total_pgmajfault"),
    })
}

impl Pods {
    async fn stats_of(&self, container: ContainerSnapshot) -> Stats {
        let timestamp_ns = now_ns();
        let (cpu_ns, memory) =
            if container.status.state == ContainerState::Running && container.status.pid != 0 {
                let paths = cgroup_paths(container.status.pid);
                let root = PathBuf::from("/sys/fs/cgroup");
                let cpu = paths.get("cpuacct").and_then(|p| {
                    read_u64(
                        root.join("cpuacct")
                            .join(p.trim_start_matches('/'))
                            .join("cpuacct.usage"),
                    )
                });
                let mem = paths.get("memory").and_then(|p| {
                    memory_stats(root.join("memory").join(p.trim_start_matches('/')))
                });
                (cpu, mem)
            } else {
                (None, None)
            };
        let snapshotter = self.snapshotter.clone();
        let snaps = self.snapshots.clone();
        let writable = match snaps.usage(&snapshotter, &container.metadata.id).await {
            Ok(u) => {
                let root = snaps
                    .root(&snapshotter)
                    .await
                    .ok()
                    .flatten()
                    .unwrap_or_default();
                Some((u.bytes.max(0) as u64, u.inodes.max(0) as u64, root))
            }
            Err(_) => None,
        };
        Stats {
            container,
            timestamp_ns,
            cpu_ns,
            memory,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process_cgroups() {
        let paths = cgroup_paths(std::process::id());
        assert!(paths.contains_key("memory"), "{paths:?}");
        let p = paths["memory"].trim_start_matches('/');
        let m = memory_stats(PathBuf::from("/sys/fs/cgroup/memory").join(p)).expect("memory stats");
        assert!(m.usage > 0 && m.working_set <= m.usage);
    }
}
