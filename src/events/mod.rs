//! The event monitor: containerd's event stream, dispatched per ID.
//!
//! - [`queue`]: per-ID ordered handling with timeout and backoff (the containerd design
//!   without its head-of-line blocking).

pub mod queue;
