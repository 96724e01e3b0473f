//! Clean-up of what a test left on the shared test bed, so that a failed test cannot poison the
//! next run.
//!
//! A test's [`BedRemora`](crate::harness::BedRemora) removes its pods through CRI when it is
//! dropped, passed or panicked. What a test process could not clean up (it was killed, or an
//! older harness ran it) is swept once per test run, before the first `BedRemora` starts.
//!
//! The test bed's pod network is shared at the same time by the test bed's own remora (which a
//! kubelet suite may be driving), containerd's own CRI and the tests running in parallel, here
//! and in other test processes. So the sweep never flushes a chain or a directory: it removes
//! only what provably has no live owner.
//! - A containerd namespace `it-<pid>-…` (made by `BedRemora`) whose test process `<pid>` is
//!   gone: the remoras that test started (they outlive a killed test) are killed, the
//!   namespace's tasks killed and its objects removed. Killing a pod's pause task frees its
//!   network namespace, and with it the pod's veth on the bridge.
//! - Then an IPAM reservation of the test bed network whose container id names no container in
//!   any namespace of the test bed containerd, and either named a pod of such a dead test or
//!   was made more than [`GRACE`] ago. Every runtime on
//!   this containerd gives CNI the sandbox id as container id and creates the pod's pause
//!   container under that id; the grace period covers a RunPodSandbox in flight, which reserves
//!   the IP before it creates its pause container. For such a reservation the network's plugins
//!   are run with DEL, last plugin first, as a runtime would: that removes the pod's port-mapping
//!   chains (`CNI-DN-*`), its firewall rules and the reservation. What a test's remora mounted
//!   for that sandbox id in the test's scratch dir (`/tmp/rmr*`: netns, `/dev/shm`) is
//!   unmounted, which frees the pod's veth.

use std::collections::HashSet;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::sync::Once;
use std::time::{Duration, SystemTime};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::testbed::{tools_bin, unmount_below, TESTBED_CNI, TESTBED_CONTAINERD};

/// How old an IPAM reservation without a pause container must be before it counts as left over.
pub const GRACE: Duration = Duration::from_secs(120);

/// The prefix of the containerd namespaces the tests' remoras use (`it-<pid>-<nanos>-<seq>`).
pub const TEST_NAMESPACE_PREFIX: &str = "it-";

/// Where the CNI plugins are (the test bed's `bin_dirs`).
const CNI_BIN_DIR: &str = "/usr/lib/cni";

/// Runs `cmd` (with `stdin`, if any) for at most `limit`; kills it after that. Never panics:
/// teardown code calls it, which may run while a test panics.
pub fn run_bounded(
    cmd: &mut Command,
    stdin: Option<Vec<u8>>,
    limit: Duration,
) -> Result<Output, String> {
    let what = format!("{:?}", cmd.get_program());
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| format!("spawn {what}: {e}"))?;
    if let (Some(data), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // A plugin reads all of stdin before it answers; the pipe closes when dropped here.
        let _ = pipe.write_all(&data);
    }
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(Ok(out)) => Ok(out),
        Ok(Err(e)) => Err(format!("wait for {what}: {e}")),
        Err(_) => {
            // The waiting thread still holds the child, so its pid cannot have been reused.
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            Err(format!("{what} did not finish within {limit:?}"))
        }
    }
}

/// Runs `ctr` against the test bed containerd (in `namespace`, if given), bounded in time;
/// stdout, or why it failed.
pub fn ctr(namespace: Option<&str>, args: &[&str]) -> Result<String, String> {
    let mut cmd = Command::new(tools_bin().join("ctr"));
    cmd.args(["--address", TESTBED_CONTAINERD]);
    if let Some(ns) = namespace {
        cmd.args(["-n", ns]);
    }
    cmd.args(args);
    let out = run_bounded(&mut cmd, None, Duration::from_secs(30))?;
    if !out.status.success() {
        return Err(format!(
            "ctr {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Non-empty trimmed lines.
fn lines(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect()
}

/// Kills the tasks of `namespace` and removes its containers, images and leases, then the
/// namespace itself; the ids of the containers it found (a pod's is its sandbox id). Best
/// effort (what fails stays for the next sweep); never panics.
pub fn purge_namespace(namespace: &str) -> Result<Vec<String>, String> {
    let ns = Some(namespace);
    for id in lines(&ctr(ns, &["tasks", "ls", "-q"])?) {
        let _ = ctr(ns, &["tasks", "kill", "--signal", "SIGKILL", &id]);
        let _ = ctr(ns, &["tasks", "rm", "--force", &id]);
    }
    let containers = lines(&ctr(ns, &["containers", "ls", "-q"])?);
    for id in &containers {
        let _ = ctr(ns, &["containers", "rm", id]);
    }
    for name in lines(&ctr(ns, &["images", "ls", "-q"])?) {
        let _ = ctr(ns, &["images", "rm", "--sync", &name]);
    }
    for id in lines(&ctr(ns, &["leases", "ls", "-q"])?) {
        let _ = ctr(ns, &["leases", "rm", &id]);
    }
    ctr(None, &["namespaces", "rm", namespace])?;
    Ok(containers)
}

/// Kills the remora processes a test started on the test bed (`--config /tmp/rmr…`) whose
/// config names one of `namespaces`; what it killed.
fn kill_remoras_of(namespaces: &HashSet<String>) -> Vec<String> {
    let mut killed = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return killed;
    };
    for p in procs.flatten() {
        let Ok(pid) = p.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(p.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let [bin, flag, config, ..] = args.as_slice() else {
            continue;
        };
        if !bin.ends_with("/remora") || flag != "--config" || !config.starts_with("/tmp/rmr") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(config) else {
            continue;
        };
        let named = text.lines().find_map(|l| {
            let (key, value) = l.split_once('=')?;
            (key.trim() == "namespace").then(|| value.trim().trim_matches('"').to_string())
        });
        if named.is_some_and(|ns| namespaces.contains(&ns)) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            killed.push(format!(
                "killed remora {pid} of a test that is gone ({config})"
            ));
            // Its scratch dir is the dead test's, which never dropped it.
            if let Some(dir) = Path::new(config).parent() {
                unmount_below(dir);
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }
    killed
}

/// The test process id in a test namespace's name (`it-<pid>-…`).
pub fn test_namespace_pid(namespace: &str) -> Option<i32> {
    namespace
        .strip_prefix(TEST_NAMESPACE_PREFIX)?
        .split('-')
        .next()?
        .parse()
        .ok()
}

/// One IP reservation of host-local IPAM: a file named for the IP holding the container id and
/// (since plugins 0.9) the interface name on the next line.
#[derive(Debug, PartialEq, Eq)]
pub struct Reservation {
    /// The reserved address.
    pub ip: IpAddr,
    /// The container id CNI was given (the sandbox id).
    pub container_id: String,
    /// The interface name in the pod.
    pub ifname: String,
}

/// Parses a host-local reservation file; `None` for the other files in the directory
/// (`lock`, `last_reserved_ip.0`).
pub fn parse_reservation(file_name: &str, content: &str) -> Option<Reservation> {
    let ip: IpAddr = file_name.parse().ok()?;
    let mut parts = content.lines().map(str::trim);
    let container_id = parts.next().filter(|s| !s.is_empty())?.to_string();
    let ifname = parts
        .next()
        .filter(|s| !s.is_empty())
        .unwrap_or("eth0")
        .to_string();
    Some(Reservation {
        ip,
        container_id,
        ifname,
    })
}

/// The test bed's pod network: its conflist (the first in lexical order, as runtimes load it).
fn testbed_network() -> Result<serde_json::Value, String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(TESTBED_CNI)
        .map_err(|e| format!("read {TESTBED_CNI}: {e}"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "conflist"))
        .collect();
    files.sort();
    let file = files
        .first()
        .ok_or_else(|| format!("no conflist in {TESTBED_CNI}"))?;
    let text = std::fs::read_to_string(file).map_err(|e| format!("read {file:?}: {e}"))?;
    serde_json::from_str(&text).map_err(|e| format!("parse {file:?}: {e}"))
}

/// The host-local reservation directory of `network` (`<dataDir>/<network name>`).
fn reservation_dir(network: &serde_json::Value) -> Option<PathBuf> {
    let name = network["name"].as_str()?;
    let plugins = network["plugins"].as_array()?;
    let ipam = plugins.iter().find_map(|p| {
        let ipam = &p["ipam"];
        (ipam["type"].as_str() == Some("host-local")).then_some(ipam)
    })?;
    let data_dir = ipam["dataDir"].as_str().unwrap_or("/var/lib/cni/networks");
    Some(Path::new(data_dir).join(name))
}

/// The prefix length of the network's first IPAM range (for the DEL's prevResult).
fn prefix_len(network: &serde_json::Value) -> u8 {
    network["plugins"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|p| p["ipam"]["ranges"][0][0]["subnet"].as_str())
        .and_then(|s| s.split_once('/'))
        .and_then(|(_, len)| len.parse().ok())
        .unwrap_or(16)
}

/// The stdin of one plugin's DEL for `r`: the plugin's config with the network's name and
/// version, a prevResult naming the pod's IP (the firewall plugin removes its rules by IP), and
/// for a plugin with the portMappings capability one mapping (portmap's DEL does nothing without
/// one; it removes the container's chains by container id whatever the mapping is).
pub fn del_stdin(
    network: &serde_json::Value,
    plugin: &serde_json::Value,
    r: &Reservation,
) -> serde_json::Value {
    let version = network["cniVersion"].clone();
    let mut conf = plugin.clone();
    conf["name"] = network["name"].clone();
    conf["cniVersion"] = version.clone();
    if plugin["capabilities"]["portMappings"].as_bool() == Some(true) {
        conf["runtimeConfig"] = serde_json::json!({
            "portMappings": [{"hostPort": 1, "containerPort": 1, "protocol": "tcp"}]
        });
    }
    conf["prevResult"] = serde_json::json!({
        "cniVersion": version,
        "ips": [{"address": format!("{}/{}", r.ip, prefix_len(network))}],
    });
    conf
}

/// Runs the network's plugins with DEL for `r`, last plugin first, as a runtime would; no
/// netns (it is gone, or is unmounted after this).
fn cni_del(network: &serde_json::Value, r: &Reservation) -> Result<(), String> {
    let plugins = network["plugins"]
        .as_array()
        .ok_or("the conflist has no plugins")?;
    for plugin in plugins.iter().rev() {
        let kind = plugin["type"].as_str().ok_or("a plugin without a type")?;
        let stdin = serde_json::to_vec(&del_stdin(network, plugin, r))
            .map_err(|e| format!("encode the {kind} config: {e}"))?;
        let out = run_bounded(
            Command::new(Path::new(CNI_BIN_DIR).join(kind))
                .env("CNI_COMMAND", "DEL")
                .env("CNI_CONTAINERID", &r.container_id)
                .env("CNI_NETNS", "")
                .env("CNI_IFNAME", &r.ifname)
                .env("CNI_PATH", CNI_BIN_DIR),
            Some(stdin),
            Duration::from_secs(60),
        )?;
        if !out.status.success() {
            return Err(format!(
                "{kind} DEL for {}: {}{}",
                r.container_id,
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    Ok(())
}

/// Lazily unmounts what a test's remora mounted for pod `id` in the test's scratch dir
/// (`/tmp/rmr*/…/<id>[/…]`: the netns bind mount, the `/dev/shm` tmpfs; `<id>.userns`, a
/// user-namespaced pod's pinned user namespace).
fn unmount_scratch_mounts_of(id: &str) {
    let pin = format!("{id}.userns");
    let points = crate::testbed::mount_points()
        .into_iter()
        .filter(|mp| {
            mp.starts_with("/tmp/rmr")
                && Path::new(mp)
                    .components()
                    .any(|c| c.as_os_str() == id || c.as_os_str() == pin.as_str())
        })
        .collect();
    crate::testbed::unmount_deepest_first(points);
}

/// The reservations of the test bed network, with their age.
fn reservations(
    network: &serde_json::Value,
) -> Result<Vec<(Reservation, Option<Duration>)>, String> {
    let dir = reservation_dir(network).ok_or("the test bed network has no host-local IPAM")?;
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(Vec::new()); // no reservation made yet
    };
    let now = SystemTime::now();
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Ok(content) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        let Some(r) = parse_reservation(&name, &content) else {
            continue;
        };
        let age = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| now.duration_since(t).ok());
        found.push((r, age));
    }
    Ok(found)
}

/// CNI DEL for `r`, then its netns mount in a test's scratch dir unmounted; a report line.
fn release(network: &serde_json::Value, r: &Reservation) -> String {
    match cni_del(network, r) {
        Ok(()) => {
            unmount_scratch_mounts_of(&r.container_id);
            format!(
                "removed the pod network of {} ({}: port mappings, firewall rules, IP)",
                r.container_id, r.ip
            )
        }
        Err(e) => format!("could not release {} ({}): {e}", r.container_id, r.ip),
    }
}

/// Releases the test bed network of the pods `ids` (their containers are gone: the caller
/// removed them); report lines. For a fixture whose pods CRI could not remove.
pub fn release_networks_of(ids: &[String]) -> Vec<String> {
    let network = match testbed_network() {
        Ok(n) => n,
        Err(e) => return vec![e],
    };
    match reservations(&network) {
        Ok(found) => found
            .iter()
            .filter(|(r, _)| ids.contains(&r.container_id))
            .map(|(r, _)| release(&network, r))
            .collect(),
        Err(e) => vec![e],
    }
}

/// The sweep; what it did, or why it stopped (it stops when it cannot see what is live).
fn sweep() -> Result<Vec<String>, String> {
    let mut done = Vec::new();
    let dead_namespaces: HashSet<String> = lines(&ctr(None, &["namespaces", "ls", "-q"])?)
        .into_iter()
        .filter(|ns| {
            test_namespace_pid(ns).is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
        })
        .collect();
    // A killed test's remoras outlive it; they go first, so they do not act on the purge.
    done.extend(kill_remoras_of(&dead_namespaces));
    // The containers of a dead test's namespace, pods included, are provably nobody's.
    let mut dead_ids = HashSet::new();
    for ns in &dead_namespaces {
        match purge_namespace(ns) {
            Ok(ids) => {
                dead_ids.extend(ids);
                done.push(format!("removed namespace {ns} (its test process is gone)"));
            }
            Err(e) => done.push(format!("removed namespace {ns} in part: {e}")),
        }
    }

    // Every container of every namespace, read after the purge: a pod whose id is here is live.
    let mut live = HashSet::new();
    for ns in lines(&ctr(None, &["namespaces", "ls", "-q"])?) {
        live.extend(lines(&ctr(Some(&ns), &["containers", "ls", "-q"])?));
    }
    let network = testbed_network()?;
    for (r, age) in reservations(&network)? {
        let dead = dead_ids.contains(&r.container_id);
        let old = age.is_some_and(|a| a >= GRACE);
        if live.contains(&r.container_id) || !(dead || old) {
            continue;
        }
        // One reservation that cannot be released does not keep the others.
        done.push(release(&network, &r));
    }
    Ok(done)
}

/// Runs the sweep once per test process; reports on stderr (shown with a failing test's output).
pub fn sweep_once() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| match sweep() {
        Ok(done) => {
            for what in done {
                eprintln!("test bed sweep: {what}");
            }
        }
        Err(e) => eprintln!("test bed sweep stopped: {e}"),
    });
}

#[test]
fn reservations_parse_with_and_without_an_interface_line() {
    assert_eq!(
        parse_reservation("10.88.0.7", "abc\r\neth0"),
        Some(Reservation {
            ip: "10.88.0.7".parse().unwrap(),
            container_id: "abc".into(),
            ifname: "eth0".into(),
        })
    );
    assert_eq!(
        parse_reservation("10.88.0.8", "def").map(|r| (r.container_id, r.ifname)),
        Some(("def".to_string(), "eth0".to_string()))
    );
    assert_eq!(parse_reservation("last_reserved_ip.0", "10.88.0.8"), None);
    assert_eq!(parse_reservation("lock", ""), None);
    assert_eq!(parse_reservation("10.88.0.9", ""), None);
}

#[test]
fn only_test_namespaces_name_a_process() {
    assert_eq!(test_namespace_pid("it-4242-1f2e-0"), Some(4242));
    assert_eq!(test_namespace_pid("remora"), None);
    assert_eq!(test_namespace_pid("k8s.io"), None);
    assert_eq!(test_namespace_pid("it-x-1"), None);
}

#[test]
fn del_config_carries_a_port_mapping_only_for_portmap_and_the_ip_for_all() {
    let network = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "net",
        "plugins": [
            {"type": "bridge", "ipam": {"type": "host-local", "dataDir": "/d",
                "ranges": [[{"subnet": "10.88.0.0/16"}]]}},
            {"type": "portmap", "capabilities": {"portMappings": true}},
            {"type": "firewall"}
        ]
    });
    let r = Reservation {
        ip: "10.88.1.2".parse().unwrap(),
        container_id: "id".into(),
        ifname: "eth0".into(),
    };
    assert_eq!(reservation_dir(&network), Some(PathBuf::from("/d/net")));
    let plugins = network["plugins"].as_array().unwrap();
    let portmap = del_stdin(&network, &plugins[1], &r);
    assert_eq!(portmap["name"], "net");
    assert_eq!(portmap["cniVersion"], "1.0.0");
    assert_eq!(
        portmap["runtimeConfig"]["portMappings"][0]["hostPort"],
        serde_json::json!(1)
    );
    let firewall = del_stdin(&network, &plugins[2], &r);
    assert!(firewall.get("runtimeConfig").is_none());
    assert_eq!(firewall["prevResult"]["ips"][0]["address"], "10.88.1.2/16");
}
