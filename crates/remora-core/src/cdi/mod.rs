//! CDI (Container Device Interface): devices that device plugins and DRA drivers name as
//! `vendor/class=name` (in `ContainerConfig.cdi_devices`, or in `cdi.k8s.io/*` container
//! annotations), described by spec files that drivers write into the spec directories.
//!
//! Design: the registry ([`Registry`]) holds what the spec files define and re-reads them when
//! the directories change — checked on each resolve by listing the directories and comparing
//! names, inodes, sizes and modification times with those of the last load (no watcher
//! thread; a create that asks for no CDI device reads nothing). Reads are bounded (file size,
//! files per directory); a file that cannot be read or is invalid is skipped with one warning
//! per change, as the CDI module's cache does, and never stops remora. Directories later in
//! `spec_dirs` override earlier ones for the same device; two files of one directory that
//! define the same device make it ambiguous (refused by name).
//!
//! Resolution ([`Registry::resolve`]) yields the edits to apply — for each spec the first time
//! one of its devices is asked for, its spec-level edits, then the device's own, in request
//! order — and [`apply`] makes them on the generated OCI spec.

pub mod apply;
pub mod parse;
pub mod spec;

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use slog::{warn, Logger};
use thiserror::Error;

pub use apply::{apply, host_node};
pub use spec::ContainerEdits;

/// Largest spec file read.
pub const MAX_SPEC_BYTES: u64 = 1 << 20;
/// Spec files read per directory (the rest are skipped with a warning).
pub const MAX_SPECS_PER_DIR: usize = 256;

/// A device asked for, with the CRI field that named it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceRequest {
    /// `vendor/class=name` (already checked to be qualified).
    pub name: String,
    /// `config.cdi_devices[N]` or `config.annotations["cdi.k8s.io/…"]`.
    pub field: String,
}

/// Why CDI devices cannot be given to a container.
#[derive(Debug, Error)]
pub enum CdiError {
    /// Devices asked for while `[cdi] enabled = false`.
    #[error(
        "CDI devices ({devices}) requested but CDI support is disabled (`[cdi] enabled = false`)"
    )]
    Disabled {
        /// The names asked for.
        devices: String,
    },
    /// No spec file defines the device.
    #[error("{field}: unresolvable CDI device {name:?}: no valid CDI spec in {dirs} defines it")]
    Unresolvable {
        /// The CRI field.
        field: String,
        /// The device name.
        name: String,
        /// The spec directories searched.
        dirs: String,
    },
    /// Two spec files of the same directory define the device.
    #[error("{field}: ambiguous CDI device {name:?}: defined in {files}")]
    Ambiguous {
        /// The CRI field.
        field: String,
        /// The device name.
        name: String,
        /// The files that define it.
        files: String,
    },
    /// A device node's host path cannot be used.
    #[error("CDI device node {path:?}: cannot stat host device {host_path:?}: {source}")]
    HostDevice {
        /// Container path.
        path: String,
        /// Host path.
        host_path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A device node whose type disagrees with the host's node.
    #[error("CDI device node {path:?}: type {given:?} but host device {host_path:?} is {host:?}")]
    TypeMismatch {
        /// Container path.
        path: String,
        /// Host path.
        host_path: String,
        /// The type the spec gives.
        given: String,
        /// The host node's type.
        host: String,
    },
    /// oci-spec refused a value (a bug here, not in the spec file: files are validated).
    #[error("applying CDI edits: {0}")]
    Build(#[from] oci_spec::OciSpecError),
}

/// One loaded, valid spec file.
#[derive(Debug)]
struct LoadedSpec {
    path: PathBuf,
    spec: spec::Spec,
}

/// What a qualified device name resolves to.
#[derive(Debug, Clone)]
enum Entry {
    /// Device `index` of `spec`, from directory number `priority`.
    Device {
        spec: Arc<LoadedSpec>,
        index: usize,
        priority: usize,
    },
    /// Defined more than once in directory number `priority`.
    Conflict {
        files: Vec<PathBuf>,
        priority: usize,
    },
}

/// A spec file as listed: what a change is detected by.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileKey {
    path: PathBuf,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
}

#[derive(Default)]
struct State {
    /// The listing the devices were loaded from (`None`: never loaded).
    listing: Option<Vec<FileKey>>,
    devices: Arc<HashMap<String, Entry>>,
}

/// The CDI spec registry.
pub struct Registry {
    enabled: bool,
    dirs: Vec<PathBuf>,
    state: Mutex<State>,
    log: Logger,
}

impl Registry {
    /// A registry over `dirs` (later ones override earlier ones). Nothing is read until a
    /// container asks for a device.
    pub fn new(enabled: bool, dirs: Vec<PathBuf>, log: Logger) -> Self {
        Self {
            enabled,
            dirs,
            state: Mutex::new(State::default()),
            log,
        }
    }

    /// The edits for `devices` (duplicates already dropped by the caller), re-reading the spec
    /// files first if they changed. Blocking: file I/O.
    pub fn resolve(&self, devices: &[DeviceRequest]) -> Result<Vec<ContainerEdits>, CdiError> {
        if devices.is_empty() {
            return Ok(Vec::new());
        }
        if !self.enabled {
            return Err(CdiError::Disabled {
                devices: devices
                    .iter()
                    .map(|d| d.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        let table = self.refresh();
        let mut edits = Vec::new();
        let mut seen_specs: HashSet<*const LoadedSpec> = HashSet::new();
        for d in devices {
            match table.get(&d.name) {
                None => {
                    return Err(CdiError::Unresolvable {
                        field: d.field.clone(),
                        name: d.name.clone(),
                        dirs: self
                            .dirs
                            .iter()
                            .map(|p| p.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", "),
                    })
                }
                Some(Entry::Conflict { files, .. }) => {
                    return Err(CdiError::Ambiguous {
                        field: d.field.clone(),
                        name: d.name.clone(),
                        files: files
                            .iter()
                            .map(|p| p.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", "),
                    })
                }
                Some(Entry::Device { spec, index, .. }) => {
                    if seen_specs.insert(Arc::as_ptr(spec)) {
                        edits.push(spec.spec.container_edits.clone());
                    }
                    // `index` comes from enumerating this spec's devices.
                    if let Some(dev) = spec.spec.devices.get(*index) {
                        edits.push(dev.container_edits.clone());
                    }
                }
            }
        }
        Ok(edits)
    }

    /// The device table, reloaded if the directories' listing changed since the last load.
    fn refresh(&self) -> Arc<HashMap<String, Entry>> {
        // A poisoned lock only means a panic mid-reload: the state is still a whole table.
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let listing = self.list();
        if state.listing.as_ref() != Some(&listing) {
            state.devices = Arc::new(self.load(&listing));
            state.listing = Some(listing);
        }
        state.devices.clone()
    }

    /// The spec files of every directory, in priority order (bounded per directory).
    fn list(&self) -> Vec<FileKey> {
        let mut out = Vec::new();
        for dir in &self.dirs {
            let entries = match std::fs::read_dir(dir) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => {
                    // Listed as a pseudo-entry so that the warning comes once per change.
                    out.push(FileKey {
                        path: dir.clone(),
                        ino: 0,
                        size: 0,
                        mtime: (i64::from(e.raw_os_error().unwrap_or(-1)), -1),
                    });
                    continue;
                }
            };
            let mut files: Vec<FileKey> = entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| {
                    matches!(
                        p.extension().and_then(|e| e.to_str()),
                        Some("json" | "yaml")
                    )
                })
                .filter_map(|path| {
                    // Symlinks followed, as CDI's ReadFile does; directories skipped.
                    let md = std::fs::metadata(&path).ok()?;
                    (!md.is_dir()).then(|| FileKey {
                        path,
                        ino: md.ino(),
                        size: md.size(),
                        mtime: (md.mtime(), md.mtime_nsec()),
                    })
                })
                .collect();
            files.sort_by(|a, b| a.path.cmp(&b.path));
            out.extend(files);
        }
        out
    }

    /// Loads every listed file and builds the device table.
    fn load(&self, listing: &[FileKey]) -> HashMap<String, Entry> {
        let mut table: HashMap<String, Entry> = HashMap::new();
        let mut per_dir: HashMap<usize, usize> = HashMap::new();
        for key in listing {
            let Some(priority) = self.priority(&key.path) else {
                warn!(self.log, "cannot list CDI spec directory"; "dir" => %key.path.display(),
                    "errno" => key.mtime.0);
                continue;
            };
            let count = per_dir.entry(priority).or_default();
            *count += 1;
            if *count > MAX_SPECS_PER_DIR {
                warn!(self.log, "too many CDI spec files in one directory; file skipped";
                    "file" => %key.path.display(), "max" => MAX_SPECS_PER_DIR);
                continue;
            }
            let spec = match read_spec(&key.path) {
                Ok(s) => Arc::new(LoadedSpec {
                    path: key.path.clone(),
                    spec: s,
                }),
                Err(reason) => {
                    warn!(self.log, "invalid CDI spec file skipped";
                        "file" => %key.path.display(), "error" => reason);
                    continue;
                }
            };
            let kind = spec.spec.kind.clone();
            for (index, dev) in spec.spec.devices.iter().enumerate() {
                let name = format!("{kind}={}", dev.name);
                let new = Entry::Device {
                    spec: spec.clone(),
                    index,
                    priority,
                };
                let replace = match table.get_mut(&name) {
                    None => true,
                    Some(Entry::Device {
                        spec: old,
                        priority: p,
                        ..
                    }) if *p == priority => {
                        warn!(self.log, "CDI device defined by two spec files of one directory; it cannot be used";
                            "device" => &name, "file" => %spec.path.display(), "other" => %old.path.display());
                        let files = vec![old.path.clone(), spec.path.clone()];
                        table.insert(name.clone(), Entry::Conflict { files, priority });
                        false
                    }
                    Some(Entry::Conflict { files, priority: p }) if *p == priority => {
                        files.push(spec.path.clone());
                        false
                    }
                    // From an earlier (lower priority) directory: overridden.
                    Some(_) => true,
                };
                if replace {
                    table.insert(name, new);
                }
            }
        }
        table
    }

    /// The index in `dirs` of the directory holding `path` (`None` for a directory's own
    /// pseudo-entry: an unreadable directory).
    fn priority(&self, path: &Path) -> Option<usize> {
        let parent = path.parent()?;
        if self.dirs.iter().any(|d| d == path) {
            return None;
        }
        self.dirs.iter().rposition(|d| d == parent)
    }
}

/// Reads and checks one spec file (bounded, regular files only).
fn read_spec(path: &Path) -> Result<spec::Spec, String> {
    let text =
        remora_host::fs::read_regular_file(path, MAX_SPEC_BYTES).map_err(|e| e.to_string())?;
    let json = path.extension().is_some_and(|e| e == "json");
    parse::parse(&text, json)
}

#[cfg(test)]
mod tests;
