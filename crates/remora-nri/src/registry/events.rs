//! One call per NRI event, and the one way every event reaches the plugins.
//!
//! The thirteen events differ only in a few facts: their request and plugin RPC, whether a
//! plugin's error status fails the runtime's call, whether the plugins' answers are kept
//! (the adjustments and updates of CreateContainer, UpdateContainer and StopContainer),
//! which objects the request carries, and whether NRI falls back to the deprecated
//! StateChange for a plugin that answers UNIMPLEMENTED. Those facts are one table (the
//! `events!` rows below, one [`Event`] impl each); [`Registry::dispatch`] calls the plugins
//! for any event the same way: in order, one call at a time per plugin, each within the
//! request timeout, a fatal failure removing the plugin. The public methods only build the
//! request from the runtime's objects.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use protobuf::{Enum as _, MessageField};
use slog::warn;
use tokio::time::Instant;
use ttrpc::context::Context;

use super::call::{bounded, context_until, CallError};
use super::{lock, HookError, Plugin, Registry};
use crate::api;

impl Registry {
    /// RunPodSandbox: a plugin's error fails it.
    pub async fn run_pod_sandbox(&self, pod: &api::PodSandbox) -> Result<(), HookError> {
        let req = api::RunPodSandboxRequest::for_pod(pod);
        self.dispatch(req).await.map(drop)
    }

    /// UpdatePodSandbox: a plugin's error fails it (as NRI's adaptation and containerd do).
    pub async fn update_pod_sandbox(
        &self,
        pod: &api::PodSandbox,
        overhead: Option<&api::LinuxResources>,
        resources: Option<&api::LinuxResources>,
    ) -> Result<(), HookError> {
        let mut req = api::UpdatePodSandboxRequest::for_pod(pod);
        req.overhead_linux_resources = overhead.cloned().into();
        req.linux_resources = resources.cloned().into();
        self.dispatch(req).await.map(drop)
    }

    /// PostUpdatePodSandbox; plugin errors are logged.
    pub async fn post_update_pod_sandbox(&self, pod: &api::PodSandbox) {
        self.notify(api::PostUpdatePodSandboxRequest::for_pod(pod))
            .await;
    }

    /// StopPodSandbox; plugin errors are logged.
    pub async fn stop_pod_sandbox(&self, pod: &api::PodSandbox) {
        self.notify(api::StopPodSandboxRequest::for_pod(pod)).await;
    }

    /// RemovePodSandbox; plugin errors are logged.
    pub async fn remove_pod_sandbox(&self, pod: &api::PodSandbox) {
        self.notify(api::RemovePodSandboxRequest::for_pod(pod))
            .await;
    }

    /// CreateContainer: each subscribed plugin's response, in call order; a plugin's error
    /// fails it.
    pub async fn create_container(
        &self,
        pod: &api::PodSandbox,
        container: &api::Container,
    ) -> Result<Vec<(String, api::CreateContainerResponse)>, HookError> {
        let req = api::CreateContainerRequest::for_container(pod, container);
        self.dispatch(req).await
    }

    /// PostCreateContainer; plugin errors are logged.
    pub async fn post_create_container(&self, pod: &api::PodSandbox, container: &api::Container) {
        let req = api::PostCreateContainerRequest::for_container(pod, container);
        self.notify(req).await;
    }

    /// StartContainer: a plugin's error fails it.
    pub async fn start_container(
        &self,
        pod: &api::PodSandbox,
        container: &api::Container,
    ) -> Result<(), HookError> {
        let req = api::StartContainerRequest::for_container(pod, container);
        self.dispatch(req).await.map(drop)
    }

    /// PostStartContainer; plugin errors are logged.
    pub async fn post_start_container(&self, pod: &api::PodSandbox, container: &api::Container) {
        let req = api::PostStartContainerRequest::for_container(pod, container);
        self.notify(req).await;
    }

    /// UpdateContainer: each subscribed plugin's response, in call order; a plugin's error
    /// fails it.
    pub async fn update_container(
        &self,
        pod: &api::PodSandbox,
        container: &api::Container,
        resources: &api::LinuxResources,
    ) -> Result<Vec<(String, api::UpdateContainerResponse)>, HookError> {
        let mut req = api::UpdateContainerRequest::for_container(pod, container);
        req.linux_resources = Some(resources.clone()).into();
        self.dispatch(req).await
    }

    /// PostUpdateContainer; plugin errors are logged.
    pub async fn post_update_container(&self, pod: &api::PodSandbox, container: &api::Container) {
        let req = api::PostUpdateContainerRequest::for_container(pod, container);
        self.notify(req).await;
    }

    /// StopContainer: each subscribed plugin's response, in call order; plugin errors are
    /// logged.
    pub async fn stop_container(
        &self,
        pod: &api::PodSandbox,
        container: &api::Container,
    ) -> Vec<(String, api::StopContainerResponse)> {
        let req = api::StopContainerRequest::for_container(pod, container);
        self.notify(req).await
    }

    /// RemoveContainer; plugin errors are logged.
    pub async fn remove_container(&self, pod: &api::PodSandbox, container: &api::Container) {
        let req = api::RemoveContainerRequest::for_container(pod, container);
        self.notify(req).await;
    }

    /// Dispatches an event whose plugin errors are only logged.
    async fn notify<E: Event>(&self, call: E) -> Vec<(String, E::Reply)> {
        // Checked when this is compiled for `E`: only such events come here.
        const { assert!(!E::FAILS_ON_ERROR) };
        // An event that does not fail on error never returns Err: `dispatch` logs instead.
        self.dispatch(call).await.unwrap_or_default()
    }
    /// Calls the active plugins subscribed to `call`'s event, in order.
    async fn dispatch<E: Event>(&self, call: E) -> Result<Vec<(String, E::Reply)>, HookError> {
        let event = E::EVENT;
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
                    if E::FAILS_ON_ERROR {
                        return Err(HookError {
                            plugin: plugin.name.clone(),
                            event,
                            code: ttrpc::Code::UNAVAILABLE,
                            message: format!("the plugin was dropped: {why}"),
                        });
                    }
                }
                Err(CallError::Status(status)) if E::FAILS_ON_ERROR => {
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
    async fn call_plugin<E: Event>(
        &self,
        plugin: &Plugin,
        call: &E,
    ) -> Result<E::Reply, CallError> {
        let deadline = Instant::now() + self.config.request_timeout;
        let Ok(_turn) = tokio::time::timeout_at(deadline, plugin.turn.lock()).await else {
            return Err(CallError::Fatal(
                "no answer within the request timeout (an earlier call to it was pending)".into(),
            ));
        };
        match bounded(
            deadline,
            call.invoke(&plugin.client, context_until(deadline)),
        )
        .await
        {
            Err(CallError::Status(status)) if status.code() == ttrpc::Code::UNIMPLEMENTED => {
                let Some(change) = call.state_change() else {
                    return Err(CallError::Status(status));
                };
                if !plugin.warned_state_change.swap(true, Ordering::Relaxed) {
                    warn!(plugin.log, "NRI: plugin uses the deprecated StateChange";
                        "event" => ?E::EVENT);
                }
                bounded(
                    deadline,
                    plugin.client.state_change(context_until(deadline), &change),
                )
                .await
                .map(|_| E::Reply::default())
            }
            other => other,
        }
    }
}

/// One NRI event's request: the facts about the event that [`Registry::dispatch`] needs.
/// Implemented by the `events!` table only.
trait Event: Send + Sync {
    /// The event.
    const EVENT: api::Event;
    /// Whether a plugin's error status fails the runtime's call.
    const FAILS_ON_ERROR: bool;
    /// What is kept of a plugin's answer: its response for the events that return
    /// adjustments or updates, nothing for the others (also what a StateChange answer gives).
    type Reply: Default + Send;

    /// The plugin RPC for this event, with the ttrpc context `ctx`.
    fn invoke<'a>(
        &'a self,
        client: &'a api::PluginClient,
        ctx: Context,
    ) -> impl Future<Output = ttrpc::Result<Self::Reply>> + Send + 'a;

    /// The deprecated StateChange for this event, for the events NRI falls back for
    /// (pkg/adaptation/plugin_type.go): those that return nothing, except UpdatePodSandbox.
    fn state_change(&self) -> Option<api::StateChangeEvent>;
}

/// Implements [`Event`] for each row, and the request's constructor from the objects it
/// carries (`for_pod`, or `for_container` for a pod and a container).
macro_rules! events {
    (@fails fail) => { true };
    (@fails log) => { false };
    (@reply none) => { () };
    (@reply $response:ident) => { api::$response };
    (@keep none) => { drop };
    (@keep $response:ident) => { std::convert::identity };
    (@state_change $req:ident, $objects:ident, none) => { None };
    (@state_change $req:ident, pod, state_change) => {
        Some(state_change_event(Self::EVENT, &$req.pod, None))
    };
    (@state_change $req:ident, container, state_change) => {
        Some(state_change_event(Self::EVENT, &$req.pod, Some(&$req.container)))
    };
    (@new $request:ident, pod) => {
        impl api::$request {
            fn for_pod(pod: &api::PodSandbox) -> Self {
                let mut req = Self::new();
                req.pod = Some(pod.clone()).into();
                req
            }
        }
    };
    (@new $request:ident, container) => {
        impl api::$request {
            fn for_container(pod: &api::PodSandbox, container: &api::Container) -> Self {
                let mut req = Self::new();
                req.pod = Some(pod.clone()).into();
                req.container = Some(container.clone()).into();
                req
            }
        }
    };
    ($($request:ident: $rpc:ident, $event:ident, $on_error:ident, $reply:ident, $objects:ident,
        $fallback:ident;)*) => {$(
        impl Event for api::$request {
            const EVENT: api::Event = api::Event::$event;
            const FAILS_ON_ERROR: bool = events!(@fails $on_error);
            type Reply = events!(@reply $reply);

            fn invoke<'a>(
                &'a self,
                client: &'a api::PluginClient,
                ctx: Context,
            ) -> impl Future<Output = ttrpc::Result<Self::Reply>> + Send + 'a {
                async move { client.$rpc(ctx, self).await.map(events!(@keep $reply)) }
            }

            fn state_change(&self) -> Option<api::StateChangeEvent> {
                events!(@state_change self, $objects, $fallback)
            }
        }

        events!(@new $request, $objects);
    )*};
}

// On error: `fail` fails the runtime's call, `log` logs and goes on. Reply: the response kept,
// or `none`. Objects: `pod`, or `container` (a pod and a container). Fallback: `state_change`
// for the events NRI sends StateChange for when the RPC is unimplemented, else `none`.
events! {
    // request:                  plugin RPC,              event,                   on error, reply,                   objects,   fallback;
    RunPodSandboxRequest:        run_pod_sandbox,         RUN_POD_SANDBOX,         fail,     none,                    pod,       state_change;
    UpdatePodSandboxRequest:     update_pod_sandbox,      UPDATE_POD_SANDBOX,      fail,     none,                    pod,       none;
    PostUpdatePodSandboxRequest: post_update_pod_sandbox, POST_UPDATE_POD_SANDBOX, log,      none,                    pod,       state_change;
    StopPodSandboxRequest:       stop_pod_sandbox,        STOP_POD_SANDBOX,        log,      none,                    pod,       state_change;
    RemovePodSandboxRequest:     remove_pod_sandbox,      REMOVE_POD_SANDBOX,      log,      none,                    pod,       state_change;
    CreateContainerRequest:      create_container,        CREATE_CONTAINER,        fail,     CreateContainerResponse, container, none;
    PostCreateContainerRequest:  post_create_container,   POST_CREATE_CONTAINER,   log,      none,                    container, state_change;
    StartContainerRequest:       start_container,         START_CONTAINER,         fail,     none,                    container, state_change;
    PostStartContainerRequest:   post_start_container,    POST_START_CONTAINER,    log,      none,                    container, state_change;
    UpdateContainerRequest:      update_container,        UPDATE_CONTAINER,        fail,     UpdateContainerResponse, container, none;
    PostUpdateContainerRequest:  post_update_container,   POST_UPDATE_CONTAINER,   log,      none,                    container, state_change;
    StopContainerRequest:        stop_container,          STOP_CONTAINER,          log,      StopContainerResponse,   container, none;
    RemoveContainerRequest:      remove_container,        REMOVE_CONTAINER,        log,      none,                    container, state_change;
}

/// The StateChange for `event` on `pod` (and `container`, for a container's event).
fn state_change_event(
    event: api::Event,
    pod: &MessageField<api::PodSandbox>,
    container: Option<&MessageField<api::Container>>,
) -> api::StateChangeEvent {
    let mut change = api::StateChangeEvent::new();
    change.event = event.into();
    change.pod = pod.clone();
    if let Some(container) = container {
        change.container = container.clone();
    }
    change
}

/// An event's bit in a plugin's mask.
fn event_bit(event: api::Event) -> u32 {
    match event.value() {
        e @ 1..=31 => 1 << (e - 1),
        _ => 0,
    }
}
