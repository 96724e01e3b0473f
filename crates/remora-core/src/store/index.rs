//! An id-keyed map with unique-prefix lookup, shared by the sandbox and container stores.
//!
//! CRI clients (crictl, humans) pass truncated ids; containerd's CRI accepts any prefix that
//! matches exactly one id (its `truncindex`). A `BTreeMap` gives that lookup as a range scan,
//! so the cost is O(log n + 2) whatever the store size.

use std::collections::BTreeMap;
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::StoreError;

/// Ids and their entries, sorted so that all ids with a prefix are contiguous.
#[derive(Debug)]
pub(crate) struct PrefixIndex<T> {
    entries: BTreeMap<String, T>,
}

impl<T> Default for PrefixIndex<T> {
    fn default() -> Self {
        PrefixIndex {
            entries: BTreeMap::new(),
        }
    }
}

impl<T> PrefixIndex<T> {
    pub(crate) fn insert(&mut self, id: &str, entry: T) -> Result<(), StoreError> {
        if self.entries.contains_key(id) {
            return Err(StoreError::AlreadyExists { id: id.to_string() });
        }
        self.entries.insert(id.to_string(), entry);
        Ok(())
    }

    /// The full id for `id_or_prefix`: an exact match first (a full id is never ambiguous,
    /// even if it prefixes a longer one), else the only id starting with it.
    pub(crate) fn resolve(&self, id_or_prefix: &str) -> Result<&str, StoreError> {
        if id_or_prefix.is_empty() {
            return Err(StoreError::NotFound { id: String::new() });
        }
        if let Some((id, _)) = self.entries.get_key_value(id_or_prefix) {
            return Ok(id);
        }
        let mut matches = self
            .entries
            .range::<str, _>((
                std::ops::Bound::Included(id_or_prefix),
                std::ops::Bound::Unbounded,
            ))
            .take_while(|(id, _)| id.starts_with(id_or_prefix));
        match (matches.next(), matches.next()) {
            (Some((id, _)), None) => Ok(id),
            (None, _) => Err(StoreError::NotFound {
                id: id_or_prefix.to_string(),
            }),
            (Some(_), Some(_)) => Err(StoreError::Ambiguous {
                prefix: id_or_prefix.to_string(),
                matches: 2 + matches.count(),
            }),
        }
    }

    pub(crate) fn get(&self, id_or_prefix: &str) -> Result<&T, StoreError> {
        let id = self.resolve(id_or_prefix)?;
        self.entries
            .get(id)
            .ok_or_else(|| StoreError::NotFound { id: id.to_string() })
    }

    pub(crate) fn remove(&mut self, full_id: &str) -> Option<T> {
        self.entries.remove(full_id)
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &T> {
        self.entries.values()
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// An id filter of a List call: the full id of a unique prefix, else the filter verbatim
    /// (an ambiguous or unknown prefix then matches nothing, as in containerd); `None` for an
    /// absent or empty filter.
    pub(crate) fn filter_id(&self, id: Option<&str>) -> Option<String> {
        id.filter(|id| !id.is_empty()).map(|id| {
            self.resolve(id)
                .map(str::to_string)
                .unwrap_or_else(|_| id.to_string())
        })
    }
}

/// A [`PrefixIndex`] behind a read-write lock: what the sandbox and container stores share.
#[derive(Debug)]
pub(crate) struct SharedIndex<T>(RwLock<PrefixIndex<T>>);

impl<T> Default for SharedIndex<T> {
    fn default() -> Self {
        SharedIndex(RwLock::new(PrefixIndex::default()))
    }
}

impl<T: Clone> SharedIndex<T> {
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, PrefixIndex<T>> {
        // Index operations cannot panic half-way (BTreeMap insert/remove), so a poisoned lock
        // still guards a consistent map.
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, PrefixIndex<T>> {
        // As in `read`.
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds `entry`; `AlreadyExists` if `id` is taken.
    pub(crate) fn insert(&self, id: &str, entry: T) -> Result<(), StoreError> {
        self.write().insert(id, entry)
    }

    /// The entry with this full id or unique id prefix.
    pub(crate) fn get(&self, id_or_prefix: &str) -> Result<T, StoreError> {
        self.read().get(id_or_prefix).cloned()
    }

    /// The full id for a full id or unique prefix.
    pub(crate) fn resolve(&self, id_or_prefix: &str) -> Result<String, StoreError> {
        self.read().resolve(id_or_prefix).map(str::to_string)
    }

    pub(crate) fn len(&self) -> usize {
        self.read().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(ids: &[&str]) -> PrefixIndex<u32> {
        let mut i = PrefixIndex::default();
        for (n, id) in ids.iter().enumerate() {
            i.insert(id, n as u32).unwrap();
        }
        i
    }

    #[test]
    fn full_id_and_unique_prefix() {
        let i = index(&["abc123", "abd456", "ff00"]);
        assert_eq!(i.resolve("abc123").unwrap(), "abc123");
        assert_eq!(i.resolve("abc").unwrap(), "abc123");
        assert_eq!(i.resolve("f").unwrap(), "ff00");
        assert_eq!(*i.get("abd").unwrap(), 1);
    }

    #[test]
    fn ambiguous_prefix_counts_matches() {
        let i = index(&["abc123", "abd456", "abe789", "ff00"]);
        assert_eq!(
            i.resolve("ab"),
            Err(StoreError::Ambiguous {
                prefix: "ab".into(),
                matches: 3
            })
        );
    }

    #[test]
    fn exact_id_wins_over_longer_ids_it_prefixes() {
        let i = index(&["abc", "abcdef"]);
        assert_eq!(i.resolve("abc").unwrap(), "abc");
        assert!(matches!(i.resolve("ab"), Err(StoreError::Ambiguous { .. })));
    }

    #[test]
    fn not_found_and_empty() {
        let i = index(&["abc"]);
        assert_eq!(
            i.resolve("abd"),
            Err(StoreError::NotFound { id: "abd".into() })
        );
        assert_eq!(i.resolve(""), Err(StoreError::NotFound { id: "".into() }));
        // Past the end of the map.
        assert!(i.resolve("zzz").is_err());
    }

    #[test]
    fn duplicate_insert_and_remove() {
        let mut i = index(&["abc"]);
        assert_eq!(
            i.insert("abc", 9),
            Err(StoreError::AlreadyExists { id: "abc".into() })
        );
        assert_eq!(i.remove("abc"), Some(0));
        assert_eq!(i.len(), 0);
        assert!(i.get("abc").is_err());
    }
}
