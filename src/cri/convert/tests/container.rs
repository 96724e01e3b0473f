use super::*;

#[test]
fn container_config_maps_every_field() {
    let c = container_config(&kubelet_container(), &kubelet_pod()).unwrap();
    assert_eq!(
        c,
        ContainerConfig {
            name: "nginx".into(),
            image_name: "docker.io/library/nginx:1.27".into(),
            command: vec!["/docker-entrypoint.sh".into()],
            args: vec!["nginx".into(), "-g".into(), "daemon off;".into()],
            working_dir: "/usr/share/nginx".into(),
            envs: vec![
                ("KUBERNETES_SERVICE_HOST".into(), "10.96.0.1".into()),
                ("A".into(), "x=y".into()),
            ],
            mounts: vec![
                MountRequest {
                    container_path: "/etc/nginx/conf.d".into(),
                    host_path: "/var/lib/kubelet/pods/0a1f/volumes/kubernetes.io~configmap/conf"
                        .into(),
                    readonly: true,
                    selinux_relabel: false,
                    propagation: MountPropagation::Private,
                    recursive_read_only: false,
                    image: None,
                    uid_mappings: Vec::new(),
                    gid_mappings: Vec::new(),
                    options: Vec::new(),
                },
                MountRequest {
                    container_path: "/dev/termination-log".into(),
                    host_path: "/var/lib/kubelet/pods/0a1f/containers/nginx/5c1e".into(),
                    readonly: false,
                    selinux_relabel: false,
                    propagation: MountPropagation::HostToContainer,
                    recursive_read_only: false,
                    image: None,
                    uid_mappings: Vec::new(),
                    gid_mappings: Vec::new(),
                    options: Vec::new(),
                },
            ],
            devices: vec![DeviceRequest {
                container_path: "/dev/fuse".into(),
                host_path: "/dev/fuse".into(),
                permissions: "rw".into(),
            }],
            cdi_devices: vec![],
            annotations: map(&[("io.kubernetes.container.hash", "8f2c1a")]),
            tty: false,
            stdin: true,
            resources: Some(Resources {
                cpu_period: 100_000,
                cpu_quota: 50_000,
                cpu_shares: 512,
                memory_limit_in_bytes: 128 << 20,
                memory_swap_limit_in_bytes: 128 << 20,
                oom_score_adj: 1000,
                cpuset_cpus: "0-1".into(),
                cpuset_mems: "0".into(),
                hugepage_limits: vec![HugepageLimit {
                    page_size: "2MB".into(),
                    limit: 0,
                }],
                pids_limit: None,
                unified: map(&[("memory.oom.group", "1")]),
            }),
            security: SecurityContext {
                capabilities: Some(CapabilityChanges {
                    add: vec!["NET_BIND_SERVICE".into()],
                    drop: vec!["ALL".into()],
                }),
                privileged: false,
                namespaces: NamespaceOptions {
                    network: NamespaceMode::Pod,
                    pid: NamespaceMode::Container,
                    ipc: NamespaceMode::Pod,
                    user: None,
                },
                run_as_user: Some(101),
                run_as_username: String::new(),
                run_as_group: Some(101),
                supplemental_groups: vec![2000, 3000],
                supplemental_groups_policy: SupplementalGroupsPolicy::Merge,
                readonly_rootfs: true,
                no_new_privs: true,
                seccomp: SeccompProfile::RuntimeDefault,
                apparmor: Some(AppArmorProfile::RuntimeDefault),
                masked_paths: Some(vec!["/proc/kcore".into()]),
                readonly_paths: Some(vec!["/proc/sys".into()]),
            },
        }
    );
}

/// critest's minimal container: name, image, command; no linux section.
#[test]
fn container_config_defaults() {
    let config = v1::ContainerConfig {
        metadata: Some(v1::ContainerMetadata {
            name: "container-for-create-test".into(),
            attempt: 0,
        }),
        image: Some(v1::ImageSpec {
            image: "registry.k8s.io/e2e-test-images/busybox:1.36.1-1".into(),
            ..Default::default()
        }),
        command: vec!["top".into()],
        ..Default::default()
    };
    let mut pod = kubelet_pod();
    pod.linux = None;
    let c = container_config(&config, &pod).unwrap();
    assert_eq!(c.resources, None);
    assert_eq!(c.security, SecurityContext::default());
    assert_eq!(c.security.capabilities, None);
    assert_eq!(c.security.seccomp, SeccompProfile::Unconfined);
    assert_eq!(c.security.apparmor, None);
    assert_eq!(c.security.masked_paths, None);
    assert!(c.mounts.is_empty() && c.devices.is_empty() && c.envs.is_empty());
    assert_eq!(container_target_id(&config), None);
}

/// `procMount: Unmasked` (a `hostUsers: false` pod): kubelet sends empty masked and read-only
/// path lists, and nothing is masked or made read-only; `Default` sends the default lists,
/// which are applied as sent. (containerd: empty lists unless the request has some.)
#[test]
fn empty_masked_and_readonly_paths_mask_nothing() {
    let mut config = kubelet_container();
    with_userns(&mut config, 1_000_000);
    let sc = config
        .linux
        .as_mut()
        .unwrap()
        .security_context
        .as_mut()
        .unwrap();
    sc.masked_paths.clear();
    sc.readonly_paths.clear();
    let s = container_config(&config, &kubelet_pod()).unwrap().security;
    assert_eq!(
        (&s.masked_paths, &s.readonly_paths),
        (&Some(vec![]), &Some(vec![]))
    );
    // What the spec builder makes of them.
    assert!(crate::spec::security::masked_paths(s.masked_paths.as_deref(), false).is_empty());
    assert!(crate::spec::security::readonly_paths(s.readonly_paths.as_deref(), false).is_empty());

    // procMount: Default: kubelet's lists, as sent.
    let sc = config
        .linux
        .as_mut()
        .unwrap()
        .security_context
        .as_mut()
        .unwrap();
    sc.masked_paths = vec!["/proc/kcore".into(), "/sys/firmware".into()];
    sc.readonly_paths = vec!["/proc/sys".into()];
    let s = container_config(&config, &kubelet_pod()).unwrap().security;
    assert_eq!(
        crate::spec::security::masked_paths(s.masked_paths.as_deref(), false),
        ["/proc/kcore", "/sys/firmware"]
    );
    assert_eq!(
        crate::spec::security::readonly_paths(s.readonly_paths.as_deref(), false),
        ["/proc/sys"]
    );
}

#[test]
fn container_namespaces_fall_back_to_the_pod() {
    let mut pod = kubelet_pod();
    let sc = pod
        .linux
        .as_mut()
        .unwrap()
        .security_context
        .as_mut()
        .unwrap();
    sc.namespace_options = Some(v1::NamespaceOption {
        network: v1::NamespaceMode::Node as i32,
        pid: v1::NamespaceMode::Pod as i32,
        ipc: v1::NamespaceMode::Node as i32,
        ..Default::default()
    });
    let host = NamespaceOptions {
        network: NamespaceMode::Node,
        pid: NamespaceMode::Pod,
        ipc: NamespaceMode::Node,
        user: None,
    };
    let mut config = kubelet_container();
    let csc = config
        .linux
        .as_mut()
        .unwrap()
        .security_context
        .as_mut()
        .unwrap();
    csc.namespace_options = None;
    assert_eq!(
        container_config(&config, &pod).unwrap().security.namespaces,
        host
    );
    config.linux.as_mut().unwrap().security_context = None;
    assert_eq!(
        container_config(&config, &pod).unwrap().security.namespaces,
        host
    );
    // The container's own options win when present.
    assert_eq!(
        container_config(&kubelet_container(), &pod)
            .unwrap()
            .security
            .namespaces
            .pid,
        NamespaceMode::Container
    );
}

#[test]
fn container_target_pid_namespace() {
    let mut config = kubelet_container();
    let ns = config
        .linux
        .as_mut()
        .unwrap()
        .security_context
        .as_mut()
        .unwrap()
        .namespace_options
        .as_mut()
        .unwrap();
    ns.pid = v1::NamespaceMode::Target as i32;
    ns.target_id = "f00d".into();
    assert_eq!(container_target_id(&config).as_deref(), Some("f00d"));
    assert_eq!(
        container_config(&config, &kubelet_pod())
            .unwrap()
            .security
            .namespaces
            .pid,
        NamespaceMode::Target
    );
}

#[test]
fn container_required_fields() {
    let pod = kubelet_pod();
    let err = |f: &dyn Fn(&mut v1::ContainerConfig)| {
        let mut c = kubelet_container();
        f(&mut c);
        container_config(&c, &pod).unwrap_err().to_string()
    };
    assert_eq!(err(&|c| c.metadata = None), "config.metadata is required");
    assert_eq!(
        err(&|c| c.metadata.as_mut().unwrap().name.clear()),
        "config.metadata.name is required"
    );
    assert_eq!(err(&|c| c.image = None), "config.image is required");
    assert_eq!(
        err(&|c| c.image.as_mut().unwrap().image.clear()),
        "config.image.image is required"
    );
    assert_eq!(
        err(&|c| c.cdi_devices = vec![
            v1::CdiDevice {
                name: "vendor.com/gpu=0".into()
            },
            v1::CdiDevice {
                name: "gpu0".into()
            }
        ]),
        "invalid config.cdi_devices[1].name \"gpu0\": not a fully qualified CDI device name (vendor/class=name)"
    );
    assert_eq!(
        err(&|c| {
            c.annotations
                .insert("cdi.k8s.io/plugin_dev".into(), "vendor.com/gpu=0, vendor.com/gpu=1".into());
        }),
        "invalid config.annotations[\"cdi.k8s.io/plugin_dev\"] \" vendor.com/gpu=1\": vendor and class must start with a letter"
    );
}

#[test]
fn cdi_devices_from_the_field_then_annotations_each_once() {
    let mut c = kubelet_container();
    c.cdi_devices = vec![
        v1::CdiDevice {
            name: "nvidia.com/gpu=0".into(),
        },
        v1::CdiDevice {
            name: "vendor.example/dev=null".into(),
        },
        v1::CdiDevice {
            name: "nvidia.com/gpu=0".into(),
        },
    ];
    c.annotations.insert(
        "cdi.k8s.io/b".into(),
        "nvidia.com/gpu=1,nvidia.com/gpu=0".into(),
    );
    c.annotations
        .insert("cdi.k8s.io/a".into(), "vendor.example/dev=zero".into());
    c.annotations
        .insert("example.com/other".into(), "not=a/device".into());
    let got = container_config(&c, &kubelet_pod()).unwrap().cdi_devices;
    let got: Vec<(&str, &str)> = got
        .iter()
        .map(|d| (d.name.as_str(), d.field.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("nvidia.com/gpu=0", "config.cdi_devices[0].name"),
            ("vendor.example/dev=null", "config.cdi_devices[1].name"),
            (
                "vendor.example/dev=zero",
                "config.annotations[\"cdi.k8s.io/a\"]"
            ),
            ("nvidia.com/gpu=1", "config.annotations[\"cdi.k8s.io/b\"]"),
        ]
    );
}

#[test]
fn container_unsupported_and_unknown_fields_are_named() {
    let pod = kubelet_pod();
    let err = |f: &dyn Fn(&mut v1::ContainerConfig)| {
        let mut c = kubelet_container();
        f(&mut c);
        container_config(&c, &pod).unwrap_err()
    };
    fn sc(c: &mut v1::ContainerConfig) -> &mut v1::LinuxContainerSecurityContext {
        c.linux.as_mut().unwrap().security_context.as_mut().unwrap()
    }
    assert_eq!(
        err(&|c| c.mounts[1].propagation = 3),
        ConvertError::UnknownEnum {
            field: "config.mounts[1].propagation".into(),
            value: 3
        }
    );
    assert_eq!(
        err(&|c| c.mounts[0].image = Some(v1::ImageSpec::default())),
        ConvertError::Missing {
            field: "config.mounts[0].image.image".into()
        }
    );
    assert_eq!(
        err(&|c| {
            sc(c)
                .capabilities
                .as_mut()
                .unwrap()
                .add_ambient_capabilities = vec!["NET_RAW".into()];
        }),
        unsupported("config.linux.security_context.capabilities.add_ambient_capabilities")
    );
    assert_eq!(
        err(&|c| {
            sc(c).namespace_options.as_mut().unwrap().ipc = -1;
        }),
        ConvertError::UnknownEnum {
            field: "config.linux.security_context.namespace_options.ipc".into(),
            value: -1
        }
    );
}

#[test]
fn image_volumes_name_their_image_and_are_readonly() {
    let pod = kubelet_pod();
    let mut c = kubelet_container();
    c.mounts[0].host_path.clear();
    c.mounts[0].readonly = true;
    c.mounts[0].image = Some(v1::ImageSpec {
        image: "busybox:1".into(),
        ..Default::default()
    });
    let ok = container_config(&c, &pod).unwrap();
    assert_eq!(
        ok.mounts[0].image,
        Some(crate::spec::ImageVolume {
            image: "busybox:1".into(),
            sub_path: String::new(),
        })
    );
    assert!(ok.mounts[0].readonly, "image volumes are always read-only");
    assert_eq!(ok.mounts[0].host_path, std::path::PathBuf::new());
}

#[test]
fn recursive_read_only_mounts_must_be_readonly_and_private() {
    let pod = kubelet_pod();
    let with = |readonly: bool, propagation: v1::MountPropagation| {
        let mut c = kubelet_container();
        c.mounts[0].recursive_read_only = true;
        c.mounts[0].readonly = readonly;
        c.mounts[0].propagation = propagation as i32;
        container_config(&c, &pod)
    };
    let ok = with(true, v1::MountPropagation::PropagationPrivate).unwrap();
    assert!(ok.mounts[0].recursive_read_only && ok.mounts[0].readonly);
    let invalid = |reason: &'static str| ConvertError::Invalid {
        field: "config.mounts[0].recursive_read_only".into(),
        value: "true".into(),
        reason,
    };
    assert_eq!(
        with(false, v1::MountPropagation::PropagationPrivate).unwrap_err(),
        invalid("a recursive read-only mount must also be readonly")
    );
    for p in [
        v1::MountPropagation::PropagationHostToContainer,
        v1::MountPropagation::PropagationBidirectional,
    ] {
        assert_eq!(
            with(true, p).unwrap_err(),
            invalid("a recursive read-only mount must have PROPAGATION_PRIVATE")
        );
    }
}

#[test]
fn container_resources_refuse_negatives_naming_the_field() {
    let err = resources(
        &v1::LinuxContainerResources {
            cpu_shares: -2,
            ..Default::default()
        },
        "linux",
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid linux.cpu_shares \"-2\": must not be negative"
    );
    let r = resources(
        &v1::LinuxContainerResources {
            oom_score_adj: -1000,
            ..Default::default()
        },
        "linux",
    )
    .unwrap();
    assert_eq!(r.oom_score_adj, -1000);
    assert_eq!(
        resources(&v1::LinuxContainerResources::default(), "linux").unwrap(),
        Resources::default()
    );
    // Through the container config, the field has its full CRI path.
    let mut c = kubelet_container();
    resources_mut(&mut c).oom_score_adj = 1001;
    assert!(matches!(
        container_config(&c, &kubelet_pod()).unwrap_err(),
        ConvertError::Invalid { field, .. } if field == "config.linux.resources.oom_score_adj"
    ));
}

#[test]
fn mount_propagation_modes() {
    for (cri, domain) in [
        (
            v1::MountPropagation::PropagationPrivate,
            MountPropagation::Private,
        ),
        (
            v1::MountPropagation::PropagationHostToContainer,
            MountPropagation::HostToContainer,
        ),
        (
            v1::MountPropagation::PropagationBidirectional,
            MountPropagation::Bidirectional,
        ),
    ] {
        let m = v1::Mount {
            container_path: "/data".into(),
            host_path: "/mnt/data".into(),
            propagation: cri as i32,
            selinux_relabel: true,
            ..Default::default()
        };
        let r = mount_request(&m, "config.mounts[0]").unwrap();
        assert_eq!(r.propagation, domain);
        assert!(r.selinux_relabel);
        assert_eq!(propagation_to_cri(domain), cri);
    }
}

#[test]
#[allow(deprecated)]
fn container_seccomp_and_apparmor_precedence() {
    use v1::security_profile::ProfileType;
    let with = |seccomp: Option<v1::SecurityProfile>,
                seccomp_path: &str,
                apparmor: Option<v1::SecurityProfile>,
                apparmor_name: &str| {
        let mut c = kubelet_container();
        let sc = c.linux.as_mut().unwrap().security_context.as_mut().unwrap();
        sc.seccomp = seccomp;
        sc.seccomp_profile_path = seccomp_path.into();
        sc.apparmor = apparmor;
        sc.apparmor_profile = apparmor_name.into();
        container_config(&c, &kubelet_pod()).map(|c| (c.security.seccomp, c.security.apparmor))
    };
    // Typed fields win over the strings.
    assert_eq!(
        with(
            profile(ProfileType::RuntimeDefault, ""),
            "unconfined",
            profile(ProfileType::Localhost, "k8s-nginx"),
            "unconfined"
        ),
        Ok((
            SeccompProfile::RuntimeDefault,
            Some(AppArmorProfile::Localhost("k8s-nginx".into()))
        ))
    );
    assert_eq!(
        with(
            profile(ProfileType::Unconfined, ""),
            "localhost//p.json",
            profile(ProfileType::Unconfined, ""),
            "runtime/default"
        ),
        Ok((
            SeccompProfile::Unconfined,
            Some(AppArmorProfile::Unconfined)
        ))
    );
    // Strings when the typed fields are unset.
    assert_eq!(
        with(None, "docker/default", None, "runtime/default"),
        Ok((
            SeccompProfile::RuntimeDefault,
            Some(AppArmorProfile::RuntimeDefault)
        ))
    );
    assert_eq!(
        with(None, "unconfined", None, "unconfined"),
        Ok((
            SeccompProfile::Unconfined,
            Some(AppArmorProfile::Unconfined)
        ))
    );
    assert_eq!(
        with(
            None,
            "localhost//opt/seccomp/audit.json",
            None,
            "localhost/k8s-nginx"
        ),
        Ok((
            SeccompProfile::Localhost("/opt/seccomp/audit.json".into()),
            Some(AppArmorProfile::Localhost("k8s-nginx".into()))
        ))
    );
    // Nothing asked for: seccomp unconfined, AppArmor left to the spec's default.
    assert_eq!(
        with(None, "", None, ""),
        Ok((SeccompProfile::Unconfined, None))
    );
    // A localhost/ prefix in the typed ref is trimmed, as containerd does.
    assert_eq!(
        with(
            profile(ProfileType::Localhost, "localhost//opt/p.json"),
            "",
            None,
            ""
        )
        .map(|p| p.0),
        Ok(SeccompProfile::Localhost("/opt/p.json".into()))
    );
}

#[test]
#[allow(deprecated)]
fn security_profile_errors_name_the_field() {
    use v1::security_profile::ProfileType;
    let err = |f: &dyn Fn(&mut v1::LinuxContainerSecurityContext)| {
        let mut sc = v1::LinuxContainerSecurityContext::default();
        f(&mut sc);
        container_security(&sc, "config.linux.security_context")
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        err(&|sc| sc.seccomp = profile(ProfileType::Localhost, "")),
        "config.linux.security_context.seccomp.localhost_ref is required"
    );
    assert_eq!(
        err(&|sc| sc.seccomp = profile(ProfileType::Localhost, "relative.json")),
        "invalid config.linux.security_context.seccomp.localhost_ref \"relative.json\": \
         a localhost seccomp profile must be an absolute path"
    );
    assert_eq!(
        err(&|sc| sc.apparmor = profile(ProfileType::Localhost, "")),
        "config.linux.security_context.apparmor.localhost_ref is required"
    );
    assert_eq!(
        err(&|sc| sc.apparmor = Some(v1::SecurityProfile {
            profile_type: 3,
            localhost_ref: String::new()
        })),
        "config.linux.security_context.apparmor.profile_type has unknown value 3"
    );
    assert!(err(&|sc| sc.seccomp_profile_path = "bogus".into())
        .starts_with("invalid config.linux.security_context.seccomp_profile_path \"bogus\""));
    assert!(err(&|sc| sc.apparmor_profile = "localhost/".into())
        .starts_with("invalid config.linux.security_context.apparmor_profile"));
}

#[test]
fn container_log_path_needs_both_parts() {
    let pod = kubelet_pod();
    let c = kubelet_container();
    assert_eq!(
        container_log_path(&c, &pod).unwrap(),
        "/var/log/pods/default_nginx-7c5ddbdf54-x2x4q_0a1f63d6/nginx/2.log"
    );
    let mut no_dir = kubelet_pod();
    no_dir.log_directory.clear();
    assert_eq!(container_log_path(&c, &no_dir).unwrap(), "");
    let mut no_path = kubelet_container();
    no_path.log_path.clear();
    assert_eq!(container_log_path(&no_path, &pod).unwrap(), "");
}

#[test]
fn container_log_path_stays_in_the_log_directory() {
    let pod = kubelet_pod();
    let field_of = |log_path: &str, log_dir: &str| {
        let mut c = kubelet_container();
        c.log_path = log_path.into();
        let mut p = pod.clone();
        p.log_directory = log_dir.into();
        match container_metadata("c1", "abc", &c, &p).unwrap_err() {
            ConvertError::Invalid { field, .. } => field,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(
        field_of("../../etc/cron.d/x", "/var/log/pods/p"),
        "config.log_path"
    );
    assert_eq!(
        field_of("/etc/passwd", "/var/log/pods/p"),
        "config.log_path"
    );
    assert_eq!(field_of("a/../../x", "/var/log/pods/p"), "config.log_path");
    assert_eq!(
        field_of("0.log", "relative/dir"),
        "sandbox_config.log_directory"
    );
    assert_eq!(
        field_of("0.log", "/var/log/../../etc"),
        "sandbox_config.log_directory"
    );
}

#[test]
fn container_metadata_from_request() {
    let m = container_metadata("c1", "abc", &kubelet_container(), &kubelet_pod()).unwrap();
    assert_eq!((m.id.as_str(), m.sandbox_id.as_str()), ("c1", "abc"));
    assert_eq!(
        m.pod,
        PodRef {
            name: "nginx-7c5ddbdf54-x2x4q".into(),
            namespace: "default".into(),
            uid: "0a1f63d6-8d2b-4e4e-9f5e-1d2b3c4d5e6f".into(),
        }
    );
    assert_eq!((m.name.as_str(), m.attempt), ("nginx", 2));
    assert_eq!(m.image.requested, "docker.io/library/nginx:1.27");
    assert_eq!(m.labels["io.kubernetes.container.name"], "nginx");
    assert_eq!(
        m.log_path,
        "/var/log/pods/default_nginx-7c5ddbdf54-x2x4q_0a1f63d6/nginx/2.log"
    );
    assert_eq!(m.mounts.len(), 2);
    assert_eq!(m.mounts[1].propagation, MountPropagation::HostToContainer);
    assert!(m.stdin && m.stdin_once && !m.tty);

    let mut pod = kubelet_pod();
    pod.metadata.as_mut().unwrap().uid.clear();
    assert_eq!(
        container_metadata("c1", "abc", &kubelet_container(), &pod)
            .unwrap_err()
            .to_string(),
        "sandbox_config.metadata.uid is required"
    );
}

#[test]
fn a_configured_stop_signal_is_kept_by_name() {
    let pod = kubelet_pod();
    let stop_signal = |value: i32| {
        let mut c = kubelet_container();
        c.stop_signal = value;
        // The spec inputs take it too (remora refused it before).
        container_config(&c, &pod)?;
        container_metadata("c1", "abc", &c, &pod).map(|m| m.stop_signal)
    };
    assert_eq!(
        stop_signal(v1::Signal::Sigquit as i32),
        Ok("SIGQUIT".into())
    );
    assert_eq!(
        stop_signal(v1::Signal::Sigrtminplus3 as i32),
        Ok("SIGRTMIN+3".into())
    );
    assert_eq!(
        stop_signal(v1::Signal::Sigrtmaxminus1 as i32),
        Ok("SIGRTMAX-1".into())
    );
    assert_eq!(stop_signal(v1::Signal::Sigiot as i32), Ok("SIGIOT".into()));
    // None configured: CreateContainer fills the image's, else SIGTERM.
    assert_eq!(
        stop_signal(v1::Signal::RuntimeDefault as i32),
        Ok(String::new())
    );
    assert_eq!(
        stop_signal(66),
        Err(ConvertError::UnknownEnum {
            field: "config.stop_signal".into(),
            value: 66
        })
    );
    assert_eq!(
        stop_signal(-3).unwrap_err().to_string(),
        "config.stop_signal has unknown value -3"
    );
}

#[test]
fn env_values_pass_through_byte_for_byte_when_utf8() {
    let pod = kubelet_pod();
    let mut c = kubelet_container();
    // Bytes on the wire since cri-api v0.34.10: any UTF-8, '=' and multi-byte included.
    c.envs = vec![v1::KeyValue {
        key: "GREETING".into(),
        value: "grüße=☃ \t".as_bytes().to_vec(),
    }];
    let got = container_config(&c, &pod).unwrap();
    assert_eq!(got.envs, vec![("GREETING".into(), "grüße=☃ \t".into())]);
}

#[test]
fn a_non_utf8_env_value_is_refused_naming_its_key() {
    let pod = kubelet_pod();
    let mut c = kubelet_container();
    // A secret's raw bytes: 0xff never occurs in UTF-8, 0xc3 starts a sequence left unfinished.
    c.envs.push(v1::KeyValue {
        key: "TOKEN".into(),
        value: vec![b'a', 0xff, 0xc3],
    });
    let err = container_config(&c, &pod).unwrap_err();
    assert_eq!(
        err,
        ConvertError::EnvNotUtf8 {
            field: "config.envs[2].value".into(),
            key: "TOKEN".into(),
        }
    );
    let text = err.to_string();
    assert!(
        text.contains("\"TOKEN\"") && text.contains("config.envs[2].value"),
        "{text}"
    );
    // The message names the key, never the (possibly secret) value, not even mangled.
    assert!(!text.contains('\u{fffd}'), "{text}");
    // The request itself decodes: such a value is valid protobuf since `value` is bytes (with
    // k8s-cri's `string` it failed to decode, and the whole CreateContainer with it).
    let wire = prost::Message::encode_to_vec(&c);
    let decoded: v1::ContainerConfig = prost::Message::decode(wire.as_slice()).unwrap();
    assert_eq!(decoded.envs[2].value, vec![b'a', 0xff, 0xc3]);
}

fn id(container_id: u32, host_id: u32, length: u32) -> v1::IdMapping {
    v1::IdMapping {
        container_id,
        host_id,
        length,
    }
}

/// An image volume as kubelet sends it: no host path, readonly, maybe a sub path.
fn image_volume(sub_path: &str) -> v1::Mount {
    v1::Mount {
        container_path: "/models".into(),
        readonly: true,
        image: Some(v1::ImageSpec {
            image: "sha256:5ef79149e0ec".into(),
            user_specified_image: "registry.local/models:1".into(),
            ..Default::default()
        }),
        image_sub_path: sub_path.into(),
        ..Default::default()
    }
}

#[test]
fn mount_maps_and_options_are_passed_to_the_bind() {
    let mut c = kubelet_container();
    // What kubelet sends for a `hostUsers: false` pod: the pod's maps on every mount.
    for m in &mut c.mounts {
        m.uid_mappings = vec![id(0, 1_000_000, 65536)];
        m.gid_mappings = vec![id(0, 2_000_000, 65536)];
    }
    c.mounts[0].mount_options = vec!["noexec".into(), "nosuid".into(), "nodev".into()];
    // A repeat is kept once.
    c.mounts[1].mount_options = vec!["nodev".into(), "nodev".into()];
    // Several ranges, in any order, as long as none overlaps another.
    c.mounts[1].uid_mappings = vec![id(10, 1_000_010, 5), id(0, 1_000_000, 10)];
    let got = container_config(&c, &kubelet_pod()).unwrap().mounts;
    let map = |container_id, host_id, length| crate::spec::IdMapping {
        container_id,
        host_id,
        length,
    };
    assert_eq!(got[0].uid_mappings, [map(0, 1_000_000, 65536)]);
    assert_eq!(got[0].gid_mappings, [map(0, 2_000_000, 65536)]);
    assert_eq!(
        got[0].options,
        [BindOption::NoExec, BindOption::NoSuid, BindOption::NoDev]
    );
    assert_eq!(
        got[1].uid_mappings,
        [map(10, 1_000_010, 5), map(0, 1_000_000, 10)]
    );
    assert_eq!(got[1].options, [BindOption::NoDev]);
    // The largest map the kernel takes, and ranges reaching exactly 2^32 - 1.
    let mut c = kubelet_container();
    c.mounts[0].uid_mappings = (0..340)
        .map(|i| id(i * 10, 1_000_000 + i * 10, 10))
        .collect();
    c.mounts[0].gid_mappings = vec![id(u32::MAX - 9, u32::MAX - 9, 10)];
    let got = container_config(&c, &kubelet_pod()).unwrap().mounts;
    assert_eq!(got[0].uid_mappings.len(), 340);
}

#[test]
fn bad_mount_maps_and_options_are_refused_naming_the_field() {
    let pod = kubelet_pod();
    let err = |f: &dyn Fn(&mut v1::Mount)| {
        let mut c = kubelet_container();
        c.mounts[1].uid_mappings = vec![id(0, 1_000_000, 65536)];
        c.mounts[1].gid_mappings = vec![id(0, 1_000_000, 65536)];
        f(&mut c.mounts[1]);
        // CreateContainer converts the metadata as well: it refuses the same way.
        let meta = container_metadata("c1", "p1", &c, &pod).unwrap_err();
        let e = container_config(&c, &pod).unwrap_err();
        assert_eq!(meta, e);
        match e {
            ConvertError::Invalid { field, value, .. } => (field, value),
            other => panic!("{other:?}"),
        }
    };
    let s = |field: &str, value: &str| (field.to_string(), value.to_string());
    assert_eq!(
        err(&|m| m.gid_mappings.clear()),
        s("config.mounts[1].gid_mappings", "0 mapping(s)")
    );
    assert_eq!(
        err(&|m| m.uid_mappings.clear()),
        s("config.mounts[1].uid_mappings", "0 mapping(s)")
    );
    assert_eq!(
        err(&|m| m.uid_mappings = (0..341).map(|i| id(i, 1_000_000 + i, 1)).collect()),
        s("config.mounts[1].uid_mappings", "341 mapping(s)")
    );
    assert_eq!(
        err(&|m| m.gid_mappings[0].length = 0),
        s("config.mounts[1].gid_mappings[0].length", "0")
    );
    assert_eq!(
        err(&|m| m.uid_mappings = vec![id(u32::MAX - 8, 0, 10)]),
        s(
            "config.mounts[1].uid_mappings[0].container_id",
            &(u32::MAX - 8).to_string()
        )
    );
    assert_eq!(
        err(&|m| m.gid_mappings = vec![id(0, u32::MAX, 2)]),
        s(
            "config.mounts[1].gid_mappings[0].host_id",
            &u32::MAX.to_string()
        )
    );
    assert_eq!(
        err(&|m| m.uid_mappings = vec![id(0, 1_000_000, 10), id(9, 2_000_000, 10)]),
        s("config.mounts[1].uid_mappings[1].container_id", "9")
    );
    assert_eq!(
        err(&|m| m.gid_mappings = vec![id(0, 1_000_000, 10), id(100, 999_991, 10)]),
        s("config.mounts[1].gid_mappings[1].host_id", "999991")
    );
    // An image volume with maps in a container without a user namespace: its view can be
    // idmapped only with the pod's maps, and there are none.
    let mut c = kubelet_container();
    c.mounts[0].image = Some(v1::ImageSpec {
        image: "busybox".into(),
        ..Default::default()
    });
    c.mounts[0].host_path.clear();
    assert!(container_config(&c, &pod).is_ok());
    c.mounts[0].uid_mappings = vec![id(0, 1_000_000, 65536)];
    c.mounts[0].gid_mappings = vec![id(0, 1_000_000, 65536)];
    let e = container_config(&c, &pod).unwrap_err();
    assert!(
        matches!(&e, ConvertError::Invalid { field, value, reason }
            if field == "config.mounts[0].uid_mappings" && value == "0:1000000:65536"
                && reason.contains("no user namespace")),
        "{e:?}"
    );
    // Only the options the CRI lists, spelled as it spells them.
    for bad in [
        "ro",
        "exec",
        "suid",
        "NOEXEC",
        "noexec,nodev",
        "",
        "bind",
        "rshared",
    ] {
        assert_eq!(
            err(&|m| m.mount_options = vec!["nosuid".into(), bad.into()]),
            s("config.mounts[1].mount_options[1]", bad),
            "{bad:?}"
        );
    }
}

#[test]
fn an_image_volume_keeps_its_image_and_sub_path() {
    let r = mount_request(&image_volume("weights/../v1"), "config.mounts[0]").unwrap();
    assert_eq!(
        r.image,
        Some(crate::spec::ImageVolume {
            image: "sha256:5ef79149e0ec".into(),
            sub_path: "weights/../v1".into(),
        })
    );
    assert!(r.readonly);
    let mut c = kubelet_container();
    c.mounts.push(image_volume("etc"));
    let m = container_metadata("c1", "abc", &c, &kubelet_pod()).unwrap();
    assert_eq!(
        (
            m.mounts[2].image.as_str(),
            m.mounts[2].image_sub_path.as_str()
        ),
        ("sha256:5ef79149e0ec", "etc")
    );
    assert_eq!(m.mounts[0].image_sub_path, "");
}

/// The image volume rules (api.proto `Mount.image`, `image_sub_path`), each refusal naming
/// its field: read-only only (containerd refuses `readonly: false` too), no host path, a sub
/// path relative, without NUL, bounded, and only on an image volume.
#[test]
fn image_volume_rules_are_invalid_argument_naming_the_field() {
    let pod = kubelet_pod();
    let err = |m: v1::Mount| {
        let mut c = kubelet_container();
        c.mounts.push(m);
        match container_config(&c, &pod).unwrap_err() {
            ConvertError::Invalid { field, reason, .. } => (field, reason),
            other => panic!("{other:?}"),
        }
    };
    let writable = v1::Mount {
        readonly: false,
        ..image_volume("")
    };
    assert_eq!(
        err(writable),
        (
            "config.mounts[2].readonly".to_string(),
            "an image volume is read-only: readonly must be true"
        )
    );
    let with_host_path = v1::Mount {
        host_path: "/srv".into(),
        ..image_volume("")
    };
    assert_eq!(err(with_host_path).0, "config.mounts[2].host_path");
    let long = "a/".repeat(2049);
    for (sub_path, reason) in [
        ("/etc", "must be relative to the image's root"),
        ("etc\0x", "contains a NUL byte"),
        (long.as_str(), "is longer than 4096 bytes"),
    ] {
        assert_eq!(
            err(image_volume(sub_path)),
            ("config.mounts[2].image_sub_path".to_string(), reason),
            "{sub_path:?}"
        );
    }
    let host_with_sub_path = v1::Mount {
        image_sub_path: "etc".into(),
        ..kubelet_container().mounts[0].clone()
    };
    assert_eq!(
        err(host_with_sub_path),
        (
            "config.mounts[2].image_sub_path".to_string(),
            "only an image volume (image set) has a sub path"
        )
    );
}

/// The container's (the pod's) user namespace, as kubelet sends a `hostUsers: false` pod's.
fn with_userns(c: &mut v1::ContainerConfig, host_id: u32) {
    c.linux
        .get_or_insert_with(Default::default)
        .security_context
        .get_or_insert_with(Default::default)
        .namespace_options
        .get_or_insert_with(Default::default)
        .userns_options = Some(v1::UserNamespace {
        mode: v1::NamespaceMode::Pod as i32,
        uids: vec![id(0, host_id, 65536)],
        gids: vec![id(0, host_id, 65536)],
    });
}

#[test]
fn an_image_volume_takes_its_pods_maps_and_no_others() {
    let pod = kubelet_pod();
    let with_maps = |uids: Vec<v1::IdMapping>, gids: Vec<v1::IdMapping>| {
        let mut c = kubelet_container();
        with_userns(&mut c, 1_000_000);
        c.mounts = vec![v1::Mount {
            uid_mappings: uids,
            gid_mappings: gids,
            ..image_volume("data")
        }];
        container_config(&c, &pod)
    };
    // The pod's maps: kept on the request (CreateContainer idmaps the view with them).
    let pods = vec![id(0, 1_000_000, 65536)];
    let got = with_maps(pods.clone(), pods.clone()).unwrap().mounts;
    assert_eq!(got[0].uid_mappings.len(), 1);
    assert!(got[0].image.is_some());
    // Any other map is refused naming the field: another host range, a range not from ID 0,
    // a shorter one, a second range.
    for (uids, gids, field, value) in [
        (
            vec![id(0, 2_000_000, 65536)],
            pods.clone(),
            "uid_mappings",
            "0:2000000:65536",
        ),
        (
            pods.clone(),
            vec![id(1, 1_000_001, 65535)],
            "gid_mappings",
            "1:1000001:65535",
        ),
        (
            vec![id(0, 1_000_000, 1000)],
            pods.clone(),
            "uid_mappings",
            "0:1000000:1000",
        ),
        (
            pods.clone(),
            vec![id(0, 1_000_000, 65536), id(65536, 3_000_000, 1)],
            "gid_mappings",
            "0:1000000:65536,65536:3000000:1",
        ),
    ] {
        let e = with_maps(uids, gids).unwrap_err();
        assert!(
            matches!(&e, ConvertError::Invalid { field: f, value: v, reason }
                if *f == format!("config.mounts[0].{field}") && v == value
                    && reason.contains("pod's user namespace maps")),
            "{e:?}"
        );
    }
    // No maps on an image volume of a user-namespaced pod: a plain view, as containerd.
    let got = with_maps(vec![], vec![]).unwrap().mounts;
    assert!(got[0].uid_mappings.is_empty());
}
