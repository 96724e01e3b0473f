//! ImageFsInfo: how much of the image filesystem images use.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::cri::error::CriError;
use crate::cri::Runtime;

/// One filesystem's usage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsUsage {
    /// When it was measured, in nanoseconds since the epoch.
    pub timestamp_ns: i64,
    /// The snapshotter's root directory.
    pub mountpoint: PathBuf,
    /// Bytes used by snapshots.
    pub used_bytes: u64,
    /// Inodes used by snapshots.
    pub inodes_used: u64,
}

/// Sums the usage of every snapshot in remora's namespace on the configured snapshotter, as
/// containerd's CRI does; the mountpoint is the snapshotter's root directory.
pub async fn image_fs_info(rt: &Runtime) -> Result<FsUsage, CriError> {
    let snapshotter = &rt.config.images.snapshotter;
    let snaps = &rt.images.backend.snapshots;
    let mut used_bytes = 0u64;
    let mut inodes_used = 0u64;
    for key in snaps.list(snapshotter).await? {
        match snaps.usage(snapshotter, &key).await {
            Ok(u) => {
                used_bytes += u.bytes.max(0) as u64;
                inodes_used += u.inodes.max(0) as u64;
            }
            // Removed between list and usage: it uses nothing now.
            Err(crate::containerd::error::ContainerdError::Call {
                code: tonic::Code::NotFound,
                ..
            }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let timestamp_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0);
    Ok(FsUsage {
        timestamp_ns,
        mountpoint: snaps.root(snapshotter).await?.unwrap_or_default(),
        used_bytes,
        inodes_used,
    })
}
