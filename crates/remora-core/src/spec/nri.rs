//! Applying an NRI plugin's container adjustment to the container's OCI spec.
//!
//! When NRI plugins answer CreateContainer, their adjustments are merged into one
//! [`api::ContainerAdjustment`] (NRI's `pkg/adaptation/result.go`), which the runtime applies
//! to the spec it generated before creating the container. [`apply_adjustment`] does that,
//! with NRI's meaning of each field (containerd and CRI-O apply it through NRI's
//! `pkg/runtime-tools/generate`):
//!
//! - a key, destination, path or namespace type prefixed with `-` removes that entry;
//! - maps and lists are merged entry by entry: annotations, env and sysctls by name, mounts by
//!   destination, devices by path, namespaces by type, rlimits by type, hugepage limits by page
//!   size; hooks are appended to their stage; `args`, when not empty, replace the whole command;
//! - an `Optional*` wrapper that is present means "set this value", so resources change only
//!   in the fields the adjustment carries.
//!
//! Where remora departs from `generate.go`, and why:
//!
//! - **Nothing is ignored.** What remora does not apply (CDI devices, the seccomp policy, I/O
//!   priority, the scheduler, RDT, net devices, the memory policy, block-I/O and RDT classes,
//!   NRI v1 device rules, cgroup-v1-only memory knobs, fields newer than NRI v0.12.2) is
//!   refused with [`AdjustError::Unsupported`] naming it. A plugin that asked for it would
//!   otherwise believe the container has it.
//! - **Values are checked**, as remora checks a CRI request: a plugin's bug should fail the
//!   create with a message naming the field, not produce a spec runc refuses at start (or
//!   worse, accepts). Paths must be absolute and clean, names well formed, numbers in the
//!   kernel's ranges, sysctls namespaced ([`super::sysctl`]'s rules, against the adjusted
//!   spec's namespaces).
//! - **Mount propagation options** (`rshared`, `rslave`, …) are refused: applying them needs
//!   the host-side check that the source's propagation allows it (`ensurePropagation`), which
//!   is I/O and not done here.
//! - **Rlimits are set by type** (NRI appends, leaving duplicates whose winner is runc's
//!   choice).
//! - **Removing or replacing a device drops the allow rule** NRI added for it, unless another
//!   device node still uses the same type and numbers (NRI leaves it: the cgroup would go on
//!   allowing a device that is no longer there).
//! - **remora's own annotations** (the `io.kubernetes.cri.*` keys naming the pod and container,
//!   and the pod-holder marker its shim reads) cannot be changed: they say which pod a spec
//!   belongs to.
//! - **All or nothing:** on any error the spec is left as it was.
//!
//! Mount order: remora puts the default mounts first, then bind mounts by depth
//! ([`super::mounts`]); what matters is that a mount comes after any mount on a parent of its
//! destination, or it would be hidden. A replaced mount keeps its place; a new one goes just
//! before the first mount below it, or last. The spec's existing order is kept (NRI re-sorts
//! every mount by depth).

use std::path::{Path, PathBuf};

use oci_spec::runtime::{
    Hook, Hooks, LinuxCpu, LinuxDevice, LinuxDeviceCgroup, LinuxDeviceType, LinuxHugepageLimit,
    LinuxMemory, LinuxNamespace, LinuxNamespaceType, LinuxPids, LinuxResources, Mount,
    PosixRlimitBuilder, PosixRlimitType, Spec,
};
use remora_nri::api;
use remora_nri::api::removal;
use thiserror::Error;

use super::{annotations, mounts, sysctl, SpecError};

/// Why an NRI adjustment cannot be applied. All are the plugins' errors: the container is not
/// created.
#[derive(Debug, Error)]
pub enum AdjustError {
    /// The adjustment sets something remora does not apply.
    #[error("the NRI adjustment sets {field}, which remora does not apply")]
    Unsupported {
        /// The adjustment field, as NRI's api.proto names it.
        field: &'static str,
    },
    /// A value that is malformed or out of range.
    #[error("invalid NRI adjustment {field} {value:?}: {reason}")]
    Invalid {
        /// The adjustment field, with its index or key (`mounts[1].destination`).
        field: String,
        /// The value as given.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The adjustment changes a part of the spec the spec does not have.
    #[error("the NRI adjustment sets {field}, but the spec has no {section} section")]
    NoSection {
        /// The adjustment field.
        field: &'static str,
        /// The missing spec section.
        section: &'static str,
    },
}

fn invalid(field: impl Into<String>, value: impl ToString, reason: &'static str) -> AdjustError {
    AdjustError::Invalid {
        field: field.into(),
        value: value.to_string(),
        reason,
    }
}

/// Applies one merged NRI adjustment to a container's spec. Pure; on error `spec` is unchanged.
pub fn apply_adjustment(
    spec: &mut Spec,
    adjust: &api::ContainerAdjustment,
) -> Result<(), AdjustError> {
    refuse_unsupported(adjust)?;
    let mut out = spec.clone();
    annotations_(&mut out, adjust)?;
    env(&mut out, &adjust.env)?;
    args(&mut out, &adjust.args)?;
    if let Some(h) = adjust.hooks.as_ref() {
        hooks(&mut out, h)?;
    }
    mounts_(&mut out, &adjust.mounts)?;
    rlimits(&mut out, &adjust.rlimits)?;
    if let Some(l) = adjust.linux.as_ref() {
        linux(&mut out, l)?;
    }
    *spec = out;
    Ok(())
}

/// Whether a message carries fields this api.proto does not know.
macro_rules! unknown {
    ($m:expr) => {
        $m.special_fields.unknown_fields().iter().next().is_some()
    };
}

/// Refuses every field remora does not apply, before anything changes.
fn refuse_unsupported(a: &api::ContainerAdjustment) -> Result<(), AdjustError> {
    let refuse = |field| Err(AdjustError::Unsupported { field });
    // A plugin built against a newer NRI may send fields this api.proto does not know.
    if unknown!(a) {
        return refuse("fields unknown to NRI v0.12.2 (in ContainerAdjustment)");
    }
    if !a.CDI_devices.is_empty() {
        return refuse("CDI_devices");
    }
    if a.hooks.as_ref().is_some_and(|h| unknown!(h)) {
        return refuse("fields unknown to NRI v0.12.2 (in hooks)");
    }
    let Some(l) = a.linux.as_ref() else {
        return Ok(());
    };
    if unknown!(l) {
        return refuse("fields unknown to NRI v0.12.2 (in linux)");
    }
    for (set, field) in [
        (l.io_priority.is_some(), "linux.io_priority"),
        (l.seccomp_policy.is_some(), "linux.seccomp_policy"),
        (!l.net_devices.is_empty(), "linux.net_devices"),
        (l.scheduler.is_some(), "linux.scheduler"),
        (l.rdt.is_some(), "linux.rdt"),
        (l.memory_policy.is_some(), "linux.memory_policy"),
    ] {
        if set {
            return refuse(field);
        }
    }
    let Some(r) = l.resources.as_ref() else {
        return Ok(());
    };
    if unknown!(r) {
        return refuse("fields unknown to NRI v0.12.2 (in linux.resources)");
    }
    for (set, field) in [
        (r.blockio_class.is_some(), "linux.resources.blockio_class"),
        (r.rdt_class.is_some(), "linux.resources.rdt_class"),
        (!r.devices.is_empty(), "linux.resources.devices"),
    ] {
        if set {
            return refuse(field);
        }
    }
    if let Some(m) = r.memory.as_ref() {
        if unknown!(m) {
            return refuse("fields unknown to NRI v0.12.2 (in linux.resources.memory)");
        }
        // cgroup v1 only, and deprecated there (kernel memory accounting is gone in 5.x).
        for (set, field) in [
            (m.kernel.is_some(), "linux.resources.memory.kernel"),
            (m.kernel_tcp.is_some(), "linux.resources.memory.kernel_tcp"),
            (
                m.use_hierarchy.is_some(),
                "linux.resources.memory.use_hierarchy",
            ),
        ] {
            if set {
                return refuse(field);
            }
        }
    }
    if r.cpu.as_ref().is_some_and(|c| unknown!(c)) {
        return refuse("fields unknown to NRI v0.12.2 (in linux.resources.cpu)");
    }
    Ok(())
}

/// An absolute path that is already clean (no `.`, `..`, `//` or trailing `/`), not `/`.
fn clean_path(field: String, value: &str) -> Result<PathBuf, AdjustError> {
    match mounts::clean_destination(value) {
        Ok(clean) if clean == value => Ok(PathBuf::from(clean)),
        Ok(_) => Err(invalid(
            field,
            value,
            "it is not a clean path (`.`, `..`, `//` or a trailing `/`)",
        )),
        Err(SpecError::InvalidMountDestination { reason, .. }) => {
            Err(invalid(field, value, reason))
        }
        Err(_) => Err(invalid(field, value, "it is not a clean absolute path")),
    }
}

fn no_nul(field: impl Into<String>, value: &str) -> Result<(), AdjustError> {
    if value.contains('\0') {
        return Err(invalid(field, value, "it contains a NUL byte"));
    }
    Ok(())
}

/// The annotations remora sets to say which pod and container a spec is.
const RESERVED_ANNOTATIONS: &[&str] = &[
    annotations::CONTAINER_TYPE,
    annotations::SANDBOX_ID,
    annotations::SANDBOX_NAME,
    annotations::SANDBOX_NAMESPACE,
    annotations::SANDBOX_UID,
    annotations::SANDBOX_LOG_DIR,
    annotations::CONTAINER_NAME,
    annotations::IMAGE_NAME,
    annotations::POD_HOLDER,
];

fn annotations_(spec: &mut Spec, a: &api::ContainerAdjustment) -> Result<(), AdjustError> {
    if a.annotations.is_empty() {
        return Ok(());
    }
    // Sorted, so that an error names the same key whatever the map's order.
    let mut entries: Vec<_> = a.annotations.iter().collect();
    entries.sort();
    let map = spec.annotations_mut().get_or_insert_with(Default::default);
    for (key, value) in entries {
        let (name, remove) = removal(key);
        let field = format!("annotations[{key:?}]");
        if name.is_empty() {
            return Err(invalid(field, key, "an annotation key must not be empty"));
        }
        if RESERVED_ANNOTATIONS.contains(&name) {
            return Err(invalid(
                field,
                key,
                "remora sets this annotation to name the pod and container",
            ));
        }
        no_nul(field, value)?;
        if remove {
            map.remove(name);
        } else {
            map.insert(name.to_owned(), value.clone());
        }
    }
    Ok(())
}

fn env(spec: &mut Spec, entries: &[api::KeyValue]) -> Result<(), AdjustError> {
    if entries.is_empty() {
        return Ok(());
    }
    let process = spec.process_mut().as_mut().ok_or(AdjustError::NoSection {
        field: "env",
        section: "process",
    })?;
    let env = process.env_mut().get_or_insert_with(Vec::new);
    for (i, kv) in entries.iter().enumerate() {
        let (name, remove) = removal(&kv.key);
        let field = format!("env[{i}].key");
        if name.is_empty() {
            return Err(invalid(
                field,
                &kv.key,
                "an environment name must not be empty",
            ));
        }
        if name.contains('=') {
            return Err(invalid(
                field,
                &kv.key,
                "an environment name must not contain '='",
            ));
        }
        no_nul(field, &kv.key)?;
        no_nul(format!("env[{i}].value"), &kv.value)?;
        let is_it = |e: &String| e.split_once('=').map_or(e.as_str(), |(n, _)| n) == name;
        if remove {
            env.retain(|e| !is_it(e));
            continue;
        }
        let var = format!("{name}={}", kv.value);
        match env.iter().position(is_it) {
            Some(at) => {
                env[at] = var;
                // A later duplicate would win over the value just set.
                let mut n = 0;
                env.retain(|e| {
                    let dup = is_it(e) && n > 0;
                    n += usize::from(is_it(e));
                    !dup
                });
            }
            None => env.push(var),
        }
    }
    Ok(())
}

fn args(spec: &mut Spec, args: &[String]) -> Result<(), AdjustError> {
    if args.is_empty() {
        return Ok(());
    }
    if args[0].is_empty() {
        return Err(invalid("args[0]", "", "the command must not be empty"));
    }
    for (i, a) in args.iter().enumerate() {
        no_nul(format!("args[{i}]"), a)?;
    }
    let process = spec.process_mut().as_mut().ok_or(AdjustError::NoSection {
        field: "args",
        section: "process",
    })?;
    process.set_args(Some(args.to_vec()));
    Ok(())
}

fn hooks(spec: &mut Spec, h: &api::Hooks) -> Result<(), AdjustError> {
    let stages: [(&str, &[api::Hook]); 6] = [
        ("prestart", &h.prestart),
        ("create_runtime", &h.create_runtime),
        ("create_container", &h.create_container),
        ("start_container", &h.start_container),
        ("poststart", &h.poststart),
        ("poststop", &h.poststop),
    ];
    if stages.iter().all(|(_, hs)| hs.is_empty()) {
        return Ok(());
    }
    let out = spec.hooks_mut().get_or_insert_with(Hooks::default);
    for (stage, hs) in stages {
        if hs.is_empty() {
            continue;
        }
        let mut converted = Vec::with_capacity(hs.len());
        for (i, hook) in hs.iter().enumerate() {
            converted.push(oci_hook(&format!("hooks.{stage}[{i}]"), hook)?);
        }
        // `prestart` is deprecated in the OCI spec but still run by runc, and NRI sets it.
        #[allow(deprecated)]
        let list = match stage {
            "prestart" => out.prestart_mut(),
            "create_runtime" => out.create_runtime_mut(),
            "create_container" => out.create_container_mut(),
            "start_container" => out.start_container_mut(),
            "poststart" => out.poststart_mut(),
            _ => out.poststop_mut(),
        };
        list.get_or_insert_with(Vec::new).extend(converted);
    }
    Ok(())
}

fn oci_hook(at: &str, h: &api::Hook) -> Result<Hook, AdjustError> {
    let path = Path::new(&h.path);
    if !path.is_absolute() {
        return Err(invalid(
            format!("{at}.path"),
            &h.path,
            "a hook path must be absolute",
        ));
    }
    no_nul(format!("{at}.path"), &h.path)?;
    for (i, a) in h.args.iter().enumerate() {
        no_nul(format!("{at}.args[{i}]"), a)?;
    }
    for (i, e) in h.env.iter().enumerate() {
        no_nul(format!("{at}.env[{i}]"), e)?;
        if e.split_once('=').is_none_or(|(n, _)| n.is_empty()) {
            return Err(invalid(
                format!("{at}.env[{i}]"),
                e,
                "a hook environment entry must be NAME=value",
            ));
        }
    }
    let mut hook = Hook::default();
    hook.set_path(path.to_path_buf());
    hook.set_args((!h.args.is_empty()).then(|| h.args.clone()));
    hook.set_env((!h.env.is_empty()).then(|| h.env.clone()));
    if let Some(t) = h.timeout.as_ref() {
        if t.value <= 0 {
            return Err(invalid(
                format!("{at}.timeout"),
                t.value,
                "a hook timeout must be positive",
            ));
        }
        hook.set_timeout(Some(t.value));
    }
    Ok(hook)
}

/// Mount options that need the host's propagation checked first (see the module docs).
const PROPAGATION_OPTIONS: &[&str] = &["shared", "rshared", "slave", "rslave"];

fn mounts_(spec: &mut Spec, adjust: &[api::Mount]) -> Result<(), AdjustError> {
    if adjust.is_empty() {
        return Ok(());
    }
    let list = spec.mounts_mut().get_or_insert_with(Vec::new);
    for (i, m) in adjust.iter().enumerate() {
        let (dest, remove) = removal(&m.destination);
        let dest = clean_path(format!("mounts[{i}].destination"), dest)?;
        let at = list.iter().position(|x| x.destination() == &dest);
        if remove {
            if let Some(at) = at {
                list.remove(at);
            }
            continue;
        }
        let mount = oci_mount(i, m, dest.clone())?;
        match at {
            Some(at) => list[at] = mount,
            None => {
                let below = list
                    .iter()
                    .position(|x| x.destination().starts_with(&dest))
                    .unwrap_or(list.len());
                list.insert(below, mount);
            }
        }
    }
    Ok(())
}

fn oci_mount(i: usize, m: &api::Mount, dest: PathBuf) -> Result<Mount, AdjustError> {
    no_nul(format!("mounts[{i}].type"), &m.type_)?;
    no_nul(format!("mounts[{i}].source"), &m.source)?;
    for (j, o) in m.options.iter().enumerate() {
        let field = format!("mounts[{i}].options[{j}]");
        no_nul(field.clone(), o)?;
        if PROPAGATION_OPTIONS.contains(&o.as_str()) {
            return Err(invalid(
                field,
                o,
                "shared and slave propagation need a host-side check remora does not do for NRI mounts",
            ));
        }
    }
    let is_bind = m.type_ == "bind" || m.options.iter().any(|o| o == "bind" || o == "rbind");
    if is_bind && !Path::new(&m.source).is_absolute() {
        return Err(invalid(
            format!("mounts[{i}].source"),
            &m.source,
            "a bind mount source must be an absolute host path",
        ));
    }
    let mut mount = Mount::default();
    mount.set_destination(dest);
    mount.set_typ((!m.type_.is_empty()).then(|| m.type_.clone()));
    mount.set_source((!m.source.is_empty()).then(|| PathBuf::from(&m.source)));
    mount.set_options((!m.options.is_empty()).then(|| m.options.clone()));
    Ok(mount)
}

fn rlimits(spec: &mut Spec, adjust: &[api::POSIXRlimit]) -> Result<(), AdjustError> {
    if adjust.is_empty() {
        return Ok(());
    }
    let process = spec.process_mut().as_mut().ok_or(AdjustError::NoSection {
        field: "rlimits",
        section: "process",
    })?;
    let mut list = process.rlimits().clone().unwrap_or_default();
    for (i, r) in adjust.iter().enumerate() {
        let typ: PosixRlimitType = r.type_.parse().map_err(|_| {
            invalid(
                format!("rlimits[{i}].type"),
                &r.type_,
                "not an RLIMIT_* type Linux knows",
            )
        })?;
        if r.soft > r.hard {
            return Err(invalid(
                format!("rlimits[{i}].soft"),
                r.soft,
                "the soft limit is above the hard limit",
            ));
        }
        let limit = PosixRlimitBuilder::default()
            .typ(typ)
            .hard(r.hard)
            .soft(r.soft)
            .build()
            .expect("every PosixRlimit field is given");
        match list.iter_mut().find(|l| l.typ() == typ) {
            Some(l) => *l = limit,
            None => list.push(limit),
        }
    }
    process.set_rlimits(Some(list));
    Ok(())
}

fn linux(spec: &mut Spec, l: &api::LinuxContainerAdjustment) -> Result<(), AdjustError> {
    let oom = l.oom_score_adj.as_ref();
    if let Some(o) = oom {
        if !(-1000..=1000).contains(&o.value) {
            return Err(invalid(
                "linux.oom_score_adj",
                o.value,
                "it must be between -1000 and 1000",
            ));
        }
        let process = spec.process_mut().as_mut().ok_or(AdjustError::NoSection {
            field: "linux.oom_score_adj",
            section: "process",
        })?;
        // In range just above, so it fits.
        process.set_oom_score_adj(Some(o.value as i32));
    }
    let touches_linux = !l.devices.is_empty()
        || l.resources.is_some()
        || !l.cgroups_path.is_empty()
        || !l.namespaces.is_empty()
        || !l.sysctl.is_empty();
    if !touches_linux {
        return Ok(());
    }
    let linux = spec.linux_mut().as_mut().ok_or(AdjustError::NoSection {
        field: "linux",
        section: "linux",
    })?;
    namespaces(linux, &l.namespaces)?;
    devices(linux, &l.devices)?;
    if let Some(r) = l.resources.as_ref() {
        resources(
            linux.resources_mut().get_or_insert_with(Default::default),
            r,
        )?;
    }
    if !l.cgroups_path.is_empty() {
        cgroups_path(&l.cgroups_path)?;
        linux.set_cgroups_path(Some(PathBuf::from(&l.cgroups_path)));
    }
    sysctls(linux, &l.sysctl)?;
    Ok(())
}

fn namespaces(
    linux: &mut oci_spec::runtime::Linux,
    adjust: &[api::LinuxNamespace],
) -> Result<(), AdjustError> {
    if adjust.is_empty() {
        return Ok(());
    }
    let list = linux.namespaces_mut().get_or_insert_with(Vec::new);
    for (i, n) in adjust.iter().enumerate() {
        let (name, remove) = removal(&n.type_);
        let typ = LinuxNamespaceType::try_from(name).map_err(|_| {
            invalid(
                format!("linux.namespaces[{i}].type"),
                &n.type_,
                "not a Linux namespace type (pid, network, ipc, uts, mount, user, cgroup, time)",
            )
        })?;
        let at = list.iter().position(|x| x.typ() == typ);
        if remove {
            if let Some(at) = at {
                list.remove(at);
            }
            continue;
        }
        let path = if n.path.is_empty() {
            None
        } else {
            Some(clean_path(format!("linux.namespaces[{i}].path"), &n.path)?)
        };
        let mut ns = LinuxNamespace::default();
        ns.set_typ(typ);
        ns.set_path(path);
        match at {
            Some(at) => list[at] = ns,
            None => list.push(ns),
        }
    }
    Ok(())
}

/// The cgroup allow rule NRI adds with a device node: `rw` (`rwm` for block devices) for its
/// type and numbers. A FIFO needs none: the device cgroup knows only `c` and `b`.
fn allow_rule(d: &LinuxDevice) -> Option<LinuxDeviceCgroup> {
    let (typ, access) = match d.typ() {
        LinuxDeviceType::C | LinuxDeviceType::U => (LinuxDeviceType::C, "rw"),
        LinuxDeviceType::B => (LinuxDeviceType::B, "rwm"),
        LinuxDeviceType::P | LinuxDeviceType::A => return None,
    };
    let mut rule = LinuxDeviceCgroup::default();
    rule.set_allow(true);
    rule.set_typ(Some(typ));
    rule.set_major(Some(d.major()));
    rule.set_minor(Some(d.minor()));
    rule.set_access(Some(access.to_owned()));
    Some(rule)
}

/// Whether `rule` allows the same device as `other` (same type and numbers).
fn same_device(rule: &LinuxDeviceCgroup, other: &LinuxDeviceCgroup) -> bool {
    rule.allow() == other.allow()
        && rule.typ() == other.typ()
        && rule.major() == other.major()
        && rule.minor() == other.minor()
}

fn devices(
    linux: &mut oci_spec::runtime::Linux,
    adjust: &[api::LinuxDevice],
) -> Result<(), AdjustError> {
    if adjust.is_empty() {
        return Ok(());
    }
    let mut nodes = linux.devices().clone().unwrap_or_default();
    let mut rules = linux
        .resources()
        .as_ref()
        .and_then(|r| r.devices().clone())
        .unwrap_or_default();
    for (i, d) in adjust.iter().enumerate() {
        let (path, remove) = removal(&d.path);
        let path = clean_path(format!("linux.devices[{i}].path"), path)?;
        // Whatever node is at the path goes, with its rule unless another node still needs it.
        if let Some(at) = nodes.iter().position(|n| n.path() == &path) {
            let old = nodes.remove(at);
            if let Some(rule) = allow_rule(&old) {
                let still_used = nodes
                    .iter()
                    .filter_map(allow_rule)
                    .any(|r| same_device(&r, &rule));
                if !still_used {
                    rules.retain(|r| !same_device(r, &rule));
                }
            }
        }
        if remove {
            continue;
        }
        let node = oci_device(i, d, path)?;
        if let Some(rule) = allow_rule(&node) {
            rules.retain(|r| !same_device(r, &rule));
            rules.push(rule);
        }
        nodes.push(node);
    }
    linux.set_devices(Some(nodes));
    linux
        .resources_mut()
        .get_or_insert_with(Default::default)
        .set_devices(Some(rules));
    Ok(())
}

fn oci_device(i: usize, d: &api::LinuxDevice, path: PathBuf) -> Result<LinuxDevice, AdjustError> {
    let typ = match d.type_.as_str() {
        "c" => LinuxDeviceType::C,
        "b" => LinuxDeviceType::B,
        "u" => LinuxDeviceType::U,
        "p" => LinuxDeviceType::P,
        _ => {
            return Err(invalid(
                format!("linux.devices[{i}].type"),
                &d.type_,
                "a device type must be c, b, u or p",
            ))
        }
    };
    for (field, n) in [("major", d.major), ("minor", d.minor)] {
        // Linux device numbers: 12-bit major, 20-bit minor; a FIFO has none.
        let max = if field == "major" { 0xfff } else { 0xf_ffff };
        if !(0..=max).contains(&n) {
            return Err(invalid(
                format!("linux.devices[{i}].{field}"),
                n,
                "out of the range of Linux device numbers",
            ));
        }
    }
    let mut node = LinuxDevice::default();
    node.set_path(path);
    node.set_typ(typ);
    node.set_major(d.major);
    node.set_minor(d.minor);
    if let Some(mode) = d.file_mode.as_ref() {
        if mode.value & !0o7777 != 0 {
            return Err(invalid(
                format!("linux.devices[{i}].file_mode"),
                format!("{:o}", mode.value),
                "only permission bits (0o7777) may be set",
            ));
        }
        node.set_file_mode(Some(mode.value));
    }
    node.set_uid(d.uid.as_ref().map(|u| u.value));
    node.set_gid(d.gid.as_ref().map(|g| g.value));
    Ok(node)
}

fn cgroups_path(path: &str) -> Result<(), AdjustError> {
    let field = "linux.cgroups_path";
    no_nul(field, path)?;
    // Either a cgroupfs path or systemd's `slice:prefix:name`; neither may climb with `..`.
    if path.split(['/', ':']).any(|c| c == "..") {
        return Err(invalid(field, path, "it must not contain `..`"));
    }
    Ok(())
}

fn sysctls(
    linux: &mut oci_spec::runtime::Linux,
    adjust: &std::collections::HashMap<String, String>,
) -> Result<(), AdjustError> {
    if adjust.is_empty() {
        return Ok(());
    }
    // Checked against the namespaces the container ends up with (adjusted just before).
    let has = |t| {
        linux
            .namespaces()
            .as_ref()
            .is_some_and(|ns| ns.iter().any(|n| n.typ() == t))
    };
    let (host_network, host_ipc) = (
        !has(LinuxNamespaceType::Network),
        !has(LinuxNamespaceType::Ipc),
    );
    let mut entries: Vec<_> = adjust.iter().collect();
    entries.sort();
    let map = linux.sysctl_mut().get_or_insert_with(Default::default);
    for (key, value) in entries {
        let (name, remove) = removal(key);
        if remove {
            map.remove(name);
            continue;
        }
        sysctl::check(name, value, host_network, host_ipc)
            .map_err(|reason| invalid(format!("linux.sysctl[{key:?}]"), value, reason))?;
        map.insert(name.to_owned(), value.clone());
    }
    Ok(())
}

/// Kernel limits on the CFS period (1 ms to 1 s) and the smallest quota, in µs.
const CFS_PERIOD: std::ops::RangeInclusive<u64> = 1_000..=1_000_000;
const CFS_MIN_QUOTA: i64 = 1_000;
/// The largest cgroup v1 `cpu.shares` (`MAX_SHARES`).
const MAX_CPU_SHARES: u64 = 262_144;

fn resources(out: &mut LinuxResources, r: &api::LinuxResources) -> Result<(), AdjustError> {
    if let Some(c) = r.cpu.as_ref() {
        let mut cpu = out.cpu().clone().unwrap_or_default();
        if let Some(v) = c.shares.as_ref() {
            if !(2..=MAX_CPU_SHARES).contains(&v.value) {
                return Err(invalid(
                    "linux.resources.cpu.shares",
                    v.value,
                    "cpu shares must be between 2 and 262144",
                ));
            }
            cpu.set_shares(Some(v.value));
        }
        if let Some(v) = c.quota.as_ref() {
            if v.value != -1 && v.value < CFS_MIN_QUOTA {
                return Err(invalid(
                    "linux.resources.cpu.quota",
                    v.value,
                    "a cpu quota must be -1 (none) or at least 1000 µs",
                ));
            }
            cpu.set_quota(Some(v.value));
        }
        if let Some(v) = c.period.as_ref() {
            if !CFS_PERIOD.contains(&v.value) {
                return Err(invalid(
                    "linux.resources.cpu.period",
                    v.value,
                    "a cpu period must be between 1000 and 1000000 µs",
                ));
            }
            cpu.set_period(Some(v.value));
        }
        if let Some(v) = c.realtime_runtime.as_ref() {
            if v.value < -1 {
                return Err(invalid(
                    "linux.resources.cpu.realtime_runtime",
                    v.value,
                    "a realtime runtime must be -1 (unlimited) or at least 0",
                ));
            }
            cpu.set_realtime_runtime(Some(v.value));
        }
        if let Some(v) = c.realtime_period.as_ref() {
            if v.value == 0 {
                return Err(invalid(
                    "linux.resources.cpu.realtime_period",
                    v.value,
                    "a realtime period must be positive",
                ));
            }
            cpu.set_realtime_period(Some(v.value));
        }
        if !c.cpus.is_empty() {
            cpu_list("linux.resources.cpu.cpus", &c.cpus)?;
            cpu.set_cpus(Some(c.cpus.clone()));
        }
        if !c.mems.is_empty() {
            cpu_list("linux.resources.cpu.mems", &c.mems)?;
            cpu.set_mems(Some(c.mems.clone()));
        }
        // An empty `cpu` message sets nothing, so it adds no empty section either.
        if out.cpu().is_some() || cpu != LinuxCpu::default() {
            out.set_cpu(Some(cpu));
        }
    }
    if let Some(m) = r.memory.as_ref() {
        memory(out, m)?;
    }
    if let Some(p) = r.pids.as_ref() {
        if p.limit != -1 && p.limit <= 0 {
            return Err(invalid(
                "linux.resources.pids.limit",
                p.limit,
                "a pids limit must be -1 (none) or positive",
            ));
        }
        let mut pids = LinuxPids::default();
        pids.set_limit(p.limit);
        out.set_pids(Some(pids));
    }
    if !r.hugepage_limits.is_empty() {
        let mut list = out.hugepage_limits().clone().unwrap_or_default();
        for (i, h) in r.hugepage_limits.iter().enumerate() {
            let size = &h.page_size;
            let digits = size.strip_suffix("KB").or_else(|| size.strip_suffix("MB"));
            let digits = digits.or_else(|| size.strip_suffix("GB"));
            if !digits.is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit())) {
                return Err(invalid(
                    format!("linux.resources.hugepage_limits[{i}].page_size"),
                    size,
                    "a page size is a number followed by KB, MB or GB",
                ));
            }
            let limit = i64::try_from(h.limit).map_err(|_| {
                invalid(
                    format!("linux.resources.hugepage_limits[{i}].limit"),
                    h.limit,
                    "it is too large",
                )
            })?;
            let mut l = LinuxHugepageLimit::default();
            l.set_page_size(size.clone());
            l.set_limit(limit);
            match list.iter_mut().find(|x| x.page_size() == size) {
                Some(x) => *x = l,
                None => list.push(l),
            }
        }
        out.set_hugepage_limits(Some(list));
    }
    if !r.unified.is_empty() {
        let mut entries: Vec<_> = r.unified.iter().collect();
        entries.sort();
        let map = out.unified_mut().get_or_insert_with(Default::default);
        for (key, value) in entries {
            let field = format!("linux.resources.unified[{key:?}]");
            // A cgroup v2 interface file directly in the container's cgroup: `controller.knob`.
            let well_formed = key
                .split_once('.')
                .is_some_and(|(c, k)| !c.is_empty() && !k.is_empty())
                && key
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
            if !well_formed {
                return Err(invalid(
                    field,
                    key,
                    "a unified key must be a cgroup v2 file name such as memory.high",
                ));
            }
            no_nul(field, value)?;
            map.insert(key.clone(), value.clone());
        }
    }
    Ok(())
}

/// A cpuset list: `0-3,8,10-11`.
fn cpu_list(field: &'static str, value: &str) -> Result<(), AdjustError> {
    let well_formed = value.split(',').all(|part| {
        let mut ends = part.splitn(2, '-');
        ends.all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    });
    if !well_formed {
        return Err(invalid(
            field,
            value,
            "a cpuset list is numbers and ranges separated by commas (0-3,8)",
        ));
    }
    Ok(())
}

fn memory(out: &mut LinuxResources, m: &api::LinuxMemory) -> Result<(), AdjustError> {
    let mut mem = out.memory().unwrap_or_default();
    let bytes = |field: &'static str, v: Option<&api::OptionalInt64>| match v {
        Some(v) if v.value == -1 || v.value > 0 => Ok(Some(v.value)),
        Some(v) => Err(invalid(
            field,
            v.value,
            "a memory size must be -1 (unlimited) or positive",
        )),
        None => Ok(None),
    };
    let limit = bytes("linux.resources.memory.limit", m.limit.as_ref())?;
    let reservation = bytes("linux.resources.memory.reservation", m.reservation.as_ref())?;
    let swap = bytes("linux.resources.memory.swap", m.swap.as_ref())?;
    if let Some(limit) = limit {
        // Swap follows the limit where the spec has a swap limit (remora set one: the host
        // accounts swap) and the adjustment does not set it: no swap use, NRI's and remora's
        // rule. Without one, there is no swap accounting to set.
        if swap.is_none() && mem.swap().is_some() {
            mem.set_swap(Some(limit));
        }
        mem.set_limit(Some(limit));
    }
    if let Some(r) = reservation {
        mem.set_reservation(Some(r));
    }
    if let Some(s) = swap {
        mem.set_swap(Some(s));
    }
    if let Some(v) = m.swappiness.as_ref() {
        if v.value > 100 {
            return Err(invalid(
                "linux.resources.memory.swappiness",
                v.value,
                "swappiness must be between 0 and 100",
            ));
        }
        mem.set_swappiness(Some(v.value));
    }
    if let Some(v) = m.disable_oom_killer.as_ref() {
        mem.set_disable_oom_killer(Some(v.value));
    }
    if out.memory().is_some() || mem != LinuxMemory::default() {
        out.set_memory(Some(mem));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::spec::tests::{build, config, host, sandbox};

    /// A container spec as remora generates it (`spec::tests`' container: a `/data` bind,
    /// the pod's files, cpu shares 256, a 128 MiB memory limit with swap accounting).
    fn base() -> Spec {
        build(&config(), &sandbox(), &host()).unwrap().spec
    }

    fn adjusted(adjust: &api::ContainerAdjustment) -> Spec {
        let mut spec = base();
        apply_adjustment(&mut spec, adjust).unwrap();
        spec
    }

    /// Applies `adjust`, expecting it refused; the spec must be unchanged.
    fn refused(adjust: &api::ContainerAdjustment) -> AdjustError {
        let mut spec = base();
        let err = apply_adjustment(&mut spec, adjust).unwrap_err();
        assert_eq!(spec, base(), "a refused adjustment changed the spec: {err}");
        err
    }

    fn invalid_field(err: AdjustError) -> String {
        match err {
            AdjustError::Invalid { field, .. } => field,
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    fn kv(key: &str, value: &str) -> api::KeyValue {
        api::KeyValue {
            key: key.into(),
            value: value.into(),
            ..Default::default()
        }
    }

    fn nri_mount(dest: &str, typ: &str, source: &str, options: &[&str]) -> api::Mount {
        api::Mount {
            destination: dest.into(),
            type_: typ.into(),
            source: source.into(),
            options: options.iter().map(|o| o.to_string()).collect(),
            ..Default::default()
        }
    }

    fn nri_device(path: &str, typ: &str, major: i64, minor: i64) -> api::LinuxDevice {
        api::LinuxDevice {
            path: path.into(),
            type_: typ.into(),
            major,
            minor,
            ..Default::default()
        }
    }

    fn env_of(spec: &Spec) -> Vec<String> {
        spec.process().as_ref().unwrap().env().clone().unwrap()
    }

    fn dests(spec: &Spec) -> Vec<String> {
        spec.mounts()
            .as_ref()
            .unwrap()
            .iter()
            .map(|m| m.destination().display().to_string())
            .collect()
    }

    fn linux(spec: &Spec) -> &oci_spec::runtime::Linux {
        spec.linux().as_ref().unwrap()
    }

    fn res(spec: &Spec) -> &LinuxResources {
        linux(spec).resources().as_ref().unwrap()
    }

    #[test]
    fn an_empty_adjustment_changes_nothing() {
        assert_eq!(adjusted(&api::ContainerAdjustment::new()), base());
        // Present but empty parts set nothing either.
        let mut a = api::ContainerAdjustment::new();
        a.hooks.mut_or_insert_default();
        let r = a
            .linux
            .mut_or_insert_default()
            .resources
            .mut_or_insert_default();
        r.cpu.mut_or_insert_default();
        r.memory.mut_or_insert_default();
        assert_eq!(adjusted(&a), base());
    }

    #[test]
    fn annotations_are_set_and_removed() {
        let mut a = api::ContainerAdjustment::new();
        a.annotations = HashMap::from([("nri.example/a".into(), "1".into())]);
        let spec = adjusted(&a);
        let got = spec.annotations().as_ref().unwrap();
        assert_eq!(got.get("nri.example/a").map(String::as_str), Some("1"));
        assert_eq!(got.len(), base().annotations().as_ref().unwrap().len() + 1);

        let mut remove = api::ContainerAdjustment::new();
        remove.annotations = HashMap::from([("-nri.example/a".into(), String::new())]);
        let mut spec = spec;
        apply_adjustment(&mut spec, &remove).unwrap();
        assert_eq!(spec, base());
    }

    #[test]
    fn remoras_own_annotations_cannot_change() {
        for key in [
            annotations::SANDBOX_ID.to_owned(),
            format!("-{}", annotations::CONTAINER_NAME),
            annotations::POD_HOLDER.to_owned(),
        ] {
            let mut a = api::ContainerAdjustment::new();
            a.annotations = HashMap::from([(key.clone(), "x".into())]);
            let field = invalid_field(refused(&a));
            assert_eq!(field, format!("annotations[{key:?}]"));
        }
    }

    #[test]
    fn env_is_set_in_place_appended_and_removed() {
        assert_eq!(
            env_of(&base()),
            ["PATH=/usr/bin:/bin", "HOSTNAME=pod-host", "LANG=C.UTF-8"]
        );
        let mut a = api::ContainerAdjustment::new();
        a.env = vec![kv("LANG", "de_DE"), kv("NEW", "a=b"), kv("-PATH", "")];
        assert_eq!(
            env_of(&adjusted(&a)),
            ["HOSTNAME=pod-host", "LANG=de_DE", "NEW=a=b"]
        );
    }

    #[test]
    fn non_empty_args_replace_the_command() {
        let mut a = api::ContainerAdjustment::new();
        a.args = vec!["/bin/other".into(), "--flag".into()];
        let spec = adjusted(&a);
        let args = spec.process().as_ref().unwrap().args().clone().unwrap();
        assert_eq!(args, ["/bin/other", "--flag"]);
    }

    #[test]
    fn mounts_are_added_below_their_parents_replaced_in_place_and_removed() {
        let before = dests(&base());
        let data_at = before.iter().position(|d| d == "/data").unwrap();
        let hostname_at = before.iter().position(|d| d == "/etc/hostname").unwrap();
        assert!(hostname_at > data_at, "{before:?}");

        let mut a = api::ContainerAdjustment::new();
        a.mounts = vec![
            nri_mount("/data", "bind", "/srv/other", &["rbind", "ro"]),
            nri_mount("/etc", "tmpfs", "tmpfs", &["nosuid"]),
            nri_mount("/data/sub", "bind", "/srv/sub", &["rbind"]),
            nri_mount("-/etc/hosts", "", "", &[]),
        ];
        let spec = adjusted(&a);
        let after = dests(&spec);
        let mut expected = before.clone();
        expected.retain(|d| d != "/etc/hosts");
        let at = expected.iter().position(|d| d == "/etc/hostname").unwrap();
        expected.insert(at, "/etc".into());
        expected.push("/data/sub".into());
        assert_eq!(after, expected);

        let data = &spec.mounts().as_ref().unwrap()[data_at];
        assert_eq!(data.source().as_deref(), Some(Path::new("/srv/other")));
        assert_eq!(data.typ().as_deref(), Some("bind"));
        assert_eq!(data.options().clone().unwrap(), ["rbind", "ro"]);
    }

    #[test]
    fn hooks_are_appended_per_stage() {
        let hook = |path: &str| api::Hook {
            path: path.into(),
            args: vec![path.into(), "x".into()],
            timeout: Some(api::OptionalInt {
                value: 5,
                ..Default::default()
            })
            .into(),
            ..Default::default()
        };
        let mut a = api::ContainerAdjustment::new();
        let h = a.hooks.mut_or_insert_default();
        h.create_runtime = vec![hook("/bin/one")];
        h.poststop = vec![hook("/bin/two")];
        let mut spec = adjusted(&a);
        let mut b = api::ContainerAdjustment::new();
        b.hooks.mut_or_insert_default().create_runtime = vec![hook("/bin/three")];
        apply_adjustment(&mut spec, &b).unwrap();

        let hooks = spec.hooks().as_ref().unwrap();
        let paths = |hs: &Option<Vec<Hook>>| {
            hs.iter()
                .flatten()
                .map(|h| h.path().display().to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(paths(hooks.create_runtime()), ["/bin/one", "/bin/three"]);
        assert_eq!(paths(hooks.poststop()), ["/bin/two"]);
        assert!(hooks.start_container().is_none());
        let one = &hooks.create_runtime().as_ref().unwrap()[0];
        assert_eq!(one.args().clone().unwrap(), ["/bin/one", "x"]);
        assert_eq!(one.timeout(), Some(5));
    }

    #[test]
    fn rlimits_are_set_by_type() {
        let rlimit = |typ: &str, soft, hard| api::POSIXRlimit {
            type_: typ.into(),
            soft,
            hard,
            ..Default::default()
        };
        let mut a = api::ContainerAdjustment::new();
        a.rlimits = vec![
            rlimit("RLIMIT_NOFILE", 1024, 4096),
            rlimit("RLIMIT_CORE", 0, 0),
            rlimit("RLIMIT_NOFILE", 2048, 8192),
        ];
        let spec = adjusted(&a);
        let got: Vec<_> = spec
            .process()
            .as_ref()
            .unwrap()
            .rlimits()
            .iter()
            .flatten()
            .map(|l| (l.typ(), l.soft(), l.hard()))
            .collect();
        assert_eq!(
            got,
            [
                (PosixRlimitType::RlimitNofile, 2048, 8192),
                (PosixRlimitType::RlimitCore, 0, 0)
            ]
        );
    }

    #[test]
    fn resources_change_only_in_the_fields_set() {
        let before = res(&base()).clone();
        assert_eq!(before.cpu().as_ref().unwrap().shares(), Some(256));
        assert_eq!(before.memory().as_ref().unwrap().limit(), Some(128 << 20));
        assert_eq!(before.memory().as_ref().unwrap().swap(), Some(128 << 20));

        let mut a = api::ContainerAdjustment::new();
        let r = a
            .linux
            .mut_or_insert_default()
            .resources
            .mut_or_insert_default();
        let cpu = r.cpu.mut_or_insert_default();
        cpu.quota = Some(api::OptionalInt64 {
            value: 50_000,
            ..Default::default()
        })
        .into();
        cpu.period = Some(api::OptionalUInt64 {
            value: 100_000,
            ..Default::default()
        })
        .into();
        cpu.cpus = "0-1,3".into();
        let mem = r.memory.mut_or_insert_default();
        mem.limit = Some(api::OptionalInt64 {
            value: 64 << 20,
            ..Default::default()
        })
        .into();
        mem.swappiness = Some(api::OptionalUInt64 {
            value: 0,
            ..Default::default()
        })
        .into();
        r.pids = Some(api::LinuxPids {
            limit: 100,
            ..Default::default()
        })
        .into();
        r.hugepage_limits = vec![api::HugepageLimit {
            page_size: "2MB".into(),
            limit: 1 << 30,
            ..Default::default()
        }];
        r.unified = HashMap::from([("memory.high".into(), "max".into())]);
        let spec = adjusted(&a);
        let after = res(&spec);

        let cpu = after.cpu().as_ref().unwrap();
        assert_eq!(cpu.shares(), Some(256), "not set: kept");
        assert_eq!((cpu.quota(), cpu.period()), (Some(50_000), Some(100_000)));
        assert_eq!(cpu.cpus().as_deref(), Some("0-1,3"));
        assert!(cpu.mems().is_none() && cpu.realtime_runtime().is_none());
        let mem = after.memory().as_ref().unwrap();
        assert_eq!(mem.limit(), Some(64 << 20));
        assert_eq!(mem.swap(), Some(64 << 20), "swap follows the limit");
        assert_eq!(mem.swappiness(), Some(0));
        assert!(mem.reservation().is_none() && mem.disable_oom_killer().is_none());
        assert_eq!(after.pids().unwrap().limit(), 100);
        let huge = after.hugepage_limits().as_ref().unwrap();
        assert_eq!(huge.len(), 1);
        assert_eq!(
            (huge[0].page_size().as_str(), huge[0].limit()),
            ("2MB", 1 << 30)
        );
        assert_eq!(
            after
                .unified()
                .as_ref()
                .unwrap()
                .get("memory.high")
                .map(String::as_str),
            Some("max")
        );
        assert_eq!(after.devices(), before.devices(), "device rules untouched");

        // An explicit swap wins over the limit's.
        let mut b = api::ContainerAdjustment::new();
        let m = b
            .linux
            .mut_or_insert_default()
            .resources
            .mut_or_insert_default()
            .memory
            .mut_or_insert_default();
        m.limit = Some(api::OptionalInt64 {
            value: 64 << 20,
            ..Default::default()
        })
        .into();
        m.swap = Some(api::OptionalInt64 {
            value: -1,
            ..Default::default()
        })
        .into();
        let spec = adjusted(&b);
        assert_eq!(res(&spec).memory().as_ref().unwrap().swap(), Some(-1));
        assert_eq!(res(&spec).cpu(), before.cpu(), "no cpu message: unchanged");
    }

    #[test]
    fn cgroups_path_oom_score_adj_and_sysctls() {
        let mut a = api::ContainerAdjustment::new();
        let l = a.linux.mut_or_insert_default();
        l.cgroups_path = "/kubepods/nri/c1".into();
        l.oom_score_adj = Some(api::OptionalInt {
            value: 500,
            ..Default::default()
        })
        .into();
        l.sysctl = HashMap::from([
            ("net.ipv4.ip_forward".into(), "1".into()),
            ("-net.core.somaxconn".into(), String::new()),
        ]);
        let spec = adjusted(&a);
        assert_eq!(
            linux(&spec).cgroups_path().as_deref(),
            Some(Path::new("/kubepods/nri/c1"))
        );
        assert_eq!(spec.process().as_ref().unwrap().oom_score_adj(), Some(500));
        assert_eq!(
            linux(&spec).sysctl().clone().unwrap(),
            HashMap::from([("net.ipv4.ip_forward".to_owned(), "1".to_owned())])
        );
    }

    #[test]
    fn devices_come_with_their_allow_rule_and_go_with_it() {
        let base_rules = res(&base()).devices().clone().unwrap();
        let mut a = api::ContainerAdjustment::new();
        let l = a.linux.mut_or_insert_default();
        let mut gpu = nri_device("/dev/gpu0", "c", 195, 0);
        gpu.file_mode = Some(api::OptionalFileMode {
            value: 0o660,
            ..Default::default()
        })
        .into();
        l.devices = vec![gpu, nri_device("/dev/disk0", "b", 8, 0)];
        let spec = adjusted(&a);
        let nodes = linux(&spec).devices().clone().unwrap();
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes[0].path(), Path::new("/dev/gpu0"));
        assert_eq!(
            (nodes[0].typ(), nodes[0].major(), nodes[0].file_mode()),
            (LinuxDeviceType::C, 195, Some(0o660))
        );
        let rules = res(&spec).devices().clone().unwrap();
        assert_eq!(rules.len(), base_rules.len() + 2);
        assert_eq!(rules[..base_rules.len()], base_rules[..], "deny-all first");
        let gpu_rule = &rules[base_rules.len()];
        assert!(gpu_rule.allow());
        assert_eq!(
            (gpu_rule.typ(), gpu_rule.major(), gpu_rule.minor()),
            (Some(LinuxDeviceType::C), Some(195), Some(0))
        );
        assert_eq!(gpu_rule.access().as_deref(), Some("rw"));
        assert_eq!(rules[base_rules.len() + 1].access().as_deref(), Some("rwm"));

        // Replacing the node at a path replaces its rule; removing it removes both.
        let mut b = api::ContainerAdjustment::new();
        b.linux.mut_or_insert_default().devices = vec![
            nri_device("/dev/gpu0", "c", 195, 1),
            nri_device("-/dev/disk0", "", 0, 0),
        ];
        let mut spec = spec;
        apply_adjustment(&mut spec, &b).unwrap();
        let nodes = linux(&spec).devices().clone().unwrap();
        assert_eq!(nodes.len(), 1);
        assert_eq!(
            (nodes[0].path().as_path(), nodes[0].minor()),
            (Path::new("/dev/gpu0"), 1)
        );
        let rules = res(&spec).devices().clone().unwrap();
        assert_eq!(rules.len(), base_rules.len() + 1);
        assert_eq!(rules.last().unwrap().minor(), Some(1));
    }

    #[test]
    fn a_shared_rule_stays_while_another_node_uses_it() {
        let mut a = api::ContainerAdjustment::new();
        a.linux.mut_or_insert_default().devices = vec![
            nri_device("/dev/a", "c", 10, 200),
            nri_device("/dev/b", "c", 10, 200),
        ];
        let mut spec = adjusted(&a);
        let n = res(&spec).devices().as_ref().unwrap().len();
        let mut b = api::ContainerAdjustment::new();
        b.linux.mut_or_insert_default().devices = vec![nri_device("-/dev/a", "", 0, 0)];
        apply_adjustment(&mut spec, &b).unwrap();
        let rules = res(&spec).devices().clone().unwrap();
        assert_eq!(rules.len(), n, "/dev/b still needs the rule");
        assert_eq!(rules.last().unwrap().minor(), Some(200));
    }

    #[test]
    fn namespaces_are_set_and_removed_by_type() {
        let mut a = api::ContainerAdjustment::new();
        a.linux.mut_or_insert_default().namespaces = vec![
            api::LinuxNamespace {
                type_: "network".into(),
                path: "/run/netns/other".into(),
                ..Default::default()
            },
            api::LinuxNamespace {
                type_: "-ipc".into(),
                ..Default::default()
            },
            api::LinuxNamespace {
                type_: "cgroup".into(),
                ..Default::default()
            },
        ];
        let before = linux(&base()).namespaces().clone().unwrap();
        let has = |ns: &[LinuxNamespace], t| ns.iter().any(|n| n.typ() == t);
        assert!(has(&before, LinuxNamespaceType::Ipc));
        assert!(!has(&before, LinuxNamespaceType::Cgroup));
        let spec = adjusted(&a);
        let after = linux(&spec).namespaces().clone().unwrap();
        assert_eq!(after.len(), before.len());
        assert!(!has(&after, LinuxNamespaceType::Ipc));
        let cgroup = after.last().unwrap();
        assert_eq!(
            (cgroup.typ(), cgroup.path()),
            (LinuxNamespaceType::Cgroup, &None)
        );
        let net = after
            .iter()
            .find(|n| n.typ() == LinuxNamespaceType::Network)
            .unwrap();
        assert_eq!(net.path().as_deref(), Some(Path::new("/run/netns/other")));
    }

    #[test]
    fn what_remora_does_not_apply_is_refused_by_name() {
        type Set = fn(&mut api::ContainerAdjustment);
        let cases: &[(&str, Set)] = &[
            ("CDI_devices", |a| {
                a.CDI_devices = vec![api::CDIDevice {
                    name: "vendor.com/gpu=0".into(),
                    ..Default::default()
                }]
            }),
            ("linux.seccomp_policy", |a| {
                a.linux
                    .mut_or_insert_default()
                    .seccomp_policy
                    .mut_or_insert_default();
            }),
            ("linux.io_priority", |a| {
                a.linux
                    .mut_or_insert_default()
                    .io_priority
                    .mut_or_insert_default();
            }),
            ("linux.scheduler", |a| {
                a.linux
                    .mut_or_insert_default()
                    .scheduler
                    .mut_or_insert_default();
            }),
            ("linux.rdt", |a| {
                a.linux.mut_or_insert_default().rdt.mut_or_insert_default();
            }),
            ("linux.memory_policy", |a| {
                a.linux
                    .mut_or_insert_default()
                    .memory_policy
                    .mut_or_insert_default();
            }),
            ("linux.net_devices", |a| {
                a.linux
                    .mut_or_insert_default()
                    .net_devices
                    .insert("eth1".into(), Default::default());
            }),
            ("linux.resources.blockio_class", |a| {
                let l = a.linux.mut_or_insert_default();
                l.resources
                    .mut_or_insert_default()
                    .blockio_class
                    .mut_or_insert_default();
            }),
            ("linux.resources.rdt_class", |a| {
                let l = a.linux.mut_or_insert_default();
                l.resources
                    .mut_or_insert_default()
                    .rdt_class
                    .mut_or_insert_default();
            }),
            ("linux.resources.devices", |a| {
                let l = a.linux.mut_or_insert_default();
                l.resources.mut_or_insert_default().devices = vec![Default::default()];
            }),
            ("linux.resources.memory.kernel", |a| {
                let l = a.linux.mut_or_insert_default();
                let r = l.resources.mut_or_insert_default();
                r.memory
                    .mut_or_insert_default()
                    .kernel
                    .mut_or_insert_default();
            }),
            ("fields unknown to NRI v0.12.2 (in linux)", |a| {
                let l = a.linux.mut_or_insert_default();
                l.special_fields.mut_unknown_fields().add_varint(99, 1);
            }),
        ];
        for (name, set) in cases {
            let mut a = api::ContainerAdjustment::new();
            // Something applicable too: it must not be applied either.
            a.env = vec![kv("NEW", "1")];
            set(&mut a);
            match refused(&a) {
                AdjustError::Unsupported { field } => assert_eq!(field, *name),
                other => panic!("{name}: expected Unsupported, got {other:?}"),
            }
        }
    }

    #[test]
    fn invalid_values_are_refused_naming_the_field() {
        type Set = fn(&mut api::ContainerAdjustment);
        let cases: &[(&str, Set)] = &[
            ("mounts[0].destination", |a| {
                a.mounts = vec![nri_mount("data", "bind", "/x", &["rbind"])]
            }),
            ("mounts[0].destination", |a| {
                a.mounts = vec![nri_mount("/a/../../etc", "bind", "/x", &["rbind"])]
            }),
            ("mounts[0].destination", |a| {
                a.mounts = vec![nri_mount("/a/./b", "bind", "/x", &["rbind"])]
            }),
            ("mounts[0].destination", |a| {
                a.mounts = vec![nri_mount("/", "bind", "/x", &["rbind"])]
            }),
            ("mounts[0].source", |a| {
                a.mounts = vec![nri_mount("/a", "bind", "rel", &["rbind"])]
            }),
            ("mounts[0].options[1]", |a| {
                a.mounts = vec![nri_mount("/a", "bind", "/x", &["rbind", "rshared"])]
            }),
            ("env[0].key", |a| a.env = vec![kv("A=B", "c")]),
            ("env[1].key", |a| a.env = vec![kv("OK", "1"), kv("", "c")]),
            ("env[0].key", |a| a.env = vec![kv("-", "")]),
            ("args[0]", |a| a.args = vec![String::new()]),
            ("rlimits[0].type", |a| {
                a.rlimits = vec![api::POSIXRlimit {
                    type_: "RLIMIT_BOGUS".into(),
                    ..Default::default()
                }]
            }),
            ("rlimits[0].soft", |a| {
                a.rlimits = vec![api::POSIXRlimit {
                    type_: "RLIMIT_NOFILE".into(),
                    soft: 10,
                    hard: 5,
                    ..Default::default()
                }]
            }),
            ("hooks.poststart[0].path", |a| {
                a.hooks.mut_or_insert_default().poststart = vec![api::Hook {
                    path: "hook".into(),
                    ..Default::default()
                }]
            }),
            ("linux.devices[0].type", |a| {
                a.linux.mut_or_insert_default().devices = vec![nri_device("/dev/x", "a", 1, 1)]
            }),
            ("linux.devices[0].path", |a| {
                a.linux.mut_or_insert_default().devices = vec![nri_device("dev/x", "c", 1, 1)]
            }),
            ("linux.devices[0].major", |a| {
                a.linux.mut_or_insert_default().devices = vec![nri_device("/dev/x", "c", -1, 1)]
            }),
            ("linux.namespaces[0].type", |a| {
                a.linux.mut_or_insert_default().namespaces = vec![api::LinuxNamespace {
                    type_: "bogus".into(),
                    ..Default::default()
                }]
            }),
            ("linux.oom_score_adj", |a| {
                a.linux.mut_or_insert_default().oom_score_adj = Some(api::OptionalInt {
                    value: 1001,
                    ..Default::default()
                })
                .into()
            }),
            ("linux.cgroups_path", |a| {
                a.linux.mut_or_insert_default().cgroups_path = "/kubepods/../escape".into()
            }),
            ("linux.sysctl[\"kernel.panic\"]", |a| {
                a.linux.mut_or_insert_default().sysctl =
                    HashMap::from([("kernel.panic".into(), "1".into())])
            }),
            ("linux.resources.memory.swappiness", |a| {
                let r = a
                    .linux
                    .mut_or_insert_default()
                    .resources
                    .mut_or_insert_default();
                r.memory.mut_or_insert_default().swappiness = Some(api::OptionalUInt64 {
                    value: 101,
                    ..Default::default()
                })
                .into()
            }),
            ("linux.resources.memory.limit", |a| {
                let r = a
                    .linux
                    .mut_or_insert_default()
                    .resources
                    .mut_or_insert_default();
                r.memory.mut_or_insert_default().limit = Some(api::OptionalInt64 {
                    value: -5,
                    ..Default::default()
                })
                .into()
            }),
            ("linux.resources.cpu.cpus", |a| {
                let r = a
                    .linux
                    .mut_or_insert_default()
                    .resources
                    .mut_or_insert_default();
                r.cpu.mut_or_insert_default().cpus = "0-".into()
            }),
            ("linux.resources.cpu.period", |a| {
                let r = a
                    .linux
                    .mut_or_insert_default()
                    .resources
                    .mut_or_insert_default();
                r.cpu.mut_or_insert_default().period = Some(api::OptionalUInt64 {
                    value: 10,
                    ..Default::default()
                })
                .into()
            }),
            ("linux.resources.hugepage_limits[0].page_size", |a| {
                let r = a
                    .linux
                    .mut_or_insert_default()
                    .resources
                    .mut_or_insert_default();
                r.hugepage_limits = vec![api::HugepageLimit {
                    page_size: "2XB".into(),
                    ..Default::default()
                }]
            }),
            ("linux.resources.unified[\"../x\"]", |a| {
                let r = a
                    .linux
                    .mut_or_insert_default()
                    .resources
                    .mut_or_insert_default();
                r.unified = HashMap::from([("../x".into(), "1".into())])
            }),
        ];
        for (i, (name, set)) in cases.iter().enumerate() {
            let mut a = api::ContainerAdjustment::new();
            set(&mut a);
            assert_eq!(invalid_field(refused(&a)), *name, "case {i}");
        }
    }

    #[test]
    fn an_error_leaves_earlier_changes_unapplied() {
        let mut a = api::ContainerAdjustment::new();
        a.env = vec![kv("NEW", "1")];
        a.annotations = HashMap::from([("ok".into(), "1".into())]);
        a.rlimits = vec![api::POSIXRlimit {
            type_: "nope".into(),
            ..Default::default()
        }];
        let err = refused(&a);
        assert!(err.to_string().contains("rlimits[0].type"), "{err}");
    }
}
