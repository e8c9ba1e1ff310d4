// Generates the pprof protobuf types from the vendored proto/profile.proto
// (protox: no system protoc needed).
use std::env;
use std::path::PathBuf;

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let proto = "proto/profile.proto";
    let fds = protox::compile([proto], ["proto"])
        .unwrap_or_else(|e| panic!("compiling {proto} failed: {e}"));
    prost_build::Config::new()
        .out_dir(&out)
        .compile_fds(fds)
        .unwrap_or_else(|e| panic!("generating Rust from {proto} failed: {e}"));
    println!("cargo:rerun-if-changed={proto}");
}
