use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::mpsc::unbounded_channel;
use tokio::time::timeout;

use super::*;

const DEADLINE: Duration = Duration::from_secs(30);

fn discard() -> Logger {
    Logger::root(slog::Discard, o!())
}

fn memory_events(oom_kill: u64, max: u64) -> String {
    format!("low 0\nhigh 0\nmax {max}\noom {oom_kill}\noom_kill {oom_kill}\noom_group_kill 0\n")
}

/// Rewrites the file in place (truncate and write, same inode), as the kernel's counters change.
fn rewrite(path: &Path, content: &str) {
    std::fs::write(path, content).unwrap();
}

#[tokio::test]
async fn v2_reports_increases_only_and_ends_when_the_file_goes() {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("memory.events");
    rewrite(&events, &memory_events(0, 0));
    let cgroup = Cgroup::V2(dir.path().to_path_buf());
    let (tx, mut rx) = unbounded_channel();
    let mut watch = OomWatch::start(&cgroup, "ctr1".to_string(), tx, discard()).unwrap();

    // A change that is not a kill (memory.max hits), then a kill.
    rewrite(&events, &memory_events(0, 4));
    rewrite(&events, &memory_events(1, 9));
    let got = timeout(DEADLINE, rx.recv()).await.expect("no OOM report");
    assert_eq!(got.as_deref(), Some("ctr1"));

    // Another change without a kill, then the cgroup goes away.
    rewrite(&events, &memory_events(1, 12));
    std::fs::remove_file(&events).unwrap();
    timeout(DEADLINE, watch.finished())
        .await
        .expect("the watch did not end when memory.events went away");
    assert!(watch.is_finished());
    // The watch handled every change before it ended: none of the others was reported.
    // Nothing more was sent, and the ended watch dropped its sender.
    assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
}

#[tokio::test]
async fn v2_kill_before_start_is_reported_at_once() {
    let dir = tempfile::tempdir().unwrap();
    rewrite(&dir.path().join("memory.events"), &memory_events(2, 0));
    let cgroup = Cgroup::V2(dir.path().to_path_buf());
    let (tx, mut rx) = unbounded_channel();
    let _watch = OomWatch::start(&cgroup, "early".to_string(), tx, discard()).unwrap();
    assert_eq!(rx.try_recv().as_deref(), Ok("early"));
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
}

#[tokio::test]
async fn a_dropped_receiver_ends_the_watch() {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("memory.events");
    rewrite(&events, &memory_events(0, 0));
    let cgroup = Cgroup::V2(dir.path().to_path_buf());
    let (tx, rx) = unbounded_channel();
    let mut watch = OomWatch::start(&cgroup, "ctr3".to_string(), tx, discard()).unwrap();
    drop(rx);
    rewrite(&events, &memory_events(1, 1));
    timeout(DEADLINE, watch.finished())
        .await
        .expect("the watch did not end without a receiver");
}

#[tokio::test]
async fn dropping_the_watch_stops_it() {
    let dir = tempfile::tempdir().unwrap();
    rewrite(&dir.path().join("memory.events"), &memory_events(0, 0));
    let cgroup = Cgroup::V2(dir.path().to_path_buf());
    let (tx, mut rx) = unbounded_channel();
    let watch = OomWatch::start(&cgroup, "ctr4".to_string(), tx, discard()).unwrap();
    drop(watch);
    // The aborted task drops the last sender: the channel closes.
    let got = timeout(DEADLINE, rx.recv())
        .await
        .expect("the task lives on");
    assert_eq!(got, None);
}

#[tokio::test]
async fn start_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, _rx) = unbounded_channel();
    let gone = Cgroup::V2(dir.path().join("gone"));
    let got = OomWatch::start(&gone, "x".to_string(), tx.clone(), discard());
    assert!(matches!(got, Err(OomError::Watch { .. })), "{got:?}");
    let no_memory = Cgroup::V1(BTreeMap::from([(
        "pids".to_string(),
        dir.path().to_path_buf(),
    )]));
    let got = OomWatch::start(&no_memory, "x".to_string(), tx, discard());
    assert!(
        matches!(
            got,
            Err(OomError::Counter {
                source: CgroupError::NoController { .. },
                ..
            })
        ),
        "{got:?}"
    );
}

#[test]
fn start_outside_a_runtime_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    rewrite(&dir.path().join("memory.events"), &memory_events(0, 0));
    let (tx, _rx) = unbounded_channel();
    let got = OomWatch::start(
        &Cgroup::V2(dir.path().to_path_buf()),
        "x".to_string(),
        tx,
        discard(),
    );
    assert!(matches!(got, Err(OomError::NoRuntime { .. })), "{got:?}");
}

/// A v1 memory cgroup made for one test; removed on drop, even when the test fails.
struct CgroupDir(PathBuf);

impl Drop for CgroupDir {
    fn drop(&mut self) {
        if self.0.exists() {
            if let Err(e) = std::fs::remove_dir(&self.0) {
                eprintln!("remove test cgroup {}: {e}", self.0.display());
            }
        }
    }
}

/// A child killed and reaped (its own pid only) on drop if the test did not reap it.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Waits until process `pid` (a child of ours) has exited, through a pidfd: no polling, no
/// waitpid on anything but that child afterwards.
async fn exited(pid: u32) {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    assert!(
        raw >= 0,
        "pidfd_open {pid}: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: the syscall returned a new fd that nothing else owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(raw as i32) };
    // SAFETY: the OwnedFd stays open, unchanged, for as long as the AsyncFd holds it.
    let pidfd = unsafe { AsyncFd::register_with_interest(pidfd, Interest::READABLE) }.unwrap();
    let _ready = pidfd.readable().await.unwrap();
}

/// A real OOM kill on this host's cgroup v1 memory controller: the watch registered on an empty
/// cgroup (as after `runc create`) reports the kill, and ends when the cgroup is removed.
#[tokio::test]
async fn v1_real_oom_kill_is_reported() {
    static N: AtomicUsize = AtomicUsize::new(0);
    let memory_root = Path::new("/sys/fs/cgroup/memory");
    assert!(
        memory_root.join("cgroup.event_control").exists(),
        "this test needs cgroup v1's memory controller at {}",
        memory_root.display()
    );
    let n = N.fetch_add(1, Ordering::SeqCst);
    let dir = CgroupDir(memory_root.join(format!("remora-oomtest-{}-{n}", std::process::id())));
    std::fs::create_dir(&dir.0).unwrap();
    std::fs::write(dir.0.join("memory.limit_in_bytes"), "16777216").unwrap();
    let cgroup = Cgroup::V1(BTreeMap::from([("memory".to_string(), dir.0.clone())]));
    let (tx, mut rx) = unbounded_channel();
    let mut watch = OomWatch::start(&cgroup, "ctr-oom".to_string(), tx, discard()).unwrap();

    // The child joins the cgroup, says so, waits for the go, then allocates 64 MiB.
    let script = format!(
        "echo $$ > {} && echo in && read go && exec /usr/bin/busybox dd if=/dev/zero of=/dev/null bs=64M count=1",
        dir.0.join("cgroup.procs").display()
    );
    let mut child = ChildGuard(
        Command::new("/usr/bin/busybox")
            .args(["sh", "-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let pid = child.0.id();
    let stdout = child.0.stdout.take().unwrap();
    // A blocking read off the runtime; on failure the guard kills the child, which ends it.
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).map(|_| line)
    });
    let line = timeout(DEADLINE, line)
        .await
        .expect("the child did not join its cgroup");
    assert_eq!(line.unwrap().unwrap().trim(), "in");

    match Cgroup::of_pid(pid).unwrap() {
        Cgroup::V1(dirs) => assert_eq!(dirs.get("memory"), Some(&dir.0)),
        other => panic!("not a v1 cgroup: {other:?}"),
    }

    let mut stdin = child.0.stdin.take().unwrap();
    stdin.write_all(b"go\n").unwrap();
    drop(stdin);
    let got = timeout(DEADLINE, rx.recv()).await.expect("no OOM report");
    assert_eq!(got.as_deref(), Some("ctr-oom"));

    timeout(DEADLINE, exited(pid))
        .await
        .expect("the OOM victim did not exit");
    let status = child.0.wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    assert!(cgroup.oom_kills().unwrap() >= 1);
    // One kill, one report: nothing more is queued once the watch has handled its wake-ups
    // (checked after the watch ends below).

    std::fs::remove_dir(&dir.0).unwrap();
    timeout(DEADLINE, watch.finished())
        .await
        .expect("the watch did not end when the cgroup was removed");
    // Nothing more was sent, and the ended watch dropped its sender.
    assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
}
