//! The registry client against an in-process fake registry on 127.0.0.1.
//!
//! Real sockets need real time, so the delays here are small; each test is well under a
//! second except the `Retry-After: 1` one.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use futures_util::StreamExt;
use hyper::Response;

use super::auth::Credentials;
use super::auth::{parse_token_response, realm_may_get_secrets, Challenge, MAX_TOKEN_LIFETIME};
use super::blob_stream::BlobStream;
use super::fake::*;
use super::*;
use crate::images::manifest::{Descriptor, Digest, VerifyError, MEDIA_TYPE_OCI_MANIFEST};
use crate::images::reference::Reference;

fn client(dir: &Path) -> RegistryClient {
    RegistryClient::new(config(dir)).unwrap()
}

fn reference(s: &str) -> Reference {
    Reference::parse(&format!("{REGISTRY}/{s}")).unwrap()
}

fn anon() -> Credentials {
    Credentials::anonymous()
}

fn manifest_body() -> Bytes {
    Bytes::from_static(
        br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef","size":2},"layers":[]}"#,
    )
}

fn desc(data: &[u8], media_type: &str) -> Descriptor {
    Descriptor {
        media_type: media_type.into(),
        digest: Digest::of(data),
        size: data.len() as u64,
        platform: None,
        annotations: Default::default(),
        urls: vec![],
    }
}

/// Answers the first `failures` requests with `fail()`, then as [`manifest_handler`] with
/// [`manifest_body`].
fn failing_first(
    failures: usize,
    fail: impl Fn() -> Response<Body> + Send + Sync + 'static,
) -> impl Fn(&Hit) -> Response<Body> + Send + Sync + 'static {
    let ok = manifest_handler(manifest_body());
    let n = Arc::new(Mutex::new(0));
    move |h: &Hit| {
        let mut n = n.lock().unwrap();
        *n += 1;
        if *n <= failures {
            fail()
        } else {
            ok(h)
        }
    }
}

/// Answers manifest HEAD/GET with `body`, sending the digest header.
fn manifest_handler(body: Bytes) -> impl Fn(&Hit) -> Response<Body> + Send + Sync + 'static {
    let digest = Digest::of(&body).to_string();
    move |h: &Hit| {
        if h.path.contains("/manifests/") {
            with_headers(
                200,
                &[
                    ("content-type", MEDIA_TYPE_OCI_MANIFEST),
                    ("docker-content-digest", &digest),
                ],
                body.clone(),
            )
        } else {
            reply(404, "")
        }
    }
}

#[tokio::test]
async fn resolve_tag_with_one_head() {
    let body = manifest_body();
    let fake = Fake::start(manifest_handler(body.clone())).await;
    let dir = hosts_dir(&fake.host(), &[]);
    let r = client(dir.path())
        .resolve(&reference("library/app:1"), &anon())
        .await
        .unwrap();
    assert_eq!(r.descriptor.digest, Digest::of(&body));
    assert_eq!(r.descriptor.size, body.len() as u64);
    assert_eq!(r.descriptor.media_type, MEDIA_TYPE_OCI_MANIFEST);
    assert_eq!(r.host, fake.host());
    assert_eq!(fake.log(), vec!["HEAD /v2/library/app/manifests/1"]);
    let accept = fake.hits()[0].header("accept").to_owned();
    for mt in crate::images::manifest::MANIFEST_MEDIA_TYPES {
        assert!(accept.contains(mt), "{accept}");
    }
}

#[tokio::test]
async fn resolve_falls_back_to_get_without_digest_header() {
    let body = manifest_body();
    let b = body.clone();
    let fake = Fake::start(move |_h: &Hit| {
        with_headers(200, &[("content-type", MEDIA_TYPE_OCI_MANIFEST)], b.clone())
    })
    .await;
    let dir = hosts_dir(&fake.host(), &[]);
    let r = client(dir.path())
        .resolve(&reference("library/app:1"), &anon())
        .await
        .unwrap();
    assert_eq!(r.descriptor.digest, Digest::of(&body));
    assert_eq!(r.descriptor.size, body.len() as u64);
    assert_eq!(
        fake.log(),
        vec![
            "HEAD /v2/library/app/manifests/1",
            "GET /v2/library/app/manifests/1"
        ]
    );
}

#[tokio::test]
async fn resolve_by_digest_checks_existence_only() {
    let body = manifest_body();
    let b = body.clone();
    let fake = Fake::start(move |_h: &Hit| {
        with_headers(200, &[("content-type", MEDIA_TYPE_OCI_MANIFEST)], b.clone())
    })
    .await;
    let dir = hosts_dir(&fake.host(), &[]);
    let d = Digest::of(&body);
    let r = client(dir.path())
        .resolve(&reference(&format!("library/app:1@{d}")), &anon())
        .await
        .unwrap();
    assert_eq!(r.descriptor.digest, d);
    assert_eq!(r.descriptor.size, body.len() as u64);
    assert_eq!(
        fake.log(),
        vec![format!("HEAD /v2/library/app/manifests/{d}")]
    );
}

#[tokio::test]
async fn fetch_manifest_detects_digest_and_size_mismatch() {
    let body = manifest_body();
    let fake = Fake::start(manifest_handler(body.clone())).await;
    let dir = hosts_dir(&fake.host(), &[]);
    let c = client(dir.path());
    let r = reference("library/app:1");

    let good = desc(&body, MEDIA_TYPE_OCI_MANIFEST);
    assert_eq!(c.fetch_manifest(&r, &good, &anon()).await.unwrap(), body);

    // Same size, other content.
    let mut other = body.to_vec();
    other[0] = b' ';
    let wrong = desc(&other, MEDIA_TYPE_OCI_MANIFEST);
    let err = c.fetch_manifest(&r, &wrong, &anon()).await.unwrap_err();
    assert!(
        matches!(
            err,
            RegistryError::Verify {
                source: crate::images::manifest::VerifyError::Digest { .. },
                ..
            }
        ),
        "{err}"
    );
    assert!(!err.is_retriable());
    let msg = err.to_string();
    assert!(
        msg.contains("reg.test/library/app:1") && msg.contains(&fake.host()),
        "{msg}"
    );

    let mut short = good.clone();
    short.size -= 1;
    let err = c.fetch_manifest(&r, &short, &anon()).await.unwrap_err();
    assert!(
        matches!(
            err,
            RegistryError::Verify {
                source: crate::images::manifest::VerifyError::Size { .. },
                ..
            }
        ),
        "{err}"
    );
}

async fn collect(mut s: BlobStream) -> Result<Vec<u8>, RegistryError> {
    let mut out = Vec::new();
    while let Some(chunk) = s.next().await {
        out.extend_from_slice(&chunk?);
    }
    Ok(out)
}

fn blob_data() -> Bytes {
    Bytes::from((0..10_000u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>())
}

#[tokio::test]
async fn blob_fetch_verifies_digest() {
    let data = blob_data();
    let d = data.clone();
    let fake = Fake::start(move |h: &Hit| {
        if h.path.ends_with("corrupt") {
            // Not reached: the digest decides the path.
            reply(404, "")
        } else {
            reply(200, d.clone())
        }
    })
    .await;
    let dir = hosts_dir(&fake.host(), &[]);
    let c = client(dir.path());
    let r = reference("library/app:1");
    let good = desc(&data, "application/vnd.oci.image.layer.v1.tar+gzip");
    let s = c.fetch_blob(&r, &good, 0, &anon()).await.unwrap();
    assert!(s.verifies_digest());
    assert_eq!(collect(s).await.unwrap(), data.to_vec());
    assert_eq!(
        fake.log()[0],
        format!("GET /v2/library/app/blobs/{}", good.digest)
    );

    // The server sends content that is not what the descriptor promised.
    let mut other = data.to_vec();
    other[5000] ^= 0xff;
    let wrong = desc(&other, "application/vnd.oci.image.layer.v1.tar+gzip");
    let s = c.fetch_blob(&r, &wrong, 0, &anon()).await.unwrap();
    let err = collect(s).await.unwrap_err();
    assert!(matches!(err, RegistryError::Verify { .. }), "{err}");

    // Left to the content store: the bytes pass as they are, the size is still checked.
    let s = c.fetch_blob(&r, &wrong, 0, &anon()).await.unwrap();
    let s = s.digest_checked_by_store();
    assert!(!s.verifies_digest());
    assert_eq!(collect(s).await.unwrap(), data.to_vec());
    let mut short = wrong.clone();
    short.size -= 1;
    let s = c.fetch_blob(&r, &short, 0, &anon()).await.unwrap();
    let err = collect(s.digest_checked_by_store()).await.unwrap_err();
    assert!(
        matches!(
            err,
            RegistryError::Verify {
                source: VerifyError::Size { .. },
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn blob_range_resume() {
    let data = blob_data();
    let d = data.clone();
    let fake = Fake::start(move |h: &Hit| {
        let range = h.header("range");
        match range
            .strip_prefix("bytes=")
            .and_then(|r| r.strip_suffix('-'))
        {
            Some(from) => {
                let from: usize = from.parse().unwrap();
                let cr = format!("bytes {from}-{}/{}", d.len() - 1, d.len());
                with_headers(206, &[("content-range", &cr)], d.slice(from..))
            }
            None => reply(200, d.clone()),
        }
    })
    .await;
    let dir = hosts_dir(&fake.host(), &[]);
    let c = client(dir.path());
    let r = reference("library/app:1");
    let dsc = desc(&data, "application/vnd.oci.image.layer.v1.tar");
    let s = c.fetch_blob(&r, &dsc, 4321, &anon()).await.unwrap();
    assert!(!s.verifies_digest(), "a partial body cannot be hashed here");
    assert_eq!(collect(s).await.unwrap(), data[4321..].to_vec());
    assert_eq!(fake.hits()[0].header("range"), "bytes=4321-");

    // A registry that ignores Range: the prefix is dropped and the digest still checked.
    let d2 = data.clone();
    let plain = Fake::start(move |_h: &Hit| reply(200, d2.clone())).await;
    let dir = hosts_dir(&plain.host(), &[]);
    let s = client(dir.path())
        .fetch_blob(&r, &dsc, 4321, &anon())
        .await
        .unwrap();
    assert!(s.verifies_digest());
    assert_eq!(collect(s).await.unwrap(), data[4321..].to_vec());
}

#[tokio::test]
async fn not_found_fails_at_once() {
    let fake = Fake::start(|_h: &Hit| {
        reply(
            404,
            r#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}"#,
        )
    })
    .await;
    let dir = hosts_dir(&fake.host(), &[]);
    let err = client(dir.path())
        .resolve(&reference("library/nope:1"), &anon())
        .await
        .unwrap_err();
    assert!(matches!(err, RegistryError::NotFound { .. }), "{err}");
    assert!(!err.is_retriable());
    let msg = err.to_string();
    assert!(
        msg.starts_with("reg.test/library/nope:1: not found"),
        "{msg}"
    );
    assert!(msg.contains(&fake.host()), "{msg}");
    assert_eq!(fake.hits().len(), 1, "404 is not retried");
}

#[tokio::test]
async fn forbidden_is_access_denied_without_retry() {
    let fake = Fake::start(|_h: &Hit| {
        reply(
            403,
            r#"{"errors":[{"code":"DENIED","message":"requested access to the resource is denied"}]}"#,
        )
    })
    .await;
    let dir = hosts_dir(&fake.host(), &[]);
    let err = client(dir.path())
        .resolve(&reference("library/app:1"), &anon())
        .await
        .unwrap_err();
    assert!(matches!(err, RegistryError::AccessDenied { .. }), "{err}");
    let msg = err.to_string();
    // A HEAD answer has no body, so no registry message.
    assert!(
        msg.starts_with("pull access denied for reg.test/library/app:1: HTTP 403"),
        "{msg}"
    );
    assert!(msg.contains(&fake.host()), "{msg}");
    assert_eq!(fake.hits().len(), 1);

    // A GET carries the registry's reason.
    let body = manifest_body();
    let err = client(dir.path())
        .fetch_manifest(
            &reference("library/app:1"),
            &desc(&body, MEDIA_TYPE_OCI_MANIFEST),
            &anon(),
        )
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("HTTP 403: DENIED: requested access to the resource is denied"),
        "{msg}"
    );
    assert_eq!(fake.hits().len(), 2);
}

/// A registry that wants `Bearer <token>`, with its token endpoint at `/token`, which issues
/// `anon-token` without credentials and `alice-token` for alice:pw.
async fn token_registry(body: Bytes) -> Fake {
    let digest = Digest::of(&body).to_string();
    let realm: Arc<Mutex<String>> = Arc::new(Mutex::new(String::new()));
    let realm2 = realm.clone();
    let fake = Fake::start(move |h: &Hit| {
        if h.path == "/token" {
            let auth = h.header("authorization");
            let alice = format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode("alice:pw")
            );
            if h.method == "POST" {
                // OAuth2 refresh-token grant.
                let form = String::from_utf8_lossy(&h.body);
                return if form.contains("grant_type=refresh_token")
                    && form.contains("refresh_token=idtok")
                    && form.contains("scope=repository%3Aprivate%2Fapp%3Apull")
                {
                    reply(200, r#"{"access_token":"alice-token","expires_in":60}"#)
                } else {
                    reply(401, "bad grant")
                };
            }
            return if auth.is_empty() {
                reply(200, r#"{"token":"anon-token","expires_in":300}"#)
            } else if auth == alice {
                reply(200, r#"{"access_token":"alice-token"}"#)
            } else {
                reply(401, "bad credentials")
            };
        }
        let auth = h.header("authorization");
        let want_alice = h.path.contains("/private/");
        let ok = if want_alice {
            auth == "Bearer alice-token"
        } else {
            auth == "Bearer anon-token"
        };
        if ok {
            with_headers(
                200,
                &[
                    ("content-type", MEDIA_TYPE_OCI_MANIFEST),
                    ("docker-content-digest", &digest),
                ],
                body.clone(),
            )
        } else {
            let scope = if want_alice {
                "repository:private/app:pull"
            } else {
                "repository:library/app:pull"
            };
            let challenge = format!(
                r#"Bearer realm="{}/token",service="fake",scope="{scope}""#,
                realm2.lock().unwrap()
            );
            with_headers(401, &[("www-authenticate", &challenge)], "")
        }
    })
    .await;
    *realm.lock().unwrap() = format!("http://{}", fake.host());
    fake
}

#[tokio::test]
async fn bearer_token_anonymous_and_cached() {
    let fake = token_registry(manifest_body()).await;
    let dir = hosts_dir(&fake.host(), &[]);
    let c = client(dir.path());
    let r = reference("library/app:1");
    c.resolve(&r, &anon()).await.unwrap();
    c.resolve(&r, &anon()).await.unwrap();
    assert_eq!(
        fake.log(),
        vec![
            "HEAD /v2/library/app/manifests/1",
            "GET /token",
            "HEAD /v2/library/app/manifests/1",
            "HEAD /v2/library/app/manifests/1",
        ],
        "the second resolve uses the cached token"
    );
    let token_hit = &fake.hits()[1];
    assert_eq!(
        token_hit.query,
        "service=fake&scope=repository%3Alibrary%2Fapp%3Apull"
    );
    assert_eq!(token_hit.header("authorization"), "");
}

#[tokio::test]
async fn bearer_token_with_basic_credentials() {
    let fake = token_registry(manifest_body()).await;
    let dir = hosts_dir(&fake.host(), &[]);
    let c = client(dir.path());
    let r = reference("private/app:1");
    let alice = Credentials {
        username: "alice".into(),
        password: "pw".into(),
        ..Default::default()
    };
    c.resolve(&r, &alice).await.unwrap();

    // Wrong password: the token server refuses, which is access denied, not retried.
    let mallory = Credentials {
        username: "alice".into(),
        password: "guess".into(),
        ..Default::default()
    };
    let before = fake.hits().len();
    let err = c.resolve(&r, &mallory).await.unwrap_err();
    assert!(matches!(err, RegistryError::AccessDenied { .. }), "{err}");
    assert!(
        err.to_string()
            .starts_with("pull access denied for reg.test/private/app:1"),
        "{err}"
    );
    assert!(!err.to_string().contains("guess"));
    assert_eq!(fake.hits().len() - before, 2, "one 401, one token request");
}

#[tokio::test]
async fn basic_challenge_and_registry_token() {
    let body = manifest_body();
    let digest = Digest::of(&body).to_string();
    let fake = Fake::start(move |h: &Hit| {
        let auth = h.header("authorization");
        let basic = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("bob:pw")
        );
        if auth == basic || auth == "Bearer reg-tok" {
            with_headers(
                200,
                &[
                    ("content-type", MEDIA_TYPE_OCI_MANIFEST),
                    ("docker-content-digest", &digest),
                ],
                body.clone(),
            )
        } else if h.path.contains("/bearer/") {
            with_headers(
                401,
                &[(
                    "www-authenticate",
                    "Bearer realm=\"http://unused.invalid/t\"",
                )],
                "",
            )
        } else {
            with_headers(401, &[("www-authenticate", "Basic realm=\"fake\"")], "")
        }
    })
    .await;
    let dir = hosts_dir(&fake.host(), &[]);
    let c = client(dir.path());
    let bob = Credentials {
        auth: base64::engine::general_purpose::STANDARD.encode("bob:pw"),
        ..Default::default()
    };
    c.resolve(&reference("basic/app:1"), &bob).await.unwrap();
    let err = c
        .resolve(&reference("basic/app:1"), &anon())
        .await
        .unwrap_err();
    assert!(matches!(err, RegistryError::AccessDenied { .. }), "{err}");

    // A registry token is sent as the bearer token without asking the realm.
    let tok = Credentials {
        registry_token: "reg-tok".into(),
        ..Default::default()
    };
    c.resolve(&reference("bearer/app:1"), &tok).await.unwrap();
}

#[tokio::test]
async fn server_errors_are_retried() {
    let fake = Fake::start(failing_first(2, || reply(503, "busy"))).await;
    let dir = hosts_dir(&fake.host(), &[]);
    client(dir.path())
        .resolve(&reference("library/app:1"), &anon())
        .await
        .unwrap();
    assert_eq!(fake.hits().len(), 3, "two failures, two retries");

    // Always 503: gives up after max_attempts with a retriable error naming the host.
    let always = Fake::start(|_h: &Hit| reply(503, "busy")).await;
    let dir = hosts_dir(&always.host(), &[]);
    let err = client(dir.path())
        .resolve(&reference("library/app:1"), &anon())
        .await
        .unwrap_err();
    assert!(
        matches!(err, RegistryError::Server { status: 503, .. }),
        "{err}"
    );
    assert!(err.is_retriable());
    assert!(err.to_string().contains(&always.host()), "{err}");
    assert_eq!(always.hits().len(), 4);
}

#[tokio::test]
async fn too_many_requests_honours_retry_after() {
    let fake = Fake::start(failing_first(1, || {
        with_headers(429, &[("retry-after", "1")], "slow down")
    }))
    .await;
    let dir = hosts_dir(&fake.host(), &[]);
    let start = Instant::now();
    // Retry-After is honoured up to retry_max (see huge_retry_after_is_capped_...).
    RegistryClient::new(RegistryConfig {
        retry_max: Duration::from_secs(2),
        ..config(dir.path())
    })
    .unwrap()
    .resolve(&reference("library/app:1"), &anon())
    .await
    .unwrap();
    assert!(
        start.elapsed() >= Duration::from_secs(1),
        "waited {:?}",
        start.elapsed()
    );
    assert_eq!(fake.hits().len(), 2);
}

#[tokio::test]
async fn trickling_blob_is_aborted_as_stalled() {
    let data = Bytes::from(vec![7u8; 100]);
    let d = data.clone();
    // 1 byte per 100 ms: 5 bytes per 500 ms, far below the 100 required.
    let fake = Fake::start(move |_h: &Hit| trickle(d.clone(), 1, Duration::from_millis(100))).await;
    let dir = hosts_dir(&fake.host(), &[]);
    let dsc = desc(&data, "application/vnd.oci.image.layer.v1.tar");
    let start = Instant::now();
    let s = client(dir.path())
        .fetch_blob(&reference("library/app:1"), &dsc, 0, &anon())
        .await
        .unwrap();
    let err = collect(s).await.unwrap_err();
    let RegistryError::Stalled {
        received,
        window_bytes,
        ..
    } = &err
    else {
        panic!("want Stalled, got {err}");
    };
    assert!(*received < 20 && *window_bytes < 100, "{err}");
    assert!(err.is_retriable());
    let msg = err.to_string();
    assert!(
        msg.contains(dsc.digest.as_str()) && msg.contains("stalled"),
        "{msg}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn steady_blob_is_not_stalled() {
    // 1000 bytes per 100 ms for 1 s: slower in total than the stall timeout, but fast.
    let data = Bytes::from((0..10_000u32).map(|i| i as u8).collect::<Vec<u8>>());
    let d = data.clone();
    let fake =
        Fake::start(move |_h: &Hit| trickle(d.clone(), 1000, Duration::from_millis(100))).await;
    let dir = hosts_dir(&fake.host(), &[]);
    let dsc = desc(&data, "application/vnd.oci.image.layer.v1.tar");
    let s = client(dir.path())
        .fetch_blob(&reference("library/app:1"), &dsc, 0, &anon())
        .await
        .unwrap();
    assert_eq!(collect(s).await.unwrap(), data.to_vec());
}

#[tokio::test]
async fn mirror_falls_back_to_server() {
    let body = manifest_body();
    let server = Fake::start(manifest_handler(body.clone())).await;

    // A mirror that does not have the image.
    let mirror = Fake::start(|_h: &Hit| reply(404, "")).await;
    let dir = hosts_dir(&server.host(), &[&mirror.host()]);
    let c = client(dir.path());
    let r = c
        .resolve(&reference("library/app:1"), &anon())
        .await
        .unwrap();
    assert_eq!(r.host, server.host());
    assert_eq!(mirror.hits().len(), 1, "a mirror gets one try");
    assert_eq!(mirror.hits()[0].query, "ns=reg.test");
    let m = c
        .fetch_manifest(&reference("library/app:1"), &r.descriptor, &anon())
        .await
        .unwrap();
    assert_eq!(m, body);

    // A mirror that is not there at all.
    let gone = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let dir = hosts_dir(&server.host(), &[&gone]);
    let r = client(dir.path())
        .resolve(&reference("library/app:1"), &anon())
        .await
        .unwrap();
    assert_eq!(r.host, server.host());
}

#[tokio::test]
async fn mirror_is_used_first() {
    let body = manifest_body();
    let server = Fake::start(|_h: &Hit| reply(500, "")).await;
    let mirror = Fake::start(manifest_handler(body)).await;
    let dir = hosts_dir(&server.host(), &[&mirror.host()]);
    let r = client(dir.path())
        .resolve(&reference("library/app:1"), &anon())
        .await
        .unwrap();
    assert_eq!(r.host, mirror.host());
    assert!(server.hits().is_empty());
}

#[tokio::test]
async fn identity_token_is_exchanged_by_post() {
    let fake = token_registry(manifest_body()).await;
    let dir = hosts_dir(&fake.host(), &[]);
    let creds = Credentials {
        identity_token: "idtok".into(),
        ..Default::default()
    };
    client(dir.path())
        .resolve(&reference("private/app:1"), &creds)
        .await
        .unwrap();
    let token_hit = &fake.hits()[1];
    assert_eq!(
        (token_hit.method.as_str(), token_hit.path.as_str()),
        ("POST", "/token")
    );
    assert_eq!(
        token_hit.header("content-type"),
        "application/x-www-form-urlencoded"
    );
}

#[tokio::test]
async fn slow_consumer_is_not_a_stall() {
    // The network is fast, but the consumer holds each chunk for longer than the stall
    // timeout. Counted against the registry, those empty windows would be a stall.
    let data = Bytes::from((0..3_000u32).map(|i| i as u8).collect::<Vec<u8>>());
    let d = data.clone();
    let fake =
        Fake::start(move |_h: &Hit| trickle(d.clone(), 1000, Duration::from_millis(10))).await;
    let dir = hosts_dir(&fake.host(), &[]);
    let dsc = desc(&data, "application/vnd.oci.image.layer.v1.tar");
    let mut s = client(dir.path())
        .fetch_blob(&reference("library/app:1"), &dsc, 0, &anon())
        .await
        .unwrap();
    let mut got = Vec::new();
    while let Some(chunk) = s.next().await {
        got.extend_from_slice(&chunk.unwrap());
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
    assert_eq!(got, data.to_vec());
}

// ---- Hostile registries (issue 26) ----

/// A registry on 127.0.0.1 that wants `Bearer x` and names `realm` in its challenge.
async fn bearer_registry(realm: String) -> Fake {
    let body = manifest_body();
    let ok = manifest_handler(body);
    Fake::start(move |h: &Hit| {
        if h.header("authorization") == "Bearer x" {
            ok(h)
        } else {
            let challenge = format!(r#"Bearer realm="{realm}",service="fake""#);
            with_headers(401, &[("www-authenticate", &challenge)], "")
        }
    })
    .await
}

fn alice() -> Credentials {
    Credentials {
        username: "alice".into(),
        password: "pw".into(),
        ..Default::default()
    }
}

/// `expires_in` of u64::MAX once overflowed `Instant + lifetime` and panicked the lookup. It
/// is clamped: the token works and is cached.
#[tokio::test]
async fn huge_expires_in_is_clamped_not_a_panic() {
    let tokens =
        Fake::start(|_h: &Hit| reply(200, r#"{"token":"x","expires_in":18446744073709551615}"#))
            .await;
    let fake = bearer_registry(format!("http://{}/token", tokens.host())).await;
    let dir = hosts_dir(&fake.host(), &[]);
    let c = client(dir.path());
    let r = reference("library/app:1");
    c.resolve(&r, &anon()).await.unwrap();
    c.resolve(&r, &anon()).await.unwrap();
    assert_eq!(tokens.hits().len(), 1, "the token is cached");
    assert_eq!(
        parse_token_response(br#"{"token":"x","expires_in":18446744073709551615}"#),
        Ok(("x".to_owned(), MAX_TOKEN_LIFETIME))
    );
}

/// A `Retry-After` of years is waited at most `retry_max` (40 ms here).
#[tokio::test]
async fn huge_retry_after_is_capped_at_the_retry_maximum() {
    let fake = Fake::start(failing_first(1, || {
        with_headers(429, &[("retry-after", "18446744073709551615")], "")
    }))
    .await;
    let dir = hosts_dir(&fake.host(), &[]);
    let started = Instant::now();
    let resolved = tokio::time::timeout(
        Duration::from_secs(10),
        client(dir.path()).resolve(&reference("library/app:1"), &anon()),
    )
    .await
    .expect("the retry waits at most retry_max");
    resolved.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(fake.hits().len(), 2);
}

/// A token answer of 64 MiB (generated as it is sent, no Content-Length) is refused after
/// MAX_TOKEN_BODY bytes, and one announcing a huge Content-Length without reading it.
#[tokio::test]
async fn oversize_token_body_is_refused() {
    let tokens = Fake::start(|h: &Hit| {
        if h.path == "/declared" {
            endless(1 << 30, b' ', Some(1 << 40))
        } else {
            endless(64 << 20, b' ', None)
        }
    })
    .await;
    for path in ["/streamed", "/declared"] {
        let fake = bearer_registry(format!("http://{}{path}", tokens.host())).await;
        let dir = hosts_dir(&fake.host(), &[]);
        let err = client(dir.path())
            .resolve(&reference("library/app:1"), &anon())
            .await
            .unwrap_err();
        assert!(
            matches!(
                &err,
                RegistryError::Auth {
                    source: auth::AuthError::TokenTooLarge { .. },
                    ..
                }
            ),
            "{path}: {err}"
        );
        assert!(!err.is_retriable(), "{err}");
    }
}

/// A realm on another host (127.0.0.2 for a registry on 127.0.0.1) gets neither Basic
/// credentials nor a refresh token: it is asked anonymously, with a GET.
#[tokio::test]
async fn realm_on_another_host_gets_no_secrets() {
    let tokens = Fake::start_on("127.0.0.2", |_h: &Hit| reply(200, r#"{"token":"x"}"#)).await;
    let fake = bearer_registry(format!("http://{}/token", tokens.host())).await;
    let dir = hosts_dir(&fake.host(), &[]);
    let c = client(dir.path());
    let refresh = Credentials {
        identity_token: "idtok".into(),
        ..Default::default()
    };
    for creds in [alice(), refresh] {
        c.resolve(&reference("library/app:1"), &creds)
            .await
            .unwrap();
    }
    let hits = tokens.hits();
    assert_eq!(hits.len(), 2);
    for h in &hits {
        assert_eq!(h.method, "GET");
        assert_eq!(h.header("authorization"), "", "{h:?}");
        assert!(!String::from_utf8_lossy(&h.body).contains("idtok"));
        assert!(!h.query.contains("idtok"));
    }

    // The registry's own host (another port) still gets them.
    let own = Fake::start(|_h: &Hit| reply(200, r#"{"token":"x"}"#)).await;
    let fake = bearer_registry(format!("http://{}/token", own.host())).await;
    let dir = hosts_dir(&fake.host(), &[]);
    client(dir.path())
        .resolve(&reference("library/app:1"), &alice())
        .await
        .unwrap();
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("alice:pw")
    );
    assert_eq!(own.hits()[0].header("authorization"), basic);
}

#[test]
fn which_realms_get_secrets() {
    let url = |s: &str| url::Url::parse(s).unwrap();
    let ok = |host: &str, https: bool, realm: &str| realm_may_get_secrets(host, https, &url(realm));
    assert!(ok(
        "registry-1.docker.io",
        true,
        "https://auth.docker.io/token"
    ));
    assert!(ok(
        "registry.gitlab.com",
        true,
        "https://gitlab.com/jwt/auth"
    ));
    assert!(ok("ghcr.io", true, "https://ghcr.io/token"));
    assert!(ok("localhost:5000", false, "http://localhost:5001/auth"));
    assert!(ok("127.0.0.1:5000", false, "http://127.0.0.1:5001/auth"));
    // Plain http for an https registry.
    assert!(!ok(
        "registry-1.docker.io",
        true,
        "http://auth.docker.io/token"
    ));
    // Other hosts.
    assert!(!ok("127.0.0.1:5000", false, "http://127.0.0.2:5000/auth"));
    assert!(!ok("ghcr.io", true, "https://evil.io/token"));
    assert!(!ok("ghcr.io", true, "https://ghcr.io.evil.io/token"));
    assert!(!ok(
        "registry-1.docker.io",
        true,
        "https://docker.io.evil.io/token"
    ));
    assert!(!ok("a.io", true, "https://b.io/token"));
    assert!(!ok("[::1]:5000", false, "http://[::2]:5000/auth"));
    assert!(!ok("ghcr.io", true, "ftp://ghcr.io/token"));
}

#[test]
fn server_address_scopes_credentials() {
    use auth::server_address_matches as m;
    assert!(m("", "ghcr.io"));
    assert!(m("https://index.docker.io/v1/", "docker.io"));
    assert!(m("docker.io", "docker.io"));
    assert!(m("https://ghcr.io", "ghcr.io"));
    assert!(m("myreg:5000", "myreg:5000"));
    assert!(m("*.azurecr.io", "mine.azurecr.io"));
    assert!(!m("*.azurecr.io", "a.b.azurecr.io"));
    assert!(!m("*.azurecr.io", "azurecr.io"));
    assert!(!m("ghcr.io", "docker.io"));
    assert!(!m("https://index.docker.io/v1/", "evil.io"));
    assert!(!m("myreg:5000", "myreg:5001"));
}

/// A redirect to another host (a blob on a storage host) is followed without the
/// registry's `Authorization`; the registry itself got it.
#[tokio::test]
async fn redirect_to_another_host_carries_no_credentials() {
    let data = blob_data();
    let d = data.clone();
    let storage = Fake::start_on("127.0.0.2", move |_h: &Hit| reply(200, d.clone())).await;
    let target = format!("http://{}/blob", storage.host());
    let fake = Fake::start(move |h: &Hit| {
        if h.header("authorization").is_empty() {
            with_headers(401, &[("www-authenticate", "Basic realm=\"fake\"")], "")
        } else {
            with_headers(307, &[("location", &target)], "")
        }
    })
    .await;
    let dir = hosts_dir(&fake.host(), &[]);
    let dsc = desc(&data, "application/vnd.oci.image.layer.v1.tar");
    let s = client(dir.path())
        .fetch_blob(&reference("library/app:1"), &dsc, 0, &alice())
        .await
        .unwrap();
    assert_eq!(collect(s).await.unwrap(), data.to_vec());
    assert!(fake
        .hits()
        .iter()
        .any(|h| h.header("authorization").starts_with("Basic ")));
    let hits = storage.hits();
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].header("authorization"), "", "{:?}", hits[0]);
}

/// A manifest whose body is longer than its descriptor says is refused, without reading more
/// than one byte past the declared size.
#[tokio::test]
async fn manifest_longer_than_declared_is_refused() {
    let body = manifest_body();
    let mut long = body.to_vec();
    long.extend_from_slice(&[b' '; 4096]);
    let fake = Fake::start(move |_h: &Hit| reply(200, long.clone())).await;
    let dir = hosts_dir(&fake.host(), &[]);
    let err = client(dir.path())
        .fetch_manifest(
            &reference("library/app:1"),
            &desc(&body, MEDIA_TYPE_OCI_MANIFEST),
            &anon(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, RegistryError::Verify { .. }), "{err}");
}

/// Basic credentials are cached a minute at most, and the cache holds at most MAX_CACHED
/// entries however many scopes are asked for.
#[tokio::test(start_paused = true)]
async fn authorization_cache_has_a_ttl_and_a_size_cap() {
    let a = auth::Authorizer::new();
    let http = reqwest::Client::new();
    let basic = Challenge::parse("Basic realm=x").unwrap();
    let timeout = Duration::from_secs(1);
    a.authorize(&http, "h", false, "s", &alice(), &basic, timeout)
        .await
        .unwrap();
    let id = alice().identity();
    assert!(a.cached("h", "s", &id).is_some());
    tokio::time::advance(auth::CREDENTIAL_CACHE_TTL).await;
    assert!(
        a.cached("h", "s", &id).is_none(),
        "Basic credentials outlived their TTL"
    );
    for i in 0..auth::MAX_CACHED + 100 {
        a.authorize(
            &http,
            "h",
            false,
            &format!("s{i}"),
            &alice(),
            &basic,
            timeout,
        )
        .await
        .unwrap();
    }
    assert_eq!(a.cached_len(), auth::MAX_CACHED);
    let last = format!("s{}", auth::MAX_CACHED + 99);
    assert!(a.cached("h", &last, &id).is_some());
}

/// An https registry that answers every request, on a connection of its own, with a redirect
/// to `location`; counts the connections. Self-signed for 127.0.0.1 (hosts.toml skip_verify).
async fn https_redirecting_to(location: String) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::rustls;
    let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let cert = rustls::pki_types::CertificateDer::from(ck.cert.der().to_vec());
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(rustls::pki_types::PrivatePkcs8KeyDer::from(
        ck.signing_key.serialize_der(),
    ));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let connections = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&connections);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            seen.fetch_add(1, Ordering::SeqCst);
            let acceptor = acceptor.clone();
            let location = location.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf).await {
                        Ok(n) if n > 0 => head.extend_from_slice(&buf[..n]),
                        _ => return,
                    }
                }
                let answer = format!(
                    "HTTP/1.1 307 Temporary Redirect\r\nLocation: {location}\r\n\
                     Content-Length: 0\r\nConnection: close\r\n\r\n"
                );
                let _ = tls.write_all(answer.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    (addr, connections)
}

/// Issue 43: a redirect from https down to plain http is refused, and the refusal is final —
/// one request, not `max_attempts` of them as for a connection failure — reported as a
/// refused redirect (not "connection failed").
#[tokio::test]
async fn refused_https_to_http_redirect_is_not_retried() {
    use std::sync::atomic::Ordering;
    let plain = Fake::start(|_h: &Hit| reply(200, "")).await;
    let (addr, connections) = https_redirecting_to(format!(
        "http://{}/v2/library/app/manifests/1",
        plain.host()
    ))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let host_dir = dir.path().join(REGISTRY);
    std::fs::create_dir_all(&host_dir).unwrap();
    std::fs::write(
        host_dir.join("hosts.toml"),
        format!("server = \"https://{addr}\"\nskip_verify = true\n"),
    )
    .unwrap();
    let err = client(dir.path())
        .resolve(&reference("library/app:1"), &anon())
        .await
        .unwrap_err();
    assert!(
        matches!(err, RegistryError::RedirectRefused { .. }),
        "{err:?}"
    );
    assert!(!err.is_retriable());
    assert!(err.to_string().contains("redirect refused"), "{err}");
    assert_eq!(connections.load(Ordering::SeqCst), 1, "asked once");
    assert!(plain.hits().is_empty(), "the http target was not asked");
}

/// 408 is retried like a 5xx; other 4xx (here 400) are not.
#[tokio::test]
async fn request_timeout_is_retried_other_4xx_are_not() {
    let fake = Fake::start(failing_first(2, || reply(408, ""))).await;
    let dir = hosts_dir(&fake.host(), &[]);
    client(dir.path())
        .resolve(&reference("library/app:1"), &anon())
        .await
        .unwrap();
    assert_eq!(fake.hits().len(), 3);

    let fake = Fake::start(|_h: &Hit| reply(400, "")).await;
    let dir = hosts_dir(&fake.host(), &[]);
    let err = client(dir.path())
        .resolve(&reference("library/app:1"), &anon())
        .await
        .unwrap_err();
    assert!(
        matches!(err, RegistryError::UnexpectedStatus { status: 400, .. }),
        "{err:?}"
    );
    assert_eq!(fake.hits().len(), 1);
}
