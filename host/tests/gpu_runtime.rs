//! Runtime entry points besides the two op families: the choice of prebuilt PTX by compute
//! capability, an older arch's module loaded beside it, `Kernels::zero_fill`, the benchmark's L2
//! flush (it must write every byte of its buffer and nothing past it, and reject a length that
//! is not a multiple of 16 bytes before launching), and the empty kernel.
//!
//! Without a CUDA driver the tests print why they skip.

mod common;

use std::sync::Arc;

use common::*;
use ferrofuse::{Error, Kernels, LoadedCode, PtxModule};

#[test]
fn loads_the_ptx_of_the_device_arch() {
    let Some((k, _)) = gpu("loads_the_ptx_of_the_device_arch") else {
        return;
    };
    let (major, minor) = k.context().compute_capability().unwrap();
    let own = if major >= 9 { "sm_90" } else { "sm_80" };
    let expected = module_override().map_or(own, |m| m.arch);
    assert_eq!(k.ptx().arch, expected, "compute capability {major}.{minor}");
    if module_override().is_none() {
        assert_eq!(
            PtxModule::for_compute_capability(major, minor),
            Some(k.ptx())
        );
    }
    // Programmatic dependent launch, clusters and bulk copies are on exactly where the sm_90
    // code runs.
    let sm90 = expected == "sm_90";
    assert_eq!(k.programmatic_launch(), sm90);
    assert_eq!(k.limits().clusters, sm90);
    if !sm90 {
        assert!(!k.limits().wide_clusters && !k.limits().streamed_rows);
    }
}

/// The sm_80 module loads beside the device's own on a newer GPU (from its PTX, as its own
/// handle, once per context), the device's own module asked for by name is the usual handle,
/// and a module newer than the device is refused with a typed error.
#[test]
fn an_older_module_loads_beside_and_a_newer_one_is_refused() {
    let Some((k, _)) = gpu("an_older_module_loads_beside_and_a_newer_one_is_refused") else {
        return;
    };
    let (major, minor) = k.context().compute_capability().unwrap();
    let [sm90, sm80] = &ferrofuse::PTX_MODULES;
    if major < 9 {
        let e = Kernels::for_context_with_module(k.context(), sm90).unwrap_err();
        assert_matches!(e, Error::ModuleNeedsNewerDevice { arch: "sm_90", .. });
        return;
    }
    let old = Kernels::for_context_with_module(k.context(), sm80).unwrap();
    assert_eq!(old.ptx(), sm80);
    assert_eq!(
        old.loaded_code(),
        LoadedCode::Ptx,
        "sm_80 SASS does not run on {major}.{minor}"
    );
    assert!(!old.programmatic_launch() && !old.limits().clusters);
    let again = Kernels::for_context_with_module(k.context(), sm80).unwrap();
    assert!(Arc::ptr_eq(&old, &again), "loaded once per context");
    let own = Kernels::for_context(k.context()).unwrap();
    assert_eq!(own.ptx(), sm90);
    assert!(!Arc::ptr_eq(&own, &old));
    // Asked for by name, the device's own module is the same handle.
    let named = Kernels::for_context_with_module(k.context(), sm90).unwrap();
    assert!(Arc::ptr_eq(&own, &named));
}

#[test]
fn zero_fill_writes_exactly_its_buffer() {
    let Some((k, s)) = gpu("zero_fill_writes_exactly_its_buffer") else {
        return;
    };
    // Lengths around the block size (256 threads x 16 bytes) and one past the grid cap.
    for words in [1usize, 255, 256, 257, 4096 + 3, 65_535 * 256 + 17] {
        let len = words * 16;
        // One buffer with a poisoned guard region after the part that is zeroed.
        let mut buf = s.clone_htod(&vec![0xA5u8; len + 4096]).unwrap();
        k.zero_fill(&s, &mut buf.slice_mut(0..len)).unwrap();
        let back = s.clone_dtoh(&buf).unwrap();
        let first_bad = back[..len].iter().position(|&b| b != 0);
        assert_eq!(first_bad, None, "{words} words: a byte was not zeroed");
        assert!(
            back[len..].iter().all(|&b| b == 0xA5),
            "{words} words: the guard changed"
        );
    }
}

#[test]
fn zero_fill_rejects_a_partial_word() {
    let Some((k, s)) = gpu("zero_fill_rejects_a_partial_word") else {
        return;
    };
    let mut buf = s.clone_htod(&vec![7u8; 33]).unwrap();
    let e = k.zero_fill(&s, &mut buf).unwrap_err();
    assert_matches!(e, Error::InvalidArgument { .. });
    assert!(s.clone_dtoh(&buf).unwrap().iter().all(|&b| b == 7));
}

#[test]
fn empty_kernel_launches() {
    let Some((k, s)) = gpu("empty_kernel_launches") else {
        return;
    };
    k.launch_empty(&s).unwrap();
    s.synchronize().unwrap();
}
