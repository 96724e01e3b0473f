//! The background digest resolver: image reference → manifest digest, shared, cached briefly,
//! rate-limited and backed off per reference.
//!
//! `PullImage` for a tag that is already local must still ask the registry whether the tag
//! moved (one `HEAD` of the manifest). A node starting many pods asks about the same few
//! references many times at once, so the lookups go through one [`Resolver`].
//!
//! # Design rationale
//!
//! * **A de-duplicating queue, not a call per request.** A key that is already queued or in
//!   flight is not queued again; every caller of that key waits on the same round and gets
//!   the same result. Fifty pods of one Deployment cost one `HEAD`.
//! * **Callers are never blocked by the queue.** [`Resolver::get`] is a plain function: it
//!   answers from the cache, or starts a round for the key and hands back a [`Pending`] to
//!   await. A key has at most one round, so rounds never exceed the distinct references asked
//!   about, and at most [`MAX_QUEUED`] of them wait for a slot: past that a new round fails at
//!   once with [`ResolverError::QueueFull`] (retriable) rather than queue without end.
//! * **Lookups shared out per registry host, behind a token bucket per host.** Each round runs
//!   in a task of its own that first takes a slot of [`HostSlots`]: at most `workers` lookups
//!   run at once, at most `workers_per_host` of them against one registry host, and when slots
//!   are short the host holding the fewest goes next (then the one served longest ago). A
//!   registry that stalls (accepts and never answers,
//!   sends headers a byte a second, answers 429 with a Retry-After of years) holds only its own
//!   host's share until `resolve_timeout`; a lookup against a healthy registry starts at once
//!   unless `workers / workers_per_host` hosts stall at the same moment. (With one shared pool
//!   of four workers, four stalling lookups held every tag lookup on the node for a minute.)
//!   The host's bucket (`rate_per_sec`, `burst`) spaces the *starts* of its lookups so a burst
//!   of new references cannot trip that registry's rate limit (429s cost far more than the
//!   wait); another registry's burst does not use it up. A round takes its slot first and a
//!   token second, so queued rounds do not hoard tokens and exceed the burst when slots free.
//!   Buckets of hosts whose next token is already due are dropped (a fresh bucket is the same),
//!   so the map holds only hosts that started lookups within the last `burst / rate_per_sec`.
//! * **Per-key backoff, no background retries.** A failed key is not resolved again before its
//!   [`Backoff`] delay (1 s, 2 s, 4 s … up to `backoff_max`) has passed; callers in that window
//!   get the last error at once, without touching the registry. After the window the next
//!   *caller* triggers a new attempt — nobody retries a reference no one asks about. Success
//!   forgets the backoff. Whether the caller should retry at all is up to it:
//!   [`ResolveError::retriable`] carries the verdict of the [`Resolve`] implementation (a 404 is
//!   not, a 503 is) through unchanged.
//! * **A short cache (`ttl`)**: a tag can be re-pushed at any time, so a digest is trusted only
//!   briefly; after `ttl` the next caller resolves again. [`Resolver::invalidate`] forgets a
//!   cached answer early (for example after a pull found the digest gone).
//! * **Shutdown**: dropping the [`Resolver`] or calling [`Resolver::shutdown`] cancels the
//!   rounds (they stop at their next await point) and fails every pending round with
//!   [`ResolverError::ShutDown`], so no caller waits forever. That error means exactly this:
//!   nothing else produces it.
//! * **Every round answers its waiters.** Each lookup runs under an overall deadline
//!   (`resolve_timeout`) with its panics caught: a lookup that panics completes its round with
//!   [`ResolverError::Panicked`], one that does not answer in time with
//!   [`ResolverError::TimedOut`]; both are retriable and back off like any failure. Its slot
//!   goes back when the round's task ends, however it ends, and a round task that is dropped
//!   before it finished (the runtime going away) completes its round with
//!   [`ResolverError::Abandoned`] on its way out. (A registry answering a token lifetime that
//!   overflowed an `Instant` once panicked a worker per lookup until none was left, and every
//!   later pull on the node was told remora was shutting down.)

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures_util::FutureExt;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::host_slots::{HostSlots, SlotsConfig, SlotsError};
use crate::metrics::{GaugeFamily, Metrics};
use remora_host::backoff::Backoff;

/// Rounds that may wait for a slot at once, across all hosts (see the module docs).
pub const MAX_QUEUED: usize = 4096;

/// A failed lookup, as reported by a [`Resolve`] implementation.
///
/// Kept as a message plus a retriable flag rather than a typed enum so that results can be
/// cloned to every waiter and cached, whatever the underlying client's error type; the
/// implementation maps its own errors here and decides what is retriable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ResolveError {
    /// What went wrong, for the caller's error message.
    pub message: String,
    /// Whether trying again later may succeed (connection reset, 5xx, 429: yes; 401/403/404: no).
    pub retriable: bool,
}

impl ResolveError {
    /// A failure that may go away on its own.
    pub fn retriable(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retriable: true,
        }
    }

    /// A failure that will not go away by retrying.
    pub fn permanent(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retriable: false,
        }
    }
}

/// Why the [`Resolver`] could not give a digest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolverError {
    /// The lookup failed (now, or within the key's backoff window).
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    /// The lookup panicked; its round was completed with this error and the worker went on.
    #[error("digest lookup failed: it panicked ({message})")]
    Panicked {
        /// The panic's message, if it had one.
        message: String,
    },
    /// The lookup gave no answer within the resolver's `resolve_timeout`.
    #[error("digest lookup gave no answer within {after:?}")]
    TimedOut {
        /// The deadline.
        after: Duration,
    },
    /// The round ended without a result although the resolver is running (its task was
    /// dropped by a runtime going away; reported rather than waited on).
    #[error("digest lookup was abandoned without a result")]
    Abandoned,
    /// [`MAX_QUEUED`] lookups already wait for a slot; this one was not queued.
    #[error("digest lookup not queued: {limit} lookups wait already")]
    QueueFull {
        /// The cap on waiting lookups.
        limit: usize,
    },
    /// The resolver was shut down (remora is stopping) before the lookup finished.
    #[error("digest resolver is shut down")]
    ShutDown,
}

impl ResolverError {
    /// Whether asking again later may succeed.
    pub fn retriable(&self) -> bool {
        match self {
            ResolverError::Resolve(e) => e.retriable,
            ResolverError::Panicked { .. }
            | ResolverError::TimedOut { .. }
            | ResolverError::Abandoned
            | ResolverError::QueueFull { .. } => true,
            ResolverError::ShutDown => false,
        }
    }
}

/// An invalid [`ResolverConfig`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// `workers` was 0.
    #[error("digest resolver needs at least one worker")]
    NoWorkers,
    /// `workers_per_host` was 0.
    #[error("digest resolver needs at least one worker per registry host")]
    NoWorkersPerHost,
    /// `rate_per_sec` was not a finite number of at least one per day.
    #[error("digest resolver rate_per_sec must be finite and at least one per day, got {0}")]
    BadRate(f64),
    /// `burst` was 0.
    #[error("digest resolver burst must be at least 1")]
    NoBurst,
}

/// The lookup itself (in production: a manifest `HEAD` against the registry).
#[async_trait::async_trait]
pub trait Resolve: Send + Sync + 'static {
    /// Resolves `key` (an image reference) to a value (a manifest digest).
    async fn resolve(&self, key: &str) -> Result<String, ResolveError>;

    /// The registry host `key` is looked up at: lookups share slots and rate per host. The
    /// default puts every key on one host.
    fn host(&self, _key: &str) -> String {
        String::new()
    }
}

/// Tuning for a [`Resolver`].
#[derive(Debug, Clone, PartialEq)]
pub struct ResolverConfig {
    /// How many lookups may run at once, across all registry hosts (at least 1).
    pub workers: usize,
    /// How many lookups may run at once against one registry host (at least 1; more than
    /// `workers` counts as `workers`).
    pub workers_per_host: usize,
    /// Sustained lookup starts per second, per registry host (finite, at least one per day).
    pub rate_per_sec: f64,
    /// How many lookups of one host may start back to back after an idle period (at least 1).
    pub burst: u32,
    /// How long a resolved digest is served from the cache.
    pub ttl: Duration,
    /// First backoff delay after a failure; doubles per consecutive failure.
    pub backoff_min: Duration,
    /// Cap on the backoff delay.
    pub backoff_max: Duration,
    /// Overall deadline of one lookup (every request, retry and token fetch in it).
    pub resolve_timeout: Duration,
}

/// Default overall deadline of one lookup: room for a few retried requests, and well within
/// the time kubelet gives a pull.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(60);

impl Default for ResolverConfig {
    fn default() -> Self {
        Self {
            workers: 32,
            workers_per_host: 4,
            rate_per_sec: 10.0,
            burst: 20,
            ttl: Duration::from_secs(10),
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            resolve_timeout: RESOLVE_TIMEOUT,
        }
    }
}

/// The answer of [`Resolver::get`]: known now, or coming.
#[derive(Debug)]
pub enum Lookup {
    /// From the cache: a fresh digest, or the last error of a key still in its backoff window.
    Ready(Result<String, ResolverError>),
    /// The key is queued or being resolved; await [`Pending::wait`].
    Pending(Pending),
}

impl Lookup {
    /// The result, waiting for it if it is not known yet.
    pub async fn wait(self) -> Result<String, ResolverError> {
        match self {
            Lookup::Ready(result) => result,
            Lookup::Pending(pending) => pending.wait().await,
        }
    }
}

/// The result slot of one resolution round: `None` until a worker finishes it.
type Slot = Option<Result<String, ResolverError>>;

/// A handle on a queued or in-flight resolution; every handle of one round gets the same
/// result. Dropping it does not cancel the round (other callers, and the cache, want it).
#[derive(Debug)]
pub struct Pending {
    rx: watch::Receiver<Slot>,
}

impl Pending {
    /// Waits for the round to finish.
    pub async fn wait(mut self) -> Result<String, ResolverError> {
        loop {
            if let Some(result) = self.rx.borrow_and_update().as_ref() {
                return result.clone();
            }
            if self.rx.changed().await.is_err() {
                // The round's sender is gone: finished (re-check). Shutdown sends `ShutDown`
                // before it drops the sender, so an empty slot here is not a shutdown.
                return self
                    .rx
                    .borrow()
                    .clone()
                    .unwrap_or(Err(ResolverError::Abandoned));
            }
        }
    }
}

/// Resolves keys to values through bounded, per-host, rate-limited, de-duplicating rounds
/// with a short cache and per-key backoff. See the [module docs](self).
pub struct Resolver {
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    /// The round tasks; dropping the set (with the resolver) aborts them. Finished ones are
    /// reaped as new ones start, so it holds no more than the rounds in progress and those
    /// finished since the last start.
    rounds: Mutex<JoinSet<()>>,
}

struct Shared {
    state: Mutex<State>,
    resolve: Arc<dyn Resolve>,
    slots: HostSlots,
    limiter: TokenBucket,
    ttl: Duration,
    resolve_timeout: Duration,
    backoff_min: Duration,
    backoff_max: Duration,
    metrics: Metrics,
}

struct State {
    entries: HashMap<String, Entry>,
    shut_down: bool,
    /// Entry count at which the next sweep of stale entries runs (amortised O(1) per `get`).
    sweep_at: usize,
}

/// Sweeps never run below this many entries.
const MIN_SWEEP: usize = 256;

#[derive(Default)]
struct Entry {
    /// The round in progress (queued or in flight), if any.
    round: Option<watch::Sender<Slot>>,
    /// What the last finished round found.
    last: Option<Outcome>,
    /// Present while the key is failing; dropped on success.
    backoff: Option<Backoff>,
}

enum Outcome {
    Resolved {
        value: String,
        expires: Instant,
    },
    Failed {
        error: ResolverError,
        retry_at: Instant,
    },
}

impl Shared {
    /// Locks the state. Every critical section leaves it consistent before anything that can
    /// panic, so a poisoned lock is recovered rather than propagated.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a finished round and wakes its waiters.
    fn complete(&self, key: &str, result: Result<String, ResolverError>) {
        let now = Instant::now();
        let mut state = self.lock();
        // Gone only if shutdown drained everything meanwhile: nobody to tell.
        let Some(entry) = state.entries.get_mut(key) else {
            return;
        };
        match &result {
            Ok(value) => {
                entry.backoff = None;
                entry.last = Some(Outcome::Resolved {
                    value: value.clone(),
                    expires: later(now, self.ttl),
                });
            }
            Err(error) => {
                self.metrics.resolver_backoff();
                let backoff = entry
                    .backoff
                    .get_or_insert_with(|| Backoff::new(self.backoff_min, self.backoff_max));
                entry.last = Some(Outcome::Failed {
                    error: error.clone(),
                    retry_at: later(now, backoff.next_delay()),
                });
            }
        }
        if let Some(tx) = entry.round.take() {
            tx.send_replace(Some(result));
        }
    }
}

impl State {
    /// Keys queued or being resolved.
    fn in_progress(&self) -> usize {
        self.entries.values().filter(|e| e.round.is_some()).count()
    }

    /// Drops entries that no longer affect any answer: no round in progress, cache expired,
    /// and (for failing keys) a quiet `backoff_max` past their window, after which a new
    /// failure starts the backoff over. Runs when the map has doubled since the last sweep.
    fn sweep(&mut self, now: Instant, backoff_max: Duration) {
        if self.entries.len() < self.sweep_at {
            return;
        }
        self.entries.retain(|_, e| {
            e.round.is_some()
                || match &e.last {
                    Some(Outcome::Resolved { expires, .. }) => now < *expires,
                    Some(Outcome::Failed { retry_at, .. }) => now < later(*retry_at, backoff_max),
                    None => false,
                }
        });
        self.sweep_at = (self.entries.len() * 2).max(MIN_SWEEP);
    }
}

impl Resolver {
    /// A resolver looking keys up through `resolve`, each round in a task of its own (so
    /// [`get`](Self::get) must be called within a Tokio runtime).
    #[cfg(test)]
    pub fn new(config: ResolverConfig, resolve: impl Resolve) -> Result<Self, ConfigError> {
        Self::with_metrics(config, resolve, Metrics::new())
    }

    /// As [`new`](Self::new), counting cache hits and misses, rate-limit waits and backoffs
    /// into `metrics`, and reporting its queue depth there at scrape time.
    pub fn with_metrics(
        config: ResolverConfig,
        resolve: impl Resolve,
        metrics: Metrics,
    ) -> Result<Self, ConfigError> {
        if config.workers == 0 {
            return Err(ConfigError::NoWorkers);
        }
        if config.workers_per_host == 0 {
            return Err(ConfigError::NoWorkersPerHost);
        }
        if !(config.rate_per_sec.is_finite() && config.rate_per_sec >= 1.0 / 86_400.0) {
            return Err(ConfigError::BadRate(config.rate_per_sec));
        }
        if config.burst == 0 {
            return Err(ConfigError::NoBurst);
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                entries: HashMap::new(),
                shut_down: false,
                sweep_at: MIN_SWEEP,
            }),
            resolve: Arc::new(resolve),
            slots: HostSlots::new(SlotsConfig {
                total: config.workers,
                per_host: config.workers_per_host,
                max_waiting: MAX_QUEUED,
            }),
            limiter: TokenBucket::new(config.rate_per_sec, config.burst),
            ttl: config.ttl,
            resolve_timeout: config.resolve_timeout,
            backoff_min: config.backoff_min,
            backoff_max: config.backoff_max,
            metrics: metrics.clone(),
        });
        let weak = Arc::downgrade(&shared);
        metrics.add_gauges(move || {
            let Some(shared) = weak.upgrade() else {
                return Vec::new();
            };
            let depth = shared.lock().in_progress();
            let slots = shared.slots.stats();
            vec![
                GaugeFamily::single(
                    "resolver_queue_depth",
                    "References queued for resolution or being resolved",
                    None,
                    depth as f64,
                ),
                GaugeFamily::single(
                    "resolver_lookups_waiting",
                    "Resolutions waiting for a slot of their registry host",
                    None,
                    slots.waiting as f64,
                ),
            ]
        });
        Ok(Self {
            shared,
            shutdown: CancellationToken::new(),
            rounds: Mutex::new(JoinSet::new()),
        })
    }

    /// The cached answer for `key` if there is one (a digest younger than `ttl`, or the last
    /// error while the key backs off); otherwise starts a round for `key` (once, however many
    /// callers ask) and returns a handle to await. Never waits. Must be called within a Tokio
    /// runtime (the round is a task).
    pub fn get(&self, key: &str) -> Lookup {
        let host = self.shared.resolve.host(key);
        let now = Instant::now();
        let mut state = self.shared.lock();
        if state.shut_down {
            return Lookup::Ready(Err(ResolverError::ShutDown));
        }
        state.sweep(now, self.shared.backoff_max);
        let entry = state.entries.entry(key.to_owned()).or_default();
        if let Some(round) = &entry.round {
            self.shared.metrics.resolver_lookup(false);
            return Lookup::Pending(Pending {
                rx: round.subscribe(),
            });
        }
        match &entry.last {
            Some(Outcome::Resolved { value, expires }) if now < *expires => {
                self.shared.metrics.resolver_lookup(true);
                return Lookup::Ready(Ok(value.clone()));
            }
            Some(Outcome::Failed { error, retry_at }) if now < *retry_at => {
                return Lookup::Ready(Err(error.clone()));
            }
            _ => {}
        }
        let (tx, rx) = watch::channel(None);
        entry.round = Some(tx);
        self.shared.metrics.resolver_lookup(false);
        // Started under the state lock: a round started after `stop` cancelled the token but
        // before it took this lock returns at once, and `stop` then finds its sender here and
        // fails its waiters.
        let round = Round {
            shared: Arc::clone(&self.shared),
            key: key.to_owned(),
            done: false,
        };
        let mut rounds = self.rounds.lock().unwrap_or_else(PoisonError::into_inner);
        while rounds.try_join_next().is_some() {}
        rounds.spawn(round.run(host, self.shutdown.clone()));
        Lookup::Pending(Pending { rx })
    }

    /// [`get`](Self::get), then wait: for callers that need the answer now.
    pub async fn resolve(&self, key: &str) -> Result<String, ResolverError> {
        self.get(key).wait().await
    }

    /// Forgets the cached answer for `key` (digest or error), so the next call resolves it.
    /// A round already in progress is not affected, and the backoff schedule is kept: if the
    /// key fails again, its next window is the longer one.
    pub fn invalidate(&self, key: &str) {
        if let Some(entry) = self.shared.lock().entries.get_mut(key) {
            entry.last = None;
        }
    }

    /// Stops the rounds and waits until their tasks have exited. Pending rounds fail with
    /// [`ResolverError::ShutDown`]; later calls get it at once.
    #[cfg(test)]
    pub async fn shutdown(&self) {
        self.stop();
        let mut rounds =
            std::mem::take(&mut *self.rounds.lock().unwrap_or_else(PoisonError::into_inner));
        // A round task only returns (its lookup's panic is caught); a JoinError would be a
        // runtime shutting down. Either way it is gone.
        while rounds.join_next().await.is_some() {}
    }

    /// Cancels the rounds and fails every pending one, without waiting.
    fn stop(&self) {
        self.shutdown.cancel();
        let mut state = self.shared.lock();
        state.shut_down = true;
        for entry in state.entries.values_mut() {
            if let Some(round) = entry.round.take() {
                round.send_replace(Some(Err(ResolverError::ShutDown)));
            }
        }
    }
}

impl Drop for Resolver {
    /// Rounds stop at their next await point; pending waiters get [`ResolverError::ShutDown`].
    fn drop(&mut self) {
        self.stop();
    }
}

/// `t + d`, saturating at about thirty years on: a configured `Duration::MAX` means "forever",
/// not a panic.
fn later(t: Instant, d: Duration) -> Instant {
    const FAR: Duration = Duration::from_secs(86_400 * 365 * 30);
    t.checked_add(d).unwrap_or_else(|| t + FAR)
}

/// One round of one key: a slot of its host, a token of its host, the lookup under its
/// deadline, the result to every waiter. Completes its round however it ends (see `Drop`).
struct Round {
    shared: Arc<Shared>,
    key: String,
    done: bool,
}

impl Round {
    async fn run(mut self, host: String, shutdown: CancellationToken) {
        let result = tokio::select! {
            biased;
            // `stop` has failed every waiter already.
            () = shutdown.cancelled() => None,
            result = self.lookup(&host) => Some(result),
        };
        self.done = true;
        if let Some(result) = result {
            self.shared.complete(&self.key, result);
        }
    }

    async fn lookup(&self, host: &str) -> Result<String, ResolverError> {
        // Slot first, token second: see the module docs. The slot is held until this returns.
        let _slot = self
            .shared
            .slots
            .acquire(host)
            .await
            .map_err(|SlotsError::Full { limit }| ResolverError::QueueFull { limit })?;
        let now = Instant::now();
        let start = self.shared.limiter.reserve(host, now);
        if start > now {
            self.shared.metrics.resolver_rate_limited();
            tokio::time::sleep_until(start).await;
        }
        // Panics are caught here, so that a lookup's panic fails its round and nothing else.
        let lookup = AssertUnwindSafe(self.shared.resolve.resolve(&self.key)).catch_unwind();
        match tokio::time::timeout(self.shared.resolve_timeout, lookup).await {
            Ok(Ok(answer)) => answer.map_err(ResolverError::from),
            Ok(Err(panic)) => Err(ResolverError::Panicked {
                message: panic_message(panic),
            }),
            Err(_elapsed) => Err(ResolverError::TimedOut {
                after: self.shared.resolve_timeout,
            }),
        }
    }
}

impl Drop for Round {
    /// A round task dropped before it finished (aborted by a runtime going away) still answers
    /// its waiters.
    fn drop(&mut self) {
        if !self.done {
            self.shared
                .complete(&self.key, Err(ResolverError::Abandoned));
        }
    }
}

/// The message of a lookup task's panic, bounded in length.
fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    const MAX: usize = 200;
    let mut message = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_owned());
    if message.len() > MAX {
        let mut end = MAX;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
    }
    message
}

/// Token buckets per host in their GCRA form: one "theoretical arrival time" per host instead
/// of a token count, so start times come out as exact multiples of the interval (no float
/// drift on virtual time). Callers reserve a start time and sleep until it; a reservation is
/// never given back.
struct TokenBucket {
    /// Time between starts at the sustained rate.
    interval: Duration,
    /// How far ahead of the sustained rate a burst may run: `(burst - 1) * interval`.
    tolerance: Duration,
    /// Per host: when its bucket would next be "due" if every reservation ran at the sustained
    /// rate. A host whose time is past is dropped at the next sweep: a fresh bucket is full.
    tat: Mutex<Buckets>,
}

struct Buckets {
    tat: HashMap<String, Instant>,
    /// Host count at which the next sweep runs (amortised O(1) per reservation).
    sweep_at: usize,
}

impl TokenBucket {
    fn new(rate_per_sec: f64, burst: u32) -> Self {
        let interval = Duration::from_secs_f64(1.0 / rate_per_sec);
        Self {
            interval,
            tolerance: interval.saturating_mul(burst.saturating_sub(1)),
            tat: Mutex::new(Buckets {
                tat: HashMap::new(),
                sweep_at: MIN_SWEEP,
            }),
        }
    }

    /// Reserves the next start of `host` and returns when it is (`now` if a token is there).
    fn reserve(&self, host: &str, now: Instant) -> Instant {
        // The critical section is map arithmetic only; a poisoned lock holds valid instants.
        let mut buckets = self.tat.lock().unwrap_or_else(PoisonError::into_inner);
        if buckets.tat.len() >= buckets.sweep_at {
            buckets.tat.retain(|_, due| *due > now);
            buckets.sweep_at = (buckets.tat.len() * 2).max(MIN_SWEEP);
        }
        let tat = buckets.tat.get(host).copied();
        let due = tat.map_or(now, |t| t.max(now));
        let start = due
            .checked_sub(self.tolerance)
            .map_or(now, |earliest| earliest.max(now));
        buckets
            .tat
            .insert(host.to_owned(), later(due, self.interval));
        start
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use tokio::sync::Semaphore;
    use tokio::task::JoinSet;
    use tokio::time::advance;

    /// A fake lookup that counts calls, records start times and concurrency, can be made to
    /// fail, and can be held at a gate until the test releases it.
    struct FakeState {
        calls: AtomicUsize,
        running: AtomicUsize,
        max_running: AtomicUsize,
        starts: Mutex<Vec<Instant>>,
        fail: AtomicBool,
        gated: bool,
        gate: Semaphore,
        delay: Duration,
    }

    impl Default for FakeState {
        fn default() -> Self {
            Self {
                calls: AtomicUsize::new(0),
                running: AtomicUsize::new(0),
                max_running: AtomicUsize::new(0),
                starts: Mutex::default(),
                fail: AtomicBool::new(false),
                gated: false,
                gate: Semaphore::new(0),
                delay: Duration::ZERO,
            }
        }
    }

    struct Fake(Arc<FakeState>);

    #[async_trait::async_trait]
    impl Resolve for Fake {
        /// `host/rest` is looked up at `host`; a key without a slash at "".
        fn host(&self, key: &str) -> String {
            key.split_once('/').map_or("", |(host, _)| host).to_owned()
        }

        async fn resolve(&self, key: &str) -> Result<String, ResolveError> {
            let s = &self.0;
            s.calls.fetch_add(1, Ordering::SeqCst);
            let now_running = s.running.fetch_add(1, Ordering::SeqCst) + 1;
            s.max_running.fetch_max(now_running, Ordering::SeqCst);
            s.starts.lock().unwrap().push(Instant::now());
            // Hostile lookups: as when a registry's answer made the client panic, or a
            // registry accepts the connection and never answers.
            if key.starts_with("panic") {
                panic!("overflow when adding duration to instant");
            }
            if key.contains("hang") {
                std::future::pending::<()>().await;
            }
            if s.gated {
                s.gate.acquire().await.unwrap().forget();
            }
            tokio::time::sleep(s.delay).await;
            s.running.fetch_sub(1, Ordering::SeqCst);
            if s.fail.load(Ordering::SeqCst) {
                Err(ResolveError::retriable(format!("{key}: 503")))
            } else {
                Ok(format!("sha256:{key}"))
            }
        }
    }

    fn config() -> ResolverConfig {
        ResolverConfig {
            workers: 4,
            workers_per_host: 4,
            rate_per_sec: 1000.0,
            burst: 1000,
            ttl: Duration::from_secs(10),
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            resolve_timeout: Duration::from_secs(30),
        }
    }

    fn resolver(config: ResolverConfig, fake: FakeState) -> (Arc<Resolver>, Arc<FakeState>) {
        let state = Arc::new(fake);
        let r = Resolver::new(config, Fake(Arc::clone(&state))).unwrap();
        (Arc::new(r), state)
    }

    fn calls(s: &FakeState) -> usize {
        s.calls.load(Ordering::SeqCst)
    }

    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    fn ready(lookup: Lookup) -> Result<String, ResolverError> {
        match lookup {
            Lookup::Ready(result) => result,
            Lookup::Pending(_) => panic!("expected a cached answer, got a pending lookup"),
        }
    }

    fn is_pending(lookup: &Lookup) -> bool {
        matches!(lookup, Lookup::Pending(_))
    }

    fn digest(key: &str) -> Result<String, ResolverError> {
        Ok(format!("sha256:{key}"))
    }

    fn failed(key: &str) -> Result<String, ResolverError> {
        Err(ResolveError::retriable(format!("{key}: 503")).into())
    }

    #[tokio::test(start_paused = true)]
    async fn fifty_concurrent_resolves_make_one_call() {
        let fake = FakeState {
            delay: Duration::from_secs(1),
            ..Default::default()
        };
        let (r, s) = resolver(config(), fake);
        let mut set = JoinSet::new();
        for _ in 0..50 {
            let r = Arc::clone(&r);
            set.spawn(async move { r.resolve("nginx:1").await });
        }
        let results = set.join_all().await;
        assert_eq!(calls(&s), 1);
        assert_eq!(results.len(), 50);
        assert!(results.iter().all(|x| *x == digest("nginx:1")));
    }

    #[tokio::test(start_paused = true)]
    async fn cached_within_ttl_then_resolved_again() {
        let (r, s) = resolver(config(), FakeState::default());
        assert_eq!(r.resolve("nginx:1").await, digest("nginx:1"));
        assert_eq!(calls(&s), 1);

        advance(Duration::from_millis(9999)).await;
        assert_eq!(ready(r.get("nginx:1")), digest("nginx:1"));
        assert_eq!(r.resolve("nginx:1").await, digest("nginx:1"));
        assert_eq!(calls(&s), 1);

        advance(Duration::from_millis(1)).await;
        let lookup = r.get("nginx:1");
        assert!(is_pending(&lookup), "expired entry must be resolved again");
        assert_eq!(lookup.wait().await, digest("nginx:1"));
        assert_eq!(calls(&s), 2);
        assert_eq!(ready(r.get("nginx:1")), digest("nginx:1"));
        assert_eq!(calls(&s), 2);
    }

    /// One sample of `metrics` (`name{labels}` as encoded), 0 if absent.
    fn sample(metrics: &Metrics, series: &str) -> f64 {
        metrics
            .encode()
            .lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0.0)
    }

    #[tokio::test(start_paused = true)]
    async fn metrics_count_hits_misses_backoffs_and_show_the_queue() {
        let metrics = Metrics::new();
        let state = Arc::new(FakeState {
            gated: true,
            ..Default::default()
        });
        let r =
            Resolver::with_metrics(config(), Fake(Arc::clone(&state)), metrics.clone()).unwrap();
        let a = r.get("nginx:1");
        let b = r.get("nginx:1");
        let c = r.get("redis:7");
        assert!(is_pending(&a) && is_pending(&b) && is_pending(&c));
        assert_eq!(sample(&metrics, "remora_resolver_queue_depth"), 2.0);
        assert_eq!(sample(&metrics, "remora_resolver_cache_misses_total"), 3.0);
        state.fail.store(true, Ordering::SeqCst);
        state.gate.add_permits(2);
        assert!(a.wait().await.is_err());
        assert!(c.wait().await.is_err());
        drop(b);
        assert_eq!(sample(&metrics, "remora_resolver_queue_depth"), 0.0);
        assert_eq!(sample(&metrics, "remora_resolver_backoffs_total"), 2.0);
        // In the backoff window the last error is answered from the cache, then a digest.
        advance(Duration::from_secs(1)).await;
        state.fail.store(false, Ordering::SeqCst);
        state.gate.add_permits(1);
        assert_eq!(r.resolve("nginx:1").await, digest("nginx:1"));
        assert_eq!(ready(r.get("nginx:1")), digest("nginx:1"));
        assert_eq!(sample(&metrics, "remora_resolver_cache_hits_total"), 1.0);
        assert_eq!(sample(&metrics, "remora_resolver_cache_misses_total"), 4.0);
    }

    #[tokio::test(start_paused = true)]
    async fn invalidate_forgets_the_cached_digest() {
        let (r, s) = resolver(config(), FakeState::default());
        assert_eq!(r.resolve("nginx:1").await, digest("nginx:1"));
        r.invalidate("nginx:1");
        r.invalidate("never-seen");
        assert!(is_pending(&r.get("nginx:1")));
        settle().await;
        assert_eq!(calls(&s), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn at_most_workers_lookups_run_at_once() {
        let fake = FakeState {
            delay: Duration::from_secs(1),
            ..Default::default()
        };
        let (r, s) = resolver(
            ResolverConfig {
                workers: 3,
                ..config()
            },
            fake,
        );
        let start = Instant::now();
        let mut set = JoinSet::new();
        for i in 0..10 {
            let r = Arc::clone(&r);
            set.spawn(async move { r.resolve(&format!("img{i}")).await });
        }
        let results = set.join_all().await;
        assert!(results.iter().all(Result::is_ok));
        assert_eq!(calls(&s), 10);
        assert_eq!(s.max_running.load(Ordering::SeqCst), 3);
        // ceil(10 / 3) rounds of one second each.
        assert_eq!(start.elapsed(), Duration::from_secs(4));
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limit_spaces_starts() {
        let (r, s) = resolver(
            ResolverConfig {
                workers: 5,
                rate_per_sec: 2.0,
                burst: 1,
                ..config()
            },
            FakeState::default(),
        );
        let start = Instant::now();
        let mut set = JoinSet::new();
        for i in 0..5 {
            let r = Arc::clone(&r);
            set.spawn(async move { r.resolve(&format!("img{i}")).await });
        }
        assert!(set.join_all().await.iter().all(Result::is_ok));
        assert!(start.elapsed() >= Duration::from_secs(2));
        let mut starts = s.starts.lock().unwrap().clone();
        starts.sort();
        let offsets: Vec<Duration> = starts.iter().map(|t| *t - start).collect();
        let expected: Vec<Duration> = (0..5).map(|i| Duration::from_millis(500 * i)).collect();
        assert_eq!(offsets, expected);
    }

    #[tokio::test(start_paused = true)]
    async fn burst_starts_at_once_then_the_rate_applies() {
        let (r, s) = resolver(
            ResolverConfig {
                workers: 5,
                rate_per_sec: 1.0,
                burst: 3,
                ..config()
            },
            FakeState::default(),
        );
        let start = Instant::now();
        let mut set = JoinSet::new();
        for i in 0..5 {
            let r = Arc::clone(&r);
            set.spawn(async move { r.resolve(&format!("img{i}")).await });
        }
        assert!(set.join_all().await.iter().all(Result::is_ok));
        let mut starts = s.starts.lock().unwrap().clone();
        starts.sort();
        let offsets: Vec<u64> = starts.iter().map(|t| (*t - start).as_secs()).collect();
        assert_eq!(offsets, vec![0, 0, 0, 1, 2]);
    }

    #[tokio::test(start_paused = true)]
    async fn failing_key_backs_off_1_2_4_and_success_resets() {
        let (r, s) = resolver(config(), FakeState::default());
        s.fail.store(true, Ordering::SeqCst);
        let key = "private/app:1";

        let mut expected_calls = 0;
        for window in [1000, 2000, 4000] {
            assert_eq!(r.resolve(key).await, failed(key));
            expected_calls += 1;
            assert_eq!(calls(&s), expected_calls);
            // Inside the window: the last error, at once, without calling the registry.
            advance(Duration::from_millis(window - 1)).await;
            assert_eq!(ready(r.get(key)), failed(key));
            assert_eq!(r.resolve(key).await, failed(key));
            assert_eq!(calls(&s), expected_calls);
            advance(Duration::from_millis(1)).await;
        }

        // The window has passed; the registry recovers.
        s.fail.store(false, Ordering::SeqCst);
        assert_eq!(r.resolve(key).await, digest(key));
        assert_eq!(calls(&s), 4);

        // Success forgot the backoff: the next failure waits 1 s again, not 8 s.
        r.invalidate(key);
        s.fail.store(true, Ordering::SeqCst);
        assert_eq!(r.resolve(key).await, failed(key));
        assert_eq!(calls(&s), 5);
        advance(Duration::from_millis(999)).await;
        assert_eq!(ready(r.get(key)), failed(key));
        advance(Duration::from_millis(1)).await;
        assert!(is_pending(&r.get(key)));
        settle().await;
        assert_eq!(calls(&s), 6);
    }

    #[tokio::test(start_paused = true)]
    async fn backoff_is_capped() {
        let (r, s) = resolver(
            ResolverConfig {
                backoff_max: Duration::from_secs(3),
                ..config()
            },
            FakeState::default(),
        );
        s.fail.store(true, Ordering::SeqCst);
        let mut windows = Vec::new();
        let mut lookup = r.get("k");
        for _ in 0..4 {
            assert!(lookup.wait().await.is_err());
            let failed_at = Instant::now();
            loop {
                advance(Duration::from_millis(100)).await;
                lookup = r.get("k");
                if is_pending(&lookup) {
                    break;
                }
            }
            windows.push((Instant::now() - failed_at).as_millis());
        }
        assert_eq!(windows, vec![1000, 2000, 3000, 3000]);
    }

    #[tokio::test(start_paused = true)]
    async fn get_never_blocks_on_a_full_queue() {
        let fake = FakeState {
            gated: true,
            ..Default::default()
        };
        let (r, s) = resolver(
            ResolverConfig {
                workers: 1,
                ..config()
            },
            fake,
        );
        let t0 = Instant::now();
        let mut pending = Vec::new();
        for i in 0..1000 {
            let lookup = r.get(&format!("img{i}"));
            assert!(is_pending(&lookup));
            pending.push(lookup);
        }
        // Asking again for queued keys queues nothing more.
        for i in 0..1000 {
            assert!(is_pending(&r.get(&format!("img{i}"))));
        }
        assert_eq!(Instant::now(), t0);
        settle().await;
        assert_eq!(calls(&s), 1, "the single worker is held at the gate");

        s.gate.add_permits(1000);
        for (i, lookup) in pending.into_iter().enumerate() {
            assert_eq!(lookup.wait().await, digest(&format!("img{i}")));
        }
        assert_eq!(calls(&s), 1000);
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_fails_pending_rounds_and_stops_workers() {
        let fake = FakeState {
            gated: true,
            ..Default::default()
        };
        let (r, s) = resolver(config(), fake);
        let in_flight = r.get("a");
        let waiter = tokio::spawn({
            let r = Arc::clone(&r);
            async move { r.resolve("a").await }
        });
        settle().await;
        assert_eq!(calls(&s), 1);

        r.shutdown().await;
        assert_eq!(in_flight.wait().await, Err(ResolverError::ShutDown));
        assert_eq!(waiter.await.unwrap(), Err(ResolverError::ShutDown));
        assert_eq!(ready(r.get("a")), Err(ResolverError::ShutDown));
        // The workers have exited: only the resolver itself still holds the shared state.
        assert_eq!(Arc::strong_count(&r.shared), 1);
        drop(r);
        assert_eq!(Arc::strong_count(&s), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn dropping_the_resolver_stops_workers() {
        let fake = FakeState {
            gated: true,
            ..Default::default()
        };
        let (r, s) = resolver(config(), fake);
        let pending = r.get("a");
        settle().await;
        assert_eq!(calls(&s), 1);
        let shared = Arc::downgrade(&r.shared);
        drop(r);
        assert_eq!(pending.wait().await, Err(ResolverError::ShutDown));
        settle().await;
        assert!(shared.upgrade().is_none(), "a worker still holds the state");
        assert_eq!(Arc::strong_count(&s), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn stale_entries_are_swept() {
        let (r, s) = resolver(config(), FakeState::default());
        s.fail.store(true, Ordering::SeqCst);
        assert!(r.resolve("failing").await.is_err());
        s.fail.store(false, Ordering::SeqCst);
        // A sweep runs when a `get` finds MIN_SWEEP entries: that is the next one.
        for i in 0..MIN_SWEEP - 1 {
            assert!(r.resolve(&format!("img{i}")).await.is_ok());
        }
        assert_eq!(r.shared.lock().entries.len(), MIN_SWEEP);
        // Every digest has expired; the failing key is still within its quiet period.
        advance(Duration::from_secs(11)).await;
        assert!(is_pending(&r.get("new")));
        let state = r.shared.lock();
        let mut keys: Vec<&str> = state.entries.keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(keys, vec!["failing", "new"]);
    }

    /// Issue 43: lookups at registries that never answer hold their own host's share of the
    /// workers; a lookup at a healthy registry starts at once, while they are all still held.
    /// (With one pool of four workers shared by every host, it waited for the stalls' deadline.)
    #[tokio::test(start_paused = true)]
    async fn stalling_hosts_do_not_hold_a_healthy_hosts_lookups() {
        let (r, s) = resolver(
            ResolverConfig {
                workers: 4,
                workers_per_host: 1,
                resolve_timeout: Duration::from_secs(60),
                ..config()
            },
            FakeState::default(),
        );
        let mut stalls = Vec::new();
        for host in ["silent", "slow-headers", "retry-after", "trickle"] {
            for i in 0..5 {
                stalls.push(r.get(&format!("{host}.hostile.test/hang{i}")));
            }
        }
        settle().await;
        assert_eq!(s.running.load(Ordering::SeqCst), 4, "one per stalling host");
        advance(Duration::from_secs(1)).await;
        let t0 = Instant::now();
        // Four stalling hosts take every worker here, one each: the healthy host waits its
        // turn, which comes when one of them times out.
        let good = r.get("registry.k8s.io/pause:3.10");
        assert!(is_pending(&good));
        assert_eq!(good.wait().await, digest("registry.k8s.io/pause:3.10"));
        assert_eq!(t0.elapsed(), Duration::from_secs(59));
        // With room for one more host than stall, it starts at once.
        let (r, s) = resolver(
            ResolverConfig {
                workers: 5,
                workers_per_host: 1,
                resolve_timeout: Duration::from_secs(60),
                ..config()
            },
            FakeState::default(),
        );
        for host in ["silent", "slow-headers", "retry-after", "trickle"] {
            for i in 0..5 {
                stalls.push(r.get(&format!("{host}.hostile.test/hang{i}")));
            }
        }
        settle().await;
        let t0 = Instant::now();
        assert_eq!(
            r.resolve("registry.k8s.io/pause:3.10").await,
            digest("registry.k8s.io/pause:3.10")
        );
        assert_eq!(t0.elapsed(), Duration::ZERO);
        assert_eq!(s.running.load(Ordering::SeqCst), 4, "the stalls still run");
        assert_eq!(
            r.shared.lock().in_progress(),
            20,
            "every stalling round pending"
        );
    }

    /// The per-host rate: a burst of lookups at one host does not use up another host's tokens.
    #[tokio::test(start_paused = true)]
    async fn each_host_has_its_own_rate() {
        let (r, s) = resolver(
            ResolverConfig {
                workers: 10,
                rate_per_sec: 1.0,
                burst: 1,
                ..config()
            },
            FakeState::default(),
        );
        for i in 0..3 {
            drop(r.get(&format!("busy/img{i}")));
        }
        settle().await;
        let t0 = Instant::now();
        assert!(r.resolve("quiet/img").await.is_ok());
        assert_eq!(t0.elapsed(), Duration::ZERO);
        advance(Duration::from_secs(3)).await;
        settle().await;
        assert_eq!(calls(&s), 4);
    }

    /// At most MAX_QUEUED rounds wait for a slot; the next fails at once, retriably, and the
    /// queue drains as the slot frees.
    #[tokio::test(start_paused = true)]
    async fn waiting_rounds_are_capped() {
        let fake = FakeState {
            gated: true,
            ..Default::default()
        };
        let (r, s) = resolver(
            ResolverConfig {
                workers: 1,
                ..config()
            },
            fake,
        );
        let first = r.get("h/held");
        settle().await;
        let mut queued = Vec::new();
        for i in 0..MAX_QUEUED {
            queued.push(r.get(&format!("h{}/img{i}", i % 7)));
        }
        settle().await;
        let err = r.resolve("late/img").await.unwrap_err();
        assert_eq!(err, ResolverError::QueueFull { limit: MAX_QUEUED });
        assert!(err.retriable());
        s.gate.add_permits(MAX_QUEUED + 1);
        assert!(first.wait().await.is_ok());
        for lookup in queued {
            assert!(lookup.wait().await.is_ok());
        }
        assert_eq!(r.shared.slots.stats().hosts, 0);
    }

    #[tokio::test]
    async fn bad_config_is_rejected() {
        let new = |c| Resolver::new(c, Fake(Arc::default())).err();
        let workers = ResolverConfig {
            workers: 0,
            ..config()
        };
        let rate = ResolverConfig {
            rate_per_sec: 0.0,
            ..config()
        };
        let burst = ResolverConfig {
            burst: 0,
            ..config()
        };
        let per_host = ResolverConfig {
            workers_per_host: 0,
            ..config()
        };
        assert_eq!(new(workers), Some(ConfigError::NoWorkers));
        assert_eq!(new(per_host), Some(ConfigError::NoWorkersPerHost));
        assert_eq!(new(rate), Some(ConfigError::BadRate(0.0)));
        assert_eq!(new(burst), Some(ConfigError::NoBurst));
        let slow = ResolverConfig {
            rate_per_sec: 1e-300,
            ..config()
        };
        assert_eq!(new(slow), Some(ConfigError::BadRate(1e-300)));
        let nan = ResolverConfig {
            rate_per_sec: f64::NAN,
            ..config()
        };
        assert!(matches!(new(nan), Some(ConfigError::BadRate(_))));
    }

    /// A lookup that panics completes its round with an error that is not `ShutDown`, backs
    /// off like any failure, and the worker goes on serving other keys. With one worker, a
    /// worker that died would leave every later key unanswered (or, once the queue's
    /// receiver went with it, answered "shut down").
    #[tokio::test(start_paused = true)]
    async fn a_panicking_lookup_fails_its_round_and_the_worker_goes_on() {
        let (r, s) = resolver(
            ResolverConfig {
                workers: 1,
                ..config()
            },
            FakeState::default(),
        );
        for round in 0..3 {
            let key = format!("panic{round}");
            let err = tokio::time::timeout(Duration::from_secs(1), r.resolve(&key))
                .await
                .expect("the round of a panicking lookup completes")
                .unwrap_err();
            assert!(
                matches!(&err, ResolverError::Panicked { message } if message.contains("overflow")),
                "{err:?}"
            );
            assert!(err.retriable());
            // Within its backoff window the key answers the same error from the cache.
            assert_eq!(ready(r.get(&key)), Err(err));
            // The single worker still serves the next key.
            assert_eq!(
                r.resolve(&format!("ok{round}")).await,
                digest(&format!("ok{round}"))
            );
        }
        assert_eq!(calls(&s), 6);
    }

    /// A lookup that never answers is cut off at `resolve_timeout`; its round fails with
    /// `TimedOut` (not `ShutDown`) and the worker serves the key queued behind it.
    #[tokio::test(start_paused = true)]
    async fn a_lookup_that_never_answers_times_out_and_the_worker_goes_on() {
        let (r, s) = resolver(
            ResolverConfig {
                workers: 1,
                resolve_timeout: Duration::from_secs(5),
                ..config()
            },
            FakeState::default(),
        );
        let start = Instant::now();
        let hung = r.get("hang");
        let behind = r.get("ok");
        assert!(is_pending(&hung) && is_pending(&behind));
        let err = tokio::time::timeout(Duration::from_secs(60), hung.wait())
            .await
            .expect("the round of a hung lookup completes")
            .unwrap_err();
        assert_eq!(
            err,
            ResolverError::TimedOut {
                after: Duration::from_secs(5)
            }
        );
        assert_eq!(start.elapsed(), Duration::from_secs(5));
        assert!(err.retriable());
        assert_eq!(behind.wait().await, digest("ok"));
        assert_eq!(calls(&s), 2);
        // The hung lookup was dropped, not left running: only the resolver holds the fake.
        settle().await;
        assert_eq!(
            s.running.load(Ordering::SeqCst),
            1,
            "the hung call never returned"
        );
        r.shutdown().await;
        drop(r);
        assert_eq!(Arc::strong_count(&s), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn huge_ttl_and_backoff_do_not_overflow() {
        let (r, s) = resolver(
            ResolverConfig {
                ttl: Duration::MAX,
                backoff_min: Duration::MAX,
                backoff_max: Duration::MAX,
                ..config()
            },
            FakeState::default(),
        );
        assert_eq!(r.resolve("ok").await, digest("ok"));
        assert_eq!(ready(r.get("ok")), digest("ok"));
        s.fail.store(true, Ordering::SeqCst);
        assert_eq!(r.resolve("bad").await, failed("bad"));
        assert_eq!(ready(r.get("bad")), failed("bad"));
    }
}
