//! Applying resolved CDI edits to a container's OCI spec, as the CDI module's
//! `ContainerEdits.Apply` does: the edits of all requested devices are merged first (lists
//! concatenated, the last `intelRdt` wins), then
//!
//! - env: a variable of the same name is replaced in place, others appended;
//! - device nodes: type, major/minor and mode filled from the host node (`lstat`) when the
//!   spec leaves them out; owner defaulting to the process's uid/gid when that is not root;
//!   a node already at the same container path replaced; block and char nodes also allowed in
//!   the device cgroup with their permissions (`rwm` by default, none for `none`);
//! - net devices: `linux.netDevices[host] = {name}`;
//! - mounts: one already at the same destination replaced, bind mounts given `idmap`/`ridmap`
//!   when the container has a user namespace with mappings, then all mounts stably sorted by
//!   destination depth (parents before children);
//! - hooks appended to their phase; `intelRdt` set; additional gids appended (0 ignored,
//!   no duplicates).

use std::io;
use std::path::{Path, PathBuf};

use oci_spec::runtime::{
    Hook, HookBuilder, Hooks, Linux, LinuxBuilder, LinuxDevice, LinuxDeviceBuilder,
    LinuxDeviceCgroupBuilder, LinuxDeviceType, LinuxIntelRdtBuilder, LinuxNamespaceType,
    LinuxNetDevice, Mount, Process, Spec,
};

use super::spec::{ContainerEdits, DeviceNode};
use super::CdiError;

/// What `lstat` says of a host device node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeInfo {
    /// `b`, `c` or `p`.
    pub typ: char,
    /// Major number.
    pub major: i64,
    /// Minor number.
    pub minor: i64,
    /// Permission bits.
    pub mode: u32,
}

/// Looks a host node up (`lstat`, as CDI: a symlink is not a device node).
pub type NodeLookup<'a> = dyn Fn(&Path) -> io::Result<NodeInfo> + 'a;

/// `lstat`s a host device node.
pub fn host_node(path: &Path) -> io::Result<NodeInfo> {
    use nix::sys::stat::{lstat, major, minor, SFlag};
    let st = lstat(path).map_err(io::Error::from)?;
    let fmt = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
    let typ = if fmt == SFlag::S_IFBLK {
        'b'
    } else if fmt == SFlag::S_IFCHR {
        'c'
    } else if fmt == SFlag::S_IFIFO {
        'p'
    } else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a device node",
        ));
    };
    Ok(NodeInfo {
        typ,
        major: major(st.st_rdev) as i64,
        minor: minor(st.st_rdev) as i64,
        mode: st.st_mode & 0o7777,
    })
}

fn device_type(t: &str) -> Option<LinuxDeviceType> {
    Some(match t {
        "b" => LinuxDeviceType::B,
        "c" => LinuxDeviceType::C,
        "u" => LinuxDeviceType::U,
        "p" => LinuxDeviceType::P,
        _ => return None,
    })
}

/// CDI's `fillMissingInfo`: the host node fills what the spec leaves out.
fn fill(node: &DeviceNode, lookup: &NodeLookup<'_>) -> Result<DeviceNode, CdiError> {
    let mut d = node.clone();
    let minimal = !d.typ.is_empty() && (d.major != 0 || d.typ == "p");
    if d.host_path.is_empty() {
        d.host_path = d.path.clone();
    }
    let info = match lookup(Path::new(&d.host_path)) {
        Ok(i) => i,
        Err(_) if minimal => return Ok(d),
        Err(source) => {
            return Err(CdiError::HostDevice {
                path: d.path.clone(),
                host_path: d.host_path.clone(),
                source,
            })
        }
    };
    if d.file_mode.is_none() {
        d.file_mode = Some(info.mode);
    }
    if minimal {
        return Ok(d);
    }
    let host = info.typ.to_string();
    if d.typ.is_empty() {
        d.typ = host.clone();
    }
    if d.typ != host {
        return Err(CdiError::TypeMismatch {
            path: d.path.clone(),
            host_path: d.host_path.clone(),
            given: d.typ.clone(),
            host,
        });
    }
    if d.typ != "p" && d.major == 0 {
        d.major = info.major;
        d.minor = info.minor;
    }
    Ok(d)
}

/// Number of path components of a mount destination (`/` counts as one), for the sort.
fn depth(dest: &Path) -> usize {
    dest.components()
        .filter(|c| matches!(c, std::path::Component::Normal(_)))
        .count()
        .max(1)
}

/// Adds `idmap` (bind) or `ridmap` (rbind) to a bind mount, as CDI does in a container with
/// ID-mapped user namespace.
fn idmap_options(typ: &str, options: &mut Vec<String>) {
    let mut option = (typ == "bind").then_some("idmap");
    for o in options.iter() {
        match o.as_str() {
            "idmap" | "ridmap" => return,
            "bind" => option = Some("idmap"),
            "rbind" => option = Some("ridmap"),
            _ => {}
        }
    }
    if let Some(o) = option {
        options.push(o.to_string());
    }
}

fn has_idmapped_userns(spec: &Spec) -> bool {
    spec.linux().as_ref().is_some_and(|l| {
        l.uid_mappings().as_ref().is_some_and(|m| !m.is_empty())
            && l.gid_mappings().as_ref().is_some_and(|m| !m.is_empty())
            && l.namespaces()
                .as_ref()
                .is_some_and(|ns| ns.iter().any(|n| n.typ() == LinuxNamespaceType::User))
    })
}

/// Applies `edits` (from [`super::Registry::resolve`]) to `spec`. The edits were validated
/// when their files were loaded.
pub fn apply(
    spec: &mut Spec,
    edits: &[ContainerEdits],
    lookup: &NodeLookup<'_>,
) -> Result<(), CdiError> {
    if edits.is_empty() {
        return Ok(());
    }
    let e = merge(edits);
    let (uid, gid) = spec
        .process()
        .as_ref()
        .map(|p| (p.user().uid(), p.user().gid()))
        .unwrap_or((0, 0));

    apply_env(spec, &e);

    if spec.linux().is_none() {
        spec.set_linux(Some(LinuxBuilder::default().build()?));
    }
    let userns = has_idmapped_userns(spec);
    {
        // Just set above.
        let linux = spec.linux_mut().get_or_insert_with(Default::default);
        apply_device_nodes(linux, &e, lookup, uid, gid)?;
        apply_net_devices(linux, &e);
        apply_intel_rdt(linux, &e)?;
    }

    apply_mounts(spec, &e, userns);
    apply_hooks(spec, &e)?;
    apply_additional_gids(spec, &e);
    Ok(())
}

/// The edits of all requested devices as one: lists concatenated, the last `intelRdt` wins.
fn merge(edits: &[ContainerEdits]) -> ContainerEdits {
    let mut e = ContainerEdits::default();
    for one in edits {
        e.append(one);
    }
    e
}

/// A variable of the same name is replaced in place, others appended.
fn apply_env(spec: &mut Spec, e: &ContainerEdits) {
    if !e.env.is_empty() {
        let process = spec.process_mut().get_or_insert_with(Process::default);
        let mut env = process.env().clone().unwrap_or_default();
        for v in &e.env {
            let key = v.split_once('=').map_or(v.as_str(), |(k, _)| k);
            match env
                .iter()
                .position(|x| x.split_once('=').map_or(x.as_str(), |(k, _)| k) == key)
            {
                Some(i) => env[i] = v.clone(),
                None => env.push(v.clone()),
            }
        }
        process.set_env(Some(env));
    }
}

/// Device nodes filled from the host and owned by the process's non-root uid/gid by default,
/// replacing one at the same path; block and char nodes also allowed in the device cgroup.
fn apply_device_nodes(
    linux: &mut Linux,
    e: &ContainerEdits,
    lookup: &NodeLookup<'_>,
    uid: u32,
    gid: u32,
) -> Result<(), CdiError> {
    let mut devices: Vec<LinuxDevice> = linux.devices().clone().unwrap_or_default();
    let mut resources = linux.resources().clone().unwrap_or_default();
    let mut rules = resources.devices().clone().unwrap_or_default();
    for node in &e.device_nodes {
        let d = fill(node, lookup)?;
        let typ = device_type(&d.typ).ok_or_else(|| CdiError::TypeMismatch {
            path: d.path.clone(),
            host_path: d.host_path.clone(),
            given: d.typ.clone(),
            host: String::new(),
        })?;
        let mut b = LinuxDeviceBuilder::default()
            .path(PathBuf::from(&d.path))
            .typ(typ)
            .major(d.major)
            .minor(d.minor);
        if let Some(m) = d.file_mode {
            b = b.file_mode(m);
        }
        if let Some(u) = d.uid.or((uid > 0).then_some(uid)) {
            b = b.uid(u);
        }
        if let Some(g) = d.gid.or((gid > 0).then_some(gid)) {
            b = b.gid(g);
        }
        let dev = b.build()?;
        devices.retain(|x| x.path() != dev.path());
        devices.push(dev);
        if matches!(typ, LinuxDeviceType::B | LinuxDeviceType::C) {
            let access = match d.permissions.as_str() {
                "" => "rwm",
                "none" => "",
                p => p,
            };
            rules.push(
                LinuxDeviceCgroupBuilder::default()
                    .allow(true)
                    .typ(typ)
                    .major(d.major)
                    .minor(d.minor)
                    .access(access)
                    .build()?,
            );
        }
    }
    if !e.device_nodes.is_empty() {
        linux.set_devices(Some(devices));
        resources.set_devices(Some(rules));
        linux.set_resources(Some(resources));
    }
    Ok(())
}

/// `linux.netDevices[host] = {name}`.
fn apply_net_devices(linux: &mut Linux, e: &ContainerEdits) {
    if !e.net_devices.is_empty() {
        let mut net = linux.net_devices().clone().unwrap_or_default();
        for n in &e.net_devices {
            let mut dev = LinuxNetDevice::default();
            dev.set_name(Some(n.name.clone()));
            net.insert(n.host_interface_name.clone(), dev);
        }
        linux.set_net_devices(Some(net));
    }
}

/// `intelRdt` set from the last edit that has one.
fn apply_intel_rdt(linux: &mut Linux, e: &ContainerEdits) -> Result<(), CdiError> {
    if let Some(rdt) = &e.intel_rdt {
        let mut b = LinuxIntelRdtBuilder::default();
        if !rdt.clos_id.is_empty() {
            b = b.clos_id(rdt.clos_id.clone());
        }
        if !rdt.l3_cache_schema.is_empty() {
            b = b.l3_cache_schema(rdt.l3_cache_schema.clone());
        }
        if !rdt.mem_bw_schema.is_empty() {
            b = b.mem_bw_schema(rdt.mem_bw_schema.clone());
        }
        if let Some(s) = &rdt.schemata {
            b = b.schemata(s.clone());
        }
        if rdt.enable_monitoring {
            b = b.enable_monitoring(true);
        }
        linux.set_intel_rdt(Some(b.build()?));
    }
    Ok(())
}

/// One mount already at the same destination replaced, bind mounts idmapped in a user
/// namespace, then all stably sorted by destination depth.
fn apply_mounts(spec: &mut Spec, e: &ContainerEdits, userns: bool) {
    if !e.mounts.is_empty() {
        let mut mounts: Vec<Mount> = spec.mounts().clone().unwrap_or_default();
        for m in &e.mounts {
            let dest = PathBuf::from(&m.container_path);
            if let Some(i) = mounts.iter().position(|x| x.destination() == &dest) {
                mounts.remove(i);
            }
            let mut options = m.options.clone();
            if userns {
                idmap_options(&m.typ, &mut options);
            }
            let mut mount = Mount::default();
            mount.set_destination(dest);
            mount.set_source(Some(PathBuf::from(&m.host_path)));
            mount.set_typ((!m.typ.is_empty()).then(|| m.typ.clone()));
            mount.set_options((!options.is_empty()).then_some(options));
            mount.set_uid_mappings(None);
            mount.set_gid_mappings(None);
            mounts.push(mount);
        }
        mounts.sort_by_key(|m| depth(m.destination()));
        spec.set_mounts(Some(mounts));
    }
}

/// Hooks appended to their phase.
fn apply_hooks(spec: &mut Spec, e: &ContainerEdits) -> Result<(), CdiError> {
    if !e.hooks.is_empty() {
        let hooks = spec.hooks_mut().get_or_insert_with(Hooks::default);
        for h in &e.hooks {
            let mut b = HookBuilder::default().path(PathBuf::from(&h.path));
            if !h.args.is_empty() {
                b = b.args(h.args.clone());
            }
            if !h.env.is_empty() {
                b = b.env(h.env.clone());
            }
            if let Some(t) = h.timeout {
                b = b.timeout(t);
            }
            let hook: Hook = b.build()?;
            #[allow(deprecated)]
            let list = match h.hook_name.as_str() {
                "prestart" => hooks.prestart_mut(),
                "createRuntime" => hooks.create_runtime_mut(),
                "createContainer" => hooks.create_container_mut(),
                "startContainer" => hooks.start_container_mut(),
                "poststart" => hooks.poststart_mut(),
                // Validated on load: the only other name.
                _ => hooks.poststop_mut(),
            };
            list.get_or_insert_with(Vec::new).push(hook);
        }
    }
    Ok(())
}

/// Additional gids appended, 0 ignored, no duplicates.
fn apply_additional_gids(spec: &mut Spec, e: &ContainerEdits) {
    let gids: Vec<u32> = e
        .additional_gids
        .iter()
        .copied()
        .filter(|&g| g != 0)
        .collect();
    if !gids.is_empty() {
        let process = spec.process_mut().get_or_insert_with(Process::default);
        let user = process.user_mut();
        let mut all = user.additional_gids().clone().unwrap_or_default();
        for g in gids {
            if !all.contains(&g) {
                all.push(g);
            }
        }
        user.set_additional_gids(Some(all));
    }
}
