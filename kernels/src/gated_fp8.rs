//! Gated activations with FP8 E4M3 outputs: `y_q = e4m3(act(a) * b / scale)`, the scale
//! static (given), per token (one per row) or per group (one per `g` consecutive columns).
//!
//! # Parameters
//! [`GatedFp8Params`]: `a`, `b` as in the plain gated forward (split or interleaved, storage
//! dtype, own row strides), `y` one byte per element, the scales f32 (see the params docs for
//! their addressing, row- or column-major).
//!
//! # Thread mapping
//! - **Flat** (`gated_fp8_flat_*`: static; `gated_fp8_group_*`: per group, with a body per
//!   group width in lanes so that width is a constant). The `rows x cols/W` accesses (`W`
//!   elements each, 16 bytes of the dtype on `v16`, one element on `scalar`) are numbered
//!   row-major. Static on `v16`: thread `g` of `G` takes accesses `g, g + G, g + 2G, ...`, two
//!   per step with all four loads issued first, its row and column advanced by the host's
//!   [`GridWalk`] step as in the plain kernel; over a flat range (dense operands off the grid,
//!   as one row) the grid's last threads then take its ragged head and tail as there
//!   (`gated_fp8_flat_{dtype}_v16_ends`; [`crate::gated`], "Flat ranges"). Per group on
//!   `v16`: a group of 128 (or 64) columns is 8-32 consecutive accesses (16 for bf16 / f16,
//!   32 for f32 at 128 columns), held by half as many consecutive lanes, two accesses each half
//!   a group apart (so both loads of a lane are coalesced with its neighbours'); the walk
//!   counts these pairs, thread `g` taking pairs `g, g + G, ...`. On `scalar`, warps walk steps of `32 * batch` accesses (lane `l`
//!   takes `l + 32k`, `k < batch`: coalesced for every `k`), rows and columns from the host's
//!   multiply-high ([`GridWalk::row_of`]): no division; a group is one whole step (`batch` =
//!   group / 32). `G` is a multiple of 32, so a group's lanes are in one warp. The group's
//!   maximum is a butterfly over its lanes (after each lane's own accesses), so every lane of a
//!   group holds the same scale; the group's first lane stores it. Each element is loaded once
//!   and written once, the scale once per group: the traffic of the plain kernel with a
//!   one-byte output.
//! - **Row** (`gated_fp8_row_*`: per token). One block of [`GATED_FP8_ROW_MAX_THREADS`] (512)
//!   threads per row, two blocks per SM (three or four on `scalar`, whose accesses take a
//!   register per input each); thread `t` owns accesses `t + 512 j`, `j < chunks`
//!   (<= [`GATED_FP8_ROW_CHUNKS`], 4), loaded back to back (predicated) and kept packed in
//!   registers; `y` for the row's maximum (warp butterfly, then one f32 per warp in shared
//!   memory), the scale, then `y` again from the registers and the stores. A row of one tile
//!   (up to 2048 accesses: 16384 bf16/f16, 8192 f32) is read once, and the rows of an SM
//!   keep their loads in flight while another one reduces or stores. Longer rows are held
//!   whole too, as the host plans: on the blocks of a thread-block cluster
//!   (`gated_fp8_row_split_*`, sm_90: up to 8 blocks, block rank `r` holding the tile of
//!   accesses `r * 512 * chunks ..`; the blocks' maxima through distributed shared memory),
//!   or, for rows of 2049-4096 accesses, by the long-row entry (`gated_fp8_row_long_*`: up to
//!   [`GATED_FP8_ROW_LONG_CHUNKS`] (8) accesses per thread: one row per SM at 128 registers
//!   on `v16`, three or four (bf16) on `scalar`, whose accesses take a register per input).
//!   On sm_90 the long-row entry's rows of 16-byte accesses are streamed instead, and so are
//!   rows of one tile of 3-4 accesses per thread past two waves of the row kernel
//!   (`gated_fp8_row_stream_{dtype}_c{3..8}`, an entry per count of accesses per thread, so
//!   that no slot's math runs on nothing): one persistent 512-thread block per SM takes row
//!   after row; the copy engine brings the next row into shared memory while the block
//!   computes, reduces and stores the current one from registers.
//!   Otherwise a longer row is walked twice in tiles of two accesses per thread: once for the
//!   maximum, once for the output; the second walk finds the row in L2 (two rows per SM), so
//!   HBM still sees one read. Blocks holding their whole tile may also ask L2 for the same tile
//!   of the row one wave ahead (`prefetch_rows`, a body of its own), so that HBM keeps
//!   streaming while the block reduces and stores.
//! - **Many rows** (`gated_fp8_rows_{dtype}_c{1|2}`: per token, 16-byte accesses, rows of one
//!   or two accesses per thread of 512: a tensor-parallel shard's row is often a fraction of
//!   one tile, as LLaMA-3-8B's MLP over 8 GPUs, 224 accesses). A row on the fewest whole warps
//!   that hold it (`threads_per_row`), `rows_per_block` rows per block, each thread's accesses
//!   `t + threads_per_row * j`, `j < chunks` (an entry per count, so no access's math runs on
//!   nothing): on the row kernel such a row left most of its block's threads idle, and the
//!   registers of four accesses per thread held two blocks per SM; here an SM's threads all
//!   hold accesses, three or four blocks of up to 512 per SM. The row's maximum as on the row
//!   kernel, over its own warps' slots of shared memory (one barrier for the block). 16-bit
//!   rows off the 16-byte grid, at least one per SM, take the same geometry over their aligned
//!   8-byte words of `y` (`gated_fp8_rows_realigned_{dtype}`: up to two words per thread,
//!   each word's inputs realigned in registers as the realigned row kernel's).
//!
//! # Numerics
//! `y = act(a) * b` in f32 exactly as the plain gated forward computes it; the scale
//! `max(min(amax, ub) / 448, min_scale)` and `y / scale` with correctly rounded f32 division;
//! the maximum ignores NaN (`max.f32`), so a NaN element does not poison its row's scale and
//! stays NaN in `y_q`. The conversion rounds to nearest even and saturates to +-448:
//! `cvt.rn.satfinite.e4m3x2.f32` on sm_89 and newer, [`e4m3_from_f32`] (bit-identical,
//! integer and f32 operations) in the sm_80 build.
//!
//! # Programmatic dependent launch (sm_90)
//! Every entry starts with `grid_dependency_sync`.
//!
//! # Aliasing
//! `y` and the scales overlap no input and each other (the host checks).

use core::arch::asm;
use core::arch::nvptx;
use core::intrinsics::gpu::gpu_launch_sized_workgroup_mem;

use ferrofuse_common::act::{GatedAct, GeluErf, GeluTanh, Relu, Silu};
#[cfg(not(ferrofuse_fp8_cvt))]
use ferrofuse_common::fp8::e4m3_from_f32;
use ferrofuse_common::fp8::{div_near, divide_far, dynamic_scale, reciprocal};
use ferrofuse_common::{
    Activation, GATED_FP8_ROW_CHUNKS, GATED_FP8_ROW_LONG_CHUNKS, GATED_FP8_ROW_MAX_THREADS,
    GATED_FP8_ROWS_CHUNKS, GATED_FP8_SCALAR_BATCH, GatedFp8Params, GridWalk,
};

use crate::cluster;
use crate::gated::{end_addr, flat_end, load_realigned, realign};
use crate::mem::{
    Bf16, Elem, F16, F32, VecMode, access_width, grid, grid_dependency_sync, ld_v4_if,
};
#[cfg(ferrofuse_bulk_copy)]
use crate::mem::{bulk, bulk_prefetch_l2, ld_shared_v4_if, shared_addr};

unsafe extern "C" {
    // Convergent (never moved into a branch only some lanes take), unlike an `asm!`.
    #[link_name = "llvm.nvvm.shfl.sync.bfly.f32"]
    fn shfl_sync_bfly_f32(member_mask: u32, v: f32, lane_mask: u32, clamp: u32) -> f32;
    #[link_name = "llvm.nvvm.redux.sync.umax"]
    fn redux_sync_umax(v: u32, member_mask: u32) -> u32;
}

/// `max(v, v of lane ^ mask)`; every lane of the warp calls it.
#[inline(always)]
fn max_xor(v: f32, mask: u32) -> f32 {
    // SAFETY: full member mask; every caller is executed by the whole warp.
    v.max(unsafe { shfl_sync_bfly_f32(0xffff_ffff, v, mask, 0x1f) })
}

/// The maximum over aligned runs of `lanes` lanes (a power of two <= 32); every lane of a
/// run gets it. Called by the whole warp with the same `lanes`.
#[inline(always)]
pub(crate) fn run_max(mut v: f32, lanes: u32) -> f32 {
    let mut mask = 16;
    while mask > 0 {
        if mask < lanes {
            v = max_xor(v, mask);
        }
        mask >>= 1;
    }
    v
}

/// The maximum of `v` over the 32 lanes of the warp, for `v` neither negative nor NaN (every
/// maximum of magnitudes here starts at `0.0` and grows by `max`, which skips NaN): the bit
/// patterns of such f32s order as their values, so one integer `redux.sync` (sm_80+) does
/// what `run_max(v, 32)`'s five shuffles and maxima do. Called by the whole warp.
#[inline(always)]
fn warp_max(v: f32) -> f32 {
    // SAFETY: full member mask; every caller is executed by the whole warp.
    f32::from_bits(unsafe { redux_sync_umax(v.to_bits(), 0xffff_ffff) })
}

/// Two f32 -> two E4M3 bytes (`lo` in the low byte), saturating round to nearest even.
#[inline(always)]
fn e4m3x2(lo: f32, hi: f32) -> u32 {
    #[cfg(ferrofuse_fp8_cvt)]
    {
        let h: u16;
        // SAFETY: a register-only conversion (sm_89+); PTX puts the first source in the upper
        // byte.
        unsafe {
            asm!("cvt.rn.satfinite.e4m3x2.f32 {0}, {1}, {2};", out(reg16) h, in(reg32) hi,
                 in(reg32) lo, options(pure, nomem, nostack, preserves_flags));
        }
        h as u32
    }
    #[cfg(not(ferrofuse_fp8_cvt))]
    {
        e4m3_from_f32(lo) as u32 | (e4m3_from_f32(hi) as u32) << 8
    }
}

/// The E4M3 bytes of `y[l] / scale` for the `w` lanes of one access (`inv` =
/// `reciprocal(scale)`), packed little-endian: word 0 holds lanes 0-3, word 1 lanes 4-7.
#[inline(always)]
pub(crate) fn quantize(w: u64, y: &[f32; 8], scale: f32, inv: f32) -> [u32; 2] {
    let mut q = [0.0f32; 8];
    // One branch per access, not per element: the lanes' divisions share a basic block that
    // the compiler interleaves.
    if inv != 0.0 {
        unroll!(l < w as usize => {
            q[l] = div_near(y[l], scale, inv);
        });
    } else {
        unroll!(l < w as usize => {
            q[l] = divide_far(y[l], scale);
        });
    }
    match w {
        1 => [e4m3x2(q[0], 0.0) & 0xff, 0],
        4 => [e4m3x2(q[0], q[1]) | e4m3x2(q[2], q[3]) << 16, 0],
        _ => [
            e4m3x2(q[0], q[1]) | e4m3x2(q[2], q[3]) << 16,
            e4m3x2(q[4], q[5]) | e4m3x2(q[6], q[7]) << 16,
        ],
    }
}

/// Stores the `w` bytes (1, 4 or 8) of one access at `p` when `pred` (aligned to `w` bytes;
/// predicated).
#[inline(always)]
pub(crate) unsafe fn store_q(w: u64, p: u64, q: [u32; 2], pred: bool) {
    // SAFETY (all arms): when `pred`, `p` is a valid global address of `w` bytes aligned to
    // `w` (caller); otherwise nothing is accessed.
    unsafe {
        match w {
            1 => asm!(
                "{{ .reg .pred ok; .reg .b16 v; setp.ne.u32 ok, {2}, 0; cvt.u16.u32 v, {1};",
                "@ok st.global.u8 [{0}], v; }}",
                in(reg64) p, in(reg32) q[0], in(reg32) pred as u32,
                options(nostack, preserves_flags)),
            4 => asm!(
                "{{ .reg .pred ok; setp.ne.u32 ok, {2}, 0; @ok st.global.u32 [{0}], {1}; }}",
                in(reg64) p, in(reg32) q[0], in(reg32) pred as u32,
                options(nostack, preserves_flags)),
            _ => asm!(
                "{{ .reg .pred ok; setp.ne.u32 ok, {3}, 0;",
                "@ok st.global.v2.u32 [{0}], {{{1}, {2}}}; }}",
                in(reg64) p, in(reg32) q[0], in(reg32) q[1], in(reg32) pred as u32,
                options(nostack, preserves_flags)),
        }
    }
}

/// Stores one f32 at `p` when `pred` (4-byte aligned; predicated).
#[inline(always)]
pub(crate) unsafe fn store_f32_if(p: u64, v: f32, pred: bool) {
    // SAFETY: when `pred`, `p` is a valid, 4-byte aligned global address (caller).
    unsafe {
        asm!("{{ .reg .pred ok; setp.ne.u32 ok, {2}, 0; @ok st.global.f32 [{0}], {1}; }}",
             in(reg64) p, in(reg32) v, in(reg32) pred as u32,
             options(nostack, preserves_flags));
    }
}

/// Loads the f32 at `p`.
#[inline(always)]
pub(crate) unsafe fn load_f32(p: u64) -> f32 {
    let v: f32;
    // SAFETY: `p` is a valid, 4-byte aligned global address (caller).
    unsafe {
        asm!("ld.global.f32 {0}, [{1}];", out(reg32) v, in(reg64) p,
             options(readonly, nostack, preserves_flags));
    }
    v
}

/// The static scale at `p` and its [`reciprocal`]. The scalar and realigned flat kernels call
/// it once before their loop; the vector flat kernel and the realigned one for small grids
/// in their loop body after the body's own loads are issued: computed before the loop, the
/// reciprocal made
/// every thread wait a whole memory latency for the scale before its first load, which at a
/// step or two per thread (few rows) is a large part of the call. The load is a
/// side-effecting `asm!`, so it is neither hoisted above those loads nor out of the loop;
/// after a thread's first step it hits in the caches.
///
/// # Safety
/// `p` is a valid, 4-byte aligned global address.
#[inline(always)]
unsafe fn static_scale(p: u64) -> (f32, f32) {
    // SAFETY: the caller's contract.
    let scale = unsafe { load_f32(p) };
    (scale, reciprocal(scale))
}

/// The raw bits of one access at `p` when `pred`, else zeros (predicated: a thread's loads
/// issue back to back).
#[inline(always)]
unsafe fn load_if<E: Elem, const M: VecMode>(p: u64, pred: bool) -> [u32; 4] {
    match M {
        // SAFETY: the caller's contract (a valid access of path M when `pred`).
        VecMode::V16 => unsafe { ld_v4_if(p, pred) },
        // SAFETY: as above.
        VecMode::Scalar => [unsafe { E::load_bits_if(p, pred) }, 0, 0, 0],
    }
}

/// Byte address of access `col` (counted in accesses) of row `row` of a storage matrix.
#[inline(always)]
fn addr<E: Elem, const M: VecMode>(base: u64, stride: u64, row: u64, col: u64) -> u64 {
    base + (row * stride + col * const { access_width::<E, M>() }) * E::BYTES
}

/// Byte address of access `col` of row `row` of the FP8 output.
#[inline(always)]
fn addr_q<E: Elem, const M: VecMode>(base: u64, stride: u64, row: u64, col: u64) -> u64 {
    base + row * stride + col * const { access_width::<E, M>() }
}

/// A flat walk's place in 32 bits: the row of a thread's current access and its column,
/// counted in accesses (in pairs of accesses on the per-group path). The host keeps an FP8
/// call below 2^32 accesses, so rows, a row's accesses and the grid's step fit. Where their
/// rows sit in L2 the flat loops run at the instruction issue rate, and in 32 bits the walk and
/// the addresses take far fewer integer instructions than in 64 (`bench/TUNING.md`, "FP8 loops
/// at the issue rate").
#[derive(Clone, Copy)]
struct Cursor32 {
    row: u32,
    col: u32,
}

/// The grid's step over a walk, in 32 bits: `rows` whole rows and `cols` columns, and
/// `back = per_row - cols`, the column past which a step wraps to the next row (so that no
/// sum overflows).
#[derive(Clone, Copy)]
struct Step32 {
    rows: u32,
    cols: u32,
    back: u32,
}

impl Step32 {
    /// The host's walk in 32 bits (every field below 2^32: see [`Cursor32`]).
    #[inline(always)]
    fn of(walk: &GridWalk) -> Self {
        Step32 {
            rows: walk.step_rows as u32,
            cols: walk.step_cols as u32,
            back: (walk.per_row - walk.step_cols) as u32,
        }
    }
}

impl Cursor32 {
    /// The place of access `i` (`i < 2^32`, so [`GridWalk::row_of`] is exact).
    #[inline(always)]
    fn of(walk: &GridWalk, i: u64) -> Self {
        let row = walk.row_of(i);
        Cursor32 {
            row: row as u32,
            col: (i - row * walk.per_row) as u32,
        }
    }

    /// The place one grid step on. Past the last row the row number may wrap; accesses there
    /// are predicated off by their index, never by the row.
    #[inline(always)]
    fn advance(self, step: Step32) -> Self {
        let wrap = self.col >= step.back;
        Cursor32 {
            row: self.row.wrapping_add(step.rows).wrapping_add(wrap as u32),
            col: if wrap {
                self.col - step.back
            } else {
                self.col + step.cols
            },
        }
    }

    /// Byte address of this access (column `col + cols` of the same row) in a storage matrix
    /// at `base` with row stride `stride` elements.
    #[inline(always)]
    fn addr<E: Elem>(self, base: u64, stride: u64, cols: u32) -> u64 {
        let width = const { access_width::<E, { VecMode::V16 }>() };
        base + self.row as u64 * (stride * E::BYTES)
            + self.col.wrapping_add(cols) as u64 * width * E::BYTES
    }

    /// Byte address of this access (column `col + cols`) in the FP8 output at `base`, row
    /// stride `stride` bytes.
    #[inline(always)]
    fn addr_q<E: Elem>(self, base: u64, stride: u64, cols: u32) -> u64 {
        let width = const { access_width::<E, { VecMode::V16 }>() };
        base + self.row as u64 * stride + self.col.wrapping_add(cols) as u64 * width
    }
}

/// `act(a) * b` over the lanes of one access.
#[inline(always)]
fn gated<E: Elem, const M: VecMode, A: GatedAct>(a: [u32; 4], b: [u32; 4]) -> [f32; 8] {
    let (a, b) = (E::widen_access::<M>(a), E::widen_access::<M>(b));
    let mut y = [0.0f32; 8];
    unroll!(l < const { access_width::<E, M>() } as usize => {
        y[l] = A::value(a[l]) * b[l];
    });
    y
}

/// `max |y[l]|` over the lanes of one access (0 when `!ok`).
#[inline(always)]
fn access_amax(w: u64, y: &[f32; 8], ok: bool) -> f32 {
    let mut m = 0.0f32;
    unroll!(l < w as usize => {
        m = m.max(y[l].abs());
    });
    if ok { m } else { 0.0 }
}

/// The flat kernel (static and per-group scales); see the module docs. `LANES`: 0 for a
/// static scale, else the lanes a group spans (`GatedFp8Params::group_lanes`).
#[inline(always)]
unsafe fn flat<E: Elem, const M: VecMode, A: GatedAct, const LANES: u32>(p: &GatedFp8Params) {
    let grouped = LANES != 0;
    grid_dependency_sync();
    if M == VecMode::V16 && grouped {
        // SAFETY: the caller's contract.
        return unsafe { group_v16::<E, A, LANES>(p) };
    }
    if M == VecMode::V16 {
        // SAFETY: the caller's contract.
        return unsafe { flat_v16::<E, A, false>(p) };
    }
    // The scalar path reads the static scale once, before its loop: read in the loop body
    // after the loads, as on the vector path, it measured 7% slower at the few rows where this
    // path runs (why is not known; `bench/TUNING.md`, "The static scale read after the first
    // loads").
    let fixed = if grouped {
        (0.0, 0.0)
    } else {
        // SAFETY: the host checked that a static `scale` is one readable, aligned f32.
        unsafe { static_scale(p.scale) }
    };
    let w = const { access_width::<E, M>() };
    let walk: &GridWalk = &p.walk;
    let per_step = 32 * p.batch as u64;
    let thread = grid::block_x() * grid::block_dim_x() + grid::thread_x();
    let lane = grid::thread_x() & 31;
    let step = grid::grid_dim_x() * grid::block_dim_x() / 32 * per_step;
    let total = p.rows * walk.per_row;
    let mut base = thread / 32 * per_step;
    while base < total {
        // Sized for `unroll!`'s eight steps; only the first `GATED_FP8_SCALAR_BATCH` are used.
        let mut a = [0u32; 8];
        let mut b = [0u32; 8];
        let mut at = [(0u64, 0u64); 8];
        let mut ok = [false; 8];
        unroll!(k < GATED_FP8_SCALAR_BATCH => {
            let i = base + lane + 32 * k as u64;
            ok[k] = (k as u32) < p.batch && i < total;
            let row = walk.row_of(i);
            at[k] = (row, i - row * walk.per_row);
            let (r, c) = at[k];
            // SAFETY: where `ok[k]`, access i < total is inside `a` and `b` (the host checked
            // the allocations cover rows x cols at these strides, and the alignment of M; i
            // < 2^32, so `row_of` is exact); the others are predicated off.
            unsafe {
                a[k] = E::load_bits_if(addr::<E, M>(p.a, p.a_stride, r, c), ok[k]);
                b[k] = E::load_bits_if(addr::<E, M>(p.b, p.b_stride, r, c), ok[k]);
            }
        });
        let mut y = [0.0f32; 8];
        let mut amax = 0.0f32;
        unroll!(k < GATED_FP8_SCALAR_BATCH => {
            y[k] = A::value(E::widen(a[k])) * E::widen(b[k]);
            if grouped && ok[k] {
                amax = amax.max(y[k].abs());
            }
        });
        let (scale, inv) = if grouped {
            let s = dynamic_scale(run_max(amax, LANES), p.min_scale, f32::INFINITY);
            let (r, c) = at[0];
            let at_s = p.scale + (r * p.scale_row + (c >> p.group_shift) * p.scale_group) * 4;
            // SAFETY: one step is one group (`batch` = group / 32): lane 0 stores its scale,
            // inside the scale matrix (the host checked its shape and strides).
            unsafe { store_f32_if(at_s, s, lane == 0 && ok[0]) };
            (s, reciprocal(s))
        } else {
            fixed
        };
        unroll!(k < GATED_FP8_SCALAR_BATCH => {
            let (r, c) = at[k];
            let mut v = [0.0f32; 8];
            v[0] = y[k];
            let q = quantize(w, &v, scale, inv);
            // SAFETY: as for the loads: `y` covers rows x cols at its stride.
            unsafe { store_q(w, addr_q::<E, M>(p.y, p.y_stride, r, c), q, ok[k]) };
        });
        base += step;
    }
}

/// [`flat`] on the vector path: thread `g` of `G` takes accesses `g, g + G, ...` (so a warp's
/// 32 lanes take 32 consecutive accesses, `G` being a multiple of 32), its row and column
/// ([`Cursor32`]) advanced by the host's [`GridWalk`] step as in the plain gated forward; with
/// `ENDS`, then a flat range's ragged end element where this thread takes one.
#[inline(always)]
unsafe fn flat_v16<E: Elem, A: GatedAct, const ENDS: bool>(p: &GatedFp8Params) {
    let walk = &p.walk;
    let step = grid::grid_dim_x() * grid::block_dim_x();
    let mut i = grid::block_x() * grid::block_dim_x() + grid::thread_x();
    let total = p.rows * walk.per_row;
    let grid_step = Step32::of(walk);
    let mut at = Cursor32::of(walk, i);
    // Two accesses per thread and step, all four loads issued first: twice the bytes in
    // flight of one access per thread (this kernel's registers cap its occupancy below the
    // plain kernel's).
    while i < total {
        let at2 = at.advance(grid_step);
        let ok2 = i + step < total;
        // SAFETY: access i (and i + step where `ok2`) is inside `a` and `b` (the host's
        // checks; `at` and `at2` are their places, the walk being built for this grid).
        let (a, b, a2, b2) = unsafe {
            (
                ld_v4_if(at.addr::<E>(p.a, p.a_stride, 0), true),
                ld_v4_if(at.addr::<E>(p.b, p.b_stride, 0), true),
                ld_v4_if(at2.addr::<E>(p.a, p.a_stride, 0), ok2),
                ld_v4_if(at2.addr::<E>(p.b, p.b_stride, 0), ok2),
            )
        };
        // SAFETY: the host checked that `scale` is one readable, aligned f32.
        let (scale, inv) = unsafe { static_scale(p.scale) };
        // SAFETY: as for the loads.
        unsafe {
            flat_v16_one::<E, A>(p, a, b, at, scale, inv);
            // The second access's math only where it exists: on a grid of a thread per access
            // (up to the threads the device holds) it never does, and computed anyway it
            // doubled each thread's exponentials and reciprocals.
            if ok2 {
                flat_v16_one::<E, A>(p, a2, b2, at2, scale, inv);
            }
        }
        at = at2.advance(grid_step);
        i += 2 * step;
    }
    if !ENDS {
        return;
    }
    if let Some(e) = flat_end::<E, { VecMode::V16 }>(p.ends, step, total) {
        let at = |base: u64| end_addr::<E>(base, e);
        // SAFETY: a flat range's end element lies inside `a`, `b` and `y` (one byte per
        // element), next to the body (the host's split; see `FlatEnds`); the host checked the
        // scale as above.
        unsafe {
            let (a, b) = (
                E::load_bits_if(at(p.a), true),
                E::load_bits_if(at(p.b), true),
            );
            let (scale, inv) = static_scale(p.scale);
            let mut y = [0.0f32; 8];
            y[0] = A::value(E::widen(a)) * E::widen(b);
            let q = quantize(1, &y, scale, inv);
            store_q(1, p.y.wrapping_add(e as u64), q, true);
        }
    }
}

/// The output of one access of [`flat_v16`] that exists (its loads done): `y`, quantised with
/// the static scale, stored.
#[inline(always)]
unsafe fn flat_v16_one<E: Elem, A: GatedAct>(
    p: &GatedFp8Params,
    a: [u32; 4],
    b: [u32; 4],
    at: Cursor32,
    scale: f32,
    inv: f32,
) {
    const V: VecMode = VecMode::V16;
    let w = const { access_width::<E, V>() };
    let q = quantize(w, &gated::<E, V, A>(a, b), scale, inv);
    // SAFETY: the access exists (the caller's condition), so its `y` is inside the rows x
    // cols at its stride, aligned to `w` bytes (the host's checks).
    unsafe { store_q(w, at.addr_q::<E>(p.y, p.y_stride, 0), q, true) };
}

/// The static vector path over a flat range, its ragged head and tail included (`M` is
/// [`VecMode::V16`]: the form [`dispatch!`] calls).
///
/// # Safety
/// As for [`flat`]; the ends next to the body lie inside `a`, `b` and `y`.
#[inline(always)]
unsafe fn flat_ends<E: Elem, const M: VecMode, A: GatedAct>(p: &GatedFp8Params) {
    grid_dependency_sync();
    // SAFETY: the caller's contract.
    unsafe { flat_v16::<E, A, true>(p) }
}

/// [`flat`] on the vector path with per-group scales. A group of `2 * LANES` accesses is held
/// by `LANES` consecutive lanes, two accesses each, `LANES` apart: the walk ([`GridWalk`],
/// built by the host over these pairs, `per_row` of them per row) gives thread `g` of `G`
/// pairs `g, g + G, ...`; pair `k` of a row is accesses `c` and `c + LANES`, `c = k + (k &
/// !(LANES - 1))`. A row's pairs are a whole number of groups and `LANES` divides 32, so a
/// group's lanes are `LANES` aligned lanes of one warp; one butterfly, one scale and one
/// reciprocal serve both accesses (two accesses a grid apart, as on the static path, would
/// each need their own).
#[inline(always)]
unsafe fn group_v16<E: Elem, A: GatedAct, const LANES: u32>(p: &GatedFp8Params) {
    const V: VecMode = VecMode::V16;
    let w = const { access_width::<E, V>() };
    let half = LANES as u64;
    let walk = &p.walk;
    let step = grid::grid_dim_x() * grid::block_dim_x();
    let mut i = grid::block_x() * grid::block_dim_x() + grid::thread_x();
    let lane = grid::thread_x() & 31;
    let first = lane & (half - 1) == 0;
    let total = p.rows * walk.per_row;
    let grid_step = Step32::of(walk);
    let mut pair = Cursor32::of(walk, i);
    // Warp-uniform: every lane of the warp runs the same steps (the shuffles need them all).
    while i - lane < total {
        let ok = i < total;
        // The pair's first access: its column in accesses.
        let k = pair.col;
        let at = Cursor32 {
            row: pair.row,
            col: k + (k & !(LANES - 1)),
        };
        // SAFETY: where `ok`, pair i is inside the rows, so accesses `at` and `LANES` columns
        // on are inside `a` and `b` (the host's checks; the walk is built for this grid).
        let (a, b, a2, b2) = unsafe {
            (
                ld_v4_if(at.addr::<E>(p.a, p.a_stride, 0), ok),
                ld_v4_if(at.addr::<E>(p.b, p.b_stride, 0), ok),
                ld_v4_if(at.addr::<E>(p.a, p.a_stride, LANES), ok),
                ld_v4_if(at.addr::<E>(p.b, p.b_stride, LANES), ok),
            )
        };
        let (y, y2) = (gated::<E, V, A>(a, b), gated::<E, V, A>(a2, b2));
        let amax = run_max(access_amax(w, &y, ok).max(access_amax(w, &y2, ok)), LANES);
        let scale = dynamic_scale(amax, p.min_scale, f32::INFINITY);
        let inv = reciprocal(scale);
        let group = (at.col >> p.group_shift) as u64;
        let at_s = p.scale + (at.row as u64 * p.scale_row + group * p.scale_group) * 4;
        let (q, q2) = (quantize(w, &y, scale, inv), quantize(w, &y2, scale, inv));
        // SAFETY: the group's first lane stores its scale, inside the scale matrix (the host
        // checked its shape and strides) when its pair is in range; `y` covers rows x cols
        // at its stride, aligned to `w` bytes (the host's checks).
        unsafe {
            store_f32_if(at_s, scale, first && ok);
            store_q(w, at.addr_q::<E>(p.y, p.y_stride, 0), q, ok);
            store_q(w, at.addr_q::<E>(p.y, p.y_stride, LANES), q2, ok);
        }
        pair = pair.advance(grid_step);
        i += step;
    }
}

/// The launch-sized dynamic shared memory as f32s.
#[inline(always)]
fn smem_f32() -> *mut f32 {
    gpu_launch_sized_workgroup_mem::<f32>()
}

/// How [`row_max`] reduces each warp's maximum.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum WarpMax {
    /// Five shuffles and maxima ([`run_max`]).
    Butterfly,
    /// One `redux.sync` ([`warp_max`]).
    Redux,
}

/// The maximum of `v` (neither negative nor NaN) over the `warps` warps of one row (slots
/// `slot .. slot + warps` of shared memory); every thread of the row gets it. Each warp's
/// maximum as `how` says (the per-token norm is faster with `redux.sync`, the gated row kernel
/// slower: `bench/TUNING.md`, "The per-token maximum by `redux.sync`"). With more than one warp
/// per row it executes one barrier, so every thread of the block calls it (same `warps`), once
/// per launch.
///
/// # Safety
/// `slot + warps` f32s fit in the launch's dynamic shared memory.
#[inline(always)]
pub(crate) unsafe fn row_max(
    how: WarpMax,
    v: f32,
    lane: u32,
    warp: u32,
    warps: u32,
    slot: u32,
) -> f32 {
    let of_warp = #[inline(always)]
    |v: f32| match how {
        WarpMax::Butterfly => run_max(v, 32),
        WarpMax::Redux => warp_max(v),
    };
    let m = of_warp(v);
    if warps <= 1 {
        return m;
    }
    let smem = smem_f32();
    if lane == 0 {
        // SAFETY: slot + warp < slot + warps: inside the allocation (caller's contract).
        unsafe { *smem.add((slot + warp) as usize) = m };
    }
    // SAFETY: reached by every thread of the block (the caller's contract).
    unsafe { nvptx::_syncthreads() };
    let t = if lane < warps {
        // SAFETY: as above; written before the barrier by lane 0 of warp `lane`.
        unsafe { *smem.add((slot + lane) as usize) }
    } else {
        0.0
    };
    of_warp(t)
}

/// The raw loads of one tile of a row, this thread's accesses `first + j * tpr`, `j < chunks`.
/// `y` is written twice in the source, for the maximum and for the stores; in a one-tile row
/// the compiler keeps it between the two (one exponential per element in the SASS), in a
/// row of several tiles each walk loads and computes its own.
struct Tile<const N: usize> {
    a: [[u32; 4]; N],
    b: [[u32; 4]; N],
    ok: [bool; N],
}

/// Loads one tile of a row (see [`Tile`]), predicated and back to back.
#[inline(always)]
unsafe fn row_tile<E: Elem, const M: VecMode, const N: usize>(
    p: &GatedFp8Params,
    row: u64,
    live: bool,
    first: u64,
    tpr: u64,
) -> Tile<N> {
    let mut t = Tile {
        a: [[0u32; 4]; N],
        b: [[0u32; 4]; N],
        ok: [false; N],
    };
    unroll!(j < N => {
        let c = first + j as u64 * tpr;
        t.ok[j] = live && (j as u32) < p.chunks && c < p.walk.per_row;
        // SAFETY: where `ok[j]`, access c of row `row` is inside `a` and `b` (the host's
        // checks); the others are predicated off.
        unsafe {
            t.a[j] = load_if::<E, M>(addr::<E, M>(p.a, p.a_stride, row, c), t.ok[j]);
            t.b[j] = load_if::<E, M>(addr::<E, M>(p.b, p.b_stride, row, c), t.ok[j]);
        }
    });
    t
}

/// The largest `|y|` of a tile.
#[inline(always)]
fn tile_amax<E: Elem, const M: VecMode, A: GatedAct, const N: usize>(t: &Tile<N>) -> f32 {
    let mut amax = 0.0f32;
    unroll!(j < N => {
        let y = gated::<E, M, A>(t.a[j], t.b[j]);
        amax = amax.max(access_amax(const { access_width::<E, M>() }, &y, t.ok[j]));
    });
    amax
}

/// Stores one tile of a row (see [`row_tile`]) under `scale` (`inv` = `reciprocal(scale)`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn row_store<E: Elem, const M: VecMode, A: GatedAct, const N: usize>(
    p: &GatedFp8Params,
    t: &Tile<N>,
    row: u64,
    first: u64,
    tpr: u64,
    scale: f32,
    inv: f32,
) {
    let w = const { access_width::<E, M>() };
    unroll!(j < N => {
        let c = first + j as u64 * tpr;
        let y = gated::<E, M, A>(t.a[j], t.b[j]);
        let q = quantize(w, &y, scale, inv);
        // SAFETY: where `ok`, access c of row `row` is inside `y` (the host's checks).
        unsafe { store_q(w, addr_q::<E, M>(p.y, p.y_stride, row, c), q, t.ok[j]) };
    });
}

/// Thread 0 asks L2 for accesses `from .. from + count` (clipped to the row) of row
/// `row + p.prefetch_rows`'s `a` and `b` (one bulk prefetch each) while its block works on
/// the same accesses of row `row`. The host sets `prefetch_rows` to the rows resident at
/// once: blocks start in order, so that row's blocks start about when this one ends and find
/// their accesses in L2, and HBM keeps streaming while this block reduces and stores. Nothing
/// on archs without the bulk prefetch.
///
/// # Safety
/// Where `prefetch_rows` is not 0: the vector path (each row's accesses are 16-byte aligned
/// and 16 bytes long, as the bulk prefetch needs), `walk.per_row * 16` fits in a `u32`.
#[inline(always)]
unsafe fn prefetch_ahead<E: Elem, const M: VecMode>(
    p: &GatedFp8Params,
    row: u64,
    t_row: u64,
    from: u64,
    count: u64,
) {
    #[cfg(ferrofuse_bulk_copy)]
    {
        let ahead = row + p.prefetch_rows as u64;
        let to = p.walk.per_row.min(from + count);
        if M == VecMode::V16 && p.prefetch_rows != 0 && t_row == 0 && ahead < p.rows && from < to {
            let bytes = ((to - from) * 16) as u32;
            // SAFETY: row `ahead` exists; its accesses below `per_row` are inside `a` and `b`
            // (the host's checks), aligned as the caller's contract says.
            unsafe {
                bulk_prefetch_l2(addr::<E, M>(p.a, p.a_stride, ahead, from), bytes);
                bulk_prefetch_l2(addr::<E, M>(p.b, p.b_stride, ahead, from), bytes);
            }
        }
    }
    #[cfg(not(ferrofuse_bulk_copy))]
    let _ = (p, row, t_row, from, count);
}

/// The maximum of the blocks' `block_max` over this block's cluster, for every thread: thread
/// 0 publishes it in slot `slot`, a cluster barrier, then lane `i` reads block `i`'s and the
/// warp takes the maximum. Arrives at a second cluster barrier after the read; the caller waits
/// on it after its last access, so that no block exits (releasing its shared memory) while
/// another may still read it.
///
/// # Safety
/// Every thread of every block of the cluster calls it once, then [`cluster::wait`]; the
/// cluster has at most 32 blocks; slot `slot` is inside the dynamic shared memory.
#[inline(always)]
pub(crate) unsafe fn cluster_max(block_max: f32, t_row: u64, slot: u32) -> f32 {
    let local = smem_f32().wrapping_add(slot as usize);
    if t_row == 0 {
        // SAFETY: inside the allocation (caller's contract); read by the cluster only after
        // the barrier.
        unsafe { *local = block_max };
    }
    // SAFETY: every thread of the cluster arrives and waits (caller's contract).
    unsafe {
        cluster::arrive();
        cluster::wait();
    }
    let lane = (t_row & 31) as u32;
    let v = if lane < cluster::size() {
        // SAFETY: rank `lane` is in the cluster, which waits at the second barrier before
        // exiting; written before the first barrier.
        unsafe { cluster::read_remote(local.cast_const(), lane) }
    } else {
        0.0
    };
    let m = run_max(v, 32);
    // SAFETY: as above; the caller waits.
    unsafe { cluster::arrive() };
    m
}

/// The row kernel (per-token scales); see the module docs. `SPLIT`: a row on the blocks of a
/// thread-block cluster, block rank `r` holding the row's accesses `r * 512 * chunks ..` (one
/// tile each). `PREFETCH`: with [`prefetch_ahead`], in a body of its own: in a shared body the
/// prefetch's address math, scheduled among the loads, delays them in rows that do not
/// prefetch.
#[inline(always)]
unsafe fn per_token<
    E: Elem,
    const M: VecMode,
    A: GatedAct,
    const CHUNKS: usize,
    const SPLIT: bool,
    const PREFETCH: bool,
>(
    p: &GatedFp8Params,
) {
    grid_dependency_sync();
    // One row per block (or cluster) of ROW_THREADS threads per block (the host's geometry),
    // a constant so that a thread's chunks are one base address plus immediate offsets (with
    // the row's width a run-time value, the addresses of every chunk took registers of their
    // own).
    const TPR: u64 = GATED_FP8_ROW_MAX_THREADS as u64;
    let t_row = grid::thread_x();
    let (row, rank) = if SPLIT {
        let n = cluster::size().max(1) as u64;
        (grid::block_x() / n, cluster::rank() as u64)
    } else {
        (grid::block_x(), 0)
    };
    let live = row < p.rows;
    let (lane, warp, warps) = ((t_row & 31) as u32, (t_row / 32) as u32, (TPR / 32) as u32);
    let slot = 0;
    let tpr = TPR;
    let tile = TPR * p.chunks as u64;
    let scale_at = p.scale + row * p.scale_row * 4;
    if SPLIT || tile >= p.walk.per_row {
        // The whole row (or the block's tile of it) in registers: one read, one write.
        let first = rank * tile;
        // SAFETY: the host's checks (see `row_tile`).
        let t = unsafe { row_tile::<E, M, CHUNKS>(p, row, live, first + t_row, tpr) };
        if PREFETCH {
            // SAFETY: the host sets `prefetch_rows` for whole rows of 16-byte accesses only.
            unsafe { prefetch_ahead::<E, M>(p, row, t_row, first, tile) };
        }
        let amax = tile_amax::<E, M, A, CHUNKS>(&t);
        // SAFETY: `slot + warps` <= the block's warps, which the dynamic shared memory holds;
        // every thread of the block gets here once.
        let amax = unsafe { row_max(WarpMax::Butterfly, amax, lane, warp, warps, slot) };
        // SAFETY: every thread of the cluster gets here once and waits below; slot `warps`
        // follows the warps' slots (GATED_FP8_ROW_SMEM_BYTES).
        let amax = if SPLIT {
            unsafe { cluster_max(amax, t_row, warps) }
        } else {
            amax
        };
        let scale = dynamic_scale(amax, p.min_scale, p.scale_ub);
        // SAFETY: the row's scale is inside the scale matrix for a live row.
        unsafe { store_f32_if(scale_at, scale, live && rank == 0 && t_row == 0) };
        // SAFETY: as for the loads.
        unsafe {
            row_store::<E, M, A, CHUNKS>(p, &t, row, first + t_row, tpr, scale, reciprocal(scale))
        };
        if SPLIT {
            // SAFETY: the second barrier of `cluster_max`.
            unsafe { cluster::wait() };
        }
        return;
    }
    // Longer rows: the maximum over every tile, then each tile again for the output, in tiles
    // of `LOOP_CHUNKS` accesses per thread (the registers of a whole-row tile as well as the
    // loop's state spilled).
    const LOOP_CHUNKS: usize = 2;
    let tile = TPR * LOOP_CHUNKS as u64;
    let mut amax = 0.0f32;
    let mut first = t_row;
    while first < p.walk.per_row + t_row {
        // SAFETY: as above.
        let t = unsafe { row_tile::<E, M, LOOP_CHUNKS>(p, row, live, first, tpr) };
        amax = amax.max(tile_amax::<E, M, A, LOOP_CHUNKS>(&t));
        first += tile;
    }
    // SAFETY: as above.
    let amax = unsafe { row_max(WarpMax::Butterfly, amax, lane, warp, warps, slot) };
    let scale = dynamic_scale(amax, p.min_scale, p.scale_ub);
    // SAFETY: as above.
    unsafe { store_f32_if(scale_at, scale, live && t_row == 0) };
    let inv = reciprocal(scale);
    let mut first = t_row;
    while first < p.walk.per_row + t_row {
        // SAFETY: as above.
        unsafe {
            let t = row_tile::<E, M, LOOP_CHUNKS>(p, row, live, first, tpr);
            row_store::<E, M, A, LOOP_CHUNKS>(p, &t, row, first, tpr, scale, inv);
        }
        first += tile;
    }
}

/// A many-rows block's thread as a thread of its row group: `(threads_per_row, k, t)`, this
/// thread `t` of group `k`. In 32 bits: the block holds at most 512 threads, and one division
/// per thread (by at least one warp, which the host plans: no division by zero to check).
#[inline(always)]
fn row_group(p: &GatedFp8Params) -> (u32, u32, u64) {
    let tpr = p.threads_per_row.max(32);
    let t = grid::thread_x() as u32;
    let k = t / tpr;
    (tpr, k, (t - k * tpr) as u64)
}

/// The many-rows kernel (per-token scales, 16-byte accesses; see the module docs): row
/// `block * rows_per_block + k` on threads `k * threads_per_row ..` of the block, each holding
/// `CHUNKS` accesses `t + threads_per_row * j` (the host plans `chunks` = `CHUNKS`, so every
/// access slot's math is for a thread of the row). `PREFETCH` as in [`per_token`]: the row's
/// first thread asks L2 for the row `prefetch_rows` ahead.
#[inline(always)]
unsafe fn per_token_rows<
    E: Elem,
    const M: VecMode,
    A: GatedAct,
    const CHUNKS: usize,
    const PREFETCH: bool,
>(
    p: &GatedFp8Params,
) {
    grid_dependency_sync();
    let (tpr, k, t_row) = row_group(p);
    let row = grid::block_x() * p.rows_per_block as u64 + k as u64;
    let live = row < p.rows;
    let warps = tpr / 32;
    let (lane, warp) = ((t_row & 31) as u32, (t_row / 32) as u32);
    let tpr = tpr as u64;
    // SAFETY: the host's checks (see `row_tile`); `chunks` = CHUNKS tiles of `tpr` cover the
    // row.
    let tile = unsafe { row_tile::<E, M, CHUNKS>(p, row, live, t_row, tpr) };
    if PREFETCH {
        // SAFETY: the host sets `prefetch_rows` for whole rows of 16-byte accesses only.
        unsafe { prefetch_ahead::<E, M>(p, row, t_row, 0, tpr * CHUNKS as u64) };
    }
    let amax = tile_amax::<E, M, A, CHUNKS>(&tile);
    // SAFETY: row k's warps take slots `k * warps ..`, all below the block's warps, which the
    // dynamic shared memory holds; every thread of the block gets here once, with the same
    // `warps`.
    let amax = unsafe { row_max(WarpMax::Butterfly, amax, lane, warp, warps, k * warps) };
    let scale = dynamic_scale(amax, p.min_scale, p.scale_ub);
    // SAFETY: the row's scale is inside the scale matrix for a live row.
    unsafe { store_f32_if(p.scale + row * p.scale_row * 4, scale, live && t_row == 0) };
    // SAFETY: as for the loads.
    unsafe { row_store::<E, M, A, CHUNKS>(p, &tile, row, t_row, tpr, scale, reciprocal(scale)) };
}

/// Aligned `L`-byte word `c` of the row of `y` that starts at `ya` (`L` the lanes of a 16-byte
/// vector of the inputs: 8 bytes for 16-bit inputs, 4 for f32): its address, and the column
/// of its first byte (wrapped when before the row).
#[inline(always)]
fn word_of<E: Elem>(ya: u64, c: u64) -> (u64, u64) {
    let l = E::LANES as u64;
    let v = (ya & !(l - 1)) + c * l;
    (v, v.wrapping_sub(ya))
}

/// The inputs of word `c` (see [`word_of`]) of row `row`, whose `y` starts at `ya`, when
/// `mine`: the 16 bytes of `a` and of `b` at its columns, as 16-byte vectors (zeros for
/// columns outside the row), and whether the word holds columns of the row. Loaded as the
/// realigned gated forward loads a vector's inputs (the one or two aligned vectors they span,
/// moved into place in registers; the second is the next access's first, mostly an L1 hit);
/// a word whose vectors leave the row loads its columns inside the row element by element,
/// each a predicated load into a word of its own, all issued before the first is used.
/// `AT_ONCE`: both kinds of load are issued, each predicated, before either is used, so a
/// warp holding a row's end waits for memory once; otherwise the element loads sit in a
/// branch after the vector lanes' (fewer registers live). `then` runs after the vector loads
/// (and with `AT_ONCE` the element loads) are issued, before any is used, so a load it makes
/// is in flight with them; its result comes back last.
///
/// # Safety
/// Row `row` exists when `mine`; `a` and `b` hold `rows x cols` at their strides (host-checked).
#[inline(always)]
unsafe fn load_word<E: Elem, const AT_ONCE: bool, T>(
    p: &GatedFp8Params,
    row: u64,
    ya: u64,
    c: u64,
    mine: bool,
    then: impl FnOnce() -> T,
) -> ([u32; 4], [u32; 4], bool, T) {
    let (size, l) = (E::BYTES, E::LANES as u64);
    let row_bytes = p.cols * size;
    let (aa, ba) = (p.a + row * p.a_stride * size, p.b + row * p.b_stride * size);
    let (v, col) = word_of::<E>(ya, c);
    let touches = mine && v < ya + p.cols && v + l > ya;
    let whole = mine && v >= ya && v + l <= ya + p.cols;
    let at = col.wrapping_mul(size);
    // SAFETY: `[aa, aa + row_bytes)` and `[ba, ba + row_bytes)` are rows of `a` and `b`;
    // `load_realigned` reads only vectors inside them.
    let ((a_ok, a0, a1, a_sh), (b_ok, b0, b1, b_sh)) = unsafe {
        (
            load_realigned(aa.wrapping_add(at), aa, aa + row_bytes, whole),
            load_realigned(ba.wrapping_add(at), ba, ba + row_bytes, whole),
        )
    };
    if AT_ONCE {
        let by_element = touches && !(a_ok && b_ok);
        // SAFETY: as below.
        let bits = unsafe { word_elements::<E>(aa, ba, col, p.cols, by_element) };
        let t = then();
        return if a_ok && b_ok {
            (realign(a0, a1, a_sh), realign(b0, b1, b_sh), touches, t)
        } else {
            (
                pack_lanes::<E>(&bits[0]),
                pack_lanes::<E>(&bits[1]),
                touches,
                t,
            )
        };
    }
    let t = then();
    let (mut a, mut b) = ([0u32; 4], [0u32; 4]);
    if a_ok && b_ok {
        (a, b) = (realign(a0, a1, a_sh), realign(b0, b1, b_sh));
    } else if touches {
        // SAFETY: the row's columns of `a` and `b` start at `aa` and `ba`.
        let bits = unsafe { word_elements::<E>(aa, ba, col, p.cols, true) };
        (a, b) = (pack_lanes::<E>(&bits[0]), pack_lanes::<E>(&bits[1]));
    }
    (a, b, touches, t)
}

/// The bits of the columns `col + i` (`i < L`, `col` wrapped when before the row) of `a` and of
/// `b` that lie inside the row, each a predicated element load (zeros elsewhere, and
/// everywhere when not `load`).
///
/// # Safety
/// `aa` and `ba` are the starts of a row of `cols` elements of `a` and of `b`.
#[inline(always)]
unsafe fn word_elements<E: Elem>(
    aa: u64,
    ba: u64,
    col: u64,
    cols: u64,
    load: bool,
) -> [[u32; 8]; 2] {
    let size = E::BYTES;
    let mut bits = [[0u32; 8]; 2];
    unroll!(i < E::LANES => {
        let k = col.wrapping_add(i as u64);
        let inside = load && k < cols;
        // SAFETY: column k < cols of the row, when inside.
        unsafe {
            bits[0][i] = E::load_bits_if(aa.wrapping_add(k.wrapping_mul(size)), inside);
            bits[1][i] = E::load_bits_if(ba.wrapping_add(k.wrapping_mul(size)), inside);
        }
    });
    bits
}

/// Stores word `c` (see [`word_of`]) of the row of `y` at `ya`, its FP8 bytes `q`, when it
/// holds columns of the row (`touches`): one `L`-byte store when the word lies inside the row,
/// else its columns inside the row byte by byte.
///
/// # Safety
/// `ya` is a row of `cols` bytes of the checked FP8 output.
#[inline(always)]
unsafe fn store_word<E: Elem>(ya: u64, cols: u64, c: u64, touches: bool, q: [u32; 2]) {
    let l = E::LANES as u64;
    let (v, col) = word_of::<E>(ya, c);
    let whole = v >= ya && v + l <= ya + cols;
    // SAFETY: a whole word of the row, aligned to L bytes.
    unsafe { store_q(l, v, q, touches && whole) };
    if touches && !whole {
        unroll!(i < E::LANES => {
            let k = col.wrapping_add(i as u64);
            let byte = (q[i / 4] >> (8 * (i % 4))) & 0xff;
            // SAFETY: column k < cols of the row, when stored.
            unsafe { store_q(1, ya.wrapping_add(k), [byte, 0], k < cols) };
        });
    }
}

/// The per-token row kernel for rows off the 16-byte grid whose words fit one tile
/// (`gated_fp8_row_realigned_*`): one block of 512 threads per row, thread `t` holding words
/// `t + 512 j`, `j < chunks <= CHUNKS`, as the row kernel ([`realigned_row`]).
///
/// # Safety
/// The host's plan: `walk.per_row` the words a row can touch (`ceil(cols / L) + 1`), at most
/// `512 * chunks`; one block of 512 threads per row; `GATED_FP8_ROW_SMEM_BYTES` of dynamic
/// shared memory; the operands checked (rows inside their allocations, no overlaps).
#[inline(always)]
unsafe fn per_token_realigned<E: Elem, const M: VecMode, A: GatedAct, const CHUNKS: usize>(
    p: &GatedFp8Params,
) {
    const TPR: u64 = GATED_FP8_ROW_MAX_THREADS as u64;
    grid_dependency_sync();
    let t_row = grid::thread_x();
    let row = grid::block_x();
    // SAFETY: the host's plan, as above; the block's warps take slots `0 .. 16`.
    unsafe { realigned_row::<E, A, CHUNKS>(p, row, row < p.rows, t_row, TPR, 0) };
}

/// The many-rows kernel for rows off the 16-byte grid (`gated_fp8_rows_realigned_*`): the
/// geometry of [`per_token_rows`] (row `block * rows_per_block + k` on threads `k *
/// threads_per_row ..` of the block) over a row's aligned words of `y` ([`realigned_row`]),
/// each thread holding words `t + threads_per_row * j`, `j < chunks <= CHUNKS`.
///
/// # Safety
/// The host's plan: `walk.per_row` the words a row can touch, at most `threads_per_row *
/// CHUNKS`; `threads_per_row` a multiple of 32, `rows_per_block * threads_per_row` the block's
/// threads (at most 512); `GATED_FP8_ROW_SMEM_BYTES` of dynamic shared memory; the operands
/// checked.
#[inline(always)]
unsafe fn per_token_rows_realigned<E: Elem, const M: VecMode, A: GatedAct, const CHUNKS: usize>(
    p: &GatedFp8Params,
) {
    grid_dependency_sync();
    let (tpr, k, t_row) = row_group(p);
    let row = grid::block_x() * p.rows_per_block as u64 + k as u64;
    // SAFETY: the host's plan, as above; row k's warps take slots `k * warps ..`, below the
    // block's warps.
    unsafe {
        realigned_row::<E, A, CHUNKS>(p, row, row < p.rows, t_row, tpr as u64, k * (tpr / 32))
    };
}

/// One per-token row off the 16-byte grid on the `tpr` threads of a row (`t_row` this one's
/// index among them): access `c` of the row is aligned word `c` of its row of `y`
/// ([`load_word`], [`store_word`]), thread `t_row` holding words `t_row + tpr * j`, `j <
/// chunks <= CHUNKS`; the row's maximum (over shared-memory slots `slot ..` of its warps), its
/// scale and the stores as the row kernel's. Columns outside the row are zeros, whose `y` is 0
/// for every activation, so they leave the maximum alone.
///
/// # Safety
/// `walk.per_row` the words a row can touch, at most `tpr * chunks`; `tpr` a multiple of 32;
/// every thread of the block calls it once, with the same `tpr`; `slot + tpr / 32` f32s fit in
/// the dynamic shared memory; row `row` exists when `live` (the operands checked).
#[inline(always)]
unsafe fn realigned_row<E: Elem, A: GatedAct, const CHUNKS: usize>(
    p: &GatedFp8Params,
    row: u64,
    live: bool,
    t_row: u64,
    tpr: u64,
    slot: u32,
) {
    let (lane, warp, warps) = ((t_row & 31) as u32, (t_row / 32) as u32, (tpr / 32) as u32);
    let ya = p.y + row * p.y_stride;
    let mut a = [[0u32; 4]; CHUNKS];
    let mut b = [[0u32; 4]; CHUNKS];
    let mut touches = [false; CHUNKS];
    unroll!(j < CHUNKS => {
        let c = t_row + j as u64 * tpr;
        let mine = live && (j as u32) < p.chunks && c < p.walk.per_row;
        // SAFETY: row `row` exists when live (the host's checks).
        (a[j], b[j], touches[j], ()) =
            unsafe { load_word::<E, false, ()>(p, row, ya, c, mine, || ()) };
    });
    let l = E::LANES as u64;
    let mut amax = 0.0f32;
    unroll!(j < CHUNKS => {
        let y = gated::<E, { VecMode::V16 }, A>(a[j], b[j]);
        amax = amax.max(access_amax(l, &y, touches[j]));
    });
    // SAFETY: the row's warps' slots are inside the dynamic shared memory; every thread of the
    // block gets here once, with the same `warps` (the caller's contract).
    let amax = unsafe { row_max(WarpMax::Butterfly, amax, lane, warp, warps, slot) };
    let scale = dynamic_scale(amax, p.min_scale, p.scale_ub);
    // SAFETY: the row's scale is inside the scale matrix for a live row.
    unsafe { store_f32_if(p.scale + row * p.scale_row * 4, scale, live && t_row == 0) };
    let inv = reciprocal(scale);
    unroll!(j < CHUNKS => {
        let q = quantize(l, &gated::<E, { VecMode::V16 }, A>(a[j], b[j]), scale, inv);
        // SAFETY: a row of `y` (the host's checks).
        unsafe { store_word::<E>(ya, p.cols, t_row + j as u64 * tpr, touches[j], q) };
    });
}

/// The static-scale kernel for rows off the 16-byte grid (`gated_fp8_flat_realigned_*`): the
/// flat walk ([`GridWalk`], thread `g` of `G` taking accesses `g, g + G, ...`) over the
/// aligned words of `y` a row can touch (`ceil(cols / L) + 1` per row), each word's inputs
/// loaded and its bytes stored as the realigned row kernel's ([`load_word`], [`store_word`]).
///
/// `ENDS_FIRST` (`gated_fp8_flat_realigned_ends_first_*`, for small grids, a word per thread,
/// where memory latency sets the time): a word's vector and element loads issue together, and
/// the scale is read after them in each step, so a thread waits for memory once per step, not
/// for the scale, then its vectors, then a row end's elements. The other entry reads the scale
/// once before its loop and keeps the element loads in a branch: fewer instructions per word,
/// faster where the words fill the device.
///
/// # Safety
/// The host's plan: the walk built for this grid over `rows x per_row` words, fewer than 2^32;
/// `scale` one readable f32; the operands checked.
#[inline(always)]
unsafe fn flat_realigned<E: Elem, const M: VecMode, A: GatedAct, const ENDS_FIRST: bool>(
    p: &GatedFp8Params,
) {
    grid_dependency_sync();
    let fixed = if ENDS_FIRST {
        (0.0, 0.0)
    } else {
        // SAFETY: the host checked that `scale` is one readable, aligned f32.
        unsafe { static_scale(p.scale) }
    };
    let walk = &p.walk;
    let step = grid::grid_dim_x() * grid::block_dim_x();
    let mut i = grid::block_x() * grid::block_dim_x() + grid::thread_x();
    let total = p.rows * walk.per_row;
    let grid_step = Step32::of(walk);
    let mut at = Cursor32::of(walk, i);
    let l = E::LANES as u64;
    while i < total {
        let (row, c) = (at.row as u64, at.col as u64);
        let ya = p.y + row * p.y_stride;
        // SAFETY: i < total, so row < rows (the host's checks cover the rows); as above for
        // the scale.
        let (a, b, touches, (scale, inv)) = unsafe {
            load_word::<E, ENDS_FIRST, _>(p, row, ya, c, true, || {
                if ENDS_FIRST {
                    static_scale(p.scale)
                } else {
                    fixed
                }
            })
        };
        let q = quantize(l, &gated::<E, { VecMode::V16 }, A>(a, b), scale, inv);
        // SAFETY: a row of `y`.
        unsafe { store_word::<E>(ya, p.cols, c, touches, q) };
        at = at.advance(grid_step);
        i += step;
    }
}

/// `L` elements' bits (`bits[i]` element `i`, in the low bits) packed as a 16-byte vector.
#[inline(always)]
fn pack_lanes<E: Elem>(bits: &[u32; 8]) -> [u32; 4] {
    let mut v = [0u32; 4];
    unroll!(i < E::LANES => {
        if E::BYTES == 2 {
            v[i / 2] |= (bits[i] & 0xffff) << (16 * (i % 2));
        } else {
            v[i] = bits[i];
        }
    });
    v
}

/// Byte offsets in the streamed kernel's dynamic shared memory (`GATED_FP8_STREAM_SMEM_BYTES`):
/// the warps' maxima from 0 ([`row_max`]'s slots), the copy barrier, the row's `a`, its `b`.
#[cfg(ferrofuse_bulk_copy)]
mod stream_smem {
    use ferrofuse_common::{
        GATED_FP8_ROW_LONG_CHUNKS, GATED_FP8_ROW_MAX_THREADS, GATED_FP8_STREAM_SMEM_BYTES,
    };

    pub const BARRIER: u32 = 64;
    pub const A: u32 = 128;
    pub const B: u32 = A + OPERAND_BYTES;
    const OPERAND_BYTES: u32 = GATED_FP8_ROW_LONG_CHUNKS as u32 * GATED_FP8_ROW_MAX_THREADS * 16;
    const _: () = assert!(GATED_FP8_ROW_MAX_THREADS / 32 * 4 <= BARRIER);
    const _: () = assert!(B + OPERAND_BYTES == GATED_FP8_STREAM_SMEM_BYTES);
}

/// The streamed per-token kernel (sm_90, 16-byte accesses): a persistent block per SM takes
/// rows `block, block + grid, ...`, each held whole in registers as in the long-row kernel
/// (thread `t` holding accesses `t + 512 j`, `j < CHUNKS`). Thread 0 has the copy engine bring
/// the block's next row into shared memory (one bulk copy each of `a` and `b`) as soon as the
/// block has read the current one out of it, so HBM streams the next row while the block
/// computes, reduces and stores this one: one block per SM (its registers hold one row) with
/// a second row in flight.
///
/// `CHUNKS` is the row's accesses per thread (the host's `chunks`; an entry per count), a
/// constant so that no thread computes a slot that is empty in every thread: with the next
/// row in flight the block's math sets the pace, and a branch per slot on a run-time count
/// changed the schedule of the full slots (`bench/TUNING.md`). One entry per count, not one
/// body per count in one entry: ptxas allocates an entry's registers at once, and the bodies
/// together spilled.
#[cfg(ferrofuse_bulk_copy)]
#[inline(always)]
unsafe fn per_token_stream<E: Elem, A: GatedAct, const CHUNKS: usize>(p: &GatedFp8Params) {
    const M: VecMode = VecMode::V16;
    grid_dependency_sync();
    // One row per block of ROW_THREADS threads (the host's geometry), a constant as in the
    // row kernel: a thread's slots are one address plus immediate offsets.
    const TPR: u64 = GATED_FP8_ROW_MAX_THREADS as u64;
    let t = grid::thread_x();
    let (lane, warp, warps) = ((t & 31) as u32, (t / 32) as u32, (TPR / 32) as u32);
    let base = shared_addr(smem_f32().cast_const().cast());
    let (bar, buf_a, buf_b) = (
        base + stream_smem::BARRIER,
        base + stream_smem::A,
        base + stream_smem::B,
    );
    // Whole rows of 16-byte accesses, at most CHUNKS per thread (the host's plan).
    let row_bytes = (p.walk.per_row * 16) as u32;
    let fetch = #[inline(always)]
    |row: u64| {
        let src = [
            addr::<E, M>(p.a, p.a_stride, row, 0),
            addr::<E, M>(p.b, p.b_stride, row, 0),
        ];
        // SAFETY: row `row` exists, its `a` and `b` are 16-byte aligned runs of `row_bytes`
        // (at most a buffer's) bytes that no launch writes (`y` and the scales
        // overlap no input); the buffers are read again only after the barrier's phase.
        unsafe { bulk::copy_pair_to_shared([buf_a, buf_b], src, row_bytes, bar) };
    };
    if t == 0 {
        // SAFETY: the barrier's 8 bytes are this block's, used for nothing else.
        unsafe { bulk::init_barrier(bar) };
    }
    // SAFETY: every thread of the block gets here once.
    unsafe { nvptx::_syncthreads() };
    let step = grid::grid_dim_x();
    let mut row = grid::block_x();
    if t == 0 && row < p.rows {
        fetch(row);
    }
    let mut parity = 0;
    // `row` is the same for the whole block: every thread runs each iteration and its
    // barriers.
    while row < p.rows {
        // SAFETY: initialized above.
        unsafe { bulk::wait(bar, parity) };
        parity ^= 1;
        let mut tile = Tile {
            a: [[0u32; 4]; CHUNKS],
            b: [[0u32; 4]; CHUNKS],
            ok: [false; CHUNKS],
        };
        unroll!(j < CHUNKS => {
            let c = t + j as u64 * TPR;
            // Every slot but the last is full in every thread: the row has more than
            // `CHUNKS - 1` accesses per thread (the host picks the entry by its count).
            tile.ok[j] = j + 1 < CHUNKS || c < p.walk.per_row;
            let at = (c * 16) as u32;
            // SAFETY: where `ok`, access c of the row is in the buffers (c < per_row: checked
            // in the last slot, below `(CHUNKS - 1) * TPR` in the others), written by the
            // phase just completed.
            unsafe {
                tile.a[j] = ld_shared_v4_if(buf_a + at, tile.ok[j]);
                tile.b[j] = ld_shared_v4_if(buf_b + at, tile.ok[j]);
            }
        });
        // SAFETY: as above. After it every thread has read the buffers, which the next row's
        // copies may then overwrite.
        unsafe { nvptx::_syncthreads() };
        let next = row + step;
        if t == 0 && next < p.rows {
            fetch(next);
        }
        let amax = tile_amax::<E, M, A, CHUNKS>(&tile);
        // SAFETY: the warps' slots are below the barrier; every thread of the block gets
        // here once per row, and reuses the slots only after the next row's first barrier.
        let amax = unsafe { row_max(WarpMax::Butterfly, amax, lane, warp, warps, 0) };
        let scale = dynamic_scale(amax, p.min_scale, p.scale_ub);
        // SAFETY: the row's scale is inside the scale matrix.
        unsafe { store_f32_if(p.scale + row * p.scale_row * 4, scale, t == 0) };
        // SAFETY: the host's checks, as for the row kernel's stores.
        unsafe { row_store::<E, M, A, CHUNKS>(p, &tile, row, t, TPR, scale, reciprocal(scale)) };
        row = next;
    }
}

/// Dispatches on the activation once per launch, then runs a body monomorphized for it (and,
/// for the flat kernels, for the group's lanes, 0 for a static scale).
macro_rules! dispatch {
    ($body:ident, $e:ty, $m:path, $p:expr $(, $g:expr)*) => {
        match Activation::from_u32($p.act) {
            Some(Activation::Silu) => $body::<$e, { $m }, Silu $(, $g)*>($p),
            Some(Activation::GeluErf) => $body::<$e, { $m }, GeluErf $(, $g)*>($p),
            Some(Activation::GeluTanh) => $body::<$e, { $m }, GeluTanh $(, $g)*>($p),
            Some(Activation::Relu) => $body::<$e, { $m }, Relu $(, $g)*>($p),
            // The host only passes valid activations.
            None => {}
        }
    };
}

/// The per-token bodies of an entry: the one with the prefetch where the host asked for it (on
/// the vector path only), the one without otherwise.
macro_rules! per_token_entry {
    ($e:ty, $m:path, $p:expr, $chunks:expr, $split:expr) => {
        if $m == VecMode::V16 && $p.prefetch_rows != 0 {
            dispatch!(per_token, $e, $m, $p, $chunks, $split, true)
        } else {
            dispatch!(per_token, $e, $m, $p, $chunks, $split, false)
        }
    };
}

macro_rules! rows_entries {
    ($($rows:ident: $e:ty, $chunks:literal;)*) => {$(
        /// Gated forward with FP8 output and per-token scales, several rows per block, each
        /// thread holding
        #[doc = concat!("`", $chunks, "`")]
        /// accesses (see `per_token_rows`). Launch: `rows_per_block * threads_per_row` threads
        /// (at most `GATED_FP8_ROW_MAX_THREADS`), `GATED_FP8_ROW_SMEM_BYTES` of dynamic shared
        /// memory.
        ///
        /// # Safety
        /// As for the static entries: valid, aligned, in-bounds tensors; no overlaps.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $rows(p: GatedFp8Params) {
            const V: VecMode = VecMode::V16;
            unsafe {
                if p.prefetch_rows != 0 {
                    dispatch!(per_token_rows, $e, V, &p, $chunks, true)
                } else {
                    dispatch!(per_token_rows, $e, V, &p, $chunks, false)
                }
            }
        }
    )*};
}

// Names must match `ferrofuse_common::KernelId::name`, as above; one to
// `GATED_FP8_ROWS_CHUNKS` accesses per thread.
rows_entries! {
    gated_fp8_rows_f32_c1: F32, 1;
    gated_fp8_rows_f32_c2: F32, 2;
    gated_fp8_rows_f16_c1: F16, 1;
    gated_fp8_rows_f16_c2: F16, 2;
    gated_fp8_rows_bf16_c1: Bf16, 1;
    gated_fp8_rows_bf16_c2: Bf16, 2;
}

macro_rules! entries {
    ($($flat:ident, $group:ident, $row:ident, $long:ident, $split:ident: $e:ty, $m:path;)*) => {$(
        /// Gated forward with FP8 output and a static scale; see the module docs. Launch:
        /// `GATED_THREADS` threads, the planned grid.
        ///
        /// # Safety
        /// The host launcher's checks: valid, aligned, in-bounds tensors; no overlaps.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $flat(p: GatedFp8Params) {
            unsafe { dispatch!(flat, $e, $m, &p, 0) }
        }

        /// Gated forward with FP8 output and per-group scales; see the module docs. Launch:
        /// as for the static entry.
        ///
        /// # Safety
        /// As for the static entry.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $group(p: GatedFp8Params) {
            // Each body has the group's lane count as a constant, so its butterfly has no
            // branch per step: half the group's accesses on the vector path (two per lane),
            // always a whole warp on the scalar path.
            unsafe {
                match p.group_lanes {
                    16 if $m == VecMode::V16 => dispatch!(flat, $e, $m, &p, 16),
                    8 if $m == VecMode::V16 => dispatch!(flat, $e, $m, &p, 8),
                    4 if $m == VecMode::V16 => dispatch!(flat, $e, $m, &p, 4),
                    32 if $m == VecMode::Scalar => dispatch!(flat, $e, $m, &p, 32),
                    // The host plans no other group width.
                    _ => asm!("trap;", options(nostack)),
                }
            }
        }

        /// Gated forward with FP8 output and per-token scales; see the module docs. Launch:
        /// one block of `GATED_FP8_ROW_MAX_THREADS` threads per row,
        /// `GATED_FP8_ROW_SMEM_BYTES` of dynamic shared memory.
        ///
        /// # Safety
        /// As for the static entry.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $row(p: GatedFp8Params) {
            unsafe { per_token_entry!($e, $m, &p, GATED_FP8_ROW_CHUNKS, false) }
        }

        /// The per-token entry for rows of more than one tile of `GATED_FP8_ROW_CHUNKS` and at
        /// most one of `GATED_FP8_ROW_LONG_CHUNKS` accesses per thread. Launch: as for the
        /// per-token entry (one block per SM fits).
        ///
        /// # Safety
        /// As for the static entry.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $long(p: GatedFp8Params) {
            unsafe { per_token_entry!($e, $m, &p, GATED_FP8_ROW_LONG_CHUNKS, false) }
        }

        /// The per-token entry for rows of more than one tile: a row on the blocks of a
        /// thread-block cluster (sm_90), one tile of up to `GATED_FP8_ROW_CHUNKS` accesses per
        /// thread each. Launch: `row_blocks` blocks per row of `GATED_FP8_ROW_MAX_THREADS`
        /// threads in clusters of `row_blocks`, `GATED_FP8_ROW_SMEM_BYTES`.
        ///
        /// # Safety
        /// As for the static entry.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $split(p: GatedFp8Params) {
            unsafe { per_token_entry!($e, $m, &p, GATED_FP8_ROW_CHUNKS, true) }
        }
    )*};
}

// Names must match `ferrofuse_common::KernelId::name` (checked when `cargo xtask ptx` builds).
entries! {
    gated_fp8_flat_f32_v16, gated_fp8_group_f32_v16, gated_fp8_row_f32_v16,
        gated_fp8_row_long_f32_v16, gated_fp8_row_split_f32_v16: F32, VecMode::V16;
    gated_fp8_flat_f32_scalar, gated_fp8_group_f32_scalar, gated_fp8_row_f32_scalar,
        gated_fp8_row_long_f32_scalar, gated_fp8_row_split_f32_scalar: F32, VecMode::Scalar;
    gated_fp8_flat_f16_v16, gated_fp8_group_f16_v16, gated_fp8_row_f16_v16,
        gated_fp8_row_long_f16_v16, gated_fp8_row_split_f16_v16: F16, VecMode::V16;
    gated_fp8_flat_f16_scalar, gated_fp8_group_f16_scalar, gated_fp8_row_f16_scalar,
        gated_fp8_row_long_f16_scalar, gated_fp8_row_split_f16_scalar: F16, VecMode::Scalar;
    gated_fp8_flat_bf16_v16, gated_fp8_group_bf16_v16, gated_fp8_row_bf16_v16,
        gated_fp8_row_long_bf16_v16, gated_fp8_row_split_bf16_v16: Bf16, VecMode::V16;
    gated_fp8_flat_bf16_scalar, gated_fp8_group_bf16_scalar, gated_fp8_row_bf16_scalar,
        gated_fp8_row_long_bf16_scalar, gated_fp8_row_split_bf16_scalar: Bf16, VecMode::Scalar;
}

macro_rules! ends_entries {
    ($($ends:ident: $e:ty;)*) => {$(
        /// Gated forward with FP8 output and a static scale on the vector path over a flat
        /// range, its ragged head and tail included; see the module docs. Launch: as for the
        /// static entry.
        ///
        /// # Safety
        /// As for the static entry; the ends next to the body lie inside `a`, `b` and `y`.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $ends(p: GatedFp8Params) {
            unsafe { dispatch!(flat_ends, $e, VecMode::V16, &p) }
        }
    )*};
}

ends_entries! {
    gated_fp8_flat_f32_v16_ends: F32;
    gated_fp8_flat_f16_v16_ends: F16;
    gated_fp8_flat_bf16_v16_ends: Bf16;
}

macro_rules! realigned_row_entries {
    ($($row:ident, $flat:ident, $ends_first:ident, $rows:ident: $e:ty;)*) => {$(
        /// Gated forward with FP8 output and per-token scales for rows off the 16-byte grid
        /// (see `per_token_realigned`), at most `GATED_FP8_ROW_CHUNKS` accesses per thread.
        /// Launch: one block of `GATED_FP8_ROW_MAX_THREADS` threads per row,
        /// `GATED_FP8_ROW_SMEM_BYTES` of dynamic shared memory.
        ///
        /// # Safety
        /// The host launcher's checks: valid, in-bounds tensors; no overlaps.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $row(p: GatedFp8Params) {
            unsafe {
                dispatch!(per_token_realigned, $e, VecMode::Scalar, &p, GATED_FP8_ROW_CHUNKS)
            }
        }

        /// Gated forward with FP8 output and a static scale for rows off the 16-byte grid
        /// (see `flat_realigned`). Launch: `GATED_THREADS` threads, the planned grid.
        ///
        /// # Safety
        /// As above.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $flat(p: GatedFp8Params) {
            unsafe { dispatch!(flat_realigned, $e, VecMode::Scalar, &p, false) }
        }

        /// The same with a word's loads at once and the scale read after them (see
        /// `flat_realigned`), for small grids. Launch: as above.
        ///
        /// # Safety
        /// As above.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $ends_first(p: GatedFp8Params) {
            unsafe { dispatch!(flat_realigned, $e, VecMode::Scalar, &p, true) }
        }

        /// Gated forward with FP8 output and per-token scales for rows off the 16-byte grid,
        /// several rows per block, each thread holding up to `GATED_FP8_ROWS_CHUNKS` aligned
        /// words of its row of `y` (see `per_token_rows_realigned`). Launch:
        /// `rows_per_block * threads_per_row` threads (at most `GATED_FP8_ROW_MAX_THREADS`),
        /// `GATED_FP8_ROW_SMEM_BYTES` of dynamic shared memory.
        ///
        /// # Safety
        /// As above.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $rows(p: GatedFp8Params) {
            unsafe {
                dispatch!(per_token_rows_realigned, $e, VecMode::Scalar, &p, GATED_FP8_ROWS_CHUNKS)
            }
        }
    )*};
}

// Names must match `ferrofuse_common::KernelId::name`; 16-bit inputs only (for f32 inputs the
// scalar kernels were as fast or faster).
realigned_row_entries! {
    gated_fp8_row_realigned_f16, gated_fp8_flat_realigned_f16,
        gated_fp8_flat_realigned_ends_first_f16, gated_fp8_rows_realigned_f16: F16;
    gated_fp8_row_realigned_bf16, gated_fp8_flat_realigned_bf16,
        gated_fp8_flat_realigned_ends_first_bf16, gated_fp8_rows_realigned_bf16: Bf16;
}

macro_rules! stream_entries {
    ($($stream:ident: $e:ty, $chunks:literal;)*) => {$(
        /// The streamed per-token entry (sm_90) for rows of 16-byte accesses of
        #[doc = concat!("`", $chunks, "`")]
        /// accesses per thread (3 to `GATED_FP8_ROW_LONG_CHUNKS`); see `per_token_stream`. Launch: at most one block of
        /// `GATED_FP8_ROW_MAX_THREADS` threads per SM, `GATED_FP8_STREAM_SMEM_BYTES` of
        /// dynamic shared memory. On older archs it traps: the host plans it only for modules
        /// with bulk copies.
        ///
        /// # Safety
        /// As for the static entries: valid, aligned, in-bounds tensors; no overlaps.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $stream(p: GatedFp8Params) {
            // SAFETY (both forms): the host's checks; the geometry it planned for this entry.
            #[cfg(ferrofuse_bulk_copy)]
            unsafe {
                match Activation::from_u32(p.act) {
                    Some(Activation::Silu) => per_token_stream::<$e, Silu, $chunks>(&p),
                    Some(Activation::GeluErf) => per_token_stream::<$e, GeluErf, $chunks>(&p),
                    Some(Activation::GeluTanh) => per_token_stream::<$e, GeluTanh, $chunks>(&p),
                    Some(Activation::Relu) => per_token_stream::<$e, Relu, $chunks>(&p),
                    // The host only passes valid activations.
                    None => {}
                }
            }
            #[cfg(not(ferrofuse_bulk_copy))]
            unsafe {
                let _ = p;
                asm!("trap;", options(nostack))
            };
        }
    )*};
}

// Names must match `ferrofuse_common::KernelId::name`, as above.
stream_entries! {
    gated_fp8_row_stream_f32_c3: F32, 3;
    gated_fp8_row_stream_f32_c4: F32, 4;
    gated_fp8_row_stream_f32_c5: F32, 5;
    gated_fp8_row_stream_f32_c6: F32, 6;
    gated_fp8_row_stream_f32_c7: F32, 7;
    gated_fp8_row_stream_f32_c8: F32, 8;
    gated_fp8_row_stream_f16_c3: F16, 3;
    gated_fp8_row_stream_f16_c4: F16, 4;
    gated_fp8_row_stream_f16_c5: F16, 5;
    gated_fp8_row_stream_f16_c6: F16, 6;
    gated_fp8_row_stream_f16_c7: F16, 7;
    gated_fp8_row_stream_f16_c8: F16, 8;
    gated_fp8_row_stream_bf16_c3: Bf16, 3;
    gated_fp8_row_stream_bf16_c4: Bf16, 4;
    gated_fp8_row_stream_bf16_c5: Bf16, 5;
    gated_fp8_row_stream_bf16_c6: Bf16, 6;
    gated_fp8_row_stream_bf16_c7: Bf16, 7;
    gated_fp8_row_stream_bf16_c8: Bf16, 8;
}
