//! End-to-end tests of [`container_spec`] and [`sandbox_spec`].

use std::io;
use std::path::Path;

use oci_spec::runtime::{Capability, LinuxDeviceType, LinuxNamespaceType, Mount};

use super::*;

const PASSWD: &str = "root:x:0:0::/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n";
const GROUP: &str = "root:x:0:\napp:x:1000:\nvideo:x:44:app\n";

fn rootfs() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("etc")).unwrap();
    std::fs::write(dir.path().join("etc/passwd"), PASSWD).unwrap();
    std::fs::write(dir.path().join("etc/group"), GROUP).unwrap();
    dir
}

fn no_devices(path: &Path) -> io::Result<HostDevice> {
    if path == Path::new("/dev/fuse") {
        Ok(HostDevice {
            kind: DeviceKind::Char,
            major: 10,
            minor: 229,
            file_mode: 0o666,
            uid: 0,
            gid: 0,
        })
    } else {
        Err(io::Error::from(io::ErrorKind::NotFound))
    }
}

fn image() -> ImageConfig {
    ImageConfig {
        user: "app".into(),
        env: vec!["PATH=/usr/bin:/bin".into(), "LANG=C".into()],
        entrypoint: vec!["/entry".into()],
        cmd: vec!["serve".into()],
        working_dir: "/srv".into(),
        stop_signal: "SIGQUIT".into(),
    }
}

pub(super) fn config() -> ContainerConfig {
    ContainerConfig {
        name: "web".into(),
        image_name: "registry.example/web:1".into(),
        envs: vec![("LANG".into(), "C.UTF-8".into())],
        mounts: vec![MountRequest {
            container_path: "/data".into(),
            host_path: "/var/lib/data".into(),
            readonly: true,
            ..MountRequest::default()
        }],
        annotations: [("user.note".to_owned(), "x".to_owned())].into(),
        resources: Some(Resources {
            cpu_shares: 256,
            memory_limit_in_bytes: 128 << 20,
            oom_score_adj: -999,
            ..Resources::default()
        }),
        ..ContainerConfig::default()
    }
}

pub(super) fn sandbox() -> SandboxInfo {
    SandboxInfo {
        id: "sb1".into(),
        pid: 4321,
        netns_path: Some("/run/remora/netns/sb1".into()),
        pinned: false,
        config: SandboxConfig {
            name: "pod".into(),
            namespace: "default".into(),
            uid: "uid-1".into(),
            hostname: "pod-host".into(),
            log_directory: "/var/log/pods/x".into(),
            cgroup_parent: "/kubepods/burstable/pod1".into(),
            sysctls: [("net.core.somaxconn".to_owned(), "1024".to_owned())].into(),
            ..SandboxConfig::default()
        },
        files: SandboxFiles {
            hosts: Some("/run/remora/sb1/hosts".into()),
            resolv_conf: Some("/run/remora/sb1/resolv.conf".into()),
            hostname: Some("/run/remora/sb1/hostname".into()),
            shm: Some("/run/remora/sb1/shm".into()),
        },
    }
}

pub(super) fn host() -> HostFacts {
    HostFacts {
        min_oom_score_adj: -500,
        swap_accounting: true,
        node_hostname: "node-1".into(),
        ..HostFacts::default()
    }
}

pub(super) fn build(
    cfg: &ContainerConfig,
    sb: &SandboxInfo,
    h: &HostFacts,
) -> Result<ContainerSpec, SpecError> {
    let root = rootfs();
    let img = image();
    container_spec(&ContainerInputs {
        id: "c1",
        config: cfg,
        image: &img,
        sandbox: sb,
        rootfs: RootFs::Dir(root.path()),
        target_pid: None,
        host: h,
        device_lookup: &no_devices,
        pass_through: &crate::spec::PassThrough::default(),
    })
}

fn mount<'a>(spec: &'a Spec, dest: &str) -> Option<&'a Mount> {
    spec.mounts()
        .as_ref()?
        .iter()
        .find(|m| m.destination() == Path::new(dest))
}

fn ns_path(spec: &Spec, t: LinuxNamespaceType) -> Option<Option<String>> {
    let linux = spec.linux().as_ref()?;
    linux
        .namespaces()
        .as_ref()?
        .iter()
        .find(|n| n.typ() == t)
        .map(|n| n.path().as_ref().map(|p| p.display().to_string()))
}

#[test]
fn container_spec_puts_everything_together() {
    let out = build(&config(), &sandbox(), &host()).unwrap();
    let spec = &out.spec;
    let process = spec.process().as_ref().unwrap();
    assert_eq!(process.args().as_ref().unwrap(), &["/entry", "serve"]);
    let env = process.env().as_ref().unwrap();
    assert_eq!(
        env,
        &["PATH=/usr/bin:/bin", "HOSTNAME=pod-host", "LANG=C.UTF-8"]
    );
    assert_eq!(process.cwd(), Path::new("/srv"));
    assert_eq!((process.user().uid(), process.user().gid()), (1000, 1000));
    assert_eq!(
        process.user().additional_gids().as_ref().unwrap(),
        &[44, 1000]
    );
    assert_eq!(
        process.oom_score_adj(),
        Some(-500),
        "clamped to remora's own"
    );
    assert_eq!(process.terminal(), Some(false));
    assert!(process.no_new_privileges().is_none());
    assert!(
        process.rlimits().is_none(),
        "inherit the shim's, as containerd"
    );
    let caps = process
        .capabilities()
        .as_ref()
        .unwrap()
        .bounding()
        .as_ref()
        .unwrap();
    assert!(caps.contains(&Capability::NetBindService) && !caps.contains(&Capability::SysAdmin));

    let root = spec.root().as_ref().unwrap();
    assert_eq!(
        (root.path().as_path(), root.readonly()),
        (Path::new("rootfs"), Some(false))
    );
    assert!(spec.hostname().is_none());

    let data = mount(spec, "/data").unwrap();
    assert_eq!(
        data.options().as_ref().unwrap(),
        &["rbind", "rprivate", "ro"]
    );
    assert!(mount(spec, "/etc/resolv.conf").is_some());
    assert_eq!(
        out.host_dirs_to_create,
        vec![PathBuf::from("/var/lib/data")]
    );

    let linux = spec.linux().as_ref().unwrap();
    assert_eq!(
        linux.cgroups_path().as_deref(),
        Some(Path::new("/kubepods/burstable/pod1/c1"))
    );
    assert_eq!(
        linux.sysctl().as_ref().unwrap()["net.core.somaxconn"],
        "1024"
    );
    assert!(linux.seccomp().is_none(), "unconfined unless asked");
    assert_eq!(
        linux.masked_paths().as_ref().unwrap().len(),
        security::DEFAULT_MASKED_PATHS.len()
    );
    let res = linux.resources().as_ref().unwrap();
    assert_eq!(res.cpu().as_ref().unwrap().shares(), Some(256));
    assert_eq!(res.memory().as_ref().unwrap().limit(), Some(128 << 20));
    assert!(
        !res.devices().as_ref().unwrap()[0].allow(),
        "deny all first"
    );
    assert_eq!(
        ns_path(spec, LinuxNamespaceType::Network),
        Some(Some("/run/remora/netns/sb1".into()))
    );
    assert_eq!(
        ns_path(spec, LinuxNamespaceType::Pid),
        Some(Some("/proc/4321/ns/pid".into()))
    );
    assert_eq!(ns_path(spec, LinuxNamespaceType::Mount), Some(None));

    let ann = spec.annotations().as_ref().unwrap();
    assert_eq!(ann[annotations::CONTAINER_TYPE], "container");
    assert_eq!(ann[annotations::SANDBOX_ID], "sb1");
    assert_eq!(ann[annotations::CONTAINER_NAME], "web");
    assert_eq!(ann[annotations::IMAGE_NAME], "registry.example/web:1");
    assert_eq!(ann[annotations::SANDBOX_NAMESPACE], "default");
    // No pass-through configured: the pod author's annotation stays out of the spec.
    assert!(!ann.contains_key("user.note"), "{ann:?}");

    // What runc will read.
    let json = serde_json::to_value(spec).unwrap();
    assert_eq!(json["ociVersion"], oci_spec::runtime::VERSION);
    assert_eq!(json["root"]["path"], "rootfs");
}

#[test]
fn only_the_handlers_pass_through_annotations_reach_the_spec() {
    let mut cfg = config();
    cfg.annotations
        .insert("org.systemd.property.CPUQuota".into(), "1%".into());
    cfg.annotations.insert("run.oci.foo".into(), "1".into());
    cfg.annotations
        .insert("io.kubernetes.cri.extra".into(), "forged".into());
    let mut sb = sandbox();
    sb.config
        .annotations
        .insert("example.com/pod-note".into(), "p".into());
    sb.config
        .annotations
        .insert("org.systemd.property.TasksMax".into(), "1".into());
    let pass = PassThrough {
        pod: vec!["example.com/*".into()],
        container: vec!["run.oci.*".into(), "user.note".into()],
    };
    let root = rootfs();
    let out = container_spec(&ContainerInputs {
        id: "c1",
        config: &cfg,
        image: &image(),
        sandbox: &sb,
        rootfs: RootFs::Dir(root.path()),
        target_pid: None,
        host: &host(),
        device_lookup: &no_devices,
        pass_through: &pass,
    })
    .unwrap();
    let ann = out.spec.annotations().as_ref().unwrap();
    let mut keys: Vec<&str> = ann
        .keys()
        .map(String::as_str)
        .filter(|k| !k.starts_with("io.kubernetes.cri."))
        .collect();
    keys.sort();
    assert_eq!(keys, ["example.com/pod-note", "run.oci.foo", "user.note"]);
    assert!(!ann.contains_key("io.kubernetes.cri.extra"), "{ann:?}");

    let files = sb.files.clone();
    let spec = sandbox_spec(&SandboxInputs {
        id: "sb1",
        config: &sb.config,
        image: &pause_image(),
        image_name: "registry.k8s.io/pause:3.10",
        rootfs: None,
        netns_path: None,
        userns_path: None,
        files: &files,
        host: &host(),
        unprivileged_ports: false,
        unprivileged_icmp: false,
        pass_through: &pass,
    })
    .unwrap();
    let ann = spec.annotations().as_ref().unwrap();
    assert_eq!(ann["example.com/pod-note"], "p");
    assert!(
        !ann.contains_key("org.systemd.property.TasksMax"),
        "{ann:?}"
    );
}

#[test]
fn cri_annotations_cannot_impersonate() {
    let mut cfg = config();
    cfg.annotations
        .insert(annotations::SANDBOX_ID.into(), "other".into());
    let out = build(&cfg, &sandbox(), &host()).unwrap();
    assert_eq!(
        out.spec.annotations().as_ref().unwrap()[annotations::SANDBOX_ID],
        "sb1"
    );
}

#[test]
fn security_settings_reach_the_spec() {
    let mut cfg = config();
    cfg.tty = true;
    cfg.security.readonly_rootfs = true;
    cfg.security.no_new_privs = true;
    cfg.security.seccomp = SeccompProfile::RuntimeDefault;
    cfg.security.capabilities = Some(CapabilityChanges {
        add: vec!["SYS_ADMIN".into()],
        drop: vec![],
    });
    cfg.security.masked_paths = Some(vec!["/proc/only".into()]);
    let out = build(&cfg, &sandbox(), &host()).unwrap();
    let spec = &out.spec;
    let process = spec.process().as_ref().unwrap();
    assert_eq!(process.terminal(), Some(true));
    assert_eq!(process.no_new_privileges(), Some(true));
    assert_eq!(spec.root().as_ref().unwrap().readonly(), Some(true));
    assert!(mount(spec, "/etc/hosts")
        .unwrap()
        .options()
        .as_ref()
        .unwrap()
        .contains(&"ro".to_owned()));
    let linux = spec.linux().as_ref().unwrap();
    assert_eq!(linux.masked_paths().as_ref().unwrap(), &["/proc/only"]);
    // The default profile follows the final capability set.
    let seccomp = linux.seccomp().as_ref().unwrap();
    assert!(seccomp
        .syscalls()
        .as_ref()
        .unwrap()
        .iter()
        .any(|s| s.names().iter().any(|n| n == "mount")));
}

/// Empty lists (kubelet's for `procMount: Unmasked`) mask nothing; no list at all (a
/// container without a security context) keeps the defaults.
#[test]
fn empty_masked_and_readonly_paths_reach_the_spec_empty() {
    let mut cfg = config();
    cfg.security.masked_paths = Some(vec![]);
    cfg.security.readonly_paths = Some(vec![]);
    let spec = build(&cfg, &sandbox(), &host()).unwrap().spec;
    let linux = spec.linux().as_ref().unwrap();
    assert_eq!(linux.masked_paths().as_deref(), Some(&[][..]));
    assert_eq!(linux.readonly_paths().as_deref(), Some(&[][..]));
    let spec = build(&config(), &sandbox(), &host()).unwrap().spec;
    let linux = spec.linux().as_ref().unwrap();
    assert_eq!(
        linux.readonly_paths().as_ref().unwrap().len(),
        security::DEFAULT_READONLY_PATHS.len()
    );
}

#[test]
fn privileged_containers() {
    let mut cfg = config();
    cfg.security.privileged = true;
    cfg.security.seccomp = SeccompProfile::RuntimeDefault;
    let err = build(&cfg, &sandbox(), &host()).unwrap_err();
    assert!(matches!(err, SpecError::PrivilegedNotAllowed));

    let mut sb = sandbox();
    sb.config.security.privileged = true;
    let spec = build(&cfg, &sb, &host()).unwrap().spec;
    let linux = spec.linux().as_ref().unwrap();
    assert!(linux.seccomp().is_none());
    assert!(linux.masked_paths().as_ref().unwrap().is_empty());
    assert!(linux.readonly_paths().as_ref().unwrap().is_empty());
    let dev = &linux
        .resources()
        .as_ref()
        .unwrap()
        .devices()
        .as_ref()
        .unwrap()[0];
    assert!(dev.allow() && dev.typ() == Some(LinuxDeviceType::A));
    let caps = spec
        .process()
        .as_ref()
        .unwrap()
        .capabilities()
        .as_ref()
        .unwrap();
    assert_eq!(caps.bounding().as_ref().unwrap().len(), 41);
    assert!(mount(&spec, "/sys")
        .unwrap()
        .options()
        .as_ref()
        .unwrap()
        .contains(&"rw".to_owned()));
}

#[test]
fn host_network_and_ipc() {
    let mut cfg = config();
    cfg.security.namespaces = NamespaceOptions {
        network: NamespaceMode::Node,
        ipc: NamespaceMode::Node,
        user: None,
        pid: NamespaceMode::Pod,
    };
    let mut sb = sandbox();
    sb.config.hostname.clear();
    // A host-network pod has no net.* sysctls (sysctls_outside_the_pods_namespaces_are_refused).
    sb.config.sysctls.clear();
    let spec = build(&cfg, &sb, &host()).unwrap().spec;
    assert_eq!(ns_path(&spec, LinuxNamespaceType::Network), None);
    assert_eq!(ns_path(&spec, LinuxNamespaceType::Ipc), None);
    let env = spec.process().as_ref().unwrap().env().as_ref().unwrap();
    assert!(env.contains(&"HOSTNAME=node-1".to_owned()));
    assert_eq!(
        mount(&spec, "/dev/shm").unwrap().source().as_deref(),
        Some(Path::new("/dev/shm"))
    );
}

#[test]
fn devices_and_their_errors() {
    let mut cfg = config();
    cfg.devices = vec![DeviceRequest {
        container_path: "/dev/fuse".into(),
        host_path: "/dev/fuse".into(),
        permissions: "rwm".into(),
    }];
    let spec = build(&cfg, &sandbox(), &host()).unwrap().spec;
    let linux = spec.linux().as_ref().unwrap();
    assert_eq!(linux.devices().as_ref().unwrap()[0].major(), 10);
    let rules = linux
        .resources()
        .as_ref()
        .unwrap()
        .devices()
        .as_ref()
        .unwrap();
    assert_eq!(rules.len(), 2);
    assert!(rules[1].allow());

    cfg.devices[0].host_path = "/dev/missing".into();
    assert!(matches!(
        build(&cfg, &sandbox(), &host()),
        Err(SpecError::DeviceLookup { .. })
    ));
}

#[test]
fn container_errors_surface() {
    let mut cfg = config();
    cfg.security.apparmor = Some(AppArmorProfile::Localhost("strict".into()));
    assert!(matches!(
        build(&cfg, &sandbox(), &host()),
        Err(SpecError::AppArmorUnsupported { .. })
    ));

    let mut cfg = config();
    cfg.security.run_as_username = "ghost".into();
    assert!(matches!(
        build(&cfg, &sandbox(), &host()),
        Err(SpecError::UserNotFound { .. })
    ));

    let mut cfg = config();
    cfg.resources.as_mut().unwrap().cpu_quota = -2;
    assert!(matches!(
        build(&cfg, &sandbox(), &host()),
        Err(SpecError::CpuQuotaBelowNoLimit { value: -2 })
    ));

    let mut cfg = config();
    cfg.mounts[0].container_path = "../etc".into();
    assert!(matches!(
        build(&cfg, &sandbox(), &host()),
        Err(SpecError::InvalidMountDestination { .. })
    ));
}

fn pause_image() -> ImageConfig {
    ImageConfig {
        entrypoint: vec!["/pause".into()],
        env: vec!["PATH=/".into()],
        ..ImageConfig::default()
    }
}

fn build_sandbox(
    cfg: &SandboxConfig,
    h: &HostFacts,
    image: &ImageConfig,
) -> Result<Spec, SpecError> {
    let files = sandbox().files;
    sandbox_spec(&SandboxInputs {
        id: "sb1",
        config: cfg,
        image,
        image_name: "registry.k8s.io/pause:3.10",
        rootfs: None,
        netns_path: Some(Path::new("/run/remora/netns/sb1")),
        userns_path: None,
        files: &files,
        host: h,
        unprivileged_ports: true,
        unprivileged_icmp: false,
        pass_through: &crate::spec::PassThrough::default(),
    })
}

#[test]
fn sandbox_spec_puts_everything_together() {
    let cfg = sandbox().config;
    let spec = build_sandbox(&cfg, &host(), &pause_image()).unwrap();
    let process = spec.process().as_ref().unwrap();
    assert_eq!(process.args().as_ref().unwrap(), &["/pause"]);
    assert_eq!(process.env().as_ref().unwrap(), &["PATH=/"]);
    assert!(process.rlimits().is_none() && process.no_new_privileges().is_none());
    assert_eq!(process.oom_score_adj(), Some(-500));
    assert_eq!((process.user().uid(), process.user().gid()), (0, 0));
    assert_eq!(spec.hostname().as_deref(), Some("pod-host"));
    assert_eq!(spec.root().as_ref().unwrap().readonly(), Some(true));

    let shm = mount(&spec, "/dev/shm").unwrap();
    assert!(shm.options().as_ref().unwrap().contains(&"ro".to_owned()));
    assert!(mount(&spec, "/etc/resolv.conf").is_some());

    let linux = spec.linux().as_ref().unwrap();
    assert_eq!(
        linux.cgroups_path().as_deref(),
        Some(Path::new("/kubepods/burstable/pod1/sb1"))
    );
    let sysctl = linux.sysctl().as_ref().unwrap();
    assert_eq!(sysctl["net.core.somaxconn"], "1024");
    assert_eq!(sysctl["net.ipv4.ip_unprivileged_port_start"], "0");
    assert!(!sysctl.contains_key("net.ipv4.ping_group_range"));
    let res = linux.resources().as_ref().unwrap();
    assert_eq!(
        res.cpu().as_ref().unwrap().shares(),
        Some(SANDBOX_CPU_SHARES)
    );
    assert_eq!(
        ns_path(&spec, LinuxNamespaceType::Network),
        Some(Some("/run/remora/netns/sb1".into()))
    );
    assert_eq!(ns_path(&spec, LinuxNamespaceType::Pid), Some(None));
    assert_eq!(ns_path(&spec, LinuxNamespaceType::Uts), Some(None));

    let ann = spec.annotations().as_ref().unwrap();
    assert_eq!(ann[annotations::CONTAINER_TYPE], "sandbox");
    assert_eq!(ann[annotations::SANDBOX_LOG_DIR], "/var/log/pods/x");
    assert_eq!(ann[annotations::IMAGE_NAME], "registry.k8s.io/pause:3.10");
}

#[test]
fn sandbox_security_and_host_namespaces() {
    let mut cfg = sandbox().config;
    cfg.security.namespaces = NamespaceOptions {
        network: NamespaceMode::Node,
        pid: NamespaceMode::Node,
        ipc: NamespaceMode::Node,
        user: None,
    };
    cfg.security.run_as_user = Some(65535);
    cfg.security.supplemental_groups = vec![2000];
    cfg.security.seccomp = SeccompProfile::RuntimeDefault;
    cfg.hostname = "ignored".into();
    // net.* sysctls need the pod's own network namespace (see the test below).
    cfg.sysctls.clear();
    let spec = build_sandbox(
        &cfg,
        &HostFacts {
            min_oom_score_adj: -999,
            ..host()
        },
        &pause_image(),
    )
    .unwrap();
    assert!(
        spec.hostname().is_none(),
        "host network keeps the node's hostname"
    );
    assert_eq!(ns_path(&spec, LinuxNamespaceType::Network), None);
    assert_eq!(ns_path(&spec, LinuxNamespaceType::Pid), None);
    let linux = spec.linux().as_ref().unwrap();
    assert!(linux.seccomp().is_some());
    assert!(!linux
        .sysctl()
        .as_ref()
        .unwrap()
        .contains_key("net.ipv4.ip_unprivileged_port_start"));
    assert_eq!(
        mount(&spec, "/dev/shm").unwrap().source().as_deref(),
        Some(Path::new("/dev/shm"))
    );
    let process = spec.process().as_ref().unwrap();
    assert_eq!(process.oom_score_adj(), Some(-998));
    assert_eq!(process.user().uid(), 65535);
    assert_eq!(
        process.user().additional_gids().as_ref().unwrap(),
        &[0, 2000]
    );
}

#[test]
fn sysctls_outside_the_pods_namespaces_are_refused() {
    let mut cfg = sandbox().config;
    cfg.security.namespaces.network = NamespaceMode::Node;
    let err = build_sandbox(&cfg, &host(), &pause_image()).unwrap_err();
    assert!(
        matches!(&err, SpecError::InvalidSysctl { key, .. } if key == "net.core.somaxconn"),
        "{err}"
    );
    let mut cfg = sandbox().config;
    cfg.sysctls = [("kernel.pid_max".to_owned(), "4096".to_owned())].into();
    let err = build_sandbox(&cfg, &host(), &pause_image()).unwrap_err();
    assert!(err.to_string().contains("not namespaced"), "{err}");

    // A container of such a pod is refused too: the spec never carries a host-wide sysctl.
    let mut sb = sandbox();
    sb.config.sysctls = [("vm.swappiness".to_owned(), "0".to_owned())].into();
    let err = build(&config(), &sb, &host()).unwrap_err();
    assert!(matches!(err, SpecError::InvalidSysctl { .. }), "{err}");
}

#[test]
fn sandbox_without_command_fails() {
    let err = build_sandbox(&sandbox().config, &host(), &ImageConfig::default()).unwrap_err();
    assert!(matches!(err, SpecError::NoCommand));
}

/// Under the systemd cgroup driver the pause container and the pod's containers go to scopes
/// `remora-<id>.scope` in the pod's slice: runc's `slice:prefix:name`.
#[test]
fn specs_under_systemd_carry_slice_prefix_and_id() {
    let h = HostFacts {
        cgroup_driver: CgroupDriver::Systemd,
        ..host()
    };
    let mut sb = sandbox();
    sb.config.cgroup_parent = "kubepods-burstable-pod0a1f63d6_8c2b.slice".into();
    let path_of = |linux: Option<&oci_spec::runtime::Linux>| {
        linux
            .and_then(|l| l.cgroups_path().clone())
            .map(|p| p.display().to_string())
    };

    let pause = build_sandbox(&sb.config, &h, &pause_image()).unwrap();
    assert_eq!(
        path_of(pause.linux().as_ref()).as_deref(),
        Some("kubepods-burstable-pod0a1f63d6_8c2b.slice:remora:sb1")
    );
    let out = build(&config(), &sb, &h).unwrap();
    assert_eq!(
        path_of(out.spec.linux().as_ref()).as_deref(),
        Some("kubepods-burstable-pod0a1f63d6_8c2b.slice:remora:c1")
    );

    // A pod without a parent: the default slice, named.
    sb.config.cgroup_parent.clear();
    let pause = build_sandbox(&sb.config, &h, &pause_image()).unwrap();
    assert_eq!(
        path_of(pause.linux().as_ref()).as_deref(),
        Some("system.slice:remora:sb1")
    );
}

/// A cgroupfs path where systemd needs a slice name is the request's error, naming the field,
/// for the pause container and for a container alike.
#[test]
fn a_path_parent_under_systemd_is_refused_naming_cgroup_parent() {
    let h = HostFacts {
        cgroup_driver: CgroupDriver::Systemd,
        ..host()
    };
    let sb = sandbox();
    assert_eq!(sb.config.cgroup_parent, "/kubepods/burstable/pod1");
    let errors = [
        build_sandbox(&sb.config, &h, &pause_image()).unwrap_err(),
        build(&config(), &sb, &h).unwrap_err(),
    ];
    for e in errors {
        assert!(
            matches!(&e, SpecError::InvalidCgroupParent { parent, .. }
                if parent == "/kubepods/burstable/pod1"),
            "{e:?}"
        );
        assert!(e.to_string().contains("cgroup_parent"), "{e}");
    }
}
