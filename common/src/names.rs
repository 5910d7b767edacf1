//! The table of kernel entry points. The kernels crate exports exactly these names (the PTX
//! build in `cargo xtask ptx` and the host's tests compare the `.entry` list against it), and
//! the host looks each one up once per context by [`KernelId::index`].

use crate::{
    DType, GATED_THREADS, NormBwdVariant, NormFwdVariant, RMSNORM_BWD_MAX_THREADS_PER_ROW,
    RMSNORM_DW_THREADS, RMSNORM_MAX_THREADS_PER_ROW, ZERO_FILL_THREADS,
};

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
    /// Residual-add + RMSNorm forward (`rmsnorm_fwd_{dtype}_{v16|scalar}_{e16|e32|loop}`).
    RmsNormFwd(DType, VecMode, NormFwdVariant),
    /// Residual-add + RMSNorm forward, 16 elements per thread on the v16 path, the weight
    /// loaded with the inputs: for grids of one wave (`rmsnorm_fwd_{dtype}_v16_e16_wfirst`).
    RmsNormFwdWFirst(DType),
    /// RMSNorm backward rows and `dw` partials (`rmsnorm_bwd_{dtype}_{v16|scalar}_{e16|loop}`).
    RmsNormBwd(DType, VecMode, NormBwdVariant),
    /// RMSNorm `dw` reduction over the partials; the dtype is the weight's (`rmsnorm_dw_{dtype}`).
    RmsNormDw(DType),
    /// Writes zeros over a buffer; the benchmark flushes the L2 with it (see `zero_fill`).
    ZeroFill,
    /// An entry that does nothing, launched by the benchmark to measure the launch floor.
    /// It keeps the last index: add new families before it.
    Empty,
}

const fn dtype_index(d: DType) -> usize {
    d as usize
}

impl KernelId {
    /// Number of kernel entry points.
    pub const COUNT: usize = 50;

    /// Dense index in `0..COUNT`.
    pub const fn index(self) -> usize {
        match self {
            KernelId::GatedFwd(d, v) => dtype_index(d) * 2 + v as usize,
            KernelId::GatedBwd(d, v) => 6 + dtype_index(d) * 2 + v as usize,
            KernelId::RmsNormFwd(d, v, n) => {
                12 + (dtype_index(d) * 2 + v as usize) * 3 + n as usize
            }
            KernelId::RmsNormBwd(d, v, n) => {
                30 + (dtype_index(d) * 2 + v as usize) * 2 + n as usize
            }
            KernelId::RmsNormDw(d) => 42 + dtype_index(d),
            KernelId::RmsNormFwdWFirst(d) => 45 + dtype_index(d),
            KernelId::ZeroFill => Self::COUNT - 2,
            KernelId::Empty => Self::COUNT - 1,
        }
    }

    /// Whether the entry executes `griddepcontrol.wait` before its first global access on sm_90
    /// builds, so the host may launch it with programmatic dependent launch. A kernel that
    /// does not must never be launched that way: it could read its inputs before the previous
    /// kernel wrote them.
    pub const fn syncs_grid_dependency(self) -> bool {
        matches!(
            self,
            KernelId::GatedFwd(..)
                | KernelId::GatedBwd(..)
                | KernelId::RmsNormFwd(..)
                | KernelId::RmsNormFwdWFirst(..)
                | KernelId::RmsNormBwd(..)
                | KernelId::RmsNormDw(..)
        )
    }

    /// Most threads per block the host ever launches this kernel with. A block needs
    /// `registers x threads` of the SM's 65536 registers or the launch fails
    /// (`CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES`); `cargo xtask ptx` checks every kernel against it.
    pub const fn max_block_threads(self) -> u32 {
        match self {
            KernelId::GatedFwd(..) | KernelId::GatedBwd(..) => GATED_THREADS,
            KernelId::RmsNormFwd(..) | KernelId::RmsNormFwdWFirst(..) => {
                RMSNORM_MAX_THREADS_PER_ROW
            }
            KernelId::RmsNormBwd(..) => RMSNORM_BWD_MAX_THREADS_PER_ROW,
            KernelId::RmsNormDw(..) => RMSNORM_DW_THREADS,
            KernelId::ZeroFill => ZERO_FILL_THREADS,
            KernelId::Empty => 32,
        }
    }

    /// A norm forward kernel's storage dtype, memory path and row variant (the w-first form is
    /// a v16, 16-per-thread kernel); `None` for other kernels.
    pub const fn rmsnorm_forward_form(self) -> Option<(DType, VecMode, NormFwdVariant)> {
        match self {
            KernelId::RmsNormFwd(d, v, n) => Some((d, v, n)),
            KernelId::RmsNormFwdWFirst(d) => Some((d, VecMode::V16, NormFwdVariant::E16)),
            _ => None,
        }
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
            RmsNormFwd(F32, V16, NormFwdVariant::E16) => "rmsnorm_fwd_f32_v16_e16",
            RmsNormFwd(F32, V16, NormFwdVariant::E32) => "rmsnorm_fwd_f32_v16_e32",
            RmsNormFwd(F32, V16, NormFwdVariant::Loop) => "rmsnorm_fwd_f32_v16_loop",
            RmsNormFwd(F32, Scalar, NormFwdVariant::E16) => "rmsnorm_fwd_f32_scalar_e16",
            RmsNormFwd(F32, Scalar, NormFwdVariant::E32) => "rmsnorm_fwd_f32_scalar_e32",
            RmsNormFwd(F32, Scalar, NormFwdVariant::Loop) => "rmsnorm_fwd_f32_scalar_loop",
            RmsNormFwd(F16, V16, NormFwdVariant::E16) => "rmsnorm_fwd_f16_v16_e16",
            RmsNormFwd(F16, V16, NormFwdVariant::E32) => "rmsnorm_fwd_f16_v16_e32",
            RmsNormFwd(F16, V16, NormFwdVariant::Loop) => "rmsnorm_fwd_f16_v16_loop",
            RmsNormFwd(F16, Scalar, NormFwdVariant::E16) => "rmsnorm_fwd_f16_scalar_e16",
            RmsNormFwd(F16, Scalar, NormFwdVariant::E32) => "rmsnorm_fwd_f16_scalar_e32",
            RmsNormFwd(F16, Scalar, NormFwdVariant::Loop) => "rmsnorm_fwd_f16_scalar_loop",
            RmsNormFwd(BF16, V16, NormFwdVariant::E16) => "rmsnorm_fwd_bf16_v16_e16",
            RmsNormFwd(BF16, V16, NormFwdVariant::E32) => "rmsnorm_fwd_bf16_v16_e32",
            RmsNormFwd(BF16, V16, NormFwdVariant::Loop) => "rmsnorm_fwd_bf16_v16_loop",
            RmsNormFwd(BF16, Scalar, NormFwdVariant::E16) => "rmsnorm_fwd_bf16_scalar_e16",
            RmsNormFwd(BF16, Scalar, NormFwdVariant::E32) => "rmsnorm_fwd_bf16_scalar_e32",
            RmsNormFwd(BF16, Scalar, NormFwdVariant::Loop) => "rmsnorm_fwd_bf16_scalar_loop",
            RmsNormFwdWFirst(F32) => "rmsnorm_fwd_f32_v16_e16_wfirst",
            RmsNormFwdWFirst(F16) => "rmsnorm_fwd_f16_v16_e16_wfirst",
            RmsNormFwdWFirst(BF16) => "rmsnorm_fwd_bf16_v16_e16_wfirst",
            RmsNormBwd(F32, V16, NormBwdVariant::E16) => "rmsnorm_bwd_f32_v16_e16",
            RmsNormBwd(F32, V16, NormBwdVariant::Loop) => "rmsnorm_bwd_f32_v16_loop",
            RmsNormBwd(F32, Scalar, NormBwdVariant::E16) => "rmsnorm_bwd_f32_scalar_e16",
            RmsNormBwd(F32, Scalar, NormBwdVariant::Loop) => "rmsnorm_bwd_f32_scalar_loop",
            RmsNormBwd(F16, V16, NormBwdVariant::E16) => "rmsnorm_bwd_f16_v16_e16",
            RmsNormBwd(F16, V16, NormBwdVariant::Loop) => "rmsnorm_bwd_f16_v16_loop",
            RmsNormBwd(F16, Scalar, NormBwdVariant::E16) => "rmsnorm_bwd_f16_scalar_e16",
            RmsNormBwd(F16, Scalar, NormBwdVariant::Loop) => "rmsnorm_bwd_f16_scalar_loop",
            RmsNormBwd(BF16, V16, NormBwdVariant::E16) => "rmsnorm_bwd_bf16_v16_e16",
            RmsNormBwd(BF16, V16, NormBwdVariant::Loop) => "rmsnorm_bwd_bf16_v16_loop",
            RmsNormBwd(BF16, Scalar, NormBwdVariant::E16) => "rmsnorm_bwd_bf16_scalar_e16",
            RmsNormBwd(BF16, Scalar, NormBwdVariant::Loop) => "rmsnorm_bwd_bf16_scalar_loop",
            RmsNormDw(F32) => "rmsnorm_dw_f32",
            RmsNormDw(F16) => "rmsnorm_dw_f16",
            RmsNormDw(BF16) => "rmsnorm_dw_bf16",
            ZeroFill => "zero_fill",
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
                let mut n = 0;
                while n < 3 {
                    let f = KernelId::RmsNormFwd(dt, vm, NormFwdVariant::ALL[n]);
                    all[f.index()] = f;
                    n += 1;
                }
                let mut n = 0;
                while n < 2 {
                    let b = KernelId::RmsNormBwd(dt, vm, NormBwdVariant::ALL[n]);
                    all[b.index()] = b;
                    n += 1;
                }
                v += 1;
            }
            let w = KernelId::RmsNormDw(dt);
            all[w.index()] = w;
            let f = KernelId::RmsNormFwdWFirst(dt);
            all[f.index()] = f;
            d += 1;
        }
        all[KernelId::ZeroFill.index()] = KernelId::ZeroFill;
        all[KernelId::Empty.index()] = KernelId::Empty;
        all
    };
}

/// Every kernel entry name, in index order.
pub fn kernel_names() -> impl Iterator<Item = &'static str> {
    KernelId::ALL.iter().map(|k| k.name())
}
