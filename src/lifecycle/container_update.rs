//! UpdateContainerResources and ReopenContainerLog.

use super::{ContainerError, Pods};
use crate::spec;
use crate::store::{ContainerState, HugepageLimitRecord, LinuxResources};

impl Pods {
    /// UpdateContainerResources: new limits applied to the running task's cgroup. (The spec on
    /// the containerd record keeps the limits of creation; a restarted task would get those.)
    ///
    /// With NRI, the plugins see the request first and may change it (their merged changes are
    /// what is applied); a refusal fails the call with nothing changed.
    pub async fn update_container_resources(
        &self,
        id: &str,
        resources: &spec::Resources,
    ) -> Result<(), ContainerError> {
        let container = self.containers_store.get(id)?;
        let Some(nri) = self.nri() else {
            return self.apply_container_resources(id, resources).await;
        };
        let pod = self
            .sandboxes
            .get(&container.metadata().sandbox_id)?
            .snapshot();
        let resources = nri
            .update_container(&pod, &container.snapshot(), resources)
            .await?;
        self.apply_container_resources(id, &resources).await?;
        nri.post_update_container(&pod, &container.snapshot()).await;
        Ok(())
    }

    /// New limits applied to container `id`'s running task, without NRI's hooks (the CRI
    /// call's own part, and the updates NRI plugins ask for themselves).
    pub(crate) async fn apply_container_resources(
        &self,
        id: &str,
        resources: &spec::Resources,
    ) -> Result<(), ContainerError> {
        let container = self.containers_store.get(id)?;
        let linux = spec::resources::linux_resources(resources, &self.host)?;
        let json = serde_json::to_vec(&linux).map_err(ContainerError::Encode)?;
        if container.state() == ContainerState::Running {
            self.tasks.update_resources(container.id(), json).await?;
        }
        // What ContainerStatus reports from now on (kept on the record, best effort).
        let mut recorded = container.status().resources.unwrap_or_default();
        merge_resources(&mut recorded, &linux);
        container.set_resources(recorded);
        self.persist(&container).await;
        Ok(())
    }

    /// ReopenContainerLog: a new log file at the same path (kubelet rotated the old one).
    pub async fn reopen_container_log(&self, id: &str) -> Result<(), ContainerError> {
        let container = self.running_container(id)?;
        if let Some(io) = self.io.get(container.id()) {
            if let Some(w) = &io.log {
                w.reopen().await.map_err(|e| ContainerError::Log {
                    action: "reopen the log file",
                    path: w.path().to_path_buf(),
                    source: e,
                })?;
            }
        }
        Ok(())
    }
}

/// The resources `spec` applies, as containerd's `copyResourcesToStatus` records them for
/// ContainerStatus: the CPU, memory, hugepage and unified settings of `linux.resources` and
/// the process's OOM score, each as set; what the spec does not set stays zero (CRI's "not
/// set": a container that asks for no memory has no memory limit to report, and kubelet then
/// reports no memory request for it).
pub(crate) fn spec_resources(spec: &oci_spec::runtime::Spec) -> LinuxResources {
    let mut recorded = LinuxResources {
        oom_score_adj: spec
            .process()
            .as_ref()
            .and_then(|p| p.oom_score_adj())
            .map_or(0, i64::from),
        ..LinuxResources::default()
    };
    if let Some(resources) = spec.linux().as_ref().and_then(|l| l.resources().as_ref()) {
        merge_resources(&mut recorded, resources);
    }
    recorded
}

/// `update` merged into `recorded`: what it sets replaces the recorded value, what it leaves
/// out is kept, as runc applies an update and containerd's `updateOCIResource` merges it
/// into the spec.
pub(crate) fn merge_resources(
    recorded: &mut LinuxResources,
    update: &oci_spec::runtime::LinuxResources,
) {
    // The spec's unsigned values come from CRI's non-negative i64s; saturate rather than wrap.
    let signed = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    if let Some(cpu) = update.cpu() {
        if let Some(v) = cpu.period() {
            recorded.cpu_period = signed(v);
        }
        if let Some(v) = cpu.quota() {
            recorded.cpu_quota = v;
        }
        if let Some(v) = cpu.shares() {
            recorded.cpu_shares = signed(v);
        }
        if let Some(v) = cpu.cpus() {
            recorded.cpuset_cpus = v.clone();
        }
        if let Some(v) = cpu.mems() {
            recorded.cpuset_mems = v.clone();
        }
    }
    if let Some(memory) = update.memory() {
        if let Some(v) = memory.limit() {
            recorded.memory_limit_in_bytes = v;
        }
        if let Some(v) = memory.swap() {
            recorded.memory_swap_limit_in_bytes = v;
        }
    }
    if let Some(limits) = update.hugepage_limits().as_ref().filter(|l| !l.is_empty()) {
        recorded.hugepage_limits = limits
            .iter()
            .map(|h| HugepageLimitRecord {
                page_size: h.page_size().clone(),
                limit: u64::try_from(h.limit()).unwrap_or(0),
            })
            .collect();
    }
    if let Some(unified) = update.unified() {
        recorded
            .unified
            .extend(unified.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec_with(resources: &spec::Resources, oom_score_adj: i32) -> oci_spec::runtime::Spec {
        let linux = spec::resources::linux_resources(resources, &spec::HostFacts::default())
            .expect("valid resources");
        let mut s = oci_spec::runtime::Spec::default();
        let mut l = oci_spec::runtime::Linux::default();
        l.set_resources(Some(linux));
        s.set_linux(Some(l));
        let mut p = oci_spec::runtime::Process::default();
        p.set_oom_score_adj(Some(oom_score_adj));
        s.set_process(Some(p));
        s
    }

    /// A Burstable container asking for CPU only (kubelet's pod_resize "remove cpu
    /// requests"): its CPU settings are recorded and its memory is left unset.
    #[test]
    fn a_cpu_only_container_records_no_memory() {
        let r = spec::Resources {
            cpu_period: 100_000,
            cpu_shares: 204,
            ..spec::Resources::default()
        };
        let recorded = spec_resources(&spec_with(&r, 1000));
        assert_eq!(
            recorded,
            LinuxResources {
                cpu_period: 100_000,
                cpu_shares: 204,
                oom_score_adj: 1000,
                ..LinuxResources::default()
            }
        );
    }

    /// An update changes what it sets and keeps the rest.
    #[test]
    fn an_update_merges_into_the_record() {
        let mut recorded = spec_resources(&spec_with(
            &spec::Resources {
                cpu_period: 100_000,
                cpu_quota: 50_000,
                cpu_shares: 512,
                memory_limit_in_bytes: 64 << 20,
                ..spec::Resources::default()
            },
            -997,
        ));
        let update = spec::resources::linux_resources(
            &spec::Resources {
                cpu_shares: 1024,
                memory_limit_in_bytes: 128 << 20,
                ..spec::Resources::default()
            },
            &spec::HostFacts::default(),
        )
        .unwrap();
        merge_resources(&mut recorded, &update);
        assert_eq!(
            recorded,
            LinuxResources {
                cpu_period: 100_000,
                cpu_quota: 50_000,
                cpu_shares: 1024,
                memory_limit_in_bytes: 128 << 20,
                oom_score_adj: -997,
                ..LinuxResources::default()
            }
        );
    }
}
