//! gRPC over unix sockets.

use std::path::Path;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint};

/// A lazy gRPC channel to the unix socket at `path`.
///
/// Creating it never fails, even when nothing listens yet; each call dials (or re-dials after a
/// broken connection), bounded by `connect_timeout`. So a peer that restarts is picked up
/// without rebuilding the channel.
pub fn unix_channel(path: &Path, connect_timeout: Duration) -> Channel {
    let path = path.to_path_buf();
    // The URI is a placeholder: the connector below ignores it and dials the unix socket.
    Endpoint::from_static("http://[::]:50051")
        .connect_timeout(connect_timeout)
        .connect_with_connector_lazy(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
}
