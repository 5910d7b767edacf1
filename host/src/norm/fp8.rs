//! Add + RMSNorm with an FP8 E4M3 output `y` (`h` stays in the storage dtype: it is the
//! residual stream): `y_q = e4m3(y / scale)` with `y` the f32 value the storage-dtype forward
//! rounds (same geometry and reduction order, so the same bits), the scale static, per token
//! or per group ([`Fp8Scaling`], see [`crate::fp8`]).
//!
//! The vLLM equivalents: `fused_add_rms_norm_static_fp8_quant` is
//! [`Fp8Placement::AddHOverResidual`] with [`Fp8Scaling::Static`];
//! `rms_norm_dynamic_per_token_quant` is [`Fp8Placement::Norm`] or
//! [`Fp8Placement::AddHOverResidual`] with [`Fp8Scaling::PerToken`] (its `scale_ub` too); a
//! norm followed by the per-token-group quantisation is [`Fp8Scaling::PerGroup`].
//!
//! Batch invariance holds for `y_q` and the scales: a row's bytes and scale depend on that
//! row only (the per-token maximum is a fixed-order reduction over the row, a group's over the
//! lanes that hold it). Rows of any length: longer rows than 16384 elements take the looped
//! geometry, whose `y` is the looped storage-dtype forward's (normalised from `h` as stored,
//! see [`super`]); per token they read `h` back twice (once for the row's maximum). On sm_90,
//! rows of up to 8 tiles at few rows (off the 16-byte grid at any number of rows, realigned)
//! are split over a thread-block cluster instead, a block per tile, with the looped kernel's
//! bits (`split_clusters`); up to a row per two multiprocessors the looped kernel issues each
//! tile's loads while it works on the one before (`loop_ahead`, the same bits).

use cudarc::driver::CudaStream;
use ferrofuse_common::fp8::{FP8_PER_GROUP, FP8_PER_TOKEN, FP8_STATIC};
use ferrofuse_common::{
    DType, KernelId, NormFwdVariant, NormPath, RMSNORM_LOOP_SMEM_BYTES, RMSNORM_SMEM_BYTES,
    RMSNORM_SPLIT_MAX_CLUSTER, RMSNORM_SPLIT_SMEM_BYTES, RMSNORM_STREAM_SMEM_BYTES,
    RmsNormFp8Params, VecMode, rmsnorm_fwd_geometry, rmsnorm_realigned_fits,
    rmsnorm_realigned_smem_bytes, rmsnorm_split_geometry, rmsnorm_split_smem_bytes,
};

use super::{
    ForwardOperands, LOOP_AHEAD_SMS_PER_ROW, RmsNormOptions, grid_u32, optional_desc_mut,
    streamed_forward,
};
use crate::error::Result;
use crate::fp8::{F8E4M3, Fp8Scales, Fp8Scaling, ScaleLayout, check_fp8_output};
use crate::runtime::{GridLimits, Kernels, Launch};
use crate::tensor::{Element, Mat, MatDesc, MatMut};
use crate::validate::{check_devices, vec_mode};

/// The operands of an FP8 forward call as raw device matrices: `x`, `residual`, `h` `[rows,
/// H]` of the storage dtype (`residual` and `h` both given or both absent), `weight` `[1, H]`
/// (storage dtype or f32), `rstd` `[rows, 1]` f32 (optional), `y` `[rows, H]` of
/// [`DType::F8E4M3`](crate::DType::F8E4M3), `scales` f32 of [`Fp8Scaling::scale_shape`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RmsNormFp8Descs {
    pub x: MatDesc,
    pub residual: Option<MatDesc>,
    pub weight: MatDesc,
    pub h: Option<MatDesc>,
    pub rstd: Option<MatDesc>,
    pub y: MatDesc,
    pub scales: MatDesc,
}

/// Validates an FP8 forward call and decides its launch; needs no GPU. The storage dtype is
/// `x`'s.
///
/// Checks as [`super::plan_rmsnorm_forward`] for `x`, `residual`, `h`, `weight`, `rstd` (`h`
/// may be exactly `x` or exactly `residual`), then `y` and `scales` as every FP8 output
/// ([`crate::fp8`]: dtype, shape, sizes; they overlap no operand and each other). `limits`
/// only picks between kernels that compute the same bits: rows of 32 elements per thread on
/// the vector path are streamed through shared memory past one wave of them (sm_90).
pub fn plan_rmsnorm_forward_fp8(
    t: &RmsNormFp8Descs,
    opts: &RmsNormOptions,
    scaling: Fp8Scaling,
    limits: &GridLimits,
) -> Result<Launch<RmsNormFp8Params>> {
    let ops = ForwardOperands::of(&t.x, &t.residual, &t.h, &t.weight, &t.rstd);
    ops.check(opts, None)?;
    let (x, residual, h, w) = (&t.x, ops.residual, ops.h, &t.weight);
    let dtype = x.dtype;
    let (rows, hidden) = x.shape();
    let mut operands = vec![("x", x), ("weight", w)];
    operands.extend(residual.map(|m| ("residual", m)));
    operands.extend(h.map(|m| ("h", m)));
    operands.extend(ops.rstd.map(|m| ("rstd", m)));
    check_fp8_output(&t.y, &t.scales, &scaling, (rows, hidden), &operands)?;

    let (variant, geometry) = rmsnorm_fwd_geometry(dtype, hidden as u64);
    let mode = vec_mode(dtype, hidden, &[Some(x), residual, h, Some(w), Some(&t.y)]);
    let grid = if rows == 0 || hidden == 0 {
        0
    } else {
        grid_u32(
            "rows",
            (rows as u64).div_ceil(geometry.rows_per_block as u64),
        )?
    };
    let scales = &t.scales;
    let lanes = dtype.lanes_per_16b();
    let (scheme, min_scale, scale_ub, group_lanes) = match scaling {
        Fp8Scaling::Static => (FP8_STATIC, 1.0, f32::INFINITY, 1),
        Fp8Scaling::PerToken {
            min_scale,
            scale_ub,
        } => (
            FP8_PER_TOKEN,
            min_scale,
            scale_ub.unwrap_or(f32::INFINITY),
            1,
        ),
        // A group of 64 or 128 columns is 8-32 whole chunks (the row length is a multiple of
        // the group, checked with the scales' shape).
        Fp8Scaling::PerGroup {
            group, min_scale, ..
        } => (FP8_PER_GROUP, min_scale, f32::INFINITY, group / lanes),
    };
    let (scale_row, scale_group) = match scaling {
        Fp8Scaling::PerGroup {
            layout: ScaleLayout::ColMajor,
            ..
        } => (1, scales.row_stride as u64),
        Fp8Scaling::PerGroup { .. } => (scales.row_stride as u64, 1),
        _ => (scales.row_stride as u64, 0),
    };
    // Off the vector grid, 16-bit dtypes, the realigned kernel where the storage-dtype forward
    // would take it (its geometry's staging fits, the weight 16-byte aligned): the same bits
    // as the scalar kernel, with 16-byte loads and word stores. For f32 rows the scalar
    // kernel was as fast or faster (`bench/TUNING.md`, "The FP8 kernels off the grid
    // realigned, measured").
    let w_f32 = w.dtype == DType::F32;
    let looped = variant == NormFwdVariant::Loop;
    let realigned = mode == VecMode::Scalar
        && dtype.size_bytes() == 2
        && !looped
        && rmsnorm_realigned_fits(dtype, hidden as u64, w_f32)
        && w.addr % 16 == 0;
    let stream = KernelId::RmsNormFp8Stream(dtype, scheme);
    let split = split_clusters(dtype, mode, w.addr % 16 == 0, hidden, rows, limits);
    let (kernel, grid, shared_mem_bytes) = match split {
        Some((cluster, path, smem)) => (
            KernelId::RmsNormFp8Split(dtype, path, scheme),
            grid_u32("rows", rows as u64 * cluster as u64)?,
            smem,
        ),
        None => match streamed_forward(stream, mode, variant, rows, limits) {
            Some(blocks) => (stream, blocks, RMSNORM_STREAM_SMEM_BYTES),
            None if realigned => (
                KernelId::RmsNormFp8Realigned(dtype, variant, scheme),
                grid,
                rmsnorm_realigned_smem_bytes(&geometry, dtype, w_f32),
            ),
            None if looped && loop_ahead(rows, limits) => (
                KernelId::RmsNormFp8LoopAhead(dtype, mode, scheme),
                grid,
                RMSNORM_LOOP_SMEM_BYTES,
            ),
            None => (
                KernelId::RmsNormFp8(dtype, mode, variant, scheme),
                grid,
                if looped {
                    RMSNORM_LOOP_SMEM_BYTES
                } else {
                    RMSNORM_SMEM_BYTES
                },
            ),
        },
    };
    Ok(Launch {
        kernel,
        grid,
        block: geometry.block_threads(),
        shared_mem_bytes,
        params: RmsNormFp8Params {
            norm: ops.params(&t.y, opts, &geometry),
            scale: scales.addr,
            scale_row,
            scale_group,
            min_scale,
            scale_ub,
            scheme,
            group_shift: group_lanes.trailing_zeros(),
            group_lanes: group_lanes as u32,
            _pad: 0,
        },
    })
}

/// The split FP8 forward's cluster size, memory path and shared memory, where it applies: looped
/// rows of at most [`RMSNORM_SPLIT_MAX_CLUSTER`] tiles, or
/// [`RMSNORM_SPLIT_MAX_WIDE_CLUSTER`](ferrofuse_common::RMSNORM_SPLIT_MAX_WIDE_CLUSTER) where the
/// device runs clusters of that size (`limits.wide_clusters`), one tile per block, on a device with
/// clusters, as the storage-dtype forward splits them (which also splits up to 16 tiles two per
/// block without the wide clusters). On the vector and scalar paths at most a row per two
/// multiprocessors, and for rows of fewer than [`RMSNORM_SPLIT_MAX_CLUSTER`] tiles at most three
/// blocks per two multiprocessors: below, one block per row leaves most of the GPU idle (on an H100
/// the split was 1.1-4.1x faster than the looped kernel at 1-64 rows of 18432-65536 bf16 elements,
/// `bench/TUNING.md`, "The FP8 norm's long rows split over a cluster", and 1.07-5.8x at 1-66 rows
/// of 9-16 tiles but for 0.92x static at 64 rows of 13, "The FP8 norm's rows of 9-16 tiles in
/// clusters of 16"); above, the clusters no longer all fit at once and the loads-ahead looped
/// kernel ([`loop_ahead`]) is faster (on an H100 at 64 rows of 4 tiles, 256 blocks, 1.15-1.36x in
/// graph replay, while at 64 rows of 3 tiles, 192 blocks, and 48 of 4 the split stayed 5-15% ahead:
/// "The FP8 norm's looped rows with their loads ahead"). Off the 16-byte grid, 16-bit rows with a
/// 16-byte aligned weight take the realigned path at any number of rows, as the storage-dtype
/// forward's rows without a looped realigned kernel do: the alternative is the looped kernel's
/// scalar path, element by element. The split computes the looped kernel's bits, so the choice by
/// `rows` keeps batch invariance.
fn split_clusters(
    dtype: DType,
    mode: VecMode,
    w_aligned: bool,
    hidden: usize,
    rows: usize,
    limits: &GridLimits,
) -> Option<(u32, NormPath, u32)> {
    let sms = limits.sm_count as u64;
    let Some((NormFwdVariant::E16, cluster)) =
        rmsnorm_split_geometry(dtype, hidden as u64, limits.wide_clusters)
    else {
        return None;
    };
    let realigned = rmsnorm_split_smem_bytes(dtype, NormPath::Realigned, NormFwdVariant::E16)
        .filter(|_| mode == VecMode::Scalar && dtype.size_bytes() == 2 && w_aligned);
    let (path, smem, takes) = match realigned {
        Some(bytes) => (NormPath::Realigned, bytes, true),
        None => {
            let path = NormPath::of(mode);
            let blocks = rows as u64 * cluster as u64;
            let takes = rows as u64 * 2 <= sms
                && (cluster as u64 >= RMSNORM_SPLIT_MAX_CLUSTER || blocks * 2 <= sms * 3);
            (path, RMSNORM_SPLIT_SMEM_BYTES, takes)
        }
    };
    (limits.clusters && rows > 0 && takes).then_some((cluster, path, smem))
}

/// Whether looped rows the split does not take run the loads-ahead kernel: in calls of at most
/// one row per [`LOOP_AHEAD_SMS_PER_ROW`] multiprocessors, as the storage-dtype forward's
/// looped rows (the same bits as the looped kernel).
fn loop_ahead(rows: usize, limits: &GridLimits) -> bool {
    limits.loop_ahead && rows as u64 * LOOP_AHEAD_SMS_PER_ROW <= limits.sm_count as u64
}

/// Where the FP8 forward reads its inputs and writes `h` (all `[rows, H]` of the storage
/// dtype `T`); `y` is always a buffer of its own (FP8). An input that `h` overwrites is
/// borrowed `&mut`.
pub enum Fp8Placement<'r, 'a, T: Element> {
    /// Plain RMSNorm of `x`, no residual and no `h`.
    Norm { x: &'r Mat<'a, T> },
    /// `h = x + residual` into its own buffer.
    Add {
        x: &'r Mat<'a, T>,
        residual: &'r Mat<'a, T>,
        h: &'r mut MatMut<'a, T>,
    },
    /// `h` written over `x`.
    AddHOverX {
        x: &'r mut MatMut<'a, T>,
        residual: &'r Mat<'a, T>,
    },
    /// `h` written over `residual`, the residual stream updated in place (vLLM's
    /// `fused_add_rms_norm_static_fp8_quant`).
    AddHOverResidual {
        x: &'r Mat<'a, T>,
        residual: &'r mut MatMut<'a, T>,
    },
}

impl Kernels {
    /// Add + RMSNorm with FP8 output: `h` (storage dtype) in the placement `io` names, `y`
    /// FP8, `scales` read ([`Fp8Scaling::Static`], `[1, 1]`) or written (per token `[rows,
    /// 1]`, per group `[rows, H / group]` row-major or `[H / group, rows]` column-major),
    /// `rstd` (`[rows, 1]` f32) when given. Rows of any length.
    ///
    /// ```no_run
    /// # use ferrofuse::{Kernels, Mat, MatMut, RmsNormOptions, F8E4M3, Fp8Scaling, Fp8Scales};
    /// # use ferrofuse::norm::Fp8Placement;
    /// # fn f(kernels: &Kernels, stream: &ferrofuse::cudarc::driver::CudaStream,
    /// #      x: &ferrofuse::cudarc::driver::CudaSlice<half::bf16>,
    /// #      residual: &mut ferrofuse::cudarc::driver::CudaSlice<half::bf16>,
    /// #      weight: &ferrofuse::cudarc::driver::CudaSlice<half::bf16>,
    /// #      y: &mut ferrofuse::cudarc::driver::CudaSlice<F8E4M3>,
    /// #      scales: &mut ferrofuse::cudarc::driver::CudaSlice<f32>) -> ferrofuse::Result<()> {
    /// let (tokens, hidden) = (16, 4096);
    /// kernels.rmsnorm_fp8(
    ///     stream,
    ///     Fp8Placement::AddHOverResidual {
    ///         x: &Mat::new(x.as_view(), tokens, hidden),
    ///         residual: &mut MatMut::new(residual.as_view_mut(), tokens, hidden), // receives h
    ///     },
    ///     &Mat::new(weight.as_view(), 1, hidden),
    ///     &mut MatMut::new(y.as_view_mut(), tokens, hidden),
    ///     Fp8Scaling::per_token(),
    ///     Fp8Scales::Write(&mut MatMut::new(scales.as_view_mut(), tokens, 1)),
    ///     None,
    ///     &RmsNormOptions::new(1e-5),
    /// )
    /// # }
    /// ```
    #[allow(clippy::too_many_arguments)]
    pub fn rmsnorm_fp8<T: Element, W: Element>(
        &self,
        stream: &CudaStream,
        io: Fp8Placement<'_, '_, T>,
        weight: &Mat<W>,
        y: &mut MatMut<F8E4M3>,
        scaling: Fp8Scaling,
        scales: Fp8Scales<'_, '_>,
        rstd: Option<&mut MatMut<f32>>,
        opts: &RmsNormOptions,
    ) -> Result<()> {
        self.check_views(stream, &[("weight", weight.stream()), ("y", y.stream())])?;
        let (rstd, _gr) = optional_desc_mut(stream, "rstd", rstd)?;
        let (weight, _gw) = weight.desc(stream);
        let (y, _gy) = y.desc_mut(stream);
        let (scales, _gs) = scales.describe(stream, &scaling)?;
        // Each view's device is checked before it is described (a description records the
        // access on the stream).
        let (x, residual, h, _g) = match io {
            Fp8Placement::Norm { x } => {
                check_devices(stream, &[("x", x.stream())])?;
                let (x, gx) = x.desc(stream);
                (x, None, None, [Some(gx), None, None])
            }
            Fp8Placement::Add { x, residual, h } => {
                check_devices(
                    stream,
                    &[
                        ("x", x.stream()),
                        ("residual", residual.stream()),
                        ("h", h.stream()),
                    ],
                )?;
                let (x, gx) = x.desc(stream);
                let (r, gr) = residual.desc(stream);
                let (h, gh) = h.desc_mut(stream);
                (x, Some(r), Some(h), [Some(gx), Some(gr), Some(gh)])
            }
            Fp8Placement::AddHOverX { x, residual } => {
                check_devices(
                    stream,
                    &[("x", x.stream()), ("residual", residual.stream())],
                )?;
                let (x, gx) = x.desc_mut(stream);
                let (r, gr) = residual.desc(stream);
                (x, Some(r), Some(x), [Some(gx), Some(gr), None])
            }
            Fp8Placement::AddHOverResidual { x, residual } => {
                check_devices(
                    stream,
                    &[("x", x.stream()), ("residual", residual.stream())],
                )?;
                let (x, gx) = x.desc(stream);
                let (r, gr) = residual.desc_mut(stream);
                (x, Some(r), Some(r), [Some(gx), Some(gr), None])
            }
        };
        let t = RmsNormFp8Descs {
            x,
            residual,
            weight,
            h,
            rstd,
            y,
            scales,
        };
        let launch = plan_rmsnorm_forward_fp8(&t, opts, scaling, &self.norm_limits())?;
        // SAFETY: live views borrowed for this call; outputs are `&mut` borrows, so `h`
        // aliases at most the input it replaces in its placement (each chunk read before it is
        // written, by the same thread), and `y`, the written scales and `rstd` alias nothing.
        // The plan re-checks all of it.
        unsafe { self.launch(stream, &launch) }
    }

    /// [`Kernels::rmsnorm_fp8`] on raw device matrices; the storage dtype is `x`'s.
    ///
    /// # Safety
    /// As for [`Kernels::rmsnorm_raw`]; `scales` is read (static) or written (dynamic).
    pub unsafe fn rmsnorm_fp8_raw(
        &self,
        stream: &CudaStream,
        t: &RmsNormFp8Descs,
        scaling: Fp8Scaling,
        opts: &RmsNormOptions,
    ) -> Result<()> {
        self.check_stream(stream)?;
        let launch = plan_rmsnorm_forward_fp8(t, opts, scaling, &self.norm_limits())?;
        // SAFETY: the caller vouches for the descriptions; the plan checked the rest.
        unsafe { self.launch(stream, &launch) }
    }
}
