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
    let cgroups = cgroup_facts(
        Path::new(CGROUP_ROOT),
        &std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default(),
    );
    HostFacts {
        apparmor_enabled: read("/sys/module/apparmor/parameters/enabled").as_deref() == Some("Y"),
        // Without CAP_SYS_RESOURCE runc cannot set a lower value than ours.
        min_oom_score_adj: read("/proc/self/oom_score_adj")
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
        swap_accounting: cgroups.swap_accounting,
        hugetlb_available: cgroups.hugetlb,
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

/// Where the cgroup filesystems are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// What the cgroup hierarchy offers container specs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CgroupFacts {
    /// The hugetlb controller is there, so hugepage limits can be applied.
    pub hugetlb: bool,
    /// The memory controller accounts swap, so a swap limit can be set.
    pub swap_accounting: bool,
}

/// The hugetlb and swap facts of the cgroup hierarchy mounted at `root` (`/sys/fs/cgroup`),
/// as containerd's CRI (`isHugetlbControllerPresent`, `SwapControllerAvailable`) and kubelet
/// (`checkSwapControllerAvailability`) read them:
///
/// - cgroup v2 (`root` is the unified hierarchy: it has `cgroup.controllers`): hugetlb when
///   the root's `cgroup.controllers` lists it; swap when `memory.swap.max` exists in this
///   process's own cgroup (`self_cgroup`, the text of `/proc/self/cgroup`), the root having
///   none. A process in the root cgroup (no systemd) looks in the root's child cgroups
///   instead: any of them with `memory.swap.max` says the kernel accounts swap.
/// - cgroup v1, hybrid included (a tmpfs of per-controller mounts, `unified` beside them
///   with no controllers of these two): hugetlb when the `hugetlb` hierarchy is mounted; swap
///   when the memory hierarchy has `memory.memsw.limit_in_bytes`.
pub fn cgroup_facts(root: &Path, self_cgroup: &str) -> CgroupFacts {
    let controllers = root.join("cgroup.controllers");
    if controllers.exists() {
        let hugetlb = std::fs::read_to_string(&controllers)
            .map(|c| c.split_whitespace().any(|name| name == "hugetlb"))
            .unwrap_or(false);
        return CgroupFacts {
            hugetlb,
            swap_accounting: v2_swap_accounting(root, self_cgroup),
        };
    }
    CgroupFacts {
        hugetlb: root.join("hugetlb").is_dir(),
        swap_accounting: root.join("memory/memory.memsw.limit_in_bytes").exists(),
    }
}

/// cgroup v2 swap accounting: `memory.swap.max` in our own cgroup, else (in the root cgroup,
/// which has none, or one whose path is not below the root) in one of the root's children.
fn v2_swap_accounting(root: &Path, self_cgroup: &str) -> bool {
    let own = self_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim().trim_start_matches('/'))
        // Inside a cgroup namespace the path may climb out of it (`/../..`): not ours to follow.
        .filter(|p| !p.is_empty() && !p.split('/').any(|c| c == ".."));
    if let Some(own) = own {
        return root.join(own).join("memory.swap.max").exists();
    }
    std::fs::read_dir(root)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .any(|p| p.join("memory.swap.max").exists())
        })
        .unwrap_or(false)
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

    /// A fake cgroup hierarchy under a temporary directory: `dirs` made, `files` written.
    fn tree(dirs: &[&str], files: &[(&str, &str)]) -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        for d in dirs {
            std::fs::create_dir_all(t.path().join(d)).unwrap();
        }
        for (f, text) in files {
            let p = t.path().join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        t
    }

    #[test]
    fn cgroup_v2_facts_come_from_the_unified_hierarchy() {
        let t = tree(
            &[],
            &[
                (
                    "cgroup.controllers",
                    "cpuset cpu io memory hugetlb pids rdma misc\n",
                ),
                ("remora.slice/memory.swap.max", "max\n"),
            ],
        );
        let facts = cgroup_facts(t.path(), "0::/remora.slice\n");
        assert_eq!(
            facts,
            CgroupFacts {
                hugetlb: true,
                swap_accounting: true
            }
        );
        // In the root cgroup (no systemd): a child cgroup's memory.swap.max says it.
        assert!(cgroup_facts(t.path(), "0::/\n").swap_accounting);
        // Without swap accounting or the hugetlb controller.
        let t = tree(
            &["kubepods"],
            &[("cgroup.controllers", "cpuset cpu io memory pids\n")],
        );
        assert_eq!(cgroup_facts(t.path(), "0::/\n"), CgroupFacts::default());
        assert!(!cgroup_facts(t.path(), "0::/kubepods\n").swap_accounting);
    }

    #[test]
    fn cgroup_v1_and_hybrid_facts_come_from_the_controller_hierarchies() {
        let v1 = tree(
            &["hugetlb", "cpu"],
            &[(
                "memory/memory.memsw.limit_in_bytes",
                "9223372036854771712\n",
            )],
        );
        let own = "12:hugetlb:/\n5:memory:/\n0::/\n";
        assert_eq!(
            cgroup_facts(v1.path(), own),
            CgroupFacts {
                hugetlb: true,
                swap_accounting: true
            }
        );
        // Hybrid, as on this project's test bed: the unified hierarchy has no controllers of
        // its own, hugetlb is not mounted and memory has no swap accounting.
        let hybrid = tree(
            &["cpu", "memory"],
            &[
                ("unified/cgroup.controllers", ""),
                ("unified/memory.swap.max", ""),
            ],
        );
        assert_eq!(cgroup_facts(hybrid.path(), own), CgroupFacts::default());
    }

    #[test]
    fn hugepage_limits_reach_the_spec_on_cgroup_v2() {
        let t = tree(&[], &[("cgroup.controllers", "cpu memory hugetlb pids\n")]);
        let facts = cgroup_facts(t.path(), "0::/\n");
        let host = HostFacts {
            hugetlb_available: facts.hugetlb,
            swap_accounting: facts.swap_accounting,
            ..HostFacts::default()
        };
        let r = crate::spec::Resources {
            hugepage_limits: vec![crate::spec::types::HugepageLimit {
                page_size: "2MB".into(),
                limit: 4 << 20,
            }],
            ..Default::default()
        };
        let res = crate::spec::resources::linux_resources(&r, &host).unwrap();
        let limits = res
            .hugepage_limits()
            .as_ref()
            .expect("hugepage limits kept");
        assert_eq!(
            limits
                .iter()
                .map(|h| (h.page_size().as_str(), h.limit()))
                .collect::<Vec<_>>(),
            [("2MB", 4 << 20)]
        );
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
