//! One request to one plugin within a deadline, and how it failed: an answer with an error
//! status, or no answer (a timeout or a transport failure), which is fatal for the plugin.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// How one call to one plugin failed.
pub(super) enum CallError {
    /// The plugin answered with an error status.
    Status(ttrpc::Status),
    /// No answer in time, or the connection failed: the plugin is to be removed.
    Fatal(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Status(s) => write!(f, "{:?}: {}", s.code(), s.message()),
            CallError::Fatal(why) => f.write_str(why),
        }
    }
}

/// Runs a plugin call until `deadline`: ttrpc's own timeout is in the context, this one
/// bounds the whole future whatever the transport does. A status is the plugin's answer;
/// anything else (no answer, a transport failure) is fatal for the plugin.
pub(super) async fn bounded<T>(
    deadline: Instant,
    call: impl Future<Output = ttrpc::Result<T>>,
) -> Result<T, CallError> {
    match tokio::time::timeout_at(deadline, call).await {
        Ok(Ok(reply)) => Ok(reply),
        Ok(Err(ttrpc::Error::RpcStatus(status))) => Err(CallError::Status(status)),
        Ok(Err(err)) => Err(CallError::Fatal(err.to_string())),
        Err(_) => Err(CallError::Fatal(
            "no answer within the request timeout".into(),
        )),
    }
}

/// A ttrpc context whose timeout ends at `deadline` (at least a millisecond: 0 means none).
pub(super) fn context_until(deadline: Instant) -> ttrpc::context::Context {
    context(deadline.saturating_duration_since(Instant::now()))
}

pub(super) fn context(timeout: Duration) -> ttrpc::context::Context {
    let nanos = i64::try_from(timeout.as_nanos())
        .unwrap_or(i64::MAX)
        .max(1_000_000);
    ttrpc::context::with_timeout(nanos)
}
