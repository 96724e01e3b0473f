use super::*;

use std::ffi::OsString;
use std::io::{Read, Write};
use std::time::Duration;

use crate::reaper::tests::{in_child, run_in_child};

fn strings(args: Vec<OsString>) -> Vec<String> {
    args.into_iter()
        .map(|arg| arg.into_string().expect("utf-8 argument"))
        .collect()
}

#[test]
fn each_call_builds_its_arguments() {
    let bundle = Path::new("/b");
    let pid_file = Path::new("/b/init.pid");
    let socket = Path::new("/s/pty.sock");
    let process = Path::new("/b/p.json");
    let cases: Vec<(Call<'_>, &[&str])> = vec![
        (
            Call::Create {
                id: "c1",
                bundle,
                pid_file,
                console_socket: None,
                no_pivot: false,
                no_new_keyring: false,
            },
            &[
                "create",
                "--bundle",
                "/b",
                "--pid-file",
                "/b/init.pid",
                "c1",
            ],
        ),
        (
            Call::Create {
                id: "c1",
                bundle,
                pid_file,
                console_socket: Some(socket),
                no_pivot: true,
                no_new_keyring: true,
            },
            &[
                "create",
                "--bundle",
                "/b",
                "--pid-file",
                "/b/init.pid",
                "--console-socket",
                "/s/pty.sock",
                "--no-pivot",
                "--no-new-keyring",
                "c1",
            ],
        ),
        (Call::Start { id: "c1" }, &["start", "c1"]),
        (
            Call::Exec {
                id: "c1",
                process_file: process,
                pid_file,
                console_socket: None,
            },
            &[
                "exec",
                "--process",
                "/b/p.json",
                "--detach",
                "--pid-file",
                "/b/init.pid",
                "c1",
            ],
        ),
        (
            Call::Exec {
                id: "c1",
                process_file: process,
                pid_file,
                console_socket: Some(socket),
            },
            &[
                "exec",
                "--process",
                "/b/p.json",
                "--detach",
                "--pid-file",
                "/b/init.pid",
                "--console-socket",
                "/s/pty.sock",
                "c1",
            ],
        ),
        (
            Call::Kill {
                id: "c1",
                signal: 15,
                all: false,
            },
            &["kill", "c1", "15"],
        ),
        (
            Call::Kill {
                id: "c1",
                signal: 9,
                all: true,
            },
            &["kill", "--all", "c1", "9"],
        ),
        (
            Call::Delete {
                id: "c1",
                force: false,
            },
            &["delete", "c1"],
        ),
        (
            Call::Delete {
                id: "c1",
                force: true,
            },
            &["delete", "--force", "c1"],
        ),
        (Call::State { id: "c1" }, &["state", "c1"]),
        (Call::Ps { id: "c1" }, &["ps", "--format", "json", "c1"]),
        (Call::Pause { id: "c1" }, &["pause", "c1"]),
        (Call::Resume { id: "c1" }, &["resume", "c1"]),
        (
            Call::Update { id: "c1" },
            &["update", "--resources", "-", "c1"],
        ),
        (Call::Features, &["features"]),
    ];
    for (call, want) in cases {
        assert_eq!(strings(call.args()), want, "{call:?}");
    }
}

#[test]
fn global_flags_come_first() {
    let call = Call::Start { id: "c1" };
    let root = Path::new("/run/remora/runc");
    assert_eq!(
        strings(argv(root, false, None, &call)),
        ["--root", "/run/remora/runc", "start", "c1"]
    );
    assert_eq!(
        strings(argv(root, true, Some(Path::new("/b/log.json")), &call)),
        [
            "--root",
            "/run/remora/runc",
            "--log",
            "/b/log.json",
            "--log-format",
            "json",
            "--systemd-cgroup",
            "start",
            "c1"
        ]
    );
}

#[test]
fn calls_know_their_id_and_bundle() {
    let create = Call::Create {
        id: "c1",
        bundle: Path::new("/b"),
        pid_file: Path::new("/p"),
        console_socket: None,
        no_pivot: false,
        no_new_keyring: false,
    };
    assert_eq!(create.id(), "c1");
    assert_eq!(create.bundle(), Some(Path::new("/b")));
    assert!(!create.on_existing_container());
    assert_eq!(Call::Features.id(), "");
    assert!(!Call::Features.on_existing_container());
    let kill = Call::Kill {
        id: "c2",
        signal: 9,
        all: false,
    };
    assert_eq!((kill.id(), kill.bundle()), ("c2", None));
    assert!(kill.on_existing_container());
}

#[test]
fn the_last_error_line_of_the_log_is_the_message() {
    let log = concat!(
        r#"{"level":"warning","msg":"a warning","time":"2026-12-01T06:31:34Z"}"#,
        "\n",
        r#"{"level":"error","msg":"first error","time":"2026-12-01T06:31:34Z"}"#,
        "\n",
        "not json at all\n",
        r#"{"level":"error","msg":"exec failed: container does not exist ","time":"x"}"#,
        "\n",
        r#"{"level":"info","msg":"after","time":"x"}"#,
        "\n",
    );
    assert_eq!(
        last_log_error(log).as_deref(),
        Some("exec failed: container does not exist")
    );
    assert_eq!(
        last_log_error(r#"{"level":"warning","msg":"only a warning"}"#),
        None
    );
    assert_eq!(last_log_error(""), None);
    assert_eq!(last_log_error(r#"{"level":"error","msg":"  "}"#), None);
}

#[test]
fn stderr_gives_the_logrus_message_or_its_text() {
    let logrus = concat!(
        "time=\"2026-12-01T06:31:34Z\" level=warning msg=\"ignored\"\n",
        "time=\"2026-12-01T06:31:34Z\" level=error msg=\"container \\\"c1\\\" does not exist\"\n",
    );
    assert_eq!(
        stderr_message(logrus).as_deref(),
        Some("container \"c1\" does not exist")
    );
    assert_eq!(
        stderr_message("level=error msg=bare-word\n").as_deref(),
        Some("bare-word")
    );
    assert_eq!(
        stderr_message("  container does not exist\n").as_deref(),
        Some("container does not exist")
    );
    assert_eq!(
        stderr_message("crun: error opening file `/run/crun/c1/status`\n").as_deref(),
        Some("crun: error opening file `/run/crun/c1/status`")
    );
    assert_eq!(stderr_message(" \n"), None);
}

#[test]
fn not_found_is_told_by_the_message() {
    for message in [
        "container does not exist",
        "exec failed: container does not exist",
        "container `c1` does not exist",
        "Container not found",
    ] {
        assert!(is_not_found(message), "{message}");
    }
    for message in [
        "rootfs (\"/b/rootfs\") does not exist",
        "exec failed: unable to start container process: exec: \"x\": executable file not found in $PATH",
        "container is not running",
        "",
    ] {
        assert!(!is_not_found(message), "{message}");
    }
}

#[test]
fn not_running_is_told_by_the_runtimes_message() {
    let failed = |message: &str| RuncError::Failed {
        command: "runc kill".into(),
        id: "c1".into(),
        status: 1,
        message: message.into(),
    };
    assert!(failed("container not running").is_not_running());
    assert!(failed("process already finished").is_not_running());
    assert!(!failed("permission denied").is_not_running());
    let not_found = RuncError::NotFound {
        command: "runc kill".into(),
        id: "c1".into(),
    };
    assert!(!not_found.is_not_running());
}

#[test]
fn pid_files_hold_a_positive_pid() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("init.pid");
    std::fs::write(&path, "4242\n").expect("write");
    assert_eq!(read_pid_file(&path).expect("a pid"), 4242);
    for bad in ["", "abc", "0", "-3", "12 13"] {
        std::fs::write(&path, bad).expect("write");
        assert!(
            matches!(read_pid_file(&path), Err(RuncError::BadPidFile { ref content, .. }) if content == bad),
            "{bad:?}"
        );
    }
    let missing = dir.path().join("missing.pid");
    assert!(matches!(
        read_pid_file(&missing),
        Err(RuncError::PidFile { ref path, .. }) if *path == missing
    ));
}

#[test]
fn the_log_is_read_from_where_the_call_began() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("log.json");
    std::fs::write(&path, "old line\n").expect("write");
    let start = std::fs::metadata(&path).expect("stat").len();
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(b"new line\n"))
        .expect("append");
    assert_eq!(read_log_from(&path, start).as_deref(), Some("new line\n"));
    // Shrunk since (truncated or rotated): all of it is this call's.
    std::fs::write(&path, "x\n").expect("truncate");
    assert_eq!(read_log_from(&path, start).as_deref(), Some("x\n"));
    assert_eq!(read_log_from(&dir.path().join("none"), 0), None);
}

#[test]
fn the_process_file_is_private_and_removed_when_dropped() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("p.json");
    let file = ProcessFile::write(path.clone(), b"{}").expect("write");
    assert_eq!(std::fs::read(&path).expect("read"), b"{}");
    let mode = std::fs::metadata(&path).expect("stat").permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    // An existing file is never overwritten (create_new).
    assert!(matches!(
        ProcessFile::write(path.clone(), b"other"),
        Err(RuncError::ProcessFile { .. })
    ));
    assert_eq!(std::fs::read(&path).expect("read"), b"{}", "left alone");
    drop(file);
    assert!(!path.exists());
}

/// The container test's bundle and root, made (and cleaned up) by the parent test process, so
/// that cleanup runs even if the child dies.
struct Bed {
    dir: tempfile::TempDir,
    id: String,
}

impl Bed {
    fn new() -> Bed {
        let dir = tempfile::tempdir().expect("temp dir");
        let id = format!("remora-runc-test-{}", std::process::id());
        let bundle = dir.path().join("bundle");
        let bin = bundle.join("rootfs/bin");
        std::fs::create_dir_all(&bin).expect("rootfs");
        std::fs::copy("/usr/bin/busybox", bin.join("busybox")).expect("copy busybox");
        for applet in ["sh", "sleep", "echo"] {
            std::os::unix::fs::symlink("busybox", bin.join(applet)).expect("applet link");
        }
        let status = Command::new("/usr/sbin/runc")
            .arg("spec")
            .arg("--bundle")
            .arg(&bundle)
            .status()
            .expect("run runc spec");
        assert!(status.success(), "runc spec: {status}");
        let config_path = bundle.join("config.json");
        let mut config: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&config_path).expect("read config.json"))
                .expect("config.json is JSON");
        config["process"]["terminal"] = false.into();
        config["process"]["args"] = serde_json::json!(["/bin/sleep", "1000"]);
        config["linux"]["cgroupsPath"] = format!("/{id}").into();
        std::fs::write(&config_path, config.to_string()).expect("write config.json");
        std::fs::create_dir(dir.path().join("root")).expect("runc root");
        std::fs::create_dir(dir.path().join("empty-bundle")).expect("empty bundle");
        Bed { dir, id }
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        // Whatever the child left: the container (and its cgroups, which runc removes).
        let _ = Command::new("/usr/sbin/runc")
            .arg("--root")
            .arg(self.dir.path().join("root"))
            .args(["delete", "--force", &self.id])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
        if let Ok(controllers) = std::fs::read_dir("/sys/fs/cgroup") {
            for controller in controllers.flatten() {
                let _ = std::fs::remove_dir(controller.path().join(&self.id));
            }
        }
    }
}

#[test]
fn real_runc_runs_a_container_through_the_reaper() {
    let bed = Bed::new();
    let dir = bed.dir.path().to_str().expect("utf-8 temp dir").to_owned();
    run_in_child(
        "runc::tests::real_runc_child",
        &[
            ("REMORA_RUNC_TEST_DIR", &dir),
            ("REMORA_RUNC_TEST_ID", &bed.id),
        ],
        "runc child: all checks passed",
    );
}

/// Bounds one step of the container test.
async fn within<T>(what: &str, step: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), step)
        .await
        .unwrap_or_else(|_| panic!("{what} took over 30 s"))
}

/// The body of `real_runc_runs_a_container_through_the_reaper`, in its own process (a
/// subreaper running the reaper loop).
#[tokio::test(flavor = "current_thread")]
#[ignore = "run by real_runc_runs_a_container_through_the_reaper in a child process"]
async fn real_runc_child() {
    if !in_child() {
        // Run directly (`--ignored`) inside the shared binary, it must not become a subreaper.
        return;
    }
    let dir = PathBuf::from(std::env::var_os("REMORA_RUNC_TEST_DIR").expect("test dir"));
    let id = std::env::var("REMORA_RUNC_TEST_ID").expect("container id");
    let bundle = dir.join("bundle");
    let log = Logger::root(slog::Discard, slog::o!());
    let reaper = Reaper::start(log.clone()).expect("start the reaper");
    let runc = Runc::new(
        "/usr/sbin/runc".into(),
        dir.join("root"),
        false,
        reaper.clone(),
        log.clone(),
    );

    // A runtime that cannot be started.
    let missing = Runc::new(
        "/nonexistent/runc".into(),
        dir.join("root"),
        false,
        reaper.clone(),
        log,
    );
    let err = within("state", missing.state(&id)).await.unwrap_err();
    assert!(matches!(err, RuncError::Spawn { .. }), "{err}");

    // Unknown container: NotFound, from stderr (no bundle known).
    let err = within("state", runc.state(&id)).await.unwrap_err();
    assert!(matches!(err, RuncError::NotFound { .. }), "{err}");

    // A failed create: runc's own message, from the bundle's log.json.
    let empty = dir.join("empty-bundle");
    let opts = CreateOpts {
        pid_file: dir.join("bad.pid"),
        ..CreateOpts::default()
    };
    let err = within("bad create", runc.create("bad", &empty, opts))
        .await
        .unwrap_err();
    match &err {
        RuncError::Failed {
            command, message, ..
        } => {
            assert_eq!(command, "runc create");
            assert!(message.contains("config.json"), "{err}");
            assert!(
                !message.starts_with('{'),
                "a message, not a log line: {err}"
            );
        }
        other => panic!("expected Failed, got {other}"),
    }
    assert!(empty.join("log.json").exists(), "create logs to the bundle");
    within("delete bad", runc.delete("bad", true))
        .await
        .expect("delete --force of a failed create");

    // create → created.
    let before_create = Instant::now();
    let opts = CreateOpts {
        pid_file: dir.join("init.pid"),
        ..CreateOpts::default()
    };
    let pid = within("create", runc.create(&id, &bundle, opts))
        .await
        .expect("create");
    let init_exit = reaper.watch_spawned(pid as i32, before_create);
    let state = within("state", runc.state(&id)).await.expect("state");
    assert_eq!(
        state,
        State {
            pid,
            status: "created".into()
        }
    );

    // start → running.
    within("start", runc.start(&id)).await.expect("start");
    let state = within("state", runc.state(&id)).await.expect("state");
    assert_eq!(state.status, "running");
    let pids = within("ps", runc.ps(&id)).await.expect("ps");
    assert!(pids.contains(&pid), "ps {pids:?} lists init {pid}");

    // pause / resume.
    within("pause", runc.pause(&id)).await.expect("pause");
    assert_eq!(
        within("state", runc.state(&id))
            .await
            .expect("state")
            .status,
        "paused"
    );
    within("resume", runc.resume(&id)).await.expect("resume");
    assert_eq!(
        within("state", runc.state(&id))
            .await
            .expect("state")
            .status,
        "running"
    );

    // update: a memory limit, on stdin.
    let limit = 64 * 1024 * 1024;
    let resources = serde_json::json!({ "memory": { "limit": limit } }).to_string();
    within("update", runc.update(&id, resources.as_bytes()))
        .await
        .expect("update");
    let cgroup = PathBuf::from("/sys/fs/cgroup/memory")
        .join(&id)
        .join("memory.limit_in_bytes");
    let set = std::fs::read_to_string(&cgroup).expect("read memory.limit_in_bytes");
    assert_eq!(set.trim(), limit.to_string());

    // exec: its stdout through the Stdio given, its exit through the reaper.
    let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC).expect("pipe");
    let process = serde_json::json!({
        "terminal": false,
        "user": { "uid": 0, "gid": 0 },
        "args": ["/bin/sh", "-c", "echo hello; exit 3"],
        "env": ["PATH=/bin"],
        "cwd": "/",
    })
    .to_string();
    let before_exec = Instant::now();
    let opts = ExecOpts {
        pid_file: dir.join("exec.pid"),
        console_socket: None,
        stdio: Stdio {
            stdout: Some(write),
            ..Stdio::default()
        },
    };
    let exec_pid = within("exec", runc.exec(&id, process.as_bytes(), opts))
        .await
        .expect("exec");
    let exit = within(
        "exec exit",
        reaper.watch_spawned(exec_pid as i32, before_exec),
    )
    .await
    .expect("the reaper runs");
    assert_eq!(exit.status, 3);
    let mut out = String::new();
    std::fs::File::from(read)
        .read_to_string(&mut out)
        .expect("read the exec's stdout");
    assert_eq!(out, "hello\n");
    let leftovers: Vec<_> = std::fs::read_dir(&bundle)
        .expect("list the bundle")
        .flatten()
        .filter(|entry| {
            entry
                .file_name()
                .to_string_lossy()
                .starts_with(".exec-process")
        })
        .collect();
    assert!(leftovers.is_empty(), "process files left: {leftovers:?}");

    // A failed exec: runc's message, not NotFound.
    let process = serde_json::json!({
        "terminal": false,
        "user": { "uid": 0, "gid": 0 },
        "args": ["/nonexistent"],
        "cwd": "/",
    })
    .to_string();
    let opts = ExecOpts {
        pid_file: dir.join("bad-exec.pid"),
        ..ExecOpts::default()
    };
    let err = within("bad exec", runc.exec(&id, process.as_bytes(), opts))
        .await
        .unwrap_err();
    match &err {
        RuncError::Failed { message, .. } => {
            assert!(message.contains("/nonexistent"), "{err}");
        }
        other => panic!("expected Failed, got {other}"),
    }

    // kill 9 → the init's exit, 137, through the reaper → stopped → delete.
    within("kill", runc.kill(&id, 9, false))
        .await
        .expect("kill");
    let exit = within("init exit", init_exit)
        .await
        .expect("the reaper runs");
    assert_eq!((exit.pid, exit.status), (pid as i32, 137));
    assert_eq!(
        within("state", runc.state(&id))
            .await
            .expect("state")
            .status,
        "stopped"
    );
    within("delete", runc.delete(&id, false))
        .await
        .expect("delete");
    let err = within("state", runc.state(&id)).await.unwrap_err();
    assert!(matches!(err, RuncError::NotFound { .. }), "{err}");
    let err = within("kill", runc.kill(&id, 9, false)).await.unwrap_err();
    assert!(matches!(err, RuncError::NotFound { .. }), "{err}");

    // features: JSON as is.
    let features = within("features", runc.features()).await.expect("features");
    let features: serde_json::Value = serde_json::from_slice(&features).expect("features is JSON");
    assert!(features.get("ociVersionMin").is_some(), "{features}");

    println!("runc child: all checks passed");
}

/// Writes a fake OCI runtime: a shell script `dir/name` running `body`. Only in the re-executed
/// child, which forks nothing else meanwhile: an executable written while another thread forks
/// can fail to exec (ETXTBSY).
fn fake_runtime(dir: &Path, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("write the fake runtime");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
        .expect("make the fake runtime executable");
    path
}

/// A runtime that hangs: it starts a child (`sleep 1000 &`), writes both pids (`child.pid`,
/// then `runtime.pid`, each renamed into place whole) into `dir`, and becomes `sleep 1000`.
fn hung_runtime(dir: &Path) -> PathBuf {
    let d = dir.display();
    fake_runtime(
        dir,
        "hung-runtime",
        &format!(
            "sleep 1000 </dev/null >/dev/null 2>&1 &\n\
             echo $! > {d}/child.tmp && mv {d}/child.tmp {d}/child.pid\n\
             echo $$ > {d}/runtime.tmp && mv {d}/runtime.tmp {d}/runtime.pid\n\
             exec sleep 1000"
        ),
    )
}

/// The pid in `path`, if the file is there.
fn pid_in(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The process's state letter (`S`, `R`, `Z`…) from `/proc/<pid>/stat`; `None` once reaped.
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .next()?
        .chars()
        .next()
}

/// Waits (10 s at most) until `/proc/<pid>` is gone: the process ended *and* was reaped (a
/// zombie keeps its entry).
async fn until_reaped(pid: u32, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Path::new(&format!("/proc/{pid}")).exists() {
        assert!(
            Instant::now() < deadline,
            "{what} (pid {pid}, state {:?}) still there after 10 s",
            proc_state(pid)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[test]
fn hung_and_abandoned_runtimes_are_killed_and_reaped() {
    run_in_child(
        "runc::tests::fake_runtime_child",
        &[],
        "fake runtime child: all checks passed",
    );
}

/// The body of `hung_and_abandoned_runtimes_are_killed_and_reaped`, in its own process (a
/// subreaper running the reaper loop, as the shim).
#[tokio::test(flavor = "current_thread")]
#[ignore = "run by hung_and_abandoned_runtimes_are_killed_and_reaped in a child process"]
async fn fake_runtime_child() {
    if !in_child() {
        // Run directly (`--ignored`) inside the shared binary, it must not become a subreaper.
        return;
    }
    let log = Logger::root(slog::Discard, slog::o!());
    let reaper = Reaper::start(log.clone()).expect("start the reaper");
    let tmp = tempfile::tempdir().expect("temp dir");
    let runtime = |binary: PathBuf, timeouts: Timeouts| {
        Runc::new(
            binary,
            tmp.path().join("root"),
            false,
            reaper.clone(),
            log.clone(),
        )
        .with_timeouts(timeouts)
    };
    // Long enough for sh to start and write its pids on a loaded node.
    let bound = Duration::from_secs(3);

    // A piped command (`state`) that hangs: Timeout, naming command and container, after the
    // short bound; the runtime and its child are killed and reaped.
    let dir = tmp.path().join("state");
    std::fs::create_dir(&dir).expect("mkdir");
    let runc = runtime(
        hung_runtime(&dir),
        Timeouts {
            long: Duration::from_secs(600),
            short: bound,
        },
    );
    let started = Instant::now();
    let err = within("hung state", runc.state("c1")).await.unwrap_err();
    match &err {
        RuncError::Timeout {
            command, id, after, ..
        } => {
            assert_eq!(
                (command.as_str(), id.as_str()),
                ("hung-runtime state", "c1")
            );
            assert_eq!(*after, bound);
        }
        other => panic!("expected Timeout, got {other}"),
    }
    assert!(started.elapsed() >= bound, "not before its bound");
    let hung = pid_in(&dir.join("runtime.pid")).expect("the runtime wrote its pid");
    let child = pid_in(&dir.join("child.pid")).expect("the runtime wrote its child's pid");
    match err {
        RuncError::Timeout { pid, .. } => assert_eq!(pid, hung),
        _ => unreachable!("matched above"),
    }
    until_reaped(hung, "the timed-out runtime").await;
    until_reaped(child, "the timed-out runtime's child").await;

    // A container-streams command (`create`) that hangs: the long bound applies.
    let dir = tmp.path().join("create");
    std::fs::create_dir(&dir).expect("mkdir");
    let runc = runtime(
        hung_runtime(&dir),
        Timeouts {
            long: bound,
            short: Duration::from_secs(600),
        },
    );
    let opts = CreateOpts {
        pid_file: dir.join("init.pid"),
        ..CreateOpts::default()
    };
    let err = within("hung create", runc.create("c2", &dir, opts))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, RuncError::Timeout { command, id, .. } if command == "hung-runtime create" && id == "c2"),
        "{err}"
    );
    let hung = pid_in(&dir.join("runtime.pid")).expect("the runtime wrote its pid");
    let child = pid_in(&dir.join("child.pid")).expect("the runtime wrote its child's pid");
    until_reaped(hung, "the timed-out create").await;
    until_reaped(child, "the timed-out create's child").await;

    // A call dropped while the runtime runs (a ttrpc deadline): killed and reaped too.
    let dir = tmp.path().join("dropped");
    std::fs::create_dir(&dir).expect("mkdir");
    let runc = runtime(hung_runtime(&dir), Timeouts::default());
    let opts = CreateOpts {
        pid_file: dir.join("init.pid"),
        ..CreateOpts::default()
    };
    // Boxed, so that dropping it drops the call (a pinned local lives to the scope's end).
    let mut call = Box::pin(runc.create("c3", &dir, opts));
    let deadline = Instant::now() + Duration::from_secs(10);
    let (hung, child) = loop {
        tokio::select! {
            result = &mut call => panic!("the hung runtime returned: {result:?}"),
            () = tokio::time::sleep(Duration::from_millis(10)) => {}
        }
        if let Some(hung) = pid_in(&dir.join("runtime.pid")) {
            let child = pid_in(&dir.join("child.pid")).expect("written before runtime.pid");
            break (hung, child);
        }
        assert!(Instant::now() < deadline, "the runtime never wrote its pid");
    };
    assert!(proc_state(hung).is_some(), "running while the call is");
    drop(call);
    until_reaped(hung, "the abandoned runtime").await;
    until_reaped(child, "the abandoned runtime's child").await;

    // A create that succeeds: what the runtime left in its group (an init that did not
    // setsid) is the container's, not the guard's to kill.
    let dir = tmp.path().join("created");
    std::fs::create_dir(&dir).expect("mkdir");
    let runc = runtime(
        fake_runtime(
            &dir,
            "ok-runtime",
            "while [ $# -gt 0 ]; do [ \"$1\" = --pid-file ] && pidfile=$2; shift; done\n\
             sleep 1000 </dev/null >/dev/null 2>&1 &\n\
             echo $! > \"$pidfile\"",
        ),
        Timeouts::default(),
    );
    let opts = CreateOpts {
        pid_file: dir.join("init.pid"),
        ..CreateOpts::default()
    };
    let init = within("create", runc.create("c4", &dir, opts))
        .await
        .expect("create");
    let state = proc_state(init);
    assert!(
        matches!(state, Some(s) if s != 'Z'),
        "the init must live on after create succeeded: {state:?}"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(init as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the fake init");
    until_reaped(init, "the fake init").await;

    println!("fake runtime child: all checks passed");
}

#[test]
fn a_blocking_call_past_its_limit_is_killed_with_its_group_and_reaped() {
    // The `delete` and `-info` actions' runner: no reaper there, it waits for its own child.
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path().display();
    let script = format!(
        "sleep 1000 </dev/null >/dev/null 2>&1 &\n\
         echo $! > {d}/child.tmp && mv {d}/child.tmp {d}/child.pid\n\
         echo $$ > {d}/runtime.tmp && mv {d}/runtime.tmp {d}/runtime.pid\n\
         exec sleep 1000"
    );
    let limit = Duration::from_secs(3);
    let err = run_blocking(
        Path::new("/bin/sh"),
        &["-c".into(), script.into()],
        "state",
        "c1",
        limit,
    )
    .unwrap_err();
    assert!(
        matches!(&err, RuncError::Timeout { command, id, after, .. } if command == "sh state" && id == "c1" && *after == limit),
        "{err}"
    );
    let runtime = pid_in(&dir.path().join("runtime.pid")).expect("it wrote its pid");
    let child = pid_in(&dir.path().join("child.pid")).expect("it wrote its child's pid");
    assert_eq!(
        proc_state(runtime),
        None,
        "killed and reaped before the call returned"
    );
    // Killed with the group; re-parented away from this process, so a zombie until its new
    // parent reaps it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !matches!(proc_state(child), None | Some('Z')) {
        assert!(Instant::now() < deadline, "child {child} still alive");
        std::thread::sleep(Duration::from_millis(10));
    }

    let out = run_blocking(
        Path::new("/bin/sh"),
        &["-c".into(), "echo out; echo err >&2; exit 3".into()],
        "state",
        "",
        limit,
    )
    .expect("runs");
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(
        (&out.stdout[..], &out.stderr[..]),
        (&b"out\n"[..], &b"err\n"[..])
    );
}

/// The OCI runtime runs without systemd's `NOTIFY_SOCKET`: with it, runc binds a relay socket
/// whose path is too long under containerd's state directory and every create fails (seen on
/// the node VM: systemd, remora's shim as the default handler).
#[test]
fn the_runtime_runs_without_systemds_notify_socket() {
    let command = runtime_command(Path::new("/usr/sbin/runc"));
    let envs: Vec<_> = command.get_envs().collect();
    assert!(
        envs.contains(&(std::ffi::OsStr::new("NOTIFY_SOCKET"), None)),
        "{envs:?}"
    );
}
