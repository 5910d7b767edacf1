//! Launching ferrofuse on a stream and on memory that another library owns.
//!
//! An engine built around its own CUDA code (a C++ runtime, PyTorch through FFI, another cudarc
//! user) holds a raw `CUstream` and raw device pointers, not cudarc's typed buffers. ferrofuse
//! runs on them in three steps:
//!
//! 1. **The context.** `CudaContext::new(ordinal)` retains the device's primary context, the
//!    one the CUDA runtime uses, so it is the context of PyTorch's and most C++ code's memory.
//!    `Kernels::for_context` loads the PTX into it once.
//! 2. **The stream.** `CudaContext::wrap_borrowed_stream` wraps the foreign `CUstream` without
//!    taking ownership: dropping the wrapper does not destroy the stream.
//! 3. **The memory.** A `MatDesc` describes each device pointer (address, length, dtype, shape,
//!    strides), and the `unsafe fn *_raw` entry points run the same validation as the safe API
//!    (shapes, dtypes, strides, alignment, aliasing) before their one launch on that stream:
//!    no allocation, no synchronisation, nothing recorded on the stream.
//!
//! Run with `cargo run --release -p ferrofuse --example foreign_stream`; without a GPU it says
//! why and exits successfully.

use std::error::Error;

use ferrofuse::cudarc::driver::{CudaContext, DriverError, result, sys};
use ferrofuse::half::bf16;
use ferrofuse::{Activation, DType, Kernels, MatDesc, reference};

/// What the other library owns: a stream and two device buffers it allocated itself.
struct ForeignSide {
    stream: sys::CUstream,
    gate_up: sys::CUdeviceptr,
    y: sys::CUdeviceptr,
}

impl ForeignSide {
    /// Allocates and fills the buffers the way C++ code would, with the driver API directly.
    fn new(ctx: &CudaContext, gate_up: &[bf16], y_len: usize) -> Result<Self, DriverError> {
        ctx.bind_to_thread()?;
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking)?;
        // SAFETY: plain allocations and a synchronous copy of `gate_up.len()` elements into
        // the first one, which holds exactly that many.
        unsafe {
            let dev_gate_up = result::malloc_sync(std::mem::size_of_val(gate_up))?;
            let y = result::malloc_sync(y_len * size_of::<bf16>())?;
            result::memcpy_htod_sync(dev_gate_up, gate_up)?;
            Ok(Self {
                stream,
                gate_up: dev_gate_up,
                y,
            })
        }
    }
}

impl Drop for ForeignSide {
    fn drop(&mut self) {
        // SAFETY: the stream is drained first; nothing uses these handles afterwards.
        unsafe {
            let _ = result::stream::synchronize(self.stream);
            let _ = result::free_sync(self.gate_up);
            let _ = result::free_sync(self.y);
            let _ = result::stream::destroy(self.stream);
        }
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    match ferrofuse::device_count() {
        Ok(n) if n > 0 => {}
        Ok(_) => return skip("the CUDA driver reports no device"),
        Err(e) => return skip(&e.to_string()),
    }
    let ctx = CudaContext::new(0)?;

    // The other library's side: an interleaved [gate | up] output of a GEMM, and room for y.
    let (rows, inter) = (16usize, 14336usize);
    let gate_up: Vec<bf16> = (0..rows * 2 * inter)
        .map(|i| bf16::from_f32(((i * 7919) % 2001) as f32 / 250.0 - 4.0))
        .collect();
    let foreign = ForeignSide::new(&ctx, &gate_up, rows * inter)?;

    // ferrofuse's side: its kernels in the same context, its launch on the foreign stream.
    let kernels = Kernels::for_context(&ctx)?;
    // SAFETY: the stream belongs to `ctx` and outlives `stream` (ForeignSide drops last).
    let stream = unsafe { ctx.wrap_borrowed_stream(foreign.stream) };
    let x = MatDesc::contiguous(foreign.gate_up, gate_up.len(), DType::BF16, rows, 2 * inter);
    let (a, b) = x.interleaved_halves()?;
    let y = MatDesc::contiguous(foreign.y, rows * inter, DType::BF16, rows, inter);

    // A wrong description is answered before anything is launched or written.
    let wrong = MatDesc {
        dtype: DType::F16,
        ..y
    };
    // SAFETY: as below; this call is rejected by validation and launches nothing.
    let rejected = unsafe { kernels.gated_raw(&stream, Activation::Silu, &a, &b, &wrong) };
    println!("y described as f16: {}", rejected.unwrap_err());

    // SAFETY: each description is true (addresses in this context, lengths allocated above),
    // the buffers stay alive until the stream is synchronised below, and nothing else writes
    // them meanwhile.
    unsafe { kernels.gated_raw(&stream, Activation::Silu, &a, &b, &y)? };

    // Back on the other library's side: it synchronises its own stream when it needs y.
    let mut out = vec![bf16::ZERO; rows * inter];
    // SAFETY: the stream is ours to synchronise; `out` holds `rows * inter` elements.
    unsafe {
        result::stream::synchronize(foreign.stream)?;
        result::memcpy_dtoh_sync(&mut out, foreign.y)?;
    }

    let mut worst = 0.0f64;
    for r in 0..rows {
        let row = &gate_up[r * 2 * inter..(r + 1) * 2 * inter];
        let (g, u) = row.split_at(inter);
        let g: Vec<f64> = g.iter().map(|v| v.to_f64()).collect();
        let u: Vec<f64> = u.iter().map(|v| v.to_f64()).collect();
        let expected = reference::gated_forward(Activation::Silu, &g, &u);
        for (got, want) in out[r * inter..(r + 1) * inter].iter().zip(expected) {
            let err = (got.to_f64() - want).abs() / want.abs().max(1e-3);
            worst = worst.max(err);
        }
    }
    println!(
        "SwiGLU {rows} x {inter} bf16 on a borrowed stream: worst relative error {worst:.2e} \
         against the f64 reference"
    );
    // bf16 keeps 8 significant bits: one rounding of the f32 result is at most 2^-8 relative.
    if worst > 1.0 / 128.0 {
        return Err(format!("result off by {worst:.2e}").into());
    }
    Ok(())
}

fn skip(why: &str) -> Result<(), Box<dyn Error>> {
    println!("foreign_stream: skipped, {why}");
    Ok(())
}
