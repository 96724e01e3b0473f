//! One runtime command and its command line: the subcommand's arguments after the global flags
//! (`--root`, `--log`, `--systemd-cgroup`).

use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use super::Timeouts;

/// One runtime command and its own arguments.
#[derive(Debug, Clone, Copy)]
pub(super) enum Call<'a> {
    Create {
        id: &'a str,
        bundle: &'a Path,
        pid_file: &'a Path,
        console_socket: Option<&'a Path>,
        no_pivot: bool,
        no_new_keyring: bool,
    },
    Start {
        id: &'a str,
    },
    Exec {
        id: &'a str,
        process_file: &'a Path,
        pid_file: &'a Path,
        console_socket: Option<&'a Path>,
    },
    Kill {
        id: &'a str,
        signal: u32,
        all: bool,
    },
    Delete {
        id: &'a str,
        force: bool,
    },
    // Made only by `Runc::state`, which only the tests use.
    #[cfg_attr(not(test), allow(dead_code))]
    State {
        id: &'a str,
    },
    Ps {
        id: &'a str,
    },
    Pause {
        id: &'a str,
    },
    Resume {
        id: &'a str,
    },
    Update {
        id: &'a str,
    },
    // Made only by `Runc::features`, which only the tests use.
    #[cfg_attr(not(test), allow(dead_code))]
    Features,
}

impl<'a> Call<'a> {
    pub(super) fn name(&self) -> &'static str {
        match self {
            Call::Create { .. } => "create",
            Call::Start { .. } => "start",
            Call::Exec { .. } => "exec",
            Call::Kill { .. } => "kill",
            Call::Delete { .. } => "delete",
            Call::State { .. } => "state",
            Call::Ps { .. } => "ps",
            Call::Pause { .. } => "pause",
            Call::Resume { .. } => "resume",
            Call::Update { .. } => "update",
            Call::Features => "features",
        }
    }

    /// How long the call may run.
    pub(super) fn timeout(&self, timeouts: &Timeouts) -> Duration {
        match self {
            Call::Create { .. } | Call::Start { .. } | Call::Exec { .. } => timeouts.long,
            _ => timeouts.short,
        }
    }

    /// The container id ("" for `features`).
    pub(super) fn id(&self) -> &'a str {
        match *self {
            Call::Create { id, .. }
            | Call::Start { id }
            | Call::Exec { id, .. }
            | Call::Kill { id, .. }
            | Call::Delete { id, .. }
            | Call::State { id }
            | Call::Ps { id }
            | Call::Pause { id }
            | Call::Resume { id }
            | Call::Update { id } => id,
            Call::Features => "",
        }
    }

    /// The bundle, where the call itself names it.
    pub(super) fn bundle(&self) -> Option<&'a Path> {
        match *self {
            Call::Create { bundle, .. } => Some(bundle),
            _ => None,
        }
    }

    /// Whether the call acts on an existing container, so that "does not exist" means the
    /// container (for `create` it means a path in the bundle, e.g. the rootfs).
    pub(super) fn on_existing_container(&self) -> bool {
        !matches!(self, Call::Create { .. } | Call::Features)
    }

    /// The subcommand and its arguments.
    pub(super) fn args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec![self.name().into()];
        match *self {
            Call::Create {
                id,
                bundle,
                pid_file,
                console_socket,
                no_pivot,
                no_new_keyring,
            } => {
                args.extend(["--bundle".into(), bundle.into()]);
                args.extend(["--pid-file".into(), pid_file.into()]);
                if let Some(socket) = console_socket {
                    args.extend(["--console-socket".into(), socket.into()]);
                }
                if no_pivot {
                    args.push("--no-pivot".into());
                }
                if no_new_keyring {
                    args.push("--no-new-keyring".into());
                }
                args.push(id.into());
            }
            Call::Exec {
                id,
                process_file,
                pid_file,
                console_socket,
            } => {
                args.extend(["--process".into(), process_file.into()]);
                args.push("--detach".into());
                args.extend(["--pid-file".into(), pid_file.into()]);
                if let Some(socket) = console_socket {
                    args.extend(["--console-socket".into(), socket.into()]);
                }
                args.push(id.into());
            }
            Call::Kill { id, signal, all } => {
                if all {
                    args.push("--all".into());
                }
                args.extend([id.into(), signal.to_string().into()]);
            }
            Call::Delete { id, force } => {
                if force {
                    args.push("--force".into());
                }
                args.push(id.into());
            }
            Call::Ps { id } => {
                args.extend(["--format".into(), "json".into(), id.into()]);
            }
            Call::Update { id } => {
                args.extend(["--resources".into(), "-".into(), id.into()]);
            }
            Call::Start { id } | Call::State { id } | Call::Pause { id } | Call::Resume { id } => {
                args.push(id.into());
            }
            Call::Features => {}
        }
        args
    }
}

/// The whole argument list: global flags, then the subcommand's.
pub(super) fn argv(
    root: &Path,
    systemd_cgroup: bool,
    log_file: Option<&Path>,
    call: &Call<'_>,
) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec!["--root".into(), root.into()];
    if let Some(log_file) = log_file {
        args.extend([
            "--log".into(),
            log_file.into(),
            "--log-format".into(),
            "json".into(),
        ]);
    }
    if systemd_cgroup {
        args.push("--systemd-cgroup".into());
    }
    args.extend(call.args());
    args
}
