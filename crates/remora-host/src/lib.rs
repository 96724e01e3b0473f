//! Host code of remora's daemon and its shim, with no dependency on either: user namespaces and
//! idmapped mounts ([`userns`]), where a process's cgroup is on v1, v2 or a hybrid host
//! ([`cgroup`]), containerd's mount options read as `mount(2)` flags ([`mount`]), mountinfo's
//! escapes ([`mountinfo`]), exponential [`backoff`], and reading a file that must be a regular
//! one ([`fs`]).
//!
//! The shim links this crate, so it stays small: libc, nix and thiserror only. It also holds
//! the one contract between the two that is not containerd's: [`POD_HOLDER_ANNOTATION`].

#![warn(missing_docs)]

/// The annotation, value `"true"`, on the spec of the task that holds the shim of a pod
/// without a pause container (a spec with no `process`): remora's shim runs nothing for it
/// and keeps itself, with the pod's containers, until that task is killed and deleted.
pub const POD_HOLDER_ANNOTATION: &str = "dev.remora.pod-holder";

pub mod backoff;
pub mod cgroup;
pub mod fs;
pub mod mount;
pub mod mountinfo;
pub mod userns;
