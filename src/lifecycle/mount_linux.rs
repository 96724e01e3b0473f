//! Reading files from a container's root filesystem before the container runs (its
//! `/etc/passwd` and `/etc/group`, to resolve user names): in place when the snapshot is a
//! directory or plain overlay layers ([`snapshot_root`]), else by mounting the snapshot
//! briefly on the host, as containerd's `mount.WithTempMount` does ([`with_temp_mount`]).

use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use thiserror::Error;

use crate::images::backend::Mount;
use crate::spec::RootFs;

/// Why a snapshot could not be mounted.
#[derive(Debug, Error)]
pub enum MountError {
    /// The snapshotter returned no mounts.
    #[error("the snapshot has no mounts")]
    NoMounts,
    /// The mount point could not be made.
    #[error("create {}: {source}", path.display())]
    Target {
        /// The mount point.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// mount(2) failed.
    #[error("mount {kind} on {}: {errno}", path.display())]
    Mount {
        /// The mount type.
        kind: String,
        /// The mount point.
        path: std::path::PathBuf,
        /// Why.
        errno: Errno,
    },
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

/// Mounts `mounts` (one `overlay` or `bind` mount, as a snapshotter returns them) on `target`,
/// which is created; on failure it is removed again. A bind mount honours `ro` (a bind ignores
/// the flag on its first mount: it is remounted read-only).
pub fn mount_on(mounts: &[Mount], target: &Path) -> Result<(), MountError> {
    let m = mounts.first().ok_or(MountError::NoMounts)?;
    std::fs::create_dir_all(target).map_err(|source| MountError::Target {
        path: target.to_path_buf(),
        source,
    })?;
    let readonly = m.options.iter().any(|o| o == "ro");
    let result = match m.kind.as_str() {
        "bind" | "rbind" => mount(
            Some(m.source.as_str()),
            target,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .and_then(|()| {
            if !readonly {
                return Ok(());
            }
            mount(
                None::<&str>,
                target,
                None::<&str>,
                MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
                None::<&str>,
            )
            .inspect_err(|_| {
                let _ = umount2(target, MntFlags::MNT_DETACH);
            })
        }),
        kind => {
            // Only data options go to the filesystem; "ro"/"rw" become flags.
            let flags = if readonly {
                MsFlags::MS_RDONLY
            } else {
                MsFlags::empty()
            };
            let data: Vec<&str> = m
                .options
                .iter()
                .map(String::as_str)
                .filter(|o| !matches!(*o, "ro" | "rw"))
                .collect();
            let data = data.join(",");
            mount(
                Some(m.source.as_str()),
                target,
                Some(kind),
                flags,
                Some(data.as_str()),
            )
        }
    };
    if let Err(errno) = result {
        let _ = std::fs::remove_dir(target);
        return Err(MountError::Mount {
            kind: m.kind.clone(),
            path: target.to_path_buf(),
            errno,
        });
    }
    Ok(())
}

/// Detaches whatever is mounted on `target` and removes the (then empty) directory; a target
/// that is not mounted or not there is no error.
pub fn unmount_and_remove(target: &Path) {
    let _ = umount2(target, MntFlags::MNT_DETACH);
    let _ = std::fs::remove_dir(target);
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
