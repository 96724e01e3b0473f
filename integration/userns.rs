//! Pods with a user namespace of their own, on the test bed (the pinned runc, the overlayfs
//! snapshotter's idmapped layers, the handler of `REMORA_IT_HANDLER`).

use std::path::PathBuf;
use std::time::Duration;

use remora::cri::v1;
use tonic::Code;

use crate::cri;
use crate::harness::BedRemora;

/// Host IDs of the test pods (0 inside): above anything the test machines hand out.
const HOST_ID: u32 = 1_200_000;
const LENGTH: u32 = 65536;

fn userns() -> v1::UserNamespace {
    let map = vec![v1::IdMapping {
        container_id: 0,
        host_id: HOST_ID,
        length: LENGTH,
    }];
    v1::UserNamespace {
        mode: v1::NamespaceMode::Pod as i32,
        uids: map.clone(),
        gids: map,
    }
}

fn with_userns(mut config: v1::PodSandboxConfig) -> v1::PodSandboxConfig {
    let linux = config.linux.get_or_insert_with(Default::default);
    let sc = linux.security_context.get_or_insert_with(Default::default);
    sc.namespace_options
        .get_or_insert_with(Default::default)
        .userns_options = Some(userns());
    config
}

#[tokio::test]
async fn a_user_namespaced_pod_sees_its_maps_and_owns_its_rootfs_and_files() {
    let bed = BedRemora::start_with_network();
    let status = cri::runtime_status(&bed.remora, false).await;
    let default = status
        .runtime_handlers
        .iter()
        .find(|h| h.name.is_empty())
        .expect("the default handler");
    assert!(
        default.features.as_ref().is_some_and(|f| f.user_namespaces),
        "the pinned runc has idmapped mounts: {status:?}"
    );
    cri::pull(&bed.remora, "busybox").await.expect("pull");
    let logs = crate::harness::scratch();
    let config = with_userns(cri::pod_config("userns", logs.path(), false));
    let pod = cri::run_pod(&bed.remora, &config)
        .await
        .expect("RunPodSandbox");

    // What the container sees: the maps, its rootfs, pod files and /dev/shm owned by its root
    // (idmapped, not `nobody`), a file it writes is its root's.
    let mut c = cri::shell_container(
        "probe",
        "cat /proc/self/uid_map /proc/self/gid_map; id -u; \
         ls -lnd / /bin /etc/hosts /etc/resolv.conf /dev/shm | awk '{print $3, $4, $NF}'; \
         touch /tmp/mine && ls -ln /tmp/mine | awk '{print $3, $4, $NF}'; \
         echo reopened > /dev/stdout",
    );
    c.linux
        .get_or_insert_with(Default::default)
        .security_context
        .get_or_insert_with(Default::default)
        .namespace_options = config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.clone());
    let id = cri::create_and_start(&bed.remora, &pod, &config, c).await;
    let s = cri::wait_exited(&bed.remora, &id, Duration::from_secs(30)).await;
    let log = std::fs::read_to_string(logs.path().join("probe.log")).expect("log");
    let out: Vec<String> = log
        .lines()
        .filter_map(|l| l.splitn(4, ' ').nth(3))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    assert_eq!(s.exit_code, 0, "{log}");
    assert_eq!(
        out,
        [
            format!("0 {HOST_ID} {LENGTH}"),
            format!("0 {HOST_ID} {LENGTH}"),
            "0".to_string(),
            "0 0 /".to_string(),
            "0 0 /bin".to_string(),
            "0 0 /dev/shm".to_string(),
            "0 0 /etc/hosts".to_string(),
            "0 0 /etc/resolv.conf".to_string(),
            "0 0 /tmp/mine".to_string(),
            // Its stdout reopened by path: the shim's pipe is usable by the pod's root.
            "reopened".to_string(),
        ],
        "{log}"
    );

    // The pod's network namespace and its pinned owner are gone with the pod.
    let info = cri::pod_verbose_info(&bed.remora, &pod).await;
    let netns = PathBuf::from(info["netnsPath"].as_str().expect("netnsPath"));
    let mut pin = netns.clone().into_os_string();
    pin.push(".userns");
    let pin = PathBuf::from(pin);
    assert!(netns.exists() && pin.exists(), "{netns:?} {pin:?}");
    cri::remove_pod(&bed.remora, &pod).await;
    assert!(!netns.exists() && !pin.exists(), "{netns:?} {pin:?}");
}

#[tokio::test]
async fn a_handler_without_user_namespaces_refuses_such_a_pod_and_makes_nothing() {
    // crun 1.8 cannot say what it supports (no `features` command): its handler claims nothing.
    let bed = BedRemora::start_with_network();
    let logs = crate::harness::scratch();
    let config = with_userns(cri::pod_config("userns-crun", logs.path(), false));
    let err = bed
        .remora
        .runtime()
        .run_pod_sandbox(v1::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: "crun".into(),
        })
        .await
        .expect_err("crun cannot run a user-namespaced pod here");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("user namespaces"), "{err:?}");
    assert!(cri::list_pods(&bed.remora).await.is_empty());
}

/// `config`'s namespace options (with its user namespace) as the container's, as kubelet
/// sends them.
fn in_pod_namespaces(
    mut c: v1::ContainerConfig,
    config: &v1::PodSandboxConfig,
) -> v1::ContainerConfig {
    c.linux
        .get_or_insert_with(Default::default)
        .security_context
        .get_or_insert_with(Default::default)
        .namespace_options = config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.clone());
    c
}

/// A bind of `host` at `container`, with the test pods' maps when `mapped` (as kubelet sends
/// every mount of a `hostUsers: false` pod).
fn bind(container: &str, host: &std::path::Path, mapped: bool, options: &[&str]) -> v1::Mount {
    let maps = if mapped { userns().uids } else { Vec::new() };
    v1::Mount {
        container_path: container.into(),
        host_path: host.display().to_string(),
        uid_mappings: maps.clone(),
        gid_mappings: maps,
        mount_options: options.iter().map(|o| o.to_string()).collect(),
        ..Default::default()
    }
}

/// The container's log lines without the CRI prefix, whitespace squeezed.
fn log_lines(log: &str) -> Vec<String> {
    log.lines()
        .filter_map(|l| l.splitn(4, ' ').nth(3))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

fn owner(path: &std::path::Path) -> (u32, u32) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    (m.uid(), m.gid())
}

#[tokio::test]
async fn cri_mounts_with_the_pods_maps_are_idmapped_and_take_mount_options() {
    use std::os::unix::fs::chown;
    let bed = BedRemora::start_with_network();
    cri::pull(&bed.remora, "busybox").await.expect("pull");
    let logs = crate::harness::scratch();
    let host = crate::harness::scratch();
    // A hostPath directory (root's, mode 0700) with a file of host root and one of the ID the
    // pod's root is on the host.
    let data = host.path().join("data");
    std::fs::create_dir(&data).expect("mkdir");
    std::fs::write(data.join("of-host-root"), "r").expect("write");
    std::fs::write(data.join("of-pod-root"), "p").expect("write");
    chown(data.join("of-pod-root"), Some(HOST_ID), Some(HOST_ID)).expect("chown");
    // Regular files, as kubelet binds /etc/hosts and the termination log (root's, 0644).
    let hosts = host.path().join("hosts");
    std::fs::write(&hosts, "127.0.0.1 localhost\n").expect("write");
    let termination = host.path().join("termination-log");
    std::fs::write(&termination, "").expect("write");
    let exec = host.path().join("exec");
    let noexec = host.path().join("noexec");
    std::fs::create_dir(&exec).expect("mkdir");
    std::fs::create_dir(&noexec).expect("mkdir");

    let config = with_userns(cri::pod_config("userns-mounts", logs.path(), false));
    let pod = cri::run_pod(&bed.remora, &config)
        .await
        .expect("RunPodSandbox");
    let mut c = in_pod_namespaces(
        cri::shell_container(
            "probe",
            "ls -ln /data/of-host-root /data/of-pod-root /plain/of-host-root /plain/of-pod-root \
               | awk '{print $3, $4, $NF}'; \
             touch /data/by-pod-root; \
             ls -ln /etc/hosts | awk '{print $3, $4, $NF}'; \
             echo '10.0.0.1 extra' >> /etc/hosts && echo hosts-written; \
             echo done > /dev/termination-log && echo log-written; \
             bb=$(readlink -f /bin/sh); \
             cp $bb /exec/true && /exec/true && echo exec-ran; \
             cp $bb /noexec/true; /noexec/true 2>/dev/null || echo noexec-refused; \
             awk '$5 == \"/noexec\" {print $6}' /proc/self/mountinfo",
        ),
        &config,
    );
    c.mounts = vec![
        bind("/data", &data, true, &[]),
        // The same directory without maps: host IDs seen as they are (unmapped: nobody).
        bind("/plain", &data, false, &[]),
        bind("/etc/hosts", &hosts, true, &[]),
        bind("/dev/termination-log", &termination, true, &[]),
        bind("/exec", &exec, true, &[]),
        bind("/noexec", &noexec, true, &["noexec", "nosuid", "nodev"]),
    ];
    let id = cri::create_and_start(&bed.remora, &pod, &config, c).await;
    let s = cri::wait_exited(&bed.remora, &id, Duration::from_secs(30)).await;
    let log = std::fs::read_to_string(logs.path().join("probe.log")).expect("log");
    let out = log_lines(&log);
    assert_eq!(s.exit_code, 0, "{log}");
    // An idmapped mount with the pod's maps shifts on-disk IDs by the pod's range: host root's
    // files are the pod root's, the host ID of the pod's root is outside the pod (nobody);
    // without the maps it is the other way round.
    assert_eq!(
        out[..4],
        [
            "0 0 /data/of-host-root",
            "65534 65534 /data/of-pod-root",
            "65534 65534 /plain/of-host-root",
            "0 0 /plain/of-pod-root",
        ],
        "{log}"
    );
    assert_eq!(
        out[4..9],
        [
            "0 0 /etc/hosts",
            "hosts-written",
            "log-written",
            "exec-ran",
            "noexec-refused",
        ],
        "{log}"
    );
    let flags: Vec<&str> = out[9].split(',').collect();
    for f in ["noexec", "nosuid", "nodev"] {
        assert!(flags.contains(&f), "{f} in {flags:?}: {log}");
    }
    assert_eq!(out.len(), 10, "{log}");
    // What the pod's root writes through the idmapped mount lands as host root (the mount
    // shifts back), in files and in the directory.
    assert_eq!(owner(&data.join("by-pod-root")), (0, 0));
    assert_eq!(
        std::fs::read_to_string(&hosts).expect("hosts"),
        "127.0.0.1 localhost\n10.0.0.1 extra\n"
    );
    assert_eq!(
        std::fs::read_to_string(&termination).expect("log"),
        "done\n"
    );
    cri::remove_pod(&bed.remora, &pod).await;
}

#[tokio::test]
async fn a_user_namespaced_pod_on_the_host_network_runs_and_sees_the_hosts_interfaces() {
    let bed = BedRemora::start_with_network();
    let status = cri::runtime_status(&bed.remora, false).await;
    assert!(
        status
            .features
            .as_ref()
            .is_some_and(|f| f.user_namespaces_host_network),
        "{status:?}"
    );
    cri::pull(&bed.remora, "busybox").await.expect("pull");
    // An interface of the host's network namespace other than lo: the one of a route, else
    // any listed.
    let host_ifaces: Vec<String> = std::fs::read_dir("/sys/class/net")
        .expect("/sys/class/net")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let route = std::fs::read_to_string("/proc/net/route").expect("routes");
    let iface = route
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .find(|i| *i != "lo")
        .map(str::to_string)
        .or_else(|| host_ifaces.iter().find(|i| *i != "lo").cloned())
        .expect("the host has an interface besides lo");
    let logs = crate::harness::scratch();
    let config = with_userns(cri::pod_config("userns-hostnet", logs.path(), true));
    let pod = cri::run_pod(&bed.remora, &config)
        .await
        .expect("RunPodSandbox");
    let c = in_pod_namespaces(
        cri::shell_container(
            "probe",
            &format!(
                "cat /proc/self/uid_map /proc/self/gid_map; id -u; \
                 grep -q '^ *{iface}:' /proc/net/dev && echo netdev-has-{iface}; \
                 test -e /sys/class/net/{iface} && echo sys-has-{iface}; \
                 awk '$5 == \"/sys\" {{print $6}}' /proc/self/mountinfo | cut -d, -f1; \
                 hostname"
            ),
        ),
        &config,
    );
    let id = cri::create_and_start(&bed.remora, &pod, &config, c).await;
    let s = cri::wait_exited(&bed.remora, &id, Duration::from_secs(30)).await;
    let log = std::fs::read_to_string(logs.path().join("probe.log")).expect("log");
    let out = log_lines(&log);
    assert_eq!(s.exit_code, 0, "{log}");
    let hostname = nix::unistd::gethostname()
        .expect("hostname")
        .to_string_lossy()
        .into_owned();
    assert_eq!(
        out,
        [
            format!("0 {HOST_ID} {LENGTH}"),
            format!("0 {HOST_ID} {LENGTH}"),
            "0".to_string(),
            format!("netdev-has-{iface}"),
            format!("sys-has-{iface}"),
            // The host's /sys bound read-only (sysfs cannot be mounted there).
            "ro".to_string(),
            hostname,
        ],
        "{log}"
    );
    cri::remove_pod(&bed.remora, &pod).await;
}

#[tokio::test]
async fn a_mount_option_the_cri_does_not_allow_is_refused_naming_it_and_nothing_is_made() {
    let bed = BedRemora::start_with_network();
    cri::pull(&bed.remora, "busybox").await.expect("pull");
    let logs = crate::harness::scratch();
    let host = crate::harness::scratch();
    // A missing hostPath is created by CreateContainer: a refused one must not be.
    let absent = host.path().join("absent");
    let config = with_userns(cri::pod_config("userns-badopt", logs.path(), false));
    let pod = cri::run_pod(&bed.remora, &config)
        .await
        .expect("RunPodSandbox");
    for (options, named) in [
        (&["nodev", "exec"][..], "config.mounts[0].mount_options[1]"),
        (&["rw"][..], "config.mounts[0].mount_options[0]"),
    ] {
        let mut c = in_pod_namespaces(cri::shell_container("bad", "true"), &config);
        c.mounts = vec![bind("/data", &absent, true, options)];
        let err = cri::create(&bed.remora, &pod, &config, c)
            .await
            .expect_err("an option the CRI does not allow");
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(err.message().contains(named), "{err:?}");
    }
    // Maps on one side only: refused too, naming the missing one.
    let mut c = in_pod_namespaces(cri::shell_container("bad", "true"), &config);
    let mut m = bind("/data", &absent, true, &[]);
    m.gid_mappings.clear();
    c.mounts = vec![m];
    let err = cri::create(&bed.remora, &pod, &config, c)
        .await
        .expect_err("uid maps without gid maps");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("config.mounts[0].gid_mappings"),
        "{err:?}"
    );
    let containers = bed
        .remora
        .runtime()
        .list_containers(v1::ListContainersRequest { filter: None })
        .await
        .expect("ListContainers")
        .into_inner()
        .containers;
    assert!(containers.is_empty(), "{containers:?}");
    assert!(!absent.exists(), "{absent:?} made for a refused container");
    cri::remove_pod(&bed.remora, &pod).await;
}

/// An image volume of a `hostUsers: false` pod (kubelet sends the pod's maps on it): its view
/// is idmapped with the pod's maps, so the image's root-owned files are the pod's root's, read
/// but not written. One volume of a one-layer image (the snapshotter's view is a bind of the
/// layer) and one of a two-layer image's sub path (an overlay over idmapped layers).
#[tokio::test]
async fn an_image_volume_with_the_pods_maps_shows_the_images_root_files_as_the_pods_root() {
    let bed = BedRemora::start_with_network();
    cri::pull(&bed.remora, "busybox").await.expect("pull");
    let one = crate::harness::push_image(1, 4096).await;
    let two = crate::harness::push_image(2, 4096).await;
    for image in [&one, &two] {
        cri::pull(&bed.remora, &image.reference)
            .await
            .expect("pull the volume's image");
    }
    let logs = crate::harness::scratch();
    let config = with_userns(cri::pod_config("userns-imagevol", logs.path(), false));
    let pod = cri::run_pod(&bed.remora, &config)
        .await
        .expect("RunPodSandbox");
    let volume = |at: &str, image: &str, sub_path: &str| {
        let maps = userns().uids;
        v1::Mount {
            container_path: at.into(),
            readonly: true,
            image: Some(cri::image_spec(image)),
            image_sub_path: sub_path.into(),
            uid_mappings: maps.clone(),
            gid_mappings: maps,
            ..Default::default()
        }
    };
    let mut c = in_pod_namespaces(
        cri::shell_container(
            "probe",
            "stat -c '%u %g %n' /one/data/layer0.bin /two/layer0.bin /two/layer1.bin; \
             wc -c < /two/layer1.bin; \
             touch /one/x 2>/dev/null || echo one read-only; \
             touch /two/x 2>/dev/null || echo two read-only; \
             echo $(ls /two)",
        ),
        &config,
    );
    c.mounts = vec![
        volume("/one", &one.reference, ""),
        volume("/two", &two.reference, "data"),
    ];
    let id = cri::create_and_start(&bed.remora, &pod, &config, c).await;
    let s = cri::wait_exited(&bed.remora, &id, Duration::from_secs(30)).await;
    let log = std::fs::read_to_string(logs.path().join("probe.log")).expect("log");
    assert_eq!(s.exit_code, 0, "{log}");
    assert_eq!(
        log_lines(&log),
        [
            "0 0 /one/data/layer0.bin",
            "0 0 /two/layer0.bin",
            "0 0 /two/layer1.bin",
            "4096",
            "one read-only",
            "two read-only",
            "layer0.bin layer1.bin",
        ],
        "{log}"
    );
    // The view snapshots are gone with the container, and every mount with them (the
    // idmapped layers an overlay was mounted over were detached once it was).
    let dir = bed.state_dir().join("image-volumes").join(&id);
    cri::remove_pod(&bed.remora, &pod).await;
    assert!(
        !bed.ctr(&["snapshots", "ls"]).contains("-imagevolume-"),
        "the views are removed"
    );
    assert!(!dir.exists(), "{} is left", dir.display());
    assert!(
        !crate::testbed::mount_points()
            .iter()
            .any(|m| m.contains(&id) || m.contains("idmapped-layers")),
        "no mount is left"
    );
}

/// Maps on an image volume that are not the pod's are refused at create, naming the field,
/// and nothing is made: the view can be idmapped only with the pod's one range from ID 0
/// (containerd 2.3 would take the first range's host ID and length whatever they say).
#[tokio::test]
async fn an_image_volume_with_maps_not_the_pods_is_refused_and_nothing_is_made() {
    let bed = BedRemora::start_with_network();
    cri::pull(&bed.remora, "busybox").await.expect("pull");
    let logs = crate::harness::scratch();
    let config = with_userns(cri::pod_config("userns-imagevol-other", logs.path(), false));
    let pod = cri::run_pod(&bed.remora, &config)
        .await
        .expect("RunPodSandbox");
    let mut other = userns().gids;
    other[0].host_id += LENGTH;
    let mut c = in_pod_namespaces(cri::shell_container("probe", "true"), &config);
    c.mounts = vec![v1::Mount {
        container_path: "/image".into(),
        readonly: true,
        image: Some(cri::image_spec("busybox")),
        uid_mappings: userns().uids,
        gid_mappings: other,
        ..Default::default()
    }];
    let err = cri::create(&bed.remora, &pod, &config, c)
        .await
        .expect_err("an image volume with maps not the pod's");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("config.mounts[0].gid_mappings")
            && err.message().contains("pod's user namespace maps"),
        "{err:?}"
    );
    let containers = bed
        .remora
        .runtime()
        .list_containers(v1::ListContainersRequest { filter: None })
        .await
        .expect("ListContainers")
        .into_inner()
        .containers;
    assert!(containers.is_empty(), "{containers:?}");
    assert!(
        !bed.ctr(&["snapshots", "ls"]).contains("-imagevolume-"),
        "no image volume view is made"
    );
    cri::remove_pod(&bed.remora, &pod).await;
}
