//! Tests of the publisher: a recording fake [`Forwarder`] on virtual time, spool files in a
//! tempdir, and [`TtrpcForwarder`] against a real ttrpc `Events` server on a unix socket.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use containerd_shim_protos::events::task::TaskExit;
use containerd_shim_protos::protobuf::well_known_types::empty::Empty;
use containerd_shim_protos::protobuf::Message;
use containerd_shim_protos::shim::events::ForwardRequest;
use containerd_shim_protos::shim_async::{create_events, Events};
use containerd_shim_protos::topics::TASK_EXIT_EVENT_TOPIC;
use containerd_shim_protos::ttrpc;
use tokio::time::Instant;

use super::*;

/// A forwarder that refuses until told (or until an instant), optionally refuses every n-th
/// attempt, and records every attempt's time and every accepted envelope.
struct Fake {
    /// Attempts before this instant are refused; `None` refuses all.
    accept_from: Mutex<Option<Instant>>,
    /// Refuse attempt number n (1-based) when n is a multiple of this.
    refuse_every: Option<u64>,
    attempts: Mutex<Vec<Instant>>,
    delivered: Mutex<Vec<Envelope>>,
}

impl Fake {
    fn new(accept_from: Option<Instant>, refuse_every: Option<u64>) -> Arc<Fake> {
        Arc::new(Fake {
            accept_from: Mutex::new(accept_from),
            refuse_every,
            attempts: Mutex::new(Vec::new()),
            delivered: Mutex::new(Vec::new()),
        })
    }

    fn accepting() -> Arc<Fake> {
        Fake::new(Some(Instant::now()), None)
    }

    fn refusing() -> Arc<Fake> {
        Fake::new(None, None)
    }

    fn accept_now(&self) {
        *self.accept_from.lock().unwrap() = Some(Instant::now());
    }

    /// The (container id, pid) of every accepted TaskExit, in delivery order.
    fn exits(&self) -> Vec<(String, u32)> {
        self.delivered
            .lock()
            .unwrap()
            .iter()
            .map(|envelope| {
                let exit = TaskExit::parse_from_bytes(&envelope.event.value).unwrap();
                (exit.container_id, exit.pid)
            })
            .collect()
    }
}

#[async_trait::async_trait]
impl Forwarder for Fake {
    async fn forward(&self, envelope: &Envelope) -> Result<(), ForwardError> {
        let now = Instant::now();
        let attempt = {
            let mut attempts = self.attempts.lock().unwrap();
            attempts.push(now);
            attempts.len() as u64
        };
        let accepting = matches!(*self.accept_from.lock().unwrap(), Some(from) if now >= from);
        let flaky = self.refuse_every.is_some_and(|n| attempt % n == 0);
        if !accepting || flaky {
            return Err(ForwardError::Timeout {
                address: "fake".to_string(),
                after: Duration::ZERO,
            });
        }
        self.delivered.lock().unwrap().push(envelope.clone());
        Ok(())
    }
}

/// Log records (level and message) kept for assertions.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<(slog::Level, String)>>>);

impl slog::Drain for Capture {
    type Ok = ();
    type Err = slog::Never;
    fn log(&self, record: &slog::Record, _: &slog::OwnedKVList) -> Result<(), slog::Never> {
        self.0
            .lock()
            .unwrap()
            .push((record.level(), record.msg().to_string()));
        Ok(())
    }
}

impl Capture {
    fn logger(&self) -> Logger {
        Logger::root(self.clone(), slog::o!())
    }

    fn count(&self, level: slog::Level) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(l, _)| *l == level)
            .count()
    }
}

fn discard() -> Logger {
    Logger::root(slog::Discard, slog::o!())
}

fn exit(container: &str, pid: u32) -> TaskExit {
    TaskExit {
        container_id: container.to_string(),
        id: container.to_string(),
        pid,
        exit_status: 137,
        ..Default::default()
    }
}

fn start(spool: &Path, forwarder: Arc<Fake>, log: Logger) -> Publisher {
    Publisher::start(
        spool.to_path_buf(),
        "k8s.io".to_string(),
        forwarder,
        BackoffLimits::default(),
        log,
    )
    .unwrap()
}

fn spool_len(spool: &Path) -> u64 {
    std::fs::metadata(spool).unwrap().len()
}

#[test]
fn crc32_is_the_ieee_checksum() {
    // The standard check value of CRC-32/ISO-HDLC (zlib, Go's crc32.ChecksumIEEE).
    assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    assert_eq!(crc32(b""), 0);
}

#[test]
fn backoff_doubles_up_to_its_cap() {
    let limits = BackoffLimits::default();
    let mut backoff = limits.backoff();
    let seen: Vec<Duration> = (0..7).map(|_| backoff.next_delay()).collect();
    let ms: Vec<u128> = seen.iter().map(Duration::as_millis).collect();
    assert_eq!(ms, [50, 100, 200, 400, 800, 1000, 1000]);
}

#[tokio::test(start_paused = true)]
async fn order_is_kept_across_interleaved_containers_and_failures() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("events");
    // Every third attempt fails, so retries happen in the middle of the stream.
    let fake = Fake::new(Some(Instant::now()), Some(3));
    let publisher = start(&spool, fake.clone(), discard());

    let mut expected = Vec::new();
    for pid in 0..120u32 {
        let container = ["a", "b", "c"][pid as usize % 3];
        publisher.publish(&exit(container, pid));
        expected.push((container.to_string(), pid));
        if pid % 7 == 0 {
            // Let the forwarding task run between publishes.
            tokio::task::yield_now().await;
        }
    }
    assert!(publisher.flush(Duration::from_secs(60)).await);
    assert_eq!(fake.exits(), expected);
    assert_eq!(publisher.pending(), 0);
    assert_eq!(
        spool_len(&spool),
        0,
        "the spool is emptied once the queue drains"
    );
}

#[tokio::test(start_paused = true)]
async fn nothing_is_dropped_over_an_hour_of_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("events");
    let begin = Instant::now();
    let accept_from = begin + Duration::from_secs(3600);
    let fake = Fake::new(Some(accept_from), None);
    let capture = Capture::default();
    let publisher = start(&spool, fake.clone(), capture.logger());

    for pid in 0..5 {
        publisher.publish(&exit("a", pid));
    }
    assert!(publisher.flush(Duration::from_secs(7200)).await);

    let expected: Vec<_> = (0..5).map(|pid| ("a".to_string(), pid)).collect();
    assert_eq!(fake.exits(), expected);

    let attempts = fake.attempts.lock().unwrap().clone();
    let max = BackoffLimits::default().max;
    for pair in attempts.windows(2) {
        assert!(
            pair[1] - pair[0] <= max,
            "a gap of {:?} between attempts",
            pair[1] - pair[0]
        );
    }
    let first_success = attempts
        .iter()
        .find(|&&at| at >= accept_from)
        .copied()
        .unwrap();
    assert!(first_success - accept_from <= max);
    // The backoff grew to its cap: about one attempt a second, not one every 50 ms.
    assert!(attempts.len() < 3600 + 20, "{} attempts", attempts.len());

    // One warning for the whole streak and one note of the recovery, not one per attempt.
    assert_eq!(capture.count(slog::Level::Warning), 1);
    assert_eq!(capture.count(slog::Level::Info), 1);
}

#[tokio::test(start_paused = true)]
async fn the_spool_is_replayed_first_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("events");

    let refusing = Fake::refusing();
    let first = start(&spool, refusing.clone(), discard());
    for pid in 0..5 {
        first.publish(&exit("old", pid));
    }
    // Let the first publisher try (and fail) a few times before it goes away.
    assert!(!first.flush(Duration::from_secs(2)).await);
    assert!(!refusing.attempts.lock().unwrap().is_empty());
    drop(first);
    assert!(spool_len(&spool) > 0);

    let fake = Fake::accepting();
    let second = start(&spool, fake.clone(), discard());
    assert_eq!(
        second.pending(),
        5,
        "the spooled events are queued by start"
    );
    for pid in 0..2 {
        second.publish(&exit("new", pid));
    }
    assert!(second.flush(Duration::from_secs(10)).await);

    let mut expected: Vec<_> = (0..5).map(|pid| ("old".to_string(), pid)).collect();
    expected.extend((0..2).map(|pid| ("new".to_string(), pid)));
    assert_eq!(fake.exits(), expected);
    assert_eq!(spool_len(&spool), 0);
}

#[tokio::test(start_paused = true)]
async fn a_torn_tail_is_ignored_and_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("events");

    let first = start(&spool, Fake::refusing(), discard());
    let mut record_ends = Vec::new();
    for pid in 0..3 {
        first.publish(&exit("a", pid));
        record_ends.push(spool_len(&spool));
    }
    drop(first);
    // A write torn in the middle of the third record.
    let torn = record_ends[2] - 5;
    OpenOptions::new()
        .write(true)
        .open(&spool)
        .unwrap()
        .set_len(torn)
        .unwrap();

    let capture = Capture::default();
    let second = start(&spool, Fake::refusing(), capture.logger());
    assert_eq!(second.pending(), 2);
    assert_eq!(
        spool_len(&spool),
        record_ends[1],
        "the damaged tail is cut off"
    );
    assert_eq!(capture.count(slog::Level::Warning), 1);
    // A record appended now must replay too: it does not sit behind the damage.
    second.publish(&exit("a", 99));
    drop(second);

    let fake = Fake::accepting();
    let third = start(&spool, fake.clone(), discard());
    assert!(third.flush(Duration::from_secs(10)).await);
    let pids: Vec<u32> = fake.exits().into_iter().map(|(_, pid)| pid).collect();
    assert_eq!(pids, [0, 1, 99]);
}

#[test]
fn replay_stops_at_corrupt_records() {
    let envelope = |pid| envelope("k8s.io", &exit("a", pid)).unwrap();
    let mut bytes = Vec::new();
    let mut ends = Vec::new();
    for pid in 0..3 {
        encode_record(&envelope(pid), &mut bytes).unwrap();
        ends.push(bytes.len());
    }
    let whole = Replay::parse(&bytes);
    assert_eq!(whole.envelopes.len(), 3);
    assert_eq!(whole.good_len, bytes.len() as u64);
    assert!(whole.damage.is_none());

    // A flipped byte in the second record's body: its checksum no longer matches.
    let mut flipped = bytes.clone();
    flipped[ends[0] + HEADER_LEN + 3] ^= 0x40;
    let replay = Replay::parse(&flipped);
    assert_eq!(replay.envelopes.len(), 1);
    assert_eq!(replay.good_len, ends[0] as u64);
    assert_eq!(replay.damage.unwrap().1, "checksum mismatch");

    // Zeros after the good records (a hole a crash left) are not empty records.
    let mut zeros = bytes.clone();
    zeros.extend_from_slice(&[0; 64]);
    let replay = Replay::parse(&zeros);
    assert_eq!(replay.envelopes.len(), 3);
    assert_eq!(replay.damage, Some((64, "impossible record length")));

    // Half a header.
    let replay = Replay::parse(&bytes[..ends[0] + 3]);
    assert_eq!(replay.envelopes.len(), 1);
    assert_eq!(replay.damage, Some((3, "incomplete record header")));
}

#[tokio::test(start_paused = true)]
async fn flush_waits_for_delivery_or_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("events");
    let fake = Fake::refusing();
    let publisher = start(&spool, fake.clone(), discard());

    assert!(
        publisher.flush(Duration::from_secs(1)).await,
        "nothing queued, nothing to wait for"
    );
    publisher.publish(&exit("a", 1));
    let begin = Instant::now();
    assert!(!publisher.flush(Duration::from_secs(10)).await);
    assert_eq!(begin.elapsed(), Duration::from_secs(10));
    assert_eq!(publisher.pending(), 1);

    fake.accept_now();
    let begin = Instant::now();
    assert!(publisher.flush(Duration::from_secs(10)).await);
    assert!(begin.elapsed() <= BackoffLimits::default().max);
    assert_eq!(publisher.pending(), 0);
    assert_eq!(fake.exits(), [("a".to_string(), 1)]);
}

#[tokio::test(start_paused = true)]
async fn drain_spool_delivers_and_removes_the_spool() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("events");
    let dead = start(&spool, Fake::refusing(), discard());
    for pid in 0..3 {
        dead.publish(&exit("a", pid));
    }
    drop(dead);

    // containerd still away: nothing delivered by the deadline, the spool kept.
    let begin = Instant::now();
    let delivered = drain_spool(&spool, Fake::refusing(), Duration::from_secs(5), &discard())
        .await
        .unwrap();
    assert_eq!(delivered, 0);
    assert!(begin.elapsed() <= Duration::from_secs(5));
    assert!(spool.exists());

    let fake = Fake::accepting();
    let delivered = drain_spool(&spool, fake.clone(), Duration::from_secs(5), &discard())
        .await
        .unwrap();
    assert_eq!(delivered, 3);
    let pids: Vec<u32> = fake.exits().into_iter().map(|(_, pid)| pid).collect();
    assert_eq!(pids, [0, 1, 2]);
    assert!(!spool.exists());

    let missing = drain_spool(
        &spool,
        Fake::accepting(),
        Duration::from_secs(5),
        &discard(),
    )
    .await
    .unwrap();
    assert_eq!(missing, 0);
}

#[tokio::test(start_paused = true)]
async fn drain_spool_retries_within_its_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("events");
    let dead = start(&spool, Fake::refusing(), discard());
    dead.publish(&exit("a", 7));
    drop(dead);

    // containerd comes back two seconds into the drain.
    let fake = Fake::new(Some(Instant::now() + Duration::from_secs(2)), None);
    let delivered = drain_spool(&spool, fake.clone(), Duration::from_secs(10), &discard())
        .await
        .unwrap();
    assert_eq!(delivered, 1);
    assert_eq!(fake.exits(), [("a".to_string(), 7)]);
    assert!(!spool.exists());
}

#[tokio::test(start_paused = true)]
async fn the_envelope_carries_namespace_topic_time_and_type() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("events");
    let fake = Fake::accepting();
    let publisher = start(&spool, fake.clone(), discard());

    let before = SystemTime::now();
    let event = exit("c1", 42);
    publisher.publish(&event);
    let after = SystemTime::now();
    assert!(publisher.flush(Duration::from_secs(5)).await);

    let delivered = fake.delivered.lock().unwrap().clone();
    assert_eq!(delivered.len(), 1);
    let envelope = &delivered[0];
    assert_eq!(envelope.namespace, "k8s.io");
    assert_eq!(envelope.topic, "/tasks/exit");
    let stamped: SystemTime = (*envelope.timestamp).clone().into();
    assert!(before <= stamped && stamped <= after, "{stamped:?}");
    assert_eq!(envelope.event.type_url, "containerd.events.TaskExit");
    assert_eq!(
        TaskExit::parse_from_bytes(&envelope.event.value).unwrap(),
        event
    );
}

#[test]
fn start_outside_a_runtime_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let result = Publisher::start(
        dir.path().join("events"),
        "k8s.io".to_string(),
        Fake::accepting(),
        BackoffLimits::default(),
        discard(),
    );
    assert!(matches!(result, Err(PublishError::NoRuntime { .. })));
}

#[tokio::test(start_paused = true)]
async fn start_on_a_missing_directory_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let result = Publisher::start(
        dir.path().join("missing/events"),
        "k8s.io".to_string(),
        Fake::accepting(),
        BackoffLimits::default(),
        discard(),
    );
    assert!(matches!(result, Err(PublishError::OpenSpool { .. })));
}

#[test]
fn a_failed_spool_write_keeps_the_event_and_the_spool_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events");
    let capture = Capture::default();
    let log = capture.logger();
    let (mut spool, replayed) = Spool::open(path.clone(), &log).unwrap();
    assert!(replayed.is_empty());
    let mut queue = VecDeque::new();
    let mut push = |spool: &mut Spool, pid| {
        queue.push_back(Arc::new(envelope("k8s.io", &exit("a", pid)).unwrap()));
        spool.append(&queue, &log);
    };

    push(&mut spool, 0);
    // /dev/full fails every write with ENOSPC: a full disk.
    let good = std::mem::replace(
        &mut spool.file,
        OpenOptions::new().append(true).open("/dev/full").unwrap(),
    );
    push(&mut spool, 1);
    push(&mut spool, 2);
    assert!(spool.failing);
    assert_eq!(
        capture.count(slog::Level::Error),
        1,
        "logged once per streak"
    );

    spool.file = good;
    push(&mut spool, 3);
    assert!(!spool.failing);
    assert_eq!(capture.count(slog::Level::Info), 1);
    let replay = Replay::parse(&std::fs::read(&path).unwrap());
    let pids: Vec<u32> = replay
        .envelopes
        .iter()
        .map(|e| TaskExit::parse_from_bytes(&e.event.value).unwrap().pid)
        .collect();
    assert_eq!(
        pids,
        [0, 1, 2, 3],
        "the rewrite restored every queued event"
    );
}

/// containerd's side of `Events/Forward`, recording what it gets.
struct EventsServer {
    received: Arc<Mutex<Vec<Envelope>>>,
}

#[async_trait::async_trait]
impl Events for EventsServer {
    async fn forward(
        &self,
        _ctx: &ttrpc::r#async::TtrpcContext,
        request: ForwardRequest,
    ) -> ttrpc::Result<Empty> {
        let envelope = request.envelope.into_option().unwrap_or_default();
        self.received.lock().unwrap().push(envelope);
        Ok(Empty::new())
    }
}

async fn serve(socket: &Path, received: Arc<Mutex<Vec<Envelope>>>) -> ttrpc::r#async::Server {
    let mut server = ttrpc::r#async::Server::new()
        .bind(&format!("unix://{}", socket.display()))
        .unwrap()
        .register_service(create_events(Arc::new(EventsServer { received })));
    server.start().await.unwrap();
    server
}

#[tokio::test]
async fn ttrpc_forwarder_reconnects_after_the_server_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("containerd.sock.ttrpc");
    let received = Arc::new(Mutex::new(Vec::new()));
    // A plain path, as containerd passes TTRPC_ADDRESS.
    let forwarder =
        TtrpcForwarder::new(socket.to_str().unwrap().to_string(), Duration::from_secs(2));
    let envelope = |pid| envelope("k8s.io", &exit("a", pid)).unwrap();

    let mut server = serve(&socket, received.clone()).await;
    let first = envelope(1);
    forwarder.forward(&first).await.unwrap();
    assert_eq!(received.lock().unwrap().as_slice(), [first]);

    server.shutdown().await.unwrap();
    assert!(forwarder.forward(&envelope(2)).await.is_err());
    // The broken connection was dropped: this attempt reconnects, and nobody listens.
    let refused = forwarder.forward(&envelope(3)).await;
    assert!(
        matches!(refused, Err(ForwardError::Connect { .. })),
        "{refused:?}"
    );

    std::fs::remove_file(&socket).unwrap();
    let mut server = serve(&socket, received.clone()).await;
    forwarder.forward(&envelope(4)).await.unwrap();
    server.shutdown().await.unwrap();

    let pids: Vec<u32> = received
        .lock()
        .unwrap()
        .iter()
        .map(|e| {
            assert_eq!(e.topic, TASK_EXIT_EVENT_TOPIC);
            assert_eq!(e.event.type_url, "containerd.events.TaskExit");
            TaskExit::parse_from_bytes(&e.event.value).unwrap().pid
        })
        .collect();
    assert_eq!(pids, [1, 4]);
}

#[test]
fn a_symlink_in_the_spools_place_is_refused_not_followed() {
    // Replay cuts a damaged spool back: followed, the link would truncate its target.
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("precious");
    std::fs::write(&target, b"not a spool, and not the shim's").unwrap();
    let spool = dir.path().join("events");
    std::os::unix::fs::symlink(&target, &spool).unwrap();
    let opened = Spool::open(spool.clone(), &discard());
    assert!(
        matches!(&opened, Err(PublishError::OpenSpool { source, .. }) if source.raw_os_error() == Some(libc::ELOOP)),
        "{:?}",
        opened.as_ref().err()
    );
    assert_eq!(
        std::fs::read(&target).unwrap(),
        b"not a spool, and not the shim's"
    );
}

#[test]
fn replay_keeps_at_most_max_spool_records() {
    // Tiny records (an envelope with only a topic) decode to full envelopes each.
    let small = Envelope {
        topic: "t".into(),
        ..Default::default()
    };
    let mut bytes = Vec::new();
    for _ in 0..MAX_SPOOL_RECORDS + 100 {
        encode_record(&small, &mut bytes).unwrap();
    }
    let replay = Replay::parse(&bytes);
    assert_eq!(replay.envelopes.len(), MAX_SPOOL_RECORDS);
    let record_len = bytes.len() / (MAX_SPOOL_RECORDS + 100);
    assert_eq!(
        replay.damage,
        Some((
            (100 * record_len) as u64,
            "more records than a spool may hold"
        ))
    );
}

#[test]
fn a_huge_spool_is_read_up_to_its_cap_only() {
    crate::reaper::tests::run_in_child(
        "publisher::tests::huge_spool_child",
        &[],
        "huge spool child: all checks passed",
    );
}

/// The peak resident memory of this process, in bytes (`VmHWM`).
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/self/status");
    kb * 1024
}

/// The body of `a_huge_spool_is_read_up_to_its_cap_only`, in a process of its own so that its
/// peak memory is its own.
#[test]
#[ignore = "run by a_huge_spool_is_read_up_to_its_cap_only in a child process"]
fn huge_spool_child() {
    if !crate::reaper::tests::in_child() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("events");
    // One good record, then a sparse hole four times the cap (no disk space, all zeros read).
    let mut bytes = Vec::new();
    encode_record(&envelope("k8s.io", &exit("a", 1)).unwrap(), &mut bytes).unwrap();
    std::fs::write(&spool, &bytes).unwrap();
    let huge = 4 * MAX_SPOOL_LEN;
    OpenOptions::new()
        .write(true)
        .open(&spool)
        .unwrap()
        .set_len(huge)
        .unwrap();

    let before = peak_rss();
    let (_spool, envelopes) = Spool::open(spool.clone(), &discard()).unwrap();
    let grew = peak_rss().saturating_sub(before);
    assert_eq!(envelopes.len(), 1, "the good record is kept");
    assert!(
        grew < MAX_SPOOL_LEN + (16 << 20),
        "reading a {huge}-byte spool grew the peak memory by {grew} bytes"
    );
    assert_eq!(spool_len(&spool), bytes.len() as u64, "the rest is cut off");

    // The same for the `delete` action's drain.
    OpenOptions::new()
        .write(true)
        .open(&spool)
        .unwrap()
        .set_len(huge)
        .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let fake = Fake::accepting();
    let before = peak_rss();
    let delivered = runtime
        .block_on(drain_spool(
            &spool,
            fake.clone(),
            Duration::from_secs(10),
            &discard(),
        ))
        .unwrap();
    let grew = peak_rss().saturating_sub(before);
    assert_eq!(delivered, 1);
    assert!(
        grew < MAX_SPOOL_LEN + (16 << 20),
        "draining a {huge}-byte spool grew the peak memory by {grew} bytes"
    );
    println!("huge spool child: all checks passed");
}

/// Property tests of the spool's reader: a spool is a file on disk, hostile input. Nothing
/// panics, nothing is read beyond the input, good records before damage are kept, and a
/// length field (up to 4 GiB) or a protobuf length inside a record never makes the reader
/// allocate what it claims (the huge-spool test above bounds the memory of a whole file).
mod props {
    use proptest::collection::vec;
    use proptest::prelude::*;
    use proptest::test_runner::Config;

    use super::*;

    fn config() -> Config {
        Config {
            cases: 256,
            // No persistence file: the suite runs from the library's tests, not a crate dir.
            failure_persistence: None,
            ..Config::default()
        }
    }

    /// A protobuf varint.
    fn varint(mut v: u64, out: &mut Vec<u8>) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    /// Protobuf-shaped bytes: fields with any number and wire type, varints of any size and
    /// length prefixes that claim anything (up to 2^64) whatever follows.
    fn protobuf_ish() -> impl Strategy<Value = Vec<u8>> {
        let field = (
            0u64..8,
            0u64..6,
            prop_oneof![Just(u64::MAX), Just(1u64 << 32), 0u64..64, any::<u64>()],
            vec(any::<u8>(), 0..24),
        );
        vec(field, 1..8).prop_map(|fields| {
            let mut out = Vec::new();
            for (number, wire, value, bytes) in fields {
                varint(number << 3 | wire, &mut out);
                varint(value, &mut out);
                out.extend_from_slice(&bytes);
            }
            out
        })
    }

    /// One record around `body`, its header's length field `len` (the true one, or a lie).
    fn record_with(len: u32, body: &[u8], out: &mut Vec<u8>) {
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&crc32(body).to_le_bytes());
        out.extend_from_slice(body);
    }

    fn check_bounds(replay: &Replay, input: usize) -> Result<(), TestCaseError> {
        prop_assert!(replay.good_len <= input as u64);
        prop_assert!(replay.envelopes.len() + replay.undecodable <= input / (HEADER_LEN + 1));
        let ignored = replay.damage.map_or(0, |(ignored, _)| ignored);
        prop_assert_eq!(replay.good_len + ignored, input as u64);
        Ok(())
    }

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn any_bytes_replay_without_panic_within_the_input(
            bytes in vec(any::<u8>(), 0..2048),
        ) {
            check_bounds(&Replay::parse(&bytes), bytes.len())?;
        }

        #[test]
        fn any_checksummed_body_is_decoded_or_skipped(
            bodies in vec(prop_oneof![protobuf_ish(), vec(any::<u8>(), 1..256)], 1..6),
        ) {
            let mut bytes = Vec::new();
            for body in &bodies {
                if body.is_empty() {
                    continue;
                }
                record_with(body.len() as u32, body, &mut bytes);
            }
            let replay = Replay::parse(&bytes);
            check_bounds(&replay, bytes.len())?;
            prop_assert!(replay.damage.is_none(), "intact records are no damage");
            let records = bodies.iter().filter(|b| !b.is_empty()).count();
            prop_assert_eq!(replay.envelopes.len() + replay.undecodable, records);
        }

        #[test]
        fn good_records_survive_any_tail(
            pids in vec(any::<u32>(), 0..6),
            claimed in prop_oneof![Just(u32::MAX), Just(MAX_RECORD_LEN as u32 + 1), any::<u32>()],
            tail in vec(any::<u8>(), 0..512),
        ) {
            let mut bytes = Vec::new();
            let mut sent = Vec::new();
            for pid in &pids {
                let e = envelope("k8s.io", &exit("a", *pid)).unwrap();
                encode_record(&e, &mut bytes).unwrap();
                sent.push(e);
            }
            let good = bytes.len();
            // A header whose length field claims anything (4 GiB included), then bytes.
            record_with(claimed, &tail, &mut bytes);
            let replay = Replay::parse(&bytes);
            check_bounds(&replay, bytes.len())?;
            prop_assert!(replay.envelopes.len() >= sent.len());
            prop_assert_eq!(&replay.envelopes[..sent.len()], &sent[..]);
            prop_assert!(replay.good_len >= good as u64);
            if claimed as usize > MAX_RECORD_LEN || claimed == 0 {
                prop_assert_eq!(replay.damage, Some(((bytes.len() - good) as u64, "impossible record length")));
            }
        }
    }
}

#[tokio::test]
async fn the_spool_is_the_owners_alone_even_when_an_older_shim_left_it_wider() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let fresh = dir.path().join("fresh.spool");
    let p = start(&fresh, Fake::accepting(), discard());
    assert_eq!(mode(&fresh), 0o600);
    drop(p);
    let old = dir.path().join("old.spool");
    std::fs::write(&old, b"").unwrap();
    std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o644)).unwrap();
    let p = start(&old, Fake::accepting(), discard());
    assert_eq!(mode(&old), 0o600);
    drop(p);
}

/// Each event's type URL is its message's full proto name, what containerd's typeurl looks
/// it up by (read here from the descriptor, which the shim itself never builds).
#[test]
fn each_task_events_type_url_is_its_full_proto_name() {
    use containerd_shim_protos::events::task::{
        TaskCreate, TaskDelete, TaskExecAdded, TaskExecStarted, TaskOOM, TaskPaused, TaskResumed,
        TaskStart,
    };
    use containerd_shim_protos::protobuf::MessageFull;
    fn check<E: TaskEvent + MessageFull>(topic: &str) {
        assert_eq!(E::TYPE_URL, E::descriptor().full_name());
        assert_eq!(E::TOPIC, topic, "{}", E::TYPE_URL);
    }
    use containerd_shim_protos::topics::*;
    check::<TaskCreate>(TASK_CREATE_EVENT_TOPIC);
    check::<TaskStart>(TASK_START_EVENT_TOPIC);
    check::<TaskDelete>(TASK_DELETE_EVENT_TOPIC);
    check::<TaskExit>(TASK_EXIT_EVENT_TOPIC);
    check::<TaskOOM>(TASK_OOM_EVENT_TOPIC);
    check::<TaskExecAdded>(TASK_EXEC_ADDED_EVENT_TOPIC);
    check::<TaskExecStarted>(TASK_EXEC_STARTED_EVENT_TOPIC);
    check::<TaskPaused>(TASK_PAUSED_EVENT_TOPIC);
    check::<TaskResumed>(TASK_RESUMED_EVENT_TOPIC);
}
