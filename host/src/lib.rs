//! # ferrofuse
//!
//! Fused GPU kernels for LLM inference, written in Rust, shipped prebuilt for sm_80 and sm_90
//! (SASS for those archs, and the PTX, which the driver JIT-compiles for newer GPUs) and launched
//! through [`cudarc`]:
//!
//! - gated activations `y = act(a) * b` (SwiGLU, GeGLU erf and tanh, ReGLU), split or
//!   interleaved `[gate | up]`, in place or not, forward and backward ([`gated`]), and the
//!   forward with FP8 E4M3 output and static, per-token or per-group scales ([`fp8`]);
//! - fused residual-add + RMSNorm `h = x + residual, y = rmsnorm(h) * w` (plain, Gemma, Hugging
//!   Face numerics), every output placement, forward and backward, batch-invariant ([`norm`]).
//!
//! ```no_run
//! use ferrofuse::{Activation, Kernels, Mat, MatMut};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let kernels = Kernels::for_device(0)?;
//! let stream = kernels.context().default_stream();
//! let (rows, inter) = (16, 14336);
//! let gate_up = stream.alloc_zeros::<half::bf16>(rows * 2 * inter)?; // [gate | up]
//! let mut y = stream.alloc_zeros::<half::bf16>(rows * inter)?;
//! kernels.gated_interleaved(
//!     &stream,
//!     Activation::Silu,
//!     &Mat::new(gate_up.as_view(), rows, 2 * inter),
//!     &mut MatMut::new(y.as_view_mut(), rows, inter),
//! )?;
//! # Ok(()) }
//! ```
//!
//! Every call validates shapes, dtypes, strides, buffer sizes, alignment and aliasing and
//! returns a typed [`Error`] before launching anything. Launches go on the caller's stream,
//! with no allocation and no synchronisation, so they can be captured into CUDA graphs.

pub mod error;
pub mod fp8;
pub mod gated;
pub mod norm;
pub mod reference;
pub mod runtime;
pub mod tensor;
mod validate;

pub use error::{Error, Result};
pub use ferrofuse_common::{Activation, DType, KernelId, NormPath, VecMode, act};
pub use fp8::{F8E4M3, Fp8Scales, Fp8Scaling, ScaleLayout};
pub use norm::{GradPlacement, NormNumerics, Placement, RmsNormOptions, SavedForward};
pub use runtime::{
    GridLimits, Kernels, Launch, LoadedCode, PTX_MODULES, PtxModule, device_count, driver_available,
};
pub use tensor::{Element, Mat, MatDesc, MatMut};

/// Re-exported so users name the same versions ferrofuse was built with.
pub use cudarc;
pub use float8;
pub use half;
