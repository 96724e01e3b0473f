//! The runtime side of NRI, the Node Resource Interface (github.com/containerd/nri): what
//! remora needs to host NRI plugins as containerd's CRI and CRI-O do.
//!
//! No Rust crate implements this side of the protocol; remora writes it on the ttrpc crate it
//! already uses for its shim. The daemon wires it into its CRI calls; this crate knows nothing
//! of CRI or containerd.
#![warn(missing_docs)]

pub mod api;
