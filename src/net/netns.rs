//! Named network namespaces, bind-mounted under a directory (what containerd's `pkg/netns` and
//! iproute2's `ip netns add` do).
//!
//! Why a bind mount: a pod's namespace must outlive any process in it. It exists before the pause
//! container starts (CNI ADD runs first) and after the pause container dies (CNI DEL must still
//! find `eth0` there). Bind-mounting a thread's `/proc/self/task/<tid>/ns/net` onto a file keeps
//! the namespace alive until that file is unmounted.
//!
//! Why a dedicated OS thread: `unshare(CLONE_NEWNET)` and `setns` change the calling *thread*.
//! Doing it on a tokio worker or a blocking-pool thread would leave that thread serving unrelated
//! tasks inside the pod's namespace. Every namespace switch here runs on a fresh thread that exits
//! afterwards, so no thread is ever switched back (and none can be left in the wrong place).
//!
//! Why the directory is made a shared mount point (as iproute2 does for `/run/netns`): a mount
//! namespace that received a copy of the directory (a container bind-mounting the state dir)
//! would otherwise keep its own reference to each namespace, and unmounting ours would not free
//! it. With shared propagation our mounts and unmounts reach those copies too.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{setns, unshare, CloneFlags};
use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};
use nix::sys::statfs::{statfs, NSFS_MAGIC};
use thiserror::Error;

use crate::spec::namespaces::{ipc_pin, userns_pin, uts_pin};

/// Why a network namespace operation failed.
#[derive(Debug, Error)]
pub enum NetnsError {
    /// The name would escape the directory or is otherwise unusable as a file name.
    #[error("invalid network namespace name {name:?}: {reason}")]
    InvalidName {
        /// The rejected name.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A file-system step failed.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done ("create directory", "create mount point", ...).
        action: &'static str,
        /// The path involved.
        path: PathBuf,
        source: std::io::Error,
    },
    /// A mount-related system call failed.
    #[error("cannot {action} {}: {errno}", path.display())]
    Mount {
        /// What was being done ("bind-mount the namespace onto", "unmount", ...).
        action: &'static str,
        /// The path involved.
        path: PathBuf,
        errno: Errno,
    },
    /// `unshare(CLONE_NEWNET)` failed (missing CAP_SYS_ADMIN, or namespaces disabled).
    #[error("cannot create a network namespace: unshare(CLONE_NEWNET): {0}")]
    Unshare(Errno),
    /// `unshare(CLONE_NEWUTS [| CLONE_NEWIPC])` failed for a pod without a pause container.
    #[error("cannot create the pod's IPC and UTS namespaces: unshare: {0}")]
    UnsharePod(Errno),
    /// The pod's hostname could not be set in its new UTS namespace.
    #[error("cannot set the pod's hostname {hostname:?}: {errno}")]
    Hostname {
        /// The hostname.
        hostname: String,
        errno: Errno,
    },
    /// One of the pod's sysctls could not be written in its namespaces.
    #[error("cannot set sysctl {name:?} in the pod's namespaces: {source}")]
    Sysctl {
        /// The sysctl, dot form.
        name: String,
        source: std::io::Error,
    },
    /// The user namespace that is to own the network namespace could not be made.
    #[error("cannot create a user namespace for a network namespace: {0}")]
    Userns(#[from] remora_host::userns::UsernsError),
    /// A link could not be brought up or down.
    #[error("cannot set link {ifname} {state}: {errno}")]
    Link {
        /// The interface name.
        ifname: String,
        /// "up" or "down".
        state: &'static str,
        errno: Errno,
    },
    /// The namespace could not be entered.
    #[error("cannot enter network namespace {}: {errno}", path.display())]
    Enter {
        /// The namespace path.
        path: PathBuf,
        errno: Errno,
    },
    /// The OS thread doing the namespace work could not be started.
    #[error("cannot start a thread for network namespace work: {0}")]
    Thread(std::io::Error),
    /// The thread or blocking task doing the namespace work panicked or was cancelled.
    #[error("network namespace work did not complete: {0}")]
    Aborted(String),
}

/// A directory holding named network namespaces, prepared as a shared mount point.
#[derive(Debug, Clone)]
pub struct NetnsDir {
    dir: PathBuf,
}

impl NetnsDir {
    /// Creates `dir` if needed and makes it a shared mount point (bind-mounting it onto itself
    /// first if it is not a mount point yet). Call once per directory, before any `create`:
    /// concurrent first calls could stack two self-bind mounts.
    pub async fn prepare(dir: impl Into<PathBuf>) -> Result<Self, NetnsError> {
        let dir = dir.into();
        let d = dir.clone();
        blocking(move || prepare_dir(&d)).await??;
        Ok(Self { dir })
    }

    /// The directory.
    #[cfg(test)]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the namespace called `name` lives (whether or not it exists).
    pub fn path_of(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Creates a new network namespace at `<dir>/<name>` with `lo` up and returns its path.
    /// Fails if that file already exists; leaves nothing behind on failure.
    pub async fn create(&self, name: &str) -> Result<PathBuf, NetnsError> {
        validate_name(name)?;
        let path = self.path_of(name);
        let p = path.clone();
        blocking(move || create_at(&p)).await??;
        Ok(path)
    }
}

impl NetnsDir {
    /// Creates a new network namespace at `<dir>/<name>` *owned by* a new user namespace with
    /// the maps `uids` and `gids` (a user-namespaced pod's: its root must be able to configure
    /// the network and mount sysfs, which only the owning user namespace allows), with `lo` up.
    /// That user namespace is pinned too, at [`userns_pin`] of the returned path, for the pause
    /// container to join (it must be the owner, not another namespace with the same maps).
    /// Fails if either file exists; leaves nothing behind on failure; [`remove`] removes both.
    pub async fn create_in_userns(
        &self,
        name: &str,
        uids: remora_host::userns::IdMap,
        gids: remora_host::userns::IdMap,
    ) -> Result<PathBuf, NetnsError> {
        validate_name(name)?;
        let path = self.path_of(name);
        let p = path.clone();
        blocking(move || create_in_userns_at(&p, uids, gids)).await??;
        Ok(path)
    }
}

/// What the namespaces of a pod without a pause container start with: what runc would have
/// set in the pause container's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodNamespaces {
    /// The pod's hostname (its UTS namespace's).
    pub hostname: String,
    /// The pod has an IPC namespace of its own (else it uses the host's: only its UTS
    /// namespace is made and pinned).
    pub new_ipc: bool,
    /// The pod's sysctls, dot form, each already checked to live in a namespace the pod owns
    /// (`crate::spec::sysctl::check`): the `net.*` ones are written in the network namespace,
    /// the IPC and UTS ones in the new namespaces.
    pub sysctls: Vec<(String, String)>,
}

/// For a pod without a pause container (CRI-O's `pinns` does this for its pods): a new UTS
/// namespace and, unless the pod uses the host's, a new IPC namespace, the pod's hostname and
/// sysctls set in them and in the network namespace at `netns`, pinned beside it
/// ([`uts_pin`], [`ipc_pin`]) for the pod's containers to join. Fails if a pin exists; on
/// failure leaves no pin behind (the network namespace stays: [`remove`] of it removes the
/// pins too).
pub async fn pin_pod_namespaces(netns: &Path, pod: PodNamespaces) -> Result<(), NetnsError> {
    let netns = netns.to_path_buf();
    blocking(move || pin_blocking(&netns, pod)).await?
}

fn pin_blocking(netns: &Path, pod: PodNamespaces) -> Result<(), NetnsError> {
    let mut kinds = vec![(CloneFlags::CLONE_NEWUTS, "uts", uts_pin(netns))];
    if pod.new_ipc {
        kinds.push((CloneFlags::CLONE_NEWIPC, "ipc", ipc_pin(netns)));
    }
    let mut made_pins: Vec<PathBuf> = Vec::new();
    for (_, _, pin) in &kinds {
        if let Err(e) = create_mount_point(pin) {
            for p in &made_pins {
                let _ = remove_one(p);
            }
            return Err(e);
        }
        made_pins.push(pin.clone());
    }
    let ns_path = netns.to_path_buf();
    let made = on_new_thread(move || -> Result<(), NetnsError> {
        let ns = File::open(&ns_path).map_err(|source| NetnsError::Io {
            action: "open network namespace",
            path: ns_path.clone(),
            source,
        })?;
        setns(&ns, CloneFlags::CLONE_NEWNET).map_err(|errno| NetnsError::Enter {
            path: ns_path.clone(),
            errno,
        })?;
        let flags = kinds
            .iter()
            .fold(CloneFlags::empty(), |all, (flag, _, _)| all | *flag);
        unshare(flags).map_err(NetnsError::UnsharePod)?;
        // As runc does in a pause container: the hostname, then the sysctls (a
        // `kernel.hostname` sysctl wins).
        nix::unistd::sethostname(&pod.hostname).map_err(|errno| NetnsError::Hostname {
            hostname: pod.hostname.clone(),
            errno,
        })?;
        for (name, value) in &pod.sysctls {
            write_sysctl(name, value)?;
        }
        let tid = nix::unistd::gettid();
        for (_, kind, target) in &kinds {
            mount(
                Some(format!("/proc/self/task/{tid}/ns/{kind}").as_str()),
                target,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
            .map_err(|errno| NetnsError::Mount {
                action: "bind-mount the new namespace onto",
                path: target.clone(),
                errno,
            })?;
        }
        Ok(())
    })
    .and_then(|r| r);
    if made.is_err() {
        // Best effort: the pinning error is the one worth reporting.
        for p in &made_pins {
            let _ = remove_one(p);
        }
    }
    made
}

/// Writes sysctl `name` (checked by `crate::spec::sysctl::check`: letters, digits, `_`, `-`,
/// `.`, `/`, no empty component) in the calling thread's namespaces, under `/proc/sys` at
/// `crate::spec::sysctl::proc_sys_path`.
fn write_sysctl(name: &str, value: &str) -> Result<(), NetnsError> {
    use std::io::Write;
    let path = Path::new("/proc/sys").join(crate::spec::sysctl::proc_sys_path(name));
    let err = |source| NetnsError::Sysctl {
        name: name.to_string(),
        source,
    };
    // No create, no truncate: /proc/sys files take one write.
    let mut f = OpenOptions::new().write(true).open(&path).map_err(err)?;
    f.write_all(value.as_bytes()).map_err(err)
}

fn create_in_userns_at(
    path: &Path,
    uids: remora_host::userns::IdMap,
    gids: remora_host::userns::IdMap,
) -> Result<(), NetnsError> {
    let pin = userns_pin(path);
    // Mount points first (create_new: never two pods on one); on failure only what was made
    // here is removed, never another pod's namespace.
    create_mount_point(path)?;
    if let Err(e) = create_mount_point(&pin) {
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    let made = (|| {
        // The helper holds both namespaces until they are bind-mounted; it goes when `helper`
        // is dropped.
        let helper = remora_host::userns::UsernsHelper::spawn(uids, gids, true)?;
        for (ns, target) in [("net", path), ("user", pin.as_path())] {
            mount(
                Some(&helper.ns_path(ns)),
                target,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
            .map_err(|errno| NetnsError::Mount {
                action: "bind-mount the new namespace onto",
                path: target.to_path_buf(),
                errno,
            })?;
        }
        drop(helper);
        run_in(path, || set_link_up("lo", true))?
    })();
    if made.is_err() {
        // Best effort, as in create_at: the creation error is the one worth reporting.
        let _ = remove_blocking(path);
    }
    made
}

/// Undoes [`NetnsDir::prepare`] at a clean shutdown: unmounts the directory's self-bind mount,
/// but only while it holds no namespace. Pods that keep running across a restart keep their
/// namespaces mounted in it, so then it stays (the next start finds it shared already).
/// Returns whether a mount was removed; a directory that is absent or not a mount point is
/// not an error.
pub fn release_dir(dir: &Path) -> Result<bool, NetnsError> {
    let mut entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(source) => {
            return Err(NetnsError::Io {
                action: "read directory",
                path: dir.to_path_buf(),
                source,
            })
        }
    };
    if entries.next().is_some() {
        return Ok(false);
    }
    let mut removed = false;
    // A directory prepared by two processes racing could hold two stacked self-binds.
    // Lazily (`MNT_DETACH`): the self-bind shares the peer group of the mount it was made
    // from, and a plain umount of it answers EBUSY; it holds nothing, so nothing is lost.
    loop {
        match umount2(dir, MntFlags::MNT_DETACH) {
            Ok(()) => removed = true,
            Err(Errno::EINVAL) => return Ok(removed),
            Err(errno) => {
                return Err(NetnsError::Mount {
                    action: "unmount",
                    path: dir.to_path_buf(),
                    errno,
                })
            }
        }
    }
}

/// Unmounts (lazily, `MNT_DETACH`) and deletes the namespace file at `path`, and the
/// namespaces pinned beside it ([`userns_pin`], [`ipc_pin`], [`uts_pin`]) if there are any. Idempotent: an absent file or
/// one that is no longer mounted is fine.
pub async fn remove(path: &Path) -> Result<(), NetnsError> {
    let p = path.to_path_buf();
    blocking(move || remove_blocking(&p)).await?
}

/// Whether `path` is a live network namespace (an nsfs mount), as opposed to absent or a plain
/// file left behind. One `statfs` call; blocking, but cheap.
pub fn is_netns(path: &Path) -> Result<bool, NetnsError> {
    match statfs(path) {
        Ok(st) => Ok(st.filesystem_type() == NSFS_MAGIC),
        Err(Errno::ENOENT) => Ok(false),
        Err(errno) => Err(NetnsError::Mount {
            action: "statfs",
            path: path.to_path_buf(),
            errno,
        }),
    }
}

/// Runs `f` on a fresh OS thread that has joined the network namespace at `path`, and returns
/// its result. Blocking: call it from `spawn_blocking` in async code.
pub fn run_in<T, F>(path: &Path, f: F) -> Result<T, NetnsError>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let path = path.to_path_buf();
    on_new_thread(move || {
        let ns = File::open(&path).map_err(|source| NetnsError::Io {
            action: "open network namespace",
            path: path.clone(),
            source,
        })?;
        setns(&ns, CloneFlags::CLONE_NEWNET).map_err(|errno| NetnsError::Enter {
            path: path.clone(),
            errno,
        })?;
        Ok(f())
    })?
}

/// Sets the `IFF_UP` flag of `ifname` in the calling thread's network namespace, by
/// `SIOCGIFFLAGS`/`SIOCSIFFLAGS` on a datagram socket (no netlink needed for one flag).
pub fn set_link_up(ifname: &str, up: bool) -> Result<(), NetnsError> {
    let err = |errno| NetnsError::Link {
        ifname: ifname.to_string(),
        state: if up { "up" } else { "down" },
        errno,
    };
    let name = ifname.as_bytes();
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains(&0) {
        return Err(err(Errno::EINVAL));
    }
    let sock = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(err)?;
    // SAFETY: `ifreq` is plain data (a name array and a union of integers and sockaddrs), for
    // which all-zero bytes are a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(name) {
        *dst = *src as libc::c_char;
    }
    // SAFETY: the fd is a live socket and `req` is a properly sized, NUL-terminated `ifreq` that
    // outlives the call; SIOCGIFFLAGS only writes `ifr_ifru.ifru_flags`.
    Errno::result(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) })
        .map_err(err)?;
    // SAFETY: SIOCGIFFLAGS just filled in the `ifru_flags` member of the union.
    let mut flags = unsafe { req.ifr_ifru.ifru_flags };
    let up_flag = libc::IFF_UP as libc::c_short;
    if up {
        flags |= up_flag;
    } else {
        flags &= !up_flag;
    }
    req.ifr_ifru.ifru_flags = flags;
    // SAFETY: as above; SIOCSIFFLAGS only reads `req`.
    Errno::result(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) })
        .map_err(err)?;
    Ok(())
}

fn validate_name(name: &str) -> Result<(), NetnsError> {
    let reason = if name.is_empty() {
        Some("empty")
    } else if name.contains('/') || name.contains('\0') {
        Some("contains '/' or NUL")
    } else if name == "." || name == ".." {
        Some("is a relative directory name")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(NetnsError::InvalidName {
            name: name.to_string(),
            reason,
        }),
        None => Ok(()),
    }
}

fn prepare_dir(dir: &Path) -> Result<(), NetnsError> {
    std::fs::create_dir_all(dir).map_err(|source| NetnsError::Io {
        action: "create directory",
        path: dir.to_path_buf(),
        source,
    })?;
    let make_shared = || {
        mount(
            None::<&str>,
            dir,
            None::<&str>,
            MsFlags::MS_SHARED | MsFlags::MS_REC,
            None::<&str>,
        )
    };
    match make_shared() {
        Ok(()) => return Ok(()),
        // EINVAL: not a mount point yet; make it one below.
        Err(Errno::EINVAL) => {}
        Err(errno) => {
            return Err(NetnsError::Mount {
                action: "make shared mount",
                path: dir.to_path_buf(),
                errno,
            })
        }
    }
    mount(
        Some(dir),
        dir,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|errno| NetnsError::Mount {
        action: "bind-mount onto itself",
        path: dir.to_path_buf(),
        errno,
    })?;
    make_shared().map_err(|errno| NetnsError::Mount {
        action: "make shared mount",
        path: dir.to_path_buf(),
        errno,
    })
}

/// Creates the file a namespace is bind-mounted onto; `create_new`, so two pods can never
/// share one.
fn create_mount_point(path: &Path) -> Result<(), NetnsError> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map(drop)
        .map_err(|source| NetnsError::Io {
            action: "create mount point",
            path: path.to_path_buf(),
            source,
        })
}

fn create_at(path: &Path) -> Result<(), NetnsError> {
    create_mount_point(path)?;
    let target = path.to_path_buf();
    let made = on_new_thread(move || -> Result<(), NetnsError> {
        unshare(CloneFlags::CLONE_NEWNET).map_err(NetnsError::Unshare)?;
        // Up before the mount: if this fails, the namespace dies with this thread and there is
        // no mount to undo.
        set_link_up("lo", true)?;
        let own = format!("/proc/self/task/{}/ns/net", nix::unistd::gettid());
        mount(
            Some(own.as_str()),
            &target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|errno| NetnsError::Mount {
            action: "bind-mount the new network namespace onto",
            path: target.clone(),
            errno,
        })
    })
    .and_then(|r| r);
    if made.is_err() {
        // Best effort: the creation error is the one worth reporting; a failed cleanup leaves
        // at most an empty file, which a later `remove` deletes.
        let _ = remove_blocking(path);
    }
    made
}

fn remove_blocking(path: &Path) -> Result<(), NetnsError> {
    // The namespaces pinned beside it first (absent for most pods): a user-namespaced pod's
    // user namespace, the IPC and UTS namespaces of a pod without a pause container.
    for pin in [userns_pin(path), ipc_pin(path), uts_pin(path)] {
        remove_one(&pin)?;
    }
    remove_one(path)
}

fn remove_one(path: &Path) -> Result<(), NetnsError> {
    match umount2(path, MntFlags::MNT_DETACH) {
        // EINVAL: not a mount point (already unmounted); ENOENT: already gone.
        Ok(()) | Err(Errno::EINVAL) | Err(Errno::ENOENT) => {}
        Err(errno) => {
            return Err(NetnsError::Mount {
                action: "unmount",
                path: path.to_path_buf(),
                errno,
            })
        }
    }
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(NetnsError::Io {
            action: "remove",
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Runs `f` on a new OS thread and waits for it; the thread ends with `f`, taking any namespace
/// change with it.
fn on_new_thread<T, F>(f: F) -> Result<T, NetnsError>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    std::thread::Builder::new()
        .name("remora-netns".into())
        .spawn(f)
        .map_err(NetnsError::Thread)?
        .join()
        .map_err(|_| NetnsError::Aborted("namespace thread panicked".into()))
}

async fn blocking<T, F>(f: F) -> Result<T, NetnsError>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| NetnsError::Aborted(e.to_string()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use nix::ifaddrs::getifaddrs;
    use nix::net::if_::InterfaceFlags;
    use std::os::fd::FromRawFd;

    /// Fails (never skips) when not root: these tests are the only proof the namespace code
    /// works, and this machine runs them as root.
    pub(crate) fn require_root() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "network namespace tests need root (CAP_SYS_ADMIN, CAP_NET_ADMIN)"
        );
    }

    /// Lines of /proc/self/mountinfo whose mount point is under `path`.
    pub(crate) fn mounts_under(path: &Path) -> Vec<String> {
        let p = path.display().to_string();
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter(|l| l.split(' ').nth(4).is_some_and(|m| m.starts_with(&p)))
            .map(str::to_string)
            .collect()
    }

    /// Undoes `NetnsDir::prepare` on a temp dir so tests leave no mount behind.
    pub(crate) struct DirMount(pub(crate) PathBuf);
    impl Drop for DirMount {
        fn drop(&mut self) {
            let _ = umount2(&self.0, MntFlags::MNT_DETACH);
        }
    }

    #[test]
    fn names_that_escape_are_rejected() {
        for bad in ["", "a/b", "..", ".", "x\0"] {
            assert!(
                matches!(validate_name(bad), Err(NetnsError::InvalidName { .. })),
                "{bad:?}"
            );
        }
        validate_name("cni-1234").unwrap();
    }

    #[tokio::test]
    async fn create_brings_lo_up_and_remove_leaves_no_mount() {
        require_root();
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("netns");
        let nsdir = NetnsDir::prepare(&dir).await.unwrap();
        let _guard = DirMount(dir.clone());
        // Preparing twice is harmless (already a shared mount point).
        NetnsDir::prepare(&dir).await.unwrap();

        let path = nsdir.create("pod-a").await.unwrap();
        assert_eq!(path, dir.join("pod-a"));
        assert!(is_netns(&path).unwrap());
        assert_eq!(mounts_under(&path).len(), 1, "{:?}", mounts_under(&path));
        // A second namespace with the same name is refused, and the first is untouched.
        assert!(nsdir.create("pod-a").await.is_err());
        assert!(is_netns(&path).unwrap());

        let p = path.clone();
        let lo_up = tokio::task::spawn_blocking(move || {
            run_in(&p, || {
                let ifs: Vec<_> = getifaddrs().unwrap().collect();
                let names: Vec<String> = ifs.iter().map(|i| i.interface_name.clone()).collect();
                let lo_up = ifs
                    .iter()
                    .any(|i| i.interface_name == "lo" && i.flags.contains(InterfaceFlags::IFF_UP));
                (names, lo_up)
            })
        })
        .await
        .unwrap()
        .unwrap();
        assert!(lo_up.1, "lo is not up in the new namespace");
        // A fresh namespace has nothing but lo (the host's interfaces are not visible).
        assert!(lo_up.0.iter().all(|n| n == "lo"), "{:?}", lo_up.0);

        remove(&path).await.unwrap();
        assert!(!path.exists());
        assert!(mounts_under(&path).is_empty());
        assert!(!is_netns(&path).unwrap());
        // Idempotent.
        remove(&path).await.unwrap();
    }

    /// The inode of the namespace that `path` pins (or names).
    fn ns_inode(path: &Path) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).unwrap().ino()
    }

    #[tokio::test]
    async fn a_pod_without_pause_gets_pinned_ipc_and_uts_namespaces_with_its_hostname_and_sysctls()
    {
        require_root();
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("netns");
        let nsdir = NetnsDir::prepare(&dir).await.unwrap();
        let _guard = DirMount(dir.clone());
        let path = nsdir.create("pod-p").await.unwrap();
        let pod = PodNamespaces {
            hostname: "pinned-pod".into(),
            new_ipc: true,
            sysctls: vec![
                ("kernel.shmmni".into(), "1234".into()),
                ("net.ipv4.ip_unprivileged_port_start".into(), "77".into()),
            ],
        };
        pin_pod_namespaces(&path, pod.clone()).await.unwrap();
        let (ipc, uts) = (ipc_pin(&path), uts_pin(&path));
        assert!(is_netns(&ipc).unwrap() && is_netns(&uts).unwrap());
        // Namespaces of their own, not the host's.
        assert_ne!(ns_inode(&ipc), ns_inode(Path::new("/proc/self/ns/ipc")));
        assert_ne!(ns_inode(&uts), ns_inode(Path::new("/proc/self/ns/uts")));
        // What a container joining them sees.
        let seen = on_new_thread(move || {
            for (p, flag) in [
                (&path, CloneFlags::CLONE_NEWNET),
                (&ipc, CloneFlags::CLONE_NEWIPC),
                (&uts, CloneFlags::CLONE_NEWUTS),
            ] {
                setns(File::open(p).unwrap(), flag).unwrap();
            }
            let read = |p: &str| std::fs::read_to_string(p).unwrap().trim().to_string();
            (
                nix::unistd::gethostname().unwrap().into_string().unwrap(),
                read("/proc/sys/kernel/shmmni"),
                read("/proc/sys/net/ipv4/ip_unprivileged_port_start"),
            )
        })
        .unwrap();
        assert_eq!(seen, ("pinned-pod".into(), "1234".into(), "77".into()));
        // The host's are untouched.
        assert_ne!(nix::unistd::gethostname().unwrap(), "pinned-pod");
        let path = dir.join("pod-p");
        // Pinning twice is refused, and leaves the first pins alone.
        assert!(pin_pod_namespaces(&path, pod).await.is_err());
        assert!(is_netns(&ipc_pin(&path)).unwrap());
        remove(&path).await.unwrap();
        for p in [path.clone(), ipc_pin(&path), uts_pin(&path)] {
            assert!(!p.exists(), "{} left", p.display());
            assert!(mounts_under(&p).is_empty());
        }
    }

    #[tokio::test]
    async fn a_pin_that_fails_leaves_nothing_but_the_netns() {
        require_root();
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("netns");
        let nsdir = NetnsDir::prepare(&dir).await.unwrap();
        let _guard = DirMount(dir.clone());
        let path = nsdir.create("pod-q").await.unwrap();
        // A host-IPC pod: only UTS is made; a sysctl that does not exist fails the pinning.
        let err = pin_pod_namespaces(
            &path,
            PodNamespaces {
                hostname: "q".into(),
                new_ipc: false,
                sysctls: vec![("net.ipv4.no_such_sysctl".into(), "1".into())],
            },
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("net.ipv4.no_such_sysctl"), "{err}");
        assert!(!ipc_pin(&path).exists() && !uts_pin(&path).exists());
        assert!(is_netns(&path).unwrap());
        remove(&path).await.unwrap();
    }

    #[tokio::test]
    async fn a_netns_in_a_user_namespace_is_owned_by_it_and_removed_with_it() {
        use std::os::unix::fs::MetadataExt;
        require_root();
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("netns");
        let nsdir = NetnsDir::prepare(&dir).await.unwrap();
        let _guard = DirMount(dir.clone());
        let map = remora_host::userns::IdMap {
            inside: 0,
            outside: 300_000,
            length: 65536,
        };
        let path = nsdir.create_in_userns("pod-u", map, map).await.unwrap();
        let pin = userns_pin(&path);
        assert_eq!(pin, dir.join("pod-u.userns"));
        assert!(is_netns(&path).unwrap() && is_netns(&pin).unwrap());
        // The pinned namespace is a user namespace other than ours, and owns the netns:
        // NS_GET_USERNS (ioctl 0xb701) of the netns is the pinned one.
        let own = std::fs::metadata("/proc/self/ns/user").unwrap().ino();
        let pinned = std::fs::metadata(&pin).unwrap().ino();
        assert_ne!(pinned, own);
        let netns = File::open(&path).unwrap();
        // SAFETY: NS_GET_USERNS takes no argument and returns a new fd.
        let owner = unsafe { libc::ioctl(netns.as_raw_fd(), 0xb701) };
        assert!(owner >= 0, "NS_GET_USERNS: {}", Errno::last());
        // SAFETY: a new fd owned here.
        let owner = unsafe { File::from_raw_fd(owner) };
        assert_eq!(owner.metadata().unwrap().ino(), pinned);
        drop(owner);
        // The helper is gone and a second pod of that name is refused.
        assert!(nsdir.create_in_userns("pod-u", map, map).await.is_err());
        assert!(is_netns(&path).unwrap() && is_netns(&pin).unwrap());

        remove(&path).await.unwrap();
        assert!(!path.exists() && !pin.exists());
        assert!(mounts_under(&path).is_empty() && mounts_under(&pin).is_empty());
    }

    #[tokio::test]
    async fn remove_of_an_unmounted_leftover_file_deletes_it() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("leftover");
        std::fs::write(&path, b"").unwrap();
        assert!(!is_netns(&path).unwrap());
        remove(&path).await.unwrap();
        assert!(!path.exists());
    }

    #[tokio::test]
    async fn release_dir_unmounts_only_an_empty_prepared_dir() {
        require_root();
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("netns");
        let nsdir = NetnsDir::prepare(&dir).await.unwrap();
        let _guard = DirMount(dir.clone());
        let path = nsdir.create("pod-a").await.unwrap();

        // A live namespace keeps the directory mounted (its pod outlives the restart).
        assert!(!release_dir(&dir).unwrap());
        assert!(is_netns(&path).unwrap());
        assert_eq!(mounts_under(&dir).len(), 2, "{:?}", mounts_under(&dir));

        remove(&path).await.unwrap();
        assert!(release_dir(&dir).unwrap());
        assert!(mounts_under(&dir).is_empty(), "{:?}", mounts_under(&dir));
        // Idempotent, and an absent directory is fine.
        assert!(!release_dir(&dir).unwrap());
        assert!(!release_dir(&tmp.path().join("absent")).unwrap());
    }
}
