//! Parsing an image config as it streams by, so that a big one is never held whole.
//!
//! A config can be tens of MiB (build history: one entry per build step, each with its
//! command line), of which remora keeps a few fields ([`ImageConfig`]). Reading it whole to
//! parse it made a 64 MiB config cost a 64 MiB buffer on top of the daemon. Here the chunks go,
//! as they arrive from the registry or the content store, over a bounded channel to
//! `serde_json` running on a blocking thread (a 64 MiB config takes a good fraction of a
//! CPU-second to parse; the async threads keep serving every other call): memory stays at the
//! channel's few chunks, the reader's buffer and the parsed fields. A small config — the usual
//! case, a few KiB — is gathered and parsed inline: a blocking thread would cost more than it
//! saves.

use std::io::{BufReader, Read};

use bytes::{Buf, Bytes};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::manifest::{ImageConfig, ManifestError};

/// Configs of at least this many bytes are parsed on a blocking thread as they stream.
pub const PARSE_INLINE_MAX: u64 = 256 << 10;
/// Chunks queued for the parser before the feeder waits: a registry body chunk is at most a
/// few hundred KiB (a content-store read 1 MiB), so this bounds what waits in memory.
const QUEUED_CHUNKS: usize = 4;
/// The parser's read buffer.
const READ_BUFFER: usize = 64 << 10;

/// Parses one image config fed chunk by chunk (see the module docs).
pub struct ConfigParser {
    mode: Mode,
}

enum Mode {
    /// A small config, gathered whole and parsed at the end.
    Inline(Vec<u8>),
    /// A big config, parsed on a blocking thread as it arrives.
    Streaming {
        /// `None` once the input has ended.
        tx: Option<mpsc::Sender<Bytes>>,
        task: JoinHandle<Result<ImageConfig, ManifestError>>,
    },
}

impl ConfigParser {
    /// A parser for a config its descriptor says is `size` bytes long.
    pub fn new(size: u64) -> Self {
        if size < PARSE_INLINE_MAX {
            // `size` is under PARSE_INLINE_MAX, so it fits a usize.
            return Self {
                mode: Mode::Inline(Vec::with_capacity(size as usize)),
            };
        }
        let (tx, rx) = mpsc::channel(QUEUED_CHUNKS);
        let task = tokio::task::spawn_blocking(move || {
            let reader = BufReader::with_capacity(READ_BUFFER, ChannelReader::new(rx));
            serde_json::from_reader(reader).map_err(|source| ManifestError::Json {
                what: "image config",
                source,
            })
        });
        Self {
            mode: Mode::Streaming { tx: Some(tx), task },
        }
    }

    /// Feeds the next chunk of the config. `false` when the parser has stopped early (the
    /// JSON is invalid): feeding more is useless, and [`ConfigParser::finish`] says why.
    pub async fn feed(&mut self, chunk: Bytes) -> bool {
        match &mut self.mode {
            Mode::Inline(buf) => {
                buf.extend_from_slice(&chunk);
                true
            }
            Mode::Streaming { tx: Some(tx), .. } => tx.send(chunk).await.is_ok(),
            Mode::Streaming { tx: None, .. } => false,
        }
    }

    /// Ends the input: the parsed config, or why the bytes fed are not one.
    pub async fn finish(self) -> Result<ImageConfig, ManifestError> {
        match self.mode {
            Mode::Inline(buf) => ImageConfig::parse(&buf),
            Mode::Streaming { tx, task } => {
                drop(tx); // end of input
                task.await
                    .map_err(|e| ManifestError::ParseAborted(e.to_string()))?
            }
        }
    }
}

/// A blocking [`Read`] over the chunks a [`ConfigParser`] is fed; end of input when the sender
/// is dropped. Runs on a blocking thread only.
struct ChannelReader {
    rx: mpsc::Receiver<Bytes>,
    current: Bytes,
}

impl ChannelReader {
    fn new(rx: mpsc::Receiver<Bytes>) -> Self {
        Self {
            rx,
            current: Bytes::new(),
        }
    }
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                Some(chunk) => self.current = chunk,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        self.current.advance(n);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A config of about `history_kib` KiB, most of it build history remora does not keep.
    fn config_json(history_kib: usize) -> String {
        let entry = format!(
            r#"{{"created":"2024-01-01T00:00:00Z","created_by":"/bin/sh -c echo {}"}}"#,
            r#"x\"y"#.repeat(1000)
        );
        let history = vec![entry; history_kib.div_ceil(4)].join(",");
        format!(
            r#"{{"architecture":"amd64","os":"linux","history":[{history}],
              "config":{{"User":"1234","Cmd":["/bin/true"],"Env":null,
                         "Labels":{{"a":"b"}}}},
              "rootfs":{{"type":"layers","diff_ids":["sha256:{}"]}}}}"#,
            "a".repeat(64)
        )
    }

    /// Feeds `data` in chunks of `chunk` bytes, then finishes.
    async fn parse_in_chunks(data: &[u8], chunk: usize) -> Result<ImageConfig, ManifestError> {
        let mut parser = ConfigParser::new(data.len() as u64);
        for piece in data.chunks(chunk) {
            if !parser.feed(Bytes::copy_from_slice(piece)).await {
                break;
            }
        }
        parser.finish().await
    }

    #[tokio::test]
    async fn a_big_config_streamed_in_uneven_chunks_parses_as_whole() {
        let json = config_json(2048);
        assert!(
            json.len() as u64 >= PARSE_INLINE_MAX,
            "streamed, not inline"
        );
        let whole = ImageConfig::parse(json.as_bytes()).unwrap();
        for chunk in [1, 7, 4096, 1 << 20] {
            let streamed = parse_in_chunks(json.as_bytes(), chunk).await.unwrap();
            assert_eq!(streamed, whole, "chunks of {chunk}");
        }
        assert_eq!(whole.config.user.as_deref(), Some("1234"));
        assert_eq!(whole.config.cmd, ["/bin/true"]);
        assert_eq!(whole.rootfs.diff_ids.len(), 1);
    }

    #[tokio::test]
    async fn a_small_config_parses_inline() {
        let json = config_json(0);
        assert!((json.len() as u64) < PARSE_INLINE_MAX);
        let parsed = parse_in_chunks(json.as_bytes(), 5).await.unwrap();
        assert_eq!(parsed, ImageConfig::parse(json.as_bytes()).unwrap());
    }

    #[tokio::test]
    async fn truncated_or_trailing_bytes_are_errors_whatever_the_size() {
        for json in [config_json(0), config_json(1024)] {
            let cut = &json.as_bytes()[..json.len() - 10];
            let err = parse_in_chunks(cut, 1000).await.unwrap_err();
            assert!(matches!(err, ManifestError::Json { .. }), "{err}");
            let extra = format!("{json} {{}}");
            let err = parse_in_chunks(extra.as_bytes(), 1000).await.unwrap_err();
            assert!(matches!(err, ManifestError::Json { .. }), "{err}");
        }
    }

    #[tokio::test]
    async fn a_big_invalid_config_stops_taking_input_and_says_why() {
        let mut parser = ConfigParser::new(64 << 20);
        let garbage = Bytes::from(vec![b'!'; 64 << 10]);
        // The parser fails on the first byte and lets go of its input: feeding reports it
        // (after at most the queued chunks), rather than taking 64 MiB for nothing.
        let stopped = tokio::time::timeout(Duration::from_secs(30), async {
            let mut fed = 0;
            while parser.feed(garbage.clone()).await {
                fed += 1;
            }
            fed
        })
        .await
        .expect("feeding stops once the parser has failed");
        assert!(stopped < 1024, "{stopped} chunks taken");
        let err = parser.finish().await.unwrap_err();
        assert!(
            matches!(
                err,
                ManifestError::Json {
                    what: "image config",
                    ..
                }
            ),
            "{err}"
        );
    }
}
