//! stub
#![allow(missing_docs, unused)]
use std::{path::Path, time::Duration};
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    #[error("x")]
    X,
}
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IoSpec {
    pub stdin: String,
    pub stdout: String,
    pub stderr: String,
    pub terminal: bool,
}
pub struct ProcessIo;
impl ProcessIo {
    pub async fn prepare(
        spec: &IoSpec,
        id: &str,
        namespace: &str,
        work_dir: &Path,
        log: slog::Logger,
    ) -> Result<ProcessIo, IoError> {
        todo!()
    }
    pub fn take_stdio(&mut self) -> crate::shim::Stdio {
        todo!()
    }
    pub fn console_socket(&self) -> Option<&Path> {
        todo!()
    }
    pub async fn start_copying(&mut self) -> Result<(), IoError> {
        todo!()
    }
    pub fn resize(&self, width: u32, height: u32) -> Result<(), IoError> {
        todo!()
    }
    pub fn close_stdin(&self) {
        todo!()
    }
    pub async fn wait_drained(&self, within: Duration) -> bool {
        todo!()
    }
    pub fn logger_pid(&self) -> Option<i32> {
        todo!()
    }
}
