//! `delete`: containerd's cleanup after a shim died (or never answered): force-delete the
//! container with the OCI runtime, unmount its rootfs, deliver what the dead shim's spool still
//! holds, and answer with the exit the shim recorded in the bundle.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use containerd_shim_protos::api::DeleteResponse;
use containerd_shim_protos::protobuf::MessageField;
use slog::{o, Logger};

use super::{BootstrapError, Flags, FORWARD_TIMEOUT};
use crate::bundle::{ExitRecord, EXIT_FILE, OPTIONS_FILE};
use crate::options::RuntimeOptions;
use crate::process::{timestamp, timestamp_ns};
use crate::publisher::{drain_spool, Forwarder, TtrpcForwarder};
use crate::runc::SHORT_CALL_TIMEOUT;

/// `delete`: containerd's cleanup after the shim died (or never answered).
pub(super) fn delete_command(flags: &Flags) -> Result<(), BootstrapError> {
    let bundle = if flags.bundle.is_empty() {
        std::env::current_dir().map_err(|source| BootstrapError::Stdio {
            what: "read the working directory",
            source,
        })?
    } else {
        PathBuf::from(&flags.bundle)
    };
    let opts: RuntimeOptions = std::fs::read(bundle.join(OPTIONS_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    if !flags.id.is_empty() {
        // Best effort, as Go shims do: the answer matters more than a runtime that is gone.
        let args: [std::ffi::OsString; 5] = [
            "--root".into(),
            opts.root_for(&flags.namespace).into_os_string(),
            "delete".into(),
            "--force".into(),
            flags.id.clone().into(),
        ];
        // Bounded: a hung runtime must not hold containerd's cleanup (nor outlive it).
        match crate::runc::run_blocking(
            &opts.binary(),
            &args,
            "delete",
            &flags.id,
            SHORT_CALL_TIMEOUT,
        ) {
            Ok(o) if !o.status.success() => eprintln!(
                "runc delete {}: {}",
                flags.id,
                String::from_utf8_lossy(&o.stderr).trim()
            ),
            Ok(_) => {}
            Err(e) => eprintln!("{e}"),
        }
    }
    let rootfs = bundle.join("rootfs");
    if let Err(e) = nix::mount::umount2(&rootfs, nix::mount::MntFlags::MNT_DETACH) {
        if !matches!(e, nix::Error::EINVAL | nix::Error::ENOENT) {
            eprintln!("unmount {}: {e}", rootfs.display());
        }
    }
    deliver_dead_shims_events(flags, &bundle);

    let record: Option<ExitRecord> = std::fs::read(bundle.join(EXIT_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    let mut resp = DeleteResponse::new();
    match record {
        Some(r) => {
            resp.pid = r.pid;
            resp.exit_status = r.status;
            resp.exited_at = MessageField::some(timestamp_ns(r.exited_at_ns));
        }
        None => {
            // Never seen exiting (the shim died first): what every shim answers, SIGKILL.
            resp.pid = crate::runc::read_pid_file(&bundle.join("init.pid")).unwrap_or(0);
            resp.exit_status = 128 + libc::SIGKILL as u32;
            resp.exited_at = MessageField::some(timestamp(SystemTime::now()));
        }
    }
    super::write_message("DeleteResponse", &resp)
}

/// A dead shim's spool still holds events (a TaskOOM, say): deliver them now, bounded.
fn deliver_dead_shims_events(flags: &Flags, bundle: &Path) {
    let Ok(config) = std::fs::read(bundle.join("config.json")) else {
        return;
    };
    let Ok(group) = super::group_of(&config, &flags.id) else {
        return;
    };
    let socket = super::socket_path(
        Path::new(super::DEFAULT_SOCKET_DIR),
        &flags.address,
        &flags.namespace,
        &group,
    );
    let spool = super::spool_path(&socket);
    if !spool.exists() || std::os::unix::net::UnixStream::connect(&socket).is_ok() {
        // No spool, or its shim is alive and delivers it itself.
        return;
    }
    let Ok(ttrpc_address) = std::env::var("TTRPC_ADDRESS") else {
        return;
    };
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return;
    };
    let log = Logger::root(slog::Discard, o!());
    let forwarder: Arc<dyn Forwarder> =
        Arc::new(TtrpcForwarder::new(ttrpc_address, FORWARD_TIMEOUT));
    if let Err(e) = rt.block_on(drain_spool(&spool, forwarder, Duration::from_secs(5), &log)) {
        eprintln!("deliver {}: {e}", spool.display());
    }
}
