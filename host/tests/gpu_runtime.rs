//! Runtime entry points besides the two op families: the choice of prebuilt PTX by compute
//! capability, `Kernels::zero_fill`, the benchmark's L2
//! flush (it must write every byte of its buffer and nothing past it, and reject a length that
//! is not a multiple of 16 bytes before launching), and the empty kernel.
//!
//! Without a CUDA driver the tests print why they skip.

mod common;

use common::*;
use ferrofuse::{Error, PtxModule};

#[test]
fn loads_the_ptx_of_the_device_arch() {
    let Some((k, _)) = gpu("loads_the_ptx_of_the_device_arch") else {
        return;
    };
    let (major, minor) = k.context().compute_capability().unwrap();
    let expected = if major >= 9 { "sm_90" } else { "sm_80" };
    assert_eq!(k.ptx().arch, expected, "compute capability {major}.{minor}");
    assert_eq!(
        PtxModule::for_compute_capability(major, minor),
        Some(k.ptx())
    );
    // Programmatic dependent launch is on exactly where the sm_90 code runs.
    assert_eq!(k.programmatic_launch(), major >= 9);
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
