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
//! * **Retries.** Connection failures, timeouts, 5xx and 429 are retried with
//!   [`Backoff`] up to `max_attempts` (a 429's `Retry-After` seconds are waited at least).
//!   401/403/404 fail at once: asking again will not change the answer.
//! * **Timeouts.** `request_timeout` bounds connecting and waiting for response headers,
//!   and reading a manifest. A blob body has no overall deadline — a large layer on a slow
//!   link is fine — but must keep making progress (`BlobStream`'s stall detection).
//! * **Verification.** Manifests are checked against digest and size before they are
//!   returned; a blob stream checks size always and digest when it sees the whole blob.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use reqwest::header::{HeaderMap, HeaderValue, ACCEPT, AUTHORIZATION, RANGE, WWW_AUTHENTICATE};
use reqwest::{Method, StatusCode};
use thiserror::Error;
use tokio::time::{Instant, Sleep};

use super::auth::{AuthError, Authorizer, Challenge, Credentials};
use super::hosts::{load_hosts, HostsError, RegistryHost};
use crate::backoff::Backoff;
use crate::images::manifest::{
    is_image_manifest_media_type, is_index_media_type, Descriptor, Digest, DigestVerifier,
    VerifyError, MANIFEST_MEDIA_TYPES,
};
use crate::images::reference::Reference;

/// Largest manifest accepted (containerd's limit too): a manifest is read into memory.
pub const MAX_MANIFEST_SIZE: u64 = 4 << 20;
/// How much of an error body is read for the message.
const MAX_ERROR_BODY: usize = 4096;
const DOCKER_CONTENT_DIGEST: &str = "docker-content-digest";

/// Settings of a [`RegistryClient`].
#[derive(Debug, Clone)]
pub struct RegistryConfig {
    /// containerd-style hosts directory (`/etc/containerd/certs.d`); `None`: no mirrors.
    pub config_path: Option<PathBuf>,
    /// Granularity of the stall detector's byte counting.
    pub stall_window: Duration,
    /// Fewer bytes than this within `stall_timeout` is a stall. 0 disables detection.
    pub stall_min_bytes: u64,
    /// The period over which `stall_min_bytes` must arrive.
    pub stall_timeout: Duration,
    /// First retry delay.
    pub retry_min: Duration,
    /// Largest retry delay.
    pub retry_max: Duration,
    /// Attempts per request on the last host, including the first (at least 1).
    pub max_attempts: u32,
    /// Bound on connecting plus waiting for headers, and on reading a manifest.
    pub request_timeout: Duration,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        Self {
            config_path: None,
            stall_window: Duration::from_secs(5),
            // 64 KiB per minute: slower than that, a layer will not finish in useful time.
            stall_min_bytes: 64 << 10,
            stall_timeout: Duration::from_secs(60),
            retry_min: Duration::from_millis(500),
            retry_max: Duration::from_secs(30),
            max_attempts: 5,
            request_timeout: Duration::from_secs(30),
        }
    }
}

/// A failed registry operation. Every message names the reference and the host.
#[derive(Debug, Error, Clone)]
pub enum RegistryError {
    /// The hosts directory could not be used.
    #[error("{reference}: registry hosts configuration: {source}")]
    Hosts {
        /// The image reference.
        reference: String,
        /// Why.
        source: Arc<HostsError>,
    },
    /// No configured host may serve the operation.
    #[error("{reference}: no host of registry {registry} has the {capability} capability")]
    NoHosts {
        /// The image reference.
        reference: String,
        /// The registry.
        registry: String,
        /// `pull` or `resolve`.
        capability: &'static str,
    },
    /// The HTTP client could not be set up at all (TLS backend, system roots).
    #[error("cannot set up the registry HTTP client: {reason}")]
    ClientInit {
        /// Why.
        reason: String,
    },
    /// An HTTP client with the host's TLS settings could not be built.
    #[error("{reference}: cannot set up TLS for {host}: {reason}")]
    Tls {
        /// The image reference.
        reference: String,
        /// The host.
        host: String,
        /// Why (unreadable CA file, invalid PEM, ...).
        reason: String,
    },
    /// Connecting or sending failed (refused, reset, DNS, TLS).
    #[error("{reference}: {what} from {host}: connection failed: {cause}")]
    Connect {
        /// The image reference.
        reference: String,
        /// The host.
        host: String,
        /// `manifest <tag>` or `blob <digest>`.
        what: String,
        /// The error chain.
        cause: String,
    },
    /// No response (or no whole manifest) within `request_timeout`.
    #[error("{reference}: {what} from {host}: no response within {after:?}")]
    Timeout {
        /// The image reference.
        reference: String,
        /// The host.
        host: String,
        /// `manifest <tag>` or `blob <digest>`.
        what: String,
        /// The timeout.
        after: Duration,
    },
    /// The connection broke while a body was being read.
    #[error("{reference}: {what} from {host}: transfer failed: {cause}")]
    Transfer {
        /// The image reference.
        reference: String,
        /// The host.
        host: String,
        /// `manifest <tag>` or `blob <digest>`.
        what: String,
        /// The error chain.
        cause: String,
    },
    /// A 5xx answer.
    #[error("{reference}: {what} from {host}: server error HTTP {status}: {message}")]
    Server {
        /// The image reference.
        reference: String,
        /// The host.
        host: String,
        /// `manifest <tag>` or `blob <digest>`.
        what: String,
        /// Status code.
        status: u16,
        /// The registry's error message.
        message: String,
    },
    /// 429 Too Many Requests.
    #[error("{reference}: {what} from {host}: too many requests (HTTP 429){}",
        retry_after.map(|d| format!(", retry after {d:?}")).unwrap_or_default())]
    TooManyRequests {
        /// The image reference.
        reference: String,
        /// The host.
        host: String,
        /// `manifest <tag>` or `blob <digest>`.
        what: String,
        /// The server's `Retry-After`, in seconds form.
        retry_after: Option<Duration>,
    },
    /// 401 (after authenticating) or 403, or credentials the token server refused.
    #[error("pull access denied for {reference}: {reason} (host {host})")]
    AccessDenied {
        /// The image reference.
        reference: String,
        /// The host.
        host: String,
        /// The registry's reason.
        reason: String,
    },
    /// 404.
    #[error("{reference}: not found ({what} at {host})")]
    NotFound {
        /// The image reference.
        reference: String,
        /// The host.
        host: String,
        /// `manifest <tag>` or `blob <digest>`.
        what: String,
    },
    /// Another status remora cannot act on (400, 416, ...).
    #[error("{reference}: {what} from {host}: unexpected HTTP {status}: {message}")]
    UnexpectedStatus {
        /// The image reference.
        reference: String,
        /// The host.
        host: String,
        /// `manifest <tag>` or `blob <digest>`.
        what: String,
        /// Status code.
        status: u16,
        /// The registry's error message.
        message: String,
    },
    /// Authentication failed for a reason other than refused credentials.
    #[error("{reference}: authenticating to {host}: {source}")]
    Auth {
        /// The image reference.
        reference: String,
        /// The host.
        host: String,
        /// Why.
        source: AuthError,
    },
    /// The content does not match its digest or size.
    #[error("{reference}: {what} from {host}: {source}")]
    Verify {
        /// The image reference.
        reference: String,
        /// The host.
        host: String,
        /// `manifest <digest>` or `blob <digest>`.
        what: String,
        /// The mismatch.
        source: VerifyError,
    },
    /// A response that breaks the protocol (bad digest header, wrong Content-Range, ...).
    #[error("{reference}: {what} from {host}: invalid response: {reason}")]
    InvalidResponse {
        /// The image reference.
        reference: String,
        /// The host.
        host: String,
        /// `manifest <tag>` or `blob <digest>`.
        what: String,
        /// What is wrong.
        reason: String,
    },
    /// A blob download that made too little progress.
    #[error(
        "{reference}: download of blob {digest} from {host} stalled: {window_bytes} bytes in \
         the last {window:?} ({rate:.0} B/s), less than {min_bytes}; {received} bytes received in all"
    )]
    Stalled {
        /// The image reference.
        reference: String,
        /// The host.
        host: String,
        /// The blob.
        digest: Digest,
        /// Bytes received by this stream in all.
        received: u64,
        /// Bytes received in the last `window`.
        window_bytes: u64,
        /// The stall timeout.
        window: Duration,
        /// `window_bytes / window` in bytes per second.
        rate: f64,
        /// The configured minimum per `window`.
        min_bytes: u64,
    },
}

impl RegistryError {
    /// True when the same request may succeed later: connection failures, timeouts, broken
    /// transfers, 5xx, 429, unreachable token servers and stalls (resume from the offset).
    pub fn is_retriable(&self) -> bool {
        match self {
            RegistryError::Connect { .. }
            | RegistryError::Timeout { .. }
            | RegistryError::Transfer { .. }
            | RegistryError::Server { .. }
            | RegistryError::TooManyRequests { .. }
            | RegistryError::Stalled { .. } => true,
            RegistryError::Auth { source, .. } => source.is_retriable(),
            _ => false,
        }
    }

    /// The delay a 429 asked for.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            RegistryError::TooManyRequests { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

/// `e` and its causes, `: `-joined; reqwest's own message omits the interesting part.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// A resolved reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// Media type, digest and size of the manifest or index.
    pub descriptor: Descriptor,
    /// The host that answered (`registry-1.docker.io`, a mirror's `host:port`).
    pub host: String,
}

#[derive(Clone, Copy)]
enum Capability {
    Resolve,
    Pull,
}

/// What one request is for: the path below `/v2/<repo>/` and the headers that matter.
struct Req {
    method: Method,
    capability: Capability,
    /// `manifests/<tag>` or `blobs/<digest>`.
    path: String,
    /// For messages: `manifest latest`, `blob sha256:…`.
    what: String,
    accept: Option<String>,
    range_from: u64,
}

/// Context for errors.
struct Ctx<'a> {
    reference: String,
    host: &'a str,
    what: &'a str,
}

impl Ctx<'_> {
    fn connect(&self, e: &reqwest::Error) -> RegistryError {
        RegistryError::Connect {
            reference: self.reference.clone(),
            host: self.host.to_owned(),
            what: self.what.to_owned(),
            cause: error_chain(e),
        }
    }
    fn transfer(&self, e: &reqwest::Error) -> RegistryError {
        RegistryError::Transfer {
            reference: self.reference.clone(),
            host: self.host.to_owned(),
            what: self.what.to_owned(),
            cause: error_chain(e),
        }
    }
    fn timeout(&self, after: Duration) -> RegistryError {
        RegistryError::Timeout {
            reference: self.reference.clone(),
            host: self.host.to_owned(),
            what: self.what.to_owned(),
            after,
        }
    }
    fn invalid(&self, reason: String) -> RegistryError {
        RegistryError::InvalidResponse {
            reference: self.reference.clone(),
            host: self.host.to_owned(),
            what: self.what.to_owned(),
            reason,
        }
    }
    fn verify(&self, source: VerifyError) -> RegistryError {
        RegistryError::Verify {
            reference: self.reference.clone(),
            host: self.host.to_owned(),
            what: self.what.to_owned(),
            source,
        }
    }
    fn denied(&self, reason: String) -> RegistryError {
        RegistryError::AccessDenied {
            reference: self.reference.clone(),
            host: self.host.to_owned(),
            reason,
        }
    }
}

/// TLS settings that need their own HTTP client.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct TlsKey {
    skip_verify: bool,
    ca: Vec<PathBuf>,
}

/// An OCI distribution client. Cheap to share behind an `Arc`; caches tokens and
/// per-TLS-setting HTTP clients.
#[derive(Debug)]
pub struct RegistryClient {
    config: RegistryConfig,
    http: reqwest::Client,
    tls_clients: Mutex<HashMap<TlsKey, reqwest::Client>>,
    auth: Authorizer,
}

/// Builds the common HTTP client settings.
fn http_builder(config: &RegistryConfig) -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .user_agent(concat!("remora/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(config.request_timeout)
}

impl RegistryClient {
    /// A client with `config`. Fails only if the TLS backend cannot start.
    pub fn new(config: RegistryConfig) -> Result<Self, RegistryError> {
        let http = http_builder(&config)
            .build()
            .map_err(|e| RegistryError::ClientInit {
                reason: error_chain(&e),
            })?;
        Ok(Self {
            config,
            http,
            tls_clients: Mutex::new(HashMap::new()),
            auth: Authorizer::new(),
        })
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
        let (resp, host) = self.execute(reference, creds, &req).await?;
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
        let (resp, host) = self.execute(reference, creds, &req).await?;
        let ctx = Ctx {
            reference: reference.to_string(),
            host: &host,
            what: &req.what,
        };
        let header_digest = content_digest(resp.headers(), &ctx)?;
        let media_type = content_type(resp.headers());
        let body = self.read_body(resp, MAX_MANIFEST_SIZE, &ctx).await?;
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
        let (resp, host) = self.execute(reference, creds, &req).await?;
        let ctx = Ctx {
            reference: reference.to_string(),
            host: &host,
            what: &what,
        };
        if desc.size > MAX_MANIFEST_SIZE {
            return Err(ctx.invalid(format!(
                "manifest is {} bytes, more than the {MAX_MANIFEST_SIZE} allowed",
                desc.size
            )));
        }
        // One byte over the expected size is enough to report a size mismatch.
        let body = self.read_body(resp, desc.size + 1, &ctx).await?;
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
        let (resp, host) = self.execute(reference, creds, &req).await?;
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
            stall: StallDetector::new(&self.config),
            done: false,
        })
    }

    /// Runs `req` against the registry's hosts in order; returns the successful response and
    /// the host that gave it.
    async fn execute(
        &self,
        reference: &Reference,
        creds: &Credentials,
        req: &Req,
    ) -> Result<(reqwest::Response, String), RegistryError> {
        let hosts = load_hosts(self.config.config_path.as_deref(), &reference.registry)
            .await
            .map_err(|e| RegistryError::Hosts {
                reference: reference.to_string(),
                source: Arc::new(e),
            })?;
        let hosts: Vec<RegistryHost> = hosts
            .into_iter()
            .filter(|h| match req.capability {
                Capability::Resolve => h.capabilities.resolve,
                Capability::Pull => h.capabilities.pull,
            })
            .collect();
        let mut last_err = None;
        for (i, host) in hosts.iter().enumerate() {
            let last = i + 1 == hosts.len();
            let attempts = if last {
                self.config.max_attempts.max(1)
            } else {
                1
            };
            match self
                .with_retries(reference, creds, host, req, attempts)
                .await
            {
                Ok(resp) => return Ok((resp, host.host.clone())),
                // A mirror's failure of any kind moves on; the server's is final.
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| RegistryError::NoHosts {
            reference: reference.to_string(),
            registry: reference.registry.clone(),
            capability: match req.capability {
                Capability::Resolve => "resolve",
                Capability::Pull => "pull",
            },
        }))
    }

    async fn with_retries(
        &self,
        reference: &Reference,
        creds: &Credentials,
        host: &RegistryHost,
        req: &Req,
        attempts: u32,
    ) -> Result<reqwest::Response, RegistryError> {
        let mut backoff = Backoff::new(self.config.retry_min, self.config.retry_max);
        let mut attempt = 1;
        loop {
            match self.attempt(reference, creds, host, req).await {
                Ok(resp) => return Ok(resp),
                Err(e) if e.is_retriable() && attempt < attempts => {
                    let delay = backoff.next_delay();
                    let delay = e.retry_after().map_or(delay, |ra| ra.max(delay));
                    tokio::time::sleep(delay).await;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// One request, answering an auth challenge once if needed.
    async fn attempt(
        &self,
        reference: &Reference,
        creds: &Credentials,
        host: &RegistryHost,
        req: &Req,
    ) -> Result<reqwest::Response, RegistryError> {
        let ctx = Ctx {
            reference: reference.to_string(),
            host: &host.host,
            what: &req.what,
        };
        let http = self.http_for(host, &ctx).await?;
        let mut url = format!("{}/{}/{}", host.base_url(), reference.repository, req.path);
        if host.is_mirror {
            // containerd's convention: tell a mirror which registry is meant.
            url = format!("{url}?ns={}", reference.registry);
        }
        let scope = format!("repository:{}:pull", reference.repository);
        let identity = creds.identity();

        let cached = self.auth.cached(&host.host, &scope, &identity);
        let mut resp = self.send(&http, host, &url, req, cached, &ctx).await?;
        if resp.status() == StatusCode::UNAUTHORIZED {
            let challenge = Challenge::pick(
                resp.headers()
                    .get_all(WWW_AUTHENTICATE)
                    .iter()
                    .filter_map(|v| v.to_str().ok()),
            );
            let Some(challenge) = challenge else {
                let msg = self.error_message(resp).await;
                return Err(ctx.denied(format!("{}: {msg}", AuthError::MissingChallenge)));
            };
            let authorization = self
                .auth
                .authorize(
                    &http,
                    &host.host,
                    &scope,
                    creds,
                    &challenge,
                    self.config.request_timeout,
                )
                .await
                .map_err(|e| {
                    if e.is_denied() {
                        ctx.denied(e.to_string())
                    } else {
                        RegistryError::Auth {
                            reference: ctx.reference.clone(),
                            host: host.host.clone(),
                            source: e,
                        }
                    }
                })?;
            resp = self
                .send(&http, host, &url, req, Some(authorization), &ctx)
                .await?;
        }
        self.check_status(resp, &ctx).await
    }

    async fn send(
        &self,
        http: &reqwest::Client,
        host: &RegistryHost,
        url: &str,
        req: &Req,
        authorization: Option<String>,
        ctx: &Ctx<'_>,
    ) -> Result<reqwest::Response, RegistryError> {
        let mut headers = HeaderMap::new();
        // Names and values were validated when hosts.toml was read.
        for (k, v) in &host.header {
            if let (Ok(k), Ok(v)) = (
                reqwest::header::HeaderName::from_bytes(k.as_bytes()),
                HeaderValue::from_str(v),
            ) {
                headers.append(k, v);
            }
        }
        if let Some(a) = &req.accept {
            if let Ok(v) = HeaderValue::from_str(a) {
                headers.insert(ACCEPT, v);
            }
        }
        if req.range_from > 0 {
            if let Ok(v) = HeaderValue::from_str(&format!("bytes={}-", req.range_from)) {
                headers.insert(RANGE, v);
            }
        }
        if let Some(a) = authorization {
            let mut v =
                HeaderValue::from_str(&a).map_err(|_| ctx.denied("invalid token".into()))?;
            v.set_sensitive(true);
            headers.insert(AUTHORIZATION, v);
        }
        let fut = http
            .request(req.method.clone(), url)
            .headers(headers)
            .send();
        match tokio::time::timeout(self.config.request_timeout, fut).await {
            Err(_) => Err(ctx.timeout(self.config.request_timeout)),
            Ok(Err(e)) if e.is_timeout() => Err(ctx.timeout(self.config.request_timeout)),
            Ok(Err(e)) => Err(ctx.connect(&e)),
            Ok(Ok(r)) => Ok(r),
        }
    }

    async fn check_status(
        &self,
        resp: reqwest::Response,
        ctx: &Ctx<'_>,
    ) -> Result<reqwest::Response, RegistryError> {
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let reference = ctx.reference.clone();
        let host = ctx.host.to_owned();
        let what = ctx.what.to_owned();
        match status {
            StatusCode::NOT_FOUND => Err(RegistryError::NotFound {
                reference,
                host,
                what,
            }),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                let msg = self.error_message(resp).await;
                Err(ctx.denied(format!("HTTP {}: {msg}", status.as_u16())))
            }
            StatusCode::TOO_MANY_REQUESTS => {
                // Only the seconds form; an HTTP-date falls back to the backoff delay.
                let retry_after = resp
                    .headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|s| s.trim().parse::<u64>().ok())
                    .map(Duration::from_secs);
                Err(RegistryError::TooManyRequests {
                    reference,
                    host,
                    what,
                    retry_after,
                })
            }
            s if s.is_server_error() => {
                let message = self.error_message(resp).await;
                Err(RegistryError::Server {
                    reference,
                    host,
                    what,
                    status: s.as_u16(),
                    message,
                })
            }
            s => {
                let message = self.error_message(resp).await;
                Err(RegistryError::UnexpectedStatus {
                    reference,
                    host,
                    what,
                    status: s.as_u16(),
                    message,
                })
            }
        }
    }

    /// The registry's error message: `errors[].message` of a distribution error body, else
    /// the start of the body, else the status text. Best effort and bounded.
    async fn error_message(&self, mut resp: reqwest::Response) -> String {
        let status = resp.status();
        let mut body = Vec::new();
        let read = async {
            while let Ok(Some(chunk)) = resp.chunk().await {
                body.extend_from_slice(&chunk);
                if body.len() >= MAX_ERROR_BODY {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(self.config.request_timeout, read).await;
        body.truncate(MAX_ERROR_BODY);
        #[derive(serde::Deserialize)]
        struct Errors {
            errors: Vec<ErrorEntry>,
        }
        #[derive(serde::Deserialize)]
        struct ErrorEntry {
            #[serde(default)]
            code: String,
            #[serde(default)]
            message: String,
        }
        if let Ok(e) = serde_json::from_slice::<Errors>(&body) {
            let msgs: Vec<String> = e
                .errors
                .into_iter()
                .map(|e| match (e.code.is_empty(), e.message.is_empty()) {
                    (false, false) => format!("{}: {}", e.code, e.message),
                    (true, _) => e.message,
                    (false, true) => e.code,
                })
                .collect();
            if !msgs.is_empty() {
                return msgs.join("; ");
            }
        }
        let text = String::from_utf8_lossy(&body).trim().to_owned();
        if text.is_empty() {
            status.canonical_reason().unwrap_or("no message").to_owned()
        } else {
            text
        }
    }

    /// Reads a whole (small) body, at most `limit` bytes, within `request_timeout`.
    async fn read_body(
        &self,
        resp: reqwest::Response,
        limit: u64,
        ctx: &Ctx<'_>,
    ) -> Result<Bytes, RegistryError> {
        let mut stream = resp.bytes_stream();
        let mut buf = BytesMut::new();
        let read = async {
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| ctx.transfer(&e))?;
                buf.extend_from_slice(&chunk);
                if buf.len() as u64 >= limit {
                    break;
                }
            }
            Ok(())
        };
        tokio::time::timeout(self.config.request_timeout, read)
            .await
            .map_err(|_| ctx.timeout(self.config.request_timeout))??;
        Ok(buf.freeze())
    }

    /// The HTTP client for `host`'s TLS settings (extra CAs, skip_verify).
    async fn http_for(
        &self,
        host: &RegistryHost,
        ctx: &Ctx<'_>,
    ) -> Result<reqwest::Client, RegistryError> {
        if !host.skip_verify && host.ca.is_empty() {
            return Ok(self.http.clone());
        }
        let key = TlsKey {
            skip_verify: host.skip_verify,
            ca: host.ca.clone(),
        };
        if let Some(c) = self.clients().get(&key) {
            return Ok(c.clone());
        }
        let tls_err = |reason: String| RegistryError::Tls {
            reference: ctx.reference.clone(),
            host: host.host.clone(),
            reason,
        };
        let mut builder = http_builder(&self.config).danger_accept_invalid_certs(host.skip_verify);
        for path in &host.ca {
            let pem = tokio::fs::read(path)
                .await
                .map_err(|e| tls_err(format!("cannot read CA file {}: {e}", path.display())))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| tls_err(format!("invalid CA file {}: {e}", path.display())))?;
            for c in certs {
                builder = builder.add_root_certificate(c);
            }
        }
        let client = builder.build().map_err(|e| tls_err(error_chain(&e)))?;
        self.clients().insert(key, client.clone());
        Ok(client)
    }

    fn clients(&self) -> std::sync::MutexGuard<'_, HashMap<TlsKey, reqwest::Client>> {
        // Single get/insert calls cannot leave the map inconsistent; poison is harmless.
        self.tls_clients.lock().unwrap_or_else(|p| p.into_inner())
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

/// Counts bytes in windows of `stall_window` and fires when the last `stall_timeout` worth
/// of windows together saw fewer than `stall_min_bytes`.
///
/// Counting per window (rather than "time since the last byte") is what stops a trickling
/// connection — one byte every few seconds — from keeping a pull alive forever. The clock
/// only runs while the stream waits for the network: time the consumer spends with an item
/// (writing it to the content store) is not the registry's fault.
struct StallDetector {
    window: Duration,
    windows_needed: usize,
    min_bytes: u64,
    timeout: Duration,
    current: u64,
    history: VecDeque<u64>,
    tick: Pin<Box<Sleep>>,
    yielded_at: Option<Instant>,
}

struct Stall {
    window_bytes: u64,
    rate: f64,
}

impl StallDetector {
    fn new(c: &RegistryConfig) -> Self {
        let window = if c.stall_window.is_zero() {
            c.stall_timeout.max(Duration::from_millis(1))
        } else {
            c.stall_window
        };
        let windows_needed = (c.stall_timeout.as_secs_f64() / window.as_secs_f64())
            .ceil()
            .max(1.0) as usize;
        Self {
            window,
            windows_needed,
            min_bytes: c.stall_min_bytes,
            timeout: window * windows_needed as u32,
            current: 0,
            history: VecDeque::with_capacity(windows_needed + 1),
            tick: Box::pin(tokio::time::sleep(window)),
            yielded_at: None,
        }
    }

    /// Called when the consumer polls again: pause the clock for the time it was away.
    fn resume(&mut self) {
        if let Some(at) = self.yielded_at.take() {
            let away = Instant::now().saturating_duration_since(at);
            let deadline = self.tick.deadline() + away;
            self.tick.as_mut().reset(deadline);
        }
    }

    /// Called when an item goes to the consumer.
    fn yielded(&mut self) {
        self.yielded_at = Some(Instant::now());
    }

    fn poll_stall(&mut self, cx: &mut Context<'_>) -> Option<Stall> {
        if self.min_bytes == 0 {
            return None;
        }
        while self.tick.as_mut().poll(cx).is_ready() {
            self.history.push_back(std::mem::take(&mut self.current));
            if self.history.len() > self.windows_needed {
                self.history.pop_front();
            }
            let deadline = self.tick.deadline() + self.window;
            self.tick.as_mut().reset(deadline);
            if self.history.len() == self.windows_needed {
                let window_bytes: u64 = self.history.iter().sum();
                if window_bytes < self.min_bytes {
                    return Some(Stall {
                        window_bytes,
                        rate: window_bytes as f64 / self.timeout.as_secs_f64(),
                    });
                }
            }
        }
        None
    }
}

/// A blob download: a stream of chunks that checks size (and digest, when it sees the whole
/// blob) and fails with [`RegistryError::Stalled`] when progress is too slow.
///
/// After an error the stream ends. To continue a broken download, call
/// [`RegistryClient::fetch_blob`] again with the number of bytes already received.
pub struct BlobStream {
    inner: Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>,
    reference: String,
    host: String,
    digest: Digest,
    size: u64,
    /// First byte the caller wants.
    offset: u64,
    /// Blob position of the next body byte.
    position: u64,
    /// Bytes this stream has read from the network.
    received: u64,
    verifier: Option<DigestVerifier>,
    stall: StallDetector,
    done: bool,
}

impl std::fmt::Debug for BlobStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlobStream")
            .field("reference", &self.reference)
            .field("host", &self.host)
            .field("digest", &self.digest)
            .field("position", &self.position)
            .finish_non_exhaustive()
    }
}

impl BlobStream {
    /// The host serving the blob.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// True if the stream checks the blob's digest at the end. False when it resumed from
    /// an offset with a partial response: the prefix was never seen here, so the digest
    /// must be checked where the whole blob is (the content store's commit).
    pub fn verifies_digest(&self) -> bool {
        self.verifier.is_some()
    }

    fn ctx(&self) -> Ctx<'_> {
        Ctx {
            reference: self.reference.clone(),
            host: &self.host,
            what: "",
        }
    }

    fn fail(&mut self, e: RegistryError) -> Poll<Option<Result<Bytes, RegistryError>>> {
        self.done = true;
        Poll::Ready(Some(Err(e)))
    }

    fn what(&self) -> String {
        format!("blob {}", self.digest)
    }
}

impl Stream for BlobStream {
    type Item = Result<Bytes, RegistryError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        this.stall.resume();
        loop {
            // The timer is checked on every poll, so a stream that always has a byte ready
            // is judged as well as one that never has.
            if let Some(s) = this.stall.poll_stall(cx) {
                let e = RegistryError::Stalled {
                    reference: this.reference.clone(),
                    host: this.host.clone(),
                    digest: this.digest.clone(),
                    received: this.received,
                    window_bytes: s.window_bytes,
                    window: this.stall.timeout,
                    rate: s.rate,
                    min_bytes: this.stall.min_bytes,
                };
                return this.fail(e);
            }
            match this.inner.as_mut().poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Err(e))) => {
                    let what = this.what();
                    let ctx = this.ctx();
                    let err = Ctx { what: &what, ..ctx }.transfer(&e);
                    return this.fail(err);
                }
                Poll::Ready(Some(Ok(mut chunk))) => {
                    let n = chunk.len() as u64;
                    this.stall.current += n;
                    this.received += n;
                    if let Some(v) = this.verifier.as_mut() {
                        if let Err(e) = v.update(&chunk) {
                            let what = this.what();
                            let err = Ctx {
                                what: &what,
                                ..this.ctx()
                            }
                            .verify(e);
                            return this.fail(err);
                        }
                    }
                    let start = this.position;
                    this.position += n;
                    if this.position > this.size {
                        let what = this.what();
                        let err = Ctx {
                            what: &what,
                            ..this.ctx()
                        }
                        .verify(VerifyError::Size {
                            expected: this.size,
                            actual: this.position,
                        });
                        return this.fail(err);
                    }
                    // A 200 to a Range request: drop what the caller already has.
                    if this.position <= this.offset {
                        continue;
                    }
                    if start < this.offset {
                        chunk = chunk.slice((this.offset - start) as usize..);
                    }
                    this.stall.yielded();
                    return Poll::Ready(Some(Ok(chunk)));
                }
                Poll::Ready(None) => {
                    this.done = true;
                    let what = this.what();
                    if this.position != this.size {
                        let err = Ctx {
                            what: &what,
                            ..this.ctx()
                        }
                        .verify(VerifyError::Size {
                            expected: this.size,
                            actual: this.position,
                        });
                        return Poll::Ready(Some(Err(err)));
                    }
                    if let Some(v) = this.verifier.take() {
                        if let Err(e) = v.finish() {
                            let err = Ctx {
                                what: &what,
                                ..this.ctx()
                            }
                            .verify(e);
                            return Poll::Ready(Some(Err(err)));
                        }
                    }
                    return Poll::Ready(None);
                }
            }
        }
    }
}
