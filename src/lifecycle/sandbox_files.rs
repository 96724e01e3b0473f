//! Files a pod's containers share: `/etc/hostname`, `/etc/hosts`, `/etc/resolv.conf` and the
//! `/dev/shm` tmpfs, kept in the sandbox's state directory
//! (`<state_dir>/sandboxes/<id>/`) and bind-mounted into every container of the pod.
//!
//! Follows containerd's CRI: `resolv.conf` from the pod's DNS config, or the host's when it
//! has none; `hosts` with the localhost entries (the host's file for host-network pods); a
//! `/dev/shm` tmpfs of 64 MiB unless the pod shares the host's IPC namespace (then the host's
//! `/dev/shm` is used and nothing is mounted).

use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use thiserror::Error;

use crate::spec::types::SandboxFiles;

/// Size of a pod's `/dev/shm` (containerd's default).
pub const SHM_SIZE_BYTES: u64 = 64 * 1024 * 1024;

/// DNS settings of a pod (CRI `DNSConfig`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dns {
    /// Name servers.
    pub servers: Vec<String>,
    /// Search domains.
    pub searches: Vec<String>,
    /// resolv.conf options.
    pub options: Vec<String>,
}

/// What the files depend on.
#[derive(Debug, Clone, Default)]
pub struct FilesRequest {
    /// Pod hostname ("" → the node's hostname for host-network pods, the pod name otherwise,
    /// decided by the caller).
    pub hostname: String,
    /// DNS config; `None` → copy the host's resolv.conf.
    pub dns: Option<Dns>,
    /// The pod uses the host network: use the host's `/etc/hosts`.
    pub host_network: bool,
    /// The pod uses the host IPC namespace: no private `/dev/shm`.
    pub host_ipc: bool,
}

/// Preparing or removing sandbox files failed.
#[derive(Debug, Error)]
pub enum FilesError {
    /// A file-system step failed.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path.
        path: PathBuf,
        source: std::io::Error,
    },
    /// Mounting or unmounting the shm tmpfs failed.
    #[error("cannot {action} the pod's /dev/shm at {}: {source}", path.display())]
    Shm {
        /// mount or unmount.
        action: &'static str,
        /// The mount point.
        path: PathBuf,
        source: nix::Error,
    },
}

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> FilesError {
    let path = path.to_path_buf();
    move |source| FilesError::Io {
        action,
        path,
        source,
    }
}

/// The resolv.conf content for a DNS config.
pub fn resolv_conf(dns: &Dns) -> String {
    let mut out = String::new();
    if !dns.searches.is_empty() {
        out.push_str(&format!("search {}\n", dns.searches.join(" ")));
    }
    for s in &dns.servers {
        out.push_str(&format!("nameserver {s}\n"));
    }
    if !dns.options.is_empty() {
        out.push_str(&format!("options {}\n", dns.options.join(" ")));
    }
    out
}

/// The hosts file of a pod with its own network namespace.
pub fn hosts_file() -> String {
    "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nff00::0\tip6-mcastprefix\nff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n".to_string()
}

/// Creates `dir` and the files in it; mounts the shm tmpfs unless `host_ipc`. On failure,
/// whatever was made is removed again.
pub fn prepare(dir: &Path, req: &FilesRequest) -> Result<SandboxFiles, FilesError> {
    let result = prepare_inner(dir, req);
    if result.is_err() {
        let _ = remove(dir);
    }
    result
}

fn prepare_inner(dir: &Path, req: &FilesRequest) -> Result<SandboxFiles, FilesError> {
    std::fs::create_dir_all(dir).map_err(io_err("create", dir))?;
    let hostname = dir.join("hostname");
    std::fs::write(&hostname, format!("{}\n", req.hostname)).map_err(io_err("write", &hostname))?;
    let hosts = dir.join("hosts");
    if req.host_network {
        std::fs::copy("/etc/hosts", &hosts).map_err(io_err("copy /etc/hosts to", &hosts))?;
    } else {
        std::fs::write(&hosts, hosts_file()).map_err(io_err("write", &hosts))?;
    }
    let resolv = dir.join("resolv.conf");
    match &req.dns {
        Some(dns) => std::fs::write(&resolv, resolv_conf(dns)).map_err(io_err("write", &resolv))?,
        None => {
            std::fs::copy("/etc/resolv.conf", &resolv)
                .map_err(io_err("copy /etc/resolv.conf to", &resolv))?;
        }
    }
    let shm = if req.host_ipc {
        Some(PathBuf::from("/dev/shm"))
    } else {
        let shm = dir.join("shm");
        std::fs::create_dir_all(&shm).map_err(io_err("create", &shm))?;
        let data = format!("mode=1777,size={SHM_SIZE_BYTES}");
        mount(
            Some("shm"),
            &shm,
            Some("tmpfs"),
            MsFlags::MS_NOEXEC | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(data.as_str()),
        )
        .map_err(|source| FilesError::Shm {
            action: "mount",
            path: shm.clone(),
            source,
        })?;
        Some(shm)
    };
    Ok(SandboxFiles {
        hosts: Some(hosts),
        resolv_conf: Some(resolv),
        hostname: Some(hostname),
        shm,
    })
}

/// Unmounts the pod's shm tmpfs if mounted (StopPodSandbox). Idempotent.
pub fn unmount_shm(dir: &Path) -> Result<(), FilesError> {
    let shm = dir.join("shm");
    if is_mount_point(&shm) {
        umount2(&shm, MntFlags::MNT_DETACH).map_err(|source| FilesError::Shm {
            action: "unmount",
            path: shm.clone(),
            source,
        })?;
    }
    Ok(())
}

/// Unmounts the shm tmpfs (if mounted) and removes `dir`. Idempotent.
pub fn remove(dir: &Path) -> Result<(), FilesError> {
    unmount_shm(dir)?;
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err("remove", dir)(e)),
    }
}

/// Whether `path` is listed as a mount point in `/proc/self/mountinfo`.
pub fn is_mount_point(path: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = path.to_string_lossy();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|mp| mp == want)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf_from_dns_config() {
        let dns = Dns {
            servers: vec!["10.0.0.10".into(), "8.8.8.8".into()],
            searches: vec!["ns.svc.cluster.local".into(), "svc.cluster.local".into()],
            options: vec!["ndots:5".into()],
        };
        assert_eq!(
            resolv_conf(&dns),
            "search ns.svc.cluster.local svc.cluster.local\nnameserver 10.0.0.10\nnameserver 8.8.8.8\noptions ndots:5\n"
        );
    }

    #[test]
    fn prepare_and_remove_pod_files_with_shm() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("sb1");
        let files = prepare(
            &dir,
            &FilesRequest {
                hostname: "pod-a".into(),
                dns: Some(Dns {
                    servers: vec!["1.2.3.4".into()],
                    ..Default::default()
                }),
                host_network: false,
                host_ipc: false,
            },
        )
        .unwrap();
        assert_eq!(
            std::fs::read_to_string(files.hostname.unwrap()).unwrap(),
            "pod-a\n"
        );
        assert!(std::fs::read_to_string(files.resolv_conf.unwrap())
            .unwrap()
            .contains("nameserver 1.2.3.4"));
        assert!(std::fs::read_to_string(files.hosts.unwrap())
            .unwrap()
            .contains("localhost"));
        let shm = files.shm.unwrap();
        assert!(is_mount_point(&shm), "shm is a tmpfs mount");
        remove(&dir).unwrap();
        assert!(!is_mount_point(&shm));
        assert!(!dir.exists());
        remove(&dir).unwrap();
    }

    #[test]
    fn host_ipc_uses_the_host_shm_and_host_network_the_host_hosts() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("sb2");
        let files = prepare(
            &dir,
            &FilesRequest {
                hostname: "node".into(),
                dns: None,
                host_network: true,
                host_ipc: true,
            },
        )
        .unwrap();
        assert_eq!(files.shm, Some(PathBuf::from("/dev/shm")));
        assert_eq!(
            std::fs::read(files.hosts.unwrap()).unwrap(),
            std::fs::read("/etc/hosts").unwrap()
        );
        remove(&dir).unwrap();
    }
}
