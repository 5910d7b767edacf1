//! Kernel parameter structs, passed by value as the single argument of each entry.
//!
//! Addresses are device pointers as `u64`; strides and sizes are in elements, as `u64`, so no
//! index arithmetic wraps past 2^31 (or 2^32) elements. Every struct is `#[repr(C)]` with its
//! fields ordered so no padding is implicit: the host copies the bytes, the kernel reads them.

/// Launch geometry of the gated kernels: threads per block.
pub const GATED_THREADS: u32 = 256;
/// Vectors (or scalars, on the scalar path) each thread keeps in flight per block-iteration.
pub const GATED_UNROLL: usize = 4;

/// `y[r, c] = act(a[r, c]) * b[r, c]` for `r < rows`, `c < cols`.
///
/// Element `[r, c]` of tensor `t` lives at `t + (r * t_stride + c) * size_of(dtype)`. The
/// interleaved `[gate | up]` layout is expressed by the host as `a = x`, `b = x + cols`,
/// `a_stride = b_stride = x`'s row stride.
///
/// Aliasing: `y` may equal `b` (same address, same stride): every element is read before it is
/// written, by the same thread. The host rejects every other overlap.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GatedFwdParams {
    pub a: u64,
    pub b: u64,
    pub y: u64,
    pub a_stride: u64,
    pub b_stride: u64,
    pub y_stride: u64,
    pub rows: u64,
    pub cols: u64,
    /// An [`crate::Activation`] as `u32`.
    pub act: u32,
    pub _pad: u32,
}

/// `da = dy * b * act'(a)`, `db = dy * act(a)`, recomputing `act` from the saved `a`.
///
/// Aliasing: `da` may equal `a` or `dy`, and `db` may equal `b` or `dy` (not both on `dy`):
/// each thread reads all five operands of an element before writing either gradient.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GatedBwdParams {
    pub a: u64,
    pub b: u64,
    pub dy: u64,
    pub da: u64,
    pub db: u64,
    pub a_stride: u64,
    pub b_stride: u64,
    pub dy_stride: u64,
    pub da_stride: u64,
    pub db_stride: u64,
    pub rows: u64,
    pub cols: u64,
    pub act: u32,
    pub _pad: u32,
}
