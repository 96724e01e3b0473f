//! stub
#![allow(missing_docs, unused)]
use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("x")]
    X,
}
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("x")]
    X,
}
#[async_trait::async_trait]
pub trait Forwarder: Send + Sync + 'static {
    async fn forward(
        &self,
        envelope: &containerd_shim_protos::shim::event::Envelope,
    ) -> Result<(), ForwardError>;
}
pub struct TtrpcForwarder;
impl TtrpcForwarder {
    pub fn new(address: String, timeout: Duration) -> Self {
        todo!()
    }
}
#[async_trait::async_trait]
impl Forwarder for TtrpcForwarder {
    async fn forward(
        &self,
        envelope: &containerd_shim_protos::shim::event::Envelope,
    ) -> Result<(), ForwardError> {
        todo!()
    }
}
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
}
impl Default for Backoff {
    fn default() -> Self {
        todo!()
    }
}
#[derive(Clone)]
pub struct Publisher;
impl Publisher {
    pub fn start(
        spool: PathBuf,
        namespace: String,
        forwarder: Arc<dyn Forwarder>,
        backoff: Backoff,
        log: slog::Logger,
    ) -> Result<Publisher, PublishError> {
        todo!()
    }
    pub fn publish(&self, topic: &str, event: &dyn protobuf::MessageDyn) {
        todo!()
    }
    pub async fn flush(&self, within: Duration) -> bool {
        todo!()
    }
    pub fn pending(&self) -> usize {
        todo!()
    }
}
pub async fn drain_spool(
    spool: &Path,
    forwarder: Arc<dyn Forwarder>,
    within: Duration,
    log: &slog::Logger,
) -> Result<usize, PublishError> {
    todo!()
}
