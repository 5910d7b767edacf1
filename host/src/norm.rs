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
//! # Output placement
//! `y` and `h` go to separate buffers, or `h` overwrites `x` ([`Kernels::add_rmsnorm_h_over_x`])
//! or `residual` ([`Kernels::add_rmsnorm_h_over_residual`]), or `y` overwrites `x`
//! ([`Kernels::add_rmsnorm_y_over_x`]), or both: `x` receives `y` and `residual` receives `h`
//! ([`Kernels::add_rmsnorm_inplace`], the convention of vLLM's `fused_add_rms_norm` and
//! FlashInfer's `fused_add_rmsnorm`). Since `x + residual` is commutative, "y over residual"
//! is the same call with the two inputs swapped. Plain RMSNorm ([`Kernels::rmsnorm`],
//! [`Kernels::rmsnorm_inplace`]) has no residual and no `h`. Every other overlap of an output
//! with anything is rejected with [`Error::Aliasing`].
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
//! same whether it is computed alone or in a batch of any size at any position, whether the
//! 16-byte-vector or the scalar (misaligned) kernel runs, and from one run to the next. `dw`
//! is summed in a fixed order too (per-slot partials, then a column-wise sum), so repeated
//! backward runs give the same bits; no float atomics anywhere.
//!
//! # Backward
//! From `dy`, the saved `h` and `rstd`, and `w` (`g = w * dy`, Gemma `(1 + w) * dy`):
//! `dx = rstd * (g - h * rstd^2 * mean(h * g)) + dres`, the gradient of both `x` and
//! `residual` (so one buffer serves both), where `dres` is the gradient already flowing into
//! the residual stream; and `dw = sum over rows of dy * h * rstd`. The backward is the f32
//! derivative whatever the forward's numerics mode. `dw` takes two launches: per-slot partial
//! sums into a caller-provided f32 workspace ([`rmsnorm_backward_workspace_len`] elements),
//! then a fixed-order column sum.
//!
//! Every safe method validates everything before launching (a rejected call writes nothing);
//! launches allocate nothing and never synchronise, so they can be captured in CUDA graphs.

use cudarc::driver::{CudaStream, DevicePtrMut, DeviceSlice, SyncOnDrop};
use ferrofuse_common::{
    DType, KernelId, NormBwdLayout, RMSNORM_DW_COLS, RMSNORM_DW_SMEM_BYTES, RMSNORM_DW_THREADS,
    RMSNORM_GEMMA, RMSNORM_HF, RMSNORM_SMEM_BYTES, RMSNORM_W_F32, RmsNormBwdParams,
    RmsNormDwParams, RmsNormFwdParams, VecMode, rmsnorm_bwd_geometry, rmsnorm_bwd_layout,
    rmsnorm_fwd_geometry,
};
pub use ferrofuse_common::{NormBwdVariant, NormFwdVariant, NormGeometry};

use crate::error::{Error, Result};
use crate::runtime::{GridLimits, Kernels, Launch};
use crate::tensor::{Element, Mat, MatDesc, MatMut};
use crate::validate::{check_aliasing, check_devices, check_shape, vec_mode};

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

/// The two launches of a backward call, in stream order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RmsNormBwdPlan {
    /// `dx` per row, and the `dw` partials into the workspace.
    pub rows: Launch<RmsNormBwdParams>,
    /// The fixed-order sum of the partials into `dw`.
    pub dw: Launch<RmsNormDwParams>,
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

/// f32 elements the backward's workspace needs for `rows x hidden` of `dtype`.
pub fn rmsnorm_backward_workspace_len(dtype: DType, rows: usize, hidden: usize) -> usize {
    rmsnorm_bwd_layout(dtype, rows as u64, hidden as u64).workspace_len as usize
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

/// The forward kernel for a grid of `blocks`: the w-first form (the weight loaded with the
/// inputs, one L2 round trip less per row) when the 16-per-thread vector kernel runs and the
/// grid fits on the device at once, the w-late form otherwise (it holds fewer registers, so
/// more rows are in flight when there are waves). Both compute the same bits.
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
    } else {
        KernelId::RmsNormFwd(dtype, mode, variant)
    }
}

/// Validates a forward call and decides its launch; needs no GPU.
///
/// Checks: `eps` finite and > 0; every operand's dtype, shape, unit last stride, row stride,
/// buffer size and alignment; `residual` and `h` both given or both absent; the weight the
/// storage dtype or f32; aliasing: `h` may be exactly `x` or exactly `residual`, `y` may be
/// exactly `x`, nothing else overlaps an output. `limits` only picks between kernels that
/// compute the same bits: the w-first form while the grid fits on the device at once, the
/// w-late one otherwise.
pub fn plan_rmsnorm_forward(
    dtype: DType,
    t: &RmsNormFwdDescs,
    opts: &RmsNormOptions,
    limits: &GridLimits,
) -> Result<Launch<RmsNormFwdParams>> {
    check_eps(opts.eps)?;
    let x = &t.x;
    x.check("x", dtype)?;
    let (rows, hidden) = x.shape();
    t.y.check("y", dtype)?;
    check_shape("y", &t.y, (rows, hidden))?;
    match (&t.residual, &t.h) {
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
                value: "missing: with a residual the sum h = x + residual must be stored".into(),
            });
        }
        (None, Some(_)) => {
            return Err(Error::InvalidArgument {
                what: "h",
                value: "given without a residual: plain RMSNorm has no h output".into(),
            });
        }
    }
    check_weight("weight", &t.weight, dtype, hidden)?;
    if let Some(rstd) = &t.rstd {
        rstd.check("rstd", DType::F32)?;
        check_shape("rstd", rstd, (rows, 1))?;
    }
    let (residual, h, rstd, w) = (
        t.residual.as_ref(),
        t.h.as_ref(),
        t.rstd.as_ref(),
        &t.weight,
    );
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
    if let Some(h) = h {
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

    let (variant, geometry) = rmsnorm_fwd_geometry(dtype, hidden as u64);
    let mode = vec_mode(dtype, hidden, &[Some(x), residual, Some(&t.y), h, Some(w)]);
    let grid = if rows == 0 || hidden == 0 {
        0
    } else {
        grid_u32(
            "rows",
            (rows as u64).div_ceil(geometry.rows_per_block as u64),
        )?
    };
    let mut flags = weight_flags(opts.gemma, w.dtype, dtype);
    if opts.numerics == NormNumerics::HfLlama {
        flags |= RMSNORM_HF;
    }
    Ok(Launch {
        kernel: forward_kernel(dtype, mode, variant, grid, limits),
        grid,
        block: geometry.block_threads(),
        shared_mem_bytes: RMSNORM_SMEM_BYTES,
        params: RmsNormFwdParams {
            x: x.addr,
            residual: residual.map_or(0, |m| m.addr),
            w: w.addr,
            y: t.y.addr,
            h: h.map_or(0, |m| m.addr),
            rstd: rstd.map_or(0, |m| m.addr),
            x_stride: x.row_stride as u64,
            residual_stride: residual.map_or(0, |m| m.row_stride as u64),
            y_stride: t.y.row_stride as u64,
            h_stride: h.map_or(0, |m| m.row_stride as u64),
            rstd_stride: rstd.map_or(0, |m| m.row_stride as u64),
            rows: rows as u64,
            hidden: hidden as u64,
            eps: opts.eps,
            flags,
            threads_per_row: geometry.threads_per_row,
            rows_per_block: geometry.rows_per_block,
        },
    })
}

/// Validates a backward call and decides its two launches; needs no GPU.
///
/// Checks every operand as [`plan_rmsnorm_forward`] does; `dw` has the weight's dtype; the
/// workspace is f32 with at least [`rmsnorm_backward_workspace_len`] elements; aliasing: `dx`
/// may be exactly `dy` or exactly `dres`, nothing else overlaps `dx`, `dw` or the workspace.
pub fn plan_rmsnorm_backward(
    dtype: DType,
    t: &RmsNormBwdDescs,
    gemma: bool,
) -> Result<RmsNormBwdPlan> {
    let dy = &t.dy;
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
        ..
    } = layout;
    // The weight and the workspace are one-row operands here (shapes checked above).
    let mode = vec_mode(
        dtype,
        hidden,
        &[Some(dy), Some(h), dres, Some(&t.dx), Some(w), Some(&ws)],
    );
    let flags = weight_flags(gemma, w.dtype, dtype);
    let rows_launch = Launch {
        kernel: KernelId::RmsNormBwd(dtype, mode, variant),
        grid: grid_u32("rows", blocks)?,
        block: geometry.block_threads(),
        shared_mem_bytes: RMSNORM_SMEM_BYTES,
        params: RmsNormBwdParams {
            dy: dy.addr,
            h: h.addr,
            w: w.addr,
            rstd: rstd.addr,
            dres: dres.map_or(0, |m| m.addr),
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
            threads_per_row: geometry.threads_per_row,
            rows_per_block: geometry.rows_per_block,
            _pad: 0,
        },
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
            slots,
            hidden: hidden as u64,
        },
    };
    Ok(RmsNormBwdPlan {
        rows: rows_launch,
        dw: dw_launch,
    })
}

impl Kernels {
    /// Checks the stream and the views' devices, plans, launches.
    ///
    /// # Safety
    /// The descriptions are true and their buffers alive until the kernel has run, with no
    /// aliasing beyond what the plan checks (the safe callers guarantee it with borrows).
    unsafe fn run_rmsnorm_forward(
        &self,
        stream: &CudaStream,
        dtype: DType,
        t: &RmsNormFwdDescs,
        opts: &RmsNormOptions,
    ) -> Result<()> {
        let launch = plan_rmsnorm_forward(dtype, t, opts, self.limits())?;
        // SAFETY: caller's contract; the plan checked shapes, sizes, alignment, aliasing.
        unsafe { self.launch(stream, &launch) }
    }

    /// `h = x + residual`, `y = rmsnorm(h) * w`, into separate `y` and `h`; `rstd` (f32,
    /// `[rows, 1]`) receives each row's `1 / sqrt(mean(h^2) + eps)` when given.
    #[allow(clippy::too_many_arguments)]
    pub fn add_rmsnorm<T: Element, W: Element>(
        &self,
        stream: &CudaStream,
        x: &Mat<T>,
        residual: &Mat<T>,
        weight: &Mat<W>,
        y: &mut MatMut<T>,
        h: &mut MatMut<T>,
        rstd: Option<&mut MatMut<f32>>,
        opts: &RmsNormOptions,
    ) -> Result<()> {
        self.check_views(
            stream,
            &[
                ("x", x.stream()),
                ("residual", residual.stream()),
                ("weight", weight.stream()),
                ("y", y.stream()),
                ("h", h.stream()),
            ],
        )?;
        let (rstd, _gs) = optional_desc_mut(stream, "rstd", rstd)?;
        let (x, _gx) = x.desc(stream);
        let (residual, _gr) = residual.desc(stream);
        let (weight, _gw) = weight.desc(stream);
        let (y, _gy) = y.desc_mut(stream);
        let (h, _gh) = h.desc_mut(stream);
        let t = RmsNormFwdDescs {
            x,
            residual: Some(residual),
            weight,
            y,
            h: Some(h),
            rstd,
        };
        // SAFETY: live views borrowed for this call; the outputs are borrowed mutably while
        // the inputs are borrowed shared, so they cannot alias (the plan re-checks anyway).
        unsafe { self.run_rmsnorm_forward(stream, T::DTYPE, &t, opts) }
    }

    /// As [`Kernels::add_rmsnorm`], with `h` written over `x` (`x` holds `h` afterwards).
    #[allow(clippy::too_many_arguments)]
    pub fn add_rmsnorm_h_over_x<T: Element, W: Element>(
        &self,
        stream: &CudaStream,
        x: &mut MatMut<T>,
        residual: &Mat<T>,
        weight: &Mat<W>,
        y: &mut MatMut<T>,
        rstd: Option<&mut MatMut<f32>>,
        opts: &RmsNormOptions,
    ) -> Result<()> {
        self.check_views(
            stream,
            &[
                ("x", x.stream()),
                ("residual", residual.stream()),
                ("weight", weight.stream()),
                ("y", y.stream()),
            ],
        )?;
        let (rstd, _gs) = optional_desc_mut(stream, "rstd", rstd)?;
        let (x, _gx) = x.desc_mut(stream);
        let (residual, _gr) = residual.desc(stream);
        let (weight, _gw) = weight.desc(stream);
        let (y, _gy) = y.desc_mut(stream);
        let t = RmsNormFwdDescs {
            x,
            residual: Some(residual),
            weight,
            y,
            h: Some(x),
            rstd,
        };
        // SAFETY: as in `add_rmsnorm`; h is exactly x, read before written element by element.
        unsafe { self.run_rmsnorm_forward(stream, T::DTYPE, &t, opts) }
    }

    /// As [`Kernels::add_rmsnorm`], with `h` written over `residual`.
    #[allow(clippy::too_many_arguments)]
    pub fn add_rmsnorm_h_over_residual<T: Element, W: Element>(
        &self,
        stream: &CudaStream,
        x: &Mat<T>,
        residual: &mut MatMut<T>,
        weight: &Mat<W>,
        y: &mut MatMut<T>,
        rstd: Option<&mut MatMut<f32>>,
        opts: &RmsNormOptions,
    ) -> Result<()> {
        self.check_views(
            stream,
            &[
                ("x", x.stream()),
                ("residual", residual.stream()),
                ("weight", weight.stream()),
                ("y", y.stream()),
            ],
        )?;
        let (rstd, _gs) = optional_desc_mut(stream, "rstd", rstd)?;
        let (x, _gx) = x.desc(stream);
        let (residual, _gr) = residual.desc_mut(stream);
        let (weight, _gw) = weight.desc(stream);
        let (y, _gy) = y.desc_mut(stream);
        let t = RmsNormFwdDescs {
            x,
            residual: Some(residual),
            weight,
            y,
            h: Some(residual),
            rstd,
        };
        // SAFETY: as in `add_rmsnorm_h_over_x`, with residual in place of x.
        unsafe { self.run_rmsnorm_forward(stream, T::DTYPE, &t, opts) }
    }

    /// As [`Kernels::add_rmsnorm`], with `y` written over `x` and `h` separate.
    #[allow(clippy::too_many_arguments)]
    pub fn add_rmsnorm_y_over_x<T: Element, W: Element>(
        &self,
        stream: &CudaStream,
        x: &mut MatMut<T>,
        residual: &Mat<T>,
        weight: &Mat<W>,
        h: &mut MatMut<T>,
        rstd: Option<&mut MatMut<f32>>,
        opts: &RmsNormOptions,
    ) -> Result<()> {
        self.check_views(
            stream,
            &[
                ("x", x.stream()),
                ("residual", residual.stream()),
                ("weight", weight.stream()),
                ("h", h.stream()),
            ],
        )?;
        let (rstd, _gs) = optional_desc_mut(stream, "rstd", rstd)?;
        let (x, _gx) = x.desc_mut(stream);
        let (residual, _gr) = residual.desc(stream);
        let (weight, _gw) = weight.desc(stream);
        let (h, _gh) = h.desc_mut(stream);
        let t = RmsNormFwdDescs {
            x,
            residual: Some(residual),
            weight,
            y: x,
            h: Some(h),
            rstd,
        };
        // SAFETY: as in `add_rmsnorm`; y is exactly x, read before written element by element.
        unsafe { self.run_rmsnorm_forward(stream, T::DTYPE, &t, opts) }
    }

    /// vLLM's and FlashInfer's in-place convention: `x` receives `y`, `residual` receives `h`.
    pub fn add_rmsnorm_inplace<T: Element, W: Element>(
        &self,
        stream: &CudaStream,
        x: &mut MatMut<T>,
        residual: &mut MatMut<T>,
        weight: &Mat<W>,
        rstd: Option<&mut MatMut<f32>>,
        opts: &RmsNormOptions,
    ) -> Result<()> {
        self.check_views(
            stream,
            &[
                ("x", x.stream()),
                ("residual", residual.stream()),
                ("weight", weight.stream()),
            ],
        )?;
        let (rstd, _gs) = optional_desc_mut(stream, "rstd", rstd)?;
        let (x, _gx) = x.desc_mut(stream);
        let (residual, _gr) = residual.desc_mut(stream);
        let (weight, _gw) = weight.desc(stream);
        let t = RmsNormFwdDescs {
            x,
            residual: Some(residual),
            weight,
            y: x,
            h: Some(residual),
            rstd,
        };
        // SAFETY: x and residual are distinct `&mut` borrows; y is exactly x and h exactly
        // residual, each read before written element by element.
        unsafe { self.run_rmsnorm_forward(stream, T::DTYPE, &t, opts) }
    }

    /// Plain RMSNorm (no residual, no `h`): `y = x * rstd * w`.
    pub fn rmsnorm<T: Element, W: Element>(
        &self,
        stream: &CudaStream,
        x: &Mat<T>,
        weight: &Mat<W>,
        y: &mut MatMut<T>,
        rstd: Option<&mut MatMut<f32>>,
        opts: &RmsNormOptions,
    ) -> Result<()> {
        self.check_views(
            stream,
            &[
                ("x", x.stream()),
                ("weight", weight.stream()),
                ("y", y.stream()),
            ],
        )?;
        let (rstd, _gs) = optional_desc_mut(stream, "rstd", rstd)?;
        let (x, _gx) = x.desc(stream);
        let (weight, _gw) = weight.desc(stream);
        let (y, _gy) = y.desc_mut(stream);
        let t = RmsNormFwdDescs {
            x,
            residual: None,
            weight,
            y,
            h: None,
            rstd,
        };
        // SAFETY: as in `add_rmsnorm`.
        unsafe { self.run_rmsnorm_forward(stream, T::DTYPE, &t, opts) }
    }

    /// Plain RMSNorm in place: `x` receives `y`.
    pub fn rmsnorm_inplace<T: Element, W: Element>(
        &self,
        stream: &CudaStream,
        x: &mut MatMut<T>,
        weight: &Mat<W>,
        rstd: Option<&mut MatMut<f32>>,
        opts: &RmsNormOptions,
    ) -> Result<()> {
        self.check_views(stream, &[("x", x.stream()), ("weight", weight.stream())])?;
        let (rstd, _gs) = optional_desc_mut(stream, "rstd", rstd)?;
        let (x, _gx) = x.desc_mut(stream);
        let (weight, _gw) = weight.desc(stream);
        let t = RmsNormFwdDescs {
            x,
            residual: None,
            weight,
            y: x,
            h: None,
            rstd,
        };
        // SAFETY: as in `add_rmsnorm`; y is exactly x.
        unsafe { self.run_rmsnorm_forward(stream, T::DTYPE, &t, opts) }
    }

    /// Forward on raw device matrices (tensors owned by another framework); the storage dtype
    /// is `x`'s. Placement and aliasing as in [`plan_rmsnorm_forward`].
    ///
    /// # Safety
    /// Each description must be true: `addr` a device address in this context with `len`
    /// elements of `dtype` behind it, alive until the kernel has run, and not written by other
    /// work ordered concurrently with `stream`.
    pub unsafe fn rmsnorm_forward_raw(
        &self,
        stream: &CudaStream,
        t: &RmsNormFwdDescs,
        opts: &RmsNormOptions,
    ) -> Result<()> {
        self.check_stream(stream)?;
        // SAFETY: the caller vouches for the descriptions; the plan checks the rest.
        unsafe { self.run_rmsnorm_forward(stream, t.x.dtype, t, opts) }
    }

    /// # Safety
    /// As for [`Kernels::run_rmsnorm_forward`].
    unsafe fn run_rmsnorm_backward(
        &self,
        stream: &CudaStream,
        dtype: DType,
        t: &RmsNormBwdDescs,
        gemma: bool,
    ) -> Result<()> {
        // Both launches are planned (validated) before either runs.
        let plan = plan_rmsnorm_backward(dtype, t, gemma)?;
        // SAFETY: caller's contract; the plan checked shapes, sizes, alignment, aliasing. The
        // dw launch reads the partials the rows launch wrote: same stream, in order.
        unsafe {
            self.launch(stream, &plan.rows)?;
            self.launch(stream, &plan.dw)
        }
    }

    /// RMSNorm backward: `dx` (the gradient of both `x` and `residual`) and `dw`, from `dy`,
    /// the saved `h` (`x` for plain RMSNorm) and `rstd`, and the weight. `dres`, when given,
    /// is the gradient already flowing into the residual stream and is added to `dx`.
    /// `workspace` needs [`rmsnorm_backward_workspace_len`] f32s; `gemma` as in the forward.
    #[allow(clippy::too_many_arguments)]
    pub fn rmsnorm_backward<T: Element, W: Element>(
        &self,
        stream: &CudaStream,
        dy: &Mat<T>,
        h: &Mat<T>,
        weight: &Mat<W>,
        rstd: &Mat<f32>,
        dres: Option<&Mat<T>>,
        dx: &mut MatMut<T>,
        dw: &mut MatMut<W>,
        workspace: &mut impl DevicePtrMut<f32>,
        gemma: bool,
    ) -> Result<()> {
        self.check_views(
            stream,
            &[
                ("dy", dy.stream()),
                ("h", h.stream()),
                ("weight", weight.stream()),
                ("rstd", rstd.stream()),
                ("dx", dx.stream()),
                ("dw", dw.stream()),
                ("workspace", DeviceSlice::stream(workspace)),
            ],
        )?;
        let (dres, _g5) = optional_desc(stream, "dres", dres)?;
        let (dy, _g1) = dy.desc(stream);
        let (h, _g2) = h.desc(stream);
        let (weight, _g3) = weight.desc(stream);
        let (rstd, _g4) = rstd.desc(stream);
        let (dx, _g6) = dx.desc_mut(stream);
        let (dw, _g7) = dw.desc_mut(stream);
        let (workspace, _g8) = workspace_desc(workspace, stream);
        let t = RmsNormBwdDescs {
            dy,
            h,
            weight,
            rstd,
            dres,
            dx,
            dw,
            workspace,
        };
        // SAFETY: live views borrowed for this call; outputs (dx, dw, workspace) are `&mut`
        // borrows while the inputs are shared ones, so none alias.
        unsafe { self.run_rmsnorm_backward(stream, T::DTYPE, &t, gemma) }
    }

    /// As [`Kernels::rmsnorm_backward`], with `dx` written over `dy`.
    #[allow(clippy::too_many_arguments)]
    pub fn rmsnorm_backward_dx_over_dy<T: Element, W: Element>(
        &self,
        stream: &CudaStream,
        dy: &mut MatMut<T>,
        h: &Mat<T>,
        weight: &Mat<W>,
        rstd: &Mat<f32>,
        dres: Option<&Mat<T>>,
        dw: &mut MatMut<W>,
        workspace: &mut impl DevicePtrMut<f32>,
        gemma: bool,
    ) -> Result<()> {
        self.check_views(
            stream,
            &[
                ("dy", dy.stream()),
                ("h", h.stream()),
                ("weight", weight.stream()),
                ("rstd", rstd.stream()),
                ("dw", dw.stream()),
                ("workspace", DeviceSlice::stream(workspace)),
            ],
        )?;
        let (dres, _g5) = optional_desc(stream, "dres", dres)?;
        let (dy, _g1) = dy.desc_mut(stream);
        let (h, _g2) = h.desc(stream);
        let (weight, _g3) = weight.desc(stream);
        let (rstd, _g4) = rstd.desc(stream);
        let (dw, _g7) = dw.desc_mut(stream);
        let (workspace, _g8) = workspace_desc(workspace, stream);
        let t = RmsNormBwdDescs {
            dy,
            h,
            weight,
            rstd,
            dres,
            dx: dy,
            dw,
            workspace,
        };
        // SAFETY: as in `rmsnorm_backward`; dx is exactly dy, read before written.
        unsafe { self.run_rmsnorm_backward(stream, T::DTYPE, &t, gemma) }
    }

    /// As [`Kernels::rmsnorm_backward`], accumulating into the residual stream's gradient:
    /// `dres` holds the incoming gradient and receives `dx` (`dx = dh + dres`).
    #[allow(clippy::too_many_arguments)]
    pub fn rmsnorm_backward_accumulate<T: Element, W: Element>(
        &self,
        stream: &CudaStream,
        dy: &Mat<T>,
        h: &Mat<T>,
        weight: &Mat<W>,
        rstd: &Mat<f32>,
        dres: &mut MatMut<T>,
        dw: &mut MatMut<W>,
        workspace: &mut impl DevicePtrMut<f32>,
        gemma: bool,
    ) -> Result<()> {
        self.check_views(
            stream,
            &[
                ("dy", dy.stream()),
                ("h", h.stream()),
                ("weight", weight.stream()),
                ("rstd", rstd.stream()),
                ("dres", dres.stream()),
                ("dw", dw.stream()),
                ("workspace", DeviceSlice::stream(workspace)),
            ],
        )?;
        let (dy, _g1) = dy.desc(stream);
        let (h, _g2) = h.desc(stream);
        let (weight, _g3) = weight.desc(stream);
        let (rstd, _g4) = rstd.desc(stream);
        let (dres, _g5) = dres.desc_mut(stream);
        let (dw, _g7) = dw.desc_mut(stream);
        let (workspace, _g8) = workspace_desc(workspace, stream);
        let t = RmsNormBwdDescs {
            dy,
            h,
            weight,
            rstd,
            dres: Some(dres),
            dx: dres,
            dw,
            workspace,
        };
        // SAFETY: as in `rmsnorm_backward`; dx is exactly dres, read before written.
        unsafe { self.run_rmsnorm_backward(stream, T::DTYPE, &t, gemma) }
    }

    /// Backward on raw device matrices; the storage dtype is `dy`'s. Aliasing as in
    /// [`plan_rmsnorm_backward`].
    ///
    /// # Safety
    /// As for [`Kernels::rmsnorm_forward_raw`].
    pub unsafe fn rmsnorm_backward_raw(
        &self,
        stream: &CudaStream,
        t: &RmsNormBwdDescs,
        gemma: bool,
    ) -> Result<()> {
        self.check_stream(stream)?;
        // SAFETY: the caller vouches for the descriptions; the plan checks the rest.
        unsafe { self.run_rmsnorm_backward(stream, t.dy.dtype, t, gemma) }
    }
}

/// An optional input view: checked to be on `stream`'s device, then described for the launch.
fn optional_desc<'s, T: Element>(
    stream: &'s CudaStream,
    name: &'static str,
    m: Option<&'s Mat<'_, T>>,
) -> Result<(Option<MatDesc>, Option<SyncOnDrop<'s>>)> {
    let Some(m) = m else {
        return Ok((None, None));
    };
    check_devices(stream, &[(name, m.stream())])?;
    let (desc, guard) = m.desc(stream);
    Ok((Some(desc), Some(guard)))
}

/// An optional output view: as [`optional_desc`], with the write recorded.
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
