//! remora's core, without gRPC: the records of pods and containers ([`store`]), OCI runtime
//! spec generation ([`spec`]), CDI device resolution ([`cdi`]), container IO ([`io`]), the
//! error of the backend ports ([`backend_error`]), bounded commands ([`bounded`]), signal
//! names ([`signal`]) and the failpoints of the fault tests ([`failpoint`]).
//!
//! The daemon (the `remora` package) holds the adapters — CRI over tonic, containerd, CNI,
//! the OCI runtime's command line, streaming — and builds on this crate; this crate depends on
//! none of them, so `cargo tree -p remora-core -e normal` lists no tonic, hyper, reqwest or
//! prost, and a use of an adapter from here is a compile error (STYLE 4).

#![warn(missing_docs)]

pub mod backend_error;
pub mod bounded;
pub mod cdi;
pub mod failpoint;
pub mod io;
pub mod signal;
pub mod spec;
pub mod store;
