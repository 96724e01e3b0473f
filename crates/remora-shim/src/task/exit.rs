//! Exits and OOM kills: each process's exit awaited and reported (its output drained first,
//! under its container's lifecycle lock, after a last look at the OOM-kill counter for an
//! init), OOM kills reported as the containers' watches wake up, and a pod holder's end.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use containerd_shim_protos::events::task::{TaskExit, TaskOOM};
use containerd_shim_protos::protobuf::MessageField;
use slog::{debug, info, o, warn};
use tokio::sync::{mpsc, oneshot};

use super::{Event, Tasks, IO_DRAIN};
use crate::bundle::{write_json, ExitRecord, EXIT_FILE};
use crate::cgroup::CgroupReadings;
use crate::io::ProcessIo;
use crate::process::{timestamp, to_ns, Container, Exited, Proc, ProcStatus};
use crate::reaper::Exit;

impl Tasks {
    /// Reports the OOM kills the containers' watches wake up for.
    pub(super) fn spawn_oom_reports(self, mut oom_rx: mpsc::UnboundedReceiver<String>) {
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

    /// Publishes one TaskOOM when the container's OOM-kill count grew past what was reported.
    fn report_ooms(&self, c: &Container, kills: u64) {
        let mut reported = c.ooms_reported.lock().unwrap_or_else(|p| p.into_inner());
        if kills > *reported {
            *reported = kills;
            let mut e = TaskOOM::new();
            e.container_id = c.id.clone();
            self.publish(Event::Oom(e));
            info!(self.inner.log, "container OOM-killed"; "container_id" => &c.id, "oom_kills" => kills);
        }
    }

    /// A pod holder killed (any signal but 0): it ends at once with 128 + the signal, as a
    /// pause process would, and its TaskExit goes out under its lifecycle lock.
    pub(super) async fn stop_holder(&self, c: &Container, signal: u32) {
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
        self.publish(Event::Exit(e));
        c.init.exited.send_replace(Some(exited));
        info!(self.inner.log, "pod holder stopped"; "container_id" => &c.id, "signal" => signal);
    }

    /// Reaps a `binary://` logger when it exits (the reaper takes every child).
    pub(super) fn watch_logger(&self, io: &ProcessIo) {
        if let Some(pid) = io.logger_pid() {
            let rx = self.inner.exits.watch(pid);
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
    pub(super) fn watch_exit(
        &self,
        c: Arc<Container>,
        p: Arc<Proc>,
        pid: u32,
        spawned_at: Instant,
    ) {
        let rx: oneshot::Receiver<Exit> = self.inner.exits.watch_spawned(pid as i32, spawned_at);
        let tasks = self.clone();
        tokio::spawn(async move {
            let Ok(exit) = rx.await else {
                // The reaper is gone only when the shim ends.
                return;
            };
            tasks.on_exit(&c, &p, exit).await;
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
        self.publish(Event::Exit(e));
        p.exited.send_replace(Some(exited));
        info!(log, "process exited"; "pid" => exit.pid, "status" => exit.status);
    }
}
