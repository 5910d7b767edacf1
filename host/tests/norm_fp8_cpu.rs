//! CPU tests of the add + RMSNorm FP8 forward's host side: every validation error (dtypes,
//! shapes, sizes, alignment, aliasing, scale shapes and dtypes, scaling arguments, row
//! length), the kernel, geometry and scale addressing each scheme plans, the kernel table,
//! and the reference `y` the GPU tests compare against. No GPU needed.

mod common;

use common::assert_matches;

use ferrofuse::fp8::DEFAULT_MIN_SCALE;
use ferrofuse::half::bf16;
use ferrofuse::norm::{NormNumerics, RmsNormFp8Descs, plan_rmsnorm_forward_fp8};
use ferrofuse::reference::{RmsNormRef, rmsnorm_forward_row, rmsnorm_y_f32};
use ferrofuse::{
    DType, Error, Fp8Scaling, GridLimits, KernelId, MatDesc, NormPath, RmsNormOptions, ScaleLayout,
    VecMode,
};
use ferrofuse_common::fp8::{FP8_PER_GROUP, FP8_PER_TOKEN, FP8_STATIC};
use ferrofuse_common::{
    NormFwdVariant, RMSNORM_LOOP_SMEM_BYTES, RMSNORM_REALIGNED_MAX_SMEM_BYTES, RMSNORM_SMEM_BYTES,
    RMSNORM_SPLIT_SMEM_BYTES, RMSNORM_STREAM_SMEM_BYTES, rmsnorm_fwd_geometry,
    rmsnorm_realigned_smem_bytes, rmsnorm_split_smem_bytes,
};

const BASE: u64 = 0x7f00_0000_0000;
/// Far enough apart for any test shape.
const GAP: u64 = 1 << 32;

fn mat(addr: u64, dtype: DType, rows: usize, cols: usize) -> MatDesc {
    MatDesc::contiguous(addr, rows * cols, dtype, rows, cols)
}

/// Add with `h` separate: x, residual, h of `dtype`, a weight, an rstd, y FP8, and the
/// scales `srows x scols`; all disjoint.
fn descs(dtype: DType, rows: usize, cols: usize, (sr, sc): (usize, usize)) -> RmsNormFp8Descs {
    RmsNormFp8Descs {
        x: mat(BASE, dtype, rows, cols),
        residual: Some(mat(BASE + GAP, dtype, rows, cols)),
        weight: mat(BASE + 2 * GAP, dtype, 1, cols),
        h: Some(mat(BASE + 3 * GAP, dtype, rows, cols)),
        rstd: Some(mat(BASE + 4 * GAP, DType::F32, rows, 1)),
        y: mat(BASE + 5 * GAP, DType::F8E4M3, rows, cols),
        scales: mat(BASE + 6 * GAP, DType::F32, sr, sc),
    }
}

fn opts() -> RmsNormOptions {
    RmsNormOptions::new(1e-6)
}

/// A device of 132 multiprocessors without clusters or the streamed kernels.
fn limits() -> GridLimits {
    GridLimits::uniform(132, 1)
}

#[test]
fn plans_the_norm_geometry_for_each_scheme() {
    let (rows, cols) = (16, 4096);
    let t = descs(DType::BF16, rows, cols, (1, 1));
    let l = plan_rmsnorm_forward_fp8(&t, &opts(), Fp8Scaling::Static, &limits()).unwrap();
    let (variant, g) = rmsnorm_fwd_geometry(DType::BF16, cols as u64);
    assert_eq!(
        l.kernel,
        KernelId::RmsNormFp8(DType::BF16, VecMode::V16, variant, FP8_STATIC)
    );
    assert_eq!(l.block, g.block_threads());
    assert_eq!(l.grid, rows as u32);
    assert_eq!(l.shared_mem_bytes, RMSNORM_SMEM_BYTES);
    assert_eq!(l.params.scheme, FP8_STATIC);
    assert_eq!(l.params.norm.y, t.y.addr);
    assert_eq!(l.params.norm.threads_per_row, g.threads_per_row);

    let t = descs(DType::BF16, rows, cols, (rows, 1));
    let l = plan_rmsnorm_forward_fp8(&t, &opts(), Fp8Scaling::per_token(), &limits()).unwrap();
    assert_eq!(l.params.scheme, FP8_PER_TOKEN);
    assert_eq!(l.params.scale_ub, f32::INFINITY);
    assert_eq!(l.params.min_scale, DEFAULT_MIN_SCALE);
    let ub = Fp8Scaling::PerToken {
        min_scale: 1e-3,
        scale_ub: Some(5.0),
    };
    let l = plan_rmsnorm_forward_fp8(&t, &opts(), ub, &limits()).unwrap();
    assert_eq!((l.params.min_scale, l.params.scale_ub), (1e-3, 5.0));

    // Groups of 128 bf16 columns are 16 chunks (lanes); of 64 f32 columns 16 too.
    let t = descs(DType::BF16, rows, cols, (rows, cols / 128));
    let s = Fp8Scaling::per_group(128, ScaleLayout::RowMajor);
    let l = plan_rmsnorm_forward_fp8(&t, &opts(), s, &limits()).unwrap();
    assert_eq!(l.params.scheme, FP8_PER_GROUP);
    assert_eq!((l.params.group_lanes, l.params.group_shift), (16, 4));
    assert_eq!(
        (l.params.scale_row, l.params.scale_group),
        (cols as u64 / 128, 1)
    );
    let mut t = descs(DType::F32, rows, cols, (cols / 64, rows));
    // Column-major scales with a padded row stride.
    t.scales = MatDesc {
        row_stride: 20,
        len: (cols / 64 - 1) * 20 + rows,
        ..t.scales
    };
    let s = Fp8Scaling::per_group(64, ScaleLayout::ColMajor);
    let l = plan_rmsnorm_forward_fp8(&t, &opts(), s, &limits()).unwrap();
    assert_eq!((l.params.group_lanes, l.params.group_shift), (16, 4));
    assert_eq!((l.params.scale_row, l.params.scale_group), (1, 20));
}

#[test]
fn paths_variants_and_flags() {
    // A row of 16384 takes the 32-per-thread geometry; an odd one the realigned path, with the
    // realigned staging (the weight on the grid) or the scalar path (the weight off it).
    let t = descs(DType::BF16, 2, 16384, (1, 1));
    let l = plan_rmsnorm_forward_fp8(&t, &opts(), Fp8Scaling::Static, &limits()).unwrap();
    assert_eq!(
        l.kernel,
        KernelId::RmsNormFp8(DType::BF16, VecMode::V16, NormFwdVariant::E32, FP8_STATIC)
    );
    let mut t = descs(DType::F16, 3, 4097, (3, 1));
    let l = plan_rmsnorm_forward_fp8(&t, &opts(), Fp8Scaling::per_token(), &limits()).unwrap();
    let realigned = KernelId::RmsNormFp8Realigned(DType::F16, NormFwdVariant::E16, FP8_PER_TOKEN);
    assert_eq!(l.kernel, realigned);
    let (_, g) = rmsnorm_fwd_geometry(DType::F16, 4097);
    assert_eq!(
        l.shared_mem_bytes,
        rmsnorm_realigned_smem_bytes(&g, DType::F16, false)
    );
    assert_eq!(l.block, g.block_threads());
    t.weight.addr += 2;
    let l = plan_rmsnorm_forward_fp8(&t, &opts(), Fp8Scaling::per_token(), &limits()).unwrap();
    assert_eq!(
        l.kernel,
        KernelId::RmsNormFp8(
            DType::F16,
            VecMode::Scalar,
            NormFwdVariant::E16,
            FP8_PER_TOKEN
        )
    );
    assert_eq!(l.shared_mem_bytes, RMSNORM_SMEM_BYTES);
    // The FP8 output off the 16-byte grid, every other operand on it: the realigned path.
    let mut t = descs(DType::BF16, 4, 1024, (1, 1));
    t.y.addr += 8;
    let l = plan_rmsnorm_forward_fp8(&t, &opts(), Fp8Scaling::Static, &limits()).unwrap();
    assert_eq!(
        l.kernel,
        KernelId::RmsNormFp8Realigned(DType::BF16, NormFwdVariant::E16, FP8_STATIC)
    );
    // f32 rows off the grid: the scalar path.
    let t = descs(DType::F32, 2, 4095, (1, 1));
    let l = plan_rmsnorm_forward_fp8(&t, &opts(), Fp8Scaling::Static, &limits()).unwrap();
    assert_eq!(
        l.kernel,
        KernelId::RmsNormFp8(DType::F32, VecMode::Scalar, NormFwdVariant::E16, FP8_STATIC)
    );
    // Plain norm: no residual, no h; Gemma and HF flags as the storage forward's.
    let mut t = descs(DType::BF16, 4, 1024, (1, 1));
    t.residual = None;
    t.h = None;
    t.rstd = None;
    let o = opts().with_gemma(true).with_numerics(NormNumerics::HfLlama);
    let l = plan_rmsnorm_forward_fp8(&t, &o, Fp8Scaling::Static, &limits()).unwrap();
    assert_eq!(
        (l.params.norm.residual, l.params.norm.h, l.params.norm.rstd),
        (0, 0, 0)
    );
    assert_eq!(l.params.norm.flags, 1 | 2);
    // No rows: nothing launched.
    let t = descs(DType::BF16, 0, 1024, (0, 1));
    let l = plan_rmsnorm_forward_fp8(&t, &opts(), Fp8Scaling::per_token(), &limits()).unwrap();
    assert_eq!(l.grid, 0);
}

#[test]
fn streams_rows_of_32_per_thread_past_one_wave() {
    let streamed = limits().with_streamed_rows(true);
    let plan = |dtype: DType, rows: usize, cols: usize, limits: &GridLimits| {
        let t = descs(dtype, rows, cols, (rows, 1));
        plan_rmsnorm_forward_fp8(&t, &opts(), Fp8Scaling::per_token(), limits).unwrap()
    };
    // Past one wave of 32-per-thread rows: the persistent grid, a block of the geometry's
    // threads per resident slot, the streamed entry of the scheme.
    for (dtype, cols) in [
        (DType::BF16, 16384),
        (DType::F16, 8200),
        (DType::F32, 12288),
    ] {
        let l = plan(dtype, 1000, cols, &streamed);
        let (_, g) = rmsnorm_fwd_geometry(dtype, cols as u64);
        assert_eq!(l.kernel, KernelId::RmsNormFp8Stream(dtype, FP8_PER_TOKEN));
        assert_eq!((l.grid, l.block), (132, g.block_threads()));
        assert_eq!(l.shared_mem_bytes, RMSNORM_STREAM_SMEM_BYTES);
        assert_eq!(l.params.norm.threads_per_row, g.threads_per_row);
    }
    let e32 = KernelId::RmsNormFp8(
        DType::BF16,
        VecMode::V16,
        NormFwdVariant::E32,
        FP8_PER_TOKEN,
    );
    // One wave or less, a device without the streamed kernel, rows of 16 per thread, the
    // scalar path: the register kernels.
    assert_eq!(plan(DType::BF16, 132, 16384, &streamed).kernel, e32);
    assert_eq!(plan(DType::BF16, 1000, 16384, &limits()).kernel, e32);
    let l = plan(DType::BF16, 1000, 8192, &streamed);
    assert!(matches!(
        l.kernel,
        KernelId::RmsNormFp8(_, VecMode::V16, NormFwdVariant::E16, _)
    ));
    let l = plan(DType::BF16, 1000, 16383, &streamed);
    assert!(matches!(
        l.kernel,
        KernelId::RmsNormFp8Realigned(_, NormFwdVariant::E32, _)
    ));
    for s in [FP8_STATIC, FP8_PER_TOKEN, FP8_PER_GROUP] {
        for d in DType::ALL {
            let k = KernelId::RmsNormFp8Stream(d, s);
            assert!(k.exists() && k.syncs_grid_dependency(), "{k:?}");
            assert_eq!(k.launch_bounds(), Some((512, 1)));
            assert_eq!(k.dynamic_smem_opt_in(), Some(RMSNORM_STREAM_SMEM_BYTES));
        }
    }
}

#[test]
fn plans_looped_rows_past_16384() {
    // Rows longer than the register geometries: the looped geometry and its ring, one row of
    // 512 threads per block, on the vector path or (off the grid) the scalar one; never the
    // realigned or streamed entries. Up to a row per two multiprocessors the loads-ahead form,
    // unless the limits turn it off.
    let no_ahead = limits().with_loop_ahead(false);
    for (d, hidden) in [
        (DType::BF16, 16512),
        (DType::F16, 20480),
        (DType::F32, 65536),
    ] {
        let (variant, g) = rmsnorm_fwd_geometry(d, hidden as u64);
        assert_eq!(variant, NormFwdVariant::Loop);
        let group = Fp8Scaling::per_group(128, ScaleLayout::RowMajor);
        for s in [Fp8Scaling::Static, Fp8Scaling::per_token(), group] {
            for (rows, limits, ahead) in [
                (3, &limits(), true),
                (66, &limits(), true),
                (67, &limits(), false),
                (3, &no_ahead, false),
            ] {
                let t = descs(d, rows, hidden, s.scale_shape(rows, hidden).unwrap());
                let l = plan_rmsnorm_forward_fp8(&t, &opts(), s, limits).unwrap();
                let scheme = l.params.scheme;
                let want = if ahead {
                    KernelId::RmsNormFp8LoopAhead(d, VecMode::V16, scheme)
                } else {
                    KernelId::RmsNormFp8(d, VecMode::V16, NormFwdVariant::Loop, scheme)
                };
                assert_eq!(l.kernel, want, "{rows} rows");
                assert_eq!(
                    (l.grid, l.block, l.shared_mem_bytes),
                    (rows as u32, g.block_threads(), RMSNORM_LOOP_SMEM_BYTES)
                );
                assert_eq!(l.params.norm.threads_per_row, 512);
            }
        }
        let t = descs(d, 3, hidden + 1, (3, 1));
        let l = plan_rmsnorm_forward_fp8(&t, &opts(), Fp8Scaling::per_token(), &limits()).unwrap();
        assert_eq!(
            l.kernel,
            KernelId::RmsNormFp8LoopAhead(d, VecMode::Scalar, FP8_PER_TOKEN)
        );
    }
}

#[test]
fn splits_few_looped_rows_over_a_cluster() {
    let clusters = limits().with_clusters(true);
    let plan = |d: DType, rows: usize, hidden: usize, s: Fp8Scaling, limits: &GridLimits| {
        let t = descs(d, rows, hidden, s.scale_shape(rows, hidden).unwrap());
        plan_rmsnorm_forward_fp8(&t, &opts(), s, limits).unwrap()
    };
    let group = Fp8Scaling::per_group(128, ScaleLayout::ColMajor);
    // Looped rows of up to 8 tiles (of 8192 elements): a cluster of a block per tile, on the
    // vector path at up to half as many rows as multiprocessors (66 of 132) and, for rows of
    // fewer than 8 tiles, three blocks per two multiprocessors (198); off the grid below.
    for (d, hidden, tiles, most) in [
        (DType::BF16, 16512, 3, 66),
        (DType::F16, 32768, 4, 49),
        (DType::F16, 57344, 7, 28),
        (DType::F32, 65536, 8, 66),
    ] {
        for s in [Fp8Scaling::Static, Fp8Scaling::per_token(), group] {
            for rows in [1, 7, most] {
                let l = plan(d, rows, hidden, s, &clusters);
                let scheme = l.params.scheme;
                assert_eq!(
                    l.kernel,
                    KernelId::RmsNormFp8Split(d, NormPath::V16, scheme)
                );
                assert_eq!(
                    (l.grid, l.block, l.shared_mem_bytes),
                    (rows as u32 * tiles, 512, RMSNORM_SPLIT_SMEM_BYTES)
                );
                assert_eq!(l.params.norm.threads_per_row, 512);
            }
            // More rows, or no clusters: one block per row (with its loads ahead up to a row
            // per two multiprocessors).
            for (rows, limits) in [(most + 1, &clusters), (67, &clusters), (7, &limits())] {
                let l = plan(d, rows, hidden, s, limits);
                assert!(matches!(
                    l.kernel,
                    KernelId::RmsNormFp8(_, VecMode::V16, NormFwdVariant::Loop, _)
                        | KernelId::RmsNormFp8LoopAhead(_, VecMode::V16, _)
                ));
                assert_eq!(l.grid, rows as u32);
            }
        }
        // Off the grid: 16-bit rows with a 16-byte aligned weight on the realigned path (its
        // staging after the split's slots) at any number of rows; f32 rows, and rows whose
        // weight is off the grid, on the scalar path by the rule above.
        for rows in [7, most + 1, 4096] {
            let s = Fp8Scaling::per_token();
            let l = plan(d, rows, hidden - 1, s, &clusters);
            let (path, smem) = if d == DType::F32 {
                (NormPath::Scalar, RMSNORM_SPLIT_SMEM_BYTES)
            } else {
                let smem = rmsnorm_split_smem_bytes(d, NormPath::Realigned, NormFwdVariant::E16);
                (NormPath::Realigned, smem.unwrap())
            };
            if rows == 7 || path == NormPath::Realigned {
                assert_eq!(l.kernel, KernelId::RmsNormFp8Split(d, path, FP8_PER_TOKEN));
                assert_eq!((l.grid, l.shared_mem_bytes), (rows as u32 * tiles, smem));
            } else {
                assert_matches!(
                    l.kernel,
                    KernelId::RmsNormFp8(_, VecMode::Scalar, _, _)
                        | KernelId::RmsNormFp8LoopAhead(_, VecMode::Scalar, _)
                );
            }
            let mut t = descs(
                d,
                rows,
                hidden - 1,
                s.scale_shape(rows, hidden - 1).unwrap(),
            );
            t.weight = mat(t.weight.addr + d.size_bytes() as u64, d, 1, hidden - 1);
            let l = plan_rmsnorm_forward_fp8(&t, &opts(), s, &clusters).unwrap();
            if rows == 7 {
                assert_eq!(
                    (l.kernel, l.shared_mem_bytes),
                    (
                        KernelId::RmsNormFp8Split(d, NormPath::Scalar, FP8_PER_TOKEN),
                        RMSNORM_SPLIT_SMEM_BYTES
                    )
                );
            } else {
                assert_matches!(
                    l.kernel,
                    KernelId::RmsNormFp8(_, VecMode::Scalar, _, _)
                        | KernelId::RmsNormFp8LoopAhead(_, VecMode::Scalar, _)
                );
            }
        }
    }
    // Rows of more than 8 tiles, and rows held in registers: never split.
    let l = plan(DType::BF16, 7, 65544, Fp8Scaling::Static, &clusters);
    assert!(matches!(
        l.kernel,
        KernelId::RmsNormFp8LoopAhead(_, _, FP8_STATIC)
    ));
    let l = plan(DType::BF16, 7, 16384, Fp8Scaling::Static, &clusters);
    assert!(matches!(
        l.kernel,
        KernelId::RmsNormFp8(_, _, NormFwdVariant::E32, _)
    ));
}

#[test]
fn every_fp8_norm_kernel_is_in_the_table() {
    for s in [FP8_STATIC, FP8_PER_TOKEN, FP8_PER_GROUP] {
        for d in DType::ALL {
            for m in [VecMode::V16, VecMode::Scalar] {
                for v in [
                    NormFwdVariant::E16,
                    NormFwdVariant::E32,
                    NormFwdVariant::Loop,
                ] {
                    let k = KernelId::RmsNormFp8(d, m, v, s);
                    assert!(k.exists(), "{k:?}");
                    assert!(k.syncs_grid_dependency());
                    // Looped f32 rows on the scalar path spilled at two blocks per SM.
                    let looped =
                        v == NormFwdVariant::Loop && (d, m) != (DType::F32, VecMode::Scalar);
                    let two = (m, v) == (VecMode::V16, NormFwdVariant::E16) || looped;
                    let blocks = if two { 2 } else { 1 };
                    assert_eq!(k.launch_bounds(), Some((512, blocks)));
                    assert!(k.rmsnorm_forward_form().is_none());
                }
            }
        }
    }
    for s in [FP8_STATIC, FP8_PER_TOKEN, FP8_PER_GROUP] {
        for d in DType::ALL {
            for v in [NormFwdVariant::E16, NormFwdVariant::E32] {
                let k = KernelId::RmsNormFp8Realigned(d, v, s);
                // 16-bit dtypes only (f32 rows take the scalar path).
                let built = d != DType::F32;
                assert_eq!(k.exists(), built, "{k:?}");
                if built {
                    assert!(k.syncs_grid_dependency());
                    let blocks = if v == NormFwdVariant::E16 { 2 } else { 1 };
                    assert_eq!(k.launch_bounds(), Some((512, blocks)));
                    assert!(k.dynamic_smem_opt_in().is_some());
                    assert!(k.rmsnorm_forward_form().is_none());
                }
            }
        }
    }
    for s in [FP8_STATIC, FP8_PER_TOKEN, FP8_PER_GROUP] {
        for d in DType::ALL {
            for m in [NormPath::V16, NormPath::Scalar, NormPath::Realigned] {
                let k = KernelId::RmsNormFp8Split(d, m, s);
                // The realigned path for 16-bit dtypes only (f32 rows take the scalar path).
                let realigned = m == NormPath::Realigned;
                if realigned && d == DType::F32 {
                    assert!(!k.exists(), "{k:?}");
                    continue;
                }
                assert!(k.exists() && k.syncs_grid_dependency(), "{k:?}");
                // f32 per group on the vector path spilled at two blocks per SM.
                let spilled = (d, m, s) == (DType::F32, NormPath::V16, FP8_PER_GROUP);
                let blocks = if spilled { 1 } else { 2 };
                assert_eq!(k.launch_bounds(), Some((512, blocks)));
                let opt_in = realigned.then_some(RMSNORM_REALIGNED_MAX_SMEM_BYTES);
                assert_eq!(k.dynamic_smem_opt_in(), opt_in);
            }
        }
    }
    for s in [FP8_STATIC, FP8_PER_TOKEN, FP8_PER_GROUP] {
        for d in DType::ALL {
            for m in [VecMode::V16, VecMode::Scalar] {
                let k = KernelId::RmsNormFp8LoopAhead(d, m, s);
                assert!(k.exists() && k.syncs_grid_dependency(), "{k:?}");
                assert_eq!(k.launch_bounds(), Some((512, 1)));
                assert_eq!(k.dynamic_smem_opt_in(), None);
            }
        }
    }
    // Looped rows off the grid take the scalar entries: no realigned looped FP8 entry.
    let loop_form = KernelId::RmsNormFp8Realigned(DType::BF16, NormFwdVariant::Loop, FP8_STATIC);
    assert!(!loop_form.exists());
}

#[test]
fn rejects_bad_operands() {
    let (rows, cols) = (8, 1024);
    let base = descs(DType::BF16, rows, cols, (rows, 1));
    let plan =
        |t: &RmsNormFp8Descs, s: Fp8Scaling| plan_rmsnorm_forward_fp8(t, &opts(), s, &limits());
    let tok = Fp8Scaling::per_token();

    // y must be FP8, the scales f32 of the right shape.
    let mut t = base;
    t.y.dtype = DType::BF16;
    assert_matches!(plan(&t, tok), Err(Error::DTypeMismatch { tensor: "y", .. }));
    let mut t = base;
    t.scales.dtype = DType::BF16;
    assert_matches!(
        plan(&t, tok),
        Err(Error::DTypeMismatch {
            tensor: "scales",
            ..
        })
    );
    let t = descs(DType::BF16, rows, cols, (rows, 2));
    assert_matches!(
        plan(&t, tok),
        Err(Error::ShapeMismatch {
            tensor: "scales",
            ..
        })
    );
    assert_matches!(
        plan(&base, Fp8Scaling::Static),
        Err(Error::ShapeMismatch {
            tensor: "scales",
            ..
        })
    );
    // Groups: 64 or 128, dividing the row.
    let t = descs(DType::BF16, rows, 1000, (rows, 7));
    assert_matches!(
        plan(&t, Fp8Scaling::per_group(128, ScaleLayout::RowMajor)),
        Err(Error::GroupMismatch { .. })
    );
    assert_matches!(
        plan(&base, Fp8Scaling::per_group(32, ScaleLayout::RowMajor)),
        Err(Error::InvalidArgument { .. })
    );
    // Scaling arguments.
    for bad in [
        Fp8Scaling::PerToken {
            min_scale: 0.0,
            scale_ub: None,
        },
        Fp8Scaling::PerToken {
            min_scale: 1e-3,
            scale_ub: Some(f32::NAN),
        },
    ] {
        assert_matches!(plan(&base, bad), Err(Error::InvalidArgument { .. }));
    }
    // FP8 inputs are rejected; mismatched shapes and dtypes.
    let mut t = base;
    t.x.dtype = DType::F8E4M3;
    assert_matches!(plan(&t, tok), Err(Error::UnsupportedDType { .. }));
    let mut t = base;
    t.residual = Some(mat(BASE + GAP, DType::F16, rows, cols));
    assert_matches!(
        plan(&t, tok),
        Err(Error::DTypeMismatch {
            tensor: "residual",
            ..
        })
    );
    let mut t = base;
    t.y = mat(BASE + 5 * GAP, DType::F8E4M3, rows, cols - 8);
    assert_matches!(plan(&t, tok), Err(Error::ShapeMismatch { tensor: "y", .. }));
    let mut t = base;
    t.h = None;
    assert_matches!(plan(&t, tok), Err(Error::InvalidArgument { what: "h", .. }));
    let mut t = base;
    t.rstd = Some(mat(BASE + 4 * GAP, DType::F32, rows, 2));
    assert_matches!(
        plan(&t, tok),
        Err(Error::ShapeMismatch { tensor: "rstd", .. })
    );
    // Buffers too small, misaligned.
    let mut t = base;
    t.y.len -= 1;
    assert_matches!(
        plan(&t, tok),
        Err(Error::BufferTooSmall { tensor: "y", .. })
    );
    let mut t = base;
    t.scales.len = 0;
    assert_matches!(
        plan(&t, tok),
        Err(Error::BufferTooSmall {
            tensor: "scales",
            ..
        })
    );
    let mut t = base;
    t.scales.addr += 2;
    assert_matches!(
        plan(&t, tok),
        Err(Error::Misaligned {
            tensor: "scales",
            ..
        })
    );
    // eps.
    assert_matches!(
        plan_rmsnorm_forward_fp8(&base, &RmsNormOptions::new(0.0), tok, &limits()),
        Err(Error::InvalidArgument { what: "eps", .. })
    );
}

#[test]
fn rejects_aliasing() {
    let (rows, cols) = (8, 1024);
    let base = descs(DType::BF16, rows, cols, (rows, 1));
    let plan = |t: &RmsNormFp8Descs| {
        plan_rmsnorm_forward_fp8(t, &opts(), Fp8Scaling::per_token(), &limits())
    };
    // h may be exactly x or exactly residual.
    let mut t = base;
    t.h = Some(t.x);
    plan(&t).unwrap();
    let mut t = base;
    t.h = t.residual;
    plan(&t).unwrap();
    // y over an input or over h; scales over y, x, rstd; rstd over x; h over the weight.
    let y_at = |addr: u64| MatDesc { addr, ..base.y };
    for (t, output) in [
        (
            RmsNormFp8Descs {
                y: y_at(base.x.addr),
                ..base
            },
            "y",
        ),
        (
            RmsNormFp8Descs {
                y: y_at(base.h.unwrap().addr + 64),
                ..base
            },
            "y",
        ),
        (
            RmsNormFp8Descs {
                scales: MatDesc {
                    addr: base.y.addr,
                    ..base.scales
                },
                ..base
            },
            "y",
        ),
        (
            RmsNormFp8Descs {
                scales: MatDesc {
                    addr: base.rstd.unwrap().addr,
                    ..base.scales
                },
                ..base
            },
            "scales",
        ),
        (
            RmsNormFp8Descs {
                rstd: Some(MatDesc {
                    addr: base.x.addr,
                    ..base.rstd.unwrap()
                }),
                ..base
            },
            "rstd",
        ),
        (
            RmsNormFp8Descs {
                h: Some(MatDesc {
                    addr: base.weight.addr,
                    ..base.h.unwrap()
                }),
                ..base
            },
            "h",
        ),
        (
            RmsNormFp8Descs {
                h: Some(MatDesc {
                    addr: base.x.addr + 2,
                    ..base.h.unwrap()
                }),
                ..base
            },
            "h",
        ),
    ] {
        match plan(&t) {
            Err(Error::Aliasing { output: o, .. }) => assert_eq!(o, output, "{t:?}"),
            other => panic!("{output}: expected an aliasing error, got {other:?}"),
        }
    }
}

/// The reference `y` the GPU tests quantise: f32 arithmetic, within a few f32 ulps of the f64
/// reference's `y` when given the f64 `rstd` rounded to f32, in both numerics modes.
#[test]
fn reference_y_f32_follows_the_f64_reference() {
    let cols = 300;
    let x: Vec<bf16> = (0..cols)
        .map(|i| bf16::from_f32(((i * 37 % 101) as f32 - 50.0) / 13.0))
        .collect();
    let r: Vec<bf16> = (0..cols)
        .map(|i| bf16::from_f32(((i * 53 % 97) as f32 - 48.0) / 17.0))
        .collect();
    let w: Vec<f32> = (0..cols).map(|i| 0.5 + (i % 7) as f32 / 7.0).collect();
    let wf: Vec<f64> = w.iter().map(|&v| v as f64).collect();
    for hf in [false, true] {
        for gemma in [false, true] {
            let o = RmsNormRef {
                eps: 1e-6,
                gemma,
                hf,
                normalize_stored_h: false,
            };
            let row = rmsnorm_forward_row(&x, Some(&r), &wf, &o);
            let y = rmsnorm_y_f32(&x, Some(&r), &w, row.rstd as f32, &o);
            for (c, (&g, &want)) in y.iter().zip(&row.y).enumerate() {
                let tol = 4.0 * f32::EPSILON as f64 * want.abs().max(1e-3);
                // HF rounds n to bf16: a different f32 rstd may move n across a bf16 boundary.
                let tol = if hf { want.abs() / 128.0 + tol } else { tol };
                assert!(
                    (g as f64 - want).abs() <= tol,
                    "hf {hf} gemma {gemma} col {c}: {g} vs {want}"
                );
            }
        }
    }
}

/// The bf16 rounding the references use is correct: values just above a halfway point (the
/// excess in the low bits of an f32) round up, exact halves to even, like `cvt.rn.bf16.f32`.
#[test]
fn bf16_from_f64_rounds_correctly() {
    use ferrofuse::Element;
    for (bits, want) in [
        (0x3f80_8001u32, 0x3f81u16), // 1 + 2^-8 + 2^-23: above the half, up
        (0x3f80_8000, 0x3f80),       // exactly half, to even (down)
        (0x3f81_8000, 0x3f82),       // exactly half, to even (up)
        (0xbf80_8001, 0xbf81),       // negative, above the half
        (0x3f80_7fff, 0x3f80),       // below the half
    ] {
        let v = f32::from_bits(bits);
        assert_eq!(
            <bf16 as Element>::from_f64(v as f64).to_bits(),
            want,
            "{v:e}"
        );
        assert_eq!(bf16::from_f32(v).to_bits(), want, "{v:e}");
    }
    // An f64 just above a half that f32 would round onto the half.
    let v = 1.0 + 2f64.powi(-8) + 2f64.powi(-40);
    assert_eq!(<bf16 as Element>::from_f64(v).to_bits(), 0x3f81);
    assert!(<bf16 as Element>::from_f64(f64::NAN).is_nan());
    assert_eq!(<bf16 as Element>::from_f64(f64::INFINITY), bf16::INFINITY);
}
