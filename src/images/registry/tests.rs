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
    let body = manifest_body();
    let ok = manifest_handler(body);
    let n = Arc::new(Mutex::new(0));
    let fake = Fake::start(move |h: &Hit| {
        let mut n = n.lock().unwrap();
        *n += 1;
        if *n <= 2 {
            reply(503, "busy")
        } else {
            ok(h)
        }
    })
    .await;
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
    let ok = manifest_handler(manifest_body());
    let n = Arc::new(Mutex::new(0));
    let fake = Fake::start(move |h: &Hit| {
        let mut n = n.lock().unwrap();
        *n += 1;
        if *n == 1 {
            with_headers(429, &[("retry-after", "1")], "slow down")
        } else {
            ok(h)
        }
    })
    .await;
    let dir = hosts_dir(&fake.host(), &[]);
    let start = Instant::now();
    client(dir.path())
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
