//! remora's pods and containers as NRI sees them: [`pod_sandbox`] and [`container`] build the
//! `PodSandbox` and `Container` messages every NRI hook and a plugin's Synchronize carry, as
//! containerd's CRI plugin does (`internal/cri/nri/nri_api_linux.go`).
//!
//! Both are pure: no I/O, no containerd call. The caller passes
//! - the store's snapshot ([`SandboxSnapshot`], [`ContainerSnapshot`]): what CRI said and
//!   what remora recorded (ids, names, labels, annotations, state, times, pid, IPs);
//! - the OCI spec when it has one: for a container, the spec `CreateContainer` generates
//!   (in `lifecycle::container_create`, before it goes to containerd) or, later, the one
//!   stored as JSON in its containerd record (`ContainerRecord::spec`, read through the
//!   lifecycle backend's `Containers::get`); for a pod, its pause container's record the same
//!   way. A pod without a pause container has a record without a task, and a container whose
//!   record is gone has none: they get the store's fields only.
//!
//! What comes from where:
//! - A pod's namespaces are the ones its containers join, from the metadata, so a pod without
//!   a pause container gets its pinned IPC and UTS namespaces (`spec::namespaces::ipc_pin`,
//!   `uts_pin`), and a pod with one the pause process's `/proc/<pid>/ns/*` (an empty path
//!   while it has no pid: containerd's pause spec has none either). The network namespace is
//!   its bind mount, left out for host network or when there is none (containerd drops a
//!   network namespace without a path too).
//! - A pod's overhead and resources are the ones UpdatePodSandboxResources recorded
//!   ([`SandboxMetadata::updated_resources`]). The ones RunPodSandbox was given are only in
//!   the opaque CRI config JSON (`config_json`), which this module does not parse (it would
//!   bring CRI's protobuf types into the core): until remora records them at creation, a pod
//!   that was never updated has none.
//! - A container's labels and annotations are CRI's, over the spec's annotations when there
//!   is a spec (containerd merges the same way); its user is the spec's process user, else
//!   the one remora recorded ([`ContainerMetadata::user`]); its CDI devices and image are
//!   the record's.
//!
//! Left out, as remora sets none of them or keeps them elsewhere: a container's I/O priority,
//! scheduler, network devices, RDT, seccomp profile and policy; the resources' blockio and RDT
//! classes (containerd derives them from annotations remora does not support).
//!
//! [`SandboxMetadata::updated_resources`]: crate::store::SandboxMetadata::updated_resources
//! [`ContainerMetadata::user`]: crate::store::ContainerMetadata::user

use std::collections::HashMap;
use std::path::Path;

use oci_spec::runtime as oci;
use protobuf::MessageField;
use remora_nri::api;

use crate::spec::namespaces::{ipc_pin, userns_pin, uts_pin};
use crate::spec::NamespaceMode;
use crate::store::resources::LinuxResources as RecordedResources;
use crate::store::sandbox::SandboxMetadata;
use crate::store::status::ContainerState;
use crate::store::{ContainerSnapshot, SandboxSnapshot};

/// A pod as NRI sees it. `spec` is its pause container's OCI spec, if the caller has it: it
/// gives the pod's `linux.resources` and `linux.cgroups_path`.
pub fn pod_sandbox(pod: &SandboxSnapshot, spec: Option<&oci::Spec>) -> api::PodSandbox {
    let meta = &pod.metadata;
    let spec_linux = spec.and_then(|s| s.linux().as_ref());
    let updated = meta.updated_resources.as_ref();
    let linux = api::LinuxPodSandbox {
        pod_overhead: MessageField::from_option(
            updated
                .and_then(|r| r.overhead.as_ref())
                .map(recorded_resources),
        ),
        pod_resources: MessageField::from_option(
            updated
                .and_then(|r| r.resources.as_ref())
                .map(recorded_resources),
        ),
        cgroup_parent: meta.cgroup_parent.clone(),
        cgroups_path: spec_linux
            .and_then(|l| l.cgroups_path().as_ref())
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        namespaces: pod_namespaces(meta, pod.status.pid),
        resources: MessageField::from_option(
            spec_linux
                .and_then(|l| l.resources().as_ref())
                .map(oci_resources),
        ),
        ..Default::default()
    };
    let ips = if meta.ip.is_empty() {
        Vec::new()
    } else {
        std::iter::once(meta.ip.clone())
            .chain(meta.additional_ips.iter().cloned())
            .collect()
    };
    api::PodSandbox {
        id: meta.id.clone(),
        name: meta.name.clone(),
        uid: meta.uid.clone(),
        namespace: meta.namespace.clone(),
        labels: meta.labels.clone(),
        annotations: meta.annotations.clone(),
        runtime_handler: meta.runtime_handler.clone(),
        linux: MessageField::some(linux),
        pid: pod.status.pid,
        ips,
        ..Default::default()
    }
}

/// The namespaces a pod's containers join (the rules of `spec::namespaces::
/// container_namespaces`), with the paths remora knows for them.
fn pod_namespaces(meta: &SandboxMetadata, pid: u32) -> Vec<api::LinuxNamespace> {
    let opts = &meta.namespace_options;
    let netns = (!meta.netns_path.is_empty()).then(|| Path::new(&meta.netns_path));
    // A namespace of the pod's own: pinned beside the network namespace, or the pause
    // process's.
    let owned = |name: &str| -> String {
        if meta.pinned_namespaces {
            let pin = match name {
                "ipc" => netns.map(ipc_pin),
                _ => netns.map(uts_pin),
            };
            pin.map(|p| p.display().to_string()).unwrap_or_default()
        } else if pid > 0 {
            format!("/proc/{pid}/ns/{name}")
        } else {
            String::new()
        }
    };
    let mut out = Vec::new();
    // A pod without a pause container has no process to hold a user or PID namespace.
    if opts.user.is_some() && !meta.pinned_namespaces {
        let path = match netns {
            Some(n) => userns_pin(n).display().to_string(),
            None => owned("user"),
        };
        out.push(namespace("user", path));
    }
    if opts.network != NamespaceMode::Node {
        if let Some(n) = netns {
            out.push(namespace("network", n.display().to_string()));
        }
        // A host-network pod has the host's UTS namespace too (its hostname is the node's).
        out.push(namespace("uts", owned("uts")));
    }
    if opts.ipc != NamespaceMode::Node {
        out.push(namespace("ipc", owned("ipc")));
    }
    if opts.pid != NamespaceMode::Node && !meta.pinned_namespaces {
        out.push(namespace("pid", owned("pid")));
    }
    out
}

fn namespace(typ: &str, path: String) -> api::LinuxNamespace {
    api::LinuxNamespace {
        type_: typ.into(),
        path,
        ..Default::default()
    }
}

/// Recorded CRI `LinuxContainerResources` in NRI's form: what containerd's
/// `fromCRILinuxResources` sets (CPU, memory limit, hugepages, unified), and the swap limit
/// when one was recorded.
fn recorded_resources(r: &RecordedResources) -> api::LinuxResources {
    let memory = api::LinuxMemory {
        limit: opt_i64(Some(r.memory_limit_in_bytes)),
        swap: opt_i64((r.memory_swap_limit_in_bytes != 0).then_some(r.memory_swap_limit_in_bytes)),
        ..Default::default()
    };
    let cpu = api::LinuxCPU {
        // CRI's shares and period are never negative (kubelet sends u64-range values).
        shares: opt_u64(Some(r.cpu_shares.max(0) as u64)),
        quota: opt_i64(Some(r.cpu_quota)),
        period: opt_u64(Some(r.cpu_period.max(0) as u64)),
        cpus: r.cpuset_cpus.clone(),
        mems: r.cpuset_mems.clone(),
        ..Default::default()
    };
    api::LinuxResources {
        memory: MessageField::some(memory),
        cpu: MessageField::some(cpu),
        hugepage_limits: r
            .hugepage_limits
            .iter()
            .map(|h| api::HugepageLimit {
                page_size: h.page_size.clone(),
                limit: h.limit,
                ..Default::default()
            })
            .collect(),
        unified: r
            .unified
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        ..Default::default()
    }
}

/// A container as NRI sees it. `spec` is its OCI spec, if the caller has it (see the module
/// docs for where): without it the container has only what the store records.
pub fn container(ctr: &ContainerSnapshot, spec: Option<&oci::Spec>) -> api::Container {
    let meta = &ctr.metadata;
    let status = &ctr.status;
    let process = spec.and_then(|s| s.process().as_ref());
    let mut annotations: HashMap<String, String> = spec
        .and_then(|s| s.annotations().clone())
        .unwrap_or_default();
    annotations.extend(meta.annotations.iter().map(|(k, v)| (k.clone(), v.clone())));
    let user = match process {
        Some(p) => Some(api::User {
            uid: p.user().uid(),
            gid: p.user().gid(),
            additional_gids: p.user().additional_gids().clone().unwrap_or_default(),
            ..Default::default()
        }),
        None => meta.user.as_ref().map(|u| api::User {
            uid: u.uid,
            gid: u.gid,
            additional_gids: u.supplemental_groups.clone(),
            ..Default::default()
        }),
    };
    api::Container {
        id: meta.id.clone(),
        pod_sandbox_id: meta.sandbox_id.clone(),
        name: meta.name.clone(),
        state: container_state(status.state).into(),
        labels: meta.labels.clone(),
        annotations,
        args: process.and_then(|p| p.args().clone()).unwrap_or_default(),
        env: process.and_then(|p| p.env().clone()).unwrap_or_default(),
        mounts: spec
            .and_then(|s| s.mounts().as_ref())
            .map(|m| m.iter().map(mount).collect())
            .unwrap_or_default(),
        hooks: MessageField::from_option(spec.and_then(|s| s.hooks().as_ref()).map(hooks)),
        linux: MessageField::from_option(spec.map(linux_container)),
        pid: status.pid,
        rlimits: process
            .and_then(|p| p.rlimits().as_ref())
            .map(|r| r.iter().map(rlimit).collect())
            .unwrap_or_default(),
        created_at: status.created_at,
        started_at: status.started_at,
        finished_at: status.finished_at,
        exit_code: status.exit_code,
        status_reason: status.reason.clone(),
        status_message: status.message.clone(),
        CDI_devices: meta
            .cdi_devices
            .iter()
            .map(|name| api::CDIDevice {
                name: name.clone(),
                ..Default::default()
            })
            .collect(),
        user: MessageField::from_option(user),
        image: MessageField::some(image(&meta.image)),
        ..Default::default()
    }
}

/// remora's state in NRI's terms. NRI's STOPPED is CRI's EXITED; remora never pauses a
/// container, so PAUSED has no source.
pub fn container_state(state: ContainerState) -> api::ContainerState {
    match state {
        ContainerState::Created => api::ContainerState::CONTAINER_CREATED,
        ContainerState::Running => api::ContainerState::CONTAINER_RUNNING,
        ContainerState::Exited => api::ContainerState::CONTAINER_STOPPED,
        ContainerState::Unknown => api::ContainerState::CONTAINER_UNKNOWN,
    }
}

/// NRI's image: a reference (the one the pod spec names, else the resolved one, else what
/// kubelet sent), the digest of the resolved reference, the config digest (remora's image id).
fn image(refs: &crate::store::container::ImageRefs) -> api::Image {
    let name = [&refs.user_specified, &refs.reference, &refs.requested]
        .into_iter()
        .find(|s| !s.is_empty())
        .cloned()
        .unwrap_or_default();
    let digest = refs
        .reference
        .split_once('@')
        .map(|(_, d)| d.to_string())
        .unwrap_or_default();
    api::Image {
        name,
        digest,
        config_digest: refs.id.clone(),
        ..Default::default()
    }
}

fn mount(m: &oci::Mount) -> api::Mount {
    api::Mount {
        destination: m.destination().display().to_string(),
        type_: m.typ().clone().unwrap_or_default(),
        source: m
            .source()
            .as_ref()
            .map(|s| s.display().to_string())
            .unwrap_or_default(),
        options: m.options().clone().unwrap_or_default(),
        ..Default::default()
    }
}

fn hooks(h: &oci::Hooks) -> api::Hooks {
    let list = |l: &Option<Vec<oci::Hook>>| -> Vec<api::Hook> {
        l.as_ref()
            .map(|l| l.iter().map(hook).collect())
            .unwrap_or_default()
    };
    #[allow(deprecated)] // prestart: deprecated in the OCI spec, still run by runc.
    let prestart = list(h.prestart());
    api::Hooks {
        prestart,
        create_runtime: list(h.create_runtime()),
        create_container: list(h.create_container()),
        start_container: list(h.start_container()),
        poststart: list(h.poststart()),
        poststop: list(h.poststop()),
        ..Default::default()
    }
}

fn hook(h: &oci::Hook) -> api::Hook {
    api::Hook {
        path: h.path().display().to_string(),
        args: h.args().clone().unwrap_or_default(),
        env: h.env().clone().unwrap_or_default(),
        timeout: MessageField::from_option(h.timeout().map(|value| api::OptionalInt {
            value,
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn rlimit(r: &oci::PosixRlimit) -> api::POSIXRlimit {
    api::POSIXRlimit {
        // `RLIMIT_NOFILE` and the like, as the OCI spec and NRI spell them.
        type_: r.typ().to_string(),
        hard: r.hard(),
        soft: r.soft(),
        ..Default::default()
    }
}

fn linux_container(spec: &oci::Spec) -> api::LinuxContainer {
    let linux = spec.linux().as_ref();
    api::LinuxContainer {
        namespaces: linux
            .and_then(|l| l.namespaces().as_ref())
            .map(|n| {
                n.iter()
                    .map(|ns| {
                        let path = ns.path().as_ref().map(|p| p.display().to_string());
                        namespace(namespace_type(ns.typ()), path.unwrap_or_default())
                    })
                    .collect()
            })
            .unwrap_or_default(),
        devices: linux
            .and_then(|l| l.devices().as_ref())
            .map(|d| d.iter().map(device).collect())
            .unwrap_or_default(),
        resources: MessageField::from_option(
            linux
                .and_then(|l| l.resources().as_ref())
                .map(oci_resources),
        ),
        oom_score_adj: MessageField::from_option(
            spec.process()
                .as_ref()
                .and_then(|p| p.oom_score_adj())
                .map(|v| api::OptionalInt {
                    value: i64::from(v),
                    ..Default::default()
                }),
        ),
        cgroups_path: linux
            .and_then(|l| l.cgroups_path().as_ref())
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        sysctl: linux.and_then(|l| l.sysctl().clone()).unwrap_or_default(),
        ..Default::default()
    }
}

/// The OCI spec's names (`config-linux.md`), which NRI uses; oci-spec's `Display` writes the
/// `/proc/<pid>/ns` names (`net`, `mnt`) instead.
fn namespace_type(t: oci::LinuxNamespaceType) -> &'static str {
    match t {
        oci::LinuxNamespaceType::Mount => "mount",
        oci::LinuxNamespaceType::Cgroup => "cgroup",
        oci::LinuxNamespaceType::Uts => "uts",
        oci::LinuxNamespaceType::Ipc => "ipc",
        oci::LinuxNamespaceType::User => "user",
        oci::LinuxNamespaceType::Pid => "pid",
        oci::LinuxNamespaceType::Network => "network",
        oci::LinuxNamespaceType::Time => "time",
    }
}

fn device(d: &oci::LinuxDevice) -> api::LinuxDevice {
    api::LinuxDevice {
        path: d.path().display().to_string(),
        type_: d.typ().as_str().into(),
        major: d.major(),
        minor: d.minor(),
        file_mode: MessageField::from_option(d.file_mode().map(|value| api::OptionalFileMode {
            value,
            ..Default::default()
        })),
        uid: opt_u32(d.uid()),
        gid: opt_u32(d.gid()),
        ..Default::default()
    }
}

/// The spec's resources in NRI's form: memory, CPU, hugepages, unified, the device cgroup
/// rules and the PIDs limit, each field only when the spec sets it.
fn oci_resources(r: &oci::LinuxResources) -> api::LinuxResources {
    let memory = r.memory().as_ref().map(|m| api::LinuxMemory {
        limit: opt_i64(m.limit()),
        reservation: opt_i64(m.reservation()),
        swap: opt_i64(m.swap()),
        kernel: opt_i64(m.kernel()),
        kernel_tcp: opt_i64(m.kernel_tcp()),
        swappiness: opt_u64(m.swappiness()),
        disable_oom_killer: opt_bool(m.disable_oom_killer()),
        use_hierarchy: opt_bool(m.use_hierarchy()),
        ..Default::default()
    });
    let cpu = r.cpu().as_ref().map(|c| api::LinuxCPU {
        shares: opt_u64(c.shares()),
        quota: opt_i64(c.quota()),
        period: opt_u64(c.period()),
        realtime_runtime: opt_i64(c.realtime_runtime()),
        realtime_period: opt_u64(c.realtime_period()),
        cpus: c.cpus().clone().unwrap_or_default(),
        mems: c.mems().clone().unwrap_or_default(),
        ..Default::default()
    });
    api::LinuxResources {
        memory: MessageField::from_option(memory),
        cpu: MessageField::from_option(cpu),
        hugepage_limits: r
            .hugepage_limits()
            .as_ref()
            .map(|l| {
                l.iter()
                    .map(|h| api::HugepageLimit {
                        page_size: h.page_size().clone(),
                        // A limit in bytes; the OCI type is signed, NRI's is not.
                        limit: h.limit().max(0) as u64,
                        ..Default::default()
                    })
                    .collect()
            })
            .unwrap_or_default(),
        unified: r.unified().clone().unwrap_or_default(),
        devices: r
            .devices()
            .as_ref()
            .map(|d| d.iter().map(device_rule).collect())
            .unwrap_or_default(),
        pids: MessageField::from_option(r.pids().as_ref().map(|p| api::LinuxPids {
            limit: p.limit(),
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn device_rule(d: &oci::LinuxDeviceCgroup) -> api::LinuxDeviceCgroup {
    api::LinuxDeviceCgroup {
        allow: d.allow(),
        type_: d.typ().map(|t| t.as_str().to_string()).unwrap_or_default(),
        major: opt_i64(d.major()),
        minor: opt_i64(d.minor()),
        access: d.access().clone().unwrap_or_default(),
        ..Default::default()
    }
}

fn opt_i64(v: Option<i64>) -> MessageField<api::OptionalInt64> {
    MessageField::from_option(v.map(|value| api::OptionalInt64 {
        value,
        ..Default::default()
    }))
}

fn opt_u64(v: Option<u64>) -> MessageField<api::OptionalUInt64> {
    MessageField::from_option(v.map(|value| api::OptionalUInt64 {
        value,
        ..Default::default()
    }))
}

fn opt_u32(v: Option<u32>) -> MessageField<api::OptionalUInt32> {
    MessageField::from_option(v.map(|value| api::OptionalUInt32 {
        value,
        ..Default::default()
    }))
}

fn opt_bool(v: Option<bool>) -> MessageField<api::OptionalBool> {
    MessageField::from_option(v.map(|value| api::OptionalBool {
        value,
        ..Default::default()
    }))
}

#[cfg(test)]
mod tests;

/// CRI's container resources (an UpdateContainerResources request) as NRI's: what plugins see
/// in UpdateContainer. Zero is unset, as in CRI.
pub fn resources(r: &crate::spec::Resources) -> api::LinuxResources {
    let nonzero = |v: i64| (v != 0).then_some(v);
    let memory = api::LinuxMemory {
        limit: opt_i64(nonzero(r.memory_limit_in_bytes)),
        swap: opt_i64(nonzero(r.memory_swap_limit_in_bytes)),
        ..Default::default()
    };
    let cpu = api::LinuxCPU {
        shares: opt_u64(u64::try_from(r.cpu_shares).ok().filter(|v| *v != 0)),
        quota: opt_i64(nonzero(r.cpu_quota)),
        period: opt_u64(u64::try_from(r.cpu_period).ok().filter(|v| *v != 0)),
        cpus: r.cpuset_cpus.clone(),
        mems: r.cpuset_mems.clone(),
        ..Default::default()
    };
    api::LinuxResources {
        memory: MessageField::some(memory),
        cpu: MessageField::some(cpu),
        hugepage_limits: r
            .hugepage_limits
            .iter()
            .map(|h| api::HugepageLimit {
                page_size: h.page_size.clone(),
                limit: h.limit,
                ..Default::default()
            })
            .collect(),
        unified: r.unified.clone(),
        pids: MessageField::from_option(r.pids_limit.map(|limit| api::LinuxPids {
            limit,
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// `base` with what NRI's `r` sets (the merged result of plugins' updates): a field `r` leaves
/// unset keeps `base`'s value. Values beyond CRI's range (a share or period above `i64::MAX`)
/// are clamped.
pub fn resources_onto(
    base: &crate::spec::Resources,
    r: &api::LinuxResources,
) -> crate::spec::Resources {
    let mut out = base.clone();
    let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    if let Some(m) = r.memory.as_ref() {
        if let Some(v) = m.limit.as_ref() {
            out.memory_limit_in_bytes = v.value;
        }
        if let Some(v) = m.swap.as_ref() {
            out.memory_swap_limit_in_bytes = v.value;
        }
    }
    if let Some(c) = r.cpu.as_ref() {
        if let Some(v) = c.shares.as_ref() {
            out.cpu_shares = clamp(v.value);
        }
        if let Some(v) = c.quota.as_ref() {
            out.cpu_quota = v.value;
        }
        if let Some(v) = c.period.as_ref() {
            out.cpu_period = clamp(v.value);
        }
        if !c.cpus.is_empty() {
            out.cpuset_cpus = c.cpus.clone();
        }
        if !c.mems.is_empty() {
            out.cpuset_mems = c.mems.clone();
        }
    }
    for h in &r.hugepage_limits {
        match out
            .hugepage_limits
            .iter_mut()
            .find(|l| l.page_size == h.page_size)
        {
            Some(l) => l.limit = h.limit,
            None => out.hugepage_limits.push(crate::spec::HugepageLimit {
                page_size: h.page_size.clone(),
                limit: h.limit,
            }),
        }
    }
    for (k, v) in &r.unified {
        out.unified.insert(k.clone(), v.clone());
    }
    if let Some(p) = r.pids.as_ref() {
        out.pids_limit = Some(p.limit);
    }
    out
}
