//! Progress of the pulls in flight, for operators: a table of pulls, each with its phase,
//! its layers and bytes done out of the total, and its rate.
//!
//! # Design
//! - **One entry per pull** (the coalesced leader's work, not per `PullImage` caller), made by
//!   [`Progress::start`] and removed when its [`PullHandle`] drops, whatever ended the pull.
//!   At most [`MAX_TRACKED`] pulls are in the table; a pull beyond that still runs, and is
//!   counted as untracked.
//! - **Bytes are counted per blob, not per pull.** A layer download is shared by every pull
//!   that needs the blob (`pull/download.rs` de-duplicates by digest), so the counter is the
//!   blob's: [`Progress::blob`] hands out one [`BlobBytes`] per digest while anyone holds it,
//!   and each pull sums its layers' counters. A pull that joins a download half done shows it
//!   half done. containerd's Transfer path sets the counters from containerd's reports.
//! - **The phase follows from the layers**: `resolving` until the manifest names them,
//!   `downloading` while one is neither stored nor present, then `unpacking` until the pull
//!   ends.
//! - **The rate** is the bytes done over the last [`RATE_WINDOW`], from samples taken when the
//!   table is read; [`log_loop`] reads it every second, so the rate is there for the log, the
//!   metrics and `remora pulls` alike.
//! - **Readers**: Prometheus gauges (`src/images/pull.rs` registers them), a log line per
//!   long pull at most every [`LOG_EVERY`] ([`log_loop`]), and `GET /pulls` on the status
//!   socket (`src/status.rs`), which `remora pulls` prints.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use slog::{info, Logger};
use tokio::sync::watch;

use super::lock;

/// Pulls tracked at once; more run untracked.
pub const MAX_TRACKED: usize = 256;
/// The window the rate is measured over.
pub const RATE_WINDOW: Duration = Duration::from_secs(10);
/// How often a pull is logged: first once it has run this long, then again each time.
pub const LOG_EVERY: Duration = Duration::from_secs(10);
/// Lines logged a second at most, longest pulls first; a pull left out is logged the next
/// second.
pub const MAX_LOGGED: usize = 16;
/// Samples kept per pull (one a second is taken at most).
const MAX_SAMPLES: usize = 16;

/// The bytes of one blob in the content store so far (a resumed download's offset included).
#[derive(Debug, Default)]
pub struct BlobBytes(AtomicU64);

impl BlobBytes {
    /// `n` more bytes arrived.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    /// At least `n` bytes are there (an offset containerd reports or resumes from).
    pub fn at_least(&self, n: u64) {
        self.0.fetch_max(n, Ordering::Relaxed);
    }

    fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Where one layer of a pull is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum LayerState {
    /// Not in the content store yet (waiting for a slot, or downloading).
    Fetching = 0,
    /// Downloaded into the content store by a pull.
    Stored = 1,
    /// In the content store before this pull needed it: nothing to download.
    Present = 2,
    /// Applied into its snapshot.
    Unpacked = 3,
}

impl LayerState {
    fn from_u8(v: u8) -> Self {
        match v {
            1 => LayerState::Stored,
            2 => LayerState::Present,
            3 => LayerState::Unpacked,
            _ => LayerState::Fetching,
        }
    }
}

/// A pull's phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Looking up the tag, reading the manifest and config.
    Resolving,
    /// Layers are still arriving.
    Downloading,
    /// Every layer is in the content store; applying them.
    Unpacking,
}

impl Phase {
    /// Every phase, in order.
    pub const ALL: [Phase; 3] = [Phase::Resolving, Phase::Downloading, Phase::Unpacking];

    /// The phase's name (`resolving`, `downloading`, `unpacking`).
    pub fn name(self) -> &'static str {
        match self {
            Phase::Resolving => "resolving",
            Phase::Downloading => "downloading",
            Phase::Unpacking => "unpacking",
        }
    }
}

#[derive(Debug)]
struct Layer {
    digest: String,
    size: u64,
    bytes: Arc<BlobBytes>,
    state: AtomicU8,
}

impl Layer {
    fn state(&self) -> LayerState {
        LayerState::from_u8(self.state.load(Ordering::Relaxed))
    }

    /// The layer's bytes that are there: all of a stored, present or unpacked layer's.
    fn done(&self) -> u64 {
        match self.state() {
            LayerState::Fetching => self.bytes.get().min(self.size),
            _ => self.size,
        }
    }
}

#[derive(Debug)]
struct PullState {
    id: u64,
    image: String,
    started: Instant,
    layers: OnceLock<Vec<Layer>>,
    /// (when, bytes done then), oldest first.
    samples: Mutex<VecDeque<(Instant, u64)>>,
    /// When it was last logged.
    logged: Mutex<Option<Instant>>,
}

/// What one pull in flight has done: what `GET /pulls` answers for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PullView {
    /// The pull's number (unique while remora runs).
    pub id: u64,
    /// The image as asked for.
    pub image: String,
    /// Its phase.
    pub phase: Phase,
    /// Seconds since it started.
    pub elapsed_secs: f64,
    /// Layers the manifest names (0 while resolving).
    pub layers: usize,
    /// Layers in the content store (downloaded, present before, or unpacked).
    pub layers_stored: usize,
    /// Layers that were in the content store before (nothing downloaded for them).
    pub layers_present: usize,
    /// Layers applied into their snapshots.
    pub layers_unpacked: usize,
    /// The layers' compressed size.
    pub bytes: u64,
    /// Of it, the bytes there so far (present layers' included).
    pub bytes_done: u64,
    /// Bytes a second over the last [`RATE_WINDOW`]; absent until two samples a second apart.
    pub rate_bytes_per_sec: Option<u64>,
}

/// Every pull in flight: what `GET /pulls` answers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PullsView {
    /// The tracked pulls, oldest first.
    pub pulls: Vec<PullView>,
    /// Pulls running beyond [`MAX_TRACKED`], not shown.
    pub untracked: u64,
}

#[derive(Debug, Default)]
struct Shared {
    pulls: Mutex<BTreeMap<u64, Arc<PullState>>>,
    next_id: AtomicU64,
    untracked: AtomicU64,
    /// One counter per blob digest while anyone holds it.
    blobs: Mutex<HashMap<String, Weak<BlobBytes>>>,
}

/// The table of pulls in flight (cheap to clone: one shared table).
#[derive(Debug, Clone, Default)]
pub struct Progress {
    shared: Arc<Shared>,
}

impl Progress {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// A pull of `image` starts: it is in the table (if there is room) until the handle drops.
    pub fn start(&self, image: &str) -> PullHandle {
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let state = Arc::new(PullState {
            id,
            image: image.to_string(),
            started: Instant::now(),
            layers: OnceLock::new(),
            samples: Mutex::new(VecDeque::new()),
            logged: Mutex::new(None),
        });
        let mut pulls = lock(&self.shared.pulls);
        let tracked = pulls.len() < MAX_TRACKED;
        if tracked {
            pulls.insert(id, state.clone());
        } else {
            self.shared.untracked.fetch_add(1, Ordering::Relaxed);
        }
        PullHandle {
            progress: self.clone(),
            state,
            tracked,
        }
    }

    /// The byte counter of blob `digest`, shared by everyone who holds it.
    pub fn blob(&self, digest: &str) -> Arc<BlobBytes> {
        let mut blobs = lock(&self.shared.blobs);
        if let Some(bytes) = blobs.get(digest).and_then(Weak::upgrade) {
            return bytes;
        }
        // Drop the counters no one holds any more, now and then: the map stays as large as
        // the blobs in flight, not every blob ever pulled.
        if blobs.len() >= 64 && blobs.len().is_power_of_two() {
            blobs.retain(|_, w| w.strong_count() > 0);
        }
        let bytes = Arc::new(BlobBytes::default());
        blobs.insert(digest.to_string(), Arc::downgrade(&bytes));
        bytes
    }

    /// Blob counters in the map (for tests).
    #[cfg(test)]
    fn blob_entries(&self) -> usize {
        lock(&self.shared.blobs).len()
    }

    /// Every tracked pull as it is at `now`; takes a rate sample of each.
    pub fn view(&self, now: Instant) -> PullsView {
        PullsView {
            pulls: self.states().iter().map(|p| p.view(now)).collect(),
            untracked: self.shared.untracked.load(Ordering::Relaxed),
        }
    }

    fn states(&self) -> Vec<Arc<PullState>> {
        lock(&self.shared.pulls).values().cloned().collect()
    }

    /// The pulls to log at `now`, marked logged: each that has run [`LOG_EVERY`] and was not
    /// logged in the last [`LOG_EVERY`], longest running first, [`MAX_LOGGED`] at most (the
    /// others stay due). Takes a rate sample of each pull.
    pub fn due_for_log(&self, now: Instant) -> Vec<PullView> {
        let mut due: Vec<(Arc<PullState>, PullView)> = self
            .states()
            .into_iter()
            .map(|state| {
                let view = state.view(now);
                (state, view)
            })
            .filter(|(state, view)| {
                view.elapsed_secs >= LOG_EVERY.as_secs_f64()
                    && lock(&state.logged)
                        .is_none_or(|at| now.saturating_duration_since(at) >= LOG_EVERY)
            })
            .collect();
        due.sort_by(|a, b| b.1.elapsed_secs.total_cmp(&a.1.elapsed_secs));
        due.truncate(MAX_LOGGED);
        due.into_iter()
            .map(|(state, view)| {
                *lock(&state.logged) = Some(now);
                view
            })
            .collect()
    }
}

impl PullState {
    fn view(&self, now: Instant) -> PullView {
        let layers = self.layers.get().map(Vec::as_slice).unwrap_or_default();
        let count = |f: &dyn Fn(LayerState) -> bool| layers.iter().filter(|l| f(l.state())).count();
        let layers_stored = count(&|s| s != LayerState::Fetching);
        let bytes_done: u64 = layers.iter().map(Layer::done).sum();
        let phase = if self.layers.get().is_none() {
            Phase::Resolving
        } else if layers_stored < layers.len() {
            Phase::Downloading
        } else {
            Phase::Unpacking
        };
        PullView {
            id: self.id,
            image: self.image.clone(),
            phase,
            elapsed_secs: now.saturating_duration_since(self.started).as_secs_f64(),
            layers: layers.len(),
            layers_stored,
            layers_present: count(&|s| s == LayerState::Present),
            layers_unpacked: count(&|s| s == LayerState::Unpacked),
            bytes: layers.iter().map(|l| l.size).sum(),
            bytes_done,
            rate_bytes_per_sec: self.sample(now, bytes_done),
        }
    }

    /// Records `bytes` at `now` (at most one sample a second), drops samples older than the
    /// window (keeping one), and gives the rate since the oldest.
    fn sample(&self, now: Instant, bytes: u64) -> Option<u64> {
        let mut samples = lock(&self.samples);
        let due = samples
            .back()
            .is_none_or(|(at, _)| now.saturating_duration_since(*at) >= Duration::from_secs(1));
        if due {
            samples.push_back((now, bytes));
        }
        while samples.len() > MAX_SAMPLES
            || (samples.len() > 2
                && samples
                    .get(1)
                    .is_some_and(|(at, _)| now.saturating_duration_since(*at) >= RATE_WINDOW))
        {
            samples.pop_front();
        }
        let (at, then) = *samples.front()?;
        let span = now.saturating_duration_since(at).as_secs_f64();
        if span < 1.0 {
            return None;
        }
        Some((bytes.saturating_sub(then) as f64 / span) as u64)
    }
}

/// One pull's entry in the table; dropping it removes the entry.
#[derive(Debug)]
pub struct PullHandle {
    progress: Progress,
    state: Arc<PullState>,
    tracked: bool,
}

impl PullHandle {
    /// The manifest named the layers (`(digest, compressed size)`, bottom first): the pull
    /// downloads from now on. Only the first call counts.
    pub fn layers<'a>(&self, layers: impl IntoIterator<Item = (&'a str, u64)>) {
        let layers = layers
            .into_iter()
            .map(|(digest, size)| Layer {
                digest: digest.to_string(),
                size,
                bytes: self.progress.blob(digest),
                state: AtomicU8::new(LayerState::Fetching as u8),
            })
            .collect();
        let _ = self.state.layers.set(layers);
    }

    /// Layer `digest` (every layer of that digest: an image may name one twice) moved on to
    /// `state`. A state never goes back (an unpacked layer stays unpacked).
    pub fn layer(&self, digest: &str, state: LayerState) {
        for layer in self.state.layers.get().into_iter().flatten() {
            if layer.digest == digest {
                layer.state.fetch_max(state as u8, Ordering::Relaxed);
            }
        }
    }

    /// The `i`th layer (bottom first) was applied into its snapshot.
    pub fn unpacked(&self, i: usize) {
        if let Some(layer) = self.state.layers.get().and_then(|l| l.get(i)) {
            layer
                .state
                .fetch_max(LayerState::Unpacked as u8, Ordering::Relaxed);
        }
    }

    /// The byte counter of layer `digest`, if the pull has that layer.
    pub fn bytes_of(&self, digest: &str) -> Option<Arc<BlobBytes>> {
        self.state
            .layers
            .get()?
            .iter()
            .find(|l| l.digest == digest)
            .map(|l| l.bytes.clone())
    }

    /// The pull as it is now.
    pub fn view(&self) -> PullView {
        self.state.view(Instant::now())
    }
}

impl Drop for PullHandle {
    fn drop(&mut self) {
        if self.tracked {
            lock(&self.progress.shared.pulls).remove(&self.state.id);
        } else {
            self.progress
                .shared
                .untracked
                .fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// A byte count for people: `512 B`, `3.4 MiB`, `1.0 GiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Samples every pull each second (the rate), and logs each pull every [`LOG_EVERY`] once it
/// has run that long ([`Progress::due_for_log`]), until `stop` turns true.
pub async fn log_loop(progress: Progress, mut stop: watch::Receiver<bool>, log: Logger) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() {
                    return;
                }
                continue;
            }
        }
        for p in progress.due_for_log(Instant::now()) {
            info!(log, "pull in progress";
                "image" => &p.image, "pull" => p.id, "phase" => p.phase.name(),
                "layers" => format!("{}/{}", p.layers_stored, p.layers),
                "unpacked" => p.layers_unpacked,
                "bytes" => format!("{}/{}", human_bytes(p.bytes_done), human_bytes(p.bytes)),
                "rate" => p.rate_bytes_per_sec.map(|r| format!("{}/s", human_bytes(r))).unwrap_or_default(),
                "elapsed_s" => p.elapsed_secs as u64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "sha256:aaaa";
    const B: &str = "sha256:bbbb";

    #[test]
    fn a_pull_resolves_then_downloads_then_unpacks_and_leaves_the_table() {
        let progress = Progress::new();
        let pull = progress.start("registry.test/app:1");
        let now = Instant::now();
        let v = progress.view(now);
        assert_eq!(v.pulls.len(), 1);
        assert_eq!(v.pulls[0].phase, Phase::Resolving);
        assert_eq!((v.pulls[0].layers, v.pulls[0].bytes), (0, 0));

        pull.layers([(A, 100), (B, 300)]);
        pull.bytes_of(A).expect("layer A").add(40);
        let v = pull.view();
        assert_eq!(v.phase, Phase::Downloading);
        assert_eq!(
            (v.layers, v.layers_stored, v.bytes, v.bytes_done),
            (2, 0, 400, 40)
        );

        pull.layer(A, LayerState::Stored);
        pull.layer(B, LayerState::Present);
        let v = pull.view();
        assert_eq!(v.phase, Phase::Unpacking);
        assert_eq!(
            (v.layers_stored, v.layers_present, v.bytes_done),
            (2, 1, 400)
        );

        pull.unpacked(0);
        pull.unpacked(1);
        pull.unpacked(7); // no such layer: nothing
        assert_eq!(pull.view().layers_unpacked, 2);
        // A state never goes back.
        pull.layer(A, LayerState::Stored);
        assert_eq!(pull.view().layers_unpacked, 2);

        drop(pull);
        assert_eq!(progress.view(Instant::now()), PullsView::default());
    }

    #[test]
    fn two_pulls_of_one_blob_share_its_bytes() {
        let progress = Progress::new();
        let first = progress.start("a");
        let second = progress.start("b");
        first.layers([(A, 1000)]);
        // The download, led by whichever pull, counts into the blob's counter.
        progress.blob(A).add(250);
        second.layers([(A, 1000), (B, 10)]);
        assert_eq!(first.view().bytes_done, 250);
        assert_eq!(second.view().bytes_done, 250);
        // Bytes past a layer's size (a registry sending too much) are not counted.
        progress.blob(A).at_least(5000);
        assert_eq!(first.view().bytes_done, 1000);
        drop((first, second));
        // No one holds the counters any more: the next look-up makes a new one.
        assert_eq!(progress.blob(A).get(), 0);
    }

    #[test]
    fn the_blob_map_forgets_counters_no_one_holds() {
        let progress = Progress::new();
        for i in 0..1000 {
            let _held_briefly = progress.blob(&format!("sha256:{i}"));
        }
        assert!(
            progress.blob_entries() <= 128,
            "{}",
            progress.blob_entries()
        );
    }

    #[test]
    fn the_rate_is_over_the_last_window() {
        let progress = Progress::new();
        let pull = progress.start("a");
        pull.layers([(A, 1 << 30)]);
        let t0 = Instant::now();
        let bytes = pull.bytes_of(A).expect("layer");
        assert_eq!(progress.view(t0).pulls[0].rate_bytes_per_sec, None);
        for s in 1..=30u64 {
            // 1 MiB/s for 20 s, then 3 MiB/s.
            bytes.add(if s <= 20 { 1 << 20 } else { 3 << 20 });
            let v = progress.view(t0 + Duration::from_secs(s));
            let rate = v.pulls[0].rate_bytes_per_sec.expect("a rate");
            if s == 5 {
                assert_eq!(rate, 1 << 20);
            }
            if s == 30 {
                // The last 10 s only (the window), not the average since the start.
                assert_eq!(rate, 3 << 20);
            }
        }
    }

    #[test]
    fn beyond_the_cap_pulls_run_untracked_and_are_counted() {
        let progress = Progress::new();
        let handles: Vec<_> = (0..MAX_TRACKED + 3)
            .map(|i| progress.start(&i.to_string()))
            .collect();
        let v = progress.view(Instant::now());
        assert_eq!((v.pulls.len(), v.untracked), (MAX_TRACKED, 3));
        drop(handles);
        assert_eq!(progress.view(Instant::now()), PullsView::default());
    }

    #[test]
    fn each_pull_is_logged_every_ten_seconds_once_it_has_run_ten_longest_first() {
        let progress = Progress::new();
        let t0 = Instant::now();
        let handles: Vec<_> = (0..MAX_LOGGED + 4)
            .map(|i| progress.start(&format!("i{i}")))
            .collect();
        let ids = |v: Vec<PullView>| v.iter().map(|p| p.id).collect::<Vec<_>>();
        assert!(
            progress.due_for_log(t0 + Duration::from_secs(9)).is_empty(),
            "too young"
        );
        let at10 = t0 + LOG_EVERY + Duration::from_millis(500);
        let first = progress.due_for_log(at10);
        assert_eq!(first.len(), MAX_LOGGED, "at most MAX_LOGGED at once");
        // Started one after another: the first started has run longest.
        assert_eq!(first[0].id, handles[0].view().id);
        // The rest the next second; those logged are not due again for 10 s.
        let second = ids(progress.due_for_log(at10 + Duration::from_secs(1)));
        assert_eq!(second.len(), 4);
        assert!(progress
            .due_for_log(at10 + Duration::from_secs(2))
            .is_empty());
        assert!(progress
            .due_for_log(at10 + Duration::from_secs(9))
            .is_empty());
        assert_eq!(
            progress.due_for_log(at10 + Duration::from_secs(10)).len(),
            MAX_LOGGED
        );
        drop(handles);
        assert!(progress
            .due_for_log(at10 + Duration::from_secs(60))
            .is_empty());
    }

    #[test]
    fn bytes_read_for_people() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(1 << 30), "1.0 GiB");
    }
}
