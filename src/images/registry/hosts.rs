//! containerd-style registry host directories (`config_path`), so remora pulls through the
//! same mirrors, CAs and plain-HTTP settings as containerd does on the node.
//!
//! For registry `H`, the first existing directory of `<config_path>/H_port_` (containerd
//! writes `host:port` as `host_port_`), `<config_path>/H` and `<config_path>/_default` is
//! used. Its `hosts.toml` lists `[host."<url>"]` mirrors, tried in file order, and then the
//! `server` (default: the registry itself). A directory without `hosts.toml` uses the
//! registry itself, trusting the directory's `*.crt` files (Docker's certs.d layout).
//!
//! Without a directory the registry itself is used over HTTPS (`docker.io` means
//! `registry-1.docker.io`). Plain HTTP and skipped verification happen only where a
//! `hosts.toml` says so — unlike containerd, localhost is not special-cased to HTTP.
//!
//! Keys read: `server`, `capabilities`, `skip_verify`, `ca` (path or list, relative to the
//! directory), `override_path`, `header` (string or list values). `dial_timeout` is accepted
//! and ignored (the client's request timeout covers connecting); `client` (TLS client
//! certificates) is refused rather than silently ignored.

use std::fmt;
use std::path::{Path, PathBuf};

use thiserror::Error;
use toml::{Table, Value};

/// The directory consulted when a registry has none of its own.
const DEFAULT_DIR: &str = "_default";
/// The API root of the distribution spec.
const API_ROOT: &str = "/v2";

/// A `hosts.toml` that cannot be used.
#[derive(Debug, Error)]
pub enum HostsError {
    /// The file or directory could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The path.
        path: PathBuf,
        source: std::io::Error,
    },
    /// Not valid TOML.
    #[error("invalid {}: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// A key holds a value of the wrong type or an unusable value.
    #[error("invalid {}: `{key}` {reason}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The key, e.g. `host."https://m".capabilities`.
        key: String,
        /// What is wrong.
        reason: String,
    },
}

/// What a host may be used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capabilities {
    /// Fetch manifests and blobs by digest.
    pub pull: bool,
    /// Resolve tags to digests.
    pub resolve: bool,
    /// Push (never used by remora; kept so the config round-trips).
    pub push: bool,
}

impl Capabilities {
    /// pull, resolve and push: the default of a configured host.
    pub const ALL: Self = Self {
        pull: true,
        resolve: true,
        push: true,
    };
}

/// HTTP or HTTPS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// Plain HTTP; only when configured.
    Http,
    /// HTTPS.
    Https,
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        })
    }
}

/// One endpoint to try for a registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryHost {
    /// HTTP or HTTPS.
    pub scheme: Scheme,
    /// `host[:port]`.
    pub host: String,
    /// API root, normally `/v2`.
    pub path: String,
    /// What this host may be used for.
    pub capabilities: Capabilities,
    /// Do not verify the server's certificate.
    pub skip_verify: bool,
    /// Extra CA certificate files (PEM) to trust, absolute.
    pub ca: Vec<PathBuf>,
    /// Extra request headers.
    pub header: Vec<(String, String)>,
    /// False for the `server` (the last host), true for mirrors.
    pub is_mirror: bool,
}

impl RegistryHost {
    /// `scheme://host/path` — the API root URL.
    pub fn base_url(&self) -> String {
        format!("{}://{}{}", self.scheme, self.host, self.path)
    }

    /// The registry itself, as used when nothing is configured.
    pub fn default_for(registry: &str) -> Self {
        let host = if registry == "docker.io" {
            "registry-1.docker.io"
        } else {
            registry
        };
        Self {
            scheme: Scheme::Https,
            host: host.to_owned(),
            path: API_ROOT.to_owned(),
            capabilities: Capabilities::ALL,
            skip_verify: false,
            ca: Vec::new(),
            header: Vec::new(),
            is_mirror: false,
        }
    }
}

/// The hosts to try for `registry`, mirrors first and the server last.
pub async fn load_hosts(
    config_path: Option<&Path>,
    registry: &str,
) -> Result<Vec<RegistryHost>, HostsError> {
    let Some(root) = config_path else {
        return Ok(vec![RegistryHost::default_for(registry)]);
    };
    for dir in host_dirs(root, registry) {
        match tokio::fs::metadata(&dir).await {
            Ok(_) => return load_dir(&dir, registry).await,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => return Err(HostsError::Read { path: dir, source }),
        }
    }
    Ok(vec![RegistryHost::default_for(registry)])
}

/// containerd's `hostPaths`: `host_port_` (for a host with a port), `host`, `_default`.
fn host_dirs(root: &Path, registry: &str) -> Vec<PathBuf> {
    let mut dirs = Vec::with_capacity(3);
    if let Some(i) = registry.rfind(':').filter(|&i| i > 0) {
        dirs.push(root.join(format!("{}_{}_", &registry[..i], &registry[i + 1..])));
    }
    dirs.push(root.join(registry));
    dirs.push(root.join(DEFAULT_DIR));
    dirs
}

async fn load_dir(dir: &Path, registry: &str) -> Result<Vec<RegistryHost>, HostsError> {
    let file = dir.join("hosts.toml");
    match tokio::fs::read_to_string(&file).await {
        Ok(text) if !text.trim().is_empty() => parse_hosts_toml(&file, &text, registry),
        Ok(_) => cert_dir_host(dir, registry).await,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => cert_dir_host(dir, registry).await,
        Err(source) => Err(HostsError::Read { path: file, source }),
    }
}

/// Docker's `certs.d` layout: the registry itself, trusting the directory's `*.crt` files.
async fn cert_dir_host(dir: &Path, registry: &str) -> Result<Vec<RegistryHost>, HostsError> {
    let read_err = |source| HostsError::Read {
        path: dir.to_owned(),
        source,
    };
    let mut entries = tokio::fs::read_dir(dir).await.map_err(read_err)?;
    let mut host = RegistryHost::default_for(registry);
    while let Some(e) = entries.next_entry().await.map_err(read_err)? {
        let path = e.path();
        if path.extension().is_some_and(|x| x == "crt") {
            host.ca.push(path);
        }
        // `*.cert`/`*.key` client pairs would need client-certificate support.
    }
    host.ca.sort();
    Ok(vec![host])
}

/// Parses the text of `file` (a `hosts.toml`) for `registry`.
pub fn parse_hosts_toml(
    file: &Path,
    text: &str,
    registry: &str,
) -> Result<Vec<RegistryHost>, HostsError> {
    let table: Table = text
        .parse()
        .map_err(|e: toml::de::Error| HostsError::Parse {
            path: file.to_owned(),
            message: e.to_string(),
        })?;
    let dir = file.parent().unwrap_or(Path::new("/"));
    let invalid = |key: &str, reason: String| HostsError::Invalid {
        path: file.to_owned(),
        key: key.to_owned(),
        reason,
    };
    let mut hosts = Vec::new();
    if let Some(h) = table.get("host") {
        let h = h
            .as_table()
            .ok_or_else(|| invalid("host", "must be a table of [host.\"<url>\"] tables".into()))?;
        // `preserve_order` keeps the tables in file order, which is the order to try them.
        for (url, cfg) in h {
            let key = format!("host.{url:?}");
            let cfg = cfg
                .as_table()
                .ok_or_else(|| invalid(&key, "must be a table".into()))?;
            let mut host = parse_host(file, dir, &key, Some(url), cfg)?;
            host.is_mirror = true;
            hosts.push(host);
        }
    }
    let server = match table.get("server") {
        None => None,
        Some(Value::String(s)) if s.is_empty() => None,
        Some(Value::String(s)) => Some(s.as_str()),
        Some(_) => return Err(invalid("server", "must be a string".into())),
    };
    let mut root = parse_host(file, dir, "server", server, &table)?;
    if server.is_none() {
        // As containerd: no `server` means the registry itself, with every capability.
        let d = RegistryHost::default_for(registry);
        root.scheme = d.scheme;
        root.host = d.host;
        root.path = d.path;
        root.capabilities = Capabilities::ALL;
    }
    hosts.push(root);
    Ok(hosts)
}

/// One host entry's table in a hosts.toml: its fields read with errors that name the file and
/// the field (`server` fields by their own name, a mirror's as `<key>.<field>`).
struct Entry<'a> {
    file: &'a Path,
    key: &'a str,
    cfg: &'a Table,
}

impl Entry<'_> {
    fn invalid(&self, field: &str, reason: String) -> HostsError {
        HostsError::Invalid {
            path: self.file.to_owned(),
            key: if self.key == "server" {
                field.to_owned()
            } else {
                format!("{}.{field}", self.key)
            },
            reason,
        }
    }

    fn boolean(&self, field: &str) -> Result<bool, HostsError> {
        match self.cfg.get(field) {
            None => Ok(false),
            Some(Value::Boolean(b)) => Ok(*b),
            Some(_) => Err(self.invalid(field, "must be true or false".into())),
        }
    }

    fn strings(&self, field: &str) -> Result<Vec<String>, HostsError> {
        match self.cfg.get(field) {
            None => Ok(Vec::new()),
            Some(Value::String(s)) => Ok(vec![s.clone()]),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_str().map(str::to_owned).ok_or_else(|| {
                        self.invalid(field, "must be a string or a list of strings".into())
                    })
                })
                .collect(),
            Some(_) => Err(self.invalid(field, "must be a string or a list of strings".into())),
        }
    }
}

fn parse_host(
    file: &Path,
    dir: &Path,
    key: &str,
    url: Option<&str>,
    cfg: &Table,
) -> Result<RegistryHost, HostsError> {
    let entry = Entry { file, key, cfg };
    let override_path = entry.boolean("override_path")?;
    let skip_verify = entry.boolean("skip_verify")?;
    if cfg.contains_key("client") {
        return Err(entry.invalid(
            "client",
            "(TLS client certificates) is not supported by remora".into(),
        ));
    }

    let mut host = RegistryHost::default_for("");
    host.skip_verify = skip_verify;
    if let Some(raw) = url {
        set_endpoint(&entry, &mut host, raw, override_path)?;
    }
    host.capabilities = capabilities(&entry, entry.strings("capabilities")?)?;
    host.ca = entry
        .strings("ca")?
        .into_iter()
        .map(|p| {
            let p = PathBuf::from(p);
            if p.is_absolute() {
                p
            } else {
                dir.join(p)
            }
        })
        .collect();
    if let Some(h) = cfg.get("header") {
        host.header.extend(headers(&entry, h)?);
    }
    Ok(host)
}

/// Sets `host`'s scheme, `host[:port]` and API path from the entry's URL `raw`.
fn set_endpoint(
    entry: &Entry<'_>,
    host: &mut RegistryHost,
    raw: &str,
    override_path: bool,
) -> Result<(), HostsError> {
    // containerd: a URL without a scheme is https.
    let with_scheme = if raw.starts_with("http") {
        raw.to_owned()
    } else {
        format!("https://{raw}")
    };
    let u =
        url::Url::parse(&with_scheme).map_err(|e| entry.invalid("url", format!("{raw:?}: {e}")))?;
    host.scheme = match u.scheme() {
        "http" => Scheme::Http,
        "https" => Scheme::Https,
        other => return Err(entry.invalid("url", format!("{raw:?}: unsupported scheme {other}"))),
    };
    let h = u
        .host_str()
        .ok_or_else(|| entry.invalid("url", format!("{raw:?} has no host")))?;
    host.host = match u.port() {
        Some(p) => format!("{h}:{p}"),
        None => h.to_owned(),
    };
    let path = u.path().trim_end_matches('/');
    host.path = if override_path || path.ends_with(API_ROOT) {
        path.to_owned()
    } else {
        format!("{path}{API_ROOT}")
    };
    Ok(())
}

/// The entry's `capabilities`; none listed is all of them.
fn capabilities(entry: &Entry<'_>, caps: Vec<String>) -> Result<Capabilities, HostsError> {
    if caps.is_empty() {
        return Ok(Capabilities::ALL);
    }
    let mut c = Capabilities::default();
    for cap in caps {
        match cap.to_ascii_lowercase().as_str() {
            "pull" => c.pull = true,
            "resolve" => c.resolve = true,
            "push" => c.push = true,
            other => {
                return Err(entry.invalid(
                    "capabilities",
                    format!("has unknown capability {other:?} (want pull, resolve, push)"),
                ))
            }
        }
    }
    Ok(c)
}

/// The entry's `header` table as (name, value) pairs, each name and value checked here so a
/// bad header is a config error, not a silently dropped one.
fn headers(entry: &Entry<'_>, table: &Value) -> Result<Vec<(String, String)>, HostsError> {
    let table = table
        .as_table()
        .ok_or_else(|| entry.invalid("header", "must be a table".into()))?;
    let mut out = Vec::new();
    for (name, v) in table {
        let values = match v {
            Value::String(s) => vec![s.clone()],
            Value::Array(a) => a
                .iter()
                .map(|x| x.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    entry.invalid(
                        "header",
                        format!("{name:?} must be a string or list of strings"),
                    )
                })?,
            _ => {
                return Err(entry.invalid(
                    "header",
                    format!("{name:?} must be a string or list of strings"),
                ))
            }
        };
        if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(entry.invalid("header", format!("{name:?} is not a valid header name")));
        }
        if let Some(bad) = values
            .iter()
            .find(|v| reqwest::header::HeaderValue::from_str(v).is_err())
        {
            return Err(entry.invalid("header", format!("{name:?} has an invalid value {bad:?}")));
        }
        out.extend(values.into_iter().map(|v| (name.clone(), v)));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, dir: &str, text: &str) {
        let d = root.join(dir);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("hosts.toml"), text).unwrap();
    }

    #[tokio::test]
    async fn no_config_means_the_registry_over_https() {
        let hosts = load_hosts(None, "docker.io").await.unwrap();
        assert_eq!(hosts.len(), 1);
        assert_eq!(hosts[0].base_url(), "https://registry-1.docker.io/v2");
        assert!(hosts[0].capabilities.pull && hosts[0].capabilities.resolve);
        assert!(!hosts[0].is_mirror);

        let tmp = tempfile::tempdir().unwrap();
        let hosts = load_hosts(Some(tmp.path()), "quay.io").await.unwrap();
        assert_eq!(hosts[0].base_url(), "https://quay.io/v2");
    }

    #[tokio::test]
    async fn mirrors_in_file_order_then_server() {
        let tmp = tempfile::tempdir().unwrap();
        write(
            tmp.path(),
            "docker.io",
            r#"
server = "https://registry-1.docker.io"

[host."https://zz-mirror.example.com"]
  capabilities = ["pull"]
  ca = "mirror-ca.pem"
  [host."https://zz-mirror.example.com".header]
    x-token = ["a", "b"]

[host."http://aa-mirror.local:5000/prefix"]
  capabilities = ["pull", "resolve"]
  skip_verify = true

[host."https://custom.example.com/api/v2/docker"]
  override_path = true
  ca = ["/etc/a.pem", "b.pem"]
"#,
        );
        let hosts = load_hosts(Some(tmp.path()), "docker.io").await.unwrap();
        let urls: Vec<String> = hosts.iter().map(RegistryHost::base_url).collect();
        assert_eq!(
            urls,
            vec![
                "https://zz-mirror.example.com/v2",
                "http://aa-mirror.local:5000/prefix/v2",
                "https://custom.example.com/api/v2/docker",
                "https://registry-1.docker.io/v2",
            ]
        );
        let dir = tmp.path().join("docker.io");
        assert_eq!(
            hosts[0].capabilities,
            Capabilities {
                pull: true,
                resolve: false,
                push: false
            }
        );
        assert_eq!(hosts[0].ca, vec![dir.join("mirror-ca.pem")]);
        assert_eq!(
            hosts[0].header,
            vec![
                ("x-token".into(), "a".into()),
                ("x-token".into(), "b".into())
            ]
        );
        assert_eq!(hosts[1].scheme, Scheme::Http);
        assert!(hosts[1].skip_verify);
        assert_eq!(
            hosts[2].ca,
            vec![PathBuf::from("/etc/a.pem"), dir.join("b.pem")]
        );
        assert_eq!(hosts[2].capabilities, Capabilities::ALL);
        assert!(hosts[..3].iter().all(|h| h.is_mirror));
        assert!(!hosts[3].is_mirror);
    }

    #[tokio::test]
    async fn port_dirs_and_default_fallback() {
        let tmp = tempfile::tempdir().unwrap();
        // containerd's name for a host with a port.
        write(
            tmp.path(),
            "localhost_5000_",
            "server = \"http://localhost:5000\"\n",
        );
        write(
            tmp.path(),
            "_default",
            "[host.\"https://mirror.internal\"]\n  capabilities = [\"pull\", \"resolve\"]\n",
        );
        let hosts = load_hosts(Some(tmp.path()), "localhost:5000")
            .await
            .unwrap();
        assert_eq!(hosts.len(), 1);
        assert_eq!(hosts[0].base_url(), "http://localhost:5000/v2");

        // No own directory: `_default`, whose missing server means the registry itself.
        let hosts = load_hosts(Some(tmp.path()), "ghcr.io").await.unwrap();
        let urls: Vec<String> = hosts.iter().map(RegistryHost::base_url).collect();
        assert_eq!(
            urls,
            vec!["https://mirror.internal/v2", "https://ghcr.io/v2"]
        );
    }

    #[tokio::test]
    async fn cert_dir_without_hosts_toml() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("reg.example.com");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("ca.crt"), "pem").unwrap();
        let hosts = load_hosts(Some(tmp.path()), "reg.example.com")
            .await
            .unwrap();
        assert_eq!(hosts[0].base_url(), "https://reg.example.com/v2");
        assert_eq!(hosts[0].ca, vec![d.join("ca.crt")]);
    }

    #[test]
    fn bad_files_name_the_key() {
        let f = Path::new("/etc/containerd/certs.d/x/hosts.toml");
        let err = parse_hosts_toml(f, "[host.\"https://m\"]\ncapabilities = [\"fetch\"]\n", "x")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("capabilities") && err.contains("fetch"),
            "{err}"
        );
        let err = parse_hosts_toml(f, "server = 3\n", "x")
            .unwrap_err()
            .to_string();
        assert!(err.contains("server"), "{err}");
        let err = parse_hosts_toml(f, "[host.\"https://m\"]\nclient = \"c.pem\"\n", "x")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("client") && err.contains("not supported"),
            "{err}"
        );
        let err = parse_hosts_toml(f, "[header]\n\"bad name\" = \"v\"\n", "x")
            .unwrap_err()
            .to_string();
        assert!(err.contains("bad name"), "{err}");
        assert!(matches!(
            parse_hosts_toml(f, "server = [", "x"),
            Err(HostsError::Parse { .. })
        ));
    }
}
