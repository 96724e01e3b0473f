//! Pure mappings between the CRI v1 protobuf messages and remora's domain types.
//!
//! This is the only place (besides [`super::service`]) where `crate::cri::v1` types meet the
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
//!
//! Layout, one file per seam: `sandbox` (RunPodSandbox request side), `security` (security
//! contexts and profiles, shared by pods and containers), `signal` (CRI's stop signals), `container` (CreateContainer and
//! UpdateContainerResources request side), `status` (store snapshots → list items and
//! statuses, and the List filters) and `stats` (container and pod stats, CRI metrics). Every public function is re-exported here, so callers name
//! it `convert::sandbox_config` wherever it lives. The tests sit in `tests/`, split by the
//! same seams (the convention: tests beside the code while short, `<module>/tests.rs` or
//! `<module>/tests/` once they pass ~300 lines), and the property tests in `props`.

mod container;
#[cfg(test)]
mod props;
mod sandbox;
mod security;
mod signal;
mod stats;
mod status;
#[cfg(test)]
mod tests;

use super::error::ConvertError;

pub use container::{
    container_config, container_metadata, container_target_id, recorded_resources, resources,
};
#[cfg(test)]
pub use container::{container_log_path, container_security, mount_request};
pub use sandbox::sandbox_dns;
#[cfg(test)]
pub use sandbox::{sandbox_cni_dns, sandbox_metadata};
pub use sandbox::{sandbox_config, sandbox_port_mappings};
pub use stats::{
    container_stats, metric_descriptor, pod_sandbox_metrics, pod_sandbox_stats,
    sandbox_stats_filter,
};
pub use status::{
    container, container_filter, container_status, pod_sandbox, pod_sandbox_status, sandbox_filter,
};

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
