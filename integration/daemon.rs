//! The daemon as an operator meets it: config errors, one instance per socket, stale sockets,
//! socket permissions, clean shutdown.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use nix::sys::signal::Signal;
use remora::cri::v1;

use crate::harness::{remora_bin, remora_config, scratch, Bed, Containerd, Remora};

#[test]
fn config_default_prints_a_config_that_check_accepts() {
    let out = Command::new(remora_bin())
        .args(["config", "default"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for key in [
        "[server]",
        "socket",
        "[containerd]",
        "namespace",
        "cgroup_driver",
        "conf_dir",
        "bin_dirs",
    ] {
        assert!(text.contains(key), "default config lacks {key}");
    }
    let dir = scratch();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, &text).unwrap();
    let out = Command::new(remora_bin())
        .args(["config", "check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn bad_config_is_refused_naming_the_key() {
    let dir = scratch();
    let cases = [
        (
            "[containerd]\nnamespace = \"remora\"\nsokcet = \"/x\"\n",
            "sokcet",
        ),
        ("[runtime]\ncgroup_driver = \"cgroupz\"\n", "cgroup_driver"),
        ("[containerd]\nnamespace = \"\"\n", "containerd.namespace"),
        ("[server]\nsocket = \"rel/remora.sock\"\n", "server.socket"),
        ("[containerd\n", "invalid config"),
    ];
    for (text, needle) in cases {
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, text).unwrap();
        // Starting the daemon with it fails before touching any socket.
        let out = Command::new(remora_bin())
            .arg("--config")
            .arg(&path)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{text:?} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(needle),
            "{text:?}: stderr {err:?} does not name {needle:?}"
        );
    }
    let out = Command::new(remora_bin())
        .arg("--config")
        .arg(dir.path().join("missing.toml"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.toml"));
}

#[tokio::test]
async fn socket_is_0660_and_removed_on_sigterm() {
    let mut bed = Bed::start("");
    let socket = bed.remora.socket.clone();
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o660);
    let status = bed.remora.stop_with(Signal::SIGTERM);
    assert!(status.success(), "clean exit on SIGTERM, got {status}");
    assert!(!socket.exists(), "socket removed on shutdown");
    assert!(bed.remora.log_text().contains("shutting down"));
}

#[tokio::test]
async fn sigint_also_shuts_down_cleanly() {
    let mut bed = Bed::start("");
    let socket = bed.remora.socket.clone();
    let status = bed.remora.stop_with(Signal::SIGINT);
    assert!(status.success(), "clean exit on SIGINT, got {status}");
    assert!(!socket.exists());
}

#[tokio::test]
async fn a_second_remora_on_the_same_socket_refuses_to_start() {
    let bed = Bed::start("");
    let out = Command::new(remora_bin())
        .arg("--config")
        .arg(bed.dir.path().join("remora.toml"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("already serving"), "{err}");
    assert!(
        err.contains(&bed.remora.pid().to_string()),
        "names the holder's pid: {err}"
    );
    // The first one is untouched and still serves.
    let v = bed
        .remora
        .runtime()
        .version(v1::VersionRequest::default())
        .await
        .unwrap();
    assert_eq!(v.into_inner().runtime_name, "remora");
}

#[tokio::test]
async fn stale_socket_of_a_killed_remora_is_replaced() {
    let dir = scratch();
    let containerd = Containerd::start(dir.path());
    let socket = dir.path().join("remora.sock");
    let config = remora_config(&socket, &containerd.socket(), &dir.path().join("net.d"), "");
    let mut first = Remora::start(dir.path(), &config, &socket);
    first.stop_with(Signal::SIGKILL);
    assert!(socket.exists(), "SIGKILL leaves the socket file behind");
    assert!(std::os::unix::net::UnixStream::connect(&socket).is_err());

    let second = Remora::start(dir.path(), &config, &socket);
    let v = second
        .runtime()
        .version(v1::VersionRequest::default())
        .await
        .unwrap();
    assert_eq!(v.into_inner().runtime_name, "remora");
    drop(second);
    drop(containerd);
}

/// Under systemd (`Type=notify`, the packaged unit) remora reports READY=1 once it serves and
/// STOPPING=1 when it begins shutting down, on the datagram socket `$NOTIFY_SOCKET` names.
#[tokio::test]
async fn notifies_systemd_ready_when_serving_and_stopping_on_sigterm() {
    let mut bed = Bed::start("");
    let notify_path = bed.dir.path().join("notify.sock");
    let notify = std::os::unix::net::UnixDatagram::bind(&notify_path).unwrap();
    // The deadline of each wait below: a notification that never comes fails the test.
    notify
        .set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    bed.restart_remora_env(&[("NOTIFY_SOCKET", notify_path.to_str().unwrap())]);
    let mut buf = [0u8; 256];
    let n = notify.recv(&mut buf).expect("READY=1 within 30 s");
    assert_eq!(std::str::from_utf8(&buf[..n]).unwrap(), "READY=1");
    // Ready means answering.
    let v = bed
        .remora
        .runtime()
        .version(v1::VersionRequest::default())
        .await
        .unwrap();
    assert_eq!(v.into_inner().runtime_name, "remora");
    let status = bed.remora.stop_with(Signal::SIGTERM);
    assert!(status.success(), "clean exit on SIGTERM, got {status}");
    let n = notify.recv(&mut buf).expect("STOPPING=1 before exit");
    assert_eq!(std::str::from_utf8(&buf[..n]).unwrap(), "STOPPING=1");
}
