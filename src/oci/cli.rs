//! The OCI runtime's own command line ([`OciRuntime`]): what remora asks of runc (or crun)
//! directly, when no shim is left to ask.
//!
//! Every runtime command remora runs itself goes through [`output_within`]
//! (`crate::bounded`): bounded in time, and, when the bound passes or the caller gives up,
//! killed with its whole process group (what the runtime started, e.g. a poststop hook), not
//! just the runtime.

use std::time::Duration;

use crate::bounded::{output_within, Bounded};
use crate::lifecycle::backend::{ForceDeleted, OciCliError, OciRuntime, ShimRuntime};

/// The shims' default runtime binary and state root (both containerd's Go runc shim and
/// remora's shim); the root gets the containerd namespace appended.
const DEFAULT_BINARY: &str = "runc";
const DEFAULT_ROOT: &str = "/run/containerd/runc";

/// How long one runtime command may take (a forced delete waits for the kill).
const CLI_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs the OCI runtime of a container record for containerd namespace `namespace`.
pub struct OciCli {
    namespace: String,
}

impl OciCli {
    /// The runtime command line for containers of containerd namespace `namespace`.
    pub fn new(namespace: &str) -> Self {
        Self {
            namespace: namespace.to_string(),
        }
    }

    /// The binary and the global flags (`--root`, `--systemd-cgroup`) a shim would use.
    fn command_line(&self, runtime: &ShimRuntime) -> (String, Vec<String>) {
        let options = runtime.options.clone().unwrap_or_default();
        let binary = if options.binary_name.is_empty() {
            DEFAULT_BINARY.to_string()
        } else {
            options.binary_name
        };
        let root = if options.root.is_empty() {
            DEFAULT_ROOT.to_string()
        } else {
            options.root
        };
        let mut flags = vec![
            "--root".to_string(),
            std::path::Path::new(&root)
                .join(&self.namespace)
                .display()
                .to_string(),
        ];
        if options.systemd_cgroup {
            flags.push("--systemd-cgroup".to_string());
        }
        (binary, flags)
    }
}

async fn run(
    binary: &str,
    flags: &[String],
    command: &'static str,
    args: &[&str],
) -> Result<Result<Vec<u8>, OciCliError>, OciCliError> {
    let out = output_within(
        tokio::process::Command::new(binary)
            .args(flags)
            .arg(command)
            .args(args),
        CLI_TIMEOUT,
    )
    .await
    .map_err(|e| match e {
        Bounded::TimedOut => OciCliError::Timeout {
            binary: binary.to_string(),
            command,
            after: CLI_TIMEOUT,
        },
        Bounded::Io(source) => OciCliError::Spawn {
            binary: binary.to_string(),
            command,
            source,
        },
    })?;
    // The outer error: the command could not be run; the inner one: it ran and failed.
    Ok(if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(OciCliError::Failed {
            binary: binary.to_string(),
            command,
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    })
}

/// Whether a failed command said the container does not exist (runc: "container does not
/// exist"; crun: its state file is missing).
fn says_not_found(e: &OciCliError) -> bool {
    match e {
        OciCliError::Failed { stderr, .. } => {
            stderr.contains("does not exist") || stderr.contains("No such file or directory")
        }
        _ => false,
    }
}

/// What `<runtime> state` printed, as far as a forced delete cares.
fn parse_state(stdout: &[u8]) -> ForceDeleted {
    #[derive(serde::Deserialize)]
    struct State {
        #[serde(default)]
        status: String,
    }
    match serde_json::from_slice::<State>(stdout) {
        Ok(s) if matches!(s.status.as_str(), "running" | "paused" | "pausing") => {
            ForceDeleted::WasRunning
        }
        Ok(s) if matches!(s.status.as_str(), "stopped" | "created" | "creating") => {
            ForceDeleted::WasStopped
        }
        // A state the runtime cannot name: delete it, but claim no exit code for it.
        _ => ForceDeleted::Unknown,
    }
}

#[async_trait::async_trait]
impl OciRuntime for OciCli {
    async fn force_delete(
        &self,
        runtime: &ShimRuntime,
        id: &str,
    ) -> Result<ForceDeleted, OciCliError> {
        let (binary, flags) = self.command_line(runtime);
        let before = match run(&binary, &flags, "state", &[id]).await? {
            Ok(out) => parse_state(&out),
            Err(e) if says_not_found(&e) => return Ok(ForceDeleted::Unknown),
            Err(e) => return Err(e),
        };
        match run(&binary, &flags, "delete", &["--force", id]).await? {
            Ok(_) => Ok(before),
            Err(e) if says_not_found(&e) => Ok(ForceDeleted::Unknown),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::backend::RuncOptions;

    #[test]
    fn the_shims_defaults_are_used_unless_the_record_names_binary_and_root() {
        let cli = OciCli::new("k8s.io");
        let (binary, flags) = cli.command_line(&ShimRuntime::default());
        assert_eq!(binary, "runc");
        assert_eq!(flags, ["--root", "/run/containerd/runc/k8s.io"]);
        let (binary, flags) = cli.command_line(&ShimRuntime {
            name: "io.containerd.runc.v2".into(),
            options: Some(RuncOptions {
                binary_name: "/usr/bin/crun".into(),
                root: "/run/bed/runc".into(),
                systemd_cgroup: true,
                ..Default::default()
            }),
        });
        assert_eq!(binary, "/usr/bin/crun");
        assert_eq!(
            flags,
            ["--root", "/run/bed/runc/k8s.io", "--systemd-cgroup"]
        );
    }

    #[test]
    fn states_that_hold_processes_are_told_from_those_that_do_not() {
        let state =
            |s: &str| parse_state(format!(r#"{{"id":"c","pid":7,"status":"{s}"}}"#).as_bytes());
        assert_eq!(state("running"), ForceDeleted::WasRunning);
        assert_eq!(state("paused"), ForceDeleted::WasRunning);
        assert_eq!(state("stopped"), ForceDeleted::WasStopped);
        assert_eq!(state("created"), ForceDeleted::WasStopped);
        assert_eq!(state("odd"), ForceDeleted::Unknown);
        assert_eq!(parse_state(b"not json"), ForceDeleted::Unknown);
    }

    #[tokio::test]
    async fn a_missing_binary_is_an_error_naming_it() {
        let cli = OciCli::new("ns");
        let err = cli
            .force_delete(
                &ShimRuntime {
                    name: String::new(),
                    options: Some(RuncOptions {
                        binary_name: "/nonexistent/runc".into(),
                        ..Default::default()
                    }),
                },
                "c",
            )
            .await
            .expect_err("no such binary");
        assert!(matches!(err, OciCliError::Spawn { .. }), "{err}");
        assert!(err.to_string().contains("/nonexistent/runc state"), "{err}");
    }

    #[tokio::test]
    async fn a_container_the_runtime_does_not_know_is_unknown_not_an_error() {
        // The real runc (scripts/setup.sh installs it) with an empty root of our own.
        let dir = tempfile::tempdir().expect("a temp dir");
        let cli = OciCli::new("ns");
        let runtime = ShimRuntime {
            name: String::new(),
            options: Some(RuncOptions {
                root: dir.path().display().to_string(),
                ..Default::default()
            }),
        };
        assert_eq!(
            cli.force_delete(&runtime, "never-made")
                .await
                .expect("runs"),
            ForceDeleted::Unknown
        );
    }
}
