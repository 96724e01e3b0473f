//! An in-process fake OCI registry on 127.0.0.1 for tests: a handler closure answers every
//! request and [`Fake`] records what it saw. Shared by the registry client and pull tests.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::Response;
use hyper_util::rt::TokioIo;

use super::RegistryConfig;

pub(crate) type Body = BoxBody<Bytes, Infallible>;

/// One request as the fake saw it.
#[derive(Debug, Clone)]
pub(crate) struct Hit {
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) query: String,
    pub(crate) headers: hyper::HeaderMap,
    pub(crate) body: Bytes,
}

impl Hit {
    pub(crate) fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
}

/// A registry served by a handler closure, recording every request.
pub(crate) struct Fake {
    addr: SocketAddr,
    hits: Arc<Mutex<Vec<Hit>>>,
}

impl Fake {
    /// Serves `handler` on 127.0.0.1:0 until the test's runtime ends.
    pub(crate) async fn start(
        handler: impl Fn(&Hit) -> Response<Body> + Send + Sync + 'static,
    ) -> Self {
        Self::start_on("127.0.0.1", handler).await
    }

    /// Serves `handler` on `ip`:0 (another loopback address plays another host).
    pub(crate) async fn start_on(
        ip: &str,
        handler: impl Fn(&Hit) -> Response<Body> + Send + Sync + 'static,
    ) -> Self {
        let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(Mutex::new(Vec::new()));
        let handler = Arc::new(handler);
        let log = hits.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let handler = handler.clone();
                let log = log.clone();
                let svc = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let handler = handler.clone();
                        let log = log.clone();
                        async move {
                            let (parts, body) = req.into_parts();
                            let body = body
                                .collect()
                                .await
                                .map(|b| b.to_bytes())
                                .unwrap_or_default();
                            let hit = Hit {
                                method: parts.method.to_string(),
                                path: parts.uri.path().to_owned(),
                                query: parts.uri.query().unwrap_or("").to_owned(),
                                headers: parts.headers,
                                body,
                            };
                            log.lock().unwrap().push(hit.clone());
                            Ok::<_, Infallible>(handler(&hit))
                        }
                    },
                );
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Self { addr, hits }
    }

    pub(crate) fn host(&self) -> String {
        self.addr.to_string()
    }

    pub(crate) fn hits(&self) -> Vec<Hit> {
        self.hits.lock().unwrap().clone()
    }

    /// Forgets the requests seen so far.
    pub(crate) fn clear_hits(&self) {
        self.hits.lock().unwrap().clear();
    }

    /// `METHOD path` of each request.
    pub(crate) fn log(&self) -> Vec<String> {
        self.hits()
            .iter()
            .map(|h| format!("{} {}", h.method, h.path))
            .collect()
    }
}

/// A response with `status` and `body`.
pub(crate) fn reply(status: u16, body: impl Into<Bytes>) -> Response<Body> {
    Response::builder()
        .status(status)
        .body(Full::new(body.into()).boxed())
        .unwrap()
}

/// A response with `status`, `headers` and `body`.
pub(crate) fn with_headers(
    status: u16,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Response<Body> {
    let mut b = Response::builder().status(status);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::new(body.into()).boxed()).unwrap()
}

/// A body sent `chunk` bytes at a time, one chunk per `every`.
pub(crate) fn trickle(data: Bytes, chunk: usize, every: Duration) -> Response<Body> {
    let len = data.len();
    let s = futures_util::stream::unfold(0usize, move |at| {
        let data = data.clone();
        async move {
            if at >= data.len() {
                return None;
            }
            tokio::time::sleep(every).await;
            let end = (at + chunk).min(data.len());
            Some((Ok::<_, Infallible>(Frame::data(data.slice(at..end))), end))
        }
    });
    Response::builder()
        .status(200)
        .header("content-length", len.to_string())
        .body(BodyExt::boxed(StreamBody::new(s)))
        .unwrap()
}

/// A body of `len` bytes of `byte`, generated 64 KiB at a time as it is read (never held
/// whole), with `declared` as its Content-Length if given (true or not), else none.
pub(crate) fn endless(len: u64, byte: u8, declared: Option<u64>) -> Response<Body> {
    const CHUNK: u64 = 64 << 10;
    let chunk = Bytes::from(vec![byte; CHUNK as usize]);
    let s = futures_util::stream::unfold(0u64, move |sent| {
        let chunk = chunk.clone();
        async move {
            if sent >= len {
                return None;
            }
            let n = CHUNK.min(len - sent);
            Some((
                Ok::<_, Infallible>(Frame::data(chunk.slice(..n as usize))),
                sent + n,
            ))
        }
    });
    let mut response = Response::builder().status(200);
    if let Some(declared) = declared {
        response = response.header("content-length", declared.to_string());
    }
    response.body(BodyExt::boxed(StreamBody::new(s))).unwrap()
}

/// The registry name every test reference uses.
pub(crate) const REGISTRY: &str = "reg.test";

/// A hosts directory sending `reg.test` to `server`, after `mirrors`.
pub(crate) fn hosts_dir(server: &str, mirrors: &[&str]) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let mut text = format!("server = \"http://{server}\"\n");
    for m in mirrors {
        text.push_str(&format!(
            "[host.\"http://{m}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
        ));
    }
    let dir = tmp.path().join(REGISTRY);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("hosts.toml"), text).unwrap();
    tmp
}

/// Client settings with short retry and stall timings.
pub(crate) fn config(dir: &Path) -> RegistryConfig {
    RegistryConfig {
        config_path: Some(dir.to_owned()),
        stall_window: Duration::from_millis(100),
        stall_min_bytes: 100,
        stall_timeout: Duration::from_millis(500),
        retry_min: Duration::from_millis(10),
        retry_max: Duration::from_millis(40),
        max_attempts: 4,
        request_timeout: Duration::from_secs(2),
    }
}
