//! remora's own layer applier: a layer (plain tar, gzip or zstd) applied onto a directory the
//! way containerd's Diff service applies it (`pkg/archive` `Apply`, `core/diff/apply`), so
//! that either may unpack an image and the snapshots come out the same.
//!
//! Design: [`apply_layer`] takes any [`Read`], so a caller may feed it a blob from the
//! content store (`differ`, the `Differ` port over it) or, later, a download as it arrives.
//! It decompresses by the stream's magic bytes (`stream`), hashes the uncompressed bytes for
//! the diff ID while reading them, parses the tar by Go's rules (`tar`), and applies each
//! entry in containerd's order of steps (`entry`). Every filesystem call is made relative to
//! a directory descriptor reached from the root one component at a time (`fs`), so names
//! with `..`, absolute names, symlinked parents and hard links resolve inside the root as
//! containerd resolves them, and nothing can be written outside it.
//!
//! Whiteouts come in two modes ([`Whiteouts`]), as in containerd: onto an overlay
//! snapshot's upper directory they become overlayfs' own markers; onto a plain directory
//! they remove what they name.

mod differ;
mod entry;
// The errors live in a leaf module (the Differ port names them); `super::error::…` here.
use super::apply_error as error;
mod fs;
mod path;
mod stream;
mod tar;
#[cfg(test)]
mod tests;

use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};

pub use differ::{in_user_namespace, ApplyTarget, LocalDiffer};
pub use error::{ApplyError, LocalApplyError};
pub use stream::Compression;

/// How whiteouts are applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Whiteouts {
    /// Onto a plain directory (a bind mount: a first layer): `.wh.NAME` removes `NAME`;
    /// `.wh..wh..opq` removes from its directory everything this layer has not applied.
    Plain,
    /// Onto an overlay snapshot's upper directory: `.wh.NAME` becomes a 0/0 character device
    /// `NAME`; `.wh..wh..opq` marks its directory opaque. A parent directory made because
    /// the layer does not list it takes the attributes of the same directory in the highest
    /// of `lowers` that has it.
    Overlay {
        /// The overlay's lower directories, highest first (its `lowerdir=` option).
        lowers: Vec<PathBuf>,
        /// Which opaque xattr overlayfs reads.
        opaque: OpaqueXattr,
    },
}

/// The xattr that marks a directory opaque.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpaqueXattr {
    /// `trusted.overlay.opaque=y`, what containerd writes.
    Trusted,
    /// `user.overlay.opaque=y`, for an overlay mounted with `userxattr`.
    User,
}

/// Options of one apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyOptions {
    /// Whiteout mode.
    pub whiteouts: Whiteouts,
    /// Skip character and block devices (containerd does inside a user namespace, where
    /// mknod of a device fails).
    pub skip_devices: bool,
}

/// What an apply did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Tar entries read (meta headers not counted).
    pub entries: u64,
    /// Regular files written.
    pub files: u64,
    /// Whiteouts and opaque markers.
    pub whiteouts: u64,
    /// Entries whose name is the root itself (`./`), skipped as containerd does.
    pub skipped_root: u64,
    /// Devices skipped ([`ApplyOptions::skip_devices`]).
    pub skipped_devices: u64,
    /// Xattrs not set: `trusted.*` from the layer, or what the filesystem refused as
    /// containerd tolerates it.
    pub ignored_xattrs: u64,
}

/// The result of an apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// `sha256:<hex>` of the uncompressed stream: the layer's diff ID.
    pub diff_id: String,
    /// Uncompressed size.
    pub uncompressed_bytes: u64,
    /// How it was compressed.
    pub compression: Compression,
    /// What was done.
    pub counts: Counts,
}

/// Buffer between the decompressor and the tar reader.
const BUFFER: usize = 256 * 1024;

/// Applies the layer `layer` onto `root`. Blocking: run it off the async runtime. On an
/// error the directory is left part-applied (the caller removes the snapshot).
pub fn apply_layer(
    layer: impl Read + Send,
    root: &Path,
    options: &ApplyOptions,
) -> Result<Applied, ApplyError> {
    let root_fd = fs::open_root(root)?;
    let (compression, decoded) = stream::decompress(layer)?;
    let mut input = BufReader::with_capacity(BUFFER, stream::Hashing::new(decoded));
    let mut applier = entry::Applier::new(root_fd, options)?;
    {
        let mut archive = tar::TarReader::new(&mut input);
        while let Some(hdr) = archive.next()? {
            applier.entry(&hdr, &mut archive)?;
        }
    }
    applier.finish()?;
    io::copy(&mut input, &mut io::sink()).map_err(ApplyError::Read)?;
    let (diff_id, uncompressed_bytes) = input.into_inner().digest();
    Ok(Applied {
        diff_id,
        uncompressed_bytes,
        compression,
        counts: applier.counts,
    })
}
