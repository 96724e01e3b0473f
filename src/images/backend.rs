//! What image management needs from containerd, as narrow traits defined here, by their user.
//!
//! The one production implementation is over containerd's gRPC API
//! (`crate::containerd::images`); unit tests use in-memory fakes. Types here are plain domain
//! types: no protobuf leaks into the image logic.

use std::collections::HashMap;

use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;

use crate::backend_error::BackendError;

/// A blob's content as a stream of chunks.
pub type ChunkStream = BoxStream<'static, Result<Bytes, BackendError>>;

/// A content-addressed blob reference (OCI descriptor without platform details).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Blob {
    /// Media type.
    pub media_type: String,
    /// `sha256:<hex>`.
    pub digest: String,
    /// Size in bytes.
    pub size: i64,
}

/// A blob in containerd's content store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContentInfo {
    /// Digest.
    pub digest: String,
    /// Size in bytes.
    pub size: i64,
    /// Labels (GC references, uncompressed digest, distribution source).
    pub labels: HashMap<String, String>,
}

/// A containerd image record: a name pointing at a manifest or index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRecord {
    /// Record name: a normalised reference (`docker.io/library/busybox:latest`,
    /// `…@sha256:…`) or an image id.
    pub name: String,
    /// The manifest or index it points at.
    pub target: Blob,
    /// Labels.
    pub labels: HashMap<String, String>,
}

/// A mount as containerd describes it (for applying layers into a snapshot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Mount type (`overlay`, `bind`).
    pub kind: String,
    /// Source.
    pub source: String,
    /// Target (usually empty).
    pub target: String,
    /// Options.
    pub options: Vec<String>,
}

/// Usage of one snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Bytes.
    pub bytes: i64,
    /// Inodes.
    pub inodes: i64,
}

/// An open content-store write. Dropping it without `commit` leaves the partial ingest, which a
/// later writer with the same ref resumes (and containerd's GC removes if nobody does).
/// An id for a containerd object remora names (a lease, a stream, a snapshot key):
/// `<prefix>-<nanos>-<seq>`, unique in this process (the sequence) and across restarts (the
/// time).
pub fn unique_id(prefix: &str) -> String {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{prefix}-{nanos}-{seq}")
}

#[async_trait::async_trait]
pub trait ContentWriter: Send {
    /// Bytes already stored under this write's ref: resume the data from here.
    fn offset(&self) -> u64;
    /// Appends data.
    async fn write(&mut self, data: Bytes) -> Result<(), BackendError>;
    /// Verifies the digest and size and makes the blob visible, with `labels`.
    async fn commit(self: Box<Self>, labels: HashMap<String, String>) -> Result<(), BackendError>;
}

/// containerd's content store.
#[async_trait::async_trait]
pub trait Content: Send + Sync + 'static {
    /// The blob's info, or `None` if absent.
    async fn info(&self, digest: &str) -> Result<Option<ContentInfo>, BackendError>;
    /// The first `size` bytes of the blob, in the chunks containerd sends (at most 1 MiB
    /// each): its whole content when `size` is the size its descriptor states. Never more than
    /// `size` bytes in all, whatever the server sends.
    async fn read_chunks(&self, digest: &str, size: u64) -> Result<ChunkStream, BackendError>;
    /// [`Content::read_chunks`] gathered into one buffer. For manifests and indexes only,
    /// whose size the caller has checked against its limit (`MAX_MANIFEST_SIZE`): nothing
    /// larger is read into memory whole (configs are parsed as they stream, see
    /// `images::config_stream`).
    async fn read(&self, digest: &str, size: u64) -> Result<Bytes, BackendError> {
        let mut chunks = self.read_chunks(digest, size).await?;
        let mut buf = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        while let Some(chunk) = chunks.next().await {
            buf.extend_from_slice(&chunk?);
        }
        Ok(Bytes::from(buf))
    }
    /// Opens a write of `blob` under `write_ref` within `lease`. `Ok(None)` means the blob is
    /// already stored.
    async fn writer(
        &self,
        lease: &str,
        write_ref: &str,
        blob: &Blob,
    ) -> Result<Option<Box<dyn ContentWriter>>, BackendError>;
    /// Discards the partial ingest of `write_ref` (absent is not an error), so the next
    /// writer starts from zero instead of resuming bad data.
    async fn abort(&self, write_ref: &str) -> Result<(), BackendError>;
    /// Sets (merges) labels on a stored blob.
    async fn set_labels(
        &self,
        digest: &str,
        labels: HashMap<String, String>,
    ) -> Result<(), BackendError>;
}

/// containerd's image records.
#[async_trait::async_trait]
pub trait Images: Send + Sync + 'static {
    /// One record, or `None`.
    async fn get(&self, name: &str) -> Result<Option<ImageRecord>, BackendError>;
    /// Every record in the namespace.
    async fn list(&self) -> Result<Vec<ImageRecord>, BackendError>;
    /// Creates the record, or updates its target and labels if it exists.
    async fn put(&self, record: ImageRecord) -> Result<(), BackendError>;
    /// Deletes a record; absent is not an error.
    async fn delete(&self, name: &str) -> Result<(), BackendError>;
}

/// containerd's leases: keep what a pull writes safe from GC until the image references it.
#[async_trait::async_trait]
pub trait Leases: Send + Sync + 'static {
    /// Creates a lease that containerd expires by itself after `expire_secs` (in case remora
    /// dies before deleting it).
    async fn create(&self, id: &str, expire_secs: u64) -> Result<(), BackendError>;
    /// Deletes a lease; absent is not an error. With `sync`, containerd garbage-collects what
    /// the lease alone kept before answering (used when rolling back a failed pull).
    async fn delete(&self, id: &str, sync: bool) -> Result<(), BackendError>;
    /// Adds a content blob to the lease, protecting it from GC even before it exists (a blob
    /// another pull is still downloading).
    async fn add_content(&self, id: &str, digest: &str) -> Result<(), BackendError>;
    /// Every lease in the namespace: id and creation time.
    async fn list(&self) -> Result<Vec<(String, Option<std::time::SystemTime>)>, BackendError>;
}

/// One snapshotter's snapshots.
#[async_trait::async_trait]
pub trait Snapshots: Send + Sync + 'static {
    /// Whether a snapshot with this key or name exists.
    async fn exists(&self, snapshotter: &str, key: &str) -> Result<bool, BackendError>;
    /// An active snapshot on `parent` ("" for none), within `lease`, with `labels` (the
    /// snapshotter reads some: the idmap labels of a user-namespaced pod's rootfs).
    async fn prepare(
        &self,
        lease: &str,
        snapshotter: &str,
        key: &str,
        parent: &str,
        labels: &HashMap<String, String>,
    ) -> Result<Vec<Mount>, BackendError>;
    /// A read-only view of committed snapshot `parent`, within `lease` (image volumes), with
    /// `labels` (the idmap labels of an image volume in a user-namespaced pod).
    async fn view(
        &self,
        lease: &str,
        snapshotter: &str,
        key: &str,
        parent: &str,
        labels: &HashMap<String, String>,
    ) -> Result<Vec<Mount>, BackendError>;
    /// The mounts of an existing (active) snapshot.
    async fn mounts(&self, snapshotter: &str, key: &str) -> Result<Vec<Mount>, BackendError>;
    /// Commits active snapshot `key` as `name`, with `labels`.
    async fn commit(
        &self,
        lease: &str,
        snapshotter: &str,
        name: &str,
        key: &str,
        labels: HashMap<String, String>,
    ) -> Result<(), BackendError>;
    /// Removes a snapshot; absent is not an error.
    async fn remove(&self, snapshotter: &str, key: &str) -> Result<(), BackendError>;
    /// Names of all snapshots.
    async fn list(&self, snapshotter: &str) -> Result<Vec<String>, BackendError>;
    /// Disk usage of one snapshot.
    async fn usage(&self, snapshotter: &str, key: &str) -> Result<Usage, BackendError>;
    /// The snapshotter's root directory, as containerd's plugin reports it (`None` if the
    /// plugin does not export one).
    async fn root(&self, snapshotter: &str) -> Result<Option<std::path::PathBuf>, BackendError>;
}

/// Why applying a layer failed.
#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    /// containerd failed: its Diff service, or reading the blob from its content store.
    #[error(transparent)]
    Containerd(#[from] BackendError),
    /// remora's own applier failed (`[images] layer_applier = "remora"`).
    #[error(transparent)]
    Local(#[from] super::apply_error::LocalApplyError),
}

/// Applies layers: containerd's diff service, or remora's own applier over the content store.
#[async_trait::async_trait]
pub trait Differ: Send + Sync + 'static {
    /// Applies the (compressed) layer blob onto `mounts`; returns the uncompressed digest.
    async fn apply(&self, layer: &Blob, mounts: Vec<Mount>) -> Result<String, DiffError>;
}

/// Credentials containerd's Transfer service is given when a registry asks it for them.
#[derive(Clone, PartialEq, Eq)]
pub enum TransferAuth {
    /// User name and password (exchanged for a token where the registry wants one).
    Basic {
        /// User name.
        username: String,
        /// Password.
        password: String,
    },
    /// An identity (refresh) token, exchanged for an access token.
    Refresh(String),
    /// A registry token, sent as `Authorization: Bearer <token>`.
    Bearer(String),
}

impl std::fmt::Debug for TransferAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secrets: only which kind was given.
        f.write_str(match self {
            TransferAuth::Basic { .. } => "Basic(<redacted>)",
            TransferAuth::Refresh(_) => "Refresh(<redacted>)",
            TransferAuth::Bearer(_) => "Bearer(<redacted>)",
        })
    }
}

/// A pull by containerd's Transfer service: fetch `reference` from its registry into the
/// content store, unpack it for one platform, and record it as `image_name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferPull {
    /// What to pull: `name@digest`, so containerd fetches exactly what remora resolved.
    pub reference: String,
    /// containerd-style hosts.toml directory for the registry's endpoints.
    pub host_dir: std::path::PathBuf,
    /// The image record containerd writes.
    pub image_name: String,
    /// Its labels.
    pub labels: HashMap<String, String>,
    /// Platform OS picked from an index and unpacked for.
    pub os: String,
    /// Platform architecture (OCI naming: `amd64`).
    pub architecture: String,
    /// Platform variant, if any.
    pub variant: Option<String>,
    /// Snapshotter the layers are unpacked into.
    pub snapshotter: String,
    /// The lease everything the transfer writes is held by (containerd's transfer uses the
    /// caller's lease instead of one of its own).
    pub lease: String,
    /// Credentials answered when the registry challenges containerd; none for anonymous.
    pub auth: Option<TransferAuth>,
    /// The hosts (`host[:port]`) containerd may be given `auth` for: the registry's hosts
    /// from `host_dir` (its mirrors and server). Any other host asking is answered with no
    /// credentials.
    pub auth_hosts: Vec<String>,
}

/// One progress report of a transfer (containerd sends one per blob about every 300 ms).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferProgress {
    /// `downloading`, `complete`, `extracting`, `extracted`, `saved`, or a free-text step.
    pub event: String,
    /// The blob's digest, when the report is about a blob.
    pub digest: Option<String>,
    /// Bytes done so far of this blob (cumulative).
    pub progress: i64,
    /// The blob's size.
    pub total: i64,
}

/// containerd's Transfer service, for pulls.
#[async_trait::async_trait]
pub trait Transfer: Send + Sync + 'static {
    /// Runs the pull to its end, sending progress reports to `progress` while it runs.
    /// Dropping the future cancels the transfer in containerd.
    async fn pull(
        &self,
        request: TransferPull,
        progress: tokio::sync::mpsc::UnboundedSender<TransferProgress>,
    ) -> Result<(), BackendError>;
}
