//! The status socket: a root-only unix socket beside the CRI socket on which remora answers
//! operators' questions the CRI has no call for. `GET /pulls` answers the pulls in flight
//! (`images::progress`) as JSON, which `remora pulls` prints.
//!
//! It is always on: the CRI socket's directory is remora's (made 0711 by the daemon), the
//! socket is 0600, and what it answers is read-only. Its limits are those of every listener of
//! remora's (`crate::listener`): one request per connection, 10 s for the request head, 30 s
//! for the whole, at most [`MAX_CONNECTIONS`] at once.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use slog::{info, Logger};
use thiserror::Error;
use tokio::sync::watch;

use crate::images::progress::{human_bytes, Progress, PullView, PullsView};
use crate::listener::{answer, TEXT_PLAIN};

/// Connections open at once on the status socket.
pub const MAX_CONNECTIONS: usize = 8;
/// The most of an answer `remora pulls` reads (256 pulls take about 100 KiB).
pub const MAX_ANSWER: u64 = 4 << 20;
/// How long `remora pulls` waits for remora's answer.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

/// The status socket of the CRI socket `cri_socket`: beside it, `<stem>-status.sock`
/// (`/run/remora/remora.sock` → `/run/remora/remora-status.sock`).
pub fn socket_path(cri_socket: &Path) -> PathBuf {
    let stem = cri_socket
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "remora".into());
    cri_socket.with_file_name(format!("{stem}-status.sock"))
}

/// Answers one request: `GET /pulls` with the pulls in flight as JSON.
fn respond<B>(progress: &Progress, req: &Request<B>) -> Response<Full<Bytes>> {
    if req.uri().path() != "/pulls" {
        return answer(StatusCode::NOT_FOUND, TEXT_PLAIN, "not found; try /pulls\n");
    }
    if req.method() != Method::GET {
        return crate::listener::method_not_allowed("GET");
    }
    match serde_json::to_vec(&progress.view(Instant::now())) {
        Ok(body) => answer(StatusCode::OK, "application/json", body),
        // Plain structs of numbers and strings: serde_json does not fail on them.
        Err(e) => answer(
            StatusCode::INTERNAL_SERVER_ERROR,
            TEXT_PLAIN,
            format!("{e}\n"),
        ),
    }
}

/// Serves the status socket on `listener` until `stop` turns true.
pub async fn serve(
    progress: Progress,
    listener: tokio::net::UnixListener,
    stop: watch::Receiver<bool>,
    log: Logger,
) {
    if let Ok(addr) = listener.local_addr() {
        if let Some(path) = addr.as_pathname() {
            info!(log, "serving status"; "socket" => %path.display());
        }
    }
    let limits = crate::listener::RequestLimits {
        header_read_timeout: Duration::from_secs(10),
        connection_timeout: Duration::from_secs(30),
        max_connections: MAX_CONNECTIONS,
    };
    crate::listener::serve_requests(
        listener,
        limits,
        move |req| respond(&progress, req),
        || {},
        stop,
        log,
        "status",
    )
    .await;
}

/// Why `remora pulls` has no answer.
#[derive(Debug, Error)]
pub enum ClientError {
    /// The socket is not there or refuses: remora is not running (with this config).
    #[error("cannot reach remora's status socket {}: {source} (is remora running with this config?)", socket.display())]
    Connect {
        /// The socket.
        socket: PathBuf,
        /// The connect's error.
        source: std::io::Error,
    },
    /// Reading or writing failed, or took over [`CLIENT_TIMEOUT`].
    #[error("talking to {}: {source}", socket.display())]
    Io {
        /// The socket.
        socket: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The answer is not HTTP 200 with a JSON table of pulls.
    #[error("{} answered something unexpected: {what}", socket.display())]
    Answer {
        /// The socket.
        socket: PathBuf,
        /// What was wrong.
        what: String,
    },
}

/// Asks the status socket at `socket` for the pulls in flight.
pub fn fetch_pulls(socket: &Path) -> Result<PullsView, ClientError> {
    let io = |source| ClientError::Io {
        socket: socket.to_path_buf(),
        source,
    };
    let mut stream = UnixStream::connect(socket).map_err(|source| ClientError::Connect {
        socket: socket.to_path_buf(),
        source,
    })?;
    stream.set_read_timeout(Some(CLIENT_TIMEOUT)).map_err(io)?;
    stream.set_write_timeout(Some(CLIENT_TIMEOUT)).map_err(io)?;
    stream
        .write_all(b"GET /pulls HTTP/1.1\r\nHost: remora\r\nConnection: close\r\n\r\n")
        .map_err(io)?;
    let mut raw = Vec::new();
    stream
        .take(MAX_ANSWER + 1)
        .read_to_end(&mut raw)
        .map_err(io)?;
    parse_answer(&raw).map_err(|what| ClientError::Answer {
        socket: socket.to_path_buf(),
        what,
    })
}

/// The table of pulls in a raw HTTP/1.1 answer (status 200, a body of JSON; the server closes
/// the connection after it, so the body is all that follows the head).
fn parse_answer(raw: &[u8]) -> Result<PullsView, String> {
    if raw.len() as u64 > MAX_ANSWER {
        return Err(format!("an answer over {MAX_ANSWER} bytes"));
    }
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no end of the HTTP head")?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(format!("status {status:?}"));
    }
    let body = &raw[split + 4..];
    if head
        .lines()
        .any(|l| l.to_ascii_lowercase().starts_with("transfer-encoding:"))
    {
        return Err("a chunked body (remora sends its length)".into());
    }
    serde_json::from_slice(body).map_err(|e| format!("not a table of pulls: {e}"))
}

/// A bar of `width` cells, `done` of `total` filled.
fn bar(done: u64, total: u64, width: usize) -> String {
    let filled = if total == 0 {
        0
    } else {
        ((done.min(total) as u128 * width as u128) / total as u128) as usize
    };
    format!("[{}{}]", "#".repeat(filled), ".".repeat(width - filled))
}

/// One line of `remora pulls` for `p`.
fn line(p: &PullView) -> String {
    let percent = if p.bytes == 0 {
        0
    } else {
        (p.bytes_done.min(p.bytes) as u128 * 100 / p.bytes as u128) as u64
    };
    let rate = p
        .rate_bytes_per_sec
        .map(|r| format!("{}/s", human_bytes(r)))
        .unwrap_or_else(|| "-".into());
    format!(
        "{:<40} {:<11} {:>5}/{:<5} {:>3} {} {:>3}% {:>21} {:>12} {:>6}s",
        p.image,
        p.phase.name(),
        p.layers_stored,
        p.layers,
        p.layers_unpacked,
        bar(p.bytes_done, p.bytes, 20),
        percent,
        format!("{}/{}", human_bytes(p.bytes_done), human_bytes(p.bytes)),
        rate,
        p.elapsed_secs as u64,
    )
}

/// `remora pulls`' table: a head, one line per pull, the untracked count.
pub fn render(view: &PullsView) -> String {
    let mut out = format!(
        "{:<40} {:<11} {:>11} {:>3} {:<22} {:>4} {:>21} {:>12} {:>7}\n",
        "IMAGE", "PHASE", "LAYERS", "UNP", "PROGRESS", "", "BYTES", "RATE", "ELAPSED"
    );
    for p in &view.pulls {
        out.push_str(&line(p));
        out.push('\n');
    }
    if view.pulls.is_empty() {
        out.push_str("(no pulls in flight)\n");
    }
    if view.untracked > 0 {
        out.push_str(&format!(
            "and {} more pulls, beyond the tracked ones\n",
            view.untracked
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::images::progress::{LayerState, Phase};

    #[test]
    fn the_status_socket_sits_beside_the_cri_socket() {
        assert_eq!(
            socket_path(Path::new("/run/remora/remora.sock")),
            PathBuf::from("/run/remora/remora-status.sock")
        );
        assert_eq!(
            socket_path(Path::new("/tmp/t/cri")),
            PathBuf::from("/tmp/t/cri-status.sock")
        );
    }

    #[test]
    fn only_get_pulls_is_answered() {
        let progress = Progress::new();
        let pull = progress.start("registry.test/a:1");
        pull.layers([("sha256:a", 10)]);
        pull.layer("sha256:a", LayerState::Stored);
        let get = |path: &str, method: Method| {
            respond(
                &progress,
                &Request::builder()
                    .method(method)
                    .uri(path)
                    .body(())
                    .expect("a request"),
            )
        };
        let ok = get("/pulls", Method::GET);
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(get("/pull", Method::GET).status(), StatusCode::NOT_FOUND);
        let post = get("/pulls", Method::POST);
        assert_eq!(post.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(
            post.headers()
                .get(hyper::header::ALLOW)
                .map(|v| v.as_bytes()),
            Some(&b"GET"[..]),
            "a 405 names the methods the resource takes"
        );
    }

    #[tokio::test]
    async fn remora_pulls_reads_what_the_socket_serves() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("s-status.sock");
        let listener = tokio::net::UnixListener::bind(&path).expect("bind");
        let progress = Progress::new();
        let pull = progress.start("registry.test/big:1");
        pull.layers([("sha256:a", 1000), ("sha256:b", 3000)]);
        pull.bytes_of("sha256:b").expect("layer b").add(1500);
        pull.layer("sha256:a", LayerState::Present);
        let (stop_tx, stop) = watch::channel(false);
        let log = Logger::root(slog::Discard, slog::o!());
        let server = tokio::spawn(serve(progress.clone(), listener, stop, log));
        let asked = path.clone();
        let view = tokio::task::spawn_blocking(move || fetch_pulls(&asked))
            .await
            .expect("the client thread")
            .expect("an answer");
        assert_eq!(view.pulls.len(), 1);
        let p = &view.pulls[0];
        assert_eq!(p.image, "registry.test/big:1");
        assert_eq!(p.phase, Phase::Downloading);
        assert_eq!((p.layers, p.layers_stored, p.layers_present), (2, 1, 1));
        assert_eq!((p.bytes_done, p.bytes), (2500, 4000));
        let table = render(&view);
        assert!(
            table.contains("registry.test/big:1") && table.contains("62%"),
            "{table}"
        );
        assert!(table.contains("[############........]"), "{table}");
        drop(pull);
        let asked = path.clone();
        let empty = tokio::task::spawn_blocking(move || fetch_pulls(&asked))
            .await
            .expect("the client thread")
            .expect("an answer");
        assert_eq!(empty, PullsView::default());
        assert!(render(&empty).contains("no pulls in flight"));
        stop_tx.send(true).expect("the server listens");
        server.await.expect("the server ends");
        // Nothing listens now: the client says so, naming the socket.
        let err = fetch_pulls(&path).expect_err("no server");
        assert!(matches!(err, ClientError::Connect { .. }), "{err}");
        assert!(err.to_string().contains("s-status.sock"), "{err}");
    }

    #[test]
    fn answers_that_are_not_a_table_of_pulls_are_refused() {
        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 27\r\n\r\n{\"pulls\":[],\"untracked\":0}";
        assert_eq!(parse_answer(ok), Ok(PullsView::default()));
        assert!(parse_answer(b"HTTP/1.1 404 Not Found\r\n\r\nnot found")
            .unwrap_err()
            .contains("404"));
        assert!(parse_answer(b"HTTP/1.1 200 OK\r\n\r\n{\"pulls\":3}")
            .unwrap_err()
            .contains("not a table"));
        assert!(parse_answer(b"HTTP/1.1 200 OK").is_err());
        let huge = vec![b'x'; MAX_ANSWER as usize + 1];
        assert!(parse_answer(&huge).unwrap_err().contains("over"));
    }

    #[test]
    fn the_bar_fills_with_the_bytes() {
        assert_eq!(bar(0, 100, 10), "[..........]");
        assert_eq!(bar(50, 100, 10), "[#####.....]");
        assert_eq!(bar(100, 100, 10), "[##########]");
        assert_eq!(bar(500, 100, 10), "[##########]", "more than the total");
        assert_eq!(bar(5, 0, 10), "[..........]", "nothing known yet");
    }
}
