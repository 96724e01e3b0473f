//! The lifecycle traits of [`crate::lifecycle::backend`] over containerd's containers and
//! tasks services.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use containerd_client::services::v1::container::Runtime as PbRuntime;
use containerd_client::services::v1::sandbox::{
    StoreCreateRequest, StoreDeleteRequest, StoreListRequest,
};
use containerd_client::services::v1::{
    CloseIoRequest, Container, CreateContainerRequest, CreateTaskRequest, DeleteContainerRequest,
    DeleteProcessRequest, DeleteTaskRequest, ExecProcessRequest, GetContainerRequest, GetRequest,
    KillRequest, ListContainersRequest, ResizePtyRequest, StartRequest, UpdateContainerRequest,
    UpdateTaskRequest, WaitRequest,
};
use containerd_client::types::v1::Status as PbStatus;
use containerd_client::types::Mount as PbMount;
use tonic::Code;

use super::Client;
use crate::backend_error::BackendError;
use crate::lifecycle::backend::{
    ContainerRecord, Containers, ExecStdio, Exit, RuncOptions, ShimRuntime, TaskSpec, TaskState,
    TaskStatus, Tasks,
};

/// Type URL containerd uses for an OCI runtime spec stored on a container.
const SPEC_TYPE_URL: &str = "types.containerd.io/opencontainers/runtime-spec/1/Spec";
/// Type URL containerd uses for an OCI process spec (exec).
const PROCESS_TYPE_URL: &str = "types.containerd.io/opencontainers/runtime-spec/1/Process";
/// Type URL containerd uses for OCI `LinuxResources` (task updates).
const RESOURCES_TYPE_URL: &str = "types.containerd.io/opencontainers/runtime-spec/1/LinuxResources";
/// Type URL of remora's JSON extensions.
const EXTENSION_TYPE_URL: &str = "remora.dev/cri-metadata";
/// Type URL containerd (and its CRI) gives runc-style shim options: the proto's full name, as
/// Go's typeurl registers it. Both the Go runc shim and remora's shim decode it.
pub const RUNC_OPTIONS_TYPE_URL: &str = "containerd.runc.v1.Options";

/// `containerd.runc.v1.Options` (containerd `api/types/runc/options/oci.proto`), only the
/// fields remora sets; the field numbers are the proto's. Decoders skip what is absent, so a
/// partial message is a valid one.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct PbRuncOptions {
    /// The OCI runtime binary.
    #[prost(string, tag = "6")]
    pub binary_name: String,
    /// The OCI runtime's `--root`.
    #[prost(string, tag = "7")]
    pub root: String,
    /// Cgroups through systemd.
    #[prost(bool, tag = "9")]
    pub systemd_cgroup: bool,
    /// Owner uid of the stdio pipes.
    #[prost(uint32, tag = "4")]
    pub io_uid: u32,
    /// Owner gid of the stdio pipes.
    #[prost(uint32, tag = "5")]
    pub io_gid: u32,
}

/// A record's runtime options as containerd stores them.
fn runc_options_to_any(o: &RuncOptions) -> prost_types::Any {
    prost_types::Any {
        type_url: RUNC_OPTIONS_TYPE_URL.to_string(),
        value: prost::Message::encode_to_vec(&PbRuncOptions {
            binary_name: o.binary_name.clone(),
            root: o.root.clone(),
            systemd_cgroup: o.systemd_cgroup,
            io_uid: o.io_uid,
            io_gid: o.io_gid,
        }),
    }
}

/// A record's runtime options back; options of another type (set by another client) or
/// undecodable ones read as none: remora only ever reads back what it wrote.
fn runc_options_from_any(any: &prost_types::Any) -> Option<RuncOptions> {
    // containerd may hand back the URL with the "types.googleapis.com/" style prefix.
    if !any.type_url.ends_with(RUNC_OPTIONS_TYPE_URL) {
        return None;
    }
    let pb: PbRuncOptions = prost::Message::decode(any.value.as_slice()).ok()?;
    Some(RuncOptions {
        binary_name: pb.binary_name,
        root: pb.root,
        systemd_cgroup: pb.systemd_cgroup,
        io_uid: pb.io_uid,
        io_gid: pb.io_gid,
    })
}

fn time(ts: Option<prost_types::Timestamp>) -> Option<SystemTime> {
    let ts = ts?;
    // containerd reports the zero time for "not exited".
    if ts.seconds <= 0 {
        return None;
    }
    Some(UNIX_EPOCH + Duration::new(ts.seconds as u64, ts.nanos.max(0) as u32))
}

/// Label on remora's exit-keeper sandbox records (see [`Client::keep_exit`]).
pub const EXIT_KEEPER_LABEL: &str = "dev.remora.exit-keeper";

impl Client {
    /// Keeps task `id`'s shim, and with it the exit status, across containerd restarts.
    ///
    /// containerd (2.3.4 `core/runtime/v2/shim_load.go`, `shouldCleanupShim`) reaps at its
    /// start-up every shim whose task has no live process and whose id has no record in its
    /// sandbox store: a task that exited while containerd was down is deleted before any
    /// client can ask for its exit status (its own CRI then reports 255/Unknown). A
    /// metadata-only sandbox-store record with the task's id makes containerd keep that shim,
    /// so the real exit status is still there for `Task.Wait`/`Tasks.Get` once it is back.
    /// The record starts nothing; it goes with the task ([`Tasks::delete`]) or the container
    /// record ([`Containers::delete`]).
    async fn keep_exit(&self, id: &str) -> Result<(), BackendError> {
        let mut c = self.sandbox_store_client();
        let req = self.request(
            StoreCreateRequest {
                sandbox: Some(containerd_client::types::Sandbox {
                    sandbox_id: id.to_string(),
                    labels: HashMap::from([(EXIT_KEEPER_LABEL.to_string(), "true".to_string())]),
                    // containerd 2.3.4 dereferences `runtime` unchecked (a nil one crashes it).
                    runtime: Some(containerd_client::types::sandbox::Runtime {
                        name: EXIT_KEEPER_LABEL.to_string(),
                        options: None,
                    }),
                    ..Default::default()
                }),
            },
            None,
        );
        match c.create(req).await {
            Ok(_) => Ok(()),
            Err(s) if s.code() == Code::AlreadyExists => Ok(()),
            Err(s) => Err(self.call_error("Sandbox.Store.Create", s)),
        }
    }

    /// Drops task `id`'s exit-keeper record; absent is not an error.
    async fn release_exit(&self, id: &str) -> Result<(), BackendError> {
        let mut c = self.sandbox_store_client();
        let req = self.request(
            StoreDeleteRequest {
                sandbox_id: id.to_string(),
            },
            None,
        );
        self.found("Sandbox.Store.Delete", c.delete(req).await)?;
        Ok(())
    }
}

fn record_from_pb(c: Container) -> ContainerRecord {
    ContainerRecord {
        id: c.id,
        image: c.image,
        labels: c.labels,
        spec: c.spec.map(|s| s.value).unwrap_or_default(),
        runtime: c
            .runtime
            .map(|r| ShimRuntime {
                options: r.options.as_ref().and_then(runc_options_from_any),
                name: r.name,
            })
            .unwrap_or_default(),
        snapshotter: c.snapshotter,
        snapshot_key: c.snapshot_key,
        sandbox: c.sandbox,
        extensions: c
            .extensions
            .into_iter()
            .map(|(k, v)| (k, v.value))
            .collect(),
    }
}

fn record_to_pb(r: ContainerRecord) -> Container {
    Container {
        id: r.id,
        labels: r.labels,
        image: r.image,
        runtime: Some(PbRuntime {
            options: r.runtime.options.as_ref().map(runc_options_to_any),
            name: r.runtime.name,
        }),
        spec: Some(prost_types::Any {
            type_url: SPEC_TYPE_URL.to_string(),
            value: r.spec,
        }),
        snapshotter: r.snapshotter,
        snapshot_key: r.snapshot_key,
        created_at: None,
        updated_at: None,
        extensions: r
            .extensions
            .into_iter()
            .map(|(k, v)| {
                (
                    k,
                    prost_types::Any {
                        type_url: EXTENSION_TYPE_URL.to_string(),
                        value: v,
                    },
                )
            })
            .collect(),
        sandbox: r.sandbox,
    }
}

#[async_trait::async_trait]
impl Containers for Client {
    async fn create(&self, record: ContainerRecord) -> Result<(), BackendError> {
        let mut c = self.containers_client();
        let req = self.request(
            CreateContainerRequest {
                container: Some(record_to_pb(record)),
            },
            None,
        );
        c.create(req)
            .await
            .map_err(|s| self.call_error("Containers.Create", s))?;
        Ok(())
    }

    async fn get(&self, id: &str) -> Result<Option<ContainerRecord>, BackendError> {
        let mut c = self.containers_client();
        let req = self.request(GetContainerRequest { id: id.to_string() }, None);
        let r = self.found("Containers.Get", c.get(req).await)?;
        Ok(r.and_then(|r| r.container).map(record_from_pb))
    }

    async fn list(&self) -> Result<Vec<ContainerRecord>, BackendError> {
        let mut c = self.containers_client();
        let req = self.request(ListContainersRequest { filters: vec![] }, None);
        let r = c
            .list(req)
            .await
            .map_err(|s| self.call_error("Containers.List", s))?;
        Ok(r.into_inner()
            .containers
            .into_iter()
            .map(record_from_pb)
            .collect())
    }

    async fn set_extension(&self, id: &str, key: &str, value: Vec<u8>) -> Result<(), BackendError> {
        let mut c = self.containers_client();
        let container = Container {
            id: id.to_string(),
            extensions: HashMap::from([(
                key.to_string(),
                prost_types::Any {
                    type_url: EXTENSION_TYPE_URL.to_string(),
                    value,
                },
            )]),
            ..Default::default()
        };
        let req = self.request(
            UpdateContainerRequest {
                container: Some(container),
                update_mask: Some(prost_types::FieldMask {
                    paths: vec![format!("extensions.{key}")],
                }),
            },
            None,
        );
        c.update(req)
            .await
            .map_err(|s| self.call_error("Containers.Update", s))?;
        Ok(())
    }

    async fn delete(&self, id: &str) -> Result<(), BackendError> {
        let mut c = self.containers_client();
        let req = self.request(DeleteContainerRequest { id: id.to_string() }, None);
        self.found("Containers.Delete", c.delete(req).await)?;
        // The task is gone with the record (containerd refuses to delete a record with a
        // task), so its exit keeper has nothing left to keep.
        self.release_exit(id).await
    }

    async fn sweep_orphans(&self) -> Result<usize, BackendError> {
        let mut c = self.sandbox_store_client();
        let req = self.request(
            StoreListRequest {
                filters: vec![format!("labels.\"{EXIT_KEEPER_LABEL}\"")],
            },
            None,
        );
        let keepers = c
            .list(req)
            .await
            .map_err(|s| self.call_error("Sandbox.Store.List", s))?
            .into_inner()
            .list;
        let records: std::collections::HashSet<String> = Containers::list(self)
            .await?
            .into_iter()
            .map(|r| r.id)
            .collect();
        let mut swept = 0;
        for k in keepers {
            if !records.contains(&k.sandbox_id) {
                self.release_exit(&k.sandbox_id).await?;
                swept += 1;
            }
        }
        Ok(swept)
    }
}

#[async_trait::async_trait]
impl Tasks for Client {
    async fn create(&self, spec: TaskSpec) -> Result<u32, BackendError> {
        let id = spec.container_id.clone();
        let mut c = self.tasks_client();
        let req = self.request(
            CreateTaskRequest {
                container_id: spec.container_id,
                rootfs: spec
                    .rootfs
                    .into_iter()
                    .map(|m| PbMount {
                        r#type: m.kind,
                        source: m.source,
                        target: m.target,
                        options: m.options,
                    })
                    .collect(),
                stdin: spec.stdin,
                stdout: spec.stdout,
                stderr: spec.stderr,
                terminal: spec.terminal,
                checkpoint: None,
                options: spec.options.as_ref().map(runc_options_to_any),
                runtime_path: spec.runtime_path,
            },
            None,
        );
        // The keeper beside the create, not before it: it only has to exist before the task
        // can exit, and the task runs nothing until it is started (after both are done).
        let (kept, created) = tokio::join!(self.keep_exit(&id), c.create(req));
        match (kept, created) {
            (Ok(()), Ok(r)) => Ok(r.into_inner().pid),
            // A task without its keeper: the caller's rollback deletes the task (and the
            // record, which releases a keeper made meanwhile).
            (Err(e), _) => Err(e),
            (Ok(()), Err(s)) => {
                let err = self.call_error("Tasks.Create", s);
                // No task, nothing to keep (best effort: Containers::delete retries it).
                let _ = self.release_exit(&id).await;
                Err(err)
            }
        }
    }

    async fn start(&self, container_id: &str) -> Result<u32, BackendError> {
        let mut c = self.tasks_client();
        let req = self.request(
            StartRequest {
                container_id: container_id.to_string(),
                exec_id: String::new(),
            },
            None,
        );
        let r = c
            .start(req)
            .await
            .map_err(|s| self.call_error("Tasks.Start", s))?;
        Ok(r.into_inner().pid)
    }

    async fn kill(&self, container_id: &str, signal: u32, all: bool) -> Result<(), BackendError> {
        let mut c = self.tasks_client();
        let req = self.request(
            KillRequest {
                container_id: container_id.to_string(),
                exec_id: String::new(),
                signal,
                all,
            },
            None,
        );
        c.kill(req)
            .await
            .map_err(|s| self.call_error("Tasks.Kill", s))?;
        Ok(())
    }

    async fn wait(&self, container_id: &str) -> Result<Exit, BackendError> {
        let mut c = self.tasks_client();
        let req = self.request(
            WaitRequest {
                container_id: container_id.to_string(),
                exec_id: String::new(),
            },
            None,
        );
        let r = c
            .wait(req)
            .await
            .map_err(|s| self.call_error("Tasks.Wait", s))?
            .into_inner();
        Ok(Exit {
            status: r.exit_status,
            at: time(r.exited_at),
        })
    }

    async fn state(&self, container_id: &str) -> Result<Option<TaskState>, BackendError> {
        let mut c = self.tasks_client();
        let req = self.request(
            GetRequest {
                container_id: container_id.to_string(),
                exec_id: String::new(),
            },
            None,
        );
        let Some(p) = self
            .found("Tasks.Get", c.get(req).await)?
            .and_then(|r| r.process)
        else {
            return Ok(None);
        };
        let status = match PbStatus::try_from(p.status).unwrap_or(PbStatus::Unknown) {
            PbStatus::Created => TaskStatus::Created,
            PbStatus::Running => TaskStatus::Running,
            PbStatus::Stopped => TaskStatus::Stopped,
            PbStatus::Paused | PbStatus::Pausing => TaskStatus::Paused,
            PbStatus::Unknown => TaskStatus::Unknown,
        };
        Ok(Some(TaskState {
            status,
            pid: p.pid,
            exit_status: p.exit_status,
            exited_at: time(p.exited_at),
        }))
    }

    async fn exec(
        &self,
        container_id: &str,
        exec_id: &str,
        process: Vec<u8>,
        stdio: ExecStdio,
    ) -> Result<(), BackendError> {
        let mut c = self.tasks_client();
        let req = self.request(
            ExecProcessRequest {
                container_id: container_id.to_string(),
                stdin: stdio.stdin,
                stdout: stdio.stdout,
                stderr: stdio.stderr,
                terminal: stdio.terminal,
                spec: Some(prost_types::Any {
                    type_url: PROCESS_TYPE_URL.to_string(),
                    value: process,
                }),
                exec_id: exec_id.to_string(),
            },
            None,
        );
        c.exec(req)
            .await
            .map_err(|s| self.call_error("Tasks.Exec", s))?;
        Ok(())
    }

    async fn start_exec(&self, container_id: &str, exec_id: &str) -> Result<u32, BackendError> {
        let mut c = self.tasks_client();
        let req = self.request(
            StartRequest {
                container_id: container_id.to_string(),
                exec_id: exec_id.to_string(),
            },
            None,
        );
        let r = c
            .start(req)
            .await
            .map_err(|s| self.call_error("Tasks.Start", s))?;
        Ok(r.into_inner().pid)
    }

    async fn wait_exec(&self, container_id: &str, exec_id: &str) -> Result<Exit, BackendError> {
        let mut c = self.tasks_client();
        let req = self.request(
            WaitRequest {
                container_id: container_id.to_string(),
                exec_id: exec_id.to_string(),
            },
            None,
        );
        let r = c
            .wait(req)
            .await
            .map_err(|s| self.call_error("Tasks.Wait", s))?
            .into_inner();
        Ok(Exit {
            status: r.exit_status,
            at: time(r.exited_at),
        })
    }

    async fn kill_exec(
        &self,
        container_id: &str,
        exec_id: &str,
        signal: u32,
    ) -> Result<(), BackendError> {
        let mut c = self.tasks_client();
        let req = self.request(
            KillRequest {
                container_id: container_id.to_string(),
                exec_id: exec_id.to_string(),
                signal,
                all: false,
            },
            None,
        );
        c.kill(req)
            .await
            .map_err(|s| self.call_error("Tasks.Kill", s))?;
        Ok(())
    }

    async fn resize_pty(
        &self,
        container_id: &str,
        exec_id: &str,
        size: (u32, u32),
    ) -> Result<(), BackendError> {
        let mut c = self.tasks_client();
        let req = self.request(
            ResizePtyRequest {
                container_id: container_id.to_string(),
                exec_id: exec_id.to_string(),
                width: size.0,
                height: size.1,
            },
            None,
        );
        c.resize_pty(req)
            .await
            .map_err(|s| self.call_error("Tasks.ResizePty", s))?;
        Ok(())
    }

    async fn close_stdin(&self, container_id: &str, exec_id: &str) -> Result<(), BackendError> {
        let mut c = self.tasks_client();
        let req = self.request(
            CloseIoRequest {
                container_id: container_id.to_string(),
                exec_id: exec_id.to_string(),
                stdin: true,
            },
            None,
        );
        c.close_io(req)
            .await
            .map_err(|s| self.call_error("Tasks.CloseIO", s))?;
        Ok(())
    }

    async fn update_resources(
        &self,
        container_id: &str,
        resources: Vec<u8>,
    ) -> Result<(), BackendError> {
        let mut c = self.tasks_client();
        let req = self.request(
            UpdateTaskRequest {
                container_id: container_id.to_string(),
                resources: Some(prost_types::Any {
                    type_url: RESOURCES_TYPE_URL.to_string(),
                    value: resources,
                }),
                annotations: HashMap::new(),
            },
            None,
        );
        c.update(req)
            .await
            .map_err(|s| self.call_error("Tasks.Update", s))?;
        Ok(())
    }

    async fn delete_exec(&self, container_id: &str, exec_id: &str) -> Result<(), BackendError> {
        let mut c = self.tasks_client();
        let req = self.request(
            DeleteProcessRequest {
                container_id: container_id.to_string(),
                exec_id: exec_id.to_string(),
            },
            None,
        );
        self.found("Tasks.DeleteProcess", c.delete_process(req).await)?;
        Ok(())
    }

    async fn delete(&self, container_id: &str) -> Result<Option<Exit>, BackendError> {
        let mut c = self.tasks_client();
        let req = self.request(
            DeleteTaskRequest {
                container_id: container_id.to_string(),
            },
            None,
        );
        let exit = self
            .found("Tasks.Delete", c.delete(req).await)?
            .map(|r| Exit {
                status: r.exit_status,
                at: time(r.exited_at),
            });
        self.release_exit(container_id).await?;
        Ok(exit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use containerd_shim_protos::protobuf::Message as _;
    use containerd_shim_protos::shim::oci::Options as ShimOptions;

    fn record(options: Option<RuncOptions>) -> ContainerRecord {
        ContainerRecord {
            id: "c1".into(),
            runtime: ShimRuntime {
                name: "io.containerd.remora.v2".into(),
                options,
            },
            ..Default::default()
        }
    }

    #[test]
    fn runc_options_decode_with_containerds_own_field_numbers() {
        let opts = RuncOptions {
            binary_name: "crun".into(),
            root: "/run/crun".into(),
            systemd_cgroup: true,
            io_uid: 1000,
            io_gid: 2000,
        };
        let pb = record_to_pb(record(Some(opts)));
        let rt = pb.runtime.expect("a runtime");
        assert_eq!(rt.name, "io.containerd.remora.v2");
        let any = rt.options.expect("options");
        assert_eq!(any.type_url, "containerd.runc.v1.Options");
        // Decoded by the rust-protobuf code generated from containerd's oci.proto, which the
        // shims use: a wrong tag would land in another field or be skipped.
        let decoded = ShimOptions::parse_from_bytes(&any.value).expect("valid Options");
        assert_eq!(decoded.binary_name, "crun");
        assert_eq!(decoded.root, "/run/crun");
        assert!(decoded.systemd_cgroup);
        assert!(!decoded.no_pivot_root && !decoded.no_new_keyring);
        assert_eq!((decoded.io_uid, decoded.io_gid), (1000, 2000));
        assert!(decoded.shim_cgroup.is_empty() && decoded.criu_image_path.is_empty());
    }

    #[test]
    fn runtime_options_survive_a_round_trip_and_absent_ones_stay_absent() {
        let opts = RuncOptions {
            binary_name: "runc".into(),
            ..Default::default()
        };
        let back = record_from_pb(record_to_pb(record(Some(opts.clone()))));
        assert_eq!(back.runtime.options, Some(opts));
        assert_eq!(back.runtime.name, "io.containerd.remora.v2");
        let pb = record_to_pb(record(None));
        assert_eq!(pb.runtime.as_ref().and_then(|r| r.options.as_ref()), None);
        assert_eq!(record_from_pb(pb).runtime.options, None);
    }

    #[test]
    fn the_sandbox_a_container_belongs_to_goes_on_the_record() {
        let r = ContainerRecord {
            sandbox: "pod1".into(),
            ..record(None)
        };
        let pb = record_to_pb(r);
        assert_eq!(pb.sandbox, "pod1");
        assert_eq!(record_from_pb(pb).sandbox, "pod1");
        assert_eq!(record_to_pb(record(None)).sandbox, "");
    }

    #[test]
    fn options_of_another_type_read_as_none() {
        let any = prost_types::Any {
            type_url: "io.containerd.runhcs.v1.Options".into(),
            value: vec![0x32, 0x01, b'x'],
        };
        assert_eq!(runc_options_from_any(&any), None);
        let shim_encoded = ShimOptions {
            binary_name: "crun".into(),
            ..Default::default()
        };
        let any = prost_types::Any {
            type_url: format!("types.googleapis.com/{RUNC_OPTIONS_TYPE_URL}"),
            value: shim_encoded.write_to_bytes().unwrap(),
        };
        assert_eq!(
            runc_options_from_any(&any).map(|o| o.binary_name),
            Some("crun".to_string())
        );
    }
}
