//! What remora writes on containerd container records so the index can be rebuilt after a
//! restart (DESIGN: containerd is the source of truth, no database of our own).
//!
//! - **Labels** are for filtering on the containerd side (`Containers.List` with a filter such
//!   as `labels."io.cri-containerd.kind"==sandbox`) and for humans using `ctr`. They are the CRI
//!   labels plus the keys below, which win over a CRI label of the same name (kubelet sets the
//!   same values; other clients may not set them at all).
//! - **The extension** holds the full metadata as versioned JSON (`{"version":"v1",…}`); the
//!   CRI adapter wraps the bytes in a `google.protobuf.Any` with [`SANDBOX_TYPE_URL`] /
//!   [`CONTAINER_TYPE_URL`] under [`SANDBOX_EXTENSION`] / [`CONTAINER_EXTENSION`]. A container's
//!   extension also carries its status: an exit recorded while remora runs must survive a
//!   restart after the task is deleted, and containerd keeps no exit code once the task is gone.
//!   The caller rewrites the extension after each status change it must not lose (exit, start).
//!
//! The extension keys are remora's own, not containerd's `io.cri-containerd.*.metadata`: the
//! JSON is not containerd's, and a containerd CRI plugin sharing the namespace must not try to
//! read it as its own.

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::container::{ContainerMetadata, ContainerSnapshot};
use super::sandbox::SandboxMetadata;
use super::status::ContainerStatus;

/// Label telling sandboxes from containers (containerd's CRI uses the same key and values).
pub const LABEL_KIND: &str = "io.cri-containerd.kind";
/// [`LABEL_KIND`] value of a sandbox (pause container).
pub const KIND_SANDBOX: &str = "sandbox";
/// [`LABEL_KIND`] value of an application container.
pub const KIND_CONTAINER: &str = "container";
/// Pod name label (kubelet's key).
pub const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";
/// Pod namespace label.
pub const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
/// Pod uid label.
pub const LABEL_POD_UID: &str = "io.kubernetes.pod.uid";
/// Container name label.
pub const LABEL_CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// Sandbox id label on a container, to find a pod's containers in containerd.
pub const LABEL_SANDBOX_ID: &str = "io.kubernetes.sandbox.id";

/// Extension key of a sandbox's metadata.
pub const SANDBOX_EXTENSION: &str = "io.remora.sandbox.metadata";
/// Extension key of a container's metadata and status.
pub const CONTAINER_EXTENSION: &str = "io.remora.container.metadata";

/// The extension format version written now. Decoding refuses others, so an older remora
/// never misreads a newer record (it reports the record instead of guessing).
pub const EXTENSION_VERSION: &str = "v1";

/// A record that cannot be read back.
#[derive(Debug, Error)]
pub enum PersistError {
    /// Not JSON, or JSON of the wrong shape.
    #[error("malformed {kind} extension")]
    Malformed {
        /// `sandbox` or `container`.
        kind: &'static str,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
    /// A record of the other kind (a sandbox read as a container or the reverse).
    #[error("expected a {expected} extension, found kind {found:?}")]
    WrongKind {
        /// The kind asked for.
        expected: &'static str,
        /// The kind found.
        found: String,
    },
    /// Written by a remora with another format version.
    #[error("{kind} extension has unsupported version {found:?} (this remora reads {EXTENSION_VERSION:?})")]
    UnsupportedVersion {
        /// `sandbox` or `container`.
        kind: &'static str,
        /// The version found.
        found: String,
    },
}

/// How a type is stored on a containerd container record.
pub trait Persisted: Sized {
    /// Value of [`LABEL_KIND`].
    const KIND: &'static str;
    /// The labels for the containerd record.
    fn to_labels(&self) -> HashMap<String, String>;
    /// The extension bytes.
    fn encode_extension(&self) -> Vec<u8>;
    /// Reads extension bytes back.
    fn decode_extension(bytes: &[u8]) -> Result<Self, PersistError>;
}

fn base_labels(
    user: &HashMap<String, String>,
    kind: &str,
    pod_name: &str,
    pod_namespace: &str,
    pod_uid: &str,
) -> HashMap<String, String> {
    let mut labels = user.clone();
    for (k, v) in [
        (LABEL_KIND, kind),
        (LABEL_POD_NAME, pod_name),
        (LABEL_POD_NAMESPACE, pod_namespace),
        (LABEL_POD_UID, pod_uid),
    ] {
        labels.insert(k.to_string(), v.to_string());
    }
    labels
}

/// Only the version, read first so a newer format is reported as such rather than as
/// malformed.
#[derive(Deserialize)]
struct VersionProbe {
    version: String,
    #[serde(default)]
    kind: String,
}

fn check_version(kind: &'static str, bytes: &[u8]) -> Result<(), PersistError> {
    let probe: VersionProbe =
        serde_json::from_slice(bytes).map_err(|source| PersistError::Malformed { kind, source })?;
    if probe.version != EXTENSION_VERSION {
        return Err(PersistError::UnsupportedVersion {
            kind,
            found: probe.version,
        });
    }
    // Metadata fields default when absent (so adding one is not a format change), which
    // would let one kind's record decode as the other's: the kind is checked explicitly.
    if probe.kind != kind {
        return Err(PersistError::WrongKind {
            expected: kind,
            found: probe.kind,
        });
    }
    Ok(())
}

#[derive(Serialize)]
struct SandboxExtOut<'a> {
    version: &'static str,
    kind: &'static str,
    metadata: &'a SandboxMetadata,
}

#[derive(Deserialize)]
struct SandboxExtIn {
    metadata: SandboxMetadata,
}

#[derive(Serialize)]
struct ContainerExtOut<'a> {
    version: &'static str,
    kind: &'static str,
    metadata: &'a ContainerMetadata,
    status: &'a ContainerStatus,
}

#[derive(Deserialize)]
struct ContainerExtIn {
    metadata: ContainerMetadata,
    status: ContainerStatus,
}

fn to_json<T: Serialize>(value: &T) -> Vec<u8> {
    // Cannot fail: every map in these types has string keys, and no Serialize impl involved
    // (derived, base64, remote enums) returns an error.
    serde_json::to_vec(value).expect("store metadata serialises to JSON")
}

impl Persisted for SandboxMetadata {
    const KIND: &'static str = KIND_SANDBOX;

    fn to_labels(&self) -> HashMap<String, String> {
        base_labels(
            &self.labels,
            Self::KIND,
            &self.name,
            &self.namespace,
            &self.uid,
        )
    }

    fn encode_extension(&self) -> Vec<u8> {
        to_json(&SandboxExtOut {
            version: EXTENSION_VERSION,
            kind: Self::KIND,
            metadata: self,
        })
    }

    fn decode_extension(bytes: &[u8]) -> Result<Self, PersistError> {
        let kind = Self::KIND;
        check_version(kind, bytes)?;
        let ext: SandboxExtIn = serde_json::from_slice(bytes)
            .map_err(|source| PersistError::Malformed { kind, source })?;
        Ok(ext.metadata)
    }
}

impl Persisted for ContainerSnapshot {
    const KIND: &'static str = KIND_CONTAINER;

    fn to_labels(&self) -> HashMap<String, String> {
        let m = &self.metadata;
        let mut labels = base_labels(
            &m.labels,
            Self::KIND,
            &m.pod.name,
            &m.pod.namespace,
            &m.pod.uid,
        );
        labels.insert(LABEL_CONTAINER_NAME.to_string(), m.name.clone());
        labels.insert(LABEL_SANDBOX_ID.to_string(), m.sandbox_id.clone());
        labels
    }

    fn encode_extension(&self) -> Vec<u8> {
        to_json(&ContainerExtOut {
            version: EXTENSION_VERSION,
            kind: Self::KIND,
            metadata: &self.metadata,
            status: &self.status,
        })
    }

    fn decode_extension(bytes: &[u8]) -> Result<Self, PersistError> {
        let kind = Self::KIND;
        check_version(kind, bytes)?;
        let ext: ContainerExtIn = serde_json::from_slice(bytes)
            .map_err(|source| PersistError::Malformed { kind, source })?;
        Ok(ContainerSnapshot {
            metadata: Arc::new(ext.metadata),
            status: ext.status,
        })
    }
}

/// The labels for a record of `value` (see [`Persisted::to_labels`]).
pub fn to_labels<T: Persisted>(value: &T) -> HashMap<String, String> {
    value.to_labels()
}

/// The extension bytes for `value` (see [`Persisted::encode_extension`]).
pub fn encode_extension<T: Persisted>(value: &T) -> Vec<u8> {
    value.encode_extension()
}

/// Reads extension bytes back (see [`Persisted::decode_extension`]).
pub fn decode_extension<T: Persisted>(bytes: &[u8]) -> Result<T, PersistError> {
    T::decode_extension(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{
        IdMapping, MountPropagation, NamespaceMode, NamespaceOptions, UserNamespace,
    };
    use crate::store::container::{ContainerUser, ImageRefs, MountSummary, PodRef};
    use crate::store::status::ContainerState;

    fn sandbox() -> SandboxMetadata {
        SandboxMetadata {
            id: "a".repeat(64),
            name: "web".into(),
            namespace: "prod".into(),
            uid: "u-1".into(),
            attempt: 2,
            labels: [("app".to_string(), "web".to_string())].into(),
            annotations: [("note".to_string(), "x=y".to_string())].into(),
            runtime_handler: "runc".into(),
            created_at: 1_700_000_000_000_000_001,
            netns_path: "/run/remora/netns/cni-1".into(),
            ip: "10.0.0.5".into(),
            additional_ips: vec!["fd00::5".into()],
            hostname: "web-0".into(),
            log_directory: "/var/log/pods/prod_web_u-1".into(),
            namespace_options: NamespaceOptions {
                network: NamespaceMode::Node,
                pid: NamespaceMode::Container,
                ipc: NamespaceMode::Pod,
                user: None,
            },
            cgroup_parent: "/kubepods/pod-u-1".into(),
            config_json: br#"{"metadata":{"name":"web"}}"#.to_vec(),
            updated_resources: None,
            pinned_namespaces: false,
        }
    }

    fn container() -> ContainerSnapshot {
        let metadata = ContainerMetadata {
            id: "b".repeat(64),
            sandbox_id: "a".repeat(64),
            pod: PodRef {
                name: "web".into(),
                namespace: "prod".into(),
                uid: "u-1".into(),
            },
            name: "nginx".into(),
            attempt: 1,
            labels: [
                ("app".to_string(), "web".to_string()),
                // A CRI label colliding with a reserved key: the metadata value wins.
                (LABEL_POD_NAME.to_string(), "spoofed".to_string()),
            ]
            .into(),
            annotations: HashMap::new(),
            image: ImageRefs {
                requested: "sha256:cfg".into(),
                user_specified: "nginx:1".into(),
                id: "sha256:cfg".into(),
                reference: "docker.io/library/nginx@sha256:m".into(),
            },
            log_path: "/var/log/pods/x/nginx/1.log".into(),
            mounts: vec![
                MountSummary {
                    container_path: "/data".into(),
                    host_path: "/srv/data".into(),
                    readonly: true,
                    selinux_relabel: false,
                    propagation: MountPropagation::HostToContainer,
                    recursive_read_only: false,
                    image: String::new(),
                    image_ref: String::new(),
                    image_id: String::new(),
                    image_sub_path: String::new(),
                },
                MountSummary {
                    container_path: "/models".into(),
                    host_path: "/var/lib/remora/image-volumes/b/1-sub".into(),
                    readonly: true,
                    selinux_relabel: false,
                    propagation: MountPropagation::Private,
                    recursive_read_only: false,
                    image: "sha256:m0de1".into(),
                    image_ref: "registry.local/models@sha256:m".into(),
                    image_id: "sha256:m0de1".into(),
                    image_sub_path: "weights/v1".into(),
                },
            ],
            resources_json: br#"{"linux":{"cpu_shares":2}}"#.to_vec(),
            tty: true,
            stdin: true,
            stdin_once: false,
            user: Some(ContainerUser {
                uid: 1000,
                gid: 1000,
                supplemental_groups: vec![1000, 1234, 50000],
            }),
            stop_signal: "SIGRTMIN+3".into(),
            cdi_devices: vec!["vendor.example/gpu=0".into()],
        };
        let mut status = ContainerStatus::created(10);
        status.begin_start("b").unwrap();
        status.record_started("b", 77, 20).unwrap();
        status.mark_oom();
        let _ = status.record_exit(137, 30);
        ContainerSnapshot {
            metadata: Arc::new(metadata),
            status,
        }
    }

    #[test]
    fn sandbox_labels() {
        let labels = to_labels(&sandbox());
        assert_eq!(labels[LABEL_KIND], "sandbox");
        assert_eq!(labels[LABEL_POD_NAME], "web");
        assert_eq!(labels[LABEL_POD_NAMESPACE], "prod");
        assert_eq!(labels[LABEL_POD_UID], "u-1");
        assert_eq!(labels["app"], "web");
        assert!(!labels.contains_key(LABEL_SANDBOX_ID));
    }

    #[test]
    fn container_labels() {
        let labels = to_labels(&container());
        assert_eq!(labels[LABEL_KIND], "container");
        assert_eq!(
            labels[LABEL_POD_NAME], "web",
            "reserved keys win over CRI labels"
        );
        assert_eq!(labels[LABEL_CONTAINER_NAME], "nginx");
        assert_eq!(labels[LABEL_SANDBOX_ID], "a".repeat(64));
        assert_eq!(labels["app"], "web");
    }

    #[test]
    fn sandbox_round_trip() {
        let m = sandbox();
        let bytes = encode_extension(&m);
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["version"], "v1");
        assert_eq!(v["kind"], "sandbox");
        assert_eq!(v["metadata"]["namespace_options"]["network"], "NODE");
        assert_eq!(
            v["metadata"]["config_json"], "eyJtZXRhZGF0YSI6eyJuYW1lIjoid2ViIn19",
            "opaque bytes are base64"
        );
        assert_eq!(decode_extension::<SandboxMetadata>(&bytes).unwrap(), m);
        assert!(
            v["metadata"]["namespace_options"].get("user").is_none(),
            "no user namespace, no key: records stay as before user namespaces"
        );
    }

    #[test]
    fn a_pods_updated_resources_round_trip_and_older_records_have_none() {
        let mut m = sandbox();
        let v: serde_json::Value = serde_json::from_slice(&encode_extension(&m)).unwrap();
        assert!(
            v["metadata"].get("updated_resources").is_none(),
            "never updated: no key, records stay as before pod resize"
        );
        assert_eq!(
            decode_extension::<SandboxMetadata>(&serde_json::to_vec(&v).unwrap())
                .unwrap()
                .updated_resources,
            None
        );
        m.updated_resources = Some(crate::store::PodResources {
            overhead: None,
            resources: Some(crate::store::LinuxResources {
                cpu_shares: 512,
                memory_limit_in_bytes: 1 << 30,
                unified: [("memory.high".to_string(), "max".to_string())].into(),
                ..Default::default()
            }),
        });
        let bytes = encode_extension(&m);
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            v["metadata"]["updated_resources"],
            serde_json::json!({"resources": {
                "cpu_shares": 512,
                "memory_limit_in_bytes": 1_073_741_824_u64,
                "unified": {"memory.high": "max"}
            }}),
            "containerd's field names, zero fields left out"
        );
        assert_eq!(decode_extension::<SandboxMetadata>(&bytes).unwrap(), m);
    }

    #[test]
    fn a_pods_user_namespace_round_trips() {
        let mut m = sandbox();
        let map = |host_id| IdMapping {
            container_id: 0,
            host_id,
            length: 65536,
        };
        m.namespace_options.user = Some(UserNamespace {
            uids: map(100_000),
            gids: map(200_000),
        });
        let bytes = encode_extension(&m);
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            v["metadata"]["namespace_options"]["user"]["gids"]["host_id"],
            200_000
        );
        assert_eq!(decode_extension::<SandboxMetadata>(&bytes).unwrap(), m);
    }

    #[test]
    fn container_round_trip_keeps_status() {
        let c = container();
        let back: ContainerSnapshot = decode_extension(&encode_extension(&c)).unwrap();
        assert_eq!(back, c);
        assert_eq!(back.status.state, ContainerState::Exited);
        assert_eq!(back.status.reason, "OOMKilled");
    }

    #[test]
    fn a_container_record_from_before_stop_signals_reads() {
        let c = container();
        let mut v: serde_json::Value = serde_json::from_slice(&encode_extension(&c)).unwrap();
        assert_eq!(v["metadata"]["stop_signal"], "SIGRTMIN+3");
        v["metadata"].as_object_mut().unwrap().remove("stop_signal");
        let back: ContainerSnapshot = decode_extension(&serde_json::to_vec(&v).unwrap()).unwrap();
        assert_eq!(
            back.metadata.stop_signal, "",
            "none kept: looked up in the image"
        );
        assert_eq!(back.metadata.user, c.metadata.user);
        assert_eq!(back.status, c.status);
    }

    #[test]
    fn a_container_record_from_before_image_ids_and_sub_paths_reads() {
        let c = container();
        let mut v: serde_json::Value = serde_json::from_slice(&encode_extension(&c)).unwrap();
        let volume = v["metadata"]["mounts"][1].as_object_mut().unwrap();
        assert_eq!(volume["image_id"], "sha256:m0de1");
        volume.remove("image_id");
        volume.remove("image_sub_path");
        let back: ContainerSnapshot = decode_extension(&serde_json::to_vec(&v).unwrap()).unwrap();
        let m = &back.metadata.mounts[1];
        assert_eq!((m.image_id.as_str(), m.image_sub_path.as_str()), ("", ""));
        assert_eq!(m.image_ref, c.metadata.mounts[1].image_ref);
    }

    #[test]
    fn a_container_record_from_before_user_specified_images_reads() {
        let c = container();
        let mut v: serde_json::Value = serde_json::from_slice(&encode_extension(&c)).unwrap();
        assert_eq!(v["metadata"]["image"]["user_specified"], "nginx:1");
        v["metadata"]["image"]
            .as_object_mut()
            .unwrap()
            .remove("user_specified");
        let back: ContainerSnapshot = decode_extension(&serde_json::to_vec(&v).unwrap()).unwrap();
        assert_eq!(back.metadata.image.user_specified, "");
        assert_eq!(back.metadata.image.requested, c.metadata.image.requested);
    }

    #[test]
    fn unsupported_version() {
        let bytes = br#"{"version":"v9","metadata":{}}"#;
        match decode_extension::<SandboxMetadata>(bytes) {
            Err(PersistError::UnsupportedVersion { kind, found }) => {
                assert_eq!((kind, found.as_str()), ("sandbox", "v9"));
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn wrong_kind() {
        let sb = encode_extension(&sandbox());
        assert!(matches!(
            decode_extension::<ContainerSnapshot>(&sb),
            Err(PersistError::WrongKind {
                expected: "container",
                ..
            })
        ));
        let c = encode_extension(&container());
        assert!(matches!(
            decode_extension::<SandboxMetadata>(&c),
            Err(PersistError::WrongKind {
                expected: "sandbox",
                ..
            })
        ));
    }

    #[test]
    fn missing_fields_default() {
        let m: SandboxMetadata =
            decode_extension(br#"{"version":"v1","kind":"sandbox","metadata":{"id":"x"}}"#)
                .unwrap();
        assert_eq!(m.id, "x");
        assert_eq!(m.name, "");
    }

    #[test]
    fn malformed() {
        assert!(matches!(
            decode_extension::<ContainerSnapshot>(b"not json"),
            Err(PersistError::Malformed {
                kind: "container",
                ..
            })
        ));
        let bad_b64 = br#"{"version":"v1","kind":"sandbox","metadata":{"config_json":"!!"}}"#;
        assert!(matches!(
            decode_extension::<SandboxMetadata>(bad_b64),
            Err(PersistError::Malformed { .. })
        ));
    }
}
