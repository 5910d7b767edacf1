//! Fused residual-add + RMSNorm, forward and backward, batch-invariant.
//!
//! # Parameters
//! [`RmsNormFwdParams`], [`RmsNormBwdParams`], [`RmsNormDwParams`] (their docs give the
//! formulas, layouts and aliasing contracts). Every matrix is `[rows, hidden]` with its own
//! row stride and unit column stride; `w` is one row; `rstd` is f32, one per row.
//!
//! # Thread mapping
//! A row is cut into 16-byte chunks of `L` elements (`L` = 4 for f32, 8 for f16/bf16; the
//! last one partial when `L` does not divide `hidden`). A row gets `T = threads_per_row`
//! threads (a multiple of 32); thread `t` owns chunks `t, t + T, t + 2T, ...` (`K` of them
//! per tile: `K * L` = 16 or 32 elements). Rows of fewer than 256 threads sit side by side in
//! one block (`rows_per_block` of them). `T`, `K` and `rows_per_block` depend only on `hidden`
//! and the dtype (`ferrofuse_common::rmsnorm_fwd_geometry`).
//!
//! # Determinism and batch invariance
//! A row's reduction has one fixed shape: each thread accumulates `h*h` with `fma` over its
//! chunks in order (chunk, then lane), then `reduce::row_sum` combines the threads (warp
//! butterfly, then the per-warp values through shared memory, butterfly again); a looped row
//! does so per tile and adds the tiles' sums in tile order (`split`). Nothing
//! in that order depends on the number of rows, on the block the row lands in, or on timing.
//! The `v16` and `scalar` kernels of one variant run the same arithmetic in the same order
//! and differ only in how they touch memory (one 16-byte access vs. `L` masked scalar ones,
//! and where that forces a different load schedule), so they produce the same bits; the
//! f32 arithmetic is all `.rn` (no contraction by ptxas) and the f32 -> storage conversions
//! round to nearest even on both paths.
//!
//! # Registers and the looped path
//! Up to 16384 elements the row stays in registers (`e16`: 16 per thread up to 8192, `e32`:
//! 32 up to 16384) and memory is touched once: read x, residual, w; write h, y. Beyond that
//! (`loop`) 512 threads walk the row in tiles of 8192 twice: the first pass stores `h` and
//! accumulates the sum of squares, the second re-reads the `h` it stored (or `x` when there
//! is no residual) to normalise. Each thread re-reads only chunks it wrote itself, so its own
//! program order makes them visible. In the f32 numerics mode the looped path therefore
//! normalises `h` as stored (rounded to the storage dtype); the statistics still use the f32
//! sum. Recomputing `x + residual` instead would need two more reads and is impossible when
//! `h` was written over one of them. In calls of few rows the `loop_ahead` entries issue each
//! tile's loads while the tile before it is worked on (more registers, one block per
//! multiprocessor); at few rows on sm_90 a looped row can instead run on a thread-block
//! cluster, a tile or two per block (`split.rs`). All of them give the same bits.
//!
//! # Aliasing
//! A chunk is read and written by one thread only, and each thread issues a chunk's loads
//! before its stores, so the in-place forms the host allows (h over x or residual, y over x;
//! dx over dy or dres) are safe.
//!
//! # Files
//! Here, in this order: chunk access, the thread's place in its row, the forward kernels and
//! every entry. `backward.rs`: the backward kernels (rows and `dw` partials, then the
//! fixed-order `dw` sum). `split.rs`: the looped row's reduction shape and the cluster-split
//! forward. `stream.rs`: rows of 32 per thread on the vector path streamed through shared
//! memory by a persistent block (sm_90), for the storage-dtype and the FP8 outputs.

mod backward;
mod fp8;
mod realign;
mod split;
mod stream;

use core::intrinsics::fmaf32;
use core::num::NonZeroU64;

use ferrofuse_common::NormPath as Path;
use ferrofuse_common::{
    RMSNORM_GEMMA, RMSNORM_HF, RMSNORM_W_F32, RmsNormBwdParams, RmsNormDwParams, RmsNormFwdParams,
};

use crate::mem::{
    Bf16, Elem, F16, F32, div_full, grid, grid_dependency_sync, ld_v4_if, ld_v4_or, prefetch_l2,
    rsqrt_approx, st_v4_if,
};
use crate::reduce::row_sum;
use backward::{
    bwd_cluster, bwd_cluster_fused, bwd_fused, bwd_loop, bwd_loop_tiles, bwd_regs, bwd_tile_dx,
    bwd_tile_sums, dw_reduce,
};

/// Most chunks one thread holds (32 f32 elements).
const MAX_CHUNKS: usize = 8;
/// f32 slots per reduction buffer in shared memory (one per warp of a block of <= 1024).
const SLOTS_PER_BUFFER: u32 = 32;

// ---------------------------------------------------------------------------------------------
// Chunk access: a chunk is the `L` elements of one 16-byte vector; loads widen to f32,
// stores round to nearest even in the storage dtype.
// ---------------------------------------------------------------------------------------------

/// One row of a matrix, as every chunk access takes it: row `index` of the matrix at `base`,
/// whose rows are `stride` elements apart. Chunk `c` of it starts at element
/// `index * stride + c * L`.
#[derive(Clone, Copy)]
struct Row {
    base: u64,
    stride: u64,
    index: u64,
}

impl Row {
    /// Row `index` of the matrix at `base`; every chunk address folds in the row's offset.
    #[inline(always)]
    fn of(base: u64, stride: u64, index: u64) -> Self {
        Row {
            base,
            stride,
            index,
        }
    }

    /// The same row with its address computed once, here, rather than in every chunk address:
    /// with one row per block it is the same for every thread, and ptxas keeps it in uniform
    /// registers.
    #[inline(always)]
    fn hoisted<E: Elem>(base: u64, stride: u64, index: u64) -> Self {
        Row {
            base: base + index * stride * E::BYTES,
            stride: 0,
            index: 0,
        }
    }
}

/// The raw 16 bytes of chunk `c` of the row `at` on the vector path, or `fill` in each word
/// when `!ok`: [`load_chunk`] before its widening, for bodies that issue all their loads
/// first.
///
/// # Safety
/// As for [`load_chunk`] on the vector path.
#[inline(always)]
unsafe fn load_chunk_bits<E: Elem>(at: Row, c: u64, ok: bool, fill: u32) -> [u32; 4] {
    let first = at.index * at.stride + c * E::LANES as u64;
    // SAFETY: caller's contract; the v16 path is only planned for 16-byte aligned chunks.
    unsafe { ld_v4_or(at.base + first * E::BYTES, ok, fill) }
}

/// Chunk `c` of the row `at` as f32 lanes, or zeros when `!ok`; on the scalar path, lanes at
/// columns `>= hidden` are not read and stay 0. On the vector path the access is predicated,
/// not branched around: a thread's loads of one phase then issue back to back and wait
/// together (see `mem::ld_v4_if`). Callers load all the chunks of a phase before they use any
/// of them.
///
/// # Safety
/// When `ok`: `at` is a row of the matrix and `c < ceil(hidden / L)`; the host checked the
/// matrix's extent and alignment for the path.
#[inline(always)]
unsafe fn load_chunk<E: Elem, const M: Path>(at: Row, c: u64, hidden: u64, ok: bool) -> [f32; 8] {
    let lanes = E::LANES as u64;
    let first = at.index * at.stride + c * lanes;
    if M == Path::V16 {
        // SAFETY: caller's contract.
        E::unpack(unsafe { load_chunk_bits::<E>(at, c, ok, 0) })
    } else if M == Path::Realigned {
        // Rows at a 16-byte boundary only (the weight; other operands go through `realign`):
        // whole chunks as one vector, the row's ragged last chunk element by element.
        let whole = c * lanes + lanes <= hidden;
        // SAFETY: caller's contract; a whole chunk of a row starting at a 16-byte boundary.
        let mut v = E::unpack(unsafe { ld_v4_if(at.base + first * E::BYTES, ok && whole) });
        if ok && !whole {
            unroll!(l < E::LANES => {
                if c * lanes + (l as u64) < hidden {
                    // SAFETY: column c*L + l < hidden of a row inside the matrix.
                    v[l] = unsafe { E::load(at.base + (first + l as u64) * E::BYTES) };
                }
            });
        }
        v
    } else {
        // Branches, not predicated loads, on this path: they keep ptxas from hoisting every
        // element load of a thread (up to 64 for f32 rows of 32 per thread) above the first
        // use, which would take more registers than a 512-thread block allows.
        let mut v = [0.0f32; 8];
        unroll!(l < E::LANES => {
            if ok && c * lanes + (l as u64) < hidden {
                // SAFETY: column c*L + l < hidden of a row inside the matrix.
                v[l] = unsafe { E::load(at.base + (first + l as u64) * E::BYTES) };
            }
        });
        v
    }
}

/// [`load_chunk`] with every access predicated on both paths, for kernels whose thread holds
/// few enough elements to keep all its loads of a phase in flight (the split forward, a tile
/// of the looped one): on the scalar path, one predicated load per element, no branches.
///
/// # Safety
/// As for [`load_chunk`].
#[inline(always)]
unsafe fn load_chunk_if<E: Elem, const M: Path>(
    at: Row,
    c: u64,
    hidden: u64,
    ok: bool,
) -> [f32; 8] {
    if M == Path::Scalar {
        let first = at.index * at.stride + c * E::LANES as u64;
        // SAFETY: caller's contract: the elements of chunk c below `hidden` are in the row.
        unsafe { load_elems_if::<E>(at.base, first, c * E::LANES as u64, hidden, E::LANES, ok) }
    } else {
        // SAFETY: caller's contract.
        unsafe { load_chunk::<E, M>(at, c, hidden, ok) }
    }
}

/// `lanes` elements of type `T` of the array at `base` from element `first`, which is column
/// `col0`, widened to f32: each one a predicated load, taken when `ok` and its column is
/// `< hidden`, zero otherwise.
///
/// # Safety
/// When `ok`, the elements at columns `< hidden` exist.
#[inline(always)]
unsafe fn load_elems_if<T: Elem>(
    base: u64,
    first: u64,
    col0: u64,
    hidden: u64,
    lanes: usize,
    ok: bool,
) -> [f32; 8] {
    // SAFETY: caller's contract.
    let bits = unsafe { load_elem_bits_if::<T>(base, first, col0, hidden, lanes, ok) };
    let mut v = [0.0f32; 8];
    unroll!(l < lanes => { v[l] = T::widen(bits[l]); });
    v
}

/// [`load_elems_if`] before its widening: each element's bits in a word of its own, 0 where
/// not loaded.
///
/// # Safety
/// As for [`load_elems_if`].
#[inline(always)]
unsafe fn load_elem_bits_if<T: Elem>(
    base: u64,
    first: u64,
    col0: u64,
    hidden: u64,
    lanes: usize,
    ok: bool,
) -> [u32; 8] {
    // The chunk's elements inside the row (one register for all its lanes' predicates), and
    // its address (each lane's an immediate offset from it).
    let n = if ok {
        hidden.saturating_sub(col0).min(lanes as u64) as u32
    } else {
        0
    };
    let at = base + first * T::BYTES;
    let mut bits = [0u32; 8];
    unroll!(l < lanes => {
        // SAFETY: caller's contract; not accessed unless the column is inside the row.
        bits[l] = unsafe { T::load_bits_below(at + l as u64 * T::BYTES, l as u32, n) };
    });
    bits
}

/// [`load_chunk_if`] on the vector and scalar paths before its widening ([`widen_chunk`]),
/// for a loop that issues the next tile's loads before it works on this one: the loaded
/// words stay untouched until their use, so no instruction waits on them early.
///
/// # Safety
/// As for [`load_chunk`].
#[inline(always)]
unsafe fn load_chunk_bits_if<E: Elem, const M: Path>(
    at: Row,
    c: u64,
    hidden: u64,
    ok: bool,
) -> [u32; 8] {
    if M == Path::V16 {
        // SAFETY: caller's contract.
        let b = unsafe { load_chunk_bits::<E>(at, c, ok, 0) };
        [b[0], b[1], b[2], b[3], 0, 0, 0, 0]
    } else {
        let first = at.index * at.stride + c * E::LANES as u64;
        // SAFETY: caller's contract.
        unsafe { load_elem_bits_if::<E>(at.base, first, c * E::LANES as u64, hidden, E::LANES, ok) }
    }
}

/// The f32 lanes of a chunk loaded by [`load_chunk_bits_if`].
#[inline(always)]
fn widen_chunk<E: Elem, const M: Path>(bits: &[u32; 8]) -> [f32; 8] {
    if M == Path::V16 {
        E::unpack([bits[0], bits[1], bits[2], bits[3]])
    } else {
        let mut v = [0.0f32; 8];
        unroll!(l < E::LANES => { v[l] = E::widen(bits[l]); });
        v
    }
}

/// Stores chunk `c` of the row `at` when `ok` (rounding to nearest even in the storage dtype);
/// on the scalar path, lanes at columns `>= hidden` are not written.
///
/// # Safety
/// As for [`load_chunk`].
#[inline(always)]
unsafe fn store_chunk<E: Elem, const M: Path>(
    at: Row,
    c: u64,
    hidden: u64,
    ok: bool,
    v: &[f32; 8],
) {
    let lanes = E::LANES as u64;
    let first = at.index * at.stride + c * lanes;
    if M == Path::V16 {
        // SAFETY: as in `load_chunk`.
        unsafe { st_v4_if(at.base + first * E::BYTES, E::pack(v), ok) }
    } else {
        unroll!(l < E::LANES => {
            let inside = ok && c * lanes + (l as u64) < hidden;
            // SAFETY: as in `load_chunk`.
            unsafe { E::store_if(at.base + (first + l as u64) * E::BYTES, v[l], inside) };
        });
    }
}

/// The f32 form of [`load_chunk`], for the f32 rows read with the storage dtype's chunks (an
/// f32 weight, the `dw` workspace): `lanes` (that dtype's `L`, 4 or 8) f32s of the array at
/// `base` from element `first`, which is column `col0`, or zeros when `!ok`; on the scalar
/// path only columns `< hidden` are read.
///
/// # Safety
/// When `ok`, the elements exist; on the vector path `base + first * 4` is 16-byte aligned.
#[inline(always)]
unsafe fn load_f32s<const M: Path>(
    base: u64,
    first: u64,
    col0: u64,
    hidden: u64,
    lanes: usize,
    ok: bool,
) -> [f32; 8] {
    let mut v = [0.0f32; 8];
    // The realigned path reads only the weight this way, which starts at a 16-byte boundary:
    // whole chunks as vectors, the ragged last one element by element.
    let whole = M == Path::V16 || col0 + lanes as u64 <= hidden;
    if M != Path::Scalar {
        // SAFETY: caller's contract. `F32::unpack` fills lanes 0-3 and leaves 4-7 zero.
        v = F32::unpack(unsafe { ld_v4_if(base + first * 4, ok && whole) });
        if lanes == 8 {
            // SAFETY: as above, the second half of a 32-byte chunk.
            let b = F32::unpack(unsafe { ld_v4_if(base + first * 4 + 16, ok && whole) });
            v[4] = b[0];
            v[5] = b[1];
            v[6] = b[2];
            v[7] = b[3];
        }
    }
    if M == Path::Scalar || (M == Path::Realigned && ok && !whole) {
        // Branches, as in `load_chunk`.
        unroll!(l < lanes => {
            if ok && col0 + (l as u64) < hidden {
                // SAFETY: caller's contract.
                v[l] = unsafe { F32::load(base + (first + l as u64) * 4) };
            }
        });
    }
    v
}

/// Stores `lanes` f32s as [`load_f32s`] reads them, when `ok`.
///
/// # Safety
/// As for [`load_f32s`].
#[inline(always)]
unsafe fn store_f32s<const M: Path>(
    base: u64,
    first: u64,
    col0: u64,
    hidden: u64,
    lanes: usize,
    ok: bool,
    v: &[f32; 8],
) {
    if M == Path::V16 {
        // SAFETY: caller's contract. `F32::pack` takes lanes 0-3.
        unsafe { st_v4_if(base + first * 4, F32::pack(v), ok) };
        if lanes == 8 {
            // SAFETY: as above.
            unsafe {
                st_v4_if(
                    base + first * 4 + 16,
                    F32::pack(&[v[4], v[5], v[6], v[7], 0.0, 0.0, 0.0, 0.0]),
                    ok,
                )
            };
        }
    } else {
        unroll!(l < lanes => {
            let inside = ok && col0 + (l as u64) < hidden;
            // SAFETY: caller's contract.
            unsafe { F32::store_if(base + (first + l as u64) * 4, v[l], inside) };
        });
    }
}

/// The weight factors of a thread's `k` chunks `first + j * tpr` (`j < k`): `w` widened to
/// f32 (stored as f32 or in the storage dtype), or `1 + w` formed in f32 for Gemma; zeros
/// for chunks past the row or when `!ok`. The dtype test sits outside the chunk loop so the
/// loads issue back to back.
///
/// # Safety
/// `w` holds `hidden` elements of its dtype, aligned for the path (host-checked).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn load_w<E: Elem, const M: Path>(
    w: u64,
    first: u64,
    tpr: u64,
    k: usize,
    nchunks: u64,
    hidden: u64,
    w_f32: bool,
    gemma: bool,
    ok: bool,
) -> [[f32; 8]; MAX_CHUNKS] {
    let lanes = E::LANES as u64;
    let mut v = [[0.0f32; 8]; MAX_CHUNKS];
    if w_f32 {
        unroll!(j < k => {
            let c = first + j as u64 * tpr;
            // SAFETY: when c < nchunks, chunk c is inside w; it starts at element c*L, 16-byte
            // aligned on the vector path because L*4 is a multiple of 16.
            v[j] = unsafe { load_f32s::<M>(w, c * lanes, c * lanes, hidden, E::LANES, ok && c < nchunks) };
        });
    } else {
        unroll!(j < k => {
            let c = first + j as u64 * tpr;
            // SAFETY: as above; the weight is row 0 of a one-row matrix.
            v[j] = unsafe { load_chunk::<E, M>(Row::of(w, 0, 0), c, hidden, ok && c < nchunks) };
        });
    }
    if gemma {
        unroll!(j < k => { unroll!(l < E::LANES => { v[j][l] = 1.0 + v[j][l]; }); });
    }
    v
}

/// [`load_w`] (with `ok`) with every access predicated, as [`load_chunk_if`] loads the inputs.
///
/// # Safety
/// As for [`load_w`].
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn load_w_if<E: Elem, const M: Path>(
    w: u64,
    first: u64,
    tpr: u64,
    k: usize,
    nchunks: u64,
    hidden: u64,
    w_f32: bool,
    gemma: bool,
) -> [[f32; 8]; MAX_CHUNKS] {
    if M != Path::Scalar {
        // SAFETY: caller's contract.
        return unsafe { load_w::<E, M>(w, first, tpr, k, nchunks, hidden, w_f32, gemma, true) };
    }
    let lanes = E::LANES as u64;
    let mut v = [[0.0f32; 8]; MAX_CHUNKS];
    // The dtype test outside the chunk loop, as in `load_w`.
    if w_f32 {
        unroll!(j < k => {
            let c = first + j as u64 * tpr;
            // SAFETY: the weight holds `hidden` f32s (caller's contract).
            v[j] = unsafe { load_elems_if::<F32>(w, c * lanes, c * lanes, hidden, E::LANES, c < nchunks) };
        });
    } else {
        unroll!(j < k => {
            let c = first + j as u64 * tpr;
            // SAFETY: the weight holds `hidden` elements of the storage dtype.
            v[j] = unsafe { load_elems_if::<E>(w, c * lanes, c * lanes, hidden, E::LANES, c < nchunks) };
        });
    }
    if gemma {
        unroll!(j < k => { unroll!(l < E::LANES => { v[j][l] = 1.0 + v[j][l]; }); });
    }
    v
}

/// [`load_w_if`] on the vector and scalar paths before its widening ([`widen_w`]), as
/// [`load_chunk_bits_if`] loads the inputs. `load_w_if` is not built on it: its kernels widen
/// each load where it lands, the schedule their SASS was measured with.
///
/// # Safety
/// As for [`load_w`].
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn load_w_bits_if<E: Elem, const M: Path>(
    w: u64,
    first: u64,
    tpr: u64,
    k: usize,
    nchunks: u64,
    hidden: u64,
    w_f32: bool,
) -> [[u32; 8]; MAX_CHUNKS] {
    let lanes = E::LANES as u64;
    let mut bits = [[0u32; 8]; MAX_CHUNKS];
    // The dtype test outside the chunk loop, as in `load_w`.
    if w_f32 {
        unroll!(j < k => {
            let c = first + j as u64 * tpr;
            let ok = c < nchunks;
            bits[j] = if M == Path::V16 {
                // SAFETY: chunk c is inside w; it starts at element c*L, 16-byte aligned
                // because L*4 is a multiple of 16; with L = 8 it is two vectors.
                let lo = unsafe { ld_v4_if(w + c * lanes * 4, ok) };
                let hi = unsafe { ld_v4_if(w + c * lanes * 4 + 16, ok && E::LANES == 8) };
                [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]]
            } else {
                // SAFETY: the weight holds `hidden` f32s (caller's contract).
                unsafe { load_elem_bits_if::<F32>(w, c * lanes, c * lanes, hidden, E::LANES, ok) }
            };
        });
    } else {
        unroll!(j < k => {
            let c = first + j as u64 * tpr;
            // SAFETY: the weight is row 0 of a one-row matrix of `hidden` elements.
            bits[j] = unsafe { load_chunk_bits_if::<E, M>(Row::of(w, 0, 0), c, hidden, c < nchunks) };
        });
    }
    bits
}

/// The weight factors of [`load_w_if`] from the bits [`load_w_bits_if`] loaded.
#[inline(always)]
fn widen_w<E: Elem, const M: Path>(
    bits: &[[u32; 8]; MAX_CHUNKS],
    k: usize,
    w_f32: bool,
    gemma: bool,
) -> [[f32; 8]; MAX_CHUNKS] {
    let mut v = [[0.0f32; 8]; MAX_CHUNKS];
    if w_f32 {
        unroll!(j < k => { unroll!(l < E::LANES => { v[j][l] = f32::from_bits(bits[j][l]); }); });
    } else {
        unroll!(j < k => { v[j] = widen_chunk::<E, M>(&bits[j]); });
    }
    if gemma {
        unroll!(j < k => { unroll!(l < E::LANES => { v[j][l] = 1.0 + v[j][l]; }); });
    }
    v
}

// ---------------------------------------------------------------------------------------------
// The thread's place in its row.
// ---------------------------------------------------------------------------------------------

/// Where a thread sits: its row group slot and its place in the row.
#[derive(Clone, Copy)]
struct Me {
    /// Thread index in its row, `< tpr`.
    t: u64,
    /// Threads per row.
    tpr: u64,
    /// Row index inside the block (`< rows_per_block`).
    r_local: u64,
    lane: u32,
    /// Warp index in the row, and warps per row.
    warp: u32,
    warps: u32,
}

impl Me {
    /// `ONE_ROW`: the block is one row (`rows_per_block == 1`), so no division is needed.
    #[inline(always)]
    fn new<const ONE_ROW: bool>(tpr: NonZeroU64) -> Self {
        let tid = grid::thread_x();
        let r_local = if ONE_ROW { 0 } else { tid / tpr };
        let t = tid - r_local * tpr.get();
        Me {
            t,
            tpr: tpr.get(),
            r_local,
            lane: (tid & 31) as u32,
            warp: (t >> 5) as u32,
            warps: (tpr.get() >> 5) as u32,
        }
    }

    /// First shared-memory slot of this row's warp partials in reduction buffer `buf`.
    #[inline(always)]
    fn slot(&self, buf: u32) -> u32 {
        buf * SLOTS_PER_BUFFER + self.r_local as u32 * self.warps
    }
}

/// Thread 0 of the block prefetches the line at `base` (the first element of a launched
/// call's first operand) into L2. Its use is the read of `base` itself: the pointers' line of
/// the constant bank is then fetched before `grid_dependency_sync`, not missed after it.
#[inline(always)]
fn prefetch_first(base: u64) {
    if grid::thread_x() == 0 {
        // SAFETY: `base` is the start of an operand the host checked (a launched call has at
        // least one element).
        unsafe { prefetch_l2(base) };
    }
}

// ---------------------------------------------------------------------------------------------
// Forward.
// ---------------------------------------------------------------------------------------------

/// Rounds each lane to the storage dtype and back (round to nearest even), with the same
/// conversion instructions as the vector stores.
#[inline(always)]
fn round_to<E: Elem>(v: &[f32; 8]) -> [f32; 8] {
    E::unpack(E::pack(v))
}

/// `1 / sqrt(sum / hidden + eps)`: eps inside the square root. Computed with `div.full`
/// (within 2 ulp) and `rsqrt.approx` (relative error below 2^-22.9); Triton's `/` and
/// `tl.sqrt` are approximate by default too. The IEEE forms (`div.rn`, `sqrt.rn`, `rcp.rn`)
/// each put a range check and a slow-path subroutine on the row's critical path. The result
/// is still one fixed function of the row's sum.
#[inline(always)]
fn rstd_of(sum_sq: f32, hidden: u64, eps: f32) -> f32 {
    rsqrt_approx(div_full(sum_sq, hidden as f32) + eps)
}

/// `y = n * w` with `n = h * rstd`, `n` first rounded to the storage dtype in the Hugging
/// Face numerics mode.
#[inline(always)]
fn normalize<E: Elem>(h: &[f32; 8], rstd: f32, w: &[f32; 8], hf: bool) -> [f32; 8] {
    let mut n = [0.0f32; 8];
    unroll!(l < E::LANES => { n[l] = h[l] * rstd; });
    if hf {
        n = round_to::<E>(&n);
    }
    let mut y = [0.0f32; 8];
    unroll!(l < E::LANES => { y[l] = n[l] * w[l]; });
    y
}

/// When a register-resident forward ([`fwd_regs`]) loads the weight. The rest of the kernel
/// is the same for all three: `y = (h * rstd) * w` is one body (`store_y` there) whatever the
/// weight's source.
#[derive(Clone, Copy)]
enum WeightLoad {
    /// With `x` and `residual`, every chunk's, held through the reduction: one L2 round trip
    /// less on the row's path, at the cost of registers (and so of rows in flight). The
    /// `_wfirst` entries, which the host launches for grids of one wave.
    WithInputs,
    /// After the reduction (the weight is L2-resident after the first rows), every chunk's at
    /// once: the vector path with the weight in the storage dtype.
    AfterReduction,
    /// After the reduction, one chunk's at a time, just before its use: the scalar path (one
    /// load per element) and an f32 weight (two 16-byte loads per chunk), where holding every
    /// chunk's weight would set the kernel's register peak.
    PerChunk,
}

impl WeightLoad {
    /// The strategy of an entry: `W_FIRST` (the `_wfirst` entries), otherwise by memory path
    /// and weight dtype.
    #[inline(always)]
    fn of<const M: Path, const W_FIRST: bool>(w_f32: bool) -> Self {
        if W_FIRST {
            WeightLoad::WithInputs
        } else if M != Path::Scalar && !w_f32 {
            WeightLoad::AfterReduction
        } else {
            WeightLoad::PerChunk
        }
    }
}

/// Forward, whole row in registers: `EPT` elements per thread (16 or 32). `W_FIRST` loads the
/// weight with `x` and `residual` ([`WeightLoad::WithInputs`]) instead of after the reduction.
///
/// # Safety
/// The host's plan: params checked (extents, alignment for `M`, aliasing), launched with the
/// geometry the params name and [`ferrofuse_common::RMSNORM_SMEM_BYTES`] of shared memory.
#[inline(always)]
unsafe fn fwd_regs<E: Elem, const M: Path, const EPT: usize, const W_FIRST: bool>(
    p: &RmsNormFwdParams,
) {
    // Rows of more than 128 threads (H > 2048, every model's) fill a block alone: the row is
    // the block index, its addresses are uniform and no thread divides by `threads_per_row`
    // (a shorter path to the first load). Both forms assign and accumulate elements
    // identically.
    if p.rows_per_block == 1 {
        // SAFETY: the caller's contract.
        unsafe { fwd_regs_in::<E, M, EPT, W_FIRST, true>(p) }
    } else {
        // SAFETY: the caller's contract.
        unsafe { fwd_regs_in::<E, M, EPT, W_FIRST, false>(p) }
    }
}

/// [`fwd_regs`] for blocks of one row (`ONE_ROW`) or of several.
///
/// # Safety
/// As for [`fwd_regs`].
#[inline(always)]
unsafe fn fwd_regs_in<
    E: Elem,
    const M: Path,
    const EPT: usize,
    const W_FIRST: bool,
    const ONE_ROW: bool,
>(
    p: &RmsNormFwdParams,
) {
    let k = EPT / E::LANES;
    let Some(tpr) = NonZeroU64::new(p.threads_per_row as u64) else {
        return;
    };
    let me = Me::new::<ONE_ROW>(tpr);
    let row = grid::block_x() * p.rows_per_block as u64 + me.r_local;
    let live = row < p.rows;
    let hidden = p.hidden;
    let nchunks = hidden.div_ceil(E::LANES as u64);
    // A row held in registers has at most 16384 / 4 chunks, so chunk indices fit 32 bits
    // (64-bit compares cost two instructions each on the path to the first load).
    let (t32, tpr32, nchunks32) = (me.t as u32, me.tpr as u32, nchunks as u32);
    let chunk = |j: usize| {
        let c = j as u32 * tpr32 + t32;
        (c, c < nchunks32)
    };
    let has_res = p.residual != 0;
    let hf = p.flags & RMSNORM_HF != 0;
    let gemma = p.flags & RMSNORM_GEMMA != 0;
    let w_f32 = p.flags & RMSNORM_W_F32 != 0;
    let wl = WeightLoad::of::<M, W_FIRST>(w_f32);
    // After the parameter reads, the geometry, the row addresses and a prefetch that reads
    // the pointers' line of the constant bank, before the first global access (mem.rs).
    prefetch_first(p.x);
    let x_row = Row::hoisted::<E>(p.x, p.x_stride, row);
    let res_row = Row::hoisted::<E>(p.residual, p.residual_stride, row);
    let h_row = Row::hoisted::<E>(p.h, p.h_stride, row);
    let y_row = Row::hoisted::<E>(p.y, p.y_stride, row);
    grid_dependency_sync();

    // All loads of x and residual first, so they are in flight together (predicated, no
    // branches); h = x + residual in f32 after the last one. Chunks past the row stay 0 and
    // add nothing below.
    let mut x = [[0.0f32; 8]; MAX_CHUNKS];
    let mut r = [[0.0f32; 8]; MAX_CHUNKS];
    let mut h = [[0.0f32; 8]; MAX_CHUNKS];
    if M == Path::Scalar {
        // One predicated load per element, every one of the thread's issued before the first
        // use, each into a word of its own (a branch per element made each load wait for the
        // one before: a chain of memory latencies per thread).
        let mut x_raw = [[0u32; 8]; MAX_CHUNKS];
        let mut r_raw = [[0u32; 8]; MAX_CHUNKS];
        unroll!(j < k => {
            let (c, inside) = chunk(j);
            let ok = live && inside;
            // SAFETY: when ok, row < rows and c < nchunks; columns below `hidden` only.
            unsafe {
                x_raw[j] = load_chunk_bits_if::<E, M>(x_row, c as u64, hidden, ok);
                r_raw[j] = load_chunk_bits_if::<E, M>(res_row, c as u64, hidden, ok && has_res);
            }
        });
        unroll!(j < k => {
            let (xj, rj) = (widen_chunk::<E, M>(&x_raw[j]), widen_chunk::<E, M>(&r_raw[j]));
            h[j] = add_residual::<E>(&xj, &rj, has_res, hf);
        });
    } else {
        unroll!(j < k => {
            let (c, inside) = chunk(j);
            let ok = live && inside;
            // SAFETY: when ok, row < rows and c < nchunks: inside every operand (host-checked).
            unsafe {
                x[j] = load_chunk::<E, M>(x_row, c as u64, hidden, ok);
                r[j] = load_chunk::<E, M>(res_row, c as u64, hidden, ok && has_res);
            }
        });
    }
    let mut w_first = [[0.0f32; 8]; MAX_CHUNKS];
    if matches!(wl, WeightLoad::WithInputs) {
        // SAFETY: the host checked the weight.
        w_first =
            unsafe { load_w::<E, M>(p.w, me.t, me.tpr, k, nchunks, hidden, w_f32, gemma, live) };
    }
    if M != Path::Scalar {
        unroll!(j < k => { h[j] = add_residual::<E>(&x[j], &r[j], has_res, hf); });
    }
    unroll!(j < k => {
        let (c, inside) = chunk(j);
        let ok = live && has_res && inside;
        // SAFETY: as above; h may be x or residual, whose chunk was loaded above.
        unsafe { store_chunk::<E, M>(h_row, c as u64, hidden, ok, &h[j]) };
    });
    let mut acc = 0.0f32;
    unroll!(j < k => {
        unroll!(l < E::LANES => { acc = fmaf32(h[j][l], h[j][l], acc); });
    });
    // SAFETY: every thread of the block gets here; buffer 0's slots are the block's warps
    // (<= 512 / 32 = SLOTS_PER_BUFFER), inside RMSNORM_SMEM_BYTES (the asserts at the end).
    let sum_sq = unsafe { row_sum(acc, me.lane, me.warp, me.warps, me.slot(0)) };
    let rstd = rstd_of(sum_sq, hidden, p.eps);
    if !live {
        return;
    }
    if me.t == 0 && p.rstd != 0 {
        // SAFETY: row < rows; the host checked the rstd vector.
        unsafe { F32::store(p.rstd + row * p.rstd_stride * 4, rstd) };
    }
    // y = (h * rstd) * w for chunk `j`, stored; `$w` is the weight of its chunk `c`, from
    // wherever the strategy loaded it.
    macro_rules! store_y {
        ($j:ident, |$c:ident| $w:expr) => {{
            let ($c, inside) = chunk($j);
            let w: &[f32; 8] = $w;
            let y = normalize::<E>(&h[$j], rstd, w, hf);
            // SAFETY: as above; y may be x, whose chunk was loaded above.
            unsafe { store_chunk::<E, M>(y_row, $c as u64, hidden, inside, &y) };
        }};
    }
    if matches!(wl, WeightLoad::WithInputs) {
        unroll!(j < k => { store_y!(j, |_c| &w_first[j]) });
    } else if matches!(wl, WeightLoad::AfterReduction) {
        // SAFETY: the host checked the weight.
        let w =
            unsafe { load_w::<E, M>(p.w, me.t, me.tpr, k, nchunks, hidden, w_f32, gemma, true) };
        unroll!(j < k => { store_y!(j, |_c| &w[j]) });
    } else {
        // SAFETY (the loads of w): the host checked the weight.
        unroll!(j < k => {
            store_y!(j, |c| &unsafe {
                load_w_if::<E, M>(p.w, c as u64, me.tpr, 1, nchunks, hidden, w_f32, gemma)
            }[0])
        });
    }
}

/// `h = x + residual` for one chunk in f32 (just `x` without a residual), rounded to the
/// storage dtype in the Hugging Face numerics mode (the norm then sees `h` as stored).
#[inline(always)]
fn add_residual<E: Elem>(x: &[f32; 8], r: &[f32; 8], has_res: bool, hf: bool) -> [f32; 8] {
    let mut h = *x;
    if has_res {
        unroll!(l < E::LANES => { h[l] = x[l] + r[l]; });
    }
    if hf {
        h = round_to::<E>(&h);
    }
    h
}

/// Forward for rows too long for registers: two passes over tiles of 16 elements per thread.
///
/// `AHEAD`: each pass loads the next tile before it works on this one (as raw bits, widened
/// at their use), so a block has two tiles of loads in flight where it would have one. That
/// takes more registers than two 512-thread blocks per multiprocessor allow, so it pays where
/// a call has at most one block per multiprocessor anyway (few rows); the other form keeps two
/// rows per multiprocessor for the rest. The same arithmetic in the same order either way.
///
/// # Safety
/// As for [`fwd_regs`].
#[inline(always)]
unsafe fn fwd_loop<E: Elem, const M: Path, const AHEAD: bool>(p: &RmsNormFwdParams) {
    let k = 16 / E::LANES;
    let Some(tpr) = NonZeroU64::new(p.threads_per_row as u64) else {
        return;
    };
    let me = Me::new::<false>(tpr);
    let row = grid::block_x() * p.rows_per_block as u64 + me.r_local;
    let live = row < p.rows;
    let hidden = p.hidden;
    let nchunks = hidden.div_ceil(E::LANES as u64);
    let per_tile = me.tpr * k as u64;
    let tiles = nchunks.div_ceil(per_tile);
    let has_res = p.residual != 0;
    let hf = p.flags & RMSNORM_HF != 0;
    let gemma = p.flags & RMSNORM_GEMMA != 0;
    let w_f32 = p.flags & RMSNORM_W_F32 != 0;
    // As in fwd_regs.
    prefetch_first(p.x);
    grid_dependency_sync();

    // Pass 1: h = x + residual, stored; sum of squares per tile (chunk, lane), the tiles'
    // sums added in order: the shape the split kernel computes too (`split`).
    let x_row = Row::of(p.x, p.x_stride, row);
    let res_row = Row::of(p.residual, p.residual_stride, row);
    let h_row = Row::of(p.h, p.h_stride, row);
    let y_row = Row::of(p.y, p.y_stride, row);
    let mut sum_sq = 0.0f32;
    let mut tile = 0u64;
    // SAFETY (every load below): when its predicate holds, row < rows and c < nchunks
    // (host-checked extents). A thread loads only chunks it owns, and the next tile's chunks
    // are not this tile's, so loads issued ahead of this tile's stores read no byte those
    // stores write (h may be x or residual, y may be x). Past the last tile they are
    // predicated off.
    let load_x =
        |first: u64| unsafe { load_tile_bits::<E, M>(x_row, first, &me, k, nchunks, hidden, live) };
    let load_res = |first: u64| unsafe {
        load_tile_bits::<E, M>(res_row, first, &me, k, nchunks, hidden, live && has_res)
    };
    let (mut x_next, mut r_next) = if AHEAD {
        (load_x(me.t), load_res(me.t))
    } else {
        Default::default()
    };
    while tile < tiles {
        let first = tile * per_tile + me.t;
        let mut x = [[0.0f32; 8]; MAX_CHUNKS];
        let mut r = [[0.0f32; 8]; MAX_CHUNKS];
        if AHEAD {
            let (x_bits, r_bits) = (x_next, r_next);
            (x_next, r_next) = (load_x(first + per_tile), load_res(first + per_tile));
            unroll!(j < k => {
                x[j] = widen_chunk::<E, M>(&x_bits[j]);
                r[j] = widen_chunk::<E, M>(&r_bits[j]);
            });
        } else {
            unroll!(j < k => {
                let c = first + j as u64 * me.tpr;
                let ok = live && c < nchunks;
                // SAFETY: as for the loads above.
                unsafe {
                    x[j] = load_chunk_if::<E, M>(x_row, c, hidden, ok);
                    r[j] = load_chunk_if::<E, M>(res_row, c, hidden, ok && has_res);
                }
            });
        }
        let mut h = [[0.0f32; 8]; MAX_CHUNKS];
        unroll!(j < k => { h[j] = add_residual::<E>(&x[j], &r[j], has_res, hf); });
        unroll!(j < k => {
            let c = first + j as u64 * me.tpr;
            // SAFETY: as for the loads.
            unsafe { store_chunk::<E, M>(h_row, c, hidden, live && has_res && c < nchunks, &h[j]) };
        });
        let mut acc = 0.0f32;
        unroll!(j < k => {
            unroll!(l < E::LANES => { acc = fmaf32(h[j][l], h[j][l], acc); });
        });
        // SAFETY: every thread of the block gets here, at every tile; the host gave the launch
        // RMSNORM_LOOP_SMEM_BYTES.
        sum_sq = unsafe { split::ring_tile_sum(sum_sq, acc, &me, tile, tiles) };
        tile += 1;
    }
    let rstd = rstd_of(sum_sq, hidden, p.eps);
    if !live {
        return;
    }
    if me.t == 0 && p.rstd != 0 {
        // SAFETY: row < rows; the host checked the rstd vector.
        unsafe { F32::store(p.rstd + row * p.rstd_stride * 4, rstd) };
    }
    // Pass 2: read back h as stored (x when there is no residual), normalise, store y. Every
    // chunk read here was written (pass 1) by this same thread.
    let src_row = if has_res { h_row } else { x_row };
    let mut tile = 0u64;
    // SAFETY (every load below): as in pass 1; the host checked the weight.
    let load_h = |first: u64| unsafe {
        load_tile_bits::<E, M>(src_row, first, &me, k, nchunks, hidden, true)
    };
    let load_w = |first: u64| unsafe {
        load_w_bits_if::<E, M>(p.w, first, me.tpr, k, nchunks, hidden, w_f32)
    };
    let (mut h_next, mut w_next) = if AHEAD {
        (load_h(me.t), load_w(me.t))
    } else {
        Default::default()
    };
    while tile < tiles {
        let first = tile * per_tile + me.t;
        let mut hv = [[0.0f32; 8]; MAX_CHUNKS];
        let w = if AHEAD {
            let (h_bits, w_bits) = (h_next, w_next);
            (h_next, w_next) = (load_h(first + per_tile), load_w(first + per_tile));
            unroll!(j < k => { hv[j] = widen_chunk::<E, M>(&h_bits[j]); });
            widen_w::<E, M>(&w_bits, k, w_f32, gemma)
        } else {
            unroll!(j < k => {
                let c = first + j as u64 * me.tpr;
                // SAFETY: as in pass 1.
                hv[j] = unsafe { load_chunk_if::<E, M>(src_row, c, hidden, c < nchunks) };
            });
            // SAFETY: the host checked the weight.
            unsafe { load_w_if::<E, M>(p.w, first, me.tpr, k, nchunks, hidden, w_f32, gemma) }
        };
        unroll!(j < k => {
            let c = first + j as u64 * me.tpr;
            let y = normalize::<E>(&hv[j], rstd, &w[j], hf);
            // SAFETY: as in pass 1; y may be x, this chunk of which was read above.
            unsafe { store_chunk::<E, M>(y_row, c, hidden, c < nchunks, &y) };
        });
        tile += 1;
    }
}

/// Pass 1 of the looped forward as [`fwd_loop`] runs it, over the row's `x`, `residual` and
/// `h`, for the FP8 output: `h = x + residual` stored tile by tile, and the row's sum of
/// squares, per tile (chunk, lane) and the tiles' sums added in order. `AHEAD`: each tile's
/// loads issued while the tile before it is worked on, as `fwd_loop`'s loads-ahead form. The
/// same bits as `fwd_loop`'s pass 1 (whose registers are tuned with its two forms, so it keeps
/// its own copy). Returns the sum.
///
/// # Safety
/// As for [`fwd_loop`], after its grid dependency wait; every thread of the block calls it;
/// `tiles` is the row's ([`loop_tiles`]).
#[inline(always)]
unsafe fn loop_sum_sq<E: Elem, const M: Path, const AHEAD: bool>(
    p: &RmsNormFwdParams,
    me: &Me,
    live: bool,
    [x_row, res_row, h_row]: [Row; 3],
    tiles: u64,
) -> f32 {
    let k = 16 / E::LANES;
    let hidden = p.hidden;
    let nchunks = hidden.div_ceil(E::LANES as u64);
    let per_tile = me.tpr * k as u64;
    let has_res = p.residual != 0;
    let hf = p.flags & RMSNORM_HF != 0;
    let mut sum_sq = 0.0f32;
    let mut tile = 0u64;
    // SAFETY (the loads ahead): as in `fwd_loop`: a thread loads only chunks it owns, the next
    // tile's chunks are not this tile's, and past the last tile they are predicated off.
    let load_x =
        |first: u64| unsafe { load_tile_bits::<E, M>(x_row, first, me, k, nchunks, hidden, live) };
    let load_res = |first: u64| unsafe {
        load_tile_bits::<E, M>(res_row, first, me, k, nchunks, hidden, live && has_res)
    };
    let (mut x_next, mut r_next) = if AHEAD {
        (load_x(me.t), load_res(me.t))
    } else {
        Default::default()
    };
    while tile < tiles {
        let first = tile * per_tile + me.t;
        let mut h = [[0.0f32; 8]; MAX_CHUNKS];
        if AHEAD {
            let (x_bits, r_bits) = (x_next, r_next);
            (x_next, r_next) = (load_x(first + per_tile), load_res(first + per_tile));
            unroll!(j < k => {
                let x = widen_chunk::<E, M>(&x_bits[j]);
                let r = widen_chunk::<E, M>(&r_bits[j]);
                h[j] = add_residual::<E>(&x, &r, has_res, hf);
            });
        } else {
            unroll!(j < k => {
                let c = first + j as u64 * me.tpr;
                let ok = live && c < nchunks;
                // SAFETY: when ok, row < rows and c < nchunks (host-checked extents); h may be
                // x or residual, and each chunk is loaded before the same thread stores it.
                let (x, r) = unsafe {
                    (
                        load_chunk_if::<E, M>(x_row, c, hidden, ok),
                        load_chunk_if::<E, M>(res_row, c, hidden, ok && has_res),
                    )
                };
                h[j] = add_residual::<E>(&x, &r, has_res, hf);
            });
        }
        unroll!(j < k => {
            let c = first + j as u64 * me.tpr;
            // SAFETY: as for the loads.
            unsafe { store_chunk::<E, M>(h_row, c, hidden, live && has_res && c < nchunks, &h[j]) };
        });
        let mut acc = 0.0f32;
        unroll!(j < k => {
            unroll!(l < E::LANES => { acc = fmaf32(h[j][l], h[j][l], acc); });
        });
        // SAFETY: every thread of the block gets here, at every tile; the host gave the launch
        // RMSNORM_LOOP_SMEM_BYTES.
        sum_sq = unsafe { split::ring_tile_sum(sum_sq, acc, me, tile, tiles) };
        tile += 1;
    }
    sum_sq
}

/// Pass 2 of the looped forward as [`fwd_loop`] runs it (`AHEAD` as there), for the FP8
/// output: each tile's `y` (`h` as stored, or `x` without a residual, normalised with `rstd`
/// and the weight) handed to `out` with the tile's first chunk of this thread (its chunk `j`
/// is `first + j * tpr`; chunks and columns past the row hold zeros). The same values as
/// `fwd_loop` stores.
///
/// # Safety
/// As for [`loop_sum_sq`], after it: every chunk read here was written in pass 1 by this same
/// thread; `tiles` as there.
#[inline(always)]
unsafe fn loop_normalized<E: Elem, const M: Path, const AHEAD: bool>(
    p: &RmsNormFwdParams,
    me: &Me,
    row: u64,
    rstd: f32,
    tiles: u64,
    mut out: impl FnMut(u64, &[[f32; 8]; MAX_CHUNKS]),
) {
    let k = 16 / E::LANES;
    let hidden = p.hidden;
    let nchunks = hidden.div_ceil(E::LANES as u64);
    let per_tile = me.tpr * k as u64;
    let hf = p.flags & RMSNORM_HF != 0;
    let gemma = p.flags & RMSNORM_GEMMA != 0;
    let w_f32 = p.flags & RMSNORM_W_F32 != 0;
    let src_row = if p.residual != 0 {
        Row::of(p.h, p.h_stride, row)
    } else {
        Row::of(p.x, p.x_stride, row)
    };
    let mut tile = 0u64;
    // SAFETY (the loads ahead): row < rows, chunks past the row are not loaded (the caller's
    // contract); the host checked the weight.
    let load_h = |first: u64| unsafe {
        load_tile_bits::<E, M>(src_row, first, me, k, nchunks, hidden, true)
    };
    let load_w = |first: u64| unsafe {
        load_w_bits_if::<E, M>(p.w, first, me.tpr, k, nchunks, hidden, w_f32)
    };
    let (mut h_next, mut w_next) = if AHEAD {
        (load_h(me.t), load_w(me.t))
    } else {
        Default::default()
    };
    while tile < tiles {
        let first = tile * per_tile + me.t;
        let mut y = [[0.0f32; 8]; MAX_CHUNKS];
        let w = if AHEAD {
            let (h_bits, w_bits) = (h_next, w_next);
            (h_next, w_next) = (load_h(first + per_tile), load_w(first + per_tile));
            unroll!(j < k => { y[j] = widen_chunk::<E, M>(&h_bits[j]); });
            widen_w::<E, M>(&w_bits, k, w_f32, gemma)
        } else {
            unroll!(j < k => {
                let c = first + j as u64 * me.tpr;
                // SAFETY: row < rows and c < nchunks when the load is taken (the caller's
                // contract).
                y[j] = unsafe { load_chunk_if::<E, M>(src_row, c, hidden, c < nchunks) };
            });
            // SAFETY: the host checked the weight.
            unsafe { load_w_if::<E, M>(p.w, first, me.tpr, k, nchunks, hidden, w_f32, gemma) }
        };
        unroll!(j < k => { y[j] = normalize::<E>(&y[j], rstd, &w[j], hf); });
        out(first, &y);
        tile += 1;
    }
}

/// Tiles of a looped row of `hidden` elements of `E` walked by `tpr` threads, 16 bytes per
/// chunk and 16 elements per thread each.
#[inline(always)]
fn loop_tiles<E: Elem>(hidden: u64, tpr: u64) -> u64 {
    let k = 16 / E::LANES;
    hidden.div_ceil(E::LANES as u64).div_ceil(tpr * k as u64)
}

/// The raw bits of a thread's `k` chunks `first + j * tpr` (`j < k`) of the row `at`, each
/// loaded when `ok` and inside the row ([`load_chunk_bits_if`]): one tile of a looped row.
///
/// # Safety
/// When `ok`, `at` is a row of the matrix (host-checked extent and alignment for the path).
#[inline(always)]
unsafe fn load_tile_bits<E: Elem, const M: Path>(
    at: Row,
    first: u64,
    me: &Me,
    k: usize,
    nchunks: u64,
    hidden: u64,
    ok: bool,
) -> [[u32; 8]; MAX_CHUNKS] {
    let mut bits = [[0u32; 8]; MAX_CHUNKS];
    unroll!(j < k => {
        let c = first + j as u64 * me.tpr;
        // SAFETY: caller's contract; chunks past the row are not accessed.
        bits[j] = unsafe { load_chunk_bits_if::<E, M>(at, c, hidden, ok && c < nchunks) };
    });
    bits
}

// ---------------------------------------------------------------------------------------------
// Entries (names as in `ferrofuse_common::KernelId`).
// ---------------------------------------------------------------------------------------------

macro_rules! norm_entries {
    ($($e:ty, $m:ident => $f16:ident, $f32:ident, $floop:ident, $b16:ident, $bloop:ident,
        $bfused:ident;)*) => {$(
        /// RMSNorm forward, 16 elements per thread; see the module docs.
        ///
        /// # Safety
        /// Launched as `plan_rmsnorm_forward` decides, with parameters it checked.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $f16(p: RmsNormFwdParams) {
            unsafe { fwd_regs::<$e, { Path::$m }, 16, false>(&p) }
        }

        /// RMSNorm forward, 32 elements per thread; see the module docs.
        ///
        /// # Safety
        /// As above.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $f32(p: RmsNormFwdParams) {
            unsafe { fwd_regs::<$e, { Path::$m }, 32, false>(&p) }
        }

        /// RMSNorm forward, looped over tiles; see the module docs.
        ///
        /// # Safety
        /// As above.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $floop(p: RmsNormFwdParams) {
            unsafe { fwd_loop::<$e, { Path::$m }, false>(&p) }
        }

        /// RMSNorm backward rows and dw partials, 16 elements per thread.
        ///
        /// # Safety
        /// Launched as `plan_rmsnorm_backward` decides, with parameters it checked.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $b16(p: RmsNormBwdParams) {
            unsafe { bwd_regs::<$e, { Path::$m }, true>(&p) }
        }

        /// RMSNorm backward in one launch, 16 elements per thread: `dx` of each row, and
        /// `dw` summed by the blocks after the rows'.
        ///
        /// # Safety
        /// As above.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $bfused(p: RmsNormBwdParams) {
            unsafe { bwd_fused::<$e, { Path::$m }>(&p) }
        }

        /// RMSNorm backward rows and dw partials, looped over tiles.
        ///
        /// # Safety
        /// As above.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $bloop(p: RmsNormBwdParams) {
            unsafe { bwd_loop::<$e, { Path::$m }>(&p) }
        }
    )*};
}

// Names must match `ferrofuse_common::KernelId::name` (checked when `cargo xtask ptx` builds).

norm_entries! {
    F32, V16 => rmsnorm_fwd_f32_v16_e16, rmsnorm_fwd_f32_v16_e32, rmsnorm_fwd_f32_v16_loop,
        rmsnorm_bwd_f32_v16_e16, rmsnorm_bwd_f32_v16_loop, rmsnorm_bwd_f32_v16_e16_fused;
    F32, Scalar => rmsnorm_fwd_f32_scalar_e16, rmsnorm_fwd_f32_scalar_e32, rmsnorm_fwd_f32_scalar_loop,
        rmsnorm_bwd_f32_scalar_e16, rmsnorm_bwd_f32_scalar_loop, rmsnorm_bwd_f32_scalar_e16_fused;
    F16, V16 => rmsnorm_fwd_f16_v16_e16, rmsnorm_fwd_f16_v16_e32, rmsnorm_fwd_f16_v16_loop,
        rmsnorm_bwd_f16_v16_e16, rmsnorm_bwd_f16_v16_loop, rmsnorm_bwd_f16_v16_e16_fused;
    F16, Scalar => rmsnorm_fwd_f16_scalar_e16, rmsnorm_fwd_f16_scalar_e32, rmsnorm_fwd_f16_scalar_loop,
        rmsnorm_bwd_f16_scalar_e16, rmsnorm_bwd_f16_scalar_loop, rmsnorm_bwd_f16_scalar_e16_fused;
    Bf16, V16 => rmsnorm_fwd_bf16_v16_e16, rmsnorm_fwd_bf16_v16_e32, rmsnorm_fwd_bf16_v16_loop,
        rmsnorm_bwd_bf16_v16_e16, rmsnorm_bwd_bf16_v16_loop, rmsnorm_bwd_bf16_v16_e16_fused;
    Bf16, Scalar => rmsnorm_fwd_bf16_scalar_e16, rmsnorm_fwd_bf16_scalar_e32, rmsnorm_fwd_bf16_scalar_loop,
        rmsnorm_bwd_bf16_scalar_e16, rmsnorm_bwd_bf16_scalar_loop, rmsnorm_bwd_bf16_scalar_e16_fused;
}

macro_rules! bwd_cluster_entries {
    ($($e:ty, $m:ident => $split:ident, $fused:ident, $tiles:ident;)*) => {$(
        /// RMSNorm backward rows and dw partials of rows longer than 8192, split over the
        /// blocks of a thread-block cluster, one tile each (sm_90; see `bwd_cluster`).
        ///
        /// # Safety
        /// Launched as `plan_rmsnorm_backward` decides, with parameters it checked.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $split(p: RmsNormBwdParams) {
            unsafe { bwd_cluster::<$e, { Path::$m }>(&p) }
        }

        /// RMSNorm backward split over clusters in one launch, for calls of at most a row per
        /// walker: `dx` of each row, and `dw` summed by the blocks after the clusters'.
        ///
        /// # Safety
        /// As above.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $fused(p: RmsNormBwdParams) {
            unsafe { bwd_cluster_fused::<$e, { Path::$m }>(&p) }
        }

        /// RMSNorm backward rows and dw partials of the rows that the cluster split takes,
        /// looped over tiles of its shape (the same bits; see `bwd_loop_tiles`).
        ///
        /// # Safety
        /// As above.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $tiles(p: RmsNormBwdParams) {
            unsafe { bwd_loop_tiles::<$e, { Path::$m }>(&p) }
        }
    )*};
}

bwd_cluster_entries! {
    F32, V16 => rmsnorm_bwd_f32_v16_cluster, rmsnorm_bwd_f32_v16_cluster_fused,
        rmsnorm_bwd_f32_v16_loop_tiles;
    F32, Scalar => rmsnorm_bwd_f32_scalar_cluster, rmsnorm_bwd_f32_scalar_cluster_fused,
        rmsnorm_bwd_f32_scalar_loop_tiles;
    F16, V16 => rmsnorm_bwd_f16_v16_cluster, rmsnorm_bwd_f16_v16_cluster_fused,
        rmsnorm_bwd_f16_v16_loop_tiles;
    F16, Scalar => rmsnorm_bwd_f16_scalar_cluster, rmsnorm_bwd_f16_scalar_cluster_fused,
        rmsnorm_bwd_f16_scalar_loop_tiles;
    Bf16, V16 => rmsnorm_bwd_bf16_v16_cluster, rmsnorm_bwd_bf16_v16_cluster_fused,
        rmsnorm_bwd_bf16_v16_loop_tiles;
    Bf16, Scalar => rmsnorm_bwd_bf16_scalar_cluster, rmsnorm_bwd_bf16_scalar_cluster_fused,
        rmsnorm_bwd_bf16_scalar_loop_tiles;
}

macro_rules! bwd_tile_pass_entries {
    ($($e:ty, $m:ident => $sums:ident, $dx:ident;)*) => {$(
        /// RMSNorm backward, first tile pass over the rows the cluster split takes, without
        /// clusters: each tile's sum of `h * w * dy` (see `bwd_tile_sums`).
        ///
        /// # Safety
        /// Launched as `plan_rmsnorm_backward` decides, with parameters it checked.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $sums(p: RmsNormBwdParams) {
            unsafe { bwd_tile_sums::<$e, { Path::$m }>(&p) }
        }

        /// RMSNorm backward, second tile pass: `dx` and the walkers' `dw` partials (see
        /// `bwd_tile_dx`).
        ///
        /// # Safety
        /// As above, after the first pass on the same stream.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $dx(p: RmsNormBwdParams) {
            unsafe { bwd_tile_dx::<$e, { Path::$m }>(&p) }
        }
    )*};
}

bwd_tile_pass_entries! {
    F16, V16 => rmsnorm_bwd_f16_v16_tile_sums, rmsnorm_bwd_f16_v16_tile_dx;
    F16, Scalar => rmsnorm_bwd_f16_scalar_tile_sums, rmsnorm_bwd_f16_scalar_tile_dx;
    Bf16, V16 => rmsnorm_bwd_bf16_v16_tile_sums, rmsnorm_bwd_bf16_v16_tile_dx;
    Bf16, Scalar => rmsnorm_bwd_bf16_scalar_tile_sums, rmsnorm_bwd_bf16_scalar_tile_dx;
}

macro_rules! loop_ahead_entries {
    ($($e:ty, $m:ident => $name:ident;)*) => {$(
        /// RMSNorm forward, looped over tiles, each tile's loads issued while the one before
        /// it is worked on: for calls of few rows (see `fwd_loop`).
        ///
        /// # Safety
        /// Launched as `plan_rmsnorm_forward` decides, with parameters it checked.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: RmsNormFwdParams) {
            unsafe { fwd_loop::<$e, { Path::$m }, true>(&p) }
        }
    )*};
}

loop_ahead_entries! {
    F32, V16 => rmsnorm_fwd_f32_v16_loop_ahead;
    F32, Scalar => rmsnorm_fwd_f32_scalar_loop_ahead;
    F16, V16 => rmsnorm_fwd_f16_v16_loop_ahead;
    F16, Scalar => rmsnorm_fwd_f16_scalar_loop_ahead;
    Bf16, V16 => rmsnorm_fwd_bf16_v16_loop_ahead;
    Bf16, Scalar => rmsnorm_fwd_bf16_scalar_loop_ahead;
}

macro_rules! narrow_bwd_entries {
    ($($m:ident => $($name:ident),*;)*) => {$($(
        /// RMSNorm backward rows and dw partials, 16 elements per thread, f32: the body of
        /// `rmsnorm_bwd_f32_{v16|scalar}_e16` in a separate entry that `cargo xtask ptx`
        /// compiles to fewer registers (the `r` in the name), for the block sizes where that
        /// fits more blocks per multiprocessor (`ferrofuse_common::rmsnorm_bwd_narrow`).
        ///
        /// # Safety
        /// Launched as `plan_rmsnorm_backward` decides, with parameters it checked.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: RmsNormBwdParams) {
            unsafe { bwd_regs::<F32, { Path::$m }, true>(&p) }
        }
    )*)*};
}

narrow_bwd_entries! {
    V16 => rmsnorm_bwd_f32_v16_e16_r96, rmsnorm_bwd_f32_v16_e16_r80;
    Scalar => rmsnorm_bwd_f32_scalar_e16_r96, rmsnorm_bwd_f32_scalar_e16_r80;
}

macro_rules! narrow_bwd_fused_entries {
    ($($name:ident),*) => {$(
        /// RMSNorm backward in one launch, 16 elements per thread, f32 on the vector path: the
        /// body of `rmsnorm_bwd_f32_v16_e16_fused` in a separate entry compiled to fewer
        /// registers, for calls of many rows (`ferrofuse_common::rmsnorm_bwd_fused_narrow`).
        ///
        /// # Safety
        /// Launched as `plan_rmsnorm_backward` decides, with parameters it checked.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: RmsNormBwdParams) {
            unsafe { bwd_fused::<F32, { Path::V16 }>(&p) }
        }
    )*};
}

narrow_bwd_fused_entries!(
    rmsnorm_bwd_f32_v16_e16_fused_r96,
    rmsnorm_bwd_f32_v16_e16_fused_r80
);

macro_rules! realigned_entries {
    ($($e:ty, $ept:literal => $name:ident;)*) => {$(
        /// RMSNorm forward on the realigned path, `$ept` elements per thread; see the module
        /// docs and `realign`.
        ///
        /// # Safety
        /// Launched as `plan_rmsnorm_forward` decides, with parameters it checked.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: RmsNormFwdParams) {
            // Rows of more than 128 threads fill a block alone (see `fwd_regs`).
            unsafe {
                if p.rows_per_block == 1 {
                    realign::fwd::<$e, $ept, true>(&p)
                } else {
                    realign::fwd::<$e, $ept, false>(&p)
                }
            }
        }
    )*};
}

// The rows `rmsnorm_realigned_fits` admits: the 16- and 32-per-thread geometry (the f32 form of
// 32 per thread is not built), staging within `RMSNORM_REALIGNED_MAX_SMEM_BYTES`; looped rows
// below.
realigned_entries! {
    F32, 16 => rmsnorm_fwd_f32_realigned_e16;
    F16, 16 => rmsnorm_fwd_f16_realigned_e16;
    F16, 32 => rmsnorm_fwd_f16_realigned_e32;
    Bf16, 16 => rmsnorm_fwd_bf16_realigned_e16;
    Bf16, 32 => rmsnorm_fwd_bf16_realigned_e32;
}

macro_rules! realigned_loop_entries {
    ($($e:ty => $name:ident;)*) => {$(
        /// RMSNorm forward of looped rows on the realigned path, staged tile by tile; see
        /// `realign::fwd_loop`.
        ///
        /// # Safety
        /// Launched as `plan_rmsnorm_forward` decides, with parameters it checked.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: RmsNormFwdParams) {
            unsafe { realign::fwd_loop::<$e>(&p) }
        }
    )*};
}

realigned_loop_entries! {
    F32 => rmsnorm_fwd_f32_realigned_loop;
    F16 => rmsnorm_fwd_f16_realigned_loop;
    Bf16 => rmsnorm_fwd_bf16_realigned_loop;
}

macro_rules! w_first_entries {
    ($($e:ty => $name:ident;)*) => {$(
        /// RMSNorm forward, 16 elements per thread, the weight loaded with the inputs (grids of
        /// one wave); v16 path only. See [`fwd_regs`].
        ///
        /// # Safety
        /// Launched as `plan_rmsnorm_forward` decides, with parameters it checked.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: RmsNormFwdParams) {
            unsafe { fwd_regs::<$e, { Path::V16 }, 16, true>(&p) }
        }
    )*};
}

w_first_entries! {
    F32 => rmsnorm_fwd_f32_v16_e16_wfirst;
    F16 => rmsnorm_fwd_f16_v16_e16_wfirst;
    Bf16 => rmsnorm_fwd_bf16_v16_e16_wfirst;
}

macro_rules! dw_entries {
    ($($e:ty => $name:ident;)*) => {$(
        /// RMSNorm dw: fixed-order sum of the backward's partials, in the weight's dtype.
        ///
        /// # Safety
        /// Launched as `plan_rmsnorm_backward` decides, after the rows kernel on the stream.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: RmsNormDwParams) {
            unsafe { dw_reduce::<$e>(&p) }
        }
    )*};
}

dw_entries! {
    F32 => rmsnorm_dw_f32;
    F16 => rmsnorm_dw_f16;
    Bf16 => rmsnorm_dw_bf16;
}

const _: () = assert!(
    ferrofuse_common::RMSNORM_SMEM_BYTES >= 2 * SLOTS_PER_BUFFER * 4,
    "two reduction buffers of SLOTS_PER_BUFFER f32s"
);

const _: () = assert!(ferrofuse_common::RMSNORM_MAX_THREADS_PER_ROW / 32 <= SLOTS_PER_BUFFER);
