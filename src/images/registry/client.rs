//! The OCI distribution client: resolve a reference to a manifest descriptor, fetch
//! manifests and blobs, across mirrors, with auth, retries and stall detection.
//!
//! Design notes:
//!
//! * **Hosts.** Each call reads the registry's hosts (see [`super::hosts`]) and tries those
//!   with the needed capability in order: `resolve` for tag lookups, `pull` for fetches by
//!   digest. A mirror gets one attempt and any failure moves on to the next host, because
//!   the server behind it is the fallback and retrying a broken mirror only delays the pull.
//!   The last host gets the full retry budget.
//! * **Retries.** Connection failures, timeouts, 5xx, 408 and 429 are retried with
//!   [`Backoff`](remora_host::backoff::Backoff) up to `max_attempts` (a 429's `Retry-After`
//!   seconds are waited at least, at most `retry_max`). A refused redirect (https to plain
//!   http) and every other 4xx fail at once: asking again will not change the answer.
//! * **Timeouts.** `request_timeout` bounds connecting and waiting for response headers,
//!   and reading a manifest. A blob body has no overall deadline — a large layer on a slow
//!   link is fine — but must keep making progress (`BlobStream`'s stall detection).
//! * **Verification.** Manifests are checked against digest and size before they are
//!   returned; a blob stream checks size always and digest when it sees the whole blob.
//!
//! Layout: this file holds the operations (resolve, fetch a manifest, start a blob download);
//! `super::transport` runs one request across the hosts with retries and auth;
//! [`super::blob_stream`] is the verifying, stall-detecting blob body; [`super::error`] is
//! the error type.

use bytes::Bytes;
use reqwest::header::HeaderMap;
use reqwest::{Method, StatusCode};

use super::auth::Credentials;
use super::blob_stream::{BlobStream, StallDetector};
use super::config::RegistryConfig;
use super::error::Ctx;
// Re-exported: `registry::client::RegistryError` is the error's historical path.
pub use super::error::RegistryError;
use super::transport::{Capability, Req, Transport};
use crate::images::manifest::{
    is_image_manifest_media_type, is_index_media_type, Descriptor, Digest, DigestVerifier,
    VerifyError, MANIFEST_MEDIA_TYPES,
};
use crate::images::reference::Reference;

// Largest manifest accepted: a manifest is read into memory (see the constant's docs).
pub use crate::images::manifest::MAX_MANIFEST_SIZE;
const DOCKER_CONTENT_DIGEST: &str = "docker-content-digest";

/// A resolved reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// Media type, digest and size of the manifest or index.
    pub descriptor: Descriptor,
    /// The host that answered (`registry-1.docker.io`, a mirror's `host:port`).
    pub host: String,
}

/// An OCI distribution client. Cheap to share behind an `Arc`; caches tokens and
/// per-TLS-setting HTTP clients.
#[derive(Debug)]
pub struct RegistryClient {
    transport: Transport,
}

impl RegistryClient {
    /// A client with `config`. Fails only if the TLS backend cannot start.
    pub fn new(config: RegistryConfig) -> Result<Self, RegistryError> {
        Ok(Self {
            transport: Transport::new(config)?,
        })
    }

    /// The client's settings (the stall floor the layer deadline follows from).
    pub fn config(&self) -> &RegistryConfig {
        &self.transport.config
    }

    /// Whether `host` (`host[:port]`) has named a token realm that may not be sent the
    /// registry's credentials; see [`super::auth::realm_may_get_secrets`].
    pub fn realm_is_foreign(&self, host: &str) -> bool {
        self.transport.auth.realm_is_foreign(host)
    }

    /// The manifest (or index) `reference` names: its media type, digest and size.
    ///
    /// A tag is resolved with `HEAD` (one cheap request when the registry sends
    /// `Docker-Content-Digest`), falling back to `GET` and hashing the body. A digest
    /// reference is not looked up by tag, but its existence is still checked.
    pub async fn resolve(
        &self,
        reference: &Reference,
        creds: &Credentials,
    ) -> Result<Resolved, RegistryError> {
        let object = reference.object().to_owned();
        let pinned = match &reference.digest {
            Some(d) => Some(
                Digest::parse(d).map_err(|e| RegistryError::InvalidResponse {
                    reference: reference.to_string(),
                    host: reference.registry.clone(),
                    what: format!("manifest {d}"),
                    reason: e.to_string(),
                })?,
            ),
            None => None,
        };
        let capability = if pinned.is_some() {
            Capability::Pull
        } else {
            Capability::Resolve
        };
        let mut req = Req {
            method: Method::HEAD,
            capability,
            path: format!("manifests/{object}"),
            what: format!("manifest {object}"),
            accept: Some(MANIFEST_MEDIA_TYPES.join(", ")),
            range_from: 0,
        };
        let (resp, host) = self.transport.execute(reference, creds, &req).await?;
        let ctx = Ctx {
            reference: reference.to_string(),
            host: &host,
            what: &req.what,
        };
        let header_digest = content_digest(resp.headers(), &ctx)?;
        if let (Some(p), Some(h)) = (&pinned, &header_digest) {
            if p != h {
                return Err(ctx.verify(VerifyError::Digest {
                    expected: p.clone(),
                    actual: h.clone(),
                }));
            }
        }
        let media_type = content_type(resp.headers());
        // The header, not `Response::content_length`, which is the (empty) body's length
        // for a HEAD response.
        let size = resp
            .headers()
            .get(reqwest::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|s| s.trim().parse::<u64>().ok())
            .filter(|n| *n > 0);
        // containerd's resolver refuses an oversized manifest here too.
        if let Some(size) = size.filter(|s| *s > MAX_MANIFEST_SIZE) {
            return Err(ctx.too_large(size, MAX_MANIFEST_SIZE));
        }
        if let (Some(digest), Some(size), Some(mt)) =
            (header_digest.or(pinned.clone()), size, media_type.clone())
        {
            if is_index_media_type(&mt) || is_image_manifest_media_type(&mt) {
                return Ok(Resolved {
                    descriptor: descriptor(mt, digest, size),
                    host,
                });
            }
        }

        // HEAD did not tell enough: fetch the manifest and hash it.
        req.method = Method::GET;
        let (resp, host) = self.transport.execute(reference, creds, &req).await?;
        let ctx = Ctx {
            reference: reference.to_string(),
            host: &host,
            what: &req.what,
        };
        let header_digest = content_digest(resp.headers(), &ctx)?;
        let media_type = content_type(resp.headers());
        // One byte over the limit tells a manifest cut off at the limit from one of its size.
        let body = self
            .transport
            .read_body(resp, MAX_MANIFEST_SIZE + 1, &ctx)
            .await?;
        if body.len() as u64 > MAX_MANIFEST_SIZE {
            return Err(ctx.too_large(body.len() as u64, MAX_MANIFEST_SIZE));
        }
        let actual = Digest::of(&body);
        if let Some(expected) = pinned.or(header_digest) {
            if expected != actual {
                return Err(ctx.verify(VerifyError::Digest { expected, actual }));
            }
        }
        let media_type = media_type
            .filter(|m| is_index_media_type(m) || is_image_manifest_media_type(m))
            .or_else(|| sniff_media_type(&body))
            .ok_or_else(|| ctx.invalid("cannot tell the manifest's media type".into()))?;
        Ok(Resolved {
            descriptor: descriptor(media_type, actual, body.len() as u64),
            host,
        })
    }

    /// The manifest or index `desc` points to, checked against its digest and size.
    pub async fn fetch_manifest(
        &self,
        reference: &Reference,
        desc: &Descriptor,
        creds: &Credentials,
    ) -> Result<Bytes, RegistryError> {
        let what = format!("manifest {}", desc.digest);
        let req = Req {
            method: Method::GET,
            capability: Capability::Pull,
            path: format!("manifests/{}", desc.digest),
            what: what.clone(),
            accept: Some(accept_with(&desc.media_type)),
            range_from: 0,
        };
        if desc.size > MAX_MANIFEST_SIZE {
            return Err(Ctx {
                reference: reference.to_string(),
                host: &reference.registry,
                what: &what,
            }
            .too_large(desc.size, MAX_MANIFEST_SIZE));
        }
        let (resp, host) = self.transport.execute(reference, creds, &req).await?;
        let ctx = Ctx {
            reference: reference.to_string(),
            host: &host,
            what: &what,
        };
        // One byte over the expected size is enough to report a size mismatch.
        let body = self.transport.read_body(resp, desc.size + 1, &ctx).await?;
        let mut v = DigestVerifier::new(desc.digest.clone(), Some(desc.size));
        v.update(&body).map_err(|e| ctx.verify(e))?;
        v.finish().map_err(|e| ctx.verify(e))?;
        Ok(body)
    }

    /// Streams the blob `desc` points to, from byte `offset` (to resume a broken download).
    ///
    /// The stream checks the size always, and the digest when it sees the whole blob
    /// (`offset == 0`, or a registry that ignored the `Range` header and sent it all);
    /// see [`BlobStream::verifies_digest`]. It fails with [`RegistryError::Stalled`] if the
    /// transfer makes too little progress.
    pub async fn fetch_blob(
        &self,
        reference: &Reference,
        desc: &Descriptor,
        offset: u64,
        creds: &Credentials,
    ) -> Result<BlobStream, RegistryError> {
        let what = format!("blob {}", desc.digest);
        if offset > desc.size {
            return Err(RegistryError::InvalidResponse {
                reference: reference.to_string(),
                host: reference.registry.clone(),
                what,
                reason: format!("resume offset {offset} is past the blob size {}", desc.size),
            });
        }
        let req = Req {
            method: Method::GET,
            capability: Capability::Pull,
            path: format!("blobs/{}", desc.digest),
            what: what.clone(),
            accept: None,
            range_from: offset,
        };
        let (resp, host) = self.transport.execute(reference, creds, &req).await?;
        let ctx = Ctx {
            reference: reference.to_string(),
            host: &host,
            what: &what,
        };
        // Where the body starts: a 206 starts at the offset, a 200 at 0.
        let (start, verifier) = if resp.status() == StatusCode::PARTIAL_CONTENT {
            let range = resp
                .headers()
                .get(reqwest::header::CONTENT_RANGE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            if !range.starts_with(&format!("bytes {offset}-")) {
                return Err(ctx.invalid(format!(
                    "asked for bytes {offset}- and got Content-Range {range:?}"
                )));
            }
            (offset, None)
        } else {
            (
                0,
                Some(DigestVerifier::new(desc.digest.clone(), Some(desc.size))),
            )
        };
        Ok(BlobStream {
            inner: Box::pin(resp.bytes_stream()),
            reference: reference.to_string(),
            host,
            digest: desc.digest.clone(),
            size: desc.size,
            offset,
            position: start,
            received: 0,
            verifier,
            stall: StallDetector::new(&self.transport.config),
            done: false,
        })
    }
}

fn descriptor(media_type: String, digest: Digest, size: u64) -> Descriptor {
    Descriptor {
        media_type,
        digest,
        size,
        platform: None,
        annotations: Default::default(),
        urls: Vec::new(),
    }
}

/// The four manifest types, with `preferred` first if it is something else.
fn accept_with(preferred: &str) -> String {
    let mut types: Vec<&str> = vec![preferred];
    types.extend(MANIFEST_MEDIA_TYPES.iter().filter(|t| **t != preferred));
    types.retain(|t| !t.is_empty());
    types.join(", ")
}

fn content_digest(headers: &HeaderMap, ctx: &Ctx<'_>) -> Result<Option<Digest>, RegistryError> {
    match headers.get(DOCKER_CONTENT_DIGEST) {
        None => Ok(None),
        Some(v) => {
            let s = v.to_str().unwrap_or("");
            Digest::parse(s.trim())
                .map(Some)
                .map_err(|e| ctx.invalid(format!("Docker-Content-Digest: {e}")))
        }
    }
}

fn content_type(headers: &HeaderMap) -> Option<String> {
    headers
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.split(';').next())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// The `mediaType` a manifest states about itself, or its shape's type.
fn sniff_media_type(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Sniff {
        media_type: Option<String>,
        manifests: Option<serde_json::Value>,
        config: Option<serde_json::Value>,
    }
    let s: Sniff = serde_json::from_slice(body).ok()?;
    match s.media_type {
        Some(m) if is_index_media_type(&m) || is_image_manifest_media_type(&m) => Some(m),
        Some(_) => None,
        None if s.manifests.is_some() => Some(crate::images::manifest::MEDIA_TYPE_OCI_INDEX.into()),
        None if s.config.is_some() => Some(crate::images::manifest::MEDIA_TYPE_OCI_MANIFEST.into()),
        None => None,
    }
}
