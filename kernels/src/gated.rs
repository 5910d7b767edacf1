//! Gated activations: `y = act(a) * b` (forward) and its gradient (backward).
//!
//! # Parameters
//! [`GatedFwdParams`] / [`GatedBwdParams`]: every operand is a `[rows, cols]` matrix with its
//! own row stride (elements) and unit column stride. The interleaved `[gate | up]` layout
//! reaches the kernel as two such matrices over one buffer (see the params docs).
//!
//! # Thread mapping
//! The `rows x cols` elements are cut into accesses of `W` elements (`W` = 16 bytes of the
//! dtype on the `v16` entries, 1 on the `scalar` entries) and numbered row-major, so access
//! `i` is row `i / (cols / W)`. With `G` threads in the grid, thread `g` takes accesses
//! `g, g + G, g + 2G, ...` (consecutive threads, consecutive addresses: coalesced). `G` must
//! be the grid the host planned (`host/src/gated.rs::grid_for`): the kernel counts accesses by
//! the launched thread count but moves its row/column cursor by the walk's step, which the
//! host computed for that `G`; another grid would desynchronise the two. On the vector path
//! usually one access per thread, so a thread holds one 16-byte vector per operand, fits in
//! 32 registers (the budget `cargo xtask ptx` checks), and a full multiprocessor keeps 2048
//! threads' loads in flight. The scalar path takes [`GATED_SCALAR_BATCH`] accesses per thread
//! at a time, all their loads first (predicated), to keep as many bytes in flight. The row and
//! column of the first access come from a host-precomputed multiply-high, later ones by adding
//! the grid step: no division in the kernel ([`GridWalk`]).
//!
//! # Flat ranges
//! When every operand is dense and at the same offset from the 16-byte grid, the host launches
//! the vector entry over the elements as one row from the first 16-byte boundary (the body),
//! and the few elements before it and after its last vector (the ragged head and tail, each
//! shorter than a vector) go to the grid's last threads, one element each, after their vector
//! accesses ([`FlatEnds`]), in entries of their own (`gated_{fwd,bwd}_{dtype}_v16_ends`) so
//! that every other call runs the vector body without that code. A grid of one access per
//! thread has a warp more for them, so their loads issue with the body's rather than after a
//! warp's vector accesses; the call is one launch, nothing waits for a second one.
//!
//! # The realigned forward (`gated_fwd_{dtype}_realigned`)
//! For operands at any element offset and row stride (an interleaved `[gate | up]` input of
//! odd `I` puts the two halves of a row at different offsets from the 16-byte grid, and the
//! output at a third). The output drives: row `r`'s accesses are the 16-byte aligned vectors of
//! `y` that its row touches (`ceil(cols * size / 16) + 1` per row, the last one possibly
//! empty), walked as above. An access whose `y` vector lies inside the row and whose `a` and
//! `b` bytes lie inside theirs loads, for each input, the one or two aligned vectors its 16
//! bytes span and moves them into place in registers (a word select and a funnel shift: the
//! offset is a whole number of elements); the second vector is the first one of the next
//! lane's access, so it mostly comes from L1 and HBM still sees each byte once. The few
//! accesses at a row's ends (at most two or three per row and operand) go element by element,
//! predicated. Only bytes of the operands' own rows are read, so padding and the other half of
//! an interleaved row are never touched. A warp that holds a row end runs both branches; in
//! `gated_fwd_{dtype}_realigned_ends_first` the row ends go first, so their loads issue while
//! the warp's vector loads are in flight and the warp waits for memory once, not twice. That
//! keeps the vector loads' registers live across the element branch (about 56 registers
//! against 40), so the host runs it where the grid fits on the device at once (one access per
//! thread, latency first) and the other entry where occupancy sets the speed.
//!
//! # The realigned backward (`gated_bwd_{dtype}_realigned`)
//! The same for the gradient, whose two outputs may sit at different offsets (`da` and `db`
//! are the halves of an interleaved gradient): access `q` of a row is aligned vector `q` of
//! `da`, formed from `a`, `b` and `dy` realigned to it, then vector `q` of `db` from `a` and
//! `dy` realigned to that one. A vector's inputs are other threads' vectors' neighbours, so no
//! gradient may overlap an input: in-place calls off the grid take the scalar path. So do
//! calls of fewer accesses than half the threads the device holds at once: there a thread's
//! two waits, one per half, set the time, where the scalar path issues all its loads at once.
//!
//! # Programmatic dependent launch (sm_90)
//! Every entry starts with `grid_dependency_sync` (wait for the previous grid in the stream,
//! then let the next one launch); see `mem.rs`.
//!
//! # Aliasing
//! Each element is read and written by the same thread, and all of a thread's loads for one
//! step precede its stores, so an output that exactly equals an input (in place) is safe
//! (the realigned backward excepted, see above).
//!
//! # Dtype contract
//! Loads widen to f32, all math is f32 (`ferrofuse_common::act`), the store rounds to nearest
//! even in the storage dtype.

use ferrofuse_common::act::{GatedAct, GeluErf, GeluTanh, Relu, Silu};
use ferrofuse_common::{
    Activation, FlatEnds, GATED_SCALAR_BATCH, GatedBwdParams, GatedFwdParams, GridWalk,
};

use crate::mem::{
    Bf16, Elem, F16, F32, VecMode, access_width, funnel_shift_right, grid, grid_dependency_sync,
    ld_v4_if, opaque_u32, st_v4,
};

/// Byte address of access `(row, col)` (`col` counted in accesses) of a matrix at `base`.
#[inline(always)]
fn addr<E: Elem, const M: VecMode>(base: u64, stride: u64, at: Cursor) -> u64 {
    base + (at.row * stride + at.col * const { access_width::<E, M>() }) * E::BYTES
}

/// Row and column (in accesses) of one access.
#[derive(Clone, Copy)]
struct Cursor {
    row: u64,
    col: u64,
}

/// Advances a cursor by the grid's step (precomputed on the host: no division here).
#[inline(always)]
fn advance(w: &GridWalk, c: Cursor) -> Cursor {
    let (mut row, mut col) = (c.row + w.step_rows, c.col + w.step_cols);
    if col >= w.per_row {
        col -= w.per_row;
        row += 1;
    }
    Cursor { row, col }
}

/// A gated body's start, after the wait for the previous grid (programmatic dependent launch;
/// every body waits before its first access): this thread's first access index, the grid-wide
/// step, the total number of accesses, and the first access's cursor (its index < 2^32).
#[inline(always)]
fn begin(rows: u64, w: &GridWalk) -> (u64, u64, u64, Cursor) {
    grid_dependency_sync();
    let step = grid::grid_dim_x() * grid::block_dim_x();
    let first = grid::block_x() * grid::block_dim_x() + grid::thread_x();
    let row = w.row_of(first);
    let at = Cursor {
        row,
        col: first - row * w.per_row,
    };
    (first, step, rows * w.per_row, at)
}

/// See [`GATED_SCALAR_BATCH`].
const SCALAR_BATCH: usize = GATED_SCALAR_BATCH;

/// The cursors and in-range flags of a thread's next [`SCALAR_BATCH`] accesses, from access
/// `i` at `at`; advances `at` past them.
#[inline(always)]
fn batch(
    w: &GridWalk,
    i: u64,
    step: u64,
    total: u64,
    at: &mut Cursor,
) -> ([Cursor; SCALAR_BATCH], [bool; SCALAR_BATCH]) {
    let mut ats = [*at; SCALAR_BATCH];
    let mut ok = [false; SCALAR_BATCH];
    unroll!(k < SCALAR_BATCH => {
        ats[k] = *at;
        ok[k] = i + k as u64 * step < total;
        *at = advance(w, *at);
    });
    (ats, ok)
}

/// The forward over the walk's accesses; with `ENDS`, then a flat range's ragged end element
/// where this thread takes one (see the module docs).
#[inline(always)]
unsafe fn fwd<E: Elem, const M: VecMode, A: GatedAct, const ENDS: bool>(p: &GatedFwdParams) {
    if M == VecMode::Scalar {
        // SAFETY: the caller's contract.
        return unsafe { fwd_scalar::<E, A>(p) };
    }
    let walk = &p.walk;
    let (mut i, step, total, mut at) = begin(p.rows, walk);
    while i < total {
        // SAFETY: the access is inside every matrix: i < total, and `at` is access i's row and
        // column because the walk was built for this grid; the host checked that the
        // allocations cover rows x cols at these strides and the alignment of M. Both loads
        // precede the store, so y may be exactly b.
        let (a, b) = unsafe {
            let a = E::load_access::<M>(addr::<E, M>(p.a, p.a_stride, at));
            (a, E::load_access::<M>(addr::<E, M>(p.b, p.b_stride, at)))
        };
        let (a, b) = (E::widen_access::<M>(a), E::widen_access::<M>(b));
        let mut y = [0.0f32; 8];
        unroll!(l < const { access_width::<E, M>() } as usize => {
            y[l] = A::value(a[l]) * b[l];
        });
        // SAFETY: as above.
        unsafe { E::store_access::<M>(addr::<E, M>(p.y, p.y_stride, at), &y) };
        at = advance(walk, at);
        i += step;
    }
    if !ENDS {
        return;
    }
    if let Some(e) = flat_end::<E, M>(p.ends, step, total) {
        let at = |base: u64| end_addr::<E>(base, e);
        // SAFETY: a flat range's end element lies inside every operand, next to the body (the
        // host's split; see `FlatEnds`); y may be exactly b, loaded first.
        unsafe {
            let (a, b) = (
                E::load_bits_if(at(p.a), true),
                E::load_bits_if(at(p.b), true),
            );
            E::store_if(at(p.y), A::value(E::widen(a)) * E::widen(b), true);
        }
    }
}

/// The ragged end element of a flat range this thread takes after its accesses, if any (see
/// [`FlatEnds`]; `total` accesses of `M`, one row). Found after the loop, from the thread's
/// index, so that nothing of it is live across the loop.
#[inline(always)]
pub(crate) fn flat_end<E: Elem, const M: VecMode>(
    ends: FlatEnds,
    threads: u64,
    total: u64,
) -> Option<i64> {
    let g = grid::block_x() * grid::block_dim_x() + grid::thread_x();
    ends.element(g, threads, total * const { access_width::<E, M>() })
}

/// Byte address of a flat range's end element `e` elements from the body at `base`.
#[inline(always)]
pub(crate) fn end_addr<E: Elem>(base: u64, e: i64) -> u64 {
    base.wrapping_add((e as u64).wrapping_mul(E::BYTES))
}

/// [`fwd`] one element per access, [`SCALAR_BATCH`] accesses per thread at a time: all their
/// loads first (predicated, back to back), then the math and the stores.
#[inline(always)]
unsafe fn fwd_scalar<E: Elem, A: GatedAct>(p: &GatedFwdParams) {
    const S: VecMode = VecMode::Scalar;
    let walk = &p.walk;
    let (mut i, step, total, mut at) = begin(p.rows, walk);
    while i < total {
        let (ats, ok) = batch(walk, i, step, total, &mut at);
        let mut a = [0u32; SCALAR_BATCH];
        let mut b = [0u32; SCALAR_BATCH];
        // SAFETY: where `ok[k]`, access i + k * step is inside every matrix (as in `fwd`);
        // the others are predicated off. Every load of the batch precedes every store, so y
        // may be exactly b.
        unroll!(k < SCALAR_BATCH => {
            a[k] = unsafe { E::load_bits_if(addr::<E, S>(p.a, p.a_stride, ats[k]), ok[k]) };
            b[k] = unsafe { E::load_bits_if(addr::<E, S>(p.b, p.b_stride, ats[k]), ok[k]) };
        });
        unroll!(k < SCALAR_BATCH => {
            let y = A::value(E::widen(a[k])) * E::widen(b[k]);
            // SAFETY: as above.
            unsafe { E::store_if(addr::<E, S>(p.y, p.y_stride, ats[k]), y, ok[k]) };
        });
        i += SCALAR_BATCH as u64 * step;
    }
}

/// The 16 bytes at byte offset `sh` (< 16) of the 32 bytes `lo : hi` (little-endian).
#[inline(always)]
pub(crate) fn realign(lo: [u32; 4], hi: [u32; 4], sh: u64) -> [u32; 4] {
    let w = [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]];
    let (q, bits) = (sh >> 2, ((sh & 3) * 8) as u32);
    // Word `k + q` for k < 5, by two rounds of selects on the bits of `q`: a run-time index
    // into registers would go through local memory, and a `match` on `q` compiles to a jump
    // table, one indirect branch per word.
    let mut by2 = [0u32; 6];
    unroll!(k < 6 => {
        by2[k] = if q & 2 != 0 { w[k + 2] } else { w[k] };
    });
    let mut u = [0u32; 5];
    unroll!(k < 5 => {
        u[k] = if q & 1 != 0 { by2[k + 1] } else { by2[k] };
    });
    let mut out = [0u32; 4];
    unroll!(j < 4 => {
        out[j] = funnel_shift_right(u[j], u[j + 1], bits);
    });
    out
}

/// One input's 16 bytes starting at `at` (any element offset), when they and the aligned
/// vectors that hold them lie inside `[lo, end)`: returns whether they do and the loads (two
/// aligned vectors, the second predicated off when `at` is aligned; both off when outside).
#[inline(always)]
pub(crate) unsafe fn load_realigned(
    at: u64,
    lo: u64,
    end: u64,
    whole: bool,
) -> (bool, [u32; 4], [u32; 4], u64) {
    let (base, sh) = (at & !15, at & 15);
    let ok = whole && base >= lo && base + if sh == 0 { 16 } else { 32 } <= end;
    // SAFETY: when `ok`, both vectors are inside `[lo, end)`, a row of the operand (caller).
    let (v0, v1) = unsafe { (ld_v4_if(base, ok), ld_v4_if(base + 16, ok && sh != 0)) };
    (ok, v0, v1, sh)
}

/// The realigned forward; see the module docs. `ENDS_FIRST`: a warp's row ends before its
/// vector lanes (see there).
#[inline(always)]
unsafe fn fwd_realigned<E: Elem, A: GatedAct, const ENDS_FIRST: bool>(p: &GatedFwdParams) {
    let walk = &p.walk;
    let (mut i, step, total, mut at) = begin(p.rows, walk);
    let size = E::BYTES;
    let row_bytes = p.cols * size;
    while i < total {
        let ya = p.y + at.row * p.y_stride * size;
        let (aa, ba) = (
            p.a + at.row * p.a_stride * size,
            p.b + at.row * p.b_stride * size,
        );
        // This access's aligned vector of `y`; `off` is its byte offset from the row's start
        // (negative, wrapped, for a vector that starts before the row).
        let v = (ya & !15) + at.col * 16;
        let off = v.wrapping_sub(ya);
        let whole = v >= ya && v + 16 <= ya + row_bytes;
        // SAFETY: `[aa, aa + row_bytes)` and `[ba, ba + row_bytes)` are rows of `a` and `b`
        // (the host checked the allocations cover rows x cols at these strides).
        let (a_ok, a0, a1, a_sh) =
            unsafe { load_realigned(aa.wrapping_add(off), aa, aa + row_bytes, whole) };
        // SAFETY: as above.
        let (b_ok, b0, b1, b_sh) =
            unsafe { load_realigned(ba.wrapping_add(off), ba, ba + row_bytes, whole) };
        let vector = a_ok && b_ok;
        let (a, b) = ((a0, a1, a_sh), (b0, b1, b_sh));
        if ENDS_FIRST {
            // The row ends' loads issue while the warp's vector loads are in flight, and the
            // warp waits for both once; as an `else` after the vector lanes, they would wait
            // in turn. An opaque copy of the test keeps the two branches in this order
            // instead of one `if`-`else`.
            if !vector {
                // SAFETY: `v` is this access's vector of row `at.row` of `y`, at `off` from
                // the row's start; `aa` and `ba` are the row's starts in `a` and `b`.
                unsafe { row_end::<E, A>(v, off, aa, ba, row_bytes) };
            }
            if opaque_u32(vector as u32) != 0 {
                // SAFETY: `vector`: `v` and the loaded vectors lie inside their rows.
                unsafe { store_vector::<E, A>(v, a, b) };
            }
        } else if vector {
            // SAFETY: as above.
            unsafe { store_vector::<E, A>(v, a, b) };
        } else {
            // SAFETY: as above.
            unsafe { row_end::<E, A>(v, off, aa, ba, row_bytes) };
        }
        at = advance(walk, at);
        i += step;
    }
}

/// One whole vector of `y` at `v` from the loads of its `a` and `b` bytes (two aligned
/// vectors and the byte offset in them, as [`load_realigned`] returns them).
///
/// # Safety
/// `v` is an aligned 16-byte vector inside a row of `y`; every byte this thread loaded from
/// `b` precedes the store (when `y` is exactly `b`, `b`'s bytes are this vector's own: same
/// offset, so one aligned load).
#[inline(always)]
unsafe fn store_vector<E: Elem, A: GatedAct>(
    v: u64,
    (a0, a1, a_sh): ([u32; 4], [u32; 4], u64),
    (b0, b1, b_sh): ([u32; 4], [u32; 4], u64),
) {
    let a = E::unpack(realign(a0, a1, a_sh));
    let b = E::unpack(realign(b0, b1, b_sh));
    let mut y = [0.0f32; 8];
    unroll!(l < E::LANES => {
        y[l] = A::value(a[l]) * b[l];
    });
    // SAFETY: the caller's contract.
    unsafe { st_v4(v, E::pack(&y)) };
}

/// A vector of `y` at a row's end, element by element: the lanes inside the row.
///
/// # Safety
/// `v` is the vector at byte offset `off` (wrapped when negative) from the start of a row of
/// `y` of `row_bytes` bytes, `aa` and `ba` the starts of the same row in `a` and `b`.
#[inline(always)]
unsafe fn row_end<E: Elem, A: GatedAct>(v: u64, off: u64, aa: u64, ba: u64, row_bytes: u64) {
    let size = E::BYTES;
    let mut a = [0u32; 8];
    let mut b = [0u32; 8];
    let mut ok = [false; 8];
    unroll!(l < E::LANES => {
        let o = off.wrapping_add(l as u64 * size);
        ok[l] = o < row_bytes;
        // SAFETY: where `ok[l]`, element `o / size` of the row is inside `a` and `b`.
        unsafe {
            a[l] = E::load_bits_if(aa.wrapping_add(o), ok[l]);
            b[l] = E::load_bits_if(ba.wrapping_add(o), ok[l]);
        }
    });
    unroll!(l < E::LANES => {
        let y = A::value(E::widen(a[l])) * E::widen(b[l]);
        // SAFETY: as for the loads, inside `y`'s row.
        unsafe { E::store_if(v + l as u64 * size, y, ok[l]) };
    });
}

/// The backward over the walk's accesses; with `ENDS`, then a flat range's ragged end element
/// where this thread takes one.
#[inline(always)]
unsafe fn bwd<E: Elem, const M: VecMode, A: GatedAct, const ENDS: bool>(p: &GatedBwdParams) {
    if M == VecMode::Scalar {
        // SAFETY: the caller's contract.
        return unsafe { bwd_scalar::<E, A>(p) };
    }
    let walk = &p.walk;
    let (mut i, step, total, mut at) = begin(p.rows, walk);
    while i < total {
        // SAFETY: as in `fwd`; all three loads precede both stores, so da/db may be exactly
        // a/b/dy.
        let (a, b, dy) = unsafe {
            let a = E::load_access::<M>(addr::<E, M>(p.a, p.a_stride, at));
            let b = E::load_access::<M>(addr::<E, M>(p.b, p.b_stride, at));
            (
                a,
                b,
                E::load_access::<M>(addr::<E, M>(p.dy, p.dy_stride, at)),
            )
        };
        let (a, b, dy) = (
            E::widen_access::<M>(a),
            E::widen_access::<M>(b),
            E::widen_access::<M>(dy),
        );
        let mut da = [0.0f32; 8];
        let mut db = [0.0f32; 8];
        unroll!(l < const { access_width::<E, M>() } as usize => {
            let (f, df) = A::value_and_grad(a[l]);
            da[l] = dy[l] * b[l] * df;
            db[l] = dy[l] * f;
        });
        // SAFETY: as above.
        unsafe {
            E::store_access::<M>(addr::<E, M>(p.da, p.da_stride, at), &da);
            E::store_access::<M>(addr::<E, M>(p.db, p.db_stride, at), &db);
        }
        at = advance(walk, at);
        i += step;
    }
    if !ENDS {
        return;
    }
    if let Some(e) = flat_end::<E, M>(p.ends, step, total) {
        let at = |base: u64| end_addr::<E>(base, e);
        // SAFETY: as in `fwd`'s end element; all three loads precede both stores.
        unsafe {
            let a = E::widen(E::load_bits_if(at(p.a), true));
            let b = E::widen(E::load_bits_if(at(p.b), true));
            let dy = E::widen(E::load_bits_if(at(p.dy), true));
            let (f, df) = A::value_and_grad(a);
            E::store_if(at(p.da), dy * b * df, true);
            E::store_if(at(p.db), dy * f, true);
        }
    }
}

/// The realigned backward; see the module docs. Each access is one aligned vector of `da`
/// and the vector of the same index of `db` (their rows may sit at different offsets from
/// the grid), each with the inputs it needs realigned to it, one after the other: the second's
/// loads mostly hit the lines the first brought into L1.
#[inline(always)]
unsafe fn bwd_realigned<E: Elem, A: GatedAct>(p: &GatedBwdParams) {
    let walk = &p.walk;
    let (mut i, step, total, mut at) = begin(p.rows, walk);
    let size = E::BYTES;
    let row_bytes = p.cols * size;
    while i < total {
        let row_of = |base: u64, stride: u64| base + at.row * stride * size;
        let (aa, ba, ga) = (
            row_of(p.a, p.a_stride),
            row_of(p.b, p.b_stride),
            row_of(p.dy, p.dy_stride),
        );
        let (v, off, whole) = output_vector(row_of(p.da, p.da_stride), at.col, row_bytes);
        let input = |x: u64| {
            // SAFETY: `x` starts this row of an input (the host checked the allocations cover
            // rows x cols at these strides).
            unsafe { load_realigned(x.wrapping_add(off), x, x + row_bytes, whole) }
        };
        let (a_ok, a0, a1, a_sh) = input(aa);
        let (b_ok, b0, b1, b_sh) = input(ba);
        let (g_ok, g0, g1, g_sh) = input(ga);
        if a_ok && b_ok && g_ok {
            let a = E::unpack(realign(a0, a1, a_sh));
            let b = E::unpack(realign(b0, b1, b_sh));
            let dy = E::unpack(realign(g0, g1, g_sh));
            let mut da = [0.0f32; 8];
            unroll!(l < E::LANES => {
                da[l] = dy[l] * b[l] * A::value_and_grad(a[l]).1;
            });
            // SAFETY: `v` is an aligned 16-byte vector inside row `at.row` of `da`, which
            // overlaps no input (host rule for this kernel).
            unsafe { st_v4(v, E::pack(&da)) };
        } else {
            // SAFETY: `v` is this access's vector of row `at.row` of `da`, at `off` from the
            // row's start; `aa`, `ba`, `ga` are the row's starts in the inputs.
            unsafe {
                row_end_with::<E, 3>(v, off, [aa, ba, ga], row_bytes, |[a, b, dy]| {
                    dy * b * A::value_and_grad(a).1
                })
            };
        }
        // `db`'s vector, the same way from `a` and `dy`. The activation and its gradient as
        // the other backward paths compute them (`value_and_grad`), so the same bits.
        let (v, off, whole) = output_vector(row_of(p.db, p.db_stride), at.col, row_bytes);
        let input = |x: u64| {
            // SAFETY: as above.
            unsafe { load_realigned(x.wrapping_add(off), x, x + row_bytes, whole) }
        };
        let (a_ok, a0, a1, a_sh) = input(aa);
        let (g_ok, g0, g1, g_sh) = input(ga);
        if a_ok && g_ok {
            let a = E::unpack(realign(a0, a1, a_sh));
            let dy = E::unpack(realign(g0, g1, g_sh));
            let mut db = [0.0f32; 8];
            unroll!(l < E::LANES => {
                db[l] = dy[l] * A::value_and_grad(a[l]).0;
            });
            // SAFETY: as for `da`.
            unsafe { st_v4(v, E::pack(&db)) };
        } else {
            // SAFETY: as for `da`.
            unsafe {
                row_end_with::<E, 2>(v, off, [aa, ga], row_bytes, |[a, dy]| {
                    dy * A::value_and_grad(a).0
                })
            };
        }
        at = advance(walk, at);
        i += step;
    }
}

/// Access column `col`'s aligned 16-byte vector of an output row that starts at `row` (an
/// address) and holds `row_bytes` bytes: the vector's address, its byte offset from the row's
/// start (wrapped when the vector starts before the row) and whether it lies wholly inside.
#[inline(always)]
fn output_vector(row: u64, col: u64, row_bytes: u64) -> (u64, u64, bool) {
    let v = (row & !15) + col * 16;
    (
        v,
        v.wrapping_sub(row),
        v >= row && v + 16 <= row + row_bytes,
    )
}

/// An output vector at a row's end, element by element (the lanes inside the row): element
/// `l` is `f` of the inputs' elements of the same column.
///
/// # Safety
/// `v` is the vector at byte offset `off` (wrapped when negative) from the start of a row of
/// the output of `row_bytes` bytes, `starts` the starts of the same row in the inputs.
#[inline(always)]
unsafe fn row_end_with<E: Elem, const N: usize>(
    v: u64,
    off: u64,
    starts: [u64; N],
    row_bytes: u64,
    f: impl Fn([f32; N]) -> f32,
) {
    let size = E::BYTES;
    let mut x = [[0u32; N]; 8];
    let mut ok = [false; 8];
    unroll!(l < E::LANES => {
        let o = off.wrapping_add(l as u64 * size);
        ok[l] = o < row_bytes;
        unroll!(n < N => {
            // SAFETY: where `ok[l]`, element `o / size` of the row is inside each input.
            x[l][n] = unsafe { E::load_bits_if(starts[n].wrapping_add(o), ok[l]) };
        });
    });
    unroll!(l < E::LANES => {
        let y = f(x[l].map(E::widen));
        // SAFETY: as for the loads, inside the output's row.
        unsafe { E::store_if(v + l as u64 * size, y, ok[l]) };
    });
}

/// [`bwd`] with the batching of [`fwd_scalar`].
#[inline(always)]
unsafe fn bwd_scalar<E: Elem, A: GatedAct>(p: &GatedBwdParams) {
    const S: VecMode = VecMode::Scalar;
    let walk = &p.walk;
    let (mut i, step, total, mut at) = begin(p.rows, walk);
    while i < total {
        let (ats, ok) = batch(walk, i, step, total, &mut at);
        let mut a = [0u32; SCALAR_BATCH];
        let mut b = [0u32; SCALAR_BATCH];
        let mut dy = [0u32; SCALAR_BATCH];
        // SAFETY: as in `fwd_scalar`; all loads of the batch precede its stores, so da/db may
        // be exactly a/b/dy.
        unroll!(k < SCALAR_BATCH => {
            a[k] = unsafe { E::load_bits_if(addr::<E, S>(p.a, p.a_stride, ats[k]), ok[k]) };
            b[k] = unsafe { E::load_bits_if(addr::<E, S>(p.b, p.b_stride, ats[k]), ok[k]) };
            dy[k] = unsafe { E::load_bits_if(addr::<E, S>(p.dy, p.dy_stride, ats[k]), ok[k]) };
        });
        unroll!(k < SCALAR_BATCH => {
            let (a, b, dy) = (E::widen(a[k]), E::widen(b[k]), E::widen(dy[k]));
            let (f, df) = A::value_and_grad(a);
            // SAFETY: as above.
            unsafe {
                E::store_if(addr::<E, S>(p.da, p.da_stride, ats[k]), dy * b * df, ok[k]);
                E::store_if(addr::<E, S>(p.db, p.db_stride, ats[k]), dy * f, ok[k]);
            }
        });
        i += SCALAR_BATCH as u64 * step;
    }
}

/// Dispatches on the activation once per launch (a uniform branch), then runs a body
/// monomorphized for it.
macro_rules! dispatch_act {
    ($body:ident, $e:ty, $m:path, $ends:expr, $p:expr) => {
        match Activation::from_u32($p.act) {
            Some(Activation::Silu) => $body::<$e, { $m }, Silu, { $ends }>($p),
            Some(Activation::GeluErf) => $body::<$e, { $m }, GeluErf, { $ends }>($p),
            Some(Activation::GeluTanh) => $body::<$e, { $m }, GeluTanh, { $ends }>($p),
            Some(Activation::Relu) => $body::<$e, { $m }, Relu, { $ends }>($p),
            // The host only passes valid activations.
            None => {}
        }
    };
}

/// [`dispatch_act!`] for the realigned body: a `bool` const parameter (`ENDS_FIRST`) in place of
/// the memory path.
macro_rules! dispatch_act_realigned {
    ($body:ident, $e:ty, $c:expr, $p:expr) => {
        match Activation::from_u32($p.act) {
            Some(Activation::Silu) => $body::<$e, Silu, { $c }>($p),
            Some(Activation::GeluErf) => $body::<$e, GeluErf, { $c }>($p),
            Some(Activation::GeluTanh) => $body::<$e, GeluTanh, { $c }>($p),
            Some(Activation::Relu) => $body::<$e, Relu, { $c }>($p),
            // The host only passes valid activations.
            None => {}
        }
    };
}

macro_rules! realigned_entries {
    ($($fwd:ident, $ends_first:ident: $e:ty;)*) => {$(
        /// Gated forward on the realigned path; see the module docs. Launch: `GATED_THREADS`
        /// threads, the planned grid.
        ///
        /// # Safety
        /// The host launcher's checks: valid, element-aligned, in-bounds tensors; allowed
        /// aliasing only.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $fwd(p: GatedFwdParams) {
            unsafe { dispatch_act_realigned!(fwd_realigned, $e, false, &p) }
        }

        /// The same, a warp's row ends before its vector lanes; see the module docs.
        ///
        /// # Safety
        /// As for the other realigned entry.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $ends_first(p: GatedFwdParams) {
            unsafe { dispatch_act_realigned!(fwd_realigned, $e, true, &p) }
        }
    )*};
}

realigned_entries! {
    gated_fwd_f32_realigned, gated_fwd_f32_realigned_ends_first: F32;
    gated_fwd_f16_realigned, gated_fwd_f16_realigned_ends_first: F16;
    gated_fwd_bf16_realigned, gated_fwd_bf16_realigned_ends_first: Bf16;
}

macro_rules! realigned_backward_entries {
    ($($bwd:ident: $e:ty;)*) => {$(
        /// Gated backward on the realigned path; see the module docs. Launch: `GATED_THREADS`
        /// threads, the planned grid.
        ///
        /// # Safety
        /// The host launcher's checks: valid, element-aligned, in-bounds tensors; no gradient
        /// overlapping an input.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $bwd(p: GatedBwdParams) {
            unsafe {
                match Activation::from_u32(p.act) {
                    Some(Activation::Silu) => bwd_realigned::<$e, Silu>(&p),
                    Some(Activation::GeluErf) => bwd_realigned::<$e, GeluErf>(&p),
                    Some(Activation::GeluTanh) => bwd_realigned::<$e, GeluTanh>(&p),
                    Some(Activation::Relu) => bwd_realigned::<$e, Relu>(&p),
                    // The host only passes valid activations.
                    None => {}
                }
            }
        }
    )*};
}

realigned_backward_entries! {
    gated_bwd_f32_realigned: F32;
    gated_bwd_f16_realigned: F16;
    gated_bwd_bf16_realigned: Bf16;
}

macro_rules! entries {
    ($($fwd:ident, $bwd:ident: $e:ty, $m:path;)*) => {$(
        /// Gated forward; see the module docs. Launch: `GATED_THREADS` threads, the planned grid.
        ///
        /// # Safety
        /// The host launcher's checks: valid, aligned, in-bounds tensors; allowed aliasing only.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $fwd(p: GatedFwdParams) {
            unsafe { dispatch_act!(fwd, $e, $m, false, &p) }
        }

        /// Gated backward; see the module docs. Launch: `GATED_THREADS` threads, the planned grid.
        ///
        /// # Safety
        /// As for the forward entry.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $bwd(p: GatedBwdParams) {
            unsafe { dispatch_act!(bwd, $e, $m, false, &p) }
        }
    )*};
}

// Names must match `ferrofuse_common::KernelId::name` (checked when `cargo xtask ptx` builds).
entries! {
    gated_fwd_f32_v16, gated_bwd_f32_v16: F32, VecMode::V16;
    gated_fwd_f32_scalar, gated_bwd_f32_scalar: F32, VecMode::Scalar;
    gated_fwd_f16_v16, gated_bwd_f16_v16: F16, VecMode::V16;
    gated_fwd_f16_scalar, gated_bwd_f16_scalar: F16, VecMode::Scalar;
    gated_fwd_bf16_v16, gated_bwd_bf16_v16: Bf16, VecMode::V16;
    gated_fwd_bf16_scalar, gated_bwd_bf16_scalar: Bf16, VecMode::Scalar;
}

macro_rules! ends_entries {
    ($($fwd:ident, $bwd:ident: $e:ty;)*) => {$(
        /// Gated forward on the vector path over a flat range, its ragged head and tail
        /// included; see the module docs. Launch: `GATED_THREADS` threads, the planned grid.
        ///
        /// # Safety
        /// As for the vector entry; the ends next to the body lie inside every operand.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $fwd(p: GatedFwdParams) {
            unsafe { dispatch_act!(fwd, $e, VecMode::V16, true, &p) }
        }

        /// The same for the backward.
        ///
        /// # Safety
        /// As for the forward entry.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $bwd(p: GatedBwdParams) {
            unsafe { dispatch_act!(bwd, $e, VecMode::V16, true, &p) }
        }
    )*};
}

ends_entries! {
    gated_fwd_f32_v16_ends, gated_bwd_f32_v16_ends: F32;
    gated_fwd_f16_v16_ends, gated_bwd_f16_v16_ends: F16;
    gated_fwd_bf16_v16_ends, gated_bwd_bf16_v16_ends: Bf16;
}
