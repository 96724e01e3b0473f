//! Recording fakes of what lifecycle uses (containerd's records, tasks, snapshots and leases,
//! the local images, the pod network): each call is stored with its typed arguments in one
//! shared [`CallLog`], in order, and any operation can be made to fail on its Nth call (as
//! youki's `TestHelperSyscall` does). Calls of CNI ADD, lease create, snapshot prepare and task
//! create can be held until another call was made or has returned ([`CallLog::hold`]), which
//! orders an operation's concurrent steps as a test needs.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::backend_error::{BackendCode, BackendError};
use crate::images::backend::{Leases, Mount, Snapshots, Usage};
use crate::images::pull::PullError;
use crate::images::store::ImageInfo;
use crate::lifecycle::backend::{
    ContainerRecord, Containers, ExecStdio, Exit, ForceDeleted, LocalImages, OciCliError,
    OciRuntime, PodNetwork, ShimRuntime, TaskSpec, TaskState, TaskStatus, Tasks,
};
use crate::net::cni::orphans::Orphans;
use crate::net::netns::NetnsError;
use crate::net::{NetError, PodNetInfo};

/// One call, with its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// `Containers::create` of this id.
    RecordCreate(String),
    /// `Containers::get`.
    RecordGet(String),
    /// `Containers::set_extension` (id, key).
    RecordSetExtension(String, String),
    /// `Containers::delete`.
    RecordDelete(String),
    /// `Tasks::create` (container id, rootfs mounts, stdout FIFO set).
    TaskCreate(String),
    /// `Tasks::start`.
    TaskStart(String),
    /// `Tasks::kill` (id, signal, all).
    TaskKill(String, u32, bool),
    /// `Tasks::wait`.
    TaskWait(String),
    /// `Tasks::state`.
    TaskState(String),
    /// `Tasks::delete`.
    TaskDelete(String),
    /// `Snapshots::prepare` (lease, key, parent).
    /// Lease, key, parent, and the labels sorted.
    SnapshotPrepare(String, String, String, Vec<(String, String)>),
    /// `Snapshots::view` (lease, key, parent, labels sorted).
    SnapshotView(String, String, String, Vec<(String, String)>),
    /// `Snapshots::mounts`.
    SnapshotMounts(String),
    /// `Snapshots::remove`.
    SnapshotRemove(String),
    /// `Leases::create`.
    LeaseCreate(String),
    /// `Leases::delete`.
    LeaseDelete(String),
    /// `PodNetwork::create_netns`.
    /// Pod id, and the user namespace owning the netns (a userns pod's).
    NetnsCreate(String, Option<crate::spec::UserNamespace>),
    /// `PodNetwork::remove_netns`.
    NetnsRemove(PathBuf),
    /// A pod's IPC and UTS namespaces pinned beside its netns (a pod without a pause
    /// container): the netns path and what they start with.
    NetnsPin(PathBuf, crate::net::netns::PodNamespaces),
    /// `PodNetwork::setup` (CNI ADD) of this pod id.
    CniAdd(String),
    /// `PodNetwork::teardown` (CNI DEL) of this pod id.
    CniDel(String),
    /// `PodNetwork::await_orphaned_plugins` of this pod id.
    CniOrphans(String),
    /// `LocalImages::pull`.
    ImagePull(String),
    /// `OciRuntime::force_delete` (id, runtime binary name).
    OciForceDelete(String, String),
    /// An NRI hook ([`FakeNri`]): its op (`nri.<event>`), the pod's or container's id, and
    /// whether the index listed that object when the hook ran.
    Nri(&'static str, String, bool),
}

impl Call {
    /// The operation's name, as failures are scripted by.
    pub fn op(&self) -> &'static str {
        match self {
            Call::RecordCreate(_) => "containers.create",
            Call::RecordGet(_) => "containers.get",
            Call::RecordSetExtension(..) => "containers.set_extension",
            Call::RecordDelete(_) => "containers.delete",
            Call::TaskCreate(_) => "tasks.create",
            Call::TaskStart(_) => "tasks.start",
            Call::TaskKill(..) => "tasks.kill",
            Call::TaskWait(_) => "tasks.wait",
            Call::TaskState(_) => "tasks.state",
            Call::TaskDelete(_) => "tasks.delete",
            Call::SnapshotPrepare(..) => "snapshots.prepare",
            Call::SnapshotView(..) => "snapshots.view",
            Call::SnapshotMounts(_) => "snapshots.mounts",
            Call::SnapshotRemove(_) => "snapshots.remove",
            Call::LeaseCreate(_) => "leases.create",
            Call::LeaseDelete(_) => "leases.delete",
            Call::NetnsCreate(..) => "network.create_netns",
            Call::NetnsRemove(_) => "network.remove_netns",
            Call::NetnsPin(..) => "network.pin_namespaces",
            Call::CniAdd(_) => "network.setup",
            Call::CniDel(_) => "network.teardown",
            Call::CniOrphans(_) => "network.await_orphaned_plugins",
            Call::ImagePull(_) => "images.pull",
            Call::OciForceDelete(..) => "oci.force_delete",
            Call::Nri(op, ..) => op,
        }
    }
}

/// Until when a held call waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// A call of this op was made.
    Called(&'static str),
    /// A call of this op (one with a hold point) returned.
    Returned(&'static str),
}

#[derive(Default)]
struct LogState {
    calls: Vec<Call>,
    counts: HashMap<&'static str, usize>,
    /// op → the call numbers (1-based) that fail.
    failing: HashMap<&'static str, HashSet<usize>>,
    /// op → until when its calls wait before they return.
    holds: HashMap<&'static str, Until>,
    /// Ops (with a hold point) whose calls returned.
    returned: HashSet<&'static str>,
}

/// The shared, ordered record of every call to every fake, and the failure script.
#[derive(Clone, Default)]
pub struct CallLog(Arc<Mutex<LogState>>);

impl CallLog {
    fn state(&self) -> std::sync::MutexGuard<'_, LogState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes the `nth` (1-based) call of `op` fail.
    pub fn fail(&self, op: &'static str, nth: usize) {
        self.state().failing.entry(op).or_default().insert(nth);
    }

    /// Records `call`; whether it is scripted to fail.
    fn record(&self, call: Call) -> bool {
        let mut s = self.state();
        let op = call.op();
        let n = {
            let c = s.counts.entry(op).or_default();
            *c += 1;
            *c
        };
        s.calls.push(call);
        s.failing.get(op).is_some_and(|f| f.contains(&n))
    }

    /// Makes calls of `op` (one with a hold point: `network.setup`, `leases.create`,
    /// `snapshots.prepare`, `tasks.create`, `containers.set_extension`) wait, once made and decided, until `until`.
    pub fn hold(&self, op: &'static str, until: Until) {
        self.state().holds.insert(op, until);
    }

    /// The hold point of a call of `op`: waits as [`CallLog::hold`] said (at most 10 s, then
    /// goes on: the test's assertions report the order it did not get).
    async fn held(&self, op: &'static str) {
        let until = self.state().holds.get(op).copied();
        let Some(until) = until else {
            return;
        };
        let done = || {
            let s = self.state();
            match until {
                Until::Called(other) => s.calls.iter().any(|c| c.op() == other),
                Until::Returned(other) => s.returned.contains(other),
            }
        };
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while !done() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }

    /// A call of `op` (one with a hold point) returns now.
    fn returned(&self, op: &'static str) {
        self.state().returned.insert(op);
    }

    /// Records `call`, waits at its hold point, and says whether it is scripted to fail.
    async fn record_held(&self, call: Call) -> bool {
        let op = call.op();
        let fail = self.record(call);
        self.held(op).await;
        self.returned(op);
        fail
    }

    /// Every call so far.
    pub fn calls(&self) -> Vec<Call> {
        self.state().calls.clone()
    }

    /// The calls after the first call to `op` that failed (the rollback, for an operation
    /// that stops at its first failure).
    pub fn after_failure(&self) -> Vec<Call> {
        let s = self.state();
        let mut counts: HashMap<&'static str, usize> = HashMap::new();
        for (i, call) in s.calls.iter().enumerate() {
            let n = counts.entry(call.op()).or_default();
            *n += 1;
            if s.failing.get(call.op()).is_some_and(|f| f.contains(n)) {
                return s.calls[i + 1..].to_vec();
            }
        }
        Vec::new()
    }

    /// Forgets the calls so far and restarts the call counts (the script and holds stay).
    pub fn clear(&self) {
        let mut s = self.state();
        s.calls.clear();
        s.counts.clear();
        s.returned.clear();
    }
}

fn failed(op: &'static str) -> BackendError {
    BackendError::Call {
        address: "/fake/containerd.sock".into(),
        op,
        code: BackendCode::Unavailable,
        message: "scripted failure".into(),
    }
}

/// containerd's answer for a task whose shim connection is closed (a dead shim).
fn shim_closed(op: &'static str) -> BackendError {
    BackendError::Call {
        address: "/fake/containerd.sock".into(),
        op,
        code: BackendCode::Unknown,
        message: "ttrpc: closed".into(),
    }
}

/// containerd, faked: records, tasks, snapshots and leases.
#[derive(Clone)]
pub struct FakeContainerd {
    log: CallLog,
    records: Arc<Mutex<HashMap<String, ContainerRecord>>>,
    tasks: Arc<Mutex<HashMap<String, TaskState>>>,
    /// The `runtime_path` each task was created with.
    task_runtime_paths: Arc<Mutex<HashMap<String, String>>>,
    /// Tasks whose shim died: containerd answers "ttrpc: closed" for them.
    dead_shims: Arc<Mutex<HashSet<String>>>,
    /// Tasks whose Wait alone fails with a closed shim connection (the task is fine).
    broken_waits: Arc<Mutex<HashSet<String>>>,
    /// What prepared snapshots mount: a bind mount of this directory.
    rootfs: PathBuf,
    /// Whether a prepare with idmap labels gets `uidmap=`/`gidmap=` options back (the
    /// overlayfs snapshotter where the kernel can idmap layers); default yes.
    idmaps: Arc<Mutex<bool>>,
}

impl FakeContainerd {
    /// A containerd whose snapshots bind-mount `rootfs`.
    pub fn new(log: CallLog, rootfs: PathBuf) -> Self {
        Self {
            log,
            records: Default::default(),
            tasks: Default::default(),
            task_runtime_paths: Default::default(),
            dead_shims: Default::default(),
            broken_waits: Default::default(),
            rootfs,
            idmaps: Arc::new(Mutex::new(true)),
        }
    }

    /// Makes prepared snapshots ignore idmap labels, as a snapshotter that cannot idmap.
    pub fn without_idmaps(&self) {
        *Self::lock(&self.idmaps) = false;
    }

    fn check(&self, call: Call) -> Result<(), BackendError> {
        let op = call.op();
        if self.log.record(call) {
            return Err(failed(op));
        }
        Ok(())
    }

    /// [`FakeContainerd::check`] with a hold point.
    async fn check_held(&self, call: Call) -> Result<(), BackendError> {
        let op = call.op();
        if self.log.record_held(call).await {
            return Err(failed(op));
        }
        Ok(())
    }

    fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a record with this id exists.
    pub fn has_record(&self, id: &str) -> bool {
        Self::lock(&self.records).contains_key(id)
    }

    /// The record with this id.
    pub fn record(&self, id: &str) -> Option<ContainerRecord> {
        Self::lock(&self.records).get(id).cloned()
    }

    /// The shim path task `id` was last created with.
    pub fn task_runtime_path(&self, id: &str) -> Option<String> {
        Self::lock(&self.task_runtime_paths).get(id).cloned()
    }

    /// Kills task `id`'s shim: containerd keeps the task but every call on it fails with
    /// its closed shim connection (as containerd 2.3.4 for a sandboxed task).
    pub fn kill_shim(&self, id: &str) {
        Self::lock(&self.dead_shims).insert(id.to_string());
    }

    /// Makes task `id`'s Wait fail with a closed shim connection while the task stays
    /// readable (`mend_wait` undoes it).
    pub fn break_wait(&self, id: &str) {
        Self::lock(&self.broken_waits).insert(id.to_string());
    }

    /// Undoes [`FakeContainerd::break_wait`].
    pub fn mend_wait(&self, id: &str) {
        Self::lock(&self.broken_waits).remove(id);
    }

    /// containerd's own dead-shim cleanup of task `id` (an unsandboxed one): the task goes.
    pub fn clean_up_dead_shim(&self, id: &str) {
        Self::lock(&self.dead_shims).remove(id);
        Self::lock(&self.tasks).remove(id);
    }

    /// Sets record `id`'s `sandbox` field (e.g. "" for a container made before remora set it).
    pub fn set_record_sandbox(&self, id: &str, sandbox: &str) {
        if let Some(r) = Self::lock(&self.records).get_mut(id) {
            r.sandbox = sandbox.to_string();
        }
    }

    fn shim_is_dead(&self, id: &str, op: &'static str) -> Result<(), BackendError> {
        if Self::lock(&self.dead_shims).contains(id) {
            return Err(shim_closed(op));
        }
        Ok(())
    }

    /// Whether a task for this id exists.
    pub fn has_task(&self, id: &str) -> bool {
        Self::lock(&self.tasks).contains_key(id)
    }

    fn mounts(&self) -> Vec<Mount> {
        vec![Mount {
            kind: "bind".into(),
            source: self.rootfs.display().to_string(),
            target: String::new(),
            options: vec!["rbind".into(), "ro".into()],
        }]
    }
}

#[async_trait::async_trait]
impl Containers for FakeContainerd {
    async fn create(&self, record: ContainerRecord) -> Result<(), BackendError> {
        self.check(Call::RecordCreate(record.id.clone()))?;
        Self::lock(&self.records).insert(record.id.clone(), record);
        Ok(())
    }
    async fn get(&self, id: &str) -> Result<Option<ContainerRecord>, BackendError> {
        self.check(Call::RecordGet(id.into()))?;
        Ok(Self::lock(&self.records).get(id).cloned())
    }
    async fn list(&self) -> Result<Vec<ContainerRecord>, BackendError> {
        Ok(Self::lock(&self.records).values().cloned().collect())
    }
    async fn set_extension(&self, id: &str, key: &str, value: Vec<u8>) -> Result<(), BackendError> {
        self.check_held(Call::RecordSetExtension(id.into(), key.into()))
            .await?;
        if let Some(r) = Self::lock(&self.records).get_mut(id) {
            r.extensions.insert(key.into(), value);
        }
        Ok(())
    }
    async fn delete(&self, id: &str) -> Result<(), BackendError> {
        self.check(Call::RecordDelete(id.into()))?;
        Self::lock(&self.records).remove(id);
        Ok(())
    }
}

#[async_trait::async_trait]
impl Tasks for FakeContainerd {
    async fn create(&self, spec: TaskSpec) -> Result<u32, BackendError> {
        self.check_held(Call::TaskCreate(spec.container_id.clone()))
            .await?;
        let state = TaskState {
            status: TaskStatus::Created,
            pid: 4242,
            exit_status: 0,
            exited_at: None,
        };
        Self::lock(&self.task_runtime_paths)
            .insert(spec.container_id.clone(), spec.runtime_path.clone());
        Self::lock(&self.tasks).insert(spec.container_id, state);
        Ok(4242)
    }
    async fn start(&self, id: &str) -> Result<u32, BackendError> {
        self.check(Call::TaskStart(id.into()))?;
        if let Some(t) = Self::lock(&self.tasks).get_mut(id) {
            t.status = TaskStatus::Running;
        }
        Ok(4242)
    }
    async fn kill(&self, id: &str, signal: u32, all: bool) -> Result<(), BackendError> {
        self.check(Call::TaskKill(id.into(), signal, all))?;
        self.shim_is_dead(id, "Tasks.Kill")?;
        if let Some(t) = Self::lock(&self.tasks).get_mut(id) {
            t.status = TaskStatus::Stopped;
            t.exit_status = 128 + signal;
        }
        Ok(())
    }
    async fn wait(&self, id: &str) -> Result<Exit, BackendError> {
        self.check(Call::TaskWait(id.into()))?;
        loop {
            self.shim_is_dead(id, "Tasks.Wait")?;
            if Self::lock(&self.broken_waits).contains(id) {
                return Err(shim_closed("Tasks.Wait"));
            }
            match Self::lock(&self.tasks).get(id) {
                None => {
                    return Err(BackendError::Call {
                        address: "/fake/containerd.sock".into(),
                        op: "Tasks.Wait",
                        code: BackendCode::NotFound,
                        message: "no task".into(),
                    })
                }
                Some(t) if t.status == TaskStatus::Stopped => {
                    return Ok(Exit {
                        status: t.exit_status,
                        at: None,
                    })
                }
                Some(_) => {}
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
    async fn state(&self, id: &str) -> Result<Option<TaskState>, BackendError> {
        self.check(Call::TaskState(id.into()))?;
        // containerd 2.3.4 maps the closed shim connection of `State` to NotFound.
        if Self::lock(&self.dead_shims).contains(id) {
            return Ok(None);
        }
        Ok(Self::lock(&self.tasks).get(id).copied())
    }
    async fn delete(&self, id: &str) -> Result<Option<Exit>, BackendError> {
        self.check(Call::TaskDelete(id.into()))?;
        let task = Self::lock(&self.tasks).remove(id);
        // containerd 2.3.4 drops the task of a dead shim, and fails the delete.
        if Self::lock(&self.dead_shims).remove(id) {
            return Err(shim_closed("Tasks.Delete"));
        }
        Ok(task.map(|t| Exit {
            status: t.exit_status,
            at: None,
        }))
    }
    async fn exec(
        &self,
        _container_id: &str,
        _exec_id: &str,
        _process: Vec<u8>,
        _stdio: ExecStdio,
    ) -> Result<(), BackendError> {
        Err(failed("Tasks.Exec"))
    }
    async fn start_exec(&self, _: &str, _: &str) -> Result<u32, BackendError> {
        Err(failed("Tasks.Start"))
    }
    async fn wait_exec(&self, _: &str, _: &str) -> Result<Exit, BackendError> {
        Err(failed("Tasks.Wait"))
    }
    async fn kill_exec(&self, _: &str, _: &str, _: u32) -> Result<(), BackendError> {
        Err(failed("Tasks.Kill"))
    }
    async fn resize_pty(&self, _: &str, _: &str, _: (u32, u32)) -> Result<(), BackendError> {
        Err(failed("Tasks.ResizePty"))
    }
    async fn close_stdin(&self, _: &str, _: &str) -> Result<(), BackendError> {
        Err(failed("Tasks.CloseIO"))
    }
    async fn update_resources(&self, _: &str, _: Vec<u8>) -> Result<(), BackendError> {
        Err(failed("Tasks.Update"))
    }
    async fn delete_exec(&self, _: &str, _: &str) -> Result<(), BackendError> {
        Ok(())
    }
}

#[async_trait::async_trait]
impl Snapshots for FakeContainerd {
    async fn exists(&self, _: &str, _: &str) -> Result<bool, BackendError> {
        Ok(false)
    }
    async fn prepare(
        &self,
        lease: &str,
        _snapshotter: &str,
        key: &str,
        parent: &str,
        labels: &HashMap<String, String>,
    ) -> Result<Vec<Mount>, BackendError> {
        let mut sorted: Vec<(String, String)> =
            labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        sorted.sort();
        self.check_held(Call::SnapshotPrepare(
            lease.into(),
            key.into(),
            parent.into(),
            sorted,
        ))
        .await?;
        let mut mounts = self.mounts();
        if *Self::lock(&self.idmaps) {
            for (label, option) in [
                (crate::lifecycle::userns::LABEL_UID_MAPPING, "uidmap"),
                (crate::lifecycle::userns::LABEL_GID_MAPPING, "gidmap"),
            ] {
                if let Some(v) = labels.get(label) {
                    mounts[0].options.push(format!("{option}={v}"));
                }
            }
        }
        Ok(mounts)
    }
    async fn view(
        &self,
        lease: &str,
        _snapshotter: &str,
        key: &str,
        parent: &str,
        labels: &HashMap<String, String>,
    ) -> Result<Vec<Mount>, BackendError> {
        let mut sorted: Vec<(String, String)> =
            labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        sorted.sort();
        self.check(Call::SnapshotView(
            lease.into(),
            key.into(),
            parent.into(),
            sorted,
        ))?;
        let mut mounts = self.mounts();
        if *Self::lock(&self.idmaps) {
            for (label, option) in [
                (crate::lifecycle::userns::LABEL_UID_MAPPING, "uidmap"),
                (crate::lifecycle::userns::LABEL_GID_MAPPING, "gidmap"),
            ] {
                if let Some(v) = labels.get(label) {
                    mounts[0].options.push(format!("{option}={v}"));
                }
            }
        }
        Ok(mounts)
    }
    async fn mounts(&self, _: &str, key: &str) -> Result<Vec<Mount>, BackendError> {
        self.check(Call::SnapshotMounts(key.into()))?;
        Ok(self.mounts())
    }
    async fn commit(
        &self,
        _: &str,
        _: &str,
        _: &str,
        _: &str,
        _: HashMap<String, String>,
    ) -> Result<(), BackendError> {
        Err(failed("Snapshots.Commit"))
    }
    async fn remove(&self, _: &str, key: &str) -> Result<(), BackendError> {
        self.check(Call::SnapshotRemove(key.into()))
    }
    async fn list(&self, _: &str) -> Result<Vec<String>, BackendError> {
        Ok(Vec::new())
    }
    async fn usage(&self, _: &str, _: &str) -> Result<Usage, BackendError> {
        Ok(Usage::default())
    }
    async fn root(&self, _: &str) -> Result<Option<PathBuf>, BackendError> {
        Ok(None)
    }
}

#[async_trait::async_trait]
impl Leases for FakeContainerd {
    async fn create(&self, id: &str, _expire_secs: u64) -> Result<(), BackendError> {
        self.check_held(Call::LeaseCreate(id.into())).await
    }
    async fn delete(&self, id: &str, _sync: bool) -> Result<(), BackendError> {
        self.check(Call::LeaseDelete(id.into()))
    }
    async fn add_content(&self, _: &str, _: &str) -> Result<(), BackendError> {
        Ok(())
    }
    async fn list(&self) -> Result<Vec<(String, Option<std::time::SystemTime>)>, BackendError> {
        Ok(Vec::new())
    }
}

/// The pod network, faked: namespaces are plain files in a temp dir.
pub struct FakeNetwork {
    log: CallLog,
    dir: PathBuf,
}

impl FakeNetwork {
    /// Namespaces as files under `dir`.
    pub fn new(log: CallLog, dir: PathBuf) -> Self {
        Self { log, dir }
    }
}

fn netns_failed(path: &Path) -> NetnsError {
    NetnsError::Io {
        action: "create",
        path: path.to_path_buf(),
        source: std::io::Error::other("scripted failure"),
    }
}

#[async_trait::async_trait]
impl PodNetwork for FakeNetwork {
    async fn create_netns(
        &self,
        id: &str,
        user: Option<&crate::spec::UserNamespace>,
    ) -> Result<PathBuf, NetnsError> {
        let path = self.dir.join(id);
        if self.log.record(Call::NetnsCreate(id.into(), user.copied())) {
            return Err(netns_failed(&path));
        }
        Ok(path)
    }
    async fn remove_netns(&self, path: &Path) -> Result<(), NetnsError> {
        if self.log.record(Call::NetnsRemove(path.to_path_buf())) {
            return Err(netns_failed(path));
        }
        Ok(())
    }
    async fn pin_namespaces(
        &self,
        netns: &Path,
        pod: crate::net::netns::PodNamespaces,
    ) -> Result<(), NetnsError> {
        if self.log.record(Call::NetnsPin(netns.to_path_buf(), pod)) {
            return Err(netns_failed(netns));
        }
        Ok(())
    }
    async fn setup(&self, pod: &PodNetInfo) -> Result<Vec<IpAddr>, NetError> {
        if self.log.record_held(Call::CniAdd(pod.id.clone())).await {
            return Err(NetError::NoPodIp {
                network: "fake".into(),
                rollback: None,
            });
        }
        Ok(vec!["10.88.0.7".parse().expect("a literal address")])
    }
    async fn teardown(&self, pod: &PodNetInfo) -> Result<(), NetError> {
        if self.log.record(Call::CniDel(pod.id.clone())) {
            return Err(NetError::Netns(netns_failed(&pod.netns_path)));
        }
        Ok(())
    }
    async fn await_orphaned_plugins(&self, id: &str) -> Result<Orphans, NetError> {
        if self.log.record(Call::CniOrphans(id.into())) {
            return Err(NetError::Netns(netns_failed(&self.dir.join(id))));
        }
        Ok(Orphans::default())
    }
}

/// Local images, faked: a fixed set.
pub struct FakeImages {
    log: CallLog,
    images: Vec<(String, ImageInfo)>,
}

impl FakeImages {
    /// These images, by reference.
    pub fn new(log: CallLog, images: Vec<(String, ImageInfo)>) -> Self {
        Self { log, images }
    }
}

#[async_trait::async_trait]
impl LocalImages for FakeImages {
    fn find(&self, image: &str) -> Option<ImageInfo> {
        self.get(image)
    }
    fn get(&self, reference: &str) -> Option<ImageInfo> {
        self.images
            .iter()
            .find(|(r, i)| r == reference || i.id == reference)
            .map(|(_, i)| i.clone())
    }
    async fn pull(&self, reference: &str) -> Result<ImageInfo, PullError> {
        self.log.record(Call::ImagePull(reference.into()));
        self.get(reference).ok_or_else(|| PullError::ShuttingDown {
            reference: reference.into(),
        })
    }
}

/// The OCI runtime's command line, faked: force-deletes answer what the test scripted.
#[derive(Clone)]
pub struct FakeOci {
    log: CallLog,
    answer: Arc<Mutex<ForceDeleted>>,
}

impl FakeOci {
    /// A runtime whose containers are running until force-deleted.
    pub fn new(log: CallLog) -> Self {
        Self {
            log,
            answer: Arc::new(Mutex::new(ForceDeleted::WasRunning)),
        }
    }

    /// What the next force-deletes say the container was.
    pub fn answer(&self, answer: ForceDeleted) {
        *self.answer.lock().unwrap_or_else(|p| p.into_inner()) = answer;
    }
}

#[async_trait::async_trait]
impl OciRuntime for FakeOci {
    async fn force_delete(
        &self,
        runtime: &ShimRuntime,
        id: &str,
    ) -> Result<ForceDeleted, OciCliError> {
        let binary = runtime
            .options
            .as_ref()
            .map(|o| o.binary_name.clone())
            .unwrap_or_default();
        self.log.record(Call::OciForceDelete(id.into(), binary));
        Ok(*self.answer.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// A recording NRI: each hook is a [`Call::Nri`] in the shared log (whether its object was
/// indexed when it ran), and fails when the log's script says so. CreateContainer adds
/// `NRI_ADDED=1` to the container's environment, as a plugin's adjustment would.
pub struct FakeNri {
    log: CallLog,
    pods: std::sync::OnceLock<std::sync::Weak<crate::lifecycle::Pods>>,
}

impl FakeNri {
    /// Hooks `pods` up to a new fake recording into `log`.
    pub fn install(log: CallLog, pods: &Arc<crate::lifecycle::Pods>) -> Arc<FakeNri> {
        let fake = Arc::new(FakeNri {
            log,
            pods: std::sync::OnceLock::new(),
        });
        let _ = fake.pods.set(Arc::downgrade(pods));
        pods.set_nri(fake.clone());
        fake
    }

    fn pods(&self) -> Arc<crate::lifecycle::Pods> {
        self.pods
            .get()
            .and_then(std::sync::Weak::upgrade)
            .expect("the pods the fake is installed in")
    }

    fn pod_call(&self, op: &'static str, id: &str) -> Result<(), NriError> {
        let listed = self.pods().sandboxes.get(id).is_ok();
        self.outcome(op, Call::Nri(op, id.to_string(), listed))
    }

    fn container_call(&self, op: &'static str, id: &str) -> Result<(), NriError> {
        let listed = self.pods().containers_store.get(id).is_ok();
        self.outcome(op, Call::Nri(op, id.to_string(), listed))
    }

    fn outcome(&self, op: &'static str, call: Call) -> Result<(), NriError> {
        if self.log.record(call) {
            return Err(NriError::Plugin {
                plugin: "00-fake".into(),
                event: op.into(),
                code: Some(crate::backend_error::BackendCode::Unknown),
                message: "scripted failure".into(),
            });
        }
        Ok(())
    }
}

use crate::lifecycle::nri::{NriError, NriHooks, SyncBlock};
use crate::store::{ContainerSnapshot, SandboxSnapshot};

#[async_trait::async_trait]
impl NriHooks for FakeNri {
    async fn block_sync(&self) -> SyncBlock {
        SyncBlock::new(())
    }
    async fn run_pod_sandbox(&self, pod: &SandboxSnapshot) -> Result<(), NriError> {
        self.pod_call("nri.run_pod_sandbox", &pod.metadata.id)
    }
    async fn stop_pod_sandbox(&self, pod: &SandboxSnapshot) {
        let _ = self.pod_call("nri.stop_pod_sandbox", &pod.metadata.id);
    }
    async fn remove_pod_sandbox(&self, pod: &SandboxSnapshot) {
        let _ = self.pod_call("nri.remove_pod_sandbox", &pod.metadata.id);
    }
    async fn update_pod_sandbox(
        &self,
        pod: &SandboxSnapshot,
        _overhead: Option<&crate::spec::Resources>,
        _resources: Option<&crate::spec::Resources>,
    ) -> Result<(), NriError> {
        self.pod_call("nri.update_pod_sandbox", &pod.metadata.id)
    }
    async fn post_update_pod_sandbox(&self, pod: &SandboxSnapshot) {
        let _ = self.pod_call("nri.post_update_pod_sandbox", &pod.metadata.id);
    }
    async fn create_container(
        &self,
        _pod: &SandboxSnapshot,
        container: &ContainerSnapshot,
        spec: &mut oci_spec::runtime::Spec,
    ) -> Result<(), NriError> {
        self.container_call("nri.create_container", &container.metadata.id)?;
        if let Some(process) = spec.process_mut() {
            let mut env = process.env().clone().unwrap_or_default();
            env.push("NRI_ADDED=1".into());
            process.set_env(Some(env));
        }
        Ok(())
    }
    async fn post_create_container(&self, _pod: &SandboxSnapshot, c: &ContainerSnapshot) {
        let _ = self.container_call("nri.post_create_container", &c.metadata.id);
    }
    async fn start_container(
        &self,
        _pod: &SandboxSnapshot,
        c: &ContainerSnapshot,
    ) -> Result<(), NriError> {
        self.container_call("nri.start_container", &c.metadata.id)
    }
    async fn post_start_container(&self, _pod: &SandboxSnapshot, c: &ContainerSnapshot) {
        let _ = self.container_call("nri.post_start_container", &c.metadata.id);
    }
    async fn update_container(
        &self,
        _pod: &SandboxSnapshot,
        c: &ContainerSnapshot,
        requested: &crate::spec::Resources,
    ) -> Result<crate::spec::Resources, NriError> {
        self.container_call("nri.update_container", &c.metadata.id)?;
        Ok(requested.clone())
    }
    async fn post_update_container(&self, _pod: &SandboxSnapshot, c: &ContainerSnapshot) {
        let _ = self.container_call("nri.post_update_container", &c.metadata.id);
    }
    async fn stop_container(&self, _pod: &SandboxSnapshot, c: &ContainerSnapshot) {
        let _ = self.container_call("nri.stop_container", &c.metadata.id);
    }
    async fn remove_container(&self, _pod: &SandboxSnapshot, c: &ContainerSnapshot) {
        let _ = self.container_call("nri.remove_container", &c.metadata.id);
    }
}
