//! ImageFsInfo: how much of the image filesystem images use.

use std::path::PathBuf;

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

/// The usage of every snapshot in remora's namespace on the configured snapshotter, summed as
/// containerd's CRI does (from the last walk: see [`crate::lifecycle::snapshot_usage`]); the
/// mountpoint is the snapshotter's root directory.
pub async fn image_fs_info(rt: &Runtime) -> Result<FsUsage, CriError> {
    let c = rt.pods.snapshot_usage().latest().await?;
    Ok(FsUsage {
        timestamp_ns: c.timestamp_ns,
        mountpoint: c.root.clone().unwrap_or_default(),
        used_bytes: c.used_bytes,
        inodes_used: c.inodes_used,
    })
}
