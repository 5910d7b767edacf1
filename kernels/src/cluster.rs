//! Thread-block clusters (sm_90): the block's rank and the cluster's size, the cluster
//! barrier, reads and writes of another block's shared memory. On older archs the entries
//! that use them exist but trap at the barrier: the host plans cluster launches only for
//! modules with clusters.

#[cfg(not(ferrofuse_pdl))]
pub use none::*;
#[cfg(ferrofuse_pdl)]
pub use sm90::*;

#[cfg(ferrofuse_pdl)]
mod sm90 {
    unsafe extern "C" {
        // LLVM intrinsics, not `asm!`: they are convergent, and the barriers order memory
        // as far as LLVM knows (no load or store moves across them).
        #[link_name = "llvm.nvvm.read.ptx.sreg.cluster.ctarank"]
        fn ctarank() -> u32;
        #[link_name = "llvm.nvvm.read.ptx.sreg.cluster.nctarank"]
        fn nctarank() -> u32;
        #[link_name = "llvm.nvvm.barrier.cluster.arrive"]
        fn barrier_arrive();
        #[link_name = "llvm.nvvm.barrier.cluster.wait"]
        fn barrier_wait();
        #[link_name = "llvm.nvvm.mapa"]
        fn mapa(p: *const f32, rank: u32) -> *const f32;
    }

    /// This block's rank in its cluster.
    #[inline(always)]
    pub fn rank() -> u32 {
        // SAFETY: reading a special register.
        unsafe { ctarank() }
    }

    /// Blocks in this block's cluster.
    #[inline(always)]
    pub fn size() -> u32 {
        // SAFETY: reading a special register.
        unsafe { nctarank() }
    }

    /// Arrives at the cluster barrier (release: this thread's writes before it are visible to
    /// the cluster's threads after their wait).
    ///
    /// # Safety
    /// Every thread of every block of the cluster arrives, then waits, the same number of
    /// times.
    #[inline(always)]
    pub unsafe fn arrive() {
        // SAFETY: caller's contract.
        unsafe { barrier_arrive() }
    }

    /// Waits for every thread of the cluster to arrive (acquire).
    ///
    /// # Safety
    /// As for [`arrive`]; after this thread's arrive.
    #[inline(always)]
    pub unsafe fn wait() {
        // SAFETY: caller's contract.
        unsafe { barrier_wait() }
    }

    /// The f32 at `local` (this block's shared memory) in the block of rank `rank`.
    ///
    /// # Safety
    /// `local` is in this block's shared memory, `rank` < [`size`], and that block has not
    /// exited (the cluster protocol in the module docs).
    #[inline(always)]
    pub unsafe fn read_remote(local: *const f32, rank: u32) -> f32 {
        // SAFETY: caller's contract; `mapa` gives the generic address of the same offset in
        // that block's shared memory.
        unsafe { *mapa(local, rank) }
    }

    /// Writes `v` to the f32 at `local`'s offset in the shared memory of the block of rank
    /// `rank`; the write is visible to that block's threads after their next cluster wait
    /// that follows this thread's next arrive.
    ///
    /// # Safety
    /// As for [`read_remote`], and no thread of that block reads or writes that f32 between
    /// the barrier before this write and the one after it.
    #[inline(always)]
    pub unsafe fn write_remote(local: *mut f32, rank: u32, v: f32) {
        // SAFETY: caller's contract; as in `read_remote`.
        unsafe { *mapa(local.cast_const(), rank).cast_mut() = v }
    }
}

/// Archs without clusters: the cluster entries are never launched there (the host plans them
/// only for modules with clusters), so a barrier aborts the kernel.
#[cfg(not(ferrofuse_pdl))]
mod none {
    #[inline(always)]
    pub fn rank() -> u32 {
        0
    }

    #[inline(always)]
    pub fn size() -> u32 {
        1
    }

    /// # Safety
    /// None needed: it aborts the kernel.
    #[inline(always)]
    pub unsafe fn arrive() {
        // SAFETY: `trap` only aborts the kernel.
        unsafe { core::arch::asm!("trap;", options(nostack)) };
    }

    /// # Safety
    /// As for [`arrive`].
    #[inline(always)]
    pub unsafe fn wait() {
        // SAFETY: as above.
        unsafe { arrive() };
    }

    /// # Safety
    /// `local` is in this block's shared memory.
    #[inline(always)]
    pub unsafe fn read_remote(local: *const f32, _rank: u32) -> f32 {
        // SAFETY: caller's contract.
        unsafe { *local }
    }

    /// # Safety
    /// `local` is in this block's shared memory.
    #[inline(always)]
    pub unsafe fn write_remote(local: *mut f32, _rank: u32, v: f32) {
        // SAFETY: caller's contract.
        unsafe { *local = v }
    }
}
