//! Plain domain inputs for spec generation.
//!
//! These mirror the pieces of the CRI messages (`ContainerConfig`, `LinuxContainerConfig`,
//! `LinuxContainerSecurityContext`, `LinuxContainerResources`, `Mount`, `Device`,
//! `PodSandboxConfig`) and of the OCI image config that a spec needs, without any protobuf
//! types, so the generators stay pure and the protobuf → domain mapping lives in one adapter.
//! CRI's "0 / empty means not set" conventions are kept where the adapter can copy a field
//! verbatim; `Option` is used where CRI itself distinguishes "unset" (wrapper messages).

use std::collections::HashMap;
use std::path::PathBuf;

/// How a pod or container uses a Linux namespace (CRI `NamespaceMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NamespaceMode {
    /// Shared by all containers of the pod (the sandbox's namespace). CRI's default.
    #[default]
    Pod,
    /// A namespace of the container's own (only meaningful for PID).
    Container,
    /// The host's namespace.
    Node,
    /// Another container's namespace (PID only; see [`super::ContainerInputs::target_pid`]).
    Target,
}

/// CRI `NamespaceOption`: which namespaces a pod or container shares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamespaceOptions {
    /// Network namespace mode (`Pod` or `Node`).
    pub network: NamespaceMode,
    /// PID namespace mode (`Pod`, `Container`, `Node` or `Target`).
    pub pid: NamespaceMode,
    /// IPC namespace mode (`Pod` or `Node`).
    pub ipc: NamespaceMode,
    /// The pod's own user namespace (CRI `userns_options.mode == POD`); `None` is the host's
    /// (`NODE`, or no `userns_options`).
    pub user: Option<UserNamespace>,
}

/// One line of an ID map (CRI `IDMapping`, OCI `LinuxIDMapping`): `length` IDs from
/// `container_id` inside the namespace are `host_id`.. outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdMapping {
    /// First ID inside the user namespace.
    pub container_id: u32,
    /// The host ID it maps to.
    pub host_id: u32,
    /// How many IDs (at least 1).
    pub length: u32,
}

/// A spec mapping as the host-side helper's.
pub fn idmap(m: IdMapping) -> remora_host::userns::IdMap {
    remora_host::userns::IdMap {
        inside: m.container_id,
        outside: m.host_id,
        length: m.length,
    }
}

/// A user namespace of the pod's own, with one uid and one gid mapping line, each mapping
/// container ID 0 (the adapter checks): containerd's rule, because the rootfs is shifted from
/// container ID 0 by the snapshotter's single-range idmap labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UserNamespace {
    /// The uid mapping.
    pub uids: IdMapping,
    /// The gid mapping.
    pub gids: IdMapping,
}

/// A seccomp profile request (CRI `SecurityProfile` for seccomp, or the deprecated path form
/// already translated by the adapter).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum SeccompProfile {
    /// No seccomp filter. containerd's default when nothing is asked for.
    #[default]
    Unconfined,
    /// The runtime's built-in default profile ([`super::seccomp::default_profile`]).
    RuntimeDefault,
    /// An OCI-format (`LinuxSeccomp`) JSON profile at this host path.
    Localhost(PathBuf),
}

/// An AppArmor profile request (CRI `SecurityProfile` for AppArmor).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppArmorProfile {
    /// Explicitly unconfined.
    Unconfined,
    /// The runtime's default profile ([`super::security::DEFAULT_APPARMOR_PROFILE`]).
    RuntimeDefault,
    /// A profile already loaded on the host, by name.
    Localhost(String),
}

/// CRI `SupplementalGroupsPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SupplementalGroupsPolicy {
    /// Groups of the user from the image's `/etc/group` plus the requested ones (default).
    #[default]
    Merge,
    /// Only the primary group and the requested supplemental groups.
    Strict,
}

/// CRI `Capability`: capability names to add and drop, upper- or lower-case, with or without
/// the `CAP_` prefix; `ALL` means every capability.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CapabilityChanges {
    /// Capabilities to add to the default set.
    pub add: Vec<String>,
    /// Capabilities to remove from the (default + added) set.
    pub drop: Vec<String>,
}

/// CRI `LinuxContainerSecurityContext` (and the parts of the pod's
/// `LinuxSandboxSecurityContext` that a sandbox spec needs; see [`SandboxConfig::security`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecurityContext {
    /// Capability changes; `None` keeps the default set.
    pub capabilities: Option<CapabilityChanges>,
    /// Run privileged: all capabilities, all devices, no masked/read-only paths, writable
    /// sysfs and cgroupfs, no seccomp or AppArmor.
    pub privileged: bool,
    /// Namespace sharing.
    pub namespaces: NamespaceOptions,
    /// `run_as_user`: numeric uid; `None` if unset.
    pub run_as_user: Option<i64>,
    /// `run_as_username`; empty if unset. Wins over `run_as_user`.
    pub run_as_username: String,
    /// `run_as_group`: numeric gid; `None` if unset. Needs a user (CRI rule).
    pub run_as_group: Option<i64>,
    /// Extra gids for the process.
    pub supplemental_groups: Vec<i64>,
    /// How `supplemental_groups` combine with the image's `/etc/group`.
    pub supplemental_groups_policy: SupplementalGroupsPolicy,
    /// Mount the container's root filesystem read-only.
    pub readonly_rootfs: bool,
    /// Set `no_new_privs` on the process.
    pub no_new_privs: bool,
    /// Seccomp profile.
    pub seccomp: SeccompProfile,
    /// AppArmor profile; `None` if not asked for.
    pub apparmor: Option<AppArmorProfile>,
    /// Paths to mask; `None` keeps the defaults ([`super::security::DEFAULT_MASKED_PATHS`]).
    pub masked_paths: Option<Vec<String>>,
    /// Paths to make read-only; `None` keeps the defaults
    /// ([`super::security::DEFAULT_READONLY_PATHS`]).
    pub readonly_paths: Option<Vec<String>>,
}

/// CRI `HugepageLimit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HugepageLimit {
    /// Page size as the kernel names it, e.g. `2MB`, `1GB`.
    pub page_size: String,
    /// Limit in bytes.
    pub limit: u64,
}

/// CRI `LinuxContainerResources`. A zero / empty field is "not set", as in CRI.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resources {
    /// CFS period in microseconds.
    pub cpu_period: i64,
    /// CFS quota in microseconds.
    pub cpu_quota: i64,
    /// CPU shares (relative weight).
    pub cpu_shares: i64,
    /// Memory limit in bytes.
    pub memory_limit_in_bytes: i64,
    /// Memory + swap limit in bytes; 0 means "same as the memory limit" (no swap).
    pub memory_swap_limit_in_bytes: i64,
    /// OOM score adjustment, -1000..=1000; clamped to [`HostFacts::min_oom_score_adj`].
    pub oom_score_adj: i64,
    /// cpuset CPUs, e.g. `0-3,5`.
    pub cpuset_cpus: String,
    /// cpuset memory nodes.
    pub cpuset_mems: String,
    /// Hugepage limits (dropped when the host has no hugetlb controller).
    pub hugepage_limits: Vec<HugepageLimit>,
    /// PIDs limit (not in CRI's container resources today; for pod-level callers).
    pub pids_limit: Option<i64>,
    /// cgroup v2 unified key/values, passed through.
    pub unified: HashMap<String, String>,
}

/// CRI `MountPropagation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MountPropagation {
    /// No propagation (`rprivate`).
    #[default]
    Private,
    /// Host mounts appear in the container (`rslave`).
    HostToContainer,
    /// Both directions (`rshared`).
    Bidirectional,
}

/// CRI `Mount`: a host path bind-mounted into the container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MountRequest {
    /// Where in the container; must be absolute.
    pub container_path: String,
    /// The host path.
    pub host_path: PathBuf,
    /// Mount read-only.
    pub readonly: bool,
    /// SELinux relabel; ignored (no SELinux on the hosts remora targets).
    pub selinux_relabel: bool,
    /// Propagation mode.
    pub propagation: MountPropagation,
    /// Read-only recursively: submounts of `host_path` are read-only too (the `rro` option,
    /// `mount_setattr(2)` with `AT_RECURSIVE`). Only with `readonly` and private propagation
    /// (the adapter checks; a shared or slave mount could receive writable mounts later).
    pub recursive_read_only: bool,
    /// An image volume: the image's files are mounted here read-only. CreateContainer mounts
    /// the image on the host and sets `host_path` to it before the spec is generated.
    pub image: Option<ImageVolume>,
    /// CRI `uid_mappings`: an idmapped mount (OCI `uidMappings`), for a user-namespaced pod.
    /// Passed through as asked, as containerd does; the adapter checks that both or neither
    /// are given and that each range fits in 32 bits without overlapping another.
    pub uid_mappings: Vec<IdMapping>,
    /// CRI `gid_mappings`.
    pub gid_mappings: Vec<IdMapping>,
    /// CRI `mount_options`: flags added to the bind (after `ro`/`rw`), each at most once.
    pub options: Vec<BindOption>,
}

/// A CRI `Mount.mount_options` entry: the bind mount options the CRI allows (api.proto, and
/// kubelet's `bindMountOptions` validation: `noexec`, `nodev`, `nosuid`, nothing else).
// The variants are the options' own names (noexec, nodev, nosuid); the shared `No` is theirs.
#[allow(clippy::enum_variant_names)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BindOption {
    /// `noexec`: no program on the mount can be executed.
    NoExec,
    /// `nodev`: device nodes on the mount cannot be opened.
    NoDev,
    /// `nosuid`: set-user-ID and set-group-ID bits (and file capabilities) are ignored.
    NoSuid,
}

impl BindOption {
    /// The option as the CRI and OCI (and mount(8)) spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            BindOption::NoExec => "noexec",
            BindOption::NoDev => "nodev",
            BindOption::NoSuid => "nosuid",
        }
    }

    /// The option spelled `s`, if the CRI allows it (case-sensitive, as kubelet checks).
    pub fn parse(s: &str) -> Option<BindOption> {
        [BindOption::NoExec, BindOption::NoDev, BindOption::NoSuid]
            .into_iter()
            .find(|o| o.as_str() == s)
    }
}

/// CRI `Mount.image`: the image mounted, at its root or at `sub_path` in it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageVolume {
    /// The image, as kubelet names it (it pulls it first).
    pub image: String,
    /// CRI `Mount.image_sub_path`: a directory in the image to mount instead of its root,
    /// relative to the image's root ("" for the root). Resolved inside the image by
    /// CreateContainer; it must exist and be a directory.
    pub sub_path: String,
}

/// CRI `Device`: a host device made available in the container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceRequest {
    /// Path of the device inside the container.
    pub container_path: String,
    /// Path of the device on the host.
    pub host_path: PathBuf,
    /// cgroup permissions, a combination of `r`, `w`, `m`; empty means `rwm`.
    pub permissions: String,
}

/// The host facts about a device node, as `stat` reports them; supplied by the caller's
/// lookup function so spec generation itself touches no device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostDevice {
    /// Character or block.
    pub kind: DeviceKind,
    /// Major number.
    pub major: i64,
    /// Minor number.
    pub minor: i64,
    /// Permission bits of the node (`st_mode & 0o7777`).
    pub file_mode: u32,
    /// Owner uid.
    pub uid: u32,
    /// Owner gid.
    pub gid: u32,
}

/// The type of a device node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    /// Character device (`c`).
    Char,
    /// Block device (`b`).
    Block,
}

/// The parts of an OCI image config a spec needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageConfig {
    /// `User`: `uid`, `uid:gid`, `name`, `name:group` (or empty).
    pub user: String,
    /// `Env`: `KEY=value` entries.
    pub env: Vec<String>,
    /// `Entrypoint`.
    pub entrypoint: Vec<String>,
    /// `Cmd`.
    pub cmd: Vec<String>,
    /// `WorkingDir`; empty means `/`.
    pub working_dir: String,
    /// `StopSignal`, e.g. `SIGTERM`. Not part of the OCI spec; carried here so the caller
    /// that stops the container finds it next to the rest of the image config.
    pub stop_signal: String,
}

/// CRI `ContainerConfig` with its `LinuxContainerConfig`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerConfig {
    /// `metadata.name`.
    pub name: String,
    /// The image reference the user asked for (goes to the `image-name` annotation).
    pub image_name: String,
    /// `command`: replaces the image entrypoint.
    pub command: Vec<String>,
    /// `args`: replaces the image cmd.
    pub args: Vec<String>,
    /// `working_dir`; empty means the image's.
    pub working_dir: String,
    /// `envs` as (key, value), in request order.
    pub envs: Vec<(String, String)>,
    /// `mounts`.
    pub mounts: Vec<MountRequest>,
    /// `devices`.
    pub devices: Vec<DeviceRequest>,
    /// CDI devices: `cdi_devices`, then the names in `cdi.k8s.io/*` annotations, each once
    /// (applied after spec generation, [`crate::cdi`]).
    pub cdi_devices: Vec<crate::cdi::DeviceRequest>,
    /// `annotations`, passed through to the spec.
    pub annotations: HashMap<String, String>,
    /// `tty`: allocate a terminal (`process.terminal`).
    pub tty: bool,
    /// `stdin`: keep stdin open. Not part of the OCI spec (it is an IO setting); kept so the
    /// adapter can hand one struct around.
    pub stdin: bool,
    /// `linux.resources`; `None` if not given.
    pub resources: Option<Resources>,
    /// `linux.security_context`.
    pub security: SecurityContext,
}

/// Host files prepared for a sandbox and shared by its containers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxFiles {
    /// The sandbox's `/etc/hosts`, if prepared.
    pub hosts: Option<PathBuf>,
    /// The sandbox's `/etc/resolv.conf`, if prepared.
    pub resolv_conf: Option<PathBuf>,
    /// The sandbox's `/etc/hostname`, if it exists (containerd mounts it only then).
    pub hostname: Option<PathBuf>,
    /// The sandbox's `/dev/shm` (a tmpfs mounted by remora), if any; a private tmpfs
    /// otherwise.
    pub shm: Option<PathBuf>,
}

/// CRI `PodSandboxConfig` and its `LinuxPodSandboxConfig`, as far as specs need them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxConfig {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.uid`.
    pub uid: String,
    /// `hostname`.
    pub hostname: String,
    /// `log_directory`.
    pub log_directory: String,
    /// `linux.cgroup_parent`; empty lets runc choose.
    pub cgroup_parent: String,
    /// `linux.sysctls`.
    pub sysctls: HashMap<String, String>,
    /// `annotations`, passed through to the sandbox spec.
    pub annotations: HashMap<String, String>,
    /// `linux.security_context` (only the fields a sandbox has are read: privileged,
    /// namespaces, run-as user/group, supplemental groups, no_new_privs, seccomp).
    pub security: SecurityContext,
}

/// A running sandbox, as a container joining it sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxInfo {
    /// Sandbox id.
    pub id: String,
    /// Host pid of the sandbox's pause process (its namespaces are joined through
    /// `/proc/<pid>/ns/*`).
    pub pid: u32,
    /// The pod's network namespace path (bind mount), preferred over `/proc/<pid>/ns/net`.
    pub netns_path: Option<PathBuf>,
    /// The pod has no pause container (`pid` is 0): its IPC and UTS namespaces are pinned
    /// beside its network namespace.
    pub pinned: bool,
    /// The pod config.
    pub config: SandboxConfig,
    /// Files prepared for the pod.
    pub files: SandboxFiles,
}

/// Facts about the host that change what a spec may contain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFacts {
    /// AppArmor is enabled on the host.
    pub apparmor_enabled: bool,
    /// remora's own `oom_score_adj`: without CAP_SYS_RESOURCE runc cannot go lower.
    pub min_oom_score_adj: i32,
    /// The memory cgroup has swap accounting (v1 `memory.memsw.*`, v2 `memory.swap.max`), so
    /// a swap limit may be set.
    pub swap_accounting: bool,
    /// The hugetlb cgroup controller is there (a v1 hierarchy, or listed in v2's
    /// `cgroup.controllers`); otherwise hugepage limits are dropped (containerd's
    /// `tolerate_missing_hugetlb_controller`).
    pub hugetlb_available: bool,
    /// `/proc/sys/kernel/cap_last_cap`: capabilities above it are unknown to the kernel and
    /// are left out of "all capabilities".
    pub cap_last_cap: u32,
    /// The capability bounding set of this process (`CapBnd` in `/proc/self/status`): only
    /// these can be granted to containers.
    pub bounding_caps: u64,
    /// The node's hostname, used for `HOSTNAME` of host-network pods without a hostname.
    pub node_hostname: String,
    /// How cgroups are managed (configured, as kubelet's must be): the form of a pod's
    /// cgroup parent and of `linux.cgroupsPath` ([`super::cgroups`]).
    pub cgroup_driver: super::CgroupDriver,
}

impl Default for HostFacts {
    fn default() -> Self {
        HostFacts {
            apparmor_enabled: false,
            min_oom_score_adj: 0,
            swap_accounting: false,
            hugetlb_available: false,
            cap_last_cap: 40,
            bounding_caps: u64::MAX,
            node_hostname: String::new(),
            cgroup_driver: super::CgroupDriver::Cgroupfs,
        }
    }
}
