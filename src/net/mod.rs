//! Pod networking: a network namespace per pod ([`netns`]), CNI plugins run against it
//! ([`cni`]), and the facade the sandbox code calls ([`PodNetwork`]); `crate::host_network`
//! puts the two together as lifecycle's pod network (`crate::lifecycle::PodNetwork`).

pub mod cni;
pub mod netns;
pub mod pod_network;

#[cfg(test)]
pub use pod_network::DnsConfig;
pub use pod_network::{NetError, PodNetInfo, PodNetwork, PodNetworkConfig, PortMapping, Protocol};
