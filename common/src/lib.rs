//! What the device kernels and the host launchers must agree on, defined once.
//!
//! This crate has no dependencies and builds on stable Rust for the host (inside `ferrofuse`),
//! and `no_std` on nightly for `nvptx64-nvidia-cuda` (inside the kernels): the nightly features
//! it needs there are enabled for that target only. It holds:
//! - [`DType`], [`Activation`] and [`VecMode`], the descriptors the host validates and the
//!   kernels obey;
//! - the `#[repr(C)]` parameter structs each kernel entry takes by value ([`GatedFwdParams`], ...);
//! - the table of kernel entry names ([`kernel_names`]), checked against the PTX when it is built;
//! - the f32 activation math ([`act`]), run by the kernels and measured against f64 on the CPU.
#![cfg_attr(target_arch = "nvptx64", no_std)]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(core_intrinsics, asm_experimental_arch, adt_const_params),
    allow(internal_features)
)]
// Published coefficients are kept as printed; rounding them to f32 is the compiler's job.
#![allow(clippy::excessive_precision)]

pub mod act;
pub mod fp8;
mod names;
mod params;

pub use names::{KernelId, NormPath, VecMode, kernel_names};
pub use params::*;

/// Storage type of a tensor. All arithmetic is f32 whatever the storage; see [`act`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32 = 0,
    F16 = 1,
    BF16 = 2,
    /// FP8 E4M3 (`e4m3fn`: no infinities, largest finite 448; PyTorch's
    /// `torch.float8_e4m3fn`), one byte per element. Only ever an output: the `y` of the FP8
    /// entry points, next to its f32 scales (see [`fp8`]). Not in [`DType::ALL`].
    F8E4M3 = 3,
}

impl DType {
    /// The storage dtypes the kernels read and compute from (every operand of the f32/f16/bf16
    /// entry points); [`DType::F8E4M3`] is an output format only.
    pub const ALL: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

    pub const fn size_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::F8E4M3 => 1,
        }
    }

    /// Whether this is the FP8 output format (not a storage dtype of [`DType::ALL`]).
    pub const fn is_fp8(self) -> bool {
        matches!(self, DType::F8E4M3)
    }

    /// Elements in one 16-byte vector access.
    pub const fn lanes_per_16b(self) -> usize {
        16 / self.size_bytes()
    }

    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F8E4M3 => "f8e4m3",
        }
    }
}

/// The activation of a gated unit `y = act(a) * b`.
///
/// Which one a checkpoint needs is in its config (`hidden_act`): LLaMA, Mistral and Qwen use
/// `silu`; Gemma uses `gelu_pytorch_tanh` (GeluTanh); the erf form (`gelu`) is a different
/// function (they differ by up to ~5e-4) and is not interchangeable with the tanh form.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Activation {
    /// `x * sigmoid(x)` (SwiGLU).
    Silu = 0,
    /// `0.5 * x * (1 + erf(x / sqrt(2)))` (GeGLU, exact form).
    GeluErf = 1,
    /// `0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))` (GeGLU, tanh approximation).
    GeluTanh = 2,
    /// `max(x, 0)` (ReGLU).
    Relu = 3,
}

impl Activation {
    pub const ALL: [Activation; 4] = [
        Activation::Silu,
        Activation::GeluErf,
        Activation::GeluTanh,
        Activation::Relu,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Activation::Silu => "silu",
            Activation::GeluErf => "gelu_erf",
            Activation::GeluTanh => "gelu_tanh",
            Activation::Relu => "relu",
        }
    }

    /// Decodes the `u32` stored in a parameter struct; unknown values map to `None`.
    pub const fn from_u32(v: u32) -> Option<Self> {
        match v {
            0 => Some(Activation::Silu),
            1 => Some(Activation::GeluErf),
            2 => Some(Activation::GeluTanh),
            3 => Some(Activation::Relu),
            _ => None,
        }
    }
}
