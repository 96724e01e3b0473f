//! kubelet's port-forward protocol over SPDY (`portforward.k8s.io`: one data and one error
//! stream per forwarded connection, paired by the `requestID` header; also tunnelled in a
//! WebSocket as `SPDY/3.1+portforward.k8s.io`) or plain WebSocket channels (one data and one
//! error channel per port named in the URL's `port` parameters, each opened with the port
//! number as two little-endian bytes).
//!
//! Each forwarded connection is a TCP connection the runtime made into the pod's network
//! namespace ([`Forwarder`]); the bytes are copied both ways, a half-close is passed on as a
//! half-close, and an error goes to the client on the error stream.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use slog::{debug, Logger};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use super::{spdy, ws};
use crate::io::{ClientRead, ClientWrite};

/// The SPDY port-forward protocol.
pub const SPDY_PROTOCOL: &str = "portforward.k8s.io";
/// The WebSocket subprotocol of SPDY tunnelled in WebSocket (client-go's default since 1.31).
pub const WS_TUNNEL_PROTOCOL: &str = "SPDY/3.1+portforward.k8s.io";
/// WebSocket channel subprotocols and their framing.
pub const WS_PROTOCOLS: &[(&str, ws::Framing)] = &[
    ("v4.channel.k8s.io", ws::Framing::Binary),
    ("v4.base64.channel.k8s.io", ws::Framing::Base64),
    ("portforward.k8s.io", ws::Framing::Binary),
    ("base64.portforward.k8s.io", ws::Framing::Base64),
];

/// Bytes read from the pod's connection at once.
const COPY_BUFFER: usize = 64 * 1024;

/// Connects to a port of the pod being forwarded to.
pub type Forwarder = Arc<
    dyn Fn(u16) -> Pin<Box<dyn Future<Output = Result<TcpStream, String>> + Send>> + Send + Sync,
>;

/// Parses the URL's `port` parameters (`port=80&port=8080`, or `port=80,8080`).
pub fn parse_ports(query: Option<&str>) -> Result<Vec<u16>, String> {
    let mut ports = Vec::new();
    for (k, v) in url::form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        if k != "port" {
            continue;
        }
        if v.is_empty() {
            return Err("query parameter \"port\" cannot be empty".into());
        }
        for p in v.split(',') {
            match p.parse::<u16>() {
                Ok(0) => return Err(format!("port {p:?} must be > 0")),
                Ok(port) => ports.push(port),
                Err(_) => return Err(format!("unable to parse {p:?} as a port")),
            }
        }
    }
    if ports.is_empty() {
        return Err("query parameter \"port\" is required".into());
    }
    Ok(ports)
}

/// Copies between the client's data stream and the pod's connection until both directions
/// ended: the client's EOF half-closes the pod connection, the pod's EOF ends the client's
/// stream.
async fn copy_both_ways<R, W>(mut from_client: R, mut to_client: W, conn: TcpStream)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let (from_pod, mut to_pod) = conn.into_split();
    let up = async {
        let _ = tokio::io::copy(&mut from_client, &mut to_pod).await;
        let _ = to_pod.shutdown().await;
    };
    // Reads of up to 64 KiB from the pod: fewer, fuller frames to the client than
    // `tokio::io::copy`'s 8 KiB buffer makes.
    let down = async {
        let mut from_pod = tokio::io::BufReader::with_capacity(COPY_BUFFER, from_pod);
        let _ = tokio::io::copy_buf(&mut from_pod, &mut to_client).await;
        let _ = to_client.shutdown().await;
    };
    tokio::join!(up, down);
}

async fn forward_one(
    port: u16,
    data_in: ClientRead,
    data_out: ClientWrite,
    mut error: ClientWrite,
    forwarder: Forwarder,
    pod_id: String,
    log: Logger,
) {
    match forwarder(port).await {
        Ok(conn) => copy_both_ways(data_in, data_out, conn).await,
        Err(e) => {
            let msg = format!("error forwarding port {port} to pod {pod_id}: {e}");
            debug!(log, "port-forward failed"; "pod_id" => &pod_id, "port" => port, "error" => &e);
            let _ = error.write_all(msg.as_bytes()).await;
            drop(data_out);
        }
    }
    let _ = error.shutdown().await;
}

#[derive(Default)]
struct Pair {
    port: Option<u16>,
    data: Option<(ClientRead, ClientWrite)>,
    error: Option<ClientWrite>,
}

/// Serves a SPDY port-forward session until the client closes it.
pub async fn serve_spdy(
    session: spdy::Session,
    mut incoming: spdy::Incoming,
    pod_id: String,
    forwarder: Forwarder,
    pair_timeout: Duration,
    log: Logger,
) {
    let mut pairs: HashMap<String, Pair> = HashMap::new();
    let mut expiries: JoinSet<String> = JoinSet::new();
    let mut forwards: JoinSet<()> = JoinSet::new();
    loop {
        tokio::select! {
            stream = incoming.next() => {
                let Some(stream) = stream else { break };
                let kind = stream.header("streamtype").unwrap_or("").to_string();
                let port = stream.header("port").unwrap_or("").to_string();
                let request = match stream.header("requestid") {
                    Some(r) if !r.is_empty() => r.to_string(),
                    // Old clients send no request id: their streams come in (error, data) pairs
                    // with consecutive odd ids, as kubelet assumes.
                    _ => match kind.as_str() {
                        "data" => stream.id().saturating_sub(2).to_string(),
                        _ => stream.id().to_string(),
                    },
                };
                let port = match port.parse::<u16>() {
                    Ok(p) if p > 0 => p,
                    _ => {
                        debug!(log, "port-forward stream without a valid port; closed"; "port" => &port);
                        continue;
                    }
                };
                let (r, w) = stream.split();
                let fresh = !pairs.contains_key(&request);
                let pair = pairs.entry(request.clone()).or_default();
                pair.port.get_or_insert(port);
                match kind.as_str() {
                    "data" if pair.data.is_none() => pair.data = Some((Box::pin(r), Box::pin(w))),
                    "error" if pair.error.is_none() => pair.error = Some(Box::pin(w)),
                    other => {
                        debug!(log, "unexpected port-forward stream; closed"; "stream_type" => other, "request" => &request);
                        continue;
                    }
                }
                if fresh {
                    let request = request.clone();
                    expiries.spawn(async move {
                        tokio::time::sleep(pair_timeout).await;
                        request
                    });
                }
                if pair.data.is_some() && pair.error.is_some() {
                    if let Some(Pair { port: Some(port), data: Some((r, w)), error: Some(e) }) = pairs.remove(&request) {
                        forwards.spawn(forward_one(port, r, w, e, forwarder.clone(), pod_id.clone(), log.clone()));
                    }
                }
            }
            Some(Ok(request)) = expiries.join_next(), if !expiries.is_empty() => {
                if let Some(mut pair) = pairs.remove(&request) {
                    if let Some(e) = pair.error.as_mut() {
                        let msg = format!("timed out waiting for the streams of request {request}");
                        let _ = e.write_all(msg.as_bytes()).await;
                        let _ = e.shutdown().await;
                    }
                }
            }
            Some(_) = forwards.join_next(), if !forwards.is_empty() => {}
        }
    }
    // The client is gone: every connection it forwarded ends with it.
    forwards.shutdown().await;
    session.close().await;
}

/// The WebSocket channels of a port-forward session on `ports`: (data, error) per port.
pub fn ws_channels(ports: &[u16]) -> Vec<ws::ChannelKind> {
    ports
        .iter()
        .flat_map(|_| [ws::ChannelKind::ReadWrite, ws::ChannelKind::Write])
        .collect()
}

/// Serves a WebSocket port-forward session: one connection per port, until each has ended.
pub async fn serve_ws(
    conn: ws::ChannelConn,
    channels: Vec<ws::Channel>,
    ports: Vec<u16>,
    pod_id: String,
    forwarder: Forwarder,
    log: Logger,
) {
    let mut forwards = JoinSet::new();
    let mut channels = channels.into_iter();
    for port in ports {
        let (Some(data), Some(error)) = (channels.next(), channels.next()) else {
            break;
        };
        let (Some(r), Some(mut w), Some(mut e)) = (data.reader, data.writer, error.writer) else {
            continue;
        };
        // Each channel opens with its port, so the client knows which is which.
        let tag = port.to_le_bytes();
        if w.write_all(&tag).await.is_err() || e.write_all(&tag).await.is_err() {
            break;
        }
        forwards.spawn(forward_one(
            port,
            r,
            w,
            e,
            forwarder.clone(),
            pod_id.clone(),
            log.clone(),
        ));
    }
    tokio::select! {
        _ = async { while forwards.join_next().await.is_some() {} } => {}
        _ = conn.closed() => forwards.shutdown().await,
    }
    conn.close().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Any query (percent-encoding, separators, numbers out of range): parsing never panics,
    /// and what it accepts is a non-empty list of ports, none 0.
    #[test]
    fn arbitrary_queries_never_panic_the_port_parser() {
        use proptest::prelude::*;
        use proptest::test_runner::{Config, TestRunner};
        let query = prop_oneof![
            "[ -~]{0,80}",
            proptest::collection::vec(
                ("(port|pOrt|x|)", "[0-9,%+ a-f]{0,12}").prop_map(|(k, v)| format!("{k}={v}")),
                0..6
            )
            .prop_map(|pairs| pairs.join("&")),
        ];
        TestRunner::new(Config {
            cases: 512,
            failure_persistence: None,
            ..Config::default()
        })
        .run(&proptest::option::of(query), |q| {
            if let Ok(ports) = parse_ports(q.as_deref()) {
                prop_assert!(!ports.is_empty() && !ports.contains(&0));
            }
            Ok(())
        })
        .unwrap();
    }

    #[test]
    fn ports_come_from_repeated_and_comma_separated_parameters() {
        assert_eq!(
            parse_ports(Some("port=80&port=8080,9090")).unwrap(),
            vec![80, 8080, 9090]
        );
        assert!(parse_ports(Some("port=0")).unwrap_err().contains("> 0"));
        assert!(parse_ports(Some("port=x"))
            .unwrap_err()
            .contains("unable to parse"));
        assert!(parse_ports(Some("port=")).unwrap_err().contains("empty"));
        assert!(parse_ports(None).unwrap_err().contains("required"));
    }

    #[tokio::test]
    async fn bytes_cross_both_ways_and_half_closes_are_passed_on() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            let (mut s, _) = listener.accept().await.unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).await.unwrap();
            s.write_all(&got).await.unwrap();
            s.write_all(b"!").await.unwrap();
        });
        let conn = TcpStream::connect(addr).await.unwrap();
        let (mut client_w, server_r) = tokio::io::duplex(1024);
        let (server_w, mut client_r) = tokio::io::duplex(1024);
        let copier = tokio::spawn(copy_both_ways(server_r, server_w, conn));
        client_w.write_all(b"hello").await.unwrap();
        drop(client_w);
        let mut back = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut client_r, &mut back)
            .await
            .unwrap();
        assert_eq!(back, b"hello!");
        copier.await.unwrap();
        server.await.unwrap();
    }
}
