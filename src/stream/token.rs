//! Single-use, expiring tokens for the streaming URLs. API skeleton: bodies are being written.

use std::time::Duration;

/// The requests waiting for their client, by token.
pub struct TokenCache<T> {
    _p: std::marker::PhantomData<T>,
}

/// Why a token could not be handed out.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// Too many requests are waiting for their client.
    #[error("too many streaming requests in flight ({0}); try again later")]
    Full(usize),
}

impl<T> TokenCache<T> {
    /// A cache whose tokens expire after `ttl`, holding at most `max_in_flight` requests.
    pub fn new(ttl: Duration, max_in_flight: usize) -> Self {
        let _ = (ttl, max_in_flight);
        unimplemented!("TokenCache::new")
    }
    /// Keeps `request` and returns its token (URL-safe, unguessable).
    pub fn insert(&self, request: T) -> Result<String, TokenError> {
        let _ = request;
        unimplemented!("TokenCache::insert")
    }
    /// Takes the request of `token`: `None` if unknown, expired or already used.
    pub fn take(&self, token: &str) -> Option<T> {
        let _ = token;
        unimplemented!("TokenCache::take")
    }
}
