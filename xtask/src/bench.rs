//! `cargo xtask bench [--merge FILE...] [--json PATH] [--plots DIR] [--markdown PATH] [-- ARGS]`
//!
//! With a GPU here: builds and runs `ferrofuse-bench ARGS` (release), then `bench/peers.py` on
//! the same plan when python3 has torch with CUDA, and reports both. With `--merge`: reports
//! results measured elsewhere (a gpu-bundle run), no GPU needed:
//!
//! ```text
//! cargo xtask gpu-bundle                                  # here
//! gpu-bundle/run.sh bench --json out.json                 # on the GPU machine: out.json, peers.json
//! cargo xtask bench --merge out.json peers.json --json bench/results/h200.json --plots bench/results/h200
//! ```
//!
//! The report: one terminal table per op (shape, our time, GB/s, % of the copy ceiling, the
//! ratio of each peer's time to ours, > 1 when we are faster), the launch floor, a check of
//! the issue's targets, the merged JSON, and plots (GB/s against tokens per op and shape, ours
//! against the peers and the ceiling) as SVG and PNG.
//!
//! Exit codes: 0 reported; 1 an error (or the benchmark reported failures); 69
//! ([`EXIT_NO_GPU`]) no CUDA driver here and nothing to merge: prints so in one line, the
//! ptxas resources of the kernels the run would launch, and the commands that run it from a
//! gpu-bundle.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use crate::plot::{Chart, HLine, Rgb, Series};
use crate::tools;

#[path = "../../bench/src/schema.rs"]
#[allow(dead_code)]
pub mod schema;
#[path = "../../bench/src/shapes.rs"]
#[allow(dead_code)]
pub mod shapes;

use schema::{
    EXIT_NO_GPU, IMPL_FERROFUSE, Key, OP_COPY, OP_EMPTY, PEER_IMPLS, Record, Report, pct_of,
};

#[derive(clap::Args, Default)]
pub struct Args {
    /// Report these result files (ferrofuse-bench and peers.py JSON) instead of running.
    #[arg(long, num_args = 1..)]
    merge: Vec<PathBuf>,
    /// Write the merged results here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Folder for the plots (SVG and PNG, one per op, shape and mode).
    #[arg(long, default_value = "target/bench/plots")]
    plots: PathBuf,
    /// Skip the plots.
    #[arg(long)]
    no_plots: bool,
    /// Also write the tables as Markdown here (for the README).
    #[arg(long)]
    markdown: Option<PathBuf>,
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
    let mut files = args.merge.clone();
    let mut bench_failed = false;
    if files.is_empty() {
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
            .args(&args.bench_args)
            .status()
            .map_err(|e| format!("running {}: {e}", exe.display()))?;
        match status.code() {
            Some(c) if c == EXIT_NO_GPU as i32 => return no_gpu(&plan, &args.bench_args),
            Some(0) => {}
            Some(1) if ours.exists() => bench_failed = true,
            _ => return Err(format!("ferrofuse-bench failed ({status})")),
        }
        files.push(ours);
        if !args.no_peers {
            let peers = out_dir.join("peers.json");
            if let Some(ok) = run_peers(&root, &plan, &peers)? {
                bench_failed |= !ok;
                files.push(peers);
            }
        }
    }

    let reports = files
        .iter()
        .map(|f| load(f))
        .collect::<Result<Vec<_>, _>>()?;
    let (merged, warnings) = merge(reports)?;
    for w in &warnings {
        eprintln!("xtask bench: warning: {w}");
    }
    let text = render_tables(&merged, false);
    print!("{text}");
    if let Some(path) = &args.markdown {
        write(path, &render_tables(&merged, true))?;
        println!("wrote {}", path.display());
    }
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&merged).map_err(|e| e.to_string())? + "\n";
        write(path, &json)?;
        println!("wrote {}", path.display());
    }
    if !args.no_plots {
        let dir = if args.plots.is_absolute() {
            args.plots.clone()
        } else {
            std::env::current_dir()
                .map_err(|e| e.to_string())?
                .join(&args.plots)
        };
        let n = write_plots(&merged, &dir)?;
        println!("wrote {n} plots (SVG and PNG) to {}", dir.display());
    }
    Ok(if bench_failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))
}

fn load(path: &Path) -> Result<Report, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: not a results file: {e}", path.display()))
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
        .and_then(|t| serde_json::from_str::<schema::Plan>(&t).ok())
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
        "  cargo xtask bench --merge out.json peers.json --json bench/results/h200.json --plots bench/results/h200"
    );
    Ok(ExitCode::from(EXIT_NO_GPU))
}

/// Kernel-name prefixes of the ops and dtypes in a plan (`gated_fwd_bf16`, ...).
fn kernel_prefixes(plan: &schema::Plan) -> BTreeSet<String> {
    plan.configs
        .iter()
        .flat_map(|c| {
            let families: &[&str] = match c.op.as_str() {
                "add_rmsnorm_fwd" => &["rmsnorm_fwd"],
                "add_rmsnorm_bwd" => &["rmsnorm_bwd", "rmsnorm_dw"],
                "gated_fwd" => &["gated_fwd"],
                "gated_bwd" => &["gated_bwd"],
                _ => &[],
            };
            families.iter().map(move |f| format!("{f}_{}", c.dtype))
        })
        .collect()
}

/// Merges result files: the header (and the ceiling every percentage is recomputed against)
/// comes from the file with ferrofuse results, else the first. A record measured twice (same
/// shape, mode and impl) keeps the later file's.
pub fn merge(reports: Vec<Report>) -> Result<(Report, Vec<String>), String> {
    let mut warnings = Vec::new();
    let Some(main) = reports
        .iter()
        .position(|r| r.results.iter().any(|x| x.imp == IMPL_FERROFUSE))
        .or(if reports.is_empty() { None } else { Some(0) })
    else {
        return Err("nothing to merge".into());
    };
    let mut merged = Report {
        results: Vec::new(),
        methods: Vec::new(),
        ..reports[main].clone()
    };
    let mut seen: BTreeMap<(Key, String), usize> = BTreeMap::new();
    for r in &reports {
        if r.gpu != merged.gpu {
            warnings.push(format!(
                "results from different GPUs: {} and {}",
                merged.gpu, r.gpu
            ));
        }
        if r.commit != merged.commit {
            warnings.push(format!(
                "results from different commits: {} and {}",
                merged.commit, r.commit
            ));
        }
        if let (Some(a), Some(b)) = (merged.device, r.device)
            && a != b
        {
            warnings.push(format!("results from different devices: {a} and {b}"));
        }
        merged.methods.extend(r.methods.iter().cloned());
        for rec in &r.results {
            let id = (rec.key(), rec.imp.clone());
            match seen.get(&id) {
                Some(&i) => {
                    warnings.push(format!(
                        "{} {} {} {}x{} {} {} measured twice: keeping the later",
                        rec.op, rec.variant, rec.dtype, rec.rows, rec.cols, rec.mode, rec.imp
                    ));
                    merged.results[i] = rec.clone();
                }
                None => {
                    seen.insert(id, merged.results.len());
                    merged.results.push(rec.clone());
                }
            }
        }
    }
    let ceiling = merged.copy_ceiling_gbs;
    for rec in &mut merged.results {
        if rec.op != OP_COPY || rec.imp != IMPL_FERROFUSE {
            rec.pct_of_ceiling = pct_of(rec.gbs, ceiling);
        }
    }
    warnings.dedup();
    Ok((merged, warnings))
}

/// Whether the op (by name) is a backward one.
fn is_backward(op: &str) -> bool {
    shapes::Op::parse(op).is_some_and(|o| o.is_backward())
}

/// The ops' names in the order the report shows them (`Op::ALL`'s).
fn op_names() -> impl Iterator<Item = &'static str> {
    shapes::Op::ALL.iter().map(|o| o.name())
}

fn peer_label(imp: &str) -> &str {
    match imp {
        "torch_eager" => "eager",
        "torch_compile" => "compile",
        other => other,
    }
}

/// One line of a per-op table: a shape and mode, ours and the peers.
#[derive(Debug, PartialEq)]
struct Row {
    variant: String,
    dtype: String,
    rows: usize,
    cols: usize,
    mode: String,
    ours: Option<Record>,
    /// `median_us` per peer impl present.
    peers: BTreeMap<String, f64>,
}

impl Row {
    /// Best peer time over ours (> 1: we are faster).
    fn vs_best(&self) -> Option<f64> {
        let ours = self.ours.as_ref()?;
        let best = self.peers.values().copied().fold(f64::INFINITY, f64::min);
        best.is_finite().then(|| best / ours.median_us)
    }
}

fn rows_of(report: &Report, op: &str) -> Vec<Row> {
    let mut map: BTreeMap<(String, String, usize, bool, usize), Row> = BTreeMap::new();
    for r in report.results.iter().filter(|r| r.op == op) {
        // Order: variant, dtype, cols, per_call before graph, rows.
        let row = map
            .entry((
                r.variant.clone(),
                r.dtype.clone(),
                r.cols,
                r.mode != "per_call",
                r.rows,
            ))
            .or_insert_with(|| Row {
                variant: r.variant.clone(),
                dtype: r.dtype.clone(),
                rows: r.rows,
                cols: r.cols,
                mode: r.mode.clone(),
                ours: None,
                peers: BTreeMap::new(),
            });
        if r.imp == IMPL_FERROFUSE {
            row.ours = Some(r.clone());
        } else {
            row.peers.insert(r.imp.clone(), r.median_us);
        }
    }
    map.into_values().collect()
}

fn models_label(op: &str, variant: &str, cols: usize) -> String {
    match shapes::Op::parse(op) {
        Some(o) => shapes::models_for(o, variant, cols).join(", "),
        None => String::new(),
    }
}

/// The per-op tables, the launch floor and ceiling lines, and the targets check, as aligned
/// text (or Markdown).
pub fn render_tables(report: &Report, markdown: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}ferrofuse benchmark on {}, driver {}, commit {}, {}",
        if markdown { "## " } else { "" },
        report.gpu,
        report.driver,
        report.commit,
        report.date
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "copy ceiling: {:.0} GB/s (device-to-device copy, bytes read + written); ratios are a peer's median time over ours (> 1: ferrofuse faster); `!` marks a peer more than 2% faster",
        report.copy_ceiling_gbs
    );
    for copy in report
        .results
        .iter()
        .filter(|r| r.op == OP_COPY && r.imp != IMPL_FERROFUSE)
    {
        let _ = writeln!(out, "copy measured by {}: {:.0} GB/s", copy.imp, copy.gbs);
    }
    let floor: Vec<String> = report
        .results
        .iter()
        .filter(|r| r.op == OP_EMPTY)
        .map(|r| format!("{} {} {:.2} us", r.imp, r.mode, r.median_us))
        .collect();
    if !floor.is_empty() {
        let _ = writeln!(out, "launch floor (empty kernel): {}", floor.join(", "));
    }
    let peers_present: Vec<&str> = PEER_IMPLS
        .iter()
        .copied()
        .filter(|p| {
            report
                .results
                .iter()
                .any(|r| r.imp == *p && op_names().any(|o| o == r.op))
        })
        .collect();
    for op in op_names() {
        let rows = rows_of(report, op);
        if rows.is_empty() {
            continue;
        }
        let mut header: Vec<String> = [
            "variant",
            "dtype",
            "rows x cols",
            "mode",
            "ours us",
            "GB/s",
            "%ceil",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        for p in &peers_present {
            header.push(format!("{} x", peer_label(p)));
        }
        header.push("best x".into());
        header.push("models".into());
        let mut table = vec![header];
        for r in &rows {
            let (us, g, pct) = match &r.ours {
                Some(o) => (
                    format!("{:.2}", o.median_us),
                    format!("{:.0}", o.gbs),
                    format!("{:.1}", o.pct_of_ceiling),
                ),
                None => ("-".into(), "-".into(), "-".into()),
            };
            let mut line = vec![
                r.variant.clone(),
                r.dtype.clone(),
                format!("{} x {}", r.rows, r.cols),
                r.mode.clone(),
                us,
                g,
                pct,
            ];
            for p in &peers_present {
                line.push(match (r.peers.get(*p), &r.ours) {
                    (Some(t), Some(o)) => format!("{:.2}", t / o.median_us),
                    (Some(t), None) => format!("({t:.2} us)"),
                    _ => "-".into(),
                });
            }
            line.push(match r.vs_best() {
                Some(x) if x < 0.98 => format!("{x:.2} !"),
                Some(x) => format!("{x:.2}"),
                None => "-".into(),
            });
            line.push(models_label(op, &r.variant, r.cols));
            table.push(line);
        }
        let _ = writeln!(out);
        let _ = writeln!(out, "{}{op}", if markdown { "### " } else { "== " });
        let _ = writeln!(out);
        out.push_str(&format_table(&table, markdown));
    }
    out.push_str(&render_targets(report, markdown));
    out
}

fn format_table(table: &[Vec<String>], markdown: bool) -> String {
    let cols = table.iter().map(|r| r.len()).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            table
                .iter()
                .map(|r| r.get(c).map_or(0, |s| s.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for (i, row) in table.iter().enumerate() {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(c, s)| {
                // Text columns left, numbers right.
                if c < 4 || c + 1 == row.len() {
                    format!("{s:<w$}", w = widths[c])
                } else {
                    format!("{s:>w$}", w = widths[c])
                }
            })
            .collect();
        if markdown {
            let _ = writeln!(out, "| {} |", cells.join(" | "));
            if i == 0 {
                let sep: Vec<String> = (0..cells.len())
                    .map(|c| {
                        if c < 4 || c + 1 == cells.len() {
                            "---".into()
                        } else {
                            "---:".into()
                        }
                    })
                    .collect();
                let _ = writeln!(out, "| {} |", sep.join(" | "));
            }
        } else {
            let _ = writeln!(out, "{}", cells.join("  ").trim_end());
        }
    }
    out
}

/// How the committed results stand against the issue's targets (reported, never asserted).
fn render_targets(report: &Report, markdown: bool) -> String {
    struct Target {
        what: &'static str,
        met: usize,
        total: usize,
        misses: Vec<String>,
    }
    let mut targets = Vec::new();
    let all_rows: Vec<(String, Row)> = op_names()
        .flat_map(|op| rows_of(report, op).into_iter().map(|r| (op.to_string(), r)))
        .collect();
    let label = |op: &str, r: &Row| {
        format!(
            "{op} {} {} {}x{} {}",
            r.variant, r.dtype, r.rows, r.cols, r.mode
        )
    };
    let mut check = |what: &'static str,
                     applies: &dyn Fn(&str, &Row) -> bool,
                     value: &dyn Fn(&Row) -> Option<f64>,
                     min: f64,
                     fmt: &dyn Fn(f64) -> String| {
        let mut t = Target {
            what,
            met: 0,
            total: 0,
            misses: Vec::new(),
        };
        for (op, r) in &all_rows {
            if !applies(op, r) {
                continue;
            }
            let Some(v) = value(r) else { continue };
            t.total += 1;
            if v >= min {
                t.met += 1;
            } else {
                t.misses.push(format!("{} ({})", label(op, r), fmt(v)));
            }
        }
        if t.total > 0 {
            targets.push(t);
        }
    };
    let bf16_per_call = |r: &Row| r.dtype == "bf16" && r.mode == "per_call";
    check(
        "gated bf16 per_call at 16384 tokens >= 4100 GB/s",
        &|op, r| op == "gated_fwd" && bf16_per_call(r) && r.rows == 16384,
        &|r| r.ours.as_ref().map(|o| o.gbs),
        4100.0,
        &|v| format!("{v:.0} GB/s"),
    );
    check(
        "add+RMSNorm bf16 per_call at 16384 tokens >= 4050 GB/s",
        &|op, r| op == "add_rmsnorm_fwd" && bf16_per_call(r) && r.rows == 16384,
        &|r| r.ours.as_ref().map(|o| o.gbs),
        4050.0,
        &|v| format!("{v:.0} GB/s"),
    );
    check(
        "bf16 per_call at 4096 and 16384 tokens >= 0.98 x best peer",
        &|op, r| !is_backward(op) && bf16_per_call(r) && (r.rows == 4096 || r.rows == 16384),
        &|r| r.vs_best(),
        0.98,
        &|v| format!("{v:.2} x"),
    );
    check(
        "graph mode, 16 to 1024 tokens >= 1.10 x best peer",
        &|op, r| {
            !is_backward(op)
                && r.dtype == "bf16"
                && r.mode == "graph"
                && (16..=1024).contains(&r.rows)
        },
        &|r| r.vs_best(),
        1.10,
        &|v| format!("{v:.2} x"),
    );
    check(
        "1 and 4 tokens: no slower than the best peer",
        &|op, r| !is_backward(op) && r.dtype == "bf16" && r.rows <= 4,
        &|r| r.vs_best(),
        1.0,
        &|v| format!("{v:.2} x"),
    );
    check(
        "no shape where a peer is more than 2% faster",
        &|_, _| true,
        &|r| r.vs_best(),
        0.98,
        &|v| format!("{v:.2} x"),
    );
    let mut out = String::new();
    if targets.is_empty() {
        return out;
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{}targets of issue 4 (reported, not asserted)",
        if markdown { "### " } else { "== " }
    );
    let _ = writeln!(out);
    for t in targets {
        let _ = writeln!(
            out,
            "{}{}: {}/{} {}",
            if markdown { "- " } else { "" },
            t.what,
            t.met,
            t.total,
            if t.misses.is_empty() {
                "met"
            } else {
                "met; missed:"
            }
        );
        let indent = if markdown { "  - " } else { "    " };
        for m in t.misses.iter().take(12) {
            let _ = writeln!(out, "{indent}{m}");
        }
        if t.misses.len() > 12 {
            let _ = writeln!(out, "{indent}... and {} more", t.misses.len() - 12);
        }
    }
    out
}

fn impl_color(imp: &str) -> Rgb {
    match imp {
        IMPL_FERROFUSE => [214, 39, 40],
        "torch_eager" => [127, 127, 127],
        "torch_compile" => [31, 119, 180],
        "triton" => [44, 160, 44],
        _ => [148, 103, 189],
    }
}

/// One chart per (op, variant, dtype, cols, mode): GB/s against tokens for every impl, with
/// the copy ceiling. Returns how many charts were written (each as .svg and .png).
pub fn write_plots(report: &Report, dir: &Path) -> Result<usize, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let charts = charts(report);
    let mut index = String::from("# ferrofuse benchmark plots\n\n");
    let _ = writeln!(
        index,
        "{} ({}), commit {}, {}. GB/s = minimal bytes / median time; dashed: the copy ceiling.\n",
        report.gpu, report.driver, report.commit, report.date
    );
    for (name, chart) in &charts {
        write(&dir.join(format!("{name}.svg")), &chart.svg())?;
        let png = chart.png();
        std::fs::write(dir.join(format!("{name}.png")), png)
            .map_err(|e| format!("writing {name}.png: {e}"))?;
        let _ = writeln!(index, "![{name}]({name}.svg)\n");
    }
    write(&dir.join("index.md"), &index)?;
    Ok(charts.len())
}

fn charts(report: &Report) -> Vec<(String, Chart)> {
    let mut groups: BTreeMap<(usize, String, String, usize, String), Vec<&Record>> =
        BTreeMap::new();
    for r in &report.results {
        let Some(op_pos) = op_names().position(|o| o == r.op) else {
            continue;
        };
        groups
            .entry((
                op_pos,
                r.variant.clone(),
                r.dtype.clone(),
                r.cols,
                r.mode.clone(),
            ))
            .or_default()
            .push(r);
    }
    let mut out = Vec::new();
    for ((op_pos, variant, dtype, cols, mode), recs) in groups {
        let op = shapes::Op::ALL[op_pos].name();
        let mut by_impl: BTreeMap<usize, (String, Vec<(f64, f64)>)> = BTreeMap::new();
        for r in recs {
            if r.rows == 0 {
                continue;
            }
            let order = std::iter::once(IMPL_FERROFUSE)
                .chain(PEER_IMPLS)
                .position(|i| i == r.imp)
                .unwrap_or(99);
            by_impl
                .entry(order)
                .or_insert_with(|| (r.imp.clone(), Vec::new()))
                .1
                .push((r.rows as f64, r.gbs));
        }
        let mut ticks: Vec<f64> = shapes::TOKENS.iter().map(|&t| t as f64).collect();
        for (_, pts) in by_impl.values() {
            for p in pts {
                if !ticks.contains(&p.0) {
                    ticks.push(p.0);
                }
            }
        }
        ticks.sort_by(|a, b| a.total_cmp(b));
        let (lo, hi) = by_impl
            .values()
            .flat_map(|(_, p)| p.iter().map(|x| x.0))
            .fold((f64::INFINITY, 0.0f64), |(lo, hi), x| {
                (lo.min(x), hi.max(x))
            });
        ticks.retain(|t| *t >= lo && *t <= hi);
        let dim = if op.starts_with("gated") { "I" } else { "H" };
        let models = models_label(op, &variant, cols);
        let mode_text = if mode == "graph" {
            "CUDA-graph replay (no L2 flush)"
        } else {
            "per call, L2 flushed before each run"
        };
        let chart = Chart {
            title: format!("{op} {variant} {dtype}, {dim} = {cols}"),
            subtitle: if models.is_empty() {
                mode_text.to_string()
            } else {
                format!("{models}; {mode_text}")
            },
            x_label: "tokens (rows)".into(),
            y_label: "GB/s (minimal traffic)".into(),
            x_ticks: ticks,
            series: by_impl
                .into_values()
                .map(|(imp, points)| Series {
                    color: impl_color(&imp),
                    name: imp,
                    points,
                })
                .collect(),
            hline: Some(HLine {
                y: report.copy_ceiling_gbs,
                label: format!("copy {:.0} GB/s", report.copy_ceiling_gbs),
                color: [0, 0, 0],
            }),
        };
        out.push((format!("{op}_{variant}_{dtype}_{cols}_{mode}"), chart));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(
        op: &str,
        variant: &str,
        rows: usize,
        cols: usize,
        imp: &str,
        mode: &str,
        us: f64,
    ) -> Record {
        let bytes = (3 * rows * cols * 2) as u64;
        let gbs = schema::gbs(bytes, us);
        Record {
            op: op.into(),
            variant: variant.into(),
            dtype: "bf16".into(),
            rows,
            cols,
            imp: imp.into(),
            mode: mode.into(),
            median_us: us,
            gbs,
            pct_of_ceiling: 0.0,
        }
    }

    fn report(ceiling: f64, results: Vec<Record>) -> Report {
        Report {
            gpu: "NVIDIA H200".into(),
            driver: "580.95.05 (CUDA 13.0)".into(),
            date: "2026-11-29T12:00:00Z".into(),
            commit: "abc".into(),
            copy_ceiling_gbs: ceiling,
            device: Some(0),
            results,
            methods: Vec::new(),
        }
    }

    /// A ferrofuse file and a peers file, as the two programs write them.
    fn sample() -> (Report, Report) {
        let mut ours = vec![rec(
            OP_EMPTY,
            "launch_floor",
            0,
            0,
            IMPL_FERROFUSE,
            "graph",
            0.5,
        )];
        let mut peers = vec![rec(OP_EMPTY, "launch_floor", 0, 0, "triton", "graph", 0.6)];
        for (rows, us, peer_us) in [(1, 2.0, 2.4), (16, 2.2, 2.3), (16384, 345.0, 340.0)] {
            ours.push(rec(
                "gated_fwd",
                "silu_split",
                rows,
                14336,
                IMPL_FERROFUSE,
                "per_call",
                us,
            ));
            for (k, p) in PEER_IMPLS.iter().enumerate() {
                peers.push(rec(
                    "gated_fwd",
                    "silu_split",
                    rows,
                    14336,
                    p,
                    "per_call",
                    peer_us + k as f64,
                ));
            }
        }
        ours.push(rec(
            "gated_fwd",
            "silu_split",
            16,
            14336,
            IMPL_FERROFUSE,
            "graph",
            1.0,
        ));
        peers.push(rec(
            "gated_fwd",
            "silu_split",
            16,
            14336,
            "triton",
            "graph",
            1.5,
        ));
        (report(4240.0, ours), report(4100.0, peers))
    }

    #[test]
    fn merge_takes_the_ferrofuse_header_and_recomputes_percentages() {
        let (ours, peers) = sample();
        // The peers file first: the header still comes from the ferrofuse file.
        let (m, warnings) = merge(vec![peers, ours]).unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(m.copy_ceiling_gbs, 4240.0);
        assert_eq!(m.results.len(), 2 + 3 * 4 + 2);
        for r in &m.results {
            assert!((r.pct_of_ceiling - 100.0 * r.gbs / 4240.0).abs() < 1e-9);
        }
        // Round trip through the issue's schema.
        let text = serde_json::to_string(&m).unwrap();
        assert!(text.contains("\"impl\":\"torch_compile\""));
        let back: Report = serde_json::from_str(&text).unwrap();
        assert_eq!(back.results.len(), m.results.len());
        for (a, b) in back.results.iter().zip(&m.results) {
            assert_eq!((a.key(), &a.imp), (b.key(), &b.imp));
            assert!((a.median_us - b.median_us).abs() <= 1e-12 * b.median_us);
        }
    }

    #[test]
    fn merge_keeps_the_later_duplicate_and_warns() {
        let (ours, _) = sample();
        let mut again = ours.clone();
        again.results[1].median_us = 9.0;
        again.commit = "def".into();
        again.device = Some(1);
        let (m, warnings) = merge(vec![ours, again]).unwrap();
        assert_eq!(m.results.len(), 5);
        assert_eq!(m.results[1].median_us, 9.0);
        assert_eq!(m.device, Some(0));
        assert!(warnings.iter().any(|w| w.contains("measured twice")));
        assert!(warnings.iter().any(|w| w.contains("different commits")));
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("different devices: 0 and 1"))
        );
        assert!(merge(vec![]).is_err());
    }

    #[test]
    fn reads_the_issue_schema() {
        let text = r#"{"gpu": "g", "driver": "d", "date": "t", "commit": "c",
            "copy_ceiling_gbs": 4000.0,
            "results": [{"op": "gated_fwd", "variant": "silu_split", "dtype": "bf16",
              "rows": 1, "cols": 8, "impl": "triton", "mode": "graph", "median_us": 1.0,
              "gbs": 0.048, "pct_of_ceiling": 0.0012}]}"#;
        let r: Report = serde_json::from_str(text).unwrap();
        assert_eq!(r.results[0].imp, "triton");
        assert!(r.methods.is_empty());
        assert_eq!(r.device, None);
    }

    #[test]
    fn tables_show_ratios_and_flag_slower_shapes() {
        let (ours, peers) = sample();
        let (m, _) = merge(vec![ours, peers]).unwrap();
        let text = render_tables(&m, false);
        assert!(text.contains("== gated_fwd"));
        assert!(text.contains(
            "launch floor (empty kernel): ferrofuse graph 0.50 us, triton graph 0.60 us"
        ));
        // 1 token: eager 2.4 / 2.0 = 1.20; 16384 tokens: best peer 340 / 345 = 0.986, shown as
        // 0.99 and not flagged (the flag is for more than 2% slower).
        let line1 = text.lines().find(|l| l.contains("1 x 14336")).unwrap();
        assert!(line1.contains("1.20"), "{line1}");
        let big = text.lines().find(|l| l.contains("16384 x 14336")).unwrap();
        assert!(big.contains("0.99") && !big.contains('!'), "{big}");
        assert!(big.contains("LLaMA-3-8B, Mistral-7B"));
        // Graph mode at 16 tokens: triton 1.5 / 1.0.
        let graph = text
            .lines()
            .find(|l| l.contains("16 x 14336") && l.contains("graph"))
            .unwrap();
        assert!(graph.contains("1.50"), "{graph}");
        assert!(text.contains("graph mode, 16 to 1024 tokens >= 1.10 x best peer: 1/1 met"));
        assert!(
            text.contains("gated bf16 per_call at 16384 tokens >= 4100 GB/s: 0/1 met; missed:")
        );
        let md = render_tables(&m, true);
        assert!(md.contains("### gated_fwd"));
        assert!(md.contains("| --- |") || md.contains("| --- | ---"));
    }

    #[test]
    fn flags_a_faster_peer() {
        let (mut ours, peers) = sample();
        ours.results[1].median_us = 3.0; // 1 token: best peer 2.4 / 3.0 = 0.8
        let (m, _) = merge(vec![ours, peers]).unwrap();
        let text = render_tables(&m, false);
        let line1 = text.lines().find(|l| l.contains("1 x 14336")).unwrap();
        assert!(line1.contains("0.80 !"), "{line1}");
        assert!(text.contains("1 and 4 tokens: no slower than the best peer: 0/1 met; missed:"));
    }

    #[test]
    fn plots_from_a_sample() {
        let (ours, peers) = sample();
        let (m, _) = merge(vec![ours, peers]).unwrap();
        let dir = std::env::temp_dir().join(format!("ferrofuse-plots-{}", std::process::id()));
        let n = write_plots(&m, &dir).unwrap();
        // per_call and graph charts of one shape.
        assert_eq!(n, 2);
        for name in [
            "gated_fwd_silu_split_bf16_14336_per_call",
            "gated_fwd_silu_split_bf16_14336_graph",
        ] {
            let svg = std::fs::read_to_string(dir.join(format!("{name}.svg"))).unwrap();
            assert!(svg.contains("ferrofuse") && svg.contains("copy 4240 GB/s"));
            let png = std::fs::read(dir.join(format!("{name}.png"))).unwrap();
            assert_eq!(&png[1..4], b"PNG");
        }
        let charts = charts(&m);
        let per_call = &charts
            .iter()
            .find(|(n, _)| n.ends_with("per_call"))
            .unwrap()
            .1;
        let names: Vec<&str> = per_call.series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            ["ferrofuse", "torch_eager", "torch_compile", "triton"]
        );
        assert_eq!(
            per_call.x_ticks,
            [1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0]
        );
        assert!(
            std::fs::read_to_string(dir.join("index.md"))
                .unwrap()
                .contains(".svg")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn kernel_prefixes_of_a_plan() {
        let plan = schema::Plan {
            commit: String::new(),
            device: 0,
            method: schema::Method::default(),
            configs: vec![schema::PlanConfig {
                op: "gated_fwd".into(),
                variant: "silu_split".into(),
                dtype: "bf16".into(),
                rows: 1,
                cols: 8,
                act: None,
                layout: None,
                norm: None,
                eps: None,
                bytes: 48,
                modes: vec![],
            }],
        };
        assert_eq!(
            kernel_prefixes(&plan).into_iter().collect::<Vec<_>>(),
            ["gated_fwd_bf16"]
        );
    }
}
