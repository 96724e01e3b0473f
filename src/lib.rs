//! remora: a Kubernetes CRI v1 runtime that runs beside containerd.
//!
//! kubelet, crictl and critest speak CRI v1 gRPC to remora on a unix socket ([`server`]);
//! remora drives containerd through containerd's own gRPC API (`containerd`, the only code
//! that talks to containerd). The CRI methods are thin adapters (`cri::service`) over plain
//! operations, with one instrumentation layer (`cri::instrument`) and one mapping from typed
//! errors to gRPC statuses (`cri::error`).

#![warn(missing_docs)]

pub mod config;
pub(crate) mod containerd;
// The core's modules (crates/remora-core), under the paths the adapters name them by.
pub(crate) use remora_core::{backend_error, bounded, cdi, failpoint, io, signal, spec, store};
pub mod cri;
// README.md and docs/ checked against the tree.
#[cfg(test)]
mod docs;
pub(crate) mod events;
pub mod grpc;
pub(crate) mod host_network;
pub(crate) mod images;
// remora's layer applier, for the differential test against containerd's (integration/apply.rs).
pub use images::apply as layer_apply;
#[cfg(test)]
mod layering;
pub mod lifecycle;
pub(crate) mod listener;
pub mod logging;
pub mod metrics;
pub(crate) mod net;
pub(crate) mod notify;
// pub(crate) as the store whose records it converts.
pub(crate) mod nri;
pub(crate) mod oci;
pub mod server;
pub mod status;
pub(crate) mod stream;
