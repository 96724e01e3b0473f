//! Unit tests of the applier on layers built here, byte by byte (so malformed ones can be
//! built too). They run as root, as the daemon does (devices, owners, `trusted.*` xattrs).

mod adversarial;
mod features;
mod whiteouts;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::{apply_layer, Applied, ApplyError, ApplyOptions, OpaqueXattr, Whiteouts};

/// One tar entry to write.
#[derive(Clone)]
pub(super) struct E {
    pub flag: u8,
    pub name: Vec<u8>,
    pub link: Vec<u8>,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: u64,
    pub data: Vec<u8>,
    pub dev: (u32, u32),
    /// PAX records written in an `x` header before it.
    pub pax: Vec<(String, Vec<u8>)>,
}

pub(super) const MTIME: u64 = 1_600_000_000;

impl E {
    fn new(flag: u8, name: &str) -> Self {
        Self {
            flag,
            name: name.as_bytes().to_vec(),
            link: Vec::new(),
            mode: 0o644,
            uid: 0,
            gid: 0,
            mtime: MTIME,
            data: Vec::new(),
            dev: (0, 0),
            pax: Vec::new(),
        }
    }
    pub fn file(name: &str, data: &[u8]) -> Self {
        Self {
            data: data.to_vec(),
            ..Self::new(b'0', name)
        }
    }
    pub fn dir(name: &str) -> Self {
        Self {
            mode: 0o755,
            ..Self::new(b'5', name)
        }
    }
    pub fn symlink(name: &str, target: &str) -> Self {
        Self {
            link: target.as_bytes().to_vec(),
            mode: 0o777,
            ..Self::new(b'2', name)
        }
    }
    pub fn hardlink(name: &str, target: &str) -> Self {
        Self {
            link: target.as_bytes().to_vec(),
            ..Self::new(b'1', name)
        }
    }
    pub fn node(flag: u8, name: &str, dev: (u32, u32)) -> Self {
        Self {
            dev,
            ..Self::new(flag, name)
        }
    }
    pub fn mode(mut self, mode: u32) -> Self {
        self.mode = mode;
        self
    }
    pub fn owner(mut self, uid: u32, gid: u32) -> Self {
        self.uid = uid;
        self.gid = gid;
        self
    }
    pub fn mtime(mut self, mtime: u64) -> Self {
        self.mtime = mtime;
        self
    }
    pub fn pax(mut self, key: &str, value: &[u8]) -> Self {
        self.pax.push((key.to_string(), value.to_vec()));
        self
    }
}

fn octal(field: &mut [u8], v: u64) {
    let s = format!("{:0width$o}\0", v, width = field.len() - 1);
    field.copy_from_slice(s.as_bytes());
}

/// A ustar header block.
pub(super) fn header(flag: u8, name: &[u8], link: &[u8], e: &E, size: u64) -> [u8; 512] {
    let mut b = [0u8; 512];
    b[..name.len()].copy_from_slice(name);
    octal(&mut b[100..108], u64::from(e.mode));
    octal(&mut b[108..116], u64::from(e.uid));
    octal(&mut b[116..124], u64::from(e.gid));
    octal(&mut b[124..136], size);
    octal(&mut b[136..148], e.mtime);
    b[156] = flag;
    b[157..157 + link.len()].copy_from_slice(link);
    b[257..263].copy_from_slice(b"ustar\0");
    b[263..265].copy_from_slice(b"00");
    octal(&mut b[329..337], u64::from(e.dev.0));
    octal(&mut b[337..345], u64::from(e.dev.1));
    set_checksum(&mut b);
    b
}

pub(super) fn set_checksum(b: &mut [u8; 512]) {
    b[148..156].copy_from_slice(b"        ");
    let sum: u64 = b.iter().map(|c| u64::from(*c)).sum();
    b[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
}

/// PAX records, each `"%d %s=%s\n"` with the length counting itself.
pub(super) fn pax_records(records: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in records {
        let body = k.len() + v.len() + 3;
        let mut len = body + body.to_string().len();
        if len.to_string().len() != body.to_string().len() {
            len += 1;
        }
        out.extend_from_slice(format!("{len} {k}=").as_bytes());
        out.extend_from_slice(v);
        out.push(b'\n');
    }
    out
}

/// A layer being written.
#[derive(Default)]
pub(super) struct Layer(pub Vec<u8>);

impl Layer {
    pub fn block(&mut self, b: &[u8; 512]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    pub fn data(&mut self, data: &[u8]) -> &mut Self {
        self.0.extend_from_slice(data);
        let pad = (512 - data.len() % 512) % 512;
        self.0.extend(std::iter::repeat_n(0u8, pad));
        self
    }
    pub fn add(&mut self, e: E) -> &mut Self {
        if !e.pax.is_empty() {
            let recs = pax_records(&e.pax);
            let h = header(
                b'x',
                b"PaxHeaders/x",
                b"",
                &E::file("", b""),
                recs.len() as u64,
            );
            self.block(&h).data(&recs);
        }
        let h = header(e.flag, &e.name, &e.link, &e, e.data.len() as u64);
        self.block(&h).data(&e.data)
    }
    pub fn tar(&self) -> Vec<u8> {
        let mut out = self.0.clone();
        out.extend_from_slice(&[0u8; 1024]);
        out
    }
}

pub(super) fn layer(entries: impl IntoIterator<Item = E>) -> Vec<u8> {
    let mut l = Layer::default();
    for e in entries {
        l.add(e);
    }
    l.tar()
}

/// A root to apply into, inside a temporary directory whose other contents are watched: an
/// `outside` directory with a file, which no apply may change.
pub(super) struct Sandbox {
    pub tmp: tempfile::TempDir,
    pub root: PathBuf,
    before: BTreeMap<PathBuf, (u64, u32, u64, i64)>,
}

fn tree(dir: &Path, skip: &Path, out: &mut BTreeMap<PathBuf, (u64, u32, u64, i64)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p == skip {
            continue;
        }
        let m = std::fs::symlink_metadata(&p).unwrap();
        out.insert(p.clone(), (m.ino(), m.mode(), m.nlink(), m.mtime()));
        if m.is_dir() {
            tree(&p, skip, out);
        }
    }
}

impl Sandbox {
    pub fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        std::fs::create_dir(&root).unwrap();
        std::fs::create_dir(tmp.path().join("outside")).unwrap();
        std::fs::write(tmp.path().join("outside/marker"), b"outside").unwrap();
        let mut before = BTreeMap::new();
        tree(tmp.path(), &root, &mut before);
        Self { tmp, root, before }
    }

    /// The absolute path of the watched directory outside the root.
    pub fn outside(&self) -> PathBuf {
        self.tmp.path().join("outside")
    }

    pub fn apply(&self, tar: &[u8], whiteouts: Whiteouts) -> Result<Applied, ApplyError> {
        let options = ApplyOptions {
            whiteouts,
            skip_devices: false,
        };
        apply_layer(tar, &self.root, &options)
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    pub fn lstat(&self, rel: &str) -> std::fs::Metadata {
        std::fs::symlink_metadata(self.path(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
    }

    pub fn exists(&self, rel: &str) -> bool {
        std::fs::symlink_metadata(self.path(rel)).is_ok()
    }
}

impl Drop for Sandbox {
    /// Nothing outside the root changed, whatever the test did.
    fn drop(&mut self) {
        let mut after = BTreeMap::new();
        tree(self.tmp.path(), &self.root, &mut after);
        if !std::thread::panicking() {
            assert_eq!(self.before, after, "something outside the root changed");
        }
    }
}

/// Both modes over an empty lower, for the features that do not depend on whiteouts.
pub(super) fn modes() -> [Whiteouts; 2] {
    [
        Whiteouts::Plain,
        Whiteouts::Overlay {
            lowers: Vec::new(),
            opaque: OpaqueXattr::Trusted,
        },
    ]
}

/// An xattr of `path` (not following it), if set.
pub(super) fn xattr(path: &Path, key: &str) -> Option<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let p = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let k = std::ffi::CString::new(key).unwrap();
    let mut buf = vec![0u8; 65536];
    // SAFETY: both strings are NUL-terminated; buf has buf.len() writable bytes.
    let n = unsafe { libc::lgetxattr(p.as_ptr(), k.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    let n = usize::try_from(n).ok()?;
    buf.truncate(n);
    Some(buf)
}
