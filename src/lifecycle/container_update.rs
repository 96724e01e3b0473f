//! UpdateContainerResources and ReopenContainerLog.

use super::{ContainerError, Pods};
use crate::spec;
use crate::store::ContainerState;

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
