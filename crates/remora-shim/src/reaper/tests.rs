use super::*;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use nix::sys::signal::Signal;

fn exit(pid: i32, status: u32) -> Exit {
    Exit {
        pid,
        status,
        at: SystemTime::UNIX_EPOCH + Duration::from_secs(pid as u64),
    }
}

/// The exit delivered to `rx`, if one was sent.
fn got(rx: &mut oneshot::Receiver<Exit>) -> Option<Exit> {
    rx.try_recv().ok()
}

#[test]
fn exit_after_watch_goes_to_the_watch() {
    let mut book = Book::default();
    let t0 = Instant::now();
    let mut rx = book.watch(10, None, t0);
    assert_eq!(got(&mut rx), None, "nothing exited yet");
    book.exited(exit(10, 0), t0);
    assert_eq!(got(&mut rx), Some(exit(10, 0)));
    assert!(book.kept_pids().is_empty(), "a delivered exit is not kept");
}

#[test]
fn early_exit_is_kept_for_the_first_watch_only() {
    let mut book = Book::default();
    let t0 = Instant::now();
    book.exited(exit(11, 3), t0);
    assert_eq!(book.kept_pids(), vec![11]);
    let mut first = book.watch(11, None, t0 + Duration::from_secs(1));
    assert_eq!(got(&mut first), Some(exit(11, 3)));
    // Claimed: a later process with pid 11 must not get it.
    let mut second = book.watch(11, None, t0 + Duration::from_secs(2));
    assert_eq!(got(&mut second), None);
    assert!(book.kept_pids().is_empty());
}

#[test]
fn several_watchers_of_one_pid_all_get_the_exit() {
    let mut book = Book::default();
    let t0 = Instant::now();
    let mut a = book.watch(12, None, t0);
    let mut b = book.watch(12, None, t0);
    let mut other = book.watch(13, None, t0);
    book.exited(exit(12, 137), t0);
    assert_eq!(got(&mut a), Some(exit(12, 137)));
    assert_eq!(got(&mut b), Some(exit(12, 137)));
    assert_eq!(got(&mut other), None, "another pid's watch is untouched");
}

#[test]
fn a_dropped_watch_does_not_swallow_the_exit_of_the_others() {
    let mut book = Book::default();
    let t0 = Instant::now();
    drop(book.watch(14, None, t0));
    let mut kept = book.watch(14, None, t0);
    book.exited(exit(14, 1), t0);
    assert_eq!(got(&mut kept), Some(exit(14, 1)));

    // Only dropped watches: the exit is kept for a later one.
    drop(book.watch(15, None, t0));
    book.exited(exit(15, 2), t0);
    assert_eq!(book.kept_pids(), vec![15]);
}

#[test]
fn exec_exits_and_init_exits_are_told_apart_by_pid() {
    // An exec process and the init of the same container: two pids, two watches.
    let mut book = Book::default();
    let t0 = Instant::now();
    let mut init = book.watch(100, None, t0);
    let mut exec = book.watch(101, None, t0);
    book.exited(exit(101, 3), t0);
    assert_eq!(got(&mut exec), Some(exit(101, 3)));
    assert_eq!(got(&mut init), None);
    book.exited(exit(100, 0), t0);
    assert_eq!(got(&mut init), Some(exit(100, 0)));
}

#[test]
fn a_batch_of_exits_from_one_wake_up_reaches_every_watch() {
    // Coalesced SIGCHLDs: one wake-up reaps several exits, some watched, some early.
    let mut book = Book::default();
    let t0 = Instant::now();
    let mut watched: Vec<_> = (20..25).map(|pid| book.watch(pid, None, t0)).collect();
    for pid in 20..30 {
        book.exited(exit(pid, pid as u32), t0);
    }
    for (pid, rx) in (20..25).zip(watched.iter_mut()) {
        assert_eq!(got(rx), Some(exit(pid, pid as u32)));
    }
    assert_eq!(book.kept_pids(), (25..30).collect::<Vec<_>>());
    for pid in 25..30 {
        let mut rx = book.watch(pid, None, t0);
        assert_eq!(got(&mut rx), Some(exit(pid, pid as u32)));
    }
}

#[test]
fn kept_exits_expire_after_keep_for() {
    let mut book = Book::default();
    let t0 = Instant::now();
    book.exited(exit(30, 0), t0);
    book.exited(exit(31, 0), t0 + Duration::from_secs(30));
    // Exactly KEEP_FOR old: still kept.
    let mut at_limit = book.watch(30, None, t0 + KEEP_FOR);
    assert_eq!(got(&mut at_limit), Some(exit(30, 0)));

    book.exited(exit(32, 0), t0 + KEEP_FOR);
    let late = t0 + Duration::from_secs(30) + KEEP_FOR + Duration::from_millis(1);
    let mut expired = book.watch(31, None, late);
    assert_eq!(
        got(&mut expired),
        None,
        "31 was reaped more than KEEP_FOR ago"
    );
    assert_eq!(book.kept_pids(), vec![32], "younger exits stay");
}

#[test]
fn kept_exits_are_capped_oldest_first() {
    let mut book = Book::default();
    let t0 = Instant::now();
    let total = KEEP_AT_MOST as i32 + 5;
    for pid in 1..=total {
        book.exited(exit(pid, 0), t0);
    }
    let kept = book.kept_pids();
    assert_eq!(kept.len(), KEEP_AT_MOST);
    assert_eq!(kept.first(), Some(&6), "the five oldest were evicted");
    assert_eq!(kept.last(), Some(&total));
    let mut evicted = book.watch(5, None, t0);
    assert_eq!(got(&mut evicted), None);
    let mut newest = book.watch(total, None, t0);
    assert_eq!(got(&mut newest), Some(exit(total, 0)));
}

#[test]
fn a_newer_exit_of_a_reused_pid_replaces_the_kept_one() {
    let mut book = Book::default();
    let t0 = Instant::now();
    book.exited(exit(40, 1), t0);
    let newer = Exit {
        pid: 40,
        status: 2,
        at: SystemTime::UNIX_EPOCH,
    };
    book.exited(newer, t0 + Duration::from_secs(1));
    assert_eq!(book.kept_pids(), vec![40]);
    let mut rx = book.watch(40, None, t0 + Duration::from_secs(1));
    assert_eq!(got(&mut rx), Some(newer));
}

#[test]
fn watch_spawned_ignores_an_exit_reaped_before_the_spawn() {
    let mut book = Book::default();
    let t0 = Instant::now();
    // An earlier process with pid 50 ended and nobody claimed it.
    book.exited(exit(50, 9), t0);
    let spawned_at = t0 + Duration::from_secs(1);
    let mut rx = book.watch(50, Some(spawned_at), spawned_at);
    assert_eq!(got(&mut rx), None, "the kept exit is an earlier process's");
    assert!(book.kept_pids().is_empty(), "and is dropped as stale");
    // The new process's own exit arrives later.
    book.exited(exit(50, 0), spawned_at + Duration::from_secs(1));
    assert_eq!(got(&mut rx), Some(exit(50, 0)));
}

#[test]
fn watch_spawned_takes_an_exit_reaped_after_the_spawn() {
    // A child that exits before spawn returns to the caller: reaped after spawned_at.
    let mut book = Book::default();
    let spawned_at = Instant::now();
    book.exited(exit(51, 4), spawned_at);
    let mut rx = book.watch(51, Some(spawned_at), spawned_at + Duration::from_millis(1));
    assert_eq!(got(&mut rx), Some(exit(51, 4)));
}

#[test]
fn exit_status_is_the_code_or_128_plus_the_signal() {
    let pid = Pid::from_raw(77);
    assert_eq!(exit_of(WaitStatus::Exited(pid, 0)), Some((77, 0)));
    assert_eq!(exit_of(WaitStatus::Exited(pid, 3)), Some((77, 3)));
    assert_eq!(exit_of(WaitStatus::Exited(pid, 255)), Some((77, 255)));
    assert_eq!(
        exit_of(WaitStatus::Signaled(pid, Signal::SIGKILL, false)),
        Some((77, 137))
    );
    assert_eq!(
        exit_of(WaitStatus::Signaled(pid, Signal::SIGTERM, true)),
        Some((77, 143))
    );
    assert_eq!(exit_of(WaitStatus::Stopped(pid, Signal::SIGSTOP)), None);
    assert_eq!(exit_of(WaitStatus::Continued(pid)), None);
}

/// The env var that tells a re-executed test binary to run a child-only test's body.
pub(crate) const CHILD_ENV: &str = "REMORA_SHIM_REAPER_CHILD";

/// Runs the `#[ignore]`d test `name` (its full path, e.g. `reaper::tests::x`) alone in a
/// fresh copy of this test binary with `CHILD_ENV=1` and `env`, and returns its output after
/// asserting it passed and printed `marker` (so that a body skipped by mistake fails).
///
/// The child may be a subreaper and run the real `waitpid(-1)` loop: it is its own process.
pub(crate) fn run_in_child(name: &str, env: &[(&str, &str)], marker: &str) -> String {
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = tempfile::NamedTempFile::new().expect("a temp file for the child's output");
    let mut cmd = Command::new(exe);
    cmd.args([
        name,
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_ENV, "1")
    .stdin(Stdio::null())
    .stdout(out.reopen().expect("reopen the output file"))
    .stderr(out.reopen().expect("reopen the output file"));
    for (key, value) in env {
        cmd.env(key, value);
    }
    let mut child = cmd.spawn().expect("re-execute the test binary");
    // The child bounds its own waits; this deadline only stops a wedged child.
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().expect("poll the child") {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let output = std::fs::read_to_string(out.path()).unwrap_or_default();
    let status = status.unwrap_or_else(|| panic!("{name} did not finish in 120 s:\n{output}"));
    assert!(status.success(), "{name} failed ({status}):\n{output}");
    assert!(
        output.contains(marker),
        "{name} did not run its body:\n{output}"
    );
    output
}

/// Whether this process is a re-executed child meant to run a child-only test.
pub(crate) fn in_child() -> bool {
    std::env::var_os(CHILD_ENV).is_some()
}

#[test]
fn real_loop_reaps_children_and_orphans() {
    run_in_child(
        "reaper::tests::real_loop_child",
        &[],
        "reaper child: all checks passed",
    );
}

/// The body of `real_loop_reaps_children_and_orphans`, run in its own process.
#[tokio::test(flavor = "current_thread")]
#[ignore = "run by real_loop_reaps_children_and_orphans in a child process"]
async fn real_loop_child() {
    if !in_child() {
        // Run directly (`--ignored`) inside the shared binary, it must not become a subreaper.
        return;
    }
    let log = Logger::root(slog::Discard, o!());
    let reaper = Reaper::start(log.clone()).expect("start the reaper");
    assert!(
        matches!(Reaper::start(log), Err(ReapError::AlreadyStarted { .. })),
        "a second loop is refused"
    );
    let limit = Duration::from_secs(20);

    // A child that exits with a code, watched right after spawn.
    let spawned_at = Instant::now();
    let child = Command::new("/bin/sh")
        .args(["-c", "exit 3"])
        .spawn()
        .expect("spawn sh");
    let rx = reaper.watch_spawned(child.id() as i32, spawned_at);
    drop(child);
    let exit = tokio::time::timeout(limit, rx)
        .await
        .expect("exit of sh in time")
        .expect("the reaper runs");
    assert_eq!(exit.status, 3);

    // A child killed by a signal.
    let spawned_at = Instant::now();
    let child = Command::new("/bin/sleep")
        .arg("1000")
        .spawn()
        .expect("spawn sleep");
    let pid = child.id() as i32;
    let rx = reaper.watch_spawned(pid, spawned_at);
    drop(child);
    nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL).expect("kill sleep");
    let exit = tokio::time::timeout(limit, rx)
        .await
        .expect("exit of sleep in time")
        .expect("the reaper runs");
    assert_eq!(exit, Exit { pid, ..exit });
    assert_eq!(exit.status, 137);

    // An exit reaped before anyone watches: kept, then handed to the watch.
    let child = Command::new("/bin/sh")
        .args(["-c", "exit 5"])
        .spawn()
        .expect("spawn sh");
    let pid = child.id() as i32;
    drop(child);
    let deadline = Instant::now() + limit;
    while !reaper.book().kept_pids().contains(&pid) {
        assert!(Instant::now() < deadline, "pid {pid} was never reaped");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let exit = reaper.watch(pid).await.expect("the kept exit");
    assert_eq!((exit.pid, exit.status), (pid, 5));

    // An orphan: sh starts a grandchild and exits; the grandchild is re-parented to this
    // process (the subreaper), so its exit comes through the loop too.
    let mut child = Command::new("/bin/sh")
        .args(["-c", "/bin/sleep 1000 & echo $!"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn sh");
    let sh = child.id() as i32;
    let sh_exit = reaper.watch(sh);
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped stdout"))
        .read_line(&mut line)
        .expect("read the grandchild's pid");
    drop(child);
    let grandchild: i32 = line.trim().parse().expect("a pid");
    let exit = tokio::time::timeout(limit, sh_exit)
        .await
        .expect("exit of sh in time")
        .expect("the reaper runs");
    assert_eq!(exit.status, 0);
    let rx = reaper.watch(grandchild);
    nix::sys::signal::kill(Pid::from_raw(grandchild), Signal::SIGKILL).expect("kill sleep");
    let exit = tokio::time::timeout(limit, rx)
        .await
        .expect("exit of the orphan in time")
        .expect("the reaper runs");
    assert_eq!((exit.pid, exit.status), (grandchild, 137));

    println!("reaper child: all checks passed");
}
