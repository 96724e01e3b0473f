//! CRI request builders and calls shared by the integration tests (each call makes a fresh
//! client, so a test can restart remora between calls).

use std::path::Path;
use std::time::Duration;

use remora::cri::v1;

use crate::harness::{wait_until, Remora};

/// A pod config; `host_network` pods need no CNI.
pub fn pod_config(name: &str, log_dir: &Path, host_network: bool) -> v1::PodSandboxConfig {
    let security_context = host_network.then(|| v1::LinuxSandboxSecurityContext {
        namespace_options: Some(v1::NamespaceOption {
            network: v1::NamespaceMode::Node as i32,
            ..Default::default()
        }),
        ..Default::default()
    });
    v1::PodSandboxConfig {
        metadata: Some(v1::PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{name}"),
            namespace: "remora-it".into(),
            attempt: 0,
        }),
        log_directory: log_dir.display().to_string(),
        linux: Some(v1::LinuxPodSandboxConfig {
            security_context,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// An image spec naming `image`.
pub fn image_spec(image: &str) -> v1::ImageSpec {
    v1::ImageSpec {
        image: image.into(),
        ..Default::default()
    }
}

/// A busybox container running `command`, logging to `<name>.log`.
pub fn container_config(name: &str, command: &[&str]) -> v1::ContainerConfig {
    v1::ContainerConfig {
        metadata: Some(v1::ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(image_spec("busybox")),
        command: command.iter().map(|s| s.to_string()).collect(),
        log_path: format!("{name}.log"),
        linux: Some(v1::LinuxContainerConfig::default()),
        ..Default::default()
    }
}

/// A busybox container running `sh -c script`, logging to `<name>.log`.
pub fn shell_container(name: &str, script: &str) -> v1::ContainerConfig {
    container_config(name, &["sh", "-c", script])
}

/// Pulls `image`.
pub async fn pull(remora: &Remora, image: &str) -> Result<String, tonic::Status> {
    remora
        .images()
        .pull_image(v1::PullImageRequest {
            image: Some(image_spec(image)),
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner().image_ref)
}

/// RunPodSandbox.
pub async fn run_pod(
    remora: &Remora,
    config: &v1::PodSandboxConfig,
) -> Result<String, tonic::Status> {
    remora
        .runtime()
        .run_pod_sandbox(v1::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        })
        .await
        .map(|r| r.into_inner().pod_sandbox_id)
}

/// PodSandboxStatus's verbose `info["info"]`, parsed.
pub async fn pod_verbose_info(remora: &Remora, pod: &str) -> serde_json::Value {
    let verbose = remora
        .runtime()
        .pod_sandbox_status(v1::PodSandboxStatusRequest {
            pod_sandbox_id: pod.to_string(),
            verbose: true,
        })
        .await
        .expect("PodSandboxStatus")
        .into_inner();
    serde_json::from_str(&verbose.info["info"]).expect("verbose info")
}

/// PodSandboxStatus.
pub async fn pod_status(remora: &Remora, pod: &str) -> Result<v1::PodSandboxStatus, tonic::Status> {
    remora
        .runtime()
        .pod_sandbox_status(v1::PodSandboxStatusRequest {
            pod_sandbox_id: pod.into(),
            verbose: false,
        })
        .await
        .map(|r| r.into_inner().status.expect("status"))
}

/// CreateContainer in `pod`.
pub async fn create(
    remora: &Remora,
    pod: &str,
    pod_config: &v1::PodSandboxConfig,
    config: v1::ContainerConfig,
) -> Result<String, tonic::Status> {
    remora
        .runtime()
        .create_container(v1::CreateContainerRequest {
            pod_sandbox_id: pod.into(),
            config: Some(config),
            sandbox_config: Some(pod_config.clone()),
        })
        .await
        .map(|r| r.into_inner().container_id)
}

/// CreateContainer then StartContainer; panics on failure.
pub async fn create_and_start(
    remora: &Remora,
    pod: &str,
    pod_config: &v1::PodSandboxConfig,
    config: v1::ContainerConfig,
) -> String {
    let id = create(remora, pod, pod_config, config)
        .await
        .expect("CreateContainer");
    start(remora, &id).await;
    id
}

/// StartContainer; panics on failure.
pub async fn start(remora: &Remora, id: &str) {
    remora
        .runtime()
        .start_container(v1::StartContainerRequest {
            container_id: id.into(),
        })
        .await
        .expect("StartContainer");
}

/// ContainerStatus.
pub async fn status(remora: &Remora, id: &str) -> Result<v1::ContainerStatus, tonic::Status> {
    remora
        .runtime()
        .container_status(v1::ContainerStatusRequest {
            container_id: id.into(),
            verbose: false,
        })
        .await
        .map(|r| r.into_inner().status.expect("status"))
}

/// Waits until container `id` is EXITED and returns its status.
pub async fn wait_exited(remora: &Remora, id: &str, limit: Duration) -> v1::ContainerStatus {
    wait_until("the container to be EXITED", limit, || async {
        status(remora, id).await.ok().map(|s| s.state)
            == Some(v1::ContainerState::ContainerExited as i32)
    })
    .await;
    status(remora, id).await.expect("status")
}

/// StopPodSandbox then RemovePodSandbox; panics on failure.
pub async fn remove_pod(remora: &Remora, pod: &str) {
    let mut rt = remora.runtime();
    rt.stop_pod_sandbox(v1::StopPodSandboxRequest {
        pod_sandbox_id: pod.into(),
    })
    .await
    .expect("StopPodSandbox");
    rt.remove_pod_sandbox(v1::RemovePodSandboxRequest {
        pod_sandbox_id: pod.into(),
    })
    .await
    .expect("RemovePodSandbox");
}

/// Status (of the runtime); panics on failure.
pub async fn runtime_status(remora: &Remora, verbose: bool) -> v1::StatusResponse {
    remora
        .runtime()
        .status(v1::StatusRequest { verbose })
        .await
        .expect("Status")
        .into_inner()
}

/// STOPPED events per container id on `events`, read until none arrives for `quiet`.
pub async fn count_stopped(
    events: &mut tonic::Streaming<v1::ContainerEventResponse>,
    quiet: Duration,
) -> std::collections::HashMap<String, usize> {
    let mut stopped = std::collections::HashMap::new();
    while let Ok(Some(Ok(e))) = tokio::time::timeout(quiet, events.message())
        .await
        .map(|r| r.transpose())
    {
        if e.container_event_type == v1::ContainerEventType::ContainerStoppedEvent as i32 {
            *stopped.entry(e.container_id).or_default() += 1;
        }
    }
    stopped
}

/// ListPodSandbox without a filter.
pub async fn list_pods(remora: &Remora) -> Vec<v1::PodSandbox> {
    remora
        .runtime()
        .list_pod_sandbox(v1::ListPodSandboxRequest { filter: None })
        .await
        .expect("ListPodSandbox")
        .into_inner()
        .items
}
