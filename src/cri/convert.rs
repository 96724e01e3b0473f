//! Pure mappings between the CRI v1 protobuf messages and remora's domain types.
//!
//! This is the only place (besides [`super::service`]) where `k8s_cri::v1` types meet the
//! core: requests are mapped into [`crate::spec`], [`crate::net`] and
//! [`crate::lifecycle`] inputs, and store snapshots ([`crate::store`]) are mapped back into
//! CRI statuses and list items. Nothing here does I/O.
//!
//! Contract: the comments of CRI's `api.proto`, and containerd's CRI plugin where they are
//! silent (`sandbox_run_linux.go`, `container_create_linux.go`, `helpers.go`). In
//! particular:
//!
//! - "0 / empty means not set" is kept: such fields are copied verbatim, and validation of
//!   values (negative resources, relative paths, ids) is left to the spec generator, which
//!   knows the rules. This module rejects only what it cannot represent: a missing required
//!   message, an enum value outside the proto's, and a feature the domain types have no room
//!   for (rather than silently dropping it — a dropped user namespace or recursive read-only
//!   mount would weaken isolation without anyone noticing).
//! - Seccomp and AppArmor: the typed `SecurityProfile` fields win over the deprecated string
//!   fields (`seccomp_profile_path`, `apparmor_profile`), as in containerd's
//!   `generateSeccompSecurityProfile` / `generateApparmorSecurityProfile`.
//!
//! Every [`ConvertError`] names the offending field by its CRI path relative to the request
//! (`config.metadata.name`, `config.mounts[2].propagation`); the caller maps it to gRPC
//! `INVALID_ARGUMENT`.

use std::path::{Path, PathBuf};

use k8s_cri::v1;
use thiserror::Error;

use crate::net::{DnsConfig, PortMapping, Protocol};
use crate::spec::{
    AppArmorProfile, NamespaceMode, NamespaceOptions, SandboxConfig, SeccompProfile,
    SecurityContext, SupplementalGroupsPolicy,
};
use crate::store::{SandboxFilter, SandboxMetadata, SandboxSnapshot, SandboxState};

/// A CRI request that cannot be mapped to domain types. Reported as `INVALID_ARGUMENT`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConvertError {
    /// A required field is absent or empty.
    #[error("{field} is required")]
    Missing {
        /// CRI path of the field, e.g. `config.metadata.name`.
        field: String,
    },
    /// An enum field holds a number the CRI proto does not define.
    #[error("{field} has unknown value {value}")]
    UnknownEnum {
        /// CRI path of the field.
        field: String,
        /// The number received.
        value: i32,
    },
    /// A field's value is malformed.
    #[error("invalid {field} {value:?}: {reason}")]
    Invalid {
        /// CRI path of the field.
        field: String,
        /// The value received.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The field asks for a feature remora does not implement.
    #[error("{field} is not supported by remora")]
    Unsupported {
        /// CRI path of the field.
        field: String,
    },
}

fn missing(field: impl Into<String>) -> ConvertError {
    ConvertError::Missing {
        field: field.into(),
    }
}

fn unsupported(field: impl Into<String>) -> ConvertError {
    ConvertError::Unsupported {
        field: field.into(),
    }
}

fn unknown_enum(field: impl Into<String>, value: i32) -> ConvertError {
    ConvertError::UnknownEnum {
        field: field.into(),
        value,
    }
}

/// `Some(field)` unless it is empty (CRI's "empty string means not set").
fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

// ---------------------------------------------------------------------------------------------
// Sandboxes: request side
// ---------------------------------------------------------------------------------------------

/// The pod's metadata, with name, namespace and uid required (CRI requires them to build a
/// unique sandbox name; containerd rejects a request without them).
fn sandbox_metadata_of(
    config: &v1::PodSandboxConfig,
) -> Result<&v1::PodSandboxMetadata, ConvertError> {
    let m = config
        .metadata
        .as_ref()
        .ok_or_else(|| missing("config.metadata"))?;
    for (value, field) in [
        (&m.name, "config.metadata.name"),
        (&m.namespace, "config.metadata.namespace"),
        (&m.uid, "config.metadata.uid"),
    ] {
        if value.is_empty() {
            return Err(missing(field));
        }
    }
    Ok(m)
}

/// `PodSandboxConfig` → the sandbox's spec inputs.
///
/// `metadata` with non-empty `name`, `namespace` and `uid` is required. Linux fields default
/// to CRI's zero values when `linux` or its `security_context` is absent (all namespaces POD,
/// seccomp unconfined, no AppArmor request). Labels, port mappings and DNS are not part of
/// the spec; see [`sandbox_metadata`], [`sandbox_port_mappings`] and [`sandbox_dns`].
pub fn sandbox_config(config: &v1::PodSandboxConfig) -> Result<SandboxConfig, ConvertError> {
    let m = sandbox_metadata_of(config)?;
    let linux = config.linux.as_ref();
    let security = match linux.and_then(|l| l.security_context.as_ref()) {
        Some(sc) => sandbox_security(sc, "config.linux.security_context")?,
        None => SecurityContext::default(),
    };
    Ok(SandboxConfig {
        name: m.name.clone(),
        namespace: m.namespace.clone(),
        uid: m.uid.clone(),
        hostname: config.hostname.clone(),
        log_directory: config.log_directory.clone(),
        cgroup_parent: linux.map(|l| l.cgroup_parent.clone()).unwrap_or_default(),
        sysctls: linux.map(|l| l.sysctls.clone()).unwrap_or_default(),
        annotations: config.annotations.clone(),
        security,
    })
}

/// The store metadata of a new sandbox, from its id, config and runtime handler.
///
/// Fills what the request says (metadata, labels, annotations, runtime handler, hostname, log
/// directory, namespace modes, cgroup parent); the caller fills what it creates:
/// `created_at`, `netns_path`, `ip`, `additional_ips` and `config_json`.
pub fn sandbox_metadata(
    id: &str,
    config: &v1::PodSandboxConfig,
    runtime_handler: &str,
) -> Result<SandboxMetadata, ConvertError> {
    let m = sandbox_metadata_of(config)?;
    let linux = config.linux.as_ref();
    let namespace_options = match linux
        .and_then(|l| l.security_context.as_ref())
        .and_then(|sc| sc.namespace_options.as_ref())
    {
        Some(ns) => namespace_options(ns, "config.linux.security_context.namespace_options")?,
        None => NamespaceOptions::default(),
    };
    Ok(SandboxMetadata {
        id: id.to_string(),
        name: m.name.clone(),
        namespace: m.namespace.clone(),
        uid: m.uid.clone(),
        attempt: m.attempt,
        labels: config.labels.clone(),
        annotations: config.annotations.clone(),
        runtime_handler: runtime_handler.to_string(),
        hostname: config.hostname.clone(),
        log_directory: config.log_directory.clone(),
        namespace_options,
        cgroup_parent: linux.map(|l| l.cgroup_parent.clone()).unwrap_or_default(),
        ..Default::default()
    })
}

/// The pod's DNS settings for its `/etc/resolv.conf`.
///
/// `None` — copy the host's resolv.conf — when `dns_config` is absent *or* has no servers,
/// searches and options, as containerd does (an empty `parseDNSOptions` result falls back to
/// the host file).
#[cfg(target_os = "linux")]
pub fn sandbox_dns(config: &v1::PodSandboxConfig) -> Option<crate::lifecycle::sandbox_files::Dns> {
    let d = config.dns_config.as_ref()?;
    if d.servers.is_empty() && d.searches.is_empty() && d.options.is_empty() {
        return None;
    }
    Some(crate::lifecycle::sandbox_files::Dns {
        servers: d.servers.clone(),
        searches: d.searches.clone(),
        options: d.options.clone(),
    })
}

/// The pod's DNS settings for the CNI `dns` capability: `Some` whenever `dns_config` is
/// present (containerd's `toCNIDNS`), even if empty.
pub fn sandbox_cni_dns(config: &v1::PodSandboxConfig) -> Option<DnsConfig> {
    config.dns_config.as_ref().map(|d| DnsConfig {
        servers: d.servers.clone(),
        searches: d.searches.clone(),
        options: d.options.clone(),
    })
}

/// The pod's port mappings, all of them in request order. Mappings without a host port
/// (`host_port <= 0`) are kept here; the network layer skips them, like containerd's
/// `toCNIPortMappings`.
pub fn sandbox_port_mappings(
    config: &v1::PodSandboxConfig,
) -> Result<Vec<PortMapping>, ConvertError> {
    config
        .port_mappings
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let protocol = match v1::Protocol::try_from(p.protocol) {
                Ok(v1::Protocol::Tcp) => Protocol::Tcp,
                Ok(v1::Protocol::Udp) => Protocol::Udp,
                Ok(v1::Protocol::Sctp) => Protocol::Sctp,
                Err(_) => {
                    return Err(unknown_enum(
                        format!("config.port_mappings[{i}].protocol"),
                        p.protocol,
                    ))
                }
            };
            Ok(PortMapping {
                host_port: p.host_port,
                container_port: p.container_port,
                protocol,
                host_ip: p.host_ip.clone(),
            })
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Security context
// ---------------------------------------------------------------------------------------------

fn namespace_mode(value: i32, field: String) -> Result<NamespaceMode, ConvertError> {
    Ok(match v1::NamespaceMode::try_from(value) {
        Ok(v1::NamespaceMode::Pod) => NamespaceMode::Pod,
        Ok(v1::NamespaceMode::Container) => NamespaceMode::Container,
        Ok(v1::NamespaceMode::Node) => NamespaceMode::Node,
        Ok(v1::NamespaceMode::Target) => NamespaceMode::Target,
        Err(_) => return Err(unknown_enum(field, value)),
    })
}

/// `NamespaceOption` → [`NamespaceOptions`]. `prefix` is the CRI path of the message.
///
/// A user namespace of the pod's own (`userns_options.mode == POD`) is refused: the spec
/// has no user namespace support, and running such a pod in the host user namespace would
/// give its root the host's root. `NODE` (or no `userns_options`) is the host namespace.
pub fn namespace_options(
    ns: &v1::NamespaceOption,
    prefix: &str,
) -> Result<NamespaceOptions, ConvertError> {
    if let Some(u) = &ns.userns_options {
        let field = format!("{prefix}.userns_options.mode");
        if namespace_mode(u.mode, field.clone())? != NamespaceMode::Node {
            return Err(unsupported(field));
        }
    }
    Ok(NamespaceOptions {
        network: namespace_mode(ns.network, format!("{prefix}.network"))?,
        pid: namespace_mode(ns.pid, format!("{prefix}.pid"))?,
        ipc: namespace_mode(ns.ipc, format!("{prefix}.ipc"))?,
    })
}

fn supplemental_groups_policy(
    value: i32,
    field: String,
) -> Result<SupplementalGroupsPolicy, ConvertError> {
    match v1::SupplementalGroupsPolicy::try_from(value) {
        Ok(v1::SupplementalGroupsPolicy::Merge) => Ok(SupplementalGroupsPolicy::Merge),
        Ok(v1::SupplementalGroupsPolicy::Strict) => Ok(SupplementalGroupsPolicy::Strict),
        Err(_) => Err(unknown_enum(field, value)),
    }
}

/// A security profile as requested: the typed `SecurityProfile` or the deprecated string,
/// normalised to one form.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Profile {
    RuntimeDefault,
    Unconfined,
    Localhost(String),
}

const PROFILE_RUNTIME_DEFAULT: &str = "runtime/default";
const PROFILE_DOCKER_DEFAULT: &str = "docker/default";
const PROFILE_UNCONFINED: &str = "unconfined";
const PROFILE_LOCALHOST_PREFIX: &str = "localhost/";

/// Resolves the typed profile (`typed`, at CRI path `typed_field`) against the deprecated
/// string (`legacy`, at `legacy_field`). `None` if neither asks for anything.
///
/// The typed field wins. A `Localhost` ref has a `localhost/` prefix trimmed (containerd
/// does too, "just in case") and must not be empty. The string form follows containerd's
/// `generateSecurityProfile`: `runtime/default` and `docker/default` are the runtime
/// default, `unconfined` is unconfined, `localhost/<ref>` is a node-local profile, and any
/// other non-empty string is an error.
fn resolve_profile(
    typed: Option<&v1::SecurityProfile>,
    typed_field: &str,
    legacy: &str,
    legacy_field: &str,
) -> Result<Option<Profile>, ConvertError> {
    use v1::security_profile::ProfileType;
    if let Some(sp) = typed {
        return Ok(Some(match ProfileType::try_from(sp.profile_type) {
            Ok(ProfileType::RuntimeDefault) => Profile::RuntimeDefault,
            Ok(ProfileType::Unconfined) => Profile::Unconfined,
            Ok(ProfileType::Localhost) => {
                let r = sp
                    .localhost_ref
                    .strip_prefix(PROFILE_LOCALHOST_PREFIX)
                    .unwrap_or(&sp.localhost_ref);
                if r.is_empty() {
                    return Err(missing(format!("{typed_field}.localhost_ref")));
                }
                Profile::Localhost(r.to_string())
            }
            Err(_) => {
                return Err(unknown_enum(
                    format!("{typed_field}.profile_type"),
                    sp.profile_type,
                ))
            }
        }));
    }
    Ok(match legacy {
        "" => None,
        PROFILE_RUNTIME_DEFAULT | PROFILE_DOCKER_DEFAULT => Some(Profile::RuntimeDefault),
        PROFILE_UNCONFINED => Some(Profile::Unconfined),
        other => match other.strip_prefix(PROFILE_LOCALHOST_PREFIX) {
            Some(r) if !r.is_empty() => Some(Profile::Localhost(r.to_string())),
            _ => return Err(ConvertError::Invalid {
                field: legacy_field.to_string(),
                value: other.to_string(),
                reason:
                    "expected runtime/default, docker/default, unconfined or localhost/<profile>",
            }),
        },
    })
}

/// Seccomp: nothing asked for is unconfined (CRI: "Default: "", which is identical with
/// unconfined"). A localhost profile must be an absolute path (CRI `localhost_ref`).
fn seccomp_profile(
    typed: Option<&v1::SecurityProfile>,
    legacy: &str,
    prefix: &str,
) -> Result<SeccompProfile, ConvertError> {
    let typed_field = format!("{prefix}.seccomp");
    let legacy_field = format!("{prefix}.seccomp_profile_path");
    Ok(
        match resolve_profile(typed, &typed_field, legacy, &legacy_field)? {
            None | Some(Profile::Unconfined) => SeccompProfile::Unconfined,
            Some(Profile::RuntimeDefault) => SeccompProfile::RuntimeDefault,
            Some(Profile::Localhost(path)) => {
                if !Path::new(&path).is_absolute() {
                    let field = if typed.is_some() {
                        format!("{typed_field}.localhost_ref")
                    } else {
                        legacy_field
                    };
                    return Err(ConvertError::Invalid {
                        field,
                        value: path,
                        reason: "a localhost seccomp profile must be an absolute path",
                    });
                }
                SeccompProfile::Localhost(PathBuf::from(path))
            }
        },
    )
}

/// AppArmor: `None` when nothing is asked for (the spec applies the default profile to
/// unprivileged containers, as containerd does).
fn apparmor_profile(
    typed: Option<&v1::SecurityProfile>,
    legacy: &str,
    prefix: &str,
) -> Result<Option<AppArmorProfile>, ConvertError> {
    Ok(resolve_profile(
        typed,
        &format!("{prefix}.apparmor"),
        legacy,
        &format!("{prefix}.apparmor_profile"),
    )?
    .map(|p| match p {
        Profile::RuntimeDefault => AppArmorProfile::RuntimeDefault,
        Profile::Unconfined => AppArmorProfile::Unconfined,
        Profile::Localhost(name) => AppArmorProfile::Localhost(name),
    }))
}

/// `LinuxSandboxSecurityContext` → [`SecurityContext`] (the fields a sandbox has).
/// `prefix` is the CRI path of the message.
pub fn sandbox_security(
    sc: &v1::LinuxSandboxSecurityContext,
    prefix: &str,
) -> Result<SecurityContext, ConvertError> {
    #[allow(deprecated)] // The deprecated string is still honoured when the typed field is unset.
    let seccomp_path = sc.seccomp_profile_path.as_str();
    Ok(SecurityContext {
        capabilities: None,
        privileged: sc.privileged,
        namespaces: match &sc.namespace_options {
            Some(ns) => namespace_options(ns, &format!("{prefix}.namespace_options"))?,
            None => NamespaceOptions::default(),
        },
        run_as_user: sc.run_as_user.as_ref().map(|v| v.value),
        run_as_username: String::new(),
        run_as_group: sc.run_as_group.as_ref().map(|v| v.value),
        supplemental_groups: sc.supplemental_groups.clone(),
        supplemental_groups_policy: supplemental_groups_policy(
            sc.supplemental_groups_policy,
            format!("{prefix}.supplemental_groups_policy"),
        )?,
        readonly_rootfs: sc.readonly_rootfs,
        no_new_privs: false,
        seccomp: seccomp_profile(sc.seccomp.as_ref(), seccomp_path, prefix)?,
        apparmor: apparmor_profile(sc.apparmor.as_ref(), "", prefix)?,
        masked_paths: None,
        readonly_paths: None,
    })
}

// ---------------------------------------------------------------------------------------------
// Sandboxes: response side
// ---------------------------------------------------------------------------------------------

fn sandbox_state(state: SandboxState) -> v1::PodSandboxState {
    match state.cri_visible() {
        SandboxState::Ready => v1::PodSandboxState::SandboxReady,
        SandboxState::NotReady | SandboxState::Unknown => v1::PodSandboxState::SandboxNotready,
    }
}

fn pod_sandbox_metadata(m: &SandboxMetadata) -> v1::PodSandboxMetadata {
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use super::*;
    use crate::store::SandboxStatus;

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
    fn sandbox_unknown_enums_and_pod_userns_are_rejected() {
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

        let mut pod = kubelet_pod();
        let sc = pod
            .linux
            .as_mut()
            .unwrap()
            .security_context
            .as_mut()
            .unwrap();
        sc.namespace_options.as_mut().unwrap().userns_options = Some(v1::UserNamespace {
            mode: v1::NamespaceMode::Pod as i32,
            uids: vec![v1::IdMapping {
                host_id: 65536,
                container_id: 0,
                length: 65536,
            }],
            gids: vec![],
        });
        assert_eq!(
            sandbox_config(&pod).unwrap_err(),
            ConvertError::Unsupported {
                field: "config.linux.security_context.namespace_options.userns_options.mode".into()
            }
        );
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

    fn snapshot(state: SandboxState) -> SandboxSnapshot {
        let mut m = sandbox_metadata("abc", &kubelet_pod(), "runc").unwrap();
        m.created_at = 1_700_000_000_000_000_000;
        m.ip = "10.244.1.7".into();
        m.additional_ips = vec!["fd00:10:244:1::7".into()];
        SandboxSnapshot {
            metadata: Arc::new(m),
            status: SandboxStatus {
                state,
                ..Default::default()
            },
        }
    }

    #[test]
    fn pod_sandbox_status_round_trip() {
        let s = pod_sandbox_status(&snapshot(SandboxState::Ready));
        let pod = kubelet_pod();
        assert_eq!(s.id, "abc");
        assert_eq!(s.metadata, pod.metadata);
        assert_eq!(s.state, v1::PodSandboxState::SandboxReady as i32);
        assert_eq!(s.created_at, 1_700_000_000_000_000_000);
        assert_eq!(
            s.network,
            Some(v1::PodSandboxNetworkStatus {
                ip: "10.244.1.7".into(),
                additional_ips: vec![v1::PodIp {
                    ip: "fd00:10:244:1::7".into()
                }],
            })
        );
        let ns = s.linux.unwrap().namespaces.unwrap().options.unwrap();
        assert_eq!(
            (ns.network, ns.pid, ns.ipc),
            (
                v1::NamespaceMode::Pod as i32,
                v1::NamespaceMode::Container as i32,
                v1::NamespaceMode::Pod as i32
            )
        );
        // Labels and annotations come back unaltered (CRI MUST).
        assert_eq!(s.labels, pod.labels);
        assert_eq!(s.annotations, pod.annotations);
        assert_eq!(s.runtime_handler, "runc");
    }

    #[test]
    fn pod_sandbox_list_item() {
        let p = pod_sandbox(&snapshot(SandboxState::NotReady));
        let pod = kubelet_pod();
        assert_eq!(
            p,
            v1::PodSandbox {
                id: "abc".into(),
                metadata: pod.metadata,
                state: v1::PodSandboxState::SandboxNotready as i32,
                created_at: 1_700_000_000_000_000_000,
                labels: pod.labels,
                annotations: pod.annotations,
                runtime_handler: "runc".into(),
            }
        );
    }

    #[test]
    fn unknown_sandbox_state_is_reported_not_ready() {
        let s = snapshot(SandboxState::Unknown);
        assert_eq!(
            pod_sandbox(&s).state,
            v1::PodSandboxState::SandboxNotready as i32
        );
        assert_eq!(
            pod_sandbox_status(&s).state,
            v1::PodSandboxState::SandboxNotready as i32
        );
    }

    #[test]
    fn host_network_status_has_an_empty_ip() {
        let mut m = (*snapshot(SandboxState::Ready).metadata).clone();
        m.ip.clear();
        m.additional_ips.clear();
        m.namespace_options.network = NamespaceMode::Node;
        let s = pod_sandbox_status(&SandboxSnapshot {
            metadata: Arc::new(m),
            status: SandboxStatus::ready(42),
        });
        assert_eq!(s.network, Some(v1::PodSandboxNetworkStatus::default()));
        let ns = s.linux.unwrap().namespaces.unwrap().options.unwrap();
        assert_eq!(ns.network, v1::NamespaceMode::Node as i32);
    }

    #[test]
    fn sandbox_filter_mapping() {
        assert_eq!(sandbox_filter(None).unwrap(), SandboxFilter::default());
        assert_eq!(
            sandbox_filter(Some(&v1::PodSandboxFilter::default())).unwrap(),
            SandboxFilter::default()
        );
        let f = v1::PodSandboxFilter {
            id: "abc".into(),
            state: Some(v1::PodSandboxStateValue {
                state: v1::PodSandboxState::SandboxNotready as i32,
            }),
            label_selector: map(&[("app", "nginx")]),
        };
        assert_eq!(
            sandbox_filter(Some(&f)).unwrap(),
            SandboxFilter {
                id: Some("abc".into()),
                state: Some(SandboxState::NotReady),
                label_selector: map(&[("app", "nginx")]),
            }
        );
        let ready = v1::PodSandboxFilter {
            state: Some(v1::PodSandboxStateValue {
                state: v1::PodSandboxState::SandboxReady as i32,
            }),
            ..Default::default()
        };
        assert_eq!(
            sandbox_filter(Some(&ready)).unwrap().state,
            Some(SandboxState::Ready)
        );
        let bad = v1::PodSandboxFilter {
            state: Some(v1::PodSandboxStateValue { state: 4 }),
            ..Default::default()
        };
        assert_eq!(
            sandbox_filter(Some(&bad)).unwrap_err().to_string(),
            "filter.state.state has unknown value 4"
        );
    }
}
