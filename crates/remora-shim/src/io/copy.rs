//! The copy loops: an output source (a pipe or the pty master) to its sink, the stdin FIFO to
//! the process; and the count of output copies still running, which the exit waits for.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use slog::{debug, warn, Logger};
use tokio::io::unix::AsyncFd;

use super::fd::{read_some, write_all};
use super::target::Sink;
use super::Shared;

/// Size of a copy buffer: `PIPE_BUF`, so a chunk written to a pipe or FIFO is written whole.
const COPY_BUF: usize = 4096;

/// Copies an output source (a pipe's read end or the pty master) to its sink until EOF. A pty
/// master reads EIO once the last slave fd is closed: that is its EOF.
pub(super) async fn copy_out(
    src: &AsyncFd<OwnedFd>,
    is_pty: bool,
    sink: &Sink,
    stream: &str,
    log: &Logger,
) {
    let mut buf = vec![0u8; COPY_BUF];
    let mut sink_ok = true;
    loop {
        let n = match read_some(src, &mut buf).await {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if is_pty && e.raw_os_error() == Some(libc::EIO) => break,
            Err(e) => {
                warn!(log, "reading the process's output failed; the copy stops";
                    "stream" => stream, "error" => %e);
                break;
            }
        };
        if sink_ok {
            if let Err(e) = sink.write_all(&buf[..n]).await {
                warn!(log, "writing the process's output failed; the rest of the stream is discarded";
                    "stream" => stream, "path" => &sink.name, "error" => %e);
                sink_ok = false;
            }
        }
    }
    debug!(log, "output copy done"; "stream" => stream, "path" => &sink.name);
}

/// Copies the stdin FIFO to the process (a pipe's write end or the pty master) until EOF on
/// the FIFO (after `close_stdin` and the client's close) or until the process is gone.
pub(super) async fn copy_in(src: &AsyncFd<OwnedFd>, dst: &AsyncFd<OwnedFd>, log: &Logger) {
    let mut buf = vec![0u8; COPY_BUF];
    loop {
        let n = match read_some(src, &mut buf).await {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => {
                warn!(log, "reading the stdin FIFO failed; stdin is closed"; "error" => %e);
                break;
            }
        };
        match write_all(dst, &buf[..n]).await {
            Ok(()) => {}
            // The process (every holder of its stdin) is gone: nothing more to deliver.
            Err(e)
                if e.raw_os_error() == Some(libc::EPIPE) || e.raw_os_error() == Some(libc::EIO) =>
            {
                break
            }
            Err(e) => {
                warn!(log, "writing the process's stdin failed; stdin is closed"; "error" => %e);
                break;
            }
        }
    }
    debug!(log, "stdin copy done");
}

/// Counts an output copy as finished when dropped (done or aborted).
pub(super) struct OutputDone(pub(super) Arc<Shared>);

impl Drop for OutputDone {
    fn drop(&mut self) {
        self.0
            .outputs_left
            .send_modify(|n| *n = n.saturating_sub(1));
    }
}
