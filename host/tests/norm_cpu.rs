//! CPU tests of the residual-add + RMSNorm family: the f64 reference (its properties, `h`
//! being `x + residual` rounded to the storage dtype, the backward against finite
//! differences), every validation error of the plan functions, the aliasing rules, the
//! vector/scalar choice, and the launch geometry being a function of the row length only.
//! No GPU is needed: the `plan_*` functions decide everything a launch does.

// Element loops over rows read best with explicit indices.
#![allow(clippy::needless_range_loop)]

mod common;

use common::assert_matches;
use ferrofuse::half::{bf16, f16};
use ferrofuse::norm::{
    BwdNarrow, NormBwdVariant, NormFwdVariant, RmsNormBwdDescs, RmsNormFwdDescs,
    plan_rmsnorm_backward, plan_rmsnorm_backward_with, plan_rmsnorm_forward,
    rmsnorm_backward_geometry, rmsnorm_backward_workspace_len, rmsnorm_forward_geometry,
};
use ferrofuse::reference::{
    RmsNormRef, rmsnorm_add, rmsnorm_backward, rmsnorm_exact, rmsnorm_forward_row, rmsnorm_rstd,
    rmsnorm_weight,
};
use ferrofuse::{
    DType, Element, Error, GridLimits, KernelId, MatDesc, NormNumerics, NormPath, RmsNormOptions,
    VecMode,
};
use ferrofuse_common::{
    DEFAULT_MAX_SMEM_BYTES, RMSNORM_BWD_MAX_THREADS_PER_ROW, RMSNORM_BWD_SPREAD_BLOCKS,
    RMSNORM_BWD_STAGED_MAX_SMEM_BYTES, RMSNORM_GEMMA, RMSNORM_HF, RMSNORM_LOOP_SMEM_BYTES,
    RMSNORM_MAX_THREADS_PER_ROW, RMSNORM_SMEM_BYTES, RMSNORM_W_F32, RmsNormBwdParams,
    blocks_per_sm, rmsnorm_bwd_cluster_fits, rmsnorm_bwd_fused_dw_blocks,
    rmsnorm_bwd_fused_dw_groups, rmsnorm_bwd_fused_dw_smem_bytes, rmsnorm_bwd_layout,
    rmsnorm_bwd_smem_bytes, rmsnorm_bwd_tile_walkers, rmsnorm_realigned_fits,
    rmsnorm_realigned_smem_bytes,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const HIDDEN: [usize; 19] = [
    1, 3, 8, 256, 257, 512, 769, 896, 2048, 3584, 4096, 5120, 5125, 7168, 8192, 8193, 11001, 16383,
    16384,
];
const BIG_HIDDEN: [usize; 4] = [16385, 65536, 70001, 1 << 20];

// ------------------------------------------------------------------------------------------
// Fake device matrices: plans only look at addresses, lengths and shapes.
// ------------------------------------------------------------------------------------------

/// Each operand in its own 16 TiB window, so nothing overlaps unless a test makes it.
fn addr(i: u64) -> u64 {
    (1 << 48) + (i << 44)
}

fn mat(i: u64, dtype: DType, rows: usize, cols: usize) -> MatDesc {
    MatDesc::contiguous(addr(i), rows * cols, dtype, rows, cols)
}

fn fwd_descs(dtype: DType, rows: usize, hidden: usize, residual: bool) -> RmsNormFwdDescs {
    RmsNormFwdDescs {
        x: mat(0, dtype, rows, hidden),
        residual: residual.then(|| mat(1, dtype, rows, hidden)),
        weight: mat(2, dtype, 1, hidden),
        y: mat(3, dtype, rows, hidden),
        h: residual.then(|| mat(4, dtype, rows, hidden)),
        rstd: Some(mat(5, DType::F32, rows, 1)),
    }
}

fn bwd_descs(dtype: DType, rows: usize, hidden: usize, dres: bool) -> RmsNormBwdDescs {
    let ws = rmsnorm_backward_workspace_len(dtype, rows, hidden);
    RmsNormBwdDescs {
        dy: mat(0, dtype, rows, hidden),
        h: mat(1, dtype, rows, hidden),
        weight: mat(2, dtype, 1, hidden),
        rstd: mat(3, DType::F32, rows, 1),
        dres: dres.then(|| mat(4, dtype, rows, hidden)),
        dx: mat(5, dtype, rows, hidden),
        dw: mat(6, dtype, 1, hidden),
        workspace: MatDesc::contiguous(addr(7), ws, DType::F32, 1, ws),
    }
}

fn opts() -> RmsNormOptions {
    RmsNormOptions::new(1e-6)
}

fn fwd(
    t: &RmsNormFwdDescs,
) -> Result<ferrofuse::Launch<ferrofuse_common::RmsNormFwdParams>, Error> {
    plan_rmsnorm_forward(t, &opts(), &limits())
}

/// 132 multiprocessors, two blocks of each kernel per multiprocessor.
fn limits() -> GridLimits {
    GridLimits::uniform(132, 2)
}

fn bwd(t: &RmsNormBwdDescs) -> Result<ferrofuse::norm::RmsNormBwdPlan, Error> {
    plan_rmsnorm_backward(t, &opts())
}

/// The rows kernel's blocks of a backward plan: the grid, less the `dw` blocks when fused.
fn row_blocks(plan: &ferrofuse::norm::RmsNormBwdPlan, hidden: usize) -> u64 {
    let p = &plan.rows.params;
    let dw_blocks = match plan.dw {
        Some(_) => 0,
        None => {
            let groups = rmsnorm_bwd_fused_dw_groups(plan.rows.block) as u64;
            rmsnorm_bwd_fused_dw_blocks(
                hidden as u64,
                plan.rows.block,
                p.rows,
                p.dw_slots as u64,
                groups,
            )
        }
    };
    plan.rows.grid as u64 - dw_blocks
}

/// The memory path of a backward plan's rows kernel.
fn mode_of(plan: &ferrofuse::norm::RmsNormBwdPlan) -> VecMode {
    match plan.rows.kernel {
        KernelId::RmsNormBwd(_, mode, _) | KernelId::RmsNormBwdFused(_, mode) => mode,
        KernelId::RmsNormBwdNarrow(_, mode, _) | KernelId::RmsNormBwdLoopTiles(_, mode) => mode,
        KernelId::RmsNormBwdFusedNarrow(..) => VecMode::V16,
        k => panic!("{k:?}"),
    }
}

fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

fn random<T: Element>(rng: &mut StdRng, n: usize, scale: f64) -> Vec<T> {
    (0..n)
        .map(|_| T::from_f64(rng.random_range(-scale..=scale)))
        .collect()
}

// ------------------------------------------------------------------------------------------
// The reference.
// ------------------------------------------------------------------------------------------

fn plain(eps: f32) -> RmsNormRef {
    RmsNormRef {
        eps,
        gemma: false,
        hf: false,
        normalize_stored_h: false,
    }
}

#[test]
fn reference_of_a_constant_row() {
    for &c in &[0.5f32, -3.0, 1e-3] {
        for hidden in [1usize, 7, 4096] {
            let x = vec![c; hidden];
            let c = c as f64;
            let w: Vec<f64> = (0..hidden)
                .map(|i| 0.5 + i as f64 / hidden as f64)
                .collect();
            let eps = 1e-5f32;
            let r = rmsnorm_forward_row(&x, None, &w, &plain(eps));
            let rstd = 1.0 / (c * c + eps as f64).sqrt();
            assert!(
                (r.rstd - rstd).abs() <= 1e-12 * rstd,
                "{} vs {rstd}",
                r.rstd
            );
            for (i, (&y, &w)) in r.y.iter().zip(&w).enumerate() {
                let want = c * w * rstd;
                assert!(
                    (y - want).abs() <= 1e-12 * want.abs(),
                    "[{i}] {y} vs {want}"
                );
            }
        }
    }
}

#[test]
fn reference_normalised_row_has_unit_mean_square_up_to_eps() {
    let mut rng = rng(1);
    for hidden in [3usize, 896, 5125] {
        let x = random::<f32>(&mut rng, hidden, 2.0);
        let w = vec![1.0; hidden];
        let eps = 1e-3f32;
        let r = rmsnorm_forward_row(&x, None, &w, &plain(eps));
        let ms = r.y.iter().map(|v| v * v).sum::<f64>() / hidden as f64;
        let var = x.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / hidden as f64;
        // mean(n^2) = var / (var + eps): eps inside the square root, denominator H.
        let want = var / (var + eps as f64);
        assert!((ms - want).abs() < 1e-12, "{ms} vs {want}");
    }
}

#[test]
fn reference_is_scale_invariant_without_eps() {
    let mut rng = rng(2);
    let x = random::<f32>(&mut rng, 512, 1.0);
    let w: Vec<f64> = random::<f32>(&mut rng, 512, 1.0)
        .iter()
        .map(|&v| v as f64)
        .collect();
    let scaled: Vec<f32> = x.iter().map(|&v| v * 64.0).collect();
    let a = rmsnorm_forward_row(&x, None, &w, &plain(f32::MIN_POSITIVE));
    let b = rmsnorm_forward_row(&scaled, None, &w, &plain(f32::MIN_POSITIVE));
    for (p, q) in a.y.iter().zip(&b.y) {
        assert!((p - q).abs() <= 1e-12 * p.abs().max(1e-30), "{p} vs {q}");
    }
}

#[test]
fn reference_gemma_is_plain_with_one_plus_w_formed_in_f32() {
    let mut rng = rng(3);
    let hidden = 1000;
    let x = random::<bf16>(&mut rng, hidden, 2.0);
    let w: Vec<f64> = random::<bf16>(&mut rng, hidden, 0.5)
        .iter()
        .map(|v| v.to_f64())
        .collect();
    let gemma = RmsNormRef {
        gemma: true,
        ..plain(1e-6)
    };
    let shifted: Vec<f64> = w.iter().map(|&w| (1.0f32 + w as f32) as f64).collect();
    let a = rmsnorm_forward_row(&x, None, &w, &gemma);
    let b = rmsnorm_forward_row(&x, None, &shifted, &plain(1e-6));
    assert_eq!(a, b);
    // 1 + w rounds in f32 when w is tiny: the contract says f32, not f64.
    assert_eq!(rmsnorm_weight(1e-9, true), 1.0);
    assert_eq!(rmsnorm_weight(0.25, true), 1.25);
    assert_eq!(rmsnorm_weight(0.25, false), 0.25);
}

#[test]
fn reference_hf_mode_rounds_h_and_the_normalised_value() {
    let mut rng = rng(4);
    let hidden = 777;
    let x = random::<bf16>(&mut rng, hidden, 3.0);
    let r = random::<bf16>(&mut rng, hidden, 3.0);
    let w: Vec<f64> = random::<bf16>(&mut rng, hidden, 1.0)
        .iter()
        .map(|v| v.to_f64())
        .collect();
    let hf = RmsNormRef {
        hf: true,
        ..plain(1e-6)
    };
    let row = rmsnorm_forward_row(&x, Some(&r), &w, &hf);
    // Statistics from h as stored.
    assert_eq!(row.rstd, rmsnorm_rstd(&row.h, 1e-6f32 as f64));
    for i in 0..hidden {
        // y = round(h * rstd) * w: dividing by w gives back a bf16 value.
        let n = bf16::from_f64(row.h[i] * row.rstd).to_f64();
        assert_eq!(row.y[i], n * w[i]);
    }
    // With f32 storage the modes differ only by the f32 rounding of h * rstd (which the
    // kernel's f32 arithmetic does anyway): same h, same rstd, y within 2^-24 relative.
    let x = random::<f32>(&mut rng, hidden, 3.0);
    let r = random::<f32>(&mut rng, hidden, 3.0);
    let a = rmsnorm_forward_row(&x, Some(&r), &w, &hf);
    let b = rmsnorm_forward_row(&x, Some(&r), &w, &plain(1e-6));
    assert_eq!((&a.h, a.rstd), (&b.h, b.rstd));
    for (p, q) in a.y.iter().zip(&b.y) {
        assert!((p - q).abs() <= q.abs() * 2f64.powi(-24), "{p} vs {q}");
    }
}

#[test]
fn reference_f32_mode_normalises_the_f32_sum_unless_told_otherwise() {
    let mut rng = rng(5);
    let hidden = 300;
    let x = random::<f16>(&mut rng, hidden, 2.0);
    let r = random::<f16>(&mut rng, hidden, 2.0);
    let w = vec![1.0; hidden];
    let a = rmsnorm_forward_row(&x, Some(&r), &w, &plain(1e-6));
    let b = rmsnorm_forward_row(
        &x,
        Some(&r),
        &w,
        &RmsNormRef {
            normalize_stored_h: true,
            ..plain(1e-6)
        },
    );
    assert_eq!(a.rstd, b.rstd, "statistics use the f32 sum in both");
    assert_eq!(a.h, b.h);
    let h32: Vec<f64> = x
        .iter()
        .zip(&r)
        .map(|(a, b)| rmsnorm_add(a.to_f64(), b.to_f64()))
        .collect();
    for i in 0..hidden {
        assert_eq!(a.y[i], h32[i] * a.rstd);
        assert_eq!(b.y[i], b.h[i] * b.rstd);
    }
    assert_ne!(
        a.y, b.y,
        "the rounding of h must show somewhere in 300 f16 sums"
    );
}

/// `h` is the f32 sum rounded once to the storage dtype, for random and edge-case inputs.
fn check_h_is_rounded_sum<T: Element + PartialEq + std::fmt::Debug>(
    to_f32: fn(T) -> f32,
    from_f32: fn(f32) -> T,
    edge: &[(f64, f64)],
) {
    let mut rng = rng(6);
    let mut xs = random::<T>(&mut rng, 20_000, 4.0);
    let mut rs = random::<T>(&mut rng, 20_000, 4.0);
    // Mixed magnitudes, so the f32 sum rounds (and the storage rounding sees ties).
    for i in 0..5000 {
        let s = 2f64.powi(rng.random_range(-12..12));
        xs[i] = T::from_f64(xs[i].to_f64() * s);
    }
    for &(a, b) in edge {
        xs.push(T::from_f64(a));
        rs.push(T::from_f64(b));
    }
    let w = vec![1.0; xs.len()];
    let row = rmsnorm_forward_row(&xs, Some(&rs), &w, &plain(1e-6));
    for i in 0..xs.len() {
        let want = from_f32(to_f32(xs[i]) + to_f32(rs[i]));
        let got = T::from_f64(row.h[i]);
        assert!(
            got == want || (got.to_f64().is_nan() && want.to_f64().is_nan()),
            "h[{i}] = {got:?}, want {want:?} ({:?} + {:?})",
            xs[i],
            rs[i]
        );
        // Where the exact sum is an f32 the two roundings are one: h = round(x + r).
        let exact = xs[i].to_f64() + rs[i].to_f64();
        if exact == exact as f32 as f64 {
            assert_eq!(got, T::from_f64(exact), "h[{i}]");
        }
    }
}

#[test]
fn h_is_x_plus_residual_rounded_to_the_storage_dtype() {
    check_h_is_rounded_sum::<f32>(|v| v, |v| v, &[(1e30, -1e30), (1.0, 1e-30), (3e38, 3e38)]);
    check_h_is_rounded_sum::<f16>(
        |v| v.to_f32(),
        f16::from_f32,
        &[
            (65504.0, 65504.0),
            (1.0, -1.0),
            (1.0, 0.00048828125),
            (-2.0, 6e-8),
        ],
    );
    check_h_is_rounded_sum::<bf16>(
        |v| v.to_f32(),
        bf16::from_f32,
        &[
            (3.0e38, 3.0e38),
            (1.0, -1.0),
            (1.0, 0.00390625),
            (256.0, 1.0),
            (1.0, 1e-30),
        ],
    );
}

/// Loss `L = sum(dy * y(h)) + sum(dres * h)`: its gradient in h is the backward's dx.
fn loss(h: &[f64], w_eff: &[f64], eps: f64, dy: &[f64], dres: Option<&[f64]>) -> f64 {
    let y = rmsnorm_exact(h, w_eff, eps);
    let mut l: f64 = y.iter().zip(dy).map(|(a, b)| a * b).sum();
    if let Some(d) = dres {
        l += h.iter().zip(d).map(|(a, b)| a * b).sum::<f64>();
    }
    l
}

#[test]
fn backward_reference_matches_finite_differences() {
    let mut rng = rng(7);
    for &hidden in &[1usize, 3, 8, 33, 200] {
        for gemma in [false, true] {
            for with_dres in [false, true] {
                let rows = 3;
                let eps = 1e-3f64;
                let n = rows * hidden;
                let draw = |rng: &mut StdRng, n: usize| -> Vec<f64> {
                    (0..n).map(|_| rng.random_range(-1.5..1.5)).collect()
                };
                let h = draw(&mut rng, n);
                let dy = draw(&mut rng, n);
                let dres = draw(&mut rng, n);
                let w = draw(&mut rng, hidden);
                let w_eff: Vec<f64> = w.iter().map(|&w| rmsnorm_weight(w, gemma)).collect();
                let rstd: Vec<f64> = h.chunks(hidden).map(|r| rmsnorm_rstd(r, eps)).collect();
                let dres_opt = with_dres.then_some(&dres[..]);
                let (dx, dw) = rmsnorm_backward(&dy, &h, &w, &rstd, dres_opt, rows, hidden, gemma);
                let step = 1e-6;
                for r in 0..rows {
                    let row = r * hidden..(r + 1) * hidden;
                    let (hr, dyr) = (&h[row.clone()], &dy[row.clone()]);
                    let dr = dres_opt.map(|d| &d[row.clone()]);
                    for c in 0..hidden {
                        let mut hp = hr.to_vec();
                        let mut hm = hr.to_vec();
                        hp[c] += step;
                        hm[c] -= step;
                        let fd = (loss(&hp, &w_eff, eps, dyr, dr)
                            - loss(&hm, &w_eff, eps, dyr, dr))
                            / (2.0 * step);
                        let got = dx[r * hidden + c];
                        assert!(
                            (got - fd).abs() <= 1e-6 * (1.0 + fd.abs()),
                            "dx[{r},{c}] H={hidden} gemma={gemma}: {got} vs {fd}"
                        );
                    }
                }
                // dw: the loss is linear in w_eff, and d w_eff / d w = 1 for both conventions.
                for c in 0..hidden {
                    let mut fd = 0.0;
                    for r in 0..rows {
                        let row = r * hidden..(r + 1) * hidden;
                        let (hr, dyr) = (&h[row.clone()], &dy[row.clone()]);
                        let mut wp = w_eff.clone();
                        let mut wm = w_eff.clone();
                        wp[c] += step;
                        wm[c] -= step;
                        fd += (loss(hr, &wp, eps, dyr, None) - loss(hr, &wm, eps, dyr, None))
                            / (2.0 * step);
                    }
                    assert!(
                        (dw[c] - fd).abs() <= 1e-6 * (1.0 + fd.abs()),
                        "dw[{c}] H={hidden}: {} vs {fd}",
                        dw[c]
                    );
                }
            }
        }
    }
}

// ------------------------------------------------------------------------------------------
// Geometry and kernel choice.
// ------------------------------------------------------------------------------------------

#[test]
fn forward_geometry_depends_on_hidden_and_dtype_only() {
    for dtype in DType::ALL {
        for hidden in HIDDEN.iter().chain(&BIG_HIDDEN).copied() {
            let first = fwd(&fwd_descs(dtype, 1, hidden, true)).unwrap();
            for rows in [2usize, 7, 64, 1000, 16384, 1 << 20] {
                let l = fwd(&fwd_descs(dtype, rows, hidden, true)).unwrap();
                let what = format!("{dtype:?} H={hidden} rows={rows}");
                assert_eq!(
                    l.kernel.rmsnorm_forward_form(),
                    first.kernel.rmsnorm_forward_form(),
                    "{what}"
                );
                // The w-first form (same bits) exactly while the grid fits at once.
                let form = first.kernel.rmsnorm_forward_form().unwrap();
                let w_first = form.1 == NormPath::V16
                    && form.2 == NormFwdVariant::E16
                    && l.grid <= limits().resident_blocks(KernelId::RmsNormFwdWFirst(dtype));
                assert_eq!(
                    l.kernel == KernelId::RmsNormFwdWFirst(dtype),
                    w_first,
                    "{what}"
                );
                assert_eq!(l.block, first.block);
                let smem = if form.1 == NormPath::Realigned {
                    rmsnorm_realigned_smem_bytes(
                        &rmsnorm_forward_geometry(dtype, hidden).1,
                        dtype,
                        false,
                    )
                } else if form.2 == NormFwdVariant::Loop {
                    ferrofuse_common::RMSNORM_LOOP_SMEM_BYTES
                } else {
                    RMSNORM_SMEM_BYTES
                };
                assert_eq!(l.shared_mem_bytes, smem);
                let limit = l
                    .kernel
                    .dynamic_smem_opt_in()
                    .unwrap_or(DEFAULT_MAX_SMEM_BYTES);
                assert!(smem <= limit, "{what}: {smem} bytes of shared memory");
                assert_eq!(l.params.threads_per_row, first.params.threads_per_row);
                assert_eq!(l.params.rows_per_block, first.params.rows_per_block);
                assert_eq!(
                    l.grid as usize,
                    rows.div_ceil(l.params.rows_per_block as usize),
                    "one row group per block"
                );
            }
            // The kernel off the vector grid (realigned or scalar) has the same geometry.
            let mut t = fwd_descs(dtype, 7, hidden, true);
            t.x.addr += dtype.size_bytes() as u64;
            let s = fwd(&t).unwrap();
            assert!(s.kernel.exists(), "{dtype:?} H={hidden}: {:?}", s.kernel);
            assert_eq!(s.block, first.block);
            assert_eq!(
                (s.params.threads_per_row, s.params.rows_per_block),
                (first.params.threads_per_row, first.params.rows_per_block)
            );
            let (Some((_, _, v1)), Some((_, m2, v2))) = (
                first.kernel.rmsnorm_forward_form(),
                s.kernel.rmsnorm_forward_form(),
            ) else {
                panic!("not a forward kernel")
            };
            let off_grid = if rmsnorm_realigned_fits(dtype, hidden as u64, false) {
                NormPath::Realigned
            } else {
                NormPath::Scalar
            };
            assert_eq!((m2, v2), (off_grid, v1));
        }
    }
}

#[test]
fn forward_streams_rows_of_32_per_thread_past_one_wave() {
    let streamed = limits().with_streamed_rows(true);
    for dtype in DType::ALL {
        for hidden in [8200, 12288, 16384] {
            let (variant, g) = rmsnorm_forward_geometry(dtype, hidden);
            let t = fwd_descs(dtype, 1000, hidden, true);
            let l = plan_rmsnorm_forward(&t, &opts(), &streamed).unwrap();
            let what = format!("{dtype:?} H={hidden}");
            if variant != NormFwdVariant::E32 {
                assert!(!matches!(l.kernel, KernelId::RmsNormFwdStream(_)), "{what}");
                continue;
            }
            // The persistent grid of the same geometry (the same bits as the register kernel).
            assert_eq!(l.kernel, KernelId::RmsNormFwdStream(dtype), "{what}");
            assert_eq!(
                l.kernel.rmsnorm_forward_form(),
                Some((dtype, NormPath::V16, variant))
            );
            assert_eq!((l.grid, l.block), (264, g.block_threads()), "{what}");
            assert_eq!(
                l.shared_mem_bytes,
                ferrofuse_common::RMSNORM_STREAM_SMEM_BYTES
            );
            assert_eq!(l.params.threads_per_row, g.threads_per_row);
            // Within one wave, without the streamed kernel, or off the vector grid: not it.
            let t = fwd_descs(dtype, 264, hidden, true);
            let l = plan_rmsnorm_forward(&t, &opts(), &streamed).unwrap();
            assert_eq!(l.kernel, KernelId::RmsNormFwd(dtype, VecMode::V16, variant));
            let t = fwd_descs(dtype, 1000, hidden, true);
            let l = plan_rmsnorm_forward(&t, &opts(), &limits()).unwrap();
            assert_eq!(l.kernel, KernelId::RmsNormFwd(dtype, VecMode::V16, variant));
            let mut t = fwd_descs(dtype, 1000, hidden, true);
            t.x.addr += dtype.size_bytes() as u64;
            let l = plan_rmsnorm_forward(&t, &opts(), &streamed).unwrap();
            assert!(!matches!(l.kernel, KernelId::RmsNormFwdStream(_)), "{what}");
        }
    }
}

#[test]
fn forward_geometry_covers_each_row_without_waste() {
    for dtype in DType::ALL {
        let lanes = dtype.lanes_per_16b();
        for hidden in HIDDEN.iter().chain(&BIG_HIDDEN).copied() {
            let (variant, g) = rmsnorm_forward_geometry(dtype, hidden);
            let t = g.threads_per_row as usize;
            assert!(t.is_multiple_of(32) && t <= RMSNORM_MAX_THREADS_PER_ROW as usize);
            assert!(g.block_threads() <= RMSNORM_MAX_THREADS_PER_ROW);
            let chunks = hidden.div_ceil(lanes);
            let per_thread = g.elems_per_thread as usize / lanes;
            match variant {
                NormFwdVariant::E16 | NormFwdVariant::E32 => {
                    assert!(!g.looped);
                    assert!(hidden <= 16384, "rows up to 16384 stay in registers");
                    assert!(
                        t * per_thread >= chunks,
                        "{dtype:?} H={hidden}: row not covered"
                    );
                    if t > 32 {
                        assert!(
                            (t - 32) * per_thread < chunks,
                            "{dtype:?} H={hidden}: a spare warp"
                        );
                    }
                    let want = if hidden <= 8192 { 16 } else { 32 };
                    assert_eq!(g.elems_per_thread, want, "{dtype:?} H={hidden}");
                }
                NormFwdVariant::Loop => {
                    assert!(g.looped && hidden > 16384, "{dtype:?} H={hidden}");
                    assert_eq!((t, g.rows_per_block), (512, 1));
                }
            }
            if hidden <= 512 {
                assert_eq!(
                    (t, g.rows_per_block),
                    (32, 8),
                    "a warp per row for short rows"
                );
            }
        }
        assert!(rmsnorm_forward_geometry(dtype, 16384).0 != NormFwdVariant::Loop);
        assert_eq!(
            rmsnorm_forward_geometry(dtype, 16385).0,
            NormFwdVariant::Loop
        );
    }
    // Real sizes.
    let g = |d, h| rmsnorm_forward_geometry(d, h).1;
    assert_eq!(g(DType::BF16, 4096).threads_per_row, 256);
    assert_eq!(g(DType::BF16, 8192).threads_per_row, 512);
    assert_eq!(g(DType::BF16, 5120).threads_per_row, 320);
    assert_eq!(g(DType::BF16, 16384).threads_per_row, 512);
    assert_eq!(g(DType::F32, 4096).threads_per_row, 256);
    assert_eq!(
        (
            g(DType::BF16, 896).threads_per_row,
            g(DType::BF16, 896).rows_per_block
        ),
        (64, 4)
    );
}

#[test]
fn backward_geometry_and_workspace() {
    for dtype in DType::ALL {
        let lanes = dtype.lanes_per_16b();
        // Rows are held 16 per thread up to 8192 elements.
        let max_e16 = 8192;
        for hidden in HIDDEN.iter().chain(&BIG_HIDDEN).copied() {
            let (variant, g) = rmsnorm_backward_geometry(dtype, hidden);
            let t = g.threads_per_row as usize;
            assert!(t.is_multiple_of(32) && g.block_threads() <= RMSNORM_BWD_MAX_THREADS_PER_ROW);
            match variant {
                NormBwdVariant::E16 => {
                    assert!(hidden <= max_e16 && t * 16 / lanes >= hidden.div_ceil(lanes));
                }
                NormBwdVariant::Loop => assert!(hidden > max_e16 && g.looped),
            }
            // The vector path of rows held 16 per thread, and f32 rows off it outside the
            // one-launch kernel, stage two rows' h, dy and dres (when the call has one) in
            // shared memory, and ask for the most when the grid is small (spread over the
            // multiprocessors); the scalar path of rows held 16 per thread keeps the weight
            // there as f32 (16 per thread of a row); looped rows use the ring of tile sums
            // (`RMSNORM_LOOP_SMEM_BYTES`). Each fits the kernel's limit. The fused form asks for the larger of that
            // and its `dw` blocks' sums.
            for (dres, rows) in [false, true].into_iter().flat_map(|d| [(d, 16), (d, 1000)]) {
                let plan = bwd(&bwd_descs(dtype, rows, hidden, dres)).unwrap();
                let l = plan.rows;
                let mode = mode_of(&plan);
                let fused = plan.dw.is_none();
                let staged = variant == NormBwdVariant::E16
                    && (mode == VecMode::V16 || (dtype == DType::F32 && !fused));
                let want = if staged && row_blocks(&plan, hidden) <= RMSNORM_BWD_SPREAD_BLOCKS {
                    RMSNORM_BWD_STAGED_MAX_SMEM_BYTES
                } else if staged {
                    // Two row groups' buffers, one for f32 blocks of more than 256 threads
                    // with dres, 384 without.
                    let operands = 2 + dres as u32;
                    let most = if dres { 256 } else { 384 };
                    let buffers = if dtype == DType::F32 && g.block_threads() > most {
                        1
                    } else {
                        2
                    };
                    RMSNORM_SMEM_BYTES
                        + buffers * operands * g.block_threads() * 16 * dtype.size_bytes() as u32
                } else if variant == NormBwdVariant::E16 {
                    RMSNORM_SMEM_BYTES + g.threads_per_row * 16 * 4
                } else {
                    RMSNORM_LOOP_SMEM_BYTES
                };
                let want = match plan.dw {
                    Some(_) => want,
                    None => want.max(rmsnorm_bwd_fused_dw_smem_bytes(
                        rmsnorm_bwd_fused_dw_groups(l.block) as u64,
                    )),
                };
                assert_eq!(
                    l.shared_mem_bytes, want,
                    "{dtype:?} {rows} x {hidden} dres {dres}"
                );
                let limit = l
                    .kernel
                    .dynamic_smem_opt_in()
                    .unwrap_or(DEFAULT_MAX_SMEM_BYTES);
                assert!(
                    want <= limit,
                    "{dtype:?} {hidden}: {want} bytes of shared memory"
                );
            }
            for rows in [0usize, 1, 7, 300, 600, 1000, 2000, 100_000] {
                let t = bwd_descs(dtype, rows, hidden, false);
                let plan = bwd(&t).unwrap();
                let blocks = rmsnorm_bwd_layout(dtype, rows as u64, hidden as u64).blocks;
                let slots = blocks as usize * g.rows_per_block as usize;
                // One launch for rows held 16 per thread, with a block per row group: where
                // the two launches have a block per row group; for 16-bit blocks of 256
                // threads or more while a block per row group fits their thread budget; for
                // 16-bit rows off the grid up to 2^22 elements.
                let groups = rows.div_ceil(g.rows_per_block as usize);
                let sixteen_bit = dtype.size_bytes() == 2;
                let scalar_16 = mode_of(&plan) == VecMode::Scalar && sixteen_bit;
                let wide_16 = sixteen_bit
                    && g.block_threads() >= 256
                    && groups * g.block_threads() as usize <= 131_072;
                let fused = variant == NormBwdVariant::E16
                    && rows > 0
                    && hidden > 0
                    && (groups == blocks as usize
                        || wide_16
                        || (scalar_16 && rows * hidden <= 1 << 22));
                assert_eq!(plan.dw.is_none(), fused, "{dtype:?} {rows} x {hidden}");
                if fused {
                    assert_eq!(row_blocks(&plan, hidden) as usize, groups);
                } else {
                    assert_eq!(row_blocks(&plan, hidden), blocks);
                }
                if let Some(dw) = plan.dw {
                    assert_eq!(dw.params.slots as usize, slots);
                    assert_eq!(dw.grid as usize, hidden.div_ceil(32));
                    assert_eq!(dw.kernel, KernelId::RmsNormDw(dtype));
                    assert_eq!(plan.rows.params.dw, 0);
                    assert_eq!(plan.rows.params.dw_slots, 0);
                } else {
                    assert!(
                        matches!(
                            plan.rows.kernel,
                            KernelId::RmsNormBwdFused(d, _) | KernelId::RmsNormBwdFusedNarrow(d, _)
                                if d == dtype
                        ),
                        "{dtype:?} {rows} x {hidden}: {:?}",
                        plan.rows.kernel
                    );
                    assert_eq!(plan.rows.params.dw, t.dw.addr);
                    // Its dw blocks follow the two launches' slots.
                    assert_eq!(plan.rows.params.dw_slots as usize, slots);
                }
                let coef = if variant == NormBwdVariant::Loop {
                    rows
                } else {
                    0
                };
                // 16-bit rows the split's tiles apply to also hold the tile passes' partials
                // and tile sums.
                let tile_passes =
                    if rmsnorm_bwd_cluster_fits(hidden as u64) && dtype.size_bytes() == 2 {
                        let walkers = rmsnorm_bwd_tile_walkers(rows as u64, hidden as u64) as usize;
                        walkers * hidden + rows * hidden.div_ceil(8192)
                    } else {
                        0
                    };
                assert_eq!(
                    rmsnorm_backward_workspace_len(dtype, rows, hidden),
                    (slots * hidden + coef).max(tile_passes)
                );
                assert!(blocks as usize <= groups);
                assert!(blocks * plan.rows.block as u64 <= 131_072);
                // The grid: a block per row group up to the largest power of two of blocks
                // within that; from four times the occupancy grid on (eight times for blocks of
                // the 80-register narrow entry), that grid, a power of two of multiprocessors'
                // worth of blocks (for one-row blocks of 16 per thread as many as the vector
                // entry's registers allow, 1024 threads of 16-bit rows and 512 of f32, but
                // three f32 blocks of 192 threads and two of 288-384 on the narrow entries;
                // else one).
                if variant == NormBwdVariant::Loop {
                    // Long rows: about 256 blocks of the cluster split (a walker per row below
                    // that), 512 walkers for rows it does not take (looped only).
                    let tiles = hidden.div_ceil(8192) as u64;
                    let fits = tiles <= 8 && hidden as u64 - (tiles - 1) * 8192 >= 2048;
                    let most = if fits { 256 / tiles } else { 512 };
                    assert_eq!(
                        blocks,
                        (rows as u64).min(most),
                        "{dtype:?} {rows} x {hidden}"
                    );
                } else if hidden > 0 {
                    let block = plan.rows.block as u64;
                    let per_sm = match (variant, g.rows_per_block, sixteen_bit) {
                        (NormBwdVariant::E16, 1, true) => 1024 / block,
                        (NormBwdVariant::E16, 1, false) => match block {
                            192 => 3,
                            288..=384 => 2,
                            _ => 512 / block,
                        },
                        _ => 1,
                    };
                    let power_of_two_within = |size: u64| {
                        let mut n = 1;
                        while 2 * n * size <= 131_072 {
                            n *= 2;
                        }
                        n
                    };
                    let occupancy = power_of_two_within(block * per_sm) * per_sm;
                    let groups = groups as u64;
                    let narrow_80 = variant == NormBwdVariant::E16
                        && g.rows_per_block == 1
                        && !sixteen_bit
                        && (352..=384).contains(&block);
                    let per_block = if narrow_80 { 8 } else { 4 };
                    let want = if groups >= per_block * occupancy {
                        occupancy
                    } else {
                        groups.min(power_of_two_within(block))
                    };
                    assert_eq!(
                        blocks, want,
                        "{dtype:?} {rows} x {hidden}: blocks of {block}"
                    );
                }
                if rows == 0 {
                    assert_eq!(plan.rows.grid, 0, "no rows: nothing to do but write dw = 0");
                }
                // Exactly the advertised workspace is enough, one element less is not.
                if slots * hidden + coef > 0 {
                    let mut short = t;
                    short.workspace.len -= 1;
                    assert_matches!(
                        bwd(&short),
                        Err(Error::BufferTooSmall {
                            tensor: "workspace",
                            ..
                        })
                    );
                }
            }
        }
    }
}

/// Rows longer than 8192 with clusters: a cluster of a block per tile per row walker where
/// the split fits (2-8 tiles, the last a quarter full at least, and 9-16 tiles for up to 64
/// rows where clusters of 16 run; every path), with the looped kernel's walkers as its clusters and the same `dw`
/// launch (without clusters of its size, the looped kernel of the split's tiles), or in one
/// launch with `dw` blocks of its own while each walker has one row; the looped kernel
/// otherwise.
#[test]
fn backward_long_rows_split_over_clusters() {
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for hidden in [
            8193usize, 16384, 16385, 18432, 20000, 32768, 65536, 65537, 65544, 73728, 100_003,
            131_072, 131_073,
        ] {
            for (rows, max_cluster) in [1usize, 7, 64, 65, 300, 5000]
                .into_iter()
                .flat_map(|r| [(r, 8), (r, 16)])
            {
                for dres in [false, true] {
                    let t = bwd_descs(dtype, rows, hidden, dres);
                    let plan = |fused, max_cluster| {
                        plan_rmsnorm_backward_with(&t, &opts(), fused, max_cluster, false).unwrap()
                    };
                    let (split, two, looped) = (
                        plan(true, max_cluster),
                        plan(false, max_cluster),
                        plan(true, 0),
                    );
                    let what = format!("{dtype:?} {rows} x {hidden} dres {dres} {max_cluster}");
                    let mode = mode_of(&looped);
                    let tiles = hidden.div_ceil(8192) as u32;
                    // Up to 8 tiles a last tile of a quarter at least, 9-16 any.
                    let fits = (2..=16).contains(&tiles)
                        && (tiles > 8 || hidden - (tiles as usize - 1) * 8192 >= 2048);
                    let most = if fits && tiles <= 8 { 256 / tiles } else { 512 };
                    let walkers = (rows as u32).min(most);
                    let looped_kernel = if fits {
                        KernelId::RmsNormBwdLoopTiles(dtype, mode)
                    } else {
                        KernelId::RmsNormBwd(dtype, mode, NormBwdVariant::Loop)
                    };
                    assert_eq!(looped.rows.kernel, looped_kernel, "{what}");
                    assert_eq!(
                        (looped.rows.grid, looped.rows.block),
                        (walkers, 256),
                        "{what}"
                    );
                    assert_eq!(two.dw, looped.dw, "{what}");
                    // Clusters of more than 8 only for up to 64 rows.
                    let clustered =
                        fits && u64::from(tiles) <= max_cluster && (tiles <= 8 || rows <= 64);
                    if !clustered {
                        assert_eq!(split, looped, "{what}");
                        assert_eq!(two, looped, "{what}");
                        continue;
                    }
                    // The staged rows of a 512-thread block after the tile-sum slots.
                    let (_, g) = rmsnorm_backward_geometry(dtype, 8192);
                    let smem = |grid: u32| {
                        let staged = rmsnorm_bwd_smem_bytes(
                            dtype,
                            mode,
                            NormBwdVariant::E16,
                            &g,
                            dres,
                            grid as u64,
                            false,
                        );
                        staged + 16
                    };
                    let l = two.rows;
                    assert_eq!(l.kernel, KernelId::RmsNormBwdCluster(dtype, mode), "{what}");
                    assert_eq!((l.grid, l.block), (walkers * tiles, 512), "{what}");
                    let params = RmsNormBwdParams {
                        threads_per_row: 512,
                        ..looped.rows.params
                    };
                    assert_eq!(l.params, params, "{what}");
                    assert_eq!(l.shared_mem_bytes, smem(l.grid), "{what}");
                    assert!(
                        l.shared_mem_bytes <= l.kernel.dynamic_smem_opt_in().unwrap(),
                        "{what}"
                    );
                    // One launch while each walker has one row: the clusters, then the `dw`
                    // blocks in whole clusters (by column for up to 4 rows, 2048 columns a
                    // block; else column groups of 32, two a block while that makes at most
                    // 300 blocks, else four).
                    if rows as u32 > most {
                        assert_eq!(split, two, "{what}");
                        continue;
                    }
                    assert_eq!(split.dw, None, "{what}");
                    let l = split.rows;
                    let groups = if hidden.div_ceil(64) <= 300 { 2 } else { 4 };
                    let cols = if rows <= 4 {
                        2048
                    } else {
                        32 * groups as usize
                    };
                    let dw_blocks = (hidden.div_ceil(cols) as u32).next_multiple_of(tiles);
                    assert_eq!(
                        l.kernel,
                        KernelId::RmsNormBwdClusterFused(dtype, mode),
                        "{what}"
                    );
                    assert_eq!(
                        (l.grid, l.block),
                        (walkers * tiles + dw_blocks, 512),
                        "{what}"
                    );
                    let params = RmsNormBwdParams {
                        threads_per_row: 512,
                        dw_slots: walkers,
                        dw: t.dw.addr,
                        ..looped.rows.params
                    };
                    assert_eq!(l.params, params, "{what}");
                    assert_eq!(
                        l.shared_mem_bytes,
                        smem(l.grid).max(1024 * groups),
                        "{what}"
                    );
                    assert!(
                        l.shared_mem_bytes <= l.kernel.dynamic_smem_opt_in().unwrap(),
                        "{what}"
                    );
                }
            }
        }
    }
}

/// The tile passes (switched on): for 16-bit rows wherever the split's tiles apply, whatever
/// the device's clusters, three launches: a 512-thread block per tile per row for the tile
/// sums, a block per tile per walker for `dx` (the walkers of `rmsnorm_bwd_tile_walkers`:
/// enough for 512 blocks, at most 8 rows each, at most one per row), the `dw` sum over those
/// walkers' partials; the tile sums after the partials, inside the workspace the docs ask
/// for. Other rows, and f32 rows, plan as without the switch.
#[test]
fn backward_tile_passes_plan() {
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for hidden in [
            4096usize, 8192, 8193, 16384, 16385, 20000, 65536, 65537, 73728, 100_003, 131_072,
            131_073,
        ] {
            for rows in [1usize, 7, 56, 57, 64, 300, 5000] {
                for (dres, max_cluster) in [(false, 0), (true, 8), (false, 16)] {
                    let t = bwd_descs(dtype, rows, hidden, dres);
                    let what = format!("{dtype:?} {rows} x {hidden} dres {dres} {max_cluster}");
                    let plan = |passes| {
                        plan_rmsnorm_backward_with(&t, &opts(), true, max_cluster, passes).unwrap()
                    };
                    let (passes, without) = (plan(true), plan(false));
                    if !rmsnorm_bwd_cluster_fits(hidden as u64) || dtype == DType::F32 {
                        assert_eq!(passes, without, "{what}");
                        assert_eq!(passes.sums, None, "{what}");
                        continue;
                    }
                    let tiles = hidden.div_ceil(8192) as u32;
                    let walkers = (rows as u32).min((512 / tiles).max(rows.div_ceil(8) as u32));
                    assert_eq!(
                        walkers as u64,
                        rmsnorm_bwd_tile_walkers(rows as u64, hidden as u64),
                        "{what}"
                    );
                    let looped = plan_rmsnorm_backward_with(&t, &opts(), false, 0, false).unwrap();
                    let mode = mode_of(&looped);
                    let params = RmsNormBwdParams {
                        threads_per_row: 512,
                        dw_slots: walkers,
                        ..looped.rows.params
                    };
                    let sums = passes.sums.expect("the tile sums launch");
                    assert_eq!(
                        sums.kernel,
                        KernelId::RmsNormBwdTileSums(dtype, mode),
                        "{what}"
                    );
                    assert_eq!(
                        (sums.grid, sums.block, sums.shared_mem_bytes),
                        (rows as u32 * tiles, 512, RMSNORM_SMEM_BYTES),
                        "{what}"
                    );
                    assert_eq!(sums.params, params, "{what}");
                    let l = passes.rows;
                    assert_eq!(l.kernel, KernelId::RmsNormBwdTileDx(dtype, mode), "{what}");
                    assert_eq!(
                        (l.grid, l.block, l.shared_mem_bytes),
                        (walkers * tiles, 512, 0),
                        "{what}"
                    );
                    assert_eq!(l.params, params, "{what}");
                    let dw = passes.dw.expect("the dw launch");
                    assert_eq!(dw.params.slots, walkers as u64, "{what}");
                    assert_eq!(
                        dw.params,
                        ferrofuse_common::RmsNormDwParams {
                            slots: walkers as u64,
                            ..looped.dw.unwrap().params
                        },
                        "{what}"
                    );
                    // The tile sums end inside the workspace.
                    let end = walkers as usize * hidden + rows * tiles as usize;
                    assert!(
                        end <= rmsnorm_backward_workspace_len(dtype, rows, hidden),
                        "{what}"
                    );
                }
            }
        }
    }
}

#[test]
fn vector_kernel_only_when_every_operand_allows_it() {
    for dtype in DType::ALL {
        let lanes = dtype.lanes_per_16b();
        let size = dtype.size_bytes() as u64;
        let hidden = 4096;
        let mode = |t: &RmsNormFwdDescs| match fwd(t).unwrap().kernel.rmsnorm_forward_form() {
            Some((_, m, _)) => m,
            None => panic!("not a forward kernel"),
        };
        let base = fwd_descs(dtype, 7, hidden, true);
        assert_eq!(mode(&base), NormPath::V16);
        // A padded row stride that keeps 16-byte rows is fine.
        let mut t = base;
        for m in [&mut t.x, &mut t.y] {
            m.row_stride = hidden + lanes;
            m.len = 7 * m.row_stride;
        }
        assert_eq!(mode(&t), NormPath::V16);
        for which in 0..6 {
            let mut t = base;
            match which {
                0 => t.x.addr += size,
                1 => t.residual.as_mut().unwrap().addr += size,
                2 => t.y.addr += size,
                3 => t.h.as_mut().unwrap().addr += size,
                4 => t.weight.addr += size,
                _ => {
                    t.x.row_stride = hidden + 1;
                    t.x.len = 7 * t.x.row_stride;
                }
            }
            // Off the grid: the realigned kernel (a 4096-element row is within its 16 per
            // thread), except for a misaligned weight, which it reads as aligned vectors.
            let want = if which == 4 {
                NormPath::Scalar
            } else {
                NormPath::Realigned
            };
            assert_eq!(mode(&t), want, "{dtype:?} case {which}");
        }
        // The rstd vector is written by scalar stores: its alignment does not matter.
        let mut t = base;
        t.rstd.as_mut().unwrap().addr += 4;
        assert_eq!(mode(&t), NormPath::V16);
        // A row length that is not a multiple of the vector: realigned while its staging fits
        // (16-bit rows up to 16384 elements, f32 up to 8192), then for f32 rows of 32 per
        // thread scalar, and looped rows (beyond 16384 elements) realigned tile by tile.
        let longest = if size == 4 { 8192 } else { 16384 };
        for h in [hidden + 1, longest - 1, 16385, 65537, 131073, 1_000_001] {
            assert_eq!(
                mode(&fwd_descs(dtype, 7, h, true)),
                NormPath::Realigned,
                "H={h}"
            );
        }
        if size == 4 {
            for h in [8193, 16383] {
                assert_eq!(mode(&fwd_descs(dtype, 7, h, true)), NormPath::Scalar);
            }
        }
        // An f32 weight of 16-bit rows is staged in f32: realigned up to 12288 elements, and
        // not on the looped form, which stages the weight as a row of the storage dtype.
        if size == 2 {
            let with_f32_weight = |h: usize| {
                let mut t = fwd_descs(dtype, 7, h, true);
                t.weight = mat(2, DType::F32, 1, h);
                mode(&t)
            };
            assert_eq!(with_f32_weight(12287), NormPath::Realigned);
            assert_eq!(with_f32_weight(12289), NormPath::Scalar);
            assert_eq!(with_f32_weight(65537), NormPath::Scalar);
        }
        // A single row does not need a vector-multiple stride.
        let mut t = fwd_descs(dtype, 1, hidden, true);
        t.x.row_stride = hidden + 1;
        assert_eq!(mode(&t), NormPath::V16);
        // Backward: the workspace must be 16-byte aligned too.
        // (7 rows take the one-launch kernel, 20000 two launches.)
        for rows in [7, 20_000] {
            let b = bwd_descs(dtype, rows, hidden, true);
            assert_eq!(mode_of(&bwd(&b).unwrap()), VecMode::V16);
            let mut b2 = b;
            b2.workspace.addr += 4;
            assert_eq!(mode_of(&bwd(&b2).unwrap()), VecMode::Scalar);
            let mut b3 = b;
            b3.dres.as_mut().unwrap().addr += size;
            assert_eq!(mode_of(&bwd(&b3).unwrap()), VecMode::Scalar);
        }
    }
}

#[test]
fn params_carry_the_operands_and_flags() {
    let t = fwd_descs(DType::BF16, 7, 896, true);
    let l = fwd(&t).unwrap();
    let p = l.params;
    assert_eq!(
        (p.x, p.residual, p.w, p.y, p.h, p.rstd),
        (addr(0), addr(1), addr(2), addr(3), addr(4), addr(5))
    );
    assert_eq!(
        (
            p.x_stride,
            p.residual_stride,
            p.y_stride,
            p.h_stride,
            p.rstd_stride
        ),
        (896, 896, 896, 896, 1)
    );
    assert_eq!((p.rows, p.hidden, p.eps, p.flags), (7, 896, 1e-6, 0));
    let flags = |o: RmsNormOptions, w: DType| {
        let mut t = fwd_descs(DType::BF16, 7, 896, true);
        t.weight.dtype = w;
        plan_rmsnorm_forward(&t, &o, &limits())
            .unwrap()
            .params
            .flags
    };
    assert_eq!(flags(opts().with_gemma(true), DType::BF16), RMSNORM_GEMMA);
    assert_eq!(
        flags(opts().with_numerics(NormNumerics::HfLlama), DType::BF16),
        RMSNORM_HF
    );
    assert_eq!(flags(opts(), DType::F32), RMSNORM_W_F32);
    // Plain RMSNorm: no residual and no h (address 0).
    let t = fwd_descs(DType::F16, 3, 100, false);
    let p = fwd(&t).unwrap().params;
    assert_eq!((p.residual, p.h), (0, 0));
    // Without rstd.
    let mut t = fwd_descs(DType::F16, 3, 100, true);
    t.rstd = None;
    assert_eq!(fwd(&t).unwrap().params.rstd, 0);
    // f32 weight with f32 storage is just the storage dtype.
    let mut t = fwd_descs(DType::F32, 3, 100, true);
    t.weight.dtype = DType::F32;
    assert_eq!(fwd(&t).unwrap().params.flags, 0);
    // Backward.
    let b = bwd_descs(DType::F16, 5, 3000, true);
    let mut b32 = b;
    b32.weight.dtype = DType::F32;
    b32.dw.dtype = DType::F32;
    let plan = plan_rmsnorm_backward(&b32, &opts().with_gemma(true)).unwrap();
    assert_eq!(plan.rows.params.flags, RMSNORM_GEMMA | RMSNORM_W_F32);
    // Five rows: one launch, dw written by the fused kernel; the dw kernel's dtype is the
    // weight's where there are two.
    assert_eq!(
        plan.rows.kernel,
        KernelId::RmsNormBwdFused(DType::F16, VecMode::V16)
    );
    assert_eq!(plan.rows.params.dw, addr(6));
    let mut b32_many = bwd_descs(DType::F16, 20_000, 3000, true);
    b32_many.weight.dtype = DType::F32;
    b32_many.dw.dtype = DType::F32;
    let plan = plan_rmsnorm_backward(&b32_many, &opts()).unwrap();
    assert_eq!(plan.dw.unwrap().kernel, KernelId::RmsNormDw(DType::F32));
    let p = bwd(&b).unwrap().rows.params;
    assert_eq!(
        (p.dy, p.h, p.w, p.rstd, p.dres, p.dx, p.workspace),
        (
            addr(0),
            addr(1),
            addr(2),
            addr(3),
            addr(4),
            addr(5),
            addr(7)
        )
    );
}

/// A backward writing `dx` over `dy` runs two launches (the one-launch form's `dw` blocks read
/// `dy`); over `dres`, or separate, one where the rows are few.
#[test]
fn backward_over_dy_runs_two_launches() {
    let t = bwd_descs(DType::BF16, 16, 4096, true);
    assert!(bwd(&t).unwrap().dw.is_none());
    let over_dres = RmsNormBwdDescs {
        dx: t.dres.unwrap(),
        ..t
    };
    assert!(bwd(&over_dres).unwrap().dw.is_none());
    let over_dy = RmsNormBwdDescs { dx: t.dy, ..t };
    let plan = bwd(&over_dy).unwrap();
    let two = KernelId::RmsNormBwd(DType::BF16, VecMode::V16, NormBwdVariant::E16);
    assert_eq!(plan.rows.kernel, two);
    assert!(plan.dw.is_some());
}

#[test]
fn empty_shapes_launch_nothing() {
    for (rows, hidden) in [(0usize, 4096usize), (5, 0), (0, 0)] {
        let l = fwd(&fwd_descs(DType::BF16, rows, hidden, true)).unwrap();
        assert_eq!(l.grid, 0, "{rows}x{hidden}");
    }
    let plan = bwd(&bwd_descs(DType::BF16, 5, 0, false)).unwrap();
    assert_eq!((plan.rows.grid, plan.dw.map(|d| d.grid)), (0, Some(0)));
}

// ------------------------------------------------------------------------------------------
// Validation errors.
// ------------------------------------------------------------------------------------------

#[test]
fn eps_must_be_finite_and_positive() {
    let t = fwd_descs(DType::BF16, 4, 64, true);
    for eps in [
        0.0f32,
        -0.0,
        -1e-6,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
    ] {
        let e = plan_rmsnorm_forward(&t, &RmsNormOptions::new(eps), &limits()).unwrap_err();
        assert!(
            matches!(e, Error::InvalidArgument { what: "eps", .. }),
            "eps {eps}: {e}"
        );
    }
    for eps in [f32::MIN_POSITIVE / 2.0, 1e-12, 1e-6, 1.0, 1e30] {
        plan_rmsnorm_forward(&t, &RmsNormOptions::new(eps), &limits()).unwrap();
    }
}

#[test]
fn forward_rejects_bad_descriptions() {
    let d = DType::BF16;
    let base = fwd_descs(d, 4, 64, true);
    let err = |f: &dyn Fn(&mut RmsNormFwdDescs)| {
        let mut t = base;
        f(&mut t);
        plan_rmsnorm_forward(&t, &opts(), &limits()).unwrap_err()
    };
    // Dtypes.
    // The storage dtype is x's: another operand of the old one mismatches.
    assert_matches!(
        err(&|t| t.x.dtype = DType::F16),
        Error::DTypeMismatch {
            tensor: "y",
            expected: DType::F16,
            got: DType::BF16
        }
    );
    assert_matches!(
        err(&|t| t.y.dtype = DType::F32),
        Error::DTypeMismatch { tensor: "y", .. }
    );
    assert_matches!(
        err(&|t| t.residual.as_mut().unwrap().dtype = DType::F16),
        Error::DTypeMismatch {
            tensor: "residual",
            ..
        }
    );
    assert_matches!(
        err(&|t| t.h.as_mut().unwrap().dtype = DType::F16),
        Error::DTypeMismatch { tensor: "h", .. }
    );
    assert_matches!(
        err(&|t| t.weight.dtype = DType::F16),
        Error::DTypeMismatch {
            tensor: "weight",
            ..
        }
    );
    assert_matches!(
        err(&|t| t.rstd.as_mut().unwrap().dtype = DType::BF16),
        Error::DTypeMismatch { tensor: "rstd", .. }
    );
    // Shapes.
    assert_matches!(
        err(&|t| t.y = mat(3, d, 4, 65)),
        Error::ShapeMismatch { tensor: "y", .. }
    );
    assert_matches!(
        err(&|t| t.residual = Some(mat(1, d, 5, 64))),
        Error::ShapeMismatch {
            tensor: "residual",
            ..
        }
    );
    assert_matches!(
        err(&|t| t.h = Some(mat(4, d, 3, 64))),
        Error::ShapeMismatch { tensor: "h", .. }
    );
    assert_matches!(
        err(&|t| t.weight = mat(2, d, 1, 63)),
        Error::ShapeMismatch {
            tensor: "weight",
            ..
        }
    );
    assert_matches!(
        err(&|t| t.weight = mat(2, d, 2, 64)),
        Error::ShapeMismatch {
            tensor: "weight",
            ..
        }
    );
    assert_matches!(
        err(&|t| t.rstd = Some(mat(5, DType::F32, 5, 1))),
        Error::ShapeMismatch { tensor: "rstd", .. }
    );
    assert_matches!(
        err(&|t| t.rstd = Some(mat(5, DType::F32, 4, 2))),
        Error::ShapeMismatch { tensor: "rstd", .. }
    );
    // Layout.
    assert_matches!(
        err(&|t| t.x.col_stride = 2),
        Error::NonUnitLastStride {
            tensor: "x",
            stride: 2
        }
    );
    assert_matches!(
        err(&|t| t.y.row_stride = 63),
        Error::RowStrideTooSmall { tensor: "y", .. }
    );
    assert_matches!(
        err(&|t| t.h.as_mut().unwrap().len = 4 * 64 - 1),
        Error::BufferTooSmall { tensor: "h", .. }
    );
    assert_matches!(
        err(&|t| t.weight.len = 63),
        Error::BufferTooSmall {
            tensor: "weight",
            ..
        }
    );
    assert_matches!(
        err(&|t| t.rstd.as_mut().unwrap().len = 3),
        Error::BufferTooSmall { tensor: "rstd", .. }
    );
    assert_matches!(
        err(&|t| t.x.addr += 1),
        Error::Misaligned { tensor: "x", .. }
    );
    assert_matches!(
        err(&|t| t.residual.as_mut().unwrap().addr += 1),
        Error::Misaligned {
            tensor: "residual",
            ..
        }
    );
    assert_matches!(
        err(&|t| t.rstd.as_mut().unwrap().addr += 2),
        Error::Misaligned { tensor: "rstd", .. }
    );
    assert_matches!(
        err(&|t| {
            t.weight.dtype = DType::F32;
            t.weight.addr += 2;
        }),
        Error::Misaligned {
            tensor: "weight",
            ..
        }
    );
    // Residual and h come together.
    assert_matches!(
        err(&|t| t.h = None),
        Error::InvalidArgument { what: "h", .. }
    );
    assert_matches!(
        err(&|t| t.residual = None),
        Error::InvalidArgument { what: "h", .. }
    );
    // More rows than a grid can have.
    let mut t = fwd_descs(DType::F32, 1, 1, false);
    t.x = MatDesc::contiguous(addr(0), 1 << 35, DType::F32, 1 << 35, 1);
    t.y = MatDesc::contiguous(addr(3), 1 << 35, DType::F32, 1 << 35, 1);
    t.rstd = None;
    assert_matches!(fwd(&t), Err(Error::TooLarge { what: "rows", .. }));
}

#[test]
fn forward_allows_exactly_the_documented_placements() {
    let d = DType::F16;
    let (rows, hidden) = (6, 256);
    let base = fwd_descs(d, rows, hidden, true);
    let ok = |t: &RmsNormFwdDescs| fwd(t).map(|_| ()).map_err(|e| format!("{e}"));
    let alias = |t: &RmsNormFwdDescs| match fwd(t) {
        Err(Error::Aliasing { output, other }) => (output, other),
        r => panic!("expected an aliasing error, got {:?}", r.map(|l| l.kernel)),
    };
    let x = base.x;
    let r = base.residual.unwrap();
    // Allowed: h over x, h over residual, y over x, y over x with h over residual (vLLM).
    ok(&RmsNormFwdDescs { h: Some(x), ..base }).unwrap();
    ok(&RmsNormFwdDescs { h: Some(r), ..base }).unwrap();
    ok(&RmsNormFwdDescs { y: x, ..base }).unwrap();
    ok(&RmsNormFwdDescs {
        y: x,
        h: Some(r),
        ..base
    })
    .unwrap();
    // Plain RMSNorm in place.
    let plain = fwd_descs(d, rows, hidden, false);
    ok(&RmsNormFwdDescs {
        y: plain.x,
        ..plain
    })
    .unwrap();
    // x and residual may overlap each other (both only read), and the weight may sit in x.
    ok(&RmsNormFwdDescs {
        residual: Some(x),
        ..base
    })
    .unwrap();
    ok(&RmsNormFwdDescs {
        weight: MatDesc { rows: 1, ..x },
        ..base
    })
    .unwrap();

    // Rejected.
    assert_eq!(alias(&RmsNormFwdDescs { y: r, ..base }), ("y", "residual"));
    assert_eq!(
        alias(&RmsNormFwdDescs {
            y: x,
            h: Some(x),
            ..base
        }),
        ("y", "h")
    );
    let h = base.h.unwrap();
    assert_eq!(alias(&RmsNormFwdDescs { y: h, ..base }), ("y", "h"));
    // A one-row operand may carry any row stride, one shorter than its row too (validation
    // ignores it): a weight that partly overlaps a one-row x written over by y still
    // overlaps it.
    let one = fwd_descs(d, 1, hidden, false);
    let x1 = MatDesc {
        row_stride: 3,
        ..one.x
    };
    let w1 = MatDesc {
        addr: x1.addr + 2 * 47,
        ..x1
    };
    assert_eq!(
        alias(&RmsNormFwdDescs {
            x: x1,
            y: x1,
            weight: w1,
            ..one
        }),
        ("y", "weight")
    );
    // Partial overlaps: one row down, half a row over.
    let shifted = MatDesc {
        addr: x.addr + (hidden * 2) as u64,
        ..x
    };
    assert_eq!(alias(&RmsNormFwdDescs { y: shifted, ..base }), ("y", "x"));
    assert_eq!(
        alias(&RmsNormFwdDescs {
            h: Some(shifted),
            ..base
        }),
        ("h", "x")
    );
    let half = MatDesc {
        addr: r.addr + hidden as u64,
        ..r
    };
    assert_eq!(
        alias(&RmsNormFwdDescs {
            h: Some(half),
            ..base
        }),
        ("h", "residual")
    );
    // Same address, other stride: not the same place.
    let restrided = MatDesc {
        row_stride: hidden + 8,
        len: rows * (hidden + 8),
        ..x
    };
    assert_eq!(
        alias(&RmsNormFwdDescs {
            y: restrided,
            ..base
        }),
        ("y", "x")
    );
    // Outputs over the weight or over rstd.
    let w_as_y = MatDesc {
        addr: base.weight.addr,
        len: rows * hidden,
        ..x
    };
    assert_eq!(
        alias(&RmsNormFwdDescs { y: w_as_y, ..base }),
        ("y", "weight")
    );
    assert_eq!(
        alias(&RmsNormFwdDescs {
            h: Some(w_as_y),
            ..base
        }),
        ("h", "weight")
    );
    let rstd_in_y = MatDesc::contiguous(base.y.addr, rows, DType::F32, rows, 1);
    assert_eq!(
        alias(&RmsNormFwdDescs {
            rstd: Some(rstd_in_y),
            ..base
        }),
        ("y", "rstd")
    );
    let rstd_in_x = MatDesc::contiguous(x.addr + 64, rows, DType::F32, rows, 1);
    assert_eq!(
        alias(&RmsNormFwdDescs {
            rstd: Some(rstd_in_x),
            ..base
        }),
        ("rstd", "x")
    );
    let rstd_in_h = MatDesc::contiguous(h.addr, rows, DType::F32, rows, 1);
    assert_eq!(
        alias(&RmsNormFwdDescs {
            rstd: Some(rstd_in_h),
            ..base
        }),
        ("h", "rstd")
    );
    // h over x while the residual overlaps x without being it.
    let r_shift = MatDesc {
        addr: x.addr + 2,
        ..x
    };
    assert_eq!(
        alias(&RmsNormFwdDescs {
            residual: Some(r_shift),
            h: Some(x),
            ..base
        }),
        ("h", "residual")
    );
}

#[test]
fn backward_rejects_bad_descriptions_and_aliasing() {
    let d = DType::BF16;
    let (rows, hidden) = (5, 600);
    let base = bwd_descs(d, rows, hidden, true);
    let err = |f: &dyn Fn(&mut RmsNormBwdDescs)| {
        let mut t = base;
        f(&mut t);
        plan_rmsnorm_backward(&t, &opts()).unwrap_err()
    };
    // The storage dtype is dy's: another operand of the old one mismatches.
    assert_matches!(
        err(&|t| t.dy.dtype = DType::F16),
        Error::DTypeMismatch {
            tensor: "h",
            expected: DType::F16,
            got: DType::BF16
        }
    );
    assert_matches!(
        err(&|t| t.h.dtype = DType::F16),
        Error::DTypeMismatch { tensor: "h", .. }
    );
    assert_matches!(
        err(&|t| t.dx.dtype = DType::F16),
        Error::DTypeMismatch { tensor: "dx", .. }
    );
    assert_matches!(
        err(&|t| t.dres.as_mut().unwrap().dtype = DType::F16),
        Error::DTypeMismatch { tensor: "dres", .. }
    );
    assert_matches!(
        err(&|t| t.weight.dtype = DType::F16),
        Error::DTypeMismatch {
            tensor: "weight",
            ..
        }
    );
    assert_matches!(
        err(&|t| t.dw.dtype = DType::F32),
        Error::DTypeMismatch { tensor: "dw", .. }
    );
    assert_matches!(
        err(&|t| t.rstd.dtype = DType::BF16),
        Error::DTypeMismatch { tensor: "rstd", .. }
    );
    assert_matches!(
        err(&|t| t.workspace.dtype = DType::F16),
        Error::DTypeMismatch {
            tensor: "workspace",
            ..
        }
    );
    assert_matches!(
        err(&|t| t.h = mat(1, d, rows, hidden + 1)),
        Error::ShapeMismatch { tensor: "h", .. }
    );
    assert_matches!(
        err(&|t| t.dx = mat(5, d, rows + 1, hidden)),
        Error::ShapeMismatch { tensor: "dx", .. }
    );
    assert_matches!(
        err(&|t| t.dres = Some(mat(4, d, 1, hidden))),
        Error::ShapeMismatch { tensor: "dres", .. }
    );
    assert_matches!(
        err(&|t| t.dw = mat(6, d, 1, hidden - 1)),
        Error::ShapeMismatch { tensor: "dw", .. }
    );
    assert_matches!(
        err(&|t| t.rstd = mat(3, DType::F32, rows - 1, 1)),
        Error::ShapeMismatch { tensor: "rstd", .. }
    );
    assert_matches!(
        err(&|t| t.dy.addr += 1),
        Error::Misaligned { tensor: "dy", .. }
    );
    assert_matches!(
        err(&|t| t.workspace.addr += 2),
        Error::Misaligned {
            tensor: "workspace",
            ..
        }
    );
    assert_matches!(
        err(&|t| t.dx.col_stride = 3),
        Error::NonUnitLastStride { tensor: "dx", .. }
    );

    let ok = |t: &RmsNormBwdDescs| bwd(t).map(|_| ()).unwrap();
    let alias = |t: &RmsNormBwdDescs| match bwd(t) {
        Err(Error::Aliasing { output, other }) => (output, other),
        r => panic!(
            "expected an aliasing error, got {:?}",
            r.map(|p| p.rows.kernel)
        ),
    };
    ok(&RmsNormBwdDescs {
        dx: base.dy,
        ..base
    });
    ok(&RmsNormBwdDescs {
        dx: base.dres.unwrap(),
        ..base
    });
    assert_eq!(alias(&RmsNormBwdDescs { dx: base.h, ..base }), ("dx", "h"));
    let w_as_dw = MatDesc {
        dtype: d,
        ..base.weight
    };
    assert_eq!(
        alias(&RmsNormBwdDescs {
            dw: w_as_dw,
            ..base
        }),
        ("dw", "weight")
    );
    let ws_in_dy = MatDesc {
        addr: base.dy.addr,
        ..base.workspace
    };
    assert_eq!(
        alias(&RmsNormBwdDescs {
            workspace: ws_in_dy,
            ..base
        }),
        ("workspace", "dy")
    );
    let ws_in_dx = MatDesc {
        addr: base.dx.addr + 1024,
        ..base.workspace
    };
    assert_eq!(
        alias(&RmsNormBwdDescs {
            workspace: ws_in_dx,
            ..base
        }),
        ("dx", "workspace")
    );
    let dw_in_ws = MatDesc {
        addr: base.workspace.addr,
        ..base.dw
    };
    assert_eq!(
        alias(&RmsNormBwdDescs {
            dw: dw_in_ws,
            ..base
        }),
        ("dw", "workspace")
    );
    let rstd_as_dw = MatDesc::contiguous(base.rstd.addr, hidden, d, 1, hidden);
    assert_eq!(
        alias(&RmsNormBwdDescs {
            dw: rstd_as_dw,
            ..base
        }),
        ("dw", "rstd")
    );
}

/// A kernel's PTX launch bounds (`.maxntid`) admit the largest block the host launches it with:
/// a launch beyond them fails. Where they ask for several blocks per SM, those blocks' registers
/// fit the register file.
#[test]
fn launch_bounds_admit_every_launch() {
    for k in KernelId::ALL {
        let Some((max_threads, blocks_per_sm)) = k.launch_bounds() else {
            continue;
        };
        assert!(
            max_threads >= k.max_block_threads(),
            "{}: .maxntid {max_threads} below its largest block, {}",
            k.name(),
            k.max_block_threads()
        );
        if blocks_per_sm > 0 {
            // ptxas then takes at most 65536 / (threads * blocks) registers, which must leave
            // a useful budget (at least 32 per thread).
            assert!(
                65536 / (max_threads * blocks_per_sm) >= 32,
                "{}: {blocks_per_sm} blocks of {max_threads} per SM",
                k.name()
            );
        }
    }
}

#[test]
fn kernel_table_holds_every_norm_entry() {
    let mut names = std::collections::HashSet::new();
    let mut count = 0;
    for (i, k) in KernelId::ALL.iter().enumerate() {
        assert_eq!(k.index(), i);
        assert!(names.insert(k.name()), "duplicate name {}", k.name());
        match k {
            KernelId::RmsNormFwd(d, m, v) => {
                count += 1;
                let m = if *m == VecMode::V16 { "v16" } else { "scalar" };
                let v = match v {
                    NormFwdVariant::E16 => "e16",
                    NormFwdVariant::E32 => "e32",
                    NormFwdVariant::Loop => "loop",
                };
                assert_eq!(k.name(), format!("rmsnorm_fwd_{}_{m}_{v}", d.name()));
            }
            KernelId::RmsNormBwd(d, m, v) => {
                count += 1;
                let m = if *m == VecMode::V16 { "v16" } else { "scalar" };
                let v = if *v == NormBwdVariant::E16 {
                    "e16"
                } else {
                    "loop"
                };
                assert_eq!(k.name(), format!("rmsnorm_bwd_{}_{m}_{v}", d.name()));
            }
            KernelId::RmsNormDw(d) => {
                count += 1;
                assert_eq!(k.name(), format!("rmsnorm_dw_{}", d.name()));
            }
            _ => {}
        }
    }
    assert_eq!(count, 18 + 12 + 3);
}

/// With clusters, looped rows at up to three eighths as many rows as multiprocessors (49 of
/// 132) take the split forward: one cluster per row, one tile per block up to 8 tiles (16
/// where the device runs clusters of 16), two up to 16, the
/// same form (memory path, looped) and parameters as the looped kernel, its own shared
/// memory; on the vector path and, for rows off the 16-byte grid, on the realigned or the
/// scalar one; on the realigned path up to one row per multiprocessor, and f32 rows at any
/// number (see also `split_forward_takes_more_rows_of_an_f32_weight`). Never without
/// clusters or for shorter rows. Off the grid the looped kernel is the realigned one where
/// the weight is aligned.
#[test]
fn split_forward_plan() {
    use ferrofuse_common::{
        RMSNORM_SPLIT_SMEM_BYTES, rmsnorm_fwd_tiles, rmsnorm_split_geometry,
        rmsnorm_split_smem_bytes,
    };
    let opts = opts();
    for (dtype, wide) in DType::ALL.into_iter().flat_map(|d| [(d, false), (d, true)]) {
        // Clusters of up to 8 blocks, or 16 where the device runs them.
        let cl = limits().with_clusters(true).with_wide_clusters(wide);
        let most = if wide { 16 } else { 8 };
        for hidden in [
            16384usize, 16392, 20000, 32768, 65536, 65544, 100000, 131072, 131080, 262144,
        ] {
            let tiles = rmsnorm_fwd_tiles(dtype, hidden as u64);
            let (variant, geometry) = rmsnorm_forward_geometry(dtype, hidden);
            let geom = rmsnorm_split_geometry(dtype, hidden as u64, wide);
            let what = format!("{dtype:?} H={hidden} wide {wide}");
            match geom {
                None => assert!(variant != NormFwdVariant::Loop || tiles > 16, "{what}"),
                Some((v, n)) => {
                    assert_eq!(variant, NormFwdVariant::Loop, "{what}");
                    let per_block = if v == NormFwdVariant::E16 { 1 } else { 2 };
                    assert!(n as u64 * per_block >= tiles && n <= most, "{what}");
                    assert!((n as u64 - 1) * per_block < tiles, "{what}: an empty block");
                    assert_eq!(per_block == 1, tiles <= most as u64, "{what}");
                }
            }
            for rows in [1usize, 2, 7, 32, 33, 34, 49, 50, 64, 132, 133, 1000, 70000] {
                let t = fwd_descs(dtype, rows, hidden, true);
                let looped = plan_rmsnorm_forward(&t, &opts, &limits()).unwrap();
                let l = plan_rmsnorm_forward(&t, &opts, &cl).unwrap();
                let what = format!("{what} rows={rows}");
                assert_eq!(l.params, looped.params, "{what}");
                assert_eq!(l.block, looped.block, "{what}");
                assert_eq!(
                    l.kernel.rmsnorm_forward_form(),
                    looped.kernel.rmsnorm_forward_form(),
                    "{what}"
                );
                match geom {
                    Some((v, n)) if rows <= 49 => {
                        assert_eq!(
                            l.kernel,
                            KernelId::RmsNormFwdSplit(dtype, NormPath::V16, v),
                            "{what}"
                        );
                        assert_eq!(l.grid as usize, rows * n as usize, "{what}");
                        assert_eq!(l.shared_mem_bytes, RMSNORM_SPLIT_SMEM_BYTES, "{what}");
                        assert_eq!(geometry.threads_per_row, RMSNORM_MAX_THREADS_PER_ROW);
                    }
                    _ => assert_eq!(l, looped, "{what}"),
                }
                // Off the vector grid: the looped scalar kernel, or where the vector one is
                // split, the split on the realigned path (16-byte aligned weight, staging
                // within its limit) or the scalar one.
                for w_aligned in [true, false] {
                    let mut t = t;
                    t.x.addr += dtype.size_bytes() as u64;
                    if !w_aligned {
                        t.weight.addr += dtype.size_bytes() as u64;
                    }
                    let what = format!("{what} weight aligned {w_aligned}");
                    let looped = plan_rmsnorm_forward(&t, &opts, &limits()).unwrap();
                    let s = plan_rmsnorm_forward(&t, &opts, &cl).unwrap();
                    if variant == NormFwdVariant::Loop {
                        let one_block = if w_aligned {
                            NormPath::Realigned
                        } else {
                            NormPath::Scalar
                        };
                        assert_eq!(
                            looped.kernel.rmsnorm_forward_form(),
                            Some((dtype, one_block, variant)),
                            "{what}"
                        );
                    }
                    assert_eq!(s.params, looped.params, "{what}");
                    let realigned = geom
                        .and_then(|(v, _)| rmsnorm_split_smem_bytes(dtype, NormPath::Realigned, v));
                    let path = if w_aligned && realigned.is_some() {
                        NormPath::Realigned
                    } else {
                        NormPath::Scalar
                    };
                    // The realigned split up to one row per multiprocessor, and at any number
                    // of rows for f32 (where the looped realigned kernel was the slower).
                    let split_rows = match path {
                        NormPath::Realigned if dtype == DType::F32 => usize::MAX,
                        NormPath::Realigned => 132,
                        _ => 49,
                    };
                    match geom {
                        Some((v, n)) if rows <= split_rows => {
                            assert_eq!(
                                s.kernel,
                                KernelId::RmsNormFwdSplit(dtype, path, v),
                                "{what}"
                            );
                            assert_eq!(s.grid as usize, rows * n as usize, "{what}");
                            assert_eq!(
                                Some(s.shared_mem_bytes),
                                rmsnorm_split_smem_bytes(dtype, path, v),
                                "{what}"
                            );
                            // Only f32 slices of two tiles stage too much to realign.
                            assert_eq!(
                                realigned.is_none(),
                                dtype == DType::F32 && v == NormFwdVariant::E32,
                                "{what}"
                            );
                        }
                        _ => assert_eq!(s, looped, "{what}"),
                    }
                }
            }
        }
    }
}

/// The narrow split (on where the device runs clusters): one-tile rows on the vector path and
/// the 16-bit realigned path take the entries compiled for three blocks per multiprocessor
/// from 8 rows on, with the grid, block, shared memory and parameters of the split they
/// replace, and on the vector path rows of 8 tiles or more take the split up to half as many
/// rows as multiprocessors; fewer rows, two-tile rows, the scalar path and the f32 realigned
/// path plan as without it. Never without clusters.
#[test]
fn narrow_split_plan() {
    use ferrofuse_common::rmsnorm_split_geometry;
    let opts = opts();
    let base = limits().with_clusters(true).with_wide_clusters(true);
    let narrow = base.clone().with_narrow_split(true);
    assert!(
        !limits().with_narrow_split(true).narrow_split,
        "no clusters, no narrow split"
    );
    for dtype in DType::ALL {
        for hidden in [20000usize, 65536, 100000, 131072, 262144] {
            let geom = rmsnorm_split_geometry(dtype, hidden as u64, true);
            for rows in [1usize, 7, 8, 12, 15, 16, 49, 50, 66, 67, 132, 133, 1000] {
                for (off, w_off) in [(0, 0), (1, 0), (1, 1)] {
                    let mut t = fwd_descs(dtype, rows, hidden, true);
                    t.x.addr += (off * dtype.size_bytes()) as u64;
                    t.weight.addr += (w_off * dtype.size_bytes()) as u64;
                    let what = format!("{dtype:?} {rows}x{hidden} offsets {off} {w_off}");
                    let before = plan_rmsnorm_forward(&t, &opts, &base).unwrap();
                    let looped = plan_rmsnorm_forward(&t, &opts, &limits()).unwrap();
                    let got = plan_rmsnorm_forward(&t, &opts, &narrow).unwrap();
                    assert_eq!(got.params, before.params, "{what}");
                    assert_eq!(got.block, before.block, "{what}");
                    let form = before.kernel.rmsnorm_forward_form();
                    assert_eq!(got.kernel.rmsnorm_forward_form(), form, "{what}");
                    let one_tile = matches!(geom, Some((NormFwdVariant::E16, _)));
                    let want = match before.kernel {
                        _ if rows < 8 => before.kernel,
                        KernelId::RmsNormFwdSplit(_, NormPath::Realigned, _) if rows < 16 => {
                            before.kernel
                        }
                        KernelId::RmsNormFwdSplit(d, path, NormFwdVariant::E16)
                            if KernelId::RmsNormFwdSplitNarrow(d, path).exists() =>
                        {
                            KernelId::RmsNormFwdSplitNarrow(d, path)
                        }
                        KernelId::RmsNormFwd(d, VecMode::V16, NormFwdVariant::Loop)
                        | KernelId::RmsNormFwdLoopAhead(d, VecMode::V16)
                            if one_tile && rows <= 66 && geom.is_some_and(|(_, n)| n >= 8) =>
                        {
                            KernelId::RmsNormFwdSplitNarrow(d, NormPath::V16)
                        }
                        k => k,
                    };
                    assert_eq!(got.kernel, want, "{what}");
                    if want == before.kernel {
                        assert_eq!(got, before, "{what}");
                    } else if matches!(before.kernel, KernelId::RmsNormFwdSplit(..)) {
                        assert_eq!(got.grid, before.grid, "{what}");
                        assert_eq!(got.shared_mem_bytes, before.shared_mem_bytes, "{what}");
                    } else {
                        let (_, n) = geom.expect("a one-tile split");
                        assert_eq!(got.grid as usize, rows * n as usize, "{what}");
                        assert_eq!(looped.kernel, before.kernel, "{what}");
                    }
                }
            }
        }
    }
}

/// Looped rows on the vector and scalar paths take the loads-ahead kernel exactly in calls of
/// at most one row per two multiprocessors that the looped kernel would run (with clusters,
/// only past the split's rows), and never with it switched off; the launch is otherwise the
/// looped kernel's. The realigned path's looped kernel has no such form.
#[test]
fn loop_ahead_plan() {
    let opts = opts();
    for clusters in [false, true] {
        let on = limits().with_clusters(clusters);
        let off = on.clone().with_loop_ahead(false);
        for dtype in DType::ALL {
            for hidden in [20000usize, 49152, 140001] {
                for rows in [1usize, 49, 50, 66, 67, 132, 1000] {
                    for (off_x, w_off) in [(0, 0), (1, 0), (1, 1)] {
                        let mut t = fwd_descs(dtype, rows, hidden, true);
                        t.x.addr += (off_x * dtype.size_bytes()) as u64;
                        t.weight.addr += (w_off * dtype.size_bytes()) as u64;
                        let what = format!(
                            "{dtype:?} {rows}x{hidden} offsets {off_x} {w_off} clusters {clusters}"
                        );
                        let looped = plan_rmsnorm_forward(&t, &opts, &off).unwrap();
                        let got = plan_rmsnorm_forward(&t, &opts, &on).unwrap();
                        let want = match looped.kernel {
                            KernelId::RmsNormFwd(d, mode, NormFwdVariant::Loop)
                                if rows * 2 <= 132 =>
                            {
                                KernelId::RmsNormFwdLoopAhead(d, mode)
                            }
                            k => {
                                assert!(
                                    !matches!(k, KernelId::RmsNormFwdLoopAhead(..)),
                                    "{what}: switched off, planned {k:?}"
                                );
                                k
                            }
                        };
                        assert_eq!(got.kernel, want, "{what}");
                        assert_eq!(
                            ferrofuse::Launch {
                                kernel: want,
                                ..looped
                            },
                            got,
                            "{what}: the same launch"
                        );
                        // The vector path, or the scalar one (the weight off its alignment).
                        let vector = off_x == 0 && hidden % 2 == 0;
                        if !clusters && (vector || w_off == 1) && rows <= 66 {
                            assert!(
                                matches!(got.kernel, KernelId::RmsNormFwdLoopAhead(..)),
                                "{what}: planned {:?}",
                                got.kernel
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Off the grid, 16-bit rows with an f32 weight have no looped realigned kernel: there the
/// realigned split takes any number of rows (its weight aligned), not the scalar kernel.
#[test]
fn split_forward_takes_more_rows_of_an_f32_weight() {
    let cl = limits().with_clusters(true);
    for dtype in [DType::F16, DType::BF16] {
        for rows in [1usize, 34, 1000] {
            for w_aligned in [true, false] {
                let mut t = fwd_descs(dtype, rows, 65535, true);
                t.weight = mat(2, DType::F32, 1, 65535);
                if !w_aligned {
                    t.weight.addr += 4;
                }
                let l = plan_rmsnorm_forward(&t, &opts(), &cl).unwrap();
                let want = match (w_aligned, rows <= 49) {
                    (true, _) => {
                        KernelId::RmsNormFwdSplit(dtype, NormPath::Realigned, NormFwdVariant::E16)
                    }
                    (false, true) => {
                        KernelId::RmsNormFwdSplit(dtype, NormPath::Scalar, NormFwdVariant::E16)
                    }
                    (false, false) => {
                        KernelId::RmsNormFwd(dtype, VecMode::Scalar, NormFwdVariant::Loop)
                    }
                };
                assert_eq!(l.kernel, want, "{dtype:?} rows={rows} aligned={w_aligned}");
            }
        }
    }
}

/// A non-empty operand at address 0 is rejected, optional ones included: the kernels read a
/// null residual, dres or rstd as absent, so accepting one would silently change the op.
#[test]
fn null_operands_are_rejected() {
    let d = DType::BF16;
    let null = |m: MatDesc| MatDesc { addr: 0, ..m };
    let fwd_case = fwd_descs(d, 4, 256, true);
    let bwd_case = bwd_descs(d, 4, 256, true);
    let cases: Vec<(&str, Result<(), Error>)> = vec![
        (
            "x",
            fwd(&RmsNormFwdDescs {
                x: null(fwd_case.x),
                ..fwd_case
            })
            .map(|_| ()),
        ),
        (
            "residual",
            fwd(&RmsNormFwdDescs {
                residual: fwd_case.residual.map(null),
                ..fwd_case
            })
            .map(|_| ()),
        ),
        (
            "rstd",
            fwd(&RmsNormFwdDescs {
                rstd: fwd_case.rstd.map(null),
                ..fwd_case
            })
            .map(|_| ()),
        ),
        (
            "dres",
            plan_rmsnorm_backward(
                &RmsNormBwdDescs {
                    dres: bwd_case.dres.map(null),
                    ..bwd_case
                },
                &opts(),
            )
            .map(|_| ()),
        ),
    ];
    for (name, r) in cases {
        match r {
            Err(Error::InvalidArgument { value, .. }) => assert_eq!(value, name),
            r => panic!("{name} at address 0: expected InvalidArgument, got {r:?}"),
        }
    }
    // An empty operand has no address to check.
    fwd(&RmsNormFwdDescs {
        x: MatDesc {
            rows: 0,
            ..null(fwd_case.x)
        },
        residual: None,
        h: None,
        rstd: None,
        y: MatDesc {
            rows: 0,
            ..fwd_case.y
        },
        ..fwd_case
    })
    .unwrap();
}

/// The occupancy the backward's grid is sized by, as CUDA's occupancy calculator counts it for
/// sm_90: registers per warp in units of 256, warps in groups of four, 1 KiB of shared memory
/// reserved per block.
#[test]
fn blocks_per_multiprocessor_as_the_occupancy_calculator() {
    // (registers, threads, shared memory) -> blocks
    for (registers, threads, smem, blocks) in [
        (128, 512, 0, 1),
        (128, 256, 0, 2),
        (128, 288, 0, 1),
        // 18 warps' registers, but warps go in fours: 16, one block of 9 warps.
        (112, 288, 0, 1),
        (96, 288, 0, 2),
        (96, 320, 0, 2),
        (96, 352, 0, 1),
        (64, 160, 0, 6),
        (64, 32, 0, 32),
        (32, 32, 0, 32),
        (255, 32, 0, 8),
        (32, 32, 100 * 1024, 2),
        (96, 160, 61_696, 3),
    ] {
        assert_eq!(
            blocks_per_sm(registers, threads, smem),
            blocks,
            "{registers} registers x {threads} threads, {smem} bytes"
        );
    }
}

/// f32 rows of 2561-3072 and 4097-6144 elements run the backward on a narrow entry (the same
/// code at fewer registers): at 96 registers three blocks of 192 threads and two of 288 or 320
/// per SM, at 80 two of 352 or 384; in two launches on the occupancy grid (four row groups per
/// block or more, eight at 80 registers), on and off the 16-byte grid, and in one launch on
/// the vector path from 128 row groups (200 at 80 registers); every other call on the others.
#[test]
fn narrow_backward_entry_for_the_blocks_it_fits_more_of() {
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        for hidden in (1..=8192).step_by(3) {
            let plan = bwd(&bwd_descs(dtype, 100_000, hidden, true)).unwrap();
            let want = match hidden {
                _ if dtype != DType::F32 => None,
                2561..=3072 | 4097..=5120 => Some(BwdNarrow::R96),
                5121..=6144 => Some(BwdNarrow::R80),
                _ => None,
            };
            // Rows off the 16-byte grid run the staged scalar body's entries.
            let mode = if hidden % 4 == 0 {
                VecMode::V16
            } else {
                VecMode::Scalar
            };
            let got = match plan.rows.kernel {
                KernelId::RmsNormBwdNarrow(d, m, budget) if d == dtype && m == mode => Some(budget),
                _ => None,
            };
            assert_eq!(got, want, "{dtype:?} x {hidden}: {:?}", plan.rows.kernel);
        }
    }
    // One launch: the 128-register entry below 128 row groups (200 at 80 registers) and off
    // the 16-byte grid.
    let fused = |rows, hidden| bwd(&bwd_descs(DType::F32, rows, hidden, false)).unwrap();
    let wide = KernelId::RmsNormBwdFused(DType::F32, VecMode::V16);
    let narrow = |budget| KernelId::RmsNormBwdFusedNarrow(DType::F32, budget);
    for (rows, hidden, kernel) in [
        (7, 4608, wide),
        (127, 4608, wide),
        (128, 4608, narrow(BwdNarrow::R96)),
        (128, 3072, narrow(BwdNarrow::R96)),
        (199, 6144, wide),
        (200, 6144, narrow(BwdNarrow::R80)),
        (256, 8192, wide),
        (
            256,
            4607,
            KernelId::RmsNormBwdFused(DType::F32, VecMode::Scalar),
        ),
    ] {
        assert_eq!(fused(rows, hidden).rows.kernel, kernel, "{rows} x {hidden}");
    }
    // The occupancy grid: 128 x 3 blocks of 192 threads from 1536 row groups on, 128 x 2 of
    // 288 from 1024, 128 x 2 of 384 from 2048; below, the power-of-two grid on the
    // 128-register kernel (the same 256 blocks of 384 threads).
    let wide = KernelId::RmsNormBwd(DType::F32, VecMode::V16, NormBwdVariant::E16);
    let narrow = |budget| KernelId::RmsNormBwdNarrow(DType::F32, VecMode::V16, budget);
    for (rows, hidden, kernel, blocks) in [
        (1535, 3072, wide, 512),
        (1536, 3072, narrow(BwdNarrow::R96), 384),
        (1023, 4608, wide, 256),
        (1024, 4608, narrow(BwdNarrow::R96), 256),
        (2047, 6144, wide, 256),
        (2048, 6144, narrow(BwdNarrow::R80), 256),
        (100_000, 8192, wide, 256),
    ] {
        let plan = bwd(&bwd_descs(DType::F32, rows, hidden, false)).unwrap();
        assert_eq!(plan.rows.kernel, kernel, "{rows} x {hidden}");
        assert_eq!(plan.rows.grid, blocks, "{rows} x {hidden}");
    }
}
