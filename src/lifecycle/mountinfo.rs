//! `/proc/self/mountinfo`, read for what a CRI mount's propagation needs of its source.
//!
//! A `Bidirectional` mount (`rshared` in the spec) only propagates when its source is on a
//! shared mount, a `HostToContainer` one (`rslave`) only when it is on a shared or slave
//! mount: on a private mount runc makes the bind and nothing propagates, silently. As
//! containerd's CRI (`ensureShared` / `ensureSharedOrSlave`), CreateContainer checks the
//! source's mount and refuses the container, naming the mount, rather than run it without the
//! propagation its pod asked for.

use std::path::{Path, PathBuf};

use thiserror::Error;

// mountinfo's octal escapes: one parser, the shim's (the daemon may use the shim's host code).
use crate::spec::MountPropagation;
use remora_host::mountinfo::unescape;

/// One line of mountinfo, the fields used here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountInfo {
    /// Where it is mounted (field 5, unescaped).
    pub mount_point: PathBuf,
    /// Per-mount options (field 6), e.g. `rw`, `nosuid`.
    pub options: Vec<String>,
    /// Optional fields (7…), e.g. `shared:1`, `master:3`.
    pub optional: Vec<String>,
}

impl MountInfo {
    /// Whether the mount is a member of a peer group (`shared:N`).
    pub fn shared(&self) -> bool {
        self.optional.iter().any(|f| f.starts_with("shared:"))
    }

    /// Whether the mount receives from a peer group (`master:N`).
    pub fn slave(&self) -> bool {
        self.optional.iter().any(|f| f.starts_with("master:"))
    }
}

/// The mounts of mountinfo `text`, in order; lines that do not parse are skipped (the kernel
/// writes them, but nothing here should panic on a surprise).
pub fn parse(text: &str) -> Vec<MountInfo> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<MountInfo> {
    // 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
    let mut fields = line.split(' ');
    let _id = fields.next()?;
    let _parent = fields.next()?;
    let _dev = fields.next()?;
    let _root = fields.next()?;
    let mount_point = unescape(fields.next()?);
    let options = fields.next()?.split(',').map(str::to_string).collect();
    let mut optional = Vec::new();
    loop {
        match fields.next()? {
            "-" => break,
            f => optional.push(f.to_string()),
        }
    }
    Some(MountInfo {
        mount_point: PathBuf::from(mount_point),
        options,
        optional,
    })
}

/// The mount `path` (absolute, symlinks resolved) is on: the one with the longest mount point
/// that contains it, the last of those in the table (a later mount on the same point hides
/// the earlier ones).
pub fn mount_of<'a>(mounts: &'a [MountInfo], path: &Path) -> Option<&'a MountInfo> {
    mounts
        .iter()
        .filter(|m| path.starts_with(&m.mount_point))
        .fold(None, |best: Option<&MountInfo>, m| match best {
            Some(b) if b.mount_point.components().count() > m.mount_point.components().count() => {
                Some(b)
            }
            _ => Some(m),
        })
}

/// Why a mount's source cannot have the propagation asked for.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum PropagationError {
    /// The source is on a mount that does not propagate as asked.
    #[error(
        "{} is on mount {}, which is not {wanted}",
        source_path.display(),
        mount_point.display()
    )]
    NotPropagating {
        /// The source, resolved.
        source_path: PathBuf,
        /// The mount it is on.
        mount_point: PathBuf,
        /// What it should be: "a shared mount" or "a shared or slave mount".
        wanted: &'static str,
    },
    /// No mount holds the source (a mountinfo without `/`).
    #[error("no mount in mountinfo holds {}", .0.display())]
    NoMount(PathBuf),
}

/// Checks that `source` (absolute, symlinks resolved) is on a mount that can give
/// `propagation`: shared for `Bidirectional`, shared or slave for `HostToContainer`; anything
/// for `Private`.
pub fn check_propagation(
    mounts: &[MountInfo],
    source: &Path,
    propagation: MountPropagation,
) -> Result<(), PropagationError> {
    let wanted = match propagation {
        MountPropagation::Private => return Ok(()),
        MountPropagation::Bidirectional => "a shared mount",
        MountPropagation::HostToContainer => "a shared or slave mount",
    };
    let m = mount_of(mounts, source).ok_or_else(|| PropagationError::NoMount(source.into()))?;
    let ok = match propagation {
        MountPropagation::Bidirectional => m.shared(),
        _ => m.shared() || m.slave(),
    };
    if ok {
        Ok(())
    } else {
        Err(PropagationError::NotPropagating {
            source_path: source.into(),
            mount_point: m.mount_point.clone(),
            wanted,
        })
    }
}

/// `path` with symlinks resolved, or, when it does not exist yet (CreateContainer makes a
/// missing bind source), its nearest existing ancestor resolved: the directory it will be
/// made in is on the same mount.
pub fn resolve_existing(path: &Path) -> std::io::Result<PathBuf> {
    let mut p = path;
    loop {
        match std::fs::canonicalize(p) {
            Ok(r) => return Ok(r),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => match p.parent() {
                Some(parent) => p = parent,
                None => return Err(e),
            },
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
23 22 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
40 22 0:35 / /mnt/private rw,relatime - tmpfs tmpfs rw
41 22 0:36 / /mnt/slave rw,relatime master:7 - tmpfs tmpfs rw
42 22 0:37 / /mnt/both rw,relatime shared:9 master:7 - tmpfs tmpfs rw
43 40 0:38 / /mnt/private/inner rw,relatime shared:10 - tmpfs tmpfs rw
44 22 0:39 / /mnt/with\\040space rw,nosuid,nodev - tmpfs tmpfs rw
45 22 0:40 / /mnt/slave rw - tmpfs tmpfs rw
garbage line
46 22 0:41 /x
";

    #[test]
    fn mountinfo_lines_parse_with_their_optional_fields_and_escapes() {
        let m = parse(FIXTURE);
        assert_eq!(m.len(), 8, "{m:?}");
        assert!(m[0].shared() && !m[0].slave());
        assert_eq!(
            m[1].options,
            ["rw", "nosuid", "nodev", "noexec", "relatime"]
        );
        assert!(m[4].shared() && m[4].slave());
        assert_eq!(m[6].mount_point, Path::new("/mnt/with space"));
        assert!(m[6].options.iter().any(|o| o == "nosuid"));
    }

    #[test]
    fn the_innermost_and_latest_mount_holds_a_path() {
        let m = parse(FIXTURE);
        let at = |p: &str| mount_of(&m, Path::new(p)).unwrap().mount_point.clone();
        assert_eq!(at("/var/lib/x"), Path::new("/"));
        assert_eq!(at("/mnt/private/a"), Path::new("/mnt/private"));
        assert_eq!(at("/mnt/private/inner/b"), Path::new("/mnt/private/inner"));
        // Not a prefix by characters: /mnt/privateer is on /.
        assert_eq!(at("/mnt/privateer"), Path::new("/"));
        // The later mount on /mnt/slave (private) hides the first.
        assert!(!mount_of(&m, Path::new("/mnt/slave/x")).unwrap().slave());
    }

    #[test]
    fn propagation_needs_a_shared_or_slave_source_as_containerd_checks() {
        let m = parse(FIXTURE);
        use MountPropagation::*;
        let check = |p: &str, prop| check_propagation(&m, Path::new(p), prop);
        assert_eq!(check("/mnt/private/d", Private), Ok(()));
        assert_eq!(check("/srv/d", Bidirectional), Ok(()));
        assert_eq!(check("/mnt/both/d", Bidirectional), Ok(()));
        assert_eq!(check("/mnt/both/d", HostToContainer), Ok(()));
        assert_eq!(check("/mnt/private/inner/d", Bidirectional), Ok(()));
        assert_eq!(
            check("/mnt/private/d", Bidirectional),
            Err(PropagationError::NotPropagating {
                source_path: "/mnt/private/d".into(),
                mount_point: "/mnt/private".into(),
                wanted: "a shared mount",
            })
        );
        assert!(check("/mnt/private/d", HostToContainer).is_err());
        let slave = parse("41 22 0:36 / /mnt/s rw master:7 - tmpfs tmpfs rw\n");
        assert_eq!(
            check_propagation(&slave, Path::new("/mnt/s/x"), HostToContainer),
            Ok(())
        );
        assert!(check_propagation(&slave, Path::new("/mnt/s/x"), Bidirectional).is_err());
        assert_eq!(
            check_propagation(&[], Path::new("/x"), Bidirectional),
            Err(PropagationError::NoMount("/x".into()))
        );
    }

    #[test]
    fn a_missing_source_resolves_to_its_nearest_existing_ancestor() {
        let dir = tempfile::tempdir().unwrap();
        let real = std::fs::canonicalize(dir.path()).unwrap();
        assert_eq!(
            resolve_existing(&dir.path().join("not/yet/there")).unwrap(),
            real
        );
    }
}
