//! Compiles Ichor's subset of Talos's gRPC API (`proto/`) with protox, so no `protoc` is
//! needed, into tonic clients and servers. Only with the `io` feature.

fn main() {
    #[cfg(feature = "io")]
    compile();
}

#[cfg(feature = "io")]
fn compile() {
    let files = [
        "proto/machine/machine.proto",
        "proto/machine/image.proto",
        "proto/machine/lifecycle.proto",
        "proto/cosi/state.proto",
        "proto/resource/config.proto",
        "proto/resource/k8s.proto",
        "proto/resource/v1alpha1.proto",
    ];
    println!("cargo:rerun-if-changed=proto");
    let fds = match protox::compile(files, ["proto"]) {
        Ok(fds) => fds,
        Err(e) => panic!("proto/: {e}"),
    };
    if let Err(e) = tonic_prost_build::configure().compile_fds(fds) {
        panic!("generating the Talos API: {e}");
    }
}
