//! The image-side traits of [`crate::images::backend`] over containerd's gRPC API: content,
//! images, leases, snapshots and diff.

use std::collections::HashMap;
use std::path::PathBuf;

use bytes::Bytes;
use containerd_client::services::v1::content_client::ContentClient;
use containerd_client::services::v1::diff_client::DiffClient;
use containerd_client::services::v1::introspection_client::IntrospectionClient;
use containerd_client::services::v1::snapshots::{
    CommitSnapshotRequest, ListSnapshotsRequest, MountsRequest, PrepareSnapshotRequest,
    RemoveSnapshotRequest, StatSnapshotRequest, UsageRequest, ViewSnapshotRequest,
};
use containerd_client::services::v1::{
    AbortRequest, AddResourceRequest, ApplyRequest, CreateImageRequest,
    CreateRequest as CreateLeaseRequest, DeleteImageRequest, DeleteRequest as DeleteLeaseRequest,
    GetImageRequest, Image, Info, InfoRequest, ListImagesRequest, PluginsRequest,
    ReadContentRequest, Resource, UpdateImageRequest, UpdateRequest, WriteAction,
    WriteContentRequest, WriteContentResponse,
};
use containerd_client::types::{Descriptor, Mount as PbMount};
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::Code;

use super::Client;
use crate::backend_error::{BackendCode, BackendError};
use crate::images::backend::{
    Blob, ChunkStream, Content, ContentInfo, ContentWriter, DiffError, Differ, ImageRecord, Images,
    Leases, Mount, Snapshots, Usage,
};

fn to_pb(b: &Blob) -> Descriptor {
    Descriptor {
        media_type: b.media_type.clone(),
        digest: b.digest.clone(),
        size: b.size,
        annotations: HashMap::new(),
    }
}

fn from_pb(d: Descriptor) -> Blob {
    Blob {
        media_type: d.media_type,
        digest: d.digest,
        size: d.size,
    }
}

fn record_from_pb(i: Image) -> ImageRecord {
    ImageRecord {
        name: i.name,
        target: i.target.map(from_pb).unwrap_or(Blob {
            media_type: String::new(),
            digest: String::new(),
            size: 0,
        }),
        labels: i.labels,
    }
}

fn mounts_from_pb(m: Vec<PbMount>) -> Vec<Mount> {
    m.into_iter()
        .map(|m| Mount {
            kind: m.r#type,
            source: m.source,
            target: m.target,
            options: m.options,
        })
        .collect()
}

#[async_trait::async_trait]
impl Content for Client {
    async fn info(&self, digest: &str) -> Result<Option<ContentInfo>, BackendError> {
        let mut c = self.content_client();
        let req = self.request(
            InfoRequest {
                digest: digest.to_string(),
            },
            None,
        );
        let info = self.found("Content.Info", c.info(req).await)?;
        Ok(info.and_then(|r| r.info).map(|i| ContentInfo {
            digest: i.digest,
            size: i.size,
            labels: i.labels,
        }))
    }

    async fn read_chunks(&self, digest: &str, size: u64) -> Result<ChunkStream, BackendError> {
        let mut c = self.content_client();
        // containerd answers in messages of at most 1 MiB; it reads `size` bytes (0 would
        // mean "to the end", so an empty blob needs no call).
        if size == 0 {
            return Ok(futures_util::stream::empty().boxed());
        }
        let req = self.request(
            ReadContentRequest {
                digest: digest.to_string(),
                offset: 0,
                size: size as i64,
            },
            None,
        );
        let stream = c
            .read(req)
            .await
            .map_err(|s| self.call_error("Content.Read", s))?
            .into_inner();
        // Never more than asked for, whatever the server sends: `left` counts down to 0,
        // which ends the stream; so does an error.
        let chunks = futures_util::stream::unfold(
            (stream, size, self.clone()),
            |(mut stream, left, client)| async move {
                if left == 0 {
                    return None;
                }
                match stream.next().await? {
                    Ok(chunk) => {
                        let mut data = Bytes::from(chunk.data);
                        data.truncate(usize::try_from(left).unwrap_or(usize::MAX));
                        let left = left - data.len() as u64;
                        Some((Ok(data), (stream, left, client)))
                    }
                    Err(s) => {
                        let e = client.call_error("Content.Read", s);
                        Some((Err(e), (stream, 0, client)))
                    }
                }
            },
        );
        Ok(chunks.boxed())
    }

    async fn writer(
        &self,
        lease: &str,
        write_ref: &str,
        blob: &Blob,
    ) -> Result<Option<Box<dyn ContentWriter>>, BackendError> {
        // A blob of more than one message gets a connection of its own (see
        // dedicated_content_client); the Writer keeps it until the commit.
        let mut c = if blob.size > WRITE_CHUNK as i64 {
            self.dedicated_content_client()
        } else {
            self.content_client()
        };
        let (tx, rx) = mpsc::channel::<WriteContentRequest>(WRITE_WINDOW);
        let stat = WriteContentRequest {
            action: WriteAction::Stat as i32,
            r#ref: write_ref.to_string(),
            total: blob.size,
            expected: blob.digest.clone(),
            ..Default::default()
        };
        // The receiver is alive (held by rx until the stream is handed over below).
        tx.send(stat).await.map_err(|_| self.closed_write("stat"))?;
        let req = self.request(ReceiverStream::new(rx), Some(lease));
        let mut responses = match c.write(req).await {
            Ok(r) => r.into_inner(),
            Err(s) if s.code() == Code::AlreadyExists => return Ok(None),
            Err(s) => return Err(self.call_error("Content.Write", s)),
        };
        let first = match responses.next().await {
            Some(Ok(r)) => r,
            Some(Err(s)) if s.code() == Code::AlreadyExists => return Ok(None),
            Some(Err(s)) => return Err(self.call_error("Content.Write", s)),
            None => return Err(self.closed_write("stat")),
        };
        // An ingest left by an interrupted write with the same ref resumes at its offset,
        // unless it is already past the blob's size (then it is garbage: restart).
        let offset = u64::try_from(first.offset).unwrap_or(0);
        let offset = if offset as i64 > blob.size { 0 } else { offset };
        Ok(Some(Box::new(Writer {
            _connection: c,
            client: self.clone(),
            tx,
            responses,
            write_ref: write_ref.to_string(),
            blob: blob.clone(),
            offset,
            in_flight: std::collections::VecDeque::new(),
            batch: Batcher::default(),
        })))
    }

    async fn abort(&self, write_ref: &str) -> Result<(), BackendError> {
        let mut c = self.content_client();
        let req = self.request(
            AbortRequest {
                r#ref: write_ref.to_string(),
            },
            None,
        );
        self.found("Content.Abort", c.abort(req).await)?;
        Ok(())
    }

    async fn set_labels(
        &self,
        digest: &str,
        labels: HashMap<String, String>,
    ) -> Result<(), BackendError> {
        let mut c = self.content_client();
        let paths = labels.keys().map(|k| format!("labels.{k}")).collect();
        let req = self.request(
            UpdateRequest {
                info: Some(Info {
                    digest: digest.to_string(),
                    labels,
                    ..Default::default()
                }),
                update_mask: Some(prost_types::FieldMask { paths }),
            },
            None,
        );
        c.update(req)
            .await
            .map_err(|s| self.call_error("Content.Update", s))?;
        Ok(())
    }
}

impl Client {
    fn closed_write(&self, step: &str) -> BackendError {
        BackendError::Call {
            address: self.address().to_path_buf(),
            op: "Content.Write",
            code: BackendCode::Unavailable,
            message: format!("write stream closed by containerd during {step}"),
        }
    }
}

/// Largest data payload of one `Content.Write` message. containerd's gRPC server refuses
/// messages over its 16 MiB receive limit (a 64 MiB config sent whole failed with "received
/// message larger than max"); 1 MiB stays far below it whatever the blob, and batching the
/// registry's small body chunks (a few KiB each) up to it saves a round trip per chunk.
pub const WRITE_CHUNK: usize = 1 << 20;

/// Batches written data into messages of exactly [`WRITE_CHUNK`] bytes (the last one of a
/// blob shorter), whatever sizes it is fed in: never more than one chunk is held.
#[derive(Debug, Default)]
struct Batcher {
    pending: Vec<u8>,
}

impl Batcher {
    /// Moves bytes from the front of `data` into the batch; returns the batch once it holds
    /// a full chunk (call again while `data` is not empty).
    fn fill(&mut self, data: &mut &[u8]) -> Option<Vec<u8>> {
        let take = (WRITE_CHUNK - self.pending.len()).min(data.len());
        if self.pending.capacity() == 0 && take < WRITE_CHUNK {
            self.pending.reserve_exact(WRITE_CHUNK);
        }
        self.pending.extend_from_slice(&data[..take]);
        *data = &data[take..];
        (self.pending.len() == WRITE_CHUNK).then(|| self.take())
    }

    /// What is held (possibly empty).
    fn take(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.pending)
    }

    fn len(&self) -> usize {
        self.pending.len()
    }
}

/// Write messages sent ahead of containerd's answers. containerd answers every message, in
/// order; waiting for each answer before the next message made a pull pay one round trip per
/// MiB. At most this many MiB are unacknowledged.
const WRITE_WINDOW: usize = 8;

/// A bidirectional Content.Write stream: data goes out in [`WRITE_CHUNK`]-sized messages, up to
/// [`WRITE_WINDOW`] ahead of containerd's answers; the commit waits for all of them.
struct Writer {
    /// The client the write stream was opened on: a dedicated connection lives as long as
    /// the writer.
    _connection: ContentClient<Channel>,
    client: Client,
    tx: mpsc::Sender<WriteContentRequest>,
    responses: tonic::Streaming<WriteContentResponse>,
    write_ref: String,
    blob: Blob,
    /// Bytes containerd holds under the ref (sent and acknowledged).
    offset: u64,
    /// Sizes of the data messages sent but not answered yet, oldest first.
    in_flight: std::collections::VecDeque<u64>,
    /// Bytes written but not sent yet (less than one chunk).
    batch: Batcher,
}

impl Writer {
    async fn round_trip(
        &mut self,
        req: WriteContentRequest,
        step: &str,
    ) -> Result<WriteContentResponse, BackendError> {
        self.tx
            .send(req)
            .await
            .map_err(|_| self.client.closed_write(step))?;
        match self.responses.next().await {
            Some(Ok(r)) => Ok(r),
            Some(Err(s)) => Err(self.client.call_error("Content.Write", s)),
            None => Err(self.client.closed_write(step)),
        }
    }

    /// Sends `data` as one Write message after what was sent before, once fewer than
    /// [`WRITE_WINDOW`] messages await their answer.
    async fn send(&mut self, data: Vec<u8>) -> Result<(), BackendError> {
        while self.in_flight.len() >= WRITE_WINDOW {
            self.acknowledge().await?;
        }
        let len = data.len() as u64;
        let req = WriteContentRequest {
            action: WriteAction::Write as i32,
            r#ref: self.write_ref.clone(),
            total: self.blob.size,
            expected: self.blob.digest.clone(),
            offset: (self.offset + self.in_flight.iter().sum::<u64>()) as i64,
            data,
            ..Default::default()
        };
        self.tx
            .send(req)
            .await
            .map_err(|_| self.client.closed_write("write"))?;
        self.in_flight.push_back(len);
        Ok(())
    }

    /// Reads containerd's answer to the oldest unanswered data message.
    async fn acknowledge(&mut self) -> Result<(), BackendError> {
        match self.responses.next().await {
            Some(Ok(_)) => {
                self.offset += self.in_flight.pop_front().unwrap_or(0);
                Ok(())
            }
            Some(Err(s)) => Err(self.client.call_error("Content.Write", s)),
            None => Err(self.client.closed_write("write")),
        }
    }
}

#[async_trait::async_trait]
impl ContentWriter for Writer {
    fn offset(&self) -> u64 {
        // Sent and batched bytes count: they go out before the commit, so a resumed transfer
        // continues after them.
        self.offset + self.in_flight.iter().sum::<u64>() + self.batch.len() as u64
    }

    async fn write(&mut self, data: Bytes) -> Result<(), BackendError> {
        let mut rest = &data[..];
        while !rest.is_empty() {
            if let Some(chunk) = self.batch.fill(&mut rest) {
                self.send(chunk).await?;
            }
        }
        Ok(())
    }

    async fn commit(
        mut self: Box<Self>,
        labels: HashMap<String, String>,
    ) -> Result<(), BackendError> {
        let last = self.batch.take();
        if !last.is_empty() {
            self.send(last).await?;
        }
        while !self.in_flight.is_empty() {
            self.acknowledge().await?;
        }
        let req = WriteContentRequest {
            action: WriteAction::Commit as i32,
            r#ref: self.write_ref.clone(),
            total: self.blob.size,
            expected: self.blob.digest.clone(),
            offset: self.offset as i64,
            labels,
            ..Default::default()
        };
        match self.round_trip(req, "commit").await {
            Ok(_) => Ok(()),
            // Another writer committed the same blob first: it is stored, which is the goal.
            Err(e) if e.is_already_exists() => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[async_trait::async_trait]
impl Images for Client {
    async fn get(&self, name: &str) -> Result<Option<ImageRecord>, BackendError> {
        let mut c = self.images_client();
        let req = self.request(
            GetImageRequest {
                name: name.to_string(),
            },
            None,
        );
        let r = self.found("Images.Get", c.get(req).await)?;
        Ok(r.and_then(|r| r.image).map(record_from_pb))
    }

    async fn list(&self) -> Result<Vec<ImageRecord>, BackendError> {
        let mut c = self.images_client();
        let req = self.request(ListImagesRequest { filters: vec![] }, None);
        let r = c
            .list(req)
            .await
            .map_err(|s| self.call_error("Images.List", s))?;
        Ok(r.into_inner()
            .images
            .into_iter()
            .map(record_from_pb)
            .collect())
    }

    async fn put(&self, record: ImageRecord) -> Result<(), BackendError> {
        let mut c = self.images_client();
        let image = Image {
            name: record.name.clone(),
            labels: record.labels.clone(),
            target: Some(to_pb(&record.target)),
            created_at: None,
            updated_at: None,
        };
        let req = self.request(
            CreateImageRequest {
                image: Some(image.clone()),
                source_date_epoch: None,
            },
            None,
        );
        match c.create(req).await {
            Ok(_) => Ok(()),
            Err(s) if s.code() == Code::AlreadyExists => {
                let req = self.request(
                    UpdateImageRequest {
                        image: Some(image),
                        update_mask: Some(prost_types::FieldMask {
                            paths: vec!["target".into(), "labels".into()],
                        }),
                        source_date_epoch: None,
                    },
                    None,
                );
                c.update(req)
                    .await
                    .map_err(|s| self.call_error("Images.Update", s))?;
                Ok(())
            }
            Err(s) => Err(self.call_error("Images.Create", s)),
        }
    }

    async fn delete(&self, name: &str) -> Result<(), BackendError> {
        let mut c = self.images_client();
        let req = self.request(
            DeleteImageRequest {
                name: name.to_string(),
                sync: false,
                target: None,
            },
            None,
        );
        self.found("Images.Delete", c.delete(req).await)?;
        Ok(())
    }
}

#[async_trait::async_trait]
impl Leases for Client {
    async fn create(&self, id: &str, expire_secs: u64) -> Result<(), BackendError> {
        let mut c = self.leases_client();
        let expire = std::time::SystemTime::now() + std::time::Duration::from_secs(expire_secs);
        let expire = humantime::format_rfc3339_seconds(expire).to_string();
        let labels = HashMap::from([("containerd.io/gc.expire".to_string(), expire)]);
        let req = self.request(
            CreateLeaseRequest {
                id: id.to_string(),
                labels,
            },
            None,
        );
        c.create(req)
            .await
            .map_err(|s| self.call_error("Leases.Create", s))?;
        Ok(())
    }

    async fn delete(&self, id: &str, sync: bool) -> Result<(), BackendError> {
        let mut c = self.leases_client();
        let req = self.request(
            DeleteLeaseRequest {
                id: id.to_string(),
                sync,
            },
            None,
        );
        self.found("Leases.Delete", c.delete(req).await)?;
        Ok(())
    }

    async fn list(&self) -> Result<Vec<(String, Option<std::time::SystemTime>)>, BackendError> {
        let mut c = self.leases_client();
        let req = self.request(
            containerd_client::services::v1::ListRequest {
                filters: Vec::new(),
            },
            None,
        );
        let leases = c
            .list(req)
            .await
            .map_err(|s| self.call_error("Leases.List", s))?
            .into_inner()
            .leases;
        Ok(leases
            .into_iter()
            .map(|l| {
                let at = l.created_at.and_then(|t| {
                    (t.seconds > 0).then(|| {
                        std::time::UNIX_EPOCH
                            + std::time::Duration::new(t.seconds as u64, t.nanos.max(0) as u32)
                    })
                });
                (l.id, at)
            })
            .collect())
    }

    async fn add_content(&self, id: &str, digest: &str) -> Result<(), BackendError> {
        let mut c = self.leases_client();
        let req = self.request(
            AddResourceRequest {
                id: id.to_string(),
                resource: Some(Resource {
                    id: digest.to_string(),
                    r#type: "content".to_string(),
                }),
            },
            None,
        );
        c.add_resource(req)
            .await
            .map_err(|s| self.call_error("Leases.AddResource", s))?;
        Ok(())
    }
}

#[async_trait::async_trait]
impl Snapshots for Client {
    async fn exists(&self, snapshotter: &str, key: &str) -> Result<bool, BackendError> {
        let mut c = self.snapshots_client();
        let req = self.request(
            StatSnapshotRequest {
                snapshotter: snapshotter.to_string(),
                key: key.to_string(),
            },
            None,
        );
        Ok(self.found("Snapshots.Stat", c.stat(req).await)?.is_some())
    }

    async fn prepare(
        &self,
        lease: &str,
        snapshotter: &str,
        key: &str,
        parent: &str,
        labels: &HashMap<String, String>,
    ) -> Result<Vec<Mount>, BackendError> {
        let mut c = self.snapshots_client();
        let req = self.request(
            PrepareSnapshotRequest {
                snapshotter: snapshotter.to_string(),
                key: key.to_string(),
                parent: parent.to_string(),
                labels: labels.clone(),
            },
            Some(lease),
        );
        let r = c
            .prepare(req)
            .await
            .map_err(|s| self.call_error("Snapshots.Prepare", s))?;
        Ok(mounts_from_pb(r.into_inner().mounts))
    }

    async fn view(
        &self,
        lease: &str,
        snapshotter: &str,
        key: &str,
        parent: &str,
        labels: &HashMap<String, String>,
    ) -> Result<Vec<Mount>, BackendError> {
        let mut c = self.snapshots_client();
        let req = self.request(
            ViewSnapshotRequest {
                snapshotter: snapshotter.to_string(),
                key: key.to_string(),
                parent: parent.to_string(),
                labels: labels.clone(),
            },
            Some(lease),
        );
        let r = c
            .view(req)
            .await
            .map_err(|s| self.call_error("Snapshots.View", s))?;
        Ok(mounts_from_pb(r.into_inner().mounts))
    }

    async fn mounts(&self, snapshotter: &str, key: &str) -> Result<Vec<Mount>, BackendError> {
        let mut c = self.snapshots_client();
        let req = self.request(
            MountsRequest {
                snapshotter: snapshotter.to_string(),
                key: key.to_string(),
            },
            None,
        );
        let r = c
            .mounts(req)
            .await
            .map_err(|s| self.call_error("Snapshots.Mounts", s))?;
        Ok(mounts_from_pb(r.into_inner().mounts))
    }

    async fn commit(
        &self,
        lease: &str,
        snapshotter: &str,
        name: &str,
        key: &str,
        labels: HashMap<String, String>,
    ) -> Result<(), BackendError> {
        let mut c = self.snapshots_client();
        let req = self.request(
            CommitSnapshotRequest {
                snapshotter: snapshotter.to_string(),
                name: name.to_string(),
                key: key.to_string(),
                labels,
            },
            Some(lease),
        );
        c.commit(req)
            .await
            .map_err(|s| self.call_error("Snapshots.Commit", s))?;
        Ok(())
    }

    async fn remove(&self, snapshotter: &str, key: &str) -> Result<(), BackendError> {
        let mut c = self.snapshots_client();
        let req = self.request(
            RemoveSnapshotRequest {
                snapshotter: snapshotter.to_string(),
                key: key.to_string(),
            },
            None,
        );
        self.found("Snapshots.Remove", c.remove(req).await)?;
        Ok(())
    }

    async fn list(&self, snapshotter: &str) -> Result<Vec<String>, BackendError> {
        let mut c = self.snapshots_client();
        let req = self.request(
            ListSnapshotsRequest {
                snapshotter: snapshotter.to_string(),
                filters: vec![],
            },
            None,
        );
        let mut stream = c
            .list(req)
            .await
            .map_err(|s| self.call_error("Snapshots.List", s))?
            .into_inner();
        let mut names = Vec::new();
        while let Some(page) = stream.next().await {
            let page = page.map_err(|s| self.call_error("Snapshots.List", s))?;
            names.extend(page.info.into_iter().map(|i| i.name));
        }
        Ok(names)
    }

    async fn usage(&self, snapshotter: &str, key: &str) -> Result<Usage, BackendError> {
        let mut c = self.snapshots_client();
        let req = self.request(
            UsageRequest {
                snapshotter: snapshotter.to_string(),
                key: key.to_string(),
            },
            None,
        );
        let r = c
            .usage(req)
            .await
            .map_err(|s| self.call_error("Snapshots.Usage", s))?
            .into_inner();
        Ok(Usage {
            bytes: r.size,
            inodes: r.inodes,
        })
    }

    async fn root(&self, snapshotter: &str) -> Result<Option<PathBuf>, BackendError> {
        let mut c = IntrospectionClient::new(self.channel());
        let req = self.request(
            PluginsRequest {
                filters: vec![format!(
                    "type==io.containerd.snapshotter.v1,id=={snapshotter}"
                )],
            },
            None,
        );
        let r = c
            .plugins(req)
            .await
            .map_err(|s| self.call_error("Introspection.Plugins", s))?
            .into_inner();
        Ok(r.plugins
            .into_iter()
            .find_map(|p| p.exports.get("root").map(PathBuf::from)))
    }
}

#[async_trait::async_trait]
impl Differ for Client {
    async fn apply(&self, layer: &Blob, mounts: Vec<Mount>) -> Result<String, DiffError> {
        let mut c = DiffClient::new(self.channel());
        let req = self.request(
            ApplyRequest {
                diff: Some(to_pb(layer)),
                mounts: mounts
                    .into_iter()
                    .map(|m| PbMount {
                        r#type: m.kind,
                        source: m.source,
                        target: m.target,
                        options: m.options,
                    })
                    .collect(),
                payloads: HashMap::new(),
                sync_fs: false,
            },
            None,
        );
        let r = c
            .apply(req)
            .await
            .map_err(|s| self.call_error("Diff.Apply", s))?
            .into_inner();
        Ok(r.applied.map(|d| d.digest).unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces` through a batcher; returns the sizes of the messages it would send,
    /// the last (partial) one included, and checks no byte is lost or reordered.
    fn batch(pieces: &[usize]) -> Vec<usize> {
        let mut b = Batcher::default();
        let mut sent: Vec<u8> = Vec::new();
        let mut sizes = Vec::new();
        let mut fed: Vec<u8> = Vec::new();
        for (i, n) in pieces.iter().enumerate() {
            let data: Vec<u8> = (0..*n).map(|j| (i * 7 + j) as u8).collect();
            fed.extend_from_slice(&data);
            let mut rest = &data[..];
            while !rest.is_empty() {
                if let Some(chunk) = b.fill(&mut rest) {
                    sizes.push(chunk.len());
                    sent.extend_from_slice(&chunk);
                }
            }
        }
        let last = b.take();
        if !last.is_empty() {
            sizes.push(last.len());
            sent.extend_from_slice(&last);
        }
        assert_eq!(sent, fed, "bytes kept in order");
        sizes
    }

    #[test]
    fn a_blob_written_whole_goes_out_in_bounded_messages() {
        // A 64 MiB config (plus a few bytes) written in one call: 64 full messages and the rest.
        let sizes = batch(&[64 * WRITE_CHUNK + 323]);
        assert_eq!(sizes.len(), 65);
        assert!(sizes[..64].iter().all(|s| *s == WRITE_CHUNK), "{sizes:?}");
        assert_eq!(sizes[64], 323);
    }

    #[test]
    fn small_chunks_are_batched_into_full_messages() {
        // A registry body in 16 KiB pieces with an odd one in between.
        let mut pieces = vec![16 << 10; 200];
        pieces.insert(17, 5);
        let total: usize = pieces.iter().sum();
        let sizes = batch(&pieces);
        assert_eq!(sizes.len(), total.div_ceil(WRITE_CHUNK));
        assert!(sizes.iter().all(|s| *s <= WRITE_CHUNK));
        assert!(sizes[..sizes.len() - 1].iter().all(|s| *s == WRITE_CHUNK));
        assert_eq!(batch(&[]), Vec::<usize>::new());
        assert_eq!(batch(&[WRITE_CHUNK]), vec![WRITE_CHUNK]);
    }
}
