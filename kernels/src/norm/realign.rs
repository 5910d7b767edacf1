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
//! the first `m` lanes of vector `c + 1`. The thread owning chunk slot `c` copies vector `c`
//! into shared memory (`cp.async`: no register holds it in flight, so every copy of the phase
//! is in flight at once), and after a block barrier every thread reads its chunks from there
//! at the row's offset. The two vectors that straddle the row's ends are read element by
//! element by the lanes of the row's first warp, one element each (nothing outside the row is
//! touched). A whole row's forward also stages the weight, by chunk, once per block.
//! (Shuffles instead of shared memory need the vector after each warp's last chunk in the
//! warp's last lane: twice the registers, and a quarter of the occupancy.)
//!
//! # Stores
//! A whole row's forward ([`fwd`]) keeps the staging until it is done and stores by aligned
//! vector of each output: the thread owning slot `q` forms vector `q` of `h` (of `y`) from the
//! staged columns that vector holds, with the same per-element operations as the chunk that
//! owns them, and stores it as one 16-byte access (the two vectors that straddle the row's
//! ends element by element). Only the sum of squares follows the chunk map; no thread needs
//! another's values.
//!
//! A split block whose operands sit at one offset (dense tensors of one layout) keeps its
//! staging too and stores by aligned vector ([`fwd_split_by_vector`]). Otherwise
//! ([`store_chunk`], for the split's tiles held in registers) it uses the mirror image of the
//! loads: aligned vector `c` is the last `m` lanes of chunk `c - 1` (shuffled
//! over from the left neighbour) followed by the first `L - m` of chunk `c`, stored by the
//! owner of chunk `c` as one 16-byte store when the vector is wholly inside the row and the
//! owner is not the first lane of its warp (whose left neighbour is in another warp). Every
//! element no vector store covers is stored alone by the thread that owns it, so each element
//! is written exactly once, by one thread.
//!
//! # Slices of a row
//! A cluster-split block holds chunks `first .. first + T * K` of its row (`split`): it
//! stages their vectors and the one after them (thread 0 copies it when it lies wholly inside
//! the row; its first `m` elements are the slice's). The row's edge vectors are staged by the
//! block whose slots they fall in. By chunk, stores need nothing more: a slice's first and
//! last chunks are held by the first and last lanes of warps, which store the elements their
//! vectors share with a neighbour one by one. By vector, the block stores the vectors of its
//! slots, the first of which holds the previous slice's last `m` columns.
//!
//! # Tiles of a looped row
//! A row longer than a block's registers hold ([`fwd_loop`]) is staged a tile at a time, with
//! one more vector before the tile than a slice has, so that the tile's output vectors can be
//! formed from the staging whatever the offsets of the inputs and outputs; the weight and `h`
//! (read back for `y`) are staged the same way, as a second pass.
//!
//! # Reads at a known offset
//! Where every operand of a row sits at the same offset `m` (dense tensors of one layout), an
//! output vector's columns are the staged vector in its own slot, and a chunk is the 16 bytes
//! `m` elements into its slot's vector and the next: with `m` known at compile time, one or two
//! 16-byte reads and a fixed funnel shift per word, free of bank conflicts, where a shift known
//! only at run time takes five conflicting word reads (or selects). The whole-row (16 per
//! thread, one row per block) and looped kernels of 16-bit rows are therefore compiled once per
//! offset (`at_offset`) besides the run-time form, which rows whose operands sit at different
//! offsets take; the bits are the same either way.
//!
//! # Aliasing
//! Every load of the row is issued and completed before the staging barrier and every store
//! comes after it, so in-place forms read each element before anyone overwrites it. A slice's
//! vector after its last chunk holds elements of the next block's slice, which that block may
//! be overwriting: those lanes are loaded but never used.

use core::intrinsics::fmaf32;
use core::num::NonZeroU64;

use ferrofuse_common::{
    RMSNORM_GEMMA, RMSNORM_HF, RMSNORM_LOOP_SMEM_BYTES, RMSNORM_SMEM_BYTES,
    RMSNORM_SPLIT_SMEM_BYTES, RMSNORM_W_F32, RmsNormFwdParams,
};

use crate::mem::{
    Elem, F32, cp_async_16_if, cp_async_wait_all, funnel_shift_right, grid, grid_dependency_sync,
    ld_shared_window, ld_v4_if, shfl_up_1, st_v4_if,
};
use crate::reduce::{row_sum, smem_f32, sync_block};

use super::{MAX_CHUNKS, Me, add_residual, normalize, prefetch_first, rstd_of, split};
use crate::cluster;

/// One operand's row: the 16-byte boundary at or before column 0 and column 0's offset from it.
#[derive(Clone, Copy)]
pub(super) struct Shifted {
    /// Byte address of aligned vector 0.
    pub(super) base: u64,
    /// Elements between `base` and column 0 (`< L`).
    pub(super) m: u32,
}

impl Shifted {
    /// Row `index` of the matrix at `base` whose rows are `stride` elements apart.
    #[inline(always)]
    pub(super) fn of<E: Elem>(base: u64, stride: u64, index: u64) -> Self {
        let first = base + index * stride * E::BYTES;
        let skew = first & 15;
        Shifted {
            base: first - skew,
            m: (skew / E::BYTES) as u32,
        }
    }

    /// Whether aligned vector `q` holds only columns of the row (`0 .. hidden`).
    #[inline(always)]
    pub(super) fn whole<E: Elem>(&self, q: u32, hidden: u32) -> bool {
        let l = E::LANES as u32;
        (q * l >= self.m) & (q * l + l <= hidden + self.m)
    }

    /// Whether aligned vector `q` holds some, but not only, columns of the row.
    #[inline(always)]
    fn straddles<E: Elem>(&self, q: u32, hidden: u32) -> bool {
        let l = E::LANES as u32;
        q * l < hidden + self.m && !self.whole::<E>(q, hidden)
    }
}

/// 16 bytes of shared memory, aligned so one access moves them.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Vector([u32; 4]);

/// First word of the weight's staging area in a realigned forward block: after the
/// reduction buffers.
const WEIGHT_FIRST_WORD: u32 = RMSNORM_SMEM_BYTES / 4;

/// Where one row's staged operands live: the word index of operand 0's vector 0 in the
/// block's dynamic shared memory, and the vectors per operand; how they are read off the
/// 16-byte grid (`wide`: see [`staged_at`]).
#[derive(Clone, Copy)]
pub(super) struct Stage {
    first_word: u32,
    vectors: u32,
    wide: bool,
}

impl Stage {
    /// The staging area of row `r_local` of the block, for rows of `tpr` threads holding `k`
    /// chunks each, after the reduction buffers (`RMSNORM_SMEM_BYTES`) and the weight's area
    /// (`w_vectors` vectors per chunk slot; see [`stage_weight`]).
    /// `ferrofuse_common::rmsnorm_realigned_smem_bytes` is the size of the whole.
    #[inline(always)]
    pub(super) fn of_row(r_local: u64, tpr: u64, k: usize, w_vectors: u32) -> Self {
        let slots = (tpr * k as u64) as u32;
        let vectors = slots + 1;
        Stage {
            first_word: WEIGHT_FIRST_WORD
                + slots * w_vectors * 4
                + r_local as u32 * 2 * vectors * 4,
            vectors,
            // Word reads: window reads, free of bank conflicts, cost more instructions than
            // they saved here (and with four chunks per thread did not fit 64 registers).
            wide: false,
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
            wide: true,
        }
    }
}

/// A thread's chunks `first + t + j * tpr` (`j < k`, with `(t, tpr, k)` as `me`) of two
/// operands' rows, each `(row, ok)`, as f32 lanes (zeros where not `ok`). `first` is 0
/// unless `SLICE`: then the block holds the row's chunks `first .. first + tpr * k` (a split
/// forward block's tiles). The slot after the last chunk holds the vector after it (the last
/// `m` columns of the last chunk), or zeros past the row.
///
/// Each thread copies the aligned vectors of its chunk slots that lie wholly inside the row
/// to shared memory (`stage`), every copy of both operands started before any is waited for.
/// The vectors that straddle an end of the row (its first when column 0 is off the grid, its
/// last when the row does not end on it) are read element by element by the row's first warp,
/// one element per lane, with no branch. After a block barrier each thread reads its chunks
/// back at the row's offset. Every thread of the block must call it.
///
/// # Safety
/// For each operand, when `ok`: its row is a row of `hidden` elements of a checked operand.
/// The launch has `rmsnorm_realigned_smem_bytes` of dynamic shared memory.
#[inline(always)]
pub(super) unsafe fn load_pair<E: Elem, const SLICE: bool>(
    a: (Shifted, bool),
    b: (Shifted, bool),
    me: (u32, u32, usize),
    stage: Stage,
    hidden: u32,
    first: u32,
) -> ([[f32; 8]; MAX_CHUNKS], [[f32; 8]; MAX_CHUNKS]) {
    let (t, tpr, k) = me;
    // SAFETY: the caller's contract.
    unsafe { stage_pair::<E, SLICE>(a, b, me, stage, hidden, first, || {}) };
    let mut xa = [[0.0f32; 8]; MAX_CHUNKS];
    let mut xb = [[0.0f32; 8]; MAX_CHUNKS];
    unroll!(j < k => {
        // SAFETY: staged above.
        (xa[j], xb[j]) = unsafe { stage.pair::<E>(t + j as u32 * tpr, a.0.m, b.0.m) };
    });
    (xa, xb)
}

/// The staging half of [`load_pair`] (same arguments and contract): every vector of the
/// block's slots written to `stage`, then a block barrier; [`Stage::pair`] reads the chunks.
/// `before_wait` runs after every copy and edge load is issued, before the wait for them
/// (staging of the caller's whose loads should overlap those: [`stage_weight_tail`]).
#[inline(always)]
unsafe fn stage_pair<E: Elem, const SLICE: bool>(
    a: (Shifted, bool),
    b: (Shifted, bool),
    me: (u32, u32, usize),
    stage: Stage,
    hidden: u32,
    first: u32,
    before_wait: impl FnOnce(),
) {
    let (t, tpr, k) = me;
    let first = if SLICE { first } else { 0 };
    let lanes = E::LANES as u32;
    let after = first + tpr * k as u32;
    let smem = smem_f32() as *mut u32;
    let b_first = stage.first_word + stage.vectors * 4;
    let slot = |area: u32, c: u32| {
        // SAFETY: slot `c - first < vectors` of one of this row's two areas, inside the
        // launch's dynamic shared memory (caller's contract); pointer arithmetic only.
        unsafe { smem.add((area + (c - first) * 4) as usize) }
    };
    // Each slot is written once: by its owner, as an asynchronous copy of its vector (zeros
    // when it lies past the row or the operand is absent), unless it straddles an end of the
    // row; then element by element by the edge lanes below. The slot after the last chunk by
    // thread 0 likewise. The copies need no registers, so every load of the phase is
    // in flight at once whatever the chunks per thread.
    unroll!(j < k => {
        let c = first + t + j as u32 * tpr;
        // SAFETY: a 16-byte aligned slot; the source, when read, a whole vector inside the row
        // (caller's contract) at a 16-byte boundary.
        unsafe {
            cp_async_16_if(slot(stage.first_word, c), a.0.base + c as u64 * 16,
                a.1 & a.0.whole::<E>(c, hidden), !a.0.straddles::<E>(c, hidden));
            cp_async_16_if(slot(b_first, c), b.0.base + c as u64 * 16,
                b.1 & b.0.whole::<E>(c, hidden), !b.0.straddles::<E>(c, hidden));
        }
    });
    // The vector after the last slot, by thread 0 (a whole row's is past the row: zeros).
    {
        let t0 = t == 0;
        // SAFETY: as above.
        unsafe {
            cp_async_16_if(
                slot(stage.first_word, after),
                a.0.base + after as u64 * 16,
                a.1 & a.0.whole::<E>(after, hidden),
                t0 & !a.0.straddles::<E>(after, hidden),
            );
            cp_async_16_if(
                slot(b_first, after),
                b.0.base + after as u64 * 16,
                b.1 & b.0.whole::<E>(after, hidden),
                t0 & !b.0.straddles::<E>(after, hidden),
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
    let edge_bits = unsafe { E::load_bits_if(at.base + pos as u64 * E::BYTES, edge & ok & inside) };
    // SAFETY: a slot of this row's areas (as above), written by the edge lanes only.
    unsafe {
        if edge {
            let area = if group < 2 { stage.first_word } else { b_first };
            let byte = (area + (q - first) * 4) * 4 + (t % lanes) * E::BYTES as u32;
            if E::BYTES == 2 {
                *((smem as *mut u8).add(byte as usize) as *mut u16) = edge_bits as u16;
            } else {
                *((smem as *mut u8).add(byte as usize) as *mut u32) = edge_bits;
            }
        }
    }
    before_wait();
    cp_async_wait_all();
    sync_block();
}

impl Stage {
    /// `L` elements of a staged operand (`second`: the second one; column 0 `m` elements into
    /// its vector 0) from column `col`, which may be up to `L - 1` before column 0 (a wrapped
    /// `u32`: the lanes before the row hold other words of shared memory), as f32 lanes.
    ///
    /// # Safety
    /// The operands are staged ([`stage_pair`]) and the launch has the staging's spare bytes
    /// after the block's last area (`rmsnorm_realigned_smem_bytes`).
    #[inline(always)]
    unsafe fn columns<E: Elem>(self, second: bool, col: u32, m: u32) -> [f32; 8] {
        let first = self.first_word + if second { self.vectors * 4 } else { 0 };
        let byte = (first * 4).wrapping_add(col.wrapping_add(m).wrapping_mul(E::BYTES as u32));
        // SAFETY: the caller's contract; areas lie after the reduction buffers, so a column
        // up to L - 1 before column 0 is still inside the shared memory.
        E::unpack(unsafe { staged_at::<E>(smem_f32() as *mut u32, byte, self.wide) })
    }

    /// The chunks in slot `c` of both staged operands (column 0 `ma` and `mb` elements into
    /// their vector 0), as f32 lanes.
    ///
    /// # Safety
    /// Slot `c` is one of the block's slots and [`stage_pair`] has staged them.
    #[inline(always)]
    pub(super) unsafe fn pair<E: Elem>(self, c: u32, ma: u32, mb: u32) -> ([f32; 8], [f32; 8]) {
        let smem = smem_f32() as *mut u32;
        let b_first = self.first_word + self.vectors * 4;
        // SAFETY: the caller's contract; words `4c .. 4c + 8` of an area of `vectors`
        // vectors, as `c < vectors - 1`.
        unsafe {
            (
                E::unpack(staged_chunk::<E>(smem, self.first_word, c, ma, self.wide)),
                E::unpack(staged_chunk::<E>(smem, b_first, c, mb, self.wide)),
            )
        }
    }
}

impl Stage {
    /// [`Stage::pair`] in a body compiled for offset `M` of both operands (at run time when
    /// `M` is [`ANY_OFFSET`]).
    ///
    /// # Safety
    /// As for [`Stage::pair`]; unless `M` is `ANY_OFFSET`, `M` is both operands' offset.
    #[inline(always)]
    unsafe fn pair_at<E: Elem, const M: u32>(
        self,
        c: u32,
        ma: u32,
        mb: u32,
    ) -> ([f32; 8], [f32; 8]) {
        if M == ANY_OFFSET {
            // SAFETY: the caller's contract.
            return unsafe { self.pair::<E>(c, ma, mb) };
        }
        let smem = smem_f32() as *mut u32;
        // `M < L`; the modulus only keeps the instances no row reaches (an f32 row's offsets
        // stop at 3) well-formed.
        let shift = (M * E::BYTES as u32) % 16;
        let b_first = self.first_word + self.vectors * 4;
        // SAFETY: the caller's contract: vectors `c` and `c + 1` of each area.
        unsafe {
            (
                E::unpack(staged_at_known_shift(smem, self.first_word + 4 * c, shift)),
                E::unpack(staged_at_known_shift(smem, b_first + 4 * c, shift)),
            )
        }
    }

    /// Staged vector `q` of both operands, as f32 lanes: an output vector's columns when the
    /// outputs sit at the inputs' offset ([`shared_offset`]).
    ///
    /// # Safety
    /// Vector `q` of each area is staged (it may be the spare vector after the last).
    #[inline(always)]
    unsafe fn vectors_at<E: Elem>(self, q: u32) -> ([f32; 8], [f32; 8]) {
        let smem = smem_f32() as *mut u32;
        let b_first = self.first_word + self.vectors * 4;
        // SAFETY: the caller's contract.
        unsafe {
            (
                E::unpack(staged_at_known_shift(smem, self.first_word + 4 * q, 0)),
                E::unpack(staged_at_known_shift(smem, b_first + 4 * q, 0)),
            )
        }
    }
}

/// The chunk in slot `c` of a staged row or slice (its first vector at word `first`) whose
/// column 0 is `m` elements into vector 0: the 16 bytes from byte `16 c + m * BYTES`.
///
/// # Safety
/// Words `first + 4c .. first + 4c + 8` are inside the staging area.
#[inline(always)]
unsafe fn staged_chunk<E: Elem>(
    smem: *mut u32,
    first: u32,
    c: u32,
    m: u32,
    wide: bool,
) -> [u32; 4] {
    // SAFETY: the caller's contract.
    unsafe { staged_at::<E>(smem, first * 4 + c * 16 + m * E::BYTES as u32, wide) }
}

/// The 16 bytes of shared memory from `byte` (a multiple of the element size). When `wide`:
/// the 16-byte vector there and, off the 16-byte grid, the one after it, read whole
/// ([`ld_shared_window`]); reads of 16 bytes by consecutive threads 16 bytes apart are free of
/// bank conflicts. Otherwise (fewer registers): five word reads, which conflict four ways, and
/// a funnel shift per word.
///
/// # Safety
/// The vectors holding bytes `byte .. byte + 16` are inside the block's dynamic shared memory.
#[inline(always)]
unsafe fn staged_at<E: Elem>(smem: *mut u32, byte: u32, wide: bool) -> [u32; 4] {
    if wide {
        // SAFETY: the caller's contract; the vector at the 16-byte boundary at or before byte.
        return unsafe { ld_shared_window(smem.add((byte / 16 * 4) as usize), byte % 16) };
    }
    let word = byte / 4;
    let mut w = [0u32; 5];
    // SAFETY: the caller's contract.
    unroll!(i < 5 => { w[i] = unsafe { *smem.add(word as usize + i) }; });
    let mut out = [0u32; 4];
    unroll!(i < 4 => {
        out[i] = if E::BYTES == 2 {
            funnel_shift_right(w[i], w[i + 1], 8 * (byte % 4))
        } else {
            w[i]
        };
    });
    out
}

/// Elements `m .. m + L` of the `2L` elements `lo` then `hi` (`m < L`): a byte shift of the
/// 32-byte pair by `m * BYTES`, as two word selects and a funnel shift.
#[inline(always)]
pub(super) fn window<E: Elem>(lo: [u32; 4], hi: [u32; 4], m: u32) -> [u32; 4] {
    let w = [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]];
    let bytes = m * E::BYTES as u32;
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

/// The offset parameter of a body compiled for offsets known only at run time.
const ANY_OFFSET: u32 = 8;

/// `$f::<$g.., M>($a..)` with `M` the constant equal to `$m` (an offset from the 16-byte grid in
/// elements, `< 8`): one instance of the body per offset, so that its staged reads are at
/// shifts known at compile time ([`staged_at_known_shift`]).
macro_rules! at_offset {
    ($m:expr, $f:ident::<$($g:tt),*>($($a:expr),* $(,)?)) => {
        match $m {
            0 => $f::<$($g,)* 0>($($a),*),
            1 => $f::<$($g,)* 1>($($a),*),
            2 => $f::<$($g,)* 2>($($a),*),
            3 => $f::<$($g,)* 3>($($a),*),
            4 => $f::<$($g,)* 4>($($a),*),
            5 => $f::<$($g,)* 5>($($a),*),
            6 => $f::<$($g,)* 6>($($a),*),
            _ => $f::<$($g,)* 7>($($a),*),
        }
    };
}

/// The offset from the 16-byte grid shared by a row's inputs and outputs (`x` and `y`, and
/// with a residual also it and `h`), if they share one, as dense tensors of one layout do,
/// and the kernel has bodies compiled for each offset. Then every output vector's columns are
/// one staged vector of each input (no shift), and every chunk sits at the same shift in each
/// input's staging.
///
/// Those bodies exist for 16-bit rows on sm_90: f32 rows take the run-time form (the
/// specialised whole-row body spilled at 64 registers, and f32 looped rows take the cluster
/// split), and so does sm_80 (where ptxas spilled the specialised 32-per-thread and looped
/// bodies).
#[inline(always)]
fn shared_offset<E: Elem>(
    x: Shifted,
    res: Shifted,
    h: Shifted,
    y: Shifted,
    has_res: bool,
) -> Option<u32> {
    let m = x.m;
    let shared = y.m == m && (!has_res || (res.m == m && h.m == m));
    (shared && E::BYTES == 2 && cfg!(target_feature = "sm_90")).then_some(m)
}

/// The 16 bytes of shared memory `shift` bytes (`< 16`, a multiple of 2) past the 16-byte
/// aligned word `word`. `shift` must be a constant once inlined (a body compiled for one
/// offset, [`at_offset`]): then the word choice is fixed and the read is one 16-byte load, or
/// two and a funnel shift per word; 16-byte loads by consecutive threads 16 bytes apart are
/// free of bank conflicts. (With `shift` known only at run time the choice takes selects:
/// [`ld_shared_window`].)
///
/// # Safety
/// The vector at `word` is inside the block's dynamic shared memory, and when `shift > 0`
/// the one after it.
#[inline(always)]
unsafe fn staged_at_known_shift(smem: *mut u32, word: u32, shift: u32) -> [u32; 4] {
    // SAFETY: the caller's contract; 16-byte aligned.
    let lo = unsafe { *(smem.add(word as usize) as *const Vector) }.0;
    if shift == 0 {
        return lo;
    }
    // SAFETY: as above.
    let hi = unsafe { *(smem.add(word as usize + 4) as *const Vector) }.0;
    let w = [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]];
    let (words, bits) = ((shift / 4) as usize, 8 * (shift % 4));
    let mut out = [0u32; 4];
    unroll!(i < 4 => {
        out[i] = if bits == 0 {
            w[words + i]
        } else {
            funnel_shift_right(w[words + i], w[words + i + 1], bits)
        };
    });
    out
}

/// The 16 bytes of shared memory from `back` bytes (a constant once inlined, as for
/// [`staged_at_known_shift`]) before the 16-byte aligned word `word`: a weight read for an
/// output vector of a row at offset `m` is `m` elements before the vector's slot.
///
/// # Safety
/// The vectors holding those bytes are inside the block's dynamic shared memory.
#[inline(always)]
unsafe fn staged_before_word(smem: *mut u32, word: u32, back: u32) -> [u32; 4] {
    let vectors = back.div_ceil(16);
    // SAFETY: the caller's contract.
    unsafe { staged_at_known_shift(smem, word.wrapping_sub(4 * vectors), vectors * 16 - back) }
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
    c: u32,
    hidden: u32,
    ok: bool,
    lane: u32,
    v: &[f32; 8],
) {
    let l = E::LANES as u32;
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
    unsafe { st_v4_if(at.base + c as u64 * 16, vector, head_by_vector) };
    // The chunk's last m elements are in vector c + 1, which the right neighbour stores when
    // it is whole and the neighbour is in this warp.
    let tail_by_vector = !skewed || (at.whole::<E>(c + 1, hidden) && lane != 31);
    if ok && !(head_by_vector && tail_by_vector) {
        // The elements stored one by one, as a bit mask built once per chunk (bit i: element
        // i): those inside the row (`ok`: the chunk starts inside it) whose vector, c for the
        // first L - m and c + 1 for the last m, is not stored whole. The addresses are one
        // 64-bit address and constant offsets.
        let below = |n: u32| (1u32 << n) - 1;
        let head = below(l - at.m);
        let not_whole =
            if head_by_vector { 0 } else { head } | if tail_by_vector { 0 } else { !head };
        let mask = below((hidden - c * l).min(l)) & not_whole;
        let first = at.base + (c * l + at.m) as u64 * E::BYTES;
        unroll!(i < E::LANES => {
            let bits = if E::BYTES == 2 { own[i / 2] >> (16 * (i as u32 % 2)) } else { own[i] };
            // SAFETY: when the bit is set, column c * L + i < hidden of the row (caller's
            // contract).
            unsafe { E::store_bits_where(first + i as u64 * E::BYTES, bits, mask & (1 << i)) };
        });
    }
}

/// The weight's staging in a realigned forward block: chunk slot `c` holds the weight of
/// chunk `c` in `w_vectors` vectors (one, or two for an f32 weight of a 16-bit row's 8-lane
/// chunks), at word `WEIGHT_FIRST_WORD + 4 * w_vectors * c`. The threads of the block's first
/// row stage it (the weight is every row's): whole vectors as asynchronous copies (zeros past
/// the row); the ragged last vector is [`stage_weight_tail`]'s. The caller's staging barrier
/// ([`stage_pair`]) makes them visible.
///
/// # Safety
/// `w` holds `hidden` elements (4 bytes each when `w_f32`, else of `E`), 16-byte aligned; the
/// launch's dynamic shared memory holds the area (`rmsnorm_realigned_smem_bytes`).
#[inline(always)]
unsafe fn stage_weight<E: Elem>(w: u64, w_f32: bool, me: (u32, u32, usize), hidden: u32, ok: bool) {
    let (t, tpr, k) = me;
    let smem = smem_f32() as *mut u32;
    let w_vectors = weight_vectors::<E>(w_f32);
    // Elements per vector.
    let wl = if w_f32 { 4 } else { E::LANES as u32 };
    unroll!(j < k => {
        let c = t + j as u32 * tpr;
        unroll!(i < 2 => {
            let v = c * w_vectors + i as u32;
            let whole = v * wl + wl <= hidden;
            let ragged = v * wl < hidden && !whole;
            // SAFETY: a 16-byte aligned vector of the area (the caller's contract); the source,
            // when read, a whole vector of the weight.
            unsafe {
                cp_async_16_if(
                    smem.add((WEIGHT_FIRST_WORD + v * 4) as usize),
                    w + v as u64 * 16,
                    whole,
                    ok & (i < w_vectors as usize) & !ragged,
                )
            };
        });
    });
}

/// The ragged last vector of the weight's staging ([`stage_weight`]), when the row does not end
/// on the grid: loaded element by element and stored by the owner of its chunk slot. Called
/// after the block's copies of x and the residual are issued (the `before_wait` of
/// [`stage_pair`]), so that its loads' latency overlaps theirs: the store waits for the loads,
/// and called before them it held the owner's warp, and so the block's barrier, for both
/// latencies in turn.
///
/// # Safety
/// As for [`stage_weight`], with the same arguments; before the staging barrier.
#[inline(always)]
unsafe fn stage_weight_tail<E: Elem>(
    w: u64,
    w_f32: bool,
    me: (u32, u32, usize),
    hidden: u32,
    ok: bool,
) {
    let (t, tpr, _) = me;
    let w_vectors = weight_vectors::<E>(w_f32);
    let wl = if w_f32 { 4 } else { E::LANES as u32 };
    let last = (hidden - 1) / wl;
    if ok && hidden % wl != 0 && (last / w_vectors) % tpr == t {
        let mut bits = [0u32; 4];
        unroll!(i < 4 => {
            if E::BYTES == 4 || w_f32 {
                let col = last * 4 + i as u32;
                // SAFETY: a column of the weight.
                bits[i] = unsafe { F32::load_bits_if(w + col as u64 * 4, col < hidden) };
            } else {
                let col = last * 8 + 2 * i as u32;
                // SAFETY: columns of the weight.
                let lo = unsafe { E::load_bits_if(w + col as u64 * 2, col < hidden) };
                let hi = unsafe { E::load_bits_if(w + col as u64 * 2 + 2, col + 1 < hidden) };
                bits[i] = lo | hi << 16;
            }
        });
        let smem = smem_f32() as *mut u32;
        // SAFETY: the caller's contract; no copy writes this vector.
        unsafe {
            *(smem.add((WEIGHT_FIRST_WORD + last * 4) as usize) as *mut Vector) = Vector(bits)
        };
    }
}

/// Vectors per chunk slot in the weight's staging: an f32 weight of a 16-bit row takes two.
#[inline(always)]
pub(super) fn weight_vectors<E: Elem>(w_f32: bool) -> u32 {
    if w_f32 && E::BYTES == 2 { 2 } else { 1 }
}

/// The weight factors of the `L` columns from `col` (as in [`Stage::columns`]) from the
/// staging ([`stage_weight`]): `w`, or `1 + w` for Gemma, widened to f32.
///
/// # Safety
/// The weight is staged and the staging barrier passed.
#[inline(always)]
pub(super) unsafe fn staged_weight<E: Elem>(col: u32, w_f32: bool, gemma: bool) -> [f32; 8] {
    let smem = smem_f32() as *mut u32;
    let byte = |bytes: u32| (WEIGHT_FIRST_WORD * 4).wrapping_add(col.wrapping_mul(bytes));
    // SAFETY: the caller's contract; the area lies after the reduction buffers.
    let mut f = unsafe {
        if w_f32 && E::BYTES == 2 {
            let (lo, hi) = (
                F32::unpack(staged_at::<F32>(smem, byte(4), false)),
                F32::unpack(staged_at::<F32>(smem, byte(4).wrapping_add(16), false)),
            );
            [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]]
        } else if w_f32 {
            F32::unpack(staged_at::<F32>(smem, byte(4), false))
        } else {
            E::unpack(staged_at::<E>(smem, byte(E::BYTES as u32), false))
        }
    };
    if gemma {
        unroll!(l < E::LANES => { f[l] = 1.0 + f[l]; });
    }
    f
}

/// [`staged_weight`] of output vector `q` of a row at offset `M` (a body compiled for it): the
/// columns from `q L - M`.
///
/// # Safety
/// As for [`staged_weight`].
#[inline(always)]
unsafe fn staged_weight_at<E: Elem, const M: u32>(q: u32, w_f32: bool, gemma: bool) -> [f32; 8] {
    let smem = smem_f32() as *mut u32;
    let first = WEIGHT_FIRST_WORD + 4 * weight_vectors::<E>(w_f32) * q;
    let back = M * if w_f32 { 4 } else { E::BYTES as u32 };
    // SAFETY: the caller's contract; the area lies after the reduction buffers, which hold
    // the bytes before column 0.
    let mut f = unsafe {
        if w_f32 && E::BYTES == 2 {
            let (lo, hi) = (
                F32::unpack(staged_before_word(smem, first, back)),
                F32::unpack(staged_before_word(smem, first + 4, back)),
            );
            [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]]
        } else if w_f32 {
            F32::unpack(staged_before_word(smem, first, back))
        } else {
            E::unpack(staged_before_word(smem, first, back))
        }
    };
    if gemma {
        unroll!(l < E::LANES => { f[l] = 1.0 + f[l]; });
    }
    f
}

/// The sum of squares of a thread's chunks in slots `t + j * tpr` (`j < k`, with
/// `(t, tpr, k)` as `me`) of the staged x and residual (offsets `mx` and `mr`), in the chunk
/// map's order; in a body compiled for offset `M` of both, or [`ANY_OFFSET`] (then as a loop
/// when `rolled`, see [`fwd`]).
///
/// # Safety
/// As for [`Stage::pair_at`], for each of the slots.
#[inline(always)]
unsafe fn sum_squares<E: Elem, const M: u32>(
    stage: Stage,
    me: (u32, u32, usize),
    (mx, mr): (u32, u32),
    has_res: bool,
    hf: bool,
    rolled: bool,
) -> f32 {
    let (t, tpr, k) = me;
    let mut acc = 0.0f32;
    if M == ANY_OFFSET && rolled {
        // The same chunks in the same order, as a loop whose bound is known only at run time.
        let mut c = t;
        while c < tpr * k as u32 {
            // SAFETY: the caller's contract.
            let (x, r) = unsafe { stage.pair::<E>(c, mx, mr) };
            let h = add_residual::<E>(&x, &r, has_res, hf);
            unroll!(l < E::LANES => { acc = fmaf32(h[l], h[l], acc); });
            c += tpr;
        }
        return acc;
    }
    unroll!(j < k => {
        // SAFETY: the caller's contract.
        let (x, r) = unsafe { stage.pair_at::<E, M>(t + j as u32 * tpr, mx, mr) };
        let h = add_residual::<E>(&x, &r, has_res, hf);
        unroll!(l < E::LANES => { acc = fmaf32(h[l], h[l], acc); });
    });
    acc
}

/// [`fwd`]'s outputs in a body compiled for the row's shared offset `M` ([`shared_offset`]):
/// vector `q` of `h` and of `y` (when `ok`) from staged vector `q` of x and the residual, the
/// same per-element operations as the chunks that hold those columns.
///
/// # Safety
/// As for [`fwd`]'s outputs: staged, `M` the offset of every operand, `h_row` and `y_row`
/// rows of the checked outputs.
#[inline(always)]
unsafe fn out_vector_at<E: Elem, const M: u32>(
    p: &RmsNormFwdParams,
    stage: Stage,
    (h_row, y_row): (Shifted, Shifted),
    rstd: f32,
    q: u32,
    ok: bool,
) {
    let has_res = p.residual != 0;
    let hf = p.flags & RMSNORM_HF != 0;
    let hidden = p.hidden as u32;
    // SAFETY: the caller's contract.
    let (x, r) = unsafe { stage.vectors_at::<E>(q) };
    let h = add_residual::<E>(&x, &r, has_res, hf);
    // SAFETY: a row of h; h may be x or the residual, whose every load was issued before the
    // staging barrier.
    unsafe { store_vector::<E>(h_row, q, hidden, ok && has_res, &h) };
    let (w_f32, gemma) = (p.flags & RMSNORM_W_F32 != 0, p.flags & RMSNORM_GEMMA != 0);
    // SAFETY: staged.
    let w = unsafe { staged_weight_at::<E, M>(q, w_f32, gemma) };
    let y = normalize::<E>(&h, rstd, &w, hf);
    // SAFETY: as for h; y may be x.
    unsafe { store_vector::<E>(y_row, q, hidden, ok, &y) };
}

/// Every output vector of [`fwd`]'s thread `t` ([`out_vector_at`] of its slots `t + j * tpr`,
/// `j < k`, with `(t, tpr, k)` as `me`; thread 0 also the vector after the last slot).
///
/// # Safety
/// As for [`out_vector_at`].
#[inline(always)]
unsafe fn out_vectors_at<E: Elem, const M: u32>(
    p: &RmsNormFwdParams,
    stage: Stage,
    outputs: (Shifted, Shifted),
    rstd: f32,
    me: (u32, u32, usize),
) {
    let (t, tpr, k) = me;
    // SAFETY: the caller's contract.
    unsafe {
        unroll!(j < k => { out_vector_at::<E, M>(p, stage, outputs, rstd, t + j as u32 * tpr, true); });
        out_vector_at::<E, M>(p, stage, outputs, rstd, tpr * k as u32, t == 0);
    }
}

/// Stores aligned vector `q` of the output row `at` (`v`: its columns `q L - m ..`, rounded to
/// nearest even in the storage dtype) when `ok`: one 16-byte store when the vector lies wholly
/// inside the row, else, for the two vectors that straddle its ends, the columns inside it
/// one by one.
///
/// # Safety
/// When `ok`, `at` is a row of `hidden` elements of a checked output.
#[inline(always)]
unsafe fn store_vector<E: Elem>(at: Shifted, q: u32, hidden: u32, ok: bool, v: &[f32; 8]) {
    // SAFETY: the caller's contract.
    unsafe { store_vector_bits::<E>(at, q, hidden, ok, E::pack(v)) };
}

/// [`store_vector`] of values already in the storage dtype (`bits`, as `Elem::pack` gives).
///
/// # Safety
/// As for [`store_vector`].
#[inline(always)]
unsafe fn store_vector_bits<E: Elem>(at: Shifted, q: u32, hidden: u32, ok: bool, bits: [u32; 4]) {
    // SAFETY: a whole vector of the row, at a 16-byte boundary.
    unsafe { st_v4_if(at.base + q as u64 * 16, bits, ok & at.whole::<E>(q, hidden)) };
    if ok && at.straddles::<E>(q, hidden) {
        let l = E::LANES as u32;
        unroll!(i < E::LANES => {
            let pos = q * l + i as u32;
            let inside = (pos >= at.m) & (pos < hidden + at.m);
            let b = if E::BYTES == 2 { bits[i / 2] >> (16 * (i as u32 % 2)) } else { bits[i] };
            // SAFETY: column pos - m of the row when inside.
            unsafe { E::store_bits_where(at.base + pos as u64 * E::BYTES, b, inside as u32) };
        });
    }
}

/// Forward of whole rows on the realigned path, `EPT` elements per thread, blocks of one row
/// (`ONE_ROW`) or of several; the chunk map and the arithmetic of [`super::fwd_regs`], so the
/// same bits.
///
/// Every input goes to shared memory first, as asynchronous copies that hold no registers
/// while in flight: x and the residual as the row's aligned vectors ([`stage_pair`]), the
/// weight by chunk ([`stage_weight`]). The staging stays until the block is done, so a
/// thread never holds its chunks through the reduction: it reads its chunks to sum their
/// squares, and after the reduction forms each output vector from the staged columns it
/// holds. No thread needs another's values (no shuffles), and registers hold a vector or two
/// at a time, not the row: more blocks per multiprocessor than a register-resident row allows.
///
/// # Safety
/// The host's plan: params checked (extents, the weight 16-byte aligned, aliasing), launched
/// with the geometry the params name and `rmsnorm_realigned_smem_bytes` of dynamic shared
/// memory.
#[inline(always)]
pub(super) unsafe fn fwd<E: Elem, const EPT: usize, const ONE_ROW: bool>(p: &RmsNormFwdParams) {
    let k = EPT / E::LANES;
    let Some(tpr) = NonZeroU64::new(p.threads_per_row as u64) else {
        return;
    };
    let me = Me::new::<ONE_ROW>(tpr);
    let row = grid::block_x() * p.rows_per_block as u64 + me.r_local;
    let live = row < p.rows;
    // A row held here has at most 16384 elements: indices fit 32 bits (64-bit compares and
    // products take two instructions each, and two registers per value).
    let (t, tpr, hidden) = (me.t as u32, me.tpr as u32, p.hidden as u32);
    let has_res = p.residual != 0;
    let hf = p.flags & RMSNORM_HF != 0;
    let gemma = p.flags & RMSNORM_GEMMA != 0;
    let w_f32 = p.flags & RMSNORM_W_F32 != 0;
    prefetch_first(p.x);
    let shifted = |base, stride| Shifted::of::<E>(base, stride, row);
    let (x_row, res_row) = (
        shifted(p.x, p.x_stride),
        shifted(p.residual, p.residual_stride),
    );
    let stage = Stage::of_row(me.r_local, me.tpr, k, weight_vectors::<E>(w_f32));
    grid_dependency_sync();

    // SAFETY: the host checked the operands and sized the shared memory; every thread of
    // the block gets here.
    unsafe { stage_row::<E>(p, (x_row, res_row), stage, &me, k, live) };
    // Dense operands of one layout share their offset: the body compiled for it reads the
    // staging at shifts known at compile time. Only for blocks of one row of 16 per thread,
    // and only where at most four such bodies run on a multiprocessor at once: more overflow
    // the instruction cache (rows at eight offsets, five or more to a multiprocessor: 1.15-1.35x
    // slower). That is rows of 256 threads or more (at most four such blocks fit a
    // multiprocessor's registers at 56 per thread, `KernelId::max_registers`) or an even row
    // stride (rows of 16-bit elements then sit at four offsets at most). At 32 per thread the
    // specialised bodies were slower (bench/TUNING.md).
    let outputs = || (shifted(p.h, p.h_stride), shifted(p.y, p.y_stride));
    let few_bodies = tpr >= 256 || p.x_stride % 2 == 0;
    let offset = if ONE_ROW && EPT == 16 && few_bodies {
        let (h_row, y_row) = outputs();
        shared_offset::<E>(x_row, res_row, h_row, y_row, has_res)
    } else {
        None
    };
    // The sum of squares over the thread's chunks, in the chunk map's order (chunks past the
    // row are zeros in the staging and add nothing).
    let ms = (x_row.m, res_row.m);
    // The run-time body's per-chunk reads and per-vector outputs as loops rather than
    // unrolled: each iteration is long, and at few rows a multiprocessor then fetches its
    // instructions once instead of once per chunk (the kernel's time there was mostly
    // instruction fetch). Not in the entry that also holds the bodies compiled per offset
    // (whole rows of 16 per thread): with the loops ptxas compiled those bodies longer, and
    // they were slower.
    let rolled = !(ONE_ROW && EPT == 16);
    // SAFETY: slots t + j * tpr < tpr * k, staged above; the staging is not written again.
    let acc = unsafe {
        match offset {
            Some(m) => at_offset!(
                m,
                sum_squares::<E>(stage, (t, tpr, k), ms, has_res, hf, false)
            ),
            None => sum_squares::<E, ANY_OFFSET>(stage, (t, tpr, k), ms, has_res, hf, rolled),
        }
    };
    // SAFETY: every thread of the block gets here; buffer 0's slots are the block's warps,
    // inside RMSNORM_SMEM_BYTES, before the staging.
    let sum_sq = unsafe { row_sum(acc, me.lane, me.warp, me.warps, me.slot(0)) };
    let rstd = rstd_of(sum_sq, p.hidden, p.eps);
    if !live {
        return;
    }
    if me.t == 0 && p.rstd != 0 {
        // SAFETY: row < rows; the host checked the rstd vector.
        unsafe { F32::store(p.rstd + row * p.rstd_stride * 4, rstd) };
    }
    // The outputs by aligned vector of each output row: vector `q` of `h` (of `y`) is formed
    // from the staged columns it holds, element by element with the same operations as the
    // chunk that holds them, so with the same bits; no thread needs another's values. The
    // thread owning slot `q` stores vector `q`, thread 0 also the one after the last slot
    // where that holds columns of the row.
    let (h_row, y_row) = outputs();
    if let Some(m) = offset {
        // SAFETY: staged above, every operand at offset m.
        unsafe {
            at_offset!(
                m,
                out_vectors_at::<E>(p, stage, (h_row, y_row), rstd, (t, tpr, k))
            )
        };
        return;
    }
    let lanes = E::LANES as u32;
    // Whether `h` (when stored) and `y` sit at the same offset from the grid (dense outputs of
    // one layout): then a vector's columns are the same in both.
    let h_m = if has_res { h_row.m } else { y_row.m };
    let same = h_m == y_row.m;
    // Whether the inputs sit there too: then an output vector's columns are the staged vector
    // in its own slot of each input, read without a shift.
    let unshifted = same && x_row.m == y_row.m && (!has_res || res_row.m == y_row.m);
    let out_vector = #[inline(always)]
    |q: u32| {
        let h_of = #[inline(always)]
        |m: u32| {
            let col = (q * lanes).wrapping_sub(m);
            // SAFETY: staged above (the spare bytes cover the vector after the last slot).
            let (x, r) = unsafe {
                if unshifted {
                    stage.vectors_at::<E>(q)
                } else {
                    (
                        stage.columns::<E>(false, col, x_row.m),
                        stage.columns::<E>(true, col, res_row.m),
                    )
                }
            };
            add_residual::<E>(&x, &r, has_res, hf)
        };
        let mut h = h_of(h_m);
        // SAFETY: a row of h (host-checked); h may be x or the residual, whose every load was
        // issued before the staging barrier.
        unsafe { store_vector::<E>(h_row, q, hidden, has_res, &h) };
        if !same {
            h = h_of(y_row.m);
        }
        // SAFETY: staged above.
        let w = unsafe { staged_weight::<E>((q * lanes).wrapping_sub(y_row.m), w_f32, gemma) };
        let y = normalize::<E>(&h, rstd, &w, hf);
        // SAFETY: as for h; y may be x.
        unsafe { store_vector::<E>(y_row, q, hidden, true, &y) };
    };
    // The vector after the last slot holds columns of the row only when an output's last
    // vector is it (the row's last chunk then straddles it); thread 0 stores it.
    let slots = tpr * k as u32;
    let spare = || t == 0 && hidden + h_m.max(y_row.m) > slots * lanes;
    if rolled {
        // The bound is known only at run time, so the loop stays a loop (see `rolled`).
        let end = slots + spare() as u32;
        let mut q = t;
        while q < end {
            out_vector(q);
            q += tpr;
        }
    } else {
        unroll!(j < k => { out_vector(t + j as u32 * tpr); });
        if spare() {
            out_vector(slots);
        }
    }
}

/// Stages the row's x and residual (`x_row`, `res_row`; a residual the call lacks as zeros)
/// in `stage` and, by the block's first row, the weight ([`stage_weight`]), then waits at a
/// block barrier: a whole row's staging for [`fwd`] and the FP8 forward.
///
/// # Safety
/// Every thread of the block calls it. When `live`, the row is a row of each checked operand;
/// the weight is 16-byte aligned; the launch has `rmsnorm_realigned_smem_bytes` of dynamic
/// shared memory, and `stage` is the row's area ([`Stage::of_row`]).
#[inline(always)]
pub(super) unsafe fn stage_row<E: Elem>(
    p: &RmsNormFwdParams,
    (x_row, res_row): (Shifted, Shifted),
    stage: Stage,
    me: &Me,
    k: usize,
    live: bool,
) {
    let (t, tpr, hidden) = (me.t as u32, me.tpr as u32, p.hidden as u32);
    let w_f32 = p.flags & RMSNORM_W_F32 != 0;
    let stages_weight = me.r_local == 0;
    // SAFETY: the caller's contract; `stage_pair`'s barrier also covers the weight's copies.
    unsafe {
        stage_weight::<E>(p.w, w_f32, (t, tpr, k), hidden, stages_weight);
        stage_pair::<E, false>(
            (x_row, live),
            (res_row, live && p.residual != 0),
            (t, tpr, k),
            stage,
            hidden,
            0,
            || stage_weight_tail::<E>(p.w, w_f32, (t, tpr, k), hidden, stages_weight),
        )
    };
}

/// Copies aligned vector `f - 1` of the row `at` (the one before a tile's first slot `f`,
/// wholly inside the row when `f > 0`) into the 16 bytes before the staging area whose slot 0
/// is at word `slot0`; zeros when `!ok` or `f == 0`. One thread (`mine`) issues it; the
/// caller's staging barrier ([`stage_pair`]) completes it.
///
/// # Safety
/// When `ok` and `f > 0`, `at` is a row of a checked operand with more than `f` vectors; the
/// four words before `slot0` are the area's spare slot.
#[inline(always)]
unsafe fn stage_before(at: Shifted, ok: bool, slot0: u32, f: u32, mine: bool) {
    let smem = smem_f32() as *mut u32;
    let q = f.saturating_sub(1);
    // SAFETY: the caller's contract; a 16-byte aligned slot, a whole vector of the row.
    unsafe {
        cp_async_16_if(
            smem.add((slot0 - 4) as usize),
            at.base + q as u64 * 16,
            ok & (f > 0),
            mine,
        )
    };
}

/// Forward of looped rows (longer than 32 elements per thread of a 512-thread block) on the
/// realigned path: the chunk map, tiles and sum of squares of the looped kernel
/// ([`super::fwd_loop`]), so the same bits, with 16-byte accesses at any offset.
///
/// Each tile is staged as in [`fwd`], with one more vector before it, so that every aligned
/// output vector of the tile's slots can be formed from it whatever the operands' offsets
/// (an output vector's columns reach one vector before and one after its slot's). Pass 1
/// stages x and the residual, sums the squares of the thread's chunks into the looped
/// kernel's tile ring, and stores `h` by aligned vector; pass 2 stages `h` as stored (`x`
/// without a residual) and the weight as a second operand (a row at offset 0), and stores `y`
/// by aligned vector. A barrier closes every tile, so the staging is not overwritten while
/// read, and pass 2 reads `h` after the barriers that follow its stores.
///
/// Aliasing: `h` may be `x` or the residual and `y` may be `x`, exactly, so at the same
/// offset; an output vector then has the columns of the input vector in its own slot, and the
/// vector before a tile, which may already hold the previous tile's output, is never used.
/// Every vector a tile reads is staged before any of its stores.
///
/// # Safety
/// The host's plan: params checked (extents, the weight 16-byte aligned and of the storage
/// dtype, aliasing, `hidden < 2^31`), one row of `RMSNORM_MAX_THREADS_PER_ROW` threads per
/// block, `rmsnorm_realigned_smem_bytes` of dynamic shared memory for its looped geometry.
#[inline(always)]
pub(super) unsafe fn fwd_loop<E: Elem>(p: &RmsNormFwdParams) {
    let row = grid::block_x();
    let shifted = |base, stride| Shifted::of::<E>(base, stride, row);
    let offset = shared_offset::<E>(
        shifted(p.x, p.x_stride),
        shifted(p.residual, p.residual_stride),
        shifted(p.h, p.h_stride),
        shifted(p.y, p.y_stride),
        p.residual != 0,
    );
    // A block is one row, so every thread takes the same body. Dense operands of one layout
    // share their offset: the body compiled for it reads the staging at shifts known at
    // compile time.
    // SAFETY: the caller's contract; `offset` is every operand's.
    unsafe {
        match offset {
            Some(m) => at_offset!(m, fwd_loop_at::<E>(p)),
            None => fwd_loop_at::<E, ANY_OFFSET>(p),
        }
    }
}

/// [`fwd_loop`] compiled for offset `M` of every operand ([`shared_offset`]), or
/// [`ANY_OFFSET`].
///
/// # Safety
/// As for [`fwd_loop`]; unless `M` is `ANY_OFFSET`, `M` is the offset of every operand.
#[inline(always)]
unsafe fn fwd_loop_at<E: Elem, const M: u32>(p: &RmsNormFwdParams) {
    let k = 16 / E::LANES;
    let Some(tpr) = NonZeroU64::new(p.threads_per_row as u64) else {
        return;
    };
    let me = Me::new::<true>(tpr);
    let row = grid::block_x();
    let live = row < p.rows;
    let nchunks = p.hidden.div_ceil(E::LANES as u64);
    let per_tile = me.tpr * k as u64;
    let tiles = nchunks.div_ceil(per_tile);
    // Rows below 2^31 elements (host-checked): indices fit 32 bits.
    let (t, tpr32, hidden, slots) = (me.t as u32, me.tpr as u32, p.hidden as u32, per_tile as u32);
    let has_res = p.residual != 0;
    let hf = p.flags & RMSNORM_HF != 0;
    let gemma = p.flags & RMSNORM_GEMMA != 0;
    prefetch_first(p.x);
    let shifted = |base, stride| Shifted::of::<E>(base, stride, row);
    let (x_row, res_row) = (
        shifted(p.x, p.x_stride),
        shifted(p.residual, p.residual_stride),
    );
    let (h_row, y_row) = (shifted(p.h, p.h_stride), shifted(p.y, p.y_stride));
    // After the tile ring: per operand, the vector before the tile, its slots and the one after.
    let stage = Stage {
        first_word: RMSNORM_LOOP_SMEM_BYTES / 4 + 4,
        vectors: slots + 2,
        wide: false,
    };
    let b_slot0 = stage.first_word + stage.vectors * 4;
    let lanes = E::LANES as u32;
    grid_dependency_sync();

    // Pass 1: h = x + residual, its squares summed per tile as the looped kernel does; h
    // stored by aligned vector.
    let mut sum_sq = 0.0f32;
    let mut tile = 0u64;
    while tile < tiles {
        let f = (tile * per_tile) as u32;
        // SAFETY: every thread of the block gets here; when live, row < rows (host-checked)
        // and the tile's vectors are the row's; the shared memory is the launch's.
        unsafe {
            stage_before(x_row, live, stage.first_word, f, t == 32);
            stage_before(res_row, live && has_res, b_slot0, f, t == 33);
            stage_pair::<E, true>(
                (x_row, live),
                (res_row, live && has_res),
                (t, tpr32, k),
                stage,
                hidden,
                f,
                || {},
            );
        }
        let ms = (x_row.m, res_row.m);
        // SAFETY: slots of the tile, staged above.
        let acc = unsafe { sum_squares::<E, M>(stage, (t, tpr32, k), ms, has_res, hf, false) };
        // SAFETY: every thread of the block calls it for every tile in order; the ring is the
        // first RMSNORM_LOOP_SMEM_BYTES of the launch's shared memory.
        sum_sq = unsafe { split::ring_tile_sum(sum_sq, acc, &me, tile, tiles) };
        if has_res {
            // Vector `f + s` of h from the staged columns it holds (the row's vector after the
            // last tile by thread 0).
            let out_h = |s: u32, ok: bool| {
                let col = (s * lanes).wrapping_sub(h_row.m);
                // SAFETY: staged above; columns up to one vector before and after the slots.
                let (x, r) = unsafe {
                    if M == ANY_OFFSET {
                        (
                            stage.columns::<E>(false, col, x_row.m),
                            stage.columns::<E>(true, col, res_row.m),
                        )
                    } else {
                        stage.vectors_at::<E>(s)
                    }
                };
                let h = add_residual::<E>(&x, &r, has_res, hf);
                // SAFETY: a row of h (host-checked), whose loads this tile issued before the
                // staging barrier.
                unsafe { store_vector::<E>(h_row, f + s, hidden, ok, &h) };
            };
            unroll!(j < k => { out_h(t + j as u32 * tpr32, live); });
            out_h(slots, live && t == 0 && tile + 1 == tiles);
        }
        sync_block();
        tile += 1;
    }
    let rstd = rstd_of(sum_sq, p.hidden, p.eps);
    if !live {
        return;
    }
    if me.t == 0 && p.rstd != 0 {
        // SAFETY: row < rows; the host checked the rstd vector.
        unsafe { F32::store(p.rstd + row * p.rstd_stride * 4, rstd) };
    }
    // Pass 2: h as stored (x when there is no residual), rounded to the storage dtype as the
    // looped kernel reads it back, and the weight (a row at offset 0), staged per tile.
    let src = if has_res { h_row } else { x_row };
    let w_row = Shifted { base: p.w, m: 0 };
    let mut tile = 0u64;
    while tile < tiles {
        let f = (tile * per_tile) as u32;
        // SAFETY: as in pass 1; h was stored by this block before the last pass-1 barrier.
        unsafe {
            stage_before(src, true, stage.first_word, f, t == 32);
            stage_before(w_row, true, b_slot0, f, t == 33);
            stage_pair::<E, true>(
                (src, true),
                (w_row, true),
                (t, tpr32, k),
                stage,
                hidden,
                f,
                || {},
            );
        }
        let out_y = |s: u32, ok: bool| {
            let col = (s * lanes).wrapping_sub(y_row.m);
            let smem = smem_f32() as *mut u32;
            // SAFETY: as in pass 1.
            let (h, mut w) = unsafe {
                if M == ANY_OFFSET {
                    (
                        stage.columns::<E>(false, col, src.m),
                        stage.columns::<E>(true, col, 0),
                    )
                } else {
                    (
                        E::unpack(staged_at_known_shift(smem, stage.first_word + 4 * s, 0)),
                        E::unpack(staged_before_word(
                            smem,
                            b_slot0 + 4 * s,
                            M * E::BYTES as u32,
                        )),
                    )
                }
            };
            if gemma {
                unroll!(l < E::LANES => { w[l] = 1.0 + w[l]; });
            }
            let y = normalize::<E>(&h, rstd, &w, hf);
            // SAFETY: a row of y (host-checked); y may be x, staged before this store.
            unsafe { store_vector::<E>(y_row, f + s, hidden, ok, &y) };
        };
        unroll!(j < k => { out_y(t + j as u32 * tpr32, true); });
        out_y(slots, t == 0 && tile + 1 == tiles);
        sync_block();
        tile += 1;
    }
}

/// The split forward's block (`split::fwd_split`: `TPC` tiles of row `row`, cluster rank
/// `rank`, of the row's `tiles`) on the realigned path by output vector
/// ([`fwd_split_by_vector`]), when every operand of the row sits at the same offset from the
/// 16-byte grid ([`shared_offset`]: dense 16-bit tensors of one layout, on sm_90) and the
/// block holds one tile; `false`, having done nothing, otherwise (then `fwd_split`'s form by
/// chunk, [`store_chunk`]). The same choice for every block of a row: the offsets are the
/// row's. Blocks of two tiles run only on devices without clusters of 16 blocks and keep the
/// form by chunk, which is all that was measured there. `NARROW` as for `fwd_split`.
///
/// # Safety
/// As for `split::fwd_split` on the realigned path; `me`, `row`, `rank` and `tiles` are the
/// block's.
#[inline(always)]
pub(super) unsafe fn fwd_split_shared<E: Elem, const TPC: usize, const NARROW: bool>(
    p: &RmsNormFwdParams,
    me: &Me,
    (row, rank, tiles): (u64, u32, u64),
) -> bool {
    if TPC != 1 {
        return false;
    }
    let shifted = |base, stride| Shifted::of::<E>(base, stride, row);
    let Some(m) = shared_offset::<E>(
        shifted(p.x, p.x_stride),
        shifted(p.residual, p.residual_stride),
        shifted(p.h, p.h_stride),
        shifted(p.y, p.y_stride),
        p.residual != 0,
    ) else {
        return false;
    };
    // SAFETY: the caller's contract; `m` is every operand's offset.
    unsafe { fwd_split_by_vector::<E, TPC, NARROW>(p, me, (row, rank, tiles), m) };
    true
}

/// [`fwd_split_shared`]'s body, every operand of the row at offset `m`: what [`fwd`] does for
/// a whole row, on the block's slice of it. x and the residual are staged ([`stage_pair`]: the
/// slice's vectors and the one after them) and stay staged to the end. Each thread sums the
/// squares of its chunks read back at the offset (the chunk map and order of the other paths,
/// so the same bits), and forms each output vector of its slots from the staged vectors in
/// that slot, which hold exactly its columns: no shift, no neighbour's values and, unlike
/// the form by chunk, no vector split between two threads' stores. It keeps its vectors of
/// `h` in the storage dtype, as stored, for `y`. Output vector `q` holds the last `m` columns
/// of chunk `q - 1` (for the slice's first vector, the previous block's); the block whose slot
/// it is forms them from its own staging (every block has the row's `rstd`), so each vector of
/// the row is stored once, as one 16-byte store (the row's two edge vectors element by
/// element). Its weight is the last `m` columns of the weight's
/// vector `q - 1` and the first `L - m` of vector `q`; a 16-bit weight is loaded first, so
/// that its loads are in flight with the staging.
///
/// One body for every offset, not one per offset ([`at_offset`]) as the whole-row kernels
/// have: the split keeps rows at every offset in flight on each multiprocessor, and a body per
/// offset then misses in the instruction cache.
///
/// Aliasing: the previous block stages this block's first vector (the one after its slice)
/// and `h` may be written over x or the residual, so thread 0 stores `h`'s first vector only
/// after the first cluster barrier, which every block reaches once its staging is complete.
/// No other block reads a vector this block stores.
///
/// # Safety
/// As for [`fwd_split_shared`]; `m` is the offset of every operand of the row.
#[inline(always)]
unsafe fn fwd_split_by_vector<E: Elem, const TPC: usize, const NARROW: bool>(
    p: &RmsNormFwdParams,
    me: &Me,
    (row, rank, tiles): (u64, u32, u64),
    m: u32,
) {
    let k = 16 / E::LANES;
    // Rows below 2^31 elements (host-checked): indices fit 32 bits.
    let (t, tpr, hidden) = (me.t as u32, me.tpr as u32, p.hidden as u32);
    let lanes = E::LANES as u32;
    let nchunks = hidden.div_ceil(lanes);
    let per_tile = tpr * k as u32;
    let slots = TPC as u32 * per_tile;
    let first = rank * slots;
    // No block after this one in the row: its vector after the slice is this block's to store.
    let last_block = first + slots >= nchunks;
    let has_res = p.residual != 0;
    let hf = p.flags & RMSNORM_HF != 0;
    let gemma = p.flags & RMSNORM_GEMMA != 0;
    let w_f32 = p.flags & RMSNORM_W_F32 != 0;
    let shifted = |base, stride| Shifted::of::<E>(base, stride, row);
    let (x_row, res_row) = (
        shifted(p.x, p.x_stride),
        shifted(p.residual, p.residual_stride),
    );
    let (h_row, y_row) = (shifted(p.h, p.h_stride), shifted(p.y, p.y_stride));
    let stage = Stage::of_split(me.tpr, TPC * k);
    // The narrow entries (40 registers) load it at the end, as an f32 weight is.
    let mut w_bits = [[0u32; 4]; MAX_CHUNKS];
    if !NARROW && !w_f32 {
        unroll!(j < TPC * k => {
            let q = first + t + j as u32 * tpr;
            // SAFETY: the host checked the weight (16-byte aligned, `hidden` elements).
            w_bits[j] = unsafe { weight_window_bits::<E>(p.w, q, hidden, m) };
        });
    }
    // SAFETY: the row is a row of each operand (host-checked); the host sized the shared
    // memory for the block's staging; every thread of the block calls it.
    unsafe {
        stage_pair::<E, true>(
            (x_row, true),
            (res_row, has_res),
            (t, tpr, TPC * k),
            stage,
            hidden,
            first,
            || {},
        )
    };
    // `h`'s vector in slot `s`, from the staged vectors in that slot.
    let h_at = #[inline(always)]
    |s: u32| {
        // SAFETY: staged above; slot s <= slots.
        let (x, r) = unsafe { stage.vectors_at::<E>(s) };
        add_residual::<E>(&x, &r, has_res, hf)
    };
    // `h` in the storage dtype, as stored and as normalised below (the looped kernel reads back
    // the `h` it stored).
    let mut h_bits = [[0u32; 4]; MAX_CHUNKS];
    unroll!(j < TPC * k => {
        let s = t + j as u32 * tpr;
        h_bits[j] = E::pack(&h_at(s));
        // SAFETY: a row of h; h may be x or the residual, whose every load this block issued
        // before the staging barrier; slot 0 waits for the cluster (below).
        unsafe { store_vector_bits::<E>(h_row, first + s, hidden, has_res && s != 0, h_bits[j]) };
    });
    let acc = |j: usize| {
        // SAFETY: slots of tile j of the block, staged above.
        unsafe {
            sum_squares::<E, ANY_OFFSET>(
                stage,
                (t + j as u32 * per_tile, tpr, k),
                (m, m),
                has_res,
                hf,
                false,
            )
        }
    };
    // SAFETY: every thread of every block of the cluster gets here once (the split's launch).
    let sum_sq = unsafe { split::cluster_row_sum::<TPC, true>(me, tiles, acc, || ()) };
    let rstd = rstd_of(sum_sq, p.hidden, p.eps);
    if rank == 0 && t == 0 && p.rstd != 0 {
        // SAFETY: row < rows; the host checked the rstd vector.
        unsafe { F32::store(p.rstd + row * p.rstd_stride * 4, rstd) };
    }
    // The vector after the slice, when no block after this one stores it.
    let spare = t == 0 && last_block;
    let spare_bits = if spare { E::pack(&h_at(slots)) } else { [0; 4] };
    if has_res && t == 0 {
        // SAFETY: as above; past the cluster barrier, so every block's staging is done.
        unsafe {
            store_vector_bits::<E>(h_row, first, hidden, true, h_bits[0]);
            store_vector_bits::<E>(h_row, first + slots, hidden, spare, spare_bits);
        }
    }
    // `y`'s vector in slot `s` from `h` in the storage dtype and the weight `w`.
    let out_y = #[inline(always)]
    |s: u32, h: [u32; 4], w: [f32; 8]| {
        let y = normalize::<E>(&E::unpack(h), rstd, &w, hf);
        // SAFETY: a row of y; y may be x, staged before the staging barrier.
        unsafe { store_vector::<E>(y_row, first + s, hidden, true, &y) };
    };
    unroll!(j < TPC * k => {
        let s = t + j as u32 * tpr;
        // The narrow entries' case first and on its own, so that for the other entries the
        // branch folds away before anything else and their code stays as it was.
        let w = if NARROW {
            // SAFETY: the host checked the weight.
            unsafe { weight_window::<E>(p.w, first + s, hidden, m, (w_f32, gemma)) }
        } else if w_f32 {
            // SAFETY: the host checked the weight.
            unsafe { weight_window::<E>(p.w, first + s, hidden, m, (true, gemma)) }
        } else {
            with_gemma::<E>(E::unpack(w_bits[j]), gemma)
        };
        out_y(s, h_bits[j], w);
    });
    if spare {
        // SAFETY: as above.
        let w = unsafe { weight_window::<E>(p.w, first + slots, hidden, m, (w_f32, gemma)) };
        out_y(slots, spare_bits, w);
    }
    // SAFETY: every thread of every block of the cluster runs this once; no block exits
    // (releasing its shared memory) while another may read its tile sums.
    unsafe { cluster::wait() };
}

/// `w`, or `1 + w` for Gemma.
#[inline(always)]
fn with_gemma<E: Elem>(mut w: [f32; 8], gemma: bool) -> [f32; 8] {
    if gemma {
        unroll!(l < E::LANES => { w[l] = 1.0 + w[l]; });
    }
    w
}

/// 16-byte vector `v` of an array of `len` elements of `T` at `base` (16-byte aligned): one
/// load when it lies wholly inside the array, element by element for the ragged last one,
/// zeros past the array (`v` may be `u32::MAX`, the vector before the first).
///
/// # Safety
/// `base` holds `len` elements of `T`, 16-byte aligned.
#[inline(always)]
unsafe fn array_vector<T: Elem>(base: u64, v: u32, len: u32) -> [u32; 4] {
    let per = 16 / T::BYTES as u32;
    let inside = v < len.div_ceil(per);
    let whole = inside && v * per + per <= len;
    // SAFETY: the caller's contract; a whole vector of the array.
    let mut bits = unsafe { ld_v4_if(base + v as u64 * 16, whole) };
    if inside && !whole {
        unroll!(i < 4 => {
            // SAFETY: elements of the array only.
            bits[i] = unsafe {
                if T::BYTES == 4 {
                    let e = v * 4 + i as u32;
                    T::load_bits_if(base + e as u64 * 4, e < len)
                } else {
                    let e = v * 8 + 2 * i as u32;
                    let lo = T::load_bits_if(base + e as u64 * 2, e < len);
                    let hi = T::load_bits_if(base + e as u64 * 2 + 2, e + 1 < len);
                    lo | hi << 16
                }
            };
        });
    }
    bits
}

/// The 16-bit weight of output vector `q` of a row at offset `m` (columns `q L - m ..`), as
/// the storage dtype's bits: the last `m` elements of the weight's vector `q - 1`, then the
/// first `L - m` of vector `q`.
///
/// # Safety
/// The weight holds `hidden` elements of `E`, 16-byte aligned.
#[inline(always)]
unsafe fn weight_window_bits<E: Elem>(w: u64, q: u32, hidden: u32, m: u32) -> [u32; 4] {
    // SAFETY: the caller's contract.
    let cur = unsafe { array_vector::<E>(w, q, hidden) };
    if m == 0 {
        return cur;
    }
    // SAFETY: as above (zeros before the first vector).
    let prev = unsafe { array_vector::<E>(w, q.wrapping_sub(1), hidden) };
    // (`m < L`; the modulus keeps the f32 instances, which no row reaches, well-formed.)
    window::<E>(prev, cur, E::LANES as u32 - m % E::LANES as u32)
}

/// The weight factors of output vector `q` of a 16-bit row at offset `m` (columns
/// `q L - m ..`) from a weight of the storage dtype or of f32 (`w_f32`): `w`, or `1 + w` for
/// Gemma, widened to f32.
///
/// # Safety
/// The weight holds `hidden` elements of its dtype, 16-byte aligned.
#[inline(always)]
unsafe fn weight_window<E: Elem>(
    w: u64,
    q: u32,
    hidden: u32,
    m: u32,
    (w_f32, gemma): (bool, bool),
) -> [f32; 8] {
    if !w_f32 {
        // SAFETY: the caller's contract.
        return with_gemma::<E>(
            E::unpack(unsafe { weight_window_bits::<E>(w, q, hidden, m) }),
            gemma,
        );
    }
    // Eight f32 columns from `8q - m`: element `e` of f32 vector `2q - b` and on, with `b`
    // vectors back.
    let b = m.div_ceil(4);
    let e = 4 * b - m;
    let v0 = (2 * q).wrapping_sub(b);
    // SAFETY: the caller's contract (zeros before the first vector and past the last).
    let (va, vb, vc) = unsafe {
        (
            array_vector::<F32>(w, v0, hidden),
            array_vector::<F32>(w, v0.wrapping_add(1), hidden),
            if e == 0 {
                [0; 4]
            } else {
                array_vector::<F32>(w, v0.wrapping_add(2), hidden)
            },
        )
    };
    let words = [
        va[0], va[1], va[2], va[3], vb[0], vb[1], vb[2], vb[3], vc[0], vc[1], vc[2], vc[3],
    ];
    let mut f = [0.0f32; 8];
    unroll!(i < 8 => {
        let at = |d: usize| f32::from_bits(words[i + d]);
        f[i] = match e {
            0 => at(0),
            1 => at(1),
            2 => at(2),
            _ => at(3),
        };
    });
    with_gemma::<E>(f, gemma)
}
