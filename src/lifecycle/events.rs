//! Lifecycle events for `GetContainerEvents`: every subscriber gets every event emitted after
//! it subscribed (a broadcast channel; a subscriber that falls more than [`CAPACITY`] events
//! behind skips the oldest, as kubelet's PLEG tolerates: it relists).

use tokio::sync::broadcast;

/// Events buffered per subscriber.
pub const CAPACITY: usize = 1024;

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
}

/// The event bus.
pub struct EventBus {
    tx: broadcast::Sender<LifecycleEvent>,
}

impl Default for EventBus {
    fn default() -> Self {
        let (tx, _) = broadcast::channel(CAPACITY);
        Self { tx }
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
        });
    }

    /// A new subscription.
    pub fn subscribe(&self) -> broadcast::Receiver<LifecycleEvent> {
        self.tx.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_subscriber_gets_events_after_subscribing() {
        let bus = EventBus::default();
        bus.emit("early", "p", EventKind::Created, 1);
        let mut a = bus.subscribe();
        let mut b = bus.subscribe();
        bus.emit("c1", "p", EventKind::Started, 2);
        for rx in [&mut a, &mut b] {
            let e = rx.recv().await.unwrap();
            assert_eq!((e.id.as_str(), e.kind), ("c1", EventKind::Started));
        }
    }
}
