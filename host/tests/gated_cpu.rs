//! CPU tests of the gated family's host side: every validation error, the aliasing rules,
//! the choice of vector path and the launch geometry. No GPU is needed: the `plan_*`
//! functions decide everything a launch does from the tensor descriptions.

mod common;

use common::assert_matches;

use ferrofuse::gated::{plan_gated_backward, plan_gated_forward};
use ferrofuse::{Activation, DType, Error, GridLimits, KernelId, MatDesc, VecMode};
use ferrofuse_common::{FlatEnds, GATED_SCALAR_BATCH, GridWalk};

const SMS: u32 = 132;

fn limits() -> GridLimits {
    GridLimits::uniform(SMS, 2)
}
const BASE: u64 = 0x7f00_0000_0000;

fn mat(addr: u64, dtype: DType, rows: usize, cols: usize) -> MatDesc {
    MatDesc::contiguous(addr, rows * cols, dtype, rows, cols)
}

/// `m` with rows `row_stride` elements apart (its buffer grown to match).
fn padded(m: MatDesc, row_stride: usize) -> MatDesc {
    MatDesc {
        row_stride,
        len: m.rows * row_stride,
        ..m
    }
}

/// Three disjoint, 256-byte aligned `rows x cols` matrices.
fn abc(dtype: DType, rows: usize, cols: usize) -> (MatDesc, MatDesc, MatDesc) {
    let bytes = ((rows * cols * dtype.size_bytes()) as u64).next_multiple_of(256);
    (
        mat(BASE, dtype, rows, cols),
        mat(BASE + bytes, dtype, rows, cols),
        mat(BASE + 2 * bytes, dtype, rows, cols),
    )
}

/// Five disjoint `rows x cols` matrices for a backward call (`a`, `b`, `dy`, `da`, `db`), the
/// gradients `3 << shift` and `4 << shift` bytes past the inputs' copies.
fn backward_mats(dtype: DType, rows: usize, cols: usize, shift: u32) -> [MatDesc; 5] {
    let (a, b, dy) = abc(dtype, rows, cols);
    let (da, db, _) = abc(dtype, rows, cols);
    [
        a,
        b,
        dy,
        MatDesc {
            addr: da.addr + (3 << shift),
            ..da
        },
        MatDesc {
            addr: db.addr + (4 << shift),
            ..db
        },
    ]
}

/// The forward's launch.
fn fwd(
    a: &MatDesc,
    b: &MatDesc,
    y: &MatDesc,
) -> Result<ferrofuse::Launch<ferrofuse_common::GatedFwdParams>, Error> {
    plan_gated_forward(Activation::Silu, a, b, y, &limits())
}

#[test]
fn valid_split_call_plans_the_vector_kernel() {
    let (a, b, y) = abc(DType::BF16, 64, 14336);
    let l = fwd(&a, &b, &y).unwrap();
    assert_eq!(l.kernel, KernelId::GatedFwd(DType::BF16, VecMode::V16));
    assert_eq!(
        (l.params.a, l.params.b, l.params.y),
        (a.addr, b.addr, y.addr)
    );
    assert_eq!((l.params.rows, l.params.cols), (64, 14336));
    assert_eq!(l.params.act, Activation::Silu as u32);
    // 64 * 14336 / 8 = 114688 vectors, 3.4 x the 2 x 132 x 128 resident threads: a grid of
    // exactly those threads (264 blocks), each taking 3 or 4 vectors.
    assert_eq!(l.grid, 264);
    assert_eq!(l.params.walk, GridWalk::new(14336 / 8, 264 * 128));
}

#[test]
fn grid_is_one_access_per_thread_up_to_the_resident_grid() {
    // 1 x 14336 bf16: 1792 vectors, one per thread, 14 blocks of 128.
    let (a, b, y) = abc(DType::BF16, 1, 14336);
    assert_eq!(fwd(&a, &b, &y).unwrap().grid, 14);
    // Realigned forward (rows off the grid, `y`'s padded: not one flat range): an access per
    // 16-byte vector of `y` that a row can touch, ceil(4097 * 2 / 16) + 1 = 514 per row, one
    // per thread.
    let (a, b, y) = abc(DType::BF16, 3, 4097);
    let l = fwd(&a, &b, &padded(y, 4104)).unwrap();
    assert_eq!(l.kernel, KernelId::GatedFwdRealignedEndsFirst(DType::BF16));
    assert_eq!(l.grid, (3 * 514usize).div_ceil(128) as u32);
    assert_eq!(l.params.walk, GridWalk::new(514, l.grid as u64 * 128));
    // Beyond four waves of the resident threads, one access per thread: 3000 x 11001 in rows
    // 8 apart (not dense, so not one flat range), 1377 accesses per row.
    let (a, b, y) = abc(DType::BF16, 3000, 11009);
    let (a, b, y) = [a, b, y].map(|m| MatDesc { cols: 11001, ..m }).into();
    let l = fwd(&a, &b, &y).unwrap();
    assert_eq!(l.kernel, KernelId::GatedFwdRealigned(DType::BF16));
    assert_eq!(l.grid, (3000 * 1377usize).div_ceil(128) as u32);
    assert_eq!(l.params.walk, GridWalk::new(1377, l.grid as u64 * 128));
    // The backward's scalar path (few accesses, see `realigned_backward_by_grid`): one element
    // per access, a thread per batch of them, at most one wave (132 x 2 x 128 threads); `dy`
    // padded, so not one flat range.
    let [a, b, dy, da, db] = backward_mats(DType::BF16, 3, 4097, 20);
    let dy = padded(dy, 4104);
    let p = plan_gated_backward(Activation::Silu, &a, &b, &dy, &da, &db, &limits()).unwrap();
    assert_eq!(p.kernel, KernelId::GatedBwd(DType::BF16, VecMode::Scalar));
    assert_eq!(
        p.grid,
        (3 * 4097usize).div_ceil(GATED_SCALAR_BATCH * 128) as u32
    );
    let (a, b, dy) = [a, b, dy]
        .map(|m| MatDesc {
            rows: 3000,
            len: 3000 * 11009,
            cols: 11001,
            row_stride: 11009,
            ..m
        })
        .into();
    let (da, db) = (
        MatDesc {
            addr: BASE + (1 << 30),
            ..a
        },
        MatDesc {
            addr: BASE + (2 << 30),
            ..a
        },
    );
    // The realigned backward: as the realigned forward, 1377 accesses per row, one per thread.
    let p = plan_gated_backward(Activation::Silu, &a, &b, &dy, &da, &db, &limits()).unwrap();
    assert_eq!(p.kernel, KernelId::GatedBwdRealigned(DType::BF16));
    assert_eq!(p.grid, (3000 * 1377usize).div_ceil(128) as u32);
    assert_eq!(p.params.walk, GridWalk::new(1377, p.grid as u64 * 128));
    // In place (`da` over `a`, its own buffer here), the scalar path at one wave.
    let a = MatDesc {
        addr: BASE + (3 << 30),
        ..a
    };
    let p = plan_gated_backward(Activation::Silu, &a, &b, &dy, &a, &db, &limits()).unwrap();
    assert_eq!(p.kernel, KernelId::GatedBwd(DType::BF16, VecMode::Scalar));
    assert_eq!(p.grid, 264);
    assert_eq!(p.params.walk, GridWalk::new(11001, 264 * 128));
    let (a, b, y) = abc(DType::F32, 0, 4096);
    assert_eq!(
        fwd(&a, &b, &y).unwrap().grid,
        0,
        "empty tensors launch nothing"
    );
}

/// For any size, the three regimes of `grid_for`: one access per thread up to the resident
/// threads R; a grid of exactly R threads up to 4R (each doing the same number of accesses to
/// within one); one access per thread beyond.
#[test]
fn grid_regimes() {
    let limits = limits();
    let resident =
        limits.resident_blocks(KernelId::GatedFwd(DType::F32, VecMode::V16)) as u64 * 128;
    for rows in [1usize, 2, 63, 64, 100, 1000, 4096, 9999, 16384, 100_000] {
        for cols in [4usize, 1024, 4096, 11008, 14336, 28672] {
            let (a, b, y) = abc(DType::F32, rows, cols);
            let l = fwd(&a, &b, &y).unwrap();
            let total = (rows * cols / 4) as u64;
            let threads = l.grid as u64 * 128;
            if total > resident && total <= 4 * resident {
                assert_eq!(threads, resident, "{rows}x{cols}");
            } else {
                assert_eq!(l.grid as u64, total.div_ceil(128), "{rows}x{cols}");
            }
            assert_eq!(l.params.walk, GridWalk::new(total / rows as u64, threads));
        }
    }
}

/// The kernel's division-free walk: the first row by Lemire's multiply-high, then steps with
/// one carry, against plain division.
#[test]
fn grid_walk_matches_division() {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..200_000 {
        let d = (next() >> (next() % 64)).clamp(1, u32::MAX as u64);
        let n = next() >> 32;
        assert_eq!(GridWalk::new(d, 1).row_of(n), n / d, "{n} / {d}");
    }
    for d in [1u64, 2, 3, 7, 1792, 1376, 4097, u32::MAX as u64] {
        for n in [0u64, 1, d - 1, d, d + 1, u32::MAX as u64] {
            assert_eq!(GridWalk::new(d, 1).row_of(n), n / d, "{n} / {d}");
        }
    }
    // Stepping: thread g of G visits g, g + G, ... as (row, col) pairs.
    for (per_row, threads, g) in [
        (1792u64, 33792u64, 5u64),
        (7, 3, 2),
        (1, 128, 127),
        (513, 512, 511),
    ] {
        let w = GridWalk::new(per_row, threads);
        let (mut row, mut col) = (w.row_of(g), g - w.row_of(g) * per_row);
        for k in 0..1000 {
            let i = g + k * threads;
            assert_eq!((row, col), (i / per_row, i % per_row));
            row += w.step_rows;
            col += w.step_cols;
            if col >= per_row {
                col -= per_row;
                row += 1;
            }
        }
    }
}

/// The realigned forward runs a warp's row ends first while the call's accesses, one thread
/// each, fit on the device at once, and on the entry of more threads per multiprocessor past
/// that.
#[test]
fn realigned_entry_by_grid() {
    // 528 accesses per row of 4216 (8432 / 16 + 1); 64 rows are 33792, the resident
    // threads (132 multiprocessors x 2 blocks x 128).
    let resident = SMS as usize * 2 * 128;
    for (rows, kernel) in [
        (1, KernelId::GatedFwdRealignedEndsFirst(DType::BF16)),
        (
            resident / 528,
            KernelId::GatedFwdRealignedEndsFirst(DType::BF16),
        ),
        (resident / 528 + 1, KernelId::GatedFwdRealigned(DType::BF16)),
        (4 * resident / 528, KernelId::GatedFwdRealigned(DType::BF16)),
    ] {
        let (a, b, mut y) = abc(DType::BF16, rows, 4216);
        y.addr += 2;
        let l = fwd(&a, &b, &y).unwrap();
        assert_eq!(l.kernel, kernel, "{rows} rows");
        assert!(
            l.grid as usize * 128 >= (rows * 528).min(resident),
            "{rows} rows"
        );
    }
}

/// A backward call off the grid takes the realigned kernel once its accesses, one thread each,
/// fill more than half the resident threads; fewer, or a gradient in place, the scalar path.
#[test]
fn realigned_backward_by_grid() {
    // 528 accesses per row of 4216 (8432 / 16 + 1); 32 rows are 16896, half the resident
    // threads (132 multiprocessors x 2 blocks x 128).
    let half = SMS as usize * 128;
    let scalar = KernelId::GatedBwd(DType::BF16, VecMode::Scalar);
    for (rows, kernel) in [
        (1, scalar),
        (half / 528, scalar),
        (half / 528 + 1, KernelId::GatedBwdRealigned(DType::BF16)),
        (16 * half / 528, KernelId::GatedBwdRealigned(DType::BF16)),
    ] {
        let [a, b, mut dy, da, db] = backward_mats(DType::BF16, rows, 4216, 30);
        dy.addr += 2;
        let p = plan_gated_backward(Activation::Silu, &a, &b, &dy, &da, &db, &limits()).unwrap();
        assert_eq!(p.kernel, kernel, "{rows} rows");
        // In place (`db` over `b`): the scalar path at any size.
        let p = plan_gated_backward(Activation::Silu, &a, &b, &dy, &da, &b, &limits()).unwrap();
        assert_eq!(p.kernel, scalar, "{rows} rows, in place");
    }
}

/// Forward calls off the 16-byte grid that are not one flat range run the realigned kernel.
#[test]
fn realigned_path_when_vectors_do_not_fit() {
    // Interleaved `[gate | up]` of odd I: the two halves of a row at different offsets.
    let x = mat(BASE, DType::BF16, 64, 2 * 4097);
    let (gate, up) = x.interleaved_halves().unwrap();
    let y = mat(BASE + (1 << 30), DType::BF16, 64, 4097);
    assert_eq!(
        fwd(&gate, &up, &y).unwrap().kernel,
        KernelId::GatedFwdRealignedEndsFirst(DType::BF16)
    );
    // Row length not a multiple of the vector (`y` padded: not one flat range).
    let (a, b, y) = abc(DType::BF16, 5, 4097);
    assert_eq!(
        fwd(&a, &b, &padded(y, 4104)).unwrap().kernel,
        KernelId::GatedFwdRealignedEndsFirst(DType::BF16)
    );
    // An address aligned to the element but not to 16 bytes.
    let (a, b, mut y) = abc(DType::F16, 4, 64);
    y.addr += 2;
    assert_eq!(
        fwd(&a, &b, &y).unwrap().kernel,
        KernelId::GatedFwdRealignedEndsFirst(DType::F16)
    );
    // A row stride that breaks the alignment of later rows.
    let (mut a, b, y) = abc(DType::F32, 4, 64);
    a.row_stride = 66;
    a.len = 4 * 66;
    assert_eq!(
        fwd(&a, &b, &y).unwrap().kernel,
        KernelId::GatedFwdRealignedEndsFirst(DType::F32)
    );
    // One row: its stride does not matter.
    let (mut a, b, y) = abc(DType::F32, 1, 64);
    a.row_stride = 65;
    assert_eq!(
        fwd(&a, &b, &y).unwrap().kernel,
        KernelId::GatedFwd(DType::F32, VecMode::V16)
    );
}

#[test]
fn interleaved_halves_are_read_through_the_row_stride() {
    // A [rows, 2I] view padded to a row stride of 2I + 64 elements.
    let (rows, inter) = (16, 11008);
    let x = MatDesc {
        row_stride: 2 * inter + 64,
        len: rows * (2 * inter + 64),
        ..mat(BASE, DType::BF16, rows, 2 * inter)
    };
    let (gate, up) = x.interleaved_halves().unwrap();
    assert_eq!((gate.addr, up.addr), (BASE, BASE + (inter * 2) as u64));
    assert_eq!(
        (gate.cols, up.cols, gate.row_stride, up.row_stride),
        (inter, inter, 2 * inter + 64, 2 * inter + 64)
    );
    assert!(
        !gate.overlaps(&up),
        "the halves of one buffer share no element"
    );
    let y = mat(BASE + (1 << 30), DType::BF16, rows, inter);
    let l = fwd(&gate, &up, &y).unwrap();
    assert_eq!(
        (l.params.a_stride, l.params.b_stride, l.params.y_stride),
        (2 * inter as u64 + 64, 2 * inter as u64 + 64, inter as u64)
    );
    assert_eq!(l.kernel, KernelId::GatedFwd(DType::BF16, VecMode::V16));
    // In place over the up half is allowed; over the gate half it is not.
    assert!(fwd(&gate, &up, &up).is_ok());
    assert_matches!(
        fwd(&gate, &up, &gate),
        Err(Error::Aliasing {
            output: "y",
            other: "a"
        })
    );
}

#[test]
fn odd_interleaved_width_is_rejected() {
    let x = mat(BASE, DType::F16, 4, 2 * 100 + 1);
    assert_eq!(
        x.interleaved_halves(),
        Err(Error::OddInterleavedWidth { cols: 201 })
    );
}

/// An interleaved input whose up half would start past the end of the address space (a huge
/// last stride, or an address at its very top) is too large, not an overflow.
#[test]
fn interleaved_halves_past_the_address_space_are_too_large() {
    let strided = MatDesc {
        col_stride: usize::MAX,
        ..mat(BASE, DType::F16, 4, 2)
    };
    let top = mat(u64::MAX - 1, DType::F16, 1, 4);
    for x in [strided, top] {
        assert_matches!(x.interleaved_halves(), Err(Error::TooLarge { .. }));
    }
}

#[test]
fn shape_mismatch_names_the_tensor_and_shapes() {
    let (a, b, _) = abc(DType::F32, 8, 64);
    let y = mat(BASE + (1 << 30), DType::F32, 8, 32);
    let e = fwd(&a, &b, &y).unwrap_err();
    assert_eq!(
        e,
        Error::ShapeMismatch {
            tensor: "y",
            expected: (8, 64),
            got: (8, 32)
        }
    );
    assert!(
        e.to_string().contains("8x32") && e.to_string().contains("8x64"),
        "{e}"
    );
    let b = mat(BASE + (1 << 30), DType::F32, 7, 64);
    assert_eq!(
        fwd(&a, &b, &a).unwrap_err(),
        Error::ShapeMismatch {
            tensor: "b",
            expected: (8, 64),
            got: (7, 64)
        }
    );
}

#[test]
fn dtype_mismatch_is_rejected() {
    let (a, mut b, y) = abc(DType::BF16, 8, 64);
    b.dtype = DType::F16;
    assert_eq!(
        fwd(&a, &b, &y).unwrap_err(),
        Error::DTypeMismatch {
            tensor: "b",
            expected: DType::BF16,
            got: DType::F16
        }
    );
}

#[test]
fn non_unit_last_stride_is_rejected() {
    let (a, b, mut y) = abc(DType::F32, 8, 64);
    y.col_stride = 2;
    y.len *= 2;
    assert_eq!(
        fwd(&a, &b, &y).unwrap_err(),
        Error::NonUnitLastStride {
            tensor: "y",
            stride: 2
        }
    );
}

#[test]
fn overlapping_rows_are_rejected() {
    let (mut a, b, y) = abc(DType::F32, 8, 64);
    a.row_stride = 32;
    assert_eq!(
        fwd(&a, &b, &y).unwrap_err(),
        Error::RowStrideTooSmall {
            tensor: "a",
            row_stride: 32,
            cols: 64
        }
    );
}

#[test]
fn buffer_too_small_is_rejected() {
    let (a, mut b, y) = abc(DType::BF16, 8, 64);
    b.len = 8 * 64 - 1;
    assert_eq!(
        fwd(&a, &b, &y).unwrap_err(),
        Error::BufferTooSmall {
            tensor: "b",
            needed: 512,
            len: 511
        }
    );
    // Strided: the last row ends at (rows - 1) * stride + cols.
    let (mut a, b, y) = abc(DType::BF16, 8, 64);
    a.row_stride = 100;
    a.len = 7 * 100 + 63;
    assert_eq!(
        fwd(&a, &b, &y).unwrap_err(),
        Error::BufferTooSmall {
            tensor: "a",
            needed: 764,
            len: 763
        }
    );
}

#[test]
fn misaligned_pointer_is_rejected() {
    let (mut a, b, y) = abc(DType::F32, 8, 64);
    a.addr += 2;
    assert_eq!(
        fwd(&a, &b, &y).unwrap_err(),
        Error::Misaligned {
            tensor: "a",
            addr: BASE + 2,
            align: 4
        }
    );
    let (a, b, mut y) = abc(DType::BF16, 8, 64);
    y.addr += 1;
    assert_matches!(
        fwd(&a, &b, &y),
        Err(Error::Misaligned {
            tensor: "y",
            align: 2,
            ..
        })
    );
}

#[test]
fn forbidden_aliasing_is_rejected() {
    let (a, b, _) = abc(DType::BF16, 8, 64);
    // y exactly a.
    assert_eq!(
        fwd(&a, &b, &a).unwrap_err(),
        Error::Aliasing {
            output: "y",
            other: "a"
        }
    );
    // y shifted by one element from b: overlaps without being the same place.
    let y = MatDesc {
        addr: b.addr + 2,
        ..b
    };
    assert_matches!(
        fwd(&a, &b, &y),
        Err(Error::Aliasing {
            output: "y",
            other: "b"
        })
    );
    // y exactly b, but with another row stride: not the same place.
    let y = MatDesc {
        rows: 4,
        row_stride: 128,
        ..b
    };
    let b4 = MatDesc { rows: 4, ..b };
    let a4 = MatDesc { rows: 4, ..a };
    assert_matches!(
        fwd(&a4, &b4, &y),
        Err(Error::Aliasing {
            output: "y",
            other: "b"
        })
    );
    // In place over b is allowed.
    assert!(fwd(&a, &b, &b).is_ok());
}

#[test]
fn backward_aliasing_rules() {
    let dt = DType::F32;
    let (a, b, dy) = abc(dt, 8, 64);
    let (da, db, _) = abc(dt, 8, 64);
    let (da, db) = (
        MatDesc {
            addr: da.addr + (3 << 20),
            ..da
        },
        MatDesc {
            addr: db.addr + (3 << 20),
            ..db
        },
    );
    let plan = |da: &MatDesc, db: &MatDesc| {
        plan_gated_backward(Activation::GeluTanh, &a, &b, &dy, da, db, &limits())
    };
    let l = plan(&da, &db).unwrap();
    assert_eq!(l.kernel, KernelId::GatedBwd(dt, VecMode::V16));
    assert!(plan(&a, &b).is_ok(), "da over a, db over b");
    assert!(plan(&dy, &b).is_ok(), "da over dy");
    assert!(plan(&da, &dy).is_ok(), "db over dy");
    assert_matches!(
        plan(&dy, &dy),
        Err(Error::Aliasing {
            output: "da",
            other: "db"
        })
    );
    assert_matches!(
        plan(&b, &db),
        Err(Error::Aliasing {
            output: "da",
            other: "b"
        })
    );
    assert_matches!(
        plan(&da, &a),
        Err(Error::Aliasing {
            output: "db",
            other: "a"
        })
    );
    // Interleaved gradients [da | db] in one buffer do not overlap.
    let dx = mat(BASE + (1 << 30), dt, 8, 128);
    let (dga, dgb) = dx.interleaved_halves().unwrap();
    let l = plan_gated_backward(Activation::Silu, &a, &b, &dy, &dga, &dgb, &limits()).unwrap();
    assert_eq!(
        (
            l.params.da_stride,
            l.params.db_stride,
            l.params.db - l.params.da
        ),
        (128, 128, 64 * 4)
    );
}

#[test]
fn backward_validates_every_operand() {
    let dt = DType::F16;
    let (a, b, dy) = abc(dt, 8, 64);
    let (da, _, _) = abc(dt, 8, 64);
    let da = MatDesc {
        addr: da.addr + (3 << 20),
        ..da
    };
    let db = MatDesc {
        addr: da.addr + (1 << 20),
        ..da
    };
    let bad_dy = MatDesc {
        rows: 9,
        len: 9 * 64,
        ..dy
    };
    let e =
        plan_gated_backward(Activation::Relu, &a, &b, &bad_dy, &da, &db, &limits()).unwrap_err();
    assert_eq!(
        e,
        Error::ShapeMismatch {
            tensor: "dy",
            expected: (8, 64),
            got: (9, 64)
        }
    );
    let bad_db = MatDesc {
        dtype: DType::BF16,
        ..db
    };
    let e =
        plan_gated_backward(Activation::Relu, &a, &b, &dy, &da, &bad_db, &limits()).unwrap_err();
    assert_eq!(
        e,
        Error::DTypeMismatch {
            tensor: "db",
            expected: DType::F16,
            got: DType::BF16
        }
    );
}

/// The byte addresses of an f32 matrix's elements, for brute-force overlap checks.
fn elems(m: &MatDesc) -> Vec<u64> {
    let mut v = Vec::new();
    for r in 0..m.rows {
        for c in 0..m.cols {
            v.push(m.addr + ((r * m.row_stride + c) * 4) as u64);
        }
    }
    v
}

/// `MatDesc::overlaps` against brute force on small strided matrices.
#[test]
fn overlap_test_is_exact_for_equal_strides() {
    let mut checked = 0;
    for stride in 1..7usize {
        for (c1, c2) in (1..=stride).flat_map(|c1| (1..=stride).map(move |c2| (c1, c2))) {
            for (r1, r2) in [(1, 1), (1, 3), (3, 1), (2, 2), (4, 3)] {
                for off in -30i64..30 {
                    let m1 = MatDesc {
                        row_stride: stride,
                        len: 1000,
                        ..mat(4000, DType::F32, r1, c1)
                    };
                    let m2 = MatDesc {
                        addr: (4000 + off * 4) as u64,
                        row_stride: stride,
                        len: 1000,
                        ..mat(0, DType::F32, r2, c2)
                    };
                    let e1 = elems(&m1);
                    let truth = elems(&m2).iter().any(|x| e1.contains(x));
                    assert_eq!(m1.overlaps(&m2), truth, "{m1:?} vs {m2:?}");
                    assert_eq!(m2.overlaps(&m1), truth, "{m2:?} vs {m1:?}");
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 10_000);
}

/// A one-row matrix may carry any row stride (validation ignores it), shorter than its row
/// too: `MatDesc::overlaps` still sees every shared element, exactly between one-row
/// matrices, at worst conservatively against a taller one.
#[test]
fn overlap_test_sees_one_row_matrices_with_short_strides() {
    let mut checked = 0;
    for stride in 0..5usize {
        for (c1, c2) in (1..10).flat_map(|c1| (1..10).map(move |c2| (c1, c2))) {
            // The taller one needs rows that do not overlap to be valid.
            for r2 in [1, 3].into_iter().filter(|&r2| r2 == 1 || stride >= c2) {
                for off in -30i64..30 {
                    let m1 = MatDesc {
                        row_stride: stride,
                        len: 1000,
                        ..mat(4000, DType::F32, 1, c1)
                    };
                    let m2 = MatDesc {
                        addr: (4000 + off * 4) as u64,
                        row_stride: stride,
                        len: 1000,
                        ..mat(0, DType::F32, r2, c2)
                    };
                    let e1 = elems(&m1);
                    let truth = elems(&m2).iter().any(|x| e1.contains(x));
                    for (p, q) in [(&m1, &m2), (&m2, &m1)] {
                        if truth || r2 == 1 {
                            assert_eq!(p.overlaps(q), truth, "{p:?} vs {q:?}");
                        }
                    }
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 10_000);
}

/// An operand whose extent in bytes passes the end of the 64-bit address space is too large,
/// not an overflow in the checks after it: `usize::MAX` f32 rows of one element (their count
/// fits a `usize`, their bytes do not), and four f32s from 8 bytes below 2^64.
#[test]
fn extents_past_the_address_space_are_too_large() {
    let rows = usize::MAX;
    let huge = MatDesc::contiguous(BASE, rows, DType::F32, rows, 1);
    let top = mat(u64::MAX - 7, DType::F32, 1, 4);
    let (_, b, y) = abc(DType::F32, 1, 4);
    for (a, b, y) in [(huge, huge, huge), (top, b, y), (b, top, y), (b, y, top)] {
        assert_matches!(fwd(&a, &b, &y), Err(Error::TooLarge { .. }));
    }
}

#[test]
fn errors_read_as_sentences() {
    let e = Error::BufferTooSmall {
        tensor: "b",
        needed: 512,
        len: 511,
    };
    assert_eq!(
        e.to_string(),
        "b buffer too small: its shape and strides reach 512 elements, the buffer has 511"
    );
    let e = Error::Aliasing {
        output: "y",
        other: "a",
    };
    assert!(e.to_string().starts_with("y overlaps a"));
}

#[test]
fn rows_of_2_pow_32_elements_are_too_large() {
    let cols = 1usize << 32;
    let a = MatDesc::contiguous(BASE, cols, DType::F32, 1, cols);
    let b = MatDesc {
        addr: BASE + (1 << 40),
        ..a
    };
    let y = MatDesc {
        addr: BASE + (2 << 40),
        ..a
    };
    assert_eq!(
        fwd(&a, &b, &y).unwrap_err(),
        Error::TooLarge {
            what: "row length (cols)",
            value: cols
        }
    );
}

/// The elements a flat launch's ragged ends take, thread by thread (offsets from the body's
/// first element), each with whether its thread also has a vector access.
fn end_elements(ends: FlatEnds, grid: u32, accesses: u64, lanes: u64) -> Vec<(i64, bool)> {
    let threads = grid as u64 * 128;
    (0..threads)
        .filter_map(|g| {
            ends.element(g, threads, accesses * lanes)
                .map(|e| (e, g < accesses))
        })
        .collect()
}

/// Each ragged end element of a flat range goes to exactly one thread, the grid's last
/// `head + tail` in order, head first; no other thread takes one.
#[test]
fn flat_ends_go_to_the_grids_last_threads_once_each() {
    for (head, tail) in (0..8u16).flat_map(|h| (0..8u16).map(move |t| (h, t))) {
        for threads in [32u64, 128, 4096] {
            let (ends, body) = (FlatEnds { head, tail }, 4000u64);
            let taken: Vec<(u64, i64)> = (0..threads)
                .filter_map(|g| ends.element(g, threads, body).map(|e| (g, e)))
                .collect();
            let first = threads - (head + tail) as u64;
            let expected: Vec<(u64, i64)> = (-(head as i64)..0)
                .chain(body as i64..(body + tail as u64) as i64)
                .enumerate()
                .map(|(k, e)| (first + k as u64, e))
                .collect();
            assert_eq!(taken, expected, "{ends:?}, {threads} threads");
        }
    }
}

/// Dense operands at one offset from a 16-byte boundary, with rows off the vector grid: one
/// flat range, one launch of the vector kernel over the body (from the first boundary), the
/// ragged head before it and tail after it taken by the grid's last threads, one element each
/// (on the vector entry that takes them; the plain one where there are none).
#[test]
fn dense_rows_off_the_vector_grid_run_as_one_flat_range() {
    let dt = DType::BF16;
    let (rows, cols) = (999, 4097); // 4 092 903 elements
    let n = rows * cols;
    let (a, b, y) = abc(dt, rows, cols);
    let p = fwd(&a, &b, &y).unwrap();
    assert_eq!(p.kernel, KernelId::GatedFwdEnds(dt));
    assert_eq!((p.params.rows, p.params.cols), (1, (n / 8 * 8) as u64));
    let tail = (n % 8) as u16;
    assert_eq!(p.params.ends, FlatEnds { head: 0, tail });
    let body = (n / 8 * 8) as i64;
    let taken: Vec<i64> = end_elements(p.params.ends, p.grid, n as u64 / 8, 8)
        .into_iter()
        .map(|(e, _)| e)
        .collect();
    assert_eq!(taken, (body..n as i64).collect::<Vec<_>>());
    // Every operand one element past a boundary: a head of 7 elements below the body.
    let off = |m: MatDesc| MatDesc {
        addr: m.addr + 2,
        len: m.len - 1,
        ..m
    };
    let (a, b, y) = (off(mat(a.addr, dt, rows, cols + 1)), off(b), off(y));
    let (a, b, y) = [a, b, y]
        .map(|m| MatDesc {
            len: n,
            cols,
            rows,
            row_stride: cols,
            ..m
        })
        .into();
    let p = fwd(&a, &b, &y).unwrap();
    let body = ((n - 7) / 8 * 8) as u64;
    assert_eq!(
        (p.params.a, p.params.b, p.params.y),
        (a.addr + 14, b.addr + 14, y.addr + 14)
    );
    assert_eq!(p.params.cols, body);
    let ends = FlatEnds {
        head: 7,
        tail: (n - 7 - body as usize) as u16,
    };
    assert_eq!(p.params.ends, ends);
    let taken: Vec<i64> = end_elements(ends, p.grid, body / 8, 8)
        .into_iter()
        .map(|(e, _)| e)
        .collect();
    let expected: Vec<i64> = (-7..0).chain(body as i64..(n - 7) as i64).collect();
    assert_eq!(taken, expected, "every element exactly once");
    // Operands at different offsets: the realigned kernel, no ends.
    let b2 = MatDesc {
        addr: b.addr + 2,
        ..b
    };
    let p = fwd(&a, &b2, &y).unwrap();
    assert_eq!(p.kernel, KernelId::GatedFwdRealigned(dt));
    assert_eq!(p.params.ends, FlatEnds::default());
    // A small call: a thread per vector, and a warp more of its own for the three ends (so
    // their loads do not wait for a warp's vector accesses).
    let (a, b, y) = abc(dt, 3, 4097);
    let p = fwd(&a, &b, &y).unwrap();
    assert_eq!(p.kernel, KernelId::GatedFwdEnds(dt));
    assert_eq!(p.grid as usize, (3 * 4097 / 8 + 32usize).div_ceil(128));
    let taken = end_elements(p.params.ends, p.grid, 3 * 4097 / 8, 8);
    assert_eq!(taken.len(), 3);
    assert!(taken.iter().all(|&(_, vector)| !vector));
    // Fewer elements than a vector past the boundary: no flat range.
    let (a, b, y) = [a, b, y]
        .map(|m| MatDesc {
            addr: m.addr + 2,
            rows: 1,
            cols: 13,
            ..m
        })
        .into();
    assert_eq!(
        fwd(&a, &b, &y).unwrap().kernel,
        KernelId::GatedFwdRealignedEndsFirst(dt)
    );
    // The backward splits the same way.
    let [a, b, dy, da, db] = backward_mats(dt, rows, cols, 24);
    let p = plan_gated_backward(Activation::Silu, &a, &b, &dy, &da, &db, &limits()).unwrap();
    assert_eq!(p.kernel, KernelId::GatedBwdEnds(dt));
    assert_eq!(p.params.ends, FlatEnds { head: 0, tail });
    // A flat range without ends (the elements a whole number of vectors) runs the plain
    // vector entry.
    let (a, b, y) = abc(dt, 8, 4097);
    let p = fwd(&a, &b, &y).unwrap();
    assert_eq!(p.kernel, KernelId::GatedFwd(dt, VecMode::V16));
    assert_eq!(
        (p.params.cols, p.params.ends),
        (8 * 4097, FlatEnds::default())
    );
}
