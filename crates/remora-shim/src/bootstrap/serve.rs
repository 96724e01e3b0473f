//! The server mode: the ttrpc task service on the socket `start` bound (fd 3), until
//! containerd's Shutdown, then the last events delivered (bounded).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use containerd_shim_protos::shim_async::create_task;
use containerd_shim_protos::ttrpc;
use slog::{debug, info, o, warn, Logger};
use tokio::sync::Notify;

use super::{BootstrapError, Flags, FORWARD_TIMEOUT};
use crate::publisher::{BackoffLimits, Forwarder, Publisher, TtrpcForwarder};
use crate::reaper::Reaper;
use crate::service::Service;
use crate::task::CONSOLE_DIR;

/// How long Shutdown waits for containerd to take the last events.
const SHUTDOWN_FLUSH: Duration = Duration::from_secs(10);

/// A server that could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// `-socket` is missing (the server runs only as `start` spawns it).
    #[error("missing -socket: the server is started by `start`")]
    NoSocket,
    /// The tokio runtime could not be built.
    #[error("tokio runtime: {0}")]
    Runtime(std::io::Error),
    /// The reaper could not start.
    #[error(transparent)]
    Reaper(#[from] crate::reaper::ReapError),
    /// The publisher's spool could not be opened.
    #[error(transparent)]
    Publisher(#[from] crate::publisher::PublishError),
    /// The ttrpc server failed.
    #[error("ttrpc server: {0}")]
    Ttrpc(#[from] ttrpc::Error),
}

/// The server: runs until Shutdown, then delivers the last events (bounded) and exits.
pub(super) fn serve(flags: &Flags) -> Result<(), BootstrapError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        // Only spool and pid-file reads could use it; keep the thread count (and memory) low.
        .max_blocking_threads(2)
        .build()
        .map_err(ServeError::Runtime)?;
    rt.block_on(serve_async(flags))
        .map_err(BootstrapError::from)
}

fn shim_logger(debug: bool) -> Logger {
    use slog::Drain;
    // containerd made a `log` FIFO in the bundle (our working directory) and copies it into its
    // own log. Opened non-blocking so a missing reader cannot hang the start; writes are sync.
    let file = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags_nonblock()
        .open("log")
        .ok();
    let level = if debug {
        slog::Level::Debug
    } else {
        slog::Level::Info
    };
    match file {
        Some(f) => {
            let decorator = slog_term::PlainSyncDecorator::new(f);
            let drain = slog_term::FullFormat::new(decorator).build().ignore_res();
            let drain = slog::LevelFilter::new(drain, level).ignore_res();
            Logger::root(drain, o!("runtime" => super::RUNTIME_NAME))
        }
        None => Logger::root(slog::Discard, o!()),
    }
}

trait NonBlock {
    fn custom_flags_nonblock(&mut self) -> &mut Self;
}

impl NonBlock for std::fs::OpenOptions {
    fn custom_flags_nonblock(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(libc::O_NONBLOCK)
    }
}

async fn serve_async(flags: &Flags) -> Result<(), ServeError> {
    if flags.socket.is_empty() {
        return Err(ServeError::NoSocket);
    }
    let log = shim_logger(flags.debug).new(o!("namespace" => flags.namespace.clone()));
    let socket = PathBuf::from(&flags.socket);
    let ttrpc_address =
        std::env::var("TTRPC_ADDRESS").unwrap_or_else(|_| format!("{}.ttrpc", flags.address));
    if let Err(e) = crate::io::make_private_dir(Path::new(CONSOLE_DIR)) {
        warn!(log, "no console socket dir: terminals will fail"; "dir" => CONSOLE_DIR, "error" => %e);
    }
    // Before any child is spawned: the reaper must see every exit.
    let reaper = Reaper::start(log.clone())?;
    let forwarder: Arc<dyn Forwarder> =
        Arc::new(TtrpcForwarder::new(ttrpc_address, FORWARD_TIMEOUT));
    let publisher = Publisher::start(
        super::spool_path(&socket),
        flags.namespace.clone(),
        forwarder,
        BackoffLimits::default(),
        log.clone(),
    )?;
    let shutdown = Arc::new(Notify::new());
    let svc = Service::new(
        flags.namespace.clone(),
        publisher.clone(),
        reaper,
        shutdown.clone(),
        log.clone(),
    );

    // SAFETY: fd 3 is the listening socket `start` bound and passed to this process (and only
    // this use of it exists); the server takes it over.
    let server = unsafe { ttrpc::r#async::Server::new().add_unix_listener(3) }?;
    let mut server = server.register_service(create_task(Arc::new(svc.clone())));
    server.start().await?;
    info!(log, "shim serving"; "socket" => %socket.display(), "pid" => std::process::id());

    shutdown.notified().await;
    let delivered = publisher.flush(SHUTDOWN_FLUSH).await;
    if !delivered {
        warn!(log, "shutting down with undelivered events; they stay in the spool";
            "pending" => publisher.pending());
    }
    let _ = std::fs::remove_file(&socket);
    if let Err(e) = server.shutdown().await {
        debug!(log, "ttrpc shutdown"; "error" => %e);
    }
    info!(log, "shim exiting");
    Ok(())
}
