//! GPU tests of the gated forward with FP8 E4M3 outputs: every activation x dtype x layout x
//! scaling scheme (static; per token, with and without an upper bound; per group of 128
//! row-major and of 64 column-major), vector and scalar paths, one-tile and looped rows.
//!
//! Two checks per case:
//! - **bit for bit** against `torch.float8_e4m3fn` semantics as the reference implements them
//!   (`reference::fp8::quantize_rows`: `y / scale` in f32, round to nearest even, saturate to
//!   +-448): the f32 `y` the kernels compute is taken from the plain f32 gated kernel on the
//!   same inputs widened to f32 (the same activation code, all of it `.rn` arithmetic), and
//!   its quantisation on the CPU must equal the kernel's bytes and scales exactly (any NaN
//!   byte matches any NaN byte);
//! - **against the f64 reference**: each byte within one E4M3 step of `e4m3(y64 / scale)` and
//!   each dynamic scale within 1e-4 relative of `amax64 / 448`. Exactly equal is impossible
//!   there: the f32 `y` differs from the f64 one by the activation's f32 error (up to 256
//!   f32 ulps for f32 inputs, see `gpu_gated.rs`), which moves a value across an E4M3
//!   rounding boundary when it lies that close to one.
//!
//! Rows of zeros (scale `min_scale`, bytes zero) and NaN inputs (NaN bytes, the scale of the
//! rest) are in every case. `FERROFUSE_TEST_QUICK=1` trims the shapes (compute-sanitizer).

mod common;

use std::sync::Arc;

use common::fp8::*;
use common::*;
use ferrofuse::cudarc::driver::CudaStream;
use ferrofuse::gated::plan_gated_forward_fp8;
use ferrofuse::half::{bf16, f16};
use ferrofuse::reference::fp8::{e4m3_bits, e4m3_value, quantize_rows};
use ferrofuse::{
    Activation, DType, Element, F8E4M3, Fp8Scales, Fp8Scaling, KernelId, Kernels, Launch, Mat,
    MatDesc, MatMut, ScaleLayout, VecMode, reference,
};
use ferrofuse_common::{
    FlatEnds, GATED_FP8_ROW_CHUNKS, GATED_FP8_ROW_MAX_THREADS, GATED_THREADS, GatedFp8Params,
};
use rand::rngs::StdRng;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Layout {
    Split,
    /// Every operand one element into its buffer: off the 16-byte grid (the realigned kernels
    /// for static scales and per-token rows of one tile, the scalar path otherwise).
    SplitOffset,
    /// Every operand dense, one element into its buffer (`y` too): for a static scale, one
    /// flat range (the vector kernel's body, its ragged head and tail on the grid's last
    /// threads).
    SplitFlat,
    Interleaved,
}

fn shapes() -> Vec<(usize, usize)> {
    if quick() {
        // A one-tile row with several per-token rows per block, and a two-tile bf16/f16 row.
        return vec![(3, 384), (2, 14336), (2, 28672)];
    }
    vec![
        (1, 128),
        (3, 384),
        (5, 100),
        (7, 4097),
        (4, 14336),
        (2, 28672),
        (33, 1024),
        (300, 256),
        (64, 4096),
        (1, 40960),
        (2, 7),
    ]
}

#[allow(clippy::too_many_arguments)]
fn case<T: Element>(
    k: &Kernels,
    s: &Arc<CudaStream>,
    rng: &mut StdRng,
    act: Activation,
    layout: Layout,
    scaling: Fp8Scaling,
    (rows, cols): (usize, usize),
) {
    let n = rows * cols;
    let (mut a, _) = random::<T>(rng, n, 8.0);
    let (mut b, _) = random::<T>(rng, n, 2.0);
    // Row 0 zeros (when there is another row), and a NaN in the last row.
    if rows > 1 {
        a[..cols].fill(T::from_f64(0.0));
    }
    if rows > 2 {
        b[(rows - 1) * cols + cols / 2] = T::from_f64(f64::NAN);
    }
    let what = format!(
        "{act:?} {} {layout:?} {scaling:?} {rows}x{cols}",
        T::DTYPE.name()
    );
    let static_scale = 0.03f32;

    // The f32 y the kernels compute: the plain f32 kernel on the widened inputs.
    let (a32, b32): (Vec<f32>, Vec<f32>) = (
        a.iter().map(|v| v.to_f64() as f32).collect(),
        b.iter().map(|v| v.to_f64() as f32).collect(),
    );
    let (da32, db32) = (upload(s, &a32), upload(s, &b32));
    let mut dy32 = s.alloc_zeros::<f32>(n).expect("alloc");
    k.gated(
        s,
        act,
        &Mat::new(da32.as_view(), rows, cols),
        &Mat::new(db32.as_view(), rows, cols),
        &mut MatMut::new(dy32.as_view_mut(), rows, cols),
    )
    .expect("f32 forward");
    let y32 = download(s, &dy32);

    // The FP8 call: y with a padded row stride (dense and one element in for `SplitFlat`, a
    // byte after it), poisoned (0x7f, NaN) beforehand.
    let (y_stride, y_off) = match layout {
        Layout::SplitFlat => (cols, 1),
        _ => (cols + 16, 0),
    };
    let mut dq = upload(
        s,
        &vec![F8E4M3::from_bits(0x7f); 2 * y_off + rows * y_stride],
    );
    let (sr, sc, s_stride) = scale_layout(scaling, rows, cols);
    let s_len = if sr == 0 { 0 } else { (sr - 1) * s_stride + sc };
    let mut ds = upload(s, &vec![f32::NAN; s_len.max(1)]);
    if scaling == Fp8Scaling::Static {
        ds = upload(s, &[static_scale]);
    }
    {
        let mut y = MatMut::strided(dq.slice_mut(y_off..), rows, cols, y_stride);
        match layout {
            Layout::Split | Layout::SplitOffset | Layout::SplitFlat => {
                let off = usize::from(layout != Layout::Split);
                let pad = |v: &[T]| {
                    let mut out = vec![poison::<T>(); off];
                    out.extend_from_slice(v);
                    out
                };
                let (da, db) = (upload(s, &pad(&a)), upload(s, &pad(&b)));
                let (va, vb) = (da.slice(off..), db.slice(off..));
                let (ma, mb) = (Mat::new(va, rows, cols), Mat::new(vb, rows, cols));
                let res = if scaling == Fp8Scaling::Static {
                    let m = Mat::new(ds.as_view(), 1, 1);
                    k.gated_fp8(s, act, &ma, &mb, &mut y, scaling, Fp8Scales::Read(&m))
                } else {
                    let mut m = MatMut::strided(ds.as_view_mut(), sr, sc, s_stride);
                    k.gated_fp8(s, act, &ma, &mb, &mut y, scaling, Fp8Scales::Write(&mut m))
                };
                res.unwrap_or_else(|e| panic!("{what}: {e}"));
            }
            Layout::Interleaved => {
                let stride = 2 * cols + 8;
                let mut x = vec![poison::<T>(); rows * stride];
                for r in 0..rows {
                    x[r * stride..r * stride + cols].copy_from_slice(&a[r * cols..(r + 1) * cols]);
                    x[r * stride + cols..r * stride + 2 * cols]
                        .copy_from_slice(&b[r * cols..(r + 1) * cols]);
                }
                let dx = upload(s, &x);
                let mx = Mat::strided(dx.as_view(), rows, 2 * cols, stride);
                let res = if scaling == Fp8Scaling::Static {
                    let m = Mat::new(ds.as_view(), 1, 1);
                    k.gated_interleaved_fp8(s, act, &mx, &mut y, scaling, Fp8Scales::Read(&m))
                } else {
                    let mut m = MatMut::strided(ds.as_view_mut(), sr, sc, s_stride);
                    k.gated_interleaved_fp8(s, act, &mx, &mut y, scaling, Fp8Scales::Write(&mut m))
                };
                res.unwrap_or_else(|e| panic!("{what}: {e}"));
            }
        }
    }
    let q_buf = download(s, &dq);
    // The bytes around y are untouched.
    if y_off > 0 {
        assert_eq!(q_buf[0].to_bits(), 0x7f, "{what}: byte before y");
        assert_eq!(
            q_buf.last().unwrap().to_bits(),
            0x7f,
            "{what}: byte after y"
        );
    }
    let q_all = &q_buf[y_off..];
    let got_q: Vec<u8> = (0..rows)
        .flat_map(|r| {
            q_all[r * y_stride..r * y_stride + cols]
                .iter()
                .map(|v| v.to_bits())
        })
        .collect();
    // The padding of y is untouched.
    for r in 0..rows {
        for c in cols..y_stride {
            if r * y_stride + c < q_all.len() {
                assert_eq!(q_all[r * y_stride + c].to_bits(), 0x7f, "{what}: padding");
            }
        }
    }
    let got_s = scales_row_major(scaling, &download(s, &ds), rows, cols);

    // Bit for bit: the reference's quantisation of the kernels' f32 y.
    let (want_q, want_s) =
        quantize_rows(&y32, rows, cols, reference_scaling(scaling, static_scale));
    if scaling != Fp8Scaling::Static {
        for (i, (g, w)) in got_s.iter().zip(&want_s).enumerate() {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{what}: scale {i}: {g:e} != {w:e}"
            );
        }
    }
    for (i, (&g, &w)) in got_q.iter().zip(&want_q).enumerate() {
        assert!(
            same_byte(g, w),
            "{what}: element {i} ({}, {}): byte {g:#04x} != {w:#04x} (y = {:e})",
            i / cols,
            i % cols,
            y32[i]
        );
    }

    // Against the f64 reference.
    let af: Vec<f64> = a.iter().map(|v| v.to_f64()).collect();
    let bf: Vec<f64> = b.iter().map(|v| v.to_f64()).collect();
    let y64 = reference::gated_forward(act, &af, &bf);
    let scale_of = |i: usize| -> f64 {
        let (r, c) = (i / cols, i % cols);
        match scaling {
            Fp8Scaling::Static => static_scale as f64,
            Fp8Scaling::PerToken { .. } => got_s[r] as f64,
            Fp8Scaling::PerGroup { group, .. } => got_s[r * (cols / group) + c / group] as f64,
        }
    };
    for (i, &g) in got_q.iter().enumerate() {
        let want = e4m3_bits(y64[i] / scale_of(i));
        if y64[i].is_nan() {
            assert!(g & 0x7f == 0x7f, "{what}: element {i}: NaN became {g:#04x}");
            continue;
        }
        let steps = ordinal(DType::F8E4M3, e4m3_value(g))
            .abs_diff(ordinal(DType::F8E4M3, e4m3_value(want)));
        assert!(
            steps <= 1,
            "{what}: element {i}: {} vs the f64 reference's {} ({steps} E4M3 steps)",
            e4m3_value(g),
            e4m3_value(want)
        );
    }
    if let Fp8Scaling::PerToken {
        min_scale,
        scale_ub,
    } = scaling
    {
        for r in 0..rows {
            let amax = y64[r * cols..(r + 1) * cols]
                .iter()
                .filter(|v| !v.is_nan())
                .fold(0.0f64, |m, v| m.max(v.abs()));
            let amax = scale_ub.map_or(amax, |ub| amax.min(ub as f64));
            let want = (amax / 448.0).max(min_scale as f64);
            let got = got_s[r] as f64;
            assert!(
                (got - want).abs() <= 1e-4 * want,
                "{what}: row {r} scale {got:e}, f64 reference {want:e}"
            );
        }
    }
    if rows > 1 && scaling != Fp8Scaling::Static {
        assert!(
            got_q[..cols].iter().all(|&v| v & 0x7f == 0),
            "{what}: zero row"
        );
    }
}

/// One SiLU case of `dtype` (the memory paths do not depend on the activation), named with
/// its test and seed when it fails.
#[allow(clippy::too_many_arguments)]
fn silu_case(
    k: &Kernels,
    s: &Arc<CudaStream>,
    rng: &mut StdRng,
    (test, seed): (&str, u64),
    dtype: DType,
    layout: Layout,
    scaling: Fp8Scaling,
    shape: (usize, usize),
) {
    with_seed(test, seed, || {
        typed!(
            dtype,
            case::<T>(k, s, rng, Activation::Silu, layout, scaling, shape)
        )
    });
}

/// Runs one case; when it fails, names the test and its generator's seed first.
fn with_seed(test: &str, seed: u64, case: impl FnOnce()) {
    if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(case)) {
        eprintln!("{test}: failed with seed {seed:#x}");
        std::panic::resume_unwind(p);
    }
}

fn run(test: &'static str, layout: Layout) {
    let Some((k, s)) = gpu(test) else { return };
    for dtype in DType::ALL {
        let (mut rng, seed) = rng();
        // Under compute-sanitizer (quick) one activation: the memory paths do not depend on it.
        let acts: &[Activation] = if quick() {
            &[Activation::Silu]
        } else {
            &Activation::ALL
        };
        for &act in acts {
            for shape in shapes() {
                for scaling in schemes(shape.1) {
                    with_seed(test, seed, || {
                        typed!(
                            dtype,
                            case::<T>(&k, &s, &mut rng, act, layout, scaling, shape)
                        )
                    });
                }
            }
        }
    }
}

#[test]
fn fp8_split() {
    run("fp8_split", Layout::Split);
}

#[test]
fn fp8_split_offset_scalar_path() {
    run("fp8_split_offset_scalar_path", Layout::SplitOffset);
}

#[test]
fn fp8_interleaved() {
    run("fp8_interleaved", Layout::Interleaved);
}

/// The middle grid regime of the flat kernels, where threads walk more than one step: rows
/// chosen from this device's residency so the per-group plan has between one and two resident
/// waves of pairs (the static one between one and four of accesses), with the last step left to
/// part of the threads. SiLU (the walk does not depend on the activation), every scheme.
#[test]
fn fp8_middle_regime() {
    let test = "fp8_middle_regime";
    let Some((k, s)) = gpu(test) else { return };
    let cols = 4096;
    for dtype in DType::ALL {
        let (mut rng, seed) = rng();
        let pairs_per_row = (cols / dtype.lanes_per_16b() / 2) as u64;
        let resident =
            k.limits()
                .resident_blocks(KernelId::GatedFp8Group(dtype, VecMode::V16)) as u64
                * GATED_THREADS as u64;
        let rows = (resident * 3 / 2 / pairs_per_row + 1) as usize;
        let mat =
            |addr: u64, dtype, cols| MatDesc::contiguous(addr, rows * cols, dtype, rows, cols);
        let (a, b, y) = (
            mat(1 << 40, dtype, cols),
            mat(1 << 41, dtype, cols),
            mat(1 << 42, DType::F8E4M3, cols),
        );
        for (scaling, scales) in [
            (
                Fp8Scaling::Static,
                MatDesc::contiguous(1 << 43, 1, DType::F32, 1, 1),
            ),
            (
                Fp8Scaling::per_group(128, ScaleLayout::RowMajor),
                mat(1 << 43, DType::F32, cols / 128),
            ),
        ] {
            let plan =
                plan_gated_forward_fp8(Activation::Silu, &a, &b, &y, scaling, &scales, k.limits())
                    .unwrap();
            // Each scheme's own entry sets its residency (their registers differ).
            let resident = k.limits().resident_blocks(plan.kernel) as u64 * GATED_THREADS as u64;
            let threads = plan.grid as u64 * GATED_THREADS as u64;
            let steps = rows as u64 * plan.params.walk.per_row;
            assert!(
                threads <= resident && steps > threads,
                "{dtype:?} {rows}x{cols} {scaling:?}: {threads} threads for {steps} steps"
            );
        }
        for scaling in schemes(cols) {
            silu_case(
                &k,
                &s,
                &mut rng,
                (test, seed),
                dtype,
                Layout::Split,
                scaling,
                (rows, cols),
            );
        }
    }
}

/// The launch this device's planner gives a dense split per-token SiLU call of `rows x cols`.
fn per_token_plan(
    k: &Kernels,
    dtype: DType,
    (rows, cols): (usize, usize),
) -> Launch<GatedFp8Params> {
    let mat = |addr: u64, dtype, cols| MatDesc::contiguous(addr, rows * cols, dtype, rows, cols);
    plan_gated_forward_fp8(
        Activation::Silu,
        &mat(1 << 40, dtype, cols),
        &mat(1 << 41, dtype, cols),
        &mat(1 << 42, DType::F8E4M3, cols),
        Fp8Scaling::per_token(),
        &mat(1 << 43, DType::F32, 1),
        k.limits(),
    )
    .unwrap()
}

/// Per-token rows of at most two 16-byte accesses per thread of 512 (the many-rows kernel):
/// several rows per block, each on one warp (part of one, or all of it) or on several (the
/// block's barrier between the warps' maxima), the grid's last block part empty; a row of
/// seven warps (1792 bf16 / f16 columns) two per block; rows of one access per thread past two
/// waves of the kernel, asking L2 for the row a wave ahead; two accesses per thread, one row
/// per block. Split and interleaved, SiLU, per token with and without an upper bound.
#[test]
fn fp8_per_token_short_rows() {
    let test = "fp8_per_token_short_rows";
    let Some((k, s)) = gpu(test) else { return };
    // Past 16 rows per SM: the most rows per block where the rows fit them.
    let many = 16 * k.limits().sm_count as usize + 1;
    for dtype in DType::ALL {
        let (mut rng, seed) = rng();
        let lanes = dtype.lanes_per_16b();
        // Rows of one access per thread prefetch past two waves of their blocks (as many as
        // the device and the dtype's registers hold).
        let blocks = k.limits().resident_blocks(KernelId::GatedFp8Rows(dtype, 1)) as usize;
        let past_two_waves = 2 * blocks + 3;
        // (rows, accesses per row, rows per block, accesses per thread)
        for (rows, accesses, per_block, chunks) in [
            (many, 1, 16, 1),
            (many, 25, 16, 1),
            (many, 50, 8, 1),
            (many, 224, 2, 1),
            (past_two_waves, 512, 1, 1),
            (300, 896, 1, 2),
        ] {
            let cols = accesses * lanes;
            let prefetch = chunks == 1 && rows > 2 * blocks * per_block as usize;
            let plan = per_token_plan(&k, dtype, (rows, cols));
            let p = &plan.params;
            assert_eq!(
                (
                    plan.kernel,
                    p.rows_per_block,
                    p.chunks,
                    p.prefetch_rows != 0
                ),
                (
                    KernelId::GatedFp8Rows(dtype, chunks),
                    per_block,
                    chunks,
                    prefetch
                ),
                "{dtype:?} {rows} x {cols}"
            );
            let layouts: &[Layout] = if quick() {
                &[Layout::Split]
            } else {
                &[Layout::Split, Layout::Interleaved]
            };
            for &layout in layouts {
                for scaling in schemes(cols)
                    .into_iter()
                    .filter(|s| matches!(s, Fp8Scaling::PerToken { .. }))
                {
                    silu_case(
                        &k,
                        &s,
                        &mut rng,
                        (test, seed),
                        dtype,
                        layout,
                        scaling,
                        (rows, cols),
                    );
                }
            }
        }
    }
}

/// Per-token rows of more than one tile, held whole: by the streamed kernel (sm_90) and the
/// long-row kernel beyond one wave of the row kernel (2049-4096 accesses: 14336 f32, 28672
/// bf16 / f16; split and interleaved; 5 to 8 slots per thread, full and ragged; on sm_90 also
/// rows of one tile of 3 and 4 slots past two waves, streamed and not), 16-bit rows of
/// the long-row kernel asking L2 for a row one wave ahead; by the many-rows kernel (1024
/// accesses, two per thread) beyond two waves of it; the scalar path (4096 elements, every operand
/// one element into its buffer); at a few rows, split over a cluster's eight blocks, or four
/// with a ragged last tile (the two-pass kernel without clusters). SiLU, with and without an
/// upper bound on the scale.
#[test]
fn fp8_per_token_long_rows() {
    let test = "fp8_per_token_long_rows";
    let Some((k, s)) = gpu(test) else { return };
    for dtype in DType::ALL {
        let (mut rng, seed) = rng();
        let one_wave = |mode| {
            k.limits()
                .resident_blocks(KernelId::GatedFp8Row(dtype, mode))
        };
        let rows = one_wave(VecMode::V16).max(one_wave(VecMode::Scalar)) as usize + 3;
        let per_thread = |accesses: usize| GATED_FP8_ROW_MAX_THREADS as usize * accesses;
        let long = per_thread(7) * dtype.lanes_per_16b();
        let short = per_thread(2) * dtype.lanes_per_16b();
        let tile = per_thread(GATED_FP8_ROW_CHUNKS) * dtype.lanes_per_16b();
        let (few, two_waves) = (3, 2 * one_wave(VecMode::V16) as usize + 3);
        // Rows of two accesses per thread (the many-rows kernel, a row per block) past two
        // waves of that kernel (no prefetch there).
        let rows_kernel = KernelId::GatedFp8Rows(dtype, 2);
        let short_rows = 2 * k.limits().resident_blocks(rows_kernel) as usize + 3;
        let split = |kernel| {
            if k.limits().clusters {
                KernelId::GatedFp8RowSplit(dtype, VecMode::V16)
            } else {
                kernel
            }
        };
        let streamed = k.limits().streamed_rows;
        // The kernel each vector case runs, and whether it prefetches (the planner's rules).
        for (rows, cols, kernel, prefetch) in [
            if streamed {
                (rows, long, KernelId::GatedFp8RowStream(dtype, 7), false)
            } else {
                (
                    rows,
                    long,
                    KernelId::GatedFp8RowLong(dtype, VecMode::V16),
                    dtype != DType::F32,
                )
            },
            (short_rows, short, KernelId::GatedFp8Rows(dtype, 2), false),
            if streamed {
                (
                    two_waves,
                    tile,
                    KernelId::GatedFp8RowStream(dtype, 4),
                    false,
                )
            } else {
                (
                    two_waves,
                    tile,
                    KernelId::GatedFp8Row(dtype, VecMode::V16),
                    true,
                )
            },
            (
                few,
                8 * tile,
                split(KernelId::GatedFp8Row(dtype, VecMode::V16)),
                false,
            ),
        ] {
            let plan = per_token_plan(&k, dtype, (rows, cols));
            assert_eq!(plan.kernel, kernel, "{dtype:?} {rows} x {cols}");
            assert_eq!(
                plan.params.prefetch_rows != 0,
                prefetch,
                "{dtype:?} {rows} x {cols}"
            );
        }
        // Under compute-sanitizer (quick) one scheme, and each row on the kernel the device
        // plans for it only.
        let per_token: Vec<Fp8Scaling> = schemes(long)
            .into_iter()
            .filter(|s| matches!(s, Fp8Scaling::PerToken { .. }))
            .take(if quick() { 1 } else { usize::MAX })
            .collect();
        // Long rows streamed (on devices that stream them) and not, full and with a ragged
        // last access slot, at every count of slots (3 slots, 505 accesses in the last, and 4
        // full, past two waves of the row kernel; 5 slots, one access in the last; 6 slots,
        // three; 7 full and with five in the last; 8 full: the streamed kernel has an entry
        // per count); rows split over a cluster's eight blocks, or four with a ragged last
        // tile (one access past three full tiles), at a few rows; on devices without clusters
        // the two-pass kernel.
        let accesses = |n: usize| n * dtype.lanes_per_16b();
        let ragged = accesses(per_thread(6) + 5);
        // Past one persistent block per SM: some blocks take two rows.
        let past_sms = k.limits().sm_count as usize + 5;
        let longest = accesses(per_thread(8));
        for (layout, rows, cols) in [
            (Layout::Split, rows, long),
            (Layout::Interleaved, rows, long),
            (Layout::Interleaved, rows, ragged),
            (Layout::Split, two_waves, accesses(per_thread(3) - 7)),
            (Layout::Interleaved, two_waves, tile),
            (Layout::Interleaved, past_sms, accesses(per_thread(4) + 1)),
            (Layout::Split, past_sms, accesses(per_thread(5) + 3)),
            (Layout::Split, past_sms, longest),
            (Layout::Split, short_rows, short),
            (Layout::SplitOffset, rows, 4096),
            (Layout::Split, few, 8 * tile),
            (Layout::Interleaved, few, 3 * tile + dtype.lanes_per_16b()),
        ] {
            let streamable = cols > accesses(per_thread(2)) && cols <= longest;
            let held_whole =
                streamable && (cols > tile || rows > 2 * one_wave(VecMode::V16) as usize);
            let streaming: &[bool] = if streamed && held_whole && !quick() {
                &[true, false]
            } else {
                &[true]
            };
            for (&scaling, &on) in per_token
                .iter()
                .flat_map(|c| streaming.iter().map(move |o| (c, o)))
            {
                k.set_row_streaming(on);
                silu_case(
                    &k,
                    &s,
                    &mut rng,
                    (test, seed),
                    dtype,
                    layout,
                    scaling,
                    (rows, cols),
                );
                k.set_row_streaming(true);
            }
        }
    }
}

/// The realigned FP8 kernels (16-bit inputs off the 16-byte grid) at shapes the planner gives
/// them: per token, rows of three and four aligned words of `y` per thread, a row per SM and
/// more; rows of up to two words per thread on the many-rows geometry (two rows of six warps
/// per block, the last block holding one; a row of sixteen warps; rows of one warp, sixteen
/// per block, the last block holding one); static, words filling the device (also past four waves of its threads), and (the
/// entry of a word's loads at once) words that fill less than a quarter of it, among them
/// short rows whose ends fall on most warps.
/// Interleaved halves of odd width and split operands one element off the grid; every case
/// against the references as the others.
#[test]
fn fp8_realigned_kernels() {
    let test = "fp8_realigned_kernels";
    let Some((k, s)) = gpu(test) else { return };
    let rows = k.limits().sm_count as usize + 3;
    for dtype in [DType::BF16, DType::F16] {
        let (mut rng, seed) = rng();
        let rows_realigned = KernelId::GatedFp8RowsRealigned(dtype);
        let short_rows = 16 * k.limits().sm_count as usize + 1;
        let (row, flat, ends_first) = (
            KernelId::GatedFp8RowRealigned(dtype),
            KernelId::GatedFp8FlatRealigned(dtype),
            KernelId::GatedFp8FlatRealignedEndsFirst(dtype),
        );
        // The planner sizes the static kernels' grids by their occupancy, read from the
        // device (several blocks per SM), not the one-block default.
        for kernel in [flat, ends_first] {
            assert!(
                k.limits().resident_blocks(kernel) > k.limits().sm_count,
                "{kernel:?}"
            );
        }
        let static_ = Fp8Scaling::Static;
        // Rows past four waves of the static kernel's threads (a thread per word again).
        let resident = k.limits().resident_blocks(flat) as usize * GATED_THREADS as usize;
        let many = 4 * resident / (8193 / 8 + 2) + 7;
        // 1025 and 2048 words a row: three and four per thread.
        let cases = [
            (rows, 8193, Fp8Scaling::per_token(), row),
            (rows, 8193, static_, flat),
            (rows, 16375, Fp8Scaling::per_token(), row),
            (rows, 16375, static_, flat),
            (rows, 3001, Fp8Scaling::per_token(), rows_realigned),
            (rows, 8183, Fp8Scaling::per_token(), rows_realigned),
            // One row group of 288 threads per block (past the long-row kernel's 4096).
            (rows, 4500, Fp8Scaling::per_token(), rows_realigned),
            (short_rows, 25, Fp8Scaling::per_token(), rows_realigned),
            (many, 8193, static_, flat),
            (16, 8193, static_, ends_first),
            (128, 1001, static_, ends_first),
            (3, 4095, static_, ends_first),
        ];
        for (rows, cols, scaling, want) in cases {
            if quick() && cols == 16375 {
                continue;
            }
            let desc = |addr: u64, dtype, cols| {
                MatDesc::contiguous(addr + 2, rows * cols, dtype, rows, cols)
            };
            let scales = if scaling == static_ { 1 } else { rows };
            let plan = plan_gated_forward_fp8(
                Activation::Silu,
                &desc(1 << 40, dtype, cols),
                &desc(1 << 41, dtype, cols),
                &MatDesc::contiguous(1 << 42, rows * cols, DType::F8E4M3, rows, cols),
                scaling,
                &MatDesc::contiguous(1 << 43, scales, DType::F32, scales, 1),
                k.limits(),
            )
            .unwrap();
            assert_eq!(plan.kernel, want, "{dtype:?} {rows} x {cols}");
            for layout in [Layout::Interleaved, Layout::SplitOffset] {
                silu_case(
                    &k,
                    &s,
                    &mut rng,
                    (test, seed),
                    dtype,
                    layout,
                    scaling,
                    (rows, cols),
                );
            }
        }
    }
}

/// A static scale on dense operands off the 16-byte grid, every operand one element into its
/// buffer: one flat range, the flat vector kernel over the body from the inputs' first 16-byte
/// boundary, the grid's last threads taking the ragged head before it and tail after it (no
/// tail at 71 x 65537); calls of one access per thread (a warp of their own for the ends) and
/// of several; every dtype, against the references as the others, the bytes around `y`
/// untouched.
#[test]
fn fp8_static_flat_range() {
    let test = "fp8_static_flat_range";
    let Some((k, s)) = gpu(test) else { return };
    for dtype in DType::ALL {
        let (mut rng, seed) = rng();
        for (rows, cols) in [
            (3, 133),
            (7, 14335),
            (1025, 4097),
            (2001, 4093),
            (71, 65537),
        ] {
            let desc = |addr: u64, dtype: DType| {
                let addr = addr + dtype.size_bytes() as u64;
                MatDesc::contiguous(addr, rows * cols, dtype, rows, cols)
            };
            let plan = plan_gated_forward_fp8(
                Activation::Silu,
                &desc(1 << 40, dtype),
                &desc(1 << 41, dtype),
                &desc(1 << 42, DType::F8E4M3),
                Fp8Scaling::Static,
                &MatDesc::contiguous(1 << 43, 1, DType::F32, 1, 1),
                k.limits(),
            )
            .unwrap();
            let lanes = dtype.lanes_per_16b();
            let body = KernelId::GatedFp8FlatEnds(dtype);
            assert_eq!(plan.kernel, body, "{dtype:?} {rows} x {cols}");
            let ends = FlatEnds {
                head: (lanes - 1) as u16,
                tail: ((rows * cols - (lanes - 1)) % lanes) as u16,
            };
            assert_eq!(plan.params.ends, ends, "{dtype:?} {rows} x {cols}");
            silu_case(
                &k,
                &s,
                &mut rng,
                (test, seed),
                dtype,
                Layout::SplitFlat,
                Fp8Scaling::Static,
                (rows, cols),
            );
        }
    }
}

/// Saturation: a static scale far below `|y| / 448` gives +-448 (never NaN), and values
/// below half the smallest subnormal give signed zeros.
#[test]
fn fp8_static_saturates() {
    let Some((k, s)) = gpu("fp8_static_saturates") else {
        return;
    };
    let (rows, cols) = (2, 256);
    let a: Vec<f32> = (0..rows * cols).map(|i| (i as f32 - 256.0) * 0.5).collect();
    let b = vec![1.0f32; rows * cols];
    let (da, db) = (upload(&s, &a), upload(&s, &b));
    let mut dq = s.alloc_zeros::<F8E4M3>(rows * cols).expect("alloc");
    let dscale = upload(&s, &[1e-3f32]);
    k.gated_fp8(
        &s,
        Activation::Relu,
        &Mat::new(da.as_view(), rows, cols),
        &Mat::new(db.as_view(), rows, cols),
        &mut MatMut::new(dq.as_view_mut(), rows, cols),
        Fp8Scaling::Static,
        Fp8Scales::Read(&Mat::new(dscale.as_view(), 1, 1)),
    )
    .expect("launch");
    let q = download(&s, &dq);
    for (i, v) in q.iter().enumerate() {
        let y = a[i].max(0.0);
        let want = e4m3_bits((y / 1e-3) as f64);
        assert_eq!(v.to_bits(), want, "element {i}: y = {y}");
        if y >= 1.0 {
            assert_eq!(v.to_bits(), 0x7e, "element {i} saturates to 448");
        }
    }
}
