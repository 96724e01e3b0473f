//! Facts about this host that container specs depend on, read once at start.

use std::path::Path;

use crate::spec::types::HostFacts;
use crate::spec::CgroupDriver;

/// Reads [`HostFacts`] from /proc and /sys; the cgroup driver is the configured one (kubelet
/// is told it, and must use the same).
pub fn host_facts(cgroup_driver: CgroupDriver) -> HostFacts {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
    };
    HostFacts {
        apparmor_enabled: read("/sys/module/apparmor/parameters/enabled").as_deref() == Some("Y"),
        // Without CAP_SYS_RESOURCE runc cannot set a lower value than ours.
        min_oom_score_adj: read("/proc/self/oom_score_adj")
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
        swap_accounting: std::path::Path::new("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes")
            .exists(),
        hugetlb_available: std::path::Path::new("/sys/fs/cgroup/hugetlb").exists(),
        cap_last_cap: read("/proc/sys/kernel/cap_last_cap")
            .and_then(|s| s.parse().ok())
            .unwrap_or(40),
        bounding_caps: std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|st| {
                st.lines()
                    .find_map(|l| l.strip_prefix("CapBnd:"))
                    .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            })
            .unwrap_or(u64::MAX),
        node_hostname: nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_default(),
        cgroup_driver,
    }
}

/// Makes `path` usable as a bind mount source, by containerd's rule (`WithMounts` in its CRI
/// plugin): a source that does not exist is created as a directory; one that exists — a
/// regular file (kubelet mounts `/etc/hosts` and `/dev/termination-log` as files), a
/// directory, a socket, a device, or a symlink to any of them — is used as it is.
///
/// A symlink whose target is missing is refused rather than "created": creating a directory
/// in its place would need to replace the link, which is not ours to do.
pub fn ensure_bind_source(path: &Path) -> std::io::Result<()> {
    match std::fs::metadata(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if std::fs::symlink_metadata(path).is_ok() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "it is a symlink whose target does not exist",
                ));
            }
            std::fs::create_dir_all(path)
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileTypeExt;

    #[test]
    fn bind_sources_that_exist_are_used_as_they_are() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("etc-hosts");
        std::fs::write(&file, "127.0.0.1 localhost\n").unwrap();
        let sub = dir.path().join("data");
        std::fs::create_dir(&sub).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let sock_path = dir.path().join("sock");
        let _sock = std::os::unix::net::UnixListener::bind(&sock_path).unwrap();
        for p in [&file, &sub, &link, &sock_path, Path::new("/dev/null")] {
            ensure_bind_source(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        }
        // Nothing was replaced or created in their place.
        assert_eq!(
            std::fs::read_to_string(&file).unwrap(),
            "127.0.0.1 localhost\n"
        );
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert!(std::fs::metadata(&sock_path)
            .unwrap()
            .file_type()
            .is_socket());
    }

    #[test]
    fn a_missing_bind_source_is_created_as_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("a/b/c");
        ensure_bind_source(&missing).unwrap();
        assert!(missing.is_dir());
    }

    #[test]
    fn a_dangling_symlink_is_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("dangling");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &link).unwrap();
        let err = ensure_bind_source(&link).unwrap_err();
        assert!(err.to_string().contains("symlink"), "{err}");
        assert!(!dir.path().join("nowhere").exists());
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
    }

    #[test]
    fn reads_this_host() {
        let f = host_facts(CgroupDriver::Systemd);
        assert_eq!(f.cgroup_driver, CgroupDriver::Systemd, "the configured one");
        assert!(f.cap_last_cap >= 36, "cap_last_cap {}", f.cap_last_cap);
        assert!(!f.node_hostname.is_empty());
        let ours: i32 = std::fs::read_to_string("/proc/self/oom_score_adj")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(f.min_oom_score_adj, ours);
    }
}
