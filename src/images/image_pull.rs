//! PullImage.

use slog::Logger;

use super::pull::PullError;
use super::reference::Reference;
use super::registry::auth::{server_address_matches, Credentials};
use super::ImageRuntime;

/// Pulls `image` with `creds`; returns the image id (the config digest), which CRI calls the
/// image ref. Credentials given for another registry (`server_address` naming another host)
/// are not used: the pull is anonymous, and a warning says so on `log`. The caller has
/// refused an empty `image`.
pub async fn pull_image(
    images: &ImageRuntime,
    image: &str,
    creds: Credentials,
    server_address: &str,
    log: &Logger,
) -> Result<String, PullError> {
    let registry = Reference::parse(image)
        .map(|r| r.registry)
        .unwrap_or_default();
    let creds = if creds.is_anonymous() || server_address_matches(server_address, &registry) {
        creds
    } else {
        slog::warn!(log, "credentials are for another registry; pulling anonymously";
            "image" => image, "server_address" => server_address);
        Credentials::anonymous()
    };
    let info = images.puller.pull(image, creds).await?;
    Ok(info.id)
}
