//! Why remora's layer applier failed: the applier's own error and the one its `Differ` gives
//! (backend's `DiffError::Local`). A leaf module, so that the port names the failure without
//! depending on the applier that implements it.

use std::io;

use thiserror::Error;

use crate::backend_error::BackendError;

/// A failed layer apply. Paths are relative to the root applied onto.
#[derive(Debug, Error)]
pub enum ApplyError {
    /// The root directory could not be opened.
    #[error("cannot open the root {root}: {source}")]
    Root {
        /// The root.
        root: String,
        /// Why.
        source: nix::Error,
    },
    /// Reading or decompressing the layer failed (a truncated or corrupt stream).
    #[error("reading the layer: {0}")]
    Read(#[source] io::Error),
    /// A tar header is malformed.
    #[error("malformed tar header near byte {offset}: {reason}")]
    Header {
        /// Uncompressed bytes read when it was found.
        offset: u64,
        /// What is wrong.
        reason: &'static str,
    },
    /// A PAX header or GNU long name is larger than remora reads into memory.
    #[error("{what} of {size} bytes exceeds the 1 MiB limit")]
    SpecialTooLarge {
        /// Which kind.
        what: &'static str,
        /// Its declared size.
        size: i64,
    },
    /// A sparse file (GNU type `S` or `GNU.sparse.*` PAX records).
    #[error("{name}: sparse tar entries are not supported")]
    Sparse {
        /// The entry.
        name: String,
    },
    /// A tar entry type that containerd refuses too (`7`, `V`, ...).
    #[error("{name}: unhandled tar entry type {flag:?}")]
    UnknownType {
        /// The entry.
        name: String,
        /// Its type flag.
        flag: char,
    },
    /// A uid or gid outside what a file can have (negative, or the kernel's "no change").
    #[error("{name}: owner id {id} out of range")]
    OwnerOutOfRange {
        /// The entry.
        name: String,
        /// The id.
        id: i64,
    },
    /// A whiteout whose name would remove its own directory or a parent (`.wh.`, `.wh..`).
    #[error("{name}: invalid whiteout name")]
    InvalidWhiteout {
        /// The entry.
        name: String,
    },
    /// A path component that must be a directory is something else.
    #[error("{path}: not a directory")]
    NotADirectory {
        /// The path.
        path: String,
    },
    /// More than 255 symlinks followed resolving one name (a loop).
    #[error("{path}: too many levels of symbolic links")]
    TooManyLinks {
        /// The name being resolved.
        path: String,
    },
    /// A hard link's target is missing (not applied yet, or removed).
    #[error("{name}: hard link target {target} does not exist")]
    LinkTargetMissing {
        /// The entry.
        name: String,
        /// Its target.
        target: String,
    },
    /// A hard link's target names a directory or the root (`..`, `.`, `a/`).
    #[error("{name}: hard link target {target} is a directory")]
    LinkTargetDirectory {
        /// The entry.
        name: String,
        /// Its target.
        target: String,
    },
    /// A directory's times could not be set at the end because it is gone (a later entry
    /// removed it; containerd fails there too).
    #[error("{path}: directory removed before its times were set")]
    DirectoryGone {
        /// The directory.
        path: String,
    },
    /// A filesystem call failed.
    #[error("{op} {path}: {source}")]
    Fs {
        /// The call (`mkdirat`, `linkat`, ...).
        op: &'static str,
        /// The path it was made on.
        path: String,
        /// The error.
        source: io::Error,
    },
}

impl ApplyError {
    /// A failed call `op` on `path` (components under the root).
    pub(super) fn fs(op: &'static str, path: &[u8], source: impl Into<io::Error>) -> Self {
        ApplyError::Fs {
            op,
            path: String::from_utf8_lossy(path).into_owned(),
            source: source.into(),
        }
    }
}

/// Why remora's applier failed a layer.
#[derive(Debug, Error)]
pub enum LocalApplyError {
    /// The mounts are not one bind or one overlay mount.
    #[error("remora's layer applier takes one bind or overlay mount, got {got}")]
    Mounts {
        /// The mount types given.
        got: String,
    },
    /// An overlay mount with no `upperdir=` (a read-only view).
    #[error("overlay mount without an upperdir= option")]
    NoUpperdir,
    /// Reading the blob from containerd's content store failed.
    #[error("reading layer {layer} from containerd's content store: {source}")]
    Content {
        /// The layer digest.
        layer: String,
        /// The error.
        source: BackendError,
    },
    /// The blob's stream stopped before its end without an error (the read was dropped).
    #[error("the content stream of layer {layer} ended early")]
    StreamClosed {
        /// The layer digest.
        layer: String,
    },
    /// Applying failed.
    #[error("applying layer {layer}: {source}")]
    Apply {
        /// The layer digest.
        layer: String,
        /// The error.
        source: ApplyError,
    },
    /// The blocking apply task panicked or was cancelled.
    #[error("the apply task of layer {layer} did not finish: {reason}")]
    Task {
        /// The layer digest.
        layer: String,
        /// The join error.
        reason: String,
    },
}
