//! UpdatePodSandboxResources (in-place pod resize): recorded on the pause container's
//! containerd record, reported in verbose PodSandboxStatus, kept across a remora restart.

use std::time::Duration;

use remora::cri::v1;

use crate::cri;
use crate::harness::{scratch, wait_until, BedRemora, Remora};

fn resources(cpu_shares: i64, memory: i64) -> v1::LinuxContainerResources {
    v1::LinuxContainerResources {
        cpu_period: 100_000,
        cpu_quota: 50_000,
        cpu_shares,
        memory_limit_in_bytes: memory,
        ..Default::default()
    }
}

async fn update(
    remora: &Remora,
    pod: &str,
    overhead: Option<v1::LinuxContainerResources>,
    resources: Option<v1::LinuxContainerResources>,
) -> Result<(), tonic::Status> {
    remora
        .runtime()
        .update_pod_sandbox_resources(v1::UpdatePodSandboxResourcesRequest {
            pod_sandbox_id: pod.into(),
            overhead,
            resources,
        })
        .await
        .map(|_| ())
}

/// The verbose status's `info` JSON.
async fn verbose_info(remora: &Remora, pod: &str) -> Result<serde_json::Value, tonic::Status> {
    let r = remora
        .runtime()
        .pod_sandbox_status(v1::PodSandboxStatusRequest {
            pod_sandbox_id: pod.into(),
            verbose: true,
        })
        .await?
        .into_inner();
    Ok(serde_json::from_str(&r.info["info"]).expect("info is JSON"))
}

#[tokio::test]
async fn pod_resources_are_recorded_reported_and_kept_across_a_restart() {
    let mut bed = BedRemora::start();
    let logs = scratch();
    let pod = cri::run_pod(&bed.remora, &cri::pod_config("resized", logs.path(), true))
        .await
        .expect("pod");

    let info = verbose_info(&bed.remora, &pod).await.expect("status");
    assert!(
        info.get("resources").is_none() && info.get("overhead").is_none(),
        "nothing reported before an update: {info}"
    );

    update(
        &bed.remora,
        &pod,
        Some(resources(10, 0)),
        Some(resources(512, 256 << 20)),
    )
    .await
    .expect("UpdatePodSandboxResources");
    let want_resources = serde_json::json!({"linux": {
        "cpu_period": 100_000, "cpu_quota": 50_000, "cpu_shares": 512,
        "memory_limit_in_bytes": 268_435_456_u64,
    }});
    let want_overhead = serde_json::json!({"linux": {
        "cpu_period": 100_000, "cpu_quota": 50_000, "cpu_shares": 10,
    }});
    let info = verbose_info(&bed.remora, &pod).await.expect("status");
    assert_eq!(info["resources"], want_resources, "{info}");
    assert_eq!(info["overhead"], want_overhead, "{info}");

    bed.crash();
    bed.restart();
    wait_until(
        "the index to be rebuilt",
        Duration::from_secs(15),
        || async { cri::pod_status(&bed.remora, &pod).await.is_ok() },
    )
    .await;
    let info = verbose_info(&bed.remora, &pod).await.expect("status");
    assert_eq!(
        info["resources"], want_resources,
        "kept across the restart: {info}"
    );
    assert_eq!(info["overhead"], want_overhead, "{info}");
    assert_eq!(
        cri::pod_status(&bed.remora, &pod)
            .await
            .expect("status")
            .state,
        v1::PodSandboxState::SandboxReady as i32
    );

    // Bad input names its field; the recorded resources stay.
    let mut bad = resources(1, 0);
    bad.cpuset_cpus = "0-3;rm".into();
    let err = update(&bed.remora, &pod, None, Some(bad))
        .await
        .expect_err("bad cpuset");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("resources.cpuset_cpus"), "{err:?}");
    let err = update(&bed.remora, &pod, Some(resources(-5, 0)), None)
        .await
        .expect_err("negative shares");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("overhead.cpu_shares"), "{err:?}");
    let info = verbose_info(&bed.remora, &pod).await.expect("status");
    assert_eq!(info["resources"], want_resources, "{info}");

    // An unknown pod, and no pod id at all.
    let err = update(&bed.remora, &"e".repeat(64), None, Some(resources(2, 0)))
        .await
        .expect_err("unknown pod");
    assert_eq!(err.code(), tonic::Code::NotFound, "{err:?}");
    let err = update(&bed.remora, "", None, Some(resources(2, 0)))
        .await
        .expect_err("no pod id");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");

    cri::remove_pod(&bed.remora, &pod).await;
}
