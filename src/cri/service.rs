//! tonic adapters for CRI v1 `RuntimeService` and `ImageService`.
//!
//! Each method unpacks the protobuf request, calls the plain operation through
//! [`instrument::run`], and packs the domain result into the protobuf response. RPCs that
//! remora does not implement yet answer `UNIMPLEMENTED` naming the RPC — never a fake success.

use std::pin::Pin;

use crate::cri::v1;
use crate::cri::v1::runtime_service_server::RuntimeService;
use slog::info;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use crate::config::CgroupDriver;
use crate::cri::convert;
use crate::cri::error::CriError;
use crate::cri::instrument::{self, Ids};
use crate::cri::{runtime_info, Subsystems};
use crate::lifecycle::sandbox_metrics;
use crate::lifecycle::CreateRequest;
use crate::lifecycle::RunSandbox;
use crate::net::cni::template::Applied;
use crate::stream::server::Request as StreamRequest;

mod image;
mod runtime;

const RUNTIME: &str = "RuntimeService";

/// Serves both CRI services over one [`Subsystems`].
#[derive(Clone)]
pub struct CriService {
    rt: Subsystems,
}

impl CriService {
    /// Wraps the runtime.
    pub fn new(rt: Subsystems) -> Self {
        Self { rt }
    }

    /// The pod's config CreateContainer's spec is made with, converted here so lifecycle never
    /// parses kubelet's messages: the request's (as containerd reads `r.GetSandboxConfig()`),
    /// else the one kept on the sandbox's record; `None` if neither converts (lifecycle then
    /// uses what the record's metadata says).
    fn pod_config_for_create(
        &self,
        requested: Option<&v1::PodSandboxConfig>,
        sandbox_id: &str,
    ) -> Option<crate::spec::SandboxConfig> {
        if let Some(c) = requested.and_then(|c| convert::sandbox_config(c).ok()) {
            return Some(c);
        }
        let kept = self
            .rt
            .pods
            .sandboxes
            .get(sandbox_id)
            .ok()?
            .metadata()
            .config_json
            .clone();
        serde_json::from_slice::<v1::PodSandboxConfig>(&kept)
            .ok()
            .and_then(|c| convert::sandbox_config(&c).ok())
    }

    /// ListPodSandbox's and StreamPodSandboxes' items.
    fn pod_sandboxes(
        &self,
        filter: Option<&v1::PodSandboxFilter>,
    ) -> Result<Vec<v1::PodSandbox>, CriError> {
        let filter = convert::sandbox_filter(filter)?;
        Ok(self
            .rt
            .pods
            .sandboxes
            .list(&filter)
            .iter()
            .map(convert::pod_sandbox)
            .collect())
    }

    /// ListContainers' and StreamContainers' items.
    fn containers(
        &self,
        filter: Option<&v1::ContainerFilter>,
    ) -> Result<Vec<v1::Container>, CriError> {
        let filter = convert::container_filter(filter)?;
        Ok(self
            .rt
            .pods
            .containers_store()
            .list(&filter, &self.rt.pods.sandboxes)
            .iter()
            .map(convert::container)
            .collect())
    }

    /// ListContainerStats' and StreamContainerStats' items.
    async fn container_stats(
        &self,
        filter: Option<v1::ContainerStatsFilter>,
    ) -> Result<Vec<v1::ContainerStats>, CriError> {
        let filter = filter.map(|f| v1::ContainerFilter {
            id: f.id,
            pod_sandbox_id: f.pod_sandbox_id,
            label_selector: f.label_selector,
            state: None,
        });
        let filter = convert::container_filter(filter.as_ref())?;
        let stats = self.rt.pods.list_container_stats(&filter).await;
        Ok(stats.iter().map(convert::container_stats).collect())
    }

    /// ListPodSandboxStats' and StreamPodSandboxStats' items.
    async fn pod_sandbox_stats(
        &self,
        filter: Option<&v1::PodSandboxStatsFilter>,
    ) -> Vec<v1::PodSandboxStats> {
        let filter = convert::sandbox_stats_filter(filter);
        let stats = self.rt.pods.list_sandbox_stats(&filter).await;
        stats.iter().map(convert::pod_sandbox_stats).collect()
    }

    /// ListPodSandboxMetrics' and StreamPodSandboxMetrics' items.
    async fn pod_sandbox_metrics(&self) -> Vec<v1::PodSandboxMetrics> {
        self.rt
            .pods
            .list_sandbox_metrics()
            .await
            .iter()
            .map(convert::pod_sandbox_metrics)
            .collect()
    }

    async fn unimplemented<T>(
        &self,
        service: &'static str,
        rpc: &'static str,
    ) -> Result<Response<T>, Status> {
        instrument::run(
            &self.rt.log,
            &self.rt.metrics,
            rpc,
            Ids::none(),
            |_log| async move { Err(CriError::Unimplemented { service, rpc }) },
        )
        .await
    }
}

fn cgroup_driver(d: CgroupDriver) -> v1::CgroupDriver {
    match d {
        CgroupDriver::Cgroupfs => v1::CgroupDriver::Cgroupfs,
        CgroupDriver::Systemd => v1::CgroupDriver::Systemd,
    }
}

/// The most one Stream* message carries, encoded, unless a single item is bigger: far below
/// the 16 MiB kubelet's CRI client accepts and tonic's 4 MiB default, the limits the Stream*
/// RPCs exist to get around.
const STREAM_BATCH_BYTES: usize = 1 << 20;

/// A Stream* RPC's response stream.
pub type BatchStream<R> = Pin<Box<dyn Stream<Item = Result<R, Status>> + Send + 'static>>;

/// `items`, in order, as the messages `wrap` makes of [`batches`] of them.
fn batch_stream<T, R>(items: Vec<T>, wrap: fn(Vec<T>) -> R) -> BatchStream<R>
where
    T: prost::Message + 'static,
    R: Send + 'static,
{
    let messages = batches(items, STREAM_BATCH_BYTES).into_iter().map(wrap);
    Box::pin(tokio_stream::iter(messages.map(Ok)))
}

/// `items`, in order, each exactly once, split into non-empty batches whose encoding as a
/// message's repeated field takes at most `limit` bytes; an item bigger than that alone goes
/// in a batch of its own. No items, no batches: the stream then ends at once.
fn batches<T: prost::Message>(items: Vec<T>, limit: usize) -> Vec<Vec<T>> {
    let mut out = Vec::new();
    let mut batch = Vec::new();
    let mut size = 0;
    for item in items {
        let len = item.encoded_len();
        // The field's one-byte tag (field 1, length-delimited) and the length prefix.
        let len = 1 + prost::length_delimiter_len(len) + len;
        if !batch.is_empty() && size + len > limit {
            out.push(std::mem::take(&mut batch));
            size = 0;
        }
        size += len;
        batch.push(item);
    }
    if !batch.is_empty() {
        out.push(batch);
    }
    out
}

fn pod_ids(id: &str) -> Ids {
    Ids {
        pod_id: Some(id.to_string()),
        ..Ids::none()
    }
}

/// The statuses of every container of a pod sandbox, as they are now.
fn container_statuses(rt: &Subsystems, sandbox_id: &str) -> Vec<v1::ContainerStatus> {
    let mut statuses: Vec<v1::ContainerStatus> = rt
        .pods
        .containers_store()
        .by_sandbox(sandbox_id)
        .iter()
        .map(|c| convert::container_status(&c.snapshot()))
        .collect();
    // Newest first, as kubelet sorts the statuses it lists itself: with the evented PLEG,
    // kubelet 1.37 takes these as they come and reads a container's restart count from the
    // first status with its name, so an older attempt first makes it reuse a taken attempt
    // number ("container name is in use").
    statuses.sort_by(|a, b| {
        b.created_at
            .cmp(&a.created_at)
            .then_with(|| a.id.cmp(&b.id))
    });
    statuses
}

/// A CRI container event with the pod's status and its containers' statuses as they are now.
fn container_event(
    rt: &Subsystems,
    e: crate::lifecycle::container_events::LifecycleEvent,
) -> v1::ContainerEventResponse {
    use crate::lifecycle::container_events::EventKind;
    let kind = match e.kind {
        EventKind::Created => v1::ContainerEventType::ContainerCreatedEvent,
        EventKind::Started => v1::ContainerEventType::ContainerStartedEvent,
        EventKind::Stopped => v1::ContainerEventType::ContainerStoppedEvent,
        EventKind::Deleted => v1::ContainerEventType::ContainerDeletedEvent,
    };
    let pod_sandbox_status = rt
        .pods
        .sandboxes
        .get(&e.sandbox_id)
        .ok()
        .map(|s| s.snapshot())
        .or_else(|| e.removed_sandbox.map(|s| *s))
        .map(|s| convert::pod_sandbox_status(&s));
    let containers_statuses = container_statuses(rt, &e.sandbox_id);
    v1::ContainerEventResponse {
        container_id: e.id,
        container_event_type: kind as i32,
        created_at: e.at_ns,
        pod_sandbox_status,
        containers_statuses,
    }
}

fn container_ids(id: &str) -> Ids {
    Ids {
        container_id: Some(id.to_string()),
        ..Ids::none()
    }
}

/// An id field (`what`) that must not be empty.
fn required(what: &'static str, id: &str) -> Result<(), CriError> {
    if id.is_empty() {
        return Err(CriError::InvalidArgument {
            what,
            reason: format!("{what} is empty"),
        });
    }
    Ok(())
}

fn required_container_id(id: &str) -> Result<(), CriError> {
    required("container_id", id)
}

/// Verbose sandbox info with what UpdatePodSandboxResources recorded, where containerd's
/// sandbox info has it: `overhead` and `resources`, each `{"linux": {...}}`.
fn verbose_with_resources(
    mut info: serde_json::Value,
    metadata: &crate::store::SandboxMetadata,
) -> serde_json::Value {
    let Some(r) = &metadata.updated_resources else {
        return info;
    };
    if let serde_json::Value::Object(map) = &mut info {
        for (key, value) in [("overhead", &r.overhead), ("resources", &r.resources)] {
            if let Some(linux) = value {
                map.insert(key.to_string(), serde_json::json!({ "linux": linux }));
            }
        }
    }
    info
}

fn required_id(id: &str) -> Result<(), CriError> {
    required("pod_sandbox_id", id)
}

/// The streams of an Exec or Attach request, checked as kubelet's streaming server does.
fn stream_options(
    stdin: bool,
    stdout: bool,
    stderr: bool,
    tty: bool,
) -> Result<crate::stream::remotecommand::Options, CriError> {
    if tty && stderr {
        return Err(CriError::InvalidArgument {
            what: "stderr",
            reason: "tty and stderr cannot both be true (a terminal has one output stream)".into(),
        });
    }
    if !stdin && !stdout && !stderr {
        return Err(CriError::InvalidArgument {
            what: "stdin/stdout/stderr",
            reason: "one of stdin, stdout, or stderr must be set".into(),
        });
    }
    Ok(crate::stream::remotecommand::Options {
        stdin,
        stdout,
        stderr,
        tty,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbose_info_reports_recorded_pod_resources_as_containerd_does() {
        use crate::store::{LinuxResources, PodResources, SandboxMetadata};
        let base = serde_json::json!({"pid": 7});
        let mut m = SandboxMetadata::default();
        assert_eq!(
            verbose_with_resources(base.clone(), &m),
            base,
            "none recorded"
        );
        m.updated_resources = Some(PodResources {
            overhead: None,
            resources: Some(LinuxResources {
                cpu_shares: 2,
                ..Default::default()
            }),
        });
        assert_eq!(
            verbose_with_resources(base, &m),
            serde_json::json!({"pid": 7, "resources": {"linux": {"cpu_shares": 2}}}),
            "no overhead sent: none reported"
        );
    }

    fn image(id: &str, tags: usize) -> v1::Image {
        v1::Image {
            id: id.to_string(),
            repo_tags: (0..tags)
                .map(|t| format!("registry.local/{id}:{t}"))
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn batches_keep_every_item_once_in_order_within_the_limit() {
        let items: Vec<v1::Image> = (0..200).map(|i| image(&format!("i{i}"), i % 7)).collect();
        let limit = 2_000;
        let got = batches(items.clone(), limit);
        assert!(got.len() > 1, "the limit splits them");
        assert!(got.iter().all(|b| !b.is_empty()), "no empty message");
        let flat: Vec<v1::Image> = got.iter().flatten().cloned().collect();
        assert_eq!(flat, items);
        for b in &got {
            // The size of the StreamImagesResponse carrying the batch, as encoded.
            let size = prost::Message::encoded_len(&v1::StreamImagesResponse { images: b.clone() });
            assert!(
                size <= limit,
                "a batch of {} items is {size} bytes",
                b.len()
            );
        }
    }

    #[test]
    fn an_item_bigger_than_the_limit_goes_alone() {
        let items = vec![image("small", 1), image("big", 500), image("small2", 1)];
        let got = batches(items, 1_000);
        let ids: Vec<Vec<&str>> = got
            .iter()
            .map(|b| b.iter().map(|i| i.id.as_str()).collect())
            .collect();
        assert_eq!(ids, vec![vec!["small"], vec!["big"], vec!["small2"]]);
    }

    #[test]
    fn no_items_no_messages() {
        assert!(batches(Vec::<v1::Image>::new(), STREAM_BATCH_BYTES).is_empty());
    }
}
