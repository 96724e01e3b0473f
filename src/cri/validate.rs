//! Checks of CRI request values that would otherwise fail late, or escape.
//!
//! [`super::convert`] calls these while it maps a request, so a bad value is refused with
//! `INVALID_ARGUMENT` naming the field *before* anything is reserved or created (a name, a
//! netns, a snapshot). Without them such values reached runc or the kernel at task start and
//! came back as `UNKNOWN`/`UNAVAILABLE`, or went where they should not (a `..` in a log path,
//! a newline in a hostname written to `/etc/hosts`, a `;` in a pod name passed in `CNI_ARGS`).
//!
//! Limits, and why:
//!
//! - pod name, namespace, uid and container name: at most [`MAX_NAME_LEN`] (253) bytes of
//!   letters, digits, `.`, `-`, `_`, and not `.` or `..`. 253 is Kubernetes' limit for object
//!   names (DNS-1123 subdomain); the character set is Kubernetes' plus upper case and `_`
//!   (critest uses mixed-case names). Names go into `CNI_ARGS`, name keys and labels, where
//!   `/`, `;`, `=`, whitespace and NUL have meanings of their own.
//! - hostname: at most 64 bytes (the kernel's `HOST_NAME_MAX`: `sethostname` refuses more),
//!   same characters; it is written into `/etc/hostname` and `/etc/hosts`.
//! - labels: a non-empty key, key + value at most 4096 bytes (containerd's label limit: labels
//!   are stored on the containerd record).
//! - annotations: non-empty keys, keys + values at most 512 KiB in all: twice Kubernetes'
//!   limit on a pod's annotations (`TotalAnnotationSizeLimitB`, 256 KiB), which kubelet
//!   passes on with a few of its own, so no valid pod is refused; they are copied into the
//!   OCI spec, the record and every ContainerEvent, so megabytes are not welcome.
//! - paths: host paths (`log_directory`, mount `host_path`) and container paths (mount
//!   `container_path`, `working_dir`) absolute; `log_path` relative to the pod's log directory;
//!   none with a `..` component or a NUL byte; a mount never at the container's `/`.
//! - sysctls: see [`crate::spec::sysctl`].
//! - resources: no negative CPU period/quota/shares or memory limits, `oom_score_adj` within
//!   -1000..=1000 (the kernel's range), cpusets of digits, `,` and `-`.
//!
//! Long values are cut in error messages ([`shown`]): a megabyte annotation is not echoed.

use std::collections::HashMap;
use std::path::{Component, Path};

use super::error::ConvertError;

/// Longest pod name, namespace, uid or container name (Kubernetes' object name limit).
pub const MAX_NAME_LEN: usize = 253;
/// Longest hostname (`HOST_NAME_MAX`).
pub const MAX_HOSTNAME_LEN: usize = 64;
/// Longest label key + value (containerd's `labels.Validate`).
pub const MAX_LABEL_LEN: usize = 4096;
/// Most bytes of annotation keys and values together (twice Kubernetes' limit).
pub const MAX_ANNOTATIONS_LEN: usize = 512 * 1024;
/// Longest DNS search domain.
const MAX_DOMAIN_LEN: usize = 253;
/// How much of a value an error message repeats.
const SHOWN_LEN: usize = 64;

/// `value` for an error message: cut after [`SHOWN_LEN`] bytes (at a char boundary).
pub fn shown(value: &str) -> String {
    if value.len() <= SHOWN_LEN {
        return value.to_owned();
    }
    let mut end = SHOWN_LEN;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &value[..end], value.len())
}

fn invalid(field: impl Into<String>, value: &str, reason: &'static str) -> ConvertError {
    ConvertError::Invalid {
        field: field.into(),
        value: shown(value),
        reason,
    }
}

fn name_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_')
}

/// A pod name, namespace, uid or container name (non-emptiness is checked by the caller,
/// which reports it as missing).
pub fn name(field: &str, value: &str) -> Result<(), ConvertError> {
    if value.len() > MAX_NAME_LEN {
        return Err(invalid(field, value, "longer than 253 bytes"));
    }
    if !value.bytes().all(name_char) {
        return Err(invalid(
            field,
            value,
            "may contain only letters, digits, '.', '-' and '_'",
        ));
    }
    if value == "." || value == ".." {
        return Err(invalid(field, value, "must not be . or .."));
    }
    Ok(())
}

/// The pod's hostname; empty means the node's.
pub fn hostname(field: &str, value: &str) -> Result<(), ConvertError> {
    if value.len() > MAX_HOSTNAME_LEN {
        return Err(invalid(
            field,
            value,
            "longer than 64 bytes (the kernel's limit)",
        ));
    }
    if !value.bytes().all(name_char) {
        return Err(invalid(
            field,
            value,
            "may contain only letters, digits, '.', '-' and '_'",
        ));
    }
    Ok(())
}

fn no_nul(field: &str, value: &str) -> Result<(), ConvertError> {
    if value.contains('\0') {
        return Err(invalid(field, value, "contains a NUL byte"));
    }
    Ok(())
}

fn has_parent_component(value: &str) -> bool {
    Path::new(value)
        .components()
        .any(|c| c == Component::ParentDir)
}

/// An absolute path without `..` components or NUL bytes.
pub fn absolute_path(field: &str, value: &str) -> Result<(), ConvertError> {
    no_nul(field, value)?;
    if !value.starts_with('/') {
        return Err(invalid(field, value, "must be an absolute path"));
    }
    if has_parent_component(value) {
        return Err(invalid(field, value, "must not contain a `..` component"));
    }
    Ok(())
}

/// The longest image volume sub path accepted: Linux's `PATH_MAX`.
pub const MAX_IMAGE_SUB_PATH_LEN: usize = 4096;

/// A mount's `image_sub_path`: relative (to the image's root), without NUL, at most
/// [`MAX_IMAGE_SUB_PATH_LEN`] bytes. `..` and symlinks are not refused here: CreateContainer
/// resolves them inside the image, where they cannot lead out of it (as containerd's
/// `os.OpenInRoot` does).
pub fn image_sub_path(field: &str, value: &str) -> Result<(), ConvertError> {
    no_nul(field, value)?;
    if value.len() > MAX_IMAGE_SUB_PATH_LEN {
        return Err(invalid(field, value, "is longer than 4096 bytes"));
    }
    if value.starts_with('/') {
        return Err(invalid(
            field,
            value,
            "must be relative to the image's root",
        ));
    }
    Ok(())
}

/// A mount's `container_path`: absolute, no `..`, not the container's root.
pub fn mount_destination(field: &str, value: &str) -> Result<(), ConvertError> {
    absolute_path(field, value)?;
    if !Path::new(value)
        .components()
        .any(|c| matches!(c, Component::Normal(_)))
    {
        return Err(invalid(field, value, "must not be the container's root"));
    }
    Ok(())
}

/// A container's `log_path`: relative to the pod's log directory, naming a file in it.
pub fn log_path(field: &str, value: &str) -> Result<(), ConvertError> {
    no_nul(field, value)?;
    if value.starts_with('/') {
        return Err(invalid(
            field,
            value,
            "must be relative to the pod's log_directory",
        ));
    }
    if has_parent_component(value) {
        return Err(invalid(field, value, "must not contain a `..` component"));
    }
    if !Path::new(value)
        .components()
        .any(|c| matches!(c, Component::Normal(_)))
    {
        return Err(invalid(field, value, "must name a file"));
    }
    Ok(())
}

/// A cgroup parent: a cgroupfs path or a systemd slice name; no `..`, no NUL.
pub fn cgroup_parent(field: &str, value: &str) -> Result<(), ConvertError> {
    no_nul(field, value)?;
    if has_parent_component(value) {
        return Err(invalid(field, value, "must not contain a `..` component"));
    }
    Ok(())
}

/// Labels (stored as containerd labels).
pub fn labels(prefix: &str, labels: &HashMap<String, String>) -> Result<(), ConvertError> {
    for (k, v) in labels {
        if k.is_empty() {
            return Err(invalid(prefix, v, "a label key must not be empty"));
        }
        if k.len() + v.len() > MAX_LABEL_LEN {
            return Err(invalid(
                format!("{prefix}[{}]", shown(k)),
                v,
                "label key and value are longer than 4096 bytes together",
            ));
        }
    }
    Ok(())
}

/// Annotations (copied into the OCI spec and the record).
pub fn annotations(
    prefix: &str,
    annotations: &HashMap<String, String>,
) -> Result<(), ConvertError> {
    let mut total = 0usize;
    for (k, v) in annotations {
        if k.is_empty() {
            return Err(invalid(prefix, v, "an annotation key must not be empty"));
        }
        total = total.saturating_add(k.len()).saturating_add(v.len());
    }
    if total > MAX_ANNOTATIONS_LEN {
        return Err(ConvertError::Invalid {
            field: prefix.to_owned(),
            value: format!("{total} bytes"),
            reason: "annotations are longer than 512 KiB together",
        });
    }
    Ok(())
}

/// The pod's sysctls, against its network and IPC modes.
pub fn sysctls(
    prefix: &str,
    sysctls: &HashMap<String, String>,
    host_network: bool,
    host_ipc: bool,
) -> Result<(), ConvertError> {
    for (k, v) in sysctls {
        crate::spec::sysctl::check(k, v, host_network, host_ipc)
            .map_err(|reason| invalid(format!("{prefix}[{}]", shown(k)), v, reason))?;
    }
    Ok(())
}

/// The process: no NUL in `command`, `args` and env (the kernel cannot pass them), env keys
/// non-empty and without `=`, and an absolute `working_dir` (runc's rule) when set.
pub fn process(
    prefix: &str,
    command: &[String],
    args: &[String],
    envs: &[(String, String)],
    working_dir: &str,
) -> Result<(), ConvertError> {
    for (i, c) in command.iter().enumerate() {
        no_nul(&format!("{prefix}.command[{i}]"), c)?;
    }
    for (i, a) in args.iter().enumerate() {
        no_nul(&format!("{prefix}.args[{i}]"), a)?;
    }
    for (i, (k, v)) in envs.iter().enumerate() {
        let field = format!("{prefix}.envs[{i}]");
        if k.is_empty() {
            return Err(invalid(format!("{field}.key"), k, "must not be empty"));
        }
        if k.contains('=') {
            return Err(invalid(format!("{field}.key"), k, "must not contain '='"));
        }
        no_nul(&format!("{field}.key"), k)?;
        no_nul(&format!("{field}.value"), v)?;
    }
    if !working_dir.is_empty() {
        absolute_path(&format!("{prefix}.working_dir"), working_dir)?;
    }
    Ok(())
}

/// Container resources (CRI's zero means "not set").
pub fn resources(prefix: &str, r: &crate::spec::Resources) -> Result<(), ConvertError> {
    // The spec generator's own rules, applied before anything is made.
    match crate::spec::resources::check(r) {
        Ok(()) => {}
        Err(crate::spec::SpecError::NegativeResource { field, value }) => {
            return Err(invalid(
                format!("{prefix}.{field}"),
                &value.to_string(),
                "must not be negative",
            ))
        }
        Err(crate::spec::SpecError::CpuQuotaBelowNoLimit { value }) => {
            return Err(invalid(
                format!("{prefix}.cpu_quota"),
                &value.to_string(),
                "must be -1 (no limit) or not negative",
            ))
        }
        Err(crate::spec::SpecError::InvalidOomScoreAdj { value }) => {
            return Err(invalid(
                format!("{prefix}.oom_score_adj"),
                &value.to_string(),
                "must be between -1000 and 1000",
            ))
        }
        // `check` returns only the three errors above.
        Err(_) => return Err(invalid(prefix.to_string(), "", "is not valid")),
    }
    for (field, value) in [
        ("cpuset_cpus", &r.cpuset_cpus),
        ("cpuset_mems", &r.cpuset_mems),
    ] {
        if !value
            .bytes()
            .all(|b| b.is_ascii_digit() || b == b',' || b == b'-')
        {
            return Err(invalid(
                format!("{prefix}.{field}"),
                value,
                "must be a list of numbers and ranges like 0-3,5",
            ));
        }
    }
    for (k, v) in &r.unified {
        if k.is_empty() || k.contains('/') || k == "." || k == ".." || k.contains('\0') {
            return Err(invalid(
                format!("{prefix}.unified[{}]", shown(k)),
                v,
                "a unified key must be a cgroup file name",
            ));
        }
    }
    Ok(())
}

/// Most unified entries a pod's recorded resources may carry (cgroup v2 has a few dozen
/// files per controller a kubelet would set).
pub const MAX_RECORDED_UNIFIED: usize = 64;
/// Most hugepage limits a pod's recorded resources may carry (one per page size).
pub const MAX_RECORDED_HUGEPAGES: usize = 8;
/// Longest string (cpuset list, unified key or value, page size) a pod's recorded resources
/// may carry.
pub const MAX_RECORDED_STRING: usize = 1024;

/// Resources remora stores on a record (UpdatePodSandboxResources) rather than hands to the
/// runtime: besides [`resources`]' rules, bounded, so a hostile request cannot grow the
/// sandbox's containerd record (rewritten on every call) without limit.
pub fn recorded_resources(prefix: &str, r: &crate::spec::Resources) -> Result<(), ConvertError> {
    resources(prefix, r)?;
    let long = |s: &str| s.len() > MAX_RECORDED_STRING;
    for (field, value) in [
        ("cpuset_cpus", &r.cpuset_cpus),
        ("cpuset_mems", &r.cpuset_mems),
    ] {
        if long(value) {
            return Err(invalid(format!("{prefix}.{field}"), value, "is too long"));
        }
    }
    if r.unified.len() > MAX_RECORDED_UNIFIED {
        return Err(invalid(
            format!("{prefix}.unified"),
            &r.unified.len().to_string(),
            "has too many entries",
        ));
    }
    for (k, v) in &r.unified {
        if long(k) || long(v) {
            return Err(invalid(
                format!("{prefix}.unified[{}]", shown(k)),
                v,
                "key or value is too long",
            ));
        }
    }
    if r.hugepage_limits.len() > MAX_RECORDED_HUGEPAGES {
        return Err(invalid(
            format!("{prefix}.hugepage_limits"),
            &r.hugepage_limits.len().to_string(),
            "has too many entries",
        ));
    }
    for (i, h) in r.hugepage_limits.iter().enumerate() {
        let size = h.page_size.trim_end_matches(['K', 'M', 'G', 'B']);
        if size.is_empty()
            || !size.bytes().all(|b| b.is_ascii_digit())
            || !h.page_size.ends_with('B')
            || h.page_size.len() > 16
        {
            return Err(invalid(
                format!("{prefix}.hugepage_limits[{i}].page_size"),
                &h.page_size,
                "must be a page size like 2MB or 1GB",
            ));
        }
    }
    Ok(())
}

/// DNS settings written into the pod's resolv.conf: servers are IP addresses; search domains
/// and options are single words.
pub fn dns(
    prefix: &str,
    servers: &[String],
    searches: &[String],
    options: &[String],
) -> Result<(), ConvertError> {
    for (i, s) in servers.iter().enumerate() {
        if s.parse::<std::net::IpAddr>().is_err() {
            return Err(invalid(
                format!("{prefix}.servers[{i}]"),
                s,
                "must be an IP address",
            ));
        }
    }
    let word = |b: u8| b.is_ascii_graphic();
    for (i, s) in searches.iter().enumerate() {
        if s.is_empty() || s.len() > MAX_DOMAIN_LEN || !s.bytes().all(word) {
            return Err(invalid(
                format!("{prefix}.searches[{i}]"),
                s,
                "must be a domain name of at most 253 bytes without spaces",
            ));
        }
    }
    for (i, s) in options.iter().enumerate() {
        if s.is_empty() || !s.bytes().all(word) {
            return Err(invalid(
                format!("{prefix}.options[{i}]"),
                s,
                "must be a single word such as ndots:5",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(r: Result<(), ConvertError>) -> String {
        match r {
            Err(ConvertError::Invalid { reason, .. }) => reason.to_string(),
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    fn field(r: Result<(), ConvertError>) -> String {
        match r {
            Err(ConvertError::Invalid { field, .. }) => field,
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn recorded_resources_are_bounded_and_name_the_field() {
        use crate::spec::{HugepageLimit, Resources};
        let ok = Resources {
            cpu_shares: 2,
            cpuset_cpus: "0-3".into(),
            hugepage_limits: vec![HugepageLimit {
                page_size: "2MB".into(),
                limit: 1 << 21,
            }],
            unified: [("memory.high".to_string(), "max".to_string())].into(),
            ..Default::default()
        };
        recorded_resources("resources", &ok).unwrap();
        let with = |edit: fn(&mut Resources)| {
            let mut r = ok.clone();
            edit(&mut r);
            field(recorded_resources("resources", &r))
        };
        assert_eq!(with(|r| r.cpu_quota = -2), "resources.cpu_quota");
        assert_eq!(
            with(|r| r.cpuset_mems = "0,".repeat(600)),
            "resources.cpuset_mems"
        );
        assert_eq!(
            with(|r| r.unified = (0..65).map(|i| (format!("k{i}"), String::new())).collect()),
            "resources.unified"
        );
        assert_eq!(
            with(|r| {
                r.unified.insert("memory.max".into(), "9".repeat(2000));
            }),
            "resources.unified[memory.max]"
        );
        assert_eq!(
            with(|r| r.hugepage_limits[0].page_size = "2MB/../x".into()),
            "resources.hugepage_limits[0].page_size"
        );
        assert_eq!(
            with(|r| r.hugepage_limits = vec![r.hugepage_limits[0].clone(); 9]),
            "resources.hugepage_limits"
        );
    }

    #[test]
    fn names() {
        for ok in [
            "nginx-7c5ddbdf54-x2x4q",
            "PodSandbox-for-create-test-0a1f63d6",
            "kube_system",
            "a.b",
            &"a".repeat(253),
        ] {
            assert_eq!(name("f", ok), Ok(()), "{ok}");
        }
        assert!(reason(name("f", &"a".repeat(254))).contains("253"));
        for bad in ["a/b", "a\0b", "a b", "a;b", "a=b", "ä", "a\nb"] {
            assert!(reason(name("f", bad)).contains("only letters"), "{bad:?}");
        }
        assert!(name("f", "..").is_err());
        assert!(name("f", ".").is_err());
    }

    #[test]
    fn hostnames() {
        assert_eq!(hostname("hostname", ""), Ok(()));
        assert_eq!(hostname("hostname", &"h".repeat(64)), Ok(()));
        assert!(reason(hostname("hostname", &"h".repeat(65))).contains("64"));
        assert!(hostname("hostname", "a\n1.2.3.4 evil").is_err());
    }

    #[test]
    fn paths() {
        assert_eq!(absolute_path("p", "/var/log/pods/x"), Ok(()));
        assert_eq!(absolute_path("p", "/var/./log//x/"), Ok(()));
        assert!(reason(absolute_path("p", "var/log")).contains("absolute"));
        assert!(reason(absolute_path("p", "/var/../etc")).contains(".."));
        assert!(reason(absolute_path("p", "/var/log\0x")).contains("NUL"));
        assert_eq!(mount_destination("p", "/data"), Ok(()));
        assert!(reason(mount_destination("p", "/")).contains("root"));
        assert!(reason(mount_destination("p", "/./")).contains("root"));
        assert!(mount_destination("p", "data").is_err());
        assert!(mount_destination("p", "/data/../..").is_err());

        assert_eq!(log_path("l", "nginx/0.log"), Ok(()));
        assert!(reason(log_path("l", "/var/log/x.log")).contains("relative"));
        assert!(reason(log_path("l", "../../etc/passwd")).contains(".."));
        assert!(reason(log_path("l", "a/../../b")).contains(".."));
        assert!(reason(log_path("l", ".")).contains("file"));
        assert!(log_path("l", "a\0").is_err());

        assert_eq!(cgroup_parent("c", "/kubepods/burstable/pod1"), Ok(()));
        assert_eq!(cgroup_parent("c", "kubepods-burstable.slice"), Ok(()));
        assert!(cgroup_parent("c", "/kubepods/../../x").is_err());
    }

    #[test]
    fn labels_and_annotations_sizes() {
        let m = |k: &str, v: usize| HashMap::from([(k.to_owned(), "v".repeat(v))]);
        assert_eq!(labels("labels", &m("k", 4095)), Ok(()));
        let err = labels("labels", &m("k", 4096)).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("labels[k]") && text.contains("4096"),
            "{text}"
        );
        assert!(text.len() < 300, "the value is not echoed whole: {text}");
        assert!(labels("labels", &m("", 1)).is_err());
        assert_eq!(annotations("annotations", &m("k", 512 * 1024 - 1)), Ok(()));
        let text = annotations("annotations", &m("k", 1 << 20))
            .unwrap_err()
            .to_string();
        assert!(text.contains("512 KiB"), "{text}");
        assert!(annotations("annotations", &m("", 1)).is_err());
    }

    #[test]
    fn process_fields() {
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let env = |k: &str, v: &str| vec![(k.to_owned(), v.to_owned())];
        assert_eq!(
            process("c", &s(&["sh"]), &s(&["-c", "x"]), &env("A", "b=c"), "/w"),
            Ok(())
        );
        assert!(process("c", &s(&["s\0h"]), &[], &[], "").is_err());
        assert!(process("c", &[], &s(&["\0"]), &[], "").is_err());
        assert!(process("c", &[], &[], &env("A=B", "c"), "").is_err());
        assert!(process("c", &[], &[], &env("", "c"), "").is_err());
        assert!(process("c", &[], &[], &env("A", "\0"), "").is_err());
        let err = process("c", &[], &[], &[], "relative").unwrap_err();
        assert!(err.to_string().contains("c.working_dir"), "{err}");
    }

    #[test]
    fn resource_values() {
        use crate::spec::Resources;
        assert_eq!(resources("r", &Resources::default()), Ok(()));
        // kubelet's "no quota": UpdatePodSandboxResources for a pod without a CPU limit, in an
        // in-place resize (the conformance test "resize pod via the replace endpoint").
        let no_limit = Resources {
            cpu_quota: -1,
            cpu_period: 100_000,
            ..Default::default()
        };
        assert_eq!(resources("r", &no_limit), Ok(()));
        for (f, r) in [
            (
                "r.cpu_shares",
                Resources {
                    cpu_shares: -2,
                    ..Default::default()
                },
            ),
            (
                "r.cpu_quota",
                Resources {
                    cpu_quota: -2,
                    ..Default::default()
                },
            ),
            (
                "r.cpu_period",
                Resources {
                    cpu_period: -1,
                    ..Default::default()
                },
            ),
            (
                "r.memory_limit_in_bytes",
                Resources {
                    memory_limit_in_bytes: i64::MIN,
                    ..Default::default()
                },
            ),
            (
                "r.oom_score_adj",
                Resources {
                    oom_score_adj: 1001,
                    ..Default::default()
                },
            ),
            (
                "r.oom_score_adj",
                Resources {
                    oom_score_adj: -1001,
                    ..Default::default()
                },
            ),
            (
                "r.cpuset_cpus",
                Resources {
                    cpuset_cpus: "0-1\n".into(),
                    ..Default::default()
                },
            ),
            (
                "r.unified[../x]",
                Resources {
                    unified: HashMap::from([("../x".into(), "1".into())]),
                    ..Default::default()
                },
            ),
        ] {
            let err = resources("r", &r).unwrap_err();
            assert!(
                matches!(&err, ConvertError::Invalid { field, .. } if field == f),
                "{f}: {err}"
            );
        }
        let edge = Resources {
            oom_score_adj: -1000,
            cpuset_cpus: "0-3,5".into(),
            ..Default::default()
        };
        assert_eq!(resources("r", &edge), Ok(()));
    }

    #[test]
    fn dns_entries() {
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            dns(
                "d",
                &s(&["10.96.0.10", "fd00::a"]),
                &s(&["svc.cluster.local"]),
                &s(&["ndots:5"])
            ),
            Ok(())
        );
        assert!(dns("d", &s(&["nameserver 1.1.1.1"]), &[], &[]).is_err());
        assert!(dns("d", &[], &s(&["a\nnameserver 6.6.6.6"]), &[]).is_err());
        assert!(dns("d", &[], &[], &s(&["ndots:5 rotate"])).is_err());
    }

    #[test]
    fn shown_cuts_long_values_at_char_boundaries() {
        assert_eq!(shown("short"), "short");
        let long = "é".repeat(100);
        let s = shown(&long);
        assert!(s.ends_with("(200 bytes)") && s.len() < 90, "{s}");
    }
}
