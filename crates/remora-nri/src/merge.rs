//! Combining the plugins' replies to one NRI event into the one result the runtime acts on, with
//! NRI's field ownership rules (`pkg/adaptation/result.go` and `pkg/api/owners.go` in
//! containerd/nri v0.12.2).
//!
//! # Ownership
//!
//! Every field a plugin touches is claimed for that plugin, per container: an annotation key, an
//! environment variable name, a mount destination, a device path, an rlimit type, a CDI device
//! name, a sysctl key, a namespace type, a hugepage size, a unified cgroup key, each scalar of
//! the linux resources, and the whole of args, cgroups path, oom_score_adj, seccomp policy, I/O
//! priority, scheduler and memory policy. A second plugin that sets or removes a claimed field is
//! a [`MergeError::Conflict`] naming the field and both plugins. A plugin that removed a field
//! (see below) may set it again; nobody else may. OCI hooks have no owner: every plugin's hooks
//! are appended, in call order.
//!
//! # Removals
//!
//! A key, destination, path, name or namespace type prefixed with `-` (NRI's `MarkForRemoval`)
//! removes the field: from what an earlier reply of the same plugin set, and, carried in the
//! merged adjustment as the same `-` entry, from what the container already had. A reply's
//! removals are applied before its additions, so `-X` and `X` together replace `X`. Args
//! starting with an empty string replace the container's args (an empty replacement is merged as
//! `[""]`, the same marker). NRI allows no removal of rlimits or CDI devices: their keys are taken
//! as they are.
//!
//! # What is merged and what is refused
//!
//! Merged, on create: annotations, env, mounts, args, hooks, rlimits, CDI devices, and under
//! `linux`: devices, resources (memory limit, reservation, swap, kernel, kernel_tcp, swappiness,
//! disable_oom_killer, use_hierarchy; cpu shares, quota, period, realtime runtime and period,
//! cpus, mems; hugepage limits per page size; blockio class; rdt class; unified per key; pids
//! limit; device cgroup rules, appended without an owner as NRI does), cgroups path,
//! oom_score_adj, I/O priority, seccomp policy, namespaces, sysctl, scheduler, memory policy.
//!
//! Refused with [`MergeError::Unsupported`], never dropped: `linux.net_devices` and `linux.rdt`
//! in an adjustment. A field unknown to this build of NRI's protocol (a plugin built on a newer
//! NRI) is refused with [`MergeError::UnknownField`] for the same reason, when it is in a message
//! that holds adjustment kinds: the replies, `ContainerAdjustment`, `LinuxContainerAdjustment`,
//! `Hooks`, `LinuxResources`, `LinuxMemory`, `LinuxCPU`, `ContainerUpdate`,
//! `LinuxContainerUpdate`, `ContainerEviction`. Leaf messages (a `Mount`, a `Hook`) are passed on
//! as they are.
//!
//! # The merged adjustment
//!
//! For the code applying it to a spec: every list and map holds each key once, plugins in call
//! order, a reply's removals before its additions. An entry whose key starts with `-` removes
//! that key from the spec; any other entry replaces the spec's entry of the same key (env name,
//! mount destination, device path, namespace type, rlimit type, annotation or sysctl key) or is
//! added. Resources hold only the fields plugins set. Args, when not empty, replace the spec's,
//! `[""]` clearing them.
//!
//! # Updates and evictions
//!
//! Container updates from all plugins are merged per target container with the same ownership
//! rules (each container has its own owners); a target's `ignore_failure` stays set only if every
//! plugin asked for it. An update that conflicts and has `ignore_failure` set is dropped whole (not
//! half-applied, unlike result.go, which keeps the claims made before the failing one).
//!
//! An update a plugin sends from CreateContainer for the container being created is refused
//! ([`MergeError::UpdateDuringCreation`]), as result.go refuses it: the adjustment is how a
//! plugin changes that container.
//!
//! Deliberate differences from NRI v0.12.2:
//! - result.go applies an update's pids limit from the request instead of the update
//!   (`resources.GetPids()`) and writes sysctl removals into the annotations; here an update's
//!   pids limit is the plugin's, and a sysctl removal stays a sysctl removal.
//! - result.go lets a plugin remove an annotation or sysctl another plugin set without a
//!   conflict; here that is a conflict, as for every other field.

use std::collections::HashMap;
use std::fmt;

use protobuf::{Message, MessageField};

use crate::api;

/// A field of a container that at most one plugin may set, as named in a [`MergeError`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Field {
    /// An annotation, by key.
    Annotation(String),
    /// An environment variable, by name.
    Env(String),
    /// A mount, by destination.
    Mount(String),
    /// The process args, as a whole.
    Args,
    /// An rlimit, by type (`RLIMIT_NOFILE`).
    Rlimit(String),
    /// A linux device, by path.
    Device(String),
    /// A CDI device, by fully qualified name.
    CdiDevice(String),
    /// The cgroups path.
    CgroupsPath,
    /// The OOM score adjustment.
    OomScoreAdj,
    /// The I/O priority.
    IoPriority,
    /// The seccomp policy, as a whole.
    SeccompPolicy,
    /// A sysctl, by key.
    Sysctl(String),
    /// A namespace, by type (`network`).
    Namespace(String),
    /// The scheduling policy, as a whole.
    Scheduler,
    /// The NUMA memory policy, as a whole.
    MemoryPolicy,
    /// One scalar of the linux resources.
    Resource(Resource),
    /// A hugepage limit, by page size (`2MB`).
    HugepageLimit(String),
    /// A unified (cgroup v2) resource, by key (`memory.high`).
    Unified(String),
}

/// The scalar linux resources, each owned separately.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)] // the names are the resources' own
pub enum Resource {
    MemoryLimit,
    MemoryReservation,
    MemorySwap,
    MemoryKernel,
    MemoryKernelTcp,
    MemorySwappiness,
    MemoryDisableOomKiller,
    MemoryUseHierarchy,
    CpuShares,
    CpuQuota,
    CpuPeriod,
    CpuRealtimeRuntime,
    CpuRealtimePeriod,
    CpuSetCpus,
    CpuSetMems,
    BlockioClass,
    RdtClass,
    PidsLimit,
}

impl Resource {
    /// The resource as named in error messages.
    pub fn name(self) -> &'static str {
        match self {
            Resource::MemoryLimit => "memory limit",
            Resource::MemoryReservation => "memory reservation",
            Resource::MemorySwap => "memory swap limit",
            Resource::MemoryKernel => "kernel memory limit",
            Resource::MemoryKernelTcp => "kernel TCP memory limit",
            Resource::MemorySwappiness => "memory swappiness",
            Resource::MemoryDisableOomKiller => "disable_oom_killer",
            Resource::MemoryUseHierarchy => "memory use_hierarchy",
            Resource::CpuShares => "CPU shares",
            Resource::CpuQuota => "CPU quota",
            Resource::CpuPeriod => "CPU period",
            Resource::CpuRealtimeRuntime => "CPU realtime runtime",
            Resource::CpuRealtimePeriod => "CPU realtime period",
            Resource::CpuSetCpus => "cpuset CPUs",
            Resource::CpuSetMems => "cpuset memory nodes",
            Resource::BlockioClass => "block I/O class",
            Resource::RdtClass => "RDT class",
            Resource::PidsLimit => "pids limit",
        }
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Field::Annotation(k) => write!(f, "annotation {k:?}"),
            Field::Env(k) => write!(f, "environment variable {k:?}"),
            Field::Mount(k) => write!(f, "mount {k:?}"),
            Field::Args => f.write_str("args"),
            Field::Rlimit(k) => write!(f, "rlimit {k:?}"),
            Field::Device(k) => write!(f, "device {k:?}"),
            Field::CdiDevice(k) => write!(f, "CDI device {k:?}"),
            Field::CgroupsPath => f.write_str("cgroups path"),
            Field::OomScoreAdj => f.write_str("oom_score_adj"),
            Field::IoPriority => f.write_str("I/O priority"),
            Field::SeccompPolicy => f.write_str("seccomp policy"),
            Field::Sysctl(k) => write!(f, "sysctl {k:?}"),
            Field::Namespace(k) => write!(f, "namespace {k:?}"),
            Field::Scheduler => f.write_str("scheduler"),
            Field::MemoryPolicy => f.write_str("memory policy"),
            Field::Resource(r) => f.write_str(r.name()),
            Field::HugepageLimit(k) => write!(f, "hugepage limit {k:?}"),
            Field::Unified(k) => write!(f, "unified resource {k:?}"),
        }
    }
}

/// Why the plugins' replies cannot be merged; the event fails with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MergeError {
    /// Two plugins set (or removed) the same field of one container.
    #[error(
        "plugins {owner:?} and {plugin:?} both tried to set or remove {field} of container {container:?}"
    )]
    Conflict {
        /// The container whose field it is.
        container: String,
        /// The field.
        field: Field,
        /// The plugin that set or removed it first.
        owner: String,
        /// The plugin that tried after it.
        plugin: String,
    },
    /// A plugin asked for an adjustment this merge does not handle.
    #[error("plugin {plugin:?} asked for {what}, which remora does not support")]
    Unsupported {
        /// The plugin.
        plugin: String,
        /// The adjustment kind, named as in api.proto (`linux.net_devices`).
        what: &'static str,
    },
    /// A plugin sent a field unknown to NRI v0.12.2's protocol (from a newer NRI).
    #[error("plugin {plugin:?} sent field number {number} of {message}, unknown to remora's NRI protocol")]
    UnknownField {
        /// The plugin.
        plugin: String,
        /// The message holding the field (`ContainerAdjustment`).
        message: &'static str,
        /// The field's number.
        number: u32,
    },
    /// A plugin's CreateContainer reply asked to update the container being created, which
    /// its adjustment is for (NRI refuses this too).
    #[error("plugin {plugin:?} asked to update container {container:?} while it is being created; it must adjust it instead")]
    UpdateDuringCreation {
        /// The plugin.
        plugin: String,
        /// The container being created.
        container: String,
    },
    /// A plugin sent an entry without the key it is identified by.
    #[error("plugin {plugin:?} sent {what} with an empty key")]
    MissingKey {
        /// The plugin.
        plugin: String,
        /// The kind of entry (`mount`, `container update`).
        what: &'static str,
    },
}

/// The merged result of CreateContainer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CreateResult {
    /// The adjustment to apply to the new container's spec; `-` entries remove.
    pub adjust: api::ContainerAdjustment,
    /// Updates for other containers, one per container, in the order first asked for.
    pub updates: Vec<api::ContainerUpdate>,
    /// Evictions, with the plugin that asked for each, in call order.
    pub evictions: Vec<(String, api::ContainerEviction)>,
}

/// The merged result of UpdateContainer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UpdateResult {
    /// The resources to give the updated container: the requested ones with the plugins'
    /// updates for it applied.
    pub resources: api::LinuxResources,
    /// Updates for other containers, one per container, in the order first asked for.
    pub updates: Vec<api::ContainerUpdate>,
    /// Evictions, with the plugin that asked for each, in call order.
    pub evictions: Vec<(String, api::ContainerEviction)>,
}

/// Merges the plugins' CreateContainer replies (in call order) for `container`.
pub fn merge_create(
    container: &api::Container,
    replies: Vec<(String, api::CreateContainerResponse)>,
) -> Result<CreateResult, MergeError> {
    let mut merger = Merger::new(&container.id);
    let mut adjust = Adjust::default();
    let mut evictions = Vec::new();
    for (plugin, reply) in replies {
        check_known(&plugin, &reply, "CreateContainerResponse")?;
        if let Some(a) = reply.adjust.into_option() {
            adjust.apply(&mut merger.owners, &container.id, &plugin, a)?;
        }
        for u in reply.update {
            if u.container_id == container.id {
                return Err(MergeError::UpdateDuringCreation {
                    plugin,
                    container: container.id.clone(),
                });
            }
            merger.update(&plugin, u, None)?;
        }
        collect_evictions(&plugin, reply.evict, &mut evictions)?;
    }
    Ok(CreateResult {
        adjust: adjust.into_proto(),
        updates: merger.updates,
        evictions,
    })
}

/// Merges the plugins' UpdateContainer replies (in call order) for `container`, whose resources
/// the CRI call asks to change to `requested`.
pub fn merge_update(
    container: &api::Container,
    requested: api::LinuxResources,
    replies: Vec<(String, api::UpdateContainerResponse)>,
) -> Result<UpdateResult, MergeError> {
    let mut merger = Merger::new(&container.id);
    let mut resources = requested;
    let mut evictions = Vec::new();
    for (plugin, reply) in replies {
        check_known(&plugin, &reply, "UpdateContainerResponse")?;
        for u in reply.update {
            merger.update(&plugin, u, Some(&mut resources))?;
        }
        collect_evictions(&plugin, reply.evict, &mut evictions)?;
    }
    Ok(UpdateResult {
        resources,
        updates: merger.updates,
        evictions,
    })
}

/// Merges the plugins' StopContainer replies (in call order) into one update per container named.
pub fn merge_stop(
    replies: Vec<(String, api::StopContainerResponse)>,
) -> Result<Vec<api::ContainerUpdate>, MergeError> {
    // No target: a stopping container's resources are not changed, so an update naming it is
    // kept as an ordinary update, as in result.go.
    let mut merger = Merger::new("");
    for (plugin, reply) in replies {
        check_known(&plugin, &reply, "StopContainerResponse")?;
        for u in reply.update {
            merger.update(&plugin, u, None)?;
        }
    }
    Ok(merger.updates)
}

fn collect_evictions(
    plugin: &str,
    evict: Vec<api::ContainerEviction>,
    out: &mut Vec<(String, api::ContainerEviction)>,
) -> Result<(), MergeError> {
    for e in evict {
        check_known(plugin, &e, "ContainerEviction")?;
        if e.container_id.is_empty() {
            return Err(missing(plugin, "container eviction"));
        }
        out.push((plugin.to_owned(), e));
    }
    Ok(())
}

fn missing(plugin: &str, what: &'static str) -> MergeError {
    MergeError::MissingKey {
        plugin: plugin.to_owned(),
        what,
    }
}

/// Refuses a message carrying fields this protocol version does not know: merging it would drop
/// them silently.
fn check_known(plugin: &str, msg: &impl Message, message: &'static str) -> Result<(), MergeError> {
    match msg.special_fields().unknown_fields().iter().next() {
        Some((number, _)) => Err(MergeError::UnknownField {
            plugin: plugin.to_owned(),
            message,
            number,
        }),
        None => Ok(()),
    }
}

/// Who set or removed a field.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Claim {
    Set(String),
    Removed(String),
}

/// The owner of every touched field, per container.
#[derive(Debug, Clone, Default)]
struct Owners(HashMap<(String, Field), Claim>);

impl Owners {
    /// Claims `field` for `plugin`: allowed if nobody touched it or `plugin` removed it. A
    /// plugin setting one field twice conflicts with itself, as in NRI.
    fn set(&mut self, container: &str, field: Field, plugin: &str) -> Result<(), MergeError> {
        let key = (container.to_owned(), field);
        match self.0.get(&key) {
            None => {}
            Some(Claim::Removed(p)) if p == plugin => {}
            Some(Claim::Set(owner) | Claim::Removed(owner)) => {
                return Err(conflict(key, owner, plugin));
            }
        }
        self.0.insert(key, Claim::Set(plugin.to_owned()));
        Ok(())
    }

    /// Records that `plugin` removed `field`: allowed if nobody else touched it.
    fn remove(&mut self, container: &str, field: Field, plugin: &str) -> Result<(), MergeError> {
        let key = (container.to_owned(), field);
        match self.0.get(&key) {
            Some(Claim::Set(owner) | Claim::Removed(owner)) if owner != plugin => {
                return Err(conflict(key, owner, plugin));
            }
            _ => {}
        }
        self.0.insert(key, Claim::Removed(plugin.to_owned()));
        Ok(())
    }
}

fn conflict((container, field): (String, Field), owner: &str, plugin: &str) -> MergeError {
    MergeError::Conflict {
        container,
        field,
        owner: owner.to_owned(),
        plugin: plugin.to_owned(),
    }
}

/// Entries keyed by name, in the order first touched; `None` marks a removal.
#[derive(Debug)]
struct Keyed<T>(Vec<(String, Option<T>)>);

impl<T> Default for Keyed<T> {
    fn default() -> Self {
        Keyed(Vec::new())
    }
}

impl<T> Keyed<T> {
    fn put(&mut self, key: String, value: Option<T>) {
        match self.0.iter_mut().find(|(k, _)| *k == key) {
            Some(entry) => entry.1 = value,
            None => self.0.push((key, value)),
        }
    }
}

/// Merges one plugin's keyed entries: removals (`-key`) first, then additions, each claimed.
/// `key_of` gives an entry's raw key, `field` the owned field for a bare key.
#[allow(clippy::too_many_arguments)]
fn merge_keyed<T>(
    owners: &mut Owners,
    container: &str,
    plugin: &str,
    what: &'static str,
    entries: Vec<T>,
    key_of: impl Fn(&T) -> &str,
    field: impl Fn(String) -> Field,
    removable: bool,
    into: &mut Keyed<T>,
) -> Result<(), MergeError> {
    let (removals, additions): (Vec<T>, Vec<T>) = entries
        .into_iter()
        .partition(|e| removable && api::removal(key_of(e)).1);
    for e in removals {
        let key = api::removal(key_of(&e)).0.to_owned();
        if key.is_empty() {
            return Err(missing(plugin, what));
        }
        owners.remove(container, field(key.clone()), plugin)?;
        into.put(key, None);
    }
    for e in additions {
        let key = key_of(&e).to_owned();
        if key.is_empty() {
            return Err(missing(plugin, what));
        }
        owners.set(container, field(key.clone()), plugin)?;
        into.put(key, Some(e));
    }
    Ok(())
}

/// Turns merged keyed entries back into api.proto entries: removals as `-key` entries.
fn unkey<T>(keyed: Keyed<T>, removal: impl Fn(String) -> T) -> Vec<T> {
    keyed
        .0
        .into_iter()
        .map(|(key, value)| value.unwrap_or_else(|| removal(format!("-{key}"))))
        .collect()
}

/// Sets a simple (whole) field from an optional message.
fn claim_message<T: Clone>(
    owners: &mut Owners,
    container: &str,
    plugin: &str,
    field: Field,
    from: &MessageField<T>,
    to: &mut MessageField<T>,
) -> Result<(), MergeError> {
    if let Some(v) = from.as_ref() {
        owners.set(container, field, plugin)?;
        *to = MessageField::some(v.clone());
    }
    Ok(())
}

/// Merges one plugin's resources for `container` into `to`, claiming each field set.
fn merge_resources(
    owners: &mut Owners,
    container: &str,
    plugin: &str,
    from: &api::LinuxResources,
    to: &mut api::LinuxResources,
) -> Result<(), MergeError> {
    check_known(plugin, from, "LinuxResources")?;
    use Resource as R;
    let mut claim = |r: R| owners.set(container, Field::Resource(r), plugin);
    if let Some(m) = from.memory.as_ref() {
        check_known(plugin, m, "LinuxMemory")?;
        let t = to.memory.mut_or_insert_default();
        for (r, f, g) in [
            (R::MemoryLimit, &m.limit, &mut t.limit),
            (R::MemoryReservation, &m.reservation, &mut t.reservation),
            (R::MemorySwap, &m.swap, &mut t.swap),
            (R::MemoryKernel, &m.kernel, &mut t.kernel),
            (R::MemoryKernelTcp, &m.kernel_tcp, &mut t.kernel_tcp),
        ] {
            if f.is_some() {
                claim(r)?;
                *g = f.clone();
            }
        }
        if m.swappiness.is_some() {
            claim(R::MemorySwappiness)?;
            t.swappiness = m.swappiness.clone();
        }
        for (r, f, g) in [
            (
                R::MemoryDisableOomKiller,
                &m.disable_oom_killer,
                &mut t.disable_oom_killer,
            ),
            (
                R::MemoryUseHierarchy,
                &m.use_hierarchy,
                &mut t.use_hierarchy,
            ),
        ] {
            if f.is_some() {
                claim(r)?;
                *g = f.clone();
            }
        }
    }
    if let Some(c) = from.cpu.as_ref() {
        check_known(plugin, c, "LinuxCPU")?;
        let t = to.cpu.mut_or_insert_default();
        for (r, f, g) in [
            (R::CpuShares, &c.shares, &mut t.shares),
            (R::CpuPeriod, &c.period, &mut t.period),
            (
                R::CpuRealtimePeriod,
                &c.realtime_period,
                &mut t.realtime_period,
            ),
        ] {
            if f.is_some() {
                claim(r)?;
                *g = f.clone();
            }
        }
        for (r, f, g) in [
            (R::CpuQuota, &c.quota, &mut t.quota),
            (
                R::CpuRealtimeRuntime,
                &c.realtime_runtime,
                &mut t.realtime_runtime,
            ),
        ] {
            if f.is_some() {
                claim(r)?;
                *g = f.clone();
            }
        }
        // cpus and mems are plain strings: empty means "not set", as in result.go.
        for (r, f, g) in [
            (R::CpuSetCpus, &c.cpus, &mut t.cpus),
            (R::CpuSetMems, &c.mems, &mut t.mems),
        ] {
            if !f.is_empty() {
                claim(r)?;
                g.clone_from(f);
            }
        }
    }
    for (r, f, g) in [
        (R::BlockioClass, &from.blockio_class, &mut to.blockio_class),
        (R::RdtClass, &from.rdt_class, &mut to.rdt_class),
    ] {
        if f.is_some() {
            claim(r)?;
            *g = f.clone();
        }
    }
    if from.pids.is_some() {
        claim(R::PidsLimit)?;
        to.pids = from.pids.clone();
    }
    for l in &from.hugepage_limits {
        if l.page_size.is_empty() {
            return Err(missing(plugin, "hugepage limit"));
        }
        owners.set(container, Field::HugepageLimit(l.page_size.clone()), plugin)?;
        match to
            .hugepage_limits
            .iter_mut()
            .find(|h| h.page_size == l.page_size)
        {
            Some(h) => *h = l.clone(),
            None => to.hugepage_limits.push(l.clone()),
        }
    }
    let mut unified: Vec<_> = from.unified.iter().collect();
    unified.sort();
    for (k, v) in unified {
        if k.is_empty() {
            return Err(missing(plugin, "unified resource"));
        }
        owners.set(container, Field::Unified(k.clone()), plugin)?;
        to.unified.insert(k.clone(), v.clone());
    }
    // Device cgroup rules (NRI v1 emulation) have no owner in NRI: appended.
    to.devices.extend(from.devices.iter().cloned());
    Ok(())
}

/// The updates for containers other than the target, and the owners of every container's
/// fields.
struct Merger<'a> {
    target: &'a str,
    owners: Owners,
    updates: Vec<api::ContainerUpdate>,
}

impl<'a> Merger<'a> {
    fn new(target: &'a str) -> Self {
        Merger {
            target,
            owners: Owners::default(),
            updates: Vec::new(),
        }
    }

    /// Merges one update: into `target_resources` if it names the target, else into that
    /// container's update. All or nothing: on a conflict nothing of it is kept, and the
    /// conflict is an error unless the plugin set `ignore_failure`.
    fn update(
        &mut self,
        plugin: &str,
        u: api::ContainerUpdate,
        target_resources: Option<&mut api::LinuxResources>,
    ) -> Result<(), MergeError> {
        check_known(plugin, &u, "ContainerUpdate")?;
        if u.container_id.is_empty() {
            return Err(missing(plugin, "container update"));
        }
        // An update without resources changes nothing: no entry, where result.go would send an
        // empty one.
        let Some(linux) = u.linux.as_ref() else {
            return Ok(());
        };
        check_known(plugin, linux, "LinuxContainerUpdate")?;
        let Some(from) = linux.resources.as_ref() else {
            return Ok(());
        };
        let id = u.container_id.as_str();
        let mut owners = self.owners.clone();
        // `fresh`: the index of an entry this update created, to drop if the update is.
        let (to, fresh) = match target_resources {
            Some(t) if id == self.target => (t, None),
            _ => {
                let (i, fresh) = match self.updates.iter().position(|x| x.container_id == id) {
                    Some(i) => {
                        let x = &mut self.updates[i];
                        x.ignore_failure = x.ignore_failure && u.ignore_failure;
                        (i, None)
                    }
                    None => {
                        let mut x = api::ContainerUpdate::new();
                        x.container_id = id.to_owned();
                        x.ignore_failure = u.ignore_failure;
                        self.updates.push(x);
                        let i = self.updates.len() - 1;
                        (i, Some(i))
                    }
                };
                let resources = self.updates[i]
                    .linux
                    .mut_or_insert_default()
                    .resources
                    .mut_or_insert_default();
                (resources, fresh)
            }
        };
        let mut merged = to.clone();
        match merge_resources(&mut owners, id, plugin, from, &mut merged) {
            Ok(()) => {
                *to = merged;
                self.owners = owners;
                Ok(())
            }
            Err(_) if u.ignore_failure => {
                if let Some(i) = fresh {
                    self.updates.remove(i);
                }
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

/// A container adjustment being merged.
#[derive(Default)]
struct Adjust {
    annotations: Keyed<(String, String)>,
    env: Keyed<api::KeyValue>,
    mounts: Keyed<api::Mount>,
    args: Option<Vec<String>>,
    hooks: api::Hooks,
    rlimits: Keyed<api::POSIXRlimit>,
    cdi_devices: Keyed<api::CDIDevice>,
    devices: Keyed<api::LinuxDevice>,
    resources: api::LinuxResources,
    namespaces: Keyed<api::LinuxNamespace>,
    sysctl: Keyed<(String, String)>,
    linux: api::LinuxContainerAdjustment,
}

impl Adjust {
    fn apply(
        &mut self,
        owners: &mut Owners,
        id: &str,
        plugin: &str,
        a: api::ContainerAdjustment,
    ) -> Result<(), MergeError> {
        check_known(plugin, &a, "ContainerAdjustment")?;
        let mut annotations: Vec<_> = a.annotations.into_iter().collect();
        annotations.sort();
        merge_keyed(
            owners,
            id,
            plugin,
            "annotation",
            annotations,
            |(k, _)| k,
            Field::Annotation,
            true,
            &mut self.annotations,
        )?;
        merge_keyed(
            owners,
            id,
            plugin,
            "environment variable",
            a.env,
            |e| &e.key,
            Field::Env,
            true,
            &mut self.env,
        )?;
        merge_keyed(
            owners,
            id,
            plugin,
            "mount",
            a.mounts,
            |m| &m.destination,
            Field::Mount,
            true,
            &mut self.mounts,
        )?;
        if let Some((first, rest)) = a.args.split_first() {
            if first.is_empty() {
                owners.remove(id, Field::Args, plugin)?;
                self.args = Some(rest.to_vec());
            } else {
                self.args = Some(a.args.clone());
            }
            owners.set(id, Field::Args, plugin)?;
        }
        if let Some(h) = a.hooks.into_option() {
            check_known(plugin, &h, "Hooks")?;
            let to = &mut self.hooks;
            to.prestart.extend(h.prestart);
            to.create_runtime.extend(h.create_runtime);
            to.create_container.extend(h.create_container);
            to.start_container.extend(h.start_container);
            to.poststart.extend(h.poststart);
            to.poststop.extend(h.poststop);
        }
        merge_keyed(
            owners,
            id,
            plugin,
            "rlimit",
            a.rlimits,
            |r| &r.type_,
            Field::Rlimit,
            false,
            &mut self.rlimits,
        )?;
        merge_keyed(
            owners,
            id,
            plugin,
            "CDI device",
            a.CDI_devices,
            |d| &d.name,
            Field::CdiDevice,
            false,
            &mut self.cdi_devices,
        )?;
        if let Some(l) = a.linux.into_option() {
            self.apply_linux(owners, id, plugin, l)?;
        }
        Ok(())
    }

    fn apply_linux(
        &mut self,
        owners: &mut Owners,
        id: &str,
        plugin: &str,
        l: api::LinuxContainerAdjustment,
    ) -> Result<(), MergeError> {
        check_known(plugin, &l, "LinuxContainerAdjustment")?;
        let unsupported = |what| MergeError::Unsupported {
            plugin: plugin.to_owned(),
            what,
        };
        if !l.net_devices.is_empty() {
            return Err(unsupported("linux.net_devices"));
        }
        if l.rdt.is_some() {
            return Err(unsupported("linux.rdt"));
        }
        merge_keyed(
            owners,
            id,
            plugin,
            "device",
            l.devices,
            |d| &d.path,
            Field::Device,
            true,
            &mut self.devices,
        )?;
        if let Some(r) = l.resources.as_ref() {
            merge_resources(owners, id, plugin, r, &mut self.resources)?;
        }
        if !l.cgroups_path.is_empty() {
            owners.set(id, Field::CgroupsPath, plugin)?;
            self.linux.cgroups_path = l.cgroups_path;
        }
        let to = &mut self.linux;
        claim_message(
            owners,
            id,
            plugin,
            Field::OomScoreAdj,
            &l.oom_score_adj,
            &mut to.oom_score_adj,
        )?;
        claim_message(
            owners,
            id,
            plugin,
            Field::IoPriority,
            &l.io_priority,
            &mut to.io_priority,
        )?;
        claim_message(
            owners,
            id,
            plugin,
            Field::SeccompPolicy,
            &l.seccomp_policy,
            &mut to.seccomp_policy,
        )?;
        claim_message(
            owners,
            id,
            plugin,
            Field::Scheduler,
            &l.scheduler,
            &mut to.scheduler,
        )?;
        claim_message(
            owners,
            id,
            plugin,
            Field::MemoryPolicy,
            &l.memory_policy,
            &mut to.memory_policy,
        )?;
        merge_keyed(
            owners,
            id,
            plugin,
            "namespace",
            l.namespaces,
            |n| &n.type_,
            Field::Namespace,
            true,
            &mut self.namespaces,
        )?;
        let mut sysctl: Vec<_> = l.sysctl.into_iter().collect();
        sysctl.sort();
        merge_keyed(
            owners,
            id,
            plugin,
            "sysctl",
            sysctl,
            |(k, _)| k,
            Field::Sysctl,
            true,
            &mut self.sysctl,
        )?;
        Ok(())
    }

    fn into_proto(self) -> api::ContainerAdjustment {
        let mut a = api::ContainerAdjustment::new();
        a.annotations = unkey(self.annotations, |k| (k, String::new()))
            .into_iter()
            .collect();
        a.env = unkey(self.env, |key| api::KeyValue {
            key,
            ..Default::default()
        });
        a.mounts = unkey(self.mounts, |destination| api::Mount {
            destination,
            ..Default::default()
        });
        a.args = match self.args {
            Some(args) if args.is_empty() => vec![String::new()],
            Some(args) => args,
            None => Vec::new(),
        };
        if self.hooks != api::Hooks::new() {
            a.hooks = MessageField::some(self.hooks);
        }
        a.rlimits = unkey(self.rlimits, |type_| api::POSIXRlimit {
            type_,
            ..Default::default()
        });
        a.CDI_devices = unkey(self.cdi_devices, |name| api::CDIDevice {
            name,
            ..Default::default()
        });
        let mut linux = self.linux;
        linux.devices = unkey(self.devices, |path| api::LinuxDevice {
            path,
            ..Default::default()
        });
        if self.resources != api::LinuxResources::new() {
            linux.resources = MessageField::some(self.resources);
        }
        linux.namespaces = unkey(self.namespaces, |type_| api::LinuxNamespace {
            type_,
            ..Default::default()
        });
        linux.sysctl = unkey(self.sysctl, |k| (k, String::new()))
            .into_iter()
            .collect();
        if linux != api::LinuxContainerAdjustment::new() {
            a.linux = MessageField::some(linux);
        }
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(id: &str) -> api::Container {
        api::Container {
            id: id.to_owned(),
            ..Default::default()
        }
    }

    fn adjustment(f: impl FnOnce(&mut api::ContainerAdjustment)) -> api::CreateContainerResponse {
        let mut a = api::ContainerAdjustment::new();
        f(&mut a);
        api::CreateContainerResponse {
            adjust: MessageField::some(a),
            ..Default::default()
        }
    }

    fn reply(
        plugin: &str,
        r: api::CreateContainerResponse,
    ) -> (String, api::CreateContainerResponse) {
        (plugin.to_owned(), r)
    }

    fn kv(key: &str, value: &str) -> api::KeyValue {
        api::KeyValue {
            key: key.to_owned(),
            value: value.to_owned(),
            ..Default::default()
        }
    }

    fn mount(destination: &str, source: &str) -> api::Mount {
        api::Mount {
            destination: destination.to_owned(),
            source: source.to_owned(),
            type_: "bind".to_owned(),
            ..Default::default()
        }
    }

    fn resources(f: impl FnOnce(&mut api::LinuxResources)) -> api::LinuxResources {
        let mut r = api::LinuxResources::new();
        f(&mut r);
        r
    }

    fn cpu_shares(shares: u64) -> api::LinuxResources {
        resources(|r| {
            r.cpu.mut_or_insert_default().shares = MessageField::some(api::OptionalUInt64 {
                value: shares,
                ..Default::default()
            })
        })
    }

    fn memory_limit(limit: i64) -> api::LinuxResources {
        resources(|r| {
            r.memory.mut_or_insert_default().limit = MessageField::some(api::OptionalInt64 {
                value: limit,
                ..Default::default()
            })
        })
    }

    fn with_resources(r: api::LinuxResources) -> api::CreateContainerResponse {
        adjustment(|a| a.linux.mut_or_insert_default().resources = MessageField::some(r))
    }

    fn update(id: &str, r: api::LinuxResources, ignore_failure: bool) -> api::ContainerUpdate {
        let mut u = api::ContainerUpdate::new();
        u.container_id = id.to_owned();
        u.linux.mut_or_insert_default().resources = MessageField::some(r);
        u.ignore_failure = ignore_failure;
        u
    }

    fn updates(u: Vec<api::ContainerUpdate>) -> api::CreateContainerResponse {
        api::CreateContainerResponse {
            update: u,
            ..Default::default()
        }
    }

    fn conflict(field: Field, owner: &str, plugin: &str) -> MergeError {
        MergeError::Conflict {
            container: "c1".to_owned(),
            field,
            owner: owner.to_owned(),
            plugin: plugin.to_owned(),
        }
    }

    fn resources_of(r: &CreateResult) -> &api::LinuxResources {
        r.adjust
            .linux
            .resources
            .as_ref()
            .expect("resources adjusted")
    }

    #[test]
    fn empty_replies_give_an_empty_adjustment() {
        let r = merge_create(&container("c1"), vec![]).expect("merge");
        assert_eq!(r, CreateResult::default());
        let r = merge_create(
            &container("c1"),
            vec![
                reply("a", api::CreateContainerResponse::new()),
                reply("b", adjustment(|_| {})),
            ],
        )
        .expect("merge");
        assert_eq!(r.adjust, api::ContainerAdjustment::new());
        assert!(r.updates.is_empty() && r.evictions.is_empty());
    }

    #[test]
    fn annotations_from_two_plugins_both_land() {
        let r = merge_create(
            &container("c1"),
            vec![
                reply(
                    "a",
                    adjustment(|a| _ = a.annotations.insert("x".into(), "1".into())),
                ),
                reply(
                    "b",
                    adjustment(|a| _ = a.annotations.insert("y".into(), "2".into())),
                ),
            ],
        )
        .expect("merge");
        let want: HashMap<String, String> =
            [("x".into(), "1".into()), ("y".into(), "2".into())].into();
        assert_eq!(r.adjust.annotations, want);
    }

    #[test]
    fn one_annotation_from_two_plugins_is_a_conflict_naming_both() {
        let err = merge_create(
            &container("c1"),
            vec![
                reply(
                    "a",
                    adjustment(|a| _ = a.annotations.insert("x".into(), "1".into())),
                ),
                reply(
                    "b",
                    adjustment(|a| _ = a.annotations.insert("x".into(), "2".into())),
                ),
            ],
        )
        .expect_err("conflict");
        assert_eq!(err, conflict(Field::Annotation("x".into()), "a", "b"));
        let msg = err.to_string();
        assert!(
            msg.contains("\"a\"") && msg.contains("\"b\"") && msg.contains("annotation \"x\""),
            "{msg}"
        );
    }

    #[test]
    fn removals_of_what_the_container_had_are_carried_as_markers() {
        let mut c = container("c1");
        c.annotations.insert("old".into(), "v".into());
        c.env.push("OLD=v".into());
        c.mounts.push(mount("/old", "/src"));
        let r = merge_create(
            &c,
            vec![reply(
                "a",
                adjustment(|a| {
                    a.annotations.insert("-old".into(), String::new());
                    a.env.push(kv("-OLD", ""));
                    a.mounts.push(mount("-/old", ""));
                }),
            )],
        )
        .expect("merge");
        assert_eq!(
            r.adjust.annotations,
            [("-old".to_owned(), String::new())].into()
        );
        assert_eq!(r.adjust.env, vec![kv("-OLD", "")]);
        assert_eq!(r.adjust.mounts.len(), 1);
        assert_eq!(r.adjust.mounts[0].destination, "-/old");
    }

    #[test]
    fn a_removal_clears_an_earlier_setting_and_blocks_other_plugins() {
        // Plugin a sets X, then (in a later reply of its own, as after a restart) removes and
        // re-adds it; b may not touch it.
        let r = merge_create(
            &container("c1"),
            vec![reply(
                "a",
                adjustment(|a| {
                    a.env.push(kv("X", "2"));
                    a.env.push(kv("-X", ""));
                }),
            )],
        )
        .expect("merge");
        assert_eq!(
            r.adjust.env,
            vec![kv("X", "2")],
            "removal first, then the new value"
        );
        let err = merge_create(
            &container("c1"),
            vec![
                reply("a", adjustment(|a| a.env.push(kv("-X", "")))),
                reply("b", adjustment(|a| a.env.push(kv("X", "3")))),
            ],
        )
        .expect_err("b re-adds what a removed");
        assert_eq!(err, conflict(Field::Env("X".into()), "a", "b"));
        let err = merge_create(
            &container("c1"),
            vec![
                reply("a", adjustment(|a| a.mounts.push(mount("/d", "/s")))),
                reply("b", adjustment(|a| a.mounts.push(mount("-/d", "")))),
            ],
        )
        .expect_err("b removes what a set");
        assert_eq!(err, conflict(Field::Mount("/d".into()), "a", "b"));
    }

    #[test]
    fn env_keeps_order_and_replaces_by_name() {
        let r = merge_create(
            &container("c1"),
            vec![
                reply(
                    "a",
                    adjustment(|a| a.env.extend([kv("A", "1"), kv("B", "1")])),
                ),
                reply("b", adjustment(|a| a.env.extend([kv("C", "1")]))),
                reply(
                    "c",
                    adjustment(|a| a.env.extend([kv("D", "1"), kv("-E", "")])),
                ),
            ],
        )
        .expect("merge");
        let keys: Vec<_> = r.adjust.env.iter().map(|e| e.key.as_str()).collect();
        // Plugins in call order; within a reply, removals before additions.
        assert_eq!(keys, ["A", "B", "C", "-E", "D"]);
        // A removal and a re-addition of one name by one plugin give one entry, the new value,
        // which replaces the container's variable of that name.
        let mut c = container("c1");
        c.env.push("A=0".into());
        let r = merge_create(
            &c,
            vec![reply(
                "a",
                adjustment(|a| a.env.extend([kv("B", "1"), kv("A", "2"), kv("-A", "")])),
            )],
        )
        .expect("merge");
        assert_eq!(r.adjust.env, vec![kv("A", "2"), kv("B", "1")]);
        // The same name twice from one plugin is a conflict, as in NRI.
        let err = merge_create(
            &c,
            vec![reply(
                "a",
                adjustment(|a| a.env.extend([kv("A", "1"), kv("A", "2")])),
            )],
        )
        .expect_err("conflict");
        assert_eq!(err, conflict(Field::Env("A".into()), "a", "a"));
    }

    #[test]
    fn mounts_are_replaced_by_destination() {
        let r = merge_create(
            &container("c1"),
            vec![
                reply(
                    "a",
                    adjustment(|a| a.mounts.extend([mount("/x", "/1"), mount("/y", "/1")])),
                ),
                reply("b", adjustment(|a| a.mounts.extend([mount("/z", "/2")]))),
                reply(
                    "a2",
                    adjustment(|a| a.mounts.extend([mount("-/w", ""), mount("/w", "/3")])),
                ),
            ],
        )
        .expect("merge");
        let got: Vec<_> = r
            .adjust
            .mounts
            .iter()
            .map(|m| (m.destination.as_str(), m.source.as_str()))
            .collect();
        assert_eq!(
            got,
            [("/x", "/1"), ("/y", "/1"), ("/z", "/2"), ("/w", "/3")]
        );
        let err = merge_create(
            &container("c1"),
            vec![
                reply("a", adjustment(|a| a.mounts.push(mount("/x", "/1")))),
                reply("b", adjustment(|a| a.mounts.push(mount("/x", "/2")))),
            ],
        )
        .expect_err("conflict");
        assert_eq!(err, conflict(Field::Mount("/x".into()), "a", "b"));
    }

    #[test]
    fn args_are_owned_whole() {
        let r = merge_create(
            &container("c1"),
            vec![reply(
                "a",
                adjustment(|a| a.args = vec!["".into(), "sh".into()]),
            )],
        )
        .expect("merge");
        assert_eq!(r.adjust.args, ["sh"]);
        let err = merge_create(
            &container("c1"),
            vec![
                reply("a", adjustment(|a| a.args = vec!["sh".into()])),
                reply("b", adjustment(|a| a.args = vec!["".into(), "bash".into()])),
            ],
        )
        .expect_err("conflict");
        assert_eq!(err, conflict(Field::Args, "a", "b"));
    }

    #[test]
    fn resource_fields_from_two_plugins_are_merged() {
        let r = merge_create(
            &container("c1"),
            vec![
                reply("a", with_resources(cpu_shares(512))),
                reply("b", with_resources(memory_limit(1 << 30))),
            ],
        )
        .expect("merge");
        let res = resources_of(&r);
        assert_eq!(res.cpu.shares.value, 512);
        assert_eq!(res.memory.limit.value, 1 << 30);
        assert!(res.memory.swap.is_none() && res.cpu.quota.is_none());
    }

    #[test]
    fn one_resource_field_from_two_plugins_is_a_conflict() {
        let err = merge_create(
            &container("c1"),
            vec![
                reply("a", with_resources(memory_limit(1))),
                reply("b", with_resources(cpu_shares(2))),
                reply("c", with_resources(memory_limit(3))),
            ],
        )
        .expect_err("conflict");
        assert_eq!(
            err,
            conflict(Field::Resource(Resource::MemoryLimit), "a", "c")
        );
        assert!(err.to_string().contains("memory limit"), "{err}");
        let hugepages = |size: &str| {
            resources(|r| {
                r.hugepage_limits.push(api::HugepageLimit {
                    page_size: size.to_owned(),
                    limit: 1,
                    ..Default::default()
                })
            })
        };
        let err = merge_create(
            &container("c1"),
            vec![
                reply("a", with_resources(hugepages("2MB"))),
                reply("b", with_resources(hugepages("1GB"))),
                reply("c", with_resources(hugepages("2MB"))),
            ],
        )
        .expect_err("conflict");
        assert_eq!(err, conflict(Field::HugepageLimit("2MB".into()), "a", "c"));
    }

    #[test]
    fn an_update_of_the_created_container_is_refused() {
        let err = merge_create(
            &container("c1"),
            vec![
                reply("a", with_resources(memory_limit(100))),
                reply("b", updates(vec![update("c1", cpu_shares(7), false)])),
            ],
        )
        .expect_err("an update of the container being created");
        assert_eq!(
            err,
            MergeError::UpdateDuringCreation {
                plugin: "b".into(),
                container: "c1".into()
            }
        );
    }

    #[test]
    fn updates_of_other_containers_are_collected_with_conflicts_per_container() {
        let r = merge_create(
            &container("c1"),
            vec![
                reply(
                    "a",
                    updates(vec![
                        update("c2", cpu_shares(1), true),
                        update("c3", cpu_shares(1), false),
                    ]),
                ),
                // Same field, other containers: no conflict with c2's.
                reply(
                    "b",
                    updates(vec![
                        update("c3", memory_limit(5), true),
                        update("c2", memory_limit(6), true),
                    ]),
                ),
            ],
        )
        .expect("merge");
        let got: Vec<_> = r
            .updates
            .iter()
            .map(|u| {
                let res = &u.linux.resources;
                (
                    u.container_id.as_str(),
                    res.cpu.shares.value,
                    res.memory.limit.value,
                    u.ignore_failure,
                )
            })
            .collect();
        assert_eq!(got, [("c2", 1, 6, true), ("c3", 1, 5, false)]);

        let replies = || {
            vec![
                reply("a", updates(vec![update("c2", cpu_shares(1), false)])),
                reply("b", updates(vec![update("c2", cpu_shares(2), false)])),
            ]
        };
        let err = merge_create(&container("c1"), replies()).expect_err("conflict");
        assert_eq!(
            err,
            MergeError::Conflict {
                container: "c2".into(),
                field: Field::Resource(Resource::CpuShares),
                owner: "a".into(),
                plugin: "b".into(),
            }
        );
        // With ignore_failure the conflicting update is dropped whole, the rest kept.
        let r = merge_create(
            &container("c1"),
            vec![
                reply("a", updates(vec![update("c2", cpu_shares(1), false)])),
                reply(
                    "b",
                    updates(vec![
                        update("c2", cpu_shares(2), true),
                        update("c4", cpu_shares(3), false),
                    ]),
                ),
                reply("c", updates(vec![update("c5", cpu_shares(4), true)])),
                reply("d", updates(vec![update("c5", cpu_shares(5), true)])),
            ],
        )
        .expect("ignored failure");
        let got: Vec<_> = r
            .updates
            .iter()
            .map(|u| (u.container_id.as_str(), u.linux.resources.cpu.shares.value))
            .collect();
        assert_eq!(got, [("c2", 1), ("c4", 3), ("c5", 4)]);
        // An ignored update that failed on its own leaves no empty entry behind.
        let twice = resources(|r| {
            let l = api::HugepageLimit {
                page_size: "2MB".into(),
                limit: 1,
                ..Default::default()
            };
            r.hugepage_limits.extend([l.clone(), l]);
        });
        let r = merge_create(
            &container("c1"),
            vec![reply("a", updates(vec![update("c6", twice, true)]))],
        )
        .expect("ignored failure");
        assert!(r.updates.is_empty(), "{:?}", r.updates);
    }

    #[test]
    fn evictions_are_collected() {
        let evict = |id: &str, reason: &str| api::ContainerEviction {
            container_id: id.to_owned(),
            reason: reason.to_owned(),
            ..Default::default()
        };
        let r = merge_create(
            &container("c1"),
            vec![
                reply(
                    "a",
                    api::CreateContainerResponse {
                        evict: vec![evict("c2", "oom")],
                        ..Default::default()
                    },
                ),
                reply(
                    "b",
                    api::CreateContainerResponse {
                        evict: vec![evict("c3", "cpu")],
                        ..Default::default()
                    },
                ),
            ],
        )
        .expect("merge");
        assert_eq!(
            r.evictions,
            vec![
                ("a".to_owned(), evict("c2", "oom")),
                ("b".to_owned(), evict("c3", "cpu"))
            ]
        );
        let u = merge_update(
            &container("c1"),
            api::LinuxResources::new(),
            vec![(
                "a".into(),
                api::UpdateContainerResponse {
                    evict: vec![evict("c9", "x")],
                    ..Default::default()
                },
            )],
        )
        .expect("merge");
        assert_eq!(u.evictions, vec![("a".to_owned(), evict("c9", "x"))]);
        let err = merge_create(
            &container("c1"),
            vec![reply(
                "a",
                api::CreateContainerResponse {
                    evict: vec![evict("", "x")],
                    ..Default::default()
                },
            )],
        )
        .expect_err("no id");
        assert_eq!(
            err,
            MergeError::MissingKey {
                plugin: "a".into(),
                what: "container eviction"
            }
        );
    }

    #[test]
    fn an_unsupported_kind_is_refused_naming_it() {
        let err = merge_create(
            &container("c1"),
            vec![
                reply("a", with_resources(cpu_shares(1))),
                reply(
                    "b",
                    adjustment(|a| {
                        a.linux
                            .mut_or_insert_default()
                            .net_devices
                            .insert("eth1".into(), api::LinuxNetDevice::new());
                    }),
                ),
            ],
        )
        .expect_err("refused");
        assert_eq!(
            err,
            MergeError::Unsupported {
                plugin: "b".into(),
                what: "linux.net_devices"
            }
        );
        let err = merge_create(
            &container("c1"),
            vec![reply(
                "a",
                adjustment(|a| {
                    a.linux.mut_or_insert_default().rdt = MessageField::some(api::LinuxRdt::new())
                }),
            )],
        )
        .expect_err("refused");
        assert_eq!(
            err,
            MergeError::Unsupported {
                plugin: "a".into(),
                what: "linux.rdt"
            }
        );
    }

    #[test]
    fn a_field_unknown_to_this_protocol_is_refused() {
        let mut a = api::ContainerAdjustment::new();
        a.mut_unknown_fields().add_varint(99, 1);
        let r = api::CreateContainerResponse {
            adjust: MessageField::some(a),
            ..Default::default()
        };
        let err = merge_create(&container("c1"), vec![reply("a", r)]).expect_err("refused");
        assert_eq!(
            err,
            MergeError::UnknownField {
                plugin: "a".into(),
                message: "ContainerAdjustment",
                number: 99
            }
        );
    }

    #[test]
    fn linux_fields_have_owners() {
        let oom = |v: i64| {
            adjustment(|a| {
                a.linux.mut_or_insert_default().oom_score_adj =
                    MessageField::some(api::OptionalInt {
                        value: v,
                        ..Default::default()
                    })
            })
        };
        let err = merge_create(
            &container("c1"),
            vec![reply("a", oom(1)), reply("b", oom(2))],
        )
        .expect_err("conflict");
        assert_eq!(err, conflict(Field::OomScoreAdj, "a", "b"));
        let sysctl = |k: &str| {
            adjustment(|a| {
                _ = a
                    .linux
                    .mut_or_insert_default()
                    .sysctl
                    .insert(k.into(), "1".into())
            })
        };
        let err = merge_create(
            &container("c1"),
            vec![reply("a", sysctl("net.x")), reply("b", sysctl("-net.x"))],
        )
        .expect_err("conflict");
        assert_eq!(err, conflict(Field::Sysctl("net.x".into()), "a", "b"));
        let r = merge_create(
            &container("c1"),
            vec![reply("a", sysctl("net.x")), reply("b", sysctl("-net.y"))],
        )
        .expect("merge");
        let want: HashMap<String, String> = [
            ("net.x".into(), "1".into()),
            ("-net.y".into(), String::new()),
        ]
        .into();
        assert_eq!(r.adjust.linux.sysctl, want);
        assert!(
            r.adjust.annotations.is_empty(),
            "a sysctl removal is not an annotation"
        );
        let rlimit = |t: &str| {
            adjustment(|a| {
                a.rlimits.push(api::POSIXRlimit {
                    type_: t.into(),
                    hard: 1,
                    soft: 1,
                    ..Default::default()
                })
            })
        };
        let err = merge_create(
            &container("c1"),
            vec![
                reply("a", rlimit("RLIMIT_NOFILE")),
                reply("b", rlimit("RLIMIT_NOFILE")),
            ],
        )
        .expect_err("conflict");
        assert_eq!(
            err,
            conflict(Field::Rlimit("RLIMIT_NOFILE".into()), "a", "b")
        );
    }

    #[test]
    fn hooks_are_appended_without_owner() {
        let hook = |path: &str| {
            adjustment(|a| {
                a.hooks.mut_or_insert_default().prestart.push(api::Hook {
                    path: path.into(),
                    ..Default::default()
                })
            })
        };
        let r = merge_create(
            &container("c1"),
            vec![reply("a", hook("/a")), reply("b", hook("/b"))],
        )
        .expect("merge");
        let paths: Vec<_> = r
            .adjust
            .hooks
            .prestart
            .iter()
            .map(|h| h.path.as_str())
            .collect();
        assert_eq!(paths, ["/a", "/b"]);
    }

    #[test]
    fn update_merges_plugins_over_the_requested_resources() {
        let requested = resources(|r| {
            r.cpu.mut_or_insert_default().shares = MessageField::some(api::OptionalUInt64 {
                value: 2,
                ..Default::default()
            });
            r.memory.mut_or_insert_default().limit = MessageField::some(api::OptionalInt64 {
                value: 10,
                ..Default::default()
            });
        });
        let pids = resources(|r| {
            r.pids = MessageField::some(api::LinuxPids {
                limit: 64,
                ..Default::default()
            })
        });
        let r = merge_update(
            &container("c1"),
            requested,
            vec![
                (
                    "a".into(),
                    api::UpdateContainerResponse {
                        update: vec![update("c1", memory_limit(20), false)],
                        ..Default::default()
                    },
                ),
                (
                    "b".into(),
                    api::UpdateContainerResponse {
                        update: vec![
                            update("c1", pids, false),
                            update("c2", cpu_shares(3), false),
                        ],
                        ..Default::default()
                    },
                ),
            ],
        )
        .expect("merge");
        assert_eq!(r.resources.cpu.shares.value, 2, "requested, untouched");
        assert_eq!(r.resources.memory.limit.value, 20, "plugin a's");
        assert_eq!(r.resources.pids.limit, 64, "plugin b's own pids limit");
        assert_eq!(r.updates.len(), 1);
        assert_eq!(r.updates[0].container_id, "c2");
        let err = merge_update(
            &container("c1"),
            api::LinuxResources::new(),
            vec![
                (
                    "a".into(),
                    api::UpdateContainerResponse {
                        update: vec![update("c1", memory_limit(20), false)],
                        ..Default::default()
                    },
                ),
                (
                    "b".into(),
                    api::UpdateContainerResponse {
                        update: vec![update("c1", memory_limit(30), false)],
                        ..Default::default()
                    },
                ),
            ],
        )
        .expect_err("conflict");
        assert_eq!(
            err,
            conflict(Field::Resource(Resource::MemoryLimit), "a", "b")
        );
    }

    #[test]
    fn stop_collects_updates() {
        let u = merge_stop(vec![
            (
                "a".into(),
                api::StopContainerResponse {
                    update: vec![update("c2", cpu_shares(1), false)],
                    ..Default::default()
                },
            ),
            (
                "b".into(),
                api::StopContainerResponse {
                    update: vec![update("c2", memory_limit(2), false)],
                    ..Default::default()
                },
            ),
        ])
        .expect("merge");
        assert_eq!(u.len(), 1);
        assert_eq!(
            (
                u[0].linux.resources.cpu.shares.value,
                u[0].linux.resources.memory.limit.value
            ),
            (1, 2)
        );
        let err = merge_stop(vec![(
            "a".into(),
            api::StopContainerResponse {
                update: vec![update("", cpu_shares(1), false)],
                ..Default::default()
            },
        )])
        .expect_err("no id");
        assert_eq!(
            err,
            MergeError::MissingKey {
                plugin: "a".into(),
                what: "container update"
            }
        );
    }
}
