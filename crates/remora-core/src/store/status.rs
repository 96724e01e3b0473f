//! The container status and its state machine.
//!
//! ```text
//!                  create / load
//!                        │
//!                        ▼
//!                  ┌───────────┐  begin_start    ┌──────────────────────┐
//!                  │  CREATED  ├────────────────►│  CREATED (starting)  │
//!                  │           │◄────────────────┤                      │
//!                  └─────┬─────┘   abort_start   └───┬─────────────┬────┘
//!                        │                           │             │ record_started
//!           record_exit  │         start_failed      │             ▼
//!                        │         (StartError, 128) │       ┌───────────┐
//!                        │         or record_exit    │       │  RUNNING  │
//!                        │         (died before      │       └─────┬─────┘
//!                        │          record_started)  │             │ record_exit
//!                        ▼                           ▼             ▼ (task exit, Stop)
//!                  ┌──────────────────────────────────────────────────┐  record_exit:
//!                  │                      EXITED                      ├─┐ no-op,
//!                  └────────────────────────┬─────────────────────────┘◄┘ AlreadyExited
//!                                           │ begin_removal / delete
//!                                           ▼
//!                                        REMOVED
//!
//!   state lost:  CREATED, RUNNING ──mark_unknown──► UNKNOWN ──record_exit──► EXITED
//!   removal:     from CREATED, EXITED, UNKNOWN; never from RUNNING, never while starting
//!   OOM:         mark_oom in any state; sets reason OOMKilled at (or after) the exit
//! ```
//!
//! Why these rules:
//! - **The first recorded exit wins.** An exit can be reported by the task's `Wait`, by a
//!   `/tasks/exit` event, by `StopContainer` and by the restart reconciliation, in any order and
//!   concurrently; only the first one's exit code and time are kept, later ones are no-ops that
//!   say so ([`ExitOutcome::AlreadyExited`]) so the caller can skip its side effects.
//! - **EXITED is final** (except for removal): an exit is a fact, so a later "state lost" cannot
//!   erase it; `mark_unknown` from EXITED is refused.
//! - **An exit may arrive before `record_started`.** The task can die between `Tasks.Start`
//!   returning and the start being recorded; the exit is recorded and the late
//!   `record_started` fails (`EXITED → RUNNING`), which tells `StartContainer` what happened.
//! - **Starting and removing are exclusive flags**, not states CRI can see: a container being
//!   started cannot be removed, one being removed cannot be started, so a racing
//!   Start/Remove cannot run a container whose record is being deleted (no resurrection).
//! - **Reason**: OOM-marked ⇒ `OOMKilled`, else exit code 0 ⇒ `Completed`, else `Error`. The
//!   OOM mark may arrive after the exit (the `Wait` result and the `/tasks/oom` event race), so
//!   a late mark still sets `OOMKilled` without touching the exit code or time.
//!
//! All transitions are made under the container's own lock ([`super::Container`]), so they are
//! atomic with respect to each other; the rules above live here as plain functions on
//! [`ContainerStatus`] so they can be tested without a store.

use std::fmt;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Reason of a container that exited with code 0 and was not OOM-killed.
pub const REASON_COMPLETED: &str = "Completed";
/// Reason of a container that exited with a non-zero code and was not OOM-killed.
pub const REASON_ERROR: &str = "Error";
/// Reason of a container the kernel's OOM killer hit.
pub const REASON_OOM_KILLED: &str = "OOMKilled";
/// Reason of a container whose start failed (containerd uses the same reason and code).
pub const REASON_START_ERROR: &str = "StartError";
/// Exit code recorded when the start failed, as containerd does.
pub const START_ERROR_EXIT_CODE: i32 = 128;

/// The CRI container state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContainerState {
    /// Created, not started.
    #[default]
    Created,
    /// Its task is running.
    Running,
    /// Its task exited (or never started).
    Exited,
    /// The state could not be determined (e.g. the task was lost across a restart).
    Unknown,
}

impl fmt::Display for ContainerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ContainerState::Created => "CREATED",
            ContainerState::Running => "RUNNING",
            ContainerState::Exited => "EXITED",
            ContainerState::Unknown => "UNKNOWN",
        })
    }
}

/// Where a refused transition wanted to go: a CRI state, or out of the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// To a CRI state.
    State(ContainerState),
    /// Removal from the store.
    Removed,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::State(s) => s.fmt(f),
            Target::Removed => f.write_str("REMOVED"),
        }
    }
}

/// A refused container transition.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TransitionError {
    /// The state machine has no edge from `from` to `to`.
    #[error("container {id}: illegal transition {from} -> {to}")]
    Illegal {
        /// Container id.
        id: String,
        /// Current state.
        from: ContainerState,
        /// Requested state.
        to: Target,
    },
    /// A start is in progress; the container can be neither started again nor removed.
    #[error("container {id} is being started ({to} refused)")]
    Starting {
        /// Container id.
        id: String,
        /// Requested state.
        to: Target,
    },
    /// A removal is in progress; the container can no longer change.
    #[error("container {id} is being removed ({to} refused)")]
    Removing {
        /// Container id.
        id: String,
        /// Requested state.
        to: Target,
    },
}

/// What `record_exit` / `start_failed` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "an AlreadyExited outcome means the caller's exit handling must be skipped"]
pub enum ExitOutcome {
    /// This call recorded the exit.
    Recorded,
    /// An exit was already recorded; nothing changed.
    AlreadyExited,
}

/// What `mark_oom` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OomOutcome {
    /// The container had not exited yet; its exit will carry `OOMKilled`.
    Marked,
    /// The container had already exited; its reason was changed to `OOMKilled`.
    AppliedAfterExit,
    /// The container was already OOM-marked.
    AlreadyMarked,
}

/// The mutable status of a container. Times are nanoseconds since the Unix epoch; 0 = not yet.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ContainerStatus {
    /// CRI state.
    pub state: ContainerState,
    /// Pid of the init process while running; 0 otherwise.
    pub pid: u32,
    /// Creation time.
    pub created_at: i64,
    /// Start time (0 if never started).
    pub started_at: i64,
    /// Exit time (0 if not exited).
    pub finished_at: i64,
    /// Exit code (meaningful when exited).
    pub exit_code: i32,
    /// CamelCase reason for the current state (`Completed`, `Error`, `OOMKilled`, `StartError`).
    pub reason: String,
    /// Human-readable detail for the reason.
    pub message: String,
    /// The OOM killer hit this container (set by `mark_oom`, possibly before the exit).
    pub oom_killed: bool,
    /// The pod's memory cgroup's `oom_kill` count (cgroup v2 counts its descendants' kills)
    /// when the container started; `None` where there was none to read. Under the systemd
    /// driver the container's own scope is gone by the time its exit is handled, and a count
    /// grown past this one is what says an OOM kill happened during its life.
    pub pod_oom_kills_at_start: Option<u64>,
    /// The resources its spec applies, in CRI's form as containerd's `copyResourcesToStatus`
    /// reads them from the OCI spec (what is not set is zero): set at creation, merged with
    /// each UpdateContainerResources, reported in `ContainerStatus.resources`. `None` in
    /// records written before remora kept them (and then not reported).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resources: Option<super::resources::LinuxResources>,
    /// A start is in progress. Volatile: not persisted, a restart ends every start.
    #[serde(skip)]
    pub starting: bool,
    /// A removal is in progress. Volatile: not persisted.
    #[serde(skip)]
    pub removing: bool,
}

impl ContainerStatus {
    /// A freshly created container.
    pub fn created(created_at: i64) -> Self {
        ContainerStatus {
            created_at,
            ..Default::default()
        }
    }

    fn illegal(&self, id: &str, to: Target) -> TransitionError {
        TransitionError::Illegal {
            id: id.to_string(),
            from: self.state,
            to,
        }
    }

    /// Refuses any change while a removal is in progress.
    fn check_not_removing(&self, id: &str, to: Target) -> Result<(), TransitionError> {
        if self.removing {
            return Err(TransitionError::Removing {
                id: id.to_string(),
                to,
            });
        }
        Ok(())
    }

    /// CREATED → CREATED+starting. Only one start at a time, and none during removal.
    /// The caller must end every begun start with `record_started`, `start_failed` or
    /// `abort_start` (or the container stays unremovable); an exit recorded meanwhile does
    /// not end it, so the start path always learns how its start ended.
    pub fn begin_start(&mut self, id: &str) -> Result<(), TransitionError> {
        let to = Target::State(ContainerState::Running);
        self.check_not_removing(id, to)?;
        if self.starting {
            return Err(TransitionError::Starting {
                id: id.to_string(),
                to,
            });
        }
        if self.state != ContainerState::Created {
            return Err(self.illegal(id, to));
        }
        self.starting = true;
        Ok(())
    }

    /// Clears the starting flag after a failed start that left nothing running (the caller
    /// rolled back the task), so the container can be started again or removed.
    pub fn abort_start(&mut self) {
        self.starting = false;
    }

    /// CREATED+starting → RUNNING. Fails with `EXITED → RUNNING` if the exit was recorded
    /// first (the task died before the start was recorded).
    pub fn record_started(
        &mut self,
        id: &str,
        pid: u32,
        started_at: i64,
    ) -> Result<(), TransitionError> {
        let to = Target::State(ContainerState::Running);
        // Whatever happens, this start attempt is over.
        let was_starting = std::mem::replace(&mut self.starting, false);
        if self.state != ContainerState::Created || !was_starting {
            return Err(self.illegal(id, to));
        }
        self.state = ContainerState::Running;
        self.pid = pid;
        self.started_at = started_at;
        Ok(())
    }

    /// CREATED/RUNNING/UNKNOWN → EXITED; EXITED → no-op. Never refused: an exit is a fact,
    /// even during a start (see the module docs) or a removal.
    pub fn record_exit(&mut self, exit_code: i32, finished_at: i64) -> ExitOutcome {
        if self.state == ContainerState::Exited {
            return ExitOutcome::AlreadyExited;
        }
        self.state = ContainerState::Exited;
        self.pid = 0;
        self.exit_code = exit_code;
        self.finished_at = finished_at;
        self.reason = if self.oom_killed {
            REASON_OOM_KILLED
        } else if exit_code == 0 {
            REASON_COMPLETED
        } else {
            REASON_ERROR
        }
        .to_string();
        ExitOutcome::Recorded
    }

    /// CREATED+starting → EXITED with `StartError`, exit code 128 and the error as message.
    /// If the task's exit was recorded first, that exit wins and this is a no-op.
    pub fn start_failed(
        &mut self,
        id: &str,
        message: &str,
        finished_at: i64,
    ) -> Result<ExitOutcome, TransitionError> {
        let was_starting = std::mem::replace(&mut self.starting, false);
        if self.state == ContainerState::Exited {
            return Ok(ExitOutcome::AlreadyExited);
        }
        if self.state != ContainerState::Created || !was_starting {
            return Err(self.illegal(id, Target::State(ContainerState::Exited)));
        }
        self.state = ContainerState::Exited;
        self.pid = 0;
        self.exit_code = START_ERROR_EXIT_CODE;
        self.finished_at = finished_at;
        self.reason = REASON_START_ERROR.to_string();
        self.message = message.to_string();
        Ok(ExitOutcome::Recorded)
    }

    /// Records that the OOM killer hit the container (a `/tasks/oom` event).
    pub fn mark_oom(&mut self) -> OomOutcome {
        if self.oom_killed {
            return OomOutcome::AlreadyMarked;
        }
        self.oom_killed = true;
        if self.state == ContainerState::Exited && self.reason != REASON_START_ERROR {
            self.reason = REASON_OOM_KILLED.to_string();
            return OomOutcome::AppliedAfterExit;
        }
        OomOutcome::Marked
    }

    /// CREATED/RUNNING → UNKNOWN: the state was lost (e.g. the task vanished across a
    /// restart). UNKNOWN → UNKNOWN is a no-op. EXITED is final and refuses.
    pub fn mark_unknown(&mut self, id: &str) -> Result<(), TransitionError> {
        let to = Target::State(ContainerState::Unknown);
        self.check_not_removing(id, to)?;
        match self.state {
            ContainerState::Created | ContainerState::Running | ContainerState::Unknown => {
                self.state = ContainerState::Unknown;
                self.starting = false;
                Ok(())
            }
            ContainerState::Exited => Err(self.illegal(id, to)),
        }
    }

    /// Checks that the container may leave the store: not RUNNING and not being started.
    pub fn check_removable(&self, id: &str) -> Result<(), TransitionError> {
        if self.starting {
            return Err(TransitionError::Starting {
                id: id.to_string(),
                to: Target::Removed,
            });
        }
        if self.state == ContainerState::Running {
            return Err(self.illegal(id, Target::Removed));
        }
        Ok(())
    }

    /// Marks a removal in progress (see [`Self::check_removable`]); a second concurrent
    /// removal is refused with `Removing`.
    pub fn begin_removal(&mut self, id: &str) -> Result<(), TransitionError> {
        self.check_not_removing(id, Target::Removed)?;
        self.check_removable(id)?;
        self.removing = true;
        Ok(())
    }

    /// Clears the removal flag after a failed removal, so it can be retried.
    pub fn abort_removal(&mut self) {
        self.removing = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "c1";

    fn created() -> ContainerStatus {
        ContainerStatus::created(1)
    }

    fn running() -> ContainerStatus {
        let mut s = created();
        s.begin_start(ID).unwrap();
        s.record_started(ID, 42, 2).unwrap();
        s
    }

    fn exited(code: i32) -> ContainerStatus {
        let mut s = running();
        assert_eq!(s.record_exit(code, 3), ExitOutcome::Recorded);
        s
    }

    fn unknown() -> ContainerStatus {
        let mut s = created();
        s.mark_unknown(ID).unwrap();
        s
    }

    fn illegal(from: ContainerState, to: Target) -> TransitionError {
        TransitionError::Illegal {
            id: ID.into(),
            from,
            to,
        }
    }

    const RUNNING: Target = Target::State(ContainerState::Running);

    #[test]
    fn created_start_running_exit() {
        let s = exited(0);
        assert_eq!(s.state, ContainerState::Exited);
        assert_eq!((s.pid, s.started_at, s.finished_at), (0, 2, 3));
        assert_eq!(s.reason, REASON_COMPLETED);
        assert!(!s.starting);
    }

    #[test]
    fn running_records_pid() {
        let s = running();
        assert_eq!((s.state, s.pid), (ContainerState::Running, 42));
    }

    #[test]
    fn nonzero_exit_is_error() {
        let s = exited(137);
        assert_eq!((s.exit_code, s.reason.as_str()), (137, REASON_ERROR));
    }

    #[test]
    fn start_failure_goes_created_to_exited() {
        let mut s = created();
        s.begin_start(ID).unwrap();
        assert_eq!(
            s.start_failed(ID, "exec: not found", 5).unwrap(),
            ExitOutcome::Recorded
        );
        assert_eq!(s.state, ContainerState::Exited);
        assert_eq!(s.exit_code, START_ERROR_EXIT_CODE);
        assert_eq!(s.reason, REASON_START_ERROR);
        assert_eq!(s.message, "exec: not found");
        assert!(!s.starting);
    }

    #[test]
    fn start_failed_without_begin_start_is_illegal() {
        let mut s = created();
        assert_eq!(
            s.start_failed(ID, "x", 5),
            Err(illegal(
                ContainerState::Created,
                Target::State(ContainerState::Exited)
            ))
        );
        let mut s = running();
        assert_eq!(
            s.start_failed(ID, "x", 5),
            Err(illegal(
                ContainerState::Running,
                Target::State(ContainerState::Exited)
            ))
        );
    }

    #[test]
    fn exit_before_record_started_wins() {
        let mut s = created();
        s.begin_start(ID).unwrap();
        assert_eq!(s.record_exit(1, 3), ExitOutcome::Recorded);
        assert_eq!(
            s.record_started(ID, 42, 2),
            Err(illegal(ContainerState::Exited, RUNNING))
        );
        assert_eq!((s.state, s.exit_code), (ContainerState::Exited, 1));
        assert!(!s.starting);
        // A start failure reported afterwards does not overwrite the real exit.
        let mut s2 = created();
        s2.begin_start(ID).unwrap();
        let _ = s2.record_exit(2, 3);
        s2.starting = true;
        assert_eq!(
            s2.start_failed(ID, "x", 9).unwrap(),
            ExitOutcome::AlreadyExited
        );
        assert_eq!((s2.exit_code, s2.finished_at), (2, 3));
    }

    #[test]
    fn second_exit_is_a_noop() {
        let mut s = exited(3);
        assert_eq!(s.record_exit(0, 99), ExitOutcome::AlreadyExited);
        assert_eq!((s.exit_code, s.finished_at), (3, 3));
        assert_eq!(s.reason, REASON_ERROR);
    }

    #[test]
    fn exit_from_created_and_unknown() {
        let mut s = created();
        assert_eq!(s.record_exit(0, 3), ExitOutcome::Recorded);
        assert_eq!(s.state, ContainerState::Exited);
        let mut s = unknown();
        assert_eq!(s.record_exit(255, 3), ExitOutcome::Recorded);
        assert_eq!(s.state, ContainerState::Exited);
    }

    #[test]
    fn oom_before_exit_sets_reason_even_for_code_zero() {
        let mut s = running();
        assert_eq!(s.mark_oom(), OomOutcome::Marked);
        assert_eq!(s.mark_oom(), OomOutcome::AlreadyMarked);
        assert_eq!(s.state, ContainerState::Running);
        let _ = s.record_exit(137, 3);
        assert_eq!(s.reason, REASON_OOM_KILLED);
        let mut s = running();
        s.mark_oom();
        let _ = s.record_exit(0, 3);
        assert_eq!(s.reason, REASON_OOM_KILLED);
    }

    #[test]
    fn oom_after_exit_changes_only_the_reason() {
        let mut s = exited(137);
        assert_eq!(s.mark_oom(), OomOutcome::AppliedAfterExit);
        assert_eq!(s.reason, REASON_OOM_KILLED);
        assert_eq!((s.exit_code, s.finished_at), (137, 3));
    }

    #[test]
    fn illegal_starts() {
        let mut s = running();
        assert_eq!(
            s.begin_start(ID),
            Err(illegal(ContainerState::Running, RUNNING))
        );
        let mut s = exited(0);
        assert_eq!(
            s.begin_start(ID),
            Err(illegal(ContainerState::Exited, RUNNING))
        );
        let mut s = unknown();
        assert_eq!(
            s.begin_start(ID),
            Err(illegal(ContainerState::Unknown, RUNNING))
        );
        let mut s = created();
        s.begin_start(ID).unwrap();
        assert_eq!(
            s.begin_start(ID),
            Err(TransitionError::Starting {
                id: ID.into(),
                to: RUNNING
            })
        );
        // record_started without begin_start.
        let mut s = created();
        assert_eq!(
            s.record_started(ID, 1, 1),
            Err(illegal(ContainerState::Created, RUNNING))
        );
    }

    #[test]
    fn abort_start_allows_retry() {
        let mut s = created();
        s.begin_start(ID).unwrap();
        s.abort_start();
        s.begin_start(ID).unwrap();
        s.record_started(ID, 7, 2).unwrap();
        assert_eq!(s.state, ContainerState::Running);
    }

    #[test]
    fn unknown_transitions() {
        let mut s = running();
        s.mark_unknown(ID).unwrap();
        assert_eq!(s.state, ContainerState::Unknown);
        s.mark_unknown(ID).unwrap();
        let mut s = exited(0);
        assert_eq!(
            s.mark_unknown(ID),
            Err(illegal(
                ContainerState::Exited,
                Target::State(ContainerState::Unknown)
            ))
        );
        // A start in progress ends when the state is lost.
        let mut s = created();
        s.begin_start(ID).unwrap();
        s.mark_unknown(ID).unwrap();
        assert!(!s.starting);
    }

    #[test]
    fn removal_rules() {
        assert_eq!(
            running().begin_removal(ID),
            Err(illegal(ContainerState::Running, Target::Removed))
        );
        let mut s = created();
        s.begin_start(ID).unwrap();
        assert_eq!(
            s.begin_removal(ID),
            Err(TransitionError::Starting {
                id: ID.into(),
                to: Target::Removed
            })
        );
        for mut s in [created(), exited(0), unknown()] {
            s.begin_removal(ID).unwrap();
            assert_eq!(
                s.begin_removal(ID),
                Err(TransitionError::Removing {
                    id: ID.into(),
                    to: Target::Removed
                })
            );
        }
    }

    #[test]
    fn removing_blocks_start_and_unknown_but_not_exit() {
        let mut s = created();
        s.begin_removal(ID).unwrap();
        assert_eq!(
            s.begin_start(ID),
            Err(TransitionError::Removing {
                id: ID.into(),
                to: RUNNING
            })
        );
        assert!(matches!(
            s.mark_unknown(ID),
            Err(TransitionError::Removing { .. })
        ));
        assert_eq!(s.record_exit(0, 1), ExitOutcome::Recorded);
        s.abort_removal();
        assert!(!s.removing);
    }

    #[test]
    fn error_names_states() {
        let e = illegal(ContainerState::Exited, RUNNING);
        assert_eq!(
            e.to_string(),
            "container c1: illegal transition EXITED -> RUNNING"
        );
    }

    #[test]
    fn volatile_flags_are_not_persisted() {
        let mut s = created();
        s.begin_start(ID).unwrap();
        let json = serde_json::to_string(&s).unwrap();
        let back: ContainerStatus = serde_json::from_str(&json).unwrap();
        assert!(!back.starting);
        assert_eq!(back.created_at, 1);
    }
}
