//! `-info`: the runtime's description for containerd, with the OCI runtime's features.

use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::protobuf::{Message, MessageField};

use super::BootstrapError;
use crate::options::RuntimeOptions;
use crate::runc::SHORT_CALL_TIMEOUT;

/// `-info`: the runtime's description, with the OCI runtime's features (containerd asks before
/// running specs that need them, e.g. idmapped mounts).
pub(super) fn info() -> Result<(), BootstrapError> {
    use containerd_shim_protos::types::introspection::{RuntimeInfo, RuntimeVersion};
    use std::io::Read;
    let mut stdin = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut stdin);
    let opts = Any::parse_from_bytes(&stdin)
        .ok()
        .and_then(|a| RuntimeOptions::from_any(Some(&a)).ok())
        .unwrap_or_default();
    let mut info = RuntimeInfo::new();
    info.name = super::RUNTIME_NAME.to_string();
    let mut v = RuntimeVersion::new();
    v.version = env!("CARGO_PKG_VERSION").to_string();
    info.version = MessageField::some(v);
    if let Ok(out) = crate::runc::run_blocking(
        &opts.binary(),
        &["features".into()],
        "features",
        "",
        SHORT_CALL_TIMEOUT,
    ) {
        if out.status.success() {
            let mut any = Any::new();
            any.type_url =
                "types.containerd.io/opencontainers/runtime-spec/1/features/Features".into();
            any.value = out.stdout;
            info.features = MessageField::some(any);
        }
    }
    super::write_message("RuntimeInfo", &info)
}
