//! Registry credentials and the token dance of the distribution spec.
//!
//! A request goes out with whatever authorization is cached for (host, repository scope,
//! credential identity). On `401` the `WWW-Authenticate` challenge decides:
//!
//! * `Bearer realm=…,service=…,scope=…` — a `registry_token` is used as the bearer token
//!   as is; an `identity_token` is exchanged by `POST realm` with
//!   `grant_type=refresh_token` (OAuth2); otherwise `GET realm?service=…&scope=…`, with
//!   Basic auth when a username/password is known, anonymously when not.
//! * `Basic` — the username/password as Basic auth.
//!
//! Tokens are cached until shortly before they expire, so a burst of layer downloads costs
//! one token request. Secrets never appear in `Debug` output or error messages.
//!
//! # What a registry is trusted with
//!
//! * **Lifetimes are bounded.** A token lives at most [`MAX_TOKEN_LIFETIME`] whatever
//!   `expires_in` says (an `expires_in` of `u64::MAX` once overflowed an `Instant` and
//!   panicked the lookup); a Basic header or a registry token is cached
//!   [`CREDENTIAL_CACHE_TTL`] at most, so credentials do not outlive their pulls by much.
//! * **The cache is bounded**: [`MAX_CACHED`] entries; expired ones go first, then those
//!   expiring soonest.
//! * **Token bodies are bounded**: at most [`MAX_TOKEN_BODY`] bytes are read, streamed.
//! * **Secrets go only where they belong.** Basic credentials and a refresh token are sent to
//!   a token realm only if it is [`realm_may_get_secrets`]: the registry's own host, or (for
//!   DNS names) a host under the registry's parent domain (`registry-1.docker.io` →
//!   `auth.docker.io`), and never over plain http when the registry is reached over https.
//!   Any other realm is asked anonymously.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use thiserror::Error;
use tokio::time::Instant;

/// Token lifetime when the token server does not say (distribution spec: 60 s).
const DEFAULT_TOKEN_LIFETIME: Duration = Duration::from_secs(60);
/// The longest a token is cached, whatever the token server says.
pub const MAX_TOKEN_LIFETIME: Duration = Duration::from_secs(24 * 3600);
/// How long a Basic `Authorization` value or a registry token is cached.
pub const CREDENTIAL_CACHE_TTL: Duration = Duration::from_secs(60);
/// The most (host, scope, identity) entries the authorization cache holds.
pub const MAX_CACHED: usize = 1024;
/// The largest token response read (real ones are a few KiB).
pub const MAX_TOKEN_BODY: u64 = 1 << 20;
/// OAuth2 client id sent with refresh-token grants.
const CLIENT_ID: &str = "remora";

/// Credentials for one pull, as CRI's `AuthConfig` carries them (minus protobuf).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    /// User name.
    pub username: String,
    /// Password.
    pub password: String,
    /// base64 of `user:pass`; used when `username` is empty.
    pub auth: String,
    /// OAuth2 refresh token, exchanged for an access token at the token realm.
    pub identity_token: String,
    /// A bearer token sent to the registry as is.
    pub registry_token: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Presence only: these values end up in logs and panics.
        let set = |s: &str| {
            if s.is_empty() {
                "<empty>"
            } else {
                "<redacted>"
            }
        };
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &set(&self.password))
            .field("auth", &set(&self.auth))
            .field("identity_token", &set(&self.identity_token))
            .field("registry_token", &set(&self.registry_token))
            .finish()
    }
}

impl Credentials {
    /// No credentials.
    pub fn anonymous() -> Self {
        Self::default()
    }

    /// True when nothing is set.
    pub fn is_anonymous(&self) -> bool {
        self == &Self::default()
    }

    /// The username and password, from the fields or decoded from `auth`.
    pub fn basic(&self) -> Option<(String, String)> {
        if !self.username.is_empty() {
            return Some((self.username.clone(), self.password.clone()));
        }
        if self.auth.is_empty() {
            return None;
        }
        let decoded = BASE64.decode(self.auth.trim()).ok()?;
        let text = String::from_utf8(decoded).ok()?;
        let (u, p) = text.split_once(':')?;
        Some((u.to_owned(), p.to_owned()))
    }

    /// A string that is equal for equal credentials, for keys that must not mix users
    /// (pull coalescing, the token cache). It is a keyed hash: the key is random per process,
    /// so an identity that reaches a log cannot be used to guess a password offline.
    /// `anonymous` for no credentials.
    pub fn identity(&self) -> String {
        if self.is_anonymous() {
            return "anonymous".to_owned();
        }
        let mut h = Sha256::new();
        h.update(process_key());
        let (user, pass) = self.basic().unwrap_or_default();
        // Length-prefixed, so ("ab","c") and ("a","bc") differ.
        for field in [&user, &pass, &self.identity_token, &self.registry_token] {
            h.update((field.len() as u64).to_le_bytes());
            h.update(field.as_bytes());
        }
        let sum = h.finalize();
        format!("creds-{}", hex::encode(&sum[..16]))
    }
}

/// 16 random bytes per process, from std's randomly keyed hasher (no extra dependency).
fn process_key() -> &'static [u8; 16] {
    static KEY: OnceLock<[u8; 16]> = OnceLock::new();
    KEY.get_or_init(|| {
        let mut key = [0u8; 16];
        for (i, chunk) in key.chunks_mut(8).enumerate() {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_usize(i);
            chunk.copy_from_slice(&h.finish().to_le_bytes());
        }
        key
    })
}

/// A failure to obtain authorization.
#[derive(Debug, Error, Clone)]
pub enum AuthError {
    /// The registry wants Basic auth and no username/password was given.
    #[error("registry requires basic authentication and no credentials were given")]
    NoBasicCredentials,
    /// A `WWW-Authenticate` header remora cannot answer.
    #[error("unsupported authentication challenge {0:?}")]
    UnsupportedChallenge(String),
    /// A 401 without any `WWW-Authenticate` header.
    #[error("registry answered 401 without an authentication challenge")]
    MissingChallenge,
    /// The token server refused the credentials.
    #[error("token server {realm} refused the credentials: HTTP {status}")]
    Refused {
        /// Token realm URL.
        realm: String,
        /// Its status code.
        status: u16,
    },
    /// The token server could not be reached or failed (worth retrying).
    #[error("token server {realm} failed: {reason}")]
    Unavailable {
        /// Token realm URL.
        realm: String,
        /// Transport error or status.
        reason: String,
    },
    /// The token server answered something that is not a token.
    #[error("token server {realm} sent an invalid answer: {reason}")]
    InvalidToken {
        /// Token realm URL.
        realm: String,
        /// What is wrong.
        reason: String,
    },
    /// The token server's answer is larger than [`MAX_TOKEN_BODY`].
    #[error("token server {realm} sent more than {limit} bytes")]
    TokenTooLarge {
        /// Token realm URL.
        realm: String,
        /// The limit.
        limit: u64,
    },
}

impl AuthError {
    /// True when trying again later may help.
    pub fn is_retriable(&self) -> bool {
        matches!(self, AuthError::Unavailable { .. })
    }

    /// True when the registry refuses these credentials (an access-denied error).
    pub fn is_denied(&self) -> bool {
        matches!(
            self,
            AuthError::NoBasicCredentials | AuthError::Refused { .. }
        )
    }
}

/// One parsed `WWW-Authenticate` challenge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    /// `bearer` or `basic`, lowercased.
    pub scheme: String,
    /// Parameters with lowercased names.
    pub params: HashMap<String, String>,
}

impl Challenge {
    /// Parses the first challenge of a `WWW-Authenticate` value
    /// (`Scheme k="v", k2=v2`; quoted values may contain commas and `\"`).
    pub fn parse(header: &str) -> Option<Self> {
        let header = header.trim();
        let (scheme, rest) = header.split_once(' ').unwrap_or((header, ""));
        if scheme.is_empty() {
            return None;
        }
        let mut params = HashMap::new();
        let mut chars = rest.chars().peekable();
        loop {
            while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
                chars.next();
            }
            let name: String = chars.by_ref().take_while(|c| *c != '=').collect();
            if name.trim().is_empty() {
                break;
            }
            let mut value = String::new();
            if chars.peek() == Some(&'"') {
                chars.next();
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => value.extend(chars.next()),
                        '"' => break,
                        c => value.push(c),
                    }
                }
            } else {
                while let Some(c) = chars.peek().copied().filter(|c| *c != ',') {
                    value.push(c);
                    chars.next();
                }
            }
            params.insert(name.trim().to_ascii_lowercase(), value.trim().to_owned());
        }
        Some(Self {
            scheme: scheme.to_ascii_lowercase(),
            params,
        })
    }

    /// The most useful challenge among a response's `WWW-Authenticate` headers: Bearer
    /// first, as it works for anonymous pulls too.
    pub fn pick<'a>(headers: impl IntoIterator<Item = &'a str>) -> Option<Self> {
        let all: Vec<Self> = headers.into_iter().filter_map(Self::parse).collect();
        let bearer = all.iter().position(|c| c.scheme == "bearer");
        let i = bearer.unwrap_or(0);
        all.into_iter().nth(i)
    }
}

#[derive(Debug, Hash, PartialEq, Eq)]
struct TokenKey {
    host: String,
    scope: String,
    identity: String,
}

#[derive(Debug)]
struct Cached {
    authorization: String,
    expires: Instant,
}

#[derive(Deserialize)]
struct TokenResponse {
    #[serde(default)]
    token: String,
    #[serde(default)]
    access_token: String,
    #[serde(default)]
    expires_in: Option<u64>,
}

/// Fetches and caches `Authorization` header values.
#[derive(Debug, Default)]
pub struct Authorizer {
    cache: Mutex<HashMap<TokenKey, Cached>>,
    /// Registry hosts whose challenge named a realm that may not get secrets (at most
    /// [`MAX_CACHED`]; forgotten all at once when full): containerd's Transfer service, which
    /// sends credentials to whatever realm it is told, is given none for them.
    foreign_realms: Mutex<std::collections::HashSet<String>>,
}

impl Authorizer {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// The cached `Authorization` value for (host, scope, identity), if still fresh.
    pub fn cached(&self, host: &str, scope: &str, identity: &str) -> Option<String> {
        let key = TokenKey {
            host: host.to_owned(),
            scope: scope.to_owned(),
            identity: identity.to_owned(),
        };
        let mut cache = self.lock();
        match cache.get(&key) {
            Some(c) if Instant::now() < c.expires => Some(c.authorization.clone()),
            Some(_) => {
                cache.remove(&key);
                None
            }
            None => None,
        }
    }

    /// Answers `challenge` for `host` (fetching a token when needed), caches the result under
    /// (host, scope, identity) and returns the `Authorization` value to send. `https` says
    /// whether the registry host is reached over https (a token realm over plain http then
    /// gets no secrets).
    #[allow(clippy::too_many_arguments)]
    pub async fn authorize(
        &self,
        http: &reqwest::Client,
        host: &str,
        https: bool,
        scope: &str,
        creds: &Credentials,
        challenge: &Challenge,
        timeout: Duration,
    ) -> Result<String, AuthError> {
        let (authorization, lifetime) = match challenge.scheme.as_str() {
            "basic" => {
                let (u, p) = creds.basic().ok_or(AuthError::NoBasicCredentials)?;
                (
                    format!("Basic {}", BASE64.encode(format!("{u}:{p}"))),
                    CREDENTIAL_CACHE_TTL,
                )
            }
            "bearer" if !creds.registry_token.is_empty() => (
                format!("Bearer {}", creds.registry_token),
                CREDENTIAL_CACHE_TTL,
            ),
            "bearer" => {
                let origin = Origin { host, https };
                let realm = challenge.params.get("realm");
                if realm
                    .and_then(|r| url::Url::parse(r).ok())
                    .is_none_or(|r| !realm_may_get_secrets(host, https, &r))
                {
                    let mut foreign = lock_set(&self.foreign_realms);
                    if foreign.len() >= MAX_CACHED {
                        foreign.clear();
                    }
                    foreign.insert(host.to_owned());
                }
                let (token, lifetime) =
                    fetch_token(http, origin, scope, creds, challenge, timeout).await?;
                // Renew a little early so a token does not expire between check and use.
                (format!("Bearer {token}"), lifetime.mul_f64(0.9))
            }
            other => return Err(AuthError::UnsupportedChallenge(other.to_owned())),
        };
        let now = Instant::now();
        // `lifetime` is at most MAX_TOKEN_LIFETIME, so this does not overflow; if it did, the
        // answer is used once and not cached.
        let Some(expires) = now.checked_add(lifetime) else {
            return Ok(authorization);
        };
        let mut cache = self.lock();
        if cache.len() >= MAX_CACHED {
            cache.retain(|_, c| now < c.expires);
        }
        while cache.len() >= MAX_CACHED {
            // Full of live entries: the one expiring soonest goes.
            let Some(soonest) =
                cache
                    .iter()
                    .min_by_key(|(_, c)| c.expires)
                    .map(|(k, _)| TokenKey {
                        host: k.host.clone(),
                        scope: k.scope.clone(),
                        identity: k.identity.clone(),
                    })
            else {
                break;
            };
            cache.remove(&soonest);
        }
        cache.insert(
            TokenKey {
                host: host.to_owned(),
                scope: scope.to_owned(),
                identity: creds.identity(),
            },
            Cached {
                authorization: authorization.clone(),
                expires,
            },
        );
        Ok(authorization)
    }

    /// Whether `host` (`host[:port]`) challenged with a token realm that may not get its
    /// credentials (another host, or plain http for an https registry).
    pub fn realm_is_foreign(&self, host: &str) -> bool {
        lock_set(&self.foreign_realms).contains(host)
    }

    /// Entries in the cache (expired ones included until they are swept).
    #[cfg(test)]
    pub fn cached_len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<TokenKey, Cached>> {
        // A panic while holding this lock cannot leave the map inconsistent (single
        // insert/remove calls), so a poisoned lock is still usable.
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn lock_set(
    set: &Mutex<std::collections::HashSet<String>>,
) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
    // Single insert/contains/clear calls: a poisoned lock still holds a usable set.
    set.lock().unwrap_or_else(|p| p.into_inner())
}

/// The registry host a challenge came from.
#[derive(Clone, Copy)]
struct Origin<'a> {
    /// `host[:port]`.
    host: &'a str,
    /// Reached over https.
    https: bool,
}

/// The registry an `AuthConfig.server_address` names, normalised as image references name
/// registries: scheme and path dropped, lowercased, Docker Hub's aliases as `docker.io`.
fn server_registry(server_address: &str) -> String {
    let s = server_address.trim();
    let s = s
        .strip_prefix("https://")
        .or_else(|| s.strip_prefix("http://"))
        .unwrap_or(s);
    let host = s.split('/').next().unwrap_or("").to_ascii_lowercase();
    match host.as_str() {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => {
            "docker.io".to_owned()
        }
        _ => host,
    }
}

/// Whether credentials sent with `server_address` may be used for `registry` (a reference's
/// registry, `docker.io` for Docker Hub). An empty `server_address` does not restrict them
/// (kubelet leaves it empty for credentials it matched to the image itself).
pub fn server_address_matches(server_address: &str, registry: &str) -> bool {
    if server_address.trim().is_empty() {
        return true;
    }
    let server = server_registry(server_address);
    let registry = registry.to_ascii_lowercase();
    // kubelet's keys may be globs of one label (`*.azurecr.io`).
    match server.strip_prefix("*.") {
        Some(suffix) => registry
            .strip_suffix(suffix)
            .and_then(|label| label.strip_suffix('.'))
            .is_some_and(|label| !label.is_empty() && !label.contains('.')),
        None => server == registry,
    }
}

/// The host name of `host[:port]` (IPv6 in brackets), lowercased, without the port.
fn host_name(host_port: &str) -> Option<String> {
    let url = url::Url::parse(&format!("http://{host_port}/")).ok()?;
    url.host_str().map(str::to_ascii_lowercase)
}

/// Whether a token realm may be sent the registry's secrets (Basic credentials, a refresh
/// token): over https if the registry is, and on the registry's own host or, for DNS names,
/// on a host within the registry's parent domain of at least two labels
/// (`registry-1.docker.io` → `auth.docker.io`, `registry.gitlab.com` → `gitlab.com`). An
/// IP address must match exactly. The port does not matter (a registry's own token server
/// often listens on another port of its host).
pub fn realm_may_get_secrets(registry_host: &str, registry_https: bool, realm: &url::Url) -> bool {
    if registry_https && realm.scheme() != "https" {
        return false;
    }
    if !matches!(realm.scheme(), "https" | "http") {
        return false;
    }
    let (Some(registry), Some(realm_host)) = (host_name(registry_host), realm.host()) else {
        return false;
    };
    let realm_name = match realm_host {
        url::Host::Domain(d) => d.to_ascii_lowercase(),
        // An address: only the registry's own.
        ip => return ip.to_string() == registry,
    };
    if realm_name == registry {
        return true;
    }
    if registry.parse::<std::net::IpAddr>().is_ok() || registry.starts_with('[') {
        return false;
    }
    let Some((_, parent)) = registry.split_once('.') else {
        return false;
    };
    parent.contains('.') && (realm_name == parent || realm_name.ends_with(&format!(".{parent}")))
}

/// A token server's JSON answer: the token (`access_token` preferred) and its lifetime,
/// bounded by [`MAX_TOKEN_LIFETIME`] (absent or 0: the spec's 60 s).
pub fn parse_token_response(body: &[u8]) -> Result<(String, Duration), String> {
    let t: TokenResponse =
        serde_json::from_slice(body).map_err(|e| format!("not a token response: {e}"))?;
    let token = if t.access_token.is_empty() {
        t.token
    } else {
        t.access_token
    };
    if token.is_empty() {
        return Err("no token in the response".into());
    }
    let lifetime = t
        .expires_in
        .filter(|s| *s > 0)
        .map_or(DEFAULT_TOKEN_LIFETIME, |s| {
            Duration::from_secs(s.min(MAX_TOKEN_LIFETIME.as_secs()))
        });
    Ok((token, lifetime))
}

async fn fetch_token(
    http: &reqwest::Client,
    origin: Origin<'_>,
    scope: &str,
    creds: &Credentials,
    challenge: &Challenge,
    timeout: Duration,
) -> Result<(String, Duration), AuthError> {
    let realm = challenge
        .params
        .get("realm")
        .cloned()
        .ok_or_else(|| AuthError::UnsupportedChallenge("Bearer without realm".into()))?;
    let invalid = |reason: String| AuthError::InvalidToken {
        realm: realm.clone(),
        reason,
    };
    let mut url = url::Url::parse(&realm).map_err(|e| invalid(format!("bad realm URL: {e}")))?;
    let service = challenge.params.get("service").cloned().unwrap_or_default();
    // The challenge's scope is what the registry checks; ours is the fallback.
    let scope = challenge
        .params
        .get("scope")
        .cloned()
        .unwrap_or_else(|| scope.to_owned());

    // A realm elsewhere is asked anonymously: it may hand out a token for public content,
    // and it learns nothing it should not.
    let secrets = realm_may_get_secrets(origin.host, origin.https, &url);
    let request = if secrets && !creds.identity_token.is_empty() {
        let body = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("grant_type", "refresh_token")
            .append_pair("refresh_token", &creds.identity_token)
            .append_pair("service", &service)
            .append_pair("scope", &scope)
            .append_pair("client_id", CLIENT_ID)
            .finish();
        http.post(url)
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(body)
    } else {
        {
            let mut q = url.query_pairs_mut();
            if !service.is_empty() {
                q.append_pair("service", &service);
            }
            for s in scope.split(' ').filter(|s| !s.is_empty()) {
                q.append_pair("scope", s);
            }
        }
        let req = http.get(url);
        match creds.basic().filter(|_| secrets) {
            Some((u, p)) => req.basic_auth(u, Some(p)),
            None => req,
        }
    };
    let unavailable = |reason: String| AuthError::Unavailable {
        realm: realm.clone(),
        reason,
    };
    let resp = request
        .timeout(timeout)
        .send()
        .await
        .map_err(|e| unavailable(super::chain::error_chain(&e)))?;
    let status = resp.status();
    if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
        return Err(AuthError::Refused {
            realm,
            status: status.as_u16(),
        });
    }
    if !status.is_success() {
        return Err(unavailable(format!("HTTP {status}")));
    }
    let too_large = || AuthError::TokenTooLarge {
        realm: realm.clone(),
        limit: MAX_TOKEN_BODY,
    };
    if resp.content_length().is_some_and(|n| n > MAX_TOKEN_BODY) {
        return Err(too_large());
    }
    // Streamed against the cap, never buffered whole (the request's timeout bounds the time).
    let mut resp = resp;
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| unavailable(super::chain::error_chain(&e)))?
    {
        if (body.len() + chunk.len()) as u64 > MAX_TOKEN_BODY {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    parse_token_response(&body).map_err(invalid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_redacts_secrets() {
        let c = Credentials {
            username: "alice".into(),
            password: "hunter2".into(),
            identity_token: "idtok".into(),
            ..Default::default()
        };
        let d = format!("{c:?}");
        assert!(d.contains("alice"));
        assert!(!d.contains("hunter2") && !d.contains("idtok"), "{d}");
    }

    #[test]
    fn identity_is_stable_and_distinguishes() {
        let a = Credentials {
            username: "alice".into(),
            password: "pw".into(),
            ..Default::default()
        };
        // The same user/password given as `auth` is the same identity.
        let a2 = Credentials {
            auth: BASE64.encode("alice:pw"),
            ..Default::default()
        };
        let b = Credentials {
            username: "alicep".into(),
            password: "w".into(),
            ..Default::default()
        };
        assert_eq!(a.identity(), a.clone().identity());
        assert_eq!(a.identity(), a2.identity());
        assert_ne!(a.identity(), b.identity());
        assert_eq!(Credentials::anonymous().identity(), "anonymous");
        assert!(!a.identity().contains("pw"));
        assert_eq!(a2.basic(), Some(("alice".into(), "pw".into())));
    }

    #[test]
    fn parses_challenges() {
        let c = Challenge::parse(
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/busybox:pull,push""#,
        )
        .unwrap();
        assert_eq!(c.scheme, "bearer");
        assert_eq!(c.params["realm"], "https://auth.docker.io/token");
        assert_eq!(c.params["service"], "registry.docker.io");
        assert_eq!(c.params["scope"], "repository:library/busybox:pull,push");

        let c = Challenge::parse(r#"Basic realm="a \"b\"", charset=UTF-8"#).unwrap();
        assert_eq!(c.scheme, "basic");
        assert_eq!(c.params["realm"], "a \"b\"");
        assert_eq!(c.params["charset"], "UTF-8");

        let picked = Challenge::pick(["Basic realm=x", "Bearer realm=y"]).unwrap();
        assert_eq!(picked.scheme, "bearer");
    }
}
