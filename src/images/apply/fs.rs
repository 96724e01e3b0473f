//! Filesystem calls under the root, made relative to directory file descriptors.
//!
//! Every directory is reached one component at a time from the root's descriptor, opening each
//! with `O_NOFOLLOW`; a symlink met on the way is read and its target resolved again from the
//! root (`..` and absolute targets stay at the root), which is what continuity's
//! `fs.RootPath` does with strings, so nothing here can reach outside the root even when the
//! layer plants symlinks. Entries are then made and changed with `*at` calls on (directory
//! fd, name) that do not follow a final symlink. Extended attributes have no `*at` calls on
//! older kernels; they go through `/proc/self/fd/<dir>/<name>` with the `l*xattr` calls (the
//! magic link pins the directory; the name is not followed).

use std::collections::VecDeque;
use std::ffi::{CString, OsStr};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{openat, readlinkat, OFlag};
use nix::sys::stat::{fstat, fstatat, FileStat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};

use super::error::ApplyError;
use super::path::{join_link, Component};

/// Symlinks followed resolving one name before giving up (continuity's limit).
const MAX_LINKS: usize = 255;
/// Depth of a tree removed (or emptied) recursively: one descriptor is open per level.
pub(super) const MAX_REMOVE_DEPTH: usize = 256;

/// A directory under the root: its descriptor (`O_PATH`) and its physical path.
pub(super) struct Dir {
    /// `O_PATH` descriptor.
    pub fd: OwnedFd,
    /// Components from the root, no symlinks among them.
    pub path: Vec<Component>,
}

impl Dir {
    /// The path of `name` in this directory, for messages and the applied set.
    pub(super) fn child(&self, name: &[u8]) -> Vec<u8> {
        let mut p = self.path.join(&b'/');
        if !p.is_empty() {
            p.push(b'/');
        }
        p.extend_from_slice(name);
        p
    }
}

/// Called on each directory [`resolve`] makes.
pub(super) type MakeDir<'a> = dyn FnMut(&Dir) -> Result<(), ApplyError> + 'a;

/// What a name resolved to.
pub(super) enum Found {
    /// A directory (symlinks followed, the last one too).
    Dir(Dir),
    /// The last component exists and is neither a directory nor a symlink.
    Other {
        /// Its directory.
        parent: Dir,
        /// Its name there.
        name: Component,
    },
    /// A component does not exist.
    Missing,
}

/// Opens `root` as the root of an apply.
pub(super) fn open_root(root: &Path) -> Result<OwnedFd, ApplyError> {
    nix::fcntl::open(
        root,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|source| ApplyError::Root {
        root: root.display().to_string(),
        source,
    })
}

fn cname(name: &[u8]) -> &OsStr {
    OsStr::from_bytes(name)
}

/// Opens `name` in `dir` without following it.
fn open_path(dir: impl AsFd, name: &[u8]) -> nix::Result<OwnedFd> {
    openat(
        dir,
        cname(name),
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

fn is(st: &FileStat, kind: SFlag) -> bool {
    st.st_mode & SFlag::S_IFMT.bits() == kind.bits()
}

/// `lstat` of `name` in `dir`; `None` if absent.
pub(super) fn lstat_at(dir: &Dir, name: &[u8]) -> Result<Option<FileStat>, ApplyError> {
    match fstatat(
        &dir.fd,
        cname(name),
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    ) {
        Ok(st) => Ok(Some(st)),
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(ApplyError::fs("lstat", &dir.child(name), e)),
    }
}

/// Whether `st` is a directory / a symlink.
pub(super) fn is_dir(st: &FileStat) -> bool {
    is(st, SFlag::S_IFDIR)
}

/// Whether `st` is a symlink.
pub(super) fn is_symlink(st: &FileStat) -> bool {
    is(st, SFlag::S_IFLNK)
}

/// Resolves `components` under `root`, following symlinks within it. With `create`, a
/// missing directory is made (mode 0755, as containerd's `mkparent`) and handed to `create`
/// (which copies a lower layer's attributes onto it); without, a missing one is
/// [`Found::Missing`]. A non-directory before the last component is an error.
pub(super) fn resolve(
    root: &OwnedFd,
    components: &[Component],
    mut create: Option<&mut MakeDir<'_>>,
) -> Result<Found, ApplyError> {
    let reopen_root = || root.try_clone().map_err(|e| ApplyError::fs("dup", b"/", e));
    let mut queue: VecDeque<Component> = components.iter().cloned().collect();
    let mut cur = Dir {
        fd: reopen_root()?,
        path: Vec::new(),
    };
    let mut links = 0;
    while let Some(c) = queue.pop_front() {
        let fd = match open_path(&cur.fd, &c) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => {
                let Some(make) = create.as_mut() else {
                    return Ok(Found::Missing);
                };
                cur = mkdir_0755(cur, &c)?;
                make(&cur)?;
                continue;
            }
            Err(e) => return Err(ApplyError::fs("open", &cur.child(&c), e)),
        };
        let st = fstat(&fd).map_err(|e| ApplyError::fs("fstat", &cur.child(&c), e))?;
        if is(&st, SFlag::S_IFDIR) {
            cur.path.push(c);
            cur.fd = fd;
        } else if is(&st, SFlag::S_IFLNK) {
            links += 1;
            if links > MAX_LINKS {
                return Err(ApplyError::TooManyLinks {
                    path: String::from_utf8_lossy(&components.join(&b'/')).into_owned(),
                });
            }
            let target = readlinkat(&cur.fd, cname(&c))
                .map_err(|e| ApplyError::fs("readlink", &cur.child(&c), e))?;
            let mut next: VecDeque<Component> = join_link(&cur.path, target.as_bytes())
                .into_iter()
                .collect();
            next.extend(queue);
            queue = next;
            cur = Dir {
                fd: reopen_root()?,
                path: Vec::new(),
            };
        } else if queue.is_empty() {
            return Ok(Found::Other {
                parent: cur,
                name: c,
            });
        } else {
            return Err(ApplyError::NotADirectory {
                path: String::from_utf8_lossy(&cur.child(&c)).into_owned(),
            });
        }
    }
    Ok(Found::Dir(cur))
}

/// containerd's `mkdir(path, 0755)`: made, then chmod'ed to exactly 0755.
fn mkdir_0755(parent: Dir, name: &[u8]) -> Result<Dir, ApplyError> {
    let path = parent.child(name);
    match nix::sys::stat::mkdirat(&parent.fd, cname(name), Mode::from_bits_truncate(0o755)) {
        Ok(()) => {}
        // Made meanwhile: containerd accepts a directory that is there after a failed mkdir.
        Err(Errno::EEXIST) => {}
        Err(e) => return Err(ApplyError::fs("mkdirat", &path, e)),
    }
    let fd = open_path(&parent.fd, name).map_err(|e| ApplyError::fs("open", &path, e))?;
    let st = fstat(&fd).map_err(|e| ApplyError::fs("fstat", &path, e))?;
    if !is(&st, SFlag::S_IFDIR) {
        return Err(ApplyError::NotADirectory {
            path: String::from_utf8_lossy(&path).into_owned(),
        });
    }
    chmod_fd(&fd, 0o755).map_err(|e| ApplyError::fs("chmod", &path, e))?;
    let mut components = parent.path;
    components.push(name.to_vec());
    Ok(Dir {
        fd,
        path: components,
    })
}

/// `/proc/self/fd/<fd>`, with `/<name>` after it when given.
pub(super) fn proc_path(fd: &OwnedFd, name: Option<&[u8]>) -> CString {
    let mut p = format!("/proc/self/fd/{}", fd.as_raw_fd()).into_bytes();
    if let Some(name) = name {
        p.push(b'/');
        p.extend_from_slice(name);
    }
    // Components never hold NUL (a C string from the kernel or a tar field cut at NUL).
    CString::new(p).unwrap_or_default()
}

/// chmod of the object an `O_PATH` descriptor holds (through its magic link).
pub(super) fn chmod_fd(fd: &OwnedFd, mode: u32) -> nix::Result<()> {
    nix::sys::stat::fchmodat(
        nix::fcntl::AT_FDCWD,
        proc_path(fd, None).as_c_str(),
        Mode::from_bits_truncate(mode),
        nix::sys::stat::FchmodatFlags::FollowSymlink,
    )
}

fn cvt(r: libc::ssize_t) -> io::Result<usize> {
    usize::try_from(r).map_err(|_| io::Error::last_os_error())
}

/// Sets an xattr. `follow`: `setxattr` (for a `/proc/self/fd/N` path naming the object
/// itself), else `lsetxattr`.
pub(super) fn set_xattr(
    path: &CString,
    key: &[u8],
    value: &[u8],
    follow: bool,
    flags: libc::c_int,
) -> io::Result<()> {
    let key = CString::new(key).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: both strings are NUL-terminated and live across the call; value is a valid
    // slice of value.len() bytes.
    let r = unsafe {
        let f = if follow {
            libc::setxattr
        } else {
            libc::lsetxattr
        };
        f(
            path.as_ptr(),
            key.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The xattrs of the object a `/proc/self/fd/N` path names: (key, value) pairs.
pub(super) fn list_xattrs(path: &CString) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    // SAFETY: a null buffer of size 0 asks for the size.
    let size = cvt(unsafe { libc::listxattr(path.as_ptr(), std::ptr::null_mut(), 0) })?;
    let mut names = vec![0u8; size];
    // SAFETY: names has names.len() writable bytes.
    let n = cvt(unsafe { libc::listxattr(path.as_ptr(), names.as_mut_ptr().cast(), names.len()) })?;
    names.truncate(n);
    let mut out = Vec::new();
    for key in names.split(|b| *b == 0).filter(|k| !k.is_empty()) {
        let ckey = CString::new(key).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
        // SAFETY: as above.
        let size = unsafe { libc::getxattr(path.as_ptr(), ckey.as_ptr(), std::ptr::null_mut(), 0) };
        let Ok(size) = cvt(size) else {
            continue; // Removed meanwhile (ENODATA): nothing to copy.
        };
        let mut value = vec![0u8; size];
        // SAFETY: value has value.len() writable bytes.
        let r = unsafe {
            libc::getxattr(
                path.as_ptr(),
                ckey.as_ptr(),
                value.as_mut_ptr().cast(),
                value.len(),
            )
        };
        if let Ok(n) = cvt(r) {
            value.truncate(n);
            out.push((key.to_vec(), value));
        }
    }
    Ok(out)
}

/// Removes `name` from `dir` and everything under it, never following a symlink (Go's
/// `os.RemoveAll`). Absent is not an error.
pub(super) fn remove_all(dir: &Dir, name: &[u8]) -> Result<(), ApplyError> {
    remove_in(&dir.fd, name, &dir.child(name), 0)
}

fn remove_in(dir: &OwnedFd, name: &[u8], path: &[u8], depth: usize) -> Result<(), ApplyError> {
    let st = match fstatat(dir, cname(name), nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::ENOENT) => return Ok(()),
        Err(e) => return Err(ApplyError::fs("lstat", path, e)),
    };
    if is(&st, SFlag::S_IFDIR) {
        let sub = open_dir(dir, name, path)?;
        for child in children(&sub, path)? {
            let mut p = path.to_vec();
            p.push(b'/');
            p.extend_from_slice(&child);
            if depth + 1 >= MAX_REMOVE_DEPTH {
                return Err(ApplyError::fs("remove", &p, Errno::ENAMETOOLONG));
            }
            remove_in(&sub, &child, &p, depth + 1)?;
        }
        unlinkat(dir, cname(name), UnlinkatFlags::RemoveDir)
            .map_err(|e| ApplyError::fs("rmdir", path, e))
    } else {
        match unlinkat(dir, cname(name), UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(ApplyError::fs("unlink", path, e)),
        }
    }
}

/// Opens directory `name` in `dir` for reading its entries, not following a symlink.
pub(super) fn open_dir(dir: &OwnedFd, name: &[u8], path: &[u8]) -> Result<OwnedFd, ApplyError> {
    openat(
        dir,
        cname(name),
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| ApplyError::fs("open", path, e))
}

/// The names in an open directory, `.` and `..` left out, sorted (Go's `filepath.Walk`
/// order).
pub(super) fn children(dir: &OwnedFd, path: &[u8]) -> Result<Vec<Component>, ApplyError> {
    let fd = dir
        .try_clone()
        .map_err(|e| ApplyError::fs("dup", path, e))?;
    let mut d = nix::dir::Dir::from_fd(fd).map_err(|e| ApplyError::fs("opendir", path, e))?;
    let mut out = Vec::new();
    for entry in d.iter() {
        let entry = entry.map_err(|e| ApplyError::fs("readdir", path, e))?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            out.push(name.to_vec());
        }
    }
    out.sort();
    Ok(out)
}

/// Copies `data` into `file`, seeking over 4 KiB blocks of zeros (they read back as zeros:
/// a hole), and sets the length at the end when the file ends in one.
pub(super) fn copy_sparse(data: &mut impl Read, file: &mut std::fs::File) -> io::Result<u64> {
    const HOLE: usize = 4096;
    let mut buf = vec![0u8; 256 * 1024];
    let mut total: u64 = 0;
    let mut hole: u64 = 0;
    loop {
        let n = match data.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        for block in buf[..n].chunks(HOLE) {
            if block.len() == HOLE && block.iter().all(|b| *b == 0) {
                hole += HOLE as u64;
                continue;
            }
            if hole > 0 {
                file.seek(SeekFrom::Current(i64::try_from(hole).unwrap_or(i64::MAX)))?;
                hole = 0;
            }
            file.write_all(block)?;
        }
        total += n as u64;
    }
    if hole > 0 {
        file.set_len(total)?;
    }
    Ok(total)
}
