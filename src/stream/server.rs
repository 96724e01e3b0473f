//! The streaming HTTP server: hands out single-use URLs for `Exec`, `Attach` and
//! `PortForward`, and serves them over SPDY/3.1 or WebSocket.
//!
//! A URL is `http://<address>/<exec|attach|portforward>/<token>`; the token names the CRI
//! request kept in the [`TokenCache`] (single use, expiring), so the client's URL carries no
//! options of its own, as kubelet's streaming server does. An unknown, expired or reused token
//! is answered 404; a request that is not an upgrade to SPDY/3.1 or WebSocket, 400; a protocol
//! version the server does not speak, 403 (SPDY, with the versions it does speak) or 400
//! (WebSocket).
//!
//! Anything that reaches the address can connect, so every connection is bounded
//! ([`crate::listener`]): its request head within `header_read_timeout` (after the TLS
//! handshake, itself bounded), one request per connection, at most `max_connections` open at
//! once (more are closed at once and counted in `remora_listener_connections_refused_total`),
//! and an upgraded session ends once idle for `idle_timeout`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderValue, CONNECTION, UPGRADE};
use hyper::{Method, Request as HttpRequest, Response, StatusCode};
use hyper_util::rt::TokioIo;
use slog::{debug, info, warn, Logger};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit};

use super::portforward::{self, Forwarder};
use super::remotecommand::{self, Options, Outcome, Version};
use super::token::{TokenCache, TokenError};
use super::{spdy, ws};
use crate::io::SessionIo;
use crate::listener::{ConnectionCap, IdleTimeout};
use crate::metrics::Metrics;

/// An upgraded connection as a session gets it: idle timeout and connection permit included.
type Upgraded = IdleTimeout<TokioIo<hyper::upgrade::Upgraded>>;

/// What the streaming server needs of the runtime. Errors are shown to the client as text.
#[async_trait::async_trait]
pub trait StreamBackend: Send + Sync + 'static {
    /// Runs `cmd` in the container with the client's streams; returns the exit code.
    async fn exec(
        &self,
        container_id: &str,
        cmd: Vec<String>,
        tty: bool,
        io: SessionIo,
    ) -> Result<i32, String>;
    /// Attaches the client's streams to the container until either side leaves.
    async fn attach(&self, container_id: &str, io: SessionIo) -> Result<(), String>;
    /// A TCP connection to `port` inside the pod's network namespace.
    async fn port_forward(&self, pod_id: &str, port: u16) -> Result<TcpStream, String>;
}

/// A CRI request waiting for its client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// `Exec`.
    Exec {
        /// The container (full id).
        container_id: String,
        /// The command.
        cmd: Vec<String>,
        /// The streams asked for.
        opts: Options,
    },
    /// `Attach`.
    Attach {
        /// The container (full id).
        container_id: String,
        /// The streams asked for.
        opts: Options,
    },
    /// `PortForward`.
    PortForward {
        /// The pod (full id).
        pod_id: String,
        /// The ports of the CRI request (kubelet names the client's there): the channels of a
        /// WebSocket session. Empty: the URL's `port` parameters name them. SPDY clients name
        /// a port per stream instead.
        ports: Vec<u16>,
    },
}

impl Request {
    fn path(&self) -> &'static str {
        match self {
            Request::Exec { .. } => "exec",
            Request::Attach { .. } => "attach",
            Request::PortForward { .. } => "portforward",
        }
    }
}

/// Settings of the streaming server (`[streaming]`).
#[derive(Debug, Clone)]
pub struct StreamConfig {
    /// Where to listen; port 0 picks a free one.
    pub address: SocketAddr,
    /// How long a URL stays valid.
    pub token_ttl: Duration,
    /// How long a client gets to open its streams after the upgrade.
    pub stream_creation_timeout: Duration,
    /// Serve TLS with this certificate chain and key (PEM files); `None`: plain HTTP.
    pub tls: Option<TlsFiles>,
    /// How long a connection gets to send its request head (after the TLS handshake).
    pub header_read_timeout: Duration,
    /// Connections open at once, upgraded sessions included; more are closed at once.
    pub max_connections: usize,
    /// An upgraded session on which nothing was read or written for this long is ended
    /// (kubelet's `streamingConnectionIdleTimeout`).
    pub idle_timeout: Duration,
}

/// The PEM files of the streaming server's TLS identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, leaf first.
    pub cert: std::path::PathBuf,
    /// The leaf's private key.
    pub key: std::path::PathBuf,
}

/// Most requests waiting for their client at once (kubelet's limit).
const MAX_IN_FLIGHT: usize = 1000;

/// Why the streaming server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The listening socket.
    #[error("cannot listen for streaming on {address}: {source}")]
    Bind {
        /// The address.
        address: SocketAddr,
        source: std::io::Error,
    },
    /// A TLS file could not be read or parsed.
    #[error("cannot load the streaming server's TLS {what} from {}: {source}", path.display())]
    TlsFile {
        /// "certificate" or "key".
        what: &'static str,
        /// The file.
        path: std::path::PathBuf,
        source: tokio_rustls::rustls::pki_types::pem::Error,
    },
    /// The certificate and key do not make a TLS configuration.
    #[error("invalid TLS certificate or key for the streaming server: {0}")]
    Tls(#[source] tokio_rustls::rustls::Error),
}

/// How long a client gets for the TLS handshake.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the HTTP exchange before an upgrade may take beyond the header-read timeout
/// (the answer is a few hundred bytes; this only ends a client that stopped reading).
const RESPONSE_GRACE: Duration = Duration::from_secs(10);

/// The TLS acceptor for `files`: HTTP/1.1 only (SPDY and WebSocket upgrades need it).
fn tls_acceptor(files: &TlsFiles) -> Result<tokio_rustls::TlsAcceptor, StartError> {
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|source| StartError::TlsFile {
            what: "certificate",
            path: files.cert.clone(),
            source,
        })?;
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|source| StartError::TlsFile {
        what: "key",
        path: files.key.clone(),
        source,
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(StartError::Tls)?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(StartError::Tls)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// The streaming server.
pub struct StreamServer {
    tokens: TokenCache<Request>,
    cap: ConnectionCap,
    metrics: Metrics,
    tls: Option<tokio_rustls::TlsAcceptor>,
    base_url: String,
    config: StreamConfig,
    runtime: Arc<dyn StreamBackend>,
    log: Logger,
}

impl StreamServer {
    /// Binds the listening socket; [`serve`](Self::serve) then serves it.
    pub async fn bind(
        config: StreamConfig,
        runtime: Arc<dyn StreamBackend>,
        metrics: Metrics,
        log: Logger,
    ) -> Result<(Arc<StreamServer>, TcpListener), StartError> {
        let listener =
            TcpListener::bind(config.address)
                .await
                .map_err(|source| StartError::Bind {
                    address: config.address,
                    source,
                })?;
        let mut local = listener.local_addr().map_err(|source| StartError::Bind {
            address: config.address,
            source,
        })?;
        // kubelet proxies streams from the node itself, so an unspecified address is reached
        // on loopback.
        if local.ip().is_unspecified() {
            local.set_ip(if local.is_ipv4() {
                std::net::Ipv4Addr::LOCALHOST.into()
            } else {
                std::net::Ipv6Addr::LOCALHOST.into()
            });
        }
        let tls = config.tls.as_ref().map(tls_acceptor).transpose()?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        let server = StreamServer {
            tokens: TokenCache::new(config.token_ttl, MAX_IN_FLIGHT),
            cap: ConnectionCap::new(config.max_connections),
            metrics,
            tls,
            base_url: format!("{scheme}://{local}"),
            config,
            runtime,
            log,
        };
        Ok((Arc::new(server), listener))
    }

    /// The URL prefix handed out, `http://host:port` (`https://` with TLS).
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// Keeps `request` and returns the URL its client connects to.
    pub fn url_for(&self, request: Request) -> Result<String, TokenError> {
        let path = request.path();
        let token = self.tokens.insert(request)?;
        Ok(format!("{}/{path}/{token}", self.base_url))
    }

    /// Serves connections until `shutdown` turns true. Sessions in progress end with the process.
    ///
    /// Each connection holds a permit of the connection cap from its accept until its last
    /// byte (an upgraded session's io keeps it); one accepted over the cap is closed at once.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        mut shutdown: watch::Receiver<bool>,
    ) {
        info!(self.log, "streaming server listening"; "url" => &self.base_url);
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = shutdown.wait_for(|s| *s) => return,
            };
            let (stream, peer) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and the like: back off a little instead of spinning.
                    warn!(self.log, "streaming server cannot accept"; "error" => %e);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Some(permit) = self.cap.try_admit() else {
                self.metrics.connection_refused("streaming");
                debug!(self.log, "streaming connection refused: too many open"; "peer" => %peer, "max" => self.config.max_connections);
                drop(stream);
                continue;
            };
            let permit = Arc::new(permit);
            let me = self.clone();
            tokio::spawn(async move {
                let Some(tls) = me.tls.clone() else {
                    return me.serve_connection(stream, peer, permit).await;
                };
                match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, tls.accept(stream)).await {
                    Ok(Ok(stream)) => me.serve_connection(stream, peer, permit).await,
                    Ok(Err(e)) => {
                        debug!(me.log, "TLS handshake failed"; "peer" => %peer, "error" => %e)
                    }
                    Err(_) => debug!(me.log, "TLS handshake timed out"; "peer" => %peer),
                }
            });
        }
    }

    /// Serves one HTTP/1.1 request (with upgrades) on one accepted connection, with the
    /// limits of [`crate::listener`]: the header-read timeout, a bounded buffer, no keep-alive.
    async fn serve_connection<S>(
        self: Arc<Self>,
        stream: S,
        peer: SocketAddr,
        permit: Arc<OwnedSemaphorePermit>,
    ) where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        let me = self.clone();
        let service = hyper::service::service_fn(move |req| {
            let me = me.clone();
            let permit = permit.clone();
            async move {
                let mut resp = me.handle(req, permit).await;
                crate::listener::close_unless_upgrade(&mut resp);
                Ok::<_, Infallible>(resp)
            }
        });
        let conn = crate::listener::http1_builder(self.config.header_read_timeout)
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades();
        let limit = self.config.header_read_timeout + RESPONSE_GRACE;
        match tokio::time::timeout(limit, conn).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                debug!(self.log, "streaming connection ended with an error"; "peer" => %peer, "error" => %e)
            }
            Err(_) => debug!(self.log, "streaming request not done in time"; "peer" => %peer),
        }
    }

    async fn handle(
        self: Arc<Self>,
        req: HttpRequest<Incoming>,
        permit: Arc<OwnedSemaphorePermit>,
    ) -> Response<Full<Bytes>> {
        if req.method() != Method::GET && req.method() != Method::POST {
            return plain(
                StatusCode::METHOD_NOT_ALLOWED,
                "only GET and POST are served",
            );
        }
        let mut parts = req.uri().path().trim_start_matches('/').splitn(2, '/');
        let (kind, token) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        if !matches!(kind, "exec" | "attach" | "portforward") || token.is_empty() {
            return plain(StatusCode::NOT_FOUND, "not found");
        }
        let Some(request) = self.tokens.take(token) else {
            return plain(
                StatusCode::NOT_FOUND,
                "unknown, expired or already used streaming token",
            );
        };
        if request.path() != kind {
            return plain(
                StatusCode::NOT_FOUND,
                "the token is not for this kind of stream",
            );
        }
        if is_websocket(req.headers()) {
            self.upgrade_websocket(req, request, permit)
        } else if upgrade_names(req.headers(), "spdy/3.1") {
            self.upgrade_spdy(req, request, permit)
        } else {
            plain(
                StatusCode::BAD_REQUEST,
                "an upgrade to SPDY/3.1 or WebSocket is required",
            )
        }
    }

    fn upgrade_spdy(
        self: Arc<Self>,
        mut req: HttpRequest<Incoming>,
        request: Request,
        permit: Arc<OwnedSemaphorePermit>,
    ) -> Response<Full<Bytes>> {
        let offered = header_list(req.headers(), "x-stream-protocol-version");
        let supported: Vec<&str> = match &request {
            Request::PortForward { .. } => vec![portforward::SPDY_PROTOCOL],
            _ => remotecommand::SPDY_PROTOCOLS
                .iter()
                .map(|(n, _)| *n)
                .collect(),
        };
        // The server's order of preference, as kubelet's handshake; a client that names no
        // version gets the oldest the server speaks.
        let chosen = if offered.is_empty() {
            None
        } else {
            match supported.iter().find(|s| offered.iter().any(|o| o == *s)) {
                Some(s) => Some(*s),
                None => {
                    let mut resp = plain(
                        StatusCode::FORBIDDEN,
                        &format!(
                            "unable to upgrade: unable to negotiate protocol: client supports {offered:?}, server supports {supported:?}"
                        ),
                    );
                    for s in &supported {
                        resp.headers_mut().append(
                            "X-Accepted-Stream-Protocol-Versions",
                            HeaderValue::from_static(s),
                        );
                    }
                    return resp;
                }
            }
        };
        let version = match chosen {
            None => Version::V2,
            Some(name) => remotecommand::SPDY_PROTOCOLS
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| *v)
                .unwrap_or(Version::V2),
        };
        self.on_upgraded(&mut req, "SPDY/3.1", permit, move |me, io| async move {
            let (session, incoming) = spdy::serve(io, me.log.clone());
            me.run_spdy(session, incoming, request, version).await;
        });
        let mut resp = Response::new(Full::new(Bytes::new()));
        *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let h = resp.headers_mut();
        h.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
        h.insert(UPGRADE, HeaderValue::from_static("SPDY/3.1"));
        if let Some(name) = chosen {
            h.insert("X-Stream-Protocol-Version", HeaderValue::from_static(name));
        }
        resp
    }

    /// Runs `session` on the connection once hyper hands it over, after the 101 answer. Its
    /// io ends the session after the idle timeout and holds the connection's permit.
    fn on_upgraded<F, Fut>(
        self: &Arc<Self>,
        req: &mut HttpRequest<Incoming>,
        protocol: &'static str,
        permit: Arc<OwnedSemaphorePermit>,
        session: F,
    ) where
        F: FnOnce(Arc<Self>, Upgraded) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let on_upgrade = hyper::upgrade::on(req);
        let me = self.clone();
        tokio::spawn(async move {
            match on_upgrade.await {
                Ok(u) => {
                    let io =
                        IdleTimeout::new(TokioIo::new(u), me.config.idle_timeout).holding(permit);
                    session(me, io).await
                }
                Err(e) => {
                    debug!(me.log, "upgrade failed"; "protocol" => protocol, "error" => %e)
                }
            }
        });
    }

    async fn run_spdy(
        self: Arc<Self>,
        session: spdy::Session,
        incoming: spdy::Incoming,
        request: Request,
        version: Version,
    ) {
        match request {
            Request::PortForward { pod_id, .. } => {
                let forwarder = self.forwarder(&pod_id);
                portforward::serve_spdy(
                    session,
                    incoming,
                    pod_id,
                    forwarder,
                    self.config.stream_creation_timeout,
                    self.log.clone(),
                )
                .await
            }
            Request::Exec { opts, .. } | Request::Attach { opts, .. } => {
                let gathered = remotecommand::gather_spdy(
                    session.clone(),
                    incoming,
                    version,
                    opts,
                    self.config.stream_creation_timeout,
                    &self.log,
                )
                .await;
                match gathered {
                    Ok(g) => self.run_session(request, g).await,
                    Err(e) => {
                        warn!(self.log, "streaming session not started"; "error" => %e);
                        session.close().await;
                    }
                }
            }
        }
    }

    fn upgrade_websocket(
        self: Arc<Self>,
        mut req: HttpRequest<Incoming>,
        request: Request,
        permit: Arc<OwnedSemaphorePermit>,
    ) -> Response<Full<Bytes>> {
        let Some(key) = req.headers().get("sec-websocket-key").cloned() else {
            return plain(StatusCode::BAD_REQUEST, "missing Sec-WebSocket-Key");
        };
        if req
            .headers()
            .get("sec-websocket-version")
            .is_none_or(|v| v.as_bytes() != b"13")
        {
            let mut resp = plain(StatusCode::BAD_REQUEST, "unsupported WebSocket version");
            resp.headers_mut()
                .insert("Sec-WebSocket-Version", HeaderValue::from_static("13"));
            return resp;
        }
        let mut offered = header_list(req.headers(), "sec-websocket-protocol");
        if offered.is_empty() {
            offered.push(String::new());
        }
        enum Plan {
            Command(Version, ws::Framing),
            Tunnel,
            Channels(ws::Framing, Vec<u16>),
        }
        let mut plan = None;
        let mut chosen = "";
        // The client's order, as wsstream's handshake.
        'find: for o in &offered {
            match &request {
                Request::PortForward { ports, .. } => {
                    if o == portforward::WS_TUNNEL_PROTOCOL {
                        plan = Some(Plan::Tunnel);
                        chosen = portforward::WS_TUNNEL_PROTOCOL;
                        break 'find;
                    }
                    let framing = if o.is_empty() {
                        Some(("", ws::Framing::Binary))
                    } else {
                        portforward::WS_PROTOCOLS
                            .iter()
                            .find(|(n, _)| n == o)
                            .map(|(n, f)| (*n, *f))
                    };
                    if let Some((name, framing)) = framing {
                        // kubelet proxies to this URL as it is, without the client's query:
                        // its ports came with the CRI request.
                        let ports = if ports.is_empty() {
                            match portforward::parse_ports(req.uri().query()) {
                                Ok(p) => p,
                                Err(e) => return plain(StatusCode::BAD_REQUEST, &e),
                            }
                        } else {
                            ports.clone()
                        };
                        plan = Some(Plan::Channels(framing, ports));
                        chosen = name;
                        break 'find;
                    }
                }
                _ => {
                    let found = if o.is_empty() {
                        Some(("", Version::V2, ws::Framing::Binary))
                    } else {
                        remotecommand::WS_PROTOCOLS
                            .iter()
                            .find(|(n, _, _)| n == o)
                            .copied()
                    };
                    if let Some((name, version, framing)) = found {
                        plan = Some(Plan::Command(version, framing));
                        chosen = name;
                        break 'find;
                    }
                }
            }
        }
        let Some(plan) = plan else {
            return plain(
                StatusCode::BAD_REQUEST,
                &format!("requested WebSocket protocol(s) {offered:?} are not supported"),
            );
        };
        self.on_upgraded(&mut req, "websocket", permit, move |me, io| async move {
            match (plan, request) {
                (Plan::Tunnel, Request::PortForward { pod_id, .. }) => {
                    let (session, incoming) = spdy::serve(ws::Tunnel::new(io), me.log.clone());
                    let forwarder = me.forwarder(&pod_id);
                    portforward::serve_spdy(
                        session,
                        incoming,
                        pod_id,
                        forwarder,
                        me.config.stream_creation_timeout,
                        me.log.clone(),
                    )
                    .await
                }
                (Plan::Channels(framing, ports), Request::PortForward { pod_id, .. }) => {
                    let options = ws::ChannelOptions {
                        framing,
                        close_signal: false,
                        channels: portforward::ws_channels(&ports),
                    };
                    let (conn, channels) = ws::channels(io, options, me.log.clone());
                    let forwarder = me.forwarder(&pod_id);
                    portforward::serve_ws(conn, channels, ports, pod_id, forwarder, me.log.clone())
                        .await
                }
                (Plan::Command(version, framing), request) => {
                    let opts = match &request {
                        Request::Exec { opts, .. } | Request::Attach { opts, .. } => *opts,
                        Request::PortForward { .. } => return,
                    };
                    let options = ws::ChannelOptions {
                        framing,
                        close_signal: version == Version::V5,
                        channels: remotecommand::ws_channels(opts),
                    };
                    let (conn, channels) = ws::channels(io, options, me.log.clone());
                    let gathered =
                        remotecommand::gather_ws(conn, channels, version, opts, &me.log).await;
                    me.run_session(request, gathered).await
                }
                // A plan is only made for its own kind of request.
                _ => {}
            }
        });
        let mut resp = Response::new(Full::new(Bytes::new()));
        *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let h = resp.headers_mut();
        h.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
        h.insert(UPGRADE, HeaderValue::from_static("websocket"));
        if let Ok(v) = HeaderValue::from_str(&ws::accept_key(key.as_bytes())) {
            h.insert("Sec-WebSocket-Accept", v);
        }
        if !chosen.is_empty() {
            h.insert("Sec-WebSocket-Protocol", HeaderValue::from_static(chosen));
        }
        resp
    }

    async fn run_session(&self, request: Request, gathered: remotecommand::Gathered) {
        let remotecommand::Gathered { io, finisher } = gathered;
        let outcome = match &request {
            Request::Exec {
                container_id,
                cmd,
                opts,
            } => {
                match self
                    .runtime
                    .exec(container_id, cmd.clone(), opts.tty, io)
                    .await
                {
                    Ok(0) => Outcome::Success,
                    Ok(code) => Outcome::Exited(code),
                    Err(e) => {
                        warn!(self.log, "exec session failed"; "container_id" => container_id, "error" => &e);
                        Outcome::Failed(format!("error executing command in container: {e}"))
                    }
                }
            }
            Request::Attach { container_id, .. } => {
                match self.runtime.attach(container_id, io).await {
                    Ok(()) => Outcome::Success,
                    Err(e) => {
                        warn!(self.log, "attach session failed"; "container_id" => container_id, "error" => &e);
                        Outcome::Failed(format!("error attaching to container: {e}"))
                    }
                }
            }
            Request::PortForward { .. } => return,
        };
        finisher.finish(&outcome, &self.log).await;
    }

    fn forwarder(&self, pod_id: &str) -> Forwarder {
        let runtime = self.runtime.clone();
        let pod_id = pod_id.to_string();
        Arc::new(move |port| {
            let runtime = runtime.clone();
            let pod_id = pod_id.clone();
            Box::pin(async move { runtime.port_forward(&pod_id, port).await })
        })
    }
}

fn plain(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(format!("{body}\n"))));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// Every value of a header that may repeat and hold comma-separated lists.
fn header_list(headers: &HeaderMap, name: &str) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect()
}

fn upgrade_names(headers: &HeaderMap, protocol: &str) -> bool {
    header_list(headers, "upgrade")
        .iter()
        .any(|u| u.eq_ignore_ascii_case(protocol))
        && header_list(headers, "connection")
            .iter()
            .any(|c| c.eq_ignore_ascii_case("upgrade"))
}

fn is_websocket(headers: &HeaderMap) -> bool {
    upgrade_names(headers, "websocket")
}

#[cfg(test)]
mod tests;
