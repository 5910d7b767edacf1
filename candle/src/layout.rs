//! candle [`Layout`] → the 2-D matrix ferrofuse reads ([`ferrofuse::MatDesc`]), on the CPU.
//!
//! ferrofuse reads every operand as `rows x cols` with a unit last stride and one row stride.
//! A candle layout fits that when its last dimension has stride 1 (or length 1) and its
//! leading dimensions collapse into one row index: going outwards, each leading dimension's
//! stride is the next inner one's stride times its length (dimensions of length 1 are
//! skipped, their stride means nothing). The row stride is then the innermost leading
//! dimension's stride. So `narrow`/`chunk` on the last dimension (a row stride larger than
//! the row), `narrow`/`get`/`i` on leading dimensions (a start offset) and any number of batch
//! dimensions are read in place; a transposed, broadcast or otherwise permuted layout is not
//! (see [`Strided::of`]).

use candle_core::Layout;
use ferrofuse::{DType, MatDesc};

/// A candle layout read as one 2-D matrix: element `[r, c]` is at
/// `start + r * row_stride + c` (elements of the storage).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strided {
    pub start: usize,
    pub rows: usize,
    pub cols: usize,
    pub row_stride: usize,
}

impl Strided {
    /// The layout as a matrix, or why it cannot be one without a copy.
    ///
    /// A tensor of rank 0 is `1 x 1`; rank 1 is one row. The row stride of a single row is its
    /// length. Zero or overlapping row strides (a broadcast) are refused: every row must be
    /// its own memory.
    pub fn of(layout: &Layout) -> Result<Self, String> {
        let dims = layout.dims();
        let stride = layout.stride();
        let start = layout.start_offset();
        let Some((&cols, leading)) = dims.split_last() else {
            return Ok(Self {
                start,
                rows: 1,
                cols: 1,
                row_stride: 1,
            });
        };
        let col_stride = stride[dims.len() - 1];
        if cols > 1 && col_stride != 1 {
            return Err(format!(
                "the last dimension has stride {col_stride}, not 1 (dims {dims:?}, strides \
                 {stride:?})"
            ));
        }
        let rows: usize = leading.iter().product();
        if rows <= 1 || cols == 0 {
            return Ok(Self {
                start,
                rows,
                cols,
                row_stride: cols,
            });
        }
        // Leading dimensions from the innermost out, length-1 ones skipped.
        let mut row_stride = None;
        let mut expected = 0;
        for (&d, &s) in leading.iter().zip(stride).rev() {
            if d == 1 {
                continue;
            }
            match row_stride {
                None => row_stride = Some(s),
                Some(_) if s == expected => {}
                Some(_) => {
                    return Err(format!(
                        "the leading dimensions do not collapse into one row index (dims \
                         {dims:?}, strides {stride:?})"
                    ));
                }
            }
            expected = s * d;
        }
        let row_stride = row_stride.unwrap_or(cols);
        if row_stride < cols {
            return Err(format!(
                "rows overlap: row stride {row_stride} is less than the row length {cols} \
                 (dims {dims:?}, strides {stride:?})"
            ));
        }
        Ok(Self {
            start,
            rows,
            cols,
            row_stride,
        })
    }

    /// The matrix in a device buffer of `len` elements of `dtype` at `base`.
    pub fn desc(&self, base: u64, len: usize, dtype: DType) -> MatDesc {
        MatDesc {
            addr: base + (self.start * dtype.size_bytes()) as u64,
            len: len.saturating_sub(self.start),
            dtype,
            rows: self.rows,
            cols: self.cols,
            row_stride: self.row_stride,
            col_stride: 1,
        }
    }
}

/// Whether ferrofuse reads `layout` in place (else the input is copied once, see the crate
/// docs).
pub fn readable(layout: &Layout) -> bool {
    Strided::of(layout).is_ok()
}

/// Sub-tensor `i` of a layout `[n, ...]` (what `tensor.get(i)` gives), as a layout.
pub fn index0(layout: &Layout, i: usize) -> Layout {
    let dims = layout.dims()[1..].to_vec();
    let stride = layout.stride()[1..].to_vec();
    let start = layout.start_offset() + i * layout.stride()[0];
    Layout::new(dims.into(), stride, start)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{D, DType as CDType, Device, Tensor};

    fn strided(t: &Tensor) -> Result<Strided, String> {
        Strided::of(t.layout())
    }

    fn t(dims: &[usize]) -> Tensor {
        Tensor::zeros(dims, CDType::F32, &Device::Cpu).unwrap()
    }

    #[test]
    fn contiguous_batches_flatten_into_rows() {
        let s = strided(&t(&[2, 3, 5, 8])).unwrap();
        assert_eq!(
            s,
            Strided {
                start: 0,
                rows: 30,
                cols: 8,
                row_stride: 8
            }
        );
        assert_eq!(strided(&t(&[7])).unwrap().rows, 1);
        let scalar = Tensor::new(1f32, &Device::Cpu).unwrap();
        assert_eq!(strided(&scalar).unwrap().cols, 1);
    }

    #[test]
    fn chunks_of_the_last_dimension_keep_the_row_stride() {
        // [gate | up] from one matmul, split the way candle-nn's swiglu does.
        let x = t(&[4, 6, 2 * 11]);
        let halves = x.chunk(2, D::Minus1).unwrap();
        let gate = strided(&halves[0]).unwrap();
        let up = strided(&halves[1]).unwrap();
        assert_eq!(
            (gate.rows, gate.cols, gate.row_stride, gate.start),
            (24, 11, 22, 0)
        );
        assert_eq!(
            (up.rows, up.cols, up.row_stride, up.start),
            (24, 11, 22, 11)
        );
    }

    #[test]
    fn narrow_on_leading_dimensions_is_an_offset() {
        let x = t(&[8, 5, 16]);
        let n = x.narrow(0, 3, 2).unwrap();
        assert_eq!(
            strided(&n).unwrap(),
            Strided {
                start: 3 * 5 * 16,
                rows: 10,
                cols: 16,
                row_stride: 16
            }
        );
        let one = x.get(2).unwrap().narrow(1, 4, 8).unwrap();
        assert_eq!(
            strided(&one).unwrap(),
            Strided {
                start: 2 * 80 + 4,
                rows: 5,
                cols: 8,
                row_stride: 16
            }
        );
    }

    #[test]
    fn middle_narrow_does_not_collapse() {
        // [8, 5, 16] narrowed to [8, 3, 16]: rows 16 apart within a batch, 80 across.
        let x = t(&[8, 5, 16]).narrow(1, 1, 3).unwrap();
        let e = strided(&x).unwrap_err();
        assert!(e.contains("do not collapse"), "{e}");
        // With one batch it is a plain matrix again.
        let one = t(&[1, 5, 16]).narrow(1, 1, 3).unwrap();
        assert_eq!(strided(&one).unwrap().row_stride, 16);
        // A batch of length-1 dimensions between is skipped.
        let y = t(&[3, 1, 4, 1, 8]);
        assert_eq!(strided(&y).unwrap().rows, 12);
    }

    #[test]
    fn transposed_and_broadcast_layouts_are_refused() {
        let x = t(&[4, 6]).t().unwrap();
        assert!(strided(&x).unwrap_err().contains("last dimension"));
        let b = t(&[1, 6]).broadcast_as((5, 6)).unwrap();
        assert!(strided(&b).unwrap_err().contains("overlap"));
        // A column vector broadcast along the last dimension: stride 0 there.
        let c = t(&[5, 1]).broadcast_as((5, 6)).unwrap();
        assert!(strided(&c).is_err());
        assert!(!readable(c.layout()));
    }

    #[test]
    fn length_one_last_dimension_ignores_its_stride() {
        let x = t(&[6, 4]).narrow(1, 2, 1).unwrap();
        let s = strided(&x).unwrap();
        assert_eq!((s.rows, s.cols, s.row_stride, s.start), (6, 1, 4, 2));
    }

    #[test]
    fn descriptions_point_at_the_start_element() {
        let s = Strided {
            start: 11,
            rows: 24,
            cols: 11,
            row_stride: 22,
        };
        let d = s.desc(0x1000, 24 * 22, DType::BF16);
        assert_eq!(d.addr, 0x1000 + 22);
        assert_eq!(d.len, 24 * 22 - 11);
        assert_eq!(
            (d.rows, d.cols, d.row_stride, d.col_stride),
            (24, 11, 22, 1)
        );
        d.check("x", DType::BF16).unwrap();
    }

    #[test]
    fn index0_matches_get() {
        let x = t(&[2, 3, 4, 8]).narrow(3, 0, 4).unwrap();
        for i in 0..2 {
            let l = index0(x.layout(), i);
            // `get` squeezes (and on the CPU copies) the narrowed view; compare with the view.
            let g = x.narrow(0, i, 1).unwrap();
            assert_eq!(l.dims(), &g.dims()[1..]);
            assert_eq!(l.stride(), &g.layout().stride()[1..]);
            assert_eq!(l.start_offset(), g.layout().start_offset());
        }
    }
}
