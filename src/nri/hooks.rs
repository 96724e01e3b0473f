//! [`Nri`]: lifecycle's [`NriHooks`] over the `remora-nri` registry, and what the registry asks
//! of remora ([`PodsView`]: the Synchronize snapshot, and the container updates and evictions
//! plugins ask for on their own).

use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use remora_nri::api;
use remora_nri::merge;
use remora_nri::registry::{HookError, Registry, RuntimeHandle, SyncSource};
use slog::{info, warn, Logger};

use super::convert;
use crate::backend_error::BackendCode;
use crate::lifecycle::nri::{NriError, NriHooks, SyncBlock};
use crate::lifecycle::Pods;
use crate::spec;
use crate::store::{ContainerFilter, ContainerSnapshot, SandboxFilter, SandboxSnapshot};

/// NRI's hooks for [`Pods`]: each event converted and sent to the registry's plugins.
pub struct Nri {
    registry: Arc<Registry>,
    view: Arc<PodsView>,
    log: Logger,
}

impl Nri {
    /// Hooks over `registry`, applying plugins' updates through `view`.
    pub fn new(registry: Arc<Registry>, view: Arc<PodsView>, log: Logger) -> Self {
        Self {
            registry,
            view,
            log,
        }
    }

    /// Applies the updates and evictions a plugin asked for beside an event, in the
    /// background: they are other containers' business, not the event's call.
    fn apply_later(
        &self,
        updates: Vec<api::ContainerUpdate>,
        evictions: Vec<(String, api::ContainerEviction)>,
    ) {
        if updates.is_empty() && evictions.is_empty() {
            return;
        }
        let view = self.view.clone();
        let evictions = evictions.into_iter().map(|(_, e)| e).collect();
        tokio::spawn(async move {
            view.update_containers(updates, evictions).await;
        });
    }
}

fn hook_error(e: HookError) -> NriError {
    NriError::Plugin {
        plugin: e.plugin,
        event: format!("{:?}", e.event),
        // ttrpc's codes are gRPC's numbers.
        code: BackendCode::from_grpc_number(protobuf::Enum::value(&e.code)),
        message: e.message,
    }
}

fn merge_error(event: &str, e: merge::MergeError) -> NriError {
    NriError::Merge {
        event: event.to_string(),
        message: e.to_string(),
    }
}

#[async_trait]
impl NriHooks for Nri {
    async fn block_sync(&self) -> SyncBlock {
        SyncBlock::new(self.registry.block_sync().await)
    }

    async fn run_pod_sandbox(&self, pod: &SandboxSnapshot) -> Result<(), NriError> {
        let pod = convert::pod_sandbox(pod, None);
        self.registry
            .run_pod_sandbox(&pod)
            .await
            .map_err(hook_error)
    }

    async fn stop_pod_sandbox(&self, pod: &SandboxSnapshot) {
        self.registry
            .stop_pod_sandbox(&convert::pod_sandbox(pod, None))
            .await;
    }

    async fn remove_pod_sandbox(&self, pod: &SandboxSnapshot) {
        self.registry
            .remove_pod_sandbox(&convert::pod_sandbox(pod, None))
            .await;
    }

    async fn update_pod_sandbox(
        &self,
        pod: &SandboxSnapshot,
        overhead: Option<&spec::Resources>,
        resources: Option<&spec::Resources>,
    ) -> Result<(), NriError> {
        let (overhead, resources) = (
            overhead.map(convert::resources),
            resources.map(convert::resources),
        );
        self.registry
            .update_pod_sandbox(
                &convert::pod_sandbox(pod, None),
                overhead.as_ref(),
                resources.as_ref(),
            )
            .await
            .map_err(hook_error)
    }

    async fn post_update_pod_sandbox(&self, pod: &SandboxSnapshot) {
        self.registry
            .post_update_pod_sandbox(&convert::pod_sandbox(pod, None))
            .await;
    }

    async fn create_container(
        &self,
        pod: &SandboxSnapshot,
        container: &ContainerSnapshot,
        spec: &mut oci_spec::runtime::Spec,
    ) -> Result<(), NriError> {
        let pod = convert::pod_sandbox(pod, None);
        let ctr = convert::container(container, Some(spec));
        let replies = self
            .registry
            .create_container(&pod, &ctr)
            .await
            .map_err(hook_error)?;
        let merged =
            merge::merge_create(&ctr, replies).map_err(|e| merge_error("CreateContainer", e))?;
        crate::spec::nri::apply_adjustment(spec, &merged.adjust)?;
        self.apply_later(merged.updates, merged.evictions);
        Ok(())
    }

    async fn post_create_container(&self, pod: &SandboxSnapshot, container: &ContainerSnapshot) {
        self.registry
            .post_create_container(
                &convert::pod_sandbox(pod, None),
                &convert::container(container, None),
            )
            .await;
    }

    async fn start_container(
        &self,
        pod: &SandboxSnapshot,
        container: &ContainerSnapshot,
    ) -> Result<(), NriError> {
        self.registry
            .start_container(
                &convert::pod_sandbox(pod, None),
                &convert::container(container, None),
            )
            .await
            .map_err(hook_error)
    }

    async fn post_start_container(&self, pod: &SandboxSnapshot, container: &ContainerSnapshot) {
        self.registry
            .post_start_container(
                &convert::pod_sandbox(pod, None),
                &convert::container(container, None),
            )
            .await;
    }

    async fn update_container(
        &self,
        pod: &SandboxSnapshot,
        container: &ContainerSnapshot,
        requested: &spec::Resources,
    ) -> Result<spec::Resources, NriError> {
        let ctr = convert::container(container, None);
        let asked = convert::resources(requested);
        let replies = self
            .registry
            .update_container(&convert::pod_sandbox(pod, None), &ctr, &asked)
            .await
            .map_err(hook_error)?;
        let merged = merge::merge_update(&ctr, asked, replies)
            .map_err(|e| merge_error("UpdateContainer", e))?;
        self.apply_later(merged.updates, merged.evictions);
        Ok(convert::resources_onto(requested, &merged.resources))
    }

    async fn post_update_container(&self, pod: &SandboxSnapshot, container: &ContainerSnapshot) {
        self.registry
            .post_update_container(
                &convert::pod_sandbox(pod, None),
                &convert::container(container, None),
            )
            .await;
    }

    async fn stop_container(&self, pod: &SandboxSnapshot, container: &ContainerSnapshot) {
        let replies = self
            .registry
            .stop_container(
                &convert::pod_sandbox(pod, None),
                &convert::container(container, None),
            )
            .await;
        match merge::merge_stop(replies) {
            Ok(updates) => self.apply_later(updates, Vec::new()),
            Err(e) => {
                warn!(self.log, "NRI: plugins' replies to StopContainer dropped"; "container_id" => &container.metadata.id, "error" => %e)
            }
        }
    }

    async fn remove_container(&self, pod: &SandboxSnapshot, container: &ContainerSnapshot) {
        self.registry
            .remove_container(
                &convert::pod_sandbox(pod, None),
                &convert::container(container, None),
            )
            .await;
    }
}

/// remora's pods and containers as the registry sees them: a weak handle, so the registry
/// never keeps [`Pods`] alive.
pub struct PodsView {
    pods: Weak<Pods>,
    log: Logger,
}

impl PodsView {
    /// A view of `pods`.
    pub fn new(pods: &Arc<Pods>, log: Logger) -> Self {
        Self {
            pods: Arc::downgrade(pods),
            log,
        }
    }
}

impl SyncSource for PodsView {
    fn snapshot(&self) -> (Vec<api::PodSandbox>, Vec<api::Container>) {
        let Some(pods) = self.pods.upgrade() else {
            return (Vec::new(), Vec::new());
        };
        let sandboxes = pods.sandboxes.list(&SandboxFilter::default());
        let containers = pods
            .containers_store()
            .list(&ContainerFilter::default(), &pods.sandboxes);
        (
            sandboxes
                .iter()
                .map(|s| convert::pod_sandbox(s, None))
                .collect(),
            containers
                .iter()
                .map(|c| convert::container(c, None))
                .collect(),
        )
    }
}

/// How long an eviction's stop gives the container (NRI: a plugin evicting wants it gone).
const EVICTION_STOP_TIMEOUT: Duration = Duration::ZERO;

#[async_trait]
impl RuntimeHandle for PodsView {
    async fn update_containers(
        &self,
        updates: Vec<api::ContainerUpdate>,
        evictions: Vec<api::ContainerEviction>,
    ) -> Vec<api::ContainerUpdate> {
        let Some(pods) = self.pods.upgrade() else {
            return updates;
        };
        let mut failed = Vec::new();
        for update in updates {
            let id = update.container_id.clone();
            let Some(linux) = update.linux.as_ref() else {
                continue;
            };
            let Some(wanted) = linux.resources.as_ref() else {
                continue;
            };
            // remora keeps no resources of its own on the record: the update is what the
            // plugin sets, the rest left as the task has it.
            let resources = convert::resources_onto(&spec::Resources::default(), wanted);
            match pods.apply_container_resources(&id, &resources).await {
                Ok(()) => {
                    info!(self.log, "NRI: a plugin updated a container's resources"; "container_id" => &id)
                }
                Err(e) => {
                    warn!(self.log, "NRI: a plugin's update of a container failed"; "container_id" => &id, "error" => %e);
                    if !update.ignore_failure {
                        failed.push(update);
                    }
                }
            }
        }
        // Evictions in the background: a stop sends StopContainer to the plugins, and the
        // plugin asking may be waiting for this answer inside a call remora made to it (its
        // turn is taken): the stop's event would wait for that call's timeout. Their
        // failures are not part of the answer anyway (NRI's has only the failed updates).
        if !evictions.is_empty() {
            let log = self.log.clone();
            tokio::spawn(async move {
                for eviction in evictions {
                    let id = &eviction.container_id;
                    info!(log, "NRI: a plugin evicts a container"; "container_id" => id, "reason" => &eviction.reason);
                    if let Err(e) = pods.stop_container(id, EVICTION_STOP_TIMEOUT).await {
                        warn!(log, "NRI: evicting a container failed"; "container_id" => id, "error" => %e);
                    }
                }
            });
        }
        failed
    }
}

#[cfg(test)]
mod tests {
    use crate::backend_error::BackendCode;

    #[test]
    fn a_plugin_code_reads_as_grpc_reads_the_number() {
        // The code the CRI call fails with (`cri::error`) is the one tonic would read from the
        // plugin's number.
        for n in -1..=20 {
            let read = BackendCode::from_grpc_number(n)
                .map_or(tonic::Code::Ok, |c| tonic::Code::from_i32(c.grpc_number()));
            assert_eq!(read, tonic::Code::from_i32(n), "{n}");
        }
    }
}
