//! The task service's errors, and their one mapping to ttrpc statuses.
//!
//! containerd turns a ttrpc status back into its own error kinds by code (`errgrpc.ToNative`):
//! NOT_FOUND, ALREADY_EXISTS, FAILED_PRECONDITION and UNIMPLEMENTED keep their meaning on the
//! way to the CRI client, so the codes here are the contract; the message names what failed.

use containerd_shim_protos::ttrpc;
use ttrpc::Code;

use super::cgroup::CgroupError;
use super::io::IoError;
use super::runc::RuncError;

/// A task service call that failed.
#[derive(Debug, thiserror::Error)]
pub enum ShimError {
    /// No container with this id in this shim.
    #[error("container {id} not found")]
    ContainerNotFound {
        /// The container id.
        id: String,
    },
    /// No exec process with this id in the container.
    #[error("exec {exec_id} of container {id} not found")]
    ExecNotFound {
        /// The container id.
        id: String,
        /// The exec id.
        exec_id: String,
    },
    /// A container or exec with this id exists already.
    #[error("{what} {id} already exists")]
    AlreadyExists {
        /// "container" or "exec".
        what: &'static str,
        /// The id.
        id: String,
    },
    /// The process has exited: nothing to signal.
    #[error("process {id} already finished")]
    ProcessFinished {
        /// The container (or exec) id.
        id: String,
    },
    /// The call does not fit the process's state (e.g. delete while running).
    #[error("{id}: cannot {action} a {state} process")]
    WrongState {
        /// The container (or exec) id.
        id: String,
        /// What was asked.
        action: &'static str,
        /// The process's state.
        state: &'static str,
    },
    /// A request field is malformed.
    #[error("invalid {field}: {reason}")]
    InvalidArgument {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// Mounting or unmounting the container's rootfs failed.
    #[error("rootfs of {id}: {op} {target}: {source}")]
    Rootfs {
        /// The container id.
        id: String,
        /// "mount" or "unmount".
        op: &'static str,
        /// The mount point.
        target: String,
        /// The error.
        source: nix::Error,
    },
    /// An idmapped rootfs (a user-namespaced pod's `uidmap=`/`gidmap=` mount options) could
    /// not be made.
    #[error("rootfs of {id}: idmap: {source}")]
    Idmap {
        /// The container id.
        id: String,
        #[source]
        source: remora_host::userns::UsernsError,
    },
    /// A file of the bundle could not be read or written.
    #[error("{path}: {source}")]
    BundleFile {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// The OCI runtime failed.
    #[error(transparent)]
    Runc(#[from] RuncError),
    /// Setting up or driving the process's IO failed.
    #[error(transparent)]
    Io(#[from] IoError),
    /// The container's cgroup could not be read.
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    /// Signalling an exec process failed.
    #[error("signal {signal} to pid {pid}: {source}")]
    Signal {
        /// The signal.
        signal: u32,
        /// The pid.
        pid: i32,
        /// The error.
        source: nix::Error,
    },
    /// Not supported by this shim.
    #[error("{0} is not implemented by containerd-shim-remora-v2")]
    Unimplemented(&'static str),
}

impl ShimError {
    /// The ttrpc code containerd maps back to its error kinds.
    pub fn code(&self) -> Code {
        match self {
            ShimError::ContainerNotFound { .. }
            | ShimError::ExecNotFound { .. }
            | ShimError::ProcessFinished { .. } => Code::NOT_FOUND,
            ShimError::AlreadyExists { .. } => Code::ALREADY_EXISTS,
            ShimError::WrongState { .. } => Code::FAILED_PRECONDITION,
            ShimError::InvalidArgument { .. } => Code::INVALID_ARGUMENT,
            ShimError::Unimplemented(_) => Code::UNIMPLEMENTED,
            ShimError::Runc(RuncError::NotFound { .. }) => Code::NOT_FOUND,
            // The runtime hung and was killed: the message names the command and container.
            ShimError::Runc(RuncError::Timeout { .. }) => Code::DEADLINE_EXCEEDED,
            ShimError::Signal {
                source: nix::Error::ESRCH,
                ..
            } => Code::NOT_FOUND,
            ShimError::Rootfs { .. }
            | ShimError::Idmap { .. }
            | ShimError::BundleFile { .. }
            | ShimError::Runc(_)
            | ShimError::Io(_)
            | ShimError::Cgroup(_)
            | ShimError::Signal { .. } => Code::UNKNOWN,
        }
    }
}

impl From<ShimError> for ttrpc::Error {
    fn from(e: ShimError) -> Self {
        ttrpc::Error::RpcStatus(ttrpc::get_status(e.code(), e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_keep_their_meaning_for_containerd() {
        let cases = [
            (
                ShimError::ContainerNotFound { id: "c".into() },
                Code::NOT_FOUND,
            ),
            (
                ShimError::AlreadyExists {
                    what: "exec",
                    id: "e".into(),
                },
                Code::ALREADY_EXISTS,
            ),
            (
                ShimError::WrongState {
                    id: "c".into(),
                    action: "delete",
                    state: "running",
                },
                Code::FAILED_PRECONDITION,
            ),
            (ShimError::Unimplemented("Checkpoint"), Code::UNIMPLEMENTED),
            (
                ShimError::Runc(RuncError::Timeout {
                    command: "runc create".into(),
                    id: "c1".into(),
                    after: std::time::Duration::from_secs(120),
                    pid: 42,
                }),
                Code::DEADLINE_EXCEEDED,
            ),
            (
                ShimError::Signal {
                    signal: 9,
                    pid: 1,
                    source: nix::Error::ESRCH,
                },
                Code::NOT_FOUND,
            ),
        ];
        for (e, code) in cases {
            let msg = e.to_string();
            match ttrpc::Error::from(e) {
                ttrpc::Error::RpcStatus(s) => {
                    assert_eq!(s.code(), code, "{msg}");
                    assert_eq!(s.message(), msg);
                    if code == Code::DEADLINE_EXCEEDED {
                        // The verb and the container are named.
                        assert!(
                            msg.contains("runc create") && msg.contains("\"c1\""),
                            "{msg}"
                        );
                    }
                }
                other => panic!("not a status: {other:?}"),
            }
        }
    }
}
