//! Events from the shim to containerd: in order, spooled to disk, never dropped.
//!
//! The shim tells containerd what happened to its tasks (TaskCreate, TaskStart, TaskExit,
//! TaskOOM, ...) by calling `containerd.services.events.ttrpc.v1.Events/Forward` on containerd's
//! ttrpc socket. [`Publisher::publish`] queues an event; one forwarding task delivers the queue,
//! head first, through a [`Forwarder`] ([`TtrpcForwarder`] in the shim).
//!
//! # Design rationale
//!
//! - **Never drop.** containerd's Go shim evicts an event after 5 requeues and the
//!   `containerd-shim` crate drops it after about 6 tries, so a containerd restart of more than
//!   ~20 s loses TaskExit / TaskOOM for good. Here a failed delivery keeps the event at the head
//!   of the queue and is retried with capped exponential backoff ([`BackoffLimits`]) for as long as containerd is
//!   away; the cap (1 s by default) bounds how late containerd's return is noticed. An error from
//!   the forwarder always means "not delivered, try again later".
//! - **One FIFO for the whole shim.** Order is kept per container and globally. There is a single
//!   destination, so the head-of-line blocking a single queue implies costs nothing: when the
//!   head cannot be delivered, nothing behind it could be either.
//! - **Spooled before the first send.** [`Publisher::publish`] appends the envelope to a spool
//!   file before it returns, so a shim that dies with undelivered events leaves them behind: the
//!   next shim on the same spool replays them first ([`Publisher::start`]), and containerd's
//!   `delete` of a dead shim delivers them ([`drain_spool`]).
//! - **Duplicates over loss.** The spool is append-only and truncated to zero whenever the queue
//!   drains; until then delivered events stay in it. A restart replays the whole file, so some
//!   events may reach containerd twice. Receivers treat task events idempotently (an exit is an
//!   exit), so that is the accepted trade for a format with no in-place updates.
//! - **No fsync.** The spool protects against the death of the shim *process*: written data sits
//!   in the page cache and survives it. A host crash takes the containers (and containerd's
//!   interest in their events) down with it, so paying an fsync per event would buy nothing.
//! - **Spool format.** Records `[u32 LE length][u32 LE CRC-32 (IEEE) of the bytes][Envelope
//!   protobuf bytes]`. Replay stops at the first incomplete or corrupt record (a write torn by a
//!   crash, zeros left by the filesystem), logs what it ignores, and cuts the file back to the
//!   good prefix so that new records do not land behind garbage.
//! - **A spool is untrusted input.** It is a file on disk that something other than this shim
//!   may have written or replaced. Replay reads at most [`MAX_SPOOL_LEN`] bytes and
//!   [`MAX_SPOOL_RECORDS`] records (what lies beyond is damage, logged and cut off), a length
//!   field is checked against [`MAX_RECORD_LEN`] before anything is sliced, and the file is
//!   opened with `O_NOFOLLOW`: a symlink planted in its place is refused, not followed to a
//!   file the shim would then truncate.
//! - **Spool write failures are not event failures.** A failed append (disk full) is logged once
//!   per failure streak; the event stays queued in memory. The next append rewrites the whole
//!   file from the in-memory queue, so once writes work again the spool is complete again.
//!
//! One spool file belongs to one publisher at a time: two live publishers on the same file
//! would truncate each other's records.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use containerd_shim_protos::events::task::{
    TaskCreate, TaskDelete, TaskExecAdded, TaskExecStarted, TaskExit, TaskOOM, TaskPaused,
    TaskResumed, TaskStart,
};
use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::protobuf::well_known_types::timestamp::Timestamp;
use containerd_shim_protos::protobuf::{Message, MessageField};
use containerd_shim_protos::shim::events::ForwardRequest;
use containerd_shim_protos::shim_async::{Client, EventsClient};
use containerd_shim_protos::topics;
use containerd_shim_protos::ttrpc;
use remora_host::backoff::Backoff;
use slog::{error, info, warn, Logger};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

/// The envelope `Events/Forward` carries (`containerd.types.Envelope`): timestamp, namespace,
/// topic and the event as an `Any`.
pub use containerd_shim_protos::shim::event::Envelope;

/// Errors opening, reading or removing a spool file.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// [`Publisher::start`] was called outside a tokio runtime, so the forwarding task has
    /// nowhere to run.
    #[error("starting the event publisher on {path}: not inside a tokio runtime")]
    NoRuntime {
        /// The spool the publisher was to use.
        path: PathBuf,
    },
    /// The spool file could not be opened or created.
    #[error("opening the event spool {path}")]
    OpenSpool {
        /// The spool file.
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The spool file could not be read.
    #[error("reading the event spool {path}")]
    ReadSpool {
        /// The spool file.
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A fully drained spool file could not be removed.
    #[error("removing the drained event spool {path}")]
    RemoveSpool {
        /// The spool file.
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One failed delivery of one event. Every variant means "not delivered, try again later".
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// containerd's ttrpc socket did not accept a connection (containerd down or restarting).
    #[error("connecting to containerd's ttrpc socket {address}")]
    Connect {
        /// The ttrpc address, with its `unix://` scheme.
        address: String,
        #[source]
        source: ttrpc::Error,
    },
    /// The `Events/Forward` call failed (connection lost, or containerd answered an error).
    #[error("Events/Forward to containerd at {address}")]
    Forward {
        /// The ttrpc address, with its `unix://` scheme.
        address: String,
        #[source]
        source: ttrpc::Error,
    },
    /// Connecting and forwarding together took longer than the forwarder's timeout.
    #[error("Events/Forward to containerd at {address}: no answer within {after:?}")]
    Timeout {
        /// The ttrpc address, with its `unix://` scheme.
        address: String,
        /// The timeout that passed.
        after: Duration,
    },
}

/// One delivery of one event to containerd.
#[async_trait::async_trait]
pub trait Forwarder: Send + Sync + 'static {
    /// Delivers `envelope`; an error means "not delivered, try again later".
    async fn forward(&self, envelope: &Envelope) -> Result<(), ForwardError>;
}

/// The real forwarder: containerd's `containerd.services.events.ttrpc.v1.Events/Forward` over
/// ttrpc at `address` (a plain socket path or `unix://path`, as containerd passes
/// `TTRPC_ADDRESS`). Connects lazily, drops the connection on any error and reconnects on the
/// next attempt; each call (connect included) is bounded by the timeout.
pub struct TtrpcForwarder {
    /// With its scheme: ttrpc's client refuses a bare path.
    address: String,
    timeout: Duration,
    /// The live connection, if any. A std mutex: it is never held across an await (the client
    /// is cloned out; clones share one connection).
    client: Mutex<Option<EventsClient>>,
}

impl TtrpcForwarder {
    /// A forwarder to containerd's ttrpc socket at `address`; each attempt gives up after
    /// `timeout` (containerd's shims use 5 s).
    pub fn new(address: String, timeout: Duration) -> Self {
        // containerd passes TTRPC_ADDRESS as a plain path; ttrpc wants a scheme.
        let address = if address.contains("://") {
            address
        } else {
            format!("unix://{address}")
        };
        TtrpcForwarder {
            address,
            timeout,
            client: Mutex::new(None),
        }
    }

    async fn attempt(&self, envelope: &Envelope) -> Result<(), ForwardError> {
        let cached = lock(&self.client).clone();
        let client = match cached {
            Some(client) => client,
            None => {
                let client = Client::connect(&self.address).await.map_err(|source| {
                    ForwardError::Connect {
                        address: self.address.clone(),
                        source,
                    }
                })?;
                let client = EventsClient::new(client);
                *lock(&self.client) = Some(client.clone());
                client
            }
        };
        let request = ForwardRequest {
            envelope: MessageField::some(envelope.clone()),
            ..Default::default()
        };
        client
            .forward(ttrpc::context::with_duration(self.timeout), &request)
            .await
            .map_err(|source| ForwardError::Forward {
                address: self.address.clone(),
                source,
            })?;
        Ok(())
    }
}

#[async_trait::async_trait]
impl Forwarder for TtrpcForwarder {
    async fn forward(&self, envelope: &Envelope) -> Result<(), ForwardError> {
        let result = match tokio::time::timeout(self.timeout, self.attempt(envelope)).await {
            Ok(result) => result,
            Err(_) => Err(ForwardError::Timeout {
                address: self.address.clone(),
                after: self.timeout,
            }),
        };
        if result.is_err() {
            // Whatever failed, the connection may be dead (containerd restarted): start afresh.
            *lock(&self.client) = None;
        }
        result
    }
}

/// The waits between failed attempts to deliver an event: a [`Backoff`] from `initial` up to
/// `max`, reset after a success.
#[derive(Debug, Clone, Copy)]
pub struct BackoffLimits {
    /// The wait after the first failure of a streak.
    pub initial: Duration,
    /// The longest wait; also the longest containerd's return can go unnoticed.
    pub max: Duration,
}

impl Default for BackoffLimits {
    /// 50 ms → 1 s: containerd's return must be noticed within a second.
    fn default() -> Self {
        BackoffLimits {
            initial: Duration::from_millis(50),
            max: Duration::from_secs(1),
        }
    }
}

impl BackoffLimits {
    /// A fresh schedule within these limits.
    fn backoff(&self) -> Backoff {
        Backoff::new(self.initial, self.max)
    }
}

/// Cheap to clone; all clones feed one ordered queue. Dropping the last clone stops the
/// forwarding task; what it had not delivered stays in the spool.
#[derive(Clone)]
pub struct Publisher {
    inner: Arc<Inner>,
}

/// Owned by the [`Publisher`] clones only (the task holds [`Shared`]), so that dropping the
/// last clone stops the task.
struct Inner {
    shared: Arc<Shared>,
    task: tokio::task::AbortHandle,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the publishers and the forwarding task share.
struct Shared {
    namespace: String,
    /// A std mutex: held for queue updates and spool writes only, never across an await.
    state: Mutex<State>,
    /// Wakes the forwarding task when it found the queue empty.
    wake: Notify,
    /// How many events were delivered so far (monotonic); `flush` waits on it.
    delivered: watch::Sender<u64>,
    log: Logger,
}

struct State {
    /// Undelivered events, oldest first; the head is the one being forwarded.
    queue: VecDeque<Arc<Envelope>>,
    /// Events ever queued (replayed ones included); with `delivered` it numbers the events.
    queued: u64,
    spool: Spool,
}

impl Publisher {
    /// Opens (creating) the spool file at `spool`, queues what it holds first (a previous
    /// shim's undelivered events, in order), and starts the forwarding task on the current
    /// tokio runtime.
    pub fn start(
        spool: PathBuf,
        namespace: String,
        forwarder: Arc<dyn Forwarder>,
        backoff: BackoffLimits,
        log: Logger,
    ) -> Result<Publisher, PublishError> {
        let runtime =
            tokio::runtime::Handle::try_current().map_err(|_| PublishError::NoRuntime {
                path: spool.clone(),
            })?;
        let (spool, replayed) = Spool::open(spool, &log)?;
        let queue: VecDeque<Arc<Envelope>> = replayed.into_iter().map(Arc::new).collect();
        if !queue.is_empty() {
            info!(log, "replaying undelivered events from the spool";
                "spool" => %spool.path.display(), "events" => queue.len());
        }
        let shared = Arc::new(Shared {
            namespace,
            state: Mutex::new(State {
                queued: queue.len() as u64,
                queue,
                spool,
            }),
            wake: Notify::new(),
            delivered: watch::Sender::new(0),
            log,
        });
        let task = runtime
            .spawn(forward_loop(shared.clone(), forwarder, backoff))
            .abort_handle();
        Ok(Publisher {
            inner: Arc::new(Inner { shared, task }),
        })
    }

    /// Queues one event: wrapped in an Envelope stamped with the time now, the namespace and
    /// `topic` (e.g. `containerd_shim_protos::topics::TASK_EXIT_EVENT_TOPIC`), the event packed
    /// as an `Any` whose type URL is the message's full protobuf name (e.g.
    /// `containerd.events.TaskExit`, what Go's typeurl produces and containerd's registry
    /// resolves), appended to the spool before it returns. Never blocks on containerd, never
    /// fails: a spool write error is logged (once per failure streak) and the event is still
    /// kept in memory.
    ///
    /// The spool append is a plain blocking `write` of a few hundred bytes into the page cache,
    /// done under the queue lock so that the file's order is the queue's order.
    pub fn publish<E: TaskEvent>(&self, event: &E) {
        let shared = &self.inner.shared;
        let topic = E::TOPIC;
        let envelope = match envelope(&shared.namespace, event) {
            Ok(envelope) => Arc::new(envelope),
            Err(e) => {
                // Only a proto2 message with unset required fields fails to encode; containerd's
                // events are proto3, so this does not happen with them.
                error!(shared.log, "event cannot be encoded, not published";
                    "topic" => topic, "error" => %e);
                return;
            }
        };
        {
            let mut state = lock(&shared.state);
            let state = &mut *state;
            state.queue.push_back(envelope);
            state.queued += 1;
            state.spool.append(&state.queue, &shared.log);
        }
        shared.wake.notify_one();
    }

    /// Waits until everything queued so far was delivered, or `within` passed; true when all
    /// delivered. Shutdown calls it.
    pub async fn flush(&self, within: Duration) -> bool {
        let shared = &self.inner.shared;
        let target = lock(&shared.state).queued;
        let mut delivered = shared.delivered.subscribe();
        let outcome = tokio::time::timeout(within, delivered.wait_for(|&n| n >= target)).await;
        matches!(outcome, Ok(Ok(_)))
    }

    /// Events queued and not yet delivered.
    pub fn pending(&self) -> usize {
        lock(&self.inner.shared.state).queue.len()
    }
}

/// The forwarding task: forwards the head until it goes through, then drops it.
async fn forward_loop(shared: Arc<Shared>, forwarder: Arc<dyn Forwarder>, limits: BackoffLimits) {
    let mut backoff = limits.backoff();
    // The failure streak in progress: when it began and how many attempts failed.
    let mut streak: Option<(Instant, u64)> = None;
    loop {
        let head = lock(&shared.state).queue.front().cloned();
        let Some(envelope) = head else {
            // notify_one keeps a permit when nobody waits, so a publish between the check above
            // and this await is not missed.
            shared.wake.notified().await;
            continue;
        };
        match forwarder.forward(&envelope).await {
            Ok(()) => {
                if let Some((since, attempts)) = streak.take() {
                    info!(shared.log, "delivering events to containerd again";
                        "failed_for" => ?since.elapsed(), "failed_attempts" => attempts,
                        "pending" => lock(&shared.state).queue.len());
                }
                backoff.reset();
                shared.delivered_head();
            }
            Err(e) => {
                match &mut streak {
                    Some((_, attempts)) => *attempts += 1,
                    None => {
                        warn!(shared.log, "event not delivered to containerd, retrying until it is";
                            "topic" => &envelope.topic, "error" => %e,
                            "pending" => lock(&shared.state).queue.len());
                        streak = Some((Instant::now(), 1));
                    }
                }
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    }
}

impl Shared {
    /// The head went through: drop it, compact the spool when nothing is left, tell `flush`.
    fn delivered_head(&self) {
        {
            let mut state = lock(&self.state);
            state.queue.pop_front();
            if state.queue.is_empty() {
                state.spool.clear(&self.log);
            }
        }
        self.delivered.send_modify(|n| *n += 1);
    }
}

/// Delivers what a spool left behind (a dead shim's), in order, within `within`; removes the
/// spool when all went through. Returns how many were delivered. The `delete` sub-command
/// uses it.
///
/// When `within` passes first, the spool is left as it is (a later drain would deliver the
/// delivered ones again, which is harmless) and the count so far is returned.
pub async fn drain_spool(
    spool: &Path,
    forwarder: Arc<dyn Forwarder>,
    within: Duration,
    log: &Logger,
) -> Result<usize, PublishError> {
    let deadline = Instant::now() + within;
    let opened = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(spool);
    let file = match opened {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(source) => {
            return Err(PublishError::ReadSpool {
                path: spool.to_path_buf(),
                source,
            })
        }
    };
    let replay = Replay::read(&file).map_err(|source| PublishError::ReadSpool {
        path: spool.to_path_buf(),
        source,
    })?;
    replay.log_damage(spool, log);
    let total = replay.envelopes.len();
    let limits = BackoffLimits::default();
    let mut backoff = limits.backoff();
    let mut failures = 0u64;
    for (delivered, envelope) in replay.envelopes.iter().enumerate() {
        loop {
            let outcome = tokio::time::timeout_at(deadline, forwarder.forward(envelope)).await;
            match outcome {
                Ok(Ok(())) => {
                    backoff.reset();
                    break;
                }
                Ok(Err(e)) => {
                    if failures == 0 {
                        warn!(log, "spooled event not delivered to containerd, retrying";
                            "spool" => %spool.display(), "topic" => &envelope.topic,
                            "error" => %e);
                    }
                    failures += 1;
                }
                Err(_) => {}
            }
            if Instant::now() + backoff.peek() >= deadline {
                warn!(log, "spooled events left undelivered at the deadline";
                    "spool" => %spool.display(), "delivered" => delivered,
                    "undelivered" => total - delivered, "failed_attempts" => failures);
                return Ok(delivered);
            }
            tokio::time::sleep(backoff.next_delay()).await;
        }
    }
    match std::fs::remove_file(spool) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(PublishError::RemoveSpool {
                path: spool.to_path_buf(),
                source,
            })
        }
    }
    if total > 0 {
        info!(log, "delivered the events a dead shim left in its spool";
            "spool" => %spool.display(), "events" => total, "failed_attempts" => failures);
    }
    Ok(total)
}

/// A task event the shim publishes: the topic it goes out on and the type URL containerd
/// looks it up by (Go's typeurl: the message's full proto name, with no
/// "type.googleapis.com/" prefix).
///
/// Both are named here rather than read from the message's descriptor: rust-protobuf makes a
/// descriptor by parsing the message's whole `.proto` file and every file it imports
/// (`descriptor.proto` with its comments among them), and keeps it for good: about 600 KiB of
/// heap in every shim, one shim per pod (docs/benchmarks.md, "The shim's memory"). A unit
/// test checks each name against the descriptor.
pub trait TaskEvent: Message {
    /// The topic, e.g. `/tasks/exit`.
    const TOPIC: &'static str;
    /// The full proto name, e.g. `containerd.events.TaskExit`.
    const TYPE_URL: &'static str;
}

macro_rules! task_events {
    ($($event:ident: $topic:ident,)*) => {
        $(impl TaskEvent for $event {
            const TOPIC: &'static str = topics::$topic;
            const TYPE_URL: &'static str = concat!("containerd.events.", stringify!($event));
        })*
    };
}

task_events! {
    TaskCreate: TASK_CREATE_EVENT_TOPIC,
    TaskStart: TASK_START_EVENT_TOPIC,
    TaskDelete: TASK_DELETE_EVENT_TOPIC,
    TaskExit: TASK_EXIT_EVENT_TOPIC,
    TaskOOM: TASK_OOM_EVENT_TOPIC,
    TaskExecAdded: TASK_EXEC_ADDED_EVENT_TOPIC,
    TaskExecStarted: TASK_EXEC_STARTED_EVENT_TOPIC,
    TaskPaused: TASK_PAUSED_EVENT_TOPIC,
    TaskResumed: TASK_RESUMED_EVENT_TOPIC,
}

/// Wraps `event` for `Events/Forward`.
fn envelope<E: TaskEvent>(
    namespace: &str,
    event: &E,
) -> Result<Envelope, containerd_shim_protos::protobuf::Error> {
    let any = Any {
        type_url: E::TYPE_URL.to_string(),
        value: event.write_to_bytes()?,
        ..Default::default()
    };
    Ok(Envelope {
        timestamp: MessageField::some(Timestamp::now()),
        namespace: namespace.to_string(),
        topic: E::TOPIC.to_string(),
        event: MessageField::some(any),
        ..Default::default()
    })
}

/// Locks `mutex`, ignoring poisoning: every critical section here leaves the data consistent
/// at each step (a push, a pop, a file write), so a panic in one does not corrupt it.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Length and checksum before each record's bytes.
const HEADER_LEN: usize = 8;

/// No envelope comes near this (ttrpc caps a message at 4 MiB); a larger length field is
/// corruption.
pub const MAX_RECORD_LEN: usize = 16 << 20;

/// The most bytes of a spool read back: two records of the largest size, or some hundred
/// thousand ordinary events (a few hundred bytes each), far more than containerd's absence
/// piles up. More is damage (or hostile), and is not read: the shim's memory stays bounded.
pub const MAX_SPOOL_LEN: u64 = 2 * MAX_RECORD_LEN as u64;

/// The most records replayed from one spool: each decoded envelope costs memory whatever its
/// size on disk (a 9-byte record decodes to a full envelope), so the count is bounded too.
pub const MAX_SPOOL_RECORDS: usize = 1 << 16;

/// The spool file, append-only between truncations.
struct Spool {
    path: PathBuf,
    /// Opened with O_APPEND: every write lands at the end, also right after a truncation.
    file: File,
    /// True while appends fail: the file may lack records (or end in a torn one), so the next
    /// append rewrites it whole from the queue.
    failing: bool,
}

impl Spool {
    /// Opens (creating) the spool, reads its complete records and cuts any damaged tail off.
    fn open(path: PathBuf, log: &Logger) -> Result<(Spool, Vec<Envelope>), PublishError> {
        // The spool holds the events of every container of the pod: the owner's alone, also
        // when an older shim left it with the umask's mode. A symlink in its place is refused,
        // not followed (replay may cut the file back).
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(0o600)
            .open(&path)
            .and_then(|f| {
                f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
                Ok(f)
            })
            .map_err(|source| PublishError::OpenSpool {
                path: path.clone(),
                source,
            })?;
        let replay = Replay::read(&file).map_err(|source| PublishError::ReadSpool {
            path: path.clone(),
            source,
        })?;
        replay.log_damage(&path, log);
        let mut spool = Spool {
            path,
            file,
            failing: false,
        };
        if replay.damage.is_some() {
            // New records must not land behind the damage, where replay would never reach them.
            if let Err(e) = spool.file.set_len(replay.good_len) {
                error!(log, "event spool cannot be cut back to its good records; rewriting it on the next event";
                    "spool" => %spool.path.display(), "error" => %e);
                spool.failing = true;
            }
        }
        Ok((spool, replay.envelopes))
    }

    /// Appends the last event of `queue`, or rewrites the whole file from `queue` after failures.
    fn append(&mut self, queue: &VecDeque<Arc<Envelope>>, log: &Logger) {
        let result = if self.failing {
            self.rewrite(queue)
        } else {
            match queue.back() {
                Some(last) => {
                    let mut record = Vec::new();
                    encode_record(last, &mut record).and_then(|()| self.file.write_all(&record))
                }
                None => Ok(()),
            }
        };
        match result {
            Ok(()) if self.failing => {
                info!(log, "event spool writable again, rewritten from memory";
                    "spool" => %self.path.display(), "events" => queue.len());
                self.failing = false;
            }
            Ok(()) => {}
            Err(e) => {
                if !self.failing {
                    error!(log, "event spool write failed; events are kept in memory and the spool is rewritten once writes work";
                        "spool" => %self.path.display(), "error" => %e);
                }
                self.failing = true;
            }
        }
    }

    /// Replaces the file's content with the records of `queue`.
    fn rewrite(&mut self, queue: &VecDeque<Arc<Envelope>>) -> std::io::Result<()> {
        let mut records = Vec::new();
        for envelope in queue {
            encode_record(envelope, &mut records)?;
        }
        self.file.set_len(0)?;
        self.file.write_all(&records)
    }

    /// Empties the file: the queue drained, everything in it was delivered.
    fn clear(&mut self, log: &Logger) {
        match self.file.set_len(0) {
            // An empty file matches the empty queue exactly, whatever failed before.
            Ok(()) => self.failing = false,
            // Not fatal: a restart would deliver the old records again, which is harmless.
            Err(e) => warn!(log, "event spool cannot be truncated after delivery";
                "spool" => %self.path.display(), "error" => %e),
        }
    }
}

/// Appends `envelope` as one spool record to `out`.
fn encode_record(envelope: &Envelope, out: &mut Vec<u8>) -> std::io::Result<()> {
    let bytes = envelope.write_to_bytes().map_err(std::io::Error::other)?;
    let len = u32::try_from(bytes.len())
        .ok()
        .filter(|&len| len as usize <= MAX_RECORD_LEN)
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("event envelope of {} bytes is too large", bytes.len()),
            )
        })?;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&crc32(&bytes).to_le_bytes());
    out.extend_from_slice(&bytes);
    Ok(())
}

/// What a spool's bytes hold.
struct Replay {
    /// The events of the complete, intact records, in order.
    envelopes: Vec<Envelope>,
    /// Bytes up to the end of the last good record.
    good_len: u64,
    /// Bytes after it, ignored, and why.
    damage: Option<(u64, &'static str)>,
    /// Intact records (checksum right) whose bytes are not an Envelope: skipped, since no retry
    /// can deliver them.
    undecodable: usize,
}

impl Replay {
    /// Reads and parses `file` from where it is, [`MAX_SPOOL_LEN`] bytes at most: a longer file
    /// is damaged from the cap on (or from the last good record before it).
    fn read(file: &File) -> std::io::Result<Replay> {
        let len = file.metadata()?.len();
        let want = len.min(MAX_SPOOL_LEN + 1);
        // Bounded by the cap: a length that lies (a file growing meanwhile) costs no more.
        let mut bytes = Vec::with_capacity(usize::try_from(want).unwrap_or(0));
        Read::take(file, MAX_SPOOL_LEN + 1).read_to_end(&mut bytes)?;
        let over = bytes.len() as u64 > MAX_SPOOL_LEN;
        if !over {
            return Ok(Replay::parse(&bytes));
        }
        // The record cut by the cap is incomplete, not corrupt: said as what it is.
        let mut replay = Replay::parse(&bytes[..MAX_SPOOL_LEN as usize]);
        let total = len.max(bytes.len() as u64);
        replay.damage = Some((
            total.saturating_sub(replay.good_len),
            "spool longer than the replay cap",
        ));
        Ok(replay)
    }

    fn parse(bytes: &[u8]) -> Replay {
        let mut replay = Replay {
            envelopes: Vec::new(),
            good_len: 0,
            damage: None,
            undecodable: 0,
        };
        let mut rest = bytes;
        while !rest.is_empty() {
            if replay.envelopes.len() + replay.undecodable >= MAX_SPOOL_RECORDS {
                replay.damage = Some((rest.len() as u64, "more records than a spool may hold"));
                break;
            }
            let reason = match record(rest) {
                Ok((body, tail)) => {
                    match Envelope::parse_from_bytes(body) {
                        Ok(envelope) => replay.envelopes.push(envelope),
                        Err(_) => replay.undecodable += 1,
                    }
                    replay.good_len += (rest.len() - tail.len()) as u64;
                    rest = tail;
                    continue;
                }
                Err(reason) => reason,
            };
            replay.damage = Some((rest.len() as u64, reason));
            break;
        }
        replay
    }

    fn log_damage(&self, path: &Path, log: &Logger) {
        if let Some((ignored, reason)) = self.damage {
            warn!(log, "event spool ends in a damaged record; ignoring the rest";
                "spool" => %path.display(), "offset" => self.good_len,
                "ignored_bytes" => ignored, "reason" => reason,
                "events_kept" => self.envelopes.len());
        }
        if self.undecodable > 0 {
            warn!(log, "event spool holds records that are not event envelopes; skipping them";
                "spool" => %path.display(), "records" => self.undecodable);
        }
    }
}

/// Splits one record off the front of `bytes`: its body and what follows, or why it is bad.
fn record(bytes: &[u8]) -> Result<(&[u8], &[u8]), &'static str> {
    let (header, rest) = bytes
        .split_first_chunk::<HEADER_LEN>()
        .ok_or("incomplete record header")?;
    let (len, sum) = header.split_at(4);
    // The slices are 4 bytes long by the split above.
    let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
    let sum = u32::from_le_bytes([sum[0], sum[1], sum[2], sum[3]]);
    // Zero-length records are never written: a run of zeros (a hole a crash left) would
    // otherwise parse as endless empty records with a matching checksum.
    if len == 0 || len > MAX_RECORD_LEN {
        return Err("impossible record length");
    }
    if rest.len() < len {
        return Err("incomplete record");
    }
    let (body, tail) = rest.split_at(len);
    if crc32(body) != sum {
        return Err("checksum mismatch");
    }
    Ok((body, tail))
}

/// CRC-32 (IEEE 802.3, as zlib and Go's `hash/crc32` compute it) lookup table.
const CRC_TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
};

/// CRC-32 of `data`; a table-driven loop is plenty for a few hundred bytes per event and spares
/// the shim a dependency.
fn crc32(data: &[u8]) -> u32 {
    !data.iter().fold(!0u32, |c, &b| {
        CRC_TABLE[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8)
    })
}

#[cfg(test)]
mod tests;
