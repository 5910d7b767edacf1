//! Builds the device kernels into one PTX module and embeds it (the role cuda_builder plays for
//! rust-cuda), using only rustc's own nvptx64 target and the project's link step:
//!
//! 1. check the pinned nightly has `rust-src` and `llvm-tools` (clear error otherwise);
//! 2. build `ptx-linker` for the host;
//! 3. build `ferrofuse-kernels` for `nvptx64-nvidia-cuda` with `-Zbuild-std=core`, rustc
//!    calling `ptx-linker`, which runs llvm-link, opt and llc and rejects leftover panic paths;
//! 4. check the `.entry` list against `ferrofuse_common::kernel_names()` and copy the PTX to
//!    `$OUT_DIR/ferrofuse.ptx` for `include_str!`.
//!
//! `FERROFUSE_CUDA_ARCH` (default `sm_90`, at least `sm_80`) selects the target arch.
//! Both nested builds use their own target directory under `OUT_DIR`, so they never wait on
//! the outer build's lock.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const ARCH_VAR: &str = "FERROFUSE_CUDA_ARCH";

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
    ] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    println!("cargo:rerun-if-env-changed={ARCH_VAR}");

    let arch = env::var(ARCH_VAR).unwrap_or_else(|_| "sm_90".into());
    let cc = parse_arch(&arch)?;
    println!("cargo:rustc-env=FERROFUSE_PTX_ARCH={arch}");
    println!("cargo:rustc-env=FERROFUSE_PTX_CC={cc}");

    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    let ptx = build_ptx(&root, &out_dir.join("ptx-build"), &arch)?;
    let text = std::fs::read_to_string(&ptx).map_err(|e| format!("{}: {e}", ptx.display()))?;
    check_entries(&text)?;
    std::fs::write(out_dir.join("ferrofuse.ptx"), text).map_err(|e| e.to_string())?;
    Ok(())
}

/// `sm_XY` -> `XY`, at least 80 (the kernels use `cvt.rn.bf16x2.f32`, an sm_80 instruction).
fn parse_arch(arch: &str) -> Result<u32, String> {
    let cc: u32 = arch
        .strip_prefix("sm_")
        .and_then(|n| n.trim_end_matches(['a', 'f']).parse().ok())
        .ok_or(format!("{ARCH_VAR}={arch} is not an arch like sm_90"))?;
    if cc < 80 {
        return Err(format!("{ARCH_VAR}={arch}: ferrofuse needs sm_80 or newer"));
    }
    Ok(cc)
}

/// Runs the two nested cargo builds; returns the path of the linked PTX.
pub fn build_ptx(root: &Path, target_dir: &Path, arch: &str) -> Result<PathBuf, String> {
    check_toolchain()?;
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = root.join("Cargo.toml");
    let nested = |args: &[&str], envs: &[(&str, String)]| -> Result<(), String> {
        let mut cmd = Command::new(&cargo);
        cmd.args(args)
            .arg("--manifest-path")
            .arg(&manifest)
            .arg("--target-dir")
            .arg(target_dir);
        // The outer build's settings must not leak into the nested ones.
        for var in [
            "CARGO_ENCODED_RUSTFLAGS",
            "RUSTFLAGS",
            "CARGO_TARGET_DIR",
            "CARGO_BUILD_TARGET",
            "CARGO_BUILD_RUSTFLAGS",
            "RUSTC_WORKSPACE_WRAPPER",
            "RUSTC_WRAPPER",
        ] {
            cmd.env_remove(var);
        }
        cmd.envs(envs.iter().map(|(k, v)| (k, v)));
        let status = cmd.status().map_err(|e| format!("running {cargo}: {e}"))?;
        if !status.success() {
            return Err(format!("`cargo {}` failed ({status})", args.join(" ")));
        }
        Ok(())
    };
    nested(&["build", "--quiet", "-p", "ptx-linker", "--release"], &[])?;
    let linker = target_dir
        .join("release")
        .join(format!("ptx-linker{}", env::consts::EXE_SUFFIX));
    nested(
        &[
            "build",
            "--quiet",
            "-p",
            "ferrofuse-kernels",
            "--target",
            "nvptx64-nvidia-cuda",
            "-Zbuild-std=core",
            "--profile",
            "ptx",
        ],
        &[
            (
                "CARGO_TARGET_NVPTX64_NVIDIA_CUDA_LINKER",
                linker.display().to_string(),
            ),
            (
                "CARGO_TARGET_NVPTX64_NVIDIA_CUDA_RUSTFLAGS",
                format!("-C target-cpu={arch}"),
            ),
        ],
    )?;
    Ok(target_dir.join("nvptx64-nvidia-cuda/ptx/ferrofuse_kernels.ptx"))
}

/// The nightly must carry `rust-src` (for -Zbuild-std) and `llvm-tools` (for the link step).
fn check_toolchain() -> Result<(), String> {
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let print = |what: &str| -> Result<String, String> {
        let o = Command::new(&rustc)
            .args(["--print", what])
            .output()
            .map_err(|e| format!("running {rustc}: {e}"))?;
        Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let sysroot = PathBuf::from(print("sysroot")?);
    let host = print("host-tuple")?;
    let install = "run `rustup toolchain install` in the repository root (it reads \
                   rust-toolchain.toml and installs the pinned nightly with its components)";
    if !sysroot.join("lib/rustlib/src/rust/library/core").exists() {
        return Err(format!(
            "the rust-src component is missing from {}: {install}, or `rustup component add rust-src`",
            sysroot.display()
        ));
    }
    if !sysroot
        .join("lib/rustlib")
        .join(host)
        .join("bin/llvm-link")
        .exists()
    {
        return Err(format!(
            "the llvm-tools component is missing from {}: {install}, or `rustup component add llvm-tools`",
            sysroot.display()
        ));
    }
    Ok(())
}

/// Every name in the shared table is a `.entry` of the PTX, and nothing else is.
fn check_entries(ptx: &str) -> Result<(), String> {
    let entries: Vec<&str> = ptx
        .lines()
        .filter_map(|l| l.trim().strip_prefix(".visible .entry "))
        .map(|l| l.trim_end_matches('('))
        .collect();
    let expected: Vec<&str> = ferrofuse_common::kernel_names().collect();
    for name in &expected {
        if !entries.contains(name) {
            return Err(format!(
                "kernel {name} is in the shared table but not in the PTX"
            ));
        }
    }
    for name in &entries {
        if !expected.contains(name) {
            return Err(format!(
                "PTX entry {name} is missing from ferrofuse_common's table"
            ));
        }
    }
    Ok(())
}
