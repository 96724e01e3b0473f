//! Host code of remora's daemon and its shim, with no dependency on either: user namespaces and
//! idmapped mounts ([`userns`]), where a process's cgroup is on v1, v2 or a hybrid host
//! ([`cgroup`]), containerd's mount options read as `mount(2)` flags ([`mount`]), mountinfo's
//! escapes ([`mountinfo`]), exponential [`backoff`], and reading a file that must be a regular
//! one ([`fs`]).
//!
//! The shim links this crate, so it stays small: libc, nix and thiserror only.

#![warn(missing_docs)]

pub mod backoff;
pub mod cgroup;
pub mod fs;
pub mod mount;
pub mod mountinfo;
pub mod userns;
