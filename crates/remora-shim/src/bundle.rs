//! What the shim reads from and writes to a container's bundle: the OCI config's pid
//! namespace and whether it is a pod holder's, and its own records (the runtime options and the init process's exit) that
//! `delete` reads after the shim died.

use std::path::Path;

use remora_host::POD_HOLDER_ANNOTATION;

use crate::error::ShimError;

/// The shim's record of a container's runtime options, for `delete` after the shim died.
pub(crate) const OPTIONS_FILE: &str = "remora-shim-options.json";
/// The init process's exit, for `delete` after the shim died.
pub(crate) const EXIT_FILE: &str = "remora-shim-exit.json";

/// An init process's exit as recorded in its bundle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExitRecord {
    /// The pid.
    pub pid: u32,
    /// Exit code, or 128 + signal.
    pub status: u32,
    /// When, in nanoseconds since the epoch.
    pub exited_at_ns: i64,
    /// Whether the kernel OOM-killed a process of the container.
    pub oom_killed: bool,
}

/// Whether the spec is a pod holder's: [`POD_HOLDER_ANNOTATION`] set to `"true"` and no
/// `process`. Both, so a container whose annotations someone let through still runs its
/// process: a spec with a process is never a holder.
pub(crate) fn is_pod_holder(config_json: &[u8]) -> bool {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(config_json) else {
        return false;
    };
    v.pointer("/annotations")
        .and_then(|a| a.get(POD_HOLDER_ANNOTATION))
        .and_then(|h| h.as_str())
        == Some("true")
        && v.get("process").is_none_or(|p| p.is_null())
}

/// Whether the spec gives the container a pid namespace of its own (no `path`: a new one).
pub(crate) fn has_own_pid_namespace(config_json: &[u8]) -> bool {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(config_json) else {
        return true;
    };
    v.pointer("/linux/namespaces")
        .and_then(|n| n.as_array())
        .map(|ns| {
            ns.iter().any(|n| {
                n.get("type").and_then(|t| t.as_str()) == Some("pid")
                    && n.get("path")
                        .and_then(|p| p.as_str())
                        .unwrap_or("")
                        .is_empty()
            })
        })
        .unwrap_or(false)
}

pub(crate) fn read_file(path: &Path) -> Result<Vec<u8>, ShimError> {
    std::fs::read(path).map_err(|source| ShimError::BundleFile {
        path: path.display().to_string(),
        source,
    })
}

pub(crate) fn write_json<T: serde::Serialize>(path: &Path, value: &T) -> Result<(), ShimError> {
    let bytes = serde_json::to_vec(value).map_err(|e| ShimError::BundleFile {
        path: path.display().to_string(),
        source: std::io::Error::other(e),
    })?;
    std::fs::write(path, bytes).map_err(|source| ShimError::BundleFile {
        path: path.display().to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_process_less_spec_with_the_annotation_is_a_pod_holder() {
        assert!(is_pod_holder(
            br#"{"annotations":{"dev.remora.pod-holder":"true"}}"#
        ));
        assert!(is_pod_holder(
            br#"{"process":null,"annotations":{"dev.remora.pod-holder":"true"}}"#
        ));
        // A process runs whatever its annotations say.
        assert!(!is_pod_holder(
            br#"{"process":{"args":["sh"]},"annotations":{"dev.remora.pod-holder":"true"}}"#
        ));
        assert!(!is_pod_holder(
            br#"{"annotations":{"dev.remora.pod-holder":"yes"}}"#
        ));
        assert!(!is_pod_holder(br#"{"annotations":{}}"#));
        assert!(!is_pod_holder(b"not json"));
    }

    #[test]
    fn kill_all_on_exit_only_without_an_own_pid_namespace() {
        let own = br#"{"linux":{"namespaces":[{"type":"pid"},{"type":"mount"}]}}"#;
        let shared = br#"{"linux":{"namespaces":[{"type":"pid","path":"/proc/1/ns/pid"}]}}"#;
        let host = br#"{"linux":{"namespaces":[{"type":"mount"}]}}"#;
        assert!(has_own_pid_namespace(own));
        assert!(!has_own_pid_namespace(shared));
        assert!(!has_own_pid_namespace(host));
    }

    #[test]
    fn exit_records_round_trip_through_the_bundle() {
        let dir = tempfile::tempdir().unwrap();
        let r = ExitRecord {
            pid: 42,
            status: 137,
            exited_at_ns: 7,
            oom_killed: true,
        };
        write_json(&dir.path().join(EXIT_FILE), &r).unwrap();
        let back: ExitRecord =
            serde_json::from_slice(&std::fs::read(dir.path().join(EXIT_FILE)).unwrap()).unwrap();
        assert_eq!(back, r);
    }
}
