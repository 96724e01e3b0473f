//! CNI plugins a crashed remora left running.
//!
//! A plugin runs in a process group of its own, so it outlives a remora killed in the middle
//! of an ADD: the plugin goes on attaching a pod no remora will hand out. The restarted remora
//! undoes the half-made pod with DEL, and that DEL must come after the ADD's plugins: a DEL
//! run while bridge waits for host-local releases nothing, and the address host-local then
//! allocates stays reserved for good. So the sweep first waits for them, found by the
//! `CNI_CONTAINERID=<pod id>` every plugin gets in its environment (helper plugins such as
//! host-local inherit it), for at most the plugin timeout (the bound the dead remora would
//! have given them), then kills their process groups.
//!
//! # Trust
//!
//! Any local user sets the environment of their own processes, so `CNI_CONTAINERID` alone
//! proves nothing. A process counts as a plugin only if it runs as root (real and effective
//! uid 0: remora runs its plugins as root, and a non-root user cannot make such a process) and
//! its executable (`/proc/<pid>/exe`) is a root-owned file under one of the configured
//! `bin_dirs` (a user may run a plugin binary, but not as root). A group is killed only when
//! its leader (the process whose pid is the group id: remora starts each plugin as the leader
//! of a group of its own) is such a plugin, never a group id ≤ 1 and never remora's own group.
//! Plugins in any other group are waited for, and reported if they stay
//! ([`PluginsLeft`]), not killed.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::{getpgrp, Pid};
use thiserror::Error;
use tokio::time::Instant;

/// How often the processes are looked for again while waiting.
const POLL: Duration = Duration::from_millis(20);

/// How long killed plugins get to disappear.
const KILLED_GRACE: Duration = Duration::from_secs(5);

/// Plugins of a pod that did not go.
#[derive(Debug, Error)]
#[error("CNI plugins of pod {id} are still running (pids {pids:?}) although killed {grace:?} ago")]
pub struct PluginsLeft {
    /// The pod (`CNI_CONTAINERID`).
    pub id: String,
    /// The processes left.
    pub pids: Vec<i32>,
    /// How long they were given after SIGKILL.
    pub grace: Duration,
}

/// What [`await_orphans`] found and did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Orphans {
    /// Plugin processes found running at first.
    pub found: usize,
    /// Process groups killed because the plugins outlasted the limit.
    pub killed: usize,
}

/// A process found by its environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Found {
    pid: i32,
    pgid: i32,
}

/// The process group of `pid`, from `/proc/<pid>/stat` (`pid (comm) state ppid pgrp ...`;
/// `comm` may hold spaces and parentheses, so the fields are counted after the last `)`).
fn pgid_from_stat(stat: &str) -> Option<i32> {
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(2)?.parse().ok()
}

/// Whether a `/proc/<pid>/status` text says real and effective uid 0 (`Uid:` real, effective,
/// saved, filesystem).
fn runs_as_root(status: &str) -> bool {
    status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .map(|uids| {
            let uids: Vec<&str> = uids.split_whitespace().collect();
            uids.len() >= 2 && uids[0] == "0" && uids[1] == "0"
        })
        .unwrap_or(false)
}

/// Whether the process at `proc_dir` (`/proc/<pid>`) is a CNI plugin remora could have
/// started: root, running a root-owned executable under one of `bin_dirs` (canonical paths).
fn is_plugin(proc_dir: &Path, bin_dirs: &[PathBuf]) -> bool {
    let Ok(status) = std::fs::read_to_string(proc_dir.join("status")) else {
        return false;
    };
    if !runs_as_root(&status) {
        return false;
    }
    // The kernel's own path of the executable: canonical, " (deleted)" appended if replaced
    // since (then it is under no bin dir by name, and not trusted).
    let Ok(exe) = std::fs::read_link(proc_dir.join("exe")) else {
        return false;
    };
    if !bin_dirs
        .iter()
        .any(|dir| exe.parent() == Some(dir.as_path()))
    {
        return false;
    }
    // The file the process runs (`exe` followed), whoever may have renamed it since.
    std::fs::metadata(proc_dir.join("exe")).is_ok_and(|meta| meta.uid() == 0)
}

/// The plugin directories as the kernel names executables in them (symlinks resolved);
/// directories that do not exist are left out.
fn canonical_dirs(bin_dirs: &[PathBuf]) -> Vec<PathBuf> {
    bin_dirs
        .iter()
        .filter_map(|dir| std::fs::canonicalize(dir).ok())
        .collect()
}

/// The live plugins (by [`is_plugin`]) under `proc_root` whose environment holds
/// `CNI_CONTAINERID=<id>`. Zombies have no environment left and are not found.
fn scan(proc_root: &Path, id: &str, bin_dirs: &[PathBuf]) -> Vec<Found> {
    let want = format!("CNI_CONTAINERID={id}");
    let Ok(dir) = std::fs::read_dir(proc_root) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        // A process may end between the listing and these reads: then it is not found.
        let Ok(env) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if !env.split(|b| *b == 0).any(|v| v == want.as_bytes()) {
            continue;
        }
        if !is_plugin(&entry.path(), bin_dirs) {
            continue;
        }
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        if let Some(pgid) = pgid_from_stat(&stat) {
            found.push(Found { pid, pgid });
        }
    }
    found
}

async fn scan_now(id: &str, bin_dirs: &[PathBuf]) -> Vec<Found> {
    let id = id.to_string();
    let bin_dirs = bin_dirs.to_vec();
    // A panic in the scan (none is expected) finds nothing, like an unreadable /proc.
    tokio::task::spawn_blocking(move || scan(Path::new("/proc"), &id, &bin_dirs))
        .await
        .unwrap_or_default()
}

/// The process groups of `found` that may be killed: those led by a plugin found (the leader's
/// pid is the group id), never a group id ≤ 1 nor `own` (remora's group).
fn groups_to_kill(found: &[Found], own: i32) -> Vec<i32> {
    let mut groups: Vec<i32> = found
        .iter()
        .map(|f| f.pgid)
        .filter(|&pgid| pgid > 1 && pgid != own)
        .filter(|&pgid| found.iter().any(|leader| leader.pid == pgid))
        .collect();
    groups.sort_unstable();
    groups.dedup();
    groups
}

/// Waits until no plugin (module docs, "Trust") with `CNI_CONTAINERID=<id>` is left; after
/// `limit`, kills the process groups they lead and waits for them to go. `bin_dirs`: the
/// configured CNI plugin directories. Only for ids no call of this process is working on (a
/// crashed remora's): a live ADD's plugins would be killed too.
pub async fn await_orphans(
    id: &str,
    limit: Duration,
    bin_dirs: &[PathBuf],
) -> Result<Orphans, PluginsLeft> {
    let bin_dirs = canonical_dirs(bin_dirs);
    let found = scan_now(id, &bin_dirs).await;
    let mut outcome = Orphans {
        found: found.len(),
        killed: 0,
    };
    let left = until_gone(id, &bin_dirs, found, Instant::now() + limit).await;
    if left.is_empty() {
        return Ok(outcome);
    }
    let groups = groups_to_kill(&left, getpgrp().as_raw());
    for pgid in &groups {
        // ESRCH: the group ended meanwhile, as wanted.
        let _ = killpg(Pid::from_raw(*pgid), Signal::SIGKILL);
    }
    outcome.killed = groups.len();
    let left = until_gone(id, &bin_dirs, left, Instant::now() + KILLED_GRACE).await;
    if left.is_empty() {
        return Ok(outcome);
    }
    Err(PluginsLeft {
        id: id.to_string(),
        pids: left.iter().map(|f| f.pid).collect(),
        grace: KILLED_GRACE,
    })
}

/// Looks for `id`'s processes again every [`POLL`] while some of `left` (the last look's) run
/// and `until` has not passed; returns those still running (none once they are gone).
async fn until_gone(
    id: &str,
    bin_dirs: &[PathBuf],
    mut left: Vec<Found>,
    until: Instant,
) -> Vec<Found> {
    while !left.is_empty() && Instant::now() < until {
        tokio::time::sleep(POLL).await;
        left = scan_now(id, bin_dirs).await;
    }
    left
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::{CommandExt, ExitStatusExt};

    use super::*;

    #[test]
    fn the_process_group_is_read_after_the_command_name() {
        assert_eq!(pgid_from_stat("42 (bridge) S 1 40 40 0 -1"), Some(40));
        assert_eq!(
            pgid_from_stat("42 (odd) name (x)) R 7 99 99 0 -1"),
            Some(99)
        );
        assert_eq!(pgid_from_stat("42 (short) S"), None);
        assert_eq!(pgid_from_stat(""), None);
    }

    /// The directory `sleep` (the tests' "plugin") runs from, as the kernel names it.
    fn sleep_dir() -> Vec<PathBuf> {
        let sleep = std::fs::canonicalize("/usr/bin/sleep").expect("sleep is installed");
        vec![sleep.parent().expect("a directory").to_path_buf()]
    }

    /// Whether `pid` is alive (not gone, not a zombie).
    fn alive(pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| {
                let state = stat[stat.rfind(')')? + 1..].split_whitespace().next()?;
                Some(state != "Z")
            })
            .unwrap_or(false)
    }

    fn unique_id(what: &str) -> String {
        format!("remora-unit-{what}-{}", std::process::id())
    }

    /// A "plugin": `sleep <secs>` in a process group of its own with `CNI_CONTAINERID=<id>`.
    fn plugin(id: &str, secs: &str) -> std::process::Child {
        std::process::Command::new("sleep")
            .arg(secs)
            .env("CNI_CONTAINERID", id)
            .process_group(0)
            .spawn()
            .expect("spawn sleep")
    }

    /// Waits (10 s at most) until `pid` is what a scan reads: `sleep` with `CNI_CONTAINERID=<id>`
    /// in its environment. `spawn` returns once the child's exec has begun, and `/proc/<pid>/exe`
    /// names the new program before the kernel has placed its environment (`begin_new_exec`
    /// comes before `create_elf_tables`): in between `environ` reads empty, and a scan then
    /// finds nothing. Under load that window was hit (`found: 0` where a plugin ran).
    async fn until_scannable(pid: i32, id: &str) {
        let want = format!("CNI_CONTAINERID={id}");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let exe_is_sleep = std::fs::read_link(format!("/proc/{pid}/exe"))
                .is_ok_and(|exe| exe.ends_with("sleep"));
            let env_is_set = std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == want.as_bytes()));
            if exe_is_sleep && env_is_set {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{pid} never ran sleep with {want}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Reaps `child` from another thread, so it leaves no zombie while the scan looks.
    fn reap(mut child: std::process::Child) -> std::thread::JoinHandle<std::process::ExitStatus> {
        std::thread::spawn(move || child.wait().expect("wait"))
    }

    #[tokio::test]
    async fn a_scan_finds_the_process_by_its_environment_only() {
        let id = unique_id("scan");
        let child = plugin(&id, "30");
        let pid = i32::try_from(child.id()).unwrap();
        let waiter = reap(child);
        until_scannable(pid, &id).await;
        let dirs = sleep_dir();
        let found = scan(Path::new("/proc"), &id, &dirs);
        assert_eq!(found, vec![Found { pid, pgid: pid }]);
        assert!(scan(Path::new("/proc"), &format!("{id}-other"), &dirs).is_empty());
        let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
        assert_eq!(waiter.join().unwrap().signal(), Some(9));
    }

    #[tokio::test]
    async fn plugins_that_end_in_time_are_waited_for_not_killed() {
        let id = unique_id("ends");
        let child = plugin(&id, "1");
        let pid = i32::try_from(child.id()).unwrap();
        let waiter = reap(child);
        until_scannable(pid, &id).await;
        let outcome = await_orphans(&id, Duration::from_secs(20), &sleep_dir())
            .await
            .unwrap();
        assert_eq!(
            outcome,
            Orphans {
                found: 1,
                killed: 0
            }
        );
        assert!(waiter.join().unwrap().success(), "it ended on its own");
    }

    #[tokio::test]
    async fn plugins_past_the_limit_are_killed_as_a_group() {
        let id = unique_id("killed");
        let child = plugin(&id, "30");
        let pid = i32::try_from(child.id()).unwrap();
        let waiter = reap(child);
        until_scannable(pid, &id).await;
        let outcome = await_orphans(&id, Duration::from_millis(200), &sleep_dir())
            .await
            .unwrap();
        assert_eq!(
            outcome,
            Orphans {
                found: 1,
                killed: 1
            }
        );
        assert_eq!(waiter.join().unwrap().signal(), Some(9));
    }

    #[tokio::test]
    async fn no_plugin_means_no_wait() {
        let outcome = await_orphans(&unique_id("none"), Duration::from_secs(20), &sleep_dir())
            .await
            .unwrap();
        assert_eq!(outcome, Orphans::default());
    }

    #[tokio::test]
    async fn a_process_outside_bin_dirs_is_left_alone() {
        // Any user can put CNI_CONTAINERID=<a pod> in their own process's environment.
        let id = unique_id("outside");
        let child = plugin(&id, "30");
        let pid = i32::try_from(child.id()).unwrap();
        let waiter = reap(child);
        // Else "not found" could be the exec window, not the trust rule.
        until_scannable(pid, &id).await;
        let elsewhere = tempfile::tempdir().expect("temp dir");
        let outcome = await_orphans(
            &id,
            Duration::from_millis(200),
            &[elsewhere.path().to_path_buf()],
        )
        .await
        .unwrap();
        assert_eq!(outcome, Orphans::default(), "not a plugin: not found");
        assert!(alive(pid), "left alone");
        let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
        assert_eq!(waiter.join().unwrap().signal(), Some(9));
    }

    #[tokio::test]
    async fn a_non_root_process_running_a_plugin_binary_is_left_alone() {
        // A plugin binary is world-executable: a user may run one, but not as root.
        let id = unique_id("nonroot");
        let child = std::process::Command::new("sleep")
            .arg("30")
            .env("CNI_CONTAINERID", &id)
            .uid(65534)
            .gid(65534)
            .process_group(0)
            .spawn()
            .expect("spawn sleep as nobody");
        let pid = i32::try_from(child.id()).unwrap();
        let waiter = reap(child);
        until_scannable(pid, &id).await;
        let outcome = await_orphans(&id, Duration::from_millis(200), &sleep_dir())
            .await
            .unwrap();
        assert_eq!(outcome, Orphans::default(), "not root: not a plugin");
        assert!(alive(pid), "left alone");
        let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
        assert_eq!(waiter.join().unwrap().signal(), Some(9));
    }

    #[tokio::test]
    async fn a_plugin_whose_group_leader_is_no_plugin_is_not_killed() {
        // The group's leader (sh) has no CNI_CONTAINERID: killing the group would kill a
        // process that is not a plugin of this pod.
        use std::io::BufRead;
        let id = unique_id("unled");
        let mut leader = std::process::Command::new("sh")
            .args([
                "-c",
                &format!("env CNI_CONTAINERID={id} sleep 30 & echo $!; wait"),
            ])
            .stdout(std::process::Stdio::piped())
            .process_group(0)
            .spawn()
            .expect("spawn sh");
        let leader_pid = i32::try_from(leader.id()).unwrap();
        let mut line = String::new();
        std::io::BufReader::new(leader.stdout.take().expect("piped"))
            .read_line(&mut line)
            .expect("read the plugin's pid");
        let member: i32 = line.trim().parse().expect("a pid");
        let waiter = reap(leader);
        // `$!` is the forked shell until it has exec'd env and then sleep.
        until_scannable(member, &id).await;
        let err = await_orphans(&id, Duration::from_millis(200), &sleep_dir())
            .await
            .expect_err("found, not killed, still there");
        assert_eq!(err.pids, vec![member]);
        assert!(alive(member) && alive(leader_pid), "neither was killed");
        let _ = killpg(Pid::from_raw(leader_pid), Signal::SIGKILL);
        assert_eq!(waiter.join().unwrap().signal(), Some(9));
    }

    #[test]
    fn only_groups_led_by_a_plugin_are_killed() {
        let found = |pid, pgid| Found { pid, pgid };
        let own = 500;
        let plugins = [
            found(10, 10), // a leader: its group goes
            found(11, 10), // its helper (host-local under bridge): same group
            found(20, 19), // led by 19, which is no plugin
            found(30, 0),  // impossible group ids
            found(1, 1),
            found(own, own), // remora's own group, even if a "plugin" seemed to lead it
            found(40, own),
        ];
        assert_eq!(groups_to_kill(&plugins, own), vec![10]);
    }

    #[test]
    fn root_is_real_and_effective_uid_zero() {
        assert!(runs_as_root(
            "Name:\tbridge\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\n"
        ));
        assert!(
            !runs_as_root("Uid:\t1000\t0\t0\t0\n"),
            "setuid: real uid is the user's"
        );
        assert!(!runs_as_root("Uid:\t0\t1000\t1000\t1000\n"));
        assert!(!runs_as_root("Name:\tx\n"));
        assert!(!runs_as_root(""));
    }
}
