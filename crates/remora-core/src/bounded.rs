//! A command run to its end within a time limit, killed with its whole process group when
//! the limit passes or the caller gives up: the OCI runtime's command line
//! (`remora::oci::cli`), its features probe (`remora::oci::features`) and AppArmor's parser
//! (`remora::lifecycle::apparmor`) run through it. A leaf: it uses nothing of remora's.

use std::process::Output;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// How [`output_within`] failed.
#[derive(Debug, thiserror::Error)]
pub enum Bounded {
    /// The command could not be started or waited for.
    #[error("{0}")]
    Io(#[source] std::io::Error),
    /// It did not end within the limit; its process group was killed.
    #[error("did not end in time")]
    TimedOut,
}

/// Runs `command` (stdin null, stdout and stderr piped) to its end within `limit`, as the
/// leader of a process group of its own. When `limit` passes, or the returned future is dropped
/// first, the whole group is SIGKILLed while the leader is not yet reaped (so its pid, the
/// group id, cannot have been reused), and tokio reaps the leader (`kill_on_drop`).
pub async fn output_within(
    command: &mut tokio::process::Command,
    limit: Duration,
) -> Result<Output, Bounded> {
    let child = command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(Bounded::Io)?;
    let pgid = child.id().and_then(|pid| i32::try_from(pid).ok());
    let wait = child.wait_with_output();
    tokio::pin!(wait);
    // Declared after `wait`, so dropped before it: tokio reaps the child only when `wait`
    // completes or is dropped.
    let mut guard = GroupGuard(pgid);
    match tokio::time::timeout(limit, &mut wait).await {
        Ok(Ok(out)) => {
            // Reaped: its pid is no longer ours to signal.
            guard.0 = None;
            Ok(out)
        }
        Ok(Err(e)) => Err(Bounded::Io(e)),
        Err(_) => Err(Bounded::TimedOut),
    }
}

/// SIGKILLs a process group when dropped, unless disarmed (`None`).
struct GroupGuard(Option<i32>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pgid) = self.0.filter(|&pgid| pgid > 1) {
            // ESRCH: the group is gone already, as wanted.
            let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `pid` is gone or only a zombie (killed; its parent may not have reaped it).
    fn dead(pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| {
                let state = stat[stat.rfind(')')? + 1..].split_whitespace().next()?;
                Some(state == "Z")
            })
            .unwrap_or(true)
    }

    /// Waits (10 s at most) until `pid` is dead.
    async fn until_dead(pid: i32, what: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !dead(pid) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what} (pid {pid}) still alive after 10 s"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A command that hangs after starting a child: `sleep 1000 &`, both pids written to `dir`
    /// (`child.pid`, then `leader.pid`).
    fn hanging(dir: &std::path::Path) -> tokio::process::Command {
        let d = dir.display();
        let mut command = tokio::process::Command::new("sh");
        command.arg("-c").arg(format!(
            "sleep 1000 </dev/null >/dev/null 2>&1 &\n\
             echo $! > {d}/child.tmp && mv {d}/child.tmp {d}/child.pid\n\
             echo $$ > {d}/leader.tmp && mv {d}/leader.tmp {d}/leader.pid\n\
             exec sleep 1000"
        ));
        command
    }

    fn pid_in(path: &std::path::Path) -> Option<i32> {
        std::fs::read_to_string(path).ok()?.trim().parse().ok()
    }

    #[tokio::test]
    async fn a_command_past_its_limit_is_killed_with_its_process_group() {
        let dir = tempfile::tempdir().expect("a temp dir");
        // Long enough for sh to start and write its pids on a loaded node.
        let out = output_within(&mut hanging(dir.path()), Duration::from_secs(3)).await;
        assert!(matches!(out, Err(Bounded::TimedOut)), "{out:?}");
        let leader = pid_in(&dir.path().join("leader.pid")).expect("it wrote its pid");
        let child = pid_in(&dir.path().join("child.pid")).expect("it wrote its child's pid");
        until_dead(leader, "the runtime").await;
        until_dead(child, "what the runtime started").await;
    }

    #[tokio::test]
    async fn a_dropped_command_is_killed_with_its_process_group() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let mut command = hanging(dir.path());
        // Boxed, so that dropping it drops the call (a pinned local lives to the scope's end).
        let mut call = Box::pin(output_within(&mut command, Duration::from_secs(600)));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let (leader, child) = loop {
            tokio::select! {
                out = &mut call => panic!("the hung command returned: {out:?}"),
                () = tokio::time::sleep(Duration::from_millis(10)) => {}
            }
            if let Some(leader) = pid_in(&dir.path().join("leader.pid")) {
                let child = pid_in(&dir.path().join("child.pid")).expect("written first");
                break (leader, child);
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the command never wrote its pid"
            );
        };
        drop(call);
        until_dead(leader, "the runtime").await;
        until_dead(child, "what the runtime started").await;
    }
}
