//! ImageFsInfo: how much of the image filesystem images use.

use std::path::PathBuf;

use crate::backend_error::BackendError;

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

/// The totals of one walk over remora's snapshots on the configured snapshotter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotWalk {
    /// When the walk started, in nanoseconds since the epoch.
    pub timestamp_ns: i64,
    /// The snapshotter's root directory, if it names one.
    pub root: Option<PathBuf>,
    /// Bytes used by all snapshots.
    pub used_bytes: u64,
    /// Inodes used by all snapshots.
    pub inodes_used: u64,
}

/// Where ImageFsInfo reads the snapshotter's usage: the last periodic walk
/// (`crate::lifecycle::snapshot_usage`, wired in by the CRI layer).
#[async_trait::async_trait]
pub trait SnapshotTotals: Send + Sync {
    /// The last walk (waiting for the first one if none has run yet).
    async fn latest(&self) -> Result<SnapshotWalk, BackendError>;
}

/// The usage of every snapshot in remora's namespace on the configured snapshotter, summed as
/// containerd's CRI does (from the last walk); the mountpoint is the snapshotter's root
/// directory.
pub async fn image_fs_info(usage: &dyn SnapshotTotals) -> Result<FsUsage, BackendError> {
    let walk = usage.latest().await?;
    Ok(FsUsage {
        timestamp_ns: walk.timestamp_ns,
        mountpoint: walk.root.unwrap_or_default(),
        used_bytes: walk.used_bytes,
        inodes_used: walk.inodes_used,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Walked(SnapshotWalk);

    #[async_trait::async_trait]
    impl SnapshotTotals for Walked {
        async fn latest(&self) -> Result<SnapshotWalk, BackendError> {
            Ok(self.0.clone())
        }
    }

    #[tokio::test]
    async fn the_last_walk_is_reported_at_the_snapshotters_root() {
        let walk = SnapshotWalk {
            timestamp_ns: 7,
            root: Some("/var/lib/containerd/snapshots".into()),
            used_bytes: 4096,
            inodes_used: 3,
        };
        let got = image_fs_info(&Walked(walk)).await.expect("a walk");
        assert_eq!(
            got,
            FsUsage {
                timestamp_ns: 7,
                mountpoint: "/var/lib/containerd/snapshots".into(),
                used_bytes: 4096,
                inodes_used: 3,
            }
        );
        let rootless = image_fs_info(&Walked(SnapshotWalk::default())).await;
        assert_eq!(rootless.expect("a walk").mountpoint, PathBuf::new());
    }
}
