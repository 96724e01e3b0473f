//! Build script: compiles NRI's protocol (`github.com/containerd/nri`'s `pkg/api/api.proto`,
//! pinned in the workspace's `protos/sources.txt`) into rust-protobuf messages and async ttrpc
//! services in `$OUT_DIR`, which `src/api.rs` includes: the `Plugin` client remora calls
//! plugins with and the `Runtime` server trait it answers them with (RegisterPlugin,
//! UpdateContainers), plus the rest of the file's services, which ttrpc-codegen cannot leave out.
//!
//! The .proto is not in the repository: `scripts/setup.sh protos` copies it from the Go module
//! proxy to `$REMORA_TOOLS_DIR/protos/<module>@<version>/<path>` (default tools directory
//! `/var/tmp/remora-tools`), as for the root package's CRI API; `REMORA_NRI_PROTO` names another
//! copy. ttrpc-codegen parses it with rust-protobuf's parser, in Rust: no `protoc` is needed.
//!
//! rust-protobuf, not prost as the daemon's CRI code: the ttrpc crate's generated services are
//! rust-protobuf's, as the shim's (containerd-shim-protos) are.

use std::path::{Path, PathBuf};

const MODULE: &str = "github.com/containerd/nri";
const ENV: &str = "REMORA_NRI_PROTO";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let proto = proto_path_of_nri();
    // Also while it is missing: Cargo then runs this again until it exists.
    println!("cargo:rerun-if-changed={}", proto.display());
    if !proto.is_file() {
        fail(&format!(
            "the NRI API definition {} is missing.\n\
             Run scripts/setup.sh protos (it fetches {MODULE} as pinned in protos/sources.txt), \
             or point {ENV} at a copy of it.",
            proto.display()
        ));
    }
    let out_dir = std::env::var_os("OUT_DIR").unwrap_or_else(|| fail("OUT_DIR is not set"));
    // `proto_path` names a file, so it has a parent.
    let dir = proto.parent().unwrap_or(Path::new("."));
    let result = ttrpc_codegen::Codegen::new()
        .out_dir(&out_dir)
        .input(&proto)
        .include(dir)
        .rust_protobuf()
        .customize(ttrpc_codegen::Customize {
            async_all: true,
            ..Default::default()
        })
        .run();
    if let Err(e) = result {
        fail(&format!("generating Rust from {}: {e}", proto.display()));
    }
    // What src/api.rs includes: the two generated files as sibling modules (the services refer
    // to the messages as `super::api`). Not ttrpc-codegen's own mod.rs (`gen_mod`): it opens
    // with an inner attribute, which `include!` rejects.
    let modules = Path::new(&out_dir).join("nri.rs");
    if let Err(e) = std::fs::write(&modules, "pub mod api;\npub mod api_ttrpc;\n") {
        fail(&format!("writing {}: {e}", modules.display()));
    }
}

/// `REMORA_NRI_PROTO` (a path), else where scripts/setup.sh puts the version of NRI that
/// protos/sources.txt pins.
fn proto_path_of_nri() -> PathBuf {
    // The workspace root's list: this crate is crates/remora-nri.
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .unwrap_or_else(|| fail("CARGO_MANIFEST_DIR is not set"));
    let list = Path::new(&manifest_dir).join("../../protos/sources.txt");
    println!("cargo:rerun-if-changed={}", list.display());
    proto_path(&list, MODULE, ENV).unwrap_or_else(|e| fail(&e))
}

// proto_path: the one reader of protos/sources.txt, shared with the root build.rs.
include!("../../protos/sources.rs");

fn fail(message: &str) -> ! {
    eprintln!("error: {message}");
    std::process::exit(1);
}
