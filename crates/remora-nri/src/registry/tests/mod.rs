//! The registry's tests, beside the files they test (`events`, `handshake`,
//! `runtime_service`, `socket` for `accept`'s socket, `launched_plugins` for `accept`'s and
//! `launch`'s launched plugins), with what they share: fake plugins on real sockets, a
//! recording runtime, and a harness around a started registry. This file also has the tests
//! of `mod.rs`'s active list and stop.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::time::Duration;

use futures::stream::{self, StreamExt as _};
use protobuf::{Enum as _, Message as _};
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use tokio::time::{timeout, Instant};
use ttrpc::asynchronous::transport::{Listener, Socket};
use ttrpc::asynchronous::{Client, Server, TtrpcContext};

use super::handshake::{sync_chunks, HandshakeError};
use super::runtime_service::status;
use super::*;
use crate::mux::{PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};

/// A bound on every wait: a wedged registry fails the test instead of hanging it.
const DEADLINE: Duration = Duration::from_secs(10);
/// Generous for in-process fakes, so that a loaded machine (the test command runs four
/// test threads on two cores) does not make a plugin that answers look silent.
const REGISTRATION_TIMEOUT: Duration = Duration::from_secs(2);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

fn discard() -> Logger {
    Logger::root(slog::Discard, o!())
}

/// What a fake plugin was sent, tagged with its name.
#[derive(Clone, Debug, PartialEq)]
enum Seen {
    Configured {
        runtime: String,
        request_timeout: i64,
        config: String,
    },
    Synced {
        pods: Vec<String>,
        containers: Vec<String>,
        more: bool,
    },
    Event(api::Event, String),
    StateChange(api::Event, String),
    Shutdown,
}

/// How a fake plugin answers events.
#[derive(Clone, Copy)]
enum Answer {
    Ok,
    Fail,
    Hang,
    Unimplemented,
    /// Never answers Synchronize; answers events.
    HangInSync,
    /// Answers events after yielding a while, counting the calls it is in at once
    /// ([`MAX_OVERLAP`]; one test uses it).
    Overlap,
}

static IN_FLIGHT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static MAX_OVERLAP: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A plugin that records what it is sent and answers events as told.
struct FakePlugin {
    name: String,
    events: i32,
    answer: Answer,
    seen: Sink,
}

/// Where a fake plugin records what it is sent: the test's channel, or, in a launched
/// child process ([`launched_plugin_child`]), a file, written before the plugin answers.
enum Sink {
    Channel(mpsc::UnboundedSender<(String, Seen)>),
    File(Mutex<std::fs::File>),
}

impl Sink {
    /// Records one item; an error if nobody is listening (then nobody needs it).
    fn send(&self, (name, seen): (String, Seen)) -> Result<(), ()> {
        match self {
            Sink::Channel(tx) => tx.send((name, seen)).map_err(drop),
            Sink::File(file) => {
                use std::io::Write as _;
                writeln!(lock(file), "{name} {seen:?}").map_err(drop)
            }
        }
    }
}

impl FakePlugin {
    async fn event(&self, event: api::Event, id: &str) -> ttrpc::Result<()> {
        // The test may have stopped listening; then nobody needs the record.
        let _ = self
            .seen
            .send((self.name.clone(), Seen::Event(event, id.into())));
        match self.answer {
            Answer::Ok | Answer::HangInSync => Ok(()),
            Answer::Fail => Err(status(ttrpc::Code::UNKNOWN, "refused by the fake")),
            Answer::Hang => std::future::pending().await,
            Answer::Overlap => {
                let now = IN_FLIGHT.fetch_add(1, Ordering::SeqCst) + 1;
                MAX_OVERLAP.fetch_max(now, Ordering::SeqCst);
                for _ in 0..50 {
                    tokio::task::yield_now().await;
                }
                IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            }
            Answer::Unimplemented => Err(status(ttrpc::Code::UNIMPLEMENTED, "old stub")),
        }
    }
}

#[async_trait::async_trait]
impl api::Plugin for FakePlugin {
    async fn configure(
        &self,
        _ctx: &TtrpcContext,
        req: api::ConfigureRequest,
    ) -> ttrpc::Result<api::ConfigureResponse> {
        let _ = self.seen.send((
            self.name.clone(),
            Seen::Configured {
                runtime: req.runtime_name,
                request_timeout: req.request_timeout,
                config: req.config,
            },
        ));
        let mut resp = api::ConfigureResponse::new();
        resp.events = self.events;
        Ok(resp)
    }

    async fn synchronize(
        &self,
        _ctx: &TtrpcContext,
        req: api::SynchronizeRequest,
    ) -> ttrpc::Result<api::SynchronizeResponse> {
        let _ = self.seen.send((
            self.name.clone(),
            Seen::Synced {
                pods: req.pods.iter().map(|p| p.id.clone()).collect(),
                containers: req.containers.iter().map(|c| c.id.clone()).collect(),
                more: req.more,
            },
        ));
        if matches!(self.answer, Answer::HangInSync) {
            std::future::pending::<()>().await;
        }
        let mut resp = api::SynchronizeResponse::new();
        resp.more = req.more;
        Ok(resp)
    }

    async fn shutdown(&self, _ctx: &TtrpcContext, _req: api::Empty) -> ttrpc::Result<api::Empty> {
        let _ = self.seen.send((self.name.clone(), Seen::Shutdown));
        Ok(api::Empty::new())
    }

    async fn run_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: api::RunPodSandboxRequest,
    ) -> ttrpc::Result<api::RunPodSandboxResponse> {
        self.event(api::Event::RUN_POD_SANDBOX, &req.pod.id).await?;
        Ok(api::RunPodSandboxResponse::new())
    }

    async fn stop_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: api::StopPodSandboxRequest,
    ) -> ttrpc::Result<api::StopPodSandboxResponse> {
        self.event(api::Event::STOP_POD_SANDBOX, &req.pod.id)
            .await?;
        Ok(api::StopPodSandboxResponse::new())
    }

    async fn create_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::CreateContainerRequest,
    ) -> ttrpc::Result<api::CreateContainerResponse> {
        self.event(api::Event::CREATE_CONTAINER, &req.container.id)
            .await?;
        let mut resp = api::CreateContainerResponse::new();
        let mut adjust = api::ContainerAdjustment::new();
        adjust
            .annotations
            .insert("adjusted-by".into(), self.name.clone());
        resp.adjust = Some(adjust).into();
        Ok(resp)
    }

    async fn remove_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::RemoveContainerRequest,
    ) -> ttrpc::Result<api::RemoveContainerResponse> {
        self.event(api::Event::REMOVE_CONTAINER, &req.container.id)
            .await?;
        Ok(api::RemoveContainerResponse::new())
    }

    async fn state_change(
        &self,
        _ctx: &TtrpcContext,
        req: api::StateChangeEvent,
    ) -> ttrpc::Result<api::Empty> {
        let _ = self.seen.send((
            self.name.clone(),
            Seen::StateChange(req.event.enum_value_or_default(), req.pod.id.clone()),
        ));
        Ok(api::Empty::new())
    }
}

/// A snapshot fixed by the test.
#[derive(Default)]
struct FixedSnapshot {
    pods: Vec<api::PodSandbox>,
    containers: Vec<api::Container>,
}

impl SyncSource for FixedSnapshot {
    fn snapshot(&self) -> (Vec<api::PodSandbox>, Vec<api::Container>) {
        (self.pods.clone(), self.containers.clone())
    }
}

/// A snapshot the test changes as it goes, as the runtime's objects do.
#[derive(Default)]
struct SharedSnapshot(Mutex<FixedSnapshot>);

impl SyncSource for SharedSnapshot {
    fn snapshot(&self) -> (Vec<api::PodSandbox>, Vec<api::Container>) {
        lock(&self.0).snapshot()
    }
}

/// Records the updates it is asked for; reports the first of each batch as failed.
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
        lock(&self.updates).push((
            updates.iter().map(|u| u.container_id.clone()).collect(),
            evictions.iter().map(|e| e.container_id.clone()).collect(),
        ));
        updates.into_iter().take(1).collect()
    }
}

struct Harness {
    _dir: tempfile::TempDir,
    path: PathBuf,
    registry: Arc<Registry>,
    runtime: Arc<RecordingRuntime>,
    seen_tx: mpsc::UnboundedSender<(String, Seen)>,
    seen: mpsc::UnboundedReceiver<(String, Seen)>,
}

fn harness(snapshot: FixedSnapshot) -> Harness {
    harness_with(Arc::new(snapshot), REQUEST_TIMEOUT)
}

fn harness_with(sync: Arc<dyn SyncSource>, request_timeout: Duration) -> Harness {
    let dir = tempfile::tempdir().expect("tempdir");
    start_harness(dir, sync, request_timeout, false)
}

/// A harness that launches the plugins `prepare` puts in `<dir>/plugins`, configured from
/// `<dir>/conf.d`.
fn launching_harness(prepare: impl FnOnce(&Path)) -> Harness {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("plugins")).expect("mkdir");
    std::fs::create_dir(dir.path().join("conf.d")).expect("mkdir");
    prepare(dir.path());
    start_harness(
        dir,
        Arc::new(FixedSnapshot::default()),
        REQUEST_TIMEOUT,
        true,
    )
}

fn start_harness(
    dir: tempfile::TempDir,
    sync: Arc<dyn SyncSource>,
    request_timeout: Duration,
    launch: bool,
) -> Harness {
    let path = dir.path().join("nri").join("nri.sock");
    let mut config = Config::new(&path, "remora", "0.1.0");
    config.registration_timeout = REGISTRATION_TIMEOUT;
    config.request_timeout = request_timeout;
    if launch {
        config.plugin_path = Some(dir.path().join("plugins"));
        config.plugin_config_path = Some(dir.path().join("conf.d"));
    }
    let runtime = Arc::new(RecordingRuntime::default());
    let registry =
        Registry::start(config, sync, runtime.clone(), discard()).expect("starting the registry");
    let (seen_tx, seen) = mpsc::unbounded_channel();
    Harness {
        _dir: dir,
        path,
        registry,
        runtime,
        seen_tx,
        seen,
    }
}

/// A fake plugin's end of its connection: its mux, the server of its Plugin service
/// (kept alive), and its client of remora's Runtime service.
struct PluginEnd {
    mux: Mux,
    _server: Server,
    runtime: api::RuntimeClient,
}

impl Harness {
    /// Connects a fake plugin without registering it.
    async fn connect(&self, name: &str, events: i32, answer: Answer) -> PluginEnd {
        let stream = UnixStream::connect(&self.path).await.expect("connect");
        let fake = FakePlugin {
            name: name.into(),
            events,
            answer,
            seen: Sink::Channel(self.seen_tx.clone()),
        };
        serve_fake(stream, fake).await
    }

    /// Connects and registers a fake plugin as `<idx>-<name>` and waits until it is
    /// active.
    async fn plugin(&self, idx: &str, name: &str, events: i32, answer: Answer) -> PluginEnd {
        let full = format!("{idx}-{name}");
        let end = self.connect(&full, events, answer).await;
        register(&end, idx, name).await.expect("RegisterPlugin");
        let mut active = self.registry.watch_plugins();
        timeout(DEADLINE, active.wait_for(|names| names.contains(&full)))
            .await
            .expect("the plugin becomes active in time")
            .expect("the registry is alive");
        end
    }

    /// Takes what the fake plugins recorded so far (everything they were sent before the
    /// registry's last awaited call returned).
    fn drain(&mut self) -> Vec<(String, Seen)> {
        let mut seen = Vec::new();
        while let Ok(item) = self.seen.try_recv() {
            seen.push(item);
        }
        seen
    }

    async fn next_seen(&mut self) -> (String, Seen) {
        timeout(DEADLINE, self.seen.recv())
            .await
            .expect("the plugin is sent something in time")
            .expect("senders alive")
    }
}

/// Serves `fake` on a plugin's connection to the registry.
async fn serve_fake(stream: UnixStream, fake: FakePlugin) -> PluginEnd {
    let mux = Mux::new(stream, None);
    let plugin_conn = mux.open(PLUGIN_SERVICE_CONN).expect("open conn 1");
    let runtime_conn = mux.open(RUNTIME_SERVICE_CONN).expect("open conn 2");
    // Pending after the one connection: ttrpc's accept loop expects a live listener.
    let incoming = stream::iter([Ok(plugin_conn)]).chain(stream::pending());
    let mut server = Server::new()
        .register_service(api::create_plugin(Arc::new(fake)))
        .add_listener(Listener::new(incoming));
    server.start().await.expect("plugin server");
    PluginEnd {
        mux,
        _server: server,
        runtime: api::RuntimeClient::new(Client::new(Socket::new(runtime_conn))),
    }
}

async fn register(end: &PluginEnd, idx: &str, name: &str) -> ttrpc::Result<api::Empty> {
    let mut req = api::RegisterPluginRequest::new();
    req.plugin_idx = idx.into();
    req.plugin_name = name.into();
    req.NRI_version = NRI_VERSION.into();
    end.runtime
        .register_plugin(ttrpc::context::with_timeout(5_000_000_000), &req)
        .await
}

async fn wait_closed(end: &PluginEnd) {
    timeout(DEADLINE, end.mux.closed())
        .await
        .expect("remora closes the plugin's connection in time");
}

fn mask(events: &[api::Event]) -> i32 {
    events.iter().map(|e| 1 << (e.value() - 1)).sum()
}

fn pod(id: &str) -> api::PodSandbox {
    let mut pod = api::PodSandbox::new();
    pod.id = id.into();
    pod
}

fn container(id: &str, pod: &str) -> api::Container {
    let mut c = api::Container::new();
    c.id = id.into();
    c.pod_sandbox_id = pod.into();
    c
}

mod events;
mod handshake;
mod launched_plugins;
mod runtime_service;
mod socket;

#[tokio::test]
async fn a_plugin_whose_connection_closes_is_dropped() {
    let h = harness(FixedSnapshot::default());
    let _a = h.plugin("10", "a", 0, Answer::Ok).await;
    let b = h.plugin("20", "b", 0, Answer::Ok).await;
    b.mux.close();
    let mut active = h.registry.watch_plugins();
    timeout(DEADLINE, active.wait_for(|names| *names == ["10-a"]))
        .await
        .expect("dropped in time")
        .expect("registry alive");
    timeout(DEADLINE, h.registry.run_pod_sandbox(&pod("p1")))
        .await
        .expect("in time")
        .expect("RunPodSandbox without the closed plugin");
}

#[tokio::test]
async fn stop_sends_shutdown_and_closes_the_plugins() {
    let mut h = harness(FixedSnapshot::default());
    let end = h.plugin("10", "a", 0, Answer::Ok).await;
    h.drain();
    timeout(DEADLINE, h.registry.stop())
        .await
        .expect("stops in time");
    assert_eq!(h.drain(), [("10-a".into(), Seen::Shutdown)]);
    wait_closed(&end).await;
    assert!(h.registry.plugins().is_empty());
    assert!(!h.path.exists());
    assert!(
        UnixStream::connect(&h.path).await.is_err(),
        "no longer accepting"
    );
}
