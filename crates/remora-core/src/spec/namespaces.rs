//! Linux namespaces of containers and sandboxes.
//!
//! The pause container creates the pod's namespaces (or uses the host's); containers join
//! them through the pause process's `/proc/<pid>/ns/*` (the network namespace through its
//! bind mount when there is one, which outlives the pause process). A namespace that is the
//! host's is simply left out of the spec. Every container gets a new mount namespace.
//!
//! A pod without a pause container (`[runtime] pause_container = "when-needed"`, see
//! `remora::lifecycle::sandbox_run`) has its IPC and UTS namespaces pinned beside its network
//! namespace; its containers join those ([`PodNamespacesAt::Pinned`]).
//!
//! A pod with a user namespace of its own: the pause container joins the user namespace that
//! owns the pod's network namespace (pinned beside it, see [`userns_pin`]),
//! or makes a new one on the host's network; containers join the pause process's, as in
//! containerd (`WithPodNamespaces`). The spec carries the maps too (`linux.uidMappings`), which
//! runc checks against the namespace it joins.

use std::path::{Path, PathBuf};

use oci_spec::runtime::{LinuxNamespace, LinuxNamespaceBuilder, LinuxNamespaceType};

use super::types::{NamespaceMode, NamespaceOptions, SandboxInfo};
use super::SpecError;

fn ns(typ: LinuxNamespaceType, path: Option<PathBuf>) -> Result<LinuxNamespace, SpecError> {
    let b = LinuxNamespaceBuilder::default().typ(typ);
    Ok(match path {
        Some(p) => b.path(p),
        None => b,
    }
    .build()?)
}

fn proc_ns(pid: u32, name: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/ns/{name}"))
}

/// Where the user namespace owning the network namespace at `netns` is pinned (a bind mount
/// beside it), for a pod with a user namespace of its own; see
/// `remora::net::netns::NetnsDir::create_in_userns`.
pub fn userns_pin(netns: &Path) -> PathBuf {
    beside(netns, ".userns")
}

/// Where the IPC namespace of a pod without a pause container is pinned, beside its network
/// namespace at `netns` (`remora::net::netns::pin_pod_namespaces`).
pub fn ipc_pin(netns: &Path) -> PathBuf {
    beside(netns, ".ipc")
}

/// Where the UTS namespace of a pod without a pause container is pinned, beside its network
/// namespace at `netns` (`remora::net::netns::pin_pod_namespaces`).
pub fn uts_pin(netns: &Path) -> PathBuf {
    beside(netns, ".uts")
}

fn beside(netns: &Path, suffix: &str) -> PathBuf {
    let mut p = netns.as_os_str().to_owned();
    p.push(suffix);
    PathBuf::from(p)
}

/// Where a container joins its pod's namespaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodNamespacesAt<'a> {
    /// The pause process's, through `/proc/<pid>/ns/*`; the network namespace through its
    /// bind mount when there is one (it outlives the pause process).
    Pause {
        /// The pause process.
        pid: u32,
        /// The pod's network namespace bind mount, if any.
        netns: Option<&'a Path>,
    },
    /// A pod without a pause container: its network namespace's bind mount and the IPC and
    /// UTS namespaces pinned beside it ([`ipc_pin`], [`uts_pin`]). Such a pod
    /// has no user namespace or shared PID namespace of its own (they need a process).
    Pinned {
        /// The pod's network namespace bind mount.
        netns: &'a Path,
    },
}

/// A container joins the namespaces of its pod as [`PodNamespacesAt`] says.
impl SandboxInfo {
    /// Where the pod's containers join its namespaces.
    pub fn namespaces_at(&self) -> Result<PodNamespacesAt<'_>, SpecError> {
        Ok(if self.pinned {
            PodNamespacesAt::Pinned {
                netns: self
                    .netns_path
                    .as_deref()
                    .ok_or(SpecError::PinnedWithoutNetns)?,
            }
        } else {
            PodNamespacesAt::Pause {
                pid: self.pid,
                netns: self.netns_path.as_deref(),
            }
        })
    }
}

/// The namespaces of a container of the pod whose namespaces are `pod`; `target_pid` is the
/// process of the container named by a `Target` PID mode.
pub fn container_namespaces(
    opts: &NamespaceOptions,
    pod: PodNamespacesAt<'_>,
    target_pid: Option<u32>,
) -> Result<Vec<LinuxNamespace>, SpecError> {
    // The path of the pod's namespace `name` (`/proc/<pid>/ns/` names).
    let of_pod = |name: &'static str| -> Result<PathBuf, SpecError> {
        match pod {
            PodNamespacesAt::Pause { netns: Some(p), .. } if name == "net" => Ok(p.to_path_buf()),
            PodNamespacesAt::Pause { pid, .. } => Ok(proc_ns(pid, name)),
            PodNamespacesAt::Pinned { netns } => match name {
                "net" => Ok(netns.to_path_buf()),
                "ipc" => Ok(ipc_pin(netns)),
                "uts" => Ok(uts_pin(netns)),
                _ => Err(SpecError::NoPodNamespace(name)),
            },
        }
    };
    let mut out = vec![ns(LinuxNamespaceType::Mount, None)?];
    if opts.user.is_some() {
        out.push(ns(LinuxNamespaceType::User, Some(of_pod("user")?))?);
    }
    if opts.network != NamespaceMode::Node {
        out.push(ns(LinuxNamespaceType::Network, Some(of_pod("net")?))?);
        // A host-network pod also has the host's UTS namespace (its hostname is the node's).
        out.push(ns(LinuxNamespaceType::Uts, Some(of_pod("uts")?))?);
    }
    if opts.ipc != NamespaceMode::Node {
        out.push(ns(LinuxNamespaceType::Ipc, Some(of_pod("ipc")?))?);
    }
    match opts.pid {
        NamespaceMode::Pod => out.push(ns(LinuxNamespaceType::Pid, Some(of_pod("pid")?))?),
        NamespaceMode::Container => out.push(ns(LinuxNamespaceType::Pid, None)?),
        NamespaceMode::Node => {}
        NamespaceMode::Target => {
            let pid = target_pid.ok_or(SpecError::MissingTargetPid)?;
            out.push(ns(LinuxNamespaceType::Pid, Some(proc_ns(pid, "pid")))?);
        }
    }
    Ok(out)
}

/// The namespaces of a pause container: new ones, the pod's network namespace by path, or
/// the host's (left out) per the pod's options; with a user namespace of the pod's own, the
/// one pinned at `userns_path` (the owner of the pod's network namespace), else a new one.
pub fn sandbox_namespaces(
    opts: &NamespaceOptions,
    netns_path: Option<&Path>,
    userns_path: Option<&Path>,
) -> Result<Vec<LinuxNamespace>, SpecError> {
    let mut out = vec![ns(LinuxNamespaceType::Mount, None)?];
    if opts.user.is_some() {
        out.push(ns(
            LinuxNamespaceType::User,
            userns_path.map(Path::to_path_buf),
        )?);
    }
    if opts.network != NamespaceMode::Node {
        out.push(ns(
            LinuxNamespaceType::Network,
            netns_path.map(Path::to_path_buf),
        )?);
        out.push(ns(LinuxNamespaceType::Uts, None)?);
    }
    if opts.ipc != NamespaceMode::Node {
        out.push(ns(LinuxNamespaceType::Ipc, None)?);
    }
    if opts.pid != NamespaceMode::Node {
        out.push(ns(LinuxNamespaceType::Pid, None)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pause(pid: u32, netns: Option<&Path>) -> PodNamespacesAt<'_> {
        PodNamespacesAt::Pause { pid, netns }
    }

    #[test]
    fn a_pod_without_pause_is_joined_through_its_pins() {
        let netns = Path::new("/run/remora/netns/p");
        let list = container_namespaces(
            &NamespaceOptions {
                pid: NamespaceMode::Container,
                ..NamespaceOptions::default()
            },
            PodNamespacesAt::Pinned { netns },
            None,
        )
        .unwrap();
        assert_eq!(
            find(&list, LinuxNamespaceType::Network),
            Some(Some(netns.into()))
        );
        assert_eq!(
            find(&list, LinuxNamespaceType::Uts),
            Some(Some("/run/remora/netns/p.uts".into()))
        );
        assert_eq!(
            find(&list, LinuxNamespaceType::Ipc),
            Some(Some("/run/remora/netns/p.ipc".into()))
        );
        assert_eq!(find(&list, LinuxNamespaceType::Pid), Some(None));
        assert_eq!(find(&list, LinuxNamespaceType::User), None);
        // A shared PID namespace (or a user namespace) needs a process: such a pod has a
        // pause container, and asking for its namespace from pins is an error, not a guess.
        let err = container_namespaces(
            &NamespaceOptions::default(),
            PodNamespacesAt::Pinned { netns },
            None,
        )
        .unwrap_err();
        assert!(matches!(err, SpecError::NoPodNamespace("pid")), "{err}");
    }

    fn find(list: &[LinuxNamespace], t: LinuxNamespaceType) -> Option<Option<PathBuf>> {
        list.iter().find(|n| n.typ() == t).map(|n| n.path().clone())
    }

    #[test]
    fn pod_mode_joins_the_sandbox() {
        let list = container_namespaces(
            &NamespaceOptions::default(),
            pause(42, Some(Path::new("/run/netns/x"))),
            None,
        )
        .unwrap();
        assert_eq!(find(&list, LinuxNamespaceType::Mount), Some(None));
        assert_eq!(
            find(&list, LinuxNamespaceType::Network),
            Some(Some("/run/netns/x".into()))
        );
        assert_eq!(
            find(&list, LinuxNamespaceType::Uts),
            Some(Some("/proc/42/ns/uts".into()))
        );
        assert_eq!(
            find(&list, LinuxNamespaceType::Ipc),
            Some(Some("/proc/42/ns/ipc".into()))
        );
        assert_eq!(
            find(&list, LinuxNamespaceType::Pid),
            Some(Some("/proc/42/ns/pid".into()))
        );
        let list =
            container_namespaces(&NamespaceOptions::default(), pause(42, None), None).unwrap();
        assert_eq!(
            find(&list, LinuxNamespaceType::Network),
            Some(Some("/proc/42/ns/net".into()))
        );
    }

    #[test]
    fn node_modes_leave_namespaces_out() {
        let opts = NamespaceOptions {
            network: NamespaceMode::Node,
            pid: NamespaceMode::Node,
            ipc: NamespaceMode::Node,
            user: None,
        };
        let list =
            container_namespaces(&opts, pause(42, Some(Path::new("/run/netns/x"))), None).unwrap();
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].typ(), LinuxNamespaceType::Mount);
    }

    #[test]
    fn container_and_target_pid_modes() {
        let opts = NamespaceOptions {
            pid: NamespaceMode::Container,
            ..NamespaceOptions::default()
        };
        let list = container_namespaces(&opts, pause(42, None), None).unwrap();
        assert_eq!(find(&list, LinuxNamespaceType::Pid), Some(None));
        let opts = NamespaceOptions {
            pid: NamespaceMode::Target,
            ..NamespaceOptions::default()
        };
        let list = container_namespaces(&opts, pause(42, None), Some(77)).unwrap();
        assert_eq!(
            find(&list, LinuxNamespaceType::Pid),
            Some(Some("/proc/77/ns/pid".into()))
        );
        assert!(matches!(
            container_namespaces(&opts, pause(42, None), None),
            Err(SpecError::MissingTargetPid)
        ));
    }

    #[test]
    fn sandbox_namespaces_new_or_host() {
        let list = sandbox_namespaces(
            &NamespaceOptions::default(),
            Some(Path::new("/run/netns/p")),
            None,
        )
        .unwrap();
        assert_eq!(
            find(&list, LinuxNamespaceType::Network),
            Some(Some("/run/netns/p".into()))
        );
        for t in [
            LinuxNamespaceType::Uts,
            LinuxNamespaceType::Ipc,
            LinuxNamespaceType::Pid,
            LinuxNamespaceType::Mount,
        ] {
            assert_eq!(find(&list, t), Some(None), "{t:?}");
        }
        let host = NamespaceOptions {
            network: NamespaceMode::Node,
            pid: NamespaceMode::Node,
            ipc: NamespaceMode::Node,
            user: None,
        };
        let list = sandbox_namespaces(&host, Some(Path::new("/run/netns/p")), None).unwrap();
        assert_eq!(list.len(), 1);
    }
}
