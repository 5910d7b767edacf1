//! What a user of ferrofuse writes: one SwiGLU on the GPU, checked against the CPU. Without a
//! GPU it prints why and exits successfully, so it also runs where CI builds it.

use ferrofuse::half::bf16;
use ferrofuse::{Activation, Kernels, Mat, MatMut};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let kernels = match Kernels::for_device(0) {
        Ok(k) => k,
        Err(e @ (ferrofuse::Error::NoDriver | ferrofuse::Error::NoDevice { .. })) => {
            println!("ferrofuse-downstream: built; not run ({e})");
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    let stream = kernels.context().default_stream();
    let (rows, inter) = (4, 4096);
    let a: Vec<bf16> = (0..rows * inter)
        .map(|i| bf16::from_f32((i % 17) as f32 / 4.0 - 2.0))
        .collect();
    let b: Vec<bf16> = (0..rows * inter)
        .map(|i| bf16::from_f32((i % 5) as f32 - 2.0))
        .collect();
    let (da, db) = (stream.clone_htod(&a)?, stream.clone_htod(&b)?);
    let mut dy = stream.alloc_zeros::<bf16>(rows * inter)?;
    kernels.gated(
        &stream,
        Activation::Silu,
        &Mat::new(da.as_view(), rows, inter),
        &Mat::new(db.as_view(), rows, inter),
        &mut MatMut::new(dy.as_view_mut(), rows, inter),
    )?;
    let y = stream.clone_dtoh(&dy)?;
    for ((a, b), y) in a.iter().zip(&b).zip(&y) {
        let (a, b) = (a.to_f32(), b.to_f32());
        let want = a / (1.0 + (-a).exp()) * b;
        if (y.to_f32() - want).abs() > 1e-2 * want.abs().max(1.0) {
            return Err(format!("silu({a}) * {b}: got {y}, want {want}").into());
        }
    }
    println!(
        "ferrofuse-downstream: SwiGLU {rows} x {inter} on {} (the {} module, {:?}) matches the CPU",
        kernels.context().name()?,
        kernels.ptx().arch,
        kernels.loaded_code()
    );
    Ok(())
}
