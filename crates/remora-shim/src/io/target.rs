//! What a stream string names (a FIFO or file path, `fifo://`, `file://`, `binary://` and
//! `binary-v2://` URIs, parsed as containerd's Go shim parses them), and opening it: the
//! output sinks the shim copies to, and the stdin FIFO it copies from.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use tokio::io::unix::AsyncFd;

use super::fd::{register, write_all};
use super::IoError;

/// An output target parsed from a stream string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Target {
    /// A plain path or `fifo://`: a FIFO, or an existing regular file.
    Path(PathBuf),
    /// `file://`: a file appended to, made with its parent dirs.
    File(PathBuf),
    /// `binary://` / `binary-v2://`: a logging binary.
    Binary {
        path: PathBuf,
        args: Vec<String>,
        /// `binary-v2`: readiness needs a byte on fd 5, not just its close.
        strict_ready: bool,
    },
}

/// Parses one stream string; `None` for an empty one.
pub(super) fn parse_target(stream: &'static str, s: &str) -> Result<Option<Target>, IoError> {
    if s.is_empty() {
        return Ok(None);
    }
    let bad = |reason| IoError::BadUri {
        stream,
        uri: s.to_string(),
        reason,
    };
    let Some((scheme, rest)) = s.split_once("://") else {
        return Ok(Some(Target::Path(PathBuf::from(s))));
    };
    if s.starts_with('/') {
        // An absolute path that happens to contain "://".
        return Ok(Some(Target::Path(PathBuf::from(s))));
    }
    let rest = rest.split_once('#').map_or(rest, |(before, _)| before);
    let (rest, query) = match rest.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (rest, None),
    };
    // Skip the authority: `binary:///x` has none, and Go's url.Parse ignores it for the path.
    let path = rest
        .find('/')
        .map(|i| &rest[i..])
        .ok_or_else(|| bad("no absolute path"))?;
    let path = PathBuf::from(percent_decode(path, false).ok_or_else(|| bad("bad %-escape"))?);
    match scheme {
        "fifo" => Ok(Some(Target::Path(path))),
        "file" => Ok(Some(Target::File(path))),
        "binary" | "binary-v2" => {
            let mut args = Vec::new();
            for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
                let (key, value) = match pair.split_once('=') {
                    Some((k, v)) => (k, Some(v)),
                    None => (pair, None),
                };
                args.push(percent_decode(key, true).ok_or_else(|| bad("bad %-escape"))?);
                if let Some(value) = value {
                    args.push(percent_decode(value, true).ok_or_else(|| bad("bad %-escape"))?);
                }
            }
            Ok(Some(Target::Binary {
                path,
                args,
                strict_ready: scheme == "binary-v2",
            }))
        }
        _ => Err(IoError::UnsupportedScheme {
            stream,
            scheme: scheme.to_string(),
            uri: s.to_string(),
        }),
    }
}

/// Decodes %XX escapes (and `+` as a space in a query, as Go's `url.QueryUnescape`).
fn percent_decode(s: &str, query: bool) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' if query => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// Where an output stream is written.
pub(super) struct Sink {
    pub(super) kind: SinkKind,
    /// For the logs.
    pub(super) name: String,
    /// Serializes chunks when stdout and stderr share the sink: a chunk is written whole.
    pub(super) write_lock: tokio::sync::Mutex<()>,
}

pub(super) enum SinkKind {
    /// An output FIFO: the non-blocking write end, and a read end kept (never read) so that
    /// the FIFO always has a reader.
    Fifo {
        writer: AsyncFd<OwnedFd>,
        _reader: OwnedFd,
    },
    /// A regular file, opened for append. Written with blocking writes on the runtime's
    /// thread: epoll does not take regular files, and an append of at most 4 KiB to a local
    /// file does not block for long.
    File(File),
    /// A pipe to a logging binary (a terminal's output with a `binary://` stdout).
    Pipe(AsyncFd<OwnedFd>),
}

impl Sink {
    pub(super) async fn write_all(&self, buf: &[u8]) -> io::Result<()> {
        let _chunk = self.write_lock.lock().await;
        match &self.kind {
            SinkKind::Fifo { writer, .. } | SinkKind::Pipe(writer) => write_all(writer, buf).await,
            SinkKind::File(file) => (&*file).write_all(buf),
        }
    }
}

/// Opens a FIFO for reading or writing, non-blocking (and close-on-exec, as std always does).
fn open_fifo(
    stream: &'static str,
    what: &'static str,
    path: &Path,
    write: bool,
) -> Result<OwnedFd, IoError> {
    OpenOptions::new()
        .read(!write)
        .write(write)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map(OwnedFd::from)
        .map_err(|source| IoError::Open {
            stream,
            what,
            path: path.to_path_buf(),
            source,
        })
}

fn is_fifo(stream: &'static str, path: &Path) -> Result<bool, IoError> {
    std::fs::metadata(path)
        .map(|m| m.file_type().is_fifo())
        .map_err(|source| IoError::Open {
            stream,
            what: "stdio path",
            path: path.to_path_buf(),
            source,
        })
}

/// Opens an output target that the shim copies to.
pub(super) fn open_sink(stream: &'static str, target: &Target) -> Result<Sink, IoError> {
    let (kind, path) = match target {
        Target::Path(path) if is_fifo(stream, path)? => {
            // The reader first: then the non-blocking open of the writer cannot fail with
            // ENXIO (no reader), whether or not the client has opened its end yet.
            let reader = open_fifo(stream, "FIFO for reading", path, false)?;
            let writer = open_fifo(stream, "FIFO for writing", path, true)?;
            let kind = SinkKind::Fifo {
                writer: register(stream, "FIFO writer", writer)?,
                _reader: reader,
            };
            (kind, path)
        }
        Target::Path(path) => {
            if !std::fs::metadata(path)
                .map(|m| m.is_file())
                .unwrap_or(false)
            {
                return Err(IoError::NotFifo {
                    stream,
                    path: path.clone(),
                });
            }
            (SinkKind::File(open_append(stream, path, false)?), path)
        }
        Target::File(path) => {
            if let Some(dir) = path.parent() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(dir)
                    .map_err(|source| IoError::Open {
                        stream,
                        what: "log file directory",
                        path: dir.to_path_buf(),
                        source,
                    })?;
            }
            (SinkKind::File(open_append(stream, path, true)?), path)
        }
        // prepare starts a logger for these instead; refuse rather than panic if that changes.
        Target::Binary { path, .. } => {
            return Err(IoError::UnsupportedScheme {
                stream,
                scheme: "binary".to_string(),
                uri: path.display().to_string(),
            })
        }
    };
    Ok(Sink {
        kind,
        name: path.display().to_string(),
        write_lock: tokio::sync::Mutex::new(()),
    })
}

fn open_append(stream: &'static str, path: &Path, create: bool) -> Result<File, IoError> {
    OpenOptions::new()
        .append(true)
        .create(create)
        .mode(0o644)
        .open(path)
        .map_err(|source| IoError::Open {
            stream,
            what: "log file",
            path: path.to_path_buf(),
            source,
        })
}

/// Opens the stdin FIFO: a non-blocking reader for the copy, and the write end the shim keeps
/// until `close_stdin` (see the module docs).
pub(super) fn open_stdin(path: &Path) -> Result<(AsyncFd<OwnedFd>, OwnedFd), IoError> {
    const STREAM: &str = "stdin";
    if !is_fifo(STREAM, path)? {
        return Err(IoError::NotFifo {
            stream: STREAM,
            path: path.to_path_buf(),
        });
    }
    let reader = open_fifo(STREAM, "FIFO for reading", path, false)?;
    let keep = open_fifo(STREAM, "FIFO for writing", path, true)?;
    Ok((register(STREAM, "FIFO reader", reader)?, keep))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_strings_parse_like_containerd() {
        assert_eq!(parse_target("stdout", "").unwrap(), None);
        assert_eq!(
            parse_target("stdout", "/run/x/stdout").unwrap(),
            Some(Target::Path("/run/x/stdout".into()))
        );
        assert_eq!(
            parse_target("stdout", "fifo:///run/x/a%20b").unwrap(),
            Some(Target::Path("/run/x/a b".into()))
        );
        assert_eq!(
            parse_target("stdout", "file:///var/log/c.log").unwrap(),
            Some(Target::File("/var/log/c.log".into()))
        );
        assert_eq!(
            parse_target("stdout", "binary:///usr/bin/logger?id=a%2Fb&flag&msg=x+y").unwrap(),
            Some(Target::Binary {
                path: "/usr/bin/logger".into(),
                args: vec![
                    "id".into(),
                    "a/b".into(),
                    "flag".into(),
                    "msg".into(),
                    "x y".into()
                ],
                strict_ready: false,
            })
        );
        assert!(matches!(
            parse_target("stdout", "binary-v2://host/bin/l").unwrap(),
            Some(Target::Binary { path, strict_ready: true, .. }) if path == Path::new("/bin/l")
        ));
        assert!(matches!(
            parse_target("stderr", "npipe:///x"),
            Err(IoError::UnsupportedScheme { stream: "stderr", scheme, .. }) if scheme == "npipe"
        ));
        assert!(matches!(
            parse_target("stdout", "file:///x%zz"),
            Err(IoError::BadUri { .. })
        ));
        assert!(matches!(
            parse_target("stdout", "file://nopath"),
            Err(IoError::BadUri { .. })
        ));
    }
}
