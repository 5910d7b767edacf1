//! The backward: per row `dx` from the saved `h` and `rstd`, each block's share of `dw` in
//! registers and then in its rows of the workspace, and the fixed-order sum of those rows.

use core::intrinsics::fmaf32;
use core::num::NonZeroU64;

use ferrofuse_common::{
    RMSNORM_DW_COLS, RMSNORM_DW_SLICES, RMSNORM_GEMMA, RMSNORM_W_F32, RmsNormBwdParams,
    RmsNormDwParams,
};

use super::{
    MAX_CHUNKS, Me, Path, Row, load_chunk, load_w, prefetch_first, store_chunk, store_f32s,
};
use crate::mem::{Elem, F32, grid, grid_dependency_sync, ld_f32_if};
use crate::reduce::{row_sum, smem_f32, sync_block};

/// Backward, rows of up to 4096 elements: 16 per thread in registers. Each block walks the
/// row groups `block, block + grid, ...`; each thread keeps its columns' share of `dw` in
/// registers and writes it to its row slot of the workspace at the end.
///
/// # Safety
/// As for [`fwd_regs`], with [`RmsNormBwdParams`] and the backward geometry.
#[inline(always)]
pub(super) unsafe fn bwd_regs<E: Elem, const M: Path>(p: &RmsNormBwdParams) {
    let k = 16 / E::LANES;
    let (Some(tpr), Some(rpb)) = (
        NonZeroU64::new(p.threads_per_row as u64),
        NonZeroU64::new(p.rows_per_block as u64),
    ) else {
        return;
    };
    let me = Me::new::<false>(tpr);
    let hidden = p.hidden;
    let lanes = E::LANES as u64;
    let nchunks = hidden.div_ceil(lanes);
    let groups = p.rows.div_ceil(rpb.get());
    let has_dres = p.dres != 0;
    let gemma = p.flags & RMSNORM_GEMMA != 0;
    let w_f32 = p.flags & RMSNORM_W_F32 != 0;
    let hidden_f = hidden as f32;
    // As in fwd_regs.
    prefetch_first(p.dy);
    grid_dependency_sync();

    let mut dw = [[0.0f32; 8]; MAX_CHUNKS];
    let mut g = grid::block_x();
    let step = grid::grid_dim_x();
    let mut buf = 0u32;
    while g < groups {
        let row = g * rpb.get() + me.r_local;
        let live = row < p.rows;
        let h_row = Row::of(p.h, p.h_stride, row);
        let dy_row = Row::of(p.dy, p.dy_stride, row);
        let dres_row = Row::of(p.dres, p.dres_stride, row);
        let dx_row = Row::of(p.dx, p.dx_stride, row);
        let mut h = [[0.0f32; 8]; MAX_CHUNKS];
        let mut dy = [[0.0f32; 8]; MAX_CHUNKS];
        let mut dres = [[0.0f32; 8]; MAX_CHUNKS];
        // SAFETY: when live, row < rows: inside every operand (host-checked).
        let rstd = unsafe { ld_f32_if(p.rstd + row * p.rstd_stride * 4, live) };
        unroll!(j < k => {
            let c = j as u64 * me.tpr + me.t;
            let ok = live && c < nchunks;
            // SAFETY: as above, when ok c < nchunks.
            unsafe {
                h[j] = load_chunk::<E, M>(h_row, c, hidden, ok);
                dy[j] = load_chunk::<E, M>(dy_row, c, hidden, ok);
                dres[j] = load_chunk::<E, M>(dres_row, c, hidden, ok && has_dres);
            }
        });
        // w is re-read per row (an L1 hit after the first row) rather than held: registers
        // are the limit here. SAFETY: the host checked the weight.
        let w =
            unsafe { load_w::<E, M>(p.w, me.t, me.tpr, k, nchunks, hidden, w_f32, gemma, live) };
        // g = w * dy; this thread's part of sum(h * g); dw += dy * (h * rstd). Dead rows and
        // chunks past the row are all zeros and change nothing.
        let mut acc = 0.0f32;
        unroll!(j < k => {
            unroll!(l < E::LANES => {
                let gl = w[j][l] * dy[j][l];
                acc = fmaf32(h[j][l], gl, acc);
                dw[j][l] = fmaf32(dy[j][l], h[j][l] * rstd, dw[j][l]);
                dy[j][l] = gl;
            });
        });
        // SAFETY: every thread of the block runs the same number of iterations (g is
        // per-block), and the two buffers alternate (see reduce::row_sum).
        let total = unsafe { row_sum(acc, me.lane, me.warp, me.warps, me.slot(buf)) };
        let coef = (total / hidden_f) * (rstd * rstd);
        unroll!(j < k => {
            let c = j as u64 * me.tpr + me.t;
            let mut dx = [0.0f32; 8];
            unroll!(l < E::LANES => {
                dx[l] = rstd * (dy[j][l] - h[j][l] * coef);
                if has_dres {
                    dx[l] += dres[j][l];
                }
            });
            // SAFETY: as above; dx may be dy or dres, this chunk of which was loaded.
            unsafe { store_chunk::<E, M>(dx_row, c, hidden, live && c < nchunks, &dx) };
        });
        g += step;
        buf ^= 1;
    }
    // This row slot's partial dw, a row of the f32 workspace.
    let slot = grid::block_x() * rpb.get() + me.r_local;
    unroll!(j < k => {
        let c = j as u64 * me.tpr + me.t;
        // SAFETY: slot < grid * rows_per_block = the workspace's slot rows (host-sized);
        // row offsets slot*hidden*4 are 16-byte multiples on the vector path (L | hidden).
        unsafe { store_f32s::<M>(p.workspace, slot * hidden + c * lanes, c * lanes, hidden, E::LANES, c < nchunks, &dw[j]) };
    });
}

/// Backward for rows longer than 4096 elements. Phase A: per row, the coefficient
/// `rstd^2 * sum(h*g) / hidden`, kept in the workspace after the partials. Phase B: tile by
/// tile, `dx` for every row of the block and the tile's `dw` partial in registers.
///
/// # Safety
/// As for [`bwd_regs`]; the workspace also holds one f32 per row after the partials.
#[inline(always)]
pub(super) unsafe fn bwd_loop<E: Elem, const M: Path>(p: &RmsNormBwdParams) {
    let k = 16 / E::LANES;
    let (Some(tpr), Some(rpb)) = (
        NonZeroU64::new(p.threads_per_row as u64),
        NonZeroU64::new(p.rows_per_block as u64),
    ) else {
        return;
    };
    let me = Me::new::<false>(tpr);
    let hidden = p.hidden;
    let lanes = E::LANES as u64;
    let nchunks = hidden.div_ceil(lanes);
    let per_tile = me.tpr * k as u64;
    let tiles = nchunks.div_ceil(per_tile);
    let groups = p.rows.div_ceil(rpb.get());
    let step = grid::grid_dim_x();
    let slots = step * rpb.get();
    let coef_base = p.workspace + slots * hidden * 4;
    let has_dres = p.dres != 0;
    let gemma = p.flags & RMSNORM_GEMMA != 0;
    let w_f32 = p.flags & RMSNORM_W_F32 != 0;
    let hidden_f = hidden as f32;
    // As in fwd_regs.
    prefetch_first(p.dy);
    grid_dependency_sync();

    // Phase A.
    let mut g = grid::block_x();
    let mut buf = 0u32;
    while g < groups {
        let row = g * rpb.get() + me.r_local;
        let live = row < p.rows;
        let mut acc = 0.0f32;
        let mut tile = 0u64;
        let h_row = Row::of(p.h, p.h_stride, row);
        let dy_row = Row::of(p.dy, p.dy_stride, row);
        while tile < tiles {
            let first = tile * per_tile + me.t;
            let mut h = [[0.0f32; 8]; MAX_CHUNKS];
            let mut dy = [[0.0f32; 8]; MAX_CHUNKS];
            unroll!(j < k => {
                let c = first + j as u64 * me.tpr;
                let ok = live && c < nchunks;
                // SAFETY: when ok, row < rows and c < nchunks (host-checked extents).
                unsafe {
                    h[j] = load_chunk::<E, M>(h_row, c, hidden, ok);
                    dy[j] = load_chunk::<E, M>(dy_row, c, hidden, ok);
                }
            });
            // SAFETY: the host checked the weight.
            let w = unsafe {
                load_w::<E, M>(p.w, first, me.tpr, k, nchunks, hidden, w_f32, gemma, live)
            };
            unroll!(j < k => {
                unroll!(l < E::LANES => { acc = fmaf32(h[j][l], w[j][l] * dy[j][l], acc); });
            });
            tile += 1;
        }
        // SAFETY: all threads of the block iterate alike; buffers alternate.
        let total = unsafe { row_sum(acc, me.lane, me.warp, me.warps, me.slot(buf)) };
        if live && me.t == 0 {
            // SAFETY: row < rows; the host sized the workspace with one f32 per row here.
            unsafe {
                let rstd = F32::load(p.rstd + row * p.rstd_stride * 4);
                F32::store(coef_base + row * 4, (total / hidden_f) * (rstd * rstd));
            }
        }
        g += step;
        buf ^= 1;
    }
    // The coefficients were stored by thread 0 of each row; the barrier makes them visible
    // to the rest of the block (and keeps the loads below after the stores).
    sync_block();

    // Phase B.
    let slot = grid::block_x() * rpb.get() + me.r_local;
    let mut tile = 0u64;
    while tile < tiles {
        let first = tile * per_tile + me.t;
        // SAFETY: the host checked the weight.
        let w =
            unsafe { load_w::<E, M>(p.w, first, me.tpr, k, nchunks, hidden, w_f32, gemma, true) };
        let mut dw = [[0.0f32; 8]; MAX_CHUNKS];
        let mut g = grid::block_x();
        while g < groups {
            let row = g * rpb.get() + me.r_local;
            if row < p.rows {
                let h_row = Row::of(p.h, p.h_stride, row);
                let dy_row = Row::of(p.dy, p.dy_stride, row);
                let dres_row = Row::of(p.dres, p.dres_stride, row);
                let dx_row = Row::of(p.dx, p.dx_stride, row);
                let mut h = [[0.0f32; 8]; MAX_CHUNKS];
                let mut dy = [[0.0f32; 8]; MAX_CHUNKS];
                let mut dres = [[0.0f32; 8]; MAX_CHUNKS];
                // SAFETY: row < rows; the coefficient was stored in phase A (same block).
                let (rstd, coef) = unsafe {
                    (
                        F32::load(p.rstd + row * p.rstd_stride * 4),
                        F32::load(coef_base + row * 4),
                    )
                };
                unroll!(j < k => {
                    let c = first + j as u64 * me.tpr;
                    let ok = c < nchunks;
                    // SAFETY: row < rows; when ok, c < nchunks.
                    unsafe {
                        h[j] = load_chunk::<E, M>(h_row, c, hidden, ok);
                        dy[j] = load_chunk::<E, M>(dy_row, c, hidden, ok);
                        dres[j] = load_chunk::<E, M>(dres_row, c, hidden, ok && has_dres);
                    }
                });
                unroll!(j < k => {
                    let c = first + j as u64 * me.tpr;
                    let mut dx = [0.0f32; 8];
                    unroll!(l < E::LANES => {
                        let gl = w[j][l] * dy[j][l];
                        dx[l] = rstd * (gl - h[j][l] * coef);
                        if has_dres {
                            dx[l] += dres[j][l];
                        }
                        dw[j][l] = fmaf32(dy[j][l], h[j][l] * rstd, dw[j][l]);
                    });
                    // SAFETY: as above; dx may be dy or dres, this chunk of which was loaded.
                    unsafe { store_chunk::<E, M>(dx_row, c, hidden, c < nchunks, &dx) };
                });
            }
            g += step;
        }
        unroll!(j < k => {
            let c = first + j as u64 * me.tpr;
            // SAFETY: as in `bwd_regs`.
            unsafe { store_f32s::<M>(p.workspace, slot * hidden + c * lanes, c * lanes, hidden, E::LANES, c < nchunks, &dw[j]) };
        });
        tile += 1;
    }
}

/// `dw[c] = sum over slots of the partials`, column `c` per lane: warp `q` of the block sums
/// slots `[q*S/8, (q+1)*S/8)` in order, then lane `c` of warp 0 adds the 8 slices in order.
///
/// # Safety
/// Launched with `RMSNORM_DW_THREADS` threads, `RMSNORM_DW_SMEM_BYTES` of shared memory,
/// and a workspace of `slots * hidden` f32s written by the backward rows kernel.
#[inline(always)]
pub(super) unsafe fn dw_reduce<W: Elem>(p: &RmsNormDwParams) {
    let cols = RMSNORM_DW_COLS as u64;
    let slices = RMSNORM_DW_SLICES as u64;
    let tid = grid::thread_x();
    let lane = tid % cols;
    let q = tid / cols;
    let col = grid::block_x() * cols + lane;
    let lo = q * p.slots / slices;
    let hi = (q + 1) * p.slots / slices;
    // As in fwd_regs.
    prefetch_first(p.workspace);
    grid_dependency_sync();
    let mut s = 0.0f32;
    if col < p.hidden {
        let at = |i: u64| p.workspace + (i * p.hidden + col) * 4;
        let mut i = lo;
        // Four loads in flight, added in slot order.
        while i + 4 <= hi {
            // SAFETY: i + 3 < hi <= slots, col < hidden: inside the workspace.
            let v = unsafe {
                [
                    F32::load(at(i)),
                    F32::load(at(i + 1)),
                    F32::load(at(i + 2)),
                    F32::load(at(i + 3)),
                ]
            };
            s = s + v[0] + v[1] + v[2] + v[3];
            i += 4;
        }
        while i < hi {
            // SAFETY: as above.
            s += unsafe { F32::load(at(i)) };
            i += 1;
        }
    }
    let smem = smem_f32();
    // SAFETY: tid < RMSNORM_DW_THREADS f32s of shared memory.
    unsafe { *smem.add(tid as usize) = s };
    sync_block();
    if q == 0 && col < p.hidden {
        let mut t = 0.0f32;
        let mut k = 0u64;
        while k < slices {
            // SAFETY: k * 32 + lane < RMSNORM_DW_THREADS.
            t += unsafe { *smem.add((k * cols + lane) as usize) };
            k += 1;
        }
        // SAFETY: col < hidden; dw holds hidden elements of W (host-checked).
        unsafe { W::store(p.dw + col * W::BYTES, t) };
    }
}
