//! The pod network over the host: network namespaces bind-mounted under the state dir, and the
//! CNI plugins run against them. The adapter from `crate::net` to lifecycle's pod network
//! (`crate::lifecycle::backend::PodNetwork`), above both, so that net does not depend on
//! lifecycle.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use crate::lifecycle::backend::PodNetwork;
use crate::net::cni::orphans::Orphans;
use crate::net::netns::{self, NetnsDir, NetnsError};
use crate::net::{NetError, PodNetInfo};

/// Network namespaces in `netns_dir`, CNI through [`crate::net::PodNetwork`].
pub struct HostNetwork {
    cni: crate::net::PodNetwork,
    /// Prepared on first use, so a remora that never runs a pod mounts nothing.
    netns: tokio::sync::OnceCell<NetnsDir>,
    netns_dir: PathBuf,
}

impl HostNetwork {
    /// Namespaces in `netns_dir` (prepared lazily), CNI by `cni`.
    pub fn new(cni: crate::net::PodNetwork, netns_dir: PathBuf) -> Self {
        Self {
            cni,
            netns: tokio::sync::OnceCell::new(),
            netns_dir,
        }
    }
}

#[async_trait::async_trait]
impl PodNetwork for HostNetwork {
    async fn create_netns(
        &self,
        id: &str,
        user: Option<&crate::spec::UserNamespace>,
    ) -> Result<PathBuf, NetnsError> {
        let dir = self
            .netns
            .get_or_try_init(|| NetnsDir::prepare(self.netns_dir.clone()))
            .await?;
        match user {
            Some(u) => {
                dir.create_in_userns(id, crate::spec::idmap(u.uids), crate::spec::idmap(u.gids))
                    .await
            }
            None => dir.create(id).await,
        }
    }

    async fn remove_netns(&self, path: &Path) -> Result<(), NetnsError> {
        netns::remove(path).await
    }

    async fn pin_namespaces(
        &self,
        netns: &Path,
        pod: netns::PodNamespaces,
    ) -> Result<(), NetnsError> {
        netns::pin_pod_namespaces(netns, pod).await
    }

    async fn setup(&self, pod: &PodNetInfo) -> Result<Vec<IpAddr>, NetError> {
        Ok(self.cni.setup(pod).await?.ips)
    }

    async fn teardown(&self, pod: &PodNetInfo) -> Result<(), NetError> {
        self.cni.teardown(pod).await
    }

    async fn await_orphaned_plugins(&self, id: &str) -> Result<Orphans, NetError> {
        self.cni.await_orphaned_plugins(id).await
    }
}
