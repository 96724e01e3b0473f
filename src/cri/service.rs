//! tonic adapters for CRI v1 `RuntimeService` and `ImageService`.
//!
//! Each method unpacks the protobuf request, calls the plain operation through
//! [`instrument::run`], and packs the domain result into the protobuf response. RPCs that
//! remora does not implement yet answer `UNIMPLEMENTED` naming the RPC — never a fake success.

use std::pin::Pin;

use crate::cri::v1;
use crate::cri::v1::runtime_service_server::RuntimeService;
use slog::info;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use crate::config::CgroupDriver;
use crate::cri::convert;
use crate::cri::error::CriError;
use crate::cri::instrument::{self, Ids};
use crate::cri::{runtime_info, Subsystems};
use crate::lifecycle::sandbox_metrics;
use crate::lifecycle::CreateRequest;
use crate::lifecycle::RunSandbox;
use crate::net::cni::template::Applied;
use crate::stream::server::Request as StreamRequest;

mod image;

const RUNTIME: &str = "RuntimeService";

/// Serves both CRI services over one [`Subsystems`].
#[derive(Clone)]
pub struct CriService {
    rt: Subsystems,
}

impl CriService {
    /// Wraps the runtime.
    pub fn new(rt: Subsystems) -> Self {
        Self { rt }
    }

    /// The pod's config CreateContainer's spec is made with, converted here so lifecycle never
    /// parses kubelet's messages: the request's (as containerd reads `r.GetSandboxConfig()`),
    /// else the one kept on the sandbox's record; `None` if neither converts (lifecycle then
    /// uses what the record's metadata says).
    fn pod_config_for_create(
        &self,
        requested: Option<&v1::PodSandboxConfig>,
        sandbox_id: &str,
    ) -> Option<crate::spec::SandboxConfig> {
        if let Some(c) = requested.and_then(|c| convert::sandbox_config(c).ok()) {
            return Some(c);
        }
        let kept = self
            .rt
            .pods
            .sandboxes
            .get(sandbox_id)
            .ok()?
            .metadata()
            .config_json
            .clone();
        serde_json::from_slice::<v1::PodSandboxConfig>(&kept)
            .ok()
            .and_then(|c| convert::sandbox_config(&c).ok())
    }

    /// ListPodSandbox's and StreamPodSandboxes' items.
    fn pod_sandboxes(
        &self,
        filter: Option<&v1::PodSandboxFilter>,
    ) -> Result<Vec<v1::PodSandbox>, CriError> {
        let filter = convert::sandbox_filter(filter)?;
        Ok(self
            .rt
            .pods
            .sandboxes
            .list(&filter)
            .iter()
            .map(convert::pod_sandbox)
            .collect())
    }

    /// ListContainers' and StreamContainers' items.
    fn containers(
        &self,
        filter: Option<&v1::ContainerFilter>,
    ) -> Result<Vec<v1::Container>, CriError> {
        let filter = convert::container_filter(filter)?;
        Ok(self
            .rt
            .pods
            .containers_store()
            .list(&filter, &self.rt.pods.sandboxes)
            .iter()
            .map(convert::container)
            .collect())
    }

    /// ListContainerStats' and StreamContainerStats' items.
    async fn container_stats(
        &self,
        filter: Option<v1::ContainerStatsFilter>,
    ) -> Result<Vec<v1::ContainerStats>, CriError> {
        let filter = filter.map(|f| v1::ContainerFilter {
            id: f.id,
            pod_sandbox_id: f.pod_sandbox_id,
            label_selector: f.label_selector,
            state: None,
        });
        let filter = convert::container_filter(filter.as_ref())?;
        let stats = self.rt.pods.list_container_stats(&filter).await;
        Ok(stats.iter().map(convert::container_stats).collect())
    }

    /// ListPodSandboxStats' and StreamPodSandboxStats' items.
    async fn pod_sandbox_stats(
        &self,
        filter: Option<&v1::PodSandboxStatsFilter>,
    ) -> Vec<v1::PodSandboxStats> {
        let filter = convert::sandbox_stats_filter(filter);
        let stats = self.rt.pods.list_sandbox_stats(&filter).await;
        stats.iter().map(convert::pod_sandbox_stats).collect()
    }

    /// ListPodSandboxMetrics' and StreamPodSandboxMetrics' items.
    async fn pod_sandbox_metrics(&self) -> Vec<v1::PodSandboxMetrics> {
        self.rt
            .pods
            .list_sandbox_metrics()
            .await
            .iter()
            .map(convert::pod_sandbox_metrics)
            .collect()
    }

    async fn unimplemented<T>(
        &self,
        service: &'static str,
        rpc: &'static str,
    ) -> Result<Response<T>, Status> {
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            rpc,
            Ids::none(),
            |_log| async move { Err(CriError::Unimplemented { service, rpc }) },
        )
        .await
    }
}

fn cgroup_driver(d: CgroupDriver) -> v1::CgroupDriver {
    match d {
        CgroupDriver::Cgroupfs => v1::CgroupDriver::Cgroupfs,
        CgroupDriver::Systemd => v1::CgroupDriver::Systemd,
    }
}

#[tonic::async_trait]
impl RuntimeService for CriService {
    async fn version(
        &self,
        _request: Request<v1::VersionRequest>,
    ) -> Result<Response<v1::VersionResponse>, Status> {
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "Version",
            Ids::none(),
            |_log| async {
                let v = runtime_info::version();
                Ok(v1::VersionResponse {
                    version: v.version.to_string(),
                    runtime_name: v.runtime_name.to_string(),
                    runtime_version: v.runtime_version.to_string(),
                    runtime_api_version: v.runtime_api_version.to_string(),
                })
            },
        )
        .await
    }

    async fn status(
        &self,
        request: Request<v1::StatusRequest>,
    ) -> Result<Response<v1::StatusResponse>, Status> {
        let verbose = request.into_inner().verbose;
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "Status",
            Ids::none(),
            |_log| async move {
                let report = runtime_info::status(
                    &self.rt.config,
                    &self.rt.health,
                    self.rt.pods.handlers(),
                    verbose,
                )
                .await?;
                Ok(v1::StatusResponse {
                    status: Some(v1::RuntimeStatus {
                        conditions: report
                            .conditions
                            .into_iter()
                            .map(|c| v1::RuntimeCondition {
                                r#type: c.kind.to_string(),
                                status: c.status,
                                reason: c.reason,
                                message: c.message,
                            })
                            .collect(),
                    }),
                    info: report.info.into_iter().collect(),
                    runtime_handlers: report
                        .handlers
                        .into_iter()
                        .map(|h| v1::RuntimeHandler {
                            name: h.name,
                            features: Some(v1::RuntimeHandlerFeatures {
                                recursive_read_only_mounts: h.recursive_read_only_mounts,
                                user_namespaces: h.user_namespaces,
                            }),
                        })
                        .collect(),
                    features: Some(v1::RuntimeFeatures {
                        supplemental_groups_policy: report.supplemental_groups_policy,
                        user_namespaces_host_network: report.user_namespaces_host_network,
                        mount_options: report.mount_options,
                    }),
                })
            },
        )
        .await
    }

    async fn runtime_config(
        &self,
        _request: Request<v1::RuntimeConfigRequest>,
    ) -> Result<Response<v1::RuntimeConfigResponse>, Status> {
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "RuntimeConfig",
            Ids::none(),
            |_log| async {
                Ok(v1::RuntimeConfigResponse {
                    linux: Some(v1::LinuxRuntimeConfiguration {
                        cgroup_driver: cgroup_driver(runtime_info::runtime_config(&self.rt.config))
                            as i32,
                    }),
                })
            },
        )
        .await
    }

    async fn run_pod_sandbox(
        &self,
        request: Request<v1::RunPodSandboxRequest>,
    ) -> Result<Response<v1::RunPodSandboxResponse>, Status> {
        let req = request.into_inner();
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "RunPodSandbox",
            Ids::none(),
            |_log| async move {
                let config = req.config.ok_or(CriError::InvalidArgument {
                    what: "config",
                    reason: "a pod sandbox config is required".into(),
                })?;
                let run = RunSandbox {
                    config: convert::sandbox_config(&config)?,
                    attempt: config.metadata.as_ref().map_or(0, |m| m.attempt),
                    labels: config.labels.clone(),
                    dns: convert::sandbox_dns(&config),
                    port_mappings: convert::sandbox_port_mappings(&config)?,
                    runtime_handler: req.runtime_handler,
                    config_json: serde_json::to_vec(&config).unwrap_or_default(),
                };
                let pod_sandbox_id = self.rt.pods.run_sandbox(run).await?;
                Ok(v1::RunPodSandboxResponse { pod_sandbox_id })
            },
        )
        .await
    }

    async fn stop_pod_sandbox(
        &self,
        request: Request<v1::StopPodSandboxRequest>,
    ) -> Result<Response<v1::StopPodSandboxResponse>, Status> {
        let id = request.into_inner().pod_sandbox_id;
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "StopPodSandbox",
            pod_ids(&id),
            |_log| async move {
                required_id(&id)?;
                self.rt.pods.stop_sandbox(&id).await?;
                Ok(v1::StopPodSandboxResponse {})
            },
        )
        .await
    }

    async fn remove_pod_sandbox(
        &self,
        request: Request<v1::RemovePodSandboxRequest>,
    ) -> Result<Response<v1::RemovePodSandboxResponse>, Status> {
        let id = request.into_inner().pod_sandbox_id;
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "RemovePodSandbox",
            pod_ids(&id),
            |_log| async move {
                required_id(&id)?;
                self.rt.pods.remove_sandbox(&id).await?;
                Ok(v1::RemovePodSandboxResponse {})
            },
        )
        .await
    }

    async fn pod_sandbox_status(
        &self,
        request: Request<v1::PodSandboxStatusRequest>,
    ) -> Result<Response<v1::PodSandboxStatusResponse>, Status> {
        let req = request.into_inner();
        let id = req.pod_sandbox_id;
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "PodSandboxStatus",
            pod_ids(&id),
            |_log| async move {
                required_id(&id)?;
                // Taken before the state is read: the state is at least as new as the stamp,
                // so an event published after a change the state missed is stamped later.
                let timestamp = crate::lifecycle::now_ns();
                let snapshot = self.rt.pods.sandboxes.get(&id)?.snapshot();
                let mut info = std::collections::HashMap::new();
                if req.verbose {
                    let verbose = serde_json::json!({
                        "pid": snapshot.status.pid,
                        "netnsPath": snapshot.metadata.netns_path,
                        "runtimeHandler": snapshot.metadata.runtime_handler,
                        "image": self.rt.config.images.sandbox_image,
                    });
                    info.insert(
                        "info".to_string(),
                        verbose_with_resources(verbose, &snapshot.metadata).to_string(),
                    );
                }
                // kubelet's evented PLEG takes the pod's container statuses from this response
                // when `timestamp` is set, instead of listing them ("Runtime does not set pod
                // status timestamp" otherwise): so both are filled, as CRI-O does.
                let containers_statuses = container_statuses(&self.rt, &id);
                Ok(v1::PodSandboxStatusResponse {
                    status: Some(convert::pod_sandbox_status(&snapshot)),
                    info,
                    containers_statuses,
                    timestamp,
                })
            },
        )
        .await
    }

    async fn list_pod_sandbox(
        &self,
        request: Request<v1::ListPodSandboxRequest>,
    ) -> Result<Response<v1::ListPodSandboxResponse>, Status> {
        let filter = request.into_inner().filter;
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "ListPodSandbox",
            Ids::none(),
            |_log| async move {
                Ok(v1::ListPodSandboxResponse {
                    items: self.pod_sandboxes(filter.as_ref())?,
                })
            },
        )
        .await
    }

    async fn create_container(
        &self,
        request: Request<v1::CreateContainerRequest>,
    ) -> Result<Response<v1::CreateContainerResponse>, Status> {
        let req = request.into_inner();
        let ids = pod_ids(&req.pod_sandbox_id);
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "CreateContainer",
            ids,
            |_log| async move {
                required_id(&req.pod_sandbox_id)?;
                let config = req.config.ok_or(CriError::InvalidArgument {
                    what: "config",
                    reason: "a container config is required".into(),
                })?;
                let pod_config =
                    self.pod_config_for_create(req.sandbox_config.as_ref(), &req.pod_sandbox_id);
                let sandbox_config = req.sandbox_config.unwrap_or_default();
                let create = CreateRequest {
                    sandbox_id: req.pod_sandbox_id.clone(),
                    config: convert::container_config(&config, &sandbox_config)?,
                    metadata: convert::container_metadata(
                        "",
                        &req.pod_sandbox_id,
                        &config,
                        &sandbox_config,
                    )?,
                    image: config
                        .image
                        .as_ref()
                        .map(|i| i.image.clone())
                        .unwrap_or_default(),
                    target_id: convert::container_target_id(&config),
                    sandbox_config: pod_config,
                };
                let container_id = self.rt.pods.create_container(create).await?;
                Ok(v1::CreateContainerResponse { container_id })
            },
        )
        .await
    }

    async fn start_container(
        &self,
        request: Request<v1::StartContainerRequest>,
    ) -> Result<Response<v1::StartContainerResponse>, Status> {
        let id = request.into_inner().container_id;
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "StartContainer",
            container_ids(&id),
            |_log| async move {
                required_container_id(&id)?;
                self.rt.pods.start_container(&id).await?;
                Ok(v1::StartContainerResponse {})
            },
        )
        .await
    }

    async fn stop_container(
        &self,
        request: Request<v1::StopContainerRequest>,
    ) -> Result<Response<v1::StopContainerResponse>, Status> {
        let req = request.into_inner();
        let id = req.container_id;
        let timeout = std::time::Duration::from_secs(req.timeout.max(0) as u64);
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "StopContainer",
            container_ids(&id),
            |_log| async move {
                required_container_id(&id)?;
                self.rt.pods.stop_container(&id, timeout).await?;
                Ok(v1::StopContainerResponse {})
            },
        )
        .await
    }

    async fn remove_container(
        &self,
        request: Request<v1::RemoveContainerRequest>,
    ) -> Result<Response<v1::RemoveContainerResponse>, Status> {
        let id = request.into_inner().container_id;
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "RemoveContainer",
            container_ids(&id),
            |_log| async move {
                required_container_id(&id)?;
                self.rt.pods.remove_container(&id).await?;
                Ok(v1::RemoveContainerResponse {})
            },
        )
        .await
    }

    async fn list_containers(
        &self,
        request: Request<v1::ListContainersRequest>,
    ) -> Result<Response<v1::ListContainersResponse>, Status> {
        let filter = request.into_inner().filter;
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "ListContainers",
            Ids::none(),
            |_log| async move {
                Ok(v1::ListContainersResponse {
                    containers: self.containers(filter.as_ref())?,
                })
            },
        )
        .await
    }

    async fn container_status(
        &self,
        request: Request<v1::ContainerStatusRequest>,
    ) -> Result<Response<v1::ContainerStatusResponse>, Status> {
        let req = request.into_inner();
        let id = req.container_id;
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "ContainerStatus",
            container_ids(&id),
            |_log| async move {
                required_container_id(&id)?;
                let snapshot = self.rt.pods.containers_store().get(&id)?.snapshot();
                let mut info = std::collections::HashMap::new();
                if req.verbose {
                    let verbose = serde_json::json!({
                        "pid": snapshot.status.pid,
                        "sandboxID": snapshot.metadata.sandbox_id,
                        "logPath": snapshot.metadata.log_path,
                        // containerd shows the whole config (its CDI_devices among it).
                        "cdiDevices": snapshot.metadata.cdi_devices,
                    });
                    info.insert("info".to_string(), verbose.to_string());
                }
                Ok(v1::ContainerStatusResponse {
                    status: Some(convert::container_status(&snapshot)),
                    info,
                })
            },
        )
        .await
    }

    async fn reopen_container_log(
        &self,
        request: Request<v1::ReopenContainerLogRequest>,
    ) -> Result<Response<v1::ReopenContainerLogResponse>, Status> {
        let id = request.into_inner().container_id;
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "ReopenContainerLog",
            container_ids(&id),
            |_log| async move {
                required_container_id(&id)?;
                self.rt.pods.reopen_container_log(&id).await?;
                Ok(v1::ReopenContainerLogResponse {})
            },
        )
        .await
    }

    async fn exec_sync(
        &self,
        request: Request<v1::ExecSyncRequest>,
    ) -> Result<Response<v1::ExecSyncResponse>, Status> {
        let req = request.into_inner();
        let id = req.container_id;
        let timeout = std::time::Duration::from_secs(req.timeout.max(0) as u64);
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "ExecSync",
            container_ids(&id),
            |_log| async move {
                required_container_id(&id)?;
                let out = self.rt.pods.exec_sync(&id, req.cmd, timeout).await?;
                Ok(v1::ExecSyncResponse {
                    stdout: out.stdout,
                    stderr: out.stderr,
                    exit_code: out.exit_code,
                })
            },
        )
        .await
    }

    async fn container_stats(
        &self,
        request: Request<v1::ContainerStatsRequest>,
    ) -> Result<Response<v1::ContainerStatsResponse>, Status> {
        let id = request.into_inner().container_id;
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "ContainerStats",
            container_ids(&id),
            |_log| async move {
                required_container_id(&id)?;
                let stats = self.rt.pods.container_stats(&id).await?;
                Ok(v1::ContainerStatsResponse {
                    stats: Some(convert::container_stats(&stats)),
                })
            },
        )
        .await
    }

    async fn list_container_stats(
        &self,
        request: Request<v1::ListContainerStatsRequest>,
    ) -> Result<Response<v1::ListContainerStatsResponse>, Status> {
        let filter = request.into_inner().filter;
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "ListContainerStats",
            Ids::none(),
            |_log| async move {
                Ok(v1::ListContainerStatsResponse {
                    stats: self.container_stats(filter).await?,
                })
            },
        )
        .await
    }

    async fn update_container_resources(
        &self,
        request: Request<v1::UpdateContainerResourcesRequest>,
    ) -> Result<Response<v1::UpdateContainerResourcesResponse>, Status> {
        let req = request.into_inner();
        let id = req.container_id;
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "UpdateContainerResources",
            container_ids(&id),
            |_log| async move {
                required_container_id(&id)?;
                let linux = req.linux.ok_or(CriError::InvalidArgument {
                    what: "linux",
                    reason: "Linux resources are required".into(),
                })?;
                self.rt
                    .pods
                    .update_container_resources(&id, &convert::resources(&linux, "linux")?)
                    .await?;
                Ok(v1::UpdateContainerResourcesResponse {})
            },
        )
        .await
    }

    type GetContainerEventsStream =
        Pin<Box<dyn Stream<Item = Result<v1::ContainerEventResponse, Status>> + Send + 'static>>;

    async fn get_container_events(
        &self,
        _request: Request<v1::GetEventsRequest>,
    ) -> Result<Response<Self::GetContainerEventsStream>, Status> {
        let rt = self.rt.clone();
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "GetContainerEvents",
            Ids::none(),
            |_log| async move {
                let (replay, rx) = rt.pods.events.subscribe();
                let log = rt.log.clone();
                // A subscriber that fell behind gets an error and the end of its stream (the
                // live stream ends after its first error): kubelet then relists.
                let stream = tokio_stream::iter(replay.into_iter().map(Ok))
                    .chain(crate::lifecycle::container_events::live(rx))
                    .map(move |event| match event {
                        Ok(event) => Ok(container_event(&rt, event)),
                        Err(lost) => {
                            slog::warn!(log, "GetContainerEvents subscriber fell behind; ending its stream"; "missed" => lost.missed);
                            Err(Status::from(CriError::from(lost)))
                        }
                    });
                let stream: Self::GetContainerEventsStream = Box::pin(stream);
                Ok(stream)
            },
        )
        .await
    }

    async fn exec(
        &self,
        request: Request<v1::ExecRequest>,
    ) -> Result<Response<v1::ExecResponse>, Status> {
        let req = request.into_inner();
        let id = req.container_id.clone();
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "Exec",
            container_ids(&id),
            |_log| async move {
                required_container_id(&req.container_id)?;
                if req.cmd.is_empty() {
                    return Err(CriError::InvalidArgument {
                        what: "cmd",
                        reason: "cmd is empty: name the command to run".into(),
                    });
                }
                let opts = stream_options(req.stdin, req.stdout, req.stderr, req.tty)?;
                let container_id = self.rt.pods.check_streamable(&req.container_id)?;
                let url = self.rt.streaming.url_for(StreamRequest::Exec {
                    container_id,
                    cmd: req.cmd,
                    opts,
                })?;
                Ok(v1::ExecResponse { url })
            },
        )
        .await
    }

    async fn attach(
        &self,
        request: Request<v1::AttachRequest>,
    ) -> Result<Response<v1::AttachResponse>, Status> {
        let req = request.into_inner();
        let id = req.container_id.clone();
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "Attach",
            container_ids(&id),
            |_log| async move {
                required_container_id(&req.container_id)?;
                let opts = stream_options(req.stdin, req.stdout, req.stderr, req.tty)?;
                let container_id = self.rt.pods.check_streamable(&req.container_id)?;
                let url = self
                    .rt
                    .streaming
                    .url_for(StreamRequest::Attach { container_id, opts })?;
                Ok(v1::AttachResponse { url })
            },
        )
        .await
    }

    async fn port_forward(
        &self,
        request: Request<v1::PortForwardRequest>,
    ) -> Result<Response<v1::PortForwardResponse>, Status> {
        let req = request.into_inner();
        let id = req.pod_sandbox_id.clone();
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "PortForward",
            pod_ids(&id),
            |_log| async move {
                required_id(&req.pod_sandbox_id)?;
                // kubelet passes the ports its client named: the channels of a WebSocket
                // session. SPDY clients name a port per stream (they may name none here).
                let ports = req
                    .port
                    .iter()
                    .map(|&p| {
                        u16::try_from(p).ok().filter(|&p| p > 0).ok_or_else(|| {
                            CriError::InvalidArgument {
                                what: "port",
                                reason: format!("{p} is not a TCP port (1-65535)"),
                            }
                        })
                    })
                    .collect::<Result<Vec<u16>, CriError>>()?;
                let pod_id = self.rt.pods.check_port_forward(&req.pod_sandbox_id)?;
                let url = self
                    .rt
                    .streaming
                    .url_for(StreamRequest::PortForward { pod_id, ports })?;
                Ok(v1::PortForwardResponse { url })
            },
        )
        .await
    }

    async fn pod_sandbox_stats(
        &self,
        request: Request<v1::PodSandboxStatsRequest>,
    ) -> Result<Response<v1::PodSandboxStatsResponse>, Status> {
        let id = request.into_inner().pod_sandbox_id;
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "PodSandboxStats",
            pod_ids(&id),
            |_log| async move {
                required_id(&id)?;
                let stats = self.rt.pods.sandbox_stats(&id).await?;
                Ok(v1::PodSandboxStatsResponse {
                    stats: Some(convert::pod_sandbox_stats(&stats)),
                })
            },
        )
        .await
    }

    async fn list_pod_sandbox_stats(
        &self,
        request: Request<v1::ListPodSandboxStatsRequest>,
    ) -> Result<Response<v1::ListPodSandboxStatsResponse>, Status> {
        let filter = request.into_inner().filter;
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "ListPodSandboxStats",
            Ids::none(),
            |_log| async move {
                Ok(v1::ListPodSandboxStatsResponse {
                    stats: self.pod_sandbox_stats(filter.as_ref()).await,
                })
            },
        )
        .await
    }

    async fn update_runtime_config(
        &self,
        request: Request<v1::UpdateRuntimeConfigRequest>,
    ) -> Result<Response<v1::UpdateRuntimeConfigResponse>, Status> {
        let pod_cidr = request
            .into_inner()
            .runtime_config
            .and_then(|c| c.network_config)
            .map(|n| n.pod_cidr)
            .unwrap_or_default();
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "UpdateRuntimeConfig",
            Ids::none(),
            |log| async move {
                let applied = runtime_info::update_runtime_config(&self.rt.config, &pod_cidr).await?;
                if let Applied::Written(file) = &applied {
                    info!(log, "CNI config written from the template"; "pod_cidr" => &pod_cidr, "file" => %file.display());
                }
                Ok(v1::UpdateRuntimeConfigResponse {})
            },
        )
        .await
    }

    async fn checkpoint_container(
        &self,
        _request: Request<v1::CheckpointContainerRequest>,
    ) -> Result<Response<v1::CheckpointContainerResponse>, Status> {
        self.unimplemented(RUNTIME, "CheckpointContainer").await
    }

    async fn list_metric_descriptors(
        &self,
        _request: Request<v1::ListMetricDescriptorsRequest>,
    ) -> Result<Response<v1::ListMetricDescriptorsResponse>, Status> {
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "ListMetricDescriptors",
            Ids::none(),
            |_log| async move {
                Ok(v1::ListMetricDescriptorsResponse {
                    descriptors: sandbox_metrics::DESCRIPTORS
                        .iter()
                        .map(convert::metric_descriptor)
                        .collect(),
                })
            },
        )
        .await
    }

    async fn list_pod_sandbox_metrics(
        &self,
        _request: Request<v1::ListPodSandboxMetricsRequest>,
    ) -> Result<Response<v1::ListPodSandboxMetricsResponse>, Status> {
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "ListPodSandboxMetrics",
            Ids::none(),
            |_log| async move {
                Ok(v1::ListPodSandboxMetricsResponse {
                    pod_metrics: self.pod_sandbox_metrics().await,
                })
            },
        )
        .await
    }

    async fn update_pod_sandbox_resources(
        &self,
        request: Request<v1::UpdatePodSandboxResourcesRequest>,
    ) -> Result<Response<v1::UpdatePodSandboxResourcesResponse>, Status> {
        // kubelet has resized the pod's cgroups already; remora records what it reports
        // (lifecycle::sandbox_update says why no cgroup is written here).
        let req = request.into_inner();
        let id = req.pod_sandbox_id;
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "UpdatePodSandboxResources",
            pod_ids(&id),
            |_log| async move {
                required_id(&id)?;
                let overhead = req
                    .overhead
                    .as_ref()
                    .map(|r| convert::recorded_resources(r, "overhead"))
                    .transpose()?;
                let resources = req
                    .resources
                    .as_ref()
                    .map(|r| convert::recorded_resources(r, "resources"))
                    .transpose()?;
                self.rt
                    .pods
                    .update_sandbox_resources(&id, overhead.as_ref(), resources.as_ref())
                    .await?;
                Ok(v1::UpdatePodSandboxResourcesResponse {})
            },
        )
        .await
    }

    async fn checkpoint_pod(
        &self,
        _request: Request<v1::CheckpointPodRequest>,
    ) -> Result<Response<v1::CheckpointPodResponse>, Status> {
        self.unimplemented(RUNTIME, "CheckpointPod").await
    }

    async fn restore_pod(
        &self,
        _request: Request<v1::RestorePodRequest>,
    ) -> Result<Response<v1::RestorePodResponse>, Status> {
        self.unimplemented(RUNTIME, "RestorePod").await
    }

    // The Stream* RPCs (KEP-5825) answer what their List* counterpart answers, read at the
    // same moment, split over as many messages as the size limit needs ([`batches`]).

    type StreamPodSandboxesStream = BatchStream<v1::StreamPodSandboxesResponse>;

    async fn stream_pod_sandboxes(
        &self,
        request: Request<v1::StreamPodSandboxesRequest>,
    ) -> Result<Response<Self::StreamPodSandboxesStream>, Status> {
        let filter = request.into_inner().filter;
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "StreamPodSandboxes",
            Ids::none(),
            |_log| async move {
                Ok(batch_stream(
                    self.pod_sandboxes(filter.as_ref())?,
                    |pod_sandboxes| v1::StreamPodSandboxesResponse { pod_sandboxes },
                ))
            },
        )
        .await
    }

    type StreamContainersStream = BatchStream<v1::StreamContainersResponse>;

    async fn stream_containers(
        &self,
        request: Request<v1::StreamContainersRequest>,
    ) -> Result<Response<Self::StreamContainersStream>, Status> {
        let filter = request.into_inner().filter;
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "StreamContainers",
            Ids::none(),
            |_log| async move {
                Ok(batch_stream(
                    self.containers(filter.as_ref())?,
                    |containers| v1::StreamContainersResponse { containers },
                ))
            },
        )
        .await
    }

    type StreamContainerStatsStream = BatchStream<v1::StreamContainerStatsResponse>;

    async fn stream_container_stats(
        &self,
        request: Request<v1::StreamContainerStatsRequest>,
    ) -> Result<Response<Self::StreamContainerStatsStream>, Status> {
        let filter = request.into_inner().filter;
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "StreamContainerStats",
            Ids::none(),
            |_log| async move {
                Ok(batch_stream(
                    self.container_stats(filter).await?,
                    |container_stats| v1::StreamContainerStatsResponse { container_stats },
                ))
            },
        )
        .await
    }

    type StreamPodSandboxStatsStream = BatchStream<v1::StreamPodSandboxStatsResponse>;

    async fn stream_pod_sandbox_stats(
        &self,
        request: Request<v1::StreamPodSandboxStatsRequest>,
    ) -> Result<Response<Self::StreamPodSandboxStatsStream>, Status> {
        let filter = request.into_inner().filter;
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "StreamPodSandboxStats",
            Ids::none(),
            |_log| async move {
                Ok(batch_stream(
                    self.pod_sandbox_stats(filter.as_ref()).await,
                    |pod_sandbox_stats| v1::StreamPodSandboxStatsResponse { pod_sandbox_stats },
                ))
            },
        )
        .await
    }

    type StreamPodSandboxMetricsStream = BatchStream<v1::StreamPodSandboxMetricsResponse>;

    async fn stream_pod_sandbox_metrics(
        &self,
        _request: Request<v1::StreamPodSandboxMetricsRequest>,
    ) -> Result<Response<Self::StreamPodSandboxMetricsStream>, Status> {
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            "StreamPodSandboxMetrics",
            Ids::none(),
            |_log| async move {
                Ok(batch_stream(
                    self.pod_sandbox_metrics().await,
                    |pod_sandbox_metrics| v1::StreamPodSandboxMetricsResponse {
                        pod_sandbox_metrics,
                    },
                ))
            },
        )
        .await
    }
}

/// The most one Stream* message carries, encoded, unless a single item is bigger: far below
/// the 16 MiB kubelet's CRI client accepts and tonic's 4 MiB default, the limits the Stream*
/// RPCs exist to get around.
const STREAM_BATCH_BYTES: usize = 1 << 20;

/// A Stream* RPC's response stream.
pub type BatchStream<R> = Pin<Box<dyn Stream<Item = Result<R, Status>> + Send + 'static>>;

/// `items`, in order, as the messages `wrap` makes of [`batches`] of them.
fn batch_stream<T, R>(items: Vec<T>, wrap: fn(Vec<T>) -> R) -> BatchStream<R>
where
    T: prost::Message + 'static,
    R: Send + 'static,
{
    let messages = batches(items, STREAM_BATCH_BYTES).into_iter().map(wrap);
    Box::pin(tokio_stream::iter(messages.map(Ok)))
}

/// `items`, in order, each exactly once, split into non-empty batches whose encoding as a
/// message's repeated field takes at most `limit` bytes; an item bigger than that alone goes
/// in a batch of its own. No items, no batches: the stream then ends at once.
fn batches<T: prost::Message>(items: Vec<T>, limit: usize) -> Vec<Vec<T>> {
    let mut out = Vec::new();
    let mut batch = Vec::new();
    let mut size = 0;
    for item in items {
        let len = item.encoded_len();
        // The field's one-byte tag (field 1, length-delimited) and the length prefix.
        let len = 1 + prost::length_delimiter_len(len) + len;
        if !batch.is_empty() && size + len > limit {
            out.push(std::mem::take(&mut batch));
            size = 0;
        }
        size += len;
        batch.push(item);
    }
    if !batch.is_empty() {
        out.push(batch);
    }
    out
}

fn pod_ids(id: &str) -> Ids {
    Ids {
        pod_id: Some(id.to_string()),
        ..Ids::none()
    }
}

/// The statuses of every container of a pod sandbox, as they are now.
fn container_statuses(rt: &Subsystems, sandbox_id: &str) -> Vec<v1::ContainerStatus> {
    let mut statuses: Vec<v1::ContainerStatus> = rt
        .pods
        .containers_store()
        .by_sandbox(sandbox_id)
        .iter()
        .map(|c| convert::container_status(&c.snapshot()))
        .collect();
    // Newest first, as kubelet sorts the statuses it lists itself: with the evented PLEG,
    // kubelet 1.37 takes these as they come and reads a container's restart count from the
    // first status with its name, so an older attempt first makes it reuse a taken attempt
    // number ("container name is in use").
    statuses.sort_by(|a, b| {
        b.created_at
            .cmp(&a.created_at)
            .then_with(|| a.id.cmp(&b.id))
    });
    statuses
}

/// A CRI container event with the pod's status and its containers' statuses as they are now.
fn container_event(
    rt: &Subsystems,
    e: crate::lifecycle::container_events::LifecycleEvent,
) -> v1::ContainerEventResponse {
    use crate::lifecycle::container_events::EventKind;
    let kind = match e.kind {
        EventKind::Created => v1::ContainerEventType::ContainerCreatedEvent,
        EventKind::Started => v1::ContainerEventType::ContainerStartedEvent,
        EventKind::Stopped => v1::ContainerEventType::ContainerStoppedEvent,
        EventKind::Deleted => v1::ContainerEventType::ContainerDeletedEvent,
    };
    let pod_sandbox_status = rt
        .pods
        .sandboxes
        .get(&e.sandbox_id)
        .ok()
        .map(|s| s.snapshot())
        .or_else(|| e.removed_sandbox.map(|s| *s))
        .map(|s| convert::pod_sandbox_status(&s));
    let containers_statuses = container_statuses(rt, &e.sandbox_id);
    v1::ContainerEventResponse {
        container_id: e.id,
        container_event_type: kind as i32,
        created_at: e.at_ns,
        pod_sandbox_status,
        containers_statuses,
    }
}

fn container_ids(id: &str) -> Ids {
    Ids {
        container_id: Some(id.to_string()),
        ..Ids::none()
    }
}

/// An id field (`what`) that must not be empty.
fn required(what: &'static str, id: &str) -> Result<(), CriError> {
    if id.is_empty() {
        return Err(CriError::InvalidArgument {
            what,
            reason: format!("{what} is empty"),
        });
    }
    Ok(())
}

fn required_container_id(id: &str) -> Result<(), CriError> {
    required("container_id", id)
}

/// Verbose sandbox info with what UpdatePodSandboxResources recorded, where containerd's
/// sandbox info has it: `overhead` and `resources`, each `{"linux": {...}}`.
fn verbose_with_resources(
    mut info: serde_json::Value,
    metadata: &crate::store::SandboxMetadata,
) -> serde_json::Value {
    let Some(r) = &metadata.updated_resources else {
        return info;
    };
    if let serde_json::Value::Object(map) = &mut info {
        for (key, value) in [("overhead", &r.overhead), ("resources", &r.resources)] {
            if let Some(linux) = value {
                map.insert(key.to_string(), serde_json::json!({ "linux": linux }));
            }
        }
    }
    info
}

fn required_id(id: &str) -> Result<(), CriError> {
    required("pod_sandbox_id", id)
}

/// The streams of an Exec or Attach request, checked as kubelet's streaming server does.
fn stream_options(
    stdin: bool,
    stdout: bool,
    stderr: bool,
    tty: bool,
) -> Result<crate::stream::remotecommand::Options, CriError> {
    if tty && stderr {
        return Err(CriError::InvalidArgument {
            what: "stderr",
            reason: "tty and stderr cannot both be true (a terminal has one output stream)".into(),
        });
    }
    if !stdin && !stdout && !stderr {
        return Err(CriError::InvalidArgument {
            what: "stdin/stdout/stderr",
            reason: "one of stdin, stdout, or stderr must be set".into(),
        });
    }
    Ok(crate::stream::remotecommand::Options {
        stdin,
        stdout,
        stderr,
        tty,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbose_info_reports_recorded_pod_resources_as_containerd_does() {
        use crate::store::{LinuxResources, PodResources, SandboxMetadata};
        let base = serde_json::json!({"pid": 7});
        let mut m = SandboxMetadata::default();
        assert_eq!(
            verbose_with_resources(base.clone(), &m),
            base,
            "none recorded"
        );
        m.updated_resources = Some(PodResources {
            overhead: None,
            resources: Some(LinuxResources {
                cpu_shares: 2,
                ..Default::default()
            }),
        });
        assert_eq!(
            verbose_with_resources(base, &m),
            serde_json::json!({"pid": 7, "resources": {"linux": {"cpu_shares": 2}}}),
            "no overhead sent: none reported"
        );
    }

    fn image(id: &str, tags: usize) -> v1::Image {
        v1::Image {
            id: id.to_string(),
            repo_tags: (0..tags)
                .map(|t| format!("registry.local/{id}:{t}"))
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn batches_keep_every_item_once_in_order_within_the_limit() {
        let items: Vec<v1::Image> = (0..200).map(|i| image(&format!("i{i}"), i % 7)).collect();
        let limit = 2_000;
        let got = batches(items.clone(), limit);
        assert!(got.len() > 1, "the limit splits them");
        assert!(got.iter().all(|b| !b.is_empty()), "no empty message");
        let flat: Vec<v1::Image> = got.iter().flatten().cloned().collect();
        assert_eq!(flat, items);
        for b in &got {
            // The size of the StreamImagesResponse carrying the batch, as encoded.
            let size = prost::Message::encoded_len(&v1::StreamImagesResponse { images: b.clone() });
            assert!(
                size <= limit,
                "a batch of {} items is {size} bytes",
                b.len()
            );
        }
    }

    #[test]
    fn an_item_bigger_than_the_limit_goes_alone() {
        let items = vec![image("small", 1), image("big", 500), image("small2", 1)];
        let got = batches(items, 1_000);
        let ids: Vec<Vec<&str>> = got
            .iter()
            .map(|b| b.iter().map(|i| i.id.as_str()).collect())
            .collect();
        assert_eq!(ids, vec![vec!["small"], vec!["big"], vec!["small2"]]);
    }

    #[test]
    fn no_items_no_messages() {
        assert!(batches(Vec::<v1::Image>::new(), STREAM_BATCH_BYTES).is_empty());
    }
}
