//! Containers, request side: `ContainerConfig` → the container's spec inputs, store metadata,
//! log path, mounts, devices and resources.

use std::path::{Path, PathBuf};

use crate::cri::v1;

use super::sandbox::sandbox_metadata_of;
use super::security::{
    apparmor_profile, namespace_options, seccomp_profile, supplemental_groups_policy,
};
use super::signal::stop_signal;
use super::{missing, non_empty, unknown_enum, unsupported, ConvertError};
use crate::cri::validate;
use crate::spec::{
    BindOption, CapabilityChanges, ContainerConfig, DeviceRequest, HugepageLimit, IdMapping,
    ImageVolume, MountPropagation, MountRequest, NamespaceOptions, Resources, SecurityContext,
};
use crate::store::{ContainerMetadata, ImageRefs, MountSummary, PodRef};

fn container_name(config: &v1::ContainerConfig) -> Result<&v1::ContainerMetadata, ConvertError> {
    let m = config
        .metadata
        .as_ref()
        .ok_or_else(|| missing("config.metadata"))?;
    if m.name.is_empty() {
        return Err(missing("config.metadata.name"));
    }
    validate::name("config.metadata.name", &m.name)?;
    Ok(m)
}

fn container_image(config: &v1::ContainerConfig) -> Result<&v1::ImageSpec, ConvertError> {
    let image = config
        .image
        .as_ref()
        .ok_or_else(|| missing("config.image"))?;
    if image.image.is_empty() {
        return Err(missing("config.image.image"));
    }
    Ok(image)
}

/// `ContainerConfig` (of a container in the pod `sandbox`) → the container's spec inputs.
///
/// `metadata.name` and `image.image` are required. When the container's security context
/// (or its `namespace_options`) is absent, the namespace modes are the pod's: a container
/// always shares the pod's network and IPC namespaces, so the pod's modes describe it, and
/// kubelet sends the pod's PID mode for containers anyway. CDI device names (from
/// `cdi_devices` and `cdi.k8s.io/*` annotations, [`cdi_devices`]) must be fully qualified;
/// whether a spec file defines them is checked at create time. Labels, log path and `stdin_once` are not spec inputs (see
/// [`container_metadata`]).
pub fn container_config(
    config: &v1::ContainerConfig,
    sandbox: &v1::PodSandboxConfig,
) -> Result<ContainerConfig, ConvertError> {
    let m = container_name(config)?;
    let image = container_image(config)?;
    let cdi_devices = cdi_devices(config)?;
    let linux = config.linux.as_ref();
    let pod_namespaces = match sandbox
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|sc| sc.namespace_options.as_ref())
    {
        Some(ns) => namespace_options(
            ns,
            "sandbox_config.linux.security_context.namespace_options",
        )?,
        None => NamespaceOptions::default(),
    };
    let mut security = match linux.and_then(|l| l.security_context.as_ref()) {
        Some(sc) => container_security(sc, "config.linux.security_context")?,
        None => SecurityContext::default(),
    };
    if linux
        .and_then(|l| l.security_context.as_ref())
        .and_then(|sc| sc.namespace_options.as_ref())
        .is_none()
    {
        security.namespaces = pod_namespaces;
    }
    let envs = envs(&config.envs, "config.envs")?;
    validate::process(
        "config",
        &config.command,
        &config.args,
        &envs,
        &config.working_dir,
    )?;
    validate::annotations("config.annotations", &config.annotations)?;
    let mounts: Vec<MountRequest> = config
        .mounts
        .iter()
        .enumerate()
        .map(|(i, mount)| mount_request(mount, &format!("config.mounts[{i}]")))
        .collect::<Result<_, _>>()?;
    for (i, m) in mounts.iter().enumerate() {
        image_volume_maps(m, security.namespaces.user.as_ref(), i)?;
    }
    Ok(ContainerConfig {
        name: m.name.clone(),
        image_name: image.image.clone(),
        command: config.command.clone(),
        args: config.args.clone(),
        working_dir: config.working_dir.clone(),
        envs,
        mounts,
        devices: config.devices.iter().map(device_request).collect(),
        cdi_devices,
        annotations: config.annotations.clone(),
        tty: config.tty,
        stdin: config.stdin,
        resources: linux
            .and_then(|l| l.resources.as_ref())
            .map(|r| resources(r, "config.linux.resources"))
            .transpose()?,
        security,
    })
}

/// The CDI devices a container asks for, as containerd's `WithCDI` gathers them:
/// `cdi_devices` in order, then the names in `cdi.k8s.io/*` annotations (keys in sorted order,
/// values comma-separated), each name once. Every name must be fully qualified
/// (`vendor/class=name`).
pub fn cdi_devices(
    config: &v1::ContainerConfig,
) -> Result<Vec<crate::cdi::DeviceRequest>, ConvertError> {
    use crate::cdi::{parse, DeviceRequest};
    let mut out: Vec<DeviceRequest> = Vec::new();
    let mut push = |name: &str, field: String| {
        if !out.iter().any(|d| d.name == name) {
            out.push(DeviceRequest {
                name: name.to_string(),
                field,
            });
        }
    };
    for (i, d) in config.cdi_devices.iter().enumerate() {
        let field = format!("config.cdi_devices[{i}].name");
        parse::qualified_name(&d.name).map_err(|reason| ConvertError::Invalid {
            field: field.clone(),
            value: d.name.clone(),
            reason,
        })?;
        push(&d.name, field);
    }
    let named =
        parse::annotation_devices(&config.annotations).map_err(|(key, value, reason)| {
            ConvertError::Invalid {
                field: format!("config.annotations[{key:?}]"),
                value,
                reason,
            }
        })?;
    for (key, name) in named {
        push(&name, format!("config.annotations[{key:?}]"));
    }
    Ok(out)
}

/// `envs` (CRI `KeyValue`s, whose values are bytes since cri-api v0.34.10) as (key, value)
/// strings. A value that is not UTF-8 is refused, naming its key: the OCI runtime config is
/// JSON, whose strings hold Unicode only, so no runtime that reads config.json (runc, crun)
/// could receive it byte for byte. containerd's CRI passes such a value on in a Go string,
/// which Go's JSON encoder writes with U+FFFD in place of each invalid byte: the container
/// then sees other bytes than the pod asked for, which remora does not do silently.
pub fn envs(envs: &[v1::KeyValue], prefix: &str) -> Result<Vec<(String, String)>, ConvertError> {
    envs.iter()
        .enumerate()
        .map(|(i, kv)| match std::str::from_utf8(&kv.value) {
            Ok(value) => Ok((kv.key.clone(), value.to_string())),
            Err(_) => Err(ConvertError::EnvNotUtf8 {
                field: format!("{prefix}[{i}].value"),
                key: kv.key.clone(),
            }),
        })
        .collect()
}

/// The id of the container whose PID namespace a `TARGET` PID mode joins, if the config
/// asks for one (`linux.security_context.namespace_options.target_id`). The caller resolves
/// it to [`crate::spec::ContainerInputs::target_pid`].
pub fn container_target_id(config: &v1::ContainerConfig) -> Option<String> {
    config
        .linux
        .as_ref()?
        .security_context
        .as_ref()?
        .namespace_options
        .as_ref()
        .and_then(|ns| non_empty(&ns.target_id))
}

/// The container's CRI log file: the pod's `log_directory` joined with the container's
/// `log_path`; empty (no log file) unless both are set, as in containerd. The directory must
/// be absolute and the path relative, neither with `..`: the file stays in the directory.
pub fn container_log_path(
    config: &v1::ContainerConfig,
    sandbox: &v1::PodSandboxConfig,
) -> Result<String, ConvertError> {
    if !config.log_path.is_empty() {
        validate::log_path("config.log_path", &config.log_path)?;
    }
    if !sandbox.log_directory.is_empty() {
        validate::absolute_path("sandbox_config.log_directory", &sandbox.log_directory)?;
    }
    if sandbox.log_directory.is_empty() || config.log_path.is_empty() {
        return Ok(String::new());
    }
    Ok(Path::new(&sandbox.log_directory)
        .join(&config.log_path)
        .to_string_lossy()
        .into_owned())
}

/// The store metadata of a new container. Fills what the request says (pod, name, attempt,
/// labels, annotations, requested image, log path, mounts, tty/stdin flags, the configured
/// stop signal); the caller fills the resolved image (`image.id`, `image.reference`),
/// `resources_json`, and the stop signal when none is configured (empty here).
pub fn container_metadata(
    id: &str,
    sandbox_id: &str,
    config: &v1::ContainerConfig,
    sandbox: &v1::PodSandboxConfig,
) -> Result<ContainerMetadata, ConvertError> {
    let m = container_name(config)?;
    let image = container_image(config)?;
    let pod = sandbox_metadata_of(sandbox).map_err(|e| match e {
        ConvertError::Missing { field } => missing(format!("sandbox_{field}")),
        ConvertError::Invalid {
            field,
            value,
            reason,
        } => ConvertError::Invalid {
            field: format!("sandbox_{field}"),
            value,
            reason,
        },
        other => other,
    })?;
    validate::labels("config.labels", &config.labels)?;
    let stop_signal = stop_signal(config.stop_signal, "config.stop_signal")?;
    let mounts = config
        .mounts
        .iter()
        .enumerate()
        .map(|(i, mount)| {
            mount_request(mount, &format!("config.mounts[{i}]")).map(|r| {
                let (image, image_sub_path) =
                    r.image.map(|v| (v.image, v.sub_path)).unwrap_or_default();
                MountSummary {
                    container_path: r.container_path,
                    host_path: r.host_path.to_string_lossy().into_owned(),
                    readonly: r.readonly,
                    selinux_relabel: r.selinux_relabel,
                    propagation: r.propagation,
                    recursive_read_only: r.recursive_read_only,
                    image,
                    image_ref: String::new(),
                    image_id: String::new(),
                    image_sub_path,
                }
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(ContainerMetadata {
        id: id.to_string(),
        sandbox_id: sandbox_id.to_string(),
        pod: PodRef {
            name: pod.name.clone(),
            namespace: pod.namespace.clone(),
            uid: pod.uid.clone(),
        },
        name: m.name.clone(),
        attempt: m.attempt,
        labels: config.labels.clone(),
        annotations: config.annotations.clone(),
        image: ImageRefs {
            requested: image.image.clone(),
            user_specified: image.user_specified_image.clone(),
            ..Default::default()
        },
        log_path: container_log_path(config, sandbox)?,
        mounts,
        resources_json: Vec::new(),
        tty: config.tty,
        stdin: config.stdin,
        stdin_once: config.stdin_once,
        // Filled by CreateContainer from the spec it generates.
        user: None,
        stop_signal: stop_signal.map(|s| s.to_string()).unwrap_or_default(),
        // Filled by CreateContainer from the devices it resolved.
        cdi_devices: Vec::new(),
    })
}

/// `Mount` → [`MountRequest`]. `prefix` is the CRI path of the mount. ID maps make an
/// idmapped mount ([`mount_id_maps`]); `mount_options` add `noexec`/`nodev`/`nosuid` to the
/// bind ([`bind_options`]). A recursive read-only mount must be readonly and private. An
/// image volume names its image (and maybe a relative sub path in it) instead of a host path,
/// and must be readonly. Both paths must be absolute without `..`, and the mount not at the
/// container's root.
pub fn mount_request(m: &v1::Mount, prefix: &str) -> Result<MountRequest, ConvertError> {
    validate::mount_destination(&format!("{prefix}.container_path"), &m.container_path)?;
    // An image volume (`image` set) has no host path: CreateContainer mounts the image. It is
    // read-only by definition (api.proto `Mount.image`), so a request that says otherwise is
    // refused rather than quietly made read-only, as containerd's CRI refuses it.
    let image = match &m.image {
        Some(spec) => {
            if spec.image.is_empty() {
                return Err(missing(format!("{prefix}.image.image")));
            }
            if !m.host_path.is_empty() {
                return Err(ConvertError::Invalid {
                    field: format!("{prefix}.host_path"),
                    value: validate::shown(&m.host_path),
                    reason: "an image volume has no host path",
                });
            }
            if !m.readonly {
                return Err(ConvertError::Invalid {
                    field: format!("{prefix}.readonly"),
                    value: "false".into(),
                    reason: "an image volume is read-only: readonly must be true",
                });
            }
            if !m.image_sub_path.is_empty() {
                validate::image_sub_path(&format!("{prefix}.image_sub_path"), &m.image_sub_path)?;
            }
            Some(ImageVolume {
                image: spec.image.clone(),
                sub_path: m.image_sub_path.clone(),
            })
        }
        None => {
            validate::absolute_path(&format!("{prefix}.host_path"), &m.host_path)?;
            if !m.image_sub_path.is_empty() {
                return Err(ConvertError::Invalid {
                    field: format!("{prefix}.image_sub_path"),
                    value: validate::shown(&m.image_sub_path),
                    reason: "only an image volume (image set) has a sub path",
                });
            }
            None
        }
    };
    let (uid_mappings, gid_mappings) = mount_id_maps(m, prefix)?;
    let options = bind_options(&m.mount_options, &format!("{prefix}.mount_options"))?;
    let propagation = match v1::MountPropagation::try_from(m.propagation) {
        Ok(v1::MountPropagation::PropagationPrivate) => MountPropagation::Private,
        Ok(v1::MountPropagation::PropagationHostToContainer) => MountPropagation::HostToContainer,
        Ok(v1::MountPropagation::PropagationBidirectional) => MountPropagation::Bidirectional,
        Err(_) => return Err(unknown_enum(format!("{prefix}.propagation"), m.propagation)),
    };
    // The CRI's rules for recursive read-only mounts (api.proto `Mount.recursive_read_only`),
    // as containerd's CRI applies them: a writable or non-private mount cannot be made
    // read-only for good (a propagated mount could arrive writable later).
    if m.recursive_read_only {
        let field = format!("{prefix}.recursive_read_only");
        if !m.readonly {
            return Err(ConvertError::Invalid {
                field,
                value: "true".into(),
                reason: "a recursive read-only mount must also be readonly",
            });
        }
        if propagation != MountPropagation::Private {
            return Err(ConvertError::Invalid {
                field,
                value: "true".into(),
                reason: "a recursive read-only mount must have PROPAGATION_PRIVATE",
            });
        }
    }
    Ok(MountRequest {
        container_path: m.container_path.clone(),
        host_path: if image.is_some() {
            PathBuf::new()
        } else {
            PathBuf::from(&m.host_path)
        },
        readonly: m.readonly || image.is_some(),
        selinux_relabel: m.selinux_relabel,
        propagation,
        recursive_read_only: m.recursive_read_only,
        image,
        uid_mappings,
        gid_mappings,
        options,
    })
}

/// An image volume's maps (mount `i` of a container whose user namespace is `user`): none, or
/// exactly the container's user namespace maps — which CreateContainer checks are the pod's.
///
/// Why: an image volume is a snapshot view mounted on the host, overlay for an image of several
/// layers, and an overlay mount cannot be idmapped (overlayfs does not take
/// `MOUNT_ATTR_IDMAP`), so the maps cannot go to the OCI runtime as a bind mount's (runc fails
/// EINVAL at start). Instead the view is made with the snapshotter's remap labels, which hold
/// one range from container ID 0 — the pod's user namespace — and its layers are idmapped one
/// by one, as for the rootfs. containerd 2.3 does the same (`getImageVolumeSnapshotOpts`) but
/// takes the first range's host IDs and length from whatever maps the mount has, whatever
/// their container IDs, further ranges, or the pod's maps say; remora refuses maps it would
/// not honour as given rather than idmap the volume otherwise than asked.
fn image_volume_maps(
    m: &MountRequest,
    user: Option<&crate::spec::UserNamespace>,
    i: usize,
) -> Result<(), ConvertError> {
    if m.image.is_none() || m.uid_mappings.is_empty() {
        return Ok(());
    }
    let shown = |maps: &[IdMapping]| {
        maps.iter()
            .map(|m| format!("{}:{}:{}", m.container_id, m.host_id, m.length))
            .collect::<Vec<_>>()
            .join(",")
    };
    let Some(user) = user else {
        return Err(ConvertError::Invalid {
            field: format!("config.mounts[{i}].uid_mappings"),
            value: shown(&m.uid_mappings),
            reason: "an image volume is idmapped only with its pod's user namespace maps, \
                     and the container has no user namespace (namespace_options.userns_options)",
        });
    };
    for (field, maps, want) in [
        ("uid_mappings", &m.uid_mappings, user.uids),
        ("gid_mappings", &m.gid_mappings, user.gids),
    ] {
        if maps.as_slice() != [want] {
            return Err(ConvertError::Invalid {
                field: format!("config.mounts[{i}].{field}"),
                value: shown(maps),
                reason: "an image volume is idmapped only with its pod's user namespace maps \
                         (namespace_options.userns_options), and these differ",
            });
        }
    }
    Ok(())
}

/// The most extents a Linux ID map holds (`/proc/<pid>/uid_map`, since 4.15); the OCI runtime
/// writes an idmapped mount's maps into such a file, which refuses more.
pub const MAX_ID_MAP_EXTENTS: usize = 340;

/// A mount's `uid_mappings` and `gid_mappings` (an idmapped bind mount; kubelet sends its
/// pod's maps on every mount of a `hostUsers: false` pod). Both or neither: runc refuses an
/// idmapped mount with one of them only. Each map is what the kernel takes in a `uid_map`: at
/// most [`MAX_ID_MAP_EXTENTS`] ranges, each at least one ID long, neither end past 2³²−1, no
/// two overlapping on the container side or on the host side.
///
/// As in containerd 2.3, the maps are the request's, passed on as given: neither compared with
/// the pod's user namespace nor refused in a pod without one (runc ≥ 1.2 makes idmapped
/// mounts with any maps, in a user namespace of its own when the container has none).
fn mount_id_maps(
    m: &v1::Mount,
    prefix: &str,
) -> Result<(Vec<IdMapping>, Vec<IdMapping>), ConvertError> {
    let uid_field = format!("{prefix}.uid_mappings");
    let gid_field = format!("{prefix}.gid_mappings");
    match (m.uid_mappings.is_empty(), m.gid_mappings.is_empty()) {
        (true, true) => return Ok((Vec::new(), Vec::new())),
        (false, false) => {}
        (uids_empty, _) => {
            return Err(ConvertError::Invalid {
                field: if uids_empty { uid_field } else { gid_field },
                value: "0 mapping(s)".into(),
                reason: "an idmapped mount takes both uid_mappings and gid_mappings",
            })
        }
    }
    Ok((
        id_map(&m.uid_mappings, &uid_field)?,
        id_map(&m.gid_mappings, &gid_field)?,
    ))
}

/// One ID map (at CRI path `field`), checked as the kernel checks a `uid_map` write.
fn id_map(maps: &[v1::IdMapping], field: &str) -> Result<Vec<IdMapping>, ConvertError> {
    if maps.len() > MAX_ID_MAP_EXTENTS {
        return Err(ConvertError::Invalid {
            field: field.to_string(),
            value: format!("{} mapping(s)", maps.len()),
            reason: "a Linux ID map holds at most 340 ranges",
        });
    }
    let mut out: Vec<IdMapping> = Vec::with_capacity(maps.len());
    for (i, m) in maps.iter().enumerate() {
        let at = |part: &str| format!("{field}[{i}]{part}");
        if m.length == 0 {
            return Err(ConvertError::Invalid {
                field: at(".length"),
                value: "0".into(),
                reason: "a mapping maps at least one ID",
            });
        }
        // Both ranges end at start + length - 1, which must fit in 32 bits.
        for (part, start) in [(".container_id", m.container_id), (".host_id", m.host_id)] {
            if start.checked_add(m.length - 1).is_none() {
                return Err(ConvertError::Invalid {
                    field: at(part),
                    value: start.to_string(),
                    reason: "start + length overflows 32 bits",
                });
            }
        }
        let mapping = IdMapping {
            container_id: m.container_id,
            host_id: m.host_id,
            length: m.length,
        };
        for earlier in &out {
            let meets = |a: u32, a_len: u32, b: u32, b_len: u32| {
                // [a, a+a_len-1] ∩ [b, b+b_len-1] ≠ ∅; neither end overflows (checked above).
                a <= b + (b_len - 1) && b <= a + (a_len - 1)
            };
            if meets(
                earlier.container_id,
                earlier.length,
                mapping.container_id,
                mapping.length,
            ) {
                return Err(ConvertError::Invalid {
                    field: at(".container_id"),
                    value: mapping.container_id.to_string(),
                    reason: "the range overlaps an earlier mapping's container IDs",
                });
            }
            if meets(
                earlier.host_id,
                earlier.length,
                mapping.host_id,
                mapping.length,
            ) {
                return Err(ConvertError::Invalid {
                    field: at(".host_id"),
                    value: mapping.host_id.to_string(),
                    reason: "the range overlaps an earlier mapping's host IDs",
                });
            }
        }
        out.push(mapping);
    }
    Ok(out)
}

/// A mount's `mount_options` (at CRI path `field`): only what the CRI allows for a bind
/// (`noexec`, `nodev`, `nosuid`, spelled so); anything else is refused naming the option
/// rather than dropped, since the pod asked for a mount more restricted than remora would make
/// it. A repeated option is kept once (kubelet refuses repeats; mount(8) ignores them).
fn bind_options(options: &[String], field: &str) -> Result<Vec<BindOption>, ConvertError> {
    let mut out: Vec<BindOption> = Vec::with_capacity(options.len());
    for (i, o) in options.iter().enumerate() {
        let option = BindOption::parse(o).ok_or_else(|| ConvertError::Invalid {
            field: format!("{field}[{i}]"),
            value: o.clone(),
            reason: "the CRI allows only noexec, nodev and nosuid as mount options",
        })?;
        if !out.contains(&option) {
            out.push(option);
        }
    }
    Ok(out)
}

/// `Device` → [`DeviceRequest`], verbatim (the spec checks paths and permissions).
pub fn device_request(d: &v1::Device) -> DeviceRequest {
    DeviceRequest {
        container_path: d.container_path.clone(),
        host_path: PathBuf::from(&d.host_path),
        permissions: d.permissions.clone(),
    }
}

/// `LinuxContainerResources` (at CRI path `prefix`) → [`Resources`]: zero means "not set" as
/// in CRI; negative values, an `oom_score_adj` outside -1000..=1000 and malformed cpusets or
/// unified keys are refused ([`validate::resources`]).
pub fn resources(r: &v1::LinuxContainerResources, prefix: &str) -> Result<Resources, ConvertError> {
    let out = Resources {
        cpu_period: r.cpu_period,
        cpu_quota: r.cpu_quota,
        cpu_shares: r.cpu_shares,
        memory_limit_in_bytes: r.memory_limit_in_bytes,
        memory_swap_limit_in_bytes: r.memory_swap_limit_in_bytes,
        oom_score_adj: r.oom_score_adj,
        cpuset_cpus: r.cpuset_cpus.clone(),
        cpuset_mems: r.cpuset_mems.clone(),
        hugepage_limits: r
            .hugepage_limits
            .iter()
            .map(|h| HugepageLimit {
                page_size: h.page_size.clone(),
                limit: h.limit,
            })
            .collect(),
        pids_limit: None,
        unified: r.unified.clone(),
    };
    validate::resources(prefix, &out)?;
    Ok(out)
}

/// Resources a pod reports for its record (UpdatePodSandboxResources): as [`resources`], and
/// bounded ([`validate::recorded_resources`]).
pub fn recorded_resources(
    r: &v1::LinuxContainerResources,
    prefix: &str,
) -> Result<Resources, ConvertError> {
    let out = resources(r, prefix)?;
    validate::recorded_resources(prefix, &out)?;
    Ok(out)
}

/// `LinuxContainerSecurityContext` → [`SecurityContext`]. `prefix` is the CRI path of the
/// message.
///
/// Seccomp and AppArmor: the typed field wins over the deprecated string (module docs).
/// Ambient capabilities are refused (unsupported). `masked_paths` / `readonly_paths` are
/// applied exactly as sent, an empty list masking nothing: kubelet sends the default lists for
/// `procMount: Default` and empty ones for `Unmasked` (`ConvertToRuntimeMaskedPaths`), and
/// containerd (which sees `nil` for an empty list) starts from empty lists and applies the
/// request's only when there is one. A container without a security context keeps the
/// runtime's defaults.
pub fn container_security(
    sc: &v1::LinuxContainerSecurityContext,
    prefix: &str,
) -> Result<SecurityContext, ConvertError> {
    #[allow(deprecated)] // The deprecated strings are honoured when the typed fields are unset.
    let (seccomp_path, apparmor_name) = (
        sc.seccomp_profile_path.as_str(),
        sc.apparmor_profile.as_str(),
    );
    let capabilities = match &sc.capabilities {
        None => None,
        Some(c) => {
            if !c.add_ambient_capabilities.is_empty() {
                return Err(unsupported(format!(
                    "{prefix}.capabilities.add_ambient_capabilities"
                )));
            }
            Some(CapabilityChanges {
                add: c.add_capabilities.clone(),
                drop: c.drop_capabilities.clone(),
            })
        }
    };
    Ok(SecurityContext {
        capabilities,
        privileged: sc.privileged,
        namespaces: match &sc.namespace_options {
            Some(ns) => namespace_options(ns, &format!("{prefix}.namespace_options"))?,
            None => NamespaceOptions::default(),
        },
        run_as_user: sc.run_as_user.as_ref().map(|v| v.value),
        run_as_username: sc.run_as_username.clone(),
        run_as_group: sc.run_as_group.as_ref().map(|v| v.value),
        supplemental_groups: sc.supplemental_groups.clone(),
        supplemental_groups_policy: supplemental_groups_policy(
            sc.supplemental_groups_policy,
            format!("{prefix}.supplemental_groups_policy"),
        )?,
        readonly_rootfs: sc.readonly_rootfs,
        no_new_privs: sc.no_new_privs,
        seccomp: seccomp_profile(sc.seccomp.as_ref(), seccomp_path, prefix)?,
        apparmor: apparmor_profile(sc.apparmor.as_ref(), apparmor_name, prefix)?,
        masked_paths: Some(sc.masked_paths.clone()),
        readonly_paths: Some(sc.readonly_paths.clone()),
    })
}
