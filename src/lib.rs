//! remora: a Kubernetes CRI v1 runtime that runs beside containerd.
//!
//! kubelet, crictl and critest speak CRI v1 gRPC to remora on a unix socket ([`server`]);
//! remora drives containerd through containerd's own gRPC API ([`containerd`], the only code
//! that talks to containerd). The CRI methods are thin adapters ([`cri::service`]) over plain
//! operations, with one instrumentation layer ([`cri::instrument`]) and one mapping from typed
//! errors to gRPC statuses ([`cri::error`]).

#![warn(missing_docs)]

pub mod cdi;
pub mod config;
pub mod containerd;
pub mod cri;
pub mod events;
pub mod failpoint;
pub mod grpc;
pub mod images;
pub mod io;
#[cfg(test)]
mod layering;
pub mod lifecycle;
pub mod listener;
pub mod logging;
pub mod metrics;
pub mod net;
pub mod notify;
pub mod oci;
pub mod server;
pub mod signal;
pub mod spec;
pub mod store;
pub mod stream;
