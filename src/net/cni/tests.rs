//! The ADD/DEL/CHECK chains against fake plugins (shell scripts).

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Map, Value};

use super::config::NetworkConfigList;
use super::*;

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => panic!("not an object"),
    }
}

fn network(version: &str, plugins: Vec<Value>) -> Network {
    let plugins: Vec<Map<String, Value>> = plugins.into_iter().map(obj).collect();
    Network {
        name: "testnet".into(),
        file: "/dev/null".into(),
        plugins: plugins.iter().map(|p| plugin_type(p).to_string()).collect(),
        config: NetworkConfigList {
            cni_version: version.into(),
            disable_check: false,
            plugins,
        },
    }
}

fn attachment(id: &str) -> Attachment {
    Attachment {
        container_id: id.into(),
        netns: Some("/nonexistent/netns".into()),
        ifname: "eth0".into(),
        args: vec![("IgnoreUnknown".into(), "1".into())],
        capability_args: Map::new(),
    }
}

/// A fake plugin: a shell script.
fn fake_plugin(dir: &Path, name: &str, script: &str) {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{script}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn exec_in(bin: &Path, cache: &Path, timeout: Duration) -> CniExec {
    CniExec::new(vec![bin.to_path_buf()], cache.to_path_buf(), timeout)
}

#[tokio::test]
async fn add_chains_prev_result_and_del_runs_in_reverse_with_the_cached_result() {
    let bin = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let log = bin.path().join("log");
    let log_s = log.display();
    let result = |ip: &str| {
        format!(
            r#"{{"cniVersion":"1.0.0","interfaces":[{{"name":"eth0","sandbox":"/x"}}],"ips":[{{"address":"{ip}/24","interface":0}}]}}"#
        )
    };
    fake_plugin(
        bin.path(),
        "first",
        &format!(
            "cat > /dev/null; echo \"first $CNI_COMMAND\" >> {log_s}\n\
             [ \"$CNI_COMMAND\" = ADD ] && echo '{}'\nexit 0",
            result("10.250.0.8")
        ),
    );
    // The second plugin logs its stdin (to show prevResult) and replaces the result.
    fake_plugin(
        bin.path(),
        "second",
        &format!(
            "in=$(cat); echo \"second $CNI_COMMAND $in\" >> {log_s}\n\
             [ \"$CNI_COMMAND\" = ADD ] && echo '{}'\nexit 0",
            result("10.250.0.9")
        ),
    );
    let exec = exec_in(bin.path(), cache.path(), Duration::from_secs(10));
    let net = network(
        "1.0.0",
        vec![json!({"type": "first"}), json!({"type": "second"})],
    );
    let rt = attachment("c1");
    let r = exec.add(&net, &rt).await.unwrap();
    assert_eq!(
        r.pod_ips("eth0"),
        vec!["10.250.0.9".parse::<IpAddr>().unwrap()]
    );
    let cached = exec.cache_path("testnet", &rt).unwrap();
    assert!(cached.is_file());

    exec.del(&net, &rt).await.unwrap();
    assert!(!cached.exists());
    let log = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines[0], "first ADD");
    assert!(lines[1].starts_with("second ADD "), "{log}");
    assert!(lines[1].contains("\"prevResult\":{"), "{log}");
    assert!(lines[1].contains("10.250.0.8"), "{log}");
    assert!(lines[2].starts_with("second DEL "), "{log}");
    assert!(
        lines[2].contains("10.250.0.9"),
        "DEL must carry the cached result: {log}"
    );
    assert_eq!(lines[3], "first DEL");

    // DEL again (nothing cached): still succeeds, now without prevResult.
    exec.del(&net, &rt).await.unwrap();
    let log = std::fs::read_to_string(bin.path().join("log")).unwrap();
    let last_second = log.lines().rfind(|l| l.starts_with("second DEL")).unwrap();
    assert!(!last_second.contains("prevResult"), "{log}");
}

#[tokio::test]
async fn plugin_errors_are_typed() {
    let bin = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    fake_plugin(
        bin.path(),
        "failer",
        "cat > /dev/null; echo '{\"cniVersion\":\"1.0.0\",\"code\":7,\"msg\":\"no addresses\",\"details\":\"pool empty\"}'; exit 1",
    );
    fake_plugin(bin.path(), "crasher", "echo boom >&2; exit 3");
    fake_plugin(bin.path(), "garbage", "cat > /dev/null; echo not-json");
    let exec = exec_in(bin.path(), cache.path(), Duration::from_secs(10));
    let rt = attachment("c2");
    let err = exec
        .add(&network("1.0.0", vec![json!({"type": "failer"})]), &rt)
        .await
        .unwrap_err();
    match &err {
        CniExecError::Plugin {
            plugin,
            command,
            code,
            msg,
            details,
        } => {
            assert_eq!(plugin, "failer");
            assert_eq!(*command, CniCommand::Add);
            assert_eq!(*code, 7);
            assert_eq!(msg, "no addresses");
            assert_eq!(details, "pool empty");
        }
        other => panic!("{other}"),
    }
    let err = exec
        .add(&network("1.0.0", vec![json!({"type": "crasher"})]), &rt)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, CniExecError::Exited { output, .. } if output == "boom"),
        "{err}"
    );
    let err = exec
        .add(&network("1.0.0", vec![json!({"type": "garbage"})]), &rt)
        .await
        .unwrap_err();
    assert!(matches!(err, CniExecError::InvalidResult { .. }), "{err}");
    let err = exec
        .add(&network("1.0.0", vec![json!({"type": "absent"})]), &rt)
        .await
        .unwrap_err();
    assert!(matches!(err, CniExecError::PluginNotFound { .. }), "{err}");
    let err = exec
        .add(&network("0.2.0", vec![json!({"type": "failer"})]), &rt)
        .await
        .unwrap_err();
    assert!(
        matches!(err, CniExecError::UnsupportedVersion { .. }),
        "{err}"
    );
    // Nothing was cached by the failed ADDs.
    assert_eq!(std::fs::read_dir(cache.path()).unwrap().count(), 0);
}

#[tokio::test]
async fn a_hung_plugin_is_killed_with_its_children_on_timeout() {
    let bin = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let pidfile = bin.path().join("child.pid");
    // The plugin starts a child (as bridge starts host-local) and both hang.
    fake_plugin(
        bin.path(),
        "hang",
        &format!("sleep 600 & echo $! > {}; wait", pidfile.display()),
    );
    let exec = exec_in(bin.path(), cache.path(), Duration::from_millis(500));
    let err = exec
        .add(
            &network("1.0.0", vec![json!({"type": "hang"})]),
            &attachment("c3"),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, CniExecError::Timeout { .. }), "{err}");
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The grandchild got SIGKILL with the group; it disappears (or is a zombie until its
    // new parent reaps it).
    let gone = (0..50).any(|_| {
        let alive = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| !s.contains(") Z "))
            .unwrap_or(false);
        if alive {
            std::thread::sleep(Duration::from_millis(100));
        }
        !alive
    });
    assert!(gone, "child {pid} of a timed-out plugin survived");
}

#[tokio::test]
async fn check_needs_0_4_0_and_a_cached_result() {
    let bin = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let exec = exec_in(bin.path(), cache.path(), Duration::from_secs(10));
    let rt = attachment("c4");
    let err = exec
        .check(&network("0.3.1", vec![json!({"type": "x"})]), &rt)
        .await
        .unwrap_err();
    assert!(
        matches!(err, CniExecError::CheckUnsupported { .. }),
        "{err}"
    );
    let err = exec
        .check(&network("1.0.0", vec![json!({"type": "x"})]), &rt)
        .await
        .unwrap_err();
    assert!(matches!(err, CniExecError::NoCachedResult { .. }), "{err}");
}
