//! The on-disk cache of ADD results: DEL and CHECK use the config, capability arguments and
//! result ADD had, not the current conf dir.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tokio::io::AsyncWriteExt;

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
    let tmp = temp_path(path);
    let written = async {
        let mut f = tokio::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .await?;
        f.write_all(&bytes).await?;
        f.flush().await?;
        drop(f);
        tokio::fs::rename(&tmp, path).await
    }
    .await;
    if let Err(e) = written {
        let _ = tokio::fs::remove_file(&tmp).await;
        return Err(err("write", e));
    }
    Ok(())
}

/// A temporary name for writing `path`: its whole file name with a suffix unique to this
/// process and call. (`with_extension` cut the name at its first dot past the start, so the
/// entries of networks `a.x` and `a.y` shared one temporary file.)
fn temp_path(path: &Path) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{}.{n}.tmp", std::process::id()));
    path.with_file_name(name)
}

/// Reads a cache entry. An unreadable or foreign entry counts as absent: DEL must still be
/// able to run (plugins tolerate a missing `prevResult`), and CHECK reports it as missing.
pub(super) async fn read_cache(path: &Path) -> Option<CacheEntry> {
    let bytes = tokio::fs::read(path).await.ok()?;
    let entry: CacheEntry = serde_json::from_slice(&bytes).ok()?;
    (entry.kind == CACHE_KIND && SUPPORTED_VERSIONS.contains(&entry.cni_version.as_str()))
        .then_some(entry)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(network: &str) -> CacheEntry {
        CacheEntry {
            kind: CACHE_KIND.into(),
            network_name: network.into(),
            container_id: "c1".into(),
            if_name: "eth0".into(),
            cni_version: "1.0.0".into(),
            plugins: Vec::new(),
            capability_args: Map::new(),
            result: Value::Null,
        }
    }

    #[tokio::test]
    async fn networks_with_a_dot_do_not_share_a_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        // What `with_extension("tmp")` made of both names below, taken by something else.
        std::fs::create_dir(dir.path().join("pod.tmp")).unwrap();
        let (a, b) = (
            dir.path().join("pod.a-c1-eth0"),
            dir.path().join("pod.b-c1-eth0"),
        );
        let (ea, eb) = (entry("pod.a"), entry("pod.b"));
        let (ra, rb) = tokio::join!(write_cache(&a, &ea), write_cache(&b, &eb));
        ra.unwrap();
        rb.unwrap();
        assert_eq!(read_cache(&a).await.unwrap().network_name, "pod.a");
        assert_eq!(read_cache(&b).await.unwrap().network_name, "pod.b");
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["pod.a-c1-eth0", "pod.b-c1-eth0", "pod.tmp"]);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&a).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
}
