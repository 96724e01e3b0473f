use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use containerd_shim_protos::cgroups::metrics as v1;
use containerd_shim_protos::cgroups_v2::metrics as v2;
use protobuf::Message;

use super::*;

#[test]
fn this_process_cgroup_has_metrics() {
    // This test bed's own cgroup.
    Cgroup::of_pid(std::process::id())
        .unwrap()
        .metrics()
        .unwrap();
}

fn write(dir: &Path, name: &str, content: &str) {
    std::fs::write(dir.join(name), content).unwrap();
}

const V1_MEMORY_STAT: &str = "\
cache 2265088
rss 602112
rss_huge 0
shmem 0
mapped_file 1216512
dirty 4096
writeback 0
pgpgin 1427
pgpgout 720
pgfault 1870
pgmajfault 13
inactive_anon 593920
active_anon 8192
inactive_file 1490944
active_file 774144
unevictable 0
hierarchical_memory_limit 16777216
hierarchical_memsw_limit 9223372036854771712
total_cache 2265088
total_rss 602112
total_rss_huge 0
total_shmem 0
total_mapped_file 1216512
total_dirty 4096
total_writeback 0
total_pgpgin 1427
total_pgpgout 720
total_pgfault 1870
total_pgmajfault 13
total_inactive_anon 593920
total_active_anon 8192
total_inactive_file 1490944
total_active_file 774144
total_unevictable 0
";

/// A v1 cgroup as runc makes it, under a tempdir: cpu,cpuacct joint, memory without swap
/// accounting, pids without a limit, blkio with throttle files only, one hugetlb size.
fn fake_v1(root: &Path) -> Cgroup {
    let memory = root.join("memory");
    let cpu = root.join("cpu,cpuacct");
    let pids = root.join("pids");
    let blkio = root.join("blkio");
    let hugetlb = root.join("hugetlb");
    for dir in [&memory, &cpu, &pids, &blkio, &hugetlb] {
        std::fs::create_dir(dir).unwrap();
    }
    write(&memory, "memory.stat", V1_MEMORY_STAT);
    write(&memory, "memory.usage_in_bytes", "3194880\n");
    write(&memory, "memory.limit_in_bytes", "16777216\n");
    write(&memory, "memory.max_usage_in_bytes", "16773120\n");
    write(&memory, "memory.failcnt", "812\n");
    write(&memory, "memory.kmem.usage_in_bytes", "327680\n");
    write(
        &memory,
        "memory.kmem.limit_in_bytes",
        "9223372036854771712\n",
    );
    write(&memory, "memory.kmem.max_usage_in_bytes", "409600\n");
    write(&memory, "memory.kmem.failcnt", "0\n");
    write(
        &memory,
        "memory.oom_control",
        "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
    );
    write(&cpu, "cpuacct.usage", "12379082596984\n");
    write(
        &cpu,
        "cpuacct.usage_percpu",
        "6016271658950 6362810938034 \n",
    );
    write(&cpu, "cpuacct.stat", "user 1050\nsystem 187\n");
    write(
        &cpu,
        "cpu.stat",
        "nr_periods 120\nnr_throttled 7\nthrottled_time 350000000\nnr_bursts 0\nburst_time 0\n",
    );
    write(&pids, "pids.current", "5\n");
    write(&pids, "pids.max", "max\n");
    write(
        &blkio,
        "blkio.throttle.io_service_bytes_recursive",
        "8:0 Read 4096\n8:0 Write 8192\n8:0 Sync 0\n8:0 Async 12288\n8:0 Discard 0\n8:0 Total 12288\nTotal 12288\n",
    );
    write(
        &blkio,
        "blkio.throttle.io_serviced_recursive",
        "8:0 Read 1\n8:0 Write 2\n8:0 Sync 0\n8:0 Async 3\n8:0 Discard 0\n8:0 Total 3\nTotal 3\n",
    );
    write(&hugetlb, "hugetlb.2MB.usage_in_bytes", "2097152\n");
    write(&hugetlb, "hugetlb.2MB.max_usage_in_bytes", "4194304\n");
    write(&hugetlb, "hugetlb.2MB.failcnt", "1\n");
    write(
        &hugetlb,
        "hugetlb.2MB.limit_in_bytes",
        "9223372036854771712\n",
    );
    Cgroup::V1(BTreeMap::from([
        ("memory".to_string(), memory),
        ("cpu".to_string(), cpu.clone()),
        ("cpuacct".to_string(), cpu),
        ("pids".to_string(), pids),
        ("blkio".to_string(), blkio),
        ("hugetlb".to_string(), hugetlb),
    ]))
}

#[test]
fn v1_metrics_from_a_fake_tree() {
    let root = tempfile::tempdir().unwrap();
    let cgroup = fake_v1(root.path());
    let any = cgroup.metrics().unwrap();
    assert_eq!(any.type_url, "io.containerd.cgroups.v1.Metrics");
    let m = v1::Metrics::parse_from_bytes(&any.value).unwrap();

    let usage = m.cpu.usage.as_ref().unwrap();
    assert_eq!(usage.total, 12379082596984);
    assert_eq!(usage.per_cpu, vec![6016271658950, 6362810938034]);
    let hz = clock_ticks_per_second();
    assert_eq!(usage.user, 1050 * 1_000_000_000 / hz);
    assert_eq!(usage.kernel, 187 * 1_000_000_000 / hz);
    let throttling = m.cpu.throttling.as_ref().unwrap();
    assert_eq!(
        (
            throttling.periods,
            throttling.throttled_periods,
            throttling.throttled_time
        ),
        (120, 7, 350000000)
    );

    let mem = m.memory.as_ref().unwrap();
    assert_eq!(mem.cache, 2265088);
    assert_eq!(mem.rss, 602112);
    assert_eq!(mem.pg_pg_in, 1427);
    assert_eq!(mem.pg_maj_fault, 13);
    assert_eq!(mem.total_inactive_file, 1490944);
    assert_eq!(mem.total_pg_pg_out, 720);
    assert_eq!(mem.hierarchical_memory_limit, 16777216);
    assert_eq!(mem.hierarchical_swap_limit, 9223372036854771712);
    let usage = mem.usage.as_ref().unwrap();
    assert_eq!(
        (usage.usage, usage.limit, usage.max, usage.failcnt),
        (3194880, 16777216, 16773120, 812)
    );
    // Swap accounting off: no memsw files, no swap entry.
    assert!(mem.swap.is_none());
    assert_eq!(mem.kernel.as_ref().unwrap().max, 409600);
    assert!(mem.kernel_tcp.is_none());
    let oom = m.memory_oom_control.as_ref().unwrap();
    assert_eq!(
        (oom.oom_kill_disable, oom.under_oom, oom.oom_kill),
        (0, 0, 3)
    );

    assert_eq!((m.pids.current, m.pids.limit), (5, 0));

    let blkio = m.blkio.as_ref().unwrap();
    let ops: Vec<(&str, u64)> = blkio
        .io_service_bytes_recursive
        .iter()
        .map(|e| (e.op.as_str(), e.value))
        .collect();
    assert_eq!(
        ops,
        vec![
            ("Read", 4096),
            ("Write", 8192),
            ("Sync", 0),
            ("Async", 12288),
            ("Discard", 0),
            ("Total", 12288)
        ]
    );
    assert!(blkio
        .io_service_bytes_recursive
        .iter()
        .all(|e| (e.major, e.minor) == (8, 0)));
    assert_eq!(blkio.io_serviced_recursive.len(), 6);
    assert_eq!(blkio.io_serviced_recursive[1].value, 2);

    assert_eq!(m.hugetlb.len(), 1);
    let huge = &m.hugetlb[0];
    assert_eq!(
        (huge.pagesize.as_str(), huge.usage, huge.max, huge.failcnt),
        ("2MB", 2097152, 4194304, 1)
    );

    assert_eq!(cgroup.oom_kills().unwrap(), 3);
}

#[test]
fn v1_missing_optional_files_are_zero_and_a_bad_number_is_an_error() {
    let root = tempfile::tempdir().unwrap();
    let memory = root.path().join("memory");
    std::fs::create_dir(&memory).unwrap();
    write(&memory, "memory.usage_in_bytes", "100\n");
    let cgroup = Cgroup::V1(BTreeMap::from([("memory".to_string(), memory.clone())]));
    let m = v1::Metrics::parse_from_bytes(&cgroup.metrics().unwrap().value).unwrap();
    let mem = m.memory.as_ref().unwrap();
    assert_eq!(mem.usage.usage, 100);
    assert_eq!(mem.usage.limit, 0);
    assert_eq!(mem.cache, 0);
    assert!(m.cpu.is_none() && m.pids.is_none() && m.memory_oom_control.is_none());

    write(&memory, "memory.usage_in_bytes", "lots\n");
    let got = cgroup.metrics();
    assert!(
        matches!(got, Err(CgroupError::BadNumber { ref value, .. }) if value == "lots"),
        "{got:?}"
    );
}

#[test]
fn v1_gone_and_old_kernels() {
    let root = tempfile::tempdir().unwrap();
    let cgroup = fake_v1(root.path());
    // A kernel older than 4.13: no oom_kill line.
    let memory = root.path().join("memory");
    write(
        &memory,
        "memory.oom_control",
        "oom_kill_disable 0\nunder_oom 0\n",
    );
    let got = cgroup.oom_kills();
    assert!(
        matches!(got, Err(CgroupError::NoOomKillCounter { .. })),
        "{got:?}"
    );

    std::fs::remove_dir_all(&memory).unwrap();
    let got = cgroup.metrics();
    assert!(
        matches!(got, Err(CgroupError::Gone { ref path }) if *path == memory),
        "{got:?}"
    );
    let got = cgroup.oom_kills();
    assert!(matches!(got, Err(CgroupError::Gone { .. })), "{got:?}");

    let no_memory = Cgroup::V1(BTreeMap::from([(
        "pids".to_string(),
        PathBuf::from("/nonexistent"),
    )]));
    let got = no_memory.oom_kills();
    assert!(
        matches!(
            got,
            Err(CgroupError::NoController {
                controller: "memory"
            })
        ),
        "{got:?}"
    );
    let got = Cgroup::V1(BTreeMap::new()).metrics();
    assert!(matches!(got, Err(CgroupError::NoControllers)), "{got:?}");
}

/// A v2 cgroup as runc makes it, in a tempdir.
fn fake_v2(dir: &Path) {
    write(
        dir,
        "cpu.stat",
        "usage_usec 120000\nuser_usec 80000\nsystem_usec 40000\ncore_sched.force_idle_usec 0\nnr_periods 50\nnr_throttled 4\nthrottled_usec 9000\nnr_bursts 1\nburst_usec 20\n",
    );
    write(dir, "memory.current", "3194880\n");
    write(dir, "memory.max", "max\n");
    write(dir, "memory.peak", "16773120\n");
    write(dir, "memory.swap.current", "0\n");
    write(dir, "memory.swap.max", "0\n");
    write(
        dir,
        "memory.stat",
        "anon 602112\nfile 2265088\nkernel 327680\nkernel_stack 16384\nslab 200000\nsock 0\nshmem 0\nfile_mapped 1216512\nfile_dirty 4096\nfile_writeback 0\nanon_thp 0\ninactive_anon 593920\nactive_anon 8192\ninactive_file 1490944\nactive_file 774144\nunevictable 0\nslab_reclaimable 150000\nslab_unreclaimable 50000\nworkingset_refault_anon 0\nworkingset_refault_file 0\npgfault 1870\npgmajfault 13\npgscan 7\n",
    );
    write(
        dir,
        "memory.events",
        "low 0\nhigh 0\nmax 812\noom 3\noom_kill 2\noom_group_kill 0\n",
    );
    write(dir, "pids.current", "5\n");
    write(dir, "pids.max", "100\n");
    write(
        dir,
        "io.stat",
        "8:0 rbytes=4096 wbytes=8192 rios=1 wios=2 dbytes=0 dios=0\n253:1 rbytes=10 wbytes=0 rios=1 wios=0 dbytes=0 dios=0\n",
    );
    write(dir, "hugetlb.2MB.current", "2097152\n");
    write(dir, "hugetlb.2MB.max", "max\n");
    write(dir, "hugetlb.2MB.events", "max 1\n");
}

#[test]
fn v2_metrics_from_a_fake_tree() {
    let dir = tempfile::tempdir().unwrap();
    fake_v2(dir.path());
    let cgroup = Cgroup::V2(dir.path().to_path_buf());
    let any = cgroup.metrics().unwrap();
    assert_eq!(any.type_url, "io.containerd.cgroups.v2.Metrics");
    let m = v2::Metrics::parse_from_bytes(&any.value).unwrap();

    let cpu = m.cpu.as_ref().unwrap();
    assert_eq!(
        (cpu.usage_usec, cpu.user_usec, cpu.system_usec),
        (120000, 80000, 40000)
    );
    assert_eq!(
        (
            cpu.nr_periods,
            cpu.nr_throttled,
            cpu.throttled_usec,
            cpu.nr_bursts,
            cpu.burst_usec
        ),
        (50, 4, 9000, 1, 20)
    );
    let mem = m.memory.as_ref().unwrap();
    assert_eq!(
        (mem.usage, mem.usage_limit, mem.max_usage),
        (3194880, u64::MAX, 16773120)
    );
    assert_eq!((mem.swap_usage, mem.swap_limit), (0, 0));
    assert_eq!(
        (mem.anon, mem.file, mem.inactive_file),
        (602112, 2265088, 1490944)
    );
    assert_eq!(
        (mem.slab_reclaimable, mem.pgmajfault, mem.pgscan),
        (150000, 13, 7)
    );
    let events = m.memory_events.as_ref().unwrap();
    assert_eq!((events.max, events.oom, events.oom_kill), (812, 3, 2));
    assert_eq!((m.pids.current, m.pids.limit), (5, 100));
    let io = &m.io.as_ref().unwrap().usage;
    assert_eq!(io.len(), 2);
    assert_eq!(
        (
            io[0].major,
            io[0].minor,
            io[0].rbytes,
            io[0].wbytes,
            io[0].rios,
            io[0].wios
        ),
        (8, 0, 4096, 8192, 1, 2)
    );
    assert_eq!((io[1].major, io[1].minor, io[1].rbytes), (253, 1, 10));
    assert_eq!(m.hugetlb.len(), 1);
    assert_eq!(
        (
            m.hugetlb[0].pagesize.as_str(),
            m.hugetlb[0].current,
            m.hugetlb[0].max,
            m.hugetlb[0].failcnt
        ),
        ("2MB", 2097152, u64::MAX, 1)
    );

    assert_eq!(cgroup.oom_kills().unwrap(), 2);

    write(dir.path(), "io.stat", "8:0 rbytes=x\n");
    let got = cgroup.metrics();
    assert!(matches!(got, Err(CgroupError::BadNumber { .. })), "{got:?}");
}

#[test]
fn v2_gone() {
    let dir = tempfile::tempdir().unwrap();
    let gone = dir.path().join("gone");
    let cgroup = Cgroup::V2(gone.clone());
    let got = cgroup.metrics();
    assert!(
        matches!(got, Err(CgroupError::Gone { ref path }) if *path == gone),
        "{got:?}"
    );
    let got = cgroup.oom_kills();
    assert!(matches!(got, Err(CgroupError::Gone { .. })), "{got:?}");
}

/// The metrics' type URLs are the messages' full proto names (read here from the
/// descriptors, which the shim itself never builds).
#[test]
fn the_metrics_type_urls_are_their_full_proto_names() {
    use protobuf::MessageFull;
    assert_eq!(V1_METRICS, v1::Metrics::descriptor().full_name());
    assert_eq!(V2_METRICS, v2::Metrics::descriptor().full_name());
}
