//! Running one plugin as the CNI spec asks: its config on stdin, the `CNI_*` environment, a
//! timeout, its own process group (killed as a whole on timeout or drop), and its error
//! reported the spec's way.

use std::path::PathBuf;
use std::process::Stdio;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde::Deserialize;
use serde_json::{Map, Value};
use tokio::io::AsyncWriteExt;

use super::{Attachment, CniCommand, CniExec, CniExecError};

/// The stdin config for one plugin of a list (libcni's `buildOneConfig` + `injectRuntimeConfig`).
pub fn plugin_stdin(
    network: &str,
    cni_version: &str,
    plugin: &Map<String, Value>,
    prev_result: Option<&Value>,
    capability_args: &Map<String, Value>,
) -> Value {
    let mut conf = plugin.clone();
    conf.insert("name".into(), Value::String(network.to_string()));
    conf.insert("cniVersion".into(), Value::String(cni_version.to_string()));
    match prev_result {
        Some(prev) => {
            conf.insert("prevResult".into(), prev.clone());
        }
        None => {
            conf.remove("prevResult");
        }
    }
    let declared = plugin.get("capabilities").and_then(Value::as_object);
    let runtime: Map<String, Value> = declared
        .into_iter()
        .flatten()
        .filter(|(_, on)| on.as_bool() == Some(true))
        .filter_map(|(cap, _)| capability_args.get(cap).map(|v| (cap.clone(), v.clone())))
        .collect();
    // As libcni: runtimeConfig is replaced, not merged, and only set when there is something
    // to pass, so a plugin without capabilities sees its config as written.
    if !runtime.is_empty() {
        conf.insert("runtimeConfig".into(), Value::Object(runtime));
    }
    Value::Object(conf)
}

/// `CNI_ARGS`: `K=V` pairs joined by `;`. Plugins split on `;` and `=`, so neither may appear
/// inside a key or value.
pub fn cni_args(args: &[(String, String)]) -> Result<String, CniExecError> {
    let mut out = Vec::with_capacity(args.len());
    for (k, v) in args {
        for s in [k, v] {
            if s.contains(';') || s.contains('=') {
                return Err(CniExecError::InvalidArg {
                    key: k.clone(),
                    value: v.clone(),
                    reason: "contains ';' or '='",
                });
            }
        }
        out.push(format!("{k}={v}"));
    }
    Ok(out.join(";"))
}

/// The `CNI_*` environment of one plugin run.
pub fn plugin_env(
    command: CniCommand,
    rt: &Attachment,
    bin_dirs: &[PathBuf],
) -> Result<Vec<(&'static str, String)>, CniExecError> {
    let path = bin_dirs
        .iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(":");
    Ok(vec![
        ("CNI_COMMAND", command.as_str().to_string()),
        ("CNI_CONTAINERID", rt.container_id.clone()),
        (
            "CNI_NETNS",
            rt.netns
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
        ),
        ("CNI_IFNAME", rt.ifname.clone()),
        ("CNI_ARGS", cni_args(&rt.args)?),
        ("CNI_PATH", path),
    ])
}

/// A spec error as printed by a failing plugin.
#[derive(Debug, Deserialize)]
struct ErrorBody {
    code: u32,
    #[serde(default)]
    msg: String,
    #[serde(default)]
    details: String,
}

impl CniExec {
    /// Runs one plugin; returns its stdout on success.
    pub(super) async fn run(
        &self,
        command: CniCommand,
        plugin: &str,
        stdin: &Value,
        rt: &Attachment,
    ) -> Result<Vec<u8>, CniExecError> {
        let bin = self
            .bin_dirs
            .iter()
            .map(|d| d.join(plugin))
            .find(|p| !plugin.is_empty() && p.is_file())
            .ok_or_else(|| CniExecError::PluginNotFound {
                plugin: plugin.to_string(),
                dirs: self
                    .bin_dirs
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        let env = plugin_env(command, rt, &self.bin_dirs)?;
        let spawn_err = |source| CniExecError::Spawn {
            plugin: plugin.to_string(),
            command,
            source,
        };
        let input = serde_json::to_vec(stdin).map_err(|e| spawn_err(e.into()))?;

        // The plugin inherits remora's environment (it needs PATH to find iptables and the
        // like); all six CNI_ variables are always set, so none leaks in from outside.
        let mut cmd = tokio::process::Command::new(&bin);
        cmd.envs(env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Own group: a signal to remora's group (Ctrl-C in a terminal) does not hit a plugin
            // mid-change, and the group can be killed as a whole.
            .process_group(0)
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(spawn_err)?;
        let mut group = GroupKiller(child.id());
        let child_stdin = child.stdin.take();
        let feed = async move {
            if let Some(mut s) = child_stdin {
                s.write_all(&input).await?;
                s.shutdown().await?;
            }
            Ok::<(), std::io::Error>(())
        };
        let run = async {
            let (fed, out) = tokio::join!(feed, child.wait_with_output());
            let out = out?;
            // A plugin may exit without reading its stdin (EPIPE); its exit status and output
            // say what happened, so a feeding error only matters if it otherwise succeeded.
            if out.status.success() {
                fed?;
            }
            Ok::<_, std::io::Error>(out)
        };
        let out = match tokio::time::timeout(self.timeout, run).await {
            Ok(out) => out.map_err(spawn_err)?,
            Err(_) => {
                return Err(CniExecError::Timeout {
                    plugin: plugin.to_string(),
                    command,
                    after: self.timeout,
                })
            }
        };
        group.0 = None;
        if out.status.success() {
            return Ok(out.stdout);
        }
        if let Ok(e) = serde_json::from_slice::<ErrorBody>(&out.stdout) {
            return Err(CniExecError::Plugin {
                plugin: plugin.to_string(),
                command,
                code: e.code,
                msg: e.msg,
                details: e.details,
            });
        }
        let text = |b: &[u8]| String::from_utf8_lossy(b).trim().to_string();
        let output = [text(&out.stdout), text(&out.stderr)]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join("; ");
        Err(CniExecError::Exited {
            plugin: plugin.to_string(),
            command,
            status: out.status.to_string(),
            output,
        })
    }
}

/// Kills a plugin's process group unless disarmed (pid set to `None`) after the plugin
/// finished; so it fires when a run times out or its future is dropped. The group cannot have
/// been reused then: either the leader is not yet reaped, or members still hold our pipes open.
struct GroupKiller(Option<u32>);

impl Drop for GroupKiller {
    fn drop(&mut self) {
        if let Some(pid) = self.0.and_then(|p| i32::try_from(p).ok()) {
            // ESRCH (group already gone) is the good case; nothing else can be done here.
            let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => panic!("not an object"),
        }
    }

    #[test]
    fn stdin_injects_name_version_prev_result_and_declared_capabilities() {
        let plugin = obj(json!({
            "type": "portmap",
            "capabilities": {"portMappings": true, "bandwidth": false},
            "snat": true,
            "runtimeConfig": {"stale": 1},
        }));
        let caps = obj(json!({
            "portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}],
            "bandwidth": {"ingressRate": 1},
            "dns": {"servers": ["10.0.0.10"]},
        }));
        let prev = json!({"cniVersion": "1.0.0", "ips": [{"address": "10.1.0.2/24"}]});
        let conf = plugin_stdin("net", "1.0.0", &plugin, Some(&prev), &caps);
        assert_eq!(conf["name"], "net");
        assert_eq!(conf["cniVersion"], "1.0.0");
        assert_eq!(conf["type"], "portmap");
        assert_eq!(conf["snat"], true);
        assert_eq!(conf["prevResult"], prev);
        // Only the declared-and-enabled capability, replacing any runtimeConfig in the file.
        assert_eq!(
            conf["runtimeConfig"],
            json!({"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]})
        );
    }

    #[test]
    fn first_plugin_gets_no_prev_result_and_no_runtime_config_without_capabilities() {
        let plugin =
            obj(json!({"type": "bridge", "prevResult": {"bogus": 1}, "cniVersion": "0.1.0"}));
        let caps = obj(json!({"portMappings": []}));
        let conf = plugin_stdin("n", "0.4.0", &plugin, None, &caps);
        assert!(conf.get("prevResult").is_none());
        assert!(conf.get("runtimeConfig").is_none());
        assert_eq!(conf["cniVersion"], "0.4.0");
    }

    #[test]
    fn env_and_cni_args() {
        let rt = Attachment {
            container_id: "abc".into(),
            netns: Some("/run/remora/netns/abc".into()),
            ifname: "eth0".into(),
            args: vec![
                ("K8S_POD_NAMESPACE".into(), "default".into()),
                ("K8S_POD_NAME".into(), "web".into()),
                ("IgnoreUnknown".into(), "1".into()),
            ],
            capability_args: Map::new(),
        };
        let env = plugin_env(
            CniCommand::Add,
            &rt,
            &["/opt/cni/bin".into(), "/usr/lib/cni".into()],
        )
        .unwrap();
        let get = |k: &str| env.iter().find(|(n, _)| *n == k).unwrap().1.clone();
        assert_eq!(get("CNI_COMMAND"), "ADD");
        assert_eq!(get("CNI_CONTAINERID"), "abc");
        assert_eq!(get("CNI_NETNS"), "/run/remora/netns/abc");
        assert_eq!(get("CNI_IFNAME"), "eth0");
        assert_eq!(
            get("CNI_ARGS"),
            "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;IgnoreUnknown=1"
        );
        assert_eq!(get("CNI_PATH"), "/opt/cni/bin:/usr/lib/cni");

        let gone = Attachment { netns: None, ..rt };
        let env = plugin_env(CniCommand::Del, &gone, &[]).unwrap();
        assert!(env.contains(&("CNI_NETNS", String::new())));

        let bad = cni_args(&[("K".into(), "a;b".into())]).unwrap_err();
        assert!(matches!(bad, CniExecError::InvalidArg { .. }), "{bad}");
    }
}
