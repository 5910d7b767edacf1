//! ferrofuse device code, compiled for `nvptx64-nvidia-cuda` and linked into one PTX module
//! by `ptx-linker` (driven by `cargo xtask ptx`, which writes the PTX the host crate embeds).
//!
//! One module per op family (`gated`, `norm`), over one module of memory primitives (`mem`)
//! and one of deterministic reductions (`reduce`). Entry
//! names and parameter structs come from `ferrofuse-common`, which the host uses too.
//!
//! Kernels are panic-free by construction and the build proves it: the panic handler calls a
//! symbol that is never defined, so any panic path left after optimisation makes the link fail
//! (see `ptx-linker`). Index arithmetic is u64 throughout.
//!
//! On the host this crate compiles to nothing, so `cargo build --workspace` and clippy work.
#![cfg_attr(target_arch = "nvptx64", no_std)]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(abi_ptx, stdarch_nvptx, asm_experimental_arch)
)]
// An enum as a const parameter: the memory path (`VecMode`) of every kernel body.
#![cfg_attr(target_arch = "nvptx64", feature(adt_const_params))]
// `#[inline(always)]` on closures (norm/realign: the per-vector output closures, which LLVM
// otherwise may keep as calls with their captures in local memory).
#![cfg_attr(target_arch = "nvptx64", feature(stmt_expr_attributes))]
// norm/reduce: the fma intrinsic, dynamic shared memory, the convergent shuffle intrinsic.
#![cfg_attr(
    target_arch = "nvptx64",
    feature(
        core_intrinsics,
        gpu_intrinsics,
        gpu_launch_sized_workgroup_mem,
        link_llvm_intrinsics
    ),
    allow(internal_features)
)]

/// Repeats `$body` for `$l` = 0..8 while `$l < $width` (`$width` a constant after inlining):
/// the lanes of a chunk, the chunks of a row. Unrolled by hand with literal indices: LLVM did
/// not fully unroll such loops with large bodies, and their arrays went to local memory.
#[cfg(target_arch = "nvptx64")]
macro_rules! unroll {
    ($l:ident < $width:expr => $body:block) => {{
        { let $l: usize = 0; if $l < $width $body }
        { let $l: usize = 1; if $l < $width $body }
        { let $l: usize = 2; if $l < $width $body }
        { let $l: usize = 3; if $l < $width $body }
        { let $l: usize = 4; if $l < $width $body }
        { let $l: usize = 5; if $l < $width $body }
        { let $l: usize = 6; if $l < $width $body }
        { let $l: usize = 7; if $l < $width $body }
    }};
}

#[cfg(target_arch = "nvptx64")]
mod cluster;
#[cfg(target_arch = "nvptx64")]
mod gated;
#[cfg(target_arch = "nvptx64")]
mod gated_fp8;
#[cfg(target_arch = "nvptx64")]
mod mem;
#[cfg(target_arch = "nvptx64")]
mod norm;
#[cfg(target_arch = "nvptx64")]
mod reduce;

/// Does nothing. The benchmark launches it (one block of 32 threads) to measure the launch
/// floor: what any kernel costs before it touches memory.
///
/// # Safety
/// None needed: it reads and writes nothing. `unsafe` only to match the other entries.
#[cfg(target_arch = "nvptx64")]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn empty_kernel() {}

/// Writes zeros over `words` 16-byte words at `dst`, grid-stride. The benchmark flushes the
/// L2 with it before each timed call, as `triton.testing.do_bench` does with a `zero_()`
/// kernel, so that both harnesses flush the same way.
///
/// # Safety
/// `dst` is 16-byte aligned and holds `words * 16` writable bytes (`Kernels::zero_fill`
/// checks its buffer).
#[cfg(target_arch = "nvptx64")]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn zero_fill(dst: u64, words: u64) {
    use mem::grid;
    let step = grid::grid_dim_x() * grid::block_dim_x();
    let mut i = grid::block_x() * grid::block_dim_x() + grid::thread_x();
    while i < words {
        // SAFETY: i < words: inside the buffer (caller's contract), 16-byte aligned.
        unsafe { mem::st_v4(dst + i * 16, [0; 4]) };
        i += step;
    }
}

#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    unsafe extern "C" {
        // Never defined: its presence in the PTX fails the link (see the crate docs).
        fn __panic_path_left_in_kernel() -> !;
    }
    // SAFETY: unreachable in a correct build; if reachable, the link step rejects the module.
    unsafe { __panic_path_left_in_kernel() }
}
