//! What a local user or a pod author can reach through remora's files and specs (issue 26):
//! state directory modes, image volume mount flags, remora's shim's socket and spool, which
//! annotations reach the OCI spec, mount propagation sources and the CRI log path.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use remora::cri::v1;
use tonic::Code;

use crate::cri::{self, container_config as container};
use crate::harness::{scratch, BedRemora};

/// Detaches a mount the test made, also when it fails.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("stat {}: {e}", p.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// The per-mount options /proc/self/mountinfo gives the mount on exactly `point`.
fn mount_options(point: &Path) -> Option<Vec<String>> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").expect("read mountinfo");
    let point = point.to_string_lossy();
    table
        .lines()
        .rfind(|l| l.split(' ').nth(4) == Some(point.as_ref()))
        .and_then(|l| l.split(' ').nth(5))
        .map(|o| o.split(',').map(str::to_string).collect())
}

/// The OCI spec containerd holds for container `id` (`ctr containers info`).
fn spec_of(bed: &BedRemora, id: &str) -> serde_json::Value {
    let info: serde_json::Value =
        serde_json::from_str(&bed.ctr(&["containers", "info", id])).expect("ctr info is JSON");
    info["Spec"].clone()
}

fn annotation_keys(spec: &serde_json::Value) -> Vec<String> {
    let mut keys: Vec<String> = spec["annotations"]
        .as_object()
        .map(|a| a.keys().cloned().collect())
        .unwrap_or_default();
    keys.sort();
    keys
}

async fn run_pod_with(
    bed: &BedRemora,
    config: &v1::PodSandboxConfig,
    handler: &str,
) -> Result<String, tonic::Status> {
    bed.remora
        .runtime()
        .run_pod_sandbox(v1::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: handler.into(),
        })
        .await
        .map(|r| r.into_inner().pod_sandbox_id)
}

/// `state_dir` and `root_dir` are 0700 once remora serves, and again after a restart that
/// finds them 0755 (as remora before this fix left them); an image volume is mounted on the
/// host nosuid,nodev.
#[tokio::test]
async fn state_dirs_are_private_and_image_volumes_nosuid_nodev() {
    let mut bed = BedRemora::start_with_network();
    let logs = scratch();
    cri::pull(&bed.remora, "busybox").await.expect("pull");
    let config = cri::pod_config("modes", logs.path(), false);
    let pod = cri::run_pod(&bed.remora, &config)
        .await
        .expect("RunPodSandbox");
    let (state, root) = (bed.state_dir(), bed.root_dir());
    assert_eq!(mode(&state), 0o700, "{}", state.display());
    assert_eq!(mode(&root), 0o700, "{}", root.display());
    assert!(state.join("sandboxes").join(&pod).join("shm").is_dir());

    let mut c = container("vol", &["sleep", "3600"]);
    c.mounts = vec![v1::Mount {
        container_path: "/image".into(),
        readonly: true,
        image: Some(cri::image_spec("busybox")),
        ..Default::default()
    }];
    let id = cri::create(&bed.remora, &pod, &config, c)
        .await
        .expect("create with an image volume");
    let point = state.join("image-volumes").join(&id).join("0");
    let opts = mount_options(&point).unwrap_or_else(|| panic!("{} is mounted", point.display()));
    // (The view is an overlay of lower layers only: read-only by itself; the container's bind
    // of it is ro.)
    for flag in ["nosuid", "nodev"] {
        assert!(
            opts.iter().any(|o| o == flag),
            "image volume mount {}: {opts:?} lacks {flag}",
            point.display()
        );
    }

    bed.crash();
    for d in [&state, &root] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    bed.restart();
    assert_eq!(mode(&state), 0o700, "fixed at start: {}", state.display());
    assert_eq!(mode(&root), 0o700, "fixed at start: {}", root.display());
    assert!(
        bed.remora.log_text().contains("set its mode to 0700"),
        "the fix is logged"
    );
    cri::remove_pod(&bed.remora, &pod).await;
}

/// Pod and container annotations reach the OCI spec only through the handler's
/// `pod_annotations` / `container_annotations`; remora's own `io.kubernetes.cri.*` keys are
/// always there.
#[tokio::test]
async fn annotations_reach_the_spec_only_through_the_handlers_allowlist() {
    let hostile: std::collections::HashMap<String, String> = [
        ("org.systemd.property.TasksMax", "1"),
        ("run.oci.foo", "1"),
        ("example.com/note", "kept when allowed"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let logs = scratch();

    // Default: nothing of the pod author's.
    let bed = BedRemora::start_with_network();
    cri::pull(&bed.remora, "busybox").await.expect("pull");
    let mut config = cri::pod_config("ann", logs.path(), false);
    config.annotations = hostile.clone();
    let pod = cri::run_pod(&bed.remora, &config)
        .await
        .expect("RunPodSandbox");
    let mut c = container("ann", &["sleep", "3600"]);
    c.annotations = hostile.clone();
    let id = cri::create(&bed.remora, &pod, &config, c)
        .await
        .expect("CreateContainer");
    for (what, spec) in [
        ("pod", spec_of(&bed, &pod)),
        ("container", spec_of(&bed, &id)),
    ] {
        let keys = annotation_keys(&spec);
        assert!(
            keys.iter().all(|k| k.starts_with("io.kubernetes.cri.")),
            "{what} spec annotations: {keys:?}"
        );
        assert!(keys.contains(&"io.kubernetes.cri.sandbox-id".to_string()));
    }
    // The CRI still reports the annotations as given (kubelet reads them back).
    let status = cri::status(&bed.remora, &id).await.expect("status");
    assert_eq!(status.annotations, hostile);
    cri::remove_pod(&bed.remora, &pod).await;
    drop(bed);

    // Allowed per handler (every built-in handler, so whichever REMORA_IT_HANDLER picks).
    let bed = BedRemora::start_with_network_edited(|config| {
        let mut edited = config.clone();
        for h in ["runc", "remora", "crun"] {
            let header = format!("[runtime.handlers.{h}]\n");
            edited = edited.replacen(
                &header,
                &format!(
                    "{header}pod_annotations = [\"example.com/*\"]\ncontainer_annotations = [\"run.oci.foo\"]\n"
                ),
                1,
            );
        }
        assert_ne!(edited, config, "the template lists the handlers");
        edited
    });
    cri::pull(&bed.remora, "busybox").await.expect("pull");
    let pod = cri::run_pod(&bed.remora, &config)
        .await
        .expect("RunPodSandbox");
    let mut c = container("ann", &["sleep", "3600"]);
    c.annotations = hostile.clone();
    let id = cri::create(&bed.remora, &pod, &config, c)
        .await
        .expect("CreateContainer");
    let pod_spec = spec_of(&bed, &pod);
    assert_eq!(
        pod_spec["annotations"]["example.com/note"],
        "kept when allowed"
    );
    let keys = annotation_keys(&pod_spec);
    assert!(
        !keys
            .iter()
            .any(|k| k.starts_with("org.systemd") || k.starts_with("run.oci")),
        "{keys:?}"
    );
    let c_spec = spec_of(&bed, &id);
    let keys = annotation_keys(&c_spec);
    assert!(keys.contains(&"run.oci.foo".to_string()), "{keys:?}");
    // Pod annotations the handler passes reach its containers' specs too (containerd's rule).
    assert!(keys.contains(&"example.com/note".to_string()), "{keys:?}");
    assert!(
        !keys.iter().any(|k| k.starts_with("org.systemd")),
        "{keys:?}"
    );
    cri::remove_pod(&bed.remora, &pod).await;
}

/// The command line of process `pid`, split at NULs.
fn cmdline(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|c| *c == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn parent_of(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    // After the comm field's closing parenthesis: state, then ppid.
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    rest.split(' ')
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("ppid")
}

/// remora's shim (handler `remora`): its socket is 0600, its spool 0600 and its console
/// socket directory 0700, whatever the umask.
#[tokio::test]
async fn remoras_shim_socket_spool_and_console_dir_are_private() {
    // This build's shim, not the one the test bed installed.
    let bed = BedRemora::start_with_network_edited(|config| {
        let header = "[runtime.handlers.remora]\n";
        let edited = config.replacen(
            header,
            &format!(
                "{header}runtime_path = \"{}\"\n",
                crate::harness::this_trees_shim().display()
            ),
            1,
        );
        assert_ne!(edited, config, "the template has the remora handler");
        edited
    });
    let logs = scratch();
    let config = cri::pod_config("shim-modes", logs.path(), false);
    let pod = run_pod_with(&bed, &config, "remora")
        .await
        .expect("RunPodSandbox with handler remora");
    let status = cri::pod_status(&bed.remora, &pod).await.expect("status");
    assert_eq!(status.runtime_handler, "remora");
    let tasks = bed.ctr(&["tasks", "ls"]);
    let pause: u32 = tasks
        .lines()
        .find(|l| l.starts_with(&pod))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("the pause task in {tasks}"));
    let shim = parent_of(pause);
    let args = cmdline(shim);
    assert!(
        args[0].ends_with("containerd-shim-remora-v2"),
        "pause's parent is remora's shim: {args:?}"
    );
    let socket = args
        .iter()
        .position(|a| a == "-socket")
        .and_then(|i| args.get(i + 1))
        .map(|s| PathBuf::from(s.trim_start_matches("unix://")))
        .unwrap_or_else(|| panic!("-socket in {args:?}"));
    assert_eq!(mode(&socket), 0o600, "{}", socket.display());
    let spool = socket.with_extension("spool");
    assert_eq!(mode(&spool), 0o600, "{}", spool.display());
    assert_eq!(mode(Path::new("/run/remora-shim")), 0o700);
    cri::remove_pod(&bed.remora, &pod).await;
}

/// A Bidirectional mount needs its source on a shared mount, a HostToContainer one on a
/// shared or slave mount: otherwise CreateContainer is INVALID_ARGUMENT naming the mount,
/// and nothing is left of the container.
#[tokio::test]
async fn propagation_needs_a_shared_or_slave_source() {
    use nix::mount::{mount, MsFlags};
    let bed = BedRemora::start_with_network();
    let logs = scratch();
    cri::pull(&bed.remora, "busybox").await.expect("pull");
    let config = cri::pod_config("propagation", logs.path(), false);
    let pod = cri::run_pod(&bed.remora, &config)
        .await
        .expect("RunPodSandbox");
    let src = scratch();
    let point = src.path().join("vol");
    std::fs::create_dir(&point).unwrap();
    mount(
        Some("tmpfs"),
        &point,
        Some("tmpfs"),
        MsFlags::empty(),
        Some("size=1m"),
    )
    .expect("mount a tmpfs");
    let _unmount = Unmount(point.clone());
    mount(
        None::<&str>,
        &point,
        None::<&str>,
        MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .expect("make it private");
    let source = point.join("data");
    let with = |propagation: v1::MountPropagation, name: &str| {
        let mut c = container(name, &["sleep", "3600"]);
        c.mounts = vec![v1::Mount {
            container_path: "/shared".into(),
            host_path: source.display().to_string(),
            propagation: propagation as i32,
            ..Default::default()
        }];
        c
    };
    for (propagation, name, want) in [
        (
            v1::MountPropagation::PropagationBidirectional,
            "bidi",
            "shared mount",
        ),
        (
            v1::MountPropagation::PropagationHostToContainer,
            "h2c",
            "or a slave",
        ),
    ] {
        let err = cri::create(&bed.remora, &pod, &config, with(propagation, name))
            .await
            .expect_err("a private source");
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(
            err.message().contains("/shared")
                && err.message().contains(want)
                && err.message().contains(&point.display().to_string()),
            "{err:?}"
        );
        assert!(
            !source.exists(),
            "the missing source is not made for a refused create"
        );
    }
    let listed = bed
        .remora
        .runtime()
        .list_containers(v1::ListContainersRequest::default())
        .await
        .unwrap()
        .into_inner()
        .containers;
    assert!(listed.is_empty(), "{listed:?}");

    mount(
        None::<&str>,
        &point,
        None::<&str>,
        MsFlags::MS_SHARED,
        None::<&str>,
    )
    .expect("make it shared");
    cri::create(
        &bed.remora,
        &pod,
        &config,
        with(v1::MountPropagation::PropagationBidirectional, "bidi-ok"),
    )
    .await
    .expect("a shared source");
    cri::remove_pod(&bed.remora, &pod).await;
}

/// A symlink at the container's log path is refused at StartContainer, not followed: the file
/// it names stays as it was.
#[tokio::test]
async fn a_symlinked_cri_log_is_refused_not_followed() {
    let bed = BedRemora::start_with_network();
    let logs = scratch();
    cri::pull(&bed.remora, "busybox").await.expect("pull");
    let config = cri::pod_config("log-link", logs.path(), false);
    let pod = cri::run_pod(&bed.remora, &config)
        .await
        .expect("RunPodSandbox");
    let victim = scratch();
    let target = victim.path().join("passwd");
    std::fs::write(&target, "root:x:0:0::/root:/bin/sh\n").unwrap();
    std::os::unix::fs::symlink(&target, logs.path().join("linked.log")).unwrap();
    let c = container("linked", &["echo", "written through the link"]);
    let id = cri::create(&bed.remora, &pod, &config, c)
        .await
        .expect("CreateContainer");
    let err = bed
        .remora
        .runtime()
        .start_container(v1::StartContainerRequest {
            container_id: id.clone(),
        })
        .await
        .expect_err("a symlinked log");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("symlink"), "{err:?}");
    // As a failed start of containerd's CRI: the container is marked exited, never ran.
    let status = cri::status(&bed.remora, &id).await.expect("status");
    assert_ne!(status.state, v1::ContainerState::ContainerRunning as i32);
    assert_eq!(
        std::fs::read_to_string(&target).unwrap(),
        "root:x:0:0::/root:/bin/sh\n"
    );
    cri::remove_pod(&bed.remora, &pod).await;
}
