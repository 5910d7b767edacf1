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

/// Calls the generic `f::<T>(args)` with `T` the storage type of `dtype` (the caller imports
/// `DType`, `f16` and `bf16`).
macro_rules! typed {
    ($dtype:expr, $f:ident::<T>($($arg:expr),*)) => {
        match $dtype {
            DType::F32 => $f::<f32>($($arg),*),
            DType::F16 => $f::<f16>($($arg),*),
            DType::BF16 => $f::<bf16>($($arg),*),
            DType::F8E4M3 => unreachable!("inputs are storage dtypes"),
        }
    };
}
pub(crate) use typed;

pub mod fp8;

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Arc, Mutex, Once};

use ferrofuse::cudarc::driver::{CudaSlice, CudaStream};
use ferrofuse::half::{bf16, f16};
use ferrofuse::{DType, Element, Error, Kernels, LoadedCode, PtxModule};
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

/// The module `FERROFUSE_MODULE` names (`sm_80`: the GPU tests run the Ampere code on a newer
/// GPU), or `None` (the device's own module).
///
/// # Panics
/// Where it names no shipped module.
pub fn module_override() -> Option<&'static PtxModule> {
    let arch = std::env::var("FERROFUSE_MODULE").ok()?;
    let module = PtxModule::by_arch(&arch);
    let archs: Vec<_> = ferrofuse::PTX_MODULES.iter().map(|m| m.arch).collect();
    assert!(
        module.is_some(),
        "FERROFUSE_MODULE={arch}: the modules are {archs:?}"
    );
    module
}

/// The kernels the GPU tests run on the test device: its own module, or the one
/// [`module_override`] names.
fn test_kernels() -> Result<Arc<Kernels>, Error> {
    let own = Kernels::for_device(device_ordinal())?;
    match module_override() {
        Some(m) => Kernels::for_context_with_module(own.context(), m),
        None => Ok(own),
    }
}

/// The oldest shipped module (sm_80) loaded beside `k` in its context, for the tests that
/// compare the two bit for bit; `None` (after printing why `test` skips) where `k` runs that
/// module already, and in quick runs (the sanitizer's: a second module compiled from PTX and
/// instrumented would double their load time; `FERROFUSE_MODULE=sm_80` checks the sm_80
/// kernels under the sanitizer on their own).
pub fn oldest_module(test: &str, k: &Kernels) -> Option<Arc<Kernels>> {
    let oldest = ferrofuse::PTX_MODULES.last().expect("a module ships");
    if quick() {
        eprintln!("skipping {test}: a quick run (FERROFUSE_TEST_QUICK)");
        return None;
    }
    if k.ptx() == oldest {
        eprintln!(
            "skipping {test}: the device runs the {} module already",
            oldest.arch
        );
        return None;
    }
    let older = Kernels::for_context_with_module(k.context(), oldest);
    Some(older.expect("loading the oldest module beside the device's own"))
}

/// The device's own module in `k`'s context compiled from its PTX by the driver, for the tests
/// that compare it with the prebuilt SASS bit for bit; `None` (after printing why `test` skips)
/// where `k` runs its PTX already, and in quick runs (as [`oldest_module`]).
pub fn own_module_from_ptx(test: &str, k: &Kernels) -> Option<Arc<Kernels>> {
    if quick() {
        eprintln!("skipping {test}: a quick run (FERROFUSE_TEST_QUICK)");
        return None;
    }
    if k.loaded_code() == LoadedCode::Ptx {
        eprintln!("skipping {test}: the device runs the PTX already");
        return None;
    }
    let jit = Kernels::for_context_from_ptx(k.context());
    let jit = jit.expect("loading the device's own module from its PTX");
    assert_eq!(jit.loaded_code(), LoadedCode::Ptx);
    assert_eq!(jit.ptx(), k.ptx());
    Some(jit)
}

/// A load of the kernels by module and code, for messages: `sm_90 cubin`, `sm_80 ptx`.
pub fn load_name(k: &Kernels) -> String {
    format!("{} {}", k.ptx().arch, k.loaded_code().name())
}

/// The kernels and a fresh stream on the test device, or `None` (after printing why) when
/// this machine has no CUDA driver or device. Any other failure is a test failure.
pub fn gpu(test: &str) -> Option<(Arc<Kernels>, Arc<CudaStream>)> {
    match test_kernels() {
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

/// Prints, once per test executable, which prebuilt module the device runs, its SASS or its
/// PTX, and the PTX's SHA-256 (to compare with `zstd -dc host/ptx/ferrofuse.sm_90.ptx.zst |
/// sha256sum` of the commit under test; the cubin is what ptxas builds from that PTX). Written
/// to stderr directly, past the test harness's output capture, so it shows in every run.
fn print_loaded_ptx(k: &Kernels) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let ptx = k.ptx();
        let digest: String = Sha256::digest(ptx.source().as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let code = match k.loaded_code() {
            LoadedCode::Cubin => "SASS (its cubin)",
            LoadedCode::Ptx => "PTX (JIT-compiled by the driver)",
        };
        let line = format!(
            "ferrofuse: {} runs the prebuilt {} module as {code}, PTX sha256 {digest}\n",
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

/// `v` (a value of `dtype`, or an f64 that the conversion rounds to one) as a position on the
/// number line of `dtype`: adjacent values differ by 1, +0 and -0 are both 0.
pub fn ordinal(dtype: DType, v: f64) -> i64 {
    let (b, sign) = match dtype {
        DType::F32 => ((v as f32).to_bits() as i64, 1i64 << 31),
        DType::F16 => (f16::from_f64(v).to_bits() as i64, 1 << 15),
        DType::BF16 => (bf16::from_f64(v).to_bits() as i64, 1 << 15),
        DType::F8E4M3 => (ferrofuse::reference::fp8::e4m3_bits(v) as i64, 1 << 7),
    };
    if b & sign != 0 { -(b & (sign - 1)) } else { b }
}

/// Units in the last place of `dtype` between `got` and `want` rounded to `dtype`.
pub fn ulps(dtype: DType, got: f64, want: f64) -> u64 {
    if got.is_nan() || want.is_nan() {
        return if got.is_nan() && want.is_nan() {
            0
        } else {
            u64::MAX
        };
    }
    ordinal(dtype, got).abs_diff(ordinal(dtype, want))
}

/// The gap between adjacent values of `dtype` at `v`'s magnitude.
pub fn ulp_at(dtype: DType, v: f64) -> f64 {
    let mant = match dtype {
        DType::F32 => 23,
        DType::F16 => 10,
        DType::BF16 => 7,
        DType::F8E4M3 => 3,
    };
    let min_exp = match dtype {
        DType::F32 | DType::BF16 => -126,
        DType::F16 => -14,
        DType::F8E4M3 => -6,
    };
    let e = if v == 0.0 {
        min_exp
    } else {
        (v.abs().log2().floor() as i32).max(min_exp)
    };
    2f64.powi(e - mant)
}

/// `|got - want|` in units in the last place of `dtype`, the unit taken at `max(|want|,
/// floor)`: a floor bounds the unit from below where the exact value comes from cancelling
/// terms of size `floor` (0 for plain ulps). `want` is exact, so a correctly rounded `got` is
/// up to 0.5 away. NaN matches only NaN, an infinity only itself.
pub fn ulp_error(dtype: DType, got: f64, want: f64, floor: f64) -> f64 {
    if got == want || (got.is_nan() && want.is_nan()) {
        return 0.0;
    }
    if !got.is_finite() || !want.is_finite() {
        return f64::INFINITY;
    }
    (got - want).abs() / ulp_at(dtype, want.abs().max(floor))
}

/// Asserts every element of `got` is within `max_ulps` of `want` (see [`ulp_error`], with
/// `floor(i)` for element `i`), naming the worst one; returns the worst error.
pub fn assert_ulps(
    what: &str,
    dtype: DType,
    got: &[f64],
    want: &[f64],
    floor: impl Fn(usize) -> f64,
    max_ulps: f64,
) -> f64 {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let (mut worst, mut at) = (0.0f64, 0usize);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let e = ulp_error(dtype, g, w, floor(i));
        if e > worst || (e.is_nan() && !worst.is_nan()) {
            (worst, at) = (e, i);
        }
    }
    assert!(
        worst <= max_ulps,
        "{what}: element {at} is {} but the reference is {} ({worst:.2} ulps of {}, at most \
         {max_ulps} allowed)",
        got[at],
        want[at],
        dtype.name()
    );
    worst
}

/// The worst errors a test saw, by quantity, printed when it ends.
#[derive(Default)]
pub struct WorstErrors(Mutex<BTreeMap<String, f64>>);

impl WorstErrors {
    pub fn record(&self, quantity: String, error: f64) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let e = m.entry(quantity).or_insert(0.0);
        *e = e.max(error);
    }

    /// One line per quantity whose name starts with `prefix`, written past the test
    /// harness's output capture (see [`print_loaded_ptx`]) so the measured errors show in
    /// every run.
    pub fn report(&self, prefix: &str) {
        let m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = String::new();
        for (quantity, error) in m.iter().filter(|(q, _)| q.starts_with(prefix)) {
            out.push_str(&format!("{quantity}: worst {error:.3} ulps\n"));
        }
        let _ = std::io::stderr().write_all(out.as_bytes());
    }
}

pub fn upload<T: Element>(s: &Arc<CudaStream>, v: &[T]) -> CudaSlice<T> {
    s.clone_htod(v).expect("upload")
}

pub fn download<T: Element>(s: &Arc<CudaStream>, d: &CudaSlice<T>) -> Vec<T> {
    s.clone_dtoh(d).expect("download")
}

pub fn to_f64<T: Element>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}
