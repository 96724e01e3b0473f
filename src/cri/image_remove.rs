//! RemoveImage.

use slog::{info, Logger};

use crate::cri::error::CriError;
use crate::cri::image_status::find_image;
use crate::cri::Runtime;

/// Removes the image `image` names — every reference of it (all tags and digests), as CRI
/// requires for removal by id, and as containerd's CRI does for removal by tag. Absent is
/// success (idempotent).
pub async fn remove_image(rt: &Runtime, image: &str, log: &Logger) -> Result<(), CriError> {
    let Some(found) = find_image(rt, image) else {
        return Ok(());
    };
    let refs = rt.images.index.refs_of(&found.id);
    for name in &refs {
        rt.images.backend.images.delete(name).await?;
        rt.images.index.remove_ref(name);
    }
    info!(log, "image removed"; "image_id" => &found.id, "references" => refs.len());
    Ok(())
}
