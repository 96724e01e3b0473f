//! The read side: store snapshots → CRI list items and statuses, and the List filters.

use crate::cri::v1;

use super::signal::signal_to_cri;
use super::{non_empty, unknown_enum, ConvertError};
use crate::signal::Signal;
use crate::spec::{MountPropagation, NamespaceMode};
use crate::store::{
    ContainerFilter, ContainerMetadata, ContainerSnapshot, ContainerState, LinuxResources,
    SandboxFilter, SandboxMetadata, SandboxSnapshot, SandboxState,
};

fn sandbox_state(state: SandboxState) -> v1::PodSandboxState {
    match state.cri_visible() {
        SandboxState::Ready => v1::PodSandboxState::SandboxReady,
        SandboxState::NotReady | SandboxState::Unknown => v1::PodSandboxState::SandboxNotready,
    }
}

pub(super) fn pod_sandbox_metadata(m: &SandboxMetadata) -> v1::PodSandboxMetadata {
    v1::PodSandboxMetadata {
        name: m.name.clone(),
        uid: m.uid.clone(),
        namespace: m.namespace.clone(),
        attempt: m.attempt,
    }
}

fn namespace_mode_to_cri(mode: NamespaceMode) -> v1::NamespaceMode {
    match mode {
        NamespaceMode::Pod => v1::NamespaceMode::Pod,
        NamespaceMode::Container => v1::NamespaceMode::Container,
        NamespaceMode::Node => v1::NamespaceMode::Node,
        NamespaceMode::Target => v1::NamespaceMode::Target,
    }
}

/// A sandbox as `ListPodSandbox` reports it. UNKNOWN is reported as NOTREADY.
pub fn pod_sandbox(s: &SandboxSnapshot) -> v1::PodSandbox {
    let m = &s.metadata;
    v1::PodSandbox {
        id: m.id.clone(),
        metadata: Some(pod_sandbox_metadata(m)),
        state: sandbox_state(s.status.state) as i32,
        created_at: m.created_at,
        labels: m.labels.clone(),
        annotations: m.annotations.clone(),
        runtime_handler: m.runtime_handler.clone(),
    }
}

/// A sandbox as `PodSandboxStatus` reports it: UNKNOWN as NOTREADY, `network` always present
/// (empty ip for host-network pods, as containerd), and the namespace modes under
/// `linux.namespaces.options`.
pub fn pod_sandbox_status(s: &SandboxSnapshot) -> v1::PodSandboxStatus {
    let m = &s.metadata;
    let ns = &m.namespace_options;
    v1::PodSandboxStatus {
        id: m.id.clone(),
        metadata: Some(pod_sandbox_metadata(m)),
        state: sandbox_state(s.status.state) as i32,
        created_at: m.created_at,
        network: Some(v1::PodSandboxNetworkStatus {
            ip: m.ip.clone(),
            additional_ips: m
                .additional_ips
                .iter()
                .map(|ip| v1::PodIp { ip: ip.clone() })
                .collect(),
        }),
        linux: Some(v1::LinuxPodSandboxStatus {
            namespaces: Some(v1::Namespace {
                options: Some(v1::NamespaceOption {
                    network: namespace_mode_to_cri(ns.network) as i32,
                    pid: namespace_mode_to_cri(ns.pid) as i32,
                    ipc: namespace_mode_to_cri(ns.ipc) as i32,
                    target_id: String::new(),
                    userns_options: None,
                }),
            }),
        }),
        labels: m.labels.clone(),
        annotations: m.annotations.clone(),
        runtime_handler: m.runtime_handler.clone(),
    }
}

/// `ListPodSandboxRequest.filter` → [`SandboxFilter`]. No filter, or empty fields, filter
/// nothing.
pub fn sandbox_filter(f: Option<&v1::PodSandboxFilter>) -> Result<SandboxFilter, ConvertError> {
    let Some(f) = f else {
        return Ok(SandboxFilter::default());
    };
    let state = match &f.state {
        None => None,
        Some(s) => Some(match v1::PodSandboxState::try_from(s.state) {
            Ok(v1::PodSandboxState::SandboxReady) => SandboxState::Ready,
            Ok(v1::PodSandboxState::SandboxNotready) => SandboxState::NotReady,
            Err(_) => return Err(unknown_enum("filter.state.state", s.state)),
        }),
    };
    Ok(SandboxFilter {
        id: non_empty(&f.id),
        state,
        label_selector: f.label_selector.clone(),
    })
}

pub(super) fn container_state_to_cri(state: ContainerState) -> v1::ContainerState {
    match state {
        ContainerState::Created => v1::ContainerState::ContainerCreated,
        ContainerState::Running => v1::ContainerState::ContainerRunning,
        ContainerState::Exited => v1::ContainerState::ContainerExited,
        ContainerState::Unknown => v1::ContainerState::ContainerUnknown,
    }
}

pub(super) fn propagation_to_cri(p: MountPropagation) -> v1::MountPropagation {
    match p {
        MountPropagation::Private => v1::MountPropagation::PropagationPrivate,
        MountPropagation::HostToContainer => v1::MountPropagation::PropagationHostToContainer,
        MountPropagation::Bidirectional => v1::MountPropagation::PropagationBidirectional,
    }
}

fn container_cri_metadata(m: &ContainerMetadata) -> v1::ContainerMetadata {
    v1::ContainerMetadata {
        name: m.name.clone(),
        attempt: m.attempt,
    }
}

/// The image as `ListContainers` reports it: as `CreateContainer` asked for it (kubelet asks
/// by image id), with the name the pod spec gave, as containerd's CRI does.
fn image_spec(m: &ContainerMetadata) -> v1::ImageSpec {
    v1::ImageSpec {
        image: m.image.requested.clone(),
        user_specified_image: m.image.user_specified.clone(),
        ..Default::default()
    }
}

/// The image as `ContainerStatus` reports it: the name the pod spec gave when the client sent
/// one (kubelet shows this as the container status's `image`, and its tests expect the spec's
/// name there, not the id it created the container with), as CRI-O does; otherwise as asked
/// for. containerd's CRI reports the image's first tag instead, which is a different name
/// whenever an image has several tags.
fn status_image_spec(m: &ContainerMetadata) -> v1::ImageSpec {
    let image = if m.image.user_specified.is_empty() {
        &m.image.requested
    } else {
        &m.image.user_specified
    };
    v1::ImageSpec {
        image: image.clone(),
        user_specified_image: m.image.user_specified.clone(),
        ..Default::default()
    }
}

/// A container as `ListContainers` reports it.
pub fn container(c: &ContainerSnapshot) -> v1::Container {
    let m = &c.metadata;
    v1::Container {
        id: m.id.clone(),
        pod_sandbox_id: m.sandbox_id.clone(),
        metadata: Some(container_cri_metadata(m)),
        image: Some(image_spec(m)),
        image_ref: m.image.reference.clone(),
        state: container_state_to_cri(c.status.state) as i32,
        created_at: c.status.created_at,
        labels: m.labels.clone(),
        annotations: m.annotations.clone(),
        image_id: m.image.id.clone(),
    }
}

/// Reason of an exited container whose status has none (containerd's `completeExitReason`
/// / `errorExitReason`); the store normally sets one when it records the exit.
fn exit_reason(exit_code: i32) -> &'static str {
    if exit_code == 0 {
        "Completed"
    } else {
        "Error"
    }
}

/// A container as `ContainerStatus` reports it, following containerd's
/// `toCRIContainerStatus`: `started_at` only once started (RUNNING, EXITED, UNKNOWN),
/// `finished_at` only once exited (EXITED, UNKNOWN), and an exited container always has a
/// reason; `user` is the identity the spec gave its first process; `stop_signal` the one it
/// is stopped with; `resources` what its spec applies ([`container_resources`]).
pub fn container_status(c: &ContainerSnapshot) -> v1::ContainerStatus {
    let m = &c.metadata;
    let s = &c.status;
    let (started_at, finished_at) = match s.state {
        ContainerState::Created => (0, 0),
        ContainerState::Running => (s.started_at, 0),
        ContainerState::Exited | ContainerState::Unknown => (s.started_at, s.finished_at),
    };
    let reason = if s.state == ContainerState::Exited && s.reason.is_empty() {
        exit_reason(s.exit_code).to_string()
    } else {
        s.reason.clone()
    };
    v1::ContainerStatus {
        id: m.id.clone(),
        metadata: Some(container_cri_metadata(m)),
        state: container_state_to_cri(s.state) as i32,
        created_at: s.created_at,
        started_at,
        finished_at,
        exit_code: s.exit_code,
        image: Some(status_image_spec(m)),
        image_ref: m.image.reference.clone(),
        reason,
        message: s.message.clone(),
        labels: m.labels.clone(),
        annotations: m.annotations.clone(),
        mounts: m
            .mounts
            .iter()
            .map(|mt| v1::Mount {
                container_path: mt.container_path.clone(),
                host_path: mt.host_path.clone(),
                readonly: mt.readonly,
                selinux_relabel: mt.selinux_relabel,
                propagation: propagation_to_cri(mt.propagation) as i32,
                recursive_read_only: mt.recursive_read_only,
                // An image volume: the image as resolved (its repo digest), as asked for, and
                // its id as PullImage answered it (`image_ref`, which critest compares with
                // PullImageResponse.image_ref; empty in a record from before remora kept it).
                image: (!mt.image.is_empty()).then(|| v1::ImageSpec {
                    image: mt.image_ref.clone(),
                    user_specified_image: mt.image.clone(),
                    image_ref: mt.image_id.clone(),
                    ..Default::default()
                }),
                image_sub_path: mt.image_sub_path.clone(),
                ..Default::default()
            })
            .collect(),
        log_path: m.log_path.clone(),
        resources: s.resources.as_ref().map(container_resources),
        image_id: m.image.id.clone(),
        user: m.user.as_ref().map(|u| v1::ContainerUser {
            linux: Some(v1::LinuxContainerUser {
                uid: i64::from(u.uid),
                gid: i64::from(u.gid),
                supplemental_groups: u
                    .supplemental_groups
                    .iter()
                    .map(|&g| i64::from(g))
                    .collect(),
            }),
        }),
        stop_signal: stop_signal_to_cri(&m.stop_signal) as i32,
    }
}

/// A container's recorded resources as `ContainerStatus.resources` reports them: exactly what
/// its spec sets, zero where it sets nothing, as containerd copies them from the spec. kubelet
/// reads a memory limit only when it is above zero and takes no memory request from the
/// runtime at all (it fills one from its own record when non-zero); a container that reports
/// no resources at all has every value filled from kubelet's record instead, a memory request
/// of 0 included, which its pod_resize checks see as `memory: 0` where none was asked for.
pub fn container_resources(r: &LinuxResources) -> v1::ContainerResources {
    v1::ContainerResources {
        linux: Some(v1::LinuxContainerResources {
            cpu_period: r.cpu_period,
            cpu_quota: r.cpu_quota,
            cpu_shares: r.cpu_shares,
            memory_limit_in_bytes: r.memory_limit_in_bytes,
            oom_score_adj: r.oom_score_adj,
            cpuset_cpus: r.cpuset_cpus.clone(),
            cpuset_mems: r.cpuset_mems.clone(),
            hugepage_limits: r
                .hugepage_limits
                .iter()
                .map(|h| v1::HugepageLimit {
                    page_size: h.page_size.clone(),
                    limit: h.limit,
                })
                .collect(),
            unified: r
                .unified
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            memory_swap_limit_in_bytes: r.memory_swap_limit_in_bytes,
        }),
        windows: None,
    }
}

/// The signal a container is stopped with, as `ContainerStatus.stop_signal` reports it (as
/// containerd 2.3 does: the configured one, else the image's, else SIGTERM; resolved at
/// creation). A record written before remora kept it says `SIGNAL_RUNTIME_DEFAULT`, the
/// runtime's default (the image's, else SIGTERM), as remora reported then: what StopContainer
/// sends it is looked up in the image, not in the record.
fn stop_signal_to_cri(stored: &str) -> v1::Signal {
    Signal::parse(stored).map_or(v1::Signal::RuntimeDefault, signal_to_cri)
}

/// `ListContainersRequest.filter` → [`ContainerFilter`]. No filter, or empty fields, filter
/// nothing.
pub fn container_filter(f: Option<&v1::ContainerFilter>) -> Result<ContainerFilter, ConvertError> {
    let Some(f) = f else {
        return Ok(ContainerFilter::default());
    };
    let state = match &f.state {
        None => None,
        Some(s) => Some(match v1::ContainerState::try_from(s.state) {
            Ok(v1::ContainerState::ContainerCreated) => ContainerState::Created,
            Ok(v1::ContainerState::ContainerRunning) => ContainerState::Running,
            Ok(v1::ContainerState::ContainerExited) => ContainerState::Exited,
            Ok(v1::ContainerState::ContainerUnknown) => ContainerState::Unknown,
            Err(_) => return Err(unknown_enum("filter.state.state", s.state)),
        }),
    };
    Ok(ContainerFilter {
        id: non_empty(&f.id),
        pod_sandbox_id: non_empty(&f.pod_sandbox_id),
        state,
        label_selector: f.label_selector.clone(),
    })
}
