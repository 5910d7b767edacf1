//! CPU reference in f64: what every kernel result is compared against.
//!
//! Formulas follow PyTorch (`torch.nn.functional.silu`, `gelu(approximate="none"|"tanh")`,
//! `relu`) evaluated in f64, with f64 `erf` from `libm`.
//!
//! RMSNorm: the formulas of [`crate::norm`] in f64, emulating exactly the steps the contract
//! fixes in lower precision (the f32 residual add, the rounding of `h` to the storage dtype,
//! `1 + w` formed in f32, the Hugging Face mode's rounding of `h * rstd`) and nothing else.

use ferrofuse_common::Activation;

use crate::tensor::Element;

/// `act(x)` in f64.
pub fn act(act: Activation, x: f64) -> f64 {
    match act {
        Activation::Silu => x / (1.0 + (-x).exp()),
        // `1 + erf(x / sqrt 2)` would cancel for negative x (ten percent off at x = -8, even
        // in f64): `erfc(-x / sqrt 2)` is the same value without the cancellation.
        Activation::GeluErf => 0.5 * x * libm::erfc(-x / std::f64::consts::SQRT_2),
        // `(1 + tanh(u)) / 2 = 1 / (1 + e^(-2u))`, again without cancelling for negative x.
        Activation::GeluTanh => x / (1.0 + (-2.0 * gelu_tanh_u(x)).exp()),
        Activation::Relu => {
            if x <= 0.0 {
                0.0
            } else {
                x
            }
        }
    }
}

/// GELU-tanh's `u = sqrt(2 / pi) (x + 0.044715 x^3)`.
fn gelu_tanh_u(x: f64) -> f64 {
    (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)
}

/// `act'(x)` in f64 (analytic; checked against finite differences in the tests).
pub fn act_grad(act: Activation, x: f64) -> f64 {
    match act {
        Activation::Silu => {
            let s = 1.0 / (1.0 + (-x).exp());
            s * (1.0 + x * (1.0 - s))
        }
        Activation::GeluErf => {
            let cdf = 0.5 * libm::erfc(-x / std::f64::consts::SQRT_2);
            let pdf = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
            cdf + x * pdf
        }
        Activation::GeluTanh => {
            // With s = (1 + tanh(u)) / 2: 1 - tanh(u)^2 = 4 s (1 - s).
            let k = (2.0 / std::f64::consts::PI).sqrt();
            let s = 1.0 / (1.0 + (-2.0 * gelu_tanh_u(x)).exp());
            s + 2.0 * x * s * (1.0 - s) * k * (1.0 + 3.0 * 0.044715 * x * x)
        }
        Activation::Relu => {
            if x <= 0.0 {
                0.0
            } else {
                1.0
            }
        }
    }
}

/// `y = act(a) * b`, element-wise.
pub fn gated_forward(act: Activation, a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter()
        .zip(b)
        .map(|(&a, &b)| self::act(act, a) * b)
        .collect()
}

/// `(da, db) = (dy * b * act'(a), dy * act(a))`, element-wise.
pub fn gated_backward(act: Activation, a: &[f64], b: &[f64], dy: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let da = a
        .iter()
        .zip(b)
        .zip(dy)
        .map(|((&a, &b), &g)| g * b * act_grad(act, a))
        .collect();
    let db = a
        .iter()
        .zip(dy)
        .map(|(&a, &g)| g * self::act(act, a))
        .collect();
    (da, db)
}

/// What the RMSNorm forward reference follows of the kernels' contract.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RmsNormRef {
    /// The f32 eps the kernel adds (converted exactly to f64).
    pub eps: f32,
    /// `(1 + w)`, formed in f32.
    pub gemma: bool,
    /// Hugging Face numerics: statistics and normalisation from `h` as stored, and
    /// `h * rstd` rounded to the storage dtype before the multiply by the weight.
    pub hf: bool,
    /// Normalise `h` as stored (rounded) also in the f32 mode: what the forward's looped
    /// path does (`NormGeometry::looped`); the statistics still use the f32 sum.
    pub normalize_stored_h: bool,
}

/// One row of the forward reference.
#[derive(Clone, Debug, PartialEq)]
pub struct RmsNormRow {
    /// `h` exactly as the kernel must store it (the f32 sum rounded to the storage dtype).
    pub h: Vec<f64>,
    /// `y` in f64, before the final rounding to the storage dtype.
    pub y: Vec<f64>,
    pub rstd: f64,
}

/// `x + residual` as the kernels form it: one f32 addition.
pub fn rmsnorm_add(x: f64, residual: f64) -> f64 {
    (x as f32 + residual as f32) as f64
}

/// The weight factor: `w`, or Gemma's `1 + w` formed in f32.
pub fn rmsnorm_weight(w: f64, gemma: bool) -> f64 {
    if gemma { (1.0f32 + w as f32) as f64 } else { w }
}

/// `1 / sqrt(sum(v^2) / len + eps)`.
pub fn rmsnorm_rstd(v: &[f64], eps: f64) -> f64 {
    let ms = v.iter().map(|a| a * a).sum::<f64>() / v.len() as f64;
    1.0 / (ms + eps).sqrt()
}

/// The Hugging Face mode's `y` for one element before its final rounding:
/// `round_T(h * rstd) * w_eff`.
pub fn rmsnorm_hf_y<T: Element>(h: f64, rstd: f64, w_eff: f64) -> f64 {
    T::from_f64(h * rstd).to_f64() * w_eff
}

/// Forward reference for one row of storage type `T`: `x`, `residual` (none: plain RMSNorm)
/// and the raw weight values `w` (of whatever dtype, as f64).
pub fn rmsnorm_forward_row<T: Element>(
    x: &[T],
    residual: Option<&[T]>,
    w: &[f64],
    opts: &RmsNormRef,
) -> RmsNormRow {
    let h32: Vec<f64> = match residual {
        Some(r) => x
            .iter()
            .zip(r)
            .map(|(a, b)| rmsnorm_add(a.to_f64(), b.to_f64()))
            .collect(),
        None => x.iter().map(|a| a.to_f64()).collect(),
    };
    let stored: Vec<f64> = h32.iter().map(|&v| T::from_f64(v).to_f64()).collect();
    let stats = if opts.hf { &stored } else { &h32 };
    let norm = if opts.hf || opts.normalize_stored_h {
        &stored
    } else {
        &h32
    };
    let rstd = rmsnorm_rstd(stats, opts.eps as f64);
    let y = norm
        .iter()
        .zip(w)
        .map(|(&h, &w)| {
            let w = rmsnorm_weight(w, opts.gemma);
            if opts.hf {
                rmsnorm_hf_y::<T>(h, rstd, w)
            } else {
                h * rstd * w
            }
        })
        .collect();
    RmsNormRow { h: stored, y, rstd }
}

/// The f32 `y` of one row exactly as the forward kernels compute it, given the `rstd` they
/// computed (its sum is the kernels' own order, which this does not repeat): `h = x +
/// residual` (one f32 addition; rounded to `T` in the HF mode and, for looped rows,
/// `normalize_stored_h`), `n = h * rstd` (rounded to `T` in the HF mode), `y = n * w_eff`
/// with `w_eff` the weight (`w`, already f32) or Gemma's `1 + w` in f32. The FP8 outputs are
/// this `y` quantised ([`fp8::quantize_rows`]).
pub fn rmsnorm_y_f32<T: Element>(
    x: &[T],
    residual: Option<&[T]>,
    w: &[f32],
    rstd: f32,
    opts: &RmsNormRef,
) -> Vec<f32> {
    let round = |v: f32| T::from_f64(v as f64).to_f64() as f32;
    x.iter()
        .enumerate()
        .map(|(i, a)| {
            let mut h = a.to_f64() as f32;
            if let Some(r) = residual {
                h += r[i].to_f64() as f32;
            }
            let w_eff = if opts.gemma { 1.0 + w[i] } else { w[i] };
            if opts.hf {
                round(round(h) * rstd) * w_eff
            } else if opts.normalize_stored_h {
                round(h) * rstd * w_eff
            } else {
                h * rstd * w_eff
            }
        })
        .collect()
}

/// Plain RMSNorm in exact arithmetic, `y = h * rstd(h) * w_eff` (for finite differences).
pub fn rmsnorm_exact(h: &[f64], w_eff: &[f64], eps: f64) -> Vec<f64> {
    let rstd = rmsnorm_rstd(h, eps);
    h.iter().zip(w_eff).map(|(&h, &w)| h * rstd * w).collect()
}

/// Backward reference for `rows x hidden` (row-major, dense): returns `(dx, dw)` with
/// `dx = rstd * (g - h * rstd^2 * mean(h * g)) + dres`, `g = w_eff * dy`, and
/// `dw = sum over rows of dy * h * rstd`. `rstd` is the saved per-row value.
#[allow(clippy::too_many_arguments)]
pub fn rmsnorm_backward(
    dy: &[f64],
    h: &[f64],
    w: &[f64],
    rstd: &[f64],
    dres: Option<&[f64]>,
    rows: usize,
    hidden: usize,
    gemma: bool,
) -> (Vec<f64>, Vec<f64>) {
    let w_eff: Vec<f64> = w.iter().map(|&w| rmsnorm_weight(w, gemma)).collect();
    let mut dx = vec![0.0; rows * hidden];
    let mut dw = vec![0.0; hidden];
    for r in 0..rows {
        let row = r * hidden..(r + 1) * hidden;
        let (dy, h) = (&dy[row.clone()], &h[row.clone()]);
        let s = rstd[r];
        let mean = h
            .iter()
            .zip(dy)
            .zip(&w_eff)
            .map(|((h, g), w)| h * w * g)
            .sum::<f64>()
            / hidden as f64;
        for c in 0..hidden {
            let g = w_eff[c] * dy[c];
            let mut v = s * (g - h[c] * s * s * mean);
            if let Some(d) = dres {
                v += d[r * hidden + c];
            }
            dx[r * hidden + c] = v;
            dw[c] += dy[c] * h[c] * s;
        }
    }
    (dx, dw)
}

/// FP8 E4M3 outputs: the conversion and the three scaling schemes, as the GPU kernels are to
/// compute them (scales and `y / scale` in f32, then one rounding to FP8).
///
/// The format is `e4m3fn` (PyTorch's `torch.float8_e4m3fn`, what Hopper's FP8 GEMMs read): 1
/// sign, 4 exponent bits (bias 7), 3 mantissa bits, no infinities, `0x7f` / `0xff` NaN, largest
/// finite value 448, smallest subnormal 2^-9.
pub mod fp8 {
    /// Largest finite E4M3 value.
    pub const E4M3_MAX: f64 = 448.0;
    /// Gap between E4M3 subnormals (and the smallest one), 2^-9.
    const SUBNORMAL_STEP: f64 = 1.0 / 512.0;
    /// Smallest normal E4M3 value, 2^-6.
    const MIN_NORMAL: f64 = 8.0 * SUBNORMAL_STEP;

    /// `x` rounded to the nearest E4M3 value, ties to even, saturating to +-448 (the
    /// convention of vLLM's FP8 kernels and of `cvt.rn.satfinite.e4m3x2.f32`; a plain
    /// `.to(torch.float8_e4m3fn)` of a value beyond 464 would give NaN instead). NaN stays NaN;
    /// the sign of zero is kept.
    pub fn e4m3_round(x: f64) -> f64 {
        if x.is_nan() {
            return x;
        }
        let a = x.abs();
        // Normal values have 3 mantissa bits: the gap is 2^(e - 3) for a in [2^e, 2^(e+1)).
        let step = if a < MIN_NORMAL {
            SUBNORMAL_STEP
        } else {
            2f64.powi(a.log2().floor() as i32 - 3)
        };
        let r = ((a / step).round_ties_even() * step).min(E4M3_MAX);
        r.copysign(x)
    }

    /// The byte of [`e4m3_round`]`(x)`.
    pub fn e4m3_bits(x: f64) -> u8 {
        let r = e4m3_round(x);
        if r.is_nan() {
            return if r.is_sign_negative() { 0xff } else { 0x7f };
        }
        let sign = if r.is_sign_negative() { 0x80 } else { 0 };
        let a = r.abs();
        let magnitude = if a < MIN_NORMAL {
            // Subnormal (exponent field 0), or zero.
            (a / SUBNORMAL_STEP) as u8
        } else {
            let e = a.log2().floor() as i32;
            let mantissa = (a / 2f64.powi(e) * 8.0) as u8 - 8;
            (((e + 7) as u8) << 3) | mantissa
        };
        sign | magnitude
    }

    /// The value of an E4M3 byte.
    pub fn e4m3_value(bits: u8) -> f64 {
        let sign = if bits & 0x80 != 0 { -1.0 } else { 1.0 };
        let (e, m) = ((bits >> 3) & 0xf, bits & 7);
        if e == 0xf && m == 7 {
            return f64::NAN;
        }
        let magnitude = if e == 0 {
            m as f64 * SUBNORMAL_STEP
        } else {
            (8 + m) as f64 / 8.0 * 2f64.powi(e as i32 - 7)
        };
        sign * magnitude
    }

    /// How the scale of FP8 outputs is chosen.
    #[derive(Clone, Copy, Debug, PartialEq)]
    pub enum Scaling {
        /// One scale for the whole tensor, given by the caller.
        Static { scale: f32 },
        /// One scale per row: `max(min(amax, ub) / 448, min_scale)`.
        PerToken {
            min_scale: f32,
            scale_ub: Option<f32>,
        },
        /// One scale per `group` consecutive columns of a row, as `PerToken` over the group.
        PerGroup { group: usize, min_scale: f32 },
    }

    /// The scale for a row or group whose largest magnitude is `amax`, in f32: `max(amax /
    /// 448, min_scale)`, `amax` first bounded by `scale_ub`. A row of zeros gets `min_scale`,
    /// and so quantises to zeros, not NaN.
    pub fn dynamic_scale(amax: f32, min_scale: f32, scale_ub: Option<f32>) -> f32 {
        let amax = scale_ub.map_or(amax, |ub| amax.min(ub));
        (amax / E4M3_MAX as f32).max(min_scale)
    }

    /// The FP8 byte of `y` under `scale`: `y / scale` in f32, then [`e4m3_bits`].
    pub fn quantize(y: f32, scale: f32) -> u8 {
        e4m3_bits((y / scale) as f64)
    }

    /// Quantises a `rows x cols` row-major f32 result: the FP8 bytes (row-major) and the
    /// scales, one for `Static`, `rows` for `PerToken`, and `rows x cols / group` row-major for
    /// `PerGroup` (`cols` a multiple of `group`).
    pub fn quantize_rows(
        y: &[f32],
        rows: usize,
        cols: usize,
        scaling: Scaling,
    ) -> (Vec<u8>, Vec<f32>) {
        assert_eq!(y.len(), rows * cols);
        let amax = |v: &[f32]| v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let mut q = Vec::with_capacity(y.len());
        let mut scales = Vec::new();
        match scaling {
            Scaling::Static { scale } => {
                q.extend(y.iter().map(|&v| quantize(v, scale)));
                scales.push(scale);
            }
            Scaling::PerToken {
                min_scale,
                scale_ub,
            } => {
                for row in y.chunks(cols.max(1)).take(rows) {
                    let scale = dynamic_scale(amax(row), min_scale, scale_ub);
                    q.extend(row.iter().map(|&v| quantize(v, scale)));
                    scales.push(scale);
                }
            }
            Scaling::PerGroup { group, min_scale } => {
                assert!(
                    group > 0 && cols.is_multiple_of(group),
                    "cols must be a multiple of the group"
                );
                for chunk in y.chunks(group) {
                    let scale = dynamic_scale(amax(chunk), min_scale, None);
                    q.extend(chunk.iter().map(|&v| quantize(v, scale)));
                    scales.push(scale);
                }
            }
        }
        (q, scales)
    }
}
