//! One call per NRI event, and the one way every event reaches the plugins
//! ([`Registry::dispatch`]): in order, one call at a time per plugin, each within the request
//! timeout, a fatal failure removing the plugin.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use protobuf::Enum as _;
use slog::warn;
use tokio::time::Instant;

use super::call::{bounded, context_until, CallError};
use super::{lock, HookError, Plugin, Registry};
use crate::api;

impl Registry {
    /// RunPodSandbox: a plugin's error fails it.
    pub async fn run_pod_sandbox(&self, pod: &api::PodSandbox) -> Result<(), HookError> {
        let mut req = api::RunPodSandboxRequest::new();
        req.pod = Some(pod.clone()).into();
        self.dispatch(Call::RunPodSandbox(req)).await.map(drop)
    }

    /// UpdatePodSandbox: a plugin's error fails it (as NRI's adaptation and containerd do).
    pub async fn update_pod_sandbox(
        &self,
        pod: &api::PodSandbox,
        overhead: Option<&api::LinuxResources>,
        resources: Option<&api::LinuxResources>,
    ) -> Result<(), HookError> {
        let mut req = api::UpdatePodSandboxRequest::new();
        req.pod = Some(pod.clone()).into();
        req.overhead_linux_resources = overhead.cloned().into();
        req.linux_resources = resources.cloned().into();
        self.dispatch(Call::UpdatePodSandbox(req)).await.map(drop)
    }

    /// PostUpdatePodSandbox; plugin errors are logged.
    pub async fn post_update_pod_sandbox(&self, pod: &api::PodSandbox) {
        let mut req = api::PostUpdatePodSandboxRequest::new();
        req.pod = Some(pod.clone()).into();
        self.notify(Call::PostUpdatePodSandbox(req)).await;
    }

    /// StopPodSandbox; plugin errors are logged.
    pub async fn stop_pod_sandbox(&self, pod: &api::PodSandbox) {
        let mut req = api::StopPodSandboxRequest::new();
        req.pod = Some(pod.clone()).into();
        self.notify(Call::StopPodSandbox(req)).await;
    }

    /// RemovePodSandbox; plugin errors are logged.
    pub async fn remove_pod_sandbox(&self, pod: &api::PodSandbox) {
        let mut req = api::RemovePodSandboxRequest::new();
        req.pod = Some(pod.clone()).into();
        self.notify(Call::RemovePodSandbox(req)).await;
    }

    /// CreateContainer: each subscribed plugin's response, in call order; a plugin's error
    /// fails it.
    pub async fn create_container(
        &self,
        pod: &api::PodSandbox,
        container: &api::Container,
    ) -> Result<Vec<(String, api::CreateContainerResponse)>, HookError> {
        let mut req = api::CreateContainerRequest::new();
        req.pod = Some(pod.clone()).into();
        req.container = Some(container.clone()).into();
        let replies = self.dispatch(Call::CreateContainer(req)).await?;
        Ok(replies
            .into_iter()
            .filter_map(|(name, reply)| match reply {
                Reply::CreateContainer(r) => Some((name, r)),
                _ => None,
            })
            .collect())
    }

    /// PostCreateContainer; plugin errors are logged.
    pub async fn post_create_container(&self, pod: &api::PodSandbox, container: &api::Container) {
        let mut req = api::PostCreateContainerRequest::new();
        req.pod = Some(pod.clone()).into();
        req.container = Some(container.clone()).into();
        self.notify(Call::PostCreateContainer(req)).await;
    }

    /// StartContainer: a plugin's error fails it.
    pub async fn start_container(
        &self,
        pod: &api::PodSandbox,
        container: &api::Container,
    ) -> Result<(), HookError> {
        let mut req = api::StartContainerRequest::new();
        req.pod = Some(pod.clone()).into();
        req.container = Some(container.clone()).into();
        self.dispatch(Call::StartContainer(req)).await.map(drop)
    }

    /// PostStartContainer; plugin errors are logged.
    pub async fn post_start_container(&self, pod: &api::PodSandbox, container: &api::Container) {
        let mut req = api::PostStartContainerRequest::new();
        req.pod = Some(pod.clone()).into();
        req.container = Some(container.clone()).into();
        self.notify(Call::PostStartContainer(req)).await;
    }

    /// UpdateContainer: each subscribed plugin's response, in call order; a plugin's error
    /// fails it.
    pub async fn update_container(
        &self,
        pod: &api::PodSandbox,
        container: &api::Container,
        resources: &api::LinuxResources,
    ) -> Result<Vec<(String, api::UpdateContainerResponse)>, HookError> {
        let mut req = api::UpdateContainerRequest::new();
        req.pod = Some(pod.clone()).into();
        req.container = Some(container.clone()).into();
        req.linux_resources = Some(resources.clone()).into();
        let replies = self.dispatch(Call::UpdateContainer(req)).await?;
        Ok(replies
            .into_iter()
            .filter_map(|(name, reply)| match reply {
                Reply::UpdateContainer(r) => Some((name, r)),
                _ => None,
            })
            .collect())
    }

    /// PostUpdateContainer; plugin errors are logged.
    pub async fn post_update_container(&self, pod: &api::PodSandbox, container: &api::Container) {
        let mut req = api::PostUpdateContainerRequest::new();
        req.pod = Some(pod.clone()).into();
        req.container = Some(container.clone()).into();
        self.notify(Call::PostUpdateContainer(req)).await;
    }

    /// StopContainer: each subscribed plugin's response, in call order; plugin errors are
    /// logged.
    pub async fn stop_container(
        &self,
        pod: &api::PodSandbox,
        container: &api::Container,
    ) -> Vec<(String, api::StopContainerResponse)> {
        let mut req = api::StopContainerRequest::new();
        req.pod = Some(pod.clone()).into();
        req.container = Some(container.clone()).into();
        self.notify(Call::StopContainer(req))
            .await
            .into_iter()
            .filter_map(|(name, reply)| match reply {
                Reply::StopContainer(r) => Some((name, r)),
                _ => None,
            })
            .collect()
    }

    /// RemoveContainer; plugin errors are logged.
    pub async fn remove_container(&self, pod: &api::PodSandbox, container: &api::Container) {
        let mut req = api::RemoveContainerRequest::new();
        req.pod = Some(pod.clone()).into();
        req.container = Some(container.clone()).into();
        self.notify(Call::RemoveContainer(req)).await;
    }

    /// Dispatches an event whose plugin errors are only logged.
    async fn notify(&self, call: Call) -> Vec<(String, Reply)> {
        debug_assert!(!call.fails_on_error());
        // An event that does not fail on error never returns Err: `dispatch` logs instead.
        self.dispatch(call).await.unwrap_or_default()
    }

    /// Calls the active plugins subscribed to `call`'s event, in order.
    async fn dispatch(&self, call: Call) -> Result<Vec<(String, Reply)>, HookError> {
        let event = call.event();
        let bit = event_bit(event);
        let plugins: Vec<Arc<Plugin>> = lock(&self.plugins)
            .iter()
            .filter(|p| p.events & bit != 0)
            .cloned()
            .collect();
        let mut replies = Vec::with_capacity(plugins.len());
        for plugin in plugins {
            match self.call_plugin(&plugin, &call).await {
                Ok(reply) => replies.push((plugin.name.clone(), reply)),
                Err(CallError::Fatal(why)) => {
                    self.remove(&plugin, &format!("{event:?} failed: {why}"));
                    // NRI goes on without the plugin; issue 30 asks that the call fail, as it
                    // does when the plugin answers with an error: a pod or container is not
                    // made without the plugin having had its say. Later calls skip it.
                    if call.fails_on_error() {
                        return Err(HookError {
                            plugin: plugin.name.clone(),
                            event,
                            code: ttrpc::Code::UNAVAILABLE,
                            message: format!("the plugin was dropped: {why}"),
                        });
                    }
                }
                Err(CallError::Status(status)) if call.fails_on_error() => {
                    return Err(HookError {
                        plugin: plugin.name.clone(),
                        event,
                        code: status.code(),
                        message: status.message().to_string(),
                    });
                }
                Err(err @ CallError::Status(_)) => {
                    warn!(plugin.log, "NRI: plugin failed an event";
                        "event" => ?event, "error" => %err);
                }
            }
        }
        Ok(replies)
    }

    /// One call to one plugin within the request timeout, with NRI's StateChange fallback.
    ///
    /// One at a time per plugin, waiting for its turn within the same timeout: ttrpc's client
    /// numbers a request before it is queued for writing, so two calls at once can reach the
    /// plugin out of order, and Go's ttrpc server refuses a stream id lower than the last one
    /// ("StreamID cannot be re-used and must increment"), failing the call. NRI's adaptation
    /// holds one lock around every event, so its plugins never see two calls at once either.
    async fn call_plugin(&self, plugin: &Plugin, call: &Call) -> Result<Reply, CallError> {
        let deadline = Instant::now() + self.config.request_timeout;
        let Ok(_turn) = tokio::time::timeout_at(deadline, plugin.turn.lock()).await else {
            return Err(CallError::Fatal(
                "no answer within the request timeout (an earlier call to it was pending)".into(),
            ));
        };
        match bounded(deadline, call.invoke(&plugin.client, deadline)).await {
            Err(CallError::Status(status)) if status.code() == ttrpc::Code::UNIMPLEMENTED => {
                let Some(change) = call.state_change() else {
                    return Err(CallError::Status(status));
                };
                if !plugin.warned_state_change.swap(true, Ordering::Relaxed) {
                    warn!(plugin.log, "NRI: plugin uses the deprecated StateChange";
                        "event" => ?call.event());
                }
                bounded(
                    deadline,
                    plugin.client.state_change(context_until(deadline), &change),
                )
                .await
                .map(|_| Reply::Empty)
            }
            other => other,
        }
    }
}

/// An event's bit in a plugin's mask.
fn event_bit(event: api::Event) -> u32 {
    match event.value() {
        e @ 1..=31 => 1 << (e - 1),
        _ => 0,
    }
}

/// One NRI event, as its request.
enum Call {
    RunPodSandbox(api::RunPodSandboxRequest),
    UpdatePodSandbox(api::UpdatePodSandboxRequest),
    PostUpdatePodSandbox(api::PostUpdatePodSandboxRequest),
    StopPodSandbox(api::StopPodSandboxRequest),
    RemovePodSandbox(api::RemovePodSandboxRequest),
    CreateContainer(api::CreateContainerRequest),
    PostCreateContainer(api::PostCreateContainerRequest),
    StartContainer(api::StartContainerRequest),
    PostStartContainer(api::PostStartContainerRequest),
    UpdateContainer(api::UpdateContainerRequest),
    PostUpdateContainer(api::PostUpdateContainerRequest),
    StopContainer(api::StopContainerRequest),
    RemoveContainer(api::RemoveContainerRequest),
}

/// A plugin's answer to a [`Call`]; `Empty` for the events that return nothing.
enum Reply {
    Empty,
    CreateContainer(api::CreateContainerResponse),
    UpdateContainer(api::UpdateContainerResponse),
    StopContainer(api::StopContainerResponse),
}

impl Call {
    fn event(&self) -> api::Event {
        use api::Event as E;
        match self {
            Call::RunPodSandbox(_) => E::RUN_POD_SANDBOX,
            Call::UpdatePodSandbox(_) => E::UPDATE_POD_SANDBOX,
            Call::PostUpdatePodSandbox(_) => E::POST_UPDATE_POD_SANDBOX,
            Call::StopPodSandbox(_) => E::STOP_POD_SANDBOX,
            Call::RemovePodSandbox(_) => E::REMOVE_POD_SANDBOX,
            Call::CreateContainer(_) => E::CREATE_CONTAINER,
            Call::PostCreateContainer(_) => E::POST_CREATE_CONTAINER,
            Call::StartContainer(_) => E::START_CONTAINER,
            Call::PostStartContainer(_) => E::POST_START_CONTAINER,
            Call::UpdateContainer(_) => E::UPDATE_CONTAINER,
            Call::PostUpdateContainer(_) => E::POST_UPDATE_CONTAINER,
            Call::StopContainer(_) => E::STOP_CONTAINER,
            Call::RemoveContainer(_) => E::REMOVE_CONTAINER,
        }
    }

    /// Whether a plugin's error status fails the runtime's call.
    fn fails_on_error(&self) -> bool {
        matches!(
            self,
            Call::RunPodSandbox(_)
                | Call::UpdatePodSandbox(_)
                | Call::CreateContainer(_)
                | Call::UpdateContainer(_)
                | Call::StartContainer(_)
        )
    }

    /// The deprecated StateChange for this event, for the events NRI falls back for
    /// (pkg/adaptation/plugin_type.go): those that return nothing, except UpdatePodSandbox.
    fn state_change(&self) -> Option<api::StateChangeEvent> {
        let (pod, container) = match self {
            Call::RunPodSandbox(r) => (&r.pod, None),
            Call::PostUpdatePodSandbox(r) => (&r.pod, None),
            Call::StopPodSandbox(r) => (&r.pod, None),
            Call::RemovePodSandbox(r) => (&r.pod, None),
            Call::PostCreateContainer(r) => (&r.pod, Some(&r.container)),
            Call::StartContainer(r) => (&r.pod, Some(&r.container)),
            Call::PostStartContainer(r) => (&r.pod, Some(&r.container)),
            Call::PostUpdateContainer(r) => (&r.pod, Some(&r.container)),
            Call::RemoveContainer(r) => (&r.pod, Some(&r.container)),
            Call::UpdatePodSandbox(_)
            | Call::CreateContainer(_)
            | Call::UpdateContainer(_)
            | Call::StopContainer(_) => return None,
        };
        let mut change = api::StateChangeEvent::new();
        change.event = self.event().into();
        change.pod = pod.clone();
        if let Some(container) = container {
            change.container = container.clone();
        }
        Some(change)
    }

    /// The plugin RPC for this event, with a ttrpc timeout ending at `deadline`.
    fn invoke<'a>(
        &'a self,
        client: &'a api::PluginClient,
        deadline: Instant,
    ) -> impl Future<Output = ttrpc::Result<Reply>> + Send + 'a {
        let ctx = context_until(deadline);
        async move {
            Ok(match self {
                Call::RunPodSandbox(r) => {
                    client.run_pod_sandbox(ctx, r).await.map(|_| Reply::Empty)?
                }
                Call::UpdatePodSandbox(r) => client
                    .update_pod_sandbox(ctx, r)
                    .await
                    .map(|_| Reply::Empty)?,
                Call::PostUpdatePodSandbox(r) => client
                    .post_update_pod_sandbox(ctx, r)
                    .await
                    .map(|_| Reply::Empty)?,
                Call::StopPodSandbox(r) => client
                    .stop_pod_sandbox(ctx, r)
                    .await
                    .map(|_| Reply::Empty)?,
                Call::RemovePodSandbox(r) => client
                    .remove_pod_sandbox(ctx, r)
                    .await
                    .map(|_| Reply::Empty)?,
                Call::CreateContainer(r) => {
                    Reply::CreateContainer(client.create_container(ctx, r).await?)
                }
                Call::PostCreateContainer(r) => client
                    .post_create_container(ctx, r)
                    .await
                    .map(|_| Reply::Empty)?,
                Call::StartContainer(r) => {
                    client.start_container(ctx, r).await.map(|_| Reply::Empty)?
                }
                Call::PostStartContainer(r) => client
                    .post_start_container(ctx, r)
                    .await
                    .map(|_| Reply::Empty)?,
                Call::UpdateContainer(r) => {
                    Reply::UpdateContainer(client.update_container(ctx, r).await?)
                }
                Call::PostUpdateContainer(r) => client
                    .post_update_container(ctx, r)
                    .await
                    .map(|_| Reply::Empty)?,
                Call::StopContainer(r) => {
                    Reply::StopContainer(client.stop_container(ctx, r).await?)
                }
                Call::RemoveContainer(r) => client
                    .remove_container(ctx, r)
                    .await
                    .map(|_| Reply::Empty)?,
            })
        }
    }
}
