//! The table of kernel entry points. The kernels crate exports exactly these names (the PTX
//! build in `cargo xtask ptx` and the host's tests compare the `.entry` list against it), and
//! the host looks each one up once per context by [`KernelId::index`].

use crate::DType::{BF16, F16, F32};
use crate::NormBwdVariant as Bwd;
use crate::NormFwdVariant as Fwd;
use crate::fp8::{FP8_PER_GROUP, FP8_PER_TOKEN, FP8_STATIC};
use crate::{
    BwdNarrow, DType, GATED_FP8_ROW_MAX_THREADS, GATED_FP8_STREAM_SMEM_BYTES, GATED_THREADS,
    NormBwdVariant, NormFwdVariant, RMSNORM_BWD_CLUSTER_MAX_SMEM_BYTES, RMSNORM_BWD_LOOP_THREADS,
    RMSNORM_BWD_MAX_THREADS_PER_ROW, RMSNORM_BWD_STAGED_MAX_SMEM_BYTES, RMSNORM_DW_THREADS,
    RMSNORM_MAX_THREADS_PER_ROW, RMSNORM_REALIGNED_MAX_SMEM_BYTES, RMSNORM_STREAM_SMEM_BYTES,
    ZERO_FILL_THREADS, rmsnorm_bwd_max_threads_per_row, rmsnorm_bwd_staged,
    rmsnorm_bwd_vector_min_blocks,
};
use VecMode::{Scalar, V16};

/// How a kernel touches memory: 16-byte vectors (every pointer 16-byte aligned, every row
/// stride and the row length multiples of the vector) or one element at a time. The host picks
/// it per call; each entry is compiled for one (`_v16` / `_scalar` in its name), the kernel
/// bodies taking it as a const parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(target_arch = "nvptx64", derive(core::marker::ConstParamTy))]
pub enum VecMode {
    V16 = 0,
    Scalar = 1,
}

/// How a norm forward kernel touches memory: the two paths of [`VecMode`] and one of its own for
/// rows off the 16-byte grid. Every path assigns and accumulates a row's elements identically,
/// so all three compute the same bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(target_arch = "nvptx64", derive(core::marker::ConstParamTy))]
pub enum NormPath {
    /// As [`VecMode::V16`].
    V16 = 0,
    /// As [`VecMode::Scalar`].
    Scalar = 1,
    /// 16-byte vectors at 16-byte boundaries for rows at any offset, of any length and row
    /// stride: the aligned vectors of the row are staged in shared memory and each thread reads
    /// its chunks back at the row's offset; stores move the elements into place with warp
    /// shuffles. Needs a 16-byte aligned weight.
    Realigned = 2,
}

impl NormPath {
    /// The same path as `mode`.
    pub const fn of(mode: VecMode) -> Self {
        match mode {
            VecMode::V16 => NormPath::V16,
            VecMode::Scalar => NormPath::Scalar,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelId {
    GatedFwd(DType, VecMode),
    GatedBwd(DType, VecMode),
    /// [`KernelId::GatedFwd`] on the vector path that also takes a flat range's ragged head
    /// and tail (`gated_fwd_{dtype}_v16_ends`; see [`crate::FlatEnds`]): its own entry, so the
    /// plain one keeps its code.
    GatedFwdEnds(DType),
    /// The same for the backward (`gated_bwd_{dtype}_v16_ends`).
    GatedBwdEnds(DType),
    /// Gated forward for operands at any element offset and row stride: aligned 16-byte
    /// vectors of `y`, the inputs realigned in registers (`gated_fwd_{dtype}_realigned`).
    GatedFwdRealigned(DType),
    /// [`KernelId::GatedFwdRealigned`] with a warp's row ends run before its vector lanes,
    /// so that their loads wait together (`gated_fwd_{dtype}_realigned_ends_first`): more
    /// registers, for grids that fit on the device at once.
    GatedFwdRealignedEndsFirst(DType),
    /// Gated backward on the realigned path: aligned 16-byte vectors of `da` and of `db`, the
    /// inputs realigned in registers to each (`gated_bwd_{dtype}_realigned`); gradients that
    /// overlap no input.
    GatedBwdRealigned(DType),
    /// Residual-add + RMSNorm forward (`rmsnorm_fwd_{dtype}_{v16|scalar}_{e16|e32|loop}`).
    RmsNormFwd(DType, VecMode, NormFwdVariant),
    /// Residual-add + RMSNorm forward on the realigned path ([`NormPath::Realigned`])
    /// (`rmsnorm_fwd_{dtype}_realigned_{e16|e32}`): rows of any row stride and offset that a
    /// register geometry holds, with a 16-byte aligned weight, while their staging fits
    /// [`crate::RMSNORM_REALIGNED_MAX_SMEM_BYTES`] ([`crate::rmsnorm_realigned_fits`]).
    RmsNormFwdRealigned(DType, NormFwdVariant),
    /// Residual-add + RMSNorm forward, 16 elements per thread on the v16 path, the weight
    /// loaded with the inputs: for grids of one wave (`rmsnorm_fwd_{dtype}_v16_e16_wfirst`).
    RmsNormFwdWFirst(DType),
    /// Residual-add + RMSNorm forward of a looped row split over the blocks of a thread-block
    /// cluster, one tile (`E16`) or two (`E32`) per block, sm_90 (clusters); the sm_80 module
    /// has the entries but never runs them
    /// (`rmsnorm_fwd_{dtype}_{v16|realigned|scalar}_split_{e16|e32}`, no f32 realigned `e32`;
    /// see `crate::rmsnorm_split_geometry` and `crate::rmsnorm_split_smem_bytes`).
    RmsNormFwdSplit(DType, NormPath, NormFwdVariant),
    /// The one-tile form of [`KernelId::RmsNormFwdSplit`] compiled for three blocks per
    /// multiprocessor (40 registers) instead of two, so that more clusters of many blocks fit
    /// the GPU at once; on the vector and the 16-bit realigned paths
    /// (`rmsnorm_fwd_{dtype}_{v16|realigned}_split_e16_r40`). Planned where
    /// `GridLimits::narrow_split` is set (by default on a device with clusters).
    RmsNormFwdSplitNarrow(DType, NormPath),
    /// The looped form of [`KernelId::RmsNormFwd`] that issues each tile's loads while the
    /// tile before it is worked on: two tiles in flight per block, at more registers than
    /// two 512-thread blocks per multiprocessor allow, for calls of few rows (at most one per
    /// two multiprocessors; `rmsnorm_fwd_{dtype}_{v16|scalar}_loop_ahead`, planned where
    /// `GridLimits::loop_ahead` is set, by default). The same bits as the looped kernel.
    RmsNormFwdLoopAhead(DType, VecMode),
    /// RMSNorm backward rows and `dw` partials (`rmsnorm_bwd_{dtype}_{v16|scalar}_{e16|loop}`).
    RmsNormBwd(DType, VecMode, NormBwdVariant),
    /// RMSNorm backward of rows longer than 8192 split over the blocks of a thread-block
    /// cluster, one tile per block, each held as the 16-per-thread kernel holds a row; the
    /// same bits as [`KernelId::RmsNormBwdLoopTiles`]
    /// (`rmsnorm_bwd_{dtype}_{v16|scalar}_cluster`; sm_90, the sm_80 module has the entries but
    /// never runs them; see `crate::rmsnorm_bwd_cluster_fits` and `crate::rmsnorm_bwd_walkers`).
    RmsNormBwdCluster(DType, VecMode),
    /// The looped backward of the rows [`KernelId::RmsNormBwdCluster`] takes, in its tiles'
    /// shape (the same bits): where clusters are not run
    /// (`rmsnorm_bwd_{dtype}_{v16|scalar}_loop_tiles`).
    RmsNormBwdLoopTiles(DType, VecMode),
    /// The first of the tile passes over the rows [`KernelId::RmsNormBwdCluster`] takes,
    /// without clusters: a 512-thread block per tile per row sums the tile's `h * w * dy` as a
    /// cluster's block does (`rmsnorm_bwd_{f16|bf16}_{v16|scalar}_tile_sums`, 16-bit rows
    /// only: the f32 `dx` pass spilled at the 128 registers of a 512-thread block; see
    /// `crate::RmsNormBwdParams`).
    RmsNormBwdTileSums(DType, VecMode),
    /// The second tile pass: a block per tile per walker folds each row's tile sums, writes
    /// `dx` and the walker's `dw` partial (`rmsnorm_bwd_{f16|bf16}_{v16|scalar}_tile_dx`; see
    /// `crate::rmsnorm_bwd_tile_walkers`). `dx` has the cluster split's bits.
    RmsNormBwdTileDx(DType, VecMode),
    /// [`KernelId::RmsNormBwdCluster`] in one launch, for calls of at most a row per walker:
    /// the clusters' `dx`, then blocks that sum `dw` from `h`, `dy` and `rstd`, with the bits
    /// of the two launches (`rmsnorm_bwd_{dtype}_{v16|scalar}_cluster_fused`; sm_90 as the
    /// split; see `crate::RmsNormBwdParams`).
    RmsNormBwdClusterFused(DType, VecMode),
    /// The 16-per-thread form of [`KernelId::RmsNormBwd`] compiled to the register budget of
    /// a [`BwdNarrow`], for blocks of at most its `max_threads` (f32 only, staged on both
    /// paths, `rmsnorm_bwd_{dtype}_{v16|scalar}_e16_r{96|80}`; see `crate::rmsnorm_bwd_narrow`).
    RmsNormBwdNarrow(DType, VecMode, BwdNarrow),
    /// RMSNorm backward in one launch, for calls of few rows: `dx`, and `dw` summed by blocks
    /// of its own, with the bits of the two launches
    /// (`rmsnorm_bwd_{dtype}_{v16|scalar}_e16_fused`; see `crate::RmsNormBwdParams`).
    RmsNormBwdFused(DType, VecMode),
    /// The vector form of [`KernelId::RmsNormBwdFused`] compiled to the register budget of a
    /// [`BwdNarrow`], for one-launch calls of many rows (f32 only,
    /// `rmsnorm_bwd_{dtype}_v16_e16_fused_r{96|80}`; see `crate::rmsnorm_bwd_fused_narrow`).
    RmsNormBwdFusedNarrow(DType, BwdNarrow),
    /// RMSNorm `dw` reduction over the partials; the dtype is the weight's (`rmsnorm_dw_{dtype}`).
    RmsNormDw(DType),
    /// Writes zeros over a buffer; the benchmark flushes the L2 with it (see `zero_fill`).
    ZeroFill,
    /// Gated forward with FP8 E4M3 output and a static scale: a flat walk over the elements
    /// (`gated_fp8_flat_{dtype}_{v16|scalar}`; see `GatedFp8Params`).
    GatedFp8Flat(DType, VecMode),
    /// [`KernelId::GatedFp8Flat`] on the vector path that also takes a flat range's ragged
    /// head and tail (`gated_fp8_flat_{dtype}_v16_ends`; see [`crate::FlatEnds`]).
    GatedFp8FlatEnds(DType),
    /// Gated forward with FP8 E4M3 output and per-group scales: the flat walk, a group's
    /// maximum over its lanes (`gated_fp8_group_{dtype}_{v16|scalar}`).
    GatedFp8Group(DType, VecMode),
    /// Gated forward with FP8 E4M3 output and per-token scales: rows held by a block
    /// (`gated_fp8_row_{dtype}_{v16|scalar}`).
    GatedFp8Row(DType, VecMode),
    /// The per-token kernel for 16-bit rows off the 16-byte grid: each access an aligned
    /// 8-byte word of `y`, its inputs realigned in registers, a row's words in one tile of a
    /// block of at most 4 accesses per thread (`gated_fp8_row_realigned_{f16|bf16}`).
    GatedFp8RowRealigned(DType),
    /// The many-rows kernel for 16-bit rows off the 16-byte grid: rows of up to two aligned
    /// words of `y` per thread, several rows per block, each on the fewest warps that hold it
    /// at two words per thread (`gated_fp8_rows_realigned_{f16|bf16}`).
    GatedFp8RowsRealigned(DType),
    /// The static-scale kernel for 16-bit rows off the 16-byte grid: the flat walk over the
    /// aligned words of `y` a row can touch, each word's inputs realigned in registers
    /// (`gated_fp8_flat_realigned_{f16|bf16}`).
    GatedFp8FlatRealigned(DType),
    /// The same for small grids (a word per thread): a word's loads issued together and the
    /// scale read after them (`gated_fp8_flat_realigned_ends_first_{f16|bf16}`).
    GatedFp8FlatRealignedEndsFirst(DType),
    /// The per-token kernel for rows of 2049-4096 accesses: a whole row in registers, one
    /// block per SM (`gated_fp8_row_long_{dtype}_{v16|scalar}`).
    GatedFp8RowLong(DType, VecMode),
    /// The per-token kernel for rows of more than one tile: a row on the blocks of a
    /// thread-block cluster, one tile each (`gated_fp8_row_split_{dtype}_{v16|scalar}`, sm_90).
    GatedFp8RowSplit(DType, VecMode),
    /// The per-token kernel for rows of 16-byte accesses, streamed (the long-row kernel's rows,
    /// and rows of one tile past two waves of the row kernel): one block per SM takes row after
    /// row, the next one copied into shared memory while it works on the current one; one
    /// entry per count of accesses per thread, 3 to 8
    /// (`gated_fp8_row_stream_{dtype}_c{count}`, sm_90; the sm_80 module has the entries but
    /// never runs them).
    GatedFp8RowStream(DType, u32),
    /// The per-token kernel for rows of one or two 16-byte accesses per thread of one block
    /// (an entry per count): `rows_per_block` rows on a block, each on `threads_per_row`
    /// threads, the fewest warps that hold it (`gated_fp8_rows_{dtype}_c{1|2}`).
    GatedFp8Rows(DType, u32),
    /// Residual-add + RMSNorm forward with FP8 E4M3 output `y`, rows held in registers or
    /// looped (rows of more than 16384 elements), for one scaling scheme (`FP8_STATIC`,
    /// `FP8_PER_TOKEN` or `FP8_PER_GROUP`):
    /// `rmsnorm_fp8_{static|token|group}_{dtype}_{v16|scalar}_{e16|e32|loop}`; see
    /// `RmsNormFp8Params`. One entry per scheme: ptxas allocates registers and schedules a
    /// whole entry at once, so a scheme's body is compiled alone, unaffected by the others'.
    RmsNormFp8(DType, VecMode, NormFwdVariant, u32),
    /// [`KernelId::RmsNormFp8`] on the realigned path ([`NormPath::Realigned`]), 16-bit
    /// dtypes: rows of any offset and row stride, staged as [`KernelId::RmsNormFwdRealigned`]
    /// stages them, where that kernel would take the row
    /// (`rmsnorm_fp8_{static|token|group}_{f16|bf16}_realigned_{e16|e32}`). The same bits as
    /// the scalar entry.
    RmsNormFp8Realigned(DType, NormFwdVariant, u32),
    /// Residual-add + RMSNorm forward of rows of 32 elements per thread on the vector path,
    /// streamed: one block per SM takes row after row, the next one copied into shared memory
    /// while it works on the current one (`rmsnorm_fwd_{dtype}_v16_stream`, sm_90; the sm_80
    /// module has the entries but never runs them). The same bits as [`KernelId::RmsNormFwd`].
    RmsNormFwdStream(DType),
    /// [`KernelId::RmsNormFwdStream`] with the FP8 output of one scheme, as
    /// [`KernelId::RmsNormFp8`] computes it (`rmsnorm_fp8_{static|token|group}_{dtype}_v16_stream`).
    RmsNormFp8Stream(DType, u32),
    /// [`KernelId::RmsNormFp8`] for a looped row split over the blocks of a thread-block
    /// cluster, one tile per block, as [`KernelId::RmsNormFwdSplit`] splits it, sm_90 (the
    /// sm_80 module has the entries but never runs them): the looped kernel's bits, for calls
    /// of few rows (`rmsnorm_fp8_{static|token|group}_{dtype}_{v16|scalar|realigned}_split`,
    /// the realigned path for 16-bit dtypes only).
    RmsNormFp8Split(DType, NormPath, u32),
    /// The looped [`KernelId::RmsNormFp8`] (rows of more than 16384 elements) issuing each
    /// tile's loads while the tile before it is worked on, as
    /// [`KernelId::RmsNormFwdLoopAhead`]: for calls of at most one row per two
    /// multiprocessors that the split does not take, planned where `GridLimits::loop_ahead`
    /// is set (`rmsnorm_fp8_{static|token|group}_{dtype}_{v16|scalar}_loop_ahead`). The same
    /// bits as the looped kernel.
    RmsNormFp8LoopAhead(DType, VecMode, u32),
    /// An entry that does nothing, launched by the benchmark to measure the launch floor.
    Empty,
}

/// Defines the table below: one line per PTX entry, `name = value`, in index order.
///
/// From that one list it generates [`KernelId::index`] (the line's position, the discriminant
/// of a private enum of the names), [`KernelId::name`] (the name as written, which is the
/// kernel's `fn` name in the kernels crate), [`KernelId::ALL`] and [`KernelId::COUNT`]. A
/// kernel listed twice fails to compile (a repeated name or an unreachable pattern). A
/// `KernelId` the list lacks (an FP8 storage dtype, which no kernel reads, or a kernel
/// forgotten) has no index: `index` panics, which the host never reaches because every plan
/// rejects FP8 inputs first, and `host/tests/fp8_cpu.rs` checks that every storage dtype and
/// memory path of every family is in the list.
macro_rules! kernel_table {
    ($($name:ident = $variant:ident $(($($($arg:ident)::+),+))?,)+) => {
        /// One variant per kernel, in table order: its discriminant is the kernel's index.
        #[allow(non_camel_case_types)]
        enum Position {
            $($name,)+
        }

        impl KernelId {
            /// Number of kernel entry points.
            pub const COUNT: usize = [$(Position::$name),+].len();

            /// Every kernel, in index order.
            pub const ALL: [KernelId; Self::COUNT] =
                [$(KernelId::$variant $(($($($arg)::+),+))?),+];

            /// Dense index in `0..COUNT`.
            ///
            /// # Panics
            /// For a `KernelId` that is not in the table (see [`KernelId::exists`]).
            #[deny(unreachable_patterns)]
            pub const fn index(self) -> usize {
                match self {
                    $(KernelId::$variant $(($($($arg)::+),+))? => Position::$name as usize,)+
                    #[allow(unreachable_patterns)]
                    _ => panic!("no kernel entry for this KernelId"),
                }
            }

            /// Whether the table has an entry for this `KernelId`.
            pub const fn exists(self) -> bool {
                match self {
                    $(KernelId::$variant $(($($($arg)::+),+))? => true,)+
                    #[allow(unreachable_patterns)]
                    _ => false,
                }
            }

            /// The PTX `.entry` name.
            ///
            /// # Panics
            /// As [`KernelId::index`].
            pub const fn name(self) -> &'static str {
                match self {
                    $(KernelId::$variant $(($($($arg)::+),+))? => stringify!($name),)+
                    #[allow(unreachable_patterns)]
                    _ => panic!("no kernel entry for this KernelId"),
                }
            }
        }
    };
}

// The many-rows and streamed per-token entries' accesses per thread, as the table's arguments.
const C1: u32 = 1;
const C2: u32 = 2;
const C3: u32 = 3;
const C4: u32 = 4;
const C5: u32 = 5;
const C6: u32 = 6;
const C7: u32 = 7;
const C8: u32 = 8;

// A new kernel is one more line (anywhere: indices follow the list) and, for a new family, a
// `KernelId` variant.
kernel_table! {
    gated_fwd_f32_v16 = GatedFwd(F32, V16),
    gated_fwd_f32_scalar = GatedFwd(F32, Scalar),
    gated_fwd_f16_v16 = GatedFwd(F16, V16),
    gated_fwd_f16_scalar = GatedFwd(F16, Scalar),
    gated_fwd_bf16_v16 = GatedFwd(BF16, V16),
    gated_fwd_bf16_scalar = GatedFwd(BF16, Scalar),
    gated_fwd_f32_realigned = GatedFwdRealigned(F32),
    gated_fwd_f16_realigned = GatedFwdRealigned(F16),
    gated_fwd_bf16_realigned = GatedFwdRealigned(BF16),
    gated_fwd_f32_realigned_ends_first = GatedFwdRealignedEndsFirst(F32),
    gated_fwd_f16_realigned_ends_first = GatedFwdRealignedEndsFirst(F16),
    gated_fwd_bf16_realigned_ends_first = GatedFwdRealignedEndsFirst(BF16),
    gated_bwd_f32_v16 = GatedBwd(F32, V16),
    gated_bwd_f32_scalar = GatedBwd(F32, Scalar),
    gated_bwd_f16_v16 = GatedBwd(F16, V16),
    gated_bwd_f16_scalar = GatedBwd(F16, Scalar),
    gated_bwd_bf16_v16 = GatedBwd(BF16, V16),
    gated_bwd_bf16_scalar = GatedBwd(BF16, Scalar),
    gated_fwd_f32_v16_ends = GatedFwdEnds(F32),
    gated_fwd_f16_v16_ends = GatedFwdEnds(F16),
    gated_fwd_bf16_v16_ends = GatedFwdEnds(BF16),
    gated_bwd_f32_v16_ends = GatedBwdEnds(F32),
    gated_bwd_f16_v16_ends = GatedBwdEnds(F16),
    gated_bwd_bf16_v16_ends = GatedBwdEnds(BF16),
    gated_bwd_f32_realigned = GatedBwdRealigned(F32),
    gated_bwd_f16_realigned = GatedBwdRealigned(F16),
    gated_bwd_bf16_realigned = GatedBwdRealigned(BF16),
    rmsnorm_fwd_f32_v16_e16 = RmsNormFwd(F32, V16, Fwd::E16),
    rmsnorm_fwd_f32_v16_e32 = RmsNormFwd(F32, V16, Fwd::E32),
    rmsnorm_fwd_f32_v16_loop = RmsNormFwd(F32, V16, Fwd::Loop),
    rmsnorm_fwd_f32_scalar_e16 = RmsNormFwd(F32, Scalar, Fwd::E16),
    rmsnorm_fwd_f32_scalar_e32 = RmsNormFwd(F32, Scalar, Fwd::E32),
    rmsnorm_fwd_f32_scalar_loop = RmsNormFwd(F32, Scalar, Fwd::Loop),
    rmsnorm_fwd_f16_v16_e16 = RmsNormFwd(F16, V16, Fwd::E16),
    rmsnorm_fwd_f16_v16_e32 = RmsNormFwd(F16, V16, Fwd::E32),
    rmsnorm_fwd_f16_v16_loop = RmsNormFwd(F16, V16, Fwd::Loop),
    rmsnorm_fwd_f16_scalar_e16 = RmsNormFwd(F16, Scalar, Fwd::E16),
    rmsnorm_fwd_f16_scalar_e32 = RmsNormFwd(F16, Scalar, Fwd::E32),
    rmsnorm_fwd_f16_scalar_loop = RmsNormFwd(F16, Scalar, Fwd::Loop),
    rmsnorm_fwd_bf16_v16_e16 = RmsNormFwd(BF16, V16, Fwd::E16),
    rmsnorm_fwd_bf16_v16_e32 = RmsNormFwd(BF16, V16, Fwd::E32),
    rmsnorm_fwd_bf16_v16_loop = RmsNormFwd(BF16, V16, Fwd::Loop),
    rmsnorm_fwd_bf16_scalar_e16 = RmsNormFwd(BF16, Scalar, Fwd::E16),
    rmsnorm_fwd_bf16_scalar_e32 = RmsNormFwd(BF16, Scalar, Fwd::E32),
    rmsnorm_fwd_bf16_scalar_loop = RmsNormFwd(BF16, Scalar, Fwd::Loop),
    rmsnorm_bwd_f32_v16_e16 = RmsNormBwd(F32, V16, Bwd::E16),
    rmsnorm_bwd_f32_v16_loop = RmsNormBwd(F32, V16, Bwd::Loop),
    rmsnorm_bwd_f32_v16_e16_r96 = RmsNormBwdNarrow(F32, V16, BwdNarrow::R96),
    rmsnorm_bwd_f32_v16_e16_r80 = RmsNormBwdNarrow(F32, V16, BwdNarrow::R80),
    rmsnorm_bwd_f32_scalar_e16_r96 = RmsNormBwdNarrow(F32, Scalar, BwdNarrow::R96),
    rmsnorm_bwd_f32_scalar_e16_r80 = RmsNormBwdNarrow(F32, Scalar, BwdNarrow::R80),
    rmsnorm_bwd_f32_v16_e16_fused_r96 = RmsNormBwdFusedNarrow(F32, BwdNarrow::R96),
    rmsnorm_bwd_f32_v16_e16_fused_r80 = RmsNormBwdFusedNarrow(F32, BwdNarrow::R80),
    rmsnorm_bwd_f32_scalar_e16 = RmsNormBwd(F32, Scalar, Bwd::E16),
    rmsnorm_bwd_f32_scalar_loop = RmsNormBwd(F32, Scalar, Bwd::Loop),
    rmsnorm_bwd_f16_v16_e16 = RmsNormBwd(F16, V16, Bwd::E16),
    rmsnorm_bwd_f16_v16_loop = RmsNormBwd(F16, V16, Bwd::Loop),
    rmsnorm_bwd_f16_scalar_e16 = RmsNormBwd(F16, Scalar, Bwd::E16),
    rmsnorm_bwd_f16_scalar_loop = RmsNormBwd(F16, Scalar, Bwd::Loop),
    rmsnorm_bwd_bf16_v16_e16 = RmsNormBwd(BF16, V16, Bwd::E16),
    rmsnorm_bwd_bf16_v16_loop = RmsNormBwd(BF16, V16, Bwd::Loop),
    rmsnorm_bwd_bf16_scalar_e16 = RmsNormBwd(BF16, Scalar, Bwd::E16),
    rmsnorm_bwd_bf16_scalar_loop = RmsNormBwd(BF16, Scalar, Bwd::Loop),
    rmsnorm_bwd_f32_v16_cluster = RmsNormBwdCluster(F32, V16),
    rmsnorm_bwd_f32_scalar_cluster = RmsNormBwdCluster(F32, Scalar),
    rmsnorm_bwd_f16_v16_cluster = RmsNormBwdCluster(F16, V16),
    rmsnorm_bwd_f16_scalar_cluster = RmsNormBwdCluster(F16, Scalar),
    rmsnorm_bwd_bf16_v16_cluster = RmsNormBwdCluster(BF16, V16),
    rmsnorm_bwd_bf16_scalar_cluster = RmsNormBwdCluster(BF16, Scalar),
    rmsnorm_bwd_f32_v16_cluster_fused = RmsNormBwdClusterFused(F32, V16),
    rmsnorm_bwd_f32_scalar_cluster_fused = RmsNormBwdClusterFused(F32, Scalar),
    rmsnorm_bwd_f16_v16_cluster_fused = RmsNormBwdClusterFused(F16, V16),
    rmsnorm_bwd_f16_scalar_cluster_fused = RmsNormBwdClusterFused(F16, Scalar),
    rmsnorm_bwd_bf16_v16_cluster_fused = RmsNormBwdClusterFused(BF16, V16),
    rmsnorm_bwd_bf16_scalar_cluster_fused = RmsNormBwdClusterFused(BF16, Scalar),
    rmsnorm_bwd_f32_v16_loop_tiles = RmsNormBwdLoopTiles(F32, V16),
    rmsnorm_bwd_f32_scalar_loop_tiles = RmsNormBwdLoopTiles(F32, Scalar),
    rmsnorm_bwd_f16_v16_loop_tiles = RmsNormBwdLoopTiles(F16, V16),
    rmsnorm_bwd_f16_scalar_loop_tiles = RmsNormBwdLoopTiles(F16, Scalar),
    rmsnorm_bwd_bf16_v16_loop_tiles = RmsNormBwdLoopTiles(BF16, V16),
    rmsnorm_bwd_bf16_scalar_loop_tiles = RmsNormBwdLoopTiles(BF16, Scalar),
    rmsnorm_bwd_f16_v16_tile_sums = RmsNormBwdTileSums(F16, V16),
    rmsnorm_bwd_f16_scalar_tile_sums = RmsNormBwdTileSums(F16, Scalar),
    rmsnorm_bwd_bf16_v16_tile_sums = RmsNormBwdTileSums(BF16, V16),
    rmsnorm_bwd_bf16_scalar_tile_sums = RmsNormBwdTileSums(BF16, Scalar),
    rmsnorm_bwd_f16_v16_tile_dx = RmsNormBwdTileDx(F16, V16),
    rmsnorm_bwd_f16_scalar_tile_dx = RmsNormBwdTileDx(F16, Scalar),
    rmsnorm_bwd_bf16_v16_tile_dx = RmsNormBwdTileDx(BF16, V16),
    rmsnorm_bwd_bf16_scalar_tile_dx = RmsNormBwdTileDx(BF16, Scalar),
    rmsnorm_bwd_f32_v16_e16_fused = RmsNormBwdFused(F32, V16),
    rmsnorm_bwd_f32_scalar_e16_fused = RmsNormBwdFused(F32, Scalar),
    rmsnorm_bwd_f16_v16_e16_fused = RmsNormBwdFused(F16, V16),
    rmsnorm_bwd_f16_scalar_e16_fused = RmsNormBwdFused(F16, Scalar),
    rmsnorm_bwd_bf16_v16_e16_fused = RmsNormBwdFused(BF16, V16),
    rmsnorm_bwd_bf16_scalar_e16_fused = RmsNormBwdFused(BF16, Scalar),
    rmsnorm_dw_f32 = RmsNormDw(F32),
    rmsnorm_dw_f16 = RmsNormDw(F16),
    rmsnorm_dw_bf16 = RmsNormDw(BF16),
    rmsnorm_fwd_f32_v16_e16_wfirst = RmsNormFwdWFirst(F32),
    rmsnorm_fwd_f16_v16_e16_wfirst = RmsNormFwdWFirst(F16),
    rmsnorm_fwd_bf16_v16_e16_wfirst = RmsNormFwdWFirst(BF16),
    rmsnorm_fwd_f32_realigned_e16 = RmsNormFwdRealigned(F32, Fwd::E16),
    rmsnorm_fwd_f16_realigned_e16 = RmsNormFwdRealigned(F16, Fwd::E16),
    rmsnorm_fwd_f16_realigned_e32 = RmsNormFwdRealigned(F16, Fwd::E32),
    rmsnorm_fwd_bf16_realigned_e16 = RmsNormFwdRealigned(BF16, Fwd::E16),
    rmsnorm_fwd_bf16_realigned_e32 = RmsNormFwdRealigned(BF16, Fwd::E32),
    rmsnorm_fwd_f32_realigned_loop = RmsNormFwdRealigned(F32, Fwd::Loop),
    rmsnorm_fwd_f16_realigned_loop = RmsNormFwdRealigned(F16, Fwd::Loop),
    rmsnorm_fwd_bf16_realigned_loop = RmsNormFwdRealigned(BF16, Fwd::Loop),
    rmsnorm_fwd_f32_v16_split_e16 = RmsNormFwdSplit(F32, NormPath::V16, Fwd::E16),
    rmsnorm_fwd_f32_v16_split_e32 = RmsNormFwdSplit(F32, NormPath::V16, Fwd::E32),
    rmsnorm_fwd_f32_realigned_split_e16 = RmsNormFwdSplit(F32, NormPath::Realigned, Fwd::E16),
    rmsnorm_fwd_f32_scalar_split_e16 = RmsNormFwdSplit(F32, NormPath::Scalar, Fwd::E16),
    rmsnorm_fwd_f32_scalar_split_e32 = RmsNormFwdSplit(F32, NormPath::Scalar, Fwd::E32),
    rmsnorm_fwd_f16_v16_split_e16 = RmsNormFwdSplit(F16, NormPath::V16, Fwd::E16),
    rmsnorm_fwd_f16_v16_split_e32 = RmsNormFwdSplit(F16, NormPath::V16, Fwd::E32),
    rmsnorm_fwd_f16_realigned_split_e16 = RmsNormFwdSplit(F16, NormPath::Realigned, Fwd::E16),
    rmsnorm_fwd_f16_realigned_split_e32 = RmsNormFwdSplit(F16, NormPath::Realigned, Fwd::E32),
    rmsnorm_fwd_f16_scalar_split_e16 = RmsNormFwdSplit(F16, NormPath::Scalar, Fwd::E16),
    rmsnorm_fwd_f16_scalar_split_e32 = RmsNormFwdSplit(F16, NormPath::Scalar, Fwd::E32),
    rmsnorm_fwd_bf16_v16_split_e16 = RmsNormFwdSplit(BF16, NormPath::V16, Fwd::E16),
    rmsnorm_fwd_bf16_v16_split_e32 = RmsNormFwdSplit(BF16, NormPath::V16, Fwd::E32),
    rmsnorm_fwd_bf16_realigned_split_e16 = RmsNormFwdSplit(BF16, NormPath::Realigned, Fwd::E16),
    rmsnorm_fwd_bf16_realigned_split_e32 = RmsNormFwdSplit(BF16, NormPath::Realigned, Fwd::E32),
    rmsnorm_fwd_bf16_scalar_split_e16 = RmsNormFwdSplit(BF16, NormPath::Scalar, Fwd::E16),
    rmsnorm_fwd_bf16_scalar_split_e32 = RmsNormFwdSplit(BF16, NormPath::Scalar, Fwd::E32),
    rmsnorm_fwd_f32_v16_split_e16_r40 = RmsNormFwdSplitNarrow(F32, NormPath::V16),
    rmsnorm_fwd_f16_v16_split_e16_r40 = RmsNormFwdSplitNarrow(F16, NormPath::V16),
    rmsnorm_fwd_f16_realigned_split_e16_r40 = RmsNormFwdSplitNarrow(F16, NormPath::Realigned),
    rmsnorm_fwd_bf16_v16_split_e16_r40 = RmsNormFwdSplitNarrow(BF16, NormPath::V16),
    rmsnorm_fwd_bf16_realigned_split_e16_r40 = RmsNormFwdSplitNarrow(BF16, NormPath::Realigned),
    rmsnorm_fwd_f32_v16_loop_ahead = RmsNormFwdLoopAhead(F32, V16),
    rmsnorm_fwd_f32_scalar_loop_ahead = RmsNormFwdLoopAhead(F32, Scalar),
    rmsnorm_fwd_f16_v16_loop_ahead = RmsNormFwdLoopAhead(F16, V16),
    rmsnorm_fwd_f16_scalar_loop_ahead = RmsNormFwdLoopAhead(F16, Scalar),
    rmsnorm_fwd_bf16_v16_loop_ahead = RmsNormFwdLoopAhead(BF16, V16),
    rmsnorm_fwd_bf16_scalar_loop_ahead = RmsNormFwdLoopAhead(BF16, Scalar),
    zero_fill = ZeroFill,
    empty_kernel = Empty,
    gated_fp8_flat_f32_v16 = GatedFp8Flat(F32, V16),
    gated_fp8_flat_f32_scalar = GatedFp8Flat(F32, Scalar),
    gated_fp8_flat_f16_v16 = GatedFp8Flat(F16, V16),
    gated_fp8_flat_f16_scalar = GatedFp8Flat(F16, Scalar),
    gated_fp8_flat_bf16_v16 = GatedFp8Flat(BF16, V16),
    gated_fp8_flat_bf16_scalar = GatedFp8Flat(BF16, Scalar),
    gated_fp8_flat_f32_v16_ends = GatedFp8FlatEnds(F32),
    gated_fp8_flat_f16_v16_ends = GatedFp8FlatEnds(F16),
    gated_fp8_flat_bf16_v16_ends = GatedFp8FlatEnds(BF16),
    gated_fp8_row_f32_v16 = GatedFp8Row(F32, V16),
    gated_fp8_row_f32_scalar = GatedFp8Row(F32, Scalar),
    gated_fp8_row_f16_v16 = GatedFp8Row(F16, V16),
    gated_fp8_row_f16_scalar = GatedFp8Row(F16, Scalar),
    gated_fp8_row_bf16_v16 = GatedFp8Row(BF16, V16),
    gated_fp8_row_bf16_scalar = GatedFp8Row(BF16, Scalar),
    rmsnorm_fp8_static_f32_v16_e16 = RmsNormFp8(F32, V16, Fwd::E16, FP8_STATIC),
    rmsnorm_fp8_static_f32_v16_e32 = RmsNormFp8(F32, V16, Fwd::E32, FP8_STATIC),
    rmsnorm_fp8_static_f32_scalar_e16 = RmsNormFp8(F32, Scalar, Fwd::E16, FP8_STATIC),
    rmsnorm_fp8_static_f32_scalar_e32 = RmsNormFp8(F32, Scalar, Fwd::E32, FP8_STATIC),
    rmsnorm_fp8_static_f16_v16_e16 = RmsNormFp8(F16, V16, Fwd::E16, FP8_STATIC),
    rmsnorm_fp8_static_f16_v16_e32 = RmsNormFp8(F16, V16, Fwd::E32, FP8_STATIC),
    rmsnorm_fp8_static_f16_scalar_e16 = RmsNormFp8(F16, Scalar, Fwd::E16, FP8_STATIC),
    rmsnorm_fp8_static_f16_scalar_e32 = RmsNormFp8(F16, Scalar, Fwd::E32, FP8_STATIC),
    rmsnorm_fp8_static_bf16_v16_e16 = RmsNormFp8(BF16, V16, Fwd::E16, FP8_STATIC),
    rmsnorm_fp8_static_bf16_v16_e32 = RmsNormFp8(BF16, V16, Fwd::E32, FP8_STATIC),
    rmsnorm_fp8_static_bf16_scalar_e16 = RmsNormFp8(BF16, Scalar, Fwd::E16, FP8_STATIC),
    rmsnorm_fp8_static_bf16_scalar_e32 = RmsNormFp8(BF16, Scalar, Fwd::E32, FP8_STATIC),
    rmsnorm_fp8_token_f32_v16_e16 = RmsNormFp8(F32, V16, Fwd::E16, FP8_PER_TOKEN),
    rmsnorm_fp8_token_f32_v16_e32 = RmsNormFp8(F32, V16, Fwd::E32, FP8_PER_TOKEN),
    rmsnorm_fp8_token_f32_scalar_e16 = RmsNormFp8(F32, Scalar, Fwd::E16, FP8_PER_TOKEN),
    rmsnorm_fp8_token_f32_scalar_e32 = RmsNormFp8(F32, Scalar, Fwd::E32, FP8_PER_TOKEN),
    rmsnorm_fp8_token_f16_v16_e16 = RmsNormFp8(F16, V16, Fwd::E16, FP8_PER_TOKEN),
    rmsnorm_fp8_token_f16_v16_e32 = RmsNormFp8(F16, V16, Fwd::E32, FP8_PER_TOKEN),
    rmsnorm_fp8_token_f16_scalar_e16 = RmsNormFp8(F16, Scalar, Fwd::E16, FP8_PER_TOKEN),
    rmsnorm_fp8_token_f16_scalar_e32 = RmsNormFp8(F16, Scalar, Fwd::E32, FP8_PER_TOKEN),
    rmsnorm_fp8_token_bf16_v16_e16 = RmsNormFp8(BF16, V16, Fwd::E16, FP8_PER_TOKEN),
    rmsnorm_fp8_token_bf16_v16_e32 = RmsNormFp8(BF16, V16, Fwd::E32, FP8_PER_TOKEN),
    rmsnorm_fp8_token_bf16_scalar_e16 = RmsNormFp8(BF16, Scalar, Fwd::E16, FP8_PER_TOKEN),
    rmsnorm_fp8_token_bf16_scalar_e32 = RmsNormFp8(BF16, Scalar, Fwd::E32, FP8_PER_TOKEN),
    rmsnorm_fp8_group_f32_v16_e16 = RmsNormFp8(F32, V16, Fwd::E16, FP8_PER_GROUP),
    rmsnorm_fp8_group_f32_v16_e32 = RmsNormFp8(F32, V16, Fwd::E32, FP8_PER_GROUP),
    rmsnorm_fp8_group_f32_scalar_e16 = RmsNormFp8(F32, Scalar, Fwd::E16, FP8_PER_GROUP),
    rmsnorm_fp8_group_f32_scalar_e32 = RmsNormFp8(F32, Scalar, Fwd::E32, FP8_PER_GROUP),
    rmsnorm_fp8_group_f16_v16_e16 = RmsNormFp8(F16, V16, Fwd::E16, FP8_PER_GROUP),
    rmsnorm_fp8_group_f16_v16_e32 = RmsNormFp8(F16, V16, Fwd::E32, FP8_PER_GROUP),
    rmsnorm_fp8_group_f16_scalar_e16 = RmsNormFp8(F16, Scalar, Fwd::E16, FP8_PER_GROUP),
    rmsnorm_fp8_group_f16_scalar_e32 = RmsNormFp8(F16, Scalar, Fwd::E32, FP8_PER_GROUP),
    rmsnorm_fp8_group_bf16_v16_e16 = RmsNormFp8(BF16, V16, Fwd::E16, FP8_PER_GROUP),
    rmsnorm_fp8_group_bf16_v16_e32 = RmsNormFp8(BF16, V16, Fwd::E32, FP8_PER_GROUP),
    rmsnorm_fp8_group_bf16_scalar_e16 = RmsNormFp8(BF16, Scalar, Fwd::E16, FP8_PER_GROUP),
    rmsnorm_fp8_group_bf16_scalar_e32 = RmsNormFp8(BF16, Scalar, Fwd::E32, FP8_PER_GROUP),
    rmsnorm_fp8_static_f32_v16_loop = RmsNormFp8(F32, V16, Fwd::Loop, FP8_STATIC),
    rmsnorm_fp8_static_f32_scalar_loop = RmsNormFp8(F32, Scalar, Fwd::Loop, FP8_STATIC),
    rmsnorm_fp8_static_f16_v16_loop = RmsNormFp8(F16, V16, Fwd::Loop, FP8_STATIC),
    rmsnorm_fp8_static_f16_scalar_loop = RmsNormFp8(F16, Scalar, Fwd::Loop, FP8_STATIC),
    rmsnorm_fp8_static_bf16_v16_loop = RmsNormFp8(BF16, V16, Fwd::Loop, FP8_STATIC),
    rmsnorm_fp8_static_bf16_scalar_loop = RmsNormFp8(BF16, Scalar, Fwd::Loop, FP8_STATIC),
    rmsnorm_fp8_token_f32_v16_loop = RmsNormFp8(F32, V16, Fwd::Loop, FP8_PER_TOKEN),
    rmsnorm_fp8_token_f32_scalar_loop = RmsNormFp8(F32, Scalar, Fwd::Loop, FP8_PER_TOKEN),
    rmsnorm_fp8_token_f16_v16_loop = RmsNormFp8(F16, V16, Fwd::Loop, FP8_PER_TOKEN),
    rmsnorm_fp8_token_f16_scalar_loop = RmsNormFp8(F16, Scalar, Fwd::Loop, FP8_PER_TOKEN),
    rmsnorm_fp8_token_bf16_v16_loop = RmsNormFp8(BF16, V16, Fwd::Loop, FP8_PER_TOKEN),
    rmsnorm_fp8_token_bf16_scalar_loop = RmsNormFp8(BF16, Scalar, Fwd::Loop, FP8_PER_TOKEN),
    rmsnorm_fp8_group_f32_v16_loop = RmsNormFp8(F32, V16, Fwd::Loop, FP8_PER_GROUP),
    rmsnorm_fp8_group_f32_scalar_loop = RmsNormFp8(F32, Scalar, Fwd::Loop, FP8_PER_GROUP),
    rmsnorm_fp8_group_f16_v16_loop = RmsNormFp8(F16, V16, Fwd::Loop, FP8_PER_GROUP),
    rmsnorm_fp8_group_f16_scalar_loop = RmsNormFp8(F16, Scalar, Fwd::Loop, FP8_PER_GROUP),
    rmsnorm_fp8_group_bf16_v16_loop = RmsNormFp8(BF16, V16, Fwd::Loop, FP8_PER_GROUP),
    rmsnorm_fp8_group_bf16_scalar_loop = RmsNormFp8(BF16, Scalar, Fwd::Loop, FP8_PER_GROUP),
    rmsnorm_fp8_static_f16_realigned_e16 = RmsNormFp8Realigned(F16, Fwd::E16, FP8_STATIC),
    rmsnorm_fp8_static_f16_realigned_e32 = RmsNormFp8Realigned(F16, Fwd::E32, FP8_STATIC),
    rmsnorm_fp8_static_bf16_realigned_e16 = RmsNormFp8Realigned(BF16, Fwd::E16, FP8_STATIC),
    rmsnorm_fp8_static_bf16_realigned_e32 = RmsNormFp8Realigned(BF16, Fwd::E32, FP8_STATIC),
    rmsnorm_fp8_token_f16_realigned_e16 = RmsNormFp8Realigned(F16, Fwd::E16, FP8_PER_TOKEN),
    rmsnorm_fp8_token_f16_realigned_e32 = RmsNormFp8Realigned(F16, Fwd::E32, FP8_PER_TOKEN),
    rmsnorm_fp8_token_bf16_realigned_e16 = RmsNormFp8Realigned(BF16, Fwd::E16, FP8_PER_TOKEN),
    rmsnorm_fp8_token_bf16_realigned_e32 = RmsNormFp8Realigned(BF16, Fwd::E32, FP8_PER_TOKEN),
    rmsnorm_fp8_group_f16_realigned_e16 = RmsNormFp8Realigned(F16, Fwd::E16, FP8_PER_GROUP),
    rmsnorm_fp8_group_f16_realigned_e32 = RmsNormFp8Realigned(F16, Fwd::E32, FP8_PER_GROUP),
    rmsnorm_fp8_group_bf16_realigned_e16 = RmsNormFp8Realigned(BF16, Fwd::E16, FP8_PER_GROUP),
    rmsnorm_fp8_group_bf16_realigned_e32 = RmsNormFp8Realigned(BF16, Fwd::E32, FP8_PER_GROUP),
    rmsnorm_fwd_f32_v16_stream = RmsNormFwdStream(F32),
    rmsnorm_fwd_f16_v16_stream = RmsNormFwdStream(F16),
    rmsnorm_fwd_bf16_v16_stream = RmsNormFwdStream(BF16),
    rmsnorm_fp8_static_f32_v16_stream = RmsNormFp8Stream(F32, FP8_STATIC),
    rmsnorm_fp8_static_f16_v16_stream = RmsNormFp8Stream(F16, FP8_STATIC),
    rmsnorm_fp8_static_bf16_v16_stream = RmsNormFp8Stream(BF16, FP8_STATIC),
    rmsnorm_fp8_token_f32_v16_stream = RmsNormFp8Stream(F32, FP8_PER_TOKEN),
    rmsnorm_fp8_token_f16_v16_stream = RmsNormFp8Stream(F16, FP8_PER_TOKEN),
    rmsnorm_fp8_token_bf16_v16_stream = RmsNormFp8Stream(BF16, FP8_PER_TOKEN),
    rmsnorm_fp8_group_f32_v16_stream = RmsNormFp8Stream(F32, FP8_PER_GROUP),
    rmsnorm_fp8_group_f16_v16_stream = RmsNormFp8Stream(F16, FP8_PER_GROUP),
    rmsnorm_fp8_group_bf16_v16_stream = RmsNormFp8Stream(BF16, FP8_PER_GROUP),
    rmsnorm_fp8_static_f32_v16_split = RmsNormFp8Split(F32, NormPath::V16, FP8_STATIC),
    rmsnorm_fp8_static_f32_scalar_split = RmsNormFp8Split(F32, NormPath::Scalar, FP8_STATIC),
    rmsnorm_fp8_static_f16_v16_split = RmsNormFp8Split(F16, NormPath::V16, FP8_STATIC),
    rmsnorm_fp8_static_f16_scalar_split = RmsNormFp8Split(F16, NormPath::Scalar, FP8_STATIC),
    rmsnorm_fp8_static_bf16_v16_split = RmsNormFp8Split(BF16, NormPath::V16, FP8_STATIC),
    rmsnorm_fp8_static_bf16_scalar_split = RmsNormFp8Split(BF16, NormPath::Scalar, FP8_STATIC),
    rmsnorm_fp8_token_f32_v16_split = RmsNormFp8Split(F32, NormPath::V16, FP8_PER_TOKEN),
    rmsnorm_fp8_token_f32_scalar_split = RmsNormFp8Split(F32, NormPath::Scalar, FP8_PER_TOKEN),
    rmsnorm_fp8_token_f16_v16_split = RmsNormFp8Split(F16, NormPath::V16, FP8_PER_TOKEN),
    rmsnorm_fp8_token_f16_scalar_split = RmsNormFp8Split(F16, NormPath::Scalar, FP8_PER_TOKEN),
    rmsnorm_fp8_token_bf16_v16_split = RmsNormFp8Split(BF16, NormPath::V16, FP8_PER_TOKEN),
    rmsnorm_fp8_token_bf16_scalar_split = RmsNormFp8Split(BF16, NormPath::Scalar, FP8_PER_TOKEN),
    rmsnorm_fp8_group_f32_v16_split = RmsNormFp8Split(F32, NormPath::V16, FP8_PER_GROUP),
    rmsnorm_fp8_group_f32_scalar_split = RmsNormFp8Split(F32, NormPath::Scalar, FP8_PER_GROUP),
    rmsnorm_fp8_group_f16_v16_split = RmsNormFp8Split(F16, NormPath::V16, FP8_PER_GROUP),
    rmsnorm_fp8_group_f16_scalar_split = RmsNormFp8Split(F16, NormPath::Scalar, FP8_PER_GROUP),
    rmsnorm_fp8_group_bf16_v16_split = RmsNormFp8Split(BF16, NormPath::V16, FP8_PER_GROUP),
    rmsnorm_fp8_group_bf16_scalar_split = RmsNormFp8Split(BF16, NormPath::Scalar, FP8_PER_GROUP),
    rmsnorm_fp8_static_f16_realigned_split =
        RmsNormFp8Split(F16, NormPath::Realigned, FP8_STATIC),
    rmsnorm_fp8_static_bf16_realigned_split =
        RmsNormFp8Split(BF16, NormPath::Realigned, FP8_STATIC),
    rmsnorm_fp8_token_f16_realigned_split =
        RmsNormFp8Split(F16, NormPath::Realigned, FP8_PER_TOKEN),
    rmsnorm_fp8_token_bf16_realigned_split =
        RmsNormFp8Split(BF16, NormPath::Realigned, FP8_PER_TOKEN),
    rmsnorm_fp8_group_f16_realigned_split =
        RmsNormFp8Split(F16, NormPath::Realigned, FP8_PER_GROUP),
    rmsnorm_fp8_group_bf16_realigned_split =
        RmsNormFp8Split(BF16, NormPath::Realigned, FP8_PER_GROUP),
    rmsnorm_fp8_static_f32_v16_loop_ahead = RmsNormFp8LoopAhead(F32, V16, FP8_STATIC),
    rmsnorm_fp8_static_f32_scalar_loop_ahead = RmsNormFp8LoopAhead(F32, Scalar, FP8_STATIC),
    rmsnorm_fp8_static_f16_v16_loop_ahead = RmsNormFp8LoopAhead(F16, V16, FP8_STATIC),
    rmsnorm_fp8_static_f16_scalar_loop_ahead = RmsNormFp8LoopAhead(F16, Scalar, FP8_STATIC),
    rmsnorm_fp8_static_bf16_v16_loop_ahead = RmsNormFp8LoopAhead(BF16, V16, FP8_STATIC),
    rmsnorm_fp8_static_bf16_scalar_loop_ahead = RmsNormFp8LoopAhead(BF16, Scalar, FP8_STATIC),
    rmsnorm_fp8_token_f32_v16_loop_ahead = RmsNormFp8LoopAhead(F32, V16, FP8_PER_TOKEN),
    rmsnorm_fp8_token_f32_scalar_loop_ahead = RmsNormFp8LoopAhead(F32, Scalar, FP8_PER_TOKEN),
    rmsnorm_fp8_token_f16_v16_loop_ahead = RmsNormFp8LoopAhead(F16, V16, FP8_PER_TOKEN),
    rmsnorm_fp8_token_f16_scalar_loop_ahead = RmsNormFp8LoopAhead(F16, Scalar, FP8_PER_TOKEN),
    rmsnorm_fp8_token_bf16_v16_loop_ahead = RmsNormFp8LoopAhead(BF16, V16, FP8_PER_TOKEN),
    rmsnorm_fp8_token_bf16_scalar_loop_ahead = RmsNormFp8LoopAhead(BF16, Scalar, FP8_PER_TOKEN),
    rmsnorm_fp8_group_f32_v16_loop_ahead = RmsNormFp8LoopAhead(F32, V16, FP8_PER_GROUP),
    rmsnorm_fp8_group_f32_scalar_loop_ahead = RmsNormFp8LoopAhead(F32, Scalar, FP8_PER_GROUP),
    rmsnorm_fp8_group_f16_v16_loop_ahead = RmsNormFp8LoopAhead(F16, V16, FP8_PER_GROUP),
    rmsnorm_fp8_group_f16_scalar_loop_ahead = RmsNormFp8LoopAhead(F16, Scalar, FP8_PER_GROUP),
    rmsnorm_fp8_group_bf16_v16_loop_ahead = RmsNormFp8LoopAhead(BF16, V16, FP8_PER_GROUP),
    rmsnorm_fp8_group_bf16_scalar_loop_ahead = RmsNormFp8LoopAhead(BF16, Scalar, FP8_PER_GROUP),
    gated_fp8_group_f32_v16 = GatedFp8Group(F32, V16),
    gated_fp8_group_f32_scalar = GatedFp8Group(F32, Scalar),
    gated_fp8_group_f16_v16 = GatedFp8Group(F16, V16),
    gated_fp8_group_f16_scalar = GatedFp8Group(F16, Scalar),
    gated_fp8_group_bf16_v16 = GatedFp8Group(BF16, V16),
    gated_fp8_group_bf16_scalar = GatedFp8Group(BF16, Scalar),
    gated_fp8_row_long_f32_v16 = GatedFp8RowLong(F32, V16),
    gated_fp8_row_long_f32_scalar = GatedFp8RowLong(F32, Scalar),
    gated_fp8_row_long_f16_v16 = GatedFp8RowLong(F16, V16),
    gated_fp8_row_long_f16_scalar = GatedFp8RowLong(F16, Scalar),
    gated_fp8_row_long_bf16_v16 = GatedFp8RowLong(BF16, V16),
    gated_fp8_row_long_bf16_scalar = GatedFp8RowLong(BF16, Scalar),
    gated_fp8_row_split_f32_v16 = GatedFp8RowSplit(F32, V16),
    gated_fp8_row_split_f32_scalar = GatedFp8RowSplit(F32, Scalar),
    gated_fp8_row_split_f16_v16 = GatedFp8RowSplit(F16, V16),
    gated_fp8_row_split_f16_scalar = GatedFp8RowSplit(F16, Scalar),
    gated_fp8_row_split_bf16_v16 = GatedFp8RowSplit(BF16, V16),
    gated_fp8_row_split_bf16_scalar = GatedFp8RowSplit(BF16, Scalar),
    gated_fp8_row_stream_f32_c3 = GatedFp8RowStream(F32, C3),
    gated_fp8_row_stream_f32_c4 = GatedFp8RowStream(F32, C4),
    gated_fp8_row_stream_f32_c5 = GatedFp8RowStream(F32, C5),
    gated_fp8_row_stream_f32_c6 = GatedFp8RowStream(F32, C6),
    gated_fp8_row_stream_f32_c7 = GatedFp8RowStream(F32, C7),
    gated_fp8_row_stream_f32_c8 = GatedFp8RowStream(F32, C8),
    gated_fp8_row_stream_f16_c3 = GatedFp8RowStream(F16, C3),
    gated_fp8_row_stream_f16_c4 = GatedFp8RowStream(F16, C4),
    gated_fp8_row_stream_f16_c5 = GatedFp8RowStream(F16, C5),
    gated_fp8_row_stream_f16_c6 = GatedFp8RowStream(F16, C6),
    gated_fp8_row_stream_f16_c7 = GatedFp8RowStream(F16, C7),
    gated_fp8_row_stream_f16_c8 = GatedFp8RowStream(F16, C8),
    gated_fp8_row_stream_bf16_c3 = GatedFp8RowStream(BF16, C3),
    gated_fp8_row_stream_bf16_c4 = GatedFp8RowStream(BF16, C4),
    gated_fp8_row_stream_bf16_c5 = GatedFp8RowStream(BF16, C5),
    gated_fp8_row_stream_bf16_c6 = GatedFp8RowStream(BF16, C6),
    gated_fp8_row_stream_bf16_c7 = GatedFp8RowStream(BF16, C7),
    gated_fp8_row_stream_bf16_c8 = GatedFp8RowStream(BF16, C8),
    gated_fp8_rows_f32_c1 = GatedFp8Rows(F32, C1),
    gated_fp8_rows_f32_c2 = GatedFp8Rows(F32, C2),
    gated_fp8_rows_f16_c1 = GatedFp8Rows(F16, C1),
    gated_fp8_rows_f16_c2 = GatedFp8Rows(F16, C2),
    gated_fp8_rows_bf16_c1 = GatedFp8Rows(BF16, C1),
    gated_fp8_rows_bf16_c2 = GatedFp8Rows(BF16, C2),
    gated_fp8_row_realigned_f16 = GatedFp8RowRealigned(F16),
    gated_fp8_row_realigned_bf16 = GatedFp8RowRealigned(BF16),
    gated_fp8_rows_realigned_f16 = GatedFp8RowsRealigned(F16),
    gated_fp8_rows_realigned_bf16 = GatedFp8RowsRealigned(BF16),
    gated_fp8_flat_realigned_f16 = GatedFp8FlatRealigned(F16),
    gated_fp8_flat_realigned_bf16 = GatedFp8FlatRealigned(BF16),
    gated_fp8_flat_realigned_ends_first_f16 = GatedFp8FlatRealignedEndsFirst(F16),
    gated_fp8_flat_realigned_ends_first_bf16 = GatedFp8FlatRealignedEndsFirst(BF16),
}

impl KernelId {
    /// Whether the entry executes `griddepcontrol.wait` before its first global access on sm_90
    /// builds, so the host may launch it with programmatic dependent launch. A kernel that
    /// does not must never be launched that way: it could read its inputs before the previous
    /// kernel wrote them.
    pub const fn syncs_grid_dependency(self) -> bool {
        matches!(
            self,
            KernelId::GatedFwd(..)
                | KernelId::GatedFwdEnds(..)
                | KernelId::GatedBwdEnds(..)
                | KernelId::GatedFp8FlatEnds(..)
                | KernelId::GatedFwdRealigned(..)
                | KernelId::GatedFwdRealignedEndsFirst(..)
                | KernelId::GatedBwd(..)
                | KernelId::GatedBwdRealigned(..)
                | KernelId::GatedFp8Flat(..)
                | KernelId::GatedFp8Group(..)
                | KernelId::GatedFp8Row(..)
                | KernelId::GatedFp8RowRealigned(..)
                | KernelId::GatedFp8RowsRealigned(..)
                | KernelId::GatedFp8FlatRealigned(..)
                | KernelId::GatedFp8FlatRealignedEndsFirst(..)
                | KernelId::GatedFp8RowLong(..)
                | KernelId::GatedFp8RowSplit(..)
                | KernelId::GatedFp8RowStream(..)
                | KernelId::GatedFp8Rows(..)
                | KernelId::RmsNormFp8(..)
                | KernelId::RmsNormFp8Realigned(..)
                | KernelId::RmsNormFp8Stream(..)
                | KernelId::RmsNormFp8Split(..)
                | KernelId::RmsNormFp8LoopAhead(..)
                | KernelId::RmsNormFwd(..)
                | KernelId::RmsNormFwdStream(..)
                | KernelId::RmsNormFwdRealigned(..)
                | KernelId::RmsNormFwdWFirst(..)
                | KernelId::RmsNormFwdSplit(..)
                | KernelId::RmsNormFwdSplitNarrow(..)
                | KernelId::RmsNormFwdLoopAhead(..)
                | KernelId::RmsNormBwd(..)
                | KernelId::RmsNormBwdCluster(..)
                | KernelId::RmsNormBwdClusterFused(..)
                | KernelId::RmsNormBwdLoopTiles(..)
                | KernelId::RmsNormBwdTileSums(..)
                | KernelId::RmsNormBwdTileDx(..)
                | KernelId::RmsNormBwdNarrow(..)
                | KernelId::RmsNormBwdFused(..)
                | KernelId::RmsNormBwdFusedNarrow(..)
                | KernelId::RmsNormDw(..)
        )
    }

    /// Most threads per block the host ever launches this kernel with. A block needs
    /// `registers x threads` of the SM's 65536 registers or the launch fails
    /// (`CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES`); `cargo xtask ptx` checks every kernel against it.
    pub const fn max_block_threads(self) -> u32 {
        match self {
            KernelId::GatedFwd(..)
            | KernelId::GatedFwdEnds(..)
            | KernelId::GatedBwdEnds(..)
            | KernelId::GatedFp8FlatEnds(..)
            | KernelId::GatedFwdRealigned(..)
            | KernelId::GatedFwdRealignedEndsFirst(..)
            | KernelId::GatedBwd(..)
            | KernelId::GatedBwdRealigned(..)
            | KernelId::GatedFp8Flat(..)
            | KernelId::GatedFp8FlatRealigned(..)
            | KernelId::GatedFp8FlatRealignedEndsFirst(..)
            | KernelId::GatedFp8Group(..) => GATED_THREADS,
            KernelId::GatedFp8Row(..)
            | KernelId::GatedFp8RowRealigned(..)
            | KernelId::GatedFp8RowsRealigned(..)
            | KernelId::GatedFp8RowLong(..)
            | KernelId::GatedFp8RowSplit(..)
            | KernelId::GatedFp8RowStream(..)
            | KernelId::GatedFp8Rows(..) => GATED_FP8_ROW_MAX_THREADS,
            KernelId::RmsNormFwd(..)
            | KernelId::RmsNormFwdRealigned(..)
            | KernelId::RmsNormFwdWFirst(..)
            | KernelId::RmsNormFwdSplit(..)
            | KernelId::RmsNormFwdSplitNarrow(..)
            | KernelId::RmsNormFwdLoopAhead(..)
            | KernelId::RmsNormFwdStream(..)
            | KernelId::RmsNormFp8(..)
            | KernelId::RmsNormFp8Realigned(..)
            | KernelId::RmsNormFp8Stream(..)
            | KernelId::RmsNormFp8Split(..)
            | KernelId::RmsNormFp8LoopAhead(..) => RMSNORM_MAX_THREADS_PER_ROW,
            KernelId::RmsNormBwd(d, _, NormBwdVariant::E16) | KernelId::RmsNormBwdFused(d, _) => {
                rmsnorm_bwd_max_threads_per_row(d)
            }
            KernelId::RmsNormBwd(_, _, NormBwdVariant::Loop)
            | KernelId::RmsNormBwdLoopTiles(..) => RMSNORM_BWD_LOOP_THREADS,
            KernelId::RmsNormBwdCluster(..)
            | KernelId::RmsNormBwdClusterFused(..)
            | KernelId::RmsNormBwdTileSums(..)
            | KernelId::RmsNormBwdTileDx(..) => RMSNORM_BWD_MAX_THREADS_PER_ROW,
            KernelId::RmsNormBwdNarrow(_, _, budget)
            | KernelId::RmsNormBwdFusedNarrow(_, budget) => budget.max_threads(),
            KernelId::RmsNormDw(..) => RMSNORM_DW_THREADS,
            KernelId::ZeroFill => ZERO_FILL_THREADS,
            KernelId::Empty => 32,
        }
    }

    /// PTX launch bounds `(.maxntid, .minnctapersm)` that `cargo xtask ptx` writes into the
    /// entry, for kernels whose register count ptxas must hold down: without them it spends
    /// registers on instruction-level parallelism (the per-token FP8 kernel took 255 and
    /// spilled; the flat one 47-55, below full occupancy). `None`: no directive (the kernels
    /// that fit without one, whose PTX stays as it was). A `.minnctapersm` of 0 is not
    /// written.
    pub const fn launch_bounds(self) -> Option<(u32, u32)> {
        match self {
            // The rows kernel's registers: its rows run the same body.
            KernelId::RmsNormBwdFused(d, mode) => {
                KernelId::RmsNormBwd(d, mode, NormBwdVariant::E16).launch_bounds()
            }
            // 8 blocks of 128 threads per SM (64 registers): two accesses per thread in
            // flight (at 12 or 16 blocks, 40 or 32 registers, ptxas spilled even one).
            KernelId::GatedFp8Flat(..)
            | KernelId::GatedFp8FlatEnds(..)
            | KernelId::GatedFp8FlatRealigned(..)
            | KernelId::GatedFp8FlatRealignedEndsFirst(..)
            | KernelId::GatedFp8Group(..) => Some((GATED_THREADS, 8)),
            // Element accesses (a register per input each): as many rows of 512 threads per SM
            // as fit without spills, so that rows' loads stay in flight while others reduce or
            // store: four for bf16 (32 registers), three for f32 and the f16 long-row entry
            // (40; f16 spilled at 32, and its row entry takes 40 within the bound below).
            KernelId::GatedFp8Row(BF16, VecMode::Scalar)
            | KernelId::GatedFp8RowLong(BF16, VecMode::Scalar) => {
                Some((GATED_FP8_ROW_MAX_THREADS, 4))
            }
            KernelId::GatedFp8Row(F32, VecMode::Scalar)
            | KernelId::GatedFp8RowLong(_, VecMode::Scalar) => Some((GATED_FP8_ROW_MAX_THREADS, 3)),
            // Two rows (or tiles of rows) of 512 threads per SM (64 registers): a row's loads
            // in flight while the other row reduces or stores.
            KernelId::GatedFp8Row(..) | KernelId::GatedFp8RowSplit(..) => {
                Some((GATED_FP8_ROW_MAX_THREADS, 2))
            }
            // One access per thread: four blocks of up to 512 threads per SM (32 registers),
            // the whole SM's threads on rows; two: three (40; at 32 they spilled on sm_90).
            KernelId::GatedFp8Rows(_, 1) => Some((GATED_FP8_ROW_MAX_THREADS, 4)),
            KernelId::GatedFp8Rows(..) => Some((GATED_FP8_ROW_MAX_THREADS, 3)),
            // Every access's two aligned vectors of each input in flight at once: four accesses
            // per thread spilled 150-240 bytes at two rows per SM, so one row per SM (128
            // registers).
            KernelId::GatedFp8RowRealigned(..) => Some((GATED_FP8_ROW_MAX_THREADS, 1)),
            // A word's two aligned vectors of each input in flight, and its element loads
            // where it leaves the row: two words per thread at 64 registers (one word spilled
            // 144 bytes at 40).
            KernelId::GatedFp8RowsRealigned(..) => Some((GATED_FP8_ROW_MAX_THREADS, 2)),
            // One row of 512 threads per SM (128 registers): eight accesses per thread, a row
            // of up to 4096 accesses held whole.
            KernelId::GatedFp8RowLong(..) | KernelId::GatedFp8RowStream(..) => {
                Some((GATED_FP8_ROW_MAX_THREADS, 1))
            }
            // Two 512-thread rows per SM (64 registers): the rows are staged in shared memory,
            // so registers, not bytes in flight, set the rows per SM (an uncapped build took
            // 88 at 32 per thread, one row of 352-512 threads per SM: 1.4x slower).
            KernelId::RmsNormFwdRealigned(..) => Some((RMSNORM_MAX_THREADS_PER_ROW, 2)),
            // The scalar path holds every element load of the thread in flight: at 32 per
            // thread, one 512-thread row per SM (128 registers).
            KernelId::RmsNormFwd(_, VecMode::Scalar, NormFwdVariant::E32) => {
                Some((RMSNORM_MAX_THREADS_PER_ROW, 1))
            }
            // Two 512-thread rows per SM (64 registers) on the 16-per-thread vector path,
            // which holds the weight through the reduction.
            KernelId::RmsNormFp8(_, VecMode::V16, NormFwdVariant::E16, _) => {
                Some((RMSNORM_MAX_THREADS_PER_ROW, 2))
            }
            // One row of up to 512 threads per SM (128 registers), the next row streamed into
            // shared memory meanwhile.
            KernelId::RmsNormFwdStream(..) | KernelId::RmsNormFp8Stream(..) => {
                Some((RMSNORM_MAX_THREADS_PER_ROW, 1))
            }
            // The rows are staged in shared memory, and the registers hold a thread's chunks
            // (`h`, then `y`) from the reduction to the stores: 16 per thread of a 16-bit row
            // fit two 512-thread rows per SM (64 registers); 32 per thread spilled there (up to
            // 528 bytes), so the register budget of one row per SM.
            KernelId::RmsNormFp8Realigned(DType::BF16 | DType::F16, NormFwdVariant::E16, _) => {
                Some((RMSNORM_MAX_THREADS_PER_ROW, 2))
            }
            KernelId::RmsNormFp8Realigned(..) => Some((RMSNORM_MAX_THREADS_PER_ROW, 1)),
            // Looped rows: two 512-thread rows per SM (64 registers), as the looped
            // storage-dtype forward runs, a tile of each in flight; f32 rows on the scalar
            // path spilled there (up to 28 bytes), so one row per SM.
            KernelId::RmsNormFp8(DType::F32, VecMode::Scalar, NormFwdVariant::Loop, _) => {
                Some((RMSNORM_MAX_THREADS_PER_ROW, 1))
            }
            KernelId::RmsNormFp8(_, _, NormFwdVariant::Loop, _) => {
                Some((RMSNORM_MAX_THREADS_PER_ROW, 2))
            }
            // Its largest block, one per SM at least: the register budget of 512 threads (with
            // `.maxntid` alone ptxas held the 16-bit scalar ones to 64 registers, spilling).
            KernelId::RmsNormFp8(..) => Some((RMSNORM_MAX_THREADS_PER_ROW, 1)),
            // The staged backward: 16-bit rows two 512-thread rows per SM (64 registers), one
            // row's reduction and stores while the other's copies land; f32 rows one (128
            // registers: at 64 they spilled 400 bytes), which leaves two 256-thread blocks per
            // SM for rows up to 4096 (the narrow entry takes the block sizes where fewer
            // registers fit more blocks).
            KernelId::RmsNormBwd(d, VecMode::V16, NormBwdVariant::E16) => Some((
                RMSNORM_BWD_MAX_THREADS_PER_ROW,
                rmsnorm_bwd_vector_min_blocks(d),
            )),
            // A cluster's blocks are the staged kernel's 512-thread blocks.
            KernelId::RmsNormBwdCluster(d, mode) | KernelId::RmsNormBwdClusterFused(d, mode) => {
                KernelId::RmsNormBwd(d, mode, NormBwdVariant::E16).launch_bounds()
            }
            // The tile sums hold a tile's `h` and `dy` and the weight (64 registers, two
            // blocks per SM); the `dx` pass also its partials and `dres` (one block, 128).
            KernelId::RmsNormBwdTileSums(..) => Some((RMSNORM_BWD_MAX_THREADS_PER_ROW, 2)),
            KernelId::RmsNormBwdTileDx(..) => Some((RMSNORM_BWD_MAX_THREADS_PER_ROW, 1)),
            // Its register budget is `max_registers`.
            KernelId::RmsNormBwdNarrow(_, _, budget)
            | KernelId::RmsNormBwdFusedNarrow(_, budget) => Some((budget.max_threads(), 0)),
            // The scalar backward of 16-bit rows: its 512-thread blocks must launch (128
            // registers; unbounded it took up to 149).
            KernelId::RmsNormBwd(DType::BF16 | DType::F16, _, NormBwdVariant::E16) => {
                Some((RMSNORM_BWD_MAX_THREADS_PER_ROW, 0))
            }
            // The scalar backward of f32 rows: its 512-thread blocks must launch, and two
            // 256-thread blocks then fit an SM (128 registers).
            KernelId::RmsNormBwd(DType::F32, VecMode::Scalar, NormBwdVariant::E16) => {
                Some((RMSNORM_BWD_MAX_THREADS_PER_ROW, 1))
            }
            // One tile per block: two blocks per SM (64 registers), so that a cluster's
            // blocks and a few rows' clusters share multiprocessors; two tiles, and the f32
            // realigned tile (which spilled at 64): its block.
            KernelId::RmsNormFwdSplit(DType::F32, NormPath::Realigned, _) => {
                Some((RMSNORM_MAX_THREADS_PER_ROW, 0))
            }
            KernelId::RmsNormFwdSplit(_, _, NormFwdVariant::E16) => {
                Some((RMSNORM_MAX_THREADS_PER_ROW, 2))
            }
            KernelId::RmsNormFwdSplit(..) => Some((RMSNORM_MAX_THREADS_PER_ROW, 0)),
            // Three blocks per SM (40 registers): half as many clusters again in flight.
            KernelId::RmsNormFwdSplitNarrow(..) => Some((RMSNORM_MAX_THREADS_PER_ROW, 3)),
            // As the one-tile storage-dtype split: two blocks per SM (64 registers); f32 per
            // group on the vector path spilled there (24 bytes), so one.
            KernelId::RmsNormFp8Split(DType::F32, NormPath::V16, FP8_PER_GROUP) => {
                Some((RMSNORM_MAX_THREADS_PER_ROW, 1))
            }
            KernelId::RmsNormFp8Split(..) => Some((RMSNORM_MAX_THREADS_PER_ROW, 2)),
            // Two tiles of loads in flight: one 512-thread row per SM (128 registers), as the
            // storage-dtype loads-ahead form takes (it has no bound, and ptxas gives it more
            // than 64).
            KernelId::RmsNormFp8LoopAhead(..) => Some((RMSNORM_MAX_THREADS_PER_ROW, 1)),
            _ => None,
        }
    }

    /// A `.maxnreg` that `cargo xtask ptx` writes into the entry instead of `.minnctapersm`
    /// (with the same `.maxntid`), where the launch bounds' register budget is more than the
    /// kernel should take: the narrow backward and the whole-row realigned kernels.
    ///
    /// Realigned: at 16 per thread the 16-bit entry holds the bodies specialised on a row's
    /// offset, which took 64 registers under the bounds and cost rows of 160-192 threads a
    /// block per multiprocessor on the form that does not use them; the others took 61-64 once
    /// the weight's ragged vector was loaded after the row's copies
    /// (`realign::stage_weight_tail`), a block per multiprocessor fewer for rows of 288-320
    /// threads at 32 per thread. At 56 none spills.
    pub const fn max_registers(self) -> Option<u32> {
        match self {
            KernelId::RmsNormBwdNarrow(_, _, budget)
            | KernelId::RmsNormBwdFusedNarrow(_, budget) => Some(budget.registers()),
            KernelId::RmsNormFwdRealigned(_, NormFwdVariant::E16 | NormFwdVariant::E32) => Some(56),
            _ => None,
        }
    }

    /// Dynamic shared memory beyond the default 48 KiB that this kernel may be launched with:
    /// the host raises the function's limit to it when it loads the module.
    pub const fn dynamic_smem_opt_in(self) -> Option<u32> {
        match self {
            KernelId::RmsNormBwdFused(d, mode)
                if rmsnorm_bwd_staged(d, mode, NormBwdVariant::E16, true) =>
            {
                Some(RMSNORM_BWD_STAGED_MAX_SMEM_BYTES)
            }
            KernelId::RmsNormFwdRealigned(..)
            | KernelId::RmsNormFp8Realigned(..)
            | KernelId::RmsNormFwdSplit(_, NormPath::Realigned, _)
            | KernelId::RmsNormFwdSplitNarrow(_, NormPath::Realigned)
            | KernelId::RmsNormFp8Split(_, NormPath::Realigned, _) => {
                Some(RMSNORM_REALIGNED_MAX_SMEM_BYTES)
            }
            KernelId::RmsNormBwd(d, mode, variant)
                if rmsnorm_bwd_staged(d, mode, variant, false) =>
            {
                Some(RMSNORM_BWD_STAGED_MAX_SMEM_BYTES)
            }
            KernelId::RmsNormBwdCluster(..) | KernelId::RmsNormBwdClusterFused(..) => {
                Some(RMSNORM_BWD_CLUSTER_MAX_SMEM_BYTES)
            }
            // The same code as the 128-register entries, so the same shared memory.
            KernelId::RmsNormBwdNarrow(d, mode, _) => {
                KernelId::RmsNormBwd(d, mode, NormBwdVariant::E16).dynamic_smem_opt_in()
            }
            KernelId::RmsNormBwdFusedNarrow(d, _) => {
                KernelId::RmsNormBwdFused(d, V16).dynamic_smem_opt_in()
            }
            KernelId::GatedFp8RowStream(..) => Some(GATED_FP8_STREAM_SMEM_BYTES),
            KernelId::RmsNormFwdStream(..) | KernelId::RmsNormFp8Stream(..) => {
                Some(RMSNORM_STREAM_SMEM_BYTES)
            }
            _ => None,
        }
    }

    /// A norm forward kernel's storage dtype, memory path and row variant (the w-first form is
    /// a v16, 16-per-thread kernel, the split form a looped one); `None` for other kernels.
    pub const fn rmsnorm_forward_form(self) -> Option<(DType, NormPath, NormFwdVariant)> {
        match self {
            KernelId::RmsNormFwd(d, v, n) => Some((d, NormPath::of(v), n)),
            KernelId::RmsNormFwdLoopAhead(d, v) => Some((d, NormPath::of(v), NormFwdVariant::Loop)),
            KernelId::RmsNormFwdRealigned(d, n) => Some((d, NormPath::Realigned, n)),
            KernelId::RmsNormFwdWFirst(d) => Some((d, NormPath::V16, NormFwdVariant::E16)),
            KernelId::RmsNormFwdStream(d) => Some((d, NormPath::V16, NormFwdVariant::E32)),
            // The looped row's map and reduction shape, over a cluster's blocks.
            KernelId::RmsNormFwdSplit(d, path, _) | KernelId::RmsNormFwdSplitNarrow(d, path) => {
                Some((d, path, NormFwdVariant::Loop))
            }
            _ => None,
        }
    }
}

/// Every kernel entry name, in index order.
pub fn kernel_names() -> impl Iterator<Item = &'static str> {
    KernelId::ALL.iter().map(|k| k.name())
}
