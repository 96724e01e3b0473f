//! The instrumentation layer every CRI RPC goes through.
//!
//! It gives the request a logger carrying the RPC name, a request id (`req_id`, so one call's
//! lines can be found among concurrent ones) and the pod/container/image ids, runs the
//! operation, logs the outcome once (errors at the level their code deserves, success at
//! debug with the duration), counts the call by method and status code with its latency
//! ([`Metrics::cri_call`]), and turns the typed [`CriError`] into a `tonic::Status` through
//! its single `From` impl.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use slog::{debug, error, info, o, Logger};
use tonic::Code;

use crate::cri::error::CriError;
use crate::metrics::Metrics;

/// The sequence request ids are drawn from. Process-wide on purpose: an id must be unique
/// among the calls of one daemon whatever service answers them, and it is state no test
/// reads. It restarts with remora; log lines carry timestamps besides.
static REQUEST_SEQ: AtomicU64 = AtomicU64::new(1);

/// A short id for the next CRI call: a hex counter (`1f`, `2a0`).
pub fn next_request_id() -> String {
    format!("{:x}", REQUEST_SEQ.fetch_add(1, Ordering::Relaxed))
}

/// The ids a request is about, as structured log fields.
#[derive(Debug, Default, Clone)]
pub struct Ids {
    /// Pod sandbox id.
    pub pod_id: Option<String>,
    /// Container id.
    pub container_id: Option<String>,
    /// Image reference or id.
    pub image: Option<String>,
}

impl Ids {
    /// No ids (runtime-wide RPCs).
    pub fn none() -> Self {
        Self::default()
    }

    fn logger(&self, base: &Logger, rpc: &'static str, req_id: String) -> Logger {
        let mut log = base.new(o!("rpc" => rpc, "req_id" => req_id));
        if let Some(id) = &self.pod_id {
            log = log.new(o!("pod_id" => id.clone()));
        }
        if let Some(id) = &self.container_id {
            log = log.new(o!("container_id" => id.clone()));
        }
        if let Some(image) = &self.image {
            log = log.new(o!("image" => image.clone()));
        }
        log
    }
}

/// Runs one CRI operation under the instrumentation layer.
///
/// `op` receives the request's logger so deeper code logs with the same context.
pub async fn run<T, F, Fut>(
    base: &Logger,
    metrics: &Metrics,
    rpc: &'static str,
    ids: Ids,
    op: F,
) -> Result<tonic::Response<T>, tonic::Status>
where
    F: FnOnce(Logger) -> Fut,
    Fut: Future<Output = Result<T, CriError>>,
{
    let log = ids.logger(base, rpc, next_request_id());
    let start = Instant::now();
    let result = op(log.clone()).await;
    let elapsed = start.elapsed();
    let elapsed_ms = elapsed.as_secs_f64() * 1000.0;
    metrics.cri_call(
        rpc,
        result.as_ref().map_or_else(CriError::code, |_| Code::Ok),
        elapsed,
    );
    match result {
        Ok(resp) => {
            debug!(log, "done"; "elapsed_ms" => elapsed_ms);
            Ok(tonic::Response::new(resp))
        }
        Err(err) => {
            match err.code() {
                // Not remora's failure: the caller asked for something not built yet.
                Code::Unimplemented => debug!(log, "unimplemented"; "error" => %err),
                // Caller mistakes are worth seeing but are not daemon errors.
                Code::InvalidArgument
                | Code::NotFound
                | Code::AlreadyExists
                | Code::FailedPrecondition => {
                    info!(log, "rejected"; "error" => %err, "elapsed_ms" => elapsed_ms)
                }
                _ => error!(log, "failed"; "error" => %err, "elapsed_ms" => elapsed_ms),
            }
            Err(err.into())
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use slog::{Drain, OwnedKVList, Record, Serializer, KV};

    use super::*;

    /// Keeps each record's `req_id` and `rpc` fields.
    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<(String, String)>>>);

    struct Fields(Vec<(String, String)>);

    impl Serializer for Fields {
        fn emit_arguments(&mut self, key: slog::Key, val: &std::fmt::Arguments) -> slog::Result {
            self.0.push((key.to_string(), val.to_string()));
            Ok(())
        }
    }

    impl Drain for Capture {
        type Ok = ();
        type Err = slog::Never;
        fn log(&self, record: &Record, values: &OwnedKVList) -> Result<(), slog::Never> {
            let mut fields = Fields(Vec::new());
            let _ = values.serialize(record, &mut fields);
            let get = |k: &str| {
                fields
                    .0
                    .iter()
                    .find(|(key, _)| key == k)
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default()
            };
            self.0.lock().unwrap().push((get("rpc"), get("req_id")));
            Ok(())
        }
    }

    #[tokio::test]
    async fn each_call_gets_its_own_request_id_and_is_counted() {
        let capture = Capture::default();
        let log = Logger::root(capture.clone().fuse(), o!());
        let metrics = Metrics::new();
        for _ in 0..2 {
            let result: Result<tonic::Response<()>, tonic::Status> =
                run(&log, &metrics, "ContainerStatus", Ids::none(), |_| async {
                    Err(CriError::Store(crate::store::StoreError::NotFound {
                        id: "nope".into(),
                    }))
                })
                .await;
            assert_eq!(result.unwrap_err().code(), Code::NotFound);
        }
        let lines = capture.0.lock().unwrap().clone();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines.iter().all(|(rpc, _)| rpc == "ContainerStatus"));
        assert!(!lines[0].1.is_empty());
        assert_ne!(lines[0].1, lines[1].1, "request ids must differ");
        let text = metrics.encode();
        assert!(
            text.contains(
                "remora_cri_requests_total{method=\"ContainerStatus\",code=\"NotFound\"} 2"
            ),
            "{text}"
        );
    }
}
