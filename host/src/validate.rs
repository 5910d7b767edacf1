//! Checks shared by every op family's plan: shapes, aliasing between outputs and the other
//! operands, and that safe views live on the launch stream's device.

use cudarc::driver::CudaStream;

use ferrofuse_common::{DType, VecMode};

use crate::error::{Error, Result};
use crate::runtime::Kernels;
use crate::tensor::MatDesc;

/// 16-byte vectors when `L` (16 bytes of `dtype`) divides the row length `cols` and every
/// operand (absent ones are `None`) starts 16-byte aligned with a row stride that is a multiple
/// of `L` (one-row operands such as a norm weight need only the alignment); otherwise one
/// element per access. The kernels of both paths compute the same values.
pub(crate) fn vec_mode(dtype: DType, cols: usize, mats: &[Option<&MatDesc>]) -> VecMode {
    let lanes = dtype.lanes_per_16b();
    let ok = cols.is_multiple_of(lanes)
        && mats
            .iter()
            .flatten()
            .all(|m| m.addr % 16 == 0 && (m.rows <= 1 || m.row_stride % lanes == 0));
    if ok { VecMode::V16 } else { VecMode::Scalar }
}

/// `m` has the shape `expected`.
pub(crate) fn check_shape(name: &'static str, m: &MatDesc, expected: (usize, usize)) -> Result<()> {
    if m.shape() != expected {
        return Err(Error::ShapeMismatch {
            tensor: name,
            expected,
            got: m.shape(),
        });
    }
    Ok(())
}

/// Rejects any overlap of `output` with `others` (absent operands are `None`), except exactly
/// the same place as an operand named in `allowed`.
pub(crate) fn check_aliasing(
    output: (&'static str, &MatDesc),
    others: &[(&'static str, Option<&MatDesc>)],
    allowed: &[&'static str],
) -> Result<()> {
    let (out_name, out) = output;
    for &(name, other) in others {
        let Some(other) = other else { continue };
        if out.overlaps(other) && !(allowed.contains(&name) && out.same_place(other)) {
            return Err(Error::Aliasing {
                output: out_name,
                other: name,
            });
        }
    }
    Ok(())
}

/// Every view must live in the stream's context.
pub(crate) fn check_devices(
    stream: &CudaStream,
    views: &[(&'static str, &CudaStream)],
) -> Result<()> {
    for &(name, s) in views {
        if s.context().cu_ctx() != stream.context().cu_ctx() {
            return Err(Error::WrongDevice { tensor: name });
        }
    }
    Ok(())
}

impl Kernels {
    /// The stream belongs to this context and every view to the stream's device: the first
    /// checks of every safe entry point.
    pub(crate) fn check_views(
        &self,
        stream: &CudaStream,
        views: &[(&'static str, &CudaStream)],
    ) -> Result<()> {
        self.check_stream(stream)?;
        check_devices(stream, views)
    }
}
