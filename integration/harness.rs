//! Test fixtures over real processes: a private containerd per test (so a test may stop and
//! restart it without disturbing others) and the real `remora` binary.
//!
//! The binaries come from the tools dir that `scripts/setup.sh` fills
//! (`$REMORA_TOOLS_DIR/bin`, default `/var/tmp/remora-tools/bin`). A missing binary fails the
//! test with a message saying to run setup; nothing is skipped silently.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use remora::cri::v1::image_service_client::ImageServiceClient;
use remora::cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

use crate::testbed::{
    tools_bin, unmount_below, TESTBED_CERTS, TESTBED_CNI, TESTBED_CONTAINERD, TESTBED_REGISTRY,
    TESTBED_REGISTRY_LOG,
};

/// A tool from the tools dir, or a test failure that says how to get it.
pub fn tool(name: &str) -> PathBuf {
    let p = tools_bin().join(name);
    assert!(
        p.is_file(),
        "{} is missing: run scripts/setup.sh first",
        p.display()
    );
    p
}

/// A short scratch dir (unix socket paths are limited to 107 bytes).
pub fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("rmr")
        .tempdir_in("/tmp")
        .expect("create scratch dir in /tmp")
}

/// Polls `check` every 50 ms until it returns true or `limit` passes; panics with `what`.
/// The limit only guards against hanging: it is never the thing under test.
pub async fn wait_until<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sends `sig` to the child and waits for it to exit (SIGKILL after 10 s).
pub fn stop_child(child: &mut Child, sig: Signal) -> std::process::ExitStatus {
    let _ = kill(Pid::from_raw(child.id() as i32), sig);
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait for child") {
            return status;
        }
        if start.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A containerd of our own, with its CRI plugin disabled (remora is the CRI here).
pub struct Containerd {
    dir: PathBuf,
    child: Option<Child>,
}

impl Containerd {
    /// Starts containerd with root, state and socket under `dir`, and waits for its socket.
    pub fn start(dir: &Path) -> Self {
        let mut c = Containerd {
            dir: dir.to_path_buf(),
            child: None,
        };
        c.restart();
        c
    }

    /// containerd's gRPC socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("ctd.sock")
    }

    /// Starts it again after [`Containerd::stop`] (same root and state).
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "containerd already running");
        let d = &self.dir;
        let config = d.join("containerd.toml");
        std::fs::write(
            &config,
            format!(
                r#"version = 3
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.images", "io.containerd.cri.v1.runtime", "io.containerd.nri.v1.nri"]
[grpc]
address = "{sock}"
[ttrpc]
address = "{sock}.ttrpc"
[debug]
address = ""
[metrics]
address = ""
"#,
                root = d.join("ctd-root").display(),
                state = d.join("ctd-state").display(),
                sock = self.socket().display(),
            ),
        )
        .expect("write containerd config");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(d.join("containerd.log"))
            .expect("open containerd log");
        // containerd finds its shims on PATH: ours (v2.3.4) before any system one.
        let path = format!(
            "{}:{}",
            tools_bin().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let child = Command::new(tool("containerd"))
            .env("PATH", path)
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log)
            .spawn()
            .expect("spawn containerd");
        self.child = Some(child);
        let start = Instant::now();
        while !self.socket().exists() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "containerd did not create its socket; see {}",
                d.join("containerd.log").display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops it (SIGTERM) and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop_child(&mut child, Signal::SIGTERM);
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The runtime handler every remora the tests start uses by default: `REMORA_IT_HANDLER`
/// (`remora`, remora's shim as shipped, when unset or empty; `runc` for containerd's Go shim,
/// `crun` for remora's shim running crun).
pub fn it_handler() -> String {
    match std::env::var("REMORA_IT_HANDLER") {
        Ok(h) if !h.is_empty() => h,
        _ => "remora".to_string(),
    }
}

/// The runc `scripts/setup.sh` pins (`$TOOLS_BIN/runc-pinned`): the OCI runtime of the runc and
/// remora handlers of every remora the tests start, as of the test bed's containerd CRI.
pub fn pinned_runc() -> PathBuf {
    tool("runc-pinned")
}

/// The OCI runtime binary a built-in handler's shim runs (for tests that call it directly).
pub fn oci_binary_of(handler: &str) -> PathBuf {
    match handler {
        "crun" => PathBuf::from("crun"),
        _ => pinned_runc(),
    }
}

/// The built-in handlers with the pinned runc ([`pinned_runc`]) for the runc-running ones, as
/// `scripts/remora-testbed.toml` sets them for the test bed's remoras.
pub fn pinned_handlers() -> String {
    let runc = pinned_runc();
    with_it_shim(format!(
        "[runtime.handlers.runc]\nruntime_type = \"io.containerd.runc.v2\"\nbinary_name = \"{runc}\"\n\
         [runtime.handlers.remora]\nruntime_type = \"io.containerd.remora.v2\"\nbinary_name = \"{runc}\"\n\
         [runtime.handlers.crun]\nruntime_type = \"io.containerd.remora.v2\"\nbinary_name = \"crun\"\n",
        runc = runc.display()
    ))
}

/// `config` with `runtime_path = "$REMORA_IT_SHIM"` in every handler of remora's shim when
/// `REMORA_IT_SHIM` names a shim binary (a worktree's own build: the installed one is the test
/// bed's, shared); unchanged when unset, and containerd finds the installed shim.
pub fn with_it_shim(config: String) -> String {
    match std::env::var("REMORA_IT_SHIM") {
        Ok(path) if !path.is_empty() => {
            let line = "runtime_type = \"io.containerd.remora.v2\"\n";
            config.replace(line, &format!("{line}runtime_path = \"{path}\"\n"))
        }
        _ => config,
    }
}

/// This tree's build of remora's shim: `REMORA_IT_SHIM` when set, else the binary
/// `scripts/setup.sh` built from this tree (`cargo build --profile shim -p remora-shim`, static
/// for musl, or for the host where the toolchain lacks that target: `scripts/common.sh`
/// `build_shim`; in the target directory this test binary runs from). The shim is its own
/// package, so cargo gives the daemon's tests no `CARGO_BIN_EXE_` for it.
pub fn this_trees_shim() -> std::path::PathBuf {
    if let Ok(path) = std::env::var("REMORA_IT_SHIM") {
        if !path.is_empty() {
            return path.into();
        }
    }
    // <target>/debug/deps/<test binary>
    let exe = std::env::current_exe().expect("the test binary's path");
    let target = exe
        .ancestors()
        .nth(3)
        .expect("the test binary lies in <target>/<profile>/deps");
    let musl = target
        .join("x86_64-unknown-linux-musl")
        .join("shim")
        .join("containerd-shim-remora-v2");
    let host = target.join("shim").join("containerd-shim-remora-v2");
    if musl.is_file() {
        musl
    } else if host.is_file() {
        host
    } else {
        panic!(
            "neither {} nor {} is there: build the shim with scripts/setup.sh \
             (`cargo build --profile shim -p remora-shim --target x86_64-unknown-linux-musl`) \
             or name a shim in REMORA_IT_SHIM",
            musl.display(),
            host.display()
        )
    }
}

/// The pid of the shim (`binary`: remora's or containerd's Go runc shim) serving pod `pod` in
/// containerd namespace `namespace`: the server process, not a `start` or `delete` run.
pub fn shim_pid(binary: &str, namespace: &str, pod: &str) -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.find_map(|e| {
        let pid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let args: Vec<&str> = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .filter_map(|a| std::str::from_utf8(a).ok())
            .collect();
        let flag = |name: &str| {
            args.windows(2)
                .find(|w| w[0] == name)
                .map(|w| w[1].to_string())
        };
        (args.first()?.ends_with(binary)
            && flag("-namespace").as_deref() == Some(namespace)
            && flag("-id").as_deref() == Some(pod)
            && !matches!(args.last(), Some(&"start" | &"delete")))
        .then_some(pid)
    })
}

/// `extra` (a TOML fragment appended to a test's config) with `[runtime] default_handler`
/// set to [`it_handler`], unless `extra` sets a default handler itself. A fragment with its
/// own `[runtime]` table gets the key inside it (TOML forbids a second `[runtime]` header).
pub fn with_it_handler(extra: &str) -> String {
    if extra.contains("default_handler") {
        return extra.to_string();
    }
    let line = format!("default_handler = \"{}\"\n", it_handler());
    match extra.find("[runtime]\n") {
        Some(at) => {
            let after = at + "[runtime]\n".len();
            format!("{}{line}{}", &extra[..after], &extra[after..])
        }
        None => format!("[runtime]\n{line}{extra}"),
    }
}

/// A remora config for tests on a private containerd ([`Bed`]), rendered as TOML. Not the test
/// bed's template (`scripts/remora-testbed.toml`, see [`testbed_remora_config`]): there is no
/// registry mirror here. The fault tests stop and restart this containerd with remora's default
/// probe and reconnect settings: how fast remora is back is the design's, not the test's. The
/// built-in handlers run the pinned runc ([`pinned_handlers`]) unless `extra` lists handlers of
/// its own (which replace the built-in ones).
pub fn remora_config(socket: &Path, containerd: &Path, cni_conf_dir: &Path, extra: &str) -> String {
    let handlers = if extra.contains("[runtime.handlers.") {
        String::new()
    } else {
        pinned_handlers()
    };
    // Each remora its own NRI socket (the default is one per node), and no plugins launched
    // from the host's directories; unless the test sets [nri] itself.
    let nri = if extra.contains("[nri]") {
        String::new()
    } else {
        format!(
            "[nri]\nsocket_path = \"{root}/nri.sock\"\nplugin_path = \"\"\nplugin_config_path = \"\"\n",
            root = socket.parent().unwrap_or(Path::new("/tmp")).display()
        )
    };
    format!(
        r#"[server]
socket = "{}"
root_dir = "{root}/root"
state_dir = "{root}/state"
[log]
level = "debug"
[containerd]
address = "{}"
[cni]
conf_dir = "{}"
bin_dirs = ["/usr/lib/cni"]
{extra}
{nri}
{handlers}"#,
        socket.display(),
        containerd.display(),
        cni_conf_dir.display(),
        root = socket.parent().unwrap_or(Path::new("/tmp")).display(),
        extra = with_it_handler(extra),
    )
}

/// A running `remora` process.
pub struct Remora {
    /// Its CRI socket.
    pub socket: PathBuf,
    /// Its stderr log file.
    pub log: PathBuf,
    child: Option<Child>,
}

/// The remora binary Cargo built for this test run.
pub fn remora_bin() -> &'static str {
    env!("CARGO_BIN_EXE_remora")
}

impl Remora {
    /// Writes `config` to `dir/remora.toml`, starts remora with it and waits until its socket
    /// accepts connections.
    pub fn start(dir: &Path, config: &str, socket: &Path) -> Self {
        Self::start_env(dir, config, socket, &[])
    }

    /// As [`Remora::start`], with extra environment variables (e.g. `REMORA_FAILPOINTS`).
    pub fn start_env(dir: &Path, config: &str, socket: &Path, env: &[(&str, &str)]) -> Self {
        Self::try_start_env(dir, config, socket, env).unwrap_or_else(|e| panic!("{e}"))
    }

    /// As [`Remora::start_env`], but a failure is returned instead of panicking (for teardown
    /// code, which may run while a test panics).
    pub fn try_start_env(
        dir: &Path,
        config: &str,
        socket: &Path,
        env: &[(&str, &str)],
    ) -> Result<Self, String> {
        let config_path = dir.join("remora.toml");
        std::fs::write(&config_path, config).map_err(|e| format!("write remora config: {e}"))?;
        let log = dir.join("remora.log");
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| format!("open remora log: {e}"))?;
        let err_out = out.try_clone().map_err(|e| format!("dup log: {e}"))?;
        let child = Command::new(remora_bin())
            .arg("--config")
            .arg(&config_path)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err_out)
            .spawn()
            .map_err(|e| format!("spawn remora: {e}"))?;
        // Held from here on, so an early return below kills the child.
        let mut remora = Remora {
            socket: socket.to_path_buf(),
            log: log.clone(),
            child: Some(child),
        };
        let start = Instant::now();
        // The socket accepts connections (into its backlog) as soon as it is bound; remora
        // answers once its first recovery is done and it logs "serving CRI v1".
        let serving = |log: &Path| {
            std::fs::read_to_string(log)
                .map(|t| t.matches("serving CRI v1").count())
                .unwrap_or(0)
        };
        let served_before = serving(&log);
        while std::os::unix::net::UnixStream::connect(socket).is_err()
            || serving(&log) == served_before
        {
            let exited = match remora.child.as_mut().map(Child::try_wait) {
                Some(Ok(status)) => status,
                Some(Err(e)) => return Err(format!("wait remora: {e}")),
                None => None,
            };
            if let Some(status) = exited {
                remora.child = None;
                return Err(format!(
                    "remora exited ({status}) before serving: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                ));
            }
            if start.elapsed() >= Duration::from_secs(20) {
                return Err("remora did not serve".to_string());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(remora)
    }

    /// Whether its process is running (not crashed or stopped by the test).
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(Child::try_wait), Some(Ok(None)))
    }

    /// A CRI RuntimeService client on its socket.
    pub fn runtime(&self) -> RuntimeServiceClient<Channel> {
        RuntimeServiceClient::new(remora::grpc::unix_channel(
            &self.socket,
            Duration::from_secs(5),
        ))
    }

    /// A CRI ImageService client on its socket.
    pub fn images(&self) -> ImageServiceClient<Channel> {
        ImageServiceClient::new(remora::grpc::unix_channel(
            &self.socket,
            Duration::from_secs(5),
        ))
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).expect("remora running")
    }

    /// Waits (up to `limit`) for remora to exit by itself, e.g. killed by a failpoint.
    pub fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let child = self.child.as_mut().expect("remora running");
        let start = Instant::now();
        loop {
            if let Some(status) = child.try_wait().expect("wait remora") {
                self.child = None;
                return status;
            }
            assert!(
                start.elapsed() < limit,
                "remora still running after {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends `sig` and waits for the exit status.
    pub fn stop_with(&mut self, sig: Signal) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("remora running");
        stop_child(&mut child, sig)
    }

    /// Its log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Remora {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop_child(&mut child, Signal::SIGKILL);
        }
    }
}

/// A private containerd plus a remora on it, in one scratch dir.
/// Fields drop in order: remora, then containerd, then the dir they use.
pub struct Bed {
    /// remora.
    pub remora: Remora,
    /// containerd.
    pub containerd: Containerd,
    /// Scratch dir; removed on drop.
    pub dir: tempfile::TempDir,
}

impl Drop for Bed {
    fn drop(&mut self) {
        unmount_below(self.dir.path());
    }
}

impl Bed {
    /// The runc root the shim uses for this bed's containers: the default of both the Go shim
    /// and remora's, `/run/containerd/runc/<namespace>` (remora's default namespace here).
    pub fn runc_root(&self) -> String {
        "/run/containerd/runc/remora".to_string()
    }

    /// Starts both; `extra` is appended to remora's config.
    pub fn start(extra: &str) -> Self {
        Self::start_edited(extra, |config| config)
    }

    /// Starts both; remora's config is `edit` of the usual one (with `extra` appended), for
    /// keys in a table the usual config has already opened (`[cni]`).
    pub fn start_edited(extra: &str, edit: impl FnOnce(String) -> String) -> Self {
        let dir = scratch();
        let containerd = Containerd::start(dir.path());
        let socket = dir.path().join("remora.sock");
        let config = edit(remora_config(
            &socket,
            &containerd.socket(),
            &dir.path().join("net.d"),
            extra,
        ));
        let remora = Remora::start(dir.path(), &config, &socket);
        Bed {
            remora,
            containerd,
            dir,
        }
    }

    /// Kills remora and starts it again with the same config, plus `env`.
    pub fn restart_remora_env(&mut self, env: &[(&str, &str)]) {
        self.remora.stop_with(Signal::SIGKILL);
        let config = std::fs::read_to_string(self.dir.path().join("remora.toml"))
            .expect("read remora config");
        let socket = self.remora.socket.clone();
        self.remora = Remora::start_env(self.dir.path(), &config, &socket, env);
    }

    /// Runs `ctr` against this bed's containerd in remora's namespace; returns stdout.
    pub fn ctr(&self, args: &[&str]) -> String {
        ctr_in(&self.containerd.socket(), "remora", args)
    }
}

/// Runs `ctr` against the containerd at `address` in `namespace`; returns stdout (panics on
/// failure).
pub fn ctr_in(address: &Path, namespace: &str, args: &[&str]) -> String {
    let out = Command::new(tool("ctr"))
        .arg("--address")
        .arg(address)
        .args(["-n", namespace])
        .args(args)
        .output()
        .expect("run ctr");
    assert!(
        out.status.success(),
        "ctr {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// remora's config on the test bed, the template `scripts/testbed.sh` fills in for the test
/// bed's own remora too, so the two cannot drift apart.
const TESTBED_REMORA_TEMPLATE: &str = include_str!("../scripts/remora-testbed.toml");

/// [`TESTBED_REMORA_TEMPLATE`] with each `@NAME@` replaced by its value in `vars`.
pub fn testbed_remora_config(vars: &[(&str, &str)]) -> String {
    let mut config = TESTBED_REMORA_TEMPLATE.to_string();
    for (name, value) in vars {
        config = config.replace(&format!("@{name}@"), value);
    }
    let unfilled = regex::Regex::new("@[A-Z_]+@").expect("a valid regex");
    assert!(
        !unfilled.is_match(&config),
        "scripts/remora-testbed.toml has a placeholder the harness does not fill in:\n{config}"
    );
    with_it_shim(config)
}

/// A unique-enough suffix for names made by one test.
pub fn unique(prefix: &str) -> String {
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{prefix}-{}-{nanos:x}-{seq}", std::process::id())
}

/// A remora of its own (own socket, own containerd namespace) on the shared test bed's
/// containerd and registry. Its namespace is emptied and removed on drop.
pub struct BedRemora {
    /// remora.
    pub remora: Remora,
    /// Its containerd namespace.
    pub namespace: String,
    /// Its config, to start it again.
    config: String,
    /// Scratch dir (socket, config, log); held so it lives as long as remora.
    _dir: tempfile::TempDir,
}

impl BedRemora {
    /// Starts remora on the test bed, pulling through the test bed's hosts.toml mirrors.
    pub fn start() -> Self {
        Self::start_with_certs(Path::new(TESTBED_CERTS))
    }

    /// Starts remora on the test bed with `certs` as its hosts.toml directory.
    pub fn start_with_certs(certs: &Path) -> Self {
        Self::start_with(certs, None)
    }

    /// Starts remora on the test bed with the test bed's pod network (its CNI conf dir).
    pub fn start_with_network() -> Self {
        Self::start_with(Path::new(TESTBED_CERTS), Some(Path::new(TESTBED_CNI)))
    }

    /// Starts remora on the test bed with `certs` as its hosts.toml directory and `cni` as its
    /// CNI conf dir (`None`: an empty dir of its own, so NetworkReady is false).
    pub fn start_with(certs: &Path, cni: Option<&Path>) -> Self {
        Self::start_with_extra(certs, cni, "")
    }

    /// Starts remora on the test bed with its pod network and `extra` (TOML) appended to its
    /// config.
    pub fn start_with_network_and(extra: &str) -> Self {
        Self::start_with_extra(
            Path::new(TESTBED_CERTS),
            Some(Path::new(TESTBED_CNI)),
            extra,
        )
    }

    /// Starts remora on the test bed with `conf_dir` as its CNI conf dir and `bin_dir`
    /// searched for plugins before the test bed's plugin dir.
    pub fn start_with_cni(conf_dir: &Path, bin_dir: &Path) -> Self {
        Self::start_configured(Path::new(TESTBED_CERTS), Some(conf_dir), "", |config| {
            let edited = config.replacen(
                "bin_dirs = [\"/usr/lib/cni\"]",
                &format!("bin_dirs = [\"{}\", \"/usr/lib/cni\"]", bin_dir.display()),
                1,
            );
            assert_ne!(edited, config, "the test bed template has a bin_dirs line");
            edited
        })
    }

    /// Starts remora on the test bed with `certs` as its hosts.toml directory and its layers
    /// pulled by `pull_layers` (`"remora"` or `"transfer"`; see `[images] pull_layers`).
    pub fn start_pulling_layers_with(certs: &Path, pull_layers: &str) -> Self {
        Self::start_configured(certs, None, "", |config| {
            let edited = config.replacen(
                "[images]\n",
                &format!("[images]\npull_layers = \"{pull_layers}\"\n"),
                1,
            );
            assert_ne!(
                edited, config,
                "the test bed template has an [images] table"
            );
            edited
        })
    }

    /// Starts remora on the test bed with `certs` as its hosts.toml directory and its config
    /// text passed through `edit`.
    pub fn start_with_certs_edited(certs: &Path, edit: impl FnOnce(String) -> String) -> Self {
        Self::start_configured(certs, None, "", edit)
    }

    /// Starts remora on the test bed with its pod network and its config passed through
    /// `edit` (the rendered test bed template) first.
    pub fn start_with_network_edited(edit: impl FnOnce(String) -> String) -> Self {
        Self::start_configured(
            Path::new(TESTBED_CERTS),
            Some(Path::new(TESTBED_CNI)),
            "",
            edit,
        )
    }

    /// remora's root dir (the CNI cache).
    pub fn root_dir(&self) -> PathBuf {
        self._dir.path().join("root")
    }

    fn start_with_extra(certs: &Path, cni: Option<&Path>, extra: &str) -> Self {
        Self::start_configured(certs, cni, extra, |config| config)
    }

    fn start_configured(
        certs: &Path,
        cni: Option<&Path>,
        extra: &str,
        edit: impl FnOnce(String) -> String,
    ) -> Self {
        assert!(
            Path::new(TESTBED_CONTAINERD).exists(),
            "the test bed is not up: run scripts/testbed.sh up"
        );
        crate::sweep::sweep_once();
        let dir = scratch();
        let namespace = unique("it");
        let socket = dir.path().join("remora.sock");
        let cni_conf_dir = cni
            .map(Path::to_path_buf)
            .unwrap_or_else(|| dir.path().join("net.d"));
        let path = |p: &Path| p.display().to_string();
        let mut config = testbed_remora_config(&[
            ("SOCKET", &path(&socket)),
            ("ROOT_DIR", &path(&dir.path().join("root"))),
            ("STATE_DIR", &path(&dir.path().join("state"))),
            ("CONTAINERD_SOCK", TESTBED_CONTAINERD),
            ("NAMESPACE", &namespace),
            ("CERTS_DIR", &path(certs)),
            ("CNI_CONF_DIR", &path(&cni_conf_dir)),
            ("CNI_BIN_DIR", "/usr/lib/cni"),
            ("HANDLER", &it_handler()),
            ("RUNC", &path(&pinned_runc())),
        ]);
        // Tests read remora's log; the test bed's own remora logs at the default level.
        config.push_str("\n[log]\nlevel = \"debug\"\n");
        config.push_str(extra);
        let config = edit(config);
        let remora = Remora::start(dir.path(), &config, &socket);
        BedRemora {
            remora,
            namespace,
            config,
            _dir: dir,
        }
    }

    /// Kills remora (SIGKILL, as a crash) and returns once it is gone.
    pub fn crash(&mut self) {
        self.remora.stop_with(Signal::SIGKILL);
    }

    /// Starts remora again with the same config, dirs and namespace.
    pub fn restart(&mut self) {
        self.restart_env(&[]);
    }

    /// Starts remora again (same config, dirs and namespace) with extra environment.
    pub fn restart_env(&mut self, env: &[(&str, &str)]) {
        let socket = self.remora.socket.clone();
        self.remora = Remora::start_env(self._dir.path(), &self.config, &socket, env);
    }

    /// remora's state dir (netns, pod files, FIFOs, intents).
    pub fn state_dir(&self) -> PathBuf {
        self._dir.path().join("state")
    }

    /// Runs `ctr` in this remora's namespace; returns stdout (panics on failure).
    pub fn ctr(&self, args: &[&str]) -> String {
        ctr_in(Path::new(TESTBED_CONTAINERD), &self.namespace, args)
    }

    /// Lines of `ctr <args> -q` (ids only).
    pub fn ctr_ids(&self, args: &[&str]) -> Vec<String> {
        self.ctr(args)
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect()
    }
}

/// How long a [`BedRemora`]'s teardown of its pods may take, in all.
const POD_TEARDOWN_LIMIT: Duration = Duration::from_secs(120);

impl BedRemora {
    /// Stops and removes every pod of this remora through CRI, so that remora runs CNI DEL
    /// (which drops the pod's IP reservation, port mappings and firewall rules) and removes
    /// the pod's netns. A remora the test crashed is started again for it. Bounded by
    /// [`POD_TEARDOWN_LIMIT`]; never panics (it runs in `Drop`, maybe while a test panics).
    fn remove_pods(&mut self) -> Result<usize, String> {
        if !self.remora.is_running() {
            let socket = self.remora.socket.clone();
            self.remora = Remora::try_start_env(self._dir.path(), &self.config, &socket, &[])?;
        }
        let socket = self.remora.socket.clone();
        // A thread with a runtime of its own: Drop may run inside the test's runtime, which
        // cannot block on another.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(remove_all_pods(&socket));
        });
        rx.recv_timeout(POD_TEARDOWN_LIMIT)
            .map_err(|_| format!("pod teardown took more than {POD_TEARDOWN_LIMIT:?}"))?
    }
}

/// Stops and removes every pod sandbox remora at `socket` lists; how many it removed.
fn remove_all_pods(socket: &Path) -> Result<usize, String> {
    use remora::cri::v1 as cri;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    rt.block_on(async {
        let call = Duration::from_secs(30);
        let mut client =
            RuntimeServiceClient::new(remora::grpc::unix_channel(socket, Duration::from_secs(5)));
        let pods = tokio::time::timeout(
            call,
            client.list_pod_sandbox(cri::ListPodSandboxRequest::default()),
        )
        .await
        .map_err(|_| "ListPodSandbox timed out".to_string())?
        .map_err(|e| format!("ListPodSandbox: {e}"))?
        .into_inner()
        .items;
        let mut failed = Vec::new();
        for pod in &pods {
            let id = pod.id.clone();
            let stop = tokio::time::timeout(
                call,
                client.stop_pod_sandbox(cri::StopPodSandboxRequest {
                    pod_sandbox_id: id.clone(),
                }),
            );
            if let Err(e) = stop
                .await
                .map_err(|_| "timed out".to_string())
                .and_then(|r| r.map_err(|e| e.to_string()))
            {
                failed.push(format!("StopPodSandbox {id}: {e}"));
            }
            let remove = tokio::time::timeout(
                call,
                client.remove_pod_sandbox(cri::RemovePodSandboxRequest {
                    pod_sandbox_id: id.clone(),
                }),
            );
            if let Err(e) = remove
                .await
                .map_err(|_| "timed out".to_string())
                .and_then(|r| r.map_err(|e| e.to_string()))
            {
                failed.push(format!("RemovePodSandbox {id}: {e}"));
            }
        }
        if failed.is_empty() {
            Ok(pods.len())
        } else {
            Err(failed.join("; "))
        }
    })
}

impl Drop for BedRemora {
    fn drop(&mut self) {
        // Pods first, through remora, so that nothing of their network outlives the test
        // (a leftover port mapping would send the next run's traffic to a dead pod).
        if let Err(e) = self.remove_pods() {
            eprintln!(
                "teardown of test namespace {}: {e} (the next run's sweep removes what is left)",
                self.namespace
            );
        }
        if self.remora.is_running() {
            self.remora.stop_with(Signal::SIGKILL);
        }
        unmount_below(self._dir.path());
        // Whatever CRI could not remove (tasks, containers), then images, leases, namespace;
        // and the network of a pod CRI could not remove.
        match crate::sweep::purge_namespace(&self.namespace) {
            Ok(ids) if !ids.is_empty() => {
                for line in crate::sweep::release_networks_of(&ids) {
                    eprintln!("teardown of test namespace {}: {line}", self.namespace);
                }
            }
            Ok(_) => {}
            Err(e) => eprintln!("teardown of test namespace {}: {e}", self.namespace),
        }
    }
}

/// An image pushed to the test bed registry by a test: unique content, so nothing of it is
/// in containerd before the test pulls it.
pub struct PushedImage {
    /// Public-style reference (`registry.k8s.io/<repo>:<tag>`), served via hosts.toml.
    pub reference: String,
    /// Repository path in the registry.
    pub repository: String,
    /// Layer blob digests.
    pub layers: Vec<String>,
    /// Config blob digest (the image id).
    pub config: String,
    /// Manifest digest.
    pub manifest: String,
}

fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(data))
}

/// Pushes an image with `layers` uncompressed tar layers of `layer_bytes` random-ish bytes
/// each to the test bed registry under a unique repository.
pub async fn push_image(layers: usize, layer_bytes: usize) -> PushedImage {
    push_image_with(layers, layer_bytes, 0, None).await
}

/// [`push_image`], with the config padded by about `history_bytes` of build history, and its
/// descriptor in the manifest stating `config_size` instead of its real size if given.
pub async fn push_image_with(
    layers: usize,
    layer_bytes: usize,
    history_bytes: usize,
    config_size: Option<u64>,
) -> PushedImage {
    let repository = format!("remora-it/{}", unique("img"));
    let http = reqwest::Client::new();
    let base = format!("http://{TESTBED_REGISTRY}/v2/{repository}");
    let seed = unique("seed");
    let mut layer_descs = Vec::new();
    let mut diff_ids = Vec::new();
    for i in 0..layers {
        // Deterministic per (seed, i), different from every other test image.
        let mut content = Vec::with_capacity(layer_bytes);
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ (i as u64) ^ seed.len() as u64;
        for b in seed.bytes() {
            x = x.wrapping_mul(31).wrapping_add(u64::from(b));
        }
        while content.len() < layer_bytes {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            content.extend_from_slice(&x.to_le_bytes());
        }
        content.truncate(layer_bytes);
        let mut builder = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_size(content.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(0);
        header.set_cksum();
        builder
            .append_data(
                &mut header,
                format!("data/layer{i}.bin"),
                content.as_slice(),
            )
            .expect("tar layer");
        let blob = builder.into_inner().expect("finish tar");
        let digest = format!("sha256:{}", sha256_hex(&blob));
        upload_blob(&http, &base, &digest, blob.clone()).await;
        diff_ids.push(digest.clone());
        layer_descs.push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": digest,
            "size": blob.len(),
        }));
    }
    // Build history entries of 64 KiB of text each (hex of xorshift output).
    let mut history = Vec::new();
    let mut x: u64 = 0x2545_F491_4F6C_DD1D ^ seed.len() as u64;
    let mut left = history_bytes;
    while left > 0 {
        let n = left.min(64 << 10);
        let mut raw = Vec::with_capacity(n / 2 + 8);
        while raw.len() * 2 < n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            raw.extend_from_slice(&x.to_le_bytes());
        }
        let mut text = hex::encode(raw);
        text.truncate(n);
        history.push(serde_json::json!({"created_by": text}));
        left -= n;
    }
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"User": "1234:5678", "Cmd": ["/bin/true"], "Labels": {"seed": seed}},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": history,
    })
    .to_string()
    .into_bytes();
    let config_len = config.len() as u64;
    let config_digest = format!("sha256:{}", sha256_hex(&config));
    upload_blob(&http, &base, &config_digest, config.clone()).await;
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": config_size.unwrap_or(config_len),
        },
        "layers": layer_descs,
    })
    .to_string()
    .into_bytes();
    let manifest_digest = format!("sha256:{}", sha256_hex(&manifest));
    let resp = http
        .put(format!("{base}/manifests/v1"))
        .header("Content-Type", "application/vnd.oci.image.manifest.v1+json")
        .body(manifest)
        .send()
        .await
        .expect("put manifest");
    assert!(
        resp.status().is_success(),
        "put manifest: {}",
        resp.status()
    );
    PushedImage {
        reference: format!("registry.k8s.io/{repository}:v1"),
        repository,
        layers: layer_descs
            .iter()
            .map(|d| d["digest"].as_str().unwrap_or_default().to_string())
            .collect(),
        config: config_digest,
        manifest: manifest_digest,
    }
}

async fn upload_blob(http: &reqwest::Client, base: &str, digest: &str, data: Vec<u8>) {
    let resp = http
        .post(format!("{base}/blobs/uploads/"))
        .send()
        .await
        .expect("start upload");
    assert_eq!(resp.status().as_u16(), 202, "start upload");
    let location = resp
        .headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .expect("upload location")
        .to_string();
    let url = if location.starts_with("http") {
        location
    } else {
        format!("http://{TESTBED_REGISTRY}{location}")
    };
    let sep = if url.contains('?') { '&' } else { '?' };
    let resp = http
        .put(format!("{url}{sep}digest={digest}"))
        .header("Content-Type", "application/octet-stream")
        .body(data)
        .send()
        .await
        .expect("finish upload");
    assert!(
        resp.status().is_success(),
        "upload {digest}: {}",
        resp.status()
    );
}

/// Counts the registry's successful GETs of `path_part` (e.g. `/v2/<repo>/blobs/<digest>`)
/// made by remora.
pub fn registry_gets(path_part: &str) -> usize {
    let log = std::fs::read_to_string(TESTBED_REGISTRY_LOG).unwrap_or_default();
    log.lines()
        .filter(|l| {
            // Access-log lines: `... "GET <uri> HTTP/1.1" <status> ...`.
            l.contains(&format!("\"GET {path_part}"))
                && (l.contains("\" 200 ") || l.contains("\" 206 "))
        })
        .count()
}

#[test]
fn the_test_bed_template_renders_to_a_valid_config() {
    let config = testbed_remora_config(&[
        ("SOCKET", "/tmp/rmr/remora.sock"),
        ("ROOT_DIR", "/tmp/rmr/root"),
        ("STATE_DIR", "/tmp/rmr/state"),
        ("CONTAINERD_SOCK", TESTBED_CONTAINERD),
        ("NAMESPACE", "it-1-2-3"),
        ("CERTS_DIR", TESTBED_CERTS),
        ("CNI_CONF_DIR", TESTBED_CNI),
        ("CNI_BIN_DIR", "/usr/lib/cni"),
        ("HANDLER", "remora"),
        ("RUNC", "/var/tmp/remora-tools/bin/runc-pinned"),
    ]);
    let parsed = remora::config::Config::from_toml(&config, "remora-testbed.toml")
        .unwrap_or_else(|e| panic!("{e}\n{config}"));
    assert_eq!(parsed.containerd.namespace, "it-1-2-3");
    assert_eq!(parsed.containerd.address, Path::new(TESTBED_CONTAINERD));
    assert_eq!(parsed.images.config_path, Path::new(TESTBED_CERTS));
    assert_eq!(parsed.cni.conf_dir, Path::new(TESTBED_CNI));
    assert_eq!(parsed.cni.bin_dirs, vec![PathBuf::from("/usr/lib/cni")]);
    assert_eq!(parsed.server.state_dir, Path::new("/tmp/rmr/state"));
    assert_eq!(parsed.runtime.default_handler, "remora");
    for h in ["runc", "remora"] {
        assert_eq!(
            parsed.runtime.handlers[h].binary_name.as_deref(),
            Some("/var/tmp/remora-tools/bin/runc-pinned"),
            "{h}"
        );
    }
    assert_eq!(
        parsed.runtime.handlers["crun"].binary_name.as_deref(),
        Some("crun")
    );
}

#[test]
fn the_test_handler_goes_into_every_extra_config_fragment() {
    let h = it_handler();
    let parse = |extra: &str| {
        let text = remora_config(
            Path::new("/tmp/rmr/remora.sock"),
            Path::new("/tmp/rmr/ctd.sock"),
            Path::new("/tmp/rmr/net.d"),
            extra,
        );
        remora::config::Config::from_toml(&text, "remora_config")
            .unwrap_or_else(|e| panic!("{e}\n{text}"))
    };
    assert_eq!(parse("").runtime.default_handler, h);
    let with_table = parse("[runtime]\ncgroup_driver = \"systemd\"\n");
    assert_eq!(with_table.runtime.default_handler, h);
    assert_eq!(
        with_table.runtime.cgroup_driver,
        remora::config::CgroupDriver::Systemd
    );
    let own = parse("[runtime]\ndefault_handler = \"crun\"\n");
    assert_eq!(own.runtime.default_handler, "crun");
}

/// A hosts.toml directory of a test's own: each (host, server) pair gets `server = …`.
pub fn certs_dir(hosts: &[(&str, &str)]) -> tempfile::TempDir {
    let certs = scratch();
    for (host, server) in hosts {
        let dir = certs.path().join(host);
        std::fs::create_dir_all(&dir).expect("hosts dir");
        std::fs::write(dir.join("hosts.toml"), format!("server = \"{server}\"\n"))
            .expect("hosts.toml");
    }
    certs
}

/// Listens on a loopback port and serves each connection with `handle` on a thread of its own
/// (a current-thread runtime), so the test's blocking calls do not stop it. Returns the
/// address and the thread.
fn serve_on_thread<F, Fut>(handle: F) -> (std::net::SocketAddr, std::thread::JoinHandle<()>)
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    serve_on_thread_at("127.0.0.1", handle)
}

/// [`serve_on_thread`] on loopback address `ip` (`127.0.0.2` plays another host).
pub fn serve_on_thread_at<F, Fut>(
    ip: &str,
    handle: F,
) -> (std::net::SocketAddr, std::thread::JoinHandle<()>)
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let listener = std::net::TcpListener::bind((ip, 0)).expect("bind proxy");
    listener.set_nonblocking(true).expect("nonblocking");
    let addr = listener.local_addr().expect("proxy address");
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("proxy runtime");
        let local = tokio::task::LocalSet::new();
        local.block_on(&rt, async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            while let Ok((client, _)) = listener.accept().await {
                tokio::task::spawn_local(handle(client));
            }
        });
    });
    (addr, thread)
}

/// A TCP proxy on loopback in front of the test bed's registry that forwards each
/// connection's first `limit` bytes from the registry, then holds the connection (reads no
/// more from the registry) until [`HoldingProxy::release`]: a registry that stops sending in
/// the middle of a layer, so a test can act while a download is in flight. Runs on a thread
/// of its own, so the test's blocking calls do not stop it.
pub struct HoldingProxy {
    /// Its address (`127.0.0.1:port`).
    pub addr: std::net::SocketAddr,
    release: tokio::sync::watch::Sender<bool>,
    _thread: std::thread::JoinHandle<()>,
}

impl HoldingProxy {
    /// Starts a proxy to the test bed registry holding each connection after `limit` bytes.
    pub fn start(limit: usize) -> Self {
        let (release, released) = tokio::sync::watch::channel(false);
        let (addr, thread) =
            serve_on_thread(move |client| Self::forward(client, limit, released.clone()));
        HoldingProxy {
            addr,
            release,
            _thread: thread,
        }
    }

    async fn forward(
        client: tokio::net::TcpStream,
        limit: usize,
        mut released: tokio::sync::watch::Receiver<bool>,
    ) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let Ok(upstream) = tokio::net::TcpStream::connect(TESTBED_REGISTRY).await else {
            return;
        };
        let (mut client_rx, mut client_tx) = client.into_split();
        let (mut up_rx, mut up_tx) = upstream.into_split();
        let requests = tokio::spawn(async move {
            let _ = tokio::io::copy(&mut client_rx, &mut up_tx).await;
        });
        let mut sent = 0usize;
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            if sent >= limit && !*released.borrow() && released.wait_for(|r| *r).await.is_err() {
                break;
            }
            let room = if *released.borrow() {
                buf.len()
            } else {
                buf.len().min(limit - sent)
            };
            match up_rx.read(&mut buf[..room]).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if client_tx.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    sent += n;
                }
            }
        }
        requests.abort();
    }

    /// Forwards everything from now on, held connections included.
    pub fn release(&self) {
        let _ = self.release.send(true);
    }
}

/// One request an [`AuthProxy`] received.
#[derive(Debug, Clone)]
pub struct ProxiedRequest {
    /// `GET`, `HEAD`…
    pub method: String,
    /// The request path (`/v2/<repo>/blobs/<digest>`).
    pub path: String,
    /// Its `User-Agent`.
    pub user_agent: String,
    /// Whether it carried the right credentials (else it got a 401 challenge).
    pub authorized: bool,
}

/// A registry that wants Basic authentication: a proxy on loopback in front of the test bed's
/// registry that answers every request without the right `Authorization` header with a
/// `401` Basic challenge, and forwards the others (one request per connection). Records each
/// request. Runs on a thread of its own.
pub struct AuthProxy {
    /// Its address (`127.0.0.1:port`).
    pub addr: std::net::SocketAddr,
    seen: std::sync::Arc<std::sync::Mutex<Vec<ProxiedRequest>>>,
    _thread: std::thread::JoinHandle<()>,
}

impl AuthProxy {
    /// Starts a proxy accepting `user`:`password`.
    pub fn start(user: &str, password: &str) -> Self {
        use base64::Engine as _;
        let expected = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
        );
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = seen.clone();
        let (addr, thread) =
            serve_on_thread(move |client| Self::serve(client, expected.clone(), log.clone()));
        AuthProxy {
            addr,
            seen,
            _thread: thread,
        }
    }

    async fn serve(
        mut client: tokio::net::TcpStream,
        expected: String,
        log: std::sync::Arc<std::sync::Mutex<Vec<ProxiedRequest>>>,
    ) {
        use tokio::io::AsyncWriteExt;
        // The request head (pulls send no bodies).
        let Some(head) = RequestHead::read(&mut client).await else {
            return;
        };
        let (method, path) = (head.method.clone(), head.path.clone());
        let header = |name: &str| head.header(name);
        let authorized = header("Authorization") == expected;
        log.lock().expect("proxy log").push(ProxiedRequest {
            method: method.clone(),
            path: path.clone(),
            user_agent: header("User-Agent"),
            authorized,
        });
        if !authorized {
            let _ = client
                .write_all(
                    b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"remora-it\"\r\n\
                      Docker-Distribution-Api-Version: registry/2.0\r\n\
                      Content-Length: 0\r\nConnection: close\r\n\r\n",
                )
                .await;
            return;
        }
        head.forward_to_bed(&mut client).await;
    }

    /// The requests received so far.
    pub fn requests(&self) -> Vec<ProxiedRequest> {
        self.seen.lock().expect("proxy log").clone()
    }
}

/// The head of an HTTP/1.1 request read by a test server: method, path and headers.
pub struct RequestHead {
    /// The request line's method.
    pub method: String,
    /// The request line's target.
    pub path: String,
    /// Header names and values, trimmed, in order.
    pub headers: Vec<(String, String)>,
}

impl RequestHead {
    /// Reads up to the blank line that ends the head (64 KiB at most); `None` when the client
    /// goes away first or sends more.
    pub async fn read(client: &mut tokio::net::TcpStream) -> Option<Self> {
        use tokio::io::AsyncReadExt;
        let mut head = Vec::new();
        let mut buf = [0u8; 4096];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match client.read(&mut buf).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
            if head.len() > 64 * 1024 {
                return None;
            }
        }
        let text = String::from_utf8_lossy(&head).into_owned();
        let mut lines = text.split("\r\n");
        let mut request_line = lines.next().unwrap_or_default().split_whitespace();
        let method = request_line.next().unwrap_or_default().to_string();
        let path = request_line.next().unwrap_or_default().to_string();
        let headers = lines
            .take_while(|l| !l.is_empty())
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        Some(Self {
            method,
            path,
            headers,
        })
    }

    /// Sends this head to the test bed's registry with `Connection: close` (one request per
    /// connection) and relays both ways until either side closes.
    pub async fn forward_to_bed(&self, client: &mut tokio::net::TcpStream) {
        use tokio::io::AsyncWriteExt;
        let Ok(mut upstream) = tokio::net::TcpStream::connect(TESTBED_REGISTRY).await else {
            return;
        };
        let mut forwarded = format!("{} {} HTTP/1.1\r\n", self.method, self.path);
        for (k, v) in &self.headers {
            if !k.eq_ignore_ascii_case("Connection") {
                forwarded.push_str(&format!("{k}: {v}\r\n"));
            }
        }
        forwarded.push_str("Connection: close\r\n\r\n");
        if upstream.write_all(forwarded.as_bytes()).await.is_err() {
            return;
        }
        let _ = tokio::io::copy_bidirectional(client, &mut upstream).await;
    }

    /// The value of header `name` (any case), or "".
    pub fn header(&self, name: &str) -> String {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    }
}
