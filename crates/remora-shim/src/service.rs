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
//! A pod holder (the task of a pod without a pause container, `crate::bundle::is_pod_holder`)
//! goes through the same records without a process: Create and Start call no OCI runtime, a
//! kill ends it with 128 + the signal, Delete forgets it. It keeps the shim, and with it the
//! pod's containers, until the pod stops.
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
use containerd_shim_protos::protobuf::{Message, MessageField};
use containerd_shim_protos::shim::oci::ProcessDetails;
use containerd_shim_protos::shim_async::Task;
use containerd_shim_protos::ttrpc::{self, r#async::TtrpcContext};
use containerd_shim_protos::types::task::ProcessInfo;
use slog::{debug, info, o, warn, Logger};
use tokio::sync::{mpsc, oneshot, Notify};

use super::bundle::{
    has_own_pid_namespace, is_pod_holder, read_file, write_json, ExitRecord, EXIT_FILE,
    OPTIONS_FILE,
};
use super::cgroup::{Cgroup, CgroupReadings};
use super::error::ShimError;
use super::io::{IoSpec, ProcessIo};
use super::oom::OomWatch;
use super::options::RuntimeOptions;
use super::process::{timestamp, to_ns, Container, Exited, Proc, ProcStatus};
use super::publisher::{Publisher, TaskEvent};
use super::reaper::{Exit, Reaper};
use super::rootfs::{mount_rootfs, unmount};
use super::runc::{CreateOpts, ExecOpts, Runc, RuncError};

/// How long an exit waits for its process's output to drain before TaskExit goes out anyway
/// (a grandchild may hold the pipe open for ever).
const IO_DRAIN: Duration = Duration::from_secs(2);
/// Console sockets: a short directory, as a unix socket path must stay under 108 bytes and a
/// bundle path alone is about 100.
pub(crate) const CONSOLE_DIR: &str = "/run/remora-shim";

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

    fn publish<E: TaskEvent>(&self, event: &E) {
        self.inner.publisher.publish(event);
    }

    /// Publishes one TaskOOM when the container's OOM-kill count grew past what was reported.
    fn report_ooms(&self, c: &Container, kills: u64) {
        let mut reported = c.ooms_reported.lock().unwrap_or_else(|p| p.into_inner());
        if kills > *reported {
            *reported = kills;
            let mut e = TaskOOM::new();
            e.container_id = c.id.clone();
            self.publish(&e);
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
        if is_pod_holder(&config) {
            return Ok(self.create_holder(id, bundle, &req, &opts, &log));
        }
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
            holder: false,
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
        self.publish(&e);
        // After TaskCreate: the exit task publishes only after it.
        self.watch_exit(c, init, pid, spawned_at);
        info!(log, "container created"; "pid" => pid);
        let mut resp = CreateTaskResponse::new();
        resp.pid = pid;
        Ok(resp)
    }

    /// Create of a pod holder: a task that runs nothing (no rootfs, no OCI runtime call) and
    /// keeps this shim — and the containers containerd puts in it by the pod's id — until the
    /// pod is stopped. Its pid is the shim's own.
    fn create_holder(
        &self,
        id: String,
        bundle: PathBuf,
        req: &CreateTaskRequest,
        opts: &RuntimeOptions,
        log: &Logger,
    ) -> CreateTaskResponse {
        let pid = std::process::id();
        let init = Arc::new(Proc::new(
            String::new(),
            IoSpec {
                stdin: String::new(),
                stdout: String::new(),
                stderr: String::new(),
                terminal: false,
                owner: None,
            },
            Vec::new(),
        ));
        init.state().pid = pid;
        let c = Arc::new(Container {
            id: id.clone(),
            bundle,
            runc: Runc::new(
                opts.binary(),
                opts.root_for(&self.inner.namespace),
                opts.systemd_cgroup,
                self.inner.reaper.clone(),
                log.clone(),
            ),
            rootfs_mounted: false,
            kill_all_on_exit: false,
            lifecycle: tokio::sync::Mutex::new(()),
            init,
            execs: Mutex::new(HashMap::new()),
            cgroup: None,
            oom_watch: Mutex::new(None),
            ooms_reported: Mutex::new(0),
            io_owner: None,
            holder: true,
        });
        self.containers().insert(id.clone(), c);
        let mut e = TaskCreate::new();
        e.container_id = id;
        e.bundle = req.bundle.clone();
        e.pid = pid;
        self.publish(&e);
        info!(log, "pod holder created (no process)"; "pid" => pid);
        let mut resp = CreateTaskResponse::new();
        resp.pid = pid;
        resp
    }

    /// A pod holder killed (any signal but 0): it ends at once with 128 + the signal, as a
    /// pause process would, and its TaskExit goes out under its lifecycle lock.
    async fn stop_holder(&self, c: &Container, signal: u32) {
        let _order = c.lifecycle.lock().await;
        let exited = Exited {
            status: 128 + signal,
            at: SystemTime::now(),
        };
        let pid = {
            let mut st = c.init.state();
            if st.status == ProcStatus::Stopped {
                return;
            }
            st.status = ProcStatus::Stopped;
            st.exit = Some(exited);
            st.pid
        };
        let record = ExitRecord {
            pid,
            status: exited.status,
            exited_at_ns: to_ns(exited.at),
            oom_killed: false,
        };
        if let Err(e) = write_json(&c.bundle.join(EXIT_FILE), &record) {
            warn!(self.inner.log, "exit not recorded in the bundle"; "container_id" => &c.id, "error" => %e);
        }
        let mut e = TaskExit::new();
        e.container_id = c.id.clone();
        e.id = c.id.clone();
        e.pid = pid;
        e.exit_status = exited.status;
        e.exited_at = MessageField::some(timestamp(exited.at));
        self.publish(&e);
        c.init.exited.send_replace(Some(exited));
        info!(self.inner.log, "pod holder stopped"; "container_id" => &c.id, "signal" => signal);
    }

    /// Refuses what needs a process of a pod holder's.
    fn holder_has_no_process(c: &Container, action: &'static str) -> Result<(), ShimError> {
        if c.holder {
            return Err(ShimError::WrongState {
                id: c.id.clone(),
                action,
                state: "a pod holder, which runs no process",
            });
        }
        Ok(())
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
        self.publish(&e);
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
            if !c.holder {
                c.runc.start(&c.id).await?;
            }
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
            self.publish(&e);
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
            self.publish(&e);
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
        if !c.holder {
            match c.runc.delete(&c.id, status == ProcStatus::Created).await {
                Ok(()) | Err(RuncError::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
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
        self.publish(&e);
        info!(self.inner.log, "container deleted"; "container_id" => &c.id);
        Ok(resp)
    }

    async fn exec_process(&self, req: ExecProcessRequest) -> Result<(), ShimError> {
        let c = self.container(&req.id)?;
        Self::holder_has_no_process(&c, "exec in")?;
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
        self.publish(&e);
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
        if req.exec_id.is_empty() && c.holder {
            // Signal 0 asks whether it is there; any other ends it.
            if req.signal != 0 {
                self.stop_holder(&c, req.signal).await;
            }
            return Ok(());
        }
        if req.exec_id.is_empty() {
            return match c.runc.kill(&c.id, req.signal, req.all).await {
                Ok(()) => Ok(()),
                // The init process died between our check and runc's: it is finished.
                Err(RuncError::NotFound { .. }) => Err(finished()),
                Err(e) if e.is_not_running() => Err(finished()),
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
        if c.holder {
            return Ok(PidsResponse::new());
        }
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
        Self::holder_has_no_process(&c, if pause { "pause" } else { "resume" })?;
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
            self.publish(&e);
        } else {
            c.runc.resume(id).await?;
            c.init.state().status = ProcStatus::Running;
            let mut e = TaskResumed::new();
            e.container_id = id.to_string();
            self.publish(&e);
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
        Self::holder_has_no_process(&c, "update the resources of")?;
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

/// Exec ids are up to 64 bytes: pid files stay short.
fn short(exec_id: &str) -> String {
    exec_id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .take(32)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_pid_files_keep_a_short_safe_name() {
        assert_eq!(short("abc/../def-01_x"), "abcdef-01_x");
    }
}
