//! Mounting a snapshot briefly on the host, to read files from a container's root filesystem
//! before the container runs (its `/etc/passwd` and `/etc/group`, to resolve user names), as
//! containerd's `mount.WithTempMount` does.

use std::path::Path;

use nix::errno::Errno;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use thiserror::Error;

use crate::images::backend::Mount;

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
    let m = mounts.first().ok_or(MountError::NoMounts)?;
    std::fs::create_dir_all(target).map_err(|source| MountError::Target {
        path: target.to_path_buf(),
        source,
    })?;
    let result = match m.kind.as_str() {
        "bind" => mount(
            Some(m.source.as_str()),
            target,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        ),
        kind => {
            // Only data options go to the filesystem; "ro"/"rw" become flags.
            let mut flags = MsFlags::empty();
            let data: Vec<&str> = m
                .options
                .iter()
                .map(String::as_str)
                .filter(|o| match *o {
                    "ro" => {
                        flags |= MsFlags::MS_RDONLY;
                        false
                    }
                    "rw" => false,
                    _ => true,
                })
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
    let out = f(target);
    let _ = umount2(target, MntFlags::MNT_DETACH);
    let _ = std::fs::remove_dir(target);
    Ok(out)
}
