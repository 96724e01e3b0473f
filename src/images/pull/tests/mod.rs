//! The pull pipeline against an in-memory containerd (content store with resumable ingests,
//! image records, leases with a mark-and-sweep GC), the snapshot fakes of `unpack`, and the
//! in-process fake registry serving real OCI manifests, configs and layers built here.
//!
//! Real sockets need real time, so registry delays are real but short (≤ 200 ms).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::backend_error::BackendCode;
use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::Response;

use super::download::is_bad_data;
use super::*;
use crate::images::backend::{ContentInfo, ContentWriter};
use crate::images::manifest::{
    Digest, Platform, MEDIA_TYPE_OCI_CONFIG, MEDIA_TYPE_OCI_INDEX, MEDIA_TYPE_OCI_LAYER_GZIP,
    MEDIA_TYPE_OCI_MANIFEST,
};
use crate::images::registry::fake::{self, Body, Fake, Hit};
use crate::images::registry::RegistryConfig;
use crate::images::resolver::ResolverConfig;
use crate::images::unpack::tests::{FakeDiffer, FakeSnapshots};

// ---------------------------------------------------------------------------------------------
// In-memory containerd: Content + Images + Leases over one state, so GC can see all three.
// ---------------------------------------------------------------------------------------------

fn call_err(op: &'static str, code: BackendCode, message: impl Into<String>) -> BackendError {
    BackendError::Call {
        address: "/fake".into(),
        op,
        code,
        message: message.into(),
    }
}

/// Chunk size of the fake's content reads.
const READ_CHUNK: usize = 1000;

#[derive(Debug, Clone)]
struct Stored {
    data: Bytes,
    labels: HashMap<String, String>,
}

#[derive(Debug, Default)]
struct Ingest {
    data: Vec<u8>,
    /// The lease the writer was opened in (`None`: left by an earlier process).
    lease: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum LeaseEvent {
    Created(String),
    Deleted { id: String, sync: bool },
}

#[derive(Default)]
struct State {
    /// Committed blobs of this namespace.
    blobs: BTreeMap<String, Stored>,
    /// Blob data another namespace stored: containerd shares it, so a writer in this
    /// namespace opens at offset == size and only has to commit.
    other_namespace: HashMap<String, Bytes>,
    /// Partial writes by ref.
    ingests: HashMap<String, Ingest>,
    /// Refs with an open writer (containerd locks a ref while it is written).
    locked: HashSet<String>,
    images: BTreeMap<String, ImageRecord>,
    /// Lease → content digests it protects.
    leases: HashMap<String, BTreeSet<String>>,
    lease_log: Vec<LeaseEvent>,
}

impl State {
    /// containerd's GC, simplified: content reachable from an image record (through
    /// `containerd.io/gc.ref.content*` labels) or held by a lease stays; other content goes,
    /// and so do ingests of leases that no longer exist (unless a writer has them open).
    fn gc(&mut self) {
        let mut live = HashSet::new();
        let mut todo: Vec<String> = self
            .images
            .values()
            .map(|r| r.target.digest.clone())
            .chain(self.leases.values().flatten().cloned())
            .collect();
        while let Some(d) = todo.pop() {
            if !live.insert(d.clone()) {
                continue;
            }
            if let Some(b) = self.blobs.get(&d) {
                todo.extend(
                    b.labels
                        .iter()
                        .filter(|(k, _)| k.starts_with("containerd.io/gc.ref.content"))
                        .map(|(_, v)| v.clone()),
                );
            }
        }
        self.blobs.retain(|d, _| live.contains(d));
        let (leases, locked) = (&self.leases, &self.locked);
        self.ingests.retain(|r, i| {
            locked.contains(r) || i.lease.as_ref().is_none_or(|l| leases.contains_key(l))
        });
    }
}

#[derive(Default, Clone)]
struct FakeContainerd {
    state: Arc<Mutex<State>>,
}

impl FakeContainerd {
    fn st(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }
    fn blob_digests(&self) -> Vec<String> {
        self.st().blobs.keys().cloned().collect()
    }
    fn put_blob(&self, data: &Bytes, labels: HashMap<String, String>) {
        self.st().blobs.insert(
            Digest::of(data).to_string(),
            Stored {
                data: data.clone(),
                labels,
            },
        );
    }
}

struct FakeWriter {
    state: Arc<Mutex<State>>,
    lease: String,
    write_ref: String,
    blob: Blob,
    offset: u64,
}

impl Drop for FakeWriter {
    fn drop(&mut self) {
        // The ingest stays (a later writer with this ref resumes it); the lock goes.
        self.state.lock().unwrap().locked.remove(&self.write_ref);
    }
}

#[async_trait::async_trait]
impl ContentWriter for FakeWriter {
    fn offset(&self) -> u64 {
        self.offset
    }

    async fn write(&mut self, data: Bytes) -> Result<(), BackendError> {
        let mut st = self.state.lock().unwrap();
        let ingest = st.ingests.entry(self.write_ref.clone()).or_default();
        ingest.data.extend_from_slice(&data);
        self.offset = ingest.data.len() as u64;
        Ok(())
    }

    async fn commit(self: Box<Self>, labels: HashMap<String, String>) -> Result<(), BackendError> {
        let mut st = self.state.lock().unwrap();
        // containerd adds committed content to the writer's lease; a lease deleted meanwhile
        // fails the commit ("lease does not exist").
        if !st.leases.contains_key(&self.lease) {
            return Err(call_err(
                "Content.Write",
                BackendCode::NotFound,
                format!("lease {} does not exist", self.lease),
            ));
        }
        if st.blobs.contains_key(&self.blob.digest) {
            // AlreadyExists, which the real writer reports as success.
            st.ingests.remove(&self.write_ref);
            return Ok(());
        }
        let data = st
            .ingests
            .get(&self.write_ref)
            .map(|i| Bytes::from(i.data.clone()))
            .unwrap_or_default();
        if data.len() as i64 != self.blob.size {
            return Err(call_err(
                "Content.Write",
                BackendCode::FailedPrecondition,
                format!(
                    "unexpected commit size {}, expected {}",
                    data.len(),
                    self.blob.size
                ),
            ));
        }
        let got = Digest::of(&data).to_string();
        if got != self.blob.digest {
            return Err(call_err(
                "Content.Write",
                BackendCode::FailedPrecondition,
                format!(
                    "unexpected commit digest {got}, expected {}",
                    self.blob.digest
                ),
            ));
        }
        st.ingests.remove(&self.write_ref);
        st.blobs
            .insert(self.blob.digest.clone(), Stored { data, labels });
        if let Some(l) = st.leases.get_mut(&self.lease) {
            l.insert(self.blob.digest.clone());
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Content for FakeContainerd {
    async fn info(&self, digest: &str) -> Result<Option<ContentInfo>, BackendError> {
        Ok(self.st().blobs.get(digest).map(|b| ContentInfo {
            digest: digest.to_string(),
            size: b.data.len() as i64,
            labels: b.labels.clone(),
        }))
    }

    async fn read_chunks(
        &self,
        digest: &str,
        size: u64,
    ) -> Result<crate::images::backend::ChunkStream, BackendError> {
        let data = self
            .st()
            .blobs
            .get(digest)
            .map(|b| b.data.slice(..b.data.len().min(size as usize)))
            .ok_or_else(|| call_err("Content.Read", BackendCode::NotFound, digest.to_string()))?;
        // Small uneven chunks, so readers meet chunk boundaries everywhere.
        let chunks: Vec<Result<Bytes, BackendError>> = (0..data.len())
            .step_by(READ_CHUNK)
            .map(|at| Ok(data.slice(at..(at + READ_CHUNK).min(data.len()))))
            .collect();
        Ok(futures_util::stream::iter(chunks).boxed())
    }

    async fn writer(
        &self,
        lease: &str,
        write_ref: &str,
        blob: &Blob,
    ) -> Result<Option<Box<dyn ContentWriter>>, BackendError> {
        let mut st = self.st();
        if st.blobs.contains_key(&blob.digest) {
            return Ok(None);
        }
        if !st.leases.contains_key(lease) {
            return Err(call_err(
                "Content.Write",
                BackendCode::NotFound,
                format!("lease {lease} does not exist"),
            ));
        }
        if !st.locked.insert(write_ref.to_string()) {
            return Err(call_err(
                "Content.Write",
                BackendCode::Unavailable,
                format!("ref {write_ref} locked"),
            ));
        }
        let shared = st.other_namespace.get(&blob.digest).cloned();
        let ingest = st.ingests.entry(write_ref.to_string()).or_default();
        if let Some(data) = shared {
            ingest.data = data.to_vec();
        }
        ingest.lease = Some(lease.to_string());
        let offset = ingest.data.len() as u64;
        Ok(Some(Box::new(FakeWriter {
            state: self.state.clone(),
            lease: lease.to_string(),
            write_ref: write_ref.to_string(),
            blob: blob.clone(),
            offset,
        })))
    }

    async fn abort(&self, write_ref: &str) -> Result<(), BackendError> {
        self.st().ingests.remove(write_ref);
        Ok(())
    }

    async fn set_labels(
        &self,
        digest: &str,
        labels: HashMap<String, String>,
    ) -> Result<(), BackendError> {
        let mut st = self.st();
        let b = st
            .blobs
            .get_mut(digest)
            .ok_or_else(|| call_err("Content.Update", BackendCode::NotFound, digest.to_string()))?;
        b.labels.extend(labels);
        Ok(())
    }
}

#[async_trait::async_trait]
impl Images for FakeContainerd {
    async fn get(&self, name: &str) -> Result<Option<ImageRecord>, BackendError> {
        Ok(self.st().images.get(name).cloned())
    }
    async fn list(&self) -> Result<Vec<ImageRecord>, BackendError> {
        Ok(self.st().images.values().cloned().collect())
    }
    async fn put(&self, record: ImageRecord) -> Result<(), BackendError> {
        self.st().images.insert(record.name.clone(), record);
        Ok(())
    }
    async fn delete(&self, name: &str) -> Result<(), BackendError> {
        self.st().images.remove(name);
        Ok(())
    }
}

#[async_trait::async_trait]
impl Leases for FakeContainerd {
    async fn list(&self) -> Result<Vec<(String, Option<std::time::SystemTime>)>, BackendError> {
        Ok(self.st().leases.keys().map(|k| (k.clone(), None)).collect())
    }
    async fn create(&self, id: &str, _expire_secs: u64) -> Result<(), BackendError> {
        let mut st = self.st();
        if st.leases.contains_key(id) {
            return Err(call_err(
                "Leases.Create",
                BackendCode::AlreadyExists,
                id.to_string(),
            ));
        }
        st.leases.insert(id.to_string(), BTreeSet::new());
        st.lease_log.push(LeaseEvent::Created(id.to_string()));
        Ok(())
    }

    /// GC runs at once whether or not `sync` is set: containerd collects soon after either
    /// way, and `sync` only decides whether the call waits for it. The flag is recorded.
    async fn delete(&self, id: &str, sync: bool) -> Result<(), BackendError> {
        let mut st = self.st();
        st.leases.remove(id);
        st.lease_log.push(LeaseEvent::Deleted {
            id: id.to_string(),
            sync,
        });
        st.gc();
        Ok(())
    }

    async fn add_content(&self, id: &str, digest: &str) -> Result<(), BackendError> {
        self.st()
            .leases
            .get_mut(id)
            .ok_or_else(|| call_err("Leases.AddResource", BackendCode::NotFound, id.to_string()))?
            .insert(digest.to_string());
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Images and the fake registry serving them.
// ---------------------------------------------------------------------------------------------

fn desc(data: &[u8], media_type: &str) -> Descriptor {
    Descriptor {
        media_type: media_type.into(),
        digest: Digest::of(data),
        size: data.len() as u64,
        platform: None,
        annotations: Default::default(),
        urls: vec![],
    }
}

/// A single-platform OCI image: manifest, config and layers as the registry stores them.
#[derive(Clone)]
struct TestImage {
    manifest: Bytes,
    config: Bytes,
    layers: Vec<Bytes>,
    /// The diff ID the fake differ reports for each layer.
    diff_ids: Vec<String>,
}

impl TestImage {
    fn new(layers: &[&[u8]], user: &str) -> Self {
        let layers: Vec<Bytes> = layers.iter().map(|l| Bytes::copy_from_slice(l)).collect();
        let diff_ids: Vec<String> = layers
            .iter()
            .map(|l| Digest::of(&[b"uncompressed ".as_slice(), l].concat()).to_string())
            .collect();
        let config = serde_json::json!({
            "architecture": "amd64",
            "os": "linux",
            "config": {"User": user},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        });
        let config = Bytes::from(serde_json::to_vec(&config).unwrap());
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": MEDIA_TYPE_OCI_MANIFEST,
            "config": desc(&config, MEDIA_TYPE_OCI_CONFIG),
            "layers": layers.iter().map(|l| desc(l, MEDIA_TYPE_OCI_LAYER_GZIP)).collect::<Vec<_>>(),
        });
        let manifest = Bytes::from(serde_json::to_vec(&manifest).unwrap());
        Self {
            manifest,
            config,
            layers,
            diff_ids,
        }
    }

    fn manifest_digest(&self) -> String {
        Digest::of(&self.manifest).to_string()
    }
    /// The image id.
    fn id(&self) -> String {
        Digest::of(&self.config).to_string()
    }
    fn layer_digest(&self, i: usize) -> String {
        Digest::of(&self.layers[i]).to_string()
    }
    fn all_blobs(&self) -> BTreeSet<String> {
        let mut all: BTreeSet<String> = (0..self.layers.len())
            .map(|i| self.layer_digest(i))
            .collect();
        all.insert(self.id());
        all.insert(self.manifest_digest());
        all
    }
    fn size(&self) -> u64 {
        (self.manifest.len()
            + self.config.len()
            + self.layers.iter().map(Bytes::len).sum::<usize>()) as u64
    }
}

/// An index over `(manifest, platform)` pairs.
fn index_of(manifests: &[(&TestImage, &str)]) -> Bytes {
    let manifests: Vec<Descriptor> = manifests
        .iter()
        .map(|(img, arch)| Descriptor {
            platform: Some(Platform {
                architecture: (*arch).into(),
                os: "linux".into(),
                ..Default::default()
            }),
            ..desc(&img.manifest, MEDIA_TYPE_OCI_MANIFEST)
        })
        .collect();
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_TYPE_OCI_INDEX,
        "manifests": manifests,
    });
    Bytes::from(serde_json::to_vec(&index).unwrap())
}

#[derive(Default)]
struct RegState {
    /// `<repo>/manifests/<tag or digest>` → (media type, body).
    manifests: HashMap<String, (String, Bytes)>,
    /// Blob digest → body (any repository).
    blobs: HashMap<String, Bytes>,
    /// Blob digest → what is sent instead (same length, other bytes).
    corrupt: HashMap<String, Bytes>,
    /// Blob digest → delay before the body.
    delay: HashMap<String, Duration>,
    in_flight: usize,
    max_in_flight: usize,
}

/// Counts a blob response as in flight until its last byte is handed over (or it is dropped):
/// counted down *before* the client can see the end, so a client that waits for one blob
/// before asking for the next is never counted twice.
struct InFlight(Option<Arc<Mutex<RegState>>>);

impl InFlight {
    fn start(state: &Arc<Mutex<RegState>>) -> Self {
        let mut st = state.lock().unwrap();
        st.in_flight += 1;
        st.max_in_flight = st.max_in_flight.max(st.in_flight);
        Self(Some(state.clone()))
    }
    fn finish(&mut self) {
        if let Some(s) = self.0.take() {
            s.lock().unwrap().in_flight -= 1;
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.finish();
    }
}

struct Registry {
    fake: Fake,
    state: Arc<Mutex<RegState>>,
}

impl Registry {
    async fn start() -> Self {
        let state = Arc::new(Mutex::new(RegState::default()));
        let s = state.clone();
        let fake = Fake::start(move |h: &Hit| serve(&s, h)).await;
        Self { fake, state }
    }

    fn st(&self) -> std::sync::MutexGuard<'_, RegState> {
        self.state.lock().unwrap()
    }

    /// Pushes `img` to `repo` (config and layers, manifest by digest) and points `tag` at it.
    fn push(&self, repo: &str, tag: &str, img: &TestImage) {
        let mut st = self.st();
        for b in img.layers.iter().chain([&img.config]) {
            st.blobs.insert(Digest::of(b).to_string(), b.clone());
        }
        let m = (MEDIA_TYPE_OCI_MANIFEST.to_string(), img.manifest.clone());
        st.manifests.insert(
            format!("{repo}/manifests/{}", img.manifest_digest()),
            m.clone(),
        );
        st.manifests.insert(format!("{repo}/manifests/{tag}"), m);
    }

    fn hits(&self) -> Vec<Hit> {
        self.fake.hits()
    }

    /// `GET`s of paths ending in `suffix` (a digest or a tag).
    fn gets(&self, suffix: &str) -> usize {
        self.count("GET", suffix)
    }

    fn count(&self, method: &str, suffix: &str) -> usize {
        self.hits()
            .iter()
            .filter(|h| h.method == method && h.path.ends_with(suffix))
            .count()
    }

    fn blob_gets(&self) -> usize {
        self.hits()
            .iter()
            .filter(|h| h.method == "GET" && h.path.contains("/blobs/"))
            .count()
    }

    fn clear_hits(&self) {
        self.fake.clear_hits();
    }

    fn log(&self) -> Vec<String> {
        self.fake.log()
    }
}

fn serve(state: &Arc<Mutex<RegState>>, h: &Hit) -> Response<Body> {
    let path = h.path.strip_prefix("/v2/").unwrap_or(&h.path);
    if path.contains("/manifests/") {
        let found = state.lock().unwrap().manifests.get(path).cloned();
        return match found {
            Some((mt, body)) => fake::with_headers(
                200,
                &[
                    ("content-type", mt.as_str()),
                    ("docker-content-digest", Digest::of(&body).as_str()),
                ],
                body,
            ),
            None => fake::reply(404, r#"{"errors":[{"code":"MANIFEST_UNKNOWN"}]}"#),
        };
    }
    let Some((_, digest)) = path.split_once("/blobs/") else {
        return fake::reply(404, "");
    };
    let (data, delay) = {
        let st = state.lock().unwrap();
        let data = st
            .corrupt
            .get(digest)
            .or_else(|| st.blobs.get(digest))
            .cloned();
        (data, st.delay.get(digest).copied().unwrap_or_default())
    };
    let Some(data) = data else {
        return fake::reply(404, r#"{"errors":[{"code":"BLOB_UNKNOWN"}]}"#);
    };
    let len = data.len();
    let from = h
        .header("range")
        .strip_prefix("bytes=")
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|f| f.parse::<usize>().ok());
    let (status, body, content_range) = match from {
        Some(f) => (
            206,
            data.slice(f..),
            Some(format!("bytes {f}-{}/{len}", len - 1)),
        ),
        None => (200, data, None),
    };
    let mut guard = InFlight::start(state);
    let body_len = body.len();
    let stream = futures_util::stream::once(async move {
        tokio::time::sleep(delay).await;
        guard.finish();
        Ok::<_, Infallible>(Frame::data(body))
    });
    let mut resp = Response::builder()
        .status(status)
        .header("content-length", body_len.to_string());
    if let Some(cr) = content_range {
        resp = resp.header("content-range", cr);
    }
    resp.body(BodyExt::boxed(StreamBody::new(stream))).unwrap()
}

// ---------------------------------------------------------------------------------------------
// The puller under test.
// ---------------------------------------------------------------------------------------------

const REPO: &str = "library/app";

fn image_ref(tag: &str) -> String {
    format!("{}/{REPO}:{tag}", fake::REGISTRY)
}

fn digest_ref(digest: &str) -> String {
    format!("{}/{REPO}@{digest}", fake::REGISTRY)
}

/// The fake differ, recording each apply with the layer blobs stored at that moment.
struct RecordingDiffer {
    inner: FakeDiffer,
    ctr: FakeContainerd,
    /// (layer applied, digests of the blobs containerd held when it was applied).
    applied: Mutex<Vec<(String, BTreeSet<String>)>>,
}

#[async_trait::async_trait]
impl Differ for RecordingDiffer {
    async fn apply(
        &self,
        layer: &Blob,
        mounts: Vec<crate::images::backend::Mount>,
    ) -> Result<String, crate::images::backend::DiffError> {
        let stored = self.ctr.blob_digests().into_iter().collect();
        self.applied
            .lock()
            .unwrap()
            .push((layer.digest.clone(), stored));
        self.inner.apply(layer, mounts).await
    }
}

/// These tests pull through remora's own client (`PullConfig::transfer` unset): a call to
/// the Transfer service is a defect, answered as containerd answers an unknown method.
struct NoTransfer;

#[async_trait::async_trait]
impl crate::images::backend::Transfer for NoTransfer {
    async fn pull(
        &self,
        _: crate::images::backend::TransferPull,
        _: tokio::sync::mpsc::UnboundedSender<crate::images::backend::TransferProgress>,
    ) -> Result<(), BackendError> {
        Err(call_err(
            "Transfer.Transfer",
            BackendCode::Unimplemented,
            "these tests pull through remora's client",
        ))
    }
}

struct Env {
    puller: Arc<Puller>,
    metrics: crate::metrics::Metrics,
    ctr: FakeContainerd,
    snaps: Arc<FakeSnapshots>,
    differ: Arc<RecordingDiffer>,
    index: Arc<ImageIndex>,
    reg: Registry,
    _hosts: tempfile::TempDir,
}

struct Opts {
    max_concurrent_downloads: usize,
    /// `None`: as many as `max_concurrent_downloads`.
    max_concurrent_downloads_per_host: Option<usize>,
    ttl: Duration,
}

impl Default for Opts {
    fn default() -> Self {
        Self {
            max_concurrent_downloads: 3,
            max_concurrent_downloads_per_host: None,
            ttl: Duration::from_secs(60),
        }
    }
}

/// A second registry name the fake serves too (its own host for the download slots).
const OTHER_REGISTRY: &str = "other.test";

async fn env(images: &[&TestImage], opts: Opts) -> Env {
    let reg = Registry::start().await;
    let hosts = fake::hosts_dir(&reg.fake.host(), &[]);
    let other = hosts.path().join(OTHER_REGISTRY);
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(
        other.join("hosts.toml"),
        format!("server = \"http://{}\"\n", reg.fake.host()),
    )
    .unwrap();
    let registry = RegistryClient::new(RegistryConfig {
        // Slow test responses are deliberate, not stalls.
        stall_timeout: Duration::from_secs(5),
        ..fake::config(hosts.path())
    })
    .unwrap();
    let diffs = images
        .iter()
        .flat_map(|img| {
            (0..img.layers.len()).map(|i| (img.layer_digest(i), img.diff_ids[i].clone()))
        })
        .collect();
    let ctr = FakeContainerd::default();
    let snaps = Arc::new(FakeSnapshots::default());
    let index = Arc::new(ImageIndex::new());
    let differ = Arc::new(RecordingDiffer {
        inner: FakeDiffer(diffs),
        ctr: ctr.clone(),
        applied: Mutex::default(),
    });
    let backend = Backend {
        content: Arc::new(ctr.clone()),
        images: Arc::new(ctr.clone()),
        leases: Arc::new(ctr.clone()),
        snapshots: snaps.clone(),
        differ: differ.clone(),
        transfer: Arc::new(NoTransfer),
    };
    let metrics = crate::metrics::Metrics::new();
    let puller = Puller::new(
        PullConfig {
            snapshotter: "overlayfs".into(),
            os: "linux".into(),
            architecture: "amd64".into(),
            max_concurrent_downloads: opts.max_concurrent_downloads,
            max_concurrent_downloads_per_host: opts
                .max_concurrent_downloads_per_host
                .unwrap_or(opts.max_concurrent_downloads),
            transfer: None,
        },
        backend,
        Arc::new(registry),
        index.clone(),
        ResolverConfig {
            workers: 2,
            workers_per_host: 2,
            rate_per_sec: 1000.0,
            burst: 100,
            ttl: opts.ttl,
            backoff_min: Duration::from_millis(10),
            backoff_max: Duration::from_millis(50),
            resolve_timeout: Duration::from_secs(30),
        },
        metrics.clone(),
        Logger::root(slog::Discard, slog::o!()),
    )
    .unwrap();
    Env {
        puller: Arc::new(puller),
        metrics,
        ctr,
        snaps,
        differ,
        index,
        reg,
        _hosts: hosts,
    }
}

impl Env {
    /// The value of one sample of the metrics (`name{labels}` as encoded), 0 if absent.
    fn metric(&self, series: &str) -> f64 {
        self.metrics
            .encode()
            .lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0.0)
    }

    async fn pull(&self, image: &str) -> Result<ImageInfo, PullError> {
        self.puller.pull(image, Credentials::anonymous()).await
    }

    /// `n` concurrent pulls of `image`, each in its own task.
    async fn pull_n(&self, image: &str, n: usize) -> Vec<Result<ImageInfo, PullError>> {
        let tasks: Vec<_> = (0..n)
            .map(|_| {
                let p = self.puller.clone();
                let image = image.to_string();
                tokio::spawn(async move { p.pull(&image, Credentials::anonymous()).await })
            })
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    }

    /// Waits until every lease is gone and no writer is open: downloads abandoned by a failed
    /// pull finish in the background (the coalescer no longer counts them as in flight).
    async fn settled(&self) {
        for _ in 0..300 {
            {
                let st = self.ctr.st();
                if st.leases.is_empty() && st.locked.is_empty() {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("still busy: {:?}", self.lease_log());
    }

    fn leases(&self) -> Vec<String> {
        self.ctr.st().leases.keys().cloned().collect()
    }

    fn lease_log(&self) -> Vec<LeaseEvent> {
        self.ctr.st().lease_log.clone()
    }

    fn record_target(&self, name: &str) -> Option<String> {
        self.ctr
            .st()
            .images
            .get(name)
            .map(|r| r.target.digest.clone())
    }
}

fn assert_same_ok(results: &[Result<ImageInfo, PullError>]) -> ImageInfo {
    let first = results[0].as_ref().expect("pull succeeds").clone();
    for r in results {
        assert_eq!(r.as_ref().expect("pull succeeds"), &first);
    }
    first
}

// ---------------------------------------------------------------------------------------------
// Tests.
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn concurrent_pulls_of_one_image_share_one_download() {
    let img = TestImage::new(&[b"layer-one", b"layer-two", b"layer-three"], "1000");
    let env = env(&[&img], Opts::default()).await;
    env.reg.push(REPO, "1", &img);
    // Slow layers keep the first pull in flight while the other 19 arrive.
    for i in 0..3 {
        env.reg
            .st()
            .delay
            .insert(img.layer_digest(i), Duration::from_millis(100));
    }

    let results = env.pull_n(&image_ref("1"), 20).await;
    let info = assert_same_ok(&results);

    assert_eq!(info.id, img.id());
    assert_eq!(info.user, "1000");
    assert_eq!(info.size, img.size());
    assert_eq!(info.chain_id, *chain_ids(&img.diff_ids).last().unwrap());
    assert_eq!(
        env.reg.count("HEAD", "/manifests/1"),
        1,
        "{:?}",
        env.reg.hits()
    );
    assert_eq!(env.reg.gets(&img.manifest_digest()), 1);
    for blob in img
        .all_blobs()
        .iter()
        .filter(|d| **d != img.manifest_digest())
    {
        assert_eq!(env.reg.gets(blob), 1, "GETs of {blob}");
    }
    assert_eq!(env.reg.blob_gets(), 4, "config and three layers");
    // The metrics tell the same: one pull led, 19 joined it, every byte counted once.
    assert_eq!(env.metric("remora_image_pulls_started_total"), 1.0);
    assert_eq!(env.metric("remora_image_pulls_coalesced_total"), 19.0);
    assert_eq!(
        env.metric("remora_image_pull_bytes_total"),
        img.size() as f64
    );
    assert_eq!(
        env.metric("remora_image_pull_duration_seconds_count{result=\"ok\"}"),
        1.0
    );

    // The index and containerd hold both references.
    let listed = env.index.list();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0].repo_tags,
        BTreeSet::from([image_ref("1")]),
        "{listed:?}"
    );
    let by_digest = digest_ref(&img.manifest_digest());
    assert_eq!(listed[0].repo_digests, BTreeSet::from([by_digest.clone()]));
    assert_eq!(
        env.record_target(&image_ref("1")),
        Some(img.manifest_digest())
    );
    assert_eq!(env.record_target(&by_digest), Some(img.manifest_digest()));
    assert!(env.snaps.snaps.lock().unwrap().contains_key(&info.chain_id));

    // One lease, deleted; what the image needs survives the GC that followed, because the GC
    // labels link manifest → config and layers.
    assert!(env.leases().is_empty(), "{:?}", env.leases());
    let pull_leases: Vec<LeaseEvent> = env
        .lease_log()
        .into_iter()
        .filter(|e| format!("{e:?}").contains("remora-pull-"))
        .collect();
    assert_eq!(pull_leases.len(), 2, "one pull lease: {pull_leases:?}");
    assert!(
        matches!(&pull_leases[1], LeaseEvent::Deleted { sync: false, .. }),
        "{pull_leases:?}"
    );
    assert_eq!(
        env.ctr.blob_digests().into_iter().collect::<BTreeSet<_>>(),
        img.all_blobs()
    );
    let layer0 = env.ctr.st().blobs[&img.layer_digest(0)].labels.clone();
    assert_eq!(layer0["containerd.io/uncompressed"], img.diff_ids[0]);
    let config_labels = env.ctr.st().blobs[&img.id()].labels.clone();
    assert_eq!(
        config_labels["containerd.io/gc.ref.snapshot.overlayfs"],
        info.chain_id
    );
}

#[tokio::test]
async fn leader_failure_reaches_every_caller_and_rolls_back() {
    let img = TestImage::new(&[b"good layer", b"bad layer!"], "");
    let env = env(&[&img], Opts::default()).await;
    env.reg.push(REPO, "1", &img);
    // The registry sends other bytes for layer 1, slowly: by the time the pull fails the good
    // layer, the config and the manifest are all committed under the pull's lease.
    let bad = img.layer_digest(1);
    env.reg
        .st()
        .corrupt
        .insert(bad.clone(), Bytes::from_static(b"BAD LAYER!"));
    env.reg
        .st()
        .delay
        .insert(bad.clone(), Duration::from_millis(150));

    let results = env.pull_n(&image_ref("1"), 5).await;
    let errs: Vec<String> = results
        .iter()
        .map(|r| r.as_ref().expect_err("pull fails").to_string())
        .collect();
    // Caught by containerd's commit: remora does not hash layers itself.
    assert!(results[0].as_ref().is_err_and(is_bad_data), "{results:?}");
    assert!(errs.iter().all(|e| *e == errs[0]), "{errs:?}");
    assert!(errs[0].contains(&bad), "{}", errs[0]);
    assert_eq!(env.reg.gets(&bad), 1, "one leader, one download");

    env.settled().await;
    assert!(env.ctr.st().images.is_empty());
    assert!(env.index.list().is_empty());
    assert!(env.leases().is_empty(), "{:?}", env.leases());
    let pull_lease = match &env.lease_log()[0] {
        LeaseEvent::Created(id) => id.clone(),
        other => panic!("{other:?}"),
    };
    assert!(
        env.lease_log().contains(&LeaseEvent::Deleted {
            id: pull_lease,
            sync: true
        }),
        "{:?}",
        env.lease_log()
    );
    assert!(
        env.ctr.blob_digests().is_empty(),
        "{:?}",
        env.ctr.blob_digests()
    );
    assert!(
        env.ctr.st().ingests.is_empty(),
        "{:?}",
        env.ctr.st().ingests
    );

    // Nothing is cached: once the registry is fixed, the next pull succeeds.
    env.reg.st().corrupt.clear();
    assert_eq!(env.pull(&image_ref("1")).await.unwrap().id, img.id());
}

#[tokio::test]
async fn a_missing_layer_fails_the_pull_with_not_found() {
    let img = TestImage::new(&[b"present", b"missing"], "");
    let env = env(&[&img], Opts::default()).await;
    env.reg.push(REPO, "1", &img);
    env.reg.st().blobs.remove(&img.layer_digest(1));
    let results = env.pull_n(&image_ref("1"), 3).await;
    for r in &results {
        assert!(
            matches!(r, Err(PullError::Registry(RegistryError::NotFound { .. }))),
            "{r:?}"
        );
    }
    env.settled().await;
    assert!(env.ctr.st().images.is_empty());
    assert!(env.leases().is_empty(), "{:?}", env.lease_log());
    assert!(
        env.ctr.blob_digests().is_empty(),
        "{:?}",
        env.ctr.blob_digests()
    );
}

#[tokio::test]
async fn warm_pull_costs_one_head_per_ttl_and_no_blob_traffic() {
    let img = TestImage::new(&[b"warm"], "");
    let ttl = Duration::from_millis(300);
    let env = env(
        &[&img],
        Opts {
            ttl,
            ..Opts::default()
        },
    )
    .await;
    env.reg.push(REPO, "1", &img);
    let first = env.pull(&image_ref("1")).await.unwrap();
    tokio::time::sleep(ttl + Duration::from_millis(50)).await;
    env.reg.clear_hits();
    let leases_before = env.lease_log().len();

    let mut results = env.pull_n(&image_ref("1"), 10).await;
    for _ in 0..5 {
        results.push(env.pull(&image_ref("1")).await);
    }
    for r in &results {
        assert_eq!(r.as_ref().unwrap().id, first.id);
    }
    assert_eq!(
        env.reg.log(),
        vec![format!("HEAD /v2/{REPO}/manifests/1")],
        "one HEAD within the TTL, nothing else"
    );
    assert_eq!(
        env.lease_log().len(),
        leases_before,
        "no lease: nothing written"
    );
}

#[tokio::test]
async fn a_moved_tag_pulls_the_new_image_and_moves_the_tag() {
    let v1 = TestImage::new(&[b"base", b"v1"], "");
    let v2 = TestImage::new(&[b"base", b"v2"], "");
    // Zero TTL: every pull asks the registry where the tag points.
    let env = env(
        &[&v1, &v2],
        Opts {
            ttl: Duration::ZERO,
            ..Opts::default()
        },
    )
    .await;
    let tag = image_ref("latest");
    env.reg.push(REPO, "latest", &v1);
    assert_eq!(env.pull(&tag).await.unwrap().id, v1.id());

    env.reg.push(REPO, "latest", &v2);
    let info = env.pull(&tag).await.unwrap();
    assert_eq!(info.id, v2.id());
    assert_eq!(env.reg.gets(&v2.layer_digest(1)), 1);
    assert_eq!(
        env.reg.gets(&v2.layer_digest(0)),
        1,
        "the base layer is reused"
    );
    assert_eq!(env.index.get(&tag).unwrap().id, v2.id());
    assert!(env.index.get(&v1.id()).unwrap().repo_tags.is_empty());
    assert_eq!(env.record_target(&tag), Some(v2.manifest_digest()));

    // Moved back to an image still here: no download, but the tag follows.
    env.reg.push(REPO, "latest", &v1);
    env.reg.clear_hits();
    assert_eq!(env.pull(&tag).await.unwrap().id, v1.id());
    assert_eq!(
        env.reg.log(),
        vec![format!("HEAD /v2/{REPO}/manifests/latest")]
    );
    assert_eq!(env.index.get(&tag).unwrap().id, v1.id());
    assert_eq!(env.record_target(&tag), Some(v1.manifest_digest()));
}

#[tokio::test]
async fn an_interrupted_config_write_is_completed_and_the_whole_config_parsed() {
    let img = TestImage::new(&[b"layer"], "1000");
    let env = env(&[&img], Opts::default()).await;
    env.reg.push(REPO, "1", &img);
    let digest = img.id();
    // An earlier write of the config got 10 bytes into containerd: containerd gets the
    // rest, the parser all of it.
    env.ctr.st().ingests.insert(
        format!("remora-{digest}"),
        Ingest {
            data: img.config[..10].to_vec(),
            lease: None,
        },
    );

    let info = env.pull(&image_ref("1")).await.unwrap();
    assert_eq!(info.user, "1000");
    assert_eq!(*info.config, ImageConfig::parse(&img.config).unwrap());
    assert_eq!(env.ctr.st().blobs[&digest].data, img.config);
    assert!(env.ctr.st().ingests.is_empty());
}

#[tokio::test]
async fn a_blob_containerd_already_holds_is_committed_without_a_download() {
    let img = TestImage::new(&[b"from another namespace", b"new"], "");
    let env = env(&[&img], Opts::default()).await;
    env.reg.push(REPO, "1", &img);
    let held = img.layer_digest(0);
    env.ctr
        .st()
        .other_namespace
        .insert(held.clone(), img.layers[0].clone());

    env.pull(&image_ref("1")).await.unwrap();
    assert_eq!(env.reg.gets(&held), 0, "{:?}", env.reg.log());
    assert_eq!(env.reg.gets(&img.layer_digest(1)), 1);
    let st = env.ctr.st();
    assert_eq!(st.blobs[&held].data, img.layers[0]);
    assert_eq!(
        st.blobs[&held].labels["containerd.io/uncompressed"],
        img.diff_ids[0]
    );
}

#[tokio::test]
async fn load_image_from_a_manifest_record() {
    let img = TestImage::new(&[b"a", b"b"], "nobody");
    let ctr = FakeContainerd::default();
    ctr.put_blob(&img.manifest, HashMap::new());
    ctr.put_blob(&img.config, HashMap::new());
    let record = ImageRecord {
        name: image_ref("1"),
        target: to_blob(&desc(&img.manifest, MEDIA_TYPE_OCI_MANIFEST)),
        labels: HashMap::from([(LABEL_PINNED.to_string(), "pinned".to_string())]),
    };
    let info = load_image(&ctr, &record, "linux", "amd64").await.unwrap();
    assert_eq!(
        info,
        ImageInfo {
            id: img.id(),
            repo_tags: Default::default(),
            repo_digests: Default::default(),
            size: img.size(),
            user: "nobody".into(),
            chain_id: chain_ids(&img.diff_ids).pop().unwrap(),
            pinned: true,
            config: Arc::new(ImageConfig::parse(&img.config).unwrap()),
        }
    );
}

#[tokio::test]
async fn load_image_from_an_index_record_picks_the_platform() {
    let amd = TestImage::new(&[b"amd64 layer"], "0");
    let arm = TestImage::new(&[b"arm64 layer", b"more"], "1");
    let index = index_of(&[(&arm, "arm64"), (&amd, "amd64")]);
    let ctr = FakeContainerd::default();
    for b in [
        &index,
        &amd.manifest,
        &amd.config,
        &arm.manifest,
        &arm.config,
    ] {
        ctr.put_blob(b, HashMap::new());
    }
    let record = ImageRecord {
        name: image_ref("multi"),
        target: to_blob(&desc(&index, MEDIA_TYPE_OCI_INDEX)),
        labels: HashMap::new(),
    };
    let info = load_image(&ctr, &record, "linux", "amd64").await.unwrap();
    assert_eq!(info.id, amd.id());
    assert_eq!(info.size, amd.size(), "the chosen manifest, not the index");
    assert_eq!(info.chain_id, amd.diff_ids[0]);
    assert_eq!(info.user, "0");
    assert!(!info.pinned);
    let info = load_image(&ctr, &record, "linux", "arm64").await.unwrap();
    assert_eq!(info.id, arm.id());
    assert_eq!(info.size, arm.size());

    // Content missing: a containerd error, not a panic or a half-built image.
    ctr.st().blobs.remove(&amd.id());
    let err = load_image(&ctr, &record, "linux", "amd64")
        .await
        .unwrap_err();
    assert!(matches!(err, LoadError::Containerd(_)), "{err}");
}

#[tokio::test]
async fn pulling_an_index_records_it_and_links_it_for_gc() {
    let amd = TestImage::new(&[b"amd64 only"], "");
    let arm = TestImage::new(&[b"arm64 only"], "");
    let index = index_of(&[(&arm, "arm64"), (&amd, "amd64")]);
    let env = env(&[&amd, &arm], Opts::default()).await;
    env.reg.push(REPO, "amd-only", &amd);
    env.reg.push(REPO, "arm-only", &arm);
    let idx_digest = Digest::of(&index).to_string();
    env.reg.st().manifests.insert(
        format!("{REPO}/manifests/multi"),
        (MEDIA_TYPE_OCI_INDEX.to_string(), index.clone()),
    );
    env.reg.st().manifests.insert(
        format!("{REPO}/manifests/{idx_digest}"),
        (MEDIA_TYPE_OCI_INDEX.to_string(), index.clone()),
    );

    let info = env.pull(&image_ref("multi")).await.unwrap();
    assert_eq!(info.id, amd.id());
    assert_eq!(
        env.reg.gets(&arm.layer_digest(0)),
        0,
        "other platforms stay remote"
    );
    assert_eq!(
        env.record_target(&image_ref("multi")),
        Some(idx_digest.clone())
    );
    assert!(env.index.get(&digest_ref(&idx_digest)).is_some());
    let mut want = amd.all_blobs();
    want.insert(idx_digest);
    assert_eq!(
        env.ctr.blob_digests().into_iter().collect::<BTreeSet<_>>(),
        want,
        "the lease is gone; index → manifest → config/layers labels keep the image"
    );
}

/// `img`'s manifest, with the config descriptor's size replaced by `config_size` and an
/// annotation of `pad` bytes.
fn manifest_with(img: &TestImage, config_size: u64, pad: usize) -> Bytes {
    let mut m: serde_json::Value = serde_json::from_slice(&img.manifest).unwrap();
    m["config"]["size"] = config_size.into();
    if pad > 0 {
        m["annotations"] = serde_json::json!({ "pad": "x".repeat(pad) });
    }
    Bytes::from(serde_json::to_vec(&m).unwrap())
}

/// After a refused pull: no record, no lease (the pull's was deleted synchronously), no
/// content, nothing indexed.
async fn assert_rolled_back(env: &Env) {
    env.settled().await;
    assert!(env.ctr.st().images.is_empty());
    assert!(env.index.list().is_empty());
    assert!(env.leases().is_empty(), "{:?}", env.leases());
    assert!(
        env.ctr.blob_digests().is_empty(),
        "{:?}",
        env.ctr.blob_digests()
    );
    assert!(env.ctr.st().ingests.is_empty());
    let log = env.lease_log();
    assert!(
        log.iter()
            .any(|e| matches!(e, LeaseEvent::Deleted { id, sync: true } if id.contains("pull"))),
        "{log:?}"
    );
}

#[tokio::test]
async fn a_config_over_the_limit_is_refused_before_it_is_downloaded() {
    let img = TestImage::new(&[b"layer"], "");
    let env = env(&[&img], Opts::default()).await;
    let manifest = manifest_with(&img, MAX_CONFIG_SIZE + 1, 0);
    let digest = Digest::of(&manifest).to_string();
    let m = (MEDIA_TYPE_OCI_MANIFEST.to_string(), manifest);
    env.reg
        .st()
        .manifests
        .insert(format!("{REPO}/manifests/1"), m.clone());
    env.reg
        .st()
        .manifests
        .insert(format!("{REPO}/manifests/{digest}"), m);
    env.reg.push(REPO, "unused", &img); // the blobs, so only the limit can refuse it

    let err = env.pull(&image_ref("1")).await.unwrap_err();
    let PullError::Manifest { source, .. } = &err else {
        panic!("{err:?}")
    };
    let ManifestError::TooLarge {
        what,
        digest: d,
        size,
        limit,
    } = source.as_ref()
    else {
        panic!("{err:?}")
    };
    assert_eq!(
        (*what, d.as_str(), *size, *limit),
        (
            "image config",
            img.id().as_str(),
            MAX_CONFIG_SIZE + 1,
            MAX_CONFIG_SIZE
        )
    );
    let msg = err.to_string();
    for part in [
        image_ref("1"),
        img.id(),
        (MAX_CONFIG_SIZE + 1).to_string(),
        MAX_CONFIG_SIZE.to_string(),
    ] {
        assert!(msg.contains(&part), "{msg} names {part}");
    }
    assert_eq!(env.reg.gets(&img.id()), 0, "not downloaded");
    assert_eq!(
        env.reg.blob_gets(),
        0,
        "no layer either: {:?}",
        env.reg.log()
    );
    assert_rolled_back(&env).await;
}

#[tokio::test]
async fn a_manifest_over_the_limit_is_refused_when_resolved() {
    let img = TestImage::new(&[b"layer"], "");
    let env = env(&[&img], Opts::default()).await;
    let manifest = manifest_with(&img, img.config.len() as u64, MAX_MANIFEST_SIZE as usize);
    assert!(manifest.len() as u64 > MAX_MANIFEST_SIZE);
    env.reg.st().manifests.insert(
        format!("{REPO}/manifests/1"),
        (MEDIA_TYPE_OCI_MANIFEST.to_string(), manifest.clone()),
    );

    let err = env.pull(&image_ref("1")).await.unwrap_err();
    let PullError::Registry(RegistryError::TooLarge { size, limit, .. }) = &err else {
        panic!("{err:?}")
    };
    assert_eq!((*size, *limit), (manifest.len() as u64, MAX_MANIFEST_SIZE));
    assert!(err.to_string().contains(&image_ref("1")), "{err}");
    assert_eq!(
        env.reg.count("GET", "/manifests/1"),
        0,
        "{:?}",
        env.reg.log()
    );
    assert!(env.ctr.st().images.is_empty());
    assert!(env.leases().is_empty());
    assert!(env.ctr.blob_digests().is_empty());
}

#[tokio::test]
async fn a_manifest_of_exactly_the_limit_is_accepted() {
    // containerd's bound is inclusive; so is remora's.
    let img = TestImage::new(&[b"layer"], "");
    let env = env(&[&img], Opts::default()).await;
    let base = manifest_with(&img, img.config.len() as u64, 1).len();
    let manifest = manifest_with(
        &img,
        img.config.len() as u64,
        1 + MAX_MANIFEST_SIZE as usize - base,
    );
    assert_eq!(manifest.len() as u64, MAX_MANIFEST_SIZE);
    let digest = Digest::of(&manifest).to_string();
    let m = (MEDIA_TYPE_OCI_MANIFEST.to_string(), manifest);
    env.reg.push(REPO, "unused", &img);
    env.reg
        .st()
        .manifests
        .insert(format!("{REPO}/manifests/1"), m.clone());
    env.reg
        .st()
        .manifests
        .insert(format!("{REPO}/manifests/{digest}"), m);
    assert_eq!(env.pull(&image_ref("1")).await.unwrap().id, img.id());
}

#[tokio::test]
async fn the_index_keeps_the_parsed_config_not_the_blob() {
    // A config of about 2 MiB, nearly all build history: parsed off the async threads as it
    // streams (from the registry here, from the content store's chunks in load_image), and
    // the index keeps the fields CRI uses, not the history.
    let img = TestImage::new(&[b"layer"], "1000");
    let mut config: serde_json::Value = serde_json::from_slice(&img.config).unwrap();
    config["config"]["Env"] = serde_json::json!(["PATH=/bin", "A=b"]);
    config["config"]["Labels"] = serde_json::json!({"team": "x"});
    config["history"] = (0..32)
        .map(|i| serde_json::json!({"created_by": format!("step {i} {}", "y".repeat(64 << 10))}))
        .collect();
    let config = Bytes::from(serde_json::to_vec(&config).unwrap());
    assert!(config.len() > 2 << 20);
    let mut m: serde_json::Value = serde_json::from_slice(&img.manifest).unwrap();
    m["config"] = serde_json::to_value(desc(&config, MEDIA_TYPE_OCI_CONFIG)).unwrap();
    let manifest = Bytes::from(serde_json::to_vec(&m).unwrap());
    let env = env(&[&img], Opts::default()).await;
    env.reg.push(REPO, "unused", &img);
    {
        let mut st = env.reg.st();
        st.blobs
            .insert(Digest::of(&config).to_string(), config.clone());
        let mt = MEDIA_TYPE_OCI_MANIFEST.to_string();
        st.manifests.insert(
            format!("{REPO}/manifests/{}", Digest::of(&manifest)),
            (mt.clone(), manifest.clone()),
        );
        st.manifests
            .insert(format!("{REPO}/manifests/1"), (mt, manifest));
    }

    let info = env.pull(&image_ref("1")).await.unwrap();
    assert_eq!(info.id, Digest::of(&config).to_string());
    let c = &info.config.config;
    assert_eq!(c.env, vec!["PATH=/bin", "A=b"]);
    assert_eq!(c.labels["team"], "x");
    assert_eq!(c.user.as_deref(), Some("1000"));
    assert_eq!(info.config.rootfs.diff_ids.len(), 1);
    let kept = serde_json::to_vec(info.config.as_ref()).unwrap();
    assert!(kept.len() < 1024, "{} bytes kept", kept.len());
    // Indexed again from containerd (a restart's resync): the same parsed config.
    let record = env.ctr.st().images[&image_ref("1")].clone();
    let loaded = load_image(&env.ctr, &record, "linux", "amd64")
        .await
        .unwrap();
    assert_eq!(loaded.config, info.config);
}

mod download;
