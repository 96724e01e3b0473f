//! Tests of the stats sampler (`super`): single flight, the period, freshness, failures and
//! the in-flight bound, over a recording fake source.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Condvar;

use super::super::cgroup_stats::{CpuStats, MemoryStats};
use super::*;

/// A source that records its reads and answers figures made from the pid and the number of
/// reads so far (CPU time grows a second per read). Reads of pids in `panics` panic;
/// while the gate is shut, reads wait at it.
#[derive(Default)]
struct Fake {
    containers: Mutex<HashMap<u32, usize>>,
    sandboxes: Mutex<HashMap<String, usize>>,
    extras: AtomicUsize,
    panics: Mutex<HashSet<u32>>,
    gate: Gate,
}

/// Reads wait here while it is shut; it counts who is in.
#[derive(Default)]
struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Default)]
struct GateState {
    shut: bool,
    /// Reads that may pass while it is shut.
    passes: usize,
    inside: usize,
    most_inside: usize,
}

impl Gate {
    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap()
    }

    fn go_through(&self) {
        let mut g = self.lock();
        g.inside += 1;
        g.most_inside = g.most_inside.max(g.inside);
        self.changed.notify_all();
        while g.shut && g.passes == 0 {
            g = self.changed.wait(g).unwrap();
        }
        if g.shut {
            g.passes -= 1;
        }
        g.inside -= 1;
        self.changed.notify_all();
    }

    fn set(&self, shut: bool) {
        self.lock().shut = shut;
        self.changed.notify_all();
    }

    fn pass_one(&self) {
        self.lock().passes += 1;
        self.changed.notify_all();
    }
}

/// Opens the gate when dropped: a failing test's blocked reads end, and its runtime (which
/// waits for blocking threads) with them.
struct OpenOnDrop(Arc<Fake>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.gate.set(false);
    }
}

fn figures(pid: u32, reads: usize) -> CgroupStats {
    CgroupStats {
        cpu: Some(CpuStats {
            usage_ns: reads as u64 * 1_000_000_000,
            ..Default::default()
        }),
        memory: Some(MemoryStats {
            usage: pid as u64,
            ..Default::default()
        }),
        ..Default::default()
    }
}

impl StatsSource for Fake {
    fn container(&self, pid: u32, need: &Need) -> ContainerFigures {
        self.gate.go_through();
        let reads = {
            let mut c = self.containers.lock().unwrap();
            let n = c.entry(pid).or_default();
            *n += 1;
            *n
        };
        if self.panics.lock().unwrap().contains(&pid) {
            panic!("the fake's read of {pid} fails");
        }
        if need.extras {
            self.extras.fetch_add(1, Ordering::SeqCst);
        }
        ContainerFigures {
            cgroup: figures(pid, reads),
            extras: need.extras.then(ContainerExtras::default),
        }
    }

    fn sandbox(&self, target: &SandboxTarget) -> SandboxFigures {
        self.gate.go_through();
        let reads = {
            let mut s = self.sandboxes.lock().unwrap();
            let n = s.entry(target.id.clone()).or_default();
            *n += 1;
            *n
        };
        SandboxFigures {
            own: Some(figures(target.pid, reads)),
            ..Default::default()
        }
    }
}

impl Fake {
    fn reads_of(&self, pid: u32) -> usize {
        self.containers
            .lock()
            .unwrap()
            .get(&pid)
            .copied()
            .unwrap_or(0)
    }

    fn pod_reads_of(&self, id: &str) -> usize {
        self.sandboxes.lock().unwrap().get(id).copied().unwrap_or(0)
    }
}

const PERIOD: Duration = Duration::from_secs(10);

fn sampler(fake: &Arc<Fake>, in_flight: usize) -> Arc<StatsSampler> {
    StatsSampler::new(
        fake.clone(),
        Limits {
            period: PERIOD,
            in_flight,
            read_timeout: READ_TIMEOUT,
            collect_deadline: COLLECT_DEADLINE,
        },
        Logger::root(slog::Discard, slog::o!()),
    )
}

fn containers(pids: impl IntoIterator<Item = u32>) -> Vec<ContainerTarget> {
    pids.into_iter()
        .map(|pid| ContainerTarget {
            id: format!("c{pid}"),
            pid,
        })
        .collect()
}

fn pods(n: u32) -> Vec<SandboxTarget> {
    (1..=n)
        .map(|i| SandboxTarget {
            id: format!("p{i}"),
            pid: 100 + i,
            cgroup_parent: String::new(),
            network: NetworkSource::Host,
        })
        .collect()
}

fn targets(pids: impl IntoIterator<Item = u32>, n_pods: u32) -> Targets {
    Targets {
        containers: containers(pids),
        sandboxes: pods(n_pods),
    }
}

/// Counts the collections it is told of.
#[derive(Default)]
struct Count(AtomicUsize);

impl SampleObserver for Arc<Count> {
    fn sampled(&self, _: Duration) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::test(start_paused = true)]
async fn concurrent_calls_within_a_period_read_each_container_once() {
    let fake = Arc::new(Fake::default());
    let s = sampler(&fake, 4);
    let count = Arc::new(Count::default());
    s.set_observer(Box::new(count.clone()));
    // Reads wait at the gate until every call is waiting for the collection.
    fake.gate.set(true);
    let calls: Vec<_> = (0..16)
        .map(|_| {
            let s = s.clone();
            tokio::spawn(async move {
                s.read(&Need::default(), targets(1..=20, 3), || targets(1..=20, 3))
                    .await
            })
        })
        .collect();
    tokio::task::yield_now().await;
    fake.gate.set(false);
    for call in calls {
        let r = call.await.expect("a call");
        assert_eq!((r.containers.len(), r.sandboxes.len()), (20, 3));
        assert_eq!(
            r.containers["c7"].figures.cgroup.memory.map(|m| m.usage),
            Some(7)
        );
    }
    for pid in 1..=20 {
        assert_eq!(fake.reads_of(pid), 1, "container {pid}");
    }
    for pod in ["p1", "p2", "p3"] {
        assert_eq!(fake.pod_reads_of(pod), 1, "{pod}");
    }
    // Later within the period: the same sample, the same readings.
    tokio::time::advance(PERIOD / 2).await;
    let again = s
        .read(&Need::default(), targets(1..=20, 3), || targets(1..=20, 3))
        .await;
    assert_eq!(fake.reads_of(3), 1);
    assert_eq!(count.0.load(Ordering::SeqCst), 1, "one collection");
    assert_eq!(again.containers["c3"].usage_nano_cores, None, "one reading");
}

#[tokio::test(start_paused = true)]
async fn a_sample_older_than_the_period_is_taken_again_with_the_cpu_rate() {
    let fake = Arc::new(Fake::default());
    let s = sampler(&fake, 2);
    let all = || targets([1, 2], 1);
    let first = s.read(&Need::default(), all(), all).await;
    tokio::time::advance(PERIOD - Duration::from_millis(1)).await;
    s.read(&Need::default(), all(), all).await;
    assert_eq!(fake.reads_of(1), 1, "still within the period");
    tokio::time::advance(Duration::from_millis(1)).await;
    let second = s.read(&Need::default(), all(), all).await;
    assert_eq!((fake.reads_of(1), fake.reads_of(2)), (2, 2));
    assert_eq!(fake.pod_reads_of("p1"), 2);
    let (a, b) = (&first.containers["c1"], &second.containers["c1"]);
    assert!(b.timestamp_ns > a.timestamp_ns, "each reading has its time");
    // One second of CPU between the readings, over the time between them.
    let expected = rate(
        (a.timestamp_ns, 1_000_000_000),
        (b.timestamp_ns, 2_000_000_000),
    );
    assert!(expected.is_some());
    assert_eq!(b.usage_nano_cores, expected);
    assert_eq!(
        second.sandboxes["p1"].usage_nano_cores,
        rate(
            (first.sandboxes["p1"].timestamp_ns, 1_000_000_000),
            (second.sandboxes["p1"].timestamp_ns, 2_000_000_000)
        )
    );
    assert_eq!(a.usage_nano_cores, None);
}

#[test]
fn the_rate_needs_time_between_readings_and_a_counter_that_grew() {
    assert_eq!(
        rate((0, 0), (2_000_000_000, 1_000_000_000)),
        Some(500_000_000)
    );
    assert_eq!(rate((5, 10), (5, 20)), None, "no time between them");
    assert_eq!(rate((5, 10), (4, 20)), None, "out of order");
    assert_eq!(rate((0, 20), (5, 10)), None, "a counter that went back");
}

#[tokio::test(start_paused = true)]
async fn a_container_started_since_the_sample_is_read_at_once_and_a_removed_one_is_gone() {
    let fake = Arc::new(Fake::default());
    let s = sampler(&fake, 2);
    let count = Arc::new(Count::default());
    s.set_observer(Box::new(count.clone()));
    s.read(&Need::default(), targets([1, 2], 0), || targets([1, 2], 0))
        .await;
    // Container 3 started after the sample: read now, alone, and kept for the period.
    let r = s
        .read(&Need::default(), targets([1, 2, 3], 0), || {
            panic!("no new collection within the period")
        })
        .await;
    assert_eq!(r.containers["c3"].pid, 3);
    assert_eq!(
        (fake.reads_of(1), fake.reads_of(2), fake.reads_of(3)),
        (1, 1, 1)
    );
    s.read(&Need::default(), targets([3], 0), || unreachable!())
        .await;
    assert_eq!(fake.reads_of(3), 1, "kept for the rest of the period");
    // A container restarted as another process is not the one read.
    let restarted = Targets {
        containers: vec![ContainerTarget {
            id: "c3".into(),
            pid: 33,
        }],
        ..Default::default()
    };
    let r = s.read(&Need::default(), restarted, || unreachable!()).await;
    assert_eq!(
        (r.containers["c3"].pid, r.containers["c3"].usage_nano_cores),
        (33, None),
        "no rate across two processes"
    );

    // Container 2 removed: forgotten at once, and not read by the next collection.
    s.forget("c2");
    assert!(!s.lock().containers.contains_key("c2"));
    tokio::time::advance(PERIOD).await;
    let r = s
        .read(&Need::default(), targets([1, 3], 0), || targets([1, 3], 0))
        .await;
    assert!(!r.containers.contains_key("c2"));
    assert_eq!(fake.reads_of(2), 1);
    assert_eq!(count.0.load(Ordering::SeqCst), 2);
    let cached: HashSet<String> = s.lock().containers.keys().cloned().collect();
    assert_eq!(cached, HashSet::from(["c1".to_string(), "c3".into()]));
}

#[tokio::test(start_paused = true)]
async fn extras_are_read_while_metrics_are_asked_for() {
    let fake = Arc::new(Fake::default());
    let s = sampler(&fake, 2);
    let all = || targets([1, 2], 0);
    s.read(&Need::default(), all(), all).await;
    assert_eq!(fake.extras.load(Ordering::SeqCst), 0, "no metrics call yet");
    let metrics = Need {
        extras: true,
        writable_root: None,
    };
    let r = s.read(&metrics, all(), all).await;
    assert!(r.containers.values().all(|c| c.figures.extras.is_some()));
    assert_eq!(fake.extras.load(Ordering::SeqCst), 2);
    assert_eq!(fake.reads_of(1), 2, "a sample with the extras, once");
    s.read(&metrics, all(), all).await;
    assert_eq!(fake.reads_of(1), 2);
    // The next period's sample, asked for by a stats call, has them too.
    tokio::time::advance(PERIOD).await;
    s.read(&Need::default(), all(), all).await;
    assert_eq!(fake.extras.load(Ordering::SeqCst), 4);
    s.read(&metrics, all(), all).await;
    assert_eq!(fake.reads_of(1), 3);
}

/// Waits (at most 10 s) until `done` holds.
async fn until(what: &str, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "waited too long for {what}"
        );
        tokio::task::yield_now().await;
        std::thread::yield_now();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_that_panics_answers_its_waiters_without_figures() {
    let fake = Arc::new(Fake::default());
    fake.panics.lock().unwrap().insert(2);
    let s = sampler(&fake, 2);
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let s = s.clone();
            tokio::spawn(async move {
                s.read(&Need::default(), targets(1..=4, 0), || targets(1..=4, 0))
                    .await
            })
        })
        .collect();
    for call in calls {
        let r = tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .expect("answered")
            .expect("a call");
        assert_eq!(r.containers["c2"].figures, ContainerFigures::default());
        assert!(r.containers["c1"].figures.cgroup.memory.is_some());
    }
    assert_eq!(
        fake.reads_of(2),
        1,
        "a failed read is not retried within the period"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_that_hangs_answers_its_waiters_at_the_read_timeout() {
    let fake = Arc::new(Fake::default());
    let s = StatsSampler::new(
        fake.clone(),
        Limits {
            period: PERIOD,
            in_flight: 1,
            read_timeout: Duration::from_millis(50),
            collect_deadline: Duration::from_millis(100),
        },
        Logger::root(slog::Discard, slog::o!()),
    );
    fake.gate.set(true);
    let _open = OpenOnDrop(fake.clone());
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        s.read(&Need::default(), targets([1, 2], 0), || targets([1, 2], 0)),
    )
    .await
    .expect("answered while the reads hang");
    // The first read holds the only slot; the second found none by the deadline.
    assert_eq!(r.containers.len(), 2);
    assert!(r
        .containers
        .values()
        .all(|c| c.figures == ContainerFigures::default()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_in_flight_never_exceed_the_bound() {
    const BOUND: usize = 3;
    const N: u32 = 12;
    let fake = Arc::new(Fake::default());
    let s = sampler(&fake, BOUND);
    fake.gate.set(true);
    let _open = OpenOnDrop(fake.clone());
    let call = tokio::spawn({
        let s = s.clone();
        async move {
            s.read(&Need::default(), targets(1..=N, 0), || targets(1..=N, 0))
                .await
        }
    });
    // Each step: as many reads inside as the bound allows, then one let through.
    for done in 0..N as usize {
        let expected = BOUND.min(N as usize - done);
        until("the reads the bound allows", || {
            fake.gate.lock().inside >= expected
        })
        .await;
        fake.gate.pass_one();
        until("the read let through to finish", || {
            fake.containers.lock().unwrap().len() > done
        })
        .await;
    }
    let r = call.await.expect("the call");
    assert_eq!(r.containers.len(), N as usize);
    assert_eq!(fake.gate.lock().most_inside, BOUND);
}
