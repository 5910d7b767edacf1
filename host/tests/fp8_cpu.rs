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
