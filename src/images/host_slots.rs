//! Fair shares of a node-wide budget of concurrent registry work (digest lookups, blob
//! downloads) among registry hosts.
//!
//! # Design rationale
//!
//! A registry a pod author names may stall: accept a connection and never answer, send its
//! headers a byte a second, or trickle a layer just above the stall floor. Work against such a
//! host holds its slot until a deadline ends it (`resolve_timeout` for a lookup, the layer
//! deadline for a download). With one shared pool of slots, a handful of stalling pulls held
//! every slot and a pull from a healthy registry queued behind them for the whole deadline.
//!
//! * **Two caps.** At most `per_host` slots go to one host, at most `total` to all hosts
//!   together (`per_host <= total`). A host never holds more than its share, so a healthy
//!   host finds a free slot at once unless `total / per_host` other hosts are all saturated at
//!   the same moment; past that, it waits its turn (below), not behind the whole queue. The
//!   bound is stated, not hidden: as many distinct stalling hosts as it takes to fill `total`
//!   slots delay everyone else, for at most one deadline (the first slot to free goes to the
//!   host that was waiting, not back to a stalling one).
//! * **Per-host queues, the least served host first.** Work that cannot start waits in its
//!   host's FIFO. When a slot frees it goes to the host, among those with waiters and below
//!   their cap, that holds the fewest slots, and among those to the one granted a slot longest
//!   ago (never counts as longest). So a host with a thousand queued lookups gets one slot per
//!   turn like a host with one, and a host that has been holding slots yields the next to one
//!   that has not.
//! * **Bounded.** A host's entry exists only while it holds a slot or has a waiter, so the map
//!   is no larger than the work in flight. The waiters across all hosts are
//!   capped at `max_waiting`: past it [`HostSlots::acquire`] fails at once with
//!   [`SlotsError::Full`] (retriable) instead of queueing without end. A pod author naming any
//!   number of hosts costs at most that many waiters.
//! * **Cancel safety.** A waiter that gives up (its future dropped) leaves a closed channel in
//!   its queue; it is skipped and counted out when it is reached, and a slot granted to it in
//!   the meantime comes back through the [`Permit`]'s `Drop`. A permit is returned by dropping
//!   it, whatever the holder's outcome — a failed or panicking holder cannot leak its slot.
//!
//! Grants are made under the lock and delivered after it is released, so a permit that bounces
//! (its waiter gone) re-enters [`release`](Shared::release) without deadlock.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;

/// Why a slot could not be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlotsError {
    /// `limit` requests already wait for a slot across all hosts. Retriable: the queue drains
    /// as work finishes.
    #[error("{limit} requests already wait for a registry slot (the limit); try again later")]
    Full {
        /// The cap on waiters.
        limit: usize,
    },
}

/// Settings of a [`HostSlots`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotsConfig {
    /// Slots held at once across all hosts (at least 1).
    pub total: usize,
    /// Slots one host may hold at once (at least 1; more than `total` counts as `total`).
    pub per_host: usize,
    /// Waiters queued at once across all hosts.
    pub max_waiting: usize,
}

/// Concurrency slots shared out per registry host. Cheap to clone (shared state).
#[derive(Clone)]
pub struct HostSlots {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    total: usize,
    per_host: usize,
    max_waiting: usize,
}

#[derive(Default)]
struct State {
    /// Slots held, all hosts.
    held: usize,
    /// Waiters queued, all hosts (closed ones included until they are found).
    waiting: usize,
    /// Hosts holding a slot or with a waiter.
    hosts: HashMap<String, HostQueue>,
    /// Grants so far: the clock of [`HostQueue::served`].
    grants: u64,
}

#[derive(Default)]
struct HostQueue {
    held: usize,
    waiters: VecDeque<oneshot::Sender<Permit>>,
    /// The value of [`State::grants`] at this host's last grant (0: none while it had an entry).
    served: u64,
}

/// What [`HostSlots::enter`] did.
enum Entered {
    Granted(Permit),
    Queued(oneshot::Receiver<Permit>),
}

/// One slot, returned when dropped.
pub struct Permit {
    shared: Arc<Shared>,
    host: String,
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit").field("host", &self.host).finish()
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.shared.release(&self.host);
    }
}

/// What the slots look like now (for metrics and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SlotStats {
    /// Slots held, all hosts.
    pub held: usize,
    /// Waiters queued, all hosts.
    pub waiting: usize,
    /// Hosts holding a slot or waiting for one.
    pub hosts: usize,
}

impl HostSlots {
    /// Slots with `config`'s caps (zeros count as one).
    pub fn new(config: SlotsConfig) -> Self {
        let total = config.total.max(1);
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                total,
                per_host: config.per_host.clamp(1, total),
                max_waiting: config.max_waiting,
            }),
        }
    }

    /// A slot for work against `host`: at once if the host is below its share and a slot is
    /// free, else after waiting its turn. Fails at once if `max_waiting` requests wait already.
    pub async fn acquire(&self, host: &str) -> Result<Permit, SlotsError> {
        loop {
            let rx = match self.enter(host)? {
                Entered::Granted(permit) => return Ok(permit),
                Entered::Queued(rx) => rx,
            };
            // A sender is dropped unsent only when it is found closed, which ours is not while
            // we wait here. Should that ever not hold, queue again rather than report a
            // failure that is not one.
            if let Ok(permit) = rx.await {
                return Ok(permit);
            }
        }
    }

    /// Takes a free slot of `host`, or queues for one.
    fn enter(&self, host: &str) -> Result<Entered, SlotsError> {
        let mut guard = self.shared.lock();
        let state = &mut *guard;
        let shared = &self.shared;
        let room = state.held < shared.total;
        let queue = state.hosts.entry(host.to_owned()).or_default();
        if queue.waiters.is_empty() && queue.held < shared.per_host && room {
            state.grants += 1;
            queue.held += 1;
            queue.served = state.grants;
            state.held += 1;
            return Ok(Entered::Granted(Permit {
                shared: Arc::clone(shared),
                host: host.to_owned(),
            }));
        }
        if state.waiting >= shared.max_waiting {
            state.prune_closed();
        }
        if state.waiting >= shared.max_waiting {
            state.forget_if_idle(host);
            return Err(SlotsError::Full {
                limit: shared.max_waiting,
            });
        }
        let (tx, rx) = oneshot::channel();
        state.waiting += 1;
        state
            .hosts
            .entry(host.to_owned())
            .or_default()
            .waiters
            .push_back(tx);
        Ok(Entered::Queued(rx))
    }

    /// Slots held and waiters now.
    pub fn stats(&self) -> SlotStats {
        let state = self.shared.lock();
        SlotStats {
            held: state.held,
            waiting: state.waiting,
            hosts: state.hosts.len(),
        }
    }
}

impl Shared {
    /// Locks the state. Every critical section leaves it consistent before anything that can
    /// panic (there is no user code under it), so a poisoned lock is recovered.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Returns `host`'s slot and hands free slots to the hosts whose turn it is.
    fn release(self: &Arc<Self>, host: &str) {
        let grants = {
            let mut state = self.lock();
            state.held = state.held.saturating_sub(1);
            if let Some(queue) = state.hosts.get_mut(host) {
                queue.held = queue.held.saturating_sub(1);
            }
            state.forget_if_idle(host);
            self.dispatch(&mut state)
        };
        // Outside the lock: a grant whose waiter is gone comes back through `Permit::drop`.
        for (tx, permit) in grants {
            let _ = tx.send(permit);
        }
    }

    /// Grants free slots, one at a time, to the host with waiters and below its cap that holds
    /// the fewest slots and was served longest ago, skipping waiters that went away. Each pass
    /// grants a slot or drops a gone waiter, so it ends; it scans the hosts with work, which
    /// are bounded by the slots and waiters.
    fn dispatch(self: &Arc<Self>, state: &mut State) -> Vec<(oneshot::Sender<Permit>, Permit)> {
        let mut grants = Vec::new();
        while state.held < self.total {
            let next = state
                .hosts
                .iter()
                .filter(|(_, q)| !q.waiters.is_empty() && q.held < self.per_host)
                .min_by_key(|(_, q)| (q.held, q.served))
                .map(|(host, _)| host.clone());
            let Some(host) = next else {
                break;
            };
            let State {
                hosts,
                waiting,
                held,
                grants: clock,
            } = &mut *state;
            let Some(queue) = hosts.get_mut(&host) else {
                break; // picked from this very map just now
            };
            let Some(tx) = queue.waiters.pop_front() else {
                break; // likewise: it had a waiter
            };
            *waiting -= 1;
            if tx.is_closed() {
                state.forget_if_idle(&host);
                continue;
            }
            *clock += 1;
            queue.served = *clock;
            queue.held += 1;
            *held += 1;
            grants.push((
                tx,
                Permit {
                    shared: Arc::clone(self),
                    host,
                },
            ));
        }
        grants
    }
}

impl State {
    /// Drops `host`'s entry if it holds nothing and nobody waits for it.
    fn forget_if_idle(&mut self, host: &str) {
        if self
            .hosts
            .get(host)
            .is_some_and(|q| q.held == 0 && q.waiters.is_empty())
        {
            self.hosts.remove(host);
        }
    }

    /// Drops every waiter that went away (only when the waiter cap is reached: O(waiters)).
    fn prune_closed(&mut self) {
        let mut dropped = 0;
        for queue in self.hosts.values_mut() {
            let before = queue.waiters.len();
            queue.waiters.retain(|w| !w.is_closed());
            dropped += before - queue.waiters.len();
        }
        self.waiting -= dropped;
        self.hosts
            .retain(|_, q| q.held > 0 || !q.waiters.is_empty());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::task::JoinSet;
    use tokio::time::{advance, Instant};

    fn slots(total: usize, per_host: usize) -> HostSlots {
        HostSlots::new(SlotsConfig {
            total,
            per_host,
            max_waiting: 100,
        })
    }

    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    /// Holds a slot of `host` for `hold`, then records (host, start, end) in `log`.
    fn work(
        set: &mut JoinSet<()>,
        slots: &HostSlots,
        host: &'static str,
        hold: Duration,
        log: &Arc<Mutex<Vec<(&'static str, Duration)>>>,
        t0: Instant,
    ) {
        let slots = slots.clone();
        let log = Arc::clone(log);
        set.spawn(async move {
            let _permit = slots.acquire(host).await.unwrap();
            log.lock().unwrap().push((host, t0.elapsed()));
            tokio::time::sleep(hold).await;
        });
    }

    /// The case of issue 43: stalling hosts hold their own share; a healthy host's work starts
    /// at once, not after the stalls' deadline.
    #[tokio::test(start_paused = true)]
    async fn a_healthy_host_never_waits_behind_stalling_hosts() {
        let s = slots(8, 2);
        let t0 = Instant::now();
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut set = JoinSet::new();
        // Three stalling hosts, ten lookups each, each held 60 s.
        for host in ["silent", "slow", "retry"] {
            for _ in 0..10 {
                work(&mut set, &s, host, Duration::from_secs(60), &log, t0);
            }
        }
        settle().await;
        assert_eq!(
            s.stats(),
            SlotStats {
                held: 6,
                waiting: 24,
                hosts: 3
            }
        );
        advance(Duration::from_secs(1)).await;
        // The healthy host: both its lookups start now, at 1 s.
        work(&mut set, &s, "good", Duration::from_millis(50), &log, t0);
        work(&mut set, &s, "good", Duration::from_millis(50), &log, t0);
        settle().await;
        let good: Vec<Duration> = log
            .lock()
            .unwrap()
            .iter()
            .filter(|(h, _)| *h == "good")
            .map(|(_, t)| *t)
            .collect();
        assert_eq!(good, vec![Duration::from_secs(1); 2]);
        set.abort_all();
    }

    #[tokio::test(start_paused = true)]
    async fn caps_hold_per_host_and_in_total() {
        let s = slots(3, 2);
        let t0 = Instant::now();
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut set = JoinSet::new();
        for _ in 0..3 {
            work(&mut set, &s, "a", Duration::from_secs(1), &log, t0);
        }
        for _ in 0..3 {
            work(&mut set, &s, "b", Duration::from_secs(1), &log, t0);
        }
        settle().await;
        // a: 2 (its cap), b: 1 (the total's rest).
        assert_eq!(s.stats().held, 3);
        set.join_all().await;
        let log = log.lock().unwrap();
        let starts = |h| {
            log.iter()
                .filter(|(x, _)| *x == h)
                .map(|(_, t)| t.as_secs())
                .collect::<Vec<_>>()
        };
        // When the first three end at 1 s, the slots go round the waiting hosts: a's last
        // one and b's other two (b below its cap again).
        assert_eq!(starts("a"), vec![0, 0, 1]);
        assert_eq!(starts("b"), vec![0, 1, 1]);
        assert_eq!(s.stats(), SlotStats::default());
    }

    /// A host with many queued requests gets one slot per turn, like a host with one, and the
    /// host not yet served goes first.
    #[tokio::test(start_paused = true)]
    async fn the_least_served_host_goes_first() {
        let s = slots(1, 1);
        let t0 = Instant::now();
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut set = JoinSet::new();
        for _ in 0..4 {
            work(&mut set, &s, "busy", Duration::from_secs(1), &log, t0);
        }
        settle().await;
        work(&mut set, &s, "other", Duration::from_secs(1), &log, t0);
        settle().await;
        set.join_all().await;
        let order: Vec<&str> = log.lock().unwrap().iter().map(|(h, _)| *h).collect();
        assert_eq!(order, vec!["busy", "other", "busy", "busy", "busy"]);
    }

    #[tokio::test(start_paused = true)]
    async fn waiters_are_capped_and_the_map_empties() {
        let s = HostSlots::new(SlotsConfig {
            total: 1,
            per_host: 1,
            max_waiting: 2,
        });
        let held = s.acquire("a").await.unwrap();
        let w1 = tokio::spawn({
            let s = s.clone();
            async move { s.acquire("b").await.map(drop) }
        });
        let w2 = tokio::spawn({
            let s = s.clone();
            async move { s.acquire("c").await.map(drop) }
        });
        settle().await;
        assert_eq!(
            s.acquire("d").await.unwrap_err(),
            SlotsError::Full { limit: 2 }
        );
        // A hostile pod author's thousand hosts: each refused, none remembered.
        for i in 0..1000 {
            assert!(s.acquire(&format!("h{i}")).await.is_err());
        }
        assert_eq!(s.stats().hosts, 3);
        drop(held);
        w1.await.unwrap().unwrap();
        w2.await.unwrap().unwrap();
        assert_eq!(s.stats(), SlotStats::default());
    }

    /// A waiter that gives up neither keeps its place nor swallows a slot.
    #[tokio::test(start_paused = true)]
    async fn a_cancelled_waiter_loses_nothing() {
        let s = slots(1, 1);
        let held = s.acquire("a").await.unwrap();
        let gone = tokio::spawn({
            let s = s.clone();
            async move { s.acquire("b").await.map(drop) }
        });
        settle().await;
        let next = tokio::spawn({
            let s = s.clone();
            async move { s.acquire("c").await.map(drop) }
        });
        settle().await;
        gone.abort();
        settle().await;
        drop(held);
        tokio::time::timeout(Duration::from_secs(1), next)
            .await
            .expect("c got the slot")
            .unwrap()
            .unwrap();
        assert_eq!(s.stats(), SlotStats::default());
    }

    /// A holder that fails (here: panics) still returns its slot.
    #[tokio::test(start_paused = true)]
    async fn a_failing_holder_returns_its_slot() {
        let s = slots(1, 1);
        let crash = tokio::spawn({
            let s = s.clone();
            async move {
                let _permit = s.acquire("a").await.unwrap();
                panic!("holder fails");
            }
        });
        assert!(crash.await.unwrap_err().is_panic());
        let permit = tokio::time::timeout(Duration::from_secs(1), s.acquire("b")).await;
        assert!(permit.is_ok_and(|p| p.is_ok()));
    }
}
