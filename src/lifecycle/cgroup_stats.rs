//! A cgroup's CPU, memory and process figures, read from cgroupfs: v1 (one hierarchy per
//! controller, `/sys/fs/cgroup/<controller>/<path>`) or v2 (one unified hierarchy), the one
//! reader behind ContainerStats, PodSandboxStats and the CRI metrics.
//!
//! Where a cgroup is: a container's from its init process's `/proc/<pid>/cgroup` (whatever
//! parent runc chose), a pod's from its `CgroupParent` (kubelet's pod cgroup, e.g.
//! `/kubepods/besteffort/pod<uid>`, or under systemd a slice name, which
//! [`crate::spec::cgroups::pod_cgroup_dir`] expands as systemd lays it out).
//! The figures are those cAdvisor and kubelet use: the working set is usage minus inactive
//! file pages, `rss` is anonymous memory, a limit at the kernel's "unlimited" is no limit.
//!
//! Pressure stall information (PSI) is v2's alone: `cpu.pressure`, `memory.pressure` and
//! `io.pressure` of the cgroup, each a `some` and a `full` line. A file that is missing (v1, a
//! kernel without PSI), unreadable (`psi=0` on the kernel command line: reads fail with
//! `EOPNOTSUPP`), too large or not in the kernel's format is no pressure figure — never an
//! error: the other figures still count.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use remora_host::cgroup::{Hierarchy, ProcCgroupLine};

/// Where cgroupfs is mounted on Linux hosts.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Limits at or above this are the kernel's "no limit" (v1 reports `PAGE_COUNTER_MAX` pages,
/// about 2^63 bytes rounded down to a page).
const UNLIMITED: u64 = 1 << 62;

/// CPU time of a cgroup, in ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuStats {
    /// Total CPU time (v1 `cpuacct.usage`, v2 `cpu.stat` `usage_usec`).
    pub usage_ns: u64,
    /// Time in user mode (v1 `cpuacct.stat`, in clock ticks; v2 `user_usec`).
    pub user_ns: Option<u64>,
    /// Time in kernel mode.
    pub system_ns: Option<u64>,
}

/// Memory figures of a cgroup (bytes, except the fault and failure counters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryStats {
    /// `memory.usage_in_bytes` (v2 `memory.current`).
    pub usage: u64,
    /// Usage minus inactive file cache, as kubelet and cAdvisor define it.
    pub working_set: u64,
    /// Anonymous and swap cache memory (v1 `total_rss`, v2 `anon`).
    pub rss: u64,
    /// Page cache (v1 `total_cache`, v2 `file`).
    pub cache: u64,
    /// Memory-mapped files (v1 `total_mapped_file`, v2 `file_mapped`).
    pub mapped_file: u64,
    /// Minor page faults (`total_pgfault`, v2 `pgfault`).
    pub page_faults: u64,
    /// Major page faults.
    pub major_page_faults: u64,
    /// The limit; `None` when unlimited.
    pub limit: Option<u64>,
    /// Peak usage (v1 `memory.max_usage_in_bytes`, v2 `memory.peak` where the kernel has it).
    pub max_usage: Option<u64>,
    /// How often usage hit the limit (v1 `memory.failcnt`; v2 has no such counter).
    pub failcnt: Option<u64>,
}

/// One line of a pressure file: how much of the time tasks of the cgroup stalled.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PsiData {
    /// Stalled time since the cgroup was created, in µs as the kernel counts it (`total=`).
    pub total_us: u64,
    /// The share of the last 10 s stalled, in % (`avg10=`).
    pub avg10: f64,
    /// Over the last 60 s, in %.
    pub avg60: f64,
    /// Over the last 300 s, in %.
    pub avg300: f64,
}

/// A pressure file (`cpu.pressure`, `memory.pressure`, `io.pressure`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PsiStats {
    /// `some`: at least one task stalled.
    pub some: Option<PsiData>,
    /// `full`: all non-idle tasks stalled at once. cpu.pressure has no such line before
    /// Linux 5.13.
    pub full: Option<PsiData>,
}

/// The pressure of a cgroup's resources: cgroup v2 only, each `None` where not reported.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Pressure {
    /// `cpu.pressure`.
    pub cpu: Option<PsiStats>,
    /// `memory.pressure`.
    pub memory: Option<PsiStats>,
    /// `io.pressure`.
    pub io: Option<PsiStats>,
}

/// What a cgroup reports; a controller that could not be read is `None`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CgroupStats {
    /// CPU time.
    pub cpu: Option<CpuStats>,
    /// Memory.
    pub memory: Option<MemoryStats>,
    /// Processes (tasks) in it: `pids.current`.
    pub pids: Option<u64>,
    /// Pressure stall information (cgroup v2).
    pub pressure: Pressure,
}

fn add_opt(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.saturating_add(b)),
        (a, b) => a.or(b),
    }
}

impl CgroupStats {
    /// The sum of several cgroups' figures: a pod without a cgroup of its own is the sum of its
    /// containers'. Limits and peaks do not add up, so the sum has none; nor does pressure
    /// (stalls of tasks in different cgroups overlap in time, and shares of time are no sum),
    /// so the sum has none of that either.
    pub fn sum<'a>(parts: impl IntoIterator<Item = &'a CgroupStats>) -> CgroupStats {
        let mut out = CgroupStats::default();
        for p in parts {
            out.cpu = match (out.cpu, p.cpu) {
                (Some(a), Some(b)) => Some(CpuStats {
                    usage_ns: a.usage_ns.saturating_add(b.usage_ns),
                    user_ns: add_opt(a.user_ns, b.user_ns),
                    system_ns: add_opt(a.system_ns, b.system_ns),
                }),
                (a, b) => a.or(b),
            };
            out.memory = match (out.memory, p.memory) {
                (Some(a), Some(b)) => Some(MemoryStats {
                    usage: a.usage.saturating_add(b.usage),
                    working_set: a.working_set.saturating_add(b.working_set),
                    rss: a.rss.saturating_add(b.rss),
                    cache: a.cache.saturating_add(b.cache),
                    mapped_file: a.mapped_file.saturating_add(b.mapped_file),
                    page_faults: a.page_faults.saturating_add(b.page_faults),
                    major_page_faults: a.major_page_faults.saturating_add(b.major_page_faults),
                    limit: None,
                    max_usage: None,
                    failcnt: add_opt(a.failcnt, b.failcnt),
                }),
                (a, b) => a.or(b).map(|m| MemoryStats {
                    limit: None,
                    max_usage: None,
                    ..m
                }),
            };
            out.pids = add_opt(out.pids, p.pids);
        }
        out
    }
}

/// Where a cgroup is, relative to the mount of each hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupPath {
    /// v1: each controller's path in its own hierarchy.
    V1(HashMap<String, String>),
    /// v2: the path in the unified hierarchy.
    V2(String),
}

/// cgroupfs, mounted at `root` (tests point it at a fixture directory).
#[derive(Debug, Clone)]
pub struct CgroupFs {
    root: PathBuf,
    /// Which hierarchy holds the controllers: v1 (pure or hybrid) has a directory per
    /// controller under `root`, v2 is `root` itself.
    hierarchy: Hierarchy,
    /// Clock ticks per second, the unit of v1's `cpuacct.stat`.
    ticks_per_second: u64,
}

impl CgroupFs {
    /// The host's cgroupfs.
    pub fn host() -> Self {
        // SAFETY: sysconf only reads a constant of the C library.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        Self::at(
            PathBuf::from(CGROUP_ROOT),
            if ticks > 0 { ticks as u64 } else { 100 },
            // The rule the shim follows too: v2 only when no v1 controller is mounted, so a
            // hybrid host (v1 controllers, v2 only for systemd) is v1.
            Hierarchy::of_host(),
        )
    }

    /// cgroupfs mounted at `root` with the controllers in `hierarchy`, v1's `cpuacct.stat`
    /// counting `ticks_per_second`.
    pub fn at(root: PathBuf, ticks_per_second: u64, hierarchy: Hierarchy) -> Self {
        Self {
            root,
            hierarchy,
            ticks_per_second,
        }
    }

    /// Whether the controllers are in the unified hierarchy (v2).
    pub fn is_v2(&self) -> bool {
        self.hierarchy == Hierarchy::Unified
    }

    /// The cgroup of process `pid`, from the text of its `/proc/<pid>/cgroup`.
    pub fn path_of_process(&self, proc_cgroup: &str) -> CgroupPath {
        let v2 = self.is_v2();
        let mut v1 = HashMap::new();
        // A line without the kernel's format is skipped: the text is the kernel's.
        for line in proc_cgroup.lines().filter_map(ProcCgroupLine::parse) {
            match line {
                ProcCgroupLine::Unified(path) if v2 => return CgroupPath::V2(path.to_string()),
                ProcCgroupLine::Unified(_) => {}
                ProcCgroupLine::V1 { names, path } => {
                    for c in names {
                        v1.insert(c.to_string(), path.to_string());
                    }
                }
            }
        }
        if v2 {
            // No unified entry: the process is gone or the text is not a cgroup file.
            CgroupPath::V2(String::new())
        } else {
            CgroupPath::V1(v1)
        }
    }

    /// The cgroup at `path` in every hierarchy (a pod's cgroup, see
    /// [`crate::spec::cgroups::pod_cgroup_dir`]).
    pub fn path_of_dir(&self, path: &str) -> CgroupPath {
        let path = path.to_string();
        if self.is_v2() {
            CgroupPath::V2(path)
        } else {
            CgroupPath::V1(
                ["cpuacct", "cpu", "memory", "pids"]
                    .iter()
                    .map(|c| (c.to_string(), path.clone()))
                    .collect(),
            )
        }
    }

    /// Whether the cgroup exists (its memory controller's directory, or its v2 directory).
    pub fn exists(&self, path: &CgroupPath) -> bool {
        match path {
            CgroupPath::V1(paths) => paths
                .get("memory")
                .is_some_and(|p| self.v1_dir("memory", p).is_dir()),
            CgroupPath::V2(p) => !p.is_empty() && self.v2_dir(p).is_dir(),
        }
    }

    pub(super) fn v1_dir(&self, controller: &str, path: &str) -> PathBuf {
        self.root
            .join(controller)
            .join(path.trim_start_matches('/'))
    }

    pub(super) fn v2_dir(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }

    /// Reads the cgroup's figures; what cannot be read is `None`.
    pub fn read(&self, path: &CgroupPath) -> CgroupStats {
        match path {
            CgroupPath::V1(paths) => {
                let dir = |c: &str| paths.get(c).map(|p| self.v1_dir(c, p));
                CgroupStats {
                    cpu: dir("cpuacct").and_then(|d| self.v1_cpu(&d)),
                    memory: dir("memory").and_then(|d| v1_memory(&d)),
                    pids: dir("pids").and_then(|d| read_u64(&d.join("pids.current"))),
                    // Upstream v1 hierarchies have no pressure files (as containerd: none).
                    pressure: Pressure::default(),
                }
            }
            CgroupPath::V2(p) if p.is_empty() => CgroupStats::default(),
            CgroupPath::V2(p) => {
                let d = self.v2_dir(p);
                CgroupStats {
                    cpu: v2_cpu(&d),
                    memory: v2_memory(&d),
                    pids: read_u64(&d.join("pids.current")),
                    pressure: Pressure {
                        cpu: read_psi(&d.join("cpu.pressure")),
                        memory: read_psi(&d.join("memory.pressure")),
                        io: read_psi(&d.join("io.pressure")),
                    },
                }
            }
        }
    }

    fn v1_cpu(&self, dir: &Path) -> Option<CpuStats> {
        let usage_ns = read_u64(&dir.join("cpuacct.usage"))?;
        let stat = read_keyed(&dir.join("cpuacct.stat"));
        let ns = |ticks: u64| ticks.saturating_mul(1_000_000_000 / self.ticks_per_second.max(1));
        Some(CpuStats {
            usage_ns,
            user_ns: stat.get("user").copied().map(ns),
            system_ns: stat.get("system").copied().map(ns),
        })
    }
}

fn v1_memory(dir: &Path) -> Option<MemoryStats> {
    let usage = read_u64(&dir.join("memory.usage_in_bytes"))?;
    let stat = read_keyed(&dir.join("memory.stat"));
    let get = |k: &str| stat.get(k).copied().unwrap_or(0);
    Some(MemoryStats {
        usage,
        working_set: usage.saturating_sub(get("total_inactive_file")),
        rss: get("total_rss"),
        cache: get("total_cache"),
        mapped_file: get("total_mapped_file"),
        page_faults: get("total_pgfault"),
        major_page_faults: get("total_pgmajfault"),
        limit: read_u64(&dir.join("memory.limit_in_bytes")).filter(|l| *l < UNLIMITED),
        max_usage: read_u64(&dir.join("memory.max_usage_in_bytes")),
        failcnt: read_u64(&dir.join("memory.failcnt")),
    })
}

fn v2_cpu(dir: &Path) -> Option<CpuStats> {
    let stat = read_keyed(&dir.join("cpu.stat"));
    let us = |k: &str| stat.get(k).map(|v| v.saturating_mul(1000));
    Some(CpuStats {
        usage_ns: us("usage_usec")?,
        user_ns: us("user_usec"),
        system_ns: us("system_usec"),
    })
}

fn v2_memory(dir: &Path) -> Option<MemoryStats> {
    let usage = read_u64(&dir.join("memory.current"))?;
    let stat = read_keyed(&dir.join("memory.stat"));
    let get = |k: &str| stat.get(k).copied().unwrap_or(0);
    Some(MemoryStats {
        usage,
        working_set: usage.saturating_sub(get("inactive_file")),
        rss: get("anon"),
        cache: get("file"),
        mapped_file: get("file_mapped"),
        page_faults: get("pgfault"),
        major_page_faults: get("pgmajfault"),
        // "max" (no limit) does not parse.
        limit: read_u64(&dir.join("memory.max")),
        max_usage: read_u64(&dir.join("memory.peak")),
        failcnt: None,
    })
}

/// The most a pressure file is read: the kernel writes two lines of under 80 bytes.
const PSI_FILE_CAP: u64 = 4096;

/// A pressure file's figures; `None` if it cannot be read, is larger than [`PSI_FILE_CAP`] or
/// is not in the kernel's format.
fn read_psi(path: &Path) -> Option<PsiStats> {
    parse_psi(&read_capped(path, PSI_FILE_CAP)?)
}

/// The text of a pressure file:
///
/// ```text
/// some avg10=0.12 avg60=0.05 avg300=0.01 total=123456
/// full avg10=0.00 avg60=0.00 avg300=0.00 total=4567
/// ```
///
/// `None` unless it has a `some` or a `full` line, and if either of them is malformed (a field
/// missing, repeated or not a number, an average not a finite share ≥ 0, the line repeated):
/// figures from a file we cannot make sense of are not reported. Lines of other kinds and
/// fields of other names are left for kernels to come.
pub fn parse_psi(text: &str) -> Option<PsiStats> {
    let mut out = PsiStats::default();
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let slot = match fields.next() {
            Some("some") => &mut out.some,
            Some("full") => &mut out.full,
            _ => continue,
        };
        if slot.is_some() {
            return None;
        }
        *slot = Some(parse_psi_line(fields)?);
    }
    (out.some.is_some() || out.full.is_some()).then_some(out)
}

/// The `avg10=… avg60=… avg300=… total=…` fields of one line, each exactly once.
fn parse_psi_line<'a>(fields: impl Iterator<Item = &'a str>) -> Option<PsiData> {
    let (mut avg10, mut avg60, mut avg300, mut total) = (None, None, None, None);
    let avg = |v: &str| v.parse::<f64>().ok().filter(|a| a.is_finite() && *a >= 0.0);
    for field in fields {
        let (key, value) = field.split_once('=')?;
        let (slot, parsed) = match key {
            "avg10" => (&mut avg10, avg(value)),
            "avg60" => (&mut avg60, avg(value)),
            "avg300" => (&mut avg300, avg(value)),
            "total" => {
                if total.is_some() {
                    return None;
                }
                total = Some(value.parse::<u64>().ok()?);
                continue;
            }
            _ => continue,
        };
        if slot.is_some() {
            return None;
        }
        *slot = Some(parsed?);
    }
    Some(PsiData {
        total_us: total?,
        avg10: avg10?,
        avg60: avg60?,
        avg300: avg300?,
    })
}

/// The most the stats readers take of one cgroupfs or procfs file. The largest they read
/// (`memory.stat`, a pod's `/proc/<pid>/net/dev`, `io.stat`) hold a few KiB; a file larger than
/// this is not the kernel's, and is no figure rather than an unbounded read on a stats call.
pub(crate) const FILE_CAP: u64 = 64 * 1024;

/// The text of `path`, if it can be read and holds at most `cap` bytes.
pub(crate) fn read_capped(path: &Path, cap: u64) -> Option<String> {
    let mut text = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(cap + 1)
        .read_to_string(&mut text)
        .ok()?;
    (text.len() as u64 <= cap).then_some(text)
}

/// The text of `path` (at most [`FILE_CAP`] bytes).
pub(crate) fn read_small(path: &Path) -> Option<String> {
    read_capped(path, FILE_CAP)
}

/// A file holding one number.
pub(super) fn read_u64(path: &Path) -> Option<u64> {
    read_small(path)?.trim().parse().ok()
}

/// A `key value` per line file (`memory.stat`, `cpu.stat`, `cpuacct.stat`).
pub(super) fn read_keyed(path: &Path) -> HashMap<String, u64> {
    let text = read_small(path).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `cpu.pressure` of a busy container's cgroup (Linux 6.8).
    const CPU_PRESSURE: &str = "some avg10=12.34 avg60=5.06 avg300=1.20 total=98765432\n\
                                full avg10=3.50 avg60=1.25 avg300=0.30 total=12345678\n";
    /// `cpu.pressure` before Linux 5.13: no `full` line.
    const CPU_PRESSURE_OLD: &str = "some avg10=0.00 avg60=0.17 avg300=0.04 total=2040712\n";
    /// `memory.pressure` of an idle cgroup.
    const MEMORY_PRESSURE: &str = "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n\
                                   full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
    /// `io.pressure`.
    const IO_PRESSURE: &str = "some avg10=1.00 avg60=0.50 avg300=0.10 total=4242\n\
                               full avg10=0.75 avg60=0.25 avg300=0.05 total=2121\n";

    fn data(total_us: u64, avg10: f64, avg60: f64, avg300: f64) -> PsiData {
        PsiData {
            total_us,
            avg10,
            avg60,
            avg300,
        }
    }

    #[test]
    fn psi_some_and_full() {
        assert_eq!(
            parse_psi(CPU_PRESSURE),
            Some(PsiStats {
                some: Some(data(98765432, 12.34, 5.06, 1.20)),
                full: Some(data(12345678, 3.50, 1.25, 0.30)),
            })
        );
        assert_eq!(
            parse_psi(MEMORY_PRESSURE),
            Some(PsiStats {
                some: Some(PsiData::default()),
                full: Some(PsiData::default()),
            }),
            "no stall is zero, not nothing"
        );
    }

    #[test]
    fn psi_without_full_has_some_alone() {
        assert_eq!(
            parse_psi(CPU_PRESSURE_OLD),
            Some(PsiStats {
                some: Some(data(2040712, 0.0, 0.17, 0.04)),
                full: None,
            })
        );
    }

    #[test]
    fn psi_ignores_what_later_kernels_may_add() {
        let text = "some avg10=1.00 avg60=2.00 avg300=3.00 total=4 avg1200=5.00\n\
                    burst avg10=9.00\n";
        assert_eq!(
            parse_psi(text),
            Some(PsiStats {
                some: Some(data(4, 1.0, 2.0, 3.0)),
                full: None,
            })
        );
    }

    #[test]
    fn malformed_psi_is_absent() {
        for text in [
            "",
            "\n",
            "garbage\n",
            // A field missing, not a number, without a value, negative, not finite, repeated.
            "some avg10=0.00 avg60=0.00 total=1\n",
            "some avg10=0.00 avg60=0.00 avg300=0.00\n",
            "some avg10=x avg60=0.00 avg300=0.00 total=1\n",
            "some avg10=0.00 avg60=0.00 avg300=0.00 total=-1\n",
            "some avg10=0.00 avg60=0.00 avg300=0.00 total=1.5\n",
            "some avg10 avg60=0.00 avg300=0.00 total=1\n",
            "some avg10=-1.00 avg60=0.00 avg300=0.00 total=1\n",
            "some avg10=NaN avg60=0.00 avg300=0.00 total=1\n",
            "some avg10=inf avg60=0.00 avg300=0.00 total=1\n",
            "some avg10=1.00 avg10=2.00 avg60=0.00 avg300=0.00 total=1\n",
            "some avg10=0.00 avg60=0.00 avg300=0.00 total=1 total=2\n",
            "some\n",
            // One good line does not make up for a bad one, nor is a line taken twice.
            "some avg10=0.00 avg60=0.00 avg300=0.00 total=1\nfull avg10=0.00\n",
            "some avg10=0.00 avg60=0.00 avg300=0.00 total=1\n\
             some avg10=0.00 avg60=0.00 avg300=0.00 total=2\n",
        ] {
            assert_eq!(parse_psi(text), None, "{text:?}");
        }
    }

    fn write(dir: &Path, file: &str, text: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(file), text).unwrap();
    }

    /// A v1 fixture: cgroup `/kubepods/pod1` with every file the reader looks at.
    fn v1_fixture() -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let cpu = r.join("cpuacct/kubepods/pod1");
        write(&cpu, "cpuacct.usage", "2500000000\n");
        write(&cpu, "cpuacct.stat", "user 150\nsystem 50\n");
        let mem = r.join("memory/kubepods/pod1");
        write(&mem, "memory.usage_in_bytes", "104857600\n");
        write(
            &mem,
            "memory.stat",
            "cache 1\nrss 2\ntotal_cache 41943040\ntotal_rss 52428800\n\
             total_mapped_file 4096\ntotal_inactive_file 20971520\ntotal_pgfault 900\n\
             total_pgmajfault 3\n",
        );
        write(&mem, "memory.limit_in_bytes", "9223372036854771712\n");
        write(&mem, "memory.max_usage_in_bytes", "209715200\n");
        write(&mem, "memory.failcnt", "0\n");
        write(&r.join("pids/kubepods/pod1"), "pids.current", "7\n");
        root
    }

    #[test]
    fn v1_figures_of_a_pod_cgroup() {
        let root = v1_fixture();
        let fs = CgroupFs::at(root.path().to_path_buf(), 100, Hierarchy::V1);
        let path = fs.path_of_dir("/kubepods/pod1");
        assert!(fs.exists(&path));
        let s = fs.read(&path);
        assert_eq!(
            s.cpu,
            Some(CpuStats {
                usage_ns: 2_500_000_000,
                user_ns: Some(1_500_000_000),
                system_ns: Some(500_000_000),
            })
        );
        let m = s.memory.expect("memory");
        assert_eq!(m.usage, 100 << 20);
        assert_eq!(m.working_set, 80 << 20, "usage minus total_inactive_file");
        assert_eq!((m.rss, m.cache, m.mapped_file), (50 << 20, 40 << 20, 4096));
        assert_eq!((m.page_faults, m.major_page_faults), (900, 3));
        assert_eq!(m.limit, None, "the kernel's unlimited is no limit");
        assert_eq!((m.max_usage, m.failcnt), (Some(200 << 20), Some(0)));
        assert_eq!(s.pids, Some(7));
    }

    #[test]
    fn v1_process_cgroup_per_controller() {
        let root = v1_fixture();
        let fs = CgroupFs::at(root.path().to_path_buf(), 100, Hierarchy::V1);
        let text = "12:pids:/kubepods/pod1\n4:memory:/kubepods/pod1\n\
                    3:cpu,cpuacct:/kubepods/pod1\n1:name=systemd:/x\n0::/\n";
        let path = fs.path_of_process(text);
        let CgroupPath::V1(ref paths) = path else {
            panic!("v1 expected: {path:?}")
        };
        assert_eq!(paths["cpuacct"], "/kubepods/pod1");
        assert_eq!(paths["cpu"], "/kubepods/pod1");
        assert_eq!(fs.read(&path).pids, Some(7));
        assert_eq!(fs.read(&path).memory.map(|m| m.usage), Some(100 << 20));
    }

    #[test]
    fn a_missing_cgroup_reads_as_nothing() {
        let root = v1_fixture();
        let fs = CgroupFs::at(root.path().to_path_buf(), 100, Hierarchy::V1);
        let path = fs.path_of_dir("/kubepods/gone");
        assert!(!fs.exists(&path));
        assert_eq!(fs.read(&path), CgroupStats::default());
    }

    #[test]
    fn v2_figures_and_process_path() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        write(r, "cgroup.controllers", "cpu memory pids\n");
        let d = r.join("kubepods.slice/pod1.slice/ctr.scope");
        write(
            &d,
            "cpu.stat",
            "usage_usec 3000\nuser_usec 2000\nsystem_usec 1000\n",
        );
        write(&d, "memory.current", "1000000\n");
        write(
            &d,
            "memory.stat",
            "anon 600000\nfile 300000\nfile_mapped 100\ninactive_file 250000\n\
             pgfault 10\npgmajfault 1\n",
        );
        write(&d, "memory.max", "max\n");
        write(&d, "pids.current", "2\n");
        let fs = CgroupFs::at(r.to_path_buf(), 100, Hierarchy::Unified);
        let path = fs.path_of_process("0::/kubepods.slice/pod1.slice/ctr.scope\n");
        assert_eq!(
            path,
            CgroupPath::V2("/kubepods.slice/pod1.slice/ctr.scope".into())
        );
        assert!(fs.exists(&path));
        let s = fs.read(&path);
        assert_eq!(
            s.cpu,
            Some(CpuStats {
                usage_ns: 3_000_000,
                user_ns: Some(2_000_000),
                system_ns: Some(1_000_000),
            })
        );
        let m = s.memory.unwrap();
        assert_eq!(
            (m.usage, m.working_set, m.rss),
            (1_000_000, 750_000, 600_000)
        );
        assert_eq!((m.cache, m.limit, m.failcnt), (300_000, None, None));
        assert_eq!(s.pids, Some(2));
        assert_eq!(
            s.pressure,
            Pressure::default(),
            "no pressure files (a kernel without PSI): no pressure"
        );

        write(&d, "memory.max", "536870912\n");
        assert_eq!(fs.read(&path).memory.unwrap().limit, Some(512 << 20));
        assert_eq!(
            fs.read(&fs.path_of_process("")),
            CgroupStats::default(),
            "a process without a unified entry has no figures"
        );
    }

    /// A v2 fixture: cgroup `/kubepods.slice/pod1.slice` with cpu.stat and the pressure files.
    fn v2_pressure_fixture() -> (tempfile::TempDir, PathBuf) {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        write(r, "cgroup.controllers", "cpu memory io pids\n");
        let d = r.join("kubepods.slice/pod1.slice");
        write(&d, "cpu.stat", "usage_usec 3000\n");
        write(&d, "cpu.pressure", CPU_PRESSURE);
        write(&d, "memory.pressure", MEMORY_PRESSURE);
        write(&d, "io.pressure", IO_PRESSURE);
        (root, d)
    }

    #[test]
    fn v2_pressure_of_cpu_memory_and_io() {
        let (root, _) = v2_pressure_fixture();
        let fs = CgroupFs::at(root.path().to_path_buf(), 100, Hierarchy::Unified);
        let s = fs.read(&fs.path_of_dir("/kubepods.slice/pod1.slice"));
        assert_eq!(
            s.pressure,
            Pressure {
                cpu: parse_psi(CPU_PRESSURE),
                memory: parse_psi(MEMORY_PRESSURE),
                io: parse_psi(IO_PRESSURE),
            }
        );
        assert_eq!(
            s.pressure.io.and_then(|p| p.full).map(|f| f.total_us),
            Some(2121)
        );
        assert_eq!(s.cpu.map(|c| c.usage_ns), Some(3_000_000));
    }

    #[test]
    fn v2_pressure_missing_unreadable_or_oversized_is_absent() {
        let (root, d) = v2_pressure_fixture();
        let fs = CgroupFs::at(root.path().to_path_buf(), 100, Hierarchy::Unified);
        let path = fs.path_of_dir("/kubepods.slice/pod1.slice");
        // cpu.pressure of a kernel before 5.13: `some` alone.
        write(&d, "cpu.pressure", CPU_PRESSURE_OLD);
        // Opens but does not read, as with `psi=0` (EOPNOTSUPP); here EISDIR.
        std::fs::remove_file(d.join("memory.pressure")).unwrap();
        std::fs::create_dir(d.join("memory.pressure")).unwrap();
        // Good lines, then more than a pressure file ever holds.
        write(
            &d,
            "io.pressure",
            &format!("{IO_PRESSURE}{}", " ".repeat(PSI_FILE_CAP as usize)),
        );
        let s = fs.read(&path);
        assert_eq!(
            s.pressure,
            Pressure {
                cpu: Some(PsiStats {
                    some: Some(data(2040712, 0.0, 0.17, 0.04)),
                    full: None,
                }),
                memory: None,
                io: None,
            }
        );
        assert_eq!(
            s.cpu.map(|c| c.usage_ns),
            Some(3_000_000),
            "the other figures still count"
        );
        std::fs::remove_file(d.join("cpu.pressure")).unwrap();
        assert_eq!(fs.read(&path).pressure.cpu, None, "missing");
        write(&d, "io.pressure", IO_PRESSURE);
        assert_eq!(fs.read(&path).pressure.io, parse_psi(IO_PRESSURE));
    }

    #[test]
    fn a_file_larger_than_the_cap_is_no_figure() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        write(r, "cgroup.controllers", "cpu memory pids\n");
        let d = r.join("pod1");
        write(&d, "cpu.stat", "usage_usec 3000\n");
        write(&d, "pids.current", "2\n");
        let fs = CgroupFs::at(r.to_path_buf(), 100, Hierarchy::Unified);
        let path = fs.path_of_dir("/pod1");
        assert_eq!(fs.read(&path).cpu.map(|c| c.usage_ns), Some(3_000_000));
        // Good figures, then more than any cgroup file holds: not read to the end.
        let padding = "x".repeat(FILE_CAP as usize);
        write(&d, "cpu.stat", &format!("usage_usec 3000\n{padding}"));
        write(
            &d,
            "pids.current",
            &format!("2{}", " ".repeat(FILE_CAP as usize)),
        );
        let s = fs.read(&path);
        assert_eq!((s.cpu, s.pids), (None, None));
        assert_eq!(read_capped(&d.join("cpu.stat"), FILE_CAP), None);
        assert!(read_capped(&d.join("cpu.stat"), 2 * FILE_CAP).is_some());
    }

    #[test]
    fn v1_has_no_pressure() {
        let root = v1_fixture();
        let r = root.path();
        // Even were a pressure file in a v1 hierarchy (it is not), v1 has no PSI to read.
        write(
            &r.join("cpuacct/kubepods/pod1"),
            "cpu.pressure",
            CPU_PRESSURE,
        );
        let fs = CgroupFs::at(r.to_path_buf(), 100, Hierarchy::V1);
        let s = fs.read(&fs.path_of_dir("/kubepods/pod1"));
        assert!(s.cpu.is_some());
        assert_eq!(s.pressure, Pressure::default());
    }

    #[test]
    fn sums_add_figures_and_drop_limits() {
        let a = CgroupStats {
            cpu: Some(CpuStats {
                usage_ns: 10,
                user_ns: Some(6),
                system_ns: None,
            }),
            memory: Some(MemoryStats {
                usage: 100,
                working_set: 80,
                limit: Some(1000),
                ..Default::default()
            }),
            pids: Some(1),
            pressure: Pressure {
                cpu: parse_psi(CPU_PRESSURE),
                ..Default::default()
            },
        };
        let b = CgroupStats {
            cpu: Some(CpuStats {
                usage_ns: 5,
                user_ns: Some(4),
                system_ns: Some(1),
            }),
            memory: None,
            pids: Some(2),
            pressure: Pressure {
                io: parse_psi(IO_PRESSURE),
                ..Default::default()
            },
        };
        let s = CgroupStats::sum([&a, &b, &CgroupStats::default()]);
        assert_eq!(
            s.cpu,
            Some(CpuStats {
                usage_ns: 15,
                user_ns: Some(10),
                system_ns: Some(1),
            })
        );
        let m = s.memory.unwrap();
        assert_eq!((m.usage, m.working_set, m.limit), (100, 80, None));
        assert_eq!(s.pids, Some(3));
        assert_eq!(
            s.pressure,
            Pressure::default(),
            "pressure of several cgroups does not add up"
        );
        assert_eq!(CgroupStats::sum([]), CgroupStats::default());
    }

    #[test]
    fn psi_of_this_kernel() {
        // The system-wide files are in the cgroup files' format; a kernel without PSI (or with
        // `psi=0`) has none or fails the read, and there is nothing to check.
        for file in ["cpu", "memory", "io"] {
            let path = Path::new("/proc/pressure").join(file);
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            let psi = parse_psi(&text);
            assert!(psi.is_some_and(|p| p.some.is_some()), "{path:?}: {text:?}");
            // Read again: the averages move between reads, so only its having them is checked.
            assert!(read_psi(&path).is_some(), "{path:?}");
        }
    }

    #[test]
    fn reads_this_process_cgroups() {
        let fs = CgroupFs::host();
        let text = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let s = fs.read(&fs.path_of_process(&text));
        let m = s.memory.expect("memory stats of this process");
        assert!(m.usage > 0 && m.working_set <= m.usage, "{m:?}");
    }
}
