//! stub
#![allow(missing_docs, unused)]
use std::path::{Path, PathBuf};
#[derive(Debug, thiserror::Error)]
pub enum RuncError {
    #[error("nf")]
    NotFound { id: String },
    #[error("x")]
    X,
}
pub struct Runc;
pub struct CreateOpts {
    pub pid_file: PathBuf,
    pub console_socket: Option<PathBuf>,
    pub stdio: crate::shim::Stdio,
    pub no_pivot: bool,
    pub no_new_keyring: bool,
}
pub struct ExecOpts {
    pub pid_file: PathBuf,
    pub console_socket: Option<PathBuf>,
    pub stdio: crate::shim::Stdio,
}
impl Runc {
    pub fn new(
        binary: PathBuf,
        root: PathBuf,
        systemd_cgroup: bool,
        reaper: crate::shim::reaper::Reaper,
        log: slog::Logger,
    ) -> Runc {
        todo!()
    }
    pub async fn create(&self, id: &str, bundle: &Path, opts: CreateOpts) -> Result<(), RuncError> {
        todo!()
    }
    pub async fn start(&self, id: &str) -> Result<(), RuncError> {
        todo!()
    }
    pub async fn exec(
        &self,
        id: &str,
        process_json: &[u8],
        opts: ExecOpts,
    ) -> Result<(), RuncError> {
        todo!()
    }
    pub async fn kill(&self, id: &str, signal: u32, all: bool) -> Result<(), RuncError> {
        todo!()
    }
    pub async fn delete(&self, id: &str, force: bool) -> Result<(), RuncError> {
        todo!()
    }
    pub async fn ps(&self, id: &str) -> Result<Vec<u32>, RuncError> {
        todo!()
    }
    pub async fn pause(&self, id: &str) -> Result<(), RuncError> {
        todo!()
    }
    pub async fn resume(&self, id: &str) -> Result<(), RuncError> {
        todo!()
    }
    pub async fn update(&self, id: &str, resources_json: &[u8]) -> Result<(), RuncError> {
        todo!()
    }
}
