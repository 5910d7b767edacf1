//! ferrofuse-candle on the GPU, against candle's own ops (candle-core, candle-nn) and the f64
//! reference of `ferrofuse::reference`: every op family, bf16/f16/f32, batched and narrowed
//! inputs, the in-place forms, the backward through `Var`/`backward()`, and the errors.
//!
//! Without a CUDA driver every test prints why it skips and passes.

use candle_core::{D, DType, Device, Result, Tensor, Var};
use ferrofuse::reference;
use ferrofuse_candle::{self as ffc, Activation, NormNumerics, RmsNormOptions};

/// The CUDA device (`FERROFUSE_DEVICE`, default 0), or `None` after printing why not.
fn gpu(test: &str) -> Option<Device> {
    let ordinal = std::env::var("FERROFUSE_DEVICE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if let Some(why) = ffc::no_gpu_reason(ordinal).expect("asking the driver for devices") {
        eprintln!("skipping GPU test {test}: {why}");
        return None;
    }
    Some(Device::new_cuda(ordinal).expect("creating candle's CUDA device"))
}

const DTYPES: [DType; 3] = [DType::BF16, DType::F16, DType::F32];

fn values(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap()
}

fn randn(shape: &[usize], dtype: DType, dev: &Device) -> Tensor {
    Tensor::randn(0f32, 1.0, shape, dev)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

/// Largest error relative to the largest reference magnitude, per storage dtype: a few
/// roundings of the output.
fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => 1.6e-2,
        DType::F16 => 2e-3,
        _ => 2e-5,
    }
}

#[track_caller]
fn assert_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(1e-30f64, |m, v| m.max(v.abs()));
    let (i, err) = got
        .iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs())
        .enumerate()
        .fold((0, 0.0), |(bi, be), (i, e)| {
            if e > be || e.is_nan() {
                (i, e)
            } else {
                (bi, be)
            }
        });
    assert!(
        err <= tol * scale,
        "{what}: element {i}: got {}, expected {} (error {err:.3e} > {tol:.1e} x {scale:.3e})",
        got[i],
        want[i]
    );
}

/// candle's own gated unit, as users write it.
fn candle_gated(a: &Tensor, b: &Tensor, act: Activation) -> Result<Tensor> {
    let g = match act {
        Activation::Silu => a.silu()?,
        Activation::GeluErf => a.gelu_erf()?,
        Activation::GeluTanh => a.gelu()?,
        Activation::Relu => a.relu()?,
    };
    g * b
}

#[test]
fn gated_split_matches_candle_and_the_reference() {
    let Some(dev) = gpu("gated_split") else {
        return;
    };
    for dtype in DTYPES {
        for act in Activation::ALL {
            // Batched and odd; then views narrowed out of wider tensors (row stride, offset).
            let wide_a = randn(&[3, 5, 301], dtype, &dev);
            let wide_b = randn(&[3, 5, 290], dtype, &dev);
            let cases = [
                (
                    randn(&[2, 3, 37], dtype, &dev),
                    randn(&[2, 3, 37], dtype, &dev),
                ),
                (
                    randn(&[4, 1024], dtype, &dev),
                    randn(&[4, 1024], dtype, &dev),
                ),
                (
                    wide_a.narrow(D::Minus1, 7, 280).unwrap(),
                    wide_b.narrow(D::Minus1, 1, 280).unwrap(),
                ),
                (
                    wide_a
                        .narrow(0, 1, 2)
                        .unwrap()
                        .narrow(D::Minus1, 0, 256)
                        .unwrap(),
                    wide_b
                        .narrow(0, 0, 2)
                        .unwrap()
                        .narrow(D::Minus1, 16, 256)
                        .unwrap(),
                ),
            ];
            for (a, b) in cases {
                let what = format!(
                    "{act:?} {dtype:?} {:?} (strides {:?})",
                    a.dims(),
                    a.stride()
                );
                let y = ffc::gated(&a, &b, act).unwrap();
                assert_eq!(y.dims(), a.dims());
                assert_eq!(y.dtype(), dtype);
                let want = reference::gated_forward(act, &values(&a), &values(&b));
                assert_close(
                    &format!("{what} vs f64"),
                    &values(&y),
                    &want,
                    tolerance(dtype),
                );
                let theirs = candle_gated(&a, &b, act).unwrap();
                assert_close(
                    &format!("{what} vs candle"),
                    &values(&y),
                    &values(&theirs),
                    2.0 * tolerance(dtype),
                );
            }
        }
    }
}

#[test]
fn named_gated_functions_pick_their_activation() {
    let Some(dev) = gpu("named_gated") else {
        return;
    };
    let a = randn(&[8, 64], DType::F32, &dev);
    let b = randn(&[8, 64], DType::F32, &dev);
    type Gated = fn(&Tensor, &Tensor) -> Result<Tensor>;
    let pairs: [(Gated, Activation); 4] = [
        (ffc::swiglu, Activation::Silu),
        (ffc::geglu, Activation::GeluErf),
        (ffc::geglu_tanh, Activation::GeluTanh),
        (ffc::reglu, Activation::Relu),
    ];
    for (f, act) in pairs {
        let got = values(&f(&a, &b).unwrap());
        assert_eq!(got, values(&ffc::gated(&a, &b, act).unwrap()), "{act:?}");
    }
}

#[test]
fn interleaved_matches_candle_nn_swiglu() {
    let Some(dev) = gpu("interleaved") else {
        return;
    };
    for dtype in DTYPES {
        let wide = randn(&[3, 5, 700], dtype, &dev);
        let cases = [
            randn(&[3, 5, 2 * 300], dtype, &dev),
            randn(&[16, 2 * 14336], dtype, &dev),
            // [gate | up] as a view: offset 50, row stride 700.
            wide.narrow(D::Minus1, 50, 600).unwrap(),
        ];
        for x in cases {
            let what = format!("{dtype:?} {:?} (strides {:?})", x.dims(), x.stride());
            let y = ffc::swiglu_interleaved(&x).unwrap();
            let half = x.dim(D::Minus1).unwrap() / 2;
            let mut dims = x.dims().to_vec();
            *dims.last_mut().unwrap() = half;
            assert_eq!(y.dims(), &dims[..]);
            let theirs = candle_nn::ops::swiglu(&x).unwrap();
            assert_close(&what, &values(&y), &values(&theirs), 2.0 * tolerance(dtype));
            for act in Activation::ALL {
                let gate = x.narrow(D::Minus1, 0, half).unwrap();
                let up = x.narrow(D::Minus1, half, half).unwrap();
                let y = ffc::gated_interleaved(&x, act).unwrap();
                let want = reference::gated_forward(act, &values(&gate), &values(&up));
                assert_close(
                    &format!("{what} {act:?}"),
                    &values(&y),
                    &want,
                    tolerance(dtype),
                );
            }
        }
    }
}

/// The f64 reference of `(y, h)` in f32 numerics: `h` rounded to the storage dtype as stored,
/// `y` from the f64 sum.
fn norm_reference(
    x: &[f64],
    r: Option<&[f64]>,
    w: &[f64],
    hidden: usize,
    gemma: bool,
    eps: f64,
) -> (Vec<f64>, Vec<f64>) {
    let h: Vec<f64> = match r {
        Some(r) => x.iter().zip(r).map(|(a, b)| a + b).collect(),
        None => x.to_vec(),
    };
    let w: Vec<f64> = w
        .iter()
        .map(|&v| reference::rmsnorm_weight(v, gemma))
        .collect();
    let mut y = Vec::with_capacity(h.len());
    for row in h.chunks(hidden) {
        y.extend(reference::rmsnorm_exact(row, &w, eps));
    }
    (y, h)
}

#[test]
fn add_rms_norm_matches_candle_nn_and_the_reference() {
    let Some(dev) = gpu("add_rms_norm") else {
        return;
    };
    let eps = 1e-5;
    for dtype in DTYPES {
        for (w_dtype, hidden) in [
            (dtype, 4096),
            (DType::F32, 4096),
            (dtype, 8192),
            (dtype, 5120),
            (dtype, 769),
        ] {
            let wide = randn(&[2, 7, hidden + 64], dtype, &dev);
            let cases = [
                (
                    randn(&[2, 7, hidden], dtype, &dev),
                    randn(&[2, 7, hidden], dtype, &dev),
                ),
                (
                    wide.narrow(D::Minus1, 64, hidden).unwrap(),
                    randn(&[2, 7, hidden], dtype, &dev),
                ),
                (
                    randn(&[1, hidden], dtype, &dev),
                    randn(&[1, hidden], dtype, &dev),
                ),
            ];
            let w = randn(&[hidden], DType::F32, &dev)
                .affine(0.5, 1.0)
                .unwrap()
                .to_dtype(w_dtype)
                .unwrap();
            for (x, r) in cases {
                let what = format!(
                    "{dtype:?} w {w_dtype:?} {:?} (strides {:?})",
                    x.dims(),
                    x.stride()
                );
                let (y, h) = ffc::add_rms_norm(&x, &r, &w, eps).unwrap();
                assert_eq!((y.dims(), h.dims()), (x.dims(), x.dims()));
                let (want_y, want_h) = norm_reference(
                    &values(&x),
                    Some(&values(&r)),
                    &values(&w),
                    hidden,
                    false,
                    eps as f64,
                );
                assert_close(
                    &format!("{what} y vs f64"),
                    &values(&y),
                    &want_y,
                    tolerance(dtype),
                );
                assert_close(
                    &format!("{what} h vs f64"),
                    &values(&h),
                    &want_h,
                    tolerance(dtype),
                );
                // candle: the sum in the storage dtype, then candle-nn's fused rms_norm.
                let sum = (&x + &r).unwrap();
                let w_c = w.to_dtype(dtype).unwrap();
                let theirs = candle_nn::ops::rms_norm(&sum, &w_c, eps).unwrap();
                assert_close(
                    &format!("{what} y vs candle"),
                    &values(&y),
                    &values(&theirs),
                    2.0 * tolerance(dtype),
                );
                assert_close(
                    &format!("{what} h vs candle"),
                    &values(&h),
                    &values(&sum),
                    tolerance(dtype),
                );
                // Plain RMSNorm on the same input.
                let y1 = ffc::rms_norm(&x, &w, eps).unwrap();
                let theirs = candle_nn::ops::rms_norm(&x.contiguous().unwrap(), &w_c, eps).unwrap();
                assert_close(
                    &format!("{what} rms_norm vs candle"),
                    &values(&y1),
                    &values(&theirs),
                    2.0 * tolerance(dtype),
                );
            }
        }
    }
}

#[test]
fn gemma_and_hf_numerics_options() {
    let Some(dev) = gpu("norm_options") else {
        return;
    };
    let (hidden, eps) = (3584, 1e-6);
    let x = randn(&[5, hidden], DType::BF16, &dev);
    let r = randn(&[5, hidden], DType::BF16, &dev);
    let w = (randn(&[hidden], DType::F32, &dev) * 0.1)
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap();
    let gemma = RmsNormOptions::new(eps).with_gemma(true);
    let (y, _) = ffc::add_rms_norm_with(&x, &r, &w, &gemma).unwrap();
    let (want, _) = norm_reference(
        &values(&x),
        Some(&values(&r)),
        &values(&w),
        hidden,
        true,
        eps as f64,
    );
    assert_close("gemma vs f64", &values(&y), &want, tolerance(DType::BF16));
    // candle-transformers' Gemma: rms_norm with (w + 1).
    let w1 = (&w.to_dtype(DType::F32).unwrap() + 1.0)
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap();
    let theirs = candle_nn::ops::rms_norm(&(&x + &r).unwrap(), &w1, eps).unwrap();
    assert_close(
        "gemma vs candle",
        &values(&y),
        &values(&theirs),
        2.0 * tolerance(DType::BF16),
    );
    // The Hugging Face LLaMA numerics round h and h * rstd: close to f32 numerics, not equal.
    let hf = RmsNormOptions::new(eps).with_numerics(NormNumerics::HfLlama);
    let (y_hf, _) = ffc::add_rms_norm_with(&x, &r, &w, &hf).unwrap();
    let (y_f32, _) = ffc::add_rms_norm(&x, &r, &w, eps).unwrap();
    assert_close(
        "hf vs f32 numerics",
        &values(&y_hf),
        &values(&y_f32),
        2.0 * tolerance(DType::BF16),
    );
}

#[test]
fn in_place_forms_equal_the_out_of_place_ones() {
    let Some(dev) = gpu("in_place") else { return };
    for dtype in DTYPES {
        let a = randn(&[3, 4, 320], dtype, &dev);
        let b = randn(&[3, 4, 320], dtype, &dev);
        let want = values(&ffc::swiglu(&a, &b).unwrap());
        let b2 = b.copy().unwrap();
        ffc::gated_inplace(&a, &b2, Activation::Silu).unwrap();
        assert_eq!(values(&b2), want, "gated_inplace {dtype:?}");

        let gate_up = randn(&[6, 2 * 200], dtype, &dev);
        let want = values(&ffc::swiglu_interleaved(&gate_up).unwrap());
        let gate = values(&gate_up.narrow(D::Minus1, 0, 200).unwrap());
        let up = ffc::gated_interleaved_inplace(&gate_up, Activation::Silu).unwrap();
        assert_eq!(values(&up), want, "gated_interleaved_inplace {dtype:?}");
        assert_eq!(
            values(&gate_up.narrow(D::Minus1, 0, 200).unwrap()),
            gate,
            "gate half kept"
        );

        let x = randn(&[2, 3, 4096], dtype, &dev);
        let r = randn(&[2, 3, 4096], dtype, &dev);
        let w = randn(&[4096], dtype, &dev);
        let opts = RmsNormOptions::new(1e-6);
        let (y, h) = ffc::add_rms_norm_with(&x, &r, &w, &opts).unwrap();
        let (y, h) = (values(&y), values(&h));
        ffc::add_rms_norm_inplace(&x, &r, &w, &opts).unwrap();
        assert_eq!(
            values(&x),
            y,
            "add_rms_norm_inplace: x receives y ({dtype:?})"
        );
        assert_eq!(
            values(&r),
            h,
            "add_rms_norm_inplace: residual receives h ({dtype:?})"
        );

        let want = values(&ffc::rms_norm_with(&r, &w, &opts).unwrap());
        ffc::rms_norm_inplace(&r, &w, &opts).unwrap();
        assert_eq!(values(&r), want, "rms_norm_inplace {dtype:?}");
    }
}

#[test]
fn layouts_the_kernels_cannot_read_are_copied_once() {
    let Some(dev) = gpu("copied_layouts") else {
        return;
    };
    // A middle-dimension narrow with several batches, and a transpose.
    let a = randn(&[4, 9, 64], DType::F32, &dev)
        .narrow(1, 2, 5)
        .unwrap();
    let b = randn(&[4, 5, 64], DType::F32, &dev);
    let y = ffc::swiglu(&a, &b).unwrap();
    let want = reference::gated_forward(Activation::Silu, &values(&a), &values(&b));
    assert_close(
        "narrowed middle dim",
        &values(&y),
        &want,
        tolerance(DType::F32),
    );
    let t = randn(&[64, 12], DType::F32, &dev).t().unwrap();
    let w = Tensor::ones(64, DType::F32, &dev).unwrap();
    let y = ffc::rms_norm(&t, &w, 1e-6).unwrap();
    let theirs = candle_nn::ops::rms_norm(&t.contiguous().unwrap(), &w, 1e-6).unwrap();
    assert_close(
        "transposed",
        &values(&y),
        &values(&theirs),
        2.0 * tolerance(DType::F32),
    );
    // An in-place destination is never copied: refused.
    let dst = randn(&[4, 9, 64], DType::F32, &dev)
        .narrow(1, 2, 5)
        .unwrap();
    let e = ffc::gated_inplace(&b, &dst, Activation::Silu).unwrap_err();
    assert!(e.to_string().contains("cannot be written in place"), "{e}");
}

#[test]
fn bad_inputs_are_candle_errors() {
    let Some(dev) = gpu("errors") else { return };
    let a = randn(&[4, 64], DType::BF16, &dev);
    let check = |r: Result<Tensor>, needle: &str| {
        let e = r.expect_err(needle).to_string();
        assert!(e.contains(needle), "expected {needle:?} in {e:?}");
    };
    let cpu = Tensor::zeros((4, 64), DType::BF16, &Device::Cpu).unwrap();
    check(ffc::swiglu(&cpu, &cpu), "CUDA");
    check(ffc::swiglu(&a, &cpu), "CUDA");
    let ints = Tensor::zeros((4, 64), DType::U32, &dev).unwrap();
    check(ffc::swiglu(&ints, &ints), "bf16, f16 or f32");
    check(
        ffc::swiglu(&a, &randn(&[4, 63], DType::BF16, &dev)),
        "shape",
    );
    check(ffc::swiglu(&a, &randn(&[4, 64], DType::F16, &dev)), "dtype");
    check(
        ffc::swiglu_interleaved(&randn(&[4, 63], DType::BF16, &dev)),
        "even",
    );
    let w = randn(&[64], DType::BF16, &dev);
    check(ffc::rms_norm(&a, &w, 0.0), "eps");
    check(ffc::rms_norm(&a, &w, f32::NAN), "eps");
    check(
        ffc::rms_norm(&a, &randn(&[63], DType::BF16, &dev), 1e-6),
        "weight",
    );
    check(
        ffc::rms_norm(&a, &randn(&[1, 64], DType::BF16, &dev), 1e-6),
        "weight",
    );
    check(
        ffc::rms_norm(&a, &randn(&[64], DType::F16, &dev), 1e-6),
        "weight",
    );
    check(
        ffc::add_rms_norm(&a, &randn(&[5, 64], DType::BF16, &dev), &w, 1e-6).map(|p| p.0),
        "residual",
    );
    // In place: one storage for x and residual.
    let both = randn(&[4, 128], DType::BF16, &dev);
    let (x, r) = (
        both.narrow(1, 0, 64).unwrap(),
        both.narrow(1, 64, 64).unwrap(),
    );
    let e = ffc::add_rms_norm_inplace(&x, &r, &w, &RmsNormOptions::new(1e-6)).unwrap_err();
    assert!(e.to_string().contains("one storage"), "{e}");
    // Empty tensors: empty results, nothing launched.
    let empty = Tensor::zeros((0, 64), DType::BF16, &dev).unwrap();
    assert_eq!(ffc::swiglu(&empty, &empty).unwrap().dims(), &[0, 64]);
    assert_eq!(ffc::rms_norm(&empty, &w, 1e-6).unwrap().dims(), &[0, 64]);
}

/// `sum(out * g)` for a fixed random `g`: a loss whose gradient with respect to `out` is `g`.
fn loss(out: &Tensor, g: &Tensor) -> Tensor {
    (out * g).unwrap().sum_all().unwrap()
}

#[test]
fn gated_backward_matches_candle_autograd() {
    let Some(dev) = gpu("gated_backward") else {
        return;
    };
    for dtype in [DType::F32, DType::BF16] {
        for act in Activation::ALL {
            let a = Var::from_tensor(&randn(&[3, 4, 96], dtype, &dev)).unwrap();
            let b = Var::from_tensor(&randn(&[3, 4, 96], dtype, &dev)).unwrap();
            let g = randn(&[3, 4, 96], dtype, &dev);
            let ours = loss(&ffc::gated(&a, &b, act).unwrap(), &g)
                .backward()
                .unwrap();
            let theirs = loss(&candle_gated(&a, &b, act).unwrap(), &g)
                .backward()
                .unwrap();
            // The f64 reference of both gradients.
            let (da, db) = reference::gated_backward(act, &values(&a), &values(&b), &values(&g));
            for (name, v, want) in [("da", &a, &da), ("db", &b, &db)] {
                let got = values(ours.get(v).unwrap());
                let what = format!("{act:?} {dtype:?} {name}");
                assert_close(&format!("{what} vs f64"), &got, want, tolerance(dtype));
                if act != Activation::Relu {
                    let c = values(theirs.get(v).unwrap());
                    assert_close(
                        &format!("{what} vs candle"),
                        &got,
                        &c,
                        4.0 * tolerance(dtype),
                    );
                }
            }
        }
        // Interleaved, through a narrowed view of a wider tensor.
        let wide = Var::from_tensor(&randn(&[5, 2 * 128 + 32], dtype, &dev)).unwrap();
        let x = wide.narrow(D::Minus1, 32, 256).unwrap();
        let g = randn(&[5, 128], dtype, &dev);
        let ours = loss(&ffc::swiglu_interleaved(&x).unwrap(), &g)
            .backward()
            .unwrap();
        let theirs = loss(&candle_nn::ops::swiglu(&x).unwrap(), &g)
            .backward()
            .unwrap();
        assert_close(
            &format!("interleaved {dtype:?} dx"),
            &values(ours.get(&wide).unwrap()),
            &values(theirs.get(&wide).unwrap()),
            4.0 * tolerance(dtype),
        );
    }
}

/// candle's RMSNorm as composed ops (candle-nn's `rms_norm_slow`, which has a backward).
fn candle_add_rms_norm(x: &Tensor, r: &Tensor, w: &Tensor, eps: f32) -> (Tensor, Tensor) {
    let h = (x + r).unwrap();
    let y = candle_nn::ops::rms_norm_slow(&h, w, eps).unwrap();
    (y, h)
}

#[test]
fn norm_backward_matches_candle_autograd() {
    let Some(dev) = gpu("norm_backward") else {
        return;
    };
    let eps = 1e-5;
    for (rows, hidden) in [(6, 4096), (3, 769), (2, 16384 + 512)] {
        let x = Var::from_tensor(&randn(&[2, rows, hidden], DType::F32, &dev)).unwrap();
        let r = Var::from_tensor(&randn(&[2, rows, hidden], DType::F32, &dev)).unwrap();
        let w = Var::from_tensor(&randn(&[hidden], DType::F32, &dev).affine(0.3, 1.0).unwrap())
            .unwrap();
        let gy = randn(&[2, rows, hidden], DType::F32, &dev);
        let gh = randn(&[2, rows, hidden], DType::F32, &dev);
        let (y, h) = ffc::add_rms_norm(&x, &r, &w, eps).unwrap();
        let ours = (loss(&y, &gy) + loss(&h, &gh)).unwrap().backward().unwrap();
        let (y, h) = candle_add_rms_norm(&x, &r, &w, eps);
        let theirs = (loss(&y, &gy) + loss(&h, &gh)).unwrap().backward().unwrap();
        for (name, v) in [("dx", &x), ("dresidual", &r), ("dw", &w)] {
            assert_close(
                &format!("add_rms_norm {rows}x{hidden} {name}"),
                &values(ours.get(v).unwrap()),
                &values(theirs.get(v).unwrap()),
                1e-4,
            );
        }
        // Plain RMSNorm: only y.
        let y = ffc::rms_norm(&x, &w, eps).unwrap();
        let ours = loss(&y, &gy).backward().unwrap();
        let y = candle_nn::ops::rms_norm_slow(&x, &w, eps).unwrap();
        let theirs = loss(&y, &gy).backward().unwrap();
        for (name, v) in [("dx", &x), ("dw", &w)] {
            assert_close(
                &format!("rms_norm {rows}x{hidden} {name}"),
                &values(ours.get(v).unwrap()),
                &values(theirs.get(v).unwrap()),
                1e-4,
            );
        }
    }
    // bf16 storage with an f32 weight: dw comes back f32.
    let x = Var::from_tensor(&randn(&[4, 1024], DType::BF16, &dev)).unwrap();
    let w = Var::from_tensor(&Tensor::ones(1024, DType::F32, &dev).unwrap()).unwrap();
    let y = ffc::rms_norm(&x, &w, 1e-6).unwrap();
    let grads = y
        .to_dtype(DType::F32)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(grads.get(&w).unwrap().dtype(), DType::F32);
    assert_eq!(grads.get(&x).unwrap().dtype(), DType::BF16);
}

/// An FP8 output against candle's f32 gated unit: each scale from its row's (group's) largest
/// magnitude, and `y_q * scale` within half an E4M3 step of `y` (relative `2^-4`, or
/// `2^-10 * scale` among the subnormals).
#[track_caller]
fn check_fp8(what: &str, y: &[f64], cols: usize, y_q: &Tensor, scale_of: impl Fn(usize) -> f64) {
    let q = y_q
        .to_device(&Device::Cpu)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    assert_eq!(q.len(), y.len(), "{what}: lengths");
    for (i, (&q, &y)) in q.iter().zip(y).enumerate() {
        let s = scale_of(i);
        let got = q as f64 * s;
        let tol = (y.abs() / 16.0).max(s / 1024.0) * 1.0001;
        assert!(
            (got - y).abs() <= tol,
            "{what}: element {i} (row {}, col {}): y_q * scale = {got}, y = {y}",
            i / cols,
            i % cols
        );
    }
}

fn host_f32(t: &Tensor) -> Vec<f64> {
    t.to_device(&Device::Cpu)
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap()
}

#[test]
fn fp8_outputs_dequantize_to_the_gated_unit() {
    let Some(dev) = gpu("fp8_outputs_dequantize_to_the_gated_unit") else {
        return;
    };
    let (batch, seq, i) = (2usize, 3usize, 256usize);
    let rows = batch * seq;
    for dtype in DTYPES {
        let gate_up = randn(&[batch, seq, 2 * i], dtype, &dev);
        let (a, b) = (
            gate_up.narrow(D::Minus1, 0, i).unwrap(),
            gate_up.narrow(D::Minus1, i, i).unwrap(),
        );
        let y = values(
            &candle_gated(
                &a.to_dtype(DType::F32).unwrap(),
                &b.to_dtype(DType::F32).unwrap(),
                Activation::Silu,
            )
            .unwrap(),
        );
        let amax = |r: usize, c0: usize, n: usize| {
            y[r * i + c0..r * i + c0 + n]
                .iter()
                .fold(0f64, |m, v| m.max(v.abs()))
        };
        let min_scale = ferrofuse::fp8::DEFAULT_MIN_SCALE as f64;
        let what = format!("{dtype:?}");

        // Per token, split and interleaved inputs give the same outputs.
        let (y_q, s) =
            ffc::gated_fp8(&a, &b, Activation::Silu, ffc::Fp8Scaling::per_token(), None).unwrap();
        assert_eq!(y_q.dtype(), DType::F8E4M3);
        assert_eq!(y_q.dims(), &[batch, seq, i]);
        assert_eq!(s.dims(), &[batch, seq, 1]);
        let sv = host_f32(&s);
        assert_eq!(sv.len(), rows);
        for (r, &got) in sv.iter().enumerate() {
            let want = (amax(r, 0, i) / 448.0).max(min_scale);
            assert!(
                (got - want).abs() <= 1e-5 * want,
                "{what} row {r}: scale {got} vs {want}"
            );
        }
        check_fp8(&format!("{what} per token"), &y, i, &y_q, |e| sv[e / i]);
        let (y_q2, s2) = ffc::gated_interleaved_fp8(
            &gate_up,
            Activation::Silu,
            ffc::Fp8Scaling::per_token(),
            None,
        )
        .unwrap();
        assert_eq!(
            host_f32(
                &y_q2
                    .to_device(&Device::Cpu)
                    .unwrap()
                    .to_dtype(DType::F32)
                    .unwrap()
            ),
            host_f32(
                &y_q.to_device(&Device::Cpu)
                    .unwrap()
                    .to_dtype(DType::F32)
                    .unwrap()
            ),
            "{what}: interleaved"
        );
        assert_eq!(host_f32(&s2), sv, "{what}: interleaved scales");

        // Per group of 128, row- and column-major.
        for layout in [ffc::ScaleLayout::RowMajor, ffc::ScaleLayout::ColMajor] {
            let scaling = ffc::Fp8Scaling::per_group(128, layout);
            let (y_q, s) = ffc::gated_fp8(&a, &b, Activation::Silu, scaling, None).unwrap();
            let groups = i / 128;
            let sv: Vec<f64> = if layout == ffc::ScaleLayout::RowMajor {
                assert_eq!(s.dims(), &[batch, seq, groups]);
                host_f32(&s)
            } else {
                assert_eq!(s.dims(), &[groups, rows]);
                assert_eq!(s.stride(), &[rows.next_multiple_of(4), 1]);
                host_f32(&s.t().unwrap().contiguous().unwrap())
            };
            for r in 0..rows {
                for g in 0..groups {
                    let want = (amax(r, g * 128, 128) / 448.0).max(min_scale);
                    let got = sv[r * groups + g];
                    assert!(
                        (got - want).abs() <= 1e-5 * want,
                        "{what} {layout:?} ({r}, {g})"
                    );
                }
            }
            check_fp8(&format!("{what} {layout:?}"), &y, i, &y_q, |e| {
                sv[(e / i) * groups + (e % i) / 128]
            });
        }

        // Static: the caller's scale, returned as given.
        let scale = Tensor::new(&[0.01f32], &dev).unwrap();
        let (y_q, s) = ffc::gated_fp8(
            &a,
            &b,
            Activation::Silu,
            ffc::Fp8Scaling::Static,
            Some(&scale),
        )
        .unwrap();
        assert_eq!(s.dims(), &[1]);
        let clamp = |v: f64| v.clamp(-448.0 * 0.01, 448.0 * 0.01);
        let y_sat: Vec<f64> = y.iter().map(|&v| clamp(v)).collect();
        check_fp8(&format!("{what} static"), &y_sat, i, &y_q, |_| 0.01);
    }

    // Errors: no launch, a candle error naming the problem.
    let a = randn(&[4, 256], DType::BF16, &dev);
    let check = |r: Result<(Tensor, Tensor)>, needle: &str| {
        let e = r.expect_err(needle).to_string();
        assert!(e.contains(needle), "expected {needle:?} in {e:?}");
    };
    let scale = Tensor::new(&[1f32], &dev).unwrap();
    check(
        ffc::gated_fp8(&a, &a, Activation::Silu, ffc::Fp8Scaling::Static, None),
        "scale",
    );
    check(
        ffc::gated_fp8(
            &a,
            &a,
            Activation::Silu,
            ffc::Fp8Scaling::per_token(),
            Some(&scale),
        ),
        "dynamic",
    );
    check(
        ffc::gated_fp8(
            &a,
            &a,
            Activation::Silu,
            ffc::Fp8Scaling::Static,
            Some(&Tensor::new(&[1f32, 2.0], &dev).unwrap()),
        ),
        "one f32",
    );
    check(
        ffc::gated_fp8(
            &randn(&[4, 200], DType::BF16, &dev),
            &randn(&[4, 200], DType::BF16, &dev),
            Activation::Silu,
            ffc::Fp8Scaling::per_group(128, ffc::ScaleLayout::RowMajor),
            None,
        ),
        "group",
    );
    let empty = Tensor::zeros((0, 256), DType::BF16, &dev).unwrap();
    let (y_q, s) = ffc::gated_fp8(
        &empty,
        &empty,
        Activation::Silu,
        ffc::Fp8Scaling::per_token(),
        None,
    )
    .unwrap();
    assert_eq!(
        (y_q.dims(), s.dims()),
        (&[0usize, 256][..], &[0usize, 1][..])
    );
}

#[test]
fn norm_fp8_outputs_dequantize_to_the_reference() {
    let Some(dev) = gpu("norm_fp8_outputs_dequantize_to_the_reference") else {
        return;
    };
    let (batch, seq, hidden) = (2usize, 3usize, 1024usize);
    let rows = batch * seq;
    let opts = RmsNormOptions::new(1e-5);
    let min_scale = ferrofuse::fp8::DEFAULT_MIN_SCALE as f64;
    for dtype in DTYPES {
        let x = randn(&[batch, seq, hidden], dtype, &dev);
        let r = randn(&[batch, seq, hidden], dtype, &dev);
        let w = randn(&[hidden], dtype, &dev);
        let (xv, rv, wv) = (values(&x), values(&r), values(&w));
        let (y, _) = norm_reference(&xv, Some(&rv), &wv, hidden, false, 1e-5);
        let amax = |r: usize, c0: usize, n: usize| {
            y[r * hidden + c0..r * hidden + c0 + n]
                .iter()
                .fold(0f64, |m, v| m.max(v.abs()))
        };
        let what = format!("{dtype:?}");
        let (_, h_bf) = ffc::add_rms_norm_with(&x, &r, &w, &opts).unwrap();

        let (y_q, s, h) =
            ffc::add_rms_norm_fp8(&x, &r, &w, &opts, ffc::Fp8Scaling::per_token(), None).unwrap();
        assert_eq!(y_q.dims(), &[batch, seq, hidden]);
        assert_eq!(s.dims(), &[batch, seq, 1]);
        assert_eq!(
            values(&h),
            values(&h_bf),
            "{what}: h as the storage-dtype kernel's"
        );
        let sv = host_f32(&s);
        assert_eq!(sv.len(), rows);
        for (row, &got) in sv.iter().enumerate() {
            let want = (amax(row, 0, hidden) / 448.0).max(min_scale);
            assert!(
                (got - want).abs() <= 1e-4 * want,
                "{what} row {row}: {got} vs {want}"
            );
        }
        check_fp8(&format!("{what} norm per token"), &y, hidden, &y_q, |e| {
            sv[e / hidden]
        });

        let scaling = ffc::Fp8Scaling::per_group(128, ffc::ScaleLayout::ColMajor);
        let (y_q, s, _) = ffc::add_rms_norm_fp8(&x, &r, &w, &opts, scaling, None).unwrap();
        let groups = hidden / 128;
        assert_eq!(s.dims(), &[groups, rows]);
        let sv = host_f32(&s.t().unwrap().contiguous().unwrap());
        check_fp8(&format!("{what} norm group 128"), &y, hidden, &y_q, |e| {
            sv[(e / hidden) * groups + (e % hidden) / 128]
        });

        // Plain RMSNorm, static scale.
        let scale = Tensor::new(&[0.02f32], &dev).unwrap();
        let (y_q, s) =
            ffc::rms_norm_fp8(&x, &w, &opts, ffc::Fp8Scaling::Static, Some(&scale)).unwrap();
        assert_eq!(
            (y_q.dims(), s.dims()),
            (&[batch, seq, hidden][..], &[1usize][..])
        );
        let (y_plain, _) = norm_reference(&xv, None, &wv, hidden, false, 1e-5);
        let sat: Vec<f64> = y_plain
            .iter()
            .map(|v| v.clamp(-448.0 * 0.02, 448.0 * 0.02))
            .collect();
        check_fp8(&format!("{what} norm static"), &sat, hidden, &y_q, |_| 0.02);
    }
}
