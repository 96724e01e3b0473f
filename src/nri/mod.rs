//! NRI (Node Resource Interface) in the daemon: what remora hands NRI plugins, through the
//! runtime side of the protocol in the `remora-nri` crate (its registry, merge and messages).
//!
//! - [`convert`]: remora's pod and container records as NRI's `PodSandbox` and `Container`,
//!   the input of every NRI hook and of a plugin's Synchronize. Pure: the caller reads what
//!   it needs (the store's snapshots, the OCI spec) and passes it in.
//!
//! The crate knows nothing of CRI or containerd; this module is where remora's own types meet
//! NRI's messages, so neither the store nor the lifecycle code sees a protobuf type.

pub mod convert;
