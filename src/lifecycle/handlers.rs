//! CRI runtime handlers as lifecycle uses them: handler name → containerd runtime (shim),
//! its options and an optional shim path.
//!
//! Design: a pod's handler is resolved once, at RunPodSandbox, and the *resolved* name is
//! stored in the sandbox's metadata; every container of the pod resolves that name again
//! (CreateContainer for the record's runtime, StartContainer for the shim path), so a pod's
//! containers always run with the pod's shim, as in containerd. The CRI handler `""` means
//! the default handler; pods recorded before handlers existed carry `""` or `"runc"`, and
//! resolve the same way now.

use std::collections::BTreeMap;

use super::backend::ShimRuntime;

/// The optional features of one handler's OCI runtime (probed at start by
/// `crate::oci::features`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HandlerFeatures {
    /// Recursive read-only mounts (the `rro` mount option).
    pub recursive_read_only_mounts: bool,
    /// Pods in user namespaces of their own.
    pub user_namespaces: bool,
}

/// One handler: what its pods' container records and tasks are created with.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HandlerRuntime {
    /// The container records' runtime (type and options).
    pub runtime: ShimRuntime,
    /// Absolute path of the shim binary ("" = containerd resolves the runtime type).
    pub runtime_path: String,
    /// What its OCI runtime supports.
    pub features: HandlerFeatures,
    /// The pod and container annotations its pods' specs carry ([`crate::spec::passthrough`]).
    pub pass_through: crate::spec::PassThrough,
    /// Every pod of this handler gets a pause container, even one that needs none
    /// (`pause_container = "always"`; see `super::sandbox_run`).
    pub pause_always: bool,
}

/// The configured handlers and the default one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeHandlers {
    default: String,
    by_name: BTreeMap<String, HandlerRuntime>,
}

impl RuntimeHandlers {
    /// Handlers `by_name`, of which `default` serves the CRI handler `""`. The config's
    /// validation guarantees that `default` is among them; if it is not, `""` resolves to
    /// nothing and pods asking for the default are refused (naming the missing handler).
    pub fn new(default: &str, by_name: BTreeMap<String, HandlerRuntime>) -> Self {
        Self {
            default: default.to_string(),
            by_name,
        }
    }

    /// Only `runc` (the default) with `runtime_type` and no options: for tests.
    pub fn single_runc(runtime_type: &str) -> Self {
        let runc = HandlerRuntime {
            runtime: ShimRuntime {
                name: runtime_type.to_string(),
                options: None,
            },
            runtime_path: String::new(),
            features: HandlerFeatures::default(),
            pass_through: Default::default(),
            pause_always: false,
        };
        Self::new("runc", BTreeMap::from([("runc".to_string(), runc)]))
    }

    /// The name of the default handler.
    pub fn default_name(&self) -> &str {
        &self.default
    }

    /// The configured handler names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }

    /// The configured handlers with what they support, in name order.
    pub fn features(&self) -> impl Iterator<Item = (&str, HandlerFeatures)> {
        self.by_name.iter().map(|(k, v)| (k.as_str(), v.features))
    }

    /// Resolves a CRI handler name (`""` = the default) to the configured name and its
    /// runtime; `Err(name)` when no such handler is configured.
    pub fn resolve(&self, handler: &str) -> Result<(&str, &HandlerRuntime), String> {
        let name = if handler.is_empty() {
            self.default.as_str()
        } else {
            handler
        };
        match self.by_name.get_key_value(name) {
            Some((k, v)) => Ok((k.as_str(), v)),
            None => Err(name.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::backend::RuncOptions;

    fn handlers() -> RuntimeHandlers {
        let remora = HandlerRuntime {
            runtime: ShimRuntime {
                name: "io.containerd.remora.v2".into(),
                options: Some(RuncOptions {
                    binary_name: "crun".into(),
                    ..Default::default()
                }),
            },
            runtime_path: "/opt/shim".into(),
            features: HandlerFeatures::default(),
            pass_through: Default::default(),
            pause_always: false,
        };
        let mut h = RuntimeHandlers::single_runc("io.containerd.runc.v2");
        h.by_name.insert("remora".into(), remora);
        h.default = "remora".into();
        h
    }

    #[test]
    fn empty_handler_is_the_default_and_names_resolve_to_themselves() {
        let h = handlers();
        let (name, rt) = h.resolve("").unwrap();
        assert_eq!(name, "remora");
        assert_eq!(rt.runtime.name, "io.containerd.remora.v2");
        assert_eq!(rt.runtime_path, "/opt/shim");
        let (name, rt) = h.resolve("runc").unwrap();
        assert_eq!(name, "runc");
        assert_eq!(rt.runtime.name, "io.containerd.runc.v2");
        assert_eq!(rt.runtime.options, None);
        assert_eq!(h.names().collect::<Vec<_>>(), ["remora", "runc"]);
    }

    #[test]
    fn unknown_handler_is_named() {
        let h = handlers();
        assert_eq!(h.resolve("kata"), Err("kata".to_string()));
        let broken = RuntimeHandlers::new("gone", BTreeMap::new());
        assert_eq!(broken.resolve(""), Err("gone".to_string()));
    }
}
