//! ImageStatus and ListImages.

use crate::cri::Runtime;
use crate::images::store::ImageInfo;

/// Finds a local image by id, id prefix, or any reference form.
pub fn find_image(rt: &Runtime, image: &str) -> Option<ImageInfo> {
    rt.images.index.find(image)
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
