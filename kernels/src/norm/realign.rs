//! The realigned memory path ([`NormPath::Realigned`](ferrofuse_common::NormPath)): rows that
//! start anywhere, moved as 16-byte vectors at 16-byte boundaries.
//!
//! A row's chunks are the same as on the other paths (chunk `c` is columns `c*L .. c*L + L`,
//! owned by the same thread), so the arithmetic and its order, and with them the bits, are
//! the same whatever the row's offset from the 16-byte grid. Only the memory side differs.
//!
//! # Loads
//! Let column 0 of an operand's row sit `m` elements past a 16-byte boundary (`m < L`, a
//! property of the row: its address). Aligned vector `q` of the row then holds columns
//! `q*L - m .. q*L - m + L`, and chunk `c` is the last `L - m` lanes of vector `c` followed by
//! the first `m` lanes of vector `c + 1`. The thread owning chunk slot `c` loads vector `c`
//! into shared memory, and after a block barrier every thread reads its chunks from there at
//! the row's offset. Vectors wholly inside the row are predicated 16-byte loads issued back to
//! back; the two vectors that straddle the row's ends are read element by element by the
//! lanes of the row's first warp, one element each (nothing outside the row is touched).
//! (Shuffles instead of shared memory need the vector after each warp's last chunk in the
//! warp's last lane: twice the registers, and a quarter of the occupancy.)
//!
//! # Stores
//! The mirror image: aligned vector `c` is the last `m` lanes of chunk `c - 1` (shuffled over
//! from the left neighbour) followed by the first `L - m` of chunk `c`, stored by the owner of
//! chunk `c` as one 16-byte store when the vector is wholly inside the row and the owner is not
//! the first lane of its warp (whose left neighbour is in another warp). Every element no
//! vector store covers is stored alone by the thread that owns it, so each element is written
//! exactly once, by one thread.
//!
//! # Slices of a row
//! A cluster-split block holds chunks `first .. first + T * K` of its row (`split`): it
//! stages their vectors and the one after them (thread 0 loads it when it lies wholly inside
//! the row; its first `m` elements are the slice's). The row's edge vectors are staged by the
//! block whose slots they fall in. Stores need nothing more: a slice's first and last chunks
//! are held by the first and last lanes of warps, which store the elements their vectors
//! share with a neighbour one by one.
//!
//! # Aliasing
//! Every load of the row is issued before the staging barrier and every store after it, so
//! in-place forms read each element before anyone overwrites it. A slice's vector after its
//! last chunk holds elements of the next block's slice, which that block may be overwriting:
//! those lanes are loaded but never used.

use ferrofuse_common::{RMSNORM_SMEM_BYTES, RMSNORM_SPLIT_SMEM_BYTES};

use crate::mem::{Elem, funnel_shift_right, ld_v4_if, shfl_up_1, st_v4_if};
use crate::reduce::{smem_f32, sync_block};

use super::MAX_CHUNKS;

/// One operand's row: the 16-byte boundary at or before column 0 and column 0's offset from it.
#[derive(Clone, Copy)]
pub(super) struct Shifted {
    /// Byte address of aligned vector 0.
    base: u64,
    /// Elements between `base` and column 0 (`< L`).
    m: u64,
}

impl Shifted {
    /// Row `index` of the matrix at `base` whose rows are `stride` elements apart.
    #[inline(always)]
    pub(super) fn of<E: Elem>(base: u64, stride: u64, index: u64) -> Self {
        let first = base + index * stride * E::BYTES;
        let skew = first & 15;
        Shifted {
            base: first - skew,
            m: skew / E::BYTES,
        }
    }

    /// Whether aligned vector `q` holds only columns of the row (`0 .. hidden`).
    #[inline(always)]
    fn whole<E: Elem>(&self, q: u64, hidden: u64) -> bool {
        let l = E::LANES as u64;
        (q * l >= self.m) & (q * l + l <= hidden + self.m)
    }

    /// Whether aligned vector `q` holds some, but not only, columns of the row.
    #[inline(always)]
    fn straddles<E: Elem>(&self, q: u64, hidden: u64) -> bool {
        let l = E::LANES as u64;
        q * l < hidden + self.m && !self.whole::<E>(q, hidden)
    }
}

/// 16 bytes of shared memory, aligned so one access moves them.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Vector([u32; 4]);

/// Where one row's staged operands live: the word index of operand 0's vector 0 in the
/// block's dynamic shared memory, and the vectors per operand.
#[derive(Clone, Copy)]
pub(super) struct Stage {
    first_word: u32,
    vectors: u32,
}

impl Stage {
    /// The staging area of row `r_local` of the block, after the reduction buffers
    /// (`RMSNORM_SMEM_BYTES`), for rows of `tpr` threads holding `k` chunks each
    /// (`ferrofuse_common::rmsnorm_realigned_smem_bytes` is its size).
    #[inline(always)]
    pub(super) fn of_row(r_local: u64, tpr: u64, k: usize) -> Self {
        let vectors = (tpr * k as u64 + 1) as u32;
        Stage {
            first_word: RMSNORM_SMEM_BYTES / 4 + r_local as u32 * 2 * vectors * 4,
            vectors,
        }
    }

    /// The staging area of a split forward block (one row's slice of `tpr` threads holding
    /// `k` chunks each), after the split's own slots (`RMSNORM_SPLIT_SMEM_BYTES`;
    /// `ferrofuse_common::rmsnorm_split_smem_bytes` is the launch's size).
    #[inline(always)]
    pub(super) fn of_split(tpr: u64, k: usize) -> Self {
        Stage {
            first_word: RMSNORM_SPLIT_SMEM_BYTES / 4,
            vectors: (tpr * k as u64 + 1) as u32,
        }
    }
}

/// A thread's chunks `first + t + j * tpr` (`j < k`, with `(t, tpr, k)` as `me`) of two
/// operands' rows, each `(row, ok)`, as f32 lanes (zeros where not `ok`). `first` is 0
/// unless `SLICE`: then the block holds the row's chunks `first .. first + tpr * k` (a split
/// forward block's tiles) and also loads the vector after them, which holds the last `m`
/// columns of its last chunk.
///
/// Each thread loads the aligned vectors of its chunk slots that lie wholly inside the row,
/// both operands' loads issued before any is waited for. The vectors that straddle an end of
/// the row (its first when column 0 is off the grid, its last when the row does not end on
/// it) are read element by element by the row's first warp, one element per lane, with no
/// branch. All of them go to shared memory (`stage`), and after a block barrier each thread
/// reads its chunks back at the row's offset. Every thread of the block must call it.
///
/// # Safety
/// For each operand, when `ok`: its row is a row of `hidden` elements of a checked operand.
/// The launch has `rmsnorm_realigned_smem_bytes` of dynamic shared memory.
#[inline(always)]
pub(super) unsafe fn load_pair<E: Elem, const SLICE: bool>(
    a: (Shifted, bool),
    b: (Shifted, bool),
    me: (u64, u64, usize),
    stage: Stage,
    hidden: u64,
    first: u64,
) -> ([[f32; 8]; MAX_CHUNKS], [[f32; 8]; MAX_CHUNKS]) {
    let (t, tpr, k) = me;
    let first = if SLICE { first } else { 0 };
    let lanes = E::LANES as u64;
    let after = first + tpr * k as u64;
    let mut va = [[0u32; 4]; MAX_CHUNKS];
    let mut vb = [[0u32; 4]; MAX_CHUNKS];
    // `&`, not `&&`: no branch between the loads (a branch per load made each wait for the
    // one before it).
    unroll!(j < k => {
        let c = first + t + j as u64 * tpr;
        // SAFETY: a whole vector lies inside the row (caller's contract), at a 16-byte
        // boundary.
        unsafe {
            va[j] = ld_v4_if(a.0.base + c * 16, a.1 & a.0.whole::<E>(c, hidden));
            vb[j] = ld_v4_if(b.0.base + c * 16, b.1 & b.0.whole::<E>(c, hidden));
        }
    });
    // A slice's vector after its last chunk, by thread 0, when it lies wholly inside the row
    // (a whole row's never does).
    let (mut a_after, mut b_after) = ([0u32; 4], [0u32; 4]);
    if SLICE {
        let t0 = t == 0;
        // SAFETY: as above.
        unsafe {
            a_after = ld_v4_if(
                a.0.base + after * 16,
                t0 & a.1 & a.0.whole::<E>(after, hidden),
            );
            b_after = ld_v4_if(
                b.0.base + after * 16,
                t0 & b.1 & b.0.whole::<E>(after, hidden),
            );
        }
    }
    // The edge vectors: lane `t < 4L` of the row takes element `t % L` of vector `t / L` of
    // [a's first, a's last, b's first, b's last] (a last vector that is also the first is
    // the first's).
    let group = t / lanes;
    let ((at, ok), first_edge) = (if group < 2 { a } else { b }, group % 2 == 0);
    let q = if first_edge {
        0
    } else {
        (hidden + at.m).saturating_sub(1) / lanes
    };
    // Only the vectors of this block's slots (the slice's chunks and the one after them).
    let here = !SLICE || ((q >= first) & (q <= after));
    let edge = (group < 4) & at.straddles::<E>(q, hidden) & (first_edge | (q != 0)) & here;
    let pos = q * lanes + t % lanes;
    let inside = (pos >= at.m) & (pos < hidden + at.m);
    // SAFETY: a column of the row (caller's contract).
    let edge_bits = unsafe { E::load_bits_if(at.base + pos * E::BYTES, edge & ok & inside) };

    let smem = smem_f32() as *mut u32;
    let b_first = stage.first_word + stage.vectors * 4;
    // SAFETY: vector slots `< vectors` of this row's two areas (slot `c - first` for vector
    // `c`), inside the launch's dynamic shared memory (caller's contract), 16-byte aligned
    // (every offset is a multiple of 16 bytes from the 16-byte aligned base). Each slot is
    // written once: by its owner unless it straddles an end of the row, else element by
    // element by the edge lanes; the slot after the last chunk by thread 0 unless it
    // straddles (zeros past the row).
    unsafe {
        let slot =
            |area: u32, c: u64| smem.add((area + (c - first) as u32 * 4) as usize) as *mut Vector;
        unroll!(j < k => {
            let c = first + t + j as u64 * tpr;
            if !a.0.straddles::<E>(c, hidden) {
                *slot(stage.first_word, c) = Vector(va[j]);
            }
            if !b.0.straddles::<E>(c, hidden) {
                *slot(b_first, c) = Vector(vb[j]);
            }
        });
        if t == 0 {
            if !a.0.straddles::<E>(after, hidden) {
                *slot(stage.first_word, after) = Vector(a_after);
            }
            if !b.0.straddles::<E>(after, hidden) {
                *slot(b_first, after) = Vector(b_after);
            }
        }
        if edge {
            let area = if group < 2 { stage.first_word } else { b_first };
            let byte = (area as u64 + (q - first) * 4) * 4 + (t % lanes) * E::BYTES;
            if E::BYTES == 2 {
                *((smem as *mut u8).add(byte as usize) as *mut u16) = edge_bits as u16;
            } else {
                *((smem as *mut u8).add(byte as usize) as *mut u32) = edge_bits;
            }
        }
    }
    sync_block();
    let mut xa = [[0.0f32; 8]; MAX_CHUNKS];
    let mut xb = [[0.0f32; 8]; MAX_CHUNKS];
    unroll!(j < k => {
        let slot = t + j as u64 * tpr;
        // SAFETY: as above; written before the barrier.
        unsafe {
            xa[j] = E::unpack(staged_chunk::<E>(smem, stage.first_word, slot, a.0.m));
            xb[j] = E::unpack(staged_chunk::<E>(smem, b_first, slot, b.0.m));
        }
    });
    (xa, xb)
}

/// The chunk in slot `c` of a staged row or slice (its first vector at word `first`) whose
/// column 0 is `m` elements into vector 0: the 16 bytes from byte `16 c + m * BYTES`, as four
/// word reads and, for an odd 16-bit offset, a funnel shift.
///
/// # Safety
/// Words `first + 4c .. first + 4c + 8` are inside the staging area.
#[inline(always)]
unsafe fn staged_chunk<E: Elem>(smem: *mut u32, first: u32, c: u64, m: u64) -> [u32; 4] {
    let bytes = (m * E::BYTES) as u32;
    let word = first + c as u32 * 4 + bytes / 4;
    let mut w = [0u32; 5];
    // SAFETY: the caller's contract.
    unroll!(i < 5 => { w[i] = unsafe { *smem.add(word as usize + i) }; });
    let mut out = [0u32; 4];
    unroll!(i < 4 => {
        out[i] = if E::BYTES == 2 {
            funnel_shift_right(w[i], w[i + 1], 8 * (bytes % 4))
        } else {
            w[i]
        };
    });
    out
}

/// Elements `m .. m + L` of the `2L` elements `lo` then `hi` (`m < L`): a byte shift of the
/// 32-byte pair by `m * BYTES`, as two word selects and a funnel shift.
#[inline(always)]
fn window<E: Elem>(lo: [u32; 4], hi: [u32; 4], m: u64) -> [u32; 4] {
    let w = [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]];
    let bytes = (m * E::BYTES) as u32;
    let words = bytes / 4;
    let mut by2 = [0u32; 6];
    unroll!(i < 6 => { by2[i] = if words & 2 != 0 { w[i + 2] } else { w[i] }; });
    let mut by1 = [0u32; 5];
    unroll!(i < 5 => { by1[i] = if words & 1 != 0 { by2[i + 1] } else { by2[i] }; });
    let mut out = [0u32; 4];
    unroll!(i < 4 => {
        out[i] = if E::BYTES == 2 {
            funnel_shift_right(by1[i], by1[i + 1], 8 * (bytes % 4))
        } else {
            by1[i]
        };
    });
    out
}

/// Stores chunk `c` of the row `at` (values `v`, rounded to nearest even in the storage dtype)
/// when `ok`. Every lane of the warp must call it (shuffles); `lane` is this thread's lane.
///
/// # Safety
/// When `ok`, `at` is a row of `hidden` elements of a checked output and `c` a chunk of it;
/// the threads owning chunks `c - 1` and `c + 1` of the same row are this thread's left and
/// right neighbours in the warp unless it is lane 0 or 31, and they call this with the same
/// `at`, `hidden` and `ok` except for their chunk's own bound (`c < chunks`).
#[inline(always)]
pub(super) unsafe fn store_chunk<E: Elem>(
    at: Shifted,
    c: u64,
    hidden: u64,
    ok: bool,
    lane: u32,
    v: &[f32; 8],
) {
    let l = E::LANES as u64;
    let own = E::pack(v);
    let from_left = shfl_up_1(own);
    let skewed = at.m != 0;
    // Aligned vector c: the last m elements of chunk c - 1, then the first L - m of chunk c.
    let vector = if skewed {
        window::<E>(from_left, own, l - at.m)
    } else {
        own
    };
    let head_by_vector = ok && at.whole::<E>(c, hidden) && (lane != 0 || !skewed);
    // SAFETY: a whole vector of the row, at a 16-byte boundary.
    unsafe { st_v4_if(at.base + c * 16, vector, head_by_vector) };
    // The chunk's last m elements are in vector c + 1, which the right neighbour stores when
    // it is whole and the neighbour is in this warp.
    let tail_by_vector = !skewed || (at.whole::<E>(c + 1, hidden) && lane != 31);
    if ok && !(head_by_vector && tail_by_vector) {
        unroll!(i < E::LANES => {
            let col = c * l + i as u64;
            let in_head = (i as u64) < l - at.m;
            let store = col < hidden && if in_head { !head_by_vector } else { !tail_by_vector };
            let bits = if E::BYTES == 2 { own[i / 2] >> (16 * (i as u32 % 2)) } else { own[i] };
            // SAFETY: column col < hidden of the row (caller's contract).
            unsafe { E::store_bits_if(at.base + (col + at.m) * E::BYTES, bits, store) };
        });
    }
}
