//! Tests of the shim's process IO on real FIFOs, pipes, files, logging binaries and ptys, in
//! temp dirs. The test acts as the client (FIFO readers/writers), as the container (the
//! child's ends) and, for terminals, as runc (sending a pty master over the console socket).

use super::fd::{read_some, write_all};
use super::*;

use std::ffi::CStr;
use std::fs::OpenOptions;
use std::io::IoSlice;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream as StdUnixStream;

use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
use nix::sys::stat::Mode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;

/// How long a test waits for a condition that should hold almost at once.
const DEADLINE: Duration = Duration::from_secs(10);

fn log() -> Logger {
    Logger::root(slog::Discard, slog::o!())
}

fn fifo(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    nix::unistd::mkfifo(&path, Mode::from_bits_truncate(0o600)).unwrap();
    path
}

fn spec(stdin: &Path, stdout: &Path, stderr: &Path) -> IoSpec {
    let s = |p: &Path| p.to_str().unwrap().to_string();
    IoSpec {
        stdin: s(stdin),
        stdout: s(stdout),
        stderr: s(stderr),
        terminal: false,
        owner: None,
    }
}

/// The client's reader of an output FIFO.
fn reader(path: &Path) -> pipe::Receiver {
    pipe::OpenOptions::new().open_receiver(path).unwrap()
}

/// Reads `rx` until what was read contains `want`; fails after [`DEADLINE`].
async fn read_until(rx: &mut pipe::Receiver, want: &str) -> String {
    let mut got = Vec::new();
    let result = tokio::time::timeout(DEADLINE, async {
        let mut buf = [0u8; 1024];
        while !String::from_utf8_lossy(&got).contains(want) {
            let n = rx.read(&mut buf).await.unwrap();
            assert!(
                n > 0,
                "EOF before {want:?}; got {:?}",
                String::from_utf8_lossy(&got)
            );
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    let got = String::from_utf8_lossy(&got).into_owned();
    assert!(result.is_ok(), "{want:?} did not arrive; got {got:?}");
    got
}

/// The container's end of an output stream.
fn child_writer(fd: Option<OwnedFd>) -> pipe::Sender {
    pipe::Sender::from_owned_fd(fd.expect("the child's end of an output stream")).unwrap()
}

/// Waits (bounded) for `pid`, a child of this test, to exit, and reaps that pid only.
async fn wait_exit(pid: i32) -> nix::sys::wait::WaitStatus {
    // SAFETY: pidfd_open returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    assert!(fd >= 0, "pidfd_open({pid}): {}", io::Error::last_os_error());
    // SAFETY: a fresh fd from pidfd_open.
    let pidfd = register("test", "pidfd", unsafe {
        OwnedFd::from_raw_fd(fd as RawFd)
    })
    .unwrap();
    let exited = tokio::time::timeout(DEADLINE, pidfd.readable()).await;
    assert!(exited.is_ok(), "pid {pid} did not exit");
    nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None).unwrap()
}

#[tokio::test]
async fn the_child_pipe_ends_belong_to_the_owner_asked_for() {
    // chown needs root (the unit tests run as root on the test machines; skipped otherwise).
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (input, out, err) = (
        fifo(dir.path(), "in"),
        fifo(dir.path(), "out"),
        fifo(dir.path(), "err"),
    );
    let (_out_rx, _err_rx) = (reader(&out), reader(&err));
    let spec = IoSpec {
        owner: Some((1_200_000, 1_300_000)),
        ..spec(&input, &out, &err)
    };
    let mut io = ProcessIo::prepare(&spec, "c1", "k8s.io", dir.path(), log())
        .await
        .unwrap();
    let stdio = io.take_stdio();
    for fd in [stdio.stdin, stdio.stdout, stdio.stderr] {
        let st = nix::sys::stat::fstat(fd.expect("a pipe end")).unwrap();
        assert_eq!((st.st_uid, st.st_gid), (1_200_000, 1_300_000));
    }
}

#[tokio::test]
async fn fifo_output_is_copied_in_order_and_drains_when_the_child_ends_close() {
    let dir = tempfile::tempdir().unwrap();
    let (out, err) = (fifo(dir.path(), "out"), fifo(dir.path(), "err"));
    let (mut out_rx, mut err_rx) = (reader(&out), reader(&err));
    let spec = IoSpec {
        stdin: String::new(),
        ..spec(Path::new(""), &out, &err)
    };
    let mut io = ProcessIo::prepare(&spec, "c1", "k8s.io", dir.path(), log())
        .await
        .unwrap();
    let stdio = io.take_stdio();
    assert!(stdio.stdin.is_none());
    let (mut out_tx, mut err_tx) = (child_writer(stdio.stdout), child_writer(stdio.stderr));
    io.start_copying().await.unwrap();

    out_tx.write_all(b"one\n").await.unwrap();
    err_tx.write_all(b"e1\n").await.unwrap();
    out_tx.write_all(b"two\n").await.unwrap();
    assert_eq!(read_until(&mut out_rx, "two\n").await, "one\ntwo\n");
    assert_eq!(read_until(&mut err_rx, "e1\n").await, "e1\n");

    // A child end still open: not drained.
    drop(out_tx);
    assert!(!io.wait_drained(Duration::from_millis(100)).await);
    // Bytes written just before the close still arrive, and then the copies are done.
    err_tx.write_all(b"last\n").await.unwrap();
    drop(err_tx);
    assert!(io.wait_drained(DEADLINE).await);
    assert_eq!(read_until(&mut err_rx, "last\n").await, "last\n");
}

#[tokio::test]
async fn stdin_is_copied_and_only_closed_by_close_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let input = fifo(dir.path(), "in");
    let spec = IoSpec {
        stdin: input.to_str().unwrap().to_string(),
        ..IoSpec::default()
    };
    let mut io = ProcessIo::prepare(&spec, "c1", "k8s.io", dir.path(), log())
        .await
        .unwrap();
    let stdio = io.take_stdio();
    assert!(stdio.stdout.is_none() && stdio.stderr.is_none());
    let mut child_in = pipe::Receiver::from_owned_fd(stdio.stdin.unwrap()).unwrap();
    io.start_copying().await.unwrap();

    let mut client = pipe::OpenOptions::new().open_sender(&input).unwrap();
    client.write_all(b"hello\n").await.unwrap();
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(DEADLINE, child_in.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf[..n], b"hello\n");

    // The client closes its writer: the shim's own write end keeps the process's stdin open,
    // and a new client can write again.
    drop(client);
    assert!(
        tokio::time::timeout(Duration::from_millis(100), child_in.read(&mut buf))
            .await
            .is_err(),
        "stdin must stay open until CloseIO"
    );
    let mut client = pipe::OpenOptions::new().open_sender(&input).unwrap();
    client.write_all(b"again\n").await.unwrap();
    drop(client);
    io.close_stdin();
    // What was written before CloseIO is delivered, then EOF.
    let mut rest = Vec::new();
    tokio::time::timeout(DEADLINE, child_in.read_to_end(&mut rest))
        .await
        .expect("stdin did not reach EOF after close_stdin")
        .unwrap();
    assert_eq!(rest, b"again\n");
}

#[tokio::test]
async fn an_output_fifo_reader_can_go_away_and_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let out = fifo(dir.path(), "out");
    let spec = IoSpec {
        stdout: out.to_str().unwrap().to_string(),
        ..IoSpec::default()
    };
    let mut io = ProcessIo::prepare(&spec, "c1", "k8s.io", dir.path(), log())
        .await
        .unwrap();
    let mut child_out = child_writer(io.take_stdio().stdout);
    io.start_copying().await.unwrap();

    let mut rx = reader(&out);
    child_out.write_all(b"a\n").await.unwrap();
    read_until(&mut rx, "a\n").await;
    // The reader goes away (remora restarts). Writes go on without EPIPE (nor SIGPIPE) and
    // are kept in the FIFO for the next reader.
    drop(rx);
    child_out.write_all(b"b\n").await.unwrap();
    let mut rx = reader(&out);
    child_out.write_all(b"c\n").await.unwrap();
    assert_eq!(read_until(&mut rx, "c\n").await, "b\nc\n");
    drop(child_out);
    assert!(io.wait_drained(DEADLINE).await);
}

#[tokio::test]
async fn stdout_and_stderr_on_one_fifo_share_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = fifo(dir.path(), "out");
    let path = out.to_str().unwrap().to_string();
    let spec = IoSpec {
        stdout: path.clone(),
        stderr: path,
        ..IoSpec::default()
    };
    let mut io = ProcessIo::prepare(&spec, "c1", "k8s.io", dir.path(), log())
        .await
        .unwrap();
    let stdio = io.take_stdio();
    let (mut out_tx, mut err_tx) = (child_writer(stdio.stdout), child_writer(stdio.stderr));
    io.start_copying().await.unwrap();
    let mut rx = reader(&out);
    out_tx.write_all(b"from stdout\n").await.unwrap();
    read_until(&mut rx, "from stdout\n").await;
    err_tx.write_all(b"from stderr\n").await.unwrap();
    read_until(&mut rx, "from stderr\n").await;
    // Both copies count for the drain.
    drop(out_tx);
    assert!(!io.wait_drained(Duration::from_millis(100)).await);
    drop(err_tx);
    assert!(io.wait_drained(DEADLINE).await);
}

#[tokio::test]
async fn empty_strings_connect_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut io = ProcessIo::prepare(&IoSpec::default(), "c1", "k8s.io", dir.path(), log())
        .await
        .unwrap();
    let stdio = io.take_stdio();
    assert!(stdio.stdin.is_none() && stdio.stdout.is_none() && stdio.stderr.is_none());
    assert!(io.console_socket().is_none() && io.logger_pid().is_none());
    io.start_copying().await.unwrap();
    assert!(io.wait_drained(Duration::from_millis(1)).await);
    assert!(matches!(io.resize(80, 24), Err(IoError::NoTerminal)));
    assert!(matches!(
        io.start_copying().await,
        Err(IoError::AlreadyStarted)
    ));

    // stderr alone.
    let err = fifo(dir.path(), "err");
    let spec = IoSpec {
        stderr: err.to_str().unwrap().to_string(),
        ..IoSpec::default()
    };
    let mut io = ProcessIo::prepare(&spec, "c1", "k8s.io", dir.path(), log())
        .await
        .unwrap();
    let stdio = io.take_stdio();
    assert!(stdio.stdin.is_none() && stdio.stdout.is_none() && stdio.stderr.is_some());
}

#[tokio::test]
async fn a_missing_path_or_unknown_scheme_fails_prepare() {
    let dir = tempfile::tempdir().unwrap();
    let missing = IoSpec {
        stdout: dir.path().join("nope").to_str().unwrap().to_string(),
        ..IoSpec::default()
    };
    let err = ProcessIo::prepare(&missing, "c1", "k8s.io", dir.path(), log())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            IoError::Open {
                stream: "stdout",
                ..
            }
        ),
        "{err}"
    );
    let binary_stdin = IoSpec {
        stdin: "binary:///bin/true".into(),
        ..IoSpec::default()
    };
    let err = ProcessIo::prepare(&binary_stdin, "c1", "k8s.io", dir.path(), log())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            IoError::UnsupportedScheme {
                stream: "stdin",
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn file_uri_appends_both_streams_to_one_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a/b/c.log");
    let spec = IoSpec {
        stdout: format!("file://{}", file.display()),
        stderr: "ignored".into(),
        ..IoSpec::default()
    };
    for round in ["first", "second"] {
        let mut io = ProcessIo::prepare(&spec, "c1", "k8s.io", dir.path(), log())
            .await
            .unwrap();
        let stdio = io.take_stdio();
        let (mut out_tx, mut err_tx) = (child_writer(stdio.stdout), child_writer(stdio.stderr));
        io.start_copying().await.unwrap();
        out_tx
            .write_all(format!("{round} out\n").as_bytes())
            .await
            .unwrap();
        err_tx
            .write_all(format!("{round} err\n").as_bytes())
            .await
            .unwrap();
        drop((out_tx, err_tx));
        assert!(io.wait_drained(DEADLINE).await);
    }
    let text = std::fs::read_to_string(&file).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    // Each round's two streams may interleave either way; rounds append in order.
    assert!(
        lines[..2].contains(&"first out") && lines[..2].contains(&"first err"),
        "{text}"
    );
    lines.sort_unstable();
    assert_eq!(
        lines,
        ["first err", "first out", "second err", "second out"]
    );
}

/// A logging binary after containerd's protocol: copies fd 3 and 4 to files in its `dir`
/// argument, records its environment, signals readiness on fd 5 with `ready`.
fn logger_script(dir: &Path, ready: &str) -> PathBuf {
    let script = dir.join("logger.sh");
    std::fs::write(
        &script,
        format!(
            r#"[ "$1" = dir ] || exit 2
d="$2"
echo "$CONTAINER_ID $CONTAINER_NAMESPACE $3 $4" > "$d/args"
/usr/bin/env > "$d/env"
/bin/cat <&3 4<&- 5>&- > "$d/out" &
/bin/cat <&4 3<&- 5>&- > "$d/err" &
exec 3<&- 4<&-
{ready}
wait
"#
        ),
    )
    .unwrap();
    script
}

/// A `binary://` URI running `script` with /bin/sh: the script is read, not executed, so no
/// ETXTBSY race with processes that other tests fork while it is being written.
fn logger_uri(scheme: &str, script: &Path, dir: &Path) -> String {
    format!(
        "{scheme}:///bin/sh?{}&dir={}&msg=a%20b",
        script.display(),
        dir.display()
    )
}

async fn run_binary_logger(scheme: &str, ready: &str) {
    let dir = tempfile::tempdir().unwrap();
    let script = logger_script(dir.path(), ready);
    let spec = IoSpec {
        stdout: logger_uri(scheme, &script, dir.path()),
        stderr: logger_uri(scheme, &script, dir.path()),
        ..IoSpec::default()
    };
    let mut io = ProcessIo::prepare(&spec, "c1", "k8s.io", dir.path(), log())
        .await
        .unwrap();
    let pid = io.logger_pid().expect("a logger pid");
    let stdio = io.take_stdio();
    let (mut out_tx, mut err_tx) = (child_writer(stdio.stdout), child_writer(stdio.stderr));
    io.start_copying().await.unwrap();
    // The logger reads the streams itself: nothing for the shim to drain.
    assert!(io.wait_drained(Duration::from_millis(1)).await);
    out_tx.write_all(b"to stdout\n").await.unwrap();
    err_tx.write_all(b"to stderr\n").await.unwrap();
    drop((out_tx, err_tx));
    // The logger sees EOF on both (the shim kept no end) and exits.
    let status = wait_exit(pid).await;
    assert_eq!(
        status,
        nix::sys::wait::WaitStatus::Exited(nix::unistd::Pid::from_raw(pid), 0)
    );
    let read = |name| std::fs::read_to_string(dir.path().join(name)).unwrap();
    assert_eq!(read("out"), "to stdout\n");
    assert_eq!(read("err"), "to stderr\n");
    assert_eq!(read("args"), "c1 k8s.io msg a b\n");
    // Only the two variables of the protocol are passed (and what sh sets itself).
    let env = read("env");
    let names: Vec<&str> = env.lines().filter_map(|l| l.split('=').next()).collect();
    assert!(names.contains(&"CONTAINER_ID") && names.contains(&"CONTAINER_NAMESPACE"));
    for (name, _) in std::env::vars() {
        assert!(
            ["PATH", "PWD", "OLDPWD", "SHLVL", "_"].contains(&name.as_str())
                || !names.contains(&name.as_str()),
            "the logger inherited {name}"
        );
    }
}

#[tokio::test]
async fn binary_logger_is_ready_when_it_closes_fd_5() {
    run_binary_logger("binary", "exec 5>&-").await;
}

#[tokio::test]
async fn binary_v2_logger_is_ready_when_it_writes_to_fd_5() {
    run_binary_logger("binary-v2", "echo r >&5; exec 5>&-").await;
}

#[tokio::test]
async fn binary_v2_logger_that_closes_fd_5_without_a_byte_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let script = logger_script(dir.path(), "exec 5>&-");
    let spec = IoSpec {
        stdout: logger_uri("binary-v2", &script, dir.path()),
        ..IoSpec::default()
    };
    let err = ProcessIo::prepare(&spec, "c1", "k8s.io", dir.path(), log())
        .await
        .unwrap_err();
    let IoError::LoggerNotReady { pid, .. } = err else {
        panic!("unexpected error {err}");
    };
    // Killed by prepare (or exited on its own after the pipes closed); reap it.
    wait_exit(pid).await;
}

#[tokio::test(start_paused = true)]
async fn a_logger_that_never_gets_ready_times_out_and_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    // Keeps fd 5 open and never writes to it.
    let script = logger_script(dir.path(), "exec /bin/sleep 1000");
    let spec = IoSpec {
        stdout: logger_uri("binary", &script, dir.path()),
        ..IoSpec::default()
    };
    // Paused time: the 10 s readiness timeout passes as soon as the runtime is idle.
    let err = ProcessIo::prepare(&spec, "c1", "k8s.io", dir.path(), log())
        .await
        .unwrap_err();
    let IoError::LoggerTimeout { pid, .. } = err else {
        panic!("unexpected error {err}");
    };
    // Not wait_exit: its deadline would pass at once on paused time. SIGKILL is immediate.
    let status = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None).unwrap();
    assert_eq!(
        status,
        nix::sys::wait::WaitStatus::Signaled(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
            false
        )
    );
}

/// A pty pair as runc makes one: (master, slave), close-on-exec (std opens so) and not this
/// process's controlling terminal.
fn open_pty() -> (OwnedFd, OwnedFd) {
    let master = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open("/dev/ptmx")
        .unwrap();
    let mut name = [0 as libc::c_char; 128];
    // SAFETY: plain libc calls on an fd we own, with a buffer of the given size.
    let path = unsafe {
        assert_eq!(libc::grantpt(master.as_raw_fd()), 0);
        assert_eq!(libc::unlockpt(master.as_raw_fd()), 0);
        assert_eq!(
            libc::ptsname_r(master.as_raw_fd(), name.as_mut_ptr(), name.len()),
            0
        );
        CStr::from_ptr(name.as_ptr()).to_str().unwrap().to_string()
    };
    let slave = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(path)
        .unwrap();
    (master.into(), slave.into())
}

/// Does what runc does with `--console-socket`: connects and sends the master.
fn send_master(socket: &Path, master: OwnedFd) {
    let stream = StdUnixStream::connect(socket).unwrap();
    sendmsg::<()>(
        stream.as_raw_fd(),
        &[IoSlice::new(b"/dev/ptmx")],
        &[ControlMessage::ScmRights(&[master.as_raw_fd()])],
        MsgFlags::empty(),
        None,
    )
    .unwrap();
    // runc closes its copy once sent.
}

fn async_tty(fd: OwnedFd) -> AsyncFd<OwnedFd> {
    set_nonblocking(&fd).unwrap();
    register("test", "slave", fd).unwrap()
}

async fn read_tty_until(tty: &AsyncFd<OwnedFd>, want: &str) -> String {
    let mut got = Vec::new();
    let result = tokio::time::timeout(DEADLINE, async {
        let mut buf = [0u8; 256];
        while !String::from_utf8_lossy(&got).contains(want) {
            let n = read_some(tty, &mut buf).await.unwrap();
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    let got = String::from_utf8_lossy(&got).into_owned();
    assert!(
        result.is_ok(),
        "{want:?} did not arrive on the tty; got {got:?}"
    );
    got
}

async fn terminal_io(dir: &Path) -> (ProcessIo, pipe::Receiver, PathBuf, AsyncFd<OwnedFd>) {
    let (out, input) = (fifo(dir, "out"), fifo(dir, "in"));
    let spec = IoSpec {
        terminal: true,
        stderr: String::new(),
        ..spec(&input, &out, Path::new(""))
    };
    let mut io = ProcessIo::prepare(&spec, "c1", "k8s.io", dir, log())
        .await
        .unwrap();
    let stdio = io.take_stdio();
    assert!(stdio.stdin.is_none() && stdio.stdout.is_none() && stdio.stderr.is_none());
    let socket = io.console_socket().unwrap().to_path_buf();
    assert!(socket.starts_with(dir) && socket.as_os_str().len() < SUN_PATH_LEN);
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the console socket is the shim's alone");
    }
    let (master, slave) = open_pty();
    send_master(&socket, master);
    io.start_copying().await.unwrap();
    assert!(
        !socket.exists(),
        "the console socket is removed once the master arrived"
    );
    (io, reader(&out), input, async_tty(slave))
}

#[tokio::test]
async fn terminal_output_input_resize_and_drain() {
    let dir = tempfile::tempdir().unwrap();
    let (io, mut out_rx, input, slave) = terminal_io(dir.path()).await;

    // The process writes to its terminal: the bytes (after the line discipline's \n → \r\n)
    // reach the stdout FIFO.
    write_all(&slave, b"hello\n").await.unwrap();
    read_until(&mut out_rx, "hello\r\n").await;

    // The client types: the process reads it from the terminal.
    let mut client = pipe::OpenOptions::new().open_sender(&input).unwrap();
    client.write_all(b"typed\n").await.unwrap();
    assert_eq!(read_tty_until(&slave, "typed\n").await, "typed\n");

    io.resize(100, 40).unwrap();
    let mut size = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes a winsize to a valid pointer.
    let rc = unsafe { libc::ioctl(slave.get_ref().as_raw_fd(), libc::TIOCGWINSZ, &mut size) };
    assert_eq!(rc, 0);
    assert_eq!((size.ws_col, size.ws_row), (100, 40));

    // The process (the last holder of the slave) goes: the output copy ends.
    assert!(!io.wait_drained(Duration::from_millis(100)).await);
    drop(slave);
    assert!(io.wait_drained(DEADLINE).await);
}

#[tokio::test]
async fn closing_a_terminals_stdin_hangs_the_terminal_up() {
    let dir = tempfile::tempdir().unwrap();
    let (io, _out_rx, _input, slave) = terminal_io(dir.path()).await;
    io.resize(80, 24).unwrap();
    io.close_stdin();
    // As containerd's shim: the console is shut down, the output copy stops, and the process
    // sees its terminal hang up.
    assert!(io.wait_drained(DEADLINE).await);
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(DEADLINE, read_some(&slave, &mut buf))
        .await
        .expect("the terminal did not hang up");
    assert!(
        matches!(read, Ok(0))
            || read.as_ref().err().and_then(|e| e.raw_os_error()) == Some(libc::EIO),
        "{read:?}"
    );
    assert!(matches!(io.resize(80, 24), Err(IoError::ConsoleClosed)));
}

#[tokio::test]
async fn a_console_socket_path_must_fit_a_sockaddr() {
    let dir = tempfile::tempdir().unwrap();
    let deep = dir.path().join("d".repeat(100));
    std::fs::create_dir(&deep).unwrap();
    let spec = IoSpec {
        terminal: true,
        ..IoSpec::default()
    };
    let err = ProcessIo::prepare(&spec, "c1", "k8s.io", &deep, log())
        .await
        .unwrap_err();
    assert!(
        matches!(err, IoError::ConsoleSocketPathTooLong { .. }),
        "{err}"
    );
}

#[tokio::test]
async fn dropping_an_unstarted_terminal_io_removes_its_socket() {
    let dir = tempfile::tempdir().unwrap();
    let spec = IoSpec {
        terminal: true,
        ..IoSpec::default()
    };
    let io = ProcessIo::prepare(&spec, "c1", "k8s.io", dir.path(), log())
        .await
        .unwrap();
    let socket = io.console_socket().unwrap().to_path_buf();
    assert!(socket.exists());
    assert!(matches!(io.resize(80, 24), Err(IoError::ConsoleClosed)));
    drop(io);
    assert!(!socket.exists());
}

#[tokio::test]
async fn a_plain_path_to_a_regular_file_is_appended_to() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("out.log");
    std::fs::write(&file, "before\n").unwrap();
    let spec = IoSpec {
        stdout: file.to_str().unwrap().to_string(),
        ..IoSpec::default()
    };
    let mut io = ProcessIo::prepare(&spec, "c1", "k8s.io", dir.path(), log())
        .await
        .unwrap();
    let mut out_tx = child_writer(io.take_stdio().stdout);
    io.start_copying().await.unwrap();
    out_tx.write_all(b"after\n").await.unwrap();
    drop(out_tx);
    assert!(io.wait_drained(DEADLINE).await);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "before\nafter\n");
}

#[tokio::test]
async fn a_terminal_with_a_binary_logger_feeds_the_pty_output_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let script = logger_script(dir.path(), "exec 5>&-");
    let spec = IoSpec {
        stdout: logger_uri("binary", &script, dir.path()),
        terminal: true,
        ..IoSpec::default()
    };
    let mut io = ProcessIo::prepare(&spec, "c1", "k8s.io", dir.path(), log())
        .await
        .unwrap();
    let pid = io.logger_pid().unwrap();
    let (master, slave) = open_pty();
    send_master(io.console_socket().unwrap(), master);
    io.start_copying().await.unwrap();
    let slave = async_tty(slave);
    write_all(&slave, b"on the tty\n").await.unwrap();
    drop(slave);
    assert!(io.wait_drained(DEADLINE).await);
    // At EOF the copy closed the logger's pipe (the shim keeps no other end): the logger
    // gets EOF on fd 3 (fd 4 had it at once) and exits once its cats are done.
    let status = wait_exit(pid).await;
    assert_eq!(
        status,
        nix::sys::wait::WaitStatus::Exited(nix::unistd::Pid::from_raw(pid), 0)
    );
    drop(io);
    let out = std::fs::read_to_string(dir.path().join("out")).unwrap();
    assert_eq!(out, "on the tty\r\n");
    assert_eq!(std::fs::read_to_string(dir.path().join("err")).unwrap(), "");
}

#[tokio::test]
async fn dropping_the_io_stops_the_copies_and_terms_the_logger() {
    let dir = tempfile::tempdir().unwrap();
    let out = fifo(dir.path(), "out");
    let spec = IoSpec {
        stdout: out.to_str().unwrap().to_string(),
        ..IoSpec::default()
    };
    let mut io = ProcessIo::prepare(&spec, "c1", "k8s.io", dir.path(), log())
        .await
        .unwrap();
    let mut out_tx = child_writer(io.take_stdio().stdout);
    io.start_copying().await.unwrap();
    let mut rx = reader(&out);
    out_tx.write_all(b"x\n").await.unwrap();
    read_until(&mut rx, "x\n").await;
    // The process still runs, but the shim lets go: its FIFO writer closes, so the client's
    // reader reaches EOF.
    drop(io);
    let mut rest = Vec::new();
    tokio::time::timeout(DEADLINE, rx.read_to_end(&mut rest))
        .await
        .expect("the FIFO writer was not closed by drop")
        .unwrap();
    assert!(rest.is_empty());

    let script = logger_script(dir.path(), "exec 5>&-");
    let spec = IoSpec {
        stdout: logger_uri("binary", &script, dir.path()),
        ..IoSpec::default()
    };
    let mut io = ProcessIo::prepare(&spec, "c1", "k8s.io", dir.path(), log())
        .await
        .unwrap();
    let pid = io.logger_pid().unwrap();
    // The process's ends stay open, so the logger (sh) runs until it is told to stop.
    let stdio = io.take_stdio();
    drop(io);
    let status = wait_exit(pid).await;
    assert_eq!(
        status,
        nix::sys::wait::WaitStatus::Signaled(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
            false
        )
    );
    // Lets the logger's cats see EOF and exit.
    drop(stdio);
}
