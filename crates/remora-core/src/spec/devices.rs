//! CRI devices: device nodes in the container and the cgroup rules that allow them.
//!
//! The host facts about each device (type, major/minor, mode, owner) come from a lookup
//! function passed in, so spec generation stays pure and tests need no device nodes. The
//! device cgroup starts from "deny everything"; runc adds its own always-allowed set (null,
//! zero, tty, ptmx, …) on top, as it does for containerd.

use std::io;
use std::path::Path;

use oci_spec::runtime::{
    LinuxDevice, LinuxDeviceBuilder, LinuxDeviceCgroup, LinuxDeviceCgroupBuilder, LinuxDeviceType,
};

use super::types::{DeviceKind, DeviceRequest, HostDevice};
use super::SpecError;

/// Looks up a host device node by path (normally `stat` after resolving symlinks).
pub type DeviceLookup<'a> = dyn Fn(&Path) -> io::Result<HostDevice> + 'a;

/// The device nodes and cgroup allow rules for the requested devices.
pub fn devices(
    requested: &[DeviceRequest],
    lookup: &DeviceLookup<'_>,
) -> Result<(Vec<LinuxDevice>, Vec<LinuxDeviceCgroup>), SpecError> {
    let mut nodes = Vec::with_capacity(requested.len());
    let mut rules = Vec::with_capacity(requested.len());
    for d in requested {
        let access = permissions(&d.permissions)?;
        if !Path::new(&d.container_path).is_absolute() {
            return Err(SpecError::InvalidDevicePath {
                path: d.container_path.clone(),
            });
        }
        let host = lookup(&d.host_path).map_err(|source| SpecError::DeviceLookup {
            host_path: d.host_path.clone(),
            source,
        })?;
        let typ = match host.kind {
            DeviceKind::Char => LinuxDeviceType::C,
            DeviceKind::Block => LinuxDeviceType::B,
        };
        nodes.push(
            LinuxDeviceBuilder::default()
                .path(&d.container_path)
                .typ(typ)
                .major(host.major)
                .minor(host.minor)
                .file_mode(host.file_mode)
                .uid(host.uid)
                .gid(host.gid)
                .build()?,
        );
        rules.push(
            LinuxDeviceCgroupBuilder::default()
                .allow(true)
                .typ(typ)
                .major(host.major)
                .minor(host.minor)
                .access(access)
                .build()?,
        );
    }
    Ok((nodes, rules))
}

/// The first device cgroup rule of every spec: deny all, so only what follows is allowed.
pub fn deny_all() -> Result<LinuxDeviceCgroup, SpecError> {
    Ok(LinuxDeviceCgroupBuilder::default()
        .allow(false)
        .access("rwm")
        .build()?)
}

/// The device rule of a privileged container: allow all.
pub fn allow_all() -> Result<LinuxDeviceCgroup, SpecError> {
    Ok(LinuxDeviceCgroupBuilder::default()
        .allow(true)
        .typ(LinuxDeviceType::A)
        .access("rwm")
        .build()?)
}

/// Validates cgroup permissions (`r`, `w`, `m`, each at most once); empty means `rwm`.
fn permissions(p: &str) -> Result<String, SpecError> {
    if p.is_empty() {
        return Ok("rwm".to_owned());
    }
    let mut seen = String::new();
    for c in p.chars() {
        if !matches!(c, 'r' | 'w' | 'm') || seen.contains(c) {
            return Err(SpecError::InvalidDevicePermissions {
                permissions: p.to_owned(),
            });
        }
        seen.push(c);
    }
    Ok(p.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(path: &Path) -> io::Result<HostDevice> {
        match path.to_str() {
            Some("/dev/fuse") => Ok(HostDevice {
                kind: DeviceKind::Char,
                major: 10,
                minor: 229,
                file_mode: 0o666,
                uid: 0,
                gid: 0,
            }),
            Some("/dev/sdb") => Ok(HostDevice {
                kind: DeviceKind::Block,
                major: 8,
                minor: 16,
                file_mode: 0o660,
                uid: 0,
                gid: 6,
            }),
            _ => Err(io::Error::from(io::ErrorKind::NotFound)),
        }
    }

    fn req(host: &str, ctr: &str, perms: &str) -> DeviceRequest {
        DeviceRequest {
            host_path: host.into(),
            container_path: ctr.into(),
            permissions: perms.into(),
        }
    }

    #[test]
    fn devices_become_nodes_and_rules() {
        let (nodes, rules) = devices(
            &[
                req("/dev/fuse", "/dev/fuse", "rw"),
                req("/dev/sdb", "/dev/xvda", ""),
            ],
            &fake,
        )
        .unwrap();
        assert_eq!(nodes[0].path(), Path::new("/dev/fuse"));
        assert_eq!(
            (nodes[0].typ(), nodes[0].major(), nodes[0].minor()),
            (LinuxDeviceType::C, 10, 229)
        );
        assert_eq!(nodes[0].file_mode(), Some(0o666));
        assert_eq!(nodes[1].path(), Path::new("/dev/xvda"));
        assert_eq!(nodes[1].typ(), LinuxDeviceType::B);
        assert_eq!(nodes[1].gid(), Some(6));
        assert!(rules[0].allow());
        assert_eq!(rules[0].access().as_deref(), Some("rw"));
        assert_eq!((rules[1].major(), rules[1].minor()), (Some(8), Some(16)));
        assert_eq!(rules[1].access().as_deref(), Some("rwm"));
    }

    #[test]
    fn bad_requests_are_errors() {
        let err = devices(&[req("/dev/nope", "/dev/nope", "r")], &fake).unwrap_err();
        assert!(matches!(err, SpecError::DeviceLookup { .. }));
        assert!(err.to_string().contains("/dev/nope"));
        for perms in ["rx", "rr", "RW"] {
            let err = devices(&[req("/dev/fuse", "/dev/fuse", perms)], &fake).unwrap_err();
            assert!(
                matches!(err, SpecError::InvalidDevicePermissions { .. }),
                "{perms}"
            );
        }
        let err = devices(&[req("/dev/fuse", "dev/fuse", "r")], &fake).unwrap_err();
        assert!(matches!(err, SpecError::InvalidDevicePath { .. }));
    }

    #[test]
    fn deny_and_allow_all_rules() {
        let d = deny_all().unwrap();
        assert!(!d.allow());
        assert_eq!(d.access().as_deref(), Some("rwm"));
        let a = allow_all().unwrap();
        assert!(a.allow());
        assert_eq!(a.typ(), Some(LinuxDeviceType::A));
    }
}
