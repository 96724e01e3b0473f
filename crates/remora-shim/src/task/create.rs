//! Create: a container's init process created through the OCI runtime, its IO, cgroup and OOM
//! watch set up, and TaskCreate sent before its exit can be; or a pod holder's record, which
//! runs nothing. A failure after the runtime's create rolls the container back.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use containerd_shim_protos::events::task::{TaskCreate, TaskIO};
use containerd_shim_protos::protobuf::MessageField;
use slog::{info, o, warn, Logger};

use super::{Event, NewTask, OciRuntime, Tasks, CONSOLE_DIR};
use crate::bundle::{has_own_pid_namespace, is_pod_holder, read_file, write_json, OPTIONS_FILE};
use crate::cgroup::{Cgroup, CgroupReadings};
use crate::error::ShimError;
use crate::io::{IoSpec, ProcessIo};
use crate::oom::OomWatch;
use crate::options::RuntimeOptions;
use crate::process::{Container, Proc};
use crate::rootfs::{mount_rootfs, unmount};
use crate::runc::CreateOpts;

impl Tasks {
    /// Create: the container's init process created through the OCI runtime (or a pod
    /// holder's record); its pid.
    pub(crate) async fn create(&self, req: NewTask) -> Result<u32, ShimError> {
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
        let runc = self
            .inner
            .runtimes
            .runtime(&opts, &self.inner.namespace, &log);
        let created = self
            .run_init(&id, &bundle, runc.as_ref(), &opts, &req, &log)
            .await;
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
        self.publish(Event::Create(e));
        // After TaskCreate: the exit task publishes only after it.
        self.watch_exit(c, init, pid, spawned_at);
        info!(log, "container created"; "pid" => pid);
        Ok(pid)
    }

    /// Create of a pod holder: a task that runs nothing (no rootfs, no OCI runtime call) and
    /// keeps this shim — and the containers containerd puts in it by the pod's id — until the
    /// pod is stopped. Its pid is the shim's own.
    fn create_holder(
        &self,
        id: String,
        bundle: PathBuf,
        req: &NewTask,
        opts: &RuntimeOptions,
        log: &Logger,
    ) -> u32 {
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
            runc: self
                .inner
                .runtimes
                .runtime(opts, &self.inner.namespace, log),
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
        self.publish(Event::Create(e));
        info!(log, "pod holder created (no process)"; "pid" => pid);
        pid
    }

    async fn run_init(
        &self,
        id: &str,
        bundle: &Path,
        runc: &dyn OciRuntime,
        opts: &RuntimeOptions,
        req: &NewTask,
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
}
