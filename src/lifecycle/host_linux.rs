//! Facts about this host that container specs depend on, read once at start.

use crate::spec::types::HostFacts;

/// Reads [`HostFacts`] from /proc and /sys.
pub fn host_facts() -> HostFacts {
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_host() {
        let f = host_facts();
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
