//! crictl, the operator's CRI client, against remora.

use std::process::Command;

use crate::harness::{tool, Bed};

fn crictl(bed: &Bed, args: &[&str]) -> std::process::Output {
    let endpoint = format!("unix://{}", bed.remora.socket.display());
    Command::new(tool("crictl"))
        .args([
            "--runtime-endpoint",
            &endpoint,
            "--image-endpoint",
            &endpoint,
            "--timeout",
            "10s",
        ])
        .args(args)
        .output()
        .expect("run crictl")
}

#[test]
fn crictl_version_reports_remora() {
    let bed = Bed::start("");
    let out = crictl(&bed, &["version"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("RuntimeName:  remora"), "{stdout}");
    assert!(stdout.contains("RuntimeApiVersion:  v1"), "{stdout}");
}

#[test]
fn crictl_info_shows_conditions_and_config() {
    let bed = Bed::start("");
    let out = crictl(&bed, &["info"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let info: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("crictl info prints JSON");
    let conditions = info["status"]["conditions"].as_array().expect("conditions");
    let runtime = conditions
        .iter()
        .find(|c| c["type"] == "RuntimeReady")
        .expect("RuntimeReady");
    assert_eq!(runtime["status"], true);
    let network = conditions
        .iter()
        .find(|c| c["type"] == "NetworkReady")
        .expect("NetworkReady");
    assert_eq!(network["status"], false, "no CNI config in this bed");
    assert_eq!(info["config"]["containerd"]["namespace"], "remora");
}
