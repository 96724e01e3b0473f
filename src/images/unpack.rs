//! Unpacking an image's layers into the snapshotter.
//!
//! Layer `i` becomes the committed snapshot named by its chain ID (`chain(0) = diff_id(0)`,
//! `chain(i) = sha256(chain(i-1) + " " + diff_id(i))`, as the OCI image spec defines), so images
//! that share base layers share snapshots. A chain ID that already exists is skipped. Each
//! missing layer is `Prepare`d on its parent under a unique key, `Apply`d by containerd's diff
//! service (which decompresses and reports the uncompressed digest — checked against the
//! config's diff ID), then `Commit`ted. Two pulls racing on the same layer both apply, one
//! commit wins, the loser drops its work. On any failure the active snapshot is removed, so
//! nothing half-applied is left behind.
//!
//! [`Unpacker`] applies the layers one at a time, bottom first, so a pull can apply each
//! layer as soon as its blob (and every blob below it) is in the content store, while the
//! layers above it still download. Decompression, hashing of the uncompressed stream and
//! writing the files all happen inside containerd's `Diff.Apply`; remora only orders the
//! calls.

use std::collections::HashMap;

use sha2::{Digest, Sha256};
use thiserror::Error;

use super::apply_error::LocalApplyError;
use super::backend::{unique_id, Blob, DiffError, Differ, Snapshots};
use crate::backend_error::BackendError;

/// Why an unpack failed.
#[derive(Debug, Error)]
pub enum UnpackError {
    /// The manifest and the config disagree on the number of layers.
    #[error("image has {layers} layers but its config lists {diff_ids} diff IDs")]
    LayerCount {
        /// Layers in the manifest.
        layers: usize,
        /// Diff IDs in the config.
        diff_ids: usize,
    },
    /// The applied layer's uncompressed digest is not the one the config promises.
    #[error("layer {layer} unpacked to {got}, but the image config expects {expected}")]
    DiffId {
        /// Layer digest.
        layer: String,
        /// Config's diff ID.
        expected: String,
        /// What containerd computed.
        got: String,
    },
    /// containerd's Transfer service finished without the snapshot the image's layers make
    /// (it unpacked another platform's manifest, or nothing).
    #[error(
        "containerd's transfer left no {snapshotter} snapshot {chain_id} for the image's layers"
    )]
    NotUnpacked {
        /// The snapshotter.
        snapshotter: String,
        /// The top layer's chain id.
        chain_id: String,
    },
    /// containerd failed.
    #[error(transparent)]
    Containerd(#[from] BackendError),
    /// remora's own layer applier failed.
    #[error(transparent)]
    Apply(#[from] LocalApplyError),
}

impl From<DiffError> for UnpackError {
    fn from(e: DiffError) -> Self {
        match e {
            DiffError::Containerd(e) => UnpackError::Containerd(e),
            DiffError::Local(e) => UnpackError::Apply(e),
        }
    }
}

/// Chain IDs of a layer stack, bottom first.
pub fn chain_ids(diff_ids: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(diff_ids.len());
    for d in diff_ids {
        let next = match out.last() {
            None => d.clone(),
            Some(parent) => {
                let sum = Sha256::digest(format!("{parent} {d}").as_bytes());
                format!("sha256:{}", hex::encode(sum))
            }
        };
        out.push(next);
    }
    out
}

fn unique_key(chain_id: &str) -> String {
    format!("{} {chain_id}", unique_id("extract"))
}

/// Unpacks `layers` (with their config `diff_ids`) into `snapshotter` within `lease`; returns the
/// top chain ID (the image's rootfs parent).
#[cfg(test)]
pub async fn unpack(
    snapshots: &dyn Snapshots,
    differ: &dyn Differ,
    lease: &str,
    snapshotter: &str,
    layers: &[Blob],
    diff_ids: &[String],
) -> Result<String, UnpackError> {
    if layers.len() != diff_ids.len() {
        return Err(UnpackError::LayerCount {
            layers: layers.len(),
            diff_ids: diff_ids.len(),
        });
    }
    let mut unpacker = Unpacker::new(snapshots, differ, lease, snapshotter, diff_ids);
    for layer in layers {
        unpacker.apply_next(layer).await?;
    }
    Ok(unpacker.into_top())
}

/// Applies an image's layers in order, one call per layer, as the caller has them.
pub struct Unpacker<'a> {
    snapshots: &'a dyn Snapshots,
    differ: &'a dyn Differ,
    lease: &'a str,
    snapshotter: &'a str,
    diff_ids: &'a [String],
    chains: Vec<String>,
    /// The chain ID of the layers applied so far ("" before the first).
    parent: String,
    /// Index of the next layer.
    next: usize,
}

impl<'a> Unpacker<'a> {
    /// An unpacker for an image whose config lists `diff_ids`.
    pub fn new(
        snapshots: &'a dyn Snapshots,
        differ: &'a dyn Differ,
        lease: &'a str,
        snapshotter: &'a str,
        diff_ids: &'a [String],
    ) -> Self {
        Self {
            snapshots,
            differ,
            lease,
            snapshotter,
            diff_ids,
            chains: chain_ids(diff_ids),
            parent: String::new(),
            next: 0,
        }
    }

    /// Applies the next layer (bottom first), whose blob must be in the content store, unless
    /// its chain is already a snapshot. On failure the active snapshot is removed.
    pub async fn apply_next(&mut self, layer: &Blob) -> Result<(), UnpackError> {
        let i = self.next;
        let (Some(chain), Some(diff_id)) = (self.chains.get(i), self.diff_ids.get(i)) else {
            return Err(UnpackError::LayerCount {
                layers: i + 1,
                diff_ids: self.diff_ids.len(),
            });
        };
        let chain = chain.clone();
        if !self.snapshots.exists(self.snapshotter, &chain).await? {
            self.apply(layer, &chain, diff_id).await?;
        }
        self.parent = chain;
        self.next += 1;
        Ok(())
    }

    /// The top chain ID: the image's rootfs parent.
    pub fn into_top(self) -> String {
        self.parent
    }

    async fn apply(&self, layer: &Blob, chain: &str, diff_id: &str) -> Result<(), UnpackError> {
        let (snapshots, snapshotter, lease) = (self.snapshots, self.snapshotter, self.lease);
        let key = unique_key(chain);
        let applied = apply_one(
            snapshots,
            self.differ,
            lease,
            snapshotter,
            &key,
            &self.parent,
            layer,
        )
        .await;
        let result = match applied {
            Ok(got) if got != diff_id => Err(UnpackError::DiffId {
                layer: layer.digest.clone(),
                expected: diff_id.to_string(),
                got,
            }),
            Ok(_) => {
                let labels =
                    HashMap::from([("containerd.io/snapshot.ref".to_string(), chain.to_string())]);
                match snapshots
                    .commit(lease, snapshotter, chain, &key, labels)
                    .await
                {
                    Ok(()) => Ok(()),
                    // A concurrent unpack committed this chain first; ours is redundant.
                    Err(e) if e.is_already_exists() => {
                        snapshots.remove(snapshotter, &key).await?;
                        Ok(())
                    }
                    Err(e) => Err(e.into()),
                }
            }
            Err(e) => Err(e),
        };
        if let Err(e) = result {
            // Best effort: the error that matters is the original one. containerd's GC also
            // collects the active snapshot once the pull's lease goes.
            let _ = snapshots.remove(snapshotter, &key).await;
            return Err(e);
        }
        Ok(())
    }
}

async fn apply_one(
    snapshots: &dyn Snapshots,
    differ: &dyn Differ,
    lease: &str,
    snapshotter: &str,
    key: &str,
    parent: &str,
    layer: &Blob,
) -> Result<String, UnpackError> {
    let mounts = snapshots
        .prepare(lease, snapshotter, key, parent, &HashMap::new())
        .await?;
    Ok(differ.apply(layer, mounts).await?)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::backend_error::BackendCode;
    use crate::images::backend::{Mount, Usage};
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    /// In-memory snapshotter: name -> (parent, committed).
    #[derive(Default)]
    pub struct FakeSnapshots {
        pub snaps: Mutex<BTreeMap<String, (String, bool)>>,
        pub prepared: Mutex<Vec<String>>,
        /// (committed name, lease), in commit order.
        pub committed: Mutex<Vec<(String, String)>>,
    }

    #[async_trait::async_trait]
    impl Snapshots for FakeSnapshots {
        async fn exists(&self, _s: &str, key: &str) -> Result<bool, BackendError> {
            Ok(self.snaps.lock().unwrap().contains_key(key))
        }
        async fn prepare(
            &self,
            _l: &str,
            _s: &str,
            key: &str,
            parent: &str,
            _labels: &HashMap<String, String>,
        ) -> Result<Vec<Mount>, BackendError> {
            self.prepared.lock().unwrap().push(key.to_string());
            self.snaps
                .lock()
                .unwrap()
                .insert(key.into(), (parent.into(), false));
            Ok(vec![Mount {
                kind: "bind".into(),
                source: key.into(),
                target: String::new(),
                options: vec![],
            }])
        }
        async fn view(
            &self,
            _l: &str,
            _s: &str,
            _key: &str,
            _parent: &str,
            _labels: &HashMap<String, String>,
        ) -> Result<Vec<Mount>, BackendError> {
            // Unpacking never makes views.
            Err(BackendError::Call {
                address: "/fake".into(),
                op: "Snapshots.View",
                code: BackendCode::Unimplemented,
                message: "the unpack fake makes no views".into(),
            })
        }
        async fn mounts(&self, _s: &str, key: &str) -> Result<Vec<Mount>, BackendError> {
            Ok(vec![Mount {
                kind: "bind".into(),
                source: key.into(),
                target: String::new(),
                options: vec![],
            }])
        }
        async fn commit(
            &self,
            _l: &str,
            _s: &str,
            name: &str,
            key: &str,
            _labels: HashMap<String, String>,
        ) -> Result<(), BackendError> {
            let mut snaps = self.snaps.lock().unwrap();
            if snaps.contains_key(name) {
                return Err(BackendError::Call {
                    address: "/fake".into(),
                    op: "Snapshots.Commit",
                    code: BackendCode::AlreadyExists,
                    message: "exists".into(),
                });
            }
            let (parent, _) = snaps.remove(key).expect("commit of a prepared key");
            snaps.insert(name.into(), (parent, true));
            self.committed
                .lock()
                .unwrap()
                .push((name.to_string(), _l.to_string()));
            Ok(())
        }
        async fn remove(&self, _s: &str, key: &str) -> Result<(), BackendError> {
            self.snaps.lock().unwrap().remove(key);
            Ok(())
        }
        async fn list(&self, _s: &str) -> Result<Vec<String>, BackendError> {
            Ok(self.snaps.lock().unwrap().keys().cloned().collect())
        }
        async fn usage(&self, _s: &str, _k: &str) -> Result<Usage, BackendError> {
            Ok(Usage::default())
        }
        async fn root(&self, _s: &str) -> Result<Option<std::path::PathBuf>, BackendError> {
            Ok(Some("/fake/snapshots".into()))
        }
    }

    /// Applies by reporting a diff ID from a table keyed by layer digest.
    pub struct FakeDiffer(pub HashMap<String, String>);

    #[async_trait::async_trait]
    impl Differ for FakeDiffer {
        async fn apply(&self, layer: &Blob, _m: Vec<Mount>) -> Result<String, DiffError> {
            self.0.get(&layer.digest).cloned().ok_or_else(|| {
                DiffError::Containerd(BackendError::Call {
                    address: "/fake".into(),
                    op: "Diff.Apply",
                    code: BackendCode::NotFound,
                    message: format!("no content {}", layer.digest),
                })
            })
        }
    }

    fn layer(d: &str) -> Blob {
        Blob {
            media_type: "application/vnd.oci.image.layer.v1.tar+gzip".into(),
            digest: d.into(),
            size: 1,
        }
    }

    #[test]
    fn chain_ids_follow_the_oci_rule() {
        let ids = chain_ids(&["sha256:a".into(), "sha256:b".into()]);
        assert_eq!(ids[0], "sha256:a");
        let expect = format!(
            "sha256:{}",
            hex::encode(Sha256::digest(b"sha256:a sha256:b"))
        );
        assert_eq!(ids[1], expect);
    }

    #[tokio::test]
    async fn unpacks_each_layer_once_and_skips_existing_chains() {
        let snaps = FakeSnapshots::default();
        let differ = FakeDiffer(HashMap::from([
            ("sha256:l1".into(), "sha256:d1".into()),
            ("sha256:l2".into(), "sha256:d2".into()),
        ]));
        let layers = [layer("sha256:l1"), layer("sha256:l2")];
        let diffs = ["sha256:d1".to_string(), "sha256:d2".to_string()];
        let top = unpack(&snaps, &differ, "lease", "overlayfs", &layers, &diffs)
            .await
            .unwrap();
        let chains = chain_ids(&diffs);
        assert_eq!(top, chains[1]);
        {
            let s = snaps.snaps.lock().unwrap();
            assert_eq!(s.len(), 2, "only committed chains remain: {s:?}");
            assert_eq!(s[&chains[1]], (chains[0].clone(), true));
        }
        // Second unpack prepares nothing.
        let before = snaps.prepared.lock().unwrap().len();
        unpack(&snaps, &differ, "lease", "overlayfs", &layers, &diffs)
            .await
            .unwrap();
        assert_eq!(snaps.prepared.lock().unwrap().len(), before);
    }

    #[tokio::test]
    async fn diff_id_mismatch_fails_and_leaves_no_active_snapshot() {
        let snaps = FakeSnapshots::default();
        let differ = FakeDiffer(HashMap::from([("sha256:l1".into(), "sha256:WRONG".into())]));
        let err = unpack(
            &snaps,
            &differ,
            "l",
            "overlayfs",
            &[layer("sha256:l1")],
            &["sha256:d1".into()],
        )
        .await
        .unwrap_err();
        assert!(matches!(err, UnpackError::DiffId { .. }), "{err}");
        assert!(snaps.snaps.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn apply_failure_removes_the_active_snapshot() {
        let snaps = FakeSnapshots::default();
        let differ = FakeDiffer(HashMap::new());
        let err = unpack(
            &snaps,
            &differ,
            "l",
            "overlayfs",
            &[layer("sha256:l1")],
            &["sha256:d1".into()],
        )
        .await
        .unwrap_err();
        assert!(matches!(err, UnpackError::Containerd(_)), "{err}");
        assert!(snaps.snaps.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn layer_count_mismatch_is_rejected() {
        let snaps = FakeSnapshots::default();
        let differ = FakeDiffer(HashMap::new());
        let err = unpack(&snaps, &differ, "l", "o", &[layer("sha256:l1")], &[])
            .await
            .unwrap_err();
        assert!(matches!(
            err,
            UnpackError::LayerCount {
                layers: 1,
                diff_ids: 0
            }
        ));
    }
}
