//! The event monitor: containerd's event stream, dispatched per ID.
//!
//! - [`queue`]: per-ID ordered handling with timeout and backoff (the containerd design
//!   without its head-of-line blocking).
//! - [`monitor`]: the subscription loop (re-subscribe with backoff, resync after each gap) and
//!   the image-index handler for `/images/` events.

pub mod monitor;
pub mod queue;
