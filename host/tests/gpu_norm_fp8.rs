//! GPU tests of add + RMSNorm with FP8 E4M3 outputs: every dtype x placement x scaling scheme
//! (static, with a scale that saturates some values; per token, with and without an upper
//! bound; per group of 128 row-major and of 64 column-major), vector and scalar paths, the
//! 16- and 32-per-thread geometries and the looped one (rows of more than 16384 elements),
//! Gemma and Hugging Face numerics, an f32 weight.
//!
//! Checks per case:
//! - **bit for bit** against the reference quantisation (`reference::fp8::quantize_rows`) of
//!   the f32 `y` the kernels compute (`reference::rmsnorm_y_f32`, from the kernel's own
//!   `rstd`): bytes and scales equal (any NaN byte matches any NaN byte); `h` equal to the f64
//!   reference's stored `h`;
//! - **against the f64 reference**: `rstd` within 1e-5 relative, each byte within one E4M3
//!   step of `e4m3(y64 / scale)`;
//! - outputs poisoned before the call: the padding of `y` stays untouched.
//!
//! Rows of zeros (scale `min_scale`, zero bytes), a row with a NaN (NaN bytes) and, in bf16
//! and f32, a row whose sum of squares overflows (`rstd` 0) are in every case. Batch
//! invariance: rows computed alone, at an offset (scalar path) and in a batch give the same
//! bytes, scales, `h` and `rstd`; so do the streamed kernel (rows of 32 per thread past one
//! wave, sm_90) and the register kernel on the same rows. `FERROFUSE_TEST_QUICK=1` trims the
//! shapes.

mod common;

use std::sync::Arc;

use common::fp8::*;
use common::*;
use ferrofuse::cudarc::driver::{CudaSlice, CudaStream};
use ferrofuse::fp8::DEFAULT_MIN_SCALE;
use ferrofuse::half::{bf16, f16};
use ferrofuse::norm::{
    Fp8Placement, RmsNormFp8Descs, plan_rmsnorm_forward_fp8, rmsnorm_forward_geometry,
};
use ferrofuse::reference::fp8::{e4m3_bits, e4m3_value, quantize_rows};
use ferrofuse::reference::{RmsNormRef, rmsnorm_forward_row, rmsnorm_y_f32};
use ferrofuse::{
    DType, Element, F8E4M3, Fp8Scales, Fp8Scaling, KernelId, Kernels, Mat, MatDesc, MatMut,
    NormNumerics, NormPath, RmsNormOptions, ScaleLayout, VecMode,
};
use rand::rngs::StdRng;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Place {
    Norm,
    Add,
    AddHOverX,
    AddHOverResidual,
}

const PLACES: [Place; 4] = [
    Place::Norm,
    Place::Add,
    Place::AddHOverX,
    Place::AddHOverResidual,
];

fn shapes() -> Vec<(usize, usize)> {
    if quick() {
        return vec![(3, 384), (2, 16384), (5, 100), (2, 20480)];
    }
    vec![
        (1, 128),
        (3, 384),
        (5, 100),
        (7, 4097),
        (4, 8192),
        (3, 12288),
        (2, 16384),
        (33, 1024),
        (300, 256),
        (64, 4096),
        (2, 7),
        (9, 2048),
        // Looped rows: more than one tile, a multiple of both group widths, odd.
        (3, 16512),
        (2, 40960),
        (2, 20001),
    ]
}

/// The inputs of a call: x, residual, the weight, and the weight as f32 to pass instead.
type Inputs<'v, T> = (&'v [T], &'v [T], &'v [T], Option<&'v [f32]>);

/// What one FP8 call returned.
struct Out<T> {
    /// `rows x cols` bytes (padding checked and dropped).
    q: Vec<u8>,
    /// Row-major scales (the static scale for `Static`).
    scales: Vec<f32>,
    /// `h` as stored (empty for `Norm`).
    h: Vec<T>,
    rstd: Vec<f32>,
}

/// Random `x` and residual of `rows x cols` in [-2, 2] and a weight of `cols` in [-1.5, 1.5].
fn random_rows<T: Element>(rng: &mut StdRng, rows: usize, cols: usize) -> (Vec<T>, Vec<T>, Vec<T>) {
    let (x, _) = random::<T>(rng, rows * cols, 2.0);
    let (r, _) = random::<T>(rng, rows * cols, 2.0);
    let (w, _) = random::<T>(rng, cols, 1.5);
    (x, r, w)
}

/// Where a call's operands start in their buffers, in elements: x, residual, h and `y`
/// (`data`), and the weight. Off the 16-byte grid the realigned kernel takes the call when
/// the weight is on it, the scalar kernel when it is not.
#[derive(Clone, Copy, Debug, PartialEq)]
struct At {
    data: usize,
    weight: usize,
}

/// Every operand at the start of its buffer: the vector path where the row length allows.
const ALIGNED: At = At { data: 0, weight: 0 };
/// The data one element in, the weight aligned: the realigned path.
const REALIGNED: At = At { data: 1, weight: 0 };
/// Every operand one element in: the scalar path.
const SCALAR: At = At { data: 1, weight: 1 };

/// Runs one FP8 forward with its operands `at` (see [`At`]), outputs poisoned; returns what
/// it wrote.
#[allow(clippy::too_many_arguments)]
fn call<T: Element>(
    k: &Kernels,
    s: &Arc<CudaStream>,
    place: Place,
    scaling: Fp8Scaling,
    static_scale: f32,
    (x, r, w, w32): Inputs<'_, T>,
    (rows, cols): (usize, usize),
    at: At,
    opts: &RmsNormOptions,
) -> Out<T> {
    let (n, off) = (rows * cols, at.data);
    let pad = |v: &[T]| {
        let mut out = vec![poison::<T>(); off];
        out.extend_from_slice(v);
        out
    };
    let mut dx = upload(s, &pad(x));
    let mut dr = upload(s, &pad(r));
    let mut dh = upload(s, &vec![poison::<T>(); n + off]);
    let dw = upload(s, &[vec![poison::<T>(); at.weight], w.to_vec()].concat());
    let dw32 = w32.map(|w| upload(s, &[vec![f32::NAN; at.weight], w.to_vec()].concat()));
    let y_stride = cols + 16;
    let mut dq = upload(s, &vec![F8E4M3::from_bits(0x7f); rows * y_stride + off]);
    let (sr, sc, s_stride) = scale_layout(scaling, rows, cols);
    let s_len = if sr == 0 { 0 } else { (sr - 1) * s_stride + sc };
    let mut ds = upload(s, &vec![f32::NAN; s_len.max(1)]);
    if scaling == Fp8Scaling::Static {
        ds = upload(s, &[static_scale]);
    }
    let mut drstd = upload(s, &vec![f32::NAN; rows]);
    {
        let mut y = MatMut::strided(dq.slice_mut(off..), rows, cols, y_stride);
        let mut rstd = MatMut::new(drstd.as_view_mut(), rows, 1);
        // Each placement's views of the buffers (an overwritten input borrowed mutably).
        let (mut mx, mut mr, mut mh, cx, cr);
        let io = match place {
            Place::Norm => {
                cx = Mat::new(dx.slice(off..), rows, cols);
                Fp8Placement::Norm { x: &cx }
            }
            Place::Add => {
                cx = Mat::new(dx.slice(off..), rows, cols);
                cr = Mat::new(dr.slice(off..), rows, cols);
                mh = MatMut::new(dh.slice_mut(off..), rows, cols);
                Fp8Placement::Add {
                    x: &cx,
                    residual: &cr,
                    h: &mut mh,
                }
            }
            Place::AddHOverX => {
                mx = MatMut::new(dx.slice_mut(off..), rows, cols);
                cr = Mat::new(dr.slice(off..), rows, cols);
                Fp8Placement::AddHOverX {
                    x: &mut mx,
                    residual: &cr,
                }
            }
            Place::AddHOverResidual => {
                cx = Mat::new(dx.slice(off..), rows, cols);
                mr = MatMut::new(dr.slice_mut(off..), rows, cols);
                Fp8Placement::AddHOverResidual {
                    x: &cx,
                    residual: &mut mr,
                }
            }
        };
        let static_m = Mat::new(ds.as_view(), 1, 1);
        let mut dyn_m;
        let scales = if scaling == Fp8Scaling::Static {
            Fp8Scales::Read(&static_m)
        } else {
            dyn_m = MatMut::strided(ds.as_view_mut(), sr, sc, s_stride);
            Fp8Scales::Write(&mut dyn_m)
        };
        let res = match &dw32 {
            Some(w) => k.rmsnorm_fp8(
                s,
                io,
                &Mat::new(w.slice(at.weight..), 1, cols),
                &mut y,
                scaling,
                scales,
                Some(&mut rstd),
                opts,
            ),
            None => k.rmsnorm_fp8(
                s,
                io,
                &Mat::new(dw.slice(at.weight..), 1, cols),
                &mut y,
                scaling,
                scales,
                Some(&mut rstd),
                opts,
            ),
        };
        res.expect("rmsnorm_fp8");
    }
    let q_all = download(s, &dq)[off..].to_vec();
    for rr in 0..rows {
        for c in cols..y_stride {
            assert_eq!(q_all[rr * y_stride + c].to_bits(), 0x7f, "padding of y");
        }
    }
    let q = (0..rows)
        .flat_map(|rr| {
            q_all[rr * y_stride..rr * y_stride + cols]
                .iter()
                .map(|v| v.to_bits())
        })
        .collect();
    let scales = if scaling == Fp8Scaling::Static {
        vec![static_scale]
    } else {
        scales_row_major(scaling, &download(s, &ds), rows, cols)
    };
    let h_buf: &CudaSlice<T> = match place {
        Place::Norm => &dh,
        Place::Add => &dh,
        Place::AddHOverX => &dx,
        Place::AddHOverResidual => &dr,
    };
    let h = if place == Place::Norm {
        Vec::new()
    } else {
        download(s, h_buf)[off..].to_vec()
    };
    Out {
        q,
        scales,
        h,
        rstd: download(s, &drstd),
    }
}

#[allow(clippy::too_many_arguments)]
fn case<T: Element>(
    k: &Kernels,
    s: &Arc<CudaStream>,
    rng: &mut StdRng,
    place: Place,
    at: At,
    scaling: Fp8Scaling,
    (rows, cols): (usize, usize),
    variant: usize,
) {
    let n = rows * cols;
    let (mut x, mut r, w) = random_rows::<T>(rng, rows, cols);
    if rows > 1 {
        x[..cols].fill(T::from_f64(0.0));
        r[..cols].fill(T::from_f64(0.0));
    }
    if rows > 2 {
        x[(rows - 1) * cols + cols / 2] = T::from_f64(f64::NAN);
    }
    // Row 1's sum of squares overflows f32 (not reachable in f16): `rstd` is 0 and `y` zero,
    // the f64 reference's `rstd` finite, so that row is checked against the f32 reference
    // only.
    let overflow_row = (rows > 3 && T::DTYPE != DType::F16).then_some(1);
    if let Some(o) = overflow_row {
        x[o * cols] = T::from_f64(3.0e38);
        r[o * cols] = T::from_f64(0.0);
    }
    let gemma = variant % 3 == 1;
    let hf = variant % 3 == 2 && T::DTYPE != DType::F32;
    let w_f32 = variant % 2 == 1;
    let opts = RmsNormOptions::new(1e-5)
        .with_gemma(gemma)
        .with_numerics(if hf {
            NormNumerics::HfLlama
        } else {
            NormNumerics::F32
        });
    let w32: Vec<f32> = w.iter().map(|v| v.to_f64() as f32).collect();
    // 448 * scale = 1.8: the larger values saturate (|y| reaches ~5).
    let static_scale = 0.004f32;
    let what = format!(
        "{} {place:?} {at:?} {scaling:?} {rows}x{cols} gemma {gemma} hf {hf} w_f32 {w_f32}",
        T::DTYPE.name()
    );
    let out = call(
        k,
        s,
        place,
        scaling,
        static_scale,
        (&x, &r, &w, w_f32.then_some(&w32[..])),
        (rows, cols),
        at,
        &opts,
    );
    let has_res = place != Place::Norm;
    let ref_opts = RmsNormRef {
        eps: 1e-5,
        gemma,
        hf,
        // Looped rows normalise `h` as stored.
        normalize_stored_h: rmsnorm_forward_geometry(T::DTYPE, cols).1.looped,
    };
    let mut y32 = Vec::with_capacity(n);
    let mut y64 = Vec::with_capacity(n);
    let wf: Vec<f64> = w.iter().map(|v| v.to_f64()).collect();
    for rr in 0..rows {
        let xs = &x[rr * cols..(rr + 1) * cols];
        let rs = has_res.then(|| &r[rr * cols..(rr + 1) * cols]);
        y32.extend(rmsnorm_y_f32(xs, rs, &w32, out.rstd[rr], &ref_opts));
        let row = rmsnorm_forward_row(xs, rs, &wf, &ref_opts);
        let nan_row = row.rstd.is_nan();
        if !nan_row && overflow_row != Some(rr) {
            let rel = (out.rstd[rr] as f64 - row.rstd).abs() / row.rstd;
            assert!(
                rel <= 1e-5,
                "{what}: row {rr} rstd {} vs {}",
                out.rstd[rr],
                row.rstd
            );
        }
        if has_res {
            for c in 0..cols {
                let (g, want) = (out.h[rr * cols + c].to_f64(), row.h[c]);
                assert!(
                    g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                    "{what}: h[{rr}, {c}] {g} vs {want}"
                );
            }
        }
        y64.extend(row.y);
    }
    // Bit for bit.
    let (want_q, want_s) =
        quantize_rows(&y32, rows, cols, reference_scaling(scaling, static_scale));
    for (i, (g, w)) in out.scales.iter().zip(&want_s).enumerate() {
        assert_eq!(
            g.to_bits(),
            w.to_bits(),
            "{what}: scale {i}: {g:e} != {w:e}"
        );
    }
    for (i, (&g, &w)) in out.q.iter().zip(&want_q).enumerate() {
        assert!(
            same_byte(g, w),
            "{what}: element ({}, {}): byte {g:#04x} != {w:#04x} (y = {:e})",
            i / cols,
            i % cols,
            y32[i]
        );
    }
    // Against the f64 reference, under the kernel's scales.
    let scale_of = |i: usize| -> f64 {
        let (rr, c) = (i / cols, i % cols);
        match scaling {
            Fp8Scaling::Static => static_scale as f64,
            Fp8Scaling::PerToken { .. } => out.scales[rr] as f64,
            Fp8Scaling::PerGroup { group, .. } => {
                out.scales[rr * (cols / group) + c / group] as f64
            }
        }
    };
    for (i, &g) in out.q.iter().enumerate() {
        if overflow_row == Some(i / cols) {
            continue;
        }
        if y64[i].is_nan() {
            assert!(g & 0x7f == 0x7f, "{what}: element {i}: NaN became {g:#04x}");
            continue;
        }
        let want = e4m3_bits(y64[i] / scale_of(i));
        let steps = ordinal(DType::F8E4M3, e4m3_value(g))
            .abs_diff(ordinal(DType::F8E4M3, e4m3_value(want)));
        assert!(
            steps <= 1,
            "{what}: element {i}: {} vs the f64 reference's {} ({steps} E4M3 steps)",
            e4m3_value(g),
            e4m3_value(want)
        );
    }
    if rows > 1 {
        assert!(
            out.q[..cols].iter().all(|&v| v & 0x7f == 0),
            "{what}: zero row"
        );
        if scaling != Fp8Scaling::Static {
            let per_row = out.scales.len() / rows;
            assert!(
                out.scales[..per_row]
                    .iter()
                    .all(|&v| v == DEFAULT_MIN_SCALE),
                "{what}: zero row's scales"
            );
        }
    }
    if let Some(o) = overflow_row {
        assert_eq!(out.rstd[o], 0.0, "{what}: overflowing row's rstd");
        assert!(
            out.q[o * cols..(o + 1) * cols]
                .iter()
                .all(|&v| v & 0x7f == 0),
            "{what}: overflowing row"
        );
    }
    if rows > 2 {
        let last = &out.q[(rows - 1) * cols..];
        assert!(last.iter().all(|&v| v & 0x7f == 0x7f), "{what}: NaN row");
    }
    if scaling == Fp8Scaling::Static && cols >= 64 {
        assert!(
            out.q.iter().any(|&v| v & 0x7f == 0x7e),
            "{what}: some values saturate to 448"
        );
    }
}

fn run(test: &'static str, at: At) {
    let Some((k, s)) = gpu(test) else { return };
    for dtype in DType::ALL {
        let (mut rng, seed) = rng();
        for (si, shape) in shapes().into_iter().enumerate() {
            for (ci, scaling) in schemes(shape.1).into_iter().enumerate() {
                let place = PLACES[(si + ci) % PLACES.len()];
                let body = std::panic::AssertUnwindSafe(|| {
                    typed!(
                        dtype,
                        case::<T>(&k, &s, &mut rng, place, at, scaling, shape, si + ci)
                    )
                });
                if let Err(p) = std::panic::catch_unwind(body) {
                    eprintln!("{test}: failed with seed {seed:#x}");
                    std::panic::resume_unwind(p);
                }
            }
        }
    }
}

#[test]
fn norm_fp8_vector_path() {
    run("norm_fp8_vector_path", ALIGNED);
}

#[test]
fn norm_fp8_realigned_path() {
    run("norm_fp8_realigned_path", REALIGNED);
}

#[test]
fn norm_fp8_scalar_path() {
    run("norm_fp8_scalar_path", SCALAR);
}

/// A row's bytes, scales, `h` and `rstd` are the same alone, at an offset (the realigned and
/// the scalar path) and at any position of a batch.
fn invariance<T: Element>(k: &Kernels, s: &Arc<CudaStream>, rng: &mut StdRng, cols: usize) {
    let rows = if quick() { 40 } else { 700 };
    let (x, r, w) = random_rows::<T>(rng, rows, cols);
    let opts = RmsNormOptions::new(1e-6);
    for scaling in [
        Fp8Scaling::per_token(),
        Fp8Scaling::per_group(128, ScaleLayout::RowMajor),
        Fp8Scaling::Static,
    ] {
        let batch = call(
            k,
            s,
            Place::Add,
            scaling,
            0.02,
            (&x, &r, &w, None),
            (rows, cols),
            ALIGNED,
            &opts,
        );
        let per = batch.scales.len() / rows;
        for rr in [0, 1, rows / 2, rows - 1] {
            let xs = &x[rr * cols..(rr + 1) * cols];
            let rs = &r[rr * cols..(rr + 1) * cols];
            for at in [ALIGNED, REALIGNED, SCALAR] {
                let alone = call(
                    k,
                    s,
                    Place::Add,
                    scaling,
                    0.02,
                    (xs, rs, &w, None),
                    (1, cols),
                    at,
                    &opts,
                );
                let what = format!("{} {scaling:?} H {cols} row {rr} {at:?}", T::DTYPE.name());
                assert_eq!(
                    alone.q,
                    batch.q[rr * cols..(rr + 1) * cols],
                    "{what}: bytes"
                );
                if scaling != Fp8Scaling::Static {
                    let (a, b) = (&alone.scales[..], &batch.scales[rr * per..(rr + 1) * per]);
                    assert!(
                        a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{what}: scales"
                    );
                }
                assert_eq!(
                    alone.rstd[0].to_bits(),
                    batch.rstd[rr].to_bits(),
                    "{what}: rstd"
                );
                let same_h = alone
                    .h
                    .iter()
                    .zip(&batch.h[rr * cols..(rr + 1) * cols])
                    .all(|(a, b)| a.to_f64().to_bits() == b.to_f64().to_bits());
                assert!(same_h, "{what}: h");
            }
        }
    }
}

#[test]
fn norm_fp8_batch_invariance() {
    let Some((k, s)) = gpu("norm_fp8_batch_invariance") else {
        return;
    };
    let sizes: &[usize] = if quick() {
        &[1024]
    } else {
        &[256, 4096, 8192, 16384, 20480]
    };
    for dtype in DType::ALL {
        let (mut rng, seed) = rng();
        for &cols in sizes {
            let body = std::panic::AssertUnwindSafe(|| {
                typed!(dtype, invariance::<T>(&k, &s, &mut rng, cols))
            });
            if let Err(p) = std::panic::catch_unwind(body) {
                eprintln!("norm_fp8_batch_invariance: failed with seed {seed:#x}");
                std::panic::resume_unwind(p);
            }
        }
    }
}

/// The streamed FP8 forward (rows of 32 elements per thread on the vector path, past one wave
/// of rows, sm_90): against the references (as every case), and bit for bit against the
/// register kernel on the same rows (the streaming turned off): bytes, scales, `h`, `rstd`.
#[test]
fn norm_fp8_streamed_rows() {
    let Some((k, s)) = gpu("norm_fp8_streamed_rows") else {
        return;
    };
    if !k.limits().streamed_rows {
        eprintln!("skipping norm_fp8_streamed_rows: no bulk copies");
        return;
    }
    let rows = k.limits().sm_count as usize + if quick() { 5 } else { 150 };
    for dtype in DType::ALL {
        // 16-bit rows of 8320 (288 threads) and f32 rows of 12288 (384 threads): 32 per thread.
        let cols = if dtype == DType::F32 { 12288 } else { 8320 };
        let (mut rng, seed) = rng();
        for (ci, scaling) in schemes(cols).into_iter().enumerate() {
            let place = PLACES[ci % PLACES.len()];
            let kernel = planned_kernel(&k, dtype, (rows, cols), scaling);
            assert_eq!(
                kernel,
                KernelId::RmsNormFp8Stream(dtype, kernel_scheme(scaling))
            );
            let body = std::panic::AssertUnwindSafe(|| {
                typed!(
                    dtype,
                    streamed_case::<T>(&k, &s, &mut rng, place, scaling, (rows, cols), ci)
                )
            });
            let result = std::panic::catch_unwind(body);
            k.set_row_streaming(true);
            if let Err(p) = result {
                eprintln!("norm_fp8_streamed_rows: failed with seed {seed:#x}");
                std::panic::resume_unwind(p);
            }
        }
    }
}

/// The cluster-split FP8 forward (looped rows at few rows, sm_90): against the references
/// (as every case), and bit for bit against the looped one-block kernel on the same rows (the
/// split turned off): bytes, scales, `h`, `rstd`; on the vector path, the realigned one (16-bit
/// rows off the grid: the data one element in, or rows of odd length whose every row starts
/// at another offset) and, with every operand one element in, the scalar one; clusters of 3
/// and 8 blocks, and where the device runs them clusters of 9, 13 and 16.
#[test]
fn norm_fp8_split_rows() {
    let Some((k, s)) = gpu("norm_fp8_split_rows") else {
        return;
    };
    if !k.limits().clusters {
        eprintln!("skipping norm_fp8_split_rows: no clusters");
        return;
    }
    let mut shapes = if quick() {
        vec![(2, 18432), (3, 18431)]
    } else {
        vec![(1, 18432), (5, 18432), (3, 65536), (5, 18431), (3, 65535)]
    };
    if k.limits().wide_clusters {
        // Tiles of 8192 elements: 73728 -> 9, 100003 -> 13, 131072 -> 16.
        shapes.extend(if quick() {
            &[(1, 73728)][..]
        } else {
            &[(2, 73728), (3, 100003), (2, 131072)][..]
        });
    }
    looped_form_cases("norm_fp8_split_rows", &k, &s, &shapes, LoopedForm::Split);
}

/// The looped FP8 forward with each tile's loads issued ahead (rows of more than 16384
/// elements, at most a row per two multiprocessors, here one row past the split's three blocks
/// per two multiprocessors, and rows of 17 tiles, which are never split): against the references
/// (as every case), and bit for bit against the looped kernel without loads ahead on the same
/// rows: bytes, scales, `h`, `rstd`; on the vector path and, with every operand one element
/// in, the scalar one.
#[test]
fn norm_fp8_loop_ahead_rows() {
    let Some((k, s)) = gpu("norm_fp8_loop_ahead_rows") else {
        return;
    };
    let sm = k.sm_count() as usize;
    // Tiles of 8192 elements (every dtype): 32768 -> 4, 57344 -> 7, 131080 -> 17.
    let past_split = |tiles: usize| sm * 3 / (2 * tiles) + 1;
    let shapes: Vec<(usize, usize)> = if quick() {
        vec![(past_split(4), 32768)]
    } else {
        vec![
            (past_split(4), 32768),
            (past_split(7), 57344),
            ((sm / 2).min(16), 131080),
        ]
    };
    looped_form_cases(
        "norm_fp8_loop_ahead_rows",
        &k,
        &s,
        &shapes,
        LoopedForm::Ahead,
    );
}

/// A form of the looped FP8 forward that a switch of [`Kernels`] turns off, the looped kernel
/// then computing the same bits.
#[derive(Clone, Copy, PartialEq)]
enum LoopedForm {
    /// The cluster split (`Kernels::set_cluster_split`).
    Split,
    /// The loads ahead (`Kernels::set_loop_ahead`).
    Ahead,
}

impl LoopedForm {
    /// The placements its cases take: the realigned one only for the split (the loads-ahead
    /// kernel has no realigned path; such rows are split).
    fn placements(self) -> &'static [At] {
        match self {
            LoopedForm::Split => &[ALIGNED, REALIGNED, SCALAR],
            LoopedForm::Ahead => &[ALIGNED, SCALAR],
        }
    }

    /// The memory path of its kernel for `cols`-element rows of `dtype` placed `at`: vectors
    /// where every operand is on the 16-byte grid; off it, for the split, the realigned path
    /// where the dtype is 16-bit and the weight aligned; else the scalar one.
    fn path(self, dtype: DType, cols: usize, at: At) -> NormPath {
        let size = dtype.size_bytes();
        if at.data == 0 && at.weight == 0 && (cols * size).is_multiple_of(16) {
            NormPath::V16
        } else if self == LoopedForm::Split && size == 2 && at.weight == 0 {
            NormPath::Realigned
        } else {
            NormPath::Scalar
        }
    }

    fn kernel(self, dtype: DType, path: NormPath, scaling: Fp8Scaling) -> KernelId {
        let scheme = kernel_scheme(scaling);
        match (self, path) {
            (LoopedForm::Split, _) => KernelId::RmsNormFp8Split(dtype, path, scheme),
            (LoopedForm::Ahead, NormPath::V16) => {
                KernelId::RmsNormFp8LoopAhead(dtype, VecMode::V16, scheme)
            }
            (LoopedForm::Ahead, _) => KernelId::RmsNormFp8LoopAhead(dtype, VecMode::Scalar, scheme),
        }
    }

    fn switch(self) -> fn(&Kernels, bool) {
        match self {
            LoopedForm::Split => Kernels::set_cluster_split,
            LoopedForm::Ahead => Kernels::set_loop_ahead,
        }
    }
}

/// Every dtype, shape and scheme, at each of `form`'s placements ([`LoopedForm::placements`]):
/// `k` must plan `form`'s kernel on the path [`LoopedForm::path`] names, which must match the
/// references and write the bits of the same call with `form` turned off.
fn looped_form_cases(
    test: &str,
    k: &Kernels,
    s: &Arc<CudaStream>,
    shapes: &[(usize, usize)],
    form: LoopedForm,
) {
    for dtype in DType::ALL {
        let (mut rng, seed) = rng();
        for &(rows, cols) in shapes {
            for (ci, scaling) in schemes(cols).into_iter().enumerate() {
                for &at in form.placements() {
                    if at == REALIGNED && dtype == DType::F32 {
                        // The scalar path, as with every operand one element in.
                        continue;
                    }
                    let place = PLACES[ci % PLACES.len()];
                    let kernel = planned_kernel_at(k, dtype, (rows, cols), scaling, at);
                    let path = form.path(dtype, cols, at);
                    assert_eq!(kernel, form.kernel(dtype, path, scaling), "{rows} x {cols}");
                    let body = std::panic::AssertUnwindSafe(|| {
                        typed!(
                            dtype,
                            looped_form_case::<T>(
                                k,
                                s,
                                &mut rng,
                                form,
                                (place, at, scaling),
                                (rows, cols),
                                ci
                            )
                        )
                    });
                    let result = std::panic::catch_unwind(body);
                    form.switch()(k, true);
                    if let Err(p) = result {
                        eprintln!("{test}: failed with seed {seed:#x}");
                        std::panic::resume_unwind(p);
                    }
                }
            }
        }
    }
}

/// A case of [`looped_form_cases`]: the references, then the bits with `form` turned off.
fn looped_form_case<T: Element>(
    k: &Kernels,
    s: &Arc<CudaStream>,
    rng: &mut StdRng,
    form: LoopedForm,
    (place, at, scaling): (Place, At, Fp8Scaling),
    shape: (usize, usize),
    variant: usize,
) {
    case::<T>(k, s, rng, place, at, scaling, shape, variant);
    same_bits_when_off::<T>((k, s, form.switch()), rng, (place, at, scaling), shape);
}

/// The scheme constant of the entries that run `scaling`.
fn kernel_scheme(scaling: Fp8Scaling) -> u32 {
    use ferrofuse_common::fp8::{FP8_PER_GROUP, FP8_PER_TOKEN, FP8_STATIC};
    match scaling {
        Fp8Scaling::Static => FP8_STATIC,
        Fp8Scaling::PerToken { .. } => FP8_PER_TOKEN,
        Fp8Scaling::PerGroup { .. } => FP8_PER_GROUP,
    }
}

/// The kernel `k` plans for a dense, aligned call of `rows x cols` with an `h` of its own.
fn planned_kernel(
    k: &Kernels,
    dtype: DType,
    shape: (usize, usize),
    scaling: Fp8Scaling,
) -> KernelId {
    planned_kernel_at(k, dtype, shape, scaling, ALIGNED)
}

/// [`planned_kernel`] with the operands placed as `at` says (elements past 16-byte alignment).
fn planned_kernel_at(
    k: &Kernels,
    dtype: DType,
    (rows, cols): (usize, usize),
    scaling: Fp8Scaling,
    at: At,
) -> KernelId {
    let gap = 1u64 << 36;
    let size = dtype.size_bytes() as u64;
    let mat = |i: u64, d: DType, r: usize, c: usize| {
        // x, residual and h at `at.data`, the weight at `at.weight`, y and the scales aligned.
        let off = match i {
            0 | 1 | 3 => at.data as u64 * size,
            2 => at.weight as u64 * size,
            _ => 0,
        };
        MatDesc::contiguous((1 << 40) + i * gap + off, r * c, d, r, c)
    };
    let (sr, sc, _) = scale_layout(scaling, rows, cols);
    let t = RmsNormFp8Descs {
        x: mat(0, dtype, rows, cols),
        residual: Some(mat(1, dtype, rows, cols)),
        weight: mat(2, dtype, 1, cols),
        h: Some(mat(3, dtype, rows, cols)),
        rstd: None,
        y: mat(4, DType::F8E4M3, rows, cols),
        scales: mat(5, DType::F32, sr, sc),
    };
    let opts = RmsNormOptions::new(1e-5);
    plan_rmsnorm_forward_fp8(&t, &opts, scaling, &k.norm_limits())
        .expect("a valid call")
        .kernel
}

/// A case of [`norm_fp8_streamed_rows`]: the references, then the register kernel's bits.
fn streamed_case<T: Element>(
    k: &Kernels,
    s: &Arc<CudaStream>,
    rng: &mut StdRng,
    place: Place,
    scaling: Fp8Scaling,
    shape: (usize, usize),
    variant: usize,
) {
    case::<T>(k, s, rng, place, ALIGNED, scaling, shape, variant);
    same_bits_when_off::<T>(
        (k, s, Kernels::set_row_streaming),
        rng,
        (place, ALIGNED, scaling),
        shape,
    );
}

/// One call with a planning switch of `k` on and one with it off (`switch(k, false)`; left
/// on), on the same random rows: the same bits.
fn same_bits_when_off<T: Element>(
    (k, s, switch): (&Kernels, &Arc<CudaStream>, fn(&Kernels, bool)),
    rng: &mut StdRng,
    (place, at, scaling): (Place, At, Fp8Scaling),
    (rows, cols): (usize, usize),
) {
    let (x, r, w) = random_rows::<T>(rng, rows, cols);
    let opts = RmsNormOptions::new(1e-6).with_gemma(true);
    let run = || {
        call(
            k,
            s,
            place,
            scaling,
            0.01,
            (&x, &r, &w, None),
            (rows, cols),
            at,
            &opts,
        )
    };
    let on = run();
    switch(k, false);
    let off = run();
    switch(k, true);
    let what = format!(
        "{} {place:?} {at:?} {scaling:?} {rows}x{cols}",
        T::DTYPE.name()
    );
    assert_same_outputs(&what, &on, &off);
}

/// Two calls wrote the same bits: bytes, scales, `rstd` and `h`.
fn assert_same_outputs<T: Element>(what: &str, a: &Out<T>, b: &Out<T>) {
    assert_eq!(a.q, b.q, "{what}: bytes");
    let same_f32 = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits());
    assert!(same_f32(&a.scales, &b.scales), "{what}: scales");
    assert!(same_f32(&a.rstd, &b.rstd), "{what}: rstd");
    let same_h =
        a.h.iter()
            .zip(&b.h)
            .all(|(a, b)| a.to_f64().to_bits() == b.to_f64().to_bits());
    assert!(same_h, "{what}: h");
}

/// The sm_80 module (the E4M3 conversion in software; no clusters, bulk copies or
/// programmatic launch) loaded beside the device's own on a newer GPU writes the same bits:
/// bytes, scales, `h` and `rstd`, every scheme, placement and dtype, on the vector and scalar
/// paths, rows in registers, rows of 32 per thread past one wave (streamed on sm_90) and
/// looped rows.
#[test]
fn norm_fp8_oldest_module_gives_the_same_bits() {
    let test = "norm_fp8_oldest_module_gives_the_same_bits";
    let Some((k, s)) = gpu(test) else { return };
    let Some(old) = oldest_module(test, &k) else {
        return;
    };
    let wave = k.limits().sm_count as usize + 5;
    let mut shapes = shapes();
    shapes.extend([(wave, 16384), (wave, 8200)]);
    for dtype in DType::ALL {
        let (mut rng, seed) = rng();
        for (si, &shape) in shapes.iter().enumerate() {
            for (ci, scaling) in schemes(shape.1).into_iter().enumerate() {
                let place = PLACES[(si + ci) % PLACES.len()];
                let at = [ALIGNED, REALIGNED, SCALAR][(si + ci) % 3];
                let body = std::panic::AssertUnwindSafe(|| {
                    typed!(
                        dtype,
                        across_modules::<T>((&k, &old), &s, &mut rng, place, at, scaling, shape)
                    )
                });
                if let Err(p) = std::panic::catch_unwind(body) {
                    eprintln!("{test}: failed with seed {seed:#x}");
                    std::panic::resume_unwind(p);
                }
            }
        }
    }
}

/// One case of [`norm_fp8_oldest_module_gives_the_same_bits`]: the same random rows through
/// both modules, the operands `at` (see [`At`]).
fn across_modules<T: Element>(
    (own, old): (&Kernels, &Kernels),
    s: &Arc<CudaStream>,
    rng: &mut StdRng,
    place: Place,
    at: At,
    scaling: Fp8Scaling,
    (rows, cols): (usize, usize),
) {
    let (x, r, w) = random_rows::<T>(rng, rows, cols);
    let opts = RmsNormOptions::new(1e-6).with_gemma(at.data == 1);
    let run = |k: &Kernels| {
        let io = (&x[..], &r[..], &w[..], None);
        call(k, s, place, scaling, 0.01, io, (rows, cols), at, &opts)
    };
    let (a, b) = (run(own), run(old));
    let what = format!(
        "{} {place:?} {scaling:?} {rows}x{cols} {at:?}: {} vs {}",
        T::DTYPE.name(),
        own.ptx().arch,
        old.ptx().arch
    );
    assert_same_outputs(&what, &a, &b);
}

/// The FP8 bytes are the quantisation of the same f32 `y` the bf16 forward rounds: its `y`
/// (bf16) and the per-token FP8 `y` dequantised agree within the two roundings.
#[test]
fn norm_fp8_matches_storage_forward_rstd() {
    let Some((k, s)) = gpu("norm_fp8_matches_storage_forward_rstd") else {
        return;
    };
    let (rows, cols) = (8, 4096);
    let (mut rng, _) = rng();
    let (x, r, w) = random_rows::<bf16>(&mut rng, rows, cols);
    let opts = RmsNormOptions::new(1e-6);
    let fp8 = call(
        &k,
        &s,
        Place::Add,
        Fp8Scaling::per_token(),
        1.0,
        (&x, &r, &w, None),
        (rows, cols),
        ALIGNED,
        &opts,
    );
    let (dx, dr, dw) = (upload(&s, &x), upload(&s, &r), upload(&s, &w));
    let mut dy = s.alloc_zeros::<bf16>(rows * cols).expect("alloc");
    let mut dh = s.alloc_zeros::<bf16>(rows * cols).expect("alloc");
    let mut drstd = s.alloc_zeros::<f32>(rows).expect("alloc");
    k.rmsnorm(
        &s,
        ferrofuse::Placement::Add {
            x: &Mat::new(dx.as_view(), rows, cols),
            residual: &Mat::new(dr.as_view(), rows, cols),
            y: &mut MatMut::new(dy.as_view_mut(), rows, cols),
            h: &mut MatMut::new(dh.as_view_mut(), rows, cols),
        },
        &Mat::new(dw.as_view(), 1, cols),
        Some(&mut MatMut::new(drstd.as_view_mut(), rows, 1)),
        &opts,
    )
    .expect("bf16 forward");
    let rstd = download(&s, &drstd);
    for (rr, (a, b)) in rstd.iter().zip(&fp8.rstd).enumerate() {
        assert_eq!(a.to_bits(), b.to_bits(), "row {rr}: rstd");
    }
    assert_eq!(download(&s, &dh), fp8.h, "h");
}
