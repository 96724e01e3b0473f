use std::collections::BTreeMap;
use std::path::PathBuf;

use super::*;

/// A pure cgroup v1 host (systemd "legacy"): cpu and cpuacct co-mounted, a named systemd
/// hierarchy, no cgroup2 mount.
const V1_PROC: &str = "\
12:hugetlb:/kubepods/besteffort/pod1/abc
11:memory:/kubepods/besteffort/pod1/abc
10:cpu,cpuacct:/kubepods/besteffort/pod1/abc
9:pids:/kubepods/besteffort/pod1/abc
8:blkio:/kubepods/besteffort/pod1/abc
7:net_cls,net_prio:/kubepods/besteffort/pod1/abc
1:name=systemd:/kubepods/besteffort/pod1/abc
0::/
";

const V1_MOUNTINFO: &str = "\
22 28 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
25 22 0:23 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
26 25 0:24 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:10 - cgroup cgroup rw,xattr,name=systemd
29 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:13 - cgroup cgroup rw,cpu,cpuacct
30 25 0:28 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,memory
31 25 0:29 / /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,pids
32 25 0:30 / /sys/fs/cgroup/blkio rw,nosuid,nodev,noexec,relatime shared:16 - cgroup cgroup rw,blkio
33 25 0:31 / /sys/fs/cgroup/net_cls,net_prio rw,nosuid,nodev,noexec,relatime shared:17 - cgroup cgroup rw,net_cls,net_prio
34 25 0:32 / /sys/fs/cgroup/hugetlb rw,nosuid,nodev,noexec,relatime shared:18 - cgroup cgroup rw,hugetlb
";

/// This test bed: cgroup v1 controllers, each on its own mount, plus a controller-less cgroup2.
const HYBRID_PROC: &str = "\
9:name=systemd:/
8:pids:/
7:blkio:/
6:freezer:/
5:devices:/
4:memory:/process_api/25ec212563aa06c32afaaae19219a61e
3:cpuset:/
2:cpuacct:/
1:cpu:/
0::/
";

const HYBRID_MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

const V2_MOUNTINFO: &str = "\
24 30 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";

fn v1_map(entries: &[(&str, &str)]) -> BTreeMap<String, PathBuf> {
    entries
        .iter()
        .map(|(k, v)| (k.to_string(), PathBuf::from(v)))
        .collect()
}

#[test]
fn pure_v1_with_joint_mount_and_named_hierarchy() {
    let ctr = "kubepods/besteffort/pod1/abc";
    let got = Cgroup::from_proc(V1_PROC, V1_MOUNTINFO).unwrap();
    let want = v1_map(&[
        ("blkio", &format!("/sys/fs/cgroup/blkio/{ctr}")),
        ("cpu", &format!("/sys/fs/cgroup/cpu,cpuacct/{ctr}")),
        ("cpuacct", &format!("/sys/fs/cgroup/cpu,cpuacct/{ctr}")),
        ("hugetlb", &format!("/sys/fs/cgroup/hugetlb/{ctr}")),
        ("memory", &format!("/sys/fs/cgroup/memory/{ctr}")),
        ("net_cls", &format!("/sys/fs/cgroup/net_cls,net_prio/{ctr}")),
        (
            "net_prio",
            &format!("/sys/fs/cgroup/net_cls,net_prio/{ctr}"),
        ),
        ("pids", &format!("/sys/fs/cgroup/pids/{ctr}")),
    ]);
    assert_eq!(got, Cgroup::V1(want));
}

#[test]
fn pure_v2_nested_cgroup() {
    let proc = "0::/kubepods.slice/kubepods-besteffort.slice/cri-containerd-abc.scope\n";
    let got = Cgroup::from_proc(proc, V2_MOUNTINFO).unwrap();
    assert_eq!(
        got,
        Cgroup::V2(PathBuf::from(
            "/sys/fs/cgroup/kubepods.slice/kubepods-besteffort.slice/cri-containerd-abc.scope"
        ))
    );
}

#[test]
fn v2_root_cgroup_is_the_mount_point() {
    let got = Cgroup::from_proc("0::/\n", V2_MOUNTINFO).unwrap();
    assert_eq!(got, Cgroup::V2(PathBuf::from("/sys/fs/cgroup")));
}

#[test]
fn hybrid_is_v1_and_ignores_the_unified_mount() {
    let got = Cgroup::from_proc(HYBRID_PROC, HYBRID_MOUNTINFO).unwrap();
    let want = v1_map(&[
        ("blkio", "/sys/fs/cgroup/blkio"),
        ("cpu", "/sys/fs/cgroup/cpu"),
        ("cpuacct", "/sys/fs/cgroup/cpuacct"),
        ("cpuset", "/sys/fs/cgroup/cpuset"),
        ("devices", "/sys/fs/cgroup/devices"),
        ("freezer", "/sys/fs/cgroup/freezer"),
        (
            "memory",
            "/sys/fs/cgroup/memory/process_api/25ec212563aa06c32afaaae19219a61e",
        ),
        ("pids", "/sys/fs/cgroup/pids"),
    ]);
    assert_eq!(got, Cgroup::V1(want));
}

#[test]
fn hybrid_with_only_a_named_v1_hierarchy_is_v2() {
    // systemd's "hybrid" mode with every controller on the unified hierarchy.
    let proc = "1:name=systemd:/system.slice/x.service\n0::/system.slice/x.service\n";
    let mountinfo = "\
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    let got = Cgroup::from_proc(proc, mountinfo).unwrap();
    assert_eq!(
        got,
        Cgroup::V2(PathBuf::from(
            "/sys/fs/cgroup/unified/system.slice/x.service"
        ))
    );
}

#[test]
fn mount_root_other_than_slash() {
    // Inside a container: the memory hierarchy is mounted from the container's own cgroup.
    let mountinfo = "\
1204 1198 0:28 /kubepods/pod1/abc /sys/fs/cgroup/memory ro,nosuid,nodev,noexec,relatime master:14 - cgroup cgroup rw,memory
";
    let nested = Cgroup::from_proc("11:memory:/kubepods/pod1/abc/child\n", mountinfo).unwrap();
    assert_eq!(
        nested,
        Cgroup::V1(v1_map(&[("memory", "/sys/fs/cgroup/memory/child")]))
    );
    let same = Cgroup::from_proc("11:memory:/kubepods/pod1/abc\n", mountinfo).unwrap();
    assert_eq!(
        same,
        Cgroup::V1(v1_map(&[("memory", "/sys/fs/cgroup/memory")]))
    );
    // A sibling whose name merely starts with the root's is not under it.
    let sibling = Cgroup::from_proc("11:memory:/kubepods/pod1/abcdef\n", mountinfo);
    assert!(
        matches!(sibling, Err(LocateError::NotUnderMount { ref path, .. }) if path == "/kubepods/pod1/abcdef"),
        "{sibling:?}"
    );

    let v2_mountinfo = "35 24 0:30 /a /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
    let v2 = Cgroup::from_proc("0::/a/b/c\n", v2_mountinfo).unwrap();
    assert_eq!(v2, Cgroup::V2(PathBuf::from("/sys/fs/cgroup/b/c")));
}

#[test]
fn bind_mount_that_shows_the_path_wins() {
    // The same hierarchy mounted twice: a subtree elsewhere and the whole tree.
    let mountinfo = "\
50 25 0:28 /other /mnt/other rw - cgroup cgroup rw,memory
30 25 0:28 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
";
    let got = Cgroup::from_proc("4:memory:/a\n", mountinfo).unwrap();
    assert_eq!(
        got,
        Cgroup::V1(v1_map(&[("memory", "/sys/fs/cgroup/memory/a")]))
    );
}

#[test]
fn escaped_mount_point() {
    let mountinfo = "30 25 0:28 / /mnt/my\\040cgroups rw - cgroup cgroup rw,memory\n";
    let got = Cgroup::from_proc("4:memory:/a\n", mountinfo).unwrap();
    assert_eq!(got, Cgroup::V1(v1_map(&[("memory", "/mnt/my cgroups/a")])));
    // A backslash before non-octal (even multi-byte) text is kept as it is.
    assert_eq!(unescape("a\\é\\12"), "a\\é\\12");
    assert_eq!(unescape("x\\134y"), "x\\y");
}

#[test]
fn malformed_lines_are_errors() {
    for proc in [
        "garbage\n",
        "x:memory:/a\n",
        "4:memory\n",
        "4:memory:relative\n",
        "4::/a\n",
    ] {
        let got = Cgroup::from_proc(proc, V1_MOUNTINFO);
        assert!(
            matches!(got, Err(LocateError::Malformed { file, .. }) if file == PROC_CGROUP),
            "{proc:?}: {got:?}"
        );
    }
    let got = Cgroup::from_proc(V1_PROC, "30 25 0:28 / /sys/fs/cgroup/memory rw cgroup\n");
    assert!(
        matches!(got, Err(LocateError::Malformed { file, .. }) if file == MOUNTINFO),
        "{got:?}"
    );
    let got = Cgroup::from_proc(V1_PROC, "30 25 0:28 / - cgroup cgroup rw,memory\n");
    assert!(matches!(got, Err(LocateError::Malformed { .. })), "{got:?}");
}

#[test]
fn nothing_mounted_is_no_mount() {
    let mountinfo = "22 28 0:21 / /sys rw,nosuid - sysfs sysfs rw\n";
    let got = Cgroup::from_proc(V1_PROC, mountinfo);
    assert!(matches!(got, Err(LocateError::NoMount)), "{got:?}");
    let got = Cgroup::from_proc("", V1_MOUNTINFO);
    assert!(matches!(got, Err(LocateError::NoMount)), "{got:?}");
}

#[test]
fn this_hosts_hierarchy_is_this_process_cgroups() {
    let own = Cgroup::of_pid(std::process::id()).unwrap();
    assert_eq!(Hierarchy::of_host(), own.hierarchy());
}

#[test]
fn proc_cgroup_lines() {
    assert_eq!(
        ProcCgroupLine::parse("0::/a/b"),
        Some(ProcCgroupLine::Unified("/a/b"))
    );
    let cpu = ProcCgroupLine::parse("4:cpu,cpuacct:/x").unwrap();
    assert_eq!(
        cpu,
        ProcCgroupLine::V1 {
            names: vec!["cpu", "cpuacct"],
            path: "/x"
        }
    );
    assert!(cpu.has_controller());
    assert!(!ProcCgroupLine::parse("1:name=systemd:/")
        .unwrap()
        .has_controller());
    for bad in [
        "",
        "x:memory:/a",
        "4:memory",
        "4:memory:rel",
        "4::/a",
        "0::rel",
    ] {
        assert_eq!(ProcCgroupLine::parse(bad), None, "{bad:?}");
    }
}

#[test]
fn of_pid_finds_this_process() {
    let cgroup = Cgroup::of_pid(std::process::id()).unwrap();
    match &cgroup {
        Cgroup::V1(dirs) => {
            assert!(dirs.contains_key("memory"), "{dirs:?}");
            for dir in dirs.values() {
                assert!(dir.is_dir(), "{}", dir.display());
            }
        }
        Cgroup::V2(dir) => assert!(dir.is_dir(), "{}", dir.display()),
    }
    let missing = Cgroup::of_pid(u32::MAX);
    assert!(
        matches!(missing, Err(LocateError::Read { .. })),
        "{missing:?}"
    );
}
