//! Which sysctls a pod may set.
//!
//! A pod's sysctls are written by runc into the namespaces of its pause container, so only
//! sysctls that live in a namespace the pod owns are safe: anything else would change the
//! node for every process on it. The rules are runc's (`validateSysctl` in
//! `libcontainer/configs/validate`), which would otherwise refuse the spec only when the task
//! starts, with an opaque error:
//!
//! - `net.*` needs the pod's own network namespace (not host network);
//! - the IPC sysctls (`kernel.msg{max,mnb,mni}`, `kernel.sem`, `kernel.shm{all,max,mni}`,
//!   `kernel.shm_rmid_forced`, `fs.mqueue.*`) need the pod's own IPC namespace;
//! - `kernel.hostname` / `kernel.domainname` need the pod's own UTS namespace, which a pod has
//!   unless it uses the host network (a host-network pod keeps the node's UTS namespace);
//! - everything else is refused.
//!
//! Names are dot-separated as kubelet sends them; a `/` may appear inside a component (kubelet
//! turns `net/ipv4/conf/eth0.100/rp_filter` into `net.ipv4.conf.eth0/100.rp_filter`). A
//! name whose first separator is `/` is read in that slash form. Empty components (`..`,
//! `a//b`, a leading or trailing separator) are refused: runc turns the name into a path
//! under `/proc/sys`, and such names are either mistakes or attempts to leave it.

/// The IPC namespace sysctls, besides `fs.mqueue.*` (runc's list).
const IPC_SYSCTLS: &[&str] = &[
    "kernel.msgmax",
    "kernel.msgmnb",
    "kernel.msgmni",
    "kernel.sem",
    "kernel.shmall",
    "kernel.shmmax",
    "kernel.shmmni",
    "kernel.shm_rmid_forced",
];

/// Longest sysctl name accepted (the longest real ones are under 80 bytes; interface names
/// inside `net.*` are at most 15).
pub const MAX_NAME_LEN: usize = 256;
/// Longest value accepted: `/proc/sys` writes are limited to a page.
pub const MAX_VALUE_LEN: usize = 4096;

/// Checks that the pod may set `key` to `value` given its namespaces; the error says why not.
pub fn check(
    key: &str,
    value: &str,
    host_network: bool,
    host_ipc: bool,
) -> Result<(), &'static str> {
    if key.is_empty() {
        return Err("a sysctl name must not be empty");
    }
    if key.len() > MAX_NAME_LEN {
        return Err("the sysctl name is longer than 256 bytes");
    }
    if !key
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'/'))
    {
        return Err("a sysctl name may contain only letters, digits, '_', '-', '.' and '/'");
    }
    if key.split(['.', '/']).any(str::is_empty) {
        return Err("the sysctl name has an empty component (`..`, `//`, or a leading or trailing separator)");
    }
    if value.len() > MAX_VALUE_LEN {
        return Err("the sysctl value is longer than 4096 bytes");
    }
    if value.bytes().any(|b| b == 0 || b == b'\n') {
        return Err("the sysctl value must not contain NUL or newline");
    }
    let name = dotted(key);
    if name.starts_with("net.") {
        if host_network {
            return Err("net.* sysctls cannot be set in a pod that uses the host network");
        }
        return Ok(());
    }
    if IPC_SYSCTLS.contains(&name.as_str()) || name.starts_with("fs.mqueue.") {
        if host_ipc {
            return Err("IPC sysctls cannot be set in a pod that uses the host IPC namespace");
        }
        return Ok(());
    }
    if name == "kernel.hostname" || name == "kernel.domainname" {
        if host_network {
            return Err("UTS sysctls cannot be set in a pod that uses the host network");
        }
        return Ok(());
    }
    Err("the sysctl is not namespaced: setting it would change the node")
}

/// The dot form of a sysctl name: kubelet's slash form (first separator `/`) has `.` and `/`
/// swapped.
fn dotted(key: &str) -> String {
    if slash_form(key) {
        swap_separators(key)
    } else {
        key.to_owned()
    }
}

/// The path of sysctl `key` below `/proc/sys`, as sysctl(8) reads names: in the dot form the
/// dots separate and a `/` is a dot within a component (`net.ipv4.conf.eth0/100.forwarding`);
/// in the slash form the name is the path.
pub fn proc_sys_path(key: &str) -> String {
    if slash_form(key) {
        key.to_owned()
    } else {
        swap_separators(key)
    }
}

/// Whether the name's first separator is a `/`.
fn slash_form(key: &str) -> bool {
    key.find(['.', '/'])
        .is_some_and(|i| key.as_bytes()[i] == b'/')
}

fn swap_separators(key: &str) -> String {
    key.chars()
        .map(|c| match c {
            '/' => '.',
            '.' => '/',
            c => c,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysctl_names_map_to_proc_sys_paths_as_sysctl_reads_them() {
        assert_eq!(proc_sys_path("kernel.shmmax"), "kernel/shmmax");
        assert_eq!(
            proc_sys_path("net.ipv4.conf.eth0/100.forwarding"),
            "net/ipv4/conf/eth0.100/forwarding"
        );
        assert_eq!(
            proc_sys_path("net/ipv4/conf/eth0.100/forwarding"),
            "net/ipv4/conf/eth0.100/forwarding"
        );
    }

    #[test]
    fn namespaced_sysctls_follow_the_pods_namespaces() {
        for key in [
            "net.ipv4.ip_unprivileged_port_start",
            "net.ipv4.conf.eth0/100.rp_filter",
            "net/ipv4/conf/eth0.100/rp_filter",
            "net.core.somaxconn",
        ] {
            assert_eq!(check(key, "1", false, false), Ok(()), "{key}");
            assert!(check(key, "1", true, false).is_err(), "{key} with host net");
        }
        for key in ["kernel.shm_rmid_forced", "kernel.sem", "fs.mqueue.msg_max"] {
            assert_eq!(check(key, "1", false, false), Ok(()), "{key}");
            assert_eq!(check(key, "1", true, false), Ok(()), "{key} with host net");
            assert!(check(key, "1", false, true).is_err(), "{key} with host ipc");
        }
        assert_eq!(check("kernel.domainname", "x", false, false), Ok(()));
        assert!(check("kernel.hostname", "x", true, false).is_err());
    }

    #[test]
    fn host_wide_and_malformed_sysctls_are_refused() {
        for key in [
            "kernel.foo",
            "kernel.pid_max",
            "vm.overcommit_memory",
            "fs.file-max",
            "kernel.shm_rmid_forcedx",
        ] {
            let e = check(key, "1", false, false).unwrap_err();
            assert!(e.contains("not namespaced"), "{key}: {e}");
        }
        for key in [
            "",
            "net..ipv4.ip_forward",
            "net.ipv4.",
            ".net.ipv4",
            "net/../../etc/passwd",
            "net.ipv4/../x",
            "net.ipv4.conf.eth0//rp_filter",
            "net.ipv4 .x",
            "net.ipv4\0.x",
        ] {
            let e = check(key, "1", false, false).unwrap_err();
            assert!(!e.contains("not namespaced"), "{key:?}: {e}");
        }
        assert!(check(&format!("net.{}", "a".repeat(300)), "1", false, false).is_err());
        assert!(check("net.ipv4.ip_forward", "1\n2", false, false).is_err());
        assert!(check("net.ipv4.ip_forward", &"1".repeat(5000), false, false).is_err());
    }
}
