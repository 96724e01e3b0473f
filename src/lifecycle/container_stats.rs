//! ContainerStats and ListContainerStats: CPU, memory, processes and pressure (PSI) from the
//! container's cgroup (found through its init process's `/proc/<pid>/cgroup`, read by
//! [`super::cgroup_stats`]), writable layer usage from the snapshotter. The cgroup readings
//! come from the [`super::stats_sampler`]: at most one sample of every container per period,
//! whoever asks.

use std::collections::HashMap;
use std::path::PathBuf;

use super::cgroup_stats::CgroupStats;
use super::stats_sampler::{
    container_target, sandbox_target, Need, Readings, SandboxTarget, Targets,
};
use super::{now_ns, ContainerError, Pods};
use crate::store::{ContainerFilter, ContainerSnapshot, SandboxFilter, SandboxState};

/// One container's stats.
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    /// The container.
    pub container: ContainerSnapshot,
    /// When measured (ns since the epoch): when its cgroup was read, for a running container.
    pub timestamp_ns: i64,
    /// Its cgroup's CPU, memory and process figures (running containers only: a container
    /// that is not running has no cgroup, and all of them are `None`).
    pub cgroup: CgroupStats,
    /// CPU use between the reading before this one and this one, in nanocores (`None` for
    /// the first reading of its process).
    pub usage_nano_cores: Option<u64>,
    /// Writable layer bytes and inodes, and the snapshotter root.
    pub writable: Option<(u64, u64, PathBuf)>,
}

impl Pods {
    /// Every running container and ready pod: what a collection of the sampler reads.
    pub(crate) fn stats_targets(&self) -> Targets {
        let containers = self
            .containers_store
            .list(&ContainerFilter::default(), &self.sandboxes);
        let ready = SandboxFilter {
            state: Some(SandboxState::Ready),
            ..Default::default()
        };
        let mut by_pod: HashMap<&str, Vec<ContainerSnapshot>> = HashMap::new();
        for c in &containers {
            by_pod
                .entry(c.metadata.sandbox_id.as_str())
                .or_default()
                .push(c.clone());
        }
        Targets {
            sandboxes: self
                .sandboxes
                .list(&ready)
                .iter()
                .filter_map(|s| {
                    let own = by_pod.get(s.metadata.id.as_str());
                    sandbox_target(s, own.map_or(&[][..], |v| v.as_slice()))
                })
                .collect(),
            containers: containers.iter().filter_map(container_target).collect(),
        }
    }

    /// The readings of `containers` and `sandboxes` (each with its containers) from the
    /// sampler.
    pub(crate) async fn readings(
        &self,
        need: &Need,
        containers: &[ContainerSnapshot],
        sandboxes: &[(SandboxTarget, Vec<ContainerSnapshot>)],
    ) -> Readings {
        let wanted = Targets {
            containers: containers
                .iter()
                .chain(sandboxes.iter().flat_map(|(_, cs)| cs))
                .filter_map(container_target)
                .collect(),
            sandboxes: sandboxes.iter().map(|(t, _)| t.clone()).collect(),
        };
        self.stats_sampler
            .read(need, wanted, || self.stats_targets())
            .await
    }

    /// A container's stats from `readings` (the sampler's answer for it): the one path behind
    /// ContainerStats, ListContainerStats and the containers of PodSandboxStats and
    /// ListPodSandboxMetrics.
    pub(crate) async fn stats_from(
        &self,
        container: ContainerSnapshot,
        readings: &Readings,
    ) -> Stats {
        let reading = container_target(&container)
            .and_then(|t| readings.containers.get(&t.id).filter(|r| r.pid == t.pid));
        let (timestamp_ns, cgroup, usage_nano_cores) = match reading {
            Some(r) => (r.timestamp_ns, r.figures.cgroup, r.usage_nano_cores),
            // Not running: no cgroup to read, nothing measured but now.
            None => (now_ns(), CgroupStats::default(), None),
        };
        let writable = self.snapshot_usage.of(&container.metadata.id).await;
        Stats {
            container,
            timestamp_ns,
            cgroup,
            usage_nano_cores,
            writable,
        }
    }

    /// ContainerStats.
    pub async fn container_stats(&self, id: &str) -> Result<Stats, ContainerError> {
        let c = self.containers_store.get(id)?.snapshot();
        let readings = self
            .readings(&Need::default(), std::slice::from_ref(&c), &[])
            .await;
        Ok(self.stats_from(c, &readings).await)
    }

    /// ListContainerStats over the containers passing `filter`.
    pub async fn list_container_stats(&self, filter: &ContainerFilter) -> Vec<Stats> {
        let containers = self.containers_store.list(filter, &self.sandboxes);
        let readings = self.readings(&Need::default(), &containers, &[]).await;
        let mut out = Vec::with_capacity(containers.len());
        for c in containers {
            out.push(self.stats_from(c, &readings).await);
        }
        out
    }
}
