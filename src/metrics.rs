//! Prometheus metrics: one registry, typed handles, and the `/metrics` HTTP endpoint.
//!
//! # Design
//! - **No process-global registry.** [`Metrics`] owns a `prometheus_client` registry and the
//!   handles of every metric; it is cheap to clone (an `Arc`) and is handed to the components
//!   that count something (the CRI instrumentation layer, the puller, the digest resolver, the
//!   event queue). [`Metrics::new`] is cheap enough that unit tests make their own, and
//!   counting into one nobody scrapes costs an atomic add.
//! - **Events are counters and histograms, state is read at scrape time.** Things that
//!   *happen* (a CRI call, a pull, a retry) are counted where they happen. Things that *are*
//!   (pods by state, IDs in backoff, the resolver's queue) are gauges computed on each scrape
//!   by closures the owning components register ([`Metrics::add_gauges`]): nothing has to be
//!   kept in sync by hand, and an idle remora does no metrics work at all.
//! - **Names follow Prometheus conventions**: a `remora_` prefix, base units in the name
//!   (`_seconds`, `_bytes`), counters ending in `_total` (prometheus-client appends it).
//! - The endpoint ([`serve`]) is plain HTTP/1.1 on hyper, `GET /metrics` only, in the
//!   OpenMetrics text format; it is off unless `[metrics] address` is set.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use slog::{info, Logger};
use thiserror::Error;
use tokio::sync::watch;

/// The content type of the OpenMetrics text format that [`Metrics::encode`] writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Labels of one CRI call: the RPC name and its gRPC status code.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    /// The CRI method, e.g. `RunPodSandbox`.
    pub method: String,
    /// The gRPC status code name, e.g. `OK`, `NotFound`.
    pub code: String,
}

/// The label of a per-method family.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabel {
    /// The CRI method.
    pub method: String,
}

/// The label of an outcome (`ok` or `error`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `ok` or `error`.
    pub result: String,
}

/// Why a layer blob was not downloaded by this pull.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DedupLabel {
    /// `stored` (already in the content store) or `in_flight` (joined another pull's
    /// download of it).
    pub reason: String,
}

/// The label of an event topic.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TopicLabel {
    /// e.g. `/tasks/exit`.
    pub topic: String,
}

/// The label of one of remora's HTTP listeners.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabel {
    /// `streaming` or `metrics`.
    pub listener: String,
}

/// One gauge family computed at scrape time (see [`Metrics::add_gauges`]).
#[derive(Debug, Clone)]
pub struct GaugeFamily {
    /// Name without the `remora_` prefix and without the unit suffix.
    pub name: &'static str,
    /// HELP text.
    pub help: &'static str,
    /// Unit, appended to the name (`Some(Unit::Seconds)`: `_seconds`).
    pub unit: Option<Unit>,
    /// One value per label set (an empty label list: the family's only sample).
    pub samples: Vec<(Vec<(&'static str, String)>, f64)>,
}

impl GaugeFamily {
    /// A family of one unlabelled sample.
    pub fn single(name: &'static str, help: &'static str, unit: Option<Unit>, value: f64) -> Self {
        Self {
            name,
            help,
            unit,
            samples: vec![(Vec::new(), value)],
        }
    }
}

/// A scrape-time source of gauges.
type GaugeSource = Box<dyn Fn() -> Vec<GaugeFamily> + Send + Sync>;

/// The registered scrape-time sources, shared with the registry's collector.
#[derive(Default)]
struct Sources(Mutex<Vec<GaugeSource>>);

impl std::fmt::Debug for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sources")
    }
}

/// The collector that asks every source on each scrape.
#[derive(Debug)]
struct StateCollector(Arc<Sources>);

impl Collector for StateCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // Sources only read their component's state under that component's own locks; they
        // never call back into Metrics, so holding this lock while they run cannot deadlock.
        let sources = self.0 .0.lock().unwrap_or_else(|p| p.into_inner());
        for source in sources.iter() {
            for family in source() {
                let mut metric = encoder.encode_descriptor(
                    family.name,
                    family.help,
                    family.unit.as_ref(),
                    MetricType::Gauge,
                )?;
                match family.samples.as_slice() {
                    // An unlabelled family: one sample, written without braces.
                    [(labels, value)] if labels.is_empty() => {
                        ConstGauge::new(*value).encode(metric)?;
                    }
                    samples => {
                        for (labels, value) in samples {
                            ConstGauge::new(*value).encode(metric.encode_family(labels)?)?;
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

struct Inner {
    registry: Registry,
    sources: Arc<Sources>,
    cri_requests: Family<CallLabels, Counter>,
    cri_duration: Family<MethodLabel, Histogram>,
    pulls_started: Counter,
    pulls_coalesced: Counter,
    pull_duration: Family<ResultLabel, Histogram>,
    pull_bytes: Counter,
    pull_stalls: Counter,
    blob_dedup: Family<DedupLabel, Counter>,
    resolver_hits: Counter,
    resolver_misses: Counter,
    resolver_rate_waits: Counter,
    resolver_backoffs: Counter,
    events_handled: Family<TopicLabel, Counter>,
    event_retries: Counter,
    containerd_reconnects: Counter,
    stats_samples: Counter,
    stats_sample_duration: Histogram,
    connections_refused: Family<ListenerLabel, Counter>,
}

/// remora's metrics: the registry and a handle on every metric. Cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with every metric at zero and no scrape-time sources.
    pub fn new() -> Self {
        let mut root = Registry::default();
        let reg = root.sub_registry_with_prefix("remora");

        let cri_requests = Family::<CallLabels, Counter>::default();
        reg.register(
            "cri_requests",
            "CRI calls handled, by method and gRPC status code",
            cri_requests.clone(),
        );
        // 1 ms .. 32 s: a Status call at the bottom, a slow pull or pod start at the top.
        let cri_duration: Family<MethodLabel, Histogram> =
            Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.001, 2.0, 16)));
        reg.register_with_unit(
            "cri_request_duration",
            "Time to answer a CRI call, by method",
            Unit::Seconds,
            cri_duration.clone(),
        );

        let pulls_started = Counter::default();
        reg.register(
            "image_pulls_started",
            "Image pulls started (the leader of each set of coalesced requests)",
            pulls_started.clone(),
        );
        let pulls_coalesced = Counter::default();
        reg.register(
            "image_pulls_coalesced",
            "PullImage requests that joined a pull of the same image already in flight",
            pulls_coalesced.clone(),
        );
        // 50 ms .. about 100 s.
        let pull_duration: Family<ResultLabel, Histogram> =
            Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.05, 2.0, 12)));
        reg.register_with_unit(
            "image_pull_duration",
            "Time a started pull took, by result (ok or error)",
            Unit::Seconds,
            pull_duration.clone(),
        );
        let pull_bytes = Counter::default();
        reg.register_with_unit(
            "image_pull",
            "Bytes of manifests, configs and layers downloaded from registries",
            Unit::Bytes,
            pull_bytes.clone(),
        );
        let pull_stalls = Counter::default();
        reg.register(
            "image_pull_stall_aborts",
            "Blob transfers aborted for receiving too little within [images] stall_timeout",
            pull_stalls.clone(),
        );
        let blob_dedup = Family::<DedupLabel, Counter>::default();
        reg.register(
            "image_blob_dedup_hits",
            "Layer blobs a pull did not download: already stored, or being downloaded by another pull",
            blob_dedup.clone(),
        );

        let resolver_hits = Counter::default();
        reg.register(
            "resolver_cache_hits",
            "Tag-to-digest lookups answered from the resolver's cache",
            resolver_hits.clone(),
        );
        let resolver_misses = Counter::default();
        reg.register(
            "resolver_cache_misses",
            "Tag-to-digest lookups that needed the registry (a new or joined resolution)",
            resolver_misses.clone(),
        );
        let resolver_rate_waits = Counter::default();
        reg.register(
            "resolver_rate_limit_waits",
            "Resolutions that waited for the resolver's rate limit before starting",
            resolver_rate_waits.clone(),
        );
        let resolver_backoffs = Counter::default();
        reg.register(
            "resolver_backoffs",
            "Failed resolutions, each putting its reference into (longer) backoff",
            resolver_backoffs.clone(),
        );

        let events_handled = Family::<TopicLabel, Counter>::default();
        reg.register(
            "events_handled",
            "Events handled successfully by the ordered event queue, by topic",
            events_handled.clone(),
        );
        let event_retries = Counter::default();
        reg.register(
            "event_retries",
            "Failed event handlings, each retried after a backoff",
            event_retries.clone(),
        );
        let containerd_reconnects = Counter::default();
        reg.register(
            "containerd_reconnects",
            "Times the containerd event stream was re-established after it broke",
            containerd_reconnects.clone(),
        );

        let stats_samples = Counter::default();
        reg.register(
            "stats_samples",
            "Samples of every container's and pod's cgroup and network figures taken for the stats RPCs",
            stats_samples.clone(),
        );
        // 1 ms .. about 16 s: a few pods at the bottom, thousands with slow reads at the top.
        let stats_sample_duration = Histogram::new(exponential_buckets(0.001, 2.0, 15));
        reg.register_with_unit(
            "stats_sample_duration",
            "Time to take one sample for the stats RPCs",
            Unit::Seconds,
            stats_sample_duration.clone(),
        );

        let connections_refused = Family::<ListenerLabel, Counter>::default();
        reg.register(
            "listener_connections_refused",
            "Connections closed at once because their listener had as many open as it allows",
            connections_refused.clone(),
        );

        let sources = Arc::new(Sources::default());
        reg.register_collector(Box::new(StateCollector(sources.clone())));

        Self {
            inner: Arc::new(Inner {
                registry: root,
                sources,
                cri_requests,
                cri_duration,
                pulls_started,
                pulls_coalesced,
                pull_duration,
                pull_bytes,
                pull_stalls,
                blob_dedup,
                resolver_hits,
                resolver_misses,
                resolver_rate_waits,
                resolver_backoffs,
                events_handled,
                event_retries,
                containerd_reconnects,
                stats_samples,
                stats_sample_duration,
                connections_refused,
            }),
        }
    }

    /// Registers `source`, called on every scrape for gauges of current state. It must not
    /// block or call into [`Metrics`]; it should hold its component weakly (a `Weak`), so
    /// the registry does not keep the component alive.
    pub fn add_gauges(&self, source: impl Fn() -> Vec<GaugeFamily> + Send + Sync + 'static) {
        self.inner
            .sources
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Box::new(source));
    }

    /// The whole registry in the OpenMetrics text format ([`CONTENT_TYPE`]).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail; an error would be a bug in a collector's
        // encoding, and a partial scrape is then still better than none.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.inner.registry);
        out
    }

    /// Counts one CRI call of `method` that ended with `code` after `elapsed`.
    pub fn cri_call(&self, method: &str, code: tonic::Code, elapsed: Duration) {
        self.inner
            .cri_requests
            .get_or_create(&CallLabels {
                method: method.to_string(),
                code: code_name(code).to_string(),
            })
            .inc();
        self.inner
            .cri_duration
            .get_or_create(&MethodLabel {
                method: method.to_string(),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// A pull started (this caller leads it).
    pub fn pull_started(&self) {
        self.inner.pulls_started.inc();
    }

    /// A pull request joined one in flight.
    pub fn pull_coalesced(&self) {
        self.inner.pulls_coalesced.inc();
    }

    /// A started pull ended after `elapsed`.
    pub fn pull_finished(&self, ok: bool, elapsed: Duration) {
        self.inner
            .pull_duration
            .get_or_create(&ResultLabel {
                result: if ok { "ok" } else { "error" }.to_string(),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// `n` bytes arrived from a registry.
    pub fn pull_bytes(&self, n: u64) {
        self.inner.pull_bytes.inc_by(n);
    }

    /// A blob transfer was aborted as stalled.
    pub fn pull_stalled(&self) {
        self.inner.pull_stalls.inc();
    }

    /// A layer blob needed no download: already `stored`, or `in_flight` elsewhere.
    pub fn blob_dedup_hit(&self, reason: &'static str) {
        self.inner
            .blob_dedup
            .get_or_create(&DedupLabel {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// A resolver lookup answered from its cache (`hit`) or needing the registry.
    pub fn resolver_lookup(&self, hit: bool) {
        if hit {
            self.inner.resolver_hits.inc();
        } else {
            self.inner.resolver_misses.inc();
        }
    }

    /// A resolution waited for the rate limit.
    pub fn resolver_rate_limited(&self) {
        self.inner.resolver_rate_waits.inc();
    }

    /// A resolution failed and its key backs off.
    pub fn resolver_backoff(&self) {
        self.inner.resolver_backoffs.inc();
    }

    /// An event of `topic` was handled.
    pub fn event_handled(&self, topic: &str) {
        self.inner
            .events_handled
            .get_or_create(&TopicLabel {
                topic: topic.to_string(),
            })
            .inc();
    }

    /// An event handling failed and will be retried.
    pub fn event_retry(&self) {
        self.inner.event_retries.inc();
    }

    /// The containerd event stream came back after breaking.
    pub fn containerd_reconnect(&self) {
        self.inner.containerd_reconnects.inc();
    }

    /// `listener` closed a connection at once: it had as many open as it allows.
    pub fn connection_refused(&self, listener: &'static str) {
        self.inner
            .connections_refused
            .get_or_create(&ListenerLabel {
                listener: listener.to_string(),
            })
            .inc();
    }
}

impl Metrics {
    /// The stats sampler took a sample of every container and pod in `elapsed` (lifecycle
    /// makes this its `SampleObserver`).
    pub fn stats_sampled(&self, elapsed: Duration) {
        self.inner.stats_samples.inc();
        self.inner
            .stats_sample_duration
            .observe(elapsed.as_secs_f64());
    }
}

/// The canonical gRPC code names (as grpc-go prints them), used as the `code` label.
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "Canceled",
        Unknown => "Unknown",
        InvalidArgument => "InvalidArgument",
        DeadlineExceeded => "DeadlineExceeded",
        NotFound => "NotFound",
        AlreadyExists => "AlreadyExists",
        PermissionDenied => "PermissionDenied",
        ResourceExhausted => "ResourceExhausted",
        FailedPrecondition => "FailedPrecondition",
        Aborted => "Aborted",
        OutOfRange => "OutOfRange",
        Unimplemented => "Unimplemented",
        Internal => "Internal",
        Unavailable => "Unavailable",
        DataLoss => "DataLoss",
        Unauthenticated => "Unauthenticated",
    }
}

/// The metrics endpoint cannot start.
#[derive(Debug, Error)]
pub enum StartError {
    /// `[metrics] address` cannot be bound.
    #[error("cannot listen for metrics on {address}: {source}")]
    Bind {
        /// The configured address.
        address: SocketAddr,
        /// The bind's error (address in use, say).
        source: std::io::Error,
    },
}

/// Binds the metrics endpoint's listener (a bind error names the address).
pub async fn bind(address: SocketAddr) -> Result<tokio::net::TcpListener, StartError> {
    tokio::net::TcpListener::bind(address)
        .await
        .map_err(|source| StartError::Bind { address, source })
}

/// Answers one HTTP request: `GET /metrics` (or `HEAD`) with the registry, 404 elsewhere, 405
/// for other methods on `/metrics`.
fn respond<B>(metrics: &Metrics, req: &Request<B>) -> Response<Full<Bytes>> {
    use crate::listener::{answer, TEXT_PLAIN};
    let plain = |status: StatusCode, text: &'static str| answer(status, TEXT_PLAIN, text);
    if req.uri().path() != "/metrics" {
        return plain(
            StatusCode::NOT_FOUND,
            "not found; metrics are at /metrics\n",
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return crate::listener::method_not_allowed("GET, HEAD");
    }
    answer(StatusCode::OK, CONTENT_TYPE, metrics.encode())
}

/// How long a metrics client gets to send its request head.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one metrics connection may last, answer included (a scrape takes milliseconds;
/// this only ends one whose client stopped reading).
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(60);
/// Metrics connections open at once; more are closed at once (a scraper needs one).
pub const MAX_CONNECTIONS: usize = 32;

/// Serves the endpoint on `listener` until `stop` turns true, with the limits of
/// `crate::listener`: one request per connection, `HEADER_READ_TIMEOUT` for its head,
/// `CONNECTION_TIMEOUT` for all of it, and at most [`MAX_CONNECTIONS`] at once.
pub async fn serve(
    metrics: Metrics,
    listener: tokio::net::TcpListener,
    stop: watch::Receiver<bool>,
    log: Logger,
) {
    if let Ok(addr) = listener.local_addr() {
        info!(log, "serving metrics"; "address" => %addr);
    }
    let limits = crate::listener::RequestLimits {
        header_read_timeout: HEADER_READ_TIMEOUT,
        connection_timeout: CONNECTION_TIMEOUT,
        max_connections: MAX_CONNECTIONS,
    };
    let counted = metrics.clone();
    crate::listener::serve_requests(
        listener,
        limits,
        move |req| respond(&metrics, req),
        move || counted.connection_refused("metrics"),
        stop,
        log,
        "metrics",
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of the sample `name{labels}` in `text` (labels as written, sorted as
    /// registered), parsed strictly.
    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .map(|v| v.parse().expect("a number"))
    }

    #[test]
    fn names_follow_the_conventions_and_end_with_eof() {
        let m = Metrics::new();
        m.cri_call("Version", tonic::Code::Ok, Duration::from_millis(3));
        m.pull_bytes(10);
        let text = m.encode();
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert!(
            text.contains("# TYPE remora_cri_requests counter"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE remora_cri_request_duration_seconds histogram"),
            "{text}"
        );
        assert!(
            text.contains("# UNIT remora_image_pull_bytes bytes"),
            "{text}"
        );
        assert_eq!(sample(&text, "remora_image_pull_bytes_total"), Some(10.0));
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            assert!(line.starts_with("remora_"), "{line}");
        }
    }

    #[test]
    fn stats_samples_are_counted_and_timed() {
        let m = Metrics::new();
        assert_eq!(sample(&m.encode(), "remora_stats_samples_total"), Some(0.0));
        m.stats_sampled(Duration::from_millis(30));
        let text = m.encode();
        assert_eq!(sample(&text, "remora_stats_samples_total"), Some(1.0));
        assert!(
            text.contains("# TYPE remora_stats_sample_duration_seconds histogram"),
            "{text}"
        );
        assert_eq!(
            sample(&text, "remora_stats_sample_duration_seconds_count"),
            Some(1.0)
        );
    }

    #[test]
    fn cri_calls_are_counted_by_method_and_code() {
        let m = Metrics::new();
        m.cri_call("RunPodSandbox", tonic::Code::Ok, Duration::from_millis(120));
        m.cri_call("RunPodSandbox", tonic::Code::Ok, Duration::from_millis(80));
        m.cri_call(
            "RunPodSandbox",
            tonic::Code::Unavailable,
            Duration::from_secs(2),
        );
        let text = m.encode();
        assert_eq!(
            sample(
                &text,
                "remora_cri_requests_total{method=\"RunPodSandbox\",code=\"OK\"}"
            ),
            Some(2.0)
        );
        assert_eq!(
            sample(
                &text,
                "remora_cri_requests_total{method=\"RunPodSandbox\",code=\"Unavailable\"}"
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &text,
                "remora_cri_request_duration_seconds_count{method=\"RunPodSandbox\"}"
            ),
            Some(3.0)
        );
        let sum = sample(
            &text,
            "remora_cri_request_duration_seconds_sum{method=\"RunPodSandbox\"}",
        )
        .expect("sum");
        assert!((sum - 2.2).abs() < 1e-9, "{sum}");
        // The 0.128 s bucket holds both fast calls, not the slow one.
        assert_eq!(
            sample(
                &text,
                "remora_cri_request_duration_seconds_bucket{le=\"0.128\",method=\"RunPodSandbox\"}"
            )
            .or_else(|| sample(
                &text,
                "remora_cri_request_duration_seconds_bucket{method=\"RunPodSandbox\",le=\"0.128\"}"
            )),
            Some(2.0),
            "{text}"
        );
    }

    #[test]
    fn gauges_are_read_from_their_sources_on_each_scrape() {
        let m = Metrics::new();
        let pods = Arc::new(std::sync::atomic::AtomicUsize::new(2));
        let seen = Arc::downgrade(&pods);
        m.add_gauges(move || {
            let Some(p) = seen.upgrade() else {
                return Vec::new();
            };
            vec![
                GaugeFamily {
                    name: "pods",
                    help: "Pods by state",
                    unit: None,
                    samples: vec![
                        (
                            vec![("state", "ready".to_string())],
                            p.load(std::sync::atomic::Ordering::Relaxed) as f64,
                        ),
                        (vec![("state", "notready".to_string())], 0.0),
                    ],
                },
                GaugeFamily::single(
                    "oldest_event_age",
                    "Age of the oldest pending event",
                    Some(Unit::Seconds),
                    1.5,
                ),
            ]
        });
        let text = m.encode();
        assert_eq!(
            sample(&text, "remora_pods{state=\"ready\"}"),
            Some(2.0),
            "{text}"
        );
        assert!(text.contains("# TYPE remora_pods gauge"), "{text}");
        assert_eq!(sample(&text, "remora_oldest_event_age_seconds"), Some(1.5));
        pods.store(5, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(
            sample(&m.encode(), "remora_pods{state=\"ready\"}"),
            Some(5.0)
        );
        // The component is gone: its gauges go with it, the registry does not keep it.
        drop(pods);
        assert!(!m.encode().contains("remora_pods"));
    }

    #[test]
    fn the_endpoint_serves_metrics_only() {
        let m = Metrics::new();
        m.event_retry();
        let get = |path: &str, method: Method| {
            let req = Request::builder()
                .method(method)
                .uri(path)
                .body(())
                .expect("request");
            respond(&m, &req)
        };
        let ok = get("/metrics", Method::GET);
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(ok.headers()[hyper::header::CONTENT_TYPE], CONTENT_TYPE);
        assert_eq!(get("/", Method::GET).status(), StatusCode::NOT_FOUND);
        assert_eq!(
            get("/metricsx", Method::GET).status(),
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            get("/metrics", Method::POST).status(),
            StatusCode::METHOD_NOT_ALLOWED
        );
    }

    #[tokio::test]
    async fn a_taken_address_is_a_bind_error_naming_it() {
        let first = bind("127.0.0.1:0".parse().expect("addr"))
            .await
            .expect("bind");
        let taken = first.local_addr().expect("addr");
        let err = bind(taken).await.expect_err("second bind");
        assert!(err.to_string().contains(&taken.to_string()), "{err}");
    }
}
