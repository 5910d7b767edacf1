//! The one error type of the crate. Every rejected call returns one of these before anything
//! is launched, so nothing is written when a call is rejected.

use std::fmt;

use cudarc::driver::DriverError;
use ferrofuse_common::DType;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Error {
    /// No CUDA driver library (libcuda) could be loaded on this machine.
    NoDriver,
    /// The driver is there but reports no device with this ordinal.
    NoDevice { ordinal: usize, count: usize },
    /// The device is older than the oldest arch ferrofuse ships PTX for (sm_80).
    UnsupportedDevice {
        name: String,
        compute_capability: (i32, i32),
    },
    /// A module was asked for (`Kernels::for_context_with_module`) whose arch the device is
    /// older than.
    ModuleNeedsNewerDevice {
        arch: &'static str,
        name: String,
        compute_capability: (i32, i32),
    },
    /// A CUDA driver call failed.
    Driver {
        during: &'static str,
        source: DriverError,
    },
    /// Two tensors that must have the same shape do not.
    ShapeMismatch {
        tensor: &'static str,
        expected: (usize, usize),
        got: (usize, usize),
    },
    /// A tensor's dtype is not the one the call needs.
    DTypeMismatch {
        tensor: &'static str,
        expected: DType,
        got: DType,
    },
    /// An interleaved `[gate | up]` tensor whose last dimension is odd.
    OddInterleavedWidth { cols: usize },
    /// The last dimension is not unit-stride.
    NonUnitLastStride { tensor: &'static str, stride: usize },
    /// Rows overlap: the row stride is smaller than the row length.
    RowStrideTooSmall {
        tensor: &'static str,
        row_stride: usize,
        cols: usize,
    },
    /// The buffer holds fewer elements than its shape and strides reach.
    BufferTooSmall {
        tensor: &'static str,
        needed: usize,
        len: usize,
    },
    /// The address is not a multiple of the element size.
    Misaligned {
        tensor: &'static str,
        addr: u64,
        align: usize,
    },
    /// An output overlaps an input (or another output) in a way the op does not allow.
    Aliasing {
        output: &'static str,
        other: &'static str,
    },
    /// A tensor lives on another device (context) than the stream the call launches on.
    WrongDevice { tensor: &'static str },
    /// A size or an index does not fit the kernel's arithmetic.
    TooLarge { what: &'static str, value: usize },
    /// An invalid scalar argument (an eps that is not finite and positive, say).
    InvalidArgument { what: &'static str, value: String },
    /// A tensor has a dtype this operand cannot take: an FP8 tensor anywhere but as the
    /// output `y` of an FP8 entry point (no kernel reads FP8).
    UnsupportedDType { tensor: &'static str, dtype: DType },
    /// Per-group FP8 scales: the row length is not a multiple of the group.
    GroupMismatch { cols: usize, group: usize },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NoDriver => write!(
                f,
                "no CUDA driver found (libcuda could not be loaded): install the NVIDIA driver \
                 or run on a GPU machine"
            ),
            Error::NoDevice { ordinal, count } => {
                write!(
                    f,
                    "no CUDA device {ordinal}: the driver reports {count} device(s)"
                )
            }
            Error::UnsupportedDevice {
                name,
                compute_capability: (ma, mi),
            } => write!(
                f,
                "device {name} has compute capability {ma}.{mi}; ferrofuse's kernels need 8.0 \
                 (Ampere) or newer"
            ),
            Error::ModuleNeedsNewerDevice {
                arch,
                name,
                compute_capability: (ma, mi),
            } => write!(
                f,
                "the {arch} module does not run on device {name} (compute capability {ma}.{mi})"
            ),
            Error::Driver { during, source } => {
                write!(f, "CUDA driver error while {during}: {source}")
            }
            Error::ShapeMismatch {
                tensor,
                expected,
                got,
            } => write!(
                f,
                "shape mismatch: {tensor} is {}x{}, expected {}x{}",
                got.0, got.1, expected.0, expected.1
            ),
            Error::DTypeMismatch {
                tensor,
                expected,
                got,
            } => write!(
                f,
                "dtype mismatch: {tensor} is {}, expected {}",
                got.name(),
                expected.name()
            ),
            Error::OddInterleavedWidth { cols } => write!(
                f,
                "interleaved [gate | up] input has an odd last dimension {cols}: it must be 2 x intermediate"
            ),
            Error::NonUnitLastStride { tensor, stride } => {
                write!(
                    f,
                    "{tensor} has last-dimension stride {stride}: it must be 1"
                )
            }
            Error::RowStrideTooSmall {
                tensor,
                row_stride,
                cols,
            } => write!(
                f,
                "{tensor} has row stride {row_stride}, smaller than its row length {cols}: rows would overlap"
            ),
            Error::BufferTooSmall {
                tensor,
                needed,
                len,
            } => write!(
                f,
                "{tensor} buffer too small: its shape and strides reach {needed} elements, the buffer has {len}"
            ),
            Error::Misaligned {
                tensor,
                addr,
                align,
            } => {
                write!(
                    f,
                    "{tensor} address {addr:#x} is not aligned to its element size {align}"
                )
            }
            Error::Aliasing { output, other } => write!(
                f,
                "{output} overlaps {other}: only the documented in-place forms are allowed"
            ),
            Error::WrongDevice { tensor } => write!(
                f,
                "{tensor} belongs to another device or context than the launch stream"
            ),
            Error::TooLarge { what, value } => write!(f, "{what} = {value} is too large"),
            Error::InvalidArgument { what, value } => write!(f, "invalid {what}: {value}"),
            Error::UnsupportedDType { tensor, dtype } => write!(
                f,
                "{tensor} is {}: FP8 tensors are only outputs (y of the *_fp8 entry points); \
                 inputs and other outputs are f32, f16 or bf16",
                dtype.name()
            ),
            Error::GroupMismatch { cols, group } => write!(
                f,
                "row length {cols} is not a multiple of the FP8 scale group {group}"
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Driver { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Attaches what the crate was doing to a driver error.
pub(crate) trait DriverContext<T> {
    fn during(self, what: &'static str) -> Result<T>;
}

impl<T> DriverContext<T> for std::result::Result<T, DriverError> {
    fn during(self, what: &'static str) -> Result<T> {
        self.map_err(|source| Error::Driver {
            during: what,
            source,
        })
    }
}
