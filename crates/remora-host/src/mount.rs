//! containerd's mount options (`Mount.options`: `ro`, `rbind`, `lowerdir=…`) read as the
//! kernel's `mount(2)` flags and data, with the meanings containerd's Go `mount` package gives
//! them. One reading for both binaries: the shim mounts a container's rootfs with it, the
//! daemon mounts snapshots on the host (and refuses what it cannot honour there).

use nix::mount::MsFlags;

/// What one mount option asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountOption<'a> {
    /// Sets and clears ordinary flags: `ro`/`rw`, `nosuid`/`suid`, `nodev`/`dev`,
    /// `noexec`/`exec`, `sync`/`async`, `dirsync`, the atime family. `defaults` sets none.
    Flags {
        /// Flags the option sets.
        set: MsFlags,
        /// Flags the option clears.
        clear: MsFlags,
    },
    /// `bind` or `rbind` (`recursive`).
    Bind {
        /// `rbind`: the submounts too.
        recursive: bool,
    },
    /// `remount`, `mand`, `nomand`: flags that change an existing mount or ask for mandatory
    /// locks, which a fresh mount of a snapshot has no use for.
    Special {
        /// Flags the option sets.
        set: MsFlags,
        /// Flags the option clears.
        clear: MsFlags,
    },
    /// A propagation change (`private`, `rshared`, …): a `mount(2)` call of its own.
    Propagation(MsFlags),
    /// `loop`: a loop device over the source file.
    Loop,
    /// Anything else: filesystem data (`lowerdir=…`, `size=…`), passed on as it is.
    Data(&'a str),
}

impl<'a> MountOption<'a> {
    /// Reads one option.
    pub fn parse(option: &'a str) -> Self {
        let flags = |set: MsFlags, clear: MsFlags| MountOption::Flags { set, clear };
        let none = MsFlags::empty();
        match option {
            "defaults" => flags(none, none),
            "ro" => flags(MsFlags::MS_RDONLY, none),
            "rw" => flags(none, MsFlags::MS_RDONLY),
            "nosuid" => flags(MsFlags::MS_NOSUID, none),
            "suid" => flags(none, MsFlags::MS_NOSUID),
            "nodev" => flags(MsFlags::MS_NODEV, none),
            "dev" => flags(none, MsFlags::MS_NODEV),
            "noexec" => flags(MsFlags::MS_NOEXEC, none),
            "exec" => flags(none, MsFlags::MS_NOEXEC),
            "sync" => flags(MsFlags::MS_SYNCHRONOUS, none),
            "async" => flags(none, MsFlags::MS_SYNCHRONOUS),
            "dirsync" => flags(MsFlags::MS_DIRSYNC, none),
            "noatime" => flags(MsFlags::MS_NOATIME, none),
            "atime" => flags(none, MsFlags::MS_NOATIME),
            "nodiratime" => flags(MsFlags::MS_NODIRATIME, none),
            "diratime" => flags(none, MsFlags::MS_NODIRATIME),
            "relatime" => flags(MsFlags::MS_RELATIME, none),
            "norelatime" => flags(none, MsFlags::MS_RELATIME),
            "strictatime" => flags(MsFlags::MS_STRICTATIME, none),
            "nostrictatime" => flags(none, MsFlags::MS_STRICTATIME),
            "bind" => MountOption::Bind { recursive: false },
            "rbind" => MountOption::Bind { recursive: true },
            "remount" => MountOption::Special {
                set: MsFlags::MS_REMOUNT,
                clear: none,
            },
            "mand" => MountOption::Special {
                set: MsFlags::MS_MANDLOCK,
                clear: none,
            },
            "nomand" => MountOption::Special {
                set: none,
                clear: MsFlags::MS_MANDLOCK,
            },
            "private" => MountOption::Propagation(MsFlags::MS_PRIVATE),
            "rprivate" => MountOption::Propagation(MsFlags::MS_PRIVATE | MsFlags::MS_REC),
            "shared" => MountOption::Propagation(MsFlags::MS_SHARED),
            "rshared" => MountOption::Propagation(MsFlags::MS_SHARED | MsFlags::MS_REC),
            "slave" => MountOption::Propagation(MsFlags::MS_SLAVE),
            "rslave" => MountOption::Propagation(MsFlags::MS_SLAVE | MsFlags::MS_REC),
            "unbindable" => MountOption::Propagation(MsFlags::MS_UNBINDABLE),
            "runbindable" => MountOption::Propagation(MsFlags::MS_UNBINDABLE | MsFlags::MS_REC),
            "loop" => MountOption::Loop,
            data => MountOption::Data(data),
        }
    }
}

/// `flags` with `set` added and `clear` taken away, as an option later in the list overrides
/// an earlier one (`ro,rw` is read-write).
pub fn apply(flags: MsFlags, set: MsFlags, clear: MsFlags) -> MsFlags {
    (flags | set) - clear
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_set_and_clear_and_the_last_one_wins() {
        let mut flags = MsFlags::empty();
        for o in ["ro", "nosuid", "noexec", "rw", "exec", "defaults"] {
            match MountOption::parse(o) {
                MountOption::Flags { set, clear } => flags = apply(flags, set, clear),
                other => panic!("{o}: {other:?}"),
            }
        }
        assert_eq!(flags, MsFlags::MS_NOSUID);
    }

    #[test]
    fn each_kind_of_option_is_told_apart() {
        assert_eq!(
            MountOption::parse("rbind"),
            MountOption::Bind { recursive: true }
        );
        assert_eq!(
            MountOption::parse("bind"),
            MountOption::Bind { recursive: false }
        );
        assert_eq!(
            MountOption::parse("nostrictatime"),
            MountOption::Flags {
                set: MsFlags::empty(),
                clear: MsFlags::MS_STRICTATIME
            }
        );
        assert!(matches!(
            MountOption::parse("remount"),
            MountOption::Special { set, .. } if set == MsFlags::MS_REMOUNT
        ));
        assert_eq!(
            MountOption::parse("rslave"),
            MountOption::Propagation(MsFlags::MS_SLAVE | MsFlags::MS_REC)
        );
        assert_eq!(MountOption::parse("loop"), MountOption::Loop);
        for data in ["lowerdir=/a:/b", "size=64k", "uidmap=0:1000:1", "ro=x", ""] {
            assert_eq!(MountOption::parse(data), MountOption::Data(data));
        }
    }
}
