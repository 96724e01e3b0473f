//! Churn: many pods created, started, stopped and removed, ten at a time, on the test bed; then
//! nothing may be left of them. A census of everything a pod or container makes (containerd
//! objects, host files, mounts, network plumbing, shims, remora's own fds and threads) is taken
//! before and after, and every count must come back to where it was.
//!
//! Scoping, because other tests share the test bed at the same time: containerd objects are
//! counted in this remora's namespace, files and mounts under this remora's dirs, shims by
//! their `-namespace` argument; the shared network state (IPAM allocations, firewall rules,
//! host veths, cgroups) is counted only where it names an id, IP or interface of a pod made
//! here. Host-wide totals are printed for information but not compared.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use remora::cri::v1;
use remora::cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

use crate::cri;
use crate::harness::{scratch, BedRemora};

/// Pod cycles in all.
const CYCLES: usize = 200;
/// Cycles in flight at once.
const WORKERS: usize = 10;
/// The test bed's host-local IPAM data dir (from its CNI conf, `ipam.dataDir`).
const IPAM_DIR: &str = "/run/remora-testbed/cni/networks/remora-testbed";
/// The test bed containerd's runtime-v2 state (one bundle dir per task, by namespace).
const TASK_STATE: &str = "/run/remora-testbed/containerd/io.containerd.runtime.v2.task";

/// What the pods of this test were: ids, IPs and host-side veths, to scope the shared counts.
#[derive(Default, Clone)]
struct Made {
    ids: BTreeSet<String>,
    ips: BTreeSet<String>,
    veths: BTreeSet<String>,
}

/// Counts of everything a pod cycle makes. Fields compared before/after are in `scoped`;
/// host-wide totals (shared with concurrent tests) and remora's RSS are in `info`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Census {
    scoped: BTreeMap<&'static str, usize>,
    info: BTreeMap<&'static str, usize>,
}

impl std::fmt::Display for Census {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (k, v) in &self.scoped {
            writeln!(f, "  {k:<28} {v}")?;
        }
        for (k, v) in &self.info {
            writeln!(f, "  {k:<28} {v}  (not compared)")?;
        }
        Ok(())
    }
}

/// Entries below `dir`, recursively (not following symlinks, not crossing into what is
/// missing); 0 if it does not exist.
fn count_tree(dir: &Path) -> usize {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.filter_map(Result::ok)
        .map(|e| {
            let is_dir = e.file_type().map(|t| t.is_dir()).unwrap_or(false);
            1 + if is_dir { count_tree(&e.path()) } else { 0 }
        })
        .sum()
}

fn count_dir(dir: &Path) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

fn mountinfo() -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect()
}

/// Processes whose command line is a containerd shim serving namespace `ns`.
fn shims_of(ns: &str) -> usize {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return 0;
    };
    rd.filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|cmd| {
            let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
            args.first()
                .is_some_and(|a| String::from_utf8_lossy(a).contains("containerd-shim"))
                && args
                    .windows(2)
                    .any(|w| w[0] == b"-namespace" && w[1] == ns.as_bytes())
        })
        .count()
}

/// A numeric field of `/proc/<pid>/status` (`Threads:`, `VmRSS:` in kB).
fn status_field(pid: u32, field: &str) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn threads_of(pid: u32) -> usize {
    status_field(pid, "Threads:")
}

/// remora's open fds, and of them those pointing into `dir` (e.g. the pod log dir).
fn fds_of(pid: u32, dir: &Path) -> (usize, usize) {
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return (0, 0);
    };
    let links: Vec<PathBuf> = rd
        .filter_map(Result::ok)
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .collect();
    let into = links.iter().filter(|l| l.starts_with(dir)).count();
    (links.len(), into)
}

/// cgroup dirs (any v1 hierarchy) named after a pod or container of this test.
fn cgroups_naming(ids: &BTreeSet<String>) -> usize {
    fn walk(dir: &Path, ids: &BTreeSet<String>, depth: usize, n: &mut usize) {
        if depth > 6 {
            return;
        }
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.filter_map(Result::ok) {
            if !e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                continue;
            }
            if ids.contains(e.file_name().to_string_lossy().as_ref()) {
                *n += 1;
            }
            walk(&e.path(), ids, depth + 1, n);
        }
    }
    let mut n = 0;
    for h in [
        "memory",
        "pids",
        "cpu,cpuacct",
        "blkio",
        "devices",
        "freezer",
    ] {
        walk(&Path::new("/sys/fs/cgroup").join(h), ids, 0, &mut n);
    }
    n
}

fn iptables_save() -> String {
    std::process::Command::new("iptables-save")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

async fn take_census(
    bed: &BedRemora,
    rt: &RuntimeServiceClient<Channel>,
    logs: &Path,
    made: &Made,
) -> Census {
    let root = bed
        .remora
        .socket
        .parent()
        .expect("scratch dir")
        .to_path_buf();
    let (state, persist) = (root.join("state"), root.join("root"));
    let ns = &bed.namespace;
    let mut scoped = BTreeMap::new();
    let mut info = BTreeMap::new();
    let ids = |args: &[&str]| bed.ctr_ids(args).len();
    let rows = |args: &[&str]| bed.ctr(args).lines().skip(1).count();

    // remora's own view.
    let mut rt = rt.clone();
    let pods = rt
        .list_pod_sandbox(v1::ListPodSandboxRequest { filter: None })
        .await
        .expect("ListPodSandbox")
        .into_inner()
        .items
        .len();
    let containers = rt
        .list_containers(v1::ListContainersRequest { filter: None })
        .await
        .expect("ListContainers")
        .into_inner()
        .containers
        .len();
    scoped.insert("remora pods listed", pods);
    scoped.insert("remora containers listed", containers);

    // containerd, in this remora's namespace.
    scoped.insert("containerd containers", ids(&["containers", "ls", "-q"]));
    scoped.insert("containerd tasks", rows(&["tasks", "ls"]));
    scoped.insert("containerd snapshots", rows(&["snapshots", "ls"]));
    scoped.insert("containerd leases", ids(&["leases", "ls", "-q"]));
    scoped.insert("containerd sandboxes", rows(&["sandboxes", "ls"]));
    scoped.insert("containerd content", ids(&["content", "ls", "-q"]));
    scoped.insert("containerd ingests", rows(&["content", "active"]));
    scoped.insert("task bundles", count_dir(&Path::new(TASK_STATE).join(ns)));
    scoped.insert("shim processes", shims_of(ns));

    // remora's dirs: every subdir of its state and root dirs, recursively.
    for (label, base) in [("state", &state), ("root", &persist)] {
        let mut seen = false;
        if let Ok(rd) = std::fs::read_dir(base) {
            for e in rd.filter_map(Result::ok) {
                seen = true;
                let name = format!("{label}/{}", e.file_name().to_string_lossy());
                let n = count_tree(&e.path());
                scoped.insert(Box::leak(name.into_boxed_str()), n);
            }
        }
        if !seen {
            scoped.insert(if label == "state" { "state/" } else { "root/" }, 0);
        }
    }
    scoped.insert("pod log files", count_tree(logs));

    // Mounts: this remora's dirs, and the shims' rootfs mounts of its namespace.
    let mounts = mountinfo();
    let root_s = root.display().to_string();
    scoped.insert(
        "mounts under remora dirs",
        mounts.iter().filter(|l| l.contains(&root_s)).count(),
    );
    let ns_dir = format!("/{ns}/");
    scoped.insert(
        "mounts of namespace tasks",
        mounts.iter().filter(|l| l.contains(&ns_dir)).count(),
    );
    info.insert("mounts (all)", mounts.len());

    // remora itself.
    let pid = bed.remora.pid();
    let (fds, log_fds) = fds_of(pid, logs);
    scoped.insert("remora open fds", fds);
    scoped.insert("remora fds into log dir", log_fds);
    scoped.insert("remora threads", threads_of(pid));
    info.insert("remora VmRSS kB", status_field(pid, "VmRSS:"));

    // Shared network state, scoped to what this test's pods were.
    let ipam_named = std::fs::read_dir(IPAM_DIR)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter_map(|e| std::fs::read_to_string(e.path()).ok())
                .filter(|s| s.lines().next().is_some_and(|id| made.ids.contains(id)))
                .count()
        })
        .unwrap_or(0);
    scoped.insert("IPAM allocations of our pods", ipam_named);
    info.insert("IPAM files (all)", count_dir(Path::new(IPAM_DIR)));
    let rules = iptables_save();
    scoped.insert(
        "iptables rules of our IPs",
        rules
            .lines()
            .filter(|l| made.ips.iter().any(|ip| l.contains(&format!("{ip}/32 "))))
            .count(),
    );
    info.insert(
        "iptables CNI lines (all)",
        rules.lines().filter(|l| l.contains("CNI")).count(),
    );
    scoped.insert(
        "host veths of our pods",
        made.veths
            .iter()
            .filter(|v| Path::new("/sys/class/net").join(v).exists())
            .count(),
    );
    info.insert(
        "host veths (all)",
        std::fs::read_dir("/sys/class/net")
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .filter(|e| e.file_name().to_string_lossy().starts_with("veth"))
                    .count()
            })
            .unwrap_or(0),
    );
    scoped.insert("cgroups of our ids", cgroups_naming(&made.ids));
    Census { scoped, info }
}

/// The pod of worker `slot`: each worker reuses its pod's name (and so its container's) for
/// every cycle, so a name not released on removal fails the next cycle with ALREADY_EXISTS.
fn pod_config(slot: usize, logs: &Path) -> v1::PodSandboxConfig {
    let name = format!("churn-{slot}");
    v1::PodSandboxConfig {
        hostname: name.clone(),
        ..cri::pod_config(&name, logs, false)
    }
}

fn container_config(slot: usize) -> v1::ContainerConfig {
    v1::ContainerConfig {
        log_path: format!("churn-{slot}.log"),
        // An image volume (the container's own image): a view snapshot and a host mount per
        // container, both counted by the census.
        mounts: vec![v1::Mount {
            container_path: "/image".into(),
            image: Some(cri::image_spec("busybox")),
            readonly: true,
            ..Default::default()
        }],
        // Writes to its log, and exits on SIGTERM (PID 1 has no default handler), so
        // StopContainer takes the graceful path.
        ..cri::shell_container(
            "c",
            "echo started; trap 'echo bye; exit 0' TERM; sleep 3600 & wait",
        )
    }
}

/// The host-side veth of a pod, from remora's CNI result cache (the bridge plugin reports it as
/// the interface without a sandbox).
fn host_veths(root: &Path, pod: &str) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(root.join("root").join("cni-cache")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in rd.filter_map(Result::ok) {
        if !e.file_name().to_string_lossy().contains(pod) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        let Ok(json) = serde_json::from_str::<serde_json::Value>(&text) else {
            continue;
        };
        let mut stack = vec![&json];
        while let Some(v) = stack.pop() {
            match v {
                serde_json::Value::Object(m) => {
                    if let Some(name) = m.get("name").and_then(|n| n.as_str()) {
                        if name.starts_with("veth") && !m.contains_key("sandbox") {
                            out.push(name.to_string());
                        }
                    }
                    stack.extend(m.values());
                }
                serde_json::Value::Array(a) => stack.extend(a.iter()),
                _ => {}
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// One pod cycle as kubelet drives it: [`bring_up`], then [`tear_down`].
async fn cycle(
    rt: RuntimeServiceClient<Channel>,
    slot: usize,
    n: usize,
    logs: PathBuf,
    root: PathBuf,
    made: Arc<Mutex<Made>>,
) {
    let (pod, ctr) = bring_up(rt.clone(), slot, n, &logs, &root, &made).await;
    tear_down(rt, n, &pod, &ctr).await;
}

/// Runs worker `slot`'s pod (cycle `n`) and starts a container in it; returns (pod id,
/// container id).
async fn bring_up(
    mut rt: RuntimeServiceClient<Channel>,
    slot: usize,
    n: usize,
    logs: &Path,
    root: &Path,
    made: &Mutex<Made>,
) -> (String, String) {
    let config = pod_config(slot, logs);
    let pod = rt
        .run_pod_sandbox(v1::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        })
        .await
        .unwrap_or_else(|e| panic!("cycle {n}: RunPodSandbox: {e:?}"))
        .into_inner()
        .pod_sandbox_id;
    let ip = rt
        .pod_sandbox_status(v1::PodSandboxStatusRequest {
            pod_sandbox_id: pod.clone(),
            verbose: false,
        })
        .await
        .unwrap_or_else(|e| panic!("cycle {n}: PodSandboxStatus: {e:?}"))
        .into_inner()
        .status
        .and_then(|s| s.network)
        .map(|n| n.ip)
        .unwrap_or_default();
    assert!(!ip.is_empty(), "cycle {n}: pod has an IP");
    let veths = host_veths(root, &pod);
    assert!(!veths.is_empty(), "cycle {n}: host veth in the CNI cache");
    {
        let mut m = made.lock().expect("made");
        m.ids.insert(pod.clone());
        m.ips.insert(ip);
        m.veths.extend(veths);
    }

    let ctr = rt
        .create_container(v1::CreateContainerRequest {
            pod_sandbox_id: pod.clone(),
            config: Some(container_config(slot)),
            sandbox_config: Some(config),
        })
        .await
        .unwrap_or_else(|e| panic!("cycle {n}: CreateContainer: {e:?}"))
        .into_inner()
        .container_id;
    made.lock().expect("made").ids.insert(ctr.clone());
    rt.start_container(v1::StartContainerRequest {
        container_id: ctr.clone(),
    })
    .await
    .unwrap_or_else(|e| panic!("cycle {n}: StartContainer: {e:?}"));
    (pod, ctr)
}

/// Stops the container, removes its log (kubelet's container GC does that before
/// RemoveContainer) and the container, then stops and removes the pod.
async fn tear_down(mut rt: RuntimeServiceClient<Channel>, n: usize, pod: &str, ctr: &str) {
    let (pod, ctr) = (pod.to_string(), ctr.to_string());
    rt.stop_container(v1::StopContainerRequest {
        container_id: ctr.clone(),
        timeout: 10,
    })
    .await
    .unwrap_or_else(|e| panic!("cycle {n}: StopContainer: {e:?}"));
    let status = rt
        .container_status(v1::ContainerStatusRequest {
            container_id: ctr.clone(),
            verbose: false,
        })
        .await
        .unwrap_or_else(|e| panic!("cycle {n}: ContainerStatus: {e:?}"))
        .into_inner()
        .status
        .expect("status");
    assert_eq!(
        status.state,
        v1::ContainerState::ContainerExited as i32,
        "cycle {n}: exited after StopContainer"
    );
    let _ = std::fs::remove_file(&status.log_path);
    rt.remove_container(v1::RemoveContainerRequest {
        container_id: ctr.clone(),
    })
    .await
    .unwrap_or_else(|e| panic!("cycle {n}: RemoveContainer: {e:?}"));
    rt.stop_pod_sandbox(v1::StopPodSandboxRequest {
        pod_sandbox_id: pod.clone(),
    })
    .await
    .unwrap_or_else(|e| panic!("cycle {n}: StopPodSandbox: {e:?}"));
    rt.remove_pod_sandbox(v1::RemovePodSandboxRequest {
        pod_sandbox_id: pod.clone(),
    })
    .await
    .unwrap_or_else(|e| panic!("cycle {n}: RemovePodSandbox: {e:?}"));
}

/// Fields that may end lower than they started: tokio retires idle blocking-pool threads
/// (10 s keep-alive), so the warm-up's threads can be gone by the end. Growth is a leak.
const MAY_SHRINK: &[&str] = &["remora threads"];

/// The fields of `after` that differ from `before` (or grew, for [`MAY_SHRINK`] fields), as
/// `field: before -> after`.
fn leaks(before: &Census, after: &Census) -> Vec<String> {
    before
        .scoped
        .keys()
        .chain(after.scoped.keys())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .filter_map(|k| {
            let (b, a) = (
                before.scoped.get(k).copied().unwrap_or(0),
                after.scoped.get(k).copied().unwrap_or(0),
            );
            let leaked = if MAY_SHRINK.contains(k) {
                a > b
            } else {
                a != b
            };
            leaked.then(|| format!("{k}: {b} -> {a}"))
        })
        .collect()
}

/// Takes censuses until one equals `before` or `limit` passes (shims exit, connections close
/// and idle threads retire asynchronously); returns the last.
async fn settled_census(
    bed: &BedRemora,
    rt: &RuntimeServiceClient<Channel>,
    logs: &Path,
    made: &Made,
    before: &Census,
    limit: Duration,
) -> Census {
    let start = Instant::now();
    loop {
        let now = take_census(bed, rt, logs, made).await;
        if leaks(before, &now).is_empty() || start.elapsed() > limit {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_of_200_pod_cycles_leaks_nothing() {
    let bed = BedRemora::start_with_network();
    let root = bed
        .remora
        .socket
        .parent()
        .expect("scratch dir")
        .to_path_buf();
    let logs = scratch();
    let made = Arc::new(Mutex::new(Made::default()));
    cri::pull(&bed.remora, "busybox")
        .await
        .expect("pull busybox");
    // One client (one connection) for the whole test, so remora's fd count only moves when
    // remora itself holds something.
    let rt = bed.remora.runtime();
    // One warm-up cycle: first-use set-up (pause image pull, netns dir mount, CNI cache dir,
    // worker threads) is not a leak. While its pod runs, the census must see it: a census
    // blind to what it counts would pass for nothing.
    let (pod, ctr) = bring_up(rt.clone(), 0, 0, logs.path(), &root, &made).await;
    let snapshot = || made.lock().expect("made").clone();
    let live = take_census(&bed, &rt, logs.path(), &snapshot()).await;
    println!("churn census with one pod running:\n{live}");
    tear_down(rt.clone(), 0, &pod, &ctr).await;
    let before = take_census(&bed, &rt, logs.path(), &snapshot()).await;
    for (field, at_least) in [
        ("containerd containers", 2),
        ("containerd tasks", 2),
        ("task bundles", 2),
        ("shim processes", 1),
        ("mounts of namespace tasks", 2),
        ("state/io", 1),
        ("state/image-volumes", 1),
        ("mounts under remora dirs", 1),
        ("state/netns", 1),
        ("state/sandboxes", 1),
        ("root/cni-cache", 1),
        ("pod log files", 1),
        ("remora fds into log dir", 1),
        ("remora open fds", 3),
        ("IPAM allocations of our pods", 1),
        ("iptables rules of our IPs", 1),
        ("host veths of our pods", 1),
        ("cgroups of our ids", 2),
    ] {
        let (b, l) = (
            before.scoped.get(field).copied().unwrap_or(0),
            live.scoped.get(field).copied().unwrap_or(0),
        );
        assert!(
            l >= b + at_least,
            "the census does not see a running pod's {field} ({b} without, {l} with)"
        );
    }
    println!("churn census before:\n{before}");

    let start = Instant::now();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(1));
    let mut workers = tokio::task::JoinSet::new();
    for slot in 0..WORKERS {
        let (rt, logs, root, made, next) = (
            rt.clone(),
            logs.path().to_path_buf(),
            root.clone(),
            made.clone(),
            next.clone(),
        );
        workers.spawn(async move {
            loop {
                let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if n > CYCLES {
                    return;
                }
                cycle(
                    rt.clone(),
                    slot,
                    n,
                    logs.clone(),
                    root.clone(),
                    made.clone(),
                )
                .await;
            }
        });
    }
    while let Some(r) = workers.join_next().await {
        if let Err(e) = r {
            std::panic::resume_unwind(e.into_panic());
        }
    }
    let elapsed = start.elapsed();
    println!("churn: {CYCLES} cycles, {WORKERS} in flight, in {elapsed:?}");

    let made = snapshot();
    assert_eq!(made.ids.len(), 2 * (CYCLES + 1), "every id distinct");
    let after = settled_census(
        &bed,
        &rt,
        logs.path(),
        &made,
        &before,
        Duration::from_secs(30),
    )
    .await;
    println!("churn census after:\n{after}");
    // For the reader: what remora warned about during the churn (not asserted on; a warning
    // can be a handled race).
    let log = bed.remora.log_text();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERRO ") || l.contains(" CRIT "))
        .collect();
    println!("remora logged {} warnings or errors", warnings.len());
    for w in warnings.iter().take(20) {
        println!("  {w}");
    }
    let deltas = leaks(&before, &after);
    assert!(
        deltas.is_empty(),
        "leaks after {CYCLES} pod cycles: {deltas:?}\nbefore:\n{before}\nafter:\n{after}\nremora log: {}",
        bed.remora.log.display()
    );
}
