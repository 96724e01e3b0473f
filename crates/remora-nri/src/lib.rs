//! The runtime side of NRI, the Node Resource Interface (github.com/containerd/nri): what
//! remora needs to host NRI plugins as containerd's CRI and CRI-O do.
//!
//! No Rust crate implements this side of the protocol; remora writes it on the ttrpc crate it
//! already uses for its shim. The daemon wires it into its CRI calls; this crate knows nothing
//! of CRI or containerd.
//!
//! - [`api`]: NRI's protocol (`pkg/api/api.proto`), compiled: messages, the `Plugin` client
//!   remora calls, the `Runtime` service it serves.
//! - [`mux`]: NRI's connection multiplexer, the two ttrpc connections (one each way) that
//!   share a plugin's socket.
//! - [`registry`]: the plugin registry, NRI's "adaptation": the socket plugins connect to,
//!   their registration, Configure and Synchronize, and one call per NRI event.
//! - [`merge`]: NRI's result merge: the plugins' replies to one event combined into one
//!   adjustment, resource update and set of evictions, with NRI's field ownership rules.

#![warn(missing_docs)]

pub mod api;
pub mod merge;
pub mod mux;
pub mod registry;
