//! The instrumentation layer every CRI RPC goes through.
//!
//! It gives the request a logger carrying the RPC name and the pod/container/image ids, runs
//! the operation, logs the outcome once (errors at the level their code deserves, success at
//! debug with the duration), and turns the typed [`CriError`] into a `tonic::Status` through
//! its single `From` impl.

use std::future::Future;
use std::time::Instant;

use slog::{debug, error, info, o, Logger};
use tonic::Code;

use crate::cri::error::CriError;

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

    fn logger(&self, base: &Logger, rpc: &'static str) -> Logger {
        let mut log = base.new(o!("rpc" => rpc));
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
    rpc: &'static str,
    ids: Ids,
    op: F,
) -> Result<tonic::Response<T>, tonic::Status>
where
    F: FnOnce(Logger) -> Fut,
    Fut: Future<Output = Result<T, CriError>>,
{
    let log = ids.logger(base, rpc);
    let start = Instant::now();
    let result = op(log.clone()).await;
    let elapsed_ms = start.elapsed().as_secs_f64() * 1000.0;
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
