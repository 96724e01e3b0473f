//! The stdio FIFOs of a container or exec process: `<dir>/<id>-stdin`, `<id>-stdout`,
//! `<id>-stderr`, the paths containerd's `Tasks.Create` / `Tasks.Exec` take as `stdin`, `stdout`
//! and `stderr` (containerd's `cio.NewFIFOSetInDir` + CRI `newFifos`: no stdin FIFO unless the
//! container asked for stdin). As in containerd, the stderr FIFO exists with a terminal too,
//! but the runc shim then writes all tty output to stdout and never opens stderr: do not copy
//! stderr of a tty process (the copier would wait until aborted).
//!
//! Why opening needs care: opening a FIFO blocks until the other end is opened too, and the shim
//! only opens its ends inside `Tasks.Create`, which remora calls *after* opening its own. A
//! blocking open here would deadlock. containerd's `fifo` package opens in a background goroutine;
//! the non-blocking equivalents used here are:
//!
//! - read ends (stdout, stderr): `O_RDONLY | O_NONBLOCK`, which never blocks, and stays
//!   non-blocking because tokio's reactor needs it. Not `O_RDWR`: holding a write end of our own
//!   would mean never seeing EOF when the container exits, and EOF is what ends the copier.
//!   Reading before any writer arrived would also return EOF, but it never happens: Linux does not
//!   report a hang-up on a FIFO until a writer has come *and gone* (`pipe_poll` compares the
//!   writer counter seen at open), and tokio reads only after epoll said the end is ready. So the
//!   copier waits for the shim, and sees EOF once the shim closes its end.
//! - the write end (stdin): `O_WRONLY | O_NONBLOCK` fails with `ENXIO` while no reader exists, so
//!   it is opened `O_RDWR` (Linux-only, defined there for FIFOs). Holding a read end also means a
//!   write before the shim attaches lands in the pipe buffer instead of failing with `EPIPE`.
//!
//! Closing the write end needs care too: bytes in a FIFO live only while some end of it is
//! open. containerd's Go shim opens its stdin ends in background goroutines after `Start`
//! returned, so a client that sends its stdin and closes it at once can see remora write the
//! bytes and drop its end before the shim's reader opened: the pipe, and the bytes, are gone,
//! and the process reads an empty stdin. [`wait_drained`] waits for a reader to take them first.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::stat::Mode;
use nix::unistd::mkfifo;
use thiserror::Error;
use tokio::net::unix::pipe;

/// Why creating, opening or removing a FIFO failed.
#[derive(Debug, Error)]
pub enum FifoError {
    /// The ID cannot be part of a file name in the FIFO directory.
    #[error("invalid FIFO id {id:?}: {reason}")]
    InvalidId {
        /// The rejected ID.
        id: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// containerd takes the paths as strings, so the directory must be valid UTF-8.
    #[error("FIFO directory {} is not valid UTF-8", dir.display())]
    NonUtf8Dir {
        /// The rejected directory.
        dir: PathBuf,
    },
    /// The directory could not be created.
    #[error("cannot create FIFO directory {}: {source}", dir.display())]
    CreateDir {
        /// The directory.
        dir: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// `mkfifo` failed.
    #[error("cannot create FIFO {}: {errno}", path.display())]
    Mkfifo {
        /// The FIFO path.
        path: PathBuf,
        /// The error number.
        errno: Errno,
    },
    /// Something other than a FIFO is in the way.
    #[error("{} exists and is not a FIFO", path.display())]
    NotAFifo {
        /// The path.
        path: PathBuf,
    },
    /// Opening one end failed.
    #[error("cannot open FIFO {}: {source}", path.display())]
    Open {
        /// The FIFO path.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// Removing a FIFO failed (other than it being gone already).
    #[error("cannot remove FIFO {}: {source}", path.display())]
    Remove {
        /// The FIFO path.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
}

/// Which FIFOs a process needs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FifoSpec {
    /// The process reads stdin (CRI `stdin: true`).
    pub stdin: bool,
    /// The process has a terminal: all its output arrives on stdout.
    pub tty: bool,
}

/// The stdio arguments of containerd's `Tasks.Create` / `Tasks.Exec`; an empty string means
/// "not connected".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskStdio {
    /// Path of the stdin FIFO, or empty.
    pub stdin: String,
    /// Path of the stdout FIFO.
    pub stdout: String,
    /// Path of the stderr FIFO.
    pub stderr: String,
    /// Whether the process gets a terminal.
    pub terminal: bool,
}

/// The FIFO paths of one container or exec process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FifoSet {
    stdin: Option<PathBuf>,
    stdout: PathBuf,
    stderr: PathBuf,
    tty: bool,
}

impl FifoSet {
    /// The paths for `id` under `dir`, without touching the file system (to find the FIFOs of a
    /// process again, e.g. to remove them).
    pub fn paths(dir: &Path, id: &str, spec: FifoSpec) -> Result<FifoSet, FifoError> {
        validate_id(id)?;
        if dir.to_str().is_none() {
            return Err(FifoError::NonUtf8Dir {
                dir: dir.to_path_buf(),
            });
        }
        let path = |suffix: &str| dir.join(format!("{id}-{suffix}"));
        Ok(FifoSet {
            stdin: spec.stdin.then(|| path("stdin")),
            stdout: path("stdout"),
            stderr: path("stderr"),
            tty: spec.tty,
        })
    }

    /// Creates `dir` (mode 0700, if missing) and the FIFOs (mode 0600). A FIFO that already
    /// exists is reused, as containerd's `fifo` package does, so that retrying after a partial
    /// failure works. On failure the FIFOs created by this call are removed again.
    pub fn create(dir: &Path, id: &str, spec: FifoSpec) -> Result<FifoSet, FifoError> {
        let set = FifoSet::paths(dir, id, spec)?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| FifoError::CreateDir {
                dir: dir.to_path_buf(),
                source,
            })?;
        let mut created: Vec<&Path> = Vec::new();
        for path in set.all() {
            match make_fifo(path) {
                Ok(true) => created.push(path),
                Ok(false) => {}
                Err(e) => {
                    for p in created {
                        // Best effort: the caller gets the error that made us roll back; a FIFO
                        // left behind is reused by the next attempt.
                        let _ = remove_file_if_exists(p);
                    }
                    return Err(e);
                }
            }
        }
        Ok(set)
    }

    /// The stdin FIFO, if the process reads stdin.
    pub fn stdin(&self) -> Option<&Path> {
        self.stdin.as_deref()
    }

    /// The stdout FIFO (with a terminal: the tty output).
    pub fn stdout(&self) -> &Path {
        &self.stdout
    }

    /// The stderr FIFO (with a terminal: unused by the shim).
    pub fn stderr(&self) -> &Path {
        &self.stderr
    }

    /// The paths as containerd's task API takes them.
    pub fn task_stdio(&self) -> TaskStdio {
        // Lossless: `paths` checked that the directory is UTF-8, and the ID is a `&str`.
        let s = |p: Option<&Path>| {
            p.map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        TaskStdio {
            stdin: s(self.stdin()),
            stdout: s(Some(self.stdout())),
            stderr: s(Some(self.stderr())),
            terminal: self.tty,
        }
    }

    /// Opens remora's end of stdout for reading. See [`open_read_end`].
    pub fn open_stdout(&self) -> Result<pipe::Receiver, FifoError> {
        open_read_end(&self.stdout)
    }

    /// Opens remora's end of stderr for reading. See [`open_read_end`].
    pub fn open_stderr(&self) -> Result<pipe::Receiver, FifoError> {
        open_read_end(&self.stderr)
    }

    /// Opens remora's end of stdin for writing, if there is a stdin FIFO. See
    /// [`open_write_end`].
    pub fn open_stdin(&self) -> Result<Option<pipe::Sender>, FifoError> {
        self.stdin.as_deref().map(open_write_end).transpose()
    }

    /// Removes the FIFOs. Idempotent: FIFOs already gone are not an error. Open ends stay usable
    /// (removal only unlinks the names).
    pub fn remove(&self) -> Result<(), FifoError> {
        let mut first_err = None;
        for path in self.all() {
            // Keep going so one failure does not leave the other FIFOs behind.
            if let Err(e) = remove_file_if_exists(path) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    fn all(&self) -> impl Iterator<Item = &Path> {
        [self.stdin(), Some(self.stdout()), Some(self.stderr())]
            .into_iter()
            .flatten()
    }
}

/// Opens the read end of a FIFO without waiting for a writer (see the module docs for why this
/// neither blocks nor reports a premature EOF). EOF is reported once every writer that opened
/// the FIFO has closed it.
///
/// # Panics
///
/// Outside a tokio runtime with IO enabled (registration with the reactor).
pub fn open_read_end(path: &Path) -> Result<pipe::Receiver, FifoError> {
    pipe::OpenOptions::new()
        .open_receiver(path)
        .map_err(|source| FifoError::Open {
            path: path.to_path_buf(),
            source,
        })
}

/// Opens the write end of a FIFO without waiting for a reader (`O_RDWR`, see the module docs).
/// Data written before the reader attaches waits in the pipe buffer (64 KiB on Linux); beyond
/// that, writes wait.
///
/// # Panics
///
/// Outside a tokio runtime with IO enabled (registration with the reactor).
pub fn open_write_end(path: &Path) -> Result<pipe::Sender, FifoError> {
    pipe::OpenOptions::new()
        .read_write(true)
        .open_sender(path)
        .map_err(|source| FifoError::Open {
            path: path.to_path_buf(),
            source,
        })
}

/// The bytes in a FIFO that no reader has taken yet (`FIONREAD` on one of its ends).
pub fn unread(end: &impl AsRawFd) -> io::Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: the fd is open for as long as `end` is borrowed, and FIONREAD writes one `c_int`
    // to the pointer, which points to a live local.
    Errno::result(unsafe { libc::ioctl(end.as_raw_fd(), libc::FIONREAD, &mut n) })?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// Waits until a reader has taken every byte written through `end`, for at most `limit`, so
/// that dropping `end` (remora's only end) cannot discard them (see the module docs). Returns
/// whether the FIFO was drained; a FIFO that cannot be queried counts as drained.
pub async fn wait_drained(end: &pipe::Sender, limit: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    let mut pause = Duration::from_millis(1);
    loop {
        match unread(end) {
            Ok(0) | Err(_) => return true,
            Ok(_) => {}
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return false;
        }
        // No readiness event says "a reader emptied the pipe": poll, backing off to 20 ms.
        tokio::time::sleep(pause.min(deadline - now)).await;
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

fn validate_id(id: &str) -> Result<(), FifoError> {
    let reason = if id.is_empty() {
        "empty"
    } else if id.contains('/') {
        "contains '/'"
    } else if id.contains('\0') {
        "contains NUL"
    } else if id == "." || id == ".." {
        "is a relative directory name"
    } else {
        return Ok(());
    };
    Err(FifoError::InvalidId {
        id: id.to_string(),
        reason,
    })
}

/// Creates one FIFO; `Ok(false)` if a FIFO was already there.
fn make_fifo(path: &Path) -> Result<bool, FifoError> {
    // The umask can only clear bits of 0600, never widen it.
    match mkfifo(path, Mode::S_IRUSR | Mode::S_IWUSR) {
        Ok(()) => Ok(true),
        Err(Errno::EEXIST) => match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_fifo() => Ok(false),
            _ => Err(FifoError::NotAFifo {
                path: path.to_path_buf(),
            }),
        },
        Err(errno) => Err(FifoError::Mkfifo {
            path: path.to_path_buf(),
            errno,
        }),
    }
}

fn remove_file_if_exists(path: &Path) -> Result<(), FifoError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(FifoError::Remove {
            path: path.to_path_buf(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::cri_log::{copy_stream, LogWriter, StreamKind};
    use std::io::{Read, Write};
    use std::os::unix::fs::PermissionsExt;
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const CRI_LINE: &str = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{9}Z (stdout|stderr) [PF] .*$";

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    fn is_fifo(p: &Path) -> bool {
        std::fs::symlink_metadata(p)
            .map(|m| m.file_type().is_fifo())
            .unwrap_or(false)
    }

    #[tokio::test]
    async fn wait_drained_waits_for_a_reader_and_gives_up_at_its_limit() {
        let tmp = tempfile::tempdir().unwrap();
        let set = FifoSet::create(
            tmp.path(),
            "d1",
            FifoSpec {
                stdin: true,
                tty: false,
            },
        )
        .unwrap();
        let mut w = set.open_stdin().unwrap().unwrap();
        assert!(wait_drained(&w, Duration::ZERO).await, "nothing written");
        w.write_all(b"abc").await.unwrap();
        assert_eq!(unread(&w).unwrap(), 3);
        assert!(
            !wait_drained(&w, Duration::from_millis(30)).await,
            "no reader took the bytes"
        );
        let mut r = open_read_end(set.stdin().unwrap()).unwrap();
        let mut got = [0u8; 3];
        r.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"abc");
        assert!(wait_drained(&w, Duration::from_secs(10)).await);
    }

    #[test]
    fn create_makes_requested_fifos_0600() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("io");
        let set = FifoSet::create(
            &dir,
            "c1",
            FifoSpec {
                stdin: true,
                tty: false,
            },
        )
        .unwrap();
        assert_eq!(set.stdin(), Some(dir.join("c1-stdin").as_path()));
        assert_eq!(set.stdout(), dir.join("c1-stdout"));
        assert_eq!(set.stderr(), dir.join("c1-stderr"));
        for p in [
            dir.join("c1-stdin"),
            dir.join("c1-stdout"),
            dir.join("c1-stderr"),
        ] {
            assert!(is_fifo(&p), "{p:?} is a FIFO");
            assert_eq!(mode(&p), 0o600, "{p:?}");
        }
        assert_eq!(mode(&dir), 0o700);
        let stdio = set.task_stdio();
        assert_eq!(stdio.stdin, dir.join("c1-stdin").to_str().unwrap());
        assert_eq!(stdio.stdout, dir.join("c1-stdout").to_str().unwrap());
        assert_eq!(stdio.stderr, dir.join("c1-stderr").to_str().unwrap());
        assert!(!stdio.terminal);
    }

    #[test]
    fn no_stdin_unless_asked() {
        let tmp = tempfile::tempdir().unwrap();
        let set = FifoSet::create(tmp.path(), "c2", FifoSpec::default()).unwrap();
        assert_eq!(set.stdin(), None);
        assert!(!tmp.path().join("c2-stdin").exists());
        assert!(is_fifo(&tmp.path().join("c2-stderr")));
        assert_eq!(set.task_stdio().stdin, "");

        // A terminal changes only the flag: the paths are containerd's.
        let tty = FifoSet::create(
            tmp.path(),
            "c3",
            FifoSpec {
                stdin: false,
                tty: true,
            },
        )
        .unwrap();
        assert!(is_fifo(tty.stderr()));
        let stdio = tty.task_stdio();
        assert_eq!(stdio.stderr, tmp.path().join("c3-stderr").to_str().unwrap());
        assert!(stdio.terminal);
    }

    #[test]
    fn bad_ids_are_rejected() {
        let tmp = tempfile::tempdir().unwrap();
        for id in ["", "a/b", "..", "."] {
            let err = FifoSet::create(tmp.path(), id, FifoSpec::default()).unwrap_err();
            assert!(matches!(err, FifoError::InvalidId { .. }), "{id:?}: {err}");
        }
    }

    #[test]
    fn create_reuses_fifos_but_not_other_files_and_rolls_back() {
        let tmp = tempfile::tempdir().unwrap();
        FifoSet::create(tmp.path(), "c", FifoSpec::default()).unwrap();
        FifoSet::create(tmp.path(), "c", FifoSpec::default()).unwrap();

        // A regular file where stderr goes: the error names it, and the stdout FIFO this call
        // created is removed again.
        std::fs::write(tmp.path().join("d-stderr"), b"x").unwrap();
        let err = FifoSet::create(tmp.path(), "d", FifoSpec::default()).unwrap_err();
        assert!(matches!(err, FifoError::NotAFifo { .. }), "{err}");
        assert!(!tmp.path().join("d-stdout").exists());
    }

    #[test]
    fn remove_is_idempotent() {
        let tmp = tempfile::tempdir().unwrap();
        let spec = FifoSpec {
            stdin: true,
            tty: false,
        };
        let set = FifoSet::create(tmp.path(), "c", spec).unwrap();
        set.remove().unwrap();
        for p in ["c-stdin", "c-stdout", "c-stderr"] {
            assert!(!tmp.path().join(p).exists(), "{p}");
        }
        set.remove().unwrap();
        // Never created at all: still fine.
        FifoSet::paths(tmp.path(), "never", spec)
            .unwrap()
            .remove()
            .unwrap();
    }

    #[tokio::test]
    async fn read_end_waits_for_a_writer_then_sees_data_and_eof() {
        let tmp = tempfile::tempdir().unwrap();
        let set = FifoSet::create(tmp.path(), "c", FifoSpec::default()).unwrap();
        // Opening returns at once although no writer exists (no deadlock) ...
        let mut rx = set.open_stdout().unwrap();
        let mut buf = [0u8; 16];
        // ... and reading does not report EOF before a writer came.
        let early = tokio::time::timeout(Duration::from_millis(200), rx.read(&mut buf)).await;
        assert!(early.is_err(), "read returned {early:?} before any writer");

        let path = set.stdout().to_path_buf();
        let writer = std::thread::spawn(move || {
            // A plain blocking open, like the shim's: it returns because our read end is open.
            let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
            f.write_all(b"hello").unwrap();
        });
        let mut got = Vec::new();
        rx.read_to_end(&mut got).await.unwrap();
        writer.join().unwrap();
        assert_eq!(got, b"hello");
    }

    #[tokio::test]
    async fn write_end_opens_before_the_reader() {
        let tmp = tempfile::tempdir().unwrap();
        let set = FifoSet::create(
            tmp.path(),
            "c",
            FifoSpec {
                stdin: true,
                tty: false,
            },
        )
        .unwrap();
        let mut tx = set.open_stdin().unwrap().unwrap();
        // Written before any reader: waits in the pipe buffer.
        tx.write_all(b"input\n").await.unwrap();
        let path = set.stdin().unwrap().to_path_buf();
        let (opened_tx, opened) = tokio::sync::oneshot::channel();
        let reader = std::thread::spawn(move || {
            // Plays the shim; the open returns at once since our end holds the FIFO open.
            let mut f = std::fs::File::open(path).unwrap();
            opened_tx.send(()).unwrap();
            let mut got = Vec::new();
            f.read_to_end(&mut got).unwrap();
            got
        });
        // Close our end only once the reader is there, or the buffered data would be dropped.
        opened.await.unwrap();
        drop(tx);
        assert_eq!(reader.join().unwrap(), b"input\n");
    }

    #[tokio::test]
    async fn fifos_to_cri_log_end_to_end() {
        let tmp = tempfile::tempdir().unwrap();
        let set = FifoSet::create(&tmp.path().join("fifo"), "c", FifoSpec::default()).unwrap();
        let log_path = tmp.path().join("logs/c/0.log");
        let writer = Arc::new(
            LogWriter::open_in(tmp.path().join("logs"), "c/0.log", None)
                .await
                .unwrap(),
        );
        let out = copy_stream(
            set.open_stdout().unwrap(),
            StreamKind::Stdout,
            writer.clone(),
        );
        let err = copy_stream(
            set.open_stderr().unwrap(),
            StreamKind::Stderr,
            writer.clone(),
        );

        // Plays the shim: opens the write ends, writes, exits (closing them).
        let (o, e) = (set.stdout().to_path_buf(), set.stderr().to_path_buf());
        let shim = std::thread::spawn(move || {
            let mut o = std::fs::OpenOptions::new().write(true).open(o).unwrap();
            let mut e = std::fs::OpenOptions::new().write(true).open(e).unwrap();
            o.write_all(b"out one\nout ").unwrap();
            e.write_all(b"err one\n").unwrap();
            o.write_all(b"two\nno newline").unwrap();
        });
        shim.join().unwrap();

        // EOF ends both copiers.
        let (out, err) = tokio::time::timeout(Duration::from_secs(5), async {
            (out.await.unwrap(), err.await.unwrap())
        })
        .await
        .expect("copiers end at EOF");
        assert_eq!((out.records, err.records), (3, 1));
        assert_eq!(out.write_errors, 0);

        let text = std::fs::read_to_string(&log_path).unwrap();
        let re = regex::Regex::new(CRI_LINE).unwrap();
        let mut stdout = Vec::new();
        for line in text.lines() {
            assert!(re.is_match(line), "{line:?}");
            let mut f = line.splitn(4, ' ').skip(1);
            let (stream, tag, content) = (f.next().unwrap(), f.next().unwrap(), f.next().unwrap());
            match stream {
                "stdout" => stdout.push(format!("{tag} {content}")),
                _ => assert_eq!(format!("{tag} {content}"), "F err one"),
            }
        }
        assert_eq!(stdout, ["F out one", "F out two", "P no newline"]);
        set.remove().unwrap();
    }
}
