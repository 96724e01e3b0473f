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

use std::path::Path;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
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

/// The live processes under `proc_root` whose environment holds `CNI_CONTAINERID=<id>`.
/// Zombies have no environment left and are not found.
fn scan(proc_root: &Path, id: &str) -> Vec<Found> {
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
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        if let Some(pgid) = pgid_from_stat(&stat) {
            found.push(Found { pid, pgid });
        }
    }
    found
}

async fn scan_now(id: &str) -> Vec<Found> {
    let id = id.to_string();
    // A panic in the scan (none is expected) finds nothing, like an unreadable /proc.
    tokio::task::spawn_blocking(move || scan(Path::new("/proc"), &id))
        .await
        .unwrap_or_default()
}

/// Waits until no process with `CNI_CONTAINERID=<id>` is left; after `limit`, kills their
/// process groups and waits for them to go. Only for ids no call of this process is working
/// on (a crashed remora's): a live ADD's plugins would be killed too.
pub async fn await_orphans(id: &str, limit: Duration) -> Result<Orphans, PluginsLeft> {
    let found = scan_now(id).await;
    let mut outcome = Orphans {
        found: found.len(),
        killed: 0,
    };
    let left = until_gone(id, found, Instant::now() + limit).await;
    if left.is_empty() {
        return Ok(outcome);
    }
    let mut groups: Vec<i32> = left.iter().map(|f| f.pgid).collect();
    groups.sort_unstable();
    groups.dedup();
    for pgid in &groups {
        // ESRCH: the group ended meanwhile, as wanted.
        let _ = killpg(Pid::from_raw(*pgid), Signal::SIGKILL);
    }
    outcome.killed = groups.len();
    let left = until_gone(id, left, Instant::now() + KILLED_GRACE).await;
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
async fn until_gone(id: &str, mut left: Vec<Found>, until: Instant) -> Vec<Found> {
    while !left.is_empty() && Instant::now() < until {
        tokio::time::sleep(POLL).await;
        left = scan_now(id).await;
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

    /// Reaps `child` from another thread, so it leaves no zombie while the scan looks.
    fn reap(mut child: std::process::Child) -> std::thread::JoinHandle<std::process::ExitStatus> {
        std::thread::spawn(move || child.wait().expect("wait"))
    }

    #[test]
    fn a_scan_finds_the_process_by_its_environment_only() {
        let id = unique_id("scan");
        let child = plugin(&id, "30");
        let pid = i32::try_from(child.id()).unwrap();
        let waiter = reap(child);
        let found = scan(Path::new("/proc"), &id);
        assert_eq!(found, vec![Found { pid, pgid: pid }]);
        assert!(scan(Path::new("/proc"), &format!("{id}-other")).is_empty());
        let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
        assert_eq!(waiter.join().unwrap().signal(), Some(9));
    }

    #[tokio::test]
    async fn plugins_that_end_in_time_are_waited_for_not_killed() {
        let id = unique_id("ends");
        let waiter = reap(plugin(&id, "0.3"));
        let outcome = await_orphans(&id, Duration::from_secs(20)).await.unwrap();
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
        let waiter = reap(plugin(&id, "30"));
        let outcome = await_orphans(&id, Duration::from_millis(200))
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
        let outcome = await_orphans(&unique_id("none"), Duration::from_secs(20))
            .await
            .unwrap();
        assert_eq!(outcome, Orphans::default());
    }
}
