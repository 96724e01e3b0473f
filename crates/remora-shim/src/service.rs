//! The task service (`containerd.task.v3.Task`): the ttrpc adapter over [`Tasks`], where the
//! containers, their processes and their events live (`crate::task`, with the state diagram
//! and the event order).
//!
//! Each call unpacks its request into plain arguments, calls [`Tasks`], and packs the answer.
//! A [`ShimError`] becomes a ttrpc status in one place (`From<ShimError> for ttrpc::Error`);
//! the calls that change a container (Create, Start, Delete, Exec, Update's runtime call) log
//! their failure once, here, where it is handled.

use std::sync::Arc;

use containerd_shim_protos::api::{
    CloseIORequest, ConnectRequest, ConnectResponse, CreateTaskRequest, CreateTaskResponse,
    DeleteRequest, DeleteResponse, Empty, ExecProcessRequest, KillRequest, PauseRequest,
    PidsRequest, PidsResponse, ResizePtyRequest, ResumeRequest, ShutdownRequest, StartRequest,
    StartResponse, StateRequest, StateResponse, StatsRequest, StatsResponse, UpdateTaskRequest,
    WaitRequest, WaitResponse,
};
use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::protobuf::{Message, MessageField};
use containerd_shim_protos::shim::oci::ProcessDetails;
use containerd_shim_protos::shim_async::Task;
use containerd_shim_protos::ttrpc::{self, r#async::TtrpcContext};
use containerd_shim_protos::types::task::ProcessInfo;
use slog::{warn, Logger};
use tokio::sync::Notify;

use super::error::ShimError;
use super::process::timestamp;
use super::publisher::Publisher;
use super::reaper::Reaper;
use super::task::ports::RuncRuntimes;
use super::task::{NewExec, NewTask, Tasks};

/// The task service; cheap to clone.
#[derive(Clone)]
pub struct Service {
    tasks: Tasks,
    shutdown: Arc<Notify>,
    log: Logger,
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
        let tasks = Tasks::new(
            namespace,
            Arc::new(publisher),
            Arc::new(reaper.clone()),
            Arc::new(RuncRuntimes { reaper }),
            log.clone(),
        );
        Service::over(tasks, shutdown, log)
    }

    /// The service over `tasks`.
    pub(crate) fn over(tasks: Tasks, shutdown: Arc<Notify>, log: Logger) -> Service {
        Service {
            tasks,
            shutdown,
            log,
        }
    }

    /// Logs a failed mutating call once, here where it is handled, and maps it.
    fn failed(&self, call: &'static str, id: &str, e: ShimError) -> ttrpc::Error {
        warn!(self.log, "call failed"; "call" => call, "container_id" => id, "error" => %e);
        e.into()
    }
}

#[async_trait::async_trait]
impl Task for Service {
    async fn state(&self, _: &TtrpcContext, req: StateRequest) -> ttrpc::Result<StateResponse> {
        let v = self.tasks.state(&req.id, &req.exec_id)?;
        let mut resp = StateResponse::new();
        resp.id = v.id;
        resp.exec_id = v.exec_id;
        resp.bundle = v.bundle;
        resp.pid = v.pid;
        resp.status = v.status.pb().into();
        resp.stdin = v.io.stdin;
        resp.stdout = v.io.stdout;
        resp.stderr = v.io.stderr;
        resp.terminal = v.io.terminal;
        if let Some(e) = v.exit {
            resp.exit_status = e.status;
            resp.exited_at = MessageField::some(timestamp(e.at));
        }
        Ok(resp)
    }

    async fn create(
        &self,
        _: &TtrpcContext,
        req: CreateTaskRequest,
    ) -> ttrpc::Result<CreateTaskResponse> {
        let id = req.id.clone();
        let task = NewTask {
            id: req.id,
            bundle: req.bundle,
            rootfs: req.rootfs,
            stdin: req.stdin,
            stdout: req.stdout,
            stderr: req.stderr,
            terminal: req.terminal,
            options: req.options.into_option(),
            checkpoint: req.checkpoint,
        };
        let pid = self
            .tasks
            .create(task)
            .await
            .map_err(|e| self.failed("create", &id, e))?;
        let mut resp = CreateTaskResponse::new();
        resp.pid = pid;
        Ok(resp)
    }

    async fn start(&self, _: &TtrpcContext, req: StartRequest) -> ttrpc::Result<StartResponse> {
        let pid = self
            .tasks
            .start(&req.id, &req.exec_id)
            .await
            .map_err(|e| self.failed("start", &req.id, e))?;
        let mut resp = StartResponse::new();
        resp.pid = pid;
        Ok(resp)
    }

    async fn delete(&self, _: &TtrpcContext, req: DeleteRequest) -> ttrpc::Result<DeleteResponse> {
        let d = self
            .tasks
            .delete(&req.id, &req.exec_id)
            .await
            .map_err(|e| self.failed("delete", &req.id, e))?;
        let mut resp = DeleteResponse::new();
        resp.pid = d.pid;
        resp.exit_status = d.exit.status;
        resp.exited_at = MessageField::some(timestamp(d.exit.at));
        Ok(resp)
    }

    async fn pids(&self, _: &TtrpcContext, req: PidsRequest) -> ttrpc::Result<PidsResponse> {
        let mut resp = PidsResponse::new();
        for p in self.tasks.pids(&req.id).await? {
            let mut info = ProcessInfo::new();
            info.pid = p.pid;
            if let Some(exec_id) = p.exec_id {
                let mut d = ProcessDetails::new();
                d.exec_id = exec_id;
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

    async fn pause(&self, _: &TtrpcContext, req: PauseRequest) -> ttrpc::Result<Empty> {
        self.tasks.pause_or_resume(&req.id, true).await?;
        Ok(Empty::new())
    }

    async fn resume(&self, _: &TtrpcContext, req: ResumeRequest) -> ttrpc::Result<Empty> {
        self.tasks.pause_or_resume(&req.id, false).await?;
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
        self.tasks
            .kill(&req.id, &req.exec_id, req.signal, req.all)
            .await?;
        Ok(Empty::new())
    }

    async fn exec(&self, _: &TtrpcContext, req: ExecProcessRequest) -> ttrpc::Result<Empty> {
        let id = req.id.clone();
        let exec = NewExec {
            id: req.id,
            exec_id: req.exec_id,
            stdin: req.stdin,
            stdout: req.stdout,
            stderr: req.stderr,
            terminal: req.terminal,
            spec: req.spec.into_option().map(|a| a.value).unwrap_or_default(),
        };
        self.tasks
            .exec(exec)
            .await
            .map_err(|e| self.failed("exec", &id, e))?;
        Ok(Empty::new())
    }

    async fn resize_pty(&self, _: &TtrpcContext, req: ResizePtyRequest) -> ttrpc::Result<Empty> {
        self.tasks
            .resize_pty(&req.id, &req.exec_id, req.width, req.height)?;
        Ok(Empty::new())
    }

    async fn close_io(&self, _: &TtrpcContext, req: CloseIORequest) -> ttrpc::Result<Empty> {
        self.tasks.close_io(&req.id, &req.exec_id, req.stdin)?;
        Ok(Empty::new())
    }

    async fn update(&self, _: &TtrpcContext, req: UpdateTaskRequest) -> ttrpc::Result<Empty> {
        let resources = req.resources.into_option().map(|a| a.value);
        match self
            .tasks
            .update(&req.id, &resources.unwrap_or_default())
            .await
        {
            Ok(()) => Ok(Empty::new()),
            // The runtime's failure is logged; a refused request is only answered.
            Err(e @ ShimError::Runc(_)) => Err(self.failed("update", &req.id, e)),
            Err(e) => Err(e.into()),
        }
    }

    async fn wait(&self, _: &TtrpcContext, req: WaitRequest) -> ttrpc::Result<WaitResponse> {
        let e = self.tasks.wait(&req.id, &req.exec_id).await?;
        let mut resp = WaitResponse::new();
        resp.exit_status = e.status;
        resp.exited_at = MessageField::some(timestamp(e.at));
        Ok(resp)
    }

    async fn stats(&self, _: &TtrpcContext, req: StatsRequest) -> ttrpc::Result<StatsResponse> {
        let mut resp = StatsResponse::new();
        resp.stats = MessageField::some(self.tasks.stats(&req.id)?);
        Ok(resp)
    }

    async fn connect(
        &self,
        _: &TtrpcContext,
        req: ConnectRequest,
    ) -> ttrpc::Result<ConnectResponse> {
        let mut resp = ConnectResponse::new();
        resp.shim_pid = std::process::id();
        if let Some(pid) = self.tasks.task_pid(&req.id) {
            resp.task_pid = pid;
        }
        Ok(resp)
    }

    async fn shutdown(&self, _: &TtrpcContext, req: ShutdownRequest) -> ttrpc::Result<Empty> {
        // containerd asks after each task's delete; the shim ends with its pod's last one.
        if !req.now && !self.tasks.is_empty() {
            return Ok(Empty::new());
        }
        self.shutdown.notify_one();
        Ok(Empty::new())
    }
}

#[cfg(test)]
mod tests;
