//! The stats sampler: the cgroup and network readings behind ContainerStats,
//! ListContainerStats, PodSandboxStats, ListPodSandboxStats and ListPodSandboxMetrics, taken at
//! most once per [`SAMPLE_PERIOD`] however many callers ask.
//!
//! # Design
//!
//! kubelet polls the stats RPCs every 10 s, and its summary API, its `/metrics/cadvisor`
//! and other agents each poll on their own: reading every container's cgroup on every call
//! made the node pay O(pods) file reads per call (at 1,000 pods, 126 ms for ListContainerStats
//! and 428 ms for ListPodSandboxMetrics, in remora's CPU as much as in wall time). Here the
//! cost is O(pods) reads per period:
//!
//! - **A sample per period, single-flight.** A call that finds the last sample older than the
//!   period starts one collection of every running container and ready pod; calls arriving
//!   while it runs wait for that same collection; calls within the period answer from it.
//!   The collection runs in a task of its own, so a caller that gives up does not cut it
//!   short for the others. Nothing runs when nobody asks: no background loop, no idle cost.
//! - **Off the async threads, bounded.** Each container or pod is one `spawn_blocking` read,
//!   at most [`max_in_flight`] at once (a semaphore shared by collections and on-demand
//!   reads; a read's slot is held by its thread, so a read stuck in the kernel keeps its slot
//!   and the bound holds). A read has [`READ_TIMEOUT`] to finish and a collection
//!   [`COLLECT_DEADLINE`] to find slots; files are read with a size cap
//!   ([`super::cgroup_stats::FILE_CAP`]).
//! - **Fresh where CRI needs it.** A call's containers and pods are those of the stores at the
//!   call: one removed since the sample is not reported, and one started since (or asked for
//!   with figures the sample did not read) is read on demand, bounded the same way, and kept
//!   for the rest of the period. Each reading carries the time it was taken (the CRI
//!   `timestamp`), and the CPU rate (`usage_nano_cores`) is computed from two readings of the
//!   same process, never from a reading and itself.
//! - **Failures answer.** A read that panics or times out gives its container or pod no
//!   figures (as an unreadable cgroup does) for the period, logged once; a collection that
//!   fails as a whole leaves its waiters to read what they need on demand. Nobody hangs.
//! - **Bounded cache.** A collection keeps only what it read (the containers and pods that
//!   existed), on-demand readings are of containers that exist, and a removed container or
//!   pod is forgotten at once ([`StatsSampler::forget`]).
//! - **Extras on demand.** The metrics-only figures (throttling, block IO, descriptors:
//!   [`ContainerExtras`]) cost more than the stats; collections read them only while
//!   ListPodSandboxMetrics has been called within [`EXTRAS_INTEREST`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures_util::future::{BoxFuture, FutureExt, Shared};
use slog::{warn, Logger};
use thiserror::Error;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::cgroup_stats::{read_small, CgroupFs, CgroupStats};
use super::now_ns;
use super::stats_read::{
    network_in, network_of, own_cgroup, process_cgroup, read_extras, ContainerExtras, NetworkStats,
};
use crate::spec::CgroupDriver;
use crate::store::{ContainerSnapshot, ContainerState, SandboxSnapshot, SandboxState};

/// How old a sample may be before a call takes a new one: kubelet's housekeeping and stats
/// polling period, and containerd's `stats_collect_period` (the snapshot usage cache's too).
pub const SAMPLE_PERIOD: Duration = super::snapshot_usage::COLLECT_PERIOD;

/// How long one container's or pod's read may take; past it, it has no figures this period.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a collection waits for read slots, all reads together; a container still
/// waiting then has no figures this period.
pub const COLLECT_DEADLINE: Duration = Duration::from_secs(20);

/// How long after a ListPodSandboxMetrics call collections read the metrics-only figures.
pub const EXTRAS_INTEREST: Duration = Duration::from_secs(300);

/// Reads in flight at once: one per core, at most 4 (the reads are short syscalls; more
/// threads would only contend with the containers being measured).
pub fn max_in_flight() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 4)
}

/// A running container to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerTarget {
    /// The container.
    pub id: String,
    /// Its init process.
    pub pid: u32,
}

/// Where a pod's network counters are read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetworkSource {
    /// Nowhere: a host-network pod reports no network.
    Host,
    /// `/proc/<pid>/net/dev` of a process in the pod's network namespace.
    Process(u32),
    /// From inside the network namespace at this path (no process in it to read through).
    Namespace(PathBuf),
}

/// A ready pod to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxTarget {
    /// The pod.
    pub id: String,
    /// Its pause process; 0 without one.
    pub pid: u32,
    /// Its cgroup parent (kubelet's pod cgroup); empty: none.
    pub cgroup_parent: String,
    /// Its network.
    pub network: NetworkSource,
}

/// The containers and pods a collection or a call reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Targets {
    /// Running containers.
    pub containers: Vec<ContainerTarget>,
    /// Ready pods.
    pub sandboxes: Vec<SandboxTarget>,
}

/// What a call needs beyond the stats.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Need {
    /// The metrics-only figures of each container (ListPodSandboxMetrics).
    pub extras: bool,
    /// The snapshotter's root, whose filesystem the extras measure.
    pub writable_root: Option<PathBuf>,
}

/// One read of a container.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ContainerFigures {
    /// Its cgroup's figures.
    pub cgroup: CgroupStats,
    /// Its metrics-only figures, when asked for.
    pub extras: Option<ContainerExtras>,
}

/// One read of a pod.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SandboxFigures {
    /// Its own cgroup's figures (its cgroup parent), if it has one that exists.
    pub own: Option<CgroupStats>,
    /// Its pause process's cgroup, read when it has no cgroup of its own (the pod is then the
    /// sum of its parts).
    pub pause: Option<CgroupStats>,
    /// Its network; `None` for a host-network pod or one that could not be read.
    pub network: Option<NetworkStats>,
}

/// The blocking reads behind a sample, in the sampler's words: the host's cgroupfs and
/// procfs ([`HostSource`]), a recording fake in tests. Called on blocking threads.
pub trait StatsSource: Send + Sync + 'static {
    /// The container whose init process is `pid`; with its extras when `need.extras`.
    fn container(&self, pid: u32, need: &Need) -> ContainerFigures;
    /// The pod `target`.
    fn sandbox(&self, target: &SandboxTarget) -> SandboxFigures;
}

/// A container's reading.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerReading {
    /// The process read.
    pub pid: u32,
    /// When (ns since the epoch).
    pub timestamp_ns: i64,
    /// What was read; no figures if the read failed.
    pub figures: ContainerFigures,
    /// CPU use between the previous reading of the same process and this one, in
    /// nanocores; `None` without a previous reading.
    pub usage_nano_cores: Option<u64>,
}

/// A pod's reading.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxReading {
    /// The pause process when read (0: none).
    pub pid: u32,
    /// When (ns since the epoch).
    pub timestamp_ns: i64,
    /// What was read; no figures if the read failed.
    pub figures: SandboxFigures,
    /// The CPU use of its own cgroup between two readings, in nanocores; `None` without a
    /// cgroup of its own or a previous reading.
    pub usage_nano_cores: Option<u64>,
}

/// The readings of a call's containers and pods, by id.
#[derive(Debug, Clone, Default)]
pub struct Readings {
    /// Running containers.
    pub containers: HashMap<String, Arc<ContainerReading>>,
    /// Ready pods.
    pub sandboxes: HashMap<String, Arc<SandboxReading>>,
}

/// Why a read gave no figures.
#[derive(Debug, Error)]
enum ReadError {
    /// No read slot freed up in time.
    #[error("no read slot within the collection's deadline")]
    NoSlot,
    /// The read took longer than this (its thread keeps its slot until it ends).
    #[error("the read took more than {0:?}")]
    TimedOut(Duration),
    /// The read panicked (a bug).
    #[error("the read failed: {0}")]
    Panicked(#[from] tokio::task::JoinError),
}

/// A collection in flight, awaited by every caller that needs it.
type Collection = Shared<BoxFuture<'static, ()>>;

/// The last readings and the collection in flight.
#[derive(Default)]
struct State {
    containers: HashMap<String, Arc<ContainerReading>>,
    sandboxes: HashMap<String, Arc<SandboxReading>>,
    /// When the last collection started, and whether it read the extras.
    last: Option<(Instant, bool)>,
    /// The collection in flight: its number, whether it reads the extras, and its future.
    collecting: Option<(u64, bool, Collection)>,
    /// Collections started so far (numbers them).
    started: u64,
    /// Until when collections read the extras.
    extras_until: Option<Instant>,
    /// The snapshotter root the last metrics call named (the extras' filesystem).
    writable_root: Option<PathBuf>,
}

/// Clears the collection in flight when its task ends, however it ends (a panic unwinds
/// through it too), so the next call can start another.
struct Done {
    sampler: Arc<StatsSampler>,
    number: u64,
}

impl Drop for Done {
    fn drop(&mut self) {
        let mut state = self.sampler.lock();
        if state
            .collecting
            .as_ref()
            .is_some_and(|c| c.0 == self.number)
        {
            state.collecting = None;
        }
    }
}

/// Observes collections (the metrics endpoint's counters).
pub trait SampleObserver: Send + Sync {
    /// A collection took `elapsed`.
    fn sampled(&self, elapsed: Duration);
}

impl SampleObserver for crate::metrics::Metrics {
    fn sampled(&self, elapsed: Duration) {
        self.stats_sampled(elapsed);
    }
}

/// A sampler's period and bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// How old a sample may be ([`SAMPLE_PERIOD`]).
    pub period: Duration,
    /// Reads in flight at once ([`max_in_flight`]).
    pub in_flight: usize,
    /// How long one read may take ([`READ_TIMEOUT`]).
    pub read_timeout: Duration,
    /// How long a collection waits for read slots ([`COLLECT_DEADLINE`]).
    pub collect_deadline: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            period: SAMPLE_PERIOD,
            in_flight: max_in_flight(),
            read_timeout: READ_TIMEOUT,
            collect_deadline: COLLECT_DEADLINE,
        }
    }
}

/// The sampler: the last readings and the collection in flight.
pub struct StatsSampler {
    source: Arc<dyn StatsSource>,
    limits: Limits,
    /// Read slots: the bound on reads in flight.
    slots: Arc<Semaphore>,
    state: Mutex<State>,
    observer: OnceLock<Box<dyn SampleObserver>>,
    log: Logger,
}

impl StatsSampler {
    /// A sampler reading through `source` within `limits`.
    pub fn new(source: Arc<dyn StatsSource>, limits: Limits, log: Logger) -> Arc<Self> {
        Arc::new(Self {
            source,
            limits,
            slots: Arc::new(Semaphore::new(limits.in_flight.max(1))),
            state: Mutex::new(State::default()),
            observer: OnceLock::new(),
            log,
        })
    }

    /// Tells `observer` of each collection from now on. Set once.
    pub fn set_observer(&self, observer: Box<dyn SampleObserver>) {
        let _ = self.observer.set(observer);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Only map operations and assignments run under this lock: a panic elsewhere cannot
        // leave its state half-written.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Forgets container or pod `id` (removed).
    pub fn forget(&self, id: &str) {
        let mut state = self.lock();
        state.containers.remove(id);
        state.sandboxes.remove(id);
    }

    /// The readings of `wanted` (a call's running containers and ready pods), from a sample
    /// no older than the period: the last one, else one collection of `everything()` (every
    /// running container and ready pod) that concurrent calls share; what the sample does not
    /// have (started since, or without the figures `need` asks for) is read now.
    pub async fn read(
        self: &Arc<Self>,
        need: &Need,
        wanted: Targets,
        everything: impl FnOnce() -> Targets,
    ) -> Readings {
        self.fresh(need, everything).await;
        let mut out = Readings::default();
        let mut missing = Targets::default();
        {
            let state = self.lock();
            for c in wanted.containers {
                match state.containers.get(&c.id) {
                    Some(r) if r.pid == c.pid && (!need.extras || r.figures.extras.is_some()) => {
                        out.containers.insert(c.id, r.clone());
                    }
                    _ => missing.containers.push(c),
                }
            }
            for s in wanted.sandboxes {
                match state.sandboxes.get(&s.id) {
                    Some(r) if r.pid == s.pid => {
                        out.sandboxes.insert(s.id, r.clone());
                    }
                    _ => missing.sandboxes.push(s),
                }
            }
        }
        if !missing.containers.is_empty() || !missing.sandboxes.is_empty() {
            let deadline = Instant::now() + self.limits.read_timeout;
            let read = self.read_all(missing, need, deadline).await;
            let mut state = self.lock();
            for r in read.containers {
                let r = with_rate(&state.containers, r);
                state.containers.insert(r.0.clone(), r.1.clone());
                out.containers.insert(r.0, r.1);
            }
            for r in read.sandboxes {
                let r = with_pod_rate(&state.sandboxes, r);
                state.sandboxes.insert(r.0.clone(), r.1.clone());
                out.sandboxes.insert(r.0, r.1);
            }
        }
        out
    }

    /// Makes sure a sample younger than the period (with the extras if `need` asks for them)
    /// is there, or that one collection was tried: at most two rounds, the second when the
    /// collection joined did not read the extras.
    async fn fresh(self: &Arc<Self>, need: &Need, everything: impl FnOnce() -> Targets) {
        let mut everything = Some(everything);
        for _ in 0..2 {
            let collection = {
                let mut state = self.lock();
                let now = Instant::now();
                if need.extras {
                    state.extras_until = Some(now + EXTRAS_INTEREST);
                    state.writable_root = need.writable_root.clone();
                }
                let fresh = state.last.is_some_and(|(at, extras)| {
                    now.duration_since(at) < self.limits.period && (extras || !need.extras)
                });
                if fresh {
                    return;
                }
                match &state.collecting {
                    // Joined; if it reads no extras and `need` asks for them, the next round
                    // starts a collection that does.
                    Some((_, _, c)) => c.clone(),
                    None => {
                        let Some(everything) = everything.take() else {
                            return;
                        };
                        // Listed under the lock, so that no second collection starts
                        // meanwhile; the stores it lists never call into the sampler.
                        let extras = state.extras_until.is_some_and(|t| now < t);
                        state.started += 1;
                        let number = state.started;
                        let collection = tokio::spawn(self.clone().collect(
                            number,
                            everything(),
                            Need {
                                extras,
                                writable_root: state.writable_root.clone(),
                            },
                        ))
                        // A collection that panicked has cleared itself (`Done`); its
                        // waiters go on to read what they need on demand.
                        .map(|_| ())
                        .boxed()
                        .shared();
                        state.collecting = Some((number, extras, collection.clone()));
                        collection
                    }
                }
            };
            collection.await;
        }
    }

    /// One collection: every target read, the readings replacing the last sample's.
    async fn collect(self: Arc<Self>, number: u64, targets: Targets, need: Need) {
        let _done = Done {
            sampler: self.clone(),
            number,
        };
        let started = Instant::now();
        let read = self
            .read_all(targets, &need, started + self.limits.collect_deadline)
            .await;
        {
            let mut state = self.lock();
            let start_ns = read.started_ns;
            let mut containers = HashMap::with_capacity(read.containers.len());
            for r in read.containers {
                let (id, r) = with_rate(&state.containers, r);
                containers.insert(id, r);
            }
            let mut sandboxes = HashMap::with_capacity(read.sandboxes.len());
            for r in read.sandboxes {
                let (id, r) = with_pod_rate(&state.sandboxes, r);
                sandboxes.insert(id, r);
            }
            // Read on demand while this collection ran (started after it listed them): kept.
            for (id, r) in state.containers.drain() {
                if r.timestamp_ns >= start_ns {
                    containers.entry(id).or_insert(r);
                }
            }
            for (id, r) in state.sandboxes.drain() {
                if r.timestamp_ns >= start_ns {
                    sandboxes.entry(id).or_insert(r);
                }
            }
            state.containers = containers;
            state.sandboxes = sandboxes;
            state.last = Some((started, need.extras));
        }
        if let Some(o) = self.observer.get() {
            o.sampled(started.elapsed());
        }
    }

    /// Reads `targets`, at most the semaphore's slots at once, each slot found by `deadline`.
    async fn read_all(self: &Arc<Self>, targets: Targets, need: &Need, deadline: Instant) -> Read {
        let started_ns = now_ns();
        let containers = targets.containers.into_iter().map(|c| {
            let source = self.source.clone();
            let need = need.clone();
            async move {
                let pid = c.pid;
                let read = self
                    .read_one(deadline, move || {
                        let timestamp_ns = now_ns();
                        (timestamp_ns, source.container(pid, &need))
                    })
                    .await;
                let (timestamp_ns, figures) = self.or_nothing(read, &c.id);
                (
                    c.id,
                    ContainerReading {
                        pid,
                        timestamp_ns,
                        figures,
                        usage_nano_cores: None,
                    },
                )
            }
        });
        let sandboxes = targets.sandboxes.into_iter().map(|s| {
            let source = self.source.clone();
            async move {
                let (id, pid) = (s.id.clone(), s.pid);
                let read = self
                    .read_one(deadline, move || {
                        let timestamp_ns = now_ns();
                        (timestamp_ns, source.sandbox(&s))
                    })
                    .await;
                let (timestamp_ns, figures) = self.or_nothing(read, &id);
                (
                    id,
                    SandboxReading {
                        pid,
                        timestamp_ns,
                        figures,
                        usage_nano_cores: None,
                    },
                )
            }
        });
        let (containers, sandboxes) = futures_util::future::join(
            futures_util::future::join_all(containers),
            futures_util::future::join_all(sandboxes),
        )
        .await;
        Read {
            started_ns,
            containers,
            sandboxes,
        }
    }

    /// `f` on a blocking thread once a slot is free (by `deadline`), within the read timeout.
    async fn read_one<T: Send + 'static>(
        &self,
        deadline: Instant,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, ReadError> {
        let permit =
            match tokio::time::timeout_at(deadline, self.slots.clone().acquire_owned()).await {
                Ok(Ok(permit)) => permit,
                // Err(Ok): the semaphore is never closed; were it, there would be no slot either.
                Ok(Err(_)) | Err(_) => return Err(ReadError::NoSlot),
            };
        let task = tokio::task::spawn_blocking(move || {
            // The slot is the thread's until the read returns, even after a timeout.
            let _slot = permit;
            f()
        });
        match tokio::time::timeout(self.limits.read_timeout, task).await {
            Ok(read) => Ok(read?),
            Err(_) => Err(ReadError::TimedOut(self.limits.read_timeout)),
        }
    }

    /// A read's timestamp and figures; for a failed read, now and no figures (logged).
    fn or_nothing<T: Default>(&self, read: Result<(i64, T), ReadError>, id: &str) -> (i64, T) {
        read.unwrap_or_else(|e| {
            warn!(self.log, "stats not read: reported without figures this period"; "id" => id, "error" => %e);
            (now_ns(), T::default())
        })
    }
}

/// What [`StatsSampler::read_all`] read.
struct Read {
    /// When it started (ns since the epoch).
    started_ns: i64,
    containers: Vec<(String, ContainerReading)>,
    sandboxes: Vec<(String, SandboxReading)>,
}

/// Nanocores used between readings `(ns, cpu ns)` `before` and `after`, if `after` is later
/// and the counter did not go back.
fn rate(before: (i64, u64), after: (i64, u64)) -> Option<u64> {
    let elapsed = after.0.checked_sub(before.0).filter(|e| *e > 0)? as u128;
    let used = after.1.checked_sub(before.1)? as u128;
    u64::try_from(used * 1_000_000_000 / elapsed).ok()
}

fn cpu_at(timestamp_ns: i64, c: &CgroupStats) -> Option<(i64, u64)> {
    Some((timestamp_ns, c.cpu?.usage_ns))
}

/// `r` with its CPU rate from the reading of the same process in `last`.
fn with_rate(
    last: &HashMap<String, Arc<ContainerReading>>,
    (id, mut r): (String, ContainerReading),
) -> (String, Arc<ContainerReading>) {
    r.usage_nano_cores = last.get(&id).filter(|p| p.pid == r.pid).and_then(|p| {
        rate(
            cpu_at(p.timestamp_ns, &p.figures.cgroup)?,
            cpu_at(r.timestamp_ns, &r.figures.cgroup)?,
        )
    });
    (id, Arc::new(r))
}

/// `r` with the CPU rate of its own cgroup from the last reading of the same pod.
fn with_pod_rate(
    last: &HashMap<String, Arc<SandboxReading>>,
    (id, mut r): (String, SandboxReading),
) -> (String, Arc<SandboxReading>) {
    r.usage_nano_cores = last.get(&id).filter(|p| p.pid == r.pid).and_then(|p| {
        rate(
            cpu_at(p.timestamp_ns, p.figures.own.as_ref()?)?,
            cpu_at(r.timestamp_ns, r.figures.own.as_ref()?)?,
        )
    });
    (id, Arc::new(r))
}

/// The host's cgroupfs and procfs.
pub struct HostSource {
    fs: CgroupFs,
    driver: CgroupDriver,
}

impl HostSource {
    /// The host's, pods' cgroup parents laid out by `driver`.
    pub fn new(driver: CgroupDriver) -> Self {
        Self {
            fs: CgroupFs::host(),
            driver,
        }
    }
}

impl StatsSource for HostSource {
    fn container(&self, pid: u32, need: &Need) -> ContainerFigures {
        let path = read_small(Path::new(&format!("/proc/{pid}/cgroup")))
            .map(|text| self.fs.path_of_process(&text));
        ContainerFigures {
            cgroup: path.as_ref().map(|p| self.fs.read(p)).unwrap_or_default(),
            extras: need
                .extras
                .then(|| read_extras(&self.fs, path.as_ref(), need.writable_root.as_deref())),
        }
    }

    fn sandbox(&self, target: &SandboxTarget) -> SandboxFigures {
        let own = own_cgroup(&self.fs, self.driver, &target.cgroup_parent);
        let pause =
            (own.is_none() && target.pid != 0).then(|| process_cgroup(&self.fs, target.pid));
        let network = match &target.network {
            NetworkSource::Host => None,
            NetworkSource::Process(pid) => network_of(*pid),
            NetworkSource::Namespace(path) => network_in(path),
        };
        SandboxFigures {
            own,
            pause,
            network,
        }
    }
}

/// What the sampler reads of `container`: its init process, if it is running.
pub(crate) fn container_target(container: &ContainerSnapshot) -> Option<ContainerTarget> {
    let s = &container.status;
    (s.state == ContainerState::Running && s.pid != 0).then(|| ContainerTarget {
        id: container.metadata.id.clone(),
        pid: s.pid,
    })
}

/// What the sampler reads of a pod with containers `containers`, if it is ready: its cgroup
/// parent, its pause process and where its network is seen (the pause process's view; without
/// one, a running container's, else the namespace's own; none for a host-network pod).
pub(crate) fn sandbox_target(
    sandbox: &SandboxSnapshot,
    containers: &[ContainerSnapshot],
) -> Option<SandboxTarget> {
    let (meta, pid) = (&sandbox.metadata, sandbox.status.pid);
    if sandbox.status.state != SandboxState::Ready || (pid == 0 && !meta.pinned_namespaces) {
        return None;
    }
    // A pod with a network namespace of its own has its path recorded; a host-network pod
    // has none.
    let network = if meta.netns_path.is_empty() {
        NetworkSource::Host
    } else if pid != 0 {
        NetworkSource::Process(pid)
    } else {
        let mut running: Vec<_> = containers.iter().filter_map(container_target).collect();
        running.sort_by(|a, b| a.id.cmp(&b.id));
        match running.first() {
            Some(c) => NetworkSource::Process(c.pid),
            None => NetworkSource::Namespace(PathBuf::from(&meta.netns_path)),
        }
    };
    Some(SandboxTarget {
        id: meta.id.clone(),
        pid,
        cgroup_parent: meta.cgroup_parent.clone(),
        network,
    })
}

// The tests are a file of their own (stats_sampler/tests.rs: the module's private items in
// reach), keeping this one to the sampler.
#[cfg(test)]
mod tests;
