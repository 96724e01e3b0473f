//! The CRI v1 service: thin tonic adapters over plain functions.
//!
//! - [`service`] implements the generated `RuntimeService` and `ImageService` traits; each
//!   method unpacks the request, calls a plain function with domain types, and packs the
//!   result. Protobuf types stay in that file.
//! - [`instrument`] is the one instrumentation layer: log context with the pod/container/image
//!   ids, the outcome logged once, the typed error mapped to a gRPC status.
//! - The other files hold the operations, one file per RPC group ([`runtime_info`]: Version,
//!   Status, RuntimeConfig; `image_*`: the image service).

pub mod convert;
pub mod deadline;
pub mod error;
pub mod image_fs_info;
pub mod image_pull;
pub mod image_remove;
pub mod image_status;
pub mod instrument;
pub mod runtime_info;
pub mod service;
pub mod validate;

use std::sync::Arc;

use slog::Logger;

use crate::config::Config;
use crate::containerd::health::HealthMonitor;
use crate::images::pull::{Backend, Puller};
use crate::images::store::ImageIndex;

/// The image side of the runtime.
pub struct ImageRuntime {
    /// The in-memory image index.
    pub index: Arc<ImageIndex>,
    /// Pulls images.
    pub puller: Puller,
    /// containerd's content, images, leases, snapshots and diff services.
    pub backend: Backend,
}

/// What every CRI operation can reach. Cheap to clone.
#[derive(Clone)]
pub struct Runtime {
    /// The effective configuration.
    pub config: Arc<Config>,
    /// containerd's health.
    pub health: Arc<HealthMonitor>,
    /// Image index, puller and the containerd services images live in.
    pub images: Arc<ImageRuntime>,
    /// Pod sandboxes.
    pub pods: Arc<crate::lifecycle::Pods>,
    /// The streaming server Exec, Attach and PortForward hand out URLs on.
    pub streaming: Arc<crate::stream::server::StreamServer>,
    /// Root logger; requests derive their own from it.
    pub log: Logger,
    /// Metrics (the instrumentation layer counts every call).
    pub metrics: crate::metrics::Metrics,
}

#[tonic::async_trait]
impl crate::lifecycle::backend::LocalImages for ImageRuntime {
    fn find(&self, image: &str) -> Option<crate::images::store::ImageInfo> {
        self.index.find(image)
    }

    fn get(&self, reference: &str) -> Option<crate::images::store::ImageInfo> {
        self.index.get(reference)
    }

    async fn pull(
        &self,
        reference: &str,
    ) -> Result<crate::images::store::ImageInfo, crate::images::pull::PullError> {
        self.puller
            .pull(
                reference,
                crate::images::registry::auth::Credentials::anonymous(),
            )
            .await
    }
}
