//! Layers pulled by containerd's Transfer service ([`super::TransferConfig`]): the request,
//! the watch over its progress reports (metrics and stall detection), and what its failures
//! mean.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use slog::debug;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{
    Inner, PullError, TransferAuth, TransferConfig, TransferProgress, TransferPull, LABEL_MANAGED,
};
use crate::backend_error::BackendError;
use crate::images::manifest::{normalize_arch, Descriptor};
use crate::images::progress::{LayerState, PullHandle};
use crate::images::reference::Reference;
use crate::images::registry::auth::Credentials;
use crate::images::registry::RegistryClient;
use crate::images::unpack::{chain_ids, UnpackError};
use crate::metrics::Metrics;

/// What a failed transfer was, read from containerd's message (containerd passes most
/// fetch failures on as text with code `Unknown`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransferFailure {
    /// containerd refused a blob whose bytes do not match its digest or size: the registry
    /// sent the wrong bytes, or cut the body short.
    Verify,
    /// The registry could not be reached, or a download broke off: worth retrying.
    Unreachable,
    /// The registry does not have a blob the manifest names.
    NotFound,
    /// Anything else: containerd's own code says what.
    Other,
}

impl TransferFailure {
    /// Classifies containerd's answer to `Transfer.Transfer`.
    pub fn of(e: &BackendError) -> Self {
        let Some(message) = e.message() else {
            return TransferFailure::Unreachable;
        };
        let m = message.to_ascii_lowercase();
        if m.contains("unexpected commit digest") || m.contains("unexpected commit size") {
            TransferFailure::Verify
        } else if e.is_not_found() || m.contains("not found") {
            TransferFailure::NotFound
        } else if e.is_unavailable()
            || [
                "unexpected eof",
                "connection refused",
                "connection reset",
                "i/o timeout",
                "no route to host",
                "tls handshake",
                "unexpected status code 5",
            ]
            .iter()
            .any(|s| m.contains(s))
        {
            TransferFailure::Unreachable
        } else {
            TransferFailure::Other
        }
    }
}

/// The credentials containerd answers a registry's challenge with, in the order remora's own
/// client prefers them: a registry token as is, an identity token to exchange, user and
/// password. `None` for an anonymous pull (no credential stream is opened).
pub(super) fn transfer_auth(creds: &Credentials) -> Option<TransferAuth> {
    if !creds.registry_token.is_empty() {
        Some(TransferAuth::Bearer(creds.registry_token.clone()))
    } else if !creds.identity_token.is_empty() {
        Some(TransferAuth::Refresh(creds.identity_token.clone()))
    } else {
        creds
            .basic()
            .map(|(username, password)| TransferAuth::Basic { username, password })
    }
}

/// The hosts containerd may be given the pull's credentials for: the registry's configured
/// hosts (mirrors and server), as remora's own client uses them, except those that named a
/// token realm elsewhere (containerd would send the credentials there). Unreadable hosts
/// configuration: none (remora's own fetch of the manifest failed on it already).
async fn auth_hosts(
    registry_client: &RegistryClient,
    host_dir: &std::path::Path,
    registry: &str,
) -> Vec<String> {
    crate::images::registry::hosts::load_hosts(Some(host_dir), registry)
        .await
        .map(|hosts| {
            hosts
                .into_iter()
                .map(|h| h.host)
                .filter(|h| !registry_client.realm_is_foreign(h))
                .collect()
        })
        .unwrap_or_default()
}

/// A stall: too few bytes in one period while downloads were in flight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Stall {
    window_bytes: u64,
    blobs: Vec<String>,
}

/// Follows a transfer's progress reports. containerd reports each blob it fetches
/// `waiting` (with its size), then its cumulative offset about every 300 ms while it grows,
/// then `complete` — or, once unpacking has taken the blob over, `extracting` and `extracted`
/// instead; a blob found present already is reported `already exists`. A blob fetched
/// between two of containerd's ticks gets no offset report at all. The watch turns the
/// reports into byte counts (for the pull metrics) and finds a stall: a period of `period`
/// in which blobs were downloading but fewer than `min_bytes` arrived in all. A period with
/// nothing downloading (waiting for a download slot, or unpacking) is no stall.
pub(super) struct ProgressWatch {
    min_bytes: u64,
    period: Duration,
    /// Every blob reported, by digest (ordered: a stall names them in order).
    blobs: BTreeMap<String, Blob>,
    window_start: Instant,
    window_bytes: u64,
}

/// What the watch knows of one blob.
#[derive(Debug, Default)]
struct Blob {
    /// Its size from its `waiting` report, until the transfer's end settles it.
    waiting: Option<i64>,
    /// The bytes counted so far; `None` while no offset was reported.
    seen: Option<i64>,
    state: BlobState,
}

/// Where a blob is; a later state never goes back to an earlier one.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum BlobState {
    /// Announced (`waiting`) or reported at its full size only.
    #[default]
    Queued,
    /// Reported downloading and not complete yet.
    Downloading,
    /// Reported complete, or being unpacked: all its bytes arrived.
    Arrived,
    /// Reported `already exists`: none of its bytes came from the registry.
    Present,
}

impl Blob {
    fn advance(&mut self, to: BlobState) {
        self.state = self.state.max(to);
    }

    /// Records offset `offset`; returns the bytes that adds.
    fn count(&mut self, offset: i64) -> u64 {
        let seen = self.seen.get_or_insert(0);
        let added = u64::try_from(offset - *seen).unwrap_or(0);
        *seen = (*seen).max(offset);
        added
    }
}

/// What one report of containerd's Transfer service says happened to a blob: its `event`
/// words, read in one place for the stall watch and the table of pulls in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reported {
    /// `waiting`: queued, with its size.
    Waiting,
    /// `downloading`: bytes up to the report's offset arrived.
    Downloading,
    /// `complete`: stored whole in the content store.
    Complete,
    /// `extracting`: being read into the snapshot (so stored whole).
    Extracting,
    /// `extracted`: read to its end into the snapshot.
    Extracted,
    /// `already exists`: in the content store before the pull.
    AlreadyExists,
    /// Anything else (the image's own events, words a newer containerd adds).
    Other,
}

impl Reported {
    fn of(event: &str) -> Self {
        match event {
            "waiting" => Self::Waiting,
            "downloading" => Self::Downloading,
            "complete" => Self::Complete,
            "extracting" => Self::Extracting,
            "extracted" => Self::Extracted,
            "already exists" => Self::AlreadyExists,
            _ => Self::Other,
        }
    }
}

impl ProgressWatch {
    pub(super) fn new(min_bytes: u64, period: Duration, now: Instant) -> Self {
        Self {
            min_bytes,
            period,
            blobs: BTreeMap::new(),
            window_start: now,
            window_bytes: 0,
        }
    }

    /// Takes one report; returns the bytes it adds now (see [`ProgressWatch::settle`] for the
    /// rest).
    pub(super) fn report(&mut self, p: &TransferProgress) -> u64 {
        let Some(digest) = &p.digest else { return 0 };
        let blob = self.blobs.entry(digest.clone()).or_default();
        let added = match Reported::of(&p.event) {
            Reported::Waiting => {
                blob.waiting.get_or_insert(p.total);
                0
            }
            Reported::Downloading => {
                if p.total <= 0 || p.progress < p.total {
                    blob.advance(BlobState::Downloading);
                }
                blob.count(p.progress)
            }
            Reported::Complete | Reported::Extracting | Reported::Extracted => {
                blob.advance(BlobState::Arrived);
                // A blob seen downloading is counted to its end now; one that never was
                // (fetched between two ticks) when the transfer ends, once an `already
                // exists` can no longer follow (containerd may report a present blob
                // `complete` when its tick falls before the `already exists`).
                if blob.seen.is_some() && blob.state != BlobState::Present {
                    blob.count(p.total)
                } else {
                    0
                }
            }
            Reported::AlreadyExists => {
                blob.advance(BlobState::Present);
                0
            }
            Reported::Other => 0,
        };
        self.window_bytes += added;
        added
    }

    /// Once the transfer has ended (no report can follow): the bytes of fetched blobs not
    /// counted yet — each blob fetched and not present before, if the transfer `succeeded`
    /// (every blob it fetched arrived), or reported complete. Counts each once (a blob's
    /// `waiting` size is taken).
    pub(super) fn settle(&mut self, succeeded: bool) -> u64 {
        let mut added = 0;
        for blob in self.blobs.values_mut() {
            let Some(total) = blob.waiting.take() else {
                continue;
            };
            let arrived = match blob.state {
                BlobState::Present => false,
                BlobState::Arrived => true,
                BlobState::Queued | BlobState::Downloading => succeeded,
            };
            if arrived {
                added += u64::try_from(total - blob.seen.unwrap_or(0)).unwrap_or(0);
            }
        }
        added
    }

    /// When the current period ends.
    pub(super) fn deadline(&self) -> Instant {
        self.window_start + self.period
    }

    /// Ends the current period at `now`: a stall if blobs were downloading and too few bytes
    /// came; otherwise a new period starts.
    pub(super) fn end_period(&mut self, now: Instant) -> Option<Stall> {
        if self.window_bytes < self.min_bytes {
            let downloading: Vec<String> = self
                .blobs
                .iter()
                .filter(|(_, blob)| blob.state == BlobState::Downloading)
                .map(|(digest, _)| digest.clone())
                .collect();
            if !downloading.is_empty() {
                return Some(Stall {
                    window_bytes: self.window_bytes,
                    blobs: downloading,
                });
            }
        }
        self.window_start = now;
        self.window_bytes = 0;
        None
    }
}

/// Why a watched transfer ended without success.
pub(super) enum Watched {
    Failed(BackendError),
    Stalled(Stall),
}

/// Gives `watch` one report and the pull metrics the bytes it adds.
fn take(
    watch: &mut ProgressWatch,
    p: &TransferProgress,
    metrics: &Metrics,
    progress: Option<&PullHandle>,
) {
    let added = watch.report(p);
    if added > 0 {
        metrics.pull_bytes(added);
    }
    if let (Some(progress), Some(digest)) = (progress, &p.digest) {
        follow(progress, digest, p);
    }
}

/// What a report of containerd's says about a layer of the pull, for `images::progress`:
/// `downloading` carries the bytes there, `complete` a stored blob, `already exists` one that
/// was there before, `extracted` one containerd has read to its end into the snapshot.
fn follow(progress: &PullHandle, digest: &str, p: &TransferProgress) {
    match Reported::of(&p.event) {
        Reported::Downloading => {
            if let (Some(bytes), Ok(offset)) =
                (progress.bytes_of(digest), u64::try_from(p.progress))
            {
                bytes.at_least(offset);
            }
        }
        Reported::Complete | Reported::Extracting => progress.layer(digest, LayerState::Stored),
        Reported::AlreadyExists => progress.layer(digest, LayerState::Present),
        Reported::Extracted => progress.layer(digest, LayerState::Unpacked),
        Reported::Waiting | Reported::Other => {}
    }
}

/// Runs `transfer` to its end while reading its progress from `reports`; a stall drops
/// (cancels) it. `image` names the pull for the `pull.transfer_downloading` failpoint;
/// `progress`, the pull's entry in the table of pulls in flight, follows the reports.
pub(super) async fn watch<F>(
    transfer: F,
    mut reports: mpsc::UnboundedReceiver<TransferProgress>,
    mut watch: ProgressWatch,
    metrics: &Metrics,
    image: &str,
    progress: Option<&PullHandle>,
) -> Result<(), Watched>
where
    F: Future<Output = Result<(), BackendError>>,
{
    tokio::pin!(transfer);
    let ended = loop {
        tokio::select! {
            result = &mut transfer => break result.map_err(Watched::Failed),
            Some(p) = reports.recv() => {
                take(&mut watch, &p, metrics, progress);
                if Reported::of(&p.event) == Reported::Downloading {
                    // Kill only: containerd is writing a blob in the pull's lease.
                    let _ = crate::failpoint::hit("pull.transfer_downloading", image).await;
                }
            }
            _ = tokio::time::sleep_until(watch.deadline()) => {
                if let Some(stall) = watch.end_period(Instant::now()) {
                    break Err(Watched::Stalled(stall));
                }
            }
        }
    };
    // Reports sent before the transfer's answer are still queued.
    while let Ok(p) = reports.try_recv() {
        take(&mut watch, &p, metrics, progress);
    }
    let rest = watch.settle(ended.is_ok());
    if rest > 0 {
        metrics.pull_bytes(rest);
    }
    ended
}

impl Inner {
    /// Has containerd's Transfer service fetch and unpack the layers of `target` (the index or
    /// manifest remora resolved, whose manifest and config are in the content store already)
    /// in this pull's `lease`; returns the top snapshot's chain id.
    // The pull's own parts (reference, target, layers, credentials, lease, progress) and the
    // strategy's config: a struct of them would be built for this one call.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn transfer_layers(
        &self,
        reference: &Reference,
        target: &Descriptor,
        diff_ids: &[String],
        creds: &Credentials,
        lease: &str,
        transfer: &TransferConfig,
        pull: &PullHandle,
    ) -> Result<String, PullError> {
        let (architecture, variant) = normalize_arch(&self.config.architecture, None);
        let name = format!("{}@{}", reference.name(), target.digest);
        let request = TransferPull {
            reference: name.clone(),
            host_dir: transfer.host_dir.clone(),
            image_name: name,
            labels: HashMap::from([(LABEL_MANAGED.to_string(), "managed".to_string())]),
            os: self.config.os.clone(),
            architecture,
            variant,
            snapshotter: self.config.snapshotter.clone(),
            lease: lease.to_string(),
            auth: transfer_auth(creds),
            auth_hosts: auth_hosts(&self.registry, &transfer.host_dir, &reference.registry).await,
        };
        let started = std::time::Instant::now();
        let (tx, rx) = mpsc::unbounded_channel();
        let progress = ProgressWatch::new(
            transfer.stall_min_bytes,
            transfer.stall_timeout,
            Instant::now(),
        );
        let pulled = watch(
            self.backend.transfer.pull(request, tx),
            rx,
            progress,
            &self.metrics,
            &reference.to_string(),
            Some(pull),
        )
        .await;
        match pulled {
            Ok(()) => {
                debug!(self.log, "layers pulled by containerd's Transfer service";
                    "image" => %reference, "took_ms" => started.elapsed().as_millis());
            }
            Err(Watched::Failed(source)) => {
                return Err(PullError::Transfer {
                    reference: reference.to_string(),
                    failure: TransferFailure::of(&source),
                    source,
                })
            }
            Err(Watched::Stalled(stall)) => {
                self.metrics.pull_stalled();
                return Err(PullError::TransferStalled {
                    reference: reference.to_string(),
                    window_bytes: stall.window_bytes,
                    period: transfer.stall_timeout,
                    min_bytes: transfer.stall_min_bytes,
                    blobs: stall.blobs.join(", "),
                });
            }
        }
        // containerd unpacked the manifest it picked for the platform; the image's snapshot
        // must be the chain of the manifest remora picked (the one its record will name).
        let top = chain_ids(diff_ids).pop().unwrap_or_default();
        if top.is_empty() {
            return Ok(top);
        }
        let present = self
            .backend
            .snapshots
            .exists(&self.config.snapshotter, &top)
            .await
            .map_err(|e| self.containerd_err(reference, e))?;
        if !present {
            return Err(PullError::Unpack {
                reference: reference.to_string(),
                source: Arc::new(UnpackError::NotUnpacked {
                    snapshotter: self.config.snapshotter.clone(),
                    chain_id: top,
                }),
            });
        }
        Ok(top)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend_error::BackendCode;

    fn report(event: &str, digest: &str, progress: i64, total: i64) -> TransferProgress {
        TransferProgress {
            event: event.into(),
            digest: Some(digest.into()),
            progress,
            total,
        }
    }

    fn call(code: BackendCode, message: &str) -> BackendError {
        BackendError::Call {
            address: "/run/c.sock".into(),
            op: "Transfer.Transfer",
            code,
            message: message.into(),
        }
    }

    /// [`watch`] with a stall check that never fires (1 byte a minute).
    async fn watch_without_stalls<F>(
        transfer: F,
        reports: mpsc::UnboundedReceiver<TransferProgress>,
        metrics: &Metrics,
    ) -> Result<(), Watched>
    where
        F: Future<Output = Result<(), BackendError>>,
    {
        let progress = ProgressWatch::new(1, Duration::from_secs(60), Instant::now());
        watch(transfer, reports, progress, metrics, "img", None).await
    }

    #[tokio::test]
    async fn the_pulls_table_follows_containerds_reports() {
        let table = crate::images::progress::Progress::new();
        let pull = table.start("img");
        pull.layers([("sha256:a", 100), ("sha256:b", 50), ("sha256:c", 10)]);
        let (tx, rx) = mpsc::unbounded_channel();
        let (go, seen) = tokio::sync::oneshot::channel::<()>();
        let transfer = async move {
            tx.send(report("downloading", "sha256:a", 30, 100)).ok();
            tx.send(report("already exists", "sha256:c", 10, 10)).ok();
            // Held until the table was read mid-transfer.
            let _ = seen.await;
            tx.send(report("complete", "sha256:a", 100, 100)).ok();
            tx.send(report("complete", "sha256:b", 50, 50)).ok();
            tx.send(report("extracted", "sha256:a", 100, 100)).ok();
            Ok(())
        };
        let check = async {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let v = pull.view();
                if v.bytes_done == 40 {
                    assert_eq!((v.layers_stored, v.layers_present), (1, 1));
                    assert_eq!(v.phase, crate::images::progress::Phase::Downloading);
                    break;
                }
                assert!(Instant::now() < deadline, "never saw 30 + 10 bytes: {v:?}");
                tokio::task::yield_now().await;
            }
            go.send(()).ok();
        };
        let progress = ProgressWatch::new(1, Duration::from_secs(60), Instant::now());
        let metrics = Metrics::new();
        let (out, ()) = tokio::join!(
            watch(transfer, rx, progress, &metrics, "img", Some(&pull)),
            check
        );
        assert!(out.is_ok());
        let v = pull.view();
        assert_eq!((v.bytes_done, v.bytes), (160, 160));
        assert_eq!((v.layers_stored, v.layers_unpacked), (3, 1));
        assert_eq!(v.phase, crate::images::progress::Phase::Unpacking);
    }

    #[test]
    fn reports_count_each_byte_once() {
        let t0 = Instant::now();
        let mut w = ProgressWatch::new(100, Duration::from_secs(10), t0);
        assert_eq!(w.report(&report("downloading", "a", 30, 100)), 30);
        assert_eq!(w.report(&report("downloading", "a", 70, 100)), 40);
        // A repeated offset adds nothing; `complete` adds the rest of a blob seen downloading.
        assert_eq!(w.report(&report("downloading", "a", 70, 100)), 0);
        assert_eq!(w.report(&report("complete", "a", 100, 100)), 30);
        assert_eq!(w.report(&report("extracting", "a", 10, 100)), 0);
        let step = TransferProgress {
            event: "Pulling from x".into(),
            digest: None,
            progress: 0,
            total: 0,
        };
        assert_eq!(w.report(&step), 0);
    }

    #[test]
    fn blobs_fetched_between_two_ticks_count_at_the_end_unless_present() {
        let t0 = Instant::now();
        let mut w = ProgressWatch::new(100, Duration::from_secs(10), t0);
        for (d, size) in [
            ("fast", 50),
            ("unpacked", 40),
            ("present", 70),
            ("slow", 100),
        ] {
            assert_eq!(w.report(&report("waiting", d, 0, size)), 0);
        }
        // No offset report: counted when the transfer ends (an `already exists` may follow).
        assert_eq!(w.report(&report("complete", "fast", 50, 50)), 0);
        assert_eq!(w.report(&report("extracted", "unpacked", 40, 40)), 0);
        // Present before the transfer, maybe reported `complete` before `already exists`.
        assert_eq!(w.report(&report("complete", "present", 70, 70)), 0);
        assert_eq!(w.report(&report("already exists", "present", 70, 70)), 0);
        // Seen downloading: counted as it goes, and to its end when unpacking takes it over.
        assert_eq!(w.report(&report("downloading", "slow", 30, 100)), 30);
        assert_eq!(w.report(&report("extracting", "slow", 10, 100)), 70);
        assert_eq!(w.report(&report("extracted", "slow", 100, 100)), 0);
        assert_eq!(w.settle(true), 50 + 40);
        assert_eq!(w.settle(true), 0, "counted once");
    }

    #[test]
    fn a_failed_transfer_counts_only_the_blobs_that_arrived() {
        let t0 = Instant::now();
        let mut w = ProgressWatch::new(100, Duration::from_secs(10), t0);
        w.report(&report("waiting", "arrived", 0, 50));
        w.report(&report("waiting", "broken", 0, 80));
        w.report(&report("complete", "arrived", 50, 50));
        assert_eq!(w.report(&report("downloading", "broken", 20, 80)), 20);
        assert_eq!(w.settle(false), 50);
    }

    #[test]
    fn a_blob_being_unpacked_is_no_longer_downloading() {
        let t0 = Instant::now();
        let period = Duration::from_secs(10);
        let mut w = ProgressWatch::new(100, period, t0);
        w.report(&report("downloading", "a", 500, 1000));
        // containerd may skip `complete` once unpacking took the blob over.
        w.report(&report("extracting", "a", 0, 1000));
        assert_eq!(w.end_period(t0 + period), None);
        // A long unpack, no bytes: no stall.
        assert_eq!(w.end_period(t0 + 2 * period), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_transfer_counts_the_reports_queued_before_its_answer() {
        let (tx, rx) = mpsc::unbounded_channel();
        let metrics = Metrics::new();
        let transfer = async move {
            // All sent before the answer, none read yet.
            tx.send(report("waiting", "sha256:a", 0, 3000)).ok();
            tx.send(report("waiting", "sha256:b", 0, 777)).ok();
            tx.send(report("downloading", "sha256:a", 1000, 3000)).ok();
            tx.send(report("extracted", "sha256:a", 3000, 3000)).ok();
            tx.send(report("extracted", "sha256:b", 777, 777)).ok();
            Ok(())
        };
        let out = watch_without_stalls(transfer, rx, &metrics).await;
        assert!(out.is_ok());
        let text = metrics.encode();
        assert!(text.contains(&format!(" {}", 3000 + 777)), "{text}");
    }

    #[test]
    fn a_period_with_downloads_and_too_few_bytes_is_a_stall() {
        let t0 = Instant::now();
        let period = Duration::from_secs(10);
        let mut w = ProgressWatch::new(100, period, t0);
        w.report(&report("downloading", "a", 150, 1000));
        assert_eq!(w.deadline(), t0 + period);
        // 150 bytes in the first period: no stall, a new period starts.
        assert_eq!(w.end_period(t0 + period), None);
        assert_eq!(w.deadline(), t0 + 2 * period);
        w.report(&report("downloading", "a", 200, 1000));
        assert_eq!(
            w.end_period(t0 + 2 * period),
            Some(Stall {
                window_bytes: 50,
                blobs: vec!["a".into()],
            })
        );
    }

    #[test]
    fn a_period_with_nothing_downloading_is_no_stall() {
        let t0 = Instant::now();
        let period = Duration::from_secs(10);
        let mut w = ProgressWatch::new(100, period, t0);
        // Nothing reported yet (resolving, or waiting for a download slot).
        assert_eq!(w.end_period(t0 + period), None);
        // Every download complete: unpacking may take long without a byte counted.
        w.report(&report("downloading", "a", 10, 20));
        w.report(&report("complete", "a", 20, 20));
        assert_eq!(w.end_period(t0 + 2 * period), None);
        assert_eq!(w.end_period(t0 + 3 * period), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_transfer_is_cancelled_at_the_end_of_the_period() {
        let (tx, rx) = mpsc::unbounded_channel();
        let cancelled = Arc::new(std::sync::atomic::AtomicBool::new(false));
        struct SetOnDrop(Arc<std::sync::atomic::AtomicBool>);
        impl Drop for SetOnDrop {
            fn drop(&mut self) {
                self.0.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let guard = SetOnDrop(cancelled.clone());
        let transfer = async move {
            let _guard = guard;
            tx.send(report("downloading", "sha256:a", 10, 1000)).ok();
            // Never ends by itself: only the watch can end it.
            std::future::pending::<()>().await;
            Ok(())
        };
        let period = Duration::from_secs(60);
        let started = Instant::now();
        let out = watch(
            transfer,
            rx,
            ProgressWatch::new(65536, period, started),
            &Metrics::new(),
            "img",
            None,
        )
        .await;
        match out {
            Err(Watched::Stalled(stall)) => {
                assert_eq!(stall.blobs, vec!["sha256:a".to_string()]);
                assert_eq!(stall.window_bytes, 10);
            }
            _ => panic!("expected a stall"),
        }
        assert_eq!(started.elapsed(), period);
        assert!(
            cancelled.load(std::sync::atomic::Ordering::SeqCst),
            "transfer dropped"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_transfer_is_returned_and_its_bytes_counted() {
        let (tx, rx) = mpsc::unbounded_channel();
        let metrics = Metrics::new();
        let transfer = async move {
            tx.send(report("downloading", "sha256:a", 4096, 8192)).ok();
            tokio::time::sleep(Duration::from_millis(10)).await;
            Err(call(BackendCode::Unknown, "failed to copy: unexpected EOF"))
        };
        let out = watch_without_stalls(transfer, rx, &metrics).await;
        let Err(Watched::Failed(e)) = out else {
            panic!("expected the transfer's error")
        };
        assert_eq!(TransferFailure::of(&e), TransferFailure::Unreachable);
        assert!(metrics.encode().contains("4096"), "{}", metrics.encode());
    }

    #[test]
    fn containerd_messages_are_classified() {
        for (code, msg, want) in [
            (
                BackendCode::FailedPrecondition,
                "failed commit on ref \"layer-sha256:ab\": unexpected commit digest sha256:cd, expected sha256:ab: failed precondition",
                TransferFailure::Verify,
            ),
            (
                BackendCode::FailedPrecondition,
                "failed commit on ref \"layer-sha256:ab\": unexpected commit size 10, expected 30: failed precondition",
                TransferFailure::Verify,
            ),
            (BackendCode::NotFound, "failed to resolve image: x: not found", TransferFailure::NotFound),
            (
                BackendCode::Unknown,
                "dial tcp 127.0.0.1:9: connect: connection refused",
                TransferFailure::Unreachable,
            ),
            (BackendCode::Unavailable, "connection error", TransferFailure::Unreachable),
            (BackendCode::InvalidArgument, "bad platform", TransferFailure::Other),
        ] {
            assert_eq!(TransferFailure::of(&call(code, msg)), want, "{msg}");
        }
    }

    #[test]
    fn credentials_are_offered_in_the_clients_order() {
        assert_eq!(transfer_auth(&Credentials::anonymous()), None);
        let basic = Credentials {
            username: "u".into(),
            password: "p".into(),
            ..Credentials::anonymous()
        };
        assert_eq!(
            transfer_auth(&basic),
            Some(TransferAuth::Basic {
                username: "u".into(),
                password: "p".into()
            })
        );
        let identity = Credentials {
            identity_token: "i".into(),
            ..basic.clone()
        };
        assert_eq!(
            transfer_auth(&identity),
            Some(TransferAuth::Refresh("i".into()))
        );
        let token = Credentials {
            registry_token: "t".into(),
            ..identity
        };
        assert_eq!(
            transfer_auth(&token),
            Some(TransferAuth::Bearer("t".into()))
        );
    }
}
