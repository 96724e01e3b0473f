//! Name reservation: CRI pod and container names are unique, and the check must happen before
//! any work starts so two concurrent `RunPodSandbox` calls for the same pod cannot both build a
//! sandbox. The name is reserved first and released if the operation fails (or when the object
//! is removed), as containerd's `registrar` does.
//!
//! The keys are the ones kubelet and containerd build, so names collide exactly when they would
//! in containerd: a sandbox is `<name>_<namespace>_<uid>_<attempt>`, a container
//! `<name>_<sandbox name>_<sandbox namespace>_<sandbox uid>_<attempt>`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use thiserror::Error;

/// A refused reservation.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NameError {
    /// The name is held by another id.
    #[error("name {name:?} is reserved for {holder:?}")]
    AlreadyExists {
        /// The name key.
        name: String,
        /// The id holding it.
        holder: String,
    },
}

/// The name key of a pod sandbox.
pub fn sandbox_name_key(name: &str, namespace: &str, uid: &str, attempt: u32) -> String {
    format!("{name}_{namespace}_{uid}_{attempt}")
}

/// The name key of a container in the sandbox named by the other arguments.
pub fn container_name_key(
    name: &str,
    sandbox_name: &str,
    sandbox_namespace: &str,
    sandbox_uid: &str,
    attempt: u32,
) -> String {
    format!("{name}_{sandbox_name}_{sandbox_namespace}_{sandbox_uid}_{attempt}")
}

/// Name key → id of the holder. One index for sandboxes and one for containers.
#[derive(Debug, Default)]
pub struct NameIndex {
    names: Mutex<HashMap<String, String>>,
}

impl NameIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, String>> {
        // No code path panics while holding the lock (plain map operations), and the map is
        // consistent after every statement, so a poisoned lock's data is still valid.
        self.names.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reserves `name` for `id`. Reserving a name again for the same id succeeds (a retried
    /// request, or the rebuild at start), for another id fails.
    pub fn reserve(&self, name: &str, id: &str) -> Result<(), NameError> {
        let mut names = self.lock();
        match names.get(name) {
            Some(holder) if holder != id => Err(NameError::AlreadyExists {
                name: name.to_string(),
                holder: holder.clone(),
            }),
            Some(_) => Ok(()),
            None => {
                names.insert(name.to_string(), id.to_string());
                Ok(())
            }
        }
    }

    /// Releases `name`; releasing a free name is a no-op (cleanup paths may run twice).
    pub fn release(&self, name: &str) {
        self.lock().remove(name);
    }

    /// The id holding `name`.
    pub fn holder(&self, name: &str) -> Option<String> {
        self.lock().get(name).cloned()
    }

    /// Reserves `name` for `id` and returns a guard that releases it on drop unless
    /// [`NameReservation::keep`] is called: the failure paths of a create need not remember
    /// to release, including early returns and cancellation of the request future.
    pub fn reserve_guarded(
        self: &Arc<Self>,
        name: &str,
        id: &str,
    ) -> Result<NameReservation, NameError> {
        self.reserve(name, id)?;
        Ok(NameReservation {
            index: Arc::clone(self),
            name: Some(name.to_string()),
        })
    }
}

/// A reservation released on drop unless kept.
#[derive(Debug)]
#[must_use = "dropping the reservation releases the name at once"]
pub struct NameReservation {
    index: Arc<NameIndex>,
    /// `None` once kept.
    name: Option<String>,
}

impl NameReservation {
    /// The operation succeeded: the name stays reserved until released explicitly.
    pub fn keep(mut self) {
        self.name = None;
    }
}

impl Drop for NameReservation {
    fn drop(&mut self) {
        if let Some(name) = self.name.take() {
            self.index.release(&name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_match_containerd() {
        assert_eq!(
            sandbox_name_key("web", "default", "u-1", 0),
            "web_default_u-1_0"
        );
        assert_eq!(
            container_name_key("nginx", "web", "default", "u-1", 2),
            "nginx_web_default_u-1_2"
        );
    }

    #[test]
    fn reserve_conflict_names_holder() {
        let n = NameIndex::new();
        n.reserve("a", "id1").unwrap();
        assert_eq!(
            n.reserve("a", "id2"),
            Err(NameError::AlreadyExists {
                name: "a".into(),
                holder: "id1".into()
            })
        );
        // Same id again is fine.
        n.reserve("a", "id1").unwrap();
        assert_eq!(n.holder("a").as_deref(), Some("id1"));
    }

    #[test]
    fn release_frees_and_is_idempotent() {
        let n = NameIndex::new();
        n.reserve("a", "id1").unwrap();
        n.release("a");
        n.release("a");
        assert_eq!(n.holder("a"), None);
        n.reserve("a", "id2").unwrap();
        assert_eq!(n.holder("a").as_deref(), Some("id2"));
    }

    #[test]
    fn guard_releases_on_drop_unless_kept() {
        let n = Arc::new(NameIndex::new());
        {
            let _g = n.reserve_guarded("a", "id1").unwrap();
            assert!(n.reserve("a", "id2").is_err());
        }
        assert_eq!(n.holder("a"), None);
        n.reserve_guarded("b", "id1").unwrap().keep();
        assert_eq!(n.holder("b").as_deref(), Some("id1"));
        assert!(n.reserve_guarded("b", "id3").is_err());
        // The failed guard did not release the holder's name.
        assert_eq!(n.holder("b").as_deref(), Some("id1"));
    }

    #[test]
    fn concurrent_reservations_one_winner() {
        let n = Arc::new(NameIndex::new());
        let winners: usize = std::thread::scope(|s| {
            let handles: Vec<_> = (0..16)
                .map(|i| {
                    let n = &n;
                    s.spawn(move || n.reserve("pod", &format!("id{i}")).is_ok())
                })
                .collect();
            handles
                .into_iter()
                .map(|h| usize::from(h.join().unwrap()))
                .sum()
        });
        assert_eq!(winners, 1);
    }
}
