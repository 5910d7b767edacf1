//! Global-memory access and dtype conversion, as explicit PTX.
//!
//! Addresses are device pointers as `u64`. The host guarantees, before any launch, that every
//! address passed here is inside its tensor's allocation and aligned to the access width
//! (16 bytes for the vector forms, the element size otherwise).
//!
//! Loads are plain coherent `ld.global` (not `.nc`): outputs may alias inputs (in-place calls),
//! and the non-coherent path is only defined for data that is read-only for the whole kernel.
//!
//! # Memory paths
//! Every entry is compiled for one [`VecMode`] (`_v16` / `_scalar` in its name), which the
//! kernel bodies take as a const parameter `M`: on `V16` one access moves a 16-byte vector (the
//! host checked that every pointer is 16-byte aligned and every row stride and row length a
//! multiple of the vector), on `Scalar` one element. [`access_width`] and
//! [`Elem::load_access`] are one access of either path (the gated kernels); the norm's chunks,
//! `LANES` elements on both paths and masked per element on `Scalar`, are in `norm`, with a
//! third path of its own (`norm::Path::Realigned`: aligned vectors for rows at any offset).

use core::arch::asm;

pub use ferrofuse_common::VecMode;

/// Loads 16 bytes from `p` (16-byte aligned, global).
#[inline(always)]
pub unsafe fn ld_v4(p: u64) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: caller guarantees `p` is a valid, 16-byte aligned global address.
    unsafe {
        asm!(
            "ld.global.v4.u32 {{{0}, {1}, {2}, {3}}}, [{4}];",
            out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d,
            in(reg64) p,
            options(pure, readonly, nostack, preserves_flags)
        );
    }
    [a, b, c, d]
}

/// Stores 16 bytes to `p` (16-byte aligned, global).
#[inline(always)]
pub unsafe fn st_v4(p: u64, v: [u32; 4]) {
    // SAFETY: caller guarantees `p` is a valid, 16-byte aligned global address.
    unsafe {
        asm!(
            "st.global.v4.u32 [{0}], {{{1}, {2}, {3}, {4}}};",
            in(reg64) p, in(reg32) v[0], in(reg32) v[1], in(reg32) v[2], in(reg32) v[3],
            options(nostack, preserves_flags)
        );
    }
}

/// Loads 16 bytes from `p` when `pred`, else returns zeros. One predicated instruction, not
/// a branch: a thread's loads then issue back to back and wait together at the first use
/// (a branch per load made each one wait for the previous before issuing; bench/TUNING.md).
/// Not `pure`, on purpose: LLVM would otherwise sink a load into the branch that uses its
/// value (e.g. `if has_residual`), behind the first use of the loads before it.
#[inline(always)]
pub unsafe fn ld_v4_if(p: u64, pred: bool) -> [u32; 4] {
    // SAFETY: the caller's contract.
    unsafe { ld_v4_or(p, pred, 0) }
}

/// Loads 8 bytes from `p` when `pred`, else returns zeros (one predicated instruction, as
/// [`ld_v4_if`]).
///
/// # Safety
/// When `pred`, `p` is a valid, 8-byte aligned global address.
#[inline(always)]
pub unsafe fn ld_v2_if(p: u64, pred: bool) -> [u32; 2] {
    let (a, b): (u32, u32);
    // SAFETY: the caller's contract; nothing is accessed when `!pred`.
    unsafe {
        asm!(
            "{{ .reg .pred ok; setp.ne.u32 ok, {3}, 0;",
            "@ok ld.global.v2.u32 {{{0}, {1}}}, [{2}]; }}",
            inout(reg32) 0u32 => a, inout(reg32) 0u32 => b,
            in(reg64) p, in(reg32) pred as u32,
            options(readonly, nostack, preserves_flags)
        );
    }
    [a, b]
}

/// [`ld_v4_if`] with `fill` in each of the four words when `!pred` (still one predicated
/// instruction: the registers hold `fill` before the load).
///
/// # Safety
/// As for [`ld_v4_if`].
#[inline(always)]
pub unsafe fn ld_v4_or(p: u64, pred: bool, fill: u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: when `pred`, the caller guarantees `p` is a valid, 16-byte aligned global
    // address; otherwise nothing is accessed.
    unsafe {
        asm!(
            "{{ .reg .pred ok; setp.ne.u32 ok, {5}, 0;",
            "@ok ld.global.v4.u32 {{{0}, {1}, {2}, {3}}}, [{4}]; }}",
            inout(reg32) fill => a, inout(reg32) fill => b,
            inout(reg32) fill => c, inout(reg32) fill => d,
            in(reg64) p, in(reg32) pred as u32,
            options(readonly, nostack, preserves_flags)
        );
    }
    [a, b, c, d]
}

/// Starts an asynchronous copy of 16 bytes (`cp.async.cg`, sm_80+) from global `src` to
/// shared `dst` when `pred`: the bytes at `src` when `read`, else zeros (and `src` is not
/// read). The copy passes through no register; its bytes are in shared memory after
/// [`cp_async_wait_all`], and visible to other threads after a barrier that follows it.
#[inline(always)]
pub unsafe fn cp_async_16_if(dst: *mut u32, src: u64, read: bool, pred: bool) {
    // SAFETY: when `pred`, the caller guarantees `dst` is 16-byte aligned dynamic shared memory
    // and, when also `read`, `src` a valid, 16-byte aligned global address.
    unsafe {
        asm!(
            // `src-size` 0: nothing read, 16 zero bytes written (the `ignore-src` operand
            // needs PTX 7.5, above the sm_80 module's version).
            "{{ .reg .pred go; .reg .u64 s;",
            "setp.ne.u32 go, {2}, 0;",
            "cvta.to.shared.u64 s, {0};",
            "@go cp.async.cg.shared.global [s], [{1}], 16, {3}; }}",
            in(reg64) dst as u64, in(reg64) src, in(reg32) pred as u32, in(reg32) 16 * read as u32,
            options(nostack, preserves_flags)
        );
    }
}

/// Waits until every [`cp_async_16_if`] this thread started has written shared memory.
#[inline(always)]
pub fn cp_async_wait_all() {
    // SAFETY: waits only; not `nomem`, so no shared-memory access moves across it.
    unsafe { asm!("cp.async.wait_all;", options(nostack, preserves_flags)) };
}

/// Closes the group of [`cp_async_16_if`] copies this thread started since the last group
/// (an empty group when there were none), for [`cp_async_wait_group`].
#[inline(always)]
pub fn cp_async_commit() {
    // SAFETY: bookkeeping of this thread's copies only.
    unsafe { asm!("cp.async.commit_group;", options(nostack, preserves_flags)) };
}

/// Waits until at most the `N` most recent of this thread's copy groups are still in flight:
/// the bytes of every older group are then in shared memory.
#[inline(always)]
pub fn cp_async_wait_group<const N: u32>() {
    // SAFETY: waits only; not `nomem`, so no shared-memory access moves across it.
    unsafe { asm!("cp.async.wait_group {n};", n = const N, options(nostack, preserves_flags)) };
}

/// The 32-bit shared-memory address of `p`, a generic address of shared memory (what the
/// `*_shared` accesses below take: one register per address instead of two).
#[inline(always)]
pub fn shared_addr(p: *const u32) -> u32 {
    let a: u32;
    // SAFETY: an address conversion; no memory access.
    unsafe {
        asm!(
            "{{ .reg .u64 s; cvta.to.shared.u64 s, {p}; cvt.u32.u64 {a}, s; }}",
            p = in(reg64) p as u64, a = out(reg32) a,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    a
}

/// As [`cp_async_16_if`], to the shared-memory address `dst` (see [`shared_addr`]).
///
/// # Safety
/// As for [`cp_async_16_if`].
#[inline(always)]
pub unsafe fn cp_async_16_shared_if(dst: u32, src: u64, read: bool, pred: bool) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!(
            "{{ .reg .pred go; setp.ne.u32 go, {2}, 0;",
            "@go cp.async.cg.shared.global [{0}], [{1}], 16, {3}; }}",
            in(reg32) dst, in(reg64) src, in(reg32) pred as u32, in(reg32) 16 * read as u32,
            options(nostack, preserves_flags)
        );
    }
}

/// As [`cp_async_16_shared_if`], as four 4-byte copies (through L1: `.cg` copies 16 bytes
/// only) of the words at `src + 4 * i` to `dst + 4 * i`, the first `read` of them (0-4) read,
/// the others written as zeros: one address register and one count for the four.
///
/// # Safety
/// When `pred`: `dst` is 16-byte aligned shared memory of this block and, for each
/// `i < read`, `src + 4 * i` a valid, 4-byte aligned global address.
#[inline(always)]
pub unsafe fn cp_async_4x4_shared_if(dst: u32, src: u64, read: u32, pred: bool) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!(
            "{{ .reg .pred go, p; .reg .u32 n;",
            "setp.ne.u32 go, {2}, 0;",
            "setp.gt.u32 p, {3}, 0; selp.u32 n, 4, 0, p;",
            "@go cp.async.ca.shared.global [{0}], [{1}], 4, n;",
            "setp.gt.u32 p, {3}, 1; selp.u32 n, 4, 0, p;",
            "@go cp.async.ca.shared.global [{0}+4], [{1}+4], 4, n;",
            "setp.gt.u32 p, {3}, 2; selp.u32 n, 4, 0, p;",
            "@go cp.async.ca.shared.global [{0}+8], [{1}+8], 4, n;",
            "setp.gt.u32 p, {3}, 3; selp.u32 n, 4, 0, p;",
            "@go cp.async.ca.shared.global [{0}+12], [{1}+12], 4, n; }}",
            in(reg32) dst, in(reg64) src, in(reg32) pred as u32, in(reg32) read,
            options(nostack, preserves_flags)
        );
    }
}

/// The 16 bytes of shared memory at the shared-memory address `a` when `pred`, else zeros (one
/// predicated instruction).
///
/// # Safety
/// When `pred`: `a` is 16-byte aligned and readable for 16 bytes.
#[cfg(ferrofuse_bulk_copy)]
#[inline(always)]
pub unsafe fn ld_shared_v4_if(a: u32, pred: bool) -> [u32; 4] {
    let mut o = [0u32; 4];
    // SAFETY: the caller's contract; reads shared memory only, nothing when `!pred`.
    unsafe {
        asm!(
            "{{ .reg .pred ok; setp.ne.u32 ok, {p}, 0;",
            "@ok ld.shared.v4.u32 {{{o0}, {o1}, {o2}, {o3}}}, [{a}]; }}",
            o0 = inout(reg32) o[0], o1 = inout(reg32) o[1], o2 = inout(reg32) o[2],
            o3 = inout(reg32) o[3], a = in(reg32) a, p = in(reg32) pred as u32,
            options(readonly, nostack, preserves_flags)
        );
    }
    o
}

/// Stores the 16 bytes `v` to shared memory at the shared-memory address `a` (see
/// [`shared_addr`]).
///
/// # Safety
/// `a` is 16-byte aligned and writable for 16 bytes, and no other thread accesses them
/// until a barrier.
#[inline(always)]
pub unsafe fn st_shared_v4(a: u32, v: [u32; 4]) {
    // SAFETY: the caller's contract; writes shared memory only.
    unsafe {
        asm!(
            "st.shared.v4.u32 [{a}], {{{v0}, {v1}, {v2}, {v3}}};",
            a = in(reg32) a, v0 = in(reg32) v[0], v1 = in(reg32) v[1], v2 = in(reg32) v[2],
            v3 = in(reg32) v[3],
            options(nostack, preserves_flags)
        );
    }
}

/// The 16 bytes of shared memory at the shared-memory address `a` (see [`shared_addr`]).
///
/// # Safety
/// `a` is 16-byte aligned and readable for 16 bytes.
#[inline(always)]
pub unsafe fn ld_shared_v4(a: u32) -> [u32; 4] {
    let mut o = [0u32; 4];
    // SAFETY: the caller's contract; reads shared memory only. Not `pure`: every call reads
    // (a caller reads the same bytes again rather than keep them in registers).
    unsafe {
        asm!(
            "ld.shared.v4.u32 {{{o0}, {o1}, {o2}, {o3}}}, [{a}];",
            o0 = out(reg32) o[0], o1 = out(reg32) o[1], o2 = out(reg32) o[2], o3 = out(reg32) o[3],
            a = in(reg32) a,
            options(readonly, nostack, preserves_flags)
        );
    }
    o
}

/// Stores 16 bytes to `p` when `pred` (predicated, no branch).
#[inline(always)]
pub unsafe fn st_v4_if(p: u64, v: [u32; 4], pred: bool) {
    // SAFETY: when `pred`, the caller guarantees `p` is a valid, 16-byte aligned global
    // address; otherwise nothing is accessed.
    unsafe {
        asm!(
            "{{ .reg .pred ok; setp.ne.u32 ok, {5}, 0;",
            "@ok st.global.v4.u32 [{0}], {{{1}, {2}, {3}, {4}}}; }}",
            in(reg64) p, in(reg32) v[0], in(reg32) v[1], in(reg32) v[2], in(reg32) v[3],
            in(reg32) pred as u32,
            options(nostack, preserves_flags)
        );
    }
}

/// Stores `v` at `p` when `flag != 0` (predicated, no branch). The condition is a word: a
/// caller testing one bit of a mask passes `mask & bit` (one instruction), where a `bool` made
/// from it became a bit-field extract and a compare.
#[inline(always)]
unsafe fn st_u16_if(p: u64, v: u16, flag: u32) {
    // SAFETY: when `flag != 0`, `p` is a valid, 2-byte aligned global address (caller).
    unsafe {
        asm!("{{ .reg .pred ok; setp.ne.u32 ok, {2}, 0; @ok st.global.u16 [{0}], {1}; }}",
             in(reg64) p, in(reg16) v, in(reg32) flag,
             options(nostack, preserves_flags));
    }
}

/// A u16 from `p` when `pred`, else 0 (predicated, no branch).
#[inline(always)]
unsafe fn ld_u16_if(p: u64, pred: bool) -> u16 {
    let v: u16;
    // SAFETY: when `pred`, `p` is a valid, 2-byte aligned global address (caller).
    unsafe {
        asm!("{{ .reg .pred ok; setp.ne.u32 ok, {2}, 0; @ok ld.global.u16 {0}, [{1}]; }}",
             inout(reg16) 0u16 => v, in(reg64) p, in(reg32) pred as u32,
             options(readonly, nostack, preserves_flags));
    }
    v
}

/// A u16 from `p` when `lane < n`, else 0: the predicate is formed inside, from the element's
/// constant `lane` in its chunk and the chunk's count `n` of elements to read, so that a
/// chunk's loads share one register (`n`) instead of one materialised predicate each.
#[inline(always)]
unsafe fn ld_u16_below(p: u64, lane: u32, n: u32) -> u16 {
    let v: u16;
    // SAFETY: when `lane < n`, `p` is a valid, 2-byte aligned global address (caller).
    unsafe {
        asm!("{{ .reg .pred ok; setp.lt.u32 ok, {2}, {3}; @ok ld.global.u16 {0}, [{1}]; }}",
             inout(reg16) 0u16 => v, in(reg64) p, in(reg32) lane, in(reg32) n,
             options(readonly, nostack, preserves_flags));
    }
    v
}

/// A u32 from `p` when `lane < n`, else 0 (as [`ld_u16_below`]).
#[inline(always)]
unsafe fn ld_u32_below(p: u64, lane: u32, n: u32) -> u32 {
    let v: u32;
    // SAFETY: when `lane < n`, `p` is a valid, 4-byte aligned global address (caller).
    unsafe {
        asm!("{{ .reg .pred ok; setp.lt.u32 ok, {2}, {3}; @ok ld.global.u32 {0}, [{1}]; }}",
             inout(reg32) 0u32 => v, in(reg64) p, in(reg32) lane, in(reg32) n,
             options(readonly, nostack, preserves_flags));
    }
    v
}

/// An f32 from `p` when `pred`, else 0.0 (predicated, no branch).
#[inline(always)]
pub unsafe fn ld_f32_if(p: u64, pred: bool) -> f32 {
    let v: u32;
    // SAFETY: when `pred`, `p` is a valid, 4-byte aligned global address (caller).
    unsafe {
        asm!("{{ .reg .pred ok; setp.ne.u32 ok, {2}, 0; @ok ld.global.u32 {0}, [{1}]; }}",
             inout(reg32) 0u32 => v, in(reg64) p, in(reg32) pred as u32,
             options(readonly, nostack, preserves_flags));
    }
    f32::from_bits(v)
}

/// Stores `v` at `p` when `flag != 0` (predicated, no branch). The condition is a word: a
/// caller testing one bit of a mask passes `mask & bit` (one instruction), where a `bool` made
/// from it became a bit-field extract and a compare.
#[inline(always)]
unsafe fn st_u32_if(p: u64, v: u32, flag: u32) {
    // SAFETY: when `flag != 0`, `p` is a valid, 4-byte aligned global address (caller).
    unsafe {
        asm!("{{ .reg .pred ok; setp.ne.u32 ok, {2}, 0; @ok st.global.u32 [{0}], {1}; }}",
             in(reg64) p, in(reg32) v, in(reg32) flag,
             options(nostack, preserves_flags));
    }
}

#[inline(always)]
unsafe fn ld_u16(p: u64) -> u16 {
    let v: u16;
    // SAFETY: caller guarantees `p` is a valid, 2-byte aligned global address.
    unsafe {
        asm!("ld.global.u16 {0}, [{1}];", out(reg16) v, in(reg64) p,
             options(pure, readonly, nostack, preserves_flags));
    }
    v
}

#[inline(always)]
unsafe fn st_u16(p: u64, v: u16) {
    // SAFETY: caller guarantees `p` is a valid, 2-byte aligned global address.
    unsafe {
        asm!("st.global.u16 [{0}], {1};", in(reg64) p, in(reg16) v,
             options(nostack, preserves_flags));
    }
}

#[inline(always)]
unsafe fn ld_u32(p: u64) -> u32 {
    let v: u32;
    // SAFETY: caller guarantees `p` is a valid, 4-byte aligned global address.
    unsafe {
        asm!("ld.global.u32 {0}, [{1}];", out(reg32) v, in(reg64) p,
             options(pure, readonly, nostack, preserves_flags));
    }
    v
}

#[inline(always)]
unsafe fn st_u32(p: u64, v: u32) {
    // SAFETY: caller guarantees `p` is a valid, 4-byte aligned global address.
    unsafe {
        asm!("st.global.u32 [{0}], {1};", in(reg64) p, in(reg32) v,
             options(nostack, preserves_flags));
    }
}

#[inline(always)]
fn f16_to_f32(h: u16) -> f32 {
    let f: f32;
    // SAFETY: pure register conversion.
    unsafe {
        asm!("cvt.f32.f16 {0}, {1};", out(reg32) f, in(reg16) h,
             options(pure, nomem, nostack, preserves_flags));
    }
    f
}

#[inline(always)]
fn bf16_to_f32(h: u16) -> f32 {
    // bf16 is the top half of an f32: widening is exact.
    f32::from_bits((h as u32) << 16)
}

/// Round-to-nearest-even f32 -> f16 (overflow gives +-inf, NaN stays NaN).
#[inline(always)]
fn f32_to_f16(f: f32) -> u16 {
    let h: u16;
    // SAFETY: pure register conversion.
    unsafe {
        asm!("cvt.rn.f16.f32 {0}, {1};", out(reg16) h, in(reg32) f,
             options(pure, nomem, nostack, preserves_flags));
    }
    h
}

/// Round-to-nearest-even f32 -> bf16 (sm_80+).
#[inline(always)]
fn f32_to_bf16(f: f32) -> u16 {
    let h: u16;
    // SAFETY: pure register conversion.
    unsafe {
        asm!("cvt.rn.bf16.f32 {0}, {1};", out(reg16) h, in(reg32) f,
             options(pure, nomem, nostack, preserves_flags));
    }
    h
}

/// Two f32 -> one word of two f16 (`lo` in the low half), one instruction.
#[inline(always)]
fn pack_f16x2(lo: f32, hi: f32) -> u32 {
    let w: u32;
    // SAFETY: pure register conversion; PTX puts the first source in the upper half.
    unsafe {
        asm!("cvt.rn.f16x2.f32 {0}, {1}, {2};", out(reg32) w, in(reg32) hi, in(reg32) lo,
             options(pure, nomem, nostack, preserves_flags));
    }
    w
}

/// Two f32 -> one word of two bf16 (`lo` in the low half), one instruction.
#[inline(always)]
fn pack_bf16x2(lo: f32, hi: f32) -> u32 {
    let w: u32;
    // SAFETY: pure register conversion; PTX puts the first source in the upper half.
    unsafe {
        asm!("cvt.rn.bf16x2.f32 {0}, {1}, {2};", out(reg32) w, in(reg32) hi, in(reg32) lo,
             options(pure, nomem, nostack, preserves_flags));
    }
    w
}

/// A storage dtype: how to move it between global memory and f32 registers.
///
/// Vectors are 16 bytes: `LANES` elements, unpacked into the first `LANES` entries of a
/// `[f32; 8]` (the rest are unused and optimised away).
pub trait Elem {
    const BYTES: u64;
    const LANES: usize;
    /// A 32-bit word of a vector whose every element is -0.0: adding it leaves any value but a
    /// NaN bit for bit unchanged (`x + -0.0 == x`, zeros of either sign included; a NaN
    /// stays a NaN).
    const NEG_ZERO_WORD: u32;
    /// One element, widened to f32.
    #[inline(always)]
    unsafe fn load(p: u64) -> f32 {
        // SAFETY: the caller's contract, as for `load_bits`.
        Self::widen(unsafe { Self::load_bits(p) })
    }
    /// One element's raw bits (zero-extended to 32), for kernels that keep loaded data packed
    /// in registers until it is used; [`Elem::widen`] turns them into f32.
    unsafe fn load_bits(p: u64) -> u32;
    /// [`Elem::load_bits`] when `pred`, else 0 (predicated, no branch: a thread's batch of
    /// such loads issues back to back).
    unsafe fn load_bits_if(p: u64, pred: bool) -> u32;
    /// [`Elem::load_bits`] when `lane < n`, else 0: element `lane` of a chunk of which the
    /// first `n` are read (predicated, no branch; see `ld_u16_below`).
    unsafe fn load_bits_below(p: u64, lane: u32, n: u32) -> u32;
    fn widen(bits: u32) -> f32;
    unsafe fn store(p: u64, v: f32);
    /// [`Elem::store`] when `pred` (predicated, no branch).
    unsafe fn store_if(p: u64, v: f32, pred: bool);
    /// Stores the element's raw bits (the low `BYTES` of `bits`, as [`Elem::pack`] produced
    /// them) when `flag != 0` (predicated, no branch; a word, see `st_u16_if`).
    unsafe fn store_bits_where(p: u64, bits: u32, flag: u32);
    fn unpack(w: [u32; 4]) -> [f32; 8];
    fn pack(v: &[f32; 8]) -> [u32; 4];

    /// The raw bits of one access of path `M` at `p` ([`access_width`] elements), widened to
    /// f32 lanes by [`Elem::widen_access`] only when used: a batch of loads in flight then
    /// costs half the registers for 16-bit dtypes.
    ///
    /// # Safety
    /// `p` is a global address of [`access_width`] elements, aligned for `M`.
    #[inline(always)]
    unsafe fn load_access<const M: VecMode>(p: u64) -> [u32; 4] {
        match M {
            // SAFETY: the caller's contract.
            VecMode::V16 => unsafe { ld_v4(p) },
            // SAFETY: the caller's contract.
            VecMode::Scalar => [unsafe { Self::load_bits(p) }, 0, 0, 0],
        }
    }

    /// The f32 lanes of one access of path `M`.
    #[inline(always)]
    fn widen_access<const M: VecMode>(raw: [u32; 4]) -> [f32; 8] {
        match M {
            VecMode::V16 => Self::unpack(raw),
            VecMode::Scalar => {
                let mut v = [0.0; 8];
                v[0] = Self::widen(raw[0]);
                v
            }
        }
    }

    /// Stores one access of path `M` at `p`, rounding to nearest even.
    ///
    /// # Safety
    /// As for [`Elem::load_access`].
    #[inline(always)]
    unsafe fn store_access<const M: VecMode>(p: u64, v: &[f32; 8]) {
        match M {
            // SAFETY: the caller's contract.
            VecMode::V16 => unsafe { st_v4(p, Self::pack(v)) },
            // SAFETY: the caller's contract.
            VecMode::Scalar => unsafe { Self::store(p, v[0]) },
        }
    }
}

pub struct F32;
pub struct F16;
pub struct Bf16;

impl Elem for F32 {
    const BYTES: u64 = 4;
    const LANES: usize = 4;
    const NEG_ZERO_WORD: u32 = 0x8000_0000;
    #[inline(always)]
    unsafe fn load_bits(p: u64) -> u32 {
        unsafe { ld_u32(p) }
    }
    #[inline(always)]
    unsafe fn load_bits_if(p: u64, pred: bool) -> u32 {
        unsafe { ld_f32_if(p, pred) }.to_bits()
    }
    #[inline(always)]
    unsafe fn load_bits_below(p: u64, lane: u32, n: u32) -> u32 {
        unsafe { ld_u32_below(p, lane, n) }
    }
    #[inline(always)]
    fn widen(bits: u32) -> f32 {
        f32::from_bits(bits)
    }
    #[inline(always)]
    unsafe fn store(p: u64, v: f32) {
        unsafe { st_u32(p, v.to_bits()) }
    }
    #[inline(always)]
    unsafe fn store_if(p: u64, v: f32, pred: bool) {
        unsafe { st_u32_if(p, v.to_bits(), pred as u32) }
    }
    #[inline(always)]
    unsafe fn store_bits_where(p: u64, bits: u32, flag: u32) {
        unsafe { st_u32_if(p, bits, flag) }
    }
    #[inline(always)]
    fn unpack(w: [u32; 4]) -> [f32; 8] {
        let mut v = [0.0; 8];
        for i in 0..4 {
            v[i] = f32::from_bits(w[i]);
        }
        v
    }
    #[inline(always)]
    fn pack(v: &[f32; 8]) -> [u32; 4] {
        [
            v[0].to_bits(),
            v[1].to_bits(),
            v[2].to_bits(),
            v[3].to_bits(),
        ]
    }
}

impl Elem for F16 {
    const BYTES: u64 = 2;
    const LANES: usize = 8;
    const NEG_ZERO_WORD: u32 = 0x8000_8000;
    #[inline(always)]
    unsafe fn load_bits(p: u64) -> u32 {
        unsafe { ld_u16(p) as u32 }
    }
    #[inline(always)]
    unsafe fn load_bits_if(p: u64, pred: bool) -> u32 {
        unsafe { ld_u16_if(p, pred) as u32 }
    }
    #[inline(always)]
    unsafe fn load_bits_below(p: u64, lane: u32, n: u32) -> u32 {
        unsafe { ld_u16_below(p, lane, n) as u32 }
    }
    #[inline(always)]
    fn widen(bits: u32) -> f32 {
        f16_to_f32(bits as u16)
    }
    #[inline(always)]
    unsafe fn store(p: u64, v: f32) {
        unsafe { st_u16(p, f32_to_f16(v)) }
    }
    #[inline(always)]
    unsafe fn store_if(p: u64, v: f32, pred: bool) {
        unsafe { st_u16_if(p, f32_to_f16(v), pred as u32) }
    }
    #[inline(always)]
    unsafe fn store_bits_where(p: u64, bits: u32, flag: u32) {
        unsafe { st_u16_if(p, bits as u16, flag) }
    }
    #[inline(always)]
    fn unpack(w: [u32; 4]) -> [f32; 8] {
        let mut v = [0.0; 8];
        for i in 0..4 {
            v[2 * i] = f16_to_f32(w[i] as u16);
            v[2 * i + 1] = f16_to_f32((w[i] >> 16) as u16);
        }
        v
    }
    #[inline(always)]
    fn pack(v: &[f32; 8]) -> [u32; 4] {
        let mut w = [0; 4];
        for i in 0..4 {
            w[i] = pack_f16x2(v[2 * i], v[2 * i + 1]);
        }
        w
    }
}

impl Elem for Bf16 {
    const BYTES: u64 = 2;
    const LANES: usize = 8;
    const NEG_ZERO_WORD: u32 = 0x8000_8000;
    #[inline(always)]
    unsafe fn load_bits(p: u64) -> u32 {
        unsafe { ld_u16(p) as u32 }
    }
    #[inline(always)]
    unsafe fn load_bits_if(p: u64, pred: bool) -> u32 {
        unsafe { ld_u16_if(p, pred) as u32 }
    }
    #[inline(always)]
    unsafe fn load_bits_below(p: u64, lane: u32, n: u32) -> u32 {
        unsafe { ld_u16_below(p, lane, n) as u32 }
    }
    #[inline(always)]
    fn widen(bits: u32) -> f32 {
        bf16_to_f32(bits as u16)
    }
    #[inline(always)]
    unsafe fn store(p: u64, v: f32) {
        unsafe { st_u16(p, f32_to_bf16(v)) }
    }
    #[inline(always)]
    unsafe fn store_if(p: u64, v: f32, pred: bool) {
        unsafe { st_u16_if(p, f32_to_bf16(v), pred as u32) }
    }
    #[inline(always)]
    unsafe fn store_bits_where(p: u64, bits: u32, flag: u32) {
        unsafe { st_u16_if(p, bits as u16, flag) }
    }
    #[inline(always)]
    fn unpack(w: [u32; 4]) -> [f32; 8] {
        let mut v = [0.0; 8];
        for i in 0..4 {
            v[2 * i] = f32::from_bits(w[i] << 16);
            v[2 * i + 1] = f32::from_bits(w[i] & 0xffff_0000);
        }
        v
    }
    #[inline(always)]
    fn pack(v: &[f32; 8]) -> [u32; 4] {
        let mut w = [0; 4];
        for i in 0..4 {
            w[i] = pack_bf16x2(v[2 * i], v[2 * i + 1]);
        }
        w
    }
}

/// Elements in one access of memory path `M` (see [`VecMode`]): a 16-byte vector of
/// `E::LANES` on `V16`, one element on `Scalar`.
pub const fn access_width<E: Elem, const M: VecMode>() -> u64 {
    match M {
        VecMode::V16 => E::LANES as u64,
        VecMode::Scalar => 1,
    }
}

unsafe extern "C" {
    // An LLVM intrinsic rather than `asm!`: it is marked convergent, so LLVM never moves it
    // into a branch that only some lanes take.
    #[link_name = "llvm.nvvm.shfl.sync.up.i32"]
    fn shfl_sync_up_i32(member_mask: u32, v: u32, delta: u32, clamp: u32) -> u32;
}

/// Each word of `v` from the previous lane (`lane - 1`); lane 0 gets its own back. Every lane
/// of the warp must call it.
#[inline(always)]
pub fn shfl_up_1(v: [u32; 4]) -> [u32; 4] {
    // SAFETY: full member mask; callers are executed by the whole warp.
    v.map(|w| unsafe { shfl_sync_up_i32(0xffff_ffff, w, 1, 0) })
}

/// The 16 bytes of shared memory `shift` bytes (`< 16`) past `p`: the 16-byte vector at `p`
/// and, when `shift > 0`, the one after it (a predicated read), then two levels of word
/// selects (by 8 bytes, then 4) and a funnel shift per word. One asm block, so that no branch
/// or select is left for LLVM to merge (as plain code, it turned the selects into an array in
/// local memory indexed at run time).
///
/// # Safety
/// `p` is 16-byte aligned shared memory (a generic address), readable for 16 bytes, and for
/// 32 when `shift > 0`.
#[inline(always)]
pub unsafe fn ld_shared_window(p: *const u32, shift: u32) -> [u32; 4] {
    let mut o = [0u32; 4];
    // SAFETY: the caller's contract; reads shared memory only.
    unsafe {
        asm!(
            "{{ .reg .pred p8, p4, ps; .reg .u64 s;",
            ".reg .b32 l0, l1, l2, l3, h0, h1, h2, h3, a0, a1, a2, a3, a4, a5, b0, b1, b2, b3, b4;",
            "setp.ne.u32 ps, {shift}, 0;",
            "and.b32 a0, {shift}, 8;",
            "setp.ne.u32 p8, a0, 0;",
            "and.b32 a0, {shift}, 4;",
            "setp.ne.u32 p4, a0, 0;",
            "cvta.to.shared.u64 s, {p};",
            "ld.shared.v4.u32 {{l0, l1, l2, l3}}, [s];",
            "mov.b32 h0, 0; mov.b32 h1, 0; mov.b32 h2, 0; mov.b32 h3, 0;",
            "@ps ld.shared.v4.u32 {{h0, h1, h2, h3}}, [s+16];",
            "selp.b32 a0, l2, l0, p8;",
            "selp.b32 a1, l3, l1, p8;",
            "selp.b32 a2, h0, l2, p8;",
            "selp.b32 a3, h1, l3, p8;",
            "selp.b32 a4, h2, h0, p8;",
            "selp.b32 a5, h3, h1, p8;",
            "selp.b32 b0, a1, a0, p4;",
            "selp.b32 b1, a2, a1, p4;",
            "selp.b32 b2, a3, a2, p4;",
            "selp.b32 b3, a4, a3, p4;",
            "selp.b32 b4, a5, a4, p4;",
            "shf.r.clamp.b32 {o0}, b0, b1, {bits};",
            "shf.r.clamp.b32 {o1}, b1, b2, {bits};",
            "shf.r.clamp.b32 {o2}, b2, b3, {bits};",
            "shf.r.clamp.b32 {o3}, b3, b4, {bits}; }}",
            o0 = out(reg32) o[0], o1 = out(reg32) o[1], o2 = out(reg32) o[2], o3 = out(reg32) o[3],
            p = in(reg64) p as u64, shift = in(reg32) shift, bits = in(reg32) 8 * (shift % 4),
            options(readonly, nostack, preserves_flags)
        );
    }
    o
}

/// `v` through an opaque copy: the compiler cannot tell the result equals `v`, so it does not
/// merge computations on it with earlier ones on `v` (nor a test of it with an earlier test
/// of `v`).
#[inline(always)]
pub fn opaque_u32(mut v: u32) -> u32 {
    // SAFETY: a register move; no memory access. Not `pure`, so it is not merged either.
    unsafe { asm!("mov.b32 {0}, {0};", inout(reg32) v, options(nomem, nostack, preserves_flags)) };
    v
}

/// The low word of `(hi:lo) >> n` (`shf.r.clamp`; `n` is at most 32).
#[inline(always)]
pub fn funnel_shift_right(lo: u32, hi: u32, n: u32) -> u32 {
    let d: u32;
    // SAFETY: arithmetic only.
    unsafe {
        asm!("shf.r.clamp.b32 {0}, {1}, {2}, {3};", out(reg32) d, in(reg32) lo, in(reg32) hi,
             in(reg32) n, options(pure, nomem, nostack, preserves_flags));
    }
    d
}

/// `a / b` as `div.full.f32`: at most 2 ulp from the rounded quotient over the full range,
/// with no slow-path subroutine (`div.rn` has one).
#[inline(always)]
pub fn div_full(a: f32, b: f32) -> f32 {
    let q: f32;
    // SAFETY: arithmetic only.
    unsafe {
        asm!("div.full.f32 {0}, {1}, {2};", out(reg32) q, in(reg32) a, in(reg32) b,
             options(pure, nomem, nostack, preserves_flags));
    }
    q
}

/// `1 / sqrt(x)` as `rsqrt.approx.f32` (relative error at most 2^-22.9; subnormal inputs
/// handled, unlike the `.ftz` form, so a tiny `eps` still gives a finite result).
#[inline(always)]
pub fn rsqrt_approx(x: f32) -> f32 {
    let r: f32;
    // SAFETY: arithmetic only.
    unsafe {
        asm!("rsqrt.approx.f32 {0}, {1};", out(reg32) r, in(reg32) x,
             options(pure, nomem, nostack, preserves_flags));
    }
    r
}

/// Asks for the 128-byte line at `p` in L2 (`prefetch.global.L2`): no data returns, so it may
/// be issued before `grid_dependency_wait` even for memory the previous grid writes (L2 is
/// where every write lands; nothing stale can be observed).
///
/// # Safety
/// `p` is a global address inside an allocation.
#[inline(always)]
pub unsafe fn prefetch_l2(p: u64) {
    // SAFETY: caller's contract; a prefetch has no architectural effect.
    unsafe {
        asm!("prefetch.global.L2 [{0}];", in(reg64) p, options(nostack, preserves_flags));
    }
}

/// Asks L2 for the `bytes` bytes at `p` (`cp.async.bulk.prefetch.L2.global`, sm_90): one
/// instruction for a whole range, no data returns and nothing waits for it.
///
/// # Safety
/// `p` is 16-byte aligned, `bytes` a multiple of 16, and the range inside one allocation.
#[cfg(ferrofuse_bulk_copy)]
#[inline(always)]
pub unsafe fn bulk_prefetch_l2(p: u64, bytes: u32) {
    // SAFETY: caller's contract; a prefetch has no architectural effect.
    unsafe {
        asm!(
            "cp.async.bulk.prefetch.L2.global [{0}], {1};",
            in(reg64) p,
            in(reg32) bytes,
            options(nostack, preserves_flags)
        );
    }
}

/// Bulk copies from global to shared memory by the copy engine (sm_90): one thread starts a
/// copy of a whole range, which completes on an mbarrier in shared memory, and every thread
/// of the block waits on that barrier's phase. The issuing thread does not wait, and no
/// register holds the bytes in flight.
#[cfg(ferrofuse_bulk_copy)]
pub mod bulk {
    use core::arch::asm;

    /// Initializes the mbarrier at the shared-memory address `bar` (8-byte aligned) for one
    /// arrival per phase and makes it visible to the copy engine; the block's other threads
    /// may use it after a barrier that follows.
    ///
    /// # Safety
    /// `bar` is 8 bytes of this block's shared memory that nothing else uses; one thread
    /// initializes it, once.
    #[inline(always)]
    pub unsafe fn init_barrier(bar: u32) {
        // SAFETY: the caller's contract.
        unsafe {
            asm!(
                "mbarrier.init.shared::cta.b64 [{0}], 1;",
                "fence.mbarrier_init.release.cluster;",
                in(reg32) bar,
                options(nostack, preserves_flags)
            );
        }
    }

    /// Copies `bytes` bytes from global `src[i]` to the shared-memory address `dst[i]`, for
    /// `i` = 0 and 1, completing on `bar`'s current phase, which this call arrives on (its one
    /// arrival) after adding both copies' bytes to the bytes that phase waits for. Orders this
    /// thread's earlier shared-memory accesses before the copies' writes (`fence.proxy.async`:
    /// the copy engine is another proxy), so a buffer read before a block barrier that
    /// precedes this call may be refilled.
    ///
    /// # Safety
    /// `dst` and `src` 16-byte aligned, `bytes` a multiple of 16 and `2 * bytes` below 2^20;
    /// the sources inside allocations, not written while the copies run; the destinations
    /// inside this block's shared memory, not overlapping, not accessed until `bar`'s phase
    /// completes; `bar` initialized by [`init_barrier`], with no other arrival or copy on this
    /// phase.
    #[inline(always)]
    pub unsafe fn copy_pair_to_shared(dst: [u32; 2], src: [u64; 2], bytes: u32, bar: u32) {
        // SAFETY: the caller's contract.
        unsafe {
            asm!(
                "{{ .reg .b32 both; add.u32 both, {4}, {4};",
                "fence.proxy.async.shared::cta;",
                "mbarrier.arrive.expect_tx.shared::cta.b64 _, [{5}], both;",
                "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [{0}], [{2}], {4}, [{5}];",
                "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [{1}], [{3}], {4}, [{5}]; }}",
                in(reg32) dst[0], in(reg32) dst[1], in(reg64) src[0], in(reg64) src[1],
                in(reg32) bytes, in(reg32) bar,
                options(nostack, preserves_flags)
            );
        }
    }

    /// Arrives on `bar`'s current phase (its one arrival) after adding `bytes` to the bytes
    /// that phase waits for: the copies [`copy_to_shared`] then issues on it must add up to
    /// `bytes`. Orders this thread's earlier shared-memory accesses before those copies'
    /// writes, as [`copy_pair_to_shared`] does.
    ///
    /// # Safety
    /// `bar` initialized by [`init_barrier`], with no other arrival on this phase; `bytes`
    /// below 2^20.
    #[inline(always)]
    pub unsafe fn expect_bytes(bar: u32, bytes: u32) {
        // SAFETY: the caller's contract.
        unsafe {
            asm!(
                "fence.proxy.async.shared::cta;",
                "mbarrier.arrive.expect_tx.shared::cta.b64 _, [{0}], {1};",
                in(reg32) bar, in(reg32) bytes,
                options(nostack, preserves_flags)
            );
        }
    }

    /// Copies `bytes` bytes from global `src` to the shared-memory address `dst`, completing
    /// on `bar`'s current phase, whose expected bytes [`expect_bytes`] counted these.
    ///
    /// # Safety
    /// `dst` and `src` 16-byte aligned, `bytes` a multiple of 16; the source inside an
    /// allocation, not written while the copy runs; the destination inside this block's
    /// shared memory, not accessed until `bar`'s phase completes.
    #[inline(always)]
    pub unsafe fn copy_to_shared(dst: u32, src: u64, bytes: u32, bar: u32) {
        // SAFETY: the caller's contract.
        unsafe {
            asm!(
                "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [{0}], [{1}], {2}, [{3}];",
                in(reg32) dst, in(reg64) src, in(reg32) bytes, in(reg32) bar,
                options(nostack, preserves_flags)
            );
        }
    }

    /// Waits until the phase of `bar` with parity `parity` (0 for its first phase, then
    /// alternating) has completed: the copies on it are then visible to this thread.
    ///
    /// # Safety
    /// `bar` initialized by [`init_barrier`].
    #[inline(always)]
    pub unsafe fn wait(bar: u32, parity: u32) {
        loop {
            let done: u32;
            // SAFETY: the caller's contract; reads the barrier only. Not `nomem`: the shared
            // memory the phase guards is read after it.
            unsafe {
                asm!(
                    "{{ .reg .pred p;",
                    "mbarrier.try_wait.parity.shared::cta.b64 p, [{1}], {2};",
                    "selp.u32 {0}, 1, 0, p; }}",
                    out(reg32) done, in(reg32) bar, in(reg32) parity,
                    options(nostack, preserves_flags)
                );
            }
            if done != 0 {
                return;
            }
        }
    }
}

/// Programmatic dependent launch (sm_90+; see `Kernels::launch` on the host), first half:
/// wait until the previous grid in the stream has completed and its memory operations are
/// visible. Every kernel launched that way calls this before touching global memory. The norm
/// kernels call it after the work that needs none (parameter reads, index math, a prefetch
/// that reads the pointers): an early-placed block then has its parameters in the constant
/// cache when the wait ends. On archs without `griddepcontrol` it is empty and the host
/// launches normally.
#[inline(always)]
pub fn grid_dependency_wait() {
    #[cfg(ferrofuse_pdl)]
    // SAFETY: only orders this grid after its stream predecessor.
    unsafe {
        asm!("griddepcontrol.wait;", options(nostack, preserves_flags));
    }
}

/// Programmatic dependent launch, second half: let the next grid in the stream start
/// launching (its own `grid_dependency_wait` still waits for this grid to finish).
#[inline(always)]
pub fn launch_dependents() {
    #[cfg(ferrofuse_pdl)]
    // SAFETY: only allows the next grid to be scheduled early; it orders no memory.
    unsafe {
        asm!(
            "griddepcontrol.launch_dependents;",
            options(nostack, preserves_flags)
        );
    }
}

/// Both halves, at the start of every kernel launched with programmatic dependent launch:
/// wait for the previous grid, then let the next one launch. In this order the next grid is
/// scheduled while this one works, but no chain of grids launches ahead (triggering before
/// waiting let each early grid trigger the next, which made small launches slower; see
/// bench/TUNING.md).
#[inline(always)]
pub fn grid_dependency_sync() {
    grid_dependency_wait();
    launch_dependents();
}

/// Thread and block coordinates, widened to u64 before any arithmetic.
pub mod grid {
    use core::arch::nvptx;

    #[inline(always)]
    pub fn thread_x() -> u64 {
        // SAFETY: reading a special register has no preconditions.
        unsafe { nvptx::_thread_idx_x() as u64 }
    }
    #[inline(always)]
    pub fn block_x() -> u64 {
        // SAFETY: as above.
        unsafe { nvptx::_block_idx_x() as u64 }
    }
    #[inline(always)]
    pub fn block_dim_x() -> u64 {
        // SAFETY: as above.
        unsafe { nvptx::_block_dim_x() as u64 }
    }
    #[inline(always)]
    pub fn grid_dim_x() -> u64 {
        // SAFETY: as above.
        unsafe { nvptx::_grid_dim_x() as u64 }
    }
}
