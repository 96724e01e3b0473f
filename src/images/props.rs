//! Property tests of the parsers of bytes a registry (or a pod author's registry choice)
//! controls: `WWW-Authenticate` challenges, token server answers, `hosts.toml` files, image
//! manifests, indexes and configs.
//!
//! Properties: nothing panics (a stack overflow aborts the test binary, so unbounded recursion
//! shows too); what a parser keeps is never larger than what it was given, so its allocation
//! is bounded by the input, and the input by the caps upstream (`MAX_TOKEN_BODY`,
//! `MAX_MANIFEST_SIZE`, `MAX_CONFIG_SIZE`, the header size limits of the HTTP client); a token
//! lifetime is positive, at most `MAX_TOKEN_LIFETIME`, and can be added to an `Instant`.

use std::path::Path;

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use super::manifest::{ImageConfig, Manifest, MANIFEST_MEDIA_TYPES};
use super::registry::auth::{parse_token_response, Challenge, MAX_TOKEN_LIFETIME};
use super::registry::hosts::parse_hosts_toml;

fn config() -> Config {
    Config {
        cases: 256,
        // No persistence file: the suites run from the library's tests, not a crate dir.
        failure_persistence: None,
        ..Config::default()
    }
}

fn run<S: Strategy>(strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>) {
    TestRunner::new(config())
        .run(&strategy, test)
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Challenge-like text: schemes, parameter names, quoted and bare values with the characters
/// the parser treats specially, and arbitrary text.
fn challenge_text() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        Just("Bearer".to_string()),
        Just("Basic".to_string()),
        Just(" ".to_string()),
        Just(",".to_string()),
        Just("=".to_string()),
        Just("\"".to_string()),
        Just("\\".to_string()),
        Just("realm".to_string()),
        Just("scope=\"a,b\"".to_string()),
        "[a-z]{1,6}",
        "\\PC{0,4}",
    ];
    prop_oneof![
        vec(token, 0..24).prop_map(|t| t.concat()),
        "\\PC{0,64}",
        any::<String>(),
    ]
}

#[test]
fn challenges_parse_without_panic_into_no_more_than_they_were_given() {
    run(vec(challenge_text(), 1..4), |headers| {
        for h in &headers {
            if let Some(c) = Challenge::parse(h) {
                let kept: usize = c.scheme.len()
                    + c.params
                        .iter()
                        .map(|(k, v)| k.len() + v.len())
                        .sum::<usize>();
                prop_assert!(kept <= h.len(), "{h:?} gave {c:?}");
                prop_assert!(c.params.len() <= h.len());
                prop_assert_eq!(c.scheme.clone(), c.scheme.to_ascii_lowercase());
            }
        }
        let _ = Challenge::pick(headers.iter().map(String::as_str));
        Ok(())
    });
}

/// Token answers: JSON of the right shape with any `expires_in` (and wrong types), or bytes.
fn token_body() -> impl Strategy<Value = Vec<u8>> {
    let expires = prop_oneof![
        Just("18446744073709551615".to_string()),
        Just("0".to_string()),
        Just("-1".to_string()),
        Just("1e400".to_string()),
        Just("\"60\"".to_string()),
        Just("null".to_string()),
        any::<u64>().prop_map(|n| n.to_string()),
    ];
    prop_oneof![
        ("[a-zA-Z0-9._-]{0,40}", expires.clone(), any::<bool>()).prop_map(|(t, e, access)| {
            let field = if access { "access_token" } else { "token" };
            format!(r#"{{"{field}":"{t}","expires_in":{e}}}"#).into_bytes()
        }),
        vec(any::<u8>(), 0..256),
        "\\PC{0,64}".prop_map(String::into_bytes),
    ]
}

#[test]
fn token_answers_parse_to_a_bounded_lifetime() {
    run(token_body(), |body| {
        if let Ok((token, lifetime)) = parse_token_response(&body) {
            prop_assert!(!token.is_empty());
            prop_assert!(token.len() <= body.len());
            prop_assert!(!lifetime.is_zero());
            prop_assert!(lifetime <= MAX_TOKEN_LIFETIME, "{lifetime:?}");
            prop_assert!(tokio::time::Instant::now().checked_add(lifetime).is_some());
        }
        Ok(())
    });
}

/// hosts.toml-like text: the keys containerd's format has, with values of every TOML type,
/// in and out of `[host."…"]` tables, or arbitrary text.
fn hosts_text() -> impl Strategy<Value = String> {
    let value = prop_oneof![
        Just("\"http://127.0.0.1:5000\"".to_string()),
        Just("\"https://mirror.example\"".to_string()),
        Just("\"ftp://x\"".to_string()),
        Just("\"\"".to_string()),
        Just("[\"pull\", \"resolve\", \"push\"]".to_string()),
        Just("[]".to_string()),
        Just("true".to_string()),
        Just("1".to_string()),
        Just("{ a = \"b\" }".to_string()),
        Just("\"/etc/ca.pem\"".to_string()),
        Just("[\"relative.pem\", 3]".to_string()),
        "\"\\PC{0,12}\"",
    ];
    let key = prop::sample::select(
        &[
            "server",
            "capabilities",
            "skip_verify",
            "ca",
            "client",
            "header",
            "override_path",
            "x",
        ][..],
    );
    let line = prop_oneof![
        (key, value).prop_map(|(k, v)| format!("{k} = {v}\n")),
        "\\[host\\.\"https?://[a-z0-9.:]{0,16}\"\\]\n",
        Just("[header]\n".to_string()),
        Just("[host.\"http://m\".header]\nx-a = \"b\"\n".to_string()),
        "\\PC{0,16}\n",
    ];
    prop_oneof![
        4 => vec(line, 0..16).prop_map(|l| l.concat()),
        1 => any::<String>(),
    ]
}

#[test]
fn hosts_files_parse_without_panic_into_a_bounded_list() {
    run(hosts_text(), |text| {
        if let Ok(hosts) = parse_hosts_toml(Path::new("/x/hosts.toml"), &text, "reg.test") {
            // One per `[host."…"]` table at most, plus the server.
            prop_assert!(
                hosts.len() <= text.matches("[host.").count() + 1,
                "{text:?}"
            );
            for h in &hosts {
                prop_assert!(!h.host.is_empty());
                prop_assert!(h.header.len() <= text.len());
            }
        }
        Ok(())
    });
}

/// Manifest- and index-like JSON with media types (also generic and self-referring ones),
/// descriptors with odd sizes and digests, or bytes.
fn manifest_body() -> impl Strategy<Value = (&'static str, Vec<u8>)> {
    let mut types: Vec<&'static str> = MANIFEST_MEDIA_TYPES.to_vec();
    types.extend([
        "",
        "application/json",
        "application/json; charset=utf-8",
        "text/plain",
        "application/vnd.docker.distribution.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v1+prettyjws",
        "application/x-other",
    ]);
    let media_type = prop::sample::select(types);
    let descriptor = (
        prop_oneof![
            Just("sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"),
            Just("sha256:xyz"),
            Just(""),
            Just("md5:00"),
        ],
        prop_oneof![
            Just("0".to_string()),
            Just("-1".to_string()),
            Just("18446744073709551616".to_string()),
            any::<u64>().prop_map(|n| n.to_string()),
        ],
    )
        .prop_map(|(d, s)| {
            format!(r#"{{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"{d}","size":{s}}}"#)
        });
    let document = (
        media_type.clone(),
        prop_oneof![Just(1u32), Just(2u32)],
        vec(descriptor.clone(), 0..4),
        descriptor,
        any::<bool>(),
    )
        .prop_map(|(mt, version, descriptors, config, index)| {
            let list = descriptors.join(",");
            if index {
                format!(r#"{{"schemaVersion":{version},"mediaType":"{mt}","manifests":[{list}]}}"#)
            } else {
                format!(
                    r#"{{"schemaVersion":{version},"mediaType":"{mt}","config":{config},"layers":[{list}]}}"#
                )
            }
        });
    (
        media_type,
        prop_oneof![
            4 => document.prop_map(String::into_bytes),
            1 => vec(any::<u8>(), 0..256),
        ],
    )
}

#[test]
fn manifests_and_indexes_parse_without_panic_into_no_more_than_they_were_given() {
    run(manifest_body(), |(media_type, body)| {
        match Manifest::parse(media_type, &body) {
            Ok(Manifest::Image(m)) => prop_assert!(m.layers.len() <= body.len() / 2),
            Ok(Manifest::Index(i)) => prop_assert!(i.manifests.len() <= body.len() / 2),
            Err(_) => {}
        }
        // A config blob of the same bytes: parsed or refused, never a panic.
        let _ = ImageConfig::parse(&body);
        Ok(())
    });
}
