//! `cargo xtask bench [--shapes ROWSxCOLS,...] [--merge FILE...] [--json PATH]
//! [--markdown PATH] [--plots DIR] [--no-peers] [-- ARGS]`: a launcher.
//!
//! With a GPU here: builds and runs `ferrofuse-bench ARGS` (release), then `bench/peers.py` on
//! the same plan when python3 has torch with CUDA and triton, then the report of both. With
//! `--merge`: the report of results measured elsewhere (a gpu-bundle run), no GPU needed:
//!
//! ```text
//! cargo xtask gpu-bundle                                  # here
//! gpu-bundle/run.sh bench --json out.json                 # on the GPU machine: out.json, peers.json
//! cargo xtask bench --merge out.json peers.json --json bench/results/h200.json \
//!     --markdown bench/results/h200.md --plots bench/results/h200
//! ```
//!
//! The report (tables, merged JSON, charts) is `ferrofuse-report` (`report/`), run here through
//! `cargo run`: its chart dependencies stay out of xtask, which CI builds first and often.
//!
//! Exit codes: 0 reported; 1 an error (or the benchmark reported failures); 69
//! ([`EXIT_NO_GPU`]) no CUDA driver here and nothing to merge: prints so in one line, the
//! ptxas resources of the kernels the run would launch, and the commands that run it from a
//! gpu-bundle.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use crate::tools;

/// `ferrofuse-bench`'s exit code when there is no CUDA driver or device (`EX_UNAVAILABLE`;
/// `ferrofuse_bench_schema::schema::EXIT_NO_GPU`), passed on as this task's.
const EXIT_NO_GPU: u8 = 69;

#[derive(clap::Args)]
pub struct Args {
    /// Report these result files (ferrofuse-bench and peers.py JSON) instead of running.
    #[arg(long, num_args = 1..)]
    merge: Vec<PathBuf>,
    /// Shapes instead of the models' (ferrofuse-bench --shapes): ROWSxCOLS, e.g.
    /// 7x18944,3000x11001; COLS is I for the gated ops and H for add+RMSNorm.
    #[arg(long, conflicts_with = "merge")]
    shapes: Option<String>,
    /// Write the merged results here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the tables as Markdown here.
    #[arg(long)]
    markdown: Option<PathBuf>,
    /// Write one PNG chart per op, shape, dtype and mode into this folder.
    #[arg(long)]
    plots: Option<PathBuf>,
    /// Do not run bench/peers.py after the benchmark (GPU here only).
    #[arg(long)]
    no_peers: bool,
    /// Arguments for ferrofuse-bench (after `--`), e.g. `-- --quick` or `-- --models llama3-8b`.
    #[arg(last = true)]
    bench_args: Vec<String>,
}

pub fn run(args: &Args) -> ExitCode {
    match run_inner(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("xtask bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run_inner(args: &Args) -> Result<ExitCode, String> {
    let root = tools::repo_root();
    if !args.merge.is_empty() {
        report(&root, &args.merge, args)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut bench_args = args.bench_args.clone();
    if let Some(shapes) = &args.shapes {
        bench_args.extend(["--shapes".to_string(), shapes.clone()]);
    }
    let out_dir = root.join("target/bench");
    std::fs::create_dir_all(&out_dir).map_err(|e| e.to_string())?;
    let (plan, ours) = (out_dir.join("plan.json"), out_dir.join("ferrofuse.json"));
    let _ = std::fs::remove_file(&ours);
    let exe = tools::build_bench(&root)?;
    let status = Command::new(&exe)
        .arg("--plan-out")
        .arg(&plan)
        .arg("--json")
        .arg(&ours)
        .args(&bench_args)
        .status()
        .map_err(|e| format!("running {}: {e}", exe.display()))?;
    let mut bench_failed = false;
    match status.code() {
        Some(c) if c == EXIT_NO_GPU as i32 => return no_gpu(&plan, &bench_args),
        Some(0) => {}
        Some(1) if ours.exists() => bench_failed = true,
        _ => return Err(format!("ferrofuse-bench failed ({status})")),
    }
    let mut files = vec![ours];
    if !args.no_peers {
        let peers = out_dir.join("peers.json");
        if let Some(ok) = run_peers(&root, &plan, &peers)? {
            bench_failed |= !ok;
            files.push(peers);
        }
    }
    report(&root, &files, args)?;
    Ok(if bench_failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Runs `ferrofuse-report FILES` with the output flags given here. Paths stay relative to the
/// caller's folder: cargo runs the report there.
fn report(root: &Path, files: &[PathBuf], args: &Args) -> Result<(), String> {
    let mut cmd = Command::new(tools::cargo());
    cmd.args([
        "run",
        "--quiet",
        "--package",
        "ferrofuse-report",
        "--manifest-path",
    ])
    .arg(root.join("Cargo.toml"))
    .arg("--")
    .args(files);
    for (flag, value) in [
        ("--json", &args.json),
        ("--markdown", &args.markdown),
        ("--plots", &args.plots),
    ] {
        if let Some(value) = value {
            cmd.arg(flag).arg(value);
        }
    }
    tools::run(&mut cmd)
}

/// Runs the peers on `plan` if python3 here has torch with CUDA and triton. `None` when it
/// cannot; `Some(ok)` otherwise.
fn run_peers(root: &Path, plan: &Path, out: &Path) -> Result<Option<bool>, String> {
    let python = tools::python();
    let probe = Command::new(&python)
        .args([
            "-c",
            "import torch, triton, sys; sys.exit(0 if torch.cuda.is_available() else 1)",
        ])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        println!(
            "peers skipped: {python} has no torch with CUDA and triton here (run bench/peers.py where it does)"
        );
        return Ok(None);
    }
    let _ = std::fs::remove_file(out);
    let status = Command::new(&python)
        .arg(root.join("bench/peers.py"))
        .arg("--plan")
        .arg(plan)
        .arg("--json")
        .arg(out)
        .status()
        .map_err(|e| format!("running peers.py: {e}"))?;
    if !out.exists() {
        return Err(format!("peers.py wrote no results ({status})"));
    }
    Ok(Some(status.success()))
}

/// The no-GPU report: one line, the kernels' ptxas resources, how to run it elsewhere.
fn no_gpu(plan: &Path, bench_args: &[String]) -> Result<ExitCode, String> {
    let wanted = std::fs::read_to_string(plan)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .map(|p| kernel_prefixes(&p))
        .unwrap_or_default();
    println!();
    println!("ptxas resources (sm_90) of the kernels this run would launch:");
    match crate::ptx::committed_resources("sm_90") {
        Ok(all) => {
            let chosen: Vec<_> = all
                .iter()
                .filter(|k| {
                    k.kernel == "empty_kernel" || wanted.iter().any(|p| k.kernel.starts_with(p))
                })
                .cloned()
                .collect();
            crate::ptx::print_table(if chosen.is_empty() { &all } else { &chosen });
        }
        Err(e) => println!("  (not available: {e})"),
    }
    let extra = if bench_args.is_empty() {
        String::new()
    } else {
        format!(" {}", bench_args.join(" "))
    };
    println!();
    println!("to measure, run it from a gpu-bundle on a machine with a CUDA GPU:");
    println!("  cargo xtask gpu-bundle");
    println!(
        "  gpu-bundle/run.sh bench --json out.json{extra}    # on the GPU machine; writes out.json and peers.json"
    );
    println!(
        "  cargo xtask bench --merge out.json peers.json --json bench/results/h200.json --markdown bench/results/h200.md --plots bench/results/h200"
    );
    Ok(ExitCode::from(EXIT_NO_GPU))
}

/// Kernel-name prefixes of the ops and dtypes in a plan (`gated_fwd_bf16`, ...). The plan is
/// read as plain JSON: only `configs[].op` and `configs[].dtype` matter here.
fn kernel_prefixes(plan: &serde_json::Value) -> BTreeSet<String> {
    let configs = plan["configs"].as_array().map_or(&[][..], Vec::as_slice);
    configs
        .iter()
        .flat_map(|c| {
            let families: &[&str] = match c["op"].as_str() {
                Some("add_rmsnorm_fwd") => &["rmsnorm_fwd"],
                Some("add_rmsnorm_bwd") => &["rmsnorm_bwd", "rmsnorm_dw"],
                Some("gated_fwd") => &["gated_fwd"],
                Some("gated_bwd") => &["gated_bwd"],
                _ => &[],
            };
            let dtype = c["dtype"].as_str().unwrap_or_default().to_string();
            families.iter().map(move |f| format!("{f}_{dtype}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_prefixes_of_a_plan() {
        let plan = serde_json::json!({
            "commit": "abc", "device": 0, "method": {},
            "configs": [
                {"op": "gated_fwd", "variant": "silu_split", "dtype": "bf16", "rows": 1,
                 "cols": 8, "bytes": 48, "modes": ["graph"]},
                {"op": "add_rmsnorm_bwd", "variant": "rms", "dtype": "f32", "rows": 1,
                 "cols": 8, "bytes": 104, "modes": ["per_call"]}
            ]
        });
        assert_eq!(
            kernel_prefixes(&plan).into_iter().collect::<Vec<_>>(),
            ["gated_fwd_bf16", "rmsnorm_bwd_f32", "rmsnorm_dw_f32"]
        );
        assert!(kernel_prefixes(&serde_json::json!({})).is_empty());
    }
}
