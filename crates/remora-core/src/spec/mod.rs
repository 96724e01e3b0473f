//! OCI runtime spec generation for CRI containers and sandboxes.
//!
//! Pure functions from plain domain inputs ([`types`]) to an [`oci_spec::runtime::Spec`].
//! The only I/O is reading the image's `/etc/passwd` and `/etc/group` (user names) and a
//! `Localhost` seccomp profile file; everything else the host must tell us comes in as data
//! ([`HostFacts`], a device lookup function) or goes out as data
//! ([`ContainerSpec::host_dirs_to_create`]).
//!
//! The behaviour follows containerd's CRI plugin (`container_create_linux.go`,
//! `sandbox_run_linux.go`, `pkg/oci/spec_opts.go`) so that workloads, kubelet and tools such
//! as critest see what they expect; each submodule says where and why it departs.
//!
//! Protobuf types stay out of this module: the CRI adapter maps requests to [`types`].

pub mod cgroups;
pub mod devices;
mod in_root;
pub mod mounts;
pub mod namespaces;
pub mod nri;
pub mod passthrough;
pub mod process;
pub mod resources;
pub mod rootfs;
pub mod seccomp;
pub mod security;
pub mod sysctl;
pub mod types;
pub mod user;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use oci_spec::runtime::{
    LinuxBuilder, LinuxResourcesBuilder, Process, ProcessBuilder, RootBuilder, Spec, SpecBuilder,
};
use oci_spec::OciSpecError;
use thiserror::Error;

pub use cgroups::{cgroups_path, CgroupDriver};
pub use devices::DeviceLookup;
pub use passthrough::PassThrough;
pub use process::{merge_env, process_args};
pub use rootfs::RootFs;
pub use types::*;
pub use user::resolve_user;

/// Annotation keys containerd sets, which tools (and runtimes such as Kata or gVisor) use to
/// recognise CRI sandboxes and containers.
pub mod annotations {
    /// `sandbox` or `container`.
    pub const CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
    /// [`CONTAINER_TYPE`] of a pause container.
    pub const CONTAINER_TYPE_SANDBOX: &str = "sandbox";
    /// [`CONTAINER_TYPE`] of an application container.
    pub const CONTAINER_TYPE_CONTAINER: &str = "container";
    /// The sandbox id.
    pub const SANDBOX_ID: &str = "io.kubernetes.cri.sandbox-id";
    /// The pod name.
    pub const SANDBOX_NAME: &str = "io.kubernetes.cri.sandbox-name";
    /// The pod namespace.
    pub const SANDBOX_NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";
    /// The pod uid.
    pub const SANDBOX_UID: &str = "io.kubernetes.cri.sandbox-uid";
    /// The pod's log directory (sandboxes only).
    pub const SANDBOX_LOG_DIR: &str = "io.kubernetes.cri.sandbox-log-directory";
    /// The container name (containers only).
    pub const CONTAINER_NAME: &str = "io.kubernetes.cri.container-name";
    /// The image reference (the pause image for sandboxes).
    pub const IMAGE_NAME: &str = "io.kubernetes.cri.image-name";
    /// `"true"` on the spec of a pod without a pause container: the task that holds its shim
    /// (remora's shim runs no process for it).
    pub const POD_HOLDER: &str = remora_host::POD_HOLDER_ANNOTATION;
}

/// Why a spec cannot be generated. Every variant is a caller or image error that the CRI
/// layer reports as such (InvalidArgument / FailedPrecondition), except [`SpecError::Build`].
#[derive(Debug, Error)]
pub enum SpecError {
    /// Neither the config nor the image says what to run.
    #[error("no command specified: the container config has no command/args and the image has no entrypoint/cmd")]
    NoCommand,
    /// `run_as_group` without `run_as_user` / `run_as_username`.
    #[error("run_as_group {gid} is specified without run_as_user or run_as_username")]
    GroupWithoutUser {
        /// The group asked for.
        gid: String,
    },
    /// A negative or too large uid/gid.
    #[error("invalid {field} {value}: ids must be between 0 and 4294967295")]
    InvalidId {
        /// The CRI field.
        field: &'static str,
        /// Its value.
        value: i64,
    },
    /// A user string that is not `user` or `user:group`.
    #[error("invalid user {user:?}: expected `user` or `user:group`")]
    InvalidUser {
        /// The string.
        user: String,
    },
    /// A user name not in the image's passwd file.
    #[error("user {name:?} not found in the image's {}", passwd.display())]
    UserNotFound {
        /// The name.
        name: String,
        /// The passwd file looked in (it may not exist).
        passwd: PathBuf,
    },
    /// A group name not in the image's group file.
    #[error("group {name:?} not found in the image's {}", group.display())]
    GroupNotFound {
        /// The name.
        name: String,
        /// The group file looked in (it may not exist).
        group: PathBuf,
    },
    /// The image's passwd or group file exists but cannot be read.
    #[error("cannot read {}: {source}", path.display())]
    ReadUserDb {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A mount destination that is not a clean absolute path inside the container.
    #[error("invalid mount destination {destination:?}: {reason}")]
    InvalidMountDestination {
        /// The requested container path.
        destination: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A bind mount source that is not an absolute host path.
    #[error("invalid mount source {} for {destination:?}: host paths must be absolute", source_path.display())]
    InvalidMountSource {
        /// The container path.
        destination: String,
        /// The host path.
        source_path: PathBuf,
    },
    /// A device whose host node could not be looked up.
    #[error("cannot use device {}: {source}", host_path.display())]
    DeviceLookup {
        /// The host path.
        host_path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Device permissions other than a combination of `r`, `w`, `m`.
    #[error("invalid device permissions {permissions:?}: expected a combination of r, w and m")]
    InvalidDevicePermissions {
        /// The requested permissions.
        permissions: String,
    },
    /// A device container path that is not absolute.
    #[error("invalid device container path {path:?}: it must be absolute")]
    InvalidDevicePath {
        /// The requested path.
        path: String,
    },
    /// A resource value below zero.
    #[error("invalid resource {field}: {value} is negative")]
    NegativeResource {
        /// The CRI field.
        field: &'static str,
        /// Its value.
        value: i64,
    },
    /// A CPU quota below -1, kubelet's (and cgroup v1's) "no quota".
    #[error("invalid resource cpu_quota: {value} (the quota is -1 for no limit, or not negative)")]
    CpuQuotaBelowNoLimit {
        /// Its value.
        value: i64,
    },
    /// A resource value the OCI spec cannot hold.
    #[error("invalid resource {field}: {value} is too large")]
    ResourceTooLarge {
        /// The CRI field.
        field: &'static str,
        /// Its value.
        value: u64,
    },
    /// `oom_score_adj` outside -1000..=1000.
    #[error("invalid oom_score_adj {value}: must be between -1000 and 1000")]
    InvalidOomScoreAdj {
        /// The value.
        value: i64,
    },
    /// A privileged container in a pod that is not privileged.
    #[error("privileged container not allowed in a sandbox that is not privileged")]
    PrivilegedNotAllowed,
    /// A capability name the runtime does not know.
    #[error("unknown capability {name:?}")]
    UnknownCapability {
        /// The name as given.
        name: String,
    },
    /// An AppArmor profile asked for on a host without AppArmor.
    #[error("apparmor profile {profile:?} requested, but AppArmor is not enabled on this host")]
    AppArmorUnsupported {
        /// The requested profile.
        profile: String,
    },
    /// A `Localhost` seccomp profile that cannot be read.
    #[error("cannot read seccomp profile {}: {source}", path.display())]
    SeccompProfileRead {
        /// The profile path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A `Localhost` seccomp profile that is not an OCI `LinuxSeccomp` JSON object.
    #[error("invalid seccomp profile {}: {source}", path.display())]
    SeccompProfileParse {
        /// The profile path.
        path: PathBuf,
        /// The JSON error.
        source: serde_json::Error,
    },
    /// A sysctl the pod may not set (not namespaced, or in a namespace it shares with the
    /// host), or a malformed name or value.
    #[error("invalid sysctl {key:?}: {reason}")]
    InvalidSysctl {
        /// The sysctl name.
        key: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// A pod's cgroup parent that the systemd cgroup driver cannot use (not a slice name).
    #[error("invalid cgroup_parent {parent:?} for the systemd cgroup driver: {reason}")]
    InvalidCgroupParent {
        /// The parent as given.
        parent: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// PID namespace mode `Target` without the target container's pid.
    #[error("pid namespace mode TARGET requires the target container's pid")]
    MissingTargetPid,
    /// A pod without a pause container has no such namespace of its own to join (only its
    /// network, IPC and UTS namespaces are pinned).
    #[error("the pod has no pause container, so it has no {0} namespace to join")]
    NoPodNamespace(&'static str),
    /// A pod without a pause container that has no network namespace of its own.
    #[error("a pod without a pause container must have a network namespace of its own")]
    PinnedWithoutNetns,
    /// An oci-spec builder rejected a value (a bug in this module, not in the request).
    #[error("building the OCI spec: {0}")]
    Build(#[from] OciSpecError),
}

/// Everything a container's spec is generated from.
pub struct ContainerInputs<'a> {
    /// The container id.
    pub id: &'a str,
    /// The CRI container config.
    pub config: &'a ContainerConfig,
    /// The image config.
    pub image: &'a ImageConfig,
    /// The sandbox the container joins.
    pub sandbox: &'a SandboxInfo,
    /// The container's root filesystem (a mounted one, or the snapshot's layers), to resolve
    /// user names.
    pub rootfs: RootFs<'a>,
    /// The pid of the container a `Target` PID namespace mode points at.
    pub target_pid: Option<u32>,
    /// Host facts.
    pub host: &'a HostFacts,
    /// Device lookup for [`ContainerConfig::devices`].
    pub device_lookup: &'a DeviceLookup<'a>,
    /// The pod and container annotations the runtime handler passes to the spec.
    pub pass_through: &'a PassThrough,
}

/// A generated container spec and the host preparation it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerSpec {
    /// The OCI spec (root path `rootfs`, relative to the bundle).
    pub spec: Spec,
    /// Bind sources to create as directories if they do not exist (containerd's behaviour).
    pub host_dirs_to_create: Vec<PathBuf>,
}

/// Everything a pause container's spec is generated from.
pub struct SandboxInputs<'a> {
    /// The sandbox id.
    pub id: &'a str,
    /// The pod config.
    pub config: &'a SandboxConfig,
    /// The pause image's config.
    pub image: &'a ImageConfig,
    /// The pause image reference (annotation).
    pub image_name: &'a str,
    /// The pause image's root filesystem, to resolve `run_as_user`'s group; `None` treats
    /// the image as having no passwd/group files.
    pub rootfs: Option<&'a Path>,
    /// The pod's network namespace bind mount (unless host network).
    pub netns_path: Option<&'a Path>,
    /// For a pod with a user namespace of its own and a network namespace: the pinned user
    /// namespace that owns the network namespace, for pause to join.
    pub userns_path: Option<&'a Path>,
    /// Files prepared for the pod.
    pub files: &'a SandboxFiles,
    /// Host facts.
    pub host: &'a HostFacts,
    /// Set `net.ipv4.ip_unprivileged_port_start=0` in the pod's network namespace unless the
    /// pod sets it (containerd's `enable_unprivileged_ports`).
    pub unprivileged_ports: bool,
    /// Set `net.ipv4.ping_group_range=0 2147483647` unless the pod sets it (containerd's
    /// `enable_unprivileged_icmp`). Leave off where critest's NET_RAW-drop spec must pass.
    pub unprivileged_icmp: bool,
    /// The pod annotations the runtime handler passes to the spec.
    pub pass_through: &'a PassThrough,
}

/// The root path in the bundle, as containerd lays it out.
pub const ROOTFS: &str = "rootfs";
/// `oom_score_adj` of pause containers (kubelet's for guaranteed infrastructure), before
/// clamping to [`HostFacts::min_oom_score_adj`].
pub const SANDBOX_OOM_SCORE_ADJ: i64 = -998;
/// CPU shares of a pause container: the minimum, it only sleeps.
pub const SANDBOX_CPU_SHARES: u64 = 2;

/// The annotations of a container spec: the pod's and the container's annotations that the
/// handler passes through ([`passthrough`]), then containerd's CRI keys (which win, so a user
/// cannot impersonate another sandbox).
pub fn container_annotations(
    config: &ContainerConfig,
    sandbox_id: &str,
    pod: &SandboxConfig,
    pass: &PassThrough,
) -> HashMap<String, String> {
    let mut a = pass.pod_annotations(&pod.annotations);
    a.extend(pass.container_annotations(&config.annotations));
    for (k, v) in [
        (
            annotations::CONTAINER_TYPE,
            annotations::CONTAINER_TYPE_CONTAINER,
        ),
        (annotations::SANDBOX_ID, sandbox_id),
        (annotations::SANDBOX_NAME, &pod.name),
        (annotations::SANDBOX_NAMESPACE, &pod.namespace),
        (annotations::SANDBOX_UID, &pod.uid),
        (annotations::CONTAINER_NAME, &config.name),
        (annotations::IMAGE_NAME, &config.image_name),
    ] {
        a.insert(k.to_owned(), v.to_owned());
    }
    a
}

/// The annotations of a sandbox spec (see [`container_annotations`]).
pub fn sandbox_annotations(
    id: &str,
    pod: &SandboxConfig,
    image_name: &str,
    pass: &PassThrough,
) -> HashMap<String, String> {
    let mut a = pass.pod_annotations(&pod.annotations);
    for (k, v) in [
        (
            annotations::CONTAINER_TYPE,
            annotations::CONTAINER_TYPE_SANDBOX,
        ),
        (annotations::SANDBOX_ID, id),
        (annotations::SANDBOX_NAME, &pod.name),
        (annotations::SANDBOX_NAMESPACE, &pod.namespace),
        (annotations::SANDBOX_UID, &pod.uid),
        (annotations::SANDBOX_LOG_DIR, &pod.log_directory),
        (annotations::IMAGE_NAME, image_name),
    ] {
        a.insert(k.to_owned(), v.to_owned());
    }
    a
}

fn working_dir(config_dir: &str, image_dir: &str) -> PathBuf {
    PathBuf::from(match (config_dir, image_dir) {
        ("", "") => "/",
        ("", image) => image,
        (config, _) => config,
    })
}

/// Builds the process and undoes oci-spec's defaults for fields we leave unset.
///
/// oci-spec's builders fill unset fields from the struct's `Default`, which for `Process` is
/// youki's interactive shell: `no_new_privileges: true` and an `RLIMIT_NOFILE` of 1024. CRI
/// containers get neither unless asked (containerd drops the default rlimits so processes
/// inherit the shim's), so both are set explicitly here.
fn finish_process(builder: ProcessBuilder, no_new_privs: bool) -> Result<Process, SpecError> {
    let mut process = builder.build()?;
    process.set_no_new_privileges(no_new_privs.then_some(true));
    process.set_rlimits(None);
    Ok(process)
}

/// Refuses the pod's sysctls unless each lives in a namespace the pod owns ([`sysctl`]).
fn check_sysctls(
    sysctls: &HashMap<String, String>,
    host_network: bool,
    host_ipc: bool,
) -> Result<(), SpecError> {
    for (key, value) in sysctls {
        sysctl::check(key, value, host_network, host_ipc).map_err(|reason| {
            SpecError::InvalidSysctl {
                key: key.clone(),
                reason,
            }
        })?;
    }
    Ok(())
}

/// The OCI spec of a container.
pub fn container_spec(inputs: &ContainerInputs<'_>) -> Result<ContainerSpec, SpecError> {
    let cfg = inputs.config;
    let sec = &cfg.security;
    let pod = &inputs.sandbox.config;
    let host = inputs.host;
    if sec.privileged && !pod.security.privileged {
        return Err(SpecError::PrivilegedNotAllowed);
    }

    let args = process_args(
        &cfg.command,
        &cfg.args,
        &inputs.image.entrypoint,
        &inputs.image.cmd,
    )?;
    // A host-network pod without a hostname has the node's (kubelet leaves it empty).
    let hostname = if pod.hostname.is_empty() && sec.namespaces.network == NamespaceMode::Node {
        host.node_hostname.as_str()
    } else {
        pod.hostname.as_str()
    };
    let env = merge_env(&inputs.image.env, &cfg.envs, hostname);
    let user = resolve_user(inputs.rootfs, sec, &inputs.image.user)?;
    let caps =
        security::capability_set(sec.capabilities.as_ref(), sec.privileged, host.cap_last_cap)?
            .into_iter()
            .filter(|c| security::in_bounding_set(*c, host.bounding_caps))
            .collect::<Vec<_>>();

    let mut process = ProcessBuilder::default()
        .terminal(cfg.tty)
        .user(user)
        .args(args)
        .env(env)
        .cwd(working_dir(&cfg.working_dir, &inputs.image.working_dir))
        .capabilities(security::linux_capabilities(&caps)?);
    if let Some(profile) =
        security::apparmor_profile(sec.apparmor.as_ref(), sec.privileged, host.apparmor_enabled)?
    {
        process = process.apparmor_profile(profile);
    }

    let mut resources = match &cfg.resources {
        Some(r) => {
            process = process.oom_score_adj(resources::oom_score_adj(
                r.oom_score_adj,
                host.min_oom_score_adj,
            )?);
            resources::linux_resources(r, host)?
        }
        None => LinuxResourcesBuilder::default().build()?,
    };
    let (devices, device_rules) = devices::devices(&cfg.devices, inputs.device_lookup)?;
    let mut rules = vec![if sec.privileged {
        devices::allow_all()?
    } else {
        devices::deny_all()?
    }];
    rules.extend(device_rules);
    resources.set_devices(Some(rules));

    let host_ipc = sec.namespaces.ipc == NamespaceMode::Node;
    check_sysctls(
        &pod.sysctls,
        sec.namespaces.network == NamespaceMode::Node,
        host_ipc,
    )?;
    let userns = sec.namespaces.user.as_ref();
    let plan = mounts::container_mounts(
        &cfg.mounts,
        &inputs.sandbox.files,
        sec.readonly_rootfs,
        host_ipc,
        sec.privileged,
        userns.map(|u| (u, sec.namespaces.network == NamespaceMode::Node)),
    )?;

    let mut linux = LinuxBuilder::default()
        .resources(resources)
        .namespaces(namespaces::container_namespaces(
            &sec.namespaces,
            inputs.sandbox.namespaces_at()?,
            inputs.target_pid,
        )?)
        .devices(devices)
        .masked_paths(security::masked_paths(
            sec.masked_paths.as_deref(),
            sec.privileged,
        ))
        .readonly_paths(security::readonly_paths(
            sec.readonly_paths.as_deref(),
            sec.privileged,
        ))
        .sysctl(pod.sysctls.clone());
    if let Some(seccomp) = seccomp::seccomp_for(&sec.seccomp, sec.privileged, &caps)? {
        linux = linux.seccomp(seccomp);
    }
    if let Some(path) = cgroups_path(host.cgroup_driver, &pod.cgroup_parent, inputs.id)? {
        linux = linux.cgroups_path(PathBuf::from(path));
    }
    if let Some(prop) = plan.rootfs_propagation {
        linux = linux.rootfs_propagation(prop);
    }
    if let Some(u) = userns {
        linux = with_id_mappings(linux, u)?;
    }

    let mut spec = SpecBuilder::default()
        .version(oci_spec::runtime::VERSION)
        .root(
            RootBuilder::default()
                .path(ROOTFS)
                .readonly(sec.readonly_rootfs)
                .build()?,
        )
        .process(finish_process(process, sec.no_new_privs)?)
        .mounts(plan.mounts)
        .linux(linux.build()?)
        .annotations(container_annotations(
            cfg,
            &inputs.sandbox.id,
            pod,
            inputs.pass_through,
        ))
        .build()?;
    // No hostname: the container joins the pod's UTS namespace, which already has it.
    spec.set_hostname(None);
    Ok(ContainerSpec {
        spec,
        host_dirs_to_create: plan.host_dirs_to_create,
    })
}

/// The sysctls of a pod without a pause container, written where runc would have written the
/// pause container's (`remora::net::netns::pin_pod_namespaces`): the pod's, each refused unless
/// it lives in a namespace the pod owns ([`sysctl`]).
pub fn pod_sysctls(cfg: &SandboxConfig) -> Result<Vec<(String, String)>, SpecError> {
    let ns = &cfg.security.namespaces;
    check_sysctls(
        &cfg.sysctls,
        ns.network == NamespaceMode::Node,
        ns.ipc == NamespaceMode::Node,
    )?;
    let mut out: Vec<_> = cfg
        .sysctls
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    out.sort();
    Ok(out)
}

/// The OCI spec of a pod without a pause container: the spec of its holder task, which runs no
/// process (no `process`, no `root`; [`annotations::POD_HOLDER`] for remora's shim), and
/// says what the pod is, as a pause container's would (annotations, hostname, the pinned
/// namespaces its containers join, its sysctls), for whoever reads containerd's records.
pub fn pinned_sandbox_spec(
    id: &str,
    cfg: &SandboxConfig,
    netns_path: &Path,
    pass_through: &PassThrough,
) -> Result<Spec, SpecError> {
    let linux = LinuxBuilder::default()
        .namespaces(namespaces::container_namespaces(
            &cfg.security.namespaces,
            namespaces::PodNamespacesAt::Pinned { netns: netns_path },
            None,
        )?)
        .sysctl(pod_sysctls(cfg)?.into_iter().collect::<HashMap<_, _>>())
        .build()?;
    let mut annotations = sandbox_annotations(id, cfg, "", pass_through);
    annotations.insert(annotations::POD_HOLDER.to_owned(), "true".to_owned());
    let mut spec = SpecBuilder::default()
        .version(oci_spec::runtime::VERSION)
        .linux(linux)
        .annotations(annotations)
        .build()?;
    spec.set_process(None);
    spec.set_root(None);
    spec.set_mounts(None);
    spec.set_hostname((!cfg.hostname.is_empty()).then(|| cfg.hostname.clone()));
    Ok(spec)
}

/// `linux.uidMappings` and `gidMappings` of a user namespace of the pod's own.
fn with_id_mappings(linux: LinuxBuilder, u: &UserNamespace) -> Result<LinuxBuilder, SpecError> {
    Ok(linux
        .uid_mappings(mounts::linux_id_mappings(&[u.uids])?)
        .gid_mappings(mounts::linux_id_mappings(&[u.gids])?))
}

/// The OCI spec of a pod's pause container.
///
/// Like containerd: the rootfs is read-only (pause writes nothing), capabilities are the
/// default set, the CPU weight is minimal, `oom_score_adj` is -998 (clamped), and the pod's
/// sysctls are set here, in the namespaces the pod's containers join.
pub fn sandbox_spec(inputs: &SandboxInputs<'_>) -> Result<Spec, SpecError> {
    let cfg = inputs.config;
    let sec = &cfg.security;
    let host = inputs.host;
    let host_network = sec.namespaces.network == NamespaceMode::Node;

    let args = process_args(&[], &[], &inputs.image.entrypoint, &inputs.image.cmd)?;
    let db = match inputs.rootfs {
        Some(root) => user::UserDb::load(RootFs::Dir(root))?,
        None => user::UserDb::default(),
    };
    let supplemental = sec
        .supplemental_groups
        .iter()
        .map(|&g| {
            u32::try_from(g).map_err(|_| SpecError::InvalidId {
                field: "supplemental_groups",
                value: g,
            })
        })
        .collect::<Result<Vec<u32>, _>>()?;
    let user_string = user::cri_user_string(sec)?.unwrap_or_default();
    let user = user::resolve_with(
        &db,
        &user_string,
        &supplemental,
        SupplementalGroupsPolicy::Strict,
    )?;
    let caps: Vec<_> = security::capability_set(None, false, host.cap_last_cap)?
        .into_iter()
        .filter(|c| security::in_bounding_set(*c, host.bounding_caps))
        .collect();

    let mut process = ProcessBuilder::default()
        .terminal(false)
        .user(user)
        .args(args)
        .env(process::sandbox_env(&inputs.image.env))
        .cwd(working_dir("", &inputs.image.working_dir))
        .capabilities(security::linux_capabilities(&caps)?)
        .oom_score_adj(resources::oom_score_adj(
            SANDBOX_OOM_SCORE_ADJ,
            host.min_oom_score_adj,
        )?);
    // Only an explicit request: containerd never confines pause with a default profile.
    if sec.apparmor.is_some() {
        if let Some(p) = security::apparmor_profile(
            sec.apparmor.as_ref(),
            sec.privileged,
            host.apparmor_enabled,
        )? {
            process = process.apparmor_profile(p);
        }
    }

    check_sysctls(
        &cfg.sysctls,
        host_network,
        sec.namespaces.ipc == NamespaceMode::Node,
    )?;
    let mut sysctls = cfg.sysctls.clone();
    if !host_network {
        if inputs.unprivileged_ports {
            sysctls
                .entry("net.ipv4.ip_unprivileged_port_start".to_owned())
                .or_insert_with(|| "0".to_owned());
        }
        if inputs.unprivileged_icmp {
            sysctls
                .entry("net.ipv4.ping_group_range".to_owned())
                .or_insert_with(|| "0 2147483647".to_owned());
        }
    }

    let resources = LinuxResourcesBuilder::default()
        .cpu(
            oci_spec::runtime::LinuxCpuBuilder::default()
                .shares(SANDBOX_CPU_SHARES)
                .build()?,
        )
        .devices(vec![devices::deny_all()?])
        .build()?;
    let mut linux = LinuxBuilder::default()
        .resources(resources)
        .namespaces(namespaces::sandbox_namespaces(
            &sec.namespaces,
            inputs.netns_path,
            inputs.userns_path,
        )?)
        .masked_paths(security::masked_paths(
            sec.masked_paths.as_deref(),
            sec.privileged,
        ))
        .readonly_paths(security::readonly_paths(
            sec.readonly_paths.as_deref(),
            sec.privileged,
        ))
        .sysctl(sysctls);
    if let Some(seccomp) = seccomp::seccomp_for(&sec.seccomp, sec.privileged, &caps)? {
        linux = linux.seccomp(seccomp);
    }
    if let Some(path) = cgroups_path(host.cgroup_driver, &cfg.cgroup_parent, inputs.id)? {
        linux = linux.cgroups_path(PathBuf::from(path));
    }
    if let Some(u) = &sec.namespaces.user {
        linux = with_id_mappings(linux, u)?;
    }

    let spec = SpecBuilder::default()
        .version(oci_spec::runtime::VERSION)
        .root(RootBuilder::default().path(ROOTFS).readonly(true).build()?)
        .process(finish_process(process, sec.no_new_privs)?)
        .mounts(mounts::sandbox_mounts(
            inputs.files,
            sec.namespaces.ipc == NamespaceMode::Node,
            sec.privileged,
            sec.namespaces.user.as_ref().map(|u| (u, host_network)),
        )?)
        .linux(linux.build()?)
        .annotations(sandbox_annotations(
            inputs.id,
            cfg,
            inputs.image_name,
            inputs.pass_through,
        ));
    // A host-network pod keeps the node's UTS namespace; setting a hostname there would
    // rename the node (runc refuses anyway).
    let mut spec = spec.build()?;
    spec.set_hostname((!host_network && !cfg.hostname.is_empty()).then(|| cfg.hostname.clone()));
    Ok(spec)
}

#[cfg(test)]
pub(crate) mod props;
#[cfg(test)]
mod tests;
