//! GPU tests of the gated family: every activation x dtype x layout x in-place form, forward
//! and backward, against the f64 reference on fresh random inputs, outputs poisoned (NaN)
//! before each run. Without a CUDA driver each test prints why it skips and passes.
//!
//! `FERROFUSE_DEVICE=N` picks the device; `FERROFUSE_TEST_QUICK=1` trims the shapes (used under
//! compute-sanitizer).

mod common;

use std::cell::Cell;
use std::sync::{Arc, LazyLock};

use common::*;
use ferrofuse::cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use ferrofuse::gated::plan_gated_forward;
use ferrofuse::half::{bf16, f16};
use ferrofuse::{
    Activation, DType, Element, Error, KernelId, Kernels, Mat, MatDesc, MatMut, VecMode, reference,
};
use ferrofuse_common::GATED_THREADS;
use rand::rngs::StdRng;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Layout {
    Split,
    /// Split, every operand a view starting one element into its buffer (off the 16-byte
    /// grid: one flat range whose ragged head and tail the grid's last threads take).
    SplitOffset,
    Interleaved,
    /// Split, each operand at its own element offset and padded row stride (`a` one element
    /// into its buffer at stride `I + 1`, `b` three at `I + 3`, `y` two at `I + 5`): every
    /// row of every operand at its own offset from the 16-byte grid (the realigned forward).
    Mixed,
}

/// (rows, intermediate): odd and real model sizes, one row to many rows.
fn shapes() -> Vec<(usize, usize)> {
    if quick() {
        return vec![(1, 1), (3, 3), (5, 133), (2, 1024), (300, 24), (300, 257)];
    }
    vec![
        (1, 1),
        (3, 3),
        (7, 8),
        (5, 4097),
        (2, 11008),
        (1, 14336),
        (4, 18944),
        (3, 28672),
        (33, 1000),
        (20000, 24),
        (257, 14336),
        (64, 28672),
        (1024, 4096),
        (999, 4097),
    ]
}

/// The most a gated output may be from the f64 reference, in ulps of its dtype (see
/// `ulp_error`; the backward's `da` measured against a floor of `|dy * b| / 64`, below which
/// `act'(a)`'s terms cancel). f16/bf16: the f32 result rounded once, at most 0.5 ulp, plus the
/// f32 math's error, far below a 16-bit ulp: 1. f32: the error of `exp` grows with its
/// argument, which is rounded before `ex2.approx` (about 3 roundings of `x^2 / 2 * log2 e`, so
/// some 170 ulps for |x| <= 8, the inputs here, in GELU-erf's tail); measured on the H200 over
/// this matrix in three runs: at worst 132 ulps (GELU-erf, forward and backward alike): 256.
fn max_ulps(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 256.0,
        DType::F16 | DType::BF16 => 1.0,
        DType::F8E4M3 => unreachable!("FP8 outputs: gpu_gated_fp8.rs"),
    }
}

/// `da = dy * b * act'(a)`: the unit of its error is taken at no less than this.
fn da_floor(b: &[f64], dy: &[f64]) -> impl Fn(usize) -> f64 {
    move |i| (dy[i] * b[i]).abs() / 64.0
}

/// The worst errors of every test, by test and quantity; each test prints its own at its end.
static WORST: LazyLock<WorstErrors> = LazyLock::new(WorstErrors::default);

thread_local! {
    /// The test this thread runs (libtest runs each test on its own thread).
    static TEST: Cell<&'static str> = const { Cell::new("") };
}

/// Checks `got` against `want` within [`max_ulps`] and records the worst error.
fn check(
    quantity: &str,
    what: &str,
    dtype: DType,
    got: &[f64],
    want: &[f64],
    floor: impl Fn(usize) -> f64,
) {
    let worst = assert_ulps(what, dtype, got, want, floor, max_ulps(dtype));
    let test = TEST.with(Cell::get);
    WORST.record(format!("{test}: {quantity} {}", dtype.name()), worst);
}

/// Runs a test body with its name recorded, then prints the worst errors it measured.
fn measured(test: &'static str, body: impl FnOnce()) {
    TEST.with(|t| t.set(test));
    body();
    WORST.report(&format!("{test}:"));
}

/// Row strides used for the interleaved input and the output: padded, so strided views are
/// exercised, and kept 16-byte friendly when the width is, so the vector path runs too.
fn padded(cols: usize) -> usize {
    cols + 8
}

/// `v` after one poisoned element, for views that start one element into their buffer.
fn offset<T: Element>(v: &[T]) -> Vec<T> {
    let mut out = vec![poison::<T>()];
    out.extend_from_slice(v);
    out
}

/// Interleaves `a` and `b` as `[a | b]` rows of stride `stride`, padding poisoned.
fn interleave<T: Element>(a: &[T], b: &[T], rows: usize, cols: usize, stride: usize) -> Vec<T> {
    let mut x = vec![poison::<T>(); rows * stride];
    for r in 0..rows {
        x[r * stride..r * stride + cols].copy_from_slice(&a[r * cols..(r + 1) * cols]);
        x[r * stride + cols..r * stride + 2 * cols].copy_from_slice(&b[r * cols..(r + 1) * cols]);
    }
    x
}

/// Columns `[c0, c0 + cols)` of each row of a strided buffer, as f64.
fn gather<T: Element>(buf: &[T], rows: usize, cols: usize, stride: usize, c0: usize) -> Vec<f64> {
    (0..rows)
        .flat_map(|r| {
            buf[r * stride + c0..r * stride + c0 + cols]
                .iter()
                .map(|v| v.to_f64())
        })
        .collect()
}

fn forward_case<T: Element>(
    k: &Kernels,
    s: &Arc<CudaStream>,
    rng: &mut StdRng,
    act: Activation,
    layout: Layout,
    inplace: bool,
    (rows, cols): (usize, usize),
) {
    let n = rows * cols;
    let (a, af) = random::<T>(rng, n, 8.0);
    let (b, bf) = random::<T>(rng, n, 2.0);
    let want = reference::gated_forward(act, &af, &bf);
    let what = format!(
        "{} {} {layout:?} inplace={inplace} {rows}x{cols}",
        act.name(),
        T::DTYPE.name()
    );
    let got = match (layout, inplace) {
        (Layout::Split, false) => {
            let (da, db) = (upload(s, &a), upload(s, &b));
            let mut y = upload(s, &vec![poison::<T>(); n]);
            k.gated(
                s,
                act,
                &Mat::new(da.as_view(), rows, cols),
                &Mat::new(db.as_view(), rows, cols),
                &mut MatMut::new(y.as_view_mut(), rows, cols),
            )
            .unwrap_or_else(|e| panic!("{what}: {e}"));
            to_f64(&download(s, &y))
        }
        (Layout::Split, true) => {
            let da = upload(s, &a);
            let mut db = upload(s, &b);
            k.gated_inplace(
                s,
                act,
                &Mat::new(da.as_view(), rows, cols),
                &mut MatMut::new(db.as_view_mut(), rows, cols),
            )
            .unwrap_or_else(|e| panic!("{what}: {e}"));
            to_f64(&download(s, &db))
        }
        (Layout::SplitOffset, false) => {
            let (da, db) = (upload(s, &offset(&a)), upload(s, &offset(&b)));
            let mut y = upload(s, &vec![poison::<T>(); n + 1]);
            k.gated(
                s,
                act,
                &Mat::new(da.slice(1..), rows, cols),
                &Mat::new(db.slice(1..), rows, cols),
                &mut MatMut::new(y.slice_mut(1..), rows, cols),
            )
            .unwrap_or_else(|e| panic!("{what}: {e}"));
            let y = to_f64(&download(s, &y));
            assert!(y[0].is_nan(), "{what}: the element before y was written");
            y[1..].to_vec()
        }
        (Layout::SplitOffset, true) => {
            let da = upload(s, &offset(&a));
            let mut db = upload(s, &offset(&b));
            k.gated_inplace(
                s,
                act,
                &Mat::new(da.slice(1..), rows, cols),
                &mut MatMut::new(db.slice_mut(1..), rows, cols),
            )
            .unwrap_or_else(|e| panic!("{what}: {e}"));
            to_f64(&download(s, &db)[1..])
        }
        (Layout::Mixed, _) => {
            assert!(!inplace, "no in-place form at different strides");
            let (sa, sb, sy) = (cols + 1, cols + 3, cols + 5);
            let spread = |v: &[T], off: usize, stride: usize| {
                let mut out = vec![poison::<T>(); off + rows * stride];
                for r in 0..rows {
                    out[off + r * stride..off + r * stride + cols]
                        .copy_from_slice(&v[r * cols..(r + 1) * cols]);
                }
                out
            };
            let (da, db) = (upload(s, &spread(&a, 1, sa)), upload(s, &spread(&b, 3, sb)));
            let mut y = upload(s, &vec![poison::<T>(); 2 + rows * sy]);
            let (ma, mb) = (
                Mat::strided(da.slice(1..), rows, cols, sa),
                Mat::strided(db.slice(3..), rows, cols, sb),
            );
            let mut my = MatMut::strided(y.slice_mut(2..), rows, cols, sy);
            k.gated(s, act, &ma, &mb, &mut my)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let y = download(s, &y);
            let y = to_f64(&y);
            assert!(
                y[..2].iter().all(|v| v.is_nan()),
                "{what}: written before y"
            );
            let pad: Vec<f64> = (0..rows)
                .flat_map(|r| y[2 + r * sy + cols..2 + (r + 1) * sy].to_vec())
                .collect();
            assert!(
                pad.iter().all(|v| v.is_nan()),
                "{what}: padding of y was written"
            );
            (0..rows)
                .flat_map(|r| y[2 + r * sy..2 + r * sy + cols].to_vec())
                .collect()
        }
        (Layout::Interleaved, false) => {
            let xs = padded(2 * cols);
            let dx = upload(s, &interleave(&a, &b, rows, cols, xs));
            let ys = padded(cols);
            let mut y = upload(s, &vec![poison::<T>(); rows * ys]);
            k.gated_interleaved(
                s,
                act,
                &Mat::strided(dx.as_view(), rows, 2 * cols, xs),
                &mut MatMut::strided(y.as_view_mut(), rows, cols, ys),
            )
            .unwrap_or_else(|e| panic!("{what}: {e}"));
            let y = download(s, &y);
            // The row padding of y is not written.
            let pad = gather(&y, rows, ys - cols, ys, cols);
            assert!(
                pad.iter().all(|v| v.is_nan()),
                "{what}: padding of y was written"
            );
            gather(&y, rows, cols, ys, 0)
        }
        (Layout::Interleaved, true) => {
            let xs = padded(2 * cols);
            let mut dx = upload(s, &interleave(&a, &b, rows, cols, xs));
            k.gated_interleaved_inplace(
                s,
                act,
                &mut MatMut::strided(dx.as_view_mut(), rows, 2 * cols, xs),
            )
            .unwrap_or_else(|e| panic!("{what}: {e}"));
            let x = download(s, &dx);
            assert_eq!(
                gather(&x, rows, cols, xs, 0),
                af,
                "{what}: the gate half changed"
            );
            gather(&x, rows, cols, xs, cols)
        }
    };
    check(
        &format!("y {}", act.name()),
        &what,
        T::DTYPE,
        &got,
        &want,
        |_| 0.0,
    );
}

fn backward_case<T: Element>(
    k: &Kernels,
    s: &Arc<CudaStream>,
    rng: &mut StdRng,
    act: Activation,
    layout: Layout,
    (rows, cols): (usize, usize),
) {
    let n = rows * cols;
    let (a, af) = random::<T>(rng, n, 8.0);
    let (b, bf) = random::<T>(rng, n, 2.0);
    let (dy, dyf) = random::<T>(rng, n, 2.0);
    let (want_da, want_db) = reference::gated_backward(act, &af, &bf, &dyf);
    let what = format!(
        "backward {} {} {layout:?} {rows}x{cols}",
        act.name(),
        T::DTYPE.name()
    );
    let ddy = upload(s, &dy);
    let (got_da, got_db) = match layout {
        Layout::SplitOffset => {
            let (a_in, b_in, dy_in) = (
                upload(s, &offset(&a)),
                upload(s, &offset(&b)),
                upload(s, &offset(&dy)),
            );
            let mut da = upload(s, &vec![poison::<T>(); n + 1]);
            let mut db = upload(s, &vec![poison::<T>(); n + 1]);
            k.gated_backward(
                s,
                act,
                &Mat::new(a_in.slice(1..), rows, cols),
                &Mat::new(b_in.slice(1..), rows, cols),
                &Mat::new(dy_in.slice(1..), rows, cols),
                &mut MatMut::new(da.slice_mut(1..), rows, cols),
                &mut MatMut::new(db.slice_mut(1..), rows, cols),
            )
            .unwrap_or_else(|e| panic!("{what}: {e}"));
            (
                to_f64(&download(s, &da)[1..]),
                to_f64(&download(s, &db)[1..]),
            )
        }
        Layout::Split | Layout::Mixed => {
            let (da_in, db_in) = (upload(s, &a), upload(s, &b));
            let mut da = upload(s, &vec![poison::<T>(); n]);
            let mut db = upload(s, &vec![poison::<T>(); n]);
            k.gated_backward(
                s,
                act,
                &Mat::new(da_in.as_view(), rows, cols),
                &Mat::new(db_in.as_view(), rows, cols),
                &Mat::new(ddy.as_view(), rows, cols),
                &mut MatMut::new(da.as_view_mut(), rows, cols),
                &mut MatMut::new(db.as_view_mut(), rows, cols),
            )
            .unwrap_or_else(|e| panic!("{what}: {e}"));
            (to_f64(&download(s, &da)), to_f64(&download(s, &db)))
        }
        Layout::Interleaved => {
            let xs = padded(2 * cols);
            let dx_in = upload(s, &interleave(&a, &b, rows, cols, xs));
            let mut dx = upload(s, &vec![poison::<T>(); rows * xs]);
            k.gated_backward_interleaved(
                s,
                act,
                &Mat::strided(dx_in.as_view(), rows, 2 * cols, xs),
                &Mat::new(ddy.as_view(), rows, cols),
                &mut MatMut::strided(dx.as_view_mut(), rows, 2 * cols, xs),
            )
            .unwrap_or_else(|e| panic!("{what}: {e}"));
            let dx = download(s, &dx);
            (
                gather(&dx, rows, cols, xs, 0),
                gather(&dx, rows, cols, xs, cols),
            )
        }
    };
    let (d, name) = (T::DTYPE, act.name());
    let floor = da_floor(&bf, &dyf);
    check(
        &format!("da {name}"),
        &format!("{what} da"),
        d,
        &got_da,
        &want_da,
        floor,
    );
    check(
        &format!("db {name}"),
        &format!("{what} db"),
        d,
        &got_db,
        &want_db,
        |_| 0.0,
    );
}

/// Runs `f` for every dtype with a fresh seed (printed if it panics), then prints the worst
/// errors the test measured.
fn for_each_dtype(test: &'static str, f: impl Fn(&Kernels, &Arc<CudaStream>, &mut StdRng, DType)) {
    let Some((k, s)) = gpu(test) else { return };
    measured(test, || {
        for dtype in DType::ALL {
            let (mut rng, seed) = rng();
            let run = std::panic::AssertUnwindSafe(|| f(&k, &s, &mut rng, dtype));
            if let Err(p) = std::panic::catch_unwind(run) {
                eprintln!("{test}: failed with seed {seed:#x}");
                std::panic::resume_unwind(p);
            }
        }
    });
}

fn forward_all(layout: Layout, inplace: bool, test: &'static str) {
    for_each_dtype(test, |k, s, rng, dtype| {
        for act in Activation::ALL {
            for shape in shapes() {
                typed!(
                    dtype,
                    forward_case::<T>(k, s, rng, act, layout, inplace, shape)
                );
            }
        }
    });
}

#[test]
fn forward_split() {
    forward_all(Layout::Split, false, "forward_split");
}

#[test]
fn forward_split_inplace() {
    forward_all(Layout::Split, true, "forward_split_inplace");
}

#[test]
fn forward_split_offset() {
    forward_all(Layout::SplitOffset, false, "forward_split_offset");
}

#[test]
fn forward_split_offset_inplace() {
    forward_all(Layout::SplitOffset, true, "forward_split_offset_inplace");
}

#[test]
fn forward_mixed_offsets_and_strides() {
    forward_all(Layout::Mixed, false, "forward_mixed_offsets_and_strides");
}

#[test]
fn forward_interleaved() {
    forward_all(Layout::Interleaved, false, "forward_interleaved");
}

#[test]
fn forward_interleaved_inplace() {
    forward_all(Layout::Interleaved, true, "forward_interleaved_inplace");
}

/// The middle grid regime (more accesses than resident threads, at most four per thread),
/// where each thread walks several accesses: rows chosen from this device's residency so the
/// plan is in it, with a total that leaves the last step of the walk to part of the threads.
/// Every layout and in-place form; SiLU only in the quick run.
#[test]
fn forward_middle_regime() {
    for_each_dtype("forward_middle_regime", |k, s, rng, dtype| {
        let cols = 4104;
        let per_row = (cols / dtype.lanes_per_16b()) as u64;
        let resident = k
            .limits()
            .resident_blocks(KernelId::GatedFwd(dtype, VecMode::V16)) as u64
            * GATED_THREADS as u64;
        let rows = (resident * 5 / 2 / per_row + 1) as usize;
        let m = MatDesc::contiguous(1 << 40, rows * cols, dtype, rows, cols);
        let n = MatDesc::contiguous(1 << 41, rows * cols, dtype, rows, cols);
        let plan = plan_gated_forward(Activation::Silu, &m, &m, &n, k.limits()).unwrap();
        assert_eq!(plan.kernel, KernelId::GatedFwd(dtype, VecMode::V16));
        let threads = plan.grid as u64 * GATED_THREADS as u64;
        let total = rows as u64 * per_row;
        assert!(
            threads <= resident && total > 2 * threads,
            "{rows}x{cols}: {threads} threads"
        );
        let acts: &[Activation] = if quick() {
            &[Activation::Silu]
        } else {
            &Activation::ALL
        };
        for &act in acts {
            for (layout, inplace) in [
                (Layout::Split, false),
                (Layout::Split, true),
                (Layout::Interleaved, false),
                (Layout::Mixed, false),
            ] {
                typed!(
                    dtype,
                    forward_case::<T>(k, s, rng, act, layout, inplace, (rows, cols))
                );
            }
        }
    });
}

fn backward_all(layout: Layout, test: &'static str) {
    for_each_dtype(test, |k, s, rng, dtype| {
        for act in Activation::ALL {
            for shape in shapes() {
                typed!(dtype, backward_case::<T>(k, s, rng, act, layout, shape));
            }
        }
    });
}

#[test]
fn backward_split() {
    backward_all(Layout::Split, "backward_split");
}

#[test]
fn backward_split_offset() {
    backward_all(Layout::SplitOffset, "backward_split_offset");
}

#[test]
fn backward_interleaved() {
    backward_all(Layout::Interleaved, "backward_interleaved");
}

fn addr<T>(s: &Arc<CudaStream>, d: &CudaSlice<T>) -> u64 {
    d.device_ptr(s).0
}

fn desc<T: Element>(s: &Arc<CudaStream>, d: &CudaSlice<T>, rows: usize, cols: usize) -> MatDesc {
    MatDesc::contiguous(addr(s, d), d.len(), T::DTYPE, rows, cols)
}

/// The raw backward in its in-place forms: `da` over `dy` and `db` over `b`, rows of `cols`
/// elements `stride` apart (on the vector grid, or off it and not one flat range: the scalar
/// path, which in-place calls off the grid take).
fn raw_backward_inplace_case<T: Element>(
    k: &Kernels,
    s: &Arc<CudaStream>,
    rng: &mut StdRng,
    (cols, stride): (usize, usize),
) {
    let rows = 9;
    let n = rows * stride;
    let (a, af) = random::<T>(rng, n, 8.0);
    let (b, bf) = random::<T>(rng, n, 2.0);
    let (dy, dyf) = random::<T>(rng, n, 2.0);
    // The elements of the rows, without the padding after each.
    let rows_of =
        |v: &[f64]| -> Vec<f64> { v.chunks(stride).flat_map(|r| r[..cols].to_vec()).collect() };
    let (af, bf, dyf) = (rows_of(&af), rows_of(&bf), rows_of(&dyf));
    let (want_da, want_db) = reference::gated_backward(Activation::GeluErf, &af, &bf, &dyf);
    let (da_in, db_in, ddy) = (upload(s, &a), upload(s, &b), upload(s, &dy));
    let strided = |d: &CudaSlice<T>| MatDesc {
        row_stride: stride,
        ..desc(s, d, rows, cols)
    };
    let (ma, mb, mdy) = (strided(&da_in), strided(&db_in), strided(&ddy));
    // SAFETY: the descriptions are of live buffers of this context, synchronised below.
    unsafe { k.gated_backward_raw(s, Activation::GeluErf, &ma, &mb, &mdy, &mdy, &mb) }.unwrap();
    let d = T::DTYPE;
    let (got_da, got_db) = (
        rows_of(&to_f64(&download(s, &ddy))),
        rows_of(&to_f64(&download(s, &db_in))),
    );
    let floor = da_floor(&bf, &dyf);
    check(
        "da gelu_erf",
        "raw backward da over dy",
        d,
        &got_da,
        &want_da,
        floor,
    );
    check(
        "db gelu_erf",
        "raw backward db over b",
        d,
        &got_db,
        &want_db,
        |_| 0.0,
    );
}

#[test]
fn raw_backward_inplace() {
    for_each_dtype("raw_backward_inplace", |k, s, rng, dtype| {
        for shape in [(4104, 4104), (4097, 4100)] {
            typed!(dtype, raw_backward_inplace_case::<T>(k, s, rng, shape))
        }
    });
}

/// Rejected calls write nothing: the poisoned output (or the input an illegal output
/// overlaps) is bit-for-bit unchanged.
fn rejected_case<T: Element>(k: &Kernels, s: &Arc<CudaStream>, rng: &mut StdRng) {
    let (rows, cols) = (4, 256);
    let (a, _) = random::<T>(rng, rows * cols, 8.0);
    let (b, _) = random::<T>(rng, rows * cols, 2.0);
    let (da, db) = (upload(s, &a), upload(s, &b));
    let poisoned = vec![poison::<T>(); rows * cols];
    let mut y = upload(s, &poisoned);
    let bits = |v: &[T]| -> Vec<u64> { v.iter().map(|x| x.to_f64().to_bits()).collect() };
    // Shape mismatch.
    let e = k
        .gated(
            s,
            Activation::Silu,
            &Mat::new(da.as_view(), rows, cols),
            &Mat::new(db.as_view(), rows, cols),
            &mut MatMut::new(y.as_view_mut(), rows, cols - 8),
        )
        .unwrap_err();
    assert_matches!(e, Error::ShapeMismatch { tensor: "y", .. });
    // Buffer too small for the claimed shape.
    let e = k
        .gated(
            s,
            Activation::Silu,
            &Mat::new(da.as_view(), rows + 1, cols),
            &Mat::new(db.as_view(), rows + 1, cols),
            &mut MatMut::new(y.as_view_mut(), rows + 1, cols),
        )
        .unwrap_err();
    assert!(
        matches!(e, Error::BufferTooSmall { tensor: "a", .. }),
        "{e}"
    );
    assert_eq!(bits(&download(s, &y)), bits(&poisoned));
    // Raw: y over a is forbidden aliasing.
    let (ma, mb) = (desc(s, &da, rows, cols), desc(s, &db, rows, cols));
    // SAFETY: live buffers of this context; the call is expected to be rejected before launch.
    let e = unsafe { k.gated_raw(s, Activation::Silu, &ma, &mb, &ma) }.unwrap_err();
    assert_eq!(
        e,
        Error::Aliasing {
            output: "y",
            other: "a"
        }
    );
    assert_eq!(bits(&download(s, &da)), bits(&a));
}

#[test]
fn rejected_calls_write_nothing() {
    for_each_dtype("rejected_calls_write_nothing", |k, s, rng, dtype| {
        typed!(dtype, rejected_case::<T>(k, s, rng))
    });
}

/// +-1e4, +-inf and NaN gates behave as torch.nn.functional (the reference encodes torch's
/// semantics; see tests/act_cpu.rs), on both the vector and the scalar path.
fn extremes_case<T: Element>(k: &Kernels, s: &Arc<CudaStream>, act: Activation, cols: usize) {
    let specials = [
        1e4,
        -1e4,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        0.0,
        -0.0,
        1.0,
    ];
    let rows = 3;
    let a: Vec<T> = (0..rows * cols)
        .map(|i| T::from_f64(specials[i % specials.len()]))
        .collect();
    let b: Vec<T> = (0..rows * cols)
        .map(|i| T::from_f64(if i % 3 == 0 { -1.5 } else { 0.75 }))
        .collect();
    let want = reference::gated_forward(act, &to_f64(&a), &to_f64(&b));
    let (da, db) = (upload(s, &a), upload(s, &b));
    let mut y = upload(s, &vec![T::from_f64(7.0); rows * cols]);
    k.gated(
        s,
        act,
        &Mat::new(da.as_view(), rows, cols),
        &Mat::new(db.as_view(), rows, cols),
        &mut MatMut::new(y.as_view_mut(), rows, cols),
    )
    .unwrap();
    let got = to_f64(&download(s, &y));
    // Where the reference is NaN the kernel must be NaN, where it is infinite the same
    // infinity; elsewhere within the usual bound.
    let what = format!("extremes {} {} cols={cols}", act.name(), T::DTYPE.name());
    let want: Vec<f64> = want.iter().map(|&w| T::from_f64(w).to_f64()).collect();
    check(
        &format!("y {}", act.name()),
        &what,
        T::DTYPE,
        &got,
        &want,
        |_| 0.0,
    );
}

#[test]
fn extreme_inputs() {
    for_each_dtype("extreme_inputs", |k, s, _, dtype| {
        for act in Activation::ALL {
            for cols in [64, 67] {
                typed!(dtype, extremes_case::<T>(k, s, act, cols));
            }
        }
    });
}

/// A launch is one `cuLaunchKernel` with no allocation or synchronisation: it can be captured
/// into a CUDA graph and replayed.
#[test]
fn launch_is_graph_capturable() {
    let Some((k, s)) = gpu("launch_is_graph_capturable") else {
        return;
    };
    let (mut rng, _) = rng();
    let (rows, cols) = (16, 14336);
    let (a, af) = random::<bf16>(&mut rng, rows * cols, 8.0);
    let (b, bf) = random::<bf16>(&mut rng, rows * cols, 2.0);
    let (da, db) = (upload(&s, &a), upload(&s, &b));
    let y = upload(&s, &vec![poison::<bf16>(); rows * cols]);
    let (ma, mb, my) = (
        desc(&s, &da, rows, cols),
        desc(&s, &db, rows, cols),
        desc(&s, &y, rows, cols),
    );
    use ferrofuse::cudarc::driver::sys;
    s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .unwrap();
    // SAFETY: live buffers of this context; the graph is replayed and synchronised below.
    unsafe { k.gated_raw(&s, Activation::Silu, &ma, &mb, &my) }.unwrap();
    let graph = s
        .end_capture(sys::CUgraphInstantiate_flags(0))
        .unwrap()
        .expect("a captured graph");
    graph.launch().unwrap();
    s.synchronize().unwrap();
    let want = reference::gated_forward(Activation::Silu, &af, &bf);
    let got = to_f64(&download(&s, &y));
    check(
        "y graph replay",
        "graph replay",
        DType::BF16,
        &got,
        &want,
        |_| 0.0,
    );
}

/// Past 2^31 elements: an interleaved input of 2^32 + elements and an output of 2^31 +
/// elements, then the same buffer's two halves as dense split inputs (byte offsets past 2^32
/// in each operand), each checked on sampled elements and whole first and last rows.
#[test]
fn indexing_past_2_pow_31_elements() {
    if quick() {
        eprintln!("skipping indexing_past_2_pow_31_elements in quick mode");
        return;
    }
    let Some((k, s)) = gpu("indexing_past_2_pow_31_elements") else {
        return;
    };
    let inter = 14336;
    let rows = (1usize << 31) / inter + 1;
    let n = rows * inter;
    let (free, _) = k.context().mem_get_info().unwrap();
    if free < 3 * n * 2 + (1 << 30) {
        eprintln!("skipping indexing_past_2_pow_31_elements: {free} bytes free on the device");
        return;
    }
    // A cheap deterministic pattern (an LCG), bf16 values in [-4, 4).
    let value = |i: usize| -> bf16 {
        let h = (i as u64)
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407)
            >> 40;
        bf16::from_f32((h as f32 / (1u64 << 24) as f32) * 8.0 - 4.0)
    };
    let x: Vec<bf16> = (0..2 * n).map(value).collect();
    let dx = upload(&s, &x);
    // `a` and `b` of output element (r, c), as indices into x.
    let check = |y: &[bf16], at: &dyn Fn(usize, usize) -> (usize, usize), what: &str| {
        let one = |r: usize, c: usize| {
            let (ia, ib) = at(r, c);
            let want = reference::act(Activation::Silu, x[ia].to_f64()) * x[ib].to_f64();
            let got = y[r * inter + c].to_f64();
            let e = ulp_error(DType::BF16, got, want, 0.0);
            assert!(
                e <= max_ulps(DType::BF16),
                "{what}: row {r} col {c}: got {got}, want {want} ({e:.2} ulps)"
            );
        };
        for c in 0..inter {
            one(0, c);
            one(rows - 1, c);
        }
        let mut i = 12345usize;
        for _ in 0..1_000_000 {
            i = (i.wrapping_mul(2862933555777941757).wrapping_add(3037000493)) % n;
            one(i / inter, i % inter);
        }
        assert!(
            y.iter().all(|v| !v.is_nan()),
            "{what}: an element past 2^31 was not written"
        );
    };

    let mut y = upload(&s, &vec![poison::<bf16>(); n]);
    k.gated_interleaved(
        &s,
        Activation::Silu,
        &Mat::new(dx.as_view(), rows, 2 * inter),
        &mut MatMut::new(y.as_view_mut(), rows, inter),
    )
    .unwrap();
    let interleaved = |r: usize, c: usize| (r * 2 * inter + c, r * 2 * inter + inter + c);
    check(&download(&s, &y), &interleaved, "interleaved");
    drop(y);

    let mut y = upload(&s, &vec![poison::<bf16>(); n]);
    k.gated(
        &s,
        Activation::Silu,
        &Mat::new(dx.slice(..n), rows, inter),
        &Mat::new(dx.slice(n..), rows, inter),
        &mut MatMut::new(y.as_view_mut(), rows, inter),
    )
    .unwrap();
    let split = |r: usize, c: usize| (r * inter + c, n + r * inter + c);
    check(&download(&s, &y), &split, "split");
}

/// Back-to-back launches on one stream, each reading what the previous one wrote, with no
/// synchronisation between them: with programmatic dependent launch the next kernel starts
/// early, and its `griddepcontrol.wait` must still order it after the previous one.
#[test]
fn chained_launches_see_previous_results() {
    let Some((k, s)) = gpu("chained_launches_see_previous_results") else {
        return;
    };
    let (mut rng, seed) = rng();
    let (rows, cols) = if quick() { (4, 1024) } else { (512, 14336) };
    let n = rows * cols;
    let (x0, x0f) = random::<f32>(&mut rng, n, 3.0);
    let (b, bf) = random::<f32>(&mut rng, n, 1.2);
    let bufs = [upload(&s, &x0), upload(&s, &vec![poison::<f32>(); n])];
    let db = upload(&s, &b);
    let (m0, m1, mb) = (
        desc(&s, &bufs[0], rows, cols),
        desc(&s, &bufs[1], rows, cols),
        desc(&s, &db, rows, cols),
    );
    let steps = 24;
    for step in 0..steps {
        let (src, dst) = if step % 2 == 0 {
            (&m0, &m1)
        } else {
            (&m1, &m0)
        };
        // The raw entry adds nothing between launches (the safe views' event tracking could
        // put event records in between, which would hide a missing dependency).
        // SAFETY: live buffers of this context, synchronised by the download below.
        unsafe { k.gated_raw(&s, Activation::Silu, src, &mb, dst) }.unwrap();
    }
    // The reference rounds to f32 after every step, as the kernels' stores do.
    let mut want = x0f;
    for _ in 0..steps {
        want = reference::gated_forward(Activation::Silu, &want, &bf)
            .iter()
            .map(|&v| v as f32 as f64)
            .collect();
    }
    let got = to_f64(&download(&s, &bufs[steps % 2]));
    // Each step's error within the f32 bound, carried through at most `steps` steps (values
    // below 2^-10 counted in units at 2^-10); a launch that ran before its predecessor had
    // finished would read stale or poisoned (NaN) values, far outside it.
    let what = format!("seed {seed:#x}: after {steps} chained launches");
    let bound = steps as f64 * max_ulps(DType::F32);
    assert_ulps(&what, DType::F32, &got, &want, |_| 1.0 / 1024.0, bound);
}
