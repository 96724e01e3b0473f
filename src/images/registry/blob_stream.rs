//! A blob download as a stream: size and digest checks, and stall detection.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::Stream;
use tokio::time::{Instant, Sleep};

use super::config::RegistryConfig;
use super::error::{Ctx, RegistryError};
use crate::images::manifest::{Digest, DigestVerifier, VerifyError};

/// Counts bytes in windows of `stall_window` and fires when the last `stall_timeout` worth
/// of windows together saw fewer than `stall_min_bytes`.
///
/// Counting per window (rather than "time since the last byte") is what stops a trickling
/// connection — one byte every few seconds — from keeping a pull alive forever. The clock
/// only runs while the stream waits for the network: time the consumer spends with an item
/// (writing it to the content store) is not the registry's fault.
pub(super) struct StallDetector {
    window: Duration,
    windows_needed: usize,
    min_bytes: u64,
    timeout: Duration,
    current: u64,
    history: VecDeque<u64>,
    tick: Pin<Box<Sleep>>,
    yielded_at: Option<Instant>,
}

struct Stall {
    window_bytes: u64,
    rate: f64,
}

impl StallDetector {
    pub(super) fn new(c: &RegistryConfig) -> Self {
        let window = if c.stall_window.is_zero() {
            c.stall_timeout.max(Duration::from_millis(1))
        } else {
            c.stall_window
        };
        let windows_needed = (c.stall_timeout.as_secs_f64() / window.as_secs_f64())
            .ceil()
            .max(1.0) as usize;
        Self {
            window,
            windows_needed,
            min_bytes: c.stall_min_bytes,
            timeout: window * windows_needed as u32,
            current: 0,
            history: VecDeque::with_capacity(windows_needed + 1),
            tick: Box::pin(tokio::time::sleep(window)),
            yielded_at: None,
        }
    }

    /// Called when the consumer polls again: pause the clock for the time it was away.
    fn resume(&mut self) {
        if let Some(at) = self.yielded_at.take() {
            let away = Instant::now().saturating_duration_since(at);
            let deadline = self.tick.deadline() + away;
            self.tick.as_mut().reset(deadline);
        }
    }

    /// Called when an item goes to the consumer.
    fn yielded(&mut self) {
        self.yielded_at = Some(Instant::now());
    }

    fn poll_stall(&mut self, cx: &mut Context<'_>) -> Option<Stall> {
        if self.min_bytes == 0 {
            return None;
        }
        while self.tick.as_mut().poll(cx).is_ready() {
            self.history.push_back(std::mem::take(&mut self.current));
            if self.history.len() > self.windows_needed {
                self.history.pop_front();
            }
            let deadline = self.tick.deadline() + self.window;
            self.tick.as_mut().reset(deadline);
            if self.history.len() == self.windows_needed {
                let window_bytes: u64 = self.history.iter().sum();
                if window_bytes < self.min_bytes {
                    return Some(Stall {
                        window_bytes,
                        rate: window_bytes as f64 / self.timeout.as_secs_f64(),
                    });
                }
            }
        }
        None
    }
}

/// A blob download: a stream of chunks that checks size (and digest, when it sees the whole
/// blob) and fails with [`RegistryError::Stalled`] when progress is too slow.
///
/// After an error the stream ends. To continue a broken download, call
/// [`RegistryClient::fetch_blob`](super::RegistryClient::fetch_blob) again with the number of bytes already received.
pub struct BlobStream {
    pub(super) inner: Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>,
    pub(super) reference: String,
    pub(super) host: String,
    pub(super) digest: Digest,
    pub(super) size: u64,
    /// First byte the caller wants.
    pub(super) offset: u64,
    /// Blob position of the next body byte.
    pub(super) position: u64,
    /// Bytes this stream has read from the network.
    pub(super) received: u64,
    pub(super) verifier: Option<DigestVerifier>,
    pub(super) stall: StallDetector,
    pub(super) done: bool,
}

impl std::fmt::Debug for BlobStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlobStream")
            .field("reference", &self.reference)
            .field("host", &self.host)
            .field("digest", &self.digest)
            .field("position", &self.position)
            .finish_non_exhaustive()
    }
}

impl BlobStream {
    /// The host serving the blob.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// True if the stream checks the blob's digest at the end. False when it resumed from
    /// an offset with a partial response: the prefix was never seen here, so the digest
    /// must be checked where the whole blob is (the content store's commit).
    pub fn verifies_digest(&self) -> bool {
        self.verifier.is_some()
    }

    /// The stream without its digest check (size checks stay): for a blob whose bytes go
    /// only into containerd's content store, which hashes them as they are written and
    /// refuses a commit whose digest differs — hashing them here too would cost a second
    /// pass over every byte for nothing.
    pub fn digest_checked_by_store(mut self) -> Self {
        self.verifier = None;
        self
    }

    fn ctx(&self) -> Ctx<'_> {
        Ctx {
            reference: self.reference.clone(),
            host: &self.host,
            what: "",
        }
    }

    fn fail(&mut self, e: RegistryError) -> Poll<Option<Result<Bytes, RegistryError>>> {
        self.done = true;
        Poll::Ready(Some(Err(e)))
    }

    fn what(&self) -> String {
        format!("blob {}", self.digest)
    }
}

impl Stream for BlobStream {
    type Item = Result<Bytes, RegistryError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        this.stall.resume();
        loop {
            // The timer is checked on every poll, so a stream that always has a byte ready
            // is judged as well as one that never has.
            if let Some(s) = this.stall.poll_stall(cx) {
                let e = RegistryError::Stalled {
                    reference: this.reference.clone(),
                    host: this.host.clone(),
                    digest: this.digest.clone(),
                    received: this.received,
                    window_bytes: s.window_bytes,
                    window: this.stall.timeout,
                    rate: s.rate,
                    min_bytes: this.stall.min_bytes,
                };
                return this.fail(e);
            }
            match this.inner.as_mut().poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Err(e))) => {
                    let what = this.what();
                    let ctx = this.ctx();
                    let err = Ctx { what: &what, ..ctx }.transfer(&e);
                    return this.fail(err);
                }
                Poll::Ready(Some(Ok(mut chunk))) => {
                    let n = chunk.len() as u64;
                    this.stall.current += n;
                    this.received += n;
                    if let Some(v) = this.verifier.as_mut() {
                        if let Err(e) = v.update(&chunk) {
                            let what = this.what();
                            let err = Ctx {
                                what: &what,
                                ..this.ctx()
                            }
                            .verify(e);
                            return this.fail(err);
                        }
                    }
                    let start = this.position;
                    this.position += n;
                    if this.position > this.size {
                        let what = this.what();
                        let err = Ctx {
                            what: &what,
                            ..this.ctx()
                        }
                        .verify(VerifyError::Size {
                            expected: this.size,
                            actual: this.position,
                        });
                        return this.fail(err);
                    }
                    // A 200 to a Range request: drop what the caller already has.
                    if this.position <= this.offset {
                        continue;
                    }
                    if start < this.offset {
                        chunk = chunk.slice((this.offset - start) as usize..);
                    }
                    this.stall.yielded();
                    return Poll::Ready(Some(Ok(chunk)));
                }
                Poll::Ready(None) => {
                    this.done = true;
                    let what = this.what();
                    if this.position != this.size {
                        let err = Ctx {
                            what: &what,
                            ..this.ctx()
                        }
                        .verify(VerifyError::Size {
                            expected: this.size,
                            actual: this.position,
                        });
                        return Poll::Ready(Some(Err(err)));
                    }
                    if let Some(v) = this.verifier.take() {
                        if let Err(e) = v.finish() {
                            let err = Ctx {
                                what: &what,
                                ..this.ctx()
                            }
                            .verify(e);
                            return Poll::Ready(Some(Err(err)));
                        }
                    }
                    return Poll::Ready(None);
                }
            }
        }
    }
}
