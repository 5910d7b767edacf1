//! The timing harness on the GPU: CUDA events, warm-up, L2 flush, median; CUDA-graph replay;
//! the copy ceiling and the launch floor; random input data.
//!
//! Everything runs on one non-blocking stream of the device's primary context, with cudarc's
//! cross-stream event tracking switched off (there is only this stream, and stream capture
//! must not wait on events recorded outside the capture).

use std::sync::Arc;

use ferrofuse::cudarc::driver::sys::{
    CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode,
};
use ferrofuse::cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtrMut};
use ferrofuse::{Element, Kernels, PtxModule};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::stats::{
    ESTIMATE_CALLS, GRAPH_REPLAYS, MAX_GRAPH_CALLS, MAX_TIMED_CALLS, calls_for, median,
};

pub type Result<T, E = String> = std::result::Result<T, E>;

/// Attaches what was being done to any error.
pub trait Context<T> {
    fn ctx(self, what: &str) -> Result<T>;
}

impl<T, E: std::fmt::Display> Context<T> for std::result::Result<T, E> {
    fn ctx(self, what: &str) -> Result<T> {
        self.map_err(|e| format!("{what}: {e}"))
    }
}

/// Budgets of the timing method, in milliseconds of GPU time (see [`crate::stats`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Budgets {
    pub warmup_ms: f64,
    pub rep_ms: f64,
    pub graph_rep_ms: f64,
}

impl Default for Budgets {
    /// do_bench's defaults (warmup 25, rep 100); for graphs 10 ms of launches per graph
    /// (do_bench_cudagraph's default is 20; 10 keeps the default run short, and each graph
    /// still holds hundreds of launches or more).
    fn default() -> Self {
        Self {
            warmup_ms: 25.0,
            rep_ms: 100.0,
            graph_rep_ms: 10.0,
        }
    }
}

/// Bytes written before each per-call run, as `triton.testing.do_bench` does (256 MiB,
/// four times the H200's 60 MiB L2 cache).
pub const L2_FLUSH_BYTES: usize = 256 << 20;

/// Something to time: enqueues one call on the harness's stream, and nothing else.
pub type Call<'a> = dyn FnMut() -> Result<()> + 'a;

/// The device, its stream, the flush buffer and a pool of timing events.
pub struct Harness {
    pub kernels: Arc<Kernels>,
    pub stream: Arc<CudaStream>,
    pub budgets: Budgets,
    flush: CudaSlice<u8>,
    events: Vec<CudaEvent>,
}

/// Device `device`'s primary context (the caller checked that the device exists).
fn context(device: usize) -> Result<Arc<CudaContext>> {
    CudaContext::new(device).ctx("creating the device context")
}

impl Harness {
    /// The harness on device `device`, with the kernels of `module` (`None`: the device's own),
    /// compiled from its PTX by the driver where `from_ptx` (else its prebuilt SASS where that
    /// runs).
    pub fn new(
        device: usize,
        module: Option<&'static PtxModule>,
        from_ptx: bool,
        budgets: Budgets,
    ) -> Result<Self> {
        // Only the module asked for is loaded (a second one would add its load to `load_s`).
        let kernels = match (module, from_ptx) {
            (None, false) => Kernels::for_device(device).ctx("loading the kernels")?,
            (Some(m), _) => Kernels::for_context_with_module(&context(device)?, m)
                .ctx("loading the requested module")?,
            (None, true) => Kernels::for_context_from_ptx(&context(device)?)
                .ctx("loading the kernels from their PTX")?,
        };
        let ctx = kernels.context().clone();
        // SAFETY: one stream does all the work, so no cross-stream ordering is needed; buffers
        // are only freed after a synchronize.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().ctx("creating a stream")?;
        Self::on_stream(kernels, stream, budgets)
    }

    /// The harness on a stream the caller owns (another framework's, e.g. candle's), with
    /// the same method. The caller sees to cross-stream tracking: capture in
    /// [`Harness::graph`] fails on a stream whose buffers wait on events recorded outside it.
    pub fn on_stream(
        kernels: Arc<Kernels>,
        stream: Arc<CudaStream>,
        budgets: Budgets,
    ) -> Result<Self> {
        let flush = stream
            .alloc_zeros::<u8>(L2_FLUSH_BYTES)
            .ctx("allocating the L2 flush buffer")?;
        Ok(Self {
            kernels,
            stream,
            budgets,
            flush,
            events: Vec::new(),
        })
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        self.kernels.context()
    }

    pub fn sync(&self) -> Result<()> {
        self.stream.synchronize().ctx("synchronizing")
    }

    /// Makes sure the pool holds at least `n` timing events.
    fn events(&mut self, n: usize) -> Result<()> {
        while self.events.len() < n {
            let e = self
                .context()
                .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .ctx("creating an event")?;
            self.events.push(e);
        }
        Ok(())
    }

    fn record(&self, i: usize) -> Result<()> {
        self.events[i]
            .record(&self.stream)
            .ctx("recording an event")
    }

    /// Milliseconds between pool events `a` and `b` (both recorded and complete).
    fn elapsed_ms(&self, a: usize, b: usize) -> Result<f64> {
        let ms = self.events[a]
            .elapsed_ms(&self.events[b])
            .ctx("reading an event time")?;
        Ok(ms as f64)
    }

    /// Writes the whole flush buffer, evicting everything the timed call could find in L2.
    /// With a kernel (`Kernels::zero_fill`), as do_bench's `zero_()` does: after a
    /// `cuMemsetD8Async` flush the empty kernel timed 3.8 us per call instead of 3.2.
    fn flush_l2(&mut self) -> Result<()> {
        self.kernels
            .zero_fill(&self.stream, &mut self.flush)
            .ctx("flushing the L2")
    }

    /// Median microseconds per call, L2 flushed before each timed call
    /// (`triton.testing.do_bench(fn, warmup, rep, return_mode="median")`).
    pub fn per_call(&mut self, call: &mut Call<'_>) -> Result<f64> {
        call()?;
        self.sync()?;
        self.events(2)?;
        self.record(0)?;
        for _ in 0..ESTIMATE_CALLS {
            self.flush_l2()?;
            call()?;
        }
        self.record(1)?;
        self.sync()?;
        let estimate_ms = self.elapsed_ms(0, 1)? / ESTIMATE_CALLS as f64;
        let warmup = calls_for(self.budgets.warmup_ms, estimate_ms, MAX_TIMED_CALLS);
        let timed = calls_for(self.budgets.rep_ms, estimate_ms, MAX_TIMED_CALLS);
        self.events(2 * timed)?;
        for _ in 0..warmup {
            call()?;
        }
        for i in 0..timed {
            self.flush_l2()?;
            self.record(2 * i)?;
            call()?;
            self.record(2 * i + 1)?;
        }
        self.sync()?;
        let times: Vec<f64> = (0..timed)
            .map(|i| self.elapsed_ms(2 * i, 2 * i + 1).map(|ms| ms * 1e3))
            .collect::<Result<_>>()?;
        median(&times).ok_or_else(|| "no timed calls".into())
    }

    /// Median microseconds per call over graph replays of back-to-back calls, no L2 flush
    /// (`triton.testing.do_bench_cudagraph(fn, rep, return_mode="median")`).
    pub fn graph(&mut self, call: &mut Call<'_>) -> Result<f64> {
        call()?;
        self.sync()?;
        self.events(2)?;
        self.record(0)?;
        for _ in 0..ESTIMATE_CALLS {
            call()?;
        }
        self.record(1)?;
        self.sync()?;
        let estimate_ms = self.elapsed_ms(0, 1)? / ESTIMATE_CALLS as f64;
        let n = calls_for(self.budgets.graph_rep_ms, estimate_ms, MAX_GRAPH_CALLS);

        self.stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .ctx("beginning a stream capture")?;
        let mut captured = Ok(());
        for _ in 0..n {
            captured = call();
            if captured.is_err() {
                break;
            }
        }
        // End the capture whatever happened, so the stream is usable again.
        let graph = self
            .stream
            .end_capture(CUgraphInstantiate_flags(0))
            .ctx("ending the stream capture");
        captured?;
        let graph = graph?.ok_or("the capture recorded no graph")?;
        self.sync()?;

        self.events(2 * GRAPH_REPLAYS)?;
        let mut times = Vec::with_capacity(GRAPH_REPLAYS);
        for i in 0..GRAPH_REPLAYS {
            self.record(2 * i)?;
            graph.launch().ctx("replaying the graph")?;
            self.record(2 * i + 1)?;
            self.sync()?;
            times.push(self.elapsed_ms(2 * i, 2 * i + 1)? * 1e3 / n as f64);
        }
        median(&times).ok_or_else(|| "no replays".into())
    }

    /// Microseconds of one device-to-device copy of `bytes` bytes, timed per call.
    /// The ceiling is `2 * bytes / time` (read and written).
    pub fn copy_us(&mut self, bytes: usize) -> Result<f64> {
        let stream = self.stream.clone();
        let mut src = stream
            .alloc_zeros::<u8>(bytes)
            .ctx("allocating the copy source")?;
        // Not zeros (zeros can run faster than real data): a byte pattern.
        poison(&stream, &mut src, 0x5A)?;
        let mut dst = stream
            .alloc_zeros::<u8>(bytes)
            .ctx("allocating the copy destination")?;
        let mut call = || stream.memcpy_dtod(&src, &mut dst).ctx("copying");
        self.per_call(&mut call)
    }

    /// Microseconds of the empty kernel in `graph` or per-call mode: the launch floor.
    pub fn empty_us(&mut self, graph: bool) -> Result<f64> {
        let kernels = self.kernels.clone();
        let stream = self.stream.clone();
        let mut call = || {
            kernels
                .launch_empty(&stream)
                .ctx("launching the empty kernel")
        };
        if graph {
            self.graph(&mut call)
        } else {
            self.per_call(&mut call)
        }
    }
}

/// Sets every byte of `buf` to `byte` (0xFF makes every f16/bf16/f32 element a NaN: outputs
/// are poisoned with it before a checked run, so an unwritten element cannot pass).
pub fn poison<T>(stream: &CudaStream, buf: &mut CudaSlice<T>, byte: u8) -> Result<()> {
    let bytes = buf.len() * std::mem::size_of::<T>();
    let (ptr, _record) = buf.device_ptr_mut(stream);
    // SAFETY: `ptr` is the start of `buf`, `bytes` long, alive for this stream-ordered call;
    // any bit pattern is a valid float.
    unsafe {
        ferrofuse::cudarc::driver::result::memset_d8_async(ptr, byte, bytes, stream.cu_stream())
    }
    .ctx("poisoning a buffer")
}

/// Elements of the random block ([`Random`]).
pub const RANDOM_BLOCK: usize = 1 << 24;

/// Random input data: a block of `RANDOM_BLOCK` values, uniform in `[lo, hi)` and rounded to
/// the storage dtype, kept on the host (as f64, for the references) and twice over on the
/// device, from where operands are filled by device copies. Element `i` of an operand filled
/// with offset `o` is `value(o + i)`: random within 16 Mi elements (32 MiB or more), periodic
/// beyond, which is far more than any cache.
pub struct Random<T> {
    host: Vec<f64>,
    dev: CudaSlice<T>,
}

impl<T: Element> Random<T> {
    pub fn new(stream: &Arc<CudaStream>, seed: u64, lo: f64, hi: f64) -> Result<Self> {
        let mut rng = SmallRng::seed_from_u64(seed);
        let values: Vec<T> = (0..RANDOM_BLOCK)
            .map(|_| T::from_f64(rng.random_range(lo..hi)))
            .collect();
        let host: Vec<f64> = values.iter().map(|v| v.to_f64()).collect();
        let twice: Vec<T> = values.iter().chain(values.iter()).copied().collect();
        let dev = stream.clone_htod(&twice).ctx("uploading the random data")?;
        Ok(Self { host, dev })
    }

    /// The value at position `i` of the endless periodic sequence.
    pub fn value(&self, i: usize) -> f64 {
        self.host[i % RANDOM_BLOCK]
    }

    /// A new device buffer of `len` elements holding `value(offset + i)` at `i`.
    pub fn operand(
        &self,
        stream: &Arc<CudaStream>,
        len: usize,
        offset: usize,
    ) -> Result<CudaSlice<T>> {
        // SAFETY: every element is written by the copies below before anything reads it.
        let mut buf = unsafe { stream.alloc::<T>(len) }.ctx("allocating an operand")?;
        let start = offset % RANDOM_BLOCK;
        let mut at = 0;
        while at < len {
            let n = (len - at).min(RANDOM_BLOCK);
            let src = self.dev.slice(start..start + n);
            let mut dst = buf.slice_mut(at..at + n);
            stream
                .memcpy_dtod(&src, &mut dst)
                .ctx("filling an operand")?;
            at += n;
        }
        Ok(buf)
    }
}

/// Device name, and the driver version (`nvidia-smi`'s, with the CUDA version the driver API
/// reports).
pub fn device_info(ctx: &Arc<CudaContext>) -> (String, String) {
    let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
    let mut cuda = 0i32;
    // SAFETY: writes one int; the driver is loaded (the context exists).
    let ok = unsafe { ferrofuse::cudarc::driver::sys::cuDriverGetVersion(&mut cuda) };
    let cuda = if ok == ferrofuse::cudarc::driver::sys::CUresult::CUDA_SUCCESS {
        format!("CUDA {}.{}", cuda / 1000, cuda % 1000 / 10)
    } else {
        "CUDA ?".into()
    };
    let smi = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=driver_version", "--format=csv,noheader"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| {
            String::from_utf8(o.stdout)
                .ok()?
                .lines()
                .next()
                .map(|l| l.trim().to_string())
        })
        .filter(|v| !v.is_empty());
    let driver = match smi {
        Some(v) => format!("{v} ({cuda})"),
        None => cuda,
    };
    (name, driver)
}
