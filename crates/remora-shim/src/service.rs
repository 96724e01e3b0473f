//! The task service (`containerd.task.v3.Task`): containers and exec processes of one pod, run
//! through the OCI runtime, their exits and OOMs reported to containerd.
//!
//! A process's life, as the service tracks it:
//!
//! ```text
//!   Create/Exec ──> CREATED ──Start──> RUNNING <──Resume── PAUSED
//!                     │                  │  └─────Pause─────^
//!                     │                  └──(reaper: exit)──> STOPPED ──Delete──> gone
//!                     └────────────────Delete─────────────────────────────────────^
//! ```
//!
//! Event order is the contract containerd and CRI clients rely on: TaskCreate → TaskStart →
//! (TaskOOM) → TaskExit → TaskDelete, and ExecAdded → ExecStarted → TaskExit. Each container
//! has one `lifecycle` lock: Create, Start and Exec publish under it, and an exit is published
//! under it too, so a process that dies at once never has its TaskExit overtake its TaskStart.
//! Before TaskExit of an init process the service re-reads the cgroup's OOM-kill counter, so a
//! TaskOOM whose watch wake-up has not been handled yet still comes first. An exit's output is
//! drained (bounded) before its TaskExit, so a client that reads the log after the exit sees
//! every line.
//!
//! The exit status of an init process is also written to the bundle: a `delete` after the shim
//! died reports the real code. Events go through the [`Publisher`], which never drops one.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use containerd_shim_protos::api::{
    CloseIORequest, ConnectRequest, ConnectResponse, CreateTaskRequest, CreateTaskResponse,
    DeleteRequest, DeleteResponse, Empty, ExecProcessRequest, KillRequest, PauseRequest,
    PidsRequest, PidsResponse, ResizePtyRequest, ResumeRequest, ShutdownRequest, StartRequest,
    StartResponse, StateRequest, StateResponse, StatsRequest, StatsResponse, UpdateTaskRequest,
    WaitRequest, WaitResponse,
};
use containerd_shim_protos::events::task::{
    TaskCreate, TaskDelete, TaskExecAdded, TaskExecStarted, TaskExit, TaskIO, TaskOOM, TaskPaused,
    TaskResumed, TaskStart,
};
use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::protobuf::well_known_types::timestamp::Timestamp;
use containerd_shim_protos::protobuf::{Message, MessageField};
use containerd_shim_protos::shim::oci::{Options as RuncOptions, ProcessDetails};
use containerd_shim_protos::shim_async::Task;
use containerd_shim_protos::topics;
use containerd_shim_protos::ttrpc::{self, r#async::TtrpcContext};
use containerd_shim_protos::types::task::{ProcessInfo, Status};
use remora_host::mount::MountOption;
use slog::{debug, info, o, warn, Logger};
use tokio::sync::{mpsc, oneshot, watch, Notify};

use super::cgroup::Cgroup;
use super::error::ShimError;
use super::io::{IoSpec, ProcessIo};
use super::oom::OomWatch;
use super::publisher::Publisher;
use super::reaper::{Exit, Reaper};
use super::runc::{CreateOpts, ExecOpts, Runc, RuncError};

/// How long an exit waits for its process's output to drain before TaskExit goes out anyway
/// (a grandchild may hold the pipe open for ever).
const IO_DRAIN: Duration = Duration::from_secs(2);
/// The OCI runtime's state root when the runtime options name none (Go shims' default).
const DEFAULT_RUNC_ROOT: &str = "/run/containerd/runc";
/// Console sockets: a short directory, as a unix socket path must stay under 108 bytes and a
/// bundle path alone is about 100.
pub(crate) const CONSOLE_DIR: &str = "/run/remora-shim";
/// The shim's record of a container's runtime options, for `delete` after the shim died.
pub(crate) const OPTIONS_FILE: &str = "remora-shim-options.json";
/// The init process's exit, for `delete` after the shim died.
pub(crate) const EXIT_FILE: &str = "remora-shim-exit.json";

/// The OCI runtime and how to run it, from the task's runtime options.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RuntimeOptions {
    /// The OCI runtime binary (`runc` when empty).
    pub binary_name: String,
    /// Its state root, before the namespace is appended (Go shims' rule).
    pub root: String,
    /// `--systemd-cgroup`.
    pub systemd_cgroup: bool,
    /// `--no-pivot`.
    pub no_pivot_root: bool,
    /// `--no-new-keyring`.
    pub no_new_keyring: bool,
    /// Owner uid of the processes' stdio pipes (a user-namespaced container's root on the
    /// host, so it can reopen `/dev/stdout`); with `io_gid`, 0 and 0 leave them the shim's.
    #[serde(default)]
    pub io_uid: u32,
    /// Owner gid of the stdio pipes.
    #[serde(default)]
    pub io_gid: u32,
}

impl RuntimeOptions {
    /// Reads the options containerd passes: `containerd.runc.v1.Options` (remora, ctr, and
    /// containerd's CRI for runc-type runtimes) or `runtimeoptions.v1.Options` (containerd's CRI
    /// for other runtime types: the runtime's options table as TOML).
    pub fn from_any(any: Option<&Any>) -> Result<RuntimeOptions, ShimError> {
        let Some(any) = any.filter(|a| !a.type_url.is_empty()) else {
            return Ok(RuntimeOptions::default());
        };
        let bad = |reason: String| ShimError::InvalidArgument {
            field: "options",
            reason,
        };
        let name = any.type_url.rsplit('/').next().unwrap_or_default();
        match name {
            "containerd.runc.v1.Options" => {
                let o = RuncOptions::parse_from_bytes(&any.value)
                    .map_err(|e| bad(format!("{name}: {e}")))?;
                Ok(RuntimeOptions {
                    binary_name: o.binary_name,
                    root: o.root,
                    systemd_cgroup: o.systemd_cgroup,
                    no_pivot_root: o.no_pivot_root,
                    no_new_keyring: o.no_new_keyring,
                    io_uid: o.io_uid,
                    io_gid: o.io_gid,
                })
            }
            "runtimeoptions.v1.Options" => {
                let (path, body) =
                    decode_runtimeoptions(&any.value).map_err(|e| bad(format!("{name}: {e}")))?;
                let body = if body.is_empty() && !path.is_empty() {
                    std::fs::read_to_string(&path).map_err(|e| bad(format!("{path}: {e}")))?
                } else {
                    body
                };
                Self::from_toml(&body).map_err(|e| bad(format!("{name}: {e}")))
            }
            other => Err(bad(format!("unsupported options type {other:?}"))),
        }
    }

    /// The options table of containerd's CRI config (`BinaryName`, `Root`, `SystemdCgroup`, …).
    fn from_toml(body: &str) -> Result<RuntimeOptions, String> {
        let t: toml::Table = toml::from_str(body).map_err(|e| e.to_string())?;
        let s = |k: &str| t.get(k).and_then(|v| v.as_str()).unwrap_or("").to_string();
        let b = |k: &str| t.get(k).and_then(|v| v.as_bool()).unwrap_or(false);
        let n = |k: &str| {
            t.get(k)
                .and_then(|v| v.as_integer())
                .and_then(|i| u32::try_from(i).ok())
                .unwrap_or(0)
        };
        Ok(RuntimeOptions {
            binary_name: s("BinaryName"),
            root: s("Root"),
            systemd_cgroup: b("SystemdCgroup"),
            no_pivot_root: b("NoPivotRoot"),
            no_new_keyring: b("NoNewKeyring"),
            io_uid: n("IoUid"),
            io_gid: n("IoGid"),
        })
    }

    /// Who owns the processes' stdio pipes, if not the shim (`IoUid`/`IoGid`).
    pub fn io_owner(&self) -> Option<(u32, u32)> {
        (self.io_uid != 0 || self.io_gid != 0).then_some((self.io_uid, self.io_gid))
    }

    /// The OCI runtime binary.
    pub fn binary(&self) -> PathBuf {
        PathBuf::from(if self.binary_name.is_empty() {
            "runc"
        } else {
            &self.binary_name
        })
    }

    /// The OCI runtime's `--root` for `namespace`.
    pub fn root_for(&self, namespace: &str) -> PathBuf {
        let root = if self.root.is_empty() {
            DEFAULT_RUNC_ROOT
        } else {
            &self.root
        };
        Path::new(root).join(namespace)
    }
}

/// `runtimeoptions.v1.Options` fields 2 (config_path) and 3 (config_body); no generated type
/// exists for it in containerd-shim-protos.
fn decode_runtimeoptions(bytes: &[u8]) -> Result<(String, String), String> {
    use containerd_shim_protos::protobuf::rt::WireType;
    use containerd_shim_protos::protobuf::CodedInputStream;
    let mut is = CodedInputStream::from_bytes(bytes);
    let (mut path, mut body) = (String::new(), String::new());
    while let Some(tag) = is.read_raw_tag_or_eof().map_err(|e| e.to_string())? {
        let wire = WireType::new(tag & 7).ok_or_else(|| format!("bad wire type in tag {tag}"))?;
        match (tag >> 3, wire) {
            (2, WireType::LengthDelimited) => path = is.read_string().map_err(|e| e.to_string())?,
            (3, WireType::LengthDelimited) => body = is.read_string().map_err(|e| e.to_string())?,
            _ => is.skip_field(wire).map_err(|e| e.to_string())?,
        }
    }
    Ok((path, body))
}

/// An init process's exit as recorded in its bundle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExitRecord {
    /// The pid.
    pub pid: u32,
    /// Exit code, or 128 + signal.
    pub status: u32,
    /// When, in nanoseconds since the epoch.
    pub exited_at_ns: i64,
    /// Whether the kernel OOM-killed a process of the container.
    pub oom_killed: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ProcStatus {
    Created,
    Running,
    Paused,
    Stopped,
}

impl ProcStatus {
    fn name(self) -> &'static str {
        match self {
            ProcStatus::Created => "created",
            ProcStatus::Running => "running",
            ProcStatus::Paused => "paused",
            ProcStatus::Stopped => "stopped",
        }
    }
    fn pb(self) -> Status {
        match self {
            ProcStatus::Created => Status::CREATED,
            ProcStatus::Running => Status::RUNNING,
            ProcStatus::Paused => Status::PAUSED,
            ProcStatus::Stopped => Status::STOPPED,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Exited {
    status: u32,
    at: SystemTime,
}

struct ProcState {
    status: ProcStatus,
    pid: u32,
    exit: Option<Exited>,
}

/// The init process or an exec process.
struct Proc {
    /// Empty for the init process.
    exec_id: String,
    io_spec: IoSpec,
    /// The exec's OCI process JSON (empty for init).
    spec_json: Vec<u8>,
    state: Mutex<ProcState>,
    io: Mutex<Option<Arc<ProcessIo>>>,
    exited: watch::Sender<Option<Exited>>,
}

impl Proc {
    fn new(exec_id: String, io_spec: IoSpec, spec_json: Vec<u8>) -> Proc {
        Proc {
            exec_id,
            io_spec,
            spec_json,
            state: Mutex::new(ProcState {
                status: ProcStatus::Created,
                pid: 0,
                exit: None,
            }),
            io: Mutex::new(None),
            exited: watch::channel(None).0,
        }
    }

    fn state(&self) -> MutexGuard<'_, ProcState> {
        // A poisoned lock means a panic, which aborts the shim (panic = "abort"): the
        // guard is always usable here.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn io(&self) -> Option<Arc<ProcessIo>> {
        self.io.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    async fn wait(&self) -> Exited {
        let mut rx = self.exited.subscribe();
        loop {
            if let Some(e) = *rx.borrow_and_update() {
                return e;
            }
            if rx.changed().await.is_err() {
                // The sender lives in the Proc we borrow: it cannot be gone.
                std::future::pending::<()>().await;
            }
        }
    }
}

struct Container {
    id: String,
    bundle: PathBuf,
    runc: Runc,
    rootfs_mounted: bool,
    /// The container shares the host's (or another) pid namespace: its processes do not die
    /// with its init, so they are killed when it exits (as Go shims do).
    kill_all_on_exit: bool,
    /// Serializes Create/Start/Exec publishing with exit publishing (module docs).
    lifecycle: tokio::sync::Mutex<()>,
    init: Arc<Proc>,
    execs: Mutex<HashMap<String, Arc<Proc>>>,
    cgroup: Option<Cgroup>,
    oom_watch: Mutex<Option<OomWatch>>,
    /// OOM kills reported so far (the cgroup's counter when the last TaskOOM went out).
    ooms_reported: Mutex<u64>,
    /// Owner of its processes' stdio pipes (the task options' `io_uid`/`io_gid`), execs too.
    io_owner: Option<(u32, u32)>,
}

impl Container {
    fn proc(&self, exec_id: &str) -> Result<Arc<Proc>, ShimError> {
        if exec_id.is_empty() {
            return Ok(self.init.clone());
        }
        self.execs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(exec_id)
            .cloned()
            .ok_or_else(|| ShimError::ExecNotFound {
                id: self.id.clone(),
                exec_id: exec_id.to_string(),
            })
    }
}

struct Inner {
    namespace: String,
    publisher: Publisher,
    reaper: Reaper,
    containers: Mutex<HashMap<String, Arc<Container>>>,
    oom_tx: mpsc::UnboundedSender<String>,
    shutdown: Arc<Notify>,
    log: Logger,
}

/// The task service; cheap to clone.
#[derive(Clone)]
pub struct Service {
    inner: Arc<Inner>,
}

impl Service {
    /// The service of one shim: its containers' events go through `publisher`, their exits come
    /// from `reaper`; `shutdown` is notified when containerd's Shutdown ends the shim. Starts
    /// the task that reports OOM kills (so it must run inside the shim's tokio runtime).
    pub(crate) fn new(
        namespace: String,
        publisher: Publisher,
        reaper: Reaper,
        shutdown: Arc<Notify>,
        log: Logger,
    ) -> Service {
        let (oom_tx, oom_rx) = mpsc::unbounded_channel();
        let svc = Service {
            inner: Arc::new(Inner {
                namespace,
                publisher,
                reaper,
                containers: Mutex::new(HashMap::new()),
                oom_tx,
                shutdown,
                log,
            }),
        };
        svc.clone().spawn_oom_reports(oom_rx);
        svc
    }

    /// Reports the OOM kills the containers' watches wake up for.
    fn spawn_oom_reports(self, mut oom_rx: mpsc::UnboundedReceiver<String>) {
        tokio::spawn(async move {
            while let Some(id) = oom_rx.recv().await {
                let c = self.containers().get(&id).cloned();
                if let Some(c) = c {
                    let reported = *c.ooms_reported.lock().unwrap_or_else(|e| e.into_inner());
                    // Without a counter (kernels before 4.13) each wake-up is one kill.
                    let kills = c
                        .cgroup
                        .as_ref()
                        .and_then(|cg| cg.oom_kills().ok())
                        .filter(|k| *k > 0)
                        .unwrap_or(reported + 1);
                    self.report_ooms(&c, kills);
                }
            }
        });
    }

    fn container(&self, id: &str) -> Result<Arc<Container>, ShimError> {
        self.containers()
            .get(id)
            .cloned()
            .ok_or_else(|| ShimError::ContainerNotFound { id: id.to_string() })
    }

    fn containers(&self) -> MutexGuard<'_, HashMap<String, Arc<Container>>> {
        self.inner
            .containers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    fn publish(&self, topic: &str, event: &dyn containerd_shim_protos::protobuf::MessageDyn) {
        self.inner.publisher.publish(topic, event);
    }

    /// Publishes one TaskOOM when the container's OOM-kill count grew past what was reported.
    fn report_ooms(&self, c: &Container, kills: u64) {
        let mut reported = c.ooms_reported.lock().unwrap_or_else(|p| p.into_inner());
        if kills > *reported {
            *reported = kills;
            let mut e = TaskOOM::new();
            e.container_id = c.id.clone();
            self.publish(topics::TASK_OOM_EVENT_TOPIC, &e);
            info!(self.inner.log, "container OOM-killed"; "container_id" => &c.id, "oom_kills" => kills);
        }
    }

    async fn create_task(&self, req: CreateTaskRequest) -> Result<CreateTaskResponse, ShimError> {
        let id = req.id.clone();
        let log = self.inner.log.new(o!("container_id" => id.clone()));
        if id.is_empty() {
            return Err(ShimError::InvalidArgument {
                field: "id",
                reason: "empty".into(),
            });
        }
        if self.containers().contains_key(&id) {
            return Err(ShimError::AlreadyExists {
                what: "container",
                id,
            });
        }
        if !req.checkpoint.is_empty() {
            return Err(ShimError::Unimplemented("Create from a checkpoint"));
        }
        let bundle = PathBuf::from(&req.bundle);
        let opts = RuntimeOptions::from_any(req.options.as_ref())?;
        write_json(&bundle.join(OPTIONS_FILE), &opts)?;
        let config = read_file(&bundle.join("config.json"))?;
        let kill_all_on_exit = !has_own_pid_namespace(&config);

        let rootfs = bundle.join("rootfs");
        let rootfs_mounted = !req.rootfs.is_empty();
        if rootfs_mounted {
            mount_rootfs(&id, &req.rootfs, &rootfs)?;
        }
        let runc = Runc::new(
            opts.binary(),
            opts.root_for(&self.inner.namespace),
            opts.systemd_cgroup,
            self.inner.reaper.clone(),
            log.clone(),
        );
        let created = self.run_init(&id, &bundle, &runc, &opts, &req, &log).await;
        let (pid, io, spawned_at) = match created {
            Ok(v) => v,
            Err(e) => {
                if rootfs_mounted {
                    // Best effort: the error that matters is the one returned.
                    let _ = unmount(&id, &rootfs);
                }
                return Err(e);
            }
        };

        let cgroup = match Cgroup::of_pid(pid) {
            Ok(cg) => Some(cg),
            Err(e) => {
                warn!(log, "no cgroup: no OOM reports or stats"; "error" => %e);
                None
            }
        };
        let init = Arc::new(Proc::new(
            String::new(),
            IoSpec {
                stdin: req.stdin.clone(),
                stdout: req.stdout.clone(),
                stderr: req.stderr.clone(),
                terminal: req.terminal,
                owner: opts.io_owner(),
            },
            Vec::new(),
        ));
        init.state().pid = pid;
        *init.io.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(io));
        let baseline = cgroup
            .as_ref()
            .and_then(|cg| cg.oom_kills().ok())
            .unwrap_or(0);
        let c = Arc::new(Container {
            id: id.clone(),
            bundle: bundle.clone(),
            runc,
            rootfs_mounted,
            kill_all_on_exit,
            lifecycle: tokio::sync::Mutex::new(()),
            init: init.clone(),
            execs: Mutex::new(HashMap::new()),
            cgroup,
            oom_watch: Mutex::new(None),
            ooms_reported: Mutex::new(baseline),
            io_owner: opts.io_owner(),
        });
        // Right after create, before the process runs user code: an early OOM is caught.
        if let Some(cg) = &c.cgroup {
            match OomWatch::start(cg, id.clone(), self.inner.oom_tx.clone(), log.clone()) {
                Ok(w) => *c.oom_watch.lock().unwrap_or_else(|p| p.into_inner()) = Some(w),
                Err(e) => warn!(log, "no OOM watch"; "error" => %e),
            }
        }
        self.containers().insert(id.clone(), c.clone());

        let mut e = TaskCreate::new();
        e.container_id = id.clone();
        e.bundle = req.bundle.clone();
        e.rootfs = req.rootfs.clone();
        let mut tio = TaskIO::new();
        tio.stdin = req.stdin.clone();
        tio.stdout = req.stdout.clone();
        tio.stderr = req.stderr.clone();
        tio.terminal = req.terminal;
        e.io = MessageField::some(tio);
        e.checkpoint = req.checkpoint.clone();
        e.pid = pid;
        self.publish(topics::TASK_CREATE_EVENT_TOPIC, &e);
        // After TaskCreate: the exit task publishes only after it.
        self.watch_exit(c, init, pid, spawned_at);
        info!(log, "container created"; "pid" => pid);
        let mut resp = CreateTaskResponse::new();
        resp.pid = pid;
        Ok(resp)
    }

    async fn run_init(
        &self,
        id: &str,
        bundle: &Path,
        runc: &Runc,
        opts: &RuntimeOptions,
        req: &CreateTaskRequest,
        log: &Logger,
    ) -> Result<(u32, ProcessIo, Instant), ShimError> {
        let spec = IoSpec {
            stdin: req.stdin.clone(),
            stdout: req.stdout.clone(),
            stderr: req.stderr.clone(),
            terminal: req.terminal,
            owner: opts.io_owner(),
        };
        let mut io = ProcessIo::prepare(
            &spec,
            id,
            &self.inner.namespace,
            Path::new(CONSOLE_DIR),
            log.clone(),
        )
        .await?;
        self.watch_logger(&io);
        let create = CreateOpts {
            pid_file: bundle.join("init.pid"),
            console_socket: io.console_socket().map(Path::to_path_buf),
            stdio: io.take_stdio(),
            no_pivot: opts.no_pivot_root,
            no_new_keyring: opts.no_new_keyring,
        };
        let spawned_at = Instant::now();
        // The runtime returns the pid from its pid file; a failure after its container exists
        // (the pid file, the IO) is rolled back below, and so is a failed create (the delete
        // then finds nothing).
        let started = async {
            let pid = runc.create(id, bundle, create).await?;
            io.start_copying().await?;
            Ok::<u32, ShimError>(pid)
        }
        .await;
        match started {
            Ok(pid) => Ok((pid, io, spawned_at)),
            Err(e) => {
                let _ = runc.delete(id, true).await;
                Err(e)
            }
        }
    }

    /// Reaps a `binary://` logger when it exits (the reaper takes every child).
    fn watch_logger(&self, io: &ProcessIo) {
        if let Some(pid) = io.logger_pid() {
            let rx = self.inner.reaper.watch(pid);
            let log = self.inner.log.clone();
            tokio::spawn(async move {
                if let Ok(exit) = rx.await {
                    debug!(log, "log driver exited"; "pid" => pid, "status" => exit.status);
                }
            });
        }
    }

    /// Waits for the process's exit and reports it (module docs: order and OOM).
    /// `spawned_at`: taken before the runtime started the process, so a kept exit of an
    /// earlier process with the same pid is not mistaken for this one's.
    fn watch_exit(&self, c: Arc<Container>, p: Arc<Proc>, pid: u32, spawned_at: Instant) {
        let rx: oneshot::Receiver<Exit> = self.inner.reaper.watch_spawned(pid as i32, spawned_at);
        let svc = self.clone();
        tokio::spawn(async move {
            let Ok(exit) = rx.await else {
                // The reaper is gone only when the shim ends.
                return;
            };
            svc.on_exit(&c, &p, exit).await;
        });
    }

    async fn on_exit(&self, c: &Container, p: &Proc, exit: Exit) {
        let log = self
            .inner
            .log
            .new(o!("container_id" => c.id.clone(), "exec_id" => p.exec_id.clone()));
        if let Some(io) = p.io() {
            if !io.wait_drained(IO_DRAIN).await {
                warn!(log, "output not drained before the exit was reported"; "within" => ?IO_DRAIN);
            }
        }
        let _order = c.lifecycle.lock().await;
        let exited = Exited {
            status: exit.status,
            at: exit.at,
        };
        let is_init = p.exec_id.is_empty();
        if is_init {
            if let Some(kills) = c.cgroup.as_ref().and_then(|cg| cg.oom_kills().ok()) {
                self.report_ooms(c, kills);
            }
            if c.kill_all_on_exit {
                if let Err(e) = c.runc.kill(&c.id, libc::SIGKILL as u32, true).await {
                    debug!(log, "kill the container's remaining processes"; "error" => %e);
                }
            }
            let record = ExitRecord {
                pid: exit.pid as u32,
                status: exit.status,
                exited_at_ns: to_ns(exit.at),
                oom_killed: *c.ooms_reported.lock().unwrap_or_else(|e| e.into_inner()) > 0,
            };
            if let Err(e) = write_json(&c.bundle.join(EXIT_FILE), &record) {
                warn!(log, "exit not recorded in the bundle"; "error" => %e);
            }
        }
        {
            let mut st = p.state();
            st.status = ProcStatus::Stopped;
            st.exit = Some(exited);
        }
        let mut e = TaskExit::new();
        e.container_id = c.id.clone();
        e.id = if is_init {
            c.id.clone()
        } else {
            p.exec_id.clone()
        };
        e.pid = exit.pid as u32;
        e.exit_status = exit.status;
        e.exited_at = MessageField::some(timestamp(exit.at));
        self.publish(topics::TASK_EXIT_EVENT_TOPIC, &e);
        p.exited.send_replace(Some(exited));
        info!(log, "process exited"; "pid" => exit.pid, "status" => exit.status);
    }

    async fn start_task(&self, req: StartRequest) -> Result<StartResponse, ShimError> {
        let c = self.container(&req.id)?;
        let p = c.proc(&req.exec_id)?;
        let _order = c.lifecycle.lock().await;
        let status = p.state().status;
        if status != ProcStatus::Created {
            return Err(ShimError::WrongState {
                id: req.id.clone(),
                action: "start",
                state: status.name(),
            });
        }
        let mut resp = StartResponse::new();
        if req.exec_id.is_empty() {
            c.runc.start(&c.id).await?;
            let pid = {
                let mut st = p.state();
                // The exit may have been reaped already; it is published after this, in order.
                if st.status == ProcStatus::Created {
                    st.status = ProcStatus::Running;
                }
                st.pid
            };
            let mut e = TaskStart::new();
            e.container_id = c.id.clone();
            e.pid = pid;
            self.publish(topics::TASK_START_EVENT_TOPIC, &e);
            resp.pid = pid;
        } else {
            let log = self
                .inner
                .log
                .new(o!("container_id" => c.id.clone(), "exec_id" => req.exec_id.clone()));
            let mut io = ProcessIo::prepare(
                &p.io_spec,
                &req.exec_id,
                &self.inner.namespace,
                Path::new(CONSOLE_DIR),
                log.clone(),
            )
            .await?;
            self.watch_logger(&io);
            let pid_file = c.bundle.join(format!("exec-{}.pid", short(&req.exec_id)));
            let opts = ExecOpts {
                pid_file: pid_file.clone(),
                console_socket: io.console_socket().map(Path::to_path_buf),
                stdio: io.take_stdio(),
            };
            let spawned_at = Instant::now();
            let pid = c.runc.exec(&c.id, &p.spec_json, opts).await;
            let _ = std::fs::remove_file(&pid_file);
            let pid = pid?;
            // Watched before anything else can fail: the reaper keeps an early exit for us.
            {
                let mut st = p.state();
                st.pid = pid;
                st.status = ProcStatus::Running;
            }
            let copying = io.start_copying().await;
            *p.io.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(io));
            self.watch_exit(c.clone(), p.clone(), pid, spawned_at);
            if let Err(e) = copying {
                // The process runs without its IO: kill it, its exit is reported as usual.
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
                return Err(e.into());
            }
            let mut e = TaskExecStarted::new();
            e.container_id = c.id.clone();
            e.exec_id = req.exec_id.clone();
            e.pid = pid;
            self.publish(topics::TASK_EXEC_STARTED_EVENT_TOPIC, &e);
            resp.pid = pid;
        }
        Ok(resp)
    }

    async fn delete_task(&self, req: DeleteRequest) -> Result<DeleteResponse, ShimError> {
        let c = self.container(&req.id)?;
        let p = c.proc(&req.exec_id)?;
        let _order = c.lifecycle.lock().await;
        let (status, pid, exit) = {
            let st = p.state();
            (st.status, st.pid, st.exit)
        };
        if matches!(status, ProcStatus::Running | ProcStatus::Paused) {
            return Err(ShimError::WrongState {
                id: req.id.clone(),
                action: "delete",
                state: status.name(),
            });
        }
        let exit = exit.unwrap_or(Exited {
            status: 0,
            at: SystemTime::now(),
        });
        let mut resp = DeleteResponse::new();
        resp.pid = pid;
        resp.exit_status = exit.status;
        resp.exited_at = MessageField::some(timestamp(exit.at));
        if !req.exec_id.is_empty() {
            c.execs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&req.exec_id);
            return Ok(resp);
        }
        match c.runc.delete(&c.id, status == ProcStatus::Created).await {
            Ok(()) | Err(RuncError::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        if c.rootfs_mounted {
            unmount(&c.id, &c.bundle.join("rootfs"))?;
        }
        c.oom_watch.lock().unwrap_or_else(|e| e.into_inner()).take();
        self.containers().remove(&c.id);
        let mut e = TaskDelete::new();
        e.container_id = c.id.clone();
        e.id = c.id.clone();
        e.pid = pid;
        e.exit_status = exit.status;
        e.exited_at = MessageField::some(timestamp(exit.at));
        self.publish(topics::TASK_DELETE_EVENT_TOPIC, &e);
        info!(self.inner.log, "container deleted"; "container_id" => &c.id);
        Ok(resp)
    }

    async fn exec_process(&self, req: ExecProcessRequest) -> Result<(), ShimError> {
        let c = self.container(&req.id)?;
        if req.exec_id.is_empty() {
            return Err(ShimError::InvalidArgument {
                field: "exec_id",
                reason: "empty".into(),
            });
        }
        let _order = c.lifecycle.lock().await;
        let status = c.init.state().status;
        if status != ProcStatus::Running {
            return Err(ShimError::WrongState {
                id: req.id.clone(),
                action: "exec in",
                state: status.name(),
            });
        }
        let spec = req
            .spec
            .as_ref()
            .map(|a| a.value.clone())
            .filter(|v| !v.is_empty())
            .ok_or_else(|| ShimError::InvalidArgument {
                field: "spec",
                reason: "no process spec".into(),
            })?;
        {
            let mut execs = c.execs.lock().unwrap_or_else(|e| e.into_inner());
            if execs.contains_key(&req.exec_id) {
                return Err(ShimError::AlreadyExists {
                    what: "exec",
                    id: req.exec_id.clone(),
                });
            }
            let io = IoSpec {
                stdin: req.stdin.clone(),
                stdout: req.stdout.clone(),
                stderr: req.stderr.clone(),
                terminal: req.terminal,
                owner: c.io_owner,
            };
            execs.insert(
                req.exec_id.clone(),
                Arc::new(Proc::new(req.exec_id.clone(), io, spec)),
            );
        }
        let mut e = TaskExecAdded::new();
        e.container_id = c.id.clone();
        e.exec_id = req.exec_id.clone();
        self.publish(topics::TASK_EXEC_ADDED_EVENT_TOPIC, &e);
        Ok(())
    }

    async fn kill_process(&self, req: KillRequest) -> Result<(), ShimError> {
        let c = self.container(&req.id)?;
        let p = c.proc(&req.exec_id)?;
        let (status, pid) = {
            let st = p.state();
            (st.status, st.pid)
        };
        let finished = || ShimError::ProcessFinished {
            id: if req.exec_id.is_empty() {
                req.id.clone()
            } else {
                req.exec_id.clone()
            },
        };
        if status == ProcStatus::Stopped {
            return Err(finished());
        }
        if req.exec_id.is_empty() {
            return match c.runc.kill(&c.id, req.signal, req.all).await {
                Ok(()) => Ok(()),
                // The init process died between our check and runc's: it is finished.
                Err(RuncError::NotFound { .. }) => Err(finished()),
                Err(e) if is_not_running(&e) => Err(finished()),
                Err(e) => Err(e.into()),
            };
        }
        if status == ProcStatus::Created {
            return Err(ShimError::WrongState {
                id: req.exec_id.clone(),
                action: "kill",
                state: status.name(),
            });
        }
        let signal = nix::sys::signal::Signal::try_from(req.signal as i32).map_err(|_| {
            ShimError::InvalidArgument {
                field: "signal",
                reason: format!("{} is not a signal", req.signal),
            }
        })?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal).map_err(|source| {
            match source {
                nix::Error::ESRCH => finished(),
                source => ShimError::Signal {
                    signal: req.signal,
                    pid: pid as i32,
                    source,
                },
            }
        })
    }

    async fn pids_of(&self, req: PidsRequest) -> Result<PidsResponse, ShimError> {
        let c = self.container(&req.id)?;
        let pids = c.runc.ps(&c.id).await?;
        let execs: HashMap<u32, String> = c
            .execs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|p| (p.state().pid, p.exec_id.clone()))
            .collect();
        let mut resp = PidsResponse::new();
        for pid in pids {
            let mut info = ProcessInfo::new();
            info.pid = pid;
            if let Some(exec_id) = execs.get(&pid) {
                let mut d = ProcessDetails::new();
                d.exec_id = exec_id.clone();
                if let Ok(value) = d.write_to_bytes() {
                    let mut any = Any::new();
                    any.type_url = "containerd.runc.v1.ProcessDetails".into();
                    any.value = value;
                    info.info = MessageField::some(any);
                }
            }
            resp.processes.push(info);
        }
        Ok(resp)
    }

    async fn pause_or_resume(&self, id: &str, pause: bool) -> Result<(), ShimError> {
        let c = self.container(id)?;
        let _order = c.lifecycle.lock().await;
        let status = c.init.state().status;
        let want = if pause {
            ProcStatus::Running
        } else {
            ProcStatus::Paused
        };
        if status != want {
            return Err(ShimError::WrongState {
                id: id.to_string(),
                action: if pause { "pause" } else { "resume" },
                state: status.name(),
            });
        }
        if pause {
            c.runc.pause(id).await?;
            c.init.state().status = ProcStatus::Paused;
            let mut e = TaskPaused::new();
            e.container_id = id.to_string();
            self.publish(topics::TASK_PAUSED_EVENT_TOPIC, &e);
        } else {
            c.runc.resume(id).await?;
            c.init.state().status = ProcStatus::Running;
            let mut e = TaskResumed::new();
            e.container_id = id.to_string();
            self.publish(topics::TASK_RESUMED_EVENT_TOPIC, &e);
        }
        Ok(())
    }

    fn state_of(&self, req: &StateRequest) -> Result<StateResponse, ShimError> {
        let c = self.container(&req.id)?;
        let p = c.proc(&req.exec_id)?;
        let st = p.state();
        let mut resp = StateResponse::new();
        resp.id = if req.exec_id.is_empty() {
            c.id.clone()
        } else {
            p.exec_id.clone()
        };
        resp.exec_id = req.exec_id.clone();
        resp.bundle = c.bundle.display().to_string();
        resp.pid = st.pid;
        resp.status = st.status.pb().into();
        resp.stdin = p.io_spec.stdin.clone();
        resp.stdout = p.io_spec.stdout.clone();
        resp.stderr = p.io_spec.stderr.clone();
        resp.terminal = p.io_spec.terminal;
        if let Some(e) = st.exit {
            resp.exit_status = e.status;
            resp.exited_at = MessageField::some(timestamp(e.at));
        }
        Ok(resp)
    }
}

fn is_not_running(e: &RuncError) -> bool {
    let m = e.to_string();
    m.contains("not running") || m.contains("process already finished")
}

#[async_trait::async_trait]
impl Task for Service {
    async fn state(&self, _: &TtrpcContext, req: StateRequest) -> ttrpc::Result<StateResponse> {
        Ok(self.state_of(&req)?)
    }

    async fn create(
        &self,
        _: &TtrpcContext,
        req: CreateTaskRequest,
    ) -> ttrpc::Result<CreateTaskResponse> {
        let id = req.id.clone();
        self.create_task(req)
            .await
            .map_err(|e| self.failed("create", &id, e))
    }

    async fn start(&self, _: &TtrpcContext, req: StartRequest) -> ttrpc::Result<StartResponse> {
        let id = req.id.clone();
        self.start_task(req)
            .await
            .map_err(|e| self.failed("start", &id, e))
    }

    async fn delete(&self, _: &TtrpcContext, req: DeleteRequest) -> ttrpc::Result<DeleteResponse> {
        let id = req.id.clone();
        self.delete_task(req)
            .await
            .map_err(|e| self.failed("delete", &id, e))
    }

    async fn pids(&self, _: &TtrpcContext, req: PidsRequest) -> ttrpc::Result<PidsResponse> {
        Ok(self.pids_of(req).await?)
    }

    async fn pause(&self, _: &TtrpcContext, req: PauseRequest) -> ttrpc::Result<Empty> {
        self.pause_or_resume(&req.id, true).await?;
        Ok(Empty::new())
    }

    async fn resume(&self, _: &TtrpcContext, req: ResumeRequest) -> ttrpc::Result<Empty> {
        self.pause_or_resume(&req.id, false).await?;
        Ok(Empty::new())
    }

    async fn checkpoint(
        &self,
        _: &TtrpcContext,
        _: containerd_shim_protos::api::CheckpointTaskRequest,
    ) -> ttrpc::Result<Empty> {
        Err(ShimError::Unimplemented("Checkpoint").into())
    }

    async fn kill(&self, _: &TtrpcContext, req: KillRequest) -> ttrpc::Result<Empty> {
        self.kill_process(req).await?;
        Ok(Empty::new())
    }

    async fn exec(&self, _: &TtrpcContext, req: ExecProcessRequest) -> ttrpc::Result<Empty> {
        let id = req.id.clone();
        self.exec_process(req)
            .await
            .map_err(|e| self.failed("exec", &id, e))?;
        Ok(Empty::new())
    }

    async fn resize_pty(&self, _: &TtrpcContext, req: ResizePtyRequest) -> ttrpc::Result<Empty> {
        let c = self.container(&req.id)?;
        let p = c.proc(&req.exec_id)?;
        if let Some(io) = p.io() {
            io.resize(req.width, req.height).map_err(ShimError::from)?;
        }
        Ok(Empty::new())
    }

    async fn close_io(&self, _: &TtrpcContext, req: CloseIORequest) -> ttrpc::Result<Empty> {
        let c = self.container(&req.id)?;
        let p = c.proc(&req.exec_id)?;
        if req.stdin {
            if let Some(io) = p.io() {
                io.close_stdin();
            }
        }
        Ok(Empty::new())
    }

    async fn update(&self, _: &TtrpcContext, req: UpdateTaskRequest) -> ttrpc::Result<Empty> {
        let c = self.container(&req.id)?;
        let resources = req
            .resources
            .as_ref()
            .map(|a| a.value.clone())
            .unwrap_or_default();
        if resources.is_empty() {
            return Err(ShimError::InvalidArgument {
                field: "resources",
                reason: "empty".into(),
            }
            .into());
        }
        c.runc
            .update(&c.id, &resources)
            .await
            .map_err(|e| self.failed("update", &req.id, e.into()))?;
        Ok(Empty::new())
    }

    async fn wait(&self, _: &TtrpcContext, req: WaitRequest) -> ttrpc::Result<WaitResponse> {
        let c = self.container(&req.id)?;
        let p = c.proc(&req.exec_id)?;
        let e = p.wait().await;
        let mut resp = WaitResponse::new();
        resp.exit_status = e.status;
        resp.exited_at = MessageField::some(timestamp(e.at));
        Ok(resp)
    }

    async fn stats(&self, _: &TtrpcContext, req: StatsRequest) -> ttrpc::Result<StatsResponse> {
        let c = self.container(&req.id)?;
        let cg = c.cgroup.as_ref().ok_or_else(|| ShimError::WrongState {
            id: req.id.clone(),
            action: "read the stats of",
            state: "cgroup-less",
        })?;
        let mut resp = StatsResponse::new();
        resp.stats = MessageField::some(cg.metrics().map_err(ShimError::from)?);
        Ok(resp)
    }

    async fn connect(
        &self,
        _: &TtrpcContext,
        req: ConnectRequest,
    ) -> ttrpc::Result<ConnectResponse> {
        let mut resp = ConnectResponse::new();
        resp.shim_pid = std::process::id();
        if let Ok(c) = self.container(&req.id) {
            resp.task_pid = c.init.state().pid;
        }
        Ok(resp)
    }

    async fn shutdown(&self, _: &TtrpcContext, req: ShutdownRequest) -> ttrpc::Result<Empty> {
        // containerd asks after each task's delete; the shim ends with its pod's last one.
        if !req.now && !self.containers().is_empty() {
            return Ok(Empty::new());
        }
        self.inner.shutdown.notify_one();
        Ok(Empty::new())
    }
}

impl Service {
    /// Logs a failed mutating call once, here where it is handled, and maps it.
    fn failed(&self, call: &'static str, id: &str, e: ShimError) -> ttrpc::Error {
        warn!(self.inner.log, "call failed"; "call" => call, "container_id" => id, "error" => %e);
        e.into()
    }
}

/// Whether the spec gives the container a pid namespace of its own (no `path`: a new one).
fn has_own_pid_namespace(config_json: &[u8]) -> bool {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(config_json) else {
        return true;
    };
    v.pointer("/linux/namespaces")
        .and_then(|n| n.as_array())
        .map(|ns| {
            ns.iter().any(|n| {
                n.get("type").and_then(|t| t.as_str()) == Some("pid")
                    && n.get("path")
                        .and_then(|p| p.as_str())
                        .unwrap_or("")
                        .is_empty()
            })
        })
        .unwrap_or(false)
}

/// Mount flags and data of containerd's mount options ([`MountOption`], read as containerd
/// reads them). A propagation change or `loop` is passed on as data, which the kernel refuses:
/// a rootfs mount has no use for either.
fn mount_options(options: &[String]) -> (nix::mount::MsFlags, String) {
    use nix::mount::MsFlags as F;
    let mut flags = F::empty();
    let mut data = Vec::new();
    for o in options {
        match MountOption::parse(o) {
            MountOption::Flags { set, clear } | MountOption::Special { set, clear } => {
                flags = remora_host::mount::apply(flags, set, clear);
            }
            MountOption::Bind { recursive } => {
                flags |= F::MS_BIND;
                if recursive {
                    flags |= F::MS_REC;
                }
            }
            MountOption::Propagation(_) | MountOption::Loop => data.push(o.as_str()),
            MountOption::Data(d) => data.push(d),
        }
    }
    (flags, data.join(","))
}

/// The maps of a user-namespaced pod's rootfs mount (containerd's overlayfs snapshotter adds
/// `uidmap=0:<host>:<len>` and `gidmap=…` options when asked for an idmapped snapshot), and the
/// other options.
fn split_idmap_options(
    options: &[String],
) -> (
    Option<(remora_host::userns::IdMap, remora_host::userns::IdMap)>,
    Vec<String>,
) {
    let (mut uid, mut gid, mut rest) = (None, None, Vec::new());
    for o in options {
        if let Some(v) = o.strip_prefix("uidmap=") {
            uid = Some(v);
        } else if let Some(v) = o.strip_prefix("gidmap=") {
            gid = Some(v);
        } else {
            rest.push(o.clone());
        }
    }
    let maps = match (uid, gid) {
        (Some(u), Some(g)) => {
            remora_host::userns::IdMap::parse(u).zip(remora_host::userns::IdMap::parse(g))
        }
        _ => None,
    };
    (maps, rest)
}

/// An idmapped rootfs mount, as containerd's mount code makes it for its Go shim: for overlay,
/// each lower layer is bound read-only and idmapped through a user namespace with the maps
/// (Linux 5.19 lets overlayfs stack on idmapped layers) under `scratch`, the overlay is mounted
/// over those, and the idmapped binds are detached (the overlay holds what it needs); a bind
/// mount is itself made idmapped. The upper layer is not idmapped: the pod's root writes as
/// its host ID (the snapshotter chowned the upper root to it).
fn mount_idmapped(
    id: &str,
    m: &containerd_shim_protos::types::mount::Mount,
    options: &[String],
    maps: (remora_host::userns::IdMap, remora_host::userns::IdMap),
    target: &Path,
    scratch: &Path,
) -> Result<(), ShimError> {
    use nix::mount::mount;
    let idmap_err = |source| ShimError::Idmap {
        id: id.to_string(),
        source,
    };
    let helper =
        remora_host::userns::UsernsHelper::spawn(maps.0, maps.1, false).map_err(idmap_err)?;
    let userns = helper.userns_fd().map_err(idmap_err)?;
    let (flags, _) = mount_options(options);
    if m.type_ != "overlay" {
        return remora_host::userns::idmapped_bind(
            Path::new(&m.source),
            target,
            &userns,
            flags.contains(nix::mount::MsFlags::MS_RDONLY),
        )
        .map_err(idmap_err);
    }
    // Held until the overlay is mounted over them (or it failed); dropped, they detach.
    let mut layers = Vec::new();
    let result = (|| {
        let mut rewritten = Vec::with_capacity(options.len());
        for o in options {
            let Some(lower) = o.strip_prefix("lowerdir=") else {
                rewritten.push(o.clone());
                continue;
            };
            let (bound, lowerdir) = remora_host::userns::IdmappedLayers::bind(
                lower,
                &userns,
                &scratch.join(layers.len().to_string()),
            )
            .map_err(idmap_err)?;
            layers.push(bound);
            rewritten.push(format!("lowerdir={lowerdir}"));
        }
        let (flags, data) = mount_options(&rewritten);
        mount(
            Some(m.source.as_str()),
            target,
            Some("overlay"),
            flags,
            Some(data.as_str()),
        )
        .map_err(|source| ShimError::Rootfs {
            id: id.to_string(),
            op: "mount",
            target: target.display().to_string(),
            source,
        })
    })();
    drop(layers);
    let _ = std::fs::remove_dir(scratch);
    result
}

/// Mounts the rootfs containerd prepared (overlay or bind mounts, in order) on `target`.
fn mount_rootfs(
    id: &str,
    mounts: &[containerd_shim_protos::types::mount::Mount],
    target: &Path,
) -> Result<(), ShimError> {
    use nix::mount::{mount, MsFlags};
    let fail = |source| ShimError::Rootfs {
        id: id.to_string(),
        op: "mount",
        target: target.display().to_string(),
        source,
    };
    if let Err(e) = std::fs::create_dir(target) {
        if e.kind() != std::io::ErrorKind::AlreadyExists {
            return Err(ShimError::BundleFile {
                path: target.display().to_string(),
                source: e,
            });
        }
    }
    for (done, m) in mounts.iter().enumerate() {
        if let (Some(maps), options) = split_idmap_options(&m.options) {
            let scratch = target.with_file_name(format!("idmapped-layers-{done}"));
            if let Err(e) = mount_idmapped(id, m, &options, maps, target, &scratch) {
                for _ in 0..done {
                    let _ = nix::mount::umount2(target, nix::mount::MntFlags::MNT_DETACH);
                }
                return Err(e);
            }
            continue;
        }
        let (flags, data) = mount_options(&m.options);
        let data = (!data.is_empty()).then_some(data.as_str());
        let kind = (!m.type_.is_empty()).then_some(m.type_.as_str());
        let r = mount(Some(m.source.as_str()), target, kind, flags, data).and_then(|()| {
            // A read-only bind mount takes a remount to become read-only.
            if flags.contains(MsFlags::MS_BIND) && flags.contains(MsFlags::MS_RDONLY) {
                mount(
                    None::<&str>,
                    target,
                    None::<&str>,
                    flags | MsFlags::MS_REMOUNT,
                    None::<&str>,
                )
            } else {
                Ok(())
            }
        });
        if let Err(e) = r {
            for _ in 0..done {
                let _ = nix::mount::umount2(target, nix::mount::MntFlags::MNT_DETACH);
            }
            return Err(fail(e));
        }
    }
    Ok(())
}

fn unmount(id: &str, target: &Path) -> Result<(), ShimError> {
    match nix::mount::umount2(target, nix::mount::MntFlags::MNT_DETACH) {
        Ok(()) | Err(nix::Error::EINVAL) | Err(nix::Error::ENOENT) => Ok(()),
        Err(source) => Err(ShimError::Rootfs {
            id: id.to_string(),
            op: "unmount",
            target: target.display().to_string(),
            source,
        }),
    }
}

fn read_file(path: &Path) -> Result<Vec<u8>, ShimError> {
    std::fs::read(path).map_err(|source| ShimError::BundleFile {
        path: path.display().to_string(),
        source,
    })
}

fn write_json<T: serde::Serialize>(path: &Path, value: &T) -> Result<(), ShimError> {
    let bytes = serde_json::to_vec(value).map_err(|e| ShimError::BundleFile {
        path: path.display().to_string(),
        source: std::io::Error::other(e),
    })?;
    std::fs::write(path, bytes).map_err(|source| ShimError::BundleFile {
        path: path.display().to_string(),
        source,
    })
}

/// Exec ids are up to 64 bytes: pid files stay short.
fn short(exec_id: &str) -> String {
    exec_id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .take(32)
        .collect()
}

fn to_ns(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

pub(crate) fn timestamp(t: SystemTime) -> Timestamp {
    timestamp_ns(to_ns(t))
}

pub(crate) fn timestamp_ns(ns: i64) -> Timestamp {
    let mut ts = Timestamp::new();
    ts.seconds = ns.div_euclid(1_000_000_000);
    ts.nanos = ns.rem_euclid(1_000_000_000) as i32;
    ts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn any(type_url: &str, value: Vec<u8>) -> Any {
        let mut a = Any::new();
        a.type_url = type_url.into();
        a.value = value;
        a
    }

    #[test]
    fn runc_options_name_the_binary_root_and_cgroup_driver() {
        let mut o = RuncOptions::new();
        o.binary_name = "crun".into();
        o.root = "/run/tb/runc".into();
        o.systemd_cgroup = true;
        let a = any("containerd.runc.v1.Options", o.write_to_bytes().unwrap());
        let r = RuntimeOptions::from_any(Some(&a)).unwrap();
        assert_eq!(r.binary(), PathBuf::from("crun"));
        assert_eq!(r.root_for("k8s.io"), PathBuf::from("/run/tb/runc/k8s.io"));
        assert!(r.systemd_cgroup);

        let none = RuntimeOptions::from_any(None).unwrap();
        assert_eq!(none.binary(), PathBuf::from("runc"));
        assert_eq!(
            none.root_for("ns"),
            PathBuf::from("/run/containerd/runc/ns")
        );
    }

    #[test]
    fn containerd_cri_runtimeoptions_carry_the_options_table_as_toml() {
        // runtimeoptions.v1.Options { type_url = 1; config_path = 2; config_body = 3; }
        let body = "BinaryName = \"crun\"\nRoot = \"/r\"\nSystemdCgroup = false\n";
        let mut bytes = vec![0x0a, 3, b'a', b'b', b'c', 0x1a, body.len() as u8];
        bytes.extend_from_slice(body.as_bytes());
        let a = any("runtimeoptions.v1.Options", bytes);
        let r = RuntimeOptions::from_any(Some(&a)).unwrap();
        assert_eq!(r.binary_name, "crun");
        assert_eq!(r.root, "/r");
        assert!(!r.systemd_cgroup);

        let bad = any("example.com/Other", vec![]);
        assert!(matches!(
            RuntimeOptions::from_any(Some(&bad)),
            Err(ShimError::InvalidArgument { .. })
        ));
        let garbage = any("containerd.runc.v1.Options", vec![0xff, 0xff, 0xff]);
        assert!(RuntimeOptions::from_any(Some(&garbage)).is_err());
    }

    #[test]
    fn kill_all_on_exit_only_without_an_own_pid_namespace() {
        let own = br#"{"linux":{"namespaces":[{"type":"pid"},{"type":"mount"}]}}"#;
        let shared = br#"{"linux":{"namespaces":[{"type":"pid","path":"/proc/1/ns/pid"}]}}"#;
        let host = br#"{"linux":{"namespaces":[{"type":"mount"}]}}"#;
        assert!(has_own_pid_namespace(own));
        assert!(!has_own_pid_namespace(shared));
        assert!(!has_own_pid_namespace(host));
    }

    #[test]
    fn mount_options_split_into_flags_and_data() {
        use nix::mount::MsFlags as F;
        let opts: Vec<String> = [
            "ro",
            "rbind",
            "nosuid",
            "lowerdir=/a:/b",
            "defaults",
            "upperdir=/u",
            "rw",
            "remount",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let (flags, data) = mount_options(&opts);
        assert_eq!(flags, F::MS_BIND | F::MS_REC | F::MS_NOSUID | F::MS_REMOUNT);
        // `defaults` is no data (containerd's reading): the kernel would refuse it.
        assert_eq!(data, "lowerdir=/a:/b,upperdir=/u");
    }

    #[test]
    fn timestamps_split_nanoseconds() {
        let t = timestamp_ns(1_500_000_000_123);
        assert_eq!((t.seconds, t.nanos), (1500, 123));
        assert_eq!(short("abc/../def-01_x"), "abcdef-01_x");
    }

    #[test]
    fn exit_records_round_trip_through_the_bundle() {
        let dir = tempfile::tempdir().unwrap();
        let r = ExitRecord {
            pid: 42,
            status: 137,
            exited_at_ns: 7,
            oom_killed: true,
        };
        write_json(&dir.path().join(EXIT_FILE), &r).unwrap();
        let back: ExitRecord =
            serde_json::from_slice(&std::fs::read(dir.path().join(EXIT_FILE)).unwrap()).unwrap();
        assert_eq!(back, r);
    }
}
