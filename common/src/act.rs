//! Activation math in f32, shared by the kernels and the host tests.
//!
//! Every function takes and returns f32 whatever the storage dtype (the dtype contract: inputs
//! are widened right after the load and narrowed only at the store). `exp` is built on `exp2`
//! (`expf` has no NVPTX lowering): one `ex2.approx.ftz.f32` on nvptx64, `f32::exp2` on the
//! host.
//! `host/tests/act_cpu.rs` measures the host build of each function against f64 (exact `exp2`
//! and division there); the GPU's `ex2.approx` / `rcp.approx` forms are covered by the
//! `gpu_*` tests' ulp bounds against the same f64 reference.
//!
//! Behaviour at the extremes follows `torch.nn.functional` (checked in the tests):
//! `silu(-inf)`, `gelu(-inf)` are NaN (PyTorch computes `x * 0` there too), `act(+inf) = +inf`,
//! NaN propagates, and the sigmoid never overflows (`1 / (1 + inf) = 0`).

use core::f32::consts::{FRAC_1_SQRT_2, LOG2_E};

use crate::Activation;

/// `2^x`.
///
/// On the GPU `ex2.approx.ftz.f32`: results below 2^-126 flush to 0. Without `.ftz` ptxas wraps
/// every `MUFU.EX2` in a compare and two predicated multiplies to produce subnormals, which no
/// activation here needs (`1 + e^-x` is 1 there; GELU-erf's tail is below 1e-38 of `x`).
#[inline(always)]
pub fn exp2(x: f32) -> f32 {
    #[cfg(target_arch = "nvptx64")]
    {
        let r: f32;
        // SAFETY: a register-only instruction, defined for every f32 (inf, NaN too).
        unsafe {
            core::arch::asm!("ex2.approx.ftz.f32 {0}, {1};", out(reg32) r, in(reg32) x,
                options(pure, nomem, nostack, preserves_flags));
        }
        r
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        x.exp2()
    }
}

/// `a * b + c` with one rounding (`fma.rn.f32` on the GPU).
#[inline(always)]
pub fn fma(a: f32, b: f32, c: f32) -> f32 {
    #[cfg(target_arch = "nvptx64")]
    {
        core::intrinsics::fmaf32(a, b, c)
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        a.mul_add(b, c)
    }
}

/// `e^x` via `2^(x log2 e)`.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    exp2(x * LOG2_E)
}

/// `1 / x`. On the GPU one `rcp.approx.ftz.f32` (max error 1 ulp; `1/inf = 0`, NaN stays
/// NaN; a denormal result flushes to 0, a denormal input to 0 first, giving +-inf) instead of
/// the IEEE division's multi-instruction sequence with its slow-path call; on the host an exact
/// division.
#[inline(always)]
pub fn recip(x: f32) -> f32 {
    #[cfg(target_arch = "nvptx64")]
    {
        let r: f32;
        // SAFETY: a pure register operation, defined for every input.
        unsafe {
            core::arch::asm!("rcp.approx.ftz.f32 {0}, {1};", out(reg32) r, in(reg32) x,
                options(pure, nomem, nostack, preserves_flags));
        }
        r
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        1.0 / x
    }
}

/// Numerically stable logistic function: for x -> -inf, `exp(-x)` overflows to +inf and the
/// reciprocal goes to 0 (never NaN); for x -> +inf it goes to 1.
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    recip(1.0 + exp(-x))
}

/// Complementary error function, Chebyshev fit (Numerical Recipes `erfcc`): relative error
/// below 1.2e-7 on the whole real line in exact arithmetic. Relative accuracy of `erfc` (not
/// only absolute accuracy of `erf`) keeps `gelu(x)` accurate for negative x, where
/// `1 + erf(x / sqrt 2)` would cancel.
#[inline(always)]
pub fn erfc(z: f32) -> f32 {
    let za = if z < 0.0 { -z } else { z };
    let t = recip(1.0 + 0.5 * za);
    let p = -1.265_512_2
        + t * (1.000_023_7
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let r = t * exp(p - za * za);
    if z >= 0.0 { r } else { 2.0 - r }
}

/// `sqrt(2 / pi)` and GELU-tanh's cubic coefficient, in f64 for the folded constants below.
const SQRT_2_OVER_PI_F64: f64 = 0.797_884_560_802_865_4;
const GELU_TANH_K_F64: f64 = 0.044_715;
const SQRT_2_OVER_PI: f32 = SQRT_2_OVER_PI_F64 as f32;
const GELU_TANH_K: f32 = GELU_TANH_K_F64 as f32;
/// `-2u log2 e = x (GELU_TANH_A + GELU_TANH_B x^2)`, the constants folded in f64 (see
/// [`gelu_tanh_gate`]).
const GELU_TANH_A: f32 = (-2.0 * SQRT_2_OVER_PI_F64 * core::f64::consts::LOG2_E) as f32;
const GELU_TANH_B: f32 =
    (-2.0 * SQRT_2_OVER_PI_F64 * GELU_TANH_K_F64 * core::f64::consts::LOG2_E) as f32;

/// GELU-tanh's gate `(1 + tanh(u)) / 2 = sigmoid(2u)` (no cancellation for negative `x`),
/// `u = sqrt(2/pi) (x + 0.044715 x^3)`, with `e^(-2u)` computed as `2^(x (A + B x^2))`:
/// three operations (one a fused multiply-add) before the `ex2` instead of seven. At 64-256
/// rows the gated kernel's time is mostly the instructions after the loads (bench/TUNING.md).
#[inline(always)]
fn gelu_tanh_gate(x: f32) -> f32 {
    recip(1.0 + exp2(x * fma(GELU_TANH_B, x * x, GELU_TANH_A)))
}

const INV_SQRT_2PI: f32 = 0.398_942_3;

/// An activation as a type, so a kernel body is monomorphized per activation.
pub trait GatedAct {
    /// `act(x)`.
    fn value(x: f32) -> f32;
    /// `(act(x), act'(x))`, sharing the transcendental between the two.
    fn value_and_grad(x: f32) -> (f32, f32);
}

pub struct Silu;
pub struct GeluErf;
pub struct GeluTanh;
pub struct Relu;

impl GatedAct for Silu {
    #[inline(always)]
    fn value(x: f32) -> f32 {
        x * sigmoid(x)
    }
    #[inline(always)]
    fn value_and_grad(x: f32) -> (f32, f32) {
        let s = sigmoid(x);
        // silu'(x) = s (1 + x (1 - s))
        (x * s, s * (1.0 + x * (1.0 - s)))
    }
}

impl GatedAct for GeluErf {
    #[inline(always)]
    fn value(x: f32) -> f32 {
        // 0.5 x (1 + erf(x/sqrt2)) == 0.5 x erfc(-x/sqrt2)
        0.5 * x * erfc(-x * FRAC_1_SQRT_2)
    }
    #[inline(always)]
    fn value_and_grad(x: f32) -> (f32, f32) {
        let cdf2 = erfc(-x * FRAC_1_SQRT_2); // 2 * Phi(x)
        let pdf = INV_SQRT_2PI * exp(-0.5 * x * x);
        (0.5 * x * cdf2, 0.5 * cdf2 + x * pdf)
    }
}

impl GatedAct for GeluTanh {
    #[inline(always)]
    fn value(x: f32) -> f32 {
        x * gelu_tanh_gate(x)
    }
    #[inline(always)]
    fn value_and_grad(x: f32) -> (f32, f32) {
        let s = gelu_tanh_gate(x);
        let du = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_TANH_K * x * x);
        (x * s, s + x * 2.0 * s * (1.0 - s) * du)
    }
}

impl GatedAct for Relu {
    #[inline(always)]
    fn value(x: f32) -> f32 {
        // Written so NaN propagates, as torch.relu does.
        if x <= 0.0 { 0.0 } else { x }
    }
    #[inline(always)]
    fn value_and_grad(x: f32) -> (f32, f32) {
        // torch's threshold_backward masks on the output `relu(x) <= 0`; NaN passes the gradient.
        if x <= 0.0 { (0.0, 0.0) } else { (x, 1.0) }
    }
}

/// `act(x)` for an activation chosen at run time (host-side convenience and tests).
pub fn value(act: Activation, x: f32) -> f32 {
    match act {
        Activation::Silu => Silu::value(x),
        Activation::GeluErf => GeluErf::value(x),
        Activation::GeluTanh => GeluTanh::value(x),
        Activation::Relu => Relu::value(x),
    }
}

/// `(act(x), act'(x))` for an activation chosen at run time.
pub fn value_and_grad(act: Activation, x: f32) -> (f32, f32) {
    match act {
        Activation::Silu => Silu::value_and_grad(x),
        Activation::GeluErf => GeluErf::value_and_grad(x),
        Activation::GeluTanh => GeluTanh::value_and_grad(x),
        Activation::Relu => Relu::value_and_grad(x),
    }
}
