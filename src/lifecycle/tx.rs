//! The transaction of a mutating operation (RunPodSandbox, CreateContainer): its intent in the
//! journal, and the undo list its steps register as they make things.
//!
//! Every such operation runs through [`Pods::transaction`]:
//!
//! ```text
//! pods.transaction(intent, log, |pods, tx, log| Box::pin(async move {
//!     // (the intent is on disk before this runs)
//!     … make X …;  tx.on_undo("remove X", async move { … });
//!     tx.commit();                              // success: nothing to undo
//!     Ok(())
//! })).await                                     // failure: undo in reverse, then drop the
//!                                               // intent, or keep it for the sweep if an
//!                                               // undo step failed (reported in the error)
//! ```
//!
//! The whole operation runs in a task of its own, so a cancelled RPC cannot cut it (or its
//! rollback) short; each undo step runs with its own timeout there (never in the caller's
//! possibly cancelled task).
//!
//! Steps that run concurrently (RunPodSandbox's CNI ADD beside its rootfs and pause task)
//! register their undos on a [`Branch`] each, which the transaction takes back with
//! [`Tx::join`] once every branch has finished, failed or not: the undo order is the order
//! of the joins, not the order in which the branches' steps happened to finish, so a rollback
//! is the same whichever branch was faster.
//!
//! ```text
//! let (mut a, mut b) = (tx.branch(), tx.branch());
//! let (ra, rb) = tokio::join!(make_a(&mut a), make_b(&mut b));   // never try_join!
//! tx.join(a);  tx.join(b);                      // b's undos run before a's
//! ra?; rb?;
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use slog::{warn, Logger};

use super::error::{FailedUndo, RollbackError, UndoError, WithRollback};
use super::journal::Intent;
use super::Pods;

/// Bound on each rollback step.
pub(crate) const UNDO_TIMEOUT: Duration = Duration::from_secs(30);

type UndoFuture = Pin<Box<dyn Future<Output = Result<(), UndoError>> + Send>>;

/// Where a step registers the undo of what it made: the transaction itself, or one of its
/// concurrent [`Branch`]es.
pub(crate) trait UndoLog {
    /// The id of the object being made.
    fn id(&self) -> &str;

    /// Registers the undo of something just made; undos run in reverse order.
    fn on_undo<E: Into<UndoError>>(
        &mut self,
        what: &'static str,
        step: impl Future<Output = Result<(), E>> + Send + 'static,
    );
}

fn boxed<E: Into<UndoError>>(
    what: &'static str,
    step: impl Future<Output = Result<(), E>> + Send + 'static,
) -> (&'static str, UndoFuture) {
    (
        what,
        Box::pin(async move { step.await.map_err(Into::into) }),
    )
}

/// An operation in flight: its intent and the undo steps registered so far.
pub(crate) struct Tx {
    intent: Intent,
    undo: Vec<(&'static str, UndoFuture)>,
}

/// The undo steps of one concurrent branch of an operation, in the order its steps made
/// things; they join the transaction's with [`Tx::join`].
pub(crate) struct Branch {
    id: String,
    undo: Vec<(&'static str, UndoFuture)>,
}

impl UndoLog for Branch {
    fn id(&self) -> &str {
        &self.id
    }

    fn on_undo<E: Into<UndoError>>(
        &mut self,
        what: &'static str,
        step: impl Future<Output = Result<(), E>> + Send + 'static,
    ) {
        self.undo.push(boxed(what, step));
    }
}

impl UndoLog for Tx {
    fn id(&self) -> &str {
        self.intent.id()
    }

    fn on_undo<E: Into<UndoError>>(
        &mut self,
        what: &'static str,
        step: impl Future<Output = Result<(), E>> + Send + 'static,
    ) {
        self.undo.push(boxed(what, step));
    }
}

impl Tx {
    /// Registers the undo of something just made; undos run in reverse order.
    pub(crate) fn on_undo<E: Into<UndoError>>(
        &mut self,
        what: &'static str,
        step: impl Future<Output = Result<(), E>> + Send + 'static,
    ) {
        UndoLog::on_undo(self, what, step);
    }

    /// An empty undo list for steps about to run concurrently with others.
    pub(crate) fn branch(&self) -> Branch {
        Branch {
            id: self.id().to_string(),
            undo: Vec::new(),
        }
    }

    /// Takes a finished branch's undo steps after the ones registered so far: they run
    /// before everything registered earlier, and after everything registered later.
    pub(crate) fn join(&mut self, branch: Branch) {
        self.undo.extend(branch.undo);
    }

    /// The operation succeeded: nothing is to be undone.
    pub(crate) fn commit(&mut self) {
        self.undo.clear();
    }

    /// The id of the object being made.
    pub(crate) fn id(&self) -> &str {
        UndoLog::id(self)
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
    /// Runs `op` as a transaction for `intent`, in a task of its own: the intent is recorded
    /// before `op` makes anything ([`WithRollback::journal`] if it cannot be), and if `op`
    /// fails, the undo steps it registered run (`finish`).
    pub(crate) async fn transaction<E>(
        self: &Arc<Self>,
        intent: Intent,
        log: Logger,
        op: impl for<'a> FnOnce(&'a Arc<Pods>, &'a mut Tx, &'a Logger) -> BoxFuture<'a, Result<(), E>>
            + Send
            + 'static,
    ) -> Result<(), E>
    where
        E: WithRollback + Send + 'static,
    {
        let me = self.clone();
        // Own task: a cancelled RPC must not cut the operation (and its rollback) short.
        tokio::spawn(async move {
            let mut tx = me
                .begin(intent)
                .map_err(|source| E::journal(me.journal.dir().to_path_buf(), source))?;
            let result = op(&me, &mut tx, &log).await;
            me.finish(tx, result, &log).await
        })
        .await
        .map_err(E::aborted)?
    }

    /// Starts an operation: its intent is recorded before anything is made.
    fn begin(&self, intent: Intent) -> std::io::Result<Tx> {
        self.journal.begin(&intent)?;
        Ok(Tx {
            intent,
            undo: Vec::new(),
        })
    }

    /// Ends an operation: on failure its undo steps run; the intent is dropped unless an undo
    /// step failed, in which case it stays for the sweep and the failed steps are reported
    /// beside the operation's own error.
    async fn finish<T, E: WithRollback>(
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
