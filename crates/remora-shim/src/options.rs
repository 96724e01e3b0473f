//! A task's runtime options: which OCI runtime runs the container and how, as containerd
//! passes them (`containerd.runc.v1.Options`, or containerd's CRI `runtimeoptions.v1.Options`
//! carrying the runtime's options table as TOML).

use std::path::{Path, PathBuf};

use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::protobuf::Message;
use containerd_shim_protos::shim::oci::Options as RuncOptions;

use crate::error::ShimError;

/// The OCI runtime's state root when the runtime options name none (Go shims' default).
const DEFAULT_RUNC_ROOT: &str = "/run/containerd/runc";

/// The OCI runtime and how to run it, from the task's runtime options.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RuntimeOptions {
    /// The OCI runtime binary (`runc` when empty).
    pub binary_name: String,
    /// Its state root, before the namespace is appended (Go shims' rule).
    pub root: String,
    /// `--systemd-cgroup`.
    pub systemd_cgroup: bool,
    /// `--no-pivot`.
    pub no_pivot_root: bool,
    /// `--no-new-keyring`.
    pub no_new_keyring: bool,
    /// Owner uid of the processes' stdio pipes (a user-namespaced container's root on the
    /// host, so it can reopen `/dev/stdout`); with `io_gid`, 0 and 0 leave them the shim's.
    #[serde(default)]
    pub io_uid: u32,
    /// Owner gid of the stdio pipes.
    #[serde(default)]
    pub io_gid: u32,
}

impl RuntimeOptions {
    /// Reads the options containerd passes: `containerd.runc.v1.Options` (remora, ctr, and
    /// containerd's CRI for runc-type runtimes) or `runtimeoptions.v1.Options` (containerd's CRI
    /// for other runtime types: the runtime's options table as TOML).
    pub fn from_any(any: Option<&Any>) -> Result<RuntimeOptions, ShimError> {
        let Some(any) = any.filter(|a| !a.type_url.is_empty()) else {
            return Ok(RuntimeOptions::default());
        };
        let bad = |reason: String| ShimError::InvalidArgument {
            field: "options",
            reason,
        };
        let name = any.type_url.rsplit('/').next().unwrap_or_default();
        match name {
            "containerd.runc.v1.Options" => {
                let o = RuncOptions::parse_from_bytes(&any.value)
                    .map_err(|e| bad(format!("{name}: {e}")))?;
                Ok(RuntimeOptions {
                    binary_name: o.binary_name,
                    root: o.root,
                    systemd_cgroup: o.systemd_cgroup,
                    no_pivot_root: o.no_pivot_root,
                    no_new_keyring: o.no_new_keyring,
                    io_uid: o.io_uid,
                    io_gid: o.io_gid,
                })
            }
            "runtimeoptions.v1.Options" => {
                let (path, body) =
                    decode_runtimeoptions(&any.value).map_err(|e| bad(format!("{name}: {e}")))?;
                let body = if body.is_empty() && !path.is_empty() {
                    std::fs::read_to_string(&path).map_err(|e| bad(format!("{path}: {e}")))?
                } else {
                    body
                };
                Self::from_toml(&body).map_err(|e| bad(format!("{name}: {e}")))
            }
            other => Err(bad(format!("unsupported options type {other:?}"))),
        }
    }

    /// The options table of containerd's CRI config (`BinaryName`, `Root`, `SystemdCgroup`, …).
    fn from_toml(body: &str) -> Result<RuntimeOptions, String> {
        let t: toml::Table = toml::from_str(body).map_err(|e| e.to_string())?;
        let s = |k: &str| t.get(k).and_then(|v| v.as_str()).unwrap_or("").to_string();
        let b = |k: &str| t.get(k).and_then(|v| v.as_bool()).unwrap_or(false);
        let n = |k: &str| {
            t.get(k)
                .and_then(|v| v.as_integer())
                .and_then(|i| u32::try_from(i).ok())
                .unwrap_or(0)
        };
        Ok(RuntimeOptions {
            binary_name: s("BinaryName"),
            root: s("Root"),
            systemd_cgroup: b("SystemdCgroup"),
            no_pivot_root: b("NoPivotRoot"),
            no_new_keyring: b("NoNewKeyring"),
            io_uid: n("IoUid"),
            io_gid: n("IoGid"),
        })
    }

    /// Who owns the processes' stdio pipes, if not the shim (`IoUid`/`IoGid`).
    pub fn io_owner(&self) -> Option<(u32, u32)> {
        (self.io_uid != 0 || self.io_gid != 0).then_some((self.io_uid, self.io_gid))
    }

    /// The OCI runtime binary.
    pub fn binary(&self) -> PathBuf {
        PathBuf::from(if self.binary_name.is_empty() {
            "runc"
        } else {
            &self.binary_name
        })
    }

    /// The OCI runtime's `--root` for `namespace`.
    pub fn root_for(&self, namespace: &str) -> PathBuf {
        let root = if self.root.is_empty() {
            DEFAULT_RUNC_ROOT
        } else {
            &self.root
        };
        Path::new(root).join(namespace)
    }
}

/// `runtimeoptions.v1.Options` fields 2 (config_path) and 3 (config_body); no generated type
/// exists for it in containerd-shim-protos.
fn decode_runtimeoptions(bytes: &[u8]) -> Result<(String, String), String> {
    use containerd_shim_protos::protobuf::rt::WireType;
    use containerd_shim_protos::protobuf::CodedInputStream;
    let mut is = CodedInputStream::from_bytes(bytes);
    let (mut path, mut body) = (String::new(), String::new());
    while let Some(tag) = is.read_raw_tag_or_eof().map_err(|e| e.to_string())? {
        let wire = WireType::new(tag & 7).ok_or_else(|| format!("bad wire type in tag {tag}"))?;
        match (tag >> 3, wire) {
            (2, WireType::LengthDelimited) => path = is.read_string().map_err(|e| e.to_string())?,
            (3, WireType::LengthDelimited) => body = is.read_string().map_err(|e| e.to_string())?,
            _ => is.skip_field(wire).map_err(|e| e.to_string())?,
        }
    }
    Ok((path, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn any(type_url: &str, value: Vec<u8>) -> Any {
        let mut a = Any::new();
        a.type_url = type_url.into();
        a.value = value;
        a
    }

    #[test]
    fn runc_options_name_the_binary_root_and_cgroup_driver() {
        let mut o = RuncOptions::new();
        o.binary_name = "crun".into();
        o.root = "/run/tb/runc".into();
        o.systemd_cgroup = true;
        let a = any("containerd.runc.v1.Options", o.write_to_bytes().unwrap());
        let r = RuntimeOptions::from_any(Some(&a)).unwrap();
        assert_eq!(r.binary(), PathBuf::from("crun"));
        assert_eq!(r.root_for("k8s.io"), PathBuf::from("/run/tb/runc/k8s.io"));
        assert!(r.systemd_cgroup);

        let none = RuntimeOptions::from_any(None).unwrap();
        assert_eq!(none.binary(), PathBuf::from("runc"));
        assert_eq!(
            none.root_for("ns"),
            PathBuf::from("/run/containerd/runc/ns")
        );
    }

    #[test]
    fn containerd_cri_runtimeoptions_carry_the_options_table_as_toml() {
        // runtimeoptions.v1.Options { type_url = 1; config_path = 2; config_body = 3; }
        let body = "BinaryName = \"crun\"\nRoot = \"/r\"\nSystemdCgroup = false\n";
        let mut bytes = vec![0x0a, 3, b'a', b'b', b'c', 0x1a, body.len() as u8];
        bytes.extend_from_slice(body.as_bytes());
        let a = any("runtimeoptions.v1.Options", bytes);
        let r = RuntimeOptions::from_any(Some(&a)).unwrap();
        assert_eq!(r.binary_name, "crun");
        assert_eq!(r.root, "/r");
        assert!(!r.systemd_cgroup);

        let bad = any("example.com/Other", vec![]);
        assert!(matches!(
            RuntimeOptions::from_any(Some(&bad)),
            Err(ShimError::InvalidArgument { .. })
        ));
        let garbage = any("containerd.runc.v1.Options", vec![0xff, 0xff, 0xff]);
        assert!(RuntimeOptions::from_any(Some(&garbage)).is_err());
    }
}
