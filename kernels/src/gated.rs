//! Gated activations: `y = act(a) * b` (forward) and its gradient (backward).
//!
//! # Parameters
//! [`GatedFwdParams`] / [`GatedBwdParams`]: every operand is a `[rows, cols]` matrix with its
//! own row stride (elements) and unit column stride. The interleaved `[gate | up]` layout
//! reaches the kernel as two such matrices over one buffer (see the params docs).
//!
//! # Thread mapping
//! The `rows x cols` elements are cut into accesses of `W` elements (`W` = 16 bytes of the
//! dtype on the `v16` entries, 1 on the `scalar` entries) and numbered row-major, so access
//! `i` is row `i / (cols / W)`. With `G` threads in the grid, thread `g` takes accesses
//! `g, g + G, g + 2G, ...` (consecutive threads, consecutive addresses: coalesced). `G` must
//! be the grid the host planned (`host/src/gated.rs::grid_for`): the kernel counts accesses by
//! the launched thread count but moves its row/column cursor by the walk's step, which the
//! host computed for that `G`; another grid would desynchronise the two. On the vector path
//! usually one access per thread, so a thread holds one 16-byte vector per operand, fits in
//! 32 registers (the budget `cargo xtask ptx` checks), and a full multiprocessor keeps 2048
//! threads' loads in flight. The scalar path takes [`GATED_SCALAR_BATCH`] accesses per thread
//! at a time, all their loads first (predicated), to keep as many bytes in flight. The row and
//! column of the first access come from a host-precomputed multiply-high, later ones by adding
//! the grid step: no division in the kernel ([`GridWalk`]).
//!
//! # Programmatic dependent launch (sm_90)
//! Every entry starts with `grid_dependency_sync` (wait for the previous grid in the stream,
//! then let the next one launch); see `mem.rs`.
//!
//! # Aliasing
//! Each element is read and written by the same thread, and all of a thread's loads for one
//! step precede its stores, so an output that exactly equals an input (in place) is safe.
//!
//! # Dtype contract
//! Loads widen to f32, all math is f32 (`ferrofuse_common::act`), the store rounds to nearest
//! even in the storage dtype.

use ferrofuse_common::act::{GatedAct, GeluErf, GeluTanh, Relu, Silu};
use ferrofuse_common::{Activation, GATED_SCALAR_BATCH, GatedBwdParams, GatedFwdParams, GridWalk};

use crate::mem::{Bf16, Elem, F16, F32, VecMode, access_width, grid, grid_dependency_sync};

/// Byte address of access `(row, col)` (`col` counted in accesses) of a matrix at `base`.
#[inline(always)]
fn addr<E: Elem, const M: VecMode>(base: u64, stride: u64, at: Cursor) -> u64 {
    base + (at.row * stride + at.col * const { access_width::<E, M>() }) * E::BYTES
}

/// Row and column (in accesses) of one access.
#[derive(Clone, Copy)]
struct Cursor {
    row: u64,
    col: u64,
}

/// Advances a cursor by the grid's step (precomputed on the host: no division here).
#[inline(always)]
fn advance(w: &GridWalk, c: Cursor) -> Cursor {
    let (mut row, mut col) = (c.row + w.step_rows, c.col + w.step_cols);
    if col >= w.per_row {
        col -= w.per_row;
        row += 1;
    }
    Cursor { row, col }
}

/// This thread's first access index, the grid-wide step and the total number of accesses.
#[inline(always)]
fn start(rows: u64, w: &GridWalk) -> (u64, u64, u64) {
    let step = grid::grid_dim_x() * grid::block_dim_x();
    let first = grid::block_x() * grid::block_dim_x() + grid::thread_x();
    (first, step, rows * w.per_row)
}

/// The cursor of access `i` (< 2^32: the first access of a thread).
#[inline(always)]
fn cursor(w: &GridWalk, i: u64) -> Cursor {
    let row = w.row_of(i);
    Cursor {
        row,
        col: i - row * w.per_row,
    }
}

/// See [`GATED_SCALAR_BATCH`].
const SCALAR_BATCH: usize = GATED_SCALAR_BATCH;

/// The cursors and in-range flags of a thread's next [`SCALAR_BATCH`] accesses, from access
/// `i` at `at`; advances `at` past them.
#[inline(always)]
fn batch(
    w: &GridWalk,
    i: u64,
    step: u64,
    total: u64,
    at: &mut Cursor,
) -> ([Cursor; SCALAR_BATCH], [bool; SCALAR_BATCH]) {
    let mut ats = [*at; SCALAR_BATCH];
    let mut ok = [false; SCALAR_BATCH];
    unroll!(k < SCALAR_BATCH => {
        ats[k] = *at;
        ok[k] = i + k as u64 * step < total;
        *at = advance(w, *at);
    });
    (ats, ok)
}

#[inline(always)]
unsafe fn fwd<E: Elem, const M: VecMode, A: GatedAct>(p: &GatedFwdParams) {
    if M == VecMode::Scalar {
        // SAFETY: the caller's contract.
        return unsafe { fwd_scalar::<E, A>(p) };
    }
    grid_dependency_sync();
    let walk = &p.walk;
    let (mut i, step, total) = start(p.rows, walk);
    let mut at = cursor(walk, i);
    while i < total {
        // SAFETY: the access is inside every matrix: i < total, and `at` is access i's row and
        // column because the walk was built for this grid; the host checked that the
        // allocations cover rows x cols at these strides and the alignment of M. Both loads
        // precede the store, so y may be exactly b.
        let (a, b) = unsafe {
            let a = E::load_access::<M>(addr::<E, M>(p.a, p.a_stride, at));
            (a, E::load_access::<M>(addr::<E, M>(p.b, p.b_stride, at)))
        };
        let (a, b) = (E::widen_access::<M>(a), E::widen_access::<M>(b));
        let mut y = [0.0f32; 8];
        unroll!(l < const { access_width::<E, M>() } as usize => {
            y[l] = A::value(a[l]) * b[l];
        });
        // SAFETY: as above.
        unsafe { E::store_access::<M>(addr::<E, M>(p.y, p.y_stride, at), &y) };
        at = advance(walk, at);
        i += step;
    }
}

/// [`fwd`] one element per access, [`SCALAR_BATCH`] accesses per thread at a time: all their
/// loads first (predicated, back to back), then the math and the stores.
#[inline(always)]
unsafe fn fwd_scalar<E: Elem, A: GatedAct>(p: &GatedFwdParams) {
    const S: VecMode = VecMode::Scalar;
    grid_dependency_sync();
    let walk = &p.walk;
    let (mut i, step, total) = start(p.rows, walk);
    let mut at = cursor(walk, i);
    while i < total {
        let (ats, ok) = batch(walk, i, step, total, &mut at);
        let mut a = [0u32; SCALAR_BATCH];
        let mut b = [0u32; SCALAR_BATCH];
        // SAFETY: where `ok[k]`, access i + k * step is inside every matrix (as in `fwd`);
        // the others are predicated off. Every load of the batch precedes every store, so y
        // may be exactly b.
        unroll!(k < SCALAR_BATCH => {
            a[k] = unsafe { E::load_bits_if(addr::<E, S>(p.a, p.a_stride, ats[k]), ok[k]) };
            b[k] = unsafe { E::load_bits_if(addr::<E, S>(p.b, p.b_stride, ats[k]), ok[k]) };
        });
        unroll!(k < SCALAR_BATCH => {
            let y = A::value(E::widen(a[k])) * E::widen(b[k]);
            // SAFETY: as above.
            unsafe { E::store_if(addr::<E, S>(p.y, p.y_stride, ats[k]), y, ok[k]) };
        });
        i += SCALAR_BATCH as u64 * step;
    }
}

#[inline(always)]
unsafe fn bwd<E: Elem, const M: VecMode, A: GatedAct>(p: &GatedBwdParams) {
    if M == VecMode::Scalar {
        // SAFETY: the caller's contract.
        return unsafe { bwd_scalar::<E, A>(p) };
    }
    grid_dependency_sync();
    let walk = &p.walk;
    let (mut i, step, total) = start(p.rows, walk);
    let mut at = cursor(walk, i);
    while i < total {
        // SAFETY: as in `fwd`; all three loads precede both stores, so da/db may be exactly
        // a/b/dy.
        let (a, b, dy) = unsafe {
            let a = E::load_access::<M>(addr::<E, M>(p.a, p.a_stride, at));
            let b = E::load_access::<M>(addr::<E, M>(p.b, p.b_stride, at));
            (
                a,
                b,
                E::load_access::<M>(addr::<E, M>(p.dy, p.dy_stride, at)),
            )
        };
        let (a, b, dy) = (
            E::widen_access::<M>(a),
            E::widen_access::<M>(b),
            E::widen_access::<M>(dy),
        );
        let mut da = [0.0f32; 8];
        let mut db = [0.0f32; 8];
        unroll!(l < const { access_width::<E, M>() } as usize => {
            let (f, df) = A::value_and_grad(a[l]);
            da[l] = dy[l] * b[l] * df;
            db[l] = dy[l] * f;
        });
        // SAFETY: as above.
        unsafe {
            E::store_access::<M>(addr::<E, M>(p.da, p.da_stride, at), &da);
            E::store_access::<M>(addr::<E, M>(p.db, p.db_stride, at), &db);
        }
        at = advance(walk, at);
        i += step;
    }
}

/// [`bwd`] with the batching of [`fwd_scalar`].
#[inline(always)]
unsafe fn bwd_scalar<E: Elem, A: GatedAct>(p: &GatedBwdParams) {
    const S: VecMode = VecMode::Scalar;
    grid_dependency_sync();
    let walk = &p.walk;
    let (mut i, step, total) = start(p.rows, walk);
    let mut at = cursor(walk, i);
    while i < total {
        let (ats, ok) = batch(walk, i, step, total, &mut at);
        let mut a = [0u32; SCALAR_BATCH];
        let mut b = [0u32; SCALAR_BATCH];
        let mut dy = [0u32; SCALAR_BATCH];
        // SAFETY: as in `fwd_scalar`; all loads of the batch precede its stores, so da/db may
        // be exactly a/b/dy.
        unroll!(k < SCALAR_BATCH => {
            a[k] = unsafe { E::load_bits_if(addr::<E, S>(p.a, p.a_stride, ats[k]), ok[k]) };
            b[k] = unsafe { E::load_bits_if(addr::<E, S>(p.b, p.b_stride, ats[k]), ok[k]) };
            dy[k] = unsafe { E::load_bits_if(addr::<E, S>(p.dy, p.dy_stride, ats[k]), ok[k]) };
        });
        unroll!(k < SCALAR_BATCH => {
            let (a, b, dy) = (E::widen(a[k]), E::widen(b[k]), E::widen(dy[k]));
            let (f, df) = A::value_and_grad(a);
            // SAFETY: as above.
            unsafe {
                E::store_if(addr::<E, S>(p.da, p.da_stride, ats[k]), dy * b * df, ok[k]);
                E::store_if(addr::<E, S>(p.db, p.db_stride, ats[k]), dy * f, ok[k]);
            }
        });
        i += SCALAR_BATCH as u64 * step;
    }
}

/// Dispatches on the activation once per launch (a uniform branch), then runs a body
/// monomorphized for it.
macro_rules! dispatch_act {
    ($body:ident, $e:ty, $m:path, $p:expr) => {
        match Activation::from_u32($p.act) {
            Some(Activation::Silu) => $body::<$e, { $m }, Silu>($p),
            Some(Activation::GeluErf) => $body::<$e, { $m }, GeluErf>($p),
            Some(Activation::GeluTanh) => $body::<$e, { $m }, GeluTanh>($p),
            Some(Activation::Relu) => $body::<$e, { $m }, Relu>($p),
            // The host only passes valid activations.
            None => {}
        }
    };
}

macro_rules! entries {
    ($($fwd:ident, $bwd:ident: $e:ty, $m:path;)*) => {$(
        /// Gated forward; see the module docs. Launch: `GATED_THREADS` threads, the planned grid.
        ///
        /// # Safety
        /// The host launcher's checks: valid, aligned, in-bounds tensors; allowed aliasing only.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $fwd(p: GatedFwdParams) {
            unsafe { dispatch_act!(fwd, $e, $m, &p) }
        }

        /// Gated backward; see the module docs. Launch: `GATED_THREADS` threads, the planned grid.
        ///
        /// # Safety
        /// As for the forward entry.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $bwd(p: GatedBwdParams) {
            unsafe { dispatch_act!(bwd, $e, $m, &p) }
        }
    )*};
}

// Names must match `ferrofuse_common::KernelId::name` (checked when `cargo xtask ptx` builds).
entries! {
    gated_fwd_f32_v16, gated_bwd_f32_v16: F32, VecMode::V16;
    gated_fwd_f32_scalar, gated_bwd_f32_scalar: F32, VecMode::Scalar;
    gated_fwd_f16_v16, gated_bwd_f16_v16: F16, VecMode::V16;
    gated_fwd_f16_scalar, gated_bwd_f16_scalar: F16, VecMode::Scalar;
    gated_fwd_bf16_v16, gated_bwd_bf16_v16: Bf16, VecMode::V16;
    gated_fwd_bf16_scalar, gated_bwd_bf16_scalar: Bf16, VecMode::Scalar;
}
