//! Streaming sessions into containers: interactive exec, attach, and TCP connections into a
//! pod's network namespace for port-forward. The streaming server ([`crate::stream`]) hands
//! each session's client streams over as a transport-neutral [`SessionIo`].
//!
//! - **Exec** adds a process to the container's task with FIFOs of its own under
//!   `<state_dir>/io/<container>/exec/`, copies the client's stdin into it and its output out,
//!   applies terminal resizes, and waits for the exit code. A client that goes away gets its
//!   process SIGKILLed. The FIFOs and the process are removed however it ends.
//! - **Attach** joins the container's live output through the log writer's fan-out (so any
//!   number of sessions and the CRI log see every byte; a session that falls behind misses
//!   output rather than slowing the container) and writes the client's stdin into remora's end
//!   of the container's stdin FIFO, opened on the first attach and kept open so that a session
//!   that ends does not close the container's stdin — unless the container asked for
//!   `stdin_once`, when the first session's end closes it (containerd's and CRI-O's rule).
//! - **PortForward** connects to `localhost:<port>` from inside the pod's network namespace
//!   (on a thread of its own, since `setns` changes the calling thread), or on the host for a
//!   host-network pod.
//!
//! Closing stdin takes both steps: remora's write end is dropped and the shim is told to close
//! the process's stdin (`Tasks.CloseIO`), because the shims keep the FIFO open themselves.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use slog::{debug, warn};
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::backend::ExecStdio;
use super::container_events::EventKind;
use super::container_exec::exec_id;
use super::{ContainerError, ContainerIo, Pods, SandboxError};
use crate::io::{ClientRead, ClientWrite, FifoSet, FifoSpec, SessionIo, StreamKind, TermSize};
use crate::store::{ContainerState, SandboxState};

/// How long output still in flight is drained after a process exited or a session ended.
const DRAIN: Duration = Duration::from_secs(2);
/// How long an exec's stdin, once the client closed it, waits for the shim to read what is
/// left in the FIFO before remora's end is dropped.
const STDIN_DRAIN: Duration = Duration::from_secs(5);
/// How long a killed exec process gets to be reaped.
const KILL_WAIT: Duration = Duration::from_secs(5);
/// How long a port-forward connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// remora's end of a container's stdin FIFO.
pub(crate) enum StdinEnd {
    /// No attach has written yet.
    Unopened,
    /// Open: attach sessions write here.
    Open(pipe::Sender),
    /// Closed for good (`stdin_once` after its first session).
    Closed,
}

impl Pods {
    /// Checks, at the `Exec` / `Attach` RPC, that the container exists and is running (before a
    /// URL is handed out); returns its full id.
    pub fn check_streamable(&self, container_id: &str) -> Result<String, ContainerError> {
        Ok(self.running_container(container_id)?.id().to_string())
    }

    /// Runs `cmd` in the container with the client's streams; returns its exit code. The process
    /// is killed when the client is gone.
    pub async fn exec_stream(
        self: &Arc<Self>,
        container_id: &str,
        cmd: Vec<String>,
        tty: bool,
        mut io: SessionIo,
    ) -> Result<i32, ContainerError> {
        let cid = self.check_streamable(container_id)?;
        if cmd.is_empty() {
            return Err(ContainerError::EmptyCommand);
        }
        // The client sends its terminal's size first thing: if it is here already, the
        // terminal is made with it (later ones are applied as resizes).
        let initial = io.resize.as_mut().and_then(|r| r.try_recv().ok());
        let process = self.exec_process(&cid, cmd, tty.then_some(initial)).await?;
        // Its own task: the session's end must not cancel the clean-up half way.
        let me = self.clone();
        tokio::spawn(async move { me.exec_stream_inner(&cid, process, tty, io).await })
            .await
            .map_err(ContainerError::Aborted)?
    }

    async fn exec_stream_inner(
        &self,
        cid: &str,
        process: Vec<u8>,
        tty: bool,
        io: SessionIo,
    ) -> Result<i32, ContainerError> {
        let exec = exec_id();
        let log = self
            .log
            .new(slog::o!("container_id" => cid.to_string(), "exec_id" => exec.clone()));
        let dir = self.io_dir(cid).join("exec");
        let fifo_err = |action: &'static str, source: crate::io::FifoError| ContainerError::Fifo {
            action,
            path: dir.clone(),
            source,
        };
        let SessionIo {
            stdin,
            stdout,
            stderr,
            resize,
            gone,
        } = io;
        let fifos = FifoSet::create(
            &dir,
            &exec,
            FifoSpec {
                stdin: stdin.is_some(),
                tty,
            },
        )
        .map_err(|e| fifo_err("create exec FIFOs in", e))?;
        let result = async {
            // Our ends first, so the shim's opens find them. With a terminal the shim writes
            // all output to stdout and never opens stderr: its copier would wait forever.
            let out = fifos
                .open_stdout()
                .map_err(|e| fifo_err("open exec FIFO in", e))?;
            let err = if tty {
                None
            } else {
                Some(
                    fifos
                        .open_stderr()
                        .map_err(|e| fifo_err("open exec FIFO in", e))?,
                )
            };
            let stdin_end = fifos
                .open_stdin()
                .map_err(|e| fifo_err("open exec FIFO in", e))?;
            let mut copiers = vec![tokio::spawn(copy_out(out, stdout))];
            if let Some(err) = err {
                copiers.push(tokio::spawn(copy_out(err, stderr)));
            }
            let stdio = fifos.task_stdio();
            let created = self
                .tasks
                .exec(
                    cid,
                    &exec,
                    process,
                    ExecStdio {
                        stdin: stdio.stdin,
                        stdout: stdio.stdout,
                        stderr: stdio.stderr,
                        terminal: tty,
                    },
                )
                .await;
            let ran = match created {
                Ok(()) => {
                    self.run_exec(cid, &exec, stdin, stdin_end, resize, &gone, &log)
                        .await
                }
                Err(e) => Err(e.into()),
            };
            // The output FIFOs reach EOF once the shim closed them after the exit; bounded,
            // in case a grandchild process still holds them (or the process never ran).
            let drain = if ran.is_ok() { DRAIN } else { Duration::ZERO };
            for copier in copiers {
                let abort = copier.abort_handle();
                if tokio::time::timeout(drain, copier).await.is_err() {
                    abort.abort();
                }
            }
            if let Err(e) = self.tasks.delete_exec(cid, &exec).await {
                warn!(log, "cannot delete the exec process"; "error" => %e);
            }
            ran
        }
        .await;
        if let Err(e) = fifos.remove() {
            warn!(log, "cannot remove the exec FIFOs"; "error" => %e);
        }
        result
    }

    /// Starts exec `exec`, feeds it the client's stdin and resizes, and waits for its exit; a
    /// client that goes away gets it killed.
    #[allow(clippy::too_many_arguments)]
    async fn run_exec(
        &self,
        cid: &str,
        exec: &str,
        stdin: Option<ClientRead>,
        stdin_end: Option<pipe::Sender>,
        mut resize: Option<tokio::sync::mpsc::Receiver<TermSize>>,
        gone: &CancellationToken,
        log: &slog::Logger,
    ) -> Result<i32, ContainerError> {
        self.tasks.start_exec(cid, exec).await?;
        let mut feeders = tokio::task::JoinSet::new();
        if let (Some(from), Some(to)) = (stdin, stdin_end) {
            let tasks = self.tasks.clone();
            let (cid, exec, log) = (cid.to_string(), exec.to_string(), log.clone());
            feeders.spawn(async move {
                copy_stdin(from, to).await;
                if let Err(e) = tasks.close_stdin(&cid, &exec).await {
                    debug!(log, "cannot close the exec process's stdin"; "error" => %e);
                }
            });
        }
        if let Some(sizes) = resize.take() {
            feeders.spawn(self.apply_resizes(cid, exec, sizes, log));
        }
        let exit = tokio::select! {
            exit = self.tasks.wait_exec(cid, exec) => exit,
            _ = gone.cancelled() => {
                debug!(log, "the client went away; killing the exec process");
                if let Err(e) = self.tasks.kill_exec(cid, exec, libc::SIGKILL as u32).await {
                    warn!(log, "cannot kill the abandoned exec process"; "error" => %e);
                }
                match tokio::time::timeout(KILL_WAIT, self.tasks.wait_exec(cid, exec)).await {
                    Ok(exit) => exit,
                    Err(_) => {
                        warn!(log, "the killed exec process did not exit in time"; "waited_s" => KILL_WAIT.as_secs());
                        feeders.abort_all();
                        return Ok(137);
                    }
                }
            }
        };
        feeders.abort_all();
        Ok(exit?.status as i32)
    }

    /// Attaches the client's streams to the container's live IO until the client leaves or the
    /// container exits.
    pub async fn attach(
        self: &Arc<Self>,
        container_id: &str,
        io: SessionIo,
    ) -> Result<(), ContainerError> {
        let container = self.containers_store.get(container_id)?;
        let id = container.id().to_string();
        // Subscribed before the state check: an exit after it is seen as an event.
        let (_, mut events) = self.events.subscribe();
        if container.state() != ContainerState::Running {
            return Err(ContainerError::NotRunning(id));
        }
        let cio = self
            .io
            .get(&id)
            .ok_or_else(|| ContainerError::NotRunning(id.clone()))?;
        let meta = container.metadata().clone();
        let log = self.log.new(slog::o!("container_id" => id.clone()));
        let SessionIo {
            stdin,
            stdout,
            stderr,
            resize,
            gone,
        } = io;

        let stop = CancellationToken::new();
        let mut outputs = tokio::task::JoinSet::new();
        let streams = [(StreamKind::Stdout, stdout), (StreamKind::Stderr, stderr)];
        for (kind, to) in streams {
            let Some(mut to) = to else { continue };
            if kind == StreamKind::Stderr && meta.tty {
                // A terminal has one output stream.
                let _ = to.shutdown().await;
                continue;
            }
            match &cio.log {
                Some(w) => {
                    outputs.spawn(forward_output(w.subscribe(kind), to, stop.clone()));
                }
                None => {
                    // No log path: the output is drained unseen, nothing to fan out.
                    let _ = to.shutdown().await;
                }
            }
        }
        let mut feeders = tokio::task::JoinSet::new();
        let attached_stdin = meta.stdin && stdin.is_some();
        if let (Some(from), true) = (stdin, meta.stdin) {
            let me = self.clone();
            let (cio, id, log) = (cio.clone(), id.clone(), log.clone());
            let once = meta.stdin_once;
            feeders.spawn(async move {
                me.feed_container_stdin(&id, &cio, from, &log).await;
                if once {
                    me.close_container_stdin(&id, &cio, &log).await;
                }
            });
        }
        if let (Some(sizes), true) = (resize, meta.tty) {
            feeders.spawn(self.apply_resizes(&id, "", sizes, &log));
        }

        loop {
            tokio::select! {
                _ = gone.cancelled() => break,
                event = events.recv() => match event {
                    Ok(e) if e.id == id && matches!(e.kind, EventKind::Stopped | EventKind::Deleted) => break,
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        if container.state() != ContainerState::Running {
                            break;
                        }
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                },
            }
        }
        feeders.abort_all();
        if attached_stdin && meta.stdin_once {
            // The first session's end closes stdin, whether the client closed it or left.
            self.close_container_stdin(&id, &cio, &log).await;
        }
        // Output of the last moments is already in the fan-out: let the forwarders drain it.
        stop.cancel();
        if tokio::time::timeout(DRAIN, async {
            while outputs.join_next().await.is_some() {}
        })
        .await
        .is_err()
        {
            outputs.abort_all();
        }
        Ok(())
    }

    /// Applies the client's terminal resizes to process `exec_id` ("" for the container's
    /// init process) until the client stops sending them.
    fn apply_resizes(
        &self,
        cid: &str,
        exec_id: &str,
        mut sizes: tokio::sync::mpsc::Receiver<TermSize>,
        log: &slog::Logger,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let tasks = self.tasks.clone();
        let (cid, exec_id, log) = (cid.to_string(), exec_id.to_string(), log.clone());
        async move {
            while let Some(size) = sizes.recv().await {
                let size = (u32::from(size.width), u32::from(size.height));
                if let Err(e) = tasks.resize_pty(&cid, &exec_id, size).await {
                    debug!(log, "cannot resize the terminal"; "error" => %e);
                }
            }
        }
    }

    /// Copies an attach client's stdin into the container's stdin until the client's EOF.
    async fn feed_container_stdin(
        &self,
        id: &str,
        cio: &ContainerIo,
        mut from: ClientRead,
        log: &slog::Logger,
    ) {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let mut end = cio.stdin.lock().await;
            if matches!(*end, StdinEnd::Unopened) {
                match cio.fifos.open_stdin() {
                    Ok(Some(w)) => *end = StdinEnd::Open(w),
                    Ok(None) => *end = StdinEnd::Closed,
                    Err(e) => {
                        warn!(log, "cannot open the container's stdin"; "error" => %e);
                        return;
                    }
                }
            }
            let StdinEnd::Open(w) = &mut *end else {
                return;
            };
            if let Err(e) = w.write_all(&buf[..n]).await {
                debug!(log, "the container's stdin is closed"; "container_id" => id, "error" => %e);
                *end = StdinEnd::Closed;
                return;
            }
        }
    }

    /// Closes the container's stdin for good (`stdin_once`).
    async fn close_container_stdin(&self, id: &str, cio: &ContainerIo, log: &slog::Logger) {
        let mut end = cio.stdin.lock().await;
        if matches!(*end, StdinEnd::Closed) {
            return;
        }
        *end = StdinEnd::Closed;
        drop(end);
        if let Err(e) = self.tasks.close_stdin(id, "").await {
            debug!(log, "cannot close the container's stdin"; "error" => %e);
        }
    }

    /// Checks, at the `PortForward` RPC, that the pod exists and is ready; returns its full id.
    pub fn check_port_forward(&self, pod_id: &str) -> Result<String, SandboxError> {
        let sandbox = self.sandboxes.get(pod_id)?;
        if sandbox.status().state != SandboxState::Ready {
            return Err(SandboxError::NotReady(sandbox.id().to_string()));
        }
        Ok(sandbox.id().to_string())
    }

    /// A TCP connection to `port` on the pod's loopback, made inside its network namespace (the
    /// host's for a host-network pod).
    pub async fn port_forward(
        &self,
        pod_id: &str,
        port: u16,
    ) -> Result<tokio::net::TcpStream, SandboxError> {
        let sandbox = self.sandboxes.get(pod_id)?;
        if sandbox.status().state != SandboxState::Ready {
            return Err(SandboxError::NotReady(sandbox.id().to_string()));
        }
        let netns = sandbox.metadata().netns_path.clone();
        let connected = tokio::task::spawn_blocking(move || {
            if netns.is_empty() {
                Ok(connect_loopback(port))
            } else {
                crate::net::netns::run_in(std::path::Path::new(&netns), move || {
                    connect_loopback(port)
                })
            }
        })
        .await
        .map_err(SandboxError::Aborted)??;
        let stream = connected.map_err(|source| SandboxError::Forward { port, source })?;
        stream
            .set_nonblocking(true)
            .and_then(|()| tokio::net::TcpStream::from_std(stream))
            .map_err(|source| SandboxError::Forward { port, source })
    }
}

/// Connects to `port` on the calling thread's loopback: IPv4 first, then IPv6 (what
/// `localhost` names), as containerd's CRI does.
fn connect_loopback(port: u16) -> std::io::Result<std::net::TcpStream> {
    let v4 = std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port));
    match std::net::TcpStream::connect_timeout(&v4, CONNECT_TIMEOUT) {
        Ok(s) => Ok(s),
        Err(e4) => {
            let v6 = std::net::SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port));
            std::net::TcpStream::connect_timeout(&v6, CONNECT_TIMEOUT).map_err(|_| e4)
        }
    }
}

/// Copies a process's output FIFO to the client (or drains it, if the client did not ask for
/// the stream), then ends the client's stream.
async fn copy_out(mut from: pipe::Receiver, to: Option<ClientWrite>) {
    match to {
        Some(mut to) => {
            let _ = tokio::io::copy(&mut from, &mut to).await;
            let _ = to.shutdown().await;
        }
        None => {
            let _ = tokio::io::copy(&mut from, &mut tokio::io::sink()).await;
        }
    }
}

/// Copies the client's stdin into an exec process's stdin FIFO until the client's EOF; the
/// write end is dropped at the end, once the shim's reader has taken what was written (or after
/// [`STDIN_DRAIN`]): a shim that opens its end late must not find the bytes gone.
async fn copy_stdin(mut from: ClientRead, mut to: pipe::Sender) {
    let _ = tokio::io::copy(&mut from, &mut to).await;
    let _ = to.flush().await;
    crate::io::fifo::wait_drained(&to, STDIN_DRAIN).await;
}

/// Forwards one output stream of the fan-out to an attach client until `stop`, then sends what
/// is still queued and ends the client's stream. A client that falls behind misses output.
async fn forward_output<W>(mut from: broadcast::Receiver<Bytes>, mut to: W, stop: CancellationToken)
where
    W: AsyncWrite + Unpin,
{
    loop {
        let chunk = tokio::select! {
            biased;
            r = from.recv() => r,
            _ = stop.cancelled() => break,
        };
        match chunk {
            Ok(b) => {
                if to.write_all(&b).await.is_err() {
                    return;
                }
            }
            Err(broadcast::error::RecvError::Lagged(_)) => continue,
            Err(broadcast::error::RecvError::Closed) => break,
        }
    }
    while let Ok(b) = from.try_recv() {
        if to.write_all(&b).await.is_err() {
            return;
        }
    }
    let _ = to.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// A client's stdin: `data`, then EOF, which it reports on `eof` when read.
    struct Client {
        data: Option<&'static [u8]>,
        eof: Option<tokio::sync::oneshot::Sender<()>>,
    }

    impl tokio::io::AsyncRead for Client {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            match self.data.take() {
                Some(d) => buf.put_slice(d),
                None => {
                    if let Some(eof) = self.eof.take() {
                        let _ = eof.send(());
                    }
                }
            }
            Poll::Ready(Ok(()))
        }
    }

    /// containerd's Go shim opens its stdin reader in a goroutine after `Start` returned: a
    /// client that sends its stdin and closes it at once must not lose it to remora dropping
    /// its end (the only one) first. The reader here opens only after the client's EOF.
    #[tokio::test]
    async fn exec_stdin_written_before_the_shim_reads_it_is_not_lost() {
        let tmp = tempfile::tempdir().unwrap();
        let fifos = FifoSet::create(
            tmp.path(),
            "e1",
            FifoSpec {
                stdin: true,
                tty: false,
            },
        )
        .unwrap();
        let to = fifos.open_stdin().unwrap().unwrap();
        let (eof_tx, eof_rx) = tokio::sync::oneshot::channel();
        let client = Client {
            data: Some(b"line one\nline two\n"),
            eof: Some(eof_tx),
        };
        let copy = tokio::spawn(copy_stdin(Box::pin(client), to));
        eof_rx.await.unwrap();
        tokio::task::yield_now().await;
        let path = fifos.stdin().unwrap().to_path_buf();
        let got = tokio::task::spawn_blocking(move || {
            use std::io::Read;
            use std::os::unix::fs::OpenOptionsExt;
            // The shim's late reader; non-blocking so that a FIFO with no writer left fails
            // the test instead of hanging it.
            let mut f = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(path)
                .unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 64];
            loop {
                match f.read(&mut buf) {
                    Ok(0) => return got,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                    // No writer ever came, or it is still there: nothing more either way
                    // once what was written has been read.
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && !got.is_empty() => {
                        return got
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::yield_now()
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        });
        let got = tokio::time::timeout(Duration::from_secs(10), got)
            .await
            .expect("the reader got its bytes or EOF")
            .unwrap();
        assert_eq!(got, b"line one\nline two\n");
        tokio::time::timeout(Duration::from_secs(10), copy)
            .await
            .expect("the copy ends once its bytes were read")
            .unwrap();
    }

    #[tokio::test]
    async fn attach_output_reaches_the_client_and_the_rest_is_drained_at_stop() {
        let (tx, rx) = broadcast::channel(16);
        let (client, mut reader) = tokio::io::duplex(1024);
        let stop = CancellationToken::new();
        let task = tokio::spawn(forward_output(rx, client, stop.clone()));
        tx.send(Bytes::from_static(b"one ")).unwrap();
        let mut got = vec![0u8; 4];
        reader.read_exact(&mut got).await.unwrap();
        assert_eq!(got, b"one ");
        // Sent just before the stop: still delivered, then EOF.
        tx.send(Bytes::from_static(b"two")).unwrap();
        stop.cancel();
        task.await.unwrap();
        let mut rest = Vec::new();
        reader.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, b"two");
    }

    #[tokio::test]
    async fn a_lagging_attach_client_misses_output_but_keeps_going() {
        let (tx, rx) = broadcast::channel(2);
        for chunk in [&b"a"[..], b"b", b"c", b"d"] {
            tx.send(Bytes::copy_from_slice(chunk)).unwrap();
        }
        let (client, mut reader) = tokio::io::duplex(1024);
        let stop = CancellationToken::new();
        let task = tokio::spawn(forward_output(rx, client, stop.clone()));
        let mut got = vec![0u8; 2];
        reader.read_exact(&mut got).await.unwrap();
        assert_eq!(got, b"cd", "the two newest chunks survive the lag");
        tx.send(Bytes::from_static(b"e")).unwrap();
        let mut more = vec![0u8; 1];
        reader.read_exact(&mut more).await.unwrap();
        assert_eq!(more, b"e");
        stop.cancel();
        task.await.unwrap();
    }

    #[test]
    fn a_port_nothing_listens_on_is_refused() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert!(connect_loopback(port).is_ok());
        drop(l);
        let err = connect_loopback(port).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
    }
}
