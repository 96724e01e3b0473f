//! The Runtime service a plugin calls on its connection: RegisterPlugin, whose outcome the
//! handshake waits for, and UpdateContainers, which goes to the [`RuntimeHandle`].

use std::sync::{Arc, Mutex, OnceLock};

use slog::{debug, info, Logger};
use tokio::sync::{oneshot, watch};
use ttrpc::asynchronous::TtrpcContext;

use super::{lock, RuntimeHandle, MAX_PLUGIN_NAME_LEN};
use crate::api;

/// A registration's outcome: (idx, name), or why it was refused.
pub(super) type Registration = Result<(String, String), String>;

/// The runtime service one plugin connection is served.
pub(super) struct RuntimeService {
    /// Taken by the first RegisterPlugin.
    pub(super) registered: Mutex<Option<oneshot::Sender<Registration>>>,
    /// A launched plugin's (idx, name), from its file name: what it registers as, whatever
    /// it sends (NRI checks and uses the request's only for external plugins).
    pub(super) identity: Option<(String, String)>,
    pub(super) name: OnceLock<String>,
    pub(super) runtime: Arc<dyn RuntimeHandle>,
    /// The active plugins' names, so an external plugin taking a name in use is told why.
    pub(super) active: watch::Receiver<Vec<String>>,
    pub(super) log: Logger,
}

#[async_trait::async_trait]
impl api::Runtime for RuntimeService {
    async fn register_plugin(
        &self,
        _ctx: &TtrpcContext,
        req: api::RegisterPluginRequest,
    ) -> ttrpc::Result<api::Empty> {
        let Some(tx) = lock(&self.registered).take() else {
            return Err(status(
                ttrpc::Code::FAILED_PRECONDITION,
                "plugin already registered",
            ));
        };
        if let Some((idx, base)) = &self.identity {
            if (&req.plugin_idx, &req.plugin_name) != (idx, base) {
                debug!(self.log, "NRI: launched plugin registered as another; its file name counts";
                    "sent_idx" => &req.plugin_idx, "sent_name" => &req.plugin_name);
            }
            // Set once: `registered` was still there.
            let _ = self.name.set(format!("{idx}-{base}"));
            // The handshake may have given up already; it logged that.
            let _ = tx.send(Ok((idx.clone(), base.clone())));
            return Ok(api::Empty::new());
        }
        let name = format!("{}-{}", req.plugin_idx, req.plugin_name);
        // Checked again when it is activated: two registering at once are not both let in.
        if self.active.borrow().contains(&name) {
            let why = format!("a plugin named {name} is already registered");
            let _ = tx.send(Err(why.clone()));
            return Err(status(ttrpc::Code::ALREADY_EXISTS, why));
        }
        match check_registration(&req.plugin_idx, &req.plugin_name) {
            Ok(()) => {
                // Set once: `registered` was still there.
                let _ = self.name.set(name);
                // The handshake may have given up already; it logged that.
                let _ = tx.send(Ok((req.plugin_idx, req.plugin_name)));
                Ok(api::Empty::new())
            }
            Err(why) => {
                let _ = tx.send(Err(why.clone()));
                Err(status(ttrpc::Code::INVALID_ARGUMENT, why))
            }
        }
    }

    async fn update_containers(
        &self,
        _ctx: &TtrpcContext,
        req: api::UpdateContainersRequest,
    ) -> ttrpc::Result<api::UpdateContainersResponse> {
        let Some(name) = self.name.get() else {
            return Err(status(
                ttrpc::Code::FAILED_PRECONDITION,
                "UpdateContainers before RegisterPlugin",
            ));
        };
        info!(self.log, "NRI: plugin requested container updates"; "plugin" => name,
            "updates" => req.update.len(), "evictions" => req.evict.len());
        let mut resp = api::UpdateContainersResponse::new();
        resp.failed = self.runtime.update_containers(req.update, req.evict).await;
        Ok(resp)
    }
}

/// NRI's checks (`api.CheckPluginIndex`, `api.CheckPluginName`), plus a length bound.
pub(super) fn check_registration(idx: &str, name: &str) -> Result<(), String> {
    if idx.len() != 2 || !idx.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("invalid plugin index {idx:?}, must be 2 digits"));
    }
    if name.is_empty() {
        return Err("empty plugin name".to_string());
    }
    if name.len() > MAX_PLUGIN_NAME_LEN {
        return Err(format!(
            "plugin name longer than {MAX_PLUGIN_NAME_LEN} bytes"
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '+')))
    {
        return Err(format!("invalid character {c:?} in plugin name {name:?}"));
    }
    Ok(())
}

pub(super) fn status(code: ttrpc::Code, message: impl ToString) -> ttrpc::Error {
    ttrpc::Error::RpcStatus(ttrpc::get_status(code, message))
}
