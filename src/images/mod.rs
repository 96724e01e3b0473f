//! Images: pulling into containerd, the image index, and the CRI image operations.

pub mod backend;
pub mod unpack;
pub mod store;
