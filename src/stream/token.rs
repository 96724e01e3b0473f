//! Single-use, expiring tokens for the streaming URLs.
//!
//! `Exec`, `Attach` and `PortForward` keep their CRI request here and hand out a URL that
//! names it by a random token (128 bits from the kernel's CSPRNG, URL-safe base64): whoever
//! holds the URL may start the session once, within the TTL. Expired entries are dropped on
//! every insert, so the cache never holds more than `max_in_flight` requests (kubelet's
//! streaming server has the same two rules: a TTL and a cap on requests in flight).
//!
//! Time is tokio's, so the tests run on virtual time.

use std::collections::HashMap;
use std::io::Read;
use std::sync::Mutex;
use std::time::Duration;

use base64::Engine;
use tokio::time::Instant;

/// Bytes of randomness in a token.
const TOKEN_BYTES: usize = 16;

/// The requests waiting for their client, by token.
pub struct TokenCache<T> {
    ttl: Duration,
    max_in_flight: usize,
    entries: Mutex<HashMap<String, (Instant, T)>>,
}

/// Why a token could not be handed out.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// Too many requests are waiting for their client.
    #[error("too many streaming requests in flight ({0}); try again later")]
    Full(usize),
    /// The kernel's random source could not be read.
    #[error("cannot read random bytes for a streaming token: {0}")]
    Random(#[source] std::io::Error),
}

impl<T> TokenCache<T> {
    /// A cache whose tokens expire after `ttl`, holding at most `max_in_flight` requests.
    pub fn new(ttl: Duration, max_in_flight: usize) -> Self {
        Self {
            ttl,
            max_in_flight,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// Keeps `request` and returns its token (URL-safe, unguessable).
    pub fn insert(&self, request: T) -> Result<String, TokenError> {
        let token = random_token()?;
        let now = Instant::now();
        let mut entries = self.lock();
        entries.retain(|_, (expires, _)| *expires > now);
        if entries.len() >= self.max_in_flight {
            return Err(TokenError::Full(self.max_in_flight));
        }
        entries.insert(token.clone(), (now + self.ttl, request));
        Ok(token)
    }

    /// Takes the request of `token`: `None` if unknown, expired or already used.
    pub fn take(&self, token: &str) -> Option<T> {
        let (expires, request) = self.lock().remove(token)?;
        (expires > Instant::now()).then_some(request)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Instant, T)>> {
        // Only map operations run under this lock; a panic there leaves the map consistent.
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn random_token() -> Result<String, TokenError> {
    let mut bytes = [0u8; TOKEN_BYTES];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(TokenError::Random)?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_token_is_taken_once() {
        let cache = TokenCache::new(Duration::from_secs(30), 10);
        let t = cache.insert("exec").unwrap();
        assert_eq!(cache.take(&t), Some("exec"));
        assert_eq!(cache.take(&t), None, "a used token is gone");
        assert_eq!(cache.take("made-up"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn tokens_expire_after_the_ttl() {
        let cache = TokenCache::new(Duration::from_secs(30), 10);
        let early = cache.insert(1).unwrap();
        let late = cache.insert(2).unwrap();
        tokio::time::advance(Duration::from_secs(29)).await;
        assert_eq!(cache.take(&early), Some(1), "still valid before the TTL");
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(cache.take(&late), None, "expired after the TTL");
    }

    #[tokio::test(start_paused = true)]
    async fn the_cap_counts_only_live_requests() {
        let cache = TokenCache::new(Duration::from_secs(30), 2);
        cache.insert(1).unwrap();
        let second = cache.insert(2).unwrap();
        assert!(matches!(cache.insert(3), Err(TokenError::Full(2))));
        // A taken request frees its place; so does an expired one.
        cache.take(&second).unwrap();
        cache.insert(4).unwrap();
        tokio::time::advance(Duration::from_secs(31)).await;
        cache.insert(5).unwrap();
        cache.insert(6).unwrap();
        assert!(matches!(cache.insert(7), Err(TokenError::Full(2))));
    }

    #[test]
    fn tokens_are_url_safe_and_distinct() {
        let cache = TokenCache::new(Duration::from_secs(30), 1000);
        let tokens: std::collections::HashSet<String> =
            (0..200).map(|i| cache.insert(i).unwrap()).collect();
        assert_eq!(tokens.len(), 200);
        for t in &tokens {
            assert_eq!(t.len(), 22, "{t}");
            assert!(
                t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
                "{t}"
            );
        }
    }
}
