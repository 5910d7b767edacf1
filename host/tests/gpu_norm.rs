//! GPU tests of the residual-add + RMSNorm family, against the f64 reference on fresh random
//! inputs (the random seed is in every failure message), outputs poisoned (NaN) before each run,
//! every element outside the written regions (row padding, the tail, unused buffers, the
//! inputs) checked unchanged afterwards. Without a CUDA driver each test prints why it skips.
//!
//! Tolerances. `h` must be exact (the f32 sum rounded once). f32 `y` and `rstd`: 1e-5
//! relative. f16/bf16 `y`: within one unit in the last place of the reference rounded to the
//! storage dtype, in the f32 numerics mode. In the Hugging Face mode `y = round(round(h *
//! rstd) * w)`: when `h * rstd` lies within the f32 error of `rstd` (1e-5 relative, which the
//! rstd check enforces) of a rounding boundary of the storage dtype, the intermediate rounding
//! may go either way, and that choice moves `y` by up to 2 ulps. So HF `y` must be within one
//! ulp of `round(round(h * rstd') * w)` for `rstd'` at one of `rstd * (1 - 1e-5)`, `rstd`,
//! `rstd * (1 + 1e-5)`: the one-ulp bound around each possible intermediate, no looser.
//! Backward: `dx` within one ulp plus the f32 error of its row sum (1e-5 of the sum of
//! absolute terms, propagated), `dw` within one ulp plus 1e-5 of the sum of absolute terms.
//!
//! `FERROFUSE_DEVICE=N` picks the device; `FERROFUSE_TEST_QUICK=1` trims the matrices to a small
//! one that still runs every kernel, placement and option (for compute-sanitizer).

// Element loops over matrices read best with explicit indices.
#![allow(clippy::needless_range_loop)]

mod common;

use std::collections::BTreeSet;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use common::{assert_matches, download, gpu, poison, quick, ulp_at, ulps};
use ferrofuse::cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use ferrofuse::half::{bf16, f16};
use ferrofuse::norm::{
    NormBwdVariant, NormFwdVariant, RmsNormBwdDescs, RmsNormFwdDescs, plan_rmsnorm_backward_with,
    plan_rmsnorm_forward, rmsnorm_backward_workspace_len, rmsnorm_forward_geometry,
};
use ferrofuse::reference::{
    RmsNormRef, rmsnorm_backward, rmsnorm_forward_row, rmsnorm_hf_y, rmsnorm_rstd, rmsnorm_weight,
};
use ferrofuse::{
    DType, Element, Error, GradPlacement, KernelId, Kernels, Mat, MatDesc, MatMut, NormNumerics,
    NormPath, Placement, RmsNormOptions, SavedForward, VecMode,
};
use ferrofuse_common::{
    RMSNORM_BWD_WIDE_CLUSTER_MAX_ROWS, rmsnorm_bwd_cluster_fits, rmsnorm_bwd_layout,
    rmsnorm_realigned_fits, rmsnorm_split_geometry, rmsnorm_split_smem_bytes,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Relative error allowed on f32 results and on `rstd`.
const REL: f64 = 1e-5;

// ------------------------------------------------------------------------------------------
// Shapes.
// ------------------------------------------------------------------------------------------

/// Hidden sizes of real models, odd ones, and rows longer than registers hold (looped path).
/// 1021: rows packed two or more to a block whose last chunk straddles the vector after the
/// last slot at some offsets (the realigned kernel forms that vector only then).
fn hidden_sizes() -> Vec<usize> {
    if quick() {
        return vec![3, 769, 896, 1021, 4096, 16384, 20000];
    }
    vec![
        1, 3, 769, 896, 2048, 3584, 4096, 5120, 5125, 7168, 8192, 16384, 65536,
    ]
}

fn row_counts() -> Vec<usize> {
    if quick() {
        return vec![1, 7];
    }
    vec![1, 2, 7, 64, 1000, 8192]
}

/// Largest `rows x hidden` the full matrix runs (8192 x 8192; larger H at 1000 rows).
const MAX_ELEMS: usize = 1 << 26;

// ------------------------------------------------------------------------------------------
// Host-side buffers laid out as the device sees them.
// ------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    /// Rows back to back from a 16-byte aligned start: the vector kernels when L divides H.
    Dense,
    /// Rows padded to a multiple of 16 bytes plus one vector: still the vector kernels.
    Padded,
    /// Every buffer starts one element past an aligned address, rows `H + 1` apart: the
    /// scalar kernels, whatever H.
    Misaligned,
    /// As `Misaligned`, but the weight is at an aligned address: the realigned forward kernel
    /// where its geometry allows, the scalar kernels otherwise.
    Shifted,
    /// As `Shifted`, but each row operand of the forward at its own offset (see
    /// [`Layout::of_operand`]), so that a row's operands mostly sit at different offsets from
    /// the grid: the realigned forward's form for offsets known only at run time; the
    /// backward's operands likewise ([`Layout::of_bwd_operand`]). Elsewhere (rstd, dw) as
    /// `Misaligned`.
    Staggered,
    /// Every buffer starts this many elements past an aligned address, rows `H + n` apart.
    Offset(usize),
}

/// The backward's layouts (each operand at its own offset where `Staggered`).
const BWD_LAYOUTS: [Layout; 4] = [
    Layout::Dense,
    Layout::Padded,
    Layout::Misaligned,
    Layout::Staggered,
];

/// The forward's layouts.
const LAYOUTS: [Layout; 5] = [
    Layout::Dense,
    Layout::Padded,
    Layout::Misaligned,
    Layout::Shifted,
    Layout::Staggered,
];

/// The row operands of a forward call, for [`Layout::of_operand`].
#[derive(Clone, Copy)]
enum Operand {
    X,
    Residual,
    Y,
    H,
}

impl Layout {
    /// (offset of element [0, 0], row stride) for rows of `cols` with vectors of `lanes`.
    fn place(self, cols: usize, lanes: usize) -> (usize, usize) {
        match self {
            Layout::Dense => (0, cols),
            Layout::Padded => (0, cols.next_multiple_of(lanes) + lanes),
            Layout::Misaligned | Layout::Shifted | Layout::Staggered => (1, cols + 1),
            Layout::Offset(n) => (n, cols + n),
        }
    }

    /// The layout of one row operand of a forward call: `Staggered` puts x 1 element past
    /// the grid, the residual 3, y 0 and h 2 (with rows `H + n` apart, each row's offsets
    /// differ from one another but for some rows); the others are the same for every operand.
    fn of_operand(self, op: Operand) -> Layout {
        match self {
            Layout::Staggered => Layout::Offset(match op {
                Operand::X => 1,
                Operand::Residual => 3,
                Operand::Y => 0,
                Operand::H => 2,
            }),
            other => other,
        }
    }

    /// Whether a row of `cols` elements with vectors of `lanes` is on the 16-byte grid.
    fn on_grid(self, cols: usize, lanes: usize) -> bool {
        matches!(self, Layout::Dense | Layout::Padded) && cols.is_multiple_of(lanes)
    }

    /// The layout of the backward's operand `n` (dy 1, h 2, dres 3, dx 0, the weight 3):
    /// `Staggered` puts each at its own offset from the grid, so that a row's operands sit at
    /// different offsets (the scalar backward reads each as its own aligned vectors); the
    /// others are the same for every operand.
    fn of_bwd_operand(self, n: usize) -> Layout {
        match self {
            Layout::Staggered => Layout::Offset(n),
            other => other,
        }
    }

    /// The layout of the weight (one row) for inputs laid out as `self`.
    fn of_weight(self) -> Layout {
        match self {
            Layout::Shifted | Layout::Staggered => Layout::Dense,
            other => other,
        }
    }
}

/// A `rows x cols` matrix inside a host copy of its whole device buffer: element `[r, c]` at
/// `off + r * stride + c`; every other element (row padding, the leading offset, a tail of
/// three) holds a sentinel that must survive the kernel.
#[derive(Clone)]
struct Laid<T> {
    buf: Vec<T>,
    off: usize,
    rows: usize,
    cols: usize,
    stride: usize,
}

fn sentinel<T: Element>() -> T {
    T::from_f64(-4242.0)
}

impl<T: Element> Laid<T> {
    fn new(dense: &[T], rows: usize, cols: usize, layout: Layout, lanes: usize) -> Self {
        assert_eq!(dense.len(), rows * cols);
        let (off, stride) = layout.place(cols, lanes);
        let span = if rows == 0 {
            0
        } else {
            (rows - 1) * stride + cols
        };
        let mut buf = vec![sentinel::<T>(); off + span + 3];
        for r in 0..rows {
            buf[off + r * stride..off + r * stride + cols]
                .copy_from_slice(&dense[r * cols..(r + 1) * cols]);
        }
        Self {
            buf,
            off,
            rows,
            cols,
            stride,
        }
    }

    fn poisoned(rows: usize, cols: usize, layout: Layout, lanes: usize) -> Self {
        Self::new(&vec![poison::<T>(); rows * cols], rows, cols, layout, lanes)
    }

    fn at(&self, r: usize, c: usize) -> T {
        self.buf[self.off + r * self.stride + c]
    }

    fn row(&self, r: usize) -> &[T] {
        &self.buf[self.off + r * self.stride..self.off + r * self.stride + self.cols]
    }

    fn in_region(&self, i: usize) -> bool {
        if i < self.off || self.rows == 0 {
            return false;
        }
        let j = i - self.off;
        j / self.stride < self.rows && j % self.stride < self.cols
    }

    /// The same matrix over a downloaded copy of the buffer.
    fn with_buf(&self, buf: Vec<T>) -> Self {
        assert_eq!(buf.len(), self.buf.len());
        Self { buf, ..*self }
    }

    fn upload(&self, s: &Arc<CudaStream>) -> CudaSlice<T> {
        s.clone_htod(&self.buf).expect("upload")
    }

    fn mat<'a>(&self, d: &'a CudaSlice<T>) -> Mat<'a, T> {
        Mat::strided(d.slice(self.off..), self.rows, self.cols, self.stride)
    }

    fn mat_mut<'a>(&self, d: &'a mut CudaSlice<T>) -> MatMut<'a, T> {
        MatMut::strided(d.slice_mut(self.off..), self.rows, self.cols, self.stride)
    }

    /// The raw description of the matrix in device buffer `d` (to re-plan a safe call and
    /// learn which kernel it ran).
    fn desc(&self, s: &Arc<CudaStream>, d: &CudaSlice<T>) -> MatDesc {
        let (base, _guard) = d.device_ptr(s);
        MatDesc {
            addr: base + (self.off * T::DTYPE.size_bytes()) as u64,
            len: self.buf.len() - self.off,
            dtype: T::DTYPE,
            rows: self.rows,
            cols: self.cols,
            row_stride: self.stride,
            col_stride: 1,
        }
    }
}

fn same<T: Element>(a: T, b: T) -> bool {
    bits(a) == bits(b)
}

/// Whether `a` and `b` hold the same bits element by element (as far as the shorter goes).
fn same_all<T: Element>(a: &[T], b: &[T]) -> bool {
    a.iter().zip(b).all(|(p, q)| same(*p, *q))
}

/// The storage bits of `v` (its dtype's encoding), for bitwise comparisons.
fn bits<T: Element>(v: T) -> u32 {
    let f = v.to_f64();
    match T::DTYPE {
        DType::F32 => (f as f32).to_bits(),
        DType::F16 => f16::from_f64(f).to_bits() as u32,
        DType::BF16 => bf16::from_f64(f).to_bits() as u32,
        DType::F8E4M3 => unreachable!("the norm runs the storage dtypes"),
    }
}

/// Every element of `after` outside `m`'s region (all of it when `written` is false) is
/// bitwise what was uploaded.
fn assert_untouched<T: Element>(what: &str, m: &Laid<T>, after: &[T], written: bool) {
    for (i, (&b, &a)) in m.buf.iter().zip(after).enumerate() {
        if written && m.in_region(i) {
            continue;
        }
        assert!(
            same(a, b),
            "{what}: element {i} of the buffer (outside what the call may write) changed from {} to {}",
            b.to_f64(),
            a.to_f64()
        );
    }
}

// ------------------------------------------------------------------------------------------
// Random inputs, generated in parallel (the large shapes have 10^8 elements).
// ------------------------------------------------------------------------------------------

fn threads() -> usize {
    std::thread::available_parallelism()
        .map_or(4, |n| n.get())
        .min(32)
}

/// `n` values uniform in `[-scale, scale]` rounded to `T`, a function of `seed` only.
fn random_vec<T: Element>(seed: u64, n: usize, scale: f64) -> Vec<T> {
    let mut v = vec![T::from_f64(0.0); n];
    let chunk = n.div_ceil(threads()).max(1 << 16);
    std::thread::scope(|sc| {
        for (i, part) in v.chunks_mut(chunk).enumerate() {
            sc.spawn(move || {
                let mut rng =
                    StdRng::seed_from_u64(seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
                for x in part {
                    *x = T::from_f64(rng.random_range(-scale..=scale));
                }
            });
        }
    });
    v
}

/// `f` over `0..rows` split across threads; the results in order.
fn par_rows<R: Send>(rows: usize, f: impl Fn(Range<usize>) -> R + Sync) -> Vec<R> {
    let chunk = rows.div_ceil(threads()).max(1);
    let f = &f;
    std::thread::scope(|sc| {
        let handles: Vec<_> = (0..rows)
            .step_by(chunk)
            .map(|r0| sc.spawn(move || f(r0..(r0 + chunk).min(rows))))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn fresh_seed() -> u64 {
    rand::rng().random()
}

// ------------------------------------------------------------------------------------------
// Error measures.
// ------------------------------------------------------------------------------------------

fn rel_err(got: f64, want: f64) -> f64 {
    if got == want {
        return 0.0;
    }
    if !got.is_finite() || !want.is_finite() {
        return f64::INFINITY;
    }
    (got - want).abs() / want.abs().max(f64::MIN_POSITIVE)
}

/// The worst errors seen by a test, printed at its end.
#[derive(Default, Debug, Clone)]
struct Worst {
    /// f16/bf16 y: most ulps from the reference (must be <= 1) and how many were 1 ulp off.
    y_ulps: u64,
    y_one_ulp: u64,
    y_checked: u64,
    /// f32 y and every rstd: relative.
    y_rel: f64,
    rstd_rel: f64,
    /// Backward: worst error as a fraction of its tolerance.
    dx_ratio: f64,
    dw_ratio: f64,
}

impl Worst {
    fn merge(&mut self, o: &Worst) {
        self.y_ulps = self.y_ulps.max(o.y_ulps);
        self.y_one_ulp += o.y_one_ulp;
        self.y_checked += o.y_checked;
        self.y_rel = self.y_rel.max(o.y_rel);
        self.rstd_rel = self.rstd_rel.max(o.rstd_rel);
        self.dx_ratio = self.dx_ratio.max(o.dx_ratio);
        self.dw_ratio = self.dw_ratio.max(o.dw_ratio);
    }
}

fn report(test: &str, worst: &Mutex<Vec<(DType, Worst)>>) {
    for (d, w) in worst.lock().unwrap().iter() {
        eprintln!(
            "{test} {}: y worst {} ulp ({} of {} elements 1 ulp off), y f32 rel {:.2e}, rstd rel {:.2e}, dx {:.3} of tol, dw {:.3} of tol",
            d.name(),
            w.y_ulps,
            w.y_one_ulp,
            w.y_checked,
            w.y_rel,
            w.rstd_rel,
            w.dx_ratio,
            w.dw_ratio
        );
    }
}

fn record(worst: &Mutex<Vec<(DType, Worst)>>, d: DType, w: &Worst) {
    let mut all = worst.lock().unwrap();
    match all.iter_mut().find(|(x, _)| *x == d) {
        Some((_, acc)) => acc.merge(w),
        None => all.push((d, w.clone())),
    }
}

// ------------------------------------------------------------------------------------------
// The forward: one case.
// ------------------------------------------------------------------------------------------

/// The variants of `ferrofuse::Placement`, as tags a test case can hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outputs {
    Add,
    AddHOverX,
    AddHOverResidual,
    AddYOverX,
    AddInPlace,
    Norm,
    NormInPlace,
}

const PLACEMENTS: [Outputs; 7] = [
    Outputs::Add,
    Outputs::AddHOverX,
    Outputs::AddHOverResidual,
    Outputs::AddYOverX,
    Outputs::AddInPlace,
    Outputs::Norm,
    Outputs::NormInPlace,
];

impl Outputs {
    fn has_residual(self) -> bool {
        !matches!(self, Outputs::Norm | Outputs::NormInPlace)
    }
    fn y_over_x(self) -> bool {
        matches!(
            self,
            Outputs::AddYOverX | Outputs::AddInPlace | Outputs::NormInPlace
        )
    }
}

#[derive(Clone, Copy, Debug)]
struct Fwd {
    rows: usize,
    hidden: usize,
    placement: Outputs,
    layout: Layout,
    gemma: bool,
    hf: bool,
    w_f32: bool,
    rstd: bool,
    eps: f32,
}

impl Fwd {
    fn new(rows: usize, hidden: usize) -> Self {
        Fwd {
            rows,
            hidden,
            placement: Outputs::Add,
            layout: Layout::Dense,
            gemma: false,
            hf: false,
            w_f32: false,
            rstd: true,
            eps: 1e-6,
        }
    }

    fn opts(&self) -> RmsNormOptions {
        RmsNormOptions::new(self.eps)
            .with_gemma(self.gemma)
            .with_numerics(if self.hf {
                NormNumerics::HfLlama
            } else {
                NormNumerics::F32
            })
    }
}

/// Inputs of a forward case, as dense row-major host vectors (the weight as f64 too).
struct FwdIn<T> {
    x: Vec<T>,
    residual: Vec<T>,
    w_f64: Vec<f64>,
}

fn fwd_inputs<T: Element>(c: &Fwd, seed: u64) -> FwdIn<T> {
    let n = c.rows * c.hidden;
    let mut x = random_vec::<T>(seed, n, 2.0);
    let mut residual = random_vec::<T>(seed.wrapping_add(1), n, 2.0);
    let wscale = if c.gemma { 0.5 } else { 1.5 };
    let w_raw = random_vec::<f32>(seed.wrapping_add(2), c.hidden, wscale);
    // The weight is stored as T or as f32; its exact values either way.
    let w_f64 = if c.w_f32 {
        w_raw.iter().map(|&v| v as f64).collect()
    } else {
        w_raw
            .iter()
            .map(|&v| T::from_f64(v as f64).to_f64())
            .collect()
    };
    // Edge rows: one whose h is exactly 0 (rstd = 1/sqrt(eps), y = 0) and one of large values.
    if c.rows >= 3 {
        let z = c.hidden..2 * c.hidden;
        if c.placement.has_residual() {
            for i in z {
                residual[i] = T::from_f64(-x[i].to_f64());
            }
        } else {
            for i in z {
                x[i] = T::from_f64(0.0);
            }
        }
        for i in 2 * c.hidden..3 * c.hidden {
            x[i] = T::from_f64(x[i].to_f64() * 100.0);
        }
    }
    FwdIn { x, residual, w_f64 }
}

/// What a forward call left in memory.
struct FwdOut<T> {
    y: Laid<T>,
    h: Option<Laid<T>>,
    rstd: Option<Laid<f32>>,
    kernel: KernelId,
}

/// Runs one forward case through the safe API of its placement; checks that everything the
/// call must not write is unchanged, and returns the outputs.
fn run_forward<T: Element, W: Element>(
    k: &Kernels,
    s: &Arc<CudaStream>,
    c: &Fwd,
    inp: &FwdIn<T>,
    what: &str,
) -> FwdOut<T> {
    let (rows, hidden) = (c.rows, c.hidden);
    let lanes = T::DTYPE.lanes_per_16b();
    let layout = |op| c.layout.of_operand(op);
    let lx = Laid::new(&inp.x, rows, hidden, layout(Operand::X), lanes);
    let lr = Laid::new(
        &inp.residual,
        rows,
        hidden,
        layout(Operand::Residual),
        lanes,
    );
    let w_vals: Vec<W> = inp.w_f64.iter().map(|&v| W::from_f64(v)).collect();
    let lw = Laid::new(&w_vals, 1, hidden, c.layout.of_weight(), lanes);
    let ly = Laid::<T>::poisoned(rows, hidden, layout(Operand::Y), lanes);
    let lh = Laid::<T>::poisoned(rows, hidden, layout(Operand::H), lanes);
    // rstd: contiguous, or every other f32 in the padded and misaligned layouts.
    let ls = Laid::<f32>::poisoned(rows, 1, c.layout, 1);

    let mut dx = lx.upload(s);
    let mut dr = lr.upload(s);
    let dw = lw.upload(s);
    let mut dy = ly.upload(s);
    let mut dh = lh.upload(s);
    let mut ds = ls.upload(s);

    // The kernel the call runs, from the same plan on the same addresses.
    let descs = {
        let x = lx.desc(s, &dx);
        let r = lr.desc(s, &dr);
        let y = if c.placement.y_over_x() {
            x
        } else {
            ly.desc(s, &dy)
        };
        let h = match c.placement {
            Outputs::AddHOverX => Some(x),
            Outputs::AddHOverResidual | Outputs::AddInPlace => Some(r),
            Outputs::Add | Outputs::AddYOverX => Some(lh.desc(s, &dh)),
            Outputs::Norm | Outputs::NormInPlace => None,
        };
        RmsNormFwdDescs {
            x,
            residual: c.placement.has_residual().then_some(r),
            weight: lw.desc(s, &dw),
            y,
            h,
            rstd: c.rstd.then(|| ls.desc(s, &ds)),
        }
    };
    let kernel = plan_rmsnorm_forward(&descs, &c.opts(), &k.norm_limits())
        .unwrap_or_else(|e| panic!("{what}: planning failed: {e}"))
        .kernel;

    let opts = c.opts();
    let w = lw.mat(&dw);
    let mut rstd_m = c.rstd.then(|| ls.mat_mut(&mut ds));
    let rstd = rstd_m.as_mut();
    let run = |io: Placement<'_, '_, T>| k.rmsnorm(s, io, &w, rstd, &opts);
    let result = match c.placement {
        Outputs::Add => run(Placement::Add {
            x: &lx.mat(&dx),
            residual: &lr.mat(&dr),
            y: &mut ly.mat_mut(&mut dy),
            h: &mut lh.mat_mut(&mut dh),
        }),
        Outputs::AddHOverX => run(Placement::AddHOverX {
            x: &mut lx.mat_mut(&mut dx),
            residual: &lr.mat(&dr),
            y: &mut ly.mat_mut(&mut dy),
        }),
        Outputs::AddHOverResidual => run(Placement::AddHOverResidual {
            x: &lx.mat(&dx),
            residual: &mut lr.mat_mut(&mut dr),
            y: &mut ly.mat_mut(&mut dy),
        }),
        Outputs::AddYOverX => run(Placement::AddYOverX {
            x: &mut lx.mat_mut(&mut dx),
            residual: &lr.mat(&dr),
            h: &mut lh.mat_mut(&mut dh),
        }),
        Outputs::AddInPlace => run(Placement::AddInPlace {
            x: &mut lx.mat_mut(&mut dx),
            residual: &mut lr.mat_mut(&mut dr),
        }),
        Outputs::Norm => run(Placement::Norm {
            x: &lx.mat(&dx),
            y: &mut ly.mat_mut(&mut dy),
        }),
        Outputs::NormInPlace => run(Placement::NormInPlace {
            x: &mut lx.mat_mut(&mut dx),
        }),
    };
    result.unwrap_or_else(|e| panic!("{what}: {e}"));

    let bx = download(s, &dx);
    let br = download(s, &dr);
    let bw = download(s, &dw);
    let by = download(s, &dy);
    let bh = download(s, &dh);
    let bs = download(s, &ds);
    let (x_written, r_written) = match c.placement {
        Outputs::AddHOverX | Outputs::AddYOverX | Outputs::NormInPlace => (true, false),
        Outputs::AddHOverResidual => (false, true),
        Outputs::AddInPlace => (true, true),
        Outputs::Add | Outputs::Norm => (false, false),
    };
    let y_separate = !c.placement.y_over_x();
    let h_separate = matches!(c.placement, Outputs::Add | Outputs::AddYOverX);
    assert_untouched(&format!("{what}: x"), &lx, &bx, x_written);
    assert_untouched(&format!("{what}: residual"), &lr, &br, r_written);
    assert_untouched(&format!("{what}: weight"), &lw, &bw, false);
    assert_untouched(&format!("{what}: y buffer"), &ly, &by, y_separate);
    assert_untouched(&format!("{what}: h buffer"), &lh, &bh, h_separate);
    assert_untouched(&format!("{what}: rstd"), &ls, &bs, c.rstd);

    let y = if y_separate {
        ly.with_buf(by)
    } else {
        lx.with_buf(bx.clone())
    };
    let h = match c.placement {
        Outputs::AddHOverX => Some(lx.with_buf(bx)),
        Outputs::AddHOverResidual | Outputs::AddInPlace => Some(lr.with_buf(br)),
        Outputs::Add | Outputs::AddYOverX => Some(lh.with_buf(bh)),
        Outputs::Norm | Outputs::NormInPlace => None,
    };
    FwdOut {
        y,
        h,
        rstd: c.rstd.then(|| ls.with_buf(bs)),
        kernel,
    }
}

/// Compares a forward's outputs with the f64 reference, row by row in parallel.
fn check_forward<T: Element>(c: &Fwd, inp: &FwdIn<T>, out: &FwdOut<T>, what: &str) -> Worst {
    let dtype = T::DTYPE;
    let hidden = c.hidden;
    let looped = rmsnorm_forward_geometry(dtype, hidden).1.looped;
    let opts = RmsNormRef {
        eps: c.eps,
        gemma: c.gemma,
        hf: c.hf,
        normalize_stored_h: looped,
    };
    let parts = par_rows(c.rows, |rows| {
        let mut w = Worst::default();
        for r in rows {
            let x = &inp.x[r * hidden..(r + 1) * hidden];
            let res = c
                .placement
                .has_residual()
                .then(|| &inp.residual[r * hidden..(r + 1) * hidden]);
            let want = rmsnorm_forward_row(x, res, &inp.w_f64, &opts);
            if let Some(h) = &out.h {
                for i in 0..hidden {
                    let got = h.at(r, i);
                    assert!(
                        same(got, T::from_f64(want.h[i])),
                        "{what}: h[{r},{i}] = {} but x + residual rounded is {}",
                        got.to_f64(),
                        want.h[i]
                    );
                }
            }
            if let Some(s) = &out.rstd {
                let e = rel_err(s.at(r, 0) as f64, want.rstd);
                assert!(
                    e <= REL,
                    "{what}: rstd[{r}] = {} vs {} (rel {e:.2e})",
                    s.at(r, 0),
                    want.rstd
                );
                w.rstd_rel = w.rstd_rel.max(e);
            }
            for i in 0..hidden {
                let got = out.y.at(r, i).to_f64();
                if dtype == DType::F32 {
                    let e = rel_err(got, want.y[i]);
                    assert!(
                        e <= REL,
                        "{what}: y[{r},{i}] = {got} vs {} (rel {e:.2e} > {REL})",
                        want.y[i]
                    );
                    w.y_rel = w.y_rel.max(e);
                    continue;
                }
                let mut u = ulps(dtype, got, want.y[i]);
                if c.hf && u > 1 {
                    // The intermediate round(h * rstd) may fall on either side (module docs).
                    let w_eff = rmsnorm_weight(inp.w_f64[i], c.gemma);
                    for f in [1.0 - REL, 1.0 + REL] {
                        let alt = rmsnorm_hf_y::<T>(want.h[i], want.rstd * f, w_eff);
                        u = u.min(ulps(dtype, got, alt));
                    }
                }
                assert!(
                    u <= 1,
                    "{what}: y[{r},{i}] = {got} but the reference is {} ({} rounded): {u} ulps",
                    T::from_f64(want.y[i]).to_f64(),
                    want.y[i]
                );
                w.y_ulps = w.y_ulps.max(u);
                w.y_one_ulp += u;
                w.y_checked += 1;
            }
        }
        w
    });
    let mut w = Worst::default();
    for p in &parts {
        w.merge(p);
    }
    w
}

/// Runs and checks one forward case with weight type `W`.
fn forward_case<T: Element, W: Element>(
    k: &Kernels,
    s: &Arc<CudaStream>,
    c: &Fwd,
    seed: u64,
) -> (Worst, KernelId) {
    let what = format!("{} {c:?} seed {seed}", T::DTYPE.name());
    let inp = fwd_inputs::<T>(c, seed);
    let out = run_forward::<T, W>(k, s, c, &inp, &what);
    // Dense and padded rows are vector-friendly exactly when L divides H; off the grid, the
    // realigned kernel (a row split over a cluster: the realigned split) takes the rows it
    // fits when the weight is aligned.
    let realigned_fits = match out.kernel {
        KernelId::RmsNormFwdSplit(_, _, v) => {
            rmsnorm_split_smem_bytes(T::DTYPE, NormPath::Realigned, v).is_some()
        }
        KernelId::RmsNormFwdSplitNarrow(..) => true,
        _ => rmsnorm_realigned_fits(T::DTYPE, c.hidden as u64, W::DTYPE == DType::F32),
    };
    let want_mode = if c.layout.on_grid(c.hidden, T::DTYPE.lanes_per_16b()) {
        NormPath::V16
    } else if c.layout.of_weight() != Layout::Misaligned && realigned_fits {
        NormPath::Realigned
    } else {
        NormPath::Scalar
    };
    let Some((_, mode, _)) = out.kernel.rmsnorm_forward_form() else {
        panic!("{what}: planned {:?}", out.kernel)
    };
    assert_eq!(mode, want_mode, "{what}: vector path choice");
    (check_forward(c, &inp, &out, &what), out.kernel)
}

/// `forward_case` for a storage dtype chosen at run time, weight as storage dtype or f32.
fn forward_any(
    k: &Kernels,
    s: &Arc<CudaStream>,
    dtype: DType,
    c: &Fwd,
    seed: u64,
) -> (Worst, KernelId) {
    match (dtype, c.w_f32) {
        (DType::F32, _) => forward_case::<f32, f32>(k, s, c, seed),
        (DType::F16, false) => forward_case::<f16, f16>(k, s, c, seed),
        (DType::F16, true) => forward_case::<f16, f32>(k, s, c, seed),
        (DType::BF16, false) => forward_case::<bf16, bf16>(k, s, c, seed),
        (DType::BF16, true) => forward_case::<bf16, f32>(k, s, c, seed),
        (DType::F8E4M3, _) => unreachable!("the norm runs the storage dtypes"),
    }
}

/// Runs `cases` on a few threads, each with its own stream; returns the kernels they ran.
fn run_cases<C: Sync>(
    k: &Arc<Kernels>,
    cases: &[C],
    f: impl Fn(&Kernels, &Arc<CudaStream>, &C) -> KernelId + Sync,
) -> BTreeSet<String> {
    let next = Mutex::new(0usize);
    let seen = Mutex::new(BTreeSet::new());
    std::thread::scope(|sc| {
        for _ in 0..threads().min(8) {
            sc.spawn(|| {
                let s = k.context().new_stream().expect("stream");
                loop {
                    let i = {
                        let mut n = next.lock().unwrap();
                        *n += 1;
                        *n - 1
                    };
                    let Some(c) = cases.get(i) else { break };
                    let kernel = f(k, &s, c);
                    seen.lock().unwrap().insert(kernel.name().to_string());
                }
            });
        }
    });
    seen.into_inner().unwrap()
}

fn assert_covered(test: &str, seen: &BTreeSet<String>, filter: impl Fn(&KernelId) -> bool) {
    let missing: Vec<_> = KernelId::ALL
        .iter()
        .filter(|k| filter(k) && !seen.contains(k.name()))
        .map(|k| k.name())
        .collect();
    assert!(missing.is_empty(), "{test}: kernels never run: {missing:?}");
}

// ------------------------------------------------------------------------------------------
// Forward tests.
// ------------------------------------------------------------------------------------------

#[test]
fn forward_every_dtype_hidden_size_and_row_count() {
    let Some((k, _)) = gpu("forward_every_dtype_hidden_size_and_row_count") else {
        return;
    };
    let mut cases = Vec::new();
    for dtype in DType::ALL {
        for &hidden in &hidden_sizes() {
            for &rows in &row_counts() {
                if rows * hidden > MAX_ELEMS {
                    eprintln!(
                        "skipping {} {rows} x {hidden}: over {MAX_ELEMS} elements",
                        dtype.name()
                    );
                    continue;
                }
                cases.push((dtype, Fwd::new(rows, hidden)));
            }
        }
    }
    let worst = Mutex::new(Vec::new());
    run_cases(&k, &cases, |k, s, (dtype, c)| {
        let (w, kernel) = forward_any(k, s, *dtype, c, fresh_seed());
        record(&worst, *dtype, &w);
        kernel
    });
    report("forward_every_dtype_hidden_size_and_row_count", &worst);
}

/// Every placement x every option (Gemma, HF numerics, f32 weight, rstd output) x every
/// layout (vector and scalar kernels) x hidden sizes covering each kernel variant.
#[test]
fn forward_every_placement_option_and_layout() {
    let Some((k, _)) = gpu("forward_every_placement_option_and_layout") else {
        return;
    };
    // 140001: rows beyond the cluster split's reach (more than 16 tiles), so the looped
    // one-block kernels run on every path at any number of rows.
    let hidden: Vec<usize> = if quick() {
        vec![3, 896, 12289, 16384, 20000, 100000, 140001]
    } else {
        vec![
            1, 3, 769, 896, 4096, 5125, 7001, 12289, 16384, 65536, 70001, 100000, 140001,
        ]
    };
    let mut cases = Vec::new();
    let mut i = 0usize;
    for (di, dtype) in DType::ALL.into_iter().enumerate() {
        for (hi, &h) in hidden.iter().enumerate() {
            for (li, layout) in LAYOUTS.into_iter().enumerate() {
                if quick() && layout == Layout::Padded {
                    continue;
                }
                for (pi, placement) in PLACEMENTS.into_iter().enumerate() {
                    // Quick: one option set per (dtype, hidden, layout, placement); over the
                    // 24 of those per placement, `di * 8 + hi * 2 + lq` (lq: 0 dense, 1
                    // misaligned) takes every value mod 16, so each placement still meets
                    // every option set.
                    let lq = if quick() { usize::from(li == 2) } else { li };
                    let quick_opt = ((di * 8 + hi * 2 + lq + pi * 3) % 16) as u32;
                    for opt in 0..16u32 {
                        if quick() && opt != quick_opt {
                            continue;
                        }
                        i += 1;
                        let c = Fwd {
                            // More than one wave now and then, so the w-late
                            // kernels run as well as the w-first ones.
                            rows: if h <= 4096 && i % 4 == 3 {
                                2000
                            } else if h > 8192 && h <= 16384 && i % 4 == 3 {
                                // Rows of 32 elements per thread: more rows than the
                                // device holds such blocks at once, so the streamed kernel
                                // runs as well.
                                400
                            } else if h > 16384 && h < 140001 && i % 4 == 3 {
                                // Looped rows: more rows than multiprocessors, so the
                                // one-block kernel runs as well as the cluster split
                                // (140001 has no split: every row count runs it).
                                150
                            } else {
                                [1, 2, 7][i % 3]
                            },
                            placement,
                            layout,
                            gemma: opt & 1 != 0,
                            hf: opt & 2 != 0,
                            w_f32: opt & 4 != 0 && dtype != DType::F32,
                            rstd: opt & 8 != 0,
                            eps: [1e-6, 1e-5, 0.25][i % 3],
                            ..Fwd::new(1, h)
                        };
                        cases.push((dtype, c));
                    }
                }
            }
        }
    }
    let worst = Mutex::new(Vec::new());
    let seen = run_cases(&k, &cases, |k, s, (dtype, c)| {
        let (w, kernel) = forward_any(k, s, *dtype, c, fresh_seed());
        record(&worst, *dtype, &w);
        kernel
    });
    report("forward_every_placement_option_and_layout", &worst);
    // The split forward only where the device runs clusters, and two tiles per block only
    // where it does not run clusters of 16 (`forward_split_matches_the_looped_kernel_bitwise`
    // turns them off); the streamed forward only where the module has bulk copies.
    let limits = k.limits();
    let (clusters, wide) = (limits.clusters, limits.wide_clusters);
    assert_covered("forward_every_placement_option_and_layout", &seen, |k| {
        k.rmsnorm_forward_form().is_some()
            && match k {
                KernelId::RmsNormFwdSplit(_, _, v) => {
                    clusters && !(wide && *v == NormFwdVariant::E32)
                }
                // One-tile rows take them from 8 rows on (16 off the grid), which only the split
                // test runs.
                KernelId::RmsNormFwdSplitNarrow(..) => false,
                // Looped rows at 1-7 rows take the split where the device runs clusters;
                // `forward_loop_ahead_matches_the_looped_kernel_bitwise` runs every entry.
                KernelId::RmsNormFwdLoopAhead(..) => false,
                KernelId::RmsNormFwdStream(..) => limits.streamed_rows,
                _ => true,
            }
    });
}

/// The bits of a forward's outputs, row by row.
struct Bits {
    y: Vec<Vec<u32>>,
    h: Vec<Vec<u32>>,
    rstd: Vec<u32>,
}

fn bits_of<T: Element>(out: &FwdOut<T>) -> Bits {
    let rows = out.y.rows;
    Bits {
        y: (0..rows)
            .map(|r| out.y.row(r).iter().map(|&v| bits(v)).collect())
            .collect(),
        h: out
            .h
            .as_ref()
            .map(|h| {
                (0..rows)
                    .map(|r| h.row(r).iter().map(|&v| bits(v)).collect())
                    .collect()
            })
            .unwrap_or_default(),
        rstd: out
            .rstd
            .as_ref()
            .map(|s| (0..rows).map(|r| s.at(r, 0).to_bits()).collect())
            .unwrap_or_default(),
    }
}

fn assert_same_row(what: &str, a: &Bits, ra: usize, b: &Bits, rb: usize) {
    assert!(
        a.y[ra] == b.y[rb],
        "{what}: y of row {ra} differs from row {rb}"
    );
    if !a.h.is_empty() {
        assert!(
            a.h[ra] == b.h[rb],
            "{what}: h of row {ra} differs from row {rb}"
        );
    }
    if !a.rstd.is_empty() {
        assert_eq!(
            a.rstd[ra], b.rstd[rb],
            "{what}: rstd of row {ra} vs row {rb}"
        );
    }
}

/// Rows `idx` of `inp` as a new case's inputs.
fn pick<T: Element>(c: &Fwd, inp: &FwdIn<T>, idx: &[usize]) -> FwdIn<T> {
    let h = c.hidden;
    let gather = |v: &[T]| {
        idx.iter()
            .flat_map(|&r| v[r * h..(r + 1) * h].iter().copied())
            .collect()
    };
    FwdIn {
        x: gather(&inp.x),
        residual: gather(&inp.residual),
        w_f64: inp.w_f64.clone(),
    }
}

fn batch_invariance<T: Element, W: Element>(
    k: &Kernels,
    s: &Arc<CudaStream>,
    hidden: usize,
    opt: u32,
) {
    // A batch of several waves of blocks (the only rows-dependent choice of the planner is
    // w-first for a single wave), so the batch runs the w-late kernel while its rows alone and
    // in sevens run the w-first one: 2000 rows (H <= 4096) in the quick run, 4096 otherwise
    // (16384 rows took this test past 4.5 minutes, in host-side layout work, for no other
    // kernel or plan).
    let big = if quick() {
        if hidden <= 4096 { 2000 } else { 300 }
    } else if hidden <= 16384 {
        4096
    } else {
        1024
    };
    let seed = fresh_seed();
    let base = Fwd {
        gemma: opt & 1 != 0,
        hf: opt & 2 != 0,
        w_f32: T::DTYPE != W::DTYPE,
        ..Fwd::new(big, hidden)
    };
    let what = format!("{} {base:?} seed {seed}", T::DTYPE.name());
    let inp = fwd_inputs::<T>(&base, seed);
    let full = bits_of(&run_forward::<T, W>(k, s, &base, &inp, &what));
    // Determinism: the same batch again.
    let again = bits_of(&run_forward::<T, W>(k, s, &base, &inp, &what));
    for r in 0..big {
        assert_same_row(&format!("{what}: second run"), &again, r, &full, r);
    }
    // The scalar kernels (misaligned buffers) on the same batch.
    let scalar = Fwd {
        layout: Layout::Misaligned,
        ..base
    };
    let sc = bits_of(&run_forward::<T, W>(k, s, &scalar, &inp, &what));
    for r in 0..big {
        assert_same_row(
            &format!("{what}: scalar vs vector kernel"),
            &sc,
            r,
            &full,
            r,
        );
    }
    // The realigned kernel (buffers off the grid, the weight on it) where its geometry allows,
    // the scalar one beyond, on the same batch.
    let shifted = Fwd {
        layout: Layout::Shifted,
        ..base
    };
    let sh = bits_of(&run_forward::<T, W>(k, s, &shifted, &inp, &what));
    for r in 0..big {
        assert_same_row(
            &format!("{what}: shifted vs vector kernel"),
            &sh,
            r,
            &full,
            r,
        );
    }
    for &p in &[0, 1, big / 2 + 3, big - 1] {
        // Alone, and with the vLLM in-place placement (another call, same arithmetic).
        let one = Fwd { rows: 1, ..base };
        let alone = bits_of(&run_forward::<T, W>(
            k,
            s,
            &one,
            &pick(&one, &inp, &[p]),
            &what,
        ));
        assert_same_row(&format!("{what}: row {p} alone"), &alone, 0, &full, p);
        for pos in [0usize, 3, 6] {
            let idx: Vec<usize> = (0..7)
                .map(|j| if j == pos { p } else { (p + 11 * j + 5) % big })
                .collect();
            let seven = Fwd {
                rows: 7,
                placement: Outputs::AddInPlace,
                layout: if pos == 3 {
                    Layout::Padded
                } else {
                    Layout::Dense
                },
                ..base
            };
            let got = bits_of(&run_forward::<T, W>(
                k,
                s,
                &seven,
                &pick(&seven, &inp, &idx),
                &what,
            ));
            assert_same_row(
                &format!("{what}: row {p} at {pos} of 7"),
                &got,
                pos,
                &full,
                p,
            );
        }
    }
}

/// A row's y, h and rstd are bitwise the same alone, in a batch of 7 (at several positions,
/// in place or not), in a batch of several waves of blocks (4096 rows; 1024 at H = 65536),
/// through the vector or the scalar kernel, and from one run to the next.
#[test]
fn forward_is_batch_invariant_and_deterministic_bitwise() {
    let Some((k, s)) = gpu("forward_is_batch_invariant_and_deterministic_bitwise") else {
        return;
    };
    // Quick still has every forward form: rows packed in a block (896), one row per block with
    // the weight loaded first or late (4096), 32 per thread (16384), looped (20000).
    let hidden: Vec<usize> = if quick() {
        vec![896, 4096, 16384, 20000]
    } else {
        vec![8, 896, 4096, 5120, 8192, 16384, 65536]
    };
    for &h in &hidden {
        for opt in [0u32, 3] {
            batch_invariance::<f32, f32>(&k, &s, h, opt);
            batch_invariance::<f16, f16>(&k, &s, h, opt);
            batch_invariance::<bf16, bf16>(&k, &s, h, opt);
        }
        batch_invariance::<bf16, f32>(&k, &s, h, 0);
    }
    // Odd sizes: rows start at every offset from the 16-byte grid within one batch, and the
    // realigned kernel (whole rows, or looped beyond 16384 elements) and the scalar one give
    // the same bits, in any batch; a looped row alone runs on a cluster where there are
    // clusters.
    for h in [
        1usize, 3, 769, 1001, 4095, 5125, 7001, 8193, 12289, 16383, 16385, 20001, 65537,
    ] {
        let c = Fwd::new(64, h);
        let seed = fresh_seed();
        let inp = fwd_inputs::<bf16>(&c, seed);
        let what = format!("bf16 {c:?} seed {seed}");
        let full = bits_of(&run_forward::<bf16, bf16>(&k, &s, &c, &inp, &what));
        for layout in [Layout::Misaligned, Layout::Shifted, Layout::Staggered] {
            let other = Fwd { layout, ..c };
            let got = bits_of(&run_forward::<bf16, bf16>(&k, &s, &other, &inp, &what));
            for r in 0..c.rows {
                assert_same_row(&format!("{what}: {layout:?} vs dense"), &got, r, &full, r);
            }
        }
        for p in [0, 37, 63] {
            let one = Fwd { rows: 1, ..c };
            let alone = bits_of(&run_forward::<bf16, bf16>(
                &k,
                &s,
                &one,
                &pick(&one, &inp, &[p]),
                &what,
            ));
            assert_same_row(&format!("{what}: row {p} alone"), &alone, 0, &full, p);
        }
    }
}

/// Whether [`forward_split_matches_the_looped_kernel_bitwise`] ran a one-tile split entry for
/// three blocks per multiprocessor, and one for two where the first exists.
static NARROW_SPLIT_RAN: AtomicBool = AtomicBool::new(false);
static TWO_BLOCK_SPLIT_RAN: AtomicBool = AtomicBool::new(false);

/// The cluster-split forward (long rows, few rows per call) against the f64 reference, and
/// bit for bit against the looped one-block kernel on the same rows (the split turned off),
/// for one and two tiles per block, every option set, rows alone and in small batches, on
/// the vector path and off it (odd row lengths, rows and operands at odd offsets), one-tile
/// rows on the entries for three blocks per multiprocessor and, switched off
/// (`Kernels::set_narrow_split`), on those for two.
#[test]
fn forward_split_matches_the_looped_kernel_bitwise() {
    let Some((k, s)) = gpu("forward_split_matches_the_looped_kernel_bitwise") else {
        return;
    };
    if !k.limits().clusters {
        eprintln!("skipping forward_split_matches_the_looped_kernel_bitwise: no clusters");
        return;
    }
    // Tiles (16-bit, f32): 20000 -> 3, 3; 32768 -> 4, 4; 65536 -> 8, 8 (one per block);
    // 100000 -> 13, 13 and 131072 -> 16, 16 (two per block); one element fewer or more, the
    // same counts (32769 and 65535 for f32: 5 and 8) on the scalar path.
    // Quick (the sanitizer runs): one and two tiles per block on both paths, two option sets.
    let hidden: &[usize] = if quick() {
        &[20000, 100000, 20001, 100003]
    } else {
        &[
            20000, 32768, 65536, 100000, 131072, 20001, 32769, 65535, 100003, 131071,
        ]
    };
    let mut i = 0usize;
    let mut failed = Vec::new();
    let mut variants = BTreeSet::new();
    for &h in hidden {
        for dtype in DType::ALL {
            for opt in 0..16u32 {
                if quick() && opt != 0 && opt != 15 {
                    continue;
                }
                i += 1;
                // Where the device runs clusters of 16 blocks, rows of 9-16 tiles take one
                // tile per block with them and two without: every other case without. Every
                // third case runs one-tile rows on the entries for two blocks per multiprocessor
                // (counted from the first, so that in the quick run the cases of 32 rows of one
                // tile per block, the only ones there to reach the three-block entries, keep
                // them).
                let wide = i.is_multiple_of(2);
                k.set_wide_clusters(wide);
                k.set_narrow_split(i % 3 != 1);
                let wide = wide && k.limits().wide_clusters;
                if let Some((v, _)) = rmsnorm_split_geometry(dtype, h as u64, wide) {
                    variants.insert(format!("{v:?}"));
                }
                let c = Fwd {
                    placement: PLACEMENTS[i % PLACEMENTS.len()],
                    gemma: opt & 1 != 0,
                    hf: opt & 2 != 0,
                    w_f32: opt & 4 != 0 && dtype != DType::F32,
                    rstd: opt & 8 != 0 || i.is_multiple_of(3),
                    layout: LAYOUTS[(i / 4) % LAYOUTS.len()],
                    ..Fwd::new([1, 2, 7, 32][i % 4], h)
                };
                let seed = fresh_seed();
                // Every case runs; the failures are listed at the end.
                let split = |k: &KernelId| {
                    let narrow = matches!(k, KernelId::RmsNormFwdSplitNarrow(..));
                    NARROW_SPLIT_RAN.fetch_or(narrow, Ordering::Relaxed);
                    let two_block = matches!(k, KernelId::RmsNormFwdSplit(d, p, NormFwdVariant::E16)
                        if KernelId::RmsNormFwdSplitNarrow(*d, *p).exists());
                    TWO_BLOCK_SPLIT_RAN.fetch_or(two_block, Ordering::Relaxed);
                    narrow || matches!(k, KernelId::RmsNormFwdSplit(..))
                };
                if !same_bits_when_off(&k, &s, dtype, (&c, seed), split, Kernels::set_cluster_split)
                {
                    failed.push(format!("{} {c:?} seed {seed}", dtype.name()));
                }
            }
        }
    }
    k.set_cluster_split(true);
    k.set_wide_clusters(true);
    k.set_narrow_split(true);
    assert!(
        NARROW_SPLIT_RAN.load(Ordering::Relaxed) && TWO_BLOCK_SPLIT_RAN.load(Ordering::Relaxed),
        "one-tile rows on the entries for three blocks per multiprocessor: {}, for two: {}",
        NARROW_SPLIT_RAN.load(Ordering::Relaxed),
        TWO_BLOCK_SPLIT_RAN.load(Ordering::Relaxed)
    );
    assert_eq!(
        variants.len(),
        2,
        "one and two tiles per block: {variants:?}"
    );
    assert!(
        failed.is_empty(),
        "{} cases failed: {failed:#?}",
        failed.len()
    );
}

/// The looped forward's loads-ahead entries [`forward_loop_ahead_matches_the_looped_kernel_bitwise`]
/// ran, by name.
static LOOP_AHEAD_RAN: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());

/// The looped forward's loads-ahead form (calls of at most one row per two multiprocessors)
/// against the f64 reference, and bit for bit against the looped kernel for two rows per
/// multiprocessor on the same rows (`Kernels::set_loop_ahead` off), every dtype, several
/// option sets and placements, on the vector path and the scalar one, at row counts that the
/// split forward does not take.
#[test]
fn forward_loop_ahead_matches_the_looped_kernel_bitwise() {
    let Some((k, s)) = gpu("forward_loop_ahead_matches_the_looped_kernel_bitwise") else {
        return;
    };
    // Past the split's three eighths of the multiprocessors (rows of fewer than 8 tiles), at
    // most half of them.
    let sm = k.sm_count() as usize;
    let rows = [sm * 3 / 8 + 1, sm / 2];
    // Tiles (16-bit, f32): 20000 -> 3, 3; 49152 -> 6, 6; 20001 and 24577 (the scalar path:
    // every operand one element off its alignment) -> 3, 3 and 4, 4.
    let hidden: &[usize] = if quick() {
        &[20000, 20001]
    } else {
        &[20000, 49152, 20001, 24577]
    };
    let opts: &[u32] = if quick() { &[0, 15] } else { &[0, 5, 10, 15] };
    let mut i = 0usize;
    let mut failed = Vec::new();
    for &h in hidden {
        for dtype in DType::ALL {
            for &opt in opts {
                i += 1;
                let layout = if h % 2 == 1 {
                    Layout::Misaligned
                } else {
                    [Layout::Dense, Layout::Padded, Layout::Misaligned][i % 3]
                };
                let c = Fwd {
                    placement: PLACEMENTS[i % PLACEMENTS.len()],
                    gemma: opt & 1 != 0,
                    hf: opt & 2 != 0,
                    w_f32: opt & 4 != 0 && dtype != DType::F32,
                    rstd: opt & 8 != 0,
                    layout,
                    ..Fwd::new(rows[i % 2], h)
                };
                let seed = fresh_seed();
                let ahead = |k: &KernelId| {
                    let ran = matches!(k, KernelId::RmsNormFwdLoopAhead(..));
                    if ran {
                        LOOP_AHEAD_RAN.lock().unwrap().insert(k.name());
                    }
                    ran
                };
                if !same_bits_when_off(&k, &s, dtype, (&c, seed), ahead, Kernels::set_loop_ahead) {
                    failed.push(format!("{} {c:?} seed {seed}", dtype.name()));
                }
            }
        }
    }
    let ran = LOOP_AHEAD_RAN.lock().unwrap().clone();
    let want: BTreeSet<&str> = KernelId::ALL
        .iter()
        .filter(|k| matches!(k, KernelId::RmsNormFwdLoopAhead(..)))
        .map(|k| k.name())
        .collect();
    assert_eq!(ran, want, "loads-ahead entries that ran");
    assert!(
        failed.is_empty(),
        "{} cases failed: {failed:#?}",
        failed.len()
    );
}

/// The streamed forward (rows of 32 elements per thread on the vector path, past one wave of
/// rows, sm_90) against the f64 reference, and bit for bit against the register kernel on the
/// same rows (the streaming turned off), every dtype, option set and placement, dense and
/// padded rows.
#[test]
fn forward_streamed_rows_match_the_register_kernel_bitwise() {
    let Some((k, s)) = gpu("forward_streamed_rows_match_the_register_kernel_bitwise") else {
        return;
    };
    if !k.limits().streamed_rows {
        eprintln!(
            "skipping forward_streamed_rows_match_the_register_kernel_bitwise: no bulk copies"
        );
        return;
    }
    // Past one wave of one block per multiprocessor; rows of 16-bit 8200 (288 threads) and
    // 16384 (512), f32 12288 (384) and 16384.
    let rows = k.limits().sm_count as usize + if quick() { 7 } else { 300 };
    let mut i = 0usize;
    let mut failed = Vec::new();
    for dtype in DType::ALL {
        let hidden: &[usize] = match (dtype, quick()) {
            (DType::F32, true) => &[12288],
            (DType::F32, false) => &[12288, 16384],
            (_, true) => &[8200],
            (_, false) => &[8200, 16384],
        };
        for &h in hidden {
            for opt in 0..16u32 {
                if quick() && opt != 0 && opt != 15 {
                    continue;
                }
                i += 1;
                let c = Fwd {
                    placement: PLACEMENTS[i % PLACEMENTS.len()],
                    gemma: opt & 1 != 0,
                    hf: opt & 2 != 0 && dtype != DType::F32,
                    w_f32: opt & 4 != 0 && dtype != DType::F32,
                    rstd: opt & 8 != 0 || i.is_multiple_of(3),
                    layout: [Layout::Dense, Layout::Padded][i % 2],
                    ..Fwd::new(rows, h)
                };
                let seed = fresh_seed();
                // Every case runs; the failures are listed at the end.
                let streamed = |k: &KernelId| matches!(k, KernelId::RmsNormFwdStream(..));
                let switch = Kernels::set_row_streaming;
                if !same_bits_when_off(&k, &s, dtype, (&c, seed), streamed, switch) {
                    failed.push(format!("{} {c:?} seed {seed}", dtype.name()));
                }
            }
        }
    }
    assert!(
        failed.is_empty(),
        "{} cases failed: {failed:#?}",
        failed.len()
    );
}

/// Rows of more tiles than the looped kernel's ring holds (33 and 66 tiles: the ring is
/// combined and reused several times) against the f64 reference, every dtype, on the vector
/// grid and off it (the looped realigned kernel).
#[test]
fn forward_rows_longer_than_the_tile_ring() {
    let Some((k, s)) = gpu("forward_rows_longer_than_the_tile_ring") else {
        return;
    };
    for dtype in DType::ALL {
        for (rows, hidden) in [
            (3usize, 270_000usize),
            (1, 540_000),
            (3, 270_001),
            (1, 540_003),
        ] {
            let c = Fwd {
                hf: rows == 1,
                ..Fwd::new(rows, hidden)
            };
            let (_, kernel) = forward_any(&k, &s, dtype, &c, fresh_seed());
            assert!(
                matches!(
                    kernel.rmsnorm_forward_form(),
                    Some((_, _, NormFwdVariant::Loop))
                ),
                "{kernel:?}"
            );
            if hidden % 2 == 1 {
                assert!(
                    matches!(kernel, KernelId::RmsNormFwdRealigned(_, _)),
                    "{kernel:?}"
                );
            }
        }
    }
}

/// One case of a test of a kernel the plan picks for `c` (`picked`) against the one it runs
/// with that kernel switched off (`switch(k, false)`, both computing the same bits), for `c`'s
/// storage and weight dtypes: the f64 reference, then bit for bit. `false` when it failed (the
/// panic's message printed).
fn same_bits_when_off(
    k: &Kernels,
    s: &Arc<CudaStream>,
    dtype: DType,
    (c, seed): (&Fwd, u64),
    picked: fn(&KernelId) -> bool,
    switch: fn(&Kernels, bool),
) -> bool {
    let run = || match (dtype, c.w_f32) {
        (DType::F32, _) => same_bits_typed::<f32, f32>(k, s, (c, seed), picked, switch),
        (DType::F16, false) => same_bits_typed::<f16, f16>(k, s, (c, seed), picked, switch),
        (DType::F16, true) => same_bits_typed::<f16, f32>(k, s, (c, seed), picked, switch),
        (DType::BF16, false) => same_bits_typed::<bf16, bf16>(k, s, (c, seed), picked, switch),
        (DType::BF16, true) => same_bits_typed::<bf16, f32>(k, s, (c, seed), picked, switch),
        (DType::F8E4M3, _) => unreachable!("the norm runs the storage dtypes"),
    };
    let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).is_ok();
    switch(k, true);
    ok
}

/// [`same_bits_when_off`] with the storage dtype `T` and the weight's `W`.
fn same_bits_typed<T: Element, W: Element>(
    k: &Kernels,
    s: &Arc<CudaStream>,
    (c, seed): (&Fwd, u64),
    picked: fn(&KernelId) -> bool,
    switch: fn(&Kernels, bool),
) {
    let what = format!("{} {c:?} seed {seed}", T::DTYPE.name());
    let inp = fwd_inputs::<T>(c, seed);
    let on = run_forward::<T, W>(k, s, c, &inp, &what);
    assert!(picked(&on.kernel), "{what}: planned {:?}", on.kernel);
    check_forward(c, &inp, &on, &what);
    switch(k, false);
    let off = run_forward::<T, W>(k, s, c, &inp, &what);
    switch(k, true);
    assert!(
        !picked(&off.kernel),
        "{what}: switched off, planned {:?}",
        off.kernel
    );
    let (a, b) = (bits_of(&on), bits_of(&off));
    for r in 0..c.rows {
        assert_same_row(&format!("{what}: {:?} vs off", on.kernel), &a, r, &b, r);
    }
}

/// The sm_80 module (what Ampere and Ada GPUs run: no clusters, bulk copies or programmatic
/// launch) loaded beside the device's own on a newer GPU gives the same bits: forward rows on
/// every form the device's module plans (packed rows, w-first and w-late, 32 per thread and
/// streamed past one wave, looped and split over a cluster, realigned and scalar) against the
/// one-block kernels the sm_80 module runs for them, and the backward's `dx` and `dw` (the
/// one-launch form and two launches), each also against the f64 reference.
#[test]
fn the_oldest_module_gives_the_same_bits() {
    same_bits_beside(
        "the_oldest_module_gives_the_same_bits",
        common::oldest_module,
    );
}

/// The device's own module compiled from its PTX by the driver gives the same bits as its
/// prebuilt SASS, on the cases of [`the_oldest_module_gives_the_same_bits`].
#[test]
fn the_driver_compiled_ptx_gives_the_same_bits() {
    same_bits_beside(
        "the_driver_compiled_ptx_gives_the_same_bits",
        common::own_module_from_ptx,
    );
}

/// The test kernels against a second load of the kernels in their context (`beside`: `None`
/// where `test` skips) on [`same_bits_on_both`]'s cases.
fn same_bits_beside(test: &str, beside: fn(&str, &Kernels) -> Option<Arc<Kernels>>) {
    let Some((k, s)) = gpu(test) else {
        return;
    };
    let Some(other) = beside(test, &k) else {
        return;
    };
    let failed = same_bits_on_both(&k, &other, &s);
    assert!(
        failed.is_empty(),
        "{} cases failed: {failed:#?}",
        failed.len()
    );
}

/// The cases that two loads of the kernels (`k` and `other`: two modules, or two compilations
/// of one) must compute the same bits for, `other`'s also against the f64 reference: forward
/// rows of every form, and the backward. The failed cases.
fn same_bits_on_both(k: &Arc<Kernels>, other: &Arc<Kernels>, s: &Arc<CudaStream>) -> Vec<String> {
    let wave = k.limits().sm_count as usize + 7;
    let forward = [
        (1, 8),
        (64, 896),
        (7, 4096),
        (300, 5120),
        (wave, 8200),
        (wave, 16384),
        (3, 16384),
        (2, 20000),
        (1, 65536),
        (4, 131072),
        (64, 1001),
        (5, 20001),
        (16, 100003),
        (300, 4093),
    ];
    let mut failed = Vec::new();
    let mut i = 0usize;
    for (rows, hidden) in forward {
        for dtype in DType::ALL {
            i += 1;
            let c = Fwd {
                placement: PLACEMENTS[i % PLACEMENTS.len()],
                gemma: i % 2 == 1,
                hf: i % 3 == 1 && dtype != DType::F32,
                w_f32: i % 4 == 1 && dtype != DType::F32,
                layout: if hidden % 8 == 0 {
                    [Layout::Dense, Layout::Padded][i % 2]
                } else {
                    LAYOUTS[i % LAYOUTS.len()]
                },
                ..Fwd::new(rows, hidden)
            };
            let seed = fresh_seed();
            let run = || match (dtype, c.w_f32) {
                (DType::F32, _) => same_bits_across::<f32, f32>((k, other), s, &c, seed),
                (DType::F16, false) => same_bits_across::<f16, f16>((k, other), s, &c, seed),
                (DType::F16, true) => same_bits_across::<f16, f32>((k, other), s, &c, seed),
                (DType::BF16, false) => same_bits_across::<bf16, bf16>((k, other), s, &c, seed),
                (DType::BF16, true) => same_bits_across::<bf16, f32>((k, other), s, &c, seed),
                (DType::F8E4M3, _) => unreachable!(),
            };
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).is_err() {
                failed.push(format!("{} {c:?} seed {seed}", dtype.name()));
            }
        }
    }
    let backward = [
        (1, 896),
        (64, 4096),
        (600, 8192),
        (3000, 896),
        (70, 7001),
        (16, 20000),
        (300, 4607),
        (300, 16384),
        (2, 65536),
        (5, 32770),
    ];
    for (rows, hidden) in backward {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            i += 1;
            let c = Bwd {
                rows,
                hidden,
                placement: BWD_PLACEMENTS[i % BWD_PLACEMENTS.len()],
                layout: BWD_LAYOUTS[i % BWD_LAYOUTS.len()],
                gemma: i % 2 == 1,
                w_f32: false,
            };
            let seed = fresh_seed();
            let run = || match dtype {
                DType::F32 => same_backward_bits_across::<f32>((k, other), s, &c, seed),
                DType::F16 => same_backward_bits_across::<f16>((k, other), s, &c, seed),
                _ => same_backward_bits_across::<bf16>((k, other), s, &c, seed),
            };
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).is_err() {
                failed.push(format!("{} backward {c:?} seed {seed}", dtype.name()));
            }
        }
    }
    failed
}

/// One forward case of [`same_bits_on_both`]: the second load's outputs against the f64
/// reference, then bit for bit against the first's.
fn same_bits_across<T: Element, W: Element>(
    (own, other): (&Kernels, &Kernels),
    s: &Arc<CudaStream>,
    c: &Fwd,
    seed: u64,
) {
    let what = format!("{} {c:?} seed {seed}", T::DTYPE.name());
    let inp = fwd_inputs::<T>(c, seed);
    let a = run_forward::<T, W>(own, s, c, &inp, &what);
    let b = run_forward::<T, W>(other, s, c, &inp, &what);
    check_forward(c, &inp, &b, &what);
    let what = format!(
        "{what}: {} {:?} vs {} {:?}",
        common::load_name(own),
        a.kernel,
        common::load_name(other),
        b.kernel
    );
    let (a, b) = (bits_of(&a), bits_of(&b));
    for r in 0..c.rows {
        assert_same_row(&what, &a, r, &b, r);
    }
}

/// One backward case of [`same_bits_on_both`], as [`same_bits_across`].
fn same_backward_bits_across<T: Element>(
    (own, other): (&Kernels, &Kernels),
    s: &Arc<CudaStream>,
    c: &Bwd,
    seed: u64,
) {
    let what = format!("{} backward {c:?} seed {seed}", T::DTYPE.name());
    let inp = bwd_inputs::<T>(c, seed);
    let a = run_backward::<T, T>(own, s, c, &inp, &what);
    let b = run_backward::<T, T>(other, s, c, &inp, &what);
    check_backward(c, &inp, &b, &what);
    let what = format!(
        "{what}: {} {:?} vs {} {:?}",
        common::load_name(own),
        a.kernels,
        common::load_name(other),
        b.kernels
    );
    assert!(same_all(&a.dx.buf, &b.dx.buf), "{what}: dx differs");
    assert!(same_all(&a.dw, &b.dw), "{what}: dw differs");
}

/// Calls rejected by validation return the error and write nothing; empty shapes are no-ops.
#[test]
fn rejected_and_empty_calls_write_nothing() {
    let Some((k, s)) = gpu("rejected_and_empty_calls_write_nothing") else {
        return;
    };
    let (rows, hidden) = (4, 256);
    let x = s
        .clone_htod(&vec![bf16::from_f32(1.0); rows * hidden])
        .unwrap();
    let r = s
        .clone_htod(&vec![bf16::from_f32(0.5); rows * hidden])
        .unwrap();
    let w = s.clone_htod(&vec![bf16::from_f32(1.0); hidden]).unwrap();
    let mut y = s
        .clone_htod(&vec![poison::<bf16>(); rows * hidden])
        .unwrap();
    let mut h = s
        .clone_htod(&vec![poison::<bf16>(); rows * hidden])
        .unwrap();
    let call = |y: &mut CudaSlice<bf16>, h: &mut CudaSlice<bf16>, eps: f32, wcols: usize| {
        k.rmsnorm(
            &s,
            Placement::Add {
                x: &Mat::new(x.as_view(), rows, hidden),
                residual: &Mat::new(r.as_view(), rows, hidden),
                y: &mut MatMut::new(y.as_view_mut(), rows, hidden),
                h: &mut MatMut::new(h.as_view_mut(), rows, hidden),
            },
            &Mat::new(w.as_view(), 1, wcols),
            None,
            &RmsNormOptions::new(eps),
        )
    };
    assert_matches!(
        call(&mut y, &mut h, 0.0, hidden),
        Err(Error::InvalidArgument { what: "eps", .. })
    );
    assert_matches!(
        call(&mut y, &mut h, f32::NAN, hidden),
        Err(Error::InvalidArgument { .. })
    );
    assert_matches!(
        call(&mut y, &mut h, 1e-6, hidden - 1),
        Err(Error::ShapeMismatch { .. })
    );
    for v in download(&s, &y).into_iter().chain(download(&s, &h)) {
        assert!(v.to_f64().is_nan(), "a rejected call wrote an output");
    }
    // Zero rows: nothing to do.
    k.rmsnorm(
        &s,
        Placement::Norm {
            x: &Mat::new(x.as_view(), 0, hidden),
            y: &mut MatMut::new(y.as_view_mut(), 0, hidden),
        },
        &Mat::new(w.as_view(), 1, hidden),
        None,
        &RmsNormOptions::new(1e-6),
    )
    .unwrap();
    assert!(download(&s, &y).iter().all(|v| v.to_f64().is_nan()));
    // A valid call then writes everything: y = 1.5 / sqrt(1.5^2 + eps) ~ 1.
    call(&mut y, &mut h, 1e-6, hidden).unwrap();
    assert!(
        download(&s, &y)
            .iter()
            .all(|v| (v.to_f64() - 1.0).abs() < 0.01)
    );
    assert!(download(&s, &h).iter().all(|v| v.to_f64() == 1.5));
    // Backward with zero rows writes dw = 0.
    let mut dw = s.clone_htod(&vec![poison::<bf16>(); hidden]).unwrap();
    let mut dx = s.clone_htod(&vec![poison::<bf16>(); 1]).unwrap();
    let rstd = s.clone_htod(&vec![1.0f32; 1]).unwrap();
    let mut ws = s.clone_htod(&vec![0.0f32; 1]).unwrap();
    k.rmsnorm_backward(
        &s,
        GradPlacement::Separate {
            dy: &Mat::new(x.as_view(), 0, hidden),
            dres: None,
            dx: &mut MatMut::new(dx.as_view_mut(), 0, hidden),
        },
        SavedForward {
            h: &Mat::new(r.as_view(), 0, hidden),
            rstd: &Mat::new(rstd.as_view(), 0, 1),
            weight: &Mat::new(w.as_view(), 1, hidden),
        },
        &mut MatMut::new(dw.as_view_mut(), 1, hidden),
        &mut ws,
        &RmsNormOptions::new(1e-6),
    )
    .unwrap();
    assert!(download(&s, &dw).iter().all(|v| v.to_f64() == 0.0));
    assert!(download(&s, &dx)[0].to_f64().is_nan());
}

// ------------------------------------------------------------------------------------------
// The backward.
// ------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BwdPlace {
    /// `dx` in its own buffer, no incoming residual gradient.
    Separate,
    /// `dx` in its own buffer, plus an incoming residual gradient.
    SeparateDres,
    /// `dx` over `dy`.
    OverDy,
    /// `dx` over `dy`, plus an incoming residual gradient.
    OverDyDres,
    /// `dx` accumulated into the incoming residual gradient's buffer.
    Accumulate,
}

const BWD_PLACEMENTS: [BwdPlace; 5] = [
    BwdPlace::Separate,
    BwdPlace::SeparateDres,
    BwdPlace::OverDy,
    BwdPlace::OverDyDres,
    BwdPlace::Accumulate,
];

impl BwdPlace {
    fn has_dres(self) -> bool {
        !matches!(self, BwdPlace::Separate | BwdPlace::OverDy)
    }
}

impl Bwd {
    /// The backward reads only `gemma` of the options.
    fn opts(&self) -> RmsNormOptions {
        RmsNormOptions::new(1e-6).with_gemma(self.gemma)
    }
}

#[derive(Clone, Copy, Debug)]
struct Bwd {
    rows: usize,
    hidden: usize,
    placement: BwdPlace,
    layout: Layout,
    gemma: bool,
    w_f32: bool,
}

struct BwdIn<T> {
    dy: Vec<T>,
    h: Vec<T>,
    dres: Vec<T>,
    w_f64: Vec<f64>,
    /// The saved rstd, as the forward would have stored it (f32).
    rstd: Vec<f32>,
}

fn bwd_inputs<T: Element>(c: &Bwd, seed: u64) -> BwdIn<T> {
    let n = c.rows * c.hidden;
    let dy = random_vec::<T>(seed, n, 1.0);
    let h = random_vec::<T>(seed.wrapping_add(1), n, 2.0);
    let dres = random_vec::<T>(seed.wrapping_add(2), n, 1.0);
    let w_raw = random_vec::<f32>(seed.wrapping_add(3), c.hidden, 1.5);
    let w_f64 = if c.w_f32 {
        w_raw.iter().map(|&v| v as f64).collect()
    } else {
        w_raw
            .iter()
            .map(|&v| T::from_f64(v as f64).to_f64())
            .collect()
    };
    let rstd = (0..c.rows)
        .map(|r| {
            let row: Vec<f64> = h[r * c.hidden..(r + 1) * c.hidden]
                .iter()
                .map(|v| v.to_f64())
                .collect();
            rmsnorm_rstd(&row, 1e-6) as f32
        })
        .collect();
    BwdIn {
        dy,
        h,
        dres,
        w_f64,
        rstd,
    }
}

struct BwdOut<T, W> {
    dx: Laid<T>,
    dw: Vec<W>,
    /// The rows kernel and, with two launches, the `dw` kernel.
    kernels: (KernelId, Option<KernelId>),
}

fn run_backward<T: Element, W: Element>(
    k: &Kernels,
    s: &Arc<CudaStream>,
    c: &Bwd,
    inp: &BwdIn<T>,
    what: &str,
) -> BwdOut<T, W> {
    run_backward_in::<T, W>(k, s, c, inp, what, false).0
}

/// [`run_backward`] with the workspace filled with all-ones bits first, and whether the call
/// wrote any of it.
fn run_backward_ws<T: Element, W: Element>(
    k: &Kernels,
    s: &Arc<CudaStream>,
    c: &Bwd,
    inp: &BwdIn<T>,
    what: &str,
) -> (BwdOut<T, W>, bool) {
    run_backward_in::<T, W>(k, s, c, inp, what, true)
}

fn run_backward_in<T: Element, W: Element>(
    k: &Kernels,
    s: &Arc<CudaStream>,
    c: &Bwd,
    inp: &BwdIn<T>,
    what: &str,
    fill_ws: bool,
) -> (BwdOut<T, W>, bool) {
    let (rows, hidden) = (c.rows, c.hidden);
    let lanes = T::DTYPE.lanes_per_16b();
    let at = |n| c.layout.of_bwd_operand(n);
    let ldy = Laid::new(&inp.dy, rows, hidden, at(1), lanes);
    let lh = Laid::new(&inp.h, rows, hidden, at(2), lanes);
    let ldr = Laid::new(&inp.dres, rows, hidden, at(3), lanes);
    let ldx = Laid::<T>::poisoned(rows, hidden, at(0), lanes);
    let w_vals: Vec<W> = inp.w_f64.iter().map(|&v| W::from_f64(v)).collect();
    let lw = Laid::new(&w_vals, 1, hidden, at(3), lanes);
    let ldw = Laid::<W>::poisoned(1, hidden, c.layout, lanes);
    let ls = Laid::new(&inp.rstd, rows, 1, c.layout, 1);

    let mut d_dy = ldy.upload(s);
    let d_h = lh.upload(s);
    let mut d_dr = ldr.upload(s);
    let mut d_dx = ldx.upload(s);
    let d_w = lw.upload(s);
    let mut d_dw = ldw.upload(s);
    let d_s = ls.upload(s);
    // Uninitialised on purpose (unless filled): the kernels must write every partial they
    // read (initcheck).
    let ws_len = rmsnorm_backward_workspace_len(T::DTYPE, rows, hidden).max(1);
    const FILL: u32 = u32::MAX;
    let mut d_ws = if fill_ws {
        s.clone_htod(&vec![f32::from_bits(FILL); ws_len])
            .expect("workspace")
    } else {
        // SAFETY: only ever read by the kernels after they wrote it (what initcheck verifies).
        unsafe { s.alloc::<f32>(ws_len) }.expect("workspace")
    };

    let plan = {
        let dy = ldy.desc(s, &d_dy);
        let dr = ldr.desc(s, &d_dr);
        let (ws_addr, _g) = d_ws.device_ptr(s);
        let t = RmsNormBwdDescs {
            dy,
            h: lh.desc(s, &d_h),
            weight: lw.desc(s, &d_w),
            rstd: ls.desc(s, &d_s),
            dres: c.placement.has_dres().then_some(dr),
            dx: match c.placement {
                BwdPlace::OverDy | BwdPlace::OverDyDres => dy,
                BwdPlace::Accumulate => dr,
                _ => ldx.desc(s, &d_dx),
            },
            dw: ldw.desc(s, &d_dw),
            workspace: MatDesc::contiguous(ws_addr, ws_len, DType::F32, 1, ws_len),
        };
        plan_rmsnorm_backward_with(
            &t,
            &c.opts(),
            k.fused_backward(),
            k.norm_limits().max_cluster_blocks(),
            k.tile_passes(),
        )
        .unwrap_or_else(|e| panic!("{what}: planning failed: {e}"))
    };

    let (h, w, rstd) = (lh.mat(&d_h), lw.mat(&d_w), ls.mat(&d_s));
    let saved = SavedForward {
        h: &h,
        rstd: &rstd,
        weight: &w,
    };
    let (mut dw, opts) = (ldw.mat_mut(&mut d_dw), c.opts());
    let mut run = |grads: GradPlacement<'_, '_, T>| {
        k.rmsnorm_backward(s, grads, saved, &mut dw, &mut d_ws, &opts)
    };
    let dres = c.placement.has_dres().then(|| ldr.mat(&d_dr));
    let result = match c.placement {
        BwdPlace::Separate | BwdPlace::SeparateDres => run(GradPlacement::Separate {
            dy: &ldy.mat(&d_dy),
            dres: dres.as_ref(),
            dx: &mut ldx.mat_mut(&mut d_dx),
        }),
        BwdPlace::OverDy | BwdPlace::OverDyDres => run(GradPlacement::DxOverDy {
            dy: &mut ldy.mat_mut(&mut d_dy),
            dres: dres.as_ref(),
        }),
        BwdPlace::Accumulate => run(GradPlacement::Accumulate {
            dy: &ldy.mat(&d_dy),
            dres: &mut ldr.mat_mut(&mut d_dr),
        }),
    };
    result.unwrap_or_else(|e| panic!("{what}: {e}"));

    let b_dy = download(s, &d_dy);
    let b_dr = download(s, &d_dr);
    let b_dx = download(s, &d_dx);
    let b_dw = download(s, &d_dw);
    let over_dy = matches!(c.placement, BwdPlace::OverDy | BwdPlace::OverDyDres);
    let accumulate = c.placement == BwdPlace::Accumulate;
    let separate = !over_dy && !accumulate;
    assert_untouched(&format!("{what}: dy"), &ldy, &b_dy, over_dy);
    assert_untouched(&format!("{what}: dres"), &ldr, &b_dr, accumulate);
    assert_untouched(&format!("{what}: dx buffer"), &ldx, &b_dx, separate);
    assert_untouched(&format!("{what}: h"), &lh, &download(s, &d_h), false);
    assert_untouched(&format!("{what}: weight"), &lw, &download(s, &d_w), false);
    assert_untouched(&format!("{what}: rstd"), &ls, &download(s, &d_s), false);
    assert_untouched(&format!("{what}: dw"), &ldw, &b_dw, true);
    let dx = if over_dy {
        ldy.with_buf(b_dy)
    } else if accumulate {
        ldr.with_buf(b_dr)
    } else {
        ldx.with_buf(b_dx)
    };
    let dw = ldw.with_buf(b_dw).row(0).to_vec();
    let ws_written = fill_ws && download(s, &d_ws).iter().any(|v| v.to_bits() != FILL);
    let out = BwdOut {
        dx,
        dw,
        kernels: (plan.rows.kernel, plan.dw.map(|l| l.kernel)),
    };
    (out, ws_written)
}

fn check_backward<T: Element, W: Element>(
    c: &Bwd,
    inp: &BwdIn<T>,
    out: &BwdOut<T, W>,
    what: &str,
) -> Worst {
    let (rows, hidden) = (c.rows, c.hidden);
    let f = |v: &[T]| v.iter().map(|a| a.to_f64()).collect::<Vec<f64>>();
    let (dy, h, dres) = (f(&inp.dy), f(&inp.h), f(&inp.dres));
    let rstd: Vec<f64> = inp.rstd.iter().map(|&v| v as f64).collect();
    let (dx_ref, dw_ref) = rmsnorm_backward(
        &dy,
        &h,
        &inp.w_f64,
        &rstd,
        c.placement.has_dres().then_some(&dres[..]),
        rows,
        hidden,
        c.gemma,
    );
    let w_eff: Vec<f64> = inp
        .w_f64
        .iter()
        .map(|&w| rmsnorm_weight(w, c.gemma))
        .collect();
    let u32_ = 2f64.powi(-24);
    let dtype = T::DTYPE;
    let parts = par_rows(rows, |range| {
        let mut worst = 0.0f64;
        for r in range {
            let row = r * hidden..(r + 1) * hidden;
            let s = rstd[r];
            let hg_abs = row
                .clone()
                .map(|i| (h[i] * w_eff[i - r * hidden] * dy[i]).abs())
                .sum::<f64>()
                / hidden as f64;
            let hg = row
                .clone()
                .map(|i| h[i] * w_eff[i - r * hidden] * dy[i])
                .sum::<f64>()
                / hidden as f64;
            let coef = s * s * hg;
            for cidx in 0..hidden {
                let i = r * hidden + cidx;
                let g = w_eff[cidx] * dy[i];
                // The f32 row sum (1e-5 of the absolute terms) through rstd^3 * h, the few f32
                // roundings of the element's own arithmetic, then the store's rounding.
                let tol = REL * s * s * s * h[i].abs() * hg_abs
                    + 8.0 * u32_ * (s * (g.abs() + (h[i] * coef).abs()) + dres[i].abs())
                    + ulp_at(dtype, dx_ref[i]);
                let got = out.dx.at(r, cidx).to_f64();
                let err = (got - dx_ref[i]).abs();
                assert!(
                    err <= tol,
                    "{what}: dx[{r},{cidx}] = {got} vs {} (error {err:.3e} > tolerance {tol:.3e})",
                    dx_ref[i]
                );
                worst = worst.max(err / tol);
            }
        }
        worst
    });
    let mut w = Worst {
        dx_ratio: parts.into_iter().fold(0.0, f64::max),
        ..Worst::default()
    };
    for cidx in 0..hidden {
        let abs: f64 = (0..rows)
            .map(|r| (dy[r * hidden + cidx] * h[r * hidden + cidx] * rstd[r]).abs())
            .sum();
        let tol = REL * abs + ulp_at(W::DTYPE, dw_ref[cidx]);
        let got = out.dw[cidx].to_f64();
        let err = (got - dw_ref[cidx]).abs();
        assert!(
            err <= tol,
            "{what}: dw[{cidx}] = {got} vs {} (error {err:.3e} > tolerance {tol:.3e})",
            dw_ref[cidx]
        );
        w.dw_ratio = w.dw_ratio.max(err / tol);
    }
    w
}

fn backward_case<T: Element, W: Element>(
    k: &Kernels,
    s: &Arc<CudaStream>,
    c: &Bwd,
    seed: u64,
) -> (Worst, KernelId, Option<KernelId>) {
    let what = format!("{} backward {c:?} seed {seed}", T::DTYPE.name());
    let inp = bwd_inputs::<T>(c, seed);
    let out = run_backward::<T, W>(k, s, c, &inp, &what);
    let want_mode = if c.layout.on_grid(c.hidden, T::DTYPE.lanes_per_16b()) {
        VecMode::V16
    } else {
        VecMode::Scalar
    };
    let mode = match out.kernels.0 {
        KernelId::RmsNormBwd(_, mode, _) | KernelId::RmsNormBwdFused(_, mode) => mode,
        KernelId::RmsNormBwdNarrow(_, mode, _)
        | KernelId::RmsNormBwdCluster(_, mode)
        | KernelId::RmsNormBwdClusterFused(_, mode)
        | KernelId::RmsNormBwdLoopTiles(_, mode)
        | KernelId::RmsNormBwdTileDx(_, mode) => mode,
        KernelId::RmsNormBwdFusedNarrow(..) => VecMode::V16,
        k => panic!("{what}: planned {k:?}"),
    };
    assert_eq!(mode, want_mode, "{what}: vector path choice");
    (
        check_backward(c, &inp, &out, &what),
        out.kernels.0,
        out.kernels.1,
    )
}

fn backward_any(
    k: &Kernels,
    s: &Arc<CudaStream>,
    dtype: DType,
    c: &Bwd,
    seed: u64,
) -> (Worst, KernelId, Option<KernelId>) {
    match (dtype, c.w_f32) {
        (DType::F32, _) => backward_case::<f32, f32>(k, s, c, seed),
        (DType::F16, false) => backward_case::<f16, f16>(k, s, c, seed),
        (DType::F16, true) => backward_case::<f16, f32>(k, s, c, seed),
        (DType::BF16, false) => backward_case::<bf16, bf16>(k, s, c, seed),
        (DType::BF16, true) => backward_case::<bf16, f32>(k, s, c, seed),
        (DType::F8E4M3, _) => unreachable!("the norm runs the storage dtypes"),
    }
}

/// dx and dw against the reference: dtypes x hidden sizes (both backward variants, odd sizes)
/// x row counts x every placement (separate, over dy, accumulating into dres; with and
/// without an incoming residual gradient) x Gemma, the layouts and the weight dtype cycling.
#[test]
fn backward_every_dtype_size_placement_and_option() {
    let Some((k, _)) = gpu("backward_every_dtype_size_placement_and_option") else {
        return;
    };
    let (hidden, rows): (Vec<usize>, Vec<usize>) = if quick() {
        (vec![3, 896, 4104, 5125, 8200], vec![1, 7])
    } else {
        (
            vec![1, 3, 769, 896, 2048, 4096, 4104, 5125, 8192, 16384, 65536],
            vec![1, 7, 64, 1000],
        )
    };
    let mut cases = Vec::new();
    let mut i = 0usize;
    for (di, dtype) in DType::ALL.into_iter().enumerate() {
        for (hi, &h) in hidden.iter().enumerate() {
            for (ri, &r) in rows.iter().enumerate() {
                if r * h > (1 << 22) {
                    continue;
                }
                for (pi, placement) in BWD_PLACEMENTS.into_iter().enumerate() {
                    for gemma in [false, true] {
                        // Quick: Gemma on every other (dtype, hidden, rows, placement).
                        if quick() && gemma != ((di + hi + ri + pi) % 2 == 1) {
                            continue;
                        }
                        i += 1;
                        cases.push((
                            dtype,
                            Bwd {
                                rows: r,
                                hidden: h,
                                placement,
                                layout: BWD_LAYOUTS[i % BWD_LAYOUTS.len()],
                                gemma,
                                w_f32: dtype != DType::F32 && (i / 3) % 2 == 1,
                            },
                        ));
                    }
                }
            }
        }
    }
    let worst = Mutex::new(Vec::new());
    let seen = Mutex::new(BTreeSet::new());
    let kernels = run_cases(&k, &cases, |k, s, (dtype, c)| {
        let (w, rows_kernel, dw_kernel) = backward_any(k, s, *dtype, c, fresh_seed());
        record(&worst, *dtype, &w);
        if let Some(dw_kernel) = dw_kernel {
            seen.lock().unwrap().insert(dw_kernel.name().to_string());
        }
        rows_kernel
    });
    report("backward_every_dtype_size_placement_and_option", &worst);
    let mut all = seen.into_inner().unwrap();
    all.extend(kernels);
    // Rows held 16 per thread run two launches only past the fused kernel's rows (the quick
    // matrix has none), and the narrow rows kernel only past 2^22 elements;
    // `backward_fused_matches_two_launches_bitwise` runs all of them.
    assert_covered(
        "backward_every_dtype_size_placement_and_option",
        &all,
        |k| match k {
            KernelId::RmsNormBwd(_, _, NormBwdVariant::E16) => !quick(),
            // Rows longer than 8192 take the cluster split where it fits (sm_90);
            // `backward_long_rows_cluster_split_matches_loop_bitwise` runs both forms.
            KernelId::RmsNormBwd(_, _, NormBwdVariant::Loop) => false,
            KernelId::RmsNormBwdFused(..) | KernelId::RmsNormDw(..) => true,
            _ => false,
        },
    );
}

/// Rows longer than 8192: the cluster-split backward (sm_90) against the looped kernel, bit for
/// bit (`dx` and `dw`), and against the reference. Every dtype, row lengths of 2 to 16 tiles
/// (9-16 in clusters of 16 where the device runs them, up to 64 rows, any last tile) and rows the
/// split does not take (past 16 tiles, or up to 8 a last tile under a quarter: looped either
/// way), on the vector grid and off it, from one row to more rows than walkers (one
/// launch up to a row per walker, its `dw` by column up to 4 rows), every placement, Gemma and
/// an f32 weight cycling. Where the device has clusters, every split entry (two launches and
/// one) must run and the split must be what ran wherever it fits; the looped entries run
/// with the split off. Then the tile passes on the same inputs wherever the split's tiles
/// apply to 16-bit rows (any device): `dx` bit for bit as the looped kernel's, `dw` against
/// the reference (their partial rows are their own walkers').
#[test]
fn backward_long_rows_cluster_split_matches_loop_bitwise() {
    let Some((k, s)) = gpu("backward_long_rows_cluster_split_matches_loop_bitwise") else {
        return;
    };
    let (hidden, rows): (&[usize], &[usize]) = if quick() {
        (&[8200, 16384, 20001, 65536, 100_003], &[1, 3, 20, 300])
    } else {
        (
            &[
                8193, 8200, 16384, 16385, 18432, 20001, 32768, 40001, 65536, 65544, 73728, 100_003,
                131_072, 131_073,
            ],
            &[1, 7, 64, 65, 300, 1000],
        )
    };
    let mut cases = Vec::new();
    let mut i = 0usize;
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for &h in hidden {
            for &r in rows {
                if r * h > (1 << 24) {
                    continue;
                }
                i += 1;
                cases.push((
                    dtype,
                    Bwd {
                        rows: r,
                        hidden: h,
                        placement: BWD_PLACEMENTS[i % BWD_PLACEMENTS.len()],
                        layout: BWD_LAYOUTS[(i / 2) % BWD_LAYOUTS.len()],
                        gemma: i % 3 == 1,
                        w_f32: dtype != DType::F32 && i % 4 == 2,
                    },
                ));
            }
        }
    }
    let clusters = k.limits().clusters;
    let max_cluster = k.limits().max_cluster_blocks();
    let seen = Mutex::new(BTreeSet::new());
    let mut failed = Vec::new();
    for (dtype, c) in &cases {
        let seed = fresh_seed();
        let run = || match (dtype, c.w_f32) {
            (DType::F32, _) => split_vs_loop::<f32, f32>(&k, &s, c, seed),
            (DType::F16, false) => split_vs_loop::<f16, f16>(&k, &s, c, seed),
            (DType::F16, true) => split_vs_loop::<f16, f32>(&k, &s, c, seed),
            (DType::BF16, false) => split_vs_loop::<bf16, bf16>(&k, &s, c, seed),
            (DType::BF16, true) => split_vs_loop::<bf16, f32>(&k, &s, c, seed),
            (DType::F8E4M3, _) => unreachable!(),
        };
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
            Ok(ran) => {
                // Split where it fits in the device's clusters, else (and with it off) the
                // looped kernel of its tiles where it fits, the looped kernel otherwise.
                let fits = rmsnorm_bwd_cluster_fits(c.hidden as u64);
                let tiles = (c.hidden as u64).div_ceil(8192);
                let split_runs = fits
                    && tiles <= max_cluster
                    && (tiles <= 8 || c.rows as u64 <= RMSNORM_BWD_WIDE_CLUSTER_MAX_ROWS);
                let looped = |k: KernelId| match k {
                    KernelId::RmsNormBwdLoopTiles(..) => fits,
                    KernelId::RmsNormBwd(_, _, NormBwdVariant::Loop) => !fits,
                    _ => false,
                };
                let split = matches!(
                    ran[0],
                    KernelId::RmsNormBwdCluster(..) | KernelId::RmsNormBwdClusterFused(..)
                );
                let tile_passes = matches!(ran[2], KernelId::RmsNormBwdTileDx(..))
                    == (fits && *dtype != DType::F32);
                if !(if split_runs { split } else { looped(ran[0]) })
                    || !looped(ran[1])
                    || !tile_passes
                {
                    failed.push(format!("{} {c:?}: ran {ran:?}", dtype.name()));
                }
                let mut seen = seen.lock().unwrap();
                seen.extend(ran.iter().map(|k| k.name().to_string()));
            }
            Err(_) => failed.push(format!("{} {c:?} seed {seed}", dtype.name())),
        }
    }
    k.set_cluster_split(true);
    k.set_tile_passes(false);
    assert!(
        failed.is_empty(),
        "{} cases failed: {failed:#?}",
        failed.len()
    );
    assert_covered(
        "backward_long_rows_cluster_split_matches_loop_bitwise",
        &seen.into_inner().unwrap(),
        |k| match k {
            // The quick matrix's rows the split does not take are of one length, and its
            // layouts do not reach every path of every dtype.
            KernelId::RmsNormBwd(_, _, NormBwdVariant::Loop)
            | KernelId::RmsNormBwdLoopTiles(..) => !quick(),
            KernelId::RmsNormBwdCluster(..) | KernelId::RmsNormBwdClusterFused(..) => {
                clusters && !quick()
            }
            KernelId::RmsNormBwdTileDx(..) => !quick(),
            _ => false,
        },
    );
}

/// One case of [`backward_long_rows_cluster_split_matches_loop_bitwise`]: with the split on
/// (checked against the reference), then off, bit for bit; then the tile passes (checked
/// against the reference, `dx` bit for bit); the three runs' rows kernels.
fn split_vs_loop<T: Element, W: Element>(
    k: &Kernels,
    s: &Arc<CudaStream>,
    c: &Bwd,
    seed: u64,
) -> [KernelId; 3] {
    let what = format!("{} backward {c:?} seed {seed}", T::DTYPE.name());
    let inp = bwd_inputs::<T>(c, seed);
    // Off, also after a case that panicked with it on.
    k.set_tile_passes(false);
    k.set_cluster_split(true);
    let split = run_backward::<T, W>(k, s, c, &inp, &what);
    check_backward(c, &inp, &split, &what);
    k.set_cluster_split(false);
    let looped = run_backward::<T, W>(k, s, c, &inp, &what);
    k.set_cluster_split(true);
    let what = format!("{what}: {:?} vs {:?}", split.kernels, looped.kernels);
    assert!(
        same_all(&split.dx.buf, &looped.dx.buf),
        "{what}: dx differs"
    );
    assert!(same_all(&split.dw, &looped.dw), "{what}: dw differs");
    k.set_tile_passes(true);
    let passes = run_backward::<T, W>(k, s, c, &inp, &what);
    k.set_tile_passes(false);
    let what = format!("{what}; tile passes {:?}", passes.kernels);
    check_backward(c, &inp, &passes, &what);
    assert!(
        same_all(&passes.dx.buf, &looped.dx.buf),
        "{what}: dx differs"
    );
    [split.kernels.0, looped.kernels.0, passes.kernels.0]
}

/// The one-launch backward against the two launches, bit for bit (`dx` and `dw`), and against
/// the reference: every dtype, rows on the vector grid and off it (odd lengths, padded rows,
/// offsets), from one row to more than the two launches' grid holds (their row slots then sum
/// several rows, on and off the grid), every placement that keeps `dy`, Gemma and an f32
/// weight in turn. The two-launch run must write the workspace and the fused one must not (so
/// the switch is seen to work); shapes past the one-launch rule must run two launches either
/// way (the narrow rows kernel among them), checked against the reference.
#[test]
fn backward_fused_matches_two_launches_bitwise() {
    let Some((k, s)) = gpu("backward_fused_matches_two_launches_bitwise") else {
        return;
    };
    let shapes: &[(usize, usize)] = if quick() {
        &[
            (1, 4096),
            (7, 896),
            (64, 8192),
            (300, 1000),
            (1, 8191),
            (33, 5125),
            (600, 4093),
            (600, 8192),
            (300, 5120),
            (600, 3072),
            (280, 7168),
            (1000, 2560),
            (1024, 4608),
            // Cases 14-21 (the layout goes by the case number): the narrow kernels of the two
            // launches off the 16-byte grid (misaligned, staggered) and on it (dense, padded),
            // odd rows, the narrow one-launch kernels.
            (1024, 4608),
            (2048, 6143),
            (2048, 5632),
            (2048, 6144),
            (5, 6150),
            (40, 1030),
            (256, 4608),
            (200, 6144),
        ]
    } else {
        &[
            (1, 1),
            (1, 4096),
            (2, 8192),
            (7, 896),
            (16, 4096),
            (64, 8192),
            (256, 8192),
            (300, 1000),
            (512, 4096),
            (1, 8191),
            (33, 5125),
            (200, 3),
            (600, 8192),
            (1024, 4093),
            (3000, 896),
            (2000, 2047),
            (700, 5125),
            (2000, 8191),
            (600, 3072),
            (300, 5120),
            (280, 7168),
            (1000, 2560),
            (1024, 4608),
            (2000, 3072),
            // Cases 25-32: the kinds of cases 14-21 of the quick list.
            (2048, 6144),
            (5, 6150),
            (40, 1030),
            (3000, 5632),
            (256, 4608),
            (1024, 4608),
            (2048, 6143),
            (200, 6144),
        ]
    };
    let mut seen = BTreeSet::new();
    let mut several_rows_per_slot = [0usize; 2];
    let mut i = 0usize;
    for dtype in DType::ALL {
        if dtype == DType::F8E4M3 {
            continue;
        }
        for &(rows, hidden) in shapes {
            i += 1;
            let c = Bwd {
                rows,
                hidden,
                placement: KEEP_DY[i % KEEP_DY.len()],
                layout: BWD_LAYOUTS[i % BWD_LAYOUTS.len()],
                gemma: i % 2 == 1,
                w_f32: dtype != DType::F32 && (i / 2) % 2 == 1,
            };
            // One launch where the two launches have a block per row group; for 16-bit
            // blocks of 256 threads or more while a block per row group fits their thread
            // budget; for 16-bit rows off the grid up to 2^22 elements. The two launches'
            // slots then hold several rows.
            let layout = rmsnorm_bwd_layout(dtype, rows as u64, hidden as u64);
            let g = layout.geometry;
            let groups = rows.div_ceil(g.rows_per_block as usize);
            let sixteen_bit = dtype.size_bytes() == 2;
            let wide_16 = sixteen_bit
                && g.block_threads() >= 256
                && groups * g.block_threads() as usize <= 131_072;
            let lanes = dtype.lanes_per_16b();
            let on_grid = c.layout.on_grid(hidden, lanes);
            let off_grid_16 = sixteen_bit && !on_grid;
            let fused = groups == layout.blocks as usize
                || wide_16
                || (off_grid_16 && rows * hidden <= 1 << 22);
            several_rows_per_slot[on_grid as usize] +=
                (fused && (layout.slots as usize) < rows) as usize;
            let kernels = match (dtype, c.w_f32) {
                (DType::F32, _) => fused_vs_two::<f32, f32>(&k, &s, &c, fused),
                (DType::F16, false) => fused_vs_two::<f16, f16>(&k, &s, &c, fused),
                (DType::F16, true) => fused_vs_two::<f16, f32>(&k, &s, &c, fused),
                (DType::BF16, false) => fused_vs_two::<bf16, bf16>(&k, &s, &c, fused),
                (DType::BF16, true) => fused_vs_two::<bf16, f32>(&k, &s, &c, fused),
                (DType::F8E4M3, _) => unreachable!(),
            };
            seen.extend(kernels.map(|k| k.name().to_string()));
        }
    }
    assert!(
        several_rows_per_slot.iter().all(|&n| n > 0),
        "one-launch cases whose slots hold several rows, off and on the grid: {several_rows_per_slot:?}"
    );
    assert_covered("backward_fused_matches_two_launches_bitwise", &seen, |k| {
        matches!(
            k,
            KernelId::RmsNormBwdFused(..)
                | KernelId::RmsNormBwdFusedNarrow(..)
                | KernelId::RmsNormBwd(_, _, NormBwdVariant::E16)
                | KernelId::RmsNormBwdNarrow(..)
        )
    });
}

/// The placements that keep `dy` (the one launch reads it beside the `dx` stores, so a call
/// writing `dx` over `dy` runs two launches; `backward_every_dtype_size_placement_and_option`
/// runs those).
const KEEP_DY: [BwdPlace; 3] = [
    BwdPlace::Separate,
    BwdPlace::SeparateDres,
    BwdPlace::Accumulate,
];

/// One case of [`backward_fused_matches_two_launches_bitwise`], due to run one launch when
/// `fused_planned` (else two launches either way); the kernels of both runs.
fn fused_vs_two<T: Element, W: Element>(
    k: &Kernels,
    s: &Arc<CudaStream>,
    c: &Bwd,
    fused_planned: bool,
) -> [KernelId; 2] {
    let seed = fresh_seed();
    let what = format!("{} backward {c:?} seed {seed}", T::DTYPE.name());
    let inp = bwd_inputs::<T>(c, seed);
    assert!(k.fused_backward());
    let (fused, fused_ws) = run_backward_ws::<T, W>(k, s, c, &inp, &what);
    k.set_fused_backward(false);
    let two = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_backward_ws::<T, W>(k, s, c, &inp, &what)
    }));
    k.set_fused_backward(true);
    let (two, two_ws) = two.unwrap_or_else(|e| std::panic::resume_unwind(e));
    if !fused_planned {
        assert!(
            matches!(
                fused.kernels,
                (
                    KernelId::RmsNormBwd(..) | KernelId::RmsNormBwdNarrow(..),
                    Some(_)
                )
            ),
            "{what}: planned {:?} where two launches were due",
            fused.kernels
        );
        // The narrow rows kernel runs only here (calls of many rows): checked as well.
        check_backward(c, &inp, &fused, &what);
        return [fused.kernels.0, two.kernels.0];
    }
    assert!(
        matches!(
            fused.kernels,
            (
                KernelId::RmsNormBwdFused(..) | KernelId::RmsNormBwdFusedNarrow(..),
                None
            )
        ),
        "{what}: planned {:?}",
        fused.kernels
    );
    assert!(
        matches!(
            two.kernels,
            (
                KernelId::RmsNormBwd(..) | KernelId::RmsNormBwdNarrow(..),
                Some(_)
            )
        ),
        "{what}: planned {:?} with the fused form off",
        two.kernels
    );
    assert!(!fused_ws, "{what}: the fused kernel wrote the workspace");
    assert!(
        two_ws,
        "{what}: the two launches left the workspace as it was"
    );
    check_backward(c, &inp, &fused, &what);
    assert!(
        same_all(&fused.dx.buf, &two.dx.buf),
        "{what}: dx differs between one launch and two"
    );
    for (i, (p, q)) in fused.dw.iter().zip(&two.dw).enumerate() {
        assert!(
            same(*p, *q),
            "{what}: dw[{i}] = {} fused, {} in two launches",
            p.to_f64(),
            q.to_f64()
        );
    }
    [fused.kernels.0, two.kernels.0]
}

/// Repeated backward runs give the same dx and dw bits (many blocks, many dw slots), and a
/// row's dx alone is the same as in the batch; bf16, f16 and f32 rows of 8192 (512 threads),
/// and f32 rows of 5120 without `dres` (two row buffers where, with `dres`, one).
#[test]
fn backward_is_deterministic_bitwise() {
    let Some((k, s)) = gpu("backward_is_deterministic_bitwise") else {
        return;
    };
    type Shapes = Vec<(usize, usize)>;
    let (bf16_shapes, wide_shapes): (Shapes, Shapes) = if quick() {
        // 3000 x 896 and 600 x 8192: blocks that take several row groups in turn (f32 rows of
        // 8192: with one row buffer).
        (
            vec![
                (300, 1024),
                (40, 8192),
                (70, 7001),
                (3000, 896),
                (600, 8192),
            ],
            vec![(600, 8192)],
        )
    } else {
        (
            vec![
                (8192, 4096),
                (4096, 8192),
                (2048, 16384),
                (16384, 896),
                (1000, 5125),
                (3000, 7001),
            ],
            vec![(4096, 8192), (1000, 8191)],
        )
    };
    let with_dres = BwdPlace::SeparateDres;
    for (rows, hidden) in bf16_shapes {
        deterministic_case::<bf16>(&k, &s, rows, hidden, with_dres);
    }
    for (rows, hidden) in wide_shapes {
        deterministic_case::<f16>(&k, &s, rows, hidden, with_dres);
        deterministic_case::<f32>(&k, &s, rows, hidden, with_dres);
    }
    // f32 rows of 5120 from 1024 on, of 6144 from 2048, on and off the grid: the narrow rows
    // kernels.
    let rows = if quick() { 2048 } else { 3000 };
    for hidden in [5120, 6144, 4607, 6143] {
        deterministic_case::<f32>(&k, &s, rows, hidden, BwdPlace::Separate);
    }
}

/// One shape and placement of [`backward_is_deterministic_bitwise`], without and with Gemma.
fn deterministic_case<T: Element>(
    k: &Kernels,
    s: &Arc<CudaStream>,
    rows: usize,
    hidden: usize,
    placement: BwdPlace,
) {
    for gemma in [false, true] {
        let c = Bwd {
            rows,
            hidden,
            placement,
            layout: Layout::Dense,
            gemma,
            w_f32: false,
        };
        let seed = fresh_seed();
        let what = format!("{} backward {c:?} seed {seed}", T::DTYPE.name());
        let inp = bwd_inputs::<T>(&c, seed);
        let a = run_backward::<T, T>(k, s, &c, &inp, &what);
        let b = run_backward::<T, T>(k, s, &c, &inp, &what);
        assert!(
            same_all(&a.dx.buf, &b.dx.buf),
            "{what}: dx differs between runs"
        );
        assert!(same_all(&a.dw, &b.dw), "{what}: dw differs between runs");
        // A row's dx does not depend on the batch either.
        let one = Bwd { rows: 1, ..c };
        let p = rows / 2 + 1;
        let row_of = |v: &[T]| v[p * hidden..(p + 1) * hidden].to_vec();
        let single = BwdIn {
            dy: row_of(&inp.dy),
            h: row_of(&inp.h),
            dres: row_of(&inp.dres),
            w_f64: inp.w_f64.clone(),
            rstd: vec![inp.rstd[p]],
        };
        let alone = run_backward::<T, T>(k, s, &one, &single, &what);
        assert!(
            alone
                .dx
                .row(0)
                .iter()
                .zip(a.dx.row(p))
                .all(|(p, q)| same(*p, *q)),
            "{what}: dx of row {p} alone differs from the batch"
        );
        let w = check_backward(&c, &inp, &a, &what);
        eprintln!(
            "{what}: dx {:.3} of tol, dw {:.3} of tol",
            w.dx_ratio, w.dw_ratio
        );
    }
}
