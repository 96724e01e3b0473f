//! StopPodSandbox: the pod's containers stopped, the pause task killed and deleted, the
//! network torn down, NotReady.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use slog::{info, warn};

use super::backend::TaskStatus;
use super::container_events::EventKind;
use super::sandbox_files;
use super::{blocking, exit_ns, now_ns, Pods, SandboxError, KILL_WAIT};
use crate::net::PodNetInfo;
use crate::store::{Sandbox, StoreError};

impl Pods {
    /// StopPodSandbox. Idempotent; an unknown id is success (kubelet retries stops of pods it
    /// already removed).
    pub async fn stop_sandbox(self: &Arc<Self>, id: &str) -> Result<(), SandboxError> {
        let sandbox = match self.sandboxes.get(id) {
            Ok(s) => s,
            Err(StoreError::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let me = self.clone();
        tokio::spawn(async move { me.stop_sandbox_inner(&sandbox).await })
            .await
            .map_err(SandboxError::Aborted)?
    }

    pub(crate) async fn stop_sandbox_inner(&self, sandbox: &Sandbox) -> Result<(), SandboxError> {
        let id = sandbox.id();
        let log = self.log.new(slog::o!("pod_id" => id.to_string()));
        // The pod's containers go first, all at once (kubelet has stopped them gracefully
        // already), and their task deletes finish before the pause task's: the last task of a
        // pod ends its shim.
        let containers = self.containers_store.by_sandbox(id);
        let stops = containers.iter().map(|c| async move {
            self.stop_container_inner(c, Duration::ZERO)
                .await
                .map_err(|e| SandboxError::Container {
                    id: c.id().to_string(),
                    source: Box::new(e),
                })?;
            self.wait_exit_settled(c.id()).await;
            Ok::<(), SandboxError>(())
        });
        for result in futures_util::future::join_all(stops).await {
            result?;
        }
        // Removed containers' task deletes too (their cleanups run behind RemoveContainer).
        self.wait_removals_of(id).await?;
        // NRI's StopPodSandbox: its containers are stopped, the pod is still there (its
        // status readable); once per pod, however often it is stopped.
        if let Some(nri) = self.nri() {
            if self.nri_first_stop(id) {
                nri.stop_pod_sandbox(&sandbox.snapshot()).await;
            }
        }
        if let Some(state) = self.tasks.state(id).await? {
            if state.status != TaskStatus::Stopped {
                self.kill_ignoring_gone(id, libc::SIGKILL as u32).await?;
                if tokio::time::timeout(KILL_WAIT, self.tasks.wait(id))
                    .await
                    .is_err()
                {
                    warn!(log, "pause task did not exit after SIGKILL"; "waited_s" => KILL_WAIT.as_secs());
                }
            }
            if let Some(exit) = self.tasks.delete(id).await? {
                let at = exit_ns(exit.at);
                // First exit wins: the exit monitor may have recorded it already.
                let _ = sandbox.record_exit(exit.status as i32, at);
            }
        }
        let meta = sandbox.metadata();
        if !meta.netns_path.is_empty() {
            self.teardown_network(
                id,
                &meta.name,
                &meta.namespace,
                &meta.uid,
                Path::new(&meta.netns_path),
            )
            .await?;
        }
        let dir = self.sandbox_dir(id);
        blocking(move || sandbox_files::unmount_shm(&dir))
            .await
            .map_err(SandboxError::Aborted)??;
        sandbox.set_not_ready();
        self.events.emit(id, id, EventKind::Stopped, now_ns());
        info!(log, "pod sandbox stopped");
        Ok(())
    }

    /// CNI DEL for pod `id`, then its netns removed. Both are idempotent.
    pub(crate) async fn teardown_network(
        &self,
        id: &str,
        name: &str,
        namespace: &str,
        uid: &str,
        netns_path: &Path,
    ) -> Result<(), SandboxError> {
        let info = pod_net_info(id, name, namespace, uid, netns_path);
        self.network.teardown(&info).await?;
        self.network.remove_netns(netns_path).await?;
        Ok(())
    }
}

/// What CNI DEL needs to know about pod `id`.
pub(super) fn pod_net_info(
    id: &str,
    name: &str,
    namespace: &str,
    uid: &str,
    netns_path: &Path,
) -> PodNetInfo {
    PodNetInfo {
        id: id.to_string(),
        name: name.to_string(),
        namespace: namespace.to_string(),
        uid: uid.to_string(),
        port_mappings: Vec::new(),
        netns_path: netns_path.to_path_buf(),
        bandwidth: None,
        dns: None,
    }
}
