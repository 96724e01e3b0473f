//! Streaming sessions into containers: interactive exec, attach, and TCP connections into a
//! pod's network namespace for port-forward. API skeleton: bodies are being written.

use std::sync::Arc;

use super::{ContainerError, Pods, SandboxError};
use crate::io::SessionIo;

impl Pods {
    /// Checks, at the `Exec` / `Attach` RPC, that the container exists and is running (before a
    /// URL is handed out). `stdin` asks to attach stdin: for attach, only if the container was
    /// created with `stdin`.
    pub fn check_streamable(&self, container_id: &str) -> Result<String, ContainerError> {
        let _ = container_id;
        unimplemented!("check_streamable")
    }

    /// Runs `cmd` in the container with the client's streams; returns its exit code. The process
    /// is killed when the client is gone.
    pub async fn exec_stream(
        self: &Arc<Self>,
        container_id: &str,
        cmd: Vec<String>,
        tty: bool,
        io: SessionIo,
    ) -> Result<i32, ContainerError> {
        let _ = (container_id, cmd, tty, io);
        unimplemented!("exec_stream")
    }

    /// Attaches the client's streams to the container's live IO until the client leaves or the
    /// container exits.
    pub async fn attach(
        self: &Arc<Self>,
        container_id: &str,
        io: SessionIo,
    ) -> Result<(), ContainerError> {
        let _ = (container_id, io);
        unimplemented!("attach")
    }

    /// Checks, at the `PortForward` RPC, that the pod exists and is ready; returns its full id.
    pub fn check_port_forward(&self, pod_id: &str) -> Result<String, SandboxError> {
        let _ = pod_id;
        unimplemented!("check_port_forward")
    }

    /// A TCP connection to `port` on the pod's loopback, made inside its network namespace (the
    /// host's for a host-network pod).
    pub async fn port_forward(
        &self,
        pod_id: &str,
        port: u16,
    ) -> Result<tokio::net::TcpStream, SandboxError> {
        let _ = (pod_id, port);
        unimplemented!("port_forward")
    }
}
