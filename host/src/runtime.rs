//! Loading the embedded PTX: once per device context, every function looked up once.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use cudarc::driver::sys::{self, CUdevice_attribute};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, DevicePtrMut};
use cudarc::nvrtc::Ptx;
use ferrofuse_common::{
    GatedBwdParams, GatedFwdParams, KernelId, RmsNormBwdParams, RmsNormDwParams, RmsNormFwdParams,
    ZERO_FILL_THREADS,
};

use crate::error::{DriverContext, Error, Result};

/// The PTX module built by `build.rs` from the `ferrofuse-kernels` crate.
pub const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/ferrofuse.ptx"));
/// The arch it targets (`FERROFUSE_CUDA_ARCH` at build time, `sm_90` by default).
pub const PTX_ARCH: &str = env!("FERROFUSE_PTX_ARCH");
const PTX_CC: &str = env!("FERROFUSE_PTX_CC");

/// Whether the CUDA driver library can be loaded. cudarc panics on first use when it cannot,
/// so every entry point that touches the driver asks this first.
pub fn driver_available() -> bool {
    // SAFETY: only tries to dlopen libcuda; no driver call is made.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Number of CUDA devices, or [`Error::NoDriver`].
pub fn device_count() -> Result<usize> {
    if !driver_available() {
        return Err(Error::NoDriver);
    }
    match CudaContext::device_count() {
        Ok(n) => Ok(n.max(0) as usize),
        // cuInit reports "no device" as an error.
        Err(e) if e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_NO_DEVICE => Ok(0),
        Err(e) => Err(Error::Driver {
            during: "counting devices",
            source: e,
        }),
    }
}

/// A `#[repr(C)]` struct from ferrofuse-common that a kernel entry takes by value.
///
/// # Safety
/// Implementors must be the exact parameter type of the entries they are launched with.
pub unsafe trait KernelParams: Copy {}
// SAFETY: these are the parameter types of the gated entries (see ferrofuse-common).
unsafe impl KernelParams for GatedFwdParams {}
unsafe impl KernelParams for GatedBwdParams {}
// SAFETY: the parameter types of the rmsnorm entries (see ferrofuse-common and kernels/src/norm.rs).
unsafe impl KernelParams for RmsNormFwdParams {}
unsafe impl KernelParams for RmsNormBwdParams {}
unsafe impl KernelParams for RmsNormDwParams {}

/// A kernel launch, fully decided on the host: which entry, the grid, and its parameters.
/// Produced by the `plan_*` functions, which do all validation and can run without a GPU.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Launch<P> {
    pub kernel: KernelId,
    pub grid: u32,
    pub block: u32,
    pub shared_mem_bytes: u32,
    pub params: P,
}

/// The ferrofuse kernels loaded into one CUDA context.
///
/// Obtain with [`Kernels::for_device`] or [`Kernels::for_context`]: each context loads the
/// module once, and later calls return the same handle while it is alive.
pub struct Kernels {
    ctx: Arc<CudaContext>,
    functions: Vec<CudaFunction>,
    limits: GridLimits,
    /// Launch with programmatic stream serialization (sm_90+): see [`Kernels::launch`].
    programmatic: AtomicBool,
    /// Whether this device and the PTX allow it (decided once, at load).
    programmatic_supported: bool,
    _module: Arc<CudaModule>,
}

/// What a plan sizes a grid with: the multiprocessor count and how many blocks of each
/// kernel (at the block size `occupancy_block_size` names) fit on one multiprocessor at once.
#[derive(Clone, Debug, PartialEq)]
pub struct GridLimits {
    pub sm_count: u32,
    blocks_per_sm: [u32; KernelId::COUNT],
}

impl GridLimits {
    /// The same occupancy for every kernel (for planning without a device, and in tests).
    pub fn uniform(sm_count: u32, blocks_per_sm: u32) -> Self {
        Self {
            sm_count,
            blocks_per_sm: [blocks_per_sm; KernelId::COUNT],
        }
    }

    /// Blocks of `kernel` the whole device holds at once (at least one per multiprocessor).
    pub fn resident_blocks(&self, kernel: KernelId) -> u32 {
        self.sm_count.max(1) * self.blocks_per_sm[kernel.index()].max(1)
    }
}

/// The block size a kernel's occupancy is read at: its family's, where that is fixed, and the
/// largest block for the w-first norm forward (so a grid planned as one wave is one at every
/// row length).
fn occupancy_block_size(kernel: KernelId) -> Option<u32> {
    matches!(
        kernel,
        KernelId::GatedFwd(..) | KernelId::GatedBwd(..) | KernelId::RmsNormFwdWFirst(..)
    )
    .then(|| kernel.max_block_threads())
}

static LOADED: Mutex<Vec<(usize, Weak<Kernels>)>> = Mutex::new(Vec::new());

impl Kernels {
    /// The kernels on device `ordinal`'s primary context.
    pub fn for_device(ordinal: usize) -> Result<Arc<Self>> {
        let count = device_count()?;
        if ordinal >= count {
            return Err(Error::NoDevice { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal).during("creating the device context")?;
        Self::for_context(&ctx)
    }

    /// The kernels in `ctx`, loading the module the first time this context asks.
    pub fn for_context(ctx: &Arc<CudaContext>) -> Result<Arc<Self>> {
        let key = ctx.cu_ctx() as usize;
        let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
        loaded.retain(|(_, k)| k.strong_count() > 0);
        if let Some(k) = loaded
            .iter()
            .find(|(c, _)| *c == key)
            .and_then(|(_, k)| k.upgrade())
        {
            return Ok(k);
        }
        let kernels = Arc::new(Self::load(ctx)?);
        loaded.push((key, Arc::downgrade(&kernels)));
        Ok(kernels)
    }

    fn load(ctx: &Arc<CudaContext>) -> Result<Self> {
        let (major, minor) = ctx
            .compute_capability()
            .during("reading the compute capability")?;
        let ptx_cc: i32 = PTX_CC.parse().unwrap_or(80);
        if major * 10 + minor < ptx_cc {
            return Err(Error::UnsupportedDevice {
                name: ctx.name().unwrap_or_default(),
                compute_capability: (major, minor),
                ptx_arch: PTX_ARCH,
            });
        }
        let module = ctx
            .load_module(Ptx::from_src(PTX))
            .during("loading the PTX module")?;
        let functions = KernelId::ALL
            .iter()
            .map(|k| module.load_function(k.name()))
            .collect::<Result<Vec<_>, _>>()
            .during("looking up a kernel")?;
        let sm_count = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .during("reading the multiprocessor count")? as u32;
        let mut limits = GridLimits::uniform(sm_count, 1);
        for (k, f) in KernelId::ALL.iter().zip(&functions) {
            if let Some(block) = occupancy_block_size(*k) {
                limits.blocks_per_sm[k.index()] = f
                    .occupancy_max_active_blocks_per_multiprocessor(block, 0, None)
                    .during("reading a kernel's occupancy")?;
            }
        }
        // griddepcontrol is compiled in only for sm_90+ PTX (see host/build_ptx.rs).
        let programmatic = major >= 9 && ptx_cc >= 90;
        Ok(Self {
            ctx: ctx.clone(),
            functions,
            limits,
            programmatic: AtomicBool::new(programmatic),
            programmatic_supported: programmatic,
            _module: module,
        })
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Streaming multiprocessors of the device (`limits().sm_count`).
    pub fn sm_count(&self) -> u32 {
        self.limits.sm_count
    }

    /// Multiprocessors and per-kernel occupancy, as the plans use them.
    pub fn limits(&self) -> &GridLimits {
        &self.limits
    }

    /// Whether launches use programmatic dependent launch (on by default on sm_90+).
    pub fn programmatic_launch(&self) -> bool {
        self.programmatic.load(Ordering::Relaxed)
    }

    /// Turns programmatic dependent launch off or back on (where the device supports it), for
    /// measuring what it brings or ruling it out while debugging.
    pub fn set_programmatic_launch(&self, on: bool) {
        self.programmatic
            .store(on && self.programmatic_supported, Ordering::Relaxed);
    }

    /// The stream must belong to this context.
    pub(crate) fn check_stream(&self, stream: &CudaStream) -> Result<()> {
        if stream.context().cu_ctx() != self.ctx.cu_ctx() {
            return Err(Error::WrongDevice { tensor: "stream" });
        }
        Ok(())
    }

    /// Enqueues the empty kernel (one block of 32 threads that does nothing) on `stream`: the
    /// launch floor the benchmark measures beside every real kernel.
    pub fn launch_empty(&self, stream: &CudaStream) -> Result<()> {
        self.check_stream(stream)?;
        // SAFETY: the entry takes no parameters and touches no memory.
        unsafe { self.launch_raw(KernelId::Empty, 1, 32, 0, stream, &mut []) }
    }

    /// Writes zeros over `buf` with the `zero_fill` kernel, on the SMs rather than through
    /// `cuMemsetD8Async`. The benchmark flushes the L2 with it before each timed call, the way
    /// `triton.testing.do_bench` does (a `zero_()` kernel), so ferrofuse and the peers are
    /// timed after the same kind of flush.
    pub fn zero_fill(&self, stream: &CudaStream, buf: &mut impl DevicePtrMut<u8>) -> Result<()> {
        self.check_views(stream, &[("buffer", buf.stream())])?;
        let len = buf.len();
        if !len.is_multiple_of(16) {
            return Err(Error::InvalidArgument {
                what: "zero_fill length (a multiple of 16 bytes)",
                value: len.to_string(),
            });
        }
        let (addr, _written) = buf.device_ptr_mut(stream);
        if !addr.is_multiple_of(16) {
            return Err(Error::Misaligned {
                tensor: "buffer",
                addr,
                align: 16,
            });
        }
        let mut dst = addr;
        let mut words = (len / 16) as u64;
        if words == 0 {
            return Ok(());
        }
        // Grid-stride: a capped grid covers any length.
        let grid = words.div_ceil(ZERO_FILL_THREADS as u64).min(65_535) as u32;
        let mut args = [
            &mut dst as *mut u64 as *mut c_void,
            &mut words as *mut u64 as *mut c_void,
        ];
        // SAFETY: the entry takes (u64 dst, u64 words); dst is 16-byte aligned and holds
        // words * 16 bytes of this context's memory (checked above).
        unsafe {
            self.launch_raw(
                KernelId::ZeroFill,
                grid,
                ZERO_FILL_THREADS,
                0,
                stream,
                &mut args,
            )
        }
    }

    /// Enqueues `launch` on `stream`: one driver launch (`cuLaunchKernelEx` with programmatic
    /// stream serialization where that is on, `cuLaunchKernel` otherwise), no allocation, no
    /// synchronisation, so it can be captured into a CUDA graph.
    ///
    /// # Safety
    /// `launch` must come from a `plan_*` function whose checks passed for buffers that stay
    /// alive and unaliased (beyond what the plan allows) until the kernel has run.
    pub(crate) unsafe fn launch<P: KernelParams>(
        &self,
        stream: &CudaStream,
        launch: &Launch<P>,
    ) -> Result<()> {
        if launch.grid == 0 {
            return Ok(());
        }
        let mut params = launch.params;
        let mut args = [&mut params as *mut P as *mut c_void];
        // SAFETY: the kernel takes one by-value parameter of type P (the shared struct from
        // ferrofuse-common), which `args` points to; the plan checked every address in it, and
        // the caller keeps the buffers alive.
        unsafe {
            self.launch_raw(
                launch.kernel,
                launch.grid,
                launch.block,
                launch.shared_mem_bytes,
                stream,
                &mut args,
            )
        }
    }

    /// One driver launch of `kernel` on `stream`. With programmatic dependent launch on and a
    /// kernel that syncs its grid dependency, `cuLaunchKernelEx` with programmatic stream
    /// serialization: the kernel may be scheduled while the previous work in the stream drains.
    /// Every such sm_90 entry executes `griddepcontrol.wait` before its first global memory
    /// access, which waits for the preceding grid to complete and its writes to be visible, so
    /// stream order is kept for any predecessor, PDL-aware or not. Otherwise `cuLaunchKernel`.
    ///
    /// # Safety
    /// `args` point to the entry's parameters, each of the type it takes, and every address
    /// in them stays valid for what the kernel does with it until the kernel has run.
    unsafe fn launch_raw(
        &self,
        kernel: KernelId,
        grid: u32,
        block: u32,
        shared_mem_bytes: u32,
        stream: &CudaStream,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        let function = self.functions[kernel.index()].cu_function();
        self.ctx.bind_to_thread().during("binding the context")?;
        if !(self.programmatic_launch() && kernel.syncs_grid_dependency()) {
            // SAFETY: the caller's contract.
            return unsafe {
                cudarc::driver::result::launch_kernel(
                    function,
                    (grid, 1, 1),
                    (block, 1, 1),
                    shared_mem_bytes,
                    stream.cu_stream(),
                    args,
                )
            }
            .during("launching a kernel");
        }
        let mut attr = sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            // SAFETY: an all-zero value is a valid bit pattern of this plain C union.
            value: unsafe { std::mem::zeroed() },
        };
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: grid,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: shared_mem_bytes,
            hStream: stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: the caller's contract; `config` and `attr` outlive the call, which copies
        // them.
        unsafe { sys::cuLaunchKernelEx(&config, function, args.as_mut_ptr(), std::ptr::null_mut()) }
            .result()
            .during("launching a kernel")
    }
}
