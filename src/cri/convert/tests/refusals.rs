use super::*;

/// A change to a request, for tables of bad values.
type Edit<T> = Box<dyn FnOnce(&mut T)>;

/// The error of `f` applied to kubelet's pod config, as (field, reason).
fn pod_error(f: impl FnOnce(&mut v1::PodSandboxConfig)) -> (String, String) {
    let mut pod = kubelet_pod();
    f(&mut pod);
    match sandbox_config(&pod).unwrap_err() {
        ConvertError::Invalid { field, reason, .. } => (field, reason.to_string()),
        other => panic!("expected Invalid, got {other:?}"),
    }
}

#[test]
fn bad_pod_values_are_refused_naming_the_field() {
    let sc = |p: &mut v1::PodSandboxConfig| {
        p.linux
            .as_mut()
            .unwrap()
            .security_context
            .as_mut()
            .unwrap()
            .namespace_options
            .as_mut()
            .unwrap()
            .network = v1::NamespaceMode::Node as i32;
    };
    let cases: Vec<(Edit<v1::PodSandboxConfig>, &str)> = vec![
        (
            Box::new(|p| p.metadata.as_mut().unwrap().name = "a/b".into()),
            "config.metadata.name",
        ),
        (
            Box::new(|p| p.metadata.as_mut().unwrap().name = "a\0b".into()),
            "config.metadata.name",
        ),
        (
            Box::new(|p| p.metadata.as_mut().unwrap().name = "n".repeat(254)),
            "config.metadata.name",
        ),
        (
            Box::new(|p| p.metadata.as_mut().unwrap().namespace = "..".into()),
            "config.metadata.namespace",
        ),
        (
            Box::new(|p| p.metadata.as_mut().unwrap().uid = "u;K8S_POD_NAME=x".into()),
            "config.metadata.uid",
        ),
        (Box::new(|p| p.hostname = "h".repeat(65)), "config.hostname"),
        (
            Box::new(|p| p.hostname = "h\n10.0.0.1 evil".into()),
            "config.hostname",
        ),
        (
            Box::new(|p| p.log_directory = "var/log/pods/x".into()),
            "config.log_directory",
        ),
        (
            Box::new(|p| p.log_directory = "/var/log/pods/../../etc".into()),
            "config.log_directory",
        ),
        (
            Box::new(|p| {
                p.labels.insert("big".into(), "v".repeat(5000));
            }),
            "config.labels[big]",
        ),
        (
            Box::new(|p| {
                p.annotations.insert("big".into(), "v".repeat(600 * 1024));
            }),
            "config.annotations",
        ),
        (
            Box::new(|p| {
                p.dns_config
                    .as_mut()
                    .unwrap()
                    .servers
                    .push("8.8.8.8\nsearch x".into())
            }),
            "config.dns_config.servers[1]",
        ),
        (
            Box::new(|p| p.linux.as_mut().unwrap().cgroup_parent = "/kubepods/../..".into()),
            "config.linux.cgroup_parent",
        ),
        (
            Box::new(|p| {
                p.linux
                    .as_mut()
                    .unwrap()
                    .sysctls
                    .insert("kernel.foo".into(), "1".into());
            }),
            "config.linux.sysctls[kernel.foo]",
        ),
        (
            Box::new(|p| {
                p.linux
                    .as_mut()
                    .unwrap()
                    .sysctls
                    .insert("net..ipv4".into(), "1".into());
            }),
            "config.linux.sysctls[net..ipv4]",
        ),
        (
            Box::new(|p| {
                p.linux
                    .as_mut()
                    .unwrap()
                    .sysctls
                    .insert("net/../../x".into(), "1".into());
            }),
            "config.linux.sysctls[net/../../x]",
        ),
        // kubelet's pod sets a net.* sysctl: refused once the pod is on the host network.
        (
            Box::new(sc),
            "config.linux.sysctls[net.ipv4.ip_unprivileged_port_start]",
        ),
        (
            Box::new(|p| p.port_mappings[0].host_port = 70000),
            "config.port_mappings[0].host_port",
        ),
        (
            Box::new(|p| p.port_mappings[0].container_port = 0),
            "config.port_mappings[0].container_port",
        ),
        (
            Box::new(|p| p.port_mappings[0].host_ip = "localhost".into()),
            "config.port_mappings[0].host_ip",
        ),
    ];
    for (f, want) in cases {
        let mut pod = kubelet_pod();
        f(&mut pod);
        let err = sandbox_config(&pod)
            .and_then(|_| sandbox_port_mappings(&pod).map(|_| SandboxConfig::default()))
            .unwrap_err();
        assert!(
            matches!(&err, ConvertError::Invalid { field, .. } if field == want),
            "{want}: {err}"
        );
        let status: tonic::Status = crate::cri::error::CriError::from(err).into();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains(want), "{}", status.message());
    }
    // A port mapping without a host port is not checked (the network layer skips it).
    let mut pod = kubelet_pod();
    pod.port_mappings[1].container_port = -5;
    assert!(sandbox_port_mappings(&pod).is_ok());
    // Allowed: a namespaced IPC sysctl, a long-but-legal name and hostname.
    let (f, _) = pod_error(|p| {
        p.linux
            .as_mut()
            .unwrap()
            .sysctls
            .insert("kernel.shm_rmid_forced".into(), "1".into());
        p.metadata.as_mut().unwrap().name = "n".repeat(253);
        p.hostname = "h".repeat(64);
        p.metadata.as_mut().unwrap().uid = "bad uid".into();
    });
    assert_eq!(f, "config.metadata.uid", "only the uid is wrong");
}

#[test]
fn bad_container_values_are_refused_naming_the_field() {
    fn mounts(c: &mut v1::ContainerConfig) -> &mut v1::Mount {
        &mut c.mounts[0]
    }
    let cases: Vec<(Edit<v1::ContainerConfig>, &str)> = vec![
        (
            Box::new(|c| c.metadata.as_mut().unwrap().name = "a/b".into()),
            "config.metadata.name",
        ),
        (
            Box::new(|c| mounts(c).container_path = "etc/x".into()),
            "config.mounts[0].container_path",
        ),
        (
            Box::new(|c| mounts(c).container_path = "/etc/../../x".into()),
            "config.mounts[0].container_path",
        ),
        (
            Box::new(|c| mounts(c).container_path = "/".into()),
            "config.mounts[0].container_path",
        ),
        (
            Box::new(|c| mounts(c).host_path = "relative/dir".into()),
            "config.mounts[0].host_path",
        ),
        (
            Box::new(|c| mounts(c).host_path = "/var/lib/x\0y".into()),
            "config.mounts[0].host_path",
        ),
        (
            Box::new(|c| c.envs[0].key = "A=B".into()),
            "config.envs[0].key",
        ),
        (
            Box::new(|c| c.command[0] = "/bin/sh\0".into()),
            "config.command[0]",
        ),
        (
            Box::new(|c| c.working_dir = "srv".into()),
            "config.working_dir",
        ),
        (
            Box::new(|c| {
                c.annotations.insert("big".into(), "v".repeat(600 * 1024));
            }),
            "config.annotations",
        ),
        (
            Box::new(|c| resources_mut(c).cpu_quota = -2),
            "config.linux.resources.cpu_quota",
        ),
        (
            Box::new(|c| resources_mut(c).cpu_period = -1),
            "config.linux.resources.cpu_period",
        ),
        (
            Box::new(|c| resources_mut(c).memory_limit_in_bytes = -1),
            "config.linux.resources.memory_limit_in_bytes",
        ),
        (
            Box::new(|c| resources_mut(c).oom_score_adj = -1001),
            "config.linux.resources.oom_score_adj",
        ),
    ];
    for (f, want) in cases {
        let mut c = kubelet_container();
        f(&mut c);
        let err = container_config(&c, &kubelet_pod()).unwrap_err();
        assert!(
            matches!(&err, ConvertError::Invalid { field, .. } if field == want),
            "{want}: {err}"
        );
    }
    let mut c = kubelet_container();
    c.labels.insert("k".into(), "v".repeat(4096));
    assert!(matches!(
        container_metadata("c1", "abc", &c, &kubelet_pod()).unwrap_err(),
        ConvertError::Invalid { field, .. } if field == "config.labels[k]"
    ));
    let mut pod = kubelet_pod();
    pod.metadata.as_mut().unwrap().name = "a/b".into();
    assert!(matches!(
        container_metadata("c1", "abc", &kubelet_container(), &pod).unwrap_err(),
        ConvertError::Invalid { field, .. } if field == "sandbox_config.metadata.name"
    ));
}
