//! Seccomp: the built-in `RuntimeDefault` profile and `Localhost` profile files.
//!
//! The default profile is a port of the structure of containerd's / moby's default: deny
//! with `EPERM` by default, allow a fixed list of syscalls, allow the syscalls guarded by a
//! capability only when that capability is in the bounding set, allow `clone` without
//! namespace flags when `CAP_SYS_ADMIN` is absent, and make `clone3` fail with `ENOSYS`
//! instead of `EPERM` then, so libc falls back to `clone` (moby#42681). It is a static data
//! table so reviewing it against upstream is a diff of lists.
//!
//! `ptrace` is allowed unconditionally: upstream allows it on kernels ≥ 4.8, where seccomp
//! can no longer be bypassed with it, and remora targets newer kernels only.

use std::path::Path;

use oci_spec::runtime::{
    Arch, Capability, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArgBuilder,
    LinuxSeccompBuilder, LinuxSeccompOperator, LinuxSyscall, LinuxSyscallBuilder,
};

use super::types::SeccompProfile;
use super::SpecError;

const EPERM: u32 = 1;
const ENOSYS: u32 = 38;

/// `CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER |
/// CLONE_NEWPID | CLONE_NEWNET`: the flags `clone` may not carry without `CAP_SYS_ADMIN`.
const CLONE_NAMESPACE_FLAGS: u64 =
    0x0002_0000 | 0x0200_0000 | 0x0400_0000 | 0x0800_0000 | 0x1000_0000 | 0x2000_0000 | 0x4000_0000;

/// Syscalls every container may make.
pub const ALLOWED_SYSCALLS: &[&str] = &[
    "accept",
    "accept4",
    "access",
    "adjtimex",
    "alarm",
    "bind",
    "brk",
    "capget",
    "capset",
    "chdir",
    "chmod",
    "chown",
    "chown32",
    "clock_adjtime",
    "clock_adjtime64",
    "clock_getres",
    "clock_getres_time64",
    "clock_gettime",
    "clock_gettime64",
    "clock_nanosleep",
    "clock_nanosleep_time64",
    "close",
    "close_range",
    "connect",
    "copy_file_range",
    "creat",
    "dup",
    "dup2",
    "dup3",
    "epoll_create",
    "epoll_create1",
    "epoll_ctl",
    "epoll_ctl_old",
    "epoll_pwait",
    "epoll_pwait2",
    "epoll_wait",
    "epoll_wait_old",
    "eventfd",
    "eventfd2",
    "execve",
    "execveat",
    "exit",
    "exit_group",
    "faccessat",
    "faccessat2",
    "fadvise64",
    "fadvise64_64",
    "fallocate",
    "fanotify_mark",
    "fchdir",
    "fchmod",
    "fchmodat",
    "fchmodat2",
    "fchown",
    "fchown32",
    "fchownat",
    "fcntl",
    "fcntl64",
    "fdatasync",
    "fgetxattr",
    "flistxattr",
    "flock",
    "fork",
    "fremovexattr",
    "fsetxattr",
    "fstat",
    "fstat64",
    "fstatat64",
    "fstatfs",
    "fstatfs64",
    "fsync",
    "ftruncate",
    "ftruncate64",
    "futex",
    "futex_time64",
    "futex_waitv",
    "futimesat",
    "getcpu",
    "getcwd",
    "getdents",
    "getdents64",
    "getegid",
    "getegid32",
    "geteuid",
    "geteuid32",
    "getgid",
    "getgid32",
    "getgroups",
    "getgroups32",
    "getitimer",
    "getpeername",
    "getpgid",
    "getpgrp",
    "getpid",
    "getppid",
    "getpriority",
    "getrandom",
    "getresgid",
    "getresgid32",
    "getresuid",
    "getresuid32",
    "getrlimit",
    "get_robust_list",
    "getrusage",
    "getsid",
    "getsockname",
    "getsockopt",
    "get_thread_area",
    "gettid",
    "gettimeofday",
    "getuid",
    "getuid32",
    "getxattr",
    "inotify_add_watch",
    "inotify_init",
    "inotify_init1",
    "inotify_rm_watch",
    "io_cancel",
    "ioctl",
    "io_destroy",
    "io_getevents",
    "io_pgetevents",
    "io_pgetevents_time64",
    "ioprio_get",
    "ioprio_set",
    "io_setup",
    "io_submit",
    "io_uring_enter",
    "io_uring_register",
    "io_uring_setup",
    "ipc",
    "kill",
    "landlock_add_rule",
    "landlock_create_ruleset",
    "landlock_restrict_self",
    "lchown",
    "lchown32",
    "lgetxattr",
    "link",
    "linkat",
    "listen",
    "listxattr",
    "llistxattr",
    "_llseek",
    "lremovexattr",
    "lseek",
    "lsetxattr",
    "lstat",
    "lstat64",
    "madvise",
    "membarrier",
    "memfd_create",
    "memfd_secret",
    "mincore",
    "mkdir",
    "mkdirat",
    "mknod",
    "mknodat",
    "mlock",
    "mlock2",
    "mlockall",
    "mmap",
    "mmap2",
    "mprotect",
    "mq_getsetattr",
    "mq_notify",
    "mq_open",
    "mq_timedreceive",
    "mq_timedreceive_time64",
    "mq_timedsend",
    "mq_timedsend_time64",
    "mq_unlink",
    "mremap",
    "msgctl",
    "msgget",
    "msgrcv",
    "msgsnd",
    "msync",
    "munlock",
    "munlockall",
    "munmap",
    "nanosleep",
    "newfstatat",
    "_newselect",
    "open",
    "openat",
    "openat2",
    "pause",
    "pidfd_open",
    "pidfd_send_signal",
    "pipe",
    "pipe2",
    "poll",
    "ppoll",
    "ppoll_time64",
    "prctl",
    "pread64",
    "preadv",
    "preadv2",
    "prlimit64",
    "process_mrelease",
    "pselect6",
    "pselect6_time64",
    "ptrace",
    "pwrite64",
    "pwritev",
    "pwritev2",
    "read",
    "readahead",
    "readlink",
    "readlinkat",
    "readv",
    "recv",
    "recvfrom",
    "recvmmsg",
    "recvmmsg_time64",
    "recvmsg",
    "remap_file_pages",
    "removexattr",
    "rename",
    "renameat",
    "renameat2",
    "restart_syscall",
    "rmdir",
    "rseq",
    "rt_sigaction",
    "rt_sigpending",
    "rt_sigprocmask",
    "rt_sigqueueinfo",
    "rt_sigreturn",
    "rt_sigsuspend",
    "rt_sigtimedwait",
    "rt_sigtimedwait_time64",
    "rt_tgsigqueueinfo",
    "sched_getaffinity",
    "sched_getattr",
    "sched_getparam",
    "sched_get_priority_max",
    "sched_get_priority_min",
    "sched_getscheduler",
    "sched_rr_get_interval",
    "sched_rr_get_interval_time64",
    "sched_setaffinity",
    "sched_setattr",
    "sched_setparam",
    "sched_setscheduler",
    "sched_yield",
    "seccomp",
    "select",
    "semctl",
    "semget",
    "semop",
    "semtimedop",
    "semtimedop_time64",
    "send",
    "sendfile",
    "sendfile64",
    "sendmmsg",
    "sendmsg",
    "sendto",
    "setfsgid",
    "setfsgid32",
    "setfsuid",
    "setfsuid32",
    "setgid",
    "setgid32",
    "setgroups",
    "setgroups32",
    "setitimer",
    "setpgid",
    "setpriority",
    "setregid",
    "setregid32",
    "setresgid",
    "setresgid32",
    "setresuid",
    "setresuid32",
    "setreuid",
    "setreuid32",
    "setrlimit",
    "set_robust_list",
    "setsid",
    "setsockopt",
    "set_thread_area",
    "set_tid_address",
    "setuid",
    "setuid32",
    "setxattr",
    "shmat",
    "shmctl",
    "shmdt",
    "shmget",
    "shutdown",
    "sigaltstack",
    "signalfd",
    "signalfd4",
    "sigprocmask",
    "sigreturn",
    "socket",
    "socketcall",
    "socketpair",
    "splice",
    "stat",
    "stat64",
    "statfs",
    "statfs64",
    "statx",
    "symlink",
    "symlinkat",
    "sync",
    "sync_file_range",
    "syncfs",
    "sysinfo",
    "tee",
    "tgkill",
    "time",
    "timer_create",
    "timer_delete",
    "timer_getoverrun",
    "timer_gettime",
    "timer_gettime64",
    "timer_settime",
    "timer_settime64",
    "timerfd_create",
    "timerfd_gettime",
    "timerfd_gettime64",
    "timerfd_settime",
    "timerfd_settime64",
    "times",
    "tkill",
    "truncate",
    "truncate64",
    "ugetrlimit",
    "umask",
    "uname",
    "unlink",
    "unlinkat",
    "utime",
    "utimensat",
    "utimensat_time64",
    "utimes",
    "vfork",
    "vmsplice",
    "wait4",
    "waitid",
    "waitpid",
    "write",
    "writev",
];

/// `personality(2)` personas allowed: PER_LINUX, PER_LINUX32, UNAME26, UNAME26|PER_LINUX32,
/// and the query value 0xffffffff.
const ALLOWED_PERSONALITIES: &[u64] = &[0x0, 0x0008, 0x20000, 0x20008, 0xffff_ffff];

/// Syscalls allowed only with a capability in the bounding set.
pub const CAPABILITY_SYSCALLS: &[(Capability, &[&str])] = &[
    (Capability::DacReadSearch, &["open_by_handle_at"]),
    (
        Capability::SysAdmin,
        &[
            "bpf",
            "clone",
            "clone3",
            "fanotify_init",
            "fsconfig",
            "fsmount",
            "fsopen",
            "fspick",
            "lookup_dcookie",
            "mount",
            "mount_setattr",
            "move_mount",
            "name_to_handle_at",
            "open_tree",
            "perf_event_open",
            "quotactl",
            "quotactl_fd",
            "setdomainname",
            "sethostname",
            "setns",
            "syslog",
            "umount",
            "umount2",
            "unshare",
        ],
    ),
    (Capability::SysBoot, &["reboot"]),
    (Capability::SysChroot, &["chroot"]),
    (
        Capability::SysModule,
        &["delete_module", "init_module", "finit_module"],
    ),
    (Capability::SysPacct, &["acct"]),
    (
        Capability::SysPtrace,
        &[
            "kcmp",
            "pidfd_getfd",
            "process_madvise",
            "process_vm_readv",
            "process_vm_writev",
        ],
    ),
    (Capability::SysRawio, &["iopl", "ioperm"]),
    (
        Capability::SysTime,
        &["settimeofday", "stime", "clock_settime", "clock_settime64"],
    ),
    (Capability::SysTtyConfig, &["vhangup"]),
    (
        Capability::SysNice,
        &["get_mempolicy", "mbind", "set_mempolicy"],
    ),
    (Capability::Syslog, &["syslog"]),
    (Capability::Bpf, &["bpf"]),
    (Capability::Perfmon, &["perf_event_open"]),
];

/// The seccomp architectures of this build's target (the native one plus its compat ABIs).
fn architectures() -> Vec<Arch> {
    if cfg!(target_arch = "x86_64") {
        vec![Arch::ScmpArchX86_64, Arch::ScmpArchX86, Arch::ScmpArchX32]
    } else if cfg!(target_arch = "aarch64") {
        vec![Arch::ScmpArchArm, Arch::ScmpArchAarch64]
    } else {
        Vec::new()
    }
}

/// Syscalls only this build's architecture has.
fn arch_syscalls() -> &'static [&'static str] {
    if cfg!(target_arch = "x86_64") {
        &["arch_prctl", "modify_ldt"]
    } else if cfg!(target_arch = "aarch64") {
        &[
            "arm_fadvise64_64",
            "arm_sync_file_range",
            "sync_file_range2",
            "breakpoint",
            "cacheflush",
            "set_tls",
        ]
    } else {
        &[]
    }
}

fn allow(names: &[&str]) -> Result<LinuxSyscall, SpecError> {
    Ok(LinuxSyscallBuilder::default()
        .names(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .action(LinuxSeccompAction::ScmpActAllow)
        .build()?)
}

/// The `RuntimeDefault` profile for a process with this bounding capability set.
pub fn default_profile(bounding: &[Capability]) -> Result<LinuxSeccomp, SpecError> {
    let mut syscalls = vec![allow(ALLOWED_SYSCALLS)?];
    for &persona in ALLOWED_PERSONALITIES {
        syscalls.push(
            LinuxSyscallBuilder::default()
                .names(vec!["personality".to_owned()])
                .action(LinuxSeccompAction::ScmpActAllow)
                .args(vec![LinuxSeccompArgBuilder::default()
                    .index(0usize)
                    .value(persona)
                    .op(LinuxSeccompOperator::ScmpCmpEq)
                    .build()?])
                .build()?,
        );
    }
    let arch = arch_syscalls();
    if !arch.is_empty() {
        syscalls.push(allow(arch)?);
    }
    for (cap, names) in CAPABILITY_SYSCALLS {
        if bounding.contains(cap) {
            syscalls.push(allow(names)?);
        }
    }
    if !bounding.contains(&Capability::SysAdmin) {
        // Plain clone (threads, fork) is fine; creating namespaces is not.
        syscalls.push(
            LinuxSyscallBuilder::default()
                .names(vec!["clone".to_owned()])
                .action(LinuxSeccompAction::ScmpActAllow)
                .args(vec![LinuxSeccompArgBuilder::default()
                    .index(0usize)
                    .value(CLONE_NAMESPACE_FLAGS)
                    .value_two(0u64)
                    .op(LinuxSeccompOperator::ScmpCmpMaskedEq)
                    .build()?])
                .build()?,
        );
        // clone3 passes its flags in memory seccomp cannot inspect: ENOSYS makes glibc fall
        // back to clone, where the filter above applies. EPERM would be fatal.
        syscalls.push(
            LinuxSyscallBuilder::default()
                .names(vec!["clone3".to_owned()])
                .action(LinuxSeccompAction::ScmpActErrno)
                .errno_ret(ENOSYS)
                .build()?,
        );
    }
    Ok(LinuxSeccompBuilder::default()
        .default_action(LinuxSeccompAction::ScmpActErrno)
        .default_errno_ret(EPERM)
        .architectures(architectures())
        .syscalls(syscalls)
        .build()?)
}

/// Largest seccomp profile read (containerd's default profile is about 20 KiB as JSON).
pub const MAX_PROFILE_LEN: u64 = 1 << 20;

/// Reads an OCI-format seccomp profile (a `LinuxSeccomp` object) from a host file: a regular
/// file of at most [`MAX_PROFILE_LEN`] bytes (the path comes from the request).
pub fn load_localhost(path: &Path) -> Result<LinuxSeccomp, SpecError> {
    let text = remora_host::fs::read_regular_file(path, MAX_PROFILE_LEN).map_err(|source| {
        SpecError::SeccompProfileRead {
            path: path.to_owned(),
            source,
        }
    })?;
    serde_json::from_str(&text).map_err(|source| SpecError::SeccompProfileParse {
        path: path.to_owned(),
        source,
    })
}

/// The seccomp section for a request. Privileged processes get none, as in containerd: a
/// privileged container is meant to do anything the host allows.
pub fn seccomp_for(
    profile: &SeccompProfile,
    privileged: bool,
    bounding: &[Capability],
) -> Result<Option<LinuxSeccomp>, SpecError> {
    if privileged {
        return Ok(None);
    }
    match profile {
        SeccompProfile::Unconfined => Ok(None),
        SeccompProfile::RuntimeDefault => default_profile(bounding).map(Some),
        SeccompProfile::Localhost(path) => load_localhost(path).map(Some),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed(p: &LinuxSeccomp, name: &str) -> Vec<LinuxSyscall> {
        p.syscalls()
            .clone()
            .unwrap_or_default()
            .into_iter()
            .filter(|s| s.names().iter().any(|n| n == name))
            .collect()
    }

    #[test]
    fn default_profile_denies_with_eperm_and_allows_basics() {
        let p = default_profile(&[]).unwrap();
        assert_eq!(p.default_action(), LinuxSeccompAction::ScmpActErrno);
        assert_eq!(p.default_errno_ret(), Some(EPERM));
        for name in ["read", "write", "execve", "openat", "futex", "ptrace"] {
            assert_eq!(allowed(&p, name).len(), 1, "{name}");
        }
        for name in [
            "mount",
            "reboot",
            "chroot",
            "unshare",
            "setns",
            "kexec_load",
        ] {
            assert!(allowed(&p, name).is_empty(), "{name}");
        }
        if cfg!(target_arch = "x86_64") {
            assert_eq!(
                p.architectures().clone().unwrap(),
                vec![Arch::ScmpArchX86_64, Arch::ScmpArchX86, Arch::ScmpArchX32]
            );
            assert_eq!(allowed(&p, "arch_prctl").len(), 1);
        }
        assert_eq!(
            allowed(&p, "personality").len(),
            ALLOWED_PERSONALITIES.len()
        );
    }

    #[test]
    fn clone_is_filtered_without_sys_admin() {
        let p = default_profile(&[Capability::Chown]).unwrap();
        let clone = allowed(&p, "clone");
        assert_eq!(clone.len(), 1);
        let arg = clone[0].args().clone().unwrap()[0];
        assert_eq!(arg.op(), LinuxSeccompOperator::ScmpCmpMaskedEq);
        assert_eq!(arg.value(), 0x7E02_0000);
        let clone3 = allowed(&p, "clone3");
        assert_eq!(clone3[0].action(), LinuxSeccompAction::ScmpActErrno);
        assert_eq!(clone3[0].errno_ret(), Some(ENOSYS));
    }

    #[test]
    fn capabilities_unlock_their_syscalls() {
        let p = default_profile(&[Capability::SysAdmin, Capability::SysChroot]).unwrap();
        for name in ["mount", "unshare", "setns", "sethostname", "chroot"] {
            assert!(!allowed(&p, name).is_empty(), "{name}");
        }
        // With CAP_SYS_ADMIN clone and clone3 are plainly allowed.
        assert!(allowed(&p, "clone").iter().all(|s| s.args().is_none()));
        assert!(allowed(&p, "clone3")
            .iter()
            .all(|s| s.action() == LinuxSeccompAction::ScmpActAllow));
        assert!(allowed(&p, "reboot").is_empty());
        let p = default_profile(&[Capability::SysTime, Capability::SysPtrace]).unwrap();
        assert!(!allowed(&p, "settimeofday").is_empty());
        assert!(!allowed(&p, "process_vm_readv").is_empty());
    }

    #[test]
    fn default_profile_serializes_to_oci_json() {
        let p = default_profile(&[]).unwrap();
        let json = serde_json::to_value(&p).unwrap();
        assert_eq!(json["defaultAction"], "SCMP_ACT_ERRNO");
        let back: LinuxSeccomp = serde_json::from_value(json).unwrap();
        assert_eq!(back, p);
    }

    #[test]
    fn localhost_profile_is_loaded_or_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("profile.json");
        std::fs::write(
            &path,
            r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["sethostname"],"action":"SCMP_ACT_ERRNO"}]}"#,
        )
        .unwrap();
        let p = seccomp_for(&SeccompProfile::Localhost(path.clone()), false, &[])
            .unwrap()
            .unwrap();
        assert_eq!(p.default_action(), LinuxSeccompAction::ScmpActAllow);
        assert_eq!(
            allowed(&p, "sethostname")[0].action(),
            LinuxSeccompAction::ScmpActErrno
        );

        let missing = dir.path().join("nope.json");
        let err = seccomp_for(&SeccompProfile::Localhost(missing), false, &[]).unwrap_err();
        assert!(matches!(err, SpecError::SeccompProfileRead { .. }));
        assert!(err.to_string().contains("nope.json"));
        // Not a regular file (a FIFO would block, /dev/zero never end), or too large.
        for path in ["/dev/zero", "/dev/null"] {
            let err = seccomp_for(&SeccompProfile::Localhost(path.into()), false, &[]).unwrap_err();
            assert!(
                err.to_string().contains("not a regular file"),
                "{path}: {err}"
            );
        }
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let err = seccomp_for(&SeccompProfile::Localhost(fifo), false, &[]).unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
        let big = dir.path().join("big.json");
        std::fs::write(&big, vec![b' '; MAX_PROFILE_LEN as usize + 1]).unwrap();
        let err = seccomp_for(&SeccompProfile::Localhost(big), false, &[]).unwrap_err();
        assert!(err.to_string().contains("larger than"), "{err}");

        std::fs::write(&path, "{not json").unwrap();
        let err = load_localhost(&path).unwrap_err();
        assert!(matches!(err, SpecError::SeccompProfileParse { .. }));
    }

    #[test]
    fn privileged_and_unconfined_have_no_filter() {
        assert!(seccomp_for(&SeccompProfile::RuntimeDefault, true, &[])
            .unwrap()
            .is_none());
        assert!(seccomp_for(&SeccompProfile::Unconfined, false, &[])
            .unwrap()
            .is_none());
        assert!(seccomp_for(&SeccompProfile::RuntimeDefault, false, &[])
            .unwrap()
            .is_some());
    }
}
