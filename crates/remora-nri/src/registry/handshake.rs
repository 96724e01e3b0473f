//! A connection's way to an active plugin (the diagram in the registry's docs): the
//! multiplexed connection and its Runtime service, RegisterPlugin within the registration
//! timeout, Configure, then Synchronize in chunks under the write side of the sync lock.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::stream::{self, StreamExt as _};
use protobuf::Message as _;
use slog::{debug, info, o, warn, Logger};
use tokio::net::UnixStream;
use tokio::sync::{oneshot, OwnedSemaphorePermit};
use tokio::time::Instant;
use ttrpc::asynchronous::transport::{Listener, Socket};
use ttrpc::asynchronous::{Client, Server};

use super::call::{bounded, context_until};
use super::runtime_service::RuntimeService;
use super::{launch, lock, stopping, Plugin, Registry, NRI_VERSION};
use crate::api;
use crate::mux::{Mux, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};

/// The most a Synchronize request's payload may take: ttrpc's 4 MiB message limit less room
/// for ttrpc's request envelope (service and method names, timeout, metadata).
const SYNC_MESSAGE_BUDGET: usize = (4 << 20) - (16 << 10);

/// Every event a plugin may subscribe to: bits 0..=13 for events 1..=14 (NRI's `ValidEvents`).
const VALID_EVENTS: u32 = (1 << (api::Event::LAST as u32 - 1)) - 1;

/// A launched plugin, for its handshake: who it is and what it is configured with.
pub(super) struct Launched {
    pub(super) idx: String,
    pub(super) base: String,
    pub(super) config: String,
    pub(super) process: Arc<launch::Process>,
}

/// Why a connection did not become an active plugin; logged once by the handshake task.
#[derive(Debug, thiserror::Error)]
pub(super) enum HandshakeError {
    #[error("opening a multiplexed connection: {0}")]
    Open(#[from] crate::mux::OpenError),
    #[error("serving the runtime service: {0}")]
    Serve(ttrpc::Error),
    #[error("did not register within {0:?}")]
    RegistrationTimeout(Duration),
    #[error("registration refused: {0}")]
    Invalid(String),
    #[error("connection closed")]
    Closed,
    #[error("the registry is stopping")]
    Stopping,
    #[error("a plugin {0} is already registered")]
    Duplicate(String),
    #[error("Configure failed: {0}")]
    Configure(String),
    #[error("Configure returned unknown events 0x{0:x}")]
    BadEvents(u32),
    #[error("a {0}-byte object does not fit in a Synchronize message")]
    Oversized(usize),
    #[error("Synchronize failed: {0}")]
    Synchronize(String),
    #[error("plugin does not handle split Synchronize requests")]
    SplitSync,
}

impl Registry {
    /// Runs a new connection's handshake; logs its outcome once. A launched plugin's is
    /// `launched`; it holds no pending-registration slot (`launch` bounds their number).
    pub(super) async fn handshake(
        self: Arc<Self>,
        stream: UnixStream,
        connected: OwnedSemaphorePermit,
        _pending: Option<OwnedSemaphorePermit>,
        launched: Option<Launched>,
    ) {
        let conn = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let mut log = self.log.new(o!("plugin_conn" => conn));
        let process = launched.as_ref().map(|l| l.process.clone());
        if let Some(l) = &launched {
            log = log.new(o!("launched" => format!("{}-{}", l.idx, l.base),
                "pid" => l.process.pid));
        }
        if let Err(err) = self
            .clone()
            .register(stream, connected, launched, &log)
            .await
        {
            warn!(log, "NRI: plugin connection refused"; "error" => %err);
            if let Some(process) = process {
                process.kill();
            }
        }
    }

    async fn register(
        self: Arc<Self>,
        stream: UnixStream,
        connected: OwnedSemaphorePermit,
        launched: Option<Launched>,
        log: &Logger,
    ) -> Result<(), HandshakeError> {
        let mut shutdown = self.shutdown.subscribe();
        let mux = Mux::new(stream, Some(log.clone()));
        let runtime_conn = mux.open(RUNTIME_SERVICE_CONN)?;
        let plugin_conn = mux.open(PLUGIN_SERVICE_CONN)?;

        let (registered_tx, registered_rx) = oneshot::channel();
        let (identity, config, process) = match launched {
            Some(l) => (Some((l.idx, l.base)), l.config, Some(l.process)),
            None => (None, String::new(), None),
        };
        let service = Arc::new(RuntimeService {
            registered: Mutex::new(Some(registered_tx)),
            identity,
            name: OnceLock::new(),
            runtime: self.runtime.clone(),
            active: self.active.subscribe(),
            log: log.clone(),
        });
        // One connection, then a stream that ends when the trunk closes, so the server's
        // accept task ends with the plugin. (`Server::shutdown`, which would panic on an ended
        // stream, is never called: dropping the server notifies its connection instead.)
        let closed = mux.closed();
        let incoming = stream::iter([Ok(runtime_conn)])
            .chain(stream::once(closed).filter_map(|_| async { None }));
        let mut server = Server::new()
            .register_service(api::create_runtime(service))
            .add_listener(Listener::new(incoming));
        server.start().await.map_err(HandshakeError::Serve)?;
        let client = api::PluginClient::new(Client::new(Socket::new(plugin_conn)));

        let timeout = self.config.registration_timeout;
        let (idx, base) = tokio::select! {
            registered = registered_rx => match registered {
                Ok(Ok(id)) => id,
                Ok(Err(why)) => {
                    // The refusal is a status the server is still writing: give it until the
                    // plugin hangs up or a request timeout passes, then close.
                    let _ = tokio::time::timeout(self.config.request_timeout, mux.closed()).await;
                    return Err(HandshakeError::Invalid(why));
                }
                Err(_) => return Err(HandshakeError::Closed),
            },
            _ = mux.closed() => return Err(HandshakeError::Closed),
            _ = tokio::time::sleep(timeout) => {
                return Err(HandshakeError::RegistrationTimeout(timeout));
            }
            _ = stopping(&mut shutdown) => return Err(HandshakeError::Stopping),
        };
        let name = format!("{idx}-{base}");
        let log = log.new(o!("plugin" => name.clone()));
        info!(log, "NRI: plugin registered");
        if self.is_active(&name) {
            return Err(HandshakeError::Duplicate(name));
        }

        let events = self.configure(&client, config).await?;
        let plugin = Arc::new(Plugin {
            name,
            idx,
            base,
            events,
            client,
            mux,
            _server: Mutex::new(server),
            removed: AtomicBool::new(false),
            warned_state_change: AtomicBool::new(false),
            turn: tokio::sync::Mutex::new(()),
            log,
            _connected: connected,
            process,
        });

        let closed = plugin.mux.closed();
        let updates = {
            let _write = tokio::select! {
                write = self.sync_lock.clone().write_owned() => write,
                _ = plugin.mux.closed() => return Err(HandshakeError::Closed),
                _ = stopping(&mut shutdown) => return Err(HandshakeError::Stopping),
            };
            let (pods, containers) = self.sync.snapshot();
            let updates = self.synchronize(&plugin, pods, containers).await?;
            let mut plugins = lock(&self.plugins);
            if *self.shutdown.borrow() {
                return Err(HandshakeError::Stopping);
            }
            if plugins.iter().any(|p| p.name == plugin.name) {
                return Err(HandshakeError::Duplicate(plugin.name.clone()));
            }
            let at = plugins.partition_point(|p| (&p.idx, &p.base) <= (&plugin.idx, &plugin.base));
            plugins.insert(at, plugin.clone());
            self.publish(&plugins);
            updates
        };
        info!(plugin.log, "NRI: plugin synchronized and active";
            "events" => format!("0x{:x}", plugin.events));

        // Removed when its trunk closes, whoever closed it. Weak both ways: a registry dropped
        // without stop() drops its plugins, and their muxes close their trunks.
        let registry = Arc::downgrade(&self);
        let watched = Arc::downgrade(&plugin);
        tokio::spawn(async move {
            closed.await;
            if let (Some(registry), Some(plugin)) = (registry.upgrade(), watched.upgrade()) {
                registry.remove(&plugin, "connection closed");
            }
        });

        if !updates.is_empty() {
            let failed = self.runtime.update_containers(updates, Vec::new()).await;
            if !failed.is_empty() {
                warn!(plugin.log, "NRI: updates from Synchronize failed"; "failed" => failed.len());
            }
        }
        Ok(())
    }

    /// Configure with `config` (a launched plugin's file, else empty); returns the plugin's
    /// event mask, NRI's full set for 0.
    async fn configure(
        &self,
        client: &api::PluginClient,
        config: String,
    ) -> Result<u32, HandshakeError> {
        let mut req = api::ConfigureRequest::new();
        req.config = config;
        req.runtime_name = self.config.runtime_name.clone();
        req.runtime_version = self.config.runtime_version.clone();
        req.registration_timeout = millis(self.config.registration_timeout);
        req.request_timeout = millis(self.config.request_timeout);
        req.NRI_version = NRI_VERSION.to_string();
        let deadline = Instant::now() + self.config.request_timeout;
        let resp = bounded(deadline, client.configure(context_until(deadline), &req))
            .await
            .map_err(|e| HandshakeError::Configure(e.to_string()))?;
        // The wire's int32, as the bit set it is.
        let events = resp.events as u32;
        if events == 0 {
            return Ok(VALID_EVENTS);
        }
        if events & !VALID_EVENTS != 0 {
            return Err(HandshakeError::BadEvents(events & !VALID_EVENTS));
        }
        Ok(events)
    }

    /// Synchronize in chunks under ttrpc's message limit, all within one request timeout.
    async fn synchronize(
        &self,
        plugin: &Plugin,
        pods: Vec<api::PodSandbox>,
        containers: Vec<api::Container>,
    ) -> Result<Vec<api::ContainerUpdate>, HandshakeError> {
        let chunks = sync_chunks(pods, containers, SYNC_MESSAGE_BUDGET)?;
        debug!(plugin.log, "NRI: synchronizing"; "messages" => chunks.len());
        let deadline = Instant::now() + self.config.request_timeout;
        let mut updates = Vec::new();
        for req in chunks {
            let resp = bounded(
                deadline,
                plugin.client.synchronize(context_until(deadline), &req),
            )
            .await
            .map_err(|e| HandshakeError::Synchronize(e.to_string()))?;
            if req.more && (resp.more != req.more || !resp.update.is_empty()) {
                return Err(HandshakeError::SplitSync);
            }
            updates = resp.update;
        }
        Ok(updates)
    }
}

/// Splits a snapshot into Synchronize requests each at most `budget` bytes encoded, `more`
/// set on all but the last; one request (maybe empty) at least.
pub(super) fn sync_chunks(
    pods: Vec<api::PodSandbox>,
    containers: Vec<api::Container>,
    budget: usize,
) -> Result<Vec<api::SynchronizeRequest>, HandshakeError> {
    // The `more` field: a tag byte and a value byte.
    const MORE_FIELD: usize = 2;
    let mut chunks = Vec::new();
    let mut current = api::SynchronizeRequest::new();
    let mut size = MORE_FIELD;
    let fits = |len: usize| len.saturating_add(MORE_FIELD) <= budget;
    let entries = (pods.into_iter().map(SyncEntry::Pod))
        .chain(containers.into_iter().map(SyncEntry::Container));
    for entry in entries {
        let field = field_size(entry.encoded_len());
        if !fits(field) {
            return Err(HandshakeError::Oversized(field));
        }
        if size + field > budget {
            chunks.push(std::mem::take(&mut current));
            size = MORE_FIELD;
        }
        size += field;
        match entry {
            SyncEntry::Pod(pod) => current.pods.push(pod),
            SyncEntry::Container(container) => current.containers.push(container),
        }
    }
    chunks.push(current);
    let last = chunks.len() - 1;
    for chunk in &mut chunks[..last] {
        chunk.more = true;
    }
    Ok(chunks)
}

/// One pod or container of a Synchronize snapshot, pods first.
enum SyncEntry {
    Pod(api::PodSandbox),
    Container(api::Container),
}

impl SyncEntry {
    fn encoded_len(&self) -> u64 {
        match self {
            Self::Pod(pod) => pod.compute_size(),
            Self::Container(container) => container.compute_size(),
        }
    }
}

/// The encoded size of a length-delimited field of `len` bytes: tag, length varint, bytes.
fn field_size(len: u64) -> usize {
    let len = usize::try_from(len).unwrap_or(usize::MAX);
    len.saturating_add(1 + varint_len(len))
}

fn varint_len(mut n: usize) -> usize {
    let mut bytes = 1;
    while n >= 0x80 {
        n >>= 7;
        bytes += 1;
    }
    bytes
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
