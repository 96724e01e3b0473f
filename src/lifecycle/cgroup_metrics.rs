//! The figures of a container's cgroup that only the cAdvisor metrics report (ListPodSandboxMetrics),
//! besides what [`super::cgroup_stats`] reads for the stats RPCs: CFS throttling, kernel and
//! swap memory, active and inactive file pages, OOM kills, the pids limit, the cgroup's own
//! limits (the `container_spec_*` metrics, read back from the cgroup as cAdvisor does), block
//! IO per device, and the processes in the cgroup (for file descriptor and socket counts).
//!
//! v1 and v2 files as containerd's cgroups library and cAdvisor read them. Nothing here is an
//! error: a file that is missing or not a number is a figure not reported.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use super::cgroup_stats::{read_keyed, read_small, read_u64, CgroupFs, CgroupPath};

/// Limits at or above this are the kernel's "no limit" (as in [`super::cgroup_stats`]).
const UNLIMITED: u64 = 1 << 62;

/// Most processes of one cgroup whose descriptors are counted (a fork bomb must not make a
/// metrics call read millions of directories).
pub const MAX_COUNTED_PROCS: usize = 4096;

/// CFS bandwidth enforcement of a cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Throttling {
    /// Enforcement periods elapsed.
    pub periods: u64,
    /// Periods in which the cgroup was throttled.
    pub throttled_periods: u64,
    /// Time throttled, ns.
    pub throttled_ns: u64,
}

/// Block IO of a cgroup on one device.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceIo {
    /// The device as the metrics name it: `/dev/<name>` where sysfs knows it, else
    /// `major:minor`.
    pub device: String,
    /// Major number.
    pub major: u64,
    /// Minor number.
    pub minor: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// Reads completed.
    pub reads: u64,
    /// Writes completed.
    pub writes: u64,
}

/// What a cgroup's metrics need beyond [`super::cgroup_stats::CgroupStats`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CgroupExtras {
    /// CFS throttling.
    pub throttling: Option<Throttling>,
    /// Kernel memory (v1 `memory.kmem.usage_in_bytes`, v2 `kernel` of `memory.stat`).
    pub kernel_usage: Option<u64>,
    /// Swap in use (v1 memory+swap minus memory, v2 `memory.swap.current`).
    pub swap: Option<u64>,
    /// Active file pages.
    pub active_file: Option<u64>,
    /// Inactive file pages.
    pub inactive_file: Option<u64>,
    /// Processes killed by the OOM killer in the cgroup.
    pub oom_kills: Option<u64>,
    /// `pids.max`; 0 when unlimited.
    pub pids_max: Option<u64>,
    /// CFS period (µs).
    pub cpu_period: Option<u64>,
    /// CPU shares (v2: converted back from `cpu.weight`).
    pub cpu_shares: Option<u64>,
    /// Memory + swap limit (v1) or swap limit (v2), bytes; 0 when unlimited.
    pub memory_swap_limit: Option<u64>,
    /// Block IO per device.
    pub io: Vec<DeviceIo>,
    /// The processes in the cgroup (at most [`MAX_COUNTED_PROCS`]).
    pub procs: Vec<u32>,
}

/// A limit file: a number, or `max` / the kernel's "unlimited" as 0.
fn read_limit(path: &Path) -> Option<u64> {
    let text = read_small(path)?;
    let text = text.trim();
    if text == "max" {
        return Some(0);
    }
    text.parse()
        .ok()
        .map(|v: u64| if v >= UNLIMITED { 0 } else { v })
}

/// The bytes of `cgroup.procs` that hold [`MAX_COUNTED_PROCS`] pids (a pid has at most 7
/// digits, `pid_max` being at most 2^22, and a newline).
const PROCS_CAP: u64 = MAX_COUNTED_PROCS as u64 * 8;

fn read_procs(dir: &Path) -> Vec<u32> {
    // A longer file is cut at PROCS_CAP: its first pids, the last line left out if cut short.
    let mut text = String::new();
    let _ = std::fs::File::open(dir.join("cgroup.procs"))
        .and_then(|f| f.take(PROCS_CAP).read_to_string(&mut text));
    if text.len() as u64 == PROCS_CAP && !text.ends_with('\n') {
        let whole = text.rfind('\n').map_or(0, |i| i + 1);
        text.truncate(whole);
    }
    text.lines()
        .filter_map(|l| l.trim().parse().ok())
        .take(MAX_COUNTED_PROCS)
        .collect()
}

/// `major:minor` → `(major, minor)`.
fn dev_numbers(s: &str) -> Option<(u64, u64)> {
    let (a, b) = s.split_once(':')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// The device's name from sysfs (`/sys/dev/block/M:m` links to its directory).
fn device_name(major: u64, minor: u64) -> String {
    std::fs::read_link(format!("/sys/dev/block/{major}:{minor}"))
        .ok()
        .and_then(|p| {
            p.file_name()
                .map(|n| format!("/dev/{}", n.to_string_lossy()))
        })
        .unwrap_or_else(|| format!("{major}:{minor}"))
}

/// v1 `blkio.throttle.io_service_bytes_recursive` / `io_serviced_recursive`: `M:m Op value`
/// lines (and a `Total` line). Returns (device → (read, write)).
fn parse_v1_blkio(text: &str) -> HashMap<(u64, u64), (u64, u64)> {
    let mut out: HashMap<(u64, u64), (u64, u64)> = HashMap::new();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let (Some(dev), Some(op), Some(v)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let (Some(dev), Ok(v)) = (dev_numbers(dev), v.parse::<u64>()) else {
            continue;
        };
        let e = out.entry(dev).or_default();
        match op {
            "Read" => e.0 = v,
            "Write" => e.1 = v,
            _ => {}
        }
    }
    out
}

/// v2 `io.stat`: `M:m rbytes=… wbytes=… rios=… wios=… …` lines.
pub fn parse_io_stat(text: &str) -> Vec<DeviceIo> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let Some((major, minor)) = f.next().and_then(dev_numbers) else {
            continue;
        };
        let mut d = DeviceIo {
            major,
            minor,
            ..Default::default()
        };
        for kv in f {
            let Some((k, v)) = kv.split_once('=') else {
                continue;
            };
            let Ok(v) = v.parse() else { continue };
            match k {
                "rbytes" => d.read_bytes = v,
                "wbytes" => d.write_bytes = v,
                "rios" => d.reads = v,
                "wios" => d.writes = v,
                _ => {}
            }
        }
        out.push(d);
    }
    out
}

/// cgroup v2 `cpu.weight` (1..=10000) back to v1 shares (2..=262144), the inverse of the
/// conversion runc applies (`1 + (shares - 2) * 9999 / 262142`); both round down, so 1024
/// shares come back as 998.
fn weight_to_shares(weight: u64) -> u64 {
    2 + (weight.clamp(1, 10_000) - 1) * 262_142 / 9_999
}

impl CgroupFs {
    /// The metrics-only figures of the cgroup at `path`.
    pub fn read_extras(&self, path: &CgroupPath) -> CgroupExtras {
        let mut out = match path {
            CgroupPath::V1(paths) => {
                let dir = |c: &str| paths.get(c).map(|p| self.v1_dir(c, p));
                let mut out = CgroupExtras::default();
                if let Some(d) = dir("cpu") {
                    let s = read_keyed(&d.join("cpu.stat"));
                    if let (Some(p), Some(t)) = (s.get("nr_periods"), s.get("nr_throttled")) {
                        out.throttling = Some(Throttling {
                            periods: *p,
                            throttled_periods: *t,
                            throttled_ns: s.get("throttled_time").copied().unwrap_or(0),
                        });
                    }
                    out.cpu_period = read_u64(&d.join("cpu.cfs_period_us"));
                    out.cpu_shares = read_u64(&d.join("cpu.shares"));
                }
                if let Some(d) = dir("memory") {
                    out.kernel_usage = read_u64(&d.join("memory.kmem.usage_in_bytes"));
                    if let (Some(both), Some(mem)) = (
                        read_u64(&d.join("memory.memsw.usage_in_bytes")),
                        read_u64(&d.join("memory.usage_in_bytes")),
                    ) {
                        out.swap = Some(both.saturating_sub(mem));
                    }
                    let s = read_keyed(&d.join("memory.stat"));
                    out.active_file = s.get("total_active_file").copied();
                    out.inactive_file = s.get("total_inactive_file").copied();
                    out.oom_kills = read_keyed(&d.join("memory.oom_control"))
                        .get("oom_kill")
                        .copied();
                    out.memory_swap_limit = read_limit(&d.join("memory.memsw.limit_in_bytes"));
                    out.procs = read_procs(&d);
                }
                if let Some(d) = dir("pids") {
                    out.pids_max = read_limit(&d.join("pids.max"));
                }
                if let Some(d) = dir("blkio") {
                    let read =
                        |f: &str| parse_v1_blkio(&read_small(&d.join(f)).unwrap_or_default());
                    let bytes = read("blkio.throttle.io_service_bytes_recursive");
                    let ops = read("blkio.throttle.io_serviced_recursive");
                    let mut devs: Vec<_> = bytes.keys().chain(ops.keys()).copied().collect();
                    devs.sort_unstable();
                    devs.dedup();
                    out.io = devs
                        .into_iter()
                        .map(|(major, minor)| {
                            let (rb, wb) = bytes.get(&(major, minor)).copied().unwrap_or_default();
                            let (r, w) = ops.get(&(major, minor)).copied().unwrap_or_default();
                            DeviceIo {
                                device: String::new(),
                                major,
                                minor,
                                read_bytes: rb,
                                write_bytes: wb,
                                reads: r,
                                writes: w,
                            }
                        })
                        .collect();
                }
                out
            }
            CgroupPath::V2(p) if p.is_empty() => CgroupExtras::default(),
            CgroupPath::V2(p) => {
                let d = self.v2_dir(p);
                let cpu = read_keyed(&d.join("cpu.stat"));
                let mem = read_keyed(&d.join("memory.stat"));
                let period = read_small(&d.join("cpu.max"))
                    .and_then(|t| t.split_whitespace().nth(1)?.parse().ok());
                CgroupExtras {
                    throttling: match (cpu.get("nr_periods"), cpu.get("nr_throttled")) {
                        (Some(p), Some(t)) => Some(Throttling {
                            periods: *p,
                            throttled_periods: *t,
                            throttled_ns: cpu
                                .get("throttled_usec")
                                .map_or(0, |u| u.saturating_mul(1000)),
                        }),
                        _ => None,
                    },
                    kernel_usage: mem
                        .get("kernel")
                        .or_else(|| mem.get("kernel_stack"))
                        .copied(),
                    swap: read_u64(&d.join("memory.swap.current")),
                    active_file: mem.get("active_file").copied(),
                    inactive_file: mem.get("inactive_file").copied(),
                    oom_kills: read_keyed(&d.join("memory.events"))
                        .get("oom_kill")
                        .copied(),
                    pids_max: read_limit(&d.join("pids.max")),
                    cpu_period: period,
                    cpu_shares: read_u64(&d.join("cpu.weight")).map(weight_to_shares),
                    memory_swap_limit: read_limit(&d.join("memory.swap.max")),
                    io: parse_io_stat(&read_small(&d.join("io.stat")).unwrap_or_default()),
                    procs: read_procs(&d),
                }
            }
        };
        for d in &mut out.io {
            d.device = device_name(d.major, d.minor);
        }
        out
    }
}

/// Open file descriptors and, of them, sockets, over `pids` (`/proc/<pid>/fd`); a process
/// gone meanwhile counts nothing.
pub fn count_descriptors(pids: &[u32]) -> (u64, u64) {
    let (mut fds, mut sockets) = (0u64, 0u64);
    for pid in pids {
        let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for entry in dir.flatten() {
            fds += 1;
            if std::fs::read_link(entry.path())
                .is_ok_and(|t| t.to_string_lossy().starts_with("socket:"))
            {
                sockets += 1;
            }
        }
    }
    (fds, sockets)
}

/// The size and free inodes of the filesystem holding `path` (`statvfs`): the
/// `container_fs_limit_bytes` and `container_fs_inodes_free` of a container whose writable
/// layer is there.
pub fn filesystem_of(path: &Path) -> Option<(u64, u64)> {
    let s = nix::sys::statvfs::statvfs(path).ok()?;
    let size = (s.blocks() as u64).saturating_mul(s.fragment_size() as u64);
    Some((size, s.files_free() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, file: &str, text: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(file), text).unwrap();
    }

    #[test]
    fn v1_extras_from_each_controller() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let cpu = r.join("cpu/pod/c1");
        write(
            &cpu,
            "cpu.stat",
            "nr_periods 40\nnr_throttled 7\nthrottled_time 3500000000\n",
        );
        write(&cpu, "cpu.cfs_period_us", "100000\n");
        write(&cpu, "cpu.shares", "1024\n");
        let mem = r.join("memory/pod/c1");
        write(&mem, "memory.kmem.usage_in_bytes", "65536\n");
        write(&mem, "memory.usage_in_bytes", "1000\n");
        write(&mem, "memory.memsw.usage_in_bytes", "1500\n");
        write(&mem, "memory.memsw.limit_in_bytes", "67108864\n");
        write(
            &mem,
            "memory.stat",
            "cache 1\ntotal_active_file 300\ntotal_inactive_file 200\n",
        );
        write(
            &mem,
            "memory.oom_control",
            "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
        );
        write(&mem, "cgroup.procs", "11\n12\n");
        write(&r.join("pids/pod/c1"), "pids.max", "max\n");
        write(
            &r.join("blkio/pod/c1"),
            "blkio.throttle.io_service_bytes_recursive",
            "8:0 Read 4096\n8:0 Write 8192\n8:0 Sync 0\n8:0 Total 12288\nTotal 12288\n",
        );
        write(
            &r.join("blkio/pod/c1"),
            "blkio.throttle.io_serviced_recursive",
            "8:0 Read 1\n8:0 Write 2\nTotal 3\n",
        );
        let fs = CgroupFs::at(r.to_path_buf(), 100, remora_host::cgroup::Hierarchy::V1);
        let path = CgroupPath::V1(
            ["cpu", "cpuacct", "memory", "pids", "blkio"]
                .iter()
                .map(|c| (c.to_string(), "/pod/c1".to_string()))
                .collect(),
        );
        let e = fs.read_extras(&path);
        assert_eq!(
            e.throttling,
            Some(Throttling {
                periods: 40,
                throttled_periods: 7,
                throttled_ns: 3_500_000_000
            })
        );
        assert_eq!((e.cpu_period, e.cpu_shares), (Some(100_000), Some(1024)));
        assert_eq!(e.kernel_usage, Some(65536));
        assert_eq!(e.swap, Some(500), "memory+swap minus memory");
        assert_eq!((e.active_file, e.inactive_file), (Some(300), Some(200)));
        assert_eq!(e.oom_kills, Some(2));
        assert_eq!(e.memory_swap_limit, Some(64 << 20));
        assert_eq!(e.pids_max, Some(0), "max is no limit");
        assert_eq!(e.procs, [11, 12]);
        assert_eq!(e.io.len(), 1, "{:?}", e.io);
        let d = &e.io[0];
        assert_eq!((d.major, d.minor), (8, 0));
        assert_eq!(
            (d.read_bytes, d.write_bytes, d.reads, d.writes),
            (4096, 8192, 1, 2)
        );
        assert!(!d.device.is_empty());
    }

    #[test]
    fn v2_extras_from_the_unified_directory() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        write(r, "cgroup.controllers", "cpu memory pids io\n");
        let d = r.join("pod/c1");
        write(
            &d,
            "cpu.stat",
            "usage_usec 10\nnr_periods 5\nnr_throttled 1\nthrottled_usec 2000\n",
        );
        write(&d, "cpu.max", "20000 100000\n");
        write(&d, "cpu.weight", "39\n");
        write(
            &d,
            "memory.stat",
            "anon 1\nkernel 4096\nactive_file 30\ninactive_file 20\n",
        );
        write(&d, "memory.swap.current", "0\n");
        write(&d, "memory.swap.max", "max\n");
        write(
            &d,
            "memory.events",
            "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n",
        );
        write(&d, "pids.max", "1024\n");
        write(&d, "cgroup.procs", "7\n");
        write(
            &d,
            "io.stat",
            "259:0 rbytes=1 wbytes=2 rios=3 wios=4 dbytes=0 dios=0\nbogus\n",
        );
        let fs = CgroupFs::at(
            r.to_path_buf(),
            100,
            remora_host::cgroup::Hierarchy::Unified,
        );
        let e = fs.read_extras(&CgroupPath::V2("/pod/c1".into()));
        assert_eq!(
            e.throttling,
            Some(Throttling {
                periods: 5,
                throttled_periods: 1,
                throttled_ns: 2_000_000
            })
        );
        assert_eq!(e.cpu_period, Some(100_000));
        assert_eq!(
            e.cpu_shares,
            Some(998),
            "runc writes 1024 shares as weight 39; back, the conversion loses a little"
        );
        assert_eq!(
            (weight_to_shares(1), weight_to_shares(10_000)),
            (2, 262_144)
        );
        assert_eq!(e.kernel_usage, Some(4096));
        assert_eq!((e.swap, e.memory_swap_limit), (Some(0), Some(0)));
        assert_eq!(e.oom_kills, Some(1));
        assert_eq!(e.pids_max, Some(1024));
        assert_eq!(e.procs, [7]);
        assert_eq!(e.io.len(), 1);
        assert_eq!(
            (
                e.io[0].read_bytes,
                e.io[0].write_bytes,
                e.io[0].reads,
                e.io[0].writes
            ),
            (1, 2, 3, 4)
        );
    }

    #[test]
    fn a_missing_cgroup_has_no_extras() {
        let root = tempfile::tempdir().unwrap();
        let fs = CgroupFs::at(
            root.path().to_path_buf(),
            100,
            remora_host::cgroup::Hierarchy::V1,
        );
        let e = fs.read_extras(&CgroupPath::V1(
            [("memory".to_string(), "/gone".to_string())].into(),
        ));
        assert_eq!(e, CgroupExtras::default());
    }

    #[test]
    fn descriptors_of_this_process_include_a_socket() {
        let _s = std::os::unix::net::UnixDatagram::unbound().unwrap();
        let (fds, sockets) = count_descriptors(&[std::process::id()]);
        assert!(fds >= 3 && sockets >= 1, "{fds} {sockets}");
        assert_eq!(count_descriptors(&[u32::MAX]), (0, 0), "no such process");
    }

    #[test]
    fn procs_are_the_first_whole_pids_of_a_long_list() {
        let root = tempfile::tempdir().unwrap();
        let d = root.path().join("pod1");
        let pids: Vec<String> = (1_000_000..1_000_000 + 5000)
            .map(|p| p.to_string())
            .collect();
        write(&d, "cgroup.procs", &(pids.join("\n") + "\n"));
        let procs = read_procs(&d);
        assert_eq!(procs.len(), MAX_COUNTED_PROCS);
        assert_eq!(
            procs.last(),
            Some(&(1_000_000 + MAX_COUNTED_PROCS as u32 - 1))
        );
        // 8-byte lines but one of 9: the file is cut inside a pid, which is left out.
        let mut long = pids.clone();
        long[0] = "10000000".into();
        write(&d, "cgroup.procs", &(long.join("\n") + "\n"));
        let procs = read_procs(&d);
        assert_eq!(procs.len(), MAX_COUNTED_PROCS - 1);
        assert_eq!(
            procs.last(),
            Some(&(1_000_000 + MAX_COUNTED_PROCS as u32 - 2))
        );
    }
}
