//! Pod networking: a network namespace per pod ([`netns`]) and CNI plugins run in it
//! ([`cni_exec`]), behind one facade ([`PodNetwork`]) that the sandbox code calls.

pub mod cni_exec;
#[cfg(target_os = "linux")]
#[path = "netns_linux.rs"]
pub mod netns;
