//! The register-resident forward of rows of 32 elements per thread on the vector path, its
//! rows streamed (sm_90): a persistent block per multiprocessor takes rows `block, block +
//! grid, ...`, and thread 0 has the copy engine bring the block's next row of `x` and
//! `residual` into shared memory as soon as the block has read the current one out of it. HBM
//! then streams the next row while the block adds, reduces, normalises and stores this one; a
//! 512-thread block of these rows holds one row in its registers, so without the stream
//! nothing is in flight on the multiprocessor while its row reduces. The weight is copied in
//! once per block, with the first row.
//!
//! Each thread reads the chunks of the register kernels' map (chunk `j * T + t`) from shared
//! memory instead of global memory, and from there runs their arithmetic in their order, so
//! `h`, `rstd` and `y` (in the storage dtype or FP8, with its scales) are bitwise those of
//! [`super::fwd_regs`] and [`super::fp8`] at the same row length: the choice of this kernel by
//! the number of rows keeps batch invariance.
//!
//! # Aliasing
//! `h` may be `x` or `residual`, and the storage-dtype `y` may be `x`: the copies read rows
//! after the current one, never a row whose outputs a block is writing (each row is one
//! block's), and a row's outputs are written only after the block read it out of shared
//! memory.

#[cfg(ferrofuse_bulk_copy)]
use core::intrinsics::fmaf32;
#[cfg(ferrofuse_bulk_copy)]
use core::num::NonZeroU64;

use ferrofuse_common::RmsNormFp8Params;
#[cfg(ferrofuse_bulk_copy)]
use ferrofuse_common::{
    NormPath as Path, RMSNORM_GEMMA, RMSNORM_HF, RMSNORM_W_F32, fp8::FP8_STATIC,
};

#[cfg(ferrofuse_bulk_copy)]
use super::fp8::store_fp8;
#[cfg(ferrofuse_bulk_copy)]
use super::{MAX_CHUNKS, Me, Row, add_residual, normalize, rstd_of, store_chunk};
#[cfg(ferrofuse_bulk_copy)]
use crate::gated_fp8::load_f32;
#[cfg(ferrofuse_bulk_copy)]
use crate::mem::{Bf16, F16, F32};
#[cfg(ferrofuse_bulk_copy)]
use crate::mem::{Elem, bulk, grid, grid_dependency_sync, ld_shared_v4_if, shared_addr};
#[cfg(ferrofuse_bulk_copy)]
use crate::reduce::{row_sum, smem_f32, sync_block};

/// The scheme value of the storage-dtype output (`y` rounded to the storage dtype, no scale).
#[cfg(ferrofuse_bulk_copy)]
const PLAIN: u32 = u32::MAX;

/// Where the kernel keeps what in its dynamic shared memory (byte offsets): the reduction
/// buffers of every norm forward first, then the copy barrier, then one row of `x`, of
/// `residual` and the weight, each in a region of the largest row (512 threads x 32 f32s).
#[cfg(ferrofuse_bulk_copy)]
mod layout {
    use ferrofuse_common::{
        RMSNORM_MAX_THREADS_PER_ROW, RMSNORM_SMEM_BYTES, RMSNORM_STREAM_SMEM_BYTES,
    };

    pub const BARRIER: u32 = RMSNORM_SMEM_BYTES;
    pub const X: u32 = 1024;
    pub const RESIDUAL: u32 = X + REGION;
    pub const WEIGHT: u32 = RESIDUAL + REGION;
    const REGION: u32 = RMSNORM_MAX_THREADS_PER_ROW * 32 * 4;
    const _: () = assert!(BARRIER + 8 <= X);
    const _: () = assert!(WEIGHT + REGION == RMSNORM_STREAM_SMEM_BYTES);
}

/// Chunk `c`'s weight factors from the weight staged at the shared-memory address `w` (the
/// weight's `hidden` elements, f32 when `w_f32`, else the storage dtype): `w`, or `1 + w`
/// formed in f32 for Gemma, as `load_w` gives them; zeros (`1` for Gemma) when `!inside`.
///
/// # Safety
/// When `inside`, chunk `c` of the weight is in the staged copy.
#[cfg(ferrofuse_bulk_copy)]
#[inline(always)]
unsafe fn staged_weight<E: Elem>(
    w: u32,
    c: u64,
    inside: bool,
    w_f32: bool,
    gemma: bool,
) -> [f32; 8] {
    let mut v = if w_f32 {
        let at = w + (c * E::LANES as u64 * 4) as u32;
        // SAFETY: the caller's contract; a chunk of f32s is 16 or 32 bytes from `at`.
        let mut v = F32::unpack(unsafe { ld_shared_v4_if(at, inside) });
        if E::LANES == 8 {
            // SAFETY: as above, the second half of a 32-byte chunk.
            let b = F32::unpack(unsafe { ld_shared_v4_if(at + 16, inside) });
            v[4] = b[0];
            v[5] = b[1];
            v[6] = b[2];
            v[7] = b[3];
        }
        v
    } else {
        // SAFETY: the caller's contract.
        E::unpack(unsafe { ld_shared_v4_if(w + (c * 16) as u32, inside) })
    };
    if gemma {
        unroll!(l < E::LANES => { v[l] = 1.0 + v[l]; });
    }
    v
}

/// The streamed forward, output `S` ([`PLAIN`] or an FP8 scheme); see the module docs. `p.norm`
/// is the storage-dtype forward's parameters; the rest is read for the FP8 schemes only.
///
/// # Safety
/// The host's plan: params checked (extents, the vector path's alignment, aliasing, the scale
/// tensor), rows of the 32-per-thread geometry, blocks of its `threads_per_row` threads, at
/// most one per row, and [`ferrofuse_common::RMSNORM_STREAM_SMEM_BYTES`] of dynamic shared
/// memory.
#[cfg(ferrofuse_bulk_copy)]
#[inline(always)]
unsafe fn fwd_stream<E: Elem, const S: u32>(p: &RmsNormFp8Params) {
    const M: Path = Path::V16;
    let n = &p.norm;
    let k = 32 / E::LANES;
    let Some(tpr) = NonZeroU64::new(n.threads_per_row as u64) else {
        return;
    };
    let me = Me::new::<true>(tpr);
    let hidden = n.hidden;
    let nchunks = hidden.div_ceil(E::LANES as u64);
    // At most 16384 / 4 chunks, so 32-bit chunk indices (as in `fwd_regs`).
    let (t32, tpr32, nchunks32) = (me.t as u32, me.tpr as u32, nchunks as u32);
    let chunk = |j: usize| {
        let c = j as u32 * tpr32 + t32;
        (c as u64, c < nchunks32)
    };
    let has_res = n.residual != 0;
    let hf = n.flags & RMSNORM_HF != 0;
    let gemma = n.flags & RMSNORM_GEMMA != 0;
    let w_f32 = n.flags & RMSNORM_W_F32 != 0;
    let base = shared_addr(smem_f32().cast_const().cast());
    let (bar, buf_x, buf_r, buf_w) = (
        base + layout::BARRIER,
        base + layout::X,
        base + layout::RESIDUAL,
        base + layout::WEIGHT,
    );
    // On the vector path a row of each operand is a whole number of 16-byte chunks.
    let row_bytes = (hidden * E::BYTES) as u32;
    let w_bytes = (hidden * if w_f32 { 4 } else { E::BYTES }) as u32;
    grid_dependency_sync();
    // The static scale, read once (it may be written by the previous kernel: after the wait).
    let fixed = if S == FP8_STATIC {
        // SAFETY: the host checked that `scale` is one readable, aligned f32.
        unsafe { load_f32(p.scale) }
    } else {
        1.0
    };
    let fetch = #[inline(always)]
    |row: u64, weight: bool| {
        let inputs = if has_res { 2 * row_bytes } else { row_bytes };
        // SAFETY: one arrival per phase (thread 0's, here); the bytes are the copies' below.
        unsafe { bulk::expect_bytes(bar, inputs + if weight { w_bytes } else { 0 }) };
        let x = Row::hoisted::<E>(n.x, n.x_stride, row).base;
        let r = Row::hoisted::<E>(n.residual, n.residual_stride, row).base;
        // SAFETY: row `row` exists; its `x` and `residual` and the weight are 16-byte aligned
        // runs of whole chunks (the vector path), each within its region of the buffers,
        // which the block reads again only after this phase completes. No thread writes
        // them during the launch: outputs go to the current row (see the module docs).
        unsafe {
            bulk::copy_to_shared(buf_x, x, row_bytes, bar);
            if has_res {
                bulk::copy_to_shared(buf_r, r, row_bytes, bar);
            }
            if weight {
                bulk::copy_to_shared(buf_w, n.w, w_bytes, bar);
            }
        }
    };
    if me.t == 0 {
        // SAFETY: the barrier's 8 bytes are this block's, used for nothing else.
        unsafe { bulk::init_barrier(bar) };
    }
    sync_block();
    let step = grid::grid_dim_x();
    let mut row = grid::block_x();
    if me.t == 0 && row < n.rows {
        fetch(row, true);
    }
    let mut parity = 0;
    // `row` is the same for the whole block: every thread runs each iteration and its
    // barriers.
    while row < n.rows {
        // SAFETY: initialized above.
        unsafe { bulk::wait(bar, parity) };
        parity ^= 1;
        let mut x_raw = [[0u32; 4]; MAX_CHUNKS];
        let mut r_raw = [[0u32; 4]; MAX_CHUNKS];
        unroll!(j < k => {
            let (c, inside) = chunk(j);
            let at = (c * 16) as u32;
            // SAFETY: chunk c of the row is in the buffers when inside (c < nchunks), written
            // by the phase just completed.
            unsafe {
                x_raw[j] = ld_shared_v4_if(buf_x + at, inside);
                r_raw[j] = ld_shared_v4_if(buf_r + at, inside && has_res);
            }
        });
        // After it every thread has read the buffers, which the next row's copies may then
        // overwrite; and every thread has read the previous row's reduction slots.
        sync_block();
        let next = row + step;
        if me.t == 0 && next < n.rows {
            fetch(next, false);
        }
        let mut h = [[0.0f32; 8]; MAX_CHUNKS];
        unroll!(j < k => {
            h[j] = add_residual::<E>(&E::unpack(x_raw[j]), &E::unpack(r_raw[j]), has_res, hf);
        });
        let h_row = Row::hoisted::<E>(n.h, n.h_stride, row);
        unroll!(j < k => {
            let (c, inside) = chunk(j);
            // SAFETY: row < rows and c < nchunks: inside `h` (host-checked).
            unsafe { store_chunk::<E, M>(h_row, c, hidden, has_res && inside, &h[j]) };
        });
        let mut acc = 0.0f32;
        unroll!(j < k => {
            unroll!(l < E::LANES => { acc = fmaf32(h[j][l], h[j][l], acc); });
        });
        // SAFETY: every thread of the block gets here; buffer 0's slots are the block's warps.
        let sum_sq = unsafe { row_sum(acc, me.lane, me.warp, me.warps, me.slot(0)) };
        let rstd = rstd_of(sum_sq, hidden, n.eps);
        if me.t == 0 && n.rstd != 0 {
            // SAFETY: row < rows; the host checked the rstd vector.
            unsafe { F32::store(n.rstd + row * n.rstd_stride * 4, rstd) };
        }
        unroll!(j < k => {
            let (c, inside) = chunk(j);
            // SAFETY: the weight's chunk c is staged when inside (the first phase copied it).
            let w = unsafe { staged_weight::<E>(buf_w, c, inside, w_f32, gemma) };
            h[j] = normalize::<E>(&h[j], rstd, &w, hf);
        });
        if S == PLAIN {
            let y_row = Row::hoisted::<E>(n.y, n.y_stride, row);
            unroll!(j < k => {
                let (c, inside) = chunk(j);
                // SAFETY: as for `h`; `y` may be `x`, whose row the block has read.
                unsafe { store_chunk::<E, M>(y_row, c, hidden, inside, &h[j]) };
            });
        } else {
            // SAFETY: every thread of the block gets here; per token it uses buffer 1's
            // slots, which the next row's reduction reaches only after the barrier above.
            unsafe { store_fp8::<E, M, S>(p, &me, row, true, k, chunk, &h, fixed) };
        }
        row = next;
    }
}

/// [`fwd_stream`] with the storage-dtype output, from the storage-dtype forward's parameters.
///
/// # Safety
/// As for [`fwd_stream`].
#[cfg(ferrofuse_bulk_copy)]
#[inline(always)]
unsafe fn fwd_stream_plain<E: Elem>(p: &ferrofuse_common::RmsNormFwdParams) {
    let q = RmsNormFp8Params {
        norm: *p,
        scale: 0,
        scale_row: 0,
        scale_group: 0,
        min_scale: 1.0,
        scale_ub: f32::INFINITY,
        scheme: PLAIN,
        group_shift: 0,
        group_lanes: 1,
        _pad: 0,
    };
    // SAFETY: the caller's contract; the storage-dtype output reads no FP8 field.
    unsafe { fwd_stream::<E, PLAIN>(&q) }
}

/// Defines entries of the streamed forward. On modules without bulk copies (sm_80) they trap:
/// the host plans them only for modules with them.
macro_rules! stream_entries {
    (plain { $($pe:ty => $pname:ident;)* } fp8 { $($e:ty, $s:expr => $name:ident;)* }) => {
        $(
            /// RMSNorm forward, 32 elements per thread, rows streamed (sm_90); see the module
            /// docs of `norm::stream`. Launch: a persistent grid, blocks of the geometry's
            /// `threads_per_row`, `RMSNORM_STREAM_SMEM_BYTES` of dynamic shared memory.
            ///
            /// # Safety
            /// Launched as `plan_rmsnorm_forward` decides, with parameters it checked.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $pname(p: ferrofuse_common::RmsNormFwdParams) {
                #[cfg(ferrofuse_bulk_copy)]
                // SAFETY: the host's checks and plan.
                unsafe { fwd_stream_plain::<$pe>(&p) }
                #[cfg(not(ferrofuse_bulk_copy))]
                // SAFETY: ends the thread.
                unsafe {
                    let _ = p;
                    core::arch::asm!("trap;", options(nostack))
                };
            }
        )*
        $(
            /// RMSNorm forward with FP8 output, 32 elements per thread, rows streamed (sm_90);
            /// see the module docs of `norm::stream` and `norm::fp8`. Launch as the plain
            /// streamed entries.
            ///
            /// # Safety
            /// Launched as `plan_rmsnorm_forward_fp8` decides, with parameters it checked.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $name(p: RmsNormFp8Params) {
                #[cfg(ferrofuse_bulk_copy)]
                // SAFETY: the host's checks and plan.
                unsafe { fwd_stream::<$e, { $s }>(&p) }
                #[cfg(not(ferrofuse_bulk_copy))]
                // SAFETY: ends the thread.
                unsafe {
                    let _ = p;
                    core::arch::asm!("trap;", options(nostack))
                };
            }
        )*
    };
}

// Names must match `ferrofuse_common::KernelId::name` (checked when `cargo xtask ptx` builds).
stream_entries! {
    plain {
        F32 => rmsnorm_fwd_f32_v16_stream;
        F16 => rmsnorm_fwd_f16_v16_stream;
        Bf16 => rmsnorm_fwd_bf16_v16_stream;
    }
    fp8 {
        F32, ferrofuse_common::fp8::FP8_STATIC => rmsnorm_fp8_static_f32_v16_stream;
        F16, ferrofuse_common::fp8::FP8_STATIC => rmsnorm_fp8_static_f16_v16_stream;
        Bf16, ferrofuse_common::fp8::FP8_STATIC => rmsnorm_fp8_static_bf16_v16_stream;
        F32, ferrofuse_common::fp8::FP8_PER_TOKEN => rmsnorm_fp8_token_f32_v16_stream;
        F16, ferrofuse_common::fp8::FP8_PER_TOKEN => rmsnorm_fp8_token_f16_v16_stream;
        Bf16, ferrofuse_common::fp8::FP8_PER_TOKEN => rmsnorm_fp8_token_bf16_v16_stream;
        F32, ferrofuse_common::fp8::FP8_PER_GROUP => rmsnorm_fp8_group_f32_v16_stream;
        F16, ferrofuse_common::fp8::FP8_PER_GROUP => rmsnorm_fp8_group_f16_v16_stream;
        Bf16, ferrofuse_common::fp8::FP8_PER_GROUP => rmsnorm_fp8_group_bf16_v16_stream;
    }
}
