//! Sandboxes, request side: `PodSandboxConfig` → the sandbox's spec inputs, store metadata,
//! DNS and port mappings.

use crate::cri::v1;

use super::security::sandbox_security;
use super::{missing, unknown_enum, ConvertError};
use crate::cri::validate;
use crate::net::{PortMapping, Protocol};
use crate::spec::{NamespaceMode, SandboxConfig, SecurityContext};
// Only the test-only `sandbox_metadata` and `sandbox_cni_dns` use these.
#[cfg(test)]
use {
    super::security::namespace_options, crate::net::DnsConfig, crate::spec::NamespaceOptions,
    crate::store::SandboxMetadata,
};

/// The pod's metadata, with name, namespace and uid required (CRI requires them to build a
/// unique sandbox name; containerd rejects a request without them).
pub(super) fn sandbox_metadata_of(
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
#[cfg(test)]
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
#[cfg(test)]
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
