//! The registry client's error, and the context (reference, host, object) every message names.

use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;

use super::auth::AuthError;
use super::chain::error_chain;
use super::hosts::HostsError;
use crate::images::manifest::{Digest, VerifyError};

/// A failed registry operation. Every message names the reference and the host.
#[derive(Debug, Error, Clone)]
pub enum RegistryError {
    /// The hosts directory could not be used.
    #[error("{reference}: registry hosts configuration: {source}")]
    Hosts {
        /// The image reference.
        reference: String,
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
    ClientInit { reason: String },
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
    /// The registry redirected where remora will not follow (from https down to plain http, or
    /// past the redirect limit). Permanent: the same request is redirected the same way.
    #[error("{reference}: {what} from {host}: redirect refused: {cause}")]
    RedirectRefused {
        /// The image reference.
        reference: String,
        /// The host.
        host: String,
        /// `manifest <tag>` or `blob <digest>`.
        what: String,
        /// The error chain (names the refusal).
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
    /// Another status remora cannot act on (400, 416, ...; 408 is retried, see
    /// [`RegistryError::is_retriable`]).
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
    /// A manifest larger than remora reads into memory
    /// ([`MAX_MANIFEST_SIZE`](crate::images::manifest::MAX_MANIFEST_SIZE)).
    #[error(
        "{reference}: {what} from {host} is {size} bytes, over remora's limit of {limit} bytes"
    )]
    TooLarge {
        /// The image reference.
        reference: String,
        /// The host.
        host: String,
        /// `manifest <tag or digest>`.
        what: String,
        /// Its size (from `Content-Length`, or "at least" this when the body was cut off).
        size: u64,
        /// The limit.
        limit: u64,
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
    /// transfers, 5xx, 408, 429, unreachable token servers and stalls (resume from the offset).
    /// Not a refused redirect, nor any other 4xx: the registry would answer the same again.
    pub fn is_retriable(&self) -> bool {
        match self {
            RegistryError::Connect { .. }
            | RegistryError::Timeout { .. }
            | RegistryError::Transfer { .. }
            | RegistryError::Server { .. }
            | RegistryError::TooManyRequests { .. }
            | RegistryError::Stalled { .. } => true,
            // 408 Request Timeout: the server gave up waiting for the request; a new one may go
            // through.
            RegistryError::UnexpectedStatus { status, .. } => *status == 408,
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

/// Context for errors.
pub(super) struct Ctx<'a> {
    pub(super) reference: String,
    pub(super) host: &'a str,
    pub(super) what: &'a str,
}

impl Ctx<'_> {
    pub(super) fn connect(&self, e: &reqwest::Error) -> RegistryError {
        RegistryError::Connect {
            reference: self.reference.clone(),
            host: self.host.to_owned(),
            what: self.what.to_owned(),
            cause: error_chain(e),
        }
    }
    pub(super) fn redirect_refused(&self, e: &reqwest::Error) -> RegistryError {
        RegistryError::RedirectRefused {
            reference: self.reference.clone(),
            host: self.host.to_owned(),
            what: self.what.to_owned(),
            cause: error_chain(e),
        }
    }
    pub(super) fn transfer(&self, e: &reqwest::Error) -> RegistryError {
        RegistryError::Transfer {
            reference: self.reference.clone(),
            host: self.host.to_owned(),
            what: self.what.to_owned(),
            cause: error_chain(e),
        }
    }
    pub(super) fn timeout(&self, after: Duration) -> RegistryError {
        RegistryError::Timeout {
            reference: self.reference.clone(),
            host: self.host.to_owned(),
            what: self.what.to_owned(),
            after,
        }
    }
    pub(super) fn invalid(&self, reason: String) -> RegistryError {
        RegistryError::InvalidResponse {
            reference: self.reference.clone(),
            host: self.host.to_owned(),
            what: self.what.to_owned(),
            reason,
        }
    }
    pub(super) fn too_large(&self, size: u64, limit: u64) -> RegistryError {
        RegistryError::TooLarge {
            reference: self.reference.clone(),
            host: self.host.to_owned(),
            what: self.what.to_owned(),
            size,
            limit,
        }
    }
    pub(super) fn verify(&self, source: VerifyError) -> RegistryError {
        RegistryError::Verify {
            reference: self.reference.clone(),
            host: self.host.to_owned(),
            what: self.what.to_owned(),
            source,
        }
    }
    pub(super) fn denied(&self, reason: String) -> RegistryError {
        RegistryError::AccessDenied {
            reference: self.reference.clone(),
            host: self.host.to_owned(),
            reason,
        }
    }
}
