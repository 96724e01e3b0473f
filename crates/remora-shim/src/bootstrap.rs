//! The shim's command line and its bootstrap with containerd: `start`, `delete`, `-info`, `-v`,
//! and the long-running server mode.
//!
//! containerd runs the binary with Go-style flags (`-namespace NS -address GRPC
//! -publish-binary BIN [-id ID] [-bundle DIR] [-debug] ACTION`), the bundle as the working
//! directory, and `TTRPC_ADDRESS` / `GRPC_ADDRESS` / `NAMESPACE` in the environment.
//!
//! - `start`: containerd 2.3+ writes a protobuf `BootstrapParams` on stdin and reads a protobuf
//!   `BootstrapResult`; older daemons write nothing (or runtime options) and read JSON
//!   `{"version":3,"address":…,"protocol":"ttrpc"}`. `start` works out the pod's group (the
//!   `io.kubernetes.cri.sandbox-id` annotation), and either answers with the address of the
//!   group's live shim or binds the group's socket and re-executes itself as the server with
//!   the listening socket as fd 3. The socket is bound before the answer, so containerd's first
//!   connection waits in the backlog instead of racing the server's start.
//! - `delete`: containerd's cleanup after a shim died: force-delete the container with the OCI
//!   runtime, unmount its rootfs, and answer a protobuf `DeleteResponse` with the container's
//!   real exit status from the bundle (recorded by the shim when it saw the exit) — Go shims
//!   answer 137 whatever happened.
//! - no action: the server (`serve`): the task service ([`crate::service`]) on the socket
//!   `start` bound.
//!
//! This module is the process edge: it calls into the service, which never names it.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use containerd_shim_protos::bootstrap_api::{BootstrapParams, BootstrapResult};
use containerd_shim_protos::protobuf::{Message, MessageDyn};
use sha2::{Digest, Sha256};

mod delete;
mod info;
mod serve;

pub use serve::ServeError;

/// The runtime name containerd knows this shim by.
pub const RUNTIME_NAME: &str = "io.containerd.remora.v2";

/// The annotations that group containers into one shim (the pod's sandbox id first).
pub const GROUP_ANNOTATIONS: [&str; 2] = [
    "io.kubernetes.cri.sandbox-id",
    "io.containerd.runc.v2.group",
];

/// Where containerd's shims put their sockets unless told otherwise (Go `defaults.DefaultStateDir`
/// + "/s"), whatever containerd's own state dir is.
pub const DEFAULT_SOCKET_DIR: &str = "/run/containerd/s";

/// One event delivery's bound (the server's publisher, and `delete` draining a dead shim's
/// spool).
const FORWARD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// A bootstrap step that failed.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    /// The command line is malformed.
    #[error("bad command line: {0}")]
    Usage(String),
    /// A flag containerd must pass is missing.
    #[error("missing -{0}")]
    MissingFlag(&'static str),
    /// Reading stdin or writing stdout failed.
    #[error("{what}: {source}")]
    Stdio {
        /// "read stdin" or "write stdout".
        what: &'static str,
        /// The error.
        source: std::io::Error,
    },
    /// A protobuf message could not be encoded.
    #[error("encode {what}: {source}")]
    Encode {
        /// The message.
        what: &'static str,
        /// The error.
        source: containerd_shim_protos::protobuf::Error,
    },
    /// The bundle's config.json could not be read.
    #[error("{path}: {source}")]
    BundleRead {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// The bundle's config.json is not a JSON object with string annotations.
    #[error("{path}: {source}")]
    BundleConfig {
        /// The file.
        path: String,
        /// The error.
        source: serde_json::Error,
    },
    /// The group's socket could not be made.
    #[error("socket {path}: {source}")]
    Socket {
        /// The socket path.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// The server process could not be started.
    #[error("start the shim server: {0}")]
    Spawn(std::io::Error),
    /// The server failed.
    #[error(transparent)]
    Serve(#[from] ServeError),
}

/// The command line, as containerd writes it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Flags {
    /// `-namespace`.
    pub namespace: String,
    /// `-address`: containerd's gRPC socket.
    pub address: String,
    /// `-publish-binary`: containerd's binary.
    pub publish_binary: String,
    /// `-id`: the container (or sandbox) id.
    pub id: String,
    /// `-bundle`: the bundle (delete only; otherwise the working directory).
    pub bundle: String,
    /// `-socket`: the server's socket address (internal: `start` → server).
    pub socket: String,
    /// `-debug`.
    pub debug: bool,
    /// `-v`.
    pub version: bool,
    /// `-info`.
    pub info: bool,
    /// The action: "start", "delete", or empty for the server.
    pub action: String,
}

/// Parses Go `flag`-style arguments (`-f v`, `-f=v`, `--f v`; booleans without a value).
pub fn parse_args<I: IntoIterator<Item = String>>(args: I) -> Result<Flags, BootstrapError> {
    let mut f = Flags::default();
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        let Some(name) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
            if !f.action.is_empty() {
                return Err(BootstrapError::Usage(format!(
                    "unexpected argument {arg:?}"
                )));
            }
            f.action = arg;
            continue;
        };
        let (name, inline) = match name.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (name, None),
        };
        let flag_bool = |v: Option<String>| -> Result<bool, BootstrapError> {
            match v.as_deref() {
                None | Some("true") | Some("1") => Ok(true),
                Some("false") | Some("0") => Ok(false),
                Some(other) => Err(BootstrapError::Usage(format!(
                    "-{name}={other}: not a boolean"
                ))),
            }
        };
        match name {
            "debug" => f.debug = flag_bool(inline)?,
            "v" => f.version = flag_bool(inline)?,
            "info" => f.info = flag_bool(inline)?,
            "namespace" | "address" | "publish-binary" | "id" | "bundle" | "socket" => {
                let value = match inline {
                    Some(v) => v,
                    None => it
                        .next()
                        .ok_or_else(|| BootstrapError::Usage(format!("-{name} needs a value")))?,
                };
                let slot = match name {
                    "namespace" => &mut f.namespace,
                    "address" => &mut f.address,
                    "publish-binary" => &mut f.publish_binary,
                    "id" => &mut f.id,
                    "bundle" => &mut f.bundle,
                    _ => &mut f.socket,
                };
                *slot = value;
            }
            other => return Err(BootstrapError::Usage(format!("unknown flag -{other}"))),
        }
    }
    Ok(f)
}

/// What `start` learned from containerd: the bootstrap protocol's params, or the legacy flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartParams {
    /// The container id.
    pub id: String,
    /// The namespace.
    pub namespace: String,
    /// containerd's gRPC address (groups the socket name, as Go shims do).
    pub grpc_address: String,
    /// containerd's ttrpc address (where events go).
    pub ttrpc_address: String,
    /// Where to put the socket.
    pub socket_dir: PathBuf,
    /// containerd 2.3's protocol: answer with a protobuf `BootstrapResult`, else JSON.
    pub protobuf_reply: bool,
}

/// Reads `start`'s parameters: a protobuf `BootstrapParams` on stdin when containerd speaks
/// the 2.3 protocol (recognised by its addresses being set: runtime options that legacy
/// daemons may write there never carry them), else the legacy flags and environment.
pub fn start_params(flags: &Flags, stdin: &[u8], env: &HashMap<String, String>) -> StartParams {
    if !stdin.is_empty() {
        if let Ok(p) = BootstrapParams::parse_from_bytes(stdin) {
            if !p.containerd_ttrpc_address.is_empty() || !p.containerd_grpc_address.is_empty() {
                let or = |a: String, b: &str| if a.is_empty() { b.to_string() } else { a };
                return StartParams {
                    id: or(p.instance_id.clone(), &flags.id),
                    namespace: or(p.namespace.clone(), &flags.namespace),
                    grpc_address: or(p.containerd_grpc_address.clone(), &flags.address),
                    ttrpc_address: or(
                        p.containerd_ttrpc_address.clone(),
                        env.get("TTRPC_ADDRESS").map(String::as_str).unwrap_or(""),
                    ),
                    socket_dir: p
                        .socket_dir
                        .clone()
                        .filter(|d| !d.is_empty())
                        .map(PathBuf::from)
                        .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET_DIR)),
                    protobuf_reply: true,
                };
            }
        }
    }
    StartParams {
        id: flags.id.clone(),
        namespace: if flags.namespace.is_empty() {
            env.get("NAMESPACE").cloned().unwrap_or_default()
        } else {
            flags.namespace.clone()
        },
        grpc_address: flags.address.clone(),
        ttrpc_address: env.get("TTRPC_ADDRESS").cloned().unwrap_or_default(),
        socket_dir: PathBuf::from(DEFAULT_SOCKET_DIR),
        protobuf_reply: false,
    }
}

/// The group a container's shim serves: its pod's sandbox id from the bundle's annotations, or
/// its own id.
pub fn group_of(config_json: &[u8], id: &str) -> Result<String, serde_json::Error> {
    #[derive(serde::Deserialize)]
    struct Spec {
        #[serde(default)]
        annotations: HashMap<String, String>,
    }
    let spec: Spec = serde_json::from_slice(config_json)?;
    Ok(GROUP_ANNOTATIONS
        .iter()
        .find_map(|k| spec.annotations.get(*k).filter(|v| !v.is_empty()).cloned())
        .unwrap_or_else(|| id.to_string()))
}

/// The socket of a group's shim, named as Go shims name theirs (sha256 of
/// `<containerd address>/<namespace>/<group>`), so that one containerd's shims never collide.
pub fn socket_path(socket_dir: &Path, grpc_address: &str, namespace: &str, group: &str) -> PathBuf {
    let key = format!("{grpc_address}/{namespace}/{group}");
    socket_dir.join(hex::encode(Sha256::digest(key.as_bytes())))
}

/// The spool of a group's shim: undelivered events, beside its socket.
pub fn spool_path(socket: &Path) -> PathBuf {
    socket.with_extension("spool")
}

/// Entry point: runs the action and returns the process's exit code. Errors go to stderr,
/// which containerd shows in its own error for `start` and `delete`.
pub fn main() -> i32 {
    let flags = match parse_args(std::env::args().skip(1)) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("containerd-shim-remora-v2: {e}");
            return 2;
        }
    };
    let result = if flags.version {
        println!(
            "containerd-shim-remora-v2:\n  Runtime: {RUNTIME_NAME}\n  Version: {}",
            env!("CARGO_PKG_VERSION")
        );
        Ok(())
    } else if flags.info {
        info::info()
    } else {
        match flags.action.as_str() {
            "start" => start(&flags),
            "delete" => delete::delete_command(&flags),
            "" => serve::serve(&flags),
            other => Err(BootstrapError::Usage(format!("unknown action {other:?}"))),
        }
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("containerd-shim-remora-v2: {e}");
            1
        }
    }
}

/// `start`: answers with the group's shim address, starting the shim if the group has none.
fn start(flags: &Flags) -> Result<(), BootstrapError> {
    let mut stdin = Vec::new();
    std::io::stdin()
        .read_to_end(&mut stdin)
        .map_err(|source| BootstrapError::Stdio {
            what: "read stdin",
            source,
        })?;
    let env: HashMap<String, String> = std::env::vars().collect();
    let params = start_params(flags, &stdin, &env);
    if params.id.is_empty() {
        return Err(BootstrapError::MissingFlag("id"));
    }
    if params.namespace.is_empty() {
        return Err(BootstrapError::MissingFlag("namespace"));
    }
    let config_path = Path::new("config.json");
    let config = std::fs::read(config_path).map_err(|source| BootstrapError::BundleRead {
        path: cwd_join(config_path),
        source,
    })?;
    let group = group_of(&config, &params.id).map_err(|source| BootstrapError::BundleConfig {
        path: cwd_join(config_path),
        source,
    })?;
    let socket = socket_path(
        &params.socket_dir,
        &params.grpc_address,
        &params.namespace,
        &group,
    );
    let address = format!("unix://{}", socket.display());

    match bind_group_socket(&socket)? {
        Bound::Alive => {}
        Bound::New(listener) => spawn_server(flags, &params, &socket, listener)?,
    }
    // containerd reads it for shims it reloads; Go shims write it too.
    let _ = std::fs::write("address", &address);
    reply(&params, &address)
}

enum Bound {
    /// Another shim of the group serves the socket.
    Alive,
    /// The socket is ours, bound and listening.
    New(OwnedFd),
}

fn bind_group_socket(socket: &Path) -> Result<Bound, BootstrapError> {
    let err = |source| BootstrapError::Socket {
        path: socket.display().to_string(),
        source,
    };
    if let Some(dir) = socket.parent() {
        // As containerd's shims: a directory made here is the owner's alone (an existing one,
        // containerd's, is left as it is).
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(err)?;
    }
    for _ in 0..2 {
        match std::os::unix::net::UnixListener::bind(socket) {
            Ok(l) => {
                // Whoever can connect drives the shim (create, exec, kill): 0600 as
                // containerd's `shim.NewSocket`, never the umask's 0755.
                std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))
                    .map_err(err)?;
                return Ok(Bound::New(OwnedFd::from(l)));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                if std::os::unix::net::UnixStream::connect(socket).is_ok() {
                    return Ok(Bound::Alive);
                }
                // A dead shim's socket: take it over.
                std::fs::remove_file(socket).map_err(err)?;
            }
            Err(e) => return Err(err(e)),
        }
    }
    Err(err(std::io::Error::from(std::io::ErrorKind::AddrInUse)))
}

fn spawn_server(
    flags: &Flags,
    params: &StartParams,
    socket: &Path,
    listener: OwnedFd,
) -> Result<(), BootstrapError> {
    let exe = std::env::current_exe().map_err(BootstrapError::Spawn)?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("-namespace")
        .arg(&params.namespace)
        .arg("-id")
        .arg(&params.id)
        .arg("-address")
        .arg(&params.grpc_address)
        .arg("-publish-binary")
        .arg(&flags.publish_binary)
        .arg("-socket")
        .arg(socket);
    if flags.debug {
        cmd.arg("-debug");
    }
    cmd.env("TTRPC_ADDRESS", &params.ttrpc_address)
        // The shim tells systemd nothing; the OCI runtime must not see it either (see
        // `NOTIFY_SOCKET_ENV`).
        .env_remove(crate::runc::NOTIFY_SOCKET_ENV)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        // Its own process group: a signal to containerd's group must not reach the shim.
        .process_group(0);
    let fd = listener.as_raw_fd();
    // SAFETY: between fork and exec only async-signal-safe calls (dup2, fcntl) are made.
    unsafe {
        cmd.pre_exec(move || {
            if fd == 3 {
                // Already fd 3: just let it survive exec.
                let flags = libc::fcntl(3, libc::F_GETFD);
                if flags < 0 || libc::fcntl(3, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(fd, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    // Dropped, not waited for: the server outlives `start`; containerd reaps this process's
    // children (the server is re-parented to containerd's subreaper or init when we exit).
    cmd.spawn().map_err(BootstrapError::Spawn)?;
    drop(listener);
    Ok(())
}

fn reply(params: &StartParams, address: &str) -> Result<(), BootstrapError> {
    if params.protobuf_reply {
        let mut r = BootstrapResult::new();
        r.version = containerd_shim_protos::TASK_API_VERSION;
        r.address = address.to_string();
        r.protocol = "ttrpc".to_string();
        return write_message("BootstrapResult", &r);
    }
    let json = serde_json::json!({
        "version": containerd_shim_protos::TASK_API_VERSION,
        "address": address,
        "protocol": "ttrpc",
    });
    write_stdout(json.to_string().as_bytes())
}

/// Writes a protobuf answer to containerd on stdout (`start`, `delete`, `-info`).
pub fn write_message(what: &'static str, message: &dyn MessageDyn) -> Result<(), BootstrapError> {
    let bytes = message
        .write_to_bytes_dyn()
        .map_err(|source| BootstrapError::Encode { what, source })?;
    write_stdout(&bytes)
}

fn write_stdout(bytes: &[u8]) -> Result<(), BootstrapError> {
    let mut stdout = std::io::stdout();
    stdout
        .write_all(bytes)
        .and_then(|()| stdout.flush())
        .map_err(|source| BootstrapError::Stdio {
            what: "write stdout",
            source,
        })
}

fn cwd_join(p: &Path) -> String {
    std::env::current_dir()
        .map(|d| d.join(p))
        .unwrap_or_else(|_| p.to_path_buf())
        .display()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn parses_containerd_start_and_delete_command_lines() {
        let f = parse_args(args(
            "-namespace k8s.io -address /run/c.sock -publish-binary /usr/bin/containerd -id abc -debug start",
        ))
        .unwrap();
        assert_eq!(f.namespace, "k8s.io");
        assert_eq!(f.address, "/run/c.sock");
        assert_eq!(f.publish_binary, "/usr/bin/containerd");
        assert_eq!(f.id, "abc");
        assert!(f.debug);
        assert_eq!(f.action, "start");

        let f = parse_args(args("--namespace=ns -id=x -bundle /b -debug=false delete")).unwrap();
        assert_eq!(
            (f.namespace.as_str(), f.id.as_str(), f.bundle.as_str()),
            ("ns", "x", "/b")
        );
        assert!(!f.debug);
        assert_eq!(f.action, "delete");

        assert!(parse_args(args("-info")).unwrap().info);
        assert_eq!(parse_args(args("-namespace ns")).unwrap().action, "");
    }

    #[test]
    fn rejects_unknown_flags_missing_values_and_extra_arguments() {
        assert!(matches!(
            parse_args(args("-bogus start")),
            Err(BootstrapError::Usage(_))
        ));
        assert!(matches!(
            parse_args(args("-id")),
            Err(BootstrapError::Usage(_))
        ));
        assert!(matches!(
            parse_args(args("start delete")),
            Err(BootstrapError::Usage(_))
        ));
        assert!(matches!(
            parse_args(args("-debug=maybe")),
            Err(BootstrapError::Usage(_))
        ));
    }

    fn env() -> HashMap<String, String> {
        HashMap::from([
            ("TTRPC_ADDRESS".to_string(), "/run/c.sock.ttrpc".to_string()),
            ("NAMESPACE".to_string(), "envns".to_string()),
        ])
    }

    #[test]
    fn bootstrap_params_on_stdin_select_the_protobuf_protocol() {
        let mut p = BootstrapParams::new();
        p.instance_id = "abc".into();
        p.namespace = "k8s.io".into();
        p.containerd_ttrpc_address = "/run/x.sock.ttrpc".into();
        p.containerd_grpc_address = "/run/x.sock".into();
        p.socket_dir = Some("/tmp/s".into());
        let flags = parse_args(args("-namespace other -id other start")).unwrap();
        let sp = start_params(&flags, &p.write_to_bytes().unwrap(), &env());
        assert_eq!(sp.id, "abc");
        assert_eq!(sp.namespace, "k8s.io");
        assert_eq!(sp.ttrpc_address, "/run/x.sock.ttrpc");
        assert_eq!(sp.grpc_address, "/run/x.sock");
        assert_eq!(sp.socket_dir, PathBuf::from("/tmp/s"));
        assert!(sp.protobuf_reply);
    }

    #[test]
    fn legacy_start_uses_flags_and_environment_and_a_json_reply() {
        let flags = parse_args(args("-namespace ns -address /run/c.sock -id abc start")).unwrap();
        for stdin in [
            Vec::new(),
            b"\x0a\x1acontainerd.runc.v1.Options\x12\x00".to_vec(),
        ] {
            let sp = start_params(&flags, &stdin, &env());
            assert_eq!(sp.id, "abc");
            assert_eq!(sp.namespace, "ns");
            assert_eq!(sp.ttrpc_address, "/run/c.sock.ttrpc");
            assert_eq!(sp.socket_dir, PathBuf::from(DEFAULT_SOCKET_DIR));
            assert!(!sp.protobuf_reply);
        }
    }

    #[test]
    fn containers_of_a_pod_share_the_sandbox_group() {
        let c = br#"{"annotations":{"io.kubernetes.cri.sandbox-id":"pod1"}}"#;
        assert_eq!(group_of(c, "ctr").unwrap(), "pod1");
        assert_eq!(group_of(br#"{"process":{}}"#, "ctr").unwrap(), "ctr");
        assert!(group_of(b"not json", "ctr").is_err());
    }

    #[test]
    fn the_group_socket_is_0600_in_a_0700_directory() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let socket = tmp.path().join("s/abc");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let Bound::New(_fd) = bind_group_socket(&socket).unwrap() else {
            panic!("a fresh path binds anew");
        };
        assert_eq!(mode(&socket), 0o600);
        assert_eq!(mode(socket.parent().unwrap()), 0o700);
    }

    #[test]
    fn socket_names_follow_the_go_shims_hash() {
        let dir = Path::new("/run/containerd/s");
        let a = socket_path(dir, "/run/c.sock", "k8s.io", "pod1");
        let expect = hex::encode(Sha256::digest(b"/run/c.sock/k8s.io/pod1"));
        assert_eq!(a, dir.join(expect));
        assert_ne!(a, socket_path(dir, "/run/other.sock", "k8s.io", "pod1"));
        assert_eq!(spool_path(&a).extension().unwrap(), "spool");
    }
}
