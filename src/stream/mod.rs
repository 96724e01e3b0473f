//! The streaming server: what `kubectl exec`, `attach` and `port-forward` reach through
//! kubelet. `Exec`, `Attach` and `PortForward` hand out a URL on this server with a single-use
//! token ([`token`]); the client (kubelet's proxy, crictl, critest) connects to it and upgrades
//! to SPDY/3.1 ([`spdy`]) or WebSocket ([`ws`]); [`remotecommand`] and [`portforward`] speak
//! kubelet's stream protocols over either, and hand the streams to the runtime as a
//! transport-neutral [`crate::io::SessionIo`] or a connected TCP stream ([`server`]).
//!
//! Why remora's own and not a port of kubelet's `cri/streaming`: both transports share one
//! protocol layer here, so WebSocket is not a second-class path (containerd 2.3 and CRI-O
//! answer 403 to it).

pub mod portforward;
pub mod remotecommand;
pub mod server;
pub mod spdy;
pub mod token;
pub mod ws;
