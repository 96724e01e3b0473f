//! RemovePodSandbox: stopped if needed, then every trace removed (containers, task, container
//! record, snapshot, files, netns, name).

use std::sync::Arc;

use slog::info;

use super::sandbox_files;
use super::{blocking, now_ns, Pods, SandboxError};
use crate::store::StoreError;

impl Pods {
    /// RemovePodSandbox. Idempotent; an unknown id is success.
    pub async fn remove_sandbox(self: &Arc<Self>, id: &str) -> Result<(), SandboxError> {
        let sandbox = match self.sandboxes.get(id) {
            Ok(s) => s,
            Err(StoreError::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let me = self.clone();
        tokio::spawn(async move {
            me.stop_sandbox_inner(&sandbox).await?;
            let id = sandbox.id().to_string();
            for c in me.containers_store.by_sandbox(&id) {
                me.remove_container_inner(&c)
                    .await
                    .map_err(|e| SandboxError::Container {
                        id: c.id().to_string(),
                        source: Box::new(e),
                    })?;
            }
            // Their records and snapshots go before the pod's.
            me.wait_removals_of(&id).await?;
            me.containers.delete(&id).await?;
            me.snapshots.remove(&me.snapshotter, &id).await?;
            let dir = me.sandbox_dir(&id);
            blocking(move || sandbox_files::remove(&dir))
                .await
                .map_err(SandboxError::Aborted)??;
            me.names.release(&sandbox.metadata().name_key());
            match me.sandboxes.delete(&id) {
                Ok(_) | Err(StoreError::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            me.events.emit_sandbox_removed(sandbox.snapshot(), now_ns());
            if let Some(nri) = me.nri() {
                nri.remove_pod_sandbox(&sandbox.snapshot()).await;
            }
            me.nri_forget(&id);
            me.stats_sampler.forget(&id);
            info!(me.log, "pod sandbox removed"; "pod_id" => &id);
            Ok(())
        })
        .await
        .map_err(SandboxError::Aborted)?
    }
}
