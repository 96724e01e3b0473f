//! A real NRI plugin for the tests, in Rust: [`TestPlugin`] connects to a runtime's NRI socket
//! as an external plugin does (NRI's Go `stub.WithSocketPath`), registers, is configured and
//! synchronized, then records every event it is sent and answers each as its [`Behaviour`]
//! says: normally, with an error, not at all until released, or (CreateContainer) with an
//! adjustment.
//!
//! The protocol is remora-nri's own (its mux and generated ttrpc services), so the tests at the
//! bottom check the plugin against the real registry in-process before any daemon test relies
//! on it; they need no test bed.
//!
//! # When the plugin is "ready"
//!
//! [`TestPlugin::connect`] returns once the plugin has answered Synchronize. The runtime makes
//! it active only after it has that answer, so for a moment the plugin is ready but not yet
//! called. That moment is invisible to a CRI call that creates an object: it holds the
//! registry's sync block (the read side of the lock a registration holds, as its write side,
//! until the plugin is active), so it waits for the activation. A test driving only other
//! events (stop, remove) right after `connect` should wait for the runtime's side, as the
//! tests here do with `Registry::watch_plugins`.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use futures_util::stream::{self, StreamExt as _};
use protobuf::Enum as _;
use remora_nri::api;
use remora_nri::mux::{Conn, Mux, OpenError, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};
use remora_nri::registry::NRI_VERSION;
use tokio::net::UnixStream;
use tokio::sync::watch;
use ttrpc::asynchronous::transport::{Listener, Socket};
use ttrpc::asynchronous::{Client, Server, TtrpcContext};

/// How long [`TestPlugin::connect`] waits for the plugin to be synchronized: more than NRI's
/// default registration and request timeouts together.
pub const READY_LIMIT: Duration = Duration::from_secs(10);

/// The NRI events a plugin is sent, one per `Plugin` RPC that carries a pod or container.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    RunPodSandbox,
    StopPodSandbox,
    RemovePodSandbox,
    UpdatePodSandbox,
    PostUpdatePodSandbox,
    CreateContainer,
    PostCreateContainer,
    StartContainer,
    PostStartContainer,
    UpdateContainer,
    PostUpdateContainer,
    StopContainer,
    RemoveContainer,
}

impl EventKind {
    /// The protocol's event: its value picks the bit in Configure's mask.
    pub fn api(self) -> api::Event {
        use api::Event as E;
        match self {
            EventKind::RunPodSandbox => E::RUN_POD_SANDBOX,
            EventKind::StopPodSandbox => E::STOP_POD_SANDBOX,
            EventKind::RemovePodSandbox => E::REMOVE_POD_SANDBOX,
            EventKind::UpdatePodSandbox => E::UPDATE_POD_SANDBOX,
            EventKind::PostUpdatePodSandbox => E::POST_UPDATE_POD_SANDBOX,
            EventKind::CreateContainer => E::CREATE_CONTAINER,
            EventKind::PostCreateContainer => E::POST_CREATE_CONTAINER,
            EventKind::StartContainer => E::START_CONTAINER,
            EventKind::PostStartContainer => E::POST_START_CONTAINER,
            EventKind::UpdateContainer => E::UPDATE_CONTAINER,
            EventKind::PostUpdateContainer => E::POST_UPDATE_CONTAINER,
            EventKind::StopContainer => E::STOP_CONTAINER,
            EventKind::RemoveContainer => E::REMOVE_CONTAINER,
        }
    }

    /// The kind of a protocol event, for StateChange; none for the events that are not sent
    /// as themselves (UNKNOWN, VALIDATE_CONTAINER_ADJUSTMENT, LAST).
    pub fn from_api(event: api::Event) -> Option<EventKind> {
        use api::Event as E;
        Some(match event {
            E::RUN_POD_SANDBOX => EventKind::RunPodSandbox,
            E::STOP_POD_SANDBOX => EventKind::StopPodSandbox,
            E::REMOVE_POD_SANDBOX => EventKind::RemovePodSandbox,
            E::UPDATE_POD_SANDBOX => EventKind::UpdatePodSandbox,
            E::POST_UPDATE_POD_SANDBOX => EventKind::PostUpdatePodSandbox,
            E::CREATE_CONTAINER => EventKind::CreateContainer,
            E::POST_CREATE_CONTAINER => EventKind::PostCreateContainer,
            E::START_CONTAINER => EventKind::StartContainer,
            E::POST_START_CONTAINER => EventKind::PostStartContainer,
            E::UPDATE_CONTAINER => EventKind::UpdateContainer,
            E::POST_UPDATE_CONTAINER => EventKind::PostUpdateContainer,
            E::STOP_CONTAINER => EventKind::StopContainer,
            E::REMOVE_CONTAINER => EventKind::RemoveContainer,
            E::UNKNOWN | E::VALIDATE_CONTAINER_ADJUSTMENT | E::LAST => return None,
        })
    }
}

/// Configure's event mask for `kinds`: event e is bit e-1.
pub fn event_mask(kinds: &[EventKind]) -> i32 {
    kinds.iter().fold(0, |mask, k| mask | bit(k.api()))
}

/// The mask of every event NRI v0.12.2 defines (its `ValidEvents`: events 1 to LAST-1, so
/// ValidateContainerAdjustment too), what a plugin subscribing to everything sends.
pub fn all_events() -> i32 {
    api::Event::VALUES
        .iter()
        .filter(|e| e.value() > 0 && e.value() < api::Event::LAST.value())
        .fold(0, |mask, e| mask | bit(*e))
}

fn bit(event: api::Event) -> i32 {
    1 << (event.value() - 1)
}

/// One event the plugin was sent, as it arrived.
#[derive(Clone, Debug)]
pub struct Event {
    pub kind: EventKind,
    pub pod_id: String,
    pub pod_name: String,
    pub pod_namespace: String,
    pub pod_uid: String,
    /// None for the pod events.
    pub container_id: Option<String>,
    pub container_name: Option<String>,
    /// The container's environment (`KEY=value`), for CreateContainer; empty otherwise.
    pub env: Vec<String>,
    /// Sent as the deprecated StateChange, the runtime's fallback after an UNIMPLEMENTED.
    pub via_state_change: bool,
    pub at: Instant,
}

impl Event {
    fn new(
        kind: EventKind,
        pod: &api::PodSandbox,
        container: Option<&api::Container>,
        via_state_change: bool,
    ) -> Event {
        Event {
            kind,
            pod_id: pod.id.clone(),
            pod_name: pod.name.clone(),
            pod_namespace: pod.namespace.clone(),
            pod_uid: pod.uid.clone(),
            container_id: container.map(|c| c.id.clone()),
            container_name: container.map(|c| c.name.clone()),
            env: match container {
                Some(c) if kind == EventKind::CreateContainer => c.env.clone(),
                _ => Vec::new(),
            },
            via_state_change,
            at: Instant::now(),
        }
    }
}

/// How the plugin answers one kind of event. The event is recorded whatever the answer.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    /// Answers normally (CreateContainer: with the adjustment, if one is set).
    Ok,
    /// Fails the next call with status UNKNOWN and this message (what a Go plugin's plain
    /// error becomes), then answers normally.
    FailOnce(String),
    /// Fails every call with status UNKNOWN and this message.
    Fail(String),
    /// Does not answer until [`TestPlugin::release`] (then answers normally) or until the
    /// plugin is dropped.
    Hang,
    /// Answers UNIMPLEMENTED, as a stub older than the event's RPC: the runtime falls back to
    /// StateChange where NRI does.
    Unimplemented,
}

/// What the plugin subscribes to and how it answers; changeable after connecting through
/// [`TestPlugin::set_answer`] and [`TestPlugin::set_adjustment`].
#[derive(Clone, Debug)]
pub struct Behaviour {
    events: i32,
    answers: HashMap<EventKind, Answer>,
    adjustment: Option<api::ContainerAdjustment>,
    block_synchronize: bool,
}

impl Default for Behaviour {
    fn default() -> Self {
        Behaviour {
            events: all_events(),
            answers: HashMap::new(),
            adjustment: None,
            block_synchronize: false,
        }
    }
}

impl Behaviour {
    /// Every event, each answered normally, no adjustment.
    pub fn new() -> Behaviour {
        Behaviour::default()
    }

    /// Subscribes to `kinds` only.
    pub fn subscribe(mut self, kinds: &[EventKind]) -> Behaviour {
        self.events = event_mask(kinds);
        self
    }

    /// Answers Configure with this raw mask (0 means "every event" to NRI; bits past the
    /// defined events are refused).
    pub fn raw_event_mask(mut self, mask: i32) -> Behaviour {
        self.events = mask;
        self
    }

    /// Answers `kind` as `answer`.
    pub fn answer(mut self, kind: EventKind, answer: Answer) -> Behaviour {
        self.answers.insert(kind, answer);
        self
    }

    /// Answers CreateContainer with this adjustment.
    pub fn adjust(mut self, adjustment: api::ContainerAdjustment) -> Behaviour {
        self.adjustment = Some(adjustment);
        self
    }

    /// Holds the answer to the last Synchronize message until [`TestPlugin::release`], as a
    /// slow late plugin: [`TestPlugin::connect`] then returns once that message arrived, and
    /// [`TestPlugin::wait_synchronized`] waits for the rest.
    pub fn block_synchronize(mut self) -> Behaviour {
        self.block_synchronize = true;
        self
    }
}

/// An environment variable for an adjustment.
pub fn env(key: &str, value: &str) -> api::KeyValue {
    let mut kv = api::KeyValue::new();
    kv.key = key.into();
    kv.value = value.into();
    kv
}

/// A bind mount for an adjustment (options such as `["rbind", "ro"]`).
pub fn bind_mount(source: &str, destination: &str, options: &[&str]) -> api::Mount {
    let mut m = api::Mount::new();
    m.source = source.into();
    m.destination = destination.into();
    m.type_ = "bind".into();
    m.options = options.iter().map(|o| o.to_string()).collect();
    m
}

/// Why the plugin did not get to be ready, or a call of its own failed.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("connecting to {path}: {source}")]
    Connect { path: PathBuf, source: io::Error },
    #[error("opening a multiplexed connection: {0}")]
    Open(#[from] OpenError),
    #[error("serving the plugin service: {0}")]
    Serve(ttrpc::Error),
    #[error("RegisterPlugin failed: {0}")]
    Register(ttrpc::Error),
    #[error("the runtime closed the connection before the plugin was {waiting_for} ({progress})")]
    Closed {
        waiting_for: &'static str,
        progress: String,
    },
    #[error("the plugin was not {waiting_for} within {limit:?} ({progress})")]
    Timeout {
        waiting_for: &'static str,
        limit: Duration,
        progress: String,
    },
    #[error("UpdateContainers failed: {0}")]
    UpdateContainers(ttrpc::Error),
}

/// Everything the plugin saw; watched, so that waits need no polling.
#[derive(Clone, Debug, Default)]
struct Record {
    configured: Option<api::ConfigureRequest>,
    sync_messages: usize,
    synced_pods: Vec<String>,
    synced_containers: Vec<String>,
    /// The last Synchronize message (`more` false) arrived.
    sync_received: bool,
    /// The last Synchronize message was answered (the answer is being sent).
    synchronized: bool,
    shutdown: bool,
    /// The trunk closed, whoever closed it.
    closed: bool,
    events: Vec<Event>,
}

impl Record {
    fn progress(&self) -> String {
        format!(
            "configured: {}, Synchronize messages: {}, events: {}",
            self.configured.is_some(),
            self.sync_messages,
            self.events.len()
        )
    }
}

/// What the plugin service and the test share.
struct Shared {
    behaviour: Mutex<Behaviour>,
    record: watch::Sender<Record>,
    /// Bumped by [`TestPlugin::release`]; its sender is the [`TestPlugin`]'s, so a hung call
    /// also ends when the plugin is dropped.
    released: watch::Receiver<u64>,
}

impl Shared {
    /// Held only in short sections that do not panic, so a poisoned lock is still consistent.
    fn behaviour(&self) -> MutexGuard<'_, Behaviour> {
        self.behaviour
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The answer for `kind`; a FailOnce is used up.
    fn take_answer(&self, kind: EventKind) -> Answer {
        let mut behaviour = self.behaviour();
        let answer = behaviour.answers.get(&kind).cloned().unwrap_or(Answer::Ok);
        if let Answer::FailOnce(_) = answer {
            behaviour.answers.insert(kind, Answer::Ok);
        }
        answer
    }

    /// The release generation now: a call that hangs waits for a later one. Taken before the
    /// call is recorded, so a test that saw the record and then released cannot be missed.
    fn generation(&self) -> u64 {
        *self.released.borrow()
    }

    /// Waits for a release after generation `seen`; fails if the plugin is dropped first.
    async fn hold(&self, seen: u64) -> ttrpc::Result<()> {
        let mut released = self.released.clone();
        let result = released.wait_for(|g| *g != seen).await.map(drop);
        result.map_err(|_| status(ttrpc::Code::UNAVAILABLE, "the test plugin was dropped"))
    }

    /// Records an event and answers it as told.
    async fn event(
        &self,
        kind: EventKind,
        pod: &api::PodSandbox,
        container: Option<&api::Container>,
    ) -> ttrpc::Result<()> {
        let seen = self.generation();
        let answer = self.take_answer(kind);
        let event = Event::new(kind, pod, container, false);
        self.record.send_modify(|r| r.events.push(event));
        match answer {
            Answer::Ok => Ok(()),
            Answer::FailOnce(msg) | Answer::Fail(msg) => Err(status(ttrpc::Code::UNKNOWN, msg)),
            Answer::Hang => self.hold(seen).await,
            Answer::Unimplemented => Err(status(
                ttrpc::Code::UNIMPLEMENTED,
                format!("{kind:?} not implemented by the test plugin"),
            )),
        }
    }
}

fn status(code: ttrpc::Code, message: impl ToString) -> ttrpc::Error {
    ttrpc::Error::RpcStatus(ttrpc::get_status(code, message))
}

/// The plugin's side of NRI's `Plugin` service.
struct PluginService(Arc<Shared>);

#[async_trait::async_trait]
impl api::Plugin for PluginService {
    async fn configure(
        &self,
        _ctx: &TtrpcContext,
        req: api::ConfigureRequest,
    ) -> ttrpc::Result<api::ConfigureResponse> {
        let mut resp = api::ConfigureResponse::new();
        resp.events = self.0.behaviour().events;
        self.0.record.send_modify(|r| r.configured = Some(req));
        Ok(resp)
    }

    /// Records the objects of each message; answers `more` with `more`, as NRI's stub does
    /// while it collects a split snapshot.
    async fn synchronize(
        &self,
        _ctx: &TtrpcContext,
        req: api::SynchronizeRequest,
    ) -> ttrpc::Result<api::SynchronizeResponse> {
        let seen = self.0.generation();
        let last = !req.more;
        let block = last && self.0.behaviour().block_synchronize;
        self.0.record.send_modify(|r| {
            r.sync_messages += 1;
            r.synced_pods.extend(req.pods.iter().map(|p| p.id.clone()));
            r.synced_containers
                .extend(req.containers.iter().map(|c| c.id.clone()));
            r.sync_received |= last;
        });
        if block {
            self.0.hold(seen).await?;
        }
        if last {
            self.0.record.send_modify(|r| r.synchronized = true);
        }
        let mut resp = api::SynchronizeResponse::new();
        resp.more = req.more;
        Ok(resp)
    }

    async fn shutdown(&self, _ctx: &TtrpcContext, _req: api::Empty) -> ttrpc::Result<api::Empty> {
        self.0.record.send_modify(|r| r.shutdown = true);
        Ok(api::Empty::new())
    }

    async fn run_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: api::RunPodSandboxRequest,
    ) -> ttrpc::Result<api::RunPodSandboxResponse> {
        self.0
            .event(EventKind::RunPodSandbox, &req.pod, None)
            .await?;
        Ok(api::RunPodSandboxResponse::new())
    }

    async fn update_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: api::UpdatePodSandboxRequest,
    ) -> ttrpc::Result<api::UpdatePodSandboxResponse> {
        self.0
            .event(EventKind::UpdatePodSandbox, &req.pod, None)
            .await?;
        Ok(api::UpdatePodSandboxResponse::new())
    }

    async fn post_update_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: api::PostUpdatePodSandboxRequest,
    ) -> ttrpc::Result<api::PostUpdatePodSandboxResponse> {
        self.0
            .event(EventKind::PostUpdatePodSandbox, &req.pod, None)
            .await?;
        Ok(api::PostUpdatePodSandboxResponse::new())
    }

    async fn stop_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: api::StopPodSandboxRequest,
    ) -> ttrpc::Result<api::StopPodSandboxResponse> {
        self.0
            .event(EventKind::StopPodSandbox, &req.pod, None)
            .await?;
        Ok(api::StopPodSandboxResponse::new())
    }

    async fn remove_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: api::RemovePodSandboxRequest,
    ) -> ttrpc::Result<api::RemovePodSandboxResponse> {
        self.0
            .event(EventKind::RemovePodSandbox, &req.pod, None)
            .await?;
        Ok(api::RemovePodSandboxResponse::new())
    }

    async fn create_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::CreateContainerRequest,
    ) -> ttrpc::Result<api::CreateContainerResponse> {
        self.0
            .event(EventKind::CreateContainer, &req.pod, Some(&*req.container))
            .await?;
        let mut resp = api::CreateContainerResponse::new();
        // Read after a hang, so an adjustment set before the release is the one sent.
        resp.adjust = self.0.behaviour().adjustment.clone().into();
        Ok(resp)
    }

    async fn post_create_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::PostCreateContainerRequest,
    ) -> ttrpc::Result<api::PostCreateContainerResponse> {
        self.0
            .event(
                EventKind::PostCreateContainer,
                &req.pod,
                Some(&*req.container),
            )
            .await?;
        Ok(api::PostCreateContainerResponse::new())
    }

    async fn start_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::StartContainerRequest,
    ) -> ttrpc::Result<api::StartContainerResponse> {
        self.0
            .event(EventKind::StartContainer, &req.pod, Some(&*req.container))
            .await?;
        Ok(api::StartContainerResponse::new())
    }

    async fn post_start_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::PostStartContainerRequest,
    ) -> ttrpc::Result<api::PostStartContainerResponse> {
        self.0
            .event(
                EventKind::PostStartContainer,
                &req.pod,
                Some(&*req.container),
            )
            .await?;
        Ok(api::PostStartContainerResponse::new())
    }

    /// No updates, no evictions.
    async fn update_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::UpdateContainerRequest,
    ) -> ttrpc::Result<api::UpdateContainerResponse> {
        self.0
            .event(EventKind::UpdateContainer, &req.pod, Some(&*req.container))
            .await?;
        Ok(api::UpdateContainerResponse::new())
    }

    async fn post_update_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::PostUpdateContainerRequest,
    ) -> ttrpc::Result<api::PostUpdateContainerResponse> {
        self.0
            .event(
                EventKind::PostUpdateContainer,
                &req.pod,
                Some(&*req.container),
            )
            .await?;
        Ok(api::PostUpdateContainerResponse::new())
    }

    /// No updates.
    async fn stop_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::StopContainerRequest,
    ) -> ttrpc::Result<api::StopContainerResponse> {
        self.0
            .event(EventKind::StopContainer, &req.pod, Some(&*req.container))
            .await?;
        Ok(api::StopContainerResponse::new())
    }

    async fn remove_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::RemoveContainerRequest,
    ) -> ttrpc::Result<api::RemoveContainerResponse> {
        self.0
            .event(EventKind::RemoveContainer, &req.pod, Some(&*req.container))
            .await?;
        Ok(api::RemoveContainerResponse::new())
    }

    /// Recorded as its event, marked `via_state_change`, and answered (not per the
    /// behaviour: the fallback only comes after the event's own RPC was answered).
    async fn state_change(
        &self,
        _ctx: &TtrpcContext,
        req: api::StateChangeEvent,
    ) -> ttrpc::Result<api::Empty> {
        if let Some(kind) = req.event.enum_value().ok().and_then(EventKind::from_api) {
            let event = Event::new(kind, &req.pod, req.container.as_ref(), true);
            self.0.record.send_modify(|r| r.events.push(event));
        }
        Ok(api::Empty::new())
    }

    /// Accepts every adjustment (a validator that rejects nothing). remora's registry does
    /// not send this yet; not recorded.
    async fn validate_container_adjustment(
        &self,
        _ctx: &TtrpcContext,
        _req: api::ValidateContainerAdjustmentRequest,
    ) -> ttrpc::Result<api::ValidateContainerAdjustmentResponse> {
        Ok(api::ValidateContainerAdjustmentResponse::new())
    }
}

/// A connected NRI plugin. Dropping it closes its connection, as [`TestPlugin::kill`] does.
pub struct TestPlugin {
    /// First, so that a drop closes the trunk before hung calls are let go: they cannot
    /// answer then, as a killed plugin's could not.
    mux: Mux,
    /// Sender of the release generation (see [`Shared::released`]).
    release: watch::Sender<u64>,
    shared: Arc<Shared>,
    name: String,
    runtime: api::RuntimeClient,
    /// Serves the Plugin service on conn 1 until the trunk closes.
    _server: Server,
}

impl TestPlugin {
    /// Dials `socket`, serves the Plugin service on conn 1, registers as `<idx>-<name>` on
    /// conn 2, answers Configure and Synchronize, and returns once Synchronize is answered
    /// (with [`Behaviour::block_synchronize`]: once its last message arrived). Errs if the
    /// runtime refuses the plugin or closes the connection first, or after [`READY_LIMIT`].
    pub async fn connect(
        socket: &Path,
        idx: &str,
        name: &str,
        behaviour: Behaviour,
    ) -> Result<TestPlugin, PluginError> {
        let started = Instant::now();
        let stream = UnixStream::connect(socket)
            .await
            .map_err(|source| PluginError::Connect {
                path: socket.to_path_buf(),
                source,
            })?;
        let mux = Mux::new(stream, None);
        let plugin_conn = mux.open(PLUGIN_SERVICE_CONN)?;
        let runtime_conn = mux.open(RUNTIME_SERVICE_CONN)?;

        let (release, released) = watch::channel(0);
        let block_synchronize = behaviour.block_synchronize;
        let shared = Arc::new(Shared {
            behaviour: Mutex::new(behaviour),
            record: watch::Sender::new(Record::default()),
            released,
        });
        let closed = mux.closed();
        let watched = Arc::downgrade(&shared);
        tokio::spawn(async move {
            closed.await;
            if let Some(shared) = watched.upgrade() {
                shared.record.send_modify(|r| r.closed = true);
            }
        });

        // One connection, then a stream that ends with the trunk, so the server's accept task
        // ends with the plugin (as the registry serves its side).
        let incoming = stream::iter([Ok(plugin_conn)])
            .chain(stream::once(mux.closed()).filter_map(|_| async { None::<io::Result<Conn>> }));
        let mut server = Server::new()
            .register_service(api::create_plugin(Arc::new(PluginService(shared.clone()))))
            .add_listener(Listener::new(incoming));
        server.start().await.map_err(PluginError::Serve)?;
        let runtime = api::RuntimeClient::new(Client::new(Socket::new(runtime_conn)));

        let plugin = TestPlugin {
            mux,
            release,
            shared,
            name: format!("{idx}-{name}"),
            runtime,
            _server: server,
        };
        let mut req = api::RegisterPluginRequest::new();
        req.plugin_idx = idx.into();
        req.plugin_name = name.into();
        req.NRI_version = NRI_VERSION.into();
        plugin
            .runtime
            .register_plugin(context(READY_LIMIT), &req)
            .await
            .map_err(PluginError::Register)?;

        let left = READY_LIMIT.saturating_sub(started.elapsed());
        if block_synchronize {
            plugin
                .wait_stage("sent its last Synchronize message", left, |r| {
                    r.sync_received
                })
                .await?;
        } else {
            plugin.wait_synchronized(left).await?;
        }
        Ok(plugin)
    }

    /// `<idx>-<name>`, as the runtime names the plugin.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Waits until the plugin answered the last Synchronize message (after a
    /// [`Behaviour::block_synchronize`] and its [`TestPlugin::release`]).
    pub async fn wait_synchronized(&self, limit: Duration) -> Result<(), PluginError> {
        self.wait_stage("synchronized", limit, |r| r.synchronized)
            .await
    }

    async fn wait_stage(
        &self,
        waiting_for: &'static str,
        limit: Duration,
        reached: impl Fn(&Record) -> bool,
    ) -> Result<(), PluginError> {
        let mut record = self.shared.record.subscribe();
        let waited = tokio::time::timeout(limit, async {
            let r = record.wait_for(|r| reached(r) || r.closed).await;
            r.map(|r| reached(&r))
        })
        .await;
        match waited {
            Ok(Ok(true)) => Ok(()),
            // Err: the sender is `self.shared`'s, so it cannot be gone; as closed anyway.
            Ok(_) => Err(PluginError::Closed {
                waiting_for,
                progress: self.progress(),
            }),
            Err(_) => Err(PluginError::Timeout {
                waiting_for,
                limit,
                progress: self.progress(),
            }),
        }
    }

    fn progress(&self) -> String {
        self.shared.record.borrow().progress()
    }

    /// The events received so far, in arrival order.
    pub fn events(&self) -> Vec<Event> {
        self.shared.record.borrow().events.clone()
    }

    /// The ids of the pods Synchronize sent, over all its messages.
    pub fn synced_pods(&self) -> Vec<String> {
        self.shared.record.borrow().synced_pods.clone()
    }

    /// The ids of the containers Synchronize sent, over all its messages.
    pub fn synced_containers(&self) -> Vec<String> {
        self.shared.record.borrow().synced_containers.clone()
    }

    /// How many Synchronize messages arrived.
    pub fn sync_messages(&self) -> usize {
        self.shared.record.borrow().sync_messages
    }

    /// The Configure request, once received.
    pub fn configured(&self) -> Option<api::ConfigureRequest> {
        self.shared.record.borrow().configured.clone()
    }

    /// Whether the runtime sent Shutdown.
    pub fn was_shut_down(&self) -> bool {
        self.shared.record.borrow().shutdown
    }

    /// Waits until the recorded events satisfy `pred`, and returns them. Panics, with the
    /// events seen, if `limit` passes or the connection closes first.
    pub async fn wait_for(
        &self,
        what: &str,
        limit: Duration,
        pred: impl Fn(&[Event]) -> bool,
    ) -> Vec<Event> {
        let mut record = self.shared.record.subscribe();
        let waited = tokio::time::timeout(limit, async {
            let r = record.wait_for(|r| pred(&r.events) || r.closed).await;
            r.map(|r| pred(&r.events))
        })
        .await;
        let why = match waited {
            Ok(Ok(true)) => return self.events(),
            Ok(_) => "the connection closed".to_string(),
            Err(_) => format!("{limit:?} passed"),
        };
        panic!(
            "NRI test plugin {}: {why} while waiting for {what}; events seen: {:#?}",
            self.name,
            self.events()
        );
    }

    /// Waits until the connection is closed (by the runtime, or [`TestPlugin::kill`]); panics
    /// after `limit`.
    pub async fn wait_closed(&self, limit: Duration) {
        let mut record = self.shared.record.subscribe();
        let waited = tokio::time::timeout(limit, async {
            record.wait_for(|r| r.closed).await.map(drop)
        })
        .await;
        assert!(
            matches!(waited, Ok(Ok(()))),
            "NRI test plugin {}: still connected after {limit:?}",
            self.name
        );
    }

    /// Changes how `kind` is answered from the next call on.
    pub fn set_answer(&self, kind: EventKind, answer: Answer) {
        self.shared.behaviour().answers.insert(kind, answer);
    }

    /// Changes CreateContainer's adjustment (None: no adjustment) from the next answer on.
    pub fn set_adjustment(&self, adjustment: Option<api::ContainerAdjustment>) {
        self.shared.behaviour().adjustment = adjustment;
    }

    /// Lets every call hanging now answer (a [`Answer::Hang`], a blocked Synchronize); later
    /// calls hang again as long as their answer says so.
    pub fn release(&self) {
        self.release.send_modify(|g| *g += 1);
    }

    /// Closes the connection abruptly, as when the plugin is killed in the middle of a call:
    /// nothing more is sent, hung calls never answer. The records stay readable.
    pub fn kill(&self) {
        self.mux.close();
    }

    /// Asks the runtime to update and evict containers (NRI's UpdateContainers, unsolicited);
    /// returns the updates the runtime reports as failed.
    pub async fn update_containers(
        &self,
        updates: Vec<api::ContainerUpdate>,
        evictions: Vec<api::ContainerEviction>,
    ) -> Result<Vec<api::ContainerUpdate>, PluginError> {
        let mut req = api::UpdateContainersRequest::new();
        req.update = updates;
        req.evict = evictions;
        let resp = self
            .runtime
            .update_containers(context(READY_LIMIT), &req)
            .await
            .map_err(PluginError::UpdateContainers)?;
        Ok(resp.failed)
    }
}

/// A ttrpc context with `timeout`.
fn context(timeout: Duration) -> ttrpc::context::Context {
    ttrpc::context::with_timeout(i64::try_from(timeout.as_nanos()).unwrap_or(i64::MAX))
}

// The plugin against remora's real registry, in process: what the daemon will host.

use remora_nri::registry::{Config, Registry, RuntimeHandle, SyncSource};

/// A bound on every wait, so that a wedged registry or plugin fails the test instead of hanging
/// it; never the thing under test.
const LIMIT: Duration = Duration::from_secs(10);

/// The runtime's objects for Synchronize: one pod, one container.
struct OnePod;

impl SyncSource for OnePod {
    fn snapshot(&self) -> (Vec<api::PodSandbox>, Vec<api::Container>) {
        (vec![pod("p0")], vec![container("c0", "p0")])
    }
}

/// Records the updates and evictions plugins ask for; fails none.
#[derive(Default)]
struct RecordingRuntime {
    updates: Mutex<Vec<(Vec<String>, Vec<String>)>>,
}

#[async_trait::async_trait]
impl RuntimeHandle for RecordingRuntime {
    async fn update_containers(
        &self,
        updates: Vec<api::ContainerUpdate>,
        evictions: Vec<api::ContainerEviction>,
    ) -> Vec<api::ContainerUpdate> {
        self.updates
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((
                updates.iter().map(|u| u.container_id.clone()).collect(),
                evictions.iter().map(|e| e.container_id.clone()).collect(),
            ));
        Vec::new()
    }
}

/// A registry on a socket of its own.
struct InProcess {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    registry: Arc<Registry>,
    runtime: Arc<RecordingRuntime>,
}

fn start_registry(request_timeout: Duration) -> InProcess {
    start_registry_with(Arc::new(OnePod), request_timeout)
}

fn start_registry_with(sync: Arc<dyn SyncSource>, request_timeout: Duration) -> InProcess {
    let dir = crate::harness::scratch();
    let socket = dir.path().join("nri").join("nri.sock");
    let mut config = Config::new(&socket, "remora", "test");
    config.request_timeout = request_timeout;
    let runtime = Arc::new(RecordingRuntime::default());
    let log = slog::Logger::root(slog::Discard, slog::o!());
    let registry = Registry::start(config, sync, runtime.clone(), log).expect("registry starts");
    InProcess {
        _dir: dir,
        socket,
        registry,
        runtime,
    }
}

impl InProcess {
    /// Waits until the registry calls `plugin` (see the module docs on readiness).
    async fn active(&self, plugin: &TestPlugin) {
        let mut active = self.registry.watch_plugins();
        tokio::time::timeout(
            LIMIT,
            active.wait_for(|names| names.iter().any(|n| n == plugin.name())),
        )
        .await
        .expect("the registry activates the plugin in time")
        .expect("the registry is alive");
    }
}

fn pod(id: &str) -> api::PodSandbox {
    let mut pod = api::PodSandbox::new();
    pod.id = id.into();
    pod.name = format!("{id}-name");
    pod.namespace = "nri-test".into();
    pod.uid = format!("{id}-uid");
    pod
}

fn container(id: &str, pod: &str) -> api::Container {
    let mut c = api::Container::new();
    c.id = id.into();
    c.pod_sandbox_id = pod.into();
    c.name = format!("{id}-name");
    c.env = vec!["PATH=/bin".into(), "GREETING=hello".into()];
    c
}

fn kinds(events: &[Event]) -> Vec<EventKind> {
    events.iter().map(|e| e.kind).collect()
}

#[tokio::test]
async fn synchronized_then_events_are_recorded_with_their_metadata() {
    // NRI v0.12.2's ValidEvents: events 1 to 14.
    assert_eq!(all_events(), 0x3fff);
    let bed = start_registry(Duration::from_secs(2));
    let plugin = TestPlugin::connect(&bed.socket, "10", "recorder", Behaviour::new())
        .await
        .expect("the plugin connects and is synchronized");
    assert_eq!(plugin.name(), "10-recorder");
    assert_eq!(plugin.synced_pods(), ["p0"]);
    assert_eq!(plugin.synced_containers(), ["c0"]);
    assert_eq!(plugin.sync_messages(), 1);
    let configured = plugin.configured().expect("configured before synchronized");
    assert_eq!(configured.runtime_name, "remora");
    assert_eq!(configured.request_timeout, 2000);
    // Active: the registry accepted the full mask.
    bed.active(&plugin).await;

    let before = Instant::now();
    {
        // As the daemon creates a pod: under a sync block.
        let _block = bed.registry.block_sync().await;
        bed.registry
            .run_pod_sandbox(&pod("p1"))
            .await
            .expect("RunPodSandbox");
    }
    let replies = bed
        .registry
        .create_container(&pod("p1"), &container("c1", "p1"))
        .await
        .expect("CreateContainer");
    assert_eq!(replies.len(), 1);
    assert!(replies[0].1.adjust.is_none(), "{replies:?}");
    bed.registry.stop_pod_sandbox(&pod("p1")).await;

    let events = plugin.events();
    assert_eq!(
        kinds(&events),
        [
            EventKind::RunPodSandbox,
            EventKind::CreateContainer,
            EventKind::StopPodSandbox
        ]
    );
    let run = &events[0];
    assert_eq!(
        (
            run.pod_id.as_str(),
            run.pod_name.as_str(),
            run.pod_namespace.as_str(),
            run.pod_uid.as_str()
        ),
        ("p1", "p1-name", "nri-test", "p1-uid")
    );
    assert_eq!(run.container_id, None);
    assert_eq!(run.container_name, None);
    assert!(run.env.is_empty());
    assert!(!run.via_state_change);
    let create = &events[1];
    assert_eq!(create.pod_id, "p1");
    assert_eq!(create.container_id.as_deref(), Some("c1"));
    assert_eq!(create.container_name.as_deref(), Some("c1-name"));
    assert_eq!(create.env, ["PATH=/bin", "GREETING=hello"]);
    assert!(before <= run.at && run.at <= create.at && create.at <= events[2].at);

    // The plugin's own UpdateContainers reaches the runtime.
    let mut update = api::ContainerUpdate::new();
    update.container_id = "c1".into();
    let mut evict = api::ContainerEviction::new();
    evict.container_id = "c0".into();
    let failed = plugin
        .update_containers(vec![update], vec![evict])
        .await
        .expect("UpdateContainers");
    assert!(failed.is_empty(), "{failed:?}");
    assert_eq!(
        *bed.runtime.updates.lock().unwrap(),
        [(vec!["c1".to_string()], vec!["c0".to_string()])]
    );

    // Stopping the registry sends Shutdown, then closes the connection.
    bed.registry.stop().await;
    assert!(plugin.was_shut_down());
    plugin.wait_closed(LIMIT).await;
}

/// A snapshot of many big containers.
struct BigSnapshot(Vec<api::Container>);

impl SyncSource for BigSnapshot {
    fn snapshot(&self) -> (Vec<api::PodSandbox>, Vec<api::Container>) {
        (vec![pod("p0")], self.0.clone())
    }
}

#[tokio::test]
async fn a_snapshot_bigger_than_a_message_is_synchronized_in_parts() {
    // 40 containers with 256 KiB of annotations each: about 10 MiB, over ttrpc's 4 MiB limit.
    let containers: Vec<api::Container> = (0..40)
        .map(|i| {
            let mut c = container(&format!("c{i}"), "p0");
            c.annotations.insert("big".into(), "x".repeat(256 << 10));
            c
        })
        .collect();
    let want: Vec<String> = containers.iter().map(|c| c.id.clone()).collect();
    let bed = start_registry_with(Arc::new(BigSnapshot(containers)), Duration::from_secs(5));
    let plugin = TestPlugin::connect(&bed.socket, "10", "big", Behaviour::new())
        .await
        .expect("connect");
    bed.active(&plugin).await;
    assert!(plugin.sync_messages() >= 3, "{}", plugin.sync_messages());
    assert_eq!(plugin.synced_pods(), ["p0"]);
    assert_eq!(plugin.synced_containers(), want);
}

#[tokio::test]
async fn every_event_reaches_the_plugin_as_its_kind() {
    use EventKind as K;
    let bed = start_registry(Duration::from_secs(2));
    let plugin = TestPlugin::connect(&bed.socket, "10", "all", Behaviour::new())
        .await
        .expect("connect");
    bed.active(&plugin).await;
    let (p, c) = (pod("p1"), container("c1", "p1"));
    let r = &bed.registry;
    r.run_pod_sandbox(&p).await.expect("RunPodSandbox");
    r.update_pod_sandbox(&p, None, None)
        .await
        .expect("UpdatePodSandbox");
    r.post_update_pod_sandbox(&p).await;
    r.create_container(&p, &c).await.expect("CreateContainer");
    r.post_create_container(&p, &c).await;
    r.start_container(&p, &c).await.expect("StartContainer");
    r.post_start_container(&p, &c).await;
    r.update_container(&p, &c, &api::LinuxResources::new())
        .await
        .expect("UpdateContainer");
    r.post_update_container(&p, &c).await;
    r.stop_container(&p, &c).await;
    r.remove_container(&p, &c).await;
    r.stop_pod_sandbox(&p).await;
    r.remove_pod_sandbox(&p).await;

    let want = [
        K::RunPodSandbox,
        K::UpdatePodSandbox,
        K::PostUpdatePodSandbox,
        K::CreateContainer,
        K::PostCreateContainer,
        K::StartContainer,
        K::PostStartContainer,
        K::UpdateContainer,
        K::PostUpdateContainer,
        K::StopContainer,
        K::RemoveContainer,
        K::StopPodSandbox,
        K::RemovePodSandbox,
    ];
    let events = plugin.events();
    assert_eq!(kinds(&events), want);
    for e in &events {
        assert_eq!(e.pod_id, "p1", "{e:?}");
        let pod_event = matches!(
            e.kind,
            K::RunPodSandbox
                | K::UpdatePodSandbox
                | K::PostUpdatePodSandbox
                | K::StopPodSandbox
                | K::RemovePodSandbox
        );
        let want_container = (!pod_event).then(|| "c1".to_string());
        assert_eq!(e.container_id, want_container, "{e:?}");
        assert_eq!(EventKind::from_api(e.kind.api()), Some(e.kind));
    }
    // One bit each, all within NRI's mask.
    assert_eq!(event_mask(&want).count_ones(), 13);
    assert_eq!(event_mask(&want) & !all_events(), 0);
}

#[tokio::test]
async fn a_failure_names_the_plugin_and_a_create_container_adjustment_comes_back() {
    let bed = start_registry(Duration::from_secs(2));
    let adjustment = api::ContainerAdjustment {
        env: vec![env("NRI_TEST", "adjusted")],
        mounts: vec![bind_mount("/srv/nri", "/data", &["rbind", "ro"])],
        ..Default::default()
    };
    let behaviour = Behaviour::new()
        .answer(
            EventKind::CreateContainer,
            Answer::FailOnce("no room for c1".into()),
        )
        .adjust(adjustment.clone());
    let plugin = TestPlugin::connect(&bed.socket, "10", "adjuster", behaviour)
        .await
        .expect("connect");
    bed.active(&plugin).await;
    let (p1, c1) = (pod("p1"), container("c1", "p1"));
    let create = || bed.registry.create_container(&p1, &c1);

    let err = create().await.expect_err("the plugin fails the first call");
    assert_eq!(err.plugin, plugin.name());
    assert_eq!(err.event, api::Event::CREATE_CONTAINER);
    assert_eq!(err.code, ttrpc::Code::UNKNOWN);
    assert_eq!(err.message, "no room for c1");
    assert!(err.to_string().contains("10-adjuster"), "{err}");

    let replies = create().await.expect("the retry succeeds");
    assert_eq!(replies.len(), 1);
    let (name, reply) = &replies[0];
    assert_eq!(name, plugin.name());
    assert_eq!(*reply.adjust, adjustment);
    assert_eq!(reply.adjust.env[0].key, "NRI_TEST");
    assert_eq!(reply.adjust.env[0].value, "adjusted");
    let mount = &reply.adjust.mounts[0];
    assert_eq!(
        (
            mount.source.as_str(),
            mount.destination.as_str(),
            mount.type_.as_str()
        ),
        ("/srv/nri", "/data", "bind")
    );
    assert_eq!(mount.options, ["rbind", "ro"]);

    // Changed after connecting: no adjustment, then a refusal every time. An error status does
    // not drop the plugin.
    plugin.set_adjustment(None);
    let replies = create().await.expect("answered");
    assert!(replies[0].1.adjust.is_none(), "{replies:?}");
    plugin.set_answer(EventKind::CreateContainer, Answer::Fail("never".into()));
    for _ in 0..2 {
        let err = create().await.expect_err("refused");
        assert_eq!(err.message, "never");
    }
    assert_eq!(bed.registry.plugins(), [plugin.name()]);
    assert_eq!(kinds(&plugin.events()), [EventKind::CreateContainer; 5]);
}

#[tokio::test]
async fn a_hanging_plugin_fails_the_call_after_the_request_timeout_and_is_dropped() {
    const REQUEST_TIMEOUT: Duration = Duration::from_millis(300);
    let bed = start_registry(REQUEST_TIMEOUT);
    let behaviour = Behaviour::new().answer(EventKind::RunPodSandbox, Answer::Hang);
    let plugin = TestPlugin::connect(&bed.socket, "10", "hang", behaviour)
        .await
        .expect("connect");
    bed.active(&plugin).await;

    let started = Instant::now();
    let err = tokio::time::timeout(LIMIT, bed.registry.run_pod_sandbox(&pod("p1")))
        .await
        .expect("bounded by the request timeout")
        .expect_err("the hung plugin fails RunPodSandbox");
    let took = started.elapsed();
    assert!(took >= REQUEST_TIMEOUT, "{took:?}");
    assert!(took < REQUEST_TIMEOUT * 10, "{took:?}");
    assert_eq!(err.plugin, plugin.name());
    assert_eq!(err.event, api::Event::RUN_POD_SANDBOX);
    assert_eq!(err.code, ttrpc::Code::UNAVAILABLE);
    assert!(bed.registry.plugins().is_empty());
    plugin.wait_closed(LIMIT).await;
    let events = plugin.events();
    assert_eq!(kinds(&events), [EventKind::RunPodSandbox]);
    assert_eq!(events[0].pod_id, "p1");
}

#[tokio::test]
async fn a_plugin_killed_in_the_middle_of_a_call_fails_it_at_once() {
    // Far longer than the test's bound: the failure must come from the closed connection.
    let bed = start_registry(Duration::from_secs(60));
    let behaviour = Behaviour::new().answer(EventKind::CreateContainer, Answer::Hang);
    let plugin = TestPlugin::connect(&bed.socket, "10", "doomed", behaviour)
        .await
        .expect("connect");
    bed.active(&plugin).await;

    let registry = bed.registry.clone();
    let call = tokio::spawn(async move {
        registry
            .create_container(&pod("p1"), &container("c1", "p1"))
            .await
    });
    plugin
        .wait_for("CreateContainer of c1", LIMIT, |events| {
            events
                .iter()
                .any(|e| e.container_id.as_deref() == Some("c1"))
        })
        .await;
    plugin.kill();
    let err = tokio::time::timeout(LIMIT, call)
        .await
        .expect("the call ends with the connection, not the request timeout")
        .expect("the call's task")
        .expect_err("a killed plugin fails CreateContainer");
    assert_eq!(err.plugin, plugin.name());
    assert_eq!(err.code, ttrpc::Code::UNAVAILABLE);
    assert!(bed.registry.plugins().is_empty());
    plugin.wait_closed(LIMIT).await;
}

#[tokio::test]
async fn a_late_plugin_blocks_creation_until_synchronized_and_released_calls_answer() {
    let bed = start_registry(Duration::from_secs(5));
    let behaviour = Behaviour::new()
        .block_synchronize()
        .answer(EventKind::StartContainer, Answer::Hang);
    let plugin = TestPlugin::connect(&bed.socket, "10", "late", behaviour)
        .await
        .expect("connect");
    // Synchronize arrived, unanswered: the plugin is not active, and the registration holds
    // the sync lock against object creation.
    assert_eq!(plugin.synced_pods(), ["p0"]);
    assert!(bed.registry.plugins().is_empty());
    let registry = bed.registry.clone();
    let run = tokio::spawn(async move {
        let _block = registry.block_sync().await;
        registry.run_pod_sandbox(&pod("p1")).await
    });
    plugin.release();
    plugin
        .wait_synchronized(LIMIT)
        .await
        .expect("synchronized once released");
    tokio::time::timeout(LIMIT, run)
        .await
        .expect("in time")
        .expect("the call's task")
        .expect("RunPodSandbox");
    // The pod created during the registration reached the plugin once, after its snapshot.
    assert_eq!(plugin.synced_pods(), ["p0"]);
    assert_eq!(kinds(&plugin.events()), [EventKind::RunPodSandbox]);

    let registry = bed.registry.clone();
    let start = tokio::spawn(async move {
        registry
            .start_container(&pod("p1"), &container("c1", "p1"))
            .await
    });
    plugin
        .wait_for("StartContainer", LIMIT, |events| {
            events.iter().any(|e| e.kind == EventKind::StartContainer)
        })
        .await;
    plugin.release();
    tokio::time::timeout(LIMIT, start)
        .await
        .expect("answered once released")
        .expect("the call's task")
        .expect("StartContainer");
    assert_eq!(bed.registry.plugins(), [plugin.name()]);
}

#[tokio::test]
async fn subscriptions_state_change_and_refused_plugins() {
    let bed = start_registry(Duration::from_secs(2));
    let behaviour = Behaviour::new()
        .subscribe(&[EventKind::StopPodSandbox, EventKind::RemovePodSandbox])
        .answer(
            EventKind::StopPodSandbox,
            Answer::Fail("stop refused".into()),
        )
        .answer(EventKind::RemovePodSandbox, Answer::Unimplemented);
    let plugin = TestPlugin::connect(&bed.socket, "20", "picky", behaviour)
        .await
        .expect("connect");
    bed.active(&plugin).await;

    bed.registry
        .run_pod_sandbox(&pod("p1"))
        .await
        .expect("not subscribed, so not called");
    // Errors of these events are only logged by the registry.
    bed.registry.stop_pod_sandbox(&pod("p1")).await;
    bed.registry.remove_pod_sandbox(&pod("p1")).await;
    let events = plugin.events();
    let seen: Vec<(EventKind, bool)> = events
        .iter()
        .map(|e| (e.kind, e.via_state_change))
        .collect();
    assert_eq!(
        seen,
        [
            (EventKind::StopPodSandbox, false),
            (EventKind::RemovePodSandbox, false),
            // The registry's fallback for the UNIMPLEMENTED RemovePodSandbox.
            (EventKind::RemovePodSandbox, true),
        ]
    );
    assert_eq!(events[2].pod_uid, "p1-uid");
    assert_eq!(events[2].container_id, None);
    assert_eq!(bed.registry.plugins(), [plugin.name()]);

    // Refusals: the same index and name again, a bad index, events NRI does not define, and
    // no socket.
    let err = TestPlugin::connect(&bed.socket, "20", "picky", Behaviour::new())
        .await
        .err()
        .expect("a duplicate is refused");
    // The registry answers RegisterPlugin, then closes; the close may beat the answer out.
    assert!(
        matches!(err, PluginError::Closed { .. } | PluginError::Register(_)),
        "{err}"
    );
    let err = TestPlugin::connect(&bed.socket, "2", "short-index", Behaviour::new())
        .await
        .err()
        .expect("a bad index is refused");
    assert!(matches!(err, PluginError::Register(_)), "{err}");
    let err = TestPlugin::connect(
        &bed.socket,
        "30",
        "future",
        Behaviour::new().raw_event_mask(1 << 20),
    )
    .await
    .err()
    .expect("an unknown event is refused");
    assert!(matches!(err, PluginError::Closed { .. }), "{err}");
    let err = TestPlugin::connect(
        &bed.socket.with_file_name("absent.sock"),
        "40",
        "nobody",
        Behaviour::new(),
    )
    .await
    .err()
    .expect("no socket");
    assert!(matches!(err, PluginError::Connect { .. }), "{err}");
    assert_eq!(bed.registry.plugins(), [plugin.name()]);
}
