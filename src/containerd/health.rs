//! containerd health: is containerd answering right now?
//!
//! A background monitor probes containerd (`Version`) every `probe_interval` while it answers,
//! and every `down_probe_interval` (short and fixed, never grown) while it does not; each probe
//! also re-dials the lazy channel. A broken event stream makes it probe at once
//! ([`Reachability::suspect`]), so an outage is noticed in one round trip. The first answer
//! after an outage is published as a transition, and everything that waits out an outage (the
//! event subscription and its resync, exit monitors) wakes on it ([`Reachability::back`])
//! instead of on a timer that grew while containerd was away: how long containerd was gone
//! does not change how soon remora is back. `Status` probes on demand through the same
//! [`HealthMonitor::probe`], so RuntimeReady reflects containerd at the moment of the call, not
//! the last tick. State changes are logged once, on the transition, and published only then.

use std::sync::Arc;
use std::time::Duration;

use slog::{info, warn, Logger};
use tokio::sync::{watch, Notify};

use super::{ContainerdVersion, VersionApi};
use crate::backend_error::BackendError;

/// What the last probe found.
#[derive(Debug, Clone)]
pub enum Health {
    /// No probe has finished yet.
    Unknown,
    /// containerd answered.
    Reachable(ContainerdVersion),
    /// containerd did not answer; the error says why.
    Unreachable(BackendError),
}

/// Probe pacing, from `[containerd]` in the config.
#[derive(Debug, Clone, Copy)]
pub struct ProbeSchedule {
    /// Bound on one probe.
    pub timeout: Duration,
    /// Period while reachable.
    pub interval: Duration,
    /// Period while unreachable.
    pub down_interval: Duration,
}

/// Probes containerd and publishes the result.
pub struct HealthMonitor {
    api: Arc<dyn VersionApi>,
    schedule: ProbeSchedule,
    state: watch::Sender<Health>,
    suspect: Arc<Notify>,
    log: Logger,
}

/// A handle on containerd's reachability for those who wait out an outage.
#[derive(Clone)]
pub struct Reachability {
    rx: watch::Receiver<Health>,
    suspect: Arc<Notify>,
}

impl std::fmt::Debug for Reachability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reachability")
            .field("health", &*self.rx.borrow())
            .finish()
    }
}

impl Reachability {
    /// A handle that never reports containerd back (no monitor: tests, tools).
    pub fn never() -> Self {
        let (tx, rx) = watch::channel(Health::Unknown);
        // Dropped: `back` then waits forever, which is what "never" means.
        drop(tx);
        Self {
            rx,
            suspect: Arc::new(Notify::new()),
        }
    }

    /// Something failed as if containerd were gone: probe now rather than at the next tick.
    pub fn suspect(&self) {
        self.suspect.notify_one();
    }

    /// Forgets transitions published so far: [`Reachability::back`] waits for a later one.
    pub fn mark_seen(&mut self) {
        self.rx.borrow_and_update();
    }

    /// Resolves at the next transition to reachable not yet seen by this handle (containerd
    /// answering after it did not); pending forever without a monitor.
    pub async fn back(&mut self) {
        loop {
            if self.rx.changed().await.is_err() {
                return std::future::pending().await;
            }
            if matches!(*self.rx.borrow_and_update(), Health::Reachable(_)) {
                return;
            }
        }
    }
}

/// lifecycle's port, for exit monitors waiting out an outage.
#[async_trait::async_trait]
impl crate::lifecycle::backend::Reachability for Reachability {
    fn suspect(&self) {
        Reachability::suspect(self)
    }
    fn mark_seen(&mut self) {
        Reachability::mark_seen(self)
    }
    async fn back(&mut self) {
        Reachability::back(self).await
    }
    fn handle(&self) -> Box<dyn crate::lifecycle::backend::Reachability> {
        Box::new(self.clone())
    }
}

impl HealthMonitor {
    /// A monitor in state [`Health::Unknown`]; nothing runs until [`HealthMonitor::run`].
    pub fn new(api: Arc<dyn VersionApi>, schedule: ProbeSchedule, log: Logger) -> Self {
        let (state, _) = watch::channel(Health::Unknown);
        Self {
            api,
            schedule,
            state,
            suspect: Arc::new(Notify::new()),
            log,
        }
    }

    /// Watches the health state (woken on transitions only).
    pub fn subscribe(&self) -> watch::Receiver<Health> {
        self.state.subscribe()
    }

    /// A [`Reachability`] handle on this monitor; transitions before this call count as seen.
    pub fn reachability(&self) -> Reachability {
        Reachability {
            rx: self.state.subscribe(),
            suspect: self.suspect.clone(),
        }
    }

    /// Probes containerd now, records the result, and returns it.
    pub async fn probe(&self) -> Result<ContainerdVersion, BackendError> {
        let result = self.api.version(self.schedule.timeout).await;
        let next = match &result {
            Ok(v) => Health::Reachable(v.clone()),
            Err(e) => Health::Unreachable(e.clone()),
        };
        let log = &self.log;
        self.state.send_if_modified(|current| {
            let transition = match (&*current, &next) {
                (Health::Reachable(a), Health::Reachable(b)) => a != b,
                (Health::Unreachable(_), Health::Unreachable(_)) => false,
                (_, Health::Reachable(v)) => {
                    info!(log, "containerd is reachable"; "version" => &v.version, "revision" => &v.revision);
                    true
                }
                (_, Health::Unreachable(e)) => {
                    warn!(log, "containerd is unreachable; probing until it answers"; "error" => %e, "every_ms" => self.schedule.down_interval.as_millis() as u64);
                    true
                }
                (_, Health::Unknown) => false,
            };
            *current = next;
            transition
        });
        result
    }

    /// Probes until `shutdown` turns true (or its sender is dropped): every `interval` while
    /// containerd answers, every `down_interval` while it does not, and at once when suspected.
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        loop {
            let delay = match self.probe().await {
                Ok(_) => self.schedule.interval,
                Err(_) => self.schedule.down_interval,
            };
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = self.suspect.notified() => {}
                changed = shutdown.changed() => {
                    if changed.is_err() || *shutdown.borrow() {
                        return;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::sync::Mutex;
    use tokio::time::Instant;

    /// Answers from a script and records when it was asked.
    struct Scripted {
        answers: Mutex<VecDeque<bool>>,
        calls: Mutex<Vec<Instant>>,
    }

    impl Scripted {
        fn new(answers: &[bool]) -> Arc<Self> {
            Arc::new(Self {
                answers: Mutex::new(answers.iter().copied().collect()),
                calls: Mutex::new(Vec::new()),
            })
        }
    }

    #[async_trait::async_trait]
    impl VersionApi for Scripted {
        async fn version(&self, _timeout: Duration) -> Result<ContainerdVersion, BackendError> {
            self.calls.lock().unwrap().push(Instant::now());
            let up = self.answers.lock().unwrap().pop_front().unwrap_or(true);
            if up {
                Ok(ContainerdVersion {
                    version: "v9".into(),
                    revision: "r".into(),
                })
            } else {
                Err(BackendError::Call {
                    address: "/c.sock".into(),
                    op: "Version.Version",
                    code: crate::backend_error::BackendCode::Unavailable,
                    message: "connection refused".into(),
                })
            }
        }
    }

    fn schedule() -> ProbeSchedule {
        ProbeSchedule {
            timeout: Duration::from_secs(1),
            interval: Duration::from_secs(5),
            down_interval: Duration::from_millis(100),
        }
    }

    fn logger() -> Logger {
        Logger::root(slog::Discard, slog::o!())
    }

    #[tokio::test(start_paused = true)]
    async fn probes_on_a_fixed_short_interval_while_down_and_the_long_one_while_up() {
        // down x5, then up x2, then down, then up.
        let api = Scripted::new(&[false, false, false, false, false, true, true, false, true]);
        let monitor = Arc::new(HealthMonitor::new(api.clone(), schedule(), logger()));
        let (stop_tx, stop_rx) = watch::channel(false);
        let task = tokio::spawn(monitor.clone().run(stop_rx));
        // Enough virtual time for all nine probes and one more.
        tokio::time::sleep(Duration::from_secs(20)).await;
        stop_tx.send(true).unwrap();
        task.await.unwrap();

        let calls = api.calls.lock().unwrap().clone();
        let gaps: Vec<u128> = calls
            .windows(2)
            .map(|w| (w[1] - w[0]).as_millis())
            .collect();
        // Down: 100 ms each, however long it lasts (never grown); up -> 5 s; down -> 100.
        assert_eq!(&gaps[..8], &[100, 100, 100, 100, 100, 5000, 5000, 100]);
    }

    #[tokio::test(start_paused = true)]
    async fn containerd_back_after_any_outage_is_seen_within_one_down_interval() {
        // An outage of 60 s (600 failed probes), then containerd answers: `back` fires at the
        // first answer, at most one down interval after containerd returned, whatever the
        // outage's length (nothing grows while it is gone).
        let mut answers = vec![true];
        answers.extend(std::iter::repeat_n(false, 600));
        let api = Scripted::new(&answers);
        let monitor = Arc::new(HealthMonitor::new(api.clone(), schedule(), logger()));
        let mut reach = monitor.reachability();
        let (stop_tx, stop_rx) = watch::channel(false);
        let task = tokio::spawn(monitor.clone().run(stop_rx));
        // Up at 0; the stream breaks at 1 s: suspected, probed at once, found down.
        tokio::time::sleep(Duration::from_secs(1)).await;
        reach.mark_seen();
        reach.suspect();
        let started = Instant::now();
        reach.back().await;
        let back_after = started.elapsed();
        stop_tx.send(true).unwrap();
        task.await.unwrap();
        let calls = api.calls.lock().unwrap().clone();
        // The 602nd probe is the first answer; containerd returned after the 601st failed.
        assert_eq!(calls.len(), 602);
        let returned = calls[600];
        let seen = calls[601];
        assert!(seen - returned <= schedule().down_interval);
        assert!(back_after >= Duration::from_secs(59), "{back_after:?}");
        assert!(back_after <= Duration::from_secs(61), "{back_after:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn suspect_probes_at_once_and_only_transitions_wake_watchers() {
        let api = Scripted::new(&[true, true, false, false, true]);
        let monitor = Arc::new(HealthMonitor::new(api.clone(), schedule(), logger()));
        let mut rx = monitor.subscribe();
        let mut reach = monitor.reachability();
        let (stop_tx, stop_rx) = watch::channel(false);
        let task = tokio::spawn(monitor.clone().run(stop_rx));
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(
            rx.has_changed().unwrap(),
            "Unknown -> Reachable is a transition"
        );
        rx.borrow_and_update();
        reach.mark_seen();
        // A probe finding it up again is not a transition: nobody is woken.
        assert!(monitor.probe().await.is_ok());
        assert!(!rx.has_changed().unwrap());
        // Suspected: probed at once (not 5 s later), found down.
        reach.suspect();
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(api.calls.lock().unwrap().len(), 3);
        assert!(matches!(*rx.borrow_and_update(), Health::Unreachable(_)));
        // Down, then up 200 ms later: `back` fires then.
        let t = Instant::now();
        reach.back().await;
        assert_eq!(t.elapsed(), Duration::from_millis(199));
        stop_tx.send(true).unwrap();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn never_is_never_back() {
        let mut never = Reachability::never();
        never.suspect();
        assert!(
            tokio::time::timeout(Duration::from_millis(50), never.back())
                .await
                .is_err()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn probe_publishes_state() {
        let api = Scripted::new(&[false, true]);
        let monitor = HealthMonitor::new(api, schedule(), logger());
        let rx = monitor.subscribe();
        assert!(matches!(*rx.borrow(), Health::Unknown));
        assert!(monitor.probe().await.is_err());
        assert!(matches!(*rx.borrow(), Health::Unreachable(_)));
        let v = monitor.probe().await.unwrap();
        assert_eq!(v.version, "v9");
        assert!(matches!(*rx.borrow(), Health::Reachable(_)));
    }

    #[tokio::test(start_paused = true)]
    async fn stops_on_shutdown_signal() {
        let api = Scripted::new(&[]);
        let monitor = Arc::new(HealthMonitor::new(api.clone(), schedule(), logger()));
        let (stop_tx, stop_rx) = watch::channel(false);
        let task = tokio::spawn(monitor.run(stop_rx));
        tokio::time::sleep(Duration::from_millis(10)).await;
        stop_tx.send(true).unwrap();
        task.await.unwrap();
        assert_eq!(api.calls.lock().unwrap().len(), 1);
    }
}
