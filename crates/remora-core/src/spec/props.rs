//! Property tests of the spec generators on their own: domain inputs that the CRI adapter
//! would refuse (relative or `..` mount paths, negative resources, host-wide sysctls, bad ids)
//! reach [`container_spec`] and [`sandbox_spec`] directly, as they would from a future
//! caller that forgot a check.
//!
//! Properties: nothing panics; an error is never [`SpecError::Build`] (that would be a bug in
//! this module, not bad input); an accepted spec has clean absolute mount destinations,
//! absolute bind sources, a non-empty process, an `oom_score_adj` within -1000..=1000 and not
//! below the host's minimum, non-negative limits, and only sysctls the pod's namespaces hold.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

use proptest::collection::{hash_map, vec};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use super::*;

/// Cases per property: enough to hit every check many times (the strategies are biased
/// towards the interesting values), few enough to keep `cargo test --lib` quick.
pub(crate) const CASES: u32 = 256;

/// The runner config of remora's property suites (here and in the daemon's `cri::convert::props`).
pub(crate) fn config() -> Config {
    Config {
        cases: CASES,
        // No persistence file: the suites run from the library's tests, not a crate dir.
        failure_persistence: None,
        ..Config::default()
    }
}

/// Runs `f` on a thread with a large stack: the request strategies nest deeply, and their
/// value trees overflow the default 2 MiB test thread stack in debug builds.
pub(crate) fn on_big_stack(f: impl FnOnce() + Send) {
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .stack_size(64 << 20)
            .spawn_scoped(scope, f)
            .expect("spawn test thread")
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    });
}

fn path() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "(/[a-z]{1,5}){1,3}",
        1 => prop::sample::select(&[
            "", "/", "/dev", "/dev/shm", "/etc/hosts", "relative", "/a/../b", "/../x",
            "/a/./b//", "/a/b/../../..", ".", "/proc",
        ][..]).prop_map(String::from),
        1 => "(/?(\\.|\\.\\.|[a-z]{1,3})){1,4}",
    ]
}

fn number() -> impl Strategy<Value = i64> {
    prop_oneof![
        8 => Just(0i64),
        4 => 1i64..2_000_000,
        1 => -1100i64..1100,
        1 => any::<i64>(),
    ]
}

/// Ids: usually valid, sometimes negative or too large.
fn id() -> impl Strategy<Value = i64> {
    prop_oneof![8 => 0i64..5000, 1 => number()]
}

fn mode() -> impl Strategy<Value = NamespaceMode> {
    prop::sample::select(
        &[
            NamespaceMode::Pod,
            NamespaceMode::Pod,
            NamespaceMode::Pod,
            NamespaceMode::Pod,
            NamespaceMode::Container,
            NamespaceMode::Node,
            NamespaceMode::Target,
        ][..],
    )
}

fn namespaces() -> impl Strategy<Value = NamespaceOptions> {
    (mode(), mode(), mode()).prop_map(|(network, pid, ipc)| NamespaceOptions {
        network,
        pid,
        ipc,
        user: None,
    })
}

fn sysctls() -> impl Strategy<Value = HashMap<String, String>> {
    let any_sysctls = hash_map(
        prop::sample::select(
            &[
                "net.core.somaxconn",
                "kernel.shm_rmid_forced",
                "fs.mqueue.msg_max",
                "kernel.hostname",
                "vm.swappiness",
                "kernel.pid_max",
                "net..x",
                "net/../../x",
            ][..],
        )
        .prop_map(String::from),
        prop::sample::select(&["1", "0", "1\n2"][..]).prop_map(String::from),
        1..3,
    );
    prop_oneof![3 => Just(HashMap::new()), 1 => any_sysctls]
}

prop_compose! {
    fn security()(
        privileged in prop::bool::weighted(0.05),
        namespaces in namespaces(),
        run_as_user in prop::option::weighted(0.3, id()),
        run_as_username in prop::sample::select(
            &["", "", "", "", "app", "root", "nobody", "app:app", "0:x:y"][..],
        ),
        run_as_group in prop::option::weighted(0.1, id()),
        supplemental_groups in vec(id(), 0..2),
        readonly_rootfs in any::<bool>(),
        no_new_privs in any::<bool>(),
        add in vec(prop::sample::select(&["NET_ADMIN", "ALL", "chown", "NET_RAW", "bogus"][..]), 0..2),
        seccomp in prop::sample::select(vec![
            SeccompProfile::Unconfined,
            SeccompProfile::Unconfined,
            SeccompProfile::Unconfined,
            SeccompProfile::RuntimeDefault,
            SeccompProfile::RuntimeDefault,
            SeccompProfile::RuntimeDefault,
            SeccompProfile::Localhost(PathBuf::from("/nonexistent/p.json")),
            SeccompProfile::Localhost(PathBuf::from("/dev/null")),
        ]),
        masked in prop::option::weighted(0.3, vec(path(), 0..2)),
    ) -> SecurityContext {
        SecurityContext {
            capabilities: Some(CapabilityChanges {
                add: add.into_iter().map(String::from).collect(),
                drop: vec![],
            }),
            privileged,
            namespaces,
            run_as_user,
            run_as_username: run_as_username.to_owned(),
            run_as_group,
            supplemental_groups,
            readonly_rootfs,
            no_new_privs,
            seccomp,
            masked_paths: masked,
            ..Default::default()
        }
    }
}

prop_compose! {
    fn resources()(
        cpu_period in number(),
        cpu_quota in number(),
        cpu_shares in number(),
        memory_limit_in_bytes in number(),
        memory_swap_limit_in_bytes in number(),
        oom_score_adj in prop_oneof![6 => -1000i64..=1000, 1 => number()],
        pids_limit in prop::option::weighted(0.2, number()),
        hugepage in prop::option::weighted(0.2, any::<u64>()),
    ) -> Resources {
        Resources {
            cpu_period,
            cpu_quota,
            cpu_shares,
            memory_limit_in_bytes,
            memory_swap_limit_in_bytes,
            oom_score_adj,
            pids_limit,
            hugepage_limits: hugepage
                .map(|limit| vec![HugepageLimit { page_size: "2MB".into(), limit }])
                .unwrap_or_default(),
            ..Default::default()
        }
    }
}

prop_compose! {
    fn container()(
        command in vec("[a-z/]{0,6}", 0..2),
        args in vec("[a-z ]{0,6}", 0..2),
        working_dir in prop_oneof![3 => Just(String::new()), 1 => path()],
        mounts in vec((path(), path(), any::<bool>(), prop::sample::select(&[
            MountPropagation::Private,
            MountPropagation::HostToContainer,
            MountPropagation::Bidirectional,
        ][..])), 0..4),
        devices in prop_oneof![
            3 => Just(vec![]),
            1 => vec((path(), prop::sample::select(&["/dev/null", "/dev/nope"][..]),
                prop::sample::select(&["", "rw", "x"][..])), 1..2),
        ],
        resources in prop::option::weighted(0.8, resources()),
        security in security(),
        tty in any::<bool>(),
    ) -> ContainerConfig {
        ContainerConfig {
            name: "c".into(),
            image_name: "busybox".into(),
            command,
            args,
            working_dir,
            mounts: mounts
                .into_iter()
                .map(|(container_path, host, readonly, propagation)| MountRequest {
                    container_path,
                    host_path: PathBuf::from(host),
                    readonly,
                    selinux_relabel: false,
                    propagation,
                    recursive_read_only: false,
                    image: None,
                    uid_mappings: Vec::new(),
                    gid_mappings: Vec::new(),
                    options: Vec::new(),
                })
                .collect(),
            devices: devices
                .into_iter()
                .map(|(container_path, host, permissions)| DeviceRequest {
                    container_path,
                    host_path: PathBuf::from(host),
                    permissions: permissions.to_owned(),
                })
                .collect(),
            resources,
            security,
            tty,
            ..Default::default()
        }
    }
}

prop_compose! {
    fn pod()(
        hostname in prop_oneof!["[a-z]{0,8}", Just("h".repeat(70))],
        cgroup_parent in prop_oneof![Just(String::new()), path()],
        sysctls in sysctls(),
        security in security(),
    ) -> SandboxConfig {
        SandboxConfig {
            name: "p".into(),
            namespace: "default".into(),
            uid: "u".into(),
            hostname,
            log_directory: "/var/log/pods/p".into(),
            cgroup_parent,
            sysctls,
            annotations: HashMap::new(),
            security,
        }
    }
}

fn no_build_error(e: &SpecError) -> Result<(), TestCaseError> {
    prop_assert!(!matches!(e, SpecError::Build(_)), "builder bug: {}", e);
    Ok(())
}

fn check_mounts(spec: &Spec) -> Result<(), TestCaseError> {
    for m in spec.mounts().as_deref().unwrap_or_default() {
        let d = m.destination();
        prop_assert!(d.is_absolute(), "{:?}", d);
        prop_assert!(
            !d.components()
                .any(|c| matches!(c, Component::ParentDir | Component::CurDir)),
            "{:?}",
            d
        );
        let text = d.to_string_lossy();
        let cleaned = mounts::clean_destination(&text).ok();
        prop_assert_eq!(cleaned.as_deref(), Some(text.as_ref()));
        if m.typ().as_deref() == Some("bind") {
            prop_assert!(m.source().as_deref().is_some_and(Path::is_absolute));
        }
    }
    Ok(())
}

fn check_linux(spec: &Spec, ns: &NamespaceOptions, min_oom: i32) -> Result<(), TestCaseError> {
    let process = spec.process().as_ref();
    prop_assert!(process
        .and_then(|p| p.args().as_ref())
        .is_some_and(|a| !a.is_empty()));
    if let Some(oom) = process.and_then(|p| p.oom_score_adj()) {
        prop_assert!((-1000..=1000).contains(&oom) && oom >= min_oom, "{}", oom);
    }
    let linux = spec.linux().as_ref();
    let (host_net, host_ipc) = (
        ns.network == NamespaceMode::Node,
        ns.ipc == NamespaceMode::Node,
    );
    for (k, v) in linux
        .and_then(|l| l.sysctl().as_ref())
        .into_iter()
        .flatten()
    {
        prop_assert!(sysctl::check(k, v, host_net, host_ipc).is_ok(), "{}", k);
    }
    if let Some(mem) = linux
        .and_then(|l| l.resources().as_ref())
        .and_then(|r| r.memory().as_ref())
    {
        prop_assert!(mem.limit().is_none_or(|l| l >= 0));
        prop_assert!(mem.swap().is_none_or(|l| l >= 0));
    }
    if let Some(cpu) = linux
        .and_then(|l| l.resources().as_ref())
        .and_then(|r| r.cpu().as_ref())
    {
        // -1 is no limit (kubelet's, passed on as the OCI runtime takes it).
        prop_assert!(cpu.quota().is_none_or(|q| q >= -1));
    }
    Ok(())
}

fn fake_devices(path: &Path) -> std::io::Result<HostDevice> {
    if path == Path::new("/dev/null") {
        Ok(HostDevice {
            kind: DeviceKind::Char,
            major: 1,
            minor: 3,
            file_mode: 0o666,
            uid: 0,
            gid: 0,
        })
    } else {
        Err(std::io::Error::from(std::io::ErrorKind::NotFound))
    }
}

fn files() -> SandboxFiles {
    SandboxFiles {
        hosts: Some("/run/remora/sb/hosts".into()),
        resolv_conf: Some("/run/remora/sb/resolv.conf".into()),
        hostname: Some("/run/remora/sb/hostname".into()),
        shm: Some("/run/remora/sb/shm".into()),
    }
}

#[test]
fn container_specs_are_valid_or_typed_errors() {
    let root = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(root.path().join("etc")).expect("etc");
    std::fs::write(
        root.path().join("etc/passwd"),
        "root:x:0:0::/root:/bin/sh\napp:x:1000:1000::/:/bin/sh\n",
    )
    .expect("passwd");
    std::fs::write(root.path().join("etc/group"), "root:x:0:\napp:x:1000:\n").expect("group");
    on_big_stack(|| {
        let built = std::cell::Cell::new(0u32);
        TestRunner::new(config())
            .run(
                &(
                    container(),
                    pod(),
                    -1000i32..=0,
                    prop::option::of(0u32..100),
                ),
                |(cfg, pod, min_oom, target_pid)| {
                    let sandbox = SandboxInfo {
                        id: "sb".into(),
                        pid: 42,
                        netns_path: Some("/run/remora/netns/sb".into()),
                        pinned: false,
                        config: pod,
                        files: files(),
                    };
                    let image = ImageConfig {
                        entrypoint: vec!["/entry".into()],
                        ..Default::default()
                    };
                    let host = HostFacts {
                        min_oom_score_adj: min_oom,
                        hugetlb_available: true,
                        swap_accounting: true,
                        ..HostFacts::default()
                    };
                    match container_spec(&ContainerInputs {
                        id: "c1",
                        config: &cfg,
                        image: &image,
                        sandbox: &sandbox,
                        rootfs: crate::spec::RootFs::Dir(root.path()),
                        target_pid,
                        host: &host,
                        device_lookup: &fake_devices,
                        pass_through: &crate::spec::PassThrough::default(),
                    }) {
                        Err(e) => no_build_error(&e)?,
                        Ok(generated) => {
                            built.set(built.get() + 1);
                            check_mounts(&generated.spec)?;
                            check_linux(&generated.spec, &cfg.security.namespaces, min_oom)?;
                            for d in &generated.host_dirs_to_create {
                                prop_assert!(d.is_absolute());
                            }
                        }
                    }
                    Ok(())
                },
            )
            .unwrap();
        assert!(
            built.get() >= CASES / 32,
            "only {} specs built",
            built.get()
        );
    });
}

#[test]
fn sandbox_specs_are_valid_or_typed_errors() {
    on_big_stack(|| {
        let built = std::cell::Cell::new(0u32);
        TestRunner::new(config())
            .run(
                &(pod(), -1000i32..=0, any::<(bool, bool)>()),
                |(pod, min_oom, (ports, icmp))| {
                    let host_net = pod.security.namespaces.network == NamespaceMode::Node;
                    let image = ImageConfig {
                        entrypoint: vec!["/pause".into()],
                        ..Default::default()
                    };
                    let host = HostFacts {
                        min_oom_score_adj: min_oom,
                        ..HostFacts::default()
                    };
                    let files = files();
                    match sandbox_spec(&SandboxInputs {
                        id: "sb",
                        config: &pod,
                        image: &image,
                        image_name: "pause",
                        rootfs: None,
                        netns_path: (!host_net).then_some(Path::new("/run/remora/netns/sb")),
                        userns_path: None,
                        files: &files,
                        host: &host,
                        unprivileged_ports: ports,
                        unprivileged_icmp: icmp,
                        pass_through: &crate::spec::PassThrough::default(),
                    }) {
                        Err(e) => no_build_error(&e)?,
                        Ok(spec) => {
                            built.set(built.get() + 1);
                            check_mounts(&spec)?;
                            check_linux(&spec, &pod.security.namespaces, min_oom)?;
                            if host_net {
                                prop_assert!(spec.hostname().is_none());
                            }
                        }
                    }
                    Ok(())
                },
            )
            .unwrap();
        assert!(
            built.get() >= CASES / 20,
            "only {} specs built",
            built.get()
        );
    });
}
