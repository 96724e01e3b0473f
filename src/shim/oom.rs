//! stub
#![allow(missing_docs, unused)]
#[derive(Debug, thiserror::Error)]
pub enum OomError {
    #[error("x")]
    X,
}
pub struct OomWatch;
impl OomWatch {
    pub fn start(
        cgroup: &crate::shim::cgroup::Cgroup,
        id: String,
        tx: tokio::sync::mpsc::UnboundedSender<String>,
        log: slog::Logger,
    ) -> Result<OomWatch, OomError> {
        todo!()
    }
}
