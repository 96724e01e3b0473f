//! The `Differ` port over remora's own applier: the layer blob is read from containerd's
//! content store (streamed, through the `Content` port) and applied onto the snapshot's
//! directory on a blocking thread.
//!
//! The directory comes from the snapshot's mounts, as containerd's applier reads them: one
//! `bind` mount is a plain directory (a first layer), one `overlay` mount is applied onto its
//! `upperdir=` with overlay whiteouts and its `lowerdir=` as parents (`userxattr` among its
//! options selects the `user.overlay.opaque` marker). Anything else is refused by name
//! (containerd would mount it and apply into the mount; remora does not mount).

use std::io::{self, Read};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::mpsc;

use super::{apply_layer, ApplyOptions, LocalApplyError, OpaqueXattr, Whiteouts};
use crate::images::backend::{Blob, Content, DiffError, Differ, Mount};

/// Chunks buffered between the content stream and the applier (each at most 1 MiB).
const QUEUE: usize = 8;

/// Where a layer goes, read from a snapshot's mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyTarget {
    /// The directory written.
    pub root: PathBuf,
    /// The whiteout mode.
    pub whiteouts: Whiteouts,
}

impl ApplyTarget {
    /// The target of one mount (`kind`, `source`, `options` as containerd gives them).
    pub fn of_mount(kind: &str, source: &str, options: &[String]) -> Result<Self, LocalApplyError> {
        match kind {
            "bind" => Ok(Self {
                root: PathBuf::from(source),
                whiteouts: Whiteouts::Plain,
            }),
            "overlay" => {
                let mut upper = None;
                let mut lowers = Vec::new();
                let mut opaque = OpaqueXattr::Trusted;
                for o in options {
                    if let Some(u) = o.strip_prefix("upperdir=") {
                        upper = Some(PathBuf::from(u));
                    } else if let Some(l) = o.strip_prefix("lowerdir=") {
                        lowers = l.split(':').map(PathBuf::from).collect();
                    } else if o == "userxattr" {
                        opaque = OpaqueXattr::User;
                    }
                }
                Ok(Self {
                    root: upper.ok_or(LocalApplyError::NoUpperdir)?,
                    whiteouts: Whiteouts::Overlay { lowers, opaque },
                })
            }
            other => Err(LocalApplyError::Mounts {
                got: other.to_string(),
            }),
        }
    }

    fn of_mounts(mounts: &[Mount]) -> Result<Self, LocalApplyError> {
        match mounts {
            [m] => Self::of_mount(&m.kind, &m.source, &m.options),
            _ => Err(LocalApplyError::Mounts {
                got: format!(
                    "[{}]",
                    mounts
                        .iter()
                        .map(|m| m.kind.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }),
        }
    }
}

/// Whether this process runs in a user namespace other than the initial one (moby's
/// `userns.RunningInUserNS`, which containerd asks before making devices).
pub fn in_user_namespace() -> bool {
    let Ok(map) = std::fs::read_to_string("/proc/self/uid_map") else {
        return false;
    };
    let fields: Vec<&str> = map.split_whitespace().take(3).collect();
    match fields.as_slice() {
        [] => true,
        ["0", "0", "4294967295"] => false,
        [_, _, _] => true,
        _ => false,
    }
}

/// Applies layers with remora's applier, reading blobs from containerd's content store.
pub struct LocalDiffer {
    content: Arc<dyn Content>,
    skip_devices: bool,
}

impl LocalDiffer {
    /// A differ over `content`; devices are skipped inside a user namespace.
    pub fn new(content: Arc<dyn Content>) -> Self {
        Self {
            content,
            skip_devices: in_user_namespace(),
        }
    }
}

/// A chunk, or the end of the blob.
enum Piece {
    Data(Bytes),
    End,
}

/// The blocking side of the content stream.
struct ChannelReader {
    rx: mpsc::Receiver<Piece>,
    current: Bytes,
    ended: bool,
    /// Set when the stream stopped early.
    closed: Arc<Mutex<bool>>,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            if self.ended {
                return Ok(0);
            }
            match self.rx.blocking_recv() {
                Some(Piece::Data(b)) => self.current = b,
                Some(Piece::End) => self.ended = true,
                None => {
                    *self.closed.lock().unwrap_or_else(|p| p.into_inner()) = true;
                    return Err(io::Error::new(
                        io::ErrorKind::BrokenPipe,
                        "content stream closed",
                    ));
                }
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

#[async_trait::async_trait]
impl Differ for LocalDiffer {
    async fn apply(&self, layer: &Blob, mounts: Vec<Mount>) -> Result<String, DiffError> {
        let target = ApplyTarget::of_mounts(&mounts)?;
        let size = u64::try_from(layer.size).unwrap_or(0);
        let mut chunks = self.content.read_chunks(&layer.digest, size).await?;
        let (tx, rx) = mpsc::channel(QUEUE);
        let closed = Arc::new(Mutex::new(false));
        let reader = ChannelReader {
            rx,
            current: Bytes::new(),
            ended: false,
            closed: closed.clone(),
        };
        let options = ApplyOptions {
            whiteouts: target.whiteouts,
            skip_devices: self.skip_devices,
        };
        let root = target.root;
        let task = tokio::task::spawn_blocking(move || apply_layer(reader, &root, &options));
        // Feeds the applier; stops when it stops reading (its receiver gone).
        let feed = async move {
            while let Some(chunk) = chunks.next().await {
                match chunk {
                    Ok(data) => {
                        if tx.send(Piece::Data(data)).await.is_err() {
                            return Ok(());
                        }
                    }
                    // Dropping tx makes the applier's next read fail.
                    Err(e) => return Err(e),
                }
            }
            let _ = tx.send(Piece::End).await;
            Ok(())
        };
        let (fed, joined) = tokio::join!(feed, task);
        let layer_digest = || layer.digest.clone();
        let applied = joined.map_err(|e| LocalApplyError::Task {
            layer: layer_digest(),
            reason: e.to_string(),
        })?;
        if let Err(source) = fed {
            return Err(LocalApplyError::Content {
                layer: layer_digest(),
                source,
            }
            .into());
        }
        match applied {
            Ok(a) => Ok(a.diff_id),
            Err(_) if *closed.lock().unwrap_or_else(|p| p.into_inner()) => {
                Err(LocalApplyError::StreamClosed {
                    layer: layer_digest(),
                }
                .into())
            }
            Err(source) => Err(LocalApplyError::Apply {
                layer: layer_digest(),
                source,
            }
            .into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::backend_error::BackendError;
    use std::collections::HashMap;
    use std::io::Write;

    use sha2::{Digest, Sha256};

    use super::*;
    use crate::backend_error::BackendCode;
    use crate::images::backend::{ChunkStream, ContentInfo, ContentWriter};

    /// A content store of one blob, sent in chunks of `chunk` bytes; with `fail_after`, the
    /// stream fails after that many chunks.
    struct OneBlob {
        data: Vec<u8>,
        chunk: usize,
        fail_after: Option<usize>,
    }

    fn failed(op: &'static str) -> BackendError {
        BackendError::Call {
            address: "/fake".into(),
            op,
            code: BackendCode::Unavailable,
            message: "gone".into(),
        }
    }

    #[async_trait::async_trait]
    impl Content for OneBlob {
        async fn info(&self, _: &str) -> Result<Option<ContentInfo>, BackendError> {
            Ok(None)
        }
        async fn read_chunks(&self, _: &str, size: u64) -> Result<ChunkStream, BackendError> {
            assert_eq!(
                size,
                self.data.len() as u64,
                "the descriptor's size is asked"
            );
            let mut chunks: Vec<Result<Bytes, BackendError>> = self
                .data
                .chunks(self.chunk)
                .map(|c| Ok(Bytes::copy_from_slice(c)))
                .collect();
            if let Some(n) = self.fail_after {
                chunks.truncate(n);
                chunks.push(Err(failed("Content.Read")));
            }
            Ok(futures_util::stream::iter(chunks).boxed())
        }
        async fn writer(
            &self,
            _: &str,
            _: &str,
            _: &Blob,
        ) -> Result<Option<Box<dyn ContentWriter>>, BackendError> {
            Err(failed("Content.Write"))
        }
        async fn abort(&self, _: &str) -> Result<(), BackendError> {
            Ok(())
        }
        async fn set_labels(
            &self,
            _: &str,
            _: HashMap<String, String>,
        ) -> Result<(), BackendError> {
            Ok(())
        }
    }

    fn gzip_layer() -> (Vec<u8>, String) {
        let mut tar = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_ustar();
        h.set_size(5);
        h.set_mode(0o640);
        h.set_mtime(1_500_000_000);
        h.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut h, "dir/file", &b"hello"[..]).unwrap();
        let tar = tar.into_inner().unwrap();
        let diff_id = format!("sha256:{}", hex::encode(Sha256::digest(&tar)));
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&tar).unwrap();
        (gz.finish().unwrap(), diff_id)
    }

    fn bind(dir: &std::path::Path) -> Vec<Mount> {
        vec![Mount {
            kind: "bind".into(),
            source: dir.display().to_string(),
            target: String::new(),
            options: vec!["rbind".into(), "rw".into()],
        }]
    }

    fn blob(data: &[u8]) -> Blob {
        Blob {
            media_type: "application/vnd.oci.image.layer.v1.tar+gzip".into(),
            digest: format!("sha256:{}", hex::encode(Sha256::digest(data))),
            size: data.len() as i64,
        }
    }

    #[test]
    fn targets_come_from_one_bind_or_overlay_mount() {
        let opts = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            ApplyTarget::of_mount("bind", "/s/1/fs", &opts(&["rbind", "rw"])).unwrap(),
            ApplyTarget {
                root: "/s/1/fs".into(),
                whiteouts: Whiteouts::Plain
            }
        );
        let overlay = opts(&[
            "index=off",
            "lowerdir=/s/2/fs:/s/1/fs",
            "upperdir=/s/3/fs",
            "workdir=/s/3/work",
        ]);
        assert_eq!(
            ApplyTarget::of_mount("overlay", "overlay", &overlay).unwrap(),
            ApplyTarget {
                root: "/s/3/fs".into(),
                whiteouts: Whiteouts::Overlay {
                    lowers: vec!["/s/2/fs".into(), "/s/1/fs".into()],
                    opaque: OpaqueXattr::Trusted
                }
            }
        );
        let mut user = overlay.clone();
        user.push("userxattr".into());
        assert!(matches!(
            ApplyTarget::of_mount("overlay", "overlay", &user)
                .unwrap()
                .whiteouts,
            Whiteouts::Overlay {
                opaque: OpaqueXattr::User,
                ..
            }
        ));
        assert!(matches!(
            ApplyTarget::of_mount("overlay", "overlay", &opts(&["lowerdir=/a:/b"])),
            Err(LocalApplyError::NoUpperdir)
        ));
        assert!(matches!(
            ApplyTarget::of_mount("tmpfs", "tmpfs", &[]),
            Err(LocalApplyError::Mounts { .. })
        ));
        let two = [bind("/a".as_ref()), bind("/b".as_ref())].concat();
        assert!(matches!(
            ApplyTarget::of_mounts(&two),
            Err(LocalApplyError::Mounts { .. })
        ));
        assert!(matches!(
            ApplyTarget::of_mounts(&[]),
            Err(LocalApplyError::Mounts { .. })
        ));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_blob_streamed_from_the_content_store_is_applied() {
        let (data, diff_id) = gzip_layer();
        let dir = tempfile::tempdir().unwrap();
        let differ = LocalDiffer::new(Arc::new(OneBlob {
            data: data.clone(),
            chunk: 7,
            fail_after: None,
        }));
        let got = differ.apply(&blob(&data), bind(dir.path())).await.unwrap();
        assert_eq!(got, diff_id);
        assert_eq!(
            std::fs::read(dir.path().join("dir/file")).unwrap(),
            b"hello"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_content_error_midway_is_reported_as_such() {
        let (data, _) = gzip_layer();
        let dir = tempfile::tempdir().unwrap();
        let differ = LocalDiffer::new(Arc::new(OneBlob {
            data: data.clone(),
            chunk: 16,
            fail_after: Some(2),
        }));
        let err = differ
            .apply(&blob(&data), bind(dir.path()))
            .await
            .unwrap_err();
        assert!(
            matches!(err, DiffError::Local(LocalApplyError::Content { .. })),
            "{err}"
        );
        let err = differ
            .apply(
                &blob(&data),
                vec![Mount {
                    kind: "tmpfs".into(),
                    source: "x".into(),
                    target: String::new(),
                    options: vec![],
                }],
            )
            .await
            .unwrap_err();
        assert!(
            matches!(err, DiffError::Local(LocalApplyError::Mounts { .. })),
            "{err}"
        );
    }
}
