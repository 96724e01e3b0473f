//! User namespaces made on the host: a helper process holding a new user namespace with given ID
//! maps (and, for a pod's network, a network namespace that namespace owns), and idmapped
//! mounts through such a namespace. Shared by the daemon (a user-namespaced pod's network
//! namespace, `remora::net::netns`, and idmapped volume mounts) and remora's shim (an idmapped
//! rootfs).
//!
//! Why a process: a user namespace is entered with `unshare(CLONE_NEWUSER)`, which a
//! multithreaded process cannot do (EINVAL), and its ID maps are written to
//! `/proc/<pid>/{uid,gid}_map` of a process inside it. So a child is forked; it only makes the
//! system calls below (async-signal-safe: no allocation, no lock) — unshare, one byte written
//! to say so, a blocking read until the parent lets go, `_exit`. The namespaces live as long as
//! the child or a bind mount of `/proc/<pid>/ns/*` (the caller's to make).
//!
//! Why the network namespace is made in the same child: a user-namespaced pod's network
//! namespace must be *owned* by the pod's user namespace (else the pod's root cannot configure
//! it, and mounting sysfs in the pod fails), and ownership is fixed when it is created — what
//! containerd 2.x does too (`UnshareAfterEnterUserns`).

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::sys::wait::waitpid;
use nix::unistd::{fork, ForkResult, Pid};

/// One line of an ID map: `length` IDs from `inside` are `outside` and up on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdMap {
    /// First ID inside the namespace.
    pub inside: u32,
    /// First host ID.
    pub outside: u32,
    /// How many.
    pub length: u32,
}

impl IdMap {
    /// The `/proc/<pid>/uid_map` line (`inside outside length`).
    pub fn proc_line(&self) -> String {
        format!("{} {} {}\n", self.inside, self.outside, self.length)
    }

    /// Parses containerd's snapshot label / mount option form, `inside:outside:length`
    /// (several lines separated by `,`, of which one is taken here: remora and containerd's CRI
    /// make one).
    pub fn parse(s: &str) -> Option<IdMap> {
        let mut it = s.split(':').map(|p| p.parse::<u32>().ok());
        let (inside, outside, length) = (it.next()??, it.next()??, it.next()??);
        (it.next().is_none() && length > 0).then_some(IdMap {
            inside,
            outside,
            length,
        })
    }

    /// containerd's label / option form, `inside:outside:length`.
    pub fn label(&self) -> String {
        format!("{}:{}:{}", self.inside, self.outside, self.length)
    }
}

/// Why a user namespace could not be made or used.
#[derive(Debug, thiserror::Error)]
pub enum UsernsError {
    /// A pipe to the helper could not be made.
    #[error("cannot make a pipe for the user namespace helper: {0}")]
    Pipe(Errno),
    /// The helper process could not be forked.
    #[error("cannot fork the user namespace helper: {0}")]
    Fork(Errno),
    /// The helper could not unshare its namespaces (no CAP_SYS_ADMIN, user namespaces off).
    #[error("the user namespace helper cannot unshare its namespaces")]
    Unshare,
    /// An ID map could not be written.
    #[error("cannot write {}: {source}", path.display())]
    WriteMap {
        /// `/proc/<pid>/uid_map` or `gid_map`.
        path: PathBuf,
        /// The write's error (EPERM when the mapping is not allowed for the writer).
        source: std::io::Error,
    },
    /// A namespace file could not be opened.
    #[error("cannot open {}: {source}", path.display())]
    Open {
        /// The path.
        path: PathBuf,
        /// The open's error.
        source: std::io::Error,
    },
    /// A mount point for an idmapped layer could not be made.
    #[error("cannot create {}: {source}", path.display())]
    MountPoint {
        /// The directory.
        path: PathBuf,
        /// The mkdir's error.
        source: std::io::Error,
    },
    /// An idmapped mount step failed.
    #[error("cannot {action} {}: {errno}", path.display())]
    Mount {
        /// `open_tree`, `mount_setattr` or `move_mount`.
        action: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The system call's errno.
        errno: Errno,
    },
}

/// A helper process in a new user namespace (and a new network namespace, if asked) with the
/// given maps. Killed and reaped on drop.
pub struct UsernsHelper {
    pid: Pid,
    /// Closing it lets the helper exit.
    hold: Option<OwnedFd>,
}

impl UsernsHelper {
    /// Forks the helper with `uids` and `gids` written; `with_netns` also gives it a new network
    /// namespace owned by the new user namespace.
    pub fn spawn(uids: IdMap, gids: IdMap, with_netns: bool) -> Result<Self, UsernsError> {
        let (ready_r, ready_w) = nix::unistd::pipe().map_err(UsernsError::Pipe)?;
        let (hold_r, hold_w) = nix::unistd::pipe().map_err(UsernsError::Pipe)?;
        let mut flags = libc::CLONE_NEWUSER;
        if with_netns {
            flags |= libc::CLONE_NEWNET;
        }
        // SAFETY: the child makes only async-signal-safe system calls (unshare, write, read,
        // _exit) on file descriptors it already holds, and never returns into Rust code.
        match unsafe { fork() }.map_err(UsernsError::Fork)? {
            ForkResult::Child => unsafe {
                libc::close(ready_r.as_raw_fd());
                libc::close(hold_w.as_raw_fd());
                let ok: u8 = if libc::unshare(flags) == 0 { 1 } else { 0 };
                libc::write(ready_w.as_raw_fd(), (&ok as *const u8).cast(), 1);
                let mut b = 0u8;
                libc::read(hold_r.as_raw_fd(), (&mut b as *mut u8).cast(), 1);
                libc::_exit(0)
            },
            ForkResult::Parent { child } => {
                drop(ready_w);
                drop(hold_r);
                let mut helper = UsernsHelper {
                    pid: child,
                    hold: Some(hold_w),
                };
                let mut ok = [0u8; 1];
                let n = nix::unistd::read(&ready_r, &mut ok).unwrap_or(0);
                if n != 1 || ok[0] != 1 {
                    return Err(UsernsError::Unshare);
                }
                helper.write_map("uid_map", uids)?;
                helper.write_map("gid_map", gids)?;
                Ok(helper)
            }
        }
    }

    fn write_map(&mut self, file: &str, map: IdMap) -> Result<(), UsernsError> {
        let path = PathBuf::from(format!("/proc/{}/{file}", self.pid));
        File::options()
            .write(true)
            .open(&path)
            .and_then(|mut f| f.write_all(map.proc_line().as_bytes()))
            .map_err(|source| UsernsError::WriteMap { path, source })
    }

    /// `/proc/<pid>/ns/<name>` of the helper (`user`, `net`).
    pub fn ns_path(&self, name: &str) -> PathBuf {
        PathBuf::from(format!("/proc/{}/ns/{name}", self.pid))
    }

    /// The helper's user namespace, opened.
    pub fn userns_fd(&self) -> Result<File, UsernsError> {
        let path = self.ns_path("user");
        File::open(&path).map_err(|source| UsernsError::Open { path, source })
    }
}

impl Drop for UsernsHelper {
    fn drop(&mut self) {
        // Closing the hold pipe ends the helper's read; SIGKILL in case it is elsewhere.
        self.hold.take();
        let _ = nix::sys::signal::kill(self.pid, nix::sys::signal::Signal::SIGKILL);
        let _ = waitpid(self.pid, None);
    }
}

/// Clones the mount tree at `source` (not recursively), idmaps it through the user namespace
/// `userns` (read-only too if `readonly`), and attaches it at `target` (an existing directory).
/// Linux 5.12: `open_tree`, `mount_setattr`, `move_mount`.
pub fn idmapped_bind(
    source: &Path,
    target: &Path,
    userns: &File,
    readonly: bool,
) -> Result<(), UsernsError> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;

    let c = |p: &Path, action| {
        CString::new(p.as_os_str().as_bytes()).map_err(|_| UsernsError::Mount {
            action,
            path: p.to_path_buf(),
            errno: Errno::EINVAL,
        })
    };
    let src = c(source, "open_tree")?;
    let dst = c(target, "move_mount")?;
    // SAFETY: plain system calls on a valid C string; the returned fd is owned below.
    let tree = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            src.as_ptr(),
            (libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC) as libc::c_uint,
        )
    };
    if tree < 0 {
        return Err(UsernsError::Mount {
            action: "open_tree",
            path: source.to_path_buf(),
            errno: Errno::last(),
        });
    }
    // SAFETY: open_tree returned a new file descriptor that nothing else owns.
    let tree = unsafe { OwnedFd::from_raw_fd(tree as libc::c_int) };
    let mut attr = libc::mount_attr {
        attr_set: libc::MOUNT_ATTR_IDMAP | if readonly { libc::MOUNT_ATTR_RDONLY } else { 0 },
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    let empty = c"";
    // SAFETY: `attr` lives across the call and its size is passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint,
            &mut attr as *mut libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if r < 0 {
        return Err(UsernsError::Mount {
            action: "mount_setattr (idmap)",
            path: source.to_path_buf(),
            errno: Errno::last(),
        });
    }
    // SAFETY: valid fds and C strings.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            dst.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH as libc::c_uint,
        )
    };
    if r < 0 {
        return Err(UsernsError::Mount {
            action: "move_mount",
            path: target.to_path_buf(),
            errno: Errno::last(),
        });
    }
    Ok(())
}

/// An overlay's lower layers, each bound read-only and idmapped under a scratch directory, for
/// an overlay mounted over them: Linux 5.19 lets overlayfs stack on idmapped layers, while an
/// overlay mount itself cannot be idmapped (overlayfs does not take `MOUNT_ATTR_IDMAP`). This
/// is how containerd's mount code makes an idmapped snapshot (`uidmap=`/`gidmap=` options)
/// for its Go shim and for its CRI's image volumes. Once the overlay is mounted it holds what
/// it needs: dropping this detaches the binds and removes their mount points.
pub struct IdmappedLayers {
    binds: Vec<PathBuf>,
    scratch: PathBuf,
}

impl IdmappedLayers {
    /// Binds each directory of `lowerdir` (an overlay's `:`-separated option value) on
    /// `scratch/<i>` (created), read-only and idmapped through `userns`; returns the binds and
    /// the `lowerdir` value naming them, in the same order. On failure nothing is left.
    pub fn bind(
        lowerdir: &str,
        userns: &File,
        scratch: &Path,
    ) -> Result<(Self, String), UsernsError> {
        let mut layers = IdmappedLayers {
            binds: Vec::new(),
            scratch: scratch.to_path_buf(),
        };
        let mut names = Vec::new();
        for (i, dir) in lowerdir.split(':').enumerate() {
            let at = scratch.join(i.to_string());
            std::fs::create_dir_all(&at).map_err(|source| UsernsError::MountPoint {
                path: at.clone(),
                source,
            })?;
            if let Err(e) = idmapped_bind(Path::new(dir), &at, userns, true) {
                let _ = std::fs::remove_dir(&at);
                return Err(e);
            }
            names.push(at.display().to_string());
            layers.binds.push(at);
        }
        Ok((layers, names.join(":")))
    }
}

impl Drop for IdmappedLayers {
    fn drop(&mut self) {
        // Non-recursive removal: a bind that would not detach is left, never walked into.
        for at in self.binds.iter().rev() {
            let _ = nix::mount::umount2(at, nix::mount::MntFlags::MNT_DETACH);
            let _ = std::fs::remove_dir(at);
        }
        let _ = std::fs::remove_dir(&self.scratch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_parse_and_print() {
        let m = IdMap::parse("0:1000:65536").unwrap();
        assert_eq!(
            m,
            IdMap {
                inside: 0,
                outside: 1000,
                length: 65536
            }
        );
        assert_eq!(m.label(), "0:1000:65536");
        assert_eq!(m.proc_line(), "0 1000 65536\n");
        for bad in ["", "0:1", "0:1:0", "0:1:2:3", "a:1:2", "-1:1:2"] {
            assert_eq!(IdMap::parse(bad), None, "{bad}");
        }
    }

    /// Needs root (the unit tests run as root on the test machines; skipped otherwise).
    #[test]
    fn a_helper_holds_a_user_namespace_with_the_maps_and_owns_its_netns() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let map = IdMap {
            inside: 0,
            outside: 100_000,
            length: 65536,
        };
        let h = UsernsHelper::spawn(map, map, true).unwrap();
        let uid_map = std::fs::read_to_string(format!("/proc/{}/uid_map", h.pid)).unwrap();
        assert_eq!(
            uid_map.split_whitespace().collect::<Vec<_>>(),
            ["0", "100000", "65536"]
        );
        let own = std::fs::read_link("/proc/self/ns/user").unwrap();
        assert_ne!(std::fs::read_link(h.ns_path("user")).unwrap(), own);
        assert_ne!(
            std::fs::read_link(h.ns_path("net")).unwrap(),
            std::fs::read_link("/proc/self/ns/net").unwrap()
        );
        let pid = h.pid;
        drop(h);
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "the helper is reaped on drop"
        );
    }
}
