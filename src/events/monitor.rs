//! The event monitor loop: one subscription to containerd, events dispatched per subject into
//! the [`OrderedQueue`](super::queue::OrderedQueue); re-subscribe when the stream breaks, and
//! resync after every (re)subscription so nothing that happened in a gap is missed.
//!
//! Re-subscription is driven by containerd's return, not by a timer: a broken stream asks the
//! health monitor to probe at once ([`Reachability::suspect`]), and the first probe that finds
//! containerd answering again wakes this loop ([`Reachability::back`]), however long the
//! outage was. The backoff (`backoff_min` doubling to `backoff_max`) only paces retries while
//! containerd answers probes but subscribing still fails.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use slog::{info, warn, Logger};
use tokio::sync::watch;
use tokio_stream::StreamExt;

use super::queue::{HandleError, Handler, OrderedQueue};
use crate::backend_error::BackendError;
use crate::containerd::event_stream::{Event, EventStream};
use crate::images::backend::{Content, Images};
use crate::images::pull::load_image;
use crate::images::store::ImageIndex;
use crate::lifecycle::backend::Reachability;
use remora_host::backoff::Backoff;

/// Where events come from (containerd; fakes in tests).
#[async_trait::async_trait]
pub trait EventSource: Send + Sync + 'static {
    /// A stream of events whose topic starts with one of `topics`, in remora's namespace.
    async fn subscribe(&self, topics: &[&str]) -> Result<EventStream, BackendError>;
}

#[async_trait::async_trait]
impl EventSource for crate::containerd::Client {
    async fn subscribe(&self, topics: &[&str]) -> Result<EventStream, BackendError> {
        crate::containerd::Client::subscribe(self, topics).await
    }
}

/// Rebuilds state from containerd after (re)subscribing.
pub type Resync = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// What to subscribe to, and how to retry.
#[derive(Debug, Clone)]
pub struct Subscription {
    /// Topic prefixes, e.g. `/images/`.
    pub topics: Vec<&'static str>,
    /// Only events of this containerd namespace are dispatched.
    pub namespace: String,
    /// First re-subscribe delay while containerd answers.
    pub backoff_min: Duration,
    /// Cap of the re-subscribe delay.
    pub backoff_max: Duration,
    /// containerd's comings and goings, from the health monitor.
    pub reachability: Box<dyn Reachability>,
    /// Counts re-established streams (`remora_containerd_reconnects_total`).
    pub metrics: crate::metrics::Metrics,
}

/// Runs until `shutdown` turns true: subscribe, resync, dispatch; on a broken stream, start
/// over as soon as containerd is back (or after the backoff, if it never left). `ready` fires once the first
/// resync completed, or the first subscription failed (containerd is not there: nothing to
/// rebuild from yet; the resync runs when it comes).
pub async fn run(
    source: Arc<dyn EventSource>,
    sub: Subscription,
    queue: OrderedQueue<Event>,
    resync: Resync,
    mut shutdown: watch::Receiver<bool>,
    log: Logger,
    ready: Option<tokio::sync::oneshot::Sender<()>>,
) {
    let mut ready = ready;
    let mut delay = Backoff::new(sub.backoff_min, sub.backoff_max);
    let (topics, namespace, mut reach) = (sub.topics, sub.namespace, sub.reachability);
    let metrics = sub.metrics;
    let mut was_down = false;
    loop {
        if *shutdown.borrow() {
            return;
        }
        let subscribed = tokio::select! {
            s = source.subscribe(&topics) => s,
            changed = shutdown.changed() => {
                if changed.is_err() || *shutdown.borrow() {
                    return;
                }
                continue;
            }
        };
        match subscribed {
            Ok(mut stream) => {
                // Transitions until now are behind us: the next `back` is a new outage's end.
                reach.mark_seen();
                if std::mem::take(&mut was_down) {
                    metrics.containerd_reconnect();
                    info!(log, "event stream re-established; resyncing");
                }
                delay.reset();
                resync().await;
                if let Some(r) = ready.take() {
                    let _ = r.send(());
                }
                loop {
                    tokio::select! {
                        item = stream.next() => match item {
                            Some(Ok(env)) => {
                                if env.namespace != namespace {
                                    continue;
                                }
                                if let Some(subject) = env.event.subject().map(str::to_string) {
                                    queue.push(&subject, env.event);
                                }
                            }
                            Some(Err(e)) => {
                                warn!(log, "event stream broke; re-subscribing"; "error" => %e);
                                was_down = true;
                                reach.suspect();
                                break;
                            }
                            None => {
                                warn!(log, "event stream ended; re-subscribing");
                                was_down = true;
                                reach.suspect();
                                break;
                            }
                        },
                        changed = shutdown.changed() => {
                            if changed.is_err() || *shutdown.borrow() {
                                return;
                            }
                        }
                    }
                }
            }
            Err(e) => {
                if !was_down {
                    warn!(log, "cannot subscribe to containerd events; retrying when containerd answers"; "error" => %e);
                }
                was_down = true;
                reach.suspect();
                if let Some(r) = ready.take() {
                    let _ = r.send(());
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(delay.next_delay()) => {}
            _ = reach.back() => {}
            changed = shutdown.changed() => {
                if changed.is_err() || *shutdown.borrow() {
                    return;
                }
            }
        }
    }
}

/// Keeps the image index in step with containerd's image records (`/images/` events).
pub struct ImageEvents {
    /// Image records.
    pub images: Arc<dyn Images>,
    /// Content store (to read manifests and configs).
    pub content: Arc<dyn Content>,
    /// The index.
    pub index: Arc<ImageIndex>,
    /// Platform OS.
    pub os: String,
    /// Platform architecture.
    pub architecture: String,
}

/// Why an image record could not be re-read into the index.
#[derive(Debug, thiserror::Error)]
pub enum RefreshError {
    /// containerd failed.
    #[error(transparent)]
    Containerd(#[from] BackendError),
    /// The image's manifest or config could not be loaded.
    #[error("indexing image {name}: {source}")]
    Index {
        /// The record's name.
        name: String,
        source: crate::images::pull::LoadError,
    },
}

impl ImageEvents {
    /// Re-reads record `name` and updates the index (absent → reference dropped).
    pub async fn refresh(&self, name: &str) -> Result<(), RefreshError> {
        match self.images.get(name).await? {
            None => {
                self.index.remove_ref(name);
                Ok(())
            }
            Some(record) => {
                let info = load_image(self.content.as_ref(), &record, &self.os, &self.architecture)
                    .await
                    .map_err(|source| RefreshError::Index {
                        name: name.to_string(),
                        source,
                    })?;
                self.index.add_ref(name, info);
                Ok(())
            }
        }
    }

    /// Indexes every image record containerd has, directly (not through the queue). For
    /// start-up, before any event is dispatched; later resyncs go through the queue.
    pub async fn load_all(&self) -> Result<usize, BackendError> {
        let records = self.images.list().await?;
        let mut loaded = 0;
        for r in &records {
            if self.refresh(&r.name).await.is_ok() {
                loaded += 1;
            }
        }
        Ok(loaded)
    }

    /// Re-checks every image record containerd has and every reference the index holds, by
    /// queueing a refresh for each name on the same per-name queue as events. Each refresh
    /// reads containerd's record at handling time, so a resync racing with a pull or with
    /// events can neither drop a reference that exists nor keep one that is gone.
    pub async fn resync(&self, queue: &OrderedQueue<Event>) -> Result<usize, BackendError> {
        let mut names: std::collections::BTreeSet<String> = self
            .images
            .list()
            .await?
            .into_iter()
            .map(|r| r.name)
            .collect();
        names.extend(self.index.all_refs());
        for name in &names {
            queue.push(name, Event::ImageUpdate { name: name.clone() });
        }
        Ok(names.len())
    }
}

impl Handler<Event> for ImageEvents {
    fn handle<'a>(
        &'a self,
        id: &'a str,
        event: &'a Event,
    ) -> Pin<Box<dyn Future<Output = Result<(), HandleError>> + Send + 'a>> {
        Box::pin(async move {
            match event {
                Event::ImageCreate { .. } | Event::ImageUpdate { .. } => {
                    Ok(self.refresh(id).await?)
                }
                Event::ImageDelete { .. } => {
                    self.index.remove_ref(id);
                    Ok(())
                }
                // Task events are handled by the container lifecycle (not built yet).
                _ => Ok(()),
            }
        })
    }
}

/// Dispatches every event remora subscribes to: image events to [`ImageEvents`], OOM events
/// to the container they concern (its exit reason becomes `OOMKilled`).
pub struct RuntimeEvents {
    /// Image index upkeep.
    pub images: Arc<ImageEvents>,
    /// Pods and containers.
    pub pods: Arc<crate::lifecycle::Pods>,
    /// Where OOM marks are logged.
    pub log: Logger,
}

impl Handler<Event> for RuntimeEvents {
    fn handle<'a>(
        &'a self,
        id: &'a str,
        event: &'a Event,
    ) -> Pin<Box<dyn Future<Output = Result<(), HandleError>> + Send + 'a>> {
        Box::pin(async move {
            match event {
                Event::TaskOom { container_id } => {
                    // Pause containers and containers of other clients are not ours to mark.
                    if let Ok(c) = self.pods.containers_store().get(container_id) {
                        let outcome = c.mark_oom();
                        info!(self.log, "container hit its memory limit"; "container_id" => container_id, "outcome" => ?outcome);
                    }
                    Ok(())
                }
                Event::TaskExit {
                    container_id,
                    id: exec_id,
                    ..
                } if exec_id == container_id => {
                    // A hint that arrives sooner than the exit monitor's Task.Wait (which stays
                    // the truth): confirm with the task's state, then record. First exit wins,
                    // so the monitor's later record is a no-op.
                    Ok(self.pods.reconcile_exit(container_id).await?)
                }
                Event::ContainerExited {
                    container_id,
                    exit_status,
                    exited_at,
                } => Ok(self
                    .pods
                    .handle_exit(container_id, *exit_status, *exited_at)
                    .await?),
                Event::TaskExit { .. } => Ok(()),
                _ => self.images.handle(id, event).await,
            }
        })
    }
}

/// lifecycle's exit queue: an exit monitor's exit, as the event it is queued as.
impl crate::lifecycle::backend::ExitQueue for OrderedQueue<Event> {
    fn push_exit(&self, container_id: &str, exit: crate::lifecycle::backend::Exit) {
        self.push(
            container_id,
            Event::ContainerExited {
                container_id: container_id.to_string(),
                exit_status: exit.status,
                exited_at: exit.at,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::containerd::event_stream::Envelope;
    use crate::events::queue::QueueConfig;
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    /// Each subscribe hands out the next scripted stream (items then end); then fails.
    struct Scripted {
        streams: Mutex<VecDeque<Vec<Result<Envelope, BackendError>>>>,
        subscribes: AtomicUsize,
    }

    #[async_trait::async_trait]
    impl EventSource for Scripted {
        async fn subscribe(&self, _topics: &[&str]) -> Result<EventStream, BackendError> {
            self.subscribes.fetch_add(1, Ordering::SeqCst);
            match self.streams.lock().unwrap().pop_front() {
                Some(items) => Ok(Box::pin(tokio_stream::iter(items))),
                None => Err(BackendError::Timeout {
                    address: "/c.sock".into(),
                    after: Duration::from_secs(1),
                }),
            }
        }
    }

    #[derive(Default)]
    struct Seen(Mutex<Vec<(String, Event)>>);

    impl Handler<Event> for Seen {
        fn handle<'a>(
            &'a self,
            id: &'a str,
            event: &'a Event,
        ) -> Pin<Box<dyn Future<Output = Result<(), HandleError>> + Send + 'a>> {
            Box::pin(async move {
                self.0.lock().unwrap().push((id.to_string(), event.clone()));
                Ok(())
            })
        }
    }

    fn env(ns: &str, name: &str) -> Result<Envelope, BackendError> {
        Ok(Envelope {
            namespace: ns.into(),
            topic: "/images/create".into(),
            event: Event::ImageCreate { name: name.into() },
        })
    }

    #[tokio::test(start_paused = true)]
    async fn dispatches_own_namespace_resyncs_after_each_subscription_and_resubscribes() {
        let source = Arc::new(Scripted {
            streams: Mutex::new(VecDeque::from([
                vec![
                    env("remora", "a:1"),
                    env("other", "x:1"),
                    env("remora", "b:1"),
                ],
                vec![env("remora", "c:1")],
            ])),
            subscribes: AtomicUsize::new(0),
        });
        let seen = Arc::new(Seen::default());
        let queue = OrderedQueue::new(seen.clone(), QueueConfig::default());
        let resyncs = Arc::new(AtomicUsize::new(0));
        let r = resyncs.clone();
        let resync: Resync = Arc::new(move || {
            let r = r.clone();
            Box::pin(async move {
                r.fetch_add(1, Ordering::SeqCst);
            })
        });
        let (stop_tx, stop_rx) = watch::channel(false);
        let metrics = crate::metrics::Metrics::new();
        let task = tokio::spawn(run(
            source.clone(),
            Subscription {
                metrics: metrics.clone(),
                topics: vec!["/images/"],
                namespace: "remora".into(),
                backoff_min: Duration::from_millis(100),
                backoff_max: Duration::from_secs(1),
                reachability: Box::new(crate::lifecycle::backend::NeverBack),
            },
            queue,
            resync,
            stop_rx,
            Logger::root(slog::Discard, slog::o!()),
            None,
        ));
        tokio::time::sleep(Duration::from_secs(5)).await;
        stop_tx.send(true).unwrap();
        task.await.unwrap();

        let names: Vec<String> = seen
            .0
            .lock()
            .unwrap()
            .iter()
            .map(|(id, _)| id.clone())
            .collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(
            sorted,
            vec!["a:1", "b:1", "c:1"],
            "other namespaces are ignored"
        );
        assert_eq!(
            resyncs.load(Ordering::SeqCst),
            2,
            "one resync per successful subscription"
        );
        assert!(
            source.subscribes.load(Ordering::SeqCst) >= 3,
            "re-subscribed after each end"
        );
        // The first stream's end and the second subscription: one reconnect.
        let text = metrics.encode();
        assert!(
            text.lines()
                .any(|l| l == "remora_containerd_reconnects_total 1"),
            "{text}"
        );
    }

    /// containerd away until `up_at`, for both the health probe and the event service.
    struct Outage {
        up_at: tokio::time::Instant,
        subscribed_at: Mutex<Vec<tokio::time::Instant>>,
    }

    impl Outage {
        fn down(&self) -> Option<BackendError> {
            (tokio::time::Instant::now() < self.up_at).then(|| BackendError::Call {
                address: "/c.sock".into(),
                op: "test",
                code: crate::backend_error::BackendCode::Unavailable,
                message: "connection refused".into(),
            })
        }
    }

    #[async_trait::async_trait]
    impl EventSource for Outage {
        async fn subscribe(&self, _topics: &[&str]) -> Result<EventStream, BackendError> {
            if let Some(e) = self.down() {
                return Err(e);
            }
            self.subscribed_at
                .lock()
                .unwrap()
                .push(tokio::time::Instant::now());
            Ok(Box::pin(tokio_stream::pending()))
        }
    }

    #[async_trait::async_trait]
    impl crate::containerd::VersionApi for Outage {
        async fn version(
            &self,
            _timeout: Duration,
        ) -> Result<crate::containerd::ContainerdVersion, BackendError> {
            match self.down() {
                Some(e) => Err(e),
                None => Ok(crate::containerd::ContainerdVersion {
                    version: "v2".into(),
                    revision: "r".into(),
                }),
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_60_s_outage_the_stream_and_resync_are_back_within_one_probe_interval() {
        use crate::containerd::health::{HealthMonitor, ProbeSchedule};
        let start = tokio::time::Instant::now();
        let outage = Arc::new(Outage {
            up_at: start + Duration::from_secs(60),
            subscribed_at: Mutex::new(Vec::new()),
        });
        let down_interval = Duration::from_millis(200);
        let health = Arc::new(HealthMonitor::new(
            outage.clone(),
            ProbeSchedule {
                timeout: Duration::from_secs(2),
                interval: Duration::from_secs(5),
                down_interval,
            },
            Logger::root(slog::Discard, slog::o!()),
        ));
        let resynced_at = Arc::new(Mutex::new(Vec::new()));
        let r = resynced_at.clone();
        let resync: Resync = Arc::new(move || {
            let r = r.clone();
            Box::pin(async move { r.lock().unwrap().push(tokio::time::Instant::now()) })
        });
        let (stop_tx, stop_rx) = watch::channel(false);
        let probing = tokio::spawn(health.clone().run(stop_rx.clone()));
        let events = tokio::spawn(run(
            outage.clone(),
            Subscription {
                metrics: crate::metrics::Metrics::new(),
                topics: vec!["/tasks/exit"],
                namespace: "remora".into(),
                // The defaults: a backoff alone would be 10 s apart by the end of the outage.
                backoff_min: Duration::from_millis(100),
                backoff_max: Duration::from_secs(10),
                reachability: Box::new(health.reachability()),
            },
            OrderedQueue::new(Arc::new(Seen::default()), QueueConfig::default()),
            resync,
            stop_rx,
            Logger::root(slog::Discard, slog::o!()),
            None,
        ));
        tokio::time::sleep(Duration::from_secs(75)).await;
        stop_tx.send(true).unwrap();
        events.await.unwrap();
        probing.await.unwrap();

        let subscribed = outage.subscribed_at.lock().unwrap().clone();
        assert_eq!(
            subscribed.len(),
            1,
            "subscribed once, when containerd was back"
        );
        let late = subscribed[0] - outage.up_at;
        assert!(
            late <= down_interval,
            "subscribed {late:?} after containerd answered"
        );
        let resyncs = resynced_at.lock().unwrap().clone();
        assert_eq!(
            resyncs, subscribed,
            "the resync runs at once on subscribing"
        );
    }
}
