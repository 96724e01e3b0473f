//! remora: a Kubernetes CRI v1 runtime that runs beside containerd.
//!
//! kubelet, crictl and critest speak CRI v1 gRPC to remora on a unix socket ([`server`]);
//! remora drives containerd through containerd's own gRPC API ([`containerd`], the only code
//! that talks to containerd). The CRI methods are thin adapters ([`cri::service`]) over plain
//! operations, with one instrumentation layer ([`cri::instrument`]) and one mapping from typed
//! errors to gRPC statuses ([`cri::error`]).

#![warn(missing_docs)]

#[cfg(feature = "daemon")]
pub mod backoff;
#[cfg(feature = "daemon")]
pub mod cdi;
#[cfg(feature = "daemon")]
pub mod config;
#[cfg(feature = "daemon")]
pub mod containerd;
#[cfg(feature = "daemon")]
pub mod cri;
#[cfg(feature = "daemon")]
pub mod events;
#[cfg(feature = "daemon")]
pub mod failpoint;
#[cfg(feature = "daemon")]
pub mod grpc;
#[cfg(feature = "daemon")]
pub mod images;
#[cfg(feature = "daemon")]
pub mod io;
#[cfg(all(test, feature = "daemon"))]
mod layering;
#[cfg(feature = "daemon")]
pub mod lifecycle;
#[cfg(feature = "daemon")]
pub mod listener;
#[cfg(feature = "daemon")]
pub mod logging;
#[cfg(feature = "daemon")]
pub mod metrics;
#[cfg(feature = "daemon")]
pub mod net;
#[cfg(feature = "daemon")]
pub mod notify;
#[cfg(feature = "daemon")]
pub mod oci;
#[cfg(feature = "daemon")]
pub mod server;
pub mod shim;
#[cfg(feature = "daemon")]
pub mod signal;
#[cfg(feature = "daemon")]
pub mod spec;
#[cfg(feature = "daemon")]
pub mod store;
#[cfg(feature = "daemon")]
pub mod stream;
