//! ImageStatus and ListImages.

use super::store::ImageInfo;
use super::ImageRuntime;

/// Finds a local image by id, id prefix, or any reference form.
pub fn find_image(images: &ImageRuntime, image: &str) -> Option<ImageInfo> {
    images.index.find(image)
}

/// ImageStatus: the image, or `None` when it is not present (not an error, per CRI).
pub fn image_status(images: &ImageRuntime, image: &str) -> Option<ImageInfo> {
    find_image(images, image)
}

/// ImageStatus' verbose `info`: the parsed config, in the OCI field names — what remora
/// keeps of it (no build history, no keys it does not read) — with the id and chain id.
pub fn verbose_info(image: &ImageInfo) -> String {
    serde_json::json!({
        "id": image.id,
        "chainID": image.chain_id,
        "imageSpec": image.config.as_ref(),
    })
    .to_string()
}

/// ListImages, optionally filtered to one image (by any reference form or id).
pub fn list_images(images: &ImageRuntime, filter: Option<&str>) -> Vec<ImageInfo> {
    match filter.filter(|f| !f.is_empty()) {
        Some(f) => find_image(images, f).into_iter().collect(),
        None => images.index.list(),
    }
}
