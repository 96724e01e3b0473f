//! The transaction of a mutating operation (RunPodSandbox, CreateContainer): its intent in the
//! journal, and the undo list its steps register as they make things.
//!
//! ```text
//! let mut tx = pods.begin(intent)?;             // intent on disk before the first effect
//! … make X …;  tx.on_undo("remove X", async move { … });
//! tx.commit();                                  // success: nothing to undo
//! pods.finish(tx, result, &log).await           // failure: undo in reverse, then drop the
//!                                               // intent, or keep it for the sweep if an
//!                                               // undo step failed (reported in the error)
//! ```
//!
//! Each undo step runs with its own timeout, in the operation's own task (never the caller's
//! possibly cancelled one).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use slog::{warn, Logger};

use super::error::{FailedUndo, RollbackError, UndoError, WithRollback};
use super::journal::Intent;
use super::Pods;

/// Bound on each rollback step.
pub(crate) const UNDO_TIMEOUT: Duration = Duration::from_secs(30);

type UndoFuture = Pin<Box<dyn Future<Output = Result<(), UndoError>> + Send>>;

/// An operation in flight: its intent and the undo steps registered so far.
pub(crate) struct Tx {
    intent: Intent,
    undo: Vec<(&'static str, UndoFuture)>,
}

impl Tx {
    /// Registers the undo of something just made; undos run in reverse order.
    pub(crate) fn on_undo<E: Into<UndoError>>(
        &mut self,
        what: &'static str,
        step: impl Future<Output = Result<(), E>> + Send + 'static,
    ) {
        self.undo.push((
            what,
            Box::pin(async move { step.await.map_err(Into::into) }),
        ));
    }

    /// The operation succeeded: nothing is to be undone.
    pub(crate) fn commit(&mut self) {
        self.undo.clear();
    }

    /// The id of the object being made.
    pub(crate) fn id(&self) -> &str {
        self.intent.id()
    }

    /// Runs the undo steps in reverse order, each bounded by [`UNDO_TIMEOUT`]; returns the
    /// failed ones. Each failure is logged as it happens (the operator's view of a rollback in
    /// progress), and reported again, all together, in the operation's error.
    async fn rollback(&mut self, log: &Logger) -> Vec<FailedUndo> {
        let mut failed = Vec::new();
        for (step, undo) in self.undo.drain(..).rev() {
            let error = match tokio::time::timeout(UNDO_TIMEOUT, undo).await {
                Ok(Ok(())) => continue,
                Ok(Err(e)) => {
                    warn!(log, "rollback step failed"; "step" => step, "error" => %e);
                    e
                }
                Err(_) => {
                    warn!(log, "rollback step timed out"; "step" => step);
                    UndoError::TimedOut(UNDO_TIMEOUT)
                }
            };
            failed.push(FailedUndo { step, error });
        }
        failed
    }
}

impl Pods {
    /// Starts an operation: its intent is recorded before anything is made.
    pub(crate) fn begin(&self, intent: Intent) -> std::io::Result<Tx> {
        self.journal.begin(&intent)?;
        Ok(Tx {
            intent,
            undo: Vec::new(),
        })
    }

    /// Ends an operation: on failure its undo steps run; the intent is dropped unless an undo
    /// step failed, in which case it stays for the sweep and the failed steps are reported
    /// beside the operation's own error.
    pub(crate) async fn finish<T, E: WithRollback>(
        &self,
        mut tx: Tx,
        result: Result<T, E>,
        log: &Logger,
    ) -> Result<T, E> {
        let result = match result {
            Ok(v) => Ok(v),
            Err(e) => {
                if !tx.undo.is_empty() {
                    warn!(log, "operation failed; rolling back"; "steps" => tx.undo.len());
                }
                let failed = tx.rollback(log).await;
                if !failed.is_empty() {
                    // e.g. containerd went away mid-call: the sweep after it is back finishes.
                    self.journal.defer(tx.intent);
                    return Err(e.with_rollback(RollbackError { failed }));
                }
                Err(e)
            }
        };
        self.journal.end(tx.intent.id());
        result
    }
}
