//! CPU tests of the gated FP8 forward's host side: every validation error (dtypes, shapes,
//! strides, sizes, alignment, aliasing, scale shapes and dtypes, scaling arguments), the
//! kernel and geometry each scheme plans, and the kernel table's completeness. No GPU needed.

mod common;

use common::assert_matches;

use ferrofuse::fp8::DEFAULT_MIN_SCALE;
use ferrofuse::gated::{plan_gated_forward, plan_gated_forward_fp8};
use ferrofuse::runtime::KernelParams;
use ferrofuse::{
    Activation, DType, Error, Fp8Scaling, GridLimits, KernelId, Launch, MatDesc, ScaleLayout,
    VecMode,
};
use ferrofuse_common::fp8::{FP8_PER_GROUP, FP8_PER_TOKEN, FP8_STATIC};
use ferrofuse_common::{
    FlatEnds, GATED_FP8_ROW_LONG_CHUNKS, GATED_FP8_ROW_SMEM_BYTES, GATED_FP8_STREAM_MIN_CHUNKS,
    GATED_FP8_STREAM_SMEM_BYTES, GatedFp8Params,
};

const BASE: u64 = 0x7f00_0000_0000;
/// Far enough apart for any test shape.
const GAP: u64 = 1 << 32;

fn limits() -> GridLimits {
    GridLimits::uniform(132, 10)
}

fn mat(addr: u64, dtype: DType, rows: usize, cols: usize) -> MatDesc {
    MatDesc::contiguous(addr, rows * cols, dtype, rows, cols)
}

/// `a`, `b` of `dtype`, `y` FP8, all `rows x cols` and disjoint.
fn abq(dtype: DType, rows: usize, cols: usize) -> (MatDesc, MatDesc, MatDesc) {
    (
        mat(BASE, dtype, rows, cols),
        mat(BASE + GAP, dtype, rows, cols),
        mat(BASE + 2 * GAP, DType::F8E4M3, rows, cols),
    )
}

/// `m` with its rows `stride` elements apart.
fn padded(m: MatDesc, stride: usize) -> MatDesc {
    MatDesc {
        row_stride: stride,
        len: (m.rows - 1) * stride + m.cols,
        ..m
    }
}

/// `m` starting `elements` further into its buffer.
fn offset(m: MatDesc, elements: usize) -> MatDesc {
    MatDesc {
        addr: m.addr + (elements * m.dtype.size_bytes()) as u64,
        ..m
    }
}

fn scales(rows: usize, cols: usize) -> MatDesc {
    mat(BASE + 3 * GAP, DType::F32, rows, cols)
}

fn plan(
    a: &MatDesc,
    b: &MatDesc,
    y: &MatDesc,
    scaling: Fp8Scaling,
    s: &MatDesc,
) -> Result<Launch<GatedFp8Params>, Error> {
    plan_on(a, b, y, scaling, s, &limits())
}

/// The call's launch on the device `limits` describe.
fn plan_on(
    a: &MatDesc,
    b: &MatDesc,
    y: &MatDesc,
    scaling: Fp8Scaling,
    s: &MatDesc,
    limits: &GridLimits,
) -> Result<Launch<GatedFp8Params>, Error> {
    plan_gated_forward_fp8(Activation::Silu, a, b, y, scaling, s, limits)
}

/// The many-rows kernels' grid: a block of `per_block` row groups of `threads` threads per
/// `per_block` rows, with the row kernel's shared memory.
fn assert_rows_grid(
    l: &Launch<GatedFp8Params>,
    rows: usize,
    threads: u32,
    per_block: u32,
    what: &str,
) {
    assert_eq!(
        (l.grid, l.block, l.shared_mem_bytes),
        (
            rows.div_ceil(per_block as usize) as u32,
            threads * per_block,
            GATED_FP8_ROW_SMEM_BYTES
        ),
        "{what}"
    );
}

#[test]
fn static_scale_plans_the_flat_vector_kernel() {
    let (a, b, y) = abq(DType::BF16, 64, 14336);
    let l = plan(&a, &b, &y, Fp8Scaling::Static, &scales(1, 1)).unwrap();
    assert_eq!(l.kernel, KernelId::GatedFp8Flat(DType::BF16, VecMode::V16));
    assert_eq!(l.params.scheme, FP8_STATIC);
    assert_eq!(l.block, 128);
    assert_eq!(l.params.walk.per_row, 14336 / 8);
    // Off the 16-byte grid, 16-bit inputs: the realigned kernels over the aligned words of
    // `y` a row can touch, a thread per word up to one wave of the device, then the resident
    // threads up to four waves, then a thread per word again: the entry of a word's loads at
    // once up to a quarter of the threads the device holds, the other past that; the scalar
    // kernel for f32.
    let resident =
        limits().resident_blocks(KernelId::GatedFp8FlatRealigned(DType::BF16)) as u64 * 128;
    for (rows, kernel, threads) in [
        (
            16,
            KernelId::GatedFp8FlatRealignedEndsFirst(DType::BF16),
            16 * (14336 / 8 + 1),
        ),
        (
            64,
            KernelId::GatedFp8FlatRealigned(DType::BF16),
            64 * (14336 / 8 + 1),
        ),
        (256, KernelId::GatedFp8FlatRealigned(DType::BF16), resident),
        // Past four waves, a thread per word.
        (
            1024,
            KernelId::GatedFp8FlatRealigned(DType::BF16),
            1024 * (14336 / 8 + 1),
        ),
    ] {
        let (a, b, y) = abq(DType::BF16, rows, 14336);
        let a1 = MatDesc {
            addr: a.addr + 2,
            ..a
        };
        let l = plan(&a1, &b, &y, Fp8Scaling::Static, &scales(1, 1)).unwrap();
        assert_eq!(l.kernel, kernel, "{rows} rows");
        assert_eq!(l.params.walk.per_row, 14336 / 8 + 1);
        assert_eq!(l.block, 128);
        assert_eq!(l.grid as u64, threads.div_ceil(128), "{rows} rows");
    }
    let a1 = MatDesc {
        addr: a.addr + 2,
        ..a
    };
    // Rows of odd length in a padded `y` (not one flat range, see below).
    let (a16, b16, y16) = abq(DType::BF16, 16, 14335);
    let y16 = padded(y16, 14336);
    let l = plan(&a16, &b16, &y16, Fp8Scaling::Static, &scales(1, 1)).unwrap();
    assert_eq!(
        l.kernel,
        KernelId::GatedFp8FlatRealignedEndsFirst(DType::BF16)
    );
    assert_eq!(l.grid as u64, (16 * (14335 / 8 + 2) as u64).div_ceil(128));
    let (af, bf, yf) = abq(DType::F32, 4096, 4095);
    let l = plan(
        &af,
        &bf,
        &padded(yf, 4096),
        Fp8Scaling::Static,
        &scales(1, 1),
    )
    .unwrap();
    assert_eq!(
        l.kernel,
        KernelId::GatedFp8Flat(DType::F32, VecMode::Scalar)
    );
    // Per group off the grid: the scalar path, a warp per group.
    let l = plan(
        &a1,
        &b,
        &y,
        Fp8Scaling::per_group(128, ScaleLayout::RowMajor),
        &scales(64, 14336 / 128),
    )
    .unwrap();
    assert_eq!(
        l.kernel,
        KernelId::GatedFp8Group(DType::BF16, VecMode::Scalar)
    );
    assert_eq!(l.params.batch, 4);
}

/// A static scale off the 16-byte grid with every operand dense: one flat range, one launch of
/// the flat vector kernel over the body (one row of the same elements of `a`, `b` and `y`,
/// from `a`'s first 16-byte boundary), the ragged head before it and tail after it taken by
/// the grid's last threads (see `FlatEnds`). Not where `y` is padded, its body off its grid or
/// the scale per token.
#[test]
fn static_scale_dense_rows_off_the_grid_run_as_one_flat_range() {
    let s = scales(1, 1);
    // The vector entry, its form that takes the ends where there are any.
    let flat = |a: &MatDesc, b: &MatDesc, y: &MatDesc, dtype| {
        let l = plan(a, b, y, Fp8Scaling::Static, &s).unwrap();
        let kernel = match l.params.ends == FlatEnds::default() {
            true => KernelId::GatedFp8Flat(dtype, VecMode::V16),
            false => KernelId::GatedFp8FlatEnds(dtype),
        };
        assert_eq!(l.kernel, kernel);
        assert_eq!(l.params.rows, 1);
        l
    };
    let body = |l: &Launch<GatedFp8Params>| (l.params.a, l.params.b, l.params.y, l.params.cols);
    // On the grid at the start, 16384 x 4095 a multiple of 8: the body alone.
    let (a, b, y) = abq(DType::BF16, 16384, 4095);
    let n = 16384 * 4095;
    let l = flat(&a, &b, &y, DType::BF16);
    assert_eq!(body(&l), (a.addr, b.addr, y.addr, n as u64));
    assert_eq!(l.params.ends, FlatEnds::default());
    assert_eq!(l.params.walk.per_row, n as u64 / 8);
    // 2001 x 4093, every operand one element in: a head of 7 elements up to `a`'s boundary
    // (`y`'s body then on its 8-byte grid), the body, a tail of 6.
    let (a, b, y) = abq(DType::BF16, 2001, 4093);
    let (a, b, y) = (offset(a, 1), offset(b, 1), offset(y, 1));
    let n = 2001 * 4093u64;
    let l = flat(&a, &b, &y, DType::BF16);
    assert_eq!(body(&l), (a.addr + 14, b.addr + 14, y.addr + 7, n - 13));
    assert_eq!(l.params.ends, FlatEnds { head: 7, tail: 6 });
    // f32: 4-byte words of `y`.
    let (a, b, y) = abq(DType::F32, 4096, 4095);
    let (a, b, y) = (offset(a, 1), offset(b, 1), offset(y, 1));
    let l = flat(&a, &b, &y, DType::F32);
    assert_eq!(l.params.ends.head, 3);
    assert_eq!(l.params.y % 4, 0);
    // Small calls: a thread per vector and a warp more for the ends (7 x 14335: a tail of
    // one), so that the end's loads do not wait for a warp's vector accesses.
    for (rows, cols) in [(3, 4095), (7, 14335)] {
        let (a, b, y) = abq(DType::BF16, rows, cols);
        let l = flat(&a, &b, &y, DType::BF16);
        let n = rows * cols;
        assert_eq!(
            l.params.ends,
            FlatEnds {
                head: 0,
                tail: (n % 8) as u16
            }
        );
        assert_eq!(l.grid as usize, (n / 8 + 32).div_ceil(128));
    }
    // One range, not: `y` padded; `y`'s body off its grid; a scale per token.
    let (a, b, y) = abq(DType::BF16, 1024, 4095);
    let realigned = KernelId::GatedFp8FlatRealigned(DType::BF16);
    for y in [padded(y, 4096), offset(y, 2)] {
        let l = plan(&a, &b, &y, Fp8Scaling::Static, &s).unwrap();
        assert_eq!(l.kernel, realigned);
        assert_eq!(l.params.ends, FlatEnds::default());
    }
    let l = plan(&a, &b, &y, Fp8Scaling::per_token(), &scales(1024, 1)).unwrap();
    assert_eq!(l.params.scheme, FP8_PER_TOKEN);
}

#[test]
fn per_token_plans_rows_in_registers() {
    let (a, b, y) = abq(DType::BF16, 16, 14336);
    let l = plan(&a, &b, &y, Fp8Scaling::per_token(), &scales(16, 1)).unwrap();
    assert_eq!(l.kernel, KernelId::GatedFp8Row(DType::BF16, VecMode::V16));
    assert_eq!(l.params.scheme, FP8_PER_TOKEN);
    // 1792 vectors a row: 512 threads of up to 4, one tile (the row read once).
    assert_eq!(
        (
            l.params.threads_per_row,
            l.params.chunks,
            l.params.rows_per_block
        ),
        (512, 4, 1)
    );
    assert_eq!((l.grid, l.block), (16, 512));
    assert_eq!(l.shared_mem_bytes, GATED_FP8_ROW_SMEM_BYTES);
    assert_eq!(l.params.scale_ub, f32::INFINITY);
    assert_eq!(l.params.min_scale, DEFAULT_MIN_SCALE);
    // A short row: one chunk; an upper bound reaches the kernel.
    let (a, b, y) = abq(DType::F32, 5, 100);
    let ub = Fp8Scaling::PerToken {
        min_scale: 1e-6,
        scale_ub: Some(2.0),
    };
    let l = plan(&a, &b, &y, ub, &scales(5, 1)).unwrap();
    assert_eq!(l.kernel, KernelId::GatedFp8Rows(DType::F32, 1));
    assert_eq!((l.params.chunks, l.params.rows_per_block), (1, 1));
    assert_eq!((l.grid, l.block), (5, 32));
    assert_eq!((l.params.scale_ub, l.params.min_scale), (2.0, 1e-6));
    // Rows of 2049-4096 accesses beyond one wave of the two-pass kernel: the long-row kernel
    // holds them whole; longer rows, and rows of 16-byte accesses within that wave, take two
    // passes; rows of 2049-4096 element accesses take the long-row kernel at any count.
    let f32_row = KernelId::GatedFp8Row(DType::F32, VecMode::V16);
    let f32_long_scalar = KernelId::GatedFp8RowLong(DType::F32, VecMode::Scalar);
    let f32_long = KernelId::GatedFp8RowLong(DType::F32, VecMode::V16);
    let f32_scalar = KernelId::GatedFp8Row(DType::F32, VecMode::Scalar);
    let bf16_long = KernelId::GatedFp8RowLong(DType::BF16, VecMode::V16);
    let two_per_sm = GridLimits::uniform(132, 2);
    // Whole rows of 16-byte accesses also ask L2 for the row one wave ahead: on the row
    // kernel from two waves on, on the long-row kernel for 16-bit rows; rows walked twice (the
    // second walk reads L2) and scalar rows never.
    for (dtype, rows, cols, kernel, chunks, prefetch_rows) in [
        (DType::F32, 265, 14336, f32_long, 7, 0),
        (DType::BF16, 265, 28672, bf16_long, 7, 264),
        (DType::F32, 265, 16384, f32_long, 8, 0),
        (DType::F32, 264, 14336, f32_row, 4, 0),
        (DType::F32, 265, 16388, f32_row, 4, 0),
        (DType::F32, 529, 8192, f32_row, 4, 264),
        (DType::F32, 528, 8192, f32_row, 4, 0),
        (DType::F32, 529, 8190, f32_scalar, 4, 0),
        (DType::F32, 264, 4095, f32_long_scalar, 8, 0),
        (DType::F32, 10, 2049, f32_long_scalar, 5, 0),
    ] {
        let (a, b, y) = abq(dtype, rows, cols);
        let s = scales(rows, 1);
        let l = plan_on(&a, &b, &y, ub, &s, &two_per_sm).unwrap();
        assert_eq!(
            (l.kernel, l.params.chunks, l.params.prefetch_rows),
            (kernel, chunks, prefetch_rows),
            "{rows} x {cols}"
        );
        assert_eq!((l.grid, l.block), (rows as u32, 512));
        assert_eq!(l.params.row_blocks, 1);
    }
    // With clusters, a row too long for the long-row kernel is split over the blocks of a
    // cluster, one tile of up to 4 accesses per thread each, up to 8 blocks (a longer row takes
    // two passes); a shorter one too while the split grid is at most one block per SM.
    let clusters = two_per_sm.with_clusters(true);
    let f32_split = KernelId::GatedFp8RowSplit(DType::F32, VecMode::V16);
    for (rows, cols, kernel, chunks, row_blocks, prefetch_rows) in [
        (66, 14336, f32_split, 4, 2, 0),
        (67, 14336, f32_row, 4, 1, 0),
        (265, 14336, f32_long, 7, 1, 0),
        (1, 16388, f32_split, 3, 3, 0),
        (200, 16388, f32_split, 3, 3, 88),
        (4, 28672, f32_split, 4, 4, 0),
        (2, 65536, f32_split, 4, 8, 0),
        (2, 65540, f32_row, 4, 1, 0),
        (529, 8192, f32_row, 4, 1, 264),
    ] {
        let (a, b, y) = abq(DType::F32, rows, cols);
        let s = scales(rows, 1);
        let l = plan_on(&a, &b, &y, ub, &s, &clusters).unwrap();
        assert_eq!(
            (
                l.kernel,
                l.params.chunks,
                l.params.row_blocks,
                l.params.prefetch_rows
            ),
            (kernel, chunks, row_blocks, prefetch_rows),
            "{rows} x {cols}"
        );
        assert_eq!((l.grid, l.block), (rows as u32 * row_blocks, 512));
        assert_eq!(l.params.cluster_blocks(l.kernel), row_blocks);
    }
    // With bulk copies, the long-row kernel's rows of 16-byte accesses are streamed, at any
    // row count past the split kernel's, and rows of one tile of 3 or 4 accesses per thread
    // past two waves of the row kernel: one persistent 512-thread block per SM (as the
    // occupancy says), the next row copied into shared memory, no L2 prefetch. Scalar rows
    // keep the long-row kernel.
    let streamed = GridLimits::uniform(132, 1)
        .with_clusters(true)
        .with_streamed_rows(true);
    let bf16_stream = |count| KernelId::GatedFp8RowStream(DType::BF16, count);
    let f32_stream = |count| KernelId::GatedFp8RowStream(DType::F32, count);
    let f32_split = KernelId::GatedFp8RowSplit(DType::F32, VecMode::V16);
    let bf16_row = KernelId::GatedFp8Row(DType::BF16, VecMode::V16);
    let bf16_rows = KernelId::GatedFp8Rows(DType::BF16, 2);
    let f32_row = KernelId::GatedFp8Row(DType::F32, VecMode::V16);
    for (dtype, rows, cols, kernel, chunks, grid, prefetch_rows) in [
        (DType::BF16, 4096, 28672, bf16_stream(7), 7, 132, 0),
        (DType::BF16, 4096, 14336, bf16_stream(4), 4, 132, 0),
        (DType::BF16, 265, 11008, bf16_stream(3), 3, 132, 0),
        (DType::BF16, 264, 14336, bf16_row, 4, 264, 0),
        (DType::BF16, 4096, 8192, bf16_rows, 2, 4096, 0),
        (DType::F32, 300, 7168, f32_stream(4), 4, 132, 0),
        (DType::F32, 264, 7168, f32_row, 4, 264, 0),
        (DType::BF16, 100, 20480, bf16_stream(5), 5, 100, 0),
        (DType::BF16, 200, 16392, bf16_stream(5), 5, 132, 0),
        (DType::BF16, 200, 24576, bf16_stream(6), 6, 132, 0),
        (DType::F32, 133, 16384, f32_stream(8), 8, 132, 0),
        (DType::F32, 66, 14336, f32_split, 4, 132, 0),
        (DType::F32, 67, 14336, f32_stream(7), 7, 67, 0),
        (DType::F32, 4096, 16388, f32_split, 3, 3 * 4096, 44),
    ] {
        let (a, b, y) = abq(dtype, rows, cols);
        let s = scales(rows, 1);
        let l = plan_on(&a, &b, &y, ub, &s, &streamed).unwrap();
        assert_eq!(
            (l.kernel, l.params.chunks, l.grid, l.params.prefetch_rows),
            (kernel, chunks, grid, prefetch_rows),
            "{rows} x {cols}"
        );
        let smem = match kernel {
            KernelId::GatedFp8RowStream(..) => GATED_FP8_STREAM_SMEM_BYTES,
            _ => GATED_FP8_ROW_SMEM_BYTES,
        };
        assert_eq!(
            (l.block, l.params.threads_per_row, l.shared_mem_bytes),
            (512, 512, smem)
        );
    }
    let (a, b, y) = abq(DType::F32, 4096, 4095);
    let l = plan_on(&a, &b, &y, ub, &scales(4096, 1), &streamed).unwrap();
    // f32 rows off the 16-byte grid: the scalar row kernels (8 accesses per thread here).
    assert_eq!(
        l.kernel,
        KernelId::GatedFp8RowLong(DType::F32, VecMode::Scalar)
    );
    // 16-bit rows off the grid, at least a wave of rows (one per SM): the realigned row kernel
    // where a row's aligned words of `y` (ceil(cols / L) + 1 of them) take three or four per
    // thread of one tile, the realigned many-rows kernel where they take one or two (two per
    // thread, each row on the fewest warps that hold it, as many rows per block as fit while
    // the blocks cover the SMs); the scalar row kernels elsewhere.
    let (a, b, y) = abq(DType::BF16, 1024, 14335);
    let l = plan_on(&a, &b, &y, ub, &scales(1024, 1), &streamed).unwrap();
    assert_eq!(l.kernel, KernelId::GatedFp8RowRealigned(DType::BF16));
    assert_eq!((l.params.walk.per_row, l.params.chunks), (1793, 4));
    assert_eq!((l.grid, l.block, l.params.prefetch_rows), (1024, 512, 0));
    assert_eq!(l.shared_mem_bytes, GATED_FP8_ROW_SMEM_BYTES);
    let wave = streamed.sm_count as usize;
    for (dtype, rows, cols, realigned) in [
        (DType::BF16, wave, 8183, false),
        (DType::BF16, wave, 8185, true),
        (DType::BF16, wave - 1, 8185, false),
        (DType::F16, wave, 14335, true),
        (DType::BF16, wave, 16375, true),
        (DType::BF16, wave, 16377, false),
        (DType::F32, 4096, 8187, false),
    ] {
        let (a, b, y) = abq(dtype, rows, cols);
        let s = scales(rows, 1);
        let l = plan_on(&a, &b, &y, ub, &s, &streamed).unwrap();
        let got = l.kernel == KernelId::GatedFp8RowRealigned(dtype);
        assert_eq!(got, realigned, "{dtype:?} {rows} x {cols}: {:?}", l.kernel);
    }
    // One row group of more than 256 threads per block where the long-row kernel holds the
    // row (up to 4096 elements): the scalar long-row kernel.
    for cols in [4089, 4095] {
        let (a, b, y) = abq(DType::F16, 4096, cols);
        let l = plan_on(&a, &b, &y, ub, &scales(4096, 1), &streamed).unwrap();
        let want = KernelId::GatedFp8RowLong(DType::F16, VecMode::Scalar);
        assert_eq!(l.kernel, want, "4096 x {cols}");
    }
    for (dtype, rows, cols, words, threads, per_block) in [
        (DType::BF16, 1024, 3001, 377, 192, 2),
        (DType::BF16, 16384, 2500, 314, 160, 3),
        (DType::BF16, 4096, 5625, 705, 384, 1),
        (DType::BF16, 16384, 4500, 564, 288, 1),
        (DType::F16, 4096, 4097, 514, 288, 1),
        (DType::BF16, 4096, 3841, 482, 256, 2),
        (DType::BF16, wave, 8183, 1024, 512, 1),
        // Short rows: one warp each, 4 words (25 columns), rows spread over the SMs.
        (DType::BF16, 1000, 25, 5, 32, 8),
        (DType::BF16, 100_000, 25, 5, 32, 16),
    ] {
        let (a, b, y) = abq(dtype, rows, cols);
        let l = plan_on(&a, &b, &y, ub, &scales(rows, 1), &streamed).unwrap();
        let p = &l.params;
        assert_eq!(
            l.kernel,
            KernelId::GatedFp8RowsRealigned(dtype),
            "{rows} x {cols}"
        );
        assert_eq!(
            (
                p.walk.per_row,
                p.chunks,
                p.threads_per_row,
                p.rows_per_block,
                p.prefetch_rows
            ),
            (words, 2, threads, per_block, 0),
            "{rows} x {cols}"
        );
        assert_rows_grid(&l, rows, threads, per_block, &format!("{rows} x {cols}"));
    }
    // Fewer rows than SMs, or f32 rows: the scalar row kernel.
    for (dtype, rows) in [(DType::BF16, wave - 1), (DType::F32, 4096)] {
        let (a, b, y) = abq(dtype, rows, 3001);
        let l = plan_on(&a, &b, &y, ub, &scales(rows, 1), &streamed).unwrap();
        assert!(
            matches!(l.kernel, KernelId::GatedFp8RowLong(_, VecMode::Scalar)),
            "{dtype:?} {rows}: {:?}",
            l.kernel
        );
    }
}

#[test]
fn per_group_plans_lanes_and_scale_addressing() {
    let (a, b, y) = abq(DType::BF16, 8, 1024);
    let rm = Fp8Scaling::per_group(128, ScaleLayout::RowMajor);
    let l = plan(&a, &b, &y, rm, &scales(8, 8)).unwrap();
    assert_eq!(l.kernel, KernelId::GatedFp8Group(DType::BF16, VecMode::V16));
    assert_eq!(l.params.scheme, FP8_PER_GROUP);
    // 128 bf16 = 16 vectors on 8 lanes, two each; the walk counts those pairs.
    assert_eq!((l.params.group_lanes, l.params.group_shift), (8, 4));
    assert_eq!((l.params.scale_row, l.params.scale_group), (8, 1));
    assert_eq!(l.params.walk.per_row, 1024 / 8 / 2);
    // 8 x 64 pairs, fewer than the resident threads: a thread per pair.
    assert_eq!(l.grid, 4);
    // Column-major, rows padded to 12: [groups, rows] with row stride 12.
    let cm = Fp8Scaling::per_group(64, ScaleLayout::ColMajor);
    let s = MatDesc {
        row_stride: 12,
        len: 15 * 12 + 8,
        ..scales(16, 8)
    };
    let l = plan(&a, &b, &y, cm, &s).unwrap();
    assert_eq!((l.params.group_lanes, l.params.group_shift), (4, 3));
    assert_eq!((l.params.scale_row, l.params.scale_group), (1, 12));
    // f32, 128 columns: 32 vectors on 16 lanes; the scalar path: 32 lanes x 4.
    let (a, b, y) = abq(DType::F32, 8, 1024);
    let l = plan(&a, &b, &y, rm, &scales(8, 8)).unwrap();
    assert_eq!((l.params.group_lanes, l.params.group_shift), (16, 5));
    let a1 = MatDesc {
        addr: a.addr + 4,
        ..a
    };
    let l = plan(&a1, &b, &y, rm, &scales(8, 8)).unwrap();
    assert_eq!(
        l.kernel,
        KernelId::GatedFp8Group(DType::F32, VecMode::Scalar)
    );
    assert_eq!(
        (l.params.batch, l.params.group_lanes, l.params.group_shift),
        (4, 32, 7)
    );
}

#[test]
fn rejects_fp8_inputs_and_non_fp8_outputs() {
    let (a, b, y) = abq(DType::BF16, 4, 256);
    let s = scales(1, 1);
    let aq = MatDesc {
        dtype: DType::F8E4M3,
        ..a
    };
    assert_matches!(
        plan(&aq, &b, &y, Fp8Scaling::Static, &s),
        Err(Error::UnsupportedDType {
            tensor: "a",
            dtype: DType::F8E4M3
        })
    );
    let y16 = MatDesc {
        dtype: DType::BF16,
        ..y
    };
    assert_matches!(
        plan(&a, &b, &y16, Fp8Scaling::Static, &s),
        Err(Error::DTypeMismatch { tensor: "y", .. })
    );
    let b16 = MatDesc {
        dtype: DType::F16,
        ..b
    };
    assert_matches!(
        plan(&a, &b16, &y, Fp8Scaling::Static, &s),
        Err(Error::DTypeMismatch { tensor: "b", .. })
    );
    let s16 = MatDesc {
        dtype: DType::BF16,
        ..s
    };
    assert_matches!(
        plan(&a, &b, &y, Fp8Scaling::Static, &s16),
        Err(Error::DTypeMismatch {
            tensor: "scales",
            ..
        })
    );
    // The plain entry points refuse FP8 anywhere.
    assert_matches!(
        plan_gated_forward(Activation::Silu, &aq, &aq, &aq, &limits()),
        Err(Error::UnsupportedDType { tensor: "a", .. })
    );
    assert_matches!(
        plan_gated_forward(Activation::Silu, &a, &b, &y, &limits()),
        Err(Error::UnsupportedDType { tensor: "y", .. })
    );
}

#[test]
fn rejects_wrong_shapes_and_scale_shapes() {
    let (a, b, y) = abq(DType::F16, 4, 256);
    let y2 = mat(y.addr, DType::F8E4M3, 4, 128);
    assert_matches!(
        plan(&a, &b, &y2, Fp8Scaling::Static, &scales(1, 1)),
        Err(Error::ShapeMismatch { tensor: "y", .. })
    );
    let b2 = mat(b.addr, DType::F16, 3, 256);
    assert_matches!(
        plan(&a, &b2, &y, Fp8Scaling::Static, &scales(1, 1)),
        Err(Error::ShapeMismatch { tensor: "b", .. })
    );
    for (scaling, bad) in [
        (Fp8Scaling::Static, (1, 2)),
        (Fp8Scaling::per_token(), (1, 4)),
        (Fp8Scaling::per_token(), (4, 2)),
        (Fp8Scaling::per_group(128, ScaleLayout::RowMajor), (2, 4)),
        (Fp8Scaling::per_group(64, ScaleLayout::ColMajor), (2, 4)),
    ] {
        assert_matches!(
            plan(&a, &b, &y, scaling, &scales(bad.0, bad.1)),
            Err(Error::ShapeMismatch {
                tensor: "scales",
                ..
            })
        );
    }
    assert_matches!(
        plan(
            &a,
            &b,
            &y,
            Fp8Scaling::per_group(96, ScaleLayout::RowMajor),
            &scales(4, 2)
        ),
        Err(Error::InvalidArgument { .. })
    );
    let (a, b, y) = abq(DType::F16, 4, 320);
    assert_matches!(
        plan(
            &a,
            &b,
            &y,
            Fp8Scaling::per_group(128, ScaleLayout::RowMajor),
            &scales(4, 2)
        ),
        Err(Error::GroupMismatch {
            cols: 320,
            group: 128
        })
    );
}

#[test]
fn rejects_bad_scaling_arguments() {
    let (a, b, y) = abq(DType::BF16, 4, 256);
    for min_scale in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        let t = Fp8Scaling::PerToken {
            min_scale,
            scale_ub: None,
        };
        assert_matches!(
            plan(&a, &b, &y, t, &scales(4, 1)),
            Err(Error::InvalidArgument { .. })
        );
        let g = Fp8Scaling::PerGroup {
            group: 128,
            layout: ScaleLayout::RowMajor,
            min_scale,
        };
        assert_matches!(
            plan(&a, &b, &y, g, &scales(4, 2)),
            Err(Error::InvalidArgument { .. })
        );
    }
    for ub in [0.0, -3.0, f32::NAN, f32::INFINITY] {
        let t = Fp8Scaling::PerToken {
            min_scale: DEFAULT_MIN_SCALE,
            scale_ub: Some(ub),
        };
        assert_matches!(
            plan(&a, &b, &y, t, &scales(4, 1)),
            Err(Error::InvalidArgument { .. })
        );
    }
}

#[test]
fn rejects_layout_errors() {
    let (a, b, y) = abq(DType::BF16, 4, 256);
    let s = scales(4, 1);
    let t = Fp8Scaling::per_token();
    let small = MatDesc { len: 1000, ..y };
    assert_matches!(
        plan(&a, &b, &small, t, &s),
        Err(Error::BufferTooSmall { tensor: "y", .. })
    );
    let small = MatDesc { len: 3, ..s };
    assert_matches!(
        plan(&a, &b, &y, t, &small),
        Err(Error::BufferTooSmall {
            tensor: "scales",
            ..
        })
    );
    let odd = MatDesc {
        addr: s.addr + 2,
        ..s
    };
    assert_matches!(
        plan(&a, &b, &y, t, &odd),
        Err(Error::Misaligned {
            tensor: "scales",
            ..
        })
    );
    let narrow = MatDesc {
        row_stride: 100,
        ..y
    };
    assert_matches!(
        plan(&a, &b, &narrow, t, &s),
        Err(Error::RowStrideTooSmall { tensor: "y", .. })
    );
    let col = MatDesc { col_stride: 2, ..y };
    assert_matches!(
        plan(&a, &b, &col, t, &s),
        Err(Error::NonUnitLastStride { tensor: "y", .. })
    );
}

#[test]
fn rejects_every_overlap() {
    let (a, b, y) = abq(DType::BF16, 4, 256);
    let t = Fp8Scaling::per_token();
    let s = scales(4, 1);
    // y over a (its first bytes), over b.
    let ya = MatDesc { addr: a.addr, ..y };
    assert_matches!(
        plan(&a, &b, &ya, t, &s),
        Err(Error::Aliasing {
            output: "y",
            other: "a"
        })
    );
    let yb = MatDesc {
        addr: b.addr + 100,
        ..y
    };
    assert_matches!(
        plan(&a, &b, &yb, t, &s),
        Err(Error::Aliasing {
            output: "y",
            other: "b"
        })
    );
    // The scales over an input, over y.
    let sa = MatDesc {
        addr: a.addr + 16,
        ..s
    };
    assert_matches!(
        plan(&a, &b, &y, t, &sa),
        Err(Error::Aliasing {
            output: "scales",
            other: "a"
        })
    );
    let sy = MatDesc {
        addr: y.addr + 64,
        ..s
    };
    assert_matches!(
        plan(&a, &b, &y, t, &sy),
        Err(Error::Aliasing {
            output: "y",
            other: "scales"
        })
    );
    // A static scale inside y.
    let sy = MatDesc {
        addr: y.addr + 8,
        ..scales(1, 1)
    };
    assert_matches!(
        plan(&a, &b, &y, Fp8Scaling::Static, &sy),
        Err(Error::Aliasing { .. })
    );
}

#[test]
fn per_token_plans_short_rows_several_per_block() {
    // Rows of up to two 16-byte accesses per thread of 512: the many-rows kernel, each row on
    // the fewest warps that hold it (no thread without an access but the last warp's), as
    // many rows per block as fit in 512 threads while the blocks still cover the SMs; rows of
    // one access per thread ask L2 for the row a wave ahead from two waves on, rows of two
    // never.
    let two_per_sm = GridLimits::uniform(132, 2);
    let ub = Fp8Scaling::per_token();
    for (dtype, rows, cols, chunks, threads, per_block, prefetch_rows) in [
        // LLaMA-3-8B's MLP over 8 GPUs: 224 accesses.
        (DType::BF16, 16384, 1792, 1, 224, 2, 528),
        (DType::BF16, 1024, 1792, 1, 224, 2, 0),
        // Fewer rows than SMs: one per block.
        (DType::BF16, 64, 1792, 1, 224, 1, 0),
        (DType::BF16, 200, 1792, 1, 224, 2, 0),
        // Over 4 GPUs: 448; over 2: 896, two per thread.
        (DType::BF16, 16384, 3584, 1, 448, 1, 264),
        (DType::F16, 4096, 7168, 2, 448, 1, 0),
        (DType::BF16, 4096, 8192, 2, 512, 1, 0),
        // Short f32 rows: 25 accesses on one warp, 8 rows per block of 256 threads.
        (DType::F32, 1024, 100, 1, 32, 8, 0),
        (DType::F32, 100_000, 64, 1, 32, 16, 4224),
        (DType::BF16, 3, 8, 1, 32, 1, 0),
    ] {
        let (a, b, y) = abq(dtype, rows, cols);
        let l = plan_on(&a, &b, &y, ub, &scales(rows, 1), &two_per_sm).unwrap();
        let p = &l.params;
        assert_eq!(
            l.kernel,
            KernelId::GatedFp8Rows(dtype, chunks),
            "{rows} x {cols}"
        );
        assert_eq!(
            (
                p.chunks,
                p.threads_per_row,
                p.rows_per_block,
                p.prefetch_rows
            ),
            (chunks, threads, per_block, prefetch_rows),
            "{rows} x {cols}"
        );
        assert_rows_grid(&l, rows, threads, per_block, &format!("{rows} x {cols}"));
    }
    // One access past two per thread, or rows off the 16-byte grid: the row kernels.
    for (dtype, cols, kernel) in [
        (
            DType::BF16,
            8200,
            KernelId::GatedFp8Row(DType::BF16, VecMode::V16),
        ),
        (
            DType::BF16,
            1793,
            KernelId::GatedFp8Row(DType::BF16, VecMode::Scalar),
        ),
    ] {
        let (a, b, y) = abq(dtype, 64, cols);
        let l = plan_on(&a, &b, &y, ub, &scales(64, 1), &two_per_sm).unwrap();
        assert_eq!((l.kernel, l.block), (kernel, 512), "{cols}");
    }
}

#[test]
fn kernel_table_has_every_storage_dtype_and_path() {
    for d in DType::ALL {
        for m in [VecMode::V16, VecMode::Scalar] {
            for k in [
                KernelId::GatedFwd(d, m),
                KernelId::GatedBwd(d, m),
                KernelId::GatedFp8Flat(d, m),
                KernelId::GatedFp8Group(d, m),
                KernelId::GatedFp8Row(d, m),
                KernelId::GatedFp8RowLong(d, m),
            ] {
                assert!(k.exists(), "{k:?}");
                assert_eq!(KernelId::ALL[k.index()], k);
            }
        }
        // The realigned FP8 kernels: 16-bit inputs only.
        let (row, flat, ends_first) = (
            KernelId::GatedFp8RowRealigned(d),
            KernelId::GatedFp8FlatRealigned(d),
            KernelId::GatedFp8FlatRealignedEndsFirst(d),
        );
        for k in [row, flat, ends_first, KernelId::GatedFp8RowsRealigned(d)] {
            assert_eq!(k.exists(), d != DType::F32, "{k:?}");
        }
        if d != DType::F32 {
            for k in [row, flat, ends_first] {
                assert!(k.syncs_grid_dependency());
                assert_eq!(KernelId::ALL[k.index()], k);
            }
            assert_eq!(row.launch_bounds(), Some((512, 1)));
            let rows = KernelId::GatedFp8RowsRealigned(d);
            assert!(rows.exists() && rows.syncs_grid_dependency(), "{rows:?}");
            assert_eq!(KernelId::ALL[rows.index()], rows);
            assert_eq!(rows.launch_bounds(), Some((512, 2)));
            assert_eq!(flat.launch_bounds(), Some((128, 8)));
            assert_eq!(ends_first.launch_bounds(), Some((128, 8)));
        }
        for (count, per_sm) in [(1, 4), (2, 3)] {
            let rows = KernelId::GatedFp8Rows(d, count);
            assert!(rows.exists() && rows.syncs_grid_dependency(), "{rows:?}");
            assert_eq!(KernelId::ALL[rows.index()], rows);
            assert_eq!(rows.launch_bounds(), Some((512, per_sm)));
        }
        assert!(!KernelId::GatedFp8Rows(d, 3).exists());
        for count in GATED_FP8_STREAM_MIN_CHUNKS as u32..=GATED_FP8_ROW_LONG_CHUNKS as u32 {
            let k = KernelId::GatedFp8RowStream(d, count);
            assert!(k.exists(), "{k:?}");
            assert_eq!(KernelId::ALL[k.index()], k);
        }
        assert!(KernelId::RmsNormDw(d).exists());
    }
    assert!(!KernelId::GatedFwd(DType::F8E4M3, VecMode::V16).exists());
    assert!(!KernelId::GatedFp8Row(DType::F8E4M3, VecMode::Scalar).exists());
}
