//! The on-disk cache of ADD results: DEL and CHECK use the config, capability arguments and
//! result ADD had, not the current conf dir.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{Attachment, CniExec, CniExecError, SUPPORTED_VERSIONS};

/// The on-disk cache entry for one attachment.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct CacheEntry {
    pub(super) kind: String,
    pub(super) network_name: String,
    pub(super) container_id: String,
    pub(super) if_name: String,
    pub(super) cni_version: String,
    pub(super) plugins: Vec<Map<String, Value>>,
    pub(super) capability_args: Map<String, Value>,
    pub(super) result: Value,
}

pub(super) const CACHE_KIND: &str = "remoraCniCacheV1";

impl CniExec {
    /// Where the ADD result of this attachment is cached.
    pub fn cache_path(&self, network: &str, rt: &Attachment) -> Result<PathBuf, CniExecError> {
        for (key, value) in [
            ("network", network),
            ("container id", rt.container_id.as_str()),
            ("ifname", rt.ifname.as_str()),
        ] {
            if value.is_empty() || value.contains('/') || value == ".." {
                return Err(CniExecError::InvalidArg {
                    key: key.into(),
                    value: value.into(),
                    reason: "must be a non-empty plain name",
                });
            }
        }
        Ok(self
            .cache_dir
            .join(format!("{network}-{}-{}", rt.container_id, rt.ifname)))
    }
}

pub(super) async fn write_cache(path: &Path, entry: &CacheEntry) -> Result<(), CniExecError> {
    let err = |action, source| CniExecError::Cache {
        action,
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent() {
        tokio::fs::create_dir_all(dir)
            .await
            .map_err(|e| err("create the directory of", e))?;
    }
    let bytes = serde_json::to_vec(entry).map_err(|e| err("encode", e.into()))?;
    // Write then rename, so a crash never leaves a half-written entry for DEL to trip on.
    let tmp = path.with_extension("tmp");
    tokio::fs::write(&tmp, bytes)
        .await
        .map_err(|e| err("write", e))?;
    tokio::fs::rename(&tmp, path)
        .await
        .map_err(|e| err("write", e))
}

/// Reads a cache entry. An unreadable or foreign entry counts as absent: DEL must still be
/// able to run (plugins tolerate a missing `prevResult`), and CHECK reports it as missing.
pub(super) async fn read_cache(path: &Path) -> Option<CacheEntry> {
    let bytes = tokio::fs::read(path).await.ok()?;
    let entry: CacheEntry = serde_json::from_slice(&bytes).ok()?;
    (entry.kind == CACHE_KIND && SUPPORTED_VERSIONS.contains(&entry.cni_version.as_str()))
        .then_some(entry)
}
