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
//!   gone: its tasks are killed and its objects removed. Killing a pod's pause task frees its
//!   network namespace, and with it the pod's veth on the bridge.
//! - Then an IPAM reservation of the test bed network whose container id names no container in
//!   any namespace of the test bed containerd, made more than [`GRACE`] ago. Every runtime on
//!   this containerd gives CNI the sandbox id as container id and creates the pod's pause
//!   container under that id; the grace period covers a RunPodSandbox in flight, which reserves
//!   the IP before it creates its pause container. For such a reservation the network's plugins
//!   are run with DEL, last plugin first, as a runtime would: that removes the pod's port-mapping
//!   chains (`CNI-DN-*`), its firewall rules and the reservation. A netns bind mount of the same
//!   sandbox id left in a test's scratch dir (`/tmp/rmr*`) is unmounted, which frees its veth.

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

use crate::harness::{tools_bin, TESTBED_CNI, TESTBED_CONTAINERD};

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
/// namespace itself. Best effort (what fails stays for the next sweep); never panics.
pub fn purge_namespace(namespace: &str) -> Result<(), String> {
    let ns = Some(namespace);
    for id in lines(&ctr(ns, &["tasks", "ls", "-q"])?) {
        let _ = ctr(ns, &["tasks", "kill", "--signal", "SIGKILL", &id]);
        let _ = ctr(ns, &["tasks", "rm", "--force", &id]);
    }
    for id in lines(&ctr(ns, &["containers", "ls", "-q"])?) {
        let _ = ctr(ns, &["containers", "rm", &id]);
    }
    for name in lines(&ctr(ns, &["images", "ls", "-q"])?) {
        let _ = ctr(ns, &["images", "rm", "--sync", &name]);
    }
    for id in lines(&ctr(ns, &["leases", "ls", "-q"])?) {
        let _ = ctr(ns, &["leases", "rm", &id]);
    }
    ctr(None, &["namespaces", "rm", namespace]).map(drop)
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

/// Lazily unmounts netns bind mounts named `id` in tests' scratch dirs (`/tmp/rmr*/…/<id>`).
fn unmount_scratch_netns(id: &str) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    for line in info.lines() {
        let mut fields = line.split(' ');
        let Some(mount_point) = fields.nth(4) else {
            continue;
        };
        let is_nsfs = line
            .split(" - ")
            .nth(1)
            .is_some_and(|t| t.starts_with("nsfs "));
        if is_nsfs
            && mount_point.starts_with("/tmp/rmr")
            && Path::new(mount_point).file_name().is_some_and(|n| n == id)
        {
            let _ = nix::mount::umount2(mount_point, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

/// The sweep; what it did, or why it stopped (it stops when it cannot see what is live).
fn sweep() -> Result<Vec<String>, String> {
    let mut done = Vec::new();
    let namespaces = lines(&ctr(None, &["namespaces", "ls", "-q"])?);
    for ns in &namespaces {
        let Some(pid) = test_namespace_pid(ns) else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        match purge_namespace(ns) {
            Ok(()) => done.push(format!(
                "removed namespace {ns} (test process {pid} is gone)"
            )),
            Err(e) => done.push(format!("removed namespace {ns} in part: {e}")),
        }
    }

    // Every container of every namespace, read after the purge: a pod whose id is here is live.
    let mut live = HashSet::new();
    for ns in lines(&ctr(None, &["namespaces", "ls", "-q"])?) {
        live.extend(lines(&ctr(Some(&ns), &["containers", "ls", "-q"])?));
    }
    let network = testbed_network()?;
    let dir = reservation_dir(&network).ok_or("the test bed network has no host-local IPAM")?;
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(done); // no reservation made yet
    };
    let now = SystemTime::now();
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
        if live.contains(&r.container_id) || age.is_none_or(|a| a < GRACE) {
            continue;
        }
        // One reservation that cannot be released does not keep the others.
        match cni_del(&network, &r) {
            Ok(()) => {
                unmount_scratch_netns(&r.container_id);
                done.push(format!(
                    "removed the pod network of {} ({}: port mappings, firewall rules, IP)",
                    r.container_id, r.ip
                ));
            }
            Err(e) => done.push(format!(
                "could not release {} ({}): {e}",
                r.container_id, r.ip
            )),
        }
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
