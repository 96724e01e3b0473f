//! The in-memory image index: image id → what CRI reports about it, and every reference
//! (containerd image record name) → image id.
//!
//! containerd is the source of truth: this index is rebuilt from containerd's image records at
//! start (a refresh of every record), and kept in sync by pulls, removals and `/images/` events. An image is one config
//! digest (its id) with any number of references: `name:tag` records become repo tags,
//! `name@sha256:…` records repo digests. The same image under two registry names is one entry
//! with two tags, and removing it by id drops every reference.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};

use super::manifest::ImageConfig;

/// What CRI reports about an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageInfo {
    /// Image id: the config digest, `sha256:<hex>`.
    pub id: String,
    /// References of the form `name:tag`.
    pub repo_tags: BTreeSet<String>,
    /// References of the form `name@sha256:…`.
    pub repo_digests: BTreeSet<String>,
    /// Bytes of content the image needs (manifest, config, compressed layers).
    pub size: u64,
    /// The config's `User` field, as written.
    pub user: String,
    /// Top layer's chain ID: the parent of container rootfs snapshots.
    pub chain_id: String,
    /// Never garbage-collected by kubelet (e.g. the sandbox image).
    pub pinned: bool,
    /// The image config as parsed: every field CRI answers and container specs use (platform,
    /// creation time, user, env, entrypoint, cmd, working dir, labels, exposed ports,
    /// volumes, stop signal, diff IDs). Not the raw blob: a config can be tens of MiB (build
    /// history, keys no runtime reads), and the index keeps every image's for its lifetime.
    /// Shared: the index hands out clones of `ImageInfo`.
    pub config: Arc<ImageConfig>,
}

impl ImageInfo {
    /// The image as a container's status names it (CRI `image_ref`): its first repo digest,
    /// else its id.
    pub fn reference(&self) -> String {
        self.repo_digests
            .iter()
            .next()
            .cloned()
            .unwrap_or_else(|| self.id.clone())
    }

    /// `uid` and `username` as CRI reports them from the config's `User`: a numeric user (or
    /// `uid:gid`) gives a uid, anything else a username; empty gives neither.
    pub fn user_ids(&self) -> (Option<i64>, String) {
        let user = self.user.split(':').next().unwrap_or("");
        if user.is_empty() {
            return (None, String::new());
        }
        match user.parse::<i64>() {
            Ok(uid) => (Some(uid), String::new()),
            Err(_) => (None, user.to_string()),
        }
    }
}

#[derive(Default)]
struct Inner {
    images: HashMap<String, ImageInfo>,
    /// Reference (record name) → image id.
    refs: HashMap<String, String>,
}

/// The index. All methods are short critical sections; no I/O under the lock.
#[derive(Default)]
pub struct ImageIndex {
    inner: RwLock<Inner>,
}

fn is_digest_ref(r: &str) -> bool {
    r.contains('@')
}

impl ImageIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        // Poisoning needs a panic inside one of the small sections below; the data is still
        // consistent (each section completes its update before anything can panic).
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Records that `reference` names the image `info` (whose own tags/digests are ignored:
    /// they are derived from the references). A reference that named another image moves.
    pub fn add_ref(&self, reference: &str, info: ImageInfo) {
        let mut inner = self.write();
        if let Some(old) = inner.refs.get(reference).cloned() {
            if old != info.id {
                detach(&mut inner, reference, &old);
            }
        }
        let id = info.id.clone();
        let entry = inner.images.entry(id.clone()).or_insert_with(|| ImageInfo {
            repo_tags: BTreeSet::new(),
            repo_digests: BTreeSet::new(),
            ..info.clone()
        });
        entry.pinned |= info.pinned;
        if is_digest_ref(reference) {
            entry.repo_digests.insert(reference.to_string());
        } else if reference != id {
            entry.repo_tags.insert(reference.to_string());
        }
        inner.refs.insert(reference.to_string(), id);
    }

    /// Forgets `reference`; the image goes when its last reference goes. Returns the image id
    /// it named.
    pub fn remove_ref(&self, reference: &str) -> Option<String> {
        let mut inner = self.write();
        let id = inner.refs.get(reference).cloned()?;
        detach(&mut inner, reference, &id);
        Some(id)
    }

    /// Finds an image by id (`sha256:<hex>` or bare hex), by a unique id prefix of at least 12
    /// hex digits, or by a reference (record name, already normalised by the caller).
    pub fn get(&self, key: &str) -> Option<ImageInfo> {
        let inner = self.read();
        if let Some(id) = inner.refs.get(key) {
            return inner.images.get(id).cloned();
        }
        let hex = key.strip_prefix("sha256:").unwrap_or(key);
        if let Some(i) = inner.images.get(&format!("sha256:{hex}")) {
            return Some(i.clone());
        }
        if hex.len() >= 12 && hex.chars().all(|c| c.is_ascii_hexdigit()) {
            let mut found = inner.images.values().filter(|i| {
                i.id.strip_prefix("sha256:")
                    .unwrap_or(&i.id)
                    .starts_with(hex)
            });
            let first = found.next()?;
            if found.next().is_none() {
                return Some(first.clone());
            }
        }
        None
    }

    /// Finds a local image by id, id prefix, or any reference form (normalised first:
    /// `busybox` finds `docker.io/library/busybox:latest`).
    pub fn find(&self, image: &str) -> Option<ImageInfo> {
        use super::reference::{is_image_id, Reference};
        if is_image_id(image) {
            return self.get(image);
        }
        match Reference::parse(image) {
            Ok(r) => self.get(&r.to_string()).or_else(|| self.get(image)),
            // Not a reference: maybe a bare id or id prefix.
            Err(_) => self.get(image),
        }
    }

    /// Every reference that names image `id` (tags, digests, and an id-named record if any).
    pub fn refs_of(&self, id: &str) -> Vec<String> {
        let inner = self.read();
        let mut refs: Vec<String> = inner
            .refs
            .iter()
            .filter(|(_, v)| v.as_str() == id)
            .map(|(k, _)| k.clone())
            .collect();
        refs.sort();
        refs
    }

    /// Every reference the index holds.
    pub fn all_refs(&self) -> Vec<String> {
        self.read().refs.keys().cloned().collect()
    }

    /// All images, sorted by id.
    pub fn list(&self) -> Vec<ImageInfo> {
        let inner = self.read();
        let mut all: Vec<ImageInfo> = inner.images.values().cloned().collect();
        all.sort_by(|a, b| a.id.cmp(&b.id));
        all
    }
}

fn detach(inner: &mut Inner, reference: &str, id: &str) {
    inner.refs.remove(reference);
    let now_empty = match inner.images.get_mut(id) {
        Some(img) => {
            img.repo_tags.remove(reference);
            img.repo_digests.remove(reference);
            !inner.refs.values().any(|v| v == id)
        }
        None => false,
    };
    if now_empty {
        inner.images.remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn img(id: &str) -> ImageInfo {
        ImageInfo {
            id: id.into(),
            repo_tags: BTreeSet::new(),
            repo_digests: BTreeSet::new(),
            size: 10,
            user: String::new(),
            chain_id: "sha256:c".into(),
            pinned: false,
            config: Default::default(),
        }
    }

    const A: &str = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const B: &str = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    #[test]
    fn two_names_one_image() {
        let idx = ImageIndex::new();
        idx.add_ref("registry.k8s.io/pause:3.9", img(A));
        idx.add_ref("k8s.gcr.io/pause:3.9", img(A));
        idx.add_ref("registry.k8s.io/pause@sha256:1111", img(A));
        let all = idx.list();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].repo_tags.len(), 2);
        assert_eq!(all[0].repo_digests.len(), 1);
        assert_eq!(idx.refs_of(A).len(), 3);
        assert_eq!(idx.get("k8s.gcr.io/pause:3.9").unwrap().id, A);
    }

    #[test]
    fn lookup_by_id_bare_hex_and_unique_prefix() {
        let idx = ImageIndex::new();
        idx.add_ref("a:1", img(A));
        idx.add_ref("b:1", img(B));
        assert_eq!(idx.get(A).unwrap().id, A);
        assert_eq!(idx.get(&A[7..]).unwrap().id, A);
        assert_eq!(idx.get("aaaaaaaaaaaa").unwrap().id, A);
        assert!(idx.get("aaaa").is_none(), "short prefixes are not ids");
        assert!(idx.get("c:1").is_none());
    }

    #[test]
    fn retagging_moves_the_tag_and_last_ref_drops_the_image() {
        let idx = ImageIndex::new();
        idx.add_ref("x:latest", img(A));
        idx.add_ref("x:latest", img(B));
        assert!(idx.get(A).is_none(), "A lost its only reference");
        assert!(idx.get(B).unwrap().repo_tags.contains("x:latest"));
        assert_eq!(idx.remove_ref("x:latest"), Some(B.to_string()));
        assert!(idx.list().is_empty());
        assert_eq!(idx.remove_ref("x:latest"), None);
    }

    #[test]
    fn user_ids_split_numeric_and_named() {
        let mut i = img(A);
        i.user = "1000:1000".into();
        assert_eq!(i.user_ids(), (Some(1000), String::new()));
        i.user = "nobody".into();
        assert_eq!(i.user_ids(), (None, "nobody".into()));
        i.user = String::new();
        assert_eq!(i.user_ids(), (None, String::new()));
    }
}
