//! Where the shared test bed and the tools live, and the mount helpers: what both the fixtures
//! (`harness`) and the leak sweep (`sweep`) need, so neither has to name the other for it.

use std::path::{Path, PathBuf};

/// Where setup.sh installs containerd, crictl and critest.
pub fn tools_bin() -> PathBuf {
    let dir = std::env::var_os("REMORA_TOOLS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/remora-tools"));
    dir.join("bin")
}

/// The shared test bed (`scripts/testbed.sh up`): its containerd socket.
pub const TESTBED_CONTAINERD: &str = "/run/remora-testbed/containerd.sock";
/// The test bed's hosts.toml directory (public names → local registry).
pub const TESTBED_CERTS: &str = "/var/lib/remora-testbed/certs.d";
/// The test bed's CNI conf dir (bridge + portmap + firewall).
pub const TESTBED_CNI: &str = "/var/lib/remora-testbed/cni/net.d";
/// The test bed registry.
pub const TESTBED_REGISTRY: &str = "127.0.0.1:5000";
/// The registry's access log.
pub const TESTBED_REGISTRY_LOG: &str = "/var/lib/remora-testbed/logs/registry.log";

/// Every mount point of this process (from /proc/self/mountinfo), in mount order.
pub fn mount_points() -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(str::to_string)
        .collect()
}

/// The mount points at or below `dir`, in mount order.
pub fn mount_points_under(dir: &Path) -> Vec<String> {
    let prefix = dir.to_string_lossy().to_string();
    mount_points()
        .into_iter()
        .filter(|mp| mp.starts_with(&prefix))
        .collect()
}

/// Lazily unmounts `points`, deepest first (a parent never goes before what is below it).
pub fn unmount_deepest_first(mut points: Vec<String>) {
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in points {
        let _ = nix::mount::umount2(p.as_str(), nix::mount::MntFlags::MNT_DETACH);
    }
}

/// Lazily unmounts every mount below `dir` (pod netns dirs, shm tmpfs, netns bind mounts that
/// a test's remora made), deepest first, so removing the scratch dir cannot leak mounts.
pub fn unmount_below(dir: &Path) {
    unmount_deepest_first(mount_points_under(dir));
}
