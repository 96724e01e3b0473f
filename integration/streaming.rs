//! Streaming (exec, attach, port-forward) on the test bed, with crictl as the real client,
//! over both transports kubelet's clients use: SPDY/3.1 and WebSocket.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use remora::cri::v1;
use tonic::Code;

use crate::cri::{self, container_config as container};
use crate::harness::{scratch, tool, wait_until, BedRemora};

const TRANSPORTS: [&str; 2] = ["spdy", "websocket"];

fn crictl(bed: &BedRemora, transport: &str, args: &[&str]) -> Command {
    let endpoint = format!("unix://{}", bed.remora.socket.display());
    let mut cmd = Command::new(tool("crictl"));
    cmd.args([
        "--runtime-endpoint",
        &endpoint,
        "--image-endpoint",
        &endpoint,
        "--timeout",
        "20s",
    ]);
    let (sub, rest) = args.split_first().expect("a crictl subcommand");
    cmd.arg(sub).args(["--transport", transport]).args(rest);
    cmd
}

/// Runs crictl with `stdin` as its input; bounded by `limit` (killed after it).
fn run(mut cmd: Command, stdin: &[u8], limit: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run crictl");
    let mut input = child.stdin.take().expect("stdin");
    let data = stdin.to_vec();
    std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    wait_child(child, limit)
}

fn wait_child(mut child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    while child.try_wait().expect("try_wait").is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("wait");
            panic!(
                "crictl did not finish within {limit:?}; stdout {:?}, stderr {:?}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("wait")
}

/// `crictl exec <id> echo <word>` over transport `t` succeeds and prints the word.
fn assert_exec_echoes(bed: &BedRemora, t: &str, id: &str, word: &str) {
    let out = run(
        crictl(bed, t, &["exec", id, "echo", word]),
        b"",
        Duration::from_secs(30),
    );
    assert!(out.status.success(), "{t}: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), format!("{word}\n"), "{t}");
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

struct Pod<'a> {
    bed: &'a BedRemora,
    id: String,
    config: v1::PodSandboxConfig,
}

async fn start_pod<'a>(bed: &'a BedRemora, name: &str, logs: &Path, host_network: bool) -> Pod<'a> {
    cri::pull(&bed.remora, "busybox")
        .await
        .expect("pull busybox");
    let config = cri::pod_config(name, logs, host_network);
    let id = cri::run_pod(&bed.remora, &config)
        .await
        .expect("RunPodSandbox");
    Pod { bed, id, config }
}

impl Pod<'_> {
    async fn run(&self, c: v1::ContainerConfig) -> String {
        cri::create_and_start(&self.bed.remora, &self.id, &self.config, c).await
    }
}

/// Processes in the container whose command line contains `needle` (through ExecSync).
async fn processes_matching(bed: &BedRemora, id: &str, needle: &str) -> usize {
    let r = bed
        .remora
        .runtime()
        .exec_sync(v1::ExecSyncRequest {
            container_id: id.into(),
            cmd: vec![
                "sh".into(),
                "-c".into(),
                "cat /proc/[0-9]*/cmdline | tr '\\0' ' '; echo".into(),
            ],
            timeout: 10,
        })
        .await
        .expect("ExecSync")
        .into_inner();
    // Each process's command line ends where the next begins; count occurrences.
    text(&r.stdout).matches(needle).count()
}

/// Files under remora's per-container IO directories (the exec FIFOs live there).
fn exec_fifos(bed: &BedRemora) -> Vec<String> {
    let mut found = Vec::new();
    let io = bed.state_dir().join("io");
    for c in std::fs::read_dir(&io).into_iter().flatten().flatten() {
        for f in std::fs::read_dir(c.path().join("exec"))
            .into_iter()
            .flatten()
            .flatten()
        {
            found.push(f.path().display().to_string());
        }
    }
    found
}

/// The streaming URL remora hands out for `true` in container `id`.
async fn exec_url(bed: &BedRemora, id: &str) -> String {
    bed.remora
        .runtime()
        .exec(v1::ExecRequest {
            container_id: id.to_owned(),
            cmd: vec!["true".into()],
            stdout: true,
            ..Default::default()
        })
        .await
        .expect("Exec")
        .into_inner()
        .url
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

#[tokio::test]
async fn exec_output_exit_codes_and_stdin_over_both_transports() {
    let bed = BedRemora::start_with_network();
    let logs = scratch();
    let pod = start_pod(&bed, "stream-exec", logs.path(), false).await;
    let id = pod.run(container("target", &["sleep", "3600"])).await;
    for t in TRANSPORTS {
        assert_exec_echoes(&bed, t, &id, "hello");

        let out = run(
            crictl(
                &bed,
                t,
                &["exec", &id, "sh", "-c", "echo to-err >&2; exit 5"],
            ),
            b"",
            Duration::from_secs(30),
        );
        assert!(!out.status.success(), "{t}: exit 5 must fail crictl");
        let err = text(&out.stderr);
        assert!(
            err.contains("to-err"),
            "{t}: stderr reaches the client: {err}"
        );
        assert!(
            err.contains("exit code 5"),
            "{t}: the exit code reaches the client: {err}"
        );

        // stdin, and its EOF: cat ends only when the client's stdin closes.
        let out = run(
            crictl(&bed, t, &["exec", "-i", &id, "cat"]),
            b"line one\nline two\n",
            Duration::from_secs(30),
        );
        assert!(out.status.success(), "{t}: {}", text(&out.stderr));
        assert_eq!(text(&out.stdout), "line one\nline two\n", "{t}");
    }
    assert_eq!(
        exec_fifos(&bed),
        Vec::<String>::new(),
        "exec FIFOs left behind"
    );
}

#[tokio::test]
async fn exec_errors_are_clear_before_any_url() {
    let bed = BedRemora::start_with_network();
    let logs = scratch();
    let pod = start_pod(&bed, "stream-errors", logs.path(), false).await;
    let created = cri::create(
        &bed.remora,
        &pod.id,
        &pod.config,
        container("idle", &["sleep", "3600"]),
    )
    .await
    .expect("create");
    let mut rt = bed.remora.runtime();
    let exec = |id: &str, tty: bool, stdin: bool, stdout: bool, stderr: bool| v1::ExecRequest {
        container_id: id.into(),
        cmd: vec!["true".into()],
        tty,
        stdin,
        stdout,
        stderr,
    };
    let err = rt
        .exec(exec(&created, false, false, true, false))
        .await
        .expect_err("not running");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    let err = rt
        .exec(exec("no-such-container", false, false, true, false))
        .await
        .expect_err("unknown");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    cri::start(&bed.remora, &created).await;
    let err = rt
        .exec(exec(&created, true, true, true, true))
        .await
        .expect_err("tty+stderr");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("stderr"), "{err:?}");
    let err = rt
        .exec(exec(&created, false, false, false, false))
        .await
        .expect_err("no streams");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    let err = rt
        .port_forward(v1::PortForwardRequest {
            pod_sandbox_id: "no-such-pod".into(),
            port: vec![80],
        })
        .await
        .expect_err("unknown pod");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    let err = rt
        .port_forward(v1::PortForwardRequest {
            pod_sandbox_id: pod.id.clone(),
            port: vec![80, 70000],
        })
        .await
        .expect_err("a port out of range");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("70000"), "{err:?}");

    // A URL is single use, and a made-up token is unknown: 404 both.
    let url = rt
        .exec(exec(&created, false, false, true, false))
        .await
        .expect("Exec")
        .into_inner()
        .url;
    let status = |url: &str| {
        let u = url.strip_prefix("http://").expect("http URL");
        let (host, path) = u.split_once('/').expect("path");
        let mut s = std::net::TcpStream::connect(host).expect("connect to the streaming server");
        write!(s, "GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n").unwrap();
        let mut head = [0u8; 12];
        s.read_exact(&mut head).expect("a response");
        text(&head)
    };
    let first = status(&url);
    assert!(first.contains("101"), "the first use upgrades: {first}");
    assert!(status(&url).contains("404"), "a used token is gone");
    let forged = format!("{}AAAA", &url[..url.len() - 4]);
    assert!(
        status(&forged).contains("404"),
        "a made-up token is unknown"
    );
}

/// Runs crictl under a pseudo-terminal of `rows`x`cols` (crictl wants a terminal for `-t`).
fn crictl_in_pty(
    bed: &BedRemora,
    transport: &str,
    args: &[&str],
    rows: u16,
    cols: u16,
) -> (Child, OwnedFd) {
    use std::os::unix::process::CommandExt;
    let size = nix::pty::Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pty = nix::pty::openpty(Some(&size), None).expect("openpty");
    let slave = pty.slave;
    let mut cmd = crictl(bed, transport, args);
    let (i, o, e) = (
        slave.try_clone().expect("dup"),
        slave.try_clone().expect("dup"),
        slave.try_clone().expect("dup"),
    );
    cmd.stdin(Stdio::from(i))
        .stdout(Stdio::from(o))
        .stderr(Stdio::from(e));
    unsafe {
        cmd.pre_exec(|| {
            // A session of its own with the pty as its controlling terminal, so SIGWINCH
            // reaches crictl when the size changes.
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            if libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().expect("run crictl in a pty");
    drop(slave);
    (child, pty.master)
}

/// Reads the pty master until `want` appears; panics after `limit` with what was read.
fn read_until(master: &OwnedFd, seen: &mut String, want: &str, limit: Duration) {
    let start = Instant::now();
    let fd = master.as_raw_fd();
    while !seen.contains(want) {
        assert!(
            start.elapsed() < limit,
            "did not see {want:?} within {limit:?}; got {seen:?}"
        );
        let mut fds = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ready = unsafe { libc::poll(&mut fds, 1, 200) };
        if ready <= 0 {
            continue;
        }
        let mut buf = [0u8; 4096];
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            assert!(
                seen.contains(want),
                "pty closed before {want:?}; got {seen:?}"
            );
            return;
        }
        seen.push_str(&String::from_utf8_lossy(&buf[..n as usize]));
    }
}

fn write_pty(master: &OwnedFd, data: &[u8]) {
    let n = unsafe { libc::write(master.as_raw_fd(), data.as_ptr().cast(), data.len()) };
    assert_eq!(n, data.len() as isize, "write to the pty");
}

#[tokio::test]
async fn exec_with_a_tty_sees_its_size_and_resizes() {
    let bed = BedRemora::start_with_network();
    let logs = scratch();
    let pod = start_pod(&bed, "stream-tty", logs.path(), false).await;
    let id = pod.run(container("target", &["sleep", "3600"])).await;
    for t in TRANSPORTS {
        let (mut child, master) = crictl_in_pty(&bed, t, &["exec", "-it", &id, "sh"], 33, 77);
        let mut seen = String::new();
        // Sizes travel on the resize stream, asynchronously to the process: the first one too
        // (the shell may run its first command before it lands, and `stty size` then fails).
        // Ask until the shell sees the size.
        let mut ask_until = |want: &str| {
            let start = Instant::now();
            while !seen.contains(want) {
                assert!(
                    start.elapsed() < Duration::from_secs(30),
                    "{t}: size {want} not seen: {seen:?}"
                );
                write_pty(&master, b"stty size\n");
                let mut more = String::new();
                read_until(&master, &mut more, "\n", Duration::from_secs(10));
                seen.push_str(&more);
                std::thread::sleep(Duration::from_millis(100));
            }
        };
        ask_until("33 77");
        let size = nix::pty::Winsize {
            ws_row: 41,
            ws_col: 99,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        assert_eq!(
            unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &size) },
            0
        );
        ask_until("41 99");
        write_pty(&master, b"exit 3\n");
        let status = wait_child(child_take(&mut child), Duration::from_secs(30)).status;
        assert!(!status.success(), "{t}: exit 3 fails crictl");
        drop(master);
    }
    assert_eq!(
        exec_fifos(&bed),
        Vec::<String>::new(),
        "exec FIFOs left behind"
    );
}

fn child_take(child: &mut Child) -> Child {
    std::mem::replace(child, Command::new("true").spawn().expect("true"))
}

#[tokio::test]
async fn attach_sees_live_output_and_feeds_stdin() {
    let bed = BedRemora::start_with_network();
    let logs = scratch();
    let pod = start_pod(&bed, "stream-attach", logs.path(), false).await;
    let ticker = pod
        .run(cri::shell_container(
            "ticker",
            "i=0; while true; do i=$((i+1)); echo tick-$i; sleep 1; done",
        ))
        .await;
    let mut echo = container("echo", &["sh", "-c", "while read l; do echo got-$l; done"]);
    echo.stdin = true;
    let echo = pod.run(echo).await;
    for t in TRANSPORTS {
        // Two sessions at once: both see the output (it fans out).
        let spawn = || {
            crictl(&bed, t, &["attach", &ticker])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("crictl attach")
        };
        let (mut a, mut b) = (spawn(), spawn());
        for c in [&mut a, &mut b] {
            let mut out = c.stdout.take().expect("stdout");
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let mut seen = Vec::new();
                let mut buf = [0u8; 256];
                while let Ok(n) = out.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    seen.extend_from_slice(&buf[..n]);
                    if text(&seen).matches("tick-").count() >= 2 {
                        let _ = tx.send(text(&seen));
                        break;
                    }
                }
            });
            let seen = rx
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| {
                    let _ = c.kill();
                    panic!("{t}: attach saw no ticks")
                });
            assert!(seen.contains("tick-"), "{t}: {seen}");
        }
        let _ = a.kill();
        let _ = b.kill();
        let _ = a.wait();
        let _ = b.wait();

        // stdin reaches the container's process.
        let mut child = crictl(&bed, t, &["attach", "-i", &echo])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("crictl attach -i");
        let mut input = child.stdin.take().expect("stdin");
        let mut out = child.stdout.take().expect("stdout");
        let word = format!("hello-{t}");
        let (tx, rx) = std::sync::mpsc::channel();
        let want = format!("got-{word}");
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            let mut buf = [0u8; 256];
            while let Ok(n) = out.read(&mut buf) {
                if n == 0 {
                    break;
                }
                seen.extend_from_slice(&buf[..n]);
                if text(&seen).contains(&want) {
                    let _ = tx.send(());
                    break;
                }
            }
        });
        // The session may not be attached yet when the first line is written: repeat.
        let start = Instant::now();
        loop {
            writeln!(input, "{word}").expect("write to crictl");
            if rx.recv_timeout(Duration::from_millis(500)).is_ok() {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{t}: attach stdin not echoed"
            );
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    // The CRI log kept every line while sessions came and went.
    let log = std::fs::read_to_string(logs.path().join("ticker.log")).expect("ticker log");
    let ticks: Vec<u32> = log
        .lines()
        .filter_map(|l| l.rsplit("tick-").next()?.trim().parse().ok())
        .collect();
    assert!(ticks.len() >= 2, "{log}");
    assert!(
        ticks.windows(2).all(|w| w[1] == w[0] + 1),
        "no line lost in the log: {ticks:?}"
    );
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// Fetches `/` through a forwarded local port; the body, once the forward answers.
fn http_get(port: u16) -> Option<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET / HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    Some(body)
}

#[tokio::test]
async fn port_forward_reaches_pod_and_host_network_servers() {
    let bed = BedRemora::start_with_network();
    let logs = scratch();
    let pod = start_pod(&bed, "stream-pf", logs.path(), false).await;
    pod.run(cri::shell_container(
        "web",
        "mkdir -p /www && echo pod-page > /www/index.html && httpd -f -p 8080 -h /www",
    ))
    .await;
    // A host-network pod: its server listens on the host's loopback, on a free port.
    let host_port = free_port();
    let host = start_pod(&bed, "stream-pf-host", logs.path(), true).await;
    host.run(cri::shell_container(
        "web",
        &format!("mkdir -p /tmp/www && echo host-page > /tmp/www/index.html && httpd -f -p 127.0.0.1:{host_port} -h /tmp/www"),
    ))
    .await;
    for t in TRANSPORTS {
        for (pod_id, remote, page) in [
            (&pod.id, 8080, "pod-page"),
            (&host.id, host_port, "host-page"),
        ] {
            let local = free_port();
            let mapping = format!("{local}:{remote}");
            let mut child = crictl(&bed, t, &["port-forward", pod_id, &mapping])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("crictl port-forward");
            let start = Instant::now();
            let mut body = None;
            while body.as_deref().is_none_or(|b: &str| !b.contains(page)) {
                assert!(
                    start.elapsed() < Duration::from_secs(30),
                    "{t}: no {page} through port-forward: {body:?}"
                );
                std::thread::sleep(Duration::from_millis(100));
                body = http_get(local);
            }
            // Several connections at once through one forward.
            let many: Vec<_> = (0..5)
                .map(|_| std::thread::spawn(move || http_get(local)))
                .collect();
            for h in many {
                let b = h.join().expect("thread").unwrap_or_default();
                assert!(b.contains(page), "{t}: concurrent connection: {b:?}");
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        // A port nothing listens on: the client hears why.
        let local = free_port();
        let mapping = format!("{local}:9");
        let mut child = crictl(&bed, t, &["port-forward", &pod.id, &mapping])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("crictl port-forward");
        let mut err_pipe = child.stderr.take().expect("stderr");
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let sink = stderr.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 1024];
            while let Ok(n) = err_pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        wait_until("the error to reach crictl", Duration::from_secs(30), || {
            // Each try is a new forwarded connection; the pod side refuses it.
            let _ = http_get(local);
            let seen = stderr.lock().unwrap().clone();
            async move { seen.contains("error forwarding port 9") }
        })
        .await;
        let _ = child.kill();
        let _ = child.wait();
    }
}

#[tokio::test]
async fn concurrent_execs_and_disconnects_leave_nothing_behind() {
    let bed = BedRemora::start_with_network();
    let logs = scratch();
    let pod = start_pod(&bed, "stream-churn", logs.path(), false).await;
    let id = pod.run(container("target", &["sleep", "3600"])).await;
    // Warm up (first-use allocations), then take the baseline.
    let out = run(
        crictl(&bed, "spdy", &["exec", &id, "true"]),
        b"",
        Duration::from_secs(30),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let pid = bed.remora.pid();
    let fds_before = open_fds(pid);

    let handles: Vec<_> = (0..20)
        .map(|i| {
            let t = TRANSPORTS[i % 2];
            let cmd = crictl(
                &bed,
                t,
                &["exec", &id, "sh", "-c", &format!("echo session-{i}")],
            );
            std::thread::spawn(move || (i, run(cmd, b"", Duration::from_secs(60))))
        })
        .collect();
    for h in handles {
        let (i, out) = h.join().expect("thread");
        assert!(out.status.success(), "session {i}: {}", text(&out.stderr));
        assert_eq!(text(&out.stdout), format!("session-{i}\n"));
    }

    // Clients that go away mid-stream: their processes are killed.
    for t in TRANSPORTS {
        let marker = format!("sleep 99{}", if t == "spdy" { 1 } else { 2 });
        let mut child = crictl(
            &bed,
            t,
            &["exec", &id, "sh", "-c", &format!("exec {marker}")],
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("crictl exec");
        wait_until("the exec to run", Duration::from_secs(30), || async {
            processes_matching(&bed, &id, &marker).await >= 1
        })
        .await;
        let _ = child.kill();
        let _ = child.wait();
        wait_until(
            "the abandoned exec to be killed",
            Duration::from_secs(30),
            || async { processes_matching(&bed, &id, &marker).await == 0 },
        )
        .await;
    }
    wait_until("no exec FIFOs left", Duration::from_secs(30), || async {
        exec_fifos(&bed).is_empty()
    })
    .await;
    wait_until(
        "remora's fds back to the baseline",
        Duration::from_secs(30),
        || async { open_fds(pid) <= fds_before },
    )
    .await;
}

#[tokio::test]
async fn with_tls_configured_the_urls_are_https_and_crictl_streams_over_them() {
    let certs = scratch();
    let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()])
        .expect("self-signed certificate");
    let (cert, key) = (certs.path().join("cert.pem"), certs.path().join("key.pem"));
    std::fs::write(&cert, ck.cert.pem()).expect("write cert");
    std::fs::write(&key, ck.signing_key.serialize_pem()).expect("write key");
    let bed = BedRemora::start_with_network_and(&format!(
        "[streaming]\ntls_cert_file = \"{}\"\ntls_key_file = \"{}\"\n",
        cert.display(),
        key.display()
    ));
    let logs = scratch();
    let pod = start_pod(&bed, "stream-tls", logs.path(), false).await;
    let id = pod.run(container("target", &["sleep", "3600"])).await;
    let url = exec_url(&bed, &id).await;
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    // crictl skips verification when given no CA, as for kubelet's own self-signed server.
    for t in TRANSPORTS {
        assert_exec_echoes(&bed, t, &id, "over-tls");
    }
}

/// Raises this process's soft RLIMIT_NOFILE to at least `want` (up to the hard limit):
/// remora, started by the harness, inherits it.
fn raise_nofile(want: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        if lim.rlim_cur < want {
            lim.rlim_cur = want.min(lim.rlim_max);
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
        }
    }
}

/// Whether the server has closed `s` (EOF or reset) without sending anything; false while
/// it is open. Non-blocking.
fn closed_by_server(s: &mut std::net::TcpStream) -> bool {
    let mut b = [0u8; 64];
    match s.read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
        Err(_) => true,
    }
}

/// 2,000 idle connections (four times the cap) and a client that sends half a request line
/// and nothing more: the connections over the cap are closed at once, the others and the slow
/// one after the header-read timeout; remora's fds return to their baseline while the
/// attacker still holds its sockets, and real execs work then and after.
#[tokio::test]
async fn idle_connections_and_a_slow_header_neither_stop_exec_nor_leak_fds() {
    const IDLE: usize = 2000;
    const CAP: usize = 500;
    const HEADER_TIMEOUT: Duration = Duration::from_secs(2);
    raise_nofile(IDLE as u64 + 1024);
    let bed = BedRemora::start_with_network_and(&format!(
        "[streaming]\nheader_read_timeout = \"{}s\"\nmax_connections = {CAP}\n",
        HEADER_TIMEOUT.as_secs()
    ));
    let logs = scratch();
    let pod = start_pod(&bed, "stream-flood", logs.path(), false).await;
    let id = pod.run(container("target", &["sleep", "3600"])).await;
    for t in TRANSPORTS {
        assert_exec_echoes(&bed, t, &id, "warm");
    }
    let pid = bed.remora.pid();
    let fds_before = open_fds(pid);
    // The streaming server's address, from a URL it hands out.
    let url = exec_url(&bed, &id).await;
    let address = url
        .strip_prefix("http://")
        .and_then(|rest| rest.split('/').next())
        .expect("an http URL")
        .to_string();
    assert!(address.starts_with("127.0.0.1:"), "loopback only: {url}");

    let started = Instant::now();
    let mut slow = std::net::TcpStream::connect(&address).expect("connect");
    slow.write_all(b"GET /exec/x HT")
        .expect("half a request line");
    let mut idle: Vec<std::net::TcpStream> = (0..IDLE)
        .map(|i| {
            std::net::TcpStream::connect(&address).unwrap_or_else(|e| panic!("connection {i}: {e}"))
        })
        .collect();
    for s in idle.iter_mut().chain(std::iter::once(&mut slow)) {
        s.set_nonblocking(true).expect("nonblocking");
    }
    // Over the cap: closed at once, long before the header timeout.
    let mut refused = 0;
    wait_until(
        "the connections over the cap to be closed",
        Duration::from_secs(30),
        || {
            refused = idle.iter_mut().map(closed_by_server).filter(|c| *c).count();
            let done = refused >= IDLE - CAP;
            async move { done }
        },
    )
    .await;
    let refused_after = started.elapsed();
    let peak_fds = open_fds(pid);
    // The rest, and the slow client, after the header timeout; remora's fds come back while
    // every client socket is still open.
    wait_until(
        "remora's fds back to the baseline with the attacker's sockets still open",
        Duration::from_secs(60),
        || async { open_fds(pid) <= fds_before },
    )
    .await;
    let recovered_after = started.elapsed();
    assert!(
        recovered_after >= HEADER_TIMEOUT,
        "admitted connections were closed before the header timeout ({recovered_after:?})"
    );
    wait_until(
        "every idle and the slow connection closed by remora",
        Duration::from_secs(30),
        || {
            let all = idle.iter_mut().all(closed_by_server) && closed_by_server(&mut slow);
            async move { all }
        },
    )
    .await;
    // During: the attacker still holds its 2,001 sockets.
    for t in TRANSPORTS {
        assert_exec_echoes(&bed, t, &id, "during");
    }
    drop(idle);
    drop(slow);
    for t in TRANSPORTS {
        assert_exec_echoes(&bed, t, &id, "after");
    }
    wait_until(
        "remora's fds back to the baseline after the execs",
        Duration::from_secs(30),
        || async { open_fds(pid) <= fds_before },
    )
    .await;
    eprintln!(
        "flood: {refused} of {IDLE} closed at once within {refused_after:?}; remora fds {fds_before} before, {peak_fds} at the peak, back to the baseline after {recovered_after:?}"
    );
}
