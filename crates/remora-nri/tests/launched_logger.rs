//! The registry against NRI's own Go plugin library: `nri-stub-logger`
//! (tests/nri-stub-logger/main.go, on `pkg/stub` of github.com/containerd/nri at the version
//! protos/sources.txt pins), launched from a plugin directory and connected as an external
//! plugin. scripts/setup.sh builds it into `$REMORA_TOOLS_DIR/bin` (default
//! /var/tmp/remora-tools/bin); `scripts/setup.sh nri-plugin` builds only it.
//!
//! Without the binary the tests are skipped with a message on stderr, unless
//! `REMORA_REQUIRE_TOOLS` or `CI` is set (scripts/test.sh sets the first): then a missing
//! binary fails them, so CI never skips them silently.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use remora_nri::api;
use remora_nri::registry::{Config, Registry, RuntimeHandle, SyncSource};
use tokio::time::timeout;

/// A bound on every wait: a wedged plugin or registry fails the test instead of hanging it.
const DEADLINE: Duration = Duration::from_secs(30);
/// scripts/setup.sh's tools directory when `REMORA_TOOLS_DIR` is not set (as
/// protos/sources.rs).
const DEFAULT_TOOLS_DIR: &str = "/var/tmp/remora-tools";
const PLUGIN: &str = "nri-stub-logger";

/// The plugin binary, or None (after saying so) when it is missing and may be.
fn plugin_binary(test: &str) -> Option<PathBuf> {
    let tools = std::env::var_os("REMORA_TOOLS_DIR")
        .filter(|d| !d.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_TOOLS_DIR), PathBuf::from);
    let bin = tools.join("bin").join(PLUGIN);
    if bin.is_file() {
        return Some(bin);
    }
    let required = ["REMORA_REQUIRE_TOOLS", "CI"]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|v| !v.is_empty() && v != "0"));
    assert!(
        !required,
        "{} is missing: run scripts/setup.sh (or scripts/setup.sh nri-plugin)",
        bin.display()
    );
    // Straight to stderr: the test harness captures only the print macros, and a skip
    // should show.
    let _ = writeln!(
        std::io::stderr(),
        "{test}: SKIPPED: {} is missing (scripts/setup.sh nri-plugin builds it; \
         REMORA_REQUIRE_TOOLS=1 makes this a failure)",
        bin.display()
    );
    None
}

struct NoObjects;

impl SyncSource for NoObjects {
    fn snapshot(&self) -> (Vec<api::PodSandbox>, Vec<api::Container>) {
        (Vec::new(), Vec::new())
    }
}

struct NoUpdates;

#[async_trait::async_trait]
impl RuntimeHandle for NoUpdates {
    async fn update_containers(
        &self,
        updates: Vec<api::ContainerUpdate>,
        _evictions: Vec<api::ContainerEviction>,
    ) -> Vec<api::ContainerUpdate> {
        updates
    }
}

/// The registry's log on stderr, which the test harness shows for a failed test.
struct StderrDrain;

impl slog::Drain for StderrDrain {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &slog::Record, values: &slog::OwnedKVList) -> Result<(), slog::Never> {
        use slog::KV as _;
        let mut kv = KvLine(String::new());
        let _ = record.kv().serialize(record, &mut kv);
        let _ = values.serialize(record, &mut kv);
        eprintln!("{} {}{}", record.level().as_short_str(), record.msg(), kv.0);
        Ok(())
    }
}

struct KvLine(String);

impl slog::Serializer for KvLine {
    fn emit_arguments(&mut self, key: slog::Key, val: &std::fmt::Arguments) -> slog::Result {
        self.0.push_str(&format!(" {key}={val}"));
        Ok(())
    }
}

fn logger() -> slog::Logger {
    slog::Logger::root(slog::Fuse(StderrDrain), slog::o!())
}

/// A short scratch directory (a Unix socket path has at most 107 bytes).
fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("rnri")
        .tempdir_in("/tmp")
        .expect("scratch dir")
}

fn pod(id: &str) -> api::PodSandbox {
    let mut pod = api::PodSandbox::new();
    pod.id = id.into();
    pod.name = format!("{id}-name");
    pod
}

async fn wait_active(registry: &Registry, name: &str) {
    let mut active = registry.watch_plugins();
    timeout(
        DEADLINE,
        active.wait_for(|names| names.iter().any(|n| n == name)),
    )
    .await
    .unwrap_or_else(|_| panic!("{name} is not active after {DEADLINE:?}"))
    .expect("registry alive");
}

/// The plugin's records, one a line.
fn records(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_else(|e| panic!("reading {}: {e}", log.display()))
        .lines()
        .map(String::from)
        .collect()
}

/// The value of `key=` in a record line.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split(' ')
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

/// Whether `pid` is gone: no process, not even a zombie waiting to be reaped.
fn reaped(pid: u32) -> bool {
    !Path::new(&format!("/proc/{pid}")).exists()
}

#[tokio::test]
async fn a_launched_go_plugin_registers_gets_its_config_and_events_and_is_reaped_on_stop() {
    let Some(bin) = plugin_binary("launched") else {
        return;
    };
    let dir = scratch();
    let plugins = dir.path().join("plugins");
    let conf = dir.path().join("conf.d");
    std::fs::create_dir(&plugins).expect("mkdir");
    std::fs::create_dir(&conf).expect("mkdir");
    std::os::unix::fs::symlink(&bin, plugins.join("10-logger")).expect("symlink");
    let log = dir.path().join("launched.log");
    let config = format!(r#"{{"logFile": "{}"}}"#, log.display());
    std::fs::write(conf.join("10-logger.conf"), &config).expect("conf");

    let mut cfg = Config::new(dir.path().join("nri.sock"), "remora-test", "0.0.1");
    cfg.plugin_path = Some(plugins);
    cfg.plugin_config_path = Some(conf);
    let registry =
        Registry::start(cfg, Arc::new(NoObjects), Arc::new(NoUpdates), logger()).expect("start");
    wait_active(&registry, "10-logger").await;
    assert_eq!(registry.plugins(), ["10-logger"]);
    timeout(DEADLINE, registry.run_pod_sandbox(&pod("pod-launched")))
        .await
        .expect("in time")
        .expect("RunPodSandbox");

    // The plugin writes a record before it answers: the event is in the log now.
    let lines = records(&log);
    let start = lines
        .iter()
        .find(|l| l.starts_with("start "))
        .unwrap_or_else(|| panic!("no start record: {lines:?}"));
    // NRI's launch convention, as NRI's stub saw it: exactly these variables, fd 3.
    assert_eq!(
        field(start, "env"),
        Some("NRI_PLUGIN_IDX,NRI_PLUGIN_NAME,NRI_PLUGIN_SOCKET"),
        "{start}"
    );
    assert_eq!(field(start, "socket_env"), Some("\"3\""), "{start}");
    assert_eq!(field(start, "name_env"), Some("\"logger\""), "{start}");
    assert_eq!(field(start, "idx_env"), Some("\"10\""), "{start}");
    let pid: u32 = field(start, "pid")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no pid: {start}"));
    let configure = lines
        .iter()
        .find(|l| l.starts_with("configure "))
        .unwrap_or_else(|| panic!("no configure record: {lines:?}"));
    assert!(
        configure.starts_with("configure runtime=remora-test version=0.0.1 config="),
        "{configure}"
    );
    assert!(configure.contains("launched.log"), "{configure}");
    assert!(
        lines.contains(&"synchronize pods= containers=".to_string()),
        "{lines:?}"
    );
    assert!(
        lines.contains(&"event RunPodSandbox pod=pod-launched".to_string()),
        "{lines:?}"
    );
    assert!(!reaped(pid), "pid {pid} is running");

    timeout(DEADLINE, registry.stop())
        .await
        .expect("stops in time");
    assert!(reaped(pid), "pid {pid} killed and reaped by stop()");
    assert!(
        records(&log).contains(&"shutdown".to_string()),
        "{:?}",
        records(&log)
    );
}

#[tokio::test]
async fn an_external_go_plugin_registers_gets_events_and_exits_after_shutdown() {
    let Some(bin) = plugin_binary("external") else {
        return;
    };
    let dir = scratch();
    let socket = dir.path().join("nri.sock");
    let log = dir.path().join("external.log");
    let registry = Registry::start(
        Config::new(&socket, "remora-test", "0.0.1"),
        Arc::new(NoObjects),
        Arc::new(NoUpdates),
        logger(),
    )
    .expect("start");
    // The stub's own log (logrus on stderr), shown when the test fails.
    let stderr = dir.path().join("external.stderr");
    let mut plugin = tokio::process::Command::new(&bin)
        .arg("-socket-path")
        .arg(&socket)
        .args(["-idx", "20", "-name", "external-logger", "-events", "pod"])
        .arg("-log-file")
        .arg(&log)
        .stderr(std::fs::File::create(&stderr).expect("stderr file"))
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the plugin");
    let stub_log = || std::fs::read_to_string(&stderr).unwrap_or_default();
    wait_active(&registry, "20-external-logger").await;
    timeout(DEADLINE, registry.run_pod_sandbox(&pod("pod-external")))
        .await
        .expect("in time")
        .expect("RunPodSandbox");
    let lines = records(&log);
    assert!(
        lines.contains(&"event RunPodSandbox pod=pod-external".to_string()),
        "{lines:?}"
    );
    // Subscribed to pod events only: CreateContainer does not reach it.
    let mut container = api::Container::new();
    container.id = "ctr-external".into();
    container.pod_sandbox_id = "pod-external".into();
    let replies = timeout(
        DEADLINE,
        registry.create_container(&pod("pod-external"), &container),
    )
    .await
    .expect("in time")
    .expect("CreateContainer");
    assert!(replies.is_empty(), "{} replies", replies.len());

    timeout(DEADLINE, registry.stop())
        .await
        .expect("stops in time");
    // Exit 0: its connection closed after a Shutdown (1 without one).
    let status = timeout(DEADLINE, plugin.wait())
        .await
        .expect("the plugin exits once the registry stopped")
        .expect("wait");
    assert!(
        status.success(),
        "{status}: {:?}\n{}",
        records(&log),
        stub_log()
    );
    let lines = records(&log);
    assert!(lines.contains(&"shutdown".to_string()), "{lines:?}");
    assert!(
        !lines.iter().any(|l| l.contains("ctr-external")),
        "{lines:?}"
    );
}
