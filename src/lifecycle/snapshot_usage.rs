//! Disk usage of the snapshotter's snapshots, walked at most once per [`COLLECT_PERIOD`] and
//! answered from the last walk, as containerd's CRI answers ImageFsInfo and container stats
//! from the snapshot store its syncer refreshes (`stats_collect_period`, 10 s).
//!
//! Each snapshot's usage is one containerd call; ImageFsInfo summed them all, one after the
//! other, on every request, and every container in ListContainerStats / ListPodSandboxStats
//! made two (usage and the snapshotter's root). kubelet calls these every few seconds, and
//! crictl checks its image connection with ImageFsInfo: at 300 containers `crictl ps` spent
//! half a second there. A walk now runs at most one at a time, eight calls in flight; a caller
//! gets the last walk at once, and a walk older than the period is renewed in the background
//! (only the first caller, with no walk yet, waits for one).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use slog::{warn, Logger};

use crate::backend_error::BackendError;
use crate::images::backend::Snapshots;

/// How old a walk may be before a caller starts a new one (containerd's default
/// `stats_collect_period`).
pub const COLLECT_PERIOD: Duration = Duration::from_secs(10);

/// Usage calls a walk keeps in flight at once.
const IN_FLIGHT: usize = 8;

/// One walk's result.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Collected {
    /// When the walk started, in nanoseconds since the epoch.
    pub timestamp_ns: i64,
    /// Bytes and inodes of each snapshot, by key.
    pub per_key: HashMap<String, (u64, u64)>,
    /// Bytes used by all snapshots.
    pub used_bytes: u64,
    /// Inodes used by all snapshots.
    pub inodes_used: u64,
    /// The snapshotter's root directory (`None` if its plugin exports none).
    pub root: Option<PathBuf>,
}

/// The last walk and when it started (monotonic).
type Last = Option<(Instant, Arc<Collected>)>;

/// The usage cache of one snapshotter.
pub struct SnapshotUsage {
    snapshots: Arc<dyn Snapshots>,
    snapshotter: String,
    period: Duration,
    last: Mutex<Last>,
    /// Held by the walk in progress: one at a time.
    walking: Arc<tokio::sync::Mutex<()>>,
    log: Logger,
}

impl SnapshotUsage {
    /// A cache over `snapshotter`'s snapshots, renewed when older than `period`.
    pub fn new(
        snapshots: Arc<dyn Snapshots>,
        snapshotter: String,
        period: Duration,
        log: Logger,
    ) -> Self {
        SnapshotUsage {
            snapshots,
            snapshotter,
            period,
            last: Mutex::new(None),
            walking: Arc::new(tokio::sync::Mutex::new(())),
            log,
        }
    }

    fn last(&self) -> Last {
        // A poisoned lock only means a panic elsewhere while it was held; the value (an Arc
        // swap) is never half-written.
        self.last.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The last walk: at once if there is one (a stale one starts a new walk in the
    /// background); otherwise after a walk made now (shared with concurrent callers).
    pub async fn latest(self: &Arc<Self>) -> Result<Arc<Collected>, BackendError> {
        if let Some((at, collected)) = self.last() {
            if at.elapsed() >= self.period {
                self.renew_in_background();
            }
            return Ok(collected);
        }
        let _walk = self.walking.lock().await;
        // Another caller's walk may have finished while this one waited.
        if let Some((_, collected)) = self.last() {
            return Ok(collected);
        }
        self.walk().await
    }

    /// One snapshot's bytes and inodes and the snapshotter root, from the last walk when it
    /// has the key, else asked of containerd now (a container newer than the walk); `None` if
    /// the snapshot is gone or containerd cannot say.
    pub async fn of(self: &Arc<Self>, key: &str) -> Option<(u64, u64, PathBuf)> {
        let collected = self.latest().await.ok();
        if let Some(c) = &collected {
            if let Some(&(bytes, inodes)) = c.per_key.get(key) {
                return Some((bytes, inodes, c.root.clone().unwrap_or_default()));
            }
        }
        let u = self.snapshots.usage(&self.snapshotter, key).await.ok()?;
        // The walk's root when there was a walk (it is the same directory); else asked now.
        let root = match collected {
            Some(c) => c.root.clone(),
            None => self.snapshots.root(&self.snapshotter).await.ok().flatten(),
        };
        Some((
            u.bytes.max(0) as u64,
            u.inodes.max(0) as u64,
            root.unwrap_or_default(),
        ))
    }

    /// Starts a walk unless one is running.
    fn renew_in_background(self: &Arc<Self>) {
        let Ok(guard) = Arc::clone(&self.walking).try_lock_owned() else {
            return;
        };
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let _guard = guard;
            if let Err(e) = this.walk().await {
                warn!(this.log, "snapshot usage walk failed; the last one stays";
                    "snapshotter" => &this.snapshotter, "error" => %e);
            }
        });
    }

    /// Walks every snapshot (the caller holds `walking`) and keeps the result.
    async fn walk(&self) -> Result<Arc<Collected>, BackendError> {
        let started = Instant::now();
        let timestamp_ns = super::now_ns();
        let keys = self.snapshots.list(&self.snapshotter).await?;
        let root = self.snapshots.root(&self.snapshotter).await?;
        let previous = self.last();
        let mut results = futures_util::stream::iter(keys)
            .map(|key| async move {
                let usage = self.snapshots.usage(&self.snapshotter, &key).await;
                (key, usage)
            })
            .buffer_unordered(IN_FLIGHT);
        let mut collected = Collected {
            timestamp_ns,
            root,
            ..Collected::default()
        };
        let mut failed = 0usize;
        let mut first_error = None;
        while let Some((key, usage)) = results.next().await {
            let figures = match usage {
                Ok(u) => (u.bytes.max(0) as u64, u.inodes.max(0) as u64),
                // Removed between the list and its usage: it uses nothing now.
                Err(e) if e.is_not_found() => continue,
                // Keep what the last walk knew of it rather than count it as empty.
                Err(e) => {
                    failed += 1;
                    first_error.get_or_insert(e);
                    match previous.as_ref().and_then(|(_, p)| p.per_key.get(&key)) {
                        Some(&known) => known,
                        None => continue,
                    }
                }
            };
            collected.used_bytes = collected.used_bytes.saturating_add(figures.0);
            collected.inodes_used = collected.inodes_used.saturating_add(figures.1);
            collected.per_key.insert(key, figures);
        }
        if let Some(e) = first_error {
            warn!(self.log, "snapshot usage unknown for some snapshots";
                "snapshotter" => &self.snapshotter, "failed" => failed, "error" => %e);
        }
        let collected = Arc::new(collected);
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((started, Arc::clone(&collected)));
        Ok(collected)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::backend_error::BackendCode;
    use crate::images::backend::{Mount, Usage};

    /// A snapshot's bytes and inodes, or the code its usage call fails with.
    type Figures = Result<(i64, i64), BackendCode>;

    /// Snapshots with set usages; counts list and usage calls; a key can be made to fail.
    #[derive(Default)]
    struct Fake {
        usage: Mutex<HashMap<String, Figures>>,
        lists: AtomicUsize,
        usages: AtomicUsize,
    }

    impl Fake {
        fn set(&self, key: &str, v: Figures) {
            self.usage.lock().unwrap().insert(key.into(), v);
        }
    }

    fn error(code: BackendCode) -> BackendError {
        BackendError::Call {
            address: PathBuf::from("/fake"),
            op: "Snapshots.Usage",
            code,
            message: "fake".into(),
        }
    }

    #[async_trait::async_trait]
    impl Snapshots for Fake {
        async fn exists(&self, _: &str, _: &str) -> Result<bool, BackendError> {
            Ok(false)
        }
        async fn prepare(
            &self,
            _: &str,
            _: &str,
            _: &str,
            _: &str,
            _: &HashMap<String, String>,
        ) -> Result<Vec<Mount>, BackendError> {
            Ok(Vec::new())
        }
        async fn view(
            &self,
            _: &str,
            _: &str,
            _: &str,
            _: &str,
            _: &HashMap<String, String>,
        ) -> Result<Vec<Mount>, BackendError> {
            Ok(Vec::new())
        }
        async fn mounts(&self, _: &str, _: &str) -> Result<Vec<Mount>, BackendError> {
            Ok(Vec::new())
        }
        async fn commit(
            &self,
            _: &str,
            _: &str,
            _: &str,
            _: &str,
            _: HashMap<String, String>,
        ) -> Result<(), BackendError> {
            Ok(())
        }
        async fn remove(&self, _: &str, _: &str) -> Result<(), BackendError> {
            Ok(())
        }
        async fn list(&self, _: &str) -> Result<Vec<String>, BackendError> {
            self.lists.fetch_add(1, Ordering::SeqCst);
            let mut keys: Vec<String> = self.usage.lock().unwrap().keys().cloned().collect();
            keys.sort();
            Ok(keys)
        }
        async fn usage(&self, _: &str, key: &str) -> Result<Usage, BackendError> {
            self.usages.fetch_add(1, Ordering::SeqCst);
            // Let the other calls of a walk run between them.
            tokio::task::yield_now().await;
            match self.usage.lock().unwrap().get(key) {
                Some(Ok((bytes, inodes))) => Ok(Usage {
                    bytes: *bytes,
                    inodes: *inodes,
                }),
                Some(Err(code)) => Err(error(*code)),
                None => Err(error(BackendCode::NotFound)),
            }
        }
        async fn root(&self, _: &str) -> Result<Option<PathBuf>, BackendError> {
            Ok(Some(PathBuf::from("/snapshots/root")))
        }
    }

    fn cache(fake: &Arc<Fake>, period: Duration) -> Arc<SnapshotUsage> {
        Arc::new(SnapshotUsage::new(
            Arc::clone(fake) as Arc<dyn Snapshots>,
            "overlayfs".into(),
            period,
            Logger::root(slog::Discard, slog::o!()),
        ))
    }

    #[tokio::test]
    async fn a_walk_sums_every_snapshot_and_skips_the_removed() {
        let fake = Arc::new(Fake::default());
        fake.set("a", Ok((100, 3)));
        fake.set("b", Ok((20, 2)));
        // Negative figures (containerd's "unknown") count as nothing.
        fake.set("c", Ok((-1, -1)));
        fake.set("gone", Err(BackendCode::NotFound));
        let c = cache(&fake, COLLECT_PERIOD).latest().await.unwrap();
        assert_eq!((c.used_bytes, c.inodes_used), (120, 5));
        assert_eq!(
            c.root.as_deref(),
            Some(std::path::Path::new("/snapshots/root"))
        );
        assert_eq!(c.per_key.get("a"), Some(&(100, 3)));
        assert!(!c.per_key.contains_key("gone"));
    }

    /// Before, every ImageFsInfo asked containerd for every snapshot's usage again.
    #[tokio::test]
    async fn calls_within_the_period_share_one_walk() {
        let fake = Arc::new(Fake::default());
        for i in 0..50 {
            fake.set(&format!("s{i}"), Ok((1, 1)));
        }
        let usage = cache(&fake, COLLECT_PERIOD);
        let firsts = futures_util::future::join_all((0..5).map(|_| usage.latest())).await;
        for _ in 0..5 {
            usage.latest().await.unwrap();
        }
        assert!(firsts.iter().all(|c| c.as_ref().unwrap().used_bytes == 50));
        assert_eq!(fake.lists.load(Ordering::SeqCst), 1);
        assert_eq!(fake.usages.load(Ordering::SeqCst), 50);
    }

    #[tokio::test]
    async fn a_stale_walk_is_answered_at_once_and_renewed_in_the_background() {
        let fake = Arc::new(Fake::default());
        fake.set("a", Ok((10, 1)));
        let usage = cache(&fake, Duration::ZERO);
        assert_eq!(usage.latest().await.unwrap().used_bytes, 10);
        fake.set("b", Ok((5, 1)));
        // The stale walk comes back (10) while a new one starts; it shows the new snapshot.
        assert_eq!(usage.latest().await.unwrap().used_bytes, 10);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if usage.latest().await.unwrap().used_bytes == 15 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the background walk never landed"
            );
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_snapshot_that_fails_keeps_what_the_last_walk_knew() {
        let fake = Arc::new(Fake::default());
        fake.set("a", Ok((10, 1)));
        fake.set("b", Ok((7, 2)));
        let usage = cache(&fake, Duration::ZERO);
        usage.latest().await.unwrap();
        fake.set("b", Err(BackendCode::Unavailable));
        fake.set("new", Err(BackendCode::Unavailable));
        let _guard = usage.walking.lock().await;
        let c = usage.walk().await.unwrap();
        assert_eq!((c.used_bytes, c.inodes_used), (17, 3));
        assert!(!c.per_key.contains_key("new"));
    }

    #[tokio::test]
    async fn a_snapshot_newer_than_the_walk_is_asked_for_directly() {
        let fake = Arc::new(Fake::default());
        fake.set("old", Ok((10, 1)));
        let usage = cache(&fake, COLLECT_PERIOD);
        assert_eq!(
            usage.of("old").await,
            Some((10, 1, PathBuf::from("/snapshots/root")))
        );
        let calls = fake.usages.load(Ordering::SeqCst);
        fake.set("new", Ok((4, 2)));
        assert_eq!(
            usage.of("new").await,
            Some((4, 2, PathBuf::from("/snapshots/root")))
        );
        assert_eq!(fake.usages.load(Ordering::SeqCst), calls + 1);
        assert_eq!(usage.of("missing").await, None);
    }
}
