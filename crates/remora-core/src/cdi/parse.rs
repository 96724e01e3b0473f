//! Parsing and validating CDI spec files and device names, following the CDI module
//! (`tags.cncf.io/container-device-interface` v1.1.2: `pkg/parser`, `specs-go/version.go`,
//! `pkg/cdi/container-edits.go`), a little stricter where the spec text says MUST: container
//! paths and hook paths must be absolute, hook timeouts positive.

use std::path::Path;

use super::spec::{ContainerEdits, Spec};

/// Known spec versions, oldest first (specs-go v1.1.1 `validSpecVersions`). 0.1.0 and 0.2.0
/// are known but every spec needs at least 0.3.0 ([`minimum_version`]), so they are refused.
const VERSIONS: [&str; 10] = [
    "0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0",
];

/// The newest spec version this parser knows.
pub const CURRENT_VERSION: &str = "1.1.0";

/// The annotation prefix under which kubelet (device plugins) passes CDI device names.
pub const ANNOTATION_PREFIX: &str = "cdi.k8s.io/";

/// Why a spec file is refused.
pub type Invalid = String;

fn is_alnum(c: u8) -> bool {
    c.is_ascii_alphanumeric()
}

/// Vendor and class names: a letter first, a letter or digit last, `_ - .` and alphanumerics
/// between (CDI's `validateVendorOrClassName`).
fn vendor_or_class(name: &str) -> Result<(), &'static str> {
    let b = name.as_bytes();
    let (Some(&first), Some(&last)) = (b.first(), b.last()) else {
        return Err("empty vendor or class");
    };
    if !first.is_ascii_alphabetic() {
        return Err("vendor and class must start with a letter");
    }
    if b.len() > 1 && !is_alnum(last) {
        return Err("vendor and class must end with a letter or digit");
    }
    if b.len() > 2
        && !b[1..b.len() - 1]
            .iter()
            .all(|&c| is_alnum(c) || matches!(c, b'_' | b'-' | b'.'))
    {
        return Err("vendor and class may hold only letters, digits, '_', '-' and '.'");
    }
    Ok(())
}

/// Device names: a letter or digit first and last, `_ - . :` and alphanumerics between
/// (CDI's `ValidateDeviceName`).
fn device_name(name: &str) -> Result<(), &'static str> {
    let b = name.as_bytes();
    let (Some(&first), Some(&last)) = (b.first(), b.last()) else {
        return Err("empty device name");
    };
    if !is_alnum(first) || !is_alnum(last) {
        return Err("a device name must start and end with a letter or digit");
    }
    if b.len() > 2
        && !b[1..b.len() - 1]
            .iter()
            .all(|&c| is_alnum(c) || matches!(c, b'_' | b'-' | b'.' | b':'))
    {
        return Err("a device name may hold only letters, digits, '_', '-', '.' and ':'");
    }
    Ok(())
}

/// `vendor/class` → (vendor, class), as CDI's `ParseQualifier` cuts it (at the first `/`).
fn qualifier(kind: &str) -> Option<(&str, &str)> {
    let (vendor, class) = kind.split_once('/')?;
    (!vendor.is_empty() && !class.is_empty()).then_some((vendor, class))
}

/// A fully qualified device name `vendor/class=name` → (`vendor/class`, `name`), checked
/// (CDI's `ParseQualifiedName`).
pub fn qualified_name(device: &str) -> Result<(&str, &str), &'static str> {
    const UNQUALIFIED: &str = "not a fully qualified CDI device name (vendor/class=name)";
    if device.starts_with('/') {
        return Err(UNQUALIFIED);
    }
    let (kind, name) = device.split_once('=').ok_or(UNQUALIFIED)?;
    let (vendor, class) = qualifier(kind).ok_or(UNQUALIFIED)?;
    if name.is_empty() {
        return Err(UNQUALIFIED);
    }
    vendor_or_class(vendor)?;
    vendor_or_class(class)?;
    device_name(name)?;
    Ok((kind, name))
}

/// An annotation value that is no list of qualified names: (key, the bad name, why).
pub type BadAnnotation = (String, String, &'static str);

/// The device names in a container's annotations: every `cdi.k8s.io/*` value is a
/// comma-separated list of qualified names, as CDI's `ParseAnnotations` reads it (no spaces
/// trimmed). Keys in sorted order, so that the result does not depend on map order; each
/// name comes with the annotation key it came from.
pub fn annotation_devices<'a>(
    annotations: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> Result<Vec<(String, String)>, BadAnnotation> {
    let mut keys: Vec<(&String, &String)> = annotations
        .into_iter()
        .filter(|(k, _)| k.starts_with(ANNOTATION_PREFIX))
        .collect();
    keys.sort();
    let mut out = Vec::new();
    for (key, value) in keys {
        for name in value.split(',') {
            qualified_name(name).map_err(|reason| (key.clone(), name.to_string(), reason))?;
            out.push((key.clone(), name.to_string()));
        }
    }
    Ok(out)
}

fn version_index(v: &str) -> Option<usize> {
    VERSIONS.iter().position(|k| *k == v)
}

/// The oldest version whose fields a spec uses (specs-go's `MinimumRequiredVersion`).
pub fn minimum_version(spec: &Spec) -> &'static str {
    let edits = || {
        std::iter::once(&spec.container_edits)
            .chain(spec.devices.iter().map(|d| &d.container_edits))
    };
    let v110 = edits().any(|e| {
        !e.net_devices.is_empty()
            || e.intel_rdt
                .as_ref()
                .is_some_and(|r| r.schemata.is_some() || r.enable_monitoring)
    });
    if v110 {
        return "1.1.0";
    }
    if edits().any(|e| e.intel_rdt.is_some() || !e.additional_gids.is_empty()) {
        return "0.7.0";
    }
    let dotted_class = qualifier(&spec.kind).is_some_and(|(_, class)| class.contains('.'));
    if !spec.annotations.is_empty()
        || spec.devices.iter().any(|d| !d.annotations.is_empty())
        || dotted_class
    {
        return "0.6.0";
    }
    if spec
        .devices
        .iter()
        .any(|d| d.name.as_bytes().first().is_some_and(u8::is_ascii_digit))
        || edits().any(|e| e.device_nodes.iter().any(|n| !n.host_path.is_empty()))
    {
        return "0.5.0";
    }
    if edits().any(|e| e.mounts.iter().any(|m| !m.typ.is_empty())) {
        return "0.4.0";
    }
    "0.3.0"
}

fn check_env(env: &[String], what: &str) -> Result<(), Invalid> {
    match env.iter().find(|v| v.find('=').is_none_or(|i| i == 0)) {
        Some(v) => Err(format!("{what}: invalid environment variable {v:?}")),
        None => Ok(()),
    }
}

fn absolute(path: &str, what: &str) -> Result<(), Invalid> {
    if Path::new(path).is_absolute() {
        Ok(())
    } else {
        Err(format!("{what} {path:?} is not an absolute path"))
    }
}

/// Checks one set of container edits (CDI's `ContainerEdits.Validate`, plus absolute paths).
pub fn validate_edits(e: &ContainerEdits) -> Result<(), Invalid> {
    check_env(&e.env, "env")?;
    for d in &e.device_nodes {
        absolute(&d.path, "device node path")?;
        if !d.host_path.is_empty() {
            absolute(&d.host_path, "device node hostPath")?;
        }
        if !matches!(d.typ.as_str(), "" | "b" | "c" | "u" | "p") {
            return Err(format!("device {:?}: invalid type {:?}", d.path, d.typ));
        }
        if d.major < 0 || d.minor < 0 {
            return Err(format!(
                "device {:?}: negative device number {}:{}",
                d.path, d.major, d.minor
            ));
        }
        if d.permissions != "none" && !d.permissions.chars().all(|c| matches!(c, 'r' | 'w' | 'm')) {
            return Err(format!(
                "device {:?}: invalid permissions {:?}",
                d.path, d.permissions
            ));
        }
    }
    for h in &e.hooks {
        if !matches!(
            h.hook_name.as_str(),
            "prestart"
                | "createRuntime"
                | "createContainer"
                | "startContainer"
                | "poststart"
                | "poststop"
        ) {
            return Err(format!("invalid hook name {:?}", h.hook_name));
        }
        absolute(&h.path, "hook path")?;
        check_env(&h.env, "hook env")?;
        if h.timeout.is_some_and(|t| t <= 0) {
            return Err(format!(
                "hook {:?}: timeout must be greater than zero",
                h.path
            ));
        }
    }
    for m in &e.mounts {
        if m.host_path.is_empty() {
            return Err("mount with an empty hostPath".into());
        }
        absolute(&m.container_path, "mount containerPath")?;
    }
    if let Some(rdt) = &e.intel_rdt {
        let c = rdt.clos_id.as_str();
        if c != "/" && (c.len() >= 4096 || c == "." || c == ".." || c.contains(['/', '\n'])) {
            return Err(format!("invalid intelRdt closID {c:?}"));
        }
    }
    let mut hosts = std::collections::HashSet::new();
    let mut names = std::collections::HashSet::new();
    for n in &e.net_devices {
        if n.host_interface_name.is_empty() || n.name.is_empty() {
            return Err("net device with an empty hostInterfaceName or name".into());
        }
        if !hosts.insert(&n.host_interface_name) || !names.insert(&n.name) {
            return Err(format!(
                "duplicate net device {:?} -> {:?}",
                n.host_interface_name, n.name
            ));
        }
    }
    Ok(())
}

/// Checks a parsed spec: version (known, and not older than the fields it uses), kind,
/// edits, device names (valid, unique, at least one) and each device's edits (not empty).
pub fn validate(spec: &Spec) -> Result<(), Invalid> {
    let version = spec.version.strip_prefix('v').unwrap_or(&spec.version);
    let given = version_index(version).ok_or_else(|| {
        format!(
            "unknown cdiVersion {:?} (known: 0.1.0 to {CURRENT_VERSION})",
            spec.version
        )
    })?;
    let min = minimum_version(spec);
    if version_index(min).is_some_and(|m| m > given) {
        return Err(format!(
            "cdiVersion {:?} is too old for the fields used: at least {min} is needed",
            spec.version
        ));
    }
    let (vendor, class) = qualifier(&spec.kind)
        .ok_or_else(|| format!("invalid kind {:?}: expected vendor/class", spec.kind))?;
    vendor_or_class(vendor)
        .and_then(|()| vendor_or_class(class))
        .map_err(|reason| format!("invalid kind {:?}: {reason}", spec.kind))?;
    validate_edits(&spec.container_edits)?;
    if spec.devices.is_empty() {
        return Err("no devices".into());
    }
    let mut seen = std::collections::HashSet::new();
    for d in &spec.devices {
        device_name(&d.name).map_err(|reason| format!("device {:?}: {reason}", d.name))?;
        if !seen.insert(d.name.as_str()) {
            return Err(format!("device {:?} defined twice", d.name));
        }
        if d.container_edits.is_empty() {
            return Err(format!("device {:?} has no container edits", d.name));
        }
        validate_edits(&d.container_edits).map_err(|e| format!("device {:?}: {e}", d.name))?;
    }
    Ok(())
}

/// Parses a spec file's text: JSON for `.json`, YAML otherwise (CDI reads both with a YAML
/// decoder; JSON is read here by serde_json, which accepts the same documents), then checks it.
pub fn parse(text: &str, json: bool) -> Result<Spec, Invalid> {
    let spec: Spec = if json {
        serde_json::from_str(text).map_err(|e| e.to_string())?
    } else {
        serde_saphyr::from_str(text).map_err(|e| e.to_string())?
    };
    validate(&spec)?;
    Ok(spec)
}
