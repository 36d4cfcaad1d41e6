//! Generates the KEDA external scaler's gRPC code from
//! `proto/externalscaler.proto` with protox (a pure-Rust protobuf
//! compiler: no `protoc` needed) and tonic-prost-build.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/externalscaler.proto");
    let fds = protox::compile(["proto/externalscaler.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
