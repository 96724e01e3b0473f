//! What each runtime handler's OCI runtime can really do, asked of the runtime itself
//! (`<runtime> features`, the OCI runtime-spec "features" document) once at start-up.
//!
//! Design: `RuntimeStatus.runtime_handlers[].features` tells kubelet and critest what a handler
//! supports, and kubelet relies on it (a pod asking for recursive read-only mounts is refused by
//! kubelet itself when the handler says no). So nothing is claimed blindly: a feature is true
//! only when the runtime's features document lists it *and* the kernel can do it, as
//! containerd's CRI decides (`internal/cri/server/status.go`, `rro` needs the `rro` mount
//! option and `mount_setattr(2)`, Linux 5.12). A runtime that cannot answer (crun 1.8 has no
//! `features` command, a missing binary) supports nothing optional. User namespaces need the
//! runtime to list the `user` namespace and idmapped mounts (`linux.mountExtensions.idmap`,
//! runc ≥ 1.2; Debian's runc 1.1.5 has none), which a user-namespaced pod's bind mounts carry,
//! and Linux 6.3: overlayfs over idmapped layers (5.19) is its rootfs (the overlayfs
//! snapshotter's `uidmap=`/`gidmap=` options), and idmapped tmpfs mounts (6.3) are its
//! `/dev/shm` (a tmpfs remora mounts on the host) and kubelet's secret and projected volumes.
//! On Debian 12's kernel 6.1 runc failed every such pod at create (`failed to set
//! MOUNT_ATTR_IDMAP on …/shm: invalid argument`); saying no lets kubelet refuse the pod
//! itself, with a message that names the reason.

use std::time::Duration;

use serde::Deserialize;
use thiserror::Error;

use crate::bounded::{output_within, Bounded};
use crate::lifecycle::handlers::HandlerFeatures;

/// Why a runtime's features could not be read.
#[derive(Debug, Error)]
pub enum FeaturesError {
    /// The runtime could not be run.
    #[error("cannot run {binary} features: {source}")]
    Spawn {
        /// The runtime binary.
        binary: String,
        /// The spawn error.
        #[source]
        source: std::io::Error,
    },
    /// It did not answer in time.
    #[error("{binary} features did not answer within {0:?}", PROBE_TIMEOUT)]
    Timeout {
        /// The runtime binary.
        binary: String,
    },
    /// It answered with an error (e.g. crun 1.8: "unknown command features").
    #[error("{binary} features failed ({status}): {stderr}")]
    Failed {
        /// The runtime binary.
        binary: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// What it printed on stderr (trimmed).
        stderr: String,
    },
    /// Its answer is not a features document.
    #[error("{binary} features printed no features document: {source}")]
    Parse {
        /// The runtime binary.
        binary: String,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
}

/// How long `<runtime> features` may take (it prints a constant document; runc answers in a
/// few milliseconds).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// The parts of the OCI features document remora reads.
#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct FeaturesDoc {
    mount_options: Vec<String>,
    linux: LinuxFeatures,
}

#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct LinuxFeatures {
    namespaces: Vec<String>,
    mount_extensions: MountExtensions,
}

#[derive(Debug, Deserialize, Default)]
#[serde(default)]
struct MountExtensions {
    idmap: IdmapFeature,
}

#[derive(Debug, Deserialize, Default)]
#[serde(default)]
struct IdmapFeature {
    /// `null` (unknown) counts as no.
    enabled: Option<bool>,
}

/// Linux 6.3: tmpfs accepts idmapped mounts (overlayfs accepts idmapped lower layers since
/// 5.19).
const USERNS_KERNEL: (u32, u32) = (6, 3);

/// The features a runtime's features document (`json`) and this kernel (`kernel`, major and
/// minor) allow.
pub fn from_document(
    json: &[u8],
    kernel: (u32, u32),
) -> Result<HandlerFeatures, serde_json::Error> {
    let doc: FeaturesDoc = serde_json::from_slice(json)?;
    Ok(HandlerFeatures {
        recursive_read_only_mounts: doc.mount_options.iter().any(|o| o == "rro")
            && kernel >= (5, 12),
        user_namespaces: doc.linux.namespaces.iter().any(|n| n == "user")
            && doc.linux.mount_extensions.idmap.enabled == Some(true)
            && kernel >= USERNS_KERNEL,
    })
}

/// Runs `<binary> features` and reads its answer. `binary` is a name looked up on `PATH` or a
/// path.
pub async fn probe(binary: &str, kernel: (u32, u32)) -> Result<HandlerFeatures, FeaturesError> {
    // Bounded, and killed with its process group past the bound (see `output_within`).
    let out = output_within(
        tokio::process::Command::new(binary).arg("features"),
        PROBE_TIMEOUT,
    )
    .await
    .map_err(|e| match e {
        Bounded::TimedOut => FeaturesError::Timeout {
            binary: binary.to_string(),
        },
        Bounded::Io(source) => FeaturesError::Spawn {
            binary: binary.to_string(),
            source,
        },
    })?;
    if !out.status.success() {
        return Err(FeaturesError::Failed {
            binary: binary.to_string(),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    from_document(&out.stdout, kernel).map_err(|source| FeaturesError::Parse {
        binary: binary.to_string(),
        source,
    })
}

/// This kernel's major and minor version, from `uname -r` (`6.1.0-18-amd64` → `(6, 1)`);
/// `(0, 0)` if it cannot be read, which enables no kernel-dependent feature.
pub fn kernel_version() -> (u32, u32) {
    nix::sys::utsname::uname()
        .ok()
        .and_then(|u| parse_kernel_release(&u.release().to_string_lossy()))
        .unwrap_or((0, 0))
}

fn parse_kernel_release(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(['.', '-', '+']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// The OCI runtime a handler's shim runs: its configured binary, else `runc` (both shims'
/// default). A relative name is looked up on `PATH`, as the shim does.
pub fn runtime_binary(binary_name: Option<&str>) -> &str {
    match binary_name {
        Some(b) if !b.is_empty() => b,
        _ => "runc",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUNC_115: &str = r#"{"ociVersionMin":"1.0.0","ociVersionMax":"1.0.2-dev",
        "mountOptions":["bind","ro","rro","rbind","rprivate"],
        "linux":{"namespaces":["user"]}}"#;

    /// runc 1.5.3's answer, abridged.
    const RUNC_153: &str = r#"{"ociVersionMin":"1.0.0","ociVersionMax":"1.3.0",
        "mountOptions":["bind","ro","rro","rbind","rprivate"],
        "linux":{"namespaces":["cgroup","ipc","mount","network","pid","time","user","uts"],
            "mountExtensions":{"idmap":{"enabled":true}}}}"#;

    #[test]
    fn user_namespaces_need_userns_idmapped_mounts_and_linux_6_3() {
        let f = from_document(RUNC_153.as_bytes(), (6, 18)).unwrap();
        assert!(f.user_namespaces && f.recursive_read_only_mounts);
        assert!(
            from_document(RUNC_153.as_bytes(), (6, 3))
                .unwrap()
                .user_namespaces
        );
        // Debian 12's 6.1: no idmapped tmpfs (the pod's /dev/shm), so no user namespaces.
        for kernel in [(6, 1), (5, 19), (5, 18)] {
            assert!(
                !from_document(RUNC_153.as_bytes(), kernel)
                    .unwrap()
                    .user_namespaces,
                "{kernel:?}"
            );
        }
        // runc 1.1.5 lists the user namespace but has no idmapped mounts.
        assert!(
            !from_document(RUNC_115.as_bytes(), (6, 18))
                .unwrap()
                .user_namespaces
        );
        let no_userns = RUNC_153.replace(r#""time","user","uts""#, r#""time","uts""#);
        assert!(
            !from_document(no_userns.as_bytes(), (6, 18))
                .unwrap()
                .user_namespaces
        );
        for idmap in [r#"{"enabled":false}"#, r#"{"enabled":null}"#, "{}"] {
            let doc = RUNC_153.replace(r#"{"enabled":true}"#, idmap);
            assert!(
                !from_document(doc.as_bytes(), (6, 18))
                    .unwrap()
                    .user_namespaces,
                "{idmap}"
            );
        }
    }

    #[test]
    fn rro_needs_the_option_and_linux_5_12() {
        let f = from_document(RUNC_115.as_bytes(), (6, 18)).unwrap();
        assert!(f.recursive_read_only_mounts);
        let old_kernel = from_document(RUNC_115.as_bytes(), (5, 11)).unwrap();
        assert!(!old_kernel.recursive_read_only_mounts);
        let no_rro = from_document(br#"{"mountOptions":["ro","rbind"]}"#, (6, 1)).unwrap();
        assert!(!no_rro.recursive_read_only_mounts);
        let empty = from_document(b"{}", (6, 1)).unwrap();
        assert_eq!(empty, HandlerFeatures::default());
        assert!(from_document(b"unknown command features", (6, 1)).is_err());
    }

    #[test]
    fn kernel_releases_parse() {
        assert_eq!(parse_kernel_release("6.1.0-18-amd64"), Some((6, 1)));
        assert_eq!(parse_kernel_release("6.18.44-fc-v857"), Some((6, 18)));
        assert_eq!(parse_kernel_release("5.12+"), Some((5, 12)));
        assert_eq!(parse_kernel_release("garbage"), None);
        assert_ne!(kernel_version(), (0, 0), "uname works on the test machines");
    }

    #[test]
    fn the_default_runtime_is_runc() {
        assert_eq!(runtime_binary(None), "runc");
        assert_eq!(runtime_binary(Some("")), "runc");
        assert_eq!(runtime_binary(Some("crun")), "crun");
    }

    #[tokio::test]
    async fn probing_a_runtime_that_cannot_answer_is_an_error_not_a_claim() {
        let missing = probe("/nonexistent/remora-test-runtime", (6, 1)).await;
        assert!(
            matches!(missing, Err(FeaturesError::Spawn { .. })),
            "{missing:?}"
        );
        // `false features` exits 1: a runtime without the command.
        let failed = probe("false", (6, 1)).await;
        assert!(
            matches!(failed, Err(FeaturesError::Failed { .. })),
            "{failed:?}"
        );
        // `echo features` prints "features": not a document.
        let garbage = probe("echo", (6, 1)).await;
        assert!(
            matches!(garbage, Err(FeaturesError::Parse { .. })),
            "{garbage:?}"
        );
    }
}
