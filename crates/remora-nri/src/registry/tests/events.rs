//! Tests of `events.rs`: call order, failures, timeouts, one call at a time, StateChange.

use super::*;

/// Go's ttrpc server refuses a request whose stream id is below the last one it saw, and
/// two calls at once on one client can be written out of order: critest's concurrent
/// creates failed StartContainer with "StreamID cannot be re-used and must increment".
/// A plugin gets one call at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_gets_one_call_at_a_time_from_concurrent_events() {
    let h = harness(FixedSnapshot::default());
    let _p = h.plugin("10", "overlap", 0, Answer::Overlap).await;
    let runs = (0..16).map(|i| {
        let (registry, p) = (h.registry.clone(), pod(&format!("p{i}")));
        tokio::spawn(async move { registry.run_pod_sandbox(&p).await })
    });
    for run in futures::future::join_all(runs).await {
        run.expect("the task").expect("RunPodSandbox");
    }
    assert_eq!(MAX_OVERLAP.load(Ordering::SeqCst), 1, "calls at once");
}

#[tokio::test]
async fn plugins_are_called_in_index_order_and_only_for_their_events() {
    let mut h = harness(FixedSnapshot::default());
    use api::Event as E;
    // Registered out of order.
    let _b = h
        .plugin(
            "20",
            "b",
            mask(&[E::RUN_POD_SANDBOX, E::STOP_POD_SANDBOX]),
            Answer::Ok,
        )
        .await;
    let _a = h
        .plugin(
            "10",
            "a",
            mask(&[E::RUN_POD_SANDBOX, E::CREATE_CONTAINER]),
            Answer::Ok,
        )
        .await;
    assert_eq!(h.registry.plugins(), ["10-a", "20-b"]);
    h.drain();

    let r = &h.registry;
    timeout(DEADLINE, r.run_pod_sandbox(&pod("p1")))
        .await
        .expect("in time")
        .expect("RunPodSandbox");
    timeout(DEADLINE, r.stop_pod_sandbox(&pod("p1")))
        .await
        .expect("in time");
    let created = timeout(
        DEADLINE,
        r.create_container(&pod("p1"), &container("c1", "p1")),
    )
    .await
    .expect("in time")
    .expect("CreateContainer");
    timeout(DEADLINE, r.remove_pod_sandbox(&pod("p1")))
        .await
        .expect("in time");
    assert_eq!(
        h.drain(),
        [
            ("10-a".into(), Seen::Event(E::RUN_POD_SANDBOX, "p1".into())),
            ("20-b".into(), Seen::Event(E::RUN_POD_SANDBOX, "p1".into())),
            ("20-b".into(), Seen::Event(E::STOP_POD_SANDBOX, "p1".into())),
            ("10-a".into(), Seen::Event(E::CREATE_CONTAINER, "c1".into())),
        ]
    );
    assert_eq!(created.len(), 1);
    assert_eq!(created[0].0, "10-a");
    assert_eq!(created[0].1.adjust.annotations["adjusted-by"], "10-a");
}

#[tokio::test]
async fn a_plugin_error_fails_run_pod_sandbox_naming_the_plugin_but_only_logs_on_stop() {
    let mut h = harness(FixedSnapshot::default());
    use api::Event as E;
    let events = mask(&[E::RUN_POD_SANDBOX, E::STOP_POD_SANDBOX]);
    let _bad = h.plugin("10", "bad", events, Answer::Fail).await;
    let _good = h.plugin("20", "good", events, Answer::Ok).await;
    h.drain();

    let err = timeout(DEADLINE, h.registry.run_pod_sandbox(&pod("p1")))
        .await
        .expect("in time")
        .expect_err("the plugin's error fails RunPodSandbox");
    assert_eq!(err.plugin, "10-bad");
    assert_eq!(err.event, E::RUN_POD_SANDBOX);
    assert_eq!(err.code, ttrpc::Code::UNKNOWN);
    assert!(err.to_string().contains("10-bad"), "{err}");
    // The plugins after the failing one are not called.
    assert_eq!(
        h.drain(),
        [(
            "10-bad".into(),
            Seen::Event(E::RUN_POD_SANDBOX, "p1".into())
        )]
    );

    // StopPodSandbox: logged, the next plugin still called, the failing one kept.
    timeout(DEADLINE, h.registry.stop_pod_sandbox(&pod("p1")))
        .await
        .expect("in time");
    assert_eq!(
        h.drain(),
        [
            (
                "10-bad".into(),
                Seen::Event(E::STOP_POD_SANDBOX, "p1".into())
            ),
            (
                "20-good".into(),
                Seen::Event(E::STOP_POD_SANDBOX, "p1".into())
            ),
        ]
    );
    assert_eq!(h.registry.plugins(), ["10-bad", "20-good"]);
}

#[tokio::test]
async fn a_hanging_plugin_is_dropped_after_the_request_timeout() {
    let mut h = harness(FixedSnapshot::default());
    use api::Event as E;
    let events = mask(&[E::RUN_POD_SANDBOX]);
    let hang = h.plugin("10", "hang", events, Answer::Hang).await;
    let _good = h.plugin("20", "good", events, Answer::Ok).await;
    h.drain();

    let started = Instant::now();
    // Unlike NRI (which goes on without it), the call fails naming the plugin, which is
    // dropped.
    let err = timeout(DEADLINE, h.registry.run_pod_sandbox(&pod("p1")))
        .await
        .expect("bounded by the request timeout, not wedged")
        .expect_err("the hung plugin fails the call");
    let took = started.elapsed();
    assert!(took >= REQUEST_TIMEOUT, "{took:?}");
    assert!(took < REQUEST_TIMEOUT * 3, "{took:?}");
    assert_eq!(err.plugin, "10-hang");
    assert_eq!(err.event, E::RUN_POD_SANDBOX);
    assert_eq!(err.code, ttrpc::Code::UNAVAILABLE);
    assert_eq!(h.registry.plugins(), ["20-good"]);
    wait_closed(&hang).await;
    assert_eq!(
        h.drain(),
        [(
            "10-hang".into(),
            Seen::Event(E::RUN_POD_SANDBOX, "p1".into())
        )]
    );

    // Later calls skip it.
    timeout(REQUEST_TIMEOUT, h.registry.run_pod_sandbox(&pod("p2")))
        .await
        .expect("quick without the hung plugin")
        .expect("RunPodSandbox");
    assert_eq!(
        h.drain(),
        [(
            "20-good".into(),
            Seen::Event(E::RUN_POD_SANDBOX, "p2".into())
        )]
    );
}

#[tokio::test]
async fn an_old_plugin_gets_state_change_when_an_rpc_is_unimplemented() {
    let mut h = harness(FixedSnapshot::default());
    let _old = h
        .plugin(
            "10",
            "old",
            mask(&[api::Event::RUN_POD_SANDBOX]),
            Answer::Unimplemented,
        )
        .await;
    h.drain();
    timeout(DEADLINE, h.registry.run_pod_sandbox(&pod("p1")))
        .await
        .expect("in time")
        .expect("StateChange answered");
    assert_eq!(
        h.drain(),
        [
            (
                "10-old".into(),
                Seen::Event(api::Event::RUN_POD_SANDBOX, "p1".into())
            ),
            (
                "10-old".into(),
                Seen::StateChange(api::Event::RUN_POD_SANDBOX, "p1".into())
            ),
        ]
    );
}
