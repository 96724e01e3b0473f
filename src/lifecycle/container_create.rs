//! CreateContainer, all or nothing: name reserved → creation lease → rootfs snapshot → OCI
//! spec (the user resolved from the image's passwd and group files, read from the snapshot's
//! layers, or from the rootfs mounted briefly when they cannot be) → containerd container record →
//! indexed as CREATED → lease dropped. Every step that makes something registers its undo on
//! the transaction ([`super::tx`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use slog::{info, warn};

use super::backend::ContainerRecord;
use super::container_events::EventKind;
use super::handlers::HandlerRuntime;
use super::journal::Intent;
use super::mount::{snapshot_root, with_temp_mount};
use super::timing::Steps;
use super::tx::Tx;
use super::{blocking, image_config, now_ns, ContainerError, Pods};
use crate::images::backend::Mount;
use crate::images::store::ImageInfo;
use crate::signal::Signal;
use crate::spec::{self, ContainerConfig, HostDevice, SandboxFiles, SandboxInfo};
use crate::store::persist::CONTAINER_EXTENSION;
use crate::store::{
    container_name_key, encode_extension, generate_id, to_labels, Container, ContainerMetadata,
    ContainerStatus, ContainerUser, Sandbox, SandboxMetadata, SandboxSnapshot, SandboxState,
    StoreError,
};

/// A CreateContainer request in domain terms.
#[derive(Debug, Clone)]
pub struct CreateRequest {
    /// Pod sandbox id (full or unique prefix).
    pub sandbox_id: String,
    /// The container config.
    pub config: ContainerConfig,
    /// Store metadata prepared by the adapter (id and sandbox id are filled in here, and the
    /// stop signal when the adapter leaves it empty: none configured).
    pub metadata: ContainerMetadata,
    /// The image the container asks for (any reference form or id).
    pub image: String,
    /// PID namespace target container id (for `NamespaceMode::Target`).
    pub target_id: Option<String>,
    /// The pod's config as the request carries it (converted by the adapter); `None` → what
    /// the sandbox's record says.
    pub sandbox_config: Option<spec::SandboxConfig>,
}

impl Pods {
    /// CreateContainer. Returns the container id.
    pub async fn create_container(
        self: &Arc<Self>,
        req: CreateRequest,
    ) -> Result<String, ContainerError> {
        let id = generate_id()?;
        let log = self.log.new(slog::o!("container_id" => id.clone()));
        let intent = Intent::Container { id: id.clone() };
        self.transaction(intent, log, move |me, tx, _| {
            Box::pin(async move { me.create_inner(req, tx).await })
        })
        .await
        .map(|()| id)
    }

    /// The signal a container whose config names none is stopped with: its image's
    /// `StopSignal`, else SIGTERM. One that is no signal is SIGTERM too, as in moby (containerd
    /// would fail every StopContainer of the container instead), and warned about.
    fn image_stop_signal(&self, id: &str, image: &str) -> Signal {
        if image.trim().is_empty() {
            return Signal::TERM;
        }
        Signal::parse(image).unwrap_or_else(|| {
            warn!(self.log, "the image's StopSignal is no signal; the container is stopped with SIGTERM";
                "container_id" => id, "stop_signal" => image);
            Signal::TERM
        })
    }

    /// Refuses a `Bidirectional` or `HostToContainer` mount whose source is not on a mount
    /// that propagates that way ([`super::mountinfo`]), before anything is made.
    async fn check_mount_propagation(
        &self,
        mounts: &[spec::MountRequest],
    ) -> Result<(), ContainerError> {
        let wanted: Vec<(String, PathBuf, spec::MountPropagation)> = mounts
            .iter()
            .filter(|m| m.image.is_none() && m.propagation != spec::MountPropagation::Private)
            .map(|m| (m.container_path.clone(), m.host_path.clone(), m.propagation))
            .collect();
        if wanted.is_empty() {
            return Ok(());
        }
        blocking(move || {
            const MOUNTINFO: &str = "/proc/self/mountinfo";
            let table_err = |mount: &str| {
                let mount = mount.to_string();
                move |source| ContainerError::MountTable {
                    mount,
                    path: MOUNTINFO.into(),
                    source,
                }
            };
            let table = std::fs::read_to_string(MOUNTINFO).map_err(table_err(&wanted[0].0))?;
            let table = super::mountinfo::parse(&table);
            for (mount, host_path, propagation) in wanted {
                let source = super::mountinfo::resolve_existing(&host_path).map_err(|source| {
                    ContainerError::Host {
                        action: "resolve mount source",
                        path: host_path.clone(),
                        source,
                    }
                })?;
                super::mountinfo::check_propagation(&table, &source, propagation).map_err(
                    |source| ContainerError::MountPropagation {
                        mount,
                        propagation,
                        source,
                    },
                )?;
            }
            Ok(())
        })
        .await
        .map_err(ContainerError::Aborted)?
    }

    /// CreateContainer's steps in order, each undone by `tx` if a later one fails.
    async fn create_inner(
        self: &Arc<Self>,
        req: CreateRequest,
        tx: &mut Tx,
    ) -> Result<(), ContainerError> {
        let id = &tx.id().to_string();
        let mut steps = Steps::start();
        let (sandbox, sb) = self.ready_sandbox(&req.sandbox_id)?;
        // Every container runs with its pod's handler (shim and options), as in containerd.
        let handler = self.pod_runtime(sandbox.id(), &sb.metadata.runtime_handler)?;
        check_fits_pod(&req.config, &sb, handler)?;
        let pod_user = sb.metadata.namespace_options.user;
        self.check_mount_propagation(&req.config.mounts).await?;
        self.check_apparmor(&req.config.security, true).await?;
        // CDI devices resolved before anything is made: an unknown one leaves nothing behind.
        let cdi_edits = {
            let (cdi, wanted) = (self.cdi.clone(), req.config.cdi_devices.clone());
            blocking(move || cdi.resolve(&wanted))
                .await
                .map_err(ContainerError::Aborted)??
        };
        let runtime = handler.runtime.clone();
        let pass_through = handler.pass_through.clone();
        let image: ImageInfo = self
            .find_image(&req.image)
            .ok_or_else(|| ContainerError::ImageNotFound(req.image.clone()))?;
        let image_cfg = image_config(&image);

        let mut metadata = self.new_metadata(id, &req, sandbox.id(), &image, &image_cfg);
        let name_key = container_name_key(
            &metadata.name,
            &sb.metadata.name,
            &sb.metadata.namespace,
            &sb.metadata.uid,
            metadata.attempt,
        );
        let reservation = self.names.reserve_guarded(&name_key, id)?;
        steps.mark("lookup");

        let lease = self.creation_lease(tx).await?;
        steps.mark("lease");
        let mounts = self
            .prepare_rootfs(id, &lease, &image, pod_user.as_ref(), tx)
            .await?;
        steps.mark("prepare");
        crate::failpoint::hit("container.after_snapshot", &metadata.name).await?;
        let mut config = req.config.clone();
        let volume_labels = self
            .make_image_volumes(
                id,
                &lease,
                &mut config.mounts,
                &mut metadata.mounts,
                pod_user.as_ref(),
                tx,
            )
            .await?;
        steps.mark("image_volumes");

        let target_pid = match &req.target_id {
            Some(t) => Some(self.containers_store.get(t)?.snapshot().status.pid),
            None => None,
        };
        let info = self.sandbox_info(&req, sandbox.id(), &sb);
        let host = self.host.clone();
        let tmp = self.state_dir.join("tmpmounts").join(id);
        let id_owned = id.to_string();
        let mut generated = blocking(move || {
            let generate = |rootfs: spec::RootFs<'_>| {
                spec::container_spec(&spec::ContainerInputs {
                    id: &id_owned,
                    config: &config,
                    image: &image_cfg,
                    sandbox: &info,
                    rootfs,
                    target_pid,
                    host: &host,
                    device_lookup: &host_device,
                    pass_through: &pass_through,
                })
            };
            // The image's passwd and group files read in place where the snapshot's layers
            // allow it; a mount (a syscall pair and its mount point) only for the others.
            let mut generated = match snapshot_root(&mounts) {
                Some(root) => generate(root.as_rootfs())?,
                None => with_temp_mount(&mounts, &tmp, |dir| generate(spec::RootFs::Dir(dir)))??,
            };
            // After everything else, as containerd's WithCDI: CDI edits may replace env,
            // devices and mounts the spec already has.
            crate::cdi::apply(&mut generated.spec, &cdi_edits, &crate::cdi::host_node)?;
            Ok::<_, ContainerError>(generated)
        })
        .await
        .map_err(ContainerError::Aborted)??;
        steps.mark("spec");
        ensure_bind_sources(&generated.host_dirs_to_create)?;
        metadata.user = process_user(&generated.spec);
        let container = Container::new(metadata.clone(), ContainerStatus::created(now_ns()));
        let snapshot = container.snapshot();
        // NRI's CreateContainer, on the spec as made and before anything names the container
        // (it is not listed while plugins decide); their merged adjustment is applied to the
        // spec, all or nothing. A refusal fails the call and the transaction undoes what was
        // made. The sync block is held until the container is indexed (see `super::nri`).
        let sync_block = match self.nri() {
            Some(nri) => {
                let block = nri.block_sync().await;
                nri.create_container(&sb, &snapshot, &mut generated.spec)
                    .await?;
                // A later step's failure: the plugins hear the container is gone (they may
                // have set resources aside for it), as containerd's undo tells them.
                let (nri, pod, ctr) = (nri.clone(), sb.clone(), snapshot.clone());
                tx.on_undo("tell NRI plugins the container is gone", async move {
                    nri.stop_container(&pod, &ctr).await;
                    nri.remove_container(&pod, &ctr).await;
                    Ok::<(), crate::backend_error::BackendError>(())
                });
                steps.mark("nri");
                Some(block)
            }
            None => None,
        };
        // The resources ContainerStatus reports: the spec's as it will run (after NRI).
        container.set_resources(super::container_update::spec_resources(&generated.spec));
        let snapshot = container.snapshot();
        let spec_json = serde_json::to_vec(&generated.spec).map_err(ContainerError::Encode)?;
        steps.mark("bind_sources+encode");
        let mut labels = to_labels(&snapshot);
        // The record keeps its image volumes' views once the creation lease is gone.
        labels.extend(volume_labels);
        self.containers
            .create(ContainerRecord {
                id: id.to_string(),
                image: image.id.clone(),
                labels,
                spec: spec_json,
                runtime,
                snapshotter: self.snapshotter.clone(),
                snapshot_key: id.to_string(),
                sandbox: sandbox.id().to_string(),
                extensions: HashMap::from([(
                    CONTAINER_EXTENSION.to_string(),
                    encode_extension(&snapshot),
                )]),
            })
            .await?;
        steps.mark("record");
        let (containers, key) = (self.containers.clone(), id.to_string());
        tx.on_undo("delete container record", async move {
            containers.delete(&key).await
        });
        crate::failpoint::hit("container.after_record", &metadata.name).await?;
        self.containers_store.add(container.clone())?;
        drop(sync_block);
        // The container record now holds the snapshot; the creation lease can go. Best effort:
        // containerd expires it anyway, and the container exists now.
        if let Err(e) = self.leases.delete(&lease, false).await {
            warn!(self.log, "cannot delete the creation lease"; "container_id" => id, "error" => %e);
        }
        steps.mark("lease_delete");
        reservation.keep();
        tx.commit();
        self.events
            .emit(id, sandbox.id(), EventKind::Created, now_ns());
        if let Some(nri) = self.nri() {
            nri.post_create_container(&sb, &container.snapshot()).await;
        }
        info!(self.log, "container created"; "container_id" => id, "pod_id" => sandbox.id(), "image" => &req.image);
        steps.log(
            &self.log.new(slog::o!("container_id" => id.clone())),
            "CreateContainer",
        );
        Ok(())
    }

    /// Pod `sandbox_id` (or a unique prefix of it) and its state, if it is ready.
    fn ready_sandbox(
        &self,
        sandbox_id: &str,
    ) -> Result<(Sandbox, SandboxSnapshot), ContainerError> {
        let sandbox = match self.sandboxes.get(sandbox_id) {
            Ok(s) => s,
            Err(StoreError::NotFound { .. }) => {
                return Err(ContainerError::SandboxNotFound(sandbox_id.to_string()))
            }
            Err(e) => return Err(e.into()),
        };
        let sb = sandbox.snapshot();
        if sb.status.state != SandboxState::Ready {
            return Err(ContainerError::SandboxNotReady(sandbox.id().to_string()));
        }
        Ok((sandbox, sb))
    }

    /// The new container's store metadata: the adapter's, with its id, pod, CDI devices and
    /// image filled in, and the image's stop signal when none is configured.
    fn new_metadata(
        &self,
        id: &str,
        req: &CreateRequest,
        sandbox_id: &str,
        image: &ImageInfo,
        image_cfg: &spec::ImageConfig,
    ) -> ContainerMetadata {
        let mut metadata = req.metadata.clone();
        metadata.id = id.to_string();
        metadata.sandbox_id = sandbox_id.to_string();
        metadata.cdi_devices = req
            .config
            .cdi_devices
            .iter()
            .map(|d| d.name.clone())
            .collect();
        metadata.image.id = image.id.clone();
        metadata.image.reference = image.reference();
        if metadata.image.requested.is_empty() {
            metadata.image.requested = req.image.clone();
        }
        if metadata.stop_signal.is_empty() {
            metadata.stop_signal = self
                .image_stop_signal(id, &image_cfg.stop_signal)
                .to_string();
        }
        metadata
    }

    /// The container's rootfs snapshot over `image`, within `lease` (removed on undo); in a
    /// user-namespaced pod it must be idmapped.
    async fn prepare_rootfs(
        &self,
        id: &str,
        lease: &str,
        image: &ImageInfo,
        pod_user: Option<&spec::UserNamespace>,
        tx: &mut Tx,
    ) -> Result<Vec<Mount>, ContainerError> {
        let mounts = self
            .snapshots
            .prepare(
                lease,
                &self.snapshotter,
                id,
                &image.chain_id,
                &super::userns::snapshot_labels(pod_user),
            )
            .await?;
        let (snaps, sn, key) = (
            self.snapshots.clone(),
            self.snapshotter.clone(),
            id.to_string(),
        );
        tx.on_undo("remove rootfs snapshot", async move {
            snaps.remove(&sn, &key).await
        });
        if pod_user.is_some() && !super::userns::idmapped(&mounts) {
            return Err(ContainerError::SnapshotterCannotIdmap(
                self.snapshotter.clone(),
            ));
        }
        Ok(mounts)
    }

    /// The pod as the container's spec sees it: its process, network namespace, config (the
    /// request's, else the record's) and the files it shares.
    fn sandbox_info(
        &self,
        req: &CreateRequest,
        sandbox_id: &str,
        sb: &SandboxSnapshot,
    ) -> SandboxInfo {
        let sandbox_dir = self.sandbox_dir(sandbox_id);
        let host_ipc = sb.metadata.namespace_options.ipc == spec::NamespaceMode::Node;
        SandboxInfo {
            id: sandbox_id.to_string(),
            pid: sb.status.pid,
            netns_path: (!sb.metadata.netns_path.is_empty())
                .then(|| PathBuf::from(&sb.metadata.netns_path)),
            pinned: sb.metadata.pinned_namespaces,
            config: req
                .sandbox_config
                .clone()
                .unwrap_or_else(|| fallback_sandbox_config(&sb.metadata)),
            files: SandboxFiles {
                hosts: Some(sandbox_dir.join("hosts")),
                resolv_conf: Some(sandbox_dir.join("resolv.conf")),
                hostname: Some(sandbox_dir.join("hostname")),
                shm: Some(if host_ipc {
                    PathBuf::from("/dev/shm")
                } else {
                    sandbox_dir.join("shm")
                }),
            },
        }
    }
}

/// Refuses, before anything is made, a container its pod cannot run: a recursive read-only
/// mount the pod's handler cannot make, or a user namespace other than the pod's.
fn check_fits_pod(
    config: &ContainerConfig,
    sb: &SandboxSnapshot,
    handler: &HandlerRuntime,
) -> Result<(), ContainerError> {
    if !handler.features.recursive_read_only_mounts {
        if let Some(m) = config.mounts.iter().find(|m| m.recursive_read_only) {
            return Err(ContainerError::RecursiveReadOnlyUnsupported {
                handler: sb.metadata.runtime_handler.clone(),
                mount: m.container_path.clone(),
            });
        }
    }
    // A container lives in its pod's user namespace, and asks for that one (containerd:
    // `sameUsernsConfig`); the pod's is what its record says.
    let pod_user = sb.metadata.namespace_options.user;
    if config.security.namespaces.user != pod_user {
        let describe = |u: Option<spec::UserNamespace>| match u {
            None => "the host's".to_string(),
            Some(u) => format!(
                "uids {}, gids {}",
                crate::spec::idmap(u.uids).label(),
                crate::spec::idmap(u.gids).label()
            ),
        };
        return Err(ContainerError::UserNamespaceMismatch {
            container: describe(config.security.namespaces.user),
            pod: describe(pod_user),
        });
    }
    Ok(())
}

/// Creates the bind sources the spec wants as directories where they do not exist.
fn ensure_bind_sources(dirs: &[PathBuf]) -> Result<(), ContainerError> {
    for dir in dirs {
        super::host::ensure_bind_source(dir).map_err(|source| ContainerError::Host {
            action: "prepare bind mount source",
            path: dir.clone(),
            source,
        })?;
    }
    Ok(())
}

/// The user the spec's process runs as, for the container's status.
fn process_user(spec: &oci_spec::runtime::Spec) -> Option<ContainerUser> {
    spec.process().as_ref().map(|p| {
        let u = p.user();
        ContainerUser {
            uid: u.uid(),
            gid: u.gid(),
            supplemental_groups: u.additional_gids().clone().unwrap_or_default(),
        }
    })
}

/// The pod's config from what its record keeps, for a request that carries none.
fn fallback_sandbox_config(meta: &SandboxMetadata) -> spec::SandboxConfig {
    spec::SandboxConfig {
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        uid: meta.uid.clone(),
        hostname: meta.hostname.clone(),
        log_directory: meta.log_directory.clone(),
        cgroup_parent: meta.cgroup_parent.clone(),
        annotations: meta.annotations.clone(),
        ..Default::default()
    }
}

/// `stat`s a host device node for the spec's device list.
fn host_device(path: &Path) -> std::io::Result<HostDevice> {
    use nix::sys::stat::{major, minor, stat, SFlag};
    let st = stat(path).map_err(std::io::Error::from)?;
    let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
    let kind = if kind == SFlag::S_IFBLK {
        spec::DeviceKind::Block
    } else if kind == SFlag::S_IFCHR {
        spec::DeviceKind::Char
    } else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} is not a device", path.display()),
        ));
    };
    Ok(HostDevice {
        kind,
        major: major(st.st_rdev) as i64,
        minor: minor(st.st_rdev) as i64,
        file_mode: st.st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
    })
}
