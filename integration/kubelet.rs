//! The kubelet suite: a real kubelet (built by `scripts/setup.sh` at the version it pins) in
//! standalone mode — static pods from a manifest directory, no API server — drives a remora of
//! its own on the test bed's containerd, registry and pod network. Every scenario is checked
//! through kubelet's own view (its `/pods` endpoint: phase, readiness, restart counts, exit
//! codes and reasons; `/containerLogs`) and through CRI.
//!
//! It is its own test binary, so cargo never runs it beside the other integration tests: a
//! kubelet changes host-wide state (sysctls, iptables chains, `/var/lib/kubelet`), which
//! [`HostState`] records before and restores after, pass or fail. Its two runs (the feature
//! gates of [`GATES`], then those and `EventedPLEG`) take turns on one lock (and a file lock
//! across test processes, [`one_kubelet`]), and so do the scenarios run on their own (an image
//! volume's `subPath`, a device plugin's CDI device).
//!
//! The kubelet settings are the ones `docs/kubelet.md` documents for running kubelet against
//! remora on a cgroup v1 host without systemd.

#[allow(dead_code)]
mod cri;
mod deviceplugin;
#[allow(dead_code)]
mod harness;
#[allow(dead_code)]
mod sweep;
#[allow(dead_code)]
mod testbed;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use remora::cri::v1;
use serde_json::{json, Value};

use harness::{scratch, tool, wait_until, BedRemora};
use testbed::{mount_points_under, TESTBED_REGISTRY};

/// kubelet's HTTPS port (loopback only; anonymous, read-only use by the test).
const KUBELET_PORT: u16 = 10350;
/// kubelet's healthz port (loopback only).
const HEALTHZ_PORT: u16 = 10348;
/// The host port the web pod publishes on 127.0.0.1.
const HOST_PORT: u16 = 12893;
/// The node name kubelet uses; static pods are named `<name>-<node>`.
const NODE: &str = "remora-kubelet-it";
/// Images, by the public names kubelet asks for (the test bed maps them to its registry).
const BUSYBOX: &str = "registry.k8s.io/e2e-test-images/busybox:1.29-2";
const NGINX: &str = "registry.k8s.io/e2e-test-images/nginx:1.14-2";
/// The test bed's IPAM directory (host-local) for its pod network.
const IPAM_DIR: &str = "/run/remora-testbed/cni/networks";
/// Host sysctls kubelet sets at start.
const SYSCTLS: &[&str] = &[
    "vm/overcommit_memory",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];
/// Where kubelet's device manager puts its socket whatever `--root-dir` says.
const DEVICE_PLUGINS: &str = "/var/lib/kubelet/device-plugins";

/// One run at a time: kubelet binds fixed ports and changes host-wide state.
static ONE_KUBELET: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
/// The same across test processes (worktrees sharing the machine): a second kubelet would
/// take the first one's ports and its `/var/lib/kubelet/device-plugins`.
const HOST_LOCK: &str = "/run/remora-kubelet.lock";

/// A turn to run kubelet: [`ONE_KUBELET`], then an exclusive `flock` of [`HOST_LOCK`].
async fn one_kubelet() -> (
    tokio::sync::MutexGuard<'static, ()>,
    nix::fcntl::Flock<std::fs::File>,
) {
    let turn = ONE_KUBELET.lock().await;
    let start = Instant::now();
    loop {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(HOST_LOCK)
            .expect("open the kubelet lock file");
        match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return (turn, lock),
            Err((_, e)) => assert!(
                start.elapsed() < Duration::from_secs(1800),
                "{HOST_LOCK} still held by another kubelet run after 30 min ({e})"
            ),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The feature gates (kubelet 1.37) of the CRI features remora serves, on in every run. Those
/// GA and locked on are named too, so that the list says what the suite exercises.
const GATES: &[&str] = &[
    // GA (locked on) since 1.36: `image` volumes, CRI `Mount.image`.
    "ImageVolume",
    // GA (locked on) since 1.36: `hostUsers: false`, CRI user-namespace options.
    "UserNamespacesSupport",
    // Alpha: `lifecycle.stopSignal`, CRI `ContainerConfig.stop_signal`.
    "ContainerStopSignals",
    // Beta, off by default: pod and container stats from CRI (`ListPodSandboxStats`) instead
    // of cAdvisor, for `/stats/summary`.
    "PodAndContainerStatsFromCRI",
    // Alpha: the `Stream*` list RPCs instead of the unary `List*` ones.
    "CRIListStreaming",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_runs_pods_on_remora() {
    let _turn = one_kubelet().await;
    run_suite(GATES).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_with_evented_pleg_runs_pods_on_remora() {
    let _turn = one_kubelet().await;
    let mut gates = GATES.to_vec();
    gates.push("EventedPLEG");
    run_suite(&gates).await;
}

/// Host-wide state kubelet changes, recorded before it starts and put back on drop.
struct HostState {
    sysctls: Vec<(String, String)>,
    /// `(binary, table, chain)` that existed before.
    chains: BTreeSet<(String, String, String)>,
    device_plugins_existed: bool,
    /// The device manager's checkpoint found in [`DEVICE_PLUGINS`] (a fixed path, not under
    /// kubelet's root dir), taken away before kubelet starts and put back after.
    device_checkpoint: Option<Vec<u8>>,
    var_lib_kubelet_existed: bool,
}

/// kubelet's device manager checkpoint: the devices it allocated, by pod UID. One left by an
/// earlier kubelet (this suite's pods have fixed UIDs) makes kubelet reuse that allocation
/// instead of asking the plugin.
const DEVICE_CHECKPOINT: &str = "kubelet_internal_checkpoint";

/// Where kubelet's device manager keeps [`DEVICE_CHECKPOINT`].
fn device_checkpoint_path() -> PathBuf {
    Path::new(DEVICE_PLUGINS).join(DEVICE_CHECKPOINT)
}

const IPTABLES: &[&str] = &["iptables", "ip6tables"];
const TABLES: &[&str] = &["filter", "nat", "mangle"];

/// `iptables -t table -S` lines (empty when the binary or table is unusable here).
fn iptables_rules(bin: &str, table: &str) -> Vec<String> {
    Command::new(bin)
        .args(["-w", "-t", table, "-S"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

fn chains() -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for bin in IPTABLES {
        for table in TABLES {
            for line in iptables_rules(bin, table) {
                if let Some(chain) = line.strip_prefix("-N ") {
                    out.insert((bin.to_string(), table.to_string(), chain.to_string()));
                }
            }
        }
    }
    out
}

impl HostState {
    /// Records the state and takes away a device manager checkpoint an earlier kubelet left.
    fn record() -> Self {
        let checkpoint = device_checkpoint_path();
        let device_checkpoint = std::fs::read(&checkpoint).ok();
        if device_checkpoint.is_some() {
            std::fs::remove_file(&checkpoint).expect("remove kubelet's device checkpoint");
        }
        let sysctls = SYSCTLS
            .iter()
            .filter_map(|k| {
                std::fs::read_to_string(format!("/proc/sys/{k}"))
                    .ok()
                    .map(|v| (k.to_string(), v.trim().to_string()))
            })
            .collect();
        HostState {
            sysctls,
            chains: chains(),
            device_plugins_existed: Path::new(DEVICE_PLUGINS).exists(),
            device_checkpoint,
            var_lib_kubelet_existed: Path::new("/var/lib/kubelet").exists(),
        }
    }

    /// The `KUBE-*` chains kubelet added that are still there.
    fn added_chains(&self) -> Vec<(String, String, String)> {
        chains()
            .into_iter()
            .filter(|c| c.2.starts_with("KUBE-") && !self.chains.contains(c))
            .collect()
    }

    /// Removes the rules that jump to chains kubelet added, then the chains; puts the
    /// sysctls back; removes the directories kubelet made outside its root dir.
    fn restore(&self) {
        let added = self.added_chains();
        for bin in IPTABLES {
            for table in TABLES {
                let ours: Vec<&str> = added
                    .iter()
                    .filter(|(b, t, _)| b == bin && t == table)
                    .map(|(_, _, c)| c.as_str())
                    .collect();
                if ours.is_empty() {
                    continue;
                }
                // Rules jumping to (or living in) an added chain: delete them by their spec.
                for line in iptables_rules(bin, table) {
                    let Some(rule) = line.strip_prefix("-A ") else {
                        continue;
                    };
                    let jumps = ours.iter().any(|c| {
                        rule.ends_with(&format!("-j {c}")) || rule.contains(&format!("-j {c} "))
                    });
                    let inside = ours.iter().any(|c| rule.starts_with(&format!("{c} ")));
                    if jumps && !inside {
                        // `iptables -S` quotes like a shell would; let one parse it.
                        let _ = Command::new("sh")
                            .arg("-c")
                            .arg(format!("{bin} -w -t {table} -D {rule}"))
                            .status();
                    }
                }
                for c in &ours {
                    let _ = Command::new(bin)
                        .args(["-w", "-t", table, "-F", c])
                        .status();
                }
                for c in &ours {
                    let _ = Command::new(bin)
                        .args(["-w", "-t", table, "-X", c])
                        .status();
                }
            }
        }
        for (k, v) in &self.sysctls {
            let _ = std::fs::write(format!("/proc/sys/{k}"), v);
        }
        if !self.device_plugins_existed {
            let _ = std::fs::remove_dir_all(DEVICE_PLUGINS);
        } else {
            let checkpoint = device_checkpoint_path();
            let _ = match &self.device_checkpoint {
                Some(bytes) => std::fs::write(&checkpoint, bytes),
                None => std::fs::remove_file(&checkpoint),
            };
        }
        if !self.var_lib_kubelet_existed {
            let _ = std::fs::remove_dir_all("/var/lib/kubelet");
        }
    }

    /// What differs from the recorded state (empty when restored).
    fn differences(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .added_chains()
            .into_iter()
            .map(|(b, t, c)| format!("{b} -t {t}: chain {c} left"))
            .collect();
        for (k, v) in &self.sysctls {
            let now = std::fs::read_to_string(format!("/proc/sys/{k}")).unwrap_or_default();
            if now.trim() != v {
                out.push(format!("{k} = {} (was {v})", now.trim()));
            }
        }
        if !self.device_plugins_existed && Path::new(DEVICE_PLUGINS).exists() {
            out.push(format!("{DEVICE_PLUGINS} left"));
        }
        let checkpoint = std::fs::read(device_checkpoint_path()).ok();
        if self.device_plugins_existed && checkpoint != self.device_checkpoint {
            out.push(format!("{DEVICE_PLUGINS}/{DEVICE_CHECKPOINT} changed"));
        }
        out
    }
}

/// A kubelet process with its config and dirs.
struct Kubelet {
    dir: PathBuf,
    child: Option<Child>,
    log: PathBuf,
}

impl Kubelet {
    fn manifests(dir: &Path) -> PathBuf {
        dir.join("manifests")
    }

    fn pod_logs(dir: &Path) -> PathBuf {
        dir.join("pod-logs")
    }

    fn root(dir: &Path) -> PathBuf {
        dir.join("root")
    }

    /// Writes kubelet's config (see `docs/kubelet.md`) and starts it.
    fn start(dir: &Path, remora_socket: &Path, gates: &[&str]) -> Self {
        for d in [Self::manifests(dir), Self::pod_logs(dir), Self::root(dir)] {
            std::fs::create_dir_all(&d).expect("kubelet dirs");
        }
        let endpoint = format!("unix://{}", remora_socket.display());
        let gates: serde_json::Map<String, Value> =
            gates.iter().map(|g| (g.to_string(), json!(true))).collect();
        let config = json!({
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "containerRuntimeEndpoint": endpoint,
            "imageServiceEndpoint": endpoint,
            "staticPodPath": Self::manifests(dir),
            "fileCheckFrequency": "1s",
            "podLogsDir": Self::pod_logs(dir),
            "volumePluginDir": dir.join("volume-plugins"),
            "address": "127.0.0.1",
            "port": KUBELET_PORT,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": HEALTHZ_PORT,
            "authentication": {"anonymous": {"enabled": true}, "webhook": {"enabled": false}},
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": false,
            "cgroupsPerQOS": false,
            "enforceNodeAllocatable": [],
            "failSwapOn": false,
            "containerLogMaxSize": "16Ki",
            "containerLogMaxFiles": 3,
            "containerLogMonitorInterval": "3s",
            "serializeImagePulls": false,
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "1Mi",
                "nodefs.available": "1%",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "1%"
            },
            "featureGates": gates,
        });
        let config_path = dir.join("kubelet.json");
        std::fs::write(&config_path, config.to_string()).expect("write kubelet config");
        let mut k = Kubelet {
            dir: dir.to_path_buf(),
            child: None,
            log: dir.join("kubelet.log"),
        };
        k.spawn();
        k
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("kubelet log");
        let child = Command::new(tool("kubelet"))
            .arg(format!(
                "--config={}",
                self.dir.join("kubelet.json").display()
            ))
            .arg(format!("--root-dir={}", Self::root(&self.dir).display()))
            // Its default is /var/lib/kubelet/pki, whatever the root dir.
            .arg(format!("--cert-dir={}", self.dir.join("pki").display()))
            .arg(format!("--hostname-override={NODE}"))
            // Keep every dead attempt of a container for the crash-loop checks (the default
            // keeps one per container once garbage collection runs, every minute).
            .arg("--maximum-dead-containers-per-container=10")
            .arg("--v=2")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .expect("start kubelet");
        self.child = Some(child);
    }

    /// Stops kubelet (SIGTERM, SIGKILL after 10 s); its pods keep running.
    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            harness::stop_child(&mut child, nix::sys::signal::Signal::SIGTERM);
        }
    }

    /// kubelet's log so far (its stderr, written unbuffered).
    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn log_tail(&self, lines: usize) -> String {
        let text = self.log_text();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    fn write_manifest(&self, name: &str, pod: &Value) {
        let path = Self::manifests(&self.dir).join(format!("{name}.json"));
        let tmp = Self::manifests(&self.dir).join(format!(".{name}.json.tmp"));
        std::fs::write(&tmp, pod.to_string()).expect("write manifest");
        std::fs::rename(&tmp, &path).expect("move manifest into place");
    }

    fn remove_manifests(&self) {
        for e in std::fs::read_dir(Self::manifests(&self.dir)).expect("manifest dir") {
            let _ = std::fs::remove_file(e.expect("entry").path());
        }
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.stop();
        // Its root dir's self-bind (and whatever a failed run left below it).
        testbed::unmount_below(&self.dir);
        if std::thread::panicking() {
            eprintln!(
                "--- last 80 lines of kubelet's log ({}) ---\n{}",
                self.log.display(),
                self.log_tail(80)
            );
        }
    }
}

/// kubelet's HTTPS API on loopback (its own self-signed certificate).
struct KubeletApi {
    http: reqwest::Client,
    base: String,
}

impl KubeletApi {
    fn new() -> Self {
        let http = reqwest::Client::builder()
            // kubelet serves a self-signed certificate it made at start; loopback only.
            .danger_accept_invalid_certs(true)
            .timeout(Duration::from_secs(5))
            .build()
            .expect("http client");
        KubeletApi {
            http,
            base: format!("https://127.0.0.1:{KUBELET_PORT}"),
        }
    }

    async fn get(&self, path: &str) -> Option<String> {
        let r = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .ok()?;
        if !r.status().is_success() {
            return None;
        }
        r.text().await.ok()
    }

    /// A WebSocket session on kubelet's `path` (its `/exec` or `/portForward`), which kubelet
    /// proxies to the runtime's streaming URL: what `kubectl exec` and `port-forward` do since
    /// Kubernetes 1.31 (WebSocket first).
    async fn websocket(
        &self,
        path: &str,
        protocol: &str,
    ) -> tokio_tungstenite::WebSocketStream<reqwest::Upgraded> {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .header("Connection", "Upgrade")
            .header("Upgrade", "websocket")
            .header("Sec-WebSocket-Version", "13")
            .header("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
            .header("Sec-WebSocket-Protocol", protocol)
            .send()
            .await
            .expect("kubelet answers the upgrade request");
        let status = resp.status();
        assert_eq!(
            status,
            reqwest::StatusCode::SWITCHING_PROTOCOLS,
            "{path}: {:?}",
            resp.text().await
        );
        let upgraded = resp.upgrade().await.expect("upgraded connection");
        tokio_tungstenite::WebSocketStream::from_raw_socket(
            upgraded,
            tokio_tungstenite::tungstenite::protocol::Role::Client,
            None,
        )
        .await
    }

    /// Runs `cmd` in a container through kubelet's `/exec` over WebSocket
    /// (`v4.channel.k8s.io`): (stdout, the error channel's status).
    async fn exec(&self, pod: &str, container: &str, cmd: &[&str]) -> (String, Value) {
        use futures_util::StreamExt;
        let mut query = String::from("output=1&error=1");
        for c in cmd {
            query.push_str(&format!("&command={c}"));
        }
        let path = format!("/exec/default/{pod}-{NODE}/{container}?{query}");
        let mut ws = self.websocket(&path, "v4.channel.k8s.io").await;
        let (mut stdout, mut status) = (Vec::new(), Vec::new());
        let read = async {
            while let Some(Ok(msg)) = ws.next().await {
                let tokio_tungstenite::tungstenite::Message::Binary(data) = msg else {
                    continue;
                };
                match data.split_first() {
                    Some((1, rest)) => stdout.extend_from_slice(rest),
                    Some((3, rest)) => status.extend_from_slice(rest),
                    _ => {}
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(30), read)
            .await
            .expect("the exec session through kubelet ends");
        let status = serde_json::from_slice(&status).unwrap_or(Value::Null);
        (String::from_utf8_lossy(&stdout).into_owned(), status)
    }

    /// Sends `request` to `port` of a pod through kubelet's `/portForward` over WebSocket
    /// (`portforward.k8s.io`); what comes back on the data channel.
    async fn port_forward(&self, pod: &str, port: u16, request: &[u8], want: &str) -> String {
        use futures_util::{SinkExt, StreamExt};
        use tokio_tungstenite::tungstenite::Message;
        let path = format!("/portForward/default/{pod}-{NODE}?port={port}");
        let mut ws = self.websocket(&path, "portforward.k8s.io").await;
        let mut frame = vec![0u8];
        frame.extend_from_slice(request);
        ws.send(Message::binary(frame))
            .await
            .expect("send through the forward");
        // Each channel's first message is the port (2 bytes, little endian), then data.
        let mut seen = std::collections::HashSet::new();
        let mut data = Vec::new();
        let read = async {
            while let Some(Ok(msg)) = ws.next().await {
                let Message::Binary(bytes) = msg else {
                    continue;
                };
                let Some((&channel, rest)) = bytes.split_first() else {
                    continue;
                };
                if seen.insert(channel) {
                    assert_eq!(
                        rest,
                        port.to_le_bytes(),
                        "channel {channel} opens with the port"
                    );
                    continue;
                }
                if channel == 0 {
                    data.extend_from_slice(rest);
                    if String::from_utf8_lossy(&data).contains(want) {
                        break;
                    }
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(30), read)
            .await
            .expect("an answer through the forward");
        String::from_utf8_lossy(&data).into_owned()
    }

    /// kubelet's pods (its `/pods`), by pod name without the node suffix.
    async fn pods(&self) -> Option<Vec<Value>> {
        let text = self.get("/pods").await?;
        let v: Value = serde_json::from_str(&text).ok()?;
        // An empty list comes as `"items": null`.
        match &v["items"] {
            Value::Null => Some(Vec::new()),
            items => items.as_array().cloned(),
        }
    }

    async fn pod(&self, name: &str) -> Option<Value> {
        let full = format!("{name}-{NODE}");
        self.pods()
            .await?
            .into_iter()
            .find(|p| p["metadata"]["name"] == full.as_str())
    }

    /// Waits until `check` holds for the pod's status; returns that status.
    async fn wait_pod<F>(&self, name: &str, what: &str, limit: Duration, check: F) -> Value
    where
        F: Fn(&Value) -> bool,
    {
        let start = Instant::now();
        let mut last = Value::Null;
        loop {
            if let Some(p) = self.pod(name).await {
                if check(&p["status"]) {
                    return p["status"].clone();
                }
                last = p["status"].clone();
            }
            assert!(
                start.elapsed() < limit,
                "timed out after {limit:?} waiting for pod {name}: {what}; last status: {last:#}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn logs(&self, pod: &str, container: &str, query: &str) -> Option<String> {
        self.get(&format!(
            "/containerLogs/default/{pod}-{NODE}/{container}{query}"
        ))
        .await
    }
}

/// A container's status in a pod status, by name.
fn container<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["containerStatuses"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .unwrap_or(&Value::Null)
}

/// An init container's status in a pod status, by name.
fn init_container<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["initContainerStatuses"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .unwrap_or(&Value::Null)
}

fn running(c: &Value) -> bool {
    c["state"]["running"].is_object()
}

fn restarts(c: &Value) -> u64 {
    c["restartCount"].as_u64().unwrap_or(0)
}

/// The CRI id inside kubelet's `containerID` (`remora://<id>`).
fn cri_id(c: &Value) -> String {
    let id = c["containerID"].as_str().unwrap_or_default();
    assert!(
        id.starts_with("remora://"),
        "kubelet names containers by the runtime's name: {id:?}"
    );
    id.trim_start_matches("remora://").to_string()
}

/// A static pod manifest with sensible test defaults.
fn pod(name: &str, spec: Value) -> Value {
    let mut spec = spec;
    let s = spec.as_object_mut().expect("spec object");
    s.entry("terminationGracePeriodSeconds").or_insert(json!(2));
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "spec": spec,
    })
}

fn sh(name: &str, script: &str) -> Value {
    json!({
        "name": name,
        "image": BUSYBOX,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", script],
    })
}

/// The termination grace period of the `stubborn` pod, whose container ignores TERM.
const STUBBORN_GRACE: i64 = 5;

/// Whether kubelet runs init containers right with these gates. kubelet 1.37.2 decides which
/// init container to run from `PodStatus.ActiveContainerStatuses`, which its evented PLEG never
/// fills (`GeneratePodStatus`, and `GetPodStatus` when PodSandboxStatus has a timestamp): with
/// `EventedPLEG` it re-runs the first init container forever, on any runtime with evented
/// PLEG. That pass leaves init containers out until kubelet fixes it.
fn init_containers_work(gates: &[&str]) -> bool {
    !gates.contains(&"EventedPLEG")
}

/// The pod manifests of the suite; `hooks` is a host dir the hooks, stubborn and stopsig pods
/// write into (mounted at `/hooks`). Without `init_containers` (see [`init_containers_work`])
/// the init pod's main container writes what its init containers would and the sidecar pod is
/// left out.
/// `host_file` is a host file the user-namespaced pod appends to.
fn manifests(hooks: &Path, init_containers: bool, host_file: &Path) -> Vec<(&'static str, Value)> {
    let web = json!({
        "name": "nginx",
        "image": NGINX,
        "imagePullPolicy": "IfNotPresent",
        "ports": [{"containerPort": 80, "hostPort": HOST_PORT, "hostIP": "127.0.0.1"}],
        "readinessProbe": {"httpGet": {"path": "/", "port": 80}, "periodSeconds": 1},
        "livenessProbe": {"tcpSocket": {"port": 80}, "periodSeconds": 2},
    });
    let mut liveness = sh(
        "app",
        "trap 'exit 42' TERM; touch /tmp/alive; (sleep 3; rm -f /tmp/alive) & \
         while true; do sleep 1; done",
    );
    liveness["livenessProbe"] = json!({
        "exec": {"command": ["cat", "/tmp/alive"]},
        "periodSeconds": 1,
        "failureThreshold": 1,
    });
    let mut secure = sh("app", "sleep 3600");
    secure["securityContext"] = json!({
        "runAsUser": 1234,
        "runAsGroup": 5678,
        "readOnlyRootFilesystem": true,
        "allowPrivilegeEscalation": false,
        "capabilities": {"drop": ["ALL"]},
    });
    secure["resources"] = json!({
        "limits": {"memory": "64Mi", "cpu": "250m"},
        "requests": {"memory": "64Mi", "cpu": "250m"},
    });
    let mut hooked = sh("app", "sleep 3600");
    hooked["volumeMounts"] = json!([{"name": "hooks", "mountPath": "/hooks"}]);
    hooked["lifecycle"] = json!({
        "postStart": {"exec": {"command": ["sh", "-c", "echo started > /hooks/poststart"]}},
        "preStop": {"exec": {"command": ["sh", "-c", "echo stopping > /hooks/prestop"]}},
    });
    // A user-namespaced pod (`hostUsers: false`): kubelet gives each of its mounts (the
    // emptyDir, the hostPath file, the image volume whole and by sub path, /etc/hosts, the
    // termination log) the pod's maps.
    let mut userns = sh(
        "app",
        "set -e; awk '{print \"uidmap\", $1, ($2 > 0), $3}' /proc/self/uid_map; id -u; \
         echo emptydir > /work/f; echo hostfile >> /host-file; \
         ls -ln /etc/hosts /dev/termination-log /host-file /work/f | awk '{print $3, $4, $NF}'; \
         stat -c '%u %g %n' /img/bin /imgbin/sh; \
         touch /img/new 2>/dev/null || echo img read-only; \
         touch /imgbin/new 2>/dev/null || echo imgbin read-only; \
         echo from-userns > /dev/termination-log",
    );
    userns["volumeMounts"] = json!([
        {"name": "work", "mountPath": "/work"},
        {"name": "file", "mountPath": "/host-file"},
        {"name": "img", "mountPath": "/img"},
        {"name": "img", "mountPath": "/imgbin", "subPath": "bin"},
    ]);
    let with_work = |mut c: Value| {
        c["volumeMounts"] = json!([{"name": "work", "mountPath": "/work"}]);
        c
    };
    let with_hooks = |mut c: Value| {
        c["volumeMounts"] = json!([{"name": "hooks", "mountPath": "/hooks"}]);
        c
    };
    let hooks_volume = json!([{
        "name": "hooks",
        "hostPath": {"path": hooks, "type": "DirectoryOrCreate"},
    }]);
    // A native sidecar (an init container with `restartPolicy: Always`): started before the
    // main container, and running beside it.
    let mut side = with_work(sh("side", "echo up > /work/side; sleep 3600"));
    side["restartPolicy"] = json!("Always");
    // Ignores TERM (its trap notes when TERM came, once): a failing liveness probe makes
    // kubelet stop it with the pod's grace period, after which it is killed (137).
    let mut stubborn = with_hooks(sh(
        "app",
        "trap '[ -f /hooks/term ] || date +%s > /hooks/term' TERM; touch /tmp/alive; \
         (sleep 3; rm -f /tmp/alive) & while true; do sleep 1; done",
    ));
    stubborn["livenessProbe"] = json!({
        "exec": {"command": ["cat", "/tmp/alive"]},
        "periodSeconds": 1,
        "failureThreshold": 1,
    });
    // ContainerStopSignals: stopped with SIGUSR1, which it notes on the host and exits on.
    // It waits on its sleep with `wait`, which a trapped signal interrupts: the trap runs at
    // once, well within the pod's grace period, not after the sleep under a loaded CI.
    let mut stopsig = with_hooks(sh(
        "app",
        "trap 'echo usr1 > /hooks/stopsignal; exit 0' USR1; \
         trap 'echo term > /hooks/stopsignal; exit 0' TERM; \
         while true; do sleep 1 & wait $!; done",
    ));
    stopsig["lifecycle"] = json!({"stopSignal": "SIGUSR1"});
    let init = if init_containers {
        json!({
            "initContainers": [
                with_work(sh("first", "echo one >> /work/order")),
                with_work(sh("second", "echo two >> /work/order")),
            ],
            "containers": [with_work(sh("main", "cat /work/order; sleep 3600"))],
            "volumes": [{"name": "work", "emptyDir": {}}],
        })
    } else {
        json!({
            "containers": [with_work(sh(
                "main",
                "echo one >> /work/order; echo two >> /work/order; cat /work/order; sleep 3600",
            ))],
            "volumes": [{"name": "work", "emptyDir": {}}],
        })
    };
    let mut pods = vec![
        ("web", pod("web", json!({"containers": [web]}))),
        (
            "liveness",
            pod("liveness", json!({"containers": [liveness]})),
        ),
        ("init", pod("init", init)),
        (
            "crash",
            pod(
                "crash",
                json!({"containers": [sh("app", "echo crashing; exit 3")]}),
            ),
        ),
        (
            "shared",
            pod(
                "shared",
                json!({
                    "containers": [
                        with_work(sh("writer", "echo hello > /work/msg; sleep 3600")),
                        with_work(sh(
                            "reader",
                            "while [ ! -f /work/msg ]; do sleep 0.2; done; \
                             echo got $(cat /work/msg); sleep 3600",
                        )),
                    ],
                    "volumes": [{"name": "work", "emptyDir": {}}],
                }),
            ),
        ),
        ("secure", pod("secure", json!({"containers": [secure]}))),
        (
            "userns",
            pod(
                "userns",
                json!({
                    "hostUsers": false,
                    "restartPolicy": "Never",
                    "containers": [userns],
                    "volumes": [
                        {"name": "work", "emptyDir": {}},
                        {"name": "file", "hostPath": {"path": host_file, "type": "FileOrCreate"}},
                        {"name": "img", "image": {
                            "reference": BUSYBOX, "pullPolicy": "IfNotPresent"}},
                    ],
                }),
            ),
        ),
        (
            "hooks",
            pod(
                "hooks",
                json!({
                    // The preStop hook runs within the grace period (its exec is killed at
                    // its end): 2 s is too short on a busy 2-core machine.
                    "terminationGracePeriodSeconds": 10,
                    "containers": [hooked],
                    "volumes": [{
                        "name": "hooks",
                        "hostPath": {"path": hooks, "type": "DirectoryOrCreate"},
                    }],
                }),
            ),
        ),
        (
            "stubborn",
            pod(
                "stubborn",
                json!({
                    "terminationGracePeriodSeconds": STUBBORN_GRACE,
                    "containers": [stubborn],
                    "volumes": hooks_volume.clone(),
                }),
            ),
        ),
        (
            "stopsig",
            pod(
                "stopsig",
                json!({
                    // `lifecycle.stopSignal` needs the pod's OS named.
                    "os": {"name": "linux"},
                    "terminationGracePeriodSeconds": 10,
                    "containers": [stopsig],
                    "volumes": hooks_volume,
                }),
            ),
        ),
        (
            "logs",
            pod(
                "logs",
                json!({"containers": [sh(
                    "app",
                    "i=0; while true; do for j in $(seq 100); do \
                     echo \"line $i-$j xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"; \
                     done; i=$((i+1)); sleep 1; done",
                )]}),
            ),
        ),
    ];
    if init_containers {
        pods.push((
            "sidecar",
            pod(
                "sidecar",
                json!({
                    "initContainers": [side],
                    "containers": [with_work(sh("main", "cat /work/side; sleep 3600"))],
                    "volumes": [{"name": "work", "emptyDir": {}}],
                }),
            ),
        ));
    }
    pods
}

/// Runs `sh -c cmd` in a container through CRI ExecSync; returns (exit code, stdout).
async fn exec(bed: &BedRemora, id: &str, cmd: &str) -> (i32, String) {
    let r = bed
        .remora
        .runtime()
        .exec_sync(v1::ExecSyncRequest {
            container_id: id.to_string(),
            cmd: vec!["sh".into(), "-c".into(), cmd.into()],
            timeout: 10,
        })
        .await
        .expect("ExecSync")
        .into_inner();
    (r.exit_code, String::from_utf8_lossy(&r.stdout).into_owned())
}

/// The CRI pod sandboxes of this remora whose kubelet pod name is `name` (any state).
async fn sandboxes_of(bed: &BedRemora, name: &str) -> Vec<v1::PodSandbox> {
    let full = format!("{name}-{NODE}");
    cri::list_pods(&bed.remora)
        .await
        .into_iter()
        .filter(|p| p.metadata.as_ref().is_some_and(|m| m.name == full))
        .collect()
}

/// Every attempt of the containers of kubelet pod `name` that remora still has, from
/// ContainerStatus: `(attempt, started_at, finished_at, exit_code)`, sorted.
async fn attempts(bed: &BedRemora, name: &str) -> Vec<(u32, i64, i64, i32)> {
    let full = format!("{name}-{NODE}");
    let mut out = Vec::new();
    for c in list_containers(bed).await {
        if c.labels.get("io.kubernetes.pod.name") != Some(&full) {
            continue;
        }
        let s = cri::status(&bed.remora, &c.id)
            .await
            .expect("ContainerStatus");
        let attempt = s.metadata.as_ref().map(|m| m.attempt).unwrap_or_default();
        out.push((attempt, s.started_at, s.finished_at, s.exit_code));
    }
    out.sort();
    out
}

async fn list_containers(bed: &BedRemora) -> Vec<v1::Container> {
    bed.remora
        .runtime()
        .list_containers(v1::ListContainersRequest { filter: None })
        .await
        .expect("ListContainers")
        .into_inner()
        .containers
}

/// Files in the test bed's IPAM dirs named after one of `ips`.
fn ipam_reservations(ips: &BTreeSet<String>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for net in std::fs::read_dir(IPAM_DIR).into_iter().flatten().flatten() {
        for f in std::fs::read_dir(net.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            if ips.contains(&f.file_name().to_string_lossy().to_string()) {
                out.push(f.path());
            }
        }
    }
    out
}

/// nat rules (portmap's DNAT) that mention the host port or one of the pod IPs.
fn nat_rules_for(ips: &BTreeSet<String>) -> Vec<String> {
    iptables_rules("iptables", "nat")
        .into_iter()
        .filter(|r| {
            r.contains(&format!("--dport {HOST_PORT}"))
                || ips.iter().any(|ip| r.contains(&format!("{ip}/32")))
        })
        .collect()
}

/// Everything the suite leaves on the host goes, pass or fail: kubelet stopped, then the
/// pods removed through CRI (CNI DEL), then the host state put back.
struct Cleanup<'a> {
    host: &'a HostState,
    remora_socket: PathBuf,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        let _ = Command::new(tool("crictl"))
            .arg("--runtime-endpoint")
            .arg(format!("unix://{}", self.remora_socket.display()))
            .args(["--timeout", "30s", "rmp", "--all", "--force"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        self.host.restore();
    }
}

async fn run_suite(gates: &[&str]) {
    assert!(
        Path::new(testbed::TESTBED_CONTAINERD).exists(),
        "the test bed is not up: run scripts/testbed.sh up (registry {TESTBED_REGISTRY})"
    );
    let host = HostState::record();
    let mut bed = BedRemora::start_with_network();
    let dir = scratch();
    let hooks = dir.path().join("hooks");
    let cleanup = Cleanup {
        host: &host,
        remora_socket: bed.remora.socket.clone(),
    };
    // Pre-pull so that the scenarios' timing does not include the first pulls.
    for image in [BUSYBOX, NGINX] {
        cri::pull(&bed.remora, image).await.expect("pull");
    }
    let mut kubelet = Kubelet::start(dir.path(), &bed.remora.socket, gates);
    let api = KubeletApi::new();
    wait_until(
        "kubelet's API to answer",
        Duration::from_secs(60),
        || async { api.pods().await.is_some() },
    )
    .await;
    let init_containers = init_containers_work(gates);
    let host_file = dir.path().join("userns-file");
    for (name, manifest) in manifests(&hooks, init_containers, &host_file) {
        kubelet.write_manifest(name, &manifest);
    }
    let long = Duration::from_secs(90);

    // --- a long-running pod: HTTP readiness, TCP liveness, a host port on 127.0.0.1 ---
    let web = api
        .wait_pod("web", "Running and ready", long, |s| {
            s["phase"] == "Running" && container(s, "nginx")["ready"] == true
        })
        .await;
    let web_id = cri_id(container(&web, "nginx"));
    assert!(
        web["podIP"]
            .as_str()
            .is_some_and(|ip| ip.starts_with("10.88.")),
        "{web:#}"
    );
    let page = reqwest::get(format!("http://127.0.0.1:{HOST_PORT}/"))
        .await
        .expect("GET the host port")
        .text()
        .await
        .expect("body");
    assert!(
        page.contains("nginx"),
        "nginx answers on the host port: {page}"
    );

    // --- init containers run in order, to completion, before the main one ---
    let init = api
        .wait_pod("init", "main running", long, |s| {
            running(container(s, "main"))
        })
        .await;
    let init_statuses = init["initContainerStatuses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(init_statuses.len(), if init_containers { 2 } else { 0 });
    for ic in &init_statuses {
        let t = &ic["state"]["terminated"];
        assert_eq!(
            (t["exitCode"].as_i64(), t["reason"].as_str()),
            (Some(0), Some("Completed")),
            "{ic:#}"
        );
    }
    let main_log = wait_for_log(&api, "init", "main", "two").await;
    assert_eq!(main_log, "one\ntwo\n", "init containers ran in order");

    // --- a native sidecar: started before the main container, running beside it ---
    if init_containers {
        check_sidecar(&api, long).await;
    }
    // --- kubectl exec's and port-forward's path: kubelet proxies WebSocket to remora ---
    let (out, status) = api.exec("init", "main", &["cat", "/work/order"]).await;
    assert_eq!(out, "one\ntwo\n", "exec through kubelet: {status}");
    assert_eq!(status["status"], "Success", "{status}");
    let (_, status) = api.exec("init", "main", &["sh", "-c", "exit 7"]).await;
    assert_eq!(status["reason"], "NonZeroExitCode", "{status}");
    assert_eq!(status["details"]["causes"][0]["message"], "7", "{status}");
    let page = api
        .port_forward("web", 80, b"GET / HTTP/1.0\r\nHost: x\r\n\r\n", "nginx")
        .await;
    assert!(
        page.contains("200 OK"),
        "port-forward through kubelet: {page}"
    );

    // --- emptyDir shared by two containers ---
    api.wait_pod("shared", "both running", long, |s| {
        running(container(s, "writer")) && running(container(s, "reader"))
    })
    .await;
    assert_eq!(
        wait_for_log(&api, "shared", "reader", "got").await,
        "got hello\n"
    );

    // --- hostUsers: false: idmapped emptyDir, hostPath file, image volume (whole and sub
    // path), /etc/hosts, termination log ---
    let userns = api
        .wait_pod("userns", "app terminated", long, |s| {
            container(s, "app")["state"]["terminated"].is_object()
        })
        .await;
    let done = &container(&userns, "app")["state"]["terminated"];
    let log = wait_for_log(&api, "userns", "app", "/work/f").await;
    assert_eq!(done["exitCode"].as_i64(), Some(0), "{log}\n{userns:#}");
    // Root inside, a range of host IDs that does not start at 0; every mount idmapped, so
    // kubelet's root-owned files and the image's are the pod root's, and what it writes lands
    // as host root; the image volume is read-only.
    assert_eq!(
        log,
        "uidmap 0 1 65536\n0\n0 0 /dev/termination-log\n0 0 /etc/hosts\n\
         0 0 /host-file\n0 0 /work/f\n0 0 /img/bin\n0 0 /imgbin/sh\n\
         img read-only\nimgbin read-only\n",
        "{userns:#}"
    );
    assert_eq!(done["message"], "from-userns\n", "{userns:#}");
    assert_eq!(
        std::fs::read_to_string(&host_file).expect("the hostPath file"),
        "hostfile\n"
    );
    {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(&host_file).expect("the hostPath file");
        assert_eq!((m.uid(), m.gid()), (0, 0));
    }

    // --- securityContext and resource limits, seen from inside ---
    let secure = api
        .wait_pod("secure", "running", long, |s| running(container(s, "app")))
        .await;
    let secure_id = cri_id(container(&secure, "app"));
    assert_eq!(
        exec(&bed, &secure_id, "id -u; id -g").await,
        (0, "1234\n5678\n".into())
    );
    assert_ne!(
        exec(&bed, &secure_id, "touch /newfile").await.0,
        0,
        "read-only rootfs"
    );
    assert_eq!(
        exec(&bed, &secure_id, "grep CapEff /proc/self/status")
            .await
            .1
            .trim(),
        "CapEff:\t0000000000000000"
    );
    assert_eq!(
        exec(
            &bed,
            &secure_id,
            "cat /sys/fs/cgroup/memory/memory.limit_in_bytes"
        )
        .await
        .1
        .trim(),
        (64 * 1024 * 1024).to_string()
    );
    assert_eq!(
        exec(&bed, &secure_id, "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us")
            .await
            .1
            .trim(),
        "25000"
    );

    // --- PodAndContainerStatsFromCRI: kubelet's /stats/summary carries remora's stats ---
    let secure_stats = std::cell::RefCell::new(Value::Null);
    wait_until("the secure pod's stats in /stats/summary", long, || async {
        let Some(text) = api.get("/stats/summary").await else {
            return false;
        };
        let summary: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        let app = summary["pods"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["podRef"]["name"] == format!("secure-{NODE}").as_str())
            .flat_map(|p| p["containers"].as_array().cloned().unwrap_or_default())
            .find(|c| c["name"] == "app")
            .unwrap_or(Value::Null);
        let ready = app["cpu"]["usageCoreNanoSeconds"].as_u64().is_some()
            && app["memory"]["workingSetBytes"]
                .as_u64()
                .is_some_and(|b| b > 0);
        *secure_stats.borrow_mut() = app;
        ready
    })
    .await;
    let secure_stats = secure_stats.into_inner();
    // A sleeping shell's working set: well below the container's 64 MiB limit.
    let working_set = secure_stats["memory"]["workingSetBytes"]
        .as_u64()
        .unwrap_or_default();
    assert!(working_set < 64 << 20, "{secure_stats:#}");
    // With the gate, pod stats come from remora's ListPodSandboxStats (StreamPodSandboxStats
    // with CRIListStreaming), not from cAdvisor.
    let remora_log = bed.remora.log_text();
    assert!(
        remora_log.contains("PodSandboxStats"),
        "kubelet asked remora for pod stats"
    );

    // --- postStart hook ---
    api.wait_pod("hooks", "running", long, |s| running(container(s, "app")))
        .await;
    wait_until("the postStart hook's file", long, || async {
        std::fs::read_to_string(hooks.join("poststart")).is_ok_and(|s| s == "started\n")
    })
    .await;

    // --- ContainerStopSignals: the stop signal reaches CRI and comes back in the status ---
    let stopsig = api
        .wait_pod("stopsig", "running", long, |s| running(container(s, "app")))
        .await;
    assert_eq!(
        container(&stopsig, "app")["stopSignal"],
        "SIGUSR1",
        "{stopsig:#}"
    );
    let stopsig_status = cri::status(&bed.remora, &cri_id(container(&stopsig, "app")))
        .await
        .expect("ContainerStatus");
    assert_eq!(
        stopsig_status.stop_signal,
        v1::Signal::Sigusr1 as i32,
        "{stopsig_status:?}"
    );

    // --- a failing exec liveness probe restarts the container; its exit code is kept ---
    let liveness = api
        .wait_pod("liveness", "restarted by its liveness probe", long, |s| {
            restarts(container(s, "app")) >= 1
                && container(s, "app")["lastState"]["terminated"].is_object()
        })
        .await;
    let last = &container(&liveness, "app")["lastState"]["terminated"];
    assert_eq!(
        (last["exitCode"].as_i64(), last["reason"].as_str()),
        (Some(42), Some("Error")),
        "the TERM trap's exit code: {liveness:#}"
    );

    // --- a process that ignores TERM: killed (137) once the grace period is over ---
    let stubborn = api
        .wait_pod("stubborn", "killed after ignoring TERM", long, |s| {
            restarts(container(s, "app")) >= 1
                && container(s, "app")["lastState"]["terminated"].is_object()
        })
        .await;
    let last = &container(&stubborn, "app")["lastState"]["terminated"];
    assert_eq!(
        (last["exitCode"].as_i64(), last["reason"].as_str()),
        (Some(137), Some("Error")),
        "killed after the grace period: {stubborn:#}"
    );
    let term_at: i64 = std::fs::read_to_string(hooks.join("term"))
        .expect("the TERM trap's file")
        .trim()
        .parse()
        .expect("seconds since the epoch");
    let first = attempts(&bed, "stubborn")
        .await
        .into_iter()
        .find(|a| a.0 == 0)
        .expect("the first attempt, kept by kubelet");
    // The trap runs when the shell's `sleep 1` returns and `date +%s` rounds down: the note is
    // up to 1 s either side of TERM's arrival. SIGKILL comes one grace period after TERM.
    let waited = first.2 as f64 / 1e9 - term_at as f64;
    assert!(
        (STUBBORN_GRACE as f64 - 2.0..=STUBBORN_GRACE as f64 + 5.0).contains(&waited),
        "killed {waited:.1} s after TERM; grace period {STUBBORN_GRACE} s"
    );

    // --- a crash loop: restart count grows, back-off grows, exit code and reason right ---
    let crash = api
        .wait_pod("crash", "3 restarts", Duration::from_secs(120), |s| {
            restarts(container(s, "app")) >= 3
                && container(s, "app")["lastState"]["terminated"].is_object()
        })
        .await;
    let app = container(&crash, "app");
    let last = &app["lastState"]["terminated"];
    assert_eq!(
        (last["exitCode"].as_i64(), last["reason"].as_str()),
        (Some(3), Some("Error")),
        "{app:#}"
    );
    // Every attempt, from CRI (kubelet keeps the dead ones: see the flags in `Kubelet`):
    // the pause before each restart grows (kubelet's back-off doubles from 10 s).
    let attempts = attempts(&bed, "crash").await;
    assert!(attempts.len() >= 3, "{attempts:?}");
    assert!(
        attempts.iter().all(|a| a.3 == 3 || a.2 == 0),
        "exit code 3: {attempts:?}"
    );
    let pauses: Vec<i64> = attempts
        .windows(2)
        .filter(|w| w[1].1 > 0 && w[0].2 > 0)
        .map(|w| w[1].1 - w[0].2)
        .collect();
    assert!(
        pauses.len() >= 2 && pauses.windows(2).all(|p| p[1] > p[0]),
        "back-off grows between restarts (ns): {pauses:?}, attempts {attempts:?}"
    );
    // kubelet's own report of the back-off: the pod worker's sync error. kubelet 1.37 requeues a
    // pod in back-off at the back-off's expiry and writes the status before that sync starts the
    // container, so `waiting: CrashLoopBackOff` shows only from that sync to the next (about a
    // second, once per back-off): one clean-clone run's 90 s poll missed it. The sync error is
    // logged at every back-off (kubelet's stderr, written unbuffered to `kubelet.log`).
    let crash_pod = format!("crash-{NODE}");
    wait_until(
        "kubelet's CrashLoopBackOff for the crash pod",
        long,
        || async {
            kubelet.log_text().lines().any(|l| {
                l.contains("Error syncing pod")
                    && l.contains("CrashLoopBackOff")
                    && l.contains(&crash_pod)
                    && l.contains("container=app")
            })
        },
    )
    .await;

    // --- log rotation: kubelet rotates, remora reopens, /containerLogs reads ---
    let logs = api
        .wait_pod("logs", "running", long, |s| running(container(s, "app")))
        .await;
    assert!(!cri_id(container(&logs, "app")).is_empty());
    let log_dir = Kubelet::pod_logs(dir.path()).join("default_logs-remora-kubelet-it_uid-logs/app");
    wait_until("a rotated log file", long, || async {
        std::fs::read_dir(&log_dir)
            .map(|d| {
                d.flatten()
                    .any(|f| f.file_name().to_string_lossy().starts_with("0.log."))
            })
            .unwrap_or(false)
    })
    .await;
    // After a rotation the current file gets lines newer than any in the rotated one: remora
    // reopened it. (Comparing sizes would race kubelet's next rotation.)
    let rotated_batch = std::fs::read_dir(&log_dir)
        .expect("log dir")
        .flatten()
        .map(|f| f.path())
        .filter(|p| {
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            name.starts_with("0.log.") && !name.ends_with(".gz")
        })
        .filter_map(|p| last_batch(&std::fs::read_to_string(p).unwrap_or_default()))
        .max()
        .expect("a rotated file with log lines");
    let current = log_dir.join("0.log");
    wait_until("newer lines in the reopened log file", long, || async {
        last_batch(&std::fs::read_to_string(&current).unwrap_or_default())
            .is_some_and(|b| b > rotated_batch)
    })
    .await;
    // kubelet keeps rotating this busy log: a tail read just after a rotation finds the new
    // file empty (it fills at the container's next lines), so wait for a full tail.
    let tail = std::cell::RefCell::new(String::new());
    wait_until("a tail of 3 lines through /containerLogs", long, || async {
        let got = api
            .logs("logs", "app", "?tailLines=3")
            .await
            .expect("/containerLogs");
        let full = got.lines().count() == 3;
        *tail.borrow_mut() = got;
        full
    })
    .await;
    let tail = tail.into_inner();
    assert!(tail.lines().all(|l| l.starts_with("line ")), "{tail}");

    // --- CRIListStreaming: kubelet lists through remora's Stream* RPCs, no fallback ---
    let remora_log = bed.remora.log_text();
    for rpc in ["StreamPodSandboxes", "StreamContainers"] {
        assert!(
            remora_log
                .lines()
                .any(|l| l.contains(rpc) && l.contains("done")),
            "remora served {rpc} to kubelet"
        );
    }
    let kubelet_log = kubelet.log_text();
    assert!(
        !kubelet_log
            .lines()
            .any(|l| l.contains("Stream") && l.contains("from runtime service failed")),
        "kubelet's streaming list calls failed"
    );

    // Pod IPs, for the leak checks at the end.
    let mut ips = BTreeSet::new();
    for p in api.pods().await.expect("pods") {
        if let Some(ip) = p["status"]["podIP"].as_str() {
            ips.insert(ip.to_string());
        }
    }
    assert!(ips.len() >= 7, "every pod has an IP: {ips:?}");

    // --- kubelet restarted while pods run: same containers, counts kept ---
    let crash_restarts = restarts(container(
        &api.pod("crash").await.expect("crash")["status"],
        "app",
    ));
    kubelet.stop();
    kubelet.spawn();
    let web = api
        .wait_pod("web", "ready again after kubelet's restart", long, |s| {
            container(s, "nginx")["ready"] == true
        })
        .await;
    assert_eq!(cri_id(container(&web, "nginx")), web_id, "same container");
    assert_eq!(restarts(container(&web, "nginx")), 0);
    let secure = api
        .wait_pod("secure", "running after kubelet's restart", long, |s| {
            running(container(s, "app"))
        })
        .await;
    assert_eq!(cri_id(container(&secure, "app")), secure_id);
    let crash = api
        .wait_pod("crash", "its restart count", long, |s| {
            restarts(container(s, "app")) >= crash_restarts
        })
        .await;
    assert!(restarts(container(&crash, "app")) >= crash_restarts);
    assert_eq!(
        sandboxes_of(&bed, "web").await.len(),
        1,
        "kubelet adopted the pod's sandbox instead of making another"
    );

    // --- remora restarted while pods run: kubelet carries on, nothing restarts ---
    let status = bed.remora.stop_with(nix::sys::signal::Signal::SIGTERM);
    assert!(status.success(), "remora exits cleanly: {status}");
    bed.restart();
    let web = api
        .wait_pod("web", "ready after remora's restart", long, |s| {
            container(s, "nginx")["ready"] == true && s["phase"] == "Running"
        })
        .await;
    assert_eq!(cri_id(container(&web, "nginx")), web_id, "same container");
    assert_eq!(restarts(container(&web, "nginx")), 0);
    assert_eq!(exec(&bed, &secure_id, "id -u").await, (0, "1234\n".into()));
    // The log of a running container keeps flowing after the restart.
    let before_restart = last_batch(&std::fs::read_to_string(&current).unwrap_or_default());
    wait_until("logs to flow after remora's restart", long, || async {
        last_batch(&std::fs::read_to_string(&current).unwrap_or_default()) > before_restart
    })
    .await;

    // --- all manifests removed: nothing is left ---
    kubelet.remove_manifests();
    wait_until("the preStop hook's file", long, || async {
        std::fs::read_to_string(hooks.join("prestop")).is_ok_and(|s| s == "stopping\n")
    })
    .await;
    // Written whole: the shell creates the file (empty) before echo writes its line, so
    // waiting for the file alone could read it in between (CI did, once).
    wait_until("the stop signal's file, written", long, || async {
        std::fs::read_to_string(hooks.join("stopsignal")).is_ok_and(|s| s.ends_with('\n'))
    })
    .await;
    assert_eq!(
        std::fs::read_to_string(hooks.join("stopsignal")).unwrap_or_default(),
        "usr1\n",
        "kubelet stopped the container with its stopSignal"
    );
    wait_until(
        "kubelet to remove every pod and container",
        Duration::from_secs(180),
        || async {
            cri::list_pods(&bed.remora).await.is_empty() && list_containers(&bed).await.is_empty()
        },
    )
    .await;
    wait_until("kubelet to forget the pods", long, || async {
        api.pods().await.is_some_and(|p| p.is_empty())
    })
    .await;
    let netns: Vec<_> = std::fs::read_dir(bed.state_dir().join("netns"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert_eq!(netns, Vec::<PathBuf>::new(), "no netns left");
    assert_eq!(ipam_reservations(&ips), Vec::<PathBuf>::new(), "no IP left");
    assert_eq!(
        nat_rules_for(&ips),
        Vec::<String>::new(),
        "no host-port rule left"
    );
    // kubelet makes its root dir a shared mount point of its own (and keeps it).
    let root = Kubelet::root(dir.path());
    let kubelet_mounts: Vec<String> = mount_points_under(&root)
        .into_iter()
        .filter(|m| Path::new(m) != root)
        .collect();
    assert_eq!(
        kubelet_mounts,
        Vec::<String>::new(),
        "no mount left in kubelet's dirs"
    );
    // remora keeps its netns directory mounted while it runs; no pod namespace is left in it.
    let netns_dir = bed.state_dir().join("netns");
    let pod_netns_mounts: Vec<String> = mount_points_under(&netns_dir)
        .into_iter()
        .filter(|m| Path::new(m) != netns_dir)
        .collect();
    assert_eq!(
        pod_netns_mounts,
        Vec::<String>::new(),
        "no pod netns mount left"
    );
    wait_until(
        "kubelet to remove the pods' log dirs",
        Duration::from_secs(180),
        || async {
            std::fs::read_dir(Kubelet::pod_logs(dir.path()))
                .map(|d| d.count() == 0)
                .unwrap_or(true)
        },
    )
    .await;

    // kubelet's evented PLEG drops (and logs) events that carry no pod status.
    let log = kubelet.log_text();
    assert!(
        !log.contains("nil PodSandboxStatus"),
        "kubelet dropped events without a pod status"
    );

    // Host state back as it was.
    kubelet.stop();
    drop(cleanup);
    assert_eq!(
        host.differences(),
        Vec::<String>::new(),
        "host state restored"
    );
}

/// One scenario on a kubelet of its own (gates [`GATES`]): `pods` are written as static pods
/// once kubelet answers, `check` looks at them, then every manifest is removed and kubelet
/// must remove every pod and container; the host state is put back, pass or fail. `setup`
/// runs first, in the scenario's scratch dir (host files the pods mount).
async fn scenario<S, P, C>(setup: S, pods: P, check: C)
where
    S: FnOnce(&Path),
    P: FnOnce(&Path) -> Vec<(&'static str, Value)>,
    C: AsyncFnOnce(&KubeletApi, &BedRemora, &Path),
{
    scenario_with(
        |dir| {
            setup(dir);
            String::new()
        },
        async |_| (),
        pods,
        async |api, bed, dir, _| check(api, bed, dir).await,
    )
    .await;
}

/// [`scenario`], and: `setup` returns TOML appended to remora's config; `ready` runs once
/// kubelet answers, before the pods are written, and what it returns (a device plugin) lives
/// until kubelet has removed the pods, and is passed to `check`.
async fn scenario_with<S, R, G, P, C>(setup: S, ready: R, pods: P, check: C)
where
    S: FnOnce(&Path) -> String,
    R: AsyncFnOnce(&Path) -> G,
    P: FnOnce(&Path) -> Vec<(&'static str, Value)>,
    C: AsyncFnOnce(&KubeletApi, &BedRemora, &Path, &G),
{
    assert!(
        Path::new(testbed::TESTBED_CONTAINERD).exists(),
        "the test bed is not up: run scripts/testbed.sh up (registry {TESTBED_REGISTRY})"
    );
    let host = HostState::record();
    let dir = scratch();
    let extra = setup(dir.path());
    let bed = BedRemora::start_with_network_and(&extra);
    let cleanup = Cleanup {
        host: &host,
        remora_socket: bed.remora.socket.clone(),
    };
    cri::pull(&bed.remora, BUSYBOX).await.expect("pull");
    let mut kubelet = Kubelet::start(dir.path(), &bed.remora.socket, GATES);
    let api = KubeletApi::new();
    wait_until(
        "kubelet's API to answer",
        Duration::from_secs(60),
        || async { api.pods().await.is_some() },
    )
    .await;
    let guard = ready(dir.path()).await;
    for (name, manifest) in pods(dir.path()) {
        kubelet.write_manifest(name, &manifest);
    }
    check(&api, &bed, dir.path(), &guard).await;
    kubelet.remove_manifests();
    wait_until(
        "kubelet to remove every pod and container",
        Duration::from_secs(180),
        || async {
            cri::list_pods(&bed.remora).await.is_empty() && list_containers(&bed).await.is_empty()
        },
    )
    .await;
    kubelet.stop();
    drop(guard);
    drop(cleanup);
    assert_eq!(
        host.differences(),
        Vec::<String>::new(),
        "host state restored"
    );
}

/// `key=value` lines of a container's log, as a map.
fn key_values(log: &str) -> std::collections::BTreeMap<String, String> {
    log.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// (g) An image volume mounted with `subPath`: only that directory of the image, read-only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_mounts_an_image_volume_sub_path_on_remora() {
    let _turn = one_kubelet().await;
    scenario(
        |_| {},
        |_| {
            let mut app = sh(
                "app",
                "ls /img/sh >/dev/null && echo has_sh=yes; \
                 [ -e /img/bin ] && echo has_bin=yes || echo has_bin=no; \
                 touch /img/new 2>/dev/null && echo writable=yes || echo writable=no; \
                 sleep 3600",
            );
            app["volumeMounts"] = json!([{"name": "img", "mountPath": "/img", "subPath": "bin"}]);
            vec![(
                "imagevol",
                pod(
                    "imagevol",
                    json!({
                        "containers": [app],
                        "volumes": [{"name": "img", "image": {
                            "reference": BUSYBOX, "pullPolicy": "IfNotPresent"}}],
                    }),
                ),
            )]
        },
        async |api, _bed, _dir| {
            api.wait_pod("imagevol", "running", Duration::from_secs(90), |s| {
                running(container(s, "app"))
            })
            .await;
            let log = wait_for_log(api, "imagevol", "app", "writable=").await;
            let kv = key_values(&log);
            assert_eq!(kv.get("has_sh").map(String::as_str), Some("yes"), "{log}");
            assert_eq!(kv.get("has_bin").map(String::as_str), Some("no"), "{log}");
            assert_eq!(kv.get("writable").map(String::as_str), Some("no"), "{log}");
        },
    )
    .await;
}

/// The extended resource of the suite's device plugin, and its CDI kind.
const NULL_RESOURCE: &str = "remora.test/null";
/// The devices it offers.
const NULL_DEVICES: &[&str] = &["null0", "null1"];

/// Writes the CDI spec of [`NULL_RESOURCE`] into `<dir>/cdi` — each device is the host's
/// /dev/null at /dev/remora-null, with `REMORA_NULL=<device>` — and returns the remora config
/// that reads it.
fn null_cdi_config(dir: &Path) -> String {
    let devices: Vec<Value> = NULL_DEVICES
        .iter()
        .map(|d| {
            json!({"name": d, "containerEdits": {
                "env": [format!("REMORA_NULL={d}")],
                "deviceNodes": [{"path": "/dev/remora-null", "hostPath": "/dev/null"}],
            }})
        })
        .collect();
    let spec = json!({"cdiVersion": "0.6.0", "kind": NULL_RESOURCE, "devices": devices});
    let specs = dir.join("cdi");
    std::fs::create_dir_all(&specs).expect("cdi dir");
    std::fs::write(specs.join("remora-test-null.json"), spec.to_string())
        .expect("write the CDI spec");
    format!("[cdi]\nspec_dirs = [\"{}\"]\n", specs.display())
}

/// Starts the device plugin of [`NULL_RESOURCE`] once kubelet (logging to `<dir>/kubelet.log`)
/// serves its registration socket, and waits until kubelet counted its devices into the
/// node's capacity (which standalone kubelet computes on each admission, `initialNode`).
async fn start_null_plugin(dir: &Path) -> deviceplugin::Plugin {
    let devices = Path::new(DEVICE_PLUGINS);
    wait_until(
        "kubelet's device plugin registration socket",
        Duration::from_secs(30),
        || async { devices.join(deviceplugin::KUBELET_SOCKET).exists() },
    )
    .await;
    let plugin =
        deviceplugin::Plugin::start(devices, "remora-it-null.sock", NULL_RESOURCE, NULL_DEVICES)
            .await;
    // The line kubelet's device manager logs (at --v=2) once it has the devices.
    let log = dir.join("kubelet.log");
    let counted = format!(
        "resourceName=\"{NULL_RESOURCE}\" totalCount={n} healthyCount={n}",
        n = NULL_DEVICES.len()
    );
    wait_until(
        "kubelet to count the plugin's devices",
        Duration::from_secs(30),
        || async {
            std::fs::read_to_string(&log).is_ok_and(|t| {
                t.lines().any(|l| {
                    l.contains("Processed device updates for resource") && l.contains(&counted)
                })
            })
        },
    )
    .await;
    plugin
}

/// A pod asking for one [`NULL_RESOURCE`]; its container prints the device node's numbers and
/// the spec's env var.
fn cdidev_manifest() -> Value {
    let mut app = sh(
        "app",
        "stat -c 'node=%t:%T' /dev/remora-null; echo env=$REMORA_NULL; sleep 3600",
    );
    app["resources"] = json!({"limits": {NULL_RESOURCE: "1"}});
    pod("cdidev", json!({"containers": [app]}))
}

/// The `cdiDevices` of remora's verbose ContainerStatus info.
async fn verbose_cdi_devices(bed: &BedRemora, id: &str) -> Value {
    let resp = bed
        .remora
        .runtime()
        .container_status(v1::ContainerStatusRequest {
            container_id: id.to_string(),
            verbose: true,
        })
        .await
        .expect("ContainerStatus")
        .into_inner();
    let info: Value = serde_json::from_str(resp.info.get("info").map_or("{}", String::as_str))
        .expect("verbose info is JSON");
    info["cdiDevices"].clone()
}

/// The device plugin pod: kubelet allocated one device (the plugin answered with its CDI name
/// only), passed the name in `ContainerConfig.cdi_devices`, and remora applied the spec.
async fn check_cdi_device(api: &KubeletApi, bed: &BedRemora, plugin: &deviceplugin::Plugin) {
    let status = api
        .wait_pod("cdidev", "running", Duration::from_secs(90), |s| {
            running(container(s, "app"))
        })
        .await;
    let allocated = plugin.calls.lock().expect("calls lock").allocate.clone();
    assert_eq!(allocated.len(), 1, "one container allocated: {allocated:?}");
    assert_eq!(allocated[0].len(), 1, "one device: {allocated:?}");
    let device = allocated[0][0].clone();
    assert!(NULL_DEVICES.contains(&device.as_str()), "{device}");
    let log = wait_for_log(api, "cdidev", "app", "env=").await;
    let kv = key_values(&log);
    assert_eq!(kv.get("node").map(String::as_str), Some("1:3"), "{log}");
    assert_eq!(kv.get("env"), Some(&device), "{log}");
    // Through CRI: the name came in `ContainerConfig.cdi_devices`, not in an annotation.
    let id = cri_id(container(&status, "app"));
    assert_eq!(
        verbose_cdi_devices(bed, &id).await,
        json!([format!("{NULL_RESOURCE}={device}")])
    );
    let annotations = cri::status(&bed.remora, &id)
        .await
        .map(|s| s.annotations)
        .unwrap_or_default();
    assert!(
        !annotations.keys().any(|k| k.starts_with("cdi.k8s.io/")),
        "{annotations:?}"
    );
}

/// (h) A device plugin's device, given to the container as a CDI device: the plugin
/// registers with kubelet and answers `Allocate` with CDI names only; kubelet passes them in
/// `ContainerConfig.cdi_devices`, and remora applies the spec a driver would have written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_gives_a_device_plugin_cdi_device_to_a_container_on_remora() {
    let _turn = one_kubelet().await;
    scenario_with(
        null_cdi_config,
        // Registered before the pod is written: kubelet admits a static pod once.
        async |dir| start_null_plugin(dir).await,
        |_| vec![("cdidev", cdidev_manifest())],
        async |api, bed, _dir, plugin| {
            check_cdi_device(api, bed, plugin).await;
        },
    )
    .await;
}

/// The sidecar pod: its native sidecar started before the main container and runs beside it.
async fn check_sidecar(api: &KubeletApi, long: Duration) {
    let sidecar = api
        .wait_pod("sidecar", "sidecar and main running", long, |s| {
            running(init_container(s, "side")) && running(container(s, "main"))
        })
        .await;
    assert_eq!(
        (
            restarts(init_container(&sidecar, "side")),
            restarts(container(&sidecar, "main"))
        ),
        (0, 0),
        "{sidecar:#}"
    );
    assert_eq!(
        wait_for_log(api, "sidecar", "main", "up").await,
        "up\n",
        "the sidecar ran before the main container started"
    );
}

/// The highest batch number `i` of the logs pod's `line <i>-<j> …` lines in CRI log text.
fn last_batch(text: &str) -> Option<u64> {
    text.lines()
        .filter_map(|l| l.split(" line ").nth(1))
        .filter_map(|rest| rest.split('-').next()?.parse().ok())
        .max()
}

/// Waits until the container's log (through kubelet) contains `needle`; returns it.
async fn wait_for_log(api: &KubeletApi, pod: &str, container: &str, needle: &str) -> String {
    let start = Instant::now();
    loop {
        if let Some(text) = api.logs(pod, container, "").await {
            if text.contains(needle) {
                return text;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "timed out waiting for {needle:?} in the log of {pod}/{container}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
