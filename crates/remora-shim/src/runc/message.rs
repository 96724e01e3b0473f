//! The runtime's error message: read from its JSON log (the lines this call appended) or its
//! logrus stderr, and what it says (the container does not exist, or is not running).

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use serde::Deserialize;

/// The log's text from byte `start` on (from the beginning if it shrank: rotated or truncated);
/// `None` if it cannot be read (the caller falls back to stderr).
pub(super) fn read_log_from(path: &Path, start: u64) -> Option<String> {
    // A plain blocking read: the part one call appended is a few hundred bytes on local disk.
    let mut file = std::fs::File::open(path).ok()?;
    let len = file.metadata().ok()?.len();
    let start = if len < start { 0 } else { start };
    file.seek(SeekFrom::Start(start)).ok()?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// The `msg` of the last `"level":"error"` line of a runtime's JSON log.
pub(super) fn last_log_error(log: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct Line {
        level: String,
        msg: String,
    }
    // From the end: the first error line found is the last one written.
    log.lines()
        .rev()
        .filter_map(|line| serde_json::from_str::<Line>(line).ok())
        .filter(|line| line.level == "error")
        .map(|line| line.msg.trim().to_owned())
        .find(|msg| !msg.is_empty())
}

/// The error message of a runtime's stderr: the `msg` of its last logrus `level=error` line
/// (runc without `--log`), else the whole text trimmed; `None` if empty.
pub(super) fn stderr_message(stderr: &str) -> Option<String> {
    let logged = stderr
        .lines()
        .rev()
        .filter(|line| line.contains("level=error"))
        .find_map(logrus_msg);
    let message = logged.unwrap_or_else(|| stderr.trim().to_owned());
    (!message.is_empty()).then_some(message)
}

/// The value of `msg=` in a logrus text line: quoted (with `\"` and `\\` escapes) or bare.
fn logrus_msg(line: &str) -> Option<String> {
    let start = if line.starts_with("msg=") {
        0
    } else {
        line.find(" msg=")? + 1
    };
    let rest = &line[start + "msg=".len()..];
    let Some(quoted) = rest.strip_prefix('"') else {
        return Some(rest.split(' ').next().unwrap_or_default().to_owned());
    };
    let mut msg = String::new();
    let mut chars = quoted.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(msg),
            '\\' => match chars.next() {
                Some('n') => msg.push('\n'),
                Some('t') => msg.push('\t'),
                Some(other) => msg.push(other),
                None => break,
            },
            c => msg.push(c),
        }
    }
    // No closing quote: take what there is.
    Some(msg)
}

/// Whether a runtime's message says the container does not exist (runc: "container does not
/// exist", also inside "exec failed: ..."; crun: "container `x` does not exist" or "container not
/// found").
pub(super) fn is_not_found(message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    message.contains("container not found")
        || (message.contains("container") && message.contains("does not exist"))
}

/// Whether a runtime's message says the container's process is no longer running (runc and
/// crun: "container not running", "process already finished").
pub(super) fn is_not_running(message: &str) -> bool {
    message.contains("not running") || message.contains("process already finished")
}
