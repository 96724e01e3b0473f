//! Containers: their metadata (fixed at creation), their [`ContainerStatus`] (the state machine
//! in [`super::status`]), and the store that indexes them.
//!
//! Every status change goes through a method of [`Container`] that takes the container's own
//! lock for one atomic check-and-update; no lock is held across an `.await`, so a slow
//! containerd call in Stop cannot block an exit being recorded, and the state machine's flags
//! (`starting`, `removing`) — not a held lock — keep racing Start/Remove apart.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde::{Deserialize, Serialize};

use super::index::SharedIndex;
use super::name::container_name_key;
use super::sandbox::SandboxStore;
use super::status::{ContainerState, ContainerStatus, ExitOutcome, OomOutcome, TransitionError};
use super::{labels_match, StoreError};
use crate::spec::MountPropagation;

/// The pod a container belongs to, as named in CRI (for the name key and record labels).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct PodRef {
    /// Pod (sandbox) name.
    pub name: String,
    /// Pod namespace.
    pub namespace: String,
    /// Pod uid.
    pub uid: String,
}

/// The image of a container, in the three forms CRI reports.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ImageRefs {
    /// As requested in `ContainerConfig.image.image`: kubelet sends the image id there
    /// (CRI `Container.image`).
    pub requested: String,
    /// `ContainerConfig.image.user_specified_image`: the image as the pod spec names it
    /// (CRI `ContainerStatus.image` when set). Empty in records written before it was kept,
    /// and when the client sent none.
    pub user_specified: String,
    /// Image id: config digest (`sha256:…`).
    pub id: String,
    /// Resolved reference, preferably a repo digest (CRI `image_ref`).
    pub reference: String,
}

/// A mount, as `ContainerStatus.mounts` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct MountSummary {
    /// Path in the container.
    pub container_path: String,
    /// Path on the host.
    pub host_path: String,
    /// Read-only.
    pub readonly: bool,
    /// SELinux relabel requested.
    pub selinux_relabel: bool,
    /// Propagation.
    #[serde(with = "propagation_serde")]
    pub propagation: MountPropagation,
    /// Read-only recursively (`rro`).
    pub recursive_read_only: bool,
    /// An image volume's image as requested ("" for a host path mount).
    pub image: String,
    /// The image volume's image as resolved: its repo digest, else its id.
    pub image_ref: String,
    /// The image volume's image id (config digest, what PullImage answered for it: CRI
    /// `ImageSpec.image_ref` of the mount in ContainerStatus). Empty in records written before
    /// remora kept it, and for a host path mount.
    pub image_id: String,
    /// The image volume's sub path as requested (CRI `Mount.image_sub_path`; "" for the
    /// image's root or a host path mount).
    pub image_sub_path: String,
}

/// The identity a container's first process starts with, as its OCI spec sets it (CRI
/// `ContainerStatus.user`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ContainerUser {
    /// Primary uid.
    pub uid: u32,
    /// Primary gid.
    pub gid: u32,
    /// Supplementary groups (the spec's `additionalGids`: the primary gid, the image's groups
    /// of the user under `Merge`, and the configured ones).
    pub supplemental_groups: Vec<u32>,
}

/// Everything CRI said about a container and what remora resolved for it; fixed after
/// creation. Persisted with the status (see [`super::persist`]).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ContainerMetadata {
    /// Container id (64 hex chars).
    pub id: String,
    /// Id of its sandbox.
    pub sandbox_id: String,
    /// Its pod.
    pub pod: PodRef,
    /// Container name (CRI `ContainerMetadata.name`).
    pub name: String,
    /// Attempt number.
    pub attempt: u32,
    /// CRI labels.
    pub labels: HashMap<String, String>,
    /// CRI annotations.
    pub annotations: HashMap<String, String>,
    /// Its image.
    pub image: ImageRefs,
    /// Absolute path of its CRI log file (sandbox log directory + `log_path`); empty = none.
    pub log_path: String,
    /// Its mounts.
    pub mounts: Vec<MountSummary>,
    /// Its resources (CRI `ContainerResources`) as JSON, opaque here; updated containers
    /// replace the whole record.
    #[serde(with = "super::base64_bytes")]
    pub resources_json: Vec<u8>,
    /// A TTY was requested.
    pub tty: bool,
    /// Stdin is kept open.
    pub stdin: bool,
    /// Stdin is closed after the first attach ends.
    pub stdin_once: bool,
    /// Its first process's identity; `None` in records written before remora kept it.
    pub user: Option<ContainerUser>,
    /// The signal StopContainer sends first, as [`crate::signal::Signal`] writes it
    /// (`SIGQUIT`, `SIGRTMIN+3`; a number for 32 and 33): the one CRI configured, else the
    /// image's `StopSignal`, else SIGTERM, resolved at creation so that removing the image
    /// does not change it. Empty in records written before remora kept it: StopContainer then
    /// looks the image up, as remora did then.
    pub stop_signal: String,
    /// The CDI devices it was given (`vendor/class=name`: `ContainerConfig.cdi_devices`, then
    /// those of `cdi.k8s.io/*` annotations), for verbose ContainerStatus; empty in records
    /// written before remora kept them.
    pub cdi_devices: Vec<String>,
}

impl ContainerMetadata {
    /// The key reserved in the container [`super::NameIndex`].
    pub fn name_key(&self) -> String {
        container_name_key(
            &self.name,
            &self.pod.name,
            &self.pod.namespace,
            &self.pod.uid,
            self.attempt,
        )
    }
}

#[derive(Debug)]
struct ContainerInner {
    metadata: Arc<ContainerMetadata>,
    status: Mutex<ContainerStatus>,
    /// The status's state, sent on every change (under the status lock, so in order): what
    /// Stop and Remove wait on instead of polling.
    state: tokio::sync::watch::Sender<ContainerState>,
}

/// A container in the store: a cheap handle (an `Arc`). It stays usable after removal from
/// the store (an exit handler may still hold it), but nothing it does puts it back.
#[derive(Debug, Clone)]
pub struct Container {
    inner: Arc<ContainerInner>,
}

/// A copy of a container at one moment, for listing, status and persistence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerSnapshot {
    /// Metadata (shared, immutable).
    pub metadata: Arc<ContainerMetadata>,
    /// Status when the snapshot was taken.
    pub status: ContainerStatus,
}

impl Container {
    /// A container with this metadata and status, not yet in a store.
    pub fn new(metadata: ContainerMetadata, status: ContainerStatus) -> Self {
        let (state, _) = tokio::sync::watch::channel(status.state);
        Container {
            inner: Arc::new(ContainerInner {
                metadata: Arc::new(metadata),
                status: Mutex::new(status),
                state,
            }),
        }
    }

    /// Its id.
    pub fn id(&self) -> &str {
        &self.inner.metadata.id
    }

    /// Its metadata.
    pub fn metadata(&self) -> &Arc<ContainerMetadata> {
        &self.inner.metadata
    }

    fn lock(&self) -> MutexGuard<'_, ContainerStatus> {
        // Transitions are check-then-assign with no panicking step between assignments, so a
        // poisoned lock (a panic elsewhere while holding it) still guards a valid status.
        self.inner
            .status
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies a transition under the lock and publishes the resulting state.
    fn update<R>(&self, transition: impl FnOnce(&mut ContainerStatus) -> R) -> R {
        let mut status = self.lock();
        let result = transition(&mut status);
        let now = status.state;
        self.inner.state.send_if_modified(|s| {
            let changed = *s != now;
            *s = now;
            changed
        });
        result
    }

    /// Resolves once the container is not RUNNING (at once if it is not): its exit recorded,
    /// or it was marked UNKNOWN. No wake-up is lost: the state is checked after subscribing.
    pub async fn not_running(&self) {
        let mut rx = self.inner.state.subscribe();
        // The sender lives as long as `self`, so the wait cannot fail.
        let _ = rx.wait_for(|s| *s != ContainerState::Running).await;
    }

    /// A copy of its status.
    pub fn status(&self) -> ContainerStatus {
        self.lock().clone()
    }

    /// Its current state.
    pub fn state(&self) -> ContainerState {
        self.lock().state
    }

    /// A snapshot of metadata and status.
    pub fn snapshot(&self) -> ContainerSnapshot {
        ContainerSnapshot {
            metadata: Arc::clone(&self.inner.metadata),
            status: self.status(),
        }
    }

    /// See [`ContainerStatus::begin_start`].
    pub fn begin_start(&self) -> Result<(), TransitionError> {
        self.update(|s| s.begin_start(self.id()))
    }

    /// See [`ContainerStatus::abort_start`].
    pub fn abort_start(&self) {
        self.update(|s| s.abort_start());
    }

    /// See [`ContainerStatus::record_started`].
    pub fn record_started(&self, pid: u32, started_at: i64) -> Result<(), TransitionError> {
        self.update(|s| s.record_started(self.id(), pid, started_at))
    }

    /// Records the pod's OOM kill count at the container's start (see
    /// [`ContainerStatus::pod_oom_kills_at_start`]).
    pub fn set_pod_oom_kills_at_start(&self, count: Option<u64>) {
        self.update(|s| s.pod_oom_kills_at_start = count)
    }

    /// Records the resources its spec applies now (see [`ContainerStatus::resources`]).
    pub fn set_resources(&self, resources: super::resources::LinuxResources) {
        self.update(|s| s.resources = Some(resources))
    }

    /// See [`ContainerStatus::record_exit`].
    pub fn record_exit(&self, exit_code: i32, finished_at: i64) -> ExitOutcome {
        self.update(|s| s.record_exit(exit_code, finished_at))
    }

    /// See [`ContainerStatus::start_failed`].
    pub fn start_failed(
        &self,
        message: &str,
        finished_at: i64,
    ) -> Result<ExitOutcome, TransitionError> {
        self.update(|s| s.start_failed(self.id(), message, finished_at))
    }

    /// See [`ContainerStatus::mark_oom`].
    pub fn mark_oom(&self) -> OomOutcome {
        self.update(|s| s.mark_oom())
    }

    /// See [`ContainerStatus::mark_unknown`].
    pub fn mark_unknown(&self) -> Result<(), TransitionError> {
        self.update(|s| s.mark_unknown(self.id()))
    }

    /// RUNNING → UNKNOWN in one step (a vanished task); false if it was not running.
    pub fn mark_unknown_if_running(&self) -> bool {
        let id = self.id();
        self.update(|s| s.state == ContainerState::Running && s.mark_unknown(id).is_ok())
    }

    /// See [`ContainerStatus::begin_removal`].
    pub fn begin_removal(&self) -> Result<(), TransitionError> {
        self.update(|s| s.begin_removal(self.id()))
    }

    /// See [`ContainerStatus::abort_removal`].
    pub fn abort_removal(&self) {
        self.update(|s| s.abort_removal());
    }
}

/// CRI `ContainerFilter`. Empty fields do not filter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerFilter {
    /// Full id or a prefix matching exactly one container (otherwise compared verbatim, so an
    /// ambiguous prefix matches nothing — containerd's behaviour).
    pub id: Option<String>,
    /// Full sandbox id or a prefix matching exactly one sandbox, resolved the same way.
    pub pod_sandbox_id: Option<String>,
    /// Only containers in this state.
    pub state: Option<ContainerState>,
    /// Every key=value must be among the container's labels.
    pub label_selector: HashMap<String, String>,
}

/// The container index.
#[derive(Debug, Default)]
pub struct ContainerStore {
    containers: SharedIndex<Container>,
}

impl ContainerStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a container; `AlreadyExists` if its id is taken.
    pub fn add(&self, container: Container) -> Result<(), StoreError> {
        let id = container.id().to_string();
        self.containers.insert(&id, container)
    }

    /// The container with this full id or unique id prefix.
    pub fn get(&self, id_or_prefix: &str) -> Result<Container, StoreError> {
        self.containers.get(id_or_prefix)
    }

    /// The full id for a full id or unique prefix.
    pub fn resolve(&self, id_or_prefix: &str) -> Result<String, StoreError> {
        self.containers.resolve(id_or_prefix)
    }

    /// Removes the container (full id or unique prefix) and returns it. Refused while it is
    /// RUNNING or being started: the check and the removal happen under the store's write
    /// lock and the container's lock together, so a start cannot slip in between.
    pub fn delete(&self, id_or_prefix: &str) -> Result<Container, StoreError> {
        let mut index = self.containers.write();
        let id = index.resolve(id_or_prefix)?.to_string();
        let container = index.get(&id)?;
        {
            // Lock order: store, then container. Container methods never take the store lock.
            let mut status = container.lock();
            status.check_removable(&id)?;
            // Stays set: a handle held elsewhere (an exit handler, a racing Start) must not be
            // able to start a container that is no longer in the store.
            status.removing = true;
        }
        index.remove(&id).ok_or(StoreError::NotFound { id })
    }

    /// Number of containers.
    pub fn len(&self) -> usize {
        self.containers.len()
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Snapshots of the containers passing `filter`, sorted by id (`ListContainers`).
    /// `sandboxes` resolves a truncated `pod_sandbox_id`.
    pub fn list(
        &self,
        filter: &ContainerFilter,
        sandboxes: &SandboxStore,
    ) -> Vec<ContainerSnapshot> {
        // Resolve the sandbox prefix before taking our lock: no two store locks at once.
        let sandbox_id = filter
            .pod_sandbox_id
            .as_deref()
            .filter(|id| !id.is_empty())
            .map(|id| sandboxes.resolve(id).unwrap_or_else(|_| id.to_string()));
        let index = self.containers.read();
        let id = index.filter_id(filter.id.as_deref());
        index
            .values()
            .filter(|c| id.as_deref().is_none_or(|id| c.id() == id))
            .filter(|c| {
                sandbox_id
                    .as_deref()
                    .is_none_or(|sb| c.metadata().sandbox_id == sb)
            })
            .filter(|c| labels_match(&c.metadata().labels, &filter.label_selector))
            .map(Container::snapshot)
            .filter(|snap| filter.state.is_none_or(|st| snap.status.state == st))
            .collect()
    }

    /// The containers of a sandbox (full id), e.g. to stop them with it.
    pub fn by_sandbox(&self, sandbox_id: &str) -> Vec<Container> {
        self.containers
            .read()
            .values()
            .filter(|c| c.metadata().sandbox_id == sandbox_id)
            .cloned()
            .collect()
    }
}

/// The stable JSON form of [`MountPropagation`], kept here with the persistence (see the
/// sandbox's namespace options for why).
mod propagation_serde {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::spec::MountPropagation;

    #[derive(Serialize, Deserialize)]
    #[serde(remote = "MountPropagation", rename_all = "snake_case")]
    enum PropagationDef {
        Private,
        HostToContainer,
        Bidirectional,
    }

    pub(super) fn serialize<S: Serializer>(v: &MountPropagation, s: S) -> Result<S::Ok, S::Error> {
        PropagationDef::serialize(v, s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<MountPropagation, D::Error> {
        PropagationDef::deserialize(d)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::store::sandbox::tests::meta as sandbox_meta;
    use crate::store::sandbox::{Sandbox, SandboxStatus};
    use crate::store::status::REASON_OOM_KILLED;

    pub(crate) fn meta(id: &str, sandbox_id: &str, labels: &[(&str, &str)]) -> ContainerMetadata {
        ContainerMetadata {
            id: id.into(),
            sandbox_id: sandbox_id.into(),
            name: format!("name-{id}"),
            pod: PodRef {
                name: "web".into(),
                namespace: "default".into(),
                uid: "u1".into(),
            },
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }
    }

    fn container(id: &str, sandbox_id: &str, labels: &[(&str, &str)]) -> Container {
        Container::new(meta(id, sandbox_id, labels), ContainerStatus::created(1))
    }

    fn start(c: &Container) {
        c.begin_start().unwrap();
        c.record_started(100, 2).unwrap();
    }

    fn sandboxes() -> SandboxStore {
        let s = SandboxStore::new();
        for id in ["sb1aaa", "sb1bbb", "sb2ccc"] {
            s.add(Sandbox::new(
                sandbox_meta(id, id, &[]),
                SandboxStatus::ready(1),
            ))
            .unwrap();
        }
        s
    }

    /// c1 created in sb1aaa, c2 running in sb1aaa, c3 exited in sb1bbb, d4 unknown in sb2ccc.
    fn store() -> ContainerStore {
        let s = ContainerStore::new();
        s.add(container(
            "c1",
            "sb1aaa",
            &[("app", "web"), ("io.kubernetes.container.name", "nginx")],
        ))
        .unwrap();
        let c2 = container("c2", "sb1aaa", &[("app", "web")]);
        start(&c2);
        s.add(c2).unwrap();
        let c3 = container("c3", "sb1bbb", &[("app", "db")]);
        start(&c3);
        let _ = c3.record_exit(1, 3);
        s.add(c3).unwrap();
        let d4 = container("d4", "sb2ccc", &[]);
        d4.mark_unknown().unwrap();
        s.add(d4).unwrap();
        s
    }

    fn ids(v: Vec<ContainerSnapshot>) -> Vec<String> {
        v.into_iter().map(|s| s.metadata.id.clone()).collect()
    }

    fn list(f: ContainerFilter) -> Vec<String> {
        ids(store().list(&f, &sandboxes()))
    }

    #[test]
    fn add_get_prefix_ambiguous() {
        let s = store();
        assert_eq!(s.get("d").unwrap().id(), "d4");
        assert_eq!(s.get("c2").unwrap().state(), ContainerState::Running);
        assert_eq!(
            s.get("c").unwrap_err(),
            StoreError::Ambiguous {
                prefix: "c".into(),
                matches: 3
            }
        );
        assert_eq!(
            s.get("x").unwrap_err(),
            StoreError::NotFound { id: "x".into() }
        );
        assert_eq!(
            s.add(container("c1", "sb", &[])),
            Err(StoreError::AlreadyExists { id: "c1".into() })
        );
        assert_eq!(s.len(), 4);
    }

    #[test]
    fn delete_refuses_running_and_starting() {
        let s = store();
        assert!(matches!(
            s.delete("c2"),
            Err(StoreError::Transition(TransitionError::Illegal {
                from: ContainerState::Running,
                ..
            }))
        ));
        let c1 = s.get("c1").unwrap();
        c1.begin_start().unwrap();
        assert!(matches!(
            s.delete("c1"),
            Err(StoreError::Transition(TransitionError::Starting { .. }))
        ));
        c1.abort_start();
        assert_eq!(s.delete("c1").unwrap().id(), "c1");
        assert_eq!(s.delete("c3").unwrap().id(), "c3");
        assert_eq!(s.delete("d").unwrap().id(), "d4");
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn list_all_sorted() {
        assert_eq!(list(ContainerFilter::default()), ["c1", "c2", "c3", "d4"]);
    }

    #[test]
    fn filter_id() {
        let by = |id: &str| {
            list(ContainerFilter {
                id: Some(id.into()),
                ..Default::default()
            })
        };
        assert_eq!(by("c2"), ["c2"]);
        assert_eq!(by("d"), ["d4"]);
        assert!(by("c").is_empty(), "ambiguous prefix matches nothing");
        assert!(by("nope").is_empty());
        assert_eq!(by("").len(), 4);
    }

    #[test]
    fn filter_pod_sandbox_id_full_and_prefix() {
        let by = |id: &str| {
            list(ContainerFilter {
                pod_sandbox_id: Some(id.into()),
                ..Default::default()
            })
        };
        assert_eq!(by("sb1aaa"), ["c1", "c2"]);
        assert_eq!(by("sb1b"), ["c3"]);
        assert_eq!(by("sb2"), ["d4"]);
        assert!(
            by("sb1").is_empty(),
            "ambiguous sandbox prefix matches nothing"
        );
        assert!(by("zz").is_empty());
    }

    #[test]
    fn filter_state() {
        let by = |st| {
            list(ContainerFilter {
                state: Some(st),
                ..Default::default()
            })
        };
        assert_eq!(by(ContainerState::Created), ["c1"]);
        assert_eq!(by(ContainerState::Running), ["c2"]);
        assert_eq!(by(ContainerState::Exited), ["c3"]);
        assert_eq!(by(ContainerState::Unknown), ["d4"]);
    }

    #[test]
    fn filter_labels_and_combined() {
        let sel = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(
            list(ContainerFilter {
                label_selector: sel(&[("app", "web")]),
                ..Default::default()
            }),
            ["c1", "c2"]
        );
        assert_eq!(
            list(ContainerFilter {
                label_selector: sel(&[("app", "web"), ("io.kubernetes.container.name", "nginx")]),
                ..Default::default()
            }),
            ["c1"]
        );
        assert_eq!(
            list(ContainerFilter {
                pod_sandbox_id: Some("sb1a".into()),
                state: Some(ContainerState::Running),
                label_selector: sel(&[("app", "web")]),
                ..Default::default()
            }),
            ["c2"]
        );
        assert!(list(ContainerFilter {
            label_selector: sel(&[("app", "db"), ("x", "y")]),
            ..Default::default()
        })
        .is_empty());
    }

    #[test]
    fn by_sandbox() {
        let s = store();
        let mut ids: Vec<_> = s
            .by_sandbox("sb1aaa")
            .iter()
            .map(|c| c.id().to_string())
            .collect();
        ids.sort();
        assert_eq!(ids, ["c1", "c2"]);
    }

    #[test]
    fn name_key() {
        let mut m = meta("c", "sb", &[]);
        m.name = "nginx".into();
        m.attempt = 1;
        assert_eq!(m.name_key(), "nginx_web_default_u1_1");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn first_exit_wins_under_concurrency() {
        let c = container("c", "sb", &[]);
        start(&c);
        let tasks: Vec<_> = (0..50)
            .map(|i| {
                let c = c.clone();
                tokio::spawn(async move {
                    tokio::task::yield_now().await;
                    (i, c.record_exit(i, 1000 + i64::from(i)))
                })
            })
            .collect();
        let mut winners = Vec::new();
        for t in tasks {
            let (i, outcome) = t.await.unwrap();
            if outcome == ExitOutcome::Recorded {
                winners.push(i);
            }
        }
        assert_eq!(winners.len(), 1, "exactly one exit recorded: {winners:?}");
        let st = c.status();
        assert_eq!(st.exit_code, winners[0]);
        assert_eq!(st.finished_at, 1000 + i64::from(winners[0]));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn racing_start_and_remove_never_both_succeed() {
        for _ in 0..50 {
            let s = Arc::new(ContainerStore::new());
            s.add(container("c", "sb", &[])).unwrap();
            let c = s.get("c").unwrap();
            let starter = {
                let c = c.clone();
                tokio::spawn(async move {
                    if c.begin_start().is_err() {
                        return false;
                    }
                    tokio::task::yield_now().await;
                    c.record_started(1, 2).is_ok()
                })
            };
            let remover = {
                let s = Arc::clone(&s);
                tokio::spawn(async move { s.delete("c").is_ok() })
            };
            let (started, removed) = (starter.await.unwrap(), remover.await.unwrap());
            assert!(!(started && removed), "a removed container was started");
            assert!(started || removed);
        }
    }

    #[test]
    fn exit_after_removal_does_not_resurrect() {
        let s = store();
        let c1 = s.get("c1").unwrap();
        c1.begin_removal().unwrap();
        s.delete("c1").unwrap();
        assert_eq!(c1.record_exit(0, 5), ExitOutcome::Recorded);
        assert!(s.get("c1").is_err());
        assert!(c1.begin_start().is_err());
    }

    #[test]
    fn oom_through_the_handle() {
        let c = container("c", "sb", &[]);
        start(&c);
        assert_eq!(c.mark_oom(), OomOutcome::Marked);
        let _ = c.record_exit(137, 9);
        assert_eq!(c.status().reason, REASON_OOM_KILLED);
        assert_eq!(c.snapshot().status.state, ContainerState::Exited);
    }

    #[tokio::test]
    async fn not_running_resolves_at_once_for_a_container_that_is_not_running() {
        let c = container("c1", "sb1aaa", &[]);
        // CREATED: nothing to wait for.
        tokio::time::timeout(std::time::Duration::from_secs(5), c.not_running())
            .await
            .expect("a created container is not running");
        start(&c);
        let _ = c.record_exit(0, 3);
        tokio::time::timeout(std::time::Duration::from_secs(5), c.not_running())
            .await
            .expect("an exited container is not running");
    }

    #[tokio::test]
    async fn not_running_wakes_on_the_exit_and_on_unknown() {
        for exit in [true, false] {
            let c = container("c1", "sb1aaa", &[]);
            start(&c);
            let waiter = tokio::spawn({
                let c = c.clone();
                async move { c.not_running().await }
            });
            // Still running: the waiter must not have resolved.
            tokio::task::yield_now().await;
            assert!(!waiter.is_finished(), "resolved while running");
            if exit {
                let _ = c.record_exit(3, 9);
            } else {
                assert!(c.mark_unknown_if_running());
            }
            tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
                .await
                .expect("woken by the state change")
                .unwrap();
        }
    }

    #[test]
    fn a_state_change_between_the_check_and_the_wait_is_not_lost() {
        // The exit lands after the waiter was created but before it is first polled: the
        // watch's value is read at the first poll, so it still resolves.
        let c = container("c1", "sb1aaa", &[]);
        start(&c);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let wait = c.not_running();
        let _ = c.record_exit(0, 3);
        rt.block_on(async {
            tokio::time::timeout(std::time::Duration::from_secs(5), wait)
                .await
                .expect("the exit before the first poll is seen")
        });
    }
}
