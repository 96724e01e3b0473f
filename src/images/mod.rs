//! Images: pulling into containerd, the image index, and the CRI image operations.
//!
//! - [`reference`], [`manifest`] and [`registry`]: the registry side — image references, the
//!   manifest and config formats, and an OCI distribution client (mirrors, auth, retries,
//!   stall detection). Nothing there knows about CRI or containerd.
//! - [`coalesce`] shares one in-flight unit of work (an image pull, a blob download) among all
//!   callers that ask for the same key; [`resolver`] turns references into digests through a
//!   bounded, rate-limited, de-duplicating worker pool with a short cache and per-reference
//!   backoff; [`host_slots`] shares the lookups' and the blob downloads' concurrency out per
//!   registry host, so a stalling registry holds only its own share.
//! - [`backend`] is what image management needs from containerd (narrow traits);
//!   [`unpack`] applies layers into the snapshotter; [`store`] is the in-memory image index;
//!   [`config_stream`] parses an image config as it streams by, never holding it whole;
//!   [`progress`] is the table of pulls in flight that `remora pulls` and the metrics read.
//! - The image service's operations, one file per RPC group as in `lifecycle/`
//!   ([`image_pull`], [`image_remove`], [`image_status`]: ImageStatus and ListImages,
//!   [`image_fs_info`]), over [`ImageRuntime`] and domain types; the CRI layer unpacks the
//!   requests, calls them, and packs their results.

pub mod apply;
pub mod apply_error;
pub mod backend;
pub mod coalesce;
pub mod config_stream;
pub mod host_slots;
pub mod image_fs_info;
pub mod image_pull;
pub mod image_remove;
pub mod image_status;
pub mod manifest;
pub mod progress;
pub mod pull;
pub mod reference;
pub mod registry;
pub mod resolver;
pub mod store;
pub mod unpack;

#[cfg(test)]
mod props;

use std::sync::Arc;

use pull::{Backend, Puller};
use store::ImageIndex;

/// Locks `m`, poisoned or not. The puller's and the progress table's locks guard only map
/// inserts, removals and lookups: a poisoned one still holds a usable map.
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The image side of the runtime: what the image operations reach.
pub struct ImageRuntime {
    /// The in-memory image index.
    pub index: Arc<ImageIndex>,
    /// Pulls images.
    pub puller: Puller,
    /// containerd's content, images, leases, snapshots and diff services.
    pub backend: Backend,
}
