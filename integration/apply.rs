//! Differential test of remora's layer applier (`remora::layer_apply`) against containerd's
//! Diff service, on the test bed's containerd and registry.
//!
//! Corpus: every layer of every image in the test bed registry, and layers generated here
//! (entries of each kind, whiteouts, hostile names and links). Each layer is written to
//! containerd's content store, then applied twice in two places: as a first layer (a bind
//! mount: plain whiteouts) and on a parent snapshot (an overlay upper directory: overlay
//! whiteouts and copy-up of parents), once by `Diff.Apply` and once by `apply_layer` into a
//! snapshot of its own. The two directories are then compared on disk: entry set, type,
//! content hash, mode, owner, xattrs (overlay markers included), rdev, symlink target,
//! hard-link groups, and the mtimes of files and symlinks (directory times are not: parents
//! made at apply time carry the time of the apply). The diff IDs must be equal, and where
//! one side refuses a layer the other must too, but for the cases listed in `DIFFERENCES`.
//! Everything runs under one lease; the snapshots made are removed, then the lease.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use containerd_client::services::v1::content_client::ContentClient;
use containerd_client::services::v1::diff_client::DiffClient;
use containerd_client::services::v1::leases_client::LeasesClient;
use containerd_client::services::v1::snapshots::snapshots_client::SnapshotsClient;
use containerd_client::services::v1::snapshots::{
    CommitSnapshotRequest, PrepareSnapshotRequest, RemoveSnapshotRequest,
};
use containerd_client::services::v1::{
    ApplyRequest, CreateRequest, DeleteRequest, WriteAction, WriteContentRequest,
};
use containerd_client::types::{Descriptor, Mount};
use remora::layer_apply::{apply_layer, ApplyOptions, ApplyTarget};
use sha2::{Digest, Sha256};
use tonic::transport::Channel;

use crate::apply_corpus::{base_layer, generated, registry_layers, GZIP};
use crate::harness::unique;
use crate::testbed::TESTBED_CONTAINERD;

const SNAPSHOTTER: &str = "overlayfs";

/// Generated layers remora applies differently from containerd, on purpose, with why.
const DIFFERENCES: &[(&str, &str)] = &[(
    "uid-minus-one",
    "a uid of -1 is the kernel's 'no change' to containerd (Lchown(-1)), which keeps the \
     applier's own uid; remora refuses ids outside 0..2^32-1",
)];

/// containerd, in a namespace and a lease of this test's.
#[derive(Clone)]
struct Bed {
    channel: Channel,
    namespace: String,
    lease: String,
    /// Snapshots made and not removed yet (the committed parent first), removed at the end
    /// even when the test panics.
    keys: Arc<Mutex<Vec<String>>>,
}

impl Bed {
    fn request<T>(&self, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        let m = r.metadata_mut();
        m.insert(
            "containerd-namespace",
            self.namespace.parse().expect("namespace"),
        );
        m.insert("containerd-lease", self.lease.parse().expect("lease"));
        r
    }

    async fn write_blob(&self, data: &[u8]) -> Descriptor {
        let digest = format!("sha256:{}", hex::encode(Sha256::digest(data)));
        // In chunks under gRPC's 16 MiB message limit, then a commit with no data.
        const CHUNK: usize = 4 << 20;
        let r#ref = unique("apply-it-blob");
        let mut msgs: Vec<WriteContentRequest> = data
            .chunks(CHUNK)
            .enumerate()
            .map(|(i, chunk)| WriteContentRequest {
                action: WriteAction::Write as i32,
                r#ref: r#ref.clone(),
                total: data.len() as i64,
                expected: digest.clone(),
                offset: (i * CHUNK) as i64,
                data: chunk.to_vec(),
                labels: HashMap::new(),
            })
            .collect();
        msgs.push(WriteContentRequest {
            action: WriteAction::Commit as i32,
            r#ref,
            total: data.len() as i64,
            expected: digest.clone(),
            offset: data.len() as i64,
            data: Vec::new(),
            labels: HashMap::new(),
        });
        let stream = tokio_stream::iter(msgs);
        let answer = ContentClient::new(self.channel.clone())
            .write(self.request(stream))
            .await;
        match answer {
            Ok(mut responses) => {
                while let Some(r) = responses.get_mut().message().await.expect("write") {
                    let _ = r;
                }
            }
            Err(s) if s.code() == tonic::Code::AlreadyExists => {}
            Err(s) => panic!("write {digest}: {s}"),
        }
        Descriptor {
            media_type: GZIP.into(),
            digest,
            size: data.len() as i64,
            annotations: HashMap::new(),
        }
    }

    async fn prepare(&self, parent: &str) -> (String, Vec<Mount>) {
        let key = unique("apply-it");
        let mounts = SnapshotsClient::new(self.channel.clone())
            .prepare(self.request(PrepareSnapshotRequest {
                snapshotter: SNAPSHOTTER.into(),
                key: key.clone(),
                parent: parent.into(),
                labels: HashMap::new(),
            }))
            .await
            .expect("prepare")
            .into_inner()
            .mounts;
        self.keys.lock().expect("keys").push(key.clone());
        (key, mounts)
    }

    async fn diff_apply(&self, layer: &Descriptor, mounts: &[Mount]) -> Result<String, String> {
        DiffClient::new(self.channel.clone())
            .apply(self.request(ApplyRequest {
                diff: Some(layer.clone()),
                mounts: mounts.to_vec(),
                payloads: HashMap::new(),
                sync_fs: false,
            }))
            .await
            .map(|r| r.into_inner().applied.map(|d| d.digest).unwrap_or_default())
            .map_err(|s| s.message().to_string())
    }

    async fn commit(&self, key: &str) -> String {
        let name = unique("apply-it-parent");
        SnapshotsClient::new(self.channel.clone())
            .commit(self.request(CommitSnapshotRequest {
                snapshotter: SNAPSHOTTER.into(),
                name: name.clone(),
                key: key.into(),
                labels: HashMap::new(),
            }))
            .await
            .expect("commit");
        let mut keys = self.keys.lock().expect("keys");
        keys.retain(|k| k != key);
        keys.insert(0, name.clone());
        name
    }

    async fn remove(&self, key: &str) {
        let r = SnapshotsClient::new(self.channel.clone())
            .remove(self.request(RemoveSnapshotRequest {
                snapshotter: SNAPSHOTTER.into(),
                key: key.into(),
            }))
            .await;
        if let Err(s) = r {
            assert_eq!(s.code(), tonic::Code::NotFound, "remove {key}: {s}");
        }
        self.keys.lock().expect("keys").retain(|k| k != key);
    }
}

/// remora's applier onto the mount containerd gave for a snapshot.
fn remora_apply(blob: &[u8], mounts: &[Mount]) -> Result<(String, PathBuf), String> {
    let [m] = mounts else {
        return Err(format!("{} mounts", mounts.len()));
    };
    let target =
        ApplyTarget::of_mount(&m.r#type, &m.source, &m.options).map_err(|e| e.to_string())?;
    let options = ApplyOptions {
        whiteouts: target.whiteouts,
        skip_devices: false,
    };
    apply_layer(blob, &target.root, &options)
        .map(|a| (a.diff_id, target.root.clone()))
        .map_err(|e| e.to_string())
}

/// The directory containerd wrote into for a snapshot's mounts.
fn written_dir(mounts: &[Mount]) -> PathBuf {
    let [m] = mounts else {
        panic!("{} mounts", mounts.len())
    };
    ApplyTarget::of_mount(&m.r#type, &m.source, &m.options)
        .expect("bind or overlay")
        .root
}

/// What is compared of one entry.
#[derive(Debug, PartialEq, Eq)]
struct Entry {
    kind: char,
    mode: u32,
    owner: (u32, u32),
    rdev: u64,
    link: Option<PathBuf>,
    sha: Option<String>,
    xattrs: BTreeMap<String, Vec<u8>>,
    /// Files and symlinks only.
    mtime: Option<(i64, i64)>,
}

fn xattrs(path: &Path) -> BTreeMap<String, Vec<u8>> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).expect("path");
    let mut names = vec![0u8; 65536];
    // SAFETY: c is NUL-terminated; names has names.len() writable bytes.
    let n = unsafe { libc::llistxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    let Ok(n) = usize::try_from(n) else {
        return BTreeMap::new();
    };
    let mut out = BTreeMap::new();
    for key in names[..n].split(|b| *b == 0).filter(|k| !k.is_empty()) {
        let k = std::ffi::CString::new(key).expect("key");
        let mut value = vec![0u8; 65536];
        // SAFETY: as above.
        let v = unsafe {
            libc::lgetxattr(
                c.as_ptr(),
                k.as_ptr(),
                value.as_mut_ptr().cast(),
                value.len(),
            )
        };
        if let Ok(v) = usize::try_from(v) {
            value.truncate(v);
            out.insert(String::from_utf8_lossy(key).into_owned(), value);
        }
    }
    out
}

/// Every entry under `root` by relative path, and the hard-link groups.
fn tree(root: &Path) -> (BTreeMap<PathBuf, Entry>, BTreeSet<Vec<PathBuf>>) {
    let mut entries = BTreeMap::new();
    let mut inodes: BTreeMap<u64, Vec<PathBuf>> = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).expect("read_dir") {
            let p = e.expect("entry").path();
            let m = std::fs::symlink_metadata(&p).expect("lstat");
            let ft = m.file_type();
            let rel = p.strip_prefix(root).expect("under root").to_path_buf();
            use std::os::unix::fs::FileTypeExt;
            let kind = match () {
                _ if ft.is_dir() => 'd',
                _ if ft.is_file() => 'f',
                _ if ft.is_symlink() => 'l',
                _ if ft.is_char_device() => 'c',
                _ if ft.is_block_device() => 'b',
                _ if ft.is_fifo() => 'p',
                _ => 's',
            };
            if ft.is_dir() {
                stack.push(p.clone());
            } else if m.nlink() > 1 {
                inodes.entry(m.ino()).or_default().push(rel.clone());
            }
            entries.insert(
                rel,
                Entry {
                    kind,
                    mode: m.mode() & 0o7777,
                    owner: (m.uid(), m.gid()),
                    rdev: m.rdev(),
                    link: ft
                        .is_symlink()
                        .then(|| std::fs::read_link(&p).expect("readlink")),
                    sha: ft
                        .is_file()
                        .then(|| hex::encode(Sha256::digest(std::fs::read(&p).expect("read")))),
                    xattrs: xattrs(&p),
                    mtime: (ft.is_file() || ft.is_symlink()).then(|| (m.mtime(), m.mtime_nsec())),
                },
            );
        }
    }
    let groups = inodes
        .into_values()
        .map(|mut g| {
            g.sort();
            g
        })
        .collect();
    (entries, groups)
}

/// The differences between two trees, at most 20.
fn compare(ctr: &Path, ours: &Path) -> Vec<String> {
    let (a, ga) = tree(ctr);
    let (b, gb) = tree(ours);
    let mut out = Vec::new();
    for path in a.keys().chain(b.keys()).collect::<BTreeSet<_>>() {
        match (a.get(path), b.get(path)) {
            (Some(x), Some(y)) if x == y => {}
            (x, y) => out.push(format!(
                "{}: containerd {x:?}, remora {y:?}",
                path.display()
            )),
        }
    }
    if ga != gb {
        out.push(format!("hard links: containerd {ga:?}, remora {gb:?}"));
    }
    out.truncate(20);
    out
}

/// Applies `blob` both ways on fresh snapshots of `parent`: a failure's text, if any, and
/// whether both applied it (so that the trees were compared).
async fn both(
    bed: &Bed,
    name: &str,
    blob: &[u8],
    desc: &Descriptor,
    parent: &str,
) -> (Option<String>, bool) {
    let (kc, mc) = bed.prepare(parent).await;
    let (kr, mr) = bed.prepare(parent).await;
    let ctr = bed.diff_apply(desc, &mc).await;
    let data = blob.to_vec();
    let ours = tokio::task::spawn_blocking(move || remora_apply(&data, &mr))
        .await
        .expect("apply task");
    let listed = DIFFERENCES.iter().find(|(n, _)| *n == name);
    let on = if parent.is_empty() {
        "first layer"
    } else {
        "on a parent"
    };
    let compared = matches!((&ctr, &ours), (Ok(_), Ok(_)));
    let failure = match (ctr, ours) {
        (Ok(d1), Ok((d2, root))) => {
            let diffs = compare(&written_dir(&mc), &root);
            if d1 != d2 {
                Some(format!("{name} ({on}): diff IDs {d1} vs {d2}"))
            } else if !diffs.is_empty() {
                Some(format!("{name} ({on}):\n  {}", diffs.join("\n  ")))
            } else {
                listed.map(|(_, why)| {
                    format!("{name} ({on}): listed as differing ({why}) but both applied it alike")
                })
            }
        }
        // Both refused: alike, but nothing was compared (`run` holds the registry's layers,
        // which both must apply, to that).
        (Err(_), Err(_)) => None,
        (Ok(_), Err(e)) if listed.is_some() => {
            let _ = e;
            None
        }
        (Ok(_), Err(e)) => Some(format!(
            "{name} ({on}): containerd applied it, remora refused: {e}"
        )),
        (Err(e), Ok(_)) => Some(format!(
            "{name} ({on}): remora applied it, containerd refused: {e}"
        )),
    };
    bed.remove(&kc).await;
    bed.remove(&kr).await;
    (failure, compared)
}

async fn run(bed: Bed) -> Vec<String> {
    let base = base_layer();
    let base_desc = bed.write_blob(&base).await;
    let (kp, mp) = bed.prepare("").await;
    bed.diff_apply(&base_desc, &mp)
        .await
        .expect("containerd applies the base layer");
    let parent = bed.commit(&kp).await;
    let mut corpus: Vec<(String, Vec<u8>, Descriptor)> = Vec::new();
    for (name, blob) in generated() {
        let desc = bed.write_blob(&blob).await;
        corpus.push((name.to_string(), blob, desc));
    }
    let registry = registry_layers().await;
    assert!(
        !registry.is_empty(),
        "the test bed registry has no image layers"
    );
    let mut from_registry = BTreeSet::new();
    for (digest, media, blob) in registry {
        let mut desc = bed.write_blob(&blob).await;
        desc.media_type = media;
        from_registry.insert(digest.clone());
        corpus.push((digest, blob, desc));
    }
    let mut failures = Vec::new();
    let mut compared = 0;
    for (name, blob, desc) in &corpus {
        for p in ["", parent.as_str()] {
            let (failure, both_applied) = both(&bed, name, blob, desc, p).await;
            failures.extend(failure);
            if both_applied {
                compared += 1;
            } else if from_registry.contains(name) {
                // A real image's layer that both refused would compare nothing.
                failures.push(format!("{name}: an image layer neither applier applied"));
            }
        }
    }
    eprintln!("{compared} of {} applies compared trees", 2 * corpus.len());
    // Every image layer both ways, and most generated ones (some are refused by both).
    assert!(
        compared >= 2 * from_registry.len() + corpus.len() - from_registry.len(),
        "only {compared} of {} applies compared trees",
        2 * corpus.len()
    );
    failures
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remora_applies_layers_as_containerd_does() {
    let channel =
        remora::grpc::unix_channel(Path::new(TESTBED_CONTAINERD), Duration::from_secs(60));
    let bed = Bed {
        channel: channel.clone(),
        namespace: unique("apply-it"),
        lease: unique("apply-it-lease"),
        keys: Arc::new(Mutex::new(Vec::new())),
    };
    let expire =
        humantime::format_rfc3339_seconds(std::time::SystemTime::now() + Duration::from_secs(3600));
    let mut create = tonic::Request::new(CreateRequest {
        id: bed.lease.clone(),
        labels: HashMap::from([("containerd.io/gc.expire".to_string(), expire.to_string())]),
    });
    create.metadata_mut().insert(
        "containerd-namespace",
        bed.namespace.parse().expect("namespace"),
    );
    LeasesClient::new(channel.clone())
        .create(create)
        .await
        .expect("lease");
    // Run in a task so that a panic still reaches the clean-up below.
    let outcome = tokio::spawn(run(bed.clone())).await;
    let left: Vec<String> = bed.keys.lock().expect("keys").clone();
    // Children before the parent they were made on (it is first).
    for key in left.iter().rev() {
        bed.remove(key).await;
    }
    let mut delete = tonic::Request::new(DeleteRequest {
        id: bed.lease.clone(),
        sync: true,
    });
    delete.metadata_mut().insert(
        "containerd-namespace",
        bed.namespace.parse().expect("namespace"),
    );
    LeasesClient::new(channel)
        .delete(delete)
        .await
        .expect("delete lease");
    let failures = match outcome {
        Ok(failures) => failures,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    };
    assert!(
        failures.is_empty(),
        "remora and containerd differ:\n{}",
        failures.join("\n")
    );
}
