//! Where a pod's and a container's cgroups go, under either cgroup driver.
//!
//! kubelet and the runtime must manage cgroups the same way (RuntimeConfig reports the
//! driver to kubelet). The driver decides both what kubelet sends as a pod's `cgroup_parent`
//! and what `linux.cgroupsPath` runc (or crun) accepts:
//!
//! - **cgroupfs**: the parent is a path (`/kubepods/burstable/pod<uid>`); the container's
//!   cgroupsPath is `<parent>/<id>`, a directory below each hierarchy's root.
//! - **systemd**: the parent is a slice *name* (`kubepods-burstable-pod<uid>.slice`); runc's
//!   systemd driver wants `slice:prefix:name` and makes a transient scope unit
//!   `<prefix>-<name>.scope` in that slice. systemd places a slice by its name, a `-`
//!   separating the levels: `kubepods-burstable-pod1.slice` is
//!   `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice`
//!   ([`systemd_slice_path`], runc's `ExpandSlice`).
//!
//! containerd's CRI picks the format from the parent's name (a last component ending in
//! `.slice` means systemd) and writes `<slice>:cri-containerd:<id>`. remora goes by the
//! configured driver instead, so a parent that does not fit it is refused when the pod is
//! created, naming the field, rather than by runc later. Under systemd a parent written as a
//! path stands for its last component (critest sends `/test.slice`; containerd reads it the
//! same way). remora writes the prefix `remora`,
//! so `systemctl list-units 'remora-*'` shows remora's containers and a scope is never
//! mistaken for one of containerd's own CRI. A pod without a parent gets no cgroupsPath under
//! cgroupfs (runc nests the container under its caller's cgroup, as containerd does); under
//! systemd it goes to `system.slice` (runc's own default slice), named, so that every runtime
//! puts it at the same, known place.

use super::SpecError;

/// How the node's cgroups are managed; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CgroupDriver {
    /// cgroupfs paths written directly.
    #[default]
    Cgroupfs,
    /// systemd units (slices and scopes), through the runtime's `--systemd-cgroup`.
    Systemd,
}

/// The scope prefix of remora's containers under systemd: `remora-<id>.scope`.
pub const SYSTEMD_SCOPE_PREFIX: &str = "remora";

/// The slice of a pod without a cgroup parent under systemd (runc's default).
pub const SYSTEMD_DEFAULT_SLICE: &str = "system.slice";

/// systemd's longest unit name (`UNIT_NAME_MAX` less its NUL).
const MAX_UNIT_NAME: usize = 255;

/// `linux.cgroupsPath` of sandbox or container `id` in a pod whose cgroup parent is `parent`:
/// `<parent>/<id>` under cgroupfs (`None` without a parent), `<slice>:remora:<id>` under
/// systemd. A parent that is no slice name under systemd is refused.
pub fn cgroups_path(
    driver: CgroupDriver,
    parent: &str,
    id: &str,
) -> Result<Option<String>, SpecError> {
    match driver {
        CgroupDriver::Cgroupfs if parent.is_empty() => Ok(None),
        CgroupDriver::Cgroupfs => Ok(Some(format!("{}/{id}", parent.trim_end_matches('/')))),
        CgroupDriver::Systemd => {
            let slice = systemd_slice(parent)?;
            Ok(Some(format!("{slice}:{SYSTEMD_SCOPE_PREFIX}:{id}")))
        }
    }
}

/// Where the pod's own cgroup (its parent) is, below each hierarchy's root; `None` when the
/// pod has none (no parent: the default slice holds other things too) or, under systemd, a
/// parent that is no slice name.
pub fn pod_cgroup_dir(driver: CgroupDriver, parent: &str) -> Option<String> {
    if parent.is_empty() {
        return None;
    }
    match driver {
        CgroupDriver::Cgroupfs => Some(parent.to_string()),
        CgroupDriver::Systemd => systemd_slice_path(slice_name(parent)).ok(),
    }
}

/// Where the cgroup of sandbox or container `id` is, below each hierarchy's root, as the
/// runtime makes it from [`cgroups_path`]: `<parent>/<id>` under cgroupfs (`None` without a
/// parent: the runtime chose), `<slice path>/remora-<id>.scope` under systemd. For finding a
/// cgroup once its process is gone; while it runs, `/proc/<pid>/cgroup` says where it is.
pub fn container_cgroup_dir(driver: CgroupDriver, parent: &str, id: &str) -> Option<String> {
    match driver {
        CgroupDriver::Cgroupfs => cgroups_path(driver, parent, id).ok().flatten(),
        CgroupDriver::Systemd => {
            let slice = systemd_slice(parent).ok()?;
            let path = systemd_slice_path(slice).ok()?;
            Some(format!(
                "{}/{SYSTEMD_SCOPE_PREFIX}-{id}.scope",
                path.trim_end_matches('/')
            ))
        }
    }
}

/// The slice a pod's cgroups go to under systemd: its parent, or the default slice. A parent
/// written as a path (`/test.slice`, critest's; `/kubepods.slice/kubepods-pod1.slice`) names
/// its last component, as containerd reads it: systemd places a slice by its name alone.
fn systemd_slice(parent: &str) -> Result<&str, SpecError> {
    if parent.is_empty() {
        return Ok(SYSTEMD_DEFAULT_SLICE);
    }
    let name = slice_name(parent);
    systemd_slice_path(name).map_err(|reason| SpecError::InvalidCgroupParent {
        parent: parent.to_string(),
        reason,
    })?;
    Ok(name)
}

/// The last component of a cgroup parent (the whole of one that is no path).
fn slice_name(parent: &str) -> &str {
    let trimmed = parent.trim_end_matches('/');
    trimmed.rsplit('/').next().unwrap_or(trimmed)
}

/// The cgroup path systemd gives slice `name`: `a-b-c.slice` is
/// `/a.slice/a-b.slice/a-b-c.slice`, and `-.slice` (the root slice) is `/` (runc's
/// `ExpandSlice`). Refused, with the reason: a name not ending in `.slice`, a path, an empty
/// level (`-` at either end, `--`), a character systemd does not allow in unit names, and a
/// `:`, which would split runc's `slice:prefix:name`.
pub fn systemd_slice_path(name: &str) -> Result<String, &'static str> {
    let Some(stem) = name.strip_suffix(".slice") else {
        return Err("a systemd slice name such as kubepods-burstable.slice must end in `.slice`");
    };
    if name.contains('/') {
        return Err("the systemd cgroup driver takes a slice name, not a path: no `/`");
    }
    if name.len() > MAX_UNIT_NAME {
        return Err("longer than systemd's 255-byte unit names");
    }
    if stem == "-" {
        return Ok("/".to_string());
    }
    if name.contains(':') {
        return Err("`:` would split the runtime's `slice:prefix:name`");
    }
    if !stem
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"_.\\-".contains(&b))
    {
        return Err("systemd unit names hold ASCII letters, digits, `_`, `.`, `\\` and `-` only");
    }
    let mut path = String::new();
    let mut levels = stem.split('-').peekable();
    let mut prefix = String::new();
    while let Some(level) = levels.next() {
        if level.is_empty() {
            return Err("`-` separates a slice's levels: none at either end, never `--`");
        }
        prefix.push_str(level);
        path.push('/');
        path.push_str(&prefix);
        path.push_str(".slice");
        if levels.peek().is_some() {
            prefix.push('-');
        }
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD: &str = "kubepods-burstable-pod0a1f63d6_8c2b_4d3e_9f10_1234567890ab.slice";
    const POD_PATH: &str = "/kubepods.slice/kubepods-burstable.slice/\
                            kubepods-burstable-pod0a1f63d6_8c2b_4d3e_9f10_1234567890ab.slice";

    #[test]
    fn cgroupfs_paths_are_the_parent_and_the_id() {
        let fs = CgroupDriver::Cgroupfs;
        assert_eq!(
            cgroups_path(fs, "/kubepods/burstable/pod1", "c1").unwrap(),
            Some("/kubepods/burstable/pod1/c1".into())
        );
        assert_eq!(
            cgroups_path(fs, "/kubepods/pod1/", "c1").unwrap(),
            Some("/kubepods/pod1/c1".into())
        );
        assert_eq!(cgroups_path(fs, "", "c1").unwrap(), None);
        assert_eq!(
            container_cgroup_dir(fs, "/kubepods/pod1", "c1").as_deref(),
            Some("/kubepods/pod1/c1")
        );
        assert_eq!(container_cgroup_dir(fs, "", "c1"), None);
        assert_eq!(
            pod_cgroup_dir(fs, "/kubepods/pod1").as_deref(),
            Some("/kubepods/pod1")
        );
        assert_eq!(pod_cgroup_dir(fs, ""), None);
    }

    #[test]
    fn systemd_paths_are_slice_prefix_and_id() {
        let sd = CgroupDriver::Systemd;
        assert_eq!(
            cgroups_path(sd, POD, "c1").unwrap(),
            Some(format!("{POD}:remora:c1"))
        );
        assert_eq!(
            cgroups_path(sd, "kubepods.slice", "c1").unwrap(),
            Some("kubepods.slice:remora:c1".into())
        );
        // A path names its last component (critest sends `/test.slice`), as in containerd.
        assert_eq!(
            cgroups_path(sd, "/test.slice", "c1").unwrap(),
            Some("test.slice:remora:c1".into())
        );
        assert_eq!(
            cgroups_path(sd, &format!("/kubepods.slice/{POD}/"), "c1").unwrap(),
            Some(format!("{POD}:remora:c1"))
        );
        assert_eq!(
            container_cgroup_dir(sd, "/test.slice", "c1").as_deref(),
            Some("/test.slice/remora-c1.scope")
        );
        assert_eq!(
            pod_cgroup_dir(sd, &format!("/kubepods.slice/{POD}")),
            Some(POD_PATH.to_string())
        );
        // No parent (crictl, critest): runc's default slice, named.
        assert_eq!(
            cgroups_path(sd, "", "c1").unwrap(),
            Some("system.slice:remora:c1".into())
        );
    }

    #[test]
    fn systemd_cgroup_dirs_are_the_expanded_slice_and_the_scope() {
        let sd = CgroupDriver::Systemd;
        assert_eq!(
            container_cgroup_dir(sd, POD, "c1"),
            Some(format!("{POD_PATH}/remora-c1.scope"))
        );
        assert_eq!(
            container_cgroup_dir(sd, "", "c1").as_deref(),
            Some("/system.slice/remora-c1.scope")
        );
        assert_eq!(
            container_cgroup_dir(sd, "-.slice", "c1").as_deref(),
            Some("/remora-c1.scope")
        );
        assert_eq!(container_cgroup_dir(sd, "/kubepods/pod1", "c1"), None);
        assert_eq!(pod_cgroup_dir(sd, POD).as_deref(), Some(POD_PATH));
        // The default slice is not the pod's own.
        assert_eq!(pod_cgroup_dir(sd, ""), None);
        assert_eq!(pod_cgroup_dir(sd, "/kubepods/pod1"), None);
    }

    #[test]
    fn slices_expand_level_by_level() {
        assert_eq!(
            systemd_slice_path("kubepods.slice").as_deref(),
            Ok("/kubepods.slice")
        );
        assert_eq!(
            systemd_slice_path("kubepods-burstable.slice").as_deref(),
            Ok("/kubepods.slice/kubepods-burstable.slice")
        );
        assert_eq!(
            systemd_slice_path("kubepods-besteffort-pod1.slice").as_deref(),
            Ok("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice")
        );
        // kubelet writes the pod uid's dashes as underscores: one level.
        assert_eq!(systemd_slice_path(POD).as_deref(), Ok(POD_PATH));
        assert_eq!(systemd_slice_path("-.slice").as_deref(), Ok("/"));
        assert_eq!(
            systemd_slice_path("system.slice").as_deref(),
            Ok("/system.slice")
        );
    }

    #[test]
    fn what_is_no_slice_name_is_refused() {
        for bad in [
            "",
            "kubepods",
            ".slice",
            "kubepods.slice.d",
            "/kubepods.slice",
            "/kubepods.slice/kubepods-burstable.slice",
            "-kubepods.slice",
            "kubepods-.slice",
            "kubepods--burstable.slice",
            "kube:pods.slice",
            "kube pods.slice",
            "kubepods\u{e9}.slice",
        ] {
            assert!(systemd_slice_path(bad).is_err(), "{bad:?} accepted");
        }
        let long = format!("{}.slice", "a".repeat(250));
        assert!(systemd_slice_path(&long).is_err());
    }

    #[test]
    fn a_parent_that_is_no_slice_is_refused_under_systemd_naming_the_field() {
        for bad in [
            "/kubepods/burstable/pod1",
            "kubepods--x.slice",
            "a:b.slice",
            "/",
        ] {
            let e = cgroups_path(CgroupDriver::Systemd, bad, "c1").unwrap_err();
            assert!(
                matches!(&e, SpecError::InvalidCgroupParent { parent, .. } if parent == bad),
                "{e:?}"
            );
            let text = e.to_string();
            assert!(
                text.contains("cgroup_parent") && text.contains("systemd"),
                "{text}"
            );
        }
        // The same parents are paths to cgroupfs, as before.
        assert!(cgroups_path(CgroupDriver::Cgroupfs, "/kubepods/burstable/pod1", "c1").is_ok());
    }
}
