//! UpdatePodSandboxResources (KEP-1287, in-place pod resize).
//!
//! kubelet calls it after it has resized the pod's cgroup itself; kubelet 1.37 rejects the
//! resize when the call fails ("failed to notify runtime for UpdatePodSandboxResources"), so a
//! refusal here stops every in-place resize of the pod. remora never makes a pod cgroup: kubelet names it in `cgroup_parent` and owns
//! it; the pause container's cgroup is a child of it that the OCI runtime makes (or, without a
//! parent, the runtime's default, which is the pause container's alone). So nothing is
//! written to a cgroup here: the call validates (the sandbox must exist), then records the
//! overhead and resources on the sandbox's containerd record (so they survive a restart) and
//! in the index, where verbose PodSandboxStatus reports them — as containerd 2.3 stores them
//! in its sandbox status and its record's `extensions` and reports them in its sandbox info.
//! NRI plugins see the request first (UpdatePodSandbox: one refusing it fails the call with
//! nothing recorded) and are told after (PostUpdatePodSandbox), as in containerd.

use super::{Pods, SandboxError};
use crate::spec;
use crate::store::persist::SANDBOX_EXTENSION;
use crate::store::{encode_extension, LinuxResources, PodResources};

impl Pods {
    /// UpdatePodSandboxResources: records `overhead` and `resources` (each absent when kubelet
    /// sent none; already validated) for sandbox `id` (full id or unique prefix).
    pub async fn update_sandbox_resources(
        &self,
        id: &str,
        overhead: Option<&spec::Resources>,
        resources: Option<&spec::Resources>,
    ) -> Result<(), SandboxError> {
        let sandbox = self.sandboxes.get(id)?;
        if let Some(nri) = self.nri() {
            nri.update_pod_sandbox(&sandbox.snapshot(), overhead, resources)
                .await?;
        }
        let serial = self.sandbox_updates.lock().await;
        let mut metadata = (*sandbox.metadata()).clone();
        metadata.updated_resources = Some(PodResources {
            overhead: overhead.map(LinuxResources::from),
            resources: resources.map(LinuxResources::from),
        });
        // The record first: the index never reports what a restart would lose.
        self.containers
            .set_extension(sandbox.id(), SANDBOX_EXTENSION, encode_extension(&metadata))
            .await?;
        // Same id (cloned from this sandbox's own metadata): cannot be refused.
        sandbox.replace_metadata(metadata);
        drop(serial);
        if let Some(nri) = self.nri() {
            nri.post_update_pod_sandbox(&sandbox.snapshot()).await;
        }
        Ok(())
    }
}
