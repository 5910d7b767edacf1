//! CPU tests of the FP8 E4M3 reference (`ferrofuse::reference::fp8`): the conversion against
//! the `float8` crate and its own encoding, saturation, NaN, and the three scaling schemes.

use ferrofuse::reference::fp8::{
    E4M3_MAX, Scaling, dynamic_scale, e4m3_bits, e4m3_round, e4m3_value, quantize, quantize_rows,
};
use float8::F8E4M3;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[test]
fn every_byte_round_trips() {
    for b in 0..=255u8 {
        let v = e4m3_value(b);
        if b & 0x7f == 0x7f {
            assert!(v.is_nan(), "{b:#04x}");
            continue;
        }
        assert_eq!(e4m3_bits(v), b, "{b:#04x} = {v}");
        assert_eq!(
            v,
            F8E4M3::from_bits(b).to_f64(),
            "{b:#04x}: the float8 crate's value"
        );
    }
    assert_eq!(e4m3_value(0x7e), E4M3_MAX);
    assert_eq!(e4m3_value(0x01), 1.0 / 512.0);
}

#[test]
fn rounds_to_nearest_even_like_the_float8_crate() {
    let mut rng = StdRng::seed_from_u64(7);
    for _ in 0..200_000 {
        // Magnitudes across the whole range, subnormals included.
        let x = rng.random_range(-1.0f32..1.0) * 2f32.powi(rng.random_range(-12..9));
        if x.abs() as f64 > E4M3_MAX {
            continue;
        }
        assert_eq!(e4m3_bits(x as f64), F8E4M3::from_f32(x).to_bits(), "{x:e}");
    }
    // Ties go to the even mantissa: 1 + 1/16 lies halfway between 1 and 1 + 1/8.
    assert_eq!(e4m3_round(1.0 + 1.0 / 16.0), 1.0);
    assert_eq!(e4m3_round(1.0 + 3.0 / 16.0), 1.25);
    // Halfway between the largest subnormal (7/512) and the smallest normal (8/512).
    assert_eq!(e4m3_round(7.5 / 512.0), 8.0 / 512.0);
    // Below half the smallest subnormal: zero, with its sign.
    assert_eq!(e4m3_bits(-0.4 / 512.0), 0x80);
}

#[test]
fn saturates_to_448_and_keeps_nan() {
    for (x, want) in [
        (448.0, 448.0),
        (460.0, 448.0),
        (470.0, 448.0),
        (1e6, 448.0),
        (f64::INFINITY, 448.0),
        (f64::NEG_INFINITY, -448.0),
        (-1e30, -448.0),
    ] {
        assert_eq!(e4m3_round(x), want, "{x}");
    }
    assert_eq!(e4m3_bits(f64::NAN), 0x7f);
    assert_eq!(e4m3_bits(-f64::NAN), 0xff);
    assert!(e4m3_round(f64::NAN).is_nan());
}

#[test]
fn scaling_schemes() {
    let (rows, cols) = (3, 256);
    let mut y: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 37) % 101) as f32 - 50.0)
        .collect();
    // Row 1 all zeros: its scale is the floor, its bytes zeros (not NaN).
    y[cols..2 * cols].fill(0.0);
    let min_scale = 1.0 / (448.0 * 512.0);

    let (q, s) = quantize_rows(&y, rows, cols, Scaling::Static { scale: 0.5 });
    assert_eq!(s, vec![0.5]);
    assert_eq!(q[0], e4m3_bits(-100.0));

    let (q, s) = quantize_rows(
        &y,
        rows,
        cols,
        Scaling::PerToken {
            min_scale,
            scale_ub: None,
        },
    );
    assert_eq!(s.len(), rows);
    assert_eq!(s[0], 50.0 / 448.0);
    assert_eq!(s[1], min_scale);
    assert!(q[cols..2 * cols].iter().all(|&b| b == 0));
    // The row's largest magnitude maps to +-448 exactly.
    let top = y[..cols].iter().position(|v| v.abs() == 50.0).unwrap();
    assert_eq!(e4m3_value(q[top]).abs(), 448.0);
    // An upper bound on the scale clips the rest to +-448.
    let s_ub = dynamic_scale(50.0, min_scale, Some(10.0));
    assert_eq!(s_ub, 10.0 / 448.0);
    assert_eq!(quantize(50.0, s_ub), e4m3_bits(448.0));

    let (_, s) = quantize_rows(
        &y,
        rows,
        cols,
        Scaling::PerGroup {
            group: 128,
            min_scale,
        },
    );
    assert_eq!(s.len(), rows * cols / 128);
    assert_eq!(s[2], min_scale, "row 1, first group: zeros");
}

/// The software conversion the sm_80 kernels run (`ferrofuse_common::fp8::e4m3_from_f32`)
/// equals the reference's rounding for every f32 sign, every exponent, and mantissas around
/// every E4M3 rounding boundary (the halfway points and their neighbours) plus a stride
/// through the rest; NaN keeps its sign.
#[test]
fn software_conversion_matches_the_reference() {
    use ferrofuse_common::fp8::e4m3_from_f32;
    let check = |bits: u32| {
        let x = f32::from_bits(bits);
        let (got, want) = (e4m3_from_f32(x), e4m3_bits(x as f64));
        assert_eq!(got, want, "{x:e} ({bits:#010x})");
    };
    for sign in [0u32, 1 << 31] {
        for exp in 0..=255u32 {
            let top = sign | exp << 23;
            for m in (0..1u32 << 23).step_by(997) {
                check(top | m);
            }
            // Around every multiple of 2^16 of the mantissa: the E4M3 rounding boundaries of
            // normal values (multiples of 2^19) and of subnormals (finer, by exponent).
            for k in 0..1u32 << 7 {
                let mid = k << 16;
                for d in [0u32, 1, 2] {
                    check(top | (mid + d).min((1 << 23) - 1));
                    check(top | mid.saturating_sub(d));
                }
            }
            check(top | ((1 << 23) - 1));
        }
    }
    assert_eq!(e4m3_from_f32(f32::NAN), 0x7f);
    assert_eq!(e4m3_from_f32(-f32::NAN), 0xff);
}

/// The kernels' division by a scale (reciprocal, one FMA correction), in both forms (the
/// branch-free `div_near` of the element loops and the branching `div_by`), is the correctly
/// rounded quotient for scales in `[2^-100, 2^100]`, including the dynamic scale's `amax / 448`.
#[test]
fn division_by_a_scale_is_correctly_rounded() {
    use ferrofuse_common::fp8::{div_by, div_near, reciprocal};
    let check = |y: f32, s: f32, inv: f32| {
        let want = (y / s).to_bits();
        assert_eq!(div_by(y, s, inv).to_bits(), want, "div_by {y:e} / {s:e}");
        assert_eq!(
            div_near(y, s, inv).to_bits(),
            want,
            "div_near {y:e} / {s:e}"
        );
    };
    let mut rng = StdRng::seed_from_u64(11);
    let mut scales: Vec<f32> = vec![1.0, 3.0, 448.0, 1.0 / 448.0, 0.03, 1.0 / (448.0 * 512.0)];
    for _ in 0..2000 {
        scales.push(2f32.powi(rng.random_range(-100..100)) * rng.random_range(1.0f32..2.0));
    }
    for &s in &scales {
        let inv = reciprocal(s);
        assert!(inv != 0.0, "{s:e}");
        for _ in 0..500 {
            let y = rng.random_range(-1.0f32..1.0) * 2f32.powi(rng.random_range(-60..60));
            check(y, s, inv);
        }
        // Quotients that land on E4M3 rounding boundaries: y = s * (halfway values).
        for k in 0..256u32 {
            let t = e4m3_value(k as u8);
            if t.is_finite() {
                check((t as f32) * s, s, inv);
            }
        }
    }
    // Signed zeros, infinities, NaN and quotients that overflow or underflow.
    let specials = [
        0.0f32,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        -f32::MAX,
        f32::MIN_POSITIVE,
        -f32::MIN_POSITIVE,
        1e-45,
        -1e-45,
        3.0e38,
        -1.5e-40,
    ];
    for s in [
        1.0f32,
        7.888_609e-31,
        1.267_650_6e30,
        0.37,
        1.0 / (448.0 * 512.0),
    ] {
        let inv = reciprocal(s);
        for y in specials {
            check(y, s, inv);
        }
        assert!(div_by(f32::NAN, s, inv).is_nan());
        assert!(div_near(f32::NAN, s, inv).is_nan());
    }
    for _ in 0..200_000 {
        let amax = rng.random_range(0.0f32..1.0) * 2f32.powi(rng.random_range(-100..120));
        let min = 1e-30;
        assert_eq!(
            ferrofuse_common::fp8::dynamic_scale(amax, min, f32::INFINITY).to_bits(),
            dynamic_scale(amax, min, None).to_bits(),
            "{amax:e}"
        );
    }
}
