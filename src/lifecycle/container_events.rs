//! Lifecycle events for `GetContainerEvents`: every subscriber gets every event emitted after
//! it subscribed (a broadcast channel). A subscriber that falls more than [`CAPACITY`] events
//! behind has missed some: [`live`] then ends its stream with [`EventsLost`], so that the
//! client (kubelet's evented PLEG) relists instead of believing it saw every change.
//!
//! Exits that recovery records at start-up (containers that died while remora was down)
//! happened before anyone could subscribe to this remora: they are also kept in a backlog
//! that every subscriber connecting within [`BACKLOG_TTL`] of them receives first, once.

use std::sync::Mutex;
use std::time::Duration;

use futures_util::Stream;
use tokio::sync::broadcast;
use tokio::time::Instant;

use crate::store::sandbox::SandboxSnapshot;

/// Events buffered per subscriber.
pub const CAPACITY: usize = 1024;
/// How long recovered events are replayed to new subscribers (kubelet reconnects within
/// seconds of a runtime restart).
pub const BACKLOG_TTL: Duration = Duration::from_secs(120);

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// Created.
    Created,
    /// Started.
    Started,
    /// Stopped (exited).
    Stopped,
    /// Deleted.
    Deleted,
}

/// One event about a container or a pod sandbox (whose id is then the container id too).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LifecycleEvent {
    /// Container (or sandbox) id.
    pub id: String,
    /// The pod sandbox it belongs to.
    pub sandbox_id: String,
    /// What happened.
    pub kind: EventKind,
    /// When (ns since the epoch).
    pub at_ns: i64,
    /// For a removed sandbox's Deleted event: the sandbox as it was last, since it can no
    /// longer be looked up when the event is delivered. kubelet's evented PLEG drops an event
    /// without a pod status, and needs this one to forget the pod.
    pub removed_sandbox: Option<Box<SandboxSnapshot>>,
}

/// A subscriber fell behind by more than [`CAPACITY`] events: those are gone for it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{missed} container events were lost because the subscriber fell behind; relist and subscribe again")]
pub struct EventsLost {
    /// How many events it missed.
    pub missed: u64,
}

/// The events `rx` receives, until it falls behind: then one [`EventsLost`] and the end (the
/// events after a gap would describe changes the subscriber cannot place). Ends when the bus
/// is dropped.
pub fn live(
    rx: broadcast::Receiver<LifecycleEvent>,
) -> impl Stream<Item = Result<LifecycleEvent, EventsLost>> + Send + 'static {
    futures_util::stream::unfold(Some(rx), |rx| async move {
        let mut rx = rx?;
        match rx.recv().await {
            Ok(event) => Some((Ok(event), Some(rx))),
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                Some((Err(EventsLost { missed }), None))
            }
            Err(broadcast::error::RecvError::Closed) => None,
        }
    })
}

/// The event bus.
pub struct EventBus {
    tx: broadcast::Sender<LifecycleEvent>,
    /// Recovered events and when they were emitted; the lock also orders a subscription
    /// against [`EventBus::emit_recovered`], so none is both replayed and received live.
    backlog: Mutex<Vec<(Instant, LifecycleEvent)>>,
}

impl Default for EventBus {
    fn default() -> Self {
        let (tx, _) = broadcast::channel(CAPACITY);
        Self {
            tx,
            backlog: Mutex::new(Vec::new()),
        }
    }
}

impl EventBus {
    /// Publishes to current subscribers (none is fine).
    pub fn emit(&self, id: &str, sandbox_id: &str, kind: EventKind, at_ns: i64) {
        let _ = self.tx.send(LifecycleEvent {
            id: id.to_string(),
            sandbox_id: sandbox_id.to_string(),
            kind,
            at_ns,
            removed_sandbox: None,
        });
    }

    /// Publishes the Deleted event of a sandbox that was just removed, carrying its last state.
    pub fn emit_sandbox_removed(&self, last: SandboxSnapshot, at_ns: i64) {
        let id = last.metadata.id.clone();
        let _ = self.tx.send(LifecycleEvent {
            sandbox_id: id.clone(),
            id,
            kind: EventKind::Deleted,
            at_ns,
            removed_sandbox: Some(Box::new(last)),
        });
    }

    /// Publishes an event recovery found (an exit that happened while remora was down): to
    /// current subscribers, and to those that subscribe within [`BACKLOG_TTL`].
    pub fn emit_recovered(&self, id: &str, sandbox_id: &str, kind: EventKind, at_ns: i64) {
        let event = LifecycleEvent {
            id: id.to_string(),
            sandbox_id: sandbox_id.to_string(),
            kind,
            at_ns,
            removed_sandbox: None,
        };
        let mut backlog = self.backlog.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        backlog.retain(|(t, _)| now.duration_since(*t) < BACKLOG_TTL);
        backlog.push((now, event.clone()));
        let _ = self.tx.send(event);
    }

    /// A new subscription: the recovered events still in the backlog, then live events.
    pub fn subscribe(&self) -> (Vec<LifecycleEvent>, broadcast::Receiver<LifecycleEvent>) {
        let backlog = self.backlog.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let replay = backlog
            .iter()
            .filter(|(t, _)| now.duration_since(*t) < BACKLOG_TTL)
            .map(|(_, e)| e.clone())
            .collect();
        (replay, self.tx.subscribe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_subscriber_gets_events_after_subscribing() {
        let bus = EventBus::default();
        bus.emit("early", "p", EventKind::Created, 1);
        let (_, mut a) = bus.subscribe();
        let (_, mut b) = bus.subscribe();
        bus.emit("c1", "p", EventKind::Started, 2);
        for rx in [&mut a, &mut b] {
            let e = rx.recv().await.unwrap();
            assert_eq!((e.id.as_str(), e.kind), ("c1", EventKind::Started));
        }
    }

    #[tokio::test]
    async fn a_subscriber_that_falls_behind_gets_one_error_and_its_stream_ends() {
        use futures_util::StreamExt;
        let bus = EventBus::default();
        let (_, rx) = bus.subscribe();
        let mut events = Box::pin(live(rx));
        bus.emit("first", "p", EventKind::Created, 1);
        assert_eq!(events.next().await.unwrap().unwrap().id, "first");
        for i in 0..CAPACITY + 5 {
            bus.emit(&format!("c{i}"), "p", EventKind::Started, i as i64);
        }
        assert_eq!(
            events.next().await,
            Some(Err(EventsLost { missed: 5 })),
            "the gap is reported, not skipped"
        );
        assert_eq!(events.next().await, None, "and the stream ends there");
    }

    #[tokio::test]
    async fn the_live_stream_ends_with_the_bus() {
        use futures_util::StreamExt;
        let bus = EventBus::default();
        let (_, rx) = bus.subscribe();
        let mut events = Box::pin(live(rx));
        bus.emit("c", "p", EventKind::Stopped, 1);
        drop(bus);
        assert_eq!(events.next().await.unwrap().unwrap().id, "c");
        assert_eq!(events.next().await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn recovered_events_reach_late_subscribers_once_until_they_age_out() {
        let bus = EventBus::default();
        let (replay, mut early) = bus.subscribe();
        assert!(replay.is_empty());
        bus.emit_recovered("dead", "p", EventKind::Stopped, 7);
        let e = early.recv().await.unwrap();
        assert_eq!((e.id.as_str(), e.kind), ("dead", EventKind::Stopped));

        tokio::time::advance(Duration::from_secs(10)).await;
        let (replay, mut late) = bus.subscribe();
        assert_eq!(replay.len(), 1);
        assert_eq!((replay[0].id.as_str(), replay[0].at_ns), ("dead", 7));
        bus.emit("live", "p", EventKind::Started, 8);
        assert_eq!(late.recv().await.unwrap().id, "live", "not replayed twice");

        tokio::time::advance(BACKLOG_TTL).await;
        let (replay, _) = bus.subscribe();
        assert!(replay.is_empty(), "aged out");
    }

    #[tokio::test]
    async fn a_removed_sandbox_event_carries_its_last_state() {
        use crate::store::sandbox::{Sandbox, SandboxMetadata, SandboxStatus};
        let bus = EventBus::default();
        let (_, mut rx) = bus.subscribe();
        let sandbox = Sandbox::new(
            SandboxMetadata {
                id: "pod1".into(),
                ..Default::default()
            },
            SandboxStatus::default(),
        );
        bus.emit_sandbox_removed(sandbox.snapshot(), 9);
        let e = rx.recv().await.unwrap();
        assert_eq!(
            (e.id.as_str(), e.sandbox_id.as_str(), e.kind, e.at_ns),
            ("pod1", "pod1", EventKind::Deleted, 9)
        );
        assert_eq!(
            e.removed_sandbox.map(|s| s.metadata.id.clone()),
            Some("pod1".into())
        );
    }
}
