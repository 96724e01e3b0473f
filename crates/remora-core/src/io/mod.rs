//! Container IO: the stdio FIFOs handed to containerd's shim ([`fifo`]) and the copiers that turn
//! a container's stdout/stderr into a CRI log file ([`cri_log`]).
//!
//! The flow for one container, as in containerd's CRI plugin:
//!
//! ```text
//!  container ─► runc shim ─► <dir>/<id>-stdout (FIFO) ─► copy_stream(Stdout) ─┐
//!                        └─► <dir>/<id>-stderr (FIFO) ─► copy_stream(Stderr) ─┤
//!                                                                             ▼
//!                                     LogWriter: one CRI log file + per-stream broadcast
//!                                     (ReopenContainerLog reopens the file at its path)
//! ```
//!
//! remora creates the FIFOs and opens its ends *before* `Tasks.Create`, passing the paths; the
//! shim opens the other ends. Nothing here talks to containerd.

pub mod cri_log;
pub mod fifo;
pub mod session;

pub use cri_log::{
    copy_stream, split_log_path, CopySummary, LogError, LogWriter, StreamKind,
    DEFAULT_MAX_LINE_SIZE,
};
pub use fifo::{FifoError, FifoSet, FifoSpec};
pub use session::{ClientRead, ClientWrite, SessionIo, TermSize};
