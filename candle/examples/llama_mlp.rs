//! One LLaMA-3-8B decoder MLP block with its pre-norm, in candle, run with candle's own ops
//! and with ferrofuse-candle on the same weights: outputs compared, the whole block timed both
//! ways (matmuls included) at 1, 16, 256 and 4096 tokens.
//!
//! ```text
//! h = x + residual; y = rms_norm(h) * w        candle: add, then candle_nn::ops::rms_norm
//!                                              ferrofuse: add_rms_norm (one kernel)
//! gate_up = y @ W_gate_up^T   ([tokens, 2 x 14336], cuBLAS in both)
//! a = silu(gate) * up                          candle: candle_nn::ops::swiglu (chunk, silu, mul)
//!                                              ferrofuse: swiglu_interleaved (one kernel)
//! out = a @ W_down^T          ([tokens, 4096], cuBLAS in both)
//! ```
//!
//! and the same with separate gate and up projections, as candle-transformers' LLaMA writes
//! it (`silu(x @ W_gate^T) * (x @ W_up^T)`, against `swiglu(gate, up)`).
//!
//! Timing: the `ferrofuse-bench` method (CUDA events on candle's stream, L2 flushed before each
//! call, median). `cargo run --release -p ferrofuse-candle --example llama_mlp [-- --json
//! FILE]`; without a CUDA driver it says so and exits 0.

use candle_core::{DType, Device, Module, Result, Tensor};
use ferrofuse_bench::gpu::{Budgets, Harness};
use ferrofuse_bench::stats::rel_l2_error;

const HIDDEN: usize = 4096;
const INTER: usize = 14336;
const EPS: f32 = 1e-5;
const TOKENS: [usize; 4] = [1, 16, 256, 4096];

struct Weights {
    norm: Tensor,
    gate_up: Tensor,
    gate: Tensor,
    up: Tensor,
    down: Tensor,
}

/// candle's own ops, fused gate/up projection.
fn candle_fused(w: &Weights, x: &Tensor, residual: &Tensor) -> Result<(Tensor, Tensor)> {
    let h = (x + residual)?;
    let y = candle_nn::ops::rms_norm(&h, &w.norm, EPS)?;
    let gate_up = y.matmul(&w.gate_up.t()?)?;
    let a = candle_nn::ops::swiglu(&gate_up)?;
    Ok((a.matmul(&w.down.t()?)?, h))
}

/// ferrofuse-candle, fused gate/up projection.
fn ferrofuse_fused(w: &Weights, x: &Tensor, residual: &Tensor) -> Result<(Tensor, Tensor)> {
    let (y, h) = ferrofuse_candle::add_rms_norm(x, residual, &w.norm, EPS)?;
    let gate_up = y.matmul(&w.gate_up.t()?)?;
    let a = ferrofuse_candle::swiglu_interleaved(&gate_up)?;
    Ok((a.matmul(&w.down.t()?)?, h))
}

/// candle's own ops, separate projections (candle-transformers' LLaMA MLP).
fn candle_split(w: &Weights, x: &Tensor, residual: &Tensor) -> Result<(Tensor, Tensor)> {
    let h = (x + residual)?;
    let y = candle_nn::ops::rms_norm(&h, &w.norm, EPS)?;
    let gate = candle_nn::Linear::new(w.gate.clone(), None).forward(&y)?;
    let up = candle_nn::Linear::new(w.up.clone(), None).forward(&y)?;
    let a = (candle_nn::ops::silu(&gate)? * up)?;
    Ok((a.matmul(&w.down.t()?)?, h))
}

/// ferrofuse-candle, separate projections.
fn ferrofuse_split(w: &Weights, x: &Tensor, residual: &Tensor) -> Result<(Tensor, Tensor)> {
    let (y, h) = ferrofuse_candle::add_rms_norm(x, residual, &w.norm, EPS)?;
    let gate = candle_nn::Linear::new(w.gate.clone(), None).forward(&y)?;
    let up = candle_nn::Linear::new(w.up.clone(), None).forward(&y)?;
    let a = ferrofuse_candle::swiglu(&gate, &up)?;
    Ok((a.matmul(&w.down.t()?)?, h))
}

type Block = fn(&Weights, &Tensor, &Tensor) -> Result<(Tensor, Tensor)>;

fn values(t: &Tensor) -> Result<Vec<f64>> {
    t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()
}

#[derive(Debug)]
struct Row {
    projections: &'static str,
    tokens: usize,
    candle_us: f64,
    ferrofuse_us: f64,
    rel_err_out: f64,
    rel_err_h: f64,
}

fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let json = std::env::args().skip_while(|a| a != "--json").nth(1);
    let ordinal = std::env::var("FERROFUSE_DEVICE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if let Some(why) = ferrofuse_candle::no_gpu_reason(ordinal)? {
        println!("llama_mlp: {why}; run it on a machine with an NVIDIA GPU");
        return Ok(());
    }
    let cuda = candle_core::CudaDevice::new_with_stream(ordinal)?;
    // One stream does all the work (the harness's L2 flush included).
    // SAFETY: nothing here uses another stream.
    unsafe { cuda.disable_event_tracking() };
    let dev = Device::Cuda(cuda.clone());
    let kernels = ferrofuse_candle::kernels(&cuda)?;
    let mut harness = Harness::on_stream(kernels, cuda.cuda_stream(), Budgets::default())?;

    let bf16 = |shape: &[usize], scale: f64| -> Result<Tensor> {
        (Tensor::randn(0f32, 1.0, shape, &dev)? * scale)?.to_dtype(DType::BF16)
    };
    let gate = bf16(&[INTER, HIDDEN], 0.02)?;
    let up = bf16(&[INTER, HIDDEN], 0.02)?;
    let weights = Weights {
        norm: (bf16(&[HIDDEN], 0.1)? + 1.0)?,
        gate_up: Tensor::cat(&[&gate, &up], 0)?,
        gate,
        up,
        down: bf16(&[HIDDEN, INTER], 0.02)?,
    };
    println!(
        "LLaMA-3-8B MLP block (H {HIDDEN}, I {INTER}, bf16) on {}: add + RMSNorm, gate/up \
         matmul, SwiGLU, down matmul",
        harness.context().name().unwrap_or_default()
    );
    let mut rows = Vec::new();
    let blocks: [(&str, Block, Block); 2] = [
        ("fused gate_up", candle_fused, ferrofuse_fused),
        ("separate gate, up", candle_split, ferrofuse_split),
    ];
    for (projections, theirs, ours) in blocks {
        for tokens in TOKENS {
            let x = bf16(&[tokens, HIDDEN], 1.0)?;
            let residual = bf16(&[tokens, HIDDEN], 1.0)?;
            let (out_c, h_c) = theirs(&weights, &x, &residual)?;
            let (out_f, h_f) = ours(&weights, &x, &residual)?;
            let rel_err_out = rel_l2_error(&values(&out_f)?, &values(&out_c)?);
            let rel_err_h = rel_l2_error(&values(&h_f)?, &values(&h_c)?);
            assert!(
                rel_err_out < 2e-2 && rel_err_h < 1e-2,
                "outputs differ: {rel_err_out} {rel_err_h}"
            );
            let candle_us = harness.per_call(&mut || {
                theirs(&weights, &x, &residual)
                    .map(drop)
                    .map_err(|e| e.to_string())
            })?;
            let ferrofuse_us = harness.per_call(&mut || {
                ours(&weights, &x, &residual)
                    .map(drop)
                    .map_err(|e| e.to_string())
            })?;
            rows.push(Row {
                projections,
                tokens,
                candle_us,
                ferrofuse_us,
                rel_err_out,
                rel_err_h,
            });
        }
    }
    println!();
    println!(
        "| projections | tokens | candle | ferrofuse-candle | speed-up | rel. L2 diff (out) |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    for r in &rows {
        println!(
            "| {} | {} | {:.1} µs | {:.1} µs | {:.2}x | {:.1e} |",
            r.projections,
            r.tokens,
            r.candle_us,
            r.ferrofuse_us,
            r.candle_us / r.ferrofuse_us,
            r.rel_err_out
        );
    }
    if let Some(path) = json {
        let list: Vec<_> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "projections": r.projections, "tokens": r.tokens,
                    "candle_us": r.candle_us, "ferrofuse_candle_us": r.ferrofuse_us,
                    "rel_l2_diff_out": r.rel_err_out, "rel_l2_diff_h": r.rel_err_h,
                })
            })
            .collect();
        let doc = serde_json::json!({
            "gpu": harness.context().name().unwrap_or_default(),
            "model": "LLaMA-3-8B MLP block (H 4096, I 14336), bf16",
            "method": "per call: CUDA events on candle's stream, L2 flushed before each call, median (ferrofuse-bench's per_call)",
            "rows": list,
        });
        std::fs::write(&path, serde_json::to_string_pretty(&doc)?)?;
        println!("written to {path}");
    }
    Ok(())
}
