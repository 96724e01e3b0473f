//! stub
#![allow(missing_docs, unused)]
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("x")]
    X,
}
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cgroup {
    V1(std::collections::BTreeMap<String, std::path::PathBuf>),
    V2(std::path::PathBuf),
}
impl Cgroup {
    pub fn of_pid(pid: u32) -> Result<Cgroup, CgroupError> {
        todo!()
    }
    pub fn metrics(&self) -> Result<protobuf::well_known_types::any::Any, CgroupError> {
        todo!()
    }
    pub fn oom_kills(&self) -> Result<u64, CgroupError> {
        todo!()
    }
}
