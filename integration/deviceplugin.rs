//! A device plugin for the kubelet suite, speaking kubelet's device plugin API v1beta1
//! (`k8s.io/kubelet`'s `pkg/apis/deviceplugin/v1beta1/api.proto`, compiled by build.rs): it
//! serves `DevicePlugin` on a unix socket in kubelet's device plugin directory, registers
//! with kubelet's `Registration` service there, offers healthy devices (its `ListAndWatch`
//! stream stays open, as kubelet expects) and answers `Allocate` with CDI device names only —
//! `<resource>=<device id>` — which kubelet (≥ 1.31) passes to the runtime in
//! `ContainerConfig.cdi_devices`.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::Stream;
use tokio_stream::wrappers::UnixListenerStream;

/// The generated messages, `Registration` client and `DevicePlugin` server.
#[allow(clippy::all, missing_docs)]
pub mod api {
    tonic::include_proto!("v1beta1");
}

use api::device_plugin_server::{DevicePlugin, DevicePluginServer};
use api::registration_client::RegistrationClient;

/// The API version kubelet accepts in `RegisterRequest.version`.
pub const VERSION: &str = "v1beta1";
/// kubelet's registration socket's file name in its device plugin directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";

/// What the plugin was asked, for the test to check.
#[derive(Debug, Default)]
pub struct Calls {
    /// The device ids of each container request of each `Allocate`.
    pub allocate: Vec<Vec<String>>,
    /// `ListAndWatch` streams opened.
    pub list_and_watch: usize,
}

/// The service: `resource` (`vendor/name`) with healthy `devices`.
#[derive(Clone)]
struct Service {
    resource: String,
    devices: Vec<String>,
    calls: Arc<Mutex<Calls>>,
}

type DeviceStream =
    Pin<Box<dyn Stream<Item = Result<api::ListAndWatchResponse, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for Service {
    async fn get_device_plugin_options(
        &self,
        _: tonic::Request<api::Empty>,
    ) -> Result<tonic::Response<api::DevicePluginOptions>, tonic::Status> {
        Ok(tonic::Response::new(api::DevicePluginOptions::default()))
    }

    type ListAndWatchStream = DeviceStream;

    /// The devices once, then the stream stays open: kubelet treats its end as the plugin
    /// going away.
    async fn list_and_watch(
        &self,
        _: tonic::Request<api::Empty>,
    ) -> Result<tonic::Response<DeviceStream>, tonic::Status> {
        use futures_util::StreamExt;
        self.calls.lock().expect("calls lock").list_and_watch += 1;
        let devices = self
            .devices
            .iter()
            .map(|id| api::Device {
                id: id.clone(),
                health: "Healthy".into(),
                topology: None,
            })
            .collect();
        let first = api::ListAndWatchResponse { devices };
        let stream = futures_util::stream::once(async move { Ok(first) })
            .chain(futures_util::stream::pending());
        Ok(tonic::Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        _: tonic::Request<api::PreferredAllocationRequest>,
    ) -> Result<tonic::Response<api::PreferredAllocationResponse>, tonic::Status> {
        // Not announced in the options, so kubelet does not call it.
        Err(tonic::Status::unimplemented("no preferred allocation"))
    }

    /// For each container: the CDI name of each device it got, and nothing else (no device
    /// nodes, mounts, env or annotations: CDI is how they reach the container).
    async fn allocate(
        &self,
        request: tonic::Request<api::AllocateRequest>,
    ) -> Result<tonic::Response<api::AllocateResponse>, tonic::Status> {
        let request = request.into_inner();
        let mut container_responses = Vec::new();
        let mut ids = Vec::new();
        for c in &request.container_requests {
            ids.push(c.devices_ids.clone());
            let cdi_devices = c
                .devices_ids
                .iter()
                .map(|id| api::CdiDevice {
                    name: format!("{}={id}", self.resource),
                })
                .collect();
            container_responses.push(api::ContainerAllocateResponse {
                cdi_devices,
                ..Default::default()
            });
        }
        self.calls.lock().expect("calls lock").allocate.extend(ids);
        Ok(tonic::Response::new(api::AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: tonic::Request<api::PreStartContainerRequest>,
    ) -> Result<tonic::Response<api::PreStartContainerResponse>, tonic::Status> {
        // Not required by the options; answer anyway.
        Ok(tonic::Response::new(api::PreStartContainerResponse {}))
    }
}

/// A running plugin; stops serving and removes its socket on drop.
pub struct Plugin {
    socket: PathBuf,
    server: tokio::task::JoinHandle<()>,
    /// What kubelet asked.
    pub calls: Arc<Mutex<Calls>>,
}

impl Plugin {
    /// Serves `resource` with `devices` on `<dir>/<endpoint>` and registers with kubelet's
    /// `<dir>/kubelet.sock` (which must be there: kubelet empties `dir` when it starts).
    pub async fn start(dir: &Path, endpoint: &str, resource: &str, devices: &[&str]) -> Self {
        let socket = dir.join(endpoint);
        let _ = std::fs::remove_file(&socket);
        let listener = tokio::net::UnixListener::bind(&socket).expect("bind the plugin socket");
        let calls = Arc::new(Mutex::new(Calls::default()));
        let service = Service {
            resource: resource.to_string(),
            devices: devices.iter().map(|d| d.to_string()).collect(),
            calls: calls.clone(),
        };
        let server = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(DevicePluginServer::new(service))
                .serve_with_incoming(UnixListenerStream::new(listener))
                .await;
        });
        let plugin = Plugin {
            socket,
            server,
            calls,
        };
        // kubelet dials the endpoint while it handles Register: the listener is bound above,
        // so its connection waits in the backlog until the server task accepts it.
        let channel = remora::grpc::unix_channel(&dir.join(KUBELET_SOCKET), Duration::from_secs(5));
        RegistrationClient::new(channel)
            .register(api::RegisterRequest {
                version: VERSION.into(),
                endpoint: endpoint.into(),
                resource_name: resource.into(),
                options: Some(api::DevicePluginOptions::default()),
            })
            .await
            .expect("kubelet accepts the registration");
        plugin
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        // Aborted, not shut down gracefully: the open ListAndWatch stream never ends.
        self.server.abort();
        let _ = std::fs::remove_file(&self.socket);
    }
}
