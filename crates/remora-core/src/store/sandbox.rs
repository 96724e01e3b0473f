//! Pod sandboxes: their metadata (fixed when the sandbox is created, but for the resources
//! UpdatePodSandboxResources reports), their status (changes
//! as the pause task starts and exits), and the store that indexes them.
//!
//! ```text
//!    add (being created, or loaded and not yet checked)
//!     │
//!     ▼        set_ready(pid)       ┌───────┐  set_not_ready (Stop)  ┌──────────┐
//!  UNKNOWN ───────────────────────► │ READY ├──────────────────────► │ NOTREADY │
//!   ▲  │  ◄──── mark_unknown ────── └───────┘  record_exit (pause    └──────────┘
//!   │  │        (state lost)                    task exited)              ▲
//!   │  └──────────── set_not_ready / record_exit ────────────────────────┘
//! ```
//!
//! CRI shows UNKNOWN as NOTREADY. NOTREADY is final: a pod is re-created, never restarted, so
//! neither `set_ready` nor `mark_unknown` leave it; the first recorded pause exit wins.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde::{Deserialize, Serialize};

use super::index::SharedIndex;
use super::name::sandbox_name_key;
use super::resources::LinuxResources;
use super::status::ExitOutcome;
use super::{labels_match, StoreError};
use crate::spec::NamespaceOptions;

/// Everything CRI said about a sandbox and what remora set up for it. Persisted in the
/// containerd container record of the sandbox (the pause container's, or a record without a
/// task for a pod without one; see [`super::persist`]).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct SandboxMetadata {
    /// Sandbox id (64 hex chars).
    pub id: String,
    /// Pod name (CRI `PodSandboxMetadata.name`).
    pub name: String,
    /// Pod namespace.
    pub namespace: String,
    /// Pod uid.
    pub uid: String,
    /// Attempt number (kubelet bumps it on a re-creation).
    pub attempt: u32,
    /// CRI labels (kubelet's, used by the label selector).
    pub labels: HashMap<String, String>,
    /// CRI annotations.
    pub annotations: HashMap<String, String>,
    /// Runtime handler (RuntimeClass); empty = the default.
    pub runtime_handler: String,
    /// Creation time, ns since the Unix epoch.
    pub created_at: i64,
    /// Path of the network namespace bind mount; empty for host network.
    pub netns_path: String,
    /// Primary pod IP; empty for host network or before CNI ran.
    pub ip: String,
    /// Further pod IPs (dual stack).
    pub additional_ips: Vec<String>,
    /// Hostname of the pod.
    pub hostname: String,
    /// Directory of the containers' logs.
    pub log_directory: String,
    /// Network/PID/IPC namespace modes.
    #[serde(with = "namespace_options_serde")]
    pub namespace_options: NamespaceOptions,
    /// Cgroup parent of the pod.
    pub cgroup_parent: String,
    /// The CRI `PodSandboxConfig` as JSON, opaque here: kept for verbose status and for
    /// container creation after a restart.
    #[serde(with = "super::base64_bytes")]
    pub config_json: Vec<u8>,
    /// The pod's resources as kubelet last reported them (UpdatePodSandboxResources, after it
    /// resized the pod's cgroup); `None` until then. The one field that changes after the
    /// sandbox is indexed ([`Sandbox::replace_metadata`]). Absent in records written before
    /// in-place pod resize, and left out of those written before the first update.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub updated_resources: Option<PodResources>,
    /// The pod has no pause container: its IPC and UTS namespaces are pinned beside its
    /// network namespace (`crate::spec::namespaces::ipc_pin`, `uts_pin`), its containers join them,
    /// and it has no task of its own. Absent (false) in records of pods with a pause container,
    /// and in every record written before pods could have none.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub pinned_namespaces: bool,
}

/// What UpdatePodSandboxResources reported for a pod: its overhead and its resources, each
/// CRI `LinuxContainerResources`, absent when kubelet sent none. Kept for verbose status,
/// as containerd keeps them for its sandbox info.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct PodResources {
    /// The pod overhead (RuntimeClass).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overhead: Option<LinuxResources>,
    /// The sum of the pod's containers' resources.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resources: Option<LinuxResources>,
}

impl SandboxMetadata {
    /// The key reserved in the sandbox [`super::NameIndex`].
    pub fn name_key(&self) -> String {
        sandbox_name_key(&self.name, &self.namespace, &self.uid, self.attempt)
    }
}

/// The state of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum SandboxState {
    /// Being created, or its state could not be determined. CRI reports it as NOTREADY.
    #[default]
    Unknown,
    /// The pause task runs and the network is set up.
    Ready,
    /// Stopped or its pause task exited.
    NotReady,
}

impl SandboxState {
    /// The state as CRI sees it: CRI has only READY and NOTREADY, and containerd reports
    /// UNKNOWN as NOTREADY (the pod must be re-created either way).
    pub fn cri_visible(self) -> SandboxState {
        match self {
            SandboxState::Ready => SandboxState::Ready,
            SandboxState::NotReady | SandboxState::Unknown => SandboxState::NotReady,
        }
    }
}

/// The mutable part of a sandbox. Not persisted: after a restart it is read back from the
/// pause task (running → Ready, gone or exited → NotReady).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SandboxStatus {
    /// Current state.
    pub state: SandboxState,
    /// Pid of the pause process while it runs; 0 otherwise.
    pub pid: u32,
    /// Exit code of the pause task, once exited.
    pub exit_code: Option<i32>,
    /// When the pause task exited (ns), 0 if not.
    pub exited_at: i64,
}

impl SandboxStatus {
    /// A sandbox whose pause task runs as `pid`.
    pub fn ready(pid: u32) -> Self {
        SandboxStatus {
            state: SandboxState::Ready,
            pid,
            ..Default::default()
        }
    }
}

#[derive(Debug)]
struct SandboxInner {
    /// The id, fixed (also in the metadata).
    id: String,
    /// Replaced whole, never edited in place: a snapshot's `Arc` stays as it was taken.
    metadata: Mutex<Arc<SandboxMetadata>>,
    status: Mutex<SandboxStatus>,
}

/// A sandbox in the store: a cheap handle (an `Arc`), valid after removal from the store.
#[derive(Debug, Clone)]
pub struct Sandbox {
    inner: Arc<SandboxInner>,
}

/// A copy of a sandbox at one moment, for listing and status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxSnapshot {
    /// Metadata (shared, immutable; a later update replaces the sandbox's, not this one).
    pub metadata: Arc<SandboxMetadata>,
    /// Status when the snapshot was taken.
    pub status: SandboxStatus,
}

impl Sandbox {
    /// A sandbox with the given metadata and status, not yet in a store.
    pub fn new(metadata: SandboxMetadata, status: SandboxStatus) -> Self {
        Sandbox {
            inner: Arc::new(SandboxInner {
                id: metadata.id.clone(),
                metadata: Mutex::new(Arc::new(metadata)),
                status: Mutex::new(status),
            }),
        }
    }

    /// Its id.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// Its metadata as it is now.
    pub fn metadata(&self) -> Arc<SandboxMetadata> {
        // Only whole-`Arc` swaps happen under this lock: a poisoned lock still holds one.
        Arc::clone(
            &self
                .inner
                .metadata
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }

    /// Replaces the metadata (UpdatePodSandboxResources, once the record holds the new one).
    /// The id cannot change: a metadata with another id is refused (returns false).
    pub fn replace_metadata(&self, metadata: SandboxMetadata) -> bool {
        if metadata.id != self.inner.id {
            return false;
        }
        *self
            .inner
            .metadata
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(metadata);
        true
    }

    fn lock(&self) -> MutexGuard<'_, SandboxStatus> {
        // Status updates are plain field assignments that cannot panic half-way, so a poisoned
        // lock still guards a consistent value.
        self.inner
            .status
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// A copy of its status.
    pub fn status(&self) -> SandboxStatus {
        self.lock().clone()
    }

    /// A snapshot of metadata and status.
    pub fn snapshot(&self) -> SandboxSnapshot {
        SandboxSnapshot {
            metadata: self.metadata(),
            status: self.status(),
        }
    }

    /// The pause task started (or, after a restart, was found running) as `pid`: Ready.
    /// Refused (returns false) once NotReady.
    pub fn set_ready(&self, pid: u32) -> bool {
        let mut s = self.lock();
        if s.state == SandboxState::NotReady {
            return false;
        }
        s.state = SandboxState::Ready;
        s.pid = pid;
        true
    }

    /// StopPodSandbox: NotReady (network torn down), whether or not the pause task exited yet.
    pub fn set_not_ready(&self) {
        let mut s = self.lock();
        s.state = SandboxState::NotReady;
    }

    /// The state could not be determined (pause task lost). NotReady stays NotReady.
    pub fn mark_unknown(&self) {
        let mut s = self.lock();
        if s.state != SandboxState::NotReady {
            s.state = SandboxState::Unknown;
        }
    }

    /// The pause task exited. The first recorded exit wins, as for containers.
    pub fn record_exit(&self, exit_code: i32, exited_at: i64) -> ExitOutcome {
        let mut s = self.lock();
        if s.exit_code.is_some() {
            return ExitOutcome::AlreadyExited;
        }
        s.state = SandboxState::NotReady;
        s.pid = 0;
        s.exit_code = Some(exit_code);
        s.exited_at = exited_at;
        ExitOutcome::Recorded
    }
}

/// CRI `PodSandboxFilter`. Empty fields do not filter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxFilter {
    /// Full id, or a prefix matching exactly one sandbox (as containerd: an ambiguous or
    /// unknown prefix is compared verbatim and so matches nothing).
    pub id: Option<String>,
    /// Only sandboxes in this CRI-visible state (`Unknown` is listed as `NotReady`).
    pub state: Option<SandboxState>,
    /// Every key=value must be among the sandbox's labels.
    pub label_selector: HashMap<String, String>,
}

/// The sandbox index.
#[derive(Debug, Default)]
pub struct SandboxStore {
    sandboxes: SharedIndex<Sandbox>,
}

impl SandboxStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a sandbox; `AlreadyExists` if its id is taken.
    pub fn add(&self, sandbox: Sandbox) -> Result<(), StoreError> {
        let id = sandbox.id().to_string();
        self.sandboxes.insert(&id, sandbox)
    }

    /// The sandbox with this full id or unique id prefix.
    pub fn get(&self, id_or_prefix: &str) -> Result<Sandbox, StoreError> {
        self.sandboxes.get(id_or_prefix)
    }

    /// The full id for a full id or unique prefix.
    pub fn resolve(&self, id_or_prefix: &str) -> Result<String, StoreError> {
        self.sandboxes.resolve(id_or_prefix)
    }

    /// Removes the sandbox with this full id or unique prefix and returns it.
    pub fn delete(&self, id_or_prefix: &str) -> Result<Sandbox, StoreError> {
        let mut index = self.sandboxes.write();
        let id = index.resolve(id_or_prefix)?.to_string();
        index.remove(&id).ok_or(StoreError::NotFound { id })
    }

    /// Number of sandboxes.
    pub fn len(&self) -> usize {
        self.sandboxes.len()
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Snapshots of the sandboxes passing `filter`, sorted by id (`ListPodSandbox`).
    pub fn list(&self, filter: &SandboxFilter) -> Vec<SandboxSnapshot> {
        let index = self.sandboxes.read();
        // containerd normalises a unique prefix to the full id, then compares exactly.
        let id = index.filter_id(filter.id.as_deref());
        index
            .values()
            .filter(|sb| id.as_deref().is_none_or(|id| sb.id() == id))
            .map(Sandbox::snapshot)
            .filter(|snap| {
                filter
                    .state
                    .is_none_or(|st| snap.status.state.cri_visible() == st.cri_visible())
            })
            .filter(|snap| labels_match(&snap.metadata.labels, &filter.label_selector))
            .collect()
    }
}

/// The stable JSON form of [`NamespaceOptions`]: defined here, next to the persistence, so the
/// spec module's Rust types can change without changing what is stored in containerd. A pod's
/// own user namespace is stored as `user` (absent: the host's, as in records written before
/// user namespaces).
mod namespace_options_serde {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::spec::{IdMapping, NamespaceMode, NamespaceOptions, UserNamespace};

    #[derive(Serialize, Deserialize)]
    #[serde(remote = "NamespaceMode", rename_all = "SCREAMING_SNAKE_CASE")]
    enum ModeDef {
        Pod,
        Container,
        Node,
        Target,
    }

    #[derive(Serialize, Deserialize)]
    #[serde(remote = "IdMapping")]
    struct IdMappingDef {
        container_id: u32,
        host_id: u32,
        length: u32,
    }

    #[derive(Serialize, Deserialize)]
    #[serde(remote = "UserNamespace")]
    struct UserDef {
        #[serde(with = "IdMappingDef")]
        uids: IdMapping,
        #[serde(with = "IdMappingDef")]
        gids: IdMapping,
    }

    /// `Option<UserNamespace>` through [`UserDef`].
    mod user_opt {
        use super::*;

        #[derive(Serialize, Deserialize)]
        struct Wrap(#[serde(with = "UserDef")] UserNamespace);

        pub(super) fn serialize<S: Serializer>(
            v: &Option<UserNamespace>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            v.map(Wrap).serialize(s)
        }

        pub(super) fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<UserNamespace>, D::Error> {
            Ok(Option::<Wrap>::deserialize(d)?.map(|Wrap(u)| u))
        }
    }

    #[derive(Serialize, Deserialize)]
    #[serde(remote = "NamespaceOptions")]
    struct OptionsDef {
        #[serde(with = "ModeDef")]
        network: NamespaceMode,
        #[serde(with = "ModeDef")]
        pid: NamespaceMode,
        #[serde(with = "ModeDef")]
        ipc: NamespaceMode,
        #[serde(with = "user_opt", default, skip_serializing_if = "Option::is_none")]
        user: Option<UserNamespace>,
    }

    pub(super) fn serialize<S: Serializer>(v: &NamespaceOptions, s: S) -> Result<S::Ok, S::Error> {
        OptionsDef::serialize(v, s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<NamespaceOptions, D::Error> {
        OptionsDef::deserialize(d)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn meta(id: &str, name: &str, labels: &[(&str, &str)]) -> SandboxMetadata {
        SandboxMetadata {
            id: id.into(),
            name: name.into(),
            namespace: "default".into(),
            uid: format!("uid-{name}"),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }
    }

    fn store() -> SandboxStore {
        let s = SandboxStore::new();
        s.add(Sandbox::new(
            meta("aaa111", "web", &[("app", "web"), ("tier", "front")]),
            SandboxStatus::ready(10),
        ))
        .unwrap();
        s.add(Sandbox::new(
            meta("aaa222", "db", &[("app", "db")]),
            SandboxStatus::ready(11),
        ))
        .unwrap();
        let stopped = Sandbox::new(
            meta("bbb333", "old", &[("app", "web")]),
            SandboxStatus::ready(12),
        );
        let _ = stopped.record_exit(0, 5);
        s.add(stopped).unwrap();
        s.add(Sandbox::new(
            meta("ccc444", "lost", &[]),
            SandboxStatus::default(),
        ))
        .unwrap();
        s
    }

    fn ids(v: Vec<SandboxSnapshot>) -> Vec<String> {
        v.into_iter().map(|s| s.metadata.id.clone()).collect()
    }

    #[test]
    fn add_get_delete() {
        let s = store();
        assert_eq!(s.len(), 4);
        assert_eq!(s.get("aaa1").unwrap().metadata().name, "web");
        assert!(matches!(
            s.get("aaa"),
            Err(StoreError::Ambiguous { matches: 2, .. })
        ));
        assert!(matches!(s.get("zzz"), Err(StoreError::NotFound { .. })));
        assert_eq!(
            s.add(Sandbox::new(
                meta("aaa111", "x", &[]),
                SandboxStatus::default()
            )),
            Err(StoreError::AlreadyExists {
                id: "aaa111".into()
            })
        );
        assert_eq!(s.delete("bbb").unwrap().id(), "bbb333");
        assert!(s.get("bbb333").is_err());
        assert!(s.delete("bbb333").is_err());
        assert_eq!(s.resolve("ccc").unwrap(), "ccc444");
    }

    #[test]
    fn list_without_filter_is_everything_sorted() {
        assert_eq!(
            ids(store().list(&SandboxFilter::default())),
            ["aaa111", "aaa222", "bbb333", "ccc444"]
        );
    }

    #[test]
    fn filter_by_id_full_prefix_ambiguous() {
        let s = store();
        let by = |id: &str| {
            ids(s.list(&SandboxFilter {
                id: Some(id.into()),
                ..Default::default()
            }))
        };
        assert_eq!(by("aaa222"), ["aaa222"]);
        assert_eq!(by("bb"), ["bbb333"]);
        assert!(by("aaa").is_empty(), "ambiguous prefix matches nothing");
        assert!(by("zz").is_empty());
        assert_eq!(by("").len(), 4, "empty id does not filter");
    }

    #[test]
    fn filter_by_state_treats_unknown_as_not_ready() {
        let s = store();
        let by = |st| {
            ids(s.list(&SandboxFilter {
                state: Some(st),
                ..Default::default()
            }))
        };
        assert_eq!(by(SandboxState::Ready), ["aaa111", "aaa222"]);
        assert_eq!(by(SandboxState::NotReady), ["bbb333", "ccc444"]);
    }

    #[test]
    fn filter_by_labels_all_must_match() {
        let s = store();
        let by = |sel: &[(&str, &str)]| {
            ids(s.list(&SandboxFilter {
                label_selector: sel
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ..Default::default()
            }))
        };
        assert_eq!(by(&[("app", "web")]), ["aaa111", "bbb333"]);
        assert_eq!(by(&[("app", "web"), ("tier", "front")]), ["aaa111"]);
        assert!(by(&[("app", "web"), ("tier", "back")]).is_empty());
        assert!(by(&[("nope", "")]).is_empty());
    }

    #[test]
    fn filters_combine() {
        let s = store();
        let f = SandboxFilter {
            id: Some("bbb".into()),
            state: Some(SandboxState::Ready),
            label_selector: HashMap::new(),
        };
        assert!(s.list(&f).is_empty());
    }

    #[test]
    fn status_transitions_first_exit_wins() {
        let sb = Sandbox::new(meta("x", "x", &[]), SandboxStatus::default());
        assert!(sb.set_ready(7));
        assert_eq!(sb.status(), SandboxStatus::ready(7));
        assert_eq!(sb.record_exit(137, 9), ExitOutcome::Recorded);
        assert_eq!(sb.record_exit(0, 10), ExitOutcome::AlreadyExited);
        let st = sb.status();
        assert_eq!(
            (st.state, st.exit_code, st.exited_at, st.pid),
            (SandboxState::NotReady, Some(137), 9, 0)
        );
        // Once exited it never becomes Ready or Unknown again.
        assert!(!sb.set_ready(8));
        sb.mark_unknown();
        assert_eq!(sb.status().state, SandboxState::NotReady);
    }

    #[test]
    fn stop_and_unknown() {
        let sb = Sandbox::new(meta("x", "x", &[]), SandboxStatus::ready(3));
        sb.mark_unknown();
        assert_eq!(sb.status().state, SandboxState::Unknown);
        assert!(sb.set_ready(4), "a lost sandbox found running again");
        sb.set_not_ready();
        assert_eq!(sb.status().state, SandboxState::NotReady);
        // Stopped is final, and its exit can still be recorded afterwards.
        assert!(!sb.set_ready(5));
        sb.mark_unknown();
        assert_eq!(sb.status().state, SandboxState::NotReady);
        assert_eq!(sb.record_exit(0, 1), ExitOutcome::Recorded);
    }

    #[test]
    fn name_key() {
        let mut m = meta("x", "web", &[]);
        m.attempt = 3;
        assert_eq!(m.name_key(), "web_default_uid-web_3");
    }

    #[test]
    fn handle_survives_removal() {
        let s = store();
        let sb = s.get("aaa111").unwrap();
        s.delete("aaa111").unwrap();
        assert_eq!(sb.record_exit(0, 1), ExitOutcome::Recorded);
        assert!(s.get("aaa111").is_err(), "an exit does not resurrect it");
    }
}
