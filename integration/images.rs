//! The image service against the test bed: real containerd, real registry (via hosts.toml),
//! images built by the project.

use std::time::Duration;

use remora::cri::v1;
use tonic::Code;

use crate::cri;
use crate::harness::{
    certs_dir, push_image, push_image_with, registry_gets, wait_until, AuthProxy, BedRemora,
};

fn spec(image: &str) -> Option<v1::ImageSpec> {
    Some(cri::image_spec(image))
}

async fn status(bed: &BedRemora, image: &str) -> Option<v1::Image> {
    bed.remora
        .images()
        .image_status(v1::ImageStatusRequest {
            image: spec(image),
            verbose: false,
        })
        .await
        .expect("ImageStatus")
        .into_inner()
        .image
}

async fn remove(bed: &BedRemora, image: &str) {
    bed.remora
        .images()
        .remove_image(v1::RemoveImageRequest { image: spec(image) })
        .await
        .expect("RemoveImage");
}

async fn list(bed: &BedRemora) -> Vec<v1::Image> {
    bed.remora
        .images()
        .list_images(v1::ListImagesRequest::default())
        .await
        .expect("ListImages")
        .into_inner()
        .images
}

#[tokio::test]
async fn pull_list_status_remove_round_trip() {
    let bed = BedRemora::start();
    let id = cri::pull(&bed.remora, "busybox")
        .await
        .expect("pull busybox");
    assert!(
        id.starts_with("sha256:") && id.len() == 71,
        "image ref is the id: {id}"
    );

    let img = status(&bed, "busybox").await.expect("present after pull");
    assert_eq!(img.id, id);
    assert_eq!(img.repo_tags, vec!["docker.io/library/busybox:latest"]);
    assert_eq!(img.repo_digests.len(), 1);
    assert!(img.repo_digests[0].starts_with("docker.io/library/busybox@sha256:"));
    assert!(img.size > 0);
    // Every reference form finds it: full name, id, bare hex, id prefix, digest reference.
    for key in [
        "docker.io/library/busybox:latest".to_string(),
        id.clone(),
        id[7..].to_string(),
        id[7..19].to_string(),
        img.repo_digests[0].clone(),
    ] {
        assert_eq!(
            status(&bed, &key).await.map(|i| i.id),
            Some(id.clone()),
            "{key}"
        );
    }
    let listed = list(&bed).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, id);

    let verbose = bed
        .remora
        .images()
        .image_status(v1::ImageStatusRequest {
            image: spec("busybox"),
            verbose: true,
        })
        .await
        .unwrap()
        .into_inner();
    let info: serde_json::Value = serde_json::from_str(&verbose.info["info"]).unwrap();
    assert_eq!(info["imageSpec"]["os"], "linux");

    // The image is really in containerd: record, content, unpacked snapshot.
    let records = bed.ctr_ids(&["images", "ls", "-q"]);
    assert!(
        records.contains(&"docker.io/library/busybox:latest".to_string()),
        "{records:?}"
    );
    assert!(!bed.ctr_ids(&["snapshots", "ls"]).is_empty());
    assert!(
        bed.ctr_ids(&["leases", "ls", "-q"]).is_empty(),
        "pull leases are released"
    );

    remove(&bed, "busybox").await;
    assert!(
        status(&bed, "busybox").await.is_none(),
        "absent is None, not an error"
    );
    assert!(list(&bed).await.is_empty());
    assert!(
        bed.ctr_ids(&["images", "ls", "-q"]).is_empty(),
        "every record removed"
    );
    // Idempotent.
    remove(&bed, "busybox").await;
    remove(&bed, &id).await;
}

#[tokio::test]
async fn user_of_the_image_config_is_reported() {
    let bed = BedRemora::start();
    let pushed = push_image(1, 1000).await;
    cri::pull(&bed.remora, &pushed.reference)
        .await
        .expect("pull");
    let img = status(&bed, &pushed.reference).await.expect("present");
    assert_eq!(img.id, pushed.config);
    assert_eq!(
        img.uid.map(|u| u.value),
        Some(1234),
        "uid from User 1234:5678"
    );
    assert!(img.username.is_empty());
}

#[tokio::test]
async fn one_image_under_two_registry_names_is_one_image_with_two_tags() {
    let bed = BedRemora::start();
    let a = cri::pull(&bed.remora, "registry.k8s.io/pause:3.9")
        .await
        .expect("pull");
    let b = cri::pull(&bed.remora, "k8s.gcr.io/pause:3.9")
        .await
        .expect("pull");
    assert_eq!(a, b);
    let img = status(&bed, &a).await.expect("present");
    assert_eq!(
        img.repo_tags,
        vec!["k8s.gcr.io/pause:3.9", "registry.k8s.io/pause:3.9"]
    );
    // The sandbox image pause:3.10 is a different image.
    let c = cri::pull(&bed.remora, "registry.k8s.io/pause:3.10")
        .await
        .expect("pull");
    assert_ne!(a, c);
    remove(&bed, &a).await;
    assert!(status(&bed, "registry.k8s.io/pause:3.9").await.is_none());
    assert!(status(&bed, "k8s.gcr.io/pause:3.9").await.is_none());
    assert!(status(&bed, "registry.k8s.io/pause:3.10").await.is_some());
}

#[tokio::test]
async fn pull_by_digest_reference() {
    let bed = BedRemora::start();
    let pushed = push_image(2, 2000).await;
    let by_digest = format!("registry.k8s.io/{}@{}", pushed.repository, pushed.manifest);
    let id = cri::pull(&bed.remora, &by_digest)
        .await
        .expect("pull by digest");
    assert_eq!(id, pushed.config);
    let img = status(&bed, &by_digest).await.expect("present");
    assert!(
        img.repo_tags.is_empty(),
        "a digest pull adds no tag: {:?}",
        img.repo_tags
    );
    assert_eq!(img.repo_digests, vec![by_digest]);
}

#[tokio::test]
async fn concurrent_pulls_of_one_image_fetch_each_blob_once() {
    let bed = BedRemora::start();
    let pushed = push_image(3, 256 * 1024).await;
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let mut images = bed.remora.images();
        let reference = pushed.reference.clone();
        tasks.push(tokio::spawn(async move {
            images
                .pull_image(v1::PullImageRequest {
                    image: spec(&reference),
                    ..Default::default()
                })
                .await
                .map(|r| r.into_inner().image_ref)
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap().expect("pull"), pushed.config);
    }
    for layer in &pushed.layers {
        let path = format!("/v2/{}/blobs/{layer}", pushed.repository);
        assert_eq!(registry_gets(&path), 1, "one GET of {layer}");
    }
    let manifest_gets = registry_gets(&format!("/v2/{}/manifests/", pushed.repository));
    assert!(manifest_gets <= 1, "{manifest_gets} manifest GETs");
}

#[tokio::test]
async fn bad_references_are_invalid_argument_and_missing_images_not_found() {
    let certs = certs_dir(&[("local.remora.test", "http://127.0.0.1:5000")]);
    let bed = BedRemora::start_with_certs(certs.path());
    for bad in ["", "Busybox", "busybox:", "a//b", "busybox@sha256:123"] {
        let err = cri::pull(&bed.remora, bad).await.expect_err(bad);
        assert_eq!(err.code(), Code::InvalidArgument, "{bad:?}: {err:?}");
    }
    let missing = "local.remora.test/remora-it/does-not-exist:1";
    let err = cri::pull(&bed.remora, missing)
        .await
        .expect_err("missing image");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert!(err.message().contains(missing), "{}", err.message());
    // Nothing was left behind in containerd.
    assert!(bed.ctr_ids(&["leases", "ls", "-q"]).is_empty());
    assert!(bed.ctr_ids(&["images", "ls", "-q"]).is_empty());
    assert!(bed.ctr_ids(&["content", "ls", "-q"]).is_empty());
}

#[tokio::test]
async fn unreachable_registry_is_unavailable_and_leaves_nothing() {
    // A registry whose only endpoint refuses connections.
    let certs = certs_dir(&[("unreachable.remora.test", "http://127.0.0.1:9")]);
    let bed = BedRemora::start_with_certs(certs.path());
    let err = cri::pull(&bed.remora, "unreachable.remora.test/x/y:1")
        .await
        .expect_err("unreachable");
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(
        err.message().contains("127.0.0.1:9"),
        "names the host: {}",
        err.message()
    );
    assert!(bed.ctr_ids(&["leases", "ls", "-q"]).is_empty());
    assert!(bed.ctr_ids(&["content", "ls", "-q"]).is_empty());
}

#[tokio::test]
async fn images_tagged_or_removed_by_another_client_follow_in_the_index() {
    let bed = BedRemora::start();
    let id = cri::pull(&bed.remora, "busybox").await.expect("pull");
    bed.ctr(&[
        "images",
        "tag",
        "docker.io/library/busybox:latest",
        "example.com/other:tag",
    ]);
    wait_until(
        "the tag made by ctr to appear",
        Duration::from_secs(10),
        || async { status(&bed, "example.com/other:tag").await.map(|i| i.id) == Some(id.clone()) },
    )
    .await;
    bed.ctr(&["images", "rm", "example.com/other:tag"]);
    wait_until(
        "the tag removed by ctr to disappear",
        Duration::from_secs(10),
        || async { status(&bed, "example.com/other:tag").await.is_none() },
    )
    .await;
    assert!(
        status(&bed, "busybox").await.is_some(),
        "the other tag stays"
    );
}

#[tokio::test]
async fn image_fs_info_reports_the_snapshotter() {
    let bed = BedRemora::start();
    cri::pull(&bed.remora, "busybox").await.expect("pull");
    let info = bed
        .remora
        .images()
        .image_fs_info(v1::ImageFsInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    let fs = &info.image_filesystems[0];
    let mountpoint = fs.fs_id.as_ref().unwrap().mountpoint.clone();
    assert!(
        mountpoint.ends_with("io.containerd.snapshotter.v1.overlayfs"),
        "{mountpoint}"
    );
    assert!(fs.used_bytes.as_ref().unwrap().value > 0);
    assert!(fs.inodes_used.as_ref().unwrap().value > 0);
}

/// The file in which the test bed registry stores blob `digest`.
fn registry_blob_file(digest: &str) -> std::path::PathBuf {
    let hex = digest.trim_start_matches("sha256:");
    std::path::PathBuf::from(format!(
        "/var/lib/remora-testbed/registry/docker/registry/v2/blobs/sha256/{}/{hex}/data",
        &hex[..2]
    ))
}

/// After a failed pull: no image record, no lease, no content, no snapshot in the namespace.
fn assert_nothing_left(bed: &BedRemora) {
    assert!(
        bed.ctr_ids(&["images", "ls", "-q"]).is_empty(),
        "image records left"
    );
    assert!(
        bed.ctr_ids(&["leases", "ls", "-q"]).is_empty(),
        "leases left"
    );
    assert!(
        bed.ctr_ids(&["content", "ls", "-q"]).is_empty(),
        "content left"
    );
    assert!(
        bed.ctr_ids(&["snapshots", "ls"]).len() <= 1,
        "snapshots left (header line only)"
    );
}

#[tokio::test]
async fn a_corrupted_blob_fails_the_pull_cleanly() {
    let bed = BedRemora::start();
    let pushed = push_image(2, 64 * 1024).await;
    // The registry serves whatever its storage holds: flip bytes of the second layer on disk
    // (same length), so the registry sends content that does not match its digest.
    let file = registry_blob_file(&pushed.layers[1]);
    let original = std::fs::read(&file).expect("blob file of the pushed layer");
    let mut data = original.clone();
    let mid = data.len() / 2;
    data[mid] ^= 0xff;
    std::fs::write(&file, &data).unwrap();

    let err = cri::pull(&bed.remora, &pushed.reference)
        .await
        .expect_err("corrupt blob");
    assert_eq!(err.code(), Code::DataLoss, "{err:?}");
    let msg = err.message();
    assert!(
        msg.contains(&pushed.layers[1]) || msg.contains("digest"),
        "{msg}"
    );
    assert!(msg.contains(&pushed.repository), "names the image: {msg}");
    assert!(status(&bed, &pushed.reference).await.is_none());
    assert_nothing_left(&bed);

    // Once the registry serves the right bytes again, the pull succeeds: the bad partial
    // write was discarded, not resumed.
    std::fs::write(&file, &original).unwrap();
    assert_eq!(
        cri::pull(&bed.remora, &pushed.reference)
            .await
            .expect("pull after repair"),
        pushed.config
    );
}

#[tokio::test]
async fn a_blob_cut_short_by_the_registry_fails_the_pull_cleanly() {
    let bed = BedRemora::start();
    let pushed = push_image(2, 256 * 1024).await;
    // Truncate the stored blob: the registry ends the body early (a dropped transfer).
    let file = registry_blob_file(&pushed.layers[0]);
    let data = std::fs::read(&file).expect("blob file of the pushed layer");
    std::fs::write(&file, &data[..data.len() / 3]).unwrap();

    let err = cri::pull(&bed.remora, &pushed.reference)
        .await
        .expect_err("short blob");
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(
        err.message().contains(&pushed.repository),
        "{}",
        err.message()
    );
    assert!(status(&bed, &pushed.reference).await.is_none());
    assert_nothing_left(&bed);
}

/// Waits (bounded) until containerd's GC has removed every blob and snapshot of the test's
/// namespace (it collects after an image record goes, in the background).
async fn wait_content_gone(bed: &BedRemora) {
    wait_until(
        "containerd's GC to remove the image's content and snapshots",
        Duration::from_secs(30),
        || async {
            bed.ctr_ids(&["content", "ls", "-q"]).is_empty()
                && bed.ctr_ids(&["snapshots", "ls"]).len() <= 1
        },
    )
    .await;
}

#[tokio::test]
async fn an_image_with_a_64_mib_config_pulls_answers_and_leaves_nothing_once_removed() {
    // Over containerd's 16 MiB gRPC message limit: written to the content store in bounded
    // messages, under remora's config limit.
    let bed = BedRemora::start();
    let pushed = push_image_with(1, 64 * 1024, 64 << 20, None).await;
    let id = cri::pull(&bed.remora, &pushed.reference)
        .await
        .expect("pull of the 64 MiB-config image");
    assert_eq!(id, pushed.config);
    let img = status(&bed, &pushed.reference).await.expect("present");
    assert_eq!(img.id, pushed.config);
    assert!(img.size > 64 << 20, "the config counts: {}", img.size);
    assert_eq!(img.uid.map(|u| u.value), Some(1234));
    let verbose = bed
        .remora
        .images()
        .image_status(v1::ImageStatusRequest {
            image: spec(&pushed.reference),
            verbose: true,
        })
        .await
        .expect("verbose ImageStatus")
        .into_inner();
    let info: serde_json::Value = serde_json::from_str(&verbose.info["info"]).unwrap();
    assert_eq!(info["imageSpec"]["os"], "linux");
    assert_eq!(info["imageSpec"]["config"]["Cmd"][0], "/bin/true");
    assert!(
        verbose.info["info"].len() < 64 << 10,
        "the parsed config is answered, not the 64 MiB blob: {} bytes",
        verbose.info["info"].len()
    );
    assert!(bed.ctr_ids(&["leases", "ls", "-q"]).is_empty());

    remove(&bed, &pushed.reference).await;
    assert!(status(&bed, &pushed.reference).await.is_none());
    assert!(bed.ctr_ids(&["images", "ls", "-q"]).is_empty());
    wait_content_gone(&bed).await;
    assert_nothing_left(&bed);
}

#[tokio::test]
async fn a_config_over_the_limit_is_refused_naming_it_and_leaves_nothing() {
    let bed = BedRemora::start();
    // The manifest states a config of 128 MiB + 1: refused before a byte of it is read.
    let limit: u64 = 128 << 20;
    let pushed = push_image_with(1, 4096, 0, Some(limit + 1)).await;
    let err = cri::pull(&bed.remora, &pushed.reference)
        .await
        .expect_err("over-limit config");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    let msg = err.message();
    for part in [
        pushed.repository.as_str(),
        "image config",
        pushed.config.as_str(),
        &(limit + 1).to_string(),
        &limit.to_string(),
    ] {
        assert!(msg.contains(part), "names {part}: {msg}");
    }
    let config_path = format!("/v2/{}/blobs/{}", pushed.repository, pushed.config);
    assert_eq!(
        registry_gets(&config_path),
        0,
        "the config was never fetched"
    );
    assert!(status(&bed, &pushed.reference).await.is_none());
    assert_nothing_left(&bed);
}

#[tokio::test]
async fn a_registry_wanting_credentials_gets_the_pulls_from_remora_and_containerds_transfer() {
    let proxy = AuthProxy::start("it-user", "it-secret");
    let certs = certs_dir(&[("registry.k8s.io", &format!("http://{}", proxy.addr))]);
    let bed = BedRemora::start_pulling_layers_with(certs.path(), "transfer");
    let image = push_image(2, 64 * 1024).await;

    // Without credentials: refused, and nothing left behind.
    let err = cri::pull(&bed.remora, &image.reference)
        .await
        .expect_err("no credentials");
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert_nothing_left(&bed);

    // With them: remora fetches the manifest and config, containerd the layers, both
    // answering the registry's challenge with the pull's credentials.
    bed.remora
        .images()
        .pull_image(v1::PullImageRequest {
            image: Some(cri::image_spec(&image.reference)),
            auth: Some(v1::AuthConfig {
                username: "it-user".into(),
                password: "it-secret".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("pull with credentials");
    assert!(status(&bed, &image.reference).await.is_some());
    let requests = proxy.requests();
    let from = |who: &str, digest: &str| {
        requests
            .iter()
            // containerd names the registry in a query (`?ns=registry.k8s.io`).
            .filter(|r| r.user_agent.contains(who) && r.path.contains(&format!("/{digest}")))
            .cloned()
            .collect::<Vec<_>>()
    };
    for layer in &image.layers {
        let gets = from("containerd", layer);
        assert!(
            gets.iter().any(|r| r.method == "GET" && r.authorized),
            "containerd fetched layer {layer} with the credentials: {gets:?}"
        );
        assert!(
            from("remora", layer).is_empty(),
            "remora left layer {layer} to containerd"
        );
    }
    // containerd asked remora for them: its first request was answered with a challenge.
    assert!(
        requests
            .iter()
            .any(|r| r.user_agent.contains("containerd") && !r.authorized),
        "containerd was challenged: {requests:?}"
    );
    assert!(
        from("remora", &image.config)
            .iter()
            .any(|r| r.method == "GET" && r.authorized),
        "remora fetched the config with the credentials: {requests:?}"
    );
}

/// One PullImage over a raw HTTP/2 stream to remora's socket, with `grpc-timeout` set to
/// `timeout` and the request's body sent `body_after` after its headers. tonic's client is not
/// used: it enforces the deadline itself and would hide what the server answers.
async fn raw_pull(
    socket: &std::path::Path,
    image: &str,
    timeout: &str,
    body_after: Duration,
) -> tonic::Status {
    use http_body_util::{BodyExt, StreamBody};
    use hyper::body::Frame;
    use prost::Message;

    let io = hyper_util::rt::TokioIo::new(
        tokio::net::UnixStream::connect(socket)
            .await
            .expect("connect to remora"),
    );
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
            .await
            .expect("HTTP/2 handshake");
    tokio::spawn(conn);
    let message = v1::PullImageRequest {
        image: spec(image),
        ..Default::default()
    }
    .encode_to_vec();
    // gRPC's length-prefixed message: not compressed, 4-byte big-endian length.
    let mut framed = vec![0u8];
    framed.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    framed.extend_from_slice(&message);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<bytes::Bytes>, std::io::Error>>(1);
    let body = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    let request = hyper::Request::post("http://remora/runtime.v1.ImageService/PullImage")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", timeout)
        .body(body)
        .expect("request");
    let send_body = tokio::spawn(async move {
        tokio::time::sleep(body_after).await;
        // remora may have answered (and reset the stream) already: nothing to send then.
        let _ = tx.send(Ok(Frame::data(framed.into()))).await;
    });
    let response = sender.send_request(request).await.expect("a response");
    let status = match tonic::Status::from_header_map(response.headers()) {
        Some(status) => status,
        None => {
            let body = response.into_body().collect().await.expect("the body");
            let trailers = body.trailers().cloned().expect("trailers");
            tonic::Status::from_header_map(&trailers).expect("a grpc-status")
        }
    };
    send_body.await.expect("body sender");
    status
}

/// critest's "public image should timeout if requested" (a 1 ms deadline), the way it failed
/// on a loaded machine: the body came after tonic had started its timer, tonic's timeout
/// answered CANCELLED before remora's handler ran. Here the body comes 50 ms after the headers.
#[tokio::test]
async fn a_pull_past_the_callers_deadline_is_deadline_exceeded_even_before_its_body_arrives() {
    let bed = BedRemora::start();
    let socket = &bed.remora.socket;
    let late = raw_pull(socket, "busybox", "1m", Duration::from_millis(50)).await;
    assert_eq!(late.code(), Code::DeadlineExceeded, "{late:?}");
    assert!(late.message().contains("PullImage"), "{late:?}");
    for round in 0..20 {
        let prompt = raw_pull(socket, "busybox", "1m", Duration::ZERO).await;
        assert_eq!(
            prompt.code(),
            Code::DeadlineExceeded,
            "round {round}: {prompt:?}"
        );
    }
    // The same raw call with time enough pulls: the client above is not what failed.
    let ok = raw_pull(socket, "busybox", "60S", Duration::ZERO).await;
    assert_eq!(ok.code(), Code::Ok, "{ok:?}");
    assert!(status(&bed, "busybox").await.is_some());
}
