//! Container and sandbox mounts.
//!
//! A container gets containerd's default mounts (proc, a tmpfs `/dev`, devpts, shm, mqueue,
//! read-only sysfs and cgroupfs — writable when privileged; no `/run` tmpfs, which CRI
//! drops), the sandbox's `/etc/hostname`, `/etc/hosts`, `/etc/resolv.conf` and `/dev/shm`
//! (each unless the CRI config mounts that path itself; read-only when the rootfs is), and the
//! CRI mounts as recursive binds. Default mounts at a path the CRI mounts cover are dropped,
//! as is everything under `/dev` when `/dev` itself is mounted.
//!
//! For a pod with a user namespace of its own, the mounts remora makes (the pod's files and
//! `/dev/shm`) are idmapped with the pod's maps (OCI `uidMappings`/`gidMappings` on the mount;
//! the OCI runtime makes an idmapped mount, runc ≥ 1.2), so the host's root-owned files appear
//! owned by the pod's root rather than `nobody`; CRI mounts carry the maps the request gives
//! them (containerd's rules).
//!
//! Binds are ordered by path depth (stable) so a parent never shadows a child mounted
//! earlier. containerd creates a missing bind source as a directory; here that decision is
//! returned as data ([`MountPlan::host_dirs_to_create`]) so this module does no I/O.

use std::path::{Component, Path, PathBuf};

use oci_spec::runtime::{LinuxIdMapping, LinuxIdMappingBuilder, Mount, MountBuilder};

use super::types::{IdMapping, MountPropagation, MountRequest, SandboxFiles, UserNamespace};
use super::SpecError;

/// Where the sandbox's hostname file goes.
pub const ETC_HOSTNAME: &str = "/etc/hostname";
/// Where the sandbox's hosts file goes.
pub const ETC_HOSTS: &str = "/etc/hosts";
/// Where the sandbox's resolv.conf goes.
pub const RESOLV_CONF: &str = "/etc/resolv.conf";
/// The shared-memory mount point.
pub const DEV_SHM: &str = "/dev/shm";

/// The mounts of a spec and what the caller must do on the host before starting it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MountPlan {
    /// Mounts in spec order.
    pub mounts: Vec<Mount>,
    /// `linux.rootfsPropagation` (`rshared` / `rslave`) when a bind needs it; `None` keeps
    /// runc's default (`rprivate`).
    pub rootfs_propagation: Option<String>,
    /// Bind sources to create as directories (mode 0755, with parents) **if they do not
    /// exist** — containerd's behaviour for a missing `hostPath`.
    pub host_dirs_to_create: Vec<PathBuf>,
}

fn mount(dest: &str, typ: &str, source: &str, options: &[&str]) -> Result<Mount, SpecError> {
    Ok(MountBuilder::default()
        .destination(dest)
        .typ(typ)
        .source(source)
        .options(options.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .build()?)
}

/// containerd's default Linux mounts for CRI containers (without `/run`). sysfs and
/// cgroupfs are read-only unless `privileged`.
pub fn default_mounts(privileged: bool) -> Result<Vec<Mount>, SpecError> {
    let ro = if privileged { "rw" } else { "ro" };
    Ok(vec![
        mount("/proc", "proc", "proc", &["nosuid", "noexec", "nodev"])?,
        mount(
            "/dev",
            "tmpfs",
            "tmpfs",
            &["nosuid", "strictatime", "mode=755", "size=65536k"],
        )?,
        mount(
            "/dev/pts",
            "devpts",
            "devpts",
            &[
                "nosuid",
                "noexec",
                "newinstance",
                "ptmxmode=0666",
                "mode=0620",
                "gid=5",
            ],
        )?,
        mount(
            DEV_SHM,
            "tmpfs",
            "shm",
            &["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        )?,
        mount(
            "/dev/mqueue",
            "mqueue",
            "mqueue",
            &["nosuid", "noexec", "nodev"],
        )?,
        mount("/sys", "sysfs", "sysfs", &["nosuid", "noexec", "nodev", ro])?,
        mount(
            "/sys/fs/cgroup",
            "cgroup",
            "cgroup",
            &["nosuid", "noexec", "nodev", "relatime", ro],
        )?,
    ])
}

/// Cleans an absolute container path lexically. Relative paths, paths whose `..` would
/// climb above `/`, and `/` itself are rejected: a mount there is a mistake or an attack.
pub fn clean_destination(dest: &str) -> Result<String, SpecError> {
    let invalid = |reason: &'static str| SpecError::InvalidMountDestination {
        destination: dest.to_owned(),
        reason,
    };
    let path = Path::new(dest);
    if !path.is_absolute() {
        return Err(invalid("it is not an absolute path"));
    }
    let mut parts: Vec<&str> = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(s) => parts.push(s.to_str().ok_or(invalid("it is not UTF-8"))?),
            Component::ParentDir => {
                if parts.pop().is_none() {
                    return Err(invalid("`..` escapes the container root"));
                }
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    if parts.is_empty() {
        return Err(invalid("it is the container root"));
    }
    Ok(format!("/{}", parts.join("/")))
}

/// A bind mount as containerd builds it for a CRI mount: `rbind`, the propagation option,
/// then `ro` / `rw`, and `rro` for a recursive read-only one (the OCI runtime then makes
/// every submount read-only too; `ro` alone covers only the top mount); then the CRI's
/// `mount_options` (`noexec`, `nodev`, `nosuid`). With maps, an idmapped mount.
fn bind(m: &MountRequest, dest: &str) -> Result<Mount, SpecError> {
    let prop = match m.propagation {
        MountPropagation::Private => "rprivate",
        MountPropagation::HostToContainer => "rslave",
        MountPropagation::Bidirectional => "rshared",
    };
    let mut options = vec![
        "rbind".to_owned(),
        prop.to_owned(),
        if m.readonly { "ro" } else { "rw" }.to_owned(),
    ];
    if m.recursive_read_only {
        options.push("rro".to_owned());
    }
    // CRI mount_options: the OCI runtime remounts the bind with these flags (top mount only,
    // as mount(8) does for a bind).
    options.extend(m.options.iter().map(|o| o.as_str().to_owned()));
    let mut b = MountBuilder::default()
        .destination(dest)
        .typ("bind")
        .source(&m.host_path)
        .options(options);
    if !m.uid_mappings.is_empty() || !m.gid_mappings.is_empty() {
        b = b
            .uid_mappings(linux_id_mappings(&m.uid_mappings)?)
            .gid_mappings(linux_id_mappings(&m.gid_mappings)?);
    }
    Ok(b.build()?)
}

/// OCI `LinuxIDMapping`s of `maps`.
pub fn linux_id_mappings(maps: &[IdMapping]) -> Result<Vec<LinuxIdMapping>, SpecError> {
    maps.iter()
        .map(|m| {
            Ok(LinuxIdMappingBuilder::default()
                .container_id(m.container_id)
                .host_id(m.host_id)
                .size(m.length)
                .build()?)
        })
        .collect()
}

/// The idmaps of a mount remora makes itself (pod files, `/dev/shm`) for a pod with user
/// namespace `user`: the pod's maps, so root-owned host files appear owned by the pod's root,
/// as containerd maps its own mounts of such a pod.
fn own_mount_maps(user: Option<&UserNamespace>) -> (Vec<IdMapping>, Vec<IdMapping>) {
    match user {
        Some(u) => (vec![u.uids], vec![u.gids]),
        None => (Vec::new(), Vec::new()),
    }
}

/// In place of sysfs, for a user-namespaced pod on the host's network: mounting sysfs needs
/// the user namespace to own the network namespace (EPERM otherwise), so the host's is bound
/// read-only, as containerd does.
fn host_sys_bind() -> Result<Mount, SpecError> {
    mount(
        "/sys",
        "bind",
        "/sys",
        &["rbind", "rro", "nosuid", "nodev", "noexec"],
    )
}

/// All mounts of a container.
///
/// `host_ipc`: the container uses the host IPC namespace, so it gets the host's `/dev/shm`.
/// `user`: the pod's own user namespace, if it has one: the pod's files and `/dev/shm` are then
/// idmapped with its maps.
pub fn container_mounts(
    requested: &[MountRequest],
    files: &SandboxFiles,
    readonly_rootfs: bool,
    host_ipc: bool,
    privileged: bool,
    user: Option<(&UserNamespace, bool)>,
) -> Result<MountPlan, SpecError> {
    let (uid_mappings, gid_mappings) = own_mount_maps(user.map(|(u, _)| u));
    let mut cri: Vec<(String, &MountRequest)> = Vec::with_capacity(requested.len());
    for m in requested {
        if !m.host_path.is_absolute() {
            return Err(SpecError::InvalidMountSource {
                destination: m.container_path.clone(),
                source_path: m.host_path.clone(),
            });
        }
        cri.push((clean_destination(&m.container_path)?, m));
    }
    let covered = |dest: &str| cri.iter().any(|(d, _)| d == dest);

    // The sandbox's files, unless the user mounts something there.
    let mut extra: Vec<MountRequest> = Vec::new();
    let sandbox_file = |dest: &str, src: &Option<PathBuf>| {
        src.as_ref()
            .filter(|_| !covered(dest))
            .map(|src| MountRequest {
                container_path: dest.to_owned(),
                host_path: src.clone(),
                readonly: readonly_rootfs,
                uid_mappings: uid_mappings.clone(),
                gid_mappings: gid_mappings.clone(),
                ..MountRequest::default()
            })
    };
    extra.extend(sandbox_file(ETC_HOSTNAME, &files.hostname));
    extra.extend(sandbox_file(ETC_HOSTS, &files.hosts));
    extra.extend(sandbox_file(RESOLV_CONF, &files.resolv_conf));
    let shm = if host_ipc {
        Some(PathBuf::from(DEV_SHM))
    } else {
        files.shm.clone()
    };
    if let Some(shm) = shm.filter(|_| !covered(DEV_SHM)) {
        // Shared memory is for writing, whatever the rootfs is.
        extra.push(MountRequest {
            container_path: DEV_SHM.to_owned(),
            host_path: shm,
            uid_mappings: uid_mappings.clone(),
            gid_mappings: gid_mappings.clone(),
            ..MountRequest::default()
        });
    }

    let mut binds: Vec<(String, &MountRequest)> = extra
        .iter()
        .map(|m| (m.container_path.clone(), m))
        .collect();
    binds.extend(cri.iter().cloned());
    binds.sort_by_key(|(dest, _)| dest.split('/').count());

    let bind_dests: Vec<&str> = binds.iter().map(|(d, _)| d.as_str()).collect();
    let dev_mounted = bind_dests.contains(&"/dev");
    let mut plan = MountPlan::default();
    // A user-namespaced pod on the host network (the bool) cannot mount sysfs.
    let sys_bound = matches!(user, Some((_, true)));
    for m in default_mounts(privileged)? {
        let dest = m.destination().to_string_lossy();
        if bind_dests.contains(&dest.as_ref()) || (dev_mounted && dest.starts_with("/dev/")) {
            continue;
        }
        if sys_bound && dest == "/sys" {
            plan.mounts.push(host_sys_bind()?);
            continue;
        }
        plan.mounts.push(m);
    }
    for (dest, m) in &binds {
        plan.mounts.push(bind(m, dest)?);
        match m.propagation {
            MountPropagation::Bidirectional => plan.rootfs_propagation = Some("rshared".into()),
            MountPropagation::HostToContainer => {
                // rshared already implies receiving host mounts; do not weaken it.
                if plan.rootfs_propagation.is_none() {
                    plan.rootfs_propagation = Some("rslave".into());
                }
            }
            MountPropagation::Private => {}
        }
    }
    // Image volumes are mounted already; nothing of the host is made for them.
    plan.host_dirs_to_create = cri
        .iter()
        .filter(|(_, m)| m.image.is_none())
        .map(|(_, m)| m.host_path.clone())
        .collect();
    Ok(plan)
}

/// The pause container's mounts: the defaults with the sandbox's `/dev/shm` (the host's for
/// host IPC) bound read-only in place of the tmpfs — pause never writes it, the containers
/// do — and, when given, the DNS/hosts files read-only.
///
/// `user`: the pod's own user namespace and whether the pod is on the host's network, as for
/// [`container_mounts`].
pub fn sandbox_mounts(
    files: &SandboxFiles,
    host_ipc: bool,
    privileged: bool,
    user: Option<(&UserNamespace, bool)>,
) -> Result<Vec<Mount>, SpecError> {
    let (uid_mappings, gid_mappings) = own_mount_maps(user.map(|(u, _)| u));
    let sys_bound = matches!(user, Some((_, true)));
    let shm = if host_ipc {
        Some(PathBuf::from(DEV_SHM))
    } else {
        files.shm.clone()
    };
    let mut mounts: Vec<Mount> = Vec::new();
    for m in default_mounts(privileged)? {
        if shm.is_some() && m.destination() == Path::new(DEV_SHM) {
            continue;
        }
        if sys_bound && m.destination() == Path::new("/sys") {
            mounts.push(host_sys_bind()?);
            continue;
        }
        mounts.push(m);
    }
    if let Some(shm) = shm {
        // nosuid, nodev, noexec: with a user namespace, a bind of a mount with those flags
        // cannot drop them (EPERM); pause needs none of what they forbid anyway.
        let mut b = MountBuilder::default()
            .destination(DEV_SHM)
            .typ("bind")
            .source(shm)
            .options(
                ["rbind", "ro", "nosuid", "nodev", "noexec"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect::<Vec<_>>(),
            );
        if user.is_some() {
            b = b
                .uid_mappings(linux_id_mappings(&uid_mappings)?)
                .gid_mappings(linux_id_mappings(&gid_mappings)?);
        }
        mounts.push(b.build()?);
    }
    for (dest, src) in [
        (ETC_HOSTNAME, &files.hostname),
        (ETC_HOSTS, &files.hosts),
        (RESOLV_CONF, &files.resolv_conf),
    ] {
        if let Some(src) = src {
            let file = MountRequest {
                container_path: dest.to_owned(),
                host_path: src.clone(),
                readonly: true,
                uid_mappings: uid_mappings.clone(),
                gid_mappings: gid_mappings.clone(),
                ..MountRequest::default()
            };
            mounts.push(bind(&file, dest)?);
        }
    }
    Ok(mounts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::BindOption;

    fn dests(ms: &[Mount]) -> Vec<String> {
        ms.iter()
            .map(|m| m.destination().to_string_lossy().into_owned())
            .collect()
    }

    fn find<'a>(ms: &'a [Mount], dest: &str) -> &'a Mount {
        ms.iter()
            .find(|m| m.destination() == Path::new(dest))
            .unwrap()
    }

    fn opts(m: &Mount) -> Vec<String> {
        m.options().clone().unwrap_or_default()
    }

    fn req(dest: &str, src: &str) -> MountRequest {
        MountRequest {
            container_path: dest.into(),
            host_path: src.into(),
            ..MountRequest::default()
        }
    }

    fn files() -> SandboxFiles {
        SandboxFiles {
            hosts: Some("/run/remora/sb/hosts".into()),
            resolv_conf: Some("/run/remora/sb/resolv.conf".into()),
            hostname: Some("/run/remora/sb/hostname".into()),
            shm: Some("/run/remora/sb/shm".into()),
        }
    }

    #[test]
    fn defaults_are_readonly_sysfs_unless_privileged() {
        let d = default_mounts(false).unwrap();
        assert_eq!(
            dests(&d),
            [
                "/proc",
                "/dev",
                "/dev/pts",
                "/dev/shm",
                "/dev/mqueue",
                "/sys",
                "/sys/fs/cgroup"
            ]
        );
        assert!(opts(find(&d, "/sys")).contains(&"ro".into()));
        assert!(opts(find(&d, "/sys/fs/cgroup")).contains(&"ro".into()));
        let p = default_mounts(true).unwrap();
        assert!(opts(find(&p, "/sys")).contains(&"rw".into()));
        assert!(!opts(find(&p, "/sys/fs/cgroup")).contains(&"ro".into()));
    }

    #[test]
    fn destinations_are_cleaned_and_checked() {
        assert_eq!(clean_destination("/a//b/./c/").unwrap(), "/a/b/c");
        assert_eq!(clean_destination("/a/../b").unwrap(), "/b");
        for bad in ["relative/path", "/../etc", "/a/../../etc", "/", ""] {
            let err = clean_destination(bad).unwrap_err();
            assert!(
                matches!(err, SpecError::InvalidMountDestination { .. }),
                "{bad}"
            );
            assert!(err.to_string().contains("mount destination"), "{err}");
        }
    }

    #[test]
    fn sandbox_files_and_shm_are_bound() {
        let plan = container_mounts(&[], &files(), false, false, false, None).unwrap();
        let shm = find(&plan.mounts, "/dev/shm");
        assert_eq!(shm.typ().as_deref(), Some("bind"));
        assert_eq!(
            shm.source().as_deref(),
            Some(Path::new("/run/remora/sb/shm"))
        );
        assert_eq!(opts(shm), ["rbind", "rprivate", "rw"]);
        let hosts = find(&plan.mounts, "/etc/hosts");
        assert_eq!(opts(hosts), ["rbind", "rprivate", "rw"]);
        assert!(plan.host_dirs_to_create.is_empty());
        assert_eq!(plan.rootfs_propagation, None);
        // One /dev/shm only: the default tmpfs is replaced.
        assert_eq!(
            dests(&plan.mounts)
                .iter()
                .filter(|d| *d == "/dev/shm")
                .count(),
            1
        );
    }

    #[test]
    fn readonly_rootfs_makes_etc_files_readonly_but_not_shm() {
        let plan = container_mounts(&[], &files(), true, false, false, None).unwrap();
        for f in [ETC_HOSTS, RESOLV_CONF, ETC_HOSTNAME] {
            assert!(opts(find(&plan.mounts, f)).contains(&"ro".into()), "{f}");
        }
        assert!(opts(find(&plan.mounts, DEV_SHM)).contains(&"rw".into()));
    }

    #[test]
    fn without_sandbox_shm_the_tmpfs_stays_and_host_ipc_uses_host_shm() {
        let plan =
            container_mounts(&[], &SandboxFiles::default(), false, false, false, None).unwrap();
        assert_eq!(find(&plan.mounts, DEV_SHM).typ().as_deref(), Some("tmpfs"));
        assert!(!dests(&plan.mounts).contains(&ETC_HOSTS.to_owned()));
        let plan = container_mounts(&[], &files(), false, true, false, None).unwrap();
        assert_eq!(
            find(&plan.mounts, DEV_SHM).source().as_deref(),
            Some(Path::new("/dev/shm"))
        );
    }

    #[test]
    fn cri_mounts_override_sandbox_files_and_defaults() {
        let reqs = vec![req("/etc/hosts/", "/my/hosts"), req("/dev", "/host/dev")];
        let plan = container_mounts(&reqs, &files(), false, false, false, None).unwrap();
        assert_eq!(
            find(&plan.mounts, ETC_HOSTS).source().as_deref(),
            Some(Path::new("/my/hosts"))
        );
        let d = dests(&plan.mounts);
        assert_eq!(d.iter().filter(|x| *x == ETC_HOSTS).count(), 1);
        // /dev is the user's; nothing of the default /dev tree remains, the sandbox's shm
        // still goes on top of it.
        assert!(!d.contains(&"/dev/pts".to_owned()));
        assert!(!d.contains(&"/dev/mqueue".to_owned()));
        assert_eq!(
            find(&plan.mounts, "/dev").source().as_deref(),
            Some(Path::new("/host/dev"))
        );
        let dev = d.iter().position(|x| x == "/dev").unwrap();
        let shm = d.iter().position(|x| x == DEV_SHM).unwrap();
        assert!(dev < shm, "{d:?}");
    }

    #[test]
    fn binds_sorted_by_depth_with_options() {
        let reqs = vec![
            MountRequest {
                readonly: true,
                ..req("/a/b/c", "/h/c")
            },
            req("/a", "/h/a"),
            MountRequest {
                selinux_relabel: true,
                ..req("/a/b", "/h/b")
            },
        ];
        let plan =
            container_mounts(&reqs, &SandboxFiles::default(), false, false, false, None).unwrap();
        let d = dests(&plan.mounts);
        let pos = |p: &str| d.iter().position(|x| x == p).unwrap();
        assert!(pos("/a") < pos("/a/b") && pos("/a/b") < pos("/a/b/c"));
        assert_eq!(
            opts(find(&plan.mounts, "/a/b/c")),
            ["rbind", "rprivate", "ro"]
        );
        assert_eq!(
            plan.host_dirs_to_create,
            vec![
                PathBuf::from("/h/c"),
                PathBuf::from("/h/a"),
                PathBuf::from("/h/b")
            ]
        );
    }

    #[test]
    fn recursive_read_only_adds_rro_after_ro() {
        let reqs = vec![MountRequest {
            readonly: true,
            recursive_read_only: true,
            ..req("/data", "/h/data")
        }];
        let plan =
            container_mounts(&reqs, &SandboxFiles::default(), false, false, false, None).unwrap();
        assert_eq!(
            opts(find(&plan.mounts, "/data")),
            ["rbind", "rprivate", "ro", "rro"]
        );
    }

    #[test]
    fn mount_options_follow_ro_and_rro_in_the_order_asked() {
        let reqs = vec![
            MountRequest {
                readonly: true,
                recursive_read_only: true,
                options: vec![BindOption::NoSuid, BindOption::NoExec, BindOption::NoDev],
                ..req("/data", "/h/data")
            },
            MountRequest {
                options: vec![BindOption::NoExec],
                ..req("/exec", "/h/exec")
            },
        ];
        let plan =
            container_mounts(&reqs, &SandboxFiles::default(), false, false, false, None).unwrap();
        assert_eq!(
            opts(find(&plan.mounts, "/data")),
            ["rbind", "rprivate", "ro", "rro", "nosuid", "noexec", "nodev"]
        );
        assert_eq!(
            opts(find(&plan.mounts, "/exec")),
            ["rbind", "rprivate", "rw", "noexec"]
        );
    }

    #[test]
    fn a_cri_mount_with_maps_is_an_idmapped_bind_with_exactly_those_maps() {
        let pod = UserNamespace {
            uids: IdMapping {
                container_id: 0,
                host_id: 100_000,
                length: 65536,
            },
            gids: IdMapping {
                container_id: 0,
                host_id: 200_000,
                length: 65536,
            },
        };
        // Maps other than the pod's (two extents) are passed on as asked, not replaced.
        let uids = vec![
            IdMapping {
                container_id: 0,
                host_id: 300_000,
                length: 10,
            },
            IdMapping {
                container_id: 10,
                host_id: 400_000,
                length: 5,
            },
        ];
        let gids = vec![IdMapping {
            container_id: 0,
            host_id: 500_000,
            length: 1,
        }];
        let reqs = vec![
            MountRequest {
                uid_mappings: uids,
                gid_mappings: gids,
                options: vec![BindOption::NoDev],
                ..req("/etc/hosts", "/k/hosts")
            },
            req("/plain", "/h/plain"),
        ];
        let plan =
            container_mounts(&reqs, &files(), false, false, false, Some((&pod, false))).unwrap();
        let hosts = find(&plan.mounts, "/etc/hosts");
        assert_eq!(hosts.source().as_deref(), Some(Path::new("/k/hosts")));
        assert_eq!(opts(hosts), ["rbind", "rprivate", "rw", "nodev"]);
        let json = serde_json::to_value(hosts).unwrap();
        assert_eq!(
            json["uidMappings"],
            serde_json::json!([
                {"containerID": 0, "hostID": 300_000, "size": 10},
                {"containerID": 10, "hostID": 400_000, "size": 5},
            ])
        );
        assert_eq!(
            json["gidMappings"],
            serde_json::json!([{"containerID": 0, "hostID": 500_000, "size": 1}])
        );
        // A CRI mount without maps stays a plain bind, even in a user-namespaced pod...
        let plain = serde_json::to_value(find(&plan.mounts, "/plain")).unwrap();
        assert!(plain.get("uidMappings").is_none(), "{plain}");
        // ... while remora's own mounts of the pod carry the pod's maps.
        let shm = serde_json::to_value(find(&plan.mounts, DEV_SHM)).unwrap();
        assert_eq!(
            shm["uidMappings"],
            serde_json::json!([{"containerID": 0, "hostID": 100_000, "size": 65536}])
        );
    }

    #[test]
    fn propagation_sets_options_and_rootfs_propagation() {
        let slave = MountRequest {
            propagation: MountPropagation::HostToContainer,
            ..req("/s", "/h/s")
        };
        let shared = MountRequest {
            propagation: MountPropagation::Bidirectional,
            ..req("/b", "/h/b")
        };
        let plan = container_mounts(
            std::slice::from_ref(&slave),
            &SandboxFiles::default(),
            false,
            false,
            false,
            None,
        )
        .unwrap();
        assert_eq!(opts(find(&plan.mounts, "/s")), ["rbind", "rslave", "rw"]);
        assert_eq!(plan.rootfs_propagation.as_deref(), Some("rslave"));
        let plan = container_mounts(
            &[shared, slave],
            &SandboxFiles::default(),
            false,
            false,
            false,
            None,
        )
        .unwrap();
        assert_eq!(opts(find(&plan.mounts, "/b")), ["rbind", "rshared", "rw"]);
        assert_eq!(plan.rootfs_propagation.as_deref(), Some("rshared"));
    }

    #[test]
    fn bad_mounts_are_rejected() {
        let err = container_mounts(
            &[req("rel", "/h")],
            &SandboxFiles::default(),
            false,
            false,
            false,
            None,
        )
        .unwrap_err();
        assert!(matches!(err, SpecError::InvalidMountDestination { .. }));
        let err = container_mounts(
            &[req("/x/../..", "/h")],
            &SandboxFiles::default(),
            false,
            false,
            false,
            None,
        )
        .unwrap_err();
        assert!(matches!(err, SpecError::InvalidMountDestination { .. }));
        let err = container_mounts(
            &[req("/x", "h")],
            &SandboxFiles::default(),
            false,
            false,
            false,
            None,
        )
        .unwrap_err();
        assert!(matches!(err, SpecError::InvalidMountSource { .. }));
    }

    #[test]
    fn privileged_container_gets_writable_sysfs() {
        let plan =
            container_mounts(&[], &SandboxFiles::default(), false, false, true, None).unwrap();
        assert!(opts(find(&plan.mounts, "/sys")).contains(&"rw".into()));
    }

    #[test]
    fn sandbox_mounts_bind_shm_readonly() {
        let ms = sandbox_mounts(&files(), false, false, None).unwrap();
        let shm = find(&ms, DEV_SHM);
        assert_eq!(
            shm.source().as_deref(),
            Some(Path::new("/run/remora/sb/shm"))
        );
        assert_eq!(opts(shm), ["rbind", "ro", "nosuid", "nodev", "noexec"]);
        assert_eq!(dests(&ms).iter().filter(|d| *d == DEV_SHM).count(), 1);
        assert!(opts(find(&ms, RESOLV_CONF)).contains(&"ro".into()));
        let ms = sandbox_mounts(&SandboxFiles::default(), false, false, None).unwrap();
        assert_eq!(find(&ms, DEV_SHM).typ().as_deref(), Some("tmpfs"));
        let ms = sandbox_mounts(&SandboxFiles::default(), true, false, None).unwrap();
        assert_eq!(
            find(&ms, DEV_SHM).source().as_deref(),
            Some(Path::new("/dev/shm"))
        );
    }
}
