//! Add + RMSNorm forward of a looped row (longer than 32 elements per thread of a 512-thread
//! block) split over the blocks of a thread-block cluster (sm_90), for calls with too few
//! rows to fill the GPU one block per row.
//!
//! # The shared reduction shape
//! A looped row is cut into tiles of 512 threads x 16 elements (`rmsnorm_fwd_tiles`); thread
//! `t` of a tile owns its chunks `t, t + 512, ...` as in the looped kernel. The row's sum of
//! squares is fixed by `hidden` and the dtype alone: per tile, each thread's `fma` chain over
//! its chunks (chunk, then lane), combined by [`tile_sum`]; then the tiles' sums added in tile
//! order from 0 by [`fold_tiles`]. The looped kernel (`fwd_loop`) computes each tile's sum as
//! it walks the row; the split kernel gives each block of the cluster one or two tiles, each
//! block publishes its tiles' sums in shared memory, and every block gathers the cluster's
//! through distributed shared memory and folds them in the same order. Both therefore compute
//! the same bits, and the host may pick either by the number of rows.
//!
//! The split kernel keeps its tiles of `h` in registers (on the realigned path, its staging
//! of `x` and `residual` in shared memory), so it reads `x`, `residual` and `w` once; it
//! normalises `h` rounded to the storage dtype, as the looped kernel does when it reads back
//! the `h` it stored (rounding `x` changes nothing, so without a residual too).
//!
//! # Cluster protocol
//! Blocks `c * n .. c * n + n` of the grid form cluster `c` (`n` = its size, the launch's
//! cluster dimension), which is row `c`; block rank `r` holds tiles `r * TPC ..`. Thread 0
//! writes the block's tile sums, then every thread arrives at the cluster barrier (release)
//! and waits (acquire): the sums of every block are then visible. Threads `i < tiles` each
//! read tile `i`'s sum from its block into this block's gather slots, and arrive at a second
//! cluster barrier, whose wait is the block's last instruction: no block exits, releasing its
//! shared memory, while another may still read it ([`cluster_row_sum`]: all but that wait).

use core::intrinsics::fmaf32;
use core::num::NonZeroU64;

use ferrofuse_common::NormPath as Path;
use ferrofuse_common::{
    RMSNORM_GEMMA, RMSNORM_HF, RMSNORM_LOOP_RING_TILES, RMSNORM_SPLIT_GATHER_SLOT,
    RMSNORM_SPLIT_PARTIALS_SLOT, RMSNORM_W_F32, RmsNormFwdParams,
};

use super::realign::{self, Shifted, Stage};
use super::{
    MAX_CHUNKS, Me, Row, add_residual, load_chunk_if, load_w_if, normalize, prefetch_first,
    round_to, rstd_of, store_chunk,
};
use crate::cluster;
use crate::mem::{Bf16, Elem, F16, F32, grid, grid_dependency_sync};
use crate::reduce::{row_sum, smem_f32, sync_block, warp_sum};

/// The sum of one tile's `acc` (each thread's `fma` chain over its chunks of the tile) over
/// the block, every thread getting the same bits. Reduction buffer by the tile's parity: the
/// next tile's barrier keeps a fast warp from writing it again before a slow one read it.
///
/// # Safety
/// Every thread of the block calls it, with the same `tile`; the block is one row of
/// `RMSNORM_MAX_THREADS_PER_ROW` threads and has `RMSNORM_SMEM_BYTES` of dynamic shared memory.
#[inline(always)]
pub(super) unsafe fn tile_sum(acc: f32, me: &Me, tile: u64) -> f32 {
    // SAFETY: buffer (tile & 1)'s slots are the block's warps, inside the allocation.
    unsafe { row_sum(acc, me.lane, me.warp, me.warps, me.slot((tile & 1) as u32)) }
}

/// Adds tile `i`'s sum to the row's sum of the tiles before it (from 0, in tile order).
#[inline(always)]
pub(super) fn fold_tiles(sum: f32, tile_sum: f32) -> f32 {
    sum + tile_sum
}

/// The row's sum of squares in every block of a split row's cluster, from this block's tiles
/// (`rank * TPC ..`; `acc(j)`: each thread's `fma` chain over its chunks of the block's tile
/// `j`): [`tile_sum`] of each, then the cluster protocol (module docs) up to the block's
/// second arrival, then `between` (work to overlap the last block barrier), then the gathered
/// sums folded in tile order. The caller's last instruction must be `cluster::wait()`. With
/// `ARRIVE = false` the block's second arrival is left to the caller, who makes it after more
/// work of its own and then waits (the FP8 per-token split sends its maximum with it).
///
/// # Safety
/// Every thread of every block of the cluster calls it once, with the same `tiles` (the row's);
/// the launch is the split forward's (blocks of `RMSNORM_MAX_THREADS_PER_ROW` threads, a
/// cluster of `ceil(tiles / TPC)` blocks, `RMSNORM_SPLIT_SMEM_BYTES` of dynamic shared memory
/// at least).
#[inline(always)]
pub(super) unsafe fn cluster_row_sum<const TPC: usize, const ARRIVE: bool>(
    me: &Me,
    tiles: u64,
    acc: impl Fn(usize) -> f32,
    between: impl FnOnce(),
) -> f32 {
    let smem = smem_f32();
    unroll!(j < TPC => {
        // SAFETY: every thread of the block calls it with the same tile (the caller's contract).
        let s = unsafe { tile_sum(acc(j), me, j as u64) };
        if me.t == 0 {
            // SAFETY: slot PARTIALS + j < PARTIALS + 2, inside RMSNORM_SPLIT_SMEM_BYTES.
            unsafe { *smem.add((RMSNORM_SPLIT_PARTIALS_SLOT as usize) + j) = s };
        }
    });
    // SAFETY (both barriers): every thread of every block of the cluster runs this straight
    // line once (the caller's contract).
    unsafe {
        cluster::arrive();
        cluster::wait();
    }
    if me.t < tiles {
        let tpc = TPC as u64;
        let local = RMSNORM_SPLIT_PARTIALS_SLOT as usize + (me.t % tpc) as usize;
        // SAFETY: tile t lives in block t / TPC < cluster size (the host sized the cluster to
        // the row's tiles), which waits at the caller's last barrier before exiting; the
        // gather slot t < 16 is inside the allocation.
        unsafe {
            let v = cluster::read_remote(smem.add(local), (me.t / tpc) as u32);
            *smem.add(RMSNORM_SPLIT_GATHER_SLOT as usize + me.t as usize) = v;
        }
    }
    if ARRIVE {
        // SAFETY: as above.
        unsafe { cluster::arrive() };
    }
    between();
    sync_block();
    let mut sum_sq = 0.0f32;
    let mut i = 0u64;
    while i < tiles {
        // SAFETY: written before the block barrier above.
        sum_sq = fold_tiles(sum_sq, unsafe {
            *smem.add(RMSNORM_SPLIT_GATHER_SLOT as usize + i as usize)
        });
        i += 1;
    }
    sum_sq
}

/// The looped kernel's form of [`tile_sum`], without a block barrier per tile (which would
/// hold every warp to the slowest one's loads at each tile): each warp's butterfly sum of the
/// tile goes to a ring of `RMSNORM_LOOP_RING_TILES` tiles in shared memory. When the ring is
/// full or the row ends: a barrier; warp `w` combines the ring's tiles `w, w + warps, ...` as
/// `row_sum` does (the warps' sums butterflied in one warp) into one slot per tile; a second
/// barrier; every thread adds the tiles' sums to `sum` in tile order. The next flush's first
/// barrier keeps the ring and the tile slots from being written again before they are read.
/// The same bits as [`tile_sum`] then [`fold_tiles`], tile by tile. Returns the new `sum`.
///
/// # Safety
/// Every thread of the block calls it for every tile `0..tiles` in order; the block is one
/// row of `RMSNORM_MAX_THREADS_PER_ROW` threads with `RMSNORM_LOOP_SMEM_BYTES` of dynamic
/// shared memory.
#[inline(always)]
pub(super) unsafe fn ring_tile_sum(sum: f32, acc: f32, me: &Me, tile: u64, tiles: u64) -> f32 {
    // SAFETY: the caller's contract.
    unsafe { ring_tile_sum_parts::<1>(sum, [acc], me, tile, tiles) }
}

/// [`ring_tile_sum`] for a block that holds a tile as `P` parts: part `s` of thread `t` is
/// the tile's thread `s * threads + t` (its `acc[s]`), so part `s` of warp `w` is the tile's
/// warp `s * warps + w`, and the tile's warp sums are combined as a block of `P` times as many
/// threads combines them: the same bits.
///
/// # Safety
/// As for [`ring_tile_sum`], with blocks of `RMSNORM_MAX_THREADS_PER_ROW / P` threads (the
/// tile's warps fill the ring's slots as a 512-thread block's do).
#[inline(always)]
pub(super) unsafe fn ring_tile_sum_parts<const P: usize>(
    sum: f32,
    acc: [f32; P],
    me: &Me,
    tile: u64,
    tiles: u64,
) -> f32 {
    let ring = RMSNORM_LOOP_RING_TILES as u64;
    let smem = smem_f32();
    // The tile's warps.
    let warps = me.warps * P as u32;
    unroll!(s < P => {
        let v = warp_sum(acc[s]);
        if me.lane == 0 {
            let warp = s as u32 * me.warps + me.warp;
            // SAFETY: (tile % ring) * warps + warp < ring * 16, inside RMSNORM_LOOP_SMEM_BYTES.
            unsafe { *smem.add(((tile % ring) * warps as u64 + warp as u64) as usize) = v };
        }
    });
    let next = tile + 1;
    if !(next.is_multiple_of(ring) || next == tiles) {
        return sum;
    }
    sync_block();
    let first = tile - tile % ring;
    let totals = ring as usize * warps as usize;
    let mut u = first + me.warp as u64;
    while u < next {
        let v = if me.lane < warps {
            // SAFETY: as above; written before the barrier.
            unsafe { *smem.add(((u % ring) * warps as u64 + me.lane as u64) as usize) }
        } else {
            0.0
        };
        let t = warp_sum(v);
        if me.lane == 0 {
            // SAFETY: slot totals + (u % ring) < ring * (warps + 1), inside the allocation.
            unsafe { *smem.add(totals + (u % ring) as usize) = t };
        }
        u += me.warps as u64;
    }
    sync_block();
    let mut sum = sum;
    let mut u = first;
    while u < next {
        // SAFETY: as above; written before the second barrier.
        sum = fold_tiles(sum, unsafe { *smem.add(totals + (u % ring) as usize) });
        u += 1;
    }
    sum
}

/// The split forward: `TPC` tiles per block (1 or 2), 512 threads, memory path `M`: v16,
/// realigned (the block's slice of `x` and `residual` staged in shared memory, `h` and `y`
/// stored as aligned vectors, see `realign`) or scalar (every access predicated, so a
/// thread's loads of a phase are in flight together).
///
/// # Safety
/// Launched as `plan_rmsnorm_forward` decides for the split kernel: `rows * n` blocks of
/// `threads_per_row` (512) threads in clusters of `n` = `rmsnorm_split_geometry`'s size,
/// `rmsnorm_split_smem_bytes` of dynamic shared memory, parameters it checked for path `M`.
///
/// `NARROW`: the entries compiled for three blocks per multiprocessor (40 registers), which
/// load the weight only once the tiles' sums are gathered. Their instantiation of their own
/// also keeps their closures apart from the other entries', so that each closure keeps one
/// caller and LLVM compiles every other entry as before (with two callers it stopped inlining
/// some, and a panic path survived).
#[inline(always)]
unsafe fn fwd_split<E: Elem, const M: Path, const TPC: usize, const NARROW: bool>(
    p: &RmsNormFwdParams,
) {
    let k = 16 / E::LANES;
    let Some(tpr) = NonZeroU64::new(p.threads_per_row as u64) else {
        return;
    };
    let me = Me::new::<true>(tpr);
    // Never 0 (every block is in a cluster of at least itself).
    let Some(cluster_size) = NonZeroU64::new(cluster::size() as u64) else {
        return;
    };
    let rank = cluster::rank();
    let row = grid::block_x() / cluster_size;
    let hidden = p.hidden;
    let nchunks = hidden.div_ceil(E::LANES as u64);
    let per_tile = me.tpr * k as u64;
    let tiles = nchunks.div_ceil(per_tile);
    let has_res = p.residual != 0;
    let hf = p.flags & RMSNORM_HF != 0;
    let gemma = p.flags & RMSNORM_GEMMA != 0;
    let w_f32 = p.flags & RMSNORM_W_F32 != 0;
    let first_tile = rank as u64 * TPC as u64;
    // Chunk `q` of this thread: tile `first_tile + q / k`, as in the looped kernel.
    let chunk = |q: usize| -> (u64, bool) {
        let c = (first_tile + (q / k) as u64) * per_tile + me.t + (q % k) as u64 * me.tpr;
        (c, c < nchunks)
    };
    // As in fwd_regs.
    prefetch_first(p.x);
    let x_row = Row::hoisted::<E>(p.x, p.x_stride, row);
    let res_row = Row::hoisted::<E>(p.residual, p.residual_stride, row);
    let h_row = Row::hoisted::<E>(p.h, p.h_stride, row);
    let y_row = Row::hoisted::<E>(p.y, p.y_stride, row);
    grid_dependency_sync();
    // Realigned rows whose operands share their offset from the 16-byte grid (dense tensors
    // of one layout) are stored by aligned vector; the same form for every block of the row.
    // SAFETY: the caller's contract.
    if M == Path::Realigned
        && unsafe { realign::fwd_split_shared::<E, TPC, NARROW>(p, &me, (row, rank, tiles)) }
    {
        return;
    }

    // Every load of x and residual first (predicated: in flight together); chunks past the
    // row stay 0 and add nothing.
    let mut x = [[0.0f32; 8]; MAX_CHUNKS];
    let mut r = [[0.0f32; 8]; MAX_CHUNKS];
    // Chunk `q` of this thread is chunk `first + t + q * tpr` of the row (the tiles of a
    // block are consecutive), the map `load_pair` stages.
    let shifted = |base, stride| Shifted::of::<E>(base, stride, row);
    if M == Path::Realigned {
        // SAFETY: row < rows: a row of each operand (host-checked); the host sized the
        // shared memory for the block's staging.
        (x, r) = unsafe {
            realign::load_pair::<E, true>(
                (shifted(p.x, p.x_stride), true),
                (shifted(p.residual, p.residual_stride), has_res),
                (me.t as u32, me.tpr as u32, TPC * k),
                Stage::of_split(me.tpr, TPC * k),
                hidden as u32,
                (first_tile * per_tile) as u32,
            )
        };
    } else {
        unroll!(q < TPC * k => {
            let (c, inside) = chunk(q);
            // SAFETY: when inside, row < rows and c < nchunks: inside every operand
            // (host-checked).
            unsafe {
                x[q] = load_chunk_if::<E, M>(x_row, c, hidden, inside);
                r[q] = load_chunk_if::<E, M>(res_row, c, hidden, inside && has_res);
            }
        });
    }
    // The weight: on the v16 path with the inputs (one 16-byte load per chunk); on the
    // realigned path once `h` is stored, in flight through the reductions; on the scalar path
    // (a load per element) once the tiles' sums are gathered, in flight through the last
    // block barrier. Issued any earlier, ptxas holds the inputs' (or the staging's) and the
    // weight's registers at once and spills.
    let load_weight = || {
        let mut w = [[0.0f32; 8]; MAX_CHUNKS];
        unroll!(j < TPC => {
            let (c0, _) = chunk(j * k);
            // SAFETY: the host checked the weight; chunks past the row are not read.
            let wj = unsafe { load_w_if::<E, M>(p.w, c0, me.tpr, k, nchunks, hidden, w_f32, gemma) };
            unroll!(i < k => { w[j * k + i] = wj[i]; });
        });
        w
    };
    // The narrow entries load it as the scalar path does: their 40 registers cannot hold it
    // through the reduction beside `h`. (The conditions test the const parameters themselves:
    // a `let` captured by the closure below would keep LLVM from folding the branch before it
    // weighs the closure for inlining.)
    let mut w = [[0.0f32; 8]; MAX_CHUNKS];
    if M == Path::V16 && !NARROW {
        w = load_weight();
    }
    let mut h = [[0.0f32; 8]; MAX_CHUNKS];
    unroll!(q < TPC * k => { h[q] = add_residual::<E>(&x[q], &r[q], has_res, hf); });
    unroll!(q < TPC * k => {
        let (c, inside) = chunk(q);
        let ok = inside && has_res;
        // SAFETY: as above; h may be x or residual, whose chunk this thread loaded above (on
        // the realigned path, each thread stores only elements of its own chunks, and the
        // staging barrier is behind every load of the block; other blocks' loads of this
        // block's elements are discarded: see `realign`).
        unsafe {
            if M == Path::Realigned {
                realign::store_chunk::<E>(shifted(p.h, p.h_stride), c as u32, hidden as u32, ok, me.lane, &h[q]);
            } else {
                store_chunk::<E, M>(h_row, c, hidden, ok, &h[q]);
            }
        }
    });
    if M == Path::Realigned && !NARROW {
        w = load_weight();
    }
    let acc = |j: usize| {
        let mut acc = 0.0f32;
        unroll!(i < k => {
            unroll!(l < E::LANES => { acc = fmaf32(h[j * k + i][l], h[j * k + i][l], acc); });
        });
        acc
    };
    // SAFETY: every thread of every block of the cluster gets here once; the launch contract.
    let sum_sq = unsafe {
        cluster_row_sum::<TPC, true>(&me, tiles, acc, || {
            if M == Path::Scalar || NARROW {
                w = load_weight();
            }
        })
    };
    let rstd = rstd_of(sum_sq, hidden, p.eps);
    if rank == 0 && me.t == 0 && p.rstd != 0 {
        // SAFETY: row < rows; the host checked the rstd vector.
        unsafe { F32::store(p.rstd + row * p.rstd_stride * 4, rstd) };
    }
    unroll!(q < TPC * k => {
        let (c, inside) = chunk(q);
        let y = normalize::<E>(&round_to::<E>(&h[q]), rstd, &w[q], hf);
        // SAFETY: as above; y may be x, whose chunk this thread loaded above.
        unsafe {
            if M == Path::Realigned {
                realign::store_chunk::<E>(shifted(p.y, p.y_stride), c as u32, hidden as u32, inside, me.lane, &y);
            } else {
                store_chunk::<E, M>(y_row, c, hidden, inside, &y);
            }
        }
    });
    // SAFETY: as above.
    unsafe { cluster::wait() };
}

macro_rules! split_entries {
    ($($e:ty, $m:ident => $one:ident, $two:ident;)*) => {$(
        /// RMSNorm forward of a looped row, one tile per block of a cluster; see the module
        /// docs.
        ///
        /// # Safety
        /// Launched as `plan_rmsnorm_forward` decides, with parameters it checked.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $one(p: RmsNormFwdParams) {
            unsafe { fwd_split::<$e, { Path::$m }, 1, false>(&p) }
        }

        /// RMSNorm forward of a looped row, two tiles per block of a cluster.
        ///
        /// # Safety
        /// As above.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $two(p: RmsNormFwdParams) {
            unsafe { fwd_split::<$e, { Path::$m }, 2, false>(&p) }
        }
    )*};
}

// Names must match `ferrofuse_common::KernelId::name`.
split_entries! {
    F32, V16 => rmsnorm_fwd_f32_v16_split_e16, rmsnorm_fwd_f32_v16_split_e32;
    F32, Scalar => rmsnorm_fwd_f32_scalar_split_e16, rmsnorm_fwd_f32_scalar_split_e32;
    F16, V16 => rmsnorm_fwd_f16_v16_split_e16, rmsnorm_fwd_f16_v16_split_e32;
    F16, Realigned => rmsnorm_fwd_f16_realigned_split_e16, rmsnorm_fwd_f16_realigned_split_e32;
    F16, Scalar => rmsnorm_fwd_f16_scalar_split_e16, rmsnorm_fwd_f16_scalar_split_e32;
    Bf16, V16 => rmsnorm_fwd_bf16_v16_split_e16, rmsnorm_fwd_bf16_v16_split_e32;
    Bf16, Realigned => rmsnorm_fwd_bf16_realigned_split_e16, rmsnorm_fwd_bf16_realigned_split_e32;
    Bf16, Scalar => rmsnorm_fwd_bf16_scalar_split_e16, rmsnorm_fwd_bf16_scalar_split_e32;
}

macro_rules! split_narrow_entries {
    ($($e:ty, $m:ident => $name:ident;)*) => {$(
        /// RMSNorm forward of a looped row, one tile per block of a cluster: the body of the
        /// `_split_e16` entry in a separate entry that `cargo xtask ptx` compiles for three
        /// blocks per multiprocessor (the `r40` in the name).
        ///
        /// # Safety
        /// Launched as `plan_rmsnorm_forward` decides, with parameters it checked.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: RmsNormFwdParams) {
            unsafe { fwd_split::<$e, { Path::$m }, 1, true>(&p) }
        }
    )*};
}

split_narrow_entries! {
    F32, V16 => rmsnorm_fwd_f32_v16_split_e16_r40;
    F16, V16 => rmsnorm_fwd_f16_v16_split_e16_r40;
    F16, Realigned => rmsnorm_fwd_f16_realigned_split_e16_r40;
    Bf16, V16 => rmsnorm_fwd_bf16_v16_split_e16_r40;
    Bf16, Realigned => rmsnorm_fwd_bf16_realigned_split_e16_r40;
}

// The f32 realigned form of one tile per block (that of two would stage more than
// `RMSNORM_REALIGNED_MAX_SMEM_BYTES`; f32 rows of 9-16 tiles off the grid run the scalar one).
/// RMSNorm forward of a looped f32 row on the realigned path, one tile per block of a
/// cluster; see the module docs.
///
/// # Safety
/// Launched as `plan_rmsnorm_forward` decides, with parameters it checked.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn rmsnorm_fwd_f32_realigned_split_e16(p: RmsNormFwdParams) {
    unsafe { fwd_split::<F32, { Path::Realigned }, 1, false>(&p) }
}
