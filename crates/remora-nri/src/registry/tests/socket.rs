//! Tests of `accept.rs`'s socket.

use super::*;

#[tokio::test]
async fn the_socket_is_0600_in_a_0700_directory_and_a_stale_one_is_replaced() {
    let h = harness(FixedSnapshot::default());
    let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode(&h.path), 0o600);
    assert_eq!(mode(h.path.parent().unwrap()), 0o700);
    h.registry.stop().await;
    assert!(!h.path.exists(), "stop removes the socket");

    // A stale socket (bound, nobody listening) is replaced; a regular file is not.
    let stale = std::os::unix::net::UnixListener::bind(&h.path).expect("stale socket");
    drop(stale);
    let config = Config::new(&h.path, "remora", "0.1.0");
    let again = Registry::start(
        config.clone(),
        Arc::new(FixedSnapshot::default()),
        h.runtime.clone(),
        discard(),
    )
    .expect("replaces the stale socket");
    again.stop().await;
    std::fs::write(&h.path, b"not a socket").expect("file");
    match Registry::start(
        config,
        Arc::new(FixedSnapshot::default()),
        h.runtime.clone(),
        discard(),
    ) {
        Err(RegistryError::NotASocket(p)) => assert_eq!(p, h.path),
        Err(other) => panic!("wrong error {other}"),
        Ok(_) => panic!("started over a regular file"),
    }
    assert_eq!(std::fs::read(&h.path).expect("file kept"), b"not a socket");
}
