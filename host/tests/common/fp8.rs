//! Helpers of the FP8 GPU tests: the scale tensor's layout per scheme, the kernel's scales in
//! row-major order, the reference's scaling, and NaN-tolerant byte equality.

use ferrofuse::fp8::DEFAULT_MIN_SCALE;
use ferrofuse::reference::fp8::Scaling;
use ferrofuse::{Fp8Scaling, ScaleLayout};

/// The schemes tested on rows of `cols`: static; per token, with and without an upper
/// bound; per group of 128 row-major and of 64 column-major where the group divides the row.
pub fn schemes(cols: usize) -> Vec<Fp8Scaling> {
    let mut v = vec![
        Fp8Scaling::Static,
        Fp8Scaling::per_token(),
        Fp8Scaling::PerToken {
            min_scale: DEFAULT_MIN_SCALE,
            scale_ub: Some(3.0),
        },
    ];
    if cols.is_multiple_of(128) {
        v.push(Fp8Scaling::per_group(128, ScaleLayout::RowMajor));
    }
    if cols.is_multiple_of(64) {
        v.push(Fp8Scaling::per_group(64, ScaleLayout::ColMajor));
    }
    v
}

pub fn reference_scaling(s: Fp8Scaling, static_scale: f32) -> Scaling {
    match s {
        Fp8Scaling::Static => Scaling::Static {
            scale: static_scale,
        },
        Fp8Scaling::PerToken {
            min_scale,
            scale_ub,
        } => Scaling::PerToken {
            min_scale,
            scale_ub,
        },
        Fp8Scaling::PerGroup {
            group, min_scale, ..
        } => Scaling::PerGroup { group, min_scale },
    }
}

/// The scale tensor's `(rows, cols, row_stride)` for `scaling` over `rows x cols`.
pub fn scale_layout(s: Fp8Scaling, rows: usize, cols: usize) -> (usize, usize, usize) {
    match s {
        Fp8Scaling::Static => (1, 1, 1),
        Fp8Scaling::PerToken { .. } => (rows, 1, 1),
        Fp8Scaling::PerGroup {
            group,
            layout: ScaleLayout::RowMajor,
            ..
        } => (rows, cols / group, cols / group),
        // Padded to a multiple of 4 rows, as TMA wants.
        Fp8Scaling::PerGroup { group, .. } => (cols / group, rows, rows.next_multiple_of(4)),
    }
}

/// The scale of `row`, group `g` from the kernel's scale tensor, row-major order.
pub fn scales_row_major(s: Fp8Scaling, got: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let (sr, sc, stride) = scale_layout(s, rows, cols);
    match s {
        Fp8Scaling::PerGroup {
            layout: ScaleLayout::ColMajor,
            ..
        } => (0..rows)
            .flat_map(|r| (0..sr).map(move |g| got[g * stride + r]))
            .collect(),
        _ => (0..sr)
            .flat_map(|r| (0..sc).map(move |c| got[r * stride + c]))
            .collect(),
    }
}

pub fn same_byte(a: u8, b: u8) -> bool {
    a == b || (a & 0x7f == 0x7f && b & 0x7f == 0x7f)
}
