//! Structured logging with slog: text or JSON lines on stderr, filtered by level.
//!
//! Under systemd, stderr is a stream to journald (`JOURNAL_STREAM` names it), which files
//! every line as `info` unless the line starts with a syslog priority `<N>` (sd-daemon(3)):
//! text lines then carry their level's priority, so `journalctl -u remora -p warning` shows
//! remora's warnings and errors.

use slog::{o, Drain, Level, Logger};

use crate::config::{LogConfig, LogFormat, LogLevel};

/// The syslog priority journald gives a record of `level` (`<N>` at the start of a line).
fn journal_priority(level: Level) -> u8 {
    match level {
        Level::Critical => 2,
        Level::Error => 3,
        Level::Warning => 4,
        Level::Info => 6,
        Level::Debug | Level::Trace => 7,
    }
}

/// Whether stderr is the journald stream systemd named in `JOURNAL_STREAM` (`<dev>:<inode>`):
/// the variable alone is inherited by children whose stderr went elsewhere.
fn stderr_is_journal() -> bool {
    use std::os::unix::fs::MetadataExt;
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    match std::fs::metadata("/proc/self/fd/2") {
        Ok(m) => names_stream(&stream.to_string_lossy(), m.dev(), m.ino()),
        Err(_) => false,
    }
}

/// Whether `JOURNAL_STREAM`'s value names the file with `dev` and `ino`.
fn names_stream(value: &str, dev: u64, ino: u64) -> bool {
    let Some((d, i)) = value.split_once(':') else {
        return false;
    };
    d.parse::<u64>() == Ok(dev) && i.parse::<u64>() == Ok(ino)
}

/// The text drain: slog-term's full format, each record led by its journald priority when
/// `journal` is set.
fn text_drain<W: std::io::Write + 'static>(
    out: W,
    journal: bool,
) -> slog::Fuse<slog_term::FullFormat<slog_term::PlainSyncDecorator<W>>> {
    let decorator = slog_term::PlainSyncDecorator::new(out);
    let format = slog_term::FullFormat::new(decorator).use_utc_timestamp();
    let format = if journal {
        format.use_custom_header_print(|timestamp, rd, record, file_location| {
            write!(rd, "<{}>", journal_priority(record.level()))?;
            slog_term::print_msg_header(timestamp, rd, record, file_location)
        })
    } else {
        format
    };
    format.build().fuse()
}

fn slog_level(l: LogLevel) -> Level {
    match l {
        LogLevel::Trace => Level::Trace,
        LogLevel::Debug => Level::Debug,
        LogLevel::Info => Level::Info,
        LogLevel::Warning => Level::Warning,
        LogLevel::Error => Level::Error,
        LogLevel::Critical => Level::Critical,
    }
}

/// Builds the root logger. Records go through an async drain so a slow stderr never blocks a
/// request; the returned guard flushes it when dropped at exit.
pub fn init(config: &LogConfig) -> (Logger, slog_async::AsyncGuard) {
    let level = slog_level(config.level);
    let (drain, guard) = match config.format {
        LogFormat::Text => {
            let drain = text_drain(std::io::stderr(), stderr_is_journal());
            slog_async::Async::new(drain.filter_level(level).fuse())
                .chan_size(4096)
                .build_with_guard()
        }
        LogFormat::Json => {
            let drain = slog_json::Json::new(std::io::stderr())
                .add_default_keys()
                .build()
                .fuse();
            slog_async::Async::new(drain.filter_level(level).fuse())
                .chan_size(4096)
                .build_with_guard()
        }
    };
    (Logger::root(drain.fuse(), o!()), guard)
}

#[cfg(test)]
mod tests {
    use super::*;
    use slog::{error, info, warn};
    use std::sync::{Arc, Mutex};

    /// A writer the test reads back.
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .map_err(|_| std::io::ErrorKind::Other)?
                .extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn lines(journal: bool) -> Vec<String> {
        let buf = Buf::default();
        let log = Logger::root(text_drain(buf.clone(), journal), o!());
        warn!(log, "a warning"; "id" => "c1");
        info!(log, "some news");
        error!(log, "a failure");
        let bytes = buf.0.lock().unwrap().clone();
        String::from_utf8(bytes)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn lines_to_journald_lead_with_their_priority() {
        let got = lines(true);
        assert_eq!(got.len(), 3, "{got:?}");
        assert!(
            got[0].starts_with("<4>") && got[0].contains("WARN a warning"),
            "{got:?}"
        );
        assert!(
            got[1].starts_with("<6>") && got[1].contains("INFO some news"),
            "{got:?}"
        );
        assert!(
            got[2].starts_with("<3>") && got[2].contains("ERRO a failure"),
            "{got:?}"
        );
    }

    #[test]
    fn lines_elsewhere_have_no_priority() {
        let got = lines(false);
        assert_eq!(got.len(), 3, "{got:?}");
        assert!(got.iter().all(|l| !l.starts_with('<')), "{got:?}");
    }

    #[test]
    fn journal_stream_must_name_stderr_itself() {
        assert!(names_stream("8:12345", 8, 12345));
        assert!(!names_stream("8:12345", 8, 12346));
        assert!(!names_stream("9:12345", 8, 12345));
        assert!(!names_stream("812345", 8, 12345));
        assert!(!names_stream("", 0, 0));
    }

    #[test]
    fn priorities_follow_syslog() {
        assert_eq!(journal_priority(Level::Critical), 2);
        assert_eq!(journal_priority(Level::Error), 3);
        assert_eq!(journal_priority(Level::Warning), 4);
        assert_eq!(journal_priority(Level::Info), 6);
        assert_eq!(journal_priority(Level::Debug), 7);
        assert_eq!(journal_priority(Level::Trace), 7);
    }
}
