//! `containerd-shim-remora-v2`: remora's containerd runtime-v2 shim (runtime type
//! `io.containerd.remora.v2`). All of it lives in [`remora::shim`].

fn main() {
    std::process::exit(remora::shim::main());
}
