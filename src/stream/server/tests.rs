//! The streaming server's HTTP side on a real socket: token rules, upgrade negotiation, and
//! whole sessions with a fake runtime over WebSocket (tungstenite as the client) and SPDY.

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;

/// Records what the server asked of it; exec echoes stdin to stdout and exits with the
/// number of bytes read.
#[derive(Default)]
struct FakeRuntime {
    calls: Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl StreamBackend for FakeRuntime {
    async fn exec(
        &self,
        container_id: &str,
        cmd: Vec<String>,
        tty: bool,
        mut io: SessionIo,
    ) -> Result<i32, String> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("exec {container_id} {cmd:?} tty={tty}"));
        let mut read = 0usize;
        if let (Some(stdin), Some(stdout)) = (io.stdin.as_mut(), io.stdout.as_mut()) {
            let mut buf = [0u8; 1024];
            loop {
                let n = stdin.read(&mut buf).await.map_err(|e| e.to_string())?;
                if n == 0 {
                    break;
                }
                read += n;
                stdout
                    .write_all(&buf[..n])
                    .await
                    .map_err(|e| e.to_string())?;
            }
        } else if let Some(stdout) = io.stdout.as_mut() {
            stdout
                .write_all(b"hello\n")
                .await
                .map_err(|e| e.to_string())?;
        }
        if let Some(stderr) = io.stderr.as_mut() {
            stderr
                .write_all(b"oops\n")
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(read as i32)
    }

    async fn attach(&self, container_id: &str, _io: SessionIo) -> Result<(), String> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("attach {container_id}"));
        Err("no such thing".into())
    }

    async fn port_forward(&self, pod_id: &str, port: u16) -> Result<TcpStream, String> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("pf {pod_id} {port}"));
        Err(format!("nothing listens on {port}"))
    }
}

fn log() -> Logger {
    Logger::root(slog::Discard, slog::o!())
}

async fn server() -> (Arc<StreamServer>, Arc<FakeRuntime>, watch::Sender<bool>) {
    server_with(None).await
}

async fn server_with(
    tls: Option<TlsFiles>,
) -> (Arc<StreamServer>, Arc<FakeRuntime>, watch::Sender<bool>) {
    server_from(test_config(tls)).await
}

/// The settings of the tests' servers: generous limits unless a test sets its own.
fn test_config(tls: Option<TlsFiles>) -> StreamConfig {
    StreamConfig {
        address: "127.0.0.1:0".parse().unwrap(),
        token_ttl: Duration::from_secs(60),
        stream_creation_timeout: Duration::from_secs(5),
        tls,
        header_read_timeout: Duration::from_secs(10),
        max_connections: 64,
        idle_timeout: Duration::from_secs(3600),
    }
}

async fn server_from(
    config: StreamConfig,
) -> (Arc<StreamServer>, Arc<FakeRuntime>, watch::Sender<bool>) {
    let rt = Arc::new(FakeRuntime::default());
    let (server, listener) = StreamServer::bind(config, rt.clone(), Metrics::new(), log())
        .await
        .unwrap();
    let (tx, rx) = watch::channel(false);
    tokio::spawn(server.clone().serve(listener, rx));
    (server, rt, tx)
}

fn exec_request(stdin: bool) -> Request {
    Request::Exec {
        container_id: "c1".into(),
        cmd: vec!["cat".into()],
        opts: Options {
            stdin,
            stdout: true,
            stderr: true,
            tty: false,
        },
    }
}

/// Sends a raw request head; returns the response head.
async fn raw(url: &str, headers: &str) -> String {
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_once('/').unwrap();
    let mut s = TcpStream::connect(host).await.unwrap();
    s.write_all(format!("GET /{path} HTTP/1.1\r\nHost: {host}\r\n{headers}\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut b).await.unwrap() == 0 {
            break;
        }
        head.push(b[0]);
    }
    String::from_utf8_lossy(&head).into_owned()
}

const SPDY: &str = "Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\n";

#[tokio::test]
async fn urls_name_the_kind_and_a_fresh_token() {
    let (server, _, _stop) = server().await;
    let a = server.url_for(exec_request(false)).unwrap();
    let b = server.url_for(exec_request(false)).unwrap();
    assert!(
        a.starts_with(&format!("{}/exec/", server.base_url())),
        "{a}"
    );
    assert_ne!(a, b);
    let pf = server
        .url_for(Request::PortForward {
            pod_id: "p".into(),
            ports: Vec::new(),
        })
        .unwrap();
    assert!(pf.contains("/portforward/"), "{pf}");
}

#[tokio::test]
async fn unknown_reused_and_misrouted_tokens_are_not_found() {
    let (server, rt, _stop) = server().await;
    let base = server.base_url().to_string();
    assert!(raw(&format!("{base}/exec/nope"), SPDY)
        .await
        .starts_with("HTTP/1.1 404"));
    let url = server.url_for(exec_request(false)).unwrap();
    // An exec token used on the attach path is refused (and spent).
    let wrong = url.replace("/exec/", "/attach/");
    assert!(raw(&wrong, SPDY).await.starts_with("HTTP/1.1 404"));
    assert!(raw(&url, SPDY).await.starts_with("HTTP/1.1 404"));
    assert!(rt.calls.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_request_that_is_no_upgrade_is_refused() {
    let (server, _, _stop) = server().await;
    let url = server.url_for(exec_request(false)).unwrap();
    assert!(raw(&url, "").await.starts_with("HTTP/1.1 400"));
}

#[tokio::test]
async fn spdy_protocol_versions_are_negotiated_in_the_servers_order() {
    let (server, _, _stop) = server().await;
    let url = server.url_for(exec_request(false)).unwrap();
    let head = raw(
        &url,
        &format!("{SPDY}X-Stream-Protocol-Version: channel.k8s.io\r\nX-Stream-Protocol-Version: v4.channel.k8s.io, v3.channel.k8s.io\r\n"),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("x-stream-protocol-version: v4.channel.k8s.io"),
        "{head}"
    );
    let url = server.url_for(exec_request(false)).unwrap();
    let head = raw(
        &url,
        &format!("{SPDY}X-Stream-Protocol-Version: v9.channel.k8s.io\r\n"),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("x-accepted-stream-protocol-versions: v5.channel.k8s.io"),
        "{head}"
    );
}

#[tokio::test]
async fn websocket_protocols_follow_the_clients_order_and_unknown_ones_are_refused() {
    let (server, _, _stop) = server().await;
    let ws = "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n";
    let url = server.url_for(exec_request(false)).unwrap();
    let head = raw(
        &url,
        &format!("{ws}Sec-WebSocket-Protocol: v4.channel.k8s.io, v5.channel.k8s.io\r\n"),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let lower = head.to_ascii_lowercase();
    assert!(
        lower.contains("sec-websocket-protocol: v4.channel.k8s.io"),
        "{head}"
    );
    // RFC 6455's example key and answer.
    assert!(
        lower.contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo="),
        "{head}"
    );
    let url = server.url_for(exec_request(false)).unwrap();
    let head = raw(
        &url,
        &format!("{ws}Sec-WebSocket-Protocol: v9.channel.k8s.io\r\n"),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 400"), "{head}");
    let url = server
        .url_for(Request::PortForward {
            pod_id: "p".into(),
            ports: Vec::new(),
        })
        .unwrap();
    let head = raw(
        &url,
        &format!("{ws}Sec-WebSocket-Protocol: v4.channel.k8s.io\r\n"),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 400"), "no port named: {head}");
    // kubelet proxies to the URL without its client's query: the CRI request's ports count.
    let url = server
        .url_for(Request::PortForward {
            pod_id: "p".into(),
            ports: vec![80],
        })
        .unwrap();
    let head = raw(
        &url,
        &format!("{ws}Sec-WebSocket-Protocol: portforward.k8s.io\r\n"),
    )
    .await;
    assert!(
        head.starts_with("HTTP/1.1 101"),
        "ports of the request: {head}"
    );
}

#[tokio::test]
async fn a_websocket_exec_session_runs_to_its_exit_code() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::Message;

    let (server, rt, _stop) = server().await;
    let url = server.url_for(exec_request(true)).unwrap();
    let mut req = url
        .replace("http://", "ws://")
        .into_client_request()
        .unwrap();
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        "v5.channel.k8s.io".parse().unwrap(),
    );
    let stream = TcpStream::connect(server.base_url().trim_start_matches("http://"))
        .await
        .unwrap();
    let (mut ws, _) = tokio_tungstenite::client_async(req, stream).await.unwrap();
    ws.send(Message::binary(b"\x00ping".to_vec()))
        .await
        .unwrap();
    // v5: close stdin.
    ws.send(Message::binary(vec![255u8, 0])).await.unwrap();
    let (mut stdout, mut stderr, mut error) = (Vec::new(), Vec::new(), Vec::new());
    while let Some(msg) = ws.next().await {
        let Ok(Message::Binary(data)) = msg else {
            continue;
        };
        let Some((ch, rest)) = data.split_first() else {
            continue;
        };
        match ch {
            1 => stdout.extend_from_slice(rest),
            2 => stderr.extend_from_slice(rest),
            3 => error.extend_from_slice(rest),
            _ => {}
        }
    }
    assert_eq!(stdout, b"ping");
    assert_eq!(stderr, b"oops\n");
    let status: serde_json::Value = serde_json::from_slice(&error).unwrap();
    assert_eq!(status["reason"], "NonZeroExitCode");
    assert_eq!(status["details"]["causes"][0]["message"], "4");
    assert_eq!(
        rt.calls.lock().unwrap().as_slice(),
        ["exec c1 [\"cat\"] tty=false"]
    );
}

/// A self-signed certificate for 127.0.0.1 in `dir`: (files, the certificate's DER).
fn self_signed(dir: &std::path::Path) -> (TlsFiles, Vec<u8>) {
    let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let files = TlsFiles {
        cert: dir.join("cert.pem"),
        key: dir.join("key.pem"),
    };
    std::fs::write(&files.cert, ck.cert.pem()).unwrap();
    std::fs::write(&files.key, ck.signing_key.serialize_pem()).unwrap();
    (files, ck.cert.der().to_vec())
}

#[tokio::test]
async fn with_tls_the_urls_are_https_and_a_session_runs_over_tls_only() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_rustls::rustls;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::Message;

    let dir = tempfile::tempdir().unwrap();
    let (files, der) = self_signed(dir.path());
    let (server, _rt, _stop) = server_with(Some(files)).await;
    assert!(
        server.base_url().starts_with("https://127.0.0.1:"),
        "{}",
        server.base_url()
    );
    let addr = server.base_url().trim_start_matches("https://").to_string();

    // Plain HTTP to the TLS port gets no upgrade.
    let url = server.url_for(exec_request(false)).unwrap();
    let head = raw(&url.replace("https://", "http://"), SPDY).await;
    assert!(!head.contains(" 101 "), "{head}");

    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from(der))
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(&addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let tls = connector.connect(name, tcp).await.unwrap();

    let url = server.url_for(exec_request(true)).unwrap();
    let mut req = url
        .replace("https://", "wss://")
        .into_client_request()
        .unwrap();
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        "v5.channel.k8s.io".parse().unwrap(),
    );
    let (mut ws, _) = tokio_tungstenite::client_async(req, tls).await.unwrap();
    ws.send(Message::binary(b"\x00secret".to_vec()))
        .await
        .unwrap();
    ws.send(Message::binary(vec![255u8, 0])).await.unwrap();
    let mut stdout = Vec::new();
    while let Some(Ok(msg)) = ws.next().await {
        if let Message::Binary(data) = msg {
            if let Some((1, rest)) = data.split_first() {
                stdout.extend_from_slice(rest);
            }
        }
    }
    assert_eq!(stdout, b"secret");
}

#[tokio::test]
async fn a_missing_or_bad_tls_file_is_a_named_start_error() {
    let dir = tempfile::tempdir().unwrap();
    let (mut files, _) = self_signed(dir.path());
    files.key = dir.path().join("missing.pem");
    let rt = Arc::new(FakeRuntime::default());
    let config = |tls| test_config(Some(tls));
    let err = StreamServer::bind(config(files.clone()), rt.clone(), Metrics::new(), log())
        .await
        .err()
        .expect("a missing key fails the start");
    assert!(
        matches!(&err, StartError::TlsFile { what: "key", .. }),
        "{err}"
    );
    assert!(err.to_string().contains("missing.pem"), "{err}");
    // A certificate file that holds no certificate: the key where the chain should be.
    files.key = files.cert.clone();
    files.cert = dir.path().join("key.pem");
    let err = StreamServer::bind(config(files), rt, Metrics::new(), log())
        .await
        .err()
        .expect("a key without a certificate fails the start");
    assert!(
        matches!(err, StartError::Tls(_) | StartError::TlsFile { .. }),
        "{err}"
    );
}

/// A connected client on the server's address.
async fn connect(server: &StreamServer) -> TcpStream {
    TcpStream::connect(server.base_url().trim_start_matches("http://"))
        .await
        .unwrap()
}

/// Reads until the server closes `s` (EOF or reset), at most `within`; what it read. Panics
/// if the connection is still open then.
async fn closed_within(s: &mut TcpStream, within: Duration) -> Vec<u8> {
    let mut got = Vec::new();
    let read = tokio::time::timeout(within, async {
        let mut buf = [0u8; 1024];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "still open after {within:?}; read {got:?}");
    got
}

#[tokio::test]
async fn a_client_that_never_finishes_its_request_head_is_closed_after_the_header_timeout() {
    let timeout = Duration::from_millis(300);
    let (server, _, _stop) = server_from(StreamConfig {
        header_read_timeout: timeout,
        ..test_config(None)
    })
    .await;
    let started = tokio::time::Instant::now();
    let mut slow = connect(&server).await;
    slow.write_all(b"GET /exec/x HT").await.unwrap();
    let mut silent = connect(&server).await;
    closed_within(&mut slow, Duration::from_secs(10)).await;
    closed_within(&mut silent, Duration::from_secs(10)).await;
    assert!(started.elapsed() >= timeout, "{:?}", started.elapsed());
    // The server still serves.
    let url = server.url_for(exec_request(false)).unwrap();
    assert!(raw(&url, "").await.starts_with("HTTP/1.1 400"));
}

#[tokio::test]
async fn a_connection_serves_one_request_only() {
    let (server, _, _stop) = server().await;
    let mut s = connect(&server).await;
    let host = server.base_url().trim_start_matches("http://").to_string();
    let request = format!("GET /exec/nope HTTP/1.1\r\nHost: {host}\r\n\r\n");
    s.write_all(request.as_bytes()).await.unwrap();
    let first = closed_within(&mut s, Duration::from_secs(10)).await;
    let first = String::from_utf8_lossy(&first);
    assert!(first.starts_with("HTTP/1.1 404"), "{first}");
    assert!(
        first.to_ascii_lowercase().contains("connection: close"),
        "{first}"
    );
    // Written after the close: nothing answers it.
    let _ = s.write_all(request.as_bytes()).await;
    assert!(closed_within(&mut s, Duration::from_secs(10))
        .await
        .is_empty());
}

#[tokio::test]
async fn connections_over_the_cap_are_closed_at_once_and_counted() {
    let metrics = Metrics::new();
    let rt = Arc::new(FakeRuntime::default());
    let (server, listener) = StreamServer::bind(
        StreamConfig {
            max_connections: 2,
            ..test_config(None)
        },
        rt,
        metrics.clone(),
        log(),
    )
    .await
    .unwrap();
    let (_stop, rx) = watch::channel(false);
    tokio::spawn(server.clone().serve(listener, rx));
    let started = tokio::time::Instant::now();
    let held = [connect(&server).await, connect(&server).await];
    let mut over = connect(&server).await;
    assert!(closed_within(&mut over, Duration::from_secs(5))
        .await
        .is_empty());
    // Closed at once, not after the 10 s header timeout.
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        metrics
            .encode()
            .contains("remora_listener_connections_refused_total{listener=\"streaming\"} 1"),
        "{}",
        metrics.encode()
    );
    // Once a held connection goes, a new one is served again.
    drop(held);
    let url = server.url_for(exec_request(false)).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let head = raw(&url.replace("/exec/", "/exec/x"), "").await;
        if head.starts_with("HTTP/1.1 404") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no connection served after the held ones closed"
        );
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn an_upgraded_session_holds_its_permit_and_ends_once_idle() {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;

    let idle = Duration::from_millis(400);
    let (server, _, _stop) = server_from(StreamConfig {
        max_connections: 1,
        idle_timeout: idle,
        ..test_config(None)
    })
    .await;
    let url = server.url_for(exec_request(true)).unwrap();
    let mut req = url
        .replace("http://", "ws://")
        .into_client_request()
        .unwrap();
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        "v5.channel.k8s.io".parse().unwrap(),
    );
    let started = tokio::time::Instant::now();
    let (ws, _) = tokio_tungstenite::client_async(req, connect(&server).await)
        .await
        .unwrap();
    // The session counts against the cap: another connection is closed at once.
    let mut other = connect(&server).await;
    assert!(closed_within(&mut other, Duration::from_secs(5))
        .await
        .is_empty());
    // The client sends nothing: the session is ended after the idle timeout.
    let mut tcp = ws.into_inner();
    closed_within(&mut tcp, Duration::from_secs(10)).await;
    assert!(started.elapsed() >= idle, "{:?}", started.elapsed());
}
