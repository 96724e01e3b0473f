//! A container's rootfs: the mounts containerd prepared (overlay or bind, in order) mounted on
//! the bundle's `rootfs`, idmapped for a user-namespaced pod, and unmounted at delete.

use std::path::Path;

use remora_host::mount::MountOption;

use crate::error::ShimError;

/// Mount flags and data of containerd's mount options ([`MountOption`], read as containerd
/// reads them). A propagation change or `loop` is passed on as data, which the kernel refuses:
/// a rootfs mount has no use for either.
fn mount_options(options: &[String]) -> (nix::mount::MsFlags, String) {
    use nix::mount::MsFlags as F;
    let mut flags = F::empty();
    let mut data = Vec::new();
    for o in options {
        match MountOption::parse(o) {
            MountOption::Flags { set, clear } | MountOption::Special { set, clear } => {
                flags = remora_host::mount::apply(flags, set, clear);
            }
            MountOption::Bind { recursive } => {
                flags |= F::MS_BIND;
                if recursive {
                    flags |= F::MS_REC;
                }
            }
            MountOption::Propagation(_) | MountOption::Loop => data.push(o.as_str()),
            MountOption::Data(d) => data.push(d),
        }
    }
    (flags, data.join(","))
}

/// The maps of a user-namespaced pod's rootfs mount (containerd's overlayfs snapshotter adds
/// `uidmap=0:<host>:<len>` and `gidmap=…` options when asked for an idmapped snapshot), and the
/// other options.
fn split_idmap_options(
    options: &[String],
) -> (
    Option<(remora_host::userns::IdMap, remora_host::userns::IdMap)>,
    Vec<String>,
) {
    let (mut uid, mut gid, mut rest) = (None, None, Vec::new());
    for o in options {
        if let Some(v) = o.strip_prefix("uidmap=") {
            uid = Some(v);
        } else if let Some(v) = o.strip_prefix("gidmap=") {
            gid = Some(v);
        } else {
            rest.push(o.clone());
        }
    }
    let maps = match (uid, gid) {
        (Some(u), Some(g)) => {
            remora_host::userns::IdMap::parse(u).zip(remora_host::userns::IdMap::parse(g))
        }
        _ => None,
    };
    (maps, rest)
}

/// An idmapped rootfs mount, as containerd's mount code makes it for its Go shim: for overlay,
/// each lower layer is bound read-only and idmapped through a user namespace with the maps
/// (Linux 5.19 lets overlayfs stack on idmapped layers) under `scratch`, the overlay is mounted
/// over those, and the idmapped binds are detached (the overlay holds what it needs); a bind
/// mount is itself made idmapped. The upper layer is not idmapped: the pod's root writes as
/// its host ID (the snapshotter chowned the upper root to it).
fn mount_idmapped(
    id: &str,
    m: &containerd_shim_protos::types::mount::Mount,
    options: &[String],
    maps: (remora_host::userns::IdMap, remora_host::userns::IdMap),
    target: &Path,
    scratch: &Path,
) -> Result<(), ShimError> {
    use nix::mount::mount;
    let idmap_err = |source| ShimError::Idmap {
        id: id.to_string(),
        source,
    };
    let helper =
        remora_host::userns::UsernsHelper::spawn(maps.0, maps.1, false).map_err(idmap_err)?;
    let userns = helper.userns_fd().map_err(idmap_err)?;
    let (flags, _) = mount_options(options);
    if m.type_ != "overlay" {
        return remora_host::userns::idmapped_bind(
            Path::new(&m.source),
            target,
            &userns,
            flags.contains(nix::mount::MsFlags::MS_RDONLY),
        )
        .map_err(idmap_err);
    }
    // Held until the overlay is mounted over them (or it failed); dropped, they detach.
    let mut layers = Vec::new();
    let result = (|| {
        let mut rewritten = Vec::with_capacity(options.len());
        for o in options {
            let Some(lower) = o.strip_prefix("lowerdir=") else {
                rewritten.push(o.clone());
                continue;
            };
            let (bound, lowerdir) = remora_host::userns::IdmappedLayers::bind(
                lower,
                &userns,
                &scratch.join(layers.len().to_string()),
            )
            .map_err(idmap_err)?;
            layers.push(bound);
            rewritten.push(format!("lowerdir={lowerdir}"));
        }
        let (flags, data) = mount_options(&rewritten);
        mount(
            Some(m.source.as_str()),
            target,
            Some("overlay"),
            flags,
            Some(data.as_str()),
        )
        .map_err(|source| ShimError::Rootfs {
            id: id.to_string(),
            op: "mount",
            target: target.display().to_string(),
            source,
        })
    })();
    drop(layers);
    let _ = std::fs::remove_dir(scratch);
    result
}

/// Mounts the rootfs containerd prepared (overlay or bind mounts, in order) on `target`.
pub(crate) fn mount_rootfs(
    id: &str,
    mounts: &[containerd_shim_protos::types::mount::Mount],
    target: &Path,
) -> Result<(), ShimError> {
    use nix::mount::{mount, MsFlags};
    let fail = |source| ShimError::Rootfs {
        id: id.to_string(),
        op: "mount",
        target: target.display().to_string(),
        source,
    };
    if let Err(e) = std::fs::create_dir(target) {
        if e.kind() != std::io::ErrorKind::AlreadyExists {
            return Err(ShimError::BundleFile {
                path: target.display().to_string(),
                source: e,
            });
        }
    }
    for (done, m) in mounts.iter().enumerate() {
        if let (Some(maps), options) = split_idmap_options(&m.options) {
            let scratch = target.with_file_name(format!("idmapped-layers-{done}"));
            if let Err(e) = mount_idmapped(id, m, &options, maps, target, &scratch) {
                for _ in 0..done {
                    let _ = nix::mount::umount2(target, nix::mount::MntFlags::MNT_DETACH);
                }
                return Err(e);
            }
            continue;
        }
        let (flags, data) = mount_options(&m.options);
        let data = (!data.is_empty()).then_some(data.as_str());
        let kind = (!m.type_.is_empty()).then_some(m.type_.as_str());
        let r = mount(Some(m.source.as_str()), target, kind, flags, data).and_then(|()| {
            // A read-only bind mount takes a remount to become read-only.
            if flags.contains(MsFlags::MS_BIND) && flags.contains(MsFlags::MS_RDONLY) {
                mount(
                    None::<&str>,
                    target,
                    None::<&str>,
                    flags | MsFlags::MS_REMOUNT,
                    None::<&str>,
                )
            } else {
                Ok(())
            }
        });
        if let Err(e) = r {
            for _ in 0..done {
                let _ = nix::mount::umount2(target, nix::mount::MntFlags::MNT_DETACH);
            }
            return Err(fail(e));
        }
    }
    Ok(())
}

pub(crate) fn unmount(id: &str, target: &Path) -> Result<(), ShimError> {
    match nix::mount::umount2(target, nix::mount::MntFlags::MNT_DETACH) {
        Ok(()) | Err(nix::Error::EINVAL) | Err(nix::Error::ENOENT) => Ok(()),
        Err(source) => Err(ShimError::Rootfs {
            id: id.to_string(),
            op: "unmount",
            target: target.display().to_string(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_options_split_into_flags_and_data() {
        use nix::mount::MsFlags as F;
        let opts: Vec<String> = [
            "ro",
            "rbind",
            "nosuid",
            "lowerdir=/a:/b",
            "defaults",
            "upperdir=/u",
            "rw",
            "remount",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let (flags, data) = mount_options(&opts);
        assert_eq!(flags, F::MS_BIND | F::MS_REC | F::MS_NOSUID | F::MS_REMOUNT);
        // `defaults` is no data (containerd's reading): the kernel would refuse it.
        assert_eq!(data, "lowerdir=/a:/b,upperdir=/u");
    }
}
