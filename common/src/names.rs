//! The table of kernel entry points. The kernels crate exports exactly these names (the PTX
//! check in `host/build.rs` and `cargo xtask ptx` compare the `.entry` list against it), and
//! the host looks each one up once per context by [`KernelId::index`].

use crate::DType;

/// How a kernel touches memory: 16-byte vectors (every pointer 16-byte aligned, every row
/// stride and the row length multiples of the vector) or one element at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VecMode {
    V16 = 0,
    Scalar = 1,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelId {
    GatedFwd(DType, VecMode),
    GatedBwd(DType, VecMode),
    /// An entry that does nothing, launched by the benchmark to measure the launch floor.
    /// It keeps the last index: add new families before it.
    Empty,
}

const fn dtype_index(d: DType) -> usize {
    d as usize
}

impl KernelId {
    /// Number of kernel entry points.
    pub const COUNT: usize = 13;

    /// Dense index in `0..COUNT`.
    pub const fn index(self) -> usize {
        match self {
            KernelId::GatedFwd(d, v) => dtype_index(d) * 2 + v as usize,
            KernelId::GatedBwd(d, v) => 6 + dtype_index(d) * 2 + v as usize,
            KernelId::Empty => Self::COUNT - 1,
        }
    }

    /// Whether the entry starts with `griddepcontrol.wait` on sm_90 builds, so the host may
    /// launch it with programmatic dependent launch. A kernel that does not must never be
    /// launched that way: it could read its inputs before the previous kernel wrote them.
    pub const fn syncs_grid_dependency(self) -> bool {
        matches!(self, KernelId::GatedFwd(..) | KernelId::GatedBwd(..))
    }

    /// The PTX `.entry` name.
    pub const fn name(self) -> &'static str {
        use DType::*;
        use KernelId::*;
        use VecMode::*;
        match self {
            GatedFwd(F32, V16) => "gated_fwd_f32_v16",
            GatedFwd(F32, Scalar) => "gated_fwd_f32_scalar",
            GatedFwd(F16, V16) => "gated_fwd_f16_v16",
            GatedFwd(F16, Scalar) => "gated_fwd_f16_scalar",
            GatedFwd(BF16, V16) => "gated_fwd_bf16_v16",
            GatedFwd(BF16, Scalar) => "gated_fwd_bf16_scalar",
            GatedBwd(F32, V16) => "gated_bwd_f32_v16",
            GatedBwd(F32, Scalar) => "gated_bwd_f32_scalar",
            GatedBwd(F16, V16) => "gated_bwd_f16_v16",
            GatedBwd(F16, Scalar) => "gated_bwd_f16_scalar",
            GatedBwd(BF16, V16) => "gated_bwd_bf16_v16",
            GatedBwd(BF16, Scalar) => "gated_bwd_bf16_scalar",
            Empty => "empty_kernel",
        }
    }

    /// Every kernel, in index order.
    pub const ALL: [KernelId; Self::COUNT] = {
        let mut all = [KernelId::GatedFwd(DType::F32, VecMode::V16); Self::COUNT];
        let mut d = 0;
        while d < 3 {
            let dt = DType::ALL[d];
            let mut v = 0;
            while v < 2 {
                let vm = if v == 0 {
                    VecMode::V16
                } else {
                    VecMode::Scalar
                };
                let f = KernelId::GatedFwd(dt, vm);
                all[f.index()] = f;
                let b = KernelId::GatedBwd(dt, vm);
                all[b.index()] = b;
                v += 1;
            }
            d += 1;
        }
        all[KernelId::Empty.index()] = KernelId::Empty;
        all
    };
}

/// Every kernel entry name, in index order.
pub fn kernel_names() -> impl Iterator<Item = &'static str> {
    KernelId::ALL.iter().map(|k| k.name())
}
