//! containerd health: is containerd answering right now?
//!
//! A background monitor probes containerd (`Version`) every `probe_interval` while it answers,
//! and with exponential backoff (`reconnect_backoff_min` doubling to `reconnect_backoff_max`)
//! while it does not; each probe also re-dials the lazy channel, so this loop is what
//! reconnects remora after containerd restarts. `Status` probes on demand through the same
//! [`HealthMonitor::probe`], so RuntimeReady reflects containerd at the moment of the call, not
//! the last tick. State changes are logged once, on the transition.

use std::sync::Arc;
use std::time::Duration;

use slog::{info, warn, Logger};
use tokio::sync::watch;

use super::{ContainerdVersion, VersionApi};
use crate::backoff::Backoff;
use crate::containerd::error::ContainerdError;

/// What the last probe found.
#[derive(Debug, Clone)]
pub enum Health {
    /// No probe has finished yet.
    Unknown,
    /// containerd answered.
    Reachable(ContainerdVersion),
    /// containerd did not answer; the error says why.
    Unreachable(ContainerdError),
}

/// Probe pacing, from `[containerd]` in the config.
#[derive(Debug, Clone, Copy)]
pub struct ProbeSchedule {
    /// Bound on one probe.
    pub timeout: Duration,
    /// Period while reachable.
    pub interval: Duration,
    /// First retry delay while unreachable.
    pub backoff_min: Duration,
    /// Cap of the retry delay.
    pub backoff_max: Duration,
}

/// Probes containerd and publishes the result.
pub struct HealthMonitor {
    api: Arc<dyn VersionApi>,
    schedule: ProbeSchedule,
    state: watch::Sender<Health>,
    log: Logger,
}

impl HealthMonitor {
    /// A monitor in state [`Health::Unknown`]; nothing runs until [`HealthMonitor::run`].
    pub fn new(api: Arc<dyn VersionApi>, schedule: ProbeSchedule, log: Logger) -> Self {
        let (state, _) = watch::channel(Health::Unknown);
        Self {
            api,
            schedule,
            state,
            log,
        }
    }

    /// Watches the health state.
    pub fn subscribe(&self) -> watch::Receiver<Health> {
        self.state.subscribe()
    }

    /// Probes containerd now, records the result, and returns it.
    pub async fn probe(&self) -> Result<ContainerdVersion, ContainerdError> {
        let result = self.api.version(self.schedule.timeout).await;
        let next = match &result {
            Ok(v) => Health::Reachable(v.clone()),
            Err(e) => Health::Unreachable(e.clone()),
        };
        let log = &self.log;
        self.state.send_modify(|current| {
            match (&*current, &next) {
                (Health::Reachable(_), Health::Reachable(_)) => {}
                (Health::Unreachable(_), Health::Unreachable(_)) => {}
                (_, Health::Reachable(v)) => {
                    info!(log, "containerd is reachable"; "version" => &v.version, "revision" => &v.revision)
                }
                (_, Health::Unreachable(e)) => {
                    warn!(log, "containerd is unreachable; retrying with backoff"; "error" => %e)
                }
                (_, Health::Unknown) => {}
            }
            *current = next;
        });
        result
    }

    /// Probes until `shutdown` turns true (or its sender is dropped).
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut backoff = Backoff::new(self.schedule.backoff_min, self.schedule.backoff_max);
        loop {
            let delay = match self.probe().await {
                Ok(_) => {
                    backoff.reset();
                    self.schedule.interval
                }
                Err(_) => backoff.next_delay(),
            };
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
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

    #[tonic::async_trait]
    impl VersionApi for Scripted {
        async fn version(&self, _timeout: Duration) -> Result<ContainerdVersion, ContainerdError> {
            self.calls.lock().unwrap().push(Instant::now());
            let up = self.answers.lock().unwrap().pop_front().unwrap_or(true);
            if up {
                Ok(ContainerdVersion {
                    version: "v9".into(),
                    revision: "r".into(),
                })
            } else {
                Err(ContainerdError::Call {
                    address: "/c.sock".into(),
                    op: "Version.Version",
                    code: tonic::Code::Unavailable,
                    message: "connection refused".into(),
                })
            }
        }
    }

    fn schedule() -> ProbeSchedule {
        ProbeSchedule {
            timeout: Duration::from_secs(1),
            interval: Duration::from_secs(5),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_millis(500),
        }
    }

    fn logger() -> Logger {
        Logger::root(slog::Discard, slog::o!())
    }

    #[tokio::test(start_paused = true)]
    async fn backs_off_while_down_then_resets_to_interval() {
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
        // 100, 200, 400, then capped at 500, 500; up -> 5 s; up -> 5 s; down -> 100 (reset); up.
        assert_eq!(&gaps[..8], &[100, 200, 400, 500, 500, 5000, 5000, 100]);
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
