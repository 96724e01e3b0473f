//! NRI through the daemon: remora on the test bed hosts the Rust test plugin
//! ([`crate::nri_plugin::TestPlugin`]) on its NRI socket, as an external plugin connects, and
//! the CRI calls fire its events; what a plugin's adjustment does inside a container, and what
//! a plugin that refuses, hangs or is killed does to the call and to what is left.

use std::path::PathBuf;
use std::time::Duration;

use remora::cri::v1;
use remora_nri::api;

use crate::cri;
use crate::harness::{scratch, unique, BedRemora};
use crate::nri_plugin::{bind_mount, env, Answer, Behaviour, EventKind, TestPlugin};

const LIMIT: Duration = Duration::from_secs(60);

fn socket(bed: &BedRemora) -> PathBuf {
    bed.state_dir().join("nri.sock")
}

/// The container records in remora's containerd namespace.
fn records(bed: &BedRemora) -> Vec<String> {
    bed.ctr(&["containers", "ls", "-q"])
        .lines()
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn a_plugin_sees_every_event_in_order_and_its_adjustment_lands_in_the_container() {
    let bed = BedRemora::start_with_network();
    cri::pull(&bed.remora, "busybox").await.expect("pull");
    let shared = scratch();
    std::fs::write(shared.path().join("f"), "from-the-host").expect("a file to mount");
    let mut adjust = api::ContainerAdjustment::new();
    adjust.env.push(env("NRI_IT", "adjusted"));
    adjust.mounts.push(bind_mount(
        &shared.path().display().to_string(),
        "/nri",
        &["rbind", "ro"],
    ));
    let plugin = TestPlugin::connect(&socket(&bed), "10", "it", Behaviour::new().adjust(adjust))
        .await
        .expect("the plugin registers");

    let logs = scratch();
    let name = unique("nri-events");
    let pod_config = cri::pod_config(&name, logs.path(), false);
    let pod = cri::run_pod(&bed.remora, &pod_config).await.expect("pod");
    let id = cri::create_and_start(
        &bed.remora,
        &pod,
        &pod_config,
        cri::shell_container("c", "echo \"env=$NRI_IT file=$(cat /nri/f)\"; exit 3"),
    )
    .await;
    let exited = cri::wait_exited(&bed.remora, &id, LIMIT).await;
    assert_eq!(exited.exit_code, 3);
    let log = std::fs::read_to_string(logs.path().join("c.log")).expect("the log");
    assert!(
        log.contains("env=adjusted file=from-the-host"),
        "the plugin's env and mount inside the container: {log}"
    );
    bed.remora
        .runtime()
        .remove_container(v1::RemoveContainerRequest {
            container_id: id.clone(),
        })
        .await
        .expect("RemoveContainer");
    cri::remove_pod(&bed.remora, &pod).await;

    let ours = |e: &crate::nri_plugin::Event| e.pod_id == pod;
    let events = plugin
        .wait_for("the pod's last event", LIMIT, |events| {
            events
                .iter()
                .any(|e| ours(e) && e.kind == EventKind::RemovePodSandbox)
        })
        .await;
    let kinds: Vec<EventKind> = events.iter().filter(|e| ours(e)).map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [
            EventKind::RunPodSandbox,
            EventKind::CreateContainer,
            EventKind::PostCreateContainer,
            EventKind::StartContainer,
            EventKind::PostStartContainer,
            EventKind::StopContainer,
            EventKind::RemoveContainer,
            EventKind::StopPodSandbox,
            EventKind::RemovePodSandbox,
        ],
        "each event once, in order"
    );
    let run = &events[0];
    assert_eq!(
        (
            run.pod_name.as_str(),
            run.pod_namespace.as_str(),
            run.pod_uid.as_str()
        ),
        (name.as_str(), "remora-it", format!("uid-{name}").as_str())
    );
    let create = events
        .iter()
        .find(|e| e.kind == EventKind::CreateContainer)
        .expect("CreateContainer");
    assert_eq!(create.container_id.as_deref(), Some(id.as_str()));
    assert_eq!(create.container_name.as_deref(), Some("c"));
}

#[tokio::test]
async fn a_refusing_plugin_fails_create_container_leaves_nothing_and_a_retry_works() {
    let bed = BedRemora::start_with_network();
    cri::pull(&bed.remora, "busybox").await.expect("pull");
    let plugin = TestPlugin::connect(
        &socket(&bed),
        "20",
        "refuser",
        Behaviour::new().answer(
            EventKind::CreateContainer,
            Answer::FailOnce("no such luck".into()),
        ),
    )
    .await
    .expect("the plugin registers");
    let logs = scratch();
    let pod_config = cri::pod_config(&unique("nri-refused"), logs.path(), false);
    let pod = cri::run_pod(&bed.remora, &pod_config).await.expect("pod");
    let before = records(&bed);
    let err = cri::create(
        &bed.remora,
        &pod,
        &pod_config,
        cri::container_config("c", &["sleep", "3600"]),
    )
    .await
    .expect_err("the plugin refuses");
    assert_eq!(err.code(), tonic::Code::Unknown, "{err:?}");
    assert!(
        err.message().contains("20-refuser") && err.message().contains("no such luck"),
        "{err:?}"
    );
    let listed = bed
        .remora
        .runtime()
        .list_containers(v1::ListContainersRequest::default())
        .await
        .expect("ListContainers")
        .into_inner()
        .containers;
    assert!(listed.is_empty(), "{listed:?}");
    assert_eq!(records(&bed), before, "no container record left");
    assert!(
        !bed.ctr(&["snapshots", "ls"]).contains("remora-create-"),
        "no snapshot of the refused container left"
    );
    let id = cri::create(
        &bed.remora,
        &pod,
        &pod_config,
        cri::container_config("c", &["sleep", "3600"]),
    )
    .await
    .expect("the retry (same name) is created");
    plugin
        .wait_for("two CreateContainer events", LIMIT, |events| {
            events
                .iter()
                .filter(|e| e.kind == EventKind::CreateContainer)
                .count()
                == 2
        })
        .await;
    assert!(!id.is_empty());
    cri::remove_pod(&bed.remora, &pod).await;
}

#[tokio::test]
async fn a_hanging_plugin_fails_run_pod_sandbox_after_the_timeout_and_remora_keeps_serving() {
    let bed = BedRemora::start_with_network_edited(|config| {
        let edited = config.replacen("request_timeout = \"5s\"", "request_timeout = \"1s\"", 1);
        assert_ne!(edited, config, "the template sets [nri] request_timeout");
        edited
    });
    let plugin = TestPlugin::connect(
        &socket(&bed),
        "30",
        "hang",
        Behaviour::new().answer(EventKind::RunPodSandbox, Answer::Hang),
    )
    .await
    .expect("the plugin registers");
    let logs = scratch();
    let config = cri::pod_config(&unique("nri-hang"), logs.path(), false);
    let started = std::time::Instant::now();
    let err = cri::run_pod(&bed.remora, &config)
        .await
        .expect_err("the plugin never answers");
    let took = started.elapsed();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert!(err.message().contains("30-hang"), "{err:?}");
    assert!(
        took >= Duration::from_secs(1),
        "failed before the timeout: {took:?}"
    );
    plugin.wait_closed(LIMIT).await;
    assert!(cri::list_pods(&bed.remora).await.is_empty());
    assert!(records(&bed).is_empty(), "{:?}", records(&bed));
    // Without the plugin, pods run again; the failed one's name is free.
    let pod = cri::run_pod(&bed.remora, &config)
        .await
        .expect("RunPodSandbox without the plugin");
    cri::remove_pod(&bed.remora, &pod).await;
}

#[tokio::test]
async fn a_plugin_killed_mid_call_fails_that_call_at_once_and_nothing_is_left() {
    let bed = BedRemora::start_with_network();
    cri::pull(&bed.remora, "busybox").await.expect("pull");
    let plugin = TestPlugin::connect(
        &socket(&bed),
        "40",
        "killed",
        Behaviour::new().answer(EventKind::CreateContainer, Answer::Hang),
    )
    .await
    .expect("the plugin registers");
    let logs = scratch();
    let pod_config = cri::pod_config(&unique("nri-killed"), logs.path(), false);
    let pod = cri::run_pod(&bed.remora, &pod_config).await.expect("pod");
    let before = records(&bed);
    // The create and, beside it, the plugin killed once the create reached it.
    let killed = std::sync::OnceLock::new();
    let (created, ()) = tokio::join!(
        cri::create(
            &bed.remora,
            &pod,
            &pod_config,
            cri::container_config("c", &["sleep", "3600"]),
        ),
        async {
            plugin
                .wait_for("CreateContainer to reach the plugin", LIMIT, |events| {
                    events.iter().any(|e| e.kind == EventKind::CreateContainer)
                })
                .await;
            let _ = killed.set(std::time::Instant::now());
            plugin.kill();
        }
    );
    let err = created.expect_err("the plugin died mid-call");
    let killed = killed.get().expect("the plugin was killed");
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert!(
        killed.elapsed() < Duration::from_secs(5),
        "failed with the connection, not at the request timeout: {:?}",
        killed.elapsed()
    );
    assert_eq!(records(&bed), before, "no container record left");
    let id = cri::create(
        &bed.remora,
        &pod,
        &pod_config,
        cri::container_config("c", &["sleep", "3600"]),
    )
    .await
    .expect("created without the plugin");
    assert!(!id.is_empty());
    cri::remove_pod(&bed.remora, &pod).await;
}

#[tokio::test]
async fn a_late_plugin_learns_of_a_container_created_during_its_synchronize_exactly_once() {
    let bed = BedRemora::start_with_network();
    cri::pull(&bed.remora, "busybox").await.expect("pull");
    let logs = scratch();
    let pod_config = cri::pod_config(&unique("nri-late"), logs.path(), false);
    let pod = cri::run_pod(&bed.remora, &pod_config).await.expect("pod");
    let first = cri::create(
        &bed.remora,
        &pod,
        &pod_config,
        cri::container_config("before", &["sleep", "3600"]),
    )
    .await
    .expect("a container before the plugin");
    let plugin = TestPlugin::connect(
        &socket(&bed),
        "50",
        "late",
        Behaviour::new().block_synchronize(),
    )
    .await
    .expect("the plugin's Synchronize arrives");
    assert!(plugin.synced_pods().contains(&pod));
    assert!(plugin.synced_containers().contains(&first));
    // Created while the plugin's Synchronize is unanswered: the create waits for it.
    let (during, ()) = tokio::join!(
        cri::create(
            &bed.remora,
            &pod,
            &pod_config,
            cri::container_config("during", &["sleep", "3600"]),
        ),
        async { plugin.release() }
    );
    let during = during.expect("created once the plugin is synchronized");
    let events = plugin
        .wait_for(
            "CreateContainer of the container made during Synchronize",
            LIMIT,
            |events| {
                events.iter().any(|e| {
                    e.kind == EventKind::CreateContainer
                        && e.container_id.as_deref() == Some(&during)
                })
            },
        )
        .await;
    let told = events
        .iter()
        .filter(|e| {
            e.container_id.as_deref() == Some(&during) && e.kind == EventKind::CreateContainer
        })
        .count()
        + usize::from(plugin.synced_containers().contains(&during));
    assert_eq!(told, 1, "told of it exactly once: {events:?}");
    cri::remove_pod(&bed.remora, &pod).await;
}

/// remora starts a Go plugin on NRI's own library (`pkg/stub`; `nri-stub-logger`, built by
/// scripts/setup.sh) from its `[nri] plugin_path`, sends it its config file, and it records the
/// pod's events; stopping remora ends it.
#[tokio::test]
async fn remora_launches_a_go_plugin_from_its_plugin_path_and_stops_it_with_itself() {
    let binary = crate::harness::tool("nri-stub-logger");
    let dirs = scratch();
    let (plugins, conf) = (dirs.path().join("plugins"), dirs.path().join("conf.d"));
    std::fs::create_dir(&plugins).expect("plugin dir");
    std::fs::create_dir(&conf).expect("config dir");
    let launched = plugins.join("10-logger");
    std::os::unix::fs::symlink(&binary, &launched).expect("the plugin");
    let log = dirs.path().join("logger.log");
    std::fs::write(
        conf.join("10-logger.conf"),
        format!(r#"{{"logFile": "{}"}}"#, log.display()),
    )
    .expect("its config");
    let (p, c) = (plugins.display().to_string(), conf.display().to_string());
    let mut bed = BedRemora::start_with_network_edited(move |config| {
        let edited = config.replacen(
            "plugin_path = \"\"\nplugin_config_path = \"\"",
            &format!("plugin_path = \"{p}\"\nplugin_config_path = \"{c}\""),
            1,
        );
        assert_ne!(edited, config, "the template's [nri] plugin dirs");
        edited
    });
    let logs = scratch();
    let config = cri::pod_config(&unique("nri-launched"), logs.path(), false);
    // The plugin registers in the background of remora's start: a pod made before it is
    // active is not its business, so pods are made until one reaches it.
    let found = std::sync::Mutex::new(None::<String>);
    crate::harness::wait_until("a pod the launched plugin records", LIMIT, || async {
        let pod = cri::run_pod(&bed.remora, &config).await.expect("pod");
        if std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains(&pod)
        {
            *found.lock().expect("lock") = Some(pod);
            return true;
        }
        cri::remove_pod(&bed.remora, &pod).await;
        false
    })
    .await;
    let pod = found.into_inner().expect("lock").expect("the pod");
    cri::remove_pod(&bed.remora, &pod).await;
    let pid = || {
        std::process::Command::new("pgrep")
            .args(["-f", &launched.display().to_string()])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    assert!(!pid().is_empty(), "the launched plugin runs");
    bed.remora.stop_with(nix::sys::signal::Signal::SIGTERM);
    crate::harness::wait_until("the launched plugin to end with remora", LIMIT, || async {
        pid().is_empty()
    })
    .await;
    let seen = std::fs::read_to_string(&log).expect("the plugin's log");
    for event in ["RunPodSandbox", "StopPodSandbox", "RemovePodSandbox"] {
        assert!(
            seen.lines().any(|l| l.contains(event) && l.contains(&pod)),
            "{event} of {pod} in the plugin's log:\n{seen}"
        );
    }
}
