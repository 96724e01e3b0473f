//! A user-namespaced pod's pieces that lifecycle asks of containerd: the snapshot labels that
//! make the overlayfs snapshotter idmap a rootfs, and the check that it did.
//!
//! Design (containerd 2.3's CRI, `snapshotterRemapOpts` → `WithRemapperLabels`): the rootfs
//! snapshot of every container of such a pod, the pause container's included, is prepared with
//! `containerd.io/snapshot/uidmapping` and `gidmapping` labels (`0:<host id>:<length>`). A
//! snapshotter with the `remap-ids` capability (overlayfs where the kernel can idmap its lower
//! layers, 5.19) then chowns the new upper directory's root to the mapped root and returns
//! mounts carrying `uidmap=`/`gidmap=` options, which the shim's mount code turns into
//! idmapped layers: the image's files appear owned by the pod's IDs, nothing is copied or
//! chowned. A snapshotter without it returns mounts without those options; remora then refuses
//! the pod (`FAILED_PRECONDITION`) rather than run it with a rootfs owned by `nobody` —
//! containerd's client would fall back to a full chown copy (`slow_chown`), which remora does
//! not do.

use std::collections::HashMap;

use crate::images::backend::Mount;
use crate::spec::{idmap, UserNamespace};

/// containerd's snapshot label for the uid map of a remapped rootfs.
pub const LABEL_UID_MAPPING: &str = "containerd.io/snapshot/uidmapping";
/// containerd's snapshot label for the gid map of a remapped rootfs.
pub const LABEL_GID_MAPPING: &str = "containerd.io/snapshot/gidmapping";

/// The rootfs snapshot's labels for a pod with user namespace `user` (none without one).
pub fn snapshot_labels(user: Option<&UserNamespace>) -> HashMap<String, String> {
    let Some(u) = user else {
        return HashMap::new();
    };
    HashMap::from([
        (LABEL_UID_MAPPING.to_string(), idmap(u.uids).label()),
        (LABEL_GID_MAPPING.to_string(), idmap(u.gids).label()),
    ])
}

/// Whether the snapshotter idmapped the rootfs `mounts` (each carries `uidmap=` and `gidmap=`).
pub fn idmapped(mounts: &[Mount]) -> bool {
    let has = |m: &Mount, p: &str| m.options.iter().any(|o| o.starts_with(p));
    !mounts.is_empty()
        && mounts
            .iter()
            .all(|m| has(m, "uidmap=") && has(m, "gidmap="))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::IdMapping;

    #[test]
    fn labels_name_each_map_from_container_id_0() {
        assert!(snapshot_labels(None).is_empty());
        let map = |host_id| IdMapping {
            container_id: 0,
            host_id,
            length: 65536,
        };
        let labels = snapshot_labels(Some(&UserNamespace {
            uids: map(1000),
            gids: map(2000),
        }));
        assert_eq!(labels[LABEL_UID_MAPPING], "0:1000:65536");
        assert_eq!(labels[LABEL_GID_MAPPING], "0:2000:65536");
    }

    #[test]
    fn only_mounts_with_both_maps_are_idmapped() {
        let m = |opts: &[&str]| Mount {
            kind: "overlay".into(),
            source: "overlay".into(),
            target: String::new(),
            options: opts.iter().map(|s| s.to_string()).collect(),
        };
        assert!(idmapped(&[m(&[
            "lowerdir=/a",
            "uidmap=0:1:2",
            "gidmap=0:1:2"
        ])]));
        assert!(!idmapped(&[m(&["lowerdir=/a", "uidmap=0:1:2"])]));
        assert!(!idmapped(&[m(&["lowerdir=/a"])]));
        assert!(!idmapped(&[]));
    }
}
