//! Hostile registries (issue 26): a registry a pod author picks may answer anything. remora
//! must answer each pull with an error (or the image) within a bound, keep its memory bounded,
//! send no credentials where they do not belong, and go on pulling from good registries.
//!
//! One remora on the test bed, its hosts.toml sending `*.hostile.test` to fakes on loopback
//! (each a thread of its own, generating what it sends as it sends it) and `registry.k8s.io`
//! to the test bed's registry. After each hostile pull, a pull of a freshly pushed image from
//! the good registry must succeed within [`GOOD_PULL`], and remora's RSS must stay within
//! [`RSS_GROWTH`] of what it was after the first good pull.
//!
//! Issue 43 (`a_good_pull_is_answered_while_five_hostile_pulls_stall`): five hostile pulls
//! that stall at once — four in the tag lookup, one trickling its layers — must not hold a
//! pull from the good registry; it is answered while they all still wait.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use remora::cri::v1;
use tonic::Code;

use crate::cri;
use crate::harness::{
    certs_dir, push_image, push_image_with, serve_on_thread_at, BedRemora, RequestHead,
};
use crate::metrics::{free_port, scrape};
use crate::testbed::TESTBED_REGISTRY;

/// The resolve deadline remora runs with here (`[images] resolve_timeout`).
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a hostile pull may take to be answered: the resolve deadline and some slack.
const HOSTILE_ANSWER: Duration = Duration::from_secs(40);
/// How long the good pull after each hostile one may take.
const GOOD_PULL: Duration = Duration::from_secs(30);
/// How much remora's RSS may grow over the whole test.
const RSS_GROWTH: u64 = 64 << 20;
/// The token body the "big token" registry sends: 2 GiB, generated as it is written.
const BIG_TOKEN: u64 = 2 << 30;

/// One request a hostile registry saw.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    host: String,
    authorization: String,
    user_agent: String,
}

/// What a hostile registry does with one request.
enum Answer {
    /// This status line, headers and body.
    Reply {
        status: &'static str,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
    /// A 200 with these headers and a body of `len` spaces, written 64 KiB at a time until
    /// the client goes (never held whole).
    Stream {
        headers: Vec<(String, String)>,
        len: u64,
    },
    /// Forward to the test bed's registry.
    Forward,
    /// Keep the connection and never answer.
    Hang,
    /// Send a status line, then one more header byte per `every`, never ending the headers.
    SlowHeaders { every: Duration },
    /// A 200 without a length whose body comes `bytes_per_sec` bytes a second until the
    /// client goes.
    Trickle { bytes_per_sec: usize },
    /// The test bed registry's answer to a GET (a `Range` of it answered 206), its body paced
    /// at `bytes_per_sec` (a quarter of it every 250 ms) across all the connections that
    /// share `pace`, and the blob's last chunk held until `gate` opens: a slow registry sending the
    /// right bytes, however many ranges a client fetches at once, that no download finishes
    /// before the test lets it. Anything but a GET is forwarded as it is.
    Paced {
        bytes_per_sec: usize,
        pace: Arc<tokio::sync::Mutex<()>>,
        gate: tokio::sync::watch::Receiver<bool>,
    },
}

fn reply(status: &'static str, headers: &[(&str, &str)], body: &[u8]) -> Answer {
    Answer::Reply {
        status,
        headers: headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        body: body.to_vec(),
    }
}

/// A registry on loopback answering each request (one per connection) with `answer`.
struct Hostile {
    addr: std::net::SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    _thread: std::thread::JoinHandle<()>,
}

type AnswerFn = dyn Fn(&Seen) -> Answer + Send + Sync;

impl Hostile {
    fn start(ip: &str, answer: impl Fn(&Seen) -> Answer + Send + Sync + 'static) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let answer: Arc<AnswerFn> = Arc::new(answer);
        let (addr, thread) = serve_on_thread_at(ip, move |client| {
            Self::serve(client, answer.clone(), log.clone())
        });
        Hostile {
            addr,
            seen,
            _thread: thread,
        }
    }

    async fn serve(
        mut client: tokio::net::TcpStream,
        answer: Arc<AnswerFn>,
        log: Arc<Mutex<Vec<Seen>>>,
    ) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let Some(head) = RequestHead::read(&mut client).await else {
            return;
        };
        let (method, path) = (head.method.clone(), head.path.clone());
        let header = |name: &str| head.header(name);
        let seen = Seen {
            method: method.clone(),
            path: path.clone(),
            host: header("Host"),
            authorization: header("Authorization"),
            user_agent: header("User-Agent"),
        };
        log.lock().expect("hostile log").push(seen.clone());
        let head_of = |status: &str, headers: &[(String, String)], len: Option<usize>| {
            let mut h = format!("HTTP/1.1 {status}\r\n");
            for (k, v) in headers {
                h.push_str(&format!("{k}: {v}\r\n"));
            }
            if let Some(len) = len {
                h.push_str(&format!("Content-Length: {len}\r\n"));
            }
            h.push_str("Connection: close\r\n\r\n");
            h
        };
        match answer(&seen) {
            Answer::Reply {
                status,
                headers,
                body,
            } => {
                let has_length = headers
                    .iter()
                    .any(|(k, _)| k.eq_ignore_ascii_case("Content-Length"));
                let h = head_of(status, &headers, (!has_length).then_some(body.len()));
                let _ = client.write_all(h.as_bytes()).await;
                if method != "HEAD" {
                    let _ = client.write_all(&body).await;
                }
            }
            Answer::Stream { headers, len } => {
                let h = head_of("200 OK", &headers, None);
                if client.write_all(h.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = vec![b' '; 64 << 10];
                let mut sent = 0u64;
                while sent < len {
                    let n = (len - sent).min(chunk.len() as u64) as usize;
                    if client.write_all(&chunk[..n]).await.is_err() {
                        return;
                    }
                    sent += n as u64;
                }
            }
            Answer::Forward => head.forward_to_bed(&mut client).await,
            Answer::Paced { .. } if method != "GET" => head.forward_to_bed(&mut client).await,
            Answer::Paced {
                bytes_per_sec,
                pace,
                mut gate,
            } => {
                let Ok(resp) = reqwest::get(format!("http://{TESTBED_REGISTRY}{path}")).await
                else {
                    return;
                };
                if !resp.status().is_success() {
                    return;
                }
                let Ok(blob) = resp.bytes().await else { return };
                let total = blob.len();
                // "bytes=START-END" (END inclusive) or "bytes=START-".
                let range = header("Range");
                let wanted = range.strip_prefix("bytes=").and_then(|r| {
                    let (start, end) = r.split_once('-')?;
                    let start: usize = start.parse().ok()?;
                    let end = if end.is_empty() {
                        total.checked_sub(1)?
                    } else {
                        end.parse::<usize>().ok()?.min(total.checked_sub(1)?)
                    };
                    (start <= end).then_some((start, end))
                });
                // Only the answer holding the blob's last byte waits at the gate: containerd
                // writes ranges in order, so a held middle range would hold its offset at 0.
                let ends_blob = wanted.is_none_or(|(_, end)| end + 1 == total);
                let (status, extra, body) = match wanted {
                    Some((start, end)) => (
                        "206 Partial Content",
                        vec![(
                            "Content-Range".to_string(),
                            format!("bytes {start}-{end}/{total}"),
                        )],
                        blob.slice(start..=end),
                    ),
                    None => ("200 OK", Vec::new(), blob),
                };
                let mut headers = vec![(
                    "Content-Type".to_string(),
                    "application/octet-stream".to_string(),
                )];
                headers.extend(extra);
                let h = head_of(status, &headers, Some(body.len()));
                if client.write_all(h.as_bytes()).await.is_err() {
                    return;
                }
                let chunks: Vec<&[u8]> = body.chunks((bytes_per_sec / 4).max(1)).collect();
                for (i, chunk) in chunks.iter().enumerate() {
                    if ends_blob
                        && i + 1 == chunks.len()
                        && gate.wait_for(|open| *open).await.is_err()
                    {
                        return;
                    }
                    let _turn = pace.lock().await;
                    if client.write_all(chunk).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
            Answer::SlowHeaders { every } => {
                let mut sent = b"HTTP/1.1 200 OK\r\nX-Slow: ".iter().copied();
                loop {
                    let byte = sent.next().unwrap_or(b'a');
                    if client.write_all(&[byte]).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(every).await;
                }
            }
            Answer::Trickle { bytes_per_sec } => {
                let h = head_of(
                    "200 OK",
                    &[("Content-Type".into(), "application/octet-stream".into())],
                    None,
                );
                if client.write_all(h.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = vec![b' '; bytes_per_sec];
                while client.write_all(&chunk).await.is_ok() {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
            Answer::Hang => {
                // Hold the connection open; read (and drop) whatever else comes.
                while matches!(client.read(&mut [0u8; 4096]).await, Ok(n) if n > 0) {}
                std::future::pending::<()>().await;
            }
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("hostile log").clone()
    }
}

/// A 401 asking for a bearer token from `realm`.
fn challenge(realm: &str) -> Answer {
    let value = format!(r#"Bearer realm="{realm}",service="hostile""#);
    reply(
        "401 Unauthorized",
        &[
            ("WWW-Authenticate", &value),
            ("Docker-Distribution-Api-Version", "registry/2.0"),
        ],
        b"",
    )
}

/// remora's resident set, from /proc.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kib << 10
}

struct Run {
    bed: BedRemora,
    baseline: u64,
    rows: Vec<String>,
}

impl Run {
    /// Pulls a freshly pushed image from the good registry; it must work within GOOD_PULL
    /// and remora's RSS stay within RSS_GROWTH of the baseline.
    async fn good_pull_after(&mut self, case: &str, answered: String) {
        let image = push_image(1, 64 * 1024).await;
        let started = Instant::now();
        let pulled = tokio::time::timeout(GOOD_PULL, cri::pull(&self.bed.remora, &image.reference))
            .await
            .unwrap_or_else(|_| panic!("after {case}: the good pull took over {GOOD_PULL:?}"));
        pulled.unwrap_or_else(|e| panic!("after {case}: the good pull failed: {e:?}"));
        let took = started.elapsed();
        let rss = rss(self.bed.remora.pid());
        assert!(
            rss < self.baseline + RSS_GROWTH,
            "after {case}: remora's RSS is {} MiB, baseline {} MiB",
            rss >> 20,
            self.baseline >> 20
        );
        let row = format!(
            "{case} | {answered} | good pull in {took:.1?}, RSS {} MiB (baseline {} MiB)",
            rss >> 20,
            self.baseline >> 20
        );
        eprintln!("hostile registry: {row}");
        self.rows.push(row);
    }

    /// Pulls `image` (with `auth`); the answer must come within HOSTILE_ANSWER.
    async fn hostile_pull(
        &self,
        case: &str,
        image: &str,
        auth: Option<v1::AuthConfig>,
    ) -> (Result<String, tonic::Status>, Duration) {
        let started = Instant::now();
        let mut client = self.bed.remora.images();
        let pull = client.pull_image(v1::PullImageRequest {
            image: Some(cri::image_spec(image)),
            auth,
            ..Default::default()
        });
        let result = tokio::time::timeout(HOSTILE_ANSWER, pull)
            .await
            .unwrap_or_else(|_| panic!("{case}: no answer within {HOSTILE_ANSWER:?}"))
            .map(|r| r.into_inner().image_ref);
        (result, started.elapsed())
    }
}

fn describe(result: &Result<String, tonic::Status>, took: Duration) -> String {
    match result {
        Ok(id) => format!("pulled {} in {took:.1?}", &id[..19.min(id.len())]),
        Err(s) => format!("{:?} in {took:.1?}: {}", s.code(), s.message()),
    }
}

#[tokio::test]
async fn hostile_registries_get_bounded_answers_and_good_pulls_go_on() {
    // Token server with an overflowing lifetime, in front of the good registry: u64::MAX
    // seconds for remora (which overflowed Instant + lifetime), i64::MAX for containerd's Go
    // client, which fetches the layers and refuses a number over its int.
    let expiry = Hostile::start("127.0.0.1", |s: &Seen| {
        if s.path.starts_with("/token") {
            let body: &[u8] = if s.user_agent.starts_with("remora") {
                br#"{"token":"x","expires_in":18446744073709551615}"#
            } else {
                br#"{"token":"x","expires_in":9223372036854775807}"#
            };
            reply("200 OK", &[("Content-Type", "application/json")], body)
        } else if s.authorization == "Bearer x" {
            Answer::Forward
        } else {
            challenge(&format!("http://{}/token", s.host))
        }
    });
    // Always 429 with a Retry-After of 584 billion years.
    let retry = Hostile::start("127.0.0.1", |_s: &Seen| {
        reply(
            "429 Too Many Requests",
            &[("Retry-After", "18446744073709551615")],
            b"",
        )
    });
    // A token answer of gigabytes.
    let big_token = Hostile::start("127.0.0.1", |s: &Seen| {
        if s.path.starts_with("/token") {
            Answer::Stream {
                headers: vec![("Content-Type".into(), "application/json".into())],
                len: BIG_TOKEN,
            }
        } else {
            challenge(&format!("http://{}/token", s.host))
        }
    });
    // A realm on another host (127.0.0.2), in front of the good registry.
    let realm = Hostile::start("127.0.0.2", |_s: &Seen| {
        reply(
            "200 OK",
            &[("Content-Type", "application/json")],
            br#"{"token":"x","expires_in":60}"#,
        )
    });
    let realm_url = format!("http://{}/token", realm.addr);
    let foreign = Hostile::start("127.0.0.1", move |s: &Seen| {
        if s.authorization == "Bearer x" {
            Answer::Forward
        } else {
            challenge(&realm_url)
        }
    });
    // A manifest whose size lies: HEAD says 300 bytes, GET sends a gigabyte.
    let lies = Hostile::start("127.0.0.1", |s: &Seen| {
        let manifest = "application/vnd.oci.image.manifest.v1+json";
        let digest = format!("sha256:{}", "ab".repeat(32));
        if s.method == "HEAD" {
            reply(
                "200 OK",
                &[
                    ("Content-Type", manifest),
                    ("Docker-Content-Digest", &digest),
                    ("Content-Length", "300"),
                ],
                b"",
            )
        } else {
            Answer::Stream {
                headers: vec![
                    ("Content-Type".into(), manifest.into()),
                    ("Docker-Content-Digest".into(), digest),
                ],
                len: 1 << 30,
            }
        }
    });
    // Accepts the connection, reads the request, never answers.
    let silent = Hostile::start("127.0.0.1", |_s: &Seen| Answer::Hang);

    let server = |h: &Hostile| format!("http://{}", h.addr);
    let good = format!("http://{TESTBED_REGISTRY}");
    let certs = certs_dir(&[
        ("registry.k8s.io", &good),
        ("expiry.hostile.test", &server(&expiry)),
        ("retry.hostile.test", &server(&retry)),
        ("bigtoken.hostile.test", &server(&big_token)),
        ("realm.hostile.test", &server(&foreign)),
        ("lies.hostile.test", &server(&lies)),
        ("silent.hostile.test", &server(&silent)),
    ]);
    // Layers through containerd's Transfer service (the default), and a short resolve
    // deadline so that the cases that hang end within the test.
    let bed = BedRemora::start_with_certs_edited(certs.path(), |config| {
        let edited = config.replacen(
            "[images]\n",
            &format!(
                "[images]\npull_layers = \"transfer\"\nresolve_timeout = \"{}s\"\n",
                RESOLVE_TIMEOUT.as_secs()
            ),
            1,
        );
        assert_ne!(
            edited, config,
            "the test bed template has an [images] table"
        );
        edited
    });

    // Baseline: after a first good pull (code and caches warm).
    let first = push_image(1, 64 * 1024).await;
    cri::pull(&bed.remora, &first.reference)
        .await
        .expect("first good pull");
    let baseline = rss(bed.remora.pid());
    let mut run = Run {
        bed,
        baseline,
        rows: Vec::new(),
    };

    // 1. expires_in = u64::MAX: the token is clamped; the pull itself works.
    let image = push_image(1, 4096).await;
    let name = format!("expiry.hostile.test/{}:v1", image.repository);
    let (result, took) = run.hostile_pull("huge expires_in", &name, None).await;
    result
        .as_ref()
        .expect("a pull through a huge-expiry token server");
    assert!(
        expiry
            .seen()
            .iter()
            .any(|s| s.path.starts_with("/token") && s.user_agent.starts_with("remora")),
        "remora fetched a token with the huge lifetime"
    );
    run.good_pull_after(
        "token expires_in = u64::MAX seconds (to remora)",
        describe(&result, took),
    )
    .await;

    // 2. Retry-After of u64::MAX seconds: the retries wait retry_max at most and the
    // resolve deadline ends it.
    let (result, took) = run
        .hostile_pull("huge Retry-After", "retry.hostile.test/x:1", None)
        .await;
    let err = result.as_ref().expect_err("always 429");
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(!err.message().contains("shutting down"), "{err:?}");
    run.good_pull_after("429 with Retry-After = u64::MAX", describe(&result, took))
        .await;

    // 3. A token body of 2 GiB: refused after remora's cap.
    let (result, took) = run
        .hostile_pull("2 GiB token", "bigtoken.hostile.test/x:1", None)
        .await;
    let err = result.as_ref().expect_err("oversize token");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    run.good_pull_after("token body of 2 GiB", describe(&result, took))
        .await;

    // 4. A realm on another host: asked anonymously, by remora and by containerd.
    let image = push_image(1, 4096).await;
    let name = format!("realm.hostile.test/{}:v1", image.repository);
    let auth = v1::AuthConfig {
        username: "it-user".into(),
        password: "it-secret".into(),
        server_address: "realm.hostile.test".into(),
        ..Default::default()
    };
    let (result, took) = run.hostile_pull("foreign realm", &name, Some(auth)).await;
    result
        .as_ref()
        .expect("an anonymous token from the foreign realm works");
    let asked = realm.seen();
    assert!(!asked.is_empty(), "the realm was asked");
    for s in &asked {
        assert_eq!(
            s.authorization, "",
            "the foreign realm got credentials: {s:?}"
        );
        assert!(!s.path.contains("it-secret"), "{s:?}");
    }
    assert!(
        foreign
            .seen()
            .iter()
            .all(|s| !s.authorization.starts_with("Basic ")),
        "the registry challenged for Bearer only"
    );
    run.good_pull_after(
        "token realm on another host (127.0.0.2), pull with credentials",
        format!(
            "{}; the realm saw {} token requests ({}), none with credentials",
            describe(&result, took),
            asked.len(),
            asked
                .iter()
                .map(|s| s
                    .user_agent
                    .split('/')
                    .next()
                    .unwrap_or_default()
                    .to_string())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect::<Vec<_>>()
                .join(", ")
        ),
    )
    .await;

    // 5. A manifest whose size lies (1 GiB sent for 300 declared), and a config whose
    // declared size is smaller than it is.
    let (result, took) = run
        .hostile_pull("manifest size lies", "lies.hostile.test/x:1", None)
        .await;
    let err = result.as_ref().expect_err("lying manifest");
    assert_eq!(err.code(), Code::DataLoss, "{err:?}");
    run.good_pull_after(
        "manifest: HEAD says 300 bytes, GET sends 1 GiB",
        describe(&result, took),
    )
    .await;
    let lying_config = push_image_with(1, 4096, 0, Some(10)).await;
    let (result, took) = run
        .hostile_pull("config size lies", &lying_config.reference, None)
        .await;
    assert!(result.is_err(), "a config longer than its descriptor says");
    run.good_pull_after(
        "config declared 10 bytes, is longer",
        describe(&result, took),
    )
    .await;

    // 6. A registry that never answers: the resolve deadline ends it.
    let (result, took) = run
        .hostile_pull("silent", "silent.hostile.test/x:1", None)
        .await;
    let err = result.as_ref().expect_err("never answers");
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(!err.message().contains("shutting down"), "{err:?}");
    assert!(took < RESOLVE_TIMEOUT + Duration::from_secs(15), "{took:?}");
    run.good_pull_after("accepts, never answers", describe(&result, took))
        .await;

    let log = run.bed.remora.log_text();
    assert!(!log.contains("panicked"), "remora's log shows a panic");
    eprintln!("hostile registry table:\n{}", run.rows.join("\n"));
}

/// How long the good pull beside the stalling ones may take before the test calls it held:
/// less than remora's resolve deadline (1 min by default, which the stalling lookups run
/// into), so a good pull that waited for a stalled lookup's slot is caught.
const HANG_GUARD: Duration = Duration::from_secs(45);

/// Issue 43: five hostile pulls stall at once — a registry that never answers, one sending
/// its headers a byte a second, one answering 429 with a Retry-After of three thousand years,
/// one whose token server never answers (all four hold a tag lookup until the resolve
/// deadline) and one trickling three layers at 4 KiB/s, above the stall floor (each holds a
/// layer download slot for minutes). A pull from the good registry must be answered while all
/// five are still pending. Layers by remora's own client, so its download slots are tested;
/// the defaults otherwise (resolver workers and download slots shared out per registry).
///
/// Before per-host fairness the four lookups held all four resolver workers and the trickle
/// all three download slots: the good pull waited for the resolve deadline.
#[tokio::test]
async fn a_good_pull_is_answered_while_five_hostile_pulls_stall() {
    let silent = Hostile::start("127.0.0.1", |_s: &Seen| Answer::Hang);
    let slow = Hostile::start("127.0.0.1", |_s: &Seen| Answer::SlowHeaders {
        every: Duration::from_secs(1),
    });
    let retry = Hostile::start("127.0.0.1", |_s: &Seen| {
        reply(
            "429 Too Many Requests",
            &[("Retry-After", "99999999999")],
            b"",
        )
    });
    let silent_realm = Hostile::start("127.0.0.2", |_s: &Seen| Answer::Hang);
    let realm_url = format!("http://{}/token", silent_realm.addr);
    let tokenless = Hostile::start("127.0.0.1", move |_s: &Seen| challenge(&realm_url));
    // Three layers of 1 MiB: at 4 KiB/s each takes over four minutes.
    let trickled = push_image(3, 1 << 20).await;
    let layers = trickled.layers.clone();
    let trickle = Hostile::start("127.0.0.1", move |s: &Seen| {
        if layers.iter().any(|l| s.path.ends_with(l.as_str())) {
            Answer::Trickle {
                bytes_per_sec: 4096,
            }
        } else {
            Answer::Forward
        }
    });

    let server = |h: &Hostile| format!("http://{}", h.addr);
    let good = format!("http://{TESTBED_REGISTRY}");
    let certs = certs_dir(&[
        ("registry.k8s.io", &good),
        ("silent.hostile.test", &server(&silent)),
        ("slow.hostile.test", &server(&slow)),
        ("retry.hostile.test", &server(&retry)),
        ("tokenless.hostile.test", &server(&tokenless)),
        ("trickle.hostile.test", &server(&trickle)),
    ]);
    let bed = BedRemora::start_pulling_layers_with(certs.path(), "remora");

    let started = Instant::now();
    let spawn_pull = |image: String| {
        let mut client = bed.remora.images();
        tokio::spawn(async move {
            client
                .pull_image(v1::PullImageRequest {
                    image: Some(cri::image_spec(&image)),
                    ..Default::default()
                })
                .await
                .map(|r| r.into_inner().image_ref)
        })
    };
    // The trickle first, until remora downloads every layer of it.
    let mut hostile = vec![(
        "trickling layers",
        spawn_pull(format!("trickle.hostile.test/{}:v1", trickled.repository)),
    )];
    let blob_gets = |h: &Hostile| {
        h.seen()
            .iter()
            .filter(|s| s.method == "GET" && s.path.contains("/blobs/"))
            .filter(|s| trickled.layers.iter().any(|l| s.path.ends_with(l.as_str())))
            .count()
    };
    crate::harness::wait_until("the three trickling layers requested", GOOD_PULL, || {
        let n = blob_gets(&trickle);
        async move { n >= 3 }
    })
    .await;
    // Then the four lookups that stall, until each registry has been asked.
    for (case, image) in [
        ("never answers", "silent.hostile.test/x:1"),
        ("headers at 1 byte/s", "slow.hostile.test/x:1"),
        ("429, Retry-After 99999999999", "retry.hostile.test/x:1"),
        ("token server never answers", "tokenless.hostile.test/x:1"),
    ] {
        hostile.push((case, spawn_pull(image.to_string())));
    }
    for (what, h) in [
        ("silent", &silent),
        ("slow headers", &slow),
        ("429", &retry),
        ("silent token realm", &silent_realm),
    ] {
        crate::harness::wait_until(&format!("{what} asked"), GOOD_PULL, || {
            let asked = !h.seen().is_empty();
            async move { asked }
        })
        .await;
    }
    let stalled_at = started.elapsed();

    let image = push_image(2, 64 * 1024).await;
    let t0 = Instant::now();
    let pulled = tokio::time::timeout(HANG_GUARD, cri::pull(&bed.remora, &image.reference))
        .await
        .unwrap_or_else(|_| {
            panic!("the good pull was not answered within {HANG_GUARD:?} beside the stalls")
        });
    let took = t0.elapsed();
    pulled.unwrap_or_else(|e| panic!("the good pull failed: {e:?}"));
    for (case, task) in &hostile {
        assert!(
            !task.is_finished(),
            "the hostile pull '{case}' was answered before the good one \
             ({took:?} after all five stalled): it should still be stalling"
        );
    }
    eprintln!(
        "hostile registry: five stalling pulls (all stalling {stalled_at:.1?} after start), \
         a good pull beside them answered in {took:.2?}"
    );
    for (_, task) in hostile {
        task.abort();
    }
    let log = bed.remora.log_text();
    assert!(!log.contains("panicked"), "remora's log shows a panic");
}

/// `remora pulls --json` against `bed`'s status socket: the pulls in flight, as JSON.
fn remora_pulls_json(bed: &BedRemora) -> serde_json::Value {
    let socket = remora::status::socket_path(&bed.remora.socket);
    let out = std::process::Command::new(crate::harness::remora_bin())
        .args(["pulls", "--json", "--socket"])
        .arg(&socket)
        .output()
        .expect("run remora pulls");
    assert!(
        out.status.success(),
        "remora pulls failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("remora pulls --json prints JSON")
}

/// The pull of `repository` in a `remora pulls --json` answer, if it is there.
fn pull_of<'a>(pulls: &'a serde_json::Value, repository: &str) -> Option<&'a serde_json::Value> {
    pulls["pulls"]
        .as_array()?
        .iter()
        .find(|p| p["image"].as_str().is_some_and(|i| i.contains(repository)))
}

/// Issue 43: every pull shows its progress — its phase, its layers and bytes out of the
/// total, its rate — on `remora pulls`, in the metrics and in the log, with layers by remora's
/// own client and by containerd's Transfer service. A registry paces three layers of 512 KiB
/// at 128 KiB/s in all and holds the top layer's last chunk until the test has seen the pull
/// half done (moving, in the metrics, in the table, logged once it had run 10 s), so the pull
/// cannot leave `downloading` before (under CI load it had finished its downloads by the time
/// the metrics were read).
#[tokio::test]
async fn every_pull_shows_its_progress_on_remora_pulls_the_metrics_and_the_log() {
    const LAYER: usize = 512 << 10;
    for mode in ["transfer", "remora"] {
        let image = push_image(3, LAYER).await;
        let layers = image.layers.clone();
        let pace = Arc::new(tokio::sync::Mutex::new(()));
        // The top layer's last bytes wait for the test; the two below come whole.
        let (open_gate, gate) = tokio::sync::watch::channel(false);
        let (_open, open) = tokio::sync::watch::channel(true);
        let held = image.layers.last().expect("three layers").clone();
        let paced = Hostile::start("127.0.0.1", move |s: &Seen| {
            // containerd adds `?ns=<registry>` to the path.
            if layers.iter().any(|l| s.path.contains(l.as_str())) {
                Answer::Paced {
                    bytes_per_sec: 128 << 10,
                    pace: pace.clone(),
                    gate: if s.path.contains(held.as_str()) {
                        gate.clone()
                    } else {
                        open.clone()
                    },
                }
            } else {
                Answer::Forward
            }
        });
        let certs = certs_dir(&[("paced.registry.test", &format!("http://{}", paced.addr))]);
        let port = free_port();
        let bed = BedRemora::start_with_certs_edited(certs.path(), |config| {
            let edited = config.replacen(
                "[images]\n",
                &format!("[images]\npull_layers = \"{mode}\"\n"),
                1,
            );
            assert_ne!(
                edited, config,
                "the test bed template has an [images] table"
            );
            format!("{edited}\n[metrics]\naddress = \"127.0.0.1:{port}\"\n")
        });
        let metrics = format!("http://127.0.0.1:{port}/metrics");
        assert_eq!(
            remora_pulls_json(&bed)["pulls"].as_array().map(Vec::len),
            Some(0),
            "{mode}: no pull in flight yet"
        );

        let reference = format!("paced.registry.test/{}:v1", image.repository);
        let mut client = bed.remora.images();
        let asked = reference.clone();
        let started = Instant::now();
        let mut pull = tokio::spawn(async move {
            client
                .pull_image(v1::PullImageRequest {
                    image: Some(cri::image_spec(&asked)),
                    ..Default::default()
                })
                .await
                .map(|r| r.into_inner().image_ref)
        });

        // Half done: downloading, the three layers known, some bytes there and not all.
        let total = 3 * LAYER as u64;
        let mut first = 0;
        crate::harness::wait_until(
            &format!("{mode}: remora pulls shows the pull downloading"),
            Duration::from_secs(30),
            || {
                let ended = pull.is_finished();
                let pulls = remora_pulls_json(&bed);
                let seen = ended
                    || pull_of(&pulls, &image.repository).is_some_and(|p| {
                        let done = p["bytes_done"].as_u64().unwrap_or(0);
                        first = done;
                        p["phase"] == "downloading" && p["layers"] == 3 && done > 0 && done < total
                    });
                async move { seen }
            },
        )
        .await;
        if pull.is_finished() {
            let ended = (&mut pull).await;
            panic!("{mode}: the pull ended before it was seen half done: {ended:?}");
        }
        let pulls = remora_pulls_json(&bed);
        let p = pull_of(&pulls, &image.repository).expect("still in flight");
        assert!(
            p["bytes"].as_u64().is_some_and(|b| b >= total),
            "{mode}: the layers' size: {p}"
        );
        // It moves, and a rate shows once it has run a few seconds. containerd's Transfer
        // service reported a blob's bytes here only once the blob was whole (its ingest offset
        // did not show while the answer came), so on that path the bytes move in steps and
        // both lower layers may be in by the first look: only the rate is asked of it.
        crate::harness::wait_until(
            &format!("{mode}: the bytes move and a rate shows"),
            Duration::from_secs(20),
            || {
                let pulls = remora_pulls_json(&bed);
                let moved = pull_of(&pulls, &image.repository).is_some_and(|p| {
                    (mode == "transfer" || p["bytes_done"].as_u64().unwrap_or(0) > first)
                        && p["rate_bytes_per_sec"].as_u64().is_some_and(|r| r > 0)
                });
                async move { moved }
            },
        )
        .await;
        // The metrics say the same.
        let scraped = scrape(&metrics).await;
        assert_eq!(
            scraped.get("remora_image_pulls_in_flight", &[("phase", "downloading")]),
            Some(1.0),
            "{mode}: one pull downloading"
        );
        assert!(
            scraped
                .get(
                    "remora_image_pull_progress_bytes",
                    &[("image", &reference), ("of", "size")]
                )
                .is_some(),
            "{mode}: the pull's bytes are in the metrics"
        );
        // The table an operator reads names it with its phase.
        let table = std::process::Command::new(crate::harness::remora_bin())
            .args(["pulls", "--socket"])
            .arg(remora::status::socket_path(&bed.remora.socket))
            .output()
            .expect("run remora pulls");
        let table = String::from_utf8_lossy(&table.stdout);
        assert!(
            table.contains(&image.repository) && table.contains("downloading"),
            "{mode}: remora pulls:\n{table}"
        );
        // Logged once it has run 10 s; only then may the downloads end.
        crate::harness::wait_until(
            &format!("{mode}: a progress line in remora's log"),
            Duration::from_secs(30),
            || {
                let logged = bed
                    .remora
                    .log_text()
                    .lines()
                    .any(|l| l.contains("pull in progress") && l.contains(&image.repository));
                async move { logged }
            },
        )
        .await;
        assert!(
            !pull.is_finished(),
            "{mode}: the pull ended with its answers held"
        );
        open_gate.send(true).expect("the paced registry listens");

        let pulled = tokio::time::timeout(Duration::from_secs(120), &mut pull)
            .await
            .unwrap_or_else(|_| panic!("{mode}: the paced pull did not end in 120 s"))
            .expect("the pull task");
        pulled.unwrap_or_else(|e| panic!("{mode}: the paced pull failed: {e:?}"));
        let took = started.elapsed();
        // Gone from the table and the gauges once it ended.
        assert_eq!(
            remora_pulls_json(&bed)["pulls"].as_array().map(Vec::len),
            Some(0),
            "{mode}: the pull left the table"
        );
        assert_eq!(
            scrape(&metrics)
                .await
                .get("remora_image_pulls_in_flight", &[("phase", "downloading")]),
            Some(0.0),
            "{mode}"
        );
        // Logged on its way (above), at most once every 10 s.
        let log = bed.remora.log_text();
        let lines = log
            .lines()
            .filter(|l| l.contains("pull in progress") && l.contains(&image.repository))
            .count();
        assert!(lines >= 1, "{mode}: no progress line in remora's log");
        let most = took.as_secs() / 10 + 1;
        assert!(
            lines as u64 <= most,
            "{mode}: {lines} progress lines for one pull of {took:?}"
        );
    }
}
