//! Rebuilding the pod and container index from containerd (the source of truth) when remora
//! starts, and reconciling it whenever the event stream reconnects.
//!
//! For each sandbox and container record in remora's namespace: decode the metadata from the
//! record's extension, reserve the name, and look at the task — running: re-attach the exit
//! monitor (and, for containers, resume copying output from the FIFOs the shim still holds
//! into the same log file); exited while remora was away: record the real exit status and time
//! from containerd (never a placeholder) and delete the task; gone without a trace: UNKNOWN.
//! Objects already indexed are only reconciled, so running this again is harmless.

use std::sync::Arc;

use slog::{info, warn};

use super::backend::{ContainerRecord, TaskState, TaskStatus};
use super::container_events::EventKind;
use super::journal::Intent;
use super::{creation_lease_id, exit_ns, kill_and_delete, now_ns, ContainerError, Pods, UndoError};
use crate::backend_error::BackendError;
use crate::io::{copy_stream, split_log_path, FifoSet, FifoSpec, LogWriter, StreamKind};
use crate::store::persist::{
    CONTAINER_EXTENSION, KIND_CONTAINER, KIND_SANDBOX, LABEL_CONTAINER_NAME, LABEL_KIND,
    LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_POD_UID, LABEL_SANDBOX_ID, SANDBOX_EXTENSION,
};
use crate::store::{
    container_name_key, decode_extension, Container, ContainerSnapshot, ContainerState,
    ExitOutcome, Sandbox, SandboxMetadata, SandboxStatus,
};

/// Records recovered at once. Each asks containerd for its task's state, which containerd asks
/// the task's shim for: one after another, 1,000 pods took seconds of round trips before remora
/// served again. Bounded, so a restart at any scale keeps a fixed number of calls in flight.
const RECOVERY_CONCURRENCY: usize = 32;

/// The two kinds of records recovery indexes, sandboxes first.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Sandbox,
    Container,
}

/// What a recovery pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Recovered {
    /// Sandboxes newly indexed.
    pub sandboxes: usize,
    /// Containers newly indexed.
    pub containers: usize,
    /// Exits recorded that happened while remora was not watching.
    pub exits: usize,
    /// Records that could not be decoded (left alone).
    pub skipped: usize,
}

impl std::ops::AddAssign for Recovered {
    fn add_assign(&mut self, other: Self) {
        self.sandboxes += other.sandboxes;
        self.containers += other.containers;
        self.exits += other.exits;
        self.skipped += other.skipped;
    }
}

/// Whether the kernel OOM-killed a process of an exited (not yet deleted) container, from
/// the `oom_kill` counters of the memory cgroups (cgroup v1 `memory.oom_control`, v2
/// `memory.events`). The one answer to "was it an OOM?" for an exit nobody saw the event of:
/// [`Pods::oom_killed_in_cgroup_of`] asks it for every exit.
///
/// - The container's own cgroup, `probe.own_dir` (see
///   [`crate::spec::cgroups::container_cgroup_dir`]: `<parent>/<id>` under cgroupfs,
///   `<slice path>/remora-<id>.scope` under systemd), is kept by runc until the task is
///   deleted, and its count is the answer. Without a directory (cgroupfs, no parent) runc
///   nests `<id>` under its caller's cgroup, so the hierarchy is searched for it.
/// - Under systemd the scope is gone by then: systemd stops a scope whose last process
///   exited, taking the counter with it (the same race loses containerd's Go shim its
///   TaskOOM event, containerd#8893). On cgroup v2 the pod's cgroup, which lives on, counts
///   the kills of its descendants: a count grown past the one taken at the container's start
///   (`probe.pod_kills_at_start`) in an exit by SIGKILL (137) is an OOM kill. It may name the
///   wrong container only when another container of the same pod was OOM-killed during this
///   one's life and this one was killed by SIGKILL too. cgroup v1 counts kills per cgroup only,
///   so there the answer stays no.
pub(crate) fn oom_killed_in_cgroup_at(probe: &OomProbe<'_>) -> bool {
    let (root, unified) = memory_hierarchy();
    oom_killed_under(root, unified, probe)
}

/// The memory controller's hierarchy on this host, and whether it is the unified one (v2;
/// a hybrid host's memory controller is v1's: `remora_host::cgroup::Hierarchy`'s rule).
fn memory_hierarchy() -> (&'static std::path::Path, bool) {
    let unified =
        remora_host::cgroup::Hierarchy::of_host() == remora_host::cgroup::Hierarchy::Unified;
    let root = if unified {
        "/sys/fs/cgroup"
    } else {
        "/sys/fs/cgroup/memory"
    };
    (std::path::Path::new(root), unified)
}

/// What [`oom_killed_in_cgroup_at`] looks at for one exited container.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OomProbe<'a> {
    /// The container's id.
    pub id: &'a str,
    /// Its cgroup below the hierarchy's root, if known.
    pub own_dir: Option<&'a str>,
    /// Its pod's cgroup below the hierarchy's root, if the pod has one.
    pub pod_dir: Option<&'a str>,
    /// The pod cgroup's count when the container started.
    pub pod_kills_at_start: Option<u64>,
    /// The exit status.
    pub exit_status: u32,
}

/// Exit status of a process killed by SIGKILL (128 + 9), as the OOM killer kills.
const SIGKILL_EXIT_STATUS: u32 = 137;

fn oom_killed_under(root: &std::path::Path, unified: bool, probe: &OomProbe<'_>) -> bool {
    if let Some(n) = oom_kills_under(root, probe.own_dir, probe.id) {
        return n > 0;
    }
    let grown = || {
        let at_start = probe.pod_kills_at_start?;
        let now = oom_kill_count(&root.join(probe.pod_dir?.trim_start_matches('/')))?;
        Some(now > at_start)
    };
    unified && probe.exit_status == SIGKILL_EXIT_STATUS && grown().unwrap_or(false)
}

/// The pod cgroup `pod_dir`'s `oom_kill` count on cgroup v2 (where it counts its
/// descendants' kills); `None` on v1, without a pod cgroup, or where it cannot be read.
pub(crate) fn pod_oom_kills(pod_dir: Option<&str>) -> Option<u64> {
    let (root, unified) = memory_hierarchy();
    if !unified {
        return None;
    }
    oom_kill_count(&root.join(pod_dir?.trim_start_matches('/')))
}

/// The `oom_kill` count of cgroup `cgroup_dir` (or of the directory named `id`) below the
/// memory hierarchy `root`, from whichever of v1's `memory.oom_control` and v2's
/// `memory.events` it has; `None` without such a cgroup.
fn oom_kills_under(root: &std::path::Path, cgroup_dir: Option<&str>, id: &str) -> Option<u64> {
    let from_spec = cgroup_dir.map(|p| root.join(p.trim_start_matches('/')));
    let dir = from_spec.or_else(|| find_dir_named(root, id, 6))?;
    oom_kill_count(&dir)
}

/// The `oom_kill` line of cgroup directory `dir`'s v1 `memory.oom_control` or v2
/// `memory.events`; `None` if it has neither.
fn oom_kill_count(dir: &std::path::Path) -> Option<u64> {
    ["memory.oom_control", "memory.events"]
        .iter()
        .find_map(|file| std::fs::read_to_string(dir.join(file)).ok())?
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse::<u64>().ok())
}

/// When process `pid` started, in ns since the epoch: its start time in clock ticks after
/// boot (`/proc/<pid>/stat` field 22) plus the boot time (`btime` in `/proc/stat`).
pub(crate) fn process_start_ns(pid: u32) -> Option<i64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 2 (comm) may hold spaces and parentheses: count from the last ')'.
    let after_comm = &stat[stat.rfind(')')? + 1..];
    let ticks: i64 = after_comm.split_whitespace().nth(19)?.parse().ok()?;
    let btime: i64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok()??;
    if hz <= 0 {
        return None;
    }
    Some(btime * 1_000_000_000 + ticks * (1_000_000_000 / hz as i64))
}

/// Breadth-first search below `root` (at most `depth` levels) for a directory named `name`.
fn find_dir_named(root: &std::path::Path, name: &str, depth: usize) -> Option<std::path::PathBuf> {
    let mut level = vec![root.to_path_buf()];
    for _ in 0..depth {
        let mut next = Vec::new();
        for dir in level {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                if !e.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                if e.file_name() == name {
                    return Some(e.path());
                }
                next.push(e.path());
            }
        }
        level = next;
    }
    None
}

/// What a sweep of half-made objects did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Swept {
    /// Stale intents fully undone.
    pub intents: usize,
    /// Stale intents whose undo failed (retried at the next resync).
    pub failed: usize,
    /// Orphaned leases of an earlier remora deleted.
    pub leases: usize,
    /// Exit keepers whose container record was gone.
    pub keepers: usize,
}

impl Pods {
    /// Undoes what RunPodSandbox/CreateContainer calls killed half way made (their stale
    /// intents, see `super::journal`), and deletes remora's leases created before this
    /// process started (their pulls and creations died with the old process; containerd would
    /// keep what they hold until the lease expires). Every step is idempotent; an intent whose
    /// undo fails stays and is retried at the next resync.
    pub async fn sweep_half_made(self: &Arc<Self>) -> Swept {
        let mut done = Swept::default();
        for intent in self.journal.stale() {
            let id = intent.id().to_string();
            // The same id fields as the CRI calls' lines, so a pod's or container's history
            // is found under one key.
            let log = match &intent {
                Intent::Sandbox { .. } => self.log.new(slog::o!("pod_id" => id.clone())),
                Intent::Container { .. } => self.log.new(slog::o!("container_id" => id.clone())),
            };
            match self.undo_intent(&intent).await {
                Ok(()) => {
                    self.journal.swept(&id);
                    info!(log, "undid an operation interrupted by a crash"; "intent" => ?intent);
                    done.intents += 1;
                }
                Err(e) => {
                    warn!(log, "cannot undo an operation interrupted by a crash; retrying at the next resync"; "error" => %e);
                    done.failed += 1;
                }
            }
        }
        match self.containers.sweep_orphans().await {
            Ok(n) => done.keepers = n,
            Err(e) => warn!(self.log, "cannot sweep orphaned exit keepers"; "error" => %e),
        }
        match self.leases.list().await {
            Ok(leases) => {
                for (id, created) in leases {
                    let orphan =
                        id.starts_with("remora-") && created.is_some_and(|at| at < self.started_at);
                    if orphan {
                        match self.leases.delete(&id, true).await {
                            Ok(()) => done.leases += 1,
                            Err(e) => {
                                warn!(self.log, "cannot delete an orphaned lease"; "lease" => &id, "error" => %e)
                            }
                        }
                    }
                }
            }
            Err(e) => warn!(self.log, "cannot list leases"; "error" => %e),
        }
        if done != Swept::default() {
            info!(self.log, "swept what a crash left"; "intents" => done.intents, "failed" => done.failed, "leases" => done.leases, "keepers" => done.keepers);
        }
        done
    }

    async fn undo_intent(self: &Arc<Self>, intent: &Intent) -> Result<(), UndoError> {
        let id = intent.id();
        if self.tasks.state(id).await?.is_some() {
            kill_and_delete(self.tasks.as_ref(), id).await?;
        }
        self.containers.delete(id).await?;
        self.snapshots.remove(&self.snapshotter, id).await?;
        self.leases.delete(&creation_lease_id(id), false).await?;
        match intent {
            Intent::Sandbox {
                name,
                namespace,
                uid,
                netns_path,
                ..
            } => {
                let dir = self.sandbox_dir(id);
                super::blocking(move || super::sandbox_files::remove(&dir)).await??;
                if let Some(path) = netns_path {
                    // Its ADD's plugins outlive the crash: DEL only once they ended.
                    let plugins = self.network.await_orphaned_plugins(id).await?;
                    if plugins.found > 0 {
                        info!(self.log, "waited for the CNI plugins a crash left running";
                            "pod_id" => id, "plugins" => plugins.found,
                            "groups_killed" => plugins.killed);
                    }
                    let info = super::sandbox_stop::pod_net_info(id, name, namespace, uid, path);
                    self.network.teardown(&info).await?;
                    self.network.remove_netns(path).await?;
                }
            }
            Intent::Container { .. } => {
                // Its image volumes' mounts; their views went with the creation lease.
                let volumes = self.image_volume_dir(id);
                super::blocking(move || super::image_volume::unmount_all_below(&volumes)).await?;
                let dir = self.io_dir(id);
                match std::fs::remove_dir_all(&dir) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(source) => return Err(UndoError::Io { path: dir, source }),
                }
            }
        }
        Ok(())
    }

    /// One recovery/reconcile pass over containerd's records: the sandboxes, then (their
    /// names need their sandboxes indexed) the containers, [`RECOVERY_CONCURRENCY`] records
    /// at a time. Records are independent of each other within each kind. Every record of a
    /// kind is tried, none left half recovered; then the first error, if any, fails the pass.
    pub async fn recover(self: &Arc<Self>) -> Result<Recovered, BackendError> {
        let mut done = Recovered::default();
        let records = self.containers.list().await?;
        let (mut sandboxes, mut containers) = (Vec::new(), Vec::new());
        for r in records {
            match r.labels.get(LABEL_KIND).map(String::as_str) {
                Some(KIND_SANDBOX) => sandboxes.push(r),
                Some(KIND_CONTAINER) => containers.push(r),
                _ => {}
            }
        }
        for one in self.recover_all(sandboxes, Kind::Sandbox).await {
            done += one?;
        }
        for one in self.recover_all(containers, Kind::Container).await {
            done += one?;
        }
        if done != Recovered::default() {
            info!(self.log, "recovered from containerd"; "sandboxes" => done.sandboxes, "containers" => done.containers, "exits_recorded" => done.exits, "skipped" => done.skipped);
        }
        Ok(done)
    }

    /// Recovers `records` of one kind, [`RECOVERY_CONCURRENCY`] at a time; every one's result.
    async fn recover_all(
        self: &Arc<Self>,
        records: Vec<ContainerRecord>,
        kind: Kind,
    ) -> Vec<Result<Recovered, BackendError>> {
        use futures_util::StreamExt;
        futures_util::stream::iter(records)
            .map(|r| {
                let me = self.clone();
                async move {
                    let mut one = Recovered::default();
                    match kind {
                        Kind::Sandbox => me.recover_sandbox(&r, &mut one).await,
                        Kind::Container => me.recover_container(&r, &mut one).await,
                    }
                    .map(|()| one)
                }
            })
            .buffer_unordered(RECOVERY_CONCURRENCY)
            .collect()
            .await
    }

    /// Indexes sandbox record `r` if it is not yet (a stale intent's is the sweep's): READY
    /// with its exit monitor if its task runs, NOTREADY otherwise.
    async fn recover_sandbox(
        self: &Arc<Self>,
        r: &ContainerRecord,
        done: &mut Recovered,
    ) -> Result<(), BackendError> {
        if self.sandboxes.get(&r.id).is_ok() || self.journal.is_stale(&r.id) {
            return Ok(());
        }
        let Some(meta) = r
            .extensions
            .get(SANDBOX_EXTENSION)
            .and_then(|b| decode_extension::<SandboxMetadata>(b).ok())
        else {
            self.index_unreadable_sandbox(r, done);
            return Ok(());
        };
        let (status, running) = match self.tasks.state(&r.id).await? {
            // A pod without a pause container: its holder task's pid is its shim's, no
            // process of the pod's.
            Some(s) if s.status == TaskStatus::Running => (
                SandboxStatus::ready(if meta.pinned_namespaces { 0 } else { s.pid }),
                true,
            ),
            _ => (SandboxStatus::default(), false),
        };
        let _ = self.names.reserve(&meta.name_key(), &r.id);
        let sandbox = Sandbox::new(meta, status);
        if !running {
            sandbox.set_not_ready();
        }
        if let Err(e) = self.sandboxes.add(sandbox.clone()) {
            warn!(self.log, "cannot index a recovered sandbox"; "pod_id" => &r.id, "error" => %e);
            return Ok(());
        }
        if running {
            self.monitor_exit(sandbox);
        }
        done.sandboxes += 1;
        Ok(())
    }

    /// A sandbox record without readable metadata: indexed as UNKNOWN from its labels, so
    /// kubelet can still stop and remove it.
    fn index_unreadable_sandbox(&self, r: &ContainerRecord, done: &mut Recovered) {
        done.skipped += 1;
        warn!(self.log, "sandbox record without readable metadata; indexed as UNKNOWN"; "pod_id" => &r.id);
        let label = |k: &str| r.labels.get(k).cloned().unwrap_or_default();
        let netns = self.netns_path_of(&r.id);
        let sandbox = Sandbox::new(
            SandboxMetadata {
                id: r.id.clone(),
                name: label(LABEL_POD_NAME),
                namespace: label(LABEL_POD_NAMESPACE),
                uid: label(LABEL_POD_UID),
                netns_path: netns,
                ..Default::default()
            },
            SandboxStatus::default(),
        );
        sandbox.mark_unknown();
        if self.sandboxes.add(sandbox).is_ok() {
            done.sandboxes += 1;
        }
    }

    /// Indexes container record `r` with the state its task shows, or, for a container
    /// indexed already, records what happened to it while the event stream was down.
    async fn recover_container(
        self: &Arc<Self>,
        r: &ContainerRecord,
        done: &mut Recovered,
    ) -> Result<(), BackendError> {
        // A crash's half-made container is the sweep's; a removed one's cleanup is in
        // flight: neither comes back.
        if self.journal.is_stale(&r.id) || self.is_being_removed(&r.id) {
            return Ok(());
        }
        let state = self.tasks.state(&r.id).await?;
        if let Ok(existing) = self.containers_store.get(&r.id) {
            self.reconcile_known_container(&r.id, &existing, state, done)
                .await;
            return Ok(());
        }
        let Some(snap) = r
            .extensions
            .get(CONTAINER_EXTENSION)
            .and_then(|b| decode_extension::<ContainerSnapshot>(b).ok())
        else {
            self.index_unreadable_container(r, done);
            return Ok(());
        };
        let meta = (*snap.metadata).clone();
        let container = Container::new(meta.clone(), snap.status.clone());
        self.reserve_recovered_name(&meta, &r.id);
        let recovered_stop = self.settle_recovered_task(r, &container, state, done).await;
        if let Err(e) = self.containers_store.add(container.clone()) {
            warn!(self.log, "cannot index a recovered container"; "container_id" => &r.id, "error" => %e);
            return Ok(());
        }
        // The record holds what was read from it: written again only if recovery changed it
        // (an exit recorded, a start finished or undone). A running container's is as it was.
        if container.snapshot().status != snap.status {
            self.persist(&container).await;
        }
        // Stamped when published (see `handle_exit`); the exit time is in the status.
        if recovered_stop {
            let at = now_ns();
            self.events
                .emit_recovered(&r.id, &meta.sandbox_id, EventKind::Stopped, at);
        }
        done.containers += 1;
        Ok(())
    }

    /// A container indexed already: only an exit missed while the stream was down needs
    /// recording, or its task's disappearance.
    async fn reconcile_known_container(
        self: &Arc<Self>,
        id: &str,
        existing: &Container,
        state: Option<TaskState>,
        done: &mut Recovered,
    ) {
        if let Some(s) = state.filter(|s| {
            s.status == TaskStatus::Stopped && existing.state() == ContainerState::Running
        }) {
            // `handle_exit` looks for an OOM kill in the cgroup, as for every exit.
            match self.handle_exit(id, s.exit_status, s.exited_at).await {
                Ok(()) => done.exits += 1,
                Err(e) => {
                    warn!(self.log, "cannot record an exit; the exit monitor retries"; "container_id" => id, "error" => %e)
                }
            }
        } else if state.is_none() {
            // Deleted by containerd while we were not looking (see the exit monitor).
            self.mark_vanished(existing).await;
        }
    }

    /// A container record without readable metadata: indexed as UNKNOWN from its labels, so
    /// kubelet can still stop and remove it.
    fn index_unreadable_container(&self, r: &ContainerRecord, done: &mut Recovered) {
        done.skipped += 1;
        warn!(self.log, "container record without readable metadata; indexed as UNKNOWN"; "container_id" => &r.id);
        let label = |k: &str| r.labels.get(k).cloned().unwrap_or_default();
        let mut meta = crate::store::ContainerMetadata {
            id: r.id.clone(),
            sandbox_id: label(LABEL_SANDBOX_ID),
            name: label(LABEL_CONTAINER_NAME),
            ..Default::default()
        };
        meta.image.requested = r.image.clone();
        let container = Container::new(meta, Default::default());
        let _ = container.mark_unknown();
        if self.containers_store.add(container).is_ok() {
            done.containers += 1;
        }
    }

    /// Reserves a recovered container's name, if its sandbox is indexed.
    fn reserve_recovered_name(&self, meta: &crate::store::ContainerMetadata, id: &str) {
        if let Ok(sb) = self.sandboxes.get(&meta.sandbox_id) {
            let sb = sb.snapshot();
            let _ = self.names.reserve(
                &container_name_key(
                    &meta.name,
                    &sb.metadata.name,
                    &sb.metadata.namespace,
                    &sb.metadata.uid,
                    meta.attempt,
                ),
                id,
            );
        }
    }

    /// Brings a recovered container's status in line with its task (`state`): running, its IO
    /// and exit monitor resumed; exited, its exit recorded and the task deleted; half started,
    /// back to CREATED; gone, reaped or UNKNOWN. Returns whether it stopped while remora was
    /// away (a Stopped event is owed).
    async fn settle_recovered_task(
        self: &Arc<Self>,
        r: &ContainerRecord,
        container: &Container,
        state: Option<TaskState>,
        done: &mut Recovered,
    ) -> bool {
        let mut recovered_stop = false;
        match state {
            Some(s) if s.status == TaskStatus::Running => {
                if container.state() != ContainerState::Running {
                    // Killed between Tasks.Start and recording it (the record says CREATED).
                    let _ = container.begin_start();
                    let started = process_start_ns(s.pid).unwrap_or_else(now_ns);
                    let _ = container.record_started(s.pid, started);
                }
                let copiers = self.resume_io(container).await;
                // Recovery persists what it recovered itself, below.
                self.monitor_container_exit(container.clone(), copiers);
            }
            Some(s) if s.status == TaskStatus::Stopped => {
                // The OOM event, if any, was published while nobody listened: the same
                // check as `handle_exit`'s (its sandbox is indexed above).
                if self.oom_killed_in_cgroup_of(container, s.exit_status) {
                    container.mark_oom();
                }
                if container.state() == ContainerState::Created {
                    // Killed between Tasks.Start and recording it: it ran, then exited.
                    let _ = container.begin_start();
                    let _ = container.record_started(s.pid, exit_ns(s.exited_at));
                }
                if container.record_exit(s.exit_status as i32, exit_ns(s.exited_at))
                    == ExitOutcome::Recorded
                {
                    done.exits += 1;
                    recovered_stop = true;
                }
                let _ = self.tasks.delete(&r.id).await;
            }
            Some(_) => {
                // Created (or paused) but never recorded as started: StartContainer died
                // half way. Drop the task and its FIFOs; the container stays CREATED and
                // can be started again (or removed).
                let _ = kill_and_delete(self.tasks.as_ref(), &r.id).await;
                let _ = std::fs::remove_dir_all(self.io_dir(&r.id));
                container.abort_start();
            }
            // containerd answers a sandboxed task whose shim died as not found (its
            // `State` maps the closed connection to NotFound) and keeps it: reap it as
            // the exit monitor would have (`reap_after_dead_shim`).
            None if container.state() == ContainerState::Running
                && !r.sandbox.is_empty()
                && self.reap_task_of_dead_shim(&r.runtime, &r.id).await =>
            {
                if container.record_exit(128 + libc::SIGKILL, now_ns()) == ExitOutcome::Recorded {
                    done.exits += 1;
                }
                recovered_stop = true;
            }
            None if container.state() == ContainerState::Running => {
                // The task is gone and its exit with it: say so rather than invent one.
                let _ = container.mark_unknown();
                recovered_stop = true;
            }
            None => container.abort_start(),
        }
        recovered_stop
    }

    /// A `/tasks/exit` event for `id`: the exit monitor, if attached, queues the exit itself
    /// (after draining the container's output) behind this event, so there is nothing to do.
    /// Without a monitor (a wait that could not be re-attached), the exit is recorded here
    /// from containerd's task state.
    pub async fn reconcile_exit(&self, id: &str) -> Result<(), ContainerError> {
        let Ok(container) = self.containers_store.get(id) else {
            return Ok(());
        };
        if container.state() != ContainerState::Running || self.is_monitored(id) {
            return Ok(());
        }
        match self.tasks.state(id).await? {
            Some(s) if s.status == TaskStatus::Stopped => {
                self.handle_exit(id, s.exit_status, s.exited_at).await
            }
            _ => Ok(()),
        }
    }

    /// Re-opens a running container's FIFOs (the shim still holds the write ends) and resumes
    /// copying into its log file (appending to the same file).
    async fn resume_io(
        &self,
        container: &Container,
    ) -> Vec<tokio::task::JoinHandle<crate::io::CopySummary>> {
        let meta = container.metadata();
        let dir = self.io_dir(container.id());
        let spec = FifoSpec {
            stdin: meta.stdin,
            tty: meta.tty,
        };
        let Ok(fifos) = FifoSet::paths(&dir, container.id(), spec) else {
            return Vec::new();
        };
        if !fifos.stdout().exists() {
            return Vec::new();
        }
        // Without a log path the output is still drained and fanned out, as at start.
        let writer = if meta.log_path.is_empty() {
            LogWriter::fanout_only()
        } else {
            let log_directory = self
                .sandboxes
                .get(&meta.sandbox_id)
                .map(|sb| sb.metadata().log_directory.clone())
                .unwrap_or_default();
            let (dir, relative) = split_log_path(
                std::path::Path::new(&log_directory),
                std::path::Path::new(&meta.log_path),
            );
            match LogWriter::open_in(dir, relative, Some(crate::io::DEFAULT_MAX_LINE_SIZE)).await {
                Ok(w) => w,
                Err(_) => return Vec::new(),
            }
        };
        let writer = Arc::new(writer);
        let mut copiers = Vec::new();
        if let Ok(r) = fifos.open_stdout() {
            copiers.push(copy_stream(r, StreamKind::Stdout, writer.clone()));
        }
        if !meta.tty {
            if let Ok(r) = fifos.open_stderr() {
                copiers.push(copy_stream(r, StreamKind::Stderr, writer.clone()));
            }
        }
        self.register_io(container.id(), fifos, Some(writer));
        copiers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_started_moments_ago() {
        let start = process_start_ns(std::process::id()).expect("start time");
        let now = now_ns();
        assert!(start <= now, "{start} > {now}");
        assert!(
            now - start < 10 * 60 * 1_000_000_000,
            "started {} s ago?",
            (now - start) / 1_000_000_000
        );
        assert_eq!(process_start_ns(u32::MAX), None);
    }

    #[test]
    fn finds_a_cgroup_dir_by_name_within_the_depth() {
        let tmp = tempfile::tempdir().unwrap();
        let deep = tmp.path().join("a/b/c/abc123");
        std::fs::create_dir_all(&deep).unwrap();
        assert_eq!(find_dir_named(tmp.path(), "abc123", 4), Some(deep));
        assert_eq!(find_dir_named(tmp.path(), "abc123", 3), None);
        assert_eq!(find_dir_named(tmp.path(), "nope", 6), None);
    }

    #[test]
    fn no_cgroup_means_no_oom() {
        assert!(!oom_killed_in_cgroup_at(&OomProbe {
            id: "xyz",
            own_dir: Some("/remora-test-none/xyz"),
            pod_dir: Some("/remora-test-none"),
            pod_kills_at_start: Some(0),
            exit_status: 137,
        }));
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(oom_kills_under(tmp.path(), Some("pod/xyz"), "xyz"), None);
    }

    #[test]
    fn oom_kills_are_read_from_cgroup_v1_and_v2_files() {
        let tmp = tempfile::tempdir().unwrap();
        let v1 = tmp.path().join("v1/kubepods/pod1/c1");
        std::fs::create_dir_all(&v1).unwrap();
        std::fs::write(
            v1.join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
        )
        .unwrap();
        let v2 = tmp.path().join("v2/kubepods/pod1/c2");
        std::fs::create_dir_all(&v2).unwrap();
        std::fs::write(
            v2.join("memory.events"),
            "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\noom_group_kill 0\n",
        )
        .unwrap();
        let none = tmp.path().join("v2/kubepods/pod1/c3");
        std::fs::create_dir_all(&none).unwrap();
        std::fs::write(none.join("memory.events"), "oom 0\noom_kill 0\n").unwrap();

        let v1_root = tmp.path().join("v1");
        let v2_root = tmp.path().join("v2");
        assert_eq!(
            oom_kills_under(&v1_root, Some("/kubepods/pod1/c1"), "c1"),
            Some(2)
        );
        assert_eq!(
            oom_kills_under(&v2_root, Some("kubepods/pod1/c2"), "c2"),
            Some(1)
        );
        assert_eq!(
            oom_kills_under(&v2_root, Some("kubepods/pod1/c3"), "c3"),
            Some(0)
        );
        // Without a cgroupsPath the directory is found by the container's id.
        assert_eq!(oom_kills_under(&v2_root, None, "c2"), Some(1));
    }

    #[test]
    fn with_the_scope_gone_a_sigkill_exit_is_an_oom_kill_when_the_pods_count_grew() {
        use crate::spec::cgroups::{container_cgroup_dir, pod_cgroup_dir};
        use crate::spec::CgroupDriver;
        let tmp = tempfile::tempdir().unwrap();
        let parent = "kubepods-burstable-pod1.slice";
        let pod = tmp
            .path()
            .join("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice");
        std::fs::create_dir_all(&pod).unwrap();
        // systemd removed the container's scope when its last process died; the pod's slice
        // counted the kill (cgroup v2 counts descendants' kills).
        std::fs::write(pod.join("memory.events"), "oom 2\noom_kill 2\n").unwrap();
        let own = container_cgroup_dir(CgroupDriver::Systemd, parent, "c1");
        let pod_dir = pod_cgroup_dir(CgroupDriver::Systemd, parent);
        let probe = |at_start: Option<u64>, exit_status: u32| OomProbe {
            id: "c1",
            own_dir: own.as_deref(),
            pod_dir: pod_dir.as_deref(),
            pod_kills_at_start: at_start,
            exit_status,
        };
        assert!(oom_killed_under(tmp.path(), true, &probe(Some(1), 137)));
        // No kill since the start, no SIGKILL, no count taken at the start, or cgroup v1
        // (whose counters are per cgroup): no.
        assert!(!oom_killed_under(tmp.path(), true, &probe(Some(2), 137)));
        assert!(!oom_killed_under(tmp.path(), true, &probe(Some(1), 1)));
        assert!(!oom_killed_under(tmp.path(), true, &probe(None, 137)));
        assert!(!oom_killed_under(tmp.path(), false, &probe(Some(1), 137)));
        // While the scope is there, its own count answers, whatever the pod's says.
        let scope = pod.join("remora-c1.scope");
        std::fs::create_dir_all(&scope).unwrap();
        std::fs::write(scope.join("memory.events"), "oom 0\noom_kill 0\n").unwrap();
        assert!(!oom_killed_under(tmp.path(), true, &probe(Some(1), 137)));
        std::fs::write(scope.join("memory.events"), "oom 1\noom_kill 1\n").unwrap();
        assert!(oom_killed_under(tmp.path(), true, &probe(Some(2), 0)));
    }

    #[test]
    fn under_systemd_oom_kills_are_read_from_the_containers_scope_in_the_pods_slice() {
        use crate::spec::cgroups::container_cgroup_dir;
        use crate::spec::CgroupDriver;
        let tmp = tempfile::tempdir().unwrap();
        let scope = tmp.path().join(
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/\
             remora-c1.scope",
        );
        std::fs::create_dir_all(&scope).unwrap();
        std::fs::write(scope.join("memory.events"), "oom 1\noom_kill 3\n").unwrap();
        let dir =
            container_cgroup_dir(CgroupDriver::Systemd, "kubepods-burstable-pod1.slice", "c1");
        assert_eq!(oom_kills_under(tmp.path(), dir.as_deref(), "c1"), Some(3));
        // The cgroupfs reading of the same parent looks elsewhere.
        let dir = container_cgroup_dir(
            CgroupDriver::Cgroupfs,
            "kubepods-burstable-pod1.slice",
            "c1",
        );
        assert_eq!(oom_kills_under(tmp.path(), dir.as_deref(), "c1"), None);
    }
}
