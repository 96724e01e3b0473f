//! Per-ID, order-preserving event handling with backoff.
//!
//! # Design
//! containerd's CRI handles events in one loop and parks a failed event in a backoff queue; a
//! slow handler there blocks every other container's events (containerd#11682). Here the loop
//! only dispatches: each ID (a container id, an image name) gets its own FIFO and, while that
//! FIFO is non-empty, one worker task draining it. So
//! - events for one ID are handled strictly in arrival order;
//! - a failing or slow event delays only later events of the *same* ID;
//! - each handling is bounded by a timeout (a hung handler counts as a failure);
//! - a failed event is retried after a delay that starts at `backoff_min` and doubles up to
//!   `backoff_max`; later events of that ID wait behind it (replay resumes in order from the
//!   first failure, and the delay resets once it succeeds);
//! - nothing is dropped: an event leaves its FIFO only after it was handled successfully.
//!
//! The FIFOs live in one mutex-guarded map; a worker removes its ID's entry, under the lock,
//! only when the FIFO is empty, so an event pushed concurrently either lands before removal
//! (and the worker handles it) or creates a new entry with a new worker — never lost.
//! Time is tokio's clock, so tests run on virtual time (`tokio::time::pause`).

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use remora_host::backoff::Backoff;

/// Why handling an event failed: the handler's own typed error, boxed so that one queue can
/// carry the errors of any handler (with their `source` chains).
pub type HandleError = Box<dyn std::error::Error + Send + Sync>;

/// A handling that did not finish within [`QueueConfig::timeout`].
#[derive(Debug, thiserror::Error)]
#[error("handling timed out after {0:?}")]
pub struct TimedOut(pub Duration);

/// Handles one event. Must be idempotent: after a timeout the same event is handled again.
pub trait Handler<E>: Send + Sync + 'static {
    /// Handles `event` for `id`; an error (or exceeding the timeout) schedules a retry.
    fn handle<'a>(
        &'a self,
        id: &'a str,
        event: &'a E,
    ) -> Pin<Box<dyn Future<Output = Result<(), HandleError>> + Send + 'a>>;
}

/// Retry and timeout settings.
#[derive(Debug, Clone, Copy)]
pub struct QueueConfig {
    /// Bound on one handling.
    pub timeout: Duration,
    /// First retry delay.
    pub backoff_min: Duration,
    /// Cap on the retry delay.
    pub backoff_max: Duration,
}

impl Default for QueueConfig {
    /// DESIGN's numbers: 10 s per handling, 1 s doubling to 5 min.
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(10),
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
        }
    }
}

/// Reports a failed handling: (id, attempt number, error text, delay before the retry).
pub type FailureHook = Arc<dyn Fn(&str, u32, &str, Duration) + Send + Sync>;

/// Reports a successful handling of an event (for counting, e.g. by topic).
pub type HandledHook<E> = Arc<dyn Fn(&E) + Send + Sync>;

/// One ID's waiting events, each with when it was queued.
struct Fifo<E> {
    events: VecDeque<(E, Instant)>,
    /// The head event failed and waits out its retry delay.
    in_backoff: bool,
}

/// The queue's state as the metrics see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueStats {
    /// Events waiting, the ones being handled or retried included.
    pub pending: usize,
    /// IDs whose head event failed and waits for its retry.
    pub ids_in_backoff: usize,
    /// How long the oldest waiting event has been queued (`None`: nothing waits).
    pub oldest_pending: Option<Duration>,
}

/// A weak handle on an [`OrderedQueue`]'s state: reads its [`QueueStats`] while it lives.
pub struct WeakQueue<E> {
    fifos: std::sync::Weak<Mutex<HashMap<String, Fifo<E>>>>,
}

impl<E> WeakQueue<E> {
    /// The queue's state, if the queue still exists.
    pub fn upgrade(&self) -> Option<QueueStatsReader<E>> {
        self.fifos.upgrade().map(|fifos| QueueStatsReader { fifos })
    }
}

/// Reads an [`OrderedQueue`]'s [`QueueStats`] (from [`WeakQueue::upgrade`]).
pub struct QueueStatsReader<E> {
    fifos: Arc<Mutex<HashMap<String, Fifo<E>>>>,
}

impl<E> QueueStatsReader<E> {
    /// Pending events, IDs in backoff and the oldest pending event's age, now.
    pub fn stats(&self) -> QueueStats {
        stats_of(&self.fifos)
    }
}

/// See [`QueueStatsReader::stats`].
fn stats_of<E>(fifos: &Mutex<HashMap<String, Fifo<E>>>) -> QueueStats {
    let now = Instant::now();
    let fifos = lock(fifos);
    let mut stats = QueueStats::default();
    for fifo in fifos.values() {
        stats.pending += fifo.events.len();
        stats.ids_in_backoff += usize::from(fifo.in_backoff);
        // Per ID, the head is the oldest: events are appended in arrival order.
        if let Some((_, queued)) = fifo.events.front() {
            let age = now.saturating_duration_since(*queued);
            stats.oldest_pending = Some(stats.oldest_pending.map_or(age, |a| a.max(age)));
        }
    }
    stats
}

/// The dispatcher. Cheap to clone (shared state).
pub struct OrderedQueue<E> {
    fifos: Arc<Mutex<HashMap<String, Fifo<E>>>>,
    handler: Arc<dyn Handler<E>>,
    config: QueueConfig,
    on_failure: Option<FailureHook>,
    on_handled: Option<HandledHook<E>>,
}

impl<E> Clone for OrderedQueue<E> {
    fn clone(&self) -> Self {
        Self {
            fifos: self.fifos.clone(),
            handler: self.handler.clone(),
            config: self.config,
            on_failure: self.on_failure.clone(),
            on_handled: self.on_handled.clone(),
        }
    }
}

impl<E: Clone + Send + Sync + 'static> OrderedQueue<E> {
    /// A queue handing events to `handler`.
    pub fn new(handler: Arc<dyn Handler<E>>, config: QueueConfig) -> Self {
        Self {
            fifos: Arc::new(Mutex::new(HashMap::new())),
            handler,
            config,
            on_failure: None,
            on_handled: None,
        }
    }

    /// A handle that does not keep the queue's state alive (for scrape-time metrics).
    pub fn downgrade(&self) -> WeakQueue<E> {
        WeakQueue {
            fifos: Arc::downgrade(&self.fifos),
        }
    }

    /// Calls `hook` on every successful handling.
    pub fn with_handled_hook(mut self, hook: HandledHook<E>) -> Self {
        self.on_handled = Some(hook);
        self
    }

    /// Pending events, IDs in backoff and the oldest pending event's age, now (the daemon
    /// reads them through [`OrderedQueue::downgrade`]).
    #[cfg(test)]
    pub fn stats(&self) -> QueueStats {
        stats_of(&self.fifos)
    }

    /// Calls `hook` on every failed handling (for logging where it is handled).
    pub fn with_failure_hook(mut self, hook: FailureHook) -> Self {
        self.on_failure = Some(hook);
        self
    }

    /// Queues `event` for `id`, starting a worker for the ID if none runs. Never blocks.
    pub fn push(&self, id: &str, event: E) {
        let start_worker = {
            let now = Instant::now();
            let mut fifos = lock(&self.fifos);
            match fifos.get_mut(id) {
                Some(fifo) => {
                    fifo.events.push_back((event, now));
                    false
                }
                None => {
                    fifos.insert(
                        id.to_string(),
                        Fifo {
                            events: VecDeque::from([(event, now)]),
                            in_backoff: false,
                        },
                    );
                    true
                }
            }
        };
        if start_worker {
            let me = self.clone();
            let id = id.to_string();
            tokio::spawn(async move { me.drain(id).await });
        }
    }

    /// Events waiting (including the one being handled) for `id`.
    #[cfg(test)]
    pub fn pending(&self, id: &str) -> usize {
        lock(&self.fifos).get(id).map_or(0, |f| f.events.len())
    }

    /// Total events waiting across all IDs.
    #[cfg(test)]
    pub fn pending_total(&self) -> usize {
        lock(&self.fifos).values().map(|f| f.events.len()).sum()
    }

    async fn drain(self, id: String) {
        let mut backoff = Backoff::new(self.config.backoff_min, self.config.backoff_max);
        let mut attempt: u32 = 0;
        loop {
            let next = lock(&self.fifos)
                .get(&id)
                .and_then(|f| f.events.front().map(|(e, _)| e.clone()));
            let Some(event) = next else {
                return;
            };
            let outcome =
                tokio::time::timeout(self.config.timeout, self.handler.handle(&id, &event)).await;
            let error = match outcome {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e),
                Err(_) => Some(HandleError::from(TimedOut(self.config.timeout))),
            };
            match error {
                None => {
                    attempt = 0;
                    backoff.reset();
                    if let Some(hook) = &self.on_handled {
                        hook(&event);
                    }
                    let mut fifos = lock(&self.fifos);
                    let empty = match fifos.get_mut(&id) {
                        Some(fifo) => {
                            fifo.events.pop_front();
                            fifo.in_backoff = false;
                            fifo.events.is_empty()
                        }
                        None => true,
                    };
                    if empty {
                        fifos.remove(&id);
                        return;
                    }
                }
                Some(err) => {
                    attempt += 1;
                    let delay = backoff.next_delay();
                    if let Some(hook) = &self.on_failure {
                        hook(&id, attempt, &err.to_string(), delay);
                    }
                    if let Some(fifo) = lock(&self.fifos).get_mut(&id) {
                        fifo.in_backoff = true;
                    }
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding this lock can only come from a bug in the few lines above that
    // hold it (no handler code runs under it); recover the data rather than poison every
    // later event.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    /// Records (id, event, time) of each attempt; fails events listed in `fail` the given number
    /// of times; sleeps `slow` for events listed there.
    #[derive(Default)]
    struct Recorder {
        attempts: Mutex<Vec<(String, u32, Duration)>>,
        handled: Mutex<Vec<(String, u32)>>,
        fail: Mutex<HashMap<u32, u32>>,
        slow: HashMap<u32, Duration>,
        start: Mutex<Option<Instant>>,
    }

    impl Handler<u32> for Recorder {
        fn handle<'a>(
            &'a self,
            id: &'a str,
            event: &'a u32,
        ) -> Pin<Box<dyn Future<Output = Result<(), HandleError>> + Send + 'a>> {
            Box::pin(async move {
                let t0 = *self.start.lock().unwrap().get_or_insert_with(Instant::now);
                self.attempts
                    .lock()
                    .unwrap()
                    .push((id.into(), *event, t0.elapsed()));
                if let Some(d) = self.slow.get(event) {
                    tokio::time::sleep(*d).await;
                }
                let mut fail = self.fail.lock().unwrap();
                if let Some(n) = fail.get_mut(event) {
                    if *n > 0 {
                        *n -= 1;
                        return Err(format!("event {event} fails").into());
                    }
                }
                self.handled.lock().unwrap().push((id.into(), *event));
                Ok(())
            })
        }
    }

    fn cfg() -> QueueConfig {
        QueueConfig {
            timeout: Duration::from_secs(10),
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
        }
    }

    async fn settle(q: &OrderedQueue<u32>, limit: Duration) {
        let t0 = Instant::now();
        while q.pending_total() > 0 {
            assert!(t0.elapsed() < limit, "queue did not drain");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn later_events_queue_behind_a_failing_one_and_replay_in_order() {
        let rec = Arc::new(Recorder::default());
        rec.fail.lock().unwrap().insert(1, 2); // event 1 fails twice
        let q = OrderedQueue::new(rec.clone(), cfg());
        q.push("c1", 1);
        q.push("c1", 2);
        q.push("c1", 3);
        settle(&q, Duration::from_secs(60)).await;
        let handled = rec.handled.lock().unwrap().clone();
        assert_eq!(
            handled,
            vec![("c1".into(), 1), ("c1".into(), 2), ("c1".into(), 3)]
        );
        // Attempts of event 1 at 0 s, 1 s, 3 s (delays 1 s then 2 s); 2 and 3 only after.
        let attempts = rec.attempts.lock().unwrap().clone();
        let times: Vec<(u32, u64)> = attempts.iter().map(|(_, e, t)| (*e, t.as_secs())).collect();
        assert_eq!(times, vec![(1, 0), (1, 1), (1, 3), (2, 3), (3, 3)]);
    }

    #[tokio::test(start_paused = true)]
    async fn stats_show_ids_in_backoff_and_the_oldest_events_age() {
        let rec = Arc::new(Recorder::default());
        rec.fail.lock().unwrap().insert(1, 1); // event 1 fails once: retried after 1 s
        let handled = Arc::new(Mutex::new(Vec::new()));
        let seen = handled.clone();
        let q = OrderedQueue::new(rec.clone(), cfg())
            .with_handled_hook(Arc::new(move |e: &u32| seen.lock().unwrap().push(*e)));
        assert_eq!(q.stats(), QueueStats::default());
        q.push("c1", 1);
        q.push("c1", 2);
        q.push("c2", 7);
        // Let the workers run their first attempts (virtual time stands still meanwhile).
        while rec.attempts.lock().unwrap().len() < 2 {
            tokio::task::yield_now().await;
        }
        tokio::time::advance(Duration::from_millis(400)).await;
        let stats = q.stats();
        assert_eq!(stats.pending, 2, "{stats:?}");
        assert_eq!(stats.ids_in_backoff, 1, "{stats:?}");
        assert_eq!(stats.oldest_pending, Some(Duration::from_millis(400)));
        settle(&q, Duration::from_secs(10)).await;
        assert_eq!(q.stats(), QueueStats::default());
        let mut handled = handled.lock().unwrap().clone();
        handled.sort_unstable();
        assert_eq!(handled, vec![1, 2, 7]);
    }

    #[tokio::test(start_paused = true)]
    async fn partial_replay_stops_at_the_first_failure_with_doubled_delay() {
        let rec = Arc::new(Recorder::default());
        rec.fail.lock().unwrap().insert(1, 1);
        rec.fail.lock().unwrap().insert(2, 2);
        let q = OrderedQueue::new(rec.clone(), cfg());
        q.push("c1", 1);
        q.push("c1", 2);
        q.push("c1", 3);
        settle(&q, Duration::from_secs(60)).await;
        let attempts = rec.attempts.lock().unwrap().clone();
        let times: Vec<(u32, u64)> = attempts.iter().map(|(_, e, t)| (*e, t.as_secs())).collect();
        // 1 fails at 0, retried at 1 (ok); 2 fails at 1 (delay reset to 1 s after 1's
        // success), again at 2 (delay 2 s), succeeds at 4; then 3.
        assert_eq!(times, vec![(1, 0), (1, 1), (2, 1), (2, 2), (2, 4), (3, 4)]);
        assert_eq!(rec.handled.lock().unwrap().len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn delay_doubles_up_to_the_cap() {
        let rec = Arc::new(Recorder::default());
        rec.fail.lock().unwrap().insert(7, 12);
        let q = OrderedQueue::new(rec.clone(), cfg());
        q.push("c1", 7);
        settle(&q, Duration::from_secs(3600)).await;
        let attempts = rec.attempts.lock().unwrap().clone();
        let gaps: Vec<u64> = attempts
            .windows(2)
            .map(|w| (w[1].2 - w[0].2).as_secs())
            .collect();
        assert_eq!(gaps, vec![1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_handler_times_out_and_is_retried() {
        let rec = Arc::new(Recorder {
            slow: HashMap::from([(5, Duration::from_secs(3600))]),
            ..Default::default()
        });
        let q = OrderedQueue::new(
            rec.clone(),
            QueueConfig {
                timeout: Duration::from_secs(10),
                ..cfg()
            },
        );
        q.push("c1", 5);
        tokio::time::sleep(Duration::from_secs(24)).await;
        let attempts = rec.attempts.lock().unwrap().clone();
        let times: Vec<u64> = attempts.iter().map(|a| a.2.as_secs()).collect();
        // 0 → times out at 10 → retry at 11 → times out at 21 → retry at 23.
        assert_eq!(times, vec![0, 11, 23]);
        assert_eq!(q.pending("c1"), 1, "the event is kept, not dropped");
    }

    #[tokio::test(start_paused = true)]
    async fn one_ids_failures_do_not_delay_other_ids() {
        let rec = Arc::new(Recorder {
            slow: HashMap::from([(1, Duration::from_secs(3600))]),
            ..Default::default()
        });
        let q = OrderedQueue::new(rec.clone(), cfg());
        q.push("stuck", 1);
        for i in 0..50u32 {
            q.push(&format!("c{i}"), 100 + i);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
        let handled = rec.handled.lock().unwrap().clone();
        assert_eq!(
            handled.len(),
            50,
            "the 50 other IDs were handled while 'stuck' hangs"
        );
        assert!(rec
            .attempts
            .lock()
            .unwrap()
            .iter()
            .filter(|a| a.1 != 1)
            .all(|a| a.2 == Duration::ZERO));
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_is_dropped_under_interleaved_pushes() {
        let rec = Arc::new(Recorder::default());
        for e in (0..200u32).step_by(7) {
            rec.fail.lock().unwrap().insert(e, 1);
        }
        let q = OrderedQueue::new(rec.clone(), cfg());
        for e in 0..200u32 {
            q.push(&format!("c{}", e % 5), e);
            if e % 13 == 0 {
                tokio::time::sleep(Duration::from_millis(700)).await;
            }
        }
        settle(&q, Duration::from_secs(600)).await;
        let handled = rec.handled.lock().unwrap().clone();
        assert_eq!(handled.len(), 200);
        for id in 0..5u32 {
            let mine: Vec<u32> = handled
                .iter()
                .filter(|(i, _)| *i == format!("c{id}"))
                .map(|(_, e)| *e)
                .collect();
            let mut sorted = mine.clone();
            sorted.sort();
            assert_eq!(mine, sorted, "per-ID order kept for c{id}");
        }
    }
}
