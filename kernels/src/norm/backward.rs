//! The backward: per row `dx` from the saved `h` and `rstd`, each block's share of `dw` in
//! registers and then in its rows of the workspace, and the fixed-order sum of those rows.

use core::intrinsics::fmaf32;
use core::num::NonZeroU64;

use ferrofuse_common::{
    RMSNORM_BWD_CLUSTER_HEAD_BYTES, RMSNORM_BWD_CLUSTER_PARTIALS_SLOT, RMSNORM_DW_COLS,
    RMSNORM_DW_SLICES, RMSNORM_DW_SMEM_BYTES, RMSNORM_DW_THREADS, RMSNORM_GEMMA,
    RMSNORM_SMEM_BYTES, RMSNORM_W_F32, RmsNormBwdParams, RmsNormDwParams,
    rmsnorm_bwd_fused_dw_by_column, rmsnorm_bwd_fused_dw_groups,
    rmsnorm_bwd_fused_dw_groups_per_block, rmsnorm_bwd_staged_buffers,
};

use super::realign::{self, Shifted, window};
use super::split::{fold_tiles, ring_tile_sum_parts};
use super::{
    MAX_CHUNKS, Me, Path, Row, load_chunk_if, load_w, load_w_if, prefetch_first, store_chunk,
    store_f32s,
};
use crate::cluster;
use crate::mem::{
    Elem, F32, cp_async_4x4_shared_if, cp_async_16_shared_if, cp_async_commit, cp_async_wait_all,
    cp_async_wait_group, div_full, grid, grid_dependency_sync, ld_f32_if, ld_shared_v4, ld_v2_if,
    ld_v4_if, opaque_u32, prefetch_l2, shared_addr, st_shared_v4,
};
use crate::reduce::{row_sum, shfl_idx, shfl_xor, smem_f32, sync_block};

/// Backward, rows of up to 8192 elements: 16 per thread (up to 512 threads per row). Each
/// block walks the row groups `block, block + grid, ...`; each thread keeps its columns'
/// share of `dw` in registers and writes it to its row slot of the workspace at the end.
/// Rows on the 16-byte grid take [`bwd_staged`] with 16-byte copies, f32 rows off it with
/// 4-byte ones in the rows kernel (`PARTIALS`), other rows off it [`bwd_scalar`]; all assign
/// and accumulate elements identically.
///
/// # Safety
/// As for [`fwd_regs`](super::fwd_regs), with [`RmsNormBwdParams`], the backward geometry and
/// [`ferrofuse_common::rmsnorm_bwd_smem_bytes`] of dynamic shared memory.
#[inline(always)]
pub(super) unsafe fn bwd_regs<E: Elem, const M: Path, const PARTIALS: bool>(p: &RmsNormBwdParams) {
    // The staged f32 rows off the grid only in the rows kernel: in the one-launch kernel they
    // were slower than the scalar body (256 x 3071 in graph replay: +18%).
    if M == Path::V16 || (E::BYTES == 4 && PARTIALS) {
        // Rows of more than 128 threads fill a block alone: the row addresses are then
        // uniform (computed once per row for the block, not per thread and chunk), as in the
        // forward.
        if p.rows_per_block == 1 {
            // SAFETY: the caller's contract.
            unsafe { bwd_staged::<E, M, true, PARTIALS, false>(p) }
        } else {
            // SAFETY: the caller's contract.
            unsafe { bwd_staged::<E, M, false, PARTIALS, false>(p) }
        }
    } else {
        // SAFETY: the caller's contract.
        unsafe { bwd_scalar::<E, PARTIALS, false>(p) }
    }
}

/// [`bwd_regs`] on the vector path. Each row's `h`, `dy` and `dres` are copied into shared
/// memory (`cp.async`, through no register) while the row before is computed, and read from
/// there twice: before the reduction for `sum(h * w * dy)` and `dw`, after it for `dx`. A
/// thread copies and reads only its own chunks' slots, so no barrier guards the copies; two
/// row groups' slots alternate (one set where two do not fit: f32 blocks of 512 threads, whose
/// next group is copied once the current one is read). What lives in registers through the
/// reduction is then the weight (the same chunks for every row, loaded once) and the `dw`
/// partials, and with two buffers the next group's bytes are in flight during this one's
/// reduction and stores.
///
/// On the scalar path (f32 only: rows off the 16-byte grid, or operands whose rows start off
/// it) each element is copied on its own (4-byte `cp.async`, into the same slots), and `dx`,
/// the weight and the partials are read and written element by element.
///
/// The same elements are summed in the same order as in [`bwd_scalar`], so both give the same
/// bits.
///
/// # Safety
/// As for [`bwd_regs`], with [`ferrofuse_common::rmsnorm_bwd_smem_bytes`] of dynamic shared
/// memory (`dres`'s buffers included when `p.dres != 0`).
#[inline(always)]
unsafe fn bwd_staged<
    E: Elem,
    const M: Path,
    const ONE_ROW: bool,
    const PARTIALS: bool,
    const CLUSTER: bool,
>(
    p: &RmsNormBwdParams,
) {
    // Element copies are 4 bytes: `bwd_regs` runs 16-bit rows off the grid on `bwd_scalar`
    // (this body is instantiated for them too, never run).
    let k = 16 / E::LANES;
    let (Some(tpr), Some(rpb)) = (
        NonZeroU64::new(p.threads_per_row as u64),
        NonZeroU64::new(p.rows_per_block as u64),
    ) else {
        return;
    };
    let hidden = p.hidden;
    let lanes = E::LANES as u64;
    let nchunks = hidden.div_ceil(lanes);
    let groups = p.rows.div_ceil(rpb.get());
    let has_dres = p.dres != 0;
    let gemma = p.flags & RMSNORM_GEMMA != 0;
    let w_f32 = p.flags & RMSNORM_W_F32 != 0;
    let hidden_f = hidden as f32;
    // Split over a cluster of `blocks` (see `bwd_cluster`): this block's tile of each row
    // (chunks from `first_chunk`), and the cluster's walker, whose rows its blocks take
    // together (below). Otherwise the whole row (`first_chunk` 0), and the block's own row
    // groups. Never 0 (every block is in a cluster of at least itself).
    let Some(blocks) = NonZeroU64::new(if CLUSTER { cluster::size() as u64 } else { 1 }) else {
        return;
    };
    let first_chunk = if CLUSTER {
        cluster::rank() as u64 * tpr.get() * k as u64
    } else {
        0
    };
    // The staged slots: after the reduction buffers (and a cluster's tile-sum slots), per row
    // buffer `b` and operand `o` (h, dy, dres), chunk `j` of every thread, 16 bytes each,
    // consecutive threads side by side (16 bytes apart: the reads are free of bank conflicts).
    // An address only: `dres`'s slots (o = 2) are outside the area when the call has no
    // `dres`, and then neither copied nor read.
    let threads = (tpr.get() * rpb.get()) as u32;
    let operands = 2 + has_dres as u32;
    let head = if CLUSTER {
        RMSNORM_BWD_CLUSTER_HEAD_BYTES
    } else {
        RMSNORM_SMEM_BYTES
    };
    let mine = shared_addr(smem_f32() as *const u32) + head + 16 * grid::thread_x() as u32;
    let slot =
        |b: u32, o: u32, j: usize| mine + ((b * operands + o) * k as u32 + j as u32) * threads * 16;
    let me = Me::new::<ONE_ROW>(tpr);
    let (t, tpr32, r_local) = (me.t as u32, me.tpr as u32, me.r_local as u32);
    let chunk = |j: usize| {
        if CLUSTER {
            first_chunk + (j as u32 * tpr32 + t) as u64
        } else {
            (j as u32 * tpr32 + t) as u64
        }
    };
    let row_of = |g: u64| g * rpb.get() + r_local as u64;
    let at = |base, stride, row| {
        if ONE_ROW {
            Row::hoisted::<E>(base, stride, row)
        } else {
            Row::of(base, stride, row)
        }
    };
    let chunk_addr = |r: Row, c: u64| r.base + (r.index * r.stride + c * lanes) * E::BYTES;
    // Starts the copies of group `g`'s rows into buffer `b` (zeros past the row or for a row
    // past the last) as one copy group; an empty group for a group past the last (the branch
    // is uniform across the block, and skips the addresses, which the few-row calls'
    // critical path would otherwise compute for nothing).
    let copy_rows = |g: u64, b: u32| {
        if g >= groups {
            cp_async_commit();
            return;
        }
        let row = row_of(g);
        let live = row < p.rows;
        let (h_row, dy_row) = (at(p.h, p.h_stride, row), at(p.dy, p.dy_stride, row));
        let dres_row = at(p.dres, p.dres_stride, row);
        unroll!(j < k => {
            let c = chunk(j);
            let ok = live && c < nchunks;
            if M == Path::V16 {
                // SAFETY: when ok, row < rows and c < nchunks: a 16-byte aligned chunk inside
                // the operand (host-checked for the vector path); the slots are this thread's,
                // inside the staging area the host sized (buffers * operands * k * threads
                // slots of 16 bytes). Predicated, not branched: the copies issue back to back.
                unsafe {
                    cp_async_16_shared_if(slot(b, 0, j), chunk_addr(h_row, c), ok, true);
                    cp_async_16_shared_if(slot(b, 1, j), chunk_addr(dy_row, c), ok, true);
                    cp_async_16_shared_if(slot(b, 2, j), chunk_addr(dres_row, c), ok, has_dres);
                }
            } else {
                // The chunk's elements inside the row (0 for a dead row).
                let inside = if ok { (hidden - c * lanes).min(lanes) as u32 } else { 0 };
                // SAFETY: elements c * 4 + l < hidden (l < inside) of row < rows of the
                // operand (f32: 4-byte aligned); the slots as above. Elements past the row are
                // written as zeros.
                unsafe {
                    cp_async_4x4_shared_if(slot(b, 0, j), chunk_addr(h_row, c), inside, true);
                    cp_async_4x4_shared_if(slot(b, 1, j), chunk_addr(dy_row, c), inside, true);
                    cp_async_4x4_shared_if(slot(b, 2, j), chunk_addr(dres_row, c), inside, has_dres);
                }
            }
        });
        cp_async_commit();
    };
    let rstd_of = |g: u64| {
        let row = row_of(g);
        // SAFETY: a row < rows of the rstd column (host-checked).
        unsafe { ld_f32_if(p.rstd + row * p.rstd_stride * 4, g < groups && row < p.rows) }
    };
    // As in fwd_regs.
    prefetch_first(p.dy);
    grid_dependency_sync();

    let (step, mut g) = if CLUSTER {
        (
            cluster_walkers::<PARTIALS>(p, blocks),
            grid::block_x() / blocks,
        )
    } else {
        (grid::grid_dim_x(), grid::block_x())
    };
    // Two row buffers, or one where two do not fit (see rmsnorm_bwd_staged_buffers): the
    // next group is then copied once this thread has read the current one.
    let two = rmsnorm_bwd_staged_buffers(E::BYTES as u32, threads, operands) == 2;
    copy_rows(g, 0);
    if two {
        copy_rows(g + step, 1);
    }
    // The weight of this thread's chunks, the same for every row: widened (and 1 + w for
    // Gemma) once.
    let first_w = if CLUSTER { first_chunk + me.t } else { me.t };
    // SAFETY: the host checked the weight.
    let w = unsafe { load_w::<E, M>(p.w, first_w, me.tpr, k, nchunks, hidden, w_f32, gemma, true) };
    let mut rstd_next = rstd_of(g);
    let mut dw = [[0.0f32; 8]; MAX_CHUNKS];
    // The row buffer, and the reduction buffer (which alternates from one group to the next
    // whatever the row buffers do).
    let (mut b, mut red) = (0u32, 0u32);
    while g < groups {
        let row = row_of(g);
        let live = row < p.rows;
        let rstd = rstd_next;
        rstd_next = rstd_of(g + step);
        if two {
            cp_async_wait_group::<1>();
        } else {
            cp_async_wait_all();
        }
        // g = w * dy; this thread's part of sum(h * g); dw += dy * (h * rstd). Dead rows and
        // chunks past the row are all zeros and change nothing.
        let mut acc = 0.0f32;
        unroll!(j < k => {
            // SAFETY: this thread's slots (inside the area), whose copies have landed (the
            // wait above).
            let (hj, dyj) = unsafe {
                (E::unpack(ld_shared_v4(slot(b, 0, j))), E::unpack(ld_shared_v4(slot(b, 1, j))))
            };
            accumulate::<E>(&hj, &dyj, &w[j], rstd, &mut acc, &mut dw[j]);
        });
        if PARTIALS {
            pin_partials::<E>(&mut dw, k);
        }
        // SAFETY: every thread of the block (of the cluster) runs the same number of
        // iterations (g is per block, per cluster), and the two buffers alternate (see
        // reduce::row_sum and cluster_row_coef).
        let coef = unsafe {
            if CLUSTER {
                cluster_row_coef(acc, &me, red, hidden_f, rstd)
            } else {
                row_coef(acc, &me, red, hidden_f, rstd)
            }
        };
        let dx_row = at(p.dx, p.dx_stride, row);
        unroll!(j < k => {
            let c = chunk(j);
            // SAFETY: as above.
            let (hj, dyj) = unsafe {
                (E::unpack(ld_shared_v4(slot(b, 0, j))), E::unpack(ld_shared_v4(slot(b, 1, j))))
            };
            let mut dx = dx_chunk::<E>(&hj, &dyj, &w[j], rstd, coef);
            if has_dres {
                // SAFETY: as above.
                let dresj = E::unpack(unsafe { ld_shared_v4(slot(b, 2, j)) });
                unroll!(l < E::LANES => { dx[l] += dresj[l]; });
            }
            // SAFETY: as for the copies; dx may be dy or dres, whose chunk was copied already.
            unsafe { store_chunk::<E, M>(dx_row, c, hidden, live && c < nchunks, &dx) };
        });
        // This thread is done with buffer b: the group after next goes there (with one
        // buffer, the next group).
        if two {
            copy_rows(g + 2 * step, b);
            b ^= 1;
        } else {
            copy_rows(g + step, b);
        }
        g += step;
        red ^= 1;
    }
    // The last groups' copies were empty; nothing is left in flight past the kernel.
    cp_async_wait_all();
    if CLUSTER {
        // No block exits (releasing its shared memory) while another may still read its
        // tile sums.
        // SAFETY: every thread of the cluster arrives and waits here once, after the same
        // number of rows.
        unsafe {
            cluster::arrive();
            cluster::wait();
        }
    }
    if !PARTIALS {
        return;
    }
    // This row slot's partial dw, a row of the f32 workspace. Its address is formed here,
    // from opaque copies of the thread's place: the compiler would otherwise reuse values of
    // the first iteration (the slot's row is the block's first row) and hold them, spilled,
    // through the loop.
    let (t, r_local) = (opaque_u32(t), opaque_u32(r_local));
    let slot_row = if CLUSTER {
        grid::block_x() / blocks
    } else {
        grid::block_x() * rpb.get() + r_local as u64
    };
    unroll!(j < k => {
        let c = (j as u32 * tpr32 + t) as u64;
        let c = if CLUSTER { first_chunk + c } else { c };
        // SAFETY: slot_row < the workspace's slot rows (host-sized: grid * rows_per_block, or
        // a cluster's walkers); on the vector path row offsets slot_row * hidden * 4 are
        // 16-byte multiples (L divides hidden).
        unsafe { store_f32s::<M>(p.workspace, slot_row * hidden + c * lanes, c * lanes, hidden, E::LANES, c < nchunks, &dw[j]) };
    });
}

/// [`bwd_regs`] on the scalar path (rows off the 16-byte grid, or operands whose rows start
/// off it). 16-bit rows: every operand's row is read as the aligned 16-byte vectors that lie
/// wholly inside it (chunk `c` is the end of vector `c` and the start of vector `c + 1`, put
/// together in registers: [`window`]); a chunk that needs a vector straddling an end of the
/// row is read element by element (at most the first and the last chunks of a row), so
/// nothing outside the row is read; `dx` is stored by aligned vector
/// ([`realign::store_chunk`]), and the block's next row is prefetched into L2. f32 rows (in
/// the one-launch kernel; the rows kernel stages them): one 4-byte access per element. The
/// weight is staged once per block in shared memory, as f32.
/// A row's `h` and `dy` stay as loaded (raw storage bits, half the registers of f32 for
/// 16-bit dtypes) through the reduction and are widened where used, before it for
/// `sum(h * w * dy)` and `dw`, again after it for `dx`; `dres` is read after the reduction,
/// one chunk at a time.
///
/// # Safety
/// As for [`bwd_regs`].
#[inline(always)]
unsafe fn bwd_scalar<E: Elem, const PARTIALS: bool, const CLUSTER: bool>(p: &RmsNormBwdParams) {
    let k = 16 / E::LANES;
    let (Some(tpr), Some(rpb)) = (
        NonZeroU64::new(p.threads_per_row as u64),
        NonZeroU64::new(p.rows_per_block as u64),
    ) else {
        return;
    };
    let me = Me::new::<false>(tpr);
    // Rows of the E16 geometry hold at most 8192 elements, and split rows at most
    // `RMSNORM_BWD_MAX_CLUSTER` tiles of it: chunk indices fit 32 bits.
    let hidden = p.hidden;
    let lanes = E::LANES as u64;
    let nchunks = hidden.div_ceil(lanes);
    let groups = p.rows.div_ceil(rpb.get());
    let has_dres = p.dres != 0;
    let gemma = p.flags & RMSNORM_GEMMA != 0;
    let w_f32 = p.flags & RMSNORM_W_F32 != 0;
    let hidden_f = hidden as f32;
    // Split over a cluster of `blocks`: as in `bwd_staged`. A vector that straddles two tiles
    // is stored element by element by both blocks (`realign::store_chunk` at lanes 31 and 0);
    // the left block's reads of it (`dres` after the cluster barrier, while the right block
    // may be storing `dx` over it) use only the elements of its own chunk. Never 0 (every
    // block is in a cluster of at least itself).
    let Some(blocks) = NonZeroU64::new(if CLUSTER { cluster::size() as u64 } else { 1 }) else {
        return;
    };
    let first_chunk = if CLUSTER {
        cluster::rank() as u64 * me.tpr * k as u64
    } else {
        0
    };
    let chunk = |j: usize| {
        if CLUSTER {
            (first_chunk + j as u64 * me.tpr + me.t) as u32
        } else {
            (j as u64 * me.tpr + me.t) as u32
        }
    };
    // 16-bit rows are read and written by aligned vector; f32 rows element by element (four
    // 4-byte accesses per chunk): read by vector, their four chunks per thread held two
    // vectors each in flight, more registers than 128, and ran 20-28% slower.
    const { assert!(E::BYTES == 2 || E::BYTES == 4) };
    let by_vector = E::BYTES == 2;
    // As in fwd_regs.
    prefetch_first(p.dy);
    grid_dependency_sync();

    // The weight, the same for every row, widened (and 1 + w for Gemma) once per block into
    // shared memory after the reduction buffers (see rmsnorm_bwd_scalar_weight_bytes): the
    // f32 vector `q < L / 4` of chunk slot `j` of thread `t` of a row at vector index
    // `(j * L / 4 + q) * tpr + t`, so that a warp's reads are consecutive vectors. Held in
    // registers, or read per row, the weight's loads took more registers than a 512-thread
    // block has. The first row's threads stage it, every row's threads read it.
    let vectors = E::LANES / 4;
    let head = if CLUSTER {
        RMSNORM_BWD_CLUSTER_HEAD_BYTES
    } else {
        RMSNORM_SMEM_BYTES
    };
    let w_vector = |j: usize, q: usize| {
        let v = (j * vectors + q) as u64 * me.tpr + me.t;
        shared_addr(smem_f32() as *const u32) + head + v as u32 * 16
    };
    if me.r_local == 0 {
        let first_w = if CLUSTER { first_chunk + me.t } else { me.t };
        // SAFETY: the host checked the weight.
        let wr = unsafe { load_w_raw::<E>(p.w, first_w, me.tpr, k, nchunks, hidden, w_f32, true) };
        unroll!(j < k => {
            let wj = w_of::<E>(&wr[j], w_f32, gemma);
            unroll!(q < 2 => { if q < vectors {
                let bits = [wj[4 * q].to_bits(), wj[4 * q + 1].to_bits(), wj[4 * q + 2].to_bits(), wj[4 * q + 3].to_bits()];
                // SAFETY: this thread's vectors of the area the host sized; read after the
                // barrier below.
                unsafe { st_shared_v4(w_vector(j, q), bits) };
            } });
        });
    }
    sync_block();
    let w_of_chunk = |j: usize| {
        let mut w = [0.0f32; 8];
        unroll!(q < 2 => { if q < vectors {
            // SAFETY: staged above, before the barrier.
            let bits = unsafe { ld_shared_v4(w_vector(j, q)) };
            unroll!(l < 4 => { w[4 * q + l] = f32::from_bits(bits[l]); });
        } });
        w
    };

    let mut dw = [[0.0f32; 8]; MAX_CHUNKS];
    let (step, mut g) = if CLUSTER {
        (
            cluster_walkers::<PARTIALS>(p, blocks),
            grid::block_x() / blocks,
        )
    } else {
        (grid::grid_dim_x(), grid::block_x())
    };
    let mut buf = 0u32;
    while g < groups {
        let row = g * rpb.get() + me.r_local;
        let live = row < p.rows;
        let h_row = Shifted::of::<E>(p.h, p.h_stride, row);
        let dy_row = Shifted::of::<E>(p.dy, p.dy_stride, row);
        let dres_row = Shifted::of::<E>(p.dres, p.dres_stride, row);
        let dx_row = Shifted::of::<E>(p.dx, p.dx_stride, row);
        let mut h_vec = [[[0u32; 4]; 2]; MAX_CHUNKS];
        let mut dy_vec = [[[0u32; 4]; 2]; MAX_CHUNKS];
        // SAFETY: when live, row < rows: inside every operand (host-checked).
        let rstd = unsafe { ld_f32_if(p.rstd + row * p.rstd_stride * 4, live) };
        let mut h = [[0u32; 4]; MAX_CHUNKS];
        let mut dy = [[0u32; 4]; MAX_CHUNKS];
        // Every load of the row first, then (vectors) the chunks put together.
        unroll!(j < k => {
            let c = chunk(j);
            let ok = live && (c as u64) < nchunks;
            // SAFETY: when ok, row < rows and c < nchunks: chunk c of a row of the operand.
            unsafe {
                if by_vector {
                    h_vec[j] = load_vectors::<E>(h_row, c, hidden as u32, ok);
                    dy_vec[j] = load_vectors::<E>(dy_row, c, hidden as u32, ok);
                } else {
                    h[j] = load_elements::<E>(h_row, c, hidden as u32, ok);
                    dy[j] = load_elements::<E>(dy_row, c, hidden as u32, ok);
                }
            }
        });
        // 16-bit rows: the block's next row into L2 while this one is computed (with 512
        // threads of up to 128 registers a multiprocessor holds one row at a time, and a
        // prefetch holds no register). f32 rows ran 9-16% slower with it.
        let next = row + step * rpb.get();
        if by_vector && next < p.rows {
            unroll!(j < k => {
                let c = chunk(j) as u64;
                if c < nchunks {
                    let at = |base: u64, stride: u64| base + (next * stride + c * lanes) * E::BYTES;
                    // SAFETY: column c * L < hidden of row next < rows of each operand.
                    unsafe {
                        prefetch_l2(at(p.h, p.h_stride));
                        prefetch_l2(at(p.dy, p.dy_stride));
                        if has_dres {
                            prefetch_l2(at(p.dres, p.dres_stride));
                        }
                    }
                }
            });
        }
        if by_vector {
            unroll!(j < k => {
                let c = chunk(j);
                let ok = live && (c as u64) < nchunks;
                // SAFETY: as for the vector loads.
                unsafe {
                    h[j] = chunk_of_vectors::<E>(h_row, c, hidden as u32, ok, h_vec[j]);
                    dy[j] = chunk_of_vectors::<E>(dy_row, c, hidden as u32, ok, dy_vec[j]);
                }
            });
        }
        // g = w * dy; this thread's part of sum(h * g); dw += dy * (h * rstd). Dead rows and
        // chunks past the row are all zeros and change nothing.
        let mut acc = 0.0f32;
        unroll!(j < k => {
            let hj = E::unpack(h[j]);
            let dyj = E::unpack(dy[j]);
            let wj = w_of_chunk(j);
            accumulate::<E>(&hj, &dyj, &wj, rstd, &mut acc, &mut dw[j]);
        });
        if PARTIALS {
            pin_partials::<E>(&mut dw, k);
        }
        // SAFETY: every thread of the block (of the cluster) runs the same number of
        // iterations (g is per block, per cluster), and the two buffers alternate (see
        // reduce::row_sum and cluster_row_coef).
        let coef = unsafe {
            if CLUSTER {
                cluster_row_coef(acc, &me, buf, hidden_f, rstd)
            } else {
                row_coef(acc, &me, buf, hidden_f, rstd)
            }
        };
        // The raw bits pass through an opaque copy, so that the compiler widens them again
        // here instead of keeping the f32 values of the first widening alive through the
        // reduction (twice the registers for 16-bit dtypes).
        let h = opaque(h, k);
        let dy = opaque(dy, k);
        unroll!(j < k => {
            let c = chunk(j);
            let ok = live && (c as u64) < nchunks;
            let hj = E::unpack(h[j]);
            let dyj = E::unpack(dy[j]);
            // dres is loaded here, one chunk at a time: its loads held through the reduction
            // took more registers than a 512-thread block allows.
            // SAFETY: as for the loads above.
            let dresj = E::unpack(unsafe {
                if by_vector {
                    let v = load_vectors::<E>(dres_row, c, hidden as u32, ok && has_dres);
                    chunk_of_vectors::<E>(dres_row, c, hidden as u32, ok && has_dres, v)
                } else {
                    load_elements::<E>(dres_row, c, hidden as u32, ok && has_dres)
                }
            });
            let wj = w_of_chunk(j);
            let mut dx = dx_chunk::<E>(&hj, &dyj, &wj, rstd, coef);
            if has_dres {
                unroll!(l < E::LANES => { dx[l] += dresj[l]; });
            }
            // SAFETY: as above; every lane calls it, and chunk c's neighbours c - 1 and c + 1
            // are the neighbouring lanes (rows are whole warps). dx may be dy or dres: every
            // element of the row that this store's vectors cover was read, by its owner,
            // before (dy before the reduction; dres of chunk c - 1 by the left lane before the
            // shuffle inside, which needs its dx).
            unsafe {
                if by_vector {
                    realign::store_chunk::<E>(dx_row, c, hidden as u32, ok, me.lane, &dx);
                } else {
                    store_chunk::<E, { Path::Scalar }>(Row::of(p.dx, p.dx_stride, row), c as u64, hidden, ok, &dx);
                }
            }
        });
        g += step;
        buf ^= 1;
    }
    if CLUSTER {
        // As in `bwd_staged`.
        // SAFETY: every thread of the cluster arrives and waits here once, after the same
        // number of rows.
        unsafe {
            cluster::arrive();
            cluster::wait();
        }
    }
    if !PARTIALS {
        return;
    }
    // This row slot's partial dw, a row of the f32 workspace.
    let slot = if CLUSTER {
        grid::block_x() / blocks
    } else {
        grid::block_x() * rpb.get() + me.r_local
    };
    unroll!(j < k => {
        let c = chunk(j) as u64;
        // SAFETY: slot < the workspace's slot rows (host-sized: grid * rows_per_block, or a
        // cluster's walkers).
        unsafe { store_f32s::<{ Path::Scalar }>(p.workspace, slot * hidden + c * lanes, c * lanes, hidden, E::LANES, c < nchunks, &dw[j]) };
    });
}

/// The aligned vectors chunk `c` of the row `at` is made of, when they lie wholly inside the
/// row: vector `c`, and vector `c + 1` when the row is off the grid (zeros otherwise, and for
/// both when `!ok`). [`chunk_of_vectors`] puts the chunk together.
///
/// # Safety
/// When `ok`, `at` is a row of `hidden` elements of a checked operand and `c` a chunk of it.
#[inline(always)]
unsafe fn load_vectors<T: Elem>(at: Shifted, c: u32, hidden: u32, ok: bool) -> [[u32; 4]; 2] {
    let lo_ok = ok && at.whole::<T>(c, hidden);
    let hi_ok = ok && at.m != 0 && at.whole::<T>(c + 1, hidden);
    // SAFETY: whole vectors of the row, at 16-byte boundaries.
    unsafe {
        [
            ld_v4_if(at.base + c as u64 * 16, lo_ok),
            ld_v4_if(at.base + (c as u64 + 1) * 16, hi_ok),
        ]
    }
}

/// Chunk `c` of the row `at` as raw storage bits (what [`Elem::unpack`] widens; zeros past the
/// row or when `!ok`) from its vectors as [`load_vectors`] read them; where one of them
/// straddles an end of the row, element by element instead (a branch: at most the row's first
/// and last chunks take it).
///
/// # Safety
/// As for [`load_vectors`].
#[inline(always)]
unsafe fn chunk_of_vectors<T: Elem>(
    at: Shifted,
    c: u32,
    hidden: u32,
    ok: bool,
    v: [[u32; 4]; 2],
) -> [u32; 4] {
    let whole = at.whole::<T>(c, hidden) && (at.m == 0 || at.whole::<T>(c + 1, hidden));
    if !ok || whole {
        return window::<T>(v[0], v[1], at.m);
    }
    // SAFETY: the caller's contract.
    unsafe { load_elements::<T>(at, c, hidden, true) }
}

/// Chunk `c` of the row `at` as raw storage bits, or zeros when `!ok`: one predicated load
/// per element (columns past the row stay 0), the raw bits put where a vector load would
/// have put them.
///
/// # Safety
/// As for [`load_vectors`].
#[inline(always)]
unsafe fn load_elements<T: Elem>(at: Shifted, c: u32, hidden: u32, ok: bool) -> [u32; 4] {
    let mut r = [0u32; 4];
    unroll!(l < T::LANES => {
        let col = c * T::LANES as u32 + l as u32;
        // SAFETY: column col < hidden of a row inside the matrix (the caller's contract).
        let b = unsafe { T::load_bits_if(at.base + (at.m + col) as u64 * T::BYTES, ok && col < hidden) };
        if T::LANES == 8 {
            r[l / 2] |= b << (16 * (l % 2));
        } else {
            r[l] = b;
        }
    });
    r
}

/// One chunk's part of a row's `sum(h * g)` (`g = w * dy`, `w` the f32 factor of
/// [`w_of`]) added to `acc`, and its `dw += dy * (h * rstd)`. Dead rows and chunks past the row
/// are all zeros and change neither.
#[inline(always)]
fn accumulate<E: Elem>(
    h: &[f32; 8],
    dy: &[f32; 8],
    w: &[f32; 8],
    rstd: f32,
    acc: &mut f32,
    dw: &mut [f32; 8],
) {
    unroll!(l < E::LANES => {
        *acc = fmaf32(h[l], w[l] * dy[l], *acc);
        dw[l] = fmaf32(dy[l], h[l] * rstd, dw[l]);
    });
}

/// The `dw` partials through an opaque copy, before the reduction: otherwise the compiler
/// sinks their update past it and keeps the row's widened `h` and `dy` alive through it.
#[inline(always)]
fn pin_partials<E: Elem>(dw: &mut [[f32; 8]; MAX_CHUNKS], k: usize) {
    unroll!(j < k => { unroll!(l < E::LANES => {
        dw[j][l] = f32::from_bits(opaque_u32(dw[j][l].to_bits()));
    }); });
}

/// The row's `rstd^2 * sum(h * g) / hidden` from this thread's part `acc` of the sum.
///
/// # Safety
/// As for [`row_sum`]: every thread of the block calls it, alternating `buf`.
#[inline(always)]
unsafe fn row_coef(acc: f32, me: &Me, buf: u32, hidden: f32, rstd: f32) -> f32 {
    // SAFETY: the caller's contract.
    let total = unsafe { row_sum(acc, me.lane, me.warp, me.warps, me.slot(buf)) };
    div_full(total, hidden) * (rstd * rstd)
}

/// A long row's `rstd^2 * sum(h * g) / hidden` from the row's sum (the looped and the
/// cluster-split kernels: one expression, so the same bits).
#[inline(always)]
fn long_row_coef(total: f32, hidden: f32, rstd: f32) -> f32 {
    (total / hidden) * (rstd * rstd)
}

/// [`row_coef`] for a row split over a cluster ([`bwd_cluster`]): this block's tile sum
/// (`row_sum` of `acc`, as the looped kernel sums a tile) in tile-sum slot `parity`, the
/// cluster barrier, then every warp gathers the cluster's tile sums (lane `i`: block `i`'s)
/// and folds them in tile order from 0, as the looped kernel does.
///
/// Slot `parity` is written again two rows later, after the next row's cluster barrier, which
/// every block reaches only after reading this row's sums.
///
/// # Safety
/// Every thread of every block of the cluster calls it once per row, alternating `parity`;
/// the launch has [`RMSNORM_BWD_CLUSTER_HEAD_BYTES`] of dynamic shared memory at least, and
/// every block waits at the cluster barrier once more before it exits.
#[inline(always)]
unsafe fn cluster_row_coef(acc: f32, me: &Me, parity: u32, hidden: f32, rstd: f32) -> f32 {
    // SAFETY: the caller's contract (every thread of the block, buffers alternating).
    let tile = unsafe { row_sum(acc, me.lane, me.warp, me.warps, me.slot(parity)) };
    // SAFETY: slot PARTIALS + parity < PARTIALS + 2, inside the head bytes.
    let slot = unsafe { smem_f32().add((RMSNORM_BWD_CLUSTER_PARTIALS_SLOT + parity) as usize) };
    if me.t == 0 {
        // SAFETY: as above; no block reads it before the barrier below.
        unsafe { *slot = tile };
    }
    // SAFETY: every thread of every block of the cluster arrives and waits (the caller's
    // contract).
    unsafe {
        cluster::arrive();
        cluster::wait();
    }
    let blocks = cluster::size();
    let mine = if me.lane < blocks {
        // SAFETY: block `lane` < the cluster's size has not exited (it waits at the cluster
        // barrier before exiting); its slot was written before the barrier.
        unsafe { cluster::read_remote(slot, me.lane) }
    } else {
        0.0
    };
    let mut total = 0.0f32;
    let mut i = 0u32;
    while i < blocks {
        total = fold_tiles(total, shfl_idx(mine, i));
        i += 1;
    }
    long_row_coef(total, hidden, rstd)
}

/// One chunk of `dx = rstd * (w * dy - h * coef)` (the caller adds `dres`).
#[inline(always)]
fn dx_chunk<E: Elem>(h: &[f32; 8], dy: &[f32; 8], w: &[f32; 8], rstd: f32, coef: f32) -> [f32; 8] {
    let mut dx = [0.0f32; 8];
    unroll!(l < E::LANES => { dx[l] = rstd * (w[l] * dy[l] - h[l] * coef); });
    dx
}

/// The raw weight of a thread's `k` chunks `first + j * tpr`: per chunk, the storage dtype's
/// vector in words 0-3, or with an f32 weight the `L` f32s' bits in words `0..L`; zeros for
/// chunks past the row or when `!ok`. [`w_of`] widens one chunk. Read as the 16-bit row
/// operands are ([`load_vectors`]), every vector load first, then the chunks put together;
/// once per block (the staged weight of [`bwd_scalar`]).
///
/// # Safety
/// `w` holds `hidden` elements of its dtype (host-checked).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn load_w_raw<E: Elem>(
    w: u64,
    first: u64,
    tpr: u64,
    k: usize,
    nchunks: u64,
    hidden: u64,
    w_f32: bool,
    ok: bool,
) -> [[u32; 8]; MAX_CHUNKS] {
    let mut v = [[0u32; 8]; MAX_CHUNKS];
    let chunk = |j: usize| first + j as u64 * tpr;
    if w_f32 {
        // A chunk of L elements is L / 4 chunks of f32 (pieces): 2 for 16-bit dtypes.
        let pieces = E::LANES / 4;
        let at = Shifted::of::<F32>(w, 0, 0);
        let piece = |j: usize, q: usize| {
            (
                chunk(j) as u32 * pieces as u32 + q as u32,
                ok && chunk(j) < nchunks,
            )
        };
        let mut vectors = [[[[0u32; 4]; 2]; 2]; MAX_CHUNKS];
        unroll!(j < k => { unroll!(q < 2 => { if q < pieces {
            let (c, ok) = piece(j, q);
            // SAFETY: when ok, f32 chunk c of the weight's one row.
            vectors[j][q] = unsafe { load_vectors::<F32>(at, c, hidden as u32, ok) };
        } }); });
        unroll!(j < k => { unroll!(q < 2 => { if q < pieces {
            let (c, ok) = piece(j, q);
            // SAFETY: as above.
            let r = unsafe { chunk_of_vectors::<F32>(at, c, hidden as u32, ok, vectors[j][q]) };
            unroll!(l < 4 => { v[j][4 * q + l] = r[l]; });
        } }); });
    } else {
        let at = Shifted::of::<E>(w, 0, 0);
        let mut vectors = [[[0u32; 4]; 2]; MAX_CHUNKS];
        unroll!(j < k => {
            let ok = ok && chunk(j) < nchunks;
            // SAFETY: when ok, chunk c of the weight's one row.
            vectors[j] = unsafe { load_vectors::<E>(at, chunk(j) as u32, hidden as u32, ok) };
        });
        unroll!(j < k => {
            let ok = ok && chunk(j) < nchunks;
            // SAFETY: as above.
            let r = unsafe { chunk_of_vectors::<E>(at, chunk(j) as u32, hidden as u32, ok, vectors[j]) };
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

/// Backward for rows longer than 8192 elements that the cluster split does not take
/// (`NormBwdVariant::Loop`; tiles of 256 threads x 16 elements). Phase A: per row, the
/// coefficient `rstd^2 * sum(h*g) / hidden`, kept in the workspace after the partials. Phase B:
/// tile by tile, `dx` for every row of the block and the tile's `dw` partial in registers.
/// [`bwd_loop_tiles`] runs the rows the split takes.
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
                    h[j] = load_chunk_if::<E, M>(h_row, c, hidden, ok);
                    dy[j] = load_chunk_if::<E, M>(dy_row, c, hidden, ok);
                }
            });
            // SAFETY: the host checked the weight.
            let w =
                unsafe { load_w_if::<E, M>(p.w, first, me.tpr, k, nchunks, hidden, w_f32, gemma) };
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
        let w = unsafe { load_w_if::<E, M>(p.w, first, me.tpr, k, nchunks, hidden, w_f32, gemma) };
        let mut dw = [[0.0f32; 8]; MAX_CHUNKS];
        let mut g = grid::block_x();
        while g < groups {
            let row = g * rpb.get() + me.r_local;
            if row < p.rows {
                // SAFETY: row < rows; its coefficient was stored in phase A (same block).
                unsafe { loop_row_dx::<E, M>(p, row, coef_base, first, me.tpr, &w, &mut dw) };
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

/// Phase B of the looped backward for one row: `dx` of the chunks `first + j * stride` (`j <
/// 16 / L`), `w` their weight, and their `dw` partials updated.
///
/// # Safety
/// As for [`bwd_loop`]; `row < rows`, whose coefficient is at `coef_base + row * 4`.
#[inline(always)]
unsafe fn loop_row_dx<E: Elem, const M: Path>(
    p: &RmsNormBwdParams,
    row: u64,
    coef_base: u64,
    first: u64,
    stride: u64,
    w: &[[f32; 8]; MAX_CHUNKS],
    dw: &mut [[f32; 8]; MAX_CHUNKS],
) {
    // SAFETY: row < rows; the coefficient was stored (the caller's contract).
    let (rstd, coef) = unsafe {
        (
            F32::load(p.rstd + row * p.rstd_stride * 4),
            F32::load(coef_base + row * 4),
        )
    };
    // SAFETY: the caller's contract.
    unsafe { row_dx::<E, M>(p, row, rstd, coef, first, stride, w, dw) }
}

/// [`loop_row_dx`] with the row's `rstd` and coefficient given.
///
/// # Safety
/// As for [`loop_row_dx`]; `row < rows`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn row_dx<E: Elem, const M: Path>(
    p: &RmsNormBwdParams,
    row: u64,
    rstd: f32,
    coef: f32,
    first: u64,
    stride: u64,
    w: &[[f32; 8]; MAX_CHUNKS],
    dw: &mut [[f32; 8]; MAX_CHUNKS],
) {
    let k = 16 / E::LANES;
    let hidden = p.hidden;
    let nchunks = hidden.div_ceil(E::LANES as u64);
    let has_dres = p.dres != 0;
    let h_row = Row::of(p.h, p.h_stride, row);
    let dy_row = Row::of(p.dy, p.dy_stride, row);
    let dres_row = Row::of(p.dres, p.dres_stride, row);
    let dx_row = Row::of(p.dx, p.dx_stride, row);
    let mut h = [[0.0f32; 8]; MAX_CHUNKS];
    let mut dy = [[0.0f32; 8]; MAX_CHUNKS];
    let mut dres = [[0.0f32; 8]; MAX_CHUNKS];
    unroll!(j < k => {
        let c = first + j as u64 * stride;
        let ok = c < nchunks;
        // SAFETY: row < rows; when ok, c < nchunks.
        unsafe {
            h[j] = load_chunk_if::<E, M>(h_row, c, hidden, ok);
            dy[j] = load_chunk_if::<E, M>(dy_row, c, hidden, ok);
            dres[j] = load_chunk_if::<E, M>(dres_row, c, hidden, ok && has_dres);
        }
    });
    unroll!(j < k => {
        let c = first + j as u64 * stride;
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

/// Backward for the rows longer than 8192 elements that the cluster split takes
/// (`rmsnorm_bwd_cluster_fits`), looped, where clusters are not run: one block per row walker
/// (`rmsnorm_bwd_walkers`: block `i` takes rows `i, i + grid, ...`). Phase A: per row, the
/// coefficient `rstd^2 * sum(h*g) / hidden`, kept in the workspace after the partials. Phase
/// B: part-tile by part-tile, `dx` for every row of the block and the part's `dw` partial in
/// registers.
///
/// The row's sum has the shape that [`bwd_cluster`] computes: per tile of `RMSNORM_BWD_TILE`
/// elements, each of 512 threads' `fma` chain over its chunks, summed as `row_sum` sums a
/// 512-thread block, the tiles' sums folded in tile order. Each thread here is the tile's
/// threads `t` and `256 + t` (two parts, two chains, combined by [`ring_tile_sum_parts`]);
/// `dx`, the coefficient and the partials are the same expressions, in the same row order, so
/// the two kernels give the same bits.
///
/// # Safety
/// As for [`bwd_regs`], with blocks of `RMSNORM_BWD_LOOP_THREADS` threads and
/// `RMSNORM_LOOP_SMEM_BYTES` of dynamic shared memory; the workspace also holds one f32 per
/// row after the partials.
#[inline(always)]
pub(super) unsafe fn bwd_loop_tiles<E: Elem, const M: Path>(p: &RmsNormBwdParams) {
    const PARTS: usize = 2;
    let k = 16 / E::LANES;
    let Some(tpr) = NonZeroU64::new(p.threads_per_row as u64) else {
        return;
    };
    let me = Me::new::<true>(tpr);
    let hidden = p.hidden;
    let lanes = E::LANES as u64;
    let nchunks = hidden.div_ceil(lanes);
    // Part `s` of this thread is the tile's thread `s * tpr + t`: its chunks of tile `i` are
    // `first(i, s) + j * stride`.
    let stride = PARTS as u64 * me.tpr;
    let per_tile = stride * k as u64;
    let tiles = nchunks.div_ceil(per_tile);
    let first = |tile: u64, s: u64| tile * per_tile + s * me.tpr + me.t;
    let rows = p.rows;
    let step = grid::grid_dim_x();
    let coef_base = p.workspace + step * hidden * 4;
    let gemma = p.flags & RMSNORM_GEMMA != 0;
    let w_f32 = p.flags & RMSNORM_W_F32 != 0;
    let hidden_f = hidden as f32;
    // As in fwd_regs.
    prefetch_first(p.dy);
    grid_dependency_sync();

    // Phase A.
    let mut row = grid::block_x();
    while row < rows {
        let h_row = Row::of(p.h, p.h_stride, row);
        let dy_row = Row::of(p.dy, p.dy_stride, row);
        let mut sum = 0.0f32;
        let mut tile = 0u64;
        while tile < tiles {
            let mut h = [[[0.0f32; 8]; MAX_CHUNKS]; PARTS];
            let mut dy = [[[0.0f32; 8]; MAX_CHUNKS]; PARTS];
            unroll!(s < PARTS => { unroll!(j < k => {
                let c = first(tile, s as u64) + j as u64 * stride;
                let ok = c < nchunks;
                // SAFETY: row < rows; when ok, c < nchunks (host-checked extents).
                unsafe {
                    h[s][j] = load_chunk_if::<E, M>(h_row, c, hidden, ok);
                    dy[s][j] = load_chunk_if::<E, M>(dy_row, c, hidden, ok);
                }
            }); });
            let mut acc = [0.0f32; PARTS];
            unroll!(s < PARTS => {
                // SAFETY: the host checked the weight.
                let w = unsafe {
                    load_w_if::<E, M>(p.w, first(tile, s as u64), stride, k, nchunks, hidden, w_f32, gemma)
                };
                unroll!(j < k => {
                    unroll!(l < E::LANES => {
                        acc[s] = fmaf32(h[s][j][l], w[j][l] * dy[s][j][l], acc[s]);
                    });
                });
            });
            // SAFETY: every thread of the block calls it for every tile of the row in order
            // (256 threads holding a tile's 512 as two parts, the ring's shared memory).
            sum = unsafe { ring_tile_sum_parts::<PARTS>(sum, acc, &me, tile, tiles) };
            tile += 1;
        }
        if me.t == 0 {
            // SAFETY: row < rows; the host sized the workspace with one f32 per row here.
            unsafe {
                let rstd = F32::load(p.rstd + row * p.rstd_stride * 4);
                F32::store(coef_base + row * 4, long_row_coef(sum, hidden_f, rstd));
            }
        }
        row += step;
    }
    // The coefficients were stored by thread 0 of each row; the barrier makes them visible
    // to the rest of the block (and keeps the loads below after the stores).
    sync_block();

    // Phase B.
    let slot = grid::block_x();
    let mut part = 0u64;
    while part < PARTS as u64 * tiles {
        let first = first(part / PARTS as u64, part % PARTS as u64);
        // SAFETY: the host checked the weight.
        let w = unsafe { load_w_if::<E, M>(p.w, first, stride, k, nchunks, hidden, w_f32, gemma) };
        let mut dw = [[0.0f32; 8]; MAX_CHUNKS];
        let mut row = grid::block_x();
        while row < rows {
            // SAFETY: row < rows; its coefficient was stored in phase A (same block).
            unsafe { loop_row_dx::<E, M>(p, row, coef_base, first, stride, &w, &mut dw) };
            row += step;
        }
        unroll!(j < k => {
            let c = first + j as u64 * stride;
            // SAFETY: as in `bwd_regs`.
            unsafe { store_f32s::<M>(p.workspace, slot * hidden + c * lanes, c * lanes, hidden, E::LANES, c < nchunks, &dw[j]) };
        });
        part += 1;
    }
}

/// Where a block of the tile passes works: block `b` is tile `b % tiles` of row (first pass)
/// or walker (second pass) `outer = b / tiles`, its thread's first chunk `first` (the tile's
/// 512 threads as a block of the cluster split holds them); `sums`, the tile sums' address
/// after the walkers' partial rows.
struct TileBlock {
    me: Me,
    nchunks: u64,
    tiles: u64,
    outer: u64,
    first: u64,
    sums: u64,
}

impl TileBlock {
    /// This block's place; `None` for a launch of no threads per row or an empty row.
    #[inline(always)]
    fn of<E: Elem>(p: &RmsNormBwdParams) -> Option<Self> {
        let k = 16 / E::LANES;
        let me = Me::new::<true>(NonZeroU64::new(p.threads_per_row as u64)?);
        let nchunks = p.hidden.div_ceil(E::LANES as u64);
        let per_tile = me.tpr * k as u64;
        let tiles = NonZeroU64::new(nchunks.div_ceil(per_tile))?;
        let b = grid::block_x();
        Some(TileBlock {
            nchunks,
            tiles: tiles.get(),
            outer: b / tiles,
            first: (b % tiles) * per_tile + me.t,
            sums: p.workspace + p.dw_slots as u64 * p.hidden * 4,
            me,
        })
    }
}

/// The weight of a tile-pass thread's chunks `first + j * stride`, widened (`1 + w` for
/// Gemma).
///
/// # Safety
/// The host checked the weight.
#[inline(always)]
unsafe fn tile_weight<E: Elem, const M: Path>(
    p: &RmsNormBwdParams,
    first: u64,
    stride: u64,
    nchunks: u64,
) -> [[f32; 8]; MAX_CHUNKS] {
    let gemma = p.flags & RMSNORM_GEMMA != 0;
    let w_f32 = p.flags & RMSNORM_W_F32 != 0;
    let k = 16 / E::LANES;
    // SAFETY: the caller's contract.
    unsafe { load_w_if::<E, M>(p.w, first, stride, k, nchunks, p.hidden, w_f32, gemma) }
}

/// First of the tile passes (the rows the cluster split takes, without clusters): block `b`
/// is row `b / tiles`'s tile `b % tiles`, whose sum of `h * g` it computes as a block of the
/// split computes it (each of 512 threads' `fma` chain over its chunks in chunk order, then
/// `row_sum`), and stores at slot `b` of the tile sums, after the walkers' partials.
///
/// # Safety
/// Launched with `rows * tiles` blocks of `RMSNORM_BWD_MAX_THREADS_PER_ROW` threads and
/// `RMSNORM_SMEM_BYTES` of dynamic shared memory, `p.dw_slots` the tile passes' walkers, the
/// workspace sized for their partials and tile sums; otherwise as for [`bwd_regs`].
#[inline(always)]
pub(super) unsafe fn bwd_tile_sums<E: Elem, const M: Path>(p: &RmsNormBwdParams) {
    let k = 16 / E::LANES;
    // The grid is `rows * tiles` blocks: the row is < rows.
    let Some(TileBlock {
        me,
        nchunks,
        outer: row,
        first,
        sums,
        ..
    }) = TileBlock::of::<E>(p)
    else {
        return;
    };
    let hidden = p.hidden;
    // As in fwd_regs.
    prefetch_first(p.dy);
    grid_dependency_sync();
    let h_row = Row::of(p.h, p.h_stride, row);
    let dy_row = Row::of(p.dy, p.dy_stride, row);
    let mut h = [[0.0f32; 8]; MAX_CHUNKS];
    let mut dy = [[0.0f32; 8]; MAX_CHUNKS];
    unroll!(j < k => {
        let c = first + j as u64 * me.tpr;
        let ok = c < nchunks;
        // SAFETY: row < rows; when ok, c < nchunks (host-checked extents).
        unsafe {
            h[j] = load_chunk_if::<E, M>(h_row, c, hidden, ok);
            dy[j] = load_chunk_if::<E, M>(dy_row, c, hidden, ok);
        }
    });
    // SAFETY: the host checked the weight.
    let w = unsafe { tile_weight::<E, M>(p, first, me.tpr, nchunks) };
    let mut acc = 0.0f32;
    unroll!(j < k => {
        unroll!(l < E::LANES => { acc = fmaf32(h[j][l], w[j][l] * dy[j][l], acc); });
    });
    // SAFETY: every thread of the block calls it once (reduction buffer 0).
    let total = unsafe { row_sum(acc, me.lane, me.warp, me.warps, me.slot(0)) };
    if me.t == 0 {
        // SAFETY: the block's index < rows * tiles, inside the tile sums the host sized.
        unsafe { F32::store(sums + grid::block_x() * 4, total) };
    }
}

/// Second of the tile passes: block `b` is walker `b / tiles`'s tile `b % tiles`. For each of
/// the walker's rows in order, the row's tile sums folded in tile order from 0 (as the cluster
/// split folds them, so the same coefficient and `dx` bits), then `dx` of the tile's chunks
/// and their `dw` partials in registers; at the end the tile's columns of the walker's
/// partial row.
///
/// # Safety
/// Launched with `p.dw_slots * tiles` blocks of `RMSNORM_BWD_MAX_THREADS_PER_ROW` threads, no
/// dynamic shared memory, after [`bwd_tile_sums`] of the same parameters on the same stream;
/// otherwise as for [`bwd_regs`].
#[inline(always)]
pub(super) unsafe fn bwd_tile_dx<E: Elem, const M: Path>(p: &RmsNormBwdParams) {
    let k = 16 / E::LANES;
    // The grid is `walkers * tiles` blocks: the walker is < walkers.
    let Some(TileBlock {
        me,
        nchunks,
        tiles,
        outer: walker,
        first,
        sums,
    }) = TileBlock::of::<E>(p)
    else {
        return;
    };
    let walkers = p.dw_slots as u64;
    let hidden = p.hidden;
    let lanes = E::LANES as u64;
    let hidden_f = hidden as f32;
    // As in fwd_regs.
    prefetch_first(p.dy);
    grid_dependency_sync();
    // SAFETY: the host checked the weight.
    let w = unsafe { tile_weight::<E, M>(p, first, me.tpr, nchunks) };
    let mut dw = [[0.0f32; 8]; MAX_CHUNKS];
    let mut row = walker;
    while row < p.rows {
        // Lane `i` loads tile `i`'s sum (tiles <= 16 < 32); every warp folds them in tile
        // order from 0, as `cluster_row_coef` does.
        let lane = me.lane as u64;
        // SAFETY: row < rows and lane < tiles: inside the tile sums, written by the first
        // pass, which completed before this grid's dependency wait returned.
        let mine = unsafe { ld_f32_if(sums + (row * tiles + lane) * 4, lane < tiles) };
        let mut total = 0.0f32;
        let mut i = 0u32;
        while (i as u64) < tiles {
            total = fold_tiles(total, shfl_idx(mine, i));
            i += 1;
        }
        // SAFETY: row < rows of the rstd column (host-checked).
        let rstd = unsafe { F32::load(p.rstd + row * p.rstd_stride * 4) };
        let coef = long_row_coef(total, hidden_f, rstd);
        // SAFETY: row < rows.
        unsafe { row_dx::<E, M>(p, row, rstd, coef, first, me.tpr, &w, &mut dw) };
        row += walkers;
    }
    unroll!(j < k => {
        let c = first + j as u64 * me.tpr;
        // SAFETY: as in `bwd_regs`; walker < walkers, the partial rows the host sized.
        unsafe { store_f32s::<M>(p.workspace, walker * hidden + c * lanes, c * lanes, hidden, E::LANES, c < nchunks, &dw[j]) };
    });
}

/// Backward for rows longer than 8192 elements split over a thread-block cluster (sm_90):
/// a cluster per row walker (`rmsnorm_bwd_walkers`: cluster `i` takes rows `i, i + clusters,
/// ...`), block rank `r` of it the row's tile `r`, computed as [`bwd_staged`] computes a
/// 16-per-thread row of 512 threads ([`bwd_scalar`] for 16-bit rows off the 16-byte grid),
/// with its weight and `dw` partial; the row's sum is the tiles' sums gathered through
/// distributed shared memory ([`cluster_row_coef`]), and the block's `dw` partial is its tile's
/// columns of the walker's partial row. The same bits as [`bwd_loop_tiles`].
///
/// # Safety
/// Launched as `plan_rmsnorm_backward` decides for it: `walkers * tiles` blocks of 512
/// threads in clusters of `tiles` (`rmsnorm_bwd_tiles`) blocks,
/// `rmsnorm_bwd_cluster_smem_bytes` of dynamic shared memory, parameters it checked for path
/// `M`.
#[inline(always)]
pub(super) unsafe fn bwd_cluster<E: Elem, const M: Path>(p: &RmsNormBwdParams) {
    if M == Path::V16 || E::BYTES == 4 {
        // SAFETY: the caller's contract.
        unsafe { bwd_staged::<E, M, true, true, true>(p) }
    } else {
        // SAFETY: the caller's contract.
        unsafe { bwd_scalar::<E, true, true>(p) }
    }
}

/// [`bwd_cluster`] in one launch, for calls of at most a row per walker: the first
/// `p.dw_slots` clusters (the walkers) compute `dx` as it does, without partials; the blocks
/// after them compute `dw` straight from `h`, `dy` and `rstd` ([`fused_dw`]), as
/// [`bwd_fused`]'s do.
///
/// # Safety
/// As for [`bwd_cluster`], launched with `p.dw_slots` clusters of a block per tile plus
/// [`ferrofuse_common::rmsnorm_bwd_fused_dw_blocks`] rounded up to whole clusters, dynamic
/// shared memory for both parts, and `p.dw` the `[1, hidden]` output in the weight's dtype.
#[inline(always)]
pub(super) unsafe fn bwd_cluster_fused<E: Elem, const M: Path>(p: &RmsNormBwdParams) {
    let row_blocks = p.dw_slots as u64 * cluster::size() as u64;
    let b = grid::block_x();
    if b >= row_blocks {
        // SAFETY: the caller's contract.
        unsafe { fused_dw::<E, M, true>(p, b - row_blocks, grid::grid_dim_x() - row_blocks) }
    } else if M == Path::V16 || E::BYTES == 4 {
        // SAFETY: the caller's contract; the clusters before the `dw` blocks are the walkers.
        unsafe { bwd_staged::<E, M, true, false, true>(p) }
    } else {
        // SAFETY: as above.
        unsafe { bwd_scalar::<E, false, true>(p) }
    }
}

/// The walkers of a cluster-split launch of clusters of `blocks`, whose clusters take the rows
/// `walker, walker + walkers, ...`: every cluster of the grid, except in the one-launch form
/// (no partials), whose grid also holds its `dw` blocks after its `p.dw_slots` walkers.
#[inline(always)]
fn cluster_walkers<const PARTIALS: bool>(p: &RmsNormBwdParams, blocks: NonZeroU64) -> u64 {
    if PARTIALS {
        grid::grid_dim_x() / blocks
    } else {
        p.dw_slots as u64
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
    let smem = smem_f32();
    // SAFETY: the whole block calls it; the area holds 8 * 32 f32s (RMSNORM_DW_SMEM_BYTES).
    unsafe { slices_to_shared(s, tid / 32, tid % 32, smem) };
    sync_block();
    let col = grid::block_x() * cols + tid;
    if tid < cols && col < p.hidden {
        // SAFETY: written before the barrier; tid < 32.
        let t = unsafe { column_total(smem, tid) };
        // SAFETY: col < hidden; dw holds hidden elements of W (host-checked).
        unsafe { W::store(p.dw + col * W::BYTES, t) };
    }
}

/// The first half of combining a column group's 32 slices (see [`dw_reduce`]): lanes `g`,
/// `g + 8`, `g + 16`, `g + 24` of a warp hold the same four columns, so two butterfly steps
/// leave each of them with the same bits; lanes below 8 then write the warp's sums to
/// `sums[warp * 32 + lane * 4 + l]`.
///
/// # Safety
/// The whole warp calls it; `sums` has `(warp + 1) * 32` f32s of shared memory.
#[inline(always)]
unsafe fn slices_to_shared(mut s: [f32; 4], warp: u64, lane: u64, sums: *mut f32) {
    unroll!(l < 4 => {
        s[l] += shfl_xor(s[l], 16);
        s[l] += shfl_xor(s[l], 8);
    });
    if lane < DW_GROUPS {
        unroll!(l < 4 => {
            // SAFETY: warp * 32 + lane * 4 + l < (warp + 1) * 32 (the caller's contract).
            unsafe { *sums.add((warp * 32 + lane * 4 + l as u64) as usize) = s[l] };
        });
    }
}

/// The second half: column `c < 32`'s eight warp sums added in warp order.
///
/// # Safety
/// [`slices_to_shared`] wrote all eight warps' sums to `sums`, before a barrier.
#[inline(always)]
unsafe fn column_total(sums: *const f32, c: u64) -> f32 {
    let mut t = 0.0f32;
    let mut w = 0u64;
    while w < DW_WARPS {
        // SAFETY: w * 32 + c < 8 * 32, written (the caller's contract).
        t += unsafe { *sums.add((w * 32 + c) as usize) };
        w += 1;
    }
    t
}

/// The backward in one launch: the first `ceil(rows / rows_per_block)` blocks compute `dx` as
/// [`bwd_regs`] does, one row group each, without partials; the blocks after them compute `dw`
/// straight from `h`, `dy` and `rstd` ([`fused_dw`]). Nothing waits on anything: `dw` does
/// not depend on the rows' reductions.
///
/// # Safety
/// As for [`bwd_regs`], launched with `ceil(rows / rows_per_block)` blocks plus
/// [`ferrofuse_common::rmsnorm_bwd_fused_dw_blocks`], dynamic shared memory for both parts,
/// and `p.dw` the `[1, hidden]` output in the weight's dtype.
#[inline(always)]
pub(super) unsafe fn bwd_fused<E: Elem, const M: Path>(p: &RmsNormBwdParams) {
    let Some(rpb) = NonZeroU64::new(p.rows_per_block as u64) else {
        return;
    };
    let row_blocks = p.rows.div_ceil(rpb.get());
    let b = grid::block_x();
    if b < row_blocks {
        // SAFETY: the caller's contract; each row block's one group is block b's.
        unsafe { bwd_regs::<E, M, false>(p) }
    } else {
        // SAFETY: the caller's contract.
        unsafe { fused_dw::<E, M, false>(p, b - row_blocks, grid::grid_dim_x() - row_blocks) }
    }
}

/// `dw` of a one-launch backward, block `b` of the `dw_blocks` after the rows': by column for
/// few rows ([`rmsnorm_bwd_fused_dw_by_column`]: [`dw_by_column`]), else [`dw_columns`]
/// (`BY_GRID` as there). Both give the two launches' bits.
///
/// # Safety
/// As for [`dw_columns`].
#[inline(always)]
unsafe fn fused_dw<E: Elem, const M: Path, const BY_GRID: bool>(
    p: &RmsNormBwdParams,
    b: u64,
    dw_blocks: u64,
) {
    if rmsnorm_bwd_fused_dw_by_column(p.rows, p.dw_slots as u64) {
        // SAFETY: the caller's contract.
        unsafe { dw_by_column::<E, M>(p, b) }
    } else {
        // Block b of dw_blocks, so there is at least one.
        let dw_blocks = NonZeroU64::new(dw_blocks).unwrap_or(NonZeroU64::MIN);
        // SAFETY: the caller's contract.
        unsafe { dw_columns::<E, M, BY_GRID>(p, b, dw_blocks) }
    }
}

/// `dw` of a one-launch backward of few rows, each its own slot, block `b` of the blocks
/// after the rows': a thread sums four columns (`4 * (b * threads + tid)` on) over every row,
/// in [`dw_reduce`]'s order. Row `r` is slot `r`, whose partial is `fma(dy, h * rstd, 0)`, in
/// the slice `q = ceil(32 (r + 1) / slots) - 1` (the `q` with `floor(q slots / 32) <= r <
/// floor((q + 1) slots / 32)`); a slice's sum starts at 0 and adds its slots in order, a
/// warp's four slices are added as `(s0 + s2) + (s1 + s3)` (the two butterfly steps), and the
/// warps' sums in warp order from 0. A warp without a row adds +0.0, which changes no sum
/// here (none is -0.0: each starts as `0.0 + x`), so it is skipped.
///
/// # Safety
/// As for [`dw_columns`], with at most
/// [`ferrofuse_common::RMSNORM_BWD_FUSED_DW_COLUMN_ROWS`] rows, and
/// `p.dw_slots >= p.rows`.
#[inline(always)]
unsafe fn dw_by_column<E: Elem, const M: Path>(p: &RmsNormBwdParams, b: u64) {
    let col0 = (b * grid::block_dim_x() + grid::thread_x()) * 4;
    let slots = p.dw_slots;
    // As in fwd_regs.
    prefetch_first(p.dy);
    grid_dependency_sync();
    if col0 >= p.hidden {
        return;
    }
    let left = p.hidden - col0;
    let slice = |r: u32| (RMSNORM_DW_SLICES * (r + 1)).div_ceil(slots) - 1;
    // A warp's four slices, added to the total when the next row's slice is in a later warp.
    let mut t = [0.0f32; 4];
    let mut quad = [[0.0f32; 4]; 4];
    let add_warp = |t: &mut [f32; 4], quad: &mut [[f32; 4]; 4]| {
        unroll!(l < 4 => {
            t[l] += (quad[0][l] + quad[2][l]) + (quad[1][l] + quad[3][l]);
            unroll!(i < 4 => { quad[i][l] = 0.0; });
        });
    };
    // A batch of rows' loads in flight together, then their partials added in row order (a
    // loop, not unrolled: the batches' loads and addresses are not all live at once).
    let mut n = 0usize;
    while ((n * DW_ROWS) as u64) < p.rows {
        let mut h = [[0.0f32; 4]; DW_ROWS];
        let mut dy = [[0.0f32; 4]; DW_ROWS];
        let mut rstd = [0.0f32; DW_ROWS];
        unroll!(i < DW_ROWS => {
            let r = (n * DW_ROWS + i) as u64;
            let ok = r < p.rows;
            // SAFETY: when ok, r < rows and columns col0.. (the first `left` < hidden) are
            // inside h, dy and rstd (host-checked); on the vector path col0 is a multiple of 4
            // of 16-byte aligned rows.
            unsafe {
                h[i] = load_quad::<E, M>(p.h + (r * p.h_stride + col0) * E::BYTES, ok, left);
                dy[i] = load_quad::<E, M>(p.dy + (r * p.dy_stride + col0) * E::BYTES, ok, left);
                rstd[i] = ld_f32_if(p.rstd + r * p.rstd_stride * 4, ok);
            }
        });
        unroll!(i < DW_ROWS => {
            let r = (n * DW_ROWS + i) as u32;
            if (r as u64) < p.rows {
                let q = slice(r);
                if r > 0 && q / 4 != slice(r - 1) / 4 {
                    add_warp(&mut t, &mut quad);
                }
                unroll!(j < 4 => {
                    if j as u32 == q % 4 {
                        unroll!(l < 4 => { quad[j][l] += fmaf32(dy[i][l], h[i][l] * rstd[i], 0.0); });
                    }
                });
            }
        });
        n += 1;
    }
    add_warp(&mut t, &mut quad);
    let w_f32 = p.flags & RMSNORM_W_F32 != 0;
    unroll!(l < 4 => {
        let col = col0 + l as u64;
        if col < p.hidden {
            // SAFETY: col < hidden; dw holds hidden elements of the weight's dtype, f32 with
            // RMSNORM_W_F32, else E (host-checked).
            unsafe {
                if w_f32 {
                    F32::store(p.dw + col * 4, t[l]);
                } else {
                    E::store(p.dw + col * E::BYTES, t[l]);
                }
            }
        }
    });
}

/// `dw` of a one-launch backward by slices of the slots, block `b` of the `dw_blocks` after the
/// rows': column groups of 32, each on 256 virtual threads that are [`dw_reduce`]'s threads (a real
/// thread runs those at its index plus multiples of the block size, which keeps lanes and warps). A
/// virtual thread's slice of slots is `dw_reduce`'s for the two-launch layout of the call; it forms
/// each slot's partial as the rows kernel would (from 0, `fma(dy, h * rstd, partial)` over the
/// slot's rows `s, s + slots, ...`) and adds it to its sum as `dw_reduce` adds what it reads, and
/// the slices are combined as `dw_reduce` combines them: the same `dw` as the two launches. A block
/// takes [`rmsnorm_bwd_fused_dw_groups`] of its threads' worth of groups, or with `BY_GRID` the
/// call's groups spread over its `dw_blocks` ([`rmsnorm_bwd_fused_dw_groups_per_block`]: the host
/// sizes that grid freely, which changes no bits).
///
/// # Safety
/// As for [`bwd_fused`]; shared memory of 1 KiB per column group of the block at least.
#[inline(always)]
unsafe fn dw_columns<E: Elem, const M: Path, const BY_GRID: bool>(
    p: &RmsNormBwdParams,
    b: u64,
    dw_blocks: NonZeroU64,
) {
    let threads = grid::block_dim_x();
    let per_group = RMSNORM_DW_THREADS as u64;
    let cols = RMSNORM_DW_COLS as u64;
    let groups = if BY_GRID {
        rmsnorm_bwd_fused_dw_groups_per_block(p.hidden, dw_blocks.get())
    } else {
        rmsnorm_bwd_fused_dw_groups(threads as u32) as u64
    };
    // The slots of the two-launch layout of the same call.
    let slots = p.dw_slots as u64;
    let slices = RMSNORM_DW_SLICES as u64;
    let tid = grid::thread_x();
    let smem = smem_f32();
    // As in fwd_regs.
    prefetch_first(p.dy);
    grid_dependency_sync();
    // The bound is a multiple of 32, as is the block: a warp's lanes all run an iteration.
    let mut u = tid;
    while u < groups * per_group {
        let (g, v) = (u / per_group, u % per_group);
        let col0 = (b * groups + g) * cols + (v % DW_GROUPS) * 4;
        let q = v / DW_GROUPS;
        let lo = q * slots / slices;
        let hi = (q + 1) * slots / slices;
        let mut s = [0.0f32; 4];
        if col0 < p.hidden {
            let left = p.hidden - col0;
            // h, dy (four columns from col0) and rstd of DW_ROWS rows, loaded together.
            let load = |at: &[u64; DW_ROWS], ok: &[bool; DW_ROWS]| {
                let mut h = [[0.0f32; 4]; DW_ROWS];
                let mut dy = [[0.0f32; 4]; DW_ROWS];
                let mut rstd = [0.0f32; DW_ROWS];
                unroll!(i < DW_ROWS => {
                    let r = at[i];
                    // SAFETY: when ok, r < rows and columns col0.. (the first `left` < hidden)
                    // are inside h, dy and rstd (host-checked); on the vector path col0 is a
                    // multiple of 4 of 16-byte aligned rows.
                    unsafe {
                        h[i] = load_quad::<E, M>(p.h + (r * p.h_stride + col0) * E::BYTES, ok[i], left);
                        dy[i] = load_quad::<E, M>(p.dy + (r * p.dy_stride + col0) * E::BYTES, ok[i], left);
                        rstd[i] = ld_f32_if(p.rstd + r * p.rstd_stride * 4, ok[i]);
                    }
                });
                (h, dy, rstd)
            };
            if slots >= p.rows {
                // A row per slot (a slot past the rows has none): each slot's partial is its
                // row's fma(dy, h * rstd, 0).
                let hi = hi.min(p.rows);
                let mut r = lo;
                while r < hi {
                    let at: [u64; DW_ROWS] = core::array::from_fn(|i| r + i as u64);
                    let ok = at.map(|row| row < hi);
                    let (h, dy, rstd) = load(&at, &ok);
                    unroll!(i < DW_ROWS => {
                        if ok[i] {
                            unroll!(l < 4 => { s[l] += fmaf32(dy[i][l], h[i][l] * rstd[i], 0.0); });
                        }
                    });
                    r += DW_ROWS as u64;
                }
            } else {
                // The slice's rows in the two launches' order: slot by slot, each slot's rows
                // `slot, slot + slots, ...` (its block's row groups in turn). A slot's first
                // row is the slot itself.
                let (mut slot, mut row) = (lo, lo);
                let mut partial = [0.0f32; 4];
                while slot < hi && row < p.rows {
                    let mut at = [0u64; DW_ROWS];
                    let mut ok = [false; DW_ROWS];
                    let mut first = [false; DW_ROWS];
                    unroll!(i < DW_ROWS => {
                        at[i] = row;
                        ok[i] = slot < hi && row < p.rows;
                        first[i] = row == slot;
                        row += slots;
                        if row >= p.rows {
                            slot += 1;
                            row = slot;
                        }
                    });
                    let (h, dy, rstd) = load(&at, &ok);
                    // The rows kernel's partial of each slot (from 0, its rows in turn), added
                    // to the running sum when the slot ends, as the dw kernel adds what it read.
                    unroll!(i < DW_ROWS => {
                        if ok[i] {
                            if first[i] {
                                unroll!(l < 4 => {
                                    s[l] += partial[l];
                                    partial[l] = 0.0;
                                });
                            }
                            unroll!(l < 4 => { partial[l] = fmaf32(dy[i][l], h[i][l] * rstd[i], partial[l]); });
                        }
                    });
                }
                unroll!(l < 4 => { s[l] += partial[l]; });
            }
        }
        // SAFETY: the whole warp runs this iteration (see the bound); group g's 8 * 32 f32s
        // are inside the area (the caller's contract).
        unsafe { slices_to_shared(s, v / 32, tid % 32, smem.add((g * 256) as usize)) };
        u += threads;
    }
    sync_block();
    let w_f32 = p.flags & RMSNORM_W_F32 != 0;
    let mut u = tid;
    while u < groups * cols {
        let (g, c) = (u / cols, u % cols);
        let col = (b * groups + g) * cols + c;
        if col < p.hidden {
            // SAFETY: written before the barrier; c < 32.
            let t = unsafe { column_total(smem.add((g * 256) as usize), c) };
            // SAFETY: col < hidden; dw holds hidden elements of the weight's dtype, f32 with
            // RMSNORM_W_F32, else E (host-checked).
            unsafe {
                if w_f32 {
                    F32::store(p.dw + col * 4, t);
                } else {
                    E::store(p.dw + col * E::BYTES, t);
                }
            }
        }
        u += threads;
    }
}

/// Rows of [`dw_columns`] whose loads are in flight together.
const DW_ROWS: usize = 4;

/// Four consecutive elements of a row at `p`, widened (zeros when `!ok`): one 8- or 16-byte
/// load on the vector path, else element by element, only the first `left` of them.
///
/// # Safety
/// When `ok`: the first `min(4, left)` elements at `p` exist, and on the vector path all four,
/// aligned to their size.
#[inline(always)]
unsafe fn load_quad<E: Elem, const M: Path>(p: u64, ok: bool, left: u64) -> [f32; 4] {
    let mut v = [0.0f32; 4];
    if M == Path::V16 && E::BYTES == 4 {
        // SAFETY: the caller's contract (16 bytes, aligned).
        let r = unsafe { ld_v4_if(p, ok) };
        unroll!(l < 4 => { v[l] = f32::from_bits(r[l]); });
    } else if M == Path::V16 {
        // SAFETY: the caller's contract (8 bytes, aligned).
        let r = unsafe { ld_v2_if(p, ok) };
        let w = E::unpack([r[0], r[1], 0, 0]);
        unroll!(l < 4 => { v[l] = w[l]; });
    } else {
        unroll!(l < 4 => {
            // SAFETY: the caller's contract; element l < left exists.
            v[l] = E::widen(unsafe { E::load_bits_if(p + l as u64 * E::BYTES, ok && (l as u64) < left) });
        });
    }
    v
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
