//! Deterministic warp and row reductions, and the block's dynamic shared memory.
//!
//! Every sum here has a fixed shape: a butterfly over the 32 lanes (offsets 16, 8, 4, 2, 1),
//! then, for rows wider than a warp, one value per warp in shared memory summed by the same
//! butterfly in every warp of the row. IEEE addition is commutative, so at each butterfly
//! step lanes `i` and `i ^ m` compute the same bits; every thread of a row therefore ends with
//! the identical total, and that total depends only on the inputs and on the number of warps
//! per row, never on timing or on the other rows of the block.

use core::arch::nvptx;
use core::intrinsics::gpu::gpu_launch_sized_workgroup_mem;

unsafe extern "C" {
    // The LLVM intrinsic (not an `asm!`): it is marked convergent, so LLVM never moves it
    // into a branch that only some lanes take.
    #[link_name = "llvm.nvvm.shfl.sync.bfly.f32"]
    fn shfl_sync_bfly_f32(member_mask: u32, v: f32, lane_mask: u32, clamp: u32) -> f32;
    #[link_name = "llvm.nvvm.shfl.sync.idx.f32"]
    fn shfl_sync_idx_f32(member_mask: u32, v: f32, lane: u32, clamp: u32) -> f32;
}

/// `v` from lane `lane ^ mask`. Every lane of the warp must call it.
#[inline(always)]
pub fn shfl_xor(v: f32, mask: u32) -> f32 {
    // SAFETY: full member mask; the callers are always executed by the whole warp.
    unsafe { shfl_sync_bfly_f32(0xffff_ffff, v, mask, 0x1f) }
}

/// `v` from lane `lane` (< 32). Every lane of the warp must call it.
#[inline(always)]
pub fn shfl_idx(v: f32, lane: u32) -> f32 {
    // SAFETY: full member mask, as for `shfl_xor`.
    unsafe { shfl_sync_idx_f32(0xffff_ffff, v, lane, 0x1f) }
}

/// Sum over the 32 lanes; every lane gets the same bits. Called by the whole warp.
#[inline(always)]
pub fn warp_sum(v: f32) -> f32 {
    let v = v + shfl_xor(v, 16);
    let v = v + shfl_xor(v, 8);
    let v = v + shfl_xor(v, 4);
    let v = v + shfl_xor(v, 2);
    v + shfl_xor(v, 1)
}

/// The launch-sized dynamic shared memory as f32s (the host passes its size per launch).
#[inline(always)]
pub fn smem_f32() -> *mut f32 {
    gpu_launch_sized_workgroup_mem::<f32>()
}

/// Block-wide barrier (`bar.sync 0`). Also a compiler memory barrier: the intrinsic may read
/// and write memory as far as LLVM knows, so no load or store moves across it.
#[inline(always)]
pub fn sync_block() {
    // SAFETY: every caller is reached by all threads of the block (no divergent barriers).
    unsafe { nvptx::_syncthreads() }
}

/// Sum of `v` over the `warps` warps (32 * `warps` threads) of one row; every thread of the
/// row gets the same bits.
///
/// `lane` is the lane in the warp, `warp` the warp's index in its row, and `slot` the index
/// of the row's first f32 in shared memory (it uses `slot .. slot + warps`). With more than
/// one warp it executes one barrier, so all threads of the block must call it (with the same
/// `warps`), and a caller that reduces again must use other slots the next time (see the
/// double buffering in `norm/backward.rs`) or the writes of a fast warp could overtake the
/// reads of a slow one.
///
/// # Safety
/// `slot + warps` f32s must fit in the launch's dynamic shared memory.
#[inline(always)]
pub unsafe fn row_sum(v: f32, lane: u32, warp: u32, warps: u32, slot: u32) -> f32 {
    let s = warp_sum(v);
    if warps <= 1 {
        return s;
    }
    let smem = smem_f32();
    if lane == 0 {
        // SAFETY: slot + warp < slot + warps, inside the allocation (caller's contract).
        unsafe { *smem.add((slot + warp) as usize) = s };
    }
    sync_block();
    let t = if lane < warps {
        // SAFETY: as above; written before the barrier by lane 0 of warp `lane`.
        unsafe { *smem.add((slot + lane) as usize) }
    } else {
        0.0
    };
    warp_sum(t)
}
