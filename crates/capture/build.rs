// Compiles the BPF programs under src/bpf with clang and generates their
// libbpf-rs skeletons into OUT_DIR.
use std::env;
use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let target_arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let (bpf_arch, multiarch) = match target_arch.as_str() {
        "aarch64" => ("arm64", "aarch64-linux-gnu"),
        _ => ("x86", "x86_64-linux-gnu"),
    };
    for name in ["syscount", "offcpu", "fsynclat", "ran"] {
        build(&out, name, bpf_arch, multiarch);
    }
    println!("cargo:rerun-if-changed=src/bpf/tracked.h");
    println!("cargo:rerun-if-changed=src/bpf/follow.h");
}

fn build(out: &std::path::Path, name: &str, bpf_arch: &str, multiarch: &str) {
    let src = format!("src/bpf/{name}.bpf.c");
    if let Err(e) = SkeletonBuilder::new()
        .source(&src)
        .clang_args([
            format!("-D__TARGET_ARCH_{bpf_arch}"),
            // <linux/types.h> includes <asm/types.h>, which Debian keeps here.
            format!("-I/usr/include/{multiarch}"),
            // BPF ISA v3 (Linux >= 5.12): atomic OR for the tracked bitmap.
            "-mcpu=v3".into(),
        ])
        .build_and_generate(out.join(format!("{name}.skel.rs")))
    {
        panic!(
            "building {src} failed: {e:#}\nfix: install clang and libelf-dev (apt-get install clang libelf-dev zlib1g-dev)"
        );
    }
    println!("cargo:rerun-if-changed={src}");
}
