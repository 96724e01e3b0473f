//! Resolving a path inside a root as if that root were `/`: symlinks followed without
//! leaving it, `..` never climbing out. Used by the user database reader and the rootfs views
//! ([`super::rootfs`]) alike.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};

/// `root.join(path)` with every symlink on the way resolved as if `root` were `/`, so an
/// image's `/etc/passwd -> /host/file` cannot make remora read a host file. Components that
/// do not exist are kept lexically (the caller then sees `NotFound`).
pub fn resolve_in_root(root: &Path, path: &Path) -> io::Result<PathBuf> {
    let resolved = walk_in_root(path, |rel| {
        let full = root.join(rel);
        Ok(match fs::symlink_metadata(&full) {
            Ok(m) if m.file_type().is_symlink() => Entry::Symlink(full),
            _ => Entry::Other,
        })
    })?;
    // Never `None`: this lookup reports nothing missing.
    Ok(root.join(resolved.unwrap_or_default()))
}

/// What a root's lookup finds at a root-relative path during [`walk_in_root`].
pub(crate) enum Entry {
    /// A symlink, at this host path.
    Symlink(PathBuf),
    /// Anything else (or nothing the walk needs to know about: it goes on lexically).
    Other,
    /// Nothing: the walk ends with `None`.
    Missing,
}

/// Resolves `path` component by component inside a root that `entry` looks into, following
/// symlinks as if that root were `/` (absolute targets restart at it, `..` never climbs out),
/// at most Linux's MAXSYMLINKS of them. Returns the root-relative path, free of symlinks and
/// `..`, or `None` once `entry` says a component is missing. The one walk for a plain
/// directory ([`resolve_in_root`]) and an overlay's layers ([`super::rootfs`]).
pub(crate) fn walk_in_root(
    path: &Path,
    mut entry: impl FnMut(&Path) -> io::Result<Entry>,
) -> io::Result<Option<PathBuf>> {
    const MAX_LINKS: usize = 40; // Linux's MAXSYMLINKS
    let mut pending: VecDeque<OsString> = components(path);
    let mut resolved = PathBuf::new();
    let mut links = 0;
    while let Some(c) = pending.pop_front() {
        if c == ".." {
            resolved.pop();
            continue;
        }
        let candidate = resolved.join(&c);
        match entry(&candidate)? {
            Entry::Symlink(host) => {
                links += 1;
                if links > MAX_LINKS {
                    return Err(io::Error::other(format!(
                        "too many levels of symbolic links at {}",
                        host.display()
                    )));
                }
                let target = fs::read_link(&host)?;
                if target.is_absolute() {
                    resolved = PathBuf::new();
                }
                let mut next = components(&target);
                next.extend(pending);
                pending = next;
            }
            Entry::Other => resolved = candidate,
            Entry::Missing => return Ok(None),
        }
    }
    Ok(Some(resolved))
}

pub(crate) fn components(path: &Path) -> VecDeque<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_owned()),
            Component::ParentDir => Some(OsString::from("..")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect()
}
