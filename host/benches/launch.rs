//! Host-side launch overhead, with criterion (`cargo bench -p ferrofuse --bench launch`).
//!
//! - `plan/*`: validation and launch planning alone (`plan_*`: shapes, dtypes, strides, sizes,
//!   alignment, aliasing, grid), no GPU needed (which is also why the PTX plans are not
//!   timed against real occupancy: a fixed [`GridLimits`] stands in);
//! - `launch/*`: the safe entry points (validation + one `cuLaunchKernel`) on a real device,
//!   with no GPU work awaited inside the timed region: launches are timed in batches of
//!   [`BATCH`] and the stream is synchronized between batches, untimed, so the launch queue
//!   never fills (a full queue would time the GPU instead). Skipped, with a message, when
//!   there is no CUDA driver or device.
//!
//! GPU kernel times are the benchmark's job (`cargo xtask bench`), not this file's.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use ferrofuse::gated::{plan_gated_backward, plan_gated_forward};
use ferrofuse::half::bf16;
use ferrofuse::norm::{RmsNormFwdDescs, plan_rmsnorm_forward};
use ferrofuse::{
    Activation, DType, GridLimits, Kernels, Mat, MatDesc, MatMut, Placement, RmsNormOptions,
};

/// Launches per timed batch (well under the driver's launch queue depth).
const BATCH: u64 = 256;

/// A plausible H200: 132 multiprocessors, 8 resident blocks each.
fn limits() -> GridLimits {
    GridLimits::uniform(132, 8)
}

fn plan_benches(c: &mut Criterion) {
    let (rows, inter) = (16, 14336);
    let n = rows * inter;
    // Fake, distinct, aligned device addresses: planning never dereferences them.
    let a = MatDesc::contiguous(0x1000_0000, n, DType::BF16, rows, inter);
    let b = MatDesc::contiguous(0x2000_0000, n, DType::BF16, rows, inter);
    let y = MatDesc::contiguous(0x3000_0000, n, DType::BF16, rows, inter);
    let x = MatDesc::contiguous(0x4000_0000, 2 * n, DType::BF16, rows, 2 * inter);
    let dy = MatDesc::contiguous(0x5000_0000, n, DType::BF16, rows, inter);
    let db = MatDesc::contiguous(0x6000_0000, n, DType::BF16, rows, inter);
    let limits = limits();

    c.bench_function("plan/gated_fwd_split_bf16_16x14336", |bench| {
        bench.iter(|| {
            plan_gated_forward(
                Activation::Silu,
                black_box(&a),
                black_box(&b),
                black_box(&y),
                &limits,
            )
        })
    });
    c.bench_function("plan/gated_fwd_interleaved_bf16_16x14336", |bench| {
        bench.iter(|| {
            let (gate, up) = black_box(&x).interleaved_halves()?;
            plan_gated_forward(Activation::Silu, &gate, &up, &y, &limits)
        })
    });
    c.bench_function("plan/gated_bwd_split_bf16_16x14336", |bench| {
        bench.iter(|| {
            plan_gated_backward(
                Activation::Silu,
                black_box(&a),
                black_box(&b),
                black_box(&dy),
                black_box(&y),
                black_box(&db),
                &limits,
            )
        })
    });

    let (rows, hidden) = (16, 4096);
    let m = rows * hidden;
    let fwd = RmsNormFwdDescs {
        x: MatDesc::contiguous(0x1000_0000, m, DType::BF16, rows, hidden),
        residual: Some(MatDesc::contiguous(
            0x2000_0000,
            m,
            DType::BF16,
            rows,
            hidden,
        )),
        weight: MatDesc::contiguous(0x3000_0000, hidden, DType::BF16, 1, hidden),
        y: MatDesc::contiguous(0x4000_0000, m, DType::BF16, rows, hidden),
        h: Some(MatDesc::contiguous(
            0x5000_0000,
            m,
            DType::BF16,
            rows,
            hidden,
        )),
        rstd: None,
    };
    let opts = RmsNormOptions::new(1e-6);
    c.bench_function("plan/add_rmsnorm_bf16_16x4096", |bench| {
        bench.iter(|| plan_rmsnorm_forward(black_box(&fwd), black_box(&opts), &limits))
    });
}

/// Times `launch` in batches of [`BATCH`], synchronizing (untimed) between batches.
fn time_launches(
    iters: u64,
    stream: &ferrofuse::cudarc::driver::CudaStream,
    mut launch: impl FnMut(),
) -> Duration {
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(BATCH);
        let start = Instant::now();
        for _ in 0..n {
            launch();
        }
        total += start.elapsed();
        stream.synchronize().expect("synchronizing between batches");
        left -= n;
    }
    total
}

fn launch_benches(c: &mut Criterion) {
    if !ferrofuse::driver_available() {
        println!("launch/*: skipped: no CUDA driver on this machine (libcuda could not be loaded)");
        return;
    }
    let kernels = match Kernels::for_device(0) {
        Ok(k) => k,
        Err(e) => {
            println!("launch/*: skipped: {e}");
            return;
        }
    };
    let stream = kernels.context().default_stream();
    let (rows, inter) = (1, 14336);
    let n = rows * inter;
    let a = stream.alloc_zeros::<bf16>(n).expect("alloc");
    let b = stream.alloc_zeros::<bf16>(n).expect("alloc");
    let x = stream.alloc_zeros::<bf16>(2 * n).expect("alloc");
    let mut y = stream.alloc_zeros::<bf16>(n).expect("alloc");

    c.bench_function("launch/empty_kernel", |bench| {
        bench.iter_custom(|iters| {
            time_launches(iters, &stream, || {
                kernels.launch_empty(&stream).expect("launch");
            })
        })
    });
    c.bench_function("launch/gated_fwd_split_bf16_1x14336", |bench| {
        let (a, b) = (
            Mat::new(a.as_view(), rows, inter),
            Mat::new(b.as_view(), rows, inter),
        );
        let mut y = MatMut::new(y.as_view_mut(), rows, inter);
        bench.iter_custom(|iters| {
            time_launches(iters, &stream, || {
                kernels
                    .gated(&stream, Activation::Silu, &a, &b, &mut y)
                    .expect("launch");
            })
        })
    });
    c.bench_function("launch/gated_fwd_interleaved_bf16_1x14336", |bench| {
        let x = Mat::new(x.as_view(), rows, 2 * inter);
        let mut y = MatMut::new(y.as_view_mut(), rows, inter);
        bench.iter_custom(|iters| {
            time_launches(iters, &stream, || {
                kernels
                    .gated_interleaved(&stream, Activation::Silu, &x, &mut y)
                    .expect("launch");
            })
        })
    });
    let hidden = 4096;
    let nx = stream.alloc_zeros::<bf16>(hidden).expect("alloc");
    let nr = stream.alloc_zeros::<bf16>(hidden).expect("alloc");
    let nw = stream.alloc_zeros::<bf16>(hidden).expect("alloc");
    let mut ny = stream.alloc_zeros::<bf16>(hidden).expect("alloc");
    let mut nh = stream.alloc_zeros::<bf16>(hidden).expect("alloc");
    c.bench_function("launch/add_rmsnorm_bf16_1x4096", |bench| {
        let (x, r) = (
            Mat::new(nx.as_view(), 1, hidden),
            Mat::new(nr.as_view(), 1, hidden),
        );
        let w = Mat::new(nw.as_view(), 1, hidden);
        let mut y = MatMut::new(ny.as_view_mut(), 1, hidden);
        let mut h = MatMut::new(nh.as_view_mut(), 1, hidden);
        let opts = RmsNormOptions::new(1e-6);
        bench.iter_custom(|iters| {
            time_launches(iters, &stream, || {
                let io = Placement::Add {
                    x: &x,
                    residual: &r,
                    y: &mut y,
                    h: &mut h,
                };
                kernels
                    .rmsnorm(&stream, io, &w, None, &opts)
                    .expect("launch");
            })
        })
    });
    stream.synchronize().expect("synchronizing");
}

criterion_group!(benches, plan_benches, launch_benches);
criterion_main!(benches);
