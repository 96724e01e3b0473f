//! Capabilities, masked and read-only paths, AppArmor.
//!
//! Follows containerd's CRI plugin: the default capability set is Docker's; `ALL` in add
//! or drop applies first so that individual names can refine it (`add: [ALL], drop: [CHOWN]`
//! is everything but `CAP_CHOWN`; `drop: [ALL], add: [NET_RAW]` is only `CAP_NET_RAW`).
//! Capabilities go to the bounding, effective and permitted sets; inheritable and ambient
//! stay empty (CVE-2022-24769). A privileged container gets every capability the kernel
//! knows, no masked or read-only paths and no seccomp/AppArmor confinement.

use std::collections::HashSet;

use oci_spec::runtime::{Capability, LinuxCapabilities, LinuxCapabilitiesBuilder};

use super::types::{AppArmorProfile, CapabilityChanges};
use super::SpecError;

/// Docker's / containerd's default capability set.
pub const DEFAULT_CAPABILITIES: &[Capability] = &[
    Capability::Chown,
    Capability::DacOverride,
    Capability::Fsetid,
    Capability::Fowner,
    Capability::Mknod,
    Capability::NetRaw,
    Capability::Setgid,
    Capability::Setuid,
    Capability::Setfcap,
    Capability::Setpcap,
    Capability::NetBindService,
    Capability::SysChroot,
    Capability::Kill,
    Capability::AuditWrite,
];

/// Every capability with its kernel number (`linux/capability.h`), in number order.
pub const ALL_CAPABILITIES: &[(Capability, u32)] = &[
    (Capability::Chown, 0),
    (Capability::DacOverride, 1),
    (Capability::DacReadSearch, 2),
    (Capability::Fowner, 3),
    (Capability::Fsetid, 4),
    (Capability::Kill, 5),
    (Capability::Setgid, 6),
    (Capability::Setuid, 7),
    (Capability::Setpcap, 8),
    (Capability::LinuxImmutable, 9),
    (Capability::NetBindService, 10),
    (Capability::NetBroadcast, 11),
    (Capability::NetAdmin, 12),
    (Capability::NetRaw, 13),
    (Capability::IpcLock, 14),
    (Capability::IpcOwner, 15),
    (Capability::SysModule, 16),
    (Capability::SysRawio, 17),
    (Capability::SysChroot, 18),
    (Capability::SysPtrace, 19),
    (Capability::SysPacct, 20),
    (Capability::SysAdmin, 21),
    (Capability::SysBoot, 22),
    (Capability::SysNice, 23),
    (Capability::SysResource, 24),
    (Capability::SysTime, 25),
    (Capability::SysTtyConfig, 26),
    (Capability::Mknod, 27),
    (Capability::Lease, 28),
    (Capability::AuditWrite, 29),
    (Capability::AuditControl, 30),
    (Capability::Setfcap, 31),
    (Capability::MacOverride, 32),
    (Capability::MacAdmin, 33),
    (Capability::Syslog, 34),
    (Capability::WakeAlarm, 35),
    (Capability::BlockSuspend, 36),
    (Capability::AuditRead, 37),
    (Capability::Perfmon, 38),
    (Capability::Bpf, 39),
    (Capability::CheckpointRestore, 40),
];

/// containerd's default masked paths.
pub const DEFAULT_MASKED_PATHS: &[&str] = &[
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];

/// containerd's default read-only paths.
pub const DEFAULT_READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// The profile name used for `RuntimeDefault` AppArmor; it must be loaded on the host.
pub const DEFAULT_APPARMOR_PROFILE: &str = "remora-default";

/// Every capability the running kernel knows (`cap_last_cap`).
pub fn all_capabilities(cap_last_cap: u32) -> Vec<Capability> {
    ALL_CAPABILITIES
        .iter()
        .filter(|(_, n)| *n <= cap_last_cap)
        .map(|(c, _)| *c)
        .collect()
}

/// Whether capability `c` is in the bounding set `mask` (bit n = capability number n), i.e.
/// whether this process can grant it at all. A capability outside it makes runc fail with
/// "unable to apply caps: operation not permitted", so specs keep only these (containerd
/// likewise grants privileged containers the capabilities it holds, not all the kernel has).
pub fn in_bounding_set(c: Capability, mask: u64) -> bool {
    ALL_CAPABILITIES
        .iter()
        .find(|(cap, _)| *cap == c)
        .is_some_and(|(_, n)| *n < 64 && mask & (1u64 << n) != 0)
}

/// Parses a CRI capability name: any case, with or without `CAP_`.
pub fn parse_capability(name: &str) -> Result<Capability, SpecError> {
    let upper = name.trim().to_ascii_uppercase();
    let bare = upper.strip_prefix("CAP_").unwrap_or(&upper);
    bare.parse::<Capability>()
        .map_err(|_| SpecError::UnknownCapability {
            name: name.to_owned(),
        })
}

fn is_all(name: &str) -> bool {
    name.trim().eq_ignore_ascii_case("ALL")
}

/// The capability set of a process, in kernel-number order (so specs are reproducible).
pub fn capability_set(
    changes: Option<&CapabilityChanges>,
    privileged: bool,
    cap_last_cap: u32,
) -> Result<Vec<Capability>, SpecError> {
    let all = all_capabilities(cap_last_cap);
    if privileged {
        return Ok(all);
    }
    let mut set: HashSet<Capability> = DEFAULT_CAPABILITIES.iter().copied().collect();
    if let Some(ch) = changes {
        if ch.add.iter().any(|c| is_all(c)) {
            set.extend(all.iter().copied());
        }
        if ch.drop.iter().any(|c| is_all(c)) {
            set.clear();
        }
        for name in ch.add.iter().filter(|c| !is_all(c)) {
            set.insert(parse_capability(name)?);
        }
        for name in ch.drop.iter().filter(|c| !is_all(c)) {
            set.remove(&parse_capability(name)?);
        }
    }
    Ok(ALL_CAPABILITIES
        .iter()
        .map(|(c, _)| *c)
        .filter(|c| set.contains(c))
        .collect())
}

/// The OCI capabilities section for a capability set.
pub fn linux_capabilities(caps: &[Capability]) -> Result<LinuxCapabilities, SpecError> {
    let set: HashSet<Capability> = caps.iter().copied().collect();
    Ok(LinuxCapabilitiesBuilder::default()
        .bounding(set.clone())
        .effective(set.clone())
        .permitted(set)
        .inheritable(HashSet::new())
        .ambient(HashSet::new())
        .build()?)
}

/// Masked paths: none when privileged, else the request or the defaults.
pub fn masked_paths(requested: Option<&[String]>, privileged: bool) -> Vec<String> {
    paths_or_default(requested, privileged, DEFAULT_MASKED_PATHS)
}

/// Read-only paths: none when privileged, else the request or the defaults.
pub fn readonly_paths(requested: Option<&[String]>, privileged: bool) -> Vec<String> {
    paths_or_default(requested, privileged, DEFAULT_READONLY_PATHS)
}

fn paths_or_default(
    requested: Option<&[String]>,
    privileged: bool,
    defaults: &[&str],
) -> Vec<String> {
    if privileged {
        return Vec::new();
    }
    match requested {
        Some(paths) => paths.to_vec(),
        None => defaults.iter().map(|s| s.to_string()).collect(),
    }
}

/// The AppArmor profile for `process.apparmorProfile`.
///
/// On a host without AppArmor, asking for any confinement is an error rather than a silent
/// downgrade (containerd does the same); "unconfined" or nothing at all is fine. With
/// AppArmor, a container that asks for nothing gets the default profile unless privileged.
pub fn apparmor_profile(
    requested: Option<&AppArmorProfile>,
    privileged: bool,
    apparmor_enabled: bool,
) -> Result<Option<String>, SpecError> {
    if !apparmor_enabled {
        return match requested {
            None | Some(AppArmorProfile::Unconfined) => Ok(None),
            Some(AppArmorProfile::RuntimeDefault) => Err(SpecError::AppArmorUnsupported {
                profile: "runtime/default".to_owned(),
            }),
            Some(AppArmorProfile::Localhost(name)) => Err(SpecError::AppArmorUnsupported {
                profile: format!("localhost/{name}"),
            }),
        };
    }
    Ok(match requested {
        None if privileged => None,
        None | Some(AppArmorProfile::RuntimeDefault) => Some(DEFAULT_APPARMOR_PROFILE.to_owned()),
        Some(AppArmorProfile::Unconfined) => None,
        Some(AppArmorProfile::Localhost(name)) => Some(name.clone()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn changes(add: &[&str], drop: &[&str]) -> CapabilityChanges {
        CapabilityChanges {
            add: add.iter().map(|s| s.to_string()).collect(),
            drop: drop.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn default_set_without_changes() {
        let caps = capability_set(None, false, 40).unwrap();
        assert_eq!(caps.len(), DEFAULT_CAPABILITIES.len());
        assert!(caps.contains(&Capability::NetRaw));
        assert!(!caps.contains(&Capability::SysAdmin));
    }

    #[test]
    fn add_and_drop_by_any_spelling() {
        let caps = capability_set(
            Some(&changes(
                &["sys_admin", "CAP_NET_ADMIN"],
                &["NET_RAW", "cap_chown"],
            )),
            false,
            40,
        )
        .unwrap();
        assert!(caps.contains(&Capability::SysAdmin));
        assert!(caps.contains(&Capability::NetAdmin));
        assert!(!caps.contains(&Capability::NetRaw));
        assert!(!caps.contains(&Capability::Chown));
    }

    #[test]
    fn all_applies_before_individual_names() {
        let caps = capability_set(Some(&changes(&["ALL"], &["CHOWN"])), false, 40).unwrap();
        assert_eq!(caps.len(), ALL_CAPABILITIES.len() - 1);
        assert!(!caps.contains(&Capability::Chown));
        let caps = capability_set(Some(&changes(&["NET_RAW"], &["all"])), false, 40).unwrap();
        assert_eq!(caps, vec![Capability::NetRaw]);
        let caps = capability_set(Some(&changes(&[], &["ALL"])), false, 40).unwrap();
        assert!(caps.is_empty());
    }

    #[test]
    fn unknown_capability_is_an_error() {
        let err = capability_set(Some(&changes(&["FLY"], &[])), false, 40).unwrap_err();
        assert!(matches!(err, SpecError::UnknownCapability { ref name } if name == "FLY"));
    }

    #[test]
    fn privileged_gets_what_the_kernel_knows() {
        assert_eq!(capability_set(None, true, 40).unwrap().len(), 41);
        // CAP_SYS_RESOURCE (24) missing from the bounding set, as on these machines.
        let mask = 0x1ff_feff_ffffu64;
        assert!(!in_bounding_set(Capability::SysResource, mask));
        assert!(in_bounding_set(Capability::SysAdmin, mask));
        // An older kernel without CAP_PERFMON/BPF/CHECKPOINT_RESTORE.
        let caps = capability_set(Some(&changes(&[], &["ALL"])), true, 37).unwrap();
        assert_eq!(caps.len(), 38);
        assert!(!caps.contains(&Capability::Bpf));
    }

    #[test]
    fn oci_capabilities_leave_inheritable_and_ambient_empty() {
        let c = linux_capabilities(&[Capability::Kill]).unwrap();
        assert_eq!(c.bounding().as_ref().unwrap().len(), 1);
        assert_eq!(c.effective().as_ref().unwrap().len(), 1);
        assert_eq!(c.permitted().as_ref().unwrap().len(), 1);
        assert!(c.inheritable().as_ref().unwrap().is_empty());
        assert!(c.ambient().as_ref().unwrap().is_empty());
    }

    #[test]
    fn masked_and_readonly_paths() {
        assert_eq!(masked_paths(None, false).len(), DEFAULT_MASKED_PATHS.len());
        assert!(readonly_paths(None, false).contains(&"/proc/sys".to_owned()));
        let mine = vec!["/proc/x".to_owned()];
        assert_eq!(masked_paths(Some(&mine), false), mine);
        assert!(masked_paths(Some(&[]), false).is_empty());
        assert!(masked_paths(Some(&mine), true).is_empty());
        assert!(readonly_paths(None, true).is_empty());
    }

    #[test]
    fn apparmor_without_apparmor() {
        assert_eq!(apparmor_profile(None, false, false).unwrap(), None);
        assert_eq!(
            apparmor_profile(Some(&AppArmorProfile::Unconfined), false, false).unwrap(),
            None
        );
        let err = apparmor_profile(Some(&AppArmorProfile::Localhost("p".into())), false, false)
            .unwrap_err();
        assert!(matches!(err, SpecError::AppArmorUnsupported { .. }));
        assert!(err.to_string().contains("localhost/p"));
        assert!(apparmor_profile(Some(&AppArmorProfile::RuntimeDefault), false, false).is_err());
    }

    #[test]
    fn apparmor_with_apparmor() {
        assert_eq!(
            apparmor_profile(None, false, true).unwrap().as_deref(),
            Some(DEFAULT_APPARMOR_PROFILE)
        );
        assert_eq!(apparmor_profile(None, true, true).unwrap(), None);
        assert_eq!(
            apparmor_profile(Some(&AppArmorProfile::Localhost("p".into())), true, true)
                .unwrap()
                .as_deref(),
            Some("p")
        );
        assert_eq!(
            apparmor_profile(Some(&AppArmorProfile::Unconfined), false, true).unwrap(),
            None
        );
    }
}
