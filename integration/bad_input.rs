//! Bad input on the real path: malformed requests are refused with a gRPC code naming what was
//! wrong and leave nothing behind (no containerd record, snapshot, lease, netns or pod files);
//! unknown ids are NOT_FOUND except for the idempotent Stop/Remove; the CRI socket refuses
//! users other than root.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use remora::cri::v1;
use tonic::Code;

use crate::cri;
use crate::harness::{tool, BedRemora};

/// The pods of these tests: [`cri::pod_config`] with a hostname.
fn pod(name: &str, log_dir: &Path) -> v1::PodSandboxConfig {
    v1::PodSandboxConfig {
        hostname: "bad-input".into(),
        ..cri::pod_config(name, log_dir, false)
    }
}

fn container(name: &str) -> v1::ContainerConfig {
    cri::container_config(name, &["sleep", "3600"])
}

fn state_dir(bed: &BedRemora) -> PathBuf {
    bed.remora
        .socket
        .parent()
        .expect("scratch dir")
        .join("state")
}

fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Snapshots other than image layers (whose keys hold a chain id, `sha256:`).
fn non_layer_snapshots(bed: &BedRemora) -> Vec<String> {
    bed.ctr(&["snapshots", "ls"])
        .lines()
        .skip(1)
        .filter(|l| !l.contains("sha256:"))
        .map(String::from)
        .collect()
}

/// Leases remora takes while it creates something.
fn creation_leases(bed: &BedRemora) -> Vec<String> {
    bed.ctr(&["leases", "ls"])
        .lines()
        .filter(|l| l.contains("remora-create"))
        .map(String::from)
        .collect()
}

type PodEdit = Box<dyn FnOnce(&mut v1::PodSandboxConfig)>;

fn sysctl(key: &'static str) -> PodEdit {
    Box::new(move |p| {
        p.linux
            .get_or_insert_with(Default::default)
            .sysctls
            .insert(key.into(), "1".into());
    })
}

#[tokio::test]
async fn rejected_pods_are_invalid_argument_and_leave_nothing_behind() {
    let bed = BedRemora::start_with_network();
    let logs = crate::harness::scratch();
    let host_network = |p: &mut v1::PodSandboxConfig| {
        p.linux
            .get_or_insert_with(Default::default)
            .security_context
            .get_or_insert_with(Default::default)
            .namespace_options = Some(v1::NamespaceOption {
            network: v1::NamespaceMode::Node as i32,
            ..Default::default()
        });
    };
    let cases: Vec<(PodEdit, &str)> = vec![
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
            Box::new(|p| p.metadata.as_mut().unwrap().name.clear()),
            "config.metadata.name is required",
        ),
        (
            Box::new(|p| p.metadata.as_mut().unwrap().uid = "u;K8S_POD_NAME=other".into()),
            "config.metadata.uid",
        ),
        (
            Box::new(|p| p.metadata.as_mut().unwrap().namespace = "..".into()),
            "config.metadata.namespace",
        ),
        (Box::new(|p| p.hostname = "h".repeat(65)), "config.hostname"),
        (
            Box::new(|p| p.hostname = "h\n10.0.0.1 evil".into()),
            "config.hostname",
        ),
        (
            Box::new(|p| p.log_directory = "relative/logs".into()),
            "config.log_directory",
        ),
        (
            Box::new(|p| p.log_directory = "/var/log/pods/../../etc".into()),
            "config.log_directory",
        ),
        (sysctl("kernel.foo"), "config.linux.sysctls[kernel.foo]"),
        (sysctl("vm.swappiness"), "not namespaced"),
        (
            sysctl("net/../../etc/x"),
            "config.linux.sysctls[net/../../etc/x]",
        ),
        (sysctl("net..ipv4.ip_forward"), "empty component"),
        (
            Box::new(move |p| {
                host_network(p);
                sysctl("net.ipv4.ip_forward")(p);
            }),
            "host network",
        ),
        (
            Box::new(|p| {
                p.annotations.insert("big".into(), "a".repeat(600 * 1024));
            }),
            "config.annotations",
        ),
        (
            Box::new(|p| {
                p.labels.insert("big".into(), "v".repeat(5000));
            }),
            "config.labels[big]",
        ),
        (
            Box::new(|p| p.linux.as_mut().unwrap().cgroup_parent = "/kubepods/../..".into()),
            "config.linux.cgroup_parent",
        ),
        (
            Box::new(|p| {
                p.port_mappings.push(v1::PortMapping {
                    protocol: v1::Protocol::Tcp as i32,
                    container_port: 80,
                    host_port: 70000,
                    host_ip: String::new(),
                })
            }),
            "config.port_mappings[0].host_port",
        ),
        (
            Box::new(|p| {
                p.dns_config = Some(v1::DnsConfig {
                    searches: vec!["svc\nnameserver 6.6.6.6".into()],
                    ..Default::default()
                })
            }),
            "config.dns_config.searches[0]",
        ),
    ];
    for (i, (edit, want)) in cases.into_iter().enumerate() {
        let mut config = pod(&format!("bad-{i}"), logs.path());
        edit(&mut config);
        let err = cri::run_pod(&bed.remora, &config).await.expect_err(want);
        assert_eq!(err.code(), Code::InvalidArgument, "{want}: {err:?}");
        assert!(err.message().contains(want), "{want}: {}", err.message());
        assert!(
            err.message().len() < 1024,
            "a huge value is not echoed back: {} bytes",
            err.message().len()
        );
    }

    let listed = bed
        .remora
        .runtime()
        .list_pod_sandbox(v1::ListPodSandboxRequest::default())
        .await
        .expect("list")
        .into_inner()
        .items;
    assert!(listed.is_empty(), "{listed:?}");
    assert!(bed.ctr_ids(&["containers", "ls", "-q"]).is_empty());
    assert_eq!(non_layer_snapshots(&bed), Vec::<String>::new());
    assert_eq!(creation_leases(&bed), Vec::<String>::new());
    let state = state_dir(&bed);
    assert_eq!(entries(&state.join("netns")), Vec::<String>::new());
    assert_eq!(entries(&state.join("sandboxes")), Vec::<String>::new());

    // The limits are not stricter than they say: at each limit, with a namespaced sysctl, a
    // pod runs (and its name was not held by the refusals above).
    let mut ok = pod(&"n".repeat(253), logs.path());
    ok.metadata.as_mut().unwrap().uid = "u".repeat(253);
    ok.hostname = "h".repeat(64);
    sysctl("kernel.shm_rmid_forced")(&mut ok);
    sysctl("net.ipv4.ip_unprivileged_port_start")(&mut ok);
    ok.annotations.insert("big".into(), "a".repeat(400 * 1024));
    ok.labels.insert("big".into(), "v".repeat(4000));
    let id = cri::run_pod(&bed.remora, &ok)
        .await
        .expect("a pod at the limits runs");
    let mut again = pod("bad-0", logs.path());
    again.metadata.as_mut().unwrap().uid = "uid-bad-0".into();
    let id2 = cri::run_pod(&bed.remora, &again)
        .await
        .expect("a refused pod's name is free");
    cri::remove_pod(&bed.remora, &id).await;
    cri::remove_pod(&bed.remora, &id2).await;
}

type ContainerEdit = Box<dyn FnOnce(&mut v1::ContainerConfig)>;

fn resources(f: fn(&mut v1::LinuxContainerResources)) -> ContainerEdit {
    Box::new(move |c| {
        f(c.linux
            .get_or_insert_with(Default::default)
            .resources
            .get_or_insert_with(Default::default))
    })
}

fn mount(container_path: &'static str, host_path: impl Into<String>) -> ContainerEdit {
    let host_path = host_path.into();
    Box::new(move |c| {
        c.mounts.push(v1::Mount {
            container_path: container_path.into(),
            host_path,
            ..Default::default()
        })
    })
}

#[tokio::test]
async fn rejected_containers_are_invalid_argument_and_leave_nothing_behind() {
    let bed = BedRemora::start_with_network();
    let logs = crate::harness::scratch();
    cri::pull(&bed.remora, "busybox")
        .await
        .expect("pull busybox");
    let pod_config = pod("containers", logs.path());
    let pod_id = cri::run_pod(&bed.remora, &pod_config).await.expect("pod");
    let snapshots_before = non_layer_snapshots(&bed);
    // Bind sources of refused mounts: none may be created.
    let host_dir = crate::harness::scratch();
    let source = |name: &str| host_dir.path().join(name).display().to_string();
    let escape = logs.path().parent().expect("parent").join("escape.log");

    let cases: Vec<(ContainerEdit, &str)> = vec![
        (
            Box::new(|c| c.log_path = "/etc/remora-it-escape.log".into()),
            "config.log_path",
        ),
        (
            Box::new(|c| c.log_path = "../escape.log".into()),
            "config.log_path",
        ),
        (mount("data", "/tmp"), "config.mounts[0].container_path"),
        (
            mount("/data/../../etc", source("dotdot")),
            "config.mounts[0].container_path",
        ),
        (
            mount("/", source("root")),
            "config.mounts[0].container_path",
        ),
        (
            resources(|r| r.cpu_shares = -1),
            "config.linux.resources.cpu_shares",
        ),
        (mount("/data", "relative/dir"), "config.mounts[0].host_path"),
        (mount("/data", "/tmp/x\0y"), "config.mounts[0].host_path"),
        (
            Box::new({
                let m = mount("/data", source("negative"));
                move |c| {
                    m(c);
                    c.linux.get_or_insert_with(Default::default).resources =
                        Some(v1::LinuxContainerResources {
                            cpu_shares: -2,
                            ..Default::default()
                        });
                }
            }),
            "config.linux.resources.cpu_shares",
        ),
        (
            resources(|r| r.cpu_quota = -5),
            "config.linux.resources.cpu_quota",
        ),
        (
            resources(|r| r.cpu_period = -1),
            "config.linux.resources.cpu_period",
        ),
        (
            resources(|r| r.memory_limit_in_bytes = -1),
            "config.linux.resources.memory_limit_in_bytes",
        ),
        (
            resources(|r| r.oom_score_adj = 1001),
            "config.linux.resources.oom_score_adj",
        ),
        (
            resources(|r| r.oom_score_adj = -1001),
            "config.linux.resources.oom_score_adj",
        ),
        (
            Box::new(|c| {
                c.envs.push(v1::KeyValue {
                    key: "A=B".into(),
                    value: "c".into(),
                })
            }),
            "config.envs[0].key",
        ),
        // Bytes on the wire (cri-api v0.34.10+): decoded, then refused naming the field and key.
        (
            Box::new(|c| {
                c.envs.push(v1::KeyValue {
                    key: "RAW".into(),
                    value: vec![b'x', 0xff],
                })
            }),
            "config.envs[0].value (env \"RAW\")",
        ),
        (
            Box::new(|c| c.command[0] = "sleep\0".into()),
            "config.command[0]",
        ),
        (
            Box::new(|c| c.working_dir = "relative".into()),
            "config.working_dir",
        ),
        (
            Box::new(|c| c.metadata.as_mut().unwrap().name = "a/b".into()),
            "config.metadata.name",
        ),
        (
            Box::new(|c| c.metadata.as_mut().unwrap().name = "c".repeat(254)),
            "config.metadata.name",
        ),
    ];
    let mut rt = bed.remora.runtime();
    for (i, (edit, want)) in cases.into_iter().enumerate() {
        let mut c = container(&format!("bad-{i}"));
        edit(&mut c);
        let err = cri::create(&bed.remora, &pod_id, &pod_config, c)
            .await
            .expect_err(want);
        assert_eq!(err.code(), Code::InvalidArgument, "{want}: {err:?}");
        assert!(err.message().contains(want), "{want}: {}", err.message());
    }
    // The pod config the request carries is checked too (the log file is built from it).
    let mut relative_logs = pod_config.clone();
    relative_logs.log_directory = "relative/logs".into();
    let err = cri::create(&bed.remora, &pod_id, &relative_logs, container("logs"))
        .await
        .expect_err("relative log directory");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("sandbox_config.log_directory"),
        "{}",
        err.message()
    );

    assert_eq!(
        bed.ctr_ids(&["containers", "ls", "-q"]),
        vec![pod_id.clone()],
        "only the pause container"
    );
    assert_eq!(non_layer_snapshots(&bed), snapshots_before);
    assert_eq!(creation_leases(&bed), Vec::<String>::new());
    assert!(!escape.exists(), "no log file outside the log directory");
    assert!(!Path::new("/etc/remora-it-escape.log").exists());
    assert_eq!(entries(host_dir.path()), Vec::<String>::new());
    let listed = rt
        .list_containers(v1::ListContainersRequest::default())
        .await
        .expect("list")
        .into_inner()
        .containers;
    assert!(listed.is_empty(), "{listed:?}");

    // The names of refused containers are free, and values at the limits are accepted.
    let mut ok = container("bad-0");
    ok.mounts.push(v1::Mount {
        container_path: "/data/./sub/".into(),
        host_path: host_dir.path().join("made").display().to_string(),
        ..Default::default()
    });
    ok.linux = Some(v1::LinuxContainerConfig {
        resources: Some(v1::LinuxContainerResources {
            oom_score_adj: 1000,
            ..Default::default()
        }),
        ..Default::default()
    });
    let id = cri::create(&bed.remora, &pod_id, &pod_config, ok)
        .await
        .expect("a container at the limits is created");
    assert!(host_dir.path().join("made").is_dir(), "bind source made");
    rt.remove_container(v1::RemoveContainerRequest { container_id: id })
        .await
        .expect("remove");
    cri::remove_pod(&bed.remora, &pod_id).await;
}

#[tokio::test]
async fn unknown_and_malformed_ids_are_not_found_but_stop_and_remove_succeed() {
    let bed = BedRemora::start();
    let mut rt = bed.remora.runtime();
    let state = state_dir(&bed);
    let before = entries(&state);
    for id in [
        "0".repeat(64),
        "../../etc".into(),
        "a/b".into(),
        "..".into(),
        "x\0y".into(),
        "z".repeat(10_000),
    ] {
        let shown = &id[..id.len().min(20)];
        let not_found = |what: &str, r: Result<(), tonic::Status>| {
            let err = r.expect_err(what);
            assert_eq!(err.code(), Code::NotFound, "{what} {shown:?}: {err:?}");
        };
        not_found(
            "PodSandboxStatus",
            rt.pod_sandbox_status(v1::PodSandboxStatusRequest {
                pod_sandbox_id: id.clone(),
                verbose: true,
            })
            .await
            .map(|_| ()),
        );
        not_found(
            "CreateContainer in an unknown pod",
            rt.create_container(v1::CreateContainerRequest {
                pod_sandbox_id: id.clone(),
                config: Some(container("orphan")),
                sandbox_config: Some(pod("orphan", Path::new("/var/log/pods/x"))),
            })
            .await
            .map(|_| ()),
        );
        not_found(
            "ContainerStatus",
            rt.container_status(v1::ContainerStatusRequest {
                container_id: id.clone(),
                verbose: true,
            })
            .await
            .map(|_| ()),
        );
        not_found(
            "StartContainer",
            rt.start_container(v1::StartContainerRequest {
                container_id: id.clone(),
            })
            .await
            .map(|_| ()),
        );
        not_found(
            "ExecSync",
            rt.exec_sync(v1::ExecSyncRequest {
                container_id: id.clone(),
                cmd: vec!["true".into()],
                timeout: 1,
            })
            .await
            .map(|_| ()),
        );
        not_found(
            "ContainerStats",
            rt.container_stats(v1::ContainerStatsRequest {
                container_id: id.clone(),
            })
            .await
            .map(|_| ()),
        );
        not_found(
            "UpdateContainerResources",
            rt.update_container_resources(v1::UpdateContainerResourcesRequest {
                container_id: id.clone(),
                linux: Some(v1::LinuxContainerResources {
                    cpu_shares: 512,
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .map(|_| ()),
        );
        not_found(
            "ReopenContainerLog",
            rt.reopen_container_log(v1::ReopenContainerLogRequest {
                container_id: id.clone(),
            })
            .await
            .map(|_| ()),
        );
        // critest's idempotence specs: stopping or removing what is not there succeeds.
        rt.stop_container(v1::StopContainerRequest {
            container_id: id.clone(),
            timeout: 1,
        })
        .await
        .unwrap_or_else(|e| panic!("StopContainer {shown:?}: {e:?}"));
        rt.remove_container(v1::RemoveContainerRequest {
            container_id: id.clone(),
        })
        .await
        .unwrap_or_else(|e| panic!("RemoveContainer {shown:?}: {e:?}"));
        rt.stop_pod_sandbox(v1::StopPodSandboxRequest {
            pod_sandbox_id: id.clone(),
        })
        .await
        .unwrap_or_else(|e| panic!("StopPodSandbox {shown:?}: {e:?}"));
        rt.remove_pod_sandbox(v1::RemovePodSandboxRequest {
            pod_sandbox_id: id.clone(),
        })
        .await
        .unwrap_or_else(|e| panic!("RemovePodSandbox {shown:?}: {e:?}"));
    }
    // An empty id is a malformed request, not an unknown object.
    let err = rt
        .stop_container(v1::StopContainerRequest::default())
        .await
        .expect_err("empty id");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    let err = rt
        .pod_sandbox_status(v1::PodSandboxStatusRequest::default())
        .await
        .expect_err("empty id");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    // Nothing was made for any of those ids, in remora's dirs or in containerd.
    assert_eq!(entries(&state), before);
    assert!(bed.ctr_ids(&["containers", "ls", "-q"]).is_empty());
}

const NOBODY: &str = "remora-it-nobody";

/// A system user without a home or shell, made once (another test run may have made it).
fn ensure_unprivileged_user() {
    let exists = Command::new("id")
        .args(["-u", NOBODY])
        .output()
        .expect("run id")
        .status
        .success();
    if exists {
        return;
    }
    let out = Command::new("useradd")
        .args([
            "--system",
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
            NOBODY,
        ])
        .output()
        .expect("run useradd");
    // Exit code 9: created meanwhile by a concurrent run.
    assert!(
        out.status.success() || out.status.code() == Some(9),
        "useradd: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `args` as the unprivileged user.
fn as_nobody(args: &[&str]) -> std::process::Output {
    Command::new("runuser")
        .args(["-u", NOBODY, "--"])
        .args(args)
        .output()
        .expect("run runuser")
}

#[tokio::test]
async fn the_socket_refuses_users_other_than_root() {
    ensure_unprivileged_user();
    let bed = BedRemora::start();
    let socket = bed.remora.socket.clone();
    let dir = socket.parent().expect("socket dir");
    // The scratch dir is 0700: open it so the kernel's refusal can only come from the
    // socket's own mode, not from an untraversable parent.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");

    let meta = std::fs::symlink_metadata(&socket).expect("stat socket");
    use std::os::unix::fs::FileTypeExt;
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.mode() & 0o7777, 0o660, "socket mode");
    assert_eq!((meta.uid(), meta.gid()), (0, 0), "owned by root");

    let sock = socket.to_str().expect("utf-8 path");
    // The user reaches the socket (the dir is traversable)...
    let seen = as_nobody(&["test", "-S", sock]);
    assert!(seen.status.success(), "the user can see the socket");
    // ...but connecting is refused by the kernel.
    let connect = as_nobody(&[
        "/usr/bin/python3",
        "-c",
        "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])",
        sock,
    ]);
    let stderr = String::from_utf8_lossy(&connect.stderr);
    assert!(!connect.status.success(), "connect as {NOBODY} succeeded");
    assert!(
        stderr.contains("PermissionError") && stderr.contains("Permission denied"),
        "{stderr}"
    );
    let crictl = tool("crictl");
    let endpoint = format!("unix://{sock}");
    let out = as_nobody(&[
        crictl.to_str().expect("utf-8 path"),
        "--runtime-endpoint",
        &endpoint,
        "--timeout",
        "5s",
        "version",
    ]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "crictl as {NOBODY}: {text}");
    assert!(text.contains("permission denied"), "{text}");

    // Root connects.
    let v = bed
        .remora
        .runtime()
        .version(v1::VersionRequest::default())
        .await
        .expect("root connects")
        .into_inner();
    assert_eq!(v.runtime_name, "remora");
    let out = Command::new(&crictl)
        .args(["--runtime-endpoint", &endpoint, "version"])
        .output()
        .expect("crictl as root");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
