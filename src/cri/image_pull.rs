//! PullImage.

use crate::cri::error::CriError;
use crate::cri::Runtime;
use crate::images::registry::auth::Credentials;

/// Pulls `image` with `creds`; returns the image id (the config digest), which CRI calls the
/// image ref.
pub async fn pull_image(rt: &Runtime, image: &str, creds: Credentials) -> Result<String, CriError> {
    if image.trim().is_empty() {
        return Err(CriError::InvalidArgument {
            what: "image.image",
            reason: "the image reference is empty".into(),
        });
    }
    let info = rt.images.puller.pull(image, creds).await?;
    Ok(info.id)
}
