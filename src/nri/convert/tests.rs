use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use remora_nri::api;

use super::*;
use crate::spec::{NamespaceMode, NamespaceOptions};
use crate::store::container::{ContainerUser, ImageRefs};
use crate::store::resources::HugepageLimitRecord;
use crate::store::sandbox::{PodResources, SandboxStatus};
use crate::store::{ContainerMetadata, ContainerStatus, PodRef, SandboxMetadata};

/// A container record as the store's own tests make one (remora-core's `store::container`).
fn container_meta(id: &str, sandbox_id: &str, labels: &[(&str, &str)]) -> ContainerMetadata {
    ContainerMetadata {
        id: id.into(),
        sandbox_id: sandbox_id.into(),
        name: format!("name-{id}"),
        pod: PodRef {
            name: "web".into(),
            namespace: "default".into(),
            uid: "u1".into(),
        },
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    }
}

/// A sandbox record as the store's own tests make one (remora-core's `store::sandbox`).
fn sandbox_meta(id: &str, name: &str, labels: &[(&str, &str)]) -> SandboxMetadata {
    SandboxMetadata {
        id: id.into(),
        name: name.into(),
        namespace: "default".into(),
        uid: format!("uid-{name}"),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    }
}

fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn namespaces(list: &[api::LinuxNamespace]) -> Vec<(&str, &str)> {
    list.iter()
        .map(|n| (n.type_.as_str(), n.path.as_str()))
        .collect()
}

fn pod(meta: SandboxMetadata, status: SandboxStatus) -> SandboxSnapshot {
    SandboxSnapshot {
        metadata: Arc::new(meta),
        status,
    }
}

#[test]
fn a_pod_converts_field_by_field() {
    let mut meta = sandbox_meta("p1", "web", &[("app", "web")]);
    meta.annotations = map(&[("note", "x")]);
    meta.runtime_handler = "kata".into();
    meta.netns_path = "/run/remora/netns/p1".into();
    meta.ip = "10.0.0.5".into();
    meta.additional_ips = vec!["fd00::5".into()];
    meta.cgroup_parent = "/kubepods/burstable/pod-uid-web".into();
    meta.updated_resources = Some(PodResources {
        overhead: Some(RecordedResources {
            cpu_shares: 10,
            ..Default::default()
        }),
        resources: Some(RecordedResources {
            cpu_period: 100_000,
            cpu_quota: 50_000,
            cpu_shares: 512,
            memory_limit_in_bytes: 1 << 28,
            cpuset_cpus: "0-1".into(),
            hugepage_limits: vec![HugepageLimitRecord {
                page_size: "2MB".into(),
                limit: 1 << 21,
            }],
            unified: BTreeMap::from([("memory.high".into(), "1000".into())]),
            ..Default::default()
        }),
    });
    let got = pod_sandbox(&pod(meta, SandboxStatus::ready(42)), None);

    assert_eq!(got.id, "p1");
    assert_eq!(got.name, "web");
    assert_eq!(got.uid, "uid-web");
    assert_eq!(got.namespace, "default");
    assert_eq!(got.labels, map(&[("app", "web")]));
    assert_eq!(got.annotations, map(&[("note", "x")]));
    assert_eq!(got.runtime_handler, "kata");
    assert_eq!(got.pid, 42);
    assert_eq!(got.ips, ["10.0.0.5", "fd00::5"]);
    let linux = got.linux.as_ref().expect("linux");
    assert_eq!(linux.cgroup_parent, "/kubepods/burstable/pod-uid-web");
    assert_eq!(linux.cgroups_path, "", "no pause spec given");
    assert!(linux.resources.is_none(), "no pause spec given");
    assert_eq!(
        namespaces(&linux.namespaces),
        [
            ("network", "/run/remora/netns/p1"),
            ("uts", "/proc/42/ns/uts"),
            ("ipc", "/proc/42/ns/ipc"),
            ("pid", "/proc/42/ns/pid"),
        ]
    );
    assert_eq!(linux.pod_overhead.cpu.shares.value, 10);
    let r = linux.pod_resources.as_ref().expect("pod resources");
    assert_eq!(r.cpu.period.value, 100_000);
    assert_eq!(r.cpu.quota.value, 50_000);
    assert_eq!(r.cpu.shares.value, 512);
    assert_eq!(r.cpu.cpus, "0-1");
    assert_eq!(r.memory.limit.value, 1 << 28);
    assert!(r.memory.swap.is_none(), "no swap limit recorded");
    assert_eq!(r.hugepage_limits.len(), 1);
    assert_eq!(r.hugepage_limits[0].page_size, "2MB");
    assert_eq!(r.hugepage_limits[0].limit, 1 << 21);
    assert_eq!(r.unified, map(&[("memory.high", "1000")]));
}

#[test]
fn a_pod_without_a_pause_container_has_its_pinned_namespaces() {
    let mut meta = sandbox_meta("p2", "lean", &[]);
    meta.netns_path = "/run/remora/netns/p2".into();
    meta.pinned_namespaces = true;
    let got = pod_sandbox(&pod(meta, SandboxStatus::ready(0)), None);

    assert_eq!(got.pid, 0);
    assert_eq!(
        namespaces(&got.linux.namespaces),
        [
            ("network", "/run/remora/netns/p2"),
            ("uts", "/run/remora/netns/p2.uts"),
            ("ipc", "/run/remora/netns/p2.ipc"),
        ],
        "no PID namespace: a pod without a process has none of its own"
    );
    assert!(got.linux.pod_overhead.is_none());
    assert!(got.linux.pod_resources.is_none());
}

#[test]
fn a_host_namespace_pod_without_a_pid_lists_only_its_own_namespaces() {
    let mut meta = sandbox_meta("p3", "host", &[]);
    meta.namespace_options = NamespaceOptions {
        network: NamespaceMode::Node,
        ipc: NamespaceMode::Node,
        pid: NamespaceMode::Pod,
        user: None,
    };
    let stopped = SandboxStatus {
        pid: 0,
        ..SandboxStatus::default()
    };
    let got = pod_sandbox(&pod(meta, stopped), None);

    assert!(got.ips.is_empty());
    assert_eq!(
        namespaces(&got.linux.namespaces),
        [("pid", "")],
        "host network and IPC are left out; no pid, no /proc path"
    );
}

#[test]
fn a_pod_takes_cgroups_path_and_resources_from_its_pause_spec() {
    let spec = spec_from(serde_json::json!({
        "ociVersion": "1.1.0",
        "linux": {
            "cgroupsPath": "kubepods-pod1.slice:cri-containerd:p4",
            "resources": {"cpu": {"shares": 2}}
        }
    }));
    let got = pod_sandbox(
        &pod(sandbox_meta("p4", "w", &[]), SandboxStatus::ready(7)),
        Some(&spec),
    );
    assert_eq!(
        got.linux.cgroups_path,
        "kubepods-pod1.slice:cri-containerd:p4"
    );
    assert_eq!(got.linux.resources.cpu.shares.value, 2);
}

fn spec_from(v: serde_json::Value) -> oci::Spec {
    serde_json::from_value(v).expect("a valid OCI spec")
}

fn snapshot(meta: ContainerMetadata, status: ContainerStatus) -> ContainerSnapshot {
    ContainerSnapshot {
        metadata: Arc::new(meta),
        status,
    }
}

#[test]
fn each_container_state_maps() {
    for (state, want) in [
        (
            ContainerState::Created,
            api::ContainerState::CONTAINER_CREATED,
        ),
        (
            ContainerState::Running,
            api::ContainerState::CONTAINER_RUNNING,
        ),
        (
            ContainerState::Exited,
            api::ContainerState::CONTAINER_STOPPED,
        ),
        (
            ContainerState::Unknown,
            api::ContainerState::CONTAINER_UNKNOWN,
        ),
    ] {
        let status = ContainerStatus {
            state,
            ..Default::default()
        };
        let got = container(&snapshot(container_meta("c", "p", &[]), status), None);
        assert_eq!(got.state.enum_value(), Ok(want), "{state}");
    }
}

#[test]
fn a_container_without_a_spec_gets_the_record_fields_only() {
    let mut meta = container_meta("c1", "p1", &[("tier", "db")]);
    meta.annotations = map(&[("a", "1")]);
    meta.user = Some(ContainerUser {
        uid: 1000,
        gid: 100,
        supplemental_groups: vec![100, 5],
    });
    meta.cdi_devices = vec!["vendor.com/gpu=0".into()];
    meta.image = ImageRefs {
        requested: "sha256:cfg".into(),
        user_specified: "nginx:1.27".into(),
        id: "sha256:cfg".into(),
        reference: "docker.io/library/nginx@sha256:man".into(),
    };
    let status = ContainerStatus {
        state: ContainerState::Exited,
        pid: 0,
        created_at: 1,
        started_at: 2,
        finished_at: 3,
        exit_code: 137,
        reason: "OOMKilled".into(),
        message: "out of memory".into(),
        ..Default::default()
    };
    let got = container(&snapshot(meta, status), None);

    assert_eq!(got.id, "c1");
    assert_eq!(got.pod_sandbox_id, "p1");
    assert_eq!(got.name, "name-c1");
    assert_eq!(got.labels, map(&[("tier", "db")]));
    assert_eq!(got.annotations, map(&[("a", "1")]));
    assert_eq!((got.created_at, got.started_at, got.finished_at), (1, 2, 3));
    assert_eq!(got.exit_code, 137);
    assert_eq!(got.status_reason, "OOMKilled");
    assert_eq!(got.status_message, "out of memory");
    assert_eq!(got.pid, 0);
    assert_eq!(got.user.uid, 1000);
    assert_eq!(got.user.gid, 100);
    assert_eq!(got.user.additional_gids, [100, 5]);
    assert_eq!(got.CDI_devices.len(), 1);
    assert_eq!(got.CDI_devices[0].name, "vendor.com/gpu=0");
    assert_eq!(got.image.name, "nginx:1.27");
    assert_eq!(got.image.digest, "sha256:man");
    assert_eq!(got.image.config_digest, "sha256:cfg");
    assert!(got.args.is_empty() && got.env.is_empty() && got.mounts.is_empty());
    assert!(got.rlimits.is_empty());
    assert!(got.hooks.is_none(), "hooks only come from a spec");
    assert!(got.linux.is_none(), "linux only comes from a spec");
}

#[test]
fn a_container_with_a_spec_converts_it() {
    let spec = spec_from(serde_json::json!({
        "ociVersion": "1.1.0",
        "annotations": {"a": "from-spec", "io.kubernetes.cri.sandbox-id": "p1"},
        "process": {
            "cwd": "/",
            "args": ["nginx", "-g", "daemon off;"],
            "env": ["PATH=/usr/bin", "X=1"],
            "user": {"uid": 101, "gid": 101, "additionalGids": [101, 7]},
            "oomScoreAdj": 999,
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 512}]
        },
        "mounts": [
            {"destination": "/data", "type": "bind", "source": "/srv/data",
             "options": ["rbind", "ro"]},
            {"destination": "/proc", "type": "proc", "source": "proc"}
        ],
        "hooks": {
            "prestart": [{"path": "/bin/pre"}],
            "createRuntime": [{"path": "/bin/hook", "args": ["hook", "x"],
                               "env": ["K=V"], "timeout": 5}],
            "poststop": [{"path": "/bin/post"}]
        },
        "linux": {
            "cgroupsPath": "/kubepods/pod-uid/c1",
            "sysctl": {"net.ipv4.ip_forward": "1"},
            "namespaces": [
                {"type": "mount"},
                {"type": "network", "path": "/run/remora/netns/p1"},
                {"type": "pid", "path": "/proc/42/ns/pid"}
            ],
            "devices": [
                {"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229,
                 "fileMode": 438, "uid": 0, "gid": 0}
            ],
            "resources": {
                "devices": [
                    {"allow": false, "access": "rwm"},
                    {"allow": true, "type": "c", "major": 10, "minor": 229, "access": "rw"}
                ],
                "memory": {"limit": 268435456, "swap": 268435456, "swappiness": 0},
                "cpu": {"shares": 256, "quota": 20000, "period": 100000,
                        "cpus": "2", "mems": "0"},
                "pids": {"limit": 100},
                "hugepageLimits": [{"pageSize": "1GB", "limit": 1073741824}],
                "unified": {"memory.oom.group": "1"}
            }
        }
    }));
    let mut meta = container_meta("c1", "p1", &[]);
    meta.annotations = map(&[("a", "from-cri")]);
    // The spec's user wins over the recorded one (they are the same in practice).
    meta.user = Some(ContainerUser::default());
    let status = ContainerStatus {
        state: ContainerState::Running,
        pid: 4242,
        ..Default::default()
    };
    let got = container(&snapshot(meta, status), Some(&spec));

    assert_eq!(got.pid, 4242);
    assert_eq!(
        got.annotations,
        map(&[("a", "from-cri"), ("io.kubernetes.cri.sandbox-id", "p1")]),
        "CRI's annotations over the spec's"
    );
    assert_eq!(got.args, ["nginx", "-g", "daemon off;"]);
    assert_eq!(got.env, ["PATH=/usr/bin", "X=1"]);
    assert_eq!(got.user.uid, 101);
    assert_eq!(got.user.gid, 101);
    assert_eq!(got.user.additional_gids, [101, 7]);
    assert_eq!(got.rlimits.len(), 1);
    assert_eq!(
        (
            got.rlimits[0].type_.as_str(),
            got.rlimits[0].hard,
            got.rlimits[0].soft
        ),
        ("RLIMIT_NOFILE", 1024, 512)
    );

    assert_eq!(got.mounts.len(), 2);
    let m = &got.mounts[0];
    assert_eq!(
        (m.destination.as_str(), m.type_.as_str(), m.source.as_str()),
        ("/data", "bind", "/srv/data")
    );
    assert_eq!(m.options, ["rbind", "ro"]);
    assert!(got.mounts[1].options.is_empty());

    let hooks = got.hooks.as_ref().expect("hooks");
    assert_eq!(hooks.prestart.len(), 1);
    assert_eq!(hooks.prestart[0].path, "/bin/pre");
    assert!(hooks.prestart[0].timeout.is_none());
    let h = &hooks.create_runtime[0];
    assert_eq!(h.path, "/bin/hook");
    assert_eq!(h.args, ["hook", "x"]);
    assert_eq!(h.env, ["K=V"]);
    assert_eq!(h.timeout.value, 5);
    assert!(hooks.create_container.is_empty());
    assert_eq!(hooks.poststop[0].path, "/bin/post");

    let linux = got.linux.as_ref().expect("linux");
    assert_eq!(linux.cgroups_path, "/kubepods/pod-uid/c1");
    assert_eq!(linux.oom_score_adj.value, 999);
    assert_eq!(linux.sysctl, map(&[("net.ipv4.ip_forward", "1")]));
    assert_eq!(
        namespaces(&linux.namespaces),
        [
            ("mount", ""),
            ("network", "/run/remora/netns/p1"),
            ("pid", "/proc/42/ns/pid"),
        ]
    );
    let d = &linux.devices[0];
    assert_eq!(
        (d.path.as_str(), d.type_.as_str(), d.major, d.minor),
        ("/dev/fuse", "c", 10, 229)
    );
    assert_eq!(d.file_mode.value, 438);
    assert_eq!((d.uid.value, d.gid.value), (0, 0));

    let r = linux.resources.as_ref().expect("resources");
    assert_eq!(r.memory.limit.value, 268_435_456);
    assert_eq!(r.memory.swap.value, 268_435_456);
    assert_eq!(r.memory.swappiness.value, 0);
    assert!(r.memory.reservation.is_none(), "unset stays unset");
    assert_eq!(r.cpu.shares.value, 256);
    assert_eq!(r.cpu.quota.value, 20_000);
    assert_eq!(r.cpu.period.value, 100_000);
    assert!(r.cpu.realtime_runtime.is_none());
    assert_eq!((r.cpu.cpus.as_str(), r.cpu.mems.as_str()), ("2", "0"));
    assert_eq!(r.pids.limit, 100);
    assert_eq!(r.hugepage_limits[0].page_size, "1GB");
    assert_eq!(r.hugepage_limits[0].limit, 1 << 30);
    assert_eq!(r.unified, map(&[("memory.oom.group", "1")]));
    assert_eq!(r.devices.len(), 2);
    let (deny, allow) = (&r.devices[0], &r.devices[1]);
    assert!(!deny.allow);
    assert_eq!(deny.type_, "");
    assert!(deny.major.is_none() && deny.minor.is_none());
    assert_eq!(deny.access, "rwm");
    assert!(allow.allow);
    assert_eq!(allow.type_, "c");
    assert_eq!((allow.major.value, allow.minor.value), (10, 229));
    assert_eq!(allow.access, "rw");
}
