//! CPU reference in f64: what every kernel result is compared against.
//!
//! Formulas follow PyTorch (`torch.nn.functional.silu`, `gelu(approximate="none"|"tanh")`,
//! `relu`) evaluated in f64, with f64 `erf` from `libm`.

use ferrofuse_common::Activation;

/// `act(x)` in f64.
pub fn act(act: Activation, x: f64) -> f64 {
    match act {
        Activation::Silu => x / (1.0 + (-x).exp()),
        Activation::GeluErf => 0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2)),
        Activation::GeluTanh => {
            let k = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())
        }
        Activation::Relu => {
            if x <= 0.0 {
                0.0
            } else {
                x
            }
        }
    }
}

/// `act'(x)` in f64 (analytic; checked against finite differences in the tests).
pub fn act_grad(act: Activation, x: f64) -> f64 {
    match act {
        Activation::Silu => {
            let s = 1.0 / (1.0 + (-x).exp());
            s * (1.0 + x * (1.0 - s))
        }
        Activation::GeluErf => {
            let cdf = 0.5 * (1.0 + libm::erf(x / std::f64::consts::SQRT_2));
            let pdf = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
            cdf + x * pdf
        }
        Activation::GeluTanh => {
            let k = (2.0 / std::f64::consts::PI).sqrt();
            let u = k * (x + 0.044715 * x * x * x);
            let t = u.tanh();
            0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x)
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
