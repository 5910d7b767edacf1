//! Randomized test of every `plan_*` function: many random, mostly invalid tensor
//! descriptions, each planned once, checking the host API's promise that bad input gets a typed
//! error before launch, never a panic or a launch that touches memory it should not.
//!
//! Each case starts from a valid call (shapes, strides, offsets, documented in-place forms
//! drawn at random) and applies up to three damages: misaligned or top-of-address-space
//! addresses, buffers too small or absurdly large, zero, odd and huge dimensions, row strides
//! that are zero, short, padded or huge, non-unit last strides, wrong dtypes (FP8 included),
//! operands that are the same buffer or overlap another partially; eps and FP8 scaling
//! arguments from a list of awkward values. Then:
//! - the call must not panic (debug builds check arithmetic overflow, so an overflowing size
//!   computation counts);
//! - an `Err` must be one of the validation errors;
//! - an `Ok` must describe what the crate documents: every operand it accepted is valid as
//!   `MatDesc::check` promises and of the dtype and shape the call declares; the launch
//!   parameters say what the call asked for (shape, eps, flags); every region a launch reads
//!   or writes (from its parameters) lies inside its operand's buffer; outputs overlap
//!   nothing but the documented in-place forms, and the launches of one call write disjoint
//!   elements; the vector paths only run on operands on the 16-byte grid; grid, block and
//!   shared memory are within CUDA's limits and the ones the kernels document.
//!
//! Every case draws from its own generator, seeded by its family's seed plus its index, and a
//! failure prints both with the inputs. `FERROFUSE_FUZZ_CASES` sets the cases per family (a
//! longer run searches further; case `i` of a run is case `i` of every longer one).

use std::fmt::Debug;
use std::panic::{AssertUnwindSafe, catch_unwind};

use ferrofuse::fp8::DEFAULT_MIN_SCALE;
use ferrofuse::gated::{plan_gated_backward, plan_gated_forward, plan_gated_forward_fp8};
use ferrofuse::norm::{
    BwdNarrow, NormBwdVariant, RmsNormBwdDescs, RmsNormBwdPlan, RmsNormFp8Descs, RmsNormFwdDescs,
    plan_rmsnorm_backward, plan_rmsnorm_forward, plan_rmsnorm_forward_fp8,
    rmsnorm_backward_workspace_len,
};
use ferrofuse::runtime::KernelParams;
use ferrofuse::{
    Activation, DType, Error, Fp8Scaling, GridLimits, KernelId, Launch, MatDesc, NormNumerics,
    NormPath, RmsNormOptions, ScaleLayout, VecMode,
};
use ferrofuse_common::fp8::{FP8_PER_GROUP, FP8_PER_TOKEN, FP8_STATIC};
use ferrofuse_common::{
    DEFAULT_MAX_SMEM_BYTES, FlatEnds, GATED_FP8_ROW_CHUNKS, GATED_FP8_ROW_LONG_CHUNKS,
    GATED_FP8_ROW_MAX_BLOCKS, GATED_FP8_ROW_MAX_THREADS, GATED_FP8_ROW_SMEM_BYTES,
    GATED_FP8_ROWS_CHUNKS, GATED_FP8_SCALAR_BATCH, GATED_FP8_STREAM_SMEM_BYTES, GatedBwdParams,
    GatedFp8Params, GatedFwdParams, NormFwdVariant, RMSNORM_BWD_GRID_THREADS, RMSNORM_GEMMA,
    RMSNORM_HF, RMSNORM_LOOP_SMEM_BYTES, RMSNORM_SMEM_BYTES, RMSNORM_SPLIT_MAX_CLUSTER,
    RMSNORM_SPLIT_MAX_WIDE_CLUSTER, RMSNORM_STREAM_SMEM_BYTES, RMSNORM_W_F32, RmsNormFp8Params,
    RmsNormFwdParams, rmsnorm_bwd_fused_dw_blocks, rmsnorm_bwd_fused_dw_groups,
    rmsnorm_fwd_geometry, rmsnorm_realigned_smem_bytes, rmsnorm_split_smem_bytes,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Cases per planner by default: enough to meet every damage in every planner, few enough
/// for every CI run.
const CASES: u64 = 20_000;

fn cases() -> u64 {
    match std::env::var("FERROFUSE_FUZZ_CASES") {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("FERROFUSE_FUZZ_CASES={v:?} is not a case count")),
        Err(_) => CASES,
    }
}

// ------------------------------------------------------------------------------------------
// The driver: generate, plan under `catch_unwind`, check.
// ------------------------------------------------------------------------------------------

/// Runs `cases()` cases of one planner. `make` draws a case; `plan` resolves and plans it
/// (everything of the crate's that the case runs); `check` lists what an accepted plan gets
/// wrong. All three run under `catch_unwind`, so a panic anywhere (the crate's code or the
/// test's) fails the test with the case's seed. Fails on the first bad case, printing its
/// seed, the inputs and the plan.
fn fuzz<C: Debug, R: Debug>(
    family: &str,
    seed: u64,
    make: impl Fn(&mut StdRng) -> C,
    plan: impl Fn(&C) -> Result<R, Error>,
    check: impl Fn(&C, &R) -> Vec<String>,
) {
    let (mut accepted, mut rejected) = (0u64, 0u64);
    let n = cases();
    for i in 0..n {
        let case_seed = seed + i;
        let case = catch_unwind(AssertUnwindSafe(|| {
            make(&mut StdRng::seed_from_u64(case_seed))
        }))
        .unwrap_or_else(|p| {
            panic!(
                "{family}: case {i} (seed {case_seed:#x}): drawing it panicked: {}",
                panic_message(p)
            )
        });
        let fail = |what: String| -> ! {
            panic!("{family}: case {i} (seed {case_seed:#x}): {what}\ninput: {case:#?}")
        };
        match catch_unwind(AssertUnwindSafe(|| plan(&case))) {
            Err(p) => fail(format!("the plan panicked: {}", panic_message(p))),
            Ok(Err(e)) => {
                rejected += 1;
                match catch_unwind(AssertUnwindSafe(|| validation_error(&e))) {
                    Ok(Ok(())) => {}
                    Ok(Err(what)) => fail(what),
                    Err(p) => fail(format!("printing {e:?} panicked: {}", panic_message(p))),
                }
            }
            Ok(Ok(result)) => {
                accepted += 1;
                let wrong = catch_unwind(AssertUnwindSafe(|| check(&case, &result)))
                    .unwrap_or_else(|p| {
                        fail(format!(
                            "checking the plan panicked: {}\nplan: {result:#?}",
                            panic_message(p)
                        ))
                    });
                if !wrong.is_empty() {
                    fail(format!(
                        "accepted with:\n  {}\nplan: {result:#?}",
                        wrong.join("\n  ")
                    ))
                }
            }
        }
    }
    println!("{family}: {n} cases, {accepted} accepted, {rejected} rejected");
    // Both outcomes must be common, or the generator has drifted and the test checks little
    // (with enough cases for the shares to mean something).
    assert!(
        n < 1000 || (accepted * 20 >= n && rejected * 4 >= n),
        "{family}: {accepted} of {n} cases accepted, {rejected} rejected"
    );
}

/// The message of a caught panic.
fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

/// A plan's errors are all validation errors (it has no device to fail on), and they print.
fn validation_error(e: &Error) -> Result<(), String> {
    let _ = e.to_string();
    match e {
        Error::ShapeMismatch { .. }
        | Error::DTypeMismatch { .. }
        | Error::OddInterleavedWidth { .. }
        | Error::NonUnitLastStride { .. }
        | Error::RowStrideTooSmall { .. }
        | Error::BufferTooSmall { .. }
        | Error::Misaligned { .. }
        | Error::Aliasing { .. }
        | Error::TooLarge { .. }
        | Error::InvalidArgument { .. }
        | Error::UnsupportedDType { .. }
        | Error::GroupMismatch { .. } => Ok(()),
        other => Err(format!("a plan returned {other:?}, not a validation error")),
    }
}

// ------------------------------------------------------------------------------------------
// Random inputs.
// ------------------------------------------------------------------------------------------

/// Sizes past any real tensor: products of two of them overflow, some overflow on their own
/// once multiplied by an element size, some sit on the kernels' 32-bit limits.
const HUGE: [usize; 16] = [
    1 << 20,
    (1 << 31) - 1,
    1 << 31,
    u32::MAX as usize - 1,
    u32::MAX as usize,
    u32::MAX as usize + 1,
    1 << 33,
    1 << 40,
    usize::MAX / 16,
    usize::MAX / 4,
    usize::MAX / 4 + 1,
    usize::MAX / 2,
    usize::MAX / 2 + 1,
    usize::MAX - 1,
    usize::MAX,
    1 << 62,
];

/// Row lengths of real models, and the norm's geometry boundaries.
const MODEL: [usize; 12] = [
    896, 2048, 3584, 4096, 5120, 8192, 8193, 11008, 14336, 16384, 16385, 18944,
];

/// A row or column count: mostly small and awkward, sometimes a power of two +-1 or a model
/// size, sometimes huge.
fn dim(rng: &mut StdRng) -> usize {
    match rng.random_range(0..100) {
        0..10 => rng.random_range(0..=1),
        10..45 => rng.random_range(2..=70),
        45..60 => {
            let p = 1usize << rng.random_range(1..=17);
            [p - 1, p, p + 1][rng.random_range(0..3)]
        }
        60..85 => MODEL[rng.random_range(0..MODEL.len())],
        _ => HUGE[rng.random_range(0..HUGE.len())],
    }
}

/// A row count: one row (a decode step, and the shape whose row stride validation ignores)
/// often, else any dimension.
fn rows_dim(rng: &mut StdRng) -> usize {
    if rng.random_bool(0.25) { 1 } else { dim(rng) }
}

/// Mostly a storage dtype; FP8 sometimes, where no kernel reads it.
fn storage_dtype(rng: &mut StdRng) -> DType {
    match rng.random_range(0..20) {
        0 => DType::F8E4M3,
        n => DType::ALL[n % 3],
    }
}

/// The norm's weight dtype: the storage dtype, or f32 (the documented mixed form) now and then.
fn weight_dtype(rng: &mut StdRng, storage: DType) -> DType {
    if rng.random_bool(0.3) {
        DType::F32
    } else {
        storage
    }
}

fn any_dtype(rng: &mut StdRng) -> DType {
    [DType::F32, DType::F16, DType::BF16, DType::F8E4M3][rng.random_range(0..4)]
}

/// A float argument that must be finite and > 0 (eps, min_scale, scale_ub): mostly `valid`,
/// else one of the values a check must catch or let through (subnormals are valid).
fn float_arg(rng: &mut StdRng, valid: f32) -> f32 {
    match rng.random_range(0..40) {
        0 => 0.0,
        1 => -0.0,
        2 => -valid,
        3 => f32::NAN,
        4 => -f32::NAN,
        5 => f32::INFINITY,
        6 => f32::NEG_INFINITY,
        7 => f32::from_bits(1),
        8 => f32::MIN_POSITIVE,
        9 => f32::MAX,
        _ => valid,
    }
}

/// Device limits as `GridLimits::uniform` takes them (kept apart so a failing case prints
/// three numbers rather than a table).
#[derive(Clone, Copy, Debug)]
struct Limits {
    sm_count: u32,
    blocks_per_sm: u32,
    clusters: bool,
    wide_clusters: bool,
    narrow_split: bool,
    loop_ahead: bool,
    streamed_rows: bool,
}

impl Limits {
    fn grid_limits(&self) -> GridLimits {
        GridLimits::uniform(self.sm_count, self.blocks_per_sm)
            .with_clusters(self.clusters)
            .with_wide_clusters(self.wide_clusters)
            .with_narrow_split(self.narrow_split)
            .with_loop_ahead(self.loop_ahead)
            .with_streamed_rows(self.streamed_rows)
    }
}

/// Device limits of real GPUs (a single SM to a few hundred, with and without clusters and the
/// streamed kernel's shared memory), and
/// now and then limits no device has (zero, or up to `u32::MAX`: `GridLimits::uniform` takes
/// any counts, so a plan must survive them too).
fn limits(rng: &mut StdRng) -> Limits {
    let absurd = [0, u32::MAX / 2, u32::MAX];
    let sm_count = if rng.random_bool(0.02) {
        absurd[rng.random_range(0..absurd.len())]
    } else {
        [1, 2, 46, 84, 108, 132, 144, 170, 1024][rng.random_range(0..9)]
    };
    let blocks_per_sm = if rng.random_bool(0.02) {
        absurd[rng.random_range(0..absurd.len())]
    } else {
        rng.random_range(1..=32)
    };
    Limits {
        sm_count,
        blocks_per_sm,
        clusters: rng.random_bool(0.5),
        wide_clusters: rng.random_bool(0.5),
        narrow_split: rng.random_bool(0.3),
        loop_ahead: rng.random_bool(0.7),
        streamed_rows: rng.random_bool(0.5),
    }
}

/// Each operand in its own 16 TiB window, so nothing overlaps unless a case makes it (or its
/// shape is huge).
fn window(slot: u64) -> u64 {
    (1 << 48) + (slot << 44)
}

/// Elements from an operand's address to one past its last: `None` when that overflows.
fn extent(rows: usize, cols: usize, row_stride: usize) -> Option<usize> {
    if rows == 0 || cols == 0 {
        return Some(0);
    }
    (rows - 1).checked_mul(row_stride)?.checked_add(cols)
}

/// Layout choices one case shares between its operands, so that equal row strides and equal
/// offsets from the 16-byte grid (what the exact overlap test, the vector and the flat paths
/// look at) are common.
#[derive(Clone, Copy, Debug)]
struct Layout {
    /// Row padding of `[rows, cols]` operands (0: dense).
    pad: usize,
    /// The row stride of one-row operands, which validation ignores (PyTorch gives size-1
    /// dimensions any stride): `None` is `cols`.
    one_row_stride: Option<usize>,
    /// Bytes past the window start (rounded down to each operand's element size).
    offset: u64,
}

fn layout(rng: &mut StdRng) -> Layout {
    let pad = match rng.random_range(0..20) {
        0..10 => 0,
        10..14 => rng.random_range(1..=17),
        14..18 => 8 * rng.random_range(1..=4),
        _ => [1 << 20, 1 << 32, usize::MAX / 8][rng.random_range(0..3)],
    };
    let one_row_stride = match rng.random_range(0..10) {
        0..6 => None,
        _ => Some([0, 1, 2, 3, 7, 8, 100, usize::MAX][rng.random_range(0..8)]),
    };
    let offset = match rng.random_range(0..4) {
        0 | 1 => 0,
        2 => 16 * rng.random_range(1..=8),
        _ => rng.random_range(1..16),
    };
    Layout {
        pad,
        one_row_stride,
        offset,
    }
}

/// A valid `rows x cols` description of `dtype` in window `slot` laid out as `lay` says, its
/// buffer exactly the extent or a little more (the largest length when the extent
/// overflows, which validation must reject).
fn operand(
    rng: &mut StdRng,
    lay: &Layout,
    slot: u64,
    dtype: DType,
    rows: usize,
    cols: usize,
) -> MatDesc {
    let row_stride = if rows <= 1 {
        lay.one_row_stride.unwrap_or(cols)
    } else {
        cols.saturating_add(lay.pad)
    };
    let size = dtype.size_bytes() as u64;
    let len = match extent(rows, cols, row_stride) {
        Some(n) if rng.random_bool(0.7) => n,
        Some(n) => n.saturating_add(rng.random_range(1..100)),
        None => usize::MAX,
    };
    MatDesc {
        addr: window(slot) + lay.offset / size * size,
        len,
        dtype,
        rows,
        cols,
        row_stride,
        col_stride: 1,
    }
}

/// Up to three damages, each one field of one operand made wrong (or suspicious) the way
/// callers get it wrong; no damage at all for a good share of the cases, which stay valid.
fn damage(rng: &mut StdRng, ops: &mut [&mut MatDesc]) {
    let n = match rng.random_range(0..10) {
        0..3 => 0,
        3..7 => 1,
        _ => rng.random_range(2..=3),
    };
    for _ in 0..n {
        let other = *ops[rng.random_range(0..ops.len())];
        let i = rng.random_range(0..ops.len());
        let m = &mut *ops[i];
        let size = m.dtype.size_bytes() as u64;
        let bytes = extent(m.rows, m.cols, m.row_stride)
            .and_then(|n| (n as u64).checked_mul(size))
            .unwrap_or(u64::MAX);
        match rng.random_range(0..13) {
            // Off the element grid (or, for FP8 and multiples of the size, off the 16-byte
            // grid only).
            0 => m.addr = m.addr.wrapping_add(rng.random_range(1..16)),
            // Whole elements off the 16-byte grid.
            1 => m.addr = m.addr.wrapping_add(size * rng.random_range(1..8)),
            // At the top of the address space: the extent ends at, or wraps past, 2^64.
            2 => {
                m.addr = match rng.random_range(0..3) {
                    0 => 0u64.wrapping_sub(bytes),
                    1 => 0u64.wrapping_sub(bytes).wrapping_add(size),
                    _ => u64::MAX - size + 1 - size * rng.random_range(0..4),
                }
            }
            3 => {
                m.len = match rng.random_range(0..6) {
                    0 => 0,
                    1 => m.len.saturating_sub(1),
                    2 => m.len / 2,
                    3 => usize::MAX,
                    4 => usize::MAX / size as usize,
                    _ => rng.random_range(0..1 << 20),
                }
            }
            4 => m.rows = dim(rng),
            5 => m.cols = dim(rng),
            6 => {
                m.row_stride = match rng.random_range(0..6) {
                    0 => 0,
                    1 => m.cols.saturating_sub(1),
                    2 => m.cols,
                    3 => m.cols.saturating_add(1),
                    4 => usize::MAX,
                    _ => HUGE[rng.random_range(0..HUGE.len())],
                }
            }
            7 => m.col_stride = [0, 2, 3, usize::MAX][rng.random_range(0..4)],
            8 => m.dtype = any_dtype(rng),
            // The same buffer as another operand (or itself).
            9 => *m = other,
            // Another operand's description a few elements or bytes on: a partial overlap.
            10 | 11 => {
                let shift = match rng.random_range(0..3) {
                    0 => rng.random_range(1..64),
                    1 => other.dtype.size_bytes() as u64 * rng.random_range(1..64),
                    _ => (other.dtype.size_bytes() as u64 * rng.random_range(1..64)).wrapping_neg(),
                };
                *m = MatDesc {
                    addr: other.addr.wrapping_add(shift),
                    ..other
                }
            }
            // The same place as another operand, in this operand's dtype and shape.
            _ => m.addr = other.addr,
        }
    }
}

fn activation(rng: &mut StdRng) -> Activation {
    Activation::ALL[rng.random_range(0..4)]
}

// ------------------------------------------------------------------------------------------
// What an accepted plan must satisfy.
// ------------------------------------------------------------------------------------------

/// Bytes a kernel touches: `rows` runs of `cols` elements of `size` bytes, `stride` elements
/// apart, from `addr`. Held in u128 so that nothing computed from a bad plan wraps.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Region {
    addr: u128,
    size: u128,
    rows: u128,
    cols: u128,
    stride: u128,
}

impl Region {
    fn new(addr: u64, size: usize, rows: u64, cols: u64, stride: u64) -> Self {
        Region {
            addr: addr as u128,
            size: size as u128,
            rows: rows as u128,
            cols: cols as u128,
            stride: stride as u128,
        }
    }

    /// A one-row operand (a weight, a workspace).
    fn row(addr: u64, size: usize, cols: u64) -> Self {
        Region::new(addr, size, 1, cols, 0)
    }

    fn is_empty(&self) -> bool {
        self.rows == 0 || self.cols == 0
    }

    /// One past the last byte (saturating: a bad plan's region may be absurd).
    fn end(&self) -> u128 {
        let elems = (self.rows - 1)
            .saturating_mul(self.stride)
            .saturating_add(self.cols);
        self.addr.saturating_add(elems.saturating_mul(self.size))
    }

    /// Whether some row shares a byte with `[s, e)`. Rows start and end in increasing order,
    /// so the rows that do are a range: from the first ending after `s` to the last
    /// starting before `e`.
    fn hits(&self, s: u128, e: u128) -> bool {
        let len = self.cols * self.size;
        let step = self.stride * self.size;
        if self.rows == 1 || step == 0 {
            return self.addr < e && self.addr + len > s;
        }
        if e <= self.addr {
            return false;
        }
        let last = ((e - self.addr - 1) / step).min(self.rows - 1);
        let first = if s < self.addr + len {
            0
        } else {
            (s - self.addr - len) / step + 1
        };
        first <= last
    }

    /// The same bytes in the same element order: the one overlap in-place forms allow.
    fn same_place(&self, o: &Region) -> bool {
        (self.addr, self.size, self.rows, self.cols) == (o.addr, o.size, o.rows, o.cols)
            && (self.rows <= 1 || self.stride == o.stride)
    }
}

/// Whether two regions whose rows are the same number of bytes apart share a byte, exactly and
/// in O(1); `None` when their rows are not (a one-row region fits any step: it has no second
/// row). Row `i` of `p` is `[P + i*step, P + i*step + lp)`, row `j` of `q` is
/// `[Q + j*step, Q + j*step + lq)`; with `d = Q - P` and `k = i - j` they meet iff
/// `d - lp < k*step < d + lq`, and `k` takes every value in `[-(q.rows - 1), p.rows - 1]`
/// (some pair of rows has each difference). `k*step` grows with `k`, so the smallest `k` of that
/// range above the lower bound is the one candidate to hold against the upper bound. Rows that
/// overlap each other (a step below the row length, or 0) need nothing else.
fn overlap_equal_steps(p: &Region, q: &Region) -> Option<bool> {
    let step_of = |r: &Region| (r.rows > 1).then_some(r.stride * r.size);
    let step = match (step_of(p), step_of(q)) {
        (Some(s), Some(t)) if s != t => return None,
        (Some(s), _) | (_, Some(s)) => s,
        (None, None) => 0,
    };
    if p.is_empty() || q.is_empty() {
        return Some(false);
    }
    // Addresses come from u64s, lengths and steps from u64 counts times at most 4 bytes, rows
    // from u64s: all far inside i128.
    let d = q.addr as i128 - p.addr as i128;
    let (lp, lq) = ((p.cols * p.size) as i128, (q.cols * q.size) as i128);
    if step == 0 {
        // Every row of each region is its first.
        return Some(d - lp < 0 && 0 < d + lq);
    }
    let step = step as i128;
    let k = ((d - lp).div_euclid(step) + 1).max(1 - q.rows as i128);
    // |k*step| is at most |d - lp| + step here (k is the clamp only when that is nearer 0),
    // so the product cannot overflow.
    Some(k < p.rows as i128 && k * step < d + lq)
}

/// Rows walked at most by the row walk below; beyond, the pair is left unchecked. Rare: the
/// long operands of a case share its layout, so their rows are the same distance apart and
/// their pairs take the O(1) test (the default run, and one ten times longer, leave none).
const MAX_WALK: u128 = 1 << 14;

/// Whether two regions share a byte: by the O(1) test when their rows are the same distance
/// apart, else by walking the rows of the shorter one; `None` when that is too long a walk to
/// take.
fn overlap(p: &Region, q: &Region) -> Option<bool> {
    if p.is_empty() || q.is_empty() || p.end() <= q.addr || q.end() <= p.addr {
        return Some(false);
    }
    if let Some(hit) = overlap_equal_steps(p, q) {
        return Some(hit);
    }
    overlap_walk(p, q)
}

/// [`overlap`] by walking the rows of the shorter region, `None` past [`MAX_WALK`] rows.
fn overlap_walk(p: &Region, q: &Region) -> Option<bool> {
    let (p, q) = if p.rows <= q.rows { (p, q) } else { (q, p) };
    if p.rows > MAX_WALK {
        return None;
    }
    Some((0..p.rows).any(|r| {
        let s = p.addr + r * p.stride * p.size;
        q.hits(s, s + p.cols * p.size)
    }))
}

/// Every byte a region covers, for the brute-force check below.
fn region_bytes(r: &Region) -> Vec<u128> {
    let mut out = Vec::new();
    for row in 0..r.rows {
        for col in 0..r.cols {
            let at = r.addr + (row * r.stride + col) * r.size;
            out.extend(at..at + r.size);
        }
    }
    out
}

/// The O(1) test and the row walk against brute force on small regions, many of them
/// malformed as a bad plan's could be (a step of 0 or below the row length, mixed element
/// sizes, one row with any stride): a wrong "disjoint" would hide an overlap from every fuzz
/// test, so both answers must be exact.
#[test]
fn overlap_tests_match_brute_force() {
    let mut rng = StdRng::seed_from_u64(0x0e71_a900_0000);
    // Answers of the O(1) test, disjoint and overlapping.
    let mut equal_steps = [0u64; 2];
    for _ in 0..50_000 {
        let region = |rng: &mut StdRng| {
            Region::new(
                1000 + rng.random_range(0..64),
                [1, 2, 4][rng.random_range(0..3)],
                rng.random_range(0..=5),
                rng.random_range(0..=6),
                rng.random_range(0..=8),
            )
        };
        let p = region(&mut rng);
        let mut q = region(&mut rng);
        // Mostly rows the same number of bytes apart, where the sizes allow it: the case the
        // O(1) test takes.
        if rng.random_bool(0.7) && (p.stride * p.size).is_multiple_of(q.size) {
            q.stride = p.stride * p.size / q.size;
        }
        let pb = region_bytes(&p);
        let truth = region_bytes(&q).iter().any(|b| pb.contains(b));
        for (x, y) in [(&p, &q), (&q, &p)] {
            assert_eq!(overlap(x, y), Some(truth), "overlap({x:?}, {y:?})");
            if let Some(got) = overlap_equal_steps(x, y) {
                assert_eq!(got, truth, "overlap_equal_steps({x:?}, {y:?})");
                equal_steps[got as usize] += 1;
            }
            if !x.is_empty() && !y.is_empty() {
                assert_eq!(
                    overlap_walk(x, y),
                    Some(truth),
                    "overlap_walk({x:?}, {y:?})"
                );
            }
        }
    }
    // Most pairs through the O(1) test, both of its answers common.
    assert!(equal_steps.iter().all(|&n| n > 10_000), "{equal_steps:?}");
}

/// One operand as one launch touches it.
#[derive(Clone, Copy, Debug)]
struct Access {
    name: &'static str,
    region: Region,
    write: bool,
    launch: usize,
}

/// The violations found in one accepted plan.
#[derive(Default)]
struct Violations(Vec<String>);

impl Violations {
    fn add(&mut self, what: String) {
        self.0.push(what);
    }

    /// What `MatDesc::check` promises of an operand it accepts (of `dtype` and `shape`): a
    /// unit last stride, rows that do not overlap, a buffer that holds the extent, an address
    /// on the element grid, and (the extent being bytes of one allocation) an end inside the
    /// 64-bit address space.
    fn desc(&mut self, name: &str, m: &MatDesc, dtype: DType, shape: (usize, usize)) {
        if m.dtype != dtype {
            self.add(format!("{name} is {:?}, expected {dtype:?}", m.dtype));
        }
        if m.shape() != shape {
            self.add(format!("{name} is {:?}, expected {shape:?}", m.shape()));
        }
        if m.col_stride != 1 && m.cols > 1 {
            self.add(format!("{name} has last stride {}", m.col_stride));
        }
        if m.is_empty() {
            return;
        }
        if m.rows > 1 && m.row_stride < m.cols {
            self.add(format!(
                "{name}'s rows overlap (row stride {})",
                m.row_stride
            ));
        }
        let size = m.dtype.size_bytes();
        let r = Region::new(
            m.addr,
            size,
            m.rows as u64,
            m.cols as u64,
            m.row_stride as u64,
        );
        let elems = (r.end() - r.addr) / r.size;
        if elems > m.len as u128 {
            self.add(format!(
                "{name} reaches {elems} elements, its buffer has {}",
                m.len
            ));
        }
        if r.end() > 1 << 64 {
            self.add(format!("{name} ends past the 64-bit address space"));
        }
        if !m.addr.is_multiple_of(size as u64) {
            self.add(format!(
                "{name} at {:#x} is not {size}-byte aligned",
                m.addr
            ));
        }
    }

    /// Every access lies inside its operand's buffer `[addr, addr + len * size)`.
    fn inside(&mut self, a: &Access, buf: &MatDesc) {
        if a.region.is_empty() {
            return;
        }
        let start = buf.addr as u128;
        let end = start + buf.len as u128 * buf.dtype.size_bytes() as u128;
        if a.region.addr < start || a.region.end() > end || a.region.end() > 1 << 64 {
            self.add(format!(
                "launch {} {}s {} bytes [{:#x}, {:#x}) outside its buffer [{start:#x}, {end:#x})",
                a.launch,
                if a.write { "write" } else { "read" },
                a.name,
                a.region.addr,
                a.region.end()
            ));
        }
    }

    /// A vector kernel reads and writes 16-byte vectors: every `[rows, cols]` access starts
    /// on the 16-byte grid with rows on it; one-row operands need only the start.
    fn vectors(&mut self, a: &Access, one_row: bool) {
        self.aligned_to(a, one_row, 16);
    }

    /// Accesses of `align` bytes (an FP8 `y` on the vector path: one byte per lane of the
    /// storage dtype's vector, so `lanes`-byte stores).
    fn aligned_to(&mut self, a: &Access, one_row: bool, align: u128) {
        let r = &a.region;
        if r.is_empty() {
            return;
        }
        let rows_ok = one_row
            || ((r.cols * r.size).is_multiple_of(align)
                && (r.rows <= 1 || (r.stride * r.size).is_multiple_of(align)));
        if !r.addr.is_multiple_of(align) || !rows_ok {
            self.add(format!(
                "a vector kernel accesses {} at {:#x} (row stride {}, {} columns), off the \
                 {align}-byte grid",
                a.name, r.addr, r.stride, r.cols
            ));
        }
    }

    /// Outputs overlap no other operand, in any launch of the plan, except the in-place pairs
    /// `allowed` names (output, input), exactly and within one launch.
    fn aliasing(&mut self, accesses: &[Access], allowed: &[(&str, &str)]) {
        for w in accesses.iter().filter(|a| a.write) {
            for o in accesses.iter().filter(|o| o.name != w.name) {
                if overlap(&w.region, &o.region) != Some(true) {
                    continue;
                }
                let in_place = allowed.contains(&(w.name, o.name))
                    && w.launch == o.launch
                    && w.region.same_place(&o.region);
                if !in_place {
                    self.add(format!(
                        "launch {} writes {} over launch {}'s {}",
                        w.launch, w.name, o.launch, o.name
                    ));
                }
            }
        }
    }

    /// CUDA's limits (grid.x below 2^31, at most 1024 threads a block), and the kernel's: at
    /// most `max_block_threads` threads, shared memory within the default 48 KiB or the
    /// kernel's documented opt-in. A launch with `work` has a grid; one without may have none.
    fn launch<P>(&mut self, i: usize, l: &Launch<P>, work: bool) {
        if l.grid > i32::MAX as u32 {
            self.add(format!("launch {i}: grid {} past CUDA's limit", l.grid));
        }
        if work && l.grid == 0 {
            self.add(format!("launch {i}: no grid for a call with work"));
        }
        if l.grid == 0 {
            return;
        }
        let max_block = l.kernel.max_block_threads().min(1024);
        if l.block == 0 || l.block > max_block {
            self.add(format!("launch {i}: block of {} threads", l.block));
        }
        let smem = l
            .kernel
            .dynamic_smem_opt_in()
            .unwrap_or(DEFAULT_MAX_SMEM_BYTES);
        if l.shared_mem_bytes > smem {
            self.add(format!(
                "launch {i}: {} bytes of shared memory, the kernel may have {smem}",
                l.shared_mem_bytes
            ));
        }
    }
}

/// An access of launch `launch`.
fn access(name: &'static str, region: Region, write: bool, launch: usize) -> Access {
    Access {
        name,
        region,
        write,
        launch,
    }
}

/// What an accepted call's operands must all have (its dtype, or its shape): what the case
/// declared, unless damage changed it alike in every description that carries it
/// (`carried`, one value each), which makes a valid call of the new value (an interleaved `x`
/// given other columns with `y` written over `b`, say). Taken from the case, never from one
/// of the operands checked against it, so an operand of another dtype or shape than the
/// call's fails whichever operand it is.
fn expected<T: Copy + PartialEq>(declared: T, carried: &[T]) -> T {
    match carried.split_first() {
        Some((&first, rest)) if first != declared && rest.iter().all(|&t| t == first) => first,
        _ => declared,
    }
}

/// The storage dtype and the shape of an accepted call (see [`expected`]), from the dtypes and
/// shapes its own descriptions carry. The dtype must be one the kernels read: the generator
/// declares FP8 calls now and then, and FP8 is an output format only.
fn call_type(
    v: &mut Violations,
    (dtype, shape): (DType, (usize, usize)),
    dtypes: &[DType],
    shapes: &[(usize, usize)],
) -> (DType, (usize, usize)) {
    let dtype = expected(dtype, dtypes);
    if !DType::ALL.contains(&dtype) {
        v.add(format!("accepted a call of {dtype:?}"));
    }
    (dtype, expected(shape, shapes))
}

/// The shape an interleaved `[rows, 2 * cols]` description gives each of its halves.
fn half_shape(x: &MatDesc) -> (usize, usize) {
    (x.rows, x.cols / 2)
}

/// The dtypes and shapes a gated call's inputs carry: those of the halves of `x`, or of the
/// split `a` and `b`.
fn gated_inputs_carried(
    x: &Option<MatDesc>,
    a: &MatDesc,
    b: &MatDesc,
) -> (Vec<DType>, Vec<(usize, usize)>) {
    match x {
        Some(x) => (vec![x.dtype], vec![half_shape(x)]),
        None => (vec![a.dtype, b.dtype], vec![a.shape(), b.shape()]),
    }
}

// ------------------------------------------------------------------------------------------
// Gated forward.
// ------------------------------------------------------------------------------------------

/// A gated forward call as the safe API builds it: split inputs or the halves of an
/// interleaved `x`, `y` its own buffer or written over `b` (the in-place forms).
#[derive(Debug)]
struct GatedFwdCase {
    /// What the call declares: its storage dtype and the shape of its operands (before
    /// damage, which may change either).
    dtype: DType,
    shape: (usize, usize),
    act: Activation,
    /// When given, `a` and `b` are its `interleaved_halves` (and the two fields below unused).
    x: Option<MatDesc>,
    a: MatDesc,
    b: MatDesc,
    /// `None`: in place over `b`.
    y: Option<MatDesc>,
    limits: Limits,
}

fn gated_forward_case(rng: &mut StdRng) -> GatedFwdCase {
    let dtype = storage_dtype(rng);
    let (rows, cols) = (rows_dim(rng), dim(rng));
    let lay = layout(rng);
    let mut c = GatedFwdCase {
        dtype,
        shape: (rows, cols),
        act: activation(rng),
        x: rng
            .random_bool(0.4)
            .then(|| operand(rng, &lay, 0, dtype, rows, cols.saturating_mul(2))),
        a: operand(rng, &lay, 1, dtype, rows, cols),
        b: operand(rng, &lay, 2, dtype, rows, cols),
        y: rng
            .random_bool(0.7)
            .then(|| operand(rng, &lay, 3, dtype, rows, cols)),
        limits: limits(rng),
    };
    let mut ops: Vec<&mut MatDesc> = match &mut c.x {
        Some(x) => vec![x],
        None => vec![&mut c.a, &mut c.b],
    };
    ops.extend(c.y.as_mut());
    damage(rng, &mut ops);
    c
}

/// The operands of a gated case as the plan sees them: `(a, b)` split or the halves of `x`.
fn halves(x: &Option<MatDesc>, a: &MatDesc, b: &MatDesc) -> Result<(MatDesc, MatDesc), Error> {
    match x {
        Some(x) => x.interleaved_halves(),
        None => Ok((*a, *b)),
    }
}

fn gated_forward_operands(c: &GatedFwdCase) -> Result<[MatDesc; 3], Error> {
    let (a, b) = halves(&c.x, &c.a, &c.b)?;
    Ok([a, b, c.y.unwrap_or(b)])
}

fn plan_gated_forward_case(c: &GatedFwdCase) -> Result<Launch<GatedFwdParams>, Error> {
    let [a, b, y] = gated_forward_operands(c)?;
    plan_gated_forward(c.act, &a, &b, &y, &c.limits.grid_limits())
}

/// The checks every gated launch shares: the launch limits, the grid walk's 32-bit
/// arithmetic (at most 2^31 threads, rows of fewer than 2^32 accesses), each access inside
/// its buffer and, on the vector path, on the 16-byte grid.
fn gated_launch<P>(
    v: &mut Violations,
    i: usize,
    l: &Launch<P>,
    (rows, cols, per_row): (u64, u64, u64),
    accesses: &[(Access, &MatDesc)],
    vector: bool,
) {
    v.launch(i, l, rows > 0 && cols > 0);
    if l.grid as u64 * l.block as u64 > 1 << 31 {
        v.add(format!("launch {i}: {} x {} threads", l.grid, l.block));
    }
    if per_row >= 1 << 32 {
        v.add(format!("launch {i}: rows of {per_row} accesses"));
    }
    for (a, buf) in accesses {
        v.inside(a, buf);
        if vector {
            v.vectors(a, false);
        }
    }
}

/// The ragged ends of a flat launch (see `FlatEnds`) as accesses of launch `i`: for each of
/// the body's accesses, `head` elements just below it and `tail` just past it, of the same
/// operand. Only a one-row launch of an entry that takes them may carry ends (the others
/// ignore them, which would leave elements unwritten), with a thread for each.
fn flat_ends<'m>(
    v: &mut Violations,
    i: usize,
    (ends, threads, takes_ends): (FlatEnds, u64, bool),
    body: &[(Access, &'m MatDesc)],
) -> Vec<(Access, &'m MatDesc)> {
    let (head, tail) = (ends.head as u128, ends.tail as u128);
    if head + tail == 0 {
        return Vec::new();
    }
    let one_row = body.iter().all(|(a, _)| a.region.rows <= 1);
    if !takes_ends || !one_row || threads < (head + tail) as u64 {
        v.add(format!(
            "launch {i}: ends {ends:?} on {threads} threads of an entry that takes them: \
             {takes_ends}, one row: {one_row}"
        ));
    }
    let part = |acc: &Access, addr: u128, cols: u128| Access {
        region: Region {
            addr,
            rows: 1,
            cols,
            stride: cols,
            ..acc.region
        },
        ..*acc
    };
    body.iter()
        .flat_map(|&(acc, buf)| {
            let r = acc.region;
            let below = r.addr.saturating_sub(head * r.size);
            [
                (part(&acc, below, head), buf),
                (part(&acc, r.addr + r.cols * r.size, tail), buf),
            ]
        })
        .collect()
}

/// [`gated_launch`] of a forward or backward launch of `rows x cols` (`per_row` accesses a
/// row), with its ragged `ends` ([`flat_ends`]) inside their buffers and counted toward the
/// call's `shape`; returns every access, the ends' too.
fn gated_launch_with_ends<P>(
    v: &mut Violations,
    l: &Launch<P>,
    (rows, cols, per_row, ends): (u64, u64, u64, FlatEnds),
    body: &[(Access, &MatDesc)],
    (vector, takes_ends): (bool, bool),
    shape: (usize, usize),
) -> Vec<Access> {
    gated_launch(v, 0, l, (rows, cols, per_row), body, vector);
    let threads = l.grid as u64 * l.block as u64;
    let end_accesses = flat_ends(v, 0, (ends, threads, takes_ends), body);
    for (acc, buf) in &end_accesses {
        v.inside(acc, buf);
    }
    let elements = rows as u128 * cols as u128 + ends.head as u128 + ends.tail as u128;
    if elements != shape.0 as u128 * shape.1 as u128 {
        v.add(format!(
            "the launch covers {elements} elements of {shape:?}"
        ));
    }
    body.iter().chain(&end_accesses).map(|(a, _)| *a).collect()
}

fn check_gated_forward(c: &GatedFwdCase, l: &Launch<GatedFwdParams>) -> Vec<String> {
    let mut v = Violations::default();
    let [a, b, y] = gated_forward_operands(c).expect("planned, so resolved");
    let (mut dtypes, mut shapes) = gated_inputs_carried(&c.x, &c.a, &c.b);
    if let Some(y) = &c.y {
        dtypes.push(y.dtype);
        shapes.push(y.shape());
    }
    let (dtype, shape) = call_type(&mut v, (c.dtype, c.shape), &dtypes, &shapes);
    for (name, m) in [("a", &a), ("b", &b), ("y", &y)] {
        v.desc(name, m, dtype, shape);
    }
    let size = dtype.size_bytes();
    let p = &l.params;
    let vector = match l.kernel {
        KernelId::GatedFwd(d, mode) if d == dtype => mode == VecMode::V16,
        KernelId::GatedFwdEnds(d) if d == dtype => true,
        KernelId::GatedFwdRealigned(d) | KernelId::GatedFwdRealignedEndsFirst(d) if d == dtype => {
            false
        }
        k => {
            v.add(format!("kernel {k:?} for {dtype:?}"));
            false
        }
    };
    let region = |addr, stride| Region::new(addr, size, p.rows, p.cols, stride);
    let body = [
        (access("a", region(p.a, p.a_stride), false, 0), &a),
        (access("b", region(p.b, p.b_stride), false, 0), &b),
        (access("y", region(p.y, p.y_stride), true, 0), &y),
    ];
    let takes_ends = matches!(l.kernel, KernelId::GatedFwdEnds(_));
    let dims = (p.rows, p.cols, p.walk.per_row, p.ends);
    let accesses = gated_launch_with_ends(&mut v, l, dims, &body, (vector, takes_ends), shape);
    v.aliasing(&accesses, &[("y", "b")]);
    v.0
}

#[test]
fn gated_forward_fuzz() {
    fuzz(
        "plan_gated_forward",
        0x6a7e_d000_0000,
        gated_forward_case,
        plan_gated_forward_case,
        check_gated_forward,
    );
}

// ------------------------------------------------------------------------------------------
// Gated backward.
// ------------------------------------------------------------------------------------------

/// Where a gated gradient goes: its own buffer, or over one of the inputs the docs allow.
#[derive(Clone, Copy, Debug)]
enum Grad {
    Own(MatDesc),
    /// Over the saved input it is the gradient of (`a` for `da`, `b` for `db`).
    OverInput,
    OverDy,
}

#[derive(Debug)]
struct GatedBwdCase {
    /// What the call declares: its storage dtype and the shape of its operands (before
    /// damage, which may change either).
    dtype: DType,
    shape: (usize, usize),
    act: Activation,
    /// When given, `a` and `b` are its halves.
    x: Option<MatDesc>,
    a: MatDesc,
    b: MatDesc,
    dy: MatDesc,
    /// When given, `da` and `db` are its halves (the interleaved backward).
    dx: Option<MatDesc>,
    da: Grad,
    db: Grad,
    limits: Limits,
}

fn gated_backward_case(rng: &mut StdRng) -> GatedBwdCase {
    let dtype = storage_dtype(rng);
    let (rows, cols) = (rows_dim(rng), dim(rng));
    let lay = layout(rng);
    let grad = |rng: &mut StdRng, slot| match rng.random_range(0..6) {
        0 => Grad::OverInput,
        1 => Grad::OverDy,
        _ => Grad::Own(operand(rng, &lay, slot, dtype, rows, cols)),
    };
    let (da, db) = (grad(rng, 5), grad(rng, 6));
    let interleaved = rng.random_bool(0.3);
    let mut c = GatedBwdCase {
        dtype,
        shape: (rows, cols),
        act: activation(rng),
        x: interleaved.then(|| operand(rng, &lay, 0, dtype, rows, cols.saturating_mul(2))),
        a: operand(rng, &lay, 1, dtype, rows, cols),
        b: operand(rng, &lay, 2, dtype, rows, cols),
        dy: operand(rng, &lay, 3, dtype, rows, cols),
        // The interleaved backward's dx, now and then over x itself.
        dx: (interleaved && rng.random_bool(0.7))
            .then(|| operand(rng, &lay, 4, dtype, rows, cols.saturating_mul(2))),
        da,
        db,
        limits: limits(rng),
    };
    if interleaved && c.dx.is_none() {
        c.dx = c.x;
    }
    let mut ops: Vec<&mut MatDesc> = match &mut c.x {
        Some(x) => vec![x],
        None => vec![&mut c.a, &mut c.b],
    };
    ops.push(&mut c.dy);
    match &mut c.dx {
        Some(dx) => ops.push(dx),
        None => {
            for g in [&mut c.da, &mut c.db] {
                if let Grad::Own(m) = g {
                    ops.push(m);
                }
            }
        }
    }
    damage(rng, &mut ops);
    c
}

fn gated_backward_operands(c: &GatedBwdCase) -> Result<[MatDesc; 5], Error> {
    let (a, b) = halves(&c.x, &c.a, &c.b)?;
    let (da, db) = match &c.dx {
        Some(dx) => dx.interleaved_halves()?,
        None => {
            let place = |g: Grad, input: MatDesc| match g {
                Grad::Own(m) => m,
                Grad::OverInput => input,
                Grad::OverDy => c.dy,
            };
            (place(c.da, a), place(c.db, b))
        }
    };
    Ok([a, b, c.dy, da, db])
}

fn plan_gated_backward_case(c: &GatedBwdCase) -> Result<Launch<GatedBwdParams>, Error> {
    let [a, b, dy, da, db] = gated_backward_operands(c)?;
    plan_gated_backward(c.act, &a, &b, &dy, &da, &db, &c.limits.grid_limits())
}

fn check_gated_backward(c: &GatedBwdCase, l: &Launch<GatedBwdParams>) -> Vec<String> {
    let mut v = Violations::default();
    let ops = gated_backward_operands(c).expect("planned, so resolved");
    let [a, b, dy, da, db] = &ops;
    let (mut dtypes, mut shapes) = gated_inputs_carried(&c.x, &c.a, &c.b);
    dtypes.push(c.dy.dtype);
    shapes.push(c.dy.shape());
    match &c.dx {
        Some(dx) => {
            dtypes.push(dx.dtype);
            shapes.push(half_shape(dx));
        }
        None => {
            for g in [c.da, c.db] {
                if let Grad::Own(m) = g {
                    dtypes.push(m.dtype);
                    shapes.push(m.shape());
                }
            }
        }
    }
    let (dtype, shape) = call_type(&mut v, (c.dtype, c.shape), &dtypes, &shapes);
    for (name, m) in ["a", "b", "dy", "da", "db"].into_iter().zip(&ops) {
        v.desc(name, m, dtype, shape);
    }
    let size = dtype.size_bytes();
    let p = &l.params;
    let vector = match l.kernel {
        KernelId::GatedBwd(d, mode) if d == dtype => mode == VecMode::V16,
        KernelId::GatedBwdEnds(d) if d == dtype => true,
        KernelId::GatedBwdRealigned(d) if d == dtype => {
            // It reads the neighbours of each input vector, which other threads would be
            // overwriting in place.
            if [da, db]
                .iter()
                .any(|g| [a, b, dy].iter().any(|m| g.overlaps(m)))
            {
                v.add("the realigned backward with a gradient in place".into());
            }
            false
        }
        k => {
            v.add(format!("kernel {k:?} for {dtype:?}"));
            false
        }
    };
    let region = |addr, stride| Region::new(addr, size, p.rows, p.cols, stride);
    let body = [
        (access("a", region(p.a, p.a_stride), false, 0), a),
        (access("b", region(p.b, p.b_stride), false, 0), b),
        (access("dy", region(p.dy, p.dy_stride), false, 0), dy),
        (access("da", region(p.da, p.da_stride), true, 0), da),
        (access("db", region(p.db, p.db_stride), true, 0), db),
    ];
    let takes_ends = matches!(l.kernel, KernelId::GatedBwdEnds(_));
    let dims = (p.rows, p.cols, p.walk.per_row, p.ends);
    let accesses = gated_launch_with_ends(&mut v, l, dims, &body, (vector, takes_ends), shape);
    v.aliasing(
        &accesses,
        &[("da", "a"), ("da", "dy"), ("db", "b"), ("db", "dy")],
    );
    v.0
}

#[test]
fn gated_backward_fuzz() {
    fuzz(
        "plan_gated_backward",
        0x6a7e_b000_0000,
        gated_backward_case,
        plan_gated_backward_case,
        check_gated_backward,
    );
}

// ------------------------------------------------------------------------------------------
// FP8 scaling, shared by both FP8 forwards.
// ------------------------------------------------------------------------------------------

/// A scaling scheme, mostly valid, with awkward groups and bounds otherwise.
fn scaling(rng: &mut StdRng) -> Fp8Scaling {
    match rng.random_range(0..3) {
        0 => Fp8Scaling::Static,
        1 => {
            let min_scale = float_arg(rng, DEFAULT_MIN_SCALE);
            let scale_ub = float_arg(rng, 1200.0);
            Fp8Scaling::PerToken {
                min_scale,
                scale_ub: rng.random_bool(0.5).then_some(scale_ub),
            }
        }
        _ => Fp8Scaling::PerGroup {
            group: match rng.random_range(0..10) {
                0..7 => [64, 128][rng.random_range(0..2)],
                _ => [0, 1, 32, 63, 65, 127, 256, usize::MAX][rng.random_range(0..8)],
            },
            layout: [ScaleLayout::RowMajor, ScaleLayout::ColMajor][rng.random_range(0..2)],
            min_scale: float_arg(rng, DEFAULT_MIN_SCALE),
        },
    }
}

/// Row length for an FP8 case: for per-group scales, mostly a multiple of the group.
fn fp8_cols(rng: &mut StdRng, s: &Fp8Scaling) -> usize {
    match *s {
        Fp8Scaling::PerGroup { group, .. } if group > 0 && rng.random_bool(0.7) => {
            group.saturating_mul(rng.random_range(1..=130))
        }
        _ => dim(rng),
    }
}

/// The scale tensor of a valid call (as the docs describe it: the column-major one with its
/// row stride padded to a multiple of 4 half the time, as TMA wants).
fn scales_operand(
    rng: &mut StdRng,
    lay: &Layout,
    slot: u64,
    s: &Fp8Scaling,
    rows: usize,
    cols: usize,
) -> MatDesc {
    let shape = match *s {
        Fp8Scaling::Static => (1, 1),
        Fp8Scaling::PerToken { .. } => (rows, 1),
        Fp8Scaling::PerGroup { group, layout, .. } => {
            let groups = cols.checked_div(group).unwrap_or(1);
            match layout {
                ScaleLayout::RowMajor => (rows, groups),
                ScaleLayout::ColMajor => (groups, rows),
            }
        }
    };
    let mut m = operand(rng, lay, slot, DType::F32, shape.0, shape.1);
    if matches!(
        s,
        Fp8Scaling::PerGroup {
            layout: ScaleLayout::ColMajor,
            ..
        }
    ) && shape.0 > 1
        && rng.random_bool(0.5)
    {
        m.row_stride = rows.checked_next_multiple_of(4).unwrap_or(rows);
        m.len = extent(shape.0, shape.1, m.row_stride).unwrap_or(usize::MAX);
    }
    m
}

/// What an accepted scaling must be: a valid group and bounds (finite and > 0); returns the
/// scale tensor's shape, the scheme and the group (0 when none).
fn accepted_scaling(
    v: &mut Violations,
    s: &Fp8Scaling,
    (rows, cols): (usize, usize),
) -> ((usize, usize), u32, usize) {
    let positive = |x: f32| x.is_finite() && x > 0.0;
    match *s {
        Fp8Scaling::Static => ((1, 1), FP8_STATIC, 0),
        Fp8Scaling::PerToken {
            min_scale,
            scale_ub,
        } => {
            if !positive(min_scale) || scale_ub.is_some_and(|ub| !positive(ub)) {
                v.add(format!("accepted {s:?}"));
            }
            ((rows, 1), FP8_PER_TOKEN, 0)
        }
        Fp8Scaling::PerGroup {
            group,
            layout,
            min_scale,
        } => {
            if !positive(min_scale) || !(group == 64 || group == 128) || !cols.is_multiple_of(group)
            {
                v.add(format!("accepted {s:?} for rows of {cols}"));
                return ((0, 0), FP8_PER_GROUP, 1);
            }
            let shape = match layout {
                ScaleLayout::RowMajor => (rows, cols / group),
                ScaleLayout::ColMajor => (cols / group, rows),
            };
            (shape, FP8_PER_GROUP, group)
        }
    }
}

/// The scales a launch reads (static) or writes (dynamic), from its `scale_row` and
/// `scale_group`: row-major per-group scales are rows of `groups` (a group step of 1),
/// column-major ones rows of `rows` (a row step of 1).
fn scale_access(
    v: &mut Violations,
    s: &Fp8Scaling,
    (addr, scale_row, scale_group): (u64, u64, u64),
    (rows, cols, group): (u64, u64, usize),
) -> Access {
    let (region, write) = match *s {
        Fp8Scaling::Static => (Region::row(addr, 4, 1), false),
        Fp8Scaling::PerToken { .. } => (Region::new(addr, 4, rows, 1, scale_row), true),
        Fp8Scaling::PerGroup { layout, .. } => {
            let groups = cols / group.max(1) as u64;
            let (rows_of, step, unit) = match layout {
                ScaleLayout::RowMajor => ((rows, groups), scale_row, scale_group),
                ScaleLayout::ColMajor => ((groups, rows), scale_group, scale_row),
            };
            if unit != 1 && rows_of.1 > 1 {
                v.add(format!(
                    "scales addressed with steps {scale_row}, {scale_group}"
                ));
            }
            (Region::new(addr, 4, rows_of.0, rows_of.1, step), true)
        }
    };
    access("scales", region, write, 0)
}

/// The scaling arguments a launch carries: its scheme, and the bounds given.
fn scaling_params(v: &mut Violations, s: &Fp8Scaling, scheme: u32, min: f32, ub: f32) {
    let (want_scheme, want_min, want_ub) = match *s {
        Fp8Scaling::Static => (FP8_STATIC, None, None),
        Fp8Scaling::PerToken {
            min_scale,
            scale_ub,
        } => (
            FP8_PER_TOKEN,
            Some(min_scale),
            Some(scale_ub.unwrap_or(f32::INFINITY)),
        ),
        Fp8Scaling::PerGroup { min_scale, .. } => (FP8_PER_GROUP, Some(min_scale), None),
    };
    if scheme != want_scheme
        || want_min.is_some_and(|m| m != min)
        || want_ub.is_some_and(|u| u != ub)
    {
        v.add(format!(
            "launch carries scheme {scheme}, min {min}, ub {ub} for {s:?}"
        ));
    }
}

// ------------------------------------------------------------------------------------------
// Gated FP8 forward.
// ------------------------------------------------------------------------------------------

#[derive(Debug)]
struct GatedFp8Case {
    /// What the call declares: its storage dtype and the shape of its operands (before
    /// damage, which may change either).
    dtype: DType,
    shape: (usize, usize),
    act: Activation,
    x: Option<MatDesc>,
    a: MatDesc,
    b: MatDesc,
    y: MatDesc,
    scaling: Fp8Scaling,
    scales: MatDesc,
    limits: Limits,
}

fn gated_fp8_case(rng: &mut StdRng) -> GatedFp8Case {
    let dtype = storage_dtype(rng);
    let scaling = scaling(rng);
    let (rows, cols) = (rows_dim(rng), fp8_cols(rng, &scaling));
    let lay = layout(rng);
    let mut c = GatedFp8Case {
        dtype,
        shape: (rows, cols),
        act: activation(rng),
        x: rng
            .random_bool(0.4)
            .then(|| operand(rng, &lay, 0, dtype, rows, cols.saturating_mul(2))),
        a: operand(rng, &lay, 1, dtype, rows, cols),
        b: operand(rng, &lay, 2, dtype, rows, cols),
        y: operand(rng, &lay, 3, DType::F8E4M3, rows, cols),
        scaling,
        scales: scales_operand(rng, &lay, 4, &scaling, rows, cols),
        limits: limits(rng),
    };
    let mut ops: Vec<&mut MatDesc> = match &mut c.x {
        Some(x) => vec![x],
        None => vec![&mut c.a, &mut c.b],
    };
    ops.extend([&mut c.y, &mut c.scales]);
    damage(rng, &mut ops);
    c
}

fn plan_gated_fp8_case(c: &GatedFp8Case) -> Result<Launch<GatedFp8Params>, Error> {
    let (a, b) = halves(&c.x, &c.a, &c.b)?;
    plan_gated_forward_fp8(
        c.act,
        &a,
        &b,
        &c.y,
        c.scaling,
        &c.scales,
        &c.limits.grid_limits(),
    )
}

fn check_gated_fp8(c: &GatedFp8Case, l: &Launch<GatedFp8Params>) -> Vec<String> {
    let mut v = Violations::default();
    let (a, b) = halves(&c.x, &c.a, &c.b).expect("planned, so resolved");
    // y is FP8 (checked as such below) but carries the shape.
    let (dtypes, mut shapes) = gated_inputs_carried(&c.x, &c.a, &c.b);
    shapes.push(c.y.shape());
    let (dtype, shape) = call_type(&mut v, (c.dtype, c.shape), &dtypes, &shapes);
    let (scale_shape, scheme, group) = accepted_scaling(&mut v, &c.scaling, shape);
    v.desc("a", &a, dtype, shape);
    v.desc("b", &b, dtype, shape);
    v.desc("y", &c.y, DType::F8E4M3, shape);
    v.desc("scales", &c.scales, DType::F32, scale_shape);
    let (rows, cols) = (shape.0 as u64, shape.1 as u64);
    let p = &l.params;
    if (p.rows, p.cols, p.a, p.b, p.y) != (rows, cols, a.addr, b.addr, c.y.addr) {
        // One flat range: a static scale, every operand dense, the launch one row of the same
        // elements of `a`, `b` and `y` past the head, with the ends the whole call.
        let size = dtype.size_bytes() as u64;
        let dense = [&a, &b, &c.y]
            .iter()
            .all(|m| m.rows <= 1 || m.row_stride == m.cols);
        if scheme != FP8_STATIC || !dense {
            v.add(format!(
                "a flat range for {:?} (every operand dense: {dense})",
                c.scaling
            ));
        }
        let head = p.ends.head as u64;
        if p.rows != 1
            || (p.a.wrapping_sub(a.addr), p.b.wrapping_sub(b.addr)) != (head * size, head * size)
            || p.y.wrapping_sub(c.y.addr) != head
            || head + p.cols + p.ends.tail as u64 != rows * cols
        {
            v.add(format!(
                "{} x {} elements of a, b, y at {:#x}, {:#x}, {:#x} with ends {:?}, not one \
                 flat range of {rows} x {cols}",
                p.rows, p.cols, p.a, p.b, p.y, p.ends
            ));
        }
    } else if p.ends != FlatEnds::default() {
        v.add(format!("ends {:?} on a whole call", p.ends));
    }
    check_gated_fp8_launch(&mut v, c, (&a, &b), 0, l, dtype, (scheme, group));
    v.0
}

/// The checks of an FP8 gated launch (the whole call or the body of its flat range: its shape is
/// its params').
fn check_gated_fp8_launch(
    v: &mut Violations,
    c: &GatedFp8Case,
    (a, b): (&MatDesc, &MatDesc),
    i: usize,
    l: &Launch<GatedFp8Params>,
    dtype: DType,
    (scheme, group): (u32, usize),
) {
    let p = &l.params;
    let per_token = scheme == FP8_PER_TOKEN;
    let mode = match l.kernel {
        KernelId::GatedFp8Row(d, mode)
        | KernelId::GatedFp8RowLong(d, mode)
        | KernelId::GatedFp8RowSplit(d, mode)
            if d == dtype && per_token =>
        {
            mode
        }
        KernelId::GatedFp8RowStream(d, _) | KernelId::GatedFp8Rows(d, _)
            if d == dtype && per_token =>
        {
            VecMode::V16
        }
        KernelId::GatedFp8RowRealigned(d) if d == dtype && per_token && l.kernel.exists() => {
            if p.chunks > GATED_FP8_ROW_CHUNKS as u32 {
                v.add(format!("{} chunks on {:?}", p.chunks, l.kernel));
            }
            VecMode::Scalar
        }
        KernelId::GatedFp8RowsRealigned(d) if d == dtype && per_token && l.kernel.exists() => {
            VecMode::Scalar
        }
        KernelId::GatedFp8FlatRealigned(d) | KernelId::GatedFp8FlatRealignedEndsFirst(d)
            if d == dtype && scheme == FP8_STATIC && l.kernel.exists() =>
        {
            VecMode::Scalar
        }
        KernelId::GatedFp8Flat(d, mode) if d == dtype && scheme == FP8_STATIC => mode,
        KernelId::GatedFp8FlatEnds(d) if d == dtype && scheme == FP8_STATIC => VecMode::V16,
        KernelId::GatedFp8Group(d, mode) if d == dtype && scheme == FP8_PER_GROUP => mode,
        k => {
            v.add(format!("kernel {k:?} for {dtype:?} and {:?}", c.scaling));
            VecMode::Scalar
        }
    };
    let lanes = dtype.lanes_per_16b() as u64;
    let width = if mode == VecMode::V16 { lanes } else { 1 };
    let (rows, cols) = (p.rows, p.cols);
    // The per-group vector path walks pairs of accesses (two per lane, half a group apart).
    let pairs = scheme == FP8_PER_GROUP && mode == VecMode::V16;
    let walk_unit = if pairs { 2 * width } else { width };
    // The realigned kernels walk the aligned words of `y` a row can touch, one per 16-byte
    // vector of the inputs (the row kernel all in one tile of its block).
    let realigned = matches!(
        l.kernel,
        KernelId::GatedFp8RowRealigned(..)
            | KernelId::GatedFp8RowsRealigned(..)
            | KernelId::GatedFp8FlatRealigned(..)
            | KernelId::GatedFp8FlatRealignedEndsFirst(..)
    );
    let per_row = if realigned {
        cols.div_ceil(lanes) + 1
    } else {
        cols / walk_unit
    };
    if per_token && realigned && per_row > GATED_FP8_ROW_MAX_THREADS as u64 * p.chunks as u64 {
        v.add(format!(
            "the realigned row kernel for {per_row} words in {} chunks",
            p.chunks
        ));
    }
    if p.walk.per_row != per_row {
        v.add(format!(
            "launch {i}: {rows} x {cols} in rows of {} steps of {walk_unit}",
            p.walk.per_row
        ));
    }
    scaling_params(v, &c.scaling, p.scheme, p.min_scale, p.scale_ub);
    v.launch(i, l, rows > 0 && cols > 0);
    if per_token {
        // One block of a fixed width per row: the kernel's addressing assumes it.
        let row_threads = GATED_FP8_ROW_MAX_THREADS;
        if rows > 0
            && (l.grid as u64 != rows
                || l.block != row_threads
                || (p.threads_per_row, p.rows_per_block) != (row_threads, 1)
                || !(1..=GATED_FP8_ROW_CHUNKS as u32).contains(&p.chunks))
            && !matches!(
                l.kernel,
                KernelId::GatedFp8RowLong(..)
                    | KernelId::GatedFp8RowSplit(..)
                    | KernelId::GatedFp8RowStream(..)
                    | KernelId::GatedFp8Rows(..)
                    | KernelId::GatedFp8RowsRealigned(..)
            )
        {
            v.add("the per-token geometry is not one block of 512 per row".into());
        }
        // The many-rows kernel: rows of up to GATED_FP8_ROWS_CHUNKS accesses per thread of a
        // 512-thread tile, each on the fewest warps that hold it at the fewest accesses per
        // thread (an entry body per count), several rows per block of at most 512 threads,
        // every row on a block; the other kernels never take such rows of 16-byte accesses.
        let per_thread = p.walk.per_row.div_ceil(row_threads as u64).max(1);
        let many_rows = mode == VecMode::V16 && per_thread <= GATED_FP8_ROWS_CHUNKS as u64;
        if many_rows != matches!(l.kernel, KernelId::GatedFp8Rows(..)) {
            v.add(format!(
                "{:?} for rows of {} 16-byte accesses",
                l.kernel, p.walk.per_row
            ));
        }
        // The same geometry over a row's aligned words for the realigned rows of up to
        // GATED_FP8_ROWS_CHUNKS words per thread of a tile; the realigned row kernel for longer
        // ones.
        let realigned_rows = matches!(l.kernel, KernelId::GatedFp8RowsRealigned(..));
        if (realigned_rows || matches!(l.kernel, KernelId::GatedFp8RowRealigned(..)))
            && realigned_rows != (per_thread <= GATED_FP8_ROWS_CHUNKS as u64)
        {
            v.add(format!(
                "{:?} for {rows} rows of {} words",
                l.kernel, p.walk.per_row
            ));
        }
        let tpr = p.threads_per_row as u64;
        // (Two words per thread on the realigned entry at any length.)
        let (entry_chunks, per_thread) = match l.kernel {
            KernelId::GatedFp8Rows(_, count) => (Some(count), per_thread),
            KernelId::GatedFp8RowsRealigned(..) => (Some(2), GATED_FP8_ROWS_CHUNKS as u64),
            _ => (None, per_thread),
        };
        if let Some(count) = entry_chunks
            && rows > 0
            && (p.chunks as u64 != per_thread
                || count != p.chunks
                || !l.kernel.exists()
                || tpr
                    != p.walk
                        .per_row
                        .div_ceil(per_thread)
                        .next_multiple_of(32)
                        .max(32)
                || p.rows_per_block == 0
                || l.block as u64 != tpr * p.rows_per_block as u64
                || l.block > row_threads
                || l.grid as u64 != rows.div_ceil(p.rows_per_block as u64)
                || l.shared_mem_bytes != GATED_FP8_ROW_SMEM_BYTES
                || p.row_blocks != 1)
        {
            v.add(format!(
                "a many-rows grid of {} x {} for {rows} rows of {} accesses: {} per block on {} \
                 threads, {} chunks",
                l.grid, l.block, p.walk.per_row, p.rows_per_block, tpr, p.chunks
            ));
        }
        // The long-row kernel holds the whole row (it has no second walk).
        if let KernelId::GatedFp8RowLong(..) = l.kernel
            && (l.grid as u64 != rows
                || l.block != row_threads
                || (p.threads_per_row, p.rows_per_block) != (row_threads, 1)
                || !(1..=GATED_FP8_ROW_LONG_CHUNKS as u32).contains(&p.chunks)
                || p.walk.per_row > row_threads as u64 * p.chunks as u64)
        {
            v.add(format!(
                "the long-row kernel for {} accesses per row in {} chunks",
                p.walk.per_row, p.chunks
            ));
        }
        // The streamed kernel: on a device that runs it, persistent blocks (one per row up to
        // the resident blocks) of 512 threads, each holding a whole row, whose two operands'
        // 16-byte accesses fit its shared-memory buffers; the entry of the row's count of
        // accesses per thread (its slots are constants, all but the last full), which exists.
        let resident = c.limits.grid_limits().resident_blocks(l.kernel) as u64;
        if let KernelId::GatedFp8RowStream(_, count) = l.kernel
            && (!c.limits.streamed_rows
                || l.grid as u64 != rows.min(resident)
                || l.block != row_threads
                || l.shared_mem_bytes != GATED_FP8_STREAM_SMEM_BYTES
                || (p.threads_per_row, p.rows_per_block) != (row_threads, 1)
                || !(1..=GATED_FP8_ROW_LONG_CHUNKS as u32).contains(&p.chunks)
                || count != p.chunks
                || !l.kernel.exists()
                || p.walk.per_row > row_threads as u64 * p.chunks as u64
                || p.walk.per_row <= row_threads as u64 * (p.chunks as u64 - 1))
        {
            v.add(format!(
                "a streamed grid of {} for {rows} rows of {} accesses in {} chunks",
                l.grid, p.walk.per_row, p.chunks
            ));
        }
        // The split kernel: one cluster per row, on a device that has clusters, a tile of up
        // to GATED_FP8_ROW_CHUNKS accesses per thread on each block, the tiles covering the
        // row; the other kernels one block per row.
        let cluster = p.cluster_blocks(l.kernel);
        if let KernelId::GatedFp8RowSplit(..) = l.kernel
            && (!c.limits.clusters
                || !(2..=GATED_FP8_ROW_MAX_BLOCKS).contains(&cluster)
                || p.row_blocks != cluster
                || l.grid as u64 != rows * cluster as u64
                || l.block != row_threads
                || (p.threads_per_row, p.rows_per_block) != (row_threads, 1)
                || !(1..=GATED_FP8_ROW_CHUNKS as u32).contains(&p.chunks)
                || p.walk.per_row > (cluster * row_threads * p.chunks) as u64)
        {
            v.add(format!(
                "a split grid of {} in clusters of {cluster} for {} accesses per row in {} chunks",
                l.grid, p.walk.per_row, p.chunks
            ));
        }
        if !matches!(l.kernel, KernelId::GatedFp8RowSplit(..))
            && (cluster != 1 || p.row_blocks != 1)
        {
            v.add(format!("{:?} launched in clusters of {cluster}", l.kernel));
        }
        // The bulk prefetch of a row ahead needs whole 16-byte accesses (the vector path) of
        // a row held in one tile per block (no second walk, which reads the row from L2), in a
        // `u32`.
        if p.prefetch_rows != 0
            && (!matches!(
                l.kernel,
                KernelId::GatedFp8Row(_, VecMode::V16)
                    | KernelId::GatedFp8RowLong(_, VecMode::V16)
                    | KernelId::GatedFp8RowSplit(_, VecMode::V16)
                    | KernelId::GatedFp8Rows(..)
            ) || p.walk.per_row > (p.row_blocks * p.threads_per_row * p.chunks) as u64
                || p.walk.per_row * 16 > u32::MAX as u64)
        {
            v.add(format!(
                "a prefetch {} rows ahead of rows of {} accesses on {:?}",
                p.prefetch_rows, p.walk.per_row, l.kernel
            ));
        }
    } else {
        // The flat walk counts accesses in 32 bits.
        if rows as u128 * p.walk.per_row as u128 >= 1 << 32
            || l.grid as u64 * l.block as u64 >= 1 << 32
        {
            v.add(format!(
                "a flat walk of {rows} x {} accesses",
                p.walk.per_row
            ));
        }
        if p.batch == 0 || p.batch > GATED_FP8_SCALAR_BATCH as u32 {
            v.add(format!("scalar batch {}", p.batch));
        }
        // A group's lanes: half its accesses on the vector path, a whole warp on the scalar
        // path (whose group is one warp step).
        let group_lanes = if pairs {
            group / walk_unit as usize
        } else {
            32
        };
        if scheme == FP8_PER_GROUP
            && (1u64
                .checked_shl(p.group_shift)
                .map(|n| n as u128 * width as u128)
                != Some(group as u128)
                || p.group_lanes as usize != group_lanes
                || !p.group_lanes.is_power_of_two()
                || p.group_lanes > 32)
        {
            v.add(format!(
                "groups of 2^{} accesses over {} lanes for {group} columns",
                p.group_shift, p.group_lanes
            ));
        }
    }
    let size = dtype.size_bytes();
    let region = |addr, size, stride| Region::new(addr, size, rows, cols, stride);
    let accesses = [
        (access("a", region(p.a, size, p.a_stride), false, i), a),
        (access("b", region(p.b, size, p.b_stride), false, i), b),
        (access("y", region(p.y, 1, p.y_stride), true, i), &c.y),
        (
            scale_access(
                v,
                &c.scaling,
                (p.scale, p.scale_row, p.scale_group),
                (rows, cols, group),
            ),
            &c.scales,
        ),
    ];
    let threads = l.grid as u64 * l.block as u64;
    let takes_ends = matches!(l.kernel, KernelId::GatedFp8FlatEnds(_));
    let ends = flat_ends(v, i, (p.ends, threads, takes_ends), &accesses[..3]);
    for (acc, buf) in accesses.iter().chain(&ends) {
        v.inside(acc, buf);
    }
    if mode == VecMode::V16 {
        v.vectors(&accesses[0].0, false);
        v.vectors(&accesses[1].0, false);
        v.aligned_to(&accesses[2].0, false, lanes as u128);
    }
    let accesses: Vec<Access> = accesses.iter().chain(&ends).map(|(a, _)| *a).collect();
    v.aliasing(&accesses, &[]);
}

#[test]
fn gated_forward_fp8_fuzz() {
    fuzz(
        "plan_gated_forward_fp8",
        0x6a7e_f800_0000,
        gated_fp8_case,
        plan_gated_fp8_case,
        check_gated_fp8,
    );
}

// ------------------------------------------------------------------------------------------
// RMSNorm forward.
// ------------------------------------------------------------------------------------------

/// eps, Gemma and the numerics mode at random.
fn norm_options(rng: &mut StdRng) -> RmsNormOptions {
    let numerics = [NormNumerics::F32, NormNumerics::HfLlama][rng.random_range(0..2)];
    let eps = [1e-6, 1e-5][rng.random_range(0..2)];
    RmsNormOptions::new(float_arg(rng, eps))
        .with_gemma(rng.random_bool(0.3))
        .with_numerics(numerics)
}

/// The forward's placements (`Placement`): which inputs `y` and `h` are written over.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Over {
    Own,
    X,
    Residual,
}

#[derive(Debug)]
struct NormFwdCase {
    /// What the call declares: its storage dtype and the shape of its operands (before
    /// damage, which may change either).
    dtype: DType,
    shape: (usize, usize),
    x: MatDesc,
    residual: Option<MatDesc>,
    weight: MatDesc,
    y: MatDesc,
    y_over: Over,
    h: Option<MatDesc>,
    h_over: Over,
    rstd: Option<MatDesc>,
    opts: RmsNormOptions,
    limits: Limits,
}

fn norm_forward_case(rng: &mut StdRng) -> NormFwdCase {
    let dtype = storage_dtype(rng);
    let w_dtype = weight_dtype(rng, dtype);
    let (rows, hidden) = (rows_dim(rng), dim(rng));
    let lay = layout(rng);
    let add = rng.random_bool(0.7);
    // The placements of `Placement`: y over x or not; h (with a residual) over x, over the
    // residual or its own.
    let y_over = [Over::Own, Over::X][rng.random_range(0..2)];
    let h_over = [Over::Own, Over::X, Over::Residual][rng.random_range(0..3)];
    let mut c = NormFwdCase {
        dtype,
        shape: (rows, hidden),
        x: operand(rng, &lay, 0, dtype, rows, hidden),
        residual: add.then(|| operand(rng, &lay, 1, dtype, rows, hidden)),
        weight: operand(rng, &lay, 2, w_dtype, 1, hidden),
        y: operand(rng, &lay, 3, dtype, rows, hidden),
        y_over,
        h: add.then(|| operand(rng, &lay, 4, dtype, rows, hidden)),
        h_over,
        rstd: rng
            .random_bool(0.7)
            .then(|| operand(rng, &lay, 5, DType::F32, rows, 1)),
        opts: norm_options(rng),
        limits: limits(rng),
    };
    // Now and then a residual without an h or the other way round.
    if rng.random_bool(0.05) {
        c.h = None;
    }
    if rng.random_bool(0.05) && c.h.is_none() {
        c.h = Some(operand(rng, &lay, 4, dtype, rows, hidden));
    }
    let mut ops: Vec<&mut MatDesc> = vec![&mut c.x, &mut c.weight, &mut c.y];
    ops.extend(c.residual.as_mut());
    ops.extend(c.h.as_mut());
    ops.extend(c.rstd.as_mut());
    damage(rng, &mut ops);
    c
}

/// The descriptions a placement gives the plan: an overwritten input is described once, as
/// the output it becomes.
fn norm_forward_descs(c: &NormFwdCase) -> RmsNormFwdDescs {
    let over = |own: MatDesc, o: Over| match (o, c.residual) {
        (Over::X, _) => c.x,
        (Over::Residual, Some(r)) => r,
        _ => own,
    };
    RmsNormFwdDescs {
        x: c.x,
        residual: c.residual,
        weight: c.weight,
        y: over(c.y, c.y_over),
        h: c.h.map(|h| over(h, c.h_over)),
        rstd: c.rstd,
    }
}

fn plan_norm_forward_case(c: &NormFwdCase) -> Result<Launch<RmsNormFwdParams>, Error> {
    plan_rmsnorm_forward(&norm_forward_descs(c), &c.opts, &c.limits.grid_limits())
}

/// The storage dtype and shape of an accepted norm call (see [`call_type`]): the operands
/// given in the storage dtype carry both, an FP8 `y` (checked as FP8 on its own) the shape.
fn norm_call_type(
    v: &mut Violations,
    declared: (DType, (usize, usize)),
    storage: &[Option<&MatDesc>],
    fp8_y: Option<&MatDesc>,
) -> (DType, (usize, usize)) {
    let given = || storage.iter().flatten().copied();
    let dtypes: Vec<DType> = given().map(|m| m.dtype).collect();
    let shapes: Vec<(usize, usize)> = given().chain(fp8_y).map(|m| m.shape()).collect();
    call_type(v, declared, &dtypes, &shapes)
}

/// What an accepted forward's operands must be, for a call of `dtype` and `[rows, hidden]`.
#[allow(clippy::too_many_arguments)]
fn check_norm_operands(
    v: &mut Violations,
    (dtype, (rows, hidden)): (DType, (usize, usize)),
    x: &MatDesc,
    residual: Option<&MatDesc>,
    weight: &MatDesc,
    h: Option<&MatDesc>,
    rstd: Option<&MatDesc>,
    opts: &RmsNormOptions,
) {
    if !(opts.eps.is_finite() && opts.eps > 0.0) {
        v.add(format!("accepted eps {}", opts.eps));
    }
    if residual.is_some() != h.is_some() {
        v.add("accepted a residual without h, or h without a residual".into());
    }
    v.desc("x", x, dtype, (rows, hidden));
    for (name, m) in [("residual", residual), ("h", h)] {
        if let Some(m) = m {
            v.desc(name, m, dtype, (rows, hidden));
        }
    }
    let w_dtype = if weight.dtype == DType::F32 {
        DType::F32
    } else {
        dtype
    };
    v.desc("weight", weight, w_dtype, (1, hidden));
    if let Some(rstd) = rstd {
        v.desc("rstd", rstd, DType::F32, (rows, 1));
    }
}

/// The flags of the weight, shared by the forward and the backward: Gemma's `1 + w` as
/// requested, an f32 weight under a 16-bit storage dtype.
fn weight_flags(opts: &RmsNormOptions, w_dtype: DType, dtype: DType) -> u32 {
    let mut flags = 0;
    if opts.gemma {
        flags |= RMSNORM_GEMMA;
    }
    if w_dtype == DType::F32 && dtype != DType::F32 {
        flags |= RMSNORM_W_F32;
    }
    flags
}

/// The parameters of the forward both norm forwards share (for a call of `dtype` and
/// `[rows, hidden]`): shape, eps, flags, and each operand's access (an absent optional operand
/// is address 0).
#[allow(clippy::too_many_arguments)]
fn norm_accesses<'m>(
    v: &mut Violations,
    (dtype, (rows, hidden)): (DType, (usize, usize)),
    p: &RmsNormFwdParams,
    x: &'m MatDesc,
    residual: Option<&'m MatDesc>,
    weight: &'m MatDesc,
    h: Option<&'m MatDesc>,
    rstd: Option<&'m MatDesc>,
    opts: &RmsNormOptions,
) -> Vec<(Access, &'m MatDesc)> {
    if (p.rows, p.hidden) != (rows as u64, hidden as u64) || p.eps.to_bits() != opts.eps.to_bits() {
        v.add(format!(
            "launch of {} x {}, eps {}",
            p.rows, p.hidden, p.eps
        ));
    }
    // The numerics flag exactly when the case asked for HF numerics, in every storage dtype:
    // without it a 16-bit call silently runs the f32 numerics, with it the other way round.
    let mut flags = weight_flags(opts, weight.dtype, dtype);
    if opts.numerics == NormNumerics::HfLlama {
        flags |= RMSNORM_HF;
    }
    if p.flags != flags {
        v.add(format!(
            "flags {:#x}, expected {flags:#x} for {opts:?}",
            p.flags
        ));
    }
    let size = dtype.size_bytes();
    let (rows, hidden) = (p.rows, p.hidden);
    let region = |addr, stride| Region::new(addr, size, rows, hidden, stride);
    let mut out = vec![
        (access("x", region(p.x, p.x_stride), false, 0), x),
        (
            access(
                "weight",
                Region::row(p.w, weight.dtype.size_bytes(), hidden),
                false,
                0,
            ),
            weight,
        ),
    ];
    let optional = [
        ("residual", residual, p.residual, p.residual_stride, false),
        ("h", h, p.h, p.h_stride, true),
    ];
    for (name, m, addr, stride, write) in optional {
        match m {
            Some(m) => out.push((access(name, region(addr, stride), write, 0), m)),
            None if addr != 0 => v.add(format!("{name} at {addr:#x} but none given")),
            None => {}
        }
    }
    match rstd {
        Some(m) => {
            let r = Region::new(p.rstd, 4, rows, 1, p.rstd_stride);
            out.push((access("rstd", r, true, 0), m));
        }
        None if p.rstd != 0 => v.add("rstd written but none given".into()),
        None => {}
    }
    out
}

/// A streamed norm forward (`RmsNormFwdStream`, `RmsNormFp8Stream`): on a device that runs it,
/// for rows of 32 elements per thread on the vector path past the resident blocks, one
/// persistent block per resident slot of the row's geometry, with the shared memory whose
/// regions hold a row of `x`, of `residual` and the weight.
fn check_streamed_norm(
    v: &mut Violations,
    limits: &Limits,
    l_shape: (KernelId, u32, u32, u32),
    (rows, hidden, w_bytes): (usize, usize, usize),
    p: &RmsNormFwdParams,
    dtype: DType,
) {
    let (kernel, grid, block, smem) = l_shape;
    let resident = limits.grid_limits().resident_blocks(kernel) as u64;
    let (variant, geometry) = rmsnorm_fwd_geometry(dtype, hidden as u64);
    let region = (RMSNORM_STREAM_SMEM_BYTES as u64 - 1024) / 3;
    let widest = hidden as u64 * dtype.size_bytes().max(w_bytes) as u64;
    if !limits.streamed_rows
        || variant != NormFwdVariant::E32
        || rows as u64 <= resident
        || grid as u64 != resident
        || block != geometry.block_threads()
        || (p.threads_per_row, p.rows_per_block) != (geometry.threads_per_row, 1)
        || smem != RMSNORM_STREAM_SMEM_BYTES
        || widest > region
    {
        v.add(format!(
            "the streamed kernel, {grid} blocks of {block}, for {rows} rows of {hidden}"
        ));
    }
}

fn check_norm_forward(c: &NormFwdCase, l: &Launch<RmsNormFwdParams>) -> Vec<String> {
    let mut v = Violations::default();
    let t = norm_forward_descs(c);
    let (x, y) = (&t.x, &t.y);
    let (residual, h, rstd) = (t.residual.as_ref(), t.h.as_ref(), t.rstd.as_ref());
    let storage = [Some(x), residual, h, Some(y)];
    let call = norm_call_type(&mut v, (c.dtype, c.shape), &storage, None);
    let (dtype, (rows, hidden)) = call;
    check_norm_operands(&mut v, call, x, residual, &t.weight, h, rstd, &c.opts);
    v.desc("y", y, dtype, (rows, hidden));
    let p = &l.params;
    let mut accesses = norm_accesses(&mut v, call, p, x, residual, &t.weight, h, rstd, &c.opts);
    let yr = Region::new(p.y, dtype.size_bytes(), p.rows, p.hidden, p.y_stride);
    accesses.push((access("y", yr, true, 0), y));
    let work = rows > 0 && hidden > 0;
    v.launch(0, l, work);
    let path = match l.kernel.rmsnorm_forward_form() {
        Some((d, path, _)) if d == dtype => path,
        _ => {
            v.add(format!("kernel {:?} for {dtype:?}", l.kernel));
            NormPath::Scalar
        }
    };
    if let KernelId::RmsNormFwdStream(_) = l.kernel {
        let shape = (l.kernel, l.grid, l.block, l.shared_mem_bytes);
        let sizes = (rows, hidden, t.weight.dtype.size_bytes());
        check_streamed_norm(&mut v, &c.limits, shape, sizes, p, dtype);
    } else if let KernelId::RmsNormFwdSplit(..) | KernelId::RmsNormFwdSplitNarrow(..) = l.kernel {
        // One cluster per row, on a device that has clusters (of up to 16 blocks where it
        // runs them); the narrow entries only where the limits ask for them.
        let narrow = matches!(l.kernel, KernelId::RmsNormFwdSplitNarrow(..));
        if narrow && !c.limits.narrow_split {
            v.add(format!("{:?} without the narrow split", l.kernel));
        }
        let cluster = p.cluster_blocks(l.kernel);
        let most = if c.limits.wide_clusters {
            RMSNORM_SPLIT_MAX_WIDE_CLUSTER
        } else {
            RMSNORM_SPLIT_MAX_CLUSTER
        };
        if !c.limits.clusters
            || cluster as u64 > most
            || l.grid as u64 != rows as u64 * cluster as u64
        {
            v.add(format!(
                "a split grid of {} in clusters of {cluster}",
                l.grid
            ));
        }
    } else if work
        && (l.block != p.threads_per_row * p.rows_per_block
            || l.grid as u64 != (rows as u64).div_ceil(p.rows_per_block as u64))
    {
        v.add(format!(
            "{} blocks of {} for {rows} rows, {} per block",
            l.grid, l.block, p.rows_per_block
        ));
    }
    for (a, buf) in &accesses {
        v.inside(a, buf);
        match path {
            NormPath::V16 if a.name != "rstd" => v.vectors(a, a.name == "weight"),
            // The realigned kernels stage the weight in aligned vectors.
            NormPath::Realigned if a.name == "weight" => v.vectors(a, true),
            _ => {}
        }
    }
    let accesses: Vec<Access> = accesses.into_iter().map(|(a, _)| a).collect();
    v.aliasing(&accesses, &[("h", "x"), ("h", "residual"), ("y", "x")]);
    v.0
}

#[test]
fn rmsnorm_forward_fuzz() {
    fuzz(
        "plan_rmsnorm_forward",
        0x4a7e_f000_0000,
        norm_forward_case,
        plan_norm_forward_case,
        check_norm_forward,
    );
}

// ------------------------------------------------------------------------------------------
// RMSNorm forward with FP8 output.
// ------------------------------------------------------------------------------------------

#[derive(Debug)]
struct NormFp8Case {
    /// What the call declares: its storage dtype and the shape of its operands (before
    /// damage, which may change either).
    dtype: DType,
    shape: (usize, usize),
    x: MatDesc,
    residual: Option<MatDesc>,
    weight: MatDesc,
    h: Option<MatDesc>,
    h_over: Over,
    rstd: Option<MatDesc>,
    y: MatDesc,
    scaling: Fp8Scaling,
    scales: MatDesc,
    opts: RmsNormOptions,
    limits: Limits,
}

fn norm_fp8_case(rng: &mut StdRng) -> NormFp8Case {
    let dtype = storage_dtype(rng);
    let w_dtype = weight_dtype(rng, dtype);
    let scaling = scaling(rng);
    let (rows, hidden) = (rows_dim(rng), fp8_cols(rng, &scaling));
    let lay = layout(rng);
    let add = rng.random_bool(0.7);
    let mut c = NormFp8Case {
        dtype,
        shape: (rows, hidden),
        x: operand(rng, &lay, 0, dtype, rows, hidden),
        residual: add.then(|| operand(rng, &lay, 1, dtype, rows, hidden)),
        weight: operand(rng, &lay, 2, w_dtype, 1, hidden),
        h: add.then(|| operand(rng, &lay, 3, dtype, rows, hidden)),
        h_over: [Over::Own, Over::X, Over::Residual][rng.random_range(0..3)],
        rstd: rng
            .random_bool(0.7)
            .then(|| operand(rng, &lay, 4, DType::F32, rows, 1)),
        y: operand(rng, &lay, 5, DType::F8E4M3, rows, hidden),
        scaling,
        scales: scales_operand(rng, &lay, 6, &scaling, rows, hidden),
        opts: norm_options(rng),
        limits: limits(rng),
    };
    let mut ops: Vec<&mut MatDesc> = vec![&mut c.x, &mut c.weight, &mut c.y, &mut c.scales];
    ops.extend(c.residual.as_mut());
    ops.extend(c.h.as_mut());
    ops.extend(c.rstd.as_mut());
    damage(rng, &mut ops);
    c
}

fn norm_fp8_descs(c: &NormFp8Case) -> RmsNormFp8Descs {
    let h = match (c.h_over, c.residual) {
        (Over::X, _) => c.h.map(|_| c.x),
        (Over::Residual, Some(r)) => c.h.map(|_| r),
        _ => c.h,
    };
    RmsNormFp8Descs {
        x: c.x,
        residual: c.residual,
        weight: c.weight,
        h,
        rstd: c.rstd,
        y: c.y,
        scales: c.scales,
    }
}

fn plan_norm_fp8_case(c: &NormFp8Case) -> Result<Launch<RmsNormFp8Params>, Error> {
    plan_rmsnorm_forward_fp8(
        &norm_fp8_descs(c),
        &c.opts,
        c.scaling,
        &c.limits.grid_limits(),
    )
}

fn check_norm_fp8(c: &NormFp8Case, l: &Launch<RmsNormFp8Params>) -> Vec<String> {
    let mut v = Violations::default();
    let t = norm_fp8_descs(c);
    let x = &t.x;
    let (residual, h, rstd) = (t.residual.as_ref(), t.h.as_ref(), t.rstd.as_ref());
    let storage = [Some(x), residual, h];
    let call = norm_call_type(&mut v, (c.dtype, c.shape), &storage, Some(&t.y));
    let (dtype, (rows, hidden)) = call;
    check_norm_operands(&mut v, call, x, residual, &t.weight, h, rstd, &c.opts);
    let (scale_shape, scheme, group) = accepted_scaling(&mut v, &c.scaling, (rows, hidden));
    v.desc("y", &t.y, DType::F8E4M3, (rows, hidden));
    v.desc("scales", &t.scales, DType::F32, scale_shape);
    let p = &l.params;
    let n = &p.norm;
    let mut accesses = norm_accesses(&mut v, call, n, x, residual, &t.weight, h, rstd, &c.opts);
    let work = rows > 0 && hidden > 0;
    v.launch(0, l, work);
    let mut realigned = false;
    let vector = match l.kernel {
        KernelId::RmsNormFp8(d, mode, variant, s) if d == dtype && s == p.scheme => {
            // The storage-dtype forward's geometry; looped rows with the looped ring.
            let (want, _) = rmsnorm_fwd_geometry(dtype, hidden as u64);
            let smem = if want == NormFwdVariant::Loop {
                RMSNORM_LOOP_SMEM_BYTES
            } else {
                RMSNORM_SMEM_BYTES
            };
            if work && (variant != want || l.shared_mem_bytes != smem) {
                v.add(format!(
                    "{:?} with {} bytes of shared memory for rows of {hidden}",
                    l.kernel, l.shared_mem_bytes
                ));
            }
            mode == VecMode::V16
        }
        KernelId::RmsNormFp8Realigned(d, variant, s) if d == dtype && s == p.scheme => {
            // The realigned staging of the storage-dtype forward, for the same geometry.
            let (want, geometry) = rmsnorm_fwd_geometry(dtype, hidden as u64);
            let w_f32 = t.weight.dtype == DType::F32;
            if variant != want
                || l.shared_mem_bytes != rmsnorm_realigned_smem_bytes(&geometry, dtype, w_f32)
            {
                v.add(format!(
                    "{:?} with {} bytes of shared memory for rows of {hidden}",
                    l.kernel, l.shared_mem_bytes
                ));
            }
            realigned = true;
            false
        }
        KernelId::RmsNormFp8Stream(d, s) if d == dtype && s == p.scheme => {
            let shape = (l.kernel, l.grid, l.block, l.shared_mem_bytes);
            let sizes = (rows, hidden, t.weight.dtype.size_bytes());
            check_streamed_norm(&mut v, &c.limits, shape, sizes, n, dtype);
            true
        }
        KernelId::RmsNormFp8LoopAhead(d, mode, s) if d == dtype && s == p.scheme => {
            // Looped rows with the looped ring, at most a row per two multiprocessors.
            let (want, _) = rmsnorm_fwd_geometry(dtype, hidden as u64);
            if want != NormFwdVariant::Loop
                || !c.limits.loop_ahead
                || rows * 2 > c.limits.sm_count as usize
                || l.shared_mem_bytes != RMSNORM_LOOP_SMEM_BYTES
            {
                v.add(format!(
                    "{:?} with {} bytes of shared memory for {rows} rows of {hidden}",
                    l.kernel, l.shared_mem_bytes
                ));
            }
            mode == VecMode::V16
        }
        KernelId::RmsNormFp8Split(d, path, s) if d == dtype && s == p.scheme => {
            // Looped rows, one cluster of a block per tile (portable sizes, or up to 16 where
            // the limits have wide clusters) per row, on a device with clusters; on the vector
            // and scalar paths at most a row per two multiprocessors and, for clusters of fewer
            // than 8 blocks, three blocks per two; on the realigned path (16-bit rows, its
            // staging after the split's slots) at any number of rows.
            let (want, _) = rmsnorm_fwd_geometry(dtype, hidden as u64);
            let cluster = p.cluster_blocks(l.kernel);
            let sms = c.limits.sm_count as usize;
            let too_many = rows * 2 > sms
                || (cluster as u64) < RMSNORM_SPLIT_MAX_CLUSTER
                    && rows * cluster as usize * 2 > sms * 3;
            let realigned_path = path == NormPath::Realigned;
            let smem = rmsnorm_split_smem_bytes(dtype, path, NormFwdVariant::E16);
            let most_blocks = if c.limits.wide_clusters {
                RMSNORM_SPLIT_MAX_WIDE_CLUSTER
            } else {
                RMSNORM_SPLIT_MAX_CLUSTER
            };
            if want != NormFwdVariant::Loop
                || !c.limits.clusters
                || (!realigned_path && too_many)
                || (realigned_path && dtype.size_bytes() != 2)
                || cluster as u64 > most_blocks
                || l.grid as u64 != rows as u64 * cluster as u64
                || l.block != n.threads_per_row
                || Some(l.shared_mem_bytes) != smem
            {
                v.add(format!(
                    "{:?}: a grid of {} in clusters of {cluster}, {} bytes of shared memory, \
                     for {rows} rows of {hidden}",
                    l.kernel, l.grid, l.shared_mem_bytes
                ));
            }
            realigned = realigned_path;
            path == NormPath::V16
        }
        k => {
            v.add(format!("kernel {k:?} for {dtype:?}"));
            false
        }
    };
    if work
        && !matches!(
            l.kernel,
            KernelId::RmsNormFp8Stream(..) | KernelId::RmsNormFp8Split(..)
        )
        && (l.block != n.threads_per_row * n.rows_per_block
            || l.grid as u64 != (rows as u64).div_ceil(n.rows_per_block as u64))
    {
        v.add(format!("{} blocks of {} for {rows} rows", l.grid, l.block));
    }
    scaling_params(&mut v, &c.scaling, p.scheme, p.min_scale, p.scale_ub);
    let lanes = dtype.lanes_per_16b();
    if scheme == FP8_PER_GROUP
        && (p.group_lanes as usize * lanes != group
            || !p.group_lanes.is_power_of_two()
            || p.group_lanes > 32
            || 1u32.checked_shl(p.group_shift) != Some(p.group_lanes))
    {
        v.add(format!(
            "groups of {} chunks for {group} columns",
            p.group_lanes
        ));
    }
    let yr = Region::new(n.y, 1, n.rows, n.hidden, n.y_stride);
    accesses.push((access("y", yr, true, 0), &t.y));
    let scales = scale_access(
        &mut v,
        &c.scaling,
        (p.scale, p.scale_row, p.scale_group),
        (n.rows, n.hidden, group),
    );
    accesses.push((scales, &t.scales));
    for (a, buf) in &accesses {
        v.inside(a, buf);
        if vector {
            match a.name {
                "y" => v.aligned_to(a, false, lanes as u128),
                "rstd" | "scales" => {}
                name => v.vectors(a, name == "weight"),
            }
        } else if realigned && a.name == "weight" {
            // The realigned kernels stage the weight in aligned vectors.
            v.vectors(a, true);
        }
    }
    let accesses: Vec<Access> = accesses.into_iter().map(|(a, _)| a).collect();
    v.aliasing(&accesses, &[("h", "x"), ("h", "residual")]);
    v.0
}

#[test]
fn rmsnorm_forward_fp8_fuzz() {
    fuzz(
        "plan_rmsnorm_forward_fp8",
        0x4a7e_f800_0000,
        norm_fp8_case,
        plan_norm_fp8_case,
        check_norm_fp8,
    );
}

// ------------------------------------------------------------------------------------------
// RMSNorm backward.
// ------------------------------------------------------------------------------------------

/// The backward's placements (`GradPlacement`): `dx` its own, over `dy`, or over `dres`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum DxOver {
    Own,
    Dy,
    Dres,
}

#[derive(Debug)]
struct NormBwdCase {
    /// What the call declares: its storage dtype and the shape of its operands (before
    /// damage, which may change either).
    dtype: DType,
    shape: (usize, usize),
    dy: MatDesc,
    h: MatDesc,
    weight: MatDesc,
    rstd: MatDesc,
    dres: Option<MatDesc>,
    dx: MatDesc,
    dx_over: DxOver,
    dw: MatDesc,
    workspace: MatDesc,
    opts: RmsNormOptions,
}

fn norm_backward_case(rng: &mut StdRng) -> NormBwdCase {
    let dtype = storage_dtype(rng);
    let w_dtype = weight_dtype(rng, dtype);
    let (rows, hidden) = (rows_dim(rng), dim(rng));
    let lay = layout(rng);
    // The workspace the docs ask for (`usize::MAX` for shapes no buffer holds), or one too
    // small.
    let need = rmsnorm_backward_workspace_len(dtype, rows, hidden);
    let ws_len = match rng.random_range(0..10) {
        0 => need.saturating_sub(1),
        1 => 0,
        2 => need.saturating_add(rng.random_range(1..1000)),
        _ => need,
    };
    let workspace_addr = window(8) + lay.offset / 4 * 4;
    let mut c = NormBwdCase {
        dtype,
        shape: (rows, hidden),
        dy: operand(rng, &lay, 0, dtype, rows, hidden),
        h: operand(rng, &lay, 1, dtype, rows, hidden),
        weight: operand(rng, &lay, 2, w_dtype, 1, hidden),
        rstd: operand(rng, &lay, 3, DType::F32, rows, 1),
        dres: rng
            .random_bool(0.5)
            .then(|| operand(rng, &lay, 4, dtype, rows, hidden)),
        dx: operand(rng, &lay, 5, dtype, rows, hidden),
        dx_over: [DxOver::Own, DxOver::Dy, DxOver::Dres][rng.random_range(0..3)],
        dw: operand(rng, &lay, 6, w_dtype, 1, hidden),
        workspace: MatDesc::contiguous(workspace_addr, ws_len, DType::F32, 1, ws_len),
        opts: norm_options(rng),
    };
    let mut ops: Vec<&mut MatDesc> = vec![
        &mut c.dy,
        &mut c.h,
        &mut c.weight,
        &mut c.rstd,
        &mut c.dx,
        &mut c.dw,
        &mut c.workspace,
    ];
    ops.extend(c.dres.as_mut());
    damage(rng, &mut ops);
    c
}

fn norm_backward_descs(c: &NormBwdCase) -> RmsNormBwdDescs {
    let dx = match (c.dx_over, c.dres) {
        (DxOver::Dy, _) => c.dy,
        (DxOver::Dres, Some(dres)) => dres,
        _ => c.dx,
    };
    RmsNormBwdDescs {
        dy: c.dy,
        h: c.h,
        weight: c.weight,
        rstd: c.rstd,
        dres: c.dres,
        dx,
        dw: c.dw,
        workspace: c.workspace,
    }
}

fn plan_norm_backward_case(c: &NormBwdCase) -> Result<RmsNormBwdPlan, Error> {
    plan_rmsnorm_backward(&norm_backward_descs(c), &c.opts)
}

/// The f32 backward's one-row blocks that a narrow entry fits more of per multiprocessor than
/// the 128-register one, the row groups per block from which the rows kernel runs it and the
/// row groups from which the one-launch kernel does: three of 192 threads, two of 288 or 320
/// (96 registers, from four, from 128), two of 352 or 384 (80, from eight, from 200).
/// 160 threads: four by registers, but three by shared memory with `dres` staged, as at 128;
/// 224 and 256: three at 80 registers, but two by shared memory.
fn narrow_backward_blocks_per_sm(block: u32) -> Option<(BwdNarrow, u64, u64, u64)> {
    match block {
        192 => Some((BwdNarrow::R96, 3, 4, 128)),
        288 | 320 => Some((BwdNarrow::R96, 2, 4, 128)),
        352 | 384 => Some((BwdNarrow::R80, 2, 8, 200)),
        _ => None,
    }
}

fn check_norm_backward(c: &NormBwdCase, plan: &RmsNormBwdPlan) -> Vec<String> {
    let mut v = Violations::default();
    let t = norm_backward_descs(c);
    let storage = [Some(&t.dy), Some(&t.h), Some(&t.dx), t.dres.as_ref()];
    let (dtype, (rows, hidden)) = norm_call_type(&mut v, (c.dtype, c.shape), &storage, None);
    for (name, m) in [("dy", &t.dy), ("h", &t.h), ("dx", &t.dx)] {
        v.desc(name, m, dtype, (rows, hidden));
    }
    if let Some(dres) = &t.dres {
        v.desc("dres", dres, dtype, (rows, hidden));
    }
    let w_dtype = if t.weight.dtype == DType::F32 {
        DType::F32
    } else {
        dtype
    };
    v.desc("weight", &t.weight, w_dtype, (1, hidden));
    v.desc("dw", &t.dw, w_dtype, (1, hidden));
    v.desc("rstd", &t.rstd, DType::F32, (rows, 1));
    if t.workspace.dtype != DType::F32 {
        v.add(format!("a workspace of {:?}", t.workspace.dtype));
    }

    // The rows launch: dx, and the dw partials (one row of `hidden` per slot, and for looped
    // rows one coefficient per row after them) into the workspace.
    let (rl, dl) = (&plan.rows, &plan.dw);
    let p = &rl.params;
    let work = rows > 0 && hidden > 0;
    v.launch(0, rl, work);
    let (mode, looped, fused) = match rl.kernel {
        KernelId::RmsNormBwd(d, mode, variant) if d == dtype => {
            (mode, variant == NormBwdVariant::Loop, false)
        }
        // Rows that the cluster split takes, looped over its tiles (planned without clusters).
        KernelId::RmsNormBwdLoopTiles(d, mode) if d == dtype => (mode, true, false),
        // One launch: dx, and dw summed by blocks after the rows' (no partials).
        KernelId::RmsNormBwdFused(d, mode) if d == dtype => (mode, false, true),
        // The narrow entries: f32 rows (checked with the grid below).
        KernelId::RmsNormBwdNarrow(d, mode, _) if d == dtype => (mode, false, false),
        KernelId::RmsNormBwdFusedNarrow(d, _) if d == dtype => (VecMode::V16, false, true),
        k => {
            v.add(format!("kernel {k:?} for {dtype:?}"));
            (VecMode::Scalar, false, false)
        }
    };
    if fused != dl.is_none() {
        v.add(format!(
            "kernel {:?} with a dw launch {}",
            rl.kernel,
            dl.is_some()
        ));
    }
    // The rows kernel's blocks: with the fused kernel, the grid less its dw blocks, one row
    // group per block.
    let dw_blocks = if fused {
        let groups = rmsnorm_bwd_fused_dw_groups(rl.block) as u64;
        rmsnorm_bwd_fused_dw_blocks(
            hidden as u64,
            rl.block,
            rows as u64,
            p.dw_slots as u64,
            groups,
        )
    } else {
        0
    };
    let row_blocks = (rl.grid as u64).saturating_sub(dw_blocks);
    let groups = (rows as u64).div_ceil(p.rows_per_block.max(1) as u64);
    if fused && (row_blocks != groups || rows == 0) {
        v.add(format!(
            "fused with {row_blocks} row blocks for {groups} row groups"
        ));
    }
    // Its dw blocks read dy in no order with the rows' dx stores.
    if fused && t.dx.overlaps(&t.dy) {
        v.add("fused with dx over dy".into());
    }
    if (p.rows, p.hidden) != (rows as u64, hidden as u64) {
        v.add(format!("a launch of {} x {}", p.rows, p.hidden));
    }
    // The backward is the f32 derivative whatever the forward's numerics: weight flags only.
    let flags = weight_flags(&c.opts, t.weight.dtype, dtype);
    if p.flags != flags {
        v.add(format!("flags {:#x}, expected {flags:#x}", p.flags));
    }
    // Two launches cap the grid (the partials are `slots x hidden`): a block per row group up
    // to the largest power of two of blocks within the thread budget; from four times the
    // occupancy grid on (eight times for the 80-register narrow entry's blocks), that grid, a
    // power of two of multiprocessors' worth of blocks (for one-row blocks of 16 per thread as
    // many as the vector entry's registers allow: 1024 threads of 16-bit rows, 512 of f32 but
    // for the narrow entries' blocks; else one). The fused kernel has none.
    let block = rl.block.max(1) as u64;
    let per_sm = match (looped, p.rows_per_block, dtype.size_bytes()) {
        (false, 1, 2) => 1024 / block,
        (false, 1, _) => narrow_backward_blocks_per_sm(block as u32).map_or(512 / block, |n| n.1),
        _ => 1,
    }
    .max(1);
    let power_of_two_within = |size: u64| {
        let mut n = 1;
        while 2 * n * size <= RMSNORM_BWD_GRID_THREADS {
            n *= 2;
        }
        n
    };
    let occupancy = power_of_two_within(block * per_sm) * per_sm;
    let per_block = match (looped, p.rows_per_block, dtype) {
        (false, 1, DType::F32) => narrow_backward_blocks_per_sm(rl.block).map_or(4, |n| n.2),
        _ => 4,
    };
    let on_occupancy_grid = groups >= per_block * occupancy;
    // Rows longer than 8192 of 2-8 tiles whose last tile holds a quarter of one at least, and
    // of 9-16 tiles, take the looped kernel of the cluster split's tiles, a block per walker:
    // up to 8 tiles 256 / tiles walkers at most (beyond, as many as the other looped rows).
    let tiles = (hidden as u64).div_ceil(8192);
    let split_shape = looped
        && (2..=16).contains(&tiles)
        && (tiles > 8 || hidden as u64 - (tiles - 1) * 8192 >= 2048);
    let tiles_kernel = matches!(rl.kernel, KernelId::RmsNormBwdLoopTiles(..));
    if split_shape != tiles_kernel {
        v.add(format!("{:?} for rows of {hidden}", rl.kernel));
    }
    let want_blocks = if split_shape && tiles <= 8 {
        groups.min(256 / tiles)
    } else if on_occupancy_grid {
        occupancy
    } else {
        groups.min(power_of_two_within(block))
    };
    // The narrow entries run f32 rows of their block sizes on the occupancy grid, and in one
    // launch vector rows from their row groups on.
    let want_narrow = match narrow_backward_blocks_per_sm(rl.block) {
        Some((budget, _, _, fused_groups))
            if !looped && dtype == DType::F32 && p.rows_per_block == 1 =>
        {
            if !fused && on_occupancy_grid {
                Some(KernelId::RmsNormBwdNarrow(dtype, mode, budget))
            } else if fused && mode == VecMode::V16 && groups >= fused_groups {
                Some(KernelId::RmsNormBwdFusedNarrow(dtype, budget))
            } else {
                None
            }
        }
        _ => None,
    };
    let narrow = matches!(
        rl.kernel,
        KernelId::RmsNormBwdNarrow(..) | KernelId::RmsNormBwdFusedNarrow(..)
    )
    .then_some(rl.kernel);
    if want_narrow != narrow {
        v.add(format!(
            "{:?} for {groups} row groups in blocks of {}",
            rl.kernel, rl.block
        ));
    }
    if (!fused && hidden > 0 && row_blocks != want_blocks)
        || (rl.grid > 0 && rl.block != p.threads_per_row * p.rows_per_block)
    {
        v.add(format!("{} blocks of {}", rl.grid, rl.block));
    }
    let slots = row_blocks * p.rows_per_block as u64;
    let partials = match (fused, looped) {
        (true, _) => 0,
        (false, looped) => slots as u128 * hidden as u128 + if looped { rows as u128 } else { 0 },
    };
    let size = dtype.size_bytes();
    let region = |addr, stride| Region::new(addr, size, p.rows, p.hidden, stride);
    let w_size = t.weight.dtype.size_bytes();
    let mut accesses = vec![
        (access("dy", region(p.dy, p.dy_stride), false, 0), &t.dy),
        (access("h", region(p.h, p.h_stride), false, 0), &t.h),
        (access("dx", region(p.dx, p.dx_stride), true, 0), &t.dx),
        (
            access("weight", Region::row(p.w, w_size, p.hidden), false, 0),
            &t.weight,
        ),
        (
            access(
                "rstd",
                Region::new(p.rstd, 4, p.rows, 1, p.rstd_stride),
                false,
                0,
            ),
            &t.rstd,
        ),
        (
            access(
                "workspace",
                Region::row(p.workspace, 4, partials.min(u64::MAX as u128) as u64),
                true,
                0,
            ),
            &t.workspace,
        ),
    ];
    match &t.dres {
        Some(dres) => accesses.push((
            access("dres", region(p.dres, p.dres_stride), false, 0),
            dres,
        )),
        None if p.dres != 0 => v.add("dres read but none given".into()),
        None => {}
    }

    if fused {
        accesses.push((
            access("dw", Region::row(p.dw, w_size, p.hidden), true, 0),
            &t.dw,
        ));
    } else if p.dw != 0 {
        v.add("dw written by the rows kernel of two launches".into());
    }
    // The fused kernel's dw blocks follow the two launches' slots.
    let dw_slots = if fused {
        want_blocks * p.rows_per_block as u64
    } else {
        0
    };
    if p.dw_slots as u64 != dw_slots {
        v.add(format!("{} dw slots, expected {dw_slots}", p.dw_slots));
    }

    // The dw launch: the fixed-order sum of the slots' partials into dw.
    if let Some(dl) = dl {
        let q = &dl.params;
        v.launch(1, dl, hidden > 0);
        if dl.kernel != KernelId::RmsNormDw(t.weight.dtype) {
            v.add(format!("dw kernel {:?}", dl.kernel));
        }
        if q.slots != slots || q.hidden != hidden as u64 || q.workspace != p.workspace {
            v.add(format!(
                "dw sums {} slots of {} at {:#x}",
                q.slots, q.hidden, q.workspace
            ));
        }
        let read = q.slots as u128 * q.hidden as u128;
        accesses.push((
            access(
                "workspace",
                Region::row(q.workspace, 4, read.min(u64::MAX as u128) as u64),
                false,
                1,
            ),
            &t.workspace,
        ));
        accesses.push((
            access("dw", Region::row(q.dw, w_size, q.hidden), true, 1),
            &t.dw,
        ));
    }

    for (a, buf) in &accesses {
        v.inside(a, buf);
        if mode == VecMode::V16 && a.launch == 0 && !matches!(a.name, "rstd" | "dw") {
            v.vectors(a, matches!(a.name, "weight" | "workspace"));
        }
    }
    let accesses: Vec<Access> = accesses.into_iter().map(|(a, _)| a).collect();
    v.aliasing(&accesses, &[("dx", "dy"), ("dx", "dres")]);
    v.0
}

#[test]
fn rmsnorm_backward_fuzz() {
    fuzz(
        "plan_rmsnorm_backward",
        0x4a7e_b000_0000,
        norm_backward_case,
        plan_norm_backward_case,
        check_norm_backward,
    );
}
