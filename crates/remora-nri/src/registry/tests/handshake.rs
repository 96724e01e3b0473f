//! Tests of `handshake.rs`: registration, Configure, Synchronize and its chunks, sync blocks.

use super::*;

#[tokio::test]
async fn a_plugin_registers_is_configured_and_synchronized_with_the_snapshot() {
    let mut h = harness(FixedSnapshot {
        pods: vec![pod("p1")],
        containers: vec![container("c1", "p1"), container("c2", "p1")],
    });
    // Events 0: NRI's "every event".
    let _end = h.plugin("10", "logger", 0, Answer::Ok).await;
    assert_eq!(h.registry.plugins(), ["10-logger"]);
    assert_eq!(
        h.drain(),
        [
            (
                "10-logger".to_string(),
                Seen::Configured {
                    runtime: "remora".into(),
                    request_timeout: 2000,
                    config: String::new(),
                }
            ),
            (
                "10-logger".to_string(),
                Seen::Synced {
                    pods: vec!["p1".into()],
                    containers: vec!["c1".into(), "c2".into()],
                    more: false
                }
            ),
        ]
    );
    // Subscribed to everything: RemoveContainer reaches it.
    timeout(
        DEADLINE,
        h.registry
            .remove_container(&pod("p1"), &container("c1", "p1")),
    )
    .await
    .expect("in time");
    assert_eq!(
        h.drain(),
        [(
            "10-logger".to_string(),
            Seen::Event(api::Event::REMOVE_CONTAINER, "c1".into())
        )]
    );
}

#[tokio::test]
async fn a_plugin_that_never_registers_is_closed_after_the_registration_timeout() {
    let mut h = harness(FixedSnapshot::default());
    let started = Instant::now();
    let end = h.connect("silent", 0, Answer::Ok).await;
    wait_closed(&end).await;
    assert!(
        started.elapsed() >= REGISTRATION_TIMEOUT,
        "{:?}",
        started.elapsed()
    );
    assert!(h.registry.plugins().is_empty());
    assert_eq!(h.drain(), [], "never configured");
}

#[tokio::test]
async fn synchronize_splits_a_snapshot_bigger_than_a_message_and_it_arrives_whole() {
    // 40 containers of 256 KiB annotations: about 10 MiB, three messages.
    let containers: Vec<api::Container> = (0..40)
        .map(|i| {
            let mut c = container(&format!("c{i}"), "p1");
            c.annotations.insert("big".into(), "x".repeat(256 << 10));
            c
        })
        .collect();
    let want: Vec<String> = containers.iter().map(|c| c.id.clone()).collect();
    let mut h = harness(FixedSnapshot {
        pods: vec![pod("p1"), pod("p2")],
        containers,
    });
    let _end = h.plugin("10", "big", 0, Answer::Ok).await;

    let mut pods = Vec::new();
    let mut got = Vec::new();
    let mut mores = Vec::new();
    for (_, seen) in h.drain() {
        if let Seen::Synced {
            pods: p,
            containers: c,
            more,
        } = seen
        {
            pods.extend(p);
            got.extend(c);
            mores.push(more);
        }
    }
    assert_eq!(pods, ["p1", "p2"]);
    assert_eq!(got, want);
    assert_eq!(mores, [true, true, false]);
}

#[test]
fn sync_chunks_stay_under_the_budget_and_keep_order() {
    let pods: Vec<api::PodSandbox> = (0..30).map(|i| pod(&format!("pod-{i:03}"))).collect();
    let containers: Vec<api::Container> = (0..50)
        .map(|i| container(&format!("ctr-{i:03}"), "pod-000"))
        .collect();
    let budget = 300;
    let chunks = sync_chunks(pods.clone(), containers.clone(), budget).expect("chunks");
    assert!(chunks.len() > 3, "{}", chunks.len());
    for (i, chunk) in chunks.iter().enumerate() {
        let size = usize::try_from(chunk.compute_size()).unwrap();
        assert!(size <= budget, "chunk {i}: {size}");
        assert_eq!(chunk.more, i + 1 < chunks.len());
    }
    let all_pods: Vec<_> = chunks.iter().flat_map(|c| c.pods.clone()).collect();
    let all_ctrs: Vec<_> = chunks.iter().flat_map(|c| c.containers.clone()).collect();
    assert_eq!(all_pods, pods);
    assert_eq!(all_ctrs, containers);

    assert_eq!(sync_chunks(vec![], vec![], budget).expect("empty").len(), 1);
    let mut huge = pod("huge");
    huge.name = "x".repeat(budget);
    assert!(matches!(
        sync_chunks(vec![huge], vec![], budget),
        Err(HandshakeError::Oversized(_))
    ));
}

#[tokio::test]
async fn configure_is_the_first_request_a_plugin_gets() {
    // Nothing reaches a plugin before Configure, not even Synchronize.
    let mut h = harness(FixedSnapshot::default());
    let _end = h.plugin("10", "a", 0, Answer::Ok).await;
    let (name, first) = h.next_seen().await;
    assert_eq!(name, "10-a");
    assert!(matches!(first, Seen::Configured { .. }), "{first:?}");
}

#[tokio::test]
async fn a_registration_waits_for_sync_blocks_and_its_snapshot_has_what_they_created() {
    let objects = Arc::new(SharedSnapshot::default());
    lock(&objects.0).pods.push(pod("before"));
    let mut h = harness_with(objects.clone(), REQUEST_TIMEOUT);
    use api::Event as E;

    // A CRI mutation in flight: it holds the block while it creates a pod and runs its hook.
    let block = timeout(DEADLINE, h.registry.block_sync())
        .await
        .expect("no registration holds the write side");
    let end = h
        .connect("10-late", mask(&[E::RUN_POD_SANDBOX]), Answer::Ok)
        .await;
    register(&end, "10", "late").await.expect("RegisterPlugin");
    assert!(matches!(h.next_seen().await.1, Seen::Configured { .. }));
    lock(&objects.0).pods.push(pod("during"));
    // The hook of the pod being created does not see the plugin: it is not active yet.
    timeout(DEADLINE, h.registry.run_pod_sandbox(&pod("during")))
        .await
        .expect("in time")
        .expect("RunPodSandbox");
    // Nor is the plugin synchronized while the block is held (a bounded wait for nothing).
    let early = timeout(Duration::from_millis(200), h.seen.recv()).await;
    assert!(early.is_err(), "sent while blocked: {early:?}");
    drop(block);

    // Synchronize then has both pods, and the hook above was not sent: each pod reached
    // the plugin exactly once.
    assert_eq!(
        h.next_seen().await,
        (
            "10-late".into(),
            Seen::Synced {
                pods: vec!["before".into(), "during".into()],
                containers: vec![],
                more: false
            }
        )
    );
    let mut active = h.registry.watch_plugins();
    timeout(DEADLINE, active.wait_for(|names| *names == ["10-late"]))
        .await
        .expect("active in time")
        .expect("registry alive");
    timeout(DEADLINE, h.registry.run_pod_sandbox(&pod("after")))
        .await
        .expect("in time")
        .expect("RunPodSandbox");
    assert_eq!(
        h.drain(),
        [(
            "10-late".into(),
            Seen::Event(E::RUN_POD_SANDBOX, "after".into())
        )]
    );
}

#[tokio::test]
async fn a_plugin_hanging_in_synchronize_holds_sync_blocks_off_for_one_request_timeout() {
    let mut h = harness(FixedSnapshot::default());
    let end = h.connect("10-stuck", 0, Answer::HangInSync).await;
    register(&end, "10", "stuck").await.expect("RegisterPlugin");
    assert!(matches!(h.next_seen().await.1, Seen::Configured { .. }));
    assert!(matches!(h.next_seen().await.1, Seen::Synced { .. }));
    // Registration holds the write side now; a CRI mutation waits at most about a request
    // timeout for it.
    let started = Instant::now();
    let block = timeout(REQUEST_TIMEOUT * 3, h.registry.block_sync())
        .await
        .expect("the hung Synchronize gives the lock back");
    assert!(started.elapsed() <= REQUEST_TIMEOUT * 3);
    drop(block);
    wait_closed(&end).await;
    assert!(h.registry.plugins().is_empty());
}
