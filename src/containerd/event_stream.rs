//! containerd's event stream, decoded into the events remora acts on.

use std::pin::Pin;
use std::time::Duration;

use containerd_client::events::{TaskExit, TaskOom};
use containerd_client::services::v1::events_client::EventsClient;
use containerd_client::services::v1::{
    ImageCreate, ImageDelete, ImageUpdate, PublishRequest, SubscribeRequest,
};
use prost::Message;
use tokio_stream::{Stream, StreamExt};

use super::Client;
use crate::backend_error::{BackendCode, BackendError};

/// An event remora handles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// An image record was created (by remora or another client).
    ImageCreate {
        /// Record name.
        name: String,
    },
    /// An image record changed.
    ImageUpdate {
        /// Record name.
        name: String,
    },
    /// An image record was deleted.
    ImageDelete {
        /// Record name.
        name: String,
    },
    /// A task's process exited.
    TaskExit {
        /// Container id.
        container_id: String,
        /// Exec id (equal to the container id for the init process).
        id: String,
        /// Exit status.
        exit_status: u32,
    },
    /// A task's cgroup hit its memory limit.
    TaskOom {
        /// Container id.
        container_id: String,
    },
    /// Not from containerd: remora's exit monitor saw a container's init process exit (its
    /// output drained), queued on the container's id behind any event still being retried.
    ContainerExited {
        /// Container id.
        container_id: String,
        /// Exit status.
        exit_status: u32,
        /// When.
        exited_at: Option<std::time::SystemTime>,
    },
    /// Any other topic (ignored by handlers, kept for logging).
    Other,
}

impl Event {
    /// The object the event is about: events for one id are handled in order.
    pub fn subject(&self) -> Option<&str> {
        match self {
            Event::ImageCreate { name }
            | Event::ImageUpdate { name }
            | Event::ImageDelete { name } => Some(name),
            Event::TaskExit { container_id, .. }
            | Event::TaskOom { container_id }
            | Event::ContainerExited { container_id, .. } => Some(container_id),
            Event::Other => None,
        }
    }
    /// The event's topic, as a metrics label: containerd's topic, or `/remora/container-exited`
    /// for the exit monitor's own event.
    pub fn topic(&self) -> &'static str {
        match self {
            Event::ImageCreate { .. } => "/images/create",
            Event::ImageUpdate { .. } => "/images/update",
            Event::ImageDelete { .. } => "/images/delete",
            Event::TaskExit { .. } => "/tasks/exit",
            Event::TaskOom { .. } => "/tasks/oom",
            Event::ContainerExited { .. } => "/remora/container-exited",
            Event::Other => "other",
        }
    }
}

/// One event with its envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// containerd namespace the event happened in.
    pub namespace: String,
    /// Topic, e.g. `/images/create`.
    pub topic: String,
    /// The decoded event.
    pub event: Event,
}

/// A stream of events; ends (or yields an error) when the connection to containerd breaks.
pub type EventStream = Pin<Box<dyn Stream<Item = Result<Envelope, BackendError>> + Send>>;

fn decode(type_url: &str, value: &[u8]) -> Option<Event> {
    // containerd names event types by their protobuf full name; match on the last segment
    // of the URL so both "/pkg.Type" and "types.containerd.io/pkg.Type" forms decode.
    let name = type_url.rsplit(['/']).next()?;
    Some(match name {
        "containerd.services.images.v1.ImageCreate" => Event::ImageCreate {
            name: ImageCreate::decode(value).ok()?.name,
        },
        "containerd.services.images.v1.ImageUpdate" => Event::ImageUpdate {
            name: ImageUpdate::decode(value).ok()?.name,
        },
        "containerd.services.images.v1.ImageDelete" => Event::ImageDelete {
            name: ImageDelete::decode(value).ok()?.name,
        },
        "containerd.events.TaskExit" => {
            let e = TaskExit::decode(value).ok()?;
            Event::TaskExit {
                container_id: e.container_id,
                id: e.id,
                exit_status: e.exit_status,
            }
        }
        "containerd.events.TaskOOM" | "containerd.events.TaskOom" => Event::TaskOom {
            container_id: TaskOom::decode(value).ok()?.container_id,
        },
        _ => Event::Other,
    })
}

/// Topic remora publishes to itself to confirm a subscription (see [`Client::subscribe`]).
pub const PING_TOPIC: &str = "/remora/subscription-ping";
/// How long to wait for containerd to confirm a subscription.
const CONFIRM_LIMIT: Duration = Duration::from_secs(10);

impl Client {
    /// Subscribes to events in remora's namespace whose topic matches one of `topic_prefixes`
    /// (e.g. `/images/`, `/tasks/exit`).
    ///
    /// containerd sends the stream's response headers only with its first event, and tonic
    /// waits for those headers, so a quiet namespace would leave the call pending — and the
    /// caller unable to tell whether it is subscribed yet. So remora publishes a ping event to
    /// itself until the subscription delivers it: when this returns, the subscription is live
    /// and whatever happens from now on is seen (the ping itself is filtered out).
    pub async fn subscribe(&self, topic_prefixes: &[&str]) -> Result<EventStream, BackendError> {
        let ns = self.namespace().to_string();
        let filters = topic_prefixes
            .iter()
            .chain(std::iter::once(&PING_TOPIC))
            .map(|t| format!("namespace=={ns},topic~=\"^{}\"", t))
            .collect();
        let mut c = EventsClient::new(self.channel());
        let req = self.request(SubscribeRequest { filters }, None);
        let mut pending = tokio::spawn(async move { c.subscribe(req).await });
        let started = tokio::time::Instant::now();
        let stream = loop {
            tokio::select! {
                joined = &mut pending => {
                    break joined
                        .map_err(|e| self.closed_stream(&e.to_string()))?
                        .map_err(|s| self.call_error("Events.Subscribe", s))?
                        .into_inner();
                }
                _ = tokio::time::sleep(Duration::from_millis(50)) => {
                    if started.elapsed() > CONFIRM_LIMIT {
                        pending.abort();
                        return Err(BackendError::Timeout {
                            address: self.address().to_path_buf(),
                            after: CONFIRM_LIMIT,
                        });
                    }
                    // Errors here show up as the subscription failing or timing out.
                    let _ = self.publish_ping().await;
                }
            }
        };
        let me = self.clone();
        let events = stream.filter_map(move |item| {
            let env = match item {
                Ok(env) => env,
                Err(s) => return Some(Err(me.call_error("Events.Subscribe", s))),
            };
            if env.topic == PING_TOPIC {
                return None;
            }
            let event = env
                .event
                .as_ref()
                .and_then(|any| decode(&any.type_url, &any.value))
                .unwrap_or(Event::Other);
            Some(Ok(Envelope {
                namespace: env.namespace,
                topic: env.topic,
                event,
            }))
        });
        Ok(Box::pin(events))
    }

    async fn publish_ping(&self) -> Result<(), BackendError> {
        let mut c = EventsClient::new(self.channel());
        let req = self.request(
            PublishRequest {
                topic: PING_TOPIC.to_string(),
                event: Some(prost_types::Any {
                    type_url: "remora.SubscriptionPing".to_string(),
                    value: Vec::new(),
                }),
            },
            None,
        );
        c.publish(req)
            .await
            .map_err(|s| self.call_error("Events.Publish", s))?;
        Ok(())
    }

    fn closed_stream(&self, why: &str) -> BackendError {
        BackendError::Call {
            address: self.address().to_path_buf(),
            op: "Events.Subscribe",
            code: BackendCode::Unavailable,
            message: format!("subscription task failed: {why}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_image_and_task_events() {
        let v = ImageCreate {
            name: "docker.io/library/busybox:latest".into(),
            labels: Default::default(),
        }
        .encode_to_vec();
        assert_eq!(
            decode("containerd.services.images.v1.ImageCreate", &v),
            Some(Event::ImageCreate {
                name: "docker.io/library/busybox:latest".into()
            })
        );
        let v = TaskExit {
            container_id: "c1".into(),
            id: "c1".into(),
            pid: 7,
            exit_status: 137,
            exited_at: None,
        }
        .encode_to_vec();
        let e = decode("types.containerd.io/containerd.events.TaskExit", &v).unwrap();
        assert_eq!(e.subject(), Some("c1"));
        assert!(matches!(
            e,
            Event::TaskExit {
                exit_status: 137,
                ..
            }
        ));
        assert_eq!(
            decode("containerd.events.ContentCreate", &[]),
            Some(Event::Other)
        );
    }
}
