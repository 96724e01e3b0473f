use super::*;

#[test]
fn sandbox_config_maps_every_field() {
    let c = sandbox_config(&kubelet_pod()).unwrap();
    assert_eq!(
        c,
        SandboxConfig {
            name: "nginx-7c5ddbdf54-x2x4q".into(),
            namespace: "default".into(),
            uid: "0a1f63d6-8d2b-4e4e-9f5e-1d2b3c4d5e6f".into(),
            hostname: "nginx-7c5ddbdf54-x2x4q".into(),
            log_directory: "/var/log/pods/default_nginx-7c5ddbdf54-x2x4q_0a1f63d6".into(),
            cgroup_parent: "/kubepods/besteffort/pod0a1f63d6".into(),
            sysctls: map(&[("net.ipv4.ip_unprivileged_port_start", "0")]),
            annotations: map(&[("kubernetes.io/config.source", "api")]),
            security: SecurityContext {
                namespaces: NamespaceOptions {
                    network: NamespaceMode::Pod,
                    pid: NamespaceMode::Container,
                    ipc: NamespaceMode::Pod,
                    user: None,
                },
                run_as_user: Some(65535),
                run_as_group: Some(65535),
                supplemental_groups: vec![2000],
                seccomp: SeccompProfile::RuntimeDefault,
                ..Default::default()
            },
        }
    );
}

#[test]
fn sandbox_config_defaults_without_linux() {
    let mut pod = kubelet_pod();
    pod.linux = None;
    let c = sandbox_config(&pod).unwrap();
    assert_eq!(c.cgroup_parent, "");
    assert!(c.sysctls.is_empty());
    assert_eq!(c.security, SecurityContext::default());
    assert_eq!(c.security.seccomp, SeccompProfile::Unconfined);
    assert_eq!(c.security.apparmor, None);

    // linux present, security context absent: the same defaults.
    let mut pod = kubelet_pod();
    pod.linux.as_mut().unwrap().security_context = None;
    assert_eq!(
        sandbox_config(&pod).unwrap().security,
        SecurityContext::default()
    );
}

#[test]
fn sandbox_host_namespaces_and_privileged() {
    let mut pod = kubelet_pod();
    // A host-network pod cannot set net.* sysctls (bad_pod_values_are_refused_...).
    pod.linux.as_mut().unwrap().sysctls.clear();
    let sc = pod
        .linux
        .as_mut()
        .unwrap()
        .security_context
        .as_mut()
        .unwrap();
    sc.privileged = true;
    sc.readonly_rootfs = true;
    sc.supplemental_groups_policy = v1::SupplementalGroupsPolicy::Strict as i32;
    sc.namespace_options = Some(v1::NamespaceOption {
        network: v1::NamespaceMode::Node as i32,
        pid: v1::NamespaceMode::Node as i32,
        ipc: v1::NamespaceMode::Node as i32,
        target_id: String::new(),
        userns_options: Some(v1::UserNamespace {
            mode: v1::NamespaceMode::Node as i32,
            ..Default::default()
        }),
    });
    let s = sandbox_config(&pod).unwrap().security;
    assert!(s.privileged && s.readonly_rootfs);
    assert_eq!(
        s.supplemental_groups_policy,
        SupplementalGroupsPolicy::Strict
    );
    assert_eq!(
        s.namespaces,
        NamespaceOptions {
            network: NamespaceMode::Node,
            pid: NamespaceMode::Node,
            ipc: NamespaceMode::Node,
            user: None,
        }
    );
}

#[test]
fn sandbox_metadata_is_required() {
    let mut pod = kubelet_pod();
    pod.metadata = None;
    assert_eq!(
        sandbox_config(&pod).unwrap_err(),
        ConvertError::Missing {
            field: "config.metadata".into()
        }
    );
    for (clear, field) in [
        (0, "config.metadata.name"),
        (1, "config.metadata.namespace"),
        (2, "config.metadata.uid"),
    ] {
        let mut pod = kubelet_pod();
        let m = pod.metadata.as_mut().unwrap();
        match clear {
            0 => m.name.clear(),
            1 => m.namespace.clear(),
            _ => m.uid.clear(),
        }
        let err = sandbox_config(&pod).unwrap_err();
        assert_eq!(
            err,
            ConvertError::Missing {
                field: field.into()
            }
        );
        assert_eq!(err.to_string(), format!("{field} is required"));
        assert_eq!(sandbox_metadata("id", &pod, "").unwrap_err(), err);
    }
}

#[test]
fn sandbox_unknown_enums_are_rejected() {
    let mut pod = kubelet_pod();
    let sc = pod
        .linux
        .as_mut()
        .unwrap()
        .security_context
        .as_mut()
        .unwrap();
    sc.namespace_options.as_mut().unwrap().pid = 9;
    let err = sandbox_config(&pod).unwrap_err();
    assert_eq!(
        err,
        ConvertError::UnknownEnum {
            field: "config.linux.security_context.namespace_options.pid".into(),
            value: 9
        }
    );

    let mut pod = kubelet_pod();
    let sc = pod
        .linux
        .as_mut()
        .unwrap()
        .security_context
        .as_mut()
        .unwrap();
    sc.supplemental_groups_policy = 5;
    assert!(matches!(
        sandbox_config(&pod).unwrap_err(),
        ConvertError::UnknownEnum { field, value: 5 }
            if field == "config.linux.security_context.supplemental_groups_policy"
    ));
}

/// The pod with `userns_options` set to `u`, converted.
fn with_userns(u: v1::UserNamespace) -> Result<crate::spec::SandboxConfig, ConvertError> {
    let mut pod = kubelet_pod();
    let sc = pod
        .linux
        .as_mut()
        .unwrap()
        .security_context
        .as_mut()
        .unwrap();
    sc.namespace_options.as_mut().unwrap().userns_options = Some(u);
    sandbox_config(&pod)
}

fn idm(container_id: u32, host_id: u32, length: u32) -> v1::IdMapping {
    v1::IdMapping {
        container_id,
        host_id,
        length,
    }
}

const USERNS: &str = "config.linux.security_context.namespace_options.userns_options";

#[test]
fn a_pod_user_namespace_takes_one_mapping_each_from_container_id_0() {
    use crate::spec::{IdMapping, UserNamespace};
    let pod = |uids, gids| v1::UserNamespace {
        mode: v1::NamespaceMode::Pod as i32,
        uids,
        gids,
    };
    let ok = with_userns(pod(vec![idm(0, 65536, 65536)], vec![idm(0, 131072, 65536)])).unwrap();
    assert_eq!(
        ok.security.namespaces.user,
        Some(UserNamespace {
            uids: IdMapping {
                container_id: 0,
                host_id: 65536,
                length: 65536
            },
            gids: IdMapping {
                container_id: 0,
                host_id: 131072,
                length: 65536
            },
        })
    );
    let field = |e: ConvertError| match e {
        ConvertError::Invalid { field, .. } => field,
        other => panic!("not INVALID_ARGUMENT naming a field: {other:?}"),
    };
    // critest: "runtime should fail if more than one mapping provided".
    let two = vec![idm(0, 1000, 100000), idm(0, 2000, 100000)];
    assert_eq!(
        field(with_userns(pod(two.clone(), two)).unwrap_err()),
        format!("{USERNS}.uids")
    );
    assert_eq!(
        field(with_userns(pod(vec![idm(0, 1, 1)], vec![])).unwrap_err()),
        format!("{USERNS}.gids")
    );
    // critest: "runtime should fail if container ID 0 is not mapped".
    let one = vec![idm(1, 1000, 100000)];
    assert_eq!(
        field(with_userns(pod(one.clone(), one)).unwrap_err()),
        format!("{USERNS}.uids[0].container_id")
    );
    assert_eq!(
        field(with_userns(pod(vec![idm(0, 1, 1)], vec![idm(0, 1, 0)])).unwrap_err()),
        format!("{USERNS}.gids[0].length")
    );
    assert_eq!(
        field(with_userns(pod(vec![idm(0, u32::MAX, 2)], vec![idm(0, 1, 1)])).unwrap_err()),
        format!("{USERNS}.uids[0].host_id")
    );
}

#[test]
fn node_user_namespace_is_the_hosts_and_takes_no_mappings() {
    let node = |uids| v1::UserNamespace {
        mode: v1::NamespaceMode::Node as i32,
        uids,
        gids: vec![],
    };
    assert_eq!(
        with_userns(node(vec![])).unwrap().security.namespaces.user,
        None
    );
    assert!(matches!(
        with_userns(node(vec![idm(0, 1000, 1)])).unwrap_err(),
        ConvertError::Invalid { field, .. } if field == format!("{USERNS}.uids")
    ));
}

#[test]
fn container_and_target_user_namespaces_are_refused() {
    // critest: "runtime should fail with NamespaceMode_CONTAINER" / "_TARGET".
    for mode in [v1::NamespaceMode::Container, v1::NamespaceMode::Target] {
        let err = with_userns(v1::UserNamespace {
            mode: mode as i32,
            ..Default::default()
        })
        .unwrap_err();
        assert!(
            matches!(&err, ConvertError::Invalid { field, value, .. }
                if *field == format!("{USERNS}.mode") && value == mode.as_str_name()),
            "{err:?}"
        );
    }
    assert!(matches!(
        with_userns(v1::UserNamespace {
            mode: 7,
            ..Default::default()
        })
        .unwrap_err(),
        ConvertError::UnknownEnum { value: 7, .. }
    ));
}

#[test]
#[allow(deprecated)]
fn sandbox_seccomp_typed_field_wins_over_path() {
    use v1::security_profile::ProfileType;
    let with = |typed: Option<v1::SecurityProfile>, path: &str| {
        let mut pod = kubelet_pod();
        let sc = pod
            .linux
            .as_mut()
            .unwrap()
            .security_context
            .as_mut()
            .unwrap();
        sc.seccomp = typed;
        sc.seccomp_profile_path = path.to_string();
        sandbox_config(&pod).map(|c| c.security.seccomp)
    };
    assert_eq!(
        with(profile(ProfileType::Unconfined, ""), "runtime/default"),
        Ok(SeccompProfile::Unconfined)
    );
    assert_eq!(
        with(None, "runtime/default"),
        Ok(SeccompProfile::RuntimeDefault)
    );
    assert_eq!(with(None, ""), Ok(SeccompProfile::Unconfined));
    assert_eq!(
        with(None, "localhost/var/lib/kubelet/seccomp/audit.json"),
        Err(ConvertError::Invalid {
            field: "config.linux.security_context.seccomp_profile_path".into(),
            value: "var/lib/kubelet/seccomp/audit.json".into(),
            reason: "a localhost seccomp profile must be an absolute path",
        })
    );
    assert_eq!(
        with(None, "localhost//var/lib/kubelet/seccomp/audit.json"),
        Ok(SeccompProfile::Localhost(
            "/var/lib/kubelet/seccomp/audit.json".into()
        ))
    );
    assert_eq!(
        with(
            profile(
                ProfileType::Localhost,
                "/var/lib/kubelet/seccomp/audit.json"
            ),
            "unconfined"
        ),
        Ok(SeccompProfile::Localhost(
            "/var/lib/kubelet/seccomp/audit.json".into()
        ))
    );
}

#[test]
fn sandbox_dns_from_kubelet_config() {
    let pod = kubelet_pod();
    let d = sandbox_dns(&pod).unwrap();
    assert_eq!(d.servers, ["10.96.0.10"]);
    assert_eq!(
        d.searches,
        [
            "default.svc.cluster.local",
            "svc.cluster.local",
            "cluster.local"
        ]
    );
    assert_eq!(d.options, ["ndots:5"]);
    assert_eq!(
        sandbox_cni_dns(&pod),
        Some(DnsConfig {
            servers: d.servers.clone(),
            searches: d.searches.clone(),
            options: d.options.clone(),
        })
    );
}

#[test]
fn sandbox_dns_absent_or_empty_uses_the_host_file() {
    let mut pod = kubelet_pod();
    pod.dns_config = None;
    assert!(sandbox_dns(&pod).is_none());
    assert_eq!(sandbox_cni_dns(&pod), None);
    pod.dns_config = Some(v1::DnsConfig::default());
    assert!(sandbox_dns(&pod).is_none());
    // CNI still gets the (empty) capability, as containerd passes it.
    assert_eq!(sandbox_cni_dns(&pod), Some(DnsConfig::default()));
}

#[test]
fn sandbox_port_mappings_keep_order_and_zero_host_ports() {
    let mut pod = kubelet_pod();
    pod.port_mappings.push(v1::PortMapping {
        protocol: v1::Protocol::Sctp as i32,
        container_port: 9000,
        host_port: 9000,
        host_ip: "::1".into(),
    });
    assert_eq!(
        sandbox_port_mappings(&pod).unwrap(),
        vec![
            PortMapping {
                host_port: 8080,
                container_port: 80,
                protocol: Protocol::Tcp,
                host_ip: String::new(),
            },
            PortMapping {
                host_port: 0,
                container_port: 53,
                protocol: Protocol::Udp,
                host_ip: "127.0.0.1".into(),
            },
            PortMapping {
                host_port: 9000,
                container_port: 9000,
                protocol: Protocol::Sctp,
                host_ip: "::1".into(),
            },
        ]
    );
    pod.port_mappings.clear();
    assert_eq!(sandbox_port_mappings(&pod).unwrap(), vec![]);
}

#[test]
fn sandbox_port_mapping_unknown_protocol_names_the_index() {
    let mut pod = kubelet_pod();
    pod.port_mappings[1].protocol = 7;
    let err = sandbox_port_mappings(&pod).unwrap_err();
    assert_eq!(
        err.to_string(),
        "config.port_mappings[1].protocol has unknown value 7"
    );
}

#[test]
fn sandbox_metadata_from_request() {
    let m = sandbox_metadata("abc", &kubelet_pod(), "runc").unwrap();
    assert_eq!(m.id, "abc");
    assert_eq!(
        (m.name.as_str(), m.namespace.as_str(), m.attempt),
        ("nginx-7c5ddbdf54-x2x4q", "default", 1)
    );
    assert_eq!(m.uid, "0a1f63d6-8d2b-4e4e-9f5e-1d2b3c4d5e6f");
    assert_eq!(m.labels["app"], "nginx");
    assert_eq!(m.annotations["kubernetes.io/config.source"], "api");
    assert_eq!(m.runtime_handler, "runc");
    assert_eq!(m.hostname, "nginx-7c5ddbdf54-x2x4q");
    assert_eq!(m.cgroup_parent, "/kubepods/besteffort/pod0a1f63d6");
    assert_eq!(m.namespace_options.pid, NamespaceMode::Container);
    // Left to the caller.
    assert_eq!((m.created_at, m.ip.as_str()), (0, ""));
}

/// The pod config kept as JSON on a sandbox record (for CreateContainer after a restart) reads
/// back as it was written.
#[test]
fn a_kept_pod_config_round_trips_through_json() {
    let pod = kubelet_pod();
    let json = serde_json::to_vec(&pod).unwrap();
    let back: v1::PodSandboxConfig = serde_json::from_slice(&json).unwrap();
    assert_eq!(back, pod);
}

/// A record written by remora built on k8s-cri 0.11 (cri-api v0.32, serde derived on every
/// message: every field written, `null` for an absent message, enums as numbers) still reads
/// after the switch to remora's own bindings, and a field it lacks takes its default.
#[test]
fn a_pod_config_kept_by_the_k8s_cri_bindings_still_reads() {
    let old = r#"{
        "metadata": {"name": "web", "uid": "u1", "namespace": "default", "attempt": 1},
        "hostname": "web",
        "log_directory": "/var/log/pods/default_web_u1",
        "dns_config": {"servers": ["10.96.0.10"], "searches": [], "options": ["ndots:5"]},
        "port_mappings": [{"protocol": 0, "container_port": 80, "host_port": 8080, "host_ip": ""}],
        "labels": {"app": "web"},
        "annotations": {},
        "linux": {
            "cgroup_parent": "/kubepods/podu1",
            "security_context": {
                "namespace_options": {"network": 0, "pid": 1, "ipc": 0, "target_id": "",
                                      "userns_options": null},
                "selinux_options": null,
                "run_as_user": {"value": 1000},
                "run_as_group": null,
                "readonly_rootfs": false,
                "supplemental_groups": [],
                "privileged": false,
                "seccomp": {"profile_type": 0, "localhost_ref": ""},
                "apparmor": null,
                "seccomp_profile_path": "",
                "supplemental_groups_policy": 0
            },
            "sysctls": {},
            "overhead": null,
            "resources": null
        },
        "windows": null
    }"#;
    let pod: v1::PodSandboxConfig = serde_json::from_str(old).unwrap();
    assert_eq!(pod.metadata.as_ref().unwrap().name, "web");
    assert_eq!(pod.port_mappings[0].host_port, 8080);
    let sc = pod
        .linux
        .as_ref()
        .unwrap()
        .security_context
        .as_ref()
        .unwrap();
    assert_eq!(sc.run_as_user, Some(v1::Int64Value { value: 1000 }));
    assert_eq!(
        sc.namespace_options.as_ref().unwrap().pid,
        v1::NamespaceMode::Container as i32
    );
    // It converts as CreateContainer converts it.
    let c = sandbox_config(&pod).unwrap();
    assert_eq!(c.cgroup_parent, "/kubepods/podu1");
    // Fields left out (a record of an older or newer schema) take their defaults.
    let sparse: v1::PodSandboxConfig =
        serde_json::from_str(r#"{"metadata": {"name": "web"}, "linux": {}}"#).unwrap();
    assert_eq!(sparse.metadata.unwrap().uid, "");
    assert_eq!(sparse.linux.unwrap().security_context, None);
}
