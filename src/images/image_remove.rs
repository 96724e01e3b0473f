//! RemoveImage.

use slog::{info, Logger};

use super::image_status::find_image;
use super::ImageRuntime;
use crate::backend_error::BackendError;

/// Removes the image `image` names — every reference of it (all tags and digests), as CRI
/// requires for removal by id, and as containerd's CRI does for removal by tag. Absent is
/// success (idempotent).
pub async fn remove_image(
    images: &ImageRuntime,
    image: &str,
    log: &Logger,
) -> Result<(), BackendError> {
    let Some(found) = find_image(images, image) else {
        return Ok(());
    };
    let refs = images.index.refs_of(&found.id);
    for name in &refs {
        images.backend.images.delete(name).await?;
        images.index.remove_ref(name);
    }
    info!(log, "image removed"; "image_id" => &found.id, "references" => refs.len());
    Ok(())
}
