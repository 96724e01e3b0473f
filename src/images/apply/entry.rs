//! Applying one tar entry, as containerd's `archive.Apply` (`applyNaive` and
//! `createTarFile`) does, in the same order of steps:
//!
//! 1. the name is cleaned and its parent resolved under the root; missing parents are made
//!    0755 (over an overlay, with the attributes and xattrs of the same directory in the
//!    highest lower layer that has one, as containerd's `mkparent` with parents);
//! 2. a whiteout is converted (see [`Whiteouts`]) and nothing else is written for it;
//! 3. an existing entry is removed, unless both it and the new one are directories (merged);
//! 4. the entry is made, then owner (`lchown`), xattrs, mode (not on symlinks) and times
//!    (atime is the later of the two; times before 1970 or past 2262 become the epoch);
//! 5. directories get their times again after the last entry (making children moves them).

use std::collections::HashSet;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FchmodatFlags, Mode, SFlag, UtimensatFlags};
use nix::sys::time::TimeSpec;
use nix::unistd::{Gid, Uid};

use super::error::ApplyError;
use super::fs::{self, Dir, Found};
use super::path::{rooted_components, Component};
use super::tar::{lossy, Header, Kind, Time};
use super::{ApplyOptions, Counts, OpaqueXattr, Whiteouts};

const OPAQUE: &[u8] = b".wh..wh..opq";
const WHITEOUT: &[u8] = b".wh.";

/// The state of one apply.
pub(super) struct Applier<'a> {
    root: OwnedFd,
    options: &'a ApplyOptions,
    /// Lower layers of an overlay, highest first.
    lowers: Vec<OwnedFd>,
    /// The last entry's parent: its name's components and the directory they resolved to.
    /// Valid for the next entry because an entry changes nothing outside its parent (a
    /// removal, a whiteout or an opaque marker is always inside it).
    parent: Option<(Vec<Component>, Dir)>,
    /// Directories applied: cleaned name, atime, mtime.
    dirs: Vec<(Vec<Component>, TimeSpec, TimeSpec)>,
    /// Physical paths applied so far (an opaque marker keeps these).
    applied: HashSet<Vec<u8>>,
    /// What was done.
    pub counts: Counts,
}

/// containerd's `boundTime`: before the epoch or past Go's last representable instant,
/// the epoch.
fn timespec(t: Time) -> TimeSpec {
    let t = if t.0 < 0 || t.0 > i128::from(i64::MAX) {
        0
    } else {
        t.0
    };
    // 0 <= t <= i64::MAX here, so both parts fit.
    let secs = i64::try_from(t / 1_000_000_000).unwrap_or(0);
    let nanos = i64::try_from(t % 1_000_000_000).unwrap_or(0);
    TimeSpec::new(secs, nanos)
}

fn owner(hdr: &Header, id: i64) -> Result<u32, ApplyError> {
    u32::try_from(id)
        .ok()
        .filter(|v| *v != u32::MAX)
        .ok_or_else(|| ApplyError::OwnerOutOfRange {
            name: lossy(&hdr.name),
            id,
        })
}

/// Gives `name` in `dir` (not followed) the header's owner; `op` and `path` name a failure.
fn chown_to_header(
    dir: &Dir,
    name: &std::ffi::OsStr,
    hdr: &Header,
    op: &'static str,
    path: &[u8],
) -> Result<(), ApplyError> {
    let (uid, gid) = (owner(hdr, hdr.uid)?, owner(hdr, hdr.gid)?);
    nix::unistd::fchownat(
        &dir.fd,
        name,
        Some(Uid::from_raw(uid)),
        Some(Gid::from_raw(gid)),
        AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .map_err(|e| ApplyError::fs(op, path, e))
}

impl<'a> Applier<'a> {
    /// An apply onto `root` (opened).
    pub(super) fn new(root: OwnedFd, options: &'a ApplyOptions) -> Result<Self, ApplyError> {
        let lowers = match &options.whiteouts {
            Whiteouts::Overlay { lowers, .. } => lowers
                .iter()
                .map(|l| fs::open_root(l))
                .collect::<Result<_, _>>()?,
            Whiteouts::Plain => Vec::new(),
        };
        Ok(Self {
            root,
            options,
            lowers,
            parent: None,
            dirs: Vec::new(),
            applied: HashSet::new(),
            counts: Counts::default(),
        })
    }

    /// Applies one entry; `data` reads its content.
    pub(super) fn entry(&mut self, hdr: &Header, data: &mut impl Read) -> Result<(), ApplyError> {
        self.counts.entries += 1;
        if matches!(hdr.kind, Kind::Char | Kind::Block) && self.options.skip_devices {
            self.counts.skipped_devices += 1;
            return Ok(());
        }
        let mut components = rooted_components(&hdr.name);
        let Some(base) = components.pop() else {
            // The name is the root itself: containerd skips it.
            self.counts.skipped_root += 1;
            return Ok(());
        };
        let parent = self.parent_dir(components.clone())?;
        let result = self.entry_in(&parent, &components, base, hdr, data);
        self.parent = Some((components, parent));
        result
    }

    fn entry_in(
        &mut self,
        parent: &Dir,
        components: &[Component],
        base: Component,
        hdr: &Header,
        data: &mut impl Read,
    ) -> Result<(), ApplyError> {
        if base == OPAQUE {
            self.counts.whiteouts += 1;
            return self.opaque(parent);
        }
        if let Some(original) = base.strip_prefix(WHITEOUT) {
            if matches!(original, b"" | b"." | b"..") {
                return Err(ApplyError::InvalidWhiteout {
                    name: lossy(&hdr.name),
                });
            }
            self.counts.whiteouts += 1;
            return self.whiteout(parent, original, hdr);
        }
        if let Some(st) = fs::lstat_at(parent, &base)? {
            if !(fs::is_dir(&st) && hdr.kind == Kind::Dir) {
                fs::remove_all(parent, &base)?;
            }
        }
        let path = parent.child(&base);
        if !self.create(parent, &base, &path, hdr, data)? {
            self.applied.insert(path);
            return Ok(());
        }
        self.metadata(parent, &base, &path, hdr)?;
        if hdr.kind == Kind::Dir {
            let mut name = components.to_vec();
            name.push(base);
            let (atime, mtime) = times(hdr);
            self.dirs.push((name, atime, mtime));
        }
        self.applied.insert(path);
        Ok(())
    }

    /// The resolved parent, made if missing; the last entry's when it is the same name.
    fn parent_dir(&mut self, components: Vec<Component>) -> Result<Dir, ApplyError> {
        if let Some((name, dir)) = self.parent.take() {
            if name == components {
                return Ok(dir);
            }
        }
        let lowers = &self.lowers;
        let mut copy_up = |made: &Dir| copy_up(lowers, made);
        match fs::resolve(&self.root, &components, Some(&mut copy_up))? {
            Found::Dir(dir) => Ok(dir),
            Found::Other { parent, name } => Err(ApplyError::NotADirectory {
                path: lossy(&parent.child(&name)),
            }),
            // Only without a creator.
            Found::Missing => Err(ApplyError::NotADirectory {
                path: lossy(&components.join(&b'/')),
            }),
        }
    }

    fn opaque(&mut self, dir: &Dir) -> Result<(), ApplyError> {
        match &self.options.whiteouts {
            Whiteouts::Overlay { opaque, .. } => {
                let key: &[u8] = match opaque {
                    OpaqueXattr::Trusted => b"trusted.overlay.opaque",
                    OpaqueXattr::User => b"user.overlay.opaque",
                };
                fs::set_xattr(&fs::proc_path(&dir.fd, None), key, b"y", true, 0)
                    .map_err(|e| ApplyError::fs("setxattr", &dir.child(b""), e))
            }
            Whiteouts::Plain => self.empty_unapplied(&dir.fd, &dir.path.join(&b'/'), 0),
        }
    }

    /// Removes from `dir` (recursively) what this layer has not applied.
    fn empty_unapplied(&self, dir: &OwnedFd, path: &[u8], depth: usize) -> Result<(), ApplyError> {
        let here = Dir {
            fd: fs::open_dir(dir, b".", path)?,
            path: rooted_components(path),
        };
        for child in fs::children(&here.fd, path)? {
            let p = here.child(&child);
            if !self.applied.contains(&p) {
                fs::remove_all(&here, &child)?;
                continue;
            }
            if fs::lstat_at(&here, &child)?.is_some_and(|st| fs::is_dir(&st)) {
                if depth + 1 >= fs::MAX_REMOVE_DEPTH {
                    return Err(ApplyError::fs("remove", &p, Errno::ENAMETOOLONG));
                }
                let sub = fs::open_dir(&here.fd, &child, &p)?;
                self.empty_unapplied(&sub, &p, depth + 1)?;
            }
        }
        Ok(())
    }

    fn whiteout(&mut self, dir: &Dir, original: &[u8], hdr: &Header) -> Result<(), ApplyError> {
        let path = dir.child(original);
        match &self.options.whiteouts {
            Whiteouts::Plain => fs::remove_all(dir, original),
            Whiteouts::Overlay { .. } => {
                let name = std::ffi::OsStr::from_bytes(original);
                nix::sys::stat::mknodat(&dir.fd, name, SFlag::S_IFCHR, Mode::empty(), 0)
                    .map_err(|e| ApplyError::fs("mknodat", &path, e))?;
                chown_to_header(dir, name, hdr, "chown", &path)
            }
        }
    }

    /// Makes the entry; `false` when nothing is to be set on it (a PAX global header).
    fn create(
        &mut self,
        dir: &Dir,
        base: &[u8],
        path: &[u8],
        hdr: &Header,
        data: &mut impl Read,
    ) -> Result<bool, ApplyError> {
        let name = std::ffi::OsStr::from_bytes(base);
        let perm = Mode::from_bits_truncate((hdr.mode & 0o7777) as u32);
        let fail = |op| move |e: Errno| ApplyError::fs(op, path, e);
        match hdr.kind {
            Kind::Dir => {
                let exists = fs::lstat_at(dir, base)?.is_some_and(|st| fs::is_dir(&st));
                if !exists {
                    nix::sys::stat::mkdirat(&dir.fd, name, perm).map_err(fail("mkdirat"))?;
                }
            }
            Kind::Regular => {
                let fd = nix::fcntl::openat(
                    &dir.fd,
                    name,
                    OFlag::O_WRONLY
                        | OFlag::O_CREAT
                        | OFlag::O_EXCL
                        | OFlag::O_NOFOLLOW
                        | OFlag::O_CLOEXEC,
                    perm,
                )
                .map_err(fail("openat"))?;
                nix::sys::stat::fchmod(&fd, perm).map_err(fail("fchmod"))?;
                let mut file = std::fs::File::from(fd);
                fs::copy_sparse(data, &mut file).map_err(|e| match e.kind() {
                    std::io::ErrorKind::UnexpectedEof => ApplyError::Read(e),
                    _ => ApplyError::fs("write", path, e),
                })?;
                self.counts.files += 1;
            }
            Kind::Char | Kind::Block | Kind::Fifo => {
                let kind = match hdr.kind {
                    Kind::Char => SFlag::S_IFCHR,
                    Kind::Block => SFlag::S_IFBLK,
                    _ => SFlag::S_IFIFO,
                };
                // Go's Mkdev(uint32(major), uint32(minor)): the same truncation.
                let dev = libc::makedev(hdr.devmajor as u32, hdr.devminor as u32);
                nix::sys::stat::mknodat(&dir.fd, name, kind, perm, dev).map_err(fail("mknodat"))?;
            }
            Kind::Link => self.hard_link(dir, name, path, hdr)?,
            Kind::Symlink => {
                let target = std::ffi::OsStr::from_bytes(&hdr.linkname);
                nix::unistd::symlinkat(target, &dir.fd, name).map_err(fail("symlinkat"))?;
            }
            Kind::Global => return Ok(false),
            Kind::Other(flag) => {
                return Err(ApplyError::UnknownType {
                    name: lossy(&hdr.name),
                    flag: char::from(flag),
                })
            }
        }
        Ok(true)
    }

    /// containerd's `hardlinkRootPath`: the target's directory resolved under the root, its
    /// last component not followed (a link to a symlink links the symlink).
    fn hard_link(
        &self,
        dir: &Dir,
        name: &std::ffi::OsStr,
        path: &[u8],
        hdr: &Header,
    ) -> Result<(), ApplyError> {
        let link = &hdr.linkname;
        let (target_dir, target_base) = match link.iter().rposition(|b| *b == b'/') {
            Some(i) => (&link[..i], &link[i + 1..]),
            None => (&b""[..], &link[..]),
        };
        let refuse = || ApplyError::LinkTargetDirectory {
            name: lossy(&hdr.name),
            target: lossy(link),
        };
        if matches!(target_base, b"" | b"." | b"..") {
            return Err(refuse());
        }
        let missing = || ApplyError::LinkTargetMissing {
            name: lossy(&hdr.name),
            target: lossy(link),
        };
        let from = match fs::resolve(&self.root, &rooted_components(target_dir), None)? {
            Found::Dir(d) => d,
            Found::Missing => return Err(missing()),
            Found::Other { parent, name } => {
                return Err(ApplyError::NotADirectory {
                    path: lossy(&parent.child(&name)),
                })
            }
        };
        let target = std::ffi::OsStr::from_bytes(target_base);
        match nix::unistd::linkat(&from.fd, target, &dir.fd, name, AtFlags::empty()) {
            Ok(()) => Ok(()),
            Err(Errno::ENOENT) => Err(missing()),
            Err(Errno::EPERM)
                if fs::lstat_at(&from, target_base)?.is_some_and(|s| fs::is_dir(&s)) =>
            {
                Err(refuse())
            }
            Err(e) => Err(ApplyError::fs("linkat", path, e)),
        }
    }

    /// Owner, xattrs, mode and times, in containerd's order (chown clears set-id bits).
    fn metadata(
        &mut self,
        dir: &Dir,
        base: &[u8],
        path: &[u8],
        hdr: &Header,
    ) -> Result<(), ApplyError> {
        let name = std::ffi::OsStr::from_bytes(base);
        chown_to_header(dir, name, hdr, "lchown", path)?;
        if !hdr.xattrs.is_empty() {
            self.xattrs(dir, base, path, hdr)?;
        }
        let st = fs::lstat_at(dir, base)?;
        if !st.as_ref().is_some_and(fs::is_symlink) {
            let perm = Mode::from_bits_truncate((hdr.mode & 0o7777) as u32);
            nix::sys::stat::fchmodat(&dir.fd, name, perm, FchmodatFlags::FollowSymlink)
                .map_err(|e| ApplyError::fs("chmod", path, e))?;
        }
        let (atime, mtime) = times(hdr);
        nix::sys::stat::utimensat(
            &dir.fd,
            name,
            &atime,
            &mtime,
            UtimensatFlags::NoFollowSymlink,
        )
        .map_err(|e| ApplyError::fs("utimensat", path, e))
    }

    /// containerd's xattr rules: `trusted.*` from a layer is ignored; so is what the
    /// filesystem does not support, and `user.*` refused on what is not a file or directory.
    fn xattrs(
        &mut self,
        dir: &Dir,
        base: &[u8],
        path: &[u8],
        hdr: &Header,
    ) -> Result<(), ApplyError> {
        let target = fs::proc_path(&dir.fd, Some(base));
        for (key, value) in &hdr.xattrs {
            if key.starts_with(b"trusted.") {
                self.counts.ignored_xattrs += 1;
                continue;
            }
            match fs::set_xattr(&target, key, value, false, 0) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => {
                    self.counts.ignored_xattrs += 1
                }
                Err(e) if e.raw_os_error() == Some(libc::EPERM) && key.starts_with(b"user.") => {
                    let st = fs::lstat_at(dir, base)?;
                    let plain = st.is_some_and(|s| {
                        fs::is_dir(&s) || s.st_mode & SFlag::S_IFMT.bits() == SFlag::S_IFREG.bits()
                    });
                    if plain {
                        return Err(ApplyError::fs("lsetxattr", path, e));
                    }
                    self.counts.ignored_xattrs += 1;
                }
                Err(e) => return Err(ApplyError::fs("lsetxattr", path, e)),
            }
        }
        Ok(())
    }

    /// Sets each applied directory's times again (creating children moved them), resolving
    /// its name again as containerd does (a symlink put there since is followed).
    pub(super) fn finish(&mut self) -> Result<(), ApplyError> {
        for (name, atime, mtime) in std::mem::take(&mut self.dirs) {
            let shown = lossy(&name.join(&b'/'));
            match fs::resolve(&self.root, &name, None)? {
                Found::Dir(d) => nix::sys::stat::utimensat(
                    nix::fcntl::AT_FDCWD,
                    fs::proc_path(&d.fd, None).as_c_str(),
                    &atime,
                    &mtime,
                    UtimensatFlags::FollowSymlink,
                ),
                Found::Other { parent, name } => nix::sys::stat::utimensat(
                    parent.fd.as_fd(),
                    std::ffi::OsStr::from_bytes(&name),
                    &atime,
                    &mtime,
                    UtimensatFlags::NoFollowSymlink,
                ),
                Found::Missing => return Err(ApplyError::DirectoryGone { path: shown }),
            }
            .map_err(|e| ApplyError::fs("utimensat", shown.as_bytes(), e))?;
        }
        Ok(())
    }
}

/// atime (the later of the two, as containerd's `latestTime`) and mtime, bounded.
fn times(hdr: &Header) -> (TimeSpec, TimeSpec) {
    let atime = hdr.atime.map_or(hdr.mtime, |a| a.max(hdr.mtime));
    (timespec(atime), timespec(hdr.mtime))
}

/// containerd's `copyDirInfo` and `copyUpXAttrs`: a parent made in an overlay's upper
/// directory takes owner, mode, times and xattrs (not `trusted.*`) of the same directory in
/// the highest lower layer that has it; none if that layer has something else there.
fn copy_up(lowers: &[OwnedFd], made: &Dir) -> Result<(), ApplyError> {
    let shown = made.path.join(&b'/');
    for lower in lowers {
        let found = match fs::resolve(lower, &made.path, None)? {
            Found::Dir(d) => d,
            Found::Missing => continue,
            Found::Other { .. } => return Ok(()),
        };
        let st =
            nix::sys::stat::fstat(&found.fd).map_err(|e| ApplyError::fs("fstat", &shown, e))?;
        match nix::unistd::fchownat(
            &made.fd,
            "",
            Some(Uid::from_raw(st.st_uid)),
            Some(Gid::from_raw(st.st_gid)),
            AtFlags::AT_EMPTY_PATH,
        ) {
            Ok(()) | Err(Errno::EPERM) => {}
            Err(e) => return Err(ApplyError::fs("chown", &shown, e)),
        }
        fs::chmod_fd(&made.fd, st.st_mode & 0o7777)
            .map_err(|e| ApplyError::fs("chmod", &shown, e))?;
        let atime = TimeSpec::new(st.st_atime, st.st_atime_nsec);
        let mtime = TimeSpec::new(st.st_mtime, st.st_mtime_nsec);
        let made_path = fs::proc_path(&made.fd, None);
        nix::sys::stat::utimensat(
            nix::fcntl::AT_FDCWD,
            made_path.as_c_str(),
            &atime,
            &mtime,
            UtimensatFlags::FollowSymlink,
        )
        .map_err(|e| ApplyError::fs("utimensat", &shown, e))?;
        let xattrs = match fs::list_xattrs(&fs::proc_path(&found.fd, None)) {
            Ok(x) => x,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTSUP) | Some(libc::ENODATA)) => {
                Vec::new()
            }
            Err(e) => return Err(ApplyError::fs("listxattr", &shown, e)),
        };
        for (key, value) in xattrs.iter().filter(|(k, _)| !k.starts_with(b"trusted.")) {
            match fs::set_xattr(&made_path, key, value, true, libc::XATTR_CREATE) {
                Ok(()) => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::ENOTSUP) | Some(libc::ENODATA) | Some(libc::EEXIST)
                    ) => {}
                Err(e) => return Err(ApplyError::fs("setxattr", &shown, e)),
            }
        }
        return Ok(());
    }
    Ok(())
}
