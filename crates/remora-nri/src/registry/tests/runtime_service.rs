//! Tests of `runtime_service.rs`: RegisterPlugin's checks and UpdateContainers.

use super::*;

#[tokio::test]
async fn a_bad_index_or_name_is_refused_and_the_connection_closed() {
    // A short request timeout: remora waits that long for a refused plugin to hang up.
    let mut h = harness_with(
        Arc::new(FixedSnapshot::default()),
        Duration::from_millis(200),
    );
    let long = "x".repeat(MAX_PLUGIN_NAME_LEN + 1);
    for (idx, name) in [
        ("1", "ok"),
        ("100", "ok"),
        ("1a", "ok"),
        ("٣٣", "ok"),
        ("10", ""),
        ("10", "a/b"),
        ("10", "a b"),
        ("10", long.as_str()),
    ] {
        let end = h.connect("bad", 0, Answer::Ok).await;
        match register(&end, idx, name).await {
            Err(ttrpc::Error::RpcStatus(s)) => {
                assert_eq!(s.code(), ttrpc::Code::INVALID_ARGUMENT, "{idx:?} {name:?}");
            }
            other => panic!("{idx:?} {name:?} registered: {other:?}"),
        }
        wait_closed(&end).await;
    }
    assert!(h.registry.plugins().is_empty());
    assert_eq!(h.drain(), [], "never configured");
    // The longest name is fine.
    let longest = "x".repeat(MAX_PLUGIN_NAME_LEN);
    let _end = h.plugin("99", &longest, 0, Answer::Ok).await;
}

#[tokio::test]
async fn a_second_plugin_with_the_same_index_and_name_is_refused() {
    let h = harness(FixedSnapshot::default());
    let _first = h.plugin("10", "dup", 0, Answer::Ok).await;
    let second = h.connect("10-dup", 0, Answer::Ok).await;
    // The plugin is told why, then its connection closes.
    let err = register(&second, "10", "dup")
        .await
        .expect_err("a name in use is refused");
    match err {
        ttrpc::Error::RpcStatus(s) => {
            assert_eq!(s.code(), ttrpc::Code::ALREADY_EXISTS, "{s:?}");
            assert!(s.message().contains("10-dup"), "{s:?}");
        }
        other => panic!("{other:?}"),
    }
    wait_closed(&second).await;
    assert_eq!(h.registry.plugins(), ["10-dup"]);
}

#[tokio::test]
async fn update_containers_from_a_plugin_reaches_the_runtime() {
    let h = harness(FixedSnapshot::default());
    let end = h.connect("10-up", 0, Answer::Ok).await;
    let mut req = api::UpdateContainersRequest::new();
    let mut update = api::ContainerUpdate::new();
    update.container_id = "c1".into();
    req.update.push(update);
    let mut evict = api::ContainerEviction::new();
    evict.container_id = "c2".into();
    req.evict.push(evict);
    let ctx = || ttrpc::context::with_timeout(5_000_000_000);
    // Not before registration.
    match end.runtime.update_containers(ctx(), &req).await {
        Err(ttrpc::Error::RpcStatus(s)) => {
            assert_eq!(s.code(), ttrpc::Code::FAILED_PRECONDITION);
        }
        other => panic!("accepted before registration: {other:?}"),
    }
    register(&end, "10", "up").await.expect("RegisterPlugin");
    let resp = end
        .runtime
        .update_containers(ctx(), &req)
        .await
        .expect("UpdateContainers");
    assert_eq!(resp.failed.len(), 1);
    assert_eq!(resp.failed[0].container_id, "c1");
    assert_eq!(
        *lock(&h.runtime.updates),
        [(vec!["c1".to_string()], vec!["c2".to_string()])]
    );
}
