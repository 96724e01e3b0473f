//! Pre-launched plugins: the executables of the plugin directory, started by the registry with
//! a connected socket (NRI v0.12.2 `pkg/adaptation`: `discoverPlugins`, `newLaunchedPlugin`,
//! `getPluginConfig`, `plugin.stop`).
//!
//! NRI's convention, which NRI's Go plugin library (`pkg/stub`) expects:
//!
//! - each file of the plugin directory named `<two-digit index>-<name>` with an execute bit
//!   is started, in file name order, with no arguments (argv\[0\] its path);
//! - its end of a socketpair is its fd 3; its environment is exactly `NRI_PLUGIN_NAME=<name>`,
//!   `NRI_PLUGIN_IDX=<index>` and `NRI_PLUGIN_SOCKET=3` (nothing else: no PATH);
//! - its stdin, stdout and stderr are /dev/null;
//! - its configuration, `<index>-<name>.conf` else `<name>.conf` in the configuration
//!   directory, is sent in Configure (not in the environment);
//! - it registers as any plugin, but its index and name are its file's, whatever it sends;
//! - it is killed (SIGKILL, no grace) and reaped when its registration fails, when its
//!   connection closes, and when the runtime stops.
//!
//! Where remora differs, for a directory that may hold anything: an entry that is not a
//! plugin is skipped and logged instead of failing the whole start (NRI fails on a badly named
//! executable or an unreadable configuration); names must also pass NRI's plugin name rule;
//! a world-writable executable is skipped (anyone could replace what root runs); WASM plugins
//! are skipped (not supported); at most [`MAX_LAUNCHED_PLUGINS`] are started and a directory
//! of more than [`MAX_PLUGIN_DIR_ENTRIES`] entries starts none; a configuration is read only if
//! it is a regular file of at most [`MAX_PLUGIN_CONFIG_LEN`] bytes of UTF-8; and the child gets
//! no other file descriptor of remora's (remora's end of every socketpair is close-on-exec,
//! and every descriptor above 3 is made close-on-exec in the child).
//!
//! Symlinks are followed wherever they point, as NRI does: installing a plugin as a link to a
//! packaged binary is common, and whoever can write the (root's) plugin directory can already
//! put any executable there, so a link out of it grants nothing more. What a link points to
//! must pass the same checks as a file (a regular file with an execute bit, not
//! world-writable); a dangling link, a loop, or a link to a directory or a device is skipped.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{self, Read as _};
use std::os::fd::{AsRawFd as _, RawFd};
use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};

use slog::{info, warn, Logger};
use tokio::process::{Child, Command};
use tokio::sync::{oneshot, watch};

use super::lock;
use super::runtime_service::check_registration;

/// The most plugins launched from the plugin directory; the rest are skipped and logged. Half
/// of [`super::MAX_PLUGINS`], which counts them too, so external plugins always have room.
pub const MAX_LAUNCHED_PLUGINS: usize = super::MAX_PLUGINS / 2;
/// A plugin directory with more entries than this launches nothing (logged): its names must
/// all be read to launch in order, and no real one comes near.
pub const MAX_PLUGIN_DIR_ENTRIES: usize = 1024;
/// The largest plugin configuration file read, in bytes; a larger one is refused (logged) and
/// its plugin not launched.
pub const MAX_PLUGIN_CONFIG_LEN: u64 = 1 << 20;

/// The plugin's end of its socketpair, as NRI passes it (`NRI_PLUGIN_SOCKET=3`).
const PLUGIN_FD: RawFd = 3;
/// NRI's environment variables for a launched plugin (`pkg/api/plugin.go`).
const ENV_SOCKET: &str = "NRI_PLUGIN_SOCKET";
const ENV_NAME: &str = "NRI_PLUGIN_NAME";
const ENV_IDX: &str = "NRI_PLUGIN_IDX";

/// A plugin of the plugin directory, to launch.
#[derive(Debug, PartialEq)]
pub(super) struct Found {
    /// Its file name, `<idx>-<base>`.
    pub name: String,
    pub idx: String,
    pub base: String,
    /// The path launched: the directory's entry (a symlink is launched as the link).
    pub path: PathBuf,
    /// Its configuration file's contents, empty if it has none.
    pub config: String,
}

/// Why an entry of the plugin directory was not launched.
#[derive(Debug, thiserror::Error)]
pub(super) enum Skip {
    #[error("a directory")]
    Directory,
    #[error("not a regular file but a {0}")]
    NotRegular(&'static str),
    #[error("not executable")]
    NotExecutable,
    #[error("cannot stat it (a dangling symlink?): {0}")]
    Stat(io::Error),
    #[error("not named <two-digit index>-<name>: {0}")]
    BadName(String),
    #[error("writable by anyone: not run")]
    WorldWritable,
    #[error("a WASM plugin: not supported")]
    Wasm,
    #[error("its configuration {path}: {error}")]
    Config { path: PathBuf, error: ConfigError },
    #[error("more than {MAX_LAUNCHED_PLUGINS} plugins: not launched")]
    TooMany,
}

impl Skip {
    /// Whether the entry is plainly not meant as a plugin (a README, a subdirectory): logged
    /// at info, the rest as warnings.
    pub(super) fn benign(&self) -> bool {
        matches!(self, Skip::Directory | Skip::NotExecutable)
    }
}

/// Why a plugin's configuration file was refused.
#[derive(Debug, thiserror::Error)]
pub(super) enum ConfigError {
    #[error("{0}")]
    Io(io::Error),
    #[error("not a regular file")]
    NotRegular,
    #[error("larger than {MAX_PLUGIN_CONFIG_LEN} bytes")]
    TooLarge,
    #[error("not UTF-8")]
    NotUtf8,
}

/// Why the plugin directory launched nothing.
#[derive(Debug, thiserror::Error)]
pub(super) enum ScanError {
    #[error("reading plugin directory {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("plugin directory {0} has more than {MAX_PLUGIN_DIR_ENTRIES} entries")]
    TooManyEntries(PathBuf),
}

/// What a scan of the plugin directory found, in file name order.
#[derive(Debug, Default)]
pub(super) struct Scan {
    pub found: Vec<Found>,
    pub skipped: Vec<(OsString, Skip)>,
}

/// Scans `dir` for plugins and reads their configuration from `config_dir`. A missing `dir`
/// has none.
pub(super) fn scan(dir: &Path, config_dir: Option<&Path>) -> Result<Scan, ScanError> {
    let read_err = |source| ScanError::Read {
        path: dir.to_path_buf(),
        source,
    };
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Scan::default()),
        Err(err) => return Err(read_err(err)),
    };
    let mut names = Vec::new();
    for entry in entries {
        if names.len() == MAX_PLUGIN_DIR_ENTRIES {
            return Err(ScanError::TooManyEntries(dir.to_path_buf()));
        }
        names.push(entry.map_err(read_err)?.file_name());
    }
    names.sort();

    let mut scan = Scan::default();
    for name in names {
        match check_entry(dir, &name, config_dir) {
            Ok(_) if scan.found.len() == MAX_LAUNCHED_PLUGINS => {
                scan.skipped.push((name, Skip::TooMany));
            }
            Ok(found) => scan.found.push(found),
            Err(skip) => scan.skipped.push((name, skip)),
        }
    }
    Ok(scan)
}

/// One entry of the plugin directory: a plugin to launch, or why not.
fn check_entry(dir: &Path, name: &OsString, config_dir: Option<&Path>) -> Result<Found, Skip> {
    let path = dir.join(name);
    // Follows a symlink: what is run is what it points to (module docs).
    let meta = std::fs::metadata(&path).map_err(Skip::Stat)?;
    let kind = meta.file_type();
    if kind.is_dir() {
        return Err(Skip::Directory);
    }
    if !kind.is_file() {
        return Err(Skip::NotRegular(file_kind(&kind)));
    }
    let mode = meta.permissions().mode();
    if mode & 0o111 == 0 {
        return Err(Skip::NotExecutable);
    }
    let name = name
        .to_str()
        .ok_or_else(|| Skip::BadName(format!("{name:?} is not UTF-8")))?;
    let (idx, base) = name
        .split_once('-')
        .ok_or_else(|| Skip::BadName(format!("no '-' in {name:?}")))?;
    check_registration(idx, base).map_err(Skip::BadName)?;
    if mode & 0o002 != 0 {
        return Err(Skip::WorldWritable);
    }
    if is_wasm(&path) {
        return Err(Skip::Wasm);
    }
    let config = match config_dir {
        Some(config_dir) => read_config(config_dir, idx, base)?,
        None => String::new(),
    };
    Ok(Found {
        name: name.to_string(),
        idx: idx.to_string(),
        base: base.to_string(),
        path,
        config,
    })
}

fn file_kind(kind: &std::fs::FileType) -> &'static str {
    if kind.is_fifo() {
        "FIFO"
    } else if kind.is_socket() {
        "socket"
    } else if kind.is_block_device() {
        "block device"
    } else if kind.is_char_device() {
        "character device"
    } else {
        "special file"
    }
}

/// Whether the file starts with WASM's magic and version (NRI's `isWasm`). Unreadable: no.
fn is_wasm(path: &Path) -> bool {
    const MAGIC: [u8; 8] = [0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00];
    let mut head = [0u8; 8];
    open_nonblocking(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok_and(|()| head == MAGIC)
}

/// Opens for reading without blocking on a FIFO put in a regular file's place.
fn open_nonblocking(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
}

/// The plugin's configuration: `<idx>-<base>.conf`, else `<base>.conf`, else none.
fn read_config(config_dir: &Path, idx: &str, base: &str) -> Result<String, Skip> {
    for file in [format!("{idx}-{base}.conf"), format!("{base}.conf")] {
        let path = config_dir.join(file);
        match read_bounded(&path) {
            Ok(config) => return Ok(config),
            Err(ConfigError::Io(err)) if err.kind() == io::ErrorKind::NotFound => {}
            Err(error) => return Err(Skip::Config { path, error }),
        }
    }
    Ok(String::new())
}

/// A regular file of at most [`MAX_PLUGIN_CONFIG_LEN`] bytes of UTF-8.
fn read_bounded(path: &Path) -> Result<String, ConfigError> {
    let file = open_nonblocking(path).map_err(ConfigError::Io)?;
    // The opened file's type: no window for a swap after a check of the path.
    let meta = file.metadata().map_err(ConfigError::Io)?;
    if !meta.is_file() {
        return Err(ConfigError::NotRegular);
    }
    if meta.len() > MAX_PLUGIN_CONFIG_LEN {
        return Err(ConfigError::TooLarge);
    }
    let mut bytes = Vec::new();
    // One byte more than allowed tells a file that grew since the stat.
    file.take(MAX_PLUGIN_CONFIG_LEN + 1)
        .read_to_end(&mut bytes)
        .map_err(ConfigError::Io)?;
    if bytes.len() as u64 > MAX_PLUGIN_CONFIG_LEN {
        return Err(ConfigError::TooLarge);
    }
    String::from_utf8(bytes).map_err(|_| ConfigError::NotUtf8)
}

/// Starts `plugin` as NRI does (module docs); returns the child and remora's end of its
/// socket.
pub(super) fn spawn(plugin: &Found) -> io::Result<(Child, tokio::net::UnixStream)> {
    // Both ends close-on-exec (std creates them so): neither reaches any other child.
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    let mut cmd = Command::new(&plugin.path);
    cmd.env_clear()
        .env(ENV_NAME, &plugin.base)
        .env(ENV_IDX, &plugin.idx)
        .env(ENV_SOCKET, PLUGIN_FD.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // A child not reaped by its watcher (the runtime shutting down) is still killed.
        .kill_on_drop(true);
    let fd = theirs.as_raw_fd();
    // SAFETY: the closure runs in the forked child before exec and calls only
    // async-signal-safe functions (fcntl, dup2, syscall); it allocates nothing.
    unsafe {
        cmd.pre_exec(move || pass_socket(fd));
    }
    let child = cmd.spawn()?;
    // The child has its copy; remora keeps only its own end.
    drop(theirs);
    ours.set_nonblocking(true)?;
    let ours = tokio::net::UnixStream::from_std(ours)?;
    Ok((child, ours))
}

/// In the forked child: makes `fd` the child's fd 3, inheritable, and every descriptor above
/// it close-on-exec (one remora inherited without close-on-exec itself must not reach a
/// plugin). Kernels before 5.11 lack `CLOSE_RANGE_CLOEXEC`; there remora's own descriptors are
/// close-on-exec anyway, so that step is best effort. (std's own exec-error pipe is
/// close-on-exec already and stays open until exec.)
fn pass_socket(fd: RawFd) -> io::Result<()> {
    // SAFETY: plain fd syscalls on descriptors this process owns.
    unsafe {
        if fd == PLUGIN_FD {
            // dup2 onto itself would keep close-on-exec: clear it.
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                return Err(io::Error::last_os_error());
            }
        } else if libc::dup2(fd, PLUGIN_FD) < 0 {
            return Err(io::Error::last_os_error());
        }
        libc::syscall(
            libc::SYS_close_range,
            (PLUGIN_FD + 1) as libc::c_uint,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        );
    }
    Ok(())
}

/// A launched plugin's process, watched by a task that reaps it: when it exits, or once
/// killed by [`Process::kill`] or by the last reference's drop.
pub(super) struct Process {
    pub pid: u32,
    kill: Mutex<Option<oneshot::Sender<()>>>,
    exit: watch::Receiver<Option<ExitStatus>>,
}

impl Process {
    /// Watches `child`; logs its end once.
    pub(super) fn watch(mut child: Child, log: Logger) -> Arc<Process> {
        // A spawned child has a pid until it is reaped, which only the task below does.
        let pid = child.id().unwrap_or_default();
        let (kill_tx, kill_rx) = oneshot::channel::<()>();
        let (exit_tx, exit) = watch::channel(None);
        tokio::spawn(async move {
            let (status, killed) = tokio::select! {
                status = child.wait() => (status, false),
                // A kill, or the Process dropped (its sender with it).
                _ = kill_rx => {
                    // It may have exited meanwhile: killing an unreaped child is harmless.
                    let _ = child.start_kill();
                    (child.wait().await, true)
                }
            };
            match status {
                Ok(status) => {
                    if killed {
                        info!(log, "NRI: launched plugin killed and reaped"; "status" => %status);
                    } else {
                        warn!(log, "NRI: launched plugin exited"; "status" => %status);
                    }
                    exit_tx.send_replace(Some(status));
                }
                // Only if the child was reaped elsewhere, which nothing here does.
                Err(err) => {
                    warn!(log, "NRI: waiting for a launched plugin failed"; "error" => %err)
                }
            }
        });
        Arc::new(Process {
            pid,
            kill: Mutex::new(Some(kill_tx)),
            exit,
        })
    }

    /// Kills the process (SIGKILL, as NRI); its watcher reaps it. Idempotent.
    pub(super) fn kill(&self) {
        if let Some(kill) = lock(&self.kill).take() {
            // The watcher is gone only once the process was reaped.
            let _ = kill.send(());
        }
    }

    /// Waits until the process was reaped; its exit status (None: the wait failed).
    pub(super) async fn reaped(&self) -> Option<ExitStatus> {
        let mut exit = self.exit.clone();
        // An error: the watcher ended without a status (its wait failed).
        let status = match exit.wait_for(Option::is_some).await {
            Ok(status) => *status,
            Err(_) => None,
        };
        status
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::ffi::OsStringExt as _;
    use std::os::unix::fs::symlink;

    use super::*;

    fn write(path: &Path, contents: &[u8], mode: u32) {
        std::fs::write(path, contents).expect("write");
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }

    fn exe(dir: &Path, name: &str) {
        write(&dir.join(name), b"#!/bin/sh\n", 0o755);
    }

    fn found_names(scan: &Scan) -> Vec<&str> {
        scan.found.iter().map(|f| f.name.as_str()).collect()
    }

    /// The skipped entries as (name, reason's variant name).
    fn skipped(scan: &Scan) -> Vec<(String, String)> {
        scan.skipped
            .iter()
            .map(|(name, skip)| {
                let reason = format!("{skip:?}");
                let variant = reason
                    .split(|c: char| !c.is_alphanumeric())
                    .next()
                    .unwrap_or_default()
                    .to_string();
                (name.to_string_lossy().into_owned(), variant)
            })
            .collect()
    }

    #[test]
    fn only_executables_named_nn_name_are_found_in_name_order() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("plugins");
        std::fs::create_dir(&dir).expect("mkdir");
        exe(&dir, "20-b");
        exe(&dir, "10-a");
        exe(&dir, "10-a.b_c+d-e");
        write(&dir.join("README"), b"docs", 0o644);
        write(&dir.join("15-noexec"), b"#!/bin/sh\n", 0o644);
        std::fs::create_dir(dir.join("30-dir")).expect("mkdir");
        for bad in [
            "1-x", "100-x", "ab-x", "10-", "10-a b", "10-a~", "nodash", "٣٣-x",
        ] {
            exe(&dir, bad);
        }
        let not_utf8 = OsString::from_vec(b"10-\xff".to_vec());
        write(&dir.join(&not_utf8), b"#!/bin/sh\n", 0o755);
        write(&dir.join("40-open"), b"#!/bin/sh\n", 0o777);
        write(
            &dir.join("50-wasm"),
            &[0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, 0x01],
            0o755,
        );
        let fifo = std::ffi::CString::new(dir.join("60-fifo").into_os_string().into_vec())
            .expect("no NUL");
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o755) }, 0);

        let scan = scan(&dir, None).expect("scan");
        assert_eq!(found_names(&scan), ["10-a", "10-a.b_c+d-e", "20-b"]);
        let a = &scan.found[0];
        assert_eq!((a.idx.as_str(), a.base.as_str()), ("10", "a"));
        assert_eq!(a.path, dir.join("10-a"));
        assert_eq!(a.config, "");
        let mut got = skipped(&scan);
        got.sort();
        let mut want: Vec<(String, String)> = [
            ("1-x", "BadName"),
            ("10-", "BadName"),
            ("10-a b", "BadName"),
            ("10-a~", "BadName"),
            ("10-\u{fffd}", "BadName"),
            ("100-x", "BadName"),
            ("15-noexec", "NotExecutable"),
            ("30-dir", "Directory"),
            ("40-open", "WorldWritable"),
            ("50-wasm", "Wasm"),
            ("60-fifo", "NotRegular"),
            ("README", "NotExecutable"),
            ("ab-x", "BadName"),
            ("nodash", "BadName"),
            ("٣٣-x", "BadName"),
        ]
        .iter()
        .map(|(n, s)| (n.to_string(), s.to_string()))
        .collect();
        want.sort();
        assert_eq!(got, want);
    }

    #[test]
    fn symlinks_are_followed_to_what_they_point_at_anywhere() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("plugins");
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir(&dir).expect("mkdir");
        std::fs::create_dir(&elsewhere).expect("mkdir");
        exe(&elsewhere, "binary");
        write(&elsewhere.join("text"), b"x", 0o644);
        write(&elsewhere.join("open"), b"#!/bin/sh\n", 0o777);
        symlink(elsewhere.join("binary"), dir.join("10-outside")).expect("symlink");
        symlink("../elsewhere/binary", dir.join("11-relative")).expect("symlink");
        symlink(elsewhere.join("text"), dir.join("20-text")).expect("symlink");
        symlink(elsewhere.join("open"), dir.join("25-open")).expect("symlink");
        symlink(&elsewhere, dir.join("30-dir")).expect("symlink");
        symlink(elsewhere.join("gone"), dir.join("40-dangling")).expect("symlink");
        symlink(dir.join("50-loop"), dir.join("50-loop")).expect("symlink");
        symlink("/dev/null", dir.join("60-dev")).expect("symlink");

        let scan = scan(&dir, None).expect("scan");
        assert_eq!(found_names(&scan), ["10-outside", "11-relative"]);
        // Launched as the link, named by the link.
        assert_eq!(scan.found[0].path, dir.join("10-outside"));
        assert_eq!(
            skipped(&scan),
            [
                ("20-text".to_string(), "NotExecutable".to_string()),
                ("25-open".into(), "WorldWritable".into()),
                ("30-dir".into(), "Directory".into()),
                ("40-dangling".into(), "Stat".into()),
                ("50-loop".into(), "Stat".into()),
                ("60-dev".into(), "NotRegular".into()),
            ]
        );
    }

    #[test]
    fn the_configuration_is_idx_name_conf_else_name_conf_and_is_bounded() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("plugins");
        let conf = tmp.path().join("conf.d");
        std::fs::create_dir(&dir).expect("mkdir");
        std::fs::create_dir(&conf).expect("mkdir");
        for name in [
            "10-both", "11-base", "12-none", "13-big", "14-max", "15-dir", "16-fifo", "17-bin",
        ] {
            exe(&dir, name);
        }
        write(&conf.join("10-both.conf"), b"indexed", 0o644);
        write(&conf.join("both.conf"), b"plain", 0o644);
        write(&conf.join("base.conf"), b"for any index", 0o644);
        let max = usize::try_from(MAX_PLUGIN_CONFIG_LEN).expect("fits");
        write(&conf.join("big.conf"), &vec![b'x'; max + 1], 0o644);
        write(&conf.join("14-max.conf"), &vec![b'x'; max], 0o644);
        std::fs::create_dir(conf.join("dir.conf")).expect("mkdir");
        let fifo = std::ffi::CString::new(conf.join("fifo.conf").into_os_string().into_vec())
            .expect("no NUL");
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        write(&conf.join("bin.conf"), b"\xff\xfe", 0o644);

        // A FIFO does not block the scan.
        let scan = scan(&dir, Some(&conf)).expect("scan");
        let configs: Vec<(&str, usize, &str)> = scan
            .found
            .iter()
            .map(|f| {
                (
                    f.name.as_str(),
                    f.config.len(),
                    &f.config[..f.config.len().min(20)],
                )
            })
            .collect();
        assert_eq!(
            configs,
            [
                ("10-both", 7, "indexed"),
                ("11-base", 13, "for any index"),
                ("12-none", 0, ""),
                ("14-max", max, "xxxxxxxxxxxxxxxxxxxx"),
            ]
        );
        let reasons: Vec<(String, String)> = scan
            .skipped
            .iter()
            .map(|(name, skip)| match skip {
                Skip::Config { path, error } => (
                    name.to_string_lossy().into_owned(),
                    format!("{}: {error}", path.file_name().unwrap().to_string_lossy()),
                ),
                other => panic!("{name:?} skipped for {other}"),
            })
            .collect();
        assert_eq!(
            reasons,
            [
                (
                    "13-big".to_string(),
                    "big.conf: larger than 1048576 bytes".to_string()
                ),
                ("15-dir".into(), "dir.conf: not a regular file".into()),
                ("16-fifo".into(), "fifo.conf: not a regular file".into()),
                ("17-bin".into(), "bin.conf: not UTF-8".into()),
            ]
        );
    }

    #[test]
    fn at_most_max_launched_plugins_are_found_and_a_huge_directory_launches_none() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("plugins");
        std::fs::create_dir(&dir).expect("mkdir");
        for i in 0..MAX_LAUNCHED_PLUGINS + 3 {
            exe(&dir, &format!("{:02}-p", i));
        }
        let got = scan(&dir, None).expect("scan");
        assert_eq!(got.found.len(), MAX_LAUNCHED_PLUGINS);
        assert_eq!(got.found[0].name, "00-p");
        assert_eq!(
            got.found.last().map(|f| f.name.clone()),
            Some(format!("{:02}-p", MAX_LAUNCHED_PLUGINS - 1))
        );
        assert_eq!(got.skipped.len(), 3);
        assert!(got
            .skipped
            .iter()
            .all(|(_, skip)| matches!(skip, Skip::TooMany)));

        // Exactly the limit of entries is scanned; one more launches none.
        let big = tmp.path().join("big");
        std::fs::create_dir(&big).expect("mkdir");
        for i in 0..MAX_PLUGIN_DIR_ENTRIES {
            write(&big.join(format!("f{i}")), b"", 0o644);
        }
        let got = scan(&big, None).expect("at the limit");
        assert!(got.found.is_empty());
        write(&big.join("one-more"), b"", 0o644);
        assert!(matches!(
            scan(&big, None),
            Err(ScanError::TooManyEntries(p)) if p == big
        ));
    }

    #[test]
    fn a_missing_directory_has_no_plugins_and_a_file_in_its_place_is_an_error() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let got = scan(&tmp.path().join("missing"), None).expect("missing is empty");
        assert!(got.found.is_empty() && got.skipped.is_empty());
        let file = tmp.path().join("file");
        write(&file, b"", 0o755);
        assert!(matches!(scan(&file, None), Err(ScanError::Read { .. })));
    }
}
