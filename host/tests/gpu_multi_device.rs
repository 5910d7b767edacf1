//! Several devices (and several threads per device) at once: the tensor-parallel case, where
//! every GPU of a host runs these kernels on its own shard.
//!
//! - `every_device_from_its_own_threads`: for every device, two threads, each with its own
//!   stream, run both families on fresh random inputs and check every result; each device has
//!   its own loaded module, and asking twice for a device's kernels returns the same one.
//! - `mixing_devices_is_rejected`: buffers or a stream of another device give
//!   `Error::WrongDevice` and launch nothing (needs two devices; skips with a message on one).
//!
//! Without a CUDA driver both print why they skip.

mod common;

use std::sync::Arc;

use common::*;
use ferrofuse::cudarc::driver::CudaStream;
use ferrofuse::half::bf16;
use ferrofuse::{
    Activation, DType, Error, Kernels, Mat, MatMut, Placement, RmsNormOptions, reference,
};

fn devices(test: &str) -> Option<usize> {
    match ferrofuse::device_count() {
        Ok(0) | Err(Error::NoDriver) => {
            eprintln!("skipping GPU test {test}: no CUDA driver or device");
            None
        }
        Ok(n) => Some(n),
        Err(e) => panic!("counting devices: {e}"),
    }
}

/// SwiGLU (interleaved) and add + RMSNorm on one stream of `k`'s device, checked.
fn run_both_families(k: &Kernels, s: &Arc<CudaStream>, seed_note: &str) {
    let (mut rng, seed) = rng();
    let what = format!("{seed_note} seed {seed:#x}");
    // Gated, interleaved [gate | up].
    let (rows, inter) = (37, 14336);
    let (x, xf) = random::<bf16>(&mut rng, rows * 2 * inter, 6.0);
    let dx = s.clone_htod(&x).unwrap();
    let mut y = s.clone_htod(&vec![poison::<bf16>(); rows * inter]).unwrap();
    k.gated_interleaved(
        s,
        Activation::Silu,
        &Mat::new(dx.as_view(), rows, 2 * inter),
        &mut MatMut::new(y.as_view_mut(), rows, inter),
    )
    .unwrap();
    let (a, b): (Vec<f64>, Vec<f64>) = (0..rows * inter)
        .map(|i| {
            (
                xf[(i / inter) * 2 * inter + i % inter],
                xf[(i / inter) * 2 * inter + inter + i % inter],
            )
        })
        .unzip();
    let want = reference::gated_forward(Activation::Silu, &a, &b);
    // One rounding of the f32 result (the gated tests' bound for bf16).
    let got = to_f64(&s.clone_dtoh(&y).unwrap());
    assert_ulps(
        &format!("{what}: gated"),
        DType::BF16,
        &got,
        &want,
        |_| 0.0,
        1.0,
    );

    // add + RMSNorm, separate y and h.
    let (rows, hidden, eps) = (19, 4096, 1e-6);
    let (x, xf) = random::<bf16>(&mut rng, rows * hidden, 3.0);
    let (r, rf) = random::<bf16>(&mut rng, rows * hidden, 3.0);
    let (w, wf) = random::<bf16>(&mut rng, hidden, 1.5);
    let (dx, dr, dw) = (
        s.clone_htod(&x).unwrap(),
        s.clone_htod(&r).unwrap(),
        s.clone_htod(&w).unwrap(),
    );
    let mut y = s
        .clone_htod(&vec![poison::<bf16>(); rows * hidden])
        .unwrap();
    let mut h = s
        .clone_htod(&vec![poison::<bf16>(); rows * hidden])
        .unwrap();
    k.rmsnorm(
        s,
        Placement::Add {
            x: &Mat::new(dx.as_view(), rows, hidden),
            residual: &Mat::new(dr.as_view(), rows, hidden),
            y: &mut MatMut::new(y.as_view_mut(), rows, hidden),
            h: &mut MatMut::new(h.as_view_mut(), rows, hidden),
        },
        &Mat::new(dw.as_view(), 1, hidden),
        None,
        &RmsNormOptions::new(eps),
    )
    .unwrap();
    let (got_y, got_h) = (
        to_f64(&s.clone_dtoh(&y).unwrap()),
        to_f64(&s.clone_dtoh(&h).unwrap()),
    );
    for row in 0..rows {
        let hs: Vec<f64> = (0..hidden)
            .map(|c| xf[row * hidden + c] + rf[row * hidden + c])
            .collect();
        let rstd =
            1.0 / (hs.iter().map(|v| v * v).sum::<f64>() / hidden as f64 + eps as f64).sqrt();
        for c in 0..hidden {
            let i = row * hidden + c;
            assert_eq!(
                got_h[i],
                bf16::from_f64(hs[c]).to_f64(),
                "{what}: h[{row}, {c}]"
            );
            // One rounding of the f32 result, plus the f32 rstd's error (gpu_norm.rs has the
            // exact bound).
            let want = hs[c] * rstd * wf[c];
            let e = ulp_error(DType::BF16, got_y[i], want, 0.0);
            assert!(
                e <= 1.0,
                "{what}: y[{row}, {c}] {} vs {want} ({e:.2} ulps)",
                got_y[i]
            );
        }
    }
}

#[test]
fn every_device_from_its_own_threads() {
    let Some(n) = devices("every_device_from_its_own_threads") else {
        return;
    };
    let handles: Vec<Arc<Kernels>> = (0..n).map(|d| Kernels::for_device(d).unwrap()).collect();
    for (d, k) in handles.iter().enumerate() {
        assert!(
            Arc::ptr_eq(k, &Kernels::for_device(d).unwrap()),
            "device {d}: the module is loaded once per context"
        );
        for (e, other) in handles.iter().enumerate().skip(d + 1) {
            assert_ne!(
                k.context().cu_ctx(),
                other.context().cu_ctx(),
                "devices {d} and {e} share a context"
            );
        }
    }
    std::thread::scope(|scope| {
        for (d, k) in handles.iter().enumerate() {
            for t in 0..2 {
                scope.spawn(move || {
                    k.context().bind_to_thread().unwrap();
                    let s = k.context().new_stream().unwrap();
                    for round in 0..3 {
                        run_both_families(k, &s, &format!("device {d} thread {t} round {round}"));
                    }
                });
            }
        }
    });
    eprintln!("every_device_from_its_own_threads: {n} device(s) x 2 threads checked");
}

#[test]
fn mixing_devices_is_rejected() {
    let Some(n) = devices("mixing_devices_is_rejected") else {
        return;
    };
    if n < 2 {
        eprintln!(
            "skipping GPU test mixing_devices_is_rejected: needs two devices, this machine has {n}"
        );
        return;
    }
    let (k0, k1) = (
        Kernels::for_device(0).unwrap(),
        Kernels::for_device(1).unwrap(),
    );
    let (s0, s1) = (
        k0.context().new_stream().unwrap(),
        k1.context().new_stream().unwrap(),
    );
    let (rows, cols) = (4, 256);
    let a0 = s0
        .clone_htod(&vec![bf16::from_f32(1.0); rows * cols])
        .unwrap();
    let b1 = s1
        .clone_htod(&vec![bf16::from_f32(1.0); rows * cols])
        .unwrap();
    let poisoned = vec![poison::<bf16>(); rows * cols];
    let mut y0 = s0.clone_htod(&poisoned).unwrap();
    // An input on the other device.
    let e = k0
        .gated(
            &s0,
            Activation::Silu,
            &Mat::new(a0.as_view(), rows, cols),
            &Mat::new(b1.as_view(), rows, cols),
            &mut MatMut::new(y0.as_view_mut(), rows, cols),
        )
        .unwrap_err();
    assert_eq!(e, Error::WrongDevice { tensor: "b" });
    // A stream of the other device.
    let e = k0
        .gated(
            &s1,
            Activation::Silu,
            &Mat::new(a0.as_view(), rows, cols),
            &Mat::new(a0.as_view(), rows, cols),
            &mut MatMut::new(y0.as_view_mut(), rows, cols),
        )
        .unwrap_err();
    assert_eq!(e, Error::WrongDevice { tensor: "stream" });
    // The norm family checks the same way.
    let w1 = s1.clone_htod(&vec![bf16::from_f32(1.0); cols]).unwrap();
    let e = k0
        .rmsnorm(
            &s0,
            Placement::Norm {
                x: &Mat::new(a0.as_view(), rows, cols),
                y: &mut MatMut::new(y0.as_view_mut(), rows, cols),
            },
            &Mat::new(w1.as_view(), 1, cols),
            None,
            &RmsNormOptions::new(1e-6),
        )
        .unwrap_err();
    assert_eq!(e, Error::WrongDevice { tensor: "weight" });
    let bits = |v: Vec<bf16>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(s0.clone_dtoh(&y0).unwrap()),
        bits(poisoned),
        "a rejected call wrote y"
    );
}
