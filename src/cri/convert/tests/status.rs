use super::*;

fn snapshot(state: SandboxState) -> SandboxSnapshot {
    let mut m = sandbox_metadata("abc", &kubelet_pod(), "runc").unwrap();
    m.created_at = 1_700_000_000_000_000_000;
    m.ip = "10.244.1.7".into();
    m.additional_ips = vec!["fd00:10:244:1::7".into()];
    SandboxSnapshot {
        metadata: Arc::new(m),
        status: SandboxStatus {
            state,
            ..Default::default()
        },
    }
}

#[test]
fn pod_sandbox_status_round_trip() {
    let s = pod_sandbox_status(&snapshot(SandboxState::Ready));
    let pod = kubelet_pod();
    assert_eq!(s.id, "abc");
    assert_eq!(s.metadata, pod.metadata);
    assert_eq!(s.state, v1::PodSandboxState::SandboxReady as i32);
    assert_eq!(s.created_at, 1_700_000_000_000_000_000);
    assert_eq!(
        s.network,
        Some(v1::PodSandboxNetworkStatus {
            ip: "10.244.1.7".into(),
            additional_ips: vec![v1::PodIp {
                ip: "fd00:10:244:1::7".into()
            }],
        })
    );
    let ns = s.linux.unwrap().namespaces.unwrap().options.unwrap();
    assert_eq!(
        (ns.network, ns.pid, ns.ipc),
        (
            v1::NamespaceMode::Pod as i32,
            v1::NamespaceMode::Container as i32,
            v1::NamespaceMode::Pod as i32
        )
    );
    // Labels and annotations come back unaltered (CRI MUST).
    assert_eq!(s.labels, pod.labels);
    assert_eq!(s.annotations, pod.annotations);
    assert_eq!(s.runtime_handler, "runc");
}

#[test]
fn pod_sandbox_list_item() {
    let p = pod_sandbox(&snapshot(SandboxState::NotReady));
    let pod = kubelet_pod();
    assert_eq!(
        p,
        v1::PodSandbox {
            id: "abc".into(),
            metadata: pod.metadata,
            state: v1::PodSandboxState::SandboxNotready as i32,
            created_at: 1_700_000_000_000_000_000,
            labels: pod.labels,
            annotations: pod.annotations,
            runtime_handler: "runc".into(),
        }
    );
}

#[test]
fn unknown_sandbox_state_is_reported_not_ready() {
    let s = snapshot(SandboxState::Unknown);
    assert_eq!(
        pod_sandbox(&s).state,
        v1::PodSandboxState::SandboxNotready as i32
    );
    assert_eq!(
        pod_sandbox_status(&s).state,
        v1::PodSandboxState::SandboxNotready as i32
    );
}

#[test]
fn host_network_status_has_an_empty_ip() {
    let mut m = (*snapshot(SandboxState::Ready).metadata).clone();
    m.ip.clear();
    m.additional_ips.clear();
    m.namespace_options.network = NamespaceMode::Node;
    let s = pod_sandbox_status(&SandboxSnapshot {
        metadata: Arc::new(m),
        status: SandboxStatus::ready(42),
    });
    assert_eq!(s.network, Some(v1::PodSandboxNetworkStatus::default()));
    let ns = s.linux.unwrap().namespaces.unwrap().options.unwrap();
    assert_eq!(ns.network, v1::NamespaceMode::Node as i32);
}

#[test]
fn sandbox_filter_mapping() {
    assert_eq!(sandbox_filter(None).unwrap(), SandboxFilter::default());
    assert_eq!(
        sandbox_filter(Some(&v1::PodSandboxFilter::default())).unwrap(),
        SandboxFilter::default()
    );
    let f = v1::PodSandboxFilter {
        id: "abc".into(),
        state: Some(v1::PodSandboxStateValue {
            state: v1::PodSandboxState::SandboxNotready as i32,
        }),
        label_selector: map(&[("app", "nginx")]),
    };
    assert_eq!(
        sandbox_filter(Some(&f)).unwrap(),
        SandboxFilter {
            id: Some("abc".into()),
            state: Some(SandboxState::NotReady),
            label_selector: map(&[("app", "nginx")]),
        }
    );
    let ready = v1::PodSandboxFilter {
        state: Some(v1::PodSandboxStateValue {
            state: v1::PodSandboxState::SandboxReady as i32,
        }),
        ..Default::default()
    };
    assert_eq!(
        sandbox_filter(Some(&ready)).unwrap().state,
        Some(SandboxState::Ready)
    );
    let bad = v1::PodSandboxFilter {
        state: Some(v1::PodSandboxStateValue { state: 4 }),
        ..Default::default()
    };
    assert_eq!(
        sandbox_filter(Some(&bad)).unwrap_err().to_string(),
        "filter.state.state has unknown value 4"
    );
}

fn container_snapshot(status: ContainerStatus) -> ContainerSnapshot {
    let mut m = container_metadata("c1", "abc", &kubelet_container(), &kubelet_pod()).unwrap();
    m.image.id = "sha256:5ef79149e0ec".into();
    m.image.reference = "docker.io/library/nginx@sha256:0d17b565".into();
    ContainerSnapshot {
        metadata: Arc::new(m),
        status,
    }
}

#[test]
fn container_status_round_trip() {
    let request = kubelet_container();
    let s = container_status(&container_snapshot(ContainerStatus {
        state: ContainerState::Exited,
        pid: 0,
        created_at: 10,
        started_at: 20,
        finished_at: 30,
        exit_code: 137,
        reason: "OOMKilled".into(),
        message: "memory limit".into(),
        oom_killed: true,
        ..Default::default()
    }));
    assert_eq!(s.id, "c1");
    assert_eq!(s.metadata, request.metadata);
    assert_eq!(s.state, v1::ContainerState::ContainerExited as i32);
    assert_eq!((s.created_at, s.started_at, s.finished_at), (10, 20, 30));
    assert_eq!(s.exit_code, 137);
    assert_eq!(
        (s.reason.as_str(), s.message.as_str()),
        ("OOMKilled", "memory limit")
    );
    // The image the pod spec named (see the test below).
    assert_eq!(s.image.unwrap().image, "nginx:1.27");
    assert_eq!(s.image_ref, "docker.io/library/nginx@sha256:0d17b565");
    assert_eq!(s.image_id, "sha256:5ef79149e0ec");
    assert_eq!(s.labels, request.labels);
    assert_eq!(s.annotations, request.annotations);
    assert_eq!(
        s.log_path,
        "/var/log/pods/default_nginx-7c5ddbdf54-x2x4q_0a1f63d6/nginx/2.log"
    );
    // The mounts come back as they were requested.
    assert_eq!(s.mounts, request.mounts);
}

/// A Burstable container that asks for CPU only (kubelet's pod_resize tests "Burstable pod -
/// remove cpu requests", "reorder containers"): ContainerStatus reports its resources as
/// recorded, memory unset, so that kubelet reports no memory request for it. Reporting no
/// resources at all makes kubelet fill a memory request of 0 from its own record, which the
/// tests see as "status resources mismatch … memory: 0" (containerd reports them).
#[test]
fn container_status_reports_recorded_resources_and_leaves_memory_unset() {
    let recorded = LinuxResources {
        cpu_period: 100_000,
        cpu_shares: 204,
        oom_score_adj: 1000,
        ..LinuxResources::default()
    };
    let s = container_status(&container_snapshot(ContainerStatus {
        state: ContainerState::Running,
        resources: Some(recorded),
        ..Default::default()
    }));
    let linux = s
        .resources
        .expect("resources reported")
        .linux
        .expect("linux resources reported");
    assert_eq!(
        linux,
        v1::LinuxContainerResources {
            cpu_period: 100_000,
            cpu_shares: 204,
            oom_score_adj: 1000,
            ..Default::default()
        }
    );
    assert_eq!(linux.memory_limit_in_bytes, 0, "not set");
    assert_eq!(linux.memory_swap_limit_in_bytes, 0, "not set");
    // A record from before remora kept resources reports none, as before.
    let old = container_status(&container_snapshot(ContainerStatus::default()));
    assert_eq!(old.resources, None);
}

/// kubelet creates a container by image id and names the pod spec's image in
/// `user_specified_image`; ContainerStatus reports the spec's name (kubelet shows it as the
/// container status's image: the node e2e suite's image-update tests wait for it), and
/// ListContainers the image as created, with the spec's name beside it.
#[test]
fn container_status_reports_the_image_the_pod_spec_named() {
    let mut request = kubelet_container();
    request.image = Some(v1::ImageSpec {
        image: "sha256:5ef79149e0ec".into(),
        user_specified_image: "registry.k8s.io/e2e-test-images/busybox:1.37.0-2".into(),
        ..Default::default()
    });
    let snapshot_of = |request: &v1::ContainerConfig| ContainerSnapshot {
        metadata: Arc::new(container_metadata("c1", "abc", request, &kubelet_pod()).unwrap()),
        status: ContainerStatus::default(),
    };
    let snapshot = snapshot_of(&request);
    let status_image = container_status(&snapshot).image.unwrap();
    assert_eq!(
        (
            status_image.image.as_str(),
            status_image.user_specified_image.as_str()
        ),
        (
            "registry.k8s.io/e2e-test-images/busybox:1.37.0-2",
            "registry.k8s.io/e2e-test-images/busybox:1.37.0-2"
        )
    );
    let list_image = container(&snapshot).image.unwrap();
    assert_eq!(
        (
            list_image.image.as_str(),
            list_image.user_specified_image.as_str()
        ),
        (
            "sha256:5ef79149e0ec",
            "registry.k8s.io/e2e-test-images/busybox:1.37.0-2"
        )
    );

    // A client that names no user-specified image gets the image as it asked for it.
    request.image = Some(v1::ImageSpec {
        image: "docker.io/library/busybox:1.36".into(),
        ..Default::default()
    });
    assert_eq!(
        container_status(&snapshot_of(&request))
            .image
            .unwrap()
            .image,
        "docker.io/library/busybox:1.36"
    );
}

/// An image volume's mount names the image as resolved, as asked for, and by the id that
/// PullImage answered (`ImageSpec.image_ref`, cri-api v0.37), with its sub path.
#[test]
fn container_status_reports_an_image_volume_by_id_and_sub_path() {
    let mut c = container_snapshot(ContainerStatus::default());
    let m = Arc::make_mut(&mut c.metadata);
    m.mounts = vec![crate::store::MountSummary {
        container_path: "/models".into(),
        host_path: "/var/lib/remora/image-volumes/c1/0-sub".into(),
        readonly: true,
        image: "sha256:5ef79149e0ec".into(),
        image_ref: "docker.io/library/nginx@sha256:0d17b565".into(),
        image_id: "sha256:5ef79149e0ec".into(),
        image_sub_path: "etc".into(),
        ..Default::default()
    }];
    let s = container_status(&c);
    assert_eq!(s.mounts[0].image_sub_path, "etc");
    assert_eq!(
        s.mounts[0].image,
        Some(v1::ImageSpec {
            image: "docker.io/library/nginx@sha256:0d17b565".into(),
            user_specified_image: "sha256:5ef79149e0ec".into(),
            image_ref: "sha256:5ef79149e0ec".into(),
            ..Default::default()
        })
    );
}

#[test]
fn container_status_reports_the_stop_signal_it_keeps() {
    let stop_signal = |kept: &str| {
        let mut c = container_snapshot(ContainerStatus::default());
        Arc::make_mut(&mut c.metadata).stop_signal = kept.into();
        container_status(&c).stop_signal
    };
    // Configured, or resolved from the image at creation, as `Signal` writes it.
    assert_eq!(stop_signal("SIGQUIT"), v1::Signal::Sigquit as i32);
    assert_eq!(stop_signal("SIGTERM"), v1::Signal::Sigterm as i32);
    assert_eq!(stop_signal("SIGRTMIN+3"), v1::Signal::Sigrtminplus3 as i32);
    assert_eq!(stop_signal("SIGCLD"), v1::Signal::Sigcld as i32);
    // glibc's 32 has no CRI value; a record from before remora kept it is the runtime's
    // default (the image's, else SIGTERM), as remora reported it then.
    assert_eq!(stop_signal("32"), v1::Signal::RuntimeDefault as i32);
    assert_eq!(stop_signal(""), v1::Signal::RuntimeDefault as i32);
}

#[test]
fn container_status_times_follow_the_state() {
    let status = |state, reason: &str, exit_code| {
        container_status(&container_snapshot(ContainerStatus {
            state,
            created_at: 10,
            started_at: 20,
            finished_at: 30,
            exit_code,
            reason: reason.into(),
            ..Default::default()
        }))
    };
    let s = status(ContainerState::Created, "", 0);
    assert_eq!((s.started_at, s.finished_at), (0, 0));
    assert_eq!(s.state, v1::ContainerState::ContainerCreated as i32);
    let s = status(ContainerState::Running, "", 0);
    assert_eq!((s.started_at, s.finished_at), (20, 0));
    assert_eq!(s.state, v1::ContainerState::ContainerRunning as i32);
    let s = status(ContainerState::Unknown, "", 0);
    assert_eq!((s.started_at, s.finished_at), (20, 30));
    assert_eq!(s.state, v1::ContainerState::ContainerUnknown as i32);
    // An exited container always has a reason.
    assert_eq!(status(ContainerState::Exited, "", 0).reason, "Completed");
    assert_eq!(status(ContainerState::Exited, "", 1).reason, "Error");
    assert_eq!(
        status(ContainerState::Exited, "StartError", 128).reason,
        "StartError"
    );
}

#[test]
fn container_list_item() {
    let request = kubelet_container();
    let c = container(&container_snapshot(ContainerStatus {
        state: ContainerState::Running,
        created_at: 10,
        started_at: 20,
        ..Default::default()
    }));
    assert_eq!(
        c,
        v1::Container {
            id: "c1".into(),
            pod_sandbox_id: "abc".into(),
            metadata: request.metadata,
            image: Some(v1::ImageSpec {
                image: "docker.io/library/nginx:1.27".into(),
                user_specified_image: "nginx:1.27".into(),
                ..Default::default()
            }),
            image_ref: "docker.io/library/nginx@sha256:0d17b565".into(),
            state: v1::ContainerState::ContainerRunning as i32,
            created_at: 10,
            labels: request.labels,
            annotations: request.annotations,
            image_id: "sha256:5ef79149e0ec".into(),
        }
    );
}

#[test]
fn container_filter_mapping() {
    assert_eq!(container_filter(None).unwrap(), ContainerFilter::default());
    assert_eq!(
        container_filter(Some(&v1::ContainerFilter::default())).unwrap(),
        ContainerFilter::default()
    );
    for (cri, domain) in [
        (
            v1::ContainerState::ContainerCreated,
            ContainerState::Created,
        ),
        (
            v1::ContainerState::ContainerRunning,
            ContainerState::Running,
        ),
        (v1::ContainerState::ContainerExited, ContainerState::Exited),
        (
            v1::ContainerState::ContainerUnknown,
            ContainerState::Unknown,
        ),
    ] {
        let f = v1::ContainerFilter {
            id: "c1".into(),
            pod_sandbox_id: "abc".into(),
            state: Some(v1::ContainerStateValue { state: cri as i32 }),
            label_selector: map(&[("io.kubernetes.container.name", "nginx")]),
        };
        assert_eq!(
            container_filter(Some(&f)).unwrap(),
            ContainerFilter {
                id: Some("c1".into()),
                pod_sandbox_id: Some("abc".into()),
                state: Some(domain),
                label_selector: map(&[("io.kubernetes.container.name", "nginx")]),
            }
        );
        assert_eq!(container_state_to_cri(domain), cri);
    }
    let bad = v1::ContainerFilter {
        state: Some(v1::ContainerStateValue { state: 9 }),
        ..Default::default()
    };
    assert_eq!(
        container_filter(Some(&bad)).unwrap_err(),
        ConvertError::UnknownEnum {
            field: "filter.state.state".into(),
            value: 9
        }
    );
}
