//! Each op family on the GPU: allocate random operands once per shape group (the largest row
//! count of the group; smaller counts use the leading rows), then per configuration poison the
//! outputs, run once and check sampled rows against the f64 reference, then time every mode.
//!
//! Both families (gated activations and add+RMSNorm) go through the safe `Kernels` API.

use std::sync::Arc;

use ferrofuse::cudarc::driver::{CudaSlice, CudaStream};
use ferrofuse::norm::rmsnorm_backward_workspace_len;
use ferrofuse::reference::{rmsnorm_backward, rmsnorm_exact, rmsnorm_weight};
use ferrofuse::{
    Activation, Element, GradPlacement, Mat, MatMut, Placement, RmsNormOptions, SavedForward,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::gpu::{Context, Harness, Random, Result, poison};
use crate::shapes::{Act, Config, Dtype, Fp8Scheme, Layout, Mode, NORM_EPS, NormKind, Op, Variant};
use crate::stats::rel_l2_error;

/// A measured configuration: median microseconds per mode.
pub type Timings = Vec<(Mode, f64)>;

/// Largest relative L2 error of a checked output: rounding to the storage dtype dominates
/// (2^-9 relative for bf16, 2^-12 for f16); f32 keeps the activations' approximation error.
pub fn tolerance(dtype: Dtype) -> f64 {
    match dtype {
        Dtype::Bf16 => 1e-2,
        Dtype::F16 => 2e-3,
        Dtype::F32 => 1e-4,
    }
}

/// Rows checked after the first run: first, middle, last.
pub fn sample_rows(rows: usize) -> Vec<usize> {
    let mut r = vec![0, rows / 2, rows.saturating_sub(1)];
    r.dedup();
    r
}

fn activation(act: Act) -> Activation {
    match act {
        Act::Silu => Activation::Silu,
        Act::GeluTanh => Activation::GeluTanh,
    }
}

/// Where an input matrix's elements come from: element `(r, c)` is
/// `random.value(offset + r * row_stride + c)`.
#[derive(Clone, Copy, Debug)]
pub struct Source {
    pub offset: usize,
    pub row_stride: usize,
}

impl Source {
    pub fn at<T: Element>(&self, random: &Random<T>, r: usize, c: usize) -> f64 {
        random.value(self.offset + r * self.row_stride + c)
    }
}

/// Distinct offsets into the random block for each operand, so no two read the same values
/// at the same index.
const OFFSETS: [usize; 4] = [0, 5_000_011, 9_000_011, 13_000_027];

/// Copies rows `rows` (each `cols` wide at `row_stride`, starting at column `col0`) of `buf`
/// back to the host as f64.
fn read_rows<T: Element>(
    stream: &Arc<CudaStream>,
    buf: &CudaSlice<T>,
    rows: &[usize],
    row_stride: usize,
    col0: usize,
    cols: usize,
) -> Result<Vec<f64>> {
    let mut out = Vec::with_capacity(rows.len() * cols);
    for &r in rows {
        let start = r * row_stride + col0;
        let host = stream
            .clone_dtoh(&buf.slice(start..start + cols))
            .ctx("reading back an output")?;
        out.extend(host.iter().map(|v| v.to_f64()));
    }
    Ok(out)
}

fn check(what: &str, cfg: &Config, out: &[f64], reference: &[f64]) -> Result<()> {
    let err = rel_l2_error(out, reference);
    let tol = tolerance(cfg.dtype);
    // A NaN error (an unwritten or non-finite output) fails too.
    if err.is_nan() || err > tol {
        return Err(format!(
            "{}: {what} is wrong: relative L2 error {err:.3e} over sampled rows (tolerance {tol:.0e})",
            cfg.label()
        ));
    }
    Ok(())
}

/// Times `call` in each of `cfg`'s modes.
fn time_modes(h: &mut Harness, cfg: &Config, call: &mut crate::gpu::Call<'_>) -> Result<Timings> {
    let mut out = Vec::new();
    for &mode in &cfg.modes {
        let us = match mode {
            Mode::PerCall => h.per_call(call),
            Mode::Graph => h.graph(call),
        }
        .map_err(|e| format!("{} ({}): {e}", cfg.label(), mode.name()))?;
        out.push((mode, us));
    }
    Ok(out)
}

/// The random input data of each dtype, made on first use and kept for the whole run.
#[derive(Default)]
pub struct Data {
    bf16: Option<Random<half::bf16>>,
    f16: Option<Random<half::f16>>,
    f32: Option<Random<f32>>,
}

/// Uniform in [-4, 4), seeded per dtype: reruns see the same data.
fn data<'a, T: Element>(
    slot: &'a mut Option<Random<T>>,
    h: &Harness,
    dtype: Dtype,
) -> Result<&'a Random<T>> {
    if let Some(r) = slot {
        return Ok(r);
    }
    Ok(slot.insert(Random::new(
        &h.stream,
        0x5EED_0000 + dtype as u64,
        -4.0,
        4.0,
    )?))
}

/// Runs a group of configurations that share (op, variant, dtype, cols), in any order of rows.
/// Calls `done` with each configuration's result as soon as it is measured.
pub fn run_group(
    h: &mut Harness,
    data_cache: &mut Data,
    group: &[Config],
    done: &mut dyn FnMut(&Config, Result<Timings>),
) -> Result<()> {
    let Some(first) = group.first() else {
        return Ok(());
    };
    match first.dtype {
        Dtype::Bf16 => {
            let random = data(&mut data_cache.bf16, h, first.dtype)?;
            run_group_typed(h, random, group, done)
        }
        Dtype::F16 => {
            let random = data(&mut data_cache.f16, h, first.dtype)?;
            run_group_typed(h, random, group, done)
        }
        Dtype::F32 => {
            let random = data(&mut data_cache.f32, h, first.dtype)?;
            run_group_typed(h, random, group, done)
        }
    }
}

fn run_group_typed<T: Element>(
    h: &mut Harness,
    random: &Random<T>,
    group: &[Config],
    done: &mut dyn FnMut(&Config, Result<Timings>),
) -> Result<()> {
    match group[0].op {
        Op::GatedFwd | Op::GatedBwd => run_gated_group(h, random, group, done),
        Op::GatedFwdFp8 => run_gated_fp8_group(h, random, group, done),
        Op::AddRmsNormFwd | Op::AddRmsNormBwd => run_norm_group(h, random, group, done),
        Op::AddRmsNormFwdFp8 => run_norm_fp8_group(h, random, group, done),
    }
}

fn run_gated_group<T: Element>(
    h: &mut Harness,
    random: &Random<T>,
    group: &[Config],
    done: &mut dyn FnMut(&Config, Result<Timings>),
) -> Result<()> {
    let stream = h.stream.clone();
    let cfg0 = &group[0];
    let Variant::Gated { act, layout } = cfg0.variant else {
        return Err(format!("{}: not a gated variant", cfg0.label()));
    };
    let max_rows = group.iter().map(|c| c.rows).max().unwrap_or(0);
    let i = cfg0.cols;
    let n = max_rows * i;
    let backward = cfg0.op == Op::GatedBwd;

    // Inputs: split a, b (and dy) as [rows, I] (padded, offset: at the layout's row stride and
    // offsets); interleaved x = [a | b] as [rows, 2I]. `y_view`: y's row stride and offset.
    let (in0, in1, a_src, b_src, y_view) = match layout.split_views(i) {
        Some((stride, [oa, ob, oy])) => (
            random.operand(&stream, max_rows * stride + oa, OFFSETS[0])?,
            Some(random.operand(&stream, max_rows * stride + ob, OFFSETS[1])?),
            Source {
                offset: OFFSETS[0] + oa,
                row_stride: stride,
            },
            Source {
                offset: OFFSETS[1] + ob,
                row_stride: stride,
            },
            (stride, oy),
        ),
        None => (
            random.operand(&stream, 2 * n, OFFSETS[0])?,
            None,
            Source {
                offset: OFFSETS[0],
                row_stride: 2 * i,
            },
            Source {
                offset: OFFSETS[0] + i,
                row_stride: 2 * i,
            },
            (i, 0),
        ),
    };
    let dy_src = Source {
        offset: OFFSETS[2],
        row_stride: i,
    };
    let dy = if backward {
        Some(random.operand(&stream, n, OFFSETS[2])?)
    } else {
        None
    };
    // Outputs: y [rows, I]; backward: da, db [rows, I] (split) or dx = [da | db] [rows, 2I].
    let out_len = match (backward, layout) {
        (true, Layout::Interleaved) => 2 * n,
        (true, _) => n,
        (false, _) => max_rows * y_view.0 + y_view.1,
    };
    // SAFETY (both): poisoned before every use; never read before a kernel wrote them.
    let out0 = unsafe { stream.alloc::<T>(out_len) }.ctx("allocating an output")?;
    let out1 = match (backward, layout) {
        (true, Layout::Split) => Some(unsafe { stream.alloc::<T>(n) }.ctx("allocating an output")?),
        _ => None,
    };

    let mut bufs = GatedBufs {
        x0: in0,
        x1: in1,
        dy,
        out0,
        out1,
    };
    let kernels = h.kernels.clone();
    let activation = activation(act);
    for cfg in group {
        let rows = cfg.rows;
        let result = (|| -> Result<Timings> {
            poison(&stream, &mut bufs.out0, 0xFF)?;
            if let Some(o) = bufs.out1.as_mut() {
                poison(&stream, o, 0xFF)?;
            }
            // Checked run first: every sampled output element must be written and right.
            gated_call(&kernels, &stream, activation, cfg, layout, &mut bufs)()?;
            h.sync()?;
            let sample = sample_rows(rows);
            let a_val = |r: usize, c: usize| a_src.at(random, r, c);
            let b_val = |r: usize, c: usize| b_src.at(random, r, c);
            if !backward {
                let got = read_rows(&stream, &bufs.out0, &sample, y_view.0, y_view.1, i)?;
                let mut want = Vec::with_capacity(got.len());
                for &r in &sample {
                    for c in 0..i {
                        want.push(ferrofuse::reference::act(activation, a_val(r, c)) * b_val(r, c));
                    }
                }
                check("y", cfg, &got, &want)?;
            } else {
                let (da, db) = match (layout, bufs.out1.as_ref()) {
                    (Layout::Split, Some(out1)) => (
                        read_rows(&stream, &bufs.out0, &sample, i, 0, i)?,
                        read_rows(&stream, out1, &sample, i, 0, i)?,
                    ),
                    _ => (
                        read_rows(&stream, &bufs.out0, &sample, 2 * i, 0, i)?,
                        read_rows(&stream, &bufs.out0, &sample, 2 * i, i, i)?,
                    ),
                };
                let mut want_da = Vec::with_capacity(da.len());
                let mut want_db = Vec::with_capacity(db.len());
                for &r in &sample {
                    for c in 0..i {
                        let (a, b, g) = (a_val(r, c), b_val(r, c), dy_src.at(random, r, c));
                        want_da.push(g * b * ferrofuse::reference::act_grad(activation, a));
                        want_db.push(g * ferrofuse::reference::act(activation, a));
                    }
                }
                check("da", cfg, &da, &want_da)?;
                check("db", cfg, &db, &want_db)?;
            }
            let mut call = gated_call(&kernels, &stream, activation, cfg, layout, &mut bufs);
            let timings = time_modes(h, cfg, &mut *call)?;
            drop(call);
            h.sync()?;
            Ok(timings)
        })();
        done(cfg, result);
    }
    Ok(())
}

/// The buffers of a gated group, allocated for its largest row count.
struct GatedBufs<T> {
    /// `a` (split) or `x = [a | b]` (interleaved).
    x0: CudaSlice<T>,
    /// `b` (split).
    x1: Option<CudaSlice<T>>,
    /// `dy` (backward).
    dy: Option<CudaSlice<T>>,
    /// `y`; backward: `da` (split) or `dx = [da | db]` (interleaved).
    out0: CudaSlice<T>,
    /// Backward, split: `db`.
    out1: Option<CudaSlice<T>>,
}

fn missing() -> String {
    "internal: a buffer of this layout was not allocated".into()
}

/// One call of `cfg`'s op through the safe API, over the leading `cfg.rows` rows of `bufs`.
fn gated_call<'a, T: Element>(
    kernels: &'a ferrofuse::Kernels,
    stream: &'a Arc<CudaStream>,
    act: Activation,
    cfg: &Config,
    layout: Layout,
    bufs: &'a mut GatedBufs<T>,
) -> Box<dyn FnMut() -> Result<()> + 'a> {
    let (rows, i) = (cfg.rows, cfg.cols);
    let m = rows * i;
    let GatedBufs {
        x0,
        x1,
        dy,
        out0,
        out1,
    } = bufs;
    let (x1, dy, out1) = (x1.as_ref(), dy.as_ref(), out1.as_mut());
    match (cfg.op, layout) {
        (Op::GatedFwd, Layout::Interleaved) => {
            let x = Mat::new(x0.slice(..2 * m), rows, 2 * i);
            let mut y = MatMut::new(out0.slice_mut(..m), rows, i);
            Box::new(move || {
                kernels
                    .gated_interleaved(stream, act, &x, &mut y)
                    .ctx("gated_interleaved")
            })
        }
        (Op::GatedFwd, _) => {
            let (stride, [oa, ob, oy]) = layout.split_views(i).unwrap_or((i, [0; 3]));
            let len = rows * stride;
            let a = Mat::strided(x0.slice(oa..oa + len), rows, i, stride);
            let b = x1.map(|b| Mat::strided(b.slice(ob..ob + len), rows, i, stride));
            let mut y = MatMut::strided(out0.slice_mut(oy..oy + len), rows, i, stride);
            Box::new(move || {
                let b = b.as_ref().ok_or_else(missing)?;
                kernels.gated(stream, act, &a, b, &mut y).ctx("gated")
            })
        }
        (_, Layout::Split | Layout::Padded | Layout::Offset) => {
            let a = Mat::new(x0.slice(..m), rows, i);
            let b = x1.map(|b| Mat::new(b.slice(..m), rows, i));
            let g = dy.map(|g| Mat::new(g.slice(..m), rows, i));
            let mut da = MatMut::new(out0.slice_mut(..m), rows, i);
            let mut db = out1.map(|o| MatMut::new(o.slice_mut(..m), rows, i));
            Box::new(move || {
                let (b, g) = (
                    b.as_ref().ok_or_else(missing)?,
                    g.as_ref().ok_or_else(missing)?,
                );
                let db = db.as_mut().ok_or_else(missing)?;
                kernels
                    .gated_backward(stream, act, &a, b, g, &mut da, db)
                    .ctx("gated_backward")
            })
        }
        (_, Layout::Interleaved) => {
            let x = Mat::new(x0.slice(..2 * m), rows, 2 * i);
            let g = dy.map(|g| Mat::new(g.slice(..m), rows, i));
            let mut dx = MatMut::new(out0.slice_mut(..2 * m), rows, 2 * i);
            Box::new(move || {
                let g = g.as_ref().ok_or_else(missing)?;
                kernels
                    .gated_backward_interleaved(stream, act, &x, g, &mut dx)
                    .ctx("gated_backward_interleaved")
            })
        }
    }
}

/// Relative L2 error of the dequantised FP8 output (`y_q * scale`) against the f64 `y`: E4M3
/// keeps 3 mantissa bits (at most 2^-4 relative per element, about 2-3% in L2).
const FP8_TOLERANCE: f64 = 0.05;

/// The static scale of the FP8 runs: the inputs are uniform in [-4, 4), so `|y| < 16`.
const FP8_STATIC_SCALE: f32 = 16.0 / 448.0;

/// The dequantised FP8 output `got` against the f64 reference `want`, within [`FP8_TOLERANCE`].
fn check_fp8(cfg: &Config, got: &[f64], want: &[f64]) -> Result<()> {
    let err = rel_l2_error(got, want);
    if err.is_nan() || err > FP8_TOLERANCE {
        return Err(format!(
            "{}: y_q * scale is wrong: relative L2 error {err:.3e} (tolerance {FP8_TOLERANCE})",
            cfg.label()
        ));
    }
    Ok(())
}

/// The library's scaling for a benchmark scheme (groups of 128, row-major) and the shape of
/// its scale tensor for `rows x cols`.
fn fp8_scaling(
    scheme: Fp8Scheme,
    rows: usize,
    cols: usize,
) -> (ferrofuse::Fp8Scaling, (usize, usize)) {
    match scheme {
        Fp8Scheme::Static => (ferrofuse::Fp8Scaling::Static, (1, 1)),
        Fp8Scheme::PerToken => (ferrofuse::Fp8Scaling::per_token(), (rows, 1)),
        Fp8Scheme::Group128 => (
            ferrofuse::Fp8Scaling::per_group(128, ferrofuse::ScaleLayout::RowMajor),
            (rows, cols / 128),
        ),
    }
}

/// The scale of element `(r, c)` of a `cols`-wide FP8 output, from the written scales.
fn fp8_scale_at(
    scheme: Fp8Scheme,
    fixed: f32,
    scales: &[f32],
    (r, c): (usize, usize),
    cols: usize,
) -> f64 {
    (match scheme {
        Fp8Scheme::Static => fixed,
        Fp8Scheme::PerToken => scales[r],
        Fp8Scheme::Group128 => scales[r * (cols / 128) + c / 128],
    }) as f64
}

fn run_gated_fp8_group<T: Element>(
    h: &mut Harness,
    random: &Random<T>,
    group: &[Config],
    done: &mut dyn FnMut(&Config, Result<Timings>),
) -> Result<()> {
    let stream = h.stream.clone();
    let cfg0 = &group[0];
    let Variant::GatedFp8 {
        act,
        layout,
        scheme,
    } = cfg0.variant
    else {
        return Err(format!("{}: not a gated FP8 variant", cfg0.label()));
    };
    let max_rows = group.iter().map(|c| c.rows).max().unwrap_or(0);
    let i = cfg0.cols;
    let n = max_rows * i;
    let (x0, x1, a_src, b_src) = match layout {
        Layout::Split | Layout::Padded | Layout::Offset => (
            random.operand(&stream, n, OFFSETS[0])?,
            Some(random.operand(&stream, n, OFFSETS[1])?),
            Source {
                offset: OFFSETS[0],
                row_stride: i,
            },
            Source {
                offset: OFFSETS[1],
                row_stride: i,
            },
        ),
        Layout::Interleaved => (
            random.operand(&stream, 2 * n, OFFSETS[0])?,
            None,
            Source {
                offset: OFFSETS[0],
                row_stride: 2 * i,
            },
            Source {
                offset: OFFSETS[0] + i,
                row_stride: 2 * i,
            },
        ),
    };
    let mut y = stream
        .alloc_zeros::<ferrofuse::F8E4M3>(n.max(1))
        .ctx("allocating an output")?;
    let scale_len = (max_rows * i.div_ceil(128)).max(max_rows).max(1);
    let mut scales = stream
        .alloc_zeros::<f32>(scale_len)
        .ctx("allocating the scales")?;
    let fixed = stream
        .clone_htod(&[FP8_STATIC_SCALE])
        .ctx("uploading the scale")?;
    let kernels = h.kernels.clone();
    let activation = activation(act);
    for cfg in group {
        let rows = cfg.rows;
        let result = (|| -> Result<Timings> {
            let (scaling, (sr, sc)) = fp8_scaling(scheme, rows, i);
            let m = rows * i;
            let a = Mat::new(x0.slice(..m), rows, i);
            let b = x1.as_ref().map(|b| Mat::new(b.slice(..m), rows, i));
            let x = Mat::new(x0.slice(..(2 * m).min(x0.len())), rows, 2 * i);
            let fixed = Mat::new(fixed.slice(..), 1, 1);
            let mut yv = MatMut::new(y.slice_mut(..m.max(1)), rows, i);
            let mut sv = MatMut::new(scales.slice_mut(..(sr * sc).max(1)), sr, sc);
            let mut call = || -> Result<()> {
                let out = match scheme {
                    Fp8Scheme::Static => ferrofuse::Fp8Scales::Read(&fixed),
                    _ => ferrofuse::Fp8Scales::Write(&mut sv),
                };
                match (layout, b.as_ref()) {
                    (Layout::Split, Some(b)) => kernels
                        .gated_fp8(&stream, activation, &a, b, &mut yv, scaling, out)
                        .ctx("gated_fp8"),
                    _ => kernels
                        .gated_interleaved_fp8(&stream, activation, &x, &mut yv, scaling, out)
                        .ctx("gated_interleaved_fp8"),
                }
            };
            call()?;
            h.sync()?;
            let timings = time_modes(h, cfg, &mut call)?;
            h.sync()?;
            // Checked after timing (the outputs are the same every run): sampled rows,
            // dequantised, against the f64 reference.
            let sample = sample_rows(rows);
            let q = read_rows(&stream, &y, &sample, i, 0, i)?;
            let all_scales = stream.clone_dtoh(&scales).ctx("reading the scales")?;
            let mut got = Vec::with_capacity(q.len());
            let mut want = Vec::with_capacity(q.len());
            for (k, &r) in sample.iter().enumerate() {
                for c in 0..i {
                    let s = fp8_scale_at(scheme, FP8_STATIC_SCALE, &all_scales, (r, c), i);
                    got.push(q[k * i + c] * s);
                    let (av, bv) = (a_src.at(random, r, c), b_src.at(random, r, c));
                    want.push(ferrofuse::reference::act(activation, av) * bv);
                }
            }
            check_fp8(cfg, &got, &want)?;
            Ok(timings)
        })();
        done(cfg, result);
    }
    Ok(())
}

/// The add+RMSNorm forward with FP8 output (`Kernels::rmsnorm_fp8`): `Fp8Placement::Add`
/// (`h` into its own buffer), f32 numerics, no `rstd` output, the scales of the variant's
/// scheme (per group: 128 columns, row-major).
fn run_norm_fp8_group<T: Element>(
    h: &mut Harness,
    random: &Random<T>,
    group: &[Config],
    done: &mut dyn FnMut(&Config, Result<Timings>),
) -> Result<()> {
    let stream = h.stream.clone();
    let cfg0 = &group[0];
    let Variant::NormFp8 { kind, scheme } = cfg0.variant else {
        return Err(format!("{}: not a norm FP8 variant", cfg0.label()));
    };
    let gemma = kind == NormKind::Gemma;
    let hh = cfg0.cols;
    let max_rows = group.iter().map(|c| c.rows).max().unwrap_or(0);
    let n = max_rows * hh;
    let mut rng = SmallRng::seed_from_u64(0x5EED_1000 + hh as u64);
    let (lo, hi) = if gemma { (-0.5, 0.5) } else { (0.5, 1.5) };
    let w_host: Vec<T> = (0..hh)
        .map(|_| T::from_f64(rng.random_range(lo..hi)))
        .collect();
    let w = stream.clone_htod(&w_host).ctx("uploading the weight")?;
    let w_eff: Vec<f64> = w_host
        .iter()
        .map(|v| rmsnorm_weight(v.to_f64(), gemma))
        .collect();
    let (src0, src1) = (
        Source {
            offset: OFFSETS[0],
            row_stride: hh,
        },
        Source {
            offset: OFFSETS[1],
            row_stride: hh,
        },
    );
    let x = random.operand(&stream, n, src0.offset)?;
    let res = random.operand(&stream, n, src1.offset)?;
    // SAFETY: written by every call before it is read.
    let mut hbuf = unsafe { stream.alloc::<T>(n.max(1)) }.ctx("allocating h")?;
    let mut y = stream
        .alloc_zeros::<ferrofuse::F8E4M3>(n.max(1))
        .ctx("allocating an output")?;
    let scale_len = (max_rows * hh.div_ceil(128)).max(max_rows).max(1);
    let mut scales = stream
        .alloc_zeros::<f32>(scale_len)
        .ctx("allocating the scales")?;
    // Inputs in [-4, 4): |y| stays below ~ 4 * sqrt(3) * 1.5 < 11.
    let static_scale = 11.0f32 / 448.0;
    let fixed = stream
        .clone_htod(&[static_scale])
        .ctx("uploading the scale")?;
    let kernels = h.kernels.clone();
    for cfg in group {
        let rows = cfg.rows;
        let result = (|| -> Result<Timings> {
            let (scaling, (sr, sc)) = fp8_scaling(scheme, rows, hh);
            let m = rows * hh;
            let xv = Mat::new(x.slice(..m), rows, hh);
            let rv = Mat::new(res.slice(..m), rows, hh);
            let wv = Mat::new(w.slice(..), 1, hh);
            let fixed = Mat::new(fixed.slice(..), 1, 1);
            let mut hv = MatMut::new(hbuf.slice_mut(..m.max(1)), rows, hh);
            let mut yv = MatMut::new(y.slice_mut(..m.max(1)), rows, hh);
            let mut sv = MatMut::new(scales.slice_mut(..(sr * sc).max(1)), sr, sc);
            let opts = RmsNormOptions::new(NORM_EPS as f32).with_gemma(gemma);
            let mut call = || -> Result<()> {
                let out = match scheme {
                    Fp8Scheme::Static => ferrofuse::Fp8Scales::Read(&fixed),
                    _ => ferrofuse::Fp8Scales::Write(&mut sv),
                };
                let io = ferrofuse::norm::Fp8Placement::Add {
                    x: &xv,
                    residual: &rv,
                    h: &mut hv,
                };
                kernels
                    .rmsnorm_fp8(&stream, io, &wv, &mut yv, scaling, out, None, &opts)
                    .ctx("rmsnorm_fp8")
            };
            call()?;
            h.sync()?;
            let timings = time_modes(h, cfg, &mut call)?;
            h.sync()?;
            // Sampled rows, dequantised, against the f64 reference.
            let sample = sample_rows(rows);
            let q = read_rows(&stream, &y, &sample, hh, 0, hh)?;
            let all_scales = stream.clone_dtoh(&scales).ctx("reading the scales")?;
            let (mut got, mut want) = (Vec::new(), Vec::new());
            for (k, &r) in sample.iter().enumerate() {
                let hrow: Vec<f64> = (0..hh)
                    .map(|c| src0.at(random, r, c) + src1.at(random, r, c))
                    .collect();
                want.extend(rmsnorm_exact(&hrow, &w_eff, NORM_EPS));
                for c in 0..hh {
                    let s = fp8_scale_at(scheme, static_scale, &all_scales, (r, c), hh);
                    got.push(q[k * hh + c] * s);
                }
            }
            check_fp8(cfg, &got, &want)?;
            Ok(timings)
        })();
        done(cfg, result);
    }
    Ok(())
}

/// The buffers of an add+RMSNorm group, allocated for its largest row count.
struct NormBufs<T> {
    /// Forward: `x`; backward: `dy`.
    in0: CudaSlice<T>,
    /// Forward: `residual`; backward: `h`.
    in1: CudaSlice<T>,
    /// `[1, H]`, the storage dtype.
    w: CudaSlice<T>,
    /// Backward: the saved per-row `rstd` (f32).
    rstd: CudaSlice<f32>,
    /// Forward: `y`; backward: `dx`.
    out0: CudaSlice<T>,
    /// Forward: `h`; backward: `dw` (`[1, H]`).
    out1: CudaSlice<T>,
    /// Backward: the `dw` partials.
    workspace: CudaSlice<f32>,
}

/// One call of `cfg`'s norm op through the safe API, over the leading `cfg.rows` rows.
fn norm_call<'a, T: Element>(
    kernels: &'a ferrofuse::Kernels,
    stream: &'a Arc<CudaStream>,
    cfg: &Config,
    gemma: bool,
    bufs: &'a mut NormBufs<T>,
) -> Box<dyn FnMut() -> Result<()> + 'a> {
    let (rows, hh) = (cfg.rows, cfg.cols);
    let m = rows * hh;
    let NormBufs {
        in0,
        in1,
        w,
        rstd,
        out0,
        out1,
        workspace,
    } = bufs;
    let w = Mat::new(w.slice(..), 1, hh);
    if cfg.op == Op::AddRmsNormFwd {
        let x = Mat::new(in0.slice(..m), rows, hh);
        let r = Mat::new(in1.slice(..m), rows, hh);
        let mut y = MatMut::new(out0.slice_mut(..m), rows, hh);
        let mut h = MatMut::new(out1.slice_mut(..m), rows, hh);
        let opts = RmsNormOptions::new(NORM_EPS as f32).with_gemma(gemma);
        Box::new(move || {
            let io = Placement::Add {
                x: &x,
                residual: &r,
                y: &mut y,
                h: &mut h,
            };
            kernels.rmsnorm(stream, io, &w, None, &opts).ctx("rmsnorm")
        })
    } else {
        let dy = Mat::new(in0.slice(..m), rows, hh);
        let h = Mat::new(in1.slice(..m), rows, hh);
        let rstd = Mat::new(rstd.slice(..rows), rows, 1);
        let mut dx = MatMut::new(out0.slice_mut(..m), rows, hh);
        let mut dw = MatMut::new(out1.slice_mut(..hh), 1, hh);
        let opts = RmsNormOptions::new(NORM_EPS as f32).with_gemma(gemma);
        Box::new(move || {
            let grads = GradPlacement::Separate {
                dy: &dy,
                dres: None,
                dx: &mut dx,
            };
            let saved = SavedForward {
                h: &h,
                rstd: &rstd,
                weight: &w,
            };
            kernels
                .rmsnorm_backward(stream, grads, saved, &mut dw, workspace, &opts)
                .ctx("rmsnorm_backward")
        })
    }
}

/// The add+RMSNorm family (`ferrofuse::norm`): forward `rmsnorm` with `Placement::Add`
/// (separate `y` and `h`, f32 numerics, no `rstd` output) and backward `rmsnorm_backward`
/// (from the saved `h` and `rstd`, no incoming residual gradient).
fn run_norm_group<T: Element>(
    h: &mut Harness,
    random: &Random<T>,
    group: &[Config],
    done: &mut dyn FnMut(&Config, Result<Timings>),
) -> Result<()> {
    let stream = h.stream.clone();
    let cfg0 = &group[0];
    let Variant::Norm { kind } = cfg0.variant else {
        return Err(format!("{}: not a norm variant", cfg0.label()));
    };
    let gemma = kind == NormKind::Gemma;
    let backward = cfg0.op == Op::AddRmsNormBwd;
    let hh = cfg0.cols;
    let max_rows = group.iter().map(|c| c.rows).max().unwrap_or(0);
    let n = max_rows * hh;

    // Weight: around 1 (Gemma stores w - 1, around 0); rstd: plausible for inputs in [-4, 4).
    let mut rng = SmallRng::seed_from_u64(0x5EED_1000 + hh as u64);
    let (lo, hi) = if gemma { (-0.5, 0.5) } else { (0.5, 1.5) };
    let w_host: Vec<T> = (0..hh)
        .map(|_| T::from_f64(rng.random_range(lo..hi)))
        .collect();
    let rstd_host: Vec<f32> = (0..max_rows.max(1))
        .map(|_| rng.random_range(0.3f32..0.6))
        .collect();
    let w = stream.clone_htod(&w_host).ctx("uploading the weight")?;
    let rstd = stream.clone_htod(&rstd_host).ctx("uploading rstd")?;
    let w_val: Vec<f64> = w_host.iter().map(|v| v.to_f64()).collect();
    let w_eff: Vec<f64> = w_val.iter().map(|&w| rmsnorm_weight(w, gemma)).collect();

    let src0 = Source {
        offset: OFFSETS[0],
        row_stride: hh,
    };
    let src1 = Source {
        offset: OFFSETS[1],
        row_stride: hh,
    };
    let in0 = random.operand(&stream, n, src0.offset)?;
    let in1 = random.operand(&stream, n, src1.offset)?;
    let out1_len = if backward { hh } else { n };
    // SAFETY (all three): poisoned before every use; never read before a kernel wrote them.
    let out0 = unsafe { stream.alloc::<T>(n) }.ctx("allocating an output")?;
    let out1 = unsafe { stream.alloc::<T>(out1_len) }.ctx("allocating an output")?;
    // The forward has no workspace; one element keeps the buffer non-empty.
    let ws_len = if backward {
        group
            .iter()
            .map(|c| rmsnorm_backward_workspace_len(T::DTYPE, c.rows, hh))
            .max()
            .unwrap_or(0)
            .max(1)
    } else {
        1
    };
    let workspace = unsafe { stream.alloc::<f32>(ws_len) }.ctx("allocating the workspace")?;

    let mut bufs = NormBufs {
        in0,
        in1,
        w,
        rstd,
        out0,
        out1,
        workspace,
    };
    let kernels = h.kernels.clone();
    for cfg in group {
        let rows = cfg.rows;
        let result = (|| -> Result<Timings> {
            poison(&stream, &mut bufs.out0, 0xFF)?;
            poison(&stream, &mut bufs.out1, 0xFF)?;
            norm_call(&kernels, &stream, cfg, gemma, &mut bufs)()?;
            h.sync()?;
            let sample = sample_rows(rows);
            let row_of = |src: &Source, r: usize| -> Vec<f64> {
                (0..hh).map(|c| src.at(random, r, c)).collect()
            };
            if !backward {
                let (mut want_y, mut want_h) = (Vec::new(), Vec::new());
                for &r in &sample {
                    let sum: Vec<f64> = row_of(&src0, r)
                        .iter()
                        .zip(row_of(&src1, r))
                        .map(|(x, res)| x + res)
                        .collect();
                    want_y.extend(rmsnorm_exact(&sum, &w_eff, NORM_EPS));
                    want_h.extend(sum);
                }
                check(
                    "y",
                    cfg,
                    &read_rows(&stream, &bufs.out0, &sample, hh, 0, hh)?,
                    &want_y,
                )?;
                check(
                    "h",
                    cfg,
                    &read_rows(&stream, &bufs.out1, &sample, hh, 0, hh)?,
                    &want_h,
                )?;
            } else {
                let mut want_dx = Vec::new();
                for &r in &sample {
                    let (dy, hv) = (row_of(&src0, r), row_of(&src1, r));
                    let rstd = [rstd_host[r] as f64];
                    let (dx, _) = rmsnorm_backward(&dy, &hv, &w_val, &rstd, None, 1, hh, gemma);
                    want_dx.extend(dx);
                }
                check(
                    "dx",
                    cfg,
                    &read_rows(&stream, &bufs.out0, &sample, hh, 0, hh)?,
                    &want_dx,
                )?;
                // dw sums every row: checked in full.
                let mut want_dw = vec![0.0; hh];
                for (r, &s) in rstd_host.iter().enumerate().take(rows) {
                    let s = s as f64;
                    for (c, dw) in want_dw.iter_mut().enumerate() {
                        *dw += src0.at(random, r, c) * src1.at(random, r, c) * s;
                    }
                }
                check(
                    "dw",
                    cfg,
                    &read_rows(&stream, &bufs.out1, &[0], hh, 0, hh)?,
                    &want_dw,
                )?;
            }
            let mut call = norm_call(&kernels, &stream, cfg, gemma, &mut bufs);
            let timings = time_modes(h, cfg, &mut *call)?;
            drop(call);
            h.sync()?;
            Ok(timings)
        })();
        done(cfg, result);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_distinct_rows_in_range() {
        assert_eq!(sample_rows(1), vec![0]);
        assert_eq!(sample_rows(2), vec![0, 1]);
        assert_eq!(sample_rows(4), vec![0, 2, 3]);
        assert_eq!(sample_rows(16384), vec![0, 8192, 16383]);
    }

    #[test]
    fn offsets_do_not_collide() {
        // Operands of one config read different values at the same index (the random block
        // is 16 Mi elements; interleaved halves add at most 28672).
        for (k, a) in OFFSETS.iter().enumerate() {
            for b in &OFFSETS[k + 1..] {
                assert!(b - a > 28672 * 2);
            }
            assert!(*a < crate::gpu::RANDOM_BLOCK);
        }
    }
}
