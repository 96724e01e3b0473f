//! The CRI container log: what kubelet's `kuberuntime/logs` parses for `kubectl logs`.
//!
//! Each record is `<timestamp> <stdout|stderr> <P|F> <content>\n`, as containerd's
//! `internal/cri/io/logger.go` writes it. The splitting rules follow containerd exactly:
//!
//! - A line ending in `\n` is one `F` record; the `\n` is not part of the content, nor is a `\r`
//!   right before it (`\r\n` is stripped as a whole; any other `\r` is content).
//! - A line longer than the maximum line size is cut into `P` records of exactly that size,
//!   followed by the rest (at least one byte, at most the maximum) as `F`. An empty line is an
//!   `F` record with empty content.
//! - At EOF (or a read error) a line without its `\n` is written as a `P` record; nothing is
//!   written if nothing is pending.
//! - A `\r` at the end of what has been read so far is held back until the next byte shows
//!   whether it starts a `\r\n`; containerd does the same (it unreads a `\r` that ends a full
//!   buffer), which is why `abcd\r\n` with a 4-byte limit is `F abcd`, not `P abcd` + `F `.
//!
//! Timestamps: UTC, fixed nine fractional digits (`2016-10-06T00:17:09.669794202Z`, what CRI-O
//! writes and kubelet's own `RFC3339NanoFixed`). containerd's Go `RFC3339Nano` drops trailing
//! zeros and uses the local offset; kubelet parses both with `RFC3339NanoLenient`, and the fixed
//! width keeps records sortable as text.
//!
//! One [`LogWriter`] per container is shared by the stdout and stderr copiers: each read is turned
//! into whole records and written in one locked `write_all` to an `O_APPEND` file, so records of
//! the two streams never interleave mid-line. Write failures do not stop a copier: it keeps
//! draining the FIFO, because a container whose output is not read blocks on a full pipe
//! (containerd does the same).

use std::io::Write as _;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::{broadcast, Mutex};
use tokio::task::JoinHandle;

/// containerd's default `max_container_log_line_size`.
pub const DEFAULT_MAX_LINE_SIZE: NonZeroUsize = match NonZeroUsize::new(16 * 1024) {
    Some(n) => n,
    // Evaluated at compile time: 16 KiB is not zero.
    None => panic!("zero line size"),
};

/// File mode of a log file (containerd: 0640).
const LOG_FILE_MODE: u32 = 0o640;
/// Bytes read from a stream at once. Larger than containerd's 4 KiB buffer; the records are the
/// same regardless (the splitter does not depend on how reads are chunked).
const READ_BUF_SIZE: usize = 32 * 1024;
/// Chunks an attach subscriber may fall behind before it misses output (it then gets
/// `RecvError::Lagged`). Subscribers never slow the container down.
const FANOUT_CAPACITY: usize = 64;

/// Which output stream of a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamKind {
    /// Standard output (with a terminal: all tty output).
    Stdout,
    /// Standard error.
    Stderr,
}

impl StreamKind {
    /// The name in a CRI log record.
    pub fn as_str(self) -> &'static str {
        match self {
            StreamKind::Stdout => "stdout",
            StreamKind::Stderr => "stderr",
        }
    }
}

/// The tag of a CRI log record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogTag {
    /// `P`: the line continues in the next record of the same stream.
    Partial,
    /// `F`: the record ends the line.
    Full,
}

impl LogTag {
    /// The tag in a CRI log record.
    pub fn as_str(self) -> &'static str {
        match self {
            LogTag::Partial => "P",
            LogTag::Full => "F",
        }
    }
}

/// Appends one CRI log record to `out`.
pub fn format_record(
    time: SystemTime,
    stream: StreamKind,
    tag: LogTag,
    content: &[u8],
    out: &mut Vec<u8>,
) {
    // humantime panics before 1970 and fails after 9999; a wild clock must not lose the line.
    let latest = UNIX_EPOCH + Duration::new(253_402_300_799, 999_999_999);
    let time = time.clamp(UNIX_EPOCH, latest);
    // Cannot fail: writing to a Vec does not, and the clamp keeps humantime in range.
    let _ = write!(
        out,
        "{} {} {} ",
        humantime::format_rfc3339_nanos(time),
        stream.as_str(),
        tag.as_str()
    );
    out.extend_from_slice(content);
    out.push(b'\n');
}

/// Cuts one stream's bytes into CRI log records (see the module docs for the rules). Pure: feed
/// it what was read, in any chunking, and [`finish`](Self::finish) it at EOF.
#[derive(Debug)]
pub struct LineSplitter {
    max: Option<NonZeroUsize>,
    /// Content of the current line not yet written; never longer than `max`.
    pending: Vec<u8>,
    /// A `\r` was the last byte seen; it is content unless a `\n` follows.
    held_cr: bool,
}

impl LineSplitter {
    /// A splitter cutting lines longer than `max_line_size` (`None`: never).
    pub fn new(max_line_size: Option<NonZeroUsize>) -> Self {
        LineSplitter {
            max: max_line_size,
            pending: Vec::new(),
            held_cr: false,
        }
    }

    /// Feeds bytes; `emit` gets every record they complete.
    pub fn push(&mut self, mut data: &[u8], emit: &mut impl FnMut(LogTag, &[u8])) {
        while let Some(i) = data.iter().position(|&b| b == b'\n') {
            self.append(&data[..i], emit);
            // `\r\n`: the held `\r` belongs to the line ending.
            self.held_cr = false;
            emit(LogTag::Full, &self.pending);
            self.pending.clear();
            data = &data[i + 1..];
        }
        self.append(data, emit);
    }

    /// At EOF: writes what is left of an unterminated line as a `P` record.
    pub fn finish(&mut self, emit: &mut impl FnMut(LogTag, &[u8])) {
        if std::mem::take(&mut self.held_cr) {
            self.push_content(b"\r", emit);
        }
        if !self.pending.is_empty() {
            emit(LogTag::Partial, &self.pending);
            self.pending.clear();
        }
    }

    /// Adds line content (no `\n`), holding back a trailing `\r`.
    fn append(&mut self, mut bytes: &[u8], emit: &mut impl FnMut(LogTag, &[u8])) {
        let Some((&last, rest)) = bytes.split_last() else {
            return;
        };
        if std::mem::take(&mut self.held_cr) {
            self.push_content(b"\r", emit);
        }
        if last == b'\r' {
            bytes = rest;
            self.held_cr = true;
        }
        self.push_content(bytes, emit);
    }

    /// Adds content, emitting a `P` record each time more than `max` bytes are known.
    fn push_content(&mut self, mut bytes: &[u8], emit: &mut impl FnMut(LogTag, &[u8])) {
        let Some(max) = self.max.map(NonZeroUsize::get) else {
            self.pending.extend_from_slice(bytes);
            return;
        };
        loop {
            let room = max - self.pending.len();
            if bytes.len() <= room {
                self.pending.extend_from_slice(bytes);
                return;
            }
            // More than `max` bytes: the first `max` are a record of their own.
            if self.pending.is_empty() {
                emit(LogTag::Partial, &bytes[..max]);
            } else {
                self.pending.extend_from_slice(&bytes[..room]);
                emit(LogTag::Partial, &self.pending);
                self.pending.clear();
            }
            bytes = &bytes[room..];
        }
    }
}

/// Why a log file operation failed.
#[derive(Debug, Error)]
pub enum LogError {
    /// The log file's directory could not be created.
    #[error("cannot create log directory {}: {source}", dir.display())]
    CreateDir {
        /// The directory.
        dir: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The log file could not be opened.
    #[error("cannot open log file {}: {source}", path.display())]
    Open {
        /// The log file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The log path is a symlink: refused, not followed (whoever can write the log directory,
    /// a container with it mounted, say, would make remora append to any file it names).
    #[error("log file {} is a symlink; refusing to follow it", path.display())]
    Symlink {
        /// The log file.
        path: PathBuf,
    },
    /// A directory between the pod's log directory and the log file (kubelet's
    /// `<container name>/`) is a symlink: refused, not followed (whoever can write the pod's
    /// log directory would make remora create and append to files wherever it points).
    #[error("log directory {} is a symlink; refusing to follow it", dir.display())]
    DirSymlink {
        /// The directory.
        dir: PathBuf,
    },
    /// The blocking open of the log file did not complete (its task was cancelled or panicked).
    #[error("opening log file {} did not complete: {source}", path.display())]
    OpenAborted {
        /// The log file.
        path: PathBuf,
        /// The cause.
        source: tokio::task::JoinError,
    },
    /// The log path is not a regular file (a FIFO, a device, a directory).
    #[error("log file {} is a {kind}, not a regular file", path.display())]
    NotRegular {
        /// The log file.
        path: PathBuf,
        /// What it is.
        kind: &'static str,
    },
    /// Writing to the log file failed.
    #[error("cannot write log file {}: {source}", path.display())]
    Write {
        /// The log file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The writer was closed.
    #[error("log file {} is closed", path.display())]
    Closed {
        /// The log file.
        path: PathBuf,
    },
}

/// The output sinks of one container: its CRI log file, shared by the stdout and stderr
/// copiers, and a broadcast of the raw bytes of each stream for attach sessions.
#[derive(Debug)]
pub struct LogWriter {
    path: PathBuf,
    /// The directory the file is opened from (the pod's log directory) and the file's path
    /// under it: every directory between them is opened without following symlinks.
    dir: PathBuf,
    relative: PathBuf,
    /// False for a container without a log path: its output only fans out.
    to_file: bool,
    max_line_size: Option<NonZeroUsize>,
    /// `None` once closed. The lock makes each batch of records one uninterrupted write.
    file: Mutex<Option<tokio::fs::File>>,
    stdout: broadcast::Sender<Bytes>,
    stderr: broadcast::Sender<Bytes>,
}

impl LogWriter {
    /// Opens the log file at `relative` under the pod's log directory `dir` for appending.
    /// `dir` is kubelet's and is trusted (created if missing, symlinks on the way to it
    /// followed); from it on nothing is followed: each directory of `relative` (kubelet's
    /// `<container name>/`) is opened relative to the one before with `O_NOFOLLOW |
    /// O_DIRECTORY` (made with `mkdirat` if missing), and the file relative to the last one
    /// with `O_NOFOLLOW`. A symlink on the way is refused naming it. Lines longer than
    /// `max_line_size` are split (`None`: never; containerd's default is
    /// [`DEFAULT_MAX_LINE_SIZE`]).
    pub async fn open_in(
        dir: impl Into<PathBuf>,
        relative: impl Into<PathBuf>,
        max_line_size: Option<NonZeroUsize>,
    ) -> Result<LogWriter, LogError> {
        let (dir, relative) = (dir.into(), relative.into());
        let file = open_log_file(&dir, &relative).await?;
        Ok(LogWriter {
            path: dir.join(&relative),
            dir,
            relative,
            to_file: true,
            max_line_size,
            file: Mutex::new(Some(file)),
            stdout: broadcast::channel(FANOUT_CAPACITY).0,
            stderr: broadcast::channel(FANOUT_CAPACITY).0,
        })
    }

    /// A writer for a container without a log path (critest makes such containers): no file,
    /// records are dropped, but the output still fans out to attach sessions.
    pub fn fanout_only() -> LogWriter {
        LogWriter {
            path: PathBuf::new(),
            dir: PathBuf::new(),
            relative: PathBuf::new(),
            to_file: false,
            max_line_size: None,
            file: Mutex::new(None),
            stdout: broadcast::channel(FANOUT_CAPACITY).0,
            stderr: broadcast::channel(FANOUT_CAPACITY).0,
        }
    }

    /// The log file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The line size limit the copiers apply.
    pub fn max_line_size(&self) -> Option<NonZeroUsize> {
        self.max_line_size
    }

    /// Appends formatted records (whole records only: they are written without interruption).
    pub async fn write_records(&self, records: &[u8]) -> Result<(), LogError> {
        if !self.to_file {
            return Ok(());
        }
        let mut file = self.file.lock().await;
        let Some(f) = file.as_mut() else {
            return Err(LogError::Closed {
                path: self.path.clone(),
            });
        };
        // Flushed per batch so a write error surfaces here, and so a reader (kubelet following
        // the log) and `reopen` never miss buffered records.
        let res = match f.write_all(records).await {
            Ok(()) => f.flush().await,
            Err(e) => Err(e),
        };
        res.map_err(|source| LogError::Write {
            path: self.path.clone(),
            source,
        })
    }

    /// Reopens the file at the original path (`ReopenContainerLog`): kubelet renamed the old file
    /// when rotating; the next records go to a new file at the path. If opening fails, the old
    /// file stays in use. Also reopens a closed writer.
    pub async fn reopen(&self) -> Result<(), LogError> {
        if !self.to_file {
            return Ok(());
        }
        let new = open_log_file(&self.dir, &self.relative).await?;
        // Swapped under the lock: a batch in flight completes in the old file.
        *self.file.lock().await = Some(new);
        Ok(())
    }

    /// Closes the file; later writes fail with [`LogError::Closed`] until [`reopen`](Self::reopen).
    pub async fn close(&self) {
        self.file.lock().await.take();
    }

    /// Receives the raw bytes of `stream` from now on (for attach). A subscriber that falls more
    /// than a few dozen reads behind gets `RecvError::Lagged` and misses output rather than
    /// slowing the container.
    pub fn subscribe(&self, stream: StreamKind) -> broadcast::Receiver<Bytes> {
        self.fanout(stream).subscribe()
    }

    fn fanout(&self, stream: StreamKind) -> &broadcast::Sender<Bytes> {
        match stream {
            StreamKind::Stdout => &self.stdout,
            StreamKind::Stderr => &self.stderr,
        }
    }

    fn publish(&self, stream: StreamKind, chunk: &[u8]) {
        let tx = self.fanout(stream);
        // Copying only when someone listens; a send error just means the last subscriber left.
        if tx.receiver_count() > 0 {
            let _ = tx.send(Bytes::copy_from_slice(chunk));
        }
    }
}

/// The pod's log directory and the log file's path under it, for [`LogWriter::open_in`]:
/// `log_path` (the two joined at creation) split at `log_directory` when it is inside it,
/// else at its last component (only the file itself is then opened without following).
pub fn split_log_path<'a>(log_directory: &'a Path, log_path: &'a Path) -> (&'a Path, &'a Path) {
    if !log_directory.as_os_str().is_empty() {
        if let Ok(relative) = log_path.strip_prefix(log_directory) {
            if !relative.as_os_str().is_empty() {
                return (log_directory, relative);
            }
        }
    }
    match (log_path.parent(), log_path.file_name()) {
        (Some(dir), Some(name)) => (dir, Path::new(name)),
        _ => (Path::new(""), log_path),
    }
}

async fn open_log_file(dir: &Path, relative: &Path) -> Result<tokio::fs::File, LogError> {
    let path = dir.join(relative);
    let (d, r) = (dir.to_path_buf(), relative.to_path_buf());
    let file = tokio::task::spawn_blocking(move || open_log_file_in(&d, &r))
        .await
        .map_err(|source| LogError::OpenAborted { path, source })??;
    Ok(tokio::fs::File::from_std(file))
}

/// [`LogWriter::open_in`]'s open, blocking.
fn open_log_file_in(dir: &Path, relative: &Path) -> Result<std::fs::File, LogError> {
    use nix::fcntl::{open, OFlag};
    use nix::sys::stat::Mode;
    use std::path::Component;

    let path = dir.join(relative);
    let invalid = || LogError::Open {
        path: path.clone(),
        source: std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the log path must name a file below the log directory",
        ),
    };
    let mut names = Vec::new();
    for c in relative.components() {
        match c {
            Component::Normal(name) => names.push(name),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                return Err(invalid())
            }
        }
    }
    let Some(file_name) = names.pop() else {
        return Err(invalid());
    };
    let base = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        std::fs::create_dir_all(dir).map_err(|source| LogError::CreateDir {
            dir: dir.to_path_buf(),
            source,
        })?;
        dir
    };
    let mut walked = dir.to_path_buf();
    let mut parent = open(
        base,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| LogError::CreateDir {
        dir: walked.clone(),
        source: e.into(),
    })?;
    for name in names {
        walked.push(name);
        parent = open_subdir(&parent, name, &walked)?;
    }
    // O_NOFOLLOW: a symlink at the path is refused (ELOOP), never followed. O_NONBLOCK: a
    // FIFO put there does not block the open until a reader comes; the fstat below refuses it.
    let fd = nix::fcntl::openat(
        &parent,
        file_name,
        OFlag::O_WRONLY
            | OFlag::O_CREAT
            | OFlag::O_APPEND
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(LOG_FILE_MODE),
    )
    .map_err(|errno| {
        if errno == nix::errno::Errno::ELOOP {
            return LogError::Symlink { path: path.clone() };
        }
        // A FIFO without a reader (ENXIO), a directory (EISDIR): say what is there.
        match std::fs::symlink_metadata(&path)
            .ok()
            .and_then(|m| special(&m))
        {
            Some(kind) => LogError::NotRegular {
                path: path.clone(),
                kind,
            },
            None => LogError::Open {
                path: path.clone(),
                source: errno.into(),
            },
        }
    })?;
    let file = std::fs::File::from(fd);
    let meta = file.metadata().map_err(|source| LogError::Open {
        path: path.clone(),
        source,
    })?;
    if let Some(kind) = special(&meta) {
        return Err(LogError::NotRegular { path, kind });
    }
    // Appends to a regular file never block; O_NONBLOCK is dropped anyway so that the writes
    // behave as they always did.
    clear_nonblock(&file).map_err(|source| LogError::Open { path, source })?;
    Ok(file)
}

/// Directory `name` of `parent` (at `path`), opened without following a symlink and made
/// (0755, as kubelet makes it) if missing.
fn open_subdir(
    parent: &std::os::fd::OwnedFd,
    name: &std::ffi::OsStr,
    path: &Path,
) -> Result<std::os::fd::OwnedFd, LogError> {
    use nix::errno::Errno;
    use nix::fcntl::{openat, AtFlags, OFlag};
    use nix::sys::stat::{fstatat, mkdirat, Mode, SFlag};

    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let opened = match openat(parent, name, flags, Mode::empty()) {
        Err(Errno::ENOENT) => match mkdirat(parent, name, Mode::from_bits_truncate(0o755)) {
            Ok(()) | Err(Errno::EEXIST) => openat(parent, name, flags, Mode::empty()),
            Err(e) => Err(e),
        },
        other => other,
    };
    opened.map_err(|errno| {
        // O_NOFOLLOW | O_DIRECTORY on a symlink fails with ELOOP or ENOTDIR: look.
        let is_symlink = fstatat(parent, name, AtFlags::AT_SYMLINK_NOFOLLOW).is_ok_and(|st| {
            SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFLNK
        });
        if is_symlink {
            LogError::DirSymlink {
                dir: path.to_path_buf(),
            }
        } else {
            LogError::CreateDir {
                dir: path.to_path_buf(),
                source: errno.into(),
            }
        }
    })
}

/// What `meta` is when it is not a regular file.
fn special(meta: &std::fs::Metadata) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    let ft = meta.file_type();
    Some(if ft.is_file() {
        return None;
    } else if ft.is_dir() {
        "directory"
    } else if ft.is_fifo() {
        "FIFO"
    } else if ft.is_socket() {
        "socket"
    } else if ft.is_char_device() || ft.is_block_device() {
        "device"
    } else if ft.is_symlink() {
        "symlink"
    } else {
        "special file"
    })
}

fn clear_nonblock(f: &std::fs::File) -> std::io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let flags = fcntl(f, FcntlArg::F_GETFL).map_err(std::io::Error::from)?;
    let flags = OFlag::from_bits_truncate(flags) - OFlag::O_NONBLOCK;
    fcntl(f, FcntlArg::F_SETFL(flags)).map_err(std::io::Error::from)?;
    Ok(())
}

/// What a copier did, returned when it ends; the caller logs it.
#[derive(Debug, Default)]
pub struct CopySummary {
    /// Bytes read from the stream.
    pub bytes: u64,
    /// CRI log records produced.
    pub records: u64,
    /// Batches of records that could not be written (the copier went on draining the stream).
    pub write_errors: u64,
    /// The first write error, if any.
    pub first_write_error: Option<LogError>,
    /// The read error that ended the copier, if it did not end at EOF.
    pub read_error: Option<std::io::Error>,
}

/// Copies one stream into `writer` as CRI log records (and its raw bytes to `writer`'s
/// subscribers) until EOF or a read error, then flushes an unterminated line as `P`.
///
/// On a FIFO, EOF comes once the shim has opened and closed its end. If the shim never opens it
/// (`Tasks.Create` failed), the copier waits: abort its handle when rolling back.
///
/// # Panics
///
/// Outside a tokio runtime (it spawns a task).
pub fn copy_stream<R>(
    mut reader: R,
    stream: StreamKind,
    writer: Arc<LogWriter>,
) -> JoinHandle<CopySummary>
where
    R: AsyncRead + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let mut summary = CopySummary::default();
        let mut splitter = LineSplitter::new(writer.max_line_size());
        let mut buf = vec![0u8; READ_BUF_SIZE];
        let mut batch = Vec::new();
        loop {
            let n = match reader.read(&mut buf).await {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Like containerd: write what is pending and stop.
                    summary.read_error = Some(e);
                    break;
                }
            };
            let chunk = &buf[..n];
            summary.bytes += n as u64;
            writer.publish(stream, chunk);
            // One timestamp per read: these bytes arrived together.
            let now = SystemTime::now();
            splitter.push(chunk, &mut |tag, content| {
                format_record(now, stream, tag, content, &mut batch);
                summary.records += 1;
            });
            write_batch(&writer, &mut batch, &mut summary).await;
        }
        let now = SystemTime::now();
        splitter.finish(&mut |tag, content| {
            format_record(now, stream, tag, content, &mut batch);
            summary.records += 1;
        });
        write_batch(&writer, &mut batch, &mut summary).await;
        summary
    })
}

async fn write_batch(writer: &LogWriter, batch: &mut Vec<u8>, summary: &mut CopySummary) {
    if batch.is_empty() {
        return;
    }
    if let Err(e) = writer.write_records(batch).await {
        summary.write_errors += 1;
        summary.first_write_error.get_or_insert(e);
    }
    batch.clear();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// The log file at `path`, opened from its parent directory (only the file itself is not
    /// followed).
    async fn open_at(
        path: impl AsRef<Path>,
        max_line_size: Option<NonZeroUsize>,
    ) -> Result<LogWriter, LogError> {
        let (dir, relative) = split_log_path(Path::new(""), path.as_ref());
        LogWriter::open_in(dir, relative, max_line_size).await
    }

    const CRI_LINE: &str =
        r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{9}Z) (stdout|stderr) ([PF]) (.*)$";

    fn nz(n: usize) -> Option<NonZeroUsize> {
        NonZeroUsize::new(n)
    }

    /// Runs a splitter over `chunks` (then EOF) and returns `"<tag> <content>"` per record.
    fn split(max: Option<NonZeroUsize>, chunks: &[&[u8]]) -> Vec<String> {
        let mut s = LineSplitter::new(max);
        let mut out = Vec::new();
        let mut emit =
            |tag: LogTag, c: &[u8]| out.push(format!("{} {}", tag.as_str(), c.escape_ascii()));
        for c in chunks {
            s.push(c, &mut emit);
        }
        s.finish(&mut emit);
        out
    }

    /// `(stream, tag, content)` of each line of a CRI log, checking the format of every line.
    fn parse_log(text: &str) -> Vec<(String, String, String)> {
        let re = regex::Regex::new(CRI_LINE).unwrap();
        assert!(text.is_empty() || text.ends_with('\n'), "{text:?}");
        text.lines()
            .map(|l| {
                let c = re.captures(l).unwrap_or_else(|| panic!("bad line {l:?}"));
                (c[2].to_string(), c[3].to_string(), c[4].to_string())
            })
            .collect()
    }

    #[test]
    fn records_have_the_exact_cri_format() {
        let t = humantime::parse_rfc3339("2016-10-06T00:17:09.669794202Z").unwrap();
        let mut out = Vec::new();
        format_record(
            t,
            StreamKind::Stdout,
            LogTag::Partial,
            b"log content 1",
            &mut out,
        );
        format_record(
            t,
            StreamKind::Stderr,
            LogTag::Full,
            b"log content 2",
            &mut out,
        );
        format_record(t, StreamKind::Stdout, LogTag::Full, b"", &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "2016-10-06T00:17:09.669794202Z stdout P log content 1\n\
             2016-10-06T00:17:09.669794202Z stderr F log content 2\n\
             2016-10-06T00:17:09.669794202Z stdout F \n"
        );

        // Fixed width: trailing zeros of the fraction are kept.
        let t = humantime::parse_rfc3339("2024-01-02T03:04:05.1Z").unwrap();
        let mut out = Vec::new();
        format_record(t, StreamKind::Stdout, LogTag::Full, b"x", &mut out);
        assert_eq!(out, b"2024-01-02T03:04:05.100000000Z stdout F x\n");

        // A clock before 1970 is clamped instead of panicking.
        let mut out = Vec::new();
        let before = UNIX_EPOCH - Duration::from_secs(5);
        format_record(before, StreamKind::Stdout, LogTag::Full, b"x", &mut out);
        assert_eq!(out, b"1970-01-01T00:00:00.000000000Z stdout F x\n");
    }

    #[test]
    fn full_and_partial_lines() {
        assert_eq!(split(None, &[b"a\nb\n"]), ["F a", "F b"]);
        assert_eq!(split(None, &[b"\n\n"]), ["F ", "F "]);
        // Unterminated at EOF: P.
        assert_eq!(split(None, &[b"a\nrest"]), ["F a", "P rest"]);
        // Nothing pending at EOF: nothing written.
        assert_eq!(split(None, &[]), Vec::<String>::new());
        // Chunking does not matter.
        assert_eq!(
            split(None, &[b"hel", b"lo\nwor", b"", b"ld"]),
            ["F hello", "P world"]
        );
    }

    #[test]
    fn long_lines_are_cut_into_p_records_of_the_max_size() {
        let max = nz(4);
        assert_eq!(split(max, &[b"abcdefghij\n"]), ["P abcd", "P efgh", "F ij"]);
        // A multiple of the limit: the last piece is F, never an empty F.
        assert_eq!(split(max, &[b"abcdefgh\n"]), ["P abcd", "F efgh"]);
        assert_eq!(split(max, &[b"abcd\n"]), ["F abcd"]);
        // Same cuts whatever the read chunking.
        assert_eq!(
            split(max, &[b"ab", b"cdefg", b"h", b"ij\nk"]),
            ["P abcd", "P efgh", "F ij", "P k"]
        );
        // At EOF every piece is P.
        assert_eq!(split(max, &[b"abcdefghij"]), ["P abcd", "P efgh", "P ij"]);

        // The default limit: 40000 bytes are 16384 + 16384 + 7232.
        let line = [vec![b'x'; 40_000], b"\n".to_vec()].concat();
        let mut sizes = Vec::new();
        let mut s = LineSplitter::new(Some(DEFAULT_MAX_LINE_SIZE));
        s.push(&line, &mut |tag, c| sizes.push((tag, c.len())));
        assert_eq!(
            sizes,
            [
                (LogTag::Partial, 16_384),
                (LogTag::Partial, 16_384),
                (LogTag::Full, 7_232)
            ]
        );
        // No limit: one record however long.
        assert_eq!(split(None, &[&line]).len(), 1);
    }

    #[test]
    fn crlf_is_one_line_ending_like_containerd() {
        assert_eq!(split(None, &[b"a\r\nb\n"]), ["F a", "F b"]);
        assert_eq!(split(None, &[b"a\r", b"\n"]), ["F a"]);
        // Only the `\r` right before `\n` is stripped.
        assert_eq!(split(None, &[b"a\r\r\n"]), ["F a\\r"]);
        assert_eq!(split(None, &[b"a\rb\n"]), ["F a\\rb"]);
        assert_eq!(split(None, &[b"\r\n"]), ["F "]);
        // A lone `\r` at EOF is content.
        assert_eq!(split(None, &[b"a\r"]), ["P a\\r"]);
        // The `\r` does not count towards the limit unless it is content (containerd unreads a
        // `\r` that ends its buffer).
        assert_eq!(split(nz(4), &[b"abcd\r\n"]), ["F abcd"]);
        assert_eq!(split(nz(4), &[b"abcd\r", b"\n"]), ["F abcd"]);
        assert_eq!(split(nz(4), &[b"abcd\rX\n"]), ["P abcd", "F \\rX"]);
        assert_eq!(split(nz(4), &[b"abcd\r"]), ["P abcd", "P \\r"]);
    }

    #[tokio::test]
    async fn a_symlink_or_special_file_at_the_log_path_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, b"untouched").unwrap();
        let link = tmp.path().join("0.log");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let e = open_at(&link, nz(8)).await.unwrap_err();
        assert!(
            matches!(&e, LogError::Symlink { path } if path == &link),
            "{e}"
        );
        assert!(e.to_string().contains("symlink"), "{e}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"untouched");

        let fifo = tmp.path().join("1.log");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        // Without O_NONBLOCK this open would wait for a reader forever: bound it.
        let e = tokio::time::timeout(Duration::from_secs(10), open_at(&fifo, nz(8)))
            .await
            .expect("opening a FIFO log path does not block")
            .unwrap_err();
        assert!(
            matches!(&e, LogError::NotRegular { kind: "FIFO", .. }),
            "{e}"
        );
        let dir = tmp.path().join("2.log");
        std::fs::create_dir(&dir).unwrap();
        let e = open_at(&dir, nz(8)).await.unwrap_err();
        assert!(
            matches!(
                &e,
                LogError::NotRegular {
                    kind: "directory",
                    ..
                }
            ),
            "{e}"
        );

        // A regular file still opens and is written in append mode.
        let ok = tmp.path().join("3.log");
        let w = open_at(&ok, nz(8)).await.unwrap();
        drop(w);
        assert!(ok.is_file());
    }

    /// kubelet's `<pod log dir>/<container>/` replaced by a symlink (by whoever can write the
    /// pod's log directory): refused naming it, nothing created where it points.
    #[tokio::test]
    async fn a_symlinked_container_log_directory_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let pod = tmp.path().join("pods/ns_pod_uid");
        std::fs::create_dir_all(&pod).unwrap();
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        let link = pod.join("c1");
        std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
        let log_path = pod.join("c1/0.log");
        let (dir, relative) = split_log_path(&pod, &log_path);
        assert_eq!((dir, relative), (pod.as_path(), Path::new("c1/0.log")));

        let e = LogWriter::open_in(dir, relative, nz(8)).await.unwrap_err();
        assert!(
            matches!(&e, LogError::DirSymlink { dir } if dir == &link),
            "{e}"
        );
        assert!(e.to_string().contains(&link.display().to_string()), "{e}");
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);

        // A real directory opens, and a missing one is made; reopen takes the same way.
        std::fs::remove_file(&link).unwrap();
        let w = LogWriter::open_in(&pod, "c1/0.log", nz(8)).await.unwrap();
        assert_eq!(w.path(), log_path);
        assert!(log_path.is_file());
        std::fs::remove_dir_all(pod.join("c1")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
        let e = w.reopen().await.unwrap_err();
        assert!(matches!(&e, LogError::DirSymlink { .. }), "{e}");
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
        std::fs::remove_file(&link).unwrap();
        w.reopen().await.unwrap();
        assert!(log_path.is_file());
    }

    #[tokio::test]
    async fn copier_writes_records_and_ends_at_eof() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("pods/p/c/0.log");
        let w = Arc::new(open_at(&path, nz(8)).await.unwrap());
        let input: &'static [u8] = b"one\r\ntwo\n0123456789abc\nend";
        let summary = copy_stream(input, StreamKind::Stderr, w.clone())
            .await
            .unwrap();
        assert_eq!(summary.bytes, input.len() as u64);
        assert_eq!(summary.records, 5);
        assert!(summary.read_error.is_none() && summary.first_write_error.is_none());

        let text = std::fs::read_to_string(&path).unwrap();
        let got: Vec<String> = parse_log(&text)
            .into_iter()
            .map(|(s, t, c)| format!("{s} {t} {c}"))
            .collect();
        assert_eq!(
            got,
            [
                "stderr F one",
                "stderr F two",
                "stderr P 01234567",
                "stderr F 89abc",
                "stderr P end"
            ]
        );
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, LOG_FILE_MODE);
    }

    #[tokio::test]
    async fn concurrent_stdout_and_stderr_produce_whole_lines() {
        const LINES: usize = 500;
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("0.log");
        let w = Arc::new(open_at(&path, Some(DEFAULT_MAX_LINE_SIZE)).await.unwrap());

        let mut copiers = Vec::new();
        for stream in [StreamKind::Stdout, StreamKind::Stderr] {
            // A small pipe and odd-sized writes: lines arrive cut at arbitrary points.
            let (mut tx, rx) = tokio::io::duplex(97);
            copiers.push(copy_stream(rx, stream, w.clone()));
            tokio::spawn(async move {
                let text: String = (0..LINES)
                    .map(|i| format!("{}-{i:04}-{}\n", stream.as_str(), "x".repeat(i % 300)))
                    .collect();
                for piece in text.as_bytes().chunks(61) {
                    tx.write_all(piece).await.unwrap();
                }
            });
        }
        for c in copiers {
            let s = c.await.unwrap();
            assert_eq!(s.records, LINES as u64);
        }

        let text = std::fs::read_to_string(&path).unwrap();
        let records = parse_log(&text);
        assert_eq!(records.len(), 2 * LINES);
        for stream in ["stdout", "stderr"] {
            let lines: Vec<&(String, String, String)> =
                records.iter().filter(|r| r.0 == stream).collect();
            assert_eq!(lines.len(), LINES);
            for (i, (_, tag, content)) in lines.into_iter().enumerate() {
                assert_eq!(tag, "F");
                assert_eq!(content, &format!("{stream}-{i:04}-{}", "x".repeat(i % 300)));
            }
        }
    }

    #[tokio::test]
    async fn reopen_after_rename_starts_a_new_file() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("0.log");
        let rotated = tmp.path().join("0.log.20240101-000000");
        let w = open_at(&path, None).await.unwrap();
        let t = SystemTime::now();
        let record = |s: &str| {
            let mut b = Vec::new();
            format_record(t, StreamKind::Stdout, LogTag::Full, s.as_bytes(), &mut b);
            b
        };

        w.write_records(&record("before")).await.unwrap();
        // kubelet's rotation: rename, then ReopenContainerLog.
        std::fs::rename(&path, &rotated).unwrap();
        w.write_records(&record("in between")).await.unwrap();
        w.reopen().await.unwrap();
        w.write_records(&record("after")).await.unwrap();

        let content = |p: &Path| -> Vec<String> {
            parse_log(&std::fs::read_to_string(p).unwrap())
                .into_iter()
                .map(|r| r.2)
                .collect()
        };
        assert_eq!(content(&rotated), ["before", "in between"]);
        assert_eq!(content(&path), ["after"]);

        // Closed: writes fail until reopened.
        w.close().await;
        let err = w.write_records(&record("lost")).await.unwrap_err();
        assert!(matches!(err, LogError::Closed { .. }), "{err}");
        w.reopen().await.unwrap();
        w.write_records(&record("again")).await.unwrap();
        assert_eq!(content(&path), ["after", "again"]);
    }

    #[tokio::test]
    async fn copier_keeps_draining_when_writes_fail() {
        let tmp = tempfile::tempdir().unwrap();
        let w = Arc::new(open_at(tmp.path().join("0.log"), None).await.unwrap());
        w.close().await;
        let input: &'static [u8] = b"a\nb\nc";
        let s = copy_stream(input, StreamKind::Stdout, w).await.unwrap();
        assert_eq!(s.bytes, 5);
        assert!(s.write_errors >= 1);
        assert!(matches!(s.first_write_error, Some(LogError::Closed { .. })));
    }

    #[tokio::test]
    async fn a_writer_without_a_file_still_fans_out() {
        let w = Arc::new(LogWriter::fanout_only());
        let mut out = w.subscribe(StreamKind::Stdout);
        let (mut tx, rx) = tokio::io::duplex(64);
        let copier = copy_stream(rx, StreamKind::Stdout, w.clone());
        tx.write_all(b"no log\n").await.unwrap();
        drop(tx);
        let summary = copier.await.unwrap();
        assert_eq!(
            summary.write_errors, 0,
            "dropping records is no write error"
        );
        assert_eq!(summary.records, 1);
        assert_eq!(out.recv().await.unwrap(), Bytes::from_static(b"no log\n"));
        w.reopen().await.unwrap();
    }

    #[tokio::test]
    async fn subscribers_get_the_raw_bytes_of_their_stream() {
        let tmp = tempfile::tempdir().unwrap();
        let w = Arc::new(open_at(tmp.path().join("0.log"), None).await.unwrap());
        let mut out = w.subscribe(StreamKind::Stdout);
        let mut err = w.subscribe(StreamKind::Stderr);
        let input: &'static [u8] = b"raw\r\nbytes";
        copy_stream(input, StreamKind::Stdout, w.clone())
            .await
            .unwrap();
        let mut got = Vec::new();
        while let Ok(chunk) = out.try_recv() {
            got.extend_from_slice(&chunk);
        }
        assert_eq!(got, input);
        assert!(err.try_recv().is_err());
    }

    #[tokio::test]
    async fn open_fails_with_a_named_error() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("file"), b"").unwrap();
        let err = open_at(tmp.path().join("file/0.log"), None)
            .await
            .unwrap_err();
        assert!(matches!(err, LogError::CreateDir { .. }), "{err}");
    }
}
