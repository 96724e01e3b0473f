//! A container's cgroup (v1 or v2) read for the shim: its metrics in containerd's metrics
//! types ([`CgroupReadings::metrics`]) and its OOM-kill counter.
//!
//! # Design
//! - **Where.** [`Cgroup`], the location of a process's cgroup on v1, v2 or a hybrid host, is
//!   the host crate's (`remora_host::cgroup`), shared with the daemon; this module reads it.
//! - **No cached fds.** Metrics read the files on each call: `Stats` is rare (kubelet asks every
//!   few seconds at most), and fds held per container cost memory in a shim that lives per pod.
//! - **Optional vs gone.** A missing optional file (a controller not mounted, swap accounting off,
//!   an older kernel) leaves its fields at zero, as containerd does; a cgroup whose directory is
//!   gone is [`CgroupError::Gone`]: an exited and deleted container has no metrics.
//! - **Packing.** The `Any`'s type URL is the message's full name without the
//!   `type.googleapis.com/` prefix: that is what containerd's `typeurl` writes for these messages
//!   and what its CRI plugin looks up.
//! - **"max".** v1 `pids.max` "max" is 0 (containerd's v1 reading); in v2 every "max" limit is
//!   `u64::MAX` (containerd's cgroup2 reading, which its CRI plugin compares against).

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use containerd_shim_protos::cgroups::metrics as v1;
use containerd_shim_protos::cgroups_v2::metrics as v2;
use protobuf::well_known_types::any::Any;
use protobuf::{Message, MessageField};
pub use remora_host::cgroup::{Cgroup, LocateError};

#[cfg(test)]
mod tests;

/// What can go wrong finding a cgroup or reading it.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// The process's cgroup could not be found.
    #[error(transparent)]
    Locate(#[from] LocateError),
    /// A cgroup file could not be read (for a reason other than being absent).
    #[error("read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A cgroup file holds something other than the number it should.
    #[error("{path}: {value:?} is not a number")]
    BadNumber {
        /// The file.
        path: PathBuf,
        /// What it held (or the offending field).
        value: String,
    },
    /// A v1 cgroup with no controller directory at all.
    #[error("the v1 cgroup has no controller directory")]
    NoControllers,
    /// The cgroup's directory (or the file that proves it exists) is gone: the cgroup was removed.
    #[error("cgroup {path} is gone")]
    Gone {
        /// The directory or file that is missing.
        path: PathBuf,
    },
    /// The v1 cgroup has no directory for a controller the operation needs.
    #[error("the cgroup has no {controller} controller")]
    NoController {
        /// The controller, e.g. "memory".
        controller: &'static str,
    },
    /// The kernel does not count OOM kills in this file (v1 kernels older than 4.13).
    #[error("{path} has no oom_kill counter (kernel older than 4.13)")]
    NoOomKillCounter {
        /// `memory.oom_control` or `memory.events`.
        path: PathBuf,
    },
    /// The metrics message could not be encoded.
    #[error("encode {message}: {source}")]
    Encode {
        /// The message's full name.
        message: String,
        #[source]
        source: protobuf::Error,
    },
}

/// What the shim reads from a container's cgroup.
pub trait CgroupReadings {
    /// The cgroup's metrics packed as containerd packs them: v1 →
    /// `containerd_shim_protos::cgroups::metrics::Metrics` with type URL
    /// "io.containerd.cgroups.v1.Metrics"; v2 → `containerd_shim_protos::cgroups_v2::metrics::Metrics`
    /// with "io.containerd.cgroups.v2.Metrics".
    fn metrics(&self) -> Result<Any, CgroupError>;

    /// How many processes the kernel OOM-killed in this cgroup: v1 `memory.oom_control` field
    /// `oom_kill` (kernels ≥ 4.13), v2 `memory.events` `oom_kill`.
    ///
    /// A removed cgroup is [`CgroupError::Gone`]; a v1 kernel without the counter is
    /// [`CgroupError::NoOomKillCounter`].
    fn oom_kills(&self) -> Result<u64, CgroupError>;

    /// The file whose change the OOM watch waits on: v1 `memory.oom_control` (registered with
    /// `cgroup.event_control`), v2 `memory.events`.
    fn oom_file(&self) -> Result<PathBuf, CgroupError>;
}

impl CgroupReadings for Cgroup {
    fn metrics(&self) -> Result<Any, CgroupError> {
        match self {
            Cgroup::V1(dirs) => pack(V1_METRICS, &metrics_v1(dirs)?),
            Cgroup::V2(dir) => pack(V2_METRICS, &metrics_v2(dir)?),
        }
    }

    fn oom_kills(&self) -> Result<u64, CgroupError> {
        let path = self.oom_file()?;
        let text = read_optional(&path)?.ok_or_else(|| CgroupError::Gone { path: path.clone() })?;
        let value = keyed(&text)
            .find(|(k, _)| *k == "oom_kill")
            .map(|(_, v)| v.to_string());
        match value {
            Some(value) => value
                .parse()
                .map_err(|_| CgroupError::BadNumber { path, value }),
            None => Err(CgroupError::NoOomKillCounter { path }),
        }
    }

    fn oom_file(&self) -> Result<PathBuf, CgroupError> {
        match self {
            Cgroup::V1(dirs) => Ok(dirs
                .get("memory")
                .ok_or(CgroupError::NoController {
                    controller: "memory",
                })?
                .join("memory.oom_control")),
            Cgroup::V2(dir) => Ok(dir.join("memory.events")),
        }
    }
}

/// The full proto names of the metrics messages, the type URLs containerd's typeurl gives
/// them. Named, not read from the messages' descriptors, which rust-protobuf makes by parsing
/// their whole `.proto` files and keeps for good (see `publisher::TaskEvent`); a unit test
/// checks them against the descriptors.
const V1_METRICS: &str = "io.containerd.cgroups.v1.Metrics";
const V2_METRICS: &str = "io.containerd.cgroups.v2.Metrics";

/// Packs `message` as containerd's typeurl does: its full name (`name`) as type URL, no prefix.
fn pack<M: Message>(name: &str, message: &M) -> Result<Any, CgroupError> {
    let name = name.to_string();
    let value = message
        .write_to_bytes()
        .map_err(|source| CgroupError::Encode {
            message: name.clone(),
            source,
        })?;
    let mut any = Any::new();
    any.type_url = name;
    any.value = value;
    Ok(any)
}

/// Whether a read error means "this file is not there" (the controller, feature or cgroup is
/// absent) rather than a failure: ENOENT, and ENODEV/EOPNOTSUPP that cgroupfs returns for files
/// of removed cgroups or disabled features.
fn is_absent(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound
        || matches!(
            e.raw_os_error(),
            Some(libc::ENODEV) | Some(libc::EOPNOTSUPP)
        )
}

/// The file's text, `None` when it is absent.
fn read_optional(path: &Path) -> Result<Option<String>, CgroupError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if is_absent(&e) => Ok(None),
        Err(source) => Err(CgroupError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// A single-number file; `max_is` stands for "max" (a limit with none set) when given.
fn read_number(path: &Path, max_is: Option<u64>) -> Result<Option<u64>, CgroupError> {
    let Some(text) = read_optional(path)? else {
        return Ok(None);
    };
    let value = text.trim();
    if value == "max" {
        if let Some(max) = max_is {
            return Ok(Some(max));
        }
    }
    value.parse().map(Some).map_err(|_| CgroupError::BadNumber {
        path: path.to_path_buf(),
        value: value.to_string(),
    })
}

/// `key value` lines (memory.stat, cpu.stat, memory.events, memory.oom_control, cpuacct.stat).
fn keyed(text: &str) -> impl Iterator<Item = (&str, &str)> {
    text.lines()
        .filter_map(|line| line.split_once(' '))
        .map(|(k, v)| (k.trim(), v.trim()))
}

/// The numeric `key value` pairs of a flat-keyed file; a key whose value is not a number is
/// skipped: the kernel adds keys across versions and none of the ones read here is textual.
fn keyed_numbers(text: &str) -> BTreeMap<&str, u64> {
    keyed(text)
        .filter_map(|(k, v)| v.parse().ok().map(|n| (k, n)))
        .collect()
}

/// A flat-keyed file's key and the message field it fills.
type Field<T> = (&'static str, fn(&mut T) -> &mut u64);

/// Reads a flat-keyed file and copies the listed keys into their fields; false when the file is
/// absent.
fn fill_keyed<T>(path: &Path, target: &mut T, fields: &[Field<T>]) -> Result<bool, CgroupError> {
    let Some(text) = read_optional(path)? else {
        return Ok(false);
    };
    let values = keyed_numbers(&text);
    for (key, field) in fields {
        if let Some(value) = values.get(key) {
            *field(target) = *value;
        }
    }
    Ok(true)
}

/// USER_HZ, the unit of cpuacct.stat.
fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf has no preconditions; it returns -1 for an unknown name.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as u64
    } else {
        100
    }
}

fn metrics_v1(dirs: &BTreeMap<String, PathBuf>) -> Result<v1::Metrics, CgroupError> {
    // The memory directory proves the cgroup exists (runc removes every controller's directory
    // together); a cgroup without memory falls back to any of its directories.
    let primary = dirs
        .get("memory")
        .or_else(|| dirs.values().next())
        .ok_or(CgroupError::NoControllers)?;
    if !primary.is_dir() {
        return Err(CgroupError::Gone {
            path: primary.clone(),
        });
    }
    let mut metrics = v1::Metrics::new();
    if let Some(dir) = dirs.get("cpuacct").or_else(|| dirs.get("cpu")) {
        metrics.cpu.mut_or_insert_default().usage = MessageField::some(cpu_usage_v1(dir)?);
    }
    if let Some(dir) = dirs.get("cpu") {
        let mut throttle = v1::Throttle::new();
        let found = fill_keyed(
            &dir.join("cpu.stat"),
            &mut throttle,
            &[
                ("nr_periods", |t| &mut t.periods),
                ("nr_throttled", |t| &mut t.throttled_periods),
                ("throttled_time", |t| &mut t.throttled_time),
            ],
        )?;
        if found {
            metrics.cpu.mut_or_insert_default().throttling = MessageField::some(throttle);
        }
    }
    if let Some(dir) = dirs.get("memory") {
        metrics.memory = MessageField::some(memory_v1(dir)?);
        if let Some(text) = read_optional(&dir.join("memory.oom_control"))? {
            let values = keyed_numbers(&text);
            let mut oom = v1::MemoryOomControl::new();
            oom.oom_kill_disable = values.get("oom_kill_disable").copied().unwrap_or(0);
            oom.under_oom = values.get("under_oom").copied().unwrap_or(0);
            oom.oom_kill = values.get("oom_kill").copied().unwrap_or(0);
            metrics.memory_oom_control = MessageField::some(oom);
        }
    }
    if let Some(dir) = dirs.get("pids") {
        if let Some(current) = read_number(&dir.join("pids.current"), None)? {
            let mut pids = v1::PidsStat::new();
            pids.current = current;
            pids.limit = read_number(&dir.join("pids.max"), Some(0))?.unwrap_or(0);
            metrics.pids = MessageField::some(pids);
        }
    }
    if let Some(dir) = dirs.get("blkio") {
        metrics.blkio = MessageField::some(blkio_v1(dir)?);
    }
    if let Some(dir) = dirs.get("hugetlb") {
        metrics.hugetlb = hugetlb_v1(dir)?;
    }
    // Removed while being read: the zeros read meanwhile would be lies.
    if !primary.is_dir() {
        return Err(CgroupError::Gone {
            path: primary.clone(),
        });
    }
    Ok(metrics)
}

fn cpu_usage_v1(dir: &Path) -> Result<v1::CPUUsage, CgroupError> {
    let mut usage = v1::CPUUsage::new();
    usage.total = read_number(&dir.join("cpuacct.usage"), None)?.unwrap_or(0);
    let percpu = dir.join("cpuacct.usage_percpu");
    if let Some(text) = read_optional(&percpu)? {
        usage.per_cpu = text
            .split_whitespace()
            .map(|v| {
                v.parse().map_err(|_| CgroupError::BadNumber {
                    path: percpu.clone(),
                    value: v.to_string(),
                })
            })
            .collect::<Result<_, _>>()?;
    }
    // cpuacct.stat counts USER_HZ ticks; containerd reports nanoseconds.
    if let Some(text) = read_optional(&dir.join("cpuacct.stat"))? {
        let values = keyed_numbers(&text);
        let hz = u128::from(clock_ticks_per_second());
        let ns =
            |ticks: u64| u64::try_from(u128::from(ticks) * 1_000_000_000 / hz).unwrap_or(u64::MAX);
        usage.user = ns(values.get("user").copied().unwrap_or(0));
        usage.kernel = ns(values.get("system").copied().unwrap_or(0));
    }
    Ok(usage)
}

const MEMORY_STAT_V1: &[Field<v1::MemoryStat>] = &[
    ("cache", |s| &mut s.cache),
    ("rss", |s| &mut s.rss),
    ("rss_huge", |s| &mut s.rss_huge),
    ("mapped_file", |s| &mut s.mapped_file),
    ("dirty", |s| &mut s.dirty),
    ("writeback", |s| &mut s.writeback),
    ("pgpgin", |s| &mut s.pg_pg_in),
    ("pgpgout", |s| &mut s.pg_pg_out),
    ("pgfault", |s| &mut s.pg_fault),
    ("pgmajfault", |s| &mut s.pg_maj_fault),
    ("inactive_anon", |s| &mut s.inactive_anon),
    ("active_anon", |s| &mut s.active_anon),
    ("inactive_file", |s| &mut s.inactive_file),
    ("active_file", |s| &mut s.active_file),
    ("unevictable", |s| &mut s.unevictable),
    ("hierarchical_memory_limit", |s| {
        &mut s.hierarchical_memory_limit
    }),
    ("hierarchical_memsw_limit", |s| {
        &mut s.hierarchical_swap_limit
    }),
    ("total_cache", |s| &mut s.total_cache),
    ("total_rss", |s| &mut s.total_rss),
    ("total_rss_huge", |s| &mut s.total_rss_huge),
    ("total_mapped_file", |s| &mut s.total_mapped_file),
    ("total_dirty", |s| &mut s.total_dirty),
    ("total_writeback", |s| &mut s.total_writeback),
    ("total_pgpgin", |s| &mut s.total_pg_pg_in),
    ("total_pgpgout", |s| &mut s.total_pg_pg_out),
    ("total_pgfault", |s| &mut s.total_pg_fault),
    ("total_pgmajfault", |s| &mut s.total_pg_maj_fault),
    ("total_inactive_anon", |s| &mut s.total_inactive_anon),
    ("total_active_anon", |s| &mut s.total_active_anon),
    ("total_inactive_file", |s| &mut s.total_inactive_file),
    ("total_active_file", |s| &mut s.total_active_file),
    ("total_unevictable", |s| &mut s.total_unevictable),
];

fn memory_v1(dir: &Path) -> Result<v1::MemoryStat, CgroupError> {
    let mut stat = v1::MemoryStat::new();
    fill_keyed(&dir.join("memory.stat"), &mut stat, MEMORY_STAT_V1)?;
    stat.usage = memory_entry_v1(dir, "memory.")?;
    stat.swap = memory_entry_v1(dir, "memory.memsw.")?;
    stat.kernel = memory_entry_v1(dir, "memory.kmem.")?;
    stat.kernel_tcp = memory_entry_v1(dir, "memory.kmem.tcp.")?;
    Ok(stat)
}

/// usage/limit/max/failcnt under one prefix; none when the kernel has none of them (swap
/// accounting off, no kmem).
fn memory_entry_v1(dir: &Path, prefix: &str) -> Result<MessageField<v1::MemoryEntry>, CgroupError> {
    let read = |name: &str| read_number(&dir.join(format!("{prefix}{name}")), None);
    let usage = read("usage_in_bytes")?;
    let limit = read("limit_in_bytes")?;
    let max = read("max_usage_in_bytes")?;
    let failcnt = read("failcnt")?;
    if usage.is_none() && limit.is_none() && max.is_none() && failcnt.is_none() {
        return Ok(MessageField::none());
    }
    let mut entry = v1::MemoryEntry::new();
    entry.usage = usage.unwrap_or(0);
    entry.limit = limit.unwrap_or(0);
    entry.max = max.unwrap_or(0);
    entry.failcnt = failcnt.unwrap_or(0);
    Ok(MessageField::some(entry))
}

fn blkio_v1(dir: &Path) -> Result<v1::BlkIOStat, CgroupError> {
    let mut stat = v1::BlkIOStat::new();
    // CFQ/BFQ-less kernels (blk-mq) only have the throttle files, which count every device's I/O.
    for (bytes, ops) in [
        (
            "blkio.io_service_bytes_recursive",
            "blkio.io_serviced_recursive",
        ),
        (
            "blkio.throttle.io_service_bytes_recursive",
            "blkio.throttle.io_serviced_recursive",
        ),
        (
            "blkio.throttle.io_service_bytes",
            "blkio.throttle.io_serviced",
        ),
    ] {
        let bytes = blkio_entries(&dir.join(bytes))?;
        let ops = blkio_entries(&dir.join(ops))?;
        if bytes.is_some() || ops.is_some() {
            stat.io_service_bytes_recursive = bytes.unwrap_or_default();
            stat.io_serviced_recursive = ops.unwrap_or_default();
            break;
        }
    }
    Ok(stat)
}

/// "MAJ:MIN Op value" lines; the closing "Total value" line is skipped.
fn blkio_entries(path: &Path) -> Result<Option<Vec<v1::BlkIOEntry>>, CgroupError> {
    let Some(text) = read_optional(path)? else {
        return Ok(None);
    };
    let bad = |value: &str| CgroupError::BadNumber {
        path: path.to_path_buf(),
        value: value.to_string(),
    };
    let mut entries = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [device, op, value] = fields[..] else {
            continue;
        };
        let (major, minor) = device.split_once(':').ok_or_else(|| bad(device))?;
        let mut entry = v1::BlkIOEntry::new();
        entry.major = major.parse().map_err(|_| bad(device))?;
        entry.minor = minor.parse().map_err(|_| bad(device))?;
        entry.op = op.to_string();
        entry.value = value.parse().map_err(|_| bad(value))?;
        entry.device = device_name(entry.major, entry.minor);
        entries.push(entry);
    }
    Ok(Some(entries))
}

/// "/dev/<name>" of a block device, from sysfs; empty when unknown (optional, as in containerd).
fn device_name(major: u64, minor: u64) -> String {
    std::fs::read_link(format!("/sys/dev/block/{major}:{minor}"))
        .ok()
        .and_then(|target| {
            target
                .file_name()
                .map(|n| format!("/dev/{}", n.to_string_lossy()))
        })
        .unwrap_or_default()
}

/// The page sizes that have hugetlb files named `hugetlb.<size>.<suffix>` in `dir`.
fn hugetlb_sizes(dir: &Path, suffix: &str) -> Result<Vec<String>, CgroupError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if is_absent(&e) => return Ok(Vec::new()),
        Err(source) => {
            return Err(CgroupError::Read {
                path: dir.to_path_buf(),
                source,
            })
        }
    };
    let mut sizes: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_prefix("hugetlb.")?
                .strip_suffix(suffix)
                .map(str::to_string)
        })
        .collect();
    sizes.sort();
    Ok(sizes)
}

fn hugetlb_v1(dir: &Path) -> Result<Vec<v1::HugetlbStat>, CgroupError> {
    let mut stats = Vec::new();
    for size in hugetlb_sizes(dir, ".usage_in_bytes")? {
        let read = |name: &str| read_number(&dir.join(format!("hugetlb.{size}.{name}")), None);
        let mut stat = v1::HugetlbStat::new();
        stat.usage = read("usage_in_bytes")?.unwrap_or(0);
        stat.max = read("max_usage_in_bytes")?.unwrap_or(0);
        stat.failcnt = read("failcnt")?.unwrap_or(0);
        stat.pagesize = size;
        stats.push(stat);
    }
    Ok(stats)
}

const CPU_STAT_V2: &[Field<v2::CPUStat>] = &[
    ("usage_usec", |s| &mut s.usage_usec),
    ("user_usec", |s| &mut s.user_usec),
    ("system_usec", |s| &mut s.system_usec),
    ("nr_periods", |s| &mut s.nr_periods),
    ("nr_throttled", |s| &mut s.nr_throttled),
    ("throttled_usec", |s| &mut s.throttled_usec),
    ("nr_bursts", |s| &mut s.nr_bursts),
    ("burst_usec", |s| &mut s.burst_usec),
];

const MEMORY_STAT_V2: &[Field<v2::MemoryStat>] = &[
    ("anon", |s| &mut s.anon),
    ("file", |s| &mut s.file),
    ("kernel_stack", |s| &mut s.kernel_stack),
    ("slab", |s| &mut s.slab),
    ("sock", |s| &mut s.sock),
    ("shmem", |s| &mut s.shmem),
    ("file_mapped", |s| &mut s.file_mapped),
    ("file_dirty", |s| &mut s.file_dirty),
    ("file_writeback", |s| &mut s.file_writeback),
    ("anon_thp", |s| &mut s.anon_thp),
    ("inactive_anon", |s| &mut s.inactive_anon),
    ("active_anon", |s| &mut s.active_anon),
    ("inactive_file", |s| &mut s.inactive_file),
    ("active_file", |s| &mut s.active_file),
    ("unevictable", |s| &mut s.unevictable),
    ("slab_reclaimable", |s| &mut s.slab_reclaimable),
    ("slab_unreclaimable", |s| &mut s.slab_unreclaimable),
    ("pgfault", |s| &mut s.pgfault),
    ("pgmajfault", |s| &mut s.pgmajfault),
    ("workingset_refault", |s| &mut s.workingset_refault),
    ("workingset_activate", |s| &mut s.workingset_activate),
    ("workingset_nodereclaim", |s| &mut s.workingset_nodereclaim),
    ("pgrefill", |s| &mut s.pgrefill),
    ("pgscan", |s| &mut s.pgscan),
    ("pgsteal", |s| &mut s.pgsteal),
    ("pgactivate", |s| &mut s.pgactivate),
    ("pgdeactivate", |s| &mut s.pgdeactivate),
    ("pglazyfree", |s| &mut s.pglazyfree),
    ("pglazyfreed", |s| &mut s.pglazyfreed),
    ("thp_fault_alloc", |s| &mut s.thp_fault_alloc),
    ("thp_collapse_alloc", |s| &mut s.thp_collapse_alloc),
];

const MEMORY_EVENTS_V2: &[Field<v2::MemoryEvents>] = &[
    ("low", |s| &mut s.low),
    ("high", |s| &mut s.high),
    ("max", |s| &mut s.max),
    ("oom", |s| &mut s.oom),
    ("oom_kill", |s| &mut s.oom_kill),
    ("oom_group_kill", |s| &mut s.oom_group_kill),
];

fn metrics_v2(dir: &Path) -> Result<v2::Metrics, CgroupError> {
    if !dir.is_dir() {
        return Err(CgroupError::Gone {
            path: dir.to_path_buf(),
        });
    }
    let mut metrics = v2::Metrics::new();
    if let Some(current) = read_number(&dir.join("pids.current"), None)? {
        let mut pids = v2::PidsStat::new();
        pids.current = current;
        pids.limit = read_number(&dir.join("pids.max"), Some(u64::MAX))?.unwrap_or(0);
        metrics.pids = MessageField::some(pids);
    }
    let mut cpu = v2::CPUStat::new();
    if fill_keyed(&dir.join("cpu.stat"), &mut cpu, CPU_STAT_V2)? {
        metrics.cpu = MessageField::some(cpu);
    }
    let mut memory = v2::MemoryStat::new();
    let has_stat = fill_keyed(&dir.join("memory.stat"), &mut memory, MEMORY_STAT_V2)?;
    let usage = read_number(&dir.join("memory.current"), None)?;
    if has_stat || usage.is_some() {
        let number = |name: &str, max_is| read_number(&dir.join(name), max_is);
        memory.usage = usage.unwrap_or(0);
        memory.usage_limit = number("memory.max", Some(u64::MAX))?.unwrap_or(0);
        memory.max_usage = number("memory.peak", None)?.unwrap_or(0);
        memory.swap_usage = number("memory.swap.current", None)?.unwrap_or(0);
        memory.swap_limit = number("memory.swap.max", Some(u64::MAX))?.unwrap_or(0);
        memory.swap_max_usage = number("memory.swap.peak", None)?.unwrap_or(0);
        metrics.memory = MessageField::some(memory);
    }
    let mut events = v2::MemoryEvents::new();
    if fill_keyed(&dir.join("memory.events"), &mut events, MEMORY_EVENTS_V2)? {
        metrics.memory_events = MessageField::some(events);
    }
    if let Some(usage) = io_stat_v2(&dir.join("io.stat"))? {
        let mut io = v2::IOStat::new();
        io.usage = usage;
        metrics.io = MessageField::some(io);
    }
    metrics.hugetlb = hugetlb_v2(dir)?;
    if !dir.is_dir() {
        return Err(CgroupError::Gone {
            path: dir.to_path_buf(),
        });
    }
    Ok(metrics)
}

/// "MAJ:MIN rbytes=N wbytes=N rios=N wios=N dbytes=N dios=N" lines; unknown keys are skipped.
fn io_stat_v2(path: &Path) -> Result<Option<Vec<v2::IOEntry>>, CgroupError> {
    let Some(text) = read_optional(path)? else {
        return Ok(None);
    };
    let bad = |value: &str| CgroupError::BadNumber {
        path: path.to_path_buf(),
        value: value.to_string(),
    };
    let mut entries = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let mut fields = line.split_whitespace();
        let Some(device) = fields.next() else {
            continue;
        };
        let (major, minor) = device.split_once(':').ok_or_else(|| bad(device))?;
        let mut entry = v2::IOEntry::new();
        entry.major = major.parse().map_err(|_| bad(device))?;
        entry.minor = minor.parse().map_err(|_| bad(device))?;
        for field in fields {
            let Some((key, value)) = field.split_once('=') else {
                continue;
            };
            let target = match key {
                "rbytes" => &mut entry.rbytes,
                "wbytes" => &mut entry.wbytes,
                "rios" => &mut entry.rios,
                "wios" => &mut entry.wios,
                _ => continue,
            };
            *target = value.parse().map_err(|_| bad(field))?;
        }
        entries.push(entry);
    }
    Ok(Some(entries))
}

fn hugetlb_v2(dir: &Path) -> Result<Vec<v2::HugeTlbStat>, CgroupError> {
    let mut stats = Vec::new();
    for size in hugetlb_sizes(dir, ".current")? {
        let file = |name: &str| dir.join(format!("hugetlb.{size}.{name}"));
        let mut stat = v2::HugeTlbStat::new();
        stat.current = read_number(&file("current"), None)?.unwrap_or(0);
        stat.max = read_number(&file("max"), Some(u64::MAX))?.unwrap_or(0);
        if let Some(text) = read_optional(&file("events"))? {
            stat.failcnt = keyed_numbers(&text).get("max").copied().unwrap_or(0);
        }
        stat.pagesize = size;
        stats.push(stat);
    }
    Ok(stats)
}
