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
