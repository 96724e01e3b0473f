//! Rollback unit tests: each mutating operation runs over recording fakes ([`fakes`]) with one
//! step made to fail in turn; the tests assert the exact undo sequence, what is left of the
//! object (nothing), and what the journal keeps (nothing, unless an undo step failed too).
//!
//! Host effects stay real but harmless: pod files and FIFOs go to a temp dir, network
//! namespaces are faked, and CreateContainer bind-mounts an empty temp dir as the rootfs
//! (which needs root, as the test bed has).

mod fakes;
mod nri;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fakes::{Call, CallLog, FakeContainerd, FakeImages, FakeNetwork, FakeOci, Until};

use super::{
    creation_lease_id, Backends, ContainerError, CreateRequest, HandlerRuntime, Pods, PodsConfig,
    RunSandbox, RuntimeHandlers, SandboxError,
};
use crate::images::store::ImageInfo;
use crate::lifecycle::apparmor::fake::FakeLoader;
use crate::lifecycle::apparmor::{AppArmor, AppArmorError, AppArmorPaths, Includes, LoadError};
use crate::lifecycle::backend::{RuncOptions, ShimRuntime};
use crate::spec::{
    AppArmorProfile, CgroupDriver, ContainerConfig, HostFacts, NamespaceMode, SandboxConfig,
    SpecError,
};
use crate::store::persist::{Persisted, SANDBOX_EXTENSION};
use crate::store::{
    container_name_key, sandbox_name_key, ContainerMetadata, ContainerState, Sandbox,
    SandboxMetadata, SandboxState, SandboxStatus,
};

const PAUSE: &str = "registry.k8s.io/pause:3.10";
const APP: &str = "docker.io/library/app:1";
/// An image whose config says `"StopSignal": "rtmin+3"`.
const QUITS: &str = "docker.io/library/quits:1";
/// An image whose config's StopSignal is no signal.
const BOGUS: &str = "docker.io/library/bogus:1";
const KILL: u32 = libc::SIGKILL as u32;

struct Bed {
    pods: Arc<Pods>,
    log: CallLog,
    containerd: FakeContainerd,
    oci: FakeOci,
    _dir: tempfile::TempDir,
    state_dir: PathBuf,
}

impl Bed {
    /// The intent file of operation `id` (see `journal`).
    fn intent_file(&self, id: &str) -> PathBuf {
        self.state_dir.join("pending").join(format!("{id}.json"))
    }
}

fn image(id: &str) -> ImageInfo {
    image_stopping_with(id, None)
}

fn image_stopping_with(id: &str, stop_signal: Option<&str>) -> ImageInfo {
    let stop_signal = stop_signal
        .map(|s| format!(r#","StopSignal":"{s}""#))
        .unwrap_or_default();
    let config = format!(
        r#"{{"architecture":"amd64","os":"linux","config":{{"Cmd":["/bin/sh"]{stop_signal}}},"rootfs":{{"type":"layers","diff_ids":[]}}}}"#
    );
    ImageInfo {
        id: id.into(),
        repo_tags: BTreeSet::new(),
        repo_digests: BTreeSet::new(),
        size: 1,
        user: String::new(),
        chain_id: format!("{id}-chain"),
        pinned: false,
        config: std::sync::Arc::new(
            crate::images::manifest::ImageConfig::parse(config.as_bytes()).unwrap(),
        ),
    }
}

fn bed() -> Bed {
    bed_with_handlers(RuntimeHandlers::single_runc("io.containerd.runc.v2"))
}

fn bed_with_handlers(handlers: RuntimeHandlers) -> Bed {
    bed_with(handlers, HostFacts::default(), |_| {
        FakeLoader::new(Ok(()), None)
    })
    .0
}

/// A bed on a host with AppArmor whose kernel lists `profiles` (no list file: `None`) and
/// whose default-profile loads answer `load` (a successful one lists the profile).
fn bed_with_apparmor(
    profiles: Option<&str>,
    load: Result<(), LoadError>,
) -> (Bed, Arc<FakeLoader>) {
    let host = HostFacts {
        apparmor_enabled: true,
        ..HostFacts::default()
    };
    let profiles = profiles.map(str::to_string);
    bed_with(
        RuntimeHandlers::single_runc("io.containerd.runc.v2"),
        host,
        move |list: &Path| {
            if let Some(p) = &profiles {
                std::fs::write(list, p).expect("the profiles list");
            }
            FakeLoader::new(load, Some(list.to_path_buf()))
        },
    )
}

fn bed_with(
    handlers: RuntimeHandlers,
    host: HostFacts,
    loader: impl FnOnce(&Path) -> Arc<FakeLoader>,
) -> (Bed, Arc<FakeLoader>) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let profiles = dir.path().join("apparmor-profiles");
    let loader = loader(&profiles);
    let apparmor = AppArmor::new(
        AppArmorPaths {
            profiles,
            profile_file: dir.path().join("state/apparmor/remora-default"),
        },
        Includes::ALL,
        loader.clone(),
        slog::Logger::root(slog::Discard, slog::o!()),
    );
    let state_dir = dir.path().join("state");
    let rootfs = dir.path().join("rootfs");
    std::fs::create_dir_all(&rootfs).expect("the rootfs dir");
    let log = CallLog::default();
    let containerd = FakeContainerd::new(log.clone(), rootfs);
    let shared = Arc::new(containerd.clone());
    let oci = FakeOci::new(log.clone());
    let pods = Pods::new(
        PodsConfig {
            state_dir: state_dir.clone(),
            sandbox_image: PAUSE.into(),
            snapshotter: "overlayfs".into(),
            handlers,
            cdi: Arc::new(crate::cdi::Registry::new(
                true,
                vec![dir.path().join("cdi")],
                slog::Logger::root(slog::Discard, slog::o!()),
            )),
        },
        Backends {
            containers: shared.clone(),
            tasks: shared.clone(),
            snapshots: shared.clone(),
            leases: shared,
            images: Arc::new(FakeImages::new(
                log.clone(),
                vec![
                    (PAUSE.into(), image("sha256:pause")),
                    (APP.into(), image("sha256:app")),
                    (
                        QUITS.into(),
                        image_stopping_with("sha256:quits", Some("rtmin+3")),
                    ),
                    (
                        BOGUS.into(),
                        image_stopping_with("sha256:bogus", Some("SIGBOGUS")),
                    ),
                ],
            )),
            network: Arc::new(FakeNetwork::new(log.clone(), state_dir.join("netns"))),
            oci: Arc::new(oci.clone()),
            apparmor: Arc::new(apparmor),
            stats: Arc::new(crate::lifecycle::stats_sampler::HostSource::new(
                host.cgroup_driver,
            )),
        },
        host,
        slog::Logger::root(slog::Discard, slog::o!()),
    );
    let bed = Bed {
        pods: Arc::new(pods),
        log,
        containerd,
        oci,
        _dir: dir,
        state_dir,
    };
    (bed, loader)
}

fn pod_request() -> RunSandbox {
    let mut config = SandboxConfig {
        name: "web".into(),
        namespace: "default".into(),
        uid: "uid-1".into(),
        hostname: "web".into(),
        ..Default::default()
    };
    // The host's IPC namespace: no /dev/shm tmpfs to mount for the pod.
    config.security.namespaces.ipc = NamespaceMode::Node;
    RunSandbox {
        config,
        ..Default::default()
    }
}

/// The id the operation generated: the argument of its first recorded call.
fn first_id(log: &CallLog) -> String {
    match log.calls().first() {
        Some(Call::NetnsCreate(id, _) | Call::LeaseCreate(id)) => {
            id.strip_prefix("remora-create-").unwrap_or(id).to_string()
        }
        other => panic!("unexpected first call {other:?}"),
    }
}

/// Runs a RunPodSandbox that the bed's scripted failure makes fail: its error, and the id and
/// netns path the operation used.
async fn run_sandbox_failing(b: &Bed) -> (SandboxError, String, PathBuf) {
    let err = b
        .pods
        .run_sandbox(pod_request())
        .await
        .expect_err("the scripted failure");
    let id = first_id(&b.log);
    let netns = b.state_dir.join("netns").join(&id);
    (err, id, netns)
}

/// A host-network-less pod's first RunPodSandbox calls, up to its pause snapshot: netns, CNI
/// ADD, the creation lease, the snapshot (the fake's order when CNI ADD is not held back).
fn run_sandbox_calls_through_prepare(id: &str) -> Vec<Call> {
    let lease = creation_lease_id(id);
    vec![
        Call::NetnsCreate(id.to_string(), None),
        Call::CniAdd(id.to_string()),
        Call::LeaseCreate(lease.clone()),
        Call::SnapshotPrepare(lease, id.to_string(), "sha256:pause-chain".into(), vec![]),
    ]
}

/// Every call of a RunPodSandbox that succeeds, in order.
fn run_sandbox_calls(id: &str) -> Vec<Call> {
    let mut calls = run_sandbox_calls_through_prepare(id);
    calls.extend([
        Call::RecordCreate(id.to_string()),
        Call::TaskCreate(id.to_string()),
        Call::RecordSetExtension(id.to_string(), SANDBOX_EXTENSION.into()),
        Call::TaskStart(id.to_string()),
        Call::LeaseDelete(creation_lease_id(id)),
    ]);
    calls
}

/// The calls that undo each RunPodSandbox step, in the order the steps are made.
fn sandbox_undo(id: &str, netns: &Path) -> Vec<(&'static str, Vec<Call>)> {
    let lease = creation_lease_id(id);
    vec![
        (
            "network.create_netns",
            vec![Call::NetnsRemove(netns.to_path_buf())],
        ),
        ("network.setup", vec![Call::CniDel(id.into())]),
        ("leases.create", vec![Call::LeaseDelete(lease)]),
        ("snapshots.prepare", vec![Call::SnapshotRemove(id.into())]),
        ("containers.create", vec![Call::RecordDelete(id.into())]),
        (
            "tasks.create",
            vec![
                Call::TaskKill(id.into(), KILL, true),
                Call::TaskWait(id.into()),
                Call::TaskDelete(id.into()),
            ],
        ),
    ]
}

/// RunPodSandbox with `op`'s first call failing: the undo of every step made before it runs,
/// newest first; nothing of the pod is left, and the intent is dropped.
async fn run_sandbox_fails_at(op: &'static str) {
    let b = bed();
    b.log.fail(op, 1);
    let err = b
        .pods
        .run_sandbox(pod_request())
        .await
        .expect_err("the scripted failure");
    assert!(
        matches!(
            err,
            SandboxError::Containerd(_) | SandboxError::Netns(_) | SandboxError::Network(_)
        ),
        "{op}: not the step's own error: {err:?}"
    );
    let id = first_id(&b.log);
    let netns = b.state_dir.join("netns").join(&id);
    // Steps made before the failing one (a failing step made nothing, except a failed lease
    // delete after the task started, which is the last step).
    let undo = sandbox_undo(&id, &netns);
    let made: Vec<&(&str, Vec<Call>)> = match undo.iter().position(|(o, _)| *o == op) {
        Some(i) => undo[..i].iter().collect(),
        None => undo.iter().collect(),
    };
    let expected: Vec<Call> = made.iter().rev().flat_map(|(_, c)| c.clone()).collect();
    assert_eq!(b.log.after_failure(), expected, "{op}: undo sequence");
    assert_pod_undone(&b, &id, op);
}

/// Nothing of pod `id` is left after its failed RunPodSandbox: no record, task, index entry,
/// pod files, name reservation or intent.
fn assert_pod_undone(b: &Bed, id: &str, op: &str) {
    assert!(!b.containerd.has_record(id), "{op}: record left");
    assert!(!b.containerd.has_task(id), "{op}: task left");
    assert!(b.pods.sandboxes.get(id).is_err(), "{op}: indexed");
    assert!(
        !b.state_dir.join("sandboxes").join(id).exists(),
        "{op}: pod files left"
    );
    assert_eq!(
        b.pods
            .names
            .holder(&sandbox_name_key("web", "default", "uid-1", 0)),
        None,
        "{op}: name still reserved"
    );
    assert!(
        !b.state_dir
            .join("pending")
            .join(format!("{id}.json"))
            .exists(),
        "{op}: intent kept"
    );
    assert!(!b.pods.journal.is_stale(id), "{op}: intent deferred");
}

#[tokio::test]
async fn run_sandbox_netns_creation_fails_nothing_to_undo() {
    run_sandbox_fails_at("network.create_netns").await;
}

#[tokio::test]
async fn run_sandbox_cni_add_fails_netns_removed() {
    run_sandbox_fails_at("network.setup").await;
}

#[tokio::test]
async fn run_sandbox_lease_fails_cni_del_then_netns_removed() {
    run_sandbox_fails_at("leases.create").await;
}

#[tokio::test]
async fn run_sandbox_snapshot_fails_lease_cni_netns_undone() {
    run_sandbox_fails_at("snapshots.prepare").await;
}

#[tokio::test]
async fn run_sandbox_record_fails_snapshot_removed_first() {
    run_sandbox_fails_at("containers.create").await;
}

#[tokio::test]
async fn run_sandbox_task_create_fails_record_deleted_first() {
    run_sandbox_fails_at("tasks.create").await;
}

#[tokio::test]
async fn run_sandbox_task_start_fails_task_killed_and_deleted_first() {
    run_sandbox_fails_at("tasks.start").await;
}

#[tokio::test]
async fn run_sandbox_lease_release_fails_everything_undone() {
    run_sandbox_fails_at("leases.delete").await;
}

#[tokio::test]
async fn run_sandbox_succeeds_in_order_and_drops_its_intent() {
    let b = bed();
    let id = b.pods.run_sandbox(pod_request()).await.expect("a pod");
    let netns = b.state_dir.join("netns").join(&id);
    // The exit monitor's Task.Wait may follow; the operation's own calls come first.
    let calls = b.log.calls();
    assert_eq!(calls[..9], run_sandbox_calls(&id));
    let sb = b.pods.sandboxes.get(&id).expect("indexed").snapshot();
    assert_eq!(sb.status.state, SandboxState::Ready);
    assert_eq!(sb.metadata.netns_path, netns.display().to_string());
    assert_eq!(sb.metadata.ip, "10.88.0.7");
    assert_eq!(
        recorded_metadata(&b, &id),
        *sb.metadata,
        "the record's metadata"
    );
    assert!(!b
        .state_dir
        .join("pending")
        .join(format!("{id}.json"))
        .exists());
}

#[tokio::test]
async fn run_sandbox_failed_undo_is_reported_and_the_intent_kept() {
    let b = bed();
    b.log.fail("tasks.create", 1);
    b.log.fail("snapshots.remove", 1);
    let (err, id, _) = run_sandbox_failing(&b).await;
    let SandboxError::RolledBackPartly { source, rollback } = &err else {
        panic!("the rollback failure is not reported: {err:?}");
    };
    assert!(
        matches!(source.as_ref(), SandboxError::Containerd(_)),
        "{source:?}"
    );
    let failed: Vec<&str> = rollback.failed.iter().map(|f| f.step).collect();
    assert_eq!(failed, ["remove rootfs snapshot"]);
    assert!(err.to_string().contains("remove rootfs snapshot"), "{err}");
    // The other undo steps still ran, in order.
    let netns = b.state_dir.join("netns").join(&id);
    assert_eq!(
        b.log.after_failure(),
        [
            Call::RecordDelete(id.clone()),
            Call::SnapshotRemove(id.clone()),
            Call::LeaseDelete(creation_lease_id(&id)),
            Call::CniDel(id.clone()),
            Call::NetnsRemove(netns),
        ]
    );
    // The intent stays on disk and joins the stale ones, for the sweep.
    assert!(b
        .state_dir
        .join("pending")
        .join(format!("{id}.json"))
        .exists());
    assert!(b.pods.journal.is_stale(&id));
}

#[tokio::test]
async fn run_sandbox_on_the_host_network_makes_no_netns() {
    let b = bed();
    let mut req = pod_request();
    req.config.security.namespaces.network = NamespaceMode::Node;
    b.log.fail("tasks.create", 1);
    b.pods
        .run_sandbox(req)
        .await
        .expect_err("the scripted failure");
    let id = first_id(&b.log);
    assert_eq!(
        b.log.after_failure(),
        [
            Call::RecordDelete(id.clone()),
            Call::SnapshotRemove(id.clone()),
            Call::LeaseDelete(creation_lease_id(&id)),
        ]
    );
}

/// The sandbox metadata on pod `id`'s containerd record.
fn recorded_metadata(b: &Bed, id: &str) -> SandboxMetadata {
    let record = b.containerd.record(id).expect("the pause record");
    SandboxMetadata::decode_extension(&record.extensions[SANDBOX_EXTENSION])
        .expect("the sandbox extension")
}

// CNI ADD runs concurrently with the pause container's pod files, lease, snapshot, record and
// task create. The fakes' hold points order the two branches as each test needs.

#[tokio::test]
async fn run_sandbox_with_a_slow_cni_add_records_the_ips_before_the_task_starts() {
    let b = bed();
    b.log.hold("network.setup", Until::Returned("tasks.create"));
    let id = b.pods.run_sandbox(pod_request()).await.expect("a pod");
    let calls = b.log.calls();
    assert_eq!(calls[..9], run_sandbox_calls(&id));
    let sb = b.pods.sandboxes.get(&id).expect("indexed").snapshot();
    assert_eq!(sb.metadata.ip, "10.88.0.7");
    assert_eq!(recorded_metadata(&b, &id).ip, "10.88.0.7");
}

#[tokio::test]
async fn run_sandbox_cni_add_failing_after_the_pause_task_was_made_undoes_all_of_it() {
    let b = bed();
    b.log.fail("network.setup", 1);
    b.log.hold("network.setup", Until::Returned("tasks.create"));
    let (err, id, netns) = run_sandbox_failing(&b).await;
    assert!(matches!(err, SandboxError::Network(_)), "{err:?}");
    let lease = creation_lease_id(&id);
    // The pause branch made everything it makes; the network undid its own partial ADD, so
    // there is no CNI DEL; the netns goes last.
    let mut expected = run_sandbox_calls_through_prepare(&id);
    expected.extend([
        Call::RecordCreate(id.clone()),
        Call::TaskCreate(id.clone()),
        Call::TaskKill(id.clone(), KILL, true),
        Call::TaskWait(id.clone()),
        Call::TaskDelete(id.clone()),
        Call::RecordDelete(id.clone()),
        Call::SnapshotRemove(id.clone()),
        Call::LeaseDelete(lease),
        Call::NetnsRemove(netns),
    ]);
    assert_eq!(b.log.calls(), expected);
    assert_pod_undone(&b, &id, "network.setup");
}

#[tokio::test]
async fn run_sandbox_snapshot_failing_while_cni_add_runs_still_ends_with_cni_del() {
    let b = bed();
    b.log.fail("snapshots.prepare", 1);
    // CNI ADD succeeds only after the pause branch failed.
    b.log
        .hold("network.setup", Until::Returned("snapshots.prepare"));
    let (err, id, netns) = run_sandbox_failing(&b).await;
    assert!(matches!(err, SandboxError::Containerd(_)), "{err:?}");
    let lease = creation_lease_id(&id);
    let mut expected = run_sandbox_calls_through_prepare(&id);
    expected.extend([
        Call::LeaseDelete(lease),
        Call::CniDel(id.clone()),
        Call::NetnsRemove(netns),
    ]);
    assert_eq!(b.log.calls(), expected);
    assert_pod_undone(&b, &id, "snapshots.prepare");
}

#[tokio::test]
async fn run_sandbox_task_create_failing_while_cni_add_runs_still_ends_with_cni_del() {
    let b = bed();
    b.log.fail("tasks.create", 1);
    b.log.hold("network.setup", Until::Returned("tasks.create"));
    let (err, id, netns) = run_sandbox_failing(&b).await;
    assert!(matches!(err, SandboxError::Containerd(_)), "{err:?}");
    assert_eq!(
        b.log.after_failure(),
        [
            Call::RecordDelete(id.clone()),
            Call::SnapshotRemove(id.clone()),
            Call::LeaseDelete(creation_lease_id(&id)),
            Call::CniDel(id.clone()),
            Call::NetnsRemove(netns),
        ]
    );
    assert_pod_undone(&b, &id, "tasks.create");
}

#[tokio::test]
async fn run_sandbox_cni_add_failing_stops_the_pause_branch_before_its_next_step() {
    let b = bed();
    b.log.fail("network.setup", 1);
    // CNI ADD fails once the lease is asked for; the lease is made once ADD has failed.
    b.log.hold("network.setup", Until::Called("leases.create"));
    b.log
        .hold("leases.create", Until::Returned("network.setup"));
    let (err, id, netns) = run_sandbox_failing(&b).await;
    // The network's own error, not the pause branch's stop.
    assert!(matches!(err, SandboxError::Network(_)), "{err:?}");
    let lease = creation_lease_id(&id);
    // No snapshot, record or task was made: the lease the branch was making is undone.
    assert_eq!(
        b.log.calls(),
        [
            Call::NetnsCreate(id.clone(), None),
            Call::CniAdd(id.clone()),
            Call::LeaseCreate(lease.clone()),
            Call::LeaseDelete(lease),
            Call::NetnsRemove(netns),
        ]
    );
    assert_pod_undone(&b, &id, "network.setup");
}

#[tokio::test]
async fn run_sandbox_undo_order_is_the_same_whichever_branch_finishes_first() {
    let mut sequences = Vec::new();
    for slow_network in [false, true] {
        let b = bed();
        b.log.fail("tasks.start", 1);
        if slow_network {
            b.log.hold("network.setup", Until::Returned("tasks.create"));
        } else {
            // The pause branch waits until CNI ADD is done.
            b.log
                .hold("leases.create", Until::Returned("network.setup"));
        }
        let (_, id, netns) = run_sandbox_failing(&b).await;
        let undo = b.log.after_failure();
        assert_eq!(
            undo,
            [
                Call::TaskKill(id.clone(), KILL, true),
                Call::TaskWait(id.clone()),
                Call::TaskDelete(id.clone()),
                Call::RecordDelete(id.clone()),
                Call::SnapshotRemove(id.clone()),
                Call::LeaseDelete(creation_lease_id(&id)),
                Call::CniDel(id.clone()),
                Call::NetnsRemove(netns),
            ],
            "slow network: {slow_network}"
        );
        assert_pod_undone(&b, &id, "tasks.start");
        sequences.push(b.log.calls().iter().map(Call::op).collect::<Vec<_>>());
    }
    // Only where CNI ADD's result lands differs: the calls themselves are the same.
    assert_eq!(sequences[0], sequences[1]);
}

/// A bed with one ready pod; the log starts empty.
async fn bed_with_pod() -> (Bed, String) {
    with_pod(bed(), pod_request()).await
}

/// `b` with pod `req` running, the call log cleared.
async fn with_pod(b: Bed, req: RunSandbox) -> (Bed, String) {
    let pod = b.pods.run_sandbox(req).await.expect("a pod");
    // Let the pause task's exit monitor make its Task.Wait call before the log is cleared.
    for _ in 0..100 {
        if b.log.calls().contains(&Call::TaskWait(pod.clone())) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    b.log.clear();
    (b, pod)
}

fn create_request(pod: &str) -> CreateRequest {
    CreateRequest {
        sandbox_id: pod.into(),
        config: ContainerConfig::default(),
        metadata: ContainerMetadata {
            name: "app".into(),
            ..Default::default()
        },
        image: APP.into(),
        target_id: None,
        sandbox_config: None,
    }
}

/// CreateContainer with `op`'s first call failing: the undo of every step made before it
/// runs, newest first; no container, no name, no intent left.
async fn create_container_fails_at(op: &'static str, undo: fn(&str) -> Vec<Call>) {
    let (b, pod) = bed_with_pod().await;
    b.log.fail(op, 1);
    let err = b
        .pods
        .create_container(create_request(&pod))
        .await
        .expect_err("the scripted failure");
    assert!(
        matches!(err, ContainerError::Containerd(_)),
        "{op}: {err:?}"
    );
    let id = first_id(&b.log);
    assert_eq!(b.log.after_failure(), undo(&id), "{op}: undo sequence");
    assert!(!b.containerd.has_record(&id), "{op}: record left");
    assert!(b.pods.containers_store.get(&id).is_err(), "{op}: indexed");
    assert_eq!(
        b.pods
            .names
            .holder(&container_name_key("app", "web", "default", "uid-1", 0)),
        None,
        "{op}: name still reserved"
    );
    assert!(!b
        .state_dir
        .join("pending")
        .join(format!("{id}.json"))
        .exists());
    assert!(!b.state_dir.join("tmpmounts").join(&id).exists());
}

#[tokio::test]
async fn create_container_lease_fails_nothing_to_undo() {
    create_container_fails_at("leases.create", |_| vec![]).await;
}

#[tokio::test]
async fn create_container_snapshot_fails_lease_deleted() {
    create_container_fails_at("snapshots.prepare", |id| {
        vec![Call::LeaseDelete(creation_lease_id(id))]
    })
    .await;
}

#[tokio::test]
async fn create_container_record_fails_snapshot_removed_then_lease_deleted() {
    create_container_fails_at("containers.create", |id| {
        vec![
            Call::SnapshotRemove(id.into()),
            Call::LeaseDelete(creation_lease_id(id)),
        ]
    })
    .await;
}

#[tokio::test]
async fn create_container_succeeds_and_a_failed_lease_release_is_no_failure() {
    let (b, pod) = bed_with_pod().await;
    b.log.fail("leases.delete", 1);
    let id = b
        .pods
        .create_container(create_request(&pod))
        .await
        .expect("a container");
    let lease = creation_lease_id(&id);
    assert_eq!(
        b.log.calls(),
        [
            Call::LeaseCreate(lease.clone()),
            Call::SnapshotPrepare(lease.clone(), id.clone(), "sha256:app-chain".into(), vec![]),
            Call::RecordCreate(id.clone()),
            Call::LeaseDelete(lease),
        ]
    );
    assert_eq!(
        b.pods.containers_store.get(&id).expect("indexed").state(),
        ContainerState::Created
    );
    // The container goes into its pod's shim; the pause container's task starts it (see
    // ContainerRecord::sandbox).
    assert_eq!(b.containerd.record(&id).expect("record").sandbox, pod);
    assert_eq!(b.containerd.record(&pod).expect("record").sandbox, "");
    assert!(!b
        .state_dir
        .join("pending")
        .join(format!("{id}.json"))
        .exists());
}

#[tokio::test]
async fn create_container_failed_undo_is_reported_and_the_intent_kept() {
    let (b, pod) = bed_with_pod().await;
    b.log.fail("containers.create", 1);
    b.log.fail("leases.delete", 1);
    let err = b
        .pods
        .create_container(create_request(&pod))
        .await
        .expect_err("the scripted failure");
    let id = first_id(&b.log);
    let ContainerError::RolledBackPartly { rollback, .. } = &err else {
        panic!("the rollback failure is not reported: {err:?}");
    };
    let failed: Vec<&str> = rollback.failed.iter().map(|f| f.step).collect();
    assert_eq!(failed, ["delete creation lease"]);
    assert!(b
        .state_dir
        .join("pending")
        .join(format!("{id}.json"))
        .exists());
    assert!(b.pods.journal.is_stale(&id));
}

#[tokio::test]
async fn create_container_in_an_unknown_pod_makes_nothing() {
    let (b, _pod) = bed_with_pod().await;
    let err = b
        .pods
        .create_container(create_request("nope"))
        .await
        .expect_err("no such pod");
    assert!(matches!(err, ContainerError::SandboxNotFound(_)), "{err:?}");
    assert_eq!(b.log.calls(), []);
}

/// A bed with one pod and one created container; the log starts empty.
async fn bed_with_container() -> (Bed, String, String) {
    let (b, pod) = bed_with_pod().await;
    let id = b
        .pods
        .create_container(create_request(&pod))
        .await
        .expect("a container");
    b.log.clear();
    (b, pod, id)
}

/// StartContainer with `op`'s first call failing: the task (if made) is deleted, the FIFOs
/// removed, and the container is EXITED with the reason (CRI has no way back to CREATED).
async fn start_container_fails_at(op: &'static str) {
    let (b, _pod, id) = bed_with_container().await;
    b.log.fail(op, 1);
    let err = b
        .pods
        .start_container(&id)
        .await
        .expect_err("the scripted failure");
    assert!(
        matches!(err, ContainerError::Containerd(_)),
        "{op}: {err:?}"
    );
    assert_eq!(
        b.log.after_failure(),
        [Call::TaskDelete(id.clone())],
        "{op}"
    );
    assert!(!b.containerd.has_task(&id), "{op}: task left");
    let c = b.pods.containers_store.get(&id).expect("still indexed");
    assert_eq!(c.state(), ContainerState::Exited, "{op}");
    assert!(!b.pods.is_monitored(&id), "{op}: monitor flag left");
    assert!(b.pods.io.get(&id).is_none(), "{op}: IO left");
}

#[tokio::test]
async fn start_container_snapshot_mounts_fail_task_delete_tried() {
    start_container_fails_at("snapshots.mounts").await;
}

#[tokio::test]
async fn start_container_task_create_fails_task_delete_tried() {
    start_container_fails_at("tasks.create").await;
}

#[tokio::test]
async fn start_container_task_start_fails_task_deleted() {
    start_container_fails_at("tasks.start").await;
}

/// RUNNING is on the container's record when StartContainer answers, not later: a remora
/// killed right after the answer, with the shim gone before it is back, must find a started
/// container on the record (it found CREATED when the exit monitor wrote it afterwards).
#[tokio::test(start_paused = true)]
async fn start_container_records_running_before_it_answers() {
    let (b, _pod, id) = bed_with_container().await;
    // Record writes wait at their hold point (for a call that never comes: the hold gives up
    // after 10 s of the paused clock, which moves only while every task waits). A write left
    // to a spawned task is still waiting when StartContainer answers; one StartContainer
    // awaits has been made.
    b.log
        .hold("containers.set_extension", Until::Called("never.called"));
    b.pods.start_container(&id).await.expect("started");
    let record = b.containerd.record(&id).expect("the container record");
    let recorded: crate::store::ContainerSnapshot = crate::store::decode_extension(
        &record.extensions[crate::store::persist::CONTAINER_EXTENSION],
    )
    .expect("the container extension");
    assert_eq!(recorded.status.state, ContainerState::Running);
    assert!(recorded.status.started_at > 0, "{:?}", recorded.status);
}

/// Waits (bounded) until removed container `id`'s cleanup behind RemoveContainer is done.
async fn until_cleaned_up(b: &Bed, id: &str) {
    for _ in 0..2000 {
        if !b.pods.is_being_removed(id) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("container {id}'s cleanup still in flight after 10 s");
}

#[tokio::test]
async fn remove_container_answers_then_cleans_up_in_order_and_drops_its_intent() {
    let (b, _pod, id) = bed_with_container().await;
    b.pods.remove_container(&id).await.expect("removed");
    // Gone from every CRI view at once; the name is free again.
    assert!(b.pods.containers_store.get(&id).is_err());
    let key = container_name_key("app", "web", "default", "uid-1", 0);
    assert!(
        b.pods.names.reserve(&key, "another").is_ok(),
        "name released"
    );
    until_cleaned_up(&b, &id).await;
    assert_eq!(
        b.log.calls(),
        [
            Call::TaskDelete(id.clone()),
            Call::RecordDelete(id.clone()),
            Call::SnapshotRemove(id.clone()),
        ]
    );
    assert!(!b.containerd.has_record(&id));
    assert!(!b.intent_file(&id).exists());
}

#[tokio::test]
async fn remove_container_record_delete_fails_the_cleanup_retries_until_done() {
    let (b, _pod, id) = bed_with_container().await;
    b.log.fail("containers.delete", 1);
    b.pods.remove_container(&id).await.expect("removed");
    assert!(b.pods.containers_store.get(&id).is_err(), "still indexed");
    // The intent keeps the removal durable until the cleanup is done.
    let intent = b.intent_file(&id);
    until_cleaned_up(&b, &id).await;
    let calls = b.log.calls();
    let deletes = calls
        .iter()
        .filter(|c| **c == Call::RecordDelete(id.clone()))
        .count();
    assert_eq!(deletes, 2, "failed once, then retried: {calls:?}");
    // Nothing after the failed step in that attempt: the snapshot went after the record.
    assert_eq!(
        calls
            .iter()
            .filter(|c| matches!(c, Call::SnapshotRemove(_)))
            .count(),
        1,
        "{calls:?}"
    );
    assert!(!b.containerd.has_record(&id));
    assert!(!intent.exists(), "intent dropped once done");
}

#[tokio::test]
async fn a_resync_does_not_bring_back_a_container_whose_cleanup_is_in_flight() {
    let (b, _pod, id) = bed_with_container().await;
    b.log.fail("containers.delete", 1);
    b.pods.remove_container(&id).await.expect("removed");
    // The first attempt failed (or is about to); the record is still in containerd.
    for _ in 0..2000 {
        if b.log.calls().contains(&Call::RecordDelete(id.clone())) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(b.containerd.has_record(&id));
    assert!(b.pods.is_being_removed(&id));
    b.pods.recover().await.expect("a resync");
    assert!(
        b.pods.containers_store.get(&id).is_err(),
        "a removed container came back"
    );
    until_cleaned_up(&b, &id).await;
    assert!(!b.containerd.has_record(&id));
}

#[tokio::test]
async fn a_removal_cut_short_by_a_crash_is_finished_by_the_start_up_sweep() {
    let (b, _pod, id) = bed_with_container().await;
    // The first attempts fail: the cleanup is still in flight (retrying after 1 s, then 2 s)
    // when "remora dies".
    b.log.fail("containers.delete", 1);
    b.log.fail("containers.delete", 2);
    b.pods.remove_container(&id).await.expect("removed");
    let intent = b.intent_file(&id);
    assert!(intent.exists(), "the intent is written before the answer");
    // A restarted remora finds the intent stale and undoes the container completely.
    let journal = super::journal::Journal::open(b.state_dir.join("pending"));
    assert!(journal.is_stale(&id));
    assert_eq!(
        journal.stale(),
        [super::journal::Intent::Container { id: id.clone() }]
    );
}

#[tokio::test]
async fn stop_container_kill_fails_the_error_is_returned() {
    let (b, _pod, id) = bed_with_container().await;
    b.pods.start_container(&id).await.expect("started");
    b.log.fail("tasks.kill", 1);
    let err = b
        .pods
        .stop_container(&id, Duration::from_secs(1))
        .await
        .expect_err("the scripted failure");
    assert!(matches!(err, ContainerError::Containerd(_)), "{err:?}");
    assert_eq!(
        b.pods.containers_store.get(&id).expect("indexed").state(),
        ContainerState::Running
    );
    // A retry stops it.
    b.pods
        .stop_container(&id, Duration::from_secs(1))
        .await
        .expect("stopped");
    assert_eq!(
        b.pods.containers_store.get(&id).expect("indexed").state(),
        ContainerState::Exited
    );
}

#[tokio::test]
async fn stop_sandbox_kill_fails_the_pod_stays_ready() {
    let (b, pod) = bed_with_pod().await;
    b.log.fail("tasks.kill", 1);
    let err = b
        .pods
        .stop_sandbox(&pod)
        .await
        .expect_err("the scripted failure");
    assert!(matches!(err, SandboxError::Containerd(_)), "{err:?}");
    assert_eq!(b.log.after_failure(), []);
    let sb = b.pods.sandboxes.get(&pod).expect("indexed").snapshot();
    assert_eq!(sb.status.state, SandboxState::Ready);
    // A retry stops it: task killed and deleted, CNI DEL, netns removed.
    let before = b.log.calls().len();
    b.pods.stop_sandbox(&pod).await.expect("stopped");
    let calls = b.log.calls()[before..].to_vec();
    let netns = b.state_dir.join("netns").join(&pod);
    assert!(
        calls.ends_with(&[
            Call::TaskDelete(pod.clone()),
            Call::CniDel(pod.clone()),
            Call::NetnsRemove(netns)
        ]),
        "{calls:?}"
    );
}

#[tokio::test]
async fn remove_sandbox_record_delete_fails_the_pod_stays() {
    let (b, pod) = bed_with_pod().await;
    b.log.fail("containers.delete", 1);
    let err = b
        .pods
        .remove_sandbox(&pod)
        .await
        .expect_err("the scripted failure");
    assert!(matches!(err, SandboxError::Containerd(_)), "{err:?}");
    assert_eq!(b.log.after_failure(), []);
    assert!(b.pods.sandboxes.get(&pod).is_ok(), "the pod left the index");
    assert!(b.containerd.has_record(&pod));
    // A retry removes it.
    b.pods.remove_sandbox(&pod).await.expect("removed");
    assert!(b.pods.sandboxes.get(&pod).is_err());
    assert!(!b.containerd.has_record(&pod));
    assert!(!b.state_dir.join("sandboxes").join(&pod).exists());
}

#[tokio::test]
async fn remove_sandbox_waits_for_its_containers_cleanups_before_its_own_objects() {
    let (b, pod, id) = bed_with_container().await;
    // The container's record delete fails once: its cleanup retries (after 1 s).
    b.log.fail("containers.delete", 1);
    b.pods.remove_sandbox(&pod).await.expect("removed");
    let calls = b.log.calls();
    let last_of = |call: Call| calls.iter().rposition(|c| *c == call);
    let container_record = last_of(Call::RecordDelete(id.clone())).expect("container record");
    let container_snapshot = last_of(Call::SnapshotRemove(id.clone())).expect("its snapshot");
    let pod_record = last_of(Call::RecordDelete(pod.clone())).expect("pod record");
    assert!(
        container_record < pod_record && container_snapshot < pod_record,
        "the pod's record went before its container's: {calls:?}"
    );
    assert!(!b.containerd.has_record(&id));
    assert!(!b.containerd.has_record(&pod));
    assert!(!b.pods.is_being_removed(&id));
}

#[tokio::test]
async fn the_sweep_finishes_a_rollback_that_failed() {
    let b = bed();
    b.log.fail("tasks.create", 1);
    b.log.fail("snapshots.remove", 1);
    let (_, id, _) = run_sandbox_failing(&b).await;
    assert!(b.pods.journal.is_stale(&id));
    let before = b.log.calls().len();
    let swept = b.pods.sweep_half_made().await;
    assert_eq!((swept.intents, swept.failed), (1, 0));
    let netns = b.state_dir.join("netns").join(&id);
    // Every step again (each idempotent): the snapshot the rollback could not remove goes.
    assert_eq!(
        b.log.calls()[before..],
        [
            Call::TaskState(id.clone()),
            Call::RecordDelete(id.clone()),
            Call::SnapshotRemove(id.clone()),
            Call::LeaseDelete(creation_lease_id(&id)),
            Call::CniOrphans(id.clone()),
            Call::CniDel(id.clone()),
            Call::NetnsRemove(netns),
        ]
    );
    assert!(!b.pods.journal.is_stale(&id));
    assert!(!b
        .state_dir
        .join("pending")
        .join(format!("{id}.json"))
        .exists());
}

#[tokio::test]
async fn the_sweep_runs_no_del_while_a_crashed_adds_plugins_may_run_and_keeps_the_intent() {
    let b = bed();
    b.log.fail("tasks.create", 1);
    b.log.fail("snapshots.remove", 1);
    let (_, id, _) = run_sandbox_failing(&b).await;
    // The plugins neither end nor go when killed: no DEL (it would race their ADD).
    b.log.fail("network.await_orphaned_plugins", 1);
    let before = b.log.calls().len();
    let swept = b.pods.sweep_half_made().await;
    assert_eq!((swept.intents, swept.failed), (0, 1));
    let calls = b.log.calls()[before..].to_vec();
    assert_eq!(
        calls.last(),
        Some(&Call::CniOrphans(id.clone())),
        "{calls:?}"
    );
    assert!(b.pods.journal.is_stale(&id), "kept for the next resync");
    // The next sweep finds them gone and finishes.
    let swept = b.pods.sweep_half_made().await;
    assert_eq!((swept.intents, swept.failed), (1, 0));
    assert!(b.log.calls().contains(&Call::CniDel(id.clone())));
    assert!(!b.pods.journal.is_stale(&id));
}

/// `runc` (Go shim, no options) and `remora` (remora's shim at a fixed path, running crun),
/// with `default` the default.
fn two_handlers(default: &str) -> RuntimeHandlers {
    let runc = HandlerRuntime {
        runtime: ShimRuntime {
            name: "io.containerd.runc.v2".into(),
            options: None,
        },
        runtime_path: String::new(),
        features: Default::default(),
        pass_through: Default::default(),
        pause_always: false,
    };
    RuntimeHandlers::new(
        default,
        std::collections::BTreeMap::from([
            ("runc".to_string(), runc),
            ("remora".to_string(), remora_handler()),
        ]),
    )
}

fn remora_handler() -> HandlerRuntime {
    HandlerRuntime {
        runtime: ShimRuntime {
            name: "io.containerd.remora.v2".into(),
            options: Some(RuncOptions {
                binary_name: "crun".into(),
                root: "/run/crun".into(),
                systemd_cgroup: false,
                ..Default::default()
            }),
        },
        runtime_path: "/opt/bin/containerd-shim-remora-v2".into(),
        features: Default::default(),
        pass_through: Default::default(),
        pause_always: false,
    }
}

#[tokio::test]
async fn a_pods_containers_run_with_the_pods_handler_not_the_default() {
    let b = bed_with_handlers(two_handlers("runc"));
    let mut req = pod_request();
    req.runtime_handler = "remora".into();
    let pod = b.pods.run_sandbox(req).await.expect("a pod");
    let want = remora_handler();
    let sandbox = b.pods.sandboxes.get(&pod).expect("indexed");
    assert_eq!(sandbox.metadata().runtime_handler, "remora");
    assert_eq!(
        b.containerd.record(&pod).expect("record").runtime,
        want.runtime
    );
    assert_eq!(
        b.containerd.task_runtime_path(&pod).as_deref(),
        Some(want.runtime_path.as_str())
    );

    let id = b
        .pods
        .create_container(create_request(&pod))
        .await
        .expect("a container");
    assert_eq!(
        b.containerd.record(&id).expect("record").runtime,
        want.runtime
    );
    b.pods.start_container(&id).await.expect("started");
    assert_eq!(
        b.containerd.task_runtime_path(&id).as_deref(),
        Some(want.runtime_path.as_str())
    );
}

#[tokio::test]
async fn the_empty_handler_is_recorded_as_the_default_by_name() {
    let b = bed_with_handlers(two_handlers("remora"));
    let pod = b.pods.run_sandbox(pod_request()).await.expect("a pod");
    let sandbox = b.pods.sandboxes.get(&pod).expect("indexed");
    assert_eq!(sandbox.metadata().runtime_handler, "remora");
    assert_eq!(
        b.containerd.record(&pod).expect("record").runtime,
        remora_handler().runtime
    );
}

#[tokio::test]
async fn an_unknown_handler_is_refused_by_name_before_anything_is_made() {
    let b = bed_with_handlers(two_handlers("runc"));
    let mut req = pod_request();
    req.runtime_handler = "kata".into();
    let err = b.pods.run_sandbox(req).await.expect_err("unknown handler");
    assert!(
        matches!(&err, SandboxError::UnknownRuntimeHandler(h) if h == "kata"),
        "{err:?}"
    );
    assert_eq!(b.log.calls(), []);
    assert!(b.pods.sandboxes.list(&Default::default()).is_empty());
}

/// Pods recorded before handlers existed (handler "") or with a handler since removed from
/// the config: the first run with the default handler; the second are refused, naming it.
#[tokio::test]
async fn recorded_handlers_resolve_on_container_create() {
    let b = bed_with_handlers(two_handlers("runc"));
    for (handler, want) in [("", Some("io.containerd.runc.v2")), ("gone", None)] {
        let pod = format!(
            "pod-{}",
            if handler.is_empty() {
                "legacy"
            } else {
                handler
            }
        );
        let metadata = SandboxMetadata {
            id: pod.clone(),
            name: pod.clone(),
            namespace: "default".into(),
            uid: format!("uid-{pod}"),
            runtime_handler: handler.into(),
            ..Default::default()
        };
        b.pods
            .sandboxes
            .add(Sandbox::new(metadata, SandboxStatus::ready(1)))
            .expect("indexed");
        let result = b.pods.create_container(create_request(&pod)).await;
        match want {
            Some(runtime) => {
                let id = result.expect("a container of the legacy pod");
                assert_eq!(
                    b.containerd.record(&id).expect("record").runtime.name,
                    runtime
                );
            }
            None => {
                let err = result.expect_err("the handler is gone");
                assert!(
                    matches!(&err, ContainerError::PodHandlerGone { pod: p, handler: h } if *p == pod && h == "gone"),
                    "{err:?}"
                );
            }
        }
    }
}

/// A recursive read-only mount is built only for a handler whose runtime supports it; on any
/// other it is refused before anything is made (kubelet checks the handler's features first).
#[tokio::test]
async fn recursive_read_only_mounts_only_on_handlers_that_support_them() {
    let mut handlers = two_handlers("runc");
    let mut remora = remora_handler();
    remora.features.recursive_read_only_mounts = true;
    handlers = RuntimeHandlers::new(
        handlers.default_name(),
        handlers
            .names()
            .map(|n| {
                let h = if n == "remora" {
                    remora.clone()
                } else {
                    handlers.resolve(n).expect("configured").1.clone()
                };
                (n.to_string(), h)
            })
            .collect(),
    );
    let b = bed_with_handlers(handlers);
    let data = tempfile::tempdir().expect("tempdir");
    let rro_request = |pod: &str| {
        let mut req = create_request(pod);
        req.config.mounts = vec![crate::spec::MountRequest {
            container_path: "/data".into(),
            host_path: data.path().to_path_buf(),
            readonly: true,
            recursive_read_only: true,
            ..Default::default()
        }];
        req
    };

    let plain = b.pods.run_sandbox(pod_request()).await.expect("a runc pod");
    b.log.clear();
    let err = b
        .pods
        .create_container(rro_request(&plain))
        .await
        .expect_err("runc's handler was not probed as supporting rro");
    assert!(
        matches!(&err, ContainerError::RecursiveReadOnlyUnsupported { handler, mount }
            if handler == "runc" && mount == "/data"),
        "{err:?}"
    );
    assert!(
        !b.log.calls().iter().any(|c| matches!(
            c,
            Call::LeaseCreate(_) | Call::SnapshotPrepare(..) | Call::RecordCreate(_)
        )),
        "nothing is made: {:?}",
        b.log.calls()
    );

    let mut req = pod_request();
    req.config.name = "rro-pod".into();
    req.runtime_handler = "remora".into();
    let pod = b.pods.run_sandbox(req).await.expect("a remora pod");
    let id = b
        .pods
        .create_container(rro_request(&pod))
        .await
        .expect("remora's handler supports rro");
    let spec: serde_json::Value =
        serde_json::from_slice(&b.containerd.record(&id).expect("record").spec).expect("json");
    let data_mount = spec["mounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .find(|m| m["destination"] == "/data")
        .expect("the /data mount");
    assert_eq!(
        data_mount["options"],
        serde_json::json!(["rbind", "rprivate", "ro", "rro"])
    );
}

fn image_volume_request(pod: &str, image: &str) -> CreateRequest {
    sub_path_request(pod, image, "")
}

/// A container with an image volume of `image` at `/image`, of `sub_path` in it.
fn sub_path_request(pod: &str, image: &str, sub_path: &str) -> CreateRequest {
    let mut req = create_request(pod);
    let volume = crate::spec::MountRequest {
        container_path: "/image".into(),
        readonly: true,
        image: Some(crate::spec::ImageVolume {
            image: image.into(),
            sub_path: sub_path.into(),
        }),
        ..Default::default()
    };
    req.config.mounts = vec![volume];
    req.metadata.mounts = vec![crate::store::MountSummary {
        container_path: "/image".into(),
        readonly: true,
        image: image.into(),
        image_sub_path: sub_path.into(),
        ..Default::default()
    }];
    req
}

/// An image volume whose image is not pulled: NOT_FOUND naming it, and the rootfs snapshot
/// and creation lease already made are undone.
#[tokio::test]
async fn an_image_volume_of_an_image_not_pulled_is_refused_and_undone() {
    let (b, pod) = bed_with_pod().await;
    let err = b
        .pods
        .create_container(image_volume_request(&pod, "docker.io/library/absent:1"))
        .await
        .expect_err("not pulled");
    assert!(
        matches!(&err, ContainerError::ImageVolumeNotFound { mount, image }
            if mount == "/image" && image == "docker.io/library/absent:1"),
        "{err:?}"
    );
    let id = first_id(&b.log);
    let calls = b.log.calls();
    assert_eq!(
        calls[calls.len().saturating_sub(2)..],
        [
            Call::SnapshotRemove(id.clone()),
            Call::LeaseDelete(creation_lease_id(&id))
        ],
        "{calls:?}"
    );
    assert!(!calls.iter().any(|c| matches!(c, Call::SnapshotView(..))));
}

/// An image volume is a view of the image mounted on the host under the state dir; the
/// record references the view (GC); a failed create unmounts and removes it, and
/// RemoveContainer does too.
#[tokio::test]
async fn image_volumes_are_mounted_views_kept_by_the_record_and_removed_with_it() {
    let (b, pod) = bed_with_pod().await;
    let id = b
        .pods
        .create_container(image_volume_request(&pod, APP))
        .await
        .expect("a container with an image volume");
    let view = format!("{id}-imagevolume-0");
    assert!(b.log.calls().contains(&Call::SnapshotView(
        creation_lease_id(&id),
        view.clone(),
        "sha256:app-chain".to_string(),
        vec![],
    )));
    let record = b.containerd.record(&id).expect("record");
    assert_eq!(
        record
            .labels
            .get("containerd.io/gc.ref.snapshot.overlayfs/0")
            .map(String::as_str),
        Some(view.as_str()),
        "{:?}",
        record.labels
    );
    let mounted = b.state_dir.join("image-volumes").join(&id).join("0");
    let bind = recorded_mount(&record, "/image");
    assert_eq!(bind["source"], mounted.display().to_string());
    assert_eq!(
        bind["options"],
        serde_json::json!(["rbind", "rprivate", "ro"])
    );
    assert!(
        crate::lifecycle::sandbox_files::is_mount_point(&mounted),
        "the view is mounted on the host"
    );
    let status = b
        .pods
        .containers_store
        .get(&id)
        .expect("indexed")
        .snapshot();
    assert!(!status.metadata.mounts[0].image_ref.is_empty());

    b.log.clear();
    b.pods.remove_container(&id).await.expect("removed");
    until_cleaned_up(&b, &id).await;
    assert!(b.log.calls().contains(&Call::SnapshotRemove(view)));
    assert!(!mounted.exists(), "unmounted and removed");
    assert!(!b.state_dir.join("image-volumes").join(&id).exists());
}

#[tokio::test]
async fn a_create_failing_after_its_image_volume_unmounts_and_removes_the_view() {
    let (b, pod) = bed_with_pod().await;
    b.log.fail("containers.create", 1);
    b.pods
        .create_container(image_volume_request(&pod, APP))
        .await
        .expect_err("the scripted failure");
    let id = first_id(&b.log);
    assert_eq!(
        b.log.after_failure(),
        [
            Call::SnapshotRemove(format!("{id}-imagevolume-0")),
            Call::SnapshotRemove(id.clone()),
            Call::LeaseDelete(creation_lease_id(&id))
        ]
    );
    assert!(!b
        .state_dir
        .join("image-volumes")
        .join(&id)
        .join("0")
        .exists());
}

/// The fake image's files (every snapshot binds the same tree): `etc/ssl`, a file, a symlink
/// out of the image.
fn image_files(b: &Bed) -> PathBuf {
    let root = b.state_dir.parent().expect("the bed's dir").join("rootfs");
    std::fs::create_dir_all(root.join("etc/ssl")).expect("etc/ssl");
    std::fs::write(root.join("etc/hostname"), "image\n").expect("a file");
    let _ = std::os::unix::fs::symlink("/usr/lib", root.join("lib"));
    root
}

/// An image volume's sub path: bound read-only on `<index>-sub` beside the view, which the
/// spec binds into the container; the record keeps the image id and the sub path; removal
/// unmounts both.
#[tokio::test]
async fn an_image_volume_sub_path_is_bound_beside_the_view_and_removed_with_it() {
    let (b, pod) = bed_with_pod().await;
    let root = image_files(&b);
    let id = b
        .pods
        .create_container(sub_path_request(&pod, APP, "/../etc/"))
        .await
        .expect("a container with an image volume sub path");
    let dir = b.state_dir.join("image-volumes").join(&id);
    let sub = dir.join("0-sub");
    let record = b.containerd.record(&id).expect("record");
    let bind = recorded_mount(&record, "/image");
    assert_eq!(bind["source"], sub.display().to_string());
    assert!(crate::lifecycle::sandbox_files::is_mount_point(&sub));
    assert_eq!(
        std::fs::read_to_string(sub.join("hostname")).expect("the image's etc"),
        "image\n"
    );
    assert!(std::fs::write(sub.join("x"), "").is_err(), "read-only");
    assert!(!root.join("etc/x").exists());
    let status = b
        .pods
        .containers_store
        .get(&id)
        .expect("indexed")
        .snapshot();
    let m = &status.metadata.mounts[0];
    assert_eq!(
        (m.image_id.as_str(), m.image_sub_path.as_str()),
        ("sha256:app", "/../etc/")
    );

    b.pods.remove_container(&id).await.expect("removed");
    until_cleaned_up(&b, &id).await;
    assert!(!sub.exists() && !dir.exists(), "unmounted and removed");
}

/// A sub path that is missing, a file, or leads out of the image (`lib` → `/usr/lib`, which
/// the host has and the image does not): INVALID_ARGUMENT's error naming the field and why,
/// and everything CreateContainer made is undone — the view unmounted and removed, the rootfs
/// snapshot and the lease gone.
#[tokio::test]
async fn a_hostile_image_volume_sub_path_is_refused_and_undone() {
    let (b, pod) = bed_with_pod().await;
    image_files(&b);
    for (sub_path, why) in [
        ("absent", "does not exist"),
        ("lib", "does not exist"),
        ("../../../../usr/lib", "does not exist"),
        ("etc/hostname", "is not a directory"),
    ] {
        b.log.clear();
        let err = b
            .pods
            .create_container(sub_path_request(&pod, APP, sub_path))
            .await
            .expect_err(sub_path);
        let ContainerError::ImageSubPath { field, source, .. } = &err else {
            panic!("{sub_path:?}: {err:?}");
        };
        assert_eq!(field, "config.mounts[0].image_sub_path");
        assert!(source.to_string().contains(why), "{sub_path:?}: {err}");
        assert!(source.is_invalid(), "{err}");
        let id = first_id(&b.log);
        let calls = b.log.calls();
        assert_eq!(
            calls[calls.len().saturating_sub(3)..],
            [
                Call::SnapshotRemove(format!("{id}-imagevolume-0")),
                Call::SnapshotRemove(id.clone()),
                Call::LeaseDelete(creation_lease_id(&id))
            ],
            "{sub_path:?}: {calls:?}"
        );
        let dir = b.state_dir.join("image-volumes").join(&id);
        assert!(!dir.exists(), "{sub_path:?}: {} is left", dir.display());
        let table = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
        assert!(!table.contains(&id), "{sub_path:?}: a mount is left");
    }
}

/// Waits (bounded) until container `id` is no longer RUNNING in the index. The fakes' FIFOs
/// never reach EOF, so an exit waits out the output copiers' drain (2 s each) first.
async fn until_not_running(b: &Bed, id: &str) -> ContainerState {
    for _ in 0..3000 {
        let state = b.pods.containers_store.get(id).expect("indexed").state();
        if state != ContainerState::Running {
            return state;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("container {id} still RUNNING after 15 s");
}

#[tokio::test]
async fn a_running_container_whose_shim_died_is_killed_and_exits_137() {
    let (b, _pod, id) = bed_with_container().await;
    b.pods.start_container(&id).await.expect("started");
    b.log.clear();
    b.containerd.kill_shim(&id);
    assert_eq!(until_not_running(&b, &id).await, ContainerState::Exited);
    let s = b
        .pods
        .containers_store
        .get(&id)
        .expect("indexed")
        .snapshot();
    assert_eq!(s.status.exit_code, 137, "{s:?}");
    let calls = b.log.calls();
    let forced = calls
        .iter()
        .position(|c| matches!(c, Call::OciForceDelete(c_id, _) if c_id == &id))
        .expect("the runtime force-deleted it");
    let deleted = calls
        .iter()
        .position(|c| c == &Call::TaskDelete(id.clone()))
        .expect("the task deleted");
    assert!(
        forced < deleted,
        "killed before containerd forgets the task: {calls:?}"
    );
    assert!(!b.containerd.has_task(&id), "task left");
    // Stop and Remove then find nothing to do.
    b.pods
        .stop_container(&id, Duration::from_secs(1))
        .await
        .expect("stopped");
    b.pods.remove_container(&id).await.expect("removed");
    until_cleaned_up(&b, &id).await;
    assert!(!b.containerd.has_record(&id));
}

#[tokio::test]
async fn a_container_that_had_exited_when_its_shim_died_is_unknown() {
    let (b, _pod, id) = bed_with_container().await;
    b.pods.start_container(&id).await.expect("started");
    b.oci.answer(super::backend::ForceDeleted::WasStopped);
    b.containerd.kill_shim(&id);
    assert_eq!(until_not_running(&b, &id).await, ContainerState::Unknown);
    assert!(!b.containerd.has_task(&id), "task left");
}

#[tokio::test]
async fn an_unsandboxed_container_whose_shim_died_is_left_to_containerds_cleanup() {
    let (b, _pod, id) = bed_with_container().await;
    b.pods.start_container(&id).await.expect("started");
    // A record made before remora put containers in their pod's shim.
    b.containerd.set_record_sandbox(&id, "");
    b.log.clear();
    b.containerd.kill_shim(&id);
    // The monitor reads the record, sees no sandbox, and waits on.
    for _ in 0..400 {
        if b.log.calls().contains(&Call::RecordGet(id.clone())) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(b.log.calls().contains(&Call::RecordGet(id.clone())));
    assert_eq!(
        b.pods.containers_store.get(&id).expect("indexed").state(),
        ContainerState::Running
    );
    b.containerd.clean_up_dead_shim(&id);
    assert_eq!(until_not_running(&b, &id).await, ContainerState::Unknown);
    assert!(
        !b.log
            .calls()
            .iter()
            .any(|c| matches!(c, Call::OciForceDelete(..))),
        "containerd's cleanup is not doubled: {:?}",
        b.log.calls()
    );
}

#[tokio::test]
async fn a_closed_wait_on_a_task_that_reads_as_there_kills_nothing() {
    let (b, _pod, id) = bed_with_container().await;
    b.pods.start_container(&id).await.expect("started");
    b.log.clear();
    b.containerd.break_wait(&id);
    // The monitor asks for the task's state, finds it, and waits on.
    for _ in 0..400 {
        let states = b
            .log
            .calls()
            .iter()
            .filter(|c| **c == Call::TaskState(id.clone()))
            .count();
        if states >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        !b.log
            .calls()
            .iter()
            .any(|c| matches!(c, Call::OciForceDelete(..) | Call::TaskDelete(_))),
        "nothing killed or deleted: {:?}",
        b.log.calls()
    );
    assert_eq!(
        b.pods.containers_store.get(&id).expect("indexed").state(),
        ContainerState::Running
    );
    // Its real exit is still recorded once the wait works again.
    b.containerd.mend_wait(&id);
    b.pods
        .stop_container(&id, Duration::from_secs(1))
        .await
        .expect("stopped");
    let s = b
        .pods
        .containers_store
        .get(&id)
        .expect("indexed")
        .snapshot();
    assert_eq!(s.status.exit_code, 128 + libc::SIGTERM, "{s:?}");
}

/// A container of `image` created with the stop signal the adapter `configured` ("" for
/// none), started and stopped: the stop signal its record keeps, and the signals it was sent.
async fn stop_signal_of(image: &str, configured: &str) -> (String, Vec<u32>) {
    let (b, pod) = bed_with_pod().await;
    let mut req = create_request(&pod);
    req.image = image.into();
    req.metadata.stop_signal = configured.into();
    let id = b.pods.create_container(req).await.expect("a container");
    b.pods.start_container(&id).await.expect("started");
    let kept = b.pods.containers_store.get(&id).expect("indexed");
    (kept.metadata().stop_signal.clone(), stopped(&b, &id).await)
}

/// Stops container `id` (started), long enough for the fake's exit to be recorded without
/// SIGKILL (its output copiers wait 2 s for an EOF that never comes): the signals sent.
async fn stopped(b: &Bed, id: &str) -> Vec<u32> {
    b.log.clear();
    b.pods
        .stop_container(id, Duration::from_secs(10))
        .await
        .expect("stopped");
    b.log
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::TaskKill(_, signal, _) => Some(signal),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_configured_stop_signal_wins_over_the_images() {
    assert_eq!(
        stop_signal_of(QUITS, "SIGQUIT").await,
        ("SIGQUIT".to_string(), vec![libc::SIGQUIT as u32])
    );
    assert_eq!(
        stop_signal_of(APP, "SIGRTMAX-1").await,
        ("SIGRTMAX-1".to_string(), vec![63])
    );
}

#[tokio::test]
async fn the_images_stop_signal_is_resolved_and_kept_at_creation() {
    // Kept by name, so a removed image cannot change it.
    assert_eq!(
        stop_signal_of(QUITS, "").await,
        ("SIGRTMIN+3".to_string(), vec![37])
    );
    assert_eq!(
        stop_signal_of(APP, "").await,
        ("SIGTERM".to_string(), vec![libc::SIGTERM as u32])
    );
    // No signal: SIGTERM, as moby does.
    assert_eq!(
        stop_signal_of(BOGUS, "").await,
        ("SIGTERM".to_string(), vec![libc::SIGTERM as u32])
    );
}

#[tokio::test]
async fn a_record_from_before_stop_signals_is_stopped_with_its_images() {
    let (b, pod) = bed_with_pod().await;
    let mut req = create_request(&pod);
    req.image = QUITS.into();
    let id = b.pods.create_container(req).await.expect("a container");
    // As recovery indexes a record that has no stop signal.
    let old = b.pods.containers_store.delete(&id).expect("indexed");
    let mut metadata = (**old.metadata()).clone();
    metadata.stop_signal.clear();
    let status = crate::store::ContainerStatus {
        removing: false,
        ..old.status()
    };
    b.pods
        .containers_store
        .add(crate::store::Container::new(metadata, status))
        .expect("indexed again");
    b.pods.start_container(&id).await.expect("started");
    assert_eq!(stopped(&b, &id).await, [37]);
}

#[tokio::test]
async fn stopping_a_container_whose_shim_died_waits_for_the_reaping() {
    let (b, _pod, id) = bed_with_container().await;
    b.pods.start_container(&id).await.expect("started");
    b.containerd.kill_shim(&id);
    b.pods
        .stop_container(&id, Duration::from_secs(1))
        .await
        .expect("stopped");
    assert_eq!(
        b.pods.containers_store.get(&id).expect("indexed").state(),
        ContainerState::Exited
    );
}
fn userns() -> crate::spec::UserNamespace {
    let map = |host_id| crate::spec::IdMapping {
        container_id: 0,
        host_id,
        length: 65536,
    };
    crate::spec::UserNamespace {
        uids: map(100_000),
        gids: map(200_000),
    }
}

fn userns_pod_request() -> RunSandbox {
    let mut req = pod_request();
    req.config.security.namespaces.user = Some(userns());
    req
}

/// `runc` (the default) claiming user namespaces.
fn userns_handlers() -> RuntimeHandlers {
    let mut runc = two_handlers("runc")
        .resolve("runc")
        .expect("runc")
        .1
        .clone();
    runc.features.user_namespaces = true;
    RuntimeHandlers::new(
        "runc",
        std::collections::BTreeMap::from([
            ("runc".to_string(), runc),
            ("remora".to_string(), remora_handler()),
        ]),
    )
}

fn idmap_labels() -> Vec<(String, String)> {
    vec![
        (
            crate::lifecycle::userns::LABEL_GID_MAPPING.to_string(),
            "0:200000:65536".to_string(),
        ),
        (
            crate::lifecycle::userns::LABEL_UID_MAPPING.to_string(),
            "0:100000:65536".to_string(),
        ),
    ]
}

#[tokio::test]
async fn a_user_namespace_pod_on_a_handler_without_them_is_refused_before_anything_is_made() {
    let b = bed_with_handlers(userns_handlers());
    let mut req = userns_pod_request();
    req.runtime_handler = "remora".into();
    let err = b
        .pods
        .run_sandbox(req)
        .await
        .expect_err("remora claims none");
    assert!(
        matches!(&err, SandboxError::UserNamespacesUnsupported(h) if h == "remora"),
        "{err:?}"
    );
    assert!(b.log.calls().is_empty(), "{:?}", b.log.calls());
}

#[tokio::test]
async fn a_user_namespace_pod_gets_an_owned_netns_idmapped_rootfs_and_the_maps_in_its_spec() {
    let b = bed_with_handlers(userns_handlers());
    let id = b
        .pods
        .run_sandbox(userns_pod_request())
        .await
        .expect("a pod");
    let lease = creation_lease_id(&id);
    let calls = b.log.calls();
    assert_eq!(calls[0], Call::NetnsCreate(id.clone(), Some(userns())));
    assert_eq!(
        calls[3],
        Call::SnapshotPrepare(
            lease,
            id.clone(),
            "sha256:pause-chain".into(),
            idmap_labels()
        )
    );
    let record = b.containerd.record(&id).expect("the pause record");
    let spec: serde_json::Value = serde_json::from_slice(&record.spec).unwrap();
    let netns = b.state_dir.join("netns").join(&id);
    let user_ns = spec["linux"]["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["type"] == "user")
        .cloned()
        .expect("a user namespace");
    assert_eq!(user_ns["path"], format!("{}.userns", netns.display()));
    assert_eq!(
        spec["linux"]["uidMappings"],
        serde_json::json!([{"containerID": 0, "hostID": 100000, "size": 65536}])
    );
    assert_eq!(
        spec["linux"]["gidMappings"],
        serde_json::json!([{"containerID": 0, "hostID": 200000, "size": 65536}])
    );
    // Persisted: a container created after a restart still finds the pod's maps.
    let sb = b.pods.sandboxes.get(&id).unwrap().snapshot();
    assert_eq!(sb.metadata.namespace_options.user, Some(userns()));

    // A container asking for another user namespace (here: the host's) is refused.
    let mut req = create_request(&id);
    req.config.security.namespaces.user = None;
    b.log.clear();
    let err = b.pods.create_container(req).await.expect_err("a mismatch");
    assert!(
        matches!(err, ContainerError::UserNamespaceMismatch { .. }),
        "{err:?}"
    );
    assert!(b.log.calls().is_empty(), "{:?}", b.log.calls());
}

/// An image volume with its pod's maps (kubelet sends them on every mount of a
/// `hostUsers: false` pod): its view is made with the pod's idmap labels and mounted on the
/// host idmapped (the snapshotter's `uidmap=`/`gidmap=`); the container binds it without maps
/// (the OCI runtime cannot idmap an overlay, and the view already is).
#[tokio::test]
async fn an_image_volume_with_the_pods_maps_is_an_idmapped_view_bound_without_maps() {
    let (b, pod) = with_pod(bed_with_handlers(userns_handlers()), userns_pod_request()).await;
    let mut req = image_volume_request(&pod, APP);
    req.config.security.namespaces.user = Some(userns());
    req.config.mounts[0].uid_mappings = vec![userns().uids];
    req.config.mounts[0].gid_mappings = vec![userns().gids];
    let id = b.pods.create_container(req).await.expect("created");
    let view = format!("{id}-imagevolume-0");
    assert!(
        b.log.calls().contains(&Call::SnapshotView(
            creation_lease_id(&id),
            view.clone(),
            "sha256:app-chain".to_string(),
            idmap_labels(),
        )),
        "{:?}",
        b.log.calls()
    );
    let record = b.containerd.record(&id).expect("record");
    let bind = recorded_mount(&record, "/image");
    assert!(
        bind.get("uidMappings").is_none() && bind.get("gidMappings").is_none(),
        "{bind}"
    );
    let mounted = b.state_dir.join("image-volumes").join(&id).join("0");
    assert!(crate::lifecycle::sandbox_files::is_mount_point(&mounted));
    if nix::unistd::geteuid().is_root() {
        // The fake's view is a bind of a root-owned tree: through the idmap its root is the
        // pod's host root.
        use std::os::unix::fs::MetadataExt;
        let md = std::fs::metadata(&mounted).expect("the view");
        assert_eq!((md.uid(), md.gid()), (100_000, 200_000));
    }
    b.pods.remove_container(&id).await.expect("removed");
    until_cleaned_up(&b, &id).await;
    assert!(!mounted.exists());
}

#[tokio::test]
async fn a_snapshotter_that_cannot_idmap_fails_the_pod_and_everything_is_undone() {
    let b = bed_with_handlers(userns_handlers());
    b.containerd.without_idmaps();
    let err = b
        .pods
        .run_sandbox(userns_pod_request())
        .await
        .expect_err("no idmapped rootfs");
    assert!(
        matches!(&err, SandboxError::SnapshotterCannotIdmap(_)),
        "{err:?}"
    );
    let id = first_id(&b.log);
    let netns = b.state_dir.join("netns").join(&id);
    // Refused right after the prepare: its undo and the earlier steps', newest first.
    let calls = b.log.calls();
    let after = calls
        .iter()
        .position(|c| matches!(c, Call::SnapshotPrepare(..)))
        .expect("prepared");
    assert_eq!(
        calls[after + 1..],
        [
            Call::SnapshotRemove(id.clone()),
            Call::LeaseDelete(creation_lease_id(&id)),
            Call::CniDel(id.clone()),
            Call::NetnsRemove(netns),
        ]
    );
    assert!(b.pods.sandboxes.get(&id).is_err());
    assert!(!b.containerd.has_record(&id));
}

/// A bed whose node runs the systemd cgroup driver.
fn systemd_bed() -> Bed {
    bed_with(
        RuntimeHandlers::single_runc("io.containerd.runc.v2"),
        HostFacts {
            cgroup_driver: CgroupDriver::Systemd,
            ..HostFacts::default()
        },
        |_| FakeLoader::new(Ok(()), None),
    )
    .0
}

/// `linux.cgroupsPath` of the spec on record `id`.
fn recorded_cgroups_path(b: &Bed, id: &str) -> Option<String> {
    let record = b.containerd.record(id).expect("a record");
    let spec: oci_spec::runtime::Spec = serde_json::from_slice(&record.spec).expect("a spec");
    spec.linux()
        .as_ref()
        .and_then(|l| l.cgroups_path().as_ref())
        .map(|p| p.display().to_string())
}

#[tokio::test]
async fn under_systemd_a_pod_and_its_containers_get_scopes_in_the_pods_slice() {
    let b = systemd_bed();
    let mut req = pod_request();
    req.config.cgroup_parent = "kubepods-besteffort-pod1_2.slice".into();
    let pod = b.pods.run_sandbox(req).await.expect("a pod");
    assert_eq!(
        recorded_cgroups_path(&b, &pod),
        Some(format!("kubepods-besteffort-pod1_2.slice:remora:{pod}"))
    );
    let c = b
        .pods
        .create_container(create_request(&pod))
        .await
        .expect("a container");
    assert_eq!(
        recorded_cgroups_path(&b, &c),
        Some(format!("kubepods-besteffort-pod1_2.slice:remora:{c}"))
    );
}

#[tokio::test]
async fn under_systemd_a_path_for_cgroup_parent_is_refused_before_anything_is_made() {
    let b = systemd_bed();
    let mut req = pod_request();
    req.config.cgroup_parent = "/kubepods/besteffort/pod1".into();
    let err = b.pods.run_sandbox(req).await.expect_err("not a slice name");
    assert!(
        matches!(&err, SandboxError::Spec(SpecError::InvalidCgroupParent { parent, .. })
            if parent == "/kubepods/besteffort/pod1"),
        "{err:?}"
    );
    assert!(err.to_string().contains("cgroup_parent"), "{err}");
    assert_eq!(b.log.calls(), []);
    assert!(b.pods.sandboxes.list(&Default::default()).is_empty());
}

// ---- AppArmor: the profile a container will run under is loaded before anything is made --

fn parser_refuses() -> LoadError {
    LoadError::Rejected {
        status: "exit status: 1".into(),
        output: "apparmor_parser: Unable to replace \"remora-default\".  Permission denied".into(),
    }
}

fn named(pod: &str, name: &str) -> CreateRequest {
    let mut req = create_request(pod);
    req.metadata.name = name.into();
    req
}

/// The mount at `destination` in the OCI spec on a containerd record.
fn recorded_mount(
    record: &crate::lifecycle::backend::ContainerRecord,
    destination: &str,
) -> serde_json::Value {
    let spec: serde_json::Value = serde_json::from_slice(&record.spec).expect("json");
    spec["mounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .find(|m| m["destination"] == destination)
        .unwrap_or_else(|| panic!("the {destination} mount"))
        .clone()
}

fn spec_apparmor(b: &Bed, id: &str) -> Option<String> {
    let record = b.containerd.record(id).expect("the record");
    let spec: oci_spec::runtime::Spec = serde_json::from_slice(&record.spec).expect("a spec");
    spec.process()
        .as_ref()
        .and_then(|p| p.apparmor_profile().clone())
}

#[tokio::test]
async fn create_container_loads_a_missing_default_apparmor_profile_once() {
    let (b, loader) = bed_with_apparmor(Some("docker-default (enforce)\n"), Ok(()));
    let (b, pod) = with_pod(b, pod_request()).await;
    let first = b.pods.create_container(named(&pod, "a")).await.unwrap();
    let second = b.pods.create_container(named(&pod, "b")).await.unwrap();
    assert_eq!(loader.loads().len(), 1, "{:?}", loader.loads());
    for id in [first, second] {
        assert_eq!(spec_apparmor(&b, &id).as_deref(), Some("remora-default"));
    }
}

#[tokio::test]
async fn create_container_with_a_loaded_default_apparmor_profile_loads_nothing() {
    let (b, loader) = bed_with_apparmor(Some("remora-default (enforce)\n"), Err(parser_refuses()));
    let (b, pod) = with_pod(b, pod_request()).await;
    b.pods.create_container(create_request(&pod)).await.unwrap();
    assert!(loader.loads().is_empty());
}

/// The parser's failure, not runc's: FAILED_PRECONDITION (see `cri::error`) naming the
/// profile and what the parser said, before any name, lease or snapshot is made.
#[tokio::test]
async fn create_container_fails_cleanly_when_the_default_apparmor_profile_cannot_load() {
    let (b, loader) = bed_with_apparmor(Some(""), Err(parser_refuses()));
    let (b, pod) = with_pod(b, pod_request()).await;
    let err = b
        .pods
        .create_container(create_request(&pod))
        .await
        .expect_err("no default profile");
    assert!(
        matches!(
            &err,
            ContainerError::AppArmor(AppArmorError::DefaultUnavailable { source, .. })
                if *source == parser_refuses()
        ),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(text.contains("\"remora-default\""), "{text}");
    assert!(text.contains("Permission denied"), "{text}");
    assert_eq!(b.log.calls(), []);
    assert_eq!(
        b.pods
            .names
            .holder(&container_name_key("app", "web", "default", "uid-1", 0)),
        None
    );
    assert_eq!(loader.loads().len(), 1);
}

#[tokio::test]
async fn create_container_with_a_localhost_apparmor_profile_not_loaded_fails() {
    let (b, loader) = bed_with_apparmor(
        Some("remora-default (enforce)\nk8s-deny-write (enforce)\n"),
        Ok(()),
    );
    let (b, pod) = with_pod(b, pod_request()).await;
    let mut req = create_request(&pod);
    req.config.security.apparmor = Some(AppArmorProfile::Localhost("non-existent-profile".into()));
    let err = b.pods.create_container(req).await.expect_err("not loaded");
    assert!(
        matches!(&err, ContainerError::AppArmor(AppArmorError::NotLoaded { name }) if name == "non-existent-profile"),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "apparmor profile \"non-existent-profile\" is not loaded"
    );
    assert_eq!(b.log.calls(), []);

    let mut req = create_request(&pod);
    req.config.security.apparmor = Some(AppArmorProfile::Localhost("k8s-deny-write".into()));
    let id = b.pods.create_container(req).await.unwrap();
    assert_eq!(spec_apparmor(&b, &id).as_deref(), Some("k8s-deny-write"));
    // remora loads only its own profile.
    assert!(loader.loads().is_empty());
}

#[tokio::test]
async fn run_sandbox_with_a_localhost_apparmor_profile_not_loaded_fails() {
    let (b, _loader) = bed_with_apparmor(Some("remora-default (enforce)\n"), Ok(()));
    let mut req = pod_request();
    req.config.security.apparmor = Some(AppArmorProfile::Localhost("missing".into()));
    let err = b.pods.run_sandbox(req).await.expect_err("not loaded");
    assert!(
        matches!(&err, SandboxError::AppArmor(AppArmorError::NotLoaded { name }) if name == "missing"),
        "{err:?}"
    );
    assert_eq!(b.log.calls(), []);
}

/// Unconfined and privileged containers name no profile: nothing is checked or loaded, even
/// on a host whose profiles list cannot be read and whose parser fails.
#[tokio::test]
async fn unconfined_and_privileged_containers_need_no_apparmor_profile() {
    let (b, loader) = bed_with_apparmor(None, Err(parser_refuses()));
    let mut pod_req = pod_request();
    pod_req.config.security.privileged = true;
    let (b, pod) = with_pod(b, pod_req.clone()).await;
    let mut unconfined = named(&pod, "unconfined");
    unconfined.config.security.apparmor = Some(AppArmorProfile::Unconfined);
    let id = b.pods.create_container(unconfined).await.unwrap();
    assert_eq!(spec_apparmor(&b, &id), None);
    let mut privileged = named(&pod, "privileged");
    privileged.config.security.privileged = true;
    privileged.sandbox_config = Some(pod_req.config);
    let id = b.pods.create_container(privileged).await.unwrap();
    assert_eq!(spec_apparmor(&b, &id), None);
    assert!(loader.loads().is_empty());
}

/// A CDI spec in the bed's spec directory: `vendor.example/dev=null` → /dev/null.
fn write_cdi_spec(b: &Bed) {
    let dir = b._dir.path().join("cdi");
    std::fs::create_dir_all(&dir).expect("the cdi dir");
    std::fs::write(
        dir.join("dev.json"),
        r#"{"cdiVersion":"0.6.0","kind":"vendor.example/dev","devices":[{"name":"null",
            "containerEdits":{"env":["CDI_TEST=1"],
            "deviceNodes":[{"path":"/dev/cdi-null","hostPath":"/dev/null"}]}}]}"#,
    )
    .expect("the cdi spec");
}

#[tokio::test]
async fn create_container_with_an_unknown_cdi_device_makes_nothing() {
    let (b, pod) = bed_with_pod().await;
    write_cdi_spec(&b);
    let mut req = create_request(&pod);
    req.config.cdi_devices = vec![crate::cdi::DeviceRequest {
        name: "vendor.example/dev=nope".into(),
        field: "config.cdi_devices[0].name".into(),
    }];
    let err = b.pods.create_container(req).await.expect_err("unknown");
    assert!(
        matches!(
            err,
            ContainerError::Cdi(crate::cdi::CdiError::Unresolvable { .. })
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("vendor.example/dev=nope"));
    assert_eq!(b.log.calls(), []);
    assert_eq!(
        b.pods
            .names
            .holder(&container_name_key("app", "web", "default", "uid-1", 0)),
        None
    );
}

#[tokio::test]
async fn create_container_applies_cdi_edits_to_the_recorded_spec() {
    let (b, pod) = bed_with_pod().await;
    write_cdi_spec(&b);
    let mut req = create_request(&pod);
    req.config.command = vec!["/bin/true".into()];
    req.config.cdi_devices = vec![crate::cdi::DeviceRequest {
        name: "vendor.example/dev=null".into(),
        field: "config.cdi_devices[0].name".into(),
    }];
    let id = b.pods.create_container(req).await.expect("a container");
    // Kept with the container, for verbose ContainerStatus.
    let kept = b
        .pods
        .containers_store()
        .get(&id)
        .expect("stored")
        .snapshot();
    assert_eq!(kept.metadata.cdi_devices, ["vendor.example/dev=null"]);
    let record = b.containerd.record(&id).expect("record");
    let spec: oci_spec::runtime::Spec = serde_json::from_slice(&record.spec).expect("spec");
    let env = spec.process().as_ref().unwrap().env().clone().unwrap();
    assert!(env.contains(&"CDI_TEST=1".to_string()), "{env:?}");
    let linux = spec.linux().as_ref().unwrap();
    let dev = linux
        .devices()
        .iter()
        .flatten()
        .find(|d| d.path() == Path::new("/dev/cdi-null"))
        .expect("the CDI device node");
    assert_eq!((dev.major(), dev.minor()), (1, 3));
    let rules = linux
        .resources()
        .as_ref()
        .unwrap()
        .devices()
        .clone()
        .unwrap();
    assert!(rules
        .iter()
        .any(|r| r.allow() && r.major() == Some(1) && r.minor() == Some(3)));
}

// UpdatePodSandboxResources: recorded on the pause record, then in the index.

fn pod_resources(cpu_shares: i64) -> crate::spec::Resources {
    crate::spec::Resources {
        cpu_shares,
        cpu_period: 100_000,
        memory_limit_in_bytes: 128 << 20,
        unified: [("memory.high".to_string(), "max".to_string())].into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn update_sandbox_resources_records_them_on_the_record_and_in_the_index() {
    let b = bed();
    let id = b.pods.run_sandbox(pod_request()).await.expect("a pod");
    let overhead = pod_resources(10);
    let resources = pod_resources(512);
    b.pods
        .update_sandbox_resources(&id, Some(&overhead), Some(&resources))
        .await
        .expect("updated");
    let calls = b.log.calls();
    assert_eq!(
        calls.last(),
        Some(&Call::RecordSetExtension(
            id.clone(),
            SANDBOX_EXTENSION.to_string()
        )),
        "the pause record rewritten, nothing else touched: {calls:?}"
    );
    let indexed = b.pods.sandboxes.get(&id).expect("indexed").metadata();
    let recorded = recorded_metadata(&b, &id);
    assert_eq!(
        recorded, *indexed,
        "the record holds what the index reports"
    );
    let got = indexed
        .updated_resources
        .clone()
        .expect("resources recorded");
    assert_eq!(got.overhead.expect("overhead").cpu_shares, 10);
    let r = got.resources.expect("resources");
    assert_eq!((r.cpu_shares, r.cpu_period), (512, 100_000));
    assert_eq!(r.memory_limit_in_bytes, 128 << 20);
    assert_eq!(r.unified["memory.high"], "max");
    assert_eq!(indexed.ip, "10.88.0.7", "the rest of the metadata kept");

    // A later call replaces both: no overhead sent → none recorded.
    b.pods
        .update_sandbox_resources(&id, None, Some(&pod_resources(256)))
        .await
        .expect("updated again");
    let got = recorded_metadata(&b, &id).updated_resources.expect("kept");
    assert_eq!(got.overhead, None);
    assert_eq!(got.resources.expect("resources").cpu_shares, 256);
}

#[tokio::test]
async fn update_sandbox_resources_of_an_unknown_pod_is_not_found_and_writes_nothing() {
    let b = bed();
    let before = b.log.calls().len();
    let err = b
        .pods
        .update_sandbox_resources(&"f".repeat(64), None, Some(&pod_resources(2)))
        .await
        .expect_err("no such pod");
    assert!(
        matches!(
            err,
            SandboxError::Store(crate::store::StoreError::NotFound { .. })
        ),
        "{err:?}"
    );
    assert_eq!(b.log.calls().len(), before, "no call made");
}

#[tokio::test]
async fn update_sandbox_resources_failing_to_write_the_record_leaves_the_index_as_it_was() {
    let b = bed();
    let id = b.pods.run_sandbox(pod_request()).await.expect("a pod");
    // The first set_extension recorded the pod's addresses during RunPodSandbox.
    b.log.fail("containers.set_extension", 2);
    b.pods
        .update_sandbox_resources(&id, None, Some(&pod_resources(2)))
        .await
        .expect_err("the record write fails");
    let indexed = b.pods.sandboxes.get(&id).expect("indexed").metadata();
    assert_eq!(indexed.updated_resources, None, "not reported as recorded");
    assert_eq!(recorded_metadata(&b, &id).updated_resources, None);
}

// Pods without a pause container (`pause_container = "when-needed"`, sandbox_run).

/// A pod whose containers do not share a PID namespace (kubelet's pod without
/// `shareProcessNamespace`): it needs no pause container. One `net.*` sysctl (the host's IPC
/// namespace, as `pod_request`, so no IPC sysctl).
fn pinned_pod_request() -> RunSandbox {
    let mut req = pod_request();
    req.config.security.namespaces.pid = NamespaceMode::Container;
    req.config.sysctls = [("net.ipv4.ip_unprivileged_port_start".into(), "80".into())].into();
    req
}

/// The handler `runc` (Go shim), asking for a pause container for every pod or not.
fn runc_handler(pause_always: bool) -> RuntimeHandlers {
    let runc = HandlerRuntime {
        runtime: ShimRuntime {
            name: "io.containerd.runc.v2".into(),
            options: None,
        },
        runtime_path: String::new(),
        features: Default::default(),
        pass_through: Default::default(),
        pause_always,
    };
    RuntimeHandlers::new(
        "runc",
        std::collections::BTreeMap::from([("runc".to_string(), runc)]),
    )
}

#[tokio::test]
async fn a_pod_without_pause_has_its_namespaces_pinned_a_holder_task_and_no_image_or_snapshot() {
    let b = bed();
    let id = b
        .pods
        .run_sandbox(pinned_pod_request())
        .await
        .expect("a pod");
    let netns = b.state_dir.join("netns").join(&id);
    // The exit monitor's Task.Wait on the holder may follow.
    assert_eq!(
        b.log.calls()[..6],
        vec![
            Call::NetnsCreate(id.clone(), None),
            Call::NetnsPin(
                netns.clone(),
                crate::net::netns::PodNamespaces {
                    hostname: "web".into(),
                    new_ipc: false,
                    sysctls: vec![("net.ipv4.ip_unprivileged_port_start".into(), "80".into())],
                }
            ),
            Call::CniAdd(id.clone()),
            Call::RecordCreate(id.clone()),
            Call::TaskCreate(id.clone()),
            Call::TaskStart(id.clone()),
        ],
        "no pause image, lease or snapshot; the record is made once, with the addresses"
    );
    let sb = b.pods.sandboxes.get(&id).expect("indexed").snapshot();
    assert_eq!((sb.status.state, sb.status.pid), (SandboxState::Ready, 0));
    assert!(sb.metadata.pinned_namespaces);
    assert_eq!(sb.metadata.ip, "10.88.0.7");
    assert_eq!(recorded_metadata(&b, &id), *sb.metadata);
    assert!(b.containerd.has_task(&id), "the holder task");
    // The record's spec says what the pod is; nothing runs it.
    let record = b.containerd.record(&id).expect("the pod's record");
    let spec: serde_json::Value = serde_json::from_slice(&record.spec).unwrap();
    assert!(
        spec.get("process").is_none() && spec.get("root").is_none(),
        "{spec}"
    );
    assert_eq!(spec["hostname"], "web");
    assert_eq!(spec["annotations"]["dev.remora.pod-holder"], "true");
    assert_eq!(
        spec["annotations"]["io.kubernetes.cri.sandbox-id"],
        id.as_str()
    );
    let uts = spec["linux"]["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["type"] == "uts")
        .cloned()
        .expect("a UTS namespace");
    assert_eq!(uts["path"], format!("{}.uts", netns.display()));
    assert!(!b.intent_file(&id).exists());
}

#[tokio::test]
async fn a_pod_that_shares_its_pid_namespace_or_whose_handler_asks_gets_a_pause_container() {
    // shareProcessNamespace: the pod's PID namespace needs a process.
    let b = bed();
    let id = b.pods.run_sandbox(pod_request()).await.expect("a pod");
    assert_eq!(b.log.calls()[..9], run_sandbox_calls(&id));
    assert!(
        !b.pods
            .sandboxes
            .get(&id)
            .unwrap()
            .metadata()
            .pinned_namespaces
    );
    // A handler with pause_container = "always".
    let b = bed_with_handlers(runc_handler(true));
    let id = b
        .pods
        .run_sandbox(pinned_pod_request())
        .await
        .expect("a pod");
    assert!(b.log.calls().contains(&Call::TaskStart(id.clone())));
    assert!(!b
        .log
        .calls()
        .iter()
        .any(|c| matches!(c, Call::NetnsPin(..))));
    let sb = b.pods.sandboxes.get(&id).unwrap().snapshot();
    assert_ne!(sb.status.pid, 0);
    assert!(!sb.metadata.pinned_namespaces);
    // The same pod under a handler that does not ask: pinned.
    let b = bed_with_handlers(runc_handler(false));
    let id = b
        .pods
        .run_sandbox(pinned_pod_request())
        .await
        .expect("a pod");
    assert!(
        b.pods
            .sandboxes
            .get(&id)
            .unwrap()
            .metadata()
            .pinned_namespaces
    );
}

/// RunPodSandbox of a pod without a pause container, with `op` failing: the undo calls run,
/// newest first, and nothing of the pod is left.
async fn pinned_run_sandbox_fails_at(op: &'static str, undo: fn(&str, &Path) -> Vec<Call>) {
    let b = bed();
    b.log.fail(op, 1);
    b.pods
        .run_sandbox(pinned_pod_request())
        .await
        .expect_err("the scripted failure");
    let id = first_id(&b.log);
    let netns = b.state_dir.join("netns").join(&id);
    assert_eq!(
        b.log.after_failure(),
        undo(&id, &netns),
        "{op}: undo sequence"
    );
    assert_pod_undone(&b, &id, op);
}

#[tokio::test]
async fn a_pod_without_pause_failing_to_pin_removes_its_netns() {
    pinned_run_sandbox_fails_at("network.pin_namespaces", |_, netns| {
        vec![Call::NetnsRemove(netns.to_path_buf())]
    })
    .await;
}

#[tokio::test]
async fn a_pod_without_pause_failing_cni_add_removes_its_files_and_netns() {
    pinned_run_sandbox_fails_at("network.setup", |_, netns| {
        vec![Call::NetnsRemove(netns.to_path_buf())]
    })
    .await;
}

#[tokio::test]
async fn a_pod_without_pause_failing_its_record_undoes_cni_then_the_netns() {
    pinned_run_sandbox_fails_at("containers.create", |id, netns| {
        vec![
            Call::CniDel(id.to_string()),
            Call::NetnsRemove(netns.to_path_buf()),
        ]
    })
    .await;
}

#[tokio::test]
async fn a_pod_without_pause_failing_its_holder_task_undoes_the_record_cni_and_netns() {
    pinned_run_sandbox_fails_at("tasks.create", |id, netns| {
        vec![
            Call::RecordDelete(id.to_string()),
            Call::CniDel(id.to_string()),
            Call::NetnsRemove(netns.to_path_buf()),
        ]
    })
    .await;
}

#[tokio::test]
async fn a_pod_without_pause_failing_to_start_its_holder_undoes_everything() {
    pinned_run_sandbox_fails_at("tasks.start", |id, netns| {
        vec![
            Call::TaskKill(id.to_string(), KILL, true),
            Call::TaskWait(id.to_string()),
            Call::TaskDelete(id.to_string()),
            Call::RecordDelete(id.to_string()),
            Call::CniDel(id.to_string()),
            Call::NetnsRemove(netns.to_path_buf()),
        ]
    })
    .await;
}

#[tokio::test]
async fn a_pod_without_pause_refuses_a_host_wide_sysctl_before_making_anything() {
    let b = bed();
    let mut req = pinned_pod_request();
    req.config.sysctls = [("vm.overcommit_memory".into(), "1".into())].into();
    let err = b
        .pods
        .run_sandbox(req)
        .await
        .expect_err("a host-wide sysctl");
    assert!(
        matches!(err, SandboxError::Spec(SpecError::InvalidSysctl { .. })),
        "{err:?}"
    );
    assert!(b.log.calls().is_empty(), "{:?}", b.log.calls());
}

#[tokio::test]
async fn containers_of_a_pod_without_pause_join_its_pinned_namespaces() {
    let b = bed();
    let pod = b
        .pods
        .run_sandbox(pinned_pod_request())
        .await
        .expect("a pod");
    let netns = b.state_dir.join("netns").join(&pod);
    let mut req = create_request(&pod);
    req.config.security.namespaces.pid = NamespaceMode::Container;
    req.config.security.namespaces.ipc = NamespaceMode::Node;
    let id = b.pods.create_container(req).await.expect("a container");
    let record = b.containerd.record(&id).expect("the container's record");
    let spec: serde_json::Value = serde_json::from_slice(&record.spec).unwrap();
    let namespaces: Vec<(String, Option<String>)> = spec["linux"]["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["type"].as_str().unwrap().to_string(),
                n["path"].as_str().map(str::to_string),
            )
        })
        .collect();
    // Put in the pod's shim, which its holder task keeps, as a pause container's pod's.
    assert_eq!(record.sandbox, pod);
    let path = |suffix: &str| Some(format!("{}{suffix}", netns.display()));
    assert_eq!(
        namespaces,
        vec![
            ("mount".to_string(), None),
            ("network".to_string(), path("")),
            ("uts".to_string(), path(".uts")),
            ("pid".to_string(), None),
        ]
    );
    // A container asking for the pod's PID namespace, which a pod without a pause container
    // does not have: refused, naming it, and nothing left.
    let mut req = create_request(&pod);
    req.metadata.name = "shares-pid".into();
    req.config.security.namespaces.ipc = NamespaceMode::Node;
    let err = b
        .pods
        .create_container(req)
        .await
        .expect_err("no pod PID namespace");
    assert!(
        matches!(err, ContainerError::Spec(SpecError::NoPodNamespace("pid"))),
        "{err:?}"
    );
    assert!(err.to_string().contains("no pid namespace"), "{err}");
    assert_eq!(b.pods.containers_store().by_sandbox(&pod).len(), 1);
}

#[tokio::test]
async fn stopping_a_pod_without_pause_ends_its_holder_and_removes_its_network() {
    let b = bed();
    let id = b
        .pods
        .run_sandbox(pinned_pod_request())
        .await
        .expect("a pod");
    let netns = b.state_dir.join("netns").join(&id);
    b.log.clear();
    b.pods.stop_sandbox(&id).await.expect("stopped");
    let calls = b.log.calls();
    assert!(calls.contains(&Call::TaskDelete(id.clone())), "{calls:?}");
    assert!(calls.contains(&Call::CniDel(id.clone())), "{calls:?}");
    assert!(calls.contains(&Call::NetnsRemove(netns)), "{calls:?}");
    let sb = b.pods.sandboxes.get(&id).unwrap().snapshot();
    assert_eq!(sb.status.state, SandboxState::NotReady);
    assert!(!b.containerd.has_task(&id));
    b.pods.remove_sandbox(&id).await.expect("removed");
    assert!(!b.containerd.has_record(&id));
    assert!(b.pods.sandboxes.get(&id).is_err());
}
