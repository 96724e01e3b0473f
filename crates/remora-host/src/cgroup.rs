//! Where a process's cgroup is, on cgroup v1, v2 or a hybrid host: the one reading of
//! `/proc/<pid>/cgroup` and of the cgroup mounts in mountinfo that remora's shim (a container's
//! metrics and OOM watch) and daemon (pod and container stats, OOM attribution after a
//! restart) share.
//!
//! - **Where.** `/proc/<pid>/cgroup` names each hierarchy and the process's path in it;
//!   `/proc/self/mountinfo` says where each hierarchy is mounted here and which part of it the
//!   mount shows (its root, not always "/", e.g. inside a container or with bind mounts). The
//!   directory is the mount point joined with the path relative to that root. [`Cgroup::from_proc`]
//!   is a pure function of the two texts, so every layout is tested without a host that has it.
//! - **Hybrid hosts are v1.** A hybrid host (v1 controllers plus a controller-less cgroup2 at
//!   `/sys/fs/cgroup/unified`) keeps its limits and counters in the v1 controllers, so v2 is
//!   chosen only when no v1 controller is mounted. Named v1 hierarchies (`name=systemd`) have no
//!   controller and are left out. [`Hierarchy`] is that rule for the whole host.

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::OnceLock;

use crate::mountinfo::unescape;

/// What can go wrong finding a cgroup.
#[derive(Debug, thiserror::Error)]
pub enum LocateError {
    /// A proc file could not be read.
    #[error("read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The read's error.
        #[source]
        source: io::Error,
    },
    /// A line of `/proc/<pid>/cgroup` or `/proc/self/mountinfo` does not have the kernel's format.
    #[error("malformed line {line:?} in {file}")]
    Malformed {
        /// Which text: `/proc/<pid>/cgroup` or `/proc/self/mountinfo`.
        file: &'static str,
        /// The line.
        line: String,
    },
    /// None of the process's hierarchies is mounted here.
    #[error(
        "no cgroup mount in /proc/self/mountinfo serves the hierarchies in /proc/<pid>/cgroup"
    )]
    NoMount,
    /// The process's cgroup lies outside what the hierarchy's mount shows (another cgroup
    /// namespace, or a mount of a subtree).
    #[error("cgroup {path} of hierarchy {hierarchy:?} is outside the mount at {mount_point} (mount root {root})")]
    NotUnderMount {
        /// The hierarchy's controllers as `/proc/<pid>/cgroup` lists them ("" for v2).
        hierarchy: String,
        /// The process's cgroup path in that hierarchy.
        path: String,
        /// The mount's root within the hierarchy.
        root: String,
        /// Where it is mounted.
        mount_point: PathBuf,
    },
}

/// Where a process's cgroup lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cgroup {
    /// cgroup v1: one directory per controller that is mounted (memory, cpu, cpuacct, pids,
    /// blkio, hugetlb, ...).
    V1(BTreeMap<String, PathBuf>),
    /// cgroup v2 (unified): the cgroup's directory.
    V2(PathBuf),
}

const PROC_CGROUP: &str = "/proc/<pid>/cgroup";
const MOUNTINFO: &str = "/proc/self/mountinfo";

/// One line of `/proc/<pid>/cgroup`: `ID:CONTROLLERS:PATH`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcCgroupLine<'a> {
    /// The unified (v2) hierarchy: `0::PATH`.
    Unified(&'a str),
    /// A v1 hierarchy: its names (controllers, or `name=…` for a named hierarchy) and the path.
    V1 {
        /// The controllers (`cpu`, `cpuacct`) or `name=systemd`, in the order listed.
        names: Vec<&'a str>,
        /// The process's cgroup path in that hierarchy.
        path: &'a str,
    },
}

impl<'a> ProcCgroupLine<'a> {
    /// Reads one line; `None` when it does not have the kernel's format (a number, two colons,
    /// an absolute path; controllers only for a non-zero ID).
    pub fn parse(line: &'a str) -> Option<Self> {
        let mut fields = line.splitn(3, ':');
        let (id, names, path) = (fields.next()?, fields.next()?, fields.next()?);
        let id: u32 = id.parse().ok()?;
        if !path.starts_with('/') {
            return None;
        }
        if id == 0 && names.is_empty() {
            return Some(ProcCgroupLine::Unified(path));
        }
        let names: Vec<&str> = names.split(',').filter(|n| !n.is_empty()).collect();
        if names.is_empty() {
            return None;
        }
        Some(ProcCgroupLine::V1 { names, path })
    }

    /// Whether this is a v1 hierarchy with a controller (not only `name=…`).
    pub fn has_controller(&self) -> bool {
        match self {
            ProcCgroupLine::Unified(_) => false,
            ProcCgroupLine::V1 { names, .. } => names.iter().any(|n| !n.starts_with("name=")),
        }
    }
}

/// Which hierarchy holds the resource controllers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hierarchy {
    /// cgroup v1, pure or hybrid: each controller has a hierarchy of its own.
    V1,
    /// cgroup v2 alone: one unified hierarchy.
    Unified,
}

impl Hierarchy {
    /// This host's, by the rule [`Cgroup::from_proc`] follows (v2 only when no v1 controller
    /// is mounted), read from this process's `/proc/self/cgroup` and mountinfo once. Where
    /// those cannot be read, a root `/sys/fs/cgroup` with `cgroup.controllers` is v2.
    pub fn of_host() -> Hierarchy {
        static HOST: OnceLock<Hierarchy> = OnceLock::new();
        *HOST.get_or_init(|| match Cgroup::of_pid_path("/proc/self/cgroup") {
            Ok(cgroup) => cgroup.hierarchy(),
            Err(_) if std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists() => {
                Hierarchy::Unified
            }
            Err(_) => Hierarchy::V1,
        })
    }
}

impl Cgroup {
    /// The cgroup of `pid`, from `/proc/<pid>/cgroup` and the cgroup mounts in
    /// /proc/self/mountinfo.
    pub fn of_pid(pid: u32) -> Result<Cgroup, LocateError> {
        Cgroup::of_pid_path(&format!("/proc/{pid}/cgroup"))
    }

    fn of_pid_path(proc_cgroup: &str) -> Result<Cgroup, LocateError> {
        let cgroup_path = PathBuf::from(proc_cgroup);
        let proc_cgroup =
            std::fs::read_to_string(&cgroup_path).map_err(|source| LocateError::Read {
                path: cgroup_path,
                source,
            })?;
        let mountinfo = std::fs::read_to_string(MOUNTINFO).map_err(|source| LocateError::Read {
            path: PathBuf::from(MOUNTINFO),
            source,
        })?;
        Cgroup::from_proc(&proc_cgroup, &mountinfo)
    }

    /// Testable core of [`Cgroup::of_pid`]: the texts of `/proc/<pid>/cgroup` and
    /// /proc/self/mountinfo (handles v1, v2 and hybrid; v1 mounts with several controllers such
    /// as cpu,cpuacct; mount roots other than "/").
    pub fn from_proc(proc_cgroup: &str, mountinfo: &str) -> Result<Cgroup, LocateError> {
        let mounts = parse_mountinfo(mountinfo)?;
        let mut controllers = BTreeMap::new();
        let mut unified: Option<&str> = None;
        for line in proc_cgroup.lines().filter(|l| !l.trim().is_empty()) {
            let parsed = ProcCgroupLine::parse(line).ok_or_else(|| LocateError::Malformed {
                file: PROC_CGROUP,
                line: line.to_string(),
            })?;
            let (names, path) = match parsed {
                ProcCgroupLine::Unified(path) => {
                    unified = Some(path);
                    continue;
                }
                // A named hierarchy (name=systemd) has no controller: nothing to read there.
                ref v1 if !v1.has_controller() => continue,
                ProcCgroupLine::V1 { names, path } => (names, path),
            };
            // The mount of this hierarchy has every one of its names in its super options.
            let candidates = mounts.iter().filter(|m| {
                m.fstype == "cgroup" && names.iter().all(|n| m.super_options.contains(n))
            });
            let Some(dir) = dir_in_mounts(candidates, &names.join(","), path)? else {
                // Not mounted here (e.g. a container that mounts only some controllers).
                continue;
            };
            for name in names.iter().filter(|n| !n.starts_with("name=")) {
                controllers.insert(name.to_string(), dir.clone());
            }
        }
        if !controllers.is_empty() {
            return Ok(Cgroup::V1(controllers));
        }
        if let Some(path) = unified {
            let candidates = mounts.iter().filter(|m| m.fstype == "cgroup2");
            if let Some(dir) = dir_in_mounts(candidates, "", path)? {
                return Ok(Cgroup::V2(dir));
            }
        }
        Err(LocateError::NoMount)
    }

    /// The hierarchy this cgroup is in.
    pub fn hierarchy(&self) -> Hierarchy {
        match self {
            Cgroup::V1(_) => Hierarchy::V1,
            Cgroup::V2(_) => Hierarchy::Unified,
        }
    }
}

/// One cgroup mount from mountinfo.
struct Mount<'a> {
    root: String,
    mount_point: PathBuf,
    fstype: &'a str,
    super_options: Vec<&'a str>,
}

/// The cgroup and cgroup2 mounts in a mountinfo text.
fn parse_mountinfo(text: &str) -> Result<Vec<Mount<'_>>, LocateError> {
    let mut mounts = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let malformed = || LocateError::Malformed {
            file: MOUNTINFO,
            line: line.to_string(),
        };
        // "ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTIONS"
        let (before, after) = line.split_once(" - ").ok_or_else(malformed)?;
        let before: Vec<&str> = before.split(' ').collect();
        let after: Vec<&str> = after.split(' ').collect();
        if before.len() < 6 || after.len() < 2 {
            return Err(malformed());
        }
        let fstype = after[0];
        if fstype != "cgroup" && fstype != "cgroup2" {
            continue;
        }
        mounts.push(Mount {
            root: unescape(before[3]),
            mount_point: PathBuf::from(unescape(before[4])),
            fstype,
            super_options: after
                .get(2)
                .map(|o| o.split(',').collect())
                .unwrap_or_default(),
        });
    }
    Ok(mounts)
}

/// The directory of cgroup `path` in the first candidate mount whose root contains it: `Ok(None)`
/// when there is no candidate, an error when every candidate shows another part of the hierarchy.
fn dir_in_mounts<'a, 'm: 'a>(
    candidates: impl Iterator<Item = &'a Mount<'m>>,
    hierarchy: &str,
    path: &str,
) -> Result<Option<PathBuf>, LocateError> {
    let mut outside = None;
    for mount in candidates {
        let root = mount.root.trim_end_matches('/');
        let relative = if root.is_empty() {
            Some(path)
        } else if path == root {
            Some("")
        } else {
            path.strip_prefix(root).filter(|rest| rest.starts_with('/'))
        };
        match relative {
            Some(rest) => {
                let rest = rest.trim_start_matches('/');
                return Ok(Some(if rest.is_empty() {
                    mount.mount_point.clone()
                } else {
                    mount.mount_point.join(rest)
                }));
            }
            None => {
                outside.get_or_insert(LocateError::NotUnderMount {
                    hierarchy: hierarchy.to_string(),
                    path: path.to_string(),
                    root: mount.root.clone(),
                    mount_point: mount.mount_point.clone(),
                });
            }
        }
    }
    outside.map_or(Ok(None), Err)
}

#[cfg(test)]
mod tests;
