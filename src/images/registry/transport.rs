//! One request against a registry's hosts: mirrors in order (one attempt each), the last host
//! with retries and backoff, an auth challenge answered once, status codes mapped to
//! [`RegistryError`], and an HTTP client per TLS setting.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use reqwest::header::{HeaderMap, HeaderValue, ACCEPT, AUTHORIZATION, RANGE, WWW_AUTHENTICATE};
use reqwest::{Method, StatusCode};

use super::auth::{AuthError, Authorizer, Challenge, Credentials};
use super::chain::error_chain;
use super::config::RegistryConfig;
use super::error::{Ctx, RegistryError};
use super::hosts::{load_hosts, RegistryHost};
use crate::images::reference::Reference;
use remora_host::backoff::Backoff;

/// How much of an error body is read for the message.
const MAX_ERROR_BODY: usize = 4096;

#[derive(Clone, Copy)]
pub(super) enum Capability {
    Resolve,
    Pull,
}

/// What one request is for: the path below `/v2/<repo>/` and the headers that matter.
pub(super) struct Req {
    pub(super) method: Method,
    pub(super) capability: Capability,
    /// `manifests/<tag>` or `blobs/<digest>`.
    pub(super) path: String,
    /// For messages: `manifest latest`, `blob sha256:…`.
    pub(super) what: String,
    pub(super) accept: Option<String>,
    pub(super) range_from: u64,
}

/// TLS settings that need their own HTTP client.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct TlsKey {
    skip_verify: bool,
    ca: Vec<PathBuf>,
}

/// Redirects followed per request.
const MAX_REDIRECTS: usize = 10;

/// Builds the common HTTP client settings.
///
/// Redirects: blob downloads are commonly redirected to a storage host, so a redirect to
/// another host is followed, but reqwest drops `Authorization` (and cookies) when the
/// redirect leaves the origin (scheme, host or port), so credentials and tokens are never
/// sent there; a redirect from https down to plain http is refused.
fn http_builder(config: &RegistryConfig) -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .user_agent(concat!("remora/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(config.request_timeout)
        .redirect(reqwest::redirect::Policy::custom(|attempt| {
            let downgrade = attempt.url().scheme() == "http"
                && attempt.previous().iter().any(|u| u.scheme() == "https");
            if downgrade {
                attempt.error("refused a redirect from https to plain http")
            } else if attempt.previous().len() > MAX_REDIRECTS {
                attempt.error("too many redirects")
            } else {
                attempt.follow()
            }
        }))
}

/// What a `RegistryClient` sends requests with: its settings, the
/// HTTP clients (one per TLS setting) and the token cache.
#[derive(Debug)]
pub(super) struct Transport {
    pub(super) config: RegistryConfig,
    http: reqwest::Client,
    tls_clients: Mutex<HashMap<TlsKey, reqwest::Client>>,
    pub(super) auth: Authorizer,
}

impl Transport {
    /// A transport with `config`. Fails only if the TLS backend cannot start.
    pub(super) fn new(config: RegistryConfig) -> Result<Self, RegistryError> {
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

    /// Runs `req` against the registry's hosts in order; returns the successful response and
    /// the host that gave it.
    pub(super) async fn execute(
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

    pub(super) async fn with_retries(
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
                    // A registry's Retry-After is honoured up to the retry maximum: a huge one
                    // must not hold the lookup (and a resolver worker) for years.
                    let delay = e
                        .retry_after()
                        .map_or(delay, |ra| ra.max(delay))
                        .min(self.config.retry_max.max(delay));
                    tokio::time::sleep(delay).await;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// One request, answering an auth challenge once if needed.
    pub(super) async fn attempt(
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
                    host.scheme == super::hosts::Scheme::Https,
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

    pub(super) async fn send(
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
            // Our redirect policy said no (https → http, too many): not a connection failure,
            // and asking again is redirected the same way.
            Ok(Err(e)) if e.is_redirect() => Err(ctx.redirect_refused(&e)),
            Ok(Err(e)) => Err(ctx.connect(&e)),
            Ok(Ok(r)) => Ok(r),
        }
    }

    pub(super) async fn check_status(
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
    pub(super) async fn error_message(&self, mut resp: reqwest::Response) -> String {
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
    pub(super) async fn read_body(
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
    pub(super) async fn http_for(
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

    pub(super) fn clients(&self) -> std::sync::MutexGuard<'_, HashMap<TlsKey, reqwest::Client>> {
        // Single get/insert calls cannot leave the map inconsistent; poison is harmless.
        self.tls_clients.lock().unwrap_or_else(|p| p.into_inner())
    }
}
