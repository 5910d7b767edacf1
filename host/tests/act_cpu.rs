//! CPU tests of the activation math: the host build of the f32 functions the kernels run
//! (`ferrofuse_common::act`; exact `exp2` and division where the GPU uses `ex2.approx` and
//! `rcp.approx`) against the f64 reference, the reference derivatives against
//! finite differences, and the behaviour at extreme inputs against `torch.nn.functional`.

use ferrofuse::Activation;
use ferrofuse::act;
use ferrofuse::reference;

/// Inputs covering the curved region densely and the tails sparsely.
fn grid() -> impl Iterator<Item = f32> {
    let dense = (-16_000..=16_000).map(|i| i as f32 / 1000.0);
    let tails = (1..=400).flat_map(|i| [i as f32 * 0.25 + 16.0, -(i as f32 * 0.25 + 16.0)]);
    dense.chain(tails)
}

/// Worst `|got - want| / (atol + rtol |want|)` over the grid.
fn worst(
    f32_fn: impl Fn(f32) -> f32,
    f64_fn: impl Fn(f64) -> f64,
    atol: f64,
    rtol: f64,
) -> (f64, f32) {
    let mut worst = (0.0, 0.0);
    for x in grid() {
        let got = f32_fn(x) as f64;
        let want = f64_fn(x as f64);
        let e = (got - want).abs() / (atol + rtol * want.abs());
        if e > worst.0 {
            worst = (e, x);
        }
    }
    worst
}

#[test]
fn f32_activations_match_f64_reference() {
    // The activation math (with exact exp2 and division on the host) is held to 1e-6
    // absolute plus 1e-6 relative, an order below the GPU's approximate exp2 and reciprocal.
    for a in Activation::ALL {
        let (e, x) = worst(|x| act::value(a, x), |x| reference::act(a, x), 1e-6, 1e-6);
        println!(
            "{}: worst error {e:.3} of (1e-6 + 1e-6|ref|) at x = {x}",
            a.name()
        );
        assert!(e <= 1.0, "{} at x = {x}: {e} x the tolerance", a.name());
    }
}

#[test]
fn f32_gradients_match_f64_reference() {
    for a in Activation::ALL {
        let (e, x) = worst(
            |x| act::value_and_grad(a, x).1,
            |x| reference::act_grad(a, x),
            1e-6,
            1e-6,
        );
        println!(
            "{}': worst error {e:.3} of (1e-6 + 1e-6|ref|) at x = {x}",
            a.name()
        );
        assert!(e <= 1.0, "{}' at x = {x}: {e} x the tolerance", a.name());
        // value_and_grad's value is the same function as value.
        for x in grid() {
            assert_eq!(
                act::value_and_grad(a, x).0.to_bits(),
                act::value(a, x).to_bits()
            );
        }
    }
}

#[test]
fn reference_gradients_match_finite_differences() {
    for a in Activation::ALL {
        for i in -800..=800 {
            let x = i as f64 / 100.0 + 0.003; // off the ReLU kink at 0
            let h = 1e-6;
            let fd = (reference::act(a, x + h) - reference::act(a, x - h)) / (2.0 * h);
            let an = reference::act_grad(a, x);
            assert!(
                (fd - an).abs() <= 1e-7 + 1e-7 * an.abs(),
                "{}'({x}): analytic {an}, finite difference {fd}",
                a.name()
            );
        }
    }
}

/// What `torch.nn.functional` returns at the extremes (f32 opmath): `silu(-inf)` and
/// `gelu(-inf)` are NaN because PyTorch computes `-inf * 0` there; relu passes NaN through.
#[test]
fn extreme_inputs_behave_as_torch() {
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    let cases: [(Activation, [f32; 5]); 4] = [
        (Activation::Silu, [1e4, -0.0, inf, nan, nan]),
        (Activation::GeluErf, [1e4, -0.0, inf, nan, nan]),
        (Activation::GeluTanh, [1e4, -0.0, inf, nan, nan]),
        (Activation::Relu, [1e4, 0.0, inf, 0.0, nan]),
    ];
    let inputs = [1e4, -1e4, inf, -inf, nan];
    for (a, expected) in cases {
        for (x, want) in inputs.iter().zip(expected) {
            let got = act::value(a, *x);
            let same = (got.is_nan() && want.is_nan()) || got == want;
            assert!(same, "{}({x}) = {got}, torch gives {want}", a.name());
            let r = reference::act(a, *x as f64);
            let same_ref = (r.is_nan() && want.is_nan()) || r == want as f64;
            assert!(
                same_ref,
                "reference {}({x}) = {r}, torch gives {want}",
                a.name()
            );
        }
    }
}

#[test]
fn sigmoid_is_stable_for_large_magnitudes() {
    for x in [-1e30f32, -1e4, -100.0, -88.0, 88.0, 100.0, 1e4, 1e30] {
        let s = act::sigmoid(x);
        assert!(
            s.is_finite() && (0.0..=1.0).contains(&s),
            "sigmoid({x}) = {s}"
        );
    }
    assert_eq!(act::sigmoid(f32::NEG_INFINITY), 0.0);
    assert_eq!(act::sigmoid(f32::INFINITY), 1.0);
}

#[test]
fn gelu_forms_are_distinct() {
    // The erf and tanh forms differ by up to ~5e-4 (a wrong pick is a silent quality bug).
    let max = grid()
        .map(|x| (act::value(Activation::GeluErf, x) - act::value(Activation::GeluTanh, x)).abs())
        .fold(0.0f32, f32::max);
    assert!(
        max > 1e-4 && max < 1e-3,
        "max |gelu_erf - gelu_tanh| = {max}"
    );
}

#[test]
fn reference_does_not_cancel_in_the_negative_tail() {
    // 0.5 x (1 + erf(x / sqrt 2)) loses every digit near x = -8 in f64; the reference must not.
    // Phi(-8) = 6.220960574271784e-16 (the normal distribution's tail, to 16 digits).
    let want = -8.0 * 6.220_960_574_271_784e-16;
    let got = reference::act(Activation::GeluErf, -8.0);
    assert!(
        ((got - want) / want).abs() < 1e-12,
        "gelu_erf(-8) = {got}, want {want}"
    );
    // (1 + tanh(u)) / 2 is exactly 0 in f64 here; sigmoid(2u) is not.
    let u = (2.0 / std::f64::consts::PI).sqrt() * (-8.0 - 0.044715 * 512.0);
    let want = -8.0 / (1.0 + (-2.0 * u).exp());
    let got = reference::act(Activation::GeluTanh, -8.0);
    assert!(
        want != 0.0 && ((got - want) / want).abs() < 1e-12,
        "gelu_tanh(-8) = {got}"
    );
}
