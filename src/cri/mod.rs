//! The CRI v1 service: thin tonic adapters over plain functions.
//!
//! - [`service`] implements the generated `RuntimeService` and `ImageService` traits; each
//!   method unpacks the request, calls a plain function with domain types, and packs the
//!   result. Protobuf types stay in that file.
//! - [`instrument`] is the one instrumentation layer: log context with the pod/container/image
//!   ids, the outcome logged once, the typed error mapped to a gRPC status.
//! - The other files hold the operations, one file per RPC group ([`runtime_info`]: Version,
//!   Status, RuntimeConfig).

pub mod instrument;
pub mod runtime_info;
pub mod service;

use std::sync::Arc;

use slog::Logger;

use crate::config::Config;
use crate::containerd::health::HealthMonitor;

/// What every CRI operation can reach. Cheap to clone.
#[derive(Clone)]
pub struct Runtime {
    /// The effective configuration.
    pub config: Arc<Config>,
    /// containerd's health.
    pub health: Arc<HealthMonitor>,
    /// Root logger; requests derive their own from it.
    pub log: Logger,
}
