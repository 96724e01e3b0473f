//! The CDI spec file format (CDI specification 1.1.0; every released version from 0.1.0 on
//! reads into these types, as Go's `specs-go` does).
//!
//! Unknown fields are errors (CDI loads with `KnownFields(true)`), so a misspelt key makes the
//! file invalid instead of silently dropping an edit. A `null` or absent list or map is an
//! empty one (Go's zero values).

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer};

/// `null` or absent → the type's default.
fn nullable<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// A spec file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Spec {
    /// `cdiVersion`, e.g. `0.6.0` (a leading `v` is accepted).
    #[serde(rename = "cdiVersion", default, deserialize_with = "nullable")]
    pub version: String,
    /// `vendor/class`.
    #[serde(default, deserialize_with = "nullable")]
    pub kind: String,
    /// Spec annotations (0.6.0); CDI's own, never applied to the container.
    #[serde(default, deserialize_with = "nullable")]
    pub annotations: BTreeMap<String, String>,
    /// The devices (at least one).
    #[serde(default, deserialize_with = "nullable")]
    pub devices: Vec<Device>,
    /// Edits applied once when any device of this spec is requested.
    #[serde(default, deserialize_with = "nullable")]
    pub container_edits: ContainerEdits,
}

/// One device of a spec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Device {
    /// The name after `=` in `vendor/class=name`.
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    /// Device annotations (0.6.0).
    #[serde(default, deserialize_with = "nullable")]
    pub annotations: BTreeMap<String, String>,
    /// The device's own edits (must not be empty).
    #[serde(default, deserialize_with = "nullable")]
    pub container_edits: ContainerEdits,
}

/// Edits to a container's OCI spec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ContainerEdits {
    /// `NAME=value`, overriding a variable of the same name or appended.
    #[serde(default, deserialize_with = "nullable")]
    pub env: Vec<String>,
    /// Device nodes.
    #[serde(default, deserialize_with = "nullable")]
    pub device_nodes: Vec<DeviceNode>,
    /// Host network interfaces moved into the container (1.1.0).
    #[serde(default, deserialize_with = "nullable")]
    pub net_devices: Vec<NetDevice>,
    /// OCI hooks.
    #[serde(default, deserialize_with = "nullable")]
    pub hooks: Vec<Hook>,
    /// Mounts.
    #[serde(default, deserialize_with = "nullable")]
    pub mounts: Vec<Mount>,
    /// resctrl settings (0.7.0; `schemata` and `enableMonitoring` 1.1.0).
    #[serde(default)]
    pub intel_rdt: Option<IntelRdt>,
    /// Supplementary groups of the container process (0.7.0); 0 is ignored.
    #[serde(default, deserialize_with = "nullable")]
    pub additional_gids: Vec<u32>,
}

impl ContainerEdits {
    /// No edit at all (a device must have at least one).
    pub fn is_empty(&self) -> bool {
        self.env.is_empty()
            && self.device_nodes.is_empty()
            && self.net_devices.is_empty()
            && self.hooks.is_empty()
            && self.mounts.is_empty()
            && self.intel_rdt.is_none()
            && self.additional_gids.is_empty()
    }

    /// Appends `other` (CDI's `ContainerEdits.Append`: lists concatenate, a later `intelRdt`
    /// replaces an earlier one).
    pub fn append(&mut self, other: &ContainerEdits) {
        self.env.extend(other.env.iter().cloned());
        self.device_nodes.extend(other.device_nodes.iter().cloned());
        self.net_devices.extend(other.net_devices.iter().cloned());
        self.hooks.extend(other.hooks.iter().cloned());
        self.mounts.extend(other.mounts.iter().cloned());
        if other.intel_rdt.is_some() {
            self.intel_rdt = other.intel_rdt.clone();
        }
        self.additional_gids
            .extend(other.additional_gids.iter().copied());
    }
}

/// A device node to create in the container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DeviceNode {
    /// Path in the container.
    #[serde(default, deserialize_with = "nullable")]
    pub path: String,
    /// Path on the host (0.5.0); empty: `path`.
    #[serde(default, deserialize_with = "nullable")]
    pub host_path: String,
    /// `b`, `c`, `u`, `p`; empty: the host node's.
    #[serde(rename = "type", default, deserialize_with = "nullable")]
    pub typ: String,
    /// Major number; 0: the host node's.
    #[serde(default, deserialize_with = "nullable")]
    pub major: i64,
    /// Minor number.
    #[serde(default, deserialize_with = "nullable")]
    pub minor: i64,
    /// Mode bits; absent: the host node's.
    #[serde(default)]
    pub file_mode: Option<u32>,
    /// Cgroup access (`rwm` subset); empty: `rwm`; `none`: no access.
    #[serde(default, deserialize_with = "nullable")]
    pub permissions: String,
    /// Owner in the container; absent: the process's uid when not root.
    #[serde(default)]
    pub uid: Option<u32>,
    /// Group in the container; absent: the process's gid when not root.
    #[serde(default)]
    pub gid: Option<u32>,
}

/// A mount.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Mount {
    /// Source.
    #[serde(default, deserialize_with = "nullable")]
    pub host_path: String,
    /// Destination.
    #[serde(default, deserialize_with = "nullable")]
    pub container_path: String,
    /// Mount options.
    #[serde(default, deserialize_with = "nullable")]
    pub options: Vec<String>,
    /// Filesystem type (0.4.0).
    #[serde(rename = "type", default, deserialize_with = "nullable")]
    pub typ: String,
}

/// An OCI hook.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Hook {
    /// `prestart`, `createRuntime`, `createContainer`, `startContainer`, `poststart`,
    /// `poststop`.
    #[serde(default, deserialize_with = "nullable")]
    pub hook_name: String,
    /// The executable (absolute).
    #[serde(default, deserialize_with = "nullable")]
    pub path: String,
    /// argv.
    #[serde(default, deserialize_with = "nullable")]
    pub args: Vec<String>,
    /// environ.
    #[serde(default, deserialize_with = "nullable")]
    pub env: Vec<String>,
    /// Seconds (> 0).
    #[serde(default)]
    pub timeout: Option<i64>,
}

/// resctrl settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct IntelRdt {
    /// Class of service.
    #[serde(rename = "closID", default, deserialize_with = "nullable")]
    pub clos_id: String,
    /// L3 cache schema.
    #[serde(default, deserialize_with = "nullable")]
    pub l3_cache_schema: String,
    /// Memory bandwidth schema.
    #[serde(default, deserialize_with = "nullable")]
    pub mem_bw_schema: String,
    /// Whole schemata lines (1.1.0).
    #[serde(default)]
    pub schemata: Option<Vec<String>>,
    /// Monitoring (1.1.0).
    #[serde(default, deserialize_with = "nullable")]
    pub enable_monitoring: bool,
}

/// A host network interface moved into the container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NetDevice {
    /// The interface on the host.
    #[serde(default, deserialize_with = "nullable")]
    pub host_interface_name: String,
    /// Its name in the container.
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
}
