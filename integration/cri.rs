//! CRI request builders and calls shared by the fault tests (each call makes a fresh client,
//! so a test can restart remora between calls).

use std::path::Path;
use std::time::Duration;

use k8s_cri::v1;

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

/// A busybox container running `sh -c script`, logging to `<name>.log`.
pub fn shell_container(name: &str, script: &str) -> v1::ContainerConfig {
    v1::ContainerConfig {
        metadata: Some(v1::ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(v1::ImageSpec {
            image: "busybox".into(),
            ..Default::default()
        }),
        command: vec!["sh".into(), "-c".into(), script.into()],
        log_path: format!("{name}.log"),
        linux: Some(v1::LinuxContainerConfig::default()),
        ..Default::default()
    }
}

/// Pulls `image`.
pub async fn pull(remora: &Remora, image: &str) -> Result<String, tonic::Status> {
    remora
        .images()
        .pull_image(v1::PullImageRequest {
            image: Some(v1::ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
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
    remora
        .runtime()
        .start_container(v1::StartContainerRequest {
            container_id: id.clone(),
        })
        .await
        .expect("StartContainer");
    id
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
