//! cgroup resources and the OOM score.
//!
//! Zero means "not set" (CRI's convention), so only non-zero values reach the spec.
//! Negative values are rejected naming the field instead of being wrapped into huge
//! unsigned numbers. On cgroup v1 the swap limit equals the memory limit unless asked
//! otherwise (containerd's way to keep containers out of swap), and only where the kernel
//! has swap accounting; hugepage limits are dropped when the hugetlb controller is missing.

use oci_spec::runtime::{
    LinuxCpuBuilder, LinuxHugepageLimitBuilder, LinuxMemoryBuilder, LinuxPidsBuilder,
    LinuxResources, LinuxResourcesBuilder,
};

use super::types::{HostFacts, Resources};
use super::SpecError;

fn non_negative(field: &'static str, value: i64) -> Result<i64, SpecError> {
    if value < 0 {
        Err(SpecError::NegativeResource { field, value })
    } else {
        Ok(value)
    }
}

/// The process's `oom_score_adj`: the requested value, raised to the host's minimum (remora's
/// own score; lower needs CAP_SYS_RESOURCE, which remora may lack, and then runc fails with
/// an unhelpful "can't get final child's PID").
pub fn oom_score_adj(requested: i64, min: i32) -> Result<i32, SpecError> {
    if !(-1000..=1000).contains(&requested) {
        return Err(SpecError::InvalidOomScoreAdj { value: requested });
    }
    // In range -1000..=1000 checked above, so the cast cannot truncate.
    Ok((requested as i32).max(min))
}

/// The value rules of [`Resources`]: no negative CPU or memory value but a CPU quota of -1,
/// an `oom_score_adj` within -1000..=1000. The CRI adapter applies them before anything is
/// made; the spec generator applies them again for any other caller.
///
/// A quota of -1 is "no limit": kubelet sends it for a pod whose CPU is not limited
/// (`UpdatePodSandboxResources` in an in-place resize) and for a container whose quota it
/// turns off; the OCI runtime writes it as cgroup v1's `cpu.cfs_quota_us` -1 or v2's `max`,
/// and containerd's CRI and CRI-O pass it on as sent.
pub fn check(r: &Resources) -> Result<(), SpecError> {
    non_negative("cpu_period", r.cpu_period)?;
    if r.cpu_quota < -1 {
        return Err(SpecError::CpuQuotaBelowNoLimit { value: r.cpu_quota });
    }
    non_negative("cpu_shares", r.cpu_shares)?;
    non_negative("memory_limit_in_bytes", r.memory_limit_in_bytes)?;
    non_negative("memory_swap_limit_in_bytes", r.memory_swap_limit_in_bytes)?;
    oom_score_adj(r.oom_score_adj, i32::MIN).map(|_| ())
}

/// The cgroup resources of a container (without device rules, see [`super::devices`]).
pub fn linux_resources(r: &Resources, host: &HostFacts) -> Result<LinuxResources, SpecError> {
    check(r)?;
    // All non-negative but a quota of -1 (no limit), checked above.
    let (period, quota, shares) = (r.cpu_period, r.cpu_quota, r.cpu_shares);
    let (limit, swap) = (r.memory_limit_in_bytes, r.memory_swap_limit_in_bytes);

    let mut cpu = LinuxCpuBuilder::default();
    if period != 0 {
        cpu = cpu.period(period as u64); // non-negative, checked above
    }
    if quota != 0 {
        cpu = cpu.quota(quota);
    }
    if shares != 0 {
        cpu = cpu.shares(shares as u64); // non-negative, checked above
    }
    if !r.cpuset_cpus.is_empty() {
        cpu = cpu.cpus(r.cpuset_cpus.clone());
    }
    if !r.cpuset_mems.is_empty() {
        cpu = cpu.mems(r.cpuset_mems.clone());
    }

    let mut builder = LinuxResourcesBuilder::default().cpu(cpu.build()?);
    if limit != 0 {
        let mut mem = LinuxMemoryBuilder::default().limit(limit);
        if host.swap_accounting {
            mem = mem.swap(if swap != 0 { swap } else { limit });
        }
        builder = builder.memory(mem.build()?);
    }
    if let Some(pids) = r.pids_limit {
        builder = builder.pids(
            LinuxPidsBuilder::default()
                .limit(non_negative("pids_limit", pids)?)
                .build()?,
        );
    }
    if host.hugetlb_available && !r.hugepage_limits.is_empty() {
        let mut limits = Vec::with_capacity(r.hugepage_limits.len());
        for h in &r.hugepage_limits {
            let limit = i64::try_from(h.limit).map_err(|_| SpecError::ResourceTooLarge {
                field: "hugepage_limits",
                value: h.limit,
            })?;
            limits.push(
                LinuxHugepageLimitBuilder::default()
                    .page_size(h.page_size.clone())
                    .limit(limit)
                    .build()?,
            );
        }
        builder = builder.hugepage_limits(limits);
    }
    if !r.unified.is_empty() {
        builder = builder.unified(r.unified.clone());
    }
    Ok(builder.build()?)
}

#[cfg(test)]
mod tests {
    use super::super::types::HugepageLimit;
    use super::*;

    fn host() -> HostFacts {
        HostFacts {
            swap_accounting: true,
            hugetlb_available: true,
            ..HostFacts::default()
        }
    }

    #[test]
    fn oom_score_adj_is_clamped_and_checked() {
        assert_eq!(oom_score_adj(-998, -500).unwrap(), -500);
        assert_eq!(oom_score_adj(100, -500).unwrap(), 100);
        assert_eq!(oom_score_adj(-998, -999).unwrap(), -998);
        assert!(matches!(
            oom_score_adj(1001, 0),
            Err(SpecError::InvalidOomScoreAdj { value: 1001 })
        ));
        assert!(oom_score_adj(-1001, -1000).is_err());
    }

    #[test]
    fn cpu_and_memory() {
        let r = Resources {
            cpu_period: 100_000,
            cpu_quota: 50_000,
            cpu_shares: 512,
            memory_limit_in_bytes: 64 << 20,
            cpuset_cpus: "0-1".into(),
            cpuset_mems: "0".into(),
            ..Resources::default()
        };
        let res = linux_resources(&r, &host()).unwrap();
        let cpu = res.cpu().as_ref().unwrap();
        assert_eq!(
            (cpu.period(), cpu.quota(), cpu.shares()),
            (Some(100_000), Some(50_000), Some(512))
        );
        assert_eq!(cpu.cpus().as_deref(), Some("0-1"));
        assert_eq!(cpu.mems().as_deref(), Some("0"));
        let mem = res.memory().as_ref().unwrap();
        assert_eq!(mem.limit(), Some(64 << 20));
        assert_eq!(mem.swap(), Some(64 << 20), "swap = limit: no swap use");
        assert!(res.pids().is_none());
    }

    #[test]
    fn zero_means_unset() {
        let res = linux_resources(&Resources::default(), &host()).unwrap();
        let cpu = res.cpu().as_ref().unwrap();
        assert_eq!(
            (cpu.period(), cpu.quota(), cpu.shares()),
            (None, None, None)
        );
        assert!(res.memory().is_none());
        assert!(res.hugepage_limits().is_none());
    }

    #[test]
    fn explicit_swap_and_no_swap_accounting() {
        let r = Resources {
            memory_limit_in_bytes: 100,
            memory_swap_limit_in_bytes: 300,
            ..Resources::default()
        };
        let res = linux_resources(&r, &host()).unwrap();
        assert_eq!(res.memory().unwrap().swap(), Some(300));
        let no_swap = HostFacts {
            swap_accounting: false,
            ..host()
        };
        let res = linux_resources(&r, &no_swap).unwrap();
        assert_eq!(res.memory().unwrap().swap(), None);
    }

    #[test]
    fn negative_values_name_the_field() {
        for (r, field) in [
            (
                Resources {
                    cpu_shares: -1,
                    ..Resources::default()
                },
                "cpu_shares",
            ),
            (
                Resources {
                    cpu_period: -5,
                    ..Resources::default()
                },
                "cpu_period",
            ),
            (
                Resources {
                    memory_limit_in_bytes: -2,
                    ..Resources::default()
                },
                "memory_limit_in_bytes",
            ),
            (
                Resources {
                    pids_limit: Some(-1),
                    ..Resources::default()
                },
                "pids_limit",
            ),
        ] {
            let err = linux_resources(&r, &host()).unwrap_err();
            assert!(
                matches!(err, SpecError::NegativeResource { field: f, .. } if f == field),
                "{field}"
            );
            assert!(err.to_string().contains(field));
        }
    }

    #[test]
    fn a_cpu_quota_of_minus_one_is_no_limit_and_below_it_is_refused() {
        let r = Resources {
            cpu_quota: -1,
            cpu_period: 100_000,
            ..Resources::default()
        };
        let res = linux_resources(&r, &host()).unwrap();
        assert_eq!(res.cpu().as_ref().unwrap().quota(), Some(-1));
        let r = Resources {
            cpu_quota: -2,
            ..Resources::default()
        };
        let err = linux_resources(&r, &host()).unwrap_err();
        assert!(matches!(err, SpecError::CpuQuotaBelowNoLimit { value: -2 }));
        assert!(err.to_string().contains("cpu_quota"), "{err}");
    }

    #[test]
    fn hugepages_and_pids() {
        let r = Resources {
            hugepage_limits: vec![HugepageLimit {
                page_size: "2MB".into(),
                limit: 4 << 20,
            }],
            pids_limit: Some(100),
            ..Resources::default()
        };
        let res = linux_resources(&r, &host()).unwrap();
        let h = &res.hugepage_limits().as_ref().unwrap()[0];
        assert_eq!((h.page_size().as_str(), h.limit()), ("2MB", 4 << 20));
        assert_eq!(res.pids().unwrap().limit(), 100);
        // No hugetlb controller on the host: dropped rather than failing runc.
        let bare = HostFacts {
            hugetlb_available: false,
            ..host()
        };
        assert!(linux_resources(&r, &bare)
            .unwrap()
            .hugepage_limits()
            .is_none());
    }
}
