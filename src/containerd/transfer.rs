//! [`Transfer`] over containerd's Transfer and Streaming services: a pull that containerd
//! fetches, stores and unpacks itself, with its progress — and the registry's credential
//! challenges — carried over streams remora opens beside the call.
//!
//! The protocol (containerd's `core/streaming` and `core/transfer/registry`): a stream is a
//! `Streaming.Stream` call whose first message is `StreamInit{id}`; containerd registers it
//! under that id in the caller's namespace and acknowledges with one message. The transfer
//! request then names the streams by id: `TransferOptions.progress_stream`, on which
//! containerd sends `Progress` messages until the transfer ends, and
//! `RegistryResolver.auth_stream`, on which it sends an `AuthRequest` each time a registry
//! host asks for credentials and waits for one `AuthResponse`. Messages are
//! `google.protobuf.Any` with the bare message name as type URL (containerd's `typeurl`).

use std::time::Duration;

use containerd_client::services::v1::streaming_client::StreamingClient;
use containerd_client::services::v1::transfer_client::TransferClient;
use containerd_client::services::v1::{StreamInit, TransferOptions, TransferRequest};
use containerd_client::types::transfer::{
    AuthRequest, AuthResponse, AuthType, ImageStore, OciRegistry, Progress, RegistryResolver,
    UnpackConfiguration,
};
use containerd_client::types::Platform;
use prost::Message;
use prost_types::Any;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use super::Client;
use crate::backend_error::BackendError;
use crate::images::backend::{Transfer, TransferAuth, TransferProgress, TransferPull};

const STREAM_INIT: &str = "containerd.services.streaming.v1.StreamInit";
const OCI_REGISTRY: &str = "containerd.types.transfer.OCIRegistry";
const IMAGE_STORE: &str = "containerd.types.transfer.ImageStore";
const PROGRESS: &str = "containerd.types.transfer.Progress";
const AUTH_REQUEST: &str = "containerd.types.transfer.AuthRequest";
const AUTH_RESPONSE: &str = "containerd.types.transfer.AuthResponse";

/// How long containerd gets to acknowledge a new stream.
const STREAM_OPEN_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a pull waits, after containerd's answer, for the rest of its progress reports
/// (containerd closes the progress stream before it answers; the reports may still be on
/// their way).
const PROGRESS_DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

fn to_any(type_url: &str, msg: &impl Message) -> Any {
    Any {
        type_url: type_url.to_string(),
        value: msg.encode_to_vec(),
    }
}

/// Whether `any` carries the message named `name` (with or without a URL prefix).
fn is_type(any: &Any, name: &str) -> bool {
    any.type_url == name || any.type_url.ends_with(&format!("/{name}"))
}

/// A stream id of `kind`, unique across pulls and restarts.
fn stream_id(kind: &str) -> String {
    crate::images::backend::unique_id(&format!("remora-{kind}"))
}

/// Whether containerd's `AuthRequest` for `host` may be answered with the pull's credentials.
fn auth_host_allowed(allowed: &[String], host: &str) -> bool {
    allowed.iter().any(|a| a.eq_ignore_ascii_case(host))
}

/// The answer to a registry's credential challenge.
fn auth_response(auth: &TransferAuth) -> AuthResponse {
    let (auth_type, username, secret) = match auth {
        TransferAuth::Basic { username, password } => {
            (AuthType::Credentials, username.clone(), password.clone())
        }
        TransferAuth::Refresh(token) => (AuthType::Refresh, String::new(), token.clone()),
        TransferAuth::Bearer(token) => (AuthType::Header, String::new(), format!("Bearer {token}")),
    };
    AuthResponse {
        auth_type: auth_type as i32,
        secret,
        username,
        expire_at: None,
    }
}

fn progress_from(any: &Any) -> Option<TransferProgress> {
    if !is_type(any, PROGRESS) {
        return None;
    }
    let p = Progress::decode(any.value.as_slice()).ok()?;
    Some(TransferProgress {
        event: p.event,
        digest: p.desc.map(|d| d.digest).filter(|d| !d.is_empty()),
        progress: p.progress,
        total: p.total,
    })
}

/// An open stream: what remora sends on it, and what containerd sends back.
struct OpenStream {
    outbound: mpsc::Sender<Any>,
    inbound: Streaming<Any>,
}

impl Client {
    /// Opens a stream registered in containerd as `id` and waits for its acknowledgement.
    async fn open_stream(&self, id: &str) -> Result<OpenStream, BackendError> {
        let (outbound, rx) = mpsc::channel(8);
        // The channel was just made with room for 8: the first send cannot fail or wait.
        let _ = outbound.try_send(to_any(STREAM_INIT, &StreamInit { id: id.to_string() }));
        let mut client = StreamingClient::new(self.channel());
        let open = async {
            let mut inbound = client
                .stream(self.request(ReceiverStream::new(rx), None))
                .await
                .map_err(|s| self.call_error("Streaming.Stream", s))?
                .into_inner();
            match inbound.message().await {
                Ok(Some(_ack)) => Ok(inbound),
                Ok(None) => Err(self.call_error(
                    "Streaming.Stream",
                    tonic::Status::unavailable(format!(
                        "stream {id} closed before containerd acknowledged it"
                    )),
                )),
                Err(s) => Err(self.call_error("Streaming.Stream", s)),
            }
        };
        let inbound = tokio::time::timeout(STREAM_OPEN_TIMEOUT, open)
            .await
            .map_err(|_| BackendError::Timeout {
                address: self.address().to_path_buf(),
                after: STREAM_OPEN_TIMEOUT,
            })??;
        Ok(OpenStream { outbound, inbound })
    }
}

/// Aborts a background task when dropped: the streams' tasks end with the pull, whichever
/// way it ends (dropped future included).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[async_trait::async_trait]
impl Transfer for Client {
    async fn pull(
        &self,
        request: TransferPull,
        progress: mpsc::UnboundedSender<TransferProgress>,
    ) -> Result<(), BackendError> {
        let progress_id = stream_id("progress");
        let OpenStream {
            outbound: progress_out,
            inbound: mut progress_in,
        } = self.open_stream(&progress_id).await?;
        let mut progress_task = AbortOnDrop(tokio::spawn(async move {
            // Keeps the stream's sending half open until containerd closes the stream.
            let _keep = progress_out;
            while let Ok(Some(any)) = progress_in.message().await {
                if let Some(p) = progress_from(&any) {
                    if progress.send(p).is_err() {
                        break;
                    }
                }
            }
        }));

        let mut _auth_task = None;
        let mut resolver = RegistryResolver {
            host_dir: request.host_dir.to_string_lossy().into_owned(),
            ..Default::default()
        };
        if let Some(auth) = &request.auth {
            let auth_id = stream_id("auth");
            let OpenStream {
                outbound,
                mut inbound,
            } = self.open_stream(&auth_id).await?;
            let answer = to_any(AUTH_RESPONSE, &auth_response(auth));
            let refusal = to_any(AUTH_RESPONSE, &AuthResponse::default());
            let allowed = request.auth_hosts.clone();
            _auth_task = Some(AbortOnDrop(tokio::spawn(async move {
                // One answer per challenge: the credentials for the image's registry and its
                // configured mirrors (as remora's own client uses them), no credentials
                // (`NONE`, an anonymous attempt) for any other host containerd asks about.
                while let Ok(Some(any)) = inbound.message().await {
                    if !is_type(&any, AUTH_REQUEST) {
                        continue;
                    }
                    let Ok(asked) = AuthRequest::decode(any.value.as_slice()) else {
                        continue;
                    };
                    let reply = if auth_host_allowed(&allowed, &asked.host) {
                        &answer
                    } else {
                        &refusal
                    };
                    if outbound.send(reply.clone()).await.is_err() {
                        break;
                    }
                }
            })));
            resolver.auth_stream = auth_id;
        }

        let platform = Platform {
            os: request.os.clone(),
            architecture: request.architecture.clone(),
            variant: request.variant.clone().unwrap_or_default(),
            ..Default::default()
        };
        let source = OciRegistry {
            reference: request.reference.clone(),
            resolver: Some(resolver),
        };
        let destination = ImageStore {
            name: request.image_name.clone(),
            labels: request.labels.clone(),
            platforms: vec![platform.clone()],
            unpacks: vec![UnpackConfiguration {
                platform: Some(platform),
                snapshotter: request.snapshotter.clone(),
            }],
            ..Default::default()
        };
        let req = TransferRequest {
            source: Some(to_any(OCI_REGISTRY, &source)),
            destination: Some(to_any(IMAGE_STORE, &destination)),
            options: Some(TransferOptions {
                progress_stream: progress_id,
            }),
        };
        // No deadline: a big pull takes as long as it takes; stalls are detected from the
        // progress reports by the caller, which drops this future to cancel.
        let answer = TransferClient::new(self.channel())
            .transfer(self.request(req, Some(&request.lease)))
            .await;
        // Every report reaches the caller before the answer does: the last ones (a blob
        // complete between two of containerd's ticks) are its only sign of those bytes.
        let _ = tokio::time::timeout(PROGRESS_DRAIN_TIMEOUT, &mut progress_task.0).await;
        answer.map_err(|s| self.call_error("Transfer.Transfer", s))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_registrys_hosts_get_the_credentials() {
        let allowed = vec!["127.0.0.1:5000".to_string(), "mirror.example".to_string()];
        assert!(auth_host_allowed(&allowed, "127.0.0.1:5000"));
        assert!(auth_host_allowed(&allowed, "Mirror.Example"));
        assert!(!auth_host_allowed(&allowed, "127.0.0.2:5000"));
        assert!(!auth_host_allowed(&allowed, "127.0.0.1:5001"));
        assert!(!auth_host_allowed(&[], "127.0.0.1:5000"));
        let refusal = AuthResponse::default();
        assert_eq!(refusal.auth_type, AuthType::None as i32);
        assert!(refusal.secret.is_empty() && refusal.username.is_empty());
    }

    #[test]
    fn credentials_answer_each_kind_of_challenge() {
        let basic = auth_response(&TransferAuth::Basic {
            username: "u".into(),
            password: "p".into(),
        });
        assert_eq!(basic.auth_type, AuthType::Credentials as i32);
        assert_eq!((basic.username.as_str(), basic.secret.as_str()), ("u", "p"));
        let refresh = auth_response(&TransferAuth::Refresh("r".into()));
        assert_eq!(refresh.auth_type, AuthType::Refresh as i32);
        assert_eq!(
            (refresh.username.as_str(), refresh.secret.as_str()),
            ("", "r")
        );
        let bearer = auth_response(&TransferAuth::Bearer("t".into()));
        assert_eq!(bearer.auth_type, AuthType::Header as i32);
        assert_eq!(bearer.secret, "Bearer t");
    }

    #[test]
    fn progress_messages_are_read_and_others_ignored() {
        let p = Progress {
            event: "downloading".into(),
            name: "layer".into(),
            progress: 10,
            total: 20,
            desc: Some(containerd_client::types::Descriptor {
                digest: "sha256:ab".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        // containerd sends the bare name; a prefixed URL means the same message.
        for url in [
            PROGRESS,
            "type.googleapis.com/containerd.types.transfer.Progress",
        ] {
            let got = progress_from(&to_any(url, &p)).expect("a progress message");
            assert_eq!(got.digest.as_deref(), Some("sha256:ab"));
            assert_eq!((got.progress, got.total), (10, 20));
            assert_eq!(got.event, "downloading");
        }
        let step = progress_from(&to_any(
            PROGRESS,
            &Progress {
                event: "Pulling from x".into(),
                ..Default::default()
            },
        ))
        .expect("a step");
        assert_eq!(step.digest, None);
        assert!(progress_from(&to_any(AUTH_REQUEST, &AuthRequest::default())).is_none());
    }

    #[test]
    fn stream_ids_are_unique() {
        assert_ne!(stream_id("progress"), stream_id("progress"));
    }
}
