//! Property tests: CRI requests, arbitrary but shaped like real ones, through [`super`]
//! and on into spec generation ([`crate::spec`]).
//!
//! Properties:
//! - nothing panics, whatever the request;
//! - every refusal is a typed error whose gRPC status is `INVALID_ARGUMENT` (never `INTERNAL`
//!   or `UNKNOWN`), and a spec error is never [`SpecError::Build`] (a bug, not bad input);
//! - what is accepted keeps the invariants the rest of remora relies on: names within limits,
//!   mount destinations absolute and normalised, nothing (mount, log file) escaping through
//!   `..`, only namespaced sysctls, non-negative resources, and a process with arguments;
//! - arbitrary bytes, and corrupted encodings of real requests, decoded as the CRI request
//!   messages and pushed through the conversions, do not panic either.
//!
//! The strategies mix values kubelet sends with values built to hit each check (`..`, `/`,
//! NUL, over-long strings, negative numbers, enum values outside the proto's). Case counts are
//! kept small enough for the whole module to run in a few seconds on two cores.

use std::collections::HashMap;
use std::path::{Component, Path};

use crate::cri::v1;
use proptest::collection::{hash_map, vec};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use prost::Message;
use tonic::Code;

use super::*;
use crate::cri::error::CriError;
use crate::cri::validate;
use crate::lifecycle::ContainerError;
use crate::lifecycle::SandboxError;
use crate::spec::{self, HostDevice, NamespaceMode, SandboxFiles, SandboxInfo, SpecError};

/// Cases per property, as in remora-core's `spec::props`.
const CASES: u32 = 256;

/// The runner config of remora's property suites (here and in remora-core's `spec::props`).
fn config() -> Config {
    Config {
        cases: CASES,
        // No persistence file: the suites run from the library's tests, not a crate dir.
        failure_persistence: None,
        ..Config::default()
    }
}

/// Runs `f` on a thread with a large stack: the request strategies nest deeply, and their
/// value trees overflow the default 2 MiB test thread stack in debug builds.
fn on_big_stack(f: impl FnOnce() + Send) {
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .stack_size(64 << 20)
            .spawn_scoped(scope, f)
            .expect("spawn test thread")
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    });
}

fn strings(values: &'static [&'static str]) -> impl Strategy<Value = String> {
    prop::sample::select(values).prop_map(String::from)
}

/// Any text: real-looking names, separators, NUL, newlines, non-ASCII, very long strings.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => strings(&[
            "", ".", "..", "/", "a/b", "a\0b", "../x", "/abs/path", "rel/path", "/a/../b",
            "ä", "a;b=c", "a b", "a\nb", "nginx", "default", "uid-1", "PodSandbox-0a1f",
            "kube_system", "x.y-z",
        ]),
        3 => "[a-zA-Z0-9._-]{1,16}",
        1 => "[a-z/.;= ]{0,12}",
        1 => any::<String>(),
        1 => (200usize..300).prop_map(|n| "n".repeat(n)),
    ]
}

/// Paths, absolute and relative, with `.`, `..`, `//`, NUL.
fn path() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => strings(&[
            "", "/", "/data", "/etc/hosts", "/dev/shm", "/dev", "/dev/mqueue", "/proc",
            "/var/log/pods/p", "relative", "./x", "/a/../b", "/../x", "/a/b/../../..",
            "/x\0y", "//double//slash/", "/.", "0.log", "c/1.log", "../../etc/passwd",
        ]),
        2 => "(/(\\.|\\.\\.|[a-z]{1,3})){1,5}/?",
        1 => "((\\.|\\.\\.|[a-z]{1,3})/){0,3}[a-z]{0,3}",
    ]
}

/// A value kubelet would send (`good`) most of the time, anything ([`text`]) now and then,
/// so that whole requests are often accepted and the spec generator sees them.
fn mostly(good: &'static str) -> impl Strategy<Value = String> {
    prop_oneof![8 => good, 1 => text()]
}

/// A host or container path, usually clean and absolute.
fn mostly_path() -> impl Strategy<Value = String> {
    prop_oneof![6 => "(/[a-z]{1,6}){1,3}", 1 => path()]
}

fn sysctl_key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => strings(&[
            "net.ipv4.ip_forward", "net.core.somaxconn", "kernel.shm_rmid_forced",
            "fs.mqueue.msg_max", "kernel.sem", "kernel.hostname", "kernel.foo",
            "vm.swappiness", "kernel.pid_max", "net..x", "net/../../x", "net.",
            "net.ipv4.conf.eth0/100.rp_filter", "net/ipv4/ip_forward", "",
        ]),
        1 => text(),
    ]
}

/// Numbers as CRI's resources see them: mostly small or zero, sometimes any i64.
fn number() -> impl Strategy<Value = i64> {
    prop_oneof![
        2 => Just(0i64),
        2 => -3i64..3,
        2 => 1000i64..2_000_000,
        1 => -1100i64..1100,
        1 => any::<i64>(),
    ]
}

/// Enum values: the proto's and a few it does not define.
fn enum_value() -> impl Strategy<Value = i32> {
    prop_oneof![12 => 0i32..3, 1 => -2i32..8, 1 => any::<i32>()]
}

/// Resource numbers, usually valid.
fn mostly_number() -> impl Strategy<Value = i64> {
    prop_oneof![6 => Just(0i64), 4 => 1000i64..2_000_000, 1 => number()]
}

fn small_map(
    k: impl Strategy<Value = String>,
    v: impl Strategy<Value = String>,
) -> impl Strategy<Value = HashMap<String, String>> {
    hash_map(k, v, 0..3)
}

/// Labels or annotations: usually kubelet-like, sometimes anything.
fn meta_map(v: impl Strategy<Value = String>) -> impl Strategy<Value = HashMap<String, String>> {
    prop_oneof![
        6 => small_map("[a-z.]{1,10}(/[a-z]{1,6})?", "[a-z0-9-]{0,10}"),
        1 => small_map(text(), v),
    ]
}

/// Annotation values, now and then over the 512 KiB limit.
fn annotation_value() -> impl Strategy<Value = String> {
    prop_oneof![20 => text(), 1 => Just("a".repeat(600 * 1024))]
}

fn profile() -> impl Strategy<Value = Option<v1::SecurityProfile>> {
    prop::option::weighted(
        0.3,
        (
            enum_value(),
            strings(&[
                "",
                "/nonexistent/profile.json",
                "localhost//nonexistent/p.json",
                "relative.json",
                "/dev/null",
                "k8s-nginx",
            ]),
        )
            .prop_map(|(t, r)| v1::SecurityProfile {
                profile_type: t,
                localhost_ref: r,
            }),
    )
}

fn legacy_profile() -> impl Strategy<Value = String> {
    prop_oneof![4 => Just(String::new()), 1 => strings(&[
        "",
        "runtime/default",
        "docker/default",
        "unconfined",
        "localhost//nonexistent/p.json",
        "localhost/",
        "bogus",
    ])]
}

fn namespace_option() -> impl Strategy<Value = Option<v1::NamespaceOption>> {
    prop::option::of(
        (
            enum_value(),
            enum_value(),
            enum_value(),
            prop::option::weighted(0.1, enum_value()),
        )
            .prop_map(|(network, pid, ipc, userns)| v1::NamespaceOption {
                network,
                pid,
                ipc,
                target_id: String::new(),
                userns_options: userns.map(|mode| v1::UserNamespace {
                    mode,
                    ..Default::default()
                }),
            }),
    )
}

fn id_value() -> impl Strategy<Value = Option<v1::Int64Value>> {
    prop::option::weighted(
        0.3,
        prop_oneof![4 => 0i64..2000, 1 => number()].prop_map(|value| v1::Int64Value { value }),
    )
}

prop_compose! {
    fn pod_security()(
        namespace_options in namespace_option(),
        run_as_user in id_value(),
        run_as_group in id_value(),
        supplemental_groups in vec(prop_oneof![4 => 0i64..5000, 1 => number()], 0..3),
        privileged in prop::bool::weighted(0.3),
        readonly_rootfs in any::<bool>(),
        seccomp in profile(),
        seccomp_path in legacy_profile(),
        policy in prop_oneof![6 => 0i32..2, 1 => enum_value()],
    ) -> v1::LinuxSandboxSecurityContext {
        #[allow(deprecated)]
        v1::LinuxSandboxSecurityContext {
            namespace_options,
            run_as_user,
            run_as_group,
            supplemental_groups,
            privileged,
            readonly_rootfs,
            seccomp,
            seccomp_profile_path: seccomp_path,
            supplemental_groups_policy: policy,
            ..Default::default()
        }
    }
}

prop_compose! {
    fn port_mapping()(
        protocol in enum_value(),
        container_port in prop_oneof![1i32..65536, any::<i32>()],
        host_port in prop_oneof![Just(0i32), 1i32..65536, any::<i32>()],
        host_ip in prop_oneof![strings(&["", "127.0.0.1", "::1", "localhost"]), text()],
    ) -> v1::PortMapping {
        v1::PortMapping { protocol, container_port, host_port, host_ip }
    }
}

prop_compose! {
    fn dns()(
        servers in vec(prop_oneof![strings(&["10.96.0.10", "fd00::a"]), text()], 0..3),
        searches in vec(prop_oneof![strings(&["svc.cluster.local"]), text()], 0..3),
        options in vec(prop_oneof![strings(&["ndots:5"]), text()], 0..3),
    ) -> v1::DnsConfig {
        v1::DnsConfig { servers, searches, options }
    }
}

prop_compose! {
    /// A pod config: every field arbitrary, the metadata often valid so the later checks run.
    fn pod()(
        metadata in prop::option::weighted(0.97, (
            mostly("[a-z0-9-]{1,20}"),
            mostly("[a-z0-9-]{1,20}"),
            mostly("[a-f0-9-]{36}"),
            any::<u32>(),
        )),
        hostname in mostly("[a-z0-9-]{0,20}"),
        log_directory in prop_oneof![6 => "/var/log/pods/[a-z_]{1,12}", 1 => path()],
        dns_config in prop::option::weighted(0.3, dns()),
        port_mappings in vec(port_mapping(), 0..2),
        labels in meta_map(text()),
        annotations in meta_map(annotation_value()),
        linux in prop::option::weighted(0.9, (
            prop_oneof![6 => "(/[a-z]{1,8}){0,3}", 1 => path()],
            prop::option::weighted(0.8, pod_security()),
            prop_oneof![
                2 => Just(HashMap::new()),
                2 => small_map(sysctl_key(), prop_oneof![strings(&["1", "0 2147483647"]), text()]),
            ],
        )),
    ) -> v1::PodSandboxConfig {
        v1::PodSandboxConfig {
            metadata: metadata.map(|(name, namespace, uid, attempt)| v1::PodSandboxMetadata {
                name, namespace, uid, attempt,
            }),
            hostname,
            log_directory,
            dns_config,
            port_mappings,
            labels,
            annotations,
            linux: linux.map(|(cgroup_parent, security_context, sysctls)| {
                v1::LinuxPodSandboxConfig {
                    cgroup_parent,
                    security_context,
                    sysctls,
                    overhead: None,
                    resources: None,
                }
            }),
            windows: None,
        }
    }
}

prop_compose! {
    fn mount()(
        container_path in mostly_path(),
        host_path in mostly_path(),
        readonly in any::<bool>(),
        propagation in enum_value(),
        recursive_read_only in prop::bool::weighted(0.05),
    ) -> v1::Mount {
        v1::Mount {
            container_path,
            host_path,
            readonly,
            propagation,
            recursive_read_only,
            ..Default::default()
        }
    }
}

prop_compose! {
    fn resources()(
        cpu_period in mostly_number(),
        cpu_quota in mostly_number(),
        cpu_shares in mostly_number(),
        memory_limit_in_bytes in mostly_number(),
        memory_swap_limit_in_bytes in mostly_number(),
        oom_score_adj in prop_oneof![4 => -1000i64..1001, 1 => number()],
        cpuset_cpus in prop_oneof![6 => strings(&["", "0", "0-1,3"]), 1 => text()],
        unified in prop_oneof![
            6 => Just(HashMap::new()),
            1 => small_map(
                prop_oneof![strings(&["memory.high", "../x", "a/b", ""]), text()],
                text(),
            ),
        ],
    ) -> v1::LinuxContainerResources {
        v1::LinuxContainerResources {
            cpu_period,
            cpu_quota,
            cpu_shares,
            memory_limit_in_bytes,
            memory_swap_limit_in_bytes,
            oom_score_adj,
            cpuset_cpus,
            unified,
            ..Default::default()
        }
    }
}

prop_compose! {
    fn container_security()(
        add in vec(strings(&["NET_ADMIN", "cap_sys_time", "ALL", "chown", "BOGUS"]), 0..2),
        drop in vec(strings(&["ALL", "NET_RAW", "x"]), 0..2),
        ambient in prop::bool::weighted(0.05),
        privileged in prop::bool::weighted(0.1),
        namespace_options in namespace_option(),
        run_as_user in id_value(),
        run_as_group in id_value(),
        run_as_username in prop_oneof![
            6 => strings(&["", "", "app", "root", "nobody"]),
            1 => text(),
        ],
        readonly_rootfs in any::<bool>(),
        no_new_privs in any::<bool>(),
        masked_paths in vec(mostly_path(), 0..2),
        seccomp in profile(),
        apparmor in profile(),
        seccomp_path in legacy_profile(),
    ) -> v1::LinuxContainerSecurityContext {
        #[allow(deprecated)]
        v1::LinuxContainerSecurityContext {
            capabilities: Some(v1::Capability {
                add_capabilities: add,
                drop_capabilities: drop,
                add_ambient_capabilities: if ambient { vec!["NET_RAW".into()] } else { vec![] },
            }),
            privileged,
            namespace_options,
            run_as_user,
            run_as_group,
            run_as_username,
            readonly_rootfs,
            no_new_privs,
            masked_paths,
            seccomp,
            apparmor,
            seccomp_profile_path: seccomp_path,
            ..Default::default()
        }
    }
}

prop_compose! {
    fn container()(
        metadata in prop::option::weighted(0.97, (mostly("[a-z0-9-]{1,20}"), any::<u32>())),
        image in prop::option::weighted(0.97, mostly("busybox")),
        command in vec(mostly("/bin/[a-z]{1,5}"), 0..3),
        args in vec(mostly("[a-z0-9 -]{0,8}"), 0..3),
        working_dir in prop_oneof![4 => Just(String::new()), 1 => mostly_path()],
        envs in vec((mostly("[A-Z_]{1,8}"), mostly("[a-z=:/]{0,8}")), 0..3),
        mounts in vec(mount(), 0..3),
        devices in prop_oneof![
            4 => Just(vec![]),
            1 => vec((path(), strings(&["/dev/null", "/dev/nope"]), strings(&["", "rw", "x"])), 1..2),
        ],
        labels in meta_map(text()),
        annotations in meta_map(annotation_value()),
        log_path in prop_oneof![6 => "[a-z]{1,6}/[0-9]\\.log", 1 => path()],
        tty in any::<bool>(),
        linux in prop::option::weighted(0.9, (
            prop::option::weighted(0.8, resources()),
            prop::option::weighted(0.8, container_security()),
        )),
    ) -> v1::ContainerConfig {
        v1::ContainerConfig {
            metadata: metadata.map(|(name, attempt)| v1::ContainerMetadata { name, attempt }),
            image: image.map(|image| v1::ImageSpec { image, ..Default::default() }),
            command,
            args,
            working_dir,
            envs: envs.into_iter().map(|(key, value)| v1::KeyValue { key, value: value.into_bytes() }).collect(),
            mounts,
            devices: devices
                .into_iter()
                .map(|(container_path, host_path, permissions)| v1::Device {
                    container_path,
                    host_path,
                    permissions,
                })
                .collect(),
            labels,
            annotations,
            log_path,
            tty,
            linux: linux.map(|(resources, security_context)| v1::LinuxContainerConfig {
                resources,
                security_context,
            }),
            ..Default::default()
        }
    }
}

/// How the cases of one property ended: a suite where nearly everything is refused (or
/// nothing is) would test little, so each property checks it saw plenty of both.
#[derive(Default)]
struct Tally {
    refused: std::cell::Cell<u32>,
    spec_refused: std::cell::Cell<u32>,
    built: std::cell::Cell<u32>,
}

impl Tally {
    fn bump(c: &std::cell::Cell<u32>) {
        c.set(c.get() + 1);
    }

    /// At least `min` cases were refused by the conversion and `min` made it into a spec.
    fn assert_both_paths(&self, what: &str, min: u32) {
        let (r, s, b) = (
            self.refused.get(),
            self.spec_refused.get(),
            self.built.get(),
        );
        assert!(
            r >= min && b >= min,
            "{what}: refused {r}, refused by the spec {s}, built {b}: the strategies no longer reach both paths"
        );
    }
}

/// The gRPC code a conversion error reaches kubelet with.
fn convert_code(e: ConvertError) -> Code {
    tonic::Status::from(CriError::from(e)).code()
}

fn check_convert_error<T>(r: Result<T, ConvertError>) -> Result<Option<T>, TestCaseError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) => {
            let text = e.to_string();
            prop_assert!(!text.is_empty());
            prop_assert!(
                text.len() < 1024,
                "error messages do not echo huge values: {} bytes",
                text.len()
            );
            prop_assert_eq!(convert_code(e), Code::InvalidArgument, "{}", text);
            Ok(None)
        }
    }
}

/// A spec error is bad input (INVALID_ARGUMENT through the lifecycle errors), never a bug.
fn check_spec_error(e: SpecError) -> Result<(), TestCaseError> {
    prop_assert!(!matches!(e, SpecError::Build(_)), "builder bug: {}", e);
    let text = e.to_string();
    let c = CriError::from(ContainerError::Spec(e)).code();
    prop_assert_eq!(c, Code::InvalidArgument, "{}", &text);
    Ok(())
}

fn clean_absolute(p: &Path) -> bool {
    p.is_absolute()
        && !p
            .components()
            .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= validate::MAX_NAME_LEN
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
        && s != "."
        && s != ".."
}

/// Accepted pod configs keep the invariants; their pause spec is valid or a typed error.
fn check_pod(
    cfg: &v1::PodSandboxConfig,
    tally: &Tally,
) -> Result<Option<spec::SandboxConfig>, TestCaseError> {
    let converted = check_convert_error(sandbox_config(cfg))?;
    check_convert_error(sandbox_metadata("0123abcd", cfg, "runc"))?;
    let ports = check_convert_error(sandbox_port_mappings(cfg))?;
    let _ = sandbox_dns(cfg);
    let _ = sandbox_cni_dns(cfg);
    let Some(c) = converted else {
        Tally::bump(&tally.refused);
        return Ok(None);
    };
    prop_assert!(valid_name(&c.name) && valid_name(&c.namespace) && valid_name(&c.uid));
    prop_assert!(c.hostname.len() <= validate::MAX_HOSTNAME_LEN);
    prop_assert!(!c
        .hostname
        .bytes()
        .any(|b| b.is_ascii_whitespace() || b == 0));
    prop_assert!(c.log_directory.is_empty() || clean_absolute_or_dots(&c.log_directory));
    prop_assert!(!Path::new(&c.cgroup_parent)
        .components()
        .any(|x| x == Component::ParentDir));
    let host_net = c.security.namespaces.network == NamespaceMode::Node;
    let host_ipc = c.security.namespaces.ipc == NamespaceMode::Node;
    for (k, v) in &c.sysctls {
        prop_assert!(
            spec::sysctl::check(k, v, host_net, host_ipc).is_ok(),
            "{}",
            k
        );
    }
    let total: usize = c.annotations.iter().map(|(k, v)| k.len() + v.len()).sum();
    prop_assert!(total <= validate::MAX_ANNOTATIONS_LEN);
    for p in ports.unwrap_or_default() {
        if p.host_port > 0 {
            prop_assert!(p.host_port <= 65535 && (1..=65535).contains(&p.container_port));
        }
    }

    let files = SandboxFiles {
        hosts: Some("/run/remora/sb/hosts".into()),
        resolv_conf: Some("/run/remora/sb/resolv.conf".into()),
        hostname: Some("/run/remora/sb/hostname".into()),
        shm: Some("/run/remora/sb/shm".into()),
    };
    let image = spec::ImageConfig {
        entrypoint: vec!["/pause".into()],
        ..Default::default()
    };
    let result = spec::sandbox_spec(&spec::SandboxInputs {
        id: "0123abcd",
        config: &c,
        image: &image,
        image_name: "registry.k8s.io/pause:3.10",
        rootfs: None,
        netns_path: (!host_net).then_some(Path::new("/run/remora/netns/sb")),
        userns_path: None,
        files: &files,
        host: &spec::HostFacts::default(),
        unprivileged_ports: true,
        unprivileged_icmp: false,
        pass_through: &crate::spec::PassThrough::default(),
    });
    match result {
        Err(e) => {
            prop_assert!(!matches!(e, SpecError::Build(_)), "builder bug: {}", e);
            let text = e.to_string();
            let code = CriError::from(SandboxError::Spec(e)).code();
            prop_assert_eq!(code, Code::InvalidArgument, "{}", text);
            Tally::bump(&tally.spec_refused);
        }
        Ok(s) => {
            Tally::bump(&tally.built);
            check_spec_mounts(s.mounts().as_deref().unwrap_or_default())?;
            let args = s.process().as_ref().and_then(|p| p.args().clone());
            prop_assert!(args.is_some_and(|a| !a.is_empty()));
            if let Some(h) = s.hostname() {
                prop_assert!(h.len() <= validate::MAX_HOSTNAME_LEN);
            }
            let linux = s.linux().as_ref();
            for (k, v) in linux
                .and_then(|l| l.sysctl().as_ref())
                .into_iter()
                .flatten()
            {
                prop_assert!(
                    spec::sysctl::check(k, v, host_net, host_ipc).is_ok(),
                    "{}",
                    k
                );
            }
        }
    }
    Ok(Some(c))
}

/// `log_directory` accepted: absolute without `..` (`.` and `//` are harmless and allowed).
fn clean_absolute_or_dots(p: &str) -> bool {
    p.starts_with('/') && !Path::new(p).components().any(|c| c == Component::ParentDir)
}

fn check_spec_mounts(mounts: &[oci_spec::runtime::Mount]) -> Result<(), TestCaseError> {
    for m in mounts {
        let d = m.destination();
        prop_assert!(clean_absolute(d), "destination {:?}", d);
        let text = d.to_string_lossy();
        let cleaned = spec::mounts::clean_destination(&text).ok();
        prop_assert_eq!(
            cleaned.as_deref(),
            Some(text.as_ref()),
            "destination is normalised"
        );
        if m.typ().as_deref() == Some("bind") {
            let src = m.source().as_deref().unwrap_or(Path::new(""));
            prop_assert!(src.is_absolute(), "bind source {:?}", src);
        }
    }
    Ok(())
}

/// A pod config that converts, for container cases whose pod is not under test.
fn good_pod() -> v1::PodSandboxConfig {
    v1::PodSandboxConfig {
        metadata: Some(v1::PodSandboxMetadata {
            name: "web".into(),
            uid: "0a1f63d6-8d2b-4e4e-9f5e-1d2b3c4d5e6f".into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: "web".into(),
        log_directory: "/var/log/pods/default_web_0a1f".into(),
        linux: Some(v1::LinuxPodSandboxConfig {
            sysctls: [("net.core.somaxconn".to_owned(), "1024".to_owned())].into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn fake_devices(path: &Path) -> std::io::Result<HostDevice> {
    if path == Path::new("/dev/null") {
        Ok(HostDevice {
            kind: spec::DeviceKind::Char,
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

/// Accepted container configs keep the invariants; their spec is valid or a typed error.
fn check_container(
    c: &v1::ContainerConfig,
    pod: &v1::PodSandboxConfig,
    pod_config: &spec::SandboxConfig,
    rootfs: &Path,
    tally: &Tally,
) -> Result<(), TestCaseError> {
    let converted = check_convert_error(container_config(c, pod))?;
    let meta = check_convert_error(container_metadata("c1", "sb", c, pod))?;
    let _ = container_target_id(c);
    if let Some(m) = &meta {
        prop_assert!(valid_name(&m.name));
        if !m.log_path.is_empty() {
            let lp = Path::new(&m.log_path);
            prop_assert!(lp.starts_with(&pod.log_directory), "{:?}", lp);
            prop_assert!(!lp.components().any(|x| x == Component::ParentDir));
            prop_assert!(lp != Path::new(&pod.log_directory));
        }
        for mt in &m.mounts {
            prop_assert!(clean_absolute_or_dots(&mt.container_path));
            prop_assert!(clean_absolute_or_dots(&mt.host_path));
        }
    }
    let Some(cfg) = converted else {
        Tally::bump(&tally.refused);
        return Ok(());
    };
    for m in &cfg.mounts {
        prop_assert!(clean_absolute_or_dots(&m.container_path));
        prop_assert!(spec::mounts::clean_destination(&m.container_path).is_ok());
    }
    if let Some(r) = &cfg.resources {
        // A CPU quota of -1 is no limit (kubelet's "no quota"); nothing else may be negative.
        prop_assert!(r.cpu_quota >= -1);
        for v in [
            r.cpu_period,
            r.cpu_shares,
            r.memory_limit_in_bytes,
            r.memory_swap_limit_in_bytes,
        ] {
            prop_assert!(v >= 0);
        }
        prop_assert!((-1000..=1000).contains(&r.oom_score_adj));
    }
    for (k, _) in &cfg.envs {
        prop_assert!(!k.is_empty() && !k.contains('='));
    }

    let sandbox = SandboxInfo {
        id: "sb".into(),
        pid: 4321,
        netns_path: Some("/run/remora/netns/sb".into()),
        pinned: false,
        config: pod_config.clone(),
        files: SandboxFiles {
            hosts: Some("/run/remora/sb/hosts".into()),
            resolv_conf: Some("/run/remora/sb/resolv.conf".into()),
            hostname: Some("/run/remora/sb/hostname".into()),
            shm: Some("/run/remora/sb/shm".into()),
        },
    };
    let image = spec::ImageConfig {
        user: String::new(),
        entrypoint: vec!["/entry".into()],
        cmd: vec!["serve".into()],
        ..Default::default()
    };
    let result = spec::container_spec(&spec::ContainerInputs {
        id: "c1",
        config: &cfg,
        image: &image,
        sandbox: &sandbox,
        rootfs: spec::RootFs::Dir(rootfs),
        target_pid: Some(99),
        host: &spec::HostFacts::default(),
        device_lookup: &fake_devices,
        pass_through: &crate::spec::PassThrough::default(),
    });
    match result {
        Err(e) => {
            check_spec_error(e)?;
            Tally::bump(&tally.spec_refused);
        }
        Ok(generated) => {
            Tally::bump(&tally.built);
            let s = &generated.spec;
            check_spec_mounts(s.mounts().as_deref().unwrap_or_default())?;
            let process = s.process().as_ref();
            let args = process.and_then(|p| p.args().clone()).unwrap_or_default();
            prop_assert!(!args.is_empty());
            prop_assert!(!args.iter().any(|a| a.contains('\0')));
            prop_assert!(process.is_some_and(|p| p.cwd().is_absolute()));
            for d in &generated.host_dirs_to_create {
                prop_assert!(d.is_absolute());
                prop_assert!(!d.components().any(|x| x == Component::ParentDir));
            }
            let linux = s.linux().as_ref();
            if let Some(cg) = linux.and_then(|l| l.cgroups_path().as_ref()) {
                prop_assert!(!cg.components().any(|x| x == Component::ParentDir));
            }
            let host_net = cfg.security.namespaces.network == NamespaceMode::Node;
            let host_ipc = cfg.security.namespaces.ipc == NamespaceMode::Node;
            for (k, v) in linux
                .and_then(|l| l.sysctl().as_ref())
                .into_iter()
                .flatten()
            {
                prop_assert!(
                    spec::sysctl::check(k, v, host_net, host_ipc).is_ok(),
                    "{}",
                    k
                );
            }
            let ann = s.annotations().as_ref();
            prop_assert_eq!(
                ann.and_then(|a| a.get(spec::annotations::SANDBOX_ID))
                    .map(String::as_str),
                Some("sb")
            );
        }
    }
    Ok(())
}

/// An image root with passwd and group files, so user names resolve.
fn rootfs() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("etc")).expect("etc");
    std::fs::write(
        dir.path().join("etc/passwd"),
        "root:x:0:0::/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n",
    )
    .expect("passwd");
    std::fs::write(dir.path().join("etc/group"), "root:x:0:\napp:x:1000:\n").expect("group");
    dir
}

#[test]
fn pod_requests_convert_or_are_invalid_argument() {
    on_big_stack(|| {
        let tally = Tally::default();
        TestRunner::new(config())
            .run(&pod(), |cfg| check_pod(&cfg, &tally).map(|_| ()))
            .unwrap();
        tally.assert_both_paths("pods", CASES / 20);
    });
}

#[test]
fn container_requests_convert_or_are_invalid_argument() {
    let root = rootfs();
    let pod_config = sandbox_config(&good_pod()).unwrap();
    on_big_stack(|| {
        let tally = Tally::default();
        TestRunner::new(config())
            .run(&container(), |c| {
                check_container(&c, &good_pod(), &pod_config, root.path(), &tally)
            })
            .unwrap();
        tally.assert_both_paths("containers", CASES / 20);
    });
}

#[test]
fn container_requests_in_arbitrary_pods() {
    // The pod is arbitrary too: the container sees the pod the request carries (log
    // directory, metadata) and the pod config the sandbox was created with.
    let root = rootfs();
    let fallback = sandbox_config(&good_pod()).unwrap();
    on_big_stack(|| {
        let cfg = Config {
            cases: CASES / 2,
            ..config()
        };
        let (pods, containers) = (Tally::default(), Tally::default());
        TestRunner::new(cfg)
            .run(&(container(), pod()), |(c, p)| {
                let pod_config = check_pod(&p, &pods)?.unwrap_or_else(|| fallback.clone());
                check_container(&c, &p, &pod_config, root.path(), &containers)
            })
            .unwrap();
        containers.assert_both_paths("containers in arbitrary pods", CASES / 128);
    });
}

#[test]
fn update_resources_convert_or_are_invalid_argument() {
    on_big_stack(|| {
        TestRunner::new(config())
            .run(&resources(), |r| {
                if let Some(res) = check_convert_error(super::resources(&r, "linux"))? {
                    // What converts, the spec accepts: no second, later refusal.
                    let built = spec::resources::linux_resources(&res, &spec::HostFacts::default());
                    prop_assert!(built.is_ok(), "{:?}", built.err());
                    prop_assert!(spec::resources::oom_score_adj(res.oom_score_adj, 0).is_ok());
                }
                Ok(())
            })
            .unwrap();
    });
}

/// Everything a decoded request feeds to the conversions.
fn convert_all(bytes: &[u8]) {
    if let Ok(r) = v1::RunPodSandboxRequest::decode(bytes) {
        let cfg = r.config.unwrap_or_default();
        let _ = sandbox_config(&cfg);
        let _ = sandbox_metadata("id", &cfg, &r.runtime_handler);
        let _ = sandbox_port_mappings(&cfg);
        let _ = sandbox_dns(&cfg);
        let _ = sandbox_cni_dns(&cfg);
    }
    if let Ok(r) = v1::CreateContainerRequest::decode(bytes) {
        let c = r.config.unwrap_or_default();
        let p = r.sandbox_config.unwrap_or_default();
        let _ = container_config(&c, &p);
        let _ = container_metadata("id", &r.pod_sandbox_id, &c, &p);
        let _ = container_target_id(&c);
    }
    if let Ok(r) = v1::UpdateContainerResourcesRequest::decode(bytes) {
        if let Some(l) = r.linux {
            let _ = super::resources(&l, "linux");
        }
    }
    if let Ok(r) = v1::ListPodSandboxRequest::decode(bytes) {
        let _ = sandbox_filter(r.filter.as_ref());
    }
    if let Ok(r) = v1::ListContainersRequest::decode(bytes) {
        let _ = container_filter(r.filter.as_ref());
    }
}

#[test]
fn arbitrary_bytes_decode_and_convert_without_panic() {
    on_big_stack(|| {
        TestRunner::new(config())
            .run(&vec(any::<u8>(), 0..512), |bytes| {
                convert_all(&bytes);
                Ok(())
            })
            .unwrap();
    });
}

#[test]
fn corrupted_real_requests_decode_and_convert_without_panic() {
    on_big_stack(|| {
        let corruption = (
            vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
            prop::option::of(any::<prop::sample::Index>()),
        );
        TestRunner::new(config())
            .run(&(container(), pod(), corruption), |(c, p, (flips, cut))| {
                let run = v1::RunPodSandboxRequest {
                    config: Some(p.clone()),
                    runtime_handler: String::new(),
                };
                let create = v1::CreateContainerRequest {
                    pod_sandbox_id: "sb".into(),
                    config: Some(c),
                    sandbox_config: Some(p),
                };
                for mut bytes in [run.encode_to_vec(), create.encode_to_vec()] {
                    if bytes.is_empty() {
                        continue;
                    }
                    for (at, value) in &flips {
                        let i = at.index(bytes.len());
                        bytes[i] = *value;
                    }
                    if let Some(cut) = &cut {
                        bytes.truncate(cut.index(bytes.len()));
                    }
                    convert_all(&bytes);
                }
                Ok(())
            })
            .unwrap();
    });
}
