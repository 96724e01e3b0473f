//! A container's or pod's resources as remora records them: CRI `LinuxContainerResources`
//! in the form containerd reports it in (a container's status, a pod's
//! UpdatePodSandboxResources).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::spec::Resources;

/// CRI `LinuxContainerResources` in the JSON form containerd reports it in (the protobuf
/// field names; zero and empty fields left out, as Go's `omitempty`). Defined here, not
/// derived from the spec types, so the stored form does not change with them.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct LinuxResources {
    /// CFS period (µs).
    #[serde(skip_serializing_if = "is_zero")]
    pub cpu_period: i64,
    /// CFS quota (µs).
    #[serde(skip_serializing_if = "is_zero")]
    pub cpu_quota: i64,
    /// CPU shares.
    #[serde(skip_serializing_if = "is_zero")]
    pub cpu_shares: i64,
    /// Memory limit (bytes).
    #[serde(skip_serializing_if = "is_zero")]
    pub memory_limit_in_bytes: i64,
    /// OOM score adjustment.
    #[serde(skip_serializing_if = "is_zero")]
    pub oom_score_adj: i64,
    /// cpuset CPUs.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub cpuset_cpus: String,
    /// cpuset memory nodes.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub cpuset_mems: String,
    /// Hugepage limits.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hugepage_limits: Vec<HugepageLimitRecord>,
    /// cgroup v2 unified key/values (sorted, so the stored JSON is stable).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub unified: BTreeMap<String, String>,
    /// Memory + swap limit (bytes).
    #[serde(skip_serializing_if = "is_zero")]
    pub memory_swap_limit_in_bytes: i64,
}

/// CRI `HugepageLimit` as stored.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct HugepageLimitRecord {
    /// Page size, e.g. `2MB`.
    pub page_size: String,
    /// Limit in bytes.
    pub limit: u64,
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

impl From<&Resources> for LinuxResources {
    fn from(r: &Resources) -> Self {
        LinuxResources {
            cpu_period: r.cpu_period,
            cpu_quota: r.cpu_quota,
            cpu_shares: r.cpu_shares,
            memory_limit_in_bytes: r.memory_limit_in_bytes,
            oom_score_adj: r.oom_score_adj,
            cpuset_cpus: r.cpuset_cpus.clone(),
            cpuset_mems: r.cpuset_mems.clone(),
            hugepage_limits: r
                .hugepage_limits
                .iter()
                .map(|h| HugepageLimitRecord {
                    page_size: h.page_size.clone(),
                    limit: h.limit,
                })
                .collect(),
            unified: r
                .unified
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            memory_swap_limit_in_bytes: r.memory_swap_limit_in_bytes,
        }
    }
}
