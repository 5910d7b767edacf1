//! `ferrofuse-bench`: times the ferrofuse kernels on the GPU with Triton's `do_bench` method
//! (bench/README.md) and writes the results as JSON. Runs with no arguments (every built-in
//! model shape, bf16, forward, both modes where they apply); flags select a subset or give
//! shapes by hand (`--shapes 7x18944`).
//!
//! Exit codes: 0 all measured; 1 a configuration failed (a launch error or a wrong result; the
//! others are still measured and written); 2 bad arguments; 69 no CUDA driver or no device
//! (`--plan-out` and `--list` still work there).

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use ferrofuse::{Kernels, PTX_MODULES, PtxModule};
use ferrofuse_bench::gpu::{Budgets, Harness, L2_FLUSH_BYTES, device_info};
use ferrofuse_bench::schema::{
    IMPL_FERROFUSE, Method, OP_COPY, OP_EMPTY, Record, Report, gbs, pct_of,
};
use ferrofuse_bench::shapes::{
    Config, Dtype, Layout, Mode, ODD_SHAPES, Op, Selection, Shape, plan,
};
use ferrofuse_bench::{COMMIT, EXIT_NO_GPU, ops, plan_json, stats};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Parser, Debug)]
#[command(
    name = "ferrofuse-bench",
    version,
    about = "Time the ferrofuse kernels on the GPU against the device-to-device copy ceiling",
    after_help = "Exit codes: 0 ok, 1 a configuration failed, 2 usage, 69 no CUDA driver/device."
)]
struct Args {
    /// Write the results here (JSON, bench/README.md).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the plan (configurations, byte counts, method) here for `peers.py --plan`; works
    /// without a GPU.
    #[arg(long)]
    plan_out: Option<PathBuf>,
    /// Print the configurations and byte formulas, then exit (no GPU needed).
    #[arg(long)]
    list: bool,
    /// Models by key (llama3-8b, llama3-70b, qwen2-7b, mistral-7b, gemma2-9b, llama2-7b).
    #[arg(long, value_delimiter = ',')]
    models: Vec<String>,
    /// Token counts (rows); default 1,4,16,64,256,1024,4096,16384.
    #[arg(long, value_delimiter = ',')]
    tokens: Vec<usize>,
    /// Shapes instead of the models' (not with --models or --tokens): ROWSxCOLS, e.g.
    /// 7x18944,3000x11001; each op at ROWS tokens, COLS = I for the gated ops (SiLU), H for
    /// add+RMSNorm (plain RMSNorm).
    #[arg(long, value_delimiter = ',')]
    shapes: Vec<Shape>,
    /// Only the built-in shapes off the 16-byte grid (`ODD_SHAPES` in the schema crate: odd, 2
    /// and 4 mod 8, around powers of two, 1 to 16384 rows), as if given with --shapes. The
    /// default run measures them after the models' shapes.
    #[arg(long, conflicts_with_all = ["shapes", "no_odd_shapes"])]
    odd_shapes: bool,
    /// The default run without the shapes off the grid (the models' shapes only).
    #[arg(long)]
    no_odd_shapes: bool,
    /// Op families (gated, add_rmsnorm) or ops (gated_fwd, gated_bwd, add_rmsnorm_fwd, ...).
    #[arg(long, value_delimiter = ',')]
    ops: Vec<String>,
    /// Gated layouts: split, interleaved (the default: both); padded, offset (forward only).
    #[arg(long, value_delimiter = ',')]
    layouts: Vec<String>,
    /// Storage dtypes: bf16 (default), f16, f32.
    #[arg(long, value_delimiter = ',')]
    dtypes: Vec<String>,
    /// Also run the backward ops.
    #[arg(long)]
    backward: bool,
    /// Run only the backward ops.
    #[arg(long)]
    backward_only: bool,
    /// Timing modes: per_call (L2 flushed before each run), graph (CUDA-graph replay).
    #[arg(long, value_delimiter = ',')]
    modes: Vec<String>,
    /// Graph mode only for shapes with at most this many rows.
    #[arg(long, default_value_t = ferrofuse_bench::shapes::GRAPH_MAX_ROWS)]
    graph_max_rows: usize,
    /// per_call: warm-up budget in ms of GPU time (do_bench's `warmup`).
    #[arg(long, default_value_t = Budgets::default().warmup_ms)]
    warmup_ms: f64,
    /// per_call: timed budget in ms (do_bench's `rep`).
    #[arg(long, default_value_t = Budgets::default().rep_ms)]
    rep_ms: f64,
    /// graph: budget of the captured launches in ms (do_bench_cudagraph's `rep`).
    #[arg(long, default_value_t = Budgets::default().graph_rep_ms)]
    graph_rep_ms: f64,
    /// Size of the device-to-device copy that gives the ceiling, in MiB.
    #[arg(long, default_value_t = 2048)]
    copy_mib: usize,
    /// CUDA device ordinal (default: $FERROFUSE_DEVICE or 0).
    #[arg(long)]
    device: Option<usize>,
    /// A quick smoke run: short budgets, and unless told otherwise LLaMA-3-8B at tokens 1, 64,
    /// 4096.
    #[arg(long)]
    quick: bool,
    /// Launch without programmatic dependent launch (sm_90+; on by default), to see what it
    /// brings.
    #[arg(long)]
    no_pdl: bool,
    /// Run the add + RMSNorm forward's long rows one block per row where they would run on a
    /// thread-block cluster, and the backward's on its looped kernel (sm_90+; the same bits),
    /// to see what the split brings.
    #[arg(long)]
    no_cluster_split: bool,
    /// Run the rows the streamed kernels would take (sm_90+: the per-token FP8 gated forward's
    /// long rows, the add + RMSNorm forward's rows of 32 elements per thread) on the kernels
    /// that hold one row per block (the same bits), to see what the streaming brings.
    #[arg(long)]
    no_row_streaming: bool,
    /// Run every add + RMSNorm backward as two launches (the rows kernel, then the `dw`
    /// kernel), also the calls of few rows that take the one-launch kernel (the same bits).
    #[arg(long)]
    no_fused_backward: bool,
    /// Run the add + RMSNorm backward's 16-bit rows longer than 8192 that the cluster split
    /// takes in the tile passes (tile sums, then `dx`, then `dw`; no clusters), off by default.
    #[arg(long)]
    tile_passes: bool,
    /// Run the add + RMSNorm forward's one-tile split rows on the entries compiled for two
    /// blocks per multiprocessor instead of three, and the split of rows in clusters of 8
    /// blocks or more up to three eighths as many rows as multiprocessors instead of half
    /// (sm_90+; the same bits).
    #[arg(long)]
    no_narrow_split: bool,
    /// Run the add + RMSNorm forward's rows of 9-16 tiles without clusters of 16 blocks: two
    /// tiles per block in clusters of at most 8 (storage dtype), the looped kernels (FP8
    /// outputs); the backward's rows of 65537-131072 elements on the looped kernel of the
    /// split's tiles (sm_90+; the same bits).
    #[arg(long)]
    no_wide_clusters: bool,
    /// Run the add + RMSNorm forward's looped rows (storage-dtype and FP8 outputs) on the
    /// kernel built for two rows per multiprocessor in every call, also where a call has at most
    /// one row per two multiprocessors and the loads-ahead form would run (the same bits).
    #[arg(long)]
    no_loop_ahead: bool,
    /// Run the device's own module compiled from its PTX by the driver instead of the prebuilt
    /// SASS (the same kernels; to compare the driver's compilation with the shipped one).
    #[arg(long, conflicts_with = "module")]
    from_ptx: bool,
    /// Run another shipped module than the device's own: `sm_80` on a Hopper GPU runs the code
    /// Ampere and Ada GPUs run (compiled from its PTX by the driver; no clusters, bulk copies
    /// or programmatic dependent launch).
    #[arg(long)]
    module: Option<String>,
}

fn selection(args: &Args) -> Result<Selection, String> {
    let layouts = args
        .layouts
        .iter()
        .map(|l| {
            Layout::parse(l).ok_or(format!(
                "unknown layout {l:?}: split, interleaved, padded or offset"
            ))
        })
        .collect::<Result<_, _>>()?;
    let dtypes = args
        .dtypes
        .iter()
        .map(|d| Dtype::parse(d).ok_or(format!("unknown dtype {d:?}: bf16, f16 or f32")))
        .collect::<Result<_, _>>()?;
    let modes = args
        .modes
        .iter()
        .map(|m| Mode::parse(m).ok_or(format!("unknown mode {m:?}: per_call or graph")))
        .collect::<Result<_, _>>()?;
    let mut sel = Selection {
        models: args.models.clone(),
        tokens: args.tokens.clone(),
        shapes: if args.odd_shapes {
            ODD_SHAPES.to_vec()
        } else {
            args.shapes.clone()
        },
        odd_shapes: !args.no_odd_shapes,
        ops: args.ops.clone(),
        layouts,
        dtypes,
        backward: args.backward,
        backward_only: args.backward_only,
        modes,
        graph_max_rows: args.graph_max_rows,
    };
    if args.quick && sel.shapes.is_empty() {
        if sel.models.is_empty() {
            sel.models = vec!["llama3-8b".into()];
        }
        if sel.tokens.is_empty() {
            sel.tokens = vec![1, 64, 4096];
        }
    }
    Ok(sel)
}

fn budgets(args: &Args) -> Budgets {
    if args.quick {
        return Budgets {
            warmup_ms: 5.0,
            rep_ms: 20.0,
            graph_rep_ms: 5.0,
        };
    }
    Budgets {
        warmup_ms: args.warmup_ms,
        rep_ms: args.rep_ms,
        graph_rep_ms: args.graph_rep_ms,
    }
}

/// How the run measured; `kernels` with the seconds their loading took, for a run that
/// loaded them.
fn method(
    b: &Budgets,
    copy_bytes: usize,
    elapsed_s: f64,
    kernels: Option<(&Kernels, f64)>,
) -> Method {
    Method {
        tool: format!("ferrofuse-bench {}", env!("CARGO_PKG_VERSION")),
        warmup_ms: b.warmup_ms,
        rep_ms: b.rep_ms,
        graph_rep_ms: b.graph_rep_ms,
        l2_flush_bytes: L2_FLUSH_BYTES as u64,
        copy_bytes: copy_bytes as u64,
        elapsed_s,
        programmatic_launch: kernels.map(|(k, _)| k.programmatic_launch()),
        loaded_code: kernels.map(|(k, _)| k.loaded_code().name().to_string()),
        module: kernels.map(|(k, _)| k.ptx().arch.to_string()),
        load_s: kernels.map(|(_, s)| s),
        args: kernels.map(|_| std::env::args().skip(1).collect()),
    }
}

fn print_formulas(configs: &[Config]) {
    println!("bytes counted (minimal traffic; s = dtype size, I = intermediate, H = hidden):");
    for op in Op::ALL {
        if configs.iter().any(|c| c.op == op) {
            println!("  {:<16} {}", op.name(), op.bytes_formula());
        }
    }
    println!("  {:<16} read + write: 2 * bytes copied", OP_COPY);
}

fn write_json<T: serde::Serialize>(path: &PathBuf, value: &T) -> Result<(), String> {
    let text = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    std::fs::write(path, text + "\n").map_err(|e| format!("writing {}: {e}", path.display()))
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ferrofuse-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<ExitCode, String> {
    let started = Instant::now();
    let sel = match selection(args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ferrofuse-bench: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    let configs = match plan(&sel) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ferrofuse-bench: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    let budgets = budgets(args);
    let copy_bytes = args.copy_mib << 20;
    let device = args.device.unwrap_or_else(|| {
        std::env::var("FERROFUSE_DEVICE")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    });
    if let Some(path) = &args.plan_out {
        write_json(
            path,
            &plan_json(&configs, method(&budgets, copy_bytes, 0.0, None), device),
        )?;
    }
    if args.list {
        for c in &configs {
            let modes: Vec<&str> = c.modes.iter().map(|m| m.name()).collect();
            println!(
                "{:<48} {:>14} bytes  {:<18} {}",
                c.label(),
                c.bytes(),
                modes.join(","),
                c.models().join(", ")
            );
        }
        let (ours, peers) = ferrofuse_bench::estimated_seconds(&configs, &budgets);
        println!(
            "{} configurations; expected wall time on an H200: ~{ours:.0} s here, ~{peers:.0} s for peers.py",
            configs.len()
        );
        print_formulas(&configs);
        return Ok(ExitCode::SUCCESS);
    }

    if !ferrofuse::driver_available() {
        println!(
            "ferrofuse-bench: no CUDA driver on this machine (libcuda could not be loaded): nothing measured"
        );
        return Ok(ExitCode::from(EXIT_NO_GPU));
    }
    match ferrofuse::device_count() {
        Ok(n) if n > device => {}
        Ok(n) => {
            println!(
                "ferrofuse-bench: no CUDA device {device} (the driver reports {n}): nothing measured"
            );
            return Ok(ExitCode::from(EXIT_NO_GPU));
        }
        Err(e) => {
            println!("ferrofuse-bench: {e}: nothing measured");
            return Ok(ExitCode::from(EXIT_NO_GPU));
        }
    }

    let date = stats::iso8601_utc(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
    );
    let loading = Instant::now();
    let module = match args.module.as_deref() {
        Some(arch) => Some(PtxModule::by_arch(arch).ok_or_else(|| {
            let archs: Vec<_> = PTX_MODULES.iter().map(|m| m.arch).collect();
            format!(
                "--module {arch}: the shipped modules are {}",
                archs.join(", ")
            )
        })?),
        None => None,
    };
    let mut h = Harness::new(device, module, args.from_ptx, budgets)?;
    let load_s = loading.elapsed().as_secs_f64();
    if args.no_pdl {
        h.kernels.set_programmatic_launch(false);
    }
    if args.no_row_streaming {
        h.kernels.set_row_streaming(false);
    }
    if args.no_cluster_split {
        h.kernels.set_cluster_split(false);
    }
    if args.no_fused_backward {
        h.kernels.set_fused_backward(false);
    }
    if args.tile_passes {
        h.kernels.set_tile_passes(true);
    }
    if args.no_narrow_split {
        h.kernels.set_narrow_split(false);
    }
    if args.no_wide_clusters {
        h.kernels.set_wide_clusters(false);
    }
    if args.no_loop_ahead {
        h.kernels.set_loop_ahead(false);
    }
    let (gpu, driver) = device_info(h.context());
    println!(
        "ferrofuse-bench {} ({COMMIT}) on {gpu}, driver {driver}; the {} module's {}, loaded \
         in {load_s:.2} s; programmatic dependent launch {}",
        env!("CARGO_PKG_VERSION"),
        h.kernels.ptx().arch,
        h.kernels.loaded_code().name(),
        if h.kernels.programmatic_launch() {
            "on"
        } else {
            "off"
        }
    );
    println!(
        "{} configurations ({sel}); per_call: warm-up {} ms, {} ms timed, L2 flushed ({} MiB) before each run; graph: {} ms of launches per graph, median of {} replays",
        configs.len(),
        budgets.warmup_ms,
        budgets.rep_ms,
        L2_FLUSH_BYTES >> 20,
        budgets.graph_rep_ms,
        stats::GRAPH_REPLAYS
    );
    print_formulas(&configs);
    let (expected, _) = ferrofuse_bench::estimated_seconds(&configs, &budgets);
    println!("expected: ~{expected:.0} s");

    let bar = ProgressBar::new(configs.len() as u64 + 3);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );

    // The ceiling and the floor, measured with the same method as the kernels.
    bar.set_message(format!("device-to-device copy, {} MiB", args.copy_mib));
    let copy_us = h.copy_us(copy_bytes)?;
    let ceiling = gbs(2 * copy_bytes as u64, copy_us);
    bar.inc(1);
    let mut results = vec![Record {
        op: OP_COPY.into(),
        variant: "dtod".into(),
        dtype: "u8".into(),
        rows: 1,
        cols: copy_bytes,
        imp: IMPL_FERROFUSE.into(),
        mode: Mode::PerCall.name().into(),
        median_us: copy_us,
        gbs: ceiling,
        pct_of_ceiling: 100.0,
    }];
    for mode in [Mode::PerCall, Mode::Graph] {
        bar.set_message(format!("empty kernel, {}", mode.name()));
        let us = h.empty_us(mode == Mode::Graph)?;
        results.push(Record {
            op: OP_EMPTY.into(),
            variant: "launch_floor".into(),
            dtype: "-".into(),
            rows: 0,
            cols: 0,
            imp: IMPL_FERROFUSE.into(),
            mode: mode.name().into(),
            median_us: us,
            gbs: 0.0,
            pct_of_ceiling: 0.0,
        });
        bar.inc(1);
    }

    // Groups share operands: (op, variant, dtype, cols), rows ascending.
    let mut groups: BTreeMap<_, Vec<Config>> = BTreeMap::new();
    for c in &configs {
        groups
            .entry((c.op, c.variant, c.dtype, c.cols))
            .or_default()
            .push(c.clone());
    }
    let mut failures = Vec::new();
    let mut data = ops::Data::default();
    // Without a terminal (a log, a remote runner) the bar is hidden: print a line per group.
    let tty = std::io::stderr().is_terminal();
    for group in groups.values() {
        bar.set_message(group[0].label());
        if !tty {
            eprintln!(
                "[{}/{}] {:.0} s: {} (rows {})",
                bar.position(),
                bar.length().unwrap_or(0),
                started.elapsed().as_secs_f64(),
                group[0].label(),
                group
                    .iter()
                    .map(|c| c.rows.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            );
        }
        let mut done = |cfg: &Config, r: Result<ops::Timings, String>| {
            match r {
                Ok(timings) => {
                    for (mode, us) in timings {
                        let g = gbs(cfg.bytes(), us);
                        results.push(Record {
                            op: cfg.op.name().into(),
                            variant: cfg.variant.name(),
                            dtype: cfg.dtype.name().into(),
                            rows: cfg.rows,
                            cols: cfg.cols,
                            imp: IMPL_FERROFUSE.into(),
                            mode: mode.name().into(),
                            median_us: us,
                            gbs: g,
                            pct_of_ceiling: pct_of(g, ceiling),
                        });
                    }
                }
                Err(e) => {
                    bar.println(format!("FAILED {e}"));
                    failures.push(e);
                }
            }
            bar.inc(1);
        };
        if let Err(e) = ops::run_group(&mut h, &mut data, group, &mut done) {
            // The group could not even be set up (allocation): count its configs as failed.
            bar.println(format!("FAILED {}: {e}", group[0].label()));
            for c in group {
                failures.push(format!("{}: {e}", c.label()));
            }
            bar.inc(group.len() as u64);
        }
    }
    bar.finish_and_clear();

    let elapsed = started.elapsed().as_secs_f64();
    let report = Report {
        gpu,
        driver,
        date,
        commit: COMMIT.into(),
        copy_ceiling_gbs: ceiling,
        device: Some(device),
        results,
        methods: vec![method(
            &budgets,
            copy_bytes,
            elapsed,
            Some((&h.kernels, load_s)),
        )],
    };
    print_summary(&report);
    if let Some(path) = &args.json {
        write_json(path, &report)?;
        println!("wrote {}", path.display());
    }
    println!("elapsed {elapsed:.1} s");
    if !failures.is_empty() {
        println!("{} configuration(s) failed:", failures.len());
        for f in &failures {
            println!("  {f}");
        }
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_summary(report: &Report) {
    println!(
        "copy ceiling {:.0} GB/s (device-to-device, bytes read + written)",
        report.copy_ceiling_gbs
    );
    println!(
        "{:<16} {:<22} {:<5} {:>6} {:>6} {:<8} {:>10} {:>8} {:>6}",
        "op", "variant", "dtype", "rows", "cols", "mode", "median us", "GB/s", "%ceil"
    );
    for r in &report.results {
        println!(
            "{:<16} {:<22} {:<5} {:>6} {:>6} {:<8} {:>10.2} {:>8.0} {:>6.1}",
            r.op, r.variant, r.dtype, r.rows, r.cols, r.mode, r.median_us, r.gbs, r.pct_of_ceiling
        );
    }
}
