//! The pull coalescer: concurrent requests for the same key share one unit of work.
//!
//! kubelet retries, several pods of one Deployment landing on a node at once, and `crictl pull`
//! racing kubelet all ask for the same image at the same time. Pulling it once per request
//! wastes registry quota (429s) and bandwidth, and concurrent writers of one blob fight over
//! containerd's content-store ref lock. So the first caller for a key becomes the *leader* and
//! starts the work; every concurrent caller for that key is a *follower* that waits for the
//! leader's result. The same type dedups blob downloads across different images (key = blob
//! digest), which is why it is generic.
//!
//! # Design rationale
//!
//! * **The work runs in a spawned task, not in the leader's future.** A CRI request future is
//!   dropped when its client disconnects or its deadline passes. If the leader polled the work
//!   itself, the leader going away would cancel the pull under every follower. Spawning makes
//!   the work independent of whichever caller happened to arrive first.
//! * **Waiters are counted; the work stops when nobody waits.** Spawning alone would leak work
//!   nobody wants (a 2 GB pull for a pod that was deleted). Each `run` future holds a guard;
//!   dropping the last guard cancels the work's [`CancellationToken`] (so it can stop cleanly:
//!   abort a content writer, release a lease) and, if the work has not finished within
//!   [`Coalescer::with_cancel_grace`], drops the work future outright. While at least one waiter
//!   remains the work continues untouched.
//! * **No negative caching.** The key is removed the moment the work finishes, success or not.
//!   Every waiter present at that moment gets the same `Ok` or the same `Err` (cloned); the next
//!   call starts fresh. Caching failures is the caller's policy (the digest resolver backs off
//!   per reference), not this type's: a registry blip must not poison later pulls, and the
//!   caller that retries is the one that knows whether the error is retriable.
//! * **Completion is published under the map lock, after removing the key.** So a caller that
//!   arrives after the result exists never joins the finished entry, and a caller that joined
//!   before always sees the result.
//!
//! # What the caller must put in the key
//!
//! Two requests may share work only if the work would be identical for both. For image pulls
//! the key is therefore (normalised reference — `nginx` and `docker.io/library/nginx:latest`
//! are one key —, platform, snapshotter, credential identity). The credential identity matters
//! for isolation: a caller without credentials must not receive a private image pulled with
//! someone else's, so use a stable hash of the auth config, never the secret itself. For blob
//! downloads the key is the blob digest (content addressing makes that complete).
//!
//! A cancelled work may still be winding down (within its grace) when a new call for the same
//! key starts a new leader; work must tolerate that (containerd's content writer reports the
//! ref as locked, which the caller treats as retriable).

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How long cancelled work may run after its token is cancelled before it is dropped.
pub const DEFAULT_CANCEL_GRACE: Duration = Duration::from_secs(5);

/// The result slot every waiter of one entry watches: `None` until the work finishes.
type Slot<V, E> = Option<Result<V, E>>;

/// Shares one in-flight unit of work per key among all concurrent callers.
///
/// Cloning is cheap and clones share the same in-flight map. See the [module docs](self) for
/// the semantics and what belongs in the key.
pub struct Coalescer<K, V, E> {
    inner: Arc<Inner<K, V, E>>,
}

struct Inner<K, V, E> {
    map: Mutex<Map<K, V, E>>,
    cancel_grace: Duration,
}

struct Map<K, V, E> {
    entries: HashMap<K, Entry<V, E>>,
    /// Distinguishes a key's successive entries, so a guard or publisher of a finished or
    /// cancelled entry never touches a newer entry for the same key.
    next_gen: u64,
}

struct Entry<V, E> {
    gen: u64,
    waiters: usize,
    token: CancellationToken,
    rx: watch::Receiver<Slot<V, E>>,
}

impl<K, V, E> Clone for Coalescer<K, V, E> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<K, V, E> Default for Coalescer<K, V, E>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    E: Clone + Send + Sync + 'static,
{
    fn default() -> Self {
        Self::new()
    }
}

impl<K, V, E> Inner<K, V, E> {
    /// Locks the map. A panic while the lock is held cannot leave it half-updated (every
    /// critical section is a single insert, remove or counter change), so a poisoned lock is
    /// still consistent and is recovered rather than propagated.
    fn lock(&self) -> MutexGuard<'_, Map<K, V, E>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<K, V, E> Coalescer<K, V, E>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    E: Clone + Send + Sync + 'static,
{
    /// An empty coalescer with [`DEFAULT_CANCEL_GRACE`].
    pub fn new() -> Self {
        Self::with_cancel_grace(DEFAULT_CANCEL_GRACE)
    }

    /// An empty coalescer whose abandoned work gets `grace` to react to its cancelled token
    /// before the work future is dropped.
    pub fn with_cancel_grace(grace: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                map: Mutex::new(Map {
                    entries: HashMap::new(),
                    next_gen: 0,
                }),
                cancel_grace: grace,
            }),
        }
    }

    /// Runs `work` for `key`, or joins the run already in flight for `key`, and returns its
    /// result.
    ///
    /// Only the first caller's `work` is invoked (with a token that is cancelled when every
    /// waiter has gone away); a follower's `work` is dropped unused. The work runs in a spawned
    /// task, so this must be called within a Tokio runtime, and dropping this future (even the
    /// leader's) only withdraws this caller.
    ///
    /// # Panics
    ///
    /// If the work panics, every waiter of that run panics too: there is no `E` to build from a
    /// panic, and a panic in the work is a bug. The key is removed, so a later call starts
    /// fresh.
    pub async fn run<F, Fut>(&self, key: K, work: F) -> Result<V, E>
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = Result<V, E>> + Send + 'static,
    {
        let (mut rx, _guard, leader) = {
            let mut map = self.inner.lock();
            if let Some(entry) = map.entries.get_mut(&key) {
                entry.waiters += 1;
                let guard = WaiterGuard::new(&self.inner, key.clone(), entry.gen);
                (entry.rx.clone(), guard, None)
            } else {
                let gen = map.next_gen;
                map.next_gen = map.next_gen.wrapping_add(1);
                let (tx, rx) = watch::channel(None);
                let token = CancellationToken::new();
                map.entries.insert(
                    key.clone(),
                    Entry {
                        gen,
                        waiters: 1,
                        token: token.clone(),
                        rx: rx.clone(),
                    },
                );
                let guard = WaiterGuard::new(&self.inner, key.clone(), gen);
                (rx, guard, Some((gen, tx, token)))
            }
        };

        // The leader's guard already exists: if `work` itself panics, the guard's drop removes
        // the entry and nobody is left waiting on a task that was never spawned.
        if let Some((gen, tx, token)) = leader {
            let fut = work(token.clone());
            let publisher = Publisher {
                inner: Arc::clone(&self.inner),
                key,
                gen,
                tx,
            };
            let grace = self.inner.cancel_grace;
            tokio::spawn(async move {
                let mut fut = std::pin::pin!(fut);
                tokio::select! {
                    biased;
                    result = &mut fut => publisher.publish(result),
                    () = token.cancelled() => {
                        // Nobody waits any more: give the work its grace to stop cleanly, then
                        // drop it. Its result, if any, has no one to go to.
                        let _ = tokio::time::timeout(grace, &mut fut).await;
                    }
                }
            });
        }

        loop {
            if let Some(result) = rx.borrow_and_update().as_ref() {
                return result.clone();
            }
            if rx.changed().await.is_err() {
                // The publisher is gone. It sends before it goes, so re-check once.
                if let Some(result) = rx.borrow().as_ref() {
                    return result.clone();
                }
                // Not cancellation: that happens only when no waiter is left, and we are one.
                // So the work task panicked (or its runtime is shutting down).
                panic!("coalesced work ended without a result (it panicked)");
            }
        }
    }

    /// Whether work for `key` is in flight.
    pub fn in_flight(&self, key: &K) -> bool {
        self.inner.lock().entries.contains_key(key)
    }

    /// How many callers are waiting for `key`'s in-flight work (0 if none is in flight).
    #[cfg(test)]
    pub fn waiters(&self, key: &K) -> usize {
        self.inner.lock().entries.get(key).map_or(0, |e| e.waiters)
    }
}

/// Held by each `run` future; dropping the last one for an entry cancels its work.
struct WaiterGuard<K: Hash + Eq, V, E> {
    inner: Arc<Inner<K, V, E>>,
    key: K,
    gen: u64,
}

impl<K: Hash + Eq, V, E> WaiterGuard<K, V, E> {
    fn new(inner: &Arc<Inner<K, V, E>>, key: K, gen: u64) -> Self {
        Self {
            inner: Arc::clone(inner),
            key,
            gen,
        }
    }
}

impl<K: Hash + Eq, V, E> Drop for WaiterGuard<K, V, E> {
    fn drop(&mut self) {
        let mut map = self.inner.lock();
        let Some(entry) = map.entries.get_mut(&self.key) else {
            return; // finished: the publisher removed it
        };
        if entry.gen != self.gen {
            return; // our entry finished and a new run for the key started since
        }
        entry.waiters -= 1;
        if entry.waiters == 0 {
            if let Some(entry) = map.entries.remove(&self.key) {
                entry.token.cancel();
            }
        }
    }
}

/// Owned by the work task: publishes the result, or on drop without a result (the work
/// panicked) removes the entry so waiters see the channel close and later calls start fresh.
struct Publisher<K: Hash + Eq, V, E> {
    inner: Arc<Inner<K, V, E>>,
    key: K,
    gen: u64,
    tx: watch::Sender<Slot<V, E>>,
}

impl<K: Hash + Eq, V, E> Publisher<K, V, E> {
    fn remove_entry(&self, map: &mut Map<K, V, E>) {
        if map
            .entries
            .get(&self.key)
            .is_some_and(|e| e.gen == self.gen)
        {
            map.entries.remove(&self.key);
        }
    }

    fn publish(self, result: Result<V, E>) {
        let mut map = self.inner.lock();
        self.remove_entry(&mut map);
        // Under the lock: whoever joined before the removal sees the result; whoever comes
        // after starts a new entry.
        self.tx.send_replace(Some(result));
        drop(map);
        // `self` drops here and runs `remove_entry` again: a no-op, the entry is gone.
    }
}

impl<K: Hash + Eq, V, E> Drop for Publisher<K, V, E> {
    fn drop(&mut self) {
        let mut map = self.inner.lock();
        self.remove_entry(&mut map);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::task::JoinSet;
    use tokio::time::{advance, sleep, Instant};

    type C = Coalescer<String, String, String>;

    /// Sets its flag when dropped: observes the work future being dropped.
    struct DropFlag(Arc<AtomicBool>);
    impl Drop for DropFlag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    fn key(s: &str) -> String {
        s.to_string()
    }

    /// Lets spawned tasks run until they all block (on a paused clock nothing else advances).
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn twenty_concurrent_runs_share_one_work() {
        let c = C::new();
        let calls = Arc::new(AtomicUsize::new(0));
        let mut set = JoinSet::new();
        for _ in 0..20 {
            let (c, calls) = (c.clone(), calls.clone());
            set.spawn(async move {
                c.run(key("img"), move |_| async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    sleep(Duration::from_secs(3)).await;
                    Ok::<_, String>("sha256:abc".to_string())
                })
                .await
            });
        }
        settle().await;
        assert_eq!(c.waiters(&key("img")), 20);
        let results = set.join_all().await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(results.len(), 20);
        assert!(results.iter().all(|r| r.as_deref() == Ok("sha256:abc")));
        assert!(!c.in_flight(&key("img")));
        assert_eq!(c.waiters(&key("img")), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn leader_failure_reaches_every_follower() {
        let c = C::new();
        let calls = Arc::new(AtomicUsize::new(0));
        let mut set = JoinSet::new();
        for _ in 0..5 {
            let (c, calls) = (c.clone(), calls.clone());
            set.spawn(async move {
                c.run(key("img"), move |_| async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    sleep(Duration::from_secs(1)).await;
                    Err::<String, _>("429 too many requests".to_string())
                })
                .await
            });
        }
        let results = set.join_all().await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert!(results
            .iter()
            .all(|r| *r == Err("429 too many requests".to_string())));
        assert!(!c.in_flight(&key("img")));
    }

    #[tokio::test(start_paused = true)]
    async fn dropped_leader_does_not_cancel_followers() {
        let c = C::new();
        let calls = Arc::new(AtomicUsize::new(0));
        let cancelled = Arc::new(AtomicBool::new(false));
        let work = {
            let (calls, cancelled) = (calls.clone(), cancelled.clone());
            move |token: CancellationToken| async move {
                calls.fetch_add(1, Ordering::SeqCst);
                tokio::select! {
                    () = sleep(Duration::from_secs(10)) => Ok("done".to_string()),
                    () = token.cancelled() => {
                        cancelled.store(true, Ordering::SeqCst);
                        Err("cancelled".to_string())
                    }
                }
            }
        };
        let leader = tokio::spawn({
            let c = c.clone();
            let work = work.clone();
            async move { c.run(key("img"), work).await }
        });
        settle().await;
        let mut followers = JoinSet::new();
        for _ in 0..3 {
            let (c, work) = (c.clone(), work.clone());
            followers.spawn(async move { c.run(key("img"), work).await });
        }
        settle().await;
        assert_eq!(c.waiters(&key("img")), 4);

        advance(Duration::from_secs(4)).await;
        leader.abort();
        assert!(leader.await.is_err_and(|e| e.is_cancelled()));
        assert_eq!(c.waiters(&key("img")), 3);
        assert!(c.in_flight(&key("img")));

        let results = followers.join_all().await;
        assert!(results.iter().all(|r| r.as_deref() == Ok("done")));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert!(!cancelled.load(Ordering::SeqCst));
    }

    #[tokio::test(start_paused = true)]
    async fn all_waiters_gone_cancels_the_work() {
        let c = C::new();
        let cancelled = Arc::new(AtomicBool::new(false));
        let dropped = Arc::new(AtomicBool::new(false));
        let mut handles = Vec::new();
        for _ in 0..3 {
            let (c, cancelled, dropped) = (c.clone(), cancelled.clone(), dropped.clone());
            handles.push(tokio::spawn(async move {
                c.run(key("img"), move |token: CancellationToken| async move {
                    let _flag = DropFlag(dropped);
                    token.cancelled().await;
                    cancelled.store(true, Ordering::SeqCst);
                    Err::<String, _>("cancelled".to_string())
                })
                .await
            }));
        }
        settle().await;
        assert_eq!(c.waiters(&key("img")), 3);

        // One goes: the work continues for the other two.
        handles[0].abort();
        settle().await;
        assert_eq!(c.waiters(&key("img")), 2);
        assert!(!cancelled.load(Ordering::SeqCst));

        for h in &handles[1..] {
            h.abort();
        }
        for h in handles {
            assert!(h.await.is_err_and(|e| e.is_cancelled()));
        }
        assert!(!c.in_flight(&key("img")));
        assert_eq!(c.waiters(&key("img")), 0);
        settle().await;
        assert!(cancelled.load(Ordering::SeqCst), "token was not cancelled");
        assert!(
            dropped.load(Ordering::SeqCst),
            "work future was not dropped"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn work_ignoring_its_token_is_dropped_after_the_grace() {
        let c = C::with_cancel_grace(Duration::from_secs(2));
        let dropped = Arc::new(AtomicBool::new(false));
        let waiter = tokio::spawn({
            let (c, dropped) = (c.clone(), dropped.clone());
            async move {
                c.run(key("img"), move |_| async move {
                    let _flag = DropFlag(dropped);
                    sleep(Duration::from_secs(3600)).await;
                    Ok::<_, String>("late".to_string())
                })
                .await
            }
        });
        settle().await;
        waiter.abort();
        assert!(waiter.await.is_err_and(|e| e.is_cancelled()));
        assert!(!c.in_flight(&key("img")));

        advance(Duration::from_millis(1900)).await;
        settle().await;
        assert!(!dropped.load(Ordering::SeqCst), "dropped before the grace");
        advance(Duration::from_millis(200)).await;
        settle().await;
        assert!(
            dropped.load(Ordering::SeqCst),
            "not dropped after the grace"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn different_keys_run_in_parallel() {
        let c = C::new();
        let start = Instant::now();
        let mut set = JoinSet::new();
        for k in ["a", "b", "c"] {
            let c = c.clone();
            set.spawn(async move {
                c.run(key(k), move |_| async move {
                    sleep(Duration::from_secs(5)).await;
                    Ok::<_, String>(k.to_string())
                })
                .await
            });
        }
        settle().await;
        for k in ["a", "b", "c"] {
            assert!(c.in_flight(&key(k)));
            assert_eq!(c.waiters(&key(k)), 1);
        }
        let mut results = set.join_all().await;
        results.sort();
        assert_eq!(
            results,
            vec![
                Ok("a".to_string()),
                Ok("b".to_string()),
                Ok("c".to_string())
            ]
        );
        assert_eq!(start.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn no_caching_after_completion() {
        let c = C::new();
        let calls = Arc::new(AtomicUsize::new(0));
        let work = |calls: Arc<AtomicUsize>| {
            move |_| async move {
                let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                if n == 1 {
                    Err(format!("attempt {n} failed"))
                } else {
                    Ok(format!("attempt {n}"))
                }
            }
        };
        assert_eq!(
            c.run(key("img"), work(calls.clone())).await,
            Err("attempt 1 failed".to_string())
        );
        assert!(!c.in_flight(&key("img")));
        assert_eq!(
            c.run(key("img"), work(calls.clone())).await,
            Ok("attempt 2".to_string())
        );
        assert_eq!(
            c.run(key("img"), work(calls.clone())).await,
            Ok("attempt 3".to_string())
        );
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn panicking_work_frees_the_key() {
        let c = C::new();
        let waiter = tokio::spawn({
            let c = c.clone();
            async move {
                c.run(key("img"), |_| async {
                    sleep(Duration::from_secs(1)).await;
                    panic!("bug in the work");
                    #[allow(unreachable_code)]
                    Ok::<String, String>(String::new())
                })
                .await
            }
        });
        assert!(waiter.await.is_err_and(|e| e.is_panic()));
        assert!(!c.in_flight(&key("img")));
        assert_eq!(
            c.run(key("img"), |_| async { Ok::<_, String>("ok".to_string()) })
                .await,
            Ok("ok".to_string())
        );
    }
}
