//! Fused residual-add + RMSNorm, forward and backward, batch-invariant.
//!
//! ```text
//! h    = x + residual                         f32, right after the loads; stored as x's dtype
//! rstd = 1 / sqrt(sum(h * h) / H + eps)       eps inside the square root, denominator H
//! y    = (h * rstd) * w                       w widened to f32 first; Gemma: (1 + w) in f32
//! ```
//!
//! No mean subtraction and no bias (this is not LayerNorm). Storage f32, f16 or bf16 (one
//! dtype for x, residual, y, h); the weight is that dtype or f32; `rstd` is f32. The epsilon
//! belongs to this op: the `rstd` it returns already includes it, so a consumer of `rstd`
//! (the backward, say) must not add it again.
//!
//! # API
//! One entry per direction: [`Kernels::rmsnorm`] takes the forward's operands as a
//! [`Placement`], [`Kernels::rmsnorm_backward`] the gradients as a [`GradPlacement`] and what
//! the forward saved as [`SavedForward`]; both take [`RmsNormOptions`]. The `unsafe`
//! [`Kernels::rmsnorm_raw`] / [`Kernels::rmsnorm_backward_raw`] take [`MatDesc`]s of tensors
//! owned elsewhere and run the same plan.
//!
//! # Output placement
//! `y` and `h` go to separate buffers, or `h` overwrites `x` or `residual`, or `y` overwrites
//! `x`, or both: `x` receives `y` and `residual` receives `h` (the convention of vLLM's
//! `fused_add_rms_norm` and FlashInfer's `fused_add_rmsnorm`); plain RMSNorm has no residual
//! and no `h`, in place or not ([`Placement`] lists them). The placement's borrows rule out
//! every other overlap at compile time on the safe API:
//!
//! ```compile_fail
//! # use ferrofuse::{Kernels, Mat, MatMut, RmsNormOptions, norm::Placement};
//! # fn f(k: &Kernels, s: &ferrofuse::cudarc::driver::CudaStream,
//! #      buf: &mut ferrofuse::cudarc::driver::CudaSlice<f32>,
//! #      w: &ferrofuse::cudarc::driver::CudaSlice<f32>) {
//! // One buffer as both x and residual of the in-place form: two `&mut` borrows.
//! let io = Placement::AddInPlace {
//!     x: &mut MatMut::new(buf.as_view_mut(), 4, 64),
//!     residual: &mut MatMut::new(buf.as_view_mut(), 4, 64),
//! };
//! k.rmsnorm(s, io, &Mat::new(w.as_view(), 1, 64), None, &RmsNormOptions::new(1e-6));
//! # }
//! ```
//!
//! and the plan rejects any other overlap of raw operands with [`Error::Aliasing`].
//!
//! # Numerics modes ([`NormNumerics`])
//! - [`NormNumerics::F32`] (default): `h` in f32 (not rounded) for the statistics and the
//!   normalisation; only the stores round. This is FlashInfer's `fused_add_rmsnorm` / `rmsnorm`
//!   (it keeps the f32 sum in shared memory) and Hugging Face's `GemmaRMSNorm`
//!   (`output * (1.0 + weight.float())`, all f32) when used with `gemma`.
//! - [`NormNumerics::HfLlama`]: Hugging Face `LlamaRMSNorm`: the norm sees `h` as stored (HF
//!   adds the residual in the storage dtype), `n = h * rstd` is rounded to the storage dtype
//!   (`hidden_states.to(input_dtype)`), then `w * n` is rounded again at the store. vLLM's
//!   `rms_norm` / `fused_add_rms_norm` CUDA kernels follow this convention too: they keep `h`
//!   as `scalar_t`, compute `(scalar_t)(x * s_variance) * weight`.
//!
//! With f32 storage the two modes agree. Rows longer than 16384 elements do not fit in
//! registers: the kernel then normalises `h` as stored in both modes (the statistics still use
//! the f32 sum in the f32 mode); [`NormGeometry::looped`] tells which rows those are.
//!
//! # Determinism and batch invariance
//! The geometry ([`rmsnorm_fwd_geometry`]: threads per row, elements per thread, rows per
//! block) is a function of H and the dtype only, and fixes which thread reads which element
//! and the order of every floating-point sum. So a row's `y`, `h` and `rstd` are bitwise the
//! same whether it is computed alone or in a batch of any size at any position, at any offset
//! from the 16-byte grid, whichever memory path runs it ([`NormPath`]:
//! 16-byte vectors when every operand allows them; the realigned kernel, aligned vectors
//! staged through shared memory, for rows off the grid with a 16-byte aligned weight: whole
//! rows up to 16384 16-bit or 8192 f32 elements, longer rows tile by tile with a weight of the
//! storage dtype; one element per access otherwise), and from one run to the next. Rows longer
//! than 16384 elements at few rows (`split_forward`) run on sm_90 as one thread-block cluster
//! per row (a tile or two of the row per block, on any of the three memory paths: realigned
//! off the grid when the weight is aligned and the block's staging fits), which computes the
//! looped kernel's sums in its order, so the same bits. `dw`
//! is summed in a fixed order too (per-slot partials, then a column-wise sum), so repeated
//! backward runs give the same bits; no float atomics anywhere. The backward of rows of 2-16
//! tiles of 8192 elements (`rmsnorm_bwd_cluster_fits`) runs on sm_90 as a cluster of a block
//! per tile per row walker (9-16 tiles where the device runs clusters of 16), with the bits of
//! the looped kernel of the same tiles.
//!
//! # Backward
//! From `dy`, the saved `h` and `rstd`, and `w` (`g = w * dy`, Gemma `(1 + w) * dy`):
//! `dx = rstd * (g - h * rstd^2 * mean(h * g)) + dres`, the gradient of both `x` and
//! `residual` (so one buffer serves both), where `dres` is the gradient already flowing into
//! the residual stream; and `dw = sum over rows of dy * h * rstd`. The backward is the f32
//! derivative whatever the forward's numerics mode. `dw` takes two launches: per-slot partial
//! sums into a caller-provided f32 workspace ([`rmsnorm_backward_workspace_len`] elements),
//! then a fixed-order column sum; a call of few rows that keeps `dy` takes one, whose extra
//! blocks sum `dw` from `h`, `dy` and `rstd` in the same order (the same bits; the workspace
//! is then unused).
//!
//! Every call validates everything before launching (a rejected call writes nothing);
//! launches allocate nothing and never synchronise, so they can be captured in CUDA graphs.

use cudarc::driver::{CudaStream, DevicePtrMut, DeviceSlice, SyncOnDrop};
pub use ferrofuse_common::{BwdNarrow, NormBwdVariant, NormFwdVariant, NormGeometry};
use ferrofuse_common::{
    DType, KernelId, NormBwdLayout, NormPath, RMSNORM_BWD_GRID_THREADS, RMSNORM_BWD_MAX_CLUSTER,
    RMSNORM_BWD_MAX_THREADS_PER_ROW, RMSNORM_BWD_WIDE_CLUSTER_MAX_ROWS, RMSNORM_DW_COLS,
    RMSNORM_DW_SMEM_BYTES, RMSNORM_DW_THREADS, RMSNORM_GEMMA, RMSNORM_HF, RMSNORM_LOOP_SMEM_BYTES,
    RMSNORM_SMEM_BYTES, RMSNORM_SPLIT_MAX_CLUSTER, RMSNORM_SPLIT_SMEM_BYTES,
    RMSNORM_STREAM_SMEM_BYTES, RMSNORM_W_F32, RmsNormBwdParams, RmsNormDwParams, RmsNormFwdParams,
    VecMode, rmsnorm_bwd_cluster_fits, rmsnorm_bwd_cluster_fused_dw_groups,
    rmsnorm_bwd_cluster_smem_bytes, rmsnorm_bwd_fused_dw_blocks, rmsnorm_bwd_fused_dw_groups,
    rmsnorm_bwd_fused_dw_smem_bytes, rmsnorm_bwd_fused_narrow, rmsnorm_bwd_geometry,
    rmsnorm_bwd_layout, rmsnorm_bwd_smem_bytes, rmsnorm_bwd_tile_walkers, rmsnorm_bwd_tiles,
    rmsnorm_fwd_geometry, rmsnorm_realigned_fits, rmsnorm_realigned_smem_bytes,
    rmsnorm_split_geometry, rmsnorm_split_smem_bytes,
};

use crate::error::{Error, Result};

mod fp8;
use crate::runtime::{GridLimits, Kernels, Launch};
use crate::tensor::{Element, Mat, MatDesc, MatMut};
use crate::validate::{check_aliasing, check_devices, check_shape, vec_mode};
pub use fp8::{Fp8Placement, RmsNormFp8Descs, plan_rmsnorm_forward_fp8};

/// Where the forward rounds intermediate values to the storage dtype (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum NormNumerics {
    /// Everything in f32; only the stores of `h` and `y` round (FlashInfer, HF Gemma).
    #[default]
    F32,
    /// Hugging Face `LlamaRMSNorm` (and vLLM): `h` as stored, `h * rstd` rounded before `* w`.
    HfLlama,
}

/// Scalar options of the forward.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RmsNormOptions {
    /// Added to the mean square inside the square root; finite and > 0.
    pub eps: f32,
    /// Gemma's weight convention: `y = n * (1 + w)`, `1 + w` formed in f32.
    pub gemma: bool,
    pub numerics: NormNumerics,
}

impl RmsNormOptions {
    /// `eps`, plain weight, f32 numerics.
    pub fn new(eps: f32) -> Self {
        Self {
            eps,
            gemma: false,
            numerics: NormNumerics::F32,
        }
    }

    pub fn with_gemma(self, gemma: bool) -> Self {
        Self { gemma, ..self }
    }

    pub fn with_numerics(self, numerics: NormNumerics) -> Self {
        Self { numerics, ..self }
    }
}

/// The operands of a forward call as raw device matrices (all `[rows, H]` but `weight`,
/// `[1, H]`, and `rstd`, `[rows, 1]` f32). `residual` and `h` are both given or both absent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RmsNormFwdDescs {
    pub x: MatDesc,
    pub residual: Option<MatDesc>,
    pub weight: MatDesc,
    pub y: MatDesc,
    pub h: Option<MatDesc>,
    pub rstd: Option<MatDesc>,
}

/// The operands of a backward call as raw device matrices: `dy`, `h`, `dres`, `dx` are
/// `[rows, H]` of the storage dtype, `weight` and `dw` `[1, H]` of the weight's dtype, `rstd`
/// `[rows, 1]` f32, and `workspace` any f32 matrix of at least
/// [`rmsnorm_backward_workspace_len`] elements (only its address and length are used).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RmsNormBwdDescs {
    pub dy: MatDesc,
    pub h: MatDesc,
    pub weight: MatDesc,
    pub rstd: MatDesc,
    pub dres: Option<MatDesc>,
    pub dx: MatDesc,
    pub dw: MatDesc,
    pub workspace: MatDesc,
}

/// The launches of a backward call, in stream order: one (the fused kernel, which sums `dw`
/// in blocks of its own) where the rows are few enough and `dx` is not written over `dy`,
/// else two; three for the tile passes (the tile sums first). The fused and two-launch forms
/// compute the same bits; the tile passes the same `dx` (their `dw` partials follow their own
/// walkers).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RmsNormBwdPlan {
    /// The tile passes' first launch, each tile's sum into the workspace; `None` otherwise.
    pub sums: Option<Launch<RmsNormBwdParams>>,
    /// `dx` per row, and the `dw` partials into the workspace; or, fused, `dx` and `dw`.
    pub rows: Launch<RmsNormBwdParams>,
    /// The fixed-order sum of the partials into `dw`; `None` when `rows` is fused.
    pub dw: Option<Launch<RmsNormDwParams>>,
}

/// The forward's geometry for rows of `hidden` elements of `dtype` (a function of these two
/// only; see the module docs).
pub fn rmsnorm_forward_geometry(dtype: DType, hidden: usize) -> (NormFwdVariant, NormGeometry) {
    rmsnorm_fwd_geometry(dtype, hidden as u64)
}

/// The backward's geometry for rows of `hidden` elements of `dtype`.
pub fn rmsnorm_backward_geometry(dtype: DType, hidden: usize) -> (NormBwdVariant, NormGeometry) {
    rmsnorm_bwd_geometry(dtype, hidden as u64)
}

/// f32 elements the backward's workspace needs for `rows x hidden` of `dtype` (`usize::MAX`
/// for a shape no buffer could hold).
pub fn rmsnorm_backward_workspace_len(dtype: DType, rows: usize, hidden: usize) -> usize {
    let len = rmsnorm_bwd_layout(dtype, rows as u64, hidden as u64).workspace_len;
    usize::try_from(len).unwrap_or(usize::MAX)
}

fn check_eps(eps: f32) -> Result<()> {
    if !(eps.is_finite() && eps > 0.0) {
        return Err(Error::InvalidArgument {
            what: "eps",
            value: format!("{eps} (it must be finite and > 0)"),
        });
    }
    Ok(())
}

/// The weight is `[1, H]` of the storage dtype or f32.
fn check_weight(name: &'static str, w: &MatDesc, dtype: DType, hidden: usize) -> Result<()> {
    if w.dtype != dtype && w.dtype != DType::F32 {
        return Err(Error::DTypeMismatch {
            tensor: name,
            expected: dtype,
            got: w.dtype,
        });
    }
    w.check(name, w.dtype)?;
    check_shape(name, w, (1, hidden))
}

/// The weight's flag bits, shared by the forward and the backward: Gemma's `1 + w`, and an f32
/// weight under a 16-bit storage dtype.
fn weight_flags(gemma: bool, w_dtype: DType, dtype: DType) -> u32 {
    let mut flags = 0;
    if gemma {
        flags |= RMSNORM_GEMMA;
    }
    if w_dtype == DType::F32 && dtype != DType::F32 {
        flags |= RMSNORM_W_F32;
    }
    flags
}

fn grid_u32(what: &'static str, blocks: u64) -> Result<u32> {
    // CUDA's grid x limit.
    if blocks > i32::MAX as u64 {
        return Err(Error::TooLarge {
            what,
            value: blocks as usize,
        });
    }
    Ok(blocks as u32)
}

/// Looped rows take the loads-ahead kernel in calls of at most one row per this many
/// multiprocessors. It holds two tiles of loads in flight per block but leaves room for one
/// 512-thread block per multiprocessor where the other looped kernel has two: with few rows
/// each block has a multiprocessor to itself either way, and at 50-66 rows of 3-6 tiles it was
/// faster on an H200 and an H100; with more rows than multiprocessors it needs twice the waves,
/// and at 100 rows, whose next launch's early blocks (programmatic dependent launch) then find
/// few idle multiprocessors, it lost in graph replay (`bench/TUNING.md`, "The looped forward's
/// next tile loaded ahead").
pub(crate) const LOOP_AHEAD_SMS_PER_ROW: u64 = 2;

/// The forward kernel for a grid of `blocks`: the w-first form (the weight loaded with the
/// inputs, one L2 round trip less per row) when the 16-per-thread vector kernel runs and the
/// grid fits on the device at once, the w-late form otherwise (it holds fewer registers, so
/// more rows are in flight when there are waves); for looped rows, the loads-ahead form in
/// calls of few rows ([`LOOP_AHEAD_SMS_PER_ROW`]). Each pair computes the same bits.
fn forward_kernel(
    dtype: DType,
    mode: VecMode,
    variant: NormFwdVariant,
    blocks: u32,
    limits: &GridLimits,
) -> KernelId {
    let w_first = KernelId::RmsNormFwdWFirst(dtype);
    if mode == VecMode::V16
        && variant == NormFwdVariant::E16
        && blocks <= limits.resident_blocks(w_first)
    {
        w_first
    } else if variant == NormFwdVariant::Loop
        && limits.loop_ahead
        && blocks as u64 * LOOP_AHEAD_SMS_PER_ROW <= limits.sm_count as u64
    {
        KernelId::RmsNormFwdLoopAhead(dtype, mode)
    } else {
        KernelId::RmsNormFwd(dtype, mode, variant)
    }
}

/// Validates a forward call and decides its launch; needs no GPU. The storage dtype is `x`'s.
///
/// Checks: `eps` finite and > 0; every operand's dtype, shape, unit last stride, row stride,
/// buffer size and alignment; `residual` and `h` both given or both absent; the weight the
/// storage dtype or f32; aliasing: `h` may be exactly `x` or exactly `residual`, `y` may be
/// exactly `x`, nothing else overlaps an output. The memory path follows from the operands'
/// alignment and H (see the module docs). `limits` only picks between kernels that compute
/// the same bits: the w-first form while the grid fits on the device at once, the w-late one
/// otherwise.
pub fn plan_rmsnorm_forward(
    t: &RmsNormFwdDescs,
    opts: &RmsNormOptions,
    limits: &GridLimits,
) -> Result<Launch<RmsNormFwdParams>> {
    let ops = ForwardOperands::of(&t.x, &t.residual, &t.h, &t.weight, &t.rstd);
    ops.check(opts, Some(&t.y))?;
    let (x, residual, h, rstd, w) = (&t.x, ops.residual, ops.h, ops.rstd, &t.weight);
    let dtype = x.dtype;
    let (rows, hidden) = x.shape();
    check_aliasing(
        ("y", &t.y),
        &[
            ("x", Some(x)),
            ("residual", residual),
            ("weight", Some(w)),
            ("h", h),
            ("rstd", rstd),
        ],
        &["x"],
    )?;

    let (variant, geometry) = rmsnorm_fwd_geometry(dtype, hidden as u64);
    let mode = vec_mode(dtype, hidden, &[Some(x), residual, Some(&t.y), h, Some(w)]);
    // Off the vector grid, the realigned kernel where its geometry and the weight allow it
    // (the same bits as the scalar one, with 16-byte accesses).
    let w_f32 = w.dtype == DType::F32;
    let realigned = mode == VecMode::Scalar
        && rmsnorm_realigned_fits(dtype, hidden as u64, w_f32)
        && w.addr % 16 == 0;
    let grid = if rows == 0 || hidden == 0 {
        0
    } else {
        grid_u32(
            "rows",
            (rows as u64).div_ceil(geometry.rows_per_block as u64),
        )?
    };
    if let Some((kernel, blocks, shared_mem_bytes)) = split_forward(
        dtype,
        mode,
        w.addr % 16 == 0,
        realigned,
        rows,
        hidden,
        limits,
    ) {
        return Ok(Launch {
            kernel,
            grid: grid_u32("rows", blocks)?,
            block: geometry.block_threads(),
            shared_mem_bytes,
            params: ops.params(&t.y, opts, &geometry),
        });
    }
    let stream = KernelId::RmsNormFwdStream(dtype);
    if let Some(blocks) = streamed_forward(stream, mode, variant, rows, limits) {
        return Ok(Launch {
            kernel: stream,
            grid: blocks,
            block: geometry.block_threads(),
            shared_mem_bytes: RMSNORM_STREAM_SMEM_BYTES,
            params: ops.params(&t.y, opts, &geometry),
        });
    }
    Ok(Launch {
        kernel: if realigned {
            KernelId::RmsNormFwdRealigned(dtype, variant)
        } else {
            forward_kernel(dtype, mode, variant, grid, limits)
        },
        grid,
        block: geometry.block_threads(),
        shared_mem_bytes: if realigned {
            rmsnorm_realigned_smem_bytes(&geometry, dtype, w_f32)
        } else if variant == NormFwdVariant::Loop {
            RMSNORM_LOOP_SMEM_BYTES
        } else {
            RMSNORM_SMEM_BYTES
        },
        params: ops.params(&t.y, opts, &geometry),
    })
}

/// The persistent grid of the streamed forward `kernel` (the storage-dtype or an FP8 entry),
/// where it applies: rows of 32 elements per thread on the vector path, more of them than the
/// device holds such blocks at once (within one wave every block has one row, and there is no
/// next row to stream), on a module and device with bulk copies and its shared memory. It
/// computes the same bits as the register kernel of the same rows, so the choice by `rows`
/// keeps batch invariance.
pub(crate) fn streamed_forward(
    kernel: KernelId,
    mode: VecMode,
    variant: NormFwdVariant,
    rows: usize,
    limits: &GridLimits,
) -> Option<u32> {
    let resident = limits.resident_blocks(kernel);
    (limits.streamed_rows
        && mode == VecMode::V16
        && variant == NormFwdVariant::E32
        && rows as u64 > resident as u64)
        .then_some(resident)
}

/// Rows from which the split forward's one-tile rows take the entries for three blocks per
/// multiprocessor. Those load the weight after the row's sum of squares, to fit 40 registers:
/// where a call has so few rows that the latency of its one pass sets the time, that load is
/// on the critical path (on H100 and H200, 1-7 rows were level or up to 5% slower on them in
/// graph replay, up to 16% per call), while from 16 rows on more clusters in flight and the
/// lighter blocks win (10-45% at 16-64 rows on an H200, graph replay).
pub(crate) const NARROW_SPLIT_MIN_ROWS: usize = 8;

/// [`NARROW_SPLIT_MIN_ROWS`] for rows off the 16-byte grid (the realigned split). Below it the
/// realigned three-block entries lost per call at every shape measured and in graph replay
/// moved either way with how the clusters land on the GPCs, which the host cannot see; from it
/// on they were level or faster (`bench/TUNING.md`, "The split rule re-measured").
pub(crate) const NARROW_SPLIT_MIN_ROWS_REALIGNED: usize = 16;

/// The cluster-split forward, its grid (`rows` clusters) and shared memory, where it
/// applies: looped rows on a device with clusters, on the vector and scalar paths at most
/// three eighths as many rows as multiprocessors (one block per row would leave most of the
/// GPU idle; on an H200 the split was 11-42% faster at 34-48 rows, level at 64, and 9-20%
/// slower from 100 rows, where one block per row fills most of the GPU). Off the
/// grid it takes the realigned path where the weight is 16-byte aligned and the block's
/// staging fits, and then up to one row per multiprocessor for 16-bit rows, at any number of
/// rows for f32 rows and where there is no looped realigned kernel (`realigned_loop` false):
/// the split reads each element once, the looped realigned kernel reads `h` back, and on an
/// H200 the looped realigned kernel was the faster of the two only for 16-bit rows, from a
/// few hundred rows on. Else the scalar path. With `limits.narrow_split` (on by default)
/// one-tile rows from [`NARROW_SPLIT_MIN_ROWS`] on ([`NARROW_SPLIT_MIN_ROWS_REALIGNED`] off the
/// grid) take the entries compiled for three blocks per multiprocessor, and the vector path's
/// rows of 8 tiles or more then take the split up to half as many rows as multiprocessors (one
/// block per row loops over all of them; on an H100 the split was 2-22% faster at 56-66 rows of
/// 65536 elements, on an H200 16-29% at 64 rows of 100000, while at 64 rows of 3-6 tiles one
/// block per row stayed up to 27% ahead in graph replay). It computes the same bits as the
/// looped kernel (`rmsnorm_split_geometry`), so the choice by `rows` keeps batch invariance.
fn split_forward(
    dtype: DType,
    mode: VecMode,
    w_aligned: bool,
    realigned_loop: bool,
    rows: usize,
    hidden: usize,
    limits: &GridLimits,
) -> Option<(KernelId, u64, u32)> {
    let (variant, cluster) = rmsnorm_split_geometry(dtype, hidden as u64, limits.wide_clusters)?;
    let realigned = rmsnorm_split_smem_bytes(dtype, NormPath::Realigned, variant);
    let (path, smem) = match (mode, realigned) {
        (VecMode::V16, _) => (NormPath::V16, RMSNORM_SPLIT_SMEM_BYTES),
        (VecMode::Scalar, Some(bytes)) if w_aligned => (NormPath::Realigned, bytes),
        (VecMode::Scalar, _) => (NormPath::Scalar, RMSNORM_SPLIT_SMEM_BYTES),
    };
    let sms = limits.sm_count as u64;
    let narrow = KernelId::RmsNormFwdSplitNarrow(dtype, path);
    let min_rows = match path {
        NormPath::Realigned => NARROW_SPLIT_MIN_ROWS_REALIGNED,
        _ => NARROW_SPLIT_MIN_ROWS,
    };
    let narrow = (limits.narrow_split
        && variant == NormFwdVariant::E16
        && rows >= min_rows
        && narrow.exists())
    .then_some(narrow);
    let takes = match path {
        NormPath::Realigned => rows as u64 <= sms || !realigned_loop || dtype == DType::F32,
        _ if narrow.is_some() && cluster as u64 >= RMSNORM_SPLIT_MAX_CLUSTER => {
            rows as u64 * 2 <= sms
        }
        _ => rows as u64 * 8 <= sms * 3,
    };
    if !(limits.clusters && rows > 0 && takes) {
        return None;
    }
    Some((
        narrow.unwrap_or(KernelId::RmsNormFwdSplit(dtype, path, variant)),
        rows as u64 * cluster as u64,
        smem,
    ))
}

/// The operands of a forward besides `y`: what the storage-dtype and the FP8 forward share
/// (their checks and their part of the kernel parameters).
pub(crate) struct ForwardOperands<'a> {
    pub(crate) x: &'a MatDesc,
    pub(crate) residual: Option<&'a MatDesc>,
    pub(crate) h: Option<&'a MatDesc>,
    pub(crate) weight: &'a MatDesc,
    pub(crate) rstd: Option<&'a MatDesc>,
}

impl<'a> ForwardOperands<'a> {
    pub(crate) fn of(
        x: &'a MatDesc,
        residual: &'a Option<MatDesc>,
        h: &'a Option<MatDesc>,
        weight: &'a MatDesc,
        rstd: &'a Option<MatDesc>,
    ) -> Self {
        ForwardOperands {
            x,
            residual: residual.as_ref(),
            h: h.as_ref(),
            weight,
            rstd: rstd.as_ref(),
        }
    }

    /// `eps`; every operand's dtype (`x`'s is the storage dtype), shape and extent, with a
    /// `y` of the storage dtype right after `x` when given; a residual exactly with an `h`;
    /// `h` overlapping nothing but exactly `x` or `residual`, `rstd` nothing. `y`'s overlaps,
    /// and an FP8 `y`, are the caller's.
    pub(crate) fn check(&self, opts: &RmsNormOptions, y: Option<&MatDesc>) -> Result<()> {
        check_eps(opts.eps)?;
        let (x, w) = (self.x, self.weight);
        let dtype = x.dtype;
        x.check("x", dtype)?;
        let (rows, hidden) = x.shape();
        if let Some(y) = y {
            y.check("y", dtype)?;
            check_shape("y", y, (rows, hidden))?;
        }
        match (self.residual, self.h) {
            (Some(r), Some(h)) => {
                r.check("residual", dtype)?;
                check_shape("residual", r, (rows, hidden))?;
                h.check("h", dtype)?;
                check_shape("h", h, (rows, hidden))?;
            }
            (None, None) => {}
            (Some(_), None) => {
                return Err(Error::InvalidArgument {
                    what: "h",
                    value: "missing: with a residual the sum h = x + residual must be stored"
                        .into(),
                });
            }
            (None, Some(_)) => {
                return Err(Error::InvalidArgument {
                    what: "h",
                    value: "given without a residual: plain RMSNorm has no h output".into(),
                });
            }
        }
        check_weight("weight", w, dtype, hidden)?;
        if let Some(rstd) = self.rstd {
            rstd.check("rstd", DType::F32)?;
            check_shape("rstd", rstd, (rows, 1))?;
        }
        let (residual, rstd) = (self.residual, self.rstd);
        if let Some(h) = self.h {
            check_aliasing(
                ("h", h),
                &[
                    ("x", Some(x)),
                    ("residual", residual),
                    ("weight", Some(w)),
                    ("rstd", rstd),
                ],
                &["x", "residual"],
            )?;
        }
        if let Some(rstd) = rstd {
            check_aliasing(
                ("rstd", rstd),
                &[("x", Some(x)), ("residual", residual), ("weight", Some(w))],
                &[],
            )?;
        }
        Ok(())
    }

    /// The kernel parameters for these operands and the output `y`, with the options' flags.
    pub(crate) fn params(
        &self,
        y: &MatDesc,
        opts: &RmsNormOptions,
        geometry: &NormGeometry,
    ) -> RmsNormFwdParams {
        let (x, residual, h, rstd, w) = (self.x, self.residual, self.h, self.rstd, self.weight);
        let (rows, hidden) = x.shape();
        let mut flags = weight_flags(opts.gemma, w.dtype, x.dtype);
        if opts.numerics == NormNumerics::HfLlama {
            flags |= RMSNORM_HF;
        }
        RmsNormFwdParams {
            x: x.addr,
            residual: residual.map_or(0, |m| m.addr),
            w: w.addr,
            y: y.addr,
            h: h.map_or(0, |m| m.addr),
            rstd: rstd.map_or(0, |m| m.addr),
            x_stride: x.row_stride as u64,
            residual_stride: residual.map_or(0, |m| m.row_stride as u64),
            y_stride: y.row_stride as u64,
            h_stride: h.map_or(0, |m| m.row_stride as u64),
            rstd_stride: rstd.map_or(0, |m| m.row_stride as u64),
            rows: rows as u64,
            hidden: hidden as u64,
            eps: opts.eps,
            flags,
            threads_per_row: geometry.threads_per_row,
            rows_per_block: geometry.rows_per_block,
        }
    }
}

/// Rows off the 16-byte grid (16-bit) run one launch past the two launches' grid while
/// `rows x hidden` is at most this: the `dw` blocks' second read of `h` and `dy` costs less
/// than the scalar rows kernel's partials and the second launch up to about this size (see
/// bench/TUNING.md). On the vector path the two launches win from fewer rows.
const RMSNORM_BWD_FUSED_SCALAR_MAX_ELEMS: usize = 1 << 22;

/// Validates a backward call and decides its launches (one or two, see [`RmsNormBwdPlan`]);
/// needs no GPU. The storage dtype is `dy`'s; of `opts` only `gemma` is used.
///
/// Checks every operand as [`plan_rmsnorm_forward`] does; `dw` has the weight's dtype; the
/// workspace is f32 with at least [`rmsnorm_backward_workspace_len`] elements; aliasing: `dx`
/// may be exactly `dy` or exactly `dres`, nothing else overlaps `dx`, `dw` or the workspace.
///
/// Rows longer than 8192 take the looped kernel here; [`plan_rmsnorm_backward_with`] with
/// clusters may split them over thread-block clusters instead (the same bits).
pub fn plan_rmsnorm_backward(t: &RmsNormBwdDescs, opts: &RmsNormOptions) -> Result<RmsNormBwdPlan> {
    plan_rmsnorm_backward_with(t, opts, true, 0, false)
}

/// [`plan_rmsnorm_backward`], with the one-launch form allowed or not (as
/// [`Kernels::fused_backward`] says for [`Kernels::rmsnorm_backward`]), and rows longer than
/// 8192 split over thread-block clusters where [`rmsnorm_bwd_cluster_fits`] and their tiles
/// are at most `max_cluster` (as [`Kernels::norm_limits`] says,
/// [`GridLimits::max_cluster_blocks`]: 0 without clusters or with the split turned off), or,
/// with `tile_passes` (as [`Kernels::tile_passes`] says), 16-bit rows in the tile passes
/// wherever [`rmsnorm_bwd_cluster_fits`].
pub fn plan_rmsnorm_backward_with(
    t: &RmsNormBwdDescs,
    opts: &RmsNormOptions,
    fused_allowed: bool,
    max_cluster: u64,
    tile_passes: bool,
) -> Result<RmsNormBwdPlan> {
    let dy = &t.dy;
    let dtype = dy.dtype;
    dy.check("dy", dtype)?;
    let (rows, hidden) = dy.shape();
    for (name, m) in [("h", &t.h), ("dx", &t.dx)] {
        m.check(name, dtype)?;
        check_shape(name, m, (rows, hidden))?;
    }
    if let Some(dres) = &t.dres {
        dres.check("dres", dtype)?;
        check_shape("dres", dres, (rows, hidden))?;
    }
    check_weight("weight", &t.weight, dtype, hidden)?;
    t.dw.check("dw", t.weight.dtype)?;
    check_shape("dw", &t.dw, (1, hidden))?;
    t.rstd.check("rstd", DType::F32)?;
    check_shape("rstd", &t.rstd, (rows, 1))?;
    if t.workspace.dtype != DType::F32 {
        return Err(Error::DTypeMismatch {
            tensor: "workspace",
            expected: DType::F32,
            got: t.workspace.dtype,
        });
    }
    let layout = rmsnorm_bwd_layout(dtype, rows as u64, hidden as u64);
    let needed = layout.workspace_len as usize;
    // The part of the workspace the kernels use, as one row.
    let ws = MatDesc::contiguous(t.workspace.addr, t.workspace.len, DType::F32, 1, needed);
    ws.check("workspace", DType::F32)?;

    let (h, w, rstd, dres) = (&t.h, &t.weight, &t.rstd, t.dres.as_ref());
    check_aliasing(
        ("dx", &t.dx),
        &[
            ("dy", Some(dy)),
            ("dres", dres),
            ("h", Some(h)),
            ("weight", Some(w)),
            ("rstd", Some(rstd)),
            ("dw", Some(&t.dw)),
            ("workspace", Some(&ws)),
        ],
        &["dy", "dres"],
    )?;
    check_aliasing(
        ("dw", &t.dw),
        &[
            ("dy", Some(dy)),
            ("dres", dres),
            ("h", Some(h)),
            ("weight", Some(w)),
            ("rstd", Some(rstd)),
            ("workspace", Some(&ws)),
        ],
        &[],
    )?;
    check_aliasing(
        ("workspace", &ws),
        &[
            ("dy", Some(dy)),
            ("dres", dres),
            ("h", Some(h)),
            ("weight", Some(w)),
            ("rstd", Some(rstd)),
        ],
        &[],
    )?;

    let NormBwdLayout {
        variant,
        geometry,
        blocks,
        slots,
        narrow,
        ..
    } = layout;
    // The weight and the workspace are one-row operands here (shapes checked above).
    let mode = vec_mode(
        dtype,
        hidden,
        &[Some(dy), Some(h), dres, Some(&t.dx), Some(w), Some(&ws)],
    );
    let flags = weight_flags(opts.gemma, w.dtype, dtype);
    // The kernel stages dres (and sizes its row buffers) when this address is not 0, so the
    // shared memory is sized from the same test, not from `dres.is_some()`.
    let dres_addr = dres.map_or(0, |m| m.addr);
    let block = geometry.block_threads();
    let groups = (rows as u64).div_ceil(geometry.rows_per_block as u64);
    // One launch while the `dw` blocks' second read of `h` and `dy` is cheap (few rows), and
    // only while dy is kept: the `dw` blocks read it, in any order with the rows' dx stores.
    // Few rows: the two launches' grid has a block per row group; for 16-bit blocks of 256
    // threads or more, also while a block per row group fits that grid's thread budget (its
    // slots then hold two rows; for f32 and smaller blocks the two launches were faster).
    // Its rows take a block per row group whatever their number (it has no partials to bound).
    let sixteen_bit = dtype.size_bytes() == 2;
    let cheap = groups == blocks
        || (sixteen_bit && block >= 256 && groups <= RMSNORM_BWD_GRID_THREADS / block as u64)
        || (mode == VecMode::Scalar
            && sixteen_bit
            && rows.saturating_mul(hidden) <= RMSNORM_BWD_FUSED_SCALAR_MAX_ELEMS);
    let one_launch = fused_allowed && rows > 0 && hidden > 0 && !t.dx.overlaps(dy);
    let fused = one_launch && variant == NormBwdVariant::E16 && cheap;
    // Rows longer than 8192 that the cluster split takes: a cluster of a block per tile per row
    // walker, or without clusters the looped kernel of the split's tiles (the same bits).
    // Clusters of 9-16 blocks only for up to RMSNORM_BWD_WIDE_CLUSTER_MAX_ROWS rows: with
    // more, the looped kernel's walkers fill the device, and it was faster (`bench/TUNING.md`,
    // "The norm backward's rows of 9-16 tiles, measured").
    let tiled = variant == NormBwdVariant::Loop && rmsnorm_bwd_cluster_fits(hidden as u64);
    let tiles = rmsnorm_bwd_tiles(hidden as u64);
    // The tile passes: a launch of each row's tile sums, then `dx` by walker and tile, then
    // the partials' sum; no clusters. 16-bit rows only (the f32 `dx` pass spilled).
    let tile_pass = tile_passes && tiled && sixteen_bit && rows > 0;
    let tile_walkers = rmsnorm_bwd_tile_walkers(rows as u64, hidden as u64);
    let cluster = !tile_pass
        && tiled
        && blocks > 0
        && tiles <= max_cluster
        && (tiles <= RMSNORM_BWD_MAX_CLUSTER || rows as u64 <= RMSNORM_BWD_WIDE_CLUSTER_MAX_ROWS);
    // The split in one launch while each walker has one row: the `dw` blocks' second read of
    // `h` and `dy` is then no more than the partials the two launches write and read back.
    let cluster_fused = cluster && one_launch && blocks == rows as u64;
    let row_blocks = if fused { groups } else { blocks };
    let rows_smem = rmsnorm_bwd_smem_bytes(
        dtype,
        mode,
        variant,
        &geometry,
        dres_addr != 0,
        row_blocks,
        fused,
    );
    let (kernel, grid, shared_mem_bytes) = if tile_pass {
        (
            KernelId::RmsNormBwdTileDx(dtype, mode),
            tile_walkers * tiles,
            0,
        )
    } else if fused {
        let dw_groups = rmsnorm_bwd_fused_dw_groups(block) as u64;
        let dw_blocks =
            rmsnorm_bwd_fused_dw_blocks(hidden as u64, block, rows as u64, slots, dw_groups);
        // The narrow entry runs the same code, so it computes the same bits.
        let kernel = match rmsnorm_bwd_fused_narrow(dtype, mode, &geometry, groups) {
            Some(budget) => KernelId::RmsNormBwdFusedNarrow(dtype, budget),
            None => KernelId::RmsNormBwdFused(dtype, mode),
        };
        (
            kernel,
            groups + dw_blocks,
            rows_smem.max(rmsnorm_bwd_fused_dw_smem_bytes(dw_groups)),
        )
    } else if cluster {
        // A block of 512 threads per tile (`threads_per_row` below).
        let tiles = rmsnorm_bwd_tiles(hidden as u64);
        let grid = blocks * tiles;
        if cluster_fused {
            // The `dw` blocks make whole clusters of their own (the launch's cluster size).
            let block = RMSNORM_BWD_MAX_THREADS_PER_ROW;
            let dw_groups = rmsnorm_bwd_cluster_fused_dw_groups(hidden as u64);
            let dw_blocks =
                rmsnorm_bwd_fused_dw_blocks(hidden as u64, block, rows as u64, slots, dw_groups)
                    .next_multiple_of(tiles);
            let grid = grid + dw_blocks;
            let rows_smem = rmsnorm_bwd_cluster_smem_bytes(dtype, mode, dres_addr != 0, grid);
            (
                KernelId::RmsNormBwdClusterFused(dtype, mode),
                grid,
                rows_smem.max(rmsnorm_bwd_fused_dw_smem_bytes(dw_groups)),
            )
        } else {
            (
                KernelId::RmsNormBwdCluster(dtype, mode),
                grid,
                rmsnorm_bwd_cluster_smem_bytes(dtype, mode, dres_addr != 0, grid),
            )
        }
    } else {
        // The narrow entry runs the same code, so it computes the same bits.
        let kernel = match narrow {
            Some(budget) => KernelId::RmsNormBwdNarrow(dtype, mode, budget),
            None if tiled => KernelId::RmsNormBwdLoopTiles(dtype, mode),
            None => KernelId::RmsNormBwd(dtype, mode, variant),
        };
        (kernel, blocks, rows_smem)
    };
    // The cluster split's and the tile passes' blocks are a tile's 512 threads, the looped
    // kernel's two halves of it.
    let threads_per_row = if cluster || tile_pass {
        RMSNORM_BWD_MAX_THREADS_PER_ROW
    } else {
        geometry.threads_per_row
    };
    let rows_launch = Launch {
        kernel,
        grid: grid_u32("rows", grid)?,
        block: threads_per_row * geometry.rows_per_block,
        shared_mem_bytes,
        params: RmsNormBwdParams {
            dy: dy.addr,
            h: h.addr,
            w: w.addr,
            rstd: rstd.addr,
            dres: dres_addr,
            dx: t.dx.addr,
            workspace: ws.addr,
            dy_stride: dy.row_stride as u64,
            h_stride: h.row_stride as u64,
            rstd_stride: rstd.row_stride as u64,
            dres_stride: dres.map_or(0, |m| m.row_stride as u64),
            dx_stride: t.dx.row_stride as u64,
            rows: rows as u64,
            hidden: hidden as u64,
            flags,
            threads_per_row,
            rows_per_block: geometry.rows_per_block,
            // At most 131072 / 32 slots (blocks within 131072 threads of 32 or more per row).
            // The tile passes' walkers: fewer than the `dx` grid's blocks, checked above.
            dw_slots: if fused || cluster_fused {
                slots as u32
            } else if tile_pass {
                tile_walkers as u32
            } else {
                0
            },
            dw: if fused || cluster_fused { t.dw.addr } else { 0 },
        },
    };
    if fused || cluster_fused {
        return Ok(RmsNormBwdPlan {
            sums: None,
            rows: rows_launch,
            dw: None,
        });
    }
    let sums = if tile_pass {
        Some(Launch {
            kernel: KernelId::RmsNormBwdTileSums(dtype, mode),
            grid: grid_u32("rows", rows as u64 * tiles)?,
            block: RMSNORM_BWD_MAX_THREADS_PER_ROW,
            shared_mem_bytes: RMSNORM_SMEM_BYTES,
            params: rows_launch.params,
        })
    } else {
        None
    };
    // With no rows the partials are empty and dw is written as zeros (a sum over no rows).
    let dw_launch = Launch {
        kernel: KernelId::RmsNormDw(w.dtype),
        grid: grid_u32("hidden", (hidden as u64).div_ceil(RMSNORM_DW_COLS as u64))?,
        block: RMSNORM_DW_THREADS,
        shared_mem_bytes: RMSNORM_DW_SMEM_BYTES,
        params: RmsNormDwParams {
            workspace: ws.addr,
            dw: t.dw.addr,
            slots: if tile_pass { tile_walkers } else { slots },
            hidden: hidden as u64,
        },
    };
    Ok(RmsNormBwdPlan {
        sums,
        rows: rows_launch,
        dw: Some(dw_launch),
    })
}

/// Where the forward reads its inputs and writes `y` and `h` (all `[rows, H]` of the storage
/// dtype `T`). Each variant holds exactly the borrows its placement needs: an input that an
/// output overwrites is borrowed `&mut`, so passing one buffer twice does not compile. Since
/// `x + residual` is commutative, "`y` over `residual`" is [`Placement::AddYOverX`] with the
/// two inputs swapped.
pub enum Placement<'r, 'a, T: Element> {
    /// Plain RMSNorm, no residual and no `h`: `y = x * rstd * w`.
    Norm {
        x: &'r Mat<'a, T>,
        y: &'r mut MatMut<'a, T>,
    },
    /// Plain RMSNorm in place: `x` receives `y`.
    NormInPlace { x: &'r mut MatMut<'a, T> },
    /// `h = x + residual`; `y` and `h` into their own buffers.
    Add {
        x: &'r Mat<'a, T>,
        residual: &'r Mat<'a, T>,
        y: &'r mut MatMut<'a, T>,
        h: &'r mut MatMut<'a, T>,
    },
    /// `h` written over `x` (`x` holds `h` afterwards), `y` into its own buffer.
    AddHOverX {
        x: &'r mut MatMut<'a, T>,
        residual: &'r Mat<'a, T>,
        y: &'r mut MatMut<'a, T>,
    },
    /// `h` written over `residual`, `y` into its own buffer.
    AddHOverResidual {
        x: &'r Mat<'a, T>,
        residual: &'r mut MatMut<'a, T>,
        y: &'r mut MatMut<'a, T>,
    },
    /// `y` written over `x`, `h` into its own buffer.
    AddYOverX {
        x: &'r mut MatMut<'a, T>,
        residual: &'r Mat<'a, T>,
        h: &'r mut MatMut<'a, T>,
    },
    /// vLLM's (`fused_add_rms_norm`) and FlashInfer's (`fused_add_rmsnorm`) convention: `x`
    /// receives `y`, `residual` receives `h`.
    AddInPlace {
        x: &'r mut MatMut<'a, T>,
        residual: &'r mut MatMut<'a, T>,
    },
}

/// Where the backward reads `dy` and the incoming residual gradient `dres` and writes `dx`
/// (all `[rows, H]` of the storage dtype `T`). `dx` is the gradient of both `x` and
/// `residual`; `dres`, when given, is added to it. As with [`Placement`], an overwritten
/// input is borrowed `&mut`.
pub enum GradPlacement<'r, 'a, T: Element> {
    /// `dx` into its own buffer.
    Separate {
        dy: &'r Mat<'a, T>,
        dres: Option<&'r Mat<'a, T>>,
        dx: &'r mut MatMut<'a, T>,
    },
    /// `dx` written over `dy`.
    DxOverDy {
        dy: &'r mut MatMut<'a, T>,
        dres: Option<&'r Mat<'a, T>>,
    },
    /// Accumulates into the residual stream's gradient: `dres` holds the incoming gradient
    /// and receives `dx`.
    Accumulate {
        dy: &'r Mat<'a, T>,
        dres: &'r mut MatMut<'a, T>,
    },
}

/// What the backward reads from the forward: the stored `h` (`x` for plain RMSNorm), each
/// row's `rstd` (`[rows, 1]` f32) and the weight (`[1, H]`, the storage dtype or f32).
#[derive(Clone, Copy)]
pub struct SavedForward<'r, 'a, T: Element, W: Element> {
    pub h: &'r Mat<'a, T>,
    pub rstd: &'r Mat<'a, f32>,
    pub weight: &'r Mat<'a, W>,
}

/// Up to four views described for one launch; each guard records its view's access on the
/// stream when dropped, after the launch.
type Guards<'s> = [Option<SyncOnDrop<'s>>; 4];

/// The `[rows, H]` operands of a forward call, described.
struct FwdIo {
    x: MatDesc,
    residual: Option<MatDesc>,
    y: MatDesc,
    h: Option<MatDesc>,
}

impl<'r, 'a, T: Element> Placement<'r, 'a, T> {
    /// Each view with its name, for the device check.
    fn views(&self) -> [Option<(&'static str, &CudaStream)>; 4] {
        let s = |name, stream| Some((name, stream));
        match self {
            Placement::Norm { x, y } => [s("x", x.stream()), s("y", y.stream()), None, None],
            Placement::NormInPlace { x } => [s("x", x.stream()), None, None, None],
            Placement::Add { x, residual, y, h } => [
                s("x", x.stream()),
                s("residual", residual.stream()),
                s("y", y.stream()),
                s("h", h.stream()),
            ],
            Placement::AddHOverX { x, residual, y } => [
                s("x", x.stream()),
                s("residual", residual.stream()),
                s("y", y.stream()),
                None,
            ],
            Placement::AddHOverResidual { x, residual, y } => [
                s("x", x.stream()),
                s("residual", residual.stream()),
                s("y", y.stream()),
                None,
            ],
            Placement::AddYOverX { x, residual, h } => [
                s("x", x.stream()),
                s("residual", residual.stream()),
                s("h", h.stream()),
                None,
            ],
            Placement::AddInPlace { x, residual } => [
                s("x", x.stream()),
                s("residual", residual.stream()),
                None,
                None,
            ],
        }
    }

    /// The operands as raw descriptions on `stream`: an overwritten input is described once,
    /// as the output it becomes.
    fn describe<'s>(self, stream: &'s CudaStream) -> (FwdIo, Guards<'s>)
    where
        'r: 's,
    {
        match self {
            Placement::Norm { x, y } => {
                let (x, gx) = x.desc(stream);
                let (y, gy) = y.desc_mut(stream);
                let io = FwdIo {
                    x,
                    residual: None,
                    y,
                    h: None,
                };
                (io, [Some(gx), Some(gy), None, None])
            }
            Placement::NormInPlace { x } => {
                let (x, gx) = x.desc_mut(stream);
                let io = FwdIo {
                    x,
                    residual: None,
                    y: x,
                    h: None,
                };
                (io, [Some(gx), None, None, None])
            }
            Placement::Add { x, residual, y, h } => {
                let (x, gx) = x.desc(stream);
                let (r, gr) = residual.desc(stream);
                let (y, gy) = y.desc_mut(stream);
                let (h, gh) = h.desc_mut(stream);
                let io = FwdIo {
                    x,
                    residual: Some(r),
                    y,
                    h: Some(h),
                };
                (io, [Some(gx), Some(gr), Some(gy), Some(gh)])
            }
            Placement::AddHOverX { x, residual, y } => {
                let (x, gx) = x.desc_mut(stream);
                let (r, gr) = residual.desc(stream);
                let (y, gy) = y.desc_mut(stream);
                let io = FwdIo {
                    x,
                    residual: Some(r),
                    y,
                    h: Some(x),
                };
                (io, [Some(gx), Some(gr), Some(gy), None])
            }
            Placement::AddHOverResidual { x, residual, y } => {
                let (x, gx) = x.desc(stream);
                let (r, gr) = residual.desc_mut(stream);
                let (y, gy) = y.desc_mut(stream);
                let io = FwdIo {
                    x,
                    residual: Some(r),
                    y,
                    h: Some(r),
                };
                (io, [Some(gx), Some(gr), Some(gy), None])
            }
            Placement::AddYOverX { x, residual, h } => {
                let (x, gx) = x.desc_mut(stream);
                let (r, gr) = residual.desc(stream);
                let (h, gh) = h.desc_mut(stream);
                let io = FwdIo {
                    x,
                    residual: Some(r),
                    y: x,
                    h: Some(h),
                };
                (io, [Some(gx), Some(gr), Some(gh), None])
            }
            Placement::AddInPlace { x, residual } => {
                let (x, gx) = x.desc_mut(stream);
                let (r, gr) = residual.desc_mut(stream);
                let io = FwdIo {
                    x,
                    residual: Some(r),
                    y: x,
                    h: Some(r),
                };
                (io, [Some(gx), Some(gr), None, None])
            }
        }
    }
}

/// The `[rows, H]` operands of a backward call, described.
struct BwdIo {
    dy: MatDesc,
    dres: Option<MatDesc>,
    dx: MatDesc,
}

impl<'r, 'a, T: Element> GradPlacement<'r, 'a, T> {
    /// Each view with its name, for the device check.
    fn views(&self) -> [Option<(&'static str, &CudaStream)>; 3] {
        let s = |name, stream| Some((name, stream));
        match self {
            GradPlacement::Separate { dy, dres, dx } => [
                s("dy", dy.stream()),
                dres.and_then(|d| s("dres", d.stream())),
                s("dx", dx.stream()),
            ],
            GradPlacement::DxOverDy { dy, dres } => [
                s("dy", dy.stream()),
                dres.and_then(|d| s("dres", d.stream())),
                None,
            ],
            GradPlacement::Accumulate { dy, dres } => {
                [s("dy", dy.stream()), s("dres", dres.stream()), None]
            }
        }
    }

    /// As [`Placement::describe`].
    fn describe<'s>(self, stream: &'s CudaStream) -> (BwdIo, Guards<'s>)
    where
        'r: 's,
    {
        match self {
            GradPlacement::Separate { dy, dres, dx } => {
                let (dy, gy) = dy.desc(stream);
                let (dres, gr) = dres.map(|d| d.desc(stream)).unzip();
                let (dx, gx) = dx.desc_mut(stream);
                (BwdIo { dy, dres, dx }, [Some(gy), gr, Some(gx), None])
            }
            GradPlacement::DxOverDy { dy, dres } => {
                let (dy, gy) = dy.desc_mut(stream);
                let (dres, gr) = dres.map(|d| d.desc(stream)).unzip();
                (BwdIo { dy, dres, dx: dy }, [Some(gy), gr, None, None])
            }
            GradPlacement::Accumulate { dy, dres } => {
                let (dy, gy) = dy.desc(stream);
                let (dres, gr) = dres.desc_mut(stream);
                let io = BwdIo {
                    dy,
                    dres: Some(dres),
                    dx: dres,
                };
                (io, [Some(gy), Some(gr), None, None])
            }
        }
    }
}

impl Kernels {
    /// RMSNorm forward, with or without the residual add, in the placement `io` names:
    /// `h = x + residual` (f32), `y = h * rstd * w` with `rstd = 1 / sqrt(mean(h^2) + eps)`.
    /// `rstd` (f32, `[rows, 1]`) receives each row's `rstd` when given (for the backward).
    ///
    /// ```no_run
    /// # use ferrofuse::{Kernels, Mat, MatMut, RmsNormOptions, norm::Placement};
    /// # fn f(kernels: &Kernels, stream: &ferrofuse::cudarc::driver::CudaStream,
    /// #      x: &mut ferrofuse::cudarc::driver::CudaSlice<half::bf16>,
    /// #      residual: &mut ferrofuse::cudarc::driver::CudaSlice<half::bf16>,
    /// #      weight: &ferrofuse::cudarc::driver::CudaSlice<half::bf16>) -> ferrofuse::Result<()> {
    /// let (tokens, hidden) = (16, 4096);
    /// kernels.rmsnorm(
    ///     stream,
    ///     Placement::AddInPlace {
    ///         x: &mut MatMut::new(x.as_view_mut(), tokens, hidden), // receives y
    ///         residual: &mut MatMut::new(residual.as_view_mut(), tokens, hidden), // receives h
    ///     },
    ///     &Mat::new(weight.as_view(), 1, hidden),
    ///     None,
    ///     &RmsNormOptions::new(1e-5),
    /// )
    /// # }
    /// ```
    pub fn rmsnorm<T: Element, W: Element>(
        &self,
        stream: &CudaStream,
        io: Placement<'_, '_, T>,
        weight: &Mat<W>,
        rstd: Option<&mut MatMut<f32>>,
        opts: &RmsNormOptions,
    ) -> Result<()> {
        self.check_views(stream, &[("weight", weight.stream())])?;
        for (name, view) in io.views().into_iter().flatten() {
            check_devices(stream, &[(name, view)])?;
        }
        let (rstd, _gs) = optional_desc_mut(stream, "rstd", rstd)?;
        let (weight, _gw) = weight.desc(stream);
        let (io, _guards) = io.describe(stream);
        let t = RmsNormFwdDescs {
            x: io.x,
            residual: io.residual,
            weight,
            y: io.y,
            h: io.h,
            rstd,
        };
        let launch = plan_rmsnorm_forward(&t, opts, &self.norm_limits())?;
        // SAFETY: live views borrowed for this call. Outputs are `&mut` borrows and inputs
        // shared ones, so an output can alias nothing but the input it replaces in its
        // placement (exactly, read before written element by element); the plan re-checks.
        unsafe { self.launch(stream, &launch) }
    }

    /// Forward on raw device matrices (tensors owned by another framework); the storage dtype
    /// is `x`'s. Placement and aliasing as in [`plan_rmsnorm_forward`].
    ///
    /// # Safety
    /// Each description must be true: `addr` a device address in this context with `len`
    /// elements of `dtype` behind it, alive until the kernel has run, and not written by other
    /// work ordered concurrently with `stream`.
    pub unsafe fn rmsnorm_raw(
        &self,
        stream: &CudaStream,
        t: &RmsNormFwdDescs,
        opts: &RmsNormOptions,
    ) -> Result<()> {
        self.check_stream(stream)?;
        let launch = plan_rmsnorm_forward(t, opts, &self.norm_limits())?;
        // SAFETY: the caller vouches for the descriptions; the plan checked shapes, sizes,
        // alignment and aliasing.
        unsafe { self.launch(stream, &launch) }
    }

    /// RMSNorm backward: `dx` (the gradient of both `x` and `residual`) in the placement
    /// `grads` names, and `dw` (`[1, H]`, the weight's dtype), from `dy` and what the forward
    /// saved. `workspace` needs [`rmsnorm_backward_workspace_len`] f32s. Of `opts` only `gemma`
    /// matters: the backward is the f32 derivative whatever the forward's numerics, and `rstd`
    /// already holds `eps`.
    pub fn rmsnorm_backward<T: Element, W: Element>(
        &self,
        stream: &CudaStream,
        grads: GradPlacement<'_, '_, T>,
        saved: SavedForward<'_, '_, T, W>,
        dw: &mut MatMut<W>,
        workspace: &mut impl DevicePtrMut<f32>,
        opts: &RmsNormOptions,
    ) -> Result<()> {
        self.check_views(
            stream,
            &[
                ("h", saved.h.stream()),
                ("weight", saved.weight.stream()),
                ("rstd", saved.rstd.stream()),
                ("dw", dw.stream()),
                ("workspace", DeviceSlice::stream(workspace)),
            ],
        )?;
        for (name, view) in grads.views().into_iter().flatten() {
            check_devices(stream, &[(name, view)])?;
        }
        let (h, _gh) = saved.h.desc(stream);
        let (weight, _gw) = saved.weight.desc(stream);
        let (rstd, _gs) = saved.rstd.desc(stream);
        let (dw, _gd) = dw.desc_mut(stream);
        let (workspace, _gk) = workspace_desc(workspace, stream);
        let (io, _guards) = grads.describe(stream);
        let t = RmsNormBwdDescs {
            dy: io.dy,
            h,
            weight,
            rstd,
            dres: io.dres,
            dx: io.dx,
            dw,
            workspace,
        };
        // SAFETY: as in `rmsnorm`: outputs (dx, dw, workspace) are `&mut` borrows, dx aliases
        // at most the gradient input it replaces in its placement.
        unsafe { self.run_rmsnorm_backward(stream, &t, opts) }
    }

    /// Backward on raw device matrices; the storage dtype is `dy`'s. Aliasing as in
    /// [`plan_rmsnorm_backward`].
    ///
    /// # Safety
    /// As for [`Kernels::rmsnorm_raw`].
    pub unsafe fn rmsnorm_backward_raw(
        &self,
        stream: &CudaStream,
        t: &RmsNormBwdDescs,
        opts: &RmsNormOptions,
    ) -> Result<()> {
        self.check_stream(stream)?;
        // SAFETY: the caller vouches for the descriptions; the plan checks the rest.
        unsafe { self.run_rmsnorm_backward(stream, t, opts) }
    }

    /// # Safety
    /// As for [`Kernels::rmsnorm_raw`].
    unsafe fn run_rmsnorm_backward(
        &self,
        stream: &CudaStream,
        t: &RmsNormBwdDescs,
        opts: &RmsNormOptions,
    ) -> Result<()> {
        // Every launch is planned (validated) before the first runs.
        let max_cluster = self.norm_limits().max_cluster_blocks();
        let plan = plan_rmsnorm_backward_with(
            t,
            opts,
            self.fused_backward(),
            max_cluster,
            self.tile_passes(),
        )?;
        // SAFETY: caller's contract; the plan checked shapes, sizes, alignment, aliasing. The
        // rows launch reads the tile sums the sums launch wrote, the dw launch the partials
        // the rows launch wrote: same stream, in order.
        unsafe {
            if let Some(sums) = &plan.sums {
                self.launch(stream, sums)?;
            }
            self.launch(stream, &plan.rows)?;
            match &plan.dw {
                Some(dw) => self.launch(stream, dw),
                None => Ok(()),
            }
        }
    }
}

/// An optional output view: checked to be on `stream`'s device, then described for the
/// launch, with the write recorded.
fn optional_desc_mut<'s, T: Element>(
    stream: &'s CudaStream,
    name: &'static str,
    m: Option<&'s mut MatMut<'_, T>>,
) -> Result<(Option<MatDesc>, Option<SyncOnDrop<'s>>)> {
    let Some(m) = m else {
        return Ok((None, None));
    };
    check_devices(stream, &[(name, m.stream())])?;
    let (desc, guard) = m.desc_mut(stream);
    Ok((Some(desc), Some(guard)))
}

/// The workspace as a flat f32 matrix, with the write recorded on `stream`.
fn workspace_desc<'s>(
    ws: &'s mut impl DevicePtrMut<f32>,
    stream: &'s CudaStream,
) -> (MatDesc, SyncOnDrop<'s>) {
    let len = ws.len();
    let (addr, guard) = ws.device_ptr_mut(stream);
    (MatDesc::contiguous(addr, len, DType::F32, 1, len), guard)
}
