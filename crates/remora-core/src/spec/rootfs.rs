//! A container's root filesystem as the user lookup reads it (its `/etc/passwd` and
//! `/etc/group`), before the container runs: a directory on the host, or the layers of an
//! overlay read the way overlayfs merges them — so that CreateContainer need not mount the
//! snapshot just to read two small files.
//!
//! The merge rules are overlayfs's (kernel `Documentation/filesystems/overlayfs.rst`), as
//! containerd's overlayfs snapshotter lays layers out: layers are searched top first; a
//! character device 0/0 is a whiteout and hides the name in every lower layer; a directory
//! with the `trusted.overlay.opaque` (or, in `userxattr` mode, `user.overlay.opaque`) xattr
//! set to `y` hides the lower layers' contents; a directory merges only with directories
//! below it, down to the first lower entry of that name that is not one. Symbolic links are
//! resolved in the merged view, with the root as `/` (`in_root::resolve_in_root`'s rule),
//! so an image cannot make remora read a host file.

use std::fs::{self, FileType};
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Where a container's root filesystem can be read.
#[derive(Debug, Clone, Copy)]
pub enum RootFs<'a> {
    /// A directory (a mounted rootfs, or a snapshot that is one directory).
    Dir(&'a Path),
    /// An overlay's layer directories, top first (its upperdir, then its lowerdirs in order).
    Layers(&'a [PathBuf]),
}

impl RootFs<'_> {
    /// The host path of the file the container would see at `path` (relative to its root),
    /// symlinks resolved inside the rootfs; `None` if nothing is there.
    pub fn resolve(&self, path: &Path) -> io::Result<Option<PathBuf>> {
        match self {
            RootFs::Dir(root) => {
                let p = super::in_root::resolve_in_root(root, path)?;
                Ok(p.symlink_metadata().is_ok().then_some(p))
            }
            RootFs::Layers(layers) => resolve_layered(layers, path),
        }
    }

    /// How to name `path` in an error message.
    pub fn display_path(&self, path: &Path) -> PathBuf {
        match self {
            RootFs::Dir(root) => root.join(path),
            RootFs::Layers(layers) => match layers.first() {
                Some(top) => top.join(path),
                None => path.to_path_buf(),
            },
        }
    }
}

/// [`RootFs::resolve`] over layers.
fn resolve_layered(layers: &[PathBuf], path: &Path) -> io::Result<Option<PathBuf>> {
    use super::in_root::Entry;
    let Some(resolved) = super::in_root::walk_in_root(path, |rel| {
        Ok(match lookup(layers, rel)? {
            Some((host, kind)) if kind.is_symlink() => Entry::Symlink(host),
            Some(_) => Entry::Other,
            None => Entry::Missing,
        })
    })?
    else {
        return Ok(None);
    };
    Ok(lookup(layers, &resolved)?.map(|(host, _)| host))
}

/// The merged entry at `rel` (normal components only, no symlink among its parents in the
/// merged view): the host path of the topmost layer's entry and its type, `None` if the
/// merged view has nothing there.
fn lookup(layers: &[PathBuf], rel: &Path) -> io::Result<Option<(PathBuf, FileType)>> {
    // The layers whose directory at the current prefix takes part in the merge.
    let mut live: Vec<&Path> = layers.iter().map(PathBuf::as_path).collect();
    let mut prefix = PathBuf::new();
    let mut found = None;
    for c in rel.components() {
        prefix.push(c);
        let mut below: Vec<&Path> = Vec::new();
        found = None;
        for layer in &live {
            let p = layer.join(&prefix);
            let m = match fs::symlink_metadata(&p) {
                Ok(m) => m,
                Err(e) if missing(&e) => continue,
                Err(e) => return Err(e),
            };
            let kind = m.file_type();
            if kind.is_char_device() && m.rdev() == 0 {
                break; // a whiteout: the name is gone from here down
            }
            if kind.is_dir() {
                let opaque = is_opaque(&p)?;
                if found.is_none() {
                    found = Some((p, kind));
                }
                below.push(layer);
                if opaque {
                    break;
                }
            } else {
                // A non-directory: the topmost one is the entry; under a directory it merges
                // with nothing, and either way it hides every lower layer.
                if found.is_none() {
                    found = Some((p, kind));
                }
                break;
            }
        }
        match &found {
            None => return Ok(None),
            Some((_, kind)) if !kind.is_dir() => {
                // Only the last component may be a non-directory; callers resolve symlinks
                // component by component, so a file here means "not a directory".
                return Ok(if prefix.as_path() == rel { found } else { None });
            }
            Some(_) => live = below,
        }
    }
    if found.is_none() {
        // `rel` is the root itself: the top layer's directory.
        if let Some(top) = layers.first() {
            found = Some((top.clone(), fs::symlink_metadata(top)?.file_type()));
        }
    }
    Ok(found)
}

fn missing(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENOTDIR)
}

/// Whether directory `dir` is opaque (hides the lower layers' contents).
fn is_opaque(dir: &Path) -> io::Result<bool> {
    for name in ["trusted.overlay.opaque", "user.overlay.opaque"] {
        if xattr_is_y(dir, name)? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Whether `path`'s extended attribute `name` (not following a symlink) is `y`.
fn xattr_is_y(path: &Path, name: &str) -> io::Result<bool> {
    use std::os::unix::ffi::OsStrExt;
    let cpath = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path with a NUL byte"))?;
    let cname = std::ffi::CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "xattr name with a NUL byte"))?;
    let mut buf = [0u8; 4];
    // SAFETY: both strings are NUL-terminated and live across the call; the buffer's length
    // is passed with it, so the kernel writes at most that many bytes into it.
    let n = unsafe {
        libc::lgetxattr(
            cpath.as_ptr(),
            cname.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            // Not set, not supported here, or longer than "y": not opaque.
            Some(libc::ENODATA) | Some(libc::ENOTSUP) | Some(libc::ERANGE) => Ok(false),
            // trusted.* needs CAP_SYS_ADMIN to read; without it the attribute reads as absent.
            Some(libc::EPERM) | Some(libc::EACCES) => Ok(false),
            _ => Err(e),
        };
    }
    Ok(&buf[..n as usize] == b"y")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// Layers under a temp dir: `l0` (top) … `l<n-1>`.
    fn layers(n: usize) -> (tempfile::TempDir, Vec<PathBuf>) {
        let dir = tempfile::tempdir().unwrap();
        let ls: Vec<PathBuf> = (0..n).map(|i| dir.path().join(format!("l{i}"))).collect();
        for l in &ls {
            fs::create_dir_all(l).unwrap();
        }
        (dir, ls)
    }

    fn write(p: &Path, text: &str) {
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
    }

    fn read(root: RootFs<'_>, path: &str) -> Option<String> {
        root.resolve(Path::new(path))
            .unwrap()
            .map(|p| fs::read_to_string(p).unwrap())
    }

    fn whiteout(p: &Path) {
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        nix::sys::stat::mknod(
            p,
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o600),
            nix::sys::stat::makedev(0, 0),
        )
        .unwrap();
    }

    fn set_opaque(dir: &Path) -> bool {
        use std::os::unix::ffi::OsStrExt;
        let p = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
        let n = std::ffi::CString::new("trusted.overlay.opaque").unwrap();
        // SAFETY: NUL-terminated strings and a one-byte value that outlive the call.
        unsafe { libc::lsetxattr(p.as_ptr(), n.as_ptr(), b"y".as_ptr().cast(), 1, 0) == 0 }
    }

    #[test]
    fn the_topmost_layer_wins_and_lower_ones_show_through() {
        let (_d, ls) = layers(3);
        write(&ls[2].join("etc/passwd"), "low");
        write(&ls[2].join("etc/group"), "low group");
        write(&ls[1].join("etc/passwd"), "mid");
        let root = RootFs::Layers(&ls);
        assert_eq!(read(root, "etc/passwd").as_deref(), Some("mid"));
        assert_eq!(read(root, "etc/group").as_deref(), Some("low group"));
        assert_eq!(read(root, "etc/shadow"), None);
        assert_eq!(read(root, "nope/passwd"), None);
    }

    #[test]
    fn whiteouts_hide_lower_files_and_directories() {
        let (_d, ls) = layers(3);
        write(&ls[2].join("etc/passwd"), "low");
        write(&ls[2].join("etc/group"), "low");
        whiteout(&ls[1].join("etc/passwd"));
        let root = RootFs::Layers(&ls);
        assert_eq!(read(root, "etc/passwd"), None);
        assert_eq!(read(root, "etc/group").as_deref(), Some("low"));
        // A file added again above its whiteout is back.
        write(&ls[0].join("etc/passwd"), "top");
        assert_eq!(read(root, "etc/passwd").as_deref(), Some("top"));
        // A whited-out directory takes its whole subtree.
        let (_d, ls) = layers(2);
        write(&ls[1].join("etc/group"), "low");
        whiteout(&ls[0].join("etc"));
        assert_eq!(read(RootFs::Layers(&ls), "etc/group"), None);
    }

    #[test]
    fn a_lower_non_directory_ends_the_merge_of_a_directory_above_it() {
        let (_d, ls) = layers(3);
        write(&ls[0].join("etc/group"), "top");
        write(&ls[1].join("etc"), "a file");
        write(&ls[2].join("etc/passwd"), "under the file");
        let root = RootFs::Layers(&ls);
        assert_eq!(read(root, "etc/group").as_deref(), Some("top"));
        assert_eq!(read(root, "etc/passwd"), None);
    }

    #[test]
    fn an_opaque_directory_hides_the_lower_contents() {
        let (_d, ls) = layers(2);
        write(&ls[1].join("etc/passwd"), "low");
        write(&ls[0].join("etc/group"), "top");
        if !set_opaque(&ls[0].join("etc")) {
            // trusted.* xattrs need CAP_SYS_ADMIN and a filesystem that keeps them.
            eprintln!("cannot set trusted.overlay.opaque here; skipped");
            return;
        }
        let root = RootFs::Layers(&ls);
        assert_eq!(read(root, "etc/passwd"), None);
        assert_eq!(read(root, "etc/group").as_deref(), Some("top"));
    }

    #[test]
    fn symlinks_resolve_in_the_merged_view_never_on_the_host() {
        let (_d, ls) = layers(2);
        // /etc -> /private/etc in the lower layer, the file in the upper one.
        fs::create_dir_all(&ls[1]).unwrap();
        symlink("/private/etc", ls[1].join("etc")).unwrap();
        write(&ls[0].join("private/etc/passwd"), "through the link");
        let root = RootFs::Layers(&ls);
        assert_eq!(
            read(root, "etc/passwd").as_deref(),
            Some("through the link")
        );
        // Relative links and `..` stay inside the root.
        // (The host's /etc/hostname exists; the image's /private/etc/hostname does not.)
        symlink(
            "../../../../../../etc/hostname",
            ls[0].join("private/etc/group"),
        )
        .unwrap();
        assert_eq!(read(root, "etc/group"), None);
        write(&ls[0].join("private/etc/hostname"), "the image's");
        assert_eq!(read(root, "etc/group").as_deref(), Some("the image's"));
    }

    #[test]
    fn symlink_loops_are_errors() {
        let (_d, ls) = layers(1);
        fs::create_dir_all(ls[0].join("etc")).unwrap();
        symlink("group", ls[0].join("etc/passwd")).unwrap();
        symlink("passwd", ls[0].join("etc/group")).unwrap();
        assert!(RootFs::Layers(&ls)
            .resolve(Path::new("etc/passwd"))
            .is_err());
    }

    #[test]
    fn a_directory_root_reads_like_the_mounted_rootfs() {
        let (_d, ls) = layers(1);
        write(&ls[0].join("etc/passwd"), "dir");
        let root = RootFs::Dir(&ls[0]);
        assert_eq!(read(root, "etc/passwd").as_deref(), Some("dir"));
        assert_eq!(read(root, "etc/group"), None);
    }
}
