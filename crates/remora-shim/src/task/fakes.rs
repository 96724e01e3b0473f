//! Recording fakes of the task logic's ports, and a harness that runs [`Tasks`] over them
//! with bundles in a tempdir: no OCI runtime, no reaper, no containerd.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use slog::{o, Logger};
use tokio::sync::oneshot;

use super::ports::{Event, Events, ExitWatch, OciRuntime, Runtimes};
use super::{NewTask, Tasks};
use crate::error::ShimError;
use crate::options::RuntimeOptions;
use crate::reaper::Exit;
use crate::runc::{CreateOpts, ExecOpts, RuncError};

/// Pids of the fake runtime's processes: above the kernel's largest pid_max (2^22), so no
/// real process has them (a stray signal or cgroup lookup finds nothing).
pub(crate) const INIT_PID: u32 = 5_000_001;
/// The pid of the fake runtime's first exec process (the next ones count up).
pub(crate) const EXEC_PID: u32 = 5_000_101;
/// How long a test waits for what the tasks do in their own tokio tasks.
pub(crate) const DEADLINE: Duration = Duration::from_secs(10);

/// An OCI runtime call, with its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Call {
    Create { id: String, bundle: PathBuf },
    Start(String),
    Exec { id: String, spec: Vec<u8> },
    Kill { id: String, signal: u32, all: bool },
    Delete { id: String, force: bool },
    Ps(String),
    Pause(String),
    Resume(String),
    Update { id: String, resources: Vec<u8> },
}

impl Call {
    fn name(&self) -> &'static str {
        match self {
            Call::Create { .. } => "create",
            Call::Start(_) => "start",
            Call::Exec { .. } => "exec",
            Call::Kill { .. } => "kill",
            Call::Delete { .. } => "delete",
            Call::Ps(_) => "ps",
            Call::Pause(_) => "pause",
            Call::Resume(_) => "resume",
            Call::Update { .. } => "update",
        }
    }
}

/// A runtime that records its calls, answers with fake pids, and fails a call once when told.
#[derive(Default)]
pub(crate) struct FakeRuntime {
    calls: Mutex<Vec<Call>>,
    next_exec_pid: Mutex<u32>,
    ps: Mutex<Vec<u32>>,
    failures: Mutex<HashMap<&'static str, RuncError>>,
    /// Run during `start` (before it returns), e.g. to deliver an exit.
    on_start: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl FakeRuntime {
    /// The calls so far.
    pub(crate) fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }
    /// The next call named `call` ("create", "kill"…) fails with `e`.
    pub(crate) fn fail_next(&self, call: &'static str, e: RuncError) {
        self.failures.lock().unwrap().insert(call, e);
    }
    /// What `ps` lists.
    pub(crate) fn set_ps(&self, pids: Vec<u32>) {
        *self.ps.lock().unwrap() = pids;
    }
    /// `f` runs inside the next `start`.
    pub(crate) fn during_start(&self, f: impl FnOnce() + Send + 'static) {
        *self.on_start.lock().unwrap() = Some(Box::new(f));
    }
    fn record(&self, call: Call) -> Result<(), RuncError> {
        let name = call.name();
        self.calls.lock().unwrap().push(call);
        match self.failures.lock().unwrap().remove(name) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

#[async_trait::async_trait]
impl OciRuntime for FakeRuntime {
    async fn create(&self, id: &str, bundle: &Path, _: CreateOpts) -> Result<u32, RuncError> {
        self.record(Call::Create {
            id: id.into(),
            bundle: bundle.into(),
        })?;
        Ok(INIT_PID)
    }
    async fn start(&self, id: &str) -> Result<(), RuncError> {
        self.record(Call::Start(id.into()))?;
        let hook = self.on_start.lock().unwrap().take();
        if let Some(f) = hook {
            f();
            // Lets the shim's other tasks (an exit watch) run while `start` is in the runtime.
            for _ in 0..16 {
                tokio::task::yield_now().await;
            }
        }
        Ok(())
    }
    async fn exec(&self, id: &str, spec_json: &[u8], _: ExecOpts) -> Result<u32, RuncError> {
        self.record(Call::Exec {
            id: id.into(),
            spec: spec_json.to_vec(),
        })?;
        let mut next = self.next_exec_pid.lock().unwrap();
        let pid = EXEC_PID + *next;
        *next += 1;
        Ok(pid)
    }
    async fn kill(&self, id: &str, signal: u32, all: bool) -> Result<(), RuncError> {
        self.record(Call::Kill {
            id: id.into(),
            signal,
            all,
        })
    }
    async fn delete(&self, id: &str, force: bool) -> Result<(), RuncError> {
        self.record(Call::Delete {
            id: id.into(),
            force,
        })
    }
    async fn ps(&self, id: &str) -> Result<Vec<u32>, RuncError> {
        self.record(Call::Ps(id.into()))?;
        Ok(self.ps.lock().unwrap().clone())
    }
    async fn pause(&self, id: &str) -> Result<(), RuncError> {
        self.record(Call::Pause(id.into()))
    }
    async fn resume(&self, id: &str) -> Result<(), RuncError> {
        self.record(Call::Resume(id.into()))
    }
    async fn update(&self, id: &str, resources_json: &[u8]) -> Result<(), RuncError> {
        self.record(Call::Update {
            id: id.into(),
            resources: resources_json.to_vec(),
        })
    }
}

/// Hands every container the one [`FakeRuntime`].
struct FakeRuntimes(Arc<FakeRuntime>);

impl Runtimes for FakeRuntimes {
    fn runtime(&self, _: &RuntimeOptions, _: &str, _: &Logger) -> Arc<dyn OciRuntime> {
        self.0.clone()
    }
}

/// Exits delivered by the test: each watched pid's sender is kept until [`FakeExits::exit`].
#[derive(Default)]
pub(crate) struct FakeExits {
    watches: Mutex<HashMap<i32, oneshot::Sender<Exit>>>,
}

impl FakeExits {
    /// `pid` exits with `status` at `at`; panics if nobody watches it.
    pub(crate) fn exit(&self, pid: u32, status: u32, at: SystemTime) {
        let tx = self
            .watches
            .lock()
            .unwrap()
            .remove(&(pid as i32))
            .unwrap_or_else(|| panic!("pid {pid} is not watched"));
        // The receiver lives in the task's exit watch until the exit is in.
        tx.send(Exit {
            pid: pid as i32,
            status,
            at,
        })
        .unwrap();
    }
    /// Whether `pid` is watched.
    pub(crate) fn watched(&self, pid: u32) -> bool {
        self.watches.lock().unwrap().contains_key(&(pid as i32))
    }
}

impl ExitWatch for FakeExits {
    fn watch(&self, pid: i32) -> oneshot::Receiver<Exit> {
        let (tx, rx) = oneshot::channel();
        self.watches.lock().unwrap().insert(pid, tx);
        rx
    }
    fn watch_spawned(&self, pid: i32, _: Instant) -> oneshot::Receiver<Exit> {
        self.watch(pid)
    }
}

/// Records the events sent, in order.
#[derive(Default)]
pub(crate) struct FakeEvents(Mutex<Vec<Event>>);

impl FakeEvents {
    /// The events so far.
    pub(crate) fn all(&self) -> Vec<Event> {
        self.0.lock().unwrap().clone()
    }
    /// The kinds of the events so far ("create", "start", "exit"…).
    pub(crate) fn kinds(&self) -> Vec<&'static str> {
        self.all()
            .iter()
            .map(|e| match e {
                Event::Create(_) => "create",
                Event::Start(_) => "start",
                Event::Oom(_) => "oom",
                Event::Exit(_) => "exit",
                Event::Delete(_) => "delete",
                Event::ExecAdded(_) => "exec-added",
                Event::ExecStarted(_) => "exec-started",
                Event::Paused(_) => "paused",
                Event::Resumed(_) => "resumed",
            })
            .collect()
    }
}

impl Events for FakeEvents {
    fn send(&self, event: Event) {
        self.0.lock().unwrap().push(event);
    }
}

/// A container spec with a pid namespace of its own.
pub(crate) const OWN_PID_NS: &str = r#"{"process":{},"linux":{"namespaces":[{"type":"pid"}]}}"#;
/// A container spec sharing the host's pid namespace.
pub(crate) const HOST_PID_NS: &str = r#"{"process":{},"linux":{"namespaces":[]}}"#;
/// A pod holder's spec.
pub(crate) const POD_HOLDER: &str = r#"{"annotations":{"dev.remora.pod-holder":"true"}}"#;

/// [`Tasks`] over the fakes, bundles under a tempdir.
pub(crate) struct Harness {
    pub(crate) tasks: Tasks,
    pub(crate) runtime: Arc<FakeRuntime>,
    pub(crate) exits: Arc<FakeExits>,
    pub(crate) events: Arc<FakeEvents>,
    pub(crate) dir: tempfile::TempDir,
}

impl Harness {
    /// Must run inside a tokio runtime (the tasks start their OOM reporter).
    pub(crate) fn new() -> Harness {
        let runtime = Arc::new(FakeRuntime::default());
        let exits = Arc::new(FakeExits::default());
        let events = Arc::new(FakeEvents::default());
        let tasks = Tasks::new(
            "k8s.io".into(),
            events.clone(),
            exits.clone(),
            Arc::new(FakeRuntimes(runtime.clone())),
            Logger::root(slog::Discard, o!()),
        );
        Harness {
            tasks,
            runtime,
            exits,
            events,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// The bundle of `id`, with `config` as its config.json.
    pub(crate) fn bundle(&self, id: &str, config: &str) -> PathBuf {
        let bundle = self.dir.path().join(id);
        std::fs::create_dir_all(&bundle).unwrap();
        std::fs::write(bundle.join("config.json"), config).unwrap();
        bundle
    }

    /// The Create of `id` with `config` and no streams.
    pub(crate) fn new_task(&self, id: &str, config: &str) -> NewTask {
        NewTask {
            id: id.into(),
            bundle: self.bundle(id, config).display().to_string(),
            ..NewTask::default()
        }
    }

    /// Creates `id` with `config`.
    pub(crate) async fn create(&self, id: &str, config: &str) -> Result<u32, ShimError> {
        self.tasks.create(self.new_task(id, config)).await
    }

    /// Creates and starts `id` with its own pid namespace.
    pub(crate) async fn running(&self, id: &str) -> u32 {
        self.create(id, OWN_PID_NS).await.unwrap();
        self.tasks.start(id, "").await.unwrap()
    }

    /// Waits (bounded) for the process's exit as Wait reports it.
    pub(crate) async fn wait(&self, id: &str, exec_id: &str) -> crate::process::Exited {
        tokio::time::timeout(DEADLINE, self.tasks.wait(id, exec_id))
            .await
            .expect("no exit within the deadline")
            .unwrap()
    }
}
