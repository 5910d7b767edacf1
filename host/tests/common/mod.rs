//! Helpers shared by the test files: GPU discovery that skips cleanly without a driver,
//! random inputs, poisoned outputs, tolerance checks that report the worst element, and
//! `assert_matches!` for rejected calls.
#![allow(dead_code, unused_imports, unused_macros)]

/// Asserts that `value` matches `pattern`; on failure prints the value that came back (the
/// error a rejected call returned, or its `Ok`).
macro_rules! assert_matches {
    ($value:expr, $pattern:pat $(,)?) => {
        match $value {
            $pattern => {}
            ref other => panic!("expected {}, got {:?}", stringify!($pattern), other),
        }
    };
}
pub(crate) use assert_matches;

use std::io::Write;
use std::sync::{Arc, Once};

use ferrofuse::cudarc::driver::CudaStream;
use ferrofuse::{DType, Element, Error, Kernels};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sha2::{Digest, Sha256};

/// Device ordinal for GPU tests: `FERROFUSE_DEVICE` (default 0).
pub fn device_ordinal() -> usize {
    std::env::var("FERROFUSE_DEVICE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// `FERROFUSE_TEST_QUICK=1` trims the shape matrix (used under compute-sanitizer).
pub fn quick() -> bool {
    std::env::var("FERROFUSE_TEST_QUICK").is_ok_and(|v| v != "0")
}

/// The kernels and a fresh stream on the test device, or `None` (after printing why) when
/// this machine has no CUDA driver or device. Any other failure is a test failure.
pub fn gpu(test: &str) -> Option<(Arc<Kernels>, Arc<CudaStream>)> {
    match Kernels::for_device(device_ordinal()) {
        Ok(k) => {
            print_loaded_ptx(&k);
            let stream = k.context().new_stream().expect("creating a stream");
            Some((k, stream))
        }
        Err(e @ (Error::NoDriver | Error::NoDevice { .. })) => {
            eprintln!("skipping GPU test {test}: {e}");
            None
        }
        Err(e) => panic!("loading the kernels failed: {e}"),
    }
}

/// Prints, once per test executable, which prebuilt PTX the device runs and its SHA-256 (to
/// compare with `sha256sum host/ptx/*.ptx` of the commit under test). Written to stderr
/// directly, past the test harness's output capture, so it shows in every run.
fn print_loaded_ptx(k: &Kernels) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let ptx = k.ptx();
        let digest: String = Sha256::digest(ptx.source.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let line = format!(
            "ferrofuse: {} runs the prebuilt {} PTX, sha256 {digest}\n",
            k.context().name().unwrap_or_default(),
            ptx.arch
        );
        let _ = std::io::stderr().write_all(line.as_bytes());
    });
}

/// A fresh seed per call (printed on failure by the callers), so every run draws new inputs.
pub fn rng() -> (StdRng, u64) {
    let seed: u64 = rand::rng().random();
    (StdRng::seed_from_u64(seed), seed)
}

/// `n` values uniform in `[-scale, scale]`, rounded to `T`, and their exact f64 values.
pub fn random<T: Element>(rng: &mut StdRng, n: usize, scale: f64) -> (Vec<T>, Vec<f64>) {
    let v: Vec<T> = (0..n)
        .map(|_| T::from_f64(rng.random_range(-scale..=scale)))
        .collect();
    let f = v.iter().map(|x| x.to_f64()).collect();
    (v, f)
}

/// A NaN of `T`, written to outputs before a run so unwritten elements cannot pass.
pub fn poison<T: Element>() -> T {
    T::from_f64(f64::NAN)
}

/// (atol, rtol) for comparing a `dtype` result with the f64 reference (the seeds' table).
pub fn tolerance(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F32 => (1e-5, 1e-5),
        DType::F16 | DType::BF16 => (1e-2, 1e-2),
    }
}

/// Worst `|got - want| / (atol + rtol |want|)` and where; > 1 fails. NaN in `got` where
/// `want` is finite counts as infinitely bad.
pub fn worst_error(got: &[f64], want: &[f64], atol: f64, rtol: f64) -> (f64, usize) {
    assert_eq!(got.len(), want.len());
    let mut worst = (0.0f64, 0usize);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let e = if g == w || (g.is_nan() && w.is_nan()) {
            0.0
        } else if !g.is_finite() || !w.is_finite() {
            f64::INFINITY
        } else {
            (g - w).abs() / (atol + rtol * w.abs())
        };
        if e > worst.0 || (e.is_infinite() && worst.0.is_finite()) {
            worst = (e, i);
        }
    }
    worst
}

/// Asserts `got` is within (atol, rtol) of `want`, naming the worst element.
pub fn assert_close(what: &str, got: &[f64], want: &[f64], atol: f64, rtol: f64) {
    let (err, i) = worst_error(got, want, atol, rtol);
    assert!(
        err <= 1.0,
        "{what}: element {i} is {} but the reference is {} (atol {atol}, rtol {rtol}; {:.2}x the tolerance)",
        got[i],
        want[i],
        err
    );
}

pub fn to_f64<T: Element>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}
