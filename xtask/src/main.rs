//! `cargo xtask <task>`: the project's commands, one module per task.
//!
//! Kept light (clap, serde, serde_json): it must compile fast on a fresh machine and in CI.
//! Anything heavier is a crate of its own that a task runs, as the benchmark report is
//! (`ferrofuse-report`, `report/`).

mod bench;
mod build_ptx;
mod bundle;
mod ci;
mod ptx;
mod tools;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "ferrofuse project tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Build the kernels' PTX for every shipped arch into `host/ptx/` (`--check`: fail if it
    /// is stale instead) and check it with ptxas (registers, spills, stack).
    Ptx(ptx::Args),
    /// What CI runs: fmt check, clippy with warnings denied, all tests (the PTX freshness test
    /// among them), `ptx --check`, and a downstream crate and the packaged crates built on the
    /// stable toolchain of the declared MSRV.
    Ci,
    /// Write a folder with the test and bench executables and a script that runs them on a GPU
    /// machine without a Rust toolchain.
    GpuBundle(bundle::Args),
    /// Install the tools the tasks need (ptxas from PyPI) into `.tools/`; `--candle` also the
    /// CUDA 13.0 wheels ferrofuse-candle builds with, printing the environment to build it.
    Setup {
        #[arg(long)]
        candle: bool,
    },
    /// Run the benchmark (GPU here) and report it, or report results measured elsewhere
    /// (`--merge`) with `ferrofuse-report`: tables, JSON, charts. Exits 69 when there is no GPU
    /// and nothing to merge.
    Bench(bench::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.task {
        Task::Bench(args) => return bench::run(&args),
        Task::Ptx(args) => ptx::run(&args),
        Task::Ci => ci::run(),
        Task::GpuBundle(args) => bundle::run(&args),
        Task::Setup { candle } => tools::ptxas().and_then(|p| {
            println!("ptxas: {}", p.display());
            if candle {
                tools::candle_cuda()?.print_env();
            }
            Ok(())
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}
