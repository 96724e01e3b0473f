//! NRI (Node Resource Interface) in the daemon: what remora hands NRI plugins, through the
//! runtime side of the protocol in the `remora-nri` crate (its registry, merge and messages).
//!
//! - [`convert`]: remora's pod and container records as NRI's `PodSandbox` and `Container`,
//!   the input of every NRI hook and of a plugin's Synchronize. Pure: the caller reads what
//!   it needs (the store's snapshots, the OCI spec) and passes it in.
//!
//! - [`hooks`]: lifecycle's NRI hooks over the registry, and the registry's view of remora's
//!   pods (Synchronize's snapshot; the updates and evictions plugins ask for).
//!
//! The crate knows nothing of CRI or containerd; this module is where remora's own types meet
//! NRI's messages, so neither the store nor the lifecycle code sees a protobuf type.

pub mod convert;
pub mod hooks;

pub use hooks::{Nri, PodsView};
