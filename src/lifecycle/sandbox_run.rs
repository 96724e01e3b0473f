//! RunPodSandbox, all or nothing, and the pause task's exit monitor.
//!
//! A pod that needs no pause container ([`needs_no_pause`]; `[runtime] pause_container =
//! "when-needed"`, the default) has none:
//!
//! ```text
//! name reserved → netns created → UTS (+ IPC) namespaces pinned beside it, with the pod's
//! hostname and sysctls ─┬─ CNI ADD ──┬─→ record (with the addresses) → holder task created
//!                       └─ pod files ┘   and started → indexed as Ready, with an exit monitor
//! ```
//!
//! No pause image, lease, snapshot or process. The holder task (its spec has no process and
//! `spec::annotations::POD_HOLDER`) starts the pod's shim, which runs nothing for it and stays
//! until StopPodSandbox kills and deletes it: the pod's containers are put in that shim by the
//! pod's id, as a pause container's pod's are, and no container's exit or delete can end the
//! shim under a container being created (without it the shim would go with a pod's last task
//! while containerd was handing it the next one). Only remora's shim can hold a pod without a
//! process: pods of other handlers get a pause container. The rollback, newest first: task,
//! record, pod files, CNI DEL, netns (and the pins with it).
//!
//! A pod with a pause container:
//!
//! ```text
//! name reserved → pause image present → netns created ─┬─ CNI ADD ─────────────────────────┬─→
//!                                                      └─ pod files (+ shm tmpfs) → creation │
//!                                                         lease → rootfs snapshot → OCI spec │
//!                                                         → container record → task created ┘
//! → the pod's addresses into the record → task started → lease dropped → indexed as Ready,
//!   with an exit monitor on the pause task
//! ```
//!
//! CNI ADD (a chain of plugin processes, the longest step before the pause task) needs only
//! the netns; the pause container needs the netns's path but not the pod's addresses, so the
//! two run concurrently in the operation's task, and the addresses join the record's
//! metadata (one `Containers.Update`) before the task starts. containerd's CRI runs them one
//! after the other (netns → CNI → sandbox container and task). Starting the pause task
//! before CNI ADD is done would save a little more but would run the pod's first process in a
//! netns still being wired; it is not done. A pause task in a netns whose interfaces are still
//! being added is harmless: nothing in it runs until the task starts.
//!
//! Both branches always run to their end, or to a step boundary: once CNI ADD has failed the
//! pause branch makes nothing more (a fast CNI failure costs no shim). A future is never
//! dropped half way through a call, which could leave something made that no undo knows of.
//! Each branch registers its undos on its own [`super::tx::Branch`], joined in a fixed order
//! whichever finished first, so the rollback is always, newest first: task, record, snapshot,
//! lease, pod files, CNI DEL, netns.
//!
//! A pod with a user namespace of its own (containerd 2.3's way): its handler must claim user
//! namespaces (`FAILED_PRECONDITION` otherwise, before anything is made); its network namespace
//! is created owned by a new user namespace with the pod's maps, pinned beside it, which the
//! pause container joins (removed with the netns on every path); its rootfs snapshot carries
//! the idmap labels ([`super::userns`]) and must come back idmapped.
//!
//! Every step that makes something registers its undo on the transaction ([`super::tx`]); if a
//! later step fails, the undos run in reverse.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use slog::{info, warn, Logger};

use super::backend::{ContainerRecord, TaskSpec};
use super::container_events::EventKind;
use super::journal::Intent;
use super::sandbox_files::{self, Dns, FilesRequest};
use super::timing::Steps;
use super::tx::{Branch, Tx, UndoLog};
use super::SandboxError;
use super::{
    exit_ns, image_config, kill_and_delete, now_ns, wait_through_outages, HandlerRuntime, Pods,
};
use crate::images::store::ImageInfo;
use crate::net::netns::PodNamespaces;
use crate::net::{PodNetInfo, PortMapping};
use crate::spec::{self, NamespaceMode, SandboxConfig};
use crate::store::persist::SANDBOX_EXTENSION;
use crate::store::{
    encode_extension, generate_id, sandbox_name_key, to_labels, ExitOutcome, Sandbox,
    SandboxMetadata, SandboxStatus,
};

/// A RunPodSandbox request in domain terms.
#[derive(Debug, Clone, Default)]
pub struct RunSandbox {
    /// The pod config.
    pub config: SandboxConfig,
    /// `metadata.attempt`.
    pub attempt: u32,
    /// Pod labels.
    pub labels: HashMap<String, String>,
    /// DNS config; `None` → the host's resolv.conf.
    pub dns: Option<Dns>,
    /// Host port mappings.
    pub port_mappings: Vec<PortMapping>,
    /// Runtime handler ("" = default).
    pub runtime_handler: String,
    /// The raw request config, kept on the record.
    pub config_json: Vec<u8>,
}

/// What the pause branch of RunPodSandbox reads.
#[derive(Clone, Copy)]
struct PauseInputs<'a> {
    /// The pod's metadata as its record starts (no addresses yet).
    metadata: &'a SandboxMetadata,
    /// The pause image.
    image: &'a ImageInfo,
    /// The pod's runtime.
    runtime: &'a HandlerRuntime,
    /// The pod's own user namespace, if any.
    user: Option<&'a crate::spec::UserNamespace>,
    /// The pod's netns; `None` on the host network.
    netns_path: Option<&'a Path>,
}

impl Pods {
    /// RunPodSandbox. Returns the sandbox id.
    pub async fn run_sandbox(self: &Arc<Self>, req: RunSandbox) -> Result<String, SandboxError> {
        let id = generate_id()?;
        let log = self.log.new(slog::o!("pod_id" => id.clone()));
        let cfg = &req.config;
        let host_network = cfg.security.namespaces.network == NamespaceMode::Node;
        let intent = Intent::Sandbox {
            id: id.clone(),
            name: cfg.name.clone(),
            namespace: cfg.namespace.clone(),
            uid: cfg.uid.clone(),
            netns_path: (!host_network).then(|| self.netns_dir.join(&id)),
        };
        self.transaction(intent, log, move |me, tx, log| {
            Box::pin(async move { me.run_inner(&req, tx, log).await })
        })
        .await
        .map(|()| id)
    }

    async fn run_inner(
        self: &Arc<Self>,
        req: &RunSandbox,
        tx: &mut Tx,
        log: &Logger,
    ) -> Result<(), SandboxError> {
        let id = &tx.id().to_string();
        let mut steps = Steps::start();
        let cfg = &req.config;
        let (handler, runtime) = match self.handlers.resolve(&req.runtime_handler) {
            Ok((name, rt)) => (name.to_string(), rt.clone()),
            Err(name) => return Err(SandboxError::UnknownRuntimeHandler(name)),
        };
        let user = cfg.security.namespaces.user;
        if user.is_some() && !runtime.features.user_namespaces {
            return Err(SandboxError::UserNamespacesUnsupported(handler));
        }
        let pinned = needs_no_pause(cfg, &runtime);
        // A pod without a pause container has its sysctls written by remora, not by runc:
        // they are checked before anything is made (a pause container's spec checks them).
        let pinned_sysctls = if pinned {
            spec::pod_sysctls(cfg)?
        } else {
            Vec::new()
        };
        // A cgroup parent the driver cannot use (a path under systemd) is the caller's error,
        // refused before anything is made rather than by the runtime when the task is created.
        spec::cgroups_path(self.host.cgroup_driver, &cfg.cgroup_parent, id)?;
        self.check_apparmor(&cfg.security, false).await?;
        let name_key = sandbox_name_key(&cfg.name, &cfg.namespace, &cfg.uid, req.attempt);
        let reservation = self.names.reserve_guarded(&name_key, id)?;

        // A pod without a pause container needs no pause image.
        let image = if pinned {
            None
        } else {
            let image = self.sandbox_image().await?;
            steps.mark("image");
            Some(image)
        };

        // No hostname asked for: the node's, as containerd does (pod names can be longer than
        // a hostname may be).
        let hostname = if cfg.hostname.is_empty() {
            self.host.node_hostname.clone()
        } else {
            cfg.hostname.clone()
        };
        let ns = &cfg.security.namespaces;
        let host_network = ns.network == NamespaceMode::Node;
        let mut netns_path = None;
        if !host_network {
            let path = self.network.create_netns(id, user.as_ref()).await?;
            steps.mark("netns");
            // Removing the netns removes the namespaces pinned beside it.
            let (network, p) = (self.network.clone(), path.clone());
            tx.on_undo("remove network namespace", async move {
                network.remove_netns(&p).await
            });
            if pinned {
                let pod = PodNamespaces {
                    hostname: hostname.clone(),
                    new_ipc: ns.ipc != NamespaceMode::Node,
                    sysctls: pinned_sysctls,
                };
                self.network.pin_namespaces(&path, pod).await?;
                steps.mark("pin_namespaces");
            }
            netns_path = Some(path);
        }
        let mut metadata = SandboxMetadata {
            id: id.to_string(),
            name: cfg.name.clone(),
            namespace: cfg.namespace.clone(),
            uid: cfg.uid.clone(),
            attempt: req.attempt,
            labels: req.labels.clone(),
            annotations: cfg.annotations.clone(),
            // The resolved name: the pod's containers run with this handler even if the
            // default changes later.
            runtime_handler: handler.clone(),
            created_at: now_ns(),
            netns_path: netns_path
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            // The addresses come from CNI ADD, running beside the pause container's creation.
            ip: String::new(),
            additional_ips: Vec::new(),
            hostname,
            log_directory: cfg.log_directory.clone(),
            namespace_options: ns.clone(),
            cgroup_parent: cfg.cgroup_parent.clone(),
            config_json: req.config_json.clone(),
            updated_resources: None,
            pinned_namespaces: pinned,
        };

        let pid = match (image, netns_path.as_deref()) {
            (Some(image), _) => {
                self.run_pause(req, tx, &mut steps, &mut metadata, &image, &runtime)
                    .await?
            }
            (None, Some(netns)) => {
                self.run_pinned(req, tx, &mut steps, &mut metadata, netns, &runtime)
                    .await?;
                0
            }
            // needs_no_pause is false for a pod on the host's network.
            (None, None) => return Err(SandboxError::Spec(spec::SpecError::PinnedWithoutNetns)),
        };

        let sandbox = Sandbox::new(metadata, SandboxStatus::ready(pid));
        // NRI's RunPodSandbox, on the pod as made and before it is indexed: while plugins
        // decide it is not listed and no container can be created in it; one refusing it
        // fails the call and the transaction undoes the pod. The sync block is held until it
        // is indexed (see `super::nri`).
        let sync_block = match self.nri() {
            Some(nri) => {
                let block = nri.block_sync().await;
                nri.run_pod_sandbox(&sandbox.snapshot()).await?;
                let (nri, pod) = (nri.clone(), sandbox.snapshot());
                tx.on_undo("tell NRI plugins the pod is gone", async move {
                    nri.remove_pod_sandbox(&pod).await;
                    Ok::<(), crate::backend_error::BackendError>(())
                });
                steps.mark("nri");
                Some(block)
            }
            None => None,
        };
        self.sandboxes.add(sandbox.clone())?;
        drop(sync_block);
        reservation.keep();
        tx.commit();
        // A holder task ends only when it is killed or its shim dies: the same monitor.
        self.monitor_exit(sandbox);
        self.events.emit(id, id, EventKind::Created, now_ns());
        self.events.emit(id, id, EventKind::Started, now_ns());
        info!(log, "pod sandbox running"; "pid" => pid, "pause_container" => !pinned, "runtime_handler" => &handler, "name" => &cfg.name, "namespace" => &cfg.namespace);
        steps.log(log, "RunPodSandbox");
        Ok(())
    }

    /// The rest of RunPodSandbox for a pod with a pause container: CNI ADD beside the pause
    /// container's creation, the addresses into its record, its task started. Returns the
    /// pause process's pid.
    async fn run_pause(
        &self,
        req: &RunSandbox,
        tx: &mut Tx,
        steps: &mut Steps,
        metadata: &mut SandboxMetadata,
        image: &ImageInfo,
        runtime: &HandlerRuntime,
    ) -> Result<u32, SandboxError> {
        let id = &tx.id().to_string();
        let cfg = &req.config;
        let user = cfg.security.namespaces.user;
        let netns_path = (!metadata.netns_path.is_empty())
            .then(|| std::path::PathBuf::from(&metadata.netns_path));

        // CNI ADD needs the netns and nothing else; the pause container needs the netns's
        // path, not the pod's addresses. `join!`, never `try_join!`: each branch ends on its
        // own (at a step boundary at the earliest, never dropped in the middle of a call that
        // may have made something), and their undos join the transaction in a fixed order:
        // the pause container's (task, record, snapshot, lease, pod files) run before CNI
        // DEL, which runs before the netns is removed.
        let network_failed = AtomicBool::new(false);
        let (mut network_undo, mut pause_undo) = (tx.branch(), tx.branch());
        let (mut network_steps, mut pause_steps) = (steps.fork(), steps.fork());
        let pause_inputs = PauseInputs {
            metadata,
            image,
            runtime,
            user: user.as_ref(),
            netns_path: netns_path.as_deref(),
        };
        let (ips, lease) = tokio::join!(
            self.attach_network(
                req,
                netns_path.as_deref(),
                &network_failed,
                &mut network_undo,
                &mut network_steps,
            ),
            self.create_pause(
                req,
                pause_inputs,
                &network_failed,
                &mut pause_undo,
                &mut pause_steps,
            ),
        );
        tx.join(network_undo);
        tx.join(pause_undo);
        steps.join("network+pause", [network_steps, pause_steps]);
        // The network's failure first: the pause branch stopping early is its consequence.
        let ips = ips?;
        let lease = lease?;
        crate::failpoint::hit("sandbox.after_task", &cfg.name).await?;

        // The record was made before the addresses were known: they join its metadata before
        // the pod runs (a crash before this is undone from the intent, never indexed).
        let mut ip_strings: Vec<String> = ips.iter().map(|ip| ip.to_string()).collect();
        if !ip_strings.is_empty() {
            metadata.ip = ip_strings.remove(0);
            metadata.additional_ips = ip_strings;
            self.containers
                .set_extension(id, SANDBOX_EXTENSION, encode_extension(&*metadata))
                .await?;
            steps.mark("record_ips");
        }

        let pid = self.tasks.start(id).await?;
        steps.mark("task_start");
        // The container record now holds the snapshot; the creation lease can go.
        self.leases.delete(&lease, false).await?;
        steps.mark("lease_delete");
        Ok(pid)
    }

    /// The rest of RunPodSandbox for a pod without a pause container (its namespaces pinned
    /// already): CNI ADD beside the pod files, then the pod's record, with its addresses, and
    /// its holder task, created and started: no image, snapshot, lease or process.
    async fn run_pinned(
        &self,
        req: &RunSandbox,
        tx: &mut Tx,
        steps: &mut Steps,
        metadata: &mut SandboxMetadata,
        netns: &Path,
        runtime: &HandlerRuntime,
    ) -> Result<(), SandboxError> {
        let id = tx.id().to_string();
        let network_failed = AtomicBool::new(false);
        let (mut network_undo, mut files_undo) = (tx.branch(), tx.branch());
        let (mut network_steps, mut files_steps) = (steps.fork(), steps.fork());
        let (ips, files) = tokio::join!(
            self.attach_network(
                req,
                Some(netns),
                &network_failed,
                &mut network_undo,
                &mut network_steps,
            ),
            self.prepare_pod_files(
                req,
                metadata,
                &network_failed,
                &mut files_undo,
                &mut files_steps,
            ),
        );
        tx.join(network_undo);
        tx.join(files_undo);
        steps.join("network+files", [network_steps, files_steps]);
        let ips = ips?;
        files?;
        let mut ip_strings: Vec<String> = ips.iter().map(|ip| ip.to_string()).collect();
        if !ip_strings.is_empty() {
            metadata.ip = ip_strings.remove(0);
            metadata.additional_ips = ip_strings;
        }

        let mut sandbox_cfg = req.config.clone();
        sandbox_cfg.hostname = metadata.hostname.clone();
        let spec = spec::pinned_sandbox_spec(&id, &sandbox_cfg, netns, &runtime.pass_through)?;
        let spec_json = serde_json::to_vec(&spec).map_err(SandboxError::Encode)?;
        self.containers
            .create(ContainerRecord {
                id: id.clone(),
                image: String::new(),
                labels: to_labels(metadata),
                spec: spec_json,
                runtime: runtime.runtime.clone(),
                snapshotter: String::new(),
                snapshot_key: String::new(),
                sandbox: String::new(),
                extensions: HashMap::from([(
                    SANDBOX_EXTENSION.to_string(),
                    encode_extension(metadata),
                )]),
            })
            .await?;
        steps.mark("record");
        let (containers, key) = (self.containers.clone(), id.clone());
        tx.on_undo("delete container record", async move {
            containers.delete(&key).await
        });
        crate::failpoint::hit("sandbox.after_record", &req.config.name).await?;

        // The holder task: no rootfs, no process (remora's shim runs nothing for it); it
        // starts the pod's shim and keeps it until StopPodSandbox, so the pod's containers
        // are put in it by the pod's id as a pause container's pod's are.
        self.tasks
            .create(TaskSpec {
                container_id: id.clone(),
                rootfs: Vec::new(),
                runtime_path: runtime.runtime_path.clone(),
                ..Default::default()
            })
            .await?;
        steps.mark("task_create");
        let (tasks, key) = (self.tasks.clone(), id.clone());
        tx.on_undo("delete task", async move {
            kill_and_delete(tasks.as_ref(), &key).await
        });
        // Its pid is the shim's, not a process of the pod's: the pod's status keeps 0.
        self.tasks.start(&id).await?;
        steps.mark("task_start");
        Ok(())
    }

    /// The network branch: CNI ADD into the pod's netns (none on the host network); returns
    /// the pod's addresses, primary first. Any failure is flagged in `failed` for the pause
    /// branch.
    async fn attach_network(
        &self,
        req: &RunSandbox,
        netns_path: Option<&Path>,
        failed: &AtomicBool,
        undo: &mut Branch,
        steps: &mut Steps,
    ) -> Result<Vec<IpAddr>, SandboxError> {
        let result = async {
            let cfg = &req.config;
            let mut ips = Vec::new();
            if let Some(path) = netns_path {
                let info = PodNetInfo {
                    id: undo.id().to_string(),
                    name: cfg.name.clone(),
                    namespace: cfg.namespace.clone(),
                    uid: cfg.uid.clone(),
                    port_mappings: req.port_mappings.clone(),
                    netns_path: path.to_path_buf(),
                    bandwidth: None,
                    dns: None,
                };
                // The network undoes its own partial ADD; once it succeeded, DEL is ours.
                ips = self.network.setup(&info).await?;
                steps.mark("cni_add");
                let network = self.network.clone();
                undo.on_undo("CNI DEL", async move { network.teardown(&info).await });
            }
            crate::failpoint::hit("sandbox.after_network", &cfg.name).await?;
            Ok(ips)
        }
        .await;
        if result.is_err() {
            failed.store(true, Ordering::Release);
        }
        result
    }

    /// The pause branch: pod files (+ shm tmpfs) → creation lease → rootfs snapshot → OCI
    /// spec → container record (without the pod's addresses) → task created, not started.
    /// Returns the creation lease. Stops before its next step once `network_failed` is set.
    async fn create_pause(
        &self,
        req: &RunSandbox,
        inputs: PauseInputs<'_>,
        network_failed: &AtomicBool,
        undo: &mut Branch,
        steps: &mut Steps,
    ) -> Result<String, SandboxError> {
        let go_on = || {
            if network_failed.load(Ordering::Acquire) {
                return Err(SandboxError::StoppedBeside("CNI ADD"));
            }
            Ok(())
        };
        let PauseInputs {
            metadata,
            image,
            runtime,
            user,
            netns_path,
        } = inputs;
        let id = &metadata.id;
        let cfg = &req.config;

        let files = self
            .prepare_pod_files(req, metadata, network_failed, undo, steps)
            .await?;

        go_on()?;
        let lease = self.creation_lease(undo).await?;
        steps.mark("lease");
        go_on()?;
        let mounts = self
            .snapshots
            .prepare(
                &lease,
                &self.snapshotter,
                id,
                &image.chain_id,
                &super::userns::snapshot_labels(user),
            )
            .await?;
        steps.mark("prepare");
        let (snaps, snapshotter, key) = (
            self.snapshots.clone(),
            self.snapshotter.clone(),
            id.to_string(),
        );
        undo.on_undo("remove rootfs snapshot", async move {
            snaps.remove(&snapshotter, &key).await
        });
        if user.is_some() && !super::userns::idmapped(&mounts) {
            return Err(SandboxError::SnapshotterCannotIdmap(
                self.snapshotter.clone(),
            ));
        }
        crate::failpoint::hit("sandbox.after_snapshot", &cfg.name).await?;

        let mut sandbox_cfg = cfg.clone();
        sandbox_cfg.hostname = metadata.hostname.clone();
        let spec = spec::sandbox_spec(&spec::SandboxInputs {
            id,
            config: &sandbox_cfg,
            image: &image_config(image),
            image_name: &self.sandbox_image,
            rootfs: None,
            netns_path,
            userns_path: user
                .and(netns_path)
                .map(crate::spec::namespaces::userns_pin)
                .as_deref(),
            files: &files,
            host: &self.host,
            unprivileged_ports: false,
            unprivileged_icmp: false,
            pass_through: &runtime.pass_through,
        })?;
        let spec_json = serde_json::to_vec(&spec).map_err(SandboxError::Encode)?;

        go_on()?;
        self.containers
            .create(ContainerRecord {
                id: id.to_string(),
                image: self.sandbox_image.clone(),
                labels: to_labels(metadata),
                spec: spec_json,
                runtime: runtime.runtime.clone(),
                snapshotter: self.snapshotter.clone(),
                snapshot_key: id.to_string(),
                sandbox: String::new(),
                extensions: HashMap::from([(
                    SANDBOX_EXTENSION.to_string(),
                    encode_extension(metadata),
                )]),
            })
            .await?;
        steps.mark("spec+record");
        let (containers, key) = (self.containers.clone(), id.to_string());
        undo.on_undo("delete container record", async move {
            containers.delete(&key).await
        });

        go_on()?;
        self.tasks
            .create(TaskSpec {
                container_id: id.to_string(),
                rootfs: mounts,
                runtime_path: runtime.runtime_path.clone(),
                ..Default::default()
            })
            .await?;
        steps.mark("task_create");
        let (tasks, key) = (self.tasks.clone(), id.to_string());
        undo.on_undo("delete task", async move {
            kill_and_delete(tasks.as_ref(), &key).await
        });
        Ok(lease)
    }

    /// The pod's files (hosts, resolv.conf, hostname, and its /dev/shm tmpfs), beside CNI
    /// ADD; stops before it starts once `network_failed` is set.
    async fn prepare_pod_files(
        &self,
        req: &RunSandbox,
        metadata: &SandboxMetadata,
        network_failed: &AtomicBool,
        undo: &mut Branch,
        steps: &mut Steps,
    ) -> Result<spec::SandboxFiles, SandboxError> {
        if network_failed.load(Ordering::Acquire) {
            return Err(SandboxError::StoppedBeside("CNI ADD"));
        }
        let ns = &req.config.security.namespaces;
        let dir = self.sandbox_dir(&metadata.id);
        // Registered first: removal is idempotent, and a blocking task that did not finish
        // may have made part of them.
        let d = dir.clone();
        undo.on_undo("remove pod files", async move {
            super::blocking(move || sandbox_files::remove(&d)).await??;
            Ok::<(), super::UndoError>(())
        });
        let request = FilesRequest {
            hostname: metadata.hostname.clone(),
            dns: req.dns.clone(),
            host_network: ns.network == NamespaceMode::Node,
            host_ipc: ns.ipc == NamespaceMode::Node,
        };
        let files = super::blocking(move || sandbox_files::prepare(&dir, &request))
            .await
            .map_err(SandboxError::Aborted)??;
        steps.mark("pod_files");
        Ok(files)
    }

    async fn sandbox_image(&self) -> Result<ImageInfo, SandboxError> {
        if let Some(info) = self.images.get(&self.sandbox_image) {
            return Ok(info);
        }
        Ok(self.images.pull(&self.sandbox_image).await?)
    }

    /// Records the pause task's exit when it happens (Task.Wait is the truth for exits).
    pub(crate) fn monitor_exit(self: &Arc<Self>, sandbox: Sandbox) {
        let tasks = self.tasks.clone();
        let reachability = self.reachability();
        let log = self.log.new(slog::o!("pod_id" => sandbox.id().to_string()));
        tokio::spawn(async move {
            // The pause task is never sandboxed: containerd cleans up after its dead shim.
            match wait_through_outages(tasks.as_ref(), sandbox.id(), reachability, false, || {
                sandbox.status().exit_code.is_none()
            })
            .await
            {
                Ok(exit) => {
                    let at = exit_ns(exit.at);
                    if sandbox.record_exit(exit.status as i32, at) == ExitOutcome::Recorded {
                        info!(log, "pod sandbox task exited"; "exit_status" => exit.status);
                    }
                }
                // The connection to containerd broke: the recovery issue re-attaches monitors.
                Err(e) => warn!(log, "lost the wait on the pod sandbox task"; "error" => %e),
            }
        });
    }
}

/// Whether pod `cfg` of a handler with `runtime` runs without a pause container: unless its
/// handler asks for one (`pause_container = "always"`, or a shim that cannot hold a pod
/// without a process: any but remora's), a pod needs one only for what needs a
/// process to hold it: a PID namespace its containers share (`shareProcessNamespace`), a user
/// namespace of its own (its network namespace is owned by it, and the pause container's maps
/// are what runc checks), and a pod on the host's network (kept simple: its namespaces are not
/// pinned beside a network namespace of its own).
pub(crate) fn needs_no_pause(cfg: &SandboxConfig, runtime: &HandlerRuntime) -> bool {
    let ns = &cfg.security.namespaces;
    !runtime.pause_always
        && ns.network != NamespaceMode::Node
        && ns.pid != NamespaceMode::Pod
        && ns.user.is_none()
}
