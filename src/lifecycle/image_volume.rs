//! Image volumes (CRI `Mount.image`): an image's files mounted read-only into a container.
//!
//! Design, as containerd's CRI does it: CreateContainer takes a read-only *view* snapshot of
//! the image's top layer chain (`<container id>-imagevolume-<mount index>`, made under the
//! creation lease), mounts it on the host under `<state_dir>/image-volumes/<container id>/
//! <mount index>`, and the container's spec bind-mounts that directory read-only. Once the
//! container record exists it keeps the views from containerd's garbage collector through
//! `containerd.io/gc.ref.snapshot.<snapshotter>/…` labels (the creation lease then goes, as for
//! the rootfs). RemoveContainer unmounts and removes them after the task is gone; a create
//! that fails undoes them through its transaction, and one that died with remora is undone by
//! the start-up sweep (the mounts here, the views with the creation lease).
//!
//! The image must be pulled (kubelet pulls image volumes before it creates the container); a
//! missing one is `NOT_FOUND` naming the mount, before anything is made.
//!
//! A sub path (CRI `Mount.image_sub_path`) is resolved inside the mounted view as if the view
//! were `/` (`openat2` with `RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS`: `..` and symlinks cannot
//! lead out of the image), must be a directory, and is bound — through the fd just opened, so
//! nothing can swap it in between — read-only, `nosuid,nodev` on `<index>-sub` beside the view;
//! the container's spec binds that. A sub path that is missing, not a directory or not
//! resolvable in the image is `INVALID_ARGUMENT` naming `config.mounts[N].image_sub_path`, and
//! the create is undone like any other failure. containerd resolves it the same way (Go's
//! `os.OpenInRoot`) but binds the path it resolved.

use std::path::PathBuf;

use super::mount::{bind_dir_fd, mount_on, open_sub_path, unmount_and_remove};
use super::tx::Tx;
use super::{blocking, ContainerError, Pods};
use crate::spec::{MountRequest, UserNamespace};
use crate::store::MountSummary;

/// The label prefix by which a containerd record references snapshots for GC.
const GC_SNAPSHOT_REF: &str = "containerd.io/gc.ref.snapshot.";

/// What the bind of an image volume's sub path is named by, after the mount index: it sits
/// beside the view's mount point (`<index>`), so the start-up sweep and RemoveContainer, which
/// unmount every directory of the container's image volume directory, take it too.
const SUB_SUFFIX: &str = "-sub";

/// The view snapshot of image volume `index` of container `id`.
pub fn view_key(id: &str, index: usize) -> String {
    format!("{id}-imagevolume-{index}")
}

impl Pods {
    /// The host directory of container `id`'s image volumes.
    pub(crate) fn image_volume_dir(&self, id: &str) -> PathBuf {
        self.state_dir.join("image-volumes").join(id)
    }

    /// Makes every image volume among `mounts` (CreateContainer): a view of the image under
    /// `lease`, mounted on the host; the mount's `host_path` then points at it, and its
    /// `summaries` entry names the image as resolved. Each step registers its undo on `tx`.
    /// Returns the labels by which the container record keeps the views.
    pub(super) async fn make_image_volumes(
        &self,
        id: &str,
        lease: &str,
        mounts: &mut [MountRequest],
        summaries: &mut [MountSummary],
        pod_user: Option<&UserNamespace>,
        tx: &mut Tx,
    ) -> Result<Vec<(String, String)>, ContainerError> {
        let mut labels = Vec::new();
        for (index, m) in mounts.iter_mut().enumerate() {
            let Some(volume) = &m.image else { continue };
            let image = self.find_image(&volume.image).ok_or_else(|| {
                ContainerError::ImageVolumeNotFound {
                    mount: m.container_path.clone(),
                    image: volume.image.clone(),
                }
            })?;
            let key = view_key(id, index);
            // Maps on an image volume are the pod's (the adapter checked): its view is
            // idmapped as the rootfs is, and the container binds it without maps.
            let idmapped = !m.uid_mappings.is_empty();
            let view_labels = super::userns::snapshot_labels(pod_user.filter(|_| idmapped));
            let views = self
                .snapshots
                .view(
                    lease,
                    &self.snapshotter,
                    &key,
                    &image.chain_id,
                    &view_labels,
                )
                .await?;
            let (snaps, sn, k) = (
                self.snapshots.clone(),
                self.snapshotter.clone(),
                key.clone(),
            );
            tx.on_undo("remove image volume view", async move {
                snaps.remove(&sn, &k).await
            });
            if !view_labels.is_empty() && !super::userns::idmapped(&views) {
                return Err(ContainerError::SnapshotterCannotIdmap(
                    self.snapshotter.clone(),
                ));
            }
            let target = self.image_volume_dir(id).join(index.to_string());
            let dir = target.clone();
            blocking(move || mount_on(&views, &dir))
                .await
                .map_err(ContainerError::Aborted)?
                .map_err(|source| ContainerError::ImageVolumeMount {
                    mount: m.container_path.clone(),
                    source,
                })?;
            let undo_dir = target.clone();
            tx.on_undo("unmount image volume", async move {
                blocking(move || {
                    unmount_and_remove(&undo_dir);
                    // The container's directory too, once its last volume is gone (undos run
                    // in reverse: volume 0's last); one still holding another is left.
                    if let Some(parent) = undo_dir.parent() {
                        let _ = std::fs::remove_dir(parent);
                    }
                })
                .await
            });
            let host_path = if volume.sub_path.is_empty() {
                target
            } else {
                let sub_target = self
                    .image_volume_dir(id)
                    .join(format!("{index}{SUB_SUFFIX}"));
                let (root, sub, at) = (target, volume.sub_path.clone(), sub_target.clone());
                blocking(move || bind_dir_fd(&open_sub_path(&root, &sub)?, &at))
                    .await
                    .map_err(ContainerError::Aborted)?
                    .map_err(|source| ContainerError::ImageSubPath {
                        field: format!("config.mounts[{index}].image_sub_path"),
                        sub_path: volume.sub_path.clone(),
                        source,
                    })?;
                let undo_dir = sub_target.clone();
                tx.on_undo("unmount image volume sub path", async move {
                    blocking(move || unmount_and_remove(&undo_dir)).await
                });
                sub_target
            };
            if let Some(s) = summaries.get_mut(index) {
                s.image_ref = image.reference();
                s.image_id = image.id.clone();
            }
            m.host_path = host_path;
            m.readonly = true;
            // An overlay cannot be idmapped again by the OCI runtime (nor need it be).
            m.uid_mappings.clear();
            m.gid_mappings.clear();
            labels.push((
                format!("{GC_SNAPSHOT_REF}{}/{index}", self.snapshotter),
                key,
            ));
        }
        Ok(labels)
    }

    /// Unmounts container `id`'s image volumes and removes their views (RemoveContainer, after
    /// its task is gone). `summaries` are its mounts, as recorded.
    pub(super) async fn remove_image_volumes(
        &self,
        id: &str,
        summaries: &[MountSummary],
    ) -> Result<(), ContainerError> {
        if summaries.iter().all(|s| s.image.is_empty()) {
            return Ok(());
        }
        let dir = self.image_volume_dir(id);
        blocking(move || unmount_all_below(&dir))
            .await
            .map_err(ContainerError::Aborted)?;
        for (index, _) in summaries
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.image.is_empty())
        {
            self.snapshots
                .remove(&self.snapshotter, &view_key(id, index))
                .await?;
        }
        Ok(())
    }
}

/// Unmounts every directory directly below `dir` and removes them and `dir` (best effort: an
/// absent `dir` is nothing to do).
pub(super) fn unmount_all_below(dir: &std::path::Path) {
    // The idmapped layers an overlay view was being mounted over when remora died, first.
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_name()
                .to_string_lossy()
                .ends_with(".idmapped-layers")
            {
                super::journal::clear_temp_mounts(&e.path());
            }
        }
    }
    super::journal::clear_temp_mounts(dir);
    let _ = std::fs::remove_dir(dir);
}
