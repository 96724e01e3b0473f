//! tonic adapter for CRI v1 `RuntimeService`: each method unpacks the request, calls the pod
//! or container operation in `crate::lifecycle` through [`instrument::run`], and packs the
//! result. RPCs remora does not implement yet answer `UNIMPLEMENTED` naming the RPC.

use super::*;

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
