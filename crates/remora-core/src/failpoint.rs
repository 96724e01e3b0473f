//! Failpoints: test hooks that stop remora at a chosen step, so fault tests are deterministic
//! rather than sleep-and-hope.
//!
//! Off unless the environment variable `REMORA_FAILPOINTS` is set when remora starts (read
//! once). Its value is a `;`-separated list of `name=action[@filter]`:
//! - `kill`: remora sends itself SIGKILL at that step (a crash at the worst moment);
//! - `fail` / `fail(N)`: the step returns an error (every time / the first N times);
//! - `pause(MS)`: the step waits MS milliseconds first (time for a test to stop containerd
//!   under it); entries for one point apply in order, so `p=pause(3000);p=fail` pauses, then
//!   fails.
//!
//! `@filter` limits the point to calls whose context (a pod or container name, an image
//! reference — see each call site) contains `filter`. The points are named in
//! [`POINTS`]; an unknown name in the variable is reported on stderr and ignored.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

/// The environment variable.
pub const ENV: &str = "REMORA_FAILPOINTS";

/// Every failpoint, with where it sits.
pub const POINTS: &[(&str, &str)] = &[
    (
        "sandbox.after_network",
        "RunPodSandbox: netns made, CNI ADD done (the pause container is being made beside)",
    ),
    (
        "sandbox.after_snapshot",
        "RunPodSandbox: rootfs snapshot prepared, no containerd record yet (CNI ADD runs beside)",
    ),
    (
        "sandbox.after_task",
        "RunPodSandbox: CNI ADD done and pause task created, not started",
    ),
    (
        "sandbox.after_record",
        "RunPodSandbox of a pod without a pause container: its record made, not indexed",
    ),
    (
        "container.after_snapshot",
        "CreateContainer: rootfs snapshot prepared, no containerd record yet",
    ),
    (
        "container.after_record",
        "CreateContainer: containerd record made, not indexed",
    ),
    (
        "container.remove_cleanup",
        "RemoveContainer: answered, the containerd objects not yet removed (context: the container's name)",
    ),
    (
        "pull.after_blob",
        "PullImage: a blob written to the content store (kill only)",
    ),
    (
        "pull.transfer_downloading",
        "PullImage (pull_layers = \"transfer\"): containerd reported a blob downloading (kill only)",
    ),
    (
        "exit.handle",
        "recording a container exit (context: the container's name)",
    ),
];

#[derive(Debug)]
enum Action {
    Kill,
    Pause(std::time::Duration),
    /// Fails while the counter is above zero (`u32::MAX`: always).
    Fail(AtomicU32),
}

#[derive(Debug)]
struct Point {
    name: String,
    action: Action,
    filter: Option<String>,
}

fn parse(spec: &str) -> Vec<Point> {
    let mut points = Vec::new();
    for item in spec.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((name, rest)) = item.split_once('=') else {
            eprintln!("{ENV}: ignoring {item:?}: expected name=action");
            continue;
        };
        let (action, filter) = match rest.split_once('@') {
            Some((a, f)) => (a, Some(f.to_string())),
            None => (rest, None),
        };
        let action = match action {
            "kill" => Action::Kill,
            a if a.starts_with("pause(") && a.ends_with(')') => {
                match a["pause(".len()..a.len() - 1].parse::<u64>() {
                    Ok(ms) => Action::Pause(std::time::Duration::from_millis(ms)),
                    Err(_) => {
                        eprintln!("{ENV}: ignoring {item:?}: bad milliseconds");
                        continue;
                    }
                }
            }
            "fail" => Action::Fail(AtomicU32::new(u32::MAX)),
            a if a.starts_with("fail(") && a.ends_with(')') => {
                match a["fail(".len()..a.len() - 1].parse::<u32>() {
                    Ok(n) => Action::Fail(AtomicU32::new(n)),
                    Err(_) => {
                        eprintln!("{ENV}: ignoring {item:?}: bad count");
                        continue;
                    }
                }
            }
            _ => {
                eprintln!(
                    "{ENV}: ignoring {item:?}: unknown action (kill, fail, fail(N), pause(MS))"
                );
                continue;
            }
        };
        if !POINTS.iter().any(|(n, _)| *n == name) {
            eprintln!("{ENV}: ignoring {item:?}: unknown failpoint");
            continue;
        }
        points.push(Point {
            name: name.to_string(),
            action,
            filter,
        });
    }
    points
}

fn points() -> &'static [Point] {
    static POINTS_SET: OnceLock<Vec<Point>> = OnceLock::new();
    POINTS_SET.get_or_init(|| std::env::var(ENV).map(|s| parse(&s)).unwrap_or_default())
}

/// A failpoint set to fail fired (named, so a fault test can tell which).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("failpoint {0} fired")]
pub struct Fired(pub String);

/// Evaluates failpoint `name` for a call with context `context`: `Err` if it is set to fail
/// now; does not return if it is set to kill. A no-op unless [`ENV`] was set.
pub async fn hit(name: &str, context: &str) -> Result<(), Fired> {
    eval(points(), name, context).await
}

async fn eval(points: &[Point], name: &str, context: &str) -> Result<(), Fired> {
    for p in points.iter().filter(|p| p.name == name) {
        if p.filter.as_deref().is_some_and(|f| !context.contains(f)) {
            continue;
        }
        match &p.action {
            Action::Kill => {
                eprintln!("failpoint {name} ({context}): SIGKILL");
                // SIGKILL cannot be caught or ignored: this does not return.
                let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
            }
            Action::Pause(d) => {
                eprintln!("failpoint {name} ({context}): pausing {d:?}");
                tokio::time::sleep(*d).await;
            }
            Action::Fail(left) => {
                let fire = left
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| match n {
                        0 => None,
                        u32::MAX => Some(u32::MAX),
                        n => Some(n - 1),
                    })
                    .is_ok();
                if fire {
                    return Err(Fired(name.to_string()));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn fail_n_fires_n_times_then_passes() {
        let pts = parse("exit.handle=fail(2)");
        assert!(eval(&pts, "exit.handle", "a").await.is_err());
        assert!(eval(&pts, "exit.handle", "b").await.is_err());
        assert!(eval(&pts, "exit.handle", "c").await.is_ok());
        assert!(eval(&pts, "pull.after_blob", "c").await.is_ok());
    }

    #[tokio::test]
    async fn filters_match_the_context_and_fail_alone_is_forever() {
        let pts = parse(" exit.handle=fail@victim ; ");
        assert!(eval(&pts, "exit.handle", "bystander").await.is_ok());
        for _ in 0..5 {
            assert!(eval(&pts, "exit.handle", "the-victim-1").await.is_err());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn pause_then_fail_apply_in_order() {
        let pts = parse("sandbox.after_task=pause(3000);sandbox.after_task=fail(1)");
        let start = tokio::time::Instant::now();
        assert!(eval(&pts, "sandbox.after_task", "p").await.is_err());
        assert_eq!(start.elapsed(), std::time::Duration::from_secs(3));
    }

    #[tokio::test]
    async fn malformed_and_unknown_entries_are_ignored() {
        let pts = parse(
            "nope=kill;exit.handle;exit.handle=explode;exit.handle=fail(x);exit.handle=pause(y)",
        );
        assert!(pts.is_empty(), "{pts:?}");
        assert!(eval(&pts, "exit.handle", "x").await.is_ok());
    }
}
