//! The metrics endpoint and the structured logs, on a real remora: a scrape parsed with a
//! real exposition-format parser shows values move after a pull, a pod start and an injected
//! failure; `log.format = "json"` gives one JSON object per line carrying `rpc`, `req_id`
//! and the ids.

use std::time::Duration;

use remora::cri::v1;

use crate::cri;
use crate::harness::{push_image, remora_config, scratch, BedRemora, Containerd, Remora};

/// A port free on 127.0.0.1 right now (the kernel's pick; released for remora to bind).
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// One scrape, parsed.
pub(crate) struct Scrape {
    text: String,
    parsed: prometheus_parse::Scrape,
}

impl Scrape {
    /// The value of the sample `metric` whose labels include `labels` (0 if there is none:
    /// a labelled series appears with its first event).
    fn value(&self, metric: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(metric, labels).unwrap_or(0.0)
    }

    /// The value of the sample `metric` whose labels include `labels`, if there is one.
    pub(crate) fn get(&self, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let matching: Vec<f64> = self
            .parsed
            .samples
            .iter()
            .filter(|s| s.metric == metric)
            .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .map(|s| match &s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => *v,
                other => panic!("{metric}: not a single value: {other:?}"),
            })
            .collect();
        assert!(
            matching.len() <= 1,
            "{metric} {labels:?} matches {} series:\n{}",
            matching.len(),
            self.text
        );
        matching.first().copied()
    }

    /// The sample count of histogram `metric` (its `_count` series) for `labels`.
    fn histogram_count(&self, metric: &str, labels: &[(&str, &str)]) -> f64 {
        self.value(&format!("{metric}_count"), labels)
    }
}

pub(crate) async fn scrape(url: &str) -> Scrape {
    let resp = reqwest::get(url).await.expect("GET /metrics");
    assert_eq!(resp.status(), 200);
    let content_type = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    let text = resp.text().await.expect("body");
    assert!(text.ends_with("# EOF\n"), "not a whole exposition:\n{text}");
    let parsed = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .expect("the exposition parses");
    // Every sample line became a sample: the parser skips lines it cannot read.
    let sample_lines = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter(|l| !l.contains("_bucket"))
        .count();
    let parsed_non_buckets = parsed
        .samples
        .iter()
        .filter(|s| !matches!(s.value, prometheus_parse::Value::Histogram(_)))
        .count();
    assert_eq!(
        sample_lines, parsed_non_buckets,
        "unparsed lines in:\n{text}"
    );
    Scrape { text, parsed }
}

#[tokio::test]
async fn scrape_moves_after_a_pull_a_pod_start_and_an_injected_failure() {
    let port = free_port();
    let mut bed = BedRemora::start_with_network_and(&format!(
        "\n[metrics]\naddress = \"127.0.0.1:{port}\"\n"
    ));
    // RunPodSandbox of pods named *metrics-fail* fails once, after the network step.
    bed.crash();
    bed.restart_env(&[(
        "REMORA_FAILPOINTS",
        "sandbox.after_network=fail(1)@metrics-fail",
    )]);
    let url = format!("http://127.0.0.1:{port}/metrics");
    let other = reqwest::get(format!("http://127.0.0.1:{port}/"))
        .await
        .expect("GET /");
    assert_eq!(other.status(), 404);

    let before = scrape(&url).await;
    assert!(
        before
            .text
            .contains("# TYPE remora_image_pulls_started counter"),
        "{}",
        before.text
    );
    assert_eq!(before.value("remora_pods", &[("state", "ready")]), 0.0);

    // A pull of an image nobody has: one pull started, its bytes downloaded.
    let image = push_image(2, 64 * 1024).await;
    cri::pull(&bed.remora, &image.reference)
        .await
        .expect("PullImage");
    let pulled = scrape(&url).await;
    let pull_ok = [("method", "PullImage"), ("code", "OK")];
    assert_eq!(pulled.value("remora_cri_requests_total", &pull_ok), 1.0);
    assert_eq!(
        pulled.histogram_count(
            "remora_cri_request_duration_seconds",
            &[("method", "PullImage")]
        ),
        1.0
    );
    assert_eq!(
        pulled.value("remora_image_pulls_started_total", &[])
            - before.value("remora_image_pulls_started_total", &[]),
        1.0
    );
    let bytes = pulled.value("remora_image_pull_bytes_total", &[])
        - before.value("remora_image_pull_bytes_total", &[]);
    assert!(bytes >= 2.0 * 64.0 * 1024.0, "{bytes} bytes counted");
    assert!(
        pulled.histogram_count("remora_image_pull_duration_seconds", &[("result", "ok")]) >= 1.0
    );
    assert!(pulled.value("remora_resolver_cache_misses_total", &[]) >= 1.0);

    // A pod start.
    let logs = scratch();
    let pod = cri::run_pod(
        &bed.remora,
        &cri::pod_config("metrics-ok", logs.path(), true),
    )
    .await
    .expect("RunPodSandbox");
    let started = scrape(&url).await;
    let run_ok = [("method", "RunPodSandbox"), ("code", "OK")];
    assert_eq!(started.value("remora_cri_requests_total", &run_ok), 1.0);
    assert_eq!(started.value("remora_pods", &[("state", "ready")]), 1.0);
    assert_eq!(started.value("remora_pods", &[("state", "notready")]), 0.0);

    // The injected failure: counted under its status code, the pod count unchanged.
    let err = cri::run_pod(
        &bed.remora,
        &cri::pod_config("metrics-fail", logs.path(), true),
    )
    .await
    .expect_err("the failpoint fails RunPodSandbox");
    let failed = scrape(&url).await;
    let code = remora::metrics::code_name(err.code());
    assert_ne!(code, "OK");
    assert_eq!(
        failed.value(
            "remora_cri_requests_total",
            &[("method", "RunPodSandbox"), ("code", code)]
        ),
        1.0,
        "{}",
        failed.text
    );
    assert_eq!(failed.value("remora_cri_requests_total", &run_ok), 1.0);
    assert_eq!(failed.value("remora_pods", &[("state", "ready")]), 1.0);
    assert_eq!(
        failed.histogram_count(
            "remora_cri_request_duration_seconds",
            &[("method", "RunPodSandbox")]
        ),
        2.0
    );

    cri::remove_pod(&bed.remora, &pod).await;
    let removed = scrape(&url).await;
    assert_eq!(removed.value("remora_pods", &[("state", "ready")]), 0.0);
    assert_eq!(removed.value("remora_pods", &[("state", "notready")]), 0.0);
}

#[tokio::test]
async fn metrics_address_taken_fails_the_start_naming_it() {
    let holder = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let taken = holder.local_addr().expect("addr");
    let dir = scratch();
    let containerd = Containerd::start(dir.path());
    let socket = dir.path().join("remora.sock");
    let config = remora_config(
        &socket,
        &containerd.socket(),
        &dir.path().join("net.d"),
        &format!("[metrics]\naddress = \"{taken}\"\n"),
    );
    let err = match Remora::try_start_env(dir.path(), &config, &socket, &[]) {
        Ok(_) => panic!("remora started with its metrics address taken"),
        Err(e) => e,
    };
    assert!(err.contains(&taken.to_string()), "{err}");
}

#[tokio::test]
async fn json_logs_carry_rpc_req_id_and_the_ids() {
    let dir = scratch();
    let containerd = Containerd::start(dir.path());
    let socket = dir.path().join("remora.sock");
    let config = remora_config(&socket, &containerd.socket(), &dir.path().join("net.d"), "");
    let json = config.replace(
        "[log]\nlevel = \"debug\"\n",
        "[log]\nlevel = \"debug\"\nformat = \"json\"\n",
    );
    assert_ne!(
        json, config,
        "the harness config has a [log] table to extend"
    );
    let remora = Remora::start(dir.path(), &json, &socket);

    for _ in 0..2 {
        remora
            .runtime()
            .version(v1::VersionRequest::default())
            .await
            .expect("Version");
    }
    let missing = "0123456789abcdef-not-a-container";
    let err = remora
        .runtime()
        .container_status(v1::ContainerStatusRequest {
            container_id: missing.into(),
            verbose: false,
        })
        .await
        .expect_err("unknown container");
    assert_eq!(err.code(), tonic::Code::NotFound);

    // The async drain writes the lines shortly after the calls, and may be in the middle of
    // one when the file is read: only complete lines (ended by a newline) count.
    let mut lines = Vec::new();
    crate::harness::wait_until(
        "the ContainerStatus rejection is logged",
        Duration::from_secs(10),
        || {
            let text = remora.log_text();
            let complete = text.rfind('\n').map_or("", |end| &text[..end]);
            lines = complete.lines().map(str::to_string).collect::<Vec<_>>();
            let logged = lines.iter().any(|l| l.contains("ContainerStatus"));
            async move { logged }
        },
    )
    .await;
    let records: Vec<serde_json::Value> = lines
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
            assert!(v.is_object(), "not an object: {l}");
            v
        })
        .collect();
    let field =
        |r: &serde_json::Value, k: &str| r.get(k).and_then(|v| v.as_str()).map(String::from);
    let versions: Vec<String> = records
        .iter()
        .filter(|r| field(r, "rpc").as_deref() == Some("Version"))
        .map(|r| field(r, "req_id").expect("req_id on a Version line"))
        .collect();
    assert_eq!(versions.len(), 2, "{lines:#?}");
    assert_ne!(versions[0], versions[1], "each call has its own req_id");
    let rejected = records
        .iter()
        .find(|r| field(r, "rpc").as_deref() == Some("ContainerStatus"))
        .unwrap_or_else(|| panic!("no ContainerStatus line in {lines:#?}"));
    assert_eq!(field(rejected, "container_id").as_deref(), Some(missing));
    assert!(field(rejected, "req_id").is_some_and(|id| !id.is_empty()));
    assert!(field(rejected, "msg").is_some(), "{rejected}");
}
