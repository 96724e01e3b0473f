//! StartContainer: FIFOs and the CRI log opened, the task created from the rootfs snapshot
//! and started, the exit monitor attached.
//!
//! A failed start leaves the container EXITED with the reason (CRI has no way back to
//! CREATED); the task and FIFOs it made are removed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use slog::info;

use super::backend::{RuncOptions, TaskSpec};
use super::container_events::EventKind;
use super::timing::Steps;
use super::{now_ns, ContainerError, ContainerIo, Pods};
use crate::io::{copy_stream, split_log_path, FifoSet, FifoSpec, LogWriter, StreamKind};
use crate::spec::{IdMapping, UserNamespace};
use crate::store::{Container, ContainerUser, SandboxState};

impl Pods {
    /// StartContainer.
    pub async fn start_container(self: &Arc<Self>, id: &str) -> Result<(), ContainerError> {
        let container = self.containers_store.get(id)?;
        let me = self.clone();
        tokio::spawn(async move {
            container.begin_start()?;
            let result = me.start_inner(&container).await;
            if let Err(e) = &result {
                let _ = container.start_failed(&e.to_string(), now_ns());
                // Plugins that saw it created hear that it stopped, as containerd and CRI-O
                // tell them of a failed start.
                me.nri_stop_container(&container.snapshot()).await;
                let cid = container.id().to_string();
                let _ = me.tasks.delete(&cid).await;
                if let Some(io) = me.io.remove(&cid) {
                    let _ = io.fifos.remove();
                }
            }
            result
        })
        .await
        .map_err(ContainerError::Aborted)?
    }

    async fn start_inner(self: &Arc<Self>, container: &Container) -> Result<(), ContainerError> {
        let id = container.id().to_string();
        let mut steps = Steps::start();
        let meta = container.metadata().clone();
        let sandbox = self.sandboxes.get(&meta.sandbox_id)?;
        if sandbox.status().state != SandboxState::Ready {
            return Err(ContainerError::SandboxNotReady(meta.sandbox_id.clone()));
        }
        // The task runs under the pod's handler's shim binary, if the handler names one.
        let handler = self.pod_runtime(sandbox.id(), &sandbox.metadata().runtime_handler)?;
        let runtime_path = handler.runtime_path.clone();
        let options = io_owner(
            sandbox.metadata().namespace_options.user.as_ref(),
            meta.user.as_ref(),
        )
        .map(|(io_uid, io_gid)| RuncOptions {
            io_uid,
            io_gid,
            ..handler.runtime.options.clone().unwrap_or_default()
        });
        steps.mark("lookup");
        let dir = self.io_dir(&id);
        let fifos = FifoSet::create(
            &dir,
            &id,
            FifoSpec {
                stdin: meta.stdin,
                tty: meta.tty,
            },
        )
        .map_err(|e| ContainerError::Fifo {
            action: "create FIFOs in",
            path: dir.clone(),
            source: e,
        })?;
        // Without a log path the output is not kept, but still drained (the container never
        // blocks on a full pipe) and fanned out to attach sessions.
        let log = Arc::new(if meta.log_path.is_empty() {
            LogWriter::fanout_only()
        } else {
            // Opened from the pod's log directory: a symlinked `<container>/` below it is
            // refused, not followed.
            let log_directory = sandbox.metadata().log_directory.clone();
            let (dir, relative) =
                split_log_path(Path::new(&log_directory), Path::new(&meta.log_path));
            LogWriter::open_in(dir, relative, Some(crate::io::DEFAULT_MAX_LINE_SIZE))
                .await
                .map_err(|e| ContainerError::Log {
                    action: "open the log file",
                    path: PathBuf::from(&meta.log_path),
                    source: e,
                })?
        });
        // Open our read ends before the shim opens its write ends; copy into the CRI log.
        let mut copiers = Vec::new();
        let streams: &[StreamKind] = if meta.tty {
            &[StreamKind::Stdout]
        } else {
            &[StreamKind::Stdout, StreamKind::Stderr]
        };
        for &stream in streams {
            let reader = match stream {
                StreamKind::Stdout => fifos.open_stdout(),
                StreamKind::Stderr => fifos.open_stderr(),
            }
            .map_err(|e| ContainerError::Fifo {
                action: "open FIFO in",
                path: dir.clone(),
                source: e,
            })?;
            copiers.push(copy_stream(reader, stream, log.clone()));
        }
        let io = Arc::new(ContainerIo::new(fifos, Some(log)));
        self.io.insert(&id, io.clone());
        steps.mark("io");

        let stdio = io.fifos.task_stdio();
        let mounts = self.snapshots.mounts(&self.snapshotter, &id).await?;
        steps.mark("mounts");
        self.tasks
            .create(TaskSpec {
                container_id: id.clone(),
                rootfs: mounts,
                stdin: stdio.stdin,
                stdout: stdio.stdout,
                stderr: stdio.stderr,
                terminal: stdio.terminal,
                runtime_path,
                options,
            })
            .await?;
        steps.mark("task_create");
        // NRI's StartContainer, between the task's create and its start, as in containerd: a
        // refusal fails the call (the caller above deletes the task).
        let nri_pod = self.nri().map(|nri| (nri.clone(), sandbox.snapshot()));
        if let Some((nri, pod)) = &nri_pod {
            nri.start_container(pod, &container.snapshot()).await?;
            steps.mark("nri");
        }
        // Before the start: an OOM kill right after it must find the count below it.
        container.set_pod_oom_kills_at_start(self.pod_oom_kills_of(container));
        // Taken before the start: a process that exits at once must not finish before it
        // started (its exit time comes from containerd).
        let started_at = now_ns();
        // Marked before the start: a `/tasks/exit` hint for a process that exits at once must
        // leave the exit to the monitor (which drains the output first).
        self.set_monitored(&id, true);
        let pid = match self.tasks.start(&id).await {
            Ok(pid) => pid,
            Err(e) => {
                self.set_monitored(&id, false);
                return Err(e.into());
            }
        };
        steps.mark("task_start");
        container.record_started(pid, started_at)?;
        // RUNNING is on the record before StartContainer answers, as containerd writes its
        // status before it does: a crash right after the answer, with the shim gone before
        // remora is back, must still find a started container (whose exit the sandbox store
        // keeps), not a CREATED one. Before the monitor: every exit it records comes after.
        self.persist(container).await;
        self.monitor_container_exit(container.clone(), copiers);
        self.events
            .emit(&id, &meta.sandbox_id, EventKind::Started, now_ns());
        if let Some((nri, pod)) = &nri_pod {
            nri.post_start_container(pod, &container.snapshot()).await;
        }
        info!(self.log, "container started"; "container_id" => &id, "pid" => pid);
        steps.log(
            &self.log.new(slog::o!("container_id" => id.clone())),
            "StartContainer",
        );
        Ok(())
    }
}

/// The host owner of a user-namespaced container's stdio pipes: its process's uid and gid as
/// the host sees them through the pod's maps (containerd's `WithUIDOwner`/`WithGIDOwner`), so
/// the process can reopen `/dev/stdout`; `None` for other containers (the shim's defaults) or
/// an ID outside the maps.
fn io_owner(user: Option<&UserNamespace>, process: Option<&ContainerUser>) -> Option<(u32, u32)> {
    let (u, p) = (user?, process?);
    let to_host = |m: IdMapping, id: u32| {
        id.checked_sub(m.container_id)
            .filter(|off| *off < m.length)
            .map(|off| m.host_id + off)
    };
    Some((to_host(u.uids, p.uid)?, to_host(u.gids, p.gid)?))
}

#[cfg(test)]
mod io_owner_tests {
    use super::*;

    #[test]
    fn the_pipes_belong_to_the_process_user_on_the_host() {
        let map = |host_id| IdMapping {
            container_id: 0,
            host_id,
            length: 65536,
        };
        let u = UserNamespace {
            uids: map(100_000),
            gids: map(200_000),
        };
        let user = |uid, gid| ContainerUser {
            uid,
            gid,
            supplemental_groups: Vec::new(),
        };
        assert_eq!(
            io_owner(Some(&u), Some(&user(0, 0))),
            Some((100_000, 200_000))
        );
        assert_eq!(
            io_owner(Some(&u), Some(&user(1000, 5))),
            Some((101_000, 200_005))
        );
        assert_eq!(
            io_owner(Some(&u), Some(&user(65536, 0))),
            None,
            "outside the map"
        );
        assert_eq!(io_owner(None, Some(&user(0, 0))), None);
        assert_eq!(io_owner(Some(&u), None), None);
    }
}
