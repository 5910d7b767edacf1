//! The backward: per row `dx` from the saved `h` and `rstd`, each block's share of `dw` in
//! registers and then in its rows of the workspace, and the fixed-order sum of those rows.

use core::arch::asm;
use core::intrinsics::fmaf32;
use core::num::NonZeroU64;

use ferrofuse_common::{
    RMSNORM_DW_COLS, RMSNORM_DW_SLICES, RMSNORM_DW_SMEM_BYTES, RMSNORM_DW_THREADS, RMSNORM_GEMMA,
    RMSNORM_W_F32, RmsNormBwdParams, RmsNormDwParams,
};

use super::{
    MAX_CHUNKS, Me, Path, Row, load_chunk, load_f32s, load_w, prefetch_first, store_chunk,
    store_f32s,
};
use crate::mem::{Elem, F32, div_full, grid, grid_dependency_sync, ld_f32_if, ld_v4_if};
use crate::reduce::{row_sum, shfl_xor, smem_f32, sync_block};

/// Backward, rows of up to 8192 elements: 16 per thread in registers (up to 512 threads per
/// row). Each block walks the row groups `block, block + grid, ...`; each thread keeps its
/// columns' share of `dw` in registers and writes it to its row slot of the workspace at the
/// end.
///
/// A row's `h`, `dy`, `dres` and `w` stay as loaded (raw storage bits, half the registers of
/// f32 for 16-bit dtypes) from the loads to the stores, and are widened to f32 where used:
/// before the reduction for `sum(h * w * dy)` and `dw`, again after it for `dx`. What lives
/// through the reduction is then about 48 registers of data per thread, which lets several
/// blocks of rows share a multiprocessor and overlap one row's reduction with another's
/// loads.
///
/// # Safety
/// As for [`fwd_regs`](super::fwd_regs), with [`RmsNormBwdParams`] and the backward geometry.
#[inline(always)]
pub(super) unsafe fn bwd_regs<E: Elem, const M: Path>(p: &RmsNormBwdParams) {
    // Rows of more than 128 threads fill a block alone: the row addresses are then uniform
    // (computed once per row for the block, not per thread and chunk), as in the forward.
    // Both forms assign and accumulate elements identically.
    // Both forms in one kernel cost the scalar path more registers than a 512-thread block
    // allows, so it keeps the general one.
    if M != Path::Scalar && p.rows_per_block == 1 {
        // SAFETY: the caller's contract.
        unsafe { bwd_regs_in::<E, M, true>(p) }
    } else {
        // SAFETY: the caller's contract.
        unsafe { bwd_regs_in::<E, M, false>(p) }
    }
}

/// [`bwd_regs`] for blocks of one row (`ONE_ROW`) or of several.
///
/// # Safety
/// As for [`bwd_regs`].
#[inline(always)]
unsafe fn bwd_regs_in<E: Elem, const M: Path, const ONE_ROW: bool>(p: &RmsNormBwdParams) {
    let k = 16 / E::LANES;
    let (Some(tpr), Some(rpb)) = (
        NonZeroU64::new(p.threads_per_row as u64),
        NonZeroU64::new(p.rows_per_block as u64),
    ) else {
        return;
    };
    let me = Me::new::<ONE_ROW>(tpr);
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
        let at = |base, stride| {
            if ONE_ROW {
                Row::hoisted::<E>(base, stride, row)
            } else {
                Row::of(base, stride, row)
            }
        };
        let h_row = at(p.h, p.h_stride);
        let dy_row = at(p.dy, p.dy_stride);
        let dres_row = at(p.dres, p.dres_stride);
        let dx_row = at(p.dx, p.dx_stride);
        let mut h = [[0u32; 4]; MAX_CHUNKS];
        let mut dy = [[0u32; 4]; MAX_CHUNKS];
        let mut dres = [[0u32; 4]; MAX_CHUNKS];
        // SAFETY: when live, row < rows: inside every operand (host-checked).
        let rstd = unsafe { ld_f32_if(p.rstd + row * p.rstd_stride * 4, live) };
        unroll!(j < k => {
            let c = j as u64 * me.tpr + me.t;
            let ok = live && c < nchunks;
            // SAFETY: as above, when ok c < nchunks.
            unsafe {
                h[j] = load_raw::<E, M>(h_row, c, hidden, ok);
                dy[j] = load_raw::<E, M>(dy_row, c, hidden, ok);
                if M != Path::Scalar {
                    dres[j] = load_raw::<E, M>(dres_row, c, hidden, ok && has_dres);
                }
            }
        });
        // w is re-read per row (an L1 hit after the first row), in the same batch as the
        // rows' loads, rather than held across rows: registers are the limit here.
        // SAFETY: the host checked the weight.
        let wr = unsafe { load_w_raw::<E, M>(p.w, me.t, me.tpr, k, nchunks, hidden, w_f32, live) };
        // g = w * dy; this thread's part of sum(h * g); dw += dy * (h * rstd). Dead rows and
        // chunks past the row are all zeros and change nothing.
        let mut acc = 0.0f32;
        unroll!(j < k => {
            let hj = E::unpack(h[j]);
            let dyj = E::unpack(dy[j]);
            let wj = w_of::<E>(&wr[j], w_f32, gemma);
            unroll!(l < E::LANES => {
                acc = fmaf32(hj[l], wj[l] * dyj[l], acc);
                dw[j][l] = fmaf32(dyj[l], hj[l] * rstd, dw[j][l]);
            });
        });
        // The partials pass through an opaque copy here, before the reduction: otherwise
        // the compiler sinks their update to the end of the iteration and keeps this row's
        // widened h and dy alive through the reduction.
        unroll!(j < k => { unroll!(l < E::LANES => {
            dw[j][l] = f32::from_bits(opaque_u32(dw[j][l].to_bits()));
        }); });
        // SAFETY: every thread of the block runs the same number of iterations (g is
        // per-block), and the two buffers alternate (see reduce::row_sum).
        let total = unsafe { row_sum(acc, me.lane, me.warp, me.warps, me.slot(buf)) };
        let coef = div_full(total, hidden_f) * (rstd * rstd);
        // The raw bits pass through an opaque copy, so that the compiler widens them again
        // here instead of keeping the f32 values of the first widening alive through the
        // reduction (twice the registers for 16-bit dtypes).
        let h = opaque(h, k);
        let dy = opaque(dy, k);
        let dres = opaque(dres, k);
        // The scalar path reads w again (L1 hits) rather than hold it: registers, as for dres.
        let wr = if M == Path::Scalar {
            // SAFETY: as above.
            unsafe { load_w_raw::<E, M>(p.w, me.t, me.tpr, k, nchunks, hidden, w_f32, live) }
        } else {
            opaque_w(wr, k)
        };
        unroll!(j < k => {
            let c = j as u64 * me.tpr + me.t;
            let hj = E::unpack(h[j]);
            let dyj = E::unpack(dy[j]);
            // The scalar path loads dres here, one chunk at a time: its element loads held
            // through the reduction took more registers than a 512-thread block allows.
            let dresj = if M == Path::Scalar {
                // SAFETY: as for the loads above.
                E::unpack(unsafe { load_raw::<E, M>(dres_row, c, hidden, live && c < nchunks && has_dres) })
            } else {
                E::unpack(dres[j])
            };
            let wj = w_of::<E>(&wr[j], w_f32, gemma);
            let mut dx = [0.0f32; 8];
            unroll!(l < E::LANES => {
                dx[l] = rstd * (wj[l] * dyj[l] - hj[l] * coef);
                if has_dres {
                    dx[l] += dresj[l];
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

/// Chunk `c` of the row `at` as raw storage bits (what [`Elem::unpack`] widens), or zeros
/// when `!ok`. The vector path keeps the loaded vector; the scalar path packs the widened
/// elements back, which is exact (they came from the storage dtype).
///
/// # Safety
/// As for [`load_chunk`].
#[inline(always)]
unsafe fn load_raw<E: Elem, const M: Path>(at: Row, c: u64, hidden: u64, ok: bool) -> [u32; 4] {
    if M == Path::V16 {
        let first = at.index * at.stride + c * E::LANES as u64;
        // SAFETY: caller's contract; the v16 path is only planned for 16-byte aligned chunks.
        unsafe { ld_v4_if(at.base + first * E::BYTES, ok) }
    } else {
        // One predicated load per element (columns past the row stay 0), its raw bits put
        // where the vector load would have put them.
        let first = at.index * at.stride + c * E::LANES as u64;
        let mut r = [0u32; 4];
        unroll!(l < E::LANES => {
            let inside = ok && c * E::LANES as u64 + (l as u64) < hidden;
            // SAFETY: caller's contract: column c*L + l < hidden of a row inside the matrix.
            let b = unsafe { E::load_bits_if(at.base + (first + l as u64) * E::BYTES, inside) };
            if E::LANES == 8 {
                r[l / 2] |= b << (16 * (l % 2));
            } else {
                r[l] = b;
            }
        });
        r
    }
}

/// The raw weight of a thread's `k` chunks `first + j * tpr`: per chunk, the storage dtype's
/// vector in words 0-3, or with an f32 weight the `L` f32s' bits in words `0..L`; zeros for
/// chunks past the row or when `!ok`. [`w_of`] widens one chunk.
///
/// # Safety
/// `w` holds `hidden` elements of its dtype, aligned for the path (host-checked).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn load_w_raw<E: Elem, const M: Path>(
    w: u64,
    first: u64,
    tpr: u64,
    k: usize,
    nchunks: u64,
    hidden: u64,
    w_f32: bool,
    ok: bool,
) -> [[u32; 8]; MAX_CHUNKS] {
    let lanes = E::LANES as u64;
    let mut v = [[0u32; 8]; MAX_CHUNKS];
    if w_f32 {
        unroll!(j < k => {
            let c = first + j as u64 * tpr;
            // SAFETY: when c < nchunks, chunk c is inside w; it starts at element c*L, 16-byte
            // aligned on the vector path because L*4 is a multiple of 16.
            let f = unsafe { load_f32s::<M>(w, c * lanes, c * lanes, hidden, E::LANES, ok && c < nchunks) };
            unroll!(l < 8 => { v[j][l] = f[l].to_bits(); });
        });
    } else {
        unroll!(j < k => {
            let c = first + j as u64 * tpr;
            // SAFETY: as above; the weight is row 0 of a one-row matrix.
            let r = unsafe { load_raw::<E, M>(Row::of(w, 0, 0), c, hidden, ok && c < nchunks) };
            unroll!(l < 4 => { v[j][l] = r[l]; });
        });
    }
    v
}

/// One chunk of [`load_w_raw`] as the f32 factors of `g = w * dy`: `w`, or `1 + w` (Gemma).
#[inline(always)]
fn w_of<E: Elem>(raw: &[u32; 8], w_f32: bool, gemma: bool) -> [f32; 8] {
    let mut v = if w_f32 {
        let mut f = [0.0f32; 8];
        unroll!(l < 8 => { f[l] = f32::from_bits(raw[l]); });
        f
    } else {
        E::unpack([raw[0], raw[1], raw[2], raw[3]])
    };
    if gemma {
        unroll!(l < E::LANES => { v[l] = 1.0 + v[l]; });
    }
    v
}

/// The first `k` chunks of `v`, through [`opaque_u32`].
#[inline(always)]
fn opaque(mut v: [[u32; 4]; MAX_CHUNKS], k: usize) -> [[u32; 4]; MAX_CHUNKS] {
    unroll!(j < k => { unroll!(l < 4 => { v[j][l] = opaque_u32(v[j][l]); }); });
    v
}

/// As [`opaque`], for the weight's chunks.
#[inline(always)]
fn opaque_w(mut v: [[u32; 8]; MAX_CHUNKS], k: usize) -> [[u32; 8]; MAX_CHUNKS] {
    unroll!(j < k => { unroll!(l < 8 => { v[j][l] = opaque_u32(v[j][l]); }); });
    v
}

/// Backward for rows longer than 8192 elements. Phase A: per row, the coefficient
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

/// `dw[c] = sum over slots of the partials`. A block owns `RMSNORM_DW_COLS` = 32 columns:
/// thread `tid` takes four of them (`4 * (tid % 8)` on) and the slice `q = tid / 8` of the
/// slots (`[q * S / 32, (q + 1) * S / 32)`), summed in slot order with up to eight loads in
/// flight; the 32 slices of a column are then combined in one fixed order: the four slices of
/// a warp by two butterfly steps, then the eight warps' sums in warp order.
///
/// # Safety
/// Launched with `RMSNORM_DW_THREADS` threads, `RMSNORM_DW_SMEM_BYTES` of shared memory,
/// and a workspace of `slots * hidden` f32s written by the backward rows kernel.
#[inline(always)]
pub(super) unsafe fn dw_reduce<W: Elem>(p: &RmsNormDwParams) {
    let cols = RMSNORM_DW_COLS as u64;
    let slices = RMSNORM_DW_SLICES as u64;
    let tid = grid::thread_x();
    let group = tid % DW_GROUPS;
    let q = tid / DW_GROUPS;
    let col0 = grid::block_x() * cols + group * 4;
    let lo = q * p.slots / slices;
    let hi = (q + 1) * p.slots / slices;
    // Whole 16-byte vectors when every slot row starts on the grid (the scalar backward path
    // allows any hidden); otherwise one element at a time, in the same order.
    let vector = (p.workspace | (p.hidden * 4)) % 16 == 0;
    // As in fwd_regs.
    prefetch_first(p.workspace);
    grid_dependency_sync();
    let mut s = [0.0f32; 4];
    if col0 < p.hidden {
        let at = |i: u64| p.workspace + (i * p.hidden + col0) * 4;
        let mut i = lo;
        while i < hi {
            let mut v = [[0.0f32; 4]; DW_BATCH];
            unroll!(b < DW_BATCH => {
                let ok = i + (b as u64) < hi;
                // SAFETY: when ok, slot i + b < slots and columns col0.. (< hidden when
                // loaded) are inside the workspace; vectors only when 16-byte aligned.
                v[b] = unsafe { load4(at(i + b as u64), ok, vector, p.hidden - col0) };
            });
            unroll!(b < DW_BATCH => {
                if i + (b as u64) < hi {
                    unroll!(l < 4 => { s[l] += v[b][l]; });
                }
            });
            i += DW_BATCH as u64;
        }
    }
    // Lanes g, g + 8, g + 16, g + 24 of a warp hold the same columns: two butterfly steps
    // leave each of them with the same bits.
    unroll!(l < 4 => {
        s[l] += shfl_xor(s[l], 16);
        s[l] += shfl_xor(s[l], 8);
    });
    let smem = smem_f32();
    let lane = tid % 32;
    let warp = tid / 32;
    if lane < DW_GROUPS {
        unroll!(l < 4 => {
            // SAFETY: warp * 32 + lane * 4 + l < 8 * 32 = RMSNORM_DW_SMEM_BYTES / 4.
            unsafe { *smem.add((warp * 32 + lane * 4 + l as u64) as usize) = s[l] };
        });
    }
    sync_block();
    let col = grid::block_x() * cols + tid;
    if tid < cols && col < p.hidden {
        let mut t = 0.0f32;
        let mut w = 0u64;
        while w < DW_WARPS {
            // SAFETY: w * 32 + tid < 8 * 32.
            t += unsafe { *smem.add((w * 32 + tid) as usize) };
            w += 1;
        }
        // SAFETY: col < hidden; dw holds hidden elements of W (host-checked).
        unsafe { W::store(p.dw + col * W::BYTES, t) };
    }
}

/// Column groups of four per block, warps per block, and slot loads in flight per thread of
/// the `dw` sum.
const DW_GROUPS: u64 = RMSNORM_DW_COLS as u64 / 4;
const DW_WARPS: u64 = RMSNORM_DW_THREADS as u64 / 32;
const DW_BATCH: usize = 8;
const _: () = assert!(RMSNORM_DW_COLS == 32 && RMSNORM_DW_SLICES == 32 && DW_WARPS == 8);
const _: () = assert!(RMSNORM_DW_SMEM_BYTES as u64 >= DW_WARPS * 32 * 4);

/// Four f32s from `p` (zeros when `!ok`): one 16-byte load when `vector`, else one element
/// at a time, only the first `left` of them.
///
/// # Safety
/// When `ok`: the first `min(4, left)` f32s at `p` exist, and all four (16-byte aligned) when
/// `vector`.
#[inline(always)]
unsafe fn load4(p: u64, ok: bool, vector: bool, left: u64) -> [f32; 4] {
    let mut v = [0.0f32; 4];
    if vector {
        // SAFETY: caller's contract.
        let r = unsafe { ld_v4_if(p, ok) };
        unroll!(l < 4 => { v[l] = f32::from_bits(r[l]); });
    } else {
        unroll!(l < 4 => {
            // SAFETY: caller's contract; element l < left exists.
            v[l] = unsafe { ld_f32_if(p + 4 * l as u64, ok && (l as u64) < left) };
        });
    }
    v
}

/// `v` through an opaque copy: the compiler cannot tell the result equals `v`, so it does not
/// merge computations on it with earlier ones on `v` (see [`bwd_regs`]).
#[inline(always)]
fn opaque_u32(mut v: u32) -> u32 {
    // SAFETY: a register move; no memory access. Not `pure`, so it is not merged either.
    unsafe { asm!("mov.b32 {0}, {0};", inout(reg32) v, options(nomem, nostack, preserves_flags)) };
    v
}
