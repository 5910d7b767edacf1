//! `cargo xtask ptx [--check] [--json] [--arch sm_90]`: build the kernels' PTX for every arch
//! the host crate ships, assemble it with `ptxas -v`, write both (the PTX and the cubin,
//! zstd-compressed) to `host/ptx/` (with `--check`: fail if the committed files differ
//! instead), and report each kernel's resources.
//! Fails if any kernel spills or has a stack frame (beyond `ALLOWED_SPILLS`), or needs more
//! registers than its largest launch can have (registers x block threads <= 65536), and if a
//! norm kernel's first loads are not issued back to back (see `check_load_batching`).

use std::path::{Path, PathBuf};
use std::process::Command;

use ferrofuse_common::{
    KernelId, NormBwdVariant, NormFwdVariant, SM_REGISTERS, VecMode, block_registers,
};
use serde::Serialize;

use crate::build_ptx::{self, SUPPORTED_ARCHS, Shipped};
use crate::tools;

#[derive(clap::Args, Default)]
pub struct Args {
    /// Fail if the committed PTX differs from what the sources build, instead of writing it.
    #[arg(long)]
    pub check: bool,
    /// Print a JSON array instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Archs to build (default: every arch the host crate ships).
    #[arg(long = "arch")]
    pub archs: Vec<String>,
}

#[derive(Serialize, Debug, Clone)]
pub struct KernelResources {
    pub kernel: String,
    pub arch: String,
    pub registers: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
    pub stack_frame: u32,
    pub shared_mem: u32,
}

pub fn run(args: &Args) -> Result<(), String> {
    let archs: Vec<String> = if args.archs.is_empty() {
        SUPPORTED_ARCHS.iter().map(|s| s.to_string()).collect()
    } else {
        args.archs.clone()
    };
    let root = tools::repo_root();
    let mut all = Vec::new();
    let mut stale = Vec::new();
    for arch in &archs {
        if !SUPPORTED_ARCHS.contains(&arch.as_str()) {
            return Err(format!(
                "{arch} is not shipped by the host crate (one of {SUPPORTED_ARCHS:?})"
            ));
        }
        let (text, text_fresh) = build_and_compare(&root, arch)?;
        let (kernels, cubin) = assemble(&root, arch, &text)?;
        let cubin_fresh = build_ptx::read_committed(&root, arch, Shipped::Cubin)
            .is_ok_and(|committed| committed == cubin);
        for (what, fresh, bytes) in [
            (Shipped::Ptx, text_fresh, text.as_bytes()),
            (Shipped::Cubin, cubin_fresh, &cubin[..]),
        ] {
            if fresh {
                continue;
            }
            if args.check {
                stale.push(build_ptx::committed_path(&root, arch, what));
            } else {
                let written = build_ptx::write_committed(&root, arch, what, bytes)?;
                eprintln!("xtask: wrote {}", written.display());
            }
        }
        all.extend(kernels);
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&all).map_err(|e| e.to_string())?
        );
    } else {
        print_table(&all);
    }
    let bad: Vec<_> = all
        .iter()
        .filter(|k| {
            let allowed = ALLOWED_SPILLS
                .iter()
                .find(|(name, ..)| *name == k.kernel)
                .map_or(0, |&(_, bytes, _)| bytes);
            k.spill_stores.max(k.spill_loads).max(k.stack_frame) > allowed
        })
        .map(|k| format!("{} ({})", k.kernel, k.arch))
        .collect();
    if !bad.is_empty() {
        return Err(format!(
            "kernels spill or use a stack frame: {}",
            bad.join(", ")
        ));
    }
    let too_many: Vec<_> = all
        .iter()
        .filter_map(|k| {
            let threads = kernel_id(&k.kernel)?.max_block_threads();
            (block_registers(k.registers, threads) > SM_REGISTERS).then(|| {
                format!(
                    "{} ({}): {} registers x {threads} threads",
                    k.kernel, k.arch, k.registers
                )
            })
        })
        .collect();
    if !too_many.is_empty() {
        return Err(format!(
            "kernels need more than {SM_REGISTERS} registers for their largest block \
             (the launch would fail with CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES): {}",
            too_many.join(", ")
        ));
    }
    // The gated forward's vector path keeps one 16-byte access per operand in flight per
    // thread and relies on 2048 resident threads per SM for its loads in flight; 65536 / 2048
    // = 32 registers. (The scalar path keeps a batch of accesses per thread instead, and its
    // grid is sized from its measured occupancy.)
    // One body over the budget (its four activations share the entry) costs every activation
    // a third of its occupancy: an FMA Horner form of GELU-erf took the entry to 56.
    let fat: Vec<_> = all
        .iter()
        .filter(|k| {
            k.registers > GATED_FWD_MAX_REGISTERS
                && matches!(
                    kernel_id(&k.kernel),
                    Some(KernelId::GatedFwd(_, VecMode::V16) | KernelId::GatedFwdEnds(_))
                )
        })
        .map(|k| format!("{} ({}): {}", k.kernel, k.arch, k.registers))
        .collect();
    if !fat.is_empty() {
        return Err(format!(
            "gated forward kernels over {GATED_FWD_MAX_REGISTERS} registers (below full \
             occupancy): {}",
            fat.join(", ")
        ));
    }
    if !stale.is_empty() {
        return Err(stale_message(&stale));
    }
    Ok(())
}

/// Builds the PTX of `arch` from the kernel sources; returns it and whether the committed
/// file under `host/ptx/` holds the same text.
pub fn build_and_compare(root: &Path, arch: &str) -> Result<(String, bool), String> {
    build_ptx::parse_arch(arch)?;
    let target = root.join("target/xtask-ptx").join(arch);
    let text = build_ptx::build_checked_ptx(root, &target, arch)?;
    check_load_batching(&text).map_err(|e| format!("{arch}: {e}"))?;
    check_no_functions(&text).map_err(|e| format!("{arch}: {e}"))?;
    let committed = build_ptx::read_committed(root, arch, Shipped::Ptx).unwrap_or_default();
    let fresh = committed == text.as_bytes();
    Ok((text, fresh))
}

/// What CI prints when the committed PTX is not what the sources build.
pub fn stale_message(stale: &[PathBuf]) -> String {
    let root = tools::repo_root();
    let files: Vec<String> = stale
        .iter()
        .map(|p| p.strip_prefix(&root).unwrap_or(p).display().to_string())
        .collect();
    format!(
        "the committed PTX is not what the kernel sources build now: {}\n\
         run `cargo xtask ptx` and commit host/ptx/",
        files.join(", ")
    )
}

/// Every device function must be inlined into its entry: LLVM leaves a closure it finds too
/// large to inline (the same closure called from several places) as a `.func`, whose call
/// passes the captured variables through local memory and makes ptxas spill every register
/// live across it (a backward body went from 24 to 5,184 bytes of spills that way).
fn check_no_functions(ptx: &str) -> Result<(), String> {
    // A declaration and a definition each.
    let functions: std::collections::BTreeSet<&str> = ptx
        .lines()
        .filter_map(|l| {
            l.strip_prefix(".func ")
                .or(l.strip_prefix(".visible .func "))
        })
        .map(|l| l.split('(').next().unwrap_or(l).trim())
        .collect();
    if functions.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "device functions not inlined (mark the closure `#[inline(always)]` or make it \
             smaller): {}",
            functions.into_iter().collect::<Vec<_>>().join(", ")
        ))
    }
}

/// Registers per thread at which 2048 threads fit on one SM.
const GATED_FWD_MAX_REGISTERS: u32 = 32;

/// The kernel a ptxas record names.
fn kernel_id(name: &str) -> Option<KernelId> {
    KernelId::ALL.iter().copied().find(|id| id.name() == name)
}

/// The norm kernels' first load phase (x and residual in the forward, h, dy and dres in the
/// backward rows kernel, h and dy in its looped phase A) must reach the PTX as one run of
/// `ld.global.v4` (on the realigned path and in the staged backward, of `cp.async` copies to
/// shared memory) with no branch between them: a branch per chunk made each load wait for the
/// previous one and cost up to 1.9x (bench/TUNING.md). Counts the vector loads from the first
/// one to the first branch after it, per vector entry.
fn check_load_batching(ptx: &str) -> Result<(), String> {
    let mut short = Vec::new();
    for id in KernelId::ALL {
        let (dtype, operands, elems) = match id {
            KernelId::RmsNormFwd(d, VecMode::V16, v) | KernelId::RmsNormFwdRealigned(d, v) => {
                (d, 2, if v == NormFwdVariant::E32 { 32 } else { 16 })
            }
            KernelId::RmsNormFwdWFirst(d)
            | KernelId::RmsNormFwdLoopAhead(d, VecMode::V16)
            | KernelId::RmsNormFp8LoopAhead(d, VecMode::V16, _) => (d, 2, 16),
            KernelId::RmsNormBwd(d, VecMode::V16, v) => {
                (d, if v == NormBwdVariant::E16 { 3 } else { 2 }, 16)
            }
            KernelId::RmsNormBwdNarrow(d, VecMode::V16, _) => (d, 3, 16),
            _ => continue,
        };
        let want = operands * elems / dtype.lanes_per_16b();
        let load = match id {
            KernelId::RmsNormFwdRealigned(..)
            | KernelId::RmsNormBwd(_, VecMode::V16, NormBwdVariant::E16)
            | KernelId::RmsNormBwdNarrow(_, VecMode::V16, _) => "cp.async.cg.shared.global",
            _ => "ld.global.v4",
        };
        let got = leading_vector_loads(ptx, id.name(), load);
        if got < want {
            short.push(format!("{} ({got} of {want})", id.name()));
        }
    }
    if short.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "kernels whose first loads are not issued back to back (a branch between them): {}",
            short.join(", ")
        ))
    }
}

/// `load` instructions (`ld.global.v4`, `cp.async...`) in entry `name` from the first one up
/// to the first branch.
fn leading_vector_loads(ptx: &str, name: &str, load: &str) -> usize {
    let header = format!(".entry {name}(");
    let Some(start) = ptx.find(&header) else {
        return 0;
    };
    let mut loads = 0;
    for line in ptx[start..].lines().skip(1) {
        let line = line.trim();
        if line.starts_with(".entry") || line.starts_with(".visible .entry") {
            break;
        }
        if line.contains(load) {
            loads += 1;
        } else if loads > 0 && line.split_whitespace().any(|w| w.starts_with("bra")) {
            break;
        }
    }
    loads
}

/// Kernels allowed to spill, with the most bytes of spill stores, spill loads or stack frame
/// each may have, and why; any other spill, or more, fails the build.
const ALLOWED_SPILLS: &[(&str, u32, &str)] = &[
    ("rmsnorm_bwd_bf16_v16_e16", 56, STAGED_BWD_SPILLS),
    ("rmsnorm_bwd_f16_v16_e16", 56, STAGED_BWD_SPILLS),
    ("rmsnorm_bwd_bf16_v16_cluster", 8, CLUSTER_BWD_SPILLS),
    ("rmsnorm_bwd_f16_v16_cluster", 8, CLUSTER_BWD_SPILLS),
    (
        "rmsnorm_bwd_f16_v16_cluster_fused",
        24,
        CLUSTER_FUSED_BWD_SPILLS,
    ),
    ("rmsnorm_bwd_bf16_v16_e16_fused", 24, FUSED_BWD_SPILLS),
    ("rmsnorm_bwd_f16_v16_e16_fused", 24, FUSED_BWD_SPILLS),
    ("rmsnorm_bwd_f32_v16_e16_r96", 128, NARROW_BWD_SPILLS),
    ("rmsnorm_bwd_f32_v16_e16_r80", 256, NARROW_BWD_SPILLS),
    ("rmsnorm_bwd_f32_scalar_e16_r96", 32, NARROW_BWD_SPILLS),
    ("rmsnorm_bwd_f32_scalar_e16_r80", 128, NARROW_BWD_SPILLS),
    ("rmsnorm_bwd_f32_v16_e16_fused_r96", 72, NARROW_BWD_SPILLS),
    ("rmsnorm_bwd_f32_v16_e16_fused_r80", 176, NARROW_BWD_SPILLS),
    ("rmsnorm_fwd_f32_v16_split_e16_r40", 16, NARROW_SPLIT_SPILLS),
    (
        "rmsnorm_fwd_f32_scalar_e32",
        48,
        "sm_80: every element load of the thread in flight, 32 per thread (44 bytes)",
    ),
    (
        "rmsnorm_fwd_f16_realigned_split_e16_r40",
        40,
        NARROW_SPLIT_SPILLS,
    ),
    (
        "rmsnorm_fwd_bf16_realigned_split_e16_r40",
        52,
        NARROW_SPLIT_SPILLS,
    ),
    ("gated_fp8_rows_realigned_bf16", 16, REALIGNED_ROWS_SPILLS),
    ("gated_fp8_rows_realigned_f16", 16, REALIGNED_ROWS_SPILLS),
];
const REALIGNED_ROWS_SPILLS: &str = "the realigned many-rows FP8 entries hold two words per \
     thread (both words' two aligned vectors per input in flight) in 64 registers (two blocks \
     of up to 512 threads per SM); on sm_90 one value waits in local memory from the start to \
     the stores (one store and one load per thread, an L1 hit)";
const NARROW_SPLIT_SPILLS: &str = "the split forward's narrow entries are held to 40 registers \
     (three 512-thread blocks per SM, an experiment off by default); with the weight loaded \
     after the reduction, the f32 vector and 16-bit realigned ones keep a few values in local \
     memory";
const NARROW_BWD_SPILLS: &str = "the narrow f32 backward entries are held to 96 or 80 \
     registers (two blocks per SM of 288-384 threads where 128 fit one, three of 192 threads \
     at 96); 15-65 of their values live in local memory (L1 hits)";
const FUSED_BWD_SPILLS: &str = "the one-launch 16-bit backward is held to the staged kernel's \
     64 registers; with the `dw` blocks' walk over slots of several rows and their sum by \
     column for few rows beside the rows' body it keeps up to 24 bytes in local memory (the \
     build measured in bench/TUNING.md, \"The norm backward in one launch\")";
const STAGED_BWD_SPILLS: &str = "the staged 16-bit backward is held to 64 registers (two \
     512-thread blocks per SM); its form for blocks of several rows, whose \
     row addresses are per thread, keeps about ten loop-invariant values in local memory (L1 \
     hits, a few loads per row)";

const CLUSTER_FUSED_BWD_SPILLS: &str = "the one-launch cluster split is held to the cluster \
     kernel's 64 registers; in the f16 entry its `dw` blocks' walk over slots keeps a few \
     loop-invariant values in local memory (the bf16 entry none; spills there made its `dw` \
     blocks wait on local loads before their row loads, see bench/TUNING.md, \"The one-launch \
     `dw` blocks without spills\")";
const CLUSTER_BWD_SPILLS: &str = "the cluster-split 16-bit backward is held to 64 registers as \
     the staged one (two 512-thread blocks per SM); its tile offset and walker leave one value \
     in local memory (an L1 hit)";

/// ptxas's report of every kernel in the committed PTX of `arch` (what the host crate runs).
pub fn committed_resources(arch: &str) -> Result<Vec<KernelResources>, String> {
    let root = tools::repo_root();
    let text = build_ptx::read_committed(&root, arch, Shipped::Ptx)?;
    let text = String::from_utf8(text).map_err(|e| format!("the committed {arch} PTX: {e}"))?;
    Ok(assemble(&root, arch, &text)?.0)
}

/// Assembles the PTX `text` of `arch` with ptxas; returns its report of every kernel and the
/// cubin, which the host crate ships (ptxas's output depends on its options, `-v` included,
/// so the report and the shipped cubin come from one run).
fn assemble(
    root: &Path,
    arch: &str,
    text: &str,
) -> Result<(Vec<KernelResources>, Vec<u8>), String> {
    let target = root.join("target/xtask-ptx").join(arch);
    std::fs::create_dir_all(&target).map_err(|e| format!("{}: {e}", target.display()))?;
    let ptx_path = target.join("ferrofuse.ptx");
    std::fs::write(&ptx_path, text).map_err(|e| e.to_string())?;
    let cubin_path = target.join("ferrofuse.cubin");
    let ptxas = tools::ptxas()?;
    let out = Command::new(&ptxas)
        .arg(format!("-arch={arch}"))
        .args(["-v", "-O3", "-o"])
        .arg(&cubin_path)
        .arg(&ptx_path)
        .output()
        .map_err(|e| format!("running ptxas: {e}"))?;
    let log = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!("ptxas rejected the {arch} PTX:\n{log}"));
    }
    let cubin = std::fs::read(&cubin_path).map_err(|e| format!("{}: {e}", cubin_path.display()))?;
    Ok((parse_ptxas_log(&log, arch), cubin))
}

fn number_before(line: &str, suffix: &str) -> Option<u32> {
    let end = line.find(suffix)?;
    line[..end].split_whitespace().last()?.parse().ok()
}

/// Parses `ptxas -v` output: an "entry function 'name'" line, then its stack/spill line (after
/// "Function properties for name"; those of a function it calls are not the entry's) and its
/// "Used N registers" line.
fn parse_ptxas_log(log: &str, arch: &str) -> Vec<KernelResources> {
    let mut out: Vec<KernelResources> = Vec::new();
    let mut entry_properties = false;
    for line in log.lines() {
        if let Some(rest) = line.split("Function properties for ").nth(1) {
            entry_properties = out.last().is_some_and(|k| rest.trim() == k.kernel);
        } else if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or_default();
            out.push(KernelResources {
                kernel: name.to_string(),
                arch: arch.to_string(),
                registers: 0,
                spill_stores: 0,
                spill_loads: 0,
                stack_frame: 0,
                shared_mem: 0,
            });
        } else if let Some(k) = out.last_mut() {
            if line.contains("bytes stack frame") && entry_properties {
                k.stack_frame = number_before(line, "bytes stack frame").unwrap_or(0);
                k.spill_stores = number_before(line, "bytes spill stores").unwrap_or(0);
                k.spill_loads = number_before(line, "bytes spill loads").unwrap_or(0);
            } else if line.contains("Used") && line.contains("registers") {
                k.registers = number_before(line, "registers").unwrap_or(0);
                k.shared_mem = number_before(line, "bytes smem").unwrap_or(0);
            }
        }
    }
    out
}

pub fn print_table(all: &[KernelResources]) {
    // The longest entry name sets the first column's width.
    let w = all.iter().map(|k| k.kernel.len()).max().unwrap_or(0).max(6);
    println!(
        "{:<w$} {:>6} {:>5} {:>8} {:>8} {:>6} {:>6}",
        "kernel", "arch", "regs", "spill-st", "spill-ld", "stack", "smem"
    );
    for k in all {
        println!(
            "{:<w$} {:>6} {:>5} {:>8} {:>8} {:>6} {:>6}",
            k.kernel,
            k.arch,
            k.registers,
            k.spill_stores,
            k.spill_loads,
            k.stack_frame,
            k.shared_mem
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host crate embeds `host/ptx/`; a kernel change must come with regenerated PTX (the
    /// cubins are checked against it by `cargo xtask ptx --check`, which needs ptxas).
    #[test]
    fn committed_ptx_is_what_the_kernel_sources_build() {
        let root = tools::repo_root();
        let mut stale = Vec::new();
        for arch in SUPPORTED_ARCHS {
            let (_, fresh) = build_and_compare(&root, arch).unwrap();
            if !fresh {
                stale.push(build_ptx::committed_path(&root, arch, Shipped::Ptx));
            }
        }
        assert!(stale.is_empty(), "{}", stale_message(&stale));
    }

    #[test]
    fn counts_vector_loads_up_to_the_first_branch() {
        let ptx = ".visible .entry k(\n.param .u64 p\n)\n{\n\tmov.u32 %r1, 0;\n\
                   @%p1 bra $L1;\n\
                   { @ok ld.global.v4.u32 {%r1, %r2, %r3, %r4}, [%rd1]; }\n\
                   { @ok ld.global.v4.u32 {%r5, %r6, %r7, %r8}, [%rd2]; }\n\
                   \t@%p2 bra \t$L2;\n\
                   { @ok ld.global.v4.u32 {%r1, %r2, %r3, %r4}, [%rd3]; }\n}\n\
                   .visible .entry other(\n)\n{\n}\n";
        assert_eq!(leading_vector_loads(ptx, "k", "ld.global.v4"), 2);
        assert_eq!(leading_vector_loads(ptx, "other", "ld.global.v4"), 0);
        assert_eq!(leading_vector_loads(ptx, "missing", "ld.global.v4"), 0);
    }

    #[test]
    fn block_registers_round_per_warp() {
        assert_eq!(block_registers(128, 512), 65536);
        assert_eq!(block_registers(130, 512), 136 * 512);
        assert_eq!(block_registers(33, 32), 40 * 32);
        assert!(block_registers(130, 512) > SM_REGISTERS);
    }

    #[test]
    fn finds_device_functions() {
        let entry = ".visible .entry k(\n\t.param .b64 k_param_0\n)\n{\n\tret;\n}\n";
        assert!(check_no_functions(entry).is_ok());
        let with = format!(
            ".func _Rclosure(\n\t.param .b64 p\n);\n{entry}.func _Rclosure(\n\t.param .b64 p\n)\n{{\n\tret;\n}}\n"
        );
        let err = check_no_functions(&with).unwrap_err();
        assert!(err.ends_with(": _Rclosure"), "{err}");
    }

    #[test]
    fn parses_ptxas_verbose_output() {
        let log = "ptxas info    : 0 bytes gmem\n\
ptxas info    : Compiling entry function 'k1' for 'sm_90'\n\
ptxas info    : Function properties for k1\n\
    16 bytes stack frame, 4 bytes spill stores, 8 bytes spill loads\n\
ptxas info    : Used 40 registers, used 1 barriers, 128 bytes smem\n\
ptxas info    : Compiling entry function 'k2' for 'sm_90'\n\
ptxas info    : Function properties for k2\n\
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
ptxas info    : Used 12 registers, used 0 barriers\n\
ptxas info    : Compiling entry function 'k3' for 'sm_90'\n\
ptxas info    : Function properties for k3\n\
    64 bytes stack frame, 32 bytes spill stores, 24 bytes spill loads\n\
ptxas info    : Used 64 registers, used 1 barriers\n\
ptxas info    : Function properties for callee\n\
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n";
        let r = parse_ptxas_log(log, "sm_90");
        assert_eq!(r.len(), 3);
        assert_eq!(
            (r[2].stack_frame, r[2].spill_stores, r[2].spill_loads),
            (64, 32, 24)
        );
        assert_eq!(
            (r[0].kernel.as_str(), r[0].registers, r[0].stack_frame),
            ("k1", 40, 16)
        );
        assert_eq!(
            (r[0].spill_stores, r[0].spill_loads, r[0].shared_mem),
            (4, 8, 128)
        );
        assert_eq!(
            (r[1].kernel.as_str(), r[1].registers, r[1].shared_mem),
            ("k2", 12, 0)
        );
    }
}
