//! remora: a Kubernetes CRI v1 runtime that runs beside containerd.
//!
//! kubelet, crictl and critest speak CRI v1 gRPC to remora on a unix socket ([`server`]);
//! remora drives containerd through containerd's own gRPC API (`containerd`, the only code
//! that talks to containerd). The CRI methods are thin adapters (`cri::service`) over plain
//! operations, with one instrumentation layer (`cri::instrument`) and one mapping from typed
//! errors to gRPC statuses (`cri::error`).

#![warn(missing_docs)]

pub(crate) mod backend_error;
pub(crate) mod bounded;
pub(crate) mod cdi;
pub mod config;
pub(crate) mod containerd;
pub mod cri;
// README.md and docs/ checked against the tree.
#[cfg(test)]
mod docs;
pub(crate) mod events;
pub(crate) mod failpoint;
pub mod grpc;
pub(crate) mod host_network;
pub(crate) mod images;
pub(crate) mod io;
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
pub(crate) mod signal;
pub(crate) mod spec;
pub(crate) mod store;
pub(crate) mod stream;
