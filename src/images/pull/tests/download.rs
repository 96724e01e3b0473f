//! remora's own layer client path (`pull/download.rs`), through the same fixtures: blob
//! downloads shared across pulls and bounded (per registry host too), a download outliving the pull that started it,
//! resumed transfers, layers applied in order while later ones still download, and nothing
//! left behind by a failure half-way.

use super::*;

/// Issue 43: an image whose layers are slow holds only its registry's share of the download
/// slots; a pull from another registry finds one free and finishes while the slow one still
/// downloads. (With one shared pool of 3, the slow image held all three and the other pull
/// waited for them.)
#[tokio::test]
async fn a_slow_registry_holds_only_its_share_of_the_download_slots() {
    let slow = TestImage::new(&[b"slow 1", b"slow 2", b"slow 3"], "");
    let quick = TestImage::new(&[b"quick"], "");
    let env = env(
        &[&slow, &quick],
        Opts {
            max_concurrent_downloads: 3,
            max_concurrent_downloads_per_host: Some(2),
            ..Opts::default()
        },
    )
    .await;
    env.reg.push(REPO, "slow", &slow);
    env.reg.push(REPO, "quick", &quick);
    for i in 0..3 {
        env.reg
            .st()
            .delay
            .insert(slow.layer_digest(i), Duration::from_secs(1));
    }
    let puller = env.puller.clone();
    let slow_pull = tokio::spawn(async move {
        puller
            .pull(&image_ref("slow"), Credentials::anonymous())
            .await
    });
    // Until the slow image's downloads hold their registry's two slots.
    for _ in 0..200 {
        if env.reg.st().in_flight >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(env.reg.st().in_flight, 2, "the slow registry's share");
    let quick_ref = format!("{OTHER_REGISTRY}/{REPO}:quick");
    assert_eq!(env.pull(&quick_ref).await.unwrap().id, quick.id());
    assert!(
        !slow_pull.is_finished(),
        "the other registry's pull finished only after the slow one"
    );
    assert_eq!(slow_pull.await.unwrap().unwrap().id, slow.id());
    assert_eq!(env.reg.st().max_in_flight, 3);
    assert!(env.leases().is_empty());
}

#[tokio::test]
async fn a_base_layer_shared_by_two_images_is_downloaded_once() {
    let a = TestImage::new(&[b"shared base", b"only in a"], "");
    let b = TestImage::new(&[b"shared base", b"only in b"], "");
    assert_eq!(a.layer_digest(0), b.layer_digest(0));
    let env = env(&[&a, &b], Opts::default()).await;
    env.reg.push(REPO, "a", &a);
    env.reg.push(REPO, "b", &b);
    env.reg
        .st()
        .delay
        .insert(a.layer_digest(0), Duration::from_millis(200));

    let (ref_a, ref_b) = (image_ref("a"), image_ref("b"));
    let (ra, rb) = tokio::join!(env.pull(&ref_a), env.pull(&ref_b));
    assert_eq!(ra.unwrap().id, a.id());
    assert_eq!(rb.unwrap().id, b.id());
    assert_eq!(env.reg.gets(&a.layer_digest(0)), 1, "{:?}", env.reg.hits());
    assert_eq!(env.reg.gets(&a.layer_digest(1)), 1);
    assert_eq!(env.reg.gets(&b.layer_digest(1)), 1);
    assert_eq!(env.index.list().len(), 2);
    assert!(env.leases().is_empty());
    let want: BTreeSet<String> = a.all_blobs().union(&b.all_blobs()).cloned().collect();
    assert_eq!(
        env.ctr.blob_digests().into_iter().collect::<BTreeSet<_>>(),
        want
    );
}

#[tokio::test]
async fn download_limit_bounds_blob_requests_in_flight() {
    let img = TestImage::new(&[b"l1", b"l2", b"l3"], "");
    let env = env(
        &[&img],
        Opts {
            max_concurrent_downloads: 1,
            ..Opts::default()
        },
    )
    .await;
    env.reg.push(REPO, "1", &img);
    for i in 0..3 {
        env.reg
            .st()
            .delay
            .insert(img.layer_digest(i), Duration::from_millis(80));
    }
    env.pull(&image_ref("1")).await.unwrap();
    assert_eq!(env.reg.blob_gets(), 4);
    assert_eq!(env.reg.st().max_in_flight, 1);
}

#[tokio::test]
async fn a_failed_pull_does_not_break_another_pull_sharing_its_download() {
    // A starts the shared layer's download; B joins it; then A fails (its other layer is
    // corrupt) while the shared layer is still coming. B must still get its image.
    let a = TestImage::new(&[b"shared", b"corrupt in a"], "");
    let b = TestImage::new(&[b"shared", b"fine in b"], "");
    let env = env(&[&a, &b], Opts::default()).await;
    env.reg.push(REPO, "a", &a);
    env.reg.push(REPO, "b", &b);
    let shared = a.layer_digest(0);
    {
        let mut reg = env.reg.st();
        reg.corrupt
            .insert(a.layer_digest(1), Bytes::from_static(b"CORRUPT IN A"));
        reg.delay
            .insert(a.layer_digest(1), Duration::from_millis(100));
        reg.delay.insert(shared.clone(), Duration::from_millis(300));
    }

    let pa = {
        let p = env.puller.clone();
        tokio::spawn(async move { p.pull(&image_ref("a"), Credentials::anonymous()).await })
    };
    // B joins once A's download of the shared layer is under way (and long before A fails).
    while env.reg.gets(&shared) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let pb = env.pull(&image_ref("b")).await;
    let pa = pa.await.unwrap();
    assert!(
        matches!(pa, Err(PullError::Registry(RegistryError::Verify { .. }))),
        "{pa:?}"
    );
    assert_eq!(pb.expect("B succeeds").id, b.id());
    assert_eq!(env.reg.gets(&shared), 1, "B used A's download");
    env.settled().await;
    assert!(env.leases().is_empty(), "{:?}", env.leases());
    assert_eq!(
        env.ctr.blob_digests().into_iter().collect::<BTreeSet<_>>(),
        b.all_blobs(),
        "B's image is complete; what only A wrote is gone"
    );
}

#[tokio::test]
async fn a_download_abandoned_by_a_failed_pull_does_not_block_the_next_one() {
    // A fails at once (a missing layer) while its download of the shared layer is still
    // running with nobody waiting for it. B, arriving next, needs that layer too.
    let a = TestImage::new(&[b"shared", b"missing in a"], "");
    let b = TestImage::new(&[b"shared", b"fine in b"], "");
    let env = env(&[&a, &b], Opts::default()).await;
    env.reg.push(REPO, "a", &a);
    env.reg.push(REPO, "b", &b);
    let shared = a.layer_digest(0);
    env.reg.st().blobs.remove(&a.layer_digest(1));
    env.reg
        .st()
        .delay
        .insert(shared.clone(), Duration::from_millis(300));

    let pa = env.pull(&image_ref("a")).await;
    assert!(
        matches!(pa, Err(PullError::Registry(RegistryError::NotFound { .. }))),
        "{pa:?}"
    );
    assert_eq!(env.reg.gets(&shared), 1, "A's download is still running");
    let pb = env.pull(&image_ref("b")).await;
    assert_eq!(pb.expect("B succeeds").id, b.id());
    env.settled().await;
    assert!(env.leases().is_empty(), "{:?}", env.leases());
    assert_eq!(
        env.ctr.blob_digests().into_iter().collect::<BTreeSet<_>>(),
        b.all_blobs()
    );
}

#[tokio::test]
async fn an_interrupted_layer_write_resumes_with_a_range_request() {
    let layer: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
    let img = TestImage::new(&[&layer], "");
    let env = env(&[&img], Opts::default()).await;
    env.reg.push(REPO, "1", &img);
    let digest = img.layer_digest(0);
    // An earlier write of this blob got 1000 bytes into containerd.
    env.ctr.st().ingests.insert(
        format!("remora-{digest}"),
        Ingest {
            data: layer[..1000].to_vec(),
            lease: None,
        },
    );

    env.pull(&image_ref("1")).await.unwrap();
    let gets: Vec<Hit> = env
        .reg
        .hits()
        .into_iter()
        .filter(|h| h.method == "GET" && h.path.ends_with(&digest))
        .collect();
    assert_eq!(gets.len(), 1);
    assert_eq!(gets[0].header("range"), "bytes=1000-");
    assert_eq!(env.ctr.st().blobs[&digest].data, layer);
    assert!(env.ctr.st().ingests.is_empty());
}

/// Eight layers of distinct content.
fn eight_layers() -> TestImage {
    let layers: Vec<Vec<u8>> = (0..8)
        .map(|i| format!("layer number {i}").into_bytes())
        .collect();
    let refs: Vec<&[u8]> = layers.iter().map(Vec::as_slice).collect();
    TestImage::new(&refs, "")
}

#[tokio::test]
async fn layers_are_applied_in_order_while_later_ones_still_download() {
    let img = eight_layers();
    let env = env(&[&img], Opts::default()).await;
    env.reg.push(REPO, "1", &img);
    let last = img.layer_digest(7);
    env.reg
        .st()
        .delay
        .insert(last.clone(), Duration::from_millis(300));

    let info = env.pull(&image_ref("1")).await.unwrap();
    assert_eq!(info.chain_id, *chain_ids(&img.diff_ids).last().unwrap());
    let applied = env.differ.applied.lock().unwrap().clone();
    let order: Vec<&String> = applied.iter().map(|(l, _)| l).collect();
    let want: Vec<String> = (0..8).map(|i| img.layer_digest(i)).collect();
    assert_eq!(order, want.iter().collect::<Vec<_>>(), "bottom first");
    for (i, (layer, stored)) in applied.iter().enumerate() {
        // Each layer is applied only once it and every layer below it are stored.
        for below in &want[..=i] {
            assert!(
                stored.contains(below),
                "{layer} applied before {below} was stored"
            );
        }
    }
    assert!(
        !applied[0].1.contains(&last),
        "layer 1 was applied only after layer 8 finished downloading"
    );
    assert!(
        !applied[6].1.contains(&last),
        "layer 7 was applied only after layer 8 finished downloading"
    );
    // The chains were committed in order, each in the pull's lease.
    let committed = env.snaps.committed.lock().unwrap().clone();
    let chains = chain_ids(&img.diff_ids);
    assert_eq!(
        committed.iter().map(|(c, _)| c).collect::<Vec<_>>(),
        chains.iter().collect::<Vec<_>>()
    );
    assert!(committed.iter().all(|(_, l)| l.starts_with("remora-pull-")));
    assert!(env.leases().is_empty());
}

/// After a pull that failed mid-way: no record, lease, content or active snapshot; the
/// snapshots committed before the failure were made in the pull's lease (deleted with
/// synchronous GC, which removes them in containerd).
async fn assert_nothing_left_of(env: &Env) {
    env.settled().await;
    assert!(env.ctr.st().images.is_empty());
    assert!(env.index.list().is_empty());
    assert!(env.leases().is_empty(), "{:?}", env.leases());
    assert!(
        env.ctr.blob_digests().is_empty(),
        "{:?}",
        env.ctr.blob_digests()
    );
    assert!(env.ctr.st().ingests.is_empty());
    let snaps = env.snaps.snaps.lock().unwrap().clone();
    assert!(
        snaps.values().all(|(_, committed)| *committed),
        "active left: {snaps:?}"
    );
    let pull_lease = env
        .lease_log()
        .iter()
        .find_map(|e| match e {
            LeaseEvent::Created(id) if id.starts_with("remora-pull-") => Some(id.clone()),
            _ => None,
        })
        .expect("a pull lease");
    assert!(env.lease_log().contains(&LeaseEvent::Deleted {
        id: pull_lease.clone(),
        sync: true
    }));
    let committed = env.snaps.committed.lock().unwrap().clone();
    assert_eq!(committed.len(), snaps.len());
    assert!(
        committed.iter().all(|(_, l)| *l == pull_lease),
        "{committed:?}"
    );
}

#[tokio::test]
async fn a_download_failing_after_lower_layers_were_applied_leaves_nothing() {
    let img = eight_layers();
    let env = env(&[&img], Opts::default()).await;
    env.reg.push(REPO, "1", &img);
    // Layer 6 arrives late and corrupt: layers below it are applied by then.
    let bad = img.layer_digest(5);
    {
        let mut reg = env.reg.st();
        reg.corrupt
            .insert(bad.clone(), Bytes::from_static(b"layer number X"));
        reg.delay.insert(bad.clone(), Duration::from_millis(200));
    }
    let err = env.pull(&image_ref("1")).await.unwrap_err();
    assert!(
        matches!(&err, PullError::Registry(RegistryError::Verify { .. })),
        "{err:?}"
    );
    let applied = env.differ.applied.lock().unwrap().len();
    assert!(applied >= 1, "lower layers were applied before the failure");
    assert!(
        applied <= 5,
        "nothing above the failed layer is applied: {applied}"
    );
    assert_nothing_left_of(&env).await;
}

#[tokio::test]
async fn an_unpack_failing_mid_way_waits_for_the_downloads_and_leaves_nothing() {
    let img = eight_layers();
    let mut wrong = img.clone();
    // The differ reports another digest for layer 4 than the config promises.
    wrong.diff_ids[3] = Digest::of(b"something else").to_string();
    let env = env(&[&wrong], Opts::default()).await;
    env.reg.push(REPO, "1", &img);
    env.reg
        .st()
        .delay
        .insert(img.layer_digest(7), Duration::from_millis(200));
    let err = env.pull(&image_ref("1")).await.unwrap_err();
    let PullError::Unpack { source, .. } = &err else {
        panic!("{err:?}")
    };
    assert!(
        matches!(source.as_ref(), UnpackError::DiffId { .. }),
        "{err}"
    );
    assert_eq!(
        env.differ.applied.lock().unwrap().len(),
        4,
        "stopped at layer 4"
    );
    // The pull ended only after the slow layer's download had: nothing was writing any more
    // when its lease went.
    assert!(env.ctr.st().locked.is_empty(), "a writer is still open");
    assert!(env.leases().is_empty(), "{:?}", env.leases());
    assert_nothing_left_of(&env).await;
}
