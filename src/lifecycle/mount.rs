//! Reading files from a container's root filesystem before the container runs (its
//! `/etc/passwd` and `/etc/group`, to resolve user names): in place when the snapshot is a
//! directory or plain overlay layers ([`snapshot_root`]), else by mounting the snapshot
//! briefly on the host, as containerd's `mount.WithTempMount` does ([`with_temp_mount`]).

use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use remora_host::mount::MountOption;
use thiserror::Error;

use crate::images::backend::Mount;
use crate::spec::RootFs;
use remora_host::userns::{IdMap, IdmappedLayers, UsernsHelper};

/// Why a snapshot could not be mounted.
#[derive(Debug, Error)]
pub enum MountError {
    /// The snapshotter returned no mounts.
    #[error("the snapshot has no mounts")]
    NoMounts,
    /// The snapshotter returned more than one mount (containerd 2.x's mount manager stacks
    /// them, e.g. an erofs layer under an overlay); remora mounts one.
    #[error("the snapshot has {0} mounts; remora can mount a snapshot of one mount only")]
    MultipleMounts(usize),
    /// A mount type remora cannot mount itself (a containerd mount-manager template such as
    /// `format/overlay` or `mkdir/…`).
    #[error("the snapshot's mount type {0:?} is not one remora can mount")]
    UnsupportedKind(String),
    /// A mount option remora cannot honour (loop devices, propagation, remount, or data
    /// options on a bind mount, which the kernel would ignore).
    #[error("the snapshot's {kind} mount has option {option:?}, which remora cannot honour")]
    UnsupportedOption {
        /// The mount type.
        kind: String,
        /// The option.
        option: String,
    },
    /// The mount point could not be made.
    #[error("create {}: {source}", path.display())]
    Target {
        /// The mount point.
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    /// The snapshot asks for an idmapped mount (`uidmap=`/`gidmap=`, a user-namespaced pod's
    /// image volume) and it could not be made.
    #[error("idmapped mount on {}: {source}", path.display())]
    Idmap {
        /// The mount point.
        path: std::path::PathBuf,
        source: remora_host::userns::UsernsError,
    },
    /// mount(2) failed.
    #[error("mount {kind} on {}: {errno}", path.display())]
    Mount {
        /// The mount type.
        kind: String,
        /// The mount point.
        path: std::path::PathBuf,
        errno: Errno,
    },
}

impl MountError {
    /// Whether the snapshot's mounts are of a shape remora refuses (rather than a mount that
    /// failed): a configuration matter, not a transient one.
    pub fn is_unsupported(&self) -> bool {
        matches!(
            self,
            MountError::NoMounts
                | MountError::MultipleMounts(_)
                | MountError::UnsupportedKind(_)
                | MountError::UnsupportedOption { .. }
        )
    }
}

/// Mounts `mounts` (as a snapshotter returns them: one `overlay` or `bind` mount) on `target`,
/// runs `f` on it, unmounts. `target` is created and removed.
pub fn with_temp_mount<T>(
    mounts: &[Mount],
    target: &Path,
    f: impl FnOnce(&Path) -> T,
) -> Result<T, MountError> {
    mount_on(mounts, target)?;
    let out = f(target);
    unmount_and_remove(target);
    Ok(out)
}

/// Flags every host mount of a snapshot gets whatever its options say: nothing remora mounts
/// under its state directory (image volumes, temporary rootfs mounts) may make a setuid
/// binary or a device node usable on the host (containerd's CVE-2024-25621 class).
const HOST_MOUNT_FLAGS: MsFlags = MsFlags::MS_NOSUID.union(MsFlags::MS_NODEV);

/// How one snapshot mount is mounted on the host, from its type and options the way
/// containerd's `parseMountOptions` reads them: flag-style options become mount flags, the
/// others the filesystem's data.
#[derive(Debug, Clone, PartialEq, Eq)]
enum MountPlan {
    /// A bind mount of `source` (recursive for `rbind`), then remounted with `flags`.
    Bind {
        source: String,
        recursive: bool,
        flags: MsFlags,
        idmap: Option<IdMaps>,
    },
    /// A filesystem mount.
    Fs {
        kind: String,
        source: String,
        flags: MsFlags,
        data: String,
        idmap: Option<IdMaps>,
    },
}

/// The uid and gid maps of an idmapped snapshot mount: containerd's overlayfs snapshotter adds
/// `uidmap=<inside>:<host>:<length>` and `gidmap=…` to the mounts of a snapshot made with its
/// remap labels.
type IdMaps = (IdMap, IdMap);

fn plan(mounts: &[Mount]) -> Result<MountPlan, MountError> {
    let m = match mounts {
        [] => return Err(MountError::NoMounts),
        [m] => m,
        more => return Err(MountError::MultipleMounts(more.len())),
    };
    if m.kind.is_empty() || m.kind.contains('/') {
        return Err(MountError::UnsupportedKind(m.kind.clone()));
    }
    let unsupported = |o: &str| MountError::UnsupportedOption {
        kind: m.kind.clone(),
        option: o.to_string(),
    };
    let mut flags = MsFlags::empty();
    let (mut bind, mut recursive) = (false, false);
    let mut data = Vec::new();
    let (mut uidmap, mut gidmap) = (None, None);
    for o in &m.options {
        if let Some(v) = o.strip_prefix("uidmap=") {
            uidmap = Some(IdMap::parse(v).ok_or_else(|| unsupported(o))?);
            continue;
        }
        if let Some(v) = o.strip_prefix("gidmap=") {
            gidmap = Some(IdMap::parse(v).ok_or_else(|| unsupported(o))?);
            continue;
        }
        match MountOption::parse(o) {
            MountOption::Bind { recursive: r } => {
                bind = true;
                recursive |= r;
            }
            // Asked-for suid/dev are overridden by HOST_MOUNT_FLAGS below.
            MountOption::Flags { set, clear } => {
                flags = remora_host::mount::apply(flags, set, clear);
            }
            // A loop device, a remount of something else, a propagation change or mandatory
            // locks: not what a snapshot mount on a fresh mount point may do here.
            MountOption::Special { .. } | MountOption::Propagation(_) | MountOption::Loop => {
                return Err(unsupported(o))
            }
            MountOption::Data(d) => data.push(d),
        }
    }
    flags |= HOST_MOUNT_FLAGS;
    let idmap = match (uidmap, gidmap) {
        (Some(u), Some(g)) => Some((u, g)),
        (None, None) => None,
        // One map alone is not an idmapped mount the kernel can make.
        (Some(_), None) => return Err(unsupported("uidmap= without gidmap=")),
        (None, Some(_)) => return Err(unsupported("gidmap= without uidmap=")),
    };
    if bind || matches!(m.kind.as_str(), "bind" | "rbind") {
        // The kernel ignores a bind mount's data: an option there (an idmap, say) would be
        // silently dropped.
        if let Some(o) = data.first() {
            return Err(unsupported(o));
        }
        return Ok(MountPlan::Bind {
            source: m.source.clone(),
            // The snapshotters' `bind` mounts come with `rbind`; a `bind` type without either
            // option is taken as recursive, as before.
            recursive: recursive || !bind,
            flags,
            idmap,
        });
    }
    // Only an overlay's layers can be idmapped one by one; another filesystem's data would
    // carry the maps to a kernel that ignores or refuses them.
    if idmap.is_some() && (m.kind != "overlay" || !data.iter().any(|d| d.starts_with("lowerdir=")))
    {
        return Err(unsupported("uidmap="));
    }
    Ok(MountPlan::Fs {
        kind: m.kind.clone(),
        source: m.source.clone(),
        flags,
        data: data.join(","),
        idmap,
    })
}

/// Mounts `mounts` (one `overlay` or `bind` mount, as a snapshotter returns them) on `target`,
/// which is created; on failure it is removed again. The mount is always `nosuid,nodev`; a
/// bind mount honours `ro` and the other flags by a remount (a bind ignores them on its first
/// mount). Several mounts, mount-manager types and options it cannot honour are refused
/// before anything is made ([`MountError::is_unsupported`]).
pub fn mount_on(mounts: &[Mount], target: &Path) -> Result<(), MountError> {
    let plan = plan(mounts)?;
    std::fs::create_dir_all(target).map_err(|source| MountError::Target {
        path: target.to_path_buf(),
        source,
    })?;
    let failed = |errno| MountError::Mount {
        kind: mounts.first().map(|m| m.kind.clone()).unwrap_or_default(),
        path: target.to_path_buf(),
        errno,
    };
    let idmap_failed = |source| MountError::Idmap {
        path: target.to_path_buf(),
        source,
    };
    // The user namespace an idmapped mount maps through, held until the mount is made (the
    // mount keeps its own reference to it).
    let idmaps = match &plan {
        MountPlan::Bind { idmap, .. } | MountPlan::Fs { idmap, .. } => *idmap,
    };
    let userns = match idmaps {
        Some((uids, gids)) => {
            let helper = UsernsHelper::spawn(uids, gids, false);
            match helper.and_then(|h| h.userns_fd().map(|fd| (h, fd))) {
                Ok(held) => Some(held),
                Err(e) => {
                    let _ = std::fs::remove_dir(target);
                    return Err(idmap_failed(e));
                }
            }
        }
        None => None,
    };
    let result = match &plan {
        MountPlan::Bind {
            source,
            recursive,
            flags,
            ..
        } => {
            let first = match &userns {
                // An idmapped clone of the directory alone (a snapshot's directory has no
                // mounts below it to carry along).
                Some((_, ns)) => remora_host::userns::idmapped_bind(
                    Path::new(source),
                    target,
                    ns,
                    flags.contains(MsFlags::MS_RDONLY),
                )
                .map_err(idmap_failed),
                None => {
                    let rec = if *recursive {
                        MsFlags::MS_REC
                    } else {
                        MsFlags::empty()
                    };
                    mount(
                        Some(source.as_str()),
                        target,
                        None::<&str>,
                        MsFlags::MS_BIND | rec,
                        None::<&str>,
                    )
                    .map_err(failed)
                }
            };
            first.and_then(|()| {
                // The remount sets the flags (nosuid, nodev, ro…) and keeps the idmap.
                mount(
                    None::<&str>,
                    target,
                    None::<&str>,
                    MsFlags::MS_BIND | MsFlags::MS_REMOUNT | *flags,
                    None::<&str>,
                )
                .map_err(failed)
                .inspect_err(|_| {
                    let _ = umount2(target, MntFlags::MNT_DETACH);
                })
            })
        }
        MountPlan::Fs {
            kind,
            source,
            flags,
            data,
            ..
        } => {
            // An overlay cannot be idmapped itself: its lower layers are, one by one, under a
            // scratch directory beside `target`, and detached once the overlay holds them.
            let layers = match &userns {
                Some((_, ns)) => {
                    let scratch = idmap_scratch(target);
                    let lower = data
                        .split(',')
                        .find_map(|d| d.strip_prefix("lowerdir="))
                        .unwrap_or_default();
                    IdmappedLayers::bind(lower, ns, &scratch)
                        .map(|(layers, lowerdir)| {
                            let data = data
                                .split(',')
                                .map(|d| {
                                    if d.starts_with("lowerdir=") {
                                        format!("lowerdir={lowerdir}")
                                    } else {
                                        d.to_string()
                                    }
                                })
                                .collect::<Vec<_>>()
                                .join(",");
                            (Some(layers), data)
                        })
                        .map_err(idmap_failed)
                }
                None => Ok((None, data.clone())),
            };
            layers.and_then(|(layers, data)| {
                let r = mount(
                    Some(source.as_str()),
                    target,
                    Some(kind.as_str()),
                    *flags,
                    Some(data.as_str()),
                )
                .map_err(failed);
                drop(layers);
                r
            })
        }
    };
    drop(userns);
    if let Err(e) = result {
        let _ = std::fs::remove_dir(target);
        return Err(e);
    }
    Ok(())
}

/// Where [`mount_on`] binds an idmapped overlay's layers while it mounts the overlay: beside
/// `target`, so that a sweep of `target`'s directory finds one left by a crash.
fn idmap_scratch(target: &Path) -> PathBuf {
    let mut name = target.file_name().unwrap_or_default().to_os_string();
    name.push(".idmapped-layers");
    target.with_file_name(name)
}

/// that is not mounted or not there is no error.
pub fn unmount_and_remove(target: &Path) {
    let _ = umount2(target, MntFlags::MNT_DETACH);
    let _ = std::fs::remove_dir(target);
}

/// Why an image volume's sub path cannot be mounted. The first four are the request's
/// fault (the path names nothing usable in the image); the others the host's.
#[derive(Debug, Error)]
pub enum SubPathError {
    /// Nothing at the path in the image.
    #[error("does not exist in the image")]
    Missing,
    /// The path (or a component of it) is not a directory.
    #[error("is not a directory in the image")]
    NotADirectory,
    /// The kernel refused a step out of the image's root (`EXDEV`). With `RESOLVE_IN_ROOT`
    /// `..` and absolute symlinks stay inside, so this is a defence, not the common case.
    #[error("escapes the image's root")]
    Escapes,
    /// A symlink loop, or a magic link (`/proc/…/fd/N` style) on the way.
    #[error("loops through symlinks or crosses a magic link")]
    Loop,
    /// The kernel has no `openat2(2)` (Linux ≥ 5.6): remora cannot resolve a path inside a
    /// root safely, so it mounts no sub path.
    #[error("this kernel has no openat2(2) to resolve it inside the image (Linux 5.6 or later)")]
    NoOpenat2,
    /// Opening the image's root or the path failed otherwise.
    #[error("open: {0}")]
    Open(Errno),
    /// The bind mount's target could not be made.
    #[error("create {}: {source}", path.display())]
    Target {
        /// The mount point.
        path: PathBuf,
        source: std::io::Error,
    },
    /// The bind mount failed.
    #[error("bind it on {}: {errno}", path.display())]
    Bind {
        /// The mount point.
        path: PathBuf,
        errno: Errno,
    },
}

impl SubPathError {
    /// Whether the request is at fault (the path names nothing mountable in the image).
    pub fn is_invalid(&self) -> bool {
        matches!(
            self,
            SubPathError::Missing
                | SubPathError::NotADirectory
                | SubPathError::Escapes
                | SubPathError::Loop
        )
    }
}

/// Opens directory `sub` of the tree at `root` (`O_PATH`), resolving it as if `root` were `/`:
/// `..` stops at `root` and absolute symlinks start from it (`openat2` with
/// `RESOLVE_IN_ROOT`), magic links are refused (`RESOLVE_NO_MAGICLINKS`). The result is
/// inside `root` whatever the tree's symlinks say; the caller uses the fd, not a path, so
/// nothing can swap the directory in between.
pub fn open_sub_path(root: &Path, sub: &str) -> Result<std::os::fd::OwnedFd, SubPathError> {
    use nix::fcntl::{open, openat2, OFlag, OpenHow, ResolveFlag};
    use nix::sys::stat::{fstat, Mode, SFlag};
    let root = open(
        root,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(SubPathError::Open)?;
    let how = || {
        OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS)
    };
    // EAGAIN: a rename elsewhere raced a `..` step (RESOLVE_IN_ROOT's check); the view is
    // read-only, so a few tries are plenty.
    let mut tries = 0;
    let fd = loop {
        match openat2(&root, sub, how()) {
            Err(Errno::EAGAIN) if tries < 8 => tries += 1,
            Err(Errno::ENOENT) => return Err(SubPathError::Missing),
            Err(Errno::ENOTDIR) => return Err(SubPathError::NotADirectory),
            Err(Errno::EXDEV) => return Err(SubPathError::Escapes),
            Err(Errno::ELOOP) => return Err(SubPathError::Loop),
            Err(Errno::ENOSYS) => return Err(SubPathError::NoOpenat2),
            Err(e) => return Err(SubPathError::Open(e)),
            Ok(fd) => break fd,
        }
    };
    let st = fstat(&fd).map_err(SubPathError::Open)?;
    if SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) != SFlag::S_IFDIR {
        return Err(SubPathError::NotADirectory);
    }
    Ok(fd)
}

/// Binds the directory open as `dir` (from [`open_sub_path`]) on `target`, which is created:
/// read-only, `nosuid`, `nodev`, not recursive. The source is the fd's `/proc/self/fd` entry,
/// which mount(2) follows to the directory itself. On failure `target` is removed again.
pub fn bind_dir_fd(dir: &std::os::fd::OwnedFd, target: &Path) -> Result<(), SubPathError> {
    use std::os::fd::AsRawFd;
    std::fs::create_dir(target).map_err(|source| SubPathError::Target {
        path: target.to_path_buf(),
        source,
    })?;
    let source = format!("/proc/self/fd/{}", dir.as_raw_fd());
    let result = mount(
        Some(source.as_str()),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .and_then(|()| {
        mount(
            None::<&str>,
            target,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | HOST_MOUNT_FLAGS,
            None::<&str>,
        )
        .inspect_err(|_| {
            let _ = umount2(target, MntFlags::MNT_DETACH);
        })
    });
    if let Err(errno) = result {
        let _ = std::fs::remove_dir(target);
        return Err(SubPathError::Bind {
            path: target.to_path_buf(),
            errno,
        });
    }
    Ok(())
}

/// A snapshot's root filesystem readable without mounting it: a `bind` mount's directory, or
/// an `overlay` mount's layers (upperdir, then the lowerdirs). See [`snapshot_root`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotRoot {
    /// One directory.
    Dir(PathBuf),
    /// Overlay layers, top first.
    Layers(Vec<PathBuf>),
}

impl SnapshotRoot {
    /// The root as the spec's user lookup reads it.
    pub fn as_rootfs(&self) -> RootFs<'_> {
        match self {
            SnapshotRoot::Dir(d) => RootFs::Dir(d),
            SnapshotRoot::Layers(l) => RootFs::Layers(l),
        }
    }
}

/// Overlay options that change nothing about how the layers' files read.
const PLAIN_OVERLAY_OPTIONS: &[&str] = &["index=off", "userxattr", "volatile", "ro", "rw"];

/// The snapshot's root, read in place, if its mounts are the plain kinds the overlayfs and
/// native snapshotters return: one `bind` mount of a directory, or one `overlay` mount with
/// absolute `lowerdir`s (and `upperdir`/`workdir`) and no option that changes how files read
/// (`metacopy`, `redirect_dir`, `datadir`…). `None` for anything else: the caller mounts it
/// ([`with_temp_mount`]) and lets the kernel read it.
pub fn snapshot_root(mounts: &[Mount]) -> Option<SnapshotRoot> {
    let [m] = mounts else { return None };
    let absolute = |p: &str| p.starts_with('/') && !p.split('/').any(|c| c == "..");
    match m.kind.as_str() {
        "bind" | "rbind" => absolute(&m.source).then(|| SnapshotRoot::Dir(m.source.clone().into())),
        "overlay" => {
            let (mut upper, mut lower) = (None, None);
            for o in &m.options {
                if let Some(v) = o.strip_prefix("lowerdir=") {
                    lower = Some(v);
                } else if let Some(v) = o.strip_prefix("upperdir=") {
                    upper = Some(v);
                } else if o.starts_with("workdir=")
                    || PLAIN_OVERLAY_OPTIONS.contains(&o.as_str())
                    // A user-namespaced pod's idmap changes who owns the files, not what they
                    // say: the passwd and group files read the same.
                    || o.starts_with("uidmap=")
                    || o.starts_with("gidmap=")
                {
                } else {
                    return None;
                }
            }
            // Escaped colons (`\:`) in a lowerdir path: leave those to the kernel.
            let lower = lower.filter(|l| !l.contains('\\'))?;
            let mut layers: Vec<PathBuf> = upper.into_iter().map(PathBuf::from).collect();
            layers.extend(lower.split(':').map(PathBuf::from));
            layers
                .iter()
                .all(|l| l.to_str().is_some_and(absolute))
                .then_some(SnapshotRoot::Layers(layers))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(kind: &str, source: &str, options: &[&str]) -> Mount {
        Mount {
            kind: kind.into(),
            source: source.into(),
            target: String::new(),
            options: options.iter().map(|o| o.to_string()).collect(),
        }
    }

    #[test]
    fn flag_options_become_flags_and_host_mounts_are_always_nosuid_nodev() {
        let host = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
        assert_eq!(
            plan(&[mount("bind", "/s/1/fs", &["rbind", "ro"])]).unwrap(),
            MountPlan::Bind {
                source: "/s/1/fs".into(),
                recursive: true,
                flags: host | MsFlags::MS_RDONLY,
                idmap: None,
            }
        );
        // `bind` is not recursive; `suid`/`dev` cannot undo the host flags.
        assert_eq!(
            plan(&[mount("bind", "/s/1/fs", &["bind", "suid", "dev", "noexec"])]).unwrap(),
            MountPlan::Bind {
                source: "/s/1/fs".into(),
                recursive: false,
                flags: host | MsFlags::MS_NOEXEC,
                idmap: None,
            }
        );
        // A `bind` option on another type is a bind, as the kernel treats MS_BIND.
        assert!(matches!(
            plan(&[mount("none", "/s/1/fs", &["rbind"])]).unwrap(),
            MountPlan::Bind {
                recursive: true,
                ..
            }
        ));
        assert_eq!(
            plan(&[mount(
                "overlay",
                "overlay",
                &["ro", "lowerdir=/a:/b", "nodiratime", "index=off"]
            )])
            .unwrap(),
            MountPlan::Fs {
                kind: "overlay".into(),
                source: "overlay".into(),
                flags: host | MsFlags::MS_RDONLY | MsFlags::MS_NODIRATIME,
                data: "lowerdir=/a:/b,index=off".into(),
                idmap: None,
            }
        );
        // `rw` after `ro` wins, as in containerd's left-to-right parse.
        assert!(matches!(
            plan(&[mount("overlay", "overlay", &["ro", "rw"])]).unwrap(),
            MountPlan::Fs { flags, .. } if flags == host
        ));
    }

    #[test]
    fn what_mount_on_cannot_do_is_refused_before_anything_is_made() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("t");
        for (mounts, want) in [
            (vec![], "no mounts"),
            (
                vec![
                    mount("bind", "/a", &["rbind"]),
                    mount("bind", "/b", &["rbind"]),
                ],
                "2 mounts",
            ),
            (
                vec![mount("format/overlay", "overlay", &[])],
                "format/overlay",
            ),
            (vec![mount("ext4", "/img", &["loop"])], "\"loop\""),
            (vec![mount("bind", "/a", &["rbind", "rshared"])], "rshared"),
            (vec![mount("tmpfs", "tmpfs", &["remount"])], "remount"),
            (
                vec![mount("bind", "/a", &["rbind", "uidmap=0:1000:1"])],
                "uidmap= without gidmap=",
            ),
            (
                vec![mount("bind", "/a", &["rbind", "gidmap=0:1000:1"])],
                "gidmap= without uidmap=",
            ),
            (
                vec![mount("bind", "/a", &["uidmap=0:1000", "gidmap=0:1000:1"])],
                "\"uidmap=0:1000\"",
            ),
            (
                vec![mount("bind", "/a", &["uidmap=0:1:1", "gidmap=0:1:0"])],
                "\"gidmap=0:1:0\"",
            ),
            // Only an overlay's layers can be idmapped one by one.
            (
                vec![mount("tmpfs", "tmpfs", &["uidmap=0:1:1", "gidmap=0:1:1"])],
                "uidmap=",
            ),
        ] {
            let e = mount_on(&mounts, &target).unwrap_err();
            assert!(e.to_string().contains(want), "{mounts:?}: {e}");
            assert!(e.is_unsupported(), "{e}");
            assert!(!target.exists(), "{mounts:?} made the target");
        }
    }

    #[test]
    fn an_idmapped_snapshots_maps_are_its_plans() {
        let map = |outside| IdMap {
            inside: 0,
            outside,
            length: 65536,
        };
        let p = plan(&[mount(
            "overlay",
            "overlay",
            &[
                "uidmap=0:1000:65536",
                "gidmap=0:2000:65536",
                "lowerdir=/a:/b",
            ],
        )])
        .unwrap();
        assert!(
            matches!(&p, MountPlan::Fs { data, idmap: Some(m), .. }
                if data == "lowerdir=/a:/b" && *m == (map(1000), map(2000))),
            "{p:?}"
        );
        let p = plan(&[mount(
            "bind",
            "/s/1/fs",
            &["uidmap=0:1000:65536", "gidmap=0:2000:65536", "ro", "rbind"],
        )])
        .unwrap();
        assert!(
            matches!(&p, MountPlan::Bind { idmap: Some(m), .. } if *m == (map(1000), map(2000))),
            "{p:?}"
        );
    }

    /// As root (the test bed): an idmapped snapshot's files, root's on disk, are seen as the
    /// map's host ID through the mount — a one-layer view (bind) and an overlay view of two
    /// layers alike — and the overlay's idmapped layers are not left mounted.
    #[test]
    fn an_idmapped_snapshot_mounted_on_the_host_shows_its_files_through_the_map() {
        use std::os::unix::fs::MetadataExt;
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root to mount");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        for (layer, file) in [(&a, "x"), (&b, "y")] {
            std::fs::create_dir(layer).unwrap();
            std::fs::write(layer.join(file), file).unwrap();
        }
        let maps = ["uidmap=0:1200000:65536", "gidmap=0:1300000:65536"];
        let bind = mount(
            "bind",
            a.to_str().unwrap(),
            &[maps[0], maps[1], "ro", "rbind"],
        );
        let lower = format!("lowerdir={}:{}", a.display(), b.display());
        let overlay = mount("overlay", "overlay", &[maps[0], maps[1], lower.as_str()]);
        for (i, m) in [bind, overlay].into_iter().enumerate() {
            let target = dir.path().join(format!("t{i}"));
            mount_on(std::slice::from_ref(&m), &target).unwrap();
            let md = std::fs::metadata(target.join("x")).unwrap();
            let ro = std::fs::write(target.join("new"), "").is_err();
            let layers_left = idmap_scratch(&target).exists();
            unmount_and_remove(&target);
            assert_eq!((md.uid(), md.gid()), (1_200_000, 1_300_000), "{m:?}");
            assert!(ro, "{m:?} is writable");
            assert!(!layers_left, "{m:?} left its idmapped layers");
            assert!(!target.exists());
        }
    }

    /// As root (the test bed): a snapshot mounted on the host is nosuid,nodev, what
    /// /proc/self/mountinfo says of it.
    #[test]
    fn mounts_on_the_host_are_nosuid_and_nodev() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root to mount");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("src");
        std::fs::create_dir(&source).unwrap();
        let opts_of = |t: &Path| {
            let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
            let table = crate::lifecycle::mountinfo::parse(&table);
            let m = crate::lifecycle::mountinfo::mount_of(&table, t)
                .unwrap()
                .clone();
            assert_eq!(m.mount_point, t);
            m.options
        };
        for (i, m) in [
            mount("bind", source.to_str().unwrap(), &["rbind", "ro"]),
            mount("bind", source.to_str().unwrap(), &["rbind", "rw", "suid"]),
            mount("tmpfs", "tmpfs", &["size=1m", "dev"]),
        ]
        .into_iter()
        .enumerate()
        {
            let target = dir.path().join(format!("t{i}"));
            mount_on(std::slice::from_ref(&m), &target).unwrap();
            let opts = opts_of(&target);
            unmount_and_remove(&target);
            assert!(
                opts.iter().any(|o| o == "nosuid") && opts.iter().any(|o| o == "nodev"),
                "{m:?}: {opts:?}"
            );
            assert_eq!(
                opts.iter().any(|o| o == "ro"),
                m.options.iter().any(|o| o == "ro"),
                "{m:?}: {opts:?}"
            );
        }
    }

    /// An image-like tree: `etc/` with a file, a file at the top, symlinks that point out of
    /// the tree every way a symlink can.
    fn image_tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("etc/ssl")).unwrap();
        std::fs::write(root.join("etc/passwd"), "root:x:0:0::/root:/bin/sh\n").unwrap();
        std::fs::write(root.join("file"), "").unwrap();
        let link = |to: &str, at: &str| std::os::unix::fs::symlink(to, root.join(at)).unwrap();
        link("/etc", "abs-etc");
        link("/usr", "abs-usr");
        link("../../../../../etc", "rel-out-etc");
        link("../../../../../usr", "rel-out-usr");
        link("etc/ssl", "rel-in");
        link("/file", "abs-file");
        link("loop-b", "loop-a");
        link("loop-a", "loop-b");
        dir
    }

    /// The directory `fd` is open on, as (device, inode).
    fn id_of_fd(fd: &std::os::fd::OwnedFd) -> (u64, u64) {
        let st = nix::sys::stat::fstat(fd).unwrap();
        (st.st_dev, st.st_ino)
    }

    fn id_of(p: &Path) -> (u64, u64) {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(p).unwrap();
        (m.dev(), m.ino())
    }

    #[test]
    fn a_sub_path_resolves_inside_the_root_whatever_its_dots_and_symlinks_say() {
        let dir = image_tree();
        let root = dir.path();
        for (sub, inside) in [
            ("etc", "etc"),
            ("etc/", "etc"),
            ("./etc/ssl/..", "etc"),
            ("rel-in", "etc/ssl"),
            // `..` stops at the root: the image's etc, not the host's.
            ("../../../../etc", "etc"),
            ("etc/../../..", ""),
            (".", ""),
            // An absolute symlink starts from the root; so does a relative one that climbs.
            ("abs-etc", "etc"),
            ("rel-out-etc", "etc"),
            ("abs-etc/ssl", "etc/ssl"),
        ] {
            let fd = open_sub_path(root, sub).unwrap_or_else(|e| panic!("{sub:?}: {e}"));
            assert_eq!(id_of_fd(&fd), id_of(&root.join(inside)), "{sub:?}");
        }
    }

    #[test]
    fn a_sub_path_out_of_the_root_or_not_a_directory_is_refused_with_why() {
        let dir = image_tree();
        let root = dir.path();
        for (sub, want) in [
            ("absent", "does not exist"),
            // The host has /usr; the image does not: the links must not reach it.
            ("abs-usr", "does not exist"),
            ("rel-out-usr", "does not exist"),
            ("../usr", "does not exist"),
            ("file", "is not a directory"),
            ("abs-file", "is not a directory"),
            ("etc/passwd", "is not a directory"),
            ("etc/passwd/x", "is not a directory"),
            ("loop-a", "loops"),
        ] {
            let e = open_sub_path(root, sub).expect_err(sub);
            assert!(e.to_string().contains(want), "{sub:?}: {e}");
            assert!(e.is_invalid(), "{sub:?}: {e}");
        }
    }

    /// A magic link (procfs' `cwd`, `root`, `fd/N`) is refused even though it is a directory:
    /// following one could leave any root.
    #[test]
    fn a_sub_path_through_a_magic_link_is_refused() {
        for sub in ["cwd", "root", "root/etc"] {
            let e = open_sub_path(Path::new("/proc/self"), sub).expect_err(sub);
            assert!(matches!(e, SubPathError::Loop), "{sub:?}: {e}");
        }
        // The same directory reached without a magic link opens.
        assert!(open_sub_path(Path::new("/proc/self"), "fd").is_ok());
    }

    /// As root: the bind shows the sub directory, read-only, nosuid, nodev.
    #[test]
    fn a_sub_path_is_bound_read_only_nosuid_nodev() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root to mount");
            return;
        }
        let dir = image_tree();
        let out = tempfile::tempdir().unwrap();
        let target = out.path().join("0-sub");
        let fd = open_sub_path(dir.path(), "abs-etc").unwrap();
        bind_dir_fd(&fd, &target).unwrap();
        let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let table = crate::lifecycle::mountinfo::parse(&table);
        let opts = crate::lifecycle::mountinfo::mount_of(&table, &target)
            .unwrap()
            .options
            .clone();
        let listed: Vec<_> = std::fs::read_dir(&target)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        let write = std::fs::write(target.join("new"), "");
        unmount_and_remove(&target);
        for o in ["ro", "nosuid", "nodev"] {
            assert!(opts.iter().any(|x| x == o), "{o}: {opts:?}");
        }
        let mut listed = listed;
        listed.sort();
        assert_eq!(listed, ["passwd", "ssl"]);
        assert!(write.is_err(), "written through a read-only bind");
        assert!(!target.exists());
    }

    #[test]
    fn an_idmapped_overlay_is_read_in_place_too() {
        let m = mount(
            "overlay",
            "overlay",
            &[
                "index=off",
                "workdir=/s/2/work",
                "upperdir=/s/2/fs",
                "lowerdir=/s/1/fs",
                "uidmap=0:1000:65536",
                "gidmap=0:1000:65536",
            ],
        );
        assert!(matches!(
            snapshot_root(&[m]),
            Some(SnapshotRoot::Layers(l)) if l == [PathBuf::from("/s/2/fs"), PathBuf::from("/s/1/fs")]
        ));
    }

    #[test]
    fn overlay_layers_are_read_top_first() {
        let m = mount(
            "overlay",
            "overlay",
            &[
                "index=off",
                "workdir=/s/3/work",
                "upperdir=/s/3/fs",
                "lowerdir=/s/2/fs:/s/1/fs",
            ],
        );
        assert_eq!(
            snapshot_root(&[m]),
            Some(SnapshotRoot::Layers(vec![
                "/s/3/fs".into(),
                "/s/2/fs".into(),
                "/s/1/fs".into()
            ]))
        );
        assert_eq!(
            snapshot_root(&[mount("bind", "/s/1/fs", &["rbind", "rw"])]),
            Some(SnapshotRoot::Dir("/s/1/fs".into()))
        );
    }

    #[test]
    fn anything_unusual_is_left_to_a_real_mount() {
        let lower = "lowerdir=/s/2/fs:/s/1/fs";
        for m in [
            vec![mount("overlay", "overlay", &[lower, "metacopy=on"])],
            vec![mount("overlay", "overlay", &[lower, "redirect_dir=on"])],
            vec![mount("overlay", "overlay", &["lowerdir=/s/a\\:b:/s/1/fs"])],
            vec![mount("overlay", "overlay", &["lowerdir=s/2/fs"])],
            vec![mount("overlay", "overlay", &["lowerdir=/s/../etc"])],
            vec![mount("overlay", "overlay", &["upperdir=/s/3/fs"])],
            vec![mount("erofs", "/s/1/layer.erofs", &["ro"])],
            vec![mount("bind", "relative", &[])],
            vec![mount("bind", "/a", &[]), mount("bind", "/b", &[])],
            vec![],
        ] {
            assert_eq!(snapshot_root(&m), None, "{m:?}");
        }
    }
}
