//! Intents: what a RunPodSandbox or CreateContainer in flight may have made, on disk, so that
//! a remora killed half way can undo it after a restart.
//!
//! An intent file `<state_dir>/pending/<id>.json` is written before the operation's first
//! side effect and removed once the operation succeeded or its rollback ran. An intent found
//! at start-up is stale (its RPC never answered, so kubelet does not know the id): the startup
//! sweep undoes everything the operation could have made (each step idempotent), then removes
//! the file. The in-memory undo list stays the fast path for failures remora survives.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// What an operation in flight may leave behind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Intent {
    /// RunPodSandbox: netns, CNI attachment, pod files, snapshot, record, pause task, lease.
    Sandbox {
        /// Sandbox id.
        id: String,
        /// Pod name, namespace and uid (CNI_ARGS of the DEL).
        name: String,
        /// Pod namespace.
        namespace: String,
        /// Pod uid.
        uid: String,
        /// The netns path, if the pod has its own network.
        netns_path: Option<PathBuf>,
    },
    /// CreateContainer: snapshot, temp mount, record, lease.
    Container {
        /// Container id.
        id: String,
    },
}

impl Intent {
    /// The object's id.
    pub fn id(&self) -> &str {
        match self {
            Intent::Sandbox { id, .. } | Intent::Container { id } => id,
        }
    }
}

/// The intents directory.
#[derive(Debug)]
pub struct Journal {
    dir: PathBuf,
    /// Intents found when remora started (not written by this process), by id.
    stale: Mutex<HashMap<String, Intent>>,
}

impl Journal {
    /// Opens `dir`, taking every intent already there as stale. Unreadable files are removed
    /// (an intent is written whole by a rename, so such a file is not remora's).
    pub fn open(dir: PathBuf) -> Self {
        let mut stale = HashMap::new();
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                let path = e.path();
                match std::fs::read(&path)
                    .ok()
                    .and_then(|b| serde_json::from_slice::<Intent>(&b).ok())
                {
                    Some(intent) if path.extension().is_some_and(|x| x == "json") => {
                        stale.insert(intent.id().to_string(), intent);
                    }
                    _ => {
                        let _ = std::fs::remove_file(&path);
                    }
                }
            }
        }
        // Made now, so a state dir's layout does not change with the first call.
        let _ = std::fs::create_dir_all(&dir);
        Self {
            dir,
            stale: Mutex::new(stale),
        }
    }

    /// The intents directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// Records `intent` durably before its first side effect.
    pub fn begin(&self, intent: &Intent) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let bytes = serde_json::to_vec(intent).map_err(std::io::Error::other)?;
        let tmp = self.dir.join(format!(".{}.tmp", intent.id()));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, self.path(intent.id()))
    }

    /// The operation on `id` finished (made or rolled back): forget its intent.
    pub fn end(&self, id: &str) {
        let _ = std::fs::remove_file(self.path(id));
    }

    /// An operation whose rollback did not complete: its intent stays on disk and joins the
    /// stale ones, so the next sweep (after containerd reconnects, or at start) finishes it.
    pub fn defer(&self, intent: Intent) {
        if let Ok(mut m) = self.stale.lock() {
            m.insert(intent.id().to_string(), intent);
        }
    }

    /// The stale intents not yet swept.
    pub fn stale(&self) -> Vec<Intent> {
        self.stale
            .lock()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Whether `id` has a stale intent (its objects are being swept, not recovered).
    pub fn is_stale(&self, id: &str) -> bool {
        self.stale
            .lock()
            .map(|m| m.contains_key(id))
            .unwrap_or(false)
    }

    /// A stale intent was swept: drop it.
    pub fn swept(&self, id: &str) {
        if let Ok(mut m) = self.stale.lock() {
            m.remove(id);
        }
        self.end(id);
    }
}

/// Unmounts and removes every directory directly under `dir` (what a killed CreateContainer
/// left under the temp-mount dir; a container's image volumes); returns how many went.
pub fn clear_temp_mounts(dir: &Path) -> usize {
    let mut cleared = 0;
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            let _ = nix::mount::umount2(&p, nix::mount::MntFlags::MNT_DETACH);
            if std::fs::remove_dir(&p).is_ok() {
                cleared += 1;
            }
        }
    }
    cleared
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intents_survive_a_restart_as_stale_and_go_when_swept() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("pending");
        let j = Journal::open(dir.clone());
        assert!(j.stale().is_empty());
        let pod = Intent::Sandbox {
            id: "p1".into(),
            name: "n".into(),
            namespace: "ns".into(),
            uid: "u".into(),
            netns_path: Some("/run/x/netns/p1".into()),
        };
        j.begin(&pod).unwrap();
        j.begin(&Intent::Container { id: "c1".into() }).unwrap();
        j.begin(&Intent::Container { id: "c2".into() }).unwrap();
        j.end("c2");
        assert!(
            j.stale().is_empty(),
            "this process's own intents are not stale"
        );

        std::fs::write(dir.join("garbage.json"), b"{").unwrap();
        let j = Journal::open(dir.clone());
        let mut ids: Vec<String> = j.stale().iter().map(|i| i.id().to_string()).collect();
        ids.sort();
        assert_eq!(ids, ["c1", "p1"]);
        assert!(j.is_stale("p1"));
        assert!(!dir.join("garbage.json").exists());
        assert!(j.stale().contains(&pod));
        j.swept("p1");
        assert!(!j.is_stale("p1"));
        assert!(!dir.join("p1.json").exists());
        assert_eq!(Journal::open(dir).stale().len(), 1);
    }
}
