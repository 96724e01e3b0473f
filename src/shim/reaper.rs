//! stub
#![allow(missing_docs, unused)]
#[derive(Debug, thiserror::Error)]
pub enum ReapError {
    #[error("x")]
    X,
}
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    pub pid: i32,
    pub status: u32,
    pub at: std::time::SystemTime,
}
#[derive(Clone)]
pub struct Reaper;
impl Reaper {
    pub fn start(log: slog::Logger) -> Result<Reaper, ReapError> {
        todo!()
    }
    pub fn watch(&self, pid: i32) -> tokio::sync::oneshot::Receiver<Exit> {
        todo!()
    }
}
