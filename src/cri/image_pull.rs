//! PullImage.

use crate::cri::error::CriError;
use crate::cri::Runtime;
use crate::images::reference::Reference;
use crate::images::registry::auth::{server_address_matches, Credentials};

/// Pulls `image` with `creds`; returns the image id (the config digest), which CRI calls the
/// image ref. Credentials given for another registry (`AuthConfig.server_address` naming
/// another host) are not used: the pull is anonymous.
pub async fn pull_image(
    rt: &Runtime,
    image: &str,
    creds: Credentials,
    server_address: &str,
) -> Result<String, CriError> {
    if image.trim().is_empty() {
        return Err(CriError::InvalidArgument {
            what: "image.image",
            reason: "the image reference is empty".into(),
        });
    }
    let registry = Reference::parse(image)
        .map(|r| r.registry)
        .unwrap_or_default();
    let creds = if creds.is_anonymous() || server_address_matches(server_address, &registry) {
        creds
    } else {
        slog::warn!(rt.log, "credentials are for another registry; pulling anonymously";
            "image" => image, "server_address" => server_address);
        Credentials::anonymous()
    };
    let info = rt.images.puller.pull(image, creds).await?;
    Ok(info.id)
}
