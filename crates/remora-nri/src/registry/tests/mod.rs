//! The registry's tests, with what they share: fake plugins on real sockets, a recording
//! runtime, and a harness around a started registry.

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

#[tokio::test]
async fn a_plugin_registers_is_configured_and_synchronized_with_the_snapshot() {
    let mut h = harness(FixedSnapshot {
        pods: vec![pod("p1")],
        containers: vec![container("c1", "p1"), container("c2", "p1")],
    });
    // Events 0: NRI's "every event".
    let _end = h.plugin("10", "logger", 0, Answer::Ok).await;
    assert_eq!(h.registry.plugins(), ["10-logger"]);
    assert_eq!(
        h.drain(),
        [
            (
                "10-logger".to_string(),
                Seen::Configured {
                    runtime: "remora".into(),
                    request_timeout: 2000,
                    config: String::new(),
                }
            ),
            (
                "10-logger".to_string(),
                Seen::Synced {
                    pods: vec!["p1".into()],
                    containers: vec!["c1".into(), "c2".into()],
                    more: false
                }
            ),
        ]
    );
    // Subscribed to everything: RemoveContainer reaches it.
    timeout(
        DEADLINE,
        h.registry
            .remove_container(&pod("p1"), &container("c1", "p1")),
    )
    .await
    .expect("in time");
    assert_eq!(
        h.drain(),
        [(
            "10-logger".to_string(),
            Seen::Event(api::Event::REMOVE_CONTAINER, "c1".into())
        )]
    );
}

#[tokio::test]
async fn a_plugin_that_never_registers_is_closed_after_the_registration_timeout() {
    let mut h = harness(FixedSnapshot::default());
    let started = Instant::now();
    let end = h.connect("silent", 0, Answer::Ok).await;
    wait_closed(&end).await;
    assert!(
        started.elapsed() >= REGISTRATION_TIMEOUT,
        "{:?}",
        started.elapsed()
    );
    assert!(h.registry.plugins().is_empty());
    assert_eq!(h.drain(), [], "never configured");
}

#[tokio::test]
async fn a_bad_index_or_name_is_refused_and_the_connection_closed() {
    // A short request timeout: remora waits that long for a refused plugin to hang up.
    let mut h = harness_with(
        Arc::new(FixedSnapshot::default()),
        Duration::from_millis(200),
    );
    let long = "x".repeat(MAX_PLUGIN_NAME_LEN + 1);
    for (idx, name) in [
        ("1", "ok"),
        ("100", "ok"),
        ("1a", "ok"),
        ("٣٣", "ok"),
        ("10", ""),
        ("10", "a/b"),
        ("10", "a b"),
        ("10", long.as_str()),
    ] {
        let end = h.connect("bad", 0, Answer::Ok).await;
        match register(&end, idx, name).await {
            Err(ttrpc::Error::RpcStatus(s)) => {
                assert_eq!(s.code(), ttrpc::Code::INVALID_ARGUMENT, "{idx:?} {name:?}");
            }
            other => panic!("{idx:?} {name:?} registered: {other:?}"),
        }
        wait_closed(&end).await;
    }
    assert!(h.registry.plugins().is_empty());
    assert_eq!(h.drain(), [], "never configured");
    // The longest name is fine.
    let longest = "x".repeat(MAX_PLUGIN_NAME_LEN);
    let _end = h.plugin("99", &longest, 0, Answer::Ok).await;
}

/// Go's ttrpc server refuses a request whose stream id is below the last one it saw, and
/// two calls at once on one client can be written out of order: critest's concurrent
/// creates failed StartContainer with "StreamID cannot be re-used and must increment".
/// A plugin gets one call at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_gets_one_call_at_a_time_from_concurrent_events() {
    let h = harness(FixedSnapshot::default());
    let _p = h.plugin("10", "overlap", 0, Answer::Overlap).await;
    let runs = (0..16).map(|i| {
        let (registry, p) = (h.registry.clone(), pod(&format!("p{i}")));
        tokio::spawn(async move { registry.run_pod_sandbox(&p).await })
    });
    for run in futures::future::join_all(runs).await {
        run.expect("the task").expect("RunPodSandbox");
    }
    assert_eq!(MAX_OVERLAP.load(Ordering::SeqCst), 1, "calls at once");
}

#[tokio::test]
async fn a_second_plugin_with_the_same_index_and_name_is_refused() {
    let h = harness(FixedSnapshot::default());
    let _first = h.plugin("10", "dup", 0, Answer::Ok).await;
    let second = h.connect("10-dup", 0, Answer::Ok).await;
    // The plugin is told why, then its connection closes.
    let err = register(&second, "10", "dup")
        .await
        .expect_err("a name in use is refused");
    match err {
        ttrpc::Error::RpcStatus(s) => {
            assert_eq!(s.code(), ttrpc::Code::ALREADY_EXISTS, "{s:?}");
            assert!(s.message().contains("10-dup"), "{s:?}");
        }
        other => panic!("{other:?}"),
    }
    wait_closed(&second).await;
    assert_eq!(h.registry.plugins(), ["10-dup"]);
}

#[tokio::test]
async fn plugins_are_called_in_index_order_and_only_for_their_events() {
    let mut h = harness(FixedSnapshot::default());
    use api::Event as E;
    // Registered out of order.
    let _b = h
        .plugin(
            "20",
            "b",
            mask(&[E::RUN_POD_SANDBOX, E::STOP_POD_SANDBOX]),
            Answer::Ok,
        )
        .await;
    let _a = h
        .plugin(
            "10",
            "a",
            mask(&[E::RUN_POD_SANDBOX, E::CREATE_CONTAINER]),
            Answer::Ok,
        )
        .await;
    assert_eq!(h.registry.plugins(), ["10-a", "20-b"]);
    h.drain();

    let r = &h.registry;
    timeout(DEADLINE, r.run_pod_sandbox(&pod("p1")))
        .await
        .expect("in time")
        .expect("RunPodSandbox");
    timeout(DEADLINE, r.stop_pod_sandbox(&pod("p1")))
        .await
        .expect("in time");
    let created = timeout(
        DEADLINE,
        r.create_container(&pod("p1"), &container("c1", "p1")),
    )
    .await
    .expect("in time")
    .expect("CreateContainer");
    timeout(DEADLINE, r.remove_pod_sandbox(&pod("p1")))
        .await
        .expect("in time");
    assert_eq!(
        h.drain(),
        [
            ("10-a".into(), Seen::Event(E::RUN_POD_SANDBOX, "p1".into())),
            ("20-b".into(), Seen::Event(E::RUN_POD_SANDBOX, "p1".into())),
            ("20-b".into(), Seen::Event(E::STOP_POD_SANDBOX, "p1".into())),
            ("10-a".into(), Seen::Event(E::CREATE_CONTAINER, "c1".into())),
        ]
    );
    assert_eq!(created.len(), 1);
    assert_eq!(created[0].0, "10-a");
    assert_eq!(created[0].1.adjust.annotations["adjusted-by"], "10-a");
}

#[tokio::test]
async fn a_plugin_error_fails_run_pod_sandbox_naming_the_plugin_but_only_logs_on_stop() {
    let mut h = harness(FixedSnapshot::default());
    use api::Event as E;
    let events = mask(&[E::RUN_POD_SANDBOX, E::STOP_POD_SANDBOX]);
    let _bad = h.plugin("10", "bad", events, Answer::Fail).await;
    let _good = h.plugin("20", "good", events, Answer::Ok).await;
    h.drain();

    let err = timeout(DEADLINE, h.registry.run_pod_sandbox(&pod("p1")))
        .await
        .expect("in time")
        .expect_err("the plugin's error fails RunPodSandbox");
    assert_eq!(err.plugin, "10-bad");
    assert_eq!(err.event, E::RUN_POD_SANDBOX);
    assert_eq!(err.code, ttrpc::Code::UNKNOWN);
    assert!(err.to_string().contains("10-bad"), "{err}");
    // The plugins after the failing one are not called.
    assert_eq!(
        h.drain(),
        [(
            "10-bad".into(),
            Seen::Event(E::RUN_POD_SANDBOX, "p1".into())
        )]
    );

    // StopPodSandbox: logged, the next plugin still called, the failing one kept.
    timeout(DEADLINE, h.registry.stop_pod_sandbox(&pod("p1")))
        .await
        .expect("in time");
    assert_eq!(
        h.drain(),
        [
            (
                "10-bad".into(),
                Seen::Event(E::STOP_POD_SANDBOX, "p1".into())
            ),
            (
                "20-good".into(),
                Seen::Event(E::STOP_POD_SANDBOX, "p1".into())
            ),
        ]
    );
    assert_eq!(h.registry.plugins(), ["10-bad", "20-good"]);
}

#[tokio::test]
async fn a_hanging_plugin_is_dropped_after_the_request_timeout() {
    let mut h = harness(FixedSnapshot::default());
    use api::Event as E;
    let events = mask(&[E::RUN_POD_SANDBOX]);
    let hang = h.plugin("10", "hang", events, Answer::Hang).await;
    let _good = h.plugin("20", "good", events, Answer::Ok).await;
    h.drain();

    let started = Instant::now();
    // Unlike NRI (which goes on without it), the call fails naming the plugin, which is
    // dropped.
    let err = timeout(DEADLINE, h.registry.run_pod_sandbox(&pod("p1")))
        .await
        .expect("bounded by the request timeout, not wedged")
        .expect_err("the hung plugin fails the call");
    let took = started.elapsed();
    assert!(took >= REQUEST_TIMEOUT, "{took:?}");
    assert!(took < REQUEST_TIMEOUT * 3, "{took:?}");
    assert_eq!(err.plugin, "10-hang");
    assert_eq!(err.event, E::RUN_POD_SANDBOX);
    assert_eq!(err.code, ttrpc::Code::UNAVAILABLE);
    assert_eq!(h.registry.plugins(), ["20-good"]);
    wait_closed(&hang).await;
    assert_eq!(
        h.drain(),
        [(
            "10-hang".into(),
            Seen::Event(E::RUN_POD_SANDBOX, "p1".into())
        )]
    );

    // Later calls skip it.
    timeout(REQUEST_TIMEOUT, h.registry.run_pod_sandbox(&pod("p2")))
        .await
        .expect("quick without the hung plugin")
        .expect("RunPodSandbox");
    assert_eq!(
        h.drain(),
        [(
            "20-good".into(),
            Seen::Event(E::RUN_POD_SANDBOX, "p2".into())
        )]
    );
}

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
async fn synchronize_splits_a_snapshot_bigger_than_a_message_and_it_arrives_whole() {
    // 40 containers of 256 KiB annotations: about 10 MiB, three messages.
    let containers: Vec<api::Container> = (0..40)
        .map(|i| {
            let mut c = container(&format!("c{i}"), "p1");
            c.annotations.insert("big".into(), "x".repeat(256 << 10));
            c
        })
        .collect();
    let want: Vec<String> = containers.iter().map(|c| c.id.clone()).collect();
    let mut h = harness(FixedSnapshot {
        pods: vec![pod("p1"), pod("p2")],
        containers,
    });
    let _end = h.plugin("10", "big", 0, Answer::Ok).await;

    let mut pods = Vec::new();
    let mut got = Vec::new();
    let mut mores = Vec::new();
    for (_, seen) in h.drain() {
        if let Seen::Synced {
            pods: p,
            containers: c,
            more,
        } = seen
        {
            pods.extend(p);
            got.extend(c);
            mores.push(more);
        }
    }
    assert_eq!(pods, ["p1", "p2"]);
    assert_eq!(got, want);
    assert_eq!(mores, [true, true, false]);
}

#[test]
fn sync_chunks_stay_under_the_budget_and_keep_order() {
    let pods: Vec<api::PodSandbox> = (0..30).map(|i| pod(&format!("pod-{i:03}"))).collect();
    let containers: Vec<api::Container> = (0..50)
        .map(|i| container(&format!("ctr-{i:03}"), "pod-000"))
        .collect();
    let budget = 300;
    let chunks = sync_chunks(pods.clone(), containers.clone(), budget).expect("chunks");
    assert!(chunks.len() > 3, "{}", chunks.len());
    for (i, chunk) in chunks.iter().enumerate() {
        let size = usize::try_from(chunk.compute_size()).unwrap();
        assert!(size <= budget, "chunk {i}: {size}");
        assert_eq!(chunk.more, i + 1 < chunks.len());
    }
    let all_pods: Vec<_> = chunks.iter().flat_map(|c| c.pods.clone()).collect();
    let all_ctrs: Vec<_> = chunks.iter().flat_map(|c| c.containers.clone()).collect();
    assert_eq!(all_pods, pods);
    assert_eq!(all_ctrs, containers);

    assert_eq!(sync_chunks(vec![], vec![], budget).expect("empty").len(), 1);
    let mut huge = pod("huge");
    huge.name = "x".repeat(budget);
    assert!(matches!(
        sync_chunks(vec![huge], vec![], budget),
        Err(HandshakeError::Oversized(_))
    ));
}

#[tokio::test]
async fn the_socket_is_0600_in_a_0700_directory_and_a_stale_one_is_replaced() {
    let h = harness(FixedSnapshot::default());
    let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode(&h.path), 0o600);
    assert_eq!(mode(h.path.parent().unwrap()), 0o700);
    h.registry.stop().await;
    assert!(!h.path.exists(), "stop removes the socket");

    // A stale socket (bound, nobody listening) is replaced; a regular file is not.
    let stale = std::os::unix::net::UnixListener::bind(&h.path).expect("stale socket");
    drop(stale);
    let config = Config::new(&h.path, "remora", "0.1.0");
    let again = Registry::start(
        config.clone(),
        Arc::new(FixedSnapshot::default()),
        h.runtime.clone(),
        discard(),
    )
    .expect("replaces the stale socket");
    again.stop().await;
    std::fs::write(&h.path, b"not a socket").expect("file");
    match Registry::start(
        config,
        Arc::new(FixedSnapshot::default()),
        h.runtime.clone(),
        discard(),
    ) {
        Err(RegistryError::NotASocket(p)) => assert_eq!(p, h.path),
        Err(other) => panic!("wrong error {other}"),
        Ok(_) => panic!("started over a regular file"),
    }
    assert_eq!(std::fs::read(&h.path).expect("file kept"), b"not a socket");
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

#[tokio::test]
async fn an_old_plugin_gets_state_change_when_an_rpc_is_unimplemented() {
    let mut h = harness(FixedSnapshot::default());
    let _old = h
        .plugin(
            "10",
            "old",
            mask(&[api::Event::RUN_POD_SANDBOX]),
            Answer::Unimplemented,
        )
        .await;
    h.drain();
    timeout(DEADLINE, h.registry.run_pod_sandbox(&pod("p1")))
        .await
        .expect("in time")
        .expect("StateChange answered");
    assert_eq!(
        h.drain(),
        [
            (
                "10-old".into(),
                Seen::Event(api::Event::RUN_POD_SANDBOX, "p1".into())
            ),
            (
                "10-old".into(),
                Seen::StateChange(api::Event::RUN_POD_SANDBOX, "p1".into())
            ),
        ]
    );
}

#[tokio::test]
async fn update_containers_from_a_plugin_reaches_the_runtime() {
    let h = harness(FixedSnapshot::default());
    let end = h.connect("10-up", 0, Answer::Ok).await;
    let mut req = api::UpdateContainersRequest::new();
    let mut update = api::ContainerUpdate::new();
    update.container_id = "c1".into();
    req.update.push(update);
    let mut evict = api::ContainerEviction::new();
    evict.container_id = "c2".into();
    req.evict.push(evict);
    let ctx = || ttrpc::context::with_timeout(5_000_000_000);
    // Not before registration.
    match end.runtime.update_containers(ctx(), &req).await {
        Err(ttrpc::Error::RpcStatus(s)) => {
            assert_eq!(s.code(), ttrpc::Code::FAILED_PRECONDITION);
        }
        other => panic!("accepted before registration: {other:?}"),
    }
    register(&end, "10", "up").await.expect("RegisterPlugin");
    let resp = end
        .runtime
        .update_containers(ctx(), &req)
        .await
        .expect("UpdateContainers");
    assert_eq!(resp.failed.len(), 1);
    assert_eq!(resp.failed[0].container_id, "c1");
    assert_eq!(
        *lock(&h.runtime.updates),
        [(vec!["c1".to_string()], vec!["c2".to_string()])]
    );
}

#[tokio::test]
async fn configure_is_the_first_request_a_plugin_gets() {
    // Nothing reaches a plugin before Configure, not even Synchronize.
    let mut h = harness(FixedSnapshot::default());
    let _end = h.plugin("10", "a", 0, Answer::Ok).await;
    let (name, first) = h.next_seen().await;
    assert_eq!(name, "10-a");
    assert!(matches!(first, Seen::Configured { .. }), "{first:?}");
}

#[tokio::test]
async fn a_registration_waits_for_sync_blocks_and_its_snapshot_has_what_they_created() {
    let objects = Arc::new(SharedSnapshot::default());
    lock(&objects.0).pods.push(pod("before"));
    let mut h = harness_with(objects.clone(), REQUEST_TIMEOUT);
    use api::Event as E;

    // A CRI mutation in flight: it holds the block while it creates a pod and runs its hook.
    let block = timeout(DEADLINE, h.registry.block_sync())
        .await
        .expect("no registration holds the write side");
    let end = h
        .connect("10-late", mask(&[E::RUN_POD_SANDBOX]), Answer::Ok)
        .await;
    register(&end, "10", "late").await.expect("RegisterPlugin");
    assert!(matches!(h.next_seen().await.1, Seen::Configured { .. }));
    lock(&objects.0).pods.push(pod("during"));
    // The hook of the pod being created does not see the plugin: it is not active yet.
    timeout(DEADLINE, h.registry.run_pod_sandbox(&pod("during")))
        .await
        .expect("in time")
        .expect("RunPodSandbox");
    // Nor is the plugin synchronized while the block is held (a bounded wait for nothing).
    let early = timeout(Duration::from_millis(200), h.seen.recv()).await;
    assert!(early.is_err(), "sent while blocked: {early:?}");
    drop(block);

    // Synchronize then has both pods, and the hook above was not sent: each pod reached
    // the plugin exactly once.
    assert_eq!(
        h.next_seen().await,
        (
            "10-late".into(),
            Seen::Synced {
                pods: vec!["before".into(), "during".into()],
                containers: vec![],
                more: false
            }
        )
    );
    let mut active = h.registry.watch_plugins();
    timeout(DEADLINE, active.wait_for(|names| *names == ["10-late"]))
        .await
        .expect("active in time")
        .expect("registry alive");
    timeout(DEADLINE, h.registry.run_pod_sandbox(&pod("after")))
        .await
        .expect("in time")
        .expect("RunPodSandbox");
    assert_eq!(
        h.drain(),
        [(
            "10-late".into(),
            Seen::Event(E::RUN_POD_SANDBOX, "after".into())
        )]
    );
}

#[tokio::test]
async fn a_plugin_hanging_in_synchronize_holds_sync_blocks_off_for_one_request_timeout() {
    let mut h = harness(FixedSnapshot::default());
    let end = h.connect("10-stuck", 0, Answer::HangInSync).await;
    register(&end, "10", "stuck").await.expect("RegisterPlugin");
    assert!(matches!(h.next_seen().await.1, Seen::Configured { .. }));
    assert!(matches!(h.next_seen().await.1, Seen::Synced { .. }));
    // Registration holds the write side now; a CRI mutation waits at most about a request
    // timeout for it.
    let started = Instant::now();
    let block = timeout(REQUEST_TIMEOUT * 3, h.registry.block_sync())
        .await
        .expect("the hung Synchronize gives the lock back");
    assert!(started.elapsed() <= REQUEST_TIMEOUT * 3);
    drop(block);
    wait_closed(&end).await;
    assert!(h.registry.plugins().is_empty());
}

/// The environment variable naming the file [`launched_plugin_child`] records to.
const CHILD_RECORD_ENV: &str = "REMORA_NRI_TEST_RECORD";

/// Not a test of its own: the test binary run as a launched plugin, by a script in a plugin
/// directory ([`self_plugin`]). It serves a fake plugin on NRI's fd 3, registers under
/// another name than its file's, records what it is sent in `$REMORA_NRI_TEST_RECORD` and
/// runs until killed. Run by the test harness (no such variable), it passes at once.
#[test]
fn launched_plugin_child() {
    let Some(record) = std::env::var_os(CHILD_RECORD_ENV) else {
        return;
    };
    assert_eq!(std::env::var("NRI_PLUGIN_SOCKET").as_deref(), Ok("3"));
    let name = format!(
        "{}-{}",
        std::env::var("NRI_PLUGIN_IDX").expect("NRI_PLUGIN_IDX"),
        std::env::var("NRI_PLUGIN_NAME").expect("NRI_PLUGIN_NAME")
    );
    let file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(record)
        .expect("the record file");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        use std::os::fd::FromRawFd as _;
        // SAFETY: fd 3 is the socket the registry passed (NRI_PLUGIN_SOCKET says so) and
        // nothing else in this process owns it.
        let socket = unsafe { std::os::unix::net::UnixStream::from_raw_fd(3) };
        socket.set_nonblocking(true).expect("nonblocking");
        let stream = UnixStream::from_std(socket).expect("a tokio socket");
        let fake = FakePlugin {
            name,
            events: 0,
            answer: Answer::Ok,
            seen: Sink::File(Mutex::new(file)),
        };
        let end = serve_fake(stream, fake).await;
        // Not its file's name: the registry goes by the file.
        register(&end, "99", "impostor")
            .await
            .expect("RegisterPlugin");
        std::future::pending::<()>().await;
    });
}

/// A script `dir/name` that records its pid in `dir/<name>.pid` and runs this test binary
/// as [`launched_plugin_child`], recording to `dir/<name>.record`.
fn self_plugin(dir: &Path, name: &str) {
    let exe = std::env::current_exe().expect("the test binary");
    let script = format!(
        "#!/bin/sh\necho $$ > '{pid}'\n{CHILD_RECORD_ENV}='{record}' exec '{exe}' \
         --exact registry::tests::launched_plugin_child --quiet\n",
        pid = dir.join(format!("{name}.pid")).display(),
        record = dir.join(format!("{name}.record")).display(),
        exe = exe.display(),
    );
    script_plugin(dir, name, &script);
}

fn script_plugin(dir: &Path, name: &str, script: &str) {
    let path = dir.join(name);
    std::fs::write(&path, script).expect("write the script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

fn read_pid(path: &Path) -> u32 {
    std::fs::read_to_string(path)
        .expect("the pid file")
        .trim()
        .parse()
        .expect("a pid")
}

/// Whether `pid` is gone: no process, not even a zombie waiting to be reaped.
fn reaped(pid: u32) -> bool {
    !Path::new(&format!("/proc/{pid}")).exists()
}

fn launched(h: &Harness) -> Vec<Arc<launch::Process>> {
    lock(&h.registry.launched).clone()
}

#[tokio::test]
async fn a_launched_plugin_registers_under_its_file_name_and_is_killed_and_reaped_on_stop() {
    let mut dir = PathBuf::new();
    let h = launching_harness(|d| {
        dir = d.to_path_buf();
        self_plugin(&d.join("plugins"), "10-self");
        // No 10-self.conf: the name's configuration is used.
        std::fs::write(d.join("conf.d").join("self.conf"), "the config").expect("conf");
    });
    let plugins = dir.join("plugins");
    let mut active = h.registry.watch_plugins();
    timeout(DEADLINE, active.wait_for(|names| *names == ["10-self"]))
        .await
        .expect("the launched plugin registers in time")
        .expect("registry alive");
    timeout(DEADLINE, h.registry.run_pod_sandbox(&pod("p1")))
        .await
        .expect("in time")
        .expect("RunPodSandbox");
    let pid = read_pid(&plugins.join("10-self.pid"));
    assert!(!reaped(pid), "running");

    timeout(DEADLINE, h.registry.stop())
        .await
        .expect("stops in time");
    // stop() returns once the plugin is reaped.
    assert!(reaped(pid), "pid {pid} killed and reaped by stop()");
    assert!(launched(&h).is_empty());
    let record = std::fs::read_to_string(plugins.join("10-self.record")).expect("record");
    let configured = Seen::Configured {
        runtime: "remora".into(),
        request_timeout: 2000,
        config: "the config".into(),
    };
    let synced = Seen::Synced {
        pods: vec![],
        containers: vec![],
        more: false,
    };
    let run = Seen::Event(api::Event::RUN_POD_SANDBOX, "p1".into());
    let want: Vec<String> = [configured, synced, run, Seen::Shutdown]
        .iter()
        .map(|seen| format!("10-self {seen:?}"))
        .collect();
    assert_eq!(record.lines().collect::<Vec<_>>(), want);
}

#[tokio::test]
async fn a_launched_plugin_that_exits_at_once_is_reaped_and_the_registry_goes_on() {
    let mut dir = PathBuf::new();
    let h = launching_harness(|d| {
        dir = d.join("plugins");
        let pid = dir.join("10-quit.pid");
        script_plugin(
            &dir,
            "10-quit",
            &format!("#!/bin/sh\necho $$ > '{}'\nexit 3\n", pid.display()),
        );
    });
    let processes = launched(&h);
    assert_eq!(processes.len(), 1);
    let status = timeout(DEADLINE, processes[0].reaped())
        .await
        .expect("reaped in time")
        .expect("an exit status");
    assert_eq!(status.code(), Some(3));
    assert!(reaped(read_pid(&dir.join("10-quit.pid"))));
    // The registry is fine: an external plugin registers and is called.
    let _end = h.plugin("20", "external", 0, Answer::Ok).await;
    assert_eq!(h.registry.plugins(), ["20-external"]);
    timeout(DEADLINE, h.registry.run_pod_sandbox(&pod("p1")))
        .await
        .expect("in time")
        .expect("RunPodSandbox");
    timeout(DEADLINE, h.registry.stop())
        .await
        .expect("stops in time");
}

#[tokio::test]
async fn a_launched_plugin_that_never_registers_is_killed_and_reaped_after_the_timeout() {
    let mut dir = PathBuf::new();
    let started = Instant::now();
    let h = launching_harness(|d| {
        dir = d.join("plugins");
        let pid = dir.join("10-mute.pid");
        script_plugin(
            &dir,
            "10-mute",
            &format!(
                "#!/bin/sh\necho $$ > '{}'\nexec /bin/sleep 1000\n",
                pid.display()
            ),
        );
    });
    let processes = launched(&h);
    assert_eq!(processes.len(), 1);
    let status = timeout(DEADLINE, processes[0].reaped())
        .await
        .expect("killed in time")
        .expect("an exit status");
    use std::os::unix::process::ExitStatusExt as _;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
    assert!(started.elapsed() >= REGISTRATION_TIMEOUT);
    assert!(reaped(read_pid(&dir.join("10-mute.pid"))));
    assert!(h.registry.plugins().is_empty());
}

/// What a launched script saw: its environment (less the shell's own PWD) and its file
/// descriptors (number → target).
fn what_it_saw(dir: &Path, name: &str) -> (Vec<String>, Vec<(String, String)>) {
    let env = std::fs::read_to_string(dir.join(format!("{name}.env"))).expect("env");
    let mut env: Vec<String> = env
        .lines()
        .filter(|l| !l.starts_with("PWD="))
        .map(String::from)
        .collect();
    env.sort();
    let fds = std::fs::read_to_string(dir.join(format!("{name}.fds"))).expect("fds");
    let mut fds: Vec<(String, String)> = fds
        .lines()
        .filter_map(|l| l.split_once(" -> "))
        .map(|(left, target)| {
            let fd = left.rsplit(' ').next().unwrap_or_default();
            (fd.to_string(), target.to_string())
        })
        .collect();
    fds.sort();
    (env, fds)
}

#[tokio::test]
async fn launched_plugins_get_nris_environment_only_and_their_socket_as_fd_3_only() {
    let mut dir = PathBuf::new();
    let h = launching_harness(|d| {
        dir = d.join("plugins");
        for name in ["10-a", "20-b"] {
            let out = dir.join(name);
            script_plugin(
                &dir,
                name,
                &format!(
                    // The shell's descriptors as they are: listed by a child that
                    // opens its output file itself (a redirection would be the shell's,
                    // and a pipeline's pipe is the shell's too while it sets it up).
                    "#!/bin/sh\n/usr/bin/env > '{out}.env'\n\
                     /usr/bin/find /proc/$$/fd/ -mindepth 1 -fprintf '{out}.fds' '%f -> %l\\n'\n\
                     exit 0\n",
                    out = out.display()
                ),
            );
        }
    });
    let processes = launched(&h);
    assert_eq!(processes.len(), 2);
    for process in &processes {
        let status = timeout(DEADLINE, process.reaped())
            .await
            .expect("reaped in time")
            .expect("an exit status");
        assert!(status.success(), "{status}");
    }
    for (name, idx, base) in [("10-a", "10", "a"), ("20-b", "20", "b")] {
        let (env, fds) = what_it_saw(&dir, name);
        assert_eq!(
            env,
            [
                format!("NRI_PLUGIN_IDX={idx}"),
                format!("NRI_PLUGIN_NAME={base}"),
                "NRI_PLUGIN_SOCKET=3".to_string(),
            ],
            "{name}"
        );
        let sockets: Vec<&str> = fds
            .iter()
            .filter(|(_, target)| target.starts_with("socket:"))
            .map(|(fd, _)| fd.as_str())
            .collect();
        // Its own end as fd 3; not remora's end, nor the other plugin's.
        assert_eq!(sockets, ["3"], "{name}: {fds:?}");
        for fd in ["0", "1", "2"] {
            assert!(
                fds.contains(&(fd.to_string(), "/dev/null".to_string())),
                "{name}: {fds:?}"
            );
        }
        // Nothing else of remora's, nor what the test process inherited: above fd 3 only
        // the shell's own descriptor of its script.
        let script = dir.join(name).display().to_string();
        for (fd, target) in &fds {
            assert!(
                ["0", "1", "2", "3"].contains(&fd.as_str()) || *target == script,
                "{name}: fd {fd} -> {target}: {fds:?}"
            );
        }
    }
    timeout(DEADLINE, h.registry.stop())
        .await
        .expect("stops in time");
}
