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
//! - "0 / empty means not set" is kept: such fields are copied verbatim. This module rejects
//!   what it cannot represent (a missing required message, an enum value outside the
//!   proto's, a feature the domain types have no room for — rather than silently dropping
//!   it: a dropped user namespace or recursive read-only mount would weaken isolation without
//!   anyone noticing), and, through [`super::validate`], values that would only fail once
//!   runc or the kernel sees them, or that would escape (bad names, relative or `..` paths,
//!   host-wide sysctls, negative resources, oversized labels and annotations). So a bad
//!   request is refused before anything is reserved or created. The spec generator keeps its
//!   own checks of what it emits (mount destinations, resources, sysctls).
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

use super::validate;
use crate::net::{DnsConfig, PortMapping, Protocol};
use crate::spec::{
    AppArmorProfile, CapabilityChanges, ContainerConfig, DeviceRequest, HugepageLimit,
    MountPropagation, MountRequest, NamespaceMode, NamespaceOptions, Resources, SandboxConfig,
    SeccompProfile, SecurityContext, SupplementalGroupsPolicy,
};
use crate::store::{
    ContainerFilter, ContainerMetadata, ContainerSnapshot, ContainerState, ImageRefs, MountSummary,
    PodRef, SandboxFilter, SandboxMetadata, SandboxSnapshot, SandboxState,
};

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
        validate::name(field, value)?;
    }
    Ok(m)
}

/// `PodSandboxConfig` → the sandbox's spec inputs.
///
/// `metadata` with non-empty `name`, `namespace` and `uid` is required. Linux fields default
/// to CRI's zero values when `linux` or its `security_context` is absent (all namespaces POD,
/// seccomp unconfined, no AppArmor request). Labels, port mappings and DNS are not part of
/// the spec; see [`sandbox_metadata`], [`sandbox_port_mappings`] and [`sandbox_dns`]. All of
/// the request is validated here, labels and DNS included ([`validate`]): this is the one
/// conversion every RunPodSandbox goes through first.
pub fn sandbox_config(config: &v1::PodSandboxConfig) -> Result<SandboxConfig, ConvertError> {
    let m = sandbox_metadata_of(config)?;
    let linux = config.linux.as_ref();
    let security = match linux.and_then(|l| l.security_context.as_ref()) {
        Some(sc) => sandbox_security(sc, "config.linux.security_context")?,
        None => SecurityContext::default(),
    };
    validate::hostname("config.hostname", &config.hostname)?;
    if !config.log_directory.is_empty() {
        validate::absolute_path("config.log_directory", &config.log_directory)?;
    }
    validate::labels("config.labels", &config.labels)?;
    validate::annotations("config.annotations", &config.annotations)?;
    if let Some(d) = &config.dns_config {
        validate::dns("config.dns_config", &d.servers, &d.searches, &d.options)?;
    }
    if let Some(l) = linux {
        validate::cgroup_parent("config.linux.cgroup_parent", &l.cgroup_parent)?;
        validate::sysctls(
            "config.linux.sysctls",
            &l.sysctls,
            security.namespaces.network == NamespaceMode::Node,
            security.namespaces.ipc == NamespaceMode::Node,
        )?;
    }
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
/// `toCNIPortMappings`. A mapping with a host port needs both ports within 1..=65535 and,
/// if given, an IP address as `host_ip` (the portmap plugin would fail on anything else).
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
            if p.host_port > 0 {
                let prefix = format!("config.port_mappings[{i}]");
                for (field, port) in [
                    ("host_port", p.host_port),
                    ("container_port", p.container_port),
                ] {
                    if !(1..=65535).contains(&port) {
                        return Err(ConvertError::Invalid {
                            field: format!("{prefix}.{field}"),
                            value: port.to_string(),
                            reason: "must be between 1 and 65535",
                        });
                    }
                }
                if !p.host_ip.is_empty() && p.host_ip.parse::<std::net::IpAddr>().is_err() {
                    return Err(ConvertError::Invalid {
                        field: format!("{prefix}.host_ip"),
                        value: validate::shown(&p.host_ip),
                        reason: "must be an IP address",
                    });
                }
            }
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

// ---------------------------------------------------------------------------------------------
// Containers: request side
// ---------------------------------------------------------------------------------------------

fn container_name(config: &v1::ContainerConfig) -> Result<&v1::ContainerMetadata, ConvertError> {
    let m = config
        .metadata
        .as_ref()
        .ok_or_else(|| missing("config.metadata"))?;
    if m.name.is_empty() {
        return Err(missing("config.metadata.name"));
    }
    validate::name("config.metadata.name", &m.name)?;
    Ok(m)
}

fn container_image(config: &v1::ContainerConfig) -> Result<&str, ConvertError> {
    let image = config
        .image
        .as_ref()
        .ok_or_else(|| missing("config.image"))?;
    if image.image.is_empty() {
        return Err(missing("config.image.image"));
    }
    Ok(&image.image)
}

/// `ContainerConfig` (of a container in the pod `sandbox`) → the container's spec inputs.
///
/// `metadata.name` and `image.image` are required. When the container's security context
/// (or its `namespace_options`) is absent, the namespace modes are the pod's: a container
/// always shares the pod's network and IPC namespaces, so the pod's modes describe it, and
/// kubelet sends the pod's PID mode for containers anyway. CDI devices are refused
/// (unsupported); labels, log path and `stdin_once` are not spec inputs (see
/// [`container_metadata`]).
pub fn container_config(
    config: &v1::ContainerConfig,
    sandbox: &v1::PodSandboxConfig,
) -> Result<ContainerConfig, ConvertError> {
    let m = container_name(config)?;
    let image = container_image(config)?;
    if !config.cdi_devices.is_empty() {
        return Err(unsupported("config.cdi_devices"));
    }
    let linux = config.linux.as_ref();
    let pod_namespaces = match sandbox
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|sc| sc.namespace_options.as_ref())
    {
        Some(ns) => namespace_options(
            ns,
            "sandbox_config.linux.security_context.namespace_options",
        )?,
        None => NamespaceOptions::default(),
    };
    let mut security = match linux.and_then(|l| l.security_context.as_ref()) {
        Some(sc) => container_security(sc, "config.linux.security_context")?,
        None => SecurityContext::default(),
    };
    if linux
        .and_then(|l| l.security_context.as_ref())
        .and_then(|sc| sc.namespace_options.as_ref())
        .is_none()
    {
        security.namespaces = pod_namespaces;
    }
    let envs: Vec<(String, String)> = config
        .envs
        .iter()
        .map(|kv| (kv.key.clone(), kv.value.clone()))
        .collect();
    validate::process(
        "config",
        &config.command,
        &config.args,
        &envs,
        &config.working_dir,
    )?;
    validate::annotations("config.annotations", &config.annotations)?;
    Ok(ContainerConfig {
        name: m.name.clone(),
        image_name: image.to_string(),
        command: config.command.clone(),
        args: config.args.clone(),
        working_dir: config.working_dir.clone(),
        envs,
        mounts: config
            .mounts
            .iter()
            .enumerate()
            .map(|(i, mount)| mount_request(mount, &format!("config.mounts[{i}]")))
            .collect::<Result<_, _>>()?,
        devices: config.devices.iter().map(device_request).collect(),
        annotations: config.annotations.clone(),
        tty: config.tty,
        stdin: config.stdin,
        resources: linux
            .and_then(|l| l.resources.as_ref())
            .map(|r| resources(r, "config.linux.resources"))
            .transpose()?,
        security,
    })
}

/// The id of the container whose PID namespace a `TARGET` PID mode joins, if the config
/// asks for one (`linux.security_context.namespace_options.target_id`). The caller resolves
/// it to [`crate::spec::ContainerInputs::target_pid`].
pub fn container_target_id(config: &v1::ContainerConfig) -> Option<String> {
    config
        .linux
        .as_ref()?
        .security_context
        .as_ref()?
        .namespace_options
        .as_ref()
        .and_then(|ns| non_empty(&ns.target_id))
}

/// The container's CRI log file: the pod's `log_directory` joined with the container's
/// `log_path`; empty (no log file) unless both are set, as in containerd. The directory must
/// be absolute and the path relative, neither with `..`: the file stays in the directory.
pub fn container_log_path(
    config: &v1::ContainerConfig,
    sandbox: &v1::PodSandboxConfig,
) -> Result<String, ConvertError> {
    if !config.log_path.is_empty() {
        validate::log_path("config.log_path", &config.log_path)?;
    }
    if !sandbox.log_directory.is_empty() {
        validate::absolute_path("sandbox_config.log_directory", &sandbox.log_directory)?;
    }
    if sandbox.log_directory.is_empty() || config.log_path.is_empty() {
        return Ok(String::new());
    }
    Ok(Path::new(&sandbox.log_directory)
        .join(&config.log_path)
        .to_string_lossy()
        .into_owned())
}

/// The store metadata of a new container. Fills what the request says (pod, name, attempt,
/// labels, annotations, requested image, log path, mounts, tty/stdin flags); the caller
/// fills the resolved image (`image.id`, `image.reference`) and `resources_json`.
pub fn container_metadata(
    id: &str,
    sandbox_id: &str,
    config: &v1::ContainerConfig,
    sandbox: &v1::PodSandboxConfig,
) -> Result<ContainerMetadata, ConvertError> {
    let m = container_name(config)?;
    let image = container_image(config)?;
    let pod = sandbox_metadata_of(sandbox).map_err(|e| match e {
        ConvertError::Missing { field } => missing(format!("sandbox_{field}")),
        ConvertError::Invalid {
            field,
            value,
            reason,
        } => ConvertError::Invalid {
            field: format!("sandbox_{field}"),
            value,
            reason,
        },
        other => other,
    })?;
    validate::labels("config.labels", &config.labels)?;
    let mounts = config
        .mounts
        .iter()
        .enumerate()
        .map(|(i, mount)| {
            mount_request(mount, &format!("config.mounts[{i}]")).map(|r| MountSummary {
                container_path: r.container_path,
                host_path: r.host_path.to_string_lossy().into_owned(),
                readonly: r.readonly,
                selinux_relabel: r.selinux_relabel,
                propagation: r.propagation,
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(ContainerMetadata {
        id: id.to_string(),
        sandbox_id: sandbox_id.to_string(),
        pod: PodRef {
            name: pod.name.clone(),
            namespace: pod.namespace.clone(),
            uid: pod.uid.clone(),
        },
        name: m.name.clone(),
        attempt: m.attempt,
        labels: config.labels.clone(),
        annotations: config.annotations.clone(),
        image: ImageRefs {
            requested: image.to_string(),
            ..Default::default()
        },
        log_path: container_log_path(config, sandbox)?,
        mounts,
        resources_json: Vec::new(),
        tty: config.tty,
        stdin: config.stdin,
        stdin_once: config.stdin_once,
    })
}

/// `Mount` → [`MountRequest`]. `prefix` is the CRI path of the mount. Image volumes, ID
/// mapped mounts and recursive read-only mounts are refused: remora does not implement
/// them, and quietly mounting a writable or unmapped host path instead would be worse than
/// failing. Both paths must be absolute without `..`, and the mount not at the container's
/// root.
pub fn mount_request(m: &v1::Mount, prefix: &str) -> Result<MountRequest, ConvertError> {
    validate::mount_destination(&format!("{prefix}.container_path"), &m.container_path)?;
    validate::absolute_path(&format!("{prefix}.host_path"), &m.host_path)?;
    if m.image.is_some() {
        return Err(unsupported(format!("{prefix}.image")));
    }
    if !m.uid_mappings.is_empty() {
        return Err(unsupported(format!("{prefix}.uid_mappings")));
    }
    if !m.gid_mappings.is_empty() {
        return Err(unsupported(format!("{prefix}.gid_mappings")));
    }
    if m.recursive_read_only {
        return Err(unsupported(format!("{prefix}.recursive_read_only")));
    }
    let propagation = match v1::MountPropagation::try_from(m.propagation) {
        Ok(v1::MountPropagation::PropagationPrivate) => MountPropagation::Private,
        Ok(v1::MountPropagation::PropagationHostToContainer) => MountPropagation::HostToContainer,
        Ok(v1::MountPropagation::PropagationBidirectional) => MountPropagation::Bidirectional,
        Err(_) => return Err(unknown_enum(format!("{prefix}.propagation"), m.propagation)),
    };
    Ok(MountRequest {
        container_path: m.container_path.clone(),
        host_path: PathBuf::from(&m.host_path),
        readonly: m.readonly,
        selinux_relabel: m.selinux_relabel,
        propagation,
    })
}

/// `Device` → [`DeviceRequest`], verbatim (the spec checks paths and permissions).
pub fn device_request(d: &v1::Device) -> DeviceRequest {
    DeviceRequest {
        container_path: d.container_path.clone(),
        host_path: PathBuf::from(&d.host_path),
        permissions: d.permissions.clone(),
    }
}

/// `LinuxContainerResources` (at CRI path `prefix`) → [`Resources`]: zero means "not set" as
/// in CRI; negative values, an `oom_score_adj` outside -1000..=1000 and malformed cpusets or
/// unified keys are refused ([`validate::resources`]).
pub fn resources(r: &v1::LinuxContainerResources, prefix: &str) -> Result<Resources, ConvertError> {
    let out = Resources {
        cpu_period: r.cpu_period,
        cpu_quota: r.cpu_quota,
        cpu_shares: r.cpu_shares,
        memory_limit_in_bytes: r.memory_limit_in_bytes,
        memory_swap_limit_in_bytes: r.memory_swap_limit_in_bytes,
        oom_score_adj: r.oom_score_adj,
        cpuset_cpus: r.cpuset_cpus.clone(),
        cpuset_mems: r.cpuset_mems.clone(),
        hugepage_limits: r
            .hugepage_limits
            .iter()
            .map(|h| HugepageLimit {
                page_size: h.page_size.clone(),
                limit: h.limit,
            })
            .collect(),
        pids_limit: None,
        unified: r.unified.clone(),
    };
    validate::resources(prefix, &out)?;
    Ok(out)
}

/// `LinuxContainerSecurityContext` → [`SecurityContext`]. `prefix` is the CRI path of the
/// message.
///
/// Seccomp and AppArmor: the typed field wins over the deprecated string (module docs).
/// Ambient capabilities are refused (unsupported). Empty `masked_paths` / `readonly_paths`
/// keep the runtime's defaults: protobuf cannot tell an empty list from an absent one, and
/// containerd (which sees `nil` for both) keeps its defaults too.
pub fn container_security(
    sc: &v1::LinuxContainerSecurityContext,
    prefix: &str,
) -> Result<SecurityContext, ConvertError> {
    #[allow(deprecated)] // The deprecated strings are honoured when the typed fields are unset.
    let (seccomp_path, apparmor_name) = (
        sc.seccomp_profile_path.as_str(),
        sc.apparmor_profile.as_str(),
    );
    let capabilities = match &sc.capabilities {
        None => None,
        Some(c) => {
            if !c.add_ambient_capabilities.is_empty() {
                return Err(unsupported(format!(
                    "{prefix}.capabilities.add_ambient_capabilities"
                )));
            }
            Some(CapabilityChanges {
                add: c.add_capabilities.clone(),
                drop: c.drop_capabilities.clone(),
            })
        }
    };
    let paths = |p: &Vec<String>| (!p.is_empty()).then(|| p.clone());
    Ok(SecurityContext {
        capabilities,
        privileged: sc.privileged,
        namespaces: match &sc.namespace_options {
            Some(ns) => namespace_options(ns, &format!("{prefix}.namespace_options"))?,
            None => NamespaceOptions::default(),
        },
        run_as_user: sc.run_as_user.as_ref().map(|v| v.value),
        run_as_username: sc.run_as_username.clone(),
        run_as_group: sc.run_as_group.as_ref().map(|v| v.value),
        supplemental_groups: sc.supplemental_groups.clone(),
        supplemental_groups_policy: supplemental_groups_policy(
            sc.supplemental_groups_policy,
            format!("{prefix}.supplemental_groups_policy"),
        )?,
        readonly_rootfs: sc.readonly_rootfs,
        no_new_privs: sc.no_new_privs,
        seccomp: seccomp_profile(sc.seccomp.as_ref(), seccomp_path, prefix)?,
        apparmor: apparmor_profile(sc.apparmor.as_ref(), apparmor_name, prefix)?,
        masked_paths: paths(&sc.masked_paths),
        readonly_paths: paths(&sc.readonly_paths),
    })
}

// ---------------------------------------------------------------------------------------------
// Containers: response side
// ---------------------------------------------------------------------------------------------

fn container_state_to_cri(state: ContainerState) -> v1::ContainerState {
    match state {
        ContainerState::Created => v1::ContainerState::ContainerCreated,
        ContainerState::Running => v1::ContainerState::ContainerRunning,
        ContainerState::Exited => v1::ContainerState::ContainerExited,
        ContainerState::Unknown => v1::ContainerState::ContainerUnknown,
    }
}

fn propagation_to_cri(p: MountPropagation) -> v1::MountPropagation {
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

fn image_spec(m: &ContainerMetadata) -> v1::ImageSpec {
    v1::ImageSpec {
        image: m.image.requested.clone(),
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
/// reason. `resources` and `user` are left for the caller (the resources are stored as
/// opaque JSON).
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
        image: Some(image_spec(m)),
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
                ..Default::default()
            })
            .collect(),
        log_path: m.log_path.clone(),
        resources: None,
        image_id: m.image.id.clone(),
        user: None,
    }
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use super::*;
    use crate::store::{ContainerStatus, SandboxStatus};

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
        // A host-network pod cannot set net.* sysctls (bad_pod_values_are_refused_...).
        pod.linux.as_mut().unwrap().sysctls.clear();
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
                    host_path: "/var/lib/kubelet/pods/0a1f/volumes/kubernetes.io~configmap/conf"
                        .into(),
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
        }
    }

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
                        host_path:
                            "/var/lib/kubelet/pods/0a1f/volumes/kubernetes.io~configmap/conf".into(),
                        readonly: true,
                        selinux_relabel: false,
                        propagation: MountPropagation::Private,
                    },
                    MountRequest {
                        container_path: "/dev/termination-log".into(),
                        host_path: "/var/lib/kubelet/pods/0a1f/containers/nginx/5c1e".into(),
                        readonly: false,
                        selinux_relabel: false,
                        propagation: MountPropagation::HostToContainer,
                    },
                ],
                devices: vec![DeviceRequest {
                    container_path: "/dev/fuse".into(),
                    host_path: "/dev/fuse".into(),
                    permissions: "rw".into(),
                }],
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
        // Empty path lists keep the defaults (protobuf cannot tell empty from absent).
        let mut config = kubelet_container();
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
        assert_eq!((s.masked_paths, s.readonly_paths), (None, None));
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
            err(&|c| c.cdi_devices = vec![v1::CdiDevice {
                name: "vendor.com/gpu=0".into()
            }]),
            "config.cdi_devices is not supported by remora"
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
            err(&|c| c.mounts[0].recursive_read_only = true),
            unsupported("config.mounts[0].recursive_read_only")
        );
        assert_eq!(
            err(&|c| c.mounts[0].image = Some(v1::ImageSpec::default())),
            unsupported("config.mounts[0].image")
        );
        assert_eq!(
            err(&|c| c.mounts[1].uid_mappings = vec![v1::IdMapping::default()]),
            unsupported("config.mounts[1].uid_mappings")
        );
        assert_eq!(
            err(&|c| c.mounts[1].gid_mappings = vec![v1::IdMapping::default()]),
            unsupported("config.mounts[1].gid_mappings")
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

    /// A change to a request, for tables of bad values.
    type Edit<T> = Box<dyn FnOnce(&mut T)>;

    /// The error of `f` applied to kubelet's pod config, as (field, reason).
    fn pod_error(f: impl FnOnce(&mut v1::PodSandboxConfig)) -> (String, String) {
        let mut pod = kubelet_pod();
        f(&mut pod);
        match sandbox_config(&pod).unwrap_err() {
            ConvertError::Invalid { field, reason, .. } => (field, reason.to_string()),
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn bad_pod_values_are_refused_naming_the_field() {
        let sc = |p: &mut v1::PodSandboxConfig| {
            p.linux
                .as_mut()
                .unwrap()
                .security_context
                .as_mut()
                .unwrap()
                .namespace_options
                .as_mut()
                .unwrap()
                .network = v1::NamespaceMode::Node as i32;
        };
        let cases: Vec<(Edit<v1::PodSandboxConfig>, &str)> = vec![
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
                Box::new(|p| p.metadata.as_mut().unwrap().namespace = "..".into()),
                "config.metadata.namespace",
            ),
            (
                Box::new(|p| p.metadata.as_mut().unwrap().uid = "u;K8S_POD_NAME=x".into()),
                "config.metadata.uid",
            ),
            (Box::new(|p| p.hostname = "h".repeat(65)), "config.hostname"),
            (
                Box::new(|p| p.hostname = "h\n10.0.0.1 evil".into()),
                "config.hostname",
            ),
            (
                Box::new(|p| p.log_directory = "var/log/pods/x".into()),
                "config.log_directory",
            ),
            (
                Box::new(|p| p.log_directory = "/var/log/pods/../../etc".into()),
                "config.log_directory",
            ),
            (
                Box::new(|p| {
                    p.labels.insert("big".into(), "v".repeat(5000));
                }),
                "config.labels[big]",
            ),
            (
                Box::new(|p| {
                    p.annotations.insert("big".into(), "v".repeat(600 * 1024));
                }),
                "config.annotations",
            ),
            (
                Box::new(|p| {
                    p.dns_config
                        .as_mut()
                        .unwrap()
                        .servers
                        .push("8.8.8.8\nsearch x".into())
                }),
                "config.dns_config.servers[1]",
            ),
            (
                Box::new(|p| p.linux.as_mut().unwrap().cgroup_parent = "/kubepods/../..".into()),
                "config.linux.cgroup_parent",
            ),
            (
                Box::new(|p| {
                    p.linux
                        .as_mut()
                        .unwrap()
                        .sysctls
                        .insert("kernel.foo".into(), "1".into());
                }),
                "config.linux.sysctls[kernel.foo]",
            ),
            (
                Box::new(|p| {
                    p.linux
                        .as_mut()
                        .unwrap()
                        .sysctls
                        .insert("net..ipv4".into(), "1".into());
                }),
                "config.linux.sysctls[net..ipv4]",
            ),
            (
                Box::new(|p| {
                    p.linux
                        .as_mut()
                        .unwrap()
                        .sysctls
                        .insert("net/../../x".into(), "1".into());
                }),
                "config.linux.sysctls[net/../../x]",
            ),
            // kubelet's pod sets a net.* sysctl: refused once the pod is on the host network.
            (
                Box::new(sc),
                "config.linux.sysctls[net.ipv4.ip_unprivileged_port_start]",
            ),
            (
                Box::new(|p| p.port_mappings[0].host_port = 70000),
                "config.port_mappings[0].host_port",
            ),
            (
                Box::new(|p| p.port_mappings[0].container_port = 0),
                "config.port_mappings[0].container_port",
            ),
            (
                Box::new(|p| p.port_mappings[0].host_ip = "localhost".into()),
                "config.port_mappings[0].host_ip",
            ),
        ];
        for (f, want) in cases {
            let mut pod = kubelet_pod();
            f(&mut pod);
            let err = sandbox_config(&pod)
                .and_then(|_| sandbox_port_mappings(&pod).map(|_| SandboxConfig::default()))
                .unwrap_err();
            assert!(
                matches!(&err, ConvertError::Invalid { field, .. } if field == want),
                "{want}: {err}"
            );
            let status: tonic::Status = crate::cri::error::CriError::from(err).into();
            assert_eq!(status.code(), tonic::Code::InvalidArgument);
            assert!(status.message().contains(want), "{}", status.message());
        }
        // A port mapping without a host port is not checked (the network layer skips it).
        let mut pod = kubelet_pod();
        pod.port_mappings[1].container_port = -5;
        assert!(sandbox_port_mappings(&pod).is_ok());
        // Allowed: a namespaced IPC sysctl, a long-but-legal name and hostname.
        let (f, _) = pod_error(|p| {
            p.linux
                .as_mut()
                .unwrap()
                .sysctls
                .insert("kernel.shm_rmid_forced".into(), "1".into());
            p.metadata.as_mut().unwrap().name = "n".repeat(253);
            p.hostname = "h".repeat(64);
            p.metadata.as_mut().unwrap().uid = "bad uid".into();
        });
        assert_eq!(f, "config.metadata.uid", "only the uid is wrong");
    }

    /// The container's Linux resources (the kubelet-like test configs have them).
    fn resources_mut(c: &mut v1::ContainerConfig) -> &mut v1::LinuxContainerResources {
        c.linux.as_mut().unwrap().resources.as_mut().unwrap()
    }

    #[test]
    fn bad_container_values_are_refused_naming_the_field() {
        fn mounts(c: &mut v1::ContainerConfig) -> &mut v1::Mount {
            &mut c.mounts[0]
        }
        let cases: Vec<(Edit<v1::ContainerConfig>, &str)> = vec![
            (
                Box::new(|c| c.metadata.as_mut().unwrap().name = "a/b".into()),
                "config.metadata.name",
            ),
            (
                Box::new(|c| mounts(c).container_path = "etc/x".into()),
                "config.mounts[0].container_path",
            ),
            (
                Box::new(|c| mounts(c).container_path = "/etc/../../x".into()),
                "config.mounts[0].container_path",
            ),
            (
                Box::new(|c| mounts(c).container_path = "/".into()),
                "config.mounts[0].container_path",
            ),
            (
                Box::new(|c| mounts(c).host_path = "relative/dir".into()),
                "config.mounts[0].host_path",
            ),
            (
                Box::new(|c| mounts(c).host_path = "/var/lib/x\0y".into()),
                "config.mounts[0].host_path",
            ),
            (
                Box::new(|c| c.envs[0].key = "A=B".into()),
                "config.envs[0].key",
            ),
            (
                Box::new(|c| c.command[0] = "/bin/sh\0".into()),
                "config.command[0]",
            ),
            (
                Box::new(|c| c.working_dir = "srv".into()),
                "config.working_dir",
            ),
            (
                Box::new(|c| {
                    c.annotations.insert("big".into(), "v".repeat(600 * 1024));
                }),
                "config.annotations",
            ),
            (
                Box::new(|c| resources_mut(c).cpu_quota = -1),
                "config.linux.resources.cpu_quota",
            ),
            (
                Box::new(|c| resources_mut(c).cpu_period = -1),
                "config.linux.resources.cpu_period",
            ),
            (
                Box::new(|c| resources_mut(c).memory_limit_in_bytes = -1),
                "config.linux.resources.memory_limit_in_bytes",
            ),
            (
                Box::new(|c| resources_mut(c).oom_score_adj = -1001),
                "config.linux.resources.oom_score_adj",
            ),
        ];
        for (f, want) in cases {
            let mut c = kubelet_container();
            f(&mut c);
            let err = container_config(&c, &kubelet_pod()).unwrap_err();
            assert!(
                matches!(&err, ConvertError::Invalid { field, .. } if field == want),
                "{want}: {err}"
            );
        }
        let mut c = kubelet_container();
        c.labels.insert("k".into(), "v".repeat(4096));
        assert!(matches!(
            container_metadata("c1", "abc", &c, &kubelet_pod()).unwrap_err(),
            ConvertError::Invalid { field, .. } if field == "config.labels[k]"
        ));
        let mut pod = kubelet_pod();
        pod.metadata.as_mut().unwrap().name = "a/b".into();
        assert!(matches!(
            container_metadata("c1", "abc", &kubelet_container(), &pod).unwrap_err(),
            ConvertError::Invalid { field, .. } if field == "sandbox_config.metadata.name"
        ));
    }

    fn container_snapshot(status: ContainerStatus) -> ContainerSnapshot {
        let mut m = container_metadata("c1", "abc", &kubelet_container(), &kubelet_pod()).unwrap();
        m.image.id = "sha256:5ef79149e0ec".into();
        m.image.reference = "docker.io/library/nginx@sha256:0d17b565".into();
        ContainerSnapshot {
            metadata: Arc::new(m),
            status,
        }
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
    fn container_status_round_trip() {
        let request = kubelet_container();
        let s = container_status(&container_snapshot(ContainerStatus {
            state: ContainerState::Exited,
            pid: 0,
            created_at: 10,
            started_at: 20,
            finished_at: 30,
            exit_code: 137,
            reason: "OOMKilled".into(),
            message: "memory limit".into(),
            oom_killed: true,
            ..Default::default()
        }));
        assert_eq!(s.id, "c1");
        assert_eq!(s.metadata, request.metadata);
        assert_eq!(s.state, v1::ContainerState::ContainerExited as i32);
        assert_eq!((s.created_at, s.started_at, s.finished_at), (10, 20, 30));
        assert_eq!(s.exit_code, 137);
        assert_eq!(
            (s.reason.as_str(), s.message.as_str()),
            ("OOMKilled", "memory limit")
        );
        assert_eq!(s.image.unwrap().image, "docker.io/library/nginx:1.27");
        assert_eq!(s.image_ref, "docker.io/library/nginx@sha256:0d17b565");
        assert_eq!(s.image_id, "sha256:5ef79149e0ec");
        assert_eq!(s.labels, request.labels);
        assert_eq!(s.annotations, request.annotations);
        assert_eq!(
            s.log_path,
            "/var/log/pods/default_nginx-7c5ddbdf54-x2x4q_0a1f63d6/nginx/2.log"
        );
        // The mounts come back as they were requested.
        assert_eq!(s.mounts, request.mounts);
    }

    #[test]
    fn container_status_times_follow_the_state() {
        let status = |state, reason: &str, exit_code| {
            container_status(&container_snapshot(ContainerStatus {
                state,
                created_at: 10,
                started_at: 20,
                finished_at: 30,
                exit_code,
                reason: reason.into(),
                ..Default::default()
            }))
        };
        let s = status(ContainerState::Created, "", 0);
        assert_eq!((s.started_at, s.finished_at), (0, 0));
        assert_eq!(s.state, v1::ContainerState::ContainerCreated as i32);
        let s = status(ContainerState::Running, "", 0);
        assert_eq!((s.started_at, s.finished_at), (20, 0));
        assert_eq!(s.state, v1::ContainerState::ContainerRunning as i32);
        let s = status(ContainerState::Unknown, "", 0);
        assert_eq!((s.started_at, s.finished_at), (20, 30));
        assert_eq!(s.state, v1::ContainerState::ContainerUnknown as i32);
        // An exited container always has a reason.
        assert_eq!(status(ContainerState::Exited, "", 0).reason, "Completed");
        assert_eq!(status(ContainerState::Exited, "", 1).reason, "Error");
        assert_eq!(
            status(ContainerState::Exited, "StartError", 128).reason,
            "StartError"
        );
    }

    #[test]
    fn container_list_item() {
        let request = kubelet_container();
        let c = container(&container_snapshot(ContainerStatus {
            state: ContainerState::Running,
            created_at: 10,
            started_at: 20,
            ..Default::default()
        }));
        assert_eq!(
            c,
            v1::Container {
                id: "c1".into(),
                pod_sandbox_id: "abc".into(),
                metadata: request.metadata,
                image: Some(v1::ImageSpec {
                    image: "docker.io/library/nginx:1.27".into(),
                    ..Default::default()
                }),
                image_ref: "docker.io/library/nginx@sha256:0d17b565".into(),
                state: v1::ContainerState::ContainerRunning as i32,
                created_at: 10,
                labels: request.labels,
                annotations: request.annotations,
                image_id: "sha256:5ef79149e0ec".into(),
            }
        );
    }

    #[test]
    fn container_filter_mapping() {
        assert_eq!(container_filter(None).unwrap(), ContainerFilter::default());
        assert_eq!(
            container_filter(Some(&v1::ContainerFilter::default())).unwrap(),
            ContainerFilter::default()
        );
        for (cri, domain) in [
            (
                v1::ContainerState::ContainerCreated,
                ContainerState::Created,
            ),
            (
                v1::ContainerState::ContainerRunning,
                ContainerState::Running,
            ),
            (v1::ContainerState::ContainerExited, ContainerState::Exited),
            (
                v1::ContainerState::ContainerUnknown,
                ContainerState::Unknown,
            ),
        ] {
            let f = v1::ContainerFilter {
                id: "c1".into(),
                pod_sandbox_id: "abc".into(),
                state: Some(v1::ContainerStateValue { state: cri as i32 }),
                label_selector: map(&[("io.kubernetes.container.name", "nginx")]),
            };
            assert_eq!(
                container_filter(Some(&f)).unwrap(),
                ContainerFilter {
                    id: Some("c1".into()),
                    pod_sandbox_id: Some("abc".into()),
                    state: Some(domain),
                    label_selector: map(&[("io.kubernetes.container.name", "nginx")]),
                }
            );
            assert_eq!(container_state_to_cri(domain), cri);
        }
        let bad = v1::ContainerFilter {
            state: Some(v1::ContainerStateValue { state: 9 }),
            ..Default::default()
        };
        assert_eq!(
            container_filter(Some(&bad)).unwrap_err(),
            ConvertError::UnknownEnum {
                field: "filter.state.state".into(),
                value: 9
            }
        );
    }
}
