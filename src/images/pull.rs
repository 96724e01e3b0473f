//! Pulling an image into containerd: resolve → fetch → store → unpack → record.
//!
//! # Design
//! - **Resolve** goes through the background [`Resolver`]: a tag's digest is looked up once
//!   per TTL however many callers ask, rate-limited and de-duplicated. If the image the tag
//!   names is already local, the pull ends there: one shared HEAD, no blob traffic.
//! - **Coalesce** whole pulls on (normalised reference, platform, snapshotter, credential
//!   identity): concurrent kubelet requests for one image share one leader and its result,
//!   error included. A caller that goes away does not cancel the others.
//! - **Blobs** are de-duplicated across *different* images by digest (a shared base layer is
//!   downloaded once even by two different pulls), and the layer downloads of all pulls share
//!   [`HostSlots`] (`max_concurrent_downloads` in all, `max_concurrent_downloads_per_host` per
//!   registry host): a registry trickling its layers holds only its own host's share, and a
//!   pull from another registry still finds a slot. Each layer download has a deadline that
//!   follows from its size and the stall floor (`download::layer_deadline`). Blobs stream
//!   straight into containerd's content store; a write interrupted earlier resumes from
//!   containerd's ingest offset.
//! - **Leases**: everything a pull writes is held by a pull lease until the image record
//!   references it. Every pull adds each blob it needs to its own lease *before* waiting for
//!   it, so a blob downloaded by another pull stays protected whatever that pull does. On
//!   failure the lease is deleted synchronously, so containerd's GC removes what the failed
//!   pull alone wrote: no half-made image is left. A shared blob download writes under a
//!   lease of its own, not its first pull's: that pull may fail and delete its lease while
//!   others still wait for the blob (containerd refuses a commit into a deleted lease).
//! - **Ref locks**: containerd locks a write ref while a writer has it open. A download
//!   abandoned by a failed pull may hold it for a while, so opening a writer waits a bounded
//!   time for the lock rather than failing the next pull of that blob.
//! - **GC labels** link index → manifest → config/layers → top snapshot, so containerd keeps
//!   what an image needs and frees what no image references once its records go.
//!
//! # Layout
//! This file is the shared entry: the coalesced pull, resolve, the index/manifest/config
//! fetch, GC labels and the image records. The layers take one of two strategies, chosen by
//! [`PullConfig::transfer`]: remora's own registry client (`download`: blob downloads
//! de-duplicated across pulls, resumed, applied through `Diff`), or containerd's Transfer
//! service (`transfer`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use slog::{debug, Logger};
use thiserror::Error;

use super::backend::{
    Blob, Content, ContentWriter, Differ, ImageRecord, Images, Leases, Snapshots, Transfer,
    TransferAuth, TransferProgress, TransferPull,
};
use super::coalesce::Coalescer;
use super::config_stream::ConfigParser;
use super::host_slots::{HostSlots, SlotsConfig, SlotsError};
use super::lock;
use super::manifest::{
    is_index_media_type, select_platform, Descriptor, ImageConfig, ImageManifest, Manifest,
    ManifestError, MAX_CONFIG_SIZE, MAX_MANIFEST_SIZE,
};
use super::progress::{Phase, Progress, PullHandle};
use super::reference::{Reference, ReferenceError};
use super::registry::auth::Credentials;
use super::registry::{RegistryClient, RegistryError};
use super::resolver::{Resolve, ResolveError, Resolver, ResolverError};
use super::store::{ImageIndex, ImageInfo};
use super::unpack::{chain_ids, UnpackError};
use crate::backend_error::BackendError;
use crate::metrics::{GaugeFamily, Metrics};

/// Label containerd's CRI puts on images it manages; kept for tool compatibility.
pub const LABEL_MANAGED: &str = "io.cri-containerd.image";
/// Label marking an image kubelet must not garbage-collect.
pub const LABEL_PINNED: &str = "io.cri-containerd.pinned";
/// How long containerd keeps a pull lease if remora dies mid-pull.
const LEASE_EXPIRY_SECS: u64 = 3600;
/// How long opening a content writer waits for a ref another writer holds. An abandoned
/// download keeps its writer at most for the coalescer's cancel grace.
const REF_LOCK_WAIT: Duration = Duration::from_secs(30);

/// Layer downloads that may wait for a slot at once, across all pulls.
const MAX_QUEUED_DOWNLOADS: usize = 4096;

/// A lease id of `kind`, unique across pulls and restarts.
fn lease_id(kind: &str) -> String {
    crate::images::backend::unique_id(&format!("remora-{kind}"))
}

/// Opens a content writer, waiting (bounded by [`REF_LOCK_WAIT`]) while containerd reports
/// the ref as locked by another writer: an abandoned download still winding down, or a
/// concurrent pull of another tag writing the same manifest.
async fn open_writer(
    content: &dyn Content,
    lease: &str,
    write_ref: &str,
    blob: &Blob,
) -> Result<Option<Box<dyn ContentWriter>>, BackendError> {
    let deadline = tokio::time::Instant::now() + REF_LOCK_WAIT;
    let mut delay = Duration::from_millis(10);
    loop {
        match content.writer(lease, write_ref, blob).await {
            Err(e) if e.is_unavailable() && tokio::time::Instant::now() + delay < deadline => {
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_millis(500));
            }
            other => return other,
        }
    }
}

/// Why a pull failed. Clonable: one failure reaches every coalesced caller.
#[derive(Debug, Error, Clone)]
pub enum PullError {
    /// The reference does not parse.
    #[error(transparent)]
    Reference(#[from] ReferenceError),
    /// The registry refused or failed.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The manifest, index or config is unusable.
    #[error("{reference}: {source}")]
    Manifest {
        /// The image.
        reference: String,
        /// What is wrong.
        source: Arc<ManifestError>,
    },
    /// containerd failed.
    #[error("{reference}: {source}")]
    Containerd {
        /// The image.
        reference: String,
        /// containerd's error.
        source: BackendError,
    },
    /// Unpacking into the snapshotter failed.
    #[error("{reference}: unpacking: {source}")]
    Unpack {
        /// The image.
        reference: String,
        source: Arc<UnpackError>,
    },
    /// containerd's Transfer service failed to fetch or unpack the layers.
    #[error("{reference}: pulling the layers through containerd's Transfer service: {source}")]
    Transfer {
        /// The image.
        reference: String,
        /// What kind of failure containerd's message says it was.
        failure: TransferFailure,
        /// containerd's error.
        source: BackendError,
    },
    /// The layer downloads of containerd's Transfer service made too little progress.
    #[error(
        "{reference}: layer download by containerd's Transfer service stalled: {window_bytes} \
         bytes in the last {period:?}, less than {min_bytes}; blobs in flight: {blobs}"
    )]
    TransferStalled {
        /// The image.
        reference: String,
        /// Bytes received in the last period.
        window_bytes: u64,
        /// The period.
        period: Duration,
        /// The threshold.
        min_bytes: u64,
        /// Digests of the blobs still downloading.
        blobs: String,
    },
    /// The digest resolver is shut down (remora is stopping).
    #[error("{reference}: remora is shutting down")]
    ShuttingDown {
        /// The image.
        reference: String,
    },
    /// No layer download slot could be queued for: too many downloads wait already.
    /// Retriable.
    #[error("{reference}: {source}")]
    DownloadsBusy {
        /// The image.
        reference: String,
        /// The cap that was reached.
        source: SlotsError,
    },
    /// A layer download outlived the deadline its size allows at the stall floor (see
    /// `download::layer_deadline`). Retriable: what containerd holds of it is resumed.
    #[error(
        "{reference}: download of layer {digest} ({size} bytes) did not finish within \
         {after:?}, the time its size allows at the stall floor"
    )]
    LayerDeadline {
        /// The image.
        reference: String,
        /// The layer.
        digest: String,
        /// Its size.
        size: u64,
        /// The deadline.
        after: Duration,
    },
    /// The digest lookup failed without a registry error: it panicked, gave no answer within
    /// its deadline, could not be queued, or the resolver lost its round. Retriable.
    #[error("{reference}: {source}")]
    Resolver {
        /// The image.
        reference: String,
        /// What happened to the lookup.
        source: ResolverError,
    },
}

/// Pull settings.
#[derive(Debug, Clone)]
pub struct PullConfig {
    /// Snapshotter layers are unpacked into.
    pub snapshotter: String,
    /// Platform picked from multi-platform indexes.
    pub os: String,
    /// Platform architecture (Go naming: `amd64`).
    pub architecture: String,
    /// Concurrent layer downloads across all pulls and registry hosts.
    pub max_concurrent_downloads: usize,
    /// Concurrent layer downloads from one registry host (more than
    /// `max_concurrent_downloads` counts as that).
    pub max_concurrent_downloads_per_host: usize,
    /// Set: containerd's Transfer service fetches and unpacks the layers (see
    /// [`TransferConfig`]); unset: remora downloads them and applies them through `Diff`.
    pub transfer: Option<TransferConfig>,
}

/// Layers pulled by containerd's Transfer service.
///
/// remora still resolves the tag, fetches and checks the index, manifest and config (with
/// their size limits, streaming the config) into the content store under its pull lease; the
/// transfer then runs in that lease for `name@digest`: containerd finds those blobs present,
/// downloads the layers straight from the registry and unpacks them, so the layer bytes never
/// cross remora's gRPC connection. containerd's transfer plugin settings (its own
/// `max_concurrent_downloads`) bound the layer downloads, not remora's.
#[derive(Debug, Clone)]
pub struct TransferConfig {
    /// hosts.toml directory containerd resolves the registry's endpoints with (remora's
    /// `config_path`, so both clients reach the same endpoints).
    pub host_dir: std::path::PathBuf,
    /// A transfer whose downloads in flight receive fewer bytes than this within
    /// `stall_timeout` is cancelled.
    pub stall_min_bytes: u64,
    /// The stall period.
    pub stall_timeout: Duration,
}

/// The containerd services a pull writes through.
#[derive(Clone)]
pub struct Backend {
    /// Content store.
    pub content: Arc<dyn Content>,
    /// Image records.
    pub images: Arc<dyn Images>,
    /// Leases.
    pub leases: Arc<dyn Leases>,
    /// Snapshots.
    pub snapshots: Arc<dyn Snapshots>,
    /// Diff service.
    pub differ: Arc<dyn Differ>,
    /// Transfer service.
    pub transfer: Arc<dyn Transfer>,
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct PullKey {
    reference: String,
    platform: String,
    snapshotter: String,
    identity: String,
}

/// Pulls images. Share it behind an `Arc`.
pub struct Puller {
    inner: Arc<Inner>,
}

struct Inner {
    config: PullConfig,
    backend: Backend,
    registry: Arc<RegistryClient>,
    index: Arc<ImageIndex>,
    resolver: Resolver,
    /// The overall deadline of one digest lookup, also for the direct one after a failure.
    resolve_timeout: Duration,
    /// Credentials for resolver keys (the resolver only carries strings), held only while a
    /// caller waits on that key (see [`CredsHold`]).
    creds: Arc<Mutex<HashMap<String, HeldCreds>>>,
    pulls: Coalescer<PullKey, ImageInfo, PullError>,
    blobs: Coalescer<String, (), PullError>,
    /// Layer download slots, shared out per registry host.
    downloads: HostSlots,
    /// The pulls in flight, for the log, the metrics and `remora pulls`.
    progress: Progress,
    metrics: Metrics,
    log: Logger,
}

/// Credentials of a resolver key and how many callers are waiting on that key.
struct HeldCreds {
    creds: Credentials,
    holders: usize,
}

/// Puts a caller's credentials where the resolver's lookup finds them, for as long as the
/// caller waits; the last holder of a key to go (answered, failed or cancelled) removes them,
/// so no credentials stay in memory past the pulls that brought them.
struct CredsHold {
    map: Arc<Mutex<HashMap<String, HeldCreds>>>,
    key: String,
}

impl CredsHold {
    fn new(map: &Arc<Mutex<HashMap<String, HeldCreds>>>, key: &str, creds: &Credentials) -> Self {
        lock(map)
            .entry(key.to_owned())
            .and_modify(|h| h.holders += 1)
            .or_insert_with(|| HeldCreds {
                creds: creds.clone(),
                holders: 1,
            });
        Self {
            map: Arc::clone(map),
            key: key.to_owned(),
        }
    }
}

impl Drop for CredsHold {
    fn drop(&mut self) {
        let mut map = lock(&self.map);
        if let Some(held) = map.get_mut(&self.key) {
            held.holders -= 1;
            if held.holders == 0 {
                map.remove(&self.key);
            }
        }
    }
}

/// Resolver adapter: key = `<credential identity>\0<reference>`, value = descriptor JSON.
struct RegistryResolve {
    registry: Arc<RegistryClient>,
    creds: Arc<Mutex<HashMap<String, HeldCreds>>>,
}

#[async_trait::async_trait]
impl Resolve for RegistryResolve {
    /// The registry the reference names (`docker.io`, `127.0.0.1:5000`): lookups share slots
    /// and rate per registry, whichever mirror serves it. A key that does not parse fails its
    /// lookup at once; "" groups those.
    fn host(&self, key: &str) -> String {
        key.split_once('\0')
            .and_then(|(_, reference)| Reference::parse(reference).ok())
            .map(|r| r.registry)
            .unwrap_or_default()
    }

    async fn resolve(&self, key: &str) -> Result<String, ResolveError> {
        let (_, reference) = key
            .split_once('\0')
            .ok_or_else(|| ResolveError::permanent(format!("malformed resolver key {key:?}")))?;
        let reference =
            Reference::parse(reference).map_err(|e| ResolveError::permanent(e.to_string()))?;
        // Absent only if every caller of the key went away meanwhile: then nobody needs the
        // answer, and an anonymous lookup leaks nothing.
        let creds = lock(&self.creds)
            .get(key)
            .map(|h| h.creds.clone())
            .unwrap_or_default();
        match self.registry.resolve(&reference, &creds).await {
            Ok(resolved) => serde_json::to_string(&resolved.descriptor)
                .map_err(|e| ResolveError::permanent(e.to_string())),
            Err(e) => {
                // The resolver carries strings; keep the typed error by encoding it? No: the
                // caller re-runs a direct resolve to get the typed error (see `resolve`).
                if e.is_retriable() {
                    Err(ResolveError::retriable(e.to_string()))
                } else {
                    Err(ResolveError::permanent(e.to_string()))
                }
            }
        }
    }
}

impl Puller {
    /// A puller over `backend`, fetching with `registry`, recording into `index`.
    pub fn new(
        config: PullConfig,
        backend: Backend,
        registry: Arc<RegistryClient>,
        index: Arc<ImageIndex>,
        resolver_config: super::resolver::ResolverConfig,
        metrics: Metrics,
        log: Logger,
    ) -> Result<Self, super::resolver::ConfigError> {
        let creds = Arc::new(Mutex::new(HashMap::new()));
        let resolve_timeout = resolver_config.resolve_timeout;
        let resolver = Resolver::with_metrics(
            resolver_config,
            RegistryResolve {
                registry: registry.clone(),
                creds: creds.clone(),
            },
            metrics.clone(),
        )?;
        let downloads = HostSlots::new(SlotsConfig {
            total: config.max_concurrent_downloads,
            per_host: config.max_concurrent_downloads_per_host,
            // One waiter per layer of the pulls in flight, which kubelet and the CRI
            // listener bound; this only stops a runaway.
            max_waiting: MAX_QUEUED_DOWNLOADS,
        });
        let slots = downloads.clone();
        metrics.add_gauges(move || {
            vec![GaugeFamily::single(
                "layer_downloads_waiting",
                "Layer downloads waiting for a slot of their registry host",
                None,
                slots.stats().waiting as f64,
            )]
        });
        let progress = Progress::new();
        let in_flight = progress.clone();
        metrics.add_gauges(move || progress_gauges(&in_flight));
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                backend,
                registry,
                index,
                resolver,
                resolve_timeout,
                creds,
                pulls: Coalescer::new(),
                blobs: Coalescer::new(),
                downloads,
                progress,
                metrics,
                log,
            }),
        })
    }

    /// Pulls `image` (any reference form kubelet sends) with `creds`; returns the image.
    pub async fn pull(&self, image: &str, creds: Credentials) -> Result<ImageInfo, PullError> {
        let reference = Reference::parse(image)?;
        let key = PullKey {
            reference: reference.to_string(),
            platform: format!(
                "{}/{}",
                self.inner.config.os, self.inner.config.architecture
            ),
            snapshotter: self.inner.config.snapshotter.clone(),
            identity: creds.identity(),
        };
        let inner = self.inner.clone();
        // Set when this caller's work runs, i.e. it leads the pull; a follower's is dropped.
        let led = AtomicBool::new(false);
        let result = self
            .inner
            .pulls
            .run(key, |_cancel| {
                led.store(true, Ordering::Relaxed);
                inner.metrics.pull_started();
                async move {
                    let started = std::time::Instant::now();
                    // In the table for as long as the work runs, however it ends.
                    let progress = inner.progress.start(&reference.to_string());
                    let result = inner.pull(reference, creds, &progress).await;
                    inner
                        .metrics
                        .pull_finished(result.is_ok(), started.elapsed());
                    result
                }
            })
            .await;
        if !led.load(Ordering::Relaxed) {
            self.inner.metrics.pull_coalesced();
        }
        result
    }

    /// The pulls in flight and their progress.
    pub fn progress(&self) -> &Progress {
        &self.inner.progress
    }

    /// Pulls in flight (for tests and metrics).
    pub fn in_flight(&self, image: &str) -> bool {
        Reference::parse(image).is_ok_and(|r| {
            self.inner.pulls.in_flight(&PullKey {
                reference: r.to_string(),
                platform: format!(
                    "{}/{}",
                    self.inner.config.os, self.inner.config.architecture
                ),
                snapshotter: self.inner.config.snapshotter.clone(),
                identity: Credentials::anonymous().identity(),
            })
        })
    }
}

impl Inner {
    fn containerd_err(&self, reference: &Reference, source: BackendError) -> PullError {
        PullError::Containerd {
            reference: reference.to_string(),
            source,
        }
    }

    fn manifest_err(&self, reference: &Reference, source: ManifestError) -> PullError {
        PullError::Manifest {
            reference: reference.to_string(),
            source: Arc::new(source),
        }
    }

    /// The descriptor the reference names now, via the shared resolver.
    async fn resolve(
        &self,
        reference: &Reference,
        creds: &Credentials,
    ) -> Result<Descriptor, PullError> {
        let key = format!("{}\0{}", creds.identity(), reference);
        let _hold = CredsHold::new(&self.creds, &key, creds);
        match self.resolver.resolve(&key).await {
            Ok(json) => serde_json::from_str(&json).map_err(|e| {
                self.manifest_err(
                    reference,
                    ManifestError::Json {
                        what: "resolved descriptor",
                        source: e,
                    },
                )
            }),
            // Only a resolver that was shut down says so: remora is stopping.
            Err(ResolverError::ShutDown) => Err(PullError::ShuttingDown {
                reference: reference.to_string(),
            }),
            // The resolver keeps errors as text; ask once directly for the typed error (it is
            // in backoff, so this costs one request per failed pull, not per caller), under
            // the same deadline as the lookup.
            Err(ResolverError::Resolve(_)) => {
                self.resolver.invalidate(&key);
                let resolved = tokio::time::timeout(
                    self.resolve_timeout,
                    self.registry.resolve(reference, creds),
                )
                .await
                .map_err(|_| PullError::Resolver {
                    reference: reference.to_string(),
                    source: ResolverError::TimedOut {
                        after: self.resolve_timeout,
                    },
                })??;
                Ok(resolved.descriptor)
            }
            // A lookup that panicked or hung: asking again directly would do the same.
            Err(source) => Err(PullError::Resolver {
                reference: reference.to_string(),
                source,
            }),
        }
    }

    async fn pull(
        &self,
        reference: Reference,
        creds: Credentials,
        progress: &PullHandle,
    ) -> Result<ImageInfo, PullError> {
        let target = self.resolve(&reference, &creds).await?;
        let digest_ref = format!("{}@{}", reference.name(), target.digest);
        if let Some(info) = self.index.get(&digest_ref) {
            if self.unpacked(&info).await {
                // Warm path: the tag still names an image we have. Make sure the tag's record
                // points there (a retag by another client), and answer.
                let name = reference.to_string();
                if self.index.get(&name).map(|i| i.id) != Some(info.id.clone()) {
                    self.record(&reference, &target, &info).await?;
                }
                debug!(self.log, "image already present"; "image" => %reference, "image_id" => &info.id);
                return Ok(info);
            }
        }

        let lease = lease_id("pull");
        self.backend
            .leases
            .create(&lease, LEASE_EXPIRY_SECS)
            .await
            .map_err(|e| self.containerd_err(&reference, e))?;
        let result = self
            .fetch_and_unpack(&reference, &target, &creds, &lease, progress)
            .await;
        // Success: the image records now reference everything, the lease can go (async GC).
        // Failure: delete synchronously so GC removes what this pull alone wrote.
        let cleanup = self.backend.leases.delete(&lease, result.is_err()).await;
        let info = result?;
        cleanup.map_err(|e| self.containerd_err(&reference, e))?;
        Ok(info)
    }

    async fn unpacked(&self, info: &ImageInfo) -> bool {
        info.chain_id.is_empty()
            || self
                .backend
                .snapshots
                .exists(&self.config.snapshotter, &info.chain_id)
                .await
                .unwrap_or(false)
    }

    /// The pull proper, under `lease`: the manifest, the config, the layers by the configured
    /// strategy (containerd's Transfer service, or remora's own downloads), GC links, records.
    async fn fetch_and_unpack(
        &self,
        reference: &Reference,
        target: &Descriptor,
        creds: &Credentials,
        lease: &str,
        progress: &PullHandle,
    ) -> Result<ImageInfo, PullError> {
        let (manifest_desc, manifest, index) =
            self.fetch_manifest(reference, target, creds, lease).await?;

        // Config, parsed as it streams by.
        let config = self
            .config(reference, &manifest.config, creds, lease)
            .await?;
        let diff_ids: Vec<String> = config
            .rootfs
            .diff_ids
            .iter()
            .map(|d| d.as_str().to_string())
            .collect();
        if diff_ids.len() != manifest.layers.len() {
            return Err(PullError::Unpack {
                reference: reference.to_string(),
                source: Arc::new(UnpackError::LayerCount {
                    layers: manifest.layers.len(),
                    diff_ids: diff_ids.len(),
                }),
            });
        }

        progress.layers(manifest.layers.iter().map(|l| (l.digest.as_str(), l.size)));
        let top = match &self.config.transfer {
            Some(transfer) => {
                self.transfer_layers(
                    reference, target, &diff_ids, creds, lease, transfer, progress,
                )
                .await?
            }
            None => {
                self.download_and_unpack(reference, &manifest, &diff_ids, creds, lease, progress)
                    .await?
            }
        };

        self.link_for_gc(reference, &manifest_desc, &manifest, index.as_ref(), &top)
            .await?;

        let size = manifest_desc.size
            + manifest.config.size
            + manifest.layers.iter().map(|l| l.size).sum::<u64>();
        let info = ImageInfo {
            id: manifest.config.digest.to_string(),
            repo_tags: Default::default(),
            repo_digests: Default::default(),
            size,
            user: config.config.user.clone().unwrap_or_default(),
            chain_id: top,
            pinned: false,
            config: Arc::new(config),
        };
        self.record(reference, target, &info).await?;
        Ok(info)
    }

    /// The image manifest `target` names: through the index if it is one (picking this
    /// platform's manifest), each read from the content store or fetched into it. Returns the
    /// manifest's descriptor, the manifest, and the index's descriptor if there was one.
    async fn fetch_manifest(
        &self,
        reference: &Reference,
        target: &Descriptor,
        creds: &Credentials,
        lease: &str,
    ) -> Result<(Descriptor, ImageManifest, Option<Descriptor>), PullError> {
        let (manifest_desc, manifest_bytes, index) = if is_index_media_type(&target.media_type) {
            let index_bytes = self
                .small_blob(reference, target, creds, lease, Small::Index)
                .await?;
            let parsed = Manifest::parse(&target.media_type, &index_bytes)
                .map_err(|e| self.manifest_err(reference, e))?;
            let Manifest::Index(idx) = parsed else {
                return Err(self.manifest_err(
                    reference,
                    ManifestError::UnsupportedMediaType(target.media_type.clone()),
                ));
            };
            let chosen = select_platform(&idx, &self.config.os, &self.config.architecture, None)
                .map_err(|e| self.manifest_err(reference, e))?
                .clone();
            let bytes = self
                .small_blob(reference, &chosen, creds, lease, Small::Manifest)
                .await?;
            (chosen, bytes, Some(target.clone()))
        } else {
            let bytes = self
                .small_blob(reference, target, creds, lease, Small::Manifest)
                .await?;
            (target.clone(), bytes, None)
        };
        let manifest = match Manifest::parse(&manifest_desc.media_type, &manifest_bytes)
            .map_err(|e| self.manifest_err(reference, e))?
        {
            Manifest::Image(m) => *m,
            Manifest::Index(_) => {
                return Err(self.manifest_err(
                    reference,
                    ManifestError::UnsupportedMediaType(manifest_desc.media_type.clone()),
                ))
            }
        };
        Ok((manifest_desc, manifest, index))
    }

    /// GC labels bottom-up: config → top snapshot, manifest → config and layers, index →
    /// manifest, so containerd keeps what the image needs once its records reference it.
    async fn link_for_gc(
        &self,
        reference: &Reference,
        manifest_desc: &Descriptor,
        manifest: &ImageManifest,
        index: Option<&Descriptor>,
        top: &str,
    ) -> Result<(), PullError> {
        let label = |k: String, v: String| (k, v);
        self.set_labels(
            reference,
            &manifest.config.digest.to_string(),
            HashMap::from([label(
                format!("containerd.io/gc.ref.snapshot.{}", self.config.snapshotter),
                top.to_string(),
            )]),
        )
        .await?;
        let mut manifest_labels = HashMap::from([label(
            "containerd.io/gc.ref.content.config".into(),
            manifest.config.digest.to_string(),
        )]);
        for (i, l) in manifest.layers.iter().enumerate() {
            manifest_labels.insert(
                format!("containerd.io/gc.ref.content.l.{i}"),
                l.digest.to_string(),
            );
        }
        self.set_labels(
            reference,
            &manifest_desc.digest.to_string(),
            manifest_labels,
        )
        .await?;
        if let Some(index_desc) = index {
            self.set_labels(
                reference,
                &index_desc.digest.to_string(),
                HashMap::from([label(
                    "containerd.io/gc.ref.content.m.0".into(),
                    manifest_desc.digest.to_string(),
                )]),
            )
            .await?;
        }
        Ok(())
    }

    /// Creates/updates the image records for `reference` (its tag, if any, and its digest
    /// form) pointing at `target`, and indexes them.
    async fn record(
        &self,
        reference: &Reference,
        target: &Descriptor,
        info: &ImageInfo,
    ) -> Result<(), PullError> {
        let digest_ref = format!("{}@{}", reference.name(), target.digest);
        let mut names = vec![digest_ref];
        // `name:tag@digest` pins the digest: like containerd's CRI, record only the digest
        // form, so the tag keeps naming whatever it names in the registry.
        if reference.tag.is_some() && reference.digest.is_none() {
            names.push(format!(
                "{}:{}",
                reference.name(),
                reference.tag.as_deref().unwrap_or_default()
            ));
        }
        for name in names {
            let mut labels = HashMap::from([(LABEL_MANAGED.to_string(), "managed".to_string())]);
            if info.pinned {
                labels.insert(LABEL_PINNED.to_string(), "pinned".to_string());
            }
            self.backend
                .images
                .put(ImageRecord {
                    name: name.clone(),
                    target: to_blob(target),
                    labels,
                })
                .await
                .map_err(|e| self.containerd_err(reference, e))?;
            self.index.add_ref(&name, info.clone());
        }
        Ok(())
    }

    async fn set_labels(
        &self,
        reference: &Reference,
        digest: &str,
        labels: HashMap<String, String>,
    ) -> Result<(), PullError> {
        self.backend
            .content
            .set_labels(digest, labels)
            .await
            .map_err(|e| self.containerd_err(reference, e))
    }

    /// Adds blob `digest` to this pull's lease — before anything waits for it, so whoever
    /// downloads it, it stays protected — and says whether containerd already has it.
    async fn protect(
        &self,
        reference: &Reference,
        lease: &str,
        digest: &str,
    ) -> Result<bool, PullError> {
        let cerr = |e| self.containerd_err(reference, e);
        self.backend
            .leases
            .add_content(lease, digest)
            .await
            .map_err(cerr)?;
        let present = self.backend.content.info(digest).await.map_err(cerr)?;
        Ok(present.is_some())
    }

    /// A manifest or index: from the content store if present, else fetched, verified and
    /// stored. One over its kind's size limit is refused before anything is read.
    async fn small_blob(
        &self,
        reference: &Reference,
        desc: &Descriptor,
        creds: &Credentials,
        lease: &str,
        kind: Small,
    ) -> Result<Bytes, PullError> {
        let digest = desc.digest.to_string();
        kind.check(&digest, desc.size)
            .map_err(|e| self.manifest_err(reference, e))?;
        if self.protect(reference, lease, &digest).await? {
            return self
                .backend
                .content
                .read(&digest, desc.size)
                .await
                .map_err(|e| self.containerd_err(reference, e));
        }
        let bytes = if is_index_media_type(&desc.media_type)
            || super::manifest::is_image_manifest_media_type(&desc.media_type)
        {
            let bytes = self.registry.fetch_manifest(reference, desc, creds).await?;
            self.metrics.pull_bytes(bytes.len() as u64);
            bytes
        } else {
            // A media type the manifest endpoint may not know: the blob endpoint serves it.
            let mut stream = self.registry.fetch_blob(reference, desc, 0, creds).await?;
            let mut buf = Vec::with_capacity(desc.size as usize);
            while let Some(chunk) = stream.next().await {
                let chunk = chunk?;
                self.metrics.pull_bytes(chunk.len() as u64);
                buf.extend_from_slice(&chunk);
            }
            Bytes::from(buf)
        };
        let blob = to_blob(desc);
        let write_ref = format!("remora-{}", digest);
        let writer = open_writer(self.backend.content.as_ref(), lease, &write_ref, &blob)
            .await
            .map_err(|e| self.containerd_err(reference, e))?;
        if let Some(mut w) = writer {
            // Write what containerd lacks (nothing if it already holds all of it, see BlobJob).
            let from = (w.offset() as usize).min(bytes.len());
            if from < bytes.len() {
                w.write(bytes.slice(from..))
                    .await
                    .map_err(|e| self.containerd_err(reference, e))?;
            }
            w.commit(HashMap::new())
                .await
                .map_err(|e| self.containerd_err(reference, e))?;
        }
        Ok(bytes)
    }

    /// The image config, parsed as it streams — from the content store if present, else from
    /// the registry into the content store — so that a big one is never held whole (see
    /// [`ConfigParser`]). One over [`MAX_CONFIG_SIZE`] is refused before anything is read.
    async fn config(
        &self,
        reference: &Reference,
        desc: &Descriptor,
        creds: &Credentials,
        lease: &str,
    ) -> Result<ImageConfig, PullError> {
        let cerr = |e| self.containerd_err(reference, e);
        let digest = desc.digest.to_string();
        Small::Config
            .check(&digest, desc.size)
            .map_err(|e| self.manifest_err(reference, e))?;
        if self.protect(reference, lease, &digest).await? {
            return parse_stored_config(self.backend.content.as_ref(), &digest, desc.size)
                .await
                .map_err(|e| match e {
                    LoadError::Containerd(e) => cerr(e),
                    LoadError::Manifest(e) => self.manifest_err(reference, e),
                });
        }
        let blob = to_blob(desc);
        let write_ref = format!("remora-{}", digest);
        let mut writer = open_writer(self.backend.content.as_ref(), lease, &write_ref, &blob)
            .await
            .map_err(cerr)?;
        // containerd may already hold a prefix (an interrupted earlier write): the parser needs
        // the whole config, containerd only what it lacks.
        let mut skip = writer.as_ref().map_or(0, |w| w.offset());
        let mut parser = ConfigParser::new(desc.size);
        let mut parsing = true;
        // The blob stream verifies size and digest; a config that stops parsing is still read
        // and stored to the end, so a corrupt download is reported as such, before the parse
        // error.
        let mut stream = self.registry.fetch_blob(reference, desc, 0, creds).await?;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            self.metrics.pull_bytes(chunk.len() as u64);
            if let Some(w) = writer.as_mut() {
                let held = usize::try_from(skip).unwrap_or(usize::MAX).min(chunk.len());
                skip -= held as u64;
                if held < chunk.len() {
                    w.write(chunk.slice(held..)).await.map_err(cerr)?;
                }
            }
            if parsing {
                parsing = parser.feed(chunk).await;
            }
        }
        if let Some(w) = writer {
            w.commit(HashMap::new()).await.map_err(cerr)?;
        }
        parser
            .finish()
            .await
            .map_err(|e| self.manifest_err(reference, e))
    }
}

/// The kinds of blob read into memory whole, each with its size limit.
#[derive(Debug, Clone, Copy)]
enum Small {
    Index,
    Manifest,
    Config,
}

impl Small {
    /// Refuses a blob of `size` bytes over this kind's limit.
    fn check(self, digest: &str, size: u64) -> Result<(), ManifestError> {
        let (what, limit) = match self {
            Small::Index => ("image index", MAX_MANIFEST_SIZE),
            Small::Manifest => ("image manifest", MAX_MANIFEST_SIZE),
            Small::Config => ("image config", MAX_CONFIG_SIZE),
        };
        ManifestError::check_size(what, digest, size, limit)
    }
}

fn to_blob(d: &Descriptor) -> Blob {
    Blob {
        media_type: d.media_type.clone(),
        digest: d.digest.to_string(),
        size: d.size as i64,
    }
}

/// Builds the [`ImageInfo`] of an existing containerd image record by reading its manifest
/// and config from the content store (start-up resync and `/images/` events).
pub async fn load_image(
    content: &dyn Content,
    record: &ImageRecord,
    os: &str,
    architecture: &str,
) -> Result<ImageInfo, LoadError> {
    let target = &record.target;
    let target_size = u64::try_from(target.size).unwrap_or(0);
    let kind = if is_index_media_type(&target.media_type) {
        Small::Index
    } else {
        Small::Manifest
    };
    kind.check(&target.digest, target_size)?;
    let bytes = content.read(&target.digest, target_size).await?;
    let (manifest_size, manifest) = match Manifest::parse(&target.media_type, &bytes)? {
        Manifest::Image(m) => (target_size, *m),
        Manifest::Index(idx) => {
            let chosen = select_platform(&idx, os, architecture, None)?;
            Small::Manifest.check(chosen.digest.as_str(), chosen.size)?;
            let bytes = content.read(chosen.digest.as_str(), chosen.size).await?;
            match Manifest::parse(&chosen.media_type, &bytes)? {
                Manifest::Image(m) => (chosen.size, *m),
                Manifest::Index(_) => {
                    return Err(LoadError::Manifest(ManifestError::UnsupportedMediaType(
                        chosen.media_type.clone(),
                    )))
                }
            }
        }
    };
    Small::Config.check(manifest.config.digest.as_str(), manifest.config.size)?;
    let config = parse_stored_config(
        content,
        manifest.config.digest.as_str(),
        manifest.config.size,
    )
    .await?;
    let diff_ids: Vec<String> = config
        .rootfs
        .diff_ids
        .iter()
        .map(|d| d.as_str().to_string())
        .collect();
    let chain_id = chain_ids(&diff_ids).pop().unwrap_or_default();
    Ok(ImageInfo {
        id: manifest.config.digest.to_string(),
        repo_tags: Default::default(),
        repo_digests: Default::default(),
        size: manifest_size
            + manifest.config.size
            + manifest.layers.iter().map(|l| l.size).sum::<u64>(),
        user: config.config.user.clone().unwrap_or_default(),
        chain_id,
        pinned: record.labels.get(LABEL_PINNED).map(String::as_str) == Some("pinned"),
        config: Arc::new(config),
    })
}

/// Parses the stored config `digest` of `size` bytes as it streams from the content store.
async fn parse_stored_config(
    content: &dyn Content,
    digest: &str,
    size: u64,
) -> Result<ImageConfig, LoadError> {
    let mut chunks = content.read_chunks(digest, size).await?;
    let mut parser = ConfigParser::new(size);
    while let Some(chunk) = chunks.next().await {
        if !parser.feed(chunk?).await {
            break; // not a config: finish says why
        }
    }
    Ok(parser.finish().await?)
}

/// Why an existing image record could not be indexed.
#[derive(Debug, Error)]
pub enum LoadError {
    /// Content missing or containerd failed.
    #[error(transparent)]
    Containerd(#[from] BackendError),
    /// The stored manifest or config is unusable.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
}

mod download;
mod transfer;
pub use transfer::TransferFailure;

/// The metrics of the pulls in flight: how many are in each phase, and each tracked pull's
/// bytes and layers (labelled by image and pull number; at most `progress::MAX_TRACKED`).
fn progress_gauges(progress: &Progress) -> Vec<GaugeFamily> {
    let view = progress.view(std::time::Instant::now());
    let phases = Phase::ALL
        .iter()
        .map(|phase| {
            let n = view.pulls.iter().filter(|p| p.phase == *phase).count();
            (vec![("phase", phase.name().to_string())], n as f64)
        })
        .collect();
    let labels = |p: &super::progress::PullView, extra: Option<(&'static str, &str)>| {
        let mut l = vec![("image", p.image.clone()), ("pull", p.id.to_string())];
        l.extend(extra.map(|(k, v)| (k, v.to_string())));
        l
    };
    let mut bytes = Vec::new();
    let mut layers = Vec::new();
    for p in &view.pulls {
        bytes.push((labels(p, Some(("of", "done"))), p.bytes_done as f64));
        bytes.push((labels(p, Some(("of", "size"))), p.bytes as f64));
        for (of, n) in [
            ("all", p.layers),
            ("stored", p.layers_stored),
            ("present", p.layers_present),
            ("unpacked", p.layers_unpacked),
        ] {
            layers.push((labels(p, Some(("of", of))), n as f64));
        }
    }
    let rates = view
        .pulls
        .iter()
        .filter_map(|p| Some((labels(p, None), p.rate_bytes_per_sec? as f64)))
        .collect();
    vec![
        GaugeFamily {
            name: "image_pulls_in_flight",
            help: "Image pulls in flight by phase (resolving, downloading, unpacking)",
            unit: None,
            samples: phases,
        },
        GaugeFamily {
            name: "image_pull_progress",
            help: "Each pull in flight: its layers' compressed size (of=size) and the bytes there so far (of=done)",
            unit: Some(prometheus_client::registry::Unit::Bytes),
            samples: bytes,
        },
        GaugeFamily {
            name: "image_pull_layers",
            help: "Each pull in flight: its layers (of=all), those in the content store (stored), there before it (present), applied (unpacked)",
            unit: None,
            samples: layers,
        },
        GaugeFamily {
            name: "image_pull_rate_bytes_per_second",
            help: "Each pull in flight: bytes a second over the last 10 s",
            unit: None,
            samples: rates,
        },
        GaugeFamily::single(
            "image_pulls_untracked",
            "Pulls in flight beyond the tracked ones, shown in no other pull gauge",
            None,
            view.untracked as f64,
        ),
    ]
}

#[cfg(test)]
mod tests;
