//! The registry side of image pulling: parsing image references, the manifest and config
//! formats, and an OCI distribution client (mirrors, auth, retries, stall detection).
//!
//! Nothing here knows about CRI or containerd; the pull pipeline composes these pieces.

pub mod manifest;
pub mod reference;
pub mod registry;
