//! Pod sandbox and container lifecycle.
//!
//! - [`backend`]: what lifecycle needs from containerd (container records, tasks).
//! - [`sandbox`] and [`container`]: the CRI lifecycle operations; [`mount`]: temporary mounts.
//! - [`sandbox_files`]: the hostname/hosts/resolv.conf files and `/dev/shm` a pod shares.
//! - [`host`]: facts about this host that specs depend on.

pub mod backend;
pub mod container;
#[cfg(target_os = "linux")]
pub mod container_exec;
#[cfg(target_os = "linux")]
#[path = "container_stats_linux.rs"]
pub mod container_stats;
pub mod events;
#[cfg(target_os = "linux")]
#[path = "host_linux.rs"]
pub mod host;
#[cfg(target_os = "linux")]
#[path = "host_network_linux.rs"]
pub mod host_network;
#[cfg(target_os = "linux")]
pub mod journal;
#[cfg(target_os = "linux")]
#[path = "mount_linux.rs"]
pub mod mount;
#[cfg(target_os = "linux")]
pub mod recover;
pub mod sandbox;
#[cfg(target_os = "linux")]
#[path = "sandbox_files_linux.rs"]
pub mod sandbox_files;
