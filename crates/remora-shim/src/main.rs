//! `containerd-shim-remora-v2`: remora's containerd runtime-v2 shim (runtime type
//! `io.containerd.remora.v2`). All of it lives in the [`remora_shim`] library.

fn main() {
    std::process::exit(remora_shim::main());
}
