//! Add + RMSNorm forward with an FP8 E4M3 output: `y_q = e4m3(y / scale)`, `h` stored in the
//! storage dtype (it is the residual stream), the scale static (read), per token (one per
//! row) or per group (one per 64 or 128 consecutive columns).
//!
//! # Parameters
//! [`RmsNormFp8Params`]: the norm forward's parameters, whose `y` is the FP8 output (row
//! stride in bytes), and the scales' address and addressing. The scheme is the entry's
//! (`rmsnorm_fp8_{static|token|group}_*`): each body is compiled alone, so that ptxas
//! allocates its registers and schedules its loads for that body only.
//!
//! # Thread mapping and numerics
//! The register-resident forward's ([`super::fwd_regs`]): the same geometry, the same loads,
//! the same sum of squares in the same order, the same `rstd` and `y = (h * rstd) * w` in f32,
//! so `y` is bitwise the value the storage-dtype forward rounds, and batch invariance carries
//! over. Then, from the `y` the thread holds:
//! - **static**: `y / scale` with the caller's scale (loaded once per thread, right after the
//!   grid dependency wait);
//! - **per token**: the row's `max |y|`, a second fixed-order reduction of the row (each
//!   thread's chunks, then the warp's `redux.sync`, then one f32 per warp through shared
//!   memory, the sum's second buffer), then the scale;
//! - **per group**: a group of `g` columns is `g / L` consecutive chunks (8-32), which for a
//!   thread's `j`-th chunk are held by `g / L` consecutive lanes of one warp (chunk `c = j *
//!   T + t`, `T` a multiple of 32): a butterfly over those lanes gives every lane its group's
//!   maximum; the group's first lane stores the scale.
//!
//! The scale is `max(min(amax, ub) / 448, min_scale)` and `y / scale` correctly rounded
//! (`ferrofuse_common::fp8`); `max` ignores NaN, so a NaN element keeps its row's (group's)
//! scale finite and stays NaN in `y_q`. The conversion saturates to +-448, round to nearest
//! even (`cvt.rn.satfinite.e4m3x2.f32` on sm_89+, the bit-identical software form on sm_80).
//! A chunk's `L` bytes are one store on the vector path (8 bytes for 16-bit dtypes, 4 for
//! f32), one byte per element on the scalar path.
//!
//! # Rows off the 16-byte grid
//! The realigned path ([`Path::Realigned`]: 16-bit dtypes, a 16-byte aligned weight) stages the
//! row's x and residual and the weight in shared memory as the realigned forward does
//! ([`realign::stage_row`]) and reads each thread's chunks back from there, so the chunks, the
//! sums and the bits are the scalar path's; `h` is stored as that forward stores a chunk held
//! in registers ([`realign::store_chunk`]) and `y` by aligned `L`-byte word
//! ([`store_chunk_q_realigned`]). The cluster-split rows below do the same with the split
//! storage-dtype forward's staging of the block's slice. The scalar path (f32 rows, a weight
//! off the grid, looped rows) loads and stores element by element.
//!
//! # Rows of more than 16384 elements
//! The looped norm's geometry (one row of 512 threads per block, tiles of 16 elements per
//! thread): its first pass as it is (`h` stored, the same sum of squares in the same order),
//! then its second pass with the FP8 tail above applied tile by tile (static and per group;
//! a group's chunks are consecutive lanes of one tile). Per token the second pass runs twice:
//! once for the row's maximum, then again for the stores, the same `y` recomputed (read back
//! from `h` as stored, which the looped storage-dtype forward normalises too). In calls of few
//! rows the `loop_ahead` entries issue each tile's loads while the tile before it is worked
//! on, as the storage-dtype forward's (one row per SM, the same bits).
//!
//! At few rows (sm_90) such a row of up to 8 tiles, or 16 where the device runs clusters of 16
//! blocks, is split over a thread-block cluster, a block per tile ([`fwd_fp8_split`]), as the
//! storage-dtype forward splits it (`split`): the row is read once and held in registers, and its
//! sum of squares has the looped kernel's shape, so its bits are the looped kernel's. Off the
//! 16-byte grid (16-bit dtypes, a 16-byte aligned weight) the split takes the realigned path, as
//! the storage-dtype split does by chunk.
//!
//! # Aliasing
//! As the norm forward: `h` may be `x` or `residual` (each chunk loaded before it is stored,
//! by the same thread; on the realigned path every load of the row completes before the
//! staging barrier); `y` and the scales overlap nothing.

use core::intrinsics::fmaf32;
use core::num::NonZeroU64;

use ferrofuse_common::NormPath as Path;
use ferrofuse_common::fp8::{FP8_PER_GROUP, FP8_PER_TOKEN, FP8_STATIC, dynamic_scale, reciprocal};
use ferrofuse_common::{
    RMSNORM_GEMMA, RMSNORM_HF, RMSNORM_SPLIT_AMAX_SLOT, RMSNORM_W_F32, RmsNormFp8Params,
};

use super::realign::{self, Shifted, Stage, stage_row, staged_weight, weight_vectors};
use super::split::cluster_row_sum;
use super::{
    MAX_CHUNKS, Me, Row, add_residual, load_chunk, load_chunk_bits, load_chunk_if, load_w,
    load_w_if, loop_normalized, loop_sum_sq, loop_tiles, normalize, prefetch_first, round_to,
    rstd_of, store_chunk,
};
use crate::cluster;
use crate::gated_fp8::{WarpMax, load_f32, quantize, row_max, run_max, store_f32_if, store_q};
use crate::mem::{Bf16, Elem, F16, F32, grid, grid_dependency_sync, shfl_up_1};
use crate::reduce::{row_sum, smem_f32};

/// Stores the FP8 bytes `q` (packed little-endian, as `quantize` returns them) of chunk `c` of
/// row `row` of the FP8 matrix at `base` (row stride `stride` bytes) when `ok`: one access
/// of `L` bytes on the vector path; on the realigned path by aligned `L`-byte word
/// ([`store_chunk_q_realigned`]); byte by byte for columns `< hidden` on the scalar path.
///
/// # Safety
/// When `ok`, the chunk's columns below `hidden` are inside the matrix; on the vector path
/// the chunk's address is aligned to `L` bytes (host-checked). On the realigned path every
/// lane of the warp calls it, as for [`store_chunk_q_realigned`].
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn store_chunk_q<E: Elem, const M: Path>(
    base: u64,
    stride: u64,
    row: u64,
    c: u64,
    hidden: u64,
    ok: bool,
    lane: u32,
    q: [u32; 2],
) {
    let lanes = E::LANES as u64;
    let at = base + row * stride + c * lanes;
    if M == Path::V16 {
        // SAFETY: the caller's contract.
        unsafe { store_q(lanes, at, q, ok) };
    } else if M == Path::Realigned {
        let first = base + row * stride;
        // SAFETY: the caller's contract.
        unsafe { store_chunk_q_realigned::<E>(first, c as u32, hidden as u32, ok, lane, q) };
    } else {
        unroll!(l < E::LANES => {
            let byte = (q[l / 4] >> (8 * (l % 4))) & 0xff;
            let inside = ok && c * lanes + (l as u64) < hidden;
            // SAFETY: the caller's contract, column c * L + l < hidden.
            unsafe { store_q(1, at + l as u64, [byte, 0], inside) };
        });
    }
}

/// Stores chunk `c`'s `L` FP8 bytes `q` of the row whose column 0 is at byte `first` (any
/// address), when `ok`, as the realigned norm stores a storage-dtype chunk
/// ([`realign::store_chunk`]), with `L`-byte words: the row's aligned word `c` holds the last
/// `m` bytes of chunk `c - 1` (shuffled over from the left neighbour) and the first `L - m` of
/// chunk `c` (`m = first % L`). The owner of chunk `c` stores word `c` when it lies wholly
/// inside the row and the owner is not lane 0 (whose left neighbour is in another warp);
/// every byte no word store covers is stored alone by the thread that owns it, so each byte is
/// written once, by one thread.
///
/// # Safety
/// Every lane of the warp calls it. When `ok`, the row's columns `c L .. min(c L + L, hidden)`
/// are inside the FP8 output; the threads owning chunks `c - 1` and `c + 1` of the same row are
/// this thread's left and right neighbours in the warp unless it is lane 0 or 31, and they
/// call this with the same `first` and `hidden` and their chunk's own `ok`.
#[inline(always)]
unsafe fn store_chunk_q_realigned<E: Elem>(
    first: u64,
    c: u32,
    hidden: u32,
    ok: bool,
    lane: u32,
    q: [u32; 2],
) {
    let l = E::LANES as u32;
    let m = (first % l as u64) as u32;
    let base = first - m as u64;
    let left = shfl_up_1([q[0], q[1], 0, 0]);
    // Word c: columns c L - m .. c L - m + L, little-endian.
    let word = if E::LANES == 8 {
        let own = q[0] as u64 | (q[1] as u64) << 32;
        let prev = left[0] as u64 | (left[1] as u64) << 32;
        let w = if m == 0 {
            own
        } else {
            own << (8 * m) | prev >> (8 * (8 - m))
        };
        [w as u32, (w >> 32) as u32]
    } else {
        let w = if m == 0 {
            q[0]
        } else {
            q[0] << (8 * m) | left[0] >> (8 * (4 - m))
        };
        [w, 0]
    };
    let whole = |v: u32| (v * l >= m) & (v * l + l <= hidden + m);
    let head_by_word = ok && whole(c) && (lane != 0 || m == 0);
    // SAFETY: a whole word of the row, aligned to L bytes.
    unsafe { store_q(l as u64, base + (c * l) as u64, word, head_by_word) };
    // The chunk's last m bytes are in word c + 1, which the right neighbour stores when it is
    // whole and the neighbour is in this warp.
    let tail_by_word = m == 0 || (whole(c + 1) && lane != 31);
    if ok && !(head_by_word && tail_by_word) {
        let below = |n: u32| (1u32 << n) - 1;
        let head = below(l - m);
        let not_whole = if head_by_word { 0 } else { head } | if tail_by_word { 0 } else { !head };
        let mask = below((hidden - c * l).min(l)) & not_whole;
        let at = first + (c * l) as u64;
        unroll!(i < E::LANES => {
            let byte = (q[i / 4] >> (8 * (i % 4))) & 0xff;
            // SAFETY: when the bit is set, column c L + i < hidden of the row.
            unsafe { store_q(1, at + i as u64, [byte, 0], mask & (1 << i) != 0) };
        });
    }
}

/// `max |v[l]|` over the `L` lanes of a chunk.
#[inline(always)]
fn chunk_amax<E: Elem>(v: &[f32; 8]) -> f32 {
    let mut m = 0.0f32;
    unroll!(l < E::LANES => { m = m.max(v[l].abs()); });
    m
}

/// The forward with FP8 output, `EPT` elements per thread, scheme `S`; see the module docs.
///
/// # Safety
/// The host's plan: params checked (extents, alignment for `M`, aliasing, the scale tensor),
/// launched with the geometry the params name and `RMSNORM_SMEM_BYTES` of shared memory.
#[inline(always)]
unsafe fn fwd_fp8<E: Elem, const M: Path, const EPT: usize, const S: u32, const ONE_ROW: bool>(
    p: &RmsNormFp8Params,
) {
    let n = &p.norm;
    let k = EPT / E::LANES;
    let Some(tpr) = NonZeroU64::new(n.threads_per_row as u64) else {
        return;
    };
    let me = Me::new::<ONE_ROW>(tpr);
    let row = grid::block_x() * n.rows_per_block as u64 + me.r_local;
    let live = row < n.rows;
    let hidden = n.hidden;
    let nchunks = hidden.div_ceil(E::LANES as u64);
    // As in `fwd_regs`: at most 16384 / 4 chunks, so 32-bit chunk indices.
    let (t32, tpr32, nchunks32) = (me.t as u32, me.tpr as u32, nchunks as u32);
    let chunk = |j: usize| {
        let c = j as u32 * tpr32 + t32;
        (c as u64, c < nchunks32)
    };
    let has_res = n.residual != 0;
    let hf = n.flags & RMSNORM_HF != 0;
    let gemma = n.flags & RMSNORM_GEMMA != 0;
    let w_f32 = n.flags & RMSNORM_W_F32 != 0;
    prefetch_first(n.x);
    let x_row = Row::hoisted::<E>(n.x, n.x_stride, row);
    let res_row = Row::hoisted::<E>(n.residual, n.residual_stride, row);
    let h_row = Row::hoisted::<E>(n.h, n.h_stride, row);
    grid_dependency_sync();
    // The static scale, read once (it may be written by the previous kernel: after the wait).
    let fixed = if S == FP8_STATIC {
        // SAFETY: the host checked that `scale` is one readable, aligned f32.
        unsafe { load_f32(p.scale) }
    } else {
        1.0
    };

    let mut h = [[0.0f32; 8]; MAX_CHUNKS];
    // The realigned path: the row's operands as the realigned forward stages them.
    let shifted = |base, stride| Shifted::of::<E>(base, stride, row);
    if M == Path::Realigned {
        let (xs, rs) = (
            shifted(n.x, n.x_stride),
            shifted(n.residual, n.residual_stride),
        );
        let stage = Stage::of_row(me.r_local, me.tpr, k, weight_vectors::<E>(w_f32));
        // SAFETY: every thread of the block gets here; the host checked the operands (the
        // weight 16-byte aligned) and sized the shared memory for the realigned staging.
        unsafe { stage_row::<E>(n, (xs, rs), stage, &me, k, live) };
        unroll!(j < k => {
            // SAFETY: staged above; slot t + j * tpr < tpr * k.
            let (x, r) = unsafe { stage.pair::<E>(t32 + j as u32 * tpr32, xs.m, rs.m) };
            h[j] = add_residual::<E>(&x, &r, has_res, hf);
        });
    } else if M == Path::V16 {
        // Every input load issued before the first widening, and `h = x + r` for every chunk
        // without a branch on `has_res` (the residual's chunks are -0.0 without one, and `x +
        // -0.0 == x`): each chunk's widened inputs then die at its sum. Widening every chunk
        // of both inputs before a branch held 32 f32 values at once in the 16-bit dtypes,
        // and at this register budget ptxas made the last loads wait for the first to land.
        let mut x_raw = [[0u32; 4]; MAX_CHUNKS];
        let mut r_raw = [[0u32; 4]; MAX_CHUNKS];
        unroll!(j < k => {
            let (c, inside) = chunk(j);
            let ok = live && inside;
            // SAFETY: when ok, row < rows and c < nchunks: inside every operand (host-checked).
            unsafe {
                x_raw[j] = load_chunk_bits::<E>(x_row, c, ok, 0);
                r_raw[j] = load_chunk_bits::<E>(res_row, c, ok && has_res, E::NEG_ZERO_WORD);
            }
        });
        unroll!(j < k => {
            h[j] = add_residual::<E>(&E::unpack(x_raw[j]), &E::unpack(r_raw[j]), true, hf);
        });
    } else {
        unroll!(j < k => {
            let (c, inside) = chunk(j);
            let ok = live && inside;
            // SAFETY: as above.
            let (x, r) = unsafe {
                (
                    load_chunk::<E, M>(x_row, c, hidden, ok),
                    load_chunk::<E, M>(res_row, c, hidden, ok && has_res),
                )
            };
            // Combined at once on the scalar path (registers), as in `fwd_regs`.
            h[j] = add_residual::<E>(&x, &r, has_res, hf);
        });
    }
    // On the vector path with a storage-dtype weight, 16 per thread: every chunk's weight
    // loaded with the inputs, so its latency hides behind the reduction (one memory round
    // trip less on the row's path; the w-first form of the storage-dtype forward). Otherwise
    // each chunk's just before its use (registers).
    let w_early = M == Path::V16 && !w_f32 && EPT == 16;
    let mut w_all = [[0.0f32; 8]; MAX_CHUNKS];
    if w_early {
        // SAFETY: the host checked the weight.
        w_all =
            unsafe { load_w::<E, M>(n.w, me.t, me.tpr, k, nchunks, hidden, w_f32, gemma, live) };
    }
    let h_shifted = shifted(n.h, n.h_stride);
    unroll!(j < k => {
        let (c, inside) = chunk(j);
        let ok = live && has_res && inside;
        // SAFETY: as above; h may be x or residual, whose chunk was loaded above (on the
        // realigned path before the staging barrier). Realigned: every lane of the warp gets
        // here, chunks c - 1 and c + 1 are held by the neighbouring lanes (the chunk map).
        unsafe {
            if M == Path::Realigned {
                realign::store_chunk::<E>(h_shifted, c as u32, hidden as u32, ok, me.lane, &h[j]);
            } else {
                store_chunk::<E, M>(h_row, c, hidden, ok, &h[j]);
            }
        }
    });
    let mut acc = 0.0f32;
    unroll!(j < k => {
        unroll!(l < E::LANES => { acc = fmaf32(h[j][l], h[j][l], acc); });
    });
    // SAFETY: every thread of the block gets here; buffer 0's slots are the block's warps.
    let sum_sq = unsafe { row_sum(acc, me.lane, me.warp, me.warps, me.slot(0)) };
    let rstd = rstd_of(sum_sq, hidden, n.eps);
    if me.t == 0 && n.rstd != 0 && live {
        // SAFETY: row < rows; the host checked the rstd vector.
        unsafe { F32::store(n.rstd + row * n.rstd_stride * 4, rstd) };
    }
    // y over h.
    unroll!(j < k => {
        let (c, _) = chunk(j);
        let w = if w_early {
            w_all[j]
        } else if M == Path::Realigned {
            // SAFETY: staged above (columns past the row are zeros).
            unsafe { staged_weight::<E>(c as u32 * E::LANES as u32, w_f32, gemma) }
        } else {
            // SAFETY: the host checked the weight.
            let one =
                unsafe { load_w::<E, M>(n.w, c, me.tpr, 1, nchunks, hidden, w_f32, gemma, true) };
            one[0]
        };
        h[j] = normalize::<E>(&h[j], rstd, &w, hf);
    });
    // SAFETY: every thread of the block gets here; the host's checks of `y` and the scales.
    unsafe { store_fp8::<E, M, S>(p, &me, row, live, k, chunk, &h, fixed) };
}

/// Quantizes and stores row `row`'s `y` (this thread's chunks `chunk(j)`, `j < k`) with scheme
/// `S`, and the row's (per token) or its groups' (per group) scales: the tail of every FP8
/// norm body. `fixed` is the static scale; `live` whether the row exists.
///
/// # Safety
/// Every thread of the block calls it (per token it executes one barrier, on the reduction's
/// second buffer); `y` and the scales as the host checked them.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) unsafe fn store_fp8<E: Elem, const M: Path, const S: u32>(
    p: &RmsNormFp8Params,
    me: &Me,
    row: u64,
    live: bool,
    k: usize,
    chunk: impl Fn(usize) -> (u64, bool),
    y: &[[f32; 8]; MAX_CHUNKS],
    fixed: f32,
) {
    let n = &p.norm;
    let hidden = n.hidden;
    let (q_base, q_stride) = (n.y, n.y_stride);
    if S == FP8_PER_GROUP {
        let first = me.lane & (p.group_lanes - 1) == 0;
        unroll!(j < k => {
            let (c, inside) = chunk(j);
            let ok = live && inside;
            // The whole warp runs the butterfly (chunks past the row hold zeros).
            let amax = run_max(chunk_amax::<E>(&y[j]), p.group_lanes);
            let s = dynamic_scale(amax, p.min_scale, f32::INFINITY);
            let at = p.scale + (row * p.scale_row + (c >> p.group_shift) * p.scale_group) * 4;
            // SAFETY: the group's first lane stores its scale, inside the scale matrix (the
            // host checked its shape and strides) for a chunk of a live row.
            unsafe { store_f32_if(at, s, first && ok) };
            let q = quantize(E::LANES as u64, &y[j], s, reciprocal(s));
            // SAFETY: inside the FP8 output when ok (host-checked).
            unsafe { store_chunk_q::<E, M>(q_base, q_stride, row, c, hidden, ok, me.lane, q) };
        });
        return;
    }
    let scale = if S == FP8_PER_TOKEN {
        let mut amax = 0.0f32;
        unroll!(j < k => { amax = amax.max(chunk_amax::<E>(&y[j])); });
        // SAFETY: every thread of the block gets here (rows past the end too); buffer 1's slots
        // are the block's warps, inside `RMSNORM_SMEM_BYTES`.
        let amax = unsafe { row_max(WarpMax::Redux, amax, me.lane, me.warp, me.warps, me.slot(1)) };
        let s = dynamic_scale(amax, p.min_scale, p.scale_ub);
        // SAFETY: the row's scale, inside the scale vector for a live row.
        unsafe { store_f32_if(p.scale + row * p.scale_row * 4, s, live && me.t == 0) };
        s
    } else {
        fixed
    };
    let inv = reciprocal(scale);
    unroll!(j < k => {
        let (c, inside) = chunk(j);
        let q = quantize(E::LANES as u64, &y[j], scale, inv);
        // SAFETY: inside the FP8 output when live and inside (host-checked).
        unsafe {
            store_chunk_q::<E, M>(q_base, q_stride, row, c, hidden, live && inside, me.lane, q)
        };
    });
}

/// The forward with FP8 output for rows too long for registers (scheme `S`; `AHEAD`: each
/// tile's loads issued while the tile before it is worked on, for calls of few rows, as the
/// storage-dtype forward's loads-ahead form); see the module docs.
///
/// # Safety
/// The host's plan: params checked as for [`fwd_fp8`], the looped geometry (one row of
/// `RMSNORM_MAX_THREADS_PER_ROW` threads per block) and `RMSNORM_LOOP_SMEM_BYTES` of shared
/// memory.
#[inline(always)]
unsafe fn fwd_fp8_loop<E: Elem, const M: Path, const S: u32, const AHEAD: bool>(
    p: &RmsNormFp8Params,
) {
    let n = &p.norm;
    let k = 16 / E::LANES;
    let Some(tpr) = NonZeroU64::new(n.threads_per_row as u64) else {
        return;
    };
    let me = Me::new::<false>(tpr);
    let row = grid::block_x() * n.rows_per_block as u64 + me.r_local;
    let live = row < n.rows;
    let nchunks = n.hidden.div_ceil(E::LANES as u64);
    // Before the wait (a 64-bit division, and a branch on its width), so that the first tile's
    // loads issue together right after it.
    let tiles = loop_tiles::<E>(n.hidden, me.tpr);
    prefetch_first(n.x);
    grid_dependency_sync();
    // The static scale, read once, after the wait (the previous kernel may write it).
    let fixed = if S == FP8_STATIC {
        // SAFETY: the host checked that `scale` is one readable, aligned f32.
        unsafe { load_f32(p.scale) }
    } else {
        1.0
    };
    let rows = [
        Row::of(n.x, n.x_stride, row),
        Row::of(n.residual, n.residual_stride, row),
        Row::of(n.h, n.h_stride, row),
    ];
    // SAFETY: the caller's contract; every thread of the block gets here.
    let sum_sq = unsafe { loop_sum_sq::<E, M, AHEAD>(n, &me, live, rows, tiles) };
    let rstd = rstd_of(sum_sq, n.hidden, n.eps);
    // The block is one row: the whole block leaves, or none of it.
    if !live {
        return;
    }
    if me.t == 0 && n.rstd != 0 {
        // SAFETY: row < rows; the host checked the rstd vector.
        unsafe { F32::store(n.rstd + row * n.rstd_stride * 4, rstd) };
    }
    let scale = if S == FP8_PER_TOKEN {
        let mut amax = 0.0f32;
        // SAFETY: after pass 1, for a live row.
        unsafe {
            loop_normalized::<E, M, AHEAD>(n, &me, row, rstd, tiles, |_, y| {
                unroll!(j < k => { amax = amax.max(chunk_amax::<E>(&y[j])); });
            })
        };
        // SAFETY: every thread of the block gets here; buffer 1's slots lie in the ring of
        // `RMSNORM_LOOP_SMEM_BYTES`, whose last reads were before pass 1's last barrier.
        let amax = unsafe { row_max(WarpMax::Redux, amax, me.lane, me.warp, me.warps, me.slot(1)) };
        let s = dynamic_scale(amax, p.min_scale, p.scale_ub);
        // SAFETY: the row's scale, inside the scale vector (row < rows).
        unsafe { store_f32_if(p.scale + row * p.scale_row * 4, s, me.t == 0) };
        s
    } else {
        fixed
    };
    // SAFETY: after pass 1, for a live row; `y` and the scales as the host checked them.
    // Neither tail below runs a barrier (static: none; per group: warp shuffles only).
    unsafe {
        loop_normalized::<E, M, AHEAD>(n, &me, row, rstd, tiles, |first, y| {
            let chunk = |j: usize| {
                let c = first + j as u64 * me.tpr;
                (c, c < nchunks)
            };
            if S == FP8_PER_GROUP {
                store_fp8::<E, M, FP8_PER_GROUP>(p, &me, row, true, k, chunk, y, scale);
            } else {
                store_fp8::<E, M, FP8_STATIC>(p, &me, row, true, k, chunk, y, scale);
            }
        })
    };
}

/// The forward with FP8 output of a looped row split over the blocks of a thread-block
/// cluster (scheme `S`, one tile per block, memory path `M`), for calls of few rows: the split
/// storage-dtype forward's loads, `h`, sum of squares and `y` (so the looped kernel's bits, see
/// `split`; on the realigned path its form by chunk: the slice staged, `h` stored by
/// [`realign::store_chunk`], `y` by [`store_chunk_q_realigned`]), then the FP8 tail on the `y`
/// each thread holds. Per token, the row's maximum is each block's (the fixed-order block
/// reduction) then the cluster's: each block writes its maximum into every block's shared
/// memory and only then makes its second arrival of the split's protocol; after that
/// barrier's wait, its last, each block takes the maximum of its slots
/// ([`cluster_max_pushed`]; `max` is exact, so any order gives the looped kernel's bits).
///
/// # Safety
/// Launched as `plan_rmsnorm_forward_fp8` decides for it: `rows * n` blocks of 512 threads in
/// clusters of `n` = the row's tiles (`rmsnorm_split_geometry`, one tile per block), dynamic
/// shared memory of `rmsnorm_split_smem_bytes` for path `M`, parameters it checked for it.
#[inline(always)]
unsafe fn fwd_fp8_split<E: Elem, const M: Path, const S: u32>(p: &RmsNormFp8Params) {
    let n = &p.norm;
    let k = 16 / E::LANES;
    let Some(tpr) = NonZeroU64::new(n.threads_per_row as u64) else {
        return;
    };
    let me = Me::new::<true>(tpr);
    // Never 0 (every block is in a cluster of at least itself).
    let Some(cluster_size) = NonZeroU64::new(cluster::size() as u64) else {
        return;
    };
    let rank = cluster::rank() as u64;
    let row = grid::block_x() / cluster_size;
    let hidden = n.hidden;
    let nchunks = hidden.div_ceil(E::LANES as u64);
    let per_tile = me.tpr * k as u64;
    let tiles = nchunks.div_ceil(per_tile);
    let has_res = n.residual != 0;
    let hf = n.flags & RMSNORM_HF != 0;
    let gemma = n.flags & RMSNORM_GEMMA != 0;
    let w_f32 = n.flags & RMSNORM_W_F32 != 0;
    // Chunk `j` of this thread: in tile `rank`, as in the looped kernel.
    let chunk = |j: usize| {
        let c = rank * per_tile + me.t + j as u64 * me.tpr;
        (c, c < nchunks)
    };
    prefetch_first(n.x);
    let x_row = Row::hoisted::<E>(n.x, n.x_stride, row);
    let res_row = Row::hoisted::<E>(n.residual, n.residual_stride, row);
    let h_row = Row::hoisted::<E>(n.h, n.h_stride, row);
    grid_dependency_sync();
    // The static scale, read once, after the wait (the previous kernel may write it).
    let fixed = if S == FP8_STATIC {
        // SAFETY: the host checked that `scale` is one readable, aligned f32.
        unsafe { load_f32(p.scale) }
    } else {
        1.0
    };
    // Every load of x and residual first (predicated: in flight together); chunks past the
    // row stay 0 and add nothing.
    let mut h = [[0.0f32; 8]; MAX_CHUNKS];
    let mut r = [[0.0f32; 8]; MAX_CHUNKS];
    let shifted = |base, stride| Shifted::of::<E>(base, stride, row);
    if M == Path::Realigned {
        // SAFETY: row < rows: a row of each operand (host-checked); the host sized the shared
        // memory for the block's staging, after the split's own slots.
        (h, r) = unsafe {
            realign::load_pair::<E, true>(
                (shifted(n.x, n.x_stride), true),
                (shifted(n.residual, n.residual_stride), has_res),
                (me.t as u32, me.tpr as u32, k),
                Stage::of_split(me.tpr, k),
                hidden as u32,
                (rank * per_tile) as u32,
            )
        };
    } else {
        unroll!(j < k => {
            let (c, inside) = chunk(j);
            // SAFETY: when inside, row < rows and c < nchunks: inside every operand
            // (host-checked).
            unsafe {
                h[j] = load_chunk_if::<E, M>(x_row, c, hidden, inside);
                r[j] = load_chunk_if::<E, M>(res_row, c, hidden, inside && has_res);
            }
        });
    }
    // The weight: on the vector path with the inputs; on the realigned path once `h` is
    // stored, in flight through the reductions; on the scalar path (a load per element) once
    // the sums are gathered: as the split storage-dtype forward loads it.
    let load_weight = || {
        let (c0, _) = chunk(0);
        // SAFETY: the host checked the weight; chunks past the row are not read.
        unsafe { load_w_if::<E, M>(n.w, c0, me.tpr, k, nchunks, hidden, w_f32, gemma) }
    };
    let mut w = [[0.0f32; 8]; MAX_CHUNKS];
    if M == Path::V16 {
        w = load_weight();
    }
    unroll!(j < k => { h[j] = add_residual::<E>(&h[j], &r[j], has_res, hf); });
    unroll!(j < k => {
        let (c, inside) = chunk(j);
        let ok = inside && has_res;
        // SAFETY: as above; h may be x or residual, whose chunk this thread loaded above (on
        // the realigned path each thread stores only elements of its own chunks, after the
        // staging barrier that follows every load of the block; other blocks' loads of this
        // block's elements are discarded: see `realign`).
        unsafe {
            if M == Path::Realigned {
                let at = shifted(n.h, n.h_stride);
                realign::store_chunk::<E>(at, c as u32, hidden as u32, ok, me.lane, &h[j]);
            } else {
                store_chunk::<E, M>(h_row, c, hidden, ok, &h[j]);
            }
        }
    });
    if M == Path::Realigned {
        w = load_weight();
    }
    let acc = |_: usize| {
        let mut acc = 0.0f32;
        unroll!(j < k => {
            unroll!(l < E::LANES => { acc = fmaf32(h[j][l], h[j][l], acc); });
        });
        acc
    };
    let between = || {
        if M == Path::Scalar {
            w = load_weight();
        }
    };
    // SAFETY: every thread of every block of the cluster gets here once; the launch contract.
    // Per token the block's second arrival comes with its maximum (below).
    let sum_sq = unsafe {
        if S == FP8_PER_TOKEN {
            cluster_row_sum::<1, false>(&me, tiles, acc, between)
        } else {
            cluster_row_sum::<1, true>(&me, tiles, acc, between)
        }
    };
    let rstd = rstd_of(sum_sq, hidden, n.eps);
    if rank == 0 && me.t == 0 && n.rstd != 0 {
        // SAFETY: row < rows; the host checked the rstd vector.
        unsafe { F32::store(n.rstd + row * n.rstd_stride * 4, rstd) };
    }
    // `y` from `h` rounded to the storage dtype, as the looped kernel reads it back.
    unroll!(j < k => { h[j] = normalize::<E>(&round_to::<E>(&h[j]), rstd, &w[j], hf); });
    // SAFETY (the tails): every thread of every block of the cluster gets here; `y` and the
    // scales as the host checked them. Per token the block reduction and the cluster exchange
    // below, which every thread reaches; static and per group no barrier before their stores
    // (per group: warp shuffles only), then the wait that pairs the sums' second arrival.
    unsafe {
        if S == FP8_PER_TOKEN {
            let mut amax = 0.0f32;
            unroll!(j < k => { amax = amax.max(chunk_amax::<E>(&h[j])); });
            // Buffer 1's slots are the block's warps, inside the allocation; its last reads (a
            // tile sum's) were before the cluster barriers.
            let amax = row_max(WarpMax::Redux, amax, me.lane, me.warp, me.warps, me.slot(1));
            let amax = cluster_max_pushed(amax, me.t, rank, cluster_size);
            let s = dynamic_scale(amax, p.min_scale, p.scale_ub);
            // The row's scale, inside the scale vector (row < rows).
            store_f32_if(p.scale + row * p.scale_row * 4, s, rank == 0 && me.t == 0);
            store_fp8::<E, M, FP8_STATIC>(p, &me, row, true, k, chunk, &h, s);
        } else {
            if S == FP8_PER_GROUP {
                store_fp8::<E, M, FP8_PER_GROUP>(p, &me, row, true, k, chunk, &h, 1.0);
            } else {
                store_fp8::<E, M, FP8_STATIC>(p, &me, row, true, k, chunk, &h, fixed);
            }
            // No block exits while another of its cluster may still read its shared memory.
            cluster::wait();
        }
    }
}

/// The cluster's maximum of the blocks' `block_max` (the value every thread of this block
/// holds), for the per-token split: thread `r` of each block writes the block's maximum into
/// slot [`RMSNORM_SPLIT_AMAX_SLOT`]` + rank` of the block of rank `r`; the block's second
/// arrival of [`cluster_row_sum`] (held back for this) publishes the writes, the wait after it
/// ends every access to another block's shared memory (the sums' reads done, the maxima
/// written), and each block takes the maximum of its own slots. `max` ignores NaN and the
/// values are `|y|`, so the order of the slots does not change the result: the bits of
/// [`cluster_max`](crate::gated_fp8::cluster_max), which reads the other blocks' maxima, with
/// one cluster barrier and the remote reads' round trip fewer.
///
/// # Safety
/// Every thread of every block of the cluster calls it once, right after
/// `cluster_row_sum::<_, false>` (whose second arrival this is), with this block's rank and
/// the cluster's size (at most
/// [`RMSNORM_SPLIT_MAX_WIDE_CLUSTER`](ferrofuse_common::RMSNORM_SPLIT_MAX_WIDE_CLUSTER)); the
/// split's shared memory.
#[inline(always)]
unsafe fn cluster_max_pushed(
    block_max: f32,
    t_row: u64,
    rank: u64,
    cluster_size: NonZeroU64,
) -> f32 {
    let slots = smem_f32().wrapping_add(RMSNORM_SPLIT_AMAX_SLOT as usize);
    if t_row < cluster_size.get() {
        // SAFETY: block `t_row` is in the cluster and past the first barrier (every block has
        // started); its slot `rank` < RMSNORM_SPLIT_MAX_WIDE_CLUSTER is inside the allocation
        // and written only by this block, read only after the wait below.
        unsafe {
            cluster::write_remote(slots.wrapping_add(rank as usize), t_row as u32, block_max)
        };
    }
    // SAFETY: every thread of the cluster arrives and waits (caller's contract).
    unsafe {
        cluster::arrive();
        cluster::wait();
    }
    let mut m = 0.0f32;
    let mut r = 0u64;
    while r < cluster_size.get() {
        // SAFETY: slot r < RMSNORM_SPLIT_MAX_WIDE_CLUSTER, written by block r before the
        // barrier.
        m = m.max(unsafe { *slots.wrapping_add(r as usize) });
        r += 1;
    }
    m
}

/// [`fwd_fp8`] with the block shape as a constant, picked once per launch.
///
/// # Safety
/// As for [`fwd_fp8`].
#[inline(always)]
unsafe fn dispatch<E: Elem, const M: Path, const EPT: usize, const S: u32>(p: &RmsNormFp8Params) {
    // SAFETY (both arms): the caller's contract.
    unsafe {
        if p.norm.rows_per_block == 1 {
            fwd_fp8::<E, M, EPT, S, true>(p)
        } else {
            fwd_fp8::<E, M, EPT, S, false>(p)
        }
    }
}

macro_rules! fp8_realigned_entries {
    ($($s:ident, $e:ty => $e16:ident $(, $e32:ident)?;)*) => {$(
        /// Add + RMSNorm forward with FP8 output on the realigned path, 16 elements per thread;
        /// see the module docs.
        ///
        /// # Safety
        /// Launched as `plan_rmsnorm_forward_fp8` decides, with parameters it checked.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $e16(p: RmsNormFp8Params) {
            unsafe { dispatch::<$e, { Path::Realigned }, 16, $s>(&p) }
        }
        $(
        /// Add + RMSNorm forward with FP8 output on the realigned path, 32 elements per
        /// thread; see the module docs.
        ///
        /// # Safety
        /// As above.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $e32(p: RmsNormFp8Params) {
            unsafe { dispatch::<$e, { Path::Realigned }, 32, $s>(&p) }
        }
        )?
    )*};
}

macro_rules! fp8_entries {
    ($($s:ident, $e:ty, $m:ident => $e16:ident, $e32:ident;)*) => {$(
        /// Add + RMSNorm forward with FP8 output, 16 elements per thread; see the module docs.
        ///
        /// # Safety
        /// Launched as `plan_rmsnorm_forward_fp8` decides, with parameters it checked.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $e16(p: RmsNormFp8Params) {
            unsafe { dispatch::<$e, { Path::$m }, 16, $s>(&p) }
        }

        /// Add + RMSNorm forward with FP8 output, 32 elements per thread; see the module docs.
        ///
        /// # Safety
        /// As above.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $e32(p: RmsNormFp8Params) {
            unsafe { dispatch::<$e, { Path::$m }, 32, $s>(&p) }
        }
    )*};
}

macro_rules! fp8_loop_entries {
    ($($s:ident, $e:ty, $m:ident => $name:ident;)*) => {$(
        /// Add + RMSNorm forward with FP8 output, rows of more than 16384 elements (looped);
        /// see the module docs.
        ///
        /// # Safety
        /// Launched as `plan_rmsnorm_forward_fp8` decides, with parameters it checked.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: RmsNormFp8Params) {
            unsafe { fwd_fp8_loop::<$e, { Path::$m }, $s, false>(&p) }
        }
    )*};
}

macro_rules! fp8_loop_ahead_entries {
    ($($s:ident, $e:ty, $m:ident => $name:ident;)*) => {$(
        /// Add + RMSNorm forward with FP8 output, rows of more than 16384 elements (looped),
        /// each tile's loads issued while the tile before it is worked on: for calls of few
        /// rows; see [`fwd_fp8_loop`].
        ///
        /// # Safety
        /// Launched as `plan_rmsnorm_forward_fp8` decides, with parameters it checked.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: RmsNormFp8Params) {
            unsafe { fwd_fp8_loop::<$e, { Path::$m }, $s, true>(&p) }
        }
    )*};
}

// Names must match `ferrofuse_common::KernelId::name` (checked when `cargo xtask ptx` builds).
fp8_entries! {
    FP8_STATIC, F32, V16 =>
        rmsnorm_fp8_static_f32_v16_e16, rmsnorm_fp8_static_f32_v16_e32;
    FP8_STATIC, F32, Scalar =>
        rmsnorm_fp8_static_f32_scalar_e16, rmsnorm_fp8_static_f32_scalar_e32;
    FP8_STATIC, F16, V16 =>
        rmsnorm_fp8_static_f16_v16_e16, rmsnorm_fp8_static_f16_v16_e32;
    FP8_STATIC, F16, Scalar =>
        rmsnorm_fp8_static_f16_scalar_e16, rmsnorm_fp8_static_f16_scalar_e32;
    FP8_STATIC, Bf16, V16 =>
        rmsnorm_fp8_static_bf16_v16_e16, rmsnorm_fp8_static_bf16_v16_e32;
    FP8_STATIC, Bf16, Scalar =>
        rmsnorm_fp8_static_bf16_scalar_e16, rmsnorm_fp8_static_bf16_scalar_e32;
    FP8_PER_TOKEN, F32, V16 =>
        rmsnorm_fp8_token_f32_v16_e16, rmsnorm_fp8_token_f32_v16_e32;
    FP8_PER_TOKEN, F32, Scalar =>
        rmsnorm_fp8_token_f32_scalar_e16, rmsnorm_fp8_token_f32_scalar_e32;
    FP8_PER_TOKEN, F16, V16 =>
        rmsnorm_fp8_token_f16_v16_e16, rmsnorm_fp8_token_f16_v16_e32;
    FP8_PER_TOKEN, F16, Scalar =>
        rmsnorm_fp8_token_f16_scalar_e16, rmsnorm_fp8_token_f16_scalar_e32;
    FP8_PER_TOKEN, Bf16, V16 =>
        rmsnorm_fp8_token_bf16_v16_e16, rmsnorm_fp8_token_bf16_v16_e32;
    FP8_PER_TOKEN, Bf16, Scalar =>
        rmsnorm_fp8_token_bf16_scalar_e16, rmsnorm_fp8_token_bf16_scalar_e32;
    FP8_PER_GROUP, F32, V16 =>
        rmsnorm_fp8_group_f32_v16_e16, rmsnorm_fp8_group_f32_v16_e32;
    FP8_PER_GROUP, F32, Scalar =>
        rmsnorm_fp8_group_f32_scalar_e16, rmsnorm_fp8_group_f32_scalar_e32;
    FP8_PER_GROUP, F16, V16 =>
        rmsnorm_fp8_group_f16_v16_e16, rmsnorm_fp8_group_f16_v16_e32;
    FP8_PER_GROUP, F16, Scalar =>
        rmsnorm_fp8_group_f16_scalar_e16, rmsnorm_fp8_group_f16_scalar_e32;
    FP8_PER_GROUP, Bf16, V16 =>
        rmsnorm_fp8_group_bf16_v16_e16, rmsnorm_fp8_group_bf16_v16_e32;
    FP8_PER_GROUP, Bf16, Scalar =>
        rmsnorm_fp8_group_bf16_scalar_e16, rmsnorm_fp8_group_bf16_scalar_e32;
}

// As above, 16-bit dtypes only (for f32 rows the scalar path was as fast or faster).
fp8_realigned_entries! {
    FP8_STATIC, F16 => rmsnorm_fp8_static_f16_realigned_e16, rmsnorm_fp8_static_f16_realigned_e32;
    FP8_STATIC, Bf16 =>
        rmsnorm_fp8_static_bf16_realigned_e16, rmsnorm_fp8_static_bf16_realigned_e32;
    FP8_PER_TOKEN, F16 => rmsnorm_fp8_token_f16_realigned_e16, rmsnorm_fp8_token_f16_realigned_e32;
    FP8_PER_TOKEN, Bf16 =>
        rmsnorm_fp8_token_bf16_realigned_e16, rmsnorm_fp8_token_bf16_realigned_e32;
    FP8_PER_GROUP, F16 => rmsnorm_fp8_group_f16_realigned_e16, rmsnorm_fp8_group_f16_realigned_e32;
    FP8_PER_GROUP, Bf16 =>
        rmsnorm_fp8_group_bf16_realigned_e16, rmsnorm_fp8_group_bf16_realigned_e32;
}

// As above.
fp8_loop_entries! {
    FP8_STATIC, F32, V16 => rmsnorm_fp8_static_f32_v16_loop;
    FP8_STATIC, F32, Scalar => rmsnorm_fp8_static_f32_scalar_loop;
    FP8_STATIC, F16, V16 => rmsnorm_fp8_static_f16_v16_loop;
    FP8_STATIC, F16, Scalar => rmsnorm_fp8_static_f16_scalar_loop;
    FP8_STATIC, Bf16, V16 => rmsnorm_fp8_static_bf16_v16_loop;
    FP8_STATIC, Bf16, Scalar => rmsnorm_fp8_static_bf16_scalar_loop;
    FP8_PER_TOKEN, F32, V16 => rmsnorm_fp8_token_f32_v16_loop;
    FP8_PER_TOKEN, F32, Scalar => rmsnorm_fp8_token_f32_scalar_loop;
    FP8_PER_TOKEN, F16, V16 => rmsnorm_fp8_token_f16_v16_loop;
    FP8_PER_TOKEN, F16, Scalar => rmsnorm_fp8_token_f16_scalar_loop;
    FP8_PER_TOKEN, Bf16, V16 => rmsnorm_fp8_token_bf16_v16_loop;
    FP8_PER_TOKEN, Bf16, Scalar => rmsnorm_fp8_token_bf16_scalar_loop;
    FP8_PER_GROUP, F32, V16 => rmsnorm_fp8_group_f32_v16_loop;
    FP8_PER_GROUP, F32, Scalar => rmsnorm_fp8_group_f32_scalar_loop;
    FP8_PER_GROUP, F16, V16 => rmsnorm_fp8_group_f16_v16_loop;
    FP8_PER_GROUP, F16, Scalar => rmsnorm_fp8_group_f16_scalar_loop;
    FP8_PER_GROUP, Bf16, V16 => rmsnorm_fp8_group_bf16_v16_loop;
    FP8_PER_GROUP, Bf16, Scalar => rmsnorm_fp8_group_bf16_scalar_loop;
}

// As above.
fp8_loop_ahead_entries! {
    FP8_STATIC, F32, V16 => rmsnorm_fp8_static_f32_v16_loop_ahead;
    FP8_STATIC, F32, Scalar => rmsnorm_fp8_static_f32_scalar_loop_ahead;
    FP8_STATIC, F16, V16 => rmsnorm_fp8_static_f16_v16_loop_ahead;
    FP8_STATIC, F16, Scalar => rmsnorm_fp8_static_f16_scalar_loop_ahead;
    FP8_STATIC, Bf16, V16 => rmsnorm_fp8_static_bf16_v16_loop_ahead;
    FP8_STATIC, Bf16, Scalar => rmsnorm_fp8_static_bf16_scalar_loop_ahead;
    FP8_PER_TOKEN, F32, V16 => rmsnorm_fp8_token_f32_v16_loop_ahead;
    FP8_PER_TOKEN, F32, Scalar => rmsnorm_fp8_token_f32_scalar_loop_ahead;
    FP8_PER_TOKEN, F16, V16 => rmsnorm_fp8_token_f16_v16_loop_ahead;
    FP8_PER_TOKEN, F16, Scalar => rmsnorm_fp8_token_f16_scalar_loop_ahead;
    FP8_PER_TOKEN, Bf16, V16 => rmsnorm_fp8_token_bf16_v16_loop_ahead;
    FP8_PER_TOKEN, Bf16, Scalar => rmsnorm_fp8_token_bf16_scalar_loop_ahead;
    FP8_PER_GROUP, F32, V16 => rmsnorm_fp8_group_f32_v16_loop_ahead;
    FP8_PER_GROUP, F32, Scalar => rmsnorm_fp8_group_f32_scalar_loop_ahead;
    FP8_PER_GROUP, F16, V16 => rmsnorm_fp8_group_f16_v16_loop_ahead;
    FP8_PER_GROUP, F16, Scalar => rmsnorm_fp8_group_f16_scalar_loop_ahead;
    FP8_PER_GROUP, Bf16, V16 => rmsnorm_fp8_group_bf16_v16_loop_ahead;
    FP8_PER_GROUP, Bf16, Scalar => rmsnorm_fp8_group_bf16_scalar_loop_ahead;
}

macro_rules! fp8_split_entries {
    ($($s:ident, $e:ty, $m:ident => $name:ident;)*) => {$(
        /// Add + RMSNorm forward with FP8 output of a looped row, one tile per block of a
        /// thread-block cluster; see [`fwd_fp8_split`].
        ///
        /// # Safety
        /// Launched as `plan_rmsnorm_forward_fp8` decides, with parameters it checked.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: RmsNormFp8Params) {
            unsafe { fwd_fp8_split::<$e, { Path::$m }, $s>(&p) }
        }
    )*};
}

// As above.
fp8_split_entries! {
    FP8_STATIC, F32, V16 => rmsnorm_fp8_static_f32_v16_split;
    FP8_STATIC, F32, Scalar => rmsnorm_fp8_static_f32_scalar_split;
    FP8_STATIC, F16, V16 => rmsnorm_fp8_static_f16_v16_split;
    FP8_STATIC, F16, Scalar => rmsnorm_fp8_static_f16_scalar_split;
    FP8_STATIC, Bf16, V16 => rmsnorm_fp8_static_bf16_v16_split;
    FP8_STATIC, Bf16, Scalar => rmsnorm_fp8_static_bf16_scalar_split;
    FP8_PER_TOKEN, F32, V16 => rmsnorm_fp8_token_f32_v16_split;
    FP8_PER_TOKEN, F32, Scalar => rmsnorm_fp8_token_f32_scalar_split;
    FP8_PER_TOKEN, F16, V16 => rmsnorm_fp8_token_f16_v16_split;
    FP8_PER_TOKEN, F16, Scalar => rmsnorm_fp8_token_f16_scalar_split;
    FP8_PER_TOKEN, Bf16, V16 => rmsnorm_fp8_token_bf16_v16_split;
    FP8_PER_TOKEN, Bf16, Scalar => rmsnorm_fp8_token_bf16_scalar_split;
    FP8_PER_GROUP, F32, V16 => rmsnorm_fp8_group_f32_v16_split;
    FP8_PER_GROUP, F32, Scalar => rmsnorm_fp8_group_f32_scalar_split;
    FP8_PER_GROUP, F16, V16 => rmsnorm_fp8_group_f16_v16_split;
    FP8_PER_GROUP, F16, Scalar => rmsnorm_fp8_group_f16_scalar_split;
    FP8_PER_GROUP, Bf16, V16 => rmsnorm_fp8_group_bf16_v16_split;
    FP8_PER_GROUP, Bf16, Scalar => rmsnorm_fp8_group_bf16_scalar_split;
    FP8_STATIC, F16, Realigned => rmsnorm_fp8_static_f16_realigned_split;
    FP8_STATIC, Bf16, Realigned => rmsnorm_fp8_static_bf16_realigned_split;
    FP8_PER_TOKEN, F16, Realigned => rmsnorm_fp8_token_f16_realigned_split;
    FP8_PER_TOKEN, Bf16, Realigned => rmsnorm_fp8_token_bf16_realigned_split;
    FP8_PER_GROUP, F16, Realigned => rmsnorm_fp8_group_f16_realigned_split;
    FP8_PER_GROUP, Bf16, Realigned => rmsnorm_fp8_group_bf16_realigned_split;
}
