//! The in-memory index of pod sandboxes and containers (like containerd's
//! `internal/cri/store/{sandbox,container}`).
//!
//! - [`SandboxStore`] / [`ContainerStore`]: id → entry, lookup by full id or unique prefix,
//!   and listing with the CRI filters (`ListPodSandbox`, `ListContainers`).
//! - [`status`]: the container state machine (diagram there); every change is one atomic
//!   method on a [`Container`] handle.
//! - [`NameIndex`]: CRI name reservation, taken before a create starts and released on
//!   failure.
//! - [`persist`]: the labels and extension written on containerd records, from which the index
//!   is rebuilt at start — containerd is the source of truth, this is a cache of it.
//! - [`generate_id`]: sandbox and container ids.
//!
//! Plain domain types only: the CRI adapter maps protobuf messages to and from these.
//!
//! Locking: each store has one `RwLock` over its index and each entry its own `Mutex` over its
//! status. Both are held only for in-memory work, never across an `.await`; when both are
//! taken, the store's comes first.

mod base64_bytes;
pub mod container;
mod index;
pub mod name;
pub mod persist;
pub mod resources;
pub mod sandbox;
pub mod status;

use std::collections::HashMap;
use std::io::Read;

use thiserror::Error;

pub use container::{
    Container, ContainerFilter, ContainerMetadata, ContainerSnapshot, ContainerStore,
    ContainerUser, ImageRefs, MountSummary, PodRef,
};
pub use name::{container_name_key, sandbox_name_key, NameError, NameIndex};
pub use persist::{decode_extension, encode_extension, to_labels};
pub use resources::{HugepageLimitRecord, LinuxResources};
pub use sandbox::{
    PodResources, Sandbox, SandboxFilter, SandboxMetadata, SandboxSnapshot, SandboxState,
    SandboxStatus, SandboxStore,
};
pub use status::{ContainerState, ContainerStatus, ExitOutcome, OomOutcome, TransitionError};

/// A store lookup or update that failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum StoreError {
    /// No entry has this id, and none starts with it.
    #[error("{id:?} not found")]
    NotFound {
        /// The id or prefix asked for.
        id: String,
    },
    /// Several entries start with this prefix.
    #[error("id prefix {prefix:?} is ambiguous ({matches} matches)")]
    Ambiguous {
        /// The prefix asked for.
        prefix: String,
        /// How many ids start with it.
        matches: usize,
    },
    /// An entry with this id is already in the store.
    #[error("{id:?} already exists")]
    AlreadyExists {
        /// The id.
        id: String,
    },
    /// The entry's state forbids the operation (removing a running container).
    #[error(transparent)]
    Transition(#[from] TransitionError),
}

/// Generating an id failed.
#[derive(Debug, Error)]
pub enum IdError {
    /// The kernel's random source could not be read.
    #[error("reading {path}")]
    Random {
        /// The device read.
        path: &'static str,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

const RANDOM_DEVICE: &str = "/dev/urandom";

/// A new sandbox or container id: 64 lowercase hex chars (256 random bits) from the kernel's
/// CSPRNG, like containerd's. Read from `/dev/urandom` rather than through a new dependency;
/// it never blocks once the kernel's pool is initialised, which is long before kubelet runs.
pub fn generate_id() -> Result<String, IdError> {
    let mut bytes = [0u8; 32];
    std::fs::File::open(RANDOM_DEVICE)
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|source| IdError::Random {
            path: RANDOM_DEVICE,
            source,
        })?;
    Ok(hex::encode(bytes))
}

/// CRI label selector semantics: every key=value of the selector is among the labels (an
/// empty selector matches everything).
pub(crate) fn labels_match(
    labels: &HashMap<String, String>,
    selector: &HashMap<String, String>,
) -> bool {
    selector
        .iter()
        .all(|(k, v)| labels.get(k).is_some_and(|have| have == v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_64_hex_and_distinct() {
        let a = generate_id().unwrap();
        let b = generate_id().unwrap();
        assert_eq!(a.len(), 64);
        assert!(a
            .bytes()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(a, b);
    }

    #[test]
    fn label_selector() {
        let labels: HashMap<_, _> = [("a", "1"), ("b", "2")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let sel = |p: &[(&str, &str)]| -> HashMap<String, String> {
            p.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert!(labels_match(&labels, &sel(&[])));
        assert!(labels_match(&labels, &sel(&[("a", "1"), ("b", "2")])));
        assert!(!labels_match(&labels, &sel(&[("a", "2")])));
        assert!(!labels_match(&labels, &sel(&[("c", "")])));
    }
}
