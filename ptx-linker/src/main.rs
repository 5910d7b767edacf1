//! Linker for `nvptx64-nvidia-cuda`, called by rustc (`-C linker=`) when the kernels crate is
//! built as a cdylib. rustc hands it LLVM bitcode (the target has `obj-is-bitcode`); this
//! program links it into one PTX module with the toolchain's own `llvm-tools` component:
//!
//! 1. `llvm-link` the crate's objects, then each `.rlib` member `--only-needed`;
//! 2. `opt` internalizes everything but the exported kernel entries and runs `default<O3>`;
//! 3. `llc` emits PTX for `--target-cpu` with the PTX ISA features rustc passes;
//! 4. the PTX is rejected if a panic path survived (see `kernels/src/lib.rs`).
//!
//! It uses std only, so it builds in a second on any host.

use std::env;
use std::path::{Path, PathBuf};
use std::process::{Command, exit};

/// Symbol the kernels' panic handler calls. It is never defined: if any panic path is left
/// after optimisation, the PTX declares it as `.extern .func` and the link fails here.
const PANIC_MARKER: &str = "__panic_path_left_in_kernel";

fn main() {
    if let Err(e) = run() {
        eprintln!("ptx-linker: {e}");
        exit(1);
    }
}

#[derive(Default)]
struct Args {
    exports: Vec<String>,
    inputs: Vec<PathBuf>,
    output: Option<PathBuf>,
    cpu: Option<String>,
    features: Vec<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args::default();
    let mut it = env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--export-symbol" => a.exports.push(value("--export-symbol")?),
            "-o" => a.output = Some(value("-o")?.into()),
            "--target-cpu" => a.cpu = Some(value("--target-cpu")?),
            "-L" | "--target" => {
                value(&arg)?;
            }
            "-O0" | "-O1" | "-O2" | "-O3" | "-Os" | "-Oz" | "--debug" => {}
            _ if arg.starts_with("--target-feature=") => a.features.extend(
                arg["--target-feature=".len()..]
                    .split(',')
                    .map(String::from),
            ),
            _ if arg.starts_with('-') => return Err(format!("unexpected argument {arg}")),
            _ => a.inputs.push(arg.into()),
        }
    }
    Ok(a)
}

/// `<sysroot>/lib/rustlib/<host>/bin`, where the llvm-tools component installs its programs.
/// rustc runs the linker with its own environment, so `rustc` here is the pinned toolchain.
fn llvm_bin() -> Result<PathBuf, String> {
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = |args: &[&str]| -> Result<String, String> {
        let o = Command::new(&rustc)
            .args(args)
            .output()
            .map_err(|e| format!("running {rustc}: {e}"))?;
        Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let sysroot = out(&["--print", "sysroot"])?;
    let host = out(&["--print", "host-tuple"])?;
    let bin = Path::new(&sysroot)
        .join("lib/rustlib")
        .join(host)
        .join("bin");
    if !bin.join("llvm-link").exists() {
        return Err(format!(
            "llvm-link not found in {}: install the llvm-tools component \
             (`rustup component add llvm-tools`, or `rustup toolchain install` in the repository, \
             which reads rust-toolchain.toml)",
            bin.display()
        ));
    }
    Ok(bin)
}

fn tool(bin: &Path, name: &str, args: &[&str]) -> Result<(), String> {
    let status = Command::new(bin.join(name))
        .args(args)
        .status()
        .map_err(|e| format!("running {name}: {e}"))?;
    if !status.success() {
        return Err(format!("{name} {} failed: {status}", args.join(" ")));
    }
    Ok(())
}

fn run() -> Result<(), String> {
    let args = parse_args()?;
    let output = args.output.ok_or("no -o given")?;
    let cpu = args.cpu.ok_or("no --target-cpu given")?;
    let bin = llvm_bin()?;
    let work = output.with_extension("link");
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let linked = work.join("linked.bc");
    let linked_s = linked.to_str().ok_or("non-UTF-8 path")?;

    let (rlibs, objs): (Vec<_>, Vec<_>) = args
        .inputs
        .iter()
        .partition(|p| p.extension().is_some_and(|e| e == "rlib"));
    if objs.is_empty() {
        return Err("no object files given".into());
    }
    let mut link_args: Vec<&str> = objs.iter().map(|p| p.to_str().unwrap_or("")).collect();
    link_args.extend(["-o", linked_s]);
    tool(&bin, "llvm-link", &link_args)?;

    // Library members (core, compiler_builtins) are bitcode too; pull in only what is used.
    for (i, rlib) in rlibs.iter().enumerate() {
        let dir = work.join(format!("rlib{i}"));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let status = Command::new(bin.join("llvm-ar"))
            .arg("x")
            .arg(std::path::absolute(rlib).map_err(|e| e.to_string())?)
            .current_dir(&dir)
            .status()
            .map_err(|e| format!("running llvm-ar: {e}"))?;
        if !status.success() {
            return Err(format!("llvm-ar x {} failed", rlib.display()));
        }
        for member in std::fs::read_dir(&dir).map_err(|e| e.to_string())? {
            let member = member.map_err(|e| e.to_string())?.path();
            if member.extension().is_some_and(|e| e == "o") {
                let m = member.to_str().ok_or("non-UTF-8 path")?;
                tool(
                    &bin,
                    "llvm-link",
                    &[linked_s, "--only-needed", m, "-o", linked_s],
                )?;
            }
        }
    }

    let optimized = work.join("opt.bc");
    let optimized_s = optimized.to_str().ok_or("non-UTF-8 path")?;
    let keep = format!("--internalize-public-api-list={}", args.exports.join(","));
    let mcpu = format!("-mcpu={cpu}");
    tool(
        &bin,
        "opt",
        &[
            &keep,
            "-passes=internalize,default<O3>",
            &mcpu,
            linked_s,
            "-o",
            optimized_s,
        ],
    )?;

    // Without explicit features llc picks the lowest PTX ISA the arch allows (7.8 for sm_90).
    let mattr = format!("-mattr={}", args.features.join(","));
    let out_s = output.to_str().ok_or("non-UTF-8 path")?;
    let mut llc_args = vec![mcpu.as_str(), "-O3", optimized_s, "-o", out_s];
    if !args.features.is_empty() {
        llc_args.push(&mattr);
    }
    tool(&bin, "llc", &llc_args)?;

    let ptx = std::fs::read_to_string(&output).map_err(|e| e.to_string())?;
    if ptx.contains(PANIC_MARKER) {
        return Err(format!(
            "a panic path survived optimisation ({PANIC_MARKER} is referenced in {}). \
             Kernels must be panic-free: index with get_unchecked behind a proven bound, \
             avoid checked arithmetic that can fail, and look for the caller of \
             {PANIC_MARKER} in the PTX",
            output.display()
        ));
    }
    for name in &args.exports {
        if !ptx.contains(&format!(".entry {name}(")) {
            return Err(format!("exported kernel {name} has no .entry in the PTX"));
        }
    }
    Ok(())
}
