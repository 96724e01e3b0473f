//! Layers pulled by remora's own registry client ([`super::PullConfig::transfer`] unset):
//! each layer blob downloaded at most once across concurrent pulls, holding a download slot of
//! its registry host ([`HostSlots`]), under a deadline that follows from its size
//! ([`layer_deadline`]), streamed into containerd's content store (resuming a broken transfer
//! from containerd's ingest offset) and applied through `Diff` in order while the layers above
//! still download. Beside it, [`super::transfer`] is containerd's Transfer-service path.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{join_all, FutureExt};
use futures_util::StreamExt;

use super::{lease_id, open_writer, to_blob, Backend, Inner, PullError, LEASE_EXPIRY_SECS};
use crate::backend_error::BackendError;
use crate::images::backend::Blob;
use crate::images::host_slots::HostSlots;
use crate::images::manifest::{Descriptor, ImageManifest, VerifyError};
use crate::images::progress::{BlobBytes, LayerState, PullHandle};
use crate::images::reference::Reference;
use crate::images::registry::auth::Credentials;
use crate::images::registry::{RegistryClient, RegistryConfig, RegistryError};
use crate::images::unpack::Unpacker;
use crate::metrics::Metrics;
use remora_host::backoff::Backoff;

/// Times a broken blob transfer is resumed before the pull fails.
const MAX_RESUMES: u32 = 3;
/// First delay before resuming a broken transfer.
const RESUME_BACKOFF_MIN: Duration = Duration::from_millis(200);
/// Cap of that delay.
const RESUME_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// The deadline of one layer download, from the moment it has its slot: what a download that
/// never falls below the stall floor (`stall_min_bytes` per `stall_timeout`) may take.
///
/// ```text
/// deadline = (MAX_RESUMES + 1) × (request_timeout + stall_timeout)
///          + MAX_RESUMES × RESUME_BACKOFF_MAX
///          + ceil(size / stall_min_bytes) × stall_timeout
/// ```
///
/// Each attempt (the first and every resume) may wait `request_timeout` for its headers and
/// then run a full `stall_timeout` before the stall detector can judge it; the resumes wait
/// their backoff; and the bytes themselves arrive at no less than the floor rate. A download
/// past this is slower than the floor on average, though no single stall window caught it
/// (bytes in bursts): it gives its slot back. With the defaults (30 s, 1 min, 64 KiB) a
/// 64 MiB layer gets about 1,030 minutes, a 4 KiB one 7 minutes. `None` when stall detection
/// is off (`stall_min_bytes = 0`): then nothing defines the floor.
pub(super) fn layer_deadline(size: u64, config: &RegistryConfig) -> Option<Duration> {
    if config.stall_min_bytes == 0 {
        return None;
    }
    let attempts = MAX_RESUMES + 1;
    let windows = size.div_ceil(config.stall_min_bytes);
    let per_attempt = config.request_timeout.saturating_add(config.stall_timeout);
    let at_floor = config
        .stall_timeout
        .saturating_mul(u32::try_from(windows).unwrap_or(u32::MAX));
    Some(
        per_attempt
            .saturating_mul(attempts)
            .saturating_add(RESUME_BACKOFF_MAX.saturating_mul(MAX_RESUMES))
            .saturating_add(at_floor),
    )
}

impl Inner {
    /// Downloads the layers through remora's registry client into containerd's content
    /// store and applies them in order; returns the top snapshot's chain id.
    pub(super) async fn download_and_unpack(
        &self,
        reference: &Reference,
        manifest: &ImageManifest,
        diff_ids: &[String],
        creds: &Credentials,
        lease: &str,
        progress: &PullHandle,
    ) -> Result<String, PullError> {
        // Layers download concurrently, de-duplicated by digest across pulls and bounded by
        // the download semaphore; each is applied as soon as it and every layer below it are
        // stored, while the layers above still download: a big pull costs about its slowest
        // stage (download, or containerd's decompress-and-write in Diff.Apply), not their sum.
        let source_label = format!("containerd.io/distribution.source.{}", reference.registry);
        let source_repo = reference.repository.clone();
        // Shared: the download of layer i is awaited both by the join below and, in order,
        // by the unpacking; it runs once, polled by either.
        let fetches: Vec<_> = manifest
            .layers
            .iter()
            .zip(diff_ids)
            .map(|(layer, diff_id)| {
                let labels = HashMap::from([
                    ("containerd.io/uncompressed".to_string(), diff_id.clone()),
                    (source_label.clone(), source_repo.clone()),
                ]);
                self.layer(reference, layer, creds, lease, labels, progress)
                    .boxed()
                    .shared()
            })
            .collect();
        let layer_blobs: Vec<Blob> = manifest.layers.iter().map(to_blob).collect();
        let unpacking = async {
            let mut unpacker = Unpacker::new(
                self.backend.snapshots.as_ref(),
                self.backend.differ.as_ref(),
                lease,
                &self.config.snapshotter,
                diff_ids,
            );
            for (i, (blob, fetched)) in layer_blobs.iter().zip(&fetches).enumerate() {
                // A failed download stops the unpacking; the join reports it.
                fetched.clone().await?;
                unpacker
                    .apply_next(blob)
                    .await
                    .map_err(|e| PullError::Unpack {
                        reference: reference.to_string(),
                        source: Arc::new(e),
                    })?;
                progress.unpacked(i);
            }
            Ok::<String, PullError>(unpacker.into_top())
        };
        // Wait for every download even after a failure (no fail-fast), the unpacking's
        // included: each download deletes its own lease when it ends, so once all have
        // ended, deleting this pull's lease with sync GC leaves nothing of a failed pull
        // behind (the snapshots applied so far were made in it too). A download's failure
        // comes first: it is why the unpacking stopped.
        let (downloaded, unpacked) = tokio::join!(join_all(fetches.iter().cloned()), unpacking);
        for result in downloaded {
            result?;
        }
        unpacked
    }

    /// Makes sure one layer blob is in the content store, downloading it at most once across
    /// all concurrent pulls.
    async fn layer(
        &self,
        reference: &Reference,
        desc: &Descriptor,
        creds: &Credentials,
        lease: &str,
        labels: HashMap<String, String>,
        progress: &PullHandle,
    ) -> Result<(), PullError> {
        let digest = desc.digest.to_string();
        if self.protect(reference, lease, &digest).await? {
            self.metrics.blob_dedup_hit("stored");
            progress.layer(&digest, LayerState::Present);
            return Ok(());
        }
        let job = BlobJob {
            bytes: self.progress.blob(&digest),
            metrics: self.metrics.clone(),
            backend: self.backend.clone(),
            registry: self.registry.clone(),
            downloads: self.downloads.clone(),
            reference: reference.clone(),
            desc: desc.clone(),
            creds: creds.clone(),
            labels,
        };
        let led = AtomicBool::new(false);
        let result = self
            .blobs
            .run(digest.clone(), |_cancel| {
                led.store(true, Ordering::Relaxed);
                job.run()
            })
            .await;
        if !led.load(Ordering::Relaxed) {
            self.metrics.blob_dedup_hit("in_flight");
        }
        if result.is_ok() {
            progress.layer(&digest, LayerState::Stored);
        }
        result
    }
}

/// One blob download into the content store, owned by a spawned task so it outlives any
/// single waiter. It writes under a lease of its own: the waiting pulls protect the blob with
/// their leases, and any of them may fail and delete its lease while the download goes on.
struct BlobJob {
    /// The blob's byte counter, which every pull of it reads (`images::progress`).
    bytes: Arc<BlobBytes>,
    metrics: Metrics,
    backend: Backend,
    registry: Arc<RegistryClient>,
    downloads: HostSlots,
    reference: Reference,
    desc: Descriptor,
    creds: Credentials,
    labels: HashMap<String, String>,
}

impl BlobJob {
    async fn run(self) -> Result<(), PullError> {
        // Per registry (whichever mirror serves it): a registry trickling its layers holds
        // only its own share of the slots.
        let _permit = self
            .downloads
            .acquire(&self.reference.registry)
            .await
            .map_err(|source| PullError::DownloadsBusy {
                reference: self.reference.to_string(),
                source,
            })?;
        let lease = lease_id("blob");
        self.backend
            .leases
            .create(&lease, LEASE_EXPIRY_SECS)
            .await
            .map_err(|e| self.containerd_err(e))?;
        let write_ref = format!("remora-{}", self.desc.digest);
        let result = match layer_deadline(self.desc.size, self.registry.config()) {
            // Dropping the download at its deadline drops its writer: containerd keeps what
            // it received, for the next pull to resume.
            Some(after) => {
                match tokio::time::timeout(after, self.download(&lease, &write_ref)).await {
                    Ok(result) => result,
                    Err(_elapsed) => Err(PullError::LayerDeadline {
                        reference: self.reference.to_string(),
                        digest: self.desc.digest.to_string(),
                        size: self.desc.size,
                        after,
                    }),
                }
            }
            None => self.download(&lease, &write_ref).await,
        };
        if result.is_ok() {
            // Test hook (only `kill` is meaningful here): die with a blob stored under a lease.
            let _ = crate::failpoint::hit("pull.after_blob", &self.reference.to_string()).await;
        }
        if let Err(e) = &result {
            if is_bad_data(e) {
                // The ingest holds bytes that do not hash to the digest: resuming from it
                // would fail the same way forever. Best effort: the pull error is what matters.
                let _ = self.backend.content.abort(&write_ref).await;
            }
        }
        // Not synchronous: once committed, the blob is held by the waiting pulls' leases;
        // after a failure GC removes the partial ingest whenever it runs. If the job is
        // dropped before this point, containerd expires the lease.
        let cleanup = self.backend.leases.delete(&lease, false).await;
        result?;
        cleanup.map_err(|e| self.containerd_err(e))
    }

    fn containerd_err(&self, source: BackendError) -> PullError {
        PullError::Containerd {
            reference: self.reference.to_string(),
            source,
        }
    }

    async fn download(&self, lease: &str, write_ref: &str) -> Result<(), PullError> {
        let cerr = |source| self.containerd_err(source);
        let blob = to_blob(&self.desc);
        let Some(mut writer) = open_writer(self.backend.content.as_ref(), lease, write_ref, &blob)
            .await
            .map_err(cerr)?
        else {
            return Ok(()); // stored meanwhile
        };
        // The offset is what containerd already holds: an interrupted earlier write to resume,
        // or the whole blob when another namespace stored it (containerd shares blob data
        // across namespaces and only needs the commit to link it into ours).
        // A transfer that breaks mid-blob (connection reset, registry restart) resumes from
        // what containerd already holds, a few times, with backoff; other errors fail at once.
        let mut backoff = Backoff::new(RESUME_BACKOFF_MIN, RESUME_BACKOFF_MAX);
        let mut resumes = 0;
        // The host the bytes came from, for a digest mismatch found at the commit.
        let mut host = self.reference.registry.clone();
        self.bytes.at_least(writer.offset());
        while writer.offset() < self.desc.size {
            let result = async {
                // Only containerd reads these bytes, and it hashes them as it writes them and
                // refuses a commit whose digest or size is wrong: hashing them here too
                // cost a second pass over every byte (a fifth of remora's CPU time in a big
                // pull). A wrong blob is still caught before anything uses it.
                let mut stream = self
                    .registry
                    .fetch_blob(&self.reference, &self.desc, writer.offset(), &self.creds)
                    .await?
                    .digest_checked_by_store();
                host = stream.host().to_string();

                while let Some(chunk) = stream.next().await {
                    let chunk = chunk?;
                    self.metrics.pull_bytes(chunk.len() as u64);
                    self.bytes.add(chunk.len() as u64);
                    writer.write(chunk).await.map_err(cerr)?;
                }
                Ok::<(), PullError>(())
            }
            .await;
            if let Err(PullError::Registry(RegistryError::Stalled { .. })) = &result {
                self.metrics.pull_stalled();
            }
            match result {
                Ok(()) => break,
                Err(PullError::Registry(e)) if e.is_retriable() && resumes < MAX_RESUMES => {
                    resumes += 1;
                    tokio::time::sleep(backoff.next_delay()).await;
                }
                Err(e) => return Err(e),
            }
        }
        // containerd verifies the digest and size at commit, including the resumed prefix. A
        // refusal means the registry sent the wrong bytes: reported as the registry's
        // (DATA_LOSS), as when remora hashed layers itself.
        writer
            .commit(self.labels.clone())
            .await
            .map_err(|e| match e.message() {
                Some(message) if e.is_content_commit_refused() => {
                    PullError::Registry(RegistryError::Verify {
                        reference: self.reference.to_string(),
                        host,
                        what: format!("blob {}", self.desc.digest),
                        source: VerifyError::RefusedByStore(message.to_string()),
                    })
                }
                _ => cerr(e),
            })?;
        Ok(())
    }
}

/// Errors that mean the downloaded bytes are wrong (not merely incomplete).
pub(super) fn is_bad_data(e: &PullError) -> bool {
    match e {
        PullError::Registry(RegistryError::Verify { .. }) => true,
        // containerd refuses a commit whose digest or size does not match.
        PullError::Containerd { source, .. } => source.is_content_commit_refused(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_deadline_follows_size_and_the_stall_floor() {
        let config = RegistryConfig::default();
        let min = |m: u64| Duration::from_secs(60 * m);
        // 4 × (30 s + 1 min) + 3 × 2 s of attempts, and one window per 64 KiB.
        let fixed = Duration::from_secs(4 * 90 + 6);
        assert_eq!(layer_deadline(0, &config), Some(fixed));
        assert_eq!(layer_deadline(1, &config), Some(fixed + min(1)));
        assert_eq!(layer_deadline(64 << 10, &config), Some(fixed + min(1)));
        assert_eq!(
            layer_deadline((64 << 10) + 1, &config),
            Some(fixed + min(2))
        );
        assert_eq!(layer_deadline(64 << 20, &config), Some(fixed + min(1024)));
        // Absurd sizes saturate rather than overflow.
        assert!(layer_deadline(u64::MAX, &config).is_some());
        let off = RegistryConfig {
            stall_min_bytes: 0,
            ..RegistryConfig::default()
        };
        assert_eq!(layer_deadline(1 << 30, &off), None);
    }
}
