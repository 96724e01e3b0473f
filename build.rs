//! Build script. remora's own protos/ directory holds no .proto files yet (the CRI and
//! containerd APIs come compiled from the `k8s-cri` and `containerd-client` crates), so
//! there is nothing to generate; this only makes Cargo rebuild when protos/ changes, so a
//! future remora API is picked up without a clean build.
fn main() {
    println!("cargo:rerun-if-changed=protos");
}
