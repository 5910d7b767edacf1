//! The candle peer of the benchmark: candle's own ops on the configurations of a
//! `ferrofuse-bench` plan, timed with the benchmark's method, written as benchmark JSON with
//! `impl: "candle"` (merged by `cargo xtask bench --merge` / `ferrofuse-report`).
//!
//! What a candle user runs today for each op (bf16, candle 0.11):
//! - `gated_fwd`, split: `(a.silu()? * &b)?` (GeGLU-tanh: `a.gelu()`, candle's tanh GELU);
//! - `gated_fwd`, interleaved: `candle_nn::ops::swiglu(&gate_up)` (`chunk`, then silu and mul
//!   on the strided halves); GeGLU-tanh the same with `gelu`;
//! - `add_rmsnorm_fwd`: `candle_nn::ops::rms_norm(&(&x + &residual)?, &w, eps)` (two kernels;
//!   `h` is the sum); Gemma's `(1 + w)` is formed once outside the timed call.
//!
//! Timing: `Harness::per_call` (CUDA events, L2 flushed before each call, median) and, where
//! the plan asks for it, `Harness::graph` (graph replay of back-to-back calls), both on
//! candle's stream. Graphs are captured under candle's `enable_cuda_graph_htod_cache` (its
//! strided kernels copy their layout to the device on every call; without the cache the
//! capture of the interleaved layout crashed in candle 0.11.1), and those of the interleaved
//! layout run last. A configuration that fails is reported and left out.
//!
//! `cargo run --release -p ferrofuse-candle --example candle_peer -- --plan PLAN --json OUT`
//! (`ferrofuse-bench --plan-out PLAN` writes the plan); in a gpu-bundle, `run.sh bench` runs it
//! after `ferrofuse-bench`.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use candle_core::{D, DType, Device, Result, Tensor};
use ferrofuse_bench::gpu::{Budgets, Harness, device_info};
use ferrofuse_bench::schema::{self, IMPL_CANDLE, Method, Plan, PlanConfig, Record, Report};
use ferrofuse_bench::stats::{iso8601_utc, rel_l2_error};

/// The call to time: enqueues candle's ops for one configuration.
type Call = Box<dyn Fn() -> Result<Tensor>>;

/// candle's ops for `c`, and ferrofuse-candle's for the same inputs (a sanity check of the
/// candle output, on the smaller shapes).
fn calls(c: &PlanConfig, dev: &Device) -> Result<(Call, Call)> {
    let dtype = match c.dtype.as_str() {
        "bf16" => DType::BF16,
        "f16" => DType::F16,
        "f32" => DType::F32,
        d => candle_core::bail!("dtype {d}"),
    };
    let randn = |shape: (usize, usize)| -> Result<Tensor> {
        Tensor::randn(0f32, 1.0, shape, dev)?.to_dtype(dtype)
    };
    let (rows, cols) = (c.rows, c.cols);
    match c.op.as_str() {
        "gated_fwd" => {
            let tanh = c.act.as_deref() == Some("gelu_tanh");
            let act = move |t: &Tensor| if tanh { t.gelu() } else { t.silu() };
            let ours_act = if tanh {
                ferrofuse::Activation::GeluTanh
            } else {
                ferrofuse::Activation::Silu
            };
            if c.layout.as_deref() == Some("interleaved") {
                let x = randn((rows, 2 * cols))?;
                let x2 = x.clone();
                let theirs: Call = Box::new(move || {
                    let halves = x.chunk(2, D::Minus1)?;
                    act(&halves[0])? * &halves[1]
                });
                let ours: Call =
                    Box::new(move || ferrofuse_candle::gated_interleaved(&x2, ours_act));
                Ok((theirs, ours))
            } else {
                let (a, b) = (randn((rows, cols))?, randn((rows, cols))?);
                let (a2, b2) = (a.clone(), b.clone());
                let theirs: Call = Box::new(move || act(&a)? * &b);
                let ours: Call = Box::new(move || ferrofuse_candle::gated(&a2, &b2, ours_act));
                Ok((theirs, ours))
            }
        }
        "add_rmsnorm_fwd" => {
            let eps = c.eps.unwrap_or(1e-6) as f32;
            let gemma = c.norm.as_deref() == Some("gemma_rms");
            let (x, r) = (randn((rows, cols))?, randn((rows, cols))?);
            let w = Tensor::randn(0f32, 0.1, cols, dev)?;
            // Weights near 1; for Gemma candle gets `1 + w` formed once, ferrofuse `w`.
            let w_theirs = (&w + 1.0)?.to_dtype(dtype)?;
            let w_ours = if gemma {
                w.to_dtype(dtype)?
            } else {
                w_theirs.clone()
            };
            let opts = ferrofuse::RmsNormOptions::new(eps).with_gemma(gemma);
            let (x2, r2) = (x.clone(), r.clone());
            let theirs: Call =
                Box::new(move || candle_nn::ops::rms_norm(&(&x + &r)?, &w_theirs, eps));
            let ours: Call = Box::new(move || {
                ferrofuse_candle::add_rms_norm_with(&x2, &r2, &w_ours, &opts).map(|(y, _)| y)
            });
            Ok((theirs, ours))
        }
        op => candle_core::bail!("the candle peer does not measure {op}"),
    }
}

fn arg(name: &str) -> Option<String> {
    std::env::args().skip_while(|a| a != name).nth(1)
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(code) => std::process::ExitCode::from(code),
        Err(e) => {
            eprintln!("candle_peer: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> std::result::Result<u8, Box<dyn std::error::Error>> {
    let (Some(plan), Some(out)) = (arg("--plan"), arg("--json")) else {
        eprintln!(
            "usage: candle_peer --plan PLAN --json OUT (PLAN from ferrofuse-bench --plan-out)"
        );
        return Ok(2);
    };
    let plan: Plan = serde_json::from_str(&std::fs::read_to_string(&plan)?)?;
    if let Some(why) = ferrofuse_candle::no_gpu_reason(plan.device)? {
        eprintln!("candle_peer: {why}");
        return Ok(schema::EXIT_NO_GPU);
    }
    let started = Instant::now();
    let date = iso8601_utc(SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs());
    let cuda = candle_core::CudaDevice::new_with_stream(plan.device)?;
    // One stream does all the work; graph capture must not wait on events of other streams.
    // SAFETY: nothing here uses another stream.
    unsafe { cuda.disable_event_tracking() };
    let dev = Device::Cuda(cuda.clone());
    let kernels = ferrofuse_candle::kernels(&cuda)?;
    let budgets = Budgets {
        warmup_ms: plan.method.warmup_ms,
        rep_ms: plan.method.rep_ms,
        graph_rep_ms: plan.method.graph_rep_ms,
    };
    let mut h = Harness::on_stream(kernels, cuda.cuda_stream(), budgets)?;
    let (gpu, driver) = device_info(h.context());
    let copy_bytes = plan.method.copy_bytes as usize;
    let copy_us = h.copy_us(copy_bytes)?;
    let ceiling = schema::gbs(2 * copy_bytes as u64, copy_us);
    println!(
        "candle peer on {gpu}: copy ceiling {ceiling:.0} GB/s; {} configurations",
        plan.configs.len()
    );
    let mut report = Report {
        gpu,
        driver,
        date,
        commit: plan.commit.clone(),
        copy_ceiling_gbs: ceiling,
        device: Some(plan.device),
        results: Vec::new(),
        methods: vec![Method {
            tool: format!(
                "ferrofuse-candle candle_peer {} (candle-core 0.11.1, candle-nn 0.11.1)",
                env!("CARGO_PKG_VERSION")
            ),
            elapsed_s: 0.0,
            programmatic_launch: None,
            loaded_code: None,
            module: None,
            load_s: None,
            args: None,
            ..plan.method.clone()
        }],
    };
    let mut failed = Vec::new();
    // Graph captures of candle's strided ops (the interleaved layout) last: should one fail
    // badly, everything else is already written.
    let risky =
        |c: &PlanConfig, mode: &str| mode == "graph" && c.layout.as_deref() == Some("interleaved");
    let mut jobs: Vec<(usize, &str)> = plan
        .configs
        .iter()
        .enumerate()
        .flat_map(|(i, c)| c.modes.iter().map(move |m| (i, m.as_str())))
        .collect();
    jobs.sort_by_key(|&(i, m)| risky(&plan.configs[i], m));
    let mut checked = vec![false; plan.configs.len()];
    let mut current: Option<(usize, Call)> = None;
    for (i, mode) in jobs {
        let c = &plan.configs[i];
        let name = format!("{} {} {}x{}", c.op, c.variant, c.rows, c.cols);
        if current.as_ref().map(|(j, _)| *j) != Some(i) {
            current = None;
            let (theirs, ours) = match calls(c, &dev) {
                Ok(p) => p,
                Err(e) => {
                    failed.push(format!("{name}: {e}"));
                    continue;
                }
            };
            if !checked[i] && c.rows * c.cols <= 1 << 22 {
                let t = theirs()?
                    .to_dtype(DType::F64)?
                    .flatten_all()?
                    .to_vec1::<f64>()?;
                let o = ours()?
                    .to_dtype(DType::F64)?
                    .flatten_all()?
                    .to_vec1::<f64>()?;
                let err = rel_l2_error(&t, &o);
                if err.is_nan() || err >= 2e-2 {
                    failed.push(format!(
                        "{name}: candle and ferrofuse-candle differ (relative L2 {err:.2e})"
                    ));
                    continue;
                }
            }
            checked[i] = true;
            current = Some((i, theirs));
        }
        let Some((_, theirs)) = &current else {
            continue;
        };
        let mut call = || theirs().map(drop).map_err(|e| e.to_string());
        let us = match mode {
            "per_call" => h.per_call(&mut call),
            "graph" => {
                // candle's way into CUDA graphs: the layouts its strided kernels copy to the
                // device on every call are cached in device memory while this guard lives, so
                // the captured copies do not read host memory freed after the capture.
                let _cache = cuda.enable_cuda_graph_htod_cache();
                h.graph(&mut call)
            }
            m => Err(format!("unknown mode {m}")),
        };
        match us {
            Ok(us) => {
                let gbs = schema::gbs(c.bytes, us);
                println!(
                    "{:<16} {:<22} {:>6} x {:<6} {:<8} candle {:>9.2} us {:>7.0} GB/s",
                    c.op, c.variant, c.rows, c.cols, mode, us, gbs
                );
                report.results.push(Record {
                    op: c.op.clone(),
                    variant: c.variant.clone(),
                    dtype: c.dtype.clone(),
                    rows: c.rows,
                    cols: c.cols,
                    imp: IMPL_CANDLE.into(),
                    mode: mode.into(),
                    median_us: us,
                    gbs,
                    pct_of_ceiling: schema::pct_of(gbs, ceiling),
                });
            }
            Err(e) => failed.push(format!("{name} {mode}: {e}")),
        }
        report.methods[0].elapsed_s = started.elapsed().as_secs_f64();
        std::fs::write(&out, serde_json::to_string_pretty(&report)?)?;
    }
    println!(
        "candle peer: {} results in {out}, {:.0} s",
        report.results.len(),
        started.elapsed().as_secs_f64()
    );
    if failed.is_empty() {
        return Ok(0);
    }
    println!("not measured ({}):", failed.len());
    for f in &failed {
        println!("  {f}");
    }
    Ok(1)
}
