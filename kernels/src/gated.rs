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
//! `i` is row `i / (cols / W)`. A block of [`GATED_THREADS`] threads takes
//! `GATED_THREADS * GATED_UNROLL` consecutive accesses (thread `t` takes `t`, `t + threads`, ...,
//! coalesced), issues all its loads, then computes and stores; blocks stride over the whole
//! range, so any grid size is correct. No tile straddles a row in a way that needs masking
//! other than `i < total`.
//!
//! # Aliasing
//! Each element is read and written by the same thread, and all of a thread's loads for one
//! step precede its stores, so an output that exactly equals an input (in place) is safe.
//!
//! # Dtype contract
//! Loads widen to f32, all math is f32 (`ferrofuse_common::act`), the store rounds to nearest
//! even in the storage dtype.

use ferrofuse_common::act::{GatedAct, GeluErf, GeluTanh, Relu, Silu};
use ferrofuse_common::{Activation, GATED_THREADS, GATED_UNROLL, GatedBwdParams, GatedFwdParams};

use crate::mem::{Bf16, Elem, F16, F32, grid, ld_v4, st_v4};

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

/// Byte address of access `(row, col)` of a matrix at `base` with row stride `stride`.
#[inline(always)]
fn addr<X: Access>(base: u64, stride: u64, row: u64, col: u64) -> u64 {
    base + (row * stride + col) * X::BYTES
}

/// Splits access index `i` into (row, first column), with `per_row` accesses in a row.
#[inline(always)]
fn row_col<X: Access>(i: u64, per_row: core::num::NonZeroU64) -> (u64, u64) {
    let row = i / per_row;
    (row, (i - row * per_row.get()) * X::WIDTH)
}

#[inline(always)]
unsafe fn fwd<X: Access, A: GatedAct>(p: &GatedFwdParams) {
    let Some(per_row) = core::num::NonZeroU64::new(p.cols / X::WIDTH) else {
        return;
    };
    let total = p.rows * per_row.get();
    let threads = grid::block_dim_x();
    let step = grid::grid_dim_x() * threads * UNROLL as u64;
    let mut base = grid::block_x() * threads * UNROLL as u64 + grid::thread_x();
    while base < total {
        let mut a = [[0.0f32; 8]; UNROLL];
        let mut b = [[0.0f32; 8]; UNROLL];
        unroll!(k => {
            let i = base + k as u64 * threads;
            if i < total {
                let (r, c) = row_col::<X>(i, per_row);
                // SAFETY: i < total, so (r, c) is inside both matrices; the host checked the
                // allocations cover rows x cols at these strides and the alignment of X.
                unsafe {
                    a[k] = X::load(addr::<X>(p.a, p.a_stride, r, c));
                    b[k] = X::load(addr::<X>(p.b, p.b_stride, r, c));
                }
            }
        });
        unroll!(k => {
            let i = base + k as u64 * threads;
            if i < total {
                let (r, c) = row_col::<X>(i, per_row);
                let mut y = [0.0f32; 8];
                lanes!(l < X::WIDTH as usize => {
                    y[l] = A::value(a[k][l]) * b[k][l];
                });
                // SAFETY: as for the loads; y may equal b, whose element was loaded above.
                unsafe { X::store(addr::<X>(p.y, p.y_stride, r, c), &y) };
            }
        });
        base += step;
    }
}

#[inline(always)]
unsafe fn bwd<X: Access, A: GatedAct>(p: &GatedBwdParams) {
    let Some(per_row) = core::num::NonZeroU64::new(p.cols / X::WIDTH) else {
        return;
    };
    let total = p.rows * per_row.get();
    let threads = grid::block_dim_x();
    let step = grid::grid_dim_x() * threads * UNROLL as u64;
    let mut base = grid::block_x() * threads * UNROLL as u64 + grid::thread_x();
    while base < total {
        let mut a = [[0.0f32; 8]; UNROLL];
        let mut b = [[0.0f32; 8]; UNROLL];
        let mut dy = [[0.0f32; 8]; UNROLL];
        unroll!(k => {
            let i = base + k as u64 * threads;
            if i < total {
                let (r, c) = row_col::<X>(i, per_row);
                // SAFETY: as in `fwd`.
                unsafe {
                    a[k] = X::load(addr::<X>(p.a, p.a_stride, r, c));
                    b[k] = X::load(addr::<X>(p.b, p.b_stride, r, c));
                    dy[k] = X::load(addr::<X>(p.dy, p.dy_stride, r, c));
                }
            }
        });
        unroll!(k => {
            let i = base + k as u64 * threads;
            if i < total {
                let (r, c) = row_col::<X>(i, per_row);
                let mut da = [0.0f32; 8];
                let mut db = [0.0f32; 8];
                lanes!(l < X::WIDTH as usize => {
                    let (f, df) = A::value_and_grad(a[k][l]);
                    da[l] = dy[k][l] * b[k][l] * df;
                    db[l] = dy[k][l] * f;
                });
                // SAFETY: as in `fwd`; da/db may equal a/b/dy, all loaded above.
                unsafe {
                    X::store(addr::<X>(p.da, p.da_stride, r, c), &da);
                    X::store(addr::<X>(p.db, p.db_stride, r, c), &db);
                }
            }
        });
        base += step;
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
        /// Gated forward; see the module docs. Launch: `GATED_THREADS` threads, any grid.
        ///
        /// # Safety
        /// The host launcher's checks: valid, aligned, in-bounds tensors; allowed aliasing only.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $fwd(p: GatedFwdParams) {
            unsafe { dispatch_act!(fwd, $x, &p) }
        }

        /// Gated backward; see the module docs. Launch: `GATED_THREADS` threads, any grid.
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

const _: () = assert!(GATED_THREADS % 32 == 0);
