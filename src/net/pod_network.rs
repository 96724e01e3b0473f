//! The pod network facade: attach a pod's network namespace to the configured CNI network, and
//! detach it.
//!
//! `setup` is all-or-nothing (DESIGN "every mutating RPC is all-or-nothing"): if ADD fails
//! partway, the plugins that already ran have allocated an address (host-local), a veth and
//! port-mapping rules, so `setup` runs DEL itself before returning the error. If the caller
//! drops the `setup` future instead (its RPC was cancelled), the plugin being run is killed and
//! the DEL is handed to a detached task, so cancellation cannot leak an allocation either.
//!
//! `teardown` is idempotent: DEL of something never attached, or attached and already
//! detached, succeeds. When the namespace is gone, the plugins get an empty `CNI_NETNS` (as
//! containerd does) and release what lives outside it.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Map, Value};
use thiserror::Error;

use super::cni::{
    self, Attachment, CniError, CniExec, CniExecError, CniResult, Interface, Network,
};
use super::netns::{self, NetnsError};

/// The interface name inside the pod, as kubelet and containerd use.
pub const POD_IFNAME: &str = "eth0";

/// Where plugins and configs are and how long a plugin may run.
#[derive(Debug, Clone)]
pub struct PodNetworkConfig {
    /// The CNI conf dir (the first config file in it is the pod network).
    pub conf_dir: PathBuf,
    /// Plugin binary dirs, searched in order.
    pub bin_dirs: Vec<PathBuf>,
    /// Where ADD results are cached for DEL (remora's own, not libcni's `/var/lib/cni`).
    pub cache_dir: PathBuf,
    /// Limit for one plugin run.
    pub plugin_timeout: Duration,
}

/// A port mapping of the pod (CRI `PortMapping`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortMapping {
    /// Port on the host; 0 or less means "no host port" and the mapping is not passed on.
    pub host_port: i32,
    /// Port in the pod.
    pub container_port: i32,
    /// Protocol.
    pub protocol: Protocol,
    /// Host address to bind; empty for all.
    pub host_ip: String,
}

/// A port mapping's protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl Protocol {
    fn as_cni(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

/// Traffic shaping for the `bandwidth` capability (bits per second; burst in bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bandwidth {
    /// Ingress rate.
    pub ingress_rate: u64,
    /// Ingress burst.
    pub ingress_burst: u64,
    /// Egress rate.
    pub egress_rate: u64,
    /// Egress burst.
    pub egress_burst: u64,
}

/// DNS settings for the `dns` capability.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DnsConfig {
    /// Name servers.
    pub servers: Vec<String>,
    /// Search domains.
    pub searches: Vec<String>,
    /// resolv.conf options.
    pub options: Vec<String>,
}

/// What the network needs to know about a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodNetInfo {
    /// Sandbox ID (`CNI_CONTAINERID`, `K8S_POD_INFRA_CONTAINER_ID`).
    pub id: String,
    /// Pod name.
    pub name: String,
    /// Pod namespace.
    pub namespace: String,
    /// Pod UID.
    pub uid: String,
    /// Port mappings (`portMappings` capability).
    pub port_mappings: Vec<PortMapping>,
    /// The pod's network namespace.
    pub netns_path: PathBuf,
    /// Traffic shaping (`bandwidth` capability), if requested.
    pub bandwidth: Option<Bandwidth>,
    /// DNS settings (`dns` capability), if any.
    pub dns: Option<DnsConfig>,
}

/// The attached pod's network.
#[derive(Debug, Clone, PartialEq)]
pub struct PodNetResult {
    /// The pod's addresses, primary first.
    pub ips: Vec<IpAddr>,
    /// Interfaces the plugins reported.
    pub interfaces: Vec<Interface>,
    /// The whole result (routes, DNS).
    pub result: CniResult,
}

/// Why attaching or detaching a pod failed.
#[derive(Debug, Error)]
pub enum NetError {
    /// No usable network config.
    #[error(transparent)]
    Config(#[from] CniError),
    /// A pod field cannot be passed to the plugins.
    #[error("invalid pod network request: {0}")]
    InvalidPod(#[source] CniExecError),
    /// ADD failed; the attachment was rolled back with DEL, unless `rollback` says otherwise.
    #[error("CNI ADD for network {network:?} failed: {source}{}", rollback_note(.rollback))]
    Add {
        /// The network.
        network: String,
        /// The ADD failure.
        #[source]
        source: CniExecError,
        /// The failure of the rollback DEL, if it failed too (something may be left allocated).
        rollback: Option<CniExecError>,
    },
    /// ADD succeeded but gave the pod no address on its interface; rolled back as above.
    #[error("CNI network {network:?} gave the pod no IP address on {POD_IFNAME}{}", rollback_note(.rollback))]
    NoPodIp {
        /// The network.
        network: String,
        /// The failure of the rollback DEL, if any.
        rollback: Option<CniExecError>,
    },
    /// DEL failed.
    #[error("CNI DEL for network {network:?} failed: {source}")]
    Teardown {
        /// The network.
        network: String,
        #[source]
        source: CniExecError,
    },
    /// CHECK failed: the attachment is not as ADD left it, or cannot be checked.
    #[error("CNI CHECK for network {network:?} failed: {source}")]
    Check {
        /// The network.
        network: String,
        #[source]
        source: CniExecError,
    },
    /// The namespace could not be inspected.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// CNI plugins a crashed remora left running for the pod did not go, even killed.
    #[error(transparent)]
    PluginsLeft(#[from] super::cni::orphans::PluginsLeft),
    /// The blocking config load did not complete (panicked or runtime shutting down).
    #[error("loading the CNI config did not complete: {0}")]
    Aborted(String),
}

fn rollback_note(rollback: &Option<CniExecError>) -> String {
    match rollback {
        Some(e) => format!("; rollback DEL also failed, resources may be left: {e}"),
        None => String::new(),
    }
}

/// Attaches pods to the CNI network configured in a conf dir.
#[derive(Debug, Clone)]
pub struct PodNetwork {
    conf_dir: PathBuf,
    bin_dirs: Vec<PathBuf>,
    exec: CniExec,
}

impl PodNetwork {
    /// A facade over the given dirs; nothing is read until the first call.
    pub fn new(config: PodNetworkConfig) -> Self {
        let exec = CniExec::new(
            config.bin_dirs.clone(),
            config.cache_dir,
            config.plugin_timeout,
        );
        Self {
            conf_dir: config.conf_dir,
            bin_dirs: config.bin_dirs,
            exec,
        }
    }

    /// Attaches the pod: CNI ADD of the current network into `pod.netns_path`. On failure
    /// nothing stays allocated (see the module docs).
    pub async fn setup(&self, pod: &PodNetInfo) -> Result<PodNetResult, NetError> {
        let net = self.load().await?;
        let rt = attachment(pod, Some(pod.netns_path.clone())).map_err(NetError::InvalidPod)?;
        let mut rollback = Rollback(Some((self.exec.clone(), net.clone(), rt.clone())));
        let failure = match self.exec.add(&net, &rt).await {
            Ok(result) => {
                let ips = result.pod_ips(POD_IFNAME);
                if !ips.is_empty() {
                    rollback.disarm();
                    return Ok(PodNetResult {
                        ips,
                        interfaces: result.interfaces.clone(),
                        result,
                    });
                }
                None
            }
            Err(e) => Some(e),
        };
        let rollback = rollback.run().await.err();
        let network = net.name;
        Err(match failure {
            Some(source) => NetError::Add {
                network,
                source,
                rollback,
            },
            None => NetError::NoPodIp { network, rollback },
        })
    }

    /// Detaches the pod: CNI DEL. Idempotent; works when the namespace is already gone.
    pub async fn teardown(&self, pod: &PodNetInfo) -> Result<(), NetError> {
        let net = self.load().await?;
        let netns = self.live_netns(pod).await?;
        let rt = attachment(pod, netns).map_err(NetError::InvalidPod)?;
        self.exec
            .del(&net, &rt)
            .await
            .map_err(|source| NetError::Teardown {
                network: net.name.clone(),
                source,
            })
    }

    /// Waits for the CNI plugins a crashed remora left running for pod `id` (they outlive
    /// it; a DEL must come after them), for at most the plugin timeout, then kills them. See
    /// [`super::cni::orphans`]. Only for pods no call of this process is attaching.
    pub async fn await_orphaned_plugins(
        &self,
        id: &str,
    ) -> Result<super::cni::orphans::Orphans, NetError> {
        Ok(super::cni::orphans::await_orphans(id, self.exec.timeout(), &self.bin_dirs).await?)
    }

    /// Verifies the pod's attachment is as ADD left it (CNI CHECK, cniVersion 0.4.0 or later).
    #[cfg(test)]
    pub async fn check(&self, pod: &PodNetInfo) -> Result<(), NetError> {
        let net = self.load().await?;
        let rt = attachment(pod, Some(pod.netns_path.clone())).map_err(NetError::InvalidPod)?;
        self.exec
            .check(&net, &rt)
            .await
            .map_err(|source| NetError::Check {
                network: net.name.clone(),
                source,
            })
    }

    /// The pod's namespace path if it is still a live namespace. A removed one (or a plain
    /// file left where it was) is `None`, which plugins read as "already gone".
    async fn live_netns(&self, pod: &PodNetInfo) -> Result<Option<PathBuf>, NetError> {
        let path = pod.netns_path.clone();
        let p = path.clone();
        let live = tokio::task::spawn_blocking(move || netns::is_netns(&p))
            .await
            .map_err(|e| NetError::Aborted(e.to_string()))??;
        Ok(live.then_some(path))
    }

    async fn load(&self) -> Result<Network, NetError> {
        let (conf_dir, bin_dirs) = (self.conf_dir.clone(), self.bin_dirs.clone());
        // Reading the conf dir is blocking file I/O; keep it off the async workers.
        tokio::task::spawn_blocking(move || cni::load_network(&conf_dir, &bin_dirs))
            .await
            .map_err(|e| NetError::Aborted(e.to_string()))?
            .map_err(NetError::from)
    }
}

/// A pending DEL for a failed or abandoned ADD. `run` does it inline; dropping it while still
/// armed (the `setup` future was dropped) hands it to a detached task, so the caller's
/// cancellation does not cancel the cleanup.
struct Rollback(Option<(CniExec, Network, Attachment)>);

impl Rollback {
    fn disarm(&mut self) {
        self.0 = None;
    }

    async fn run(mut self) -> Result<(), CniExecError> {
        let result = match &self.0 {
            Some((exec, net, rt)) => exec.del(net, rt).await,
            None => Ok(()),
        };
        // Disarmed only once DEL finished: if this future is dropped mid-DEL, Drop retries it.
        self.disarm();
        result
    }
}

impl Drop for Rollback {
    fn drop(&mut self) {
        if let Some((exec, net, rt)) = self.0.take() {
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move {
                    // Nobody is left to report to; a later teardown of the pod (StopPodSandbox)
                    // runs DEL again, which is idempotent.
                    let _ = exec.del(&net, &rt).await;
                });
            }
        }
    }
}

/// The runtime side of a CNI call for `pod`: `CNI_ARGS` as kubelet's dockershim and containerd
/// pass them, and the capability arguments.
pub fn attachment(pod: &PodNetInfo, netns: Option<PathBuf>) -> Result<Attachment, CniExecError> {
    let args = vec![
        ("K8S_POD_NAMESPACE".to_string(), pod.namespace.clone()),
        ("K8S_POD_NAME".to_string(), pod.name.clone()),
        ("K8S_POD_INFRA_CONTAINER_ID".to_string(), pod.id.clone()),
        ("K8S_POD_UID".to_string(), pod.uid.clone()),
        ("IgnoreUnknown".to_string(), "1".to_string()),
    ];
    // Fail here rather than in the middle of a plugin chain.
    super::cni::cni_args(&args)?;
    let mut caps = Map::new();
    // Always present (possibly empty), as containerd passes it.
    let ports: Vec<Value> = pod
        .port_mappings
        .iter()
        .filter(|p| p.host_port > 0)
        .map(|p| {
            let mut m = json!({
                "hostPort": p.host_port,
                "containerPort": p.container_port,
                "protocol": p.protocol.as_cni(),
            });
            if !p.host_ip.is_empty() {
                m["hostIP"] = Value::String(p.host_ip.clone());
            }
            m
        })
        .collect();
    caps.insert("portMappings".into(), Value::Array(ports));
    if let Some(b) = pod.bandwidth {
        caps.insert(
            "bandwidth".into(),
            json!({
                "ingressRate": b.ingress_rate,
                "ingressBurst": b.ingress_burst,
                "egressRate": b.egress_rate,
                "egressBurst": b.egress_burst,
            }),
        );
    }
    if let Some(d) = &pod.dns {
        caps.insert(
            "dns".into(),
            json!({"servers": d.servers, "searches": d.searches, "options": d.options}),
        );
    }
    Ok(Attachment {
        container_id: pod.id.clone(),
        netns,
        ifname: POD_IFNAME.to_string(),
        args,
        capability_args: caps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn pod(id: &str, netns: &Path) -> PodNetInfo {
        PodNetInfo {
            id: id.into(),
            name: "web".into(),
            namespace: "default".into(),
            uid: "0f1e2d3c-0000-4000-8000-000000000001".into(),
            port_mappings: vec![],
            netns_path: netns.to_path_buf(),
            bandwidth: None,
            dns: None,
        }
    }

    #[test]
    fn attachment_carries_k8s_args_and_capabilities() {
        let mut p = pod("sb1", Path::new("/run/remora/netns/sb1"));
        p.port_mappings = vec![
            PortMapping {
                host_port: 8080,
                container_port: 80,
                protocol: Protocol::Tcp,
                host_ip: String::new(),
            },
            PortMapping {
                host_port: 5353,
                container_port: 53,
                protocol: Protocol::Udp,
                host_ip: "127.0.0.1".into(),
            },
            // No host port: not a mapping the plugins can do anything with.
            PortMapping {
                host_port: 0,
                container_port: 9000,
                protocol: Protocol::Sctp,
                host_ip: String::new(),
            },
        ];
        p.bandwidth = Some(Bandwidth {
            ingress_rate: 1_000_000,
            ingress_burst: 2_000_000,
            egress_rate: 3,
            egress_burst: 4,
        });
        p.dns = Some(DnsConfig {
            servers: vec!["10.96.0.10".into()],
            searches: vec!["default.svc.cluster.local".into()],
            options: vec!["ndots:5".into()],
        });
        let a = attachment(&p, Some(p.netns_path.clone())).unwrap();
        assert_eq!(a.container_id, "sb1");
        assert_eq!(a.ifname, "eth0");
        assert_eq!(
            super::super::cni::cni_args(&a.args).unwrap(),
            "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;K8S_POD_INFRA_CONTAINER_ID=sb1;\
             K8S_POD_UID=0f1e2d3c-0000-4000-8000-000000000001;IgnoreUnknown=1"
        );
        assert_eq!(
            Value::Object(a.capability_args),
            json!({
                "portMappings": [
                    {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
                    {"hostPort": 5353, "containerPort": 53, "protocol": "udp", "hostIP": "127.0.0.1"}
                ],
                "bandwidth": {"ingressRate": 1000000, "ingressBurst": 2000000, "egressRate": 3, "egressBurst": 4},
                "dns": {"servers": ["10.96.0.10"], "searches": ["default.svc.cluster.local"], "options": ["ndots:5"]}
            })
        );

        let mut bad = pod("sb2", Path::new("/x"));
        bad.name = "a;b".into();
        assert!(attachment(&bad, None).is_err());
    }

    fn fake_plugin(dir: &Path, name: &str, script: &str) {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[tokio::test]
    async fn a_dropped_setup_kills_the_plugin_and_still_runs_del() {
        let tmp = tempfile::tempdir().unwrap();
        let (bin, conf, cache) = (
            tmp.path().join("bin"),
            tmp.path().join("conf"),
            tmp.path().join("cache"),
        );
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::create_dir_all(&conf).unwrap();
        let log = tmp.path().join("log");
        fake_plugin(
            &bin,
            "slow",
            &format!(
                "cat > /dev/null; echo \"$CNI_COMMAND\" >> {}\n\
                 [ \"$CNI_COMMAND\" = ADD ] && exec sleep 600\nexit 0",
                log.display()
            ),
        );
        std::fs::write(
            conf.join("10.conflist"),
            r#"{"cniVersion":"1.0.0","name":"slow","plugins":[{"type":"slow"}]}"#,
        )
        .unwrap();
        let net = PodNetwork::new(PodNetworkConfig {
            conf_dir: conf,
            bin_dirs: vec![bin],
            cache_dir: cache,
            plugin_timeout: Duration::from_secs(60),
        });
        let p = pod("sb-drop", &tmp.path().join("netns"));
        // The caller gives up (its RPC was cancelled) while ADD hangs.
        let r = tokio::time::timeout(Duration::from_millis(500), net.setup(&p)).await;
        assert!(r.is_err(), "setup should still be running");
        let mut seen = String::new();
        for _ in 0..100 {
            seen = std::fs::read_to_string(&log).unwrap_or_default();
            if seen.lines().any(|l| l == "DEL") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(seen, "ADD\nDEL\n");
    }

    /// Tests against Debian's real plugins, as root.
    mod real_plugins {
        use super::*;
        use crate::net::netns::tests::{mounts_under, require_root, DirMount};
        use crate::net::netns::{self, NetnsDir};
        use nix::ifaddrs::getifaddrs;
        use nix::net::if_::InterfaceFlags;
        use std::future::Future;

        const PLUGIN_DIR: &str = "/usr/lib/cni";

        /// Fails (never skips) without the plugins: these tests are the proof that real CNI
        /// works, so a machine without them must say so loudly.
        fn require_plugins() {
            for p in ["bridge", "host-local", "portmap"] {
                assert!(
                    Path::new(PLUGIN_DIR).join(p).is_file(),
                    "{PLUGIN_DIR}/{p} is missing: install the CNI plugins \
                     (`apt-get install containernetworking-plugins`)"
                );
            }
        }

        /// A number that differs between tests and runs, for bridge names and subnets.
        fn random() -> u32 {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos();
            nanos ^ std::process::id().rotate_left(16)
        }

        /// A temp dir with a prepared netns dir and a scratch "host" network namespace.
        ///
        /// The test body runs on a current-thread runtime whose thread has joined the scratch
        /// namespace, so the plugins it starts (forked from that thread) create the bridge, the
        /// host ends of the veths and the portmap iptables rules in there, not on the real host.
        /// Dropping the fixture removes the scratch namespace, and with it every bridge and
        /// veth a test made, even when the test failed halfway.
        struct Scratch {
            nsdir: NetnsDir,
            host_ns: PathBuf,
            // Fields drop in order: the dir's self-bind mount must go before the temp dir.
            _dir_mount: DirMount,
            tmp: tempfile::TempDir,
        }

        impl Drop for Scratch {
            fn drop(&mut self) {
                // Namespaces a failed test did not remove, the scratch host among them.
                for e in std::fs::read_dir(self.nsdir.dir())
                    .into_iter()
                    .flatten()
                    .flatten()
                {
                    let _ = nix::mount::umount2(&e.path(), nix::mount::MntFlags::MNT_DETACH);
                }
            }
        }

        fn run_in_scratch<F, Fut>(body: F)
        where
            F: FnOnce(PathBuf, NetnsDir, PathBuf) -> Fut + Send + 'static,
            Fut: Future<Output = ()>,
        {
            require_root();
            require_plugins();
            let setup_rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path().join("netns");
            let nsdir = setup_rt.block_on(NetnsDir::prepare(&dir)).unwrap();
            let scratch = Scratch {
                _dir_mount: DirMount(dir),
                host_ns: setup_rt.block_on(nsdir.create("scratch-host")).unwrap(),
                nsdir,
                tmp,
            };
            let (host_ns, nsdir, root) = (
                scratch.host_ns.clone(),
                scratch.nsdir.clone(),
                scratch.tmp.path().to_path_buf(),
            );
            let outcome = std::thread::spawn(move || {
                let ns = std::fs::File::open(&host_ns).unwrap();
                nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(body(root, nsdir, host_ns));
            })
            .join();
            drop(scratch);
            if let Err(panic) = outcome {
                std::panic::resume_unwind(panic);
            }
        }

        /// (interface name, IPv4 addresses, is up) for every interface in the namespace.
        async fn links(ns: &Path) -> Vec<(String, Vec<IpAddr>, bool)> {
            let ns = ns.to_path_buf();
            tokio::task::spawn_blocking(move || {
                netns::run_in(&ns, || {
                    let mut out: Vec<(String, Vec<IpAddr>, bool)> = Vec::new();
                    for a in getifaddrs().unwrap() {
                        let ip = a
                            .address
                            .and_then(|s| s.as_sockaddr_in().map(|v4| IpAddr::V4(v4.ip())));
                        let up = a.flags.contains(InterfaceFlags::IFF_UP);
                        match out.iter_mut().find(|(n, _, _)| *n == a.interface_name) {
                            Some(e) => e.1.extend(ip),
                            None => out.push((a.interface_name, ip.into_iter().collect(), up)),
                        }
                    }
                    out
                })
            })
            .await
            .unwrap()
            .unwrap()
        }

        /// Addresses host-local has on record in `data_dir` (one file per allocated IP).
        fn allocations(data_dir: &Path) -> Vec<String> {
            walk(data_dir)
                .into_iter()
                .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().to_string()))
                .filter(|n| n.parse::<IpAddr>().is_ok())
                .collect()
        }

        fn walk(dir: &Path) -> Vec<PathBuf> {
            let mut out = Vec::new();
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let p = e.path();
                if p.is_dir() {
                    out.extend(walk(&p));
                } else {
                    out.push(p);
                }
            }
            out
        }

        /// The scratch host's NAT rules (portmap's), via the iptables the plugin itself uses.
        fn nat_rules() -> String {
            let out = std::process::Command::new("iptables-save")
                .args(["-t", "nat"])
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).into_owned()
        }

        fn conflist(root: &Path, bridge: &str, subnet: &str, extra: &str) -> PathBuf {
            let conf = root.join("conf");
            std::fs::create_dir_all(&conf).unwrap();
            let text = format!(
                r#"{{"cniVersion":"1.0.0","name":"remora-test","plugins":[
                  {{"type":"bridge","bridge":"{bridge}","isGateway":true,"ipMasq":false,
                    "ipam":{{"type":"host-local","dataDir":"{data}","ranges":[[{{"subnet":"{subnet}"}}]],
                             "routes":[{{"dst":"0.0.0.0/0"}}]}}}},
                  {{"type":"portmap","capabilities":{{"portMappings":true}},"snat":false}}{extra}]}}"#,
                data = root.join("ipam").display(),
            );
            std::fs::write(conf.join("10-test.conflist"), text).unwrap();
            conf
        }

        fn network(root: &Path, conf: PathBuf, extra_bin: Option<PathBuf>) -> PodNetwork {
            let mut bin_dirs: Vec<PathBuf> = extra_bin.into_iter().collect();
            bin_dirs.push(PLUGIN_DIR.into());
            PodNetwork::new(PodNetworkConfig {
                conf_dir: conf,
                bin_dirs,
                cache_dir: root.join("cache"),
                plugin_timeout: Duration::from_secs(30),
            })
        }

        #[test]
        fn setup_and_teardown_with_bridge_host_local_and_portmap() {
            run_in_scratch(|root, nsdir, host_ns| async move {
                let r = random();
                let bridge = format!("rmt{:06x}", r & 0xff_ffff);
                let subnet = format!("10.250.{}.0/24", r % 250 + 1);
                let net = network(&root, conflist(&root, &bridge, &subnet, ""), None);
                let ns = nsdir.create("pod-ok").await.unwrap();
                let mut p = pod(&format!("sandbox{r:08x}"), &ns);
                p.port_mappings = vec![PortMapping {
                    host_port: 30080,
                    container_port: 80,
                    protocol: Protocol::Tcp,
                    host_ip: String::new(),
                }];

                let res = net.setup(&p).await.unwrap();
                let ip = res.ips[0];
                let prefix = subnet.trim_end_matches("0/24");
                assert!(ip.to_string().starts_with(prefix), "{ip} not in {subnet}");
                assert!(res
                    .interfaces
                    .iter()
                    .any(|i| i.name == "eth0" && !i.sandbox.is_empty()));

                // In the pod's namespace: eth0 holds the address and lo is up.
                let pod_links = links(&ns).await;
                let eth0 = pod_links.iter().find(|l| l.0 == "eth0").unwrap();
                assert_eq!(eth0.1, vec![ip], "{pod_links:?}");
                assert!(eth0.2, "eth0 is down");
                assert!(
                    pod_links.iter().any(|l| l.0 == "lo" && l.2),
                    "{pod_links:?}"
                );
                // On the (scratch) host: the bridge and one veth.
                let host_links = links(&host_ns).await;
                assert!(host_links.iter().any(|l| l.0 == bridge), "{host_links:?}");
                assert!(host_links.iter().any(|l| l.0.starts_with("veth")));
                assert_eq!(allocations(&root.join("ipam")), vec![ip.to_string()]);
                assert!(nat_rules().contains(&p.id), "no portmap rule for the pod");
                assert!(root.join("cache").read_dir().unwrap().count() == 1);
                // CHECK runs bridge and host-local first (they pass); Debian's portmap v1.1.1
                // then looks for IPv6 DNAT chains an IPv4-only pod never gets, a plugin bug
                // fixed upstream later. Either outcome shows the CHECK plumbing works.
                match net.check(&p).await {
                    Ok(()) => {}
                    Err(NetError::Check {
                        source: CniExecError::Plugin { plugin, msg, .. },
                        ..
                    }) if plugin == "portmap" && msg.contains("ipv6") => {}
                    Err(other) => panic!("CHECK failed: {other}"),
                }

                net.teardown(&p).await.unwrap();
                assert!(allocations(&root.join("ipam")).is_empty());
                assert!(!nat_rules().contains(&p.id), "portmap rule left behind");
                assert!(!links(&ns).await.iter().any(|l| l.0 == "eth0"));
                assert!(!links(&host_ns)
                    .await
                    .iter()
                    .any(|l| l.0.starts_with("veth")));
                assert_eq!(root.join("cache").read_dir().unwrap().count(), 0);
                // Idempotent, also once the namespace is gone.
                net.teardown(&p).await.unwrap();
                netns::remove(&ns).await.unwrap();
                assert!(mounts_under(&ns).is_empty());
                net.teardown(&p).await.unwrap();
            });
        }

        #[test]
        fn a_failing_plugin_after_bridge_leaves_nothing_allocated() {
            run_in_scratch(|root, nsdir, host_ns| async move {
                let r = random();
                let bridge = format!("rmt{:06x}", r & 0xff_ffff);
                let subnet = format!("10.250.{}.0/24", r % 250 + 1);
                let bin = root.join("bin");
                std::fs::create_dir_all(&bin).unwrap();
                fake_plugin(
                    &bin,
                    "failer",
                    "cat > /dev/null\n[ \"$CNI_COMMAND\" = DEL ] && exit 0\n\
                     echo '{\"cniVersion\":\"1.0.0\",\"code\":11,\"msg\":\"try again later\"}'; exit 1",
                );
                let conf = conflist(&root, &bridge, &subnet, r#",{"type":"failer"}"#);
                let net = network(&root, conf, Some(bin));
                let ns = nsdir.create("pod-fail").await.unwrap();
                let mut p = pod(&format!("sandbox{r:08x}"), &ns);
                p.port_mappings = vec![PortMapping {
                    host_port: 30081,
                    container_port: 80,
                    protocol: Protocol::Tcp,
                    host_ip: String::new(),
                }];

                let err = net.setup(&p).await.unwrap_err();
                match &err {
                    NetError::Add {
                        source: CniExecError::Plugin { plugin, code, .. },
                        rollback: None,
                        ..
                    } => {
                        assert_eq!(plugin, "failer");
                        assert_eq!(*code, 11);
                    }
                    other => panic!("unexpected: {other}"),
                }
                assert!(allocations(&root.join("ipam")).is_empty());
                assert!(!nat_rules().contains(&p.id), "portmap rule left behind");
                assert!(!links(&ns).await.iter().any(|l| l.0 == "eth0"));
                let host_links = links(&host_ns).await;
                assert!(
                    !host_links.iter().any(|l| l.0.starts_with("veth")),
                    "{host_links:?}"
                );
                netns::remove(&ns).await.unwrap();
            });
        }

        /// An invalid subnet fails host-local's config parsing in ADD *and* in DEL, so the
        /// rollback DEL cannot run the bridge plugin's cleanup: the error says so, and the veth
        /// the bridge plugin made before calling IPAM goes when the sandbox's own rollback
        /// removes the namespace (as containerd's does). Nothing was allocated.
        #[test]
        fn bridge_with_an_invalid_subnet_fails_typed_and_netns_removal_leaves_no_veth() {
            run_in_scratch(|root, nsdir, host_ns| async move {
                let r = random();
                let bridge = format!("rmt{:06x}", r & 0xff_ffff);
                let net = network(&root, conflist(&root, &bridge, "10.250.1.0/33", ""), None);
                let ns = nsdir.create("pod-bad").await.unwrap();
                let p = pod(&format!("sandbox{r:08x}"), &ns);

                let err = net.setup(&p).await.unwrap_err();
                match &err {
                    NetError::Add {
                        source: CniExecError::Plugin { plugin, msg, .. },
                        rollback: Some(CniExecError::Plugin { command, .. }),
                        ..
                    } => {
                        assert_eq!(plugin, "bridge");
                        assert!(msg.contains("10.250.1.0/33"), "{msg}");
                        assert_eq!(*command, crate::net::cni::CniCommand::Del);
                    }
                    other => panic!("unexpected: {other}"),
                }
                assert!(allocations(&root.join("ipam")).is_empty());
                assert_eq!(
                    root.join("cache")
                        .read_dir()
                        .map(|d| d.count())
                        .unwrap_or(0),
                    0
                );

                netns::remove(&ns).await.unwrap();
                // The namespace is gone once its last reference is; give the kernel a moment.
                let mut host_links = Vec::new();
                for _ in 0..50 {
                    host_links = links(&host_ns).await;
                    if !host_links.iter().any(|l| l.0.starts_with("veth")) {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                assert!(
                    !host_links.iter().any(|l| l.0.starts_with("veth")),
                    "{host_links:?}"
                );
                // Teardown after that is fine too (nothing attached, namespace gone)? No: the
                // config itself is invalid, so DEL keeps failing; that is reported, not hidden.
                assert!(matches!(
                    net.teardown(&p).await,
                    Err(NetError::Teardown { .. })
                ));
            });
        }
    }
}
