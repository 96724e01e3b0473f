//! Test fixtures over real processes: a private containerd per test (so a test may stop and
//! restart it without disturbing others) and the real `remora` binary.
//!
//! The binaries come from the tools dir that `scripts/setup.sh` fills
//! (`$REMORA_TOOLS_DIR/bin`, default `/var/tmp/remora-tools/bin`). A missing binary fails the
//! test with a message saying to run setup; nothing is skipped silently.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tonic::transport::Channel;

/// Where setup.sh installs containerd, crictl and critest.
pub fn tools_bin() -> PathBuf {
    let dir = std::env::var_os("REMORA_TOOLS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/remora-tools"));
    dir.join("bin")
}

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
fn stop_child(child: &mut Child, sig: Signal) -> std::process::ExitStatus {
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
        let child = Command::new(tool("containerd"))
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

/// A remora config for tests, rendered as TOML.
pub fn remora_config(socket: &Path, containerd: &Path, cni_conf_dir: &Path, extra: &str) -> String {
    format!(
        r#"[server]
socket = "{}"
[log]
level = "debug"
[containerd]
address = "{}"
probe_interval = "200ms"
reconnect_backoff_min = "50ms"
reconnect_backoff_max = "400ms"
[cni]
conf_dir = "{}"
bin_dirs = ["/usr/lib/cni"]
{extra}"#,
        socket.display(),
        containerd.display(),
        cni_conf_dir.display(),
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
        let config_path = dir.join("remora.toml");
        std::fs::write(&config_path, config).expect("write remora config");
        let log = dir.join("remora.log");
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("open remora log");
        let mut child = Command::new(remora_bin())
            .arg("--config")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("dup log"))
            .stderr(out)
            .spawn()
            .expect("spawn remora");
        let start = Instant::now();
        while std::os::unix::net::UnixStream::connect(socket).is_err() {
            if let Some(status) = child.try_wait().expect("wait remora") {
                panic!(
                    "remora exited ({status}) before serving: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "remora did not serve"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Remora {
            socket: socket.to_path_buf(),
            log,
            child: Some(child),
        }
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

impl Bed {
    /// Starts both; `extra` is appended to remora's config.
    pub fn start(extra: &str) -> Self {
        let dir = scratch();
        let containerd = Containerd::start(dir.path());
        let socket = dir.path().join("remora.sock");
        let config = remora_config(
            &socket,
            &containerd.socket(),
            &dir.path().join("net.d"),
            extra,
        );
        let remora = Remora::start(dir.path(), &config, &socket);
        Bed {
            remora,
            containerd,
            dir,
        }
    }
}
