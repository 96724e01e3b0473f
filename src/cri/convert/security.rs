//! Security contexts: namespace modes, supplemental groups policy, and the seccomp and
//! AppArmor profiles (the typed `SecurityProfile` wins over the deprecated strings).

use std::path::{Path, PathBuf};

use crate::cri::v1;

use super::{missing, unknown_enum, ConvertError};
use crate::spec::{
    AppArmorProfile, IdMapping, NamespaceMode, NamespaceOptions, SeccompProfile, SecurityContext,
    SupplementalGroupsPolicy, UserNamespace,
};

fn namespace_mode(value: i32, field: String) -> Result<NamespaceMode, ConvertError> {
    Ok(match v1::NamespaceMode::try_from(value) {
        Ok(v1::NamespaceMode::Pod) => NamespaceMode::Pod,
        Ok(v1::NamespaceMode::Container) => NamespaceMode::Container,
        Ok(v1::NamespaceMode::Node) => NamespaceMode::Node,
        Ok(v1::NamespaceMode::Target) => NamespaceMode::Target,
        Err(_) => return Err(unknown_enum(field, value)),
    })
}

/// `NamespaceOption` → [`NamespaceOptions`]. `prefix` is the CRI path of the message.
///
/// `userns_options` as the CRI api.proto and containerd's `parseUsernsIDs` read it: absent or
/// `NODE` is the host's user namespace (and `NODE` must carry no mappings); `POD` is a user
/// namespace of the pod's own, see [`user_namespace`]; `CONTAINER` and `TARGET` are not
/// defined for user namespaces (containerd: "unsupported user namespace mode").
pub fn namespace_options(
    ns: &v1::NamespaceOption,
    prefix: &str,
) -> Result<NamespaceOptions, ConvertError> {
    let user = match &ns.userns_options {
        Some(u) => user_namespace(u, &format!("{prefix}.userns_options"))?,
        None => None,
    };
    Ok(NamespaceOptions {
        network: namespace_mode(ns.network, format!("{prefix}.network"))?,
        pid: namespace_mode(ns.pid, format!("{prefix}.pid"))?,
        ipc: namespace_mode(ns.ipc, format!("{prefix}.ipc"))?,
        user,
    })
}

/// `UserNamespace` (at CRI path `prefix`) → the pod's own user namespace, `None` for the
/// host's. `POD` takes exactly one uid and one gid mapping (containerd accepts one line only:
/// the snapshotter shifts the rootfs by one range), each of length at least 1 and mapping
/// container ID 0 (the rootfs's root must be someone inside).
fn user_namespace(
    u: &v1::UserNamespace,
    prefix: &str,
) -> Result<Option<UserNamespace>, ConvertError> {
    let mode_field = format!("{prefix}.mode");
    match namespace_mode(u.mode, mode_field.clone())? {
        NamespaceMode::Node => {
            for (field, maps) in [("uids", &u.uids), ("gids", &u.gids)] {
                if !maps.is_empty() {
                    return Err(ConvertError::Invalid {
                        field: format!("{prefix}.{field}"),
                        value: format!("{} mapping(s)", maps.len()),
                        reason: "mode NODE (the host's user namespace) takes no mappings",
                    });
                }
            }
            Ok(None)
        }
        NamespaceMode::Pod => Ok(Some(UserNamespace {
            uids: one_mapping(&u.uids, &format!("{prefix}.uids"))?,
            gids: one_mapping(&u.gids, &format!("{prefix}.gids"))?,
        })),
        NamespaceMode::Container | NamespaceMode::Target => Err(ConvertError::Invalid {
            field: mode_field,
            value: v1::NamespaceMode::try_from(u.mode)
                .map(|m| m.as_str_name().to_string())
                .unwrap_or_else(|_| u.mode.to_string()),
            reason: "a user namespace is the host's (NODE) or the pod's own (POD)",
        }),
    }
}

fn one_mapping(maps: &[v1::IdMapping], field: &str) -> Result<IdMapping, ConvertError> {
    let [m] = maps else {
        return Err(ConvertError::Invalid {
            field: field.to_string(),
            value: format!("{} mapping(s)", maps.len()),
            reason: "mode POD takes exactly one mapping",
        });
    };
    if m.length == 0 {
        return Err(ConvertError::Invalid {
            field: format!("{field}[0].length"),
            value: "0".into(),
            reason: "a mapping maps at least one ID",
        });
    }
    if m.container_id != 0 {
        return Err(ConvertError::Invalid {
            field: format!("{field}[0].container_id"),
            value: m.container_id.to_string(),
            reason: "container ID 0 (the rootfs's owner) must be mapped",
        });
    }
    if m.host_id.checked_add(m.length - 1).is_none() {
        return Err(ConvertError::Invalid {
            field: format!("{field}[0].host_id"),
            value: m.host_id.to_string(),
            reason: "host_id + length overflows 32 bits",
        });
    }
    Ok(IdMapping {
        container_id: m.container_id,
        host_id: m.host_id,
        length: m.length,
    })
}

pub(super) fn supplemental_groups_policy(
    value: i32,
    field: String,
) -> Result<SupplementalGroupsPolicy, ConvertError> {
    match v1::SupplementalGroupsPolicy::try_from(value) {
        Ok(v1::SupplementalGroupsPolicy::Merge) => Ok(SupplementalGroupsPolicy::Merge),
        Ok(v1::SupplementalGroupsPolicy::Strict) => Ok(SupplementalGroupsPolicy::Strict),
        Err(_) => Err(unknown_enum(field, value)),
    }
}

/// A security profile as requested: the typed `SecurityProfile` or the deprecated string,
/// normalised to one form.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Profile {
    RuntimeDefault,
    Unconfined,
    Localhost(String),
}

const PROFILE_RUNTIME_DEFAULT: &str = "runtime/default";
const PROFILE_DOCKER_DEFAULT: &str = "docker/default";
const PROFILE_UNCONFINED: &str = "unconfined";
const PROFILE_LOCALHOST_PREFIX: &str = "localhost/";

/// Resolves the typed profile (`typed`, at CRI path `typed_field`) against the deprecated
/// string (`legacy`, at `legacy_field`). `None` if neither asks for anything.
///
/// The typed field wins. A `Localhost` ref has a `localhost/` prefix trimmed (containerd
/// does too, "just in case") and must not be empty. The string form follows containerd's
/// `generateSecurityProfile`: `runtime/default` and `docker/default` are the runtime
/// default, `unconfined` is unconfined, `localhost/<ref>` is a node-local profile, and any
/// other non-empty string is an error.
fn resolve_profile(
    typed: Option<&v1::SecurityProfile>,
    typed_field: &str,
    legacy: &str,
    legacy_field: &str,
) -> Result<Option<Profile>, ConvertError> {
    use v1::security_profile::ProfileType;
    if let Some(sp) = typed {
        return Ok(Some(match ProfileType::try_from(sp.profile_type) {
            Ok(ProfileType::RuntimeDefault) => Profile::RuntimeDefault,
            Ok(ProfileType::Unconfined) => Profile::Unconfined,
            Ok(ProfileType::Localhost) => {
                let r = sp
                    .localhost_ref
                    .strip_prefix(PROFILE_LOCALHOST_PREFIX)
                    .unwrap_or(&sp.localhost_ref);
                if r.is_empty() {
                    return Err(missing(format!("{typed_field}.localhost_ref")));
                }
                Profile::Localhost(r.to_string())
            }
            Err(_) => {
                return Err(unknown_enum(
                    format!("{typed_field}.profile_type"),
                    sp.profile_type,
                ))
            }
        }));
    }
    Ok(match legacy {
        "" => None,
        PROFILE_RUNTIME_DEFAULT | PROFILE_DOCKER_DEFAULT => Some(Profile::RuntimeDefault),
        PROFILE_UNCONFINED => Some(Profile::Unconfined),
        other => match other.strip_prefix(PROFILE_LOCALHOST_PREFIX) {
            Some(r) if !r.is_empty() => Some(Profile::Localhost(r.to_string())),
            _ => return Err(ConvertError::Invalid {
                field: legacy_field.to_string(),
                value: other.to_string(),
                reason:
                    "expected runtime/default, docker/default, unconfined or localhost/<profile>",
            }),
        },
    })
}

/// Seccomp: nothing asked for is unconfined (CRI: "Default: "", which is identical with
/// unconfined"). A localhost profile must be an absolute path (CRI `localhost_ref`).
pub(super) fn seccomp_profile(
    typed: Option<&v1::SecurityProfile>,
    legacy: &str,
    prefix: &str,
) -> Result<SeccompProfile, ConvertError> {
    let typed_field = format!("{prefix}.seccomp");
    let legacy_field = format!("{prefix}.seccomp_profile_path");
    Ok(
        match resolve_profile(typed, &typed_field, legacy, &legacy_field)? {
            None | Some(Profile::Unconfined) => SeccompProfile::Unconfined,
            Some(Profile::RuntimeDefault) => SeccompProfile::RuntimeDefault,
            Some(Profile::Localhost(path)) => {
                if !Path::new(&path).is_absolute() {
                    let field = if typed.is_some() {
                        format!("{typed_field}.localhost_ref")
                    } else {
                        legacy_field
                    };
                    return Err(ConvertError::Invalid {
                        field,
                        value: path,
                        reason: "a localhost seccomp profile must be an absolute path",
                    });
                }
                SeccompProfile::Localhost(PathBuf::from(path))
            }
        },
    )
}

/// AppArmor: `None` when nothing is asked for (the spec applies the default profile to
/// unprivileged containers, as containerd does).
pub(super) fn apparmor_profile(
    typed: Option<&v1::SecurityProfile>,
    legacy: &str,
    prefix: &str,
) -> Result<Option<AppArmorProfile>, ConvertError> {
    Ok(resolve_profile(
        typed,
        &format!("{prefix}.apparmor"),
        legacy,
        &format!("{prefix}.apparmor_profile"),
    )?
    .map(|p| match p {
        Profile::RuntimeDefault => AppArmorProfile::RuntimeDefault,
        Profile::Unconfined => AppArmorProfile::Unconfined,
        Profile::Localhost(name) => AppArmorProfile::Localhost(name),
    }))
}

/// `LinuxSandboxSecurityContext` → [`SecurityContext`] (the fields a sandbox has).
/// `prefix` is the CRI path of the message.
pub fn sandbox_security(
    sc: &v1::LinuxSandboxSecurityContext,
    prefix: &str,
) -> Result<SecurityContext, ConvertError> {
    #[allow(deprecated)] // The deprecated string is still honoured when the typed field is unset.
    let seccomp_path = sc.seccomp_profile_path.as_str();
    Ok(SecurityContext {
        capabilities: None,
        privileged: sc.privileged,
        namespaces: match &sc.namespace_options {
            Some(ns) => namespace_options(ns, &format!("{prefix}.namespace_options"))?,
            None => NamespaceOptions::default(),
        },
        run_as_user: sc.run_as_user.as_ref().map(|v| v.value),
        run_as_username: String::new(),
        run_as_group: sc.run_as_group.as_ref().map(|v| v.value),
        supplemental_groups: sc.supplemental_groups.clone(),
        supplemental_groups_policy: supplemental_groups_policy(
            sc.supplemental_groups_policy,
            format!("{prefix}.supplemental_groups_policy"),
        )?,
        readonly_rootfs: sc.readonly_rootfs,
        no_new_privs: false,
        seccomp: seccomp_profile(sc.seccomp.as_ref(), seccomp_path, prefix)?,
        apparmor: apparmor_profile(sc.apparmor.as_ref(), "", prefix)?,
        masked_paths: None,
        readonly_paths: None,
    })
}
