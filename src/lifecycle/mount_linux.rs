//! Mounting a snapshot briefly on the host, to read files from a container's root filesystem
//! before the container runs (its `/etc/passwd` and `/etc/group`, to resolve user names), as
//! containerd's `mount.WithTempMount` does.

use std::path::Path;

use nix::mount::{mount, umount2, MntFlags, MsFlags};

use crate::images::backend::Mount;

/// Mounts `mounts` (as a snapshotter returns them: one `overlay` or `bind` mount) on `target`,
/// runs `f` on it, unmounts. `target` is created and removed.
pub fn with_temp_mount<T>(
    mounts: &[Mount],
    target: &Path,
    f: impl FnOnce(&Path) -> T,
) -> Result<T, String> {
    let m = mounts
        .first()
        .ok_or_else(|| "the snapshot has no mounts".to_string())?;
    std::fs::create_dir_all(target).map_err(|e| format!("create {}: {e}", target.display()))?;
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
    if let Err(e) = result {
        let _ = std::fs::remove_dir(target);
        return Err(format!("mount {} on {}: {e}", m.kind, target.display()));
    }
    let out = f(target);
    let _ = umount2(target, MntFlags::MNT_DETACH);
    let _ = std::fs::remove_dir(target);
    Ok(out)
}
