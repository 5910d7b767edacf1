//! # ferrofuse-candle
//!
//! ferrofuse's fused kernels as functions on [`candle_core::Tensor`]s, run on candle's own CUDA
//! stream and memory:
//!
//! - gated activations `y = act(a) * b` in one kernel: [`swiglu`], [`geglu`], [`geglu_tanh`],
//!   [`reglu`] (or [`gated`] with an [`Activation`]) on split inputs, and
//!   [`swiglu_interleaved`] / [`gated_interleaved`] on one `[gate | up]` tensor of width `2I`
//!   (what one fused gate/up matmul gives), read through its row stride with no `narrow` copy;
//! - residual add + RMSNorm in one kernel: [`add_rms_norm`] returns `(y, h)` with
//!   `h = x + residual` and `y = rmsnorm(h) * w`; [`rms_norm`] is plain RMSNorm (candle-nn's
//!   `rms_norm(x, w, eps)`). The `*_with` forms take [`RmsNormOptions`]: the Gemma weight
//!   `(1 + w)` and the numerics mode ([`NormNumerics`]);
//! - in place, where candle allows it (`inplace_op`): [`gated_inplace`] (`b` receives the
//!   result), [`gated_interleaved_inplace`] (the up half does), [`rms_norm_inplace`], and
//!   [`add_rms_norm_inplace`], vLLM's convention (`x` receives `y`, `residual` receives `h`);
//! - FP8 E4M3 outputs (`DType::F8E4M3`) with their scales, for an FP8 matmul next:
//!   [`gated_fp8`], [`gated_interleaved_fp8`], [`rms_norm_fp8`], [`add_rms_norm_fp8`], with
//!   static, per-token or per-group scales ([`Fp8Scaling`]).
//!
//! ```no_run
//! use candle_core::{DType, Device, Tensor};
//! # fn main() -> candle_core::Result<()> {
//! let dev = Device::new_cuda(0)?;
//! let (x, residual) = (Tensor::randn(0f32, 1., (16, 4096), &dev)?, Tensor::randn(0f32, 1., (16, 4096), &dev)?);
//! let w = Tensor::ones(4096, DType::F32, &dev)?;
//! let (y, h) = ferrofuse_candle::add_rms_norm(&x, &residual, &w, 1e-5)?;
//! let gate_up = Tensor::randn(0f32, 1., (16, 2 * 14336), &dev)?;
//! let act = ferrofuse_candle::swiglu_interleaved(&gate_up)?; // [16, 14336]
//! # Ok(()) }
//! ```
//!
//! # Tensors
//! Any number of leading batch dimensions; bf16, f16 or f32, one dtype for all operands but
//! the norm weight, which may also be f32 under bf16/f16 storage. The kernels read each
//! operand as a matrix with one row stride, so contiguous tensors and views from `narrow`,
//! `chunk`, `get` and `i` are read where they are (see [`layout`]). A layout that is not such
//! a matrix (transposed, broadcast, or a `narrow` of a middle dimension with several batches)
//! is copied once with candle's `contiguous()` before the call, as candle's own ops do with
//! layouts their kernels cannot read; an in-place destination with such a layout is an error
//! instead. Outputs are fresh contiguous tensors.
//!
//! Anything else (a CPU tensor, an unsupported dtype, mismatched shapes, a zero or
//! non-finite `eps`) is a [`candle_core::Error`] saying what is wrong; nothing panics.
//!
//! # Backward
//! Every op that returns a tensor records its backward in candle's graph, so
//! `loss.backward()` through it gives the gradients candle's own ops would (the gated
//! backward and ferrofuse's deterministic RMSNorm backward, `dw` included). As with any candle
//! op, the in-place forms are not tracked.

pub mod layout;
mod ops;

use std::sync::{Arc, Mutex};

use candle_core::{D, DType as CDType, Result, Tensor};
pub use ferrofuse::{Activation, Fp8Scaling, NormNumerics, RmsNormOptions, ScaleLayout};

use ops::readable;

fn bail(op: &str, what: String) -> candle_core::Error {
    candle_core::Error::Msg(format!("ferrofuse-candle {op}: {what}"))
}

/// The storage dtypes the kernels take.
fn check_dtype(op: &str, name: &str, t: &Tensor) -> Result<()> {
    match t.dtype() {
        CDType::BF16 | CDType::F16 | CDType::F32 => Ok(()),
        other => Err(bail(
            op,
            format!("{name} has dtype {other:?}; the kernels take bf16, f16 or f32"),
        )),
    }
}

/// `t` is a CUDA tensor on `first`'s device.
fn check_device(op: &str, name: &str, t: &Tensor, first: &Tensor) -> Result<()> {
    if !t.device().is_cuda() {
        return Err(bail(
            op,
            format!(
                "{name} is on {:?}; the kernels run on CUDA devices",
                t.device()
            ),
        ));
    }
    if !t.device().same_device(first.device()) {
        return Err(bail(
            op,
            format!("{name} is on another device than the first operand"),
        ));
    }
    Ok(())
}

/// Same device, supported dtype, same dtype and shape as `first`.
fn check_like(op: &str, name: &str, t: &Tensor, first: &Tensor) -> Result<()> {
    check_device(op, name, t, first)?;
    if t.dtype() != first.dtype() {
        return Err(bail(
            op,
            format!(
                "{name} has dtype {:?}, the first operand {:?}",
                t.dtype(),
                first.dtype()
            ),
        ));
    }
    if t.dims() != first.dims() {
        return Err(bail(
            op,
            format!(
                "{name} has shape {:?}, the first operand {:?}",
                t.dims(),
                first.dims()
            ),
        ));
    }
    Ok(())
}

/// `y = act(a) * b` (same shape, dtype and device).
pub fn gated(a: &Tensor, b: &Tensor, act: Activation) -> Result<Tensor> {
    let op = "gated";
    check_device(op, "a", a, a)?;
    check_dtype(op, "a", a)?;
    check_like(op, "b", b, a)?;
    if a.elem_count() == 0 {
        return a.zeros_like();
    }
    readable(a)?.apply_op2(&readable(b)?, ops::Gated(act))
}

/// SwiGLU `silu(a) * b`, what `(a.silu()? * b)?` computes, in one kernel.
pub fn swiglu(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    gated(a, b, Activation::Silu)
}

/// GeGLU with the exact GELU, `gelu_erf(a) * b`.
pub fn geglu(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    gated(a, b, Activation::GeluErf)
}

/// GeGLU with the tanh GELU (candle's `gelu`, Gemma's `gelu_pytorch_tanh`), `gelu(a) * b`.
pub fn geglu_tanh(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    gated(a, b, Activation::GeluTanh)
}

/// ReGLU `relu(a) * b`.
pub fn reglu(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    gated(a, b, Activation::Relu)
}

fn check_interleaved(op: &str, gate_up: &Tensor) -> Result<usize> {
    check_device(op, "gate_up", gate_up, gate_up)?;
    check_dtype(op, "gate_up", gate_up)?;
    let width = gate_up.dims().last().copied().unwrap_or(1);
    if gate_up.rank() == 0 || width % 2 != 0 {
        return Err(bail(
            op,
            format!(
                "gate_up has shape {:?}; its last dimension must be even ([gate | up])",
                gate_up.dims()
            ),
        ));
    }
    Ok(width / 2)
}

/// `act(gate_up[.., :I]) * gate_up[.., I:]` for a `[.., 2I]` tensor (candle-nn's
/// `swiglu(xs)` layout), read in place: `[.., I]`.
pub fn gated_interleaved(gate_up: &Tensor, act: Activation) -> Result<Tensor> {
    let op = "gated_interleaved";
    let half = check_interleaved(op, gate_up)?;
    if gate_up.elem_count() == 0 {
        return gate_up.narrow(D::Minus1, 0, half)?.zeros_like();
    }
    readable(gate_up)?.apply_op1(ops::GatedInterleaved(act))
}

/// SwiGLU on `[gate | up]`: `silu(gate) * up`, what candle-nn's `ops::swiglu(xs)` computes.
pub fn swiglu_interleaved(gate_up: &Tensor) -> Result<Tensor> {
    gated_interleaved(gate_up, Activation::Silu)
}

/// `b = act(a) * b`, written over `b` (not tracked for backward). `b` must be readable in
/// place (see [`layout`]) and must not share storage with `a` (for `[gate | up]` in one
/// tensor, use [`gated_interleaved_inplace`]).
pub fn gated_inplace(a: &Tensor, b: &Tensor, act: Activation) -> Result<()> {
    let op = "gated_inplace";
    check_device(op, "a", a, a)?;
    check_dtype(op, "a", a)?;
    check_like(op, "b", b, a)?;
    check_destination(op, "b", b)?;
    if a.elem_count() == 0 {
        return Ok(());
    }
    b.inplace_op2(&readable(a)?, &ops::GatedInPlace(act))
}

/// `gate_up[.., I:] = act(gate_up[.., :I]) * gate_up[.., I:]`, over the up half; returns that
/// half (a view of `gate_up`, `[.., I]`). Not tracked for backward.
pub fn gated_interleaved_inplace(gate_up: &Tensor, act: Activation) -> Result<Tensor> {
    let op = "gated_interleaved_inplace";
    let half = check_interleaved(op, gate_up)?;
    check_destination(op, "gate_up", gate_up)?;
    if gate_up.elem_count() > 0 {
        gate_up.inplace_op1(&ops::GatedInterleavedInPlace(act))?;
    }
    gate_up.narrow(D::Minus1, half, half)
}

/// `y = act(a) * b` written as FP8 E4M3 (`DType::F8E4M3`, PyTorch's `float8_e4m3fn`) with its
/// scales, for the FP8 matmul that follows: returns `(y_q, scales)` with `y ≈ y_q * scale`
/// (`y / scale` rounded to nearest even, saturated to +-448, NaN kept). `scaling` picks the
/// scales (see [`Fp8Scaling`] and the ferrofuse README for the GEMM layouts each feeds):
///
/// - `Fp8Scaling::Static`: `scale` is the caller's one-element f32 tensor, read on the device
///   (so it may change between graph replays) and returned as given;
/// - `Fp8Scaling::PerToken`: `[.., 1]` f32, one per row of `y`, computed in the kernel;
/// - `Fp8Scaling::PerGroup` with `ScaleLayout::RowMajor`: `[.., I / group]` f32;
/// - `Fp8Scaling::PerGroup` with `ScaleLayout::ColMajor`: `[I / group, rows]` f32 (rows: the
///   product of the leading dimensions), a view whose row stride is `rows` rounded up to 4, as
///   Hopper block-scaled GEMMs read activation scales.
///
/// Not tracked for backward (a quantisation has none). Inputs as for [`gated`].
pub fn gated_fp8(
    a: &Tensor,
    b: &Tensor,
    act: Activation,
    scaling: Fp8Scaling,
    scale: Option<&Tensor>,
) -> Result<(Tensor, Tensor)> {
    let op = "gated_fp8";
    check_device(op, "a", a, a)?;
    check_dtype(op, "a", a)?;
    check_like(op, "b", b, a)?;
    let scale = static_scale(op, scale, a)?;
    let (a, b) = (readable(a)?, readable(b)?);
    let inputs = ops::GatedInputs::Split(&a, &b);
    ops::gated_fp8(act, inputs, scaling, scale.as_ref().map(|s| &s.1))
        .map(|(y, s)| (y, scale.map_or(s, |s| s.0)))
}

/// [`gated_fp8`] on one `[.., 2I]` tensor `[gate | up]`, read in place: `y_q` is `[.., I]`.
pub fn gated_interleaved_fp8(
    gate_up: &Tensor,
    act: Activation,
    scaling: Fp8Scaling,
    scale: Option<&Tensor>,
) -> Result<(Tensor, Tensor)> {
    let op = "gated_interleaved_fp8";
    check_interleaved(op, gate_up)?;
    let scale = static_scale(op, scale, gate_up)?;
    let x = readable(gate_up)?;
    ops::gated_fp8(
        act,
        ops::GatedInputs::Interleaved(&x),
        scaling,
        scale.as_ref().map(|s| &s.1),
    )
    .map(|(y, s)| (y, scale.map_or(s, |s| s.0)))
}

/// A static scale: one f32 element on `x`'s device, returned as given and as the `[1, 1]`
/// matrix the kernel reads.
fn static_scale(op: &str, scale: Option<&Tensor>, x: &Tensor) -> Result<Option<(Tensor, Tensor)>> {
    let Some(scale) = scale else {
        return Ok(None);
    };
    check_device(op, "scale", scale, x)?;
    if scale.dtype() != CDType::F32 || scale.elem_count() != 1 {
        return Err(bail(
            op,
            format!(
                "scale has dtype {:?} and shape {:?}; expected one f32 element",
                scale.dtype(),
                scale.dims()
            ),
        ));
    }
    Ok(Some((scale.clone(), scale.reshape((1, 1))?)))
}

/// An in-place destination must be read and written where it is.
fn check_destination(op: &str, name: &str, t: &Tensor) -> Result<()> {
    layout::Strided::of(t.layout())
        .map(|_| ())
        .map_err(|e| bail(op, format!("{name} cannot be written in place: {e}")))
}

/// The norm's weight: `[H]`, the storage dtype or f32, on `x`'s device.
fn check_weight(op: &str, w: &Tensor, x: &Tensor) -> Result<()> {
    check_device(op, "weight", w, x)?;
    let hidden = x.dims().last().copied();
    if w.rank() != 1 || Some(w.dims()[0]) != hidden {
        return Err(bail(
            op,
            format!(
                "weight has shape {:?}; expected [{}] (the last dimension of x, {:?})",
                w.dims(),
                hidden.unwrap_or(0),
                x.dims()
            ),
        ));
    }
    if w.dtype() != x.dtype() && w.dtype() != CDType::F32 {
        return Err(bail(
            op,
            format!(
                "weight has dtype {:?}; it must be x's ({:?}) or f32",
                w.dtype(),
                x.dtype()
            ),
        ));
    }
    Ok(())
}

fn check_norm_input(op: &str, x: &Tensor, w: &Tensor, opts: &RmsNormOptions) -> Result<()> {
    check_device(op, "x", x, x)?;
    check_dtype(op, "x", x)?;
    if x.rank() == 0 {
        return Err(bail(
            op,
            "x is a scalar; it needs a hidden dimension".into(),
        ));
    }
    check_weight(op, w, x)?;
    if !(opts.eps.is_finite() && opts.eps > 0.0) {
        return Err(bail(
            op,
            format!("eps is {}; it must be finite and > 0", opts.eps),
        ));
    }
    Ok(())
}

/// Whether the backward will be asked for: any operand tracked by candle's graph.
fn tracked(ts: &[&Tensor]) -> bool {
    ts.iter().any(|t| t.track_op())
}

/// RMSNorm `y = x / sqrt(mean(x^2) + eps) * w` over the last dimension, as candle-nn's
/// `ops::rms_norm(x, w, eps)` (statistics in f32).
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor> {
    rms_norm_with(x, w, &RmsNormOptions::new(eps))
}

/// [`rms_norm`] with options: Gemma's `(1 + w)`, the numerics mode.
pub fn rms_norm_with(x: &Tensor, w: &Tensor, opts: &RmsNormOptions) -> Result<Tensor> {
    let op = "rms_norm";
    check_norm_input(op, x, w, opts)?;
    if x.elem_count() == 0 {
        return x.zeros_like();
    }
    let norm = ops::RmsNorm {
        opts: *opts,
        keep_rstd: tracked(&[x, w]),
        rstd: Mutex::new(None),
    };
    readable(x)?.apply_op2(&readable(w)?, norm)
}

/// `h = x + residual` (in f32), `y = rmsnorm(h) * w`: `(y, h)` from one kernel, for the
/// pre-norm of a decoder layer (`h` is the residual stream going on).
pub fn add_rms_norm(
    x: &Tensor,
    residual: &Tensor,
    w: &Tensor,
    eps: f32,
) -> Result<(Tensor, Tensor)> {
    add_rms_norm_with(x, residual, w, &RmsNormOptions::new(eps))
}

/// [`add_rms_norm`] with options.
pub fn add_rms_norm_with(
    x: &Tensor,
    residual: &Tensor,
    w: &Tensor,
    opts: &RmsNormOptions,
) -> Result<(Tensor, Tensor)> {
    let op = "add_rms_norm";
    check_norm_input(op, x, w, opts)?;
    check_like(op, "residual", residual, x)?;
    if x.elem_count() == 0 {
        return Ok((x.zeros_like()?, x.zeros_like()?));
    }
    let norm = ops::AddRmsNorm {
        opts: *opts,
        keep_rstd: tracked(&[x, residual, w]),
        rstd: Mutex::new(None),
    };
    let packed = readable(x)?.apply_op3(&readable(residual)?, &readable(w)?, norm)?;
    Ok((packed.get(0)?, packed.get(1)?))
}

/// Plain RMSNorm with an FP8 E4M3 output, for the FP8 matmul that follows: `(y_q, scales)`,
/// the scales chosen by `scaling` as for [`gated_fp8`] (`scale`: the static scale). The same
/// statistics as [`rms_norm_with`] (the same `rstd`, bit for bit), and the bytes and scales of
/// a row do not depend on the batch it is in. Rows of any length. Not tracked for backward.
pub fn rms_norm_fp8(
    x: &Tensor,
    w: &Tensor,
    opts: &RmsNormOptions,
    scaling: Fp8Scaling,
    scale: Option<&Tensor>,
) -> Result<(Tensor, Tensor)> {
    let op = "rms_norm_fp8";
    check_norm_input(op, x, w, opts)?;
    let scale = static_scale(op, scale, x)?;
    let (x, w) = (readable(x)?, readable(w)?);
    let (y_q, scales, _) =
        ops::rms_norm_fp8(&x, None, &w, opts, scaling, scale.as_ref().map(|s| &s.1))?;
    Ok((y_q, scale.map_or(scales, |s| s.0)))
}

/// `h = x + residual` and RMSNorm of `h` with an FP8 E4M3 output: `(y_q, scales, h)`, `h` in
/// the storage dtype (the residual stream goes on at full precision). As [`rms_norm_fp8`]
/// otherwise; [`add_rms_norm_with`]'s `h` and statistics, bit for bit.
pub fn add_rms_norm_fp8(
    x: &Tensor,
    residual: &Tensor,
    w: &Tensor,
    opts: &RmsNormOptions,
    scaling: Fp8Scaling,
    scale: Option<&Tensor>,
) -> Result<(Tensor, Tensor, Tensor)> {
    let op = "add_rms_norm_fp8";
    check_norm_input(op, x, w, opts)?;
    check_like(op, "residual", residual, x)?;
    let scale = static_scale(op, scale, x)?;
    let (x, residual, w) = (readable(x)?, readable(residual)?, readable(w)?);
    let (y_q, scales, h) = ops::rms_norm_fp8(
        &x,
        Some(&residual),
        &w,
        opts,
        scaling,
        scale.as_ref().map(|s| &s.1),
    )?;
    let h = h.ok_or_else(|| bail(op, "no h was produced".into()))?;
    Ok((y_q, scale.map_or(scales, |s| s.0), h))
}

/// Plain RMSNorm written over `x` (not tracked for backward).
pub fn rms_norm_inplace(x: &Tensor, w: &Tensor, opts: &RmsNormOptions) -> Result<()> {
    let op = "rms_norm_inplace";
    check_norm_input(op, x, w, opts)?;
    check_destination(op, "x", x)?;
    if x.elem_count() == 0 {
        return Ok(());
    }
    x.inplace_op2(&readable(w)?, &ops::RmsNormInPlace(*opts))
}

/// vLLM's `fused_add_rms_norm` convention: `x` receives `y` and `residual` receives
/// `h = x + residual`, in one kernel, no allocation (not tracked for backward). `x` and
/// `residual` must be separate tensors (not views of one storage) and both readable in place;
/// the weight must not share storage with either.
pub fn add_rms_norm_inplace(
    x: &Tensor,
    residual: &Tensor,
    w: &Tensor,
    opts: &RmsNormOptions,
) -> Result<()> {
    let op = "add_rms_norm_inplace";
    check_norm_input(op, x, w, opts)?;
    check_like(op, "residual", residual, x)?;
    check_destination(op, "x", x)?;
    check_destination(op, "residual", residual)?;
    // candle locks each storage once: residual is locked for writing around x's own in-place
    // op, so sharing a storage would deadlock.
    for (name, t) in [("x", x), ("weight", w)] {
        if same_storage(t, residual) {
            return Err(bail(
                op,
                format!("{name} and residual are views of one storage; use separate tensors"),
            ));
        }
    }
    if x.elem_count() == 0 {
        return Ok(());
    }
    residual.inplace_op1(&ops::AddRmsNormInPlace {
        x: x.clone(),
        w: readable(w)?,
        opts: *opts,
    })
}

/// Whether two tensors are views of one storage (the same lock).
fn same_storage(a: &Tensor, b: &Tensor) -> bool {
    let pa = {
        let (s, _) = a.storage_and_layout();
        &*s as *const candle_core::Storage as usize
    };
    let (s, _) = b.storage_and_layout();
    pa == &*s as *const candle_core::Storage as usize
}

/// Why CUDA device `ordinal` cannot be used on this machine (no CUDA driver, a stub libcuda
/// as build machines have, no such device), or `None` when it can. For tests and examples
/// that skip without a GPU; any other driver failure is returned as an error.
pub fn no_gpu_reason(ordinal: usize) -> Result<Option<String>> {
    use ferrofuse::cudarc::driver::sys::CUresult;
    match ferrofuse::device_count() {
        Ok(n) if ordinal < n => Ok(None),
        Ok(n) => Ok(Some(format!("no CUDA device {ordinal} ({n} devices)"))),
        Err(ferrofuse::Error::NoDriver) => Ok(Some("no CUDA driver".into())),
        Err(ferrofuse::Error::Driver { source, .. })
            if source.0 == CUresult::CUDA_ERROR_STUB_LIBRARY =>
        {
            Ok(Some("libcuda here is a link stub, not a driver".into()))
        }
        Err(e) => Err(ops::ferr("device_count", e)),
    }
}

/// The ferrofuse kernels loaded in `device`'s CUDA context (loaded on first use, then kept),
/// for calling the `ferrofuse` API directly on candle's stream.
pub fn kernels(device: &candle_core::CudaDevice) -> Result<Arc<ferrofuse::Kernels>> {
    ops::kernels(&device.cuda_stream())
}
