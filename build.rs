//! Build script: compiles the CRI v1 API (`k8s.io/cri-api`'s `api.proto`, pinned in
//! `protos/sources.txt`) into `$OUT_DIR/runtime.v1.rs`, which `src/cri/v1.rs` includes: the
//! messages, the `RuntimeService` / `ImageService` server traits remora implements and the
//! clients its integration tests use.
//!
//! The .proto is not in the repository: `scripts/setup.sh` copies it from the Go module proxy
//! to `$REMORA_TOOLS_DIR/protos/<module>@<version>/<path>` (default tools directory
//! `/var/tmp/remora-tools`); `REMORA_CRI_PROTO` names another copy. It is compiled with
//! `protox`, a protobuf compiler in Rust, because Debian 12's `protoc` (3.21) rejects the
//! `debug_redact` option cri-api uses since v0.34.
//!
//! It also compiles kubelet's device plugin API (`k8s.io/kubelet`'s
//! `pkg/apis/deviceplugin/v1beta1/api.proto`, pinned there too) into `$OUT_DIR/v1beta1.rs`:
//! only the kubelet suite includes it (the device plugin it runs), so the daemon does not
//! grow. `REMORA_DEVICEPLUGIN_PROTO` names another copy.
//!
//! Only the daemon speaks CRI: the shim (crates/remora-shim) needs neither the files nor the
//! compilers.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=protos");
    cri::generate();
    cri::generate_deviceplugin();
}

mod cri {
    use std::collections::BTreeSet;
    use std::path::Path;

    use prost_types::{field_descriptor_proto::Type, DescriptorProto, FileDescriptorSet};

    const MODULE: &str = "k8s.io/cri-api";
    const DEVICEPLUGIN_MODULE: &str = "k8s.io/kubelet";
    const PACKAGE: &str = ".runtime.v1";
    /// The one CRI message remora stores as JSON (a pod's config, on its sandbox record, for
    /// the CreateContainer calls after a restart): it and the messages it contains derive
    /// serde, and nothing else does.
    const SERDE_ROOTS: &[&str] = &["PodSandboxConfig"];
    /// The message whose Debug `src/cri/v1.rs` writes (see `check_redacted`).
    const REDACTED: &str = "AuthConfig";

    pub fn generate() {
        let proto = proto_path(Path::new("protos/sources.txt"), MODULE, "REMORA_CRI_PROTO")
            .unwrap_or_else(|e| fail(&e));
        let fds = compile(&proto, "CRI API", MODULE, "REMORA_CRI_PROTO");
        check_redacted(&proto);
        let mut config = tonic_prost_build::configure()
            .build_server(true)
            .build_client(true)
            // Its Debug is src/cri/v1.rs's, which hides the `debug_redact` fields.
            .skip_debug([format!("{PACKAGE}.{REDACTED}")]);
        let (messages, oneofs) = serde_closure(&fds);
        for m in &messages {
            config = config.message_attribute(
                m,
                "#[derive(serde::Serialize, serde::Deserialize)] #[serde(default)]",
            );
        }
        for o in &oneofs {
            config = config.enum_attribute(o, "#[derive(serde::Serialize, serde::Deserialize)]");
        }
        if let Err(e) = config.compile_fds(fds) {
            fail(&format!("generating Rust from {}: {e}", proto.display()));
        }
    }

    /// kubelet's device plugin API (package `v1beta1`): the `Registration` client and the
    /// `DevicePlugin` server of the kubelet suite's device plugin. Nothing in it derives serde.
    pub fn generate_deviceplugin() {
        let env = "REMORA_DEVICEPLUGIN_PROTO";
        let proto = proto_path(Path::new("protos/sources.txt"), DEVICEPLUGIN_MODULE, env)
            .unwrap_or_else(|e| fail(&e));
        let fds = compile(&proto, "device plugin API", DEVICEPLUGIN_MODULE, env);
        if let Err(e) = tonic_prost_build::configure()
            .build_server(true)
            .build_client(true)
            .compile_fds(fds)
        {
            fail(&format!("generating Rust from {}: {e}", proto.display()));
        }
    }

    /// Compiles `proto` (of Go module `module`, which `env` may name another copy of).
    fn compile(proto: &Path, what: &str, module: &str, env: &str) -> FileDescriptorSet {
        // Also while it is missing: Cargo then runs this again until it exists.
        println!("cargo:rerun-if-changed={}", proto.display());
        if !proto.is_file() {
            fail(&format!(
                "the {what} definition {} is missing.\n\
                 Run scripts/setup.sh protos (it fetches {module} as pinned in \
                 protos/sources.txt), or point {env} at a copy of it.",
                proto.display()
            ));
        }
        // `proto_path` names a file, so it has a parent and a file name.
        let dir = proto.parent().unwrap_or(Path::new("."));
        let name = proto.file_name().unwrap_or_default();
        match protox::compile([name], [dir]) {
            Ok(fds) => fds,
            Err(e) => fail(&format!("compiling {}: {e}", proto.display())),
        }
    }

    /// `AuthConfig`'s secrets are marked `[debug_redact = true]`, which prost's derived Debug
    /// ignores: its Debug is written by hand. Any other message with such fields fails the
    /// build, rather than printing a secret some day. (prost-types' descriptor has no
    /// `debug_redact`, so the .proto text is read: a marked field's message is the last
    /// `message` opened before it.)
    fn check_redacted(proto: &Path) {
        let text = std::fs::read_to_string(proto)
            .unwrap_or_else(|e| fail(&format!("reading {}: {e}", proto.display())));
        let mut message = "";
        for line in text.lines() {
            let line = line.trim_start();
            if let Some(rest) = line.strip_prefix("message ") {
                message = rest.split_whitespace().next().unwrap_or_default();
            }
            if line.contains("debug_redact") && !line.starts_with("//") && message != REDACTED {
                fail(&format!(
                    "{}: a debug_redact field in message {message}: only {REDACTED}'s Debug \
                     hides its secrets (src/cri/v1.rs); add one for {message}",
                    proto.display()
                ));
            }
        }
    }

    // proto_path: the one reader of protos/sources.txt, shared with crates/remora-nri/build.rs.
    include!("protos/sources.rs");

    /// The fully qualified names of [`SERDE_ROOTS`] and of every message they contain,
    /// directly or through other messages, maps or nested types (but the nested ones, see
    /// below); and of those messages' oneofs.
    fn serde_closure(fds: &FileDescriptorSet) -> (BTreeSet<String>, BTreeSet<String>) {
        let mut all = std::collections::BTreeMap::new();
        for f in &fds.file {
            let prefix = format!(".{}", f.package());
            for m in &f.message_type {
                index(&prefix, m, &mut all);
            }
        }
        let mut messages = BTreeSet::new();
        let mut oneofs = BTreeSet::new();
        let mut todo: Vec<String> = SERDE_ROOTS
            .iter()
            .map(|r| format!("{PACKAGE}.{r}"))
            .collect();
        while let Some(name) = todo.pop() {
            let Some(m) = all.get(&name) else {
                fail(&format!("message {name} is not in the CRI API"));
            };
            let is_map_entry = m.options.as_ref().is_some_and(|o| o.map_entry());
            // A map entry is no Rust type of its own: its key and value are.
            if !is_map_entry && !messages.insert(name.clone()) {
                continue;
            }
            for (i, o) in m.oneof_decl.iter().enumerate() {
                // A proto3 `optional` field's oneof is an `Option`, not an enum.
                let synthetic = m
                    .field
                    .iter()
                    .any(|f| f.oneof_index == i32::try_from(i).ok() && f.proto3_optional());
                if !synthetic {
                    oneofs.insert(format!("{name}.{}", o.name()));
                }
            }
            for n in &m.nested_type {
                todo.push(format!("{name}.{}", n.name()));
            }
            for f in &m.field {
                if f.r#type() == Type::Message && !messages.contains(f.type_name()) {
                    todo.push(f.type_name().to_string());
                }
            }
        }
        // prost-build applies an attribute to the nested types of the type it names as well:
        // a nested message gets it through its parent, and must not get it twice.
        let outermost = messages
            .iter()
            .filter(|m| {
                !messages.iter().any(|p| {
                    m.strip_prefix(p.as_str())
                        .is_some_and(|r| r.starts_with('.'))
                })
            })
            .cloned()
            .collect();
        (outermost, oneofs)
    }

    fn index<'a>(
        prefix: &str,
        m: &'a DescriptorProto,
        all: &mut std::collections::BTreeMap<String, &'a DescriptorProto>,
    ) {
        let name = format!("{prefix}.{}", m.name());
        for n in &m.nested_type {
            index(&name, n, all);
        }
        all.insert(name, m);
    }

    fn fail(message: &str) -> ! {
        eprintln!("error: {message}");
        std::process::exit(1);
    }
}
