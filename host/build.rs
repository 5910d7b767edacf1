//! Builds the device kernels into one PTX module and embeds it (the role cuda_builder plays
//! for rust-cuda); the steps are in `build_ptx.rs`. `FERROFUSE_CUDA_ARCH` selects the arch.

#[path = "build_ptx.rs"]
mod build_ptx;

use std::env;
use std::path::PathBuf;

fn main() {
    if let Err(e) = run() {
        eprintln!("\nerror: ferrofuse could not build its GPU kernels:\n  {e}\n");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir.parent().unwrap().to_path_buf();
    for dir in [
        "kernels/src",
        "kernels/Cargo.toml",
        "common/src",
        "ptx-linker/src",
        "host/build_ptx.rs",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    println!("cargo:rerun-if-env-changed={}", build_ptx::ARCH_VAR);

    let arch = env::var(build_ptx::ARCH_VAR).unwrap_or_else(|_| build_ptx::DEFAULT_ARCH.into());
    let cc = build_ptx::parse_arch(&arch)?;
    println!("cargo:rustc-env=FERROFUSE_PTX_ARCH={arch}");
    println!("cargo:rustc-env=FERROFUSE_PTX_CC={cc}");

    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    let ptx = build_ptx::build_checked_ptx(&root, &out_dir.join("ptx-build"), &arch)?;
    std::fs::write(out_dir.join("ferrofuse.ptx"), ptx).map_err(|e| e.to_string())
}
