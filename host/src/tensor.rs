//! Tensor descriptions: element types, raw device matrices ([`MatDesc`]) and safe views over
//! cudarc buffers ([`Mat`], [`MatMut`]).
//!
//! Every operand of every kernel is a 2-D matrix `[rows, cols]` with a row stride (elements)
//! and a unit last-dimension stride; leading batch dimensions are flattened into `rows` by the
//! caller. Safe views borrow cudarc buffers, so the borrow checker rules out aliasing between
//! a `&Mat` and a `&mut MatMut`; [`MatDesc`] is the raw form for tensors owned by another
//! framework, checked at run time.

use cudarc::driver::{
    CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr, DeviceSlice, SyncOnDrop,
};
use ferrofuse_common::DType;

use crate::error::{Error, Result};

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
    impl Sealed for float8::F8E4M3 {}
}

/// An element type: `f32`, [`half::f16`] or [`half::bf16`] (storage: inputs and outputs), or
/// [`float8::F8E4M3`] (the output `y` of the FP8 entry points only; a call that passes it
/// anywhere else is rejected with [`Error::UnsupportedDType`]).
pub trait Element: DeviceRepr + Copy + Send + Sync + 'static + sealed::Sealed {
    const DTYPE: DType;
    fn to_f64(self) -> f64;
    /// Round to nearest even, as the kernels' stores do.
    fn from_f64(v: f64) -> Self;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> Self {
        v as f32
    }
}

impl Element for half::f16 {
    const DTYPE: DType = DType::F16;
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn from_f64(v: f64) -> Self {
        half::f16::from_f64(v)
    }
}

impl Element for half::bf16 {
    const DTYPE: DType = DType::BF16;
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn from_f64(v: f64) -> Self {
        // Through f32 rounded to odd (truncated, then the last bit set when inexact): one
        // correct rounding to bf16 (f32 keeps more than two extra bits). `half`'s own
        // `bf16::from_f64` drops the low 32 bits of the f64 before rounding, which turns
        // values just above a halfway point into ties (and rounds them to even, down).
        let mut t = v as f32;
        if (t as f64).abs() > v.abs() {
            t = f32::from_bits(t.to_bits() - 1);
        }
        if t.is_finite() && t as f64 != v {
            t = f32::from_bits(t.to_bits() | 1);
        }
        half::bf16::from_f32(t)
    }
}

impl Element for float8::F8E4M3 {
    const DTYPE: DType = DType::F8E4M3;
    fn to_f64(self) -> f64 {
        float8::F8E4M3::to_f64(&self)
    }
    /// Round to nearest even, saturating to +-448 (NaN stays NaN), as the kernels convert.
    fn from_f64(v: f64) -> Self {
        float8::F8E4M3::from_bits(crate::reference::fp8::e4m3_bits(v))
    }
}

/// A raw device matrix: what the kernels need to know, and what validation checks.
///
/// Element `[r, c]` is at `addr + (r * row_stride + c * col_stride) * dtype.size_bytes()`, and
/// the allocation holds `len` elements from `addr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatDesc {
    pub addr: u64,
    pub len: usize,
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    pub row_stride: usize,
    pub col_stride: usize,
}

impl MatDesc {
    /// Elements `[start, start + len)` of a dense matrix (rows back to back, so unit steps
    /// whatever column stride a one-column matrix states) as one row.
    pub fn flat(&self, start: usize, len: usize) -> Self {
        let size = self.dtype.size_bytes() as u64;
        Self {
            addr: self.addr + start as u64 * size,
            len: self.len - start,
            rows: 1,
            cols: len,
            row_stride: len,
            col_stride: 1,
            ..*self
        }
    }

    /// A dense row-major matrix filling `rows * cols` elements of its buffer.
    pub fn contiguous(addr: u64, len: usize, dtype: DType, rows: usize, cols: usize) -> Self {
        Self {
            addr,
            len,
            dtype,
            rows,
            cols,
            row_stride: cols,
            col_stride: 1,
        }
    }

    pub fn shape(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0 || self.cols == 0
    }

    /// Elements from `addr` to one past the last element (0 for an empty matrix).
    pub fn span(&self) -> usize {
        if self.is_empty() {
            return 0;
        }
        (self.rows - 1) * self.row_stride + (self.cols - 1) * self.col_stride + 1
    }

    /// Byte range `[start, end)` the matrix touches.
    pub fn byte_range(&self) -> (u64, u64) {
        let bytes = (self.span() * self.dtype.size_bytes()) as u64;
        (self.addr, self.addr + bytes)
    }

    /// The two halves `[gate | up]` of an interleaved matrix (`cols` must be even).
    pub fn interleaved_halves(&self) -> Result<(MatDesc, MatDesc)> {
        if !self.cols.is_multiple_of(2) {
            return Err(Error::OddInterleavedWidth { cols: self.cols });
        }
        let half = self.cols / 2;
        let gate = MatDesc {
            cols: half,
            ..*self
        };
        // The up half's offset: one that overflows describes no buffer (its extent would pass
        // the end of the address space).
        let offset = half.checked_mul(self.col_stride);
        let addr = offset
            .and_then(|n| (n as u64).checked_mul(self.dtype.size_bytes() as u64))
            .and_then(|bytes| self.addr.checked_add(bytes));
        let (Some(offset), Some(addr)) = (offset, addr) else {
            return Err(Error::TooLarge {
                what: "columns before the interleaved up half (their bytes from the address \
                       pass the end of the address space)",
                value: half,
            });
        };
        let up = MatDesc {
            addr,
            len: self.len.saturating_sub(offset),
            cols: half,
            ..*self
        };
        Ok((gate, up))
    }

    /// Checks the description on its own: dtype, unit last stride, non-overlapping rows,
    /// buffer size, an extent inside the address space, alignment. FP8 is rejected
    /// ([`Error::UnsupportedDType`]): it is only ever an output, checked by
    /// [`MatDesc::check_fp8_output`].
    pub fn check(&self, name: &'static str, dtype: DType) -> Result<()> {
        for d in [self.dtype, dtype] {
            if d.is_fp8() {
                return Err(Error::UnsupportedDType {
                    tensor: name,
                    dtype: d,
                });
            }
        }
        self.check_layout(name, dtype)
    }

    /// [`MatDesc::check`] for an FP8 output (`dtype` must be [`DType::F8E4M3`]).
    pub fn check_fp8_output(&self, name: &'static str) -> Result<()> {
        self.check_layout(name, DType::F8E4M3)
    }

    fn check_layout(&self, name: &'static str, dtype: DType) -> Result<()> {
        if self.dtype != dtype {
            return Err(Error::DTypeMismatch {
                tensor: name,
                expected: dtype,
                got: self.dtype,
            });
        }
        if self.col_stride != 1 && self.cols > 1 {
            return Err(Error::NonUnitLastStride {
                tensor: name,
                stride: self.col_stride,
            });
        }
        if self.is_empty() {
            return Ok(());
        }
        // Address 0 is no device buffer, and the kernels read a null optional operand
        // (residual, dres, rstd) as absent: passed on, it would silently change the op.
        if self.addr == 0 {
            return Err(Error::InvalidArgument {
                what: "tensor address (0 is no device buffer)",
                value: name.to_string(),
            });
        }
        if self.rows > 1 && self.row_stride < self.cols {
            return Err(Error::RowStrideTooSmall {
                tensor: name,
                row_stride: self.row_stride,
                cols: self.cols,
            });
        }
        let needed = (self.rows - 1)
            .checked_mul(self.row_stride)
            .and_then(|n| n.checked_add(self.cols))
            .ok_or(Error::TooLarge {
                what: "rows at this row stride (the extent overflows)",
                value: self.rows,
            })?;
        if needed > self.len {
            return Err(Error::BufferTooSmall {
                tensor: name,
                needed,
                len: self.len,
            });
        }
        // The extent's bytes, from `addr`, must stay inside the address space: every overlap
        // test and kernel address adds them to it.
        let end = (needed as u64)
            .checked_mul(dtype.size_bytes() as u64)
            .and_then(|bytes| self.addr.checked_add(bytes));
        if end.is_none() {
            return Err(Error::TooLarge {
                what: "extent in elements (its bytes from the address pass the end of the \
                       address space)",
                value: needed,
            });
        }
        let align = dtype.size_bytes();
        if !self.addr.is_multiple_of(align as u64) {
            return Err(Error::Misaligned {
                tensor: name,
                addr: self.addr,
                align,
            });
        }
        Ok(())
    }

    /// Whether `self` and `other` (each already [`check`](Self::check)ed) share an element.
    ///
    /// Exact for matrices of one dtype and one row stride no shorter than their rows (the
    /// interleaved halves of one buffer do not overlap); conservative (byte ranges) otherwise.
    pub fn overlaps(&self, other: &MatDesc) -> bool {
        if self.is_empty() || other.is_empty() {
            return false;
        }
        let (s0, e0) = self.byte_range();
        let (s1, e1) = other.byte_range();
        if e0 <= s1 || e1 <= s0 {
            return false;
        }
        let size = self.dtype.size_bytes() as i128;
        let stride = self.row_stride as i128;
        let diff = other.addr as i128 - self.addr as i128;
        // The exact test below needs rows no longer than the stride, which a one-row matrix
        // need not have (validation ignores the row stride of a single row).
        if self.dtype != other.dtype
            || self.row_stride != other.row_stride
            || diff % size != 0
            || stride == 0
            || self.cols > self.row_stride
            || other.cols > other.row_stride
        {
            return true;
        }
        // other's element [r2, c2] is self's flat offset d + r2*s + c2; it hits self's
        // [r1, c1] iff c1 - c2 - m = (q + r2 - r1) * s with d = q*s + m, 0 <= m < s. As
        // c1, c2 < s the multiple k = q + r2 - r1 is 0 or -1.
        let d = diff / size;
        let (q, m) = (d.div_euclid(stride), d.rem_euclid(stride));
        let (r1n, c1n) = (self.rows as i128, self.cols as i128);
        let (r2n, c2n) = (other.rows as i128, other.cols as i128);
        // Some r2 in [0, r2n) with r1 = r2 + shift in [0, r1n)?
        let rows_meet = |shift: i128| shift < r1n && shift + r2n > 0;
        // k = 0: c1 = c2 + m, needs m < c1n; rows r1 = q + r2.
        let same_row = m < c1n && rows_meet(q);
        // k = -1: c1 = c2 + m - s, needs s - m < c2n; rows r1 = q + r2 + 1.
        let next_row = stride - m < c2n && rows_meet(q + 1);
        same_row || next_row
    }

    /// Same address, shape and strides: the only overlap an in-place form allows.
    pub fn same_place(&self, other: &MatDesc) -> bool {
        self.addr == other.addr
            && self.shape() == other.shape()
            && self.row_stride == other.row_stride
            && self.col_stride == other.col_stride
            && self.dtype == other.dtype
    }
}

/// A read-only matrix view of a cudarc buffer: `rows x cols`, rows `row_stride` apart.
pub struct Mat<'a, T> {
    view: CudaView<'a, T>,
    rows: usize,
    cols: usize,
    row_stride: usize,
}

/// A writable matrix view of a cudarc buffer.
pub struct MatMut<'a, T> {
    view: CudaViewMut<'a, T>,
    rows: usize,
    cols: usize,
    row_stride: usize,
}

impl<'a, T: Element> Mat<'a, T> {
    /// Dense row-major `rows x cols` at the start of `view`.
    pub fn new(view: CudaView<'a, T>, rows: usize, cols: usize) -> Self {
        Self::strided(view, rows, cols, cols)
    }

    /// `rows x cols`, row `r` starting at element `r * row_stride` of `view`.
    pub fn strided(view: CudaView<'a, T>, rows: usize, cols: usize, row_stride: usize) -> Self {
        Self {
            view,
            rows,
            cols,
            row_stride,
        }
    }

    pub fn shape(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    pub fn row_stride(&self) -> usize {
        self.row_stride
    }

    pub(crate) fn stream(&self) -> &CudaStream {
        self.view.stream()
    }

    /// The raw description, with the device address as seen from `stream` (cudarc orders the
    /// access on it; the guard records the read when dropped, after the launch).
    pub(crate) fn desc<'s>(&'s self, stream: &'s CudaStream) -> (MatDesc, SyncOnDrop<'s>) {
        let (ptr, guard) = self.view.device_ptr(stream);
        (self.describe(ptr), guard)
    }

    fn describe(&self, addr: u64) -> MatDesc {
        MatDesc {
            addr,
            len: self.view.len(),
            dtype: T::DTYPE,
            rows: self.rows,
            cols: self.cols,
            row_stride: self.row_stride,
            col_stride: 1,
        }
    }
}

impl<'a, T: Element> MatMut<'a, T> {
    /// Dense row-major `rows x cols` at the start of `view`.
    pub fn new(view: CudaViewMut<'a, T>, rows: usize, cols: usize) -> Self {
        Self::strided(view, rows, cols, cols)
    }

    /// `rows x cols`, row `r` starting at element `r * row_stride` of `view`.
    pub fn strided(view: CudaViewMut<'a, T>, rows: usize, cols: usize, row_stride: usize) -> Self {
        Self {
            view,
            rows,
            cols,
            row_stride,
        }
    }

    pub fn shape(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    pub fn row_stride(&self) -> usize {
        self.row_stride
    }

    pub(crate) fn stream(&self) -> &CudaStream {
        self.view.stream()
    }

    /// As [`Mat::desc`], recording a write.
    pub(crate) fn desc_mut<'s>(&'s mut self, stream: &'s CudaStream) -> (MatDesc, SyncOnDrop<'s>) {
        let (rows, cols, row_stride, len) =
            (self.rows, self.cols, self.row_stride, self.view.len());
        let (addr, guard) = self.view.device_ptr_mut(stream);
        let desc = MatDesc {
            addr,
            len,
            dtype: T::DTYPE,
            rows,
            cols,
            row_stride,
            col_stride: 1,
        };
        (desc, guard)
    }
}
