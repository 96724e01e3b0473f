//! ImageStatus and ListImages.

use crate::cri::Runtime;
use crate::images::reference::{is_image_id, Reference};
use crate::images::store::ImageInfo;

/// Finds a local image by id, id prefix, or any reference form (normalised first:
/// `busybox` finds `docker.io/library/busybox:latest`).
pub fn find_image(rt: &Runtime, image: &str) -> Option<ImageInfo> {
    let index = &rt.images.index;
    if is_image_id(image) {
        return index.get(image);
    }
    match Reference::parse(image) {
        Ok(r) => index.get(&r.to_string()).or_else(|| index.get(image)),
        // Not a reference: maybe a bare id or id prefix.
        Err(_) => index.get(image),
    }
}

/// ImageStatus: the image, or `None` when it is not present (not an error, per CRI).
pub fn image_status(rt: &Runtime, image: &str) -> Option<ImageInfo> {
    find_image(rt, image)
}

/// ListImages, optionally filtered to one image (by any reference form or id).
pub fn list_images(rt: &Runtime, filter: Option<&str>) -> Vec<ImageInfo> {
    match filter.filter(|f| !f.is_empty()) {
        Some(f) => find_image(rt, f).into_iter().collect(),
        None => rt.images.index.list(),
    }
}
