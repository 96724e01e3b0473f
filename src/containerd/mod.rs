//! The containerd port: the only code that talks to containerd.
//!
//! Users define the narrow traits they need (here [`VersionApi`] for health probing); the one
//! implementation over `containerd-client` (tonic) lives in this module. Logic behind the traits
//! is unit-tested with fakes; integration tests use a real containerd.

pub mod error;
pub mod event_stream;
pub mod health;
pub mod images;
pub mod runtime;
pub mod transfer;

use std::path::{Path, PathBuf};
use std::time::Duration;

use containerd_client::services::v1::containers_client::ContainersClient;
use containerd_client::services::v1::content_client::ContentClient;
use containerd_client::services::v1::images_client::ImagesClient;
use containerd_client::services::v1::leases_client::LeasesClient;
use containerd_client::services::v1::sandbox::store_client::StoreClient;
use containerd_client::services::v1::snapshots::snapshots_client::SnapshotsClient;
use containerd_client::services::v1::tasks_client::TasksClient;
use containerd_client::services::v1::version_client::VersionClient;
use tonic::transport::Channel;

use crate::backend_error::BackendError;

/// containerd's answer to `Version`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerdVersion {
    /// Release, e.g. `v2.3.4`.
    pub version: String,
    /// Git revision.
    pub revision: String,
}

/// Asks containerd for its version: the cheapest call that proves it answers.
#[async_trait::async_trait]
pub trait VersionApi: Send + Sync + 'static {
    /// One `Version` call bounded by `timeout`.
    async fn version(&self, timeout: Duration) -> Result<ContainerdVersion, BackendError>;
}

/// A connection to containerd over its unix socket.
///
/// The channel is lazy: creating it never fails because containerd is down, and every call
/// reconnects if the previous connection broke, so a restarted containerd is picked up without
/// rebuilding anything. The health monitor paces those attempts with backoff.
#[derive(Clone, Debug)]
pub struct Client {
    channel: Channel,
    address: PathBuf,
    namespace: String,
    connect_timeout: Duration,
}

/// Largest containerd response remora decodes (tonic's default is 4 MiB): a `Containers.List`
/// returns every record with its OCI spec and remora's metadata, tens of KiB each, so a node
/// with a few hundred containers would otherwise fail recovery.
pub(crate) const MAX_RESPONSE_BYTES: usize = 256 * 1024 * 1024;

impl Client {
    /// A lazy client for the containerd socket at `address`, using `namespace` for namespaced
    /// calls.
    pub fn new(address: &Path, namespace: &str, connect_timeout: Duration) -> Self {
        let channel = crate::grpc::unix_channel(address, connect_timeout);
        Self {
            channel,
            address: address.to_path_buf(),
            namespace: namespace.to_string(),
            connect_timeout,
        }
    }

    /// containerd's socket path.
    pub fn address(&self) -> &Path {
        &self.address
    }

    /// The containerd namespace remora uses.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// A request in remora's namespace, optionally within a lease.
    pub(crate) fn request<T>(&self, msg: T, lease: Option<&str>) -> tonic::Request<T> {
        let mut req = tonic::Request::new(msg);
        let md = req.metadata_mut();
        // The namespace was validated by Config::validate (lowercase ASCII letters, digits,
        // '-', '_', '.'), so it is a valid header value; skip it rather than panic if not.
        if let Ok(v) = self.namespace.parse() {
            md.insert("containerd-namespace", v);
        }
        if let Some(lease) = lease.filter(|l| !l.is_empty()) {
            if let Ok(v) = lease.parse() {
                md.insert("containerd-lease", v);
            }
        }
        req
    }

    /// The channel, for service clients.
    pub(crate) fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// Client of containerd's containers service.
    pub(crate) fn containers_client(&self) -> ContainersClient<Channel> {
        ContainersClient::new(self.channel()).max_decoding_message_size(MAX_RESPONSE_BYTES)
    }

    /// Client of containerd's tasks service.
    pub(crate) fn tasks_client(&self) -> TasksClient<Channel> {
        TasksClient::new(self.channel()).max_decoding_message_size(MAX_RESPONSE_BYTES)
    }

    /// Client of containerd's sandbox store (exit keepers).
    pub(crate) fn sandbox_store_client(&self) -> StoreClient<Channel> {
        StoreClient::new(self.channel()).max_decoding_message_size(MAX_RESPONSE_BYTES)
    }

    /// Client of containerd's content store.
    pub(crate) fn content_client(&self) -> ContentClient<Channel> {
        ContentClient::new(self.channel()).max_decoding_message_size(MAX_RESPONSE_BYTES)
    }

    /// Client of containerd's content store on a connection of its own, closed when the
    /// client (and every stream it opened) is dropped: for a big blob's upload.
    ///
    /// Why: every call on the shared channel is one HTTP/2 connection, whose frames — at most
    /// 16 KiB each, containerd's limit — go through one connection task here and are read by
    /// one goroutine in containerd (grpc-go reads each connection in one). Concurrent
    /// uploads on it take turns in both; on connections of their own they run side by side.
    /// Measured with 8 × 64 MiB layers, 3 uploads at once: see docs/benchmarks.md, "Big
    /// pulls". Dialing costs one unix-socket connect and the HTTP/2 handshake.
    pub(crate) fn dedicated_content_client(&self) -> ContentClient<Channel> {
        let channel = crate::grpc::unix_channel(&self.address, self.connect_timeout);
        ContentClient::new(channel).max_decoding_message_size(MAX_RESPONSE_BYTES)
    }

    /// Client of containerd's image records.
    pub(crate) fn images_client(&self) -> ImagesClient<Channel> {
        ImagesClient::new(self.channel()).max_decoding_message_size(MAX_RESPONSE_BYTES)
    }

    /// Client of containerd's leases.
    pub(crate) fn leases_client(&self) -> LeasesClient<Channel> {
        LeasesClient::new(self.channel()).max_decoding_message_size(MAX_RESPONSE_BYTES)
    }

    /// Client of containerd's snapshotters.
    pub(crate) fn snapshots_client(&self) -> SnapshotsClient<Channel> {
        SnapshotsClient::new(self.channel()).max_decoding_message_size(MAX_RESPONSE_BYTES)
    }

    /// `result` with containerd's NotFound as `None`: for calls where absent is an answer
    /// (a get of something gone, a delete of something already deleted).
    pub(crate) fn found<T>(
        &self,
        op: &'static str,
        result: Result<tonic::Response<T>, tonic::Status>,
    ) -> Result<Option<T>, BackendError> {
        match result {
            Ok(r) => Ok(Some(r.into_inner())),
            Err(s) if s.code() == tonic::Code::NotFound => Ok(None),
            Err(s) => Err(self.call_error(op, s)),
        }
    }

    pub(crate) fn call_error(&self, op: &'static str, status: tonic::Status) -> BackendError {
        // A transport failure hides its cause (e.g. "No such file or directory") in the
        // source chain; include it so the message says why.
        let mut message = status.message().to_string();
        let mut source = std::error::Error::source(&status);
        while let Some(s) = source {
            // Layers often repeat their cause's text; keep each piece once.
            let text = s.to_string();
            if !message.contains(&text) {
                message.push_str(": ");
                message.push_str(&text);
            }
            source = s.source();
        }
        BackendError::Call {
            address: self.address.clone(),
            op,
            code: error::backend_code(call_error_code(&status)),
            message,
        }
    }
}

/// The code of a failed call: containerd's answer as it gave it (`Unknown` is its code for an
/// error it does not classify, such as an OCI runtime's failure to create a task), but a
/// failure of the connection itself — a status tonic made locally, carrying the transport's
/// error as its source, usually with code `Unknown` — is `Unavailable`: containerd never
/// answered, and the call may be retried.
fn call_error_code(status: &tonic::Status) -> tonic::Code {
    let local = std::error::Error::source(status).is_some();
    match status.code() {
        tonic::Code::Unknown if local => tonic::Code::Unavailable,
        code => code,
    }
}

#[async_trait::async_trait]
impl VersionApi for Client {
    async fn version(&self, timeout: Duration) -> Result<ContainerdVersion, BackendError> {
        let mut client = VersionClient::new(self.channel.clone());
        let call = client.version(());
        match tokio::time::timeout(timeout, call).await {
            Err(_elapsed) => Err(BackendError::Timeout {
                address: self.address.clone(),
                after: timeout,
            }),
            Ok(Err(status)) => Err(self.call_error("Version.Version", status)),
            Ok(Ok(resp)) => {
                let v = resp.into_inner();
                Ok(ContainerdVersion {
                    version: v.version,
                    revision: v.revision,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::call_error_code;
    use tonic::Code;

    #[test]
    fn a_local_transport_failure_is_unavailable_and_containerds_unknown_stays_unknown() {
        // tonic's own status for a broken connection carries the transport's error.
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset");
        let local = tonic::Status::from_error(Box::new(io));
        assert_eq!(local.code(), Code::Unknown);
        assert_eq!(call_error_code(&local), Code::Unavailable);
        // containerd's answer, decoded from its trailers: no source.
        let answered = tonic::Status::new(Code::Unknown, "OCI runtime create failed");
        assert_eq!(call_error_code(&answered), Code::Unknown);
        let missing = tonic::Status::new(Code::NotFound, "no such container");
        assert_eq!(call_error_code(&missing), Code::NotFound);
    }
}
