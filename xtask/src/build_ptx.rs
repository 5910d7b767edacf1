//! The device build behind `cargo xtask ptx` (which writes the prebuilt PTX the host crate
//! embeds) and the test that checks the committed PTX is fresh.
//!
//! Steps: check the pinned nightly has `rust-src` and `llvm-tools`; build `ptx-linker` for the
//! host; build `ferrofuse-kernels` for `nvptx64-nvidia-cuda` with `-Zbuild-std=core`, rustc
//! calling `ptx-linker` (llvm-link, opt, llc; it rejects leftover panic paths); check the
//! `.entry` list against `ferrofuse_common::kernel_names()`. Both nested builds use their own
//! target directory, so they never wait on the outer build's lock.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The archs the host crate ships PTX for, newest first (`host/src/runtime.rs` embeds one
/// file per arch and picks one by the device's compute capability).
pub const SUPPORTED_ARCHS: [&str; 2] = ["sm_90", "sm_80"];

/// What the host crate embeds for each arch, zstd-compressed: the PTX text, and the SASS
/// (cubin) that ptxas builds from it, which devices of that arch load without compiling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shipped {
    Ptx,
    Cubin,
}

/// Where the host crate reads `what` of `arch` from.
pub fn committed_path(root: &Path, arch: &str, what: Shipped) -> PathBuf {
    let kind = match what {
        Shipped::Ptx => "ptx",
        Shipped::Cubin => "cubin",
    };
    root.join("host/ptx")
        .join(format!("ferrofuse.{arch}.{kind}.zst"))
}

/// The committed `what` of `arch`, decompressed.
pub fn read_committed(root: &Path, arch: &str, what: Shipped) -> Result<Vec<u8>, String> {
    let path = committed_path(root, arch, what);
    let file = std::fs::File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    zstd::decode_all(file).map_err(|e| format!("{}: {e}", path.display()))
}

/// Writes `bytes` as the committed `what` of `arch`, at zstd's level 19 (the same bytes
/// always give the same file).
pub fn write_committed(
    root: &Path,
    arch: &str,
    what: Shipped,
    bytes: &[u8],
) -> Result<PathBuf, String> {
    let path = committed_path(root, arch, what);
    let packed = zstd::encode_all(bytes, 19).map_err(|e| e.to_string())?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    std::fs::write(&path, packed).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// `sm_XY` -> `XY`, at least 80 (the kernels use `cvt.rn.bf16x2.f32`, an sm_80 instruction).
pub fn parse_arch(arch: &str) -> Result<u32, String> {
    let cc: u32 = arch
        .strip_prefix("sm_")
        .and_then(|n| n.trim_end_matches(['a', 'f']).parse().ok())
        .ok_or(format!("{arch} is not an arch like sm_90"))?;
    if cc < 80 {
        return Err(format!("{arch}: ferrofuse needs sm_80 or newer"));
    }
    Ok(cc)
}

/// Builds the PTX for `arch` under `target_dir`, checks its entries, returns its text.
pub fn build_checked_ptx(root: &Path, target_dir: &Path, arch: &str) -> Result<String, String> {
    let ptx = build_ptx(root, target_dir, arch)?;
    let text = std::fs::read_to_string(&ptx).map_err(|e| format!("{}: {e}", ptx.display()))?;
    check_entries(&text)?;
    Ok(add_launch_bounds(&strip_comments(&text)))
}

/// The PTX without llc's comments (`// begin inline asm`, basic-block and loop notes): a
/// sixth of the text, and ptxas builds the same cubin without them. PTX has no string
/// literals here (no debug info, so no `.file`), so `//` always starts a comment.
fn strip_comments(ptx: &str) -> String {
    let mut out = String::with_capacity(ptx.len());
    for line in ptx.lines() {
        let code = match line.find("//") {
            Some(at) => line[..at].trim_end(),
            None => line,
        };
        if code.is_empty() && !line.is_empty() {
            continue;
        }
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// Writes `.maxntid` / `.minnctapersm` after the parameter list of every entry that has
/// [`KernelId::launch_bounds`] (rustc has no attribute for them): ptxas then fits the
/// kernel's registers to those blocks; `.maxnreg` instead of `.minnctapersm` where
/// [`KernelId::max_registers`] asks for a tighter budget.
///
/// [`KernelId::launch_bounds`]: ferrofuse_common::KernelId::launch_bounds
/// [`KernelId::max_registers`]: ferrofuse_common::KernelId::max_registers
fn add_launch_bounds(ptx: &str) -> String {
    let mut out = String::with_capacity(ptx.len() + 4096);
    let mut pending: Option<((u32, u32), Option<u32>)> = None;
    for line in ptx.split_inclusive('\n') {
        out.push_str(line);
        if let Some(rest) = line.trim().strip_prefix(".visible .entry ") {
            let name = rest.split('(').next().unwrap_or(rest).trim();
            pending = ferrofuse_common::KernelId::ALL
                .iter()
                .find(|k| k.name() == name)
                .and_then(|k| Some((k.launch_bounds()?, k.max_registers())));
        }
        // The parameter list ends with a line starting with `)`.
        if pending.is_some() && line.starts_with(')') {
            let ((threads, blocks), max_registers) = pending.take().unwrap_or_default();
            out.push_str(&format!(".maxntid {threads}, 1, 1\n"));
            if let Some(registers) = max_registers {
                out.push_str(&format!(".maxnreg {registers}\n"));
            } else if blocks > 0 {
                // 0: no directive; 1 is written too (with `.maxntid` alone, ptxas held some
                // 512-thread kernels to 64 registers and spilled).
                out.push_str(&format!(".minnctapersm {blocks}\n"));
            }
        }
    }
    out
}

/// Runs the two nested cargo builds; returns the path of the linked PTX.
fn build_ptx(root: &Path, target_dir: &Path, arch: &str) -> Result<PathBuf, String> {
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
    // sm_90+ kernels start with griddepcontrol (programmatic dependent launch).
    let mut rustflags = format!("-C target-cpu={arch}");
    // sm_90+ also prefetch whole ranges into L2 and copy them into shared memory
    // (`cp.async.bulk`, PTX ISA 8.0).
    if parse_arch(arch)? >= 90 {
        rustflags.push_str(" --cfg ferrofuse_pdl --cfg ferrofuse_bulk_copy");
        rustflags.push_str(" -C target-feature=+ptx80");
    }
    // sm_89+ convert to FP8 in hardware; older archs run the same rule in software.
    if parse_arch(arch)? >= 89 {
        rustflags.push_str(" --cfg ferrofuse_fp8_cvt");
    }
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
            ("CARGO_TARGET_NVPTX64_NVIDIA_CUDA_RUSTFLAGS", rustflags),
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
        // `name(` when the entry has parameters, `name()` when it has none.
        .map(|l| l.split('(').next().unwrap_or(l).trim())
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

#[cfg(test)]
mod tests {
    use super::strip_comments;

    #[test]
    fn strip_comments_keeps_code_and_blank_lines() {
        let ptx = concat!(
            "// header\n.version 8.7\n\n\t// begin inline asm\n\tld.global.u32 %r1, [%rd1];\n",
            "$L__BB0_2:    // =>This Inner Loop Header: Depth=1\n\tret;\n",
        );
        assert_eq!(
            strip_comments(ptx),
            ".version 8.7\n\n\tld.global.u32 %r1, [%rd1];\n$L__BB0_2:\n\tret;\n"
        );
    }
}
