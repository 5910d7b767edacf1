//! `ferrofuse-report FILE... [--json PATH] [--markdown PATH] [--plots DIR]`: the report of
//! benchmark results measured on a GPU machine (`ferrofuse-bench` and `bench/peers.py` JSON),
//! made anywhere:
//!
//! ```text
//! cargo run -p ferrofuse-report -- out.json peers.json \
//!     --json bench/results/h200.json --markdown bench/results/h200.md --plots bench/results/h200
//! ```
//!
//! Prints one table per op (shape, our time, GB/s, % of the copy ceiling, each peer's time over
//! ours, > 1 when ferrofuse is faster), the launch floor and how the results stand against the
//! targets set for this work; writes the merged JSON, the tables as Markdown, and one PNG chart
//! per op, shape, dtype and mode (GB/s against tokens). `cargo xtask bench` runs it after a
//! benchmark and for `--merge`.
//!
//! A crate apart from xtask because of its dependencies (plotters, a compiled-in font, png):
//! xtask stays quick to build for CI.

mod merge;
mod plots;
#[cfg(test)]
mod sample;
mod tables;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use ferrofuse_bench_schema::schema::Report;

#[derive(Parser)]
#[command(
    name = "ferrofuse-report",
    about = "Merge ferrofuse benchmark results (ferrofuse-bench and peers.py JSON) into tables, JSON and charts"
)]
struct Args {
    /// Result files, merged in order (a record measured twice keeps the later file's).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Write the merged results here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the tables as Markdown here.
    #[arg(long)]
    markdown: Option<PathBuf>,
    /// Write one PNG chart per op, shape, dtype and mode into this folder, with an index.md.
    #[arg(long)]
    plots: Option<PathBuf>,
}

fn main() -> ExitCode {
    match run(&Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferrofuse-report: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), String> {
    let reports = args
        .files
        .iter()
        .map(|f| load(f))
        .collect::<Result<Vec<_>, _>>()?;
    let (merged, warnings) = merge::merge(reports)?;
    for w in &warnings {
        eprintln!("ferrofuse-report: warning: {w}");
    }
    print!("{}", tables::render_tables(&merged, false));
    if let Some(path) = &args.markdown {
        write(path, &tables::render_tables(&merged, true))?;
        println!("wrote {}", path.display());
    }
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&merged).map_err(|e| e.to_string())? + "\n";
        write(path, &json)?;
        println!("wrote {}", path.display());
    }
    if let Some(dir) = &args.plots {
        let n = plots::write_plots(&merged, dir)?;
        println!("wrote {n} charts (PNG) to {}", dir.display());
    }
    Ok(())
}

fn load(path: &Path) -> Result<Report, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: not a results file: {e}", path.display()))
}

/// Writes `text` to `path`, creating its folder.
fn write(path: &Path, text: &str) -> Result<(), String> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))
}
