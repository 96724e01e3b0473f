//! The pod network config written from a template once kubelet names the node's pod CIDRs
//! (`UpdateRuntimeConfig`), as containerd's CRI does with its `conf_template`.
//!
//! Design, following containerd (`internal/cri/server/update_runtime_config.go`): nothing is
//! written while a usable network config is already in the conf dir (another component, e.g. a
//! CNI daemonset, owns the network), nor when no template is configured (the operator drops the
//! config themselves); otherwise the template is rendered into
//! `<conf_dir>/10-remora-net.conflist`, written atomically (temp file + rename, so the network
//! loader never reads half a file), and NetworkReady follows the new file.
//!
//! The template is plain text with placeholders, not a Go template: `{{.PodCIDR}}` is the
//! first CIDR; `{{.PodCIDRRanges}}` a JSON array of host-local range sets, one per CIDR
//! (`[[{"subnet":"10.88.0.0/16"}],[{"subnet":"fd00::/64"}]]`), for the `ipam.ranges` key;
//! `{{.Routes}}` a JSON array of default routes, one per address family present
//! (`[{"dst":"0.0.0.0/0"},{"dst":"::/0"}]`). The rendered text must be JSON.

use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use thiserror::Error;

/// The file the template is rendered to, first in lexical order among usual names.
pub const RENDERED_FILE: &str = "10-remora-net.conflist";

/// Why the template could not be applied.
#[derive(Debug, Error)]
pub enum TemplateError {
    /// A pod CIDR is not `address/prefix`.
    #[error("pod CIDR {value:?} is not an IP network (address/prefix)")]
    InvalidCidr {
        /// The value received.
        value: String,
    },
    /// The template cannot be read.
    #[error("cannot read the CNI config template {}: {source}", path.display())]
    ReadTemplate {
        /// The template.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The rendered template is not JSON.
    #[error("the CNI config template {} does not render to JSON: {source}", path.display())]
    NotJson {
        /// The template.
        path: PathBuf,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
    /// The rendered config cannot be written.
    #[error("cannot write the CNI config {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// What [`apply`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// No pod CIDR was given: nothing to do.
    NoCidr,
    /// A usable network config already exists: left alone.
    NetworkReady,
    /// No template is configured: the operator provides the config.
    NoTemplate,
    /// The template was rendered to this file.
    Written(PathBuf),
}

/// A pod CIDR list as kubelet sends it (`"10.88.0.0/16,fd00::/64"`), trimmed and checked.
pub fn parse_cidrs(value: &str) -> Result<Vec<String>, TemplateError> {
    value
        .split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(|c| {
            let invalid = || TemplateError::InvalidCidr {
                value: c.to_string(),
            };
            let (addr, prefix) = c.split_once('/').ok_or_else(invalid)?;
            let addr: IpAddr = addr.parse().map_err(|_| invalid())?;
            let prefix: u8 = prefix.parse().map_err(|_| invalid())?;
            let max = if addr.is_ipv4() { 32 } else { 128 };
            if prefix > max {
                return Err(invalid());
            }
            Ok(c.to_string())
        })
        .collect()
}

/// `template` with its placeholders filled from `cidrs` (checked, non-empty).
pub fn render(template: &str, cidrs: &[String]) -> String {
    let ranges: Vec<serde_json::Value> = cidrs
        .iter()
        .map(|c| serde_json::json!([{ "subnet": c }]))
        .collect();
    let v4 = cidrs.iter().any(|c| !c.contains(':'));
    let v6 = cidrs.iter().any(|c| c.contains(':'));
    let mut routes = Vec::new();
    if v4 {
        routes.push(serde_json::json!({"dst": "0.0.0.0/0"}));
    }
    if v6 {
        routes.push(serde_json::json!({"dst": "::/0"}));
    }
    template
        .replace("{{.PodCIDR}}", cidrs.first().map_or("", String::as_str))
        .replace(
            "{{.PodCIDRRanges}}",
            &serde_json::Value::Array(ranges).to_string(),
        )
        .replace("{{.Routes}}", &serde_json::Value::Array(routes).to_string())
}

/// `UpdateRuntimeConfig`'s network part: renders `template` (empty path = none) for
/// `pod_cidrs` into `conf_dir` unless a usable network is already there (`network_ready`).
pub fn apply(
    conf_dir: &Path,
    template: &Path,
    pod_cidrs: &str,
    network_ready: bool,
) -> Result<Applied, TemplateError> {
    let cidrs = parse_cidrs(pod_cidrs)?;
    if cidrs.is_empty() {
        return Ok(Applied::NoCidr);
    }
    if network_ready {
        return Ok(Applied::NetworkReady);
    }
    if template.as_os_str().is_empty() {
        return Ok(Applied::NoTemplate);
    }
    let text = std::fs::read_to_string(template).map_err(|source| TemplateError::ReadTemplate {
        path: template.to_path_buf(),
        source,
    })?;
    let rendered = render(&text, &cidrs);
    serde_json::from_str::<serde_json::Value>(&rendered).map_err(|source| {
        TemplateError::NotJson {
            path: template.to_path_buf(),
            source,
        }
    })?;
    let path = conf_dir.join(RENDERED_FILE);
    let write_err = |source| TemplateError::Write {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(conf_dir).map_err(write_err)?;
    let tmp = conf_dir.join(format!(".{RENDERED_FILE}.tmp"));
    let mut f = std::fs::File::create(&tmp).map_err(write_err)?;
    f.write_all(rendered.as_bytes()).map_err(write_err)?;
    f.sync_all().map_err(write_err)?;
    std::fs::rename(&tmp, &path).map_err(write_err)?;
    Ok(Applied::Written(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEMPLATE: &str = r#"{"cniVersion":"1.0.0","name":"pods","plugins":[{"type":"bridge",
        "ipam":{"type":"host-local","ranges":{{.PodCIDRRanges}},"routes":{{.Routes}}},
        "note":"{{.PodCIDR}}"}]}"#;

    #[test]
    fn cidrs_are_trimmed_and_checked() {
        assert_eq!(
            parse_cidrs(" 10.88.0.0/16 , fd00::/64").unwrap(),
            ["10.88.0.0/16", "fd00::/64"]
        );
        assert!(parse_cidrs("").unwrap().is_empty());
        for bad in [
            "10.88.0.0",
            "10.88.0.0/33",
            "fd00::/129",
            "pods/16",
            "10.0.0.0/x",
        ] {
            let err = parse_cidrs(bad).unwrap_err();
            assert!(err.to_string().contains(bad), "{err}");
        }
    }

    #[test]
    fn placeholders_are_filled_per_family() {
        let out: serde_json::Value = serde_json::from_str(&render(
            TEMPLATE,
            &["10.88.0.0/16".into(), "fd00::/64".into()],
        ))
        .unwrap();
        let ipam = &out["plugins"][0]["ipam"];
        assert_eq!(
            ipam["ranges"],
            serde_json::json!([[{"subnet": "10.88.0.0/16"}], [{"subnet": "fd00::/64"}]])
        );
        assert_eq!(
            ipam["routes"],
            serde_json::json!([{"dst": "0.0.0.0/0"}, {"dst": "::/0"}])
        );
        assert_eq!(out["plugins"][0]["note"], "10.88.0.0/16");
        let v4: serde_json::Value =
            serde_json::from_str(&render(TEMPLATE, &["10.1.0.0/24".into()])).unwrap();
        assert_eq!(
            v4["plugins"][0]["ipam"]["routes"],
            serde_json::json!([{"dst": "0.0.0.0/0"}])
        );
    }

    #[test]
    fn apply_writes_only_when_needed() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("net.d");
        let template = dir.path().join("template.json");
        std::fs::write(&template, TEMPLATE).unwrap();
        assert_eq!(apply(&conf, &template, "", false).unwrap(), Applied::NoCidr);
        assert_eq!(
            apply(&conf, &template, "10.1.0.0/24", true).unwrap(),
            Applied::NetworkReady
        );
        assert_eq!(
            apply(&conf, Path::new(""), "10.1.0.0/24", false).unwrap(),
            Applied::NoTemplate
        );
        assert!(!conf.exists(), "nothing written so far");
        let written = apply(&conf, &template, "10.1.0.0/24", false).unwrap();
        assert_eq!(written, Applied::Written(conf.join(RENDERED_FILE)));
        let text = std::fs::read_to_string(conf.join(RENDERED_FILE)).unwrap();
        assert!(text.contains(r#""subnet":"10.1.0.0/24""#), "{text}");
        let names: Vec<_> = std::fs::read_dir(&conf)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [RENDERED_FILE], "no temp file left");

        std::fs::write(&template, "{ not json {{.PodCIDR}}").unwrap();
        let err = apply(&conf, &template, "10.1.0.0/24", false).unwrap_err();
        assert!(matches!(err, TemplateError::NotJson { .. }), "{err}");
        let missing = apply(&conf, &dir.path().join("nope"), "10.1.0.0/24", false).unwrap_err();
        assert!(
            matches!(missing, TemplateError::ReadTemplate { .. }),
            "{missing}"
        );
    }
}
