//! FP8 E4M3 outputs: the element type, the scaling schemes and the checks of their scale
//! tensors, shared by every family with FP8 outputs.
//!
//! An FP8 output is a pair: `y_q` ([`F8E4M3`], one byte per element, PyTorch's
//! `torch.float8_e4m3fn`) and f32 scales with `y ≈ y_q * scale`. The conversion rounds
//! `y / scale` (f32) to nearest even and saturates to +-448; NaN stays NaN. The schemes:
//!
//! | [`Fp8Scaling`] | scale tensor | feeds |
//! | --- | --- | --- |
//! | `Static` | `[1, 1]` f32, given by the caller (read) | per-tensor scaled GEMMs (`torch._scaled_mm` with a scalar `scale_a`, cuBLASLt `A_SCALE_POINTER`, vLLM's static FP8 linear) |
//! | `PerToken` | `[rows, 1]` f32, written | row-wise scaled GEMMs (`torch._scaled_mm` with `scale_a` of shape `[M, 1]`, CUTLASS / vLLM `cutlass_scaled_mm` per-token activation scales) |
//! | `PerGroup` row-major | `[rows, cols / group]` f32, written | vLLM's `w8a8_block_fp8_matmul` (Triton) activation scales |
//! | `PerGroup` column-major | `[cols / group, rows]` f32 (its transpose in memory), written | Hopper block-scaled GEMMs: DeepGEMM `fp8_gemm_nt` and CUTLASS's blockwise-scaled kernels read the activation scales M-major; pad the row stride to a multiple of 4 for TMA |
//!
//! A dynamic scale is `max(min(amax, scale_ub) / 448, min_scale)` of the row's (group's)
//! largest magnitude (`scale_ub` per token only); a row of zeros gets `min_scale` and
//! quantises to zeros.

use ferrofuse_common::DType;
pub use ferrofuse_common::fp8::{DEFAULT_MIN_SCALE, E4M3_MAX};
pub use float8::F8E4M3;

use cudarc::driver::{CudaStream, SyncOnDrop};

use crate::error::{Error, Result};
use crate::tensor::{Mat, MatDesc, MatMut};
use crate::validate::check_devices;

/// Where a per-group scale matrix keeps its elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScaleLayout {
    /// `[rows, groups]` row-major: the scale of group `g` of row `r` at `r * row_stride + g`.
    RowMajor,
    /// Column-major (`[groups, rows]` in memory): at `g * row_stride + r`, the layout Hopper
    /// block-scaled GEMMs (DeepGEMM, CUTLASS blockwise) read. Pass the scale tensor as a
    /// `[groups, rows]` matrix whose row stride is the padded row count.
    ColMajor,
}

/// How the scales of an FP8 output are chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fp8Scaling {
    /// One scale for the whole tensor, given by the caller as a device `[1, 1]` f32 (read
    /// by the kernel, so it may change between graph replays): `y_q = e4m3(y / scale)`.
    Static,
    /// One scale per row, computed in the kernel and written to a `[rows, 1]` f32:
    /// `max(min(amax, scale_ub) / 448, min_scale)`.
    PerToken {
        /// Lower bound of the scale (finite, > 0); [`DEFAULT_MIN_SCALE`] is vLLM's.
        min_scale: f32,
        /// Upper bound of the row's `amax` (vLLM's `scale_ub`; finite, > 0), if any.
        scale_ub: Option<f32>,
    },
    /// One scale per `group` (64 or 128) consecutive columns of a row, computed in the kernel
    /// as `max(amax / 448, min_scale)`, written in `layout`.
    PerGroup {
        group: usize,
        layout: ScaleLayout,
        min_scale: f32,
    },
}

impl Fp8Scaling {
    /// Per token with vLLM's defaults: [`DEFAULT_MIN_SCALE`], no upper bound.
    pub const fn per_token() -> Self {
        Fp8Scaling::PerToken {
            min_scale: DEFAULT_MIN_SCALE,
            scale_ub: None,
        }
    }

    /// Per group of `group` columns, scales in `layout`, [`DEFAULT_MIN_SCALE`].
    pub const fn per_group(group: usize, layout: ScaleLayout) -> Self {
        Fp8Scaling::PerGroup {
            group,
            layout,
            min_scale: DEFAULT_MIN_SCALE,
        }
    }

    /// The shape the scale tensor must have for a `rows x cols` output (after the scaling's
    /// own checks).
    pub fn scale_shape(&self, rows: usize, cols: usize) -> Result<(usize, usize)> {
        match *self {
            Fp8Scaling::Static => Ok((1, 1)),
            Fp8Scaling::PerToken {
                min_scale,
                scale_ub,
            } => {
                check_min_scale(min_scale)?;
                if let Some(ub) = scale_ub
                    && !(ub.is_finite() && ub > 0.0)
                {
                    return Err(Error::InvalidArgument {
                        what: "scale_ub (must be finite and > 0)",
                        value: ub.to_string(),
                    });
                }
                Ok((rows, 1))
            }
            Fp8Scaling::PerGroup {
                group,
                layout,
                min_scale,
            } => {
                check_min_scale(min_scale)?;
                if group != 64 && group != 128 {
                    return Err(Error::InvalidArgument {
                        what: "FP8 scale group (64 or 128 columns)",
                        value: group.to_string(),
                    });
                }
                if !cols.is_multiple_of(group) {
                    return Err(Error::GroupMismatch { cols, group });
                }
                Ok(match layout {
                    ScaleLayout::RowMajor => (rows, cols / group),
                    ScaleLayout::ColMajor => (cols / group, rows),
                })
            }
        }
    }

    /// Whether the scale tensor is written (dynamic schemes) rather than read (static).
    pub const fn writes_scales(&self) -> bool {
        !matches!(self, Fp8Scaling::Static)
    }
}

fn check_min_scale(min_scale: f32) -> Result<()> {
    if !(min_scale.is_finite() && min_scale > 0.0) {
        return Err(Error::InvalidArgument {
            what: "min_scale (must be finite and > 0)",
            value: min_scale.to_string(),
        });
    }
    Ok(())
}

/// Checks an FP8 output `y` (shape `(rows, cols)`) and its scale tensor for `scaling`: dtypes,
/// layouts, buffer sizes, alignment, shapes; `y` and the scales may overlap nothing in
/// `inputs` nor each other.
pub(crate) fn check_fp8_output(
    y: &MatDesc,
    scales: &MatDesc,
    scaling: &Fp8Scaling,
    (rows, cols): (usize, usize),
    inputs: &[(&'static str, &MatDesc)],
) -> Result<()> {
    y.check_fp8_output("y")?;
    scales.check("scales", DType::F32)?;
    crate::validate::check_shape("y", y, (rows, cols))?;
    crate::validate::check_shape("scales", scales, scaling.scale_shape(rows, cols)?)?;
    let others: Vec<(&'static str, Option<&MatDesc>)> =
        inputs.iter().map(|&(n, m)| (n, Some(m))).collect();
    crate::validate::check_aliasing(("y", y), &others, &[])?;
    crate::validate::check_aliasing(("scales", scales), &others, &[])?;
    crate::validate::check_aliasing(("y", y), &[("scales", Some(scales))], &[])?;
    Ok(())
}

/// The scale tensor of a safe FP8 call: read (static) or written (dynamic).
pub enum Fp8Scales<'s, 'a> {
    /// The caller's `[1, 1]` scale, for [`Fp8Scaling::Static`].
    Read(&'s Mat<'a, f32>),
    /// The scales the kernel writes, for [`Fp8Scaling::PerToken`] / [`Fp8Scaling::PerGroup`].
    Write(&'s mut MatMut<'a, f32>),
}

impl<'s> Fp8Scales<'s, '_> {
    /// The scale tensor of a safe call, described on `stream` after its device check: read
    /// for [`Fp8Scaling::Static`], written for the dynamic schemes (any other pairing is
    /// [`Error::InvalidArgument`]).
    pub(crate) fn describe(
        self,
        stream: &'s CudaStream,
        scaling: &Fp8Scaling,
    ) -> Result<(MatDesc, SyncOnDrop<'s>)> {
        match self {
            Fp8Scales::Read(s) if !scaling.writes_scales() => {
                check_devices(stream, &[("scales", s.stream())])?;
                Ok(s.desc(stream))
            }
            Fp8Scales::Write(s) if scaling.writes_scales() => {
                check_devices(stream, &[("scales", s.stream())])?;
                Ok(s.desc_mut(stream))
            }
            _ => Err(Error::InvalidArgument {
                what: "FP8 scales (Fp8Scales::Read for Static, Write for PerToken/PerGroup)",
                value: format!("{scaling:?}"),
            }),
        }
    }
}
