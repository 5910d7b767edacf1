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
//! `g, g + G, g + 2G, ...` (consecutive threads, consecutive addresses: coalesced), in batches
//! of [`GATED_UNROLL`]: all loads of a batch are issued before its first use, so several are in
//! flight per thread. Any grid size is correct; the host sizes it to the device (one access per
//! thread for small tensors, a resident grid that loops for large ones). Row and column are
//! advanced incrementally, one division per thread.
//!
//! # Aliasing
//! Each element is read and written by the same thread, and all of a thread's loads for one
//! step precede its stores, so an output that exactly equals an input (in place) is safe.
//!
//! # Dtype contract
//! Loads widen to f32, all math is f32 (`ferrofuse_common::act`), the store rounds to nearest
//! even in the storage dtype.

use ferrofuse_common::act::{GatedAct, GeluErf, GeluTanh, Relu, Silu};
use ferrofuse_common::{Activation, GATED_UNROLL, GatedBwdParams, GatedFwdParams};

use core::num::NonZeroU64;

use crate::mem::{Bf16, Elem, F16, F32, grid, grid_dependency_sync, ld_v4, st_v4};

/// How one access moves `WIDTH` elements between memory and f32 lanes.
trait Access {
    const WIDTH: u64;
    const BYTES: u64;
    unsafe fn load(p: u64) -> [f32; 8];
    unsafe fn store(p: u64, v: &[f32; 8]);
}

/// 16-byte vector accesses.
struct V16<E>(E);
/// One element per access.
struct Scalar<E>(E);

impl<E: Elem> Access for V16<E> {
    const WIDTH: u64 = E::LANES as u64;
    const BYTES: u64 = E::BYTES;
    #[inline(always)]
    unsafe fn load(p: u64) -> [f32; 8] {
        E::unpack(unsafe { ld_v4(p) })
    }
    #[inline(always)]
    unsafe fn store(p: u64, v: &[f32; 8]) {
        unsafe { st_v4(p, E::pack(v)) }
    }
}

impl<E: Elem> Access for Scalar<E> {
    const WIDTH: u64 = 1;
    const BYTES: u64 = E::BYTES;
    #[inline(always)]
    unsafe fn load(p: u64) -> [f32; 8] {
        let mut v = [0.0; 8];
        v[0] = unsafe { E::load(p) };
        v
    }
    #[inline(always)]
    unsafe fn store(p: u64, v: &[f32; 8]) {
        unsafe { E::store(p, v[0]) }
    }
}

const UNROLL: usize = GATED_UNROLL;
const _: () = assert!(UNROLL == 4, "`unroll!` expands exactly GATED_UNROLL copies");

/// Repeats `$body` for `$k` = 0..4 with `$k` a literal after inlining, so the per-access
/// arrays indexed by it stay in registers (a `for` loop here was not fully unrolled and the
/// arrays went to local memory).
macro_rules! unroll {
    ($k:ident => $body:block) => {{
        {
            let $k: usize = 0;
            $body
        }
        {
            let $k: usize = 1;
            $body
        }
        {
            let $k: usize = 2;
            $body
        }
        {
            let $k: usize = 3;
            $body
        }
    }};
}

/// Repeats `$body` for each lane `$l < $width` (at most 8), unrolled for the same reason: the
/// backward's lane loop was not unrolled by LLVM and its arrays spilled to local memory.
macro_rules! lanes {
    ($l:ident < $width:expr => $body:block) => {{
        { let $l: usize = 0; if $l < $width $body }
        { let $l: usize = 1; if $l < $width $body }
        { let $l: usize = 2; if $l < $width $body }
        { let $l: usize = 3; if $l < $width $body }
        { let $l: usize = 4; if $l < $width $body }
        { let $l: usize = 5; if $l < $width $body }
        { let $l: usize = 6; if $l < $width $body }
        { let $l: usize = 7; if $l < $width $body }
    }};
}

/// Byte address of access `(row, col)` (`col` counted in accesses) of a matrix at `base`.
#[inline(always)]
fn addr<X: Access>(base: u64, stride: u64, at: Cursor) -> u64 {
    base + (at.row * stride + at.col * X::WIDTH) * X::BYTES
}

/// Row and column (in accesses) of one access.
#[derive(Clone, Copy)]
struct Cursor {
    row: u64,
    col: u64,
}

/// Walks access indices `g, g + G, g + 2G, ...` (G = all threads of the grid) as cursors,
/// with one division per thread instead of one per access.
struct Walk {
    per_row: NonZeroU64,
    step_rows: u64,
    step_cols: u64,
}

impl Walk {
    #[inline(always)]
    fn new(per_row: NonZeroU64, step: u64) -> Self {
        let step_rows = step / per_row;
        Self {
            per_row,
            step_rows,
            step_cols: step - step_rows * per_row.get(),
        }
    }

    #[inline(always)]
    fn at(&self, i: u64) -> Cursor {
        let row = i / self.per_row;
        Cursor {
            row,
            col: i - row * self.per_row.get(),
        }
    }

    #[inline(always)]
    fn advance(&self, c: Cursor) -> Cursor {
        let (mut row, mut col) = (c.row + self.step_rows, c.col + self.step_cols);
        if col >= self.per_row.get() {
            col -= self.per_row.get();
            row += 1;
        }
        Cursor { row, col }
    }
}

/// This thread's first access index, the grid-wide step, and the walk over `rows x cols`
/// elements in accesses of `X::WIDTH`; `None` when the matrix is empty.
#[inline(always)]
fn start<X: Access>(rows: u64, cols: u64) -> Option<(u64, u64, u64, Walk)> {
    let per_row = NonZeroU64::new(cols / X::WIDTH)?;
    let total = rows * per_row.get();
    let step = grid::grid_dim_x() * grid::block_dim_x();
    let first = grid::block_x() * grid::block_dim_x() + grid::thread_x();
    Some((first, step, total, Walk::new(per_row, step)))
}

#[inline(always)]
unsafe fn fwd<X: Access, A: GatedAct>(p: &GatedFwdParams) {
    grid_dependency_sync();
    let Some((mut i, step, total, walk)) = start::<X>(p.rows, p.cols) else {
        return;
    };
    let mut cur = walk.at(i);
    while i < total {
        let mut at = [cur; UNROLL];
        let mut live = [false; UNROLL];
        let mut a = [[0.0f32; 8]; UNROLL];
        let mut b = [[0.0f32; 8]; UNROLL];
        unroll!(k => {
            at[k] = cur;
            live[k] = i + k as u64 * step < total;
            cur = walk.advance(cur);
        });
        // All loads of the batch are issued before any store: in place over b is safe.
        unroll!(k => {
            if live[k] {
                // SAFETY: the access is inside both matrices (index < total); the host checked
                // the allocations cover rows x cols at these strides and the alignment of X.
                unsafe {
                    a[k] = X::load(addr::<X>(p.a, p.a_stride, at[k]));
                    b[k] = X::load(addr::<X>(p.b, p.b_stride, at[k]));
                }
            }
        });
        unroll!(k => {
            if live[k] {
                let mut y = [0.0f32; 8];
                lanes!(l < X::WIDTH as usize => {
                    y[l] = A::value(a[k][l]) * b[k][l];
                });
                // SAFETY: as for the loads; y may equal b, whose element was loaded above.
                unsafe { X::store(addr::<X>(p.y, p.y_stride, at[k]), &y) };
            }
        });
        i += UNROLL as u64 * step;
    }
}

#[inline(always)]
unsafe fn bwd<X: Access, A: GatedAct>(p: &GatedBwdParams) {
    grid_dependency_sync();
    let Some((mut i, step, total, walk)) = start::<X>(p.rows, p.cols) else {
        return;
    };
    let mut cur = walk.at(i);
    while i < total {
        let mut at = [cur; UNROLL];
        let mut live = [false; UNROLL];
        let mut a = [[0.0f32; 8]; UNROLL];
        let mut b = [[0.0f32; 8]; UNROLL];
        let mut dy = [[0.0f32; 8]; UNROLL];
        unroll!(k => {
            at[k] = cur;
            live[k] = i + k as u64 * step < total;
            cur = walk.advance(cur);
        });
        unroll!(k => {
            if live[k] {
                // SAFETY: as in `fwd`.
                unsafe {
                    a[k] = X::load(addr::<X>(p.a, p.a_stride, at[k]));
                    b[k] = X::load(addr::<X>(p.b, p.b_stride, at[k]));
                    dy[k] = X::load(addr::<X>(p.dy, p.dy_stride, at[k]));
                }
            }
        });
        unroll!(k => {
            if live[k] {
                let mut da = [0.0f32; 8];
                let mut db = [0.0f32; 8];
                lanes!(l < X::WIDTH as usize => {
                    let (f, df) = A::value_and_grad(a[k][l]);
                    da[l] = dy[k][l] * b[k][l] * df;
                    db[l] = dy[k][l] * f;
                });
                // SAFETY: as in `fwd`; da/db may equal a/b/dy, all loaded above.
                unsafe {
                    X::store(addr::<X>(p.da, p.da_stride, at[k]), &da);
                    X::store(addr::<X>(p.db, p.db_stride, at[k]), &db);
                }
            }
        });
        i += UNROLL as u64 * step;
    }
}

/// Dispatches on the activation once per launch (a uniform branch), then runs a body
/// monomorphized for it.
macro_rules! dispatch_act {
    ($body:ident, $x:ty, $p:expr) => {
        match Activation::from_u32($p.act) {
            Some(Activation::Silu) => $body::<$x, Silu>($p),
            Some(Activation::GeluErf) => $body::<$x, GeluErf>($p),
            Some(Activation::GeluTanh) => $body::<$x, GeluTanh>($p),
            Some(Activation::Relu) => $body::<$x, Relu>($p),
            // The host only passes valid activations.
            None => {}
        }
    };
}

macro_rules! entries {
    ($($fwd:ident, $bwd:ident: $x:ty;)*) => {$(
        /// Gated forward; see the module docs. Launch: `GATED_THREADS` threads, any grid (see the module docs).
        ///
        /// # Safety
        /// The host launcher's checks: valid, aligned, in-bounds tensors; allowed aliasing only.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $fwd(p: GatedFwdParams) {
            unsafe { dispatch_act!(fwd, $x, &p) }
        }

        /// Gated backward; see the module docs. Launch: `GATED_THREADS` threads, any grid (see the module docs).
        ///
        /// # Safety
        /// As for the forward entry.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $bwd(p: GatedBwdParams) {
            unsafe { dispatch_act!(bwd, $x, &p) }
        }
    )*};
}

// Names must match `ferrofuse_common::KernelId::name` (checked against the PTX at build time).
entries! {
    gated_fwd_f32_v16, gated_bwd_f32_v16: V16<F32>;
    gated_fwd_f32_scalar, gated_bwd_f32_scalar: Scalar<F32>;
    gated_fwd_f16_v16, gated_bwd_f16_v16: V16<F16>;
    gated_fwd_f16_scalar, gated_bwd_f16_scalar: Scalar<F16>;
    gated_fwd_bf16_v16, gated_bwd_bf16_v16: V16<Bf16>;
    gated_fwd_bf16_scalar, gated_bwd_bf16_scalar: Scalar<Bf16>;
}
