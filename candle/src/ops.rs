//! The candle custom ops: each `cuda_fwd` reads candle's storages through their layouts
//! ([`Strided`]), allocates the outputs, and makes one ferrofuse `*_raw` call on candle's
//! stream; each `bwd` is another such op.
//!
//! Two outputs of one dtype come back packed as `[2, ...]` (read back with `get`, no copy);
//! the norm backward's `dw`, whose dtype is the weight's, is kept by its op and made a tensor
//! afterwards. The norm's `rstd` is kept by the forward op itself, which candle holds in the
//! graph until the backward.

use std::sync::{Arc, Mutex};

use candle_core::cuda::CudaStorageSlice;
use candle_core::op::BackpropOp;
use candle_core::{
    CpuStorage, CudaDevice, CudaStorage, CustomOp1, CustomOp2, CustomOp3, InplaceOp1, InplaceOp2,
    Layout, Result, Shape, Storage, StorageRef, Tensor,
};
use ferrofuse::cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};
use ferrofuse::half::{bf16, f16};
use ferrofuse::norm::{
    RmsNormBwdDescs, RmsNormFp8Descs, RmsNormFwdDescs, rmsnorm_backward_workspace_len,
};
use ferrofuse::{
    Activation, DType, F8E4M3, Fp8Scaling, Kernels, MatDesc, RmsNormOptions, ScaleLayout,
};

use crate::layout::{Strided, index0};

/// A ferrofuse error as candle's, naming the op.
pub(crate) fn ferr(op: &str, e: ferrofuse::Error) -> candle_core::Error {
    candle_core::Error::Msg(format!("ferrofuse-candle {op}: {e}"))
}

fn cpu_only(op: &str) -> candle_core::Error {
    candle_core::Error::Msg(format!(
        "ferrofuse-candle {op}: runs on CUDA devices only (the tensor is on the CPU)"
    ))
}

/// One `Arc<Kernels>` per CUDA context, kept for the life of the process (the module stays
/// loaded, as candle's own modules do).
static KERNELS: Mutex<Vec<(usize, Arc<Kernels>)>> = Mutex::new(Vec::new());

/// The ferrofuse kernels in the context of candle's `stream`, loaded on first use.
pub(crate) fn kernels(stream: &Arc<CudaStream>) -> Result<Arc<Kernels>> {
    let ctx = stream.context();
    let key = ctx.cu_ctx() as usize;
    let mut cache = KERNELS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, k)) = cache.iter().find(|(c, _)| *c == key) {
        return Ok(k.clone());
    }
    let k = Kernels::for_context(ctx).map_err(|e| ferr("loading the kernels", e))?;
    cache.push((key, k.clone()));
    Ok(k)
}

/// A storage's dtype as ferrofuse names it (bf16, f16, f32, or FP8 E4M3 for FP8 outputs;
/// ferrofuse refuses an FP8 input with a typed error).
fn dtype_of(s: &CudaStorage, op: &str) -> Result<DType> {
    Ok(match &s.slice {
        CudaStorageSlice::BF16(_) => DType::BF16,
        CudaStorageSlice::F16(_) => DType::F16,
        CudaStorageSlice::F32(_) => DType::F32,
        CudaStorageSlice::F8E4M3(_) => DType::F8E4M3,
        _ => {
            return Err(candle_core::Error::Msg(format!(
                "ferrofuse-candle {op}: unsupported dtype (bf16, f16 or f32)"
            )));
        }
    })
}

/// `layout` over `s` as a ferrofuse matrix, with the read recorded on `stream` when the guard
/// drops (after the launch).
fn read<'a>(
    s: &'a CudaStorage,
    l: &Layout,
    stream: &'a CudaStream,
    op: &str,
    name: &str,
) -> Result<(MatDesc, SyncOnDrop<'a>)> {
    let st = Strided::of(l)
        .map_err(|e| candle_core::Error::Msg(format!("ferrofuse-candle {op}: {name}: {e}")))?;
    let dtype = dtype_of(s, op)?;
    let ((addr, guard), len) = match &s.slice {
        CudaStorageSlice::BF16(x) => (x.device_ptr(stream), x.len()),
        CudaStorageSlice::F16(x) => (x.device_ptr(stream), x.len()),
        CudaStorageSlice::F32(x) => (x.device_ptr(stream), x.len()),
        CudaStorageSlice::F8E4M3(x) => (x.device_ptr(stream), x.len()),
        _ => unreachable!("dtype_of accepted it"),
    };
    Ok((st.desc(addr, len, dtype), guard))
}

/// As [`read`], recording a write.
fn write<'a>(
    s: &'a mut CudaStorage,
    l: &Layout,
    stream: &'a CudaStream,
    op: &str,
    name: &str,
) -> Result<(MatDesc, SyncOnDrop<'a>)> {
    let st = Strided::of(l)
        .map_err(|e| candle_core::Error::Msg(format!("ferrofuse-candle {op}: {name}: {e}")))?;
    let dtype = dtype_of(s, op)?;
    let ((addr, guard), len) = match &mut s.slice {
        CudaStorageSlice::BF16(x) => {
            let len = x.len();
            (x.device_ptr_mut(stream), len)
        }
        CudaStorageSlice::F16(x) => {
            let len = x.len();
            (x.device_ptr_mut(stream), len)
        }
        CudaStorageSlice::F32(x) => {
            let len = x.len();
            (x.device_ptr_mut(stream), len)
        }
        CudaStorageSlice::F8E4M3(x) => {
            let len = x.len();
            (x.device_ptr_mut(stream), len)
        }
        _ => unreachable!("dtype_of accepted it"),
    };
    Ok((st.desc(addr, len, dtype), guard))
}

/// A fresh storage of `n` elements of `dtype`, uninitialised: each caller's kernel writes
/// every element before anything reads it (and a failed call drops it unread).
fn alloc(dev: &CudaDevice, dtype: DType, n: usize) -> Result<CudaStorage> {
    let stream = dev.cuda_stream();
    let w = candle_core::Error::wrap;
    // SAFETY: see above; the elements are plain floats (FP8 bytes), valid for any bits.
    let slice = unsafe {
        match dtype {
            DType::BF16 => CudaStorageSlice::BF16(stream.alloc::<bf16>(n).map_err(w)?),
            DType::F16 => CudaStorageSlice::F16(stream.alloc::<f16>(n).map_err(w)?),
            DType::F32 => CudaStorageSlice::F32(stream.alloc::<f32>(n).map_err(w)?),
            DType::F8E4M3 => CudaStorageSlice::F8E4M3(stream.alloc::<F8E4M3>(n).map_err(w)?),
        }
    };
    Ok(CudaStorage {
        slice,
        device: dev.clone(),
    })
}

/// The whole of a fresh storage as a dense `rows x cols` matrix (writes recorded on `stream`).
fn dense<'a>(
    s: &'a mut CudaStorage,
    rows: usize,
    cols: usize,
    stream: &'a CudaStream,
    op: &str,
) -> Result<(MatDesc, SyncOnDrop<'a>)> {
    write(s, &Layout::contiguous((rows, cols)), stream, op, "output")
}

/// `dims` with `2` in front: two outputs of one shape, packed.
fn packed_shape(dims: &[usize]) -> Shape {
    let mut d = vec![2];
    d.extend_from_slice(dims);
    d.into()
}

/// A tensor over a storage computed outside the graph (no backward).
fn tensor(s: CudaStorage, shape: &Shape) -> Tensor {
    Tensor::from_storage(Storage::Cuda(s), shape.clone(), BackpropOp::none(), false)
}

/// `t` as ferrofuse can read it: itself when its layout is a strided matrix, else a
/// contiguous copy (see the crate docs).
pub(crate) fn readable(t: &Tensor) -> Result<Tensor> {
    if crate::layout::readable(t.layout()) {
        Ok(t.clone())
    } else {
        t.contiguous()
    }
}

// ---------------------------------------------------------------------------------------
// Gated activations.

/// `y = act(a) * b`, split inputs; backward through [`GatedBwd`].
pub(crate) struct Gated(pub Activation);

impl CustomOp2 for Gated {
    fn name(&self) -> &'static str {
        "ferrofuse-gated"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        Err(cpu_only("gated"))
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let op = "gated";
        let stream = s1.device.cuda_stream();
        let k = kernels(&stream)?;
        let (a, _ga) = read(s1, l1, &stream, op, "a")?;
        let (b, _gb) = read(s2, l2, &stream, op, "b")?;
        let mut out = alloc(&s1.device, a.dtype, a.rows * a.cols)?;
        {
            let (y, _gy) = dense(&mut out, a.rows, a.cols, &stream, op)?;
            // SAFETY: candle's storages, read-locked for this call and alive until the launch
            // (their frees are ordered on this stream after it); y is the fresh output.
            unsafe { k.gated_raw(&stream, self.0, &a, &b, &y) }.map_err(|e| ferr(op, e))?;
        }
        Ok((out, l1.shape().clone()))
    }

    fn bwd(
        &self,
        a: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let packed = a.apply_op3_no_bwd(b, &readable(grad)?, &GatedBwd(self.0))?;
        Ok((Some(packed.get(0)?), Some(packed.get(1)?)))
    }
}

/// `[da, db]` packed `[2, ...]` from `(a, b, dy)`.
struct GatedBwd(Activation);

impl CustomOp3 for GatedBwd {
    fn name(&self) -> &'static str {
        "ferrofuse-gated-backward"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        Err(cpu_only("gated backward"))
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
        s3: &CudaStorage,
        l3: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let op = "gated backward";
        let stream = s1.device.cuda_stream();
        let k = kernels(&stream)?;
        let (a, _ga) = read(s1, l1, &stream, op, "a")?;
        let (b, _gb) = read(s2, l2, &stream, op, "b")?;
        let (dy, _gd) = read(s3, l3, &stream, op, "dy")?;
        let n = a.rows * a.cols;
        let mut out = alloc(&s1.device, a.dtype, 2 * n)?;
        {
            let (both, _go) = dense(&mut out, 2 * a.rows, a.cols, &stream, op)?;
            let da = MatDesc::contiguous(both.addr, n, a.dtype, a.rows, a.cols);
            let db = both.flat(n, n);
            let db = MatDesc::contiguous(db.addr, n, a.dtype, a.rows, a.cols);
            // SAFETY: as in `Gated`; da and db are the two halves of the fresh output.
            unsafe { k.gated_backward_raw(&stream, self.0, &a, &b, &dy, &da, &db) }
                .map_err(|e| ferr(op, e))?;
        }
        Ok((out, packed_shape(l1.dims())))
    }
}

/// `y = act(x[.., :I]) * x[.., I:]` from one `[.., 2I]` tensor; backward through
/// [`GatedBwdInterleaved`].
pub(crate) struct GatedInterleaved(pub Activation);

impl CustomOp1 for GatedInterleaved {
    fn name(&self) -> &'static str {
        "ferrofuse-gated-interleaved"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        Err(cpu_only("gated interleaved"))
    }

    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
        let op = "gated interleaved";
        let stream = s.device.cuda_stream();
        let k = kernels(&stream)?;
        let (x, _gx) = read(s, l, &stream, op, "gate_up")?;
        let (gate, up) = x.interleaved_halves().map_err(|e| ferr(op, e))?;
        let mut out = alloc(&s.device, x.dtype, gate.rows * gate.cols)?;
        {
            let (y, _gy) = dense(&mut out, gate.rows, gate.cols, &stream, op)?;
            // SAFETY: as in `Gated`.
            unsafe { k.gated_raw(&stream, self.0, &gate, &up, &y) }.map_err(|e| ferr(op, e))?;
        }
        let mut dims = l.dims().to_vec();
        if let Some(last) = dims.last_mut() {
            *last /= 2;
        }
        Ok((out, dims.into()))
    }

    fn bwd(&self, x: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let dx = x.apply_op2_no_bwd(&readable(grad)?, &GatedBwdInterleaved(self.0))?;
        Ok(Some(dx))
    }
}

/// `dx = [da | db]` (`[.., 2I]`) from `(x, dy)`.
struct GatedBwdInterleaved(Activation);

impl CustomOp2 for GatedBwdInterleaved {
    fn name(&self) -> &'static str {
        "ferrofuse-gated-interleaved-backward"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        Err(cpu_only("gated interleaved backward"))
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let op = "gated interleaved backward";
        let stream = s1.device.cuda_stream();
        let k = kernels(&stream)?;
        let (x, _gx) = read(s1, l1, &stream, op, "gate_up")?;
        let (a, b) = x.interleaved_halves().map_err(|e| ferr(op, e))?;
        let (dy, _gd) = read(s2, l2, &stream, op, "dy")?;
        let mut out = alloc(&s1.device, x.dtype, x.rows * x.cols)?;
        {
            let (dx, _go) = dense(&mut out, x.rows, x.cols, &stream, op)?;
            let (da, db) = dx.interleaved_halves().map_err(|e| ferr(op, e))?;
            // SAFETY: as in `Gated`; da and db are the two halves of the fresh output.
            unsafe { k.gated_backward_raw(&stream, self.0, &a, &b, &dy, &da, &db) }
                .map_err(|e| ferr(op, e))?;
        }
        Ok((out, l1.shape().clone()))
    }
}

/// `b = act(a) * b`, in place over `b` (the destination).
pub(crate) struct GatedInPlace(pub Activation);

impl InplaceOp2 for GatedInPlace {
    fn name(&self) -> &'static str {
        "ferrofuse-gated-inplace"
    }

    fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> Result<()> {
        Err(cpu_only("gated in place"))
    }

    fn cuda_fwd(
        &self,
        s1: &mut CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<()> {
        let op = "gated in place";
        let stream = s1.device.cuda_stream();
        let k = kernels(&stream)?;
        let (a, _ga) = read(s2, l2, &stream, op, "a")?;
        let (b, _gb) = write(s1, l1, &stream, op, "b")?;
        // SAFETY: as in `Gated`; b is write-locked by candle and is exactly the output.
        unsafe { k.gated_raw(&stream, self.0, &a, &b, &b) }.map_err(|e| ferr(op, e))
    }
}

/// `x[.., I:] = act(x[.., :I]) * x[.., I:]`, in place over the up half.
pub(crate) struct GatedInterleavedInPlace(pub Activation);

impl InplaceOp1 for GatedInterleavedInPlace {
    fn name(&self) -> &'static str {
        "ferrofuse-gated-interleaved-inplace"
    }

    fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout) -> Result<()> {
        Err(cpu_only("gated interleaved in place"))
    }

    fn cuda_fwd(&self, s: &mut CudaStorage, l: &Layout) -> Result<()> {
        let op = "gated interleaved in place";
        let stream = s.device.cuda_stream();
        let k = kernels(&stream)?;
        let (x, _gx) = write(s, l, &stream, op, "gate_up")?;
        let (gate, up) = x.interleaved_halves().map_err(|e| ferr(op, e))?;
        // SAFETY: as in `Gated`; the output is exactly the up half, which does not overlap the
        // gate half.
        unsafe { k.gated_raw(&stream, self.0, &gate, &up, &up) }.map_err(|e| ferr(op, e))
    }
}

// ---------------------------------------------------------------------------------------
// RMSNorm.

/// The weight `[H]` as a `[1, H]` matrix.
fn read_weight<'a>(
    s: &'a CudaStorage,
    l: &Layout,
    stream: &'a CudaStream,
    op: &str,
) -> Result<(MatDesc, SyncOnDrop<'a>)> {
    read(s, l, stream, op, "weight")
}

/// Each row's `rstd`, kept by a forward op for its backward.
type SavedRstd = Mutex<Option<Arc<CudaSlice<f32>>>>;

/// A fresh `[rows, 1]` f32 buffer for `rstd` when the op keeps it.
fn alloc_rstd(stream: &Arc<CudaStream>, keep: bool, rows: usize) -> Result<Option<CudaSlice<f32>>> {
    if !keep {
        return Ok(None);
    }
    // SAFETY: the forward kernel writes every row's rstd.
    let s = unsafe { stream.alloc::<f32>(rows) }.map_err(candle_core::Error::wrap)?;
    Ok(Some(s))
}

/// Plain RMSNorm `y = x * rstd * w`; backward through [`RmsNormBwd`].
pub(crate) struct RmsNorm {
    pub opts: RmsNormOptions,
    /// Keep `rstd` for the backward (when the inputs are tracked).
    pub keep_rstd: bool,
    pub rstd: SavedRstd,
}

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "ferrofuse-rms-norm"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        Err(cpu_only("rms_norm"))
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let op = "rms_norm";
        let stream = s1.device.cuda_stream();
        let k = kernels(&stream)?;
        let (x, _gx) = read(s1, l1, &stream, op, "x")?;
        let (weight, _gw) = read_weight(s2, l2, &stream, op)?;
        let mut out = alloc(&s1.device, x.dtype, x.rows * x.cols)?;
        let mut rstd = alloc_rstd(&stream, self.keep_rstd, x.rows)?;
        {
            let (y, _gy) = dense(&mut out, x.rows, x.cols, &stream, op)?;
            let (rstd_desc, _gr) = rstd_desc_mut(rstd.as_mut(), &stream);
            let t = RmsNormFwdDescs {
                x,
                residual: None,
                weight,
                y,
                h: None,
                rstd: rstd_desc,
            };
            // SAFETY: as in `Gated`; y and rstd are fresh.
            unsafe { k.rmsnorm_raw(&stream, &t, &self.opts) }.map_err(|e| ferr(op, e))?;
        }
        *self.rstd.lock().unwrap_or_else(|e| e.into_inner()) = rstd.map(Arc::new);
        Ok((out, l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let bwd = RmsNormBwd::new(self.opts, &self.rstd, false)?;
        let dx = readable(grad)?.apply_op3_no_bwd(x, w, &bwd)?;
        Ok((Some(dx), Some(bwd.dw(w)?)))
    }
}

fn rstd_desc_mut<'a>(
    rstd: Option<&'a mut CudaSlice<f32>>,
    stream: &'a CudaStream,
) -> (Option<MatDesc>, Option<SyncOnDrop<'a>>) {
    match rstd {
        Some(r) => {
            let rows = r.len();
            let (addr, g) = r.device_ptr_mut(stream);
            (
                Some(MatDesc::contiguous(addr, rows, DType::F32, rows, 1)),
                Some(g),
            )
        }
        None => (None, None),
    }
}

/// `h = x + residual`, `y = rmsnorm(h) * w`: `[y, h]` packed `[2, ...]`; backward through
/// [`RmsNormBwd`] (packed).
pub(crate) struct AddRmsNorm {
    pub opts: RmsNormOptions,
    pub keep_rstd: bool,
    pub rstd: SavedRstd,
}

impl CustomOp3 for AddRmsNorm {
    fn name(&self) -> &'static str {
        "ferrofuse-add-rms-norm"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        Err(cpu_only("add_rms_norm"))
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
        s3: &CudaStorage,
        l3: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let op = "add_rms_norm";
        let stream = s1.device.cuda_stream();
        let k = kernels(&stream)?;
        let (x, _gx) = read(s1, l1, &stream, op, "x")?;
        let (residual, _gr) = read(s2, l2, &stream, op, "residual")?;
        let (weight, _gw) = read_weight(s3, l3, &stream, op)?;
        let n = x.rows * x.cols;
        let mut out = alloc(&s1.device, x.dtype, 2 * n)?;
        let mut rstd = alloc_rstd(&stream, self.keep_rstd, x.rows)?;
        {
            let (both, _go) = dense(&mut out, 2 * x.rows, x.cols, &stream, op)?;
            let y = MatDesc::contiguous(both.addr, n, x.dtype, x.rows, x.cols);
            let h = both.flat(n, n);
            let h = MatDesc::contiguous(h.addr, n, x.dtype, x.rows, x.cols);
            let (rstd_desc, _gs) = rstd_desc_mut(rstd.as_mut(), &stream);
            let t = RmsNormFwdDescs {
                x,
                residual: Some(residual),
                weight,
                y,
                h: Some(h),
                rstd: rstd_desc,
            };
            // SAFETY: as in `Gated`; y and h are the two halves of the fresh output.
            unsafe { k.rmsnorm_raw(&stream, &t, &self.opts) }.map_err(|e| ferr(op, e))?;
        }
        *self.rstd.lock().unwrap_or_else(|e| e.into_inner()) = rstd.map(Arc::new);
        Ok((out, packed_shape(l1.dims())))
    }

    fn bwd(
        &self,
        _x: &Tensor,
        _residual: &Tensor,
        w: &Tensor,
        packed: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let bwd = RmsNormBwd::new(self.opts, &self.rstd, true)?;
        let dx = readable(grad)?.apply_op3_no_bwd(packed, w, &bwd)?;
        Ok((Some(dx.clone()), Some(dx), Some(bwd.dw(w)?)))
    }
}

/// The norm's backward as an op on `(dy, h, w)`: `dx` is its result, `dw` is kept for
/// [`RmsNormBwd::dw`]. Packed (after [`AddRmsNorm`]): the first operand is the gradient of
/// `[y, h]`, so `dy` and the residual gradient `dres`, and the second is the forward's `[y,
/// h]`.
struct RmsNormBwd {
    opts: RmsNormOptions,
    rstd: Arc<CudaSlice<f32>>,
    packed: bool,
    dw: Mutex<Option<CudaStorage>>,
}

impl RmsNormBwd {
    fn new(opts: RmsNormOptions, rstd: &SavedRstd, packed: bool) -> Result<Self> {
        let rstd = rstd
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| {
                candle_core::Error::Msg(
                    "ferrofuse-candle rms_norm backward: the forward kept no rstd (its inputs \
                     were not tracked when it ran)"
                        .into(),
                )
            })?;
        Ok(Self {
            opts,
            rstd,
            packed,
            dw: Mutex::new(None),
        })
    }

    /// The weight's gradient the op computed, shaped as `w`.
    fn dw(&self, w: &Tensor) -> Result<Tensor> {
        let dw = self.dw.lock().unwrap_or_else(|e| e.into_inner()).take();
        let dw = dw.ok_or_else(|| {
            candle_core::Error::Msg("ferrofuse-candle rms_norm backward: no dw computed".into())
        })?;
        Ok(tensor(dw, w.shape()))
    }
}

impl CustomOp3 for RmsNormBwd {
    fn name(&self) -> &'static str {
        "ferrofuse-rms-norm-backward"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        Err(cpu_only("rms_norm backward"))
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
        s3: &CudaStorage,
        l3: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let op = "rms_norm backward";
        let stream = s1.device.cuda_stream();
        let k = kernels(&stream)?;
        let (dy_l, dres_l, h_l) = if self.packed {
            (index0(l1, 0), Some(index0(l1, 1)), index0(l2, 1))
        } else {
            (l1.clone(), None, l2.clone())
        };
        let (dy, _gd) = read(s1, &dy_l, &stream, op, "dy")?;
        let dres = match &dres_l {
            Some(l) => Some(read(s1, l, &stream, op, "dres")?),
            None => None,
        };
        let (h, _gh) = read(s2, &h_l, &stream, op, "h")?;
        let (weight, _gw) = read_weight(s3, l3, &stream, op)?;
        let (rstd_addr, _gs) = self.rstd.device_ptr(&stream);
        let rstd = MatDesc::contiguous(rstd_addr, self.rstd.len(), DType::F32, dy.rows, 1);
        let ws_len = rmsnorm_backward_workspace_len(dy.dtype, dy.rows, dy.cols).max(1);
        let mut ws = alloc(&s1.device, DType::F32, ws_len)?;
        let mut dx_s = alloc(&s1.device, dy.dtype, dy.rows * dy.cols)?;
        let mut dw_s = alloc(&s1.device, weight.dtype, dy.cols)?;
        {
            let (dx, _gx) = dense(&mut dx_s, dy.rows, dy.cols, &stream, op)?;
            let (dw, _gw2) = dense(&mut dw_s, 1, dy.cols, &stream, op)?;
            let (workspace, _gk) = dense(&mut ws, 1, ws_len, &stream, op)?;
            let t = RmsNormBwdDescs {
                dy,
                h,
                weight,
                rstd,
                dres: dres.as_ref().map(|(d, _)| *d),
                dx,
                dw,
                workspace,
            };
            // SAFETY: as in `Gated`; dx, dw and the workspace are fresh; rstd is the forward's,
            // kept alive by this op.
            unsafe { k.rmsnorm_backward_raw(&stream, &t, &self.opts) }.map_err(|e| ferr(op, e))?;
        }
        *self.dw.lock().unwrap_or_else(|e| e.into_inner()) = Some(dw_s);
        Ok((dx_s, dy_l.shape().clone()))
    }
}

/// Plain RMSNorm in place: `x` receives `y`.
pub(crate) struct RmsNormInPlace(pub RmsNormOptions);

impl InplaceOp2 for RmsNormInPlace {
    fn name(&self) -> &'static str {
        "ferrofuse-rms-norm-inplace"
    }

    fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> Result<()> {
        Err(cpu_only("rms_norm in place"))
    }

    fn cuda_fwd(
        &self,
        s1: &mut CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<()> {
        let op = "rms_norm in place";
        let stream = s1.device.cuda_stream();
        let k = kernels(&stream)?;
        let (weight, _gw) = read_weight(s2, l2, &stream, op)?;
        let (x, _gx) = write(s1, l1, &stream, op, "x")?;
        let t = RmsNormFwdDescs {
            x,
            residual: None,
            weight,
            y: x,
            h: None,
            rstd: None,
        };
        // SAFETY: as in `Gated`; x is write-locked by candle and y is exactly x.
        unsafe { k.rmsnorm_raw(&stream, &t, &self.0) }.map_err(|e| ferr(op, e))
    }
}

/// The vLLM convention, outer half: write-locks `residual` (which receives `h`), then runs
/// [`AddRmsNormInPlaceX`] on `x` (which receives `y`) inside that lock.
pub(crate) struct AddRmsNormInPlace {
    pub x: Tensor,
    pub w: Tensor,
    pub opts: RmsNormOptions,
}

impl InplaceOp1 for AddRmsNormInPlace {
    fn name(&self) -> &'static str {
        "ferrofuse-add-rms-norm-inplace"
    }

    fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout) -> Result<()> {
        Err(cpu_only("add_rms_norm in place"))
    }

    fn cuda_fwd(&self, s: &mut CudaStorage, l: &Layout) -> Result<()> {
        let op = "add_rms_norm in place";
        let stream = s.device.cuda_stream();
        let (residual, _gr) = write(s, l, &stream, op, "residual")?;
        self.x.inplace_op2(
            &self.w,
            &AddRmsNormInPlaceX {
                residual,
                opts: self.opts,
            },
        )
    }
}

/// The inner half: `x` write-locked by candle, `residual` by [`AddRmsNormInPlace`].
struct AddRmsNormInPlaceX {
    residual: MatDesc,
    opts: RmsNormOptions,
}

impl InplaceOp2 for AddRmsNormInPlaceX {
    fn name(&self) -> &'static str {
        "ferrofuse-add-rms-norm-inplace"
    }

    fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> Result<()> {
        Err(cpu_only("add_rms_norm in place"))
    }

    fn cuda_fwd(
        &self,
        s1: &mut CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<()> {
        let op = "add_rms_norm in place";
        let stream = s1.device.cuda_stream();
        let k = kernels(&stream)?;
        let (weight, _gw) = read_weight(s2, l2, &stream, op)?;
        let (x, _gx) = write(s1, l1, &stream, op, "x")?;
        let t = RmsNormFwdDescs {
            x,
            residual: Some(self.residual),
            weight,
            y: x,
            h: Some(self.residual),
            rstd: None,
        };
        // SAFETY: as in `Gated`; x and residual are write-locked (x by candle, residual by the
        // outer op, which holds its lock and its stream guard across this call); y is exactly
        // x and h exactly residual, and the plan rejects any other overlap.
        unsafe { k.rmsnorm_raw(&stream, &t, &self.opts) }.map_err(|e| ferr(op, e))
    }
}

// ---------------------------------------------------------------------------------------
// FP8 outputs. Not differentiable (a quantisation), so no candle op: the inputs' storages are
// read under their locks, the outputs allocated here and returned as fresh tensors.

/// A CUDA tensor's storage, or the error for a CPU one.
fn cuda_storage<'t>(t: &'t Tensor, op: &str) -> Result<(StorageRef<'t>, &'t Layout)> {
    let (s, l) = t.storage_and_layout();
    if !matches!(&*s, Storage::Cuda(_)) {
        return Err(cpu_only(op));
    }
    Ok((s, l))
}

/// The CUDA storage behind a guard [`cuda_storage`] checked.
fn as_cuda<'s>(s: &'s StorageRef<'_>) -> &'s CudaStorage {
    match &**s {
        Storage::Cuda(s) => s,
        _ => unreachable!("cuda_storage checked it"),
    }
}

/// The FP8 output `y_q` (`rows x cols`, returned with `dims`) and its scales for one call:
/// allocates them (the static scale is the caller's `[1, 1]` tensor, read), runs `launch` with
/// their descriptions, and returns `(y_q, scales)` shaped as `crate::gated_fp8` documents.
#[allow(clippy::too_many_arguments)]
fn fp8_call(
    op: &str,
    dev: &CudaDevice,
    stream: &CudaStream,
    (rows, cols): (usize, usize),
    mut dims: Vec<usize>,
    scaling: Fp8Scaling,
    scale: Option<&Tensor>,
    launch: impl FnOnce(&MatDesc, &MatDesc) -> ferrofuse::Result<()>,
) -> Result<(Tensor, Tensor)> {
    let (srows, scols) = scaling.scale_shape(rows, cols).map_err(|e| ferr(op, e))?;
    let y_shape: Shape = dims.clone().into();
    let scale = match (scaling, scale) {
        (Fp8Scaling::Static, Some(scale)) => Some(scale),
        (Fp8Scaling::Static, None) => {
            return Err(candle_core::Error::Msg(format!(
                "ferrofuse-candle {op}: static scaling needs the scale tensor (one f32)"
            )));
        }
        (_, Some(_)) => {
            return Err(candle_core::Error::Msg(format!(
                "ferrofuse-candle {op}: a scale tensor is given for a dynamic scaling, which \
                 computes its own"
            )));
        }
        (_, None) => None,
    };
    if rows == 0 || cols == 0 {
        // Nothing to launch: the same shapes, empty.
        let device = candle_core::Device::Cuda(dev.clone());
        let scales = match scale {
            Some(s) => s.clone(),
            None => Tensor::zeros((srows, scols), candle_core::DType::F32, &device)?,
        };
        let y_q = Tensor::zeros(y_shape, candle_core::DType::F8E4M3, &device)?;
        return Ok((y_q, scales));
    }
    let mut yq = alloc(dev, DType::F8E4M3, rows * cols)?;
    if let Some(scale) = scale {
        let (ss, sl) = cuda_storage(scale, op)?;
        let (sd, _gs) = read(as_cuda(&ss), sl, stream, op, "scale")?;
        {
            let (y, _gy) = dense(&mut yq, rows, cols, stream, op)?;
            launch(&y, &sd).map_err(|e| ferr(op, e))?;
        }
        return Ok((tensor(yq, &y_shape), scale.clone()));
    }
    // Column-major group scales keep a row stride padded to 4 (16 bytes), as TMA loads of
    // Hopper block-scaled GEMMs want; the tensor returned is the unpadded view.
    let col_major = matches!(
        scaling,
        Fp8Scaling::PerGroup {
            layout: ScaleLayout::ColMajor,
            ..
        }
    );
    let stride = if col_major {
        scols.next_multiple_of(4)
    } else {
        scols
    };
    let mut st = alloc(dev, DType::F32, srows * stride)?;
    {
        let (y, _gy) = dense(&mut yq, rows, cols, stream, op)?;
        let (mut sd, _gs) = dense(&mut st, srows, stride, stream, op)?;
        sd.cols = scols;
        launch(&y, &sd).map_err(|e| ferr(op, e))?;
    }
    let full = tensor(st, &Shape::from((srows, stride)));
    let scales = if col_major {
        full.narrow(1, 0, scols)?
    } else {
        dims.pop();
        dims.push(scols);
        full.reshape(dims)?
    };
    Ok((tensor(yq, &y_shape), scales))
}

/// The inputs of a gated FP8 call.
pub(crate) enum GatedInputs<'t> {
    Split(&'t Tensor, &'t Tensor),
    Interleaved(&'t Tensor),
}

/// `(y_q, scales)` of `act(a) * b` (see `crate::gated_fp8`).
pub(crate) fn gated_fp8(
    act: Activation,
    inputs: GatedInputs<'_>,
    scaling: Fp8Scaling,
    scale: Option<&Tensor>,
) -> Result<(Tensor, Tensor)> {
    let op = "gated FP8";
    let (first, second) = match inputs {
        GatedInputs::Split(a, b) => (a, Some(b)),
        GatedInputs::Interleaved(x) => (x, None),
    };
    let (s1, l1) = cuda_storage(first, op)?;
    let dev = as_cuda(&s1).device.clone();
    let stream = dev.cuda_stream();
    let k = kernels(&stream)?;
    let (x1, _g1) = read(as_cuda(&s1), l1, &stream, op, "a")?;
    let s2 = second.map(|b| cuda_storage(b, op)).transpose()?;
    let mut dims = first.dims().to_vec();
    let (a, b, _g2) = match &s2 {
        Some((s2, l2)) => {
            let (b, g2) = read(as_cuda(s2), l2, &stream, op, "b")?;
            (x1, b, Some(g2))
        }
        None => {
            let (gate, up) = x1.interleaved_halves().map_err(|e| ferr(op, e))?;
            if let Some(last) = dims.last_mut() {
                *last /= 2;
            }
            (gate, up, None)
        }
    };
    let shape = (a.rows, a.cols);
    fp8_call(
        op,
        &dev,
        &stream,
        shape,
        dims,
        scaling,
        scale,
        |y, scales| {
            // SAFETY: candle's storages, read-locked for this call and alive until the launch
            // (their frees are ordered on this stream after it); y and dynamic scales are fresh.
            unsafe { k.gated_fp8_raw(&stream, act, &a, &b, y, scaling, scales) }
        },
    )
}

/// `(y_q, scales, h)` of RMSNorm over `x` (plus `residual`, giving `h`) with an FP8 `y` (see
/// `crate::add_rms_norm_fp8`); `h` is `None` without a residual.
pub(crate) fn rms_norm_fp8(
    x: &Tensor,
    residual: Option<&Tensor>,
    w: &Tensor,
    opts: &RmsNormOptions,
    scaling: Fp8Scaling,
    scale: Option<&Tensor>,
) -> Result<(Tensor, Tensor, Option<Tensor>)> {
    let op = "rms_norm FP8";
    let (sx, lx) = cuda_storage(x, op)?;
    let dev = as_cuda(&sx).device.clone();
    let stream = dev.cuda_stream();
    let k = kernels(&stream)?;
    let (xd, _gx) = read(as_cuda(&sx), lx, &stream, op, "x")?;
    let (sw, lw) = cuda_storage(w, op)?;
    let (weight, _gw) = read_weight(as_cuda(&sw), lw, &stream, op)?;
    let sr = residual.map(|r| cuda_storage(r, op)).transpose()?;
    let (residual, _gr) = match &sr {
        Some((sr, lr)) => {
            let (r, g) = read(as_cuda(sr), lr, &stream, op, "residual")?;
            (Some(r), Some(g))
        }
        None => (None, None),
    };
    let (rows, cols) = (xd.rows, xd.cols);
    let mut h_out = match residual {
        Some(_) if rows * cols > 0 => Some(alloc(&dev, xd.dtype, rows * cols)?),
        _ => None,
    };
    let (h, _gh) = match h_out.as_mut() {
        Some(h) => {
            let (d, g) = dense(h, rows, cols, &stream, op)?;
            (Some(d), Some(g))
        }
        None => (None, None),
    };
    let dims = x.dims().to_vec();
    let (y_q, scales) = fp8_call(
        op,
        &dev,
        &stream,
        (rows, cols),
        dims,
        scaling,
        scale,
        |y, s| {
            let t = RmsNormFp8Descs {
                x: xd,
                residual,
                weight,
                h,
                rstd: None,
                y: *y,
                scales: *s,
            };
            // SAFETY: as in `gated_fp8`; h is fresh too.
            unsafe { k.rmsnorm_fp8_raw(&stream, &t, scaling, opts) }
        },
    )?;
    drop(_gh);
    let h = match (h_out, residual) {
        (Some(h), _) => Some(tensor(h, x.shape())),
        (None, Some(_)) => Some(x.zeros_like()?),
        (None, None) => None,
    };
    Ok((y_q, scales, h))
}
