//! Structured logging with slog: text or JSON lines on stderr, filtered by level.

use slog::{o, Drain, Level, Logger};

use crate::config::{LogConfig, LogFormat, LogLevel};

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
            let decorator = slog_term::PlainSyncDecorator::new(std::io::stderr());
            let drain = slog_term::FullFormat::new(decorator)
                .use_utc_timestamp()
                .build()
                .fuse();
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
