//! Kernel parameter structs, passed by value as the single argument of each entry.
//!
//! Addresses are device pointers as `u64`; strides and sizes are in elements, as `u64`, so no
//! index arithmetic wraps past 2^31 (or 2^32) elements. Every struct is `#[repr(C)]` with its
//! fields ordered so no padding is implicit: the host copies the bytes, the kernel reads them.

use crate::{DType, NormPath, VecMode};

/// Block size of `zero_fill` (the benchmark's L2 flush).
pub const ZERO_FILL_THREADS: u32 = 256;

/// Launch geometry of the gated kernels: threads per block.
pub const GATED_THREADS: u32 = 128;

/// Accesses a thread of the gated kernels' scalar path (one element per access) keeps in
/// flight: one 2- or 4-byte access each, so it takes several to keep as many bytes moving as
/// one 16-byte vector does. The host sizes that path's grid by it.
pub const GATED_SCALAR_BATCH: usize = 8;

/// How a gated kernel's threads walk the `rows x cols/W` accesses (`W` elements per access):
/// thread `g` of `G` takes accesses `g, g + G, g + 2G, ...`. The host fills this in from the
/// grid it launches, so the kernel needs no division: `first_row = mulhi(g, per_row_magic)`
/// (Lemire's `ceil(2^64 / per_row)`, exact for 32-bit `g` and `per_row`; 0 when `per_row == 1`),
/// and each step adds `step_rows` rows and `step_cols` accesses with one carry.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GridWalk {
    pub per_row: u64,
    pub per_row_magic: u64,
    pub step_rows: u64,
    pub step_cols: u64,
}

impl GridWalk {
    /// The walk of `threads` threads over rows of `per_row` accesses (`per_row`, `threads` < 2^32).
    pub const fn new(per_row: u64, threads: u64) -> Self {
        if per_row == 0 {
            return Self {
                per_row: 0,
                per_row_magic: 0,
                step_rows: 0,
                step_cols: 0,
            };
        }
        Self {
            per_row,
            per_row_magic: if per_row == 1 {
                0
            } else {
                u64::MAX / per_row + 1
            },
            step_rows: threads / per_row,
            step_cols: threads % per_row,
        }
    }

    /// `i / per_row` for `i < 2^32` (what the kernel computes for its first access).
    #[inline(always)]
    pub const fn row_of(&self, i: u64) -> u64 {
        if self.per_row_magic == 0 {
            i
        } else {
            ((i as u128 * self.per_row_magic as u128) >> 64) as u64
        }
    }
}

/// The ragged ends of a flat range. When every operand of a gated call is dense, the host runs
/// the `rows x cols` elements as one row whose vector body starts at the operands' first
/// 16-byte boundary; the `head` elements before that boundary (fewer than a vector) and the
/// `tail` elements after the body's last vector go to the grid's last `head + tail` threads,
/// one element each, head first. The kernel's pointers are the body's: the head lies just
/// below them. `head = tail = 0` on every other launch.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlatEnds {
    pub head: u16,
    pub tail: u16,
}

impl FlatEnds {
    /// The element thread `g` of a grid of `threads` takes, as an offset in elements from the
    /// body's first element (negative in the head), if it takes one; `body` is the body's
    /// length in elements.
    #[inline(always)]
    pub const fn element(self, g: u64, threads: u64, body: u64) -> Option<i64> {
        let (head, ends) = (self.head as u64, self.head as u64 + self.tail as u64);
        let k = g.wrapping_sub(threads.wrapping_sub(ends));
        if k >= ends {
            None
        } else if k < head {
            Some(k as i64 - head as i64)
        } else {
            Some((body + k - head) as i64)
        }
    }
}

/// `y[r, c] = act(a[r, c]) * b[r, c]` for `r < rows`, `c < cols`.
///
/// Element `[r, c]` of tensor `t` lives at `t + (r * t_stride + c) * size_of(dtype)`. The
/// interleaved `[gate | up]` layout is expressed by the host as `a = x`, `b = x + cols`,
/// `a_stride = b_stride = x`'s row stride.
///
/// Aliasing: `y` may equal `b` (same address, same stride): every element is read before it is
/// written, by the same thread. The host rejects every other overlap.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GatedFwdParams {
    pub a: u64,
    pub b: u64,
    pub y: u64,
    pub a_stride: u64,
    pub b_stride: u64,
    pub y_stride: u64,
    pub rows: u64,
    pub cols: u64,
    /// The grid walk, precomputed by the host so the kernel divides nothing: see
    /// [`GridWalk`].
    pub walk: GridWalk,
    /// An [`crate::Activation`] as `u32`.
    pub act: u32,
    /// A flat range's ragged ends (see [`FlatEnds`]).
    pub ends: FlatEnds,
}

/// `da = dy * b * act'(a)`, `db = dy * act(a)`, recomputing `act` from the saved `a`.
///
/// Aliasing: `da` may equal `a` or `dy`, and `db` may equal `b` or `dy` (not both on `dy`):
/// each thread reads all five operands of an element before writing either gradient.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GatedBwdParams {
    pub a: u64,
    pub b: u64,
    pub dy: u64,
    pub da: u64,
    pub db: u64,
    pub a_stride: u64,
    pub b_stride: u64,
    pub dy_stride: u64,
    pub da_stride: u64,
    pub db_stride: u64,
    pub rows: u64,
    pub cols: u64,
    /// The grid walk, precomputed by the host so the kernel divides nothing: see
    /// [`GridWalk`].
    pub walk: GridWalk,
    /// An [`crate::Activation`] as `u32`.
    pub act: u32,
    /// A flat range's ragged ends (see [`FlatEnds`]).
    pub ends: FlatEnds,
}

// ---------------------------------------------------------------------------------------------
// Residual-add + RMSNorm family (`rmsnorm_*` kernels).
// ---------------------------------------------------------------------------------------------

/// Flag bit of [`RmsNormFwdParams::flags`] / [`RmsNormBwdParams::flags`]: Gemma's weight
/// convention, `y = n * (1 + w)` with `1 + w` formed in f32.
pub const RMSNORM_GEMMA: u32 = 1;
/// Flag bit (forward only): Hugging Face LLaMA numerics. The norm sees `h` as stored (rounded
/// to the storage dtype), `n = h * rstd` is rounded to the storage dtype before the multiply
/// by `w`, and `n * w` is rounded again at the store. Without it every step is f32 and only
/// the stores round.
pub const RMSNORM_HF: u32 = 2;
/// Flag bit: the weight is stored as f32 (otherwise in the storage dtype of `x`).
pub const RMSNORM_W_F32: u32 = 4;

/// Most threads one row gets; the block size never exceeds it either, so a kernel may use up
/// to 65536 / 512 = 128 registers per thread and still launch.
pub const RMSNORM_MAX_THREADS_PER_ROW: u32 = 512;
/// Most threads one row (and one block) of the backward gets: rows of up to 512 x 16 = 8192
/// elements are held 16 per thread (see [`rmsnorm_bwd_max_threads_per_row`]).
/// The 16-per-thread kernels carry launch bounds for their largest block
/// (`KernelId::launch_bounds`), so they always launch.
pub const RMSNORM_BWD_MAX_THREADS_PER_ROW: u32 = 512;
/// Threads of one row (and one block) of the looped backward, for rows longer than 8192. Its
/// kernels hold more per thread (h, the gradient, the dw partial per tile); 256 threads
/// launch whatever their register count (256 x 255 <= 65536). The looped kernel walks tiles
/// of 256 x 16 elements; its form for the rows the cluster split takes walks the split's
/// tiles ([`RMSNORM_BWD_TILE`]), each thread two of a tile's 512 in turn.
pub const RMSNORM_BWD_LOOP_THREADS: u32 = 256;
/// Elements of one tile of the backward rows that the cluster split takes
/// ([`rmsnorm_bwd_cluster_fits`]): 512 threads of 16 elements each (a block of the split, or
/// two turns of a block of its looped form), the last tile partial. Such a row's sum is summed
/// per tile, then the tiles' sums in tile order.
pub const RMSNORM_BWD_TILE: u64 = RMSNORM_BWD_MAX_THREADS_PER_ROW as u64 * 16;
/// Most blocks in a cluster of the cluster-split backward on any device with clusters (the
/// portable cluster size): rows of up to 8 tiles (65536 elements).
pub const RMSNORM_BWD_MAX_CLUSTER: u64 = 8;
/// Most blocks in a cluster of the cluster-split backward where the device runs clusters of
/// that size (a non-portable size, which H100 and H200 run): rows of up to 16 tiles (131072
/// elements). Elsewhere such rows take the looped kernel of the split's tiles (the same bits).
pub const RMSNORM_BWD_MAX_WIDE_CLUSTER: u64 = RMSNORM_SPLIT_MAX_WIDE_CLUSTER;
/// Most rows a cluster-split backward of 9-16 tiles per row takes; more rows take the looped
/// kernel of the same tiles (the same bits): from about a row per SM its walkers fill the
/// device, and clusters of 9-16 blocks then lost to it (128 x 100003: 0.90x of it).
pub const RMSNORM_BWD_WIDE_CLUSTER_MAX_ROWS: u64 = 64;
/// Blocks the long-row backward aims at (see [`rmsnorm_bwd_walkers`]).
const RMSNORM_BWD_LONG_BLOCKS: u64 = 256;
/// The first of a cluster-split backward block's two tile-sum slots (f32 index; by the parity
/// of the block's row), which the cluster's blocks read: after the reduction buffers.
pub const RMSNORM_BWD_CLUSTER_PARTIALS_SLOT: u32 = RMSNORM_SMEM_BYTES / 4;
/// Dynamic shared memory of a cluster-split backward block before its staged rows: the
/// reduction buffers and the tile-sum slots, padded to 16 bytes.
pub const RMSNORM_BWD_CLUSTER_HEAD_BYTES: u32 = RMSNORM_SMEM_BYTES + 16;
/// Block size the several-rows-per-block layouts aim at (rows are `threads_per_row` wide).
pub const RMSNORM_BLOCK_TARGET: u32 = 256;
/// Dynamic shared memory of every forward and backward launch: two sets of 32 f32 warp
/// partials (the backward alternates between them from one row to the next).
pub const RMSNORM_SMEM_BYTES: u32 = 256;
/// Dynamic shared memory of the streamed forward (`rmsnorm_fwd_{dtype}_v16_stream`,
/// `rmsnorm_fp8_{scheme}_{dtype}_v16_stream`, sm_90): the reduction buffers and the copy
/// barrier in the first 1024 bytes, then one row of `x`, one of `residual` and the weight,
/// each in a region of the largest such row (512 threads x 32 elements of 4 bytes).
pub const RMSNORM_STREAM_SMEM_BYTES: u32 = 1024 + 3 * RMSNORM_MAX_THREADS_PER_ROW * 32 * 4;
/// Dynamic shared memory of a backward rows launch ([`RmsNormBwdParams`]; of the one-launch
/// kernel's rows when `fused`): rows held 16 per thread (`NormBwdVariant::E16`) on the vector
/// path, and f32 ones off it outside the one-launch kernel, are copied into shared memory one
/// row ahead of their use ([`rmsnorm_bwd_staged`]), so after the reduction buffers come two
/// rows' copies of `h`, `dy` and, when the call has one, `dres`: per row and operand 16
/// elements per thread. The scalar path's other rows held 16 per thread keep the weight there
/// instead, widened to f32, once per block: 16 f32 per thread of a row
/// ([`rmsnorm_bwd_scalar_weight_bytes`]). Looped rows get [`RMSNORM_LOOP_SMEM_BYTES`] (the
/// ring of tile sums of the looped form of the cluster split's rows); rows split over a
/// cluster, [`rmsnorm_bwd_cluster_smem_bytes`].
///
/// A staged launch of at most [`RMSNORM_BWD_SPREAD_BLOCKS`] blocks asks for
/// [`RMSNORM_BWD_STAGED_MAX_SMEM_BYTES`] instead, so that at most two of its blocks fit on a
/// multiprocessor (one where it has less than 228 KiB) and the block scheduler spreads them: 16 x 4096 bf16 in graph replay took
/// 4.09 µs with the smaller request and 3.41 with this one (the likely reading: launched early
/// under programmatic dependent launch beside the previous call's `dw` sum, up to four
/// 256-thread blocks otherwise shared a multiprocessor).
pub const fn rmsnorm_bwd_smem_bytes(
    dtype: DType,
    mode: VecMode,
    variant: NormBwdVariant,
    g: &NormGeometry,
    has_dres: bool,
    blocks: u64,
    fused: bool,
) -> u32 {
    if matches!(variant, NormBwdVariant::Loop) {
        return RMSNORM_LOOP_SMEM_BYTES;
    }
    if !rmsnorm_bwd_staged(dtype, mode, variant, fused) {
        return RMSNORM_SMEM_BYTES + rmsnorm_bwd_scalar_weight_bytes(g);
    }
    if blocks <= RMSNORM_BWD_SPREAD_BLOCKS {
        return RMSNORM_BWD_STAGED_MAX_SMEM_BYTES;
    }
    let operands = if has_dres { 3 } else { 2 };
    let bytes = dtype.size_bytes() as u32;
    let buffers = rmsnorm_bwd_staged_buffers(bytes, g.block_threads(), operands);
    RMSNORM_SMEM_BYTES + buffers * operands * g.block_threads() * 16 * bytes
}

/// The scalar 16-per-thread backward's weight area (after the reduction buffers): 16 f32 per
/// thread of a row, at most 32 KiB (512 threads), within the default 48 KiB with the
/// reduction buffers.
pub const fn rmsnorm_bwd_scalar_weight_bytes(g: &NormGeometry) -> u32 {
    g.threads_per_row * 16 * 4
}
const _: () = assert!(
    RMSNORM_SMEM_BYTES + RMSNORM_BWD_MAX_THREADS_PER_ROW * 16 * 4 <= DEFAULT_MAX_SMEM_BYTES
);

/// Row buffers a staged backward block of `block_threads` threads of `elem_bytes`-byte
/// elements alternates, for `operands` staged operands (h and dy, and dres when the call has
/// it): two (a block's next row group is copied while it reduces and stores the current one)
/// while two row groups fit [`RMSNORM_BWD_STAGED_MAX_SMEM_BYTES`], else one (f32 rows of
/// 6145-8192 elements, and of 4097-6144 with `dres`: the next row group is copied once the
/// current one is read).
pub const fn rmsnorm_bwd_staged_buffers(elem_bytes: u32, block_threads: u32, operands: u32) -> u32 {
    let two = RMSNORM_SMEM_BYTES + 2 * operands * block_threads * 16 * elem_bytes;
    if two <= RMSNORM_BWD_STAGED_MAX_SMEM_BYTES {
        2
    } else {
        1
    }
}

/// Staged backward launches of at most this many blocks are spread over the multiprocessors
/// (see [`rmsnorm_bwd_smem_bytes`]); larger grids pack as many blocks per multiprocessor as
/// fit (at 256 and 512 blocks, two per SM were 2-10% slower than four).
pub const RMSNORM_BWD_SPREAD_BLOCKS: u64 = 64;

/// Whether a backward rows kernel (the one-launch kernel when `fused`) stages its rows in
/// shared memory (see [`rmsnorm_bwd_smem_bytes`]): rows held 16 per thread on the vector path,
/// and f32 rows off it (copied element by element) in the rows kernel.
pub const fn rmsnorm_bwd_staged(
    dtype: DType,
    mode: VecMode,
    variant: NormBwdVariant,
    fused: bool,
) -> bool {
    matches!(variant, NormBwdVariant::E16)
        && (matches!(mode, VecMode::V16) || (matches!(dtype, DType::F32) && !fused))
}

/// Most dynamic shared memory a staged backward launch asks for (two row groups of 512 16-bit
/// threads, or one of 512 f32 threads, `dres` present): above the default 48 KiB, within the
/// opt-in limit of every GPU the PTX runs on (see [`RMSNORM_REALIGNED_MAX_SMEM_BYTES`]).
pub const RMSNORM_BWD_STAGED_MAX_SMEM_BYTES: u32 =
    RMSNORM_SMEM_BYTES + 2 * 3 * RMSNORM_BWD_MAX_THREADS_PER_ROW * 16 * 2;
const _: () = {
    let dtypes = [DType::BF16, DType::F16, DType::F32];
    let mut i = 0;
    while i < dtypes.len() {
        let threads = rmsnorm_bwd_max_threads_per_row(dtypes[i]);
        let bytes = dtypes[i].size_bytes() as u32;
        let mut operands = 2;
        while operands <= 3 {
            let buffers = rmsnorm_bwd_staged_buffers(bytes, threads, operands);
            let staged = buffers * operands * threads * 16 * bytes;
            assert!(RMSNORM_SMEM_BYTES + staged <= RMSNORM_BWD_STAGED_MAX_SMEM_BYTES);
            operands += 1;
        }
        i += 1;
    }
};
const _: () = assert!(RMSNORM_BWD_STAGED_MAX_SMEM_BYTES <= RMSNORM_REALIGNED_MAX_SMEM_BYTES);

/// The backward grid has at most this many threads in all; each block then loops over row
/// groups and keeps its share of `dw` in registers. Bounds the `dw` workspace to
/// `131072 / block_threads * rows_per_block * hidden` floats (see [`NormBwdLayout`]).
pub const RMSNORM_BWD_GRID_THREADS: u64 = 131_072;
/// `dw` reduction kernel: a block sums 32 columns, four per thread, in 32 slices of the
/// partial rows.
pub const RMSNORM_DW_COLS: u32 = 32;
pub const RMSNORM_DW_SLICES: u32 = 32;
pub const RMSNORM_DW_THREADS: u32 = RMSNORM_DW_COLS / 4 * RMSNORM_DW_SLICES;
/// Dynamic shared memory of the `dw` reduction: the 32 columns' sums of each warp.
pub const RMSNORM_DW_SMEM_BYTES: u32 = RMSNORM_DW_THREADS / 32 * RMSNORM_DW_COLS * 4;

/// Column groups of [`RMSNORM_DW_COLS`] that a `dw` block of a one-launch backward of
/// `block_threads` threads per block sums by default: one per [`RMSNORM_DW_THREADS`] threads
/// of its block, at least one (smaller blocks run the group's threads in turns).
pub const fn rmsnorm_bwd_fused_dw_groups(block_threads: u32) -> u32 {
    let groups = block_threads / RMSNORM_DW_THREADS;
    if groups == 0 { 1 } else { groups }
}

/// Column groups of [`RMSNORM_DW_COLS`] per `dw` block of a one-launch backward over rows of
/// `hidden` with `dw_blocks` such blocks (when they sum by slices of the slots): the groups
/// spread evenly, block `b` taking groups `b * per_block` on. The cluster split's one launch
/// derives it from its grid; the host sizes that grid from the groups it wants per block
/// ([`rmsnorm_bwd_fused_dw_blocks`]), which this gives back or fewer. (The 16-per-thread
/// kernel's one launch takes [`rmsnorm_bwd_fused_dw_groups`] of its block size.)
pub const fn rmsnorm_bwd_fused_dw_groups_per_block(hidden: u64, dw_blocks: u64) -> u64 {
    let groups = hidden.div_ceil(RMSNORM_DW_COLS as u64);
    match groups.checked_div(dw_blocks) {
        Some(_) => groups.div_ceil(dw_blocks),
        None => 0,
    }
}

/// Most rows of a one-launch backward whose `dw` blocks give each thread four whole columns
/// (every row of them, one batch of loads) instead of a slice of the slots (see
/// [`rmsnorm_bwd_fused_dw_by_column`]).
pub const RMSNORM_BWD_FUSED_DW_COLUMN_ROWS: u64 = 4;

/// Whether the `dw` blocks of a one-launch backward of `rows` rows over `slots` row slots sum
/// each column's rows in one thread: at most [`RMSNORM_BWD_FUSED_DW_COLUMN_ROWS`] rows, each
/// its own slot. A thread then takes every slice of its columns (most of them empty), where
/// slicing the slots would leave at least 7 of 8 threads without a row and ask for 32
/// times the blocks (1024 of them for one row of 65536). Past one batch of loads per thread
/// the slices are faster again (their rows' loads are spread over more threads).
pub const fn rmsnorm_bwd_fused_dw_by_column(rows: u64, slots: u64) -> bool {
    rows <= RMSNORM_BWD_FUSED_DW_COLUMN_ROWS && slots >= rows
}

/// The `dw` blocks of a one-launch backward of `block_threads` per block for `rows` rows over
/// `slots` row slots: by column, four columns per thread; by slices, `groups` column groups
/// per block (see [`rmsnorm_bwd_fused_dw_groups_per_block`]).
pub const fn rmsnorm_bwd_fused_dw_blocks(
    hidden: u64,
    block_threads: u32,
    rows: u64,
    slots: u64,
    groups: u64,
) -> u64 {
    let cols = if rmsnorm_bwd_fused_dw_by_column(rows, slots) {
        4 * block_threads as u64
    } else {
        RMSNORM_DW_COLS as u64 * groups
    };
    match hidden.checked_div(cols) {
        Some(_) => hidden.div_ceil(cols),
        None => 0,
    }
}

/// Column groups per `dw` block of the cluster split's one launch over rows of `hidden` (when
/// they sum by slices of the slots): two (a virtual thread per thread of a 512-thread block)
/// while that makes at most [`RMSNORM_BWD_CLUSTER_FUSED_DW_BLOCKS`] blocks, else four (two
/// turns per thread; at most 512 blocks for the split's longest rows). Past about two waves
/// of `dw` blocks, fewer blocks of two turns finish sooner; below it, the second turn costs
/// more than the blocks it saves (see bench/TUNING.md).
pub const fn rmsnorm_bwd_cluster_fused_dw_groups(hidden: u64) -> u64 {
    if hidden.div_ceil(2 * RMSNORM_DW_COLS as u64) <= RMSNORM_BWD_CLUSTER_FUSED_DW_BLOCKS {
        2
    } else {
        4
    }
}

/// Most `dw` blocks of two column groups in the cluster split's one launch (see
/// [`rmsnorm_bwd_cluster_fused_dw_groups`]).
pub const RMSNORM_BWD_CLUSTER_FUSED_DW_BLOCKS: u64 = 300;

/// Dynamic shared memory the `dw` blocks of a one-launch backward use with `groups` column
/// groups per block (the launch asks for the larger of this and the rows' share).
pub const fn rmsnorm_bwd_fused_dw_smem_bytes(groups: u64) -> u32 {
    RMSNORM_DW_SMEM_BYTES * groups as u32
}

/// How a forward kernel holds a row: 16 or 32 elements per thread in registers, or (rows
/// longer than [`RMSNORM_MAX_THREADS_PER_ROW`] x 32 elements) tiles of 16 per thread in a
/// loop that re-reads the `h` it stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NormFwdVariant {
    E16 = 0,
    E32 = 1,
    Loop = 2,
}

impl NormFwdVariant {
    pub const ALL: [NormFwdVariant; 3] = [
        NormFwdVariant::E16,
        NormFwdVariant::E32,
        NormFwdVariant::Loop,
    ];
}

/// How a backward kernel holds a row: 16 elements per thread (rows up to 512 x 16 = 8192;
/// on the vector path staged in shared memory, see [`rmsnorm_bwd_smem_bytes`]), or tiles of
/// 16 per thread in a loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NormBwdVariant {
    E16 = 0,
    Loop = 1,
}

impl NormBwdVariant {
    pub const ALL: [NormBwdVariant; 2] = [NormBwdVariant::E16, NormBwdVariant::Loop];
}

/// Launch geometry of a row kernel. A function of the row length and dtype only, never of
/// the number of rows: it fixes which thread reads which element and the order of every
/// reduction, which is what makes results batch-invariant.
///
/// Thread `t < threads_per_row` of a row owns the 16-byte chunks `c = t + j * threads_per_row`
/// (`j < elems_per_thread / lanes` per tile; chunk `c` is elements `c*lanes .. c*lanes+lanes`,
/// `lanes` = 16 bytes of the dtype); the vector and the scalar kernels of one geometry
/// assign and accumulate elements identically.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NormGeometry {
    /// A multiple of 32, at most [`RMSNORM_MAX_THREADS_PER_ROW`] (forward) or
    /// [`RMSNORM_BWD_MAX_THREADS_PER_ROW`] (backward).
    pub threads_per_row: u32,
    /// Rows side by side in one block (`threads_per_row * rows_per_block` threads).
    pub rows_per_block: u32,
    /// Elements each thread holds per tile (16 or 32).
    pub elems_per_thread: u32,
    /// Whether the row is processed in several tiles (only for rows too long for registers).
    pub looped: bool,
}

impl NormGeometry {
    pub const fn block_threads(&self) -> u32 {
        self.threads_per_row * self.rows_per_block
    }

    /// `threads_per_row` threads each holding `ept` elements of a row of `chunks` 16-byte
    /// chunks of `lanes` elements; rows of at most 256 threads are packed side by side.
    const fn covering(chunks: u64, lanes: u64, ept: u64) -> Self {
        let per_thread = ept / lanes;
        let threads = chunks.div_ceil(per_thread).div_ceil(32) * 32;
        let threads: u32 = if threads < 32 { 32 } else { threads as u32 };
        let rows_per_block = if threads < RMSNORM_BLOCK_TARGET {
            RMSNORM_BLOCK_TARGET / threads
        } else {
            1
        };
        NormGeometry {
            threads_per_row: threads,
            rows_per_block,
            elems_per_thread: ept as u32,
            looped: false,
        }
    }

    const fn looping(threads_per_row: u32) -> Self {
        NormGeometry {
            threads_per_row,
            rows_per_block: 1,
            elems_per_thread: 16,
            looped: true,
        }
    }
}

/// Most dynamic shared memory a launch may ask for without opting in per kernel.
pub const DEFAULT_MAX_SMEM_BYTES: u32 = 48 * 1024;

/// Dynamic shared memory of a realigned forward launch (`rmsnorm_fwd_{dtype}_realigned_e16`,
/// geometry `g`, the weight in f32 when `w_f32`, else in `dtype`): the reduction buffers, the
/// weight (the row's chunks, once per block), then, per row of the block, x and the residual
/// staged as the row's aligned 16-byte vectors (one per chunk slot of the row, and the one
/// after the last), and 32 spare bytes, which reads of a row's last vector at another
/// operand's offset may touch.
pub const fn rmsnorm_realigned_smem_bytes(g: &NormGeometry, dtype: DType, w_f32: bool) -> u32 {
    let lanes = dtype.lanes_per_16b() as u32;
    let slots = g.threads_per_row * (g.elems_per_thread / lanes);
    if g.looped {
        // The looped kernel's tile ring, then per operand a tile's slots, the vector before
        // them and the one after (the weight is staged in the residual's place in pass 2).
        return RMSNORM_LOOP_SMEM_BYTES + 2 * (slots + 2) * 16 + 32;
    }
    let w_bytes = if w_f32 { 4 } else { dtype.size_bytes() as u32 };
    RMSNORM_SMEM_BYTES + slots * lanes * w_bytes + g.rows_per_block * 2 * (slots + 1) * 16 + 32
}

/// Most dynamic shared memory a realigned forward launch asks for: more than the default
/// 48 KiB, so the host raises the kernels' limit when it loads them
/// ([`KernelId::dynamic_smem_opt_in`](crate::KernelId::dynamic_smem_opt_in)), and within the
/// opt-in limit of every GPU the PTX runs on (99 KiB on sm_86, sm_89 and sm_120, 163 KiB on
/// sm_80, 227 KiB on sm_90).
pub const RMSNORM_REALIGNED_MAX_SMEM_BYTES: u32 = 99 * 1024;

/// Whether rows of `hidden` elements of `dtype` can take the realigned forward (with an f32
/// weight when `w_f32`): rows of the 16- or 32-per-thread geometry (the f32 form of 32 is not
/// built) whose staging fits [`RMSNORM_REALIGNED_MAX_SMEM_BYTES`] (16-bit rows up to 16384
/// elements, 12288 with an f32 weight; f32 rows up to 8192), and looped rows below 2^31
/// elements with a weight of the storage dtype (the looped form stages the weight as it
/// stages the rows).
pub const fn rmsnorm_realigned_fits(dtype: DType, hidden: u64, w_f32: bool) -> bool {
    let (variant, geometry) = rmsnorm_fwd_geometry(dtype, hidden);
    let held = match variant {
        NormFwdVariant::E16 => true,
        NormFwdVariant::E32 => dtype.size_bytes() == 2,
        NormFwdVariant::Loop => hidden < 1 << 31 && !(w_f32 && dtype.size_bytes() == 2),
    };
    held && rmsnorm_realigned_smem_bytes(&geometry, dtype, w_f32)
        <= RMSNORM_REALIGNED_MAX_SMEM_BYTES
}

/// Forward geometry for rows of `hidden` elements of `dtype`: a warp per row (8 rows per
/// block) up to 512 elements, 16 elements per thread up to 8192, 32 up to 16384, beyond that
/// 512 threads looping over tiles of 8192.
pub const fn rmsnorm_fwd_geometry(dtype: DType, hidden: u64) -> (NormFwdVariant, NormGeometry) {
    let lanes = dtype.lanes_per_16b() as u64;
    let chunks = if hidden == 0 {
        1
    } else {
        hidden.div_ceil(lanes)
    };
    let max = RMSNORM_MAX_THREADS_PER_ROW as u64;
    if chunks <= max * (16 / lanes) {
        (
            NormFwdVariant::E16,
            NormGeometry::covering(chunks, lanes, 16),
        )
    } else if chunks <= max * (32 / lanes) {
        (
            NormFwdVariant::E32,
            NormGeometry::covering(chunks, lanes, 32),
        )
    } else {
        (
            NormFwdVariant::Loop,
            NormGeometry::looping(RMSNORM_MAX_THREADS_PER_ROW),
        )
    }
}

/// Most threads per row of the 16-per-thread backward (`NormBwdVariant::E16`) for `dtype`:
/// 512 for every storage dtype (rows of up to 8192 elements; f32 blocks of more than 384
/// threads, or 256 with `dres`, stage one row group at a time, see
/// [`rmsnorm_bwd_staged_buffers`]). Every path of a dtype has the same geometry.
pub const fn rmsnorm_bwd_max_threads_per_row(dtype: DType) -> u32 {
    match dtype {
        DType::BF16 | DType::F16 | DType::F32 => RMSNORM_BWD_MAX_THREADS_PER_ROW,
        _ => RMSNORM_BWD_LOOP_THREADS,
    }
}

/// Tiles of a looped forward row (`NormFwdVariant::Loop`): [`RMSNORM_MAX_THREADS_PER_ROW`]
/// threads of 16 elements each per tile, the last tile partial. The row's sum of squares is
/// summed per tile (each tile's threads combined as `reduce::row_sum` does), then the tiles'
/// sums added in tile order: one shape that a block looping over the tiles and a cluster of
/// blocks holding a tile or two each both compute (see [`rmsnorm_split_geometry`]).
pub const fn rmsnorm_fwd_tiles(dtype: DType, hidden: u64) -> u64 {
    let lanes = dtype.lanes_per_16b() as u64;
    let per_tile = RMSNORM_MAX_THREADS_PER_ROW as u64 * (16 / lanes);
    hidden.div_ceil(lanes).div_ceil(per_tile)
}

/// Tiles whose per-warp sums the looped forward holds in shared memory before combining them
/// (one block barrier per this many tiles).
pub const RMSNORM_LOOP_RING_TILES: u32 = 16;
/// Dynamic shared memory of a looped forward launch (`NormFwdVariant::Loop`): the ring of
/// per-warp tile sums (16 warps per tile), then one sum per tile of the ring.
pub const RMSNORM_LOOP_SMEM_BYTES: u32 =
    RMSNORM_LOOP_RING_TILES * (RMSNORM_MAX_THREADS_PER_ROW / 32 + 1) * 4;

/// Most blocks in a cluster of the split forward on any device with clusters (the portable
/// cluster size).
pub const RMSNORM_SPLIT_MAX_CLUSTER: u64 = 8;

/// Most blocks in a cluster of the split forward's one-tile kernels where the device runs
/// clusters of that size (a non-portable size, which H100 and H200 run; see
/// [`rmsnorm_split_geometry`]).
pub const RMSNORM_SPLIT_MAX_WIDE_CLUSTER: u64 = 16;

/// Most tiles one block of the split forward holds in registers.
pub const RMSNORM_SPLIT_MAX_TILES_PER_BLOCK: u64 = 2;

/// Dynamic shared memory of a split forward launch: the two reduction buffers, then from f32
/// slot [`RMSNORM_SPLIT_PARTIALS_SLOT`] the block's tile sums, from
/// [`RMSNORM_SPLIT_GATHER_SLOT`] the whole row's, gathered from the cluster, and from
/// [`RMSNORM_SPLIT_AMAX_SLOT`] the cluster's blocks' maxima (FP8 per token).
pub const RMSNORM_SPLIT_SMEM_BYTES: u32 =
    (RMSNORM_SPLIT_AMAX_SLOT + RMSNORM_SPLIT_MAX_WIDE_CLUSTER as u32) * 4;
/// First f32 slot of a split block's own tile sums.
pub const RMSNORM_SPLIT_PARTIALS_SLOT: u32 = RMSNORM_SMEM_BYTES / 4;
/// First f32 slot of the row's tile sums gathered from the cluster's blocks.
pub const RMSNORM_SPLIT_GATHER_SLOT: u32 = RMSNORM_SPLIT_PARTIALS_SLOT + 8;
/// The first of [`RMSNORM_SPLIT_MAX_WIDE_CLUSTER`] f32 slots (after the gathered tile sums)
/// where the FP8 per-token split entries gather the maximum of `|y|` of each block of the
/// cluster, one slot per rank.
pub const RMSNORM_SPLIT_AMAX_SLOT: u32 = RMSNORM_SPLIT_GATHER_SLOT
    + (RMSNORM_SPLIT_MAX_CLUSTER * RMSNORM_SPLIT_MAX_TILES_PER_BLOCK) as u32;

const _: () = assert!(
    (RMSNORM_SPLIT_GATHER_SLOT as u64
        + RMSNORM_SPLIT_MAX_CLUSTER * RMSNORM_SPLIT_MAX_TILES_PER_BLOCK)
        * 4
        <= RMSNORM_SPLIT_SMEM_BYTES as u64
        && (RMSNORM_SPLIT_AMAX_SLOT as u64 + RMSNORM_SPLIT_MAX_WIDE_CLUSTER) * 4
            <= RMSNORM_SPLIT_SMEM_BYTES as u64
        && RMSNORM_SPLIT_SMEM_BYTES.is_multiple_of(16)
        && RMSNORM_SPLIT_MAX_WIDE_CLUSTER
            <= RMSNORM_SPLIT_MAX_CLUSTER * RMSNORM_SPLIT_MAX_TILES_PER_BLOCK
);

/// The split forward for looped rows (sm_90 thread-block clusters): a row's tiles spread over
/// the blocks of one cluster, `tiles_per_block` each (blocks of
/// [`RMSNORM_MAX_THREADS_PER_ROW`] threads, 16 elements per thread per tile, so
/// `NormFwdVariant::E16` for one tile and `E32` for two), and the cluster's size
/// ([`rmsnorm_split_cluster`]). One tile per block up to [`RMSNORM_SPLIT_MAX_CLUSTER`] tiles,
/// or [`RMSNORM_SPLIT_MAX_WIDE_CLUSTER`] where the device runs clusters of that size (`wide`),
/// two beyond: a block's chain of loads and its registers halve with one tile, and its
/// multiprocessor holds two blocks instead of one. The same element-to-thread map and
/// reduction shape as the looped kernel ([`rmsnorm_fwd_tiles`]) in every form, so the same
/// bits. `None` for rows that are not looped or have more tiles than a cluster holds.
pub const fn rmsnorm_split_geometry(
    dtype: DType,
    hidden: u64,
    wide: bool,
) -> Option<(NormFwdVariant, u32)> {
    let (variant, _) = rmsnorm_fwd_geometry(dtype, hidden);
    if !matches!(variant, NormFwdVariant::Loop) {
        return None;
    }
    let tiles = rmsnorm_fwd_tiles(dtype, hidden);
    let one_tile = if wide {
        RMSNORM_SPLIT_MAX_WIDE_CLUSTER
    } else {
        RMSNORM_SPLIT_MAX_CLUSTER
    };
    if tiles <= one_tile {
        Some((NormFwdVariant::E16, tiles as u32))
    } else if tiles <= RMSNORM_SPLIT_MAX_CLUSTER * RMSNORM_SPLIT_MAX_TILES_PER_BLOCK {
        Some((NormFwdVariant::E32, tiles.div_ceil(2) as u32))
    } else {
        None
    }
}

/// Blocks per cluster of the split forward of `variant` (`E16`: one tile per block, `E32`:
/// two) for rows of `hidden` elements: one per tile, or per two tiles.
pub const fn rmsnorm_split_cluster(dtype: DType, hidden: u64, variant: NormFwdVariant) -> u32 {
    let tiles = rmsnorm_fwd_tiles(dtype, hidden);
    match variant {
        NormFwdVariant::E32 => tiles.div_ceil(2) as u32,
        _ => tiles as u32,
    }
}

/// Dynamic shared memory of a split forward launch of `variant` (`E16`: one tile per block,
/// `E32`: two) on memory path `path`: [`RMSNORM_SPLIT_SMEM_BYTES`], and on the realigned path
/// the staging of the block's slice of `x` and `residual` after it (the slice's 16-byte
/// vectors and the one after them, each). `None` where that staging would pass
/// [`RMSNORM_REALIGNED_MAX_SMEM_BYTES`] (f32 slices of two tiles), which has no kernel.
pub const fn rmsnorm_split_smem_bytes(
    dtype: DType,
    path: NormPath,
    variant: NormFwdVariant,
) -> Option<u32> {
    if !matches!(path, NormPath::Realigned) {
        return Some(RMSNORM_SPLIT_SMEM_BYTES);
    }
    let tiles = if matches!(variant, NormFwdVariant::E16) {
        1
    } else {
        2
    };
    let chunks_per_tile = RMSNORM_MAX_THREADS_PER_ROW * (16 / dtype.lanes_per_16b() as u32);
    let bytes = RMSNORM_SPLIT_SMEM_BYTES + 2 * (tiles * chunks_per_tile + 1) * 16;
    if bytes <= RMSNORM_REALIGNED_MAX_SMEM_BYTES {
        Some(bytes)
    } else {
        None
    }
}

/// Backward geometry: 16 elements per thread up to 8192 per row (at most
/// [`rmsnorm_bwd_max_threads_per_row`] threads), then
/// [`RMSNORM_BWD_LOOP_THREADS`] threads looping over tiles (see [`rmsnorm_bwd_cluster_fits`]
/// for the rows split over a cluster).
pub const fn rmsnorm_bwd_geometry(dtype: DType, hidden: u64) -> (NormBwdVariant, NormGeometry) {
    let lanes = dtype.lanes_per_16b() as u64;
    let chunks = if hidden == 0 {
        1
    } else {
        hidden.div_ceil(lanes)
    };
    if chunks <= rmsnorm_bwd_max_threads_per_row(dtype) as u64 * (16 / lanes) {
        (
            NormBwdVariant::E16,
            NormGeometry::covering(chunks, lanes, 16),
        )
    } else {
        (
            NormBwdVariant::Loop,
            NormGeometry::looping(RMSNORM_BWD_LOOP_THREADS),
        )
    }
}

/// Tiles of a backward row of `hidden` elements longer than 8192 ([`RMSNORM_BWD_TILE`] each).
pub const fn rmsnorm_bwd_tiles(hidden: u64) -> u64 {
    hidden.div_ceil(RMSNORM_BWD_TILE)
}

/// Row walkers of the long-row backward (`NormBwdVariant::Loop` geometry) for `rows x
/// hidden`: walker `i` takes rows `i, i + walkers, ...` in order and owns `dw` partial row
/// `i`. The looped kernel runs a walker per block, the cluster-split kernel a walker per
/// cluster of one block per tile, so both sum every element in the same order. Where the
/// split applies in clusters of at most [`RMSNORM_BWD_MAX_CLUSTER`] blocks
/// ([`rmsnorm_bwd_cluster_fits`]), about 256 blocks of it; other rows, as many blocks of the
/// looped kernel (256 threads) as fit [`RMSNORM_BWD_GRID_THREADS`], so that rows of 9-16 tiles
/// keep that many walkers where the device runs no clusters of 16 (their split then runs a
/// cluster per walker, several waves of them); one walker per row below that. A function of
/// rows and hidden only, as the slots must be.
pub const fn rmsnorm_bwd_walkers(rows: u64, hidden: u64) -> u64 {
    let tiles = rmsnorm_bwd_tiles(hidden);
    let most = if rmsnorm_bwd_cluster_fits(hidden) && tiles <= RMSNORM_BWD_MAX_CLUSTER {
        RMSNORM_BWD_LONG_BLOCKS / tiles
    } else {
        RMSNORM_BWD_GRID_THREADS / RMSNORM_BWD_LOOP_THREADS as u64
    };
    if rows < most { rows } else { most }
}

/// Blocks the tile passes' `dx` kernel aims at ([`rmsnorm_bwd_tile_walkers`]).
pub const RMSNORM_BWD_TILE_DX_BLOCKS: u64 = 512;
/// Rows per walker the tile passes' `dx` kernel allows before it adds walkers (see
/// [`rmsnorm_bwd_tile_walkers`]).
pub const RMSNORM_BWD_TILE_WALKER_ROWS: u64 = 8;

/// Row walkers of the tile passes (the rows [`rmsnorm_bwd_cluster_fits`] covers, run in two
/// passes without clusters: `KernelId::RmsNormBwdTileSums`, then `KernelId::RmsNormBwdTileDx`):
/// the `dx` kernel runs a block per tile per walker, walker `i` taking rows `i, i + walkers,
/// ...` in order and owning `dw` partial row `i`. As many walkers as give
/// [`RMSNORM_BWD_TILE_DX_BLOCKS`] blocks, more where a walker would take more than
/// [`RMSNORM_BWD_TILE_WALKER_ROWS`] rows, at most one per row. Fewer walkers than rows keep the
/// partials (`walkers x hidden` f32s, written and read back) a fraction of the rows' bytes. A
/// function of rows and hidden only, as the slots must be.
pub const fn rmsnorm_bwd_tile_walkers(rows: u64, hidden: u64) -> u64 {
    let tiles = rmsnorm_bwd_tiles(hidden);
    let by_blocks = match RMSNORM_BWD_TILE_DX_BLOCKS.checked_div(tiles) {
        Some(w) => w,
        None => 0,
    };
    let by_rows = rows.div_ceil(RMSNORM_BWD_TILE_WALKER_ROWS);
    let most = if by_blocks > by_rows {
        by_blocks
    } else {
        by_rows
    };
    if rows < most { rows } else { most }
}

/// Whether the cluster-split backward's tiles apply to rows of `hidden` elements (on every
/// path and dtype; the split itself where the device runs clusters of [`rmsnorm_bwd_tiles`]
/// blocks, else the looped kernel of the same tiles): rows longer than 8192 of at most
/// [`RMSNORM_BWD_MAX_WIDE_CLUSTER`] tiles, whose last tile, in rows of at most
/// [`RMSNORM_BWD_MAX_CLUSTER`] tiles, holds a quarter of a tile at least. A block per tile:
/// with less in the last one, its blocks hold a multiprocessor's place for little work (4096 x
/// 16385 bf16, a last tile of one element, took 525 µs split, 440 looped); in rows of 9-16
/// tiles any last tile: at a few rows the split beats one block walking the whole row several
/// times over, which outweighs the 7-9% the looped kernel of such tiles loses to the plain one
/// at many rows. A function of `hidden` alone: it fixes the order of a row's sum.
pub const fn rmsnorm_bwd_cluster_fits(hidden: u64) -> bool {
    let tiles = rmsnorm_bwd_tiles(hidden);
    if tiles < 2 || tiles > RMSNORM_BWD_MAX_WIDE_CLUSTER {
        return false;
    }
    tiles > RMSNORM_BWD_MAX_CLUSTER
        || hidden - (tiles - 1) * RMSNORM_BWD_TILE >= RMSNORM_BWD_TILE / 4
}

/// Dynamic shared memory of a cluster-split backward launch of `blocks` blocks: the tile-sum
/// slots ([`RMSNORM_BWD_CLUSTER_HEAD_BYTES`]), then a 16-per-thread block's staged rows of
/// 512 threads (see [`rmsnorm_bwd_smem_bytes`]).
pub const fn rmsnorm_bwd_cluster_smem_bytes(
    dtype: DType,
    mode: VecMode,
    has_dres: bool,
    blocks: u64,
) -> u32 {
    let (_, g) = rmsnorm_bwd_geometry(dtype, RMSNORM_BWD_TILE);
    let rows = rmsnorm_bwd_smem_bytes(
        dtype,
        mode,
        NormBwdVariant::E16,
        &g,
        has_dres,
        blocks,
        false,
    );
    rows - RMSNORM_SMEM_BYTES + RMSNORM_BWD_CLUSTER_HEAD_BYTES
}

/// Most dynamic shared memory a cluster-split backward launch asks for.
pub const RMSNORM_BWD_CLUSTER_MAX_SMEM_BYTES: u32 =
    RMSNORM_BWD_STAGED_MAX_SMEM_BYTES - RMSNORM_SMEM_BYTES + RMSNORM_BWD_CLUSTER_HEAD_BYTES;
const _: () = assert!(RMSNORM_BWD_CLUSTER_MAX_SMEM_BYTES <= RMSNORM_REALIGNED_MAX_SMEM_BYTES);

/// The backward's launch shape for `rows x hidden`, from those and the dtype only (not the
/// device), so `dw` is reproducible across machines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NormBwdLayout {
    pub variant: NormBwdVariant,
    pub geometry: NormGeometry,
    /// Blocks of the row kernel: one per row group, capped within
    /// [`RMSNORM_BWD_GRID_THREADS`] threads (blocks then loop over row groups; see
    /// [`rmsnorm_bwd_row_blocks`]); for rows longer than 8192 the walkers
    /// ([`rmsnorm_bwd_walkers`]: the looped kernel's blocks, the cluster-split kernel's
    /// clusters); none when `hidden == 0`.
    pub blocks: u64,
    /// Partial `dw` rows, one per row slot (`blocks * rows_per_block`).
    pub slots: u64,
    /// The narrow entry that runs the two launches' rows kernel on the vector path
    /// ([`rmsnorm_bwd_narrow`], where the grid is the occupancy grid).
    pub narrow: Option<BwdNarrow>,
    /// f32 elements of the workspace: the partial `dw` rows, plus, for the looped variant,
    /// one coefficient per row; for 16-bit rows the tile passes may take, at least their
    /// partials ([`rmsnorm_bwd_tile_walkers`] rows) and one tile sum per tile per row.
    pub workspace_len: u64,
}

/// The rows kernel's blocks for `groups` row groups of geometry `g` and `dtype`: one per
/// group up to the largest power of two of blocks whose threads fit
/// [`RMSNORM_BWD_GRID_THREADS`]; from four times the *occupancy grid* on (eight times for the
/// 80-register narrow entry, [`BwdNarrow::min_groups_per_block`]), that grid:
/// `per_sm * 2^k` blocks, the most of that form within the same threads, where `per_sm` is
/// [`rmsnorm_bwd_blocks_per_sm`] (the two are the same grid where `per_sm` is 1).
///
/// Why these forms: the capped grid's blocks each loop over an equal share of the row groups,
/// so a grid just over a whole number of waves (blocks the GPU holds at once) leaves most
/// multiprocessors idle through its last wave: 409 blocks of 320 threads, one per SM on 132
/// SMs, take four waves for the work of 3.1. The grid may not depend on the device (the slots
/// fix `dw`'s bits), so it cannot be sized to the GPU. The GPUs this is tuned for (H100 and
/// H200 SXM) have 132 SMs, just above a power of two, so a power of two of blocks, or of
/// multiprocessors' worth of blocks, is one or two whole waves, or a little less than one.
/// The occupancy grid fills the multiprocessors that hold several blocks, but each of its
/// slots is a row of partials that the `dw` sum reads: below four row groups per block those
/// cost more than the fuller waves save, and the smaller power-of-two grid is kept.
pub const fn rmsnorm_bwd_row_blocks(dtype: DType, g: &NormGeometry, groups: u64) -> u64 {
    if rmsnorm_bwd_on_occupancy_grid(dtype, g, groups) {
        return rmsnorm_bwd_occupancy_grid(dtype, g);
    }
    let cap = largest_power_of_two_within(RMSNORM_BWD_GRID_THREADS, g.block_threads() as u64);
    if groups < cap { groups } else { cap }
}

/// The occupancy grid of [`rmsnorm_bwd_row_blocks`].
const fn rmsnorm_bwd_occupancy_grid(dtype: DType, g: &NormGeometry) -> u64 {
    let per_sm = rmsnorm_bwd_blocks_per_sm(dtype, g);
    let sm_threads = g.block_threads() as u64 * per_sm;
    largest_power_of_two_within(RMSNORM_BWD_GRID_THREADS, sm_threads) * per_sm
}

/// Row groups per block from which a call runs on the occupancy grid (see
/// [`rmsnorm_bwd_row_blocks`]), where no narrow entry asks for more.
const RMSNORM_BWD_OCCUPANCY_MIN_GROUPS: u64 = 4;

/// Whether `groups` row groups of geometry `g` run on the occupancy grid: four or more per
/// block, or the narrow entry's [`BwdNarrow::min_groups_per_block`].
const fn rmsnorm_bwd_on_occupancy_grid(dtype: DType, g: &NormGeometry, groups: u64) -> bool {
    let per_block = match rmsnorm_bwd_narrow(dtype, g) {
        Some(budget) => budget.min_groups_per_block(),
        None => RMSNORM_BWD_OCCUPANCY_MIN_GROUPS,
    };
    groups >= per_block * rmsnorm_bwd_occupancy_grid(dtype, g)
}

/// The largest power of two `n` with `n * size <= total` (1 when there is none).
const fn largest_power_of_two_within(total: u64, size: u64) -> u64 {
    let most = match total.checked_div(size) {
        Some(most) => most,
        None => 0,
    };
    if most <= 1 {
        1
    } else {
        1 << (63 - most.leading_zeros())
    }
}

/// Blocks of the backward's rows kernel that the grid cap ([`rmsnorm_bwd_row_blocks`]) counts
/// per multiprocessor: for one-row blocks of the 16-per-thread layout as many as the vector
/// entry that runs the geometry on the occupancy grid fits by its register budget
/// ([`rmsnorm_bwd_vector_registers`]) and its shared memory (with `dres` staged, the larger);
/// 1 otherwise.
///
/// Blocks of several rows are left at one: each row keeps its own `dw` partial, so a larger
/// grid adds `rows_per_block` partial rows per block for the `dw` sum to read, which cost more
/// than the shorter loop saved (16-bit rows of 96 threads). The looped variant has no register
/// bound to count by.
pub const fn rmsnorm_bwd_blocks_per_sm(dtype: DType, g: &NormGeometry) -> u64 {
    if g.looped || g.rows_per_block != 1 || g.block_threads() == 0 {
        return 1;
    }
    let blocks = rmsnorm_bwd_vector_blocks_per_sm(dtype, g, rmsnorm_bwd_vector_registers(dtype, g));
    if blocks == 0 { 1 } else { blocks as u64 }
}

/// One-row blocks of geometry `g` that a multiprocessor holds at `registers` per thread,
/// staged with `dres` (see [`rmsnorm_bwd_smem_bytes`]).
const fn rmsnorm_bwd_vector_blocks_per_sm(dtype: DType, g: &NormGeometry, registers: u32) -> u32 {
    let smem = rmsnorm_bwd_smem_bytes(
        dtype,
        VecMode::V16,
        NormBwdVariant::E16,
        g,
        true,
        u64::MAX,
        false,
    );
    blocks_per_sm(registers, g.block_threads(), smem)
}

/// Registers per thread of the 16-per-thread vector rows kernel that runs geometry `g` on the
/// occupancy grid (its launch bounds, `KernelId::launch_bounds` and
/// `KernelId::max_registers`): 64 for 16-bit rows, two 512-thread blocks per multiprocessor;
/// 128 for f32 rows, one, or fewer where [`rmsnorm_bwd_narrow`] has a narrow entry.
pub const fn rmsnorm_bwd_vector_registers(dtype: DType, g: &NormGeometry) -> u32 {
    match rmsnorm_bwd_narrow(dtype, g) {
        Some(budget) => budget.registers(),
        None => rmsnorm_bwd_bounded_registers(dtype),
    }
}

/// Registers per thread that the launch bounds of the 16-per-thread vector rows kernel leave:
/// [`rmsnorm_bwd_vector_min_blocks`] blocks of [`RMSNORM_BWD_MAX_THREADS_PER_ROW`] threads.
const fn rmsnorm_bwd_bounded_registers(dtype: DType) -> u32 {
    SM_REGISTERS / (RMSNORM_BWD_MAX_THREADS_PER_ROW * rmsnorm_bwd_vector_min_blocks(dtype))
}

/// Blocks of [`RMSNORM_BWD_MAX_THREADS_PER_ROW`] threads per multiprocessor that the launch
/// bounds of the 16-per-thread vector rows kernel budget registers for
/// (`KernelId::launch_bounds`): two for 16-bit rows (64 registers), one for f32 rows (128:
/// at 64 the f32 kernel spilled 400 bytes).
pub const fn rmsnorm_bwd_vector_min_blocks(dtype: DType) -> u32 {
    match dtype {
        DType::BF16 | DType::F16 => 2,
        _ => 1,
    }
}

/// A register budget of the narrow f32 vector rows kernels of the backward
/// (`rmsnorm_bwd_f32_v16_e16_r{96|80}`): the code of `rmsnorm_bwd_f32_v16_e16` compiled to
/// fewer registers per thread than its 128, so the same bits, for the blocks that then fit
/// more per multiprocessor. Fewer registers spill more (ptxas: 124 and 248 bytes, L1 hits), so
/// a block takes the largest budget that fits more of it ([`rmsnorm_bwd_narrow`]), and only
/// where each block has rows enough to gain more than the spills cost
/// ([`BwdNarrow::min_groups_per_block`]).
///
/// Blocks of 416-512 threads (f32 rows of 6145-8192) have none: at 64 registers two fit per
/// multiprocessor, but the kernel spills 412 bytes and ran 1-12% slower than one block at 128
/// (28% in graph replay at 1024 rows of 8192). f32 rows off the 16-byte grid (the staged body
/// with element copies: few values live, 16 and 92 bytes of spills) have both budgets too. The
/// one-launch kernel has both budgets on the vector path ([`rmsnorm_bwd_fused_narrow`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BwdNarrow {
    /// 96 registers: two blocks of 288-320 threads instead of one, three of 192 instead of
    /// two.
    R96,
    /// 80 registers: two blocks of 352-384 threads instead of one.
    R80,
}

impl BwdNarrow {
    /// From the most registers to the fewest: the order [`rmsnorm_bwd_narrow`] tries them in.
    pub const ALL: [BwdNarrow; 2] = [BwdNarrow::R96, BwdNarrow::R80];

    /// Registers per thread (the entry's `.maxnreg`).
    pub const fn registers(self) -> u32 {
        match self {
            BwdNarrow::R96 => 96,
            BwdNarrow::R80 => 80,
        }
    }

    /// The largest block the entry is compiled for (its `.maxntid`): above it a
    /// multiprocessor holds no more blocks at this budget than at the next larger one.
    pub const fn max_threads(self) -> u32 {
        match self {
            BwdNarrow::R96 => 320,
            BwdNarrow::R80 => 384,
        }
    }

    /// Row groups per block of the occupancy grid from which calls run this entry (and that
    /// grid): four at 96 registers; eight at 80, whose spills cost more per row than the
    /// second block saved at four (1024 x 6144: 1.3% slower per call, 5% in graph replay;
    /// 2048 x 6144 2% faster).
    pub const fn min_groups_per_block(self) -> u64 {
        match self {
            BwdNarrow::R96 => RMSNORM_BWD_OCCUPANCY_MIN_GROUPS,
            BwdNarrow::R80 => 8,
        }
    }

    /// Row groups from which a one-launch call runs the fused kernel at this budget: the
    /// fewest measured to gain (128 x 4608 29% faster in graph replay, 96 x 4608 10% slower;
    /// at 80 registers 200 x 6144 15% faster, fewer not measured).
    pub const fn min_fused_groups(self) -> u64 {
        match self {
            BwdNarrow::R96 => 128,
            BwdNarrow::R80 => 200,
        }
    }
}

/// The narrow entry that runs f32 rows of geometry `g` on the occupancy grid, if any: the
/// first [`BwdNarrow`] (most registers first) whose entry takes the block and fits more blocks
/// of it per multiprocessor than the 128-register `rmsnorm_bwd_f32_v16_e16`. The occupancy
/// grid counts those blocks ([`rmsnorm_bwd_row_blocks`]), and calls on it run the narrow
/// kernel ([`NormBwdLayout::narrow`]); on the power-of-two grid the 128-register kernel runs:
/// the spills cost where the extra blocks do not save a wave (600 x 3072 in graph replay at
/// 96 registers: 512 blocks, two waves either way, 19% slower).
pub const fn rmsnorm_bwd_narrow(dtype: DType, g: &NormGeometry) -> Option<BwdNarrow> {
    if !matches!(dtype, DType::F32) || g.looped || g.rows_per_block != 1 {
        return None;
    }
    let wide = rmsnorm_bwd_vector_blocks_per_sm(dtype, g, rmsnorm_bwd_bounded_registers(dtype));
    let mut i = 0;
    while i < BwdNarrow::ALL.len() {
        let budget = BwdNarrow::ALL[i];
        if g.block_threads() <= budget.max_threads()
            && rmsnorm_bwd_vector_blocks_per_sm(dtype, g, budget.registers()) > wide
        {
            return Some(budget);
        }
        i += 1;
    }
    None
}

/// The narrow entry of the one-launch backward for `groups` row groups of geometry `g` on
/// memory path `mode`, if any: on the vector path the budget of [`rmsnorm_bwd_narrow`], from
/// its [`BwdNarrow::min_fused_groups`] on. The same code as the fused kernel at 128 registers,
/// so the same bits, and the same launch: with a wave of row blocks or more, the extra blocks
/// per multiprocessor shorten it; with fewer, the `dw` blocks wait on the rows' and the spills
/// only lengthen that wait.
pub const fn rmsnorm_bwd_fused_narrow(
    dtype: DType,
    mode: VecMode,
    g: &NormGeometry,
    groups: u64,
) -> Option<BwdNarrow> {
    match rmsnorm_bwd_narrow(dtype, g) {
        Some(budget) if matches!(mode, VecMode::V16) && groups >= budget.min_fused_groups() => {
            Some(budget)
        }
        _ => None,
    }
}

/// Registers of one multiprocessor (sm_80 and sm_90), and the most one block may hold.
pub const SM_REGISTERS: u32 = 65536;
/// Shared memory of one sm_90 multiprocessor (H100, H200).
pub const SM_SMEM_BYTES: u32 = 228 * 1024;
/// Shared memory the system takes per resident block, beyond the block's own.
pub const SM_BLOCK_RESERVED_SMEM_BYTES: u32 = 1024;
/// Resident warps of one sm_90 multiprocessor.
pub const SM_MAX_WARPS: u32 = 64;
/// Resident blocks of one sm_90 multiprocessor.
pub const SM_MAX_BLOCKS: u32 = 32;

/// Registers a block of `threads` takes at `per_thread` registers: allocated per warp, in
/// units of 256.
pub const fn block_registers(per_thread: u32, threads: u32) -> u32 {
    let per_warp = (per_thread * 32).div_ceil(256) * 256;
    threads.div_ceil(32) * per_warp
}

/// Blocks of `threads` threads at `registers` per thread and `smem_bytes` of dynamic shared
/// memory that an sm_90 multiprocessor holds at once, as the occupancy calculator counts them:
/// registers go to warps in units of 256, warps in groups of four (one per scheduler).
pub const fn blocks_per_sm(registers: u32, threads: u32, smem_bytes: u32) -> u32 {
    let warps = SM_REGISTERS / block_registers(registers, 32) / 4 * 4;
    let warps = if warps < SM_MAX_WARPS {
        warps
    } else {
        SM_MAX_WARPS
    };
    let by_registers = warps / threads.div_ceil(32);
    let by_smem = SM_SMEM_BYTES / (smem_bytes + SM_BLOCK_RESERVED_SMEM_BYTES);
    let blocks = if by_registers < by_smem {
        by_registers
    } else {
        by_smem
    };
    if blocks < SM_MAX_BLOCKS {
        blocks
    } else {
        SM_MAX_BLOCKS
    }
}

/// See [`NormBwdLayout`].
pub const fn rmsnorm_bwd_layout(dtype: DType, rows: u64, hidden: u64) -> NormBwdLayout {
    let (variant, geometry) = rmsnorm_bwd_geometry(dtype, hidden);
    let groups = rows.div_ceil(geometry.rows_per_block as u64);
    let blocks = match variant {
        _ if hidden == 0 => 0,
        NormBwdVariant::E16 => rmsnorm_bwd_row_blocks(dtype, &geometry, groups),
        NormBwdVariant::Loop => rmsnorm_bwd_walkers(rows, hidden),
    };
    let slots = blocks * geometry.rows_per_block as u64;
    let coef = match variant {
        NormBwdVariant::Loop => rows,
        NormBwdVariant::E16 => 0,
    };
    let looped_len = slots.saturating_mul(hidden).saturating_add(coef);
    // The tile passes' partials and tile sums, where they may run instead (16-bit rows).
    let tile_len = if matches!(variant, NormBwdVariant::Loop)
        && dtype.size_bytes() == 2
        && rmsnorm_bwd_cluster_fits(hidden)
    {
        rmsnorm_bwd_tile_walkers(rows, hidden)
            .saturating_mul(hidden)
            .saturating_add(rows.saturating_mul(rmsnorm_bwd_tiles(hidden)))
    } else {
        0
    };
    NormBwdLayout {
        variant,
        geometry,
        blocks,
        slots,
        narrow: if rmsnorm_bwd_on_occupancy_grid(dtype, &geometry, groups) {
            rmsnorm_bwd_narrow(dtype, &geometry)
        } else {
            None
        },
        // Saturating: a shape no buffer could hold asks for more than any buffer has (the
        // planner's size check then rejects it) rather than overflowing.
        workspace_len: if looped_len > tile_len {
            looped_len
        } else {
            tile_len
        },
    }
}

/// Fused residual-add + RMSNorm forward, one row `r < rows` of `hidden` elements:
///
/// ```text
/// h = x + residual              (f32, right after the loads; stored in the storage dtype)
/// rstd = 1 / sqrt(sum(h*h) / hidden + eps)     (eps inside the square root)
/// y = (h * rstd) * w            (w widened to f32 first; Gemma: (1 + w), formed in f32)
/// ```
///
/// Element `[r, c]` of matrix `m` lives at `m + (r * m_stride + c) * size_of(dtype)`; `w` is
/// one row of `hidden` elements (storage dtype, or f32 with [`RMSNORM_W_F32`]); `rstd` is f32
/// at `rstd + r * rstd_stride * 4`.
///
/// Optional operands are address 0: `residual == 0` is plain RMSNorm (`h = x`, and then
/// `h == 0`: nothing stored); `rstd == 0` skips the per-row `rstd` store.
///
/// Aliasing: `h` may be exactly `x` or exactly `residual`, `y` may be exactly `x` (not both
/// on `x`); nothing else overlaps an output. Each element is read and written by one thread,
/// reads first. `eps` is finite and > 0 (the host checks). Launch: the geometry of
/// [`rmsnorm_fwd_geometry`], `ceil(rows / rows_per_block)` blocks, [`RMSNORM_SMEM_BYTES`]
/// of dynamic shared memory ([`RMSNORM_LOOP_SMEM_BYTES`] for looped rows); or the split form
/// of [`rmsnorm_split_geometry`] (`rows` clusters, [`RMSNORM_SPLIT_SMEM_BYTES`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RmsNormFwdParams {
    pub x: u64,
    pub residual: u64,
    pub w: u64,
    pub y: u64,
    pub h: u64,
    pub rstd: u64,
    pub x_stride: u64,
    pub residual_stride: u64,
    pub y_stride: u64,
    pub h_stride: u64,
    pub rstd_stride: u64,
    pub rows: u64,
    pub hidden: u64,
    pub eps: f32,
    /// [`RMSNORM_GEMMA`] | [`RMSNORM_HF`] | [`RMSNORM_W_F32`].
    pub flags: u32,
    pub threads_per_row: u32,
    pub rows_per_block: u32,
}

/// RMSNorm backward, first kernel: per row, from the saved `h` and `rstd`,
///
/// ```text
/// g  = w * dy                                  (Gemma: (1 + w) * dy)
/// dx = rstd * (g - h * rstd^2 * sum(h * g) / hidden) + dres
/// ```
///
/// `dx` is the gradient of both `x` and `residual` (they enter as `x + residual`); `dres`
/// (address 0: none) is the gradient already flowing into the residual stream. Each block
/// also sums `dy * h * rstd` over its rows into its own rows of the f32 `workspace`
/// (`[slots, hidden]`, `slots = grid * rows_per_block`, row slot `s` holding rows
/// `s, s + slots, ...` in that order); the looped variant keeps one f32 per row after them
/// (`workspace + slots * hidden`). [`RmsNormDwParams`] then sums the slots in a fixed order.
///
/// Aliasing: `dx` may be exactly `dy` or exactly `dres`; the workspace overlaps nothing.
/// Launch: the geometry of [`rmsnorm_bwd_geometry`], the blocks of [`rmsnorm_bwd_layout`],
/// [`rmsnorm_bwd_smem_bytes`] of dynamic shared memory.
///
/// The fused entries write no partials: one block per row group (`_e16_fused`, rows held 16
/// per thread), or one cluster per row (`_cluster_fused`, a row per walker: `rows` clusters of
/// [`rmsnorm_bwd_tiles`] blocks), then [`rmsnorm_bwd_fused_dw_blocks`] more (rounded up to
/// whole clusters), which sum `dw` (at `dw`, `[1, hidden]` in the weight's dtype) straight
/// from `h`, `dy` and `rstd` in the order the two launches of [`rmsnorm_bwd_layout`] sum it,
/// so both give the same bits; `workspace` is then unused.
///
/// The tile passes (16-bit rows [`rmsnorm_bwd_cluster_fits`] covers, without clusters) are
/// two launches before the `dw` sum: `_tile_sums`, a 512-thread block per tile per row (`rows
/// x tiles` blocks), writes each tile's sum of `h * g` to f32 index `dw_slots * hidden + row *
/// tiles + tile` of the workspace; `_tile_dx`, a block per tile per walker (`dw_slots x tiles`
/// blocks), folds a row's tile sums in tile order, as the cluster split does, and writes `dx`
/// and its walker's partial row.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RmsNormBwdParams {
    pub dy: u64,
    pub h: u64,
    pub w: u64,
    pub rstd: u64,
    pub dres: u64,
    pub dx: u64,
    pub workspace: u64,
    pub dy_stride: u64,
    pub h_stride: u64,
    pub rstd_stride: u64,
    pub dres_stride: u64,
    pub dx_stride: u64,
    pub rows: u64,
    pub hidden: u64,
    /// [`RMSNORM_GEMMA`] | [`RMSNORM_W_F32`].
    pub flags: u32,
    pub threads_per_row: u32,
    pub rows_per_block: u32,
    /// The fused entries: the slots of the two-launch layout of the same call
    /// ([`rmsnorm_bwd_layout`]), whose order their `dw` blocks follow (0 for the others); for
    /// `_cluster_fused` also its walkers, the clusters before the `dw` blocks; for the tile
    /// passes (`_tile_sums`, `_tile_dx`) their walkers ([`rmsnorm_bwd_tile_walkers`]), whose
    /// partials come before the tile sums in the workspace.
    pub dw_slots: u32,
    /// `dw`, for the fused entries only (0 for the others).
    pub dw: u64,
}

/// RMSNorm backward, second kernel: `dw[c] = sum over s < slots of workspace[s * hidden + c]`,
/// in the order of `s` (fixed slices of the slots, then the slices in order), stored in the
/// weight's dtype. Launch: `ceil(hidden / 32)` blocks of [`RMSNORM_DW_THREADS`],
/// [`RMSNORM_DW_SMEM_BYTES`] of dynamic shared memory.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RmsNormDwParams {
    pub workspace: u64,
    pub dw: u64,
    pub slots: u64,
    pub hidden: u64,
}

// ---------------------------------------------------------------------------------------------
// Gated activations with FP8 E4M3 outputs (`gated_fp8_*` kernels).
// ---------------------------------------------------------------------------------------------

/// Threads per block of the per-token FP8 kernels, fixed so that a thread's accesses are one
/// address plus immediate offsets. Each thread holds up to [`GATED_FP8_ROW_CHUNKS`] accesses
/// of its row per tile (two blocks per SM), or [`GATED_FP8_ROW_LONG_CHUNKS`] in the long-row
/// kernel (one block per SM); the split kernel holds a row of up to
/// [`GATED_FP8_ROW_MAX_BLOCKS`] tiles on as many blocks of a cluster. Rows longer than the
/// planned kernel holds are walked twice, the second time mostly from L2 (see
/// `kernels/src/gated_fp8.rs`).
pub const GATED_FP8_ROW_MAX_THREADS: u32 = 512;
/// Accesses (16-byte vectors, or elements on the scalar path) a thread of the per-token FP8
/// kernel holds per tile of its row.
pub const GATED_FP8_ROW_CHUNKS: usize = 4;
/// Most 16-byte accesses a thread of the many-rows per-token FP8 kernel (`gated_fp8_rows_*`)
/// holds: rows of up to this many tiles of [`GATED_FP8_ROW_MAX_THREADS`] accesses, each on
/// the fewest warps that hold it, several rows per block.
pub const GATED_FP8_ROWS_CHUNKS: usize = 2;
/// Accesses a thread of the long-row per-token FP8 kernel holds: rows of more than one tile
/// of [`GATED_FP8_ROW_CHUNKS`] and at most one of these.
pub const GATED_FP8_ROW_LONG_CHUNKS: usize = 8;
/// The fewest accesses per thread of a streamed per-token FP8 row (`gated_fp8_row_stream_*`,
/// an entry per count from this one to [`GATED_FP8_ROW_LONG_CHUNKS`]).
pub const GATED_FP8_STREAM_MIN_CHUNKS: usize = 3;
/// Dynamic shared memory of the streamed per-token kernel (`gated_fp8_row_stream_*`, sm_90):
/// the warps' maxima and the copy barrier in the first 128 bytes, then one row's `a` and `b`
/// of up to [`GATED_FP8_ROW_LONG_CHUNKS`] 16-byte accesses per thread each.
pub const GATED_FP8_STREAM_SMEM_BYTES: u32 =
    128 + 2 * GATED_FP8_ROW_LONG_CHUNKS as u32 * GATED_FP8_ROW_MAX_THREADS * 16;
/// Dynamic shared memory of a per-token launch: one f32 per warp of the block, and one for
/// the block's maximum, which the blocks of a split row read.
pub const GATED_FP8_ROW_SMEM_BYTES: u32 = (GATED_FP8_ROW_MAX_THREADS / 32 + 1) * 4;
/// Most blocks a split per-token row spans (the portable cluster size): rows of up to
/// `8 * 512 * GATED_FP8_ROW_CHUNKS` accesses are held in registers by the split kernel.
pub const GATED_FP8_ROW_MAX_BLOCKS: u32 = 8;
/// Accesses per lane per step of the flat FP8 kernel's scalar path (one element each); a
/// group of `g` columns there is one warp's `g / 32` accesses per lane.
pub const GATED_FP8_SCALAR_BATCH: usize = 4;

/// `y_q[r, c] = e4m3(act(a[r, c]) * b[r, c] / scale)` with the scale of
/// [`crate::fp8`]`::FP8_*` `scheme`:
///
/// - `FP8_STATIC`: one f32 at `scale`, read by the kernel (written by the caller);
/// - `FP8_PER_TOKEN`: one f32 per row, `dynamic_scale(max_c |y[r, c]|, min_scale, scale_ub)`,
///   written at `scale + r * scale_row * 4`;
/// - `FP8_PER_GROUP`: one f32 per group of `2^group_shift` accesses of a row
///   (`dynamic_scale` of the group's largest magnitude, no upper bound), the scale of group
///   `g` of row `r` written at `scale + (r * scale_row + g * scale_group) * 4` (row-major
///   scales: `scale_row` = the scale matrix's row stride, `scale_group` = 1; column-major:
///   `scale_row` = 1, `scale_group` = its column stride).
///
/// `a`, `b` are in the storage dtype with row strides `a_stride`, `b_stride` (elements); `y`
/// is FP8 (one byte per element) with row stride `y_stride`. All math is f32: `y` as the
/// non-FP8 kernel computes it, `amax / 448` and `y / scale` correctly rounded, then one
/// saturating round-to-nearest-even conversion.
///
/// Launch: the flat kernels (`gated_fp8_flat_*` static, `gated_fp8_group_*` per-group) take
/// `GATED_THREADS` threads per block and walk `rows * walk.per_row` steps (`walk` built for
/// the grid; fewer than 2^32 accesses in all), one warp at a time: a warp's step is 32
/// accesses on the static vector path, 32 pairs of accesses on the per-group vector path (a
/// lane's two accesses half a group apart, so `walk.per_row` is half the row's accesses),
/// `32 * batch` accesses on the scalar path (lane `l` taking accesses `l + 32k`, `k < batch`).
/// A group is `2^group_shift` consecutive accesses, reduced over `group_lanes` lanes (half
/// its accesses on the vector path, the whole warp on the scalar path). The row kernels
/// (per-token) take `row_blocks` blocks of [`GATED_FP8_ROW_MAX_THREADS`] threads per row
/// (`threads_per_row`, `rows_per_block` = 1: the kernels assume that geometry; more than one
/// block per row only for the split kernel, launched in clusters of `row_blocks`, block rank
/// `r` holding the tile of accesses `r * 512 * chunks ..`), each thread holding up to
/// `chunks` accesses of its row per tile (`chunks` <= [`GATED_FP8_ROW_CHUNKS`], or
/// [`GATED_FP8_ROW_LONG_CHUNKS`] in the long-row kernel); a row longer than one block's (or
/// the cluster's) tiles is walked twice (once for the maximum, once for the output); and
/// [`GATED_FP8_ROW_SMEM_BYTES`] of dynamic shared memory. The many-rows kernel
/// (`gated_fp8_rows_*`, 16-byte accesses) takes `rows_per_block` rows per block of
/// `rows_per_block * threads_per_row` threads (at most 512; `threads_per_row` a multiple of
/// 32), row `block * rows_per_block + k` on the block's threads `k * threads_per_row ..`,
/// thread `t` of a row holding its accesses `t + j * threads_per_row`, `j < chunks` (1 or
/// [`GATED_FP8_ROWS_CHUNKS`]), which cover the row; the same shared memory. Its form for 16-bit
/// rows off the 16-byte grid (`gated_fp8_rows_realigned_*`) takes the one-row-per-group
/// geometry over the `walk.per_row` aligned words of `y` a row can touch, `chunks` =
/// [`GATED_FP8_ROWS_CHUNKS`].
///
/// Aliasing: `y` and the scales overlap nothing (the host checks).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GatedFp8Params {
    pub a: u64,
    pub b: u64,
    pub y: u64,
    pub scale: u64,
    pub a_stride: u64,
    pub b_stride: u64,
    pub y_stride: u64,
    pub scale_row: u64,
    pub scale_group: u64,
    pub rows: u64,
    pub cols: u64,
    /// Steps per row (accesses, or pairs on the per-group vector path) and (flat kernels)
    /// the walk of the grid: see [`GridWalk`].
    pub walk: GridWalk,
    /// Lower bound of a dynamic scale (> 0).
    pub min_scale: f32,
    /// Upper bound of the per-token `amax` (+inf: none).
    pub scale_ub: f32,
    /// An [`crate::Activation`] as `u32`.
    pub act: u32,
    /// `FP8_STATIC`, `FP8_PER_TOKEN` or `FP8_PER_GROUP`: the scheme the host planned (each
    /// entry runs one scheme, so the kernels do not read it).
    pub scheme: u32,
    /// log2 of the accesses per group (per-group).
    pub group_shift: u32,
    /// Lanes a group spans (4, 8 or 16 on the vector path, 32 on the scalar path;
    /// per-group).
    pub group_lanes: u32,
    /// Accesses per lane per warp step on the flat kernel's scalar path (at most
    /// [`GATED_FP8_SCALAR_BATCH`]).
    pub batch: u32,
    pub threads_per_row: u32,
    pub rows_per_block: u32,
    /// Accesses per thread per tile (row kernel).
    pub chunks: u32,
    /// Row kernels, blocks holding their whole tile on the vector path: how many rows ahead a
    /// block asks L2 for its tile (one bulk prefetch each of `a` and `b`, sm_90) while it
    /// works on its own, so that HBM keeps streaming while the block reduces and stores; the
    /// rows resident at once, since blocks start in order and the blocks that take row
    /// `r + prefetch_rows` start about when this one ends. 0: no prefetch.
    pub prefetch_rows: u32,
    /// Row kernel: blocks per row (the cluster size of the split kernel, 1 elsewhere).
    pub row_blocks: u32,
    /// The static vector path over a flat range: its ragged ends (see [`FlatEnds`]).
    pub ends: FlatEnds,
    pub _pad: u32,
}

// ---------------------------------------------------------------------------------------------
// Residual-add + RMSNorm with an FP8 E4M3 output (`rmsnorm_fp8_*` kernels).
// ---------------------------------------------------------------------------------------------

/// The add + RMSNorm forward of [`RmsNormFwdParams`] with `y` quantised to FP8 E4M3:
/// `y_q[r, c] = e4m3(y[r, c] / scale)`, `y` the f32 value the storage-dtype forward rounds
/// (same geometry, same order of every sum, so the same bits). In `norm`, `y` is the FP8
/// output (one byte per element) and `y_stride` its row stride in bytes; `h`, `rstd` and the
/// rest mean what they mean there. The scale follows [`crate::fp8`]`::FP8_*` `scheme`:
///
/// - `FP8_STATIC`: one f32 at `scale`, read by the kernel;
/// - `FP8_PER_TOKEN`: one f32 per row, `dynamic_scale(max_c |y[r, c]|, min_scale, scale_ub)`,
///   written at `scale + r * scale_row * 4`;
/// - `FP8_PER_GROUP`: one f32 per group of `group_lanes` consecutive 16-byte chunks of a row
///   (`dynamic_scale` of the group's largest magnitude, no upper bound), group `g` of row `r`
///   at `scale + (r * scale_row + g * scale_group) * 4` (row-major or column-major as in
///   [`GatedFp8Params`]); `group_shift` = log2(`group_lanes`).
///
/// Every geometry of [`rmsnorm_fwd_geometry`]. Launch: as the norm forward
/// (`ceil(rows / rows_per_block)` blocks, [`RMSNORM_SMEM_BYTES`] of dynamic shared memory,
/// [`RMSNORM_LOOP_SMEM_BYTES`] for looped rows; the realigned and streamed entries as their
/// kernel ids say).
/// Aliasing: `h` may be exactly `x` or exactly `residual`; `y` and the scales overlap nothing.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RmsNormFp8Params {
    pub norm: RmsNormFwdParams,
    pub scale: u64,
    pub scale_row: u64,
    pub scale_group: u64,
    /// Lower bound of a dynamic scale (> 0).
    pub min_scale: f32,
    /// Upper bound of the per-token `amax` (+inf: none).
    pub scale_ub: f32,
    /// `FP8_STATIC`, `FP8_PER_TOKEN` or `FP8_PER_GROUP`: the scheme the host planned (each
    /// entry runs one scheme, so the kernels do not read it).
    pub scheme: u32,
    pub group_shift: u32,
    /// Chunks (and lanes) a group spans: a power of two, at most 32 (per-group).
    pub group_lanes: u32,
    pub _pad: u32,
}
