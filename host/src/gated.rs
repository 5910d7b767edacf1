//! Gated activations `y = act(a) * b` (SwiGLU, GeGLU erf/tanh, ReGLU), forward and backward.
//!
//! Layouts: split (`a`, `b` separate `[rows, I]` matrices) or interleaved (one `[rows, 2I]`
//! matrix `[gate | up]`, read through its row stride, so sliced or padded views work).
//! Storage f32/f16/bf16, one dtype for every operand; math in f32 (see
//! `ferrofuse_common::act`), rounded once at the store.
//!
//! Memory paths: 16-byte vectors when every operand's rows are on the 16-byte grid; one flat
//! range when the rows are not but every operand is dense and at the same offset from the grid
//! (the vector kernel over the elements as one row, the few before its first 16-byte boundary
//! and after its last vector taken by the grid's last threads: [`FlatEnds`]); otherwise,
//! forward, aligned vectors of the output with the inputs realigned in registers (any offsets
//! and strides: interleaved halves of odd width, padded rows, views at an offset), and backward
//! likewise or one element per access, several accesses in flight per thread. All compute the
//! same values.
//!
//! Safe entry points take inputs as [`Mat`] and outputs as [`MatMut`]; the in-place forms are
//! their own functions taking the overwritten buffer as `&mut`. The `unsafe` `*_raw` forms take
//! [`MatDesc`]s for tensors owned elsewhere and check aliasing at run time. Every form runs the
//! same `plan_*` validation, which needs no GPU.

use ferrofuse_common::{
    Activation, DType, FlatEnds, GATED_SCALAR_BATCH, GATED_THREADS, GatedBwdParams, GatedFwdParams,
    GridWalk, KernelId, VecMode,
};

use ferrofuse_common::fp8::{FP8_PER_GROUP, FP8_PER_TOKEN, FP8_STATIC};
use ferrofuse_common::{
    GATED_FP8_ROW_CHUNKS, GATED_FP8_ROW_LONG_CHUNKS, GATED_FP8_ROW_MAX_BLOCKS,
    GATED_FP8_ROW_MAX_THREADS, GATED_FP8_ROW_SMEM_BYTES, GATED_FP8_ROWS_CHUNKS,
    GATED_FP8_SCALAR_BATCH, GATED_FP8_STREAM_MIN_CHUNKS, GATED_FP8_STREAM_SMEM_BYTES,
    GatedFp8Params,
};

use crate::error::{Error, Result};
use crate::fp8::{F8E4M3, Fp8Scales, Fp8Scaling, ScaleLayout, check_fp8_output};
use crate::runtime::{GridLimits, Kernels, Launch};
use crate::tensor::{Element, Mat, MatDesc, MatMut};
use crate::validate::{check_aliasing, check_shape, vec_mode};
use cudarc::driver::CudaStream;

/// The kernels' first-row multiply-high is exact for rows of fewer than 2^32 accesses.
fn check_row_length(cols: usize) -> Result<()> {
    if cols as u64 > u32::MAX as u64 {
        return Err(Error::TooLarge {
            what: "row length (cols)",
            value: cols,
        });
    }
    Ok(())
}

/// The grid for `rows x cols` elements moved by `kernel`, and its walk.
///
/// With `R` threads resident on the device, on the vector path: up to `R` accesses, one per
/// thread (a small tensor spreads over every multiprocessor); up to `4R`, a grid of exactly `R`
/// threads, each taking `ceil(total / R)` accesses or one fewer (no second wave that is mostly
/// empty); beyond, one access per thread again, the block scheduler streaming waves (what
/// measured fastest for large tensors). The middle grid fills every block slot on purpose:
/// under programmatic dependent launch a grid is placed while the previous one drains, into
/// slots as they free up, and a smaller grid measured slower (`bench/TUNING.md`). The scalar
/// path moves one element per access and takes [`GATED_SCALAR_BATCH`] of them per thread at a
/// time, so its grid has a thread per batch, at most one wave (each thread then walks several
/// batches). At most 2^31 threads, so the kernel's first-row multiply-high (exact below 2^32)
/// is exact. A flat range's ragged `ends` go to the grid's last threads ([`FlatEnds`]); where
/// one access per thread covers the call, the grid gets a warp more for them, so that their
/// loads issue beside the body's, not after a warp's vector accesses.
fn grid_for(
    kernel: KernelId,
    rows: usize,
    cols: usize,
    ends: FlatEnds,
    limits: &GridLimits,
) -> (u32, GridWalk) {
    let (per_row, vector) = match kernel {
        KernelId::GatedFwd(dtype, mode) | KernelId::GatedBwd(dtype, mode) => match mode {
            VecMode::V16 => ((cols / dtype.lanes_per_16b()) as u64, true),
            VecMode::Scalar => (cols as u64, false),
        },
        KernelId::GatedFwdEnds(dtype) | KernelId::GatedBwdEnds(dtype) => {
            ((cols / dtype.lanes_per_16b()) as u64, true)
        }
        KernelId::GatedFwdRealigned(dtype)
        | KernelId::GatedFwdRealignedEndsFirst(dtype)
        | KernelId::GatedBwdRealigned(dtype) => (realigned_per_row(dtype, cols), true),
        _ => unreachable!("grid_for sizes gated kernels only"),
    };
    let total = rows as u64 * per_row;
    let block = GATED_THREADS as u64;
    let resident = resident_threads(kernel, limits);
    let threads = match vector {
        true if total > resident && total <= 4 * resident => resident,
        true => (total + ends_warp(ends)).min(1 << 31),
        false => total.div_ceil(GATED_SCALAR_BATCH as u64).min(resident),
    };
    let grid = threads.div_ceil(block);
    (grid as u32, GridWalk::new(per_row, grid * block))
}

/// Threads a grid of one access (or step) per thread adds for a flat range's ragged ends: a
/// warp where there are any (see [`grid_for`]).
fn ends_warp(ends: FlatEnds) -> u64 {
    if ends == FlatEnds::default() { 0 } else { 32 }
}

/// Accesses per row of the realigned forward: every 16-byte aligned vector of `y` that a row
/// of `cols` elements can touch, at any offset.
fn realigned_per_row(dtype: DType, cols: usize) -> u64 {
    (cols as u64 * dtype.size_bytes() as u64).div_ceil(16) + 1
}

/// Accesses of a realigned call (one thread each; saturating, for the size rules).
fn realigned_accesses(dtype: DType, rows: usize, cols: usize) -> u64 {
    (rows as u64).saturating_mul(realigned_per_row(dtype, cols))
}

/// Threads of a gated kernel's blocks the device holds at once.
fn resident_threads(kernel: KernelId, limits: &GridLimits) -> u64 {
    limits.resident_blocks(kernel) as u64 * GATED_THREADS as u64
}

/// Whether a call whose rows the vector path cannot take whole (their length, a row stride or
/// a base address is off the 16-byte grid) still can as one flat range: every operand dense
/// (its rows back to back), all at the same offset from a 16-byte boundary, fewer than 2^32
/// elements and at least one vector of them past the first boundary. Then the `rows * cols`
/// elements are one array: a head up to the first 16-byte boundary, a vector body and a tail
/// (each shorter than a vector); returns the body's operands (one row each) and the ends.
fn flat_split<const N: usize>(
    dtype: DType,
    mats: [&MatDesc; N],
) -> Option<([MatDesc; N], FlatEnds)> {
    let first = mats[0];
    let (rows, cols) = first.shape();
    let n = rows * cols;
    let size = dtype.size_bytes() as u64;
    let offset = first.addr % 16;
    let lanes = dtype.lanes_per_16b();
    let head = ((16 - offset) % 16 / size) as usize;
    // Within the vector kernel's row length (accesses counted in 32 bits).
    let flat = vec_mode(dtype, cols, &mats.map(Some)) == VecMode::Scalar
        && n <= u32::MAX as usize
        && n >= head + lanes
        && mats
            .iter()
            .all(|m| (m.rows <= 1 || m.row_stride == m.cols) && m.addr % 16 == offset);
    if !flat {
        return None;
    }
    let body = (n - head) / lanes * lanes;
    let ends = FlatEnds {
        head: head as u16,
        tail: (n - head - body) as u16,
    };
    Some((mats.map(|m| m.flat(head, body)), ends))
}

/// Validates a forward call and decides its launches; every operand has `a`'s dtype. `y` may
/// equal `b` exactly (in place); every other overlap of `y` with an input is rejected.
pub fn plan_gated_forward(
    act: Activation,
    a: &MatDesc,
    b: &MatDesc,
    y: &MatDesc,
    limits: &GridLimits,
) -> Result<Launch<GatedFwdParams>> {
    let dtype = a.dtype;
    a.check("a", dtype)?;
    b.check("b", dtype)?;
    y.check("y", dtype)?;
    check_shape("b", b, a.shape())?;
    check_shape("y", y, a.shape())?;
    check_aliasing(("y", y), &[("a", Some(a)), ("b", Some(b))], &["b"])?;
    check_row_length(a.cols)?;
    Ok(match flat_split(dtype, [a, b, y]) {
        Some(([a, b, y], ends)) => forward_launch(act, &a, &b, &y, ends, limits),
        None => forward_launch(act, a, b, y, FlatEnds::default(), limits),
    })
}

/// The launch of a validated forward call over `a`'s shape (a flat range's body, with its
/// `ends`: on the grid): the vector path where every operand's rows are on the 16-byte grid
/// (its entry that takes the ends where there are any), the realigned path otherwise.
fn forward_launch(
    act: Activation,
    a: &MatDesc,
    b: &MatDesc,
    y: &MatDesc,
    ends: FlatEnds,
    limits: &GridLimits,
) -> Launch<GatedFwdParams> {
    let (dtype, (rows, cols)) = (a.dtype, a.shape());
    let kernel = match vec_mode(dtype, cols, &[Some(a), Some(b), Some(y)]) {
        VecMode::Scalar => realigned_kernel(dtype, rows, cols, limits),
        mode if ends == FlatEnds::default() => KernelId::GatedFwd(dtype, mode),
        _ => KernelId::GatedFwdEnds(dtype),
    };
    let (grid, walk) = grid_for(kernel, rows, cols, ends, limits);
    Launch {
        kernel,
        grid,
        block: GATED_THREADS,
        shared_mem_bytes: 0,
        params: GatedFwdParams {
            a: a.addr,
            b: b.addr,
            y: y.addr,
            a_stride: a.row_stride as u64,
            b_stride: b.row_stride as u64,
            y_stride: y.row_stride as u64,
            rows: rows as u64,
            cols: cols as u64,
            walk,
            act: act as u32,
            ends,
        },
    }
}

/// The realigned forward's entry: the one that runs a warp's row ends first where the call's
/// accesses, one thread each, fit on the device at once (latency sets the time there), the one
/// of fewer registers and more threads per multiprocessor past that (`kernels/src/gated.rs`).
fn realigned_kernel(dtype: DType, rows: usize, cols: usize, limits: &GridLimits) -> KernelId {
    let ends_first = KernelId::GatedFwdRealignedEndsFirst(dtype);
    if realigned_accesses(dtype, rows, cols) <= resident_threads(ends_first, limits) {
        ends_first
    } else {
        KernelId::GatedFwdRealigned(dtype)
    }
}

/// Validates a backward call and decides its launches. `da` may equal `a` or `dy`, `db` may
/// equal `b` or `dy`; the two gradients must not overlap each other or anything else.
pub fn plan_gated_backward(
    act: Activation,
    a: &MatDesc,
    b: &MatDesc,
    dy: &MatDesc,
    da: &MatDesc,
    db: &MatDesc,
    limits: &GridLimits,
) -> Result<Launch<GatedBwdParams>> {
    let dtype = a.dtype;
    for (name, m) in [("a", a), ("b", b), ("dy", dy), ("da", da), ("db", db)] {
        m.check(name, dtype)?;
    }
    for (name, m) in [("b", b), ("dy", dy), ("da", da), ("db", db)] {
        check_shape(name, m, a.shape())?;
    }
    check_aliasing(
        ("da", da),
        &[
            ("a", Some(a)),
            ("b", Some(b)),
            ("dy", Some(dy)),
            ("db", Some(db)),
        ],
        &["a", "dy"],
    )?;
    check_aliasing(
        ("db", db),
        &[("a", Some(a)), ("b", Some(b)), ("dy", Some(dy))],
        &["b", "dy"],
    )?;
    check_row_length(a.cols)?;
    let all = [a, b, dy, da, db];
    Ok(match flat_split(dtype, all) {
        Some((body, ends)) => backward_launch(act, body.each_ref(), ends, limits),
        None => backward_launch(act, all, FlatEnds::default(), limits),
    })
}

/// The launch of a validated backward call over `a`'s shape (a flat range's body, with its
/// `ends`); operands `[a, b, dy, da, db]`. Off the vector grid: the realigned path when no
/// gradient overlaps an input (the realigned kernel reads each input vector's neighbours,
/// which other threads would be overwriting in place) and the call's accesses, one thread
/// each, fill more than half the threads the device holds at once; the scalar path otherwise.
/// Below that, latency sets the time: the scalar path issues all of a thread's loads at once,
/// the realigned one waits for `da`'s inputs, then for `db`'s.
fn backward_launch(
    act: Activation,
    [a, b, dy, da, db]: [&MatDesc; 5],
    ends: FlatEnds,
    limits: &GridLimits,
) -> Launch<GatedBwdParams> {
    let (dtype, (rows, cols)) = (a.dtype, a.shape());
    let in_place = [da, db]
        .iter()
        .any(|g| [a, b, dy].iter().any(|m| g.overlaps(m)));
    let realigned = KernelId::GatedBwdRealigned(dtype);
    let fills_half =
        realigned_accesses(dtype, rows, cols) > resident_threads(realigned, limits) / 2;
    let kernel = match vec_mode(
        dtype,
        cols,
        &[Some(a), Some(b), Some(dy), Some(da), Some(db)],
    ) {
        VecMode::Scalar if !in_place && fills_half => realigned,
        VecMode::V16 if ends != FlatEnds::default() => KernelId::GatedBwdEnds(dtype),
        mode => KernelId::GatedBwd(dtype, mode),
    };
    let (grid, walk) = grid_for(kernel, rows, cols, ends, limits);
    Launch {
        kernel,
        grid,
        block: GATED_THREADS,
        shared_mem_bytes: 0,
        params: GatedBwdParams {
            a: a.addr,
            b: b.addr,
            dy: dy.addr,
            da: da.addr,
            db: db.addr,
            a_stride: a.row_stride as u64,
            b_stride: b.row_stride as u64,
            dy_stride: dy.row_stride as u64,
            da_stride: da.row_stride as u64,
            db_stride: db.row_stride as u64,
            rows: rows as u64,
            cols: cols as u64,
            walk,
            act: act as u32,
            ends,
        },
    }
}

impl Kernels {
    /// `y = act(a) * b` with split inputs.
    pub fn gated<T: Element>(
        &self,
        stream: &CudaStream,
        act: Activation,
        a: &Mat<T>,
        b: &Mat<T>,
        y: &mut MatMut<T>,
    ) -> Result<()> {
        self.check_views(
            stream,
            &[("a", a.stream()), ("b", b.stream()), ("y", y.stream())],
        )?;
        let (a, _ga) = a.desc(stream);
        let (b, _gb) = b.desc(stream);
        let (y, _gy) = y.desc_mut(stream);
        let plan = plan_gated_forward(act, &a, &b, &y, self.limits())?;
        // SAFETY: planned from live views borrowed for this call; y cannot alias a or b (it is
        // borrowed mutably while they are borrowed shared) and the plan checked the rest.
        unsafe { self.launch(stream, &plan) }
    }

    /// `y = act(x[:, :I]) * x[:, I:]` for an interleaved `[gate | up]` input of width `2I`.
    pub fn gated_interleaved<T: Element>(
        &self,
        stream: &CudaStream,
        act: Activation,
        x: &Mat<T>,
        y: &mut MatMut<T>,
    ) -> Result<()> {
        self.check_views(stream, &[("x", x.stream()), ("y", y.stream())])?;
        let (x, _gx) = x.desc(stream);
        let (gate, up) = x.interleaved_halves()?;
        let (y, _gy) = y.desc_mut(stream);
        let plan = plan_gated_forward(act, &gate, &up, &y, self.limits())?;
        // SAFETY: as in `gated`.
        unsafe { self.launch(stream, &plan) }
    }

    /// `b = act(a) * b`, in place over `b`.
    pub fn gated_inplace<T: Element>(
        &self,
        stream: &CudaStream,
        act: Activation,
        a: &Mat<T>,
        b: &mut MatMut<T>,
    ) -> Result<()> {
        self.check_views(stream, &[("a", a.stream()), ("b", b.stream())])?;
        let (a, _ga) = a.desc(stream);
        let (b, _gb) = b.desc_mut(stream);
        let plan = plan_gated_forward(act, &a, &b, &b, self.limits())?;
        // SAFETY: y is exactly b, which the kernel reads before writing, element by element.
        unsafe { self.launch(stream, &plan) }
    }

    /// `x[:, I:] = act(x[:, :I]) * x[:, I:]`: the result overwrites the up half of the
    /// interleaved input; the gate half is left as it was.
    pub fn gated_interleaved_inplace<T: Element>(
        &self,
        stream: &CudaStream,
        act: Activation,
        x: &mut MatMut<T>,
    ) -> Result<()> {
        self.check_views(stream, &[("x", x.stream())])?;
        let (x, _gx) = x.desc_mut(stream);
        let (gate, up) = x.interleaved_halves()?;
        let plan = plan_gated_forward(act, &gate, &up, &up, self.limits())?;
        // SAFETY: y is exactly the up half; the halves of one row do not overlap.
        unsafe { self.launch(stream, &plan) }
    }

    /// `da = dy * b * act'(a)`, `db = dy * act(a)` with split inputs and gradients.
    #[allow(clippy::too_many_arguments)]
    pub fn gated_backward<T: Element>(
        &self,
        stream: &CudaStream,
        act: Activation,
        a: &Mat<T>,
        b: &Mat<T>,
        dy: &Mat<T>,
        da: &mut MatMut<T>,
        db: &mut MatMut<T>,
    ) -> Result<()> {
        self.check_views(
            stream,
            &[
                ("a", a.stream()),
                ("b", b.stream()),
                ("dy", dy.stream()),
                ("da", da.stream()),
                ("db", db.stream()),
            ],
        )?;
        let (a, _ga) = a.desc(stream);
        let (b, _gb) = b.desc(stream);
        let (dy, _gdy) = dy.desc(stream);
        let (da, _gda) = da.desc_mut(stream);
        let (db, _gdb) = db.desc_mut(stream);
        let plan = plan_gated_backward(act, &a, &b, &dy, &da, &db, self.limits())?;
        // SAFETY: as in `gated`.
        unsafe { self.launch(stream, &plan) }
    }

    /// Backward for the interleaved layout: `x = [a | b]` and `dx = [da | db]`, both `[rows, 2I]`.
    pub fn gated_backward_interleaved<T: Element>(
        &self,
        stream: &CudaStream,
        act: Activation,
        x: &Mat<T>,
        dy: &Mat<T>,
        dx: &mut MatMut<T>,
    ) -> Result<()> {
        self.check_views(
            stream,
            &[("x", x.stream()), ("dy", dy.stream()), ("dx", dx.stream())],
        )?;
        let (x, _gx) = x.desc(stream);
        let (a, b) = x.interleaved_halves()?;
        let (dy, _gdy) = dy.desc(stream);
        let (dx, _gdx) = dx.desc_mut(stream);
        let (da, db) = dx.interleaved_halves()?;
        let plan = plan_gated_backward(act, &a, &b, &dy, &da, &db, self.limits())?;
        // SAFETY: as in `gated`; the halves of dx do not overlap each other.
        unsafe { self.launch(stream, &plan) }
    }

    /// Forward on raw device matrices (tensors owned by another framework). `y` may be exactly
    /// `b`; every other overlap is rejected. Use [`MatDesc::interleaved_halves`] for the
    /// interleaved layout.
    ///
    /// # Safety
    /// Each description must be true: `addr` a device address in this context with `len`
    /// elements of `dtype` behind it, alive until the kernel has run, and not written by other
    /// work ordered concurrently with `stream`.
    pub unsafe fn gated_raw(
        &self,
        stream: &CudaStream,
        act: Activation,
        a: &MatDesc,
        b: &MatDesc,
        y: &MatDesc,
    ) -> Result<()> {
        self.check_stream(stream)?;
        let plan = plan_gated_forward(act, a, b, y, self.limits())?;
        // SAFETY: the caller vouches for the descriptions; the plan checked shapes, sizes,
        // alignment and aliasing.
        unsafe { self.launch(stream, &plan) }
    }

    /// Backward on raw device matrices; aliasing as in [`plan_gated_backward`].
    ///
    /// # Safety
    /// As for [`Kernels::gated_raw`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gated_backward_raw(
        &self,
        stream: &CudaStream,
        act: Activation,
        a: &MatDesc,
        b: &MatDesc,
        dy: &MatDesc,
        da: &MatDesc,
        db: &MatDesc,
    ) -> Result<()> {
        self.check_stream(stream)?;
        let plan = plan_gated_backward(act, a, b, dy, da, db, self.limits())?;
        // SAFETY: as in `gated_raw`.
        unsafe { self.launch(stream, &plan) }
    }
}

// ---------------------------------------------------------------------------------------------
// FP8 E4M3 outputs: `y_q = e4m3(act(a) * b / scale)` (see `crate::fp8`).
// ---------------------------------------------------------------------------------------------

/// Validates an FP8 forward call and decides its launches: `a`, `b` in one storage dtype
/// (f32/f16/bf16), `y` FP8 of their shape, `scales` f32 of the shape `scaling` needs (see
/// [`Fp8Scaling::scale_shape`]); `y` and `scales` overlap nothing. Static and per-group
/// scales run the flat kernel (each element read once, written once, one scale per group),
/// per-token scales the row kernel (each row held by a block; see
/// `kernels/src/gated_fp8.rs`). A static scale is the same for every element, so a call off
/// the 16-byte grid whose operands are dense runs as one flat range, as the storage forward's
/// does (`y`'s vector body on its own 8- or 4-byte grid).
pub fn plan_gated_forward_fp8(
    act: Activation,
    a: &MatDesc,
    b: &MatDesc,
    y: &MatDesc,
    scaling: Fp8Scaling,
    scales: &MatDesc,
    limits: &GridLimits,
) -> Result<Launch<GatedFp8Params>> {
    let dtype = a.dtype;
    a.check("a", dtype)?;
    b.check("b", dtype)?;
    check_shape("b", b, a.shape())?;
    check_fp8_output(y, scales, &scaling, a.shape(), &[("a", a), ("b", b)])?;
    check_row_length(a.cols)?;
    let split = (scaling == Fp8Scaling::Static)
        .then(|| fp8_flat_split(dtype, a, b, y))
        .flatten();
    if let Some(([a, b, y], ends)) = split {
        return fp8_launch(act, &a, &b, &y, scaling, scales, limits, VecMode::V16, ends);
    }
    let mode = vec_mode(dtype, a.cols, &[Some(a), Some(b), Some(y)]);
    fp8_launch(
        act,
        a,
        b,
        y,
        scaling,
        scales,
        limits,
        mode,
        FlatEnds::default(),
    )
}

/// [`flat_split`] for a static-scale FP8 call: `a` and `b` as there, and `y` dense with the
/// range's vector body on its grid, whose accesses store one byte per input element (8-byte
/// words for 16-bit inputs, 4-byte for f32). Returns the body's `[a, b, y]` and the ends.
fn fp8_flat_split(
    dtype: DType,
    a: &MatDesc,
    b: &MatDesc,
    y: &MatDesc,
) -> Option<([MatDesc; 3], FlatEnds)> {
    let ([a, b], ends) = flat_split(dtype, [a, b])?;
    let dense = y.rows <= 1 || y.row_stride == y.cols;
    let y = y.flat(ends.head as usize, a.cols);
    let on_grid = y.addr.is_multiple_of(dtype.lanes_per_16b() as u64);
    (dense && on_grid).then_some(([a, b, y], ends))
}

/// The launch of a validated FP8 forward call over `a`'s shape on memory path `mode` (a flat
/// range's body, with its `ends`); off the vector grid, a static scale with 16-bit inputs takes
/// the realigned kernels.
#[allow(clippy::too_many_arguments)]
fn fp8_launch(
    act: Activation,
    a: &MatDesc,
    b: &MatDesc,
    y: &MatDesc,
    scaling: Fp8Scaling,
    scales: &MatDesc,
    limits: &GridLimits,
    mode: VecMode,
    ends: FlatEnds,
) -> Result<Launch<GatedFp8Params>> {
    let dtype = a.dtype;
    let (rows, cols) = a.shape();
    let width = match mode {
        VecMode::V16 => dtype.lanes_per_16b(),
        VecMode::Scalar => 1,
    };
    let per_row = (cols / width) as u64;
    let total = rows as u64 * per_row;
    // The flat walk's multiply-high is exact below 2^32 accesses (and a warp step past the end).
    if total >= (1u64 << 32) - 1024 {
        return Err(Error::TooLarge {
            what: "elements of an FP8 output (accesses counted in 32 bits)",
            value: rows.saturating_mul(cols),
        });
    }
    let (scale_row, scale_group) = match scaling {
        Fp8Scaling::PerGroup {
            layout: ScaleLayout::ColMajor,
            ..
        } => (1, scales.row_stride as u64),
        Fp8Scaling::PerGroup { .. } => (scales.row_stride as u64, 1),
        _ => (scales.row_stride as u64, 0),
    };
    let mut params = GatedFp8Params {
        a: a.addr,
        b: b.addr,
        y: y.addr,
        scale: scales.addr,
        a_stride: a.row_stride as u64,
        b_stride: b.row_stride as u64,
        y_stride: y.row_stride as u64,
        scale_row,
        scale_group,
        rows: rows as u64,
        cols: cols as u64,
        walk: GridWalk::new(per_row, 0),
        min_scale: 1.0,
        scale_ub: f32::INFINITY,
        act: act as u32,
        scheme: FP8_STATIC,
        group_shift: 0,
        group_lanes: 1,
        batch: 1,
        threads_per_row: 32,
        rows_per_block: 1,
        chunks: 1,
        prefetch_rows: 0,
        row_blocks: 1,
        ends,
        _pad: 0,
    };
    if let Fp8Scaling::PerToken {
        min_scale,
        scale_ub,
    } = scaling
    {
        // Blocks of a fixed width (the kernel's addressing assumes it), each thread holding
        // up to GATED_FP8_ROW_CHUNKS accesses of a tile. A row of one tile: one block (two per
        // SM; three or four for element accesses, which take a register per input each). A
        // row of up to GATED_FP8_ROW_LONG_CHUNKS accesses per thread, beyond one wave of that
        // kernel: the long-row kernel, the whole row on one block (one per SM, three or four
        // for element accesses). Where the module has clusters, the split kernel, one tile on
        // each block of a cluster of up to GATED_FP8_ROW_MAX_BLOCKS, for rows too long for
        // the long-row kernel, and for shorter ones while the split grid is at most one block
        // per SM (a cluster waits for its slowest block twice and its blocks run together: it
        // wins only while one block per row would leave SMs idle). Otherwise a row of 16-byte
        // accesses is walked twice by one block (within one wave faster than the long-row
        // kernel, all rows at once); a row of element accesses takes the long-row kernel at
        // any count (as many rows per SM there as on the row kernel). Measurements in
        // bench/TUNING.md, "Per-token FP8 rows: prefetch one wave ahead, ..." and "Per-token
        // element rows at three and four per SM". Where the module streams rows, rows of
        // 16-byte accesses are streamed from GATED_FP8_STREAM_MIN_CHUNKS accesses per thread,
        // within a tile past two waves of the row kernel: the persistent blocks take their
        // rows one after another, which just past one wave is slower than the row kernel's
        // second wave ("Per-token rows of one tile streamed").
        let tpr = GATED_FP8_ROW_MAX_THREADS as u64;
        let per_thread = per_row.div_ceil(tpr);
        let tile_chunks = GATED_FP8_ROW_CHUNKS as u64;
        let split_blocks = per_thread.div_ceil(tile_chunks);
        let one_wave = limits.resident_blocks(KernelId::GatedFp8Row(dtype, mode)) as u64;
        let long_fits = per_thread <= GATED_FP8_ROW_LONG_CHUNKS as u64;
        let split_fits = limits.clusters && split_blocks <= GATED_FP8_ROW_MAX_BLOCKS as u64;
        let few_rows = rows as u64 * split_blocks <= limits.sm_count as u64;
        let streamed = limits.streamed_rows && mode == VecMode::V16;
        let one_tile = per_thread <= tile_chunks;
        let split = !one_tile && split_fits && (few_rows || !long_fits);
        // An entry per count of accesses per thread, GATED_FP8_STREAM_MIN_CHUNKS to
        // GATED_FP8_ROW_LONG_CHUNKS.
        let stream = streamed
            && if one_tile {
                per_thread >= GATED_FP8_STREAM_MIN_CHUNKS as u64 && rows as u64 > 2 * one_wave
            } else {
                !split && long_fits
            };
        // Off the 16-byte grid, 16-bit inputs, at least a row per SM, rows whose aligned words
        // of `y` (one per 16-byte vector of the inputs, at any offset) take three or four per
        // thread of one tile: the realigned row kernel; one or two per thread: the many-rows
        // kernel's geometry over those words (one row per 512-thread block lost to the scalar
        // row kernel there), except rows of one group of more than 256 threads per block that
        // the scalar long-row kernel holds (4096 x 4095: 0.84x of it on an H100). Elsewhere
        // the scalar kernels (f32 rows, fewer rows than SMs: `bench/TUNING.md`, "The FP8
        // kernels off the grid realigned, measured", "Per-token rows off the grid on the
        // many-rows geometry, measured"). All give the same bits, so the choice by `rows`
        // changes no row's bytes or scale.
        let words = (cols as u64).div_ceil(dtype.lanes_per_16b() as u64) + 1;
        let word_chunks = words.div_ceil(tpr);
        let off_grid_rows =
            mode == VecMode::Scalar && dtype.size_bytes() == 2 && rows >= limits.sm_count as usize;
        let group_threads = words
            .div_ceil(GATED_FP8_ROWS_CHUNKS as u64)
            .next_multiple_of(32);
        let rows_realigned = off_grid_rows
            && word_chunks <= GATED_FP8_ROWS_CHUNKS as u64
            && (2 * group_threads <= tpr || !long_fits);
        let realigned = off_grid_rows
            && word_chunks > GATED_FP8_ROWS_CHUNKS as u64
            && word_chunks <= tile_chunks;
        // Rows of 16-byte accesses of at most GATED_FP8_ROWS_CHUNKS per thread of a tile (a
        // tensor-parallel shard's row is often a fraction of one): the many-rows kernel, each
        // row on the fewest warps that hold it at that count, as many rows per block as fit in
        // 512 threads but no fewer blocks than SMs where the rows allow (a block's rows share
        // its SM). Same bits as the row kernel: a row's maximum is exact in any order.
        let many_rows = mode == VecMode::V16 && per_thread <= GATED_FP8_ROWS_CHUNKS as u64;
        let (kernel, chunks, row_blocks) = if realigned {
            params.walk = GridWalk::new(words, 0);
            (KernelId::GatedFp8RowRealigned(dtype), word_chunks, 1)
        } else if rows_realigned {
            // Two words per thread at any length: a word takes about as many registers as
            // two (its two aligned vectors per input and its element loads in flight).
            params.walk = GridWalk::new(words, 0);
            let chunks = GATED_FP8_ROWS_CHUNKS as u64;
            (KernelId::GatedFp8RowsRealigned(dtype), chunks, 1)
        } else if many_rows {
            let chunks = per_thread.max(1);
            (KernelId::GatedFp8Rows(dtype, chunks as u32), chunks, 1)
        } else if stream {
            (
                KernelId::GatedFp8RowStream(dtype, per_thread as u32),
                per_thread,
                1,
            )
        } else if one_tile {
            (KernelId::GatedFp8Row(dtype, mode), per_thread, 1)
        } else if split {
            (
                KernelId::GatedFp8RowSplit(dtype, mode),
                per_thread.div_ceil(split_blocks),
                split_blocks,
            )
        } else if long_fits && (rows as u64 > one_wave || mode == VecMode::Scalar) {
            (KernelId::GatedFp8RowLong(dtype, mode), per_thread, 1)
        } else {
            (KernelId::GatedFp8Row(dtype, mode), tile_chunks, 1)
        };
        let (threads_per_row, rows_per_block) = if many_rows || rows_realigned {
            // A realigned row's group: its words at GATED_FP8_ROWS_CHUNKS per thread.
            let threads = if rows_realigned {
                group_threads
            } else {
                per_row.div_ceil(chunks).next_multiple_of(32)
            };
            let threads = threads.max(32);
            let fit = tpr / threads;
            let spread = (rows as u64).div_ceil(limits.sm_count.max(1) as u64);
            (threads, fit.min(spread).max(1))
        } else {
            (tpr, 1)
        };
        let blocks = match kernel {
            // Persistent blocks, each taking row after row.
            KernelId::GatedFp8RowStream(..) => {
                (rows as u64).min(limits.resident_blocks(kernel) as u64)
            }
            _ => (rows as u64).div_ceil(rows_per_block) * row_blocks,
        };
        if blocks > i32::MAX as u64 {
            return Err(Error::TooLarge {
                what: "rows of a per-token FP8 call",
                value: rows,
            });
        }
        params.scheme = FP8_PER_TOKEN;
        params.min_scale = min_scale;
        params.scale_ub = scale_ub.unwrap_or(f32::INFINITY);
        params.threads_per_row = threads_per_row as u32;
        params.rows_per_block = rows_per_block as u32;
        params.chunks = chunks.max(1) as u32;
        params.row_blocks = row_blocks as u32;
        // Blocks holding their whole tile of 16-byte accesses ask L2 for the same tile of the
        // row that starts about when they end (the kernel's bulk prefetch needs 16-byte
        // ranges; a row walked twice reads its second walk from L2), where it was measured
        // faster: the row kernel from two waves on (within two, inputs often still in L2 from
        // the previous launch, it cost more than it saved); the long-row kernel's 16-bit rows
        // (f32 rows have half the math per byte to hide the next row behind); the split
        // kernel beyond one wave.
        let resident_rows = limits.resident_blocks(kernel) as u64 * rows_per_block / row_blocks;
        let whole = per_thread <= row_blocks * params.chunks as u64;
        let prefetch = match kernel {
            KernelId::GatedFp8Row(..) | KernelId::GatedFp8Rows(_, 1) => {
                rows as u64 > 2 * resident_rows
            }
            // Two accesses per thread: 1.01-1.06x faster without it on an H200.
            KernelId::GatedFp8Rows(..) => false,
            KernelId::GatedFp8RowLong(..) => dtype != DType::F32 && rows as u64 > resident_rows,
            // Its next row is already on its way, into shared memory.
            KernelId::GatedFp8RowStream(..) => false,
            _ => rows as u64 > resident_rows,
        };
        if mode == VecMode::V16 && whole && prefetch {
            params.prefetch_rows = resident_rows.max(1) as u32;
        }
        return Ok(Launch {
            kernel,
            grid: blocks as u32,
            block: (threads_per_row * rows_per_block) as u32,
            shared_mem_bytes: match kernel {
                KernelId::GatedFp8RowStream(..) => GATED_FP8_STREAM_SMEM_BYTES,
                _ => GATED_FP8_ROW_SMEM_BYTES,
            },
            params,
        });
    }
    // A static scale off the 16-byte grid, 16-bit inputs: the realigned kernels, walking the
    // aligned words of `y` a row can touch (one per 16-byte vector of the inputs, at any
    // offset), counted in 32 bits as the flat walk's accesses are. Up to a quarter of the
    // threads the device holds (a word per thread; latency sets the time there), the entry
    // that issues a word's loads together and reads the scale after them; past that the one
    // of fewer instructions per word, whose loads wait in turn. f32 inputs take the scalar
    // kernel, where the realigned one lost. Both realigned entries give the same bits.
    // Measurements: `bench/TUNING.md`, "The static FP8 realigned kernel's loads at once".
    let words = (cols as u64).div_ceil(dtype.lanes_per_16b() as u64) + 1;
    let total_words = (rows as u64).saturating_mul(words);
    let realigned = (mode == VecMode::Scalar
        && scaling == Fp8Scaling::Static
        && dtype.size_bytes() == 2
        && total_words < (1u64 << 32) - 1024)
        .then(|| {
            let ends_first = KernelId::GatedFp8FlatRealignedEndsFirst(dtype);
            if total_words <= resident_threads(ends_first, limits) / 4 {
                ends_first
            } else {
                KernelId::GatedFp8FlatRealigned(dtype)
            }
        });
    if let Some(kernel) = realigned {
        // Rows of no columns store nothing: no launch.
        let total = if cols == 0 { 0 } else { rows as u64 * words };
        let resident = resident_threads(kernel, limits);
        // One word per thread and step: the resident threads between one and four waves of
        // them, else a thread per word (as the realigned forward).
        let threads = if total > resident && total <= 4 * resident {
            resident
        } else {
            total.min(1 << 31)
        };
        let grid = threads.div_ceil(GATED_THREADS as u64);
        params.walk = GridWalk::new(words, grid * GATED_THREADS as u64);
        return Ok(Launch {
            kernel,
            grid: grid as u32,
            block: GATED_THREADS,
            shared_mem_bytes: 0,
            params,
        });
    }
    let kernel = match scaling {
        Fp8Scaling::PerGroup { .. } => KernelId::GatedFp8Group(dtype, mode),
        _ if ends != FlatEnds::default() => KernelId::GatedFp8FlatEnds(dtype),
        _ => KernelId::GatedFp8Flat(dtype, mode),
    };
    // The walk's unit: an access, or on the per-group vector path a pair of accesses (a lane
    // holds two accesses of its group; see the kernel).
    let mut walk_per_row = per_row;
    if let Fp8Scaling::PerGroup {
        group, min_scale, ..
    } = scaling
    {
        // A group is `group / width` accesses: on the vector path 8-32, held two per lane by
        // 4-16 lanes; on the scalar path one warp of `group / 32` accesses per lane.
        let accesses = (group / width) as u64;
        params.scheme = FP8_PER_GROUP;
        params.min_scale = min_scale;
        params.group_shift = accesses.trailing_zeros();
        match mode {
            VecMode::V16 => {
                params.group_lanes = (accesses / 2) as u32;
                walk_per_row = per_row / 2;
            }
            VecMode::Scalar => {
                params.group_lanes = 32;
                params.batch = (group / 32) as u32;
            }
        }
    } else if mode == VecMode::Scalar {
        params.batch = GATED_FP8_SCALAR_BATCH as u32;
    }
    let block = GATED_THREADS as u64;
    let resident = resident_threads(kernel, limits);
    let paired = mode == VecMode::V16 && matches!(scaling, Fp8Scaling::PerGroup { .. });
    let threads = match mode {
        // Per group, a pair per thread and step: beyond two waves of the resident threads, a
        // thread per pair; below, at most the resident threads, each taking up to two.
        VecMode::V16 if paired => {
            let pairs = rows as u64 * walk_per_row;
            if pairs > 2 * resident {
                pairs
            } else {
                pairs.min(resident)
            }
        }
        // Static, two accesses per thread and step: beyond four waves of the resident
        // threads, a thread per two accesses; between one and four, the resident threads,
        // each taking up to four; below, a thread per access (a flat range's ends as in
        // `grid_for`).
        VecMode::V16 if total > 4 * resident => total.div_ceil(2).min(1 << 31),
        VecMode::V16 if total > resident => resident,
        VecMode::V16 => total + ends_warp(ends),
        // One warp per step of `32 * batch` accesses.
        VecMode::Scalar => (total.div_ceil(32 * params.batch as u64) * 32).min(resident),
    };
    let grid = threads.div_ceil(block);
    params.walk = GridWalk::new(walk_per_row, grid * block);
    Ok(Launch {
        kernel,
        grid: grid as u32,
        block: GATED_THREADS,
        shared_mem_bytes: 0,
        params,
    })
}

impl Kernels {
    /// `y_q = e4m3(act(a) * b / scale)` with split inputs: `y` FP8, `scales` read (for
    /// [`Fp8Scaling::Static`], `[1, 1]`) or written (per token `[rows, 1]`, per group
    /// `[rows, cols / group]` row-major or `[cols / group, rows]` column-major); see
    /// [`crate::fp8`].
    #[allow(clippy::too_many_arguments)]
    pub fn gated_fp8<T: Element>(
        &self,
        stream: &CudaStream,
        act: Activation,
        a: &Mat<T>,
        b: &Mat<T>,
        y: &mut MatMut<F8E4M3>,
        scaling: Fp8Scaling,
        scales: Fp8Scales<'_, '_>,
    ) -> Result<()> {
        self.check_views(
            stream,
            &[("a", a.stream()), ("b", b.stream()), ("y", y.stream())],
        )?;
        let (a, _ga) = a.desc(stream);
        let (b, _gb) = b.desc(stream);
        self.gated_fp8_views(stream, act, &a, &b, y, scaling, scales)
    }

    /// [`Kernels::gated_fp8`] for an interleaved `[gate | up]` input of width `2I`.
    pub fn gated_interleaved_fp8<T: Element>(
        &self,
        stream: &CudaStream,
        act: Activation,
        x: &Mat<T>,
        y: &mut MatMut<F8E4M3>,
        scaling: Fp8Scaling,
        scales: Fp8Scales<'_, '_>,
    ) -> Result<()> {
        self.check_views(stream, &[("x", x.stream()), ("y", y.stream())])?;
        let (x, _gx) = x.desc(stream);
        let (gate, up) = x.interleaved_halves()?;
        self.gated_fp8_views(stream, act, &gate, &up, y, scaling, scales)
    }

    /// The common tail of the safe FP8 forms: the scale tensor's view, the plan, the launch.
    #[allow(clippy::too_many_arguments)]
    fn gated_fp8_views(
        &self,
        stream: &CudaStream,
        act: Activation,
        a: &MatDesc,
        b: &MatDesc,
        y: &mut MatMut<F8E4M3>,
        scaling: Fp8Scaling,
        scales: Fp8Scales<'_, '_>,
    ) -> Result<()> {
        let (y, _gy) = y.desc_mut(stream);
        let (scales, _gs) = scales.describe(stream, &scaling)?;
        let limits = self.gated_fp8_limits();
        let plan = plan_gated_forward_fp8(act, a, b, &y, scaling, &scales, &limits)?;
        // SAFETY: planned from live views borrowed for this call (y and the written scales
        // mutably, so they alias no input); the plan checked shapes, sizes, alignment and
        // every overlap.
        unsafe { self.launch(stream, &plan) }
    }

    /// [`Kernels::gated_fp8`] on raw device matrices (`y` of dtype `F8E4M3`, `scales` f32);
    /// use [`MatDesc::interleaved_halves`] for the interleaved layout.
    ///
    /// # Safety
    /// As for [`Kernels::gated_raw`]; `scales` is read (static) or written (dynamic).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gated_fp8_raw(
        &self,
        stream: &CudaStream,
        act: Activation,
        a: &MatDesc,
        b: &MatDesc,
        y: &MatDesc,
        scaling: Fp8Scaling,
        scales: &MatDesc,
    ) -> Result<()> {
        self.check_stream(stream)?;
        let limits = self.gated_fp8_limits();
        let plan = plan_gated_forward_fp8(act, a, b, y, scaling, scales, &limits)?;
        // SAFETY: the caller vouches for the descriptions; the plan checked the rest.
        unsafe { self.launch(stream, &plan) }
    }
}
