//! Tests of the launched plugins (`accept.rs` launches, `launch.rs` runs and reaps them), with the test binary as a plugin.

use super::*;

/// The environment variable naming the file [`launched_plugin_child`] records to.
const CHILD_RECORD_ENV: &str = "REMORA_NRI_TEST_RECORD";

/// Not a test of its own: the test binary run as a launched plugin, by a script in a plugin
/// directory ([`self_plugin`]). It serves a fake plugin on NRI's fd 3, registers under
/// another name than its file's, records what it is sent in `$REMORA_NRI_TEST_RECORD` and
/// runs until killed. Run by the test harness (no such variable), it passes at once.
#[test]
fn launched_plugin_child() {
    let Some(record) = std::env::var_os(CHILD_RECORD_ENV) else {
        return;
    };
    assert_eq!(std::env::var("NRI_PLUGIN_SOCKET").as_deref(), Ok("3"));
    let name = format!(
        "{}-{}",
        std::env::var("NRI_PLUGIN_IDX").expect("NRI_PLUGIN_IDX"),
        std::env::var("NRI_PLUGIN_NAME").expect("NRI_PLUGIN_NAME")
    );
    let file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(record)
        .expect("the record file");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        use std::os::fd::FromRawFd as _;
        // SAFETY: fd 3 is the socket the registry passed (NRI_PLUGIN_SOCKET says so) and
        // nothing else in this process owns it.
        let socket = unsafe { std::os::unix::net::UnixStream::from_raw_fd(3) };
        socket.set_nonblocking(true).expect("nonblocking");
        let stream = UnixStream::from_std(socket).expect("a tokio socket");
        let fake = FakePlugin {
            name,
            events: 0,
            answer: Answer::Ok,
            seen: Sink::File(Mutex::new(file)),
        };
        let end = serve_fake(stream, fake).await;
        // Not its file's name: the registry goes by the file.
        register(&end, "99", "impostor")
            .await
            .expect("RegisterPlugin");
        std::future::pending::<()>().await;
    });
}

/// A script `dir/name` that records its pid in `dir/<name>.pid` and runs this test binary
/// as [`launched_plugin_child`], recording to `dir/<name>.record`.
fn self_plugin(dir: &Path, name: &str) {
    let exe = std::env::current_exe().expect("the test binary");
    let script = format!(
        "#!/bin/sh\necho $$ > '{pid}'\n{CHILD_RECORD_ENV}='{record}' exec '{exe}' \
         --exact registry::tests::launched_plugins::launched_plugin_child --quiet\n",
        pid = dir.join(format!("{name}.pid")).display(),
        record = dir.join(format!("{name}.record")).display(),
        exe = exe.display(),
    );
    script_plugin(dir, name, &script);
}

fn script_plugin(dir: &Path, name: &str, script: &str) {
    let path = dir.join(name);
    std::fs::write(&path, script).expect("write the script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

fn read_pid(path: &Path) -> u32 {
    std::fs::read_to_string(path)
        .expect("the pid file")
        .trim()
        .parse()
        .expect("a pid")
}

/// Whether `pid` is gone: no process, not even a zombie waiting to be reaped.
fn reaped(pid: u32) -> bool {
    !Path::new(&format!("/proc/{pid}")).exists()
}

fn launched(h: &Harness) -> Vec<Arc<launch::Process>> {
    lock(&h.registry.launched).clone()
}

#[tokio::test]
async fn a_launched_plugin_registers_under_its_file_name_and_is_killed_and_reaped_on_stop() {
    let mut dir = PathBuf::new();
    let h = launching_harness(|d| {
        dir = d.to_path_buf();
        self_plugin(&d.join("plugins"), "10-self");
        // No 10-self.conf: the name's configuration is used.
        std::fs::write(d.join("conf.d").join("self.conf"), "the config").expect("conf");
    });
    let plugins = dir.join("plugins");
    let mut active = h.registry.watch_plugins();
    timeout(DEADLINE, active.wait_for(|names| *names == ["10-self"]))
        .await
        .expect("the launched plugin registers in time")
        .expect("registry alive");
    timeout(DEADLINE, h.registry.run_pod_sandbox(&pod("p1")))
        .await
        .expect("in time")
        .expect("RunPodSandbox");
    let pid = read_pid(&plugins.join("10-self.pid"));
    assert!(!reaped(pid), "running");

    timeout(DEADLINE, h.registry.stop())
        .await
        .expect("stops in time");
    // stop() returns once the plugin is reaped.
    assert!(reaped(pid), "pid {pid} killed and reaped by stop()");
    assert!(launched(&h).is_empty());
    let record = std::fs::read_to_string(plugins.join("10-self.record")).expect("record");
    let configured = Seen::Configured {
        runtime: "remora".into(),
        request_timeout: 2000,
        config: "the config".into(),
    };
    let synced = Seen::Synced {
        pods: vec![],
        containers: vec![],
        more: false,
    };
    let run = Seen::Event(api::Event::RUN_POD_SANDBOX, "p1".into());
    let want: Vec<String> = [configured, synced, run, Seen::Shutdown]
        .iter()
        .map(|seen| format!("10-self {seen:?}"))
        .collect();
    assert_eq!(record.lines().collect::<Vec<_>>(), want);
}

#[tokio::test]
async fn a_launched_plugin_that_exits_at_once_is_reaped_and_the_registry_goes_on() {
    let mut dir = PathBuf::new();
    let h = launching_harness(|d| {
        dir = d.join("plugins");
        let pid = dir.join("10-quit.pid");
        script_plugin(
            &dir,
            "10-quit",
            &format!("#!/bin/sh\necho $$ > '{}'\nexit 3\n", pid.display()),
        );
    });
    let processes = launched(&h);
    assert_eq!(processes.len(), 1);
    let status = timeout(DEADLINE, processes[0].reaped())
        .await
        .expect("reaped in time")
        .expect("an exit status");
    assert_eq!(status.code(), Some(3));
    assert!(reaped(read_pid(&dir.join("10-quit.pid"))));
    // The registry is fine: an external plugin registers and is called.
    let _end = h.plugin("20", "external", 0, Answer::Ok).await;
    assert_eq!(h.registry.plugins(), ["20-external"]);
    timeout(DEADLINE, h.registry.run_pod_sandbox(&pod("p1")))
        .await
        .expect("in time")
        .expect("RunPodSandbox");
    timeout(DEADLINE, h.registry.stop())
        .await
        .expect("stops in time");
}

#[tokio::test]
async fn a_launched_plugin_that_never_registers_is_killed_and_reaped_after_the_timeout() {
    let mut dir = PathBuf::new();
    let started = Instant::now();
    let h = launching_harness(|d| {
        dir = d.join("plugins");
        let pid = dir.join("10-mute.pid");
        script_plugin(
            &dir,
            "10-mute",
            &format!(
                "#!/bin/sh\necho $$ > '{}'\nexec /bin/sleep 1000\n",
                pid.display()
            ),
        );
    });
    let processes = launched(&h);
    assert_eq!(processes.len(), 1);
    let status = timeout(DEADLINE, processes[0].reaped())
        .await
        .expect("killed in time")
        .expect("an exit status");
    use std::os::unix::process::ExitStatusExt as _;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
    assert!(started.elapsed() >= REGISTRATION_TIMEOUT);
    assert!(reaped(read_pid(&dir.join("10-mute.pid"))));
    assert!(h.registry.plugins().is_empty());
}

/// What a launched script saw: its environment (less the shell's own PWD) and its file
/// descriptors (number → target).
fn what_it_saw(dir: &Path, name: &str) -> (Vec<String>, Vec<(String, String)>) {
    let env = std::fs::read_to_string(dir.join(format!("{name}.env"))).expect("env");
    let mut env: Vec<String> = env
        .lines()
        .filter(|l| !l.starts_with("PWD="))
        .map(String::from)
        .collect();
    env.sort();
    let fds = std::fs::read_to_string(dir.join(format!("{name}.fds"))).expect("fds");
    let mut fds: Vec<(String, String)> = fds
        .lines()
        .filter_map(|l| l.split_once(" -> "))
        .map(|(left, target)| {
            let fd = left.rsplit(' ').next().unwrap_or_default();
            (fd.to_string(), target.to_string())
        })
        .collect();
    fds.sort();
    (env, fds)
}

#[tokio::test]
async fn launched_plugins_get_nris_environment_only_and_their_socket_as_fd_3_only() {
    let mut dir = PathBuf::new();
    let h = launching_harness(|d| {
        dir = d.join("plugins");
        for name in ["10-a", "20-b"] {
            let out = dir.join(name);
            script_plugin(
                &dir,
                name,
                &format!(
                    // The shell's descriptors as they are: listed by a child that
                    // opens its output file itself (a redirection would be the shell's,
                    // and a pipeline's pipe is the shell's too while it sets it up).
                    "#!/bin/sh\n/usr/bin/env > '{out}.env'\n\
                     /usr/bin/find /proc/$$/fd/ -mindepth 1 -fprintf '{out}.fds' '%f -> %l\\n'\n\
                     exit 0\n",
                    out = out.display()
                ),
            );
        }
    });
    let processes = launched(&h);
    assert_eq!(processes.len(), 2);
    for process in &processes {
        let status = timeout(DEADLINE, process.reaped())
            .await
            .expect("reaped in time")
            .expect("an exit status");
        assert!(status.success(), "{status}");
    }
    for (name, idx, base) in [("10-a", "10", "a"), ("20-b", "20", "b")] {
        let (env, fds) = what_it_saw(&dir, name);
        assert_eq!(
            env,
            [
                format!("NRI_PLUGIN_IDX={idx}"),
                format!("NRI_PLUGIN_NAME={base}"),
                "NRI_PLUGIN_SOCKET=3".to_string(),
            ],
            "{name}"
        );
        let sockets: Vec<&str> = fds
            .iter()
            .filter(|(_, target)| target.starts_with("socket:"))
            .map(|(fd, _)| fd.as_str())
            .collect();
        // Its own end as fd 3; not remora's end, nor the other plugin's.
        assert_eq!(sockets, ["3"], "{name}: {fds:?}");
        for fd in ["0", "1", "2"] {
            assert!(
                fds.contains(&(fd.to_string(), "/dev/null".to_string())),
                "{name}: {fds:?}"
            );
        }
        // Nothing else of remora's, nor what the test process inherited: above fd 3 only
        // the shell's own descriptor of its script.
        let script = dir.join(name).display().to_string();
        for (fd, target) in &fds {
            assert!(
                ["0", "1", "2", "3"].contains(&fd.as_str()) || *target == script,
                "{name}: fd {fd} -> {target}: {fds:?}"
            );
        }
    }
    timeout(DEADLINE, h.registry.stop())
        .await
        .expect("stops in time");
}
