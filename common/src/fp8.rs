//! FP8 E4M3 outputs: the f32 -> E4M3 conversion and the scale rule, shared by the kernels and
//! the host tests.
//!
//! The conversion is round to nearest, ties to even, saturating to +-448 (what
//! `cvt.rn.satfinite.e4m3x2.f32` does on sm_89 and newer, and what vLLM's FP8 kernels do);
//! NaN stays NaN, the sign of zero is kept. [`e4m3_from_f32`] computes it with integer and
//! f32 operations only: the sm_80 kernels run it (that arch has no FP8 conversion), and the
//! host tests check it against the f64 reference (`ferrofuse::reference::fp8`) value by value.

/// Largest finite E4M3 value.
pub const E4M3_MAX: f32 = 448.0;

/// The default lower bound of a dynamic scale, `1 / (448 * 512)` (vLLM's
/// `min_scaling_factor`): a row or group of zeros gets it, and quantises to zeros.
pub const DEFAULT_MIN_SCALE: f32 = 1.0 / (448.0 * 512.0);

/// `x` as an E4M3 byte: round to nearest even, saturate to +-448 (infinities too), NaN to
/// `0x7f` / `0xff` (its sign kept), zero keeps its sign.
#[inline(always)]
pub fn e4m3_from_f32(x: f32) -> u8 {
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let abs = bits & 0x7fff_ffff;
    if abs > 0x7f80_0000 {
        return sign | 0x7f;
    }
    // 448 and above (infinity included): values in [448, 464) round to 448 anyway, larger
    // ones would round past the largest finite value and saturate.
    if abs >= 0x43e0_0000 {
        return sign | 0x7e;
    }
    // Normal E4M3 values (>= 2^-6): keep 3 of the 23 mantissa bits, rounding on bit 19 with
    // ties to the even result; a carry into the exponent is the right next value.
    if abs >= 0x3c80_0000 {
        let rounded = abs + 0x7_ffff + ((abs >> 20) & 1);
        return sign | ((rounded >> 20) - ((127 - 7) << 3)) as u8;
    }
    // Subnormal E4M3 values are multiples of 2^-9: `abs * 512` (exact) rounded to an integer,
    // ties to even, by adding and removing 2^23 (the sum's unit is 1). 8 encodes 2^-6.
    let v = f32::from_bits(abs) * 512.0;
    let m = (v + 8_388_608.0) - 8_388_608.0;
    sign | m as u8
}

/// The dynamic scale of a row or group whose largest magnitude is `amax`:
/// `max(min(amax, ub) / 448, min_scale)` in f32 (`ub` = +inf for no bound).
#[inline(always)]
pub fn dynamic_scale(amax: f32, min_scale: f32, ub: f32) -> f32 {
    let a = if amax < ub { amax } else { ub };
    // `a / 448`, correctly rounded (see `div_near`) for every `a` above 448 * 2^-126. In the
    // select form for sm_89+ (with branches the per-token norm kernel was 9-12% slower on an
    // H200), with branches elsewhere (the sm_80 f32 norm rows of 32 per thread spilled with
    // the select form). The same value either way.
    #[cfg(ferrofuse_fp8_cvt)]
    let s = div_near(a, E4M3_MAX, 1.0 / E4M3_MAX);
    #[cfg(not(ferrofuse_fp8_cvt))]
    let s = div_by(a, E4M3_MAX, 1.0 / E4M3_MAX);
    if s > min_scale { s } else { min_scale }
}

/// [`crate::GatedFp8Params::scheme`]: one scale for the tensor, read from device memory.
pub const FP8_STATIC: u32 = 0;
/// One scale per row, from the row's largest magnitude.
pub const FP8_PER_TOKEN: u32 = 1;
/// One scale per group of consecutive columns, from the group's largest magnitude.
pub const FP8_PER_GROUP: u32 = 2;

/// The reciprocal [`div_by`] multiplies by: `1 / scale` correctly rounded (`rcp.rn.ftz.f32`
/// on the GPU: no slow-path subroutine, and exact here, where both are normal), or 0 when
/// `scale` is outside `[2^-100, 2^100]` (then [`div_by`] divides another way).
#[inline(always)]
pub fn reciprocal(scale: f32) -> f32 {
    #[cfg(target_arch = "nvptx64")]
    let r = {
        let r: f32;
        // SAFETY: a register-only instruction, defined for every f32.
        unsafe {
            core::arch::asm!("rcp.rn.ftz.f32 {0}, {1};", out(reg32) r, in(reg32) scale,
                options(pure, nomem, nostack, preserves_flags));
        }
        r
    };
    #[cfg(not(target_arch = "nvptx64"))]
    let r = 1.0 / scale;
    // A select, not a branch: a kernel's loads need not wait for a loaded scale.
    let in_range = (7.888_609e-31..=1.267_650_6e30).contains(&scale);
    if in_range { r } else { 0.0 }
}

/// `y / scale` for a scale outside `[2^-100, 2^100]`: `div.full.f32` on the GPU (within 2
/// ulp; `div.rn`'s slow-path subroutine would cost the kernels their registers), `/` here.
/// The only place where the kernels and the reference may differ in the last bit of the
/// f32 quotient.
#[inline(always)]
pub fn divide_far(y: f32, scale: f32) -> f32 {
    #[cfg(target_arch = "nvptx64")]
    {
        let q: f32;
        // SAFETY: arithmetic only.
        unsafe {
            core::arch::asm!("div.full.f32 {0}, {1}, {2};", out(reg32) q, in(reg32) y,
                in(reg32) scale, options(pure, nomem, nostack, preserves_flags));
        }
        q
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        y / scale
    }
}

/// `y / scale`, correctly rounded, given `inv = reciprocal(scale)` nonzero (a scale in
/// `[2^-100, 2^100]`): `q = y * inv`, then one correction `q - (q * scale - y) * inv` with the
/// residual exact (an FMA). With `inv` the correctly rounded reciprocal and `q` within an ulp
/// of the quotient, that is the correctly rounded quotient (Markstein's theorem) wherever `q`
/// is a normal f32; where `q` overflows the quotient saturates to 448 either way, and where it
/// is subnormal (below 2^-126) it converts to a signed zero either way.
///
/// The residual is taken as `q * scale - y`, not `y - q * scale`: the two differ only in sign
/// (rounding to nearest is symmetric) except where the residual is exactly zero, which is
/// `+0` either way; subtracted from `q`, that `+0` keeps the sign of a zero quotient (`-0 - +0
/// = -0`), where added to it, it would turn the quotient of `y = -0` into `+0`.
///
/// Branch-free (selects only), so a kernel's per-element divisions stay in one basic block
/// that the compiler can interleave: a multiply, two FMAs and a select instead of
/// `div.rn.f32`, whose slow-path subroutine doubled the per-token kernel's registers.
/// `host/tests/fp8_cpu.rs` compares it with `/` on random and boundary values.
#[inline(always)]
pub fn div_near(y: f32, scale: f32, inv: f32) -> f32 {
    let q = y * inv;
    let r = crate::act::fma(q, scale, -y);
    let c = crate::act::fma(-r, inv, q);
    // An overflowing `q` (+-inf) makes `c` NaN; the quotient is `q` then (it saturates).
    if c.is_nan() { q } else { c }
}

/// `y / scale`: the value of [`div_near`] for a scale in `[2^-100, 2^100]` (`inv` nonzero),
/// else [`divide_far`]; written with branches (see [`dynamic_scale`]).
#[inline(always)]
pub fn div_by(y: f32, scale: f32, inv: f32) -> f32 {
    if inv == 0.0 {
        return divide_far(y, scale);
    }
    let q = y * inv;
    if !q.is_finite() {
        return q;
    }
    let r = crate::act::fma(-q, scale, y);
    // r = 0: q is exact (and keeps the sign of a zero quotient, which `q + 0` would not).
    if r == 0.0 {
        q
    } else {
        crate::act::fma(r, inv, q)
    }
}
