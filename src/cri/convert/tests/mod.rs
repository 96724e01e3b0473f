//! Tests of the CRI conversions, split by the seams of the code: [`sandbox`] requests,
//! [`container`] requests, [`refusals`] (bad values named by their field) and [`status`] (the
//! read side). The fixtures here are what kubelet sends for an ordinary pod and container.

mod container;
mod refusals;
mod sandbox;
mod status;

use std::collections::HashMap;

use std::sync::Arc;

use crate::cri::v1;

use super::status::{container_state_to_cri, propagation_to_cri};
use super::*;
use crate::net::{DnsConfig, PortMapping, Protocol};
use crate::spec::{
    AppArmorProfile, BindOption, CapabilityChanges, ContainerConfig, DeviceRequest, HugepageLimit,
    MountPropagation, MountRequest, NamespaceMode, NamespaceOptions, Resources, SandboxConfig,
    SeccompProfile, SecurityContext, SupplementalGroupsPolicy,
};
use crate::store::{
    ContainerFilter, ContainerSnapshot, ContainerState, ContainerStatus, LinuxResources, PodRef,
    SandboxFilter, SandboxSnapshot, SandboxState, SandboxStatus,
};

fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn profile(t: v1::security_profile::ProfileType, r: &str) -> Option<v1::SecurityProfile> {
    Some(v1::SecurityProfile {
        profile_type: t as i32,
        localhost_ref: r.to_string(),
    })
}

/// A pod config as kubelet sends it for an ordinary pod with a cluster DNS and a host
/// port.
fn kubelet_pod() -> v1::PodSandboxConfig {
    v1::PodSandboxConfig {
        metadata: Some(v1::PodSandboxMetadata {
            name: "nginx-7c5ddbdf54-x2x4q".into(),
            uid: "0a1f63d6-8d2b-4e4e-9f5e-1d2b3c4d5e6f".into(),
            namespace: "default".into(),
            attempt: 1,
        }),
        hostname: "nginx-7c5ddbdf54-x2x4q".into(),
        log_directory: "/var/log/pods/default_nginx-7c5ddbdf54-x2x4q_0a1f63d6".into(),
        dns_config: Some(v1::DnsConfig {
            servers: vec!["10.96.0.10".into()],
            searches: vec![
                "default.svc.cluster.local".into(),
                "svc.cluster.local".into(),
                "cluster.local".into(),
            ],
            options: vec!["ndots:5".into()],
        }),
        port_mappings: vec![
            v1::PortMapping {
                protocol: v1::Protocol::Tcp as i32,
                container_port: 80,
                host_port: 8080,
                host_ip: String::new(),
            },
            v1::PortMapping {
                protocol: v1::Protocol::Udp as i32,
                container_port: 53,
                host_port: 0,
                host_ip: "127.0.0.1".into(),
            },
        ],
        labels: map(&[
            ("app", "nginx"),
            ("io.kubernetes.pod.name", "nginx-7c5ddbdf54-x2x4q"),
        ]),
        annotations: map(&[("kubernetes.io/config.source", "api")]),
        linux: Some(v1::LinuxPodSandboxConfig {
            cgroup_parent: "/kubepods/besteffort/pod0a1f63d6".into(),
            security_context: Some(v1::LinuxSandboxSecurityContext {
                namespace_options: Some(v1::NamespaceOption {
                    network: v1::NamespaceMode::Pod as i32,
                    pid: v1::NamespaceMode::Container as i32,
                    ipc: v1::NamespaceMode::Pod as i32,
                    ..Default::default()
                }),
                run_as_user: Some(v1::Int64Value { value: 65535 }),
                run_as_group: Some(v1::Int64Value { value: 65535 }),
                supplemental_groups: vec![2000],
                seccomp: profile(v1::security_profile::ProfileType::RuntimeDefault, ""),
                ..Default::default()
            }),
            sysctls: map(&[("net.ipv4.ip_unprivileged_port_start", "0")]),
            overhead: None,
            resources: None,
        }),
        windows: None,
    }
}

/// A container config as kubelet sends it (a ConfigMap volume, a service account token,
/// a termination log, resource limits, the restricted security profile).
fn kubelet_container() -> v1::ContainerConfig {
    use v1::security_profile::ProfileType;
    v1::ContainerConfig {
        metadata: Some(v1::ContainerMetadata {
            name: "nginx".into(),
            attempt: 2,
        }),
        image: Some(v1::ImageSpec {
            image: "docker.io/library/nginx:1.27".into(),
            user_specified_image: "nginx:1.27".into(),
            ..Default::default()
        }),
        command: vec!["/docker-entrypoint.sh".into()],
        args: vec!["nginx".into(), "-g".into(), "daemon off;".into()],
        working_dir: "/usr/share/nginx".into(),
        envs: vec![
            v1::KeyValue {
                key: "KUBERNETES_SERVICE_HOST".into(),
                value: "10.96.0.1".into(),
            },
            v1::KeyValue {
                key: "A".into(),
                value: "x=y".into(),
            },
        ],
        mounts: vec![
            v1::Mount {
                container_path: "/etc/nginx/conf.d".into(),
                host_path: "/var/lib/kubelet/pods/0a1f/volumes/kubernetes.io~configmap/conf".into(),
                readonly: true,
                ..Default::default()
            },
            v1::Mount {
                container_path: "/dev/termination-log".into(),
                host_path: "/var/lib/kubelet/pods/0a1f/containers/nginx/5c1e".into(),
                propagation: v1::MountPropagation::PropagationHostToContainer as i32,
                ..Default::default()
            },
        ],
        devices: vec![v1::Device {
            container_path: "/dev/fuse".into(),
            host_path: "/dev/fuse".into(),
            permissions: "rw".into(),
        }],
        labels: map(&[
            ("io.kubernetes.container.name", "nginx"),
            ("io.kubernetes.pod.name", "nginx-7c5ddbdf54-x2x4q"),
        ]),
        annotations: map(&[("io.kubernetes.container.hash", "8f2c1a")]),
        log_path: "nginx/2.log".into(),
        stdin: true,
        stdin_once: true,
        tty: false,
        linux: Some(v1::LinuxContainerConfig {
            resources: Some(v1::LinuxContainerResources {
                cpu_period: 100_000,
                cpu_quota: 50_000,
                cpu_shares: 512,
                memory_limit_in_bytes: 128 << 20,
                oom_score_adj: 1000,
                cpuset_cpus: "0-1".into(),
                cpuset_mems: "0".into(),
                hugepage_limits: vec![v1::HugepageLimit {
                    page_size: "2MB".into(),
                    limit: 0,
                }],
                unified: map(&[("memory.oom.group", "1")]),
                memory_swap_limit_in_bytes: 128 << 20,
            }),
            security_context: Some(v1::LinuxContainerSecurityContext {
                capabilities: Some(v1::Capability {
                    add_capabilities: vec!["NET_BIND_SERVICE".into()],
                    drop_capabilities: vec!["ALL".into()],
                    add_ambient_capabilities: vec![],
                }),
                namespace_options: Some(v1::NamespaceOption {
                    pid: v1::NamespaceMode::Container as i32,
                    ..Default::default()
                }),
                run_as_user: Some(v1::Int64Value { value: 101 }),
                run_as_group: Some(v1::Int64Value { value: 101 }),
                supplemental_groups: vec![2000, 3000],
                readonly_rootfs: true,
                no_new_privs: true,
                masked_paths: vec!["/proc/kcore".into()],
                readonly_paths: vec!["/proc/sys".into()],
                seccomp: profile(ProfileType::RuntimeDefault, ""),
                apparmor: profile(ProfileType::RuntimeDefault, ""),
                ..Default::default()
            }),
        }),
        windows: None,
        cdi_devices: vec![],
        stop_signal: v1::Signal::RuntimeDefault as i32,
    }
}

/// The container's Linux resources (the kubelet-like test configs have them).
fn resources_mut(c: &mut v1::ContainerConfig) -> &mut v1::LinuxContainerResources {
    c.linux.as_mut().unwrap().resources.as_mut().unwrap()
}
