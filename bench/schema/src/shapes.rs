//! What the benchmark measures: model shapes, ops, the configurations a selection expands to,
//! and the minimal byte count of each (each input read once, each output written once).
//!
//! Plain `std`: the report labels its tables and charts with the model names from here.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

/// A model whose MLP and norm shapes the benchmark uses (from its Hugging Face `config.json`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Model {
    /// Display name.
    pub name: &'static str,
    /// Short name for `--models`.
    pub key: &'static str,
    /// `hidden_size`: the add+RMSNorm row length.
    pub hidden: usize,
    /// `intermediate_size`: the gated activation's output width (`I`; the interleaved input is `2I`).
    pub intermediate: usize,
    /// `hidden_act` of the gated MLP.
    pub act: Act,
    /// Which RMSNorm convention the checkpoint uses.
    pub norm: NormKind,
}

pub const MODELS: [Model; 6] = [
    Model {
        name: "LLaMA-3-8B",
        key: "llama3-8b",
        hidden: 4096,
        intermediate: 14336,
        act: Act::Silu,
        norm: NormKind::Rms,
    },
    Model {
        name: "LLaMA-3-70B",
        key: "llama3-70b",
        hidden: 8192,
        intermediate: 28672,
        act: Act::Silu,
        norm: NormKind::Rms,
    },
    Model {
        name: "Qwen2-7B",
        key: "qwen2-7b",
        hidden: 3584,
        intermediate: 18944,
        act: Act::Silu,
        norm: NormKind::Rms,
    },
    Model {
        name: "Mistral-7B",
        key: "mistral-7b",
        hidden: 4096,
        intermediate: 14336,
        act: Act::Silu,
        norm: NormKind::Rms,
    },
    Model {
        name: "Gemma-2-9B",
        key: "gemma2-9b",
        hidden: 3584,
        intermediate: 14336,
        act: Act::GeluTanh,
        norm: NormKind::Gemma,
    },
    Model {
        name: "LLaMA-2-7B",
        key: "llama2-7b",
        hidden: 4096,
        intermediate: 11008,
        act: Act::Silu,
        norm: NormKind::Rms,
    },
];

/// Token counts (rows) measured by default: decode (1, 4) to long prefill (16384).
pub const TOKENS: [usize; 8] = [1, 4, 16, 64, 256, 1024, 4096, 16384];

/// RMSNorm epsilon used for every norm shape (LLaMA-3 uses 1e-5, Gemma-2 1e-6; the value does
/// not change the traffic or the work).
pub const NORM_EPS: f64 = 1e-6;

/// Shapes off the 16-byte grid of the 16-bit dtypes (measured in the default run, alone with
/// `--odd-shapes`): row lengths that are odd, 2 or 4 mod 8, just below and above powers of two,
/// from 1 to 131071 elements, at 1 to 16384 rows, as tensor-parallel splits and odd checkpoints
/// produce them. Most have the bytes of an aligned shape of the models', for comparison.
pub const ODD_SHAPES: [Shape; 19] = [
    Shape {
        rows: 1,
        cols: 65535,
    },
    Shape {
        rows: 1,
        cols: 131071,
    },
    Shape {
        rows: 7,
        cols: 65537,
    },
    Shape {
        rows: 16,
        cols: 2047,
    },
    Shape {
        rows: 16,
        cols: 8193,
    },
    Shape {
        rows: 64,
        cols: 4095,
    },
    Shape {
        rows: 64,
        cols: 14335,
    },
    Shape {
        rows: 256,
        cols: 1001,
    },
    Shape { rows: 256, cols: 7 },
    Shape {
        rows: 4096,
        cols: 1,
    },
    Shape {
        rows: 1000,
        cols: 4097,
    },
    Shape {
        rows: 1024,
        cols: 3001,
    },
    Shape {
        rows: 1024,
        cols: 14335,
    },
    Shape {
        rows: 3000,
        cols: 11001,
    },
    Shape {
        rows: 4096,
        cols: 1023,
    },
    Shape {
        rows: 4096,
        cols: 5001,
    },
    Shape {
        rows: 16384,
        cols: 1025,
    },
    Shape {
        rows: 16384,
        cols: 2050,
    },
    Shape {
        rows: 16384,
        cols: 4100,
    },
];

/// By default the CUDA-graph mode runs for shapes up to this many rows: where launch latency
/// and the tail matter. Larger shapes are measured per call only.
pub const GRAPH_MAX_ROWS: usize = 1024;

/// A shape given by hand (`--shapes 7x18944`) instead of the models': `rows` tokens of `cols`
/// columns, which are `I` for the gated ops and `H` for the norm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Shape {
    pub rows: usize,
    pub cols: usize,
}

impl FromStr for Shape {
    type Err = String;

    /// `ROWSxCOLS`, both at least 1, e.g. `16x14336`.
    fn from_str(s: &str) -> Result<Shape, String> {
        let bad =
            |why: String| format!("bad shape {s:?}: {why}; expected ROWSxCOLS, e.g. 16x14336");
        let (rows, cols) = s
            .split_once('x')
            .ok_or_else(|| bad("no 'x' between rows and cols".into()))?;
        let number = |text: &str, what: &str| match text.trim().parse::<usize>() {
            Ok(0) => Err(bad(format!("{what} must be at least 1"))),
            Ok(n) => Ok(n),
            Err(_) => Err(bad(format!("{what} {text:?} is not a whole number"))),
        };
        let shape = Shape {
            rows: number(rows, "rows")?,
            cols: number(cols, "cols")?,
        };
        // The byte counts are u64: the largest is under 32 bytes per element (f32 backward).
        let elements = (shape.rows as u64).checked_mul(shape.cols as u64);
        if elements.and_then(|n| n.checked_mul(32)).is_none() {
            return Err(bad("too many elements".into()));
        }
        Ok(shape)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}", self.rows, self.cols)
    }
}

/// The gated unit's activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Act {
    /// `silu` (SwiGLU): LLaMA, Mistral, Qwen.
    Silu,
    /// `gelu_pytorch_tanh` (GeGLU, tanh approximation): Gemma.
    GeluTanh,
}

impl Act {
    pub const fn name(self) -> &'static str {
        match self {
            Act::Silu => "silu",
            Act::GeluTanh => "gelu_tanh",
        }
    }
}

/// Where the gated unit's two inputs live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Layout {
    /// `a` and `b` are separate `[rows, I]` matrices.
    Split,
    /// One `[rows, 2I]` matrix `[gate | up]` (the output of a fused gate/up GEMM).
    Interleaved,
    /// Split, every operand's rows padded to a row stride of `I` rounded up to 64 elements
    /// (forward only; asked for by name).
    Padded,
    /// Split and dense, `a` and `b` one element past their allocation's start, `y` at its
    /// start (forward only; asked for by name).
    Offset,
}

impl Layout {
    /// The layouts measured when none is named.
    pub const ALL: [Layout; 2] = [Layout::Split, Layout::Interleaved];
    /// Every layout `parse` knows.
    pub const NAMED: [Layout; 4] = [
        Layout::Split,
        Layout::Interleaved,
        Layout::Padded,
        Layout::Offset,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Layout::Split => "split",
            Layout::Interleaved => "interleaved",
            Layout::Padded => "padded",
            Layout::Offset => "offset",
        }
    }

    pub fn parse(s: &str) -> Option<Layout> {
        Layout::NAMED.into_iter().find(|l| l.name() == s)
    }

    /// For the layouts of three separate `[rows, I]` operands: their row stride and the
    /// element offsets of `a`, `b` and `y` in their allocations; `None` for interleaved.
    pub const fn split_views(self, cols: usize) -> Option<(usize, [usize; 3])> {
        match self {
            Layout::Split => Some((cols, [0, 0, 0])),
            Layout::Padded => Some((cols.next_multiple_of(64), [0, 0, 0])),
            Layout::Offset => Some((cols, [1, 1, 0])),
            Layout::Interleaved => None,
        }
    }

    /// Whether an op runs in this layout: the padded and offset views are forward only.
    pub const fn supports(self, op: Op) -> bool {
        matches!(self, Layout::Split | Layout::Interleaved) || matches!(op, Op::GatedFwd)
    }
}

/// The scales of an FP8 output (see `ferrofuse::Fp8Scaling`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fp8Scheme {
    /// One scale for the tensor, read from device memory.
    Static,
    /// One scale per row, from the row's largest magnitude (`[rows, 1]` f32 written).
    PerToken,
    /// One scale per 128 columns of a row (`[rows, I / 128]` f32 written, row-major).
    Group128,
}

impl Fp8Scheme {
    pub const ALL: [Fp8Scheme; 3] = [Fp8Scheme::Static, Fp8Scheme::PerToken, Fp8Scheme::Group128];

    pub const fn name(self) -> &'static str {
        match self {
            Fp8Scheme::Static => "static",
            Fp8Scheme::PerToken => "per_token",
            Fp8Scheme::Group128 => "group128",
        }
    }

    /// Bytes of scales moved for `rows x cols` (read for static, written otherwise).
    pub const fn scale_bytes(self, rows: u64, cols: u64) -> u64 {
        match self {
            Fp8Scheme::Static => 4,
            Fp8Scheme::PerToken => 4 * rows,
            Fp8Scheme::Group128 => 4 * rows * cols.div_ceil(128),
        }
    }
}

/// RMSNorm convention: `y = h * rstd * w` or Gemma's `y = h * rstd * (1 + w)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NormKind {
    Rms,
    Gemma,
}

impl NormKind {
    pub const fn name(self) -> &'static str {
        match self {
            NormKind::Rms => "rms",
            NormKind::Gemma => "gemma_rms",
        }
    }
}

/// Storage dtype of every operand (the norm weight included).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Dtype {
    Bf16,
    F16,
    F32,
}

impl Dtype {
    pub const ALL: [Dtype; 3] = [Dtype::Bf16, Dtype::F16, Dtype::F32];

    pub const fn name(self) -> &'static str {
        match self {
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "f16",
            Dtype::F32 => "f32",
        }
    }

    pub const fn size(self) -> u64 {
        match self {
            Dtype::Bf16 | Dtype::F16 => 2,
            Dtype::F32 => 4,
        }
    }

    pub fn parse(s: &str) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|d| d.name() == s)
    }
}

/// An op family. Each measured configuration is one op at one shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Op {
    /// `y = act(a) * b`.
    GatedFwd,
    /// `da = dy * b * act'(a)`, `db = dy * act(a)`.
    GatedBwd,
    /// `y_q = e4m3(act(a) * b / scale)` and the scales (run only when asked for by name:
    /// `--ops gated_fwd_fp8`).
    GatedFwdFp8,
    /// `h = x + residual`, `y = rmsnorm(h) * w`.
    AddRmsNormFwd,
    /// `dx = d(rmsnorm)/dh * dy`, `dw = sum over rows of dy * h * rstd`.
    AddRmsNormBwd,
    /// `h = x + residual`, `y_q = e4m3(rmsnorm(h) * w / scale)` and the scales (run only when
    /// asked for by name: `--ops add_rmsnorm_fwd_fp8`).
    AddRmsNormFwdFp8,
}

impl Op {
    pub const ALL: [Op; 6] = [
        Op::GatedFwd,
        Op::GatedBwd,
        Op::GatedFwdFp8,
        Op::AddRmsNormFwd,
        Op::AddRmsNormBwd,
        Op::AddRmsNormFwdFp8,
    ];

    /// The `op` field of a result.
    pub const fn name(self) -> &'static str {
        match self {
            Op::GatedFwd => "gated_fwd",
            Op::GatedBwd => "gated_bwd",
            Op::GatedFwdFp8 => "gated_fwd_fp8",
            Op::AddRmsNormFwd => "add_rmsnorm_fwd",
            Op::AddRmsNormBwd => "add_rmsnorm_bwd",
            Op::AddRmsNormFwdFp8 => "add_rmsnorm_fwd_fp8",
        }
    }

    pub fn parse(s: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|o| o.name() == s)
    }

    pub const fn is_backward(self) -> bool {
        matches!(self, Op::GatedBwd | Op::AddRmsNormBwd)
    }

    pub const fn is_gated(self) -> bool {
        matches!(self, Op::GatedFwd | Op::GatedBwd | Op::GatedFwdFp8)
    }

    /// The minimal traffic, as printed by the benchmark (`s` = dtype size in bytes).
    pub const fn bytes_formula(self) -> &'static str {
        match self {
            Op::GatedFwd => "read a, b; write y: 3 * rows * I * s",
            Op::GatedBwd => "read a, b, dy; write da, db: 5 * rows * I * s",
            Op::GatedFwdFp8 => {
                "read a, b; write y (FP8) and the scales: 2 * rows * I * s + rows * I + 4 * \
                 (1 | rows | rows * I / 128)"
            }
            Op::AddRmsNormFwd => "read x, residual, w; write h, y: (4 * rows * H + H) * s",
            Op::AddRmsNormBwd => {
                "read dy, h, w, rstd (f32); write dx, dw: (3 * rows * H + 2 * H) * s + 4 * rows"
            }
            Op::AddRmsNormFwdFp8 => {
                "read x, residual, w; write h, y (FP8) and the scales: (3 * rows * H + H) * s + \
                 rows * H + 4 * (1 | rows | rows * H / 128)"
            }
        }
    }
}

/// What distinguishes shapes of one op beyond rows and cols.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Variant {
    Gated {
        act: Act,
        layout: Layout,
    },
    GatedFp8 {
        act: Act,
        layout: Layout,
        scheme: Fp8Scheme,
    },
    Norm {
        kind: NormKind,
    },
    NormFp8 {
        kind: NormKind,
        scheme: Fp8Scheme,
    },
}

impl Variant {
    /// The `variant` field of a result: `silu_split`, `gelu_tanh_interleaved`, `rms`, `gemma_rms`.
    pub fn name(self) -> String {
        match self {
            Variant::Gated { act, layout } => format!("{}_{}", act.name(), layout.name()),
            Variant::GatedFp8 {
                act,
                layout,
                scheme,
            } => format!("{}_{}_{}", act.name(), layout.name(), scheme.name()),
            Variant::Norm { kind } => kind.name().to_string(),
            Variant::NormFp8 { kind, scheme } => format!("{}_{}", kind.name(), scheme.name()),
        }
    }
}

/// Timing method: L2 flushed before each timed call, or CUDA-graph replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mode {
    PerCall,
    Graph,
}

impl Mode {
    pub const ALL: [Mode; 2] = [Mode::PerCall, Mode::Graph];

    /// The `mode` field of a result.
    pub const fn name(self) -> &'static str {
        match self {
            Mode::PerCall => "per_call",
            Mode::Graph => "graph",
        }
    }

    pub fn parse(s: &str) -> Option<Mode> {
        Mode::ALL.into_iter().find(|m| m.name() == s)
    }
}

/// One op at one shape and dtype, with the modes it is timed in.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Config {
    pub op: Op,
    pub variant: Variant,
    pub dtype: Dtype,
    /// Tokens.
    pub rows: usize,
    /// `I` for the gated ops (the output width), `H` for the norm.
    pub cols: usize,
    pub modes: Vec<Mode>,
}

impl Config {
    /// Minimal bytes moved: each input read once, each output written once (see
    /// [`Op::bytes_formula`]).
    pub fn bytes(&self) -> u64 {
        let (r, c, s) = (self.rows as u64, self.cols as u64, self.dtype.size());
        match self.op {
            Op::GatedFwd => 3 * r * c * s,
            Op::GatedBwd => 5 * r * c * s,
            Op::GatedFwdFp8 => {
                let scales = match self.variant {
                    Variant::GatedFp8 { scheme, .. } => scheme.scale_bytes(r, c),
                    _ => 0,
                };
                2 * r * c * s + r * c + scales
            }
            Op::AddRmsNormFwd => (4 * r * c + c) * s,
            Op::AddRmsNormBwd => (3 * r * c + 2 * c) * s + 4 * r,
            Op::AddRmsNormFwdFp8 => {
                let scales = match self.variant {
                    Variant::NormFp8 { scheme, .. } => scheme.scale_bytes(r, c),
                    _ => 0,
                };
                (3 * r * c + c) * s + r * c + scales
            }
        }
    }

    /// `op variant dtype rows x cols`, for progress messages.
    pub fn label(&self) -> String {
        format!(
            "{} {} {} {}x{}",
            self.op.name(),
            self.variant.name(),
            self.dtype.name(),
            self.rows,
            self.cols
        )
    }

    /// Models whose config has this shape.
    pub fn models(&self) -> Vec<&'static str> {
        models_for(self.op, &self.variant.name(), self.cols)
    }
}

/// Models whose shape is `(op, variant, cols)`, by the names results carry.
pub fn models_for(op: Op, variant: &str, cols: usize) -> Vec<&'static str> {
    MODELS
        .iter()
        .filter(|m| {
            if op.is_gated() {
                m.intermediate == cols && variant.starts_with(m.act.name())
            } else {
                // The FP8 variants are the norm's name and the scheme's.
                m.hidden == cols
                    && (m.norm.name() == variant
                        || variant.strip_prefix(m.norm.name()).is_some_and(|s| {
                            Fp8Scheme::ALL.iter().any(|f| s == format!("_{}", f.name()))
                        }))
            }
        })
        .map(|m| m.name)
        .collect()
}

/// Which configurations to run; every field empty or default means "the default run".
#[derive(Clone, Debug, PartialEq)]
pub struct Selection {
    /// Model keys (`llama3-8b`, ...); empty: all.
    pub models: Vec<String>,
    /// Token counts; empty: [`TOKENS`].
    pub tokens: Vec<usize>,
    /// Shapes given by hand, instead of the models' at the token counts (so not together with
    /// `models` or `tokens`): the gated ops with SiLU, the norm as plain RMSNorm.
    pub shapes: Vec<Shape>,
    /// Also measure [`ODD_SHAPES`] (as if given by hand) beside every model's shapes at the
    /// default token counts: on in the default run, ignored once `models`, `tokens` or `shapes`
    /// narrow the selection.
    pub odd_shapes: bool,
    /// Op families by name (`gated`, `add_rmsnorm`) or exact op names; empty: both families.
    pub ops: Vec<String>,
    /// Gated layouts; empty: both.
    pub layouts: Vec<Layout>,
    /// Dtypes; empty: bf16 only.
    pub dtypes: Vec<Dtype>,
    /// Also run the backward ops.
    pub backward: bool,
    /// Only the backward ops (implies `backward`).
    pub backward_only: bool,
    /// Modes; empty: both (graph only up to `graph_max_rows`).
    pub modes: Vec<Mode>,
    pub graph_max_rows: usize,
}

impl Default for Selection {
    fn default() -> Self {
        Self {
            models: Vec::new(),
            tokens: Vec::new(),
            shapes: Vec::new(),
            odd_shapes: true,
            ops: Vec::new(),
            layouts: Vec::new(),
            dtypes: Vec::new(),
            backward: false,
            backward_only: false,
            modes: Vec::new(),
            graph_max_rows: GRAPH_MAX_ROWS,
        }
    }
}

impl fmt::Display for Selection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |v: Vec<String>| {
            if v.is_empty() {
                "all".to_string()
            } else {
                v.join(",")
            }
        };
        if self.shapes.is_empty() {
            write!(
                f,
                "models {}, tokens {}",
                list(self.models.clone()),
                list(self.tokens.iter().map(|t| t.to_string()).collect()),
            )?;
            if self.odd_shapes && self.models.is_empty() && self.tokens.is_empty() {
                write!(f, ", the shapes off the grid")?;
            }
        } else {
            write!(
                f,
                "shapes {}",
                list(self.shapes.iter().map(|s| s.to_string()).collect())
            )?;
        }
        write!(
            f,
            ", ops {}, dtypes {}",
            list(self.ops.clone()),
            list(self.dtypes.iter().map(|d| d.name().to_string()).collect()),
        )
    }
}

fn op_selected(sel: &Selection, op: Op) -> bool {
    // The FP8 forward only when named (it is not part of the default run or of `gated`).
    if op == Op::GatedFwdFp8 {
        return sel.ops.iter().any(|s| s == op.name() || s == "gated_fp8");
    }
    if op == Op::AddRmsNormFwdFp8 {
        return sel
            .ops
            .iter()
            .any(|s| s == op.name() || s == "add_rmsnorm_fp8");
    }
    if op.is_backward() && !(sel.backward || sel.backward_only) {
        return false;
    }
    if !op.is_backward() && sel.backward_only {
        return false;
    }
    if sel.ops.is_empty() {
        return true;
    }
    let family = if op.is_gated() {
        "gated"
    } else {
        "add_rmsnorm"
    };
    sel.ops.iter().any(|s| s == family || s == op.name())
}

/// Expands a selection into configurations: one per distinct (op, variant, dtype, rows, cols),
/// so models that share a shape (LLaMA-3-8B and Mistral-7B) are measured once. Ordered by op,
/// variant and cols, then dtype in the order given, then rows.
pub fn plan(sel: &Selection) -> Result<Vec<Config>, String> {
    for key in &sel.models {
        if !MODELS.iter().any(|m| m.key == key.as_str()) {
            let keys: Vec<&str> = MODELS.iter().map(|m| m.key).collect();
            return Err(format!("unknown model {key:?}: one of {}", keys.join(", ")));
        }
    }
    for op in &sel.ops {
        let known = ["gated", "gated_fp8", "add_rmsnorm", "add_rmsnorm_fp8"].contains(&op.as_str())
            || Op::parse(op).is_some();
        if !known {
            return Err(format!(
                "unknown op {op:?}: gated, add_rmsnorm, or one of {}",
                Op::ALL.map(|o| o.name()).join(", ")
            ));
        }
    }
    if sel.tokens.contains(&0) {
        return Err("token counts must be at least 1".into());
    }
    if !sel.shapes.is_empty() && !(sel.models.is_empty() && sel.tokens.is_empty()) {
        return Err(
            "--shapes gives the rows and cols itself: it does not combine with --models or --tokens"
                .into(),
        );
    }
    let dtypes: &[Dtype] = if sel.dtypes.is_empty() {
        &[Dtype::Bf16]
    } else {
        &sel.dtypes
    };
    let layouts: &[Layout] = if sel.layouts.is_empty() {
        &Layout::ALL
    } else {
        &sel.layouts
    };
    let modes: &[Mode] = if sel.modes.is_empty() {
        &Mode::ALL
    } else {
        &sel.modes
    };

    // What to measure, before ops and layouts: (activation, norm, I, H, rows) per model, or
    // per shape given by hand (the built-in shapes off the grid count as given by hand).
    let by_hand = |shapes: &[Shape]| {
        shapes
            .iter()
            .map(|s| (Act::Silu, NormKind::Rms, s.cols, s.cols, vec![s.rows]))
            .collect::<Vec<_>>()
    };
    let sources: Vec<(Act, NormKind, usize, usize, Vec<usize>)> = if sel.shapes.is_empty() {
        let tokens = if sel.tokens.is_empty() {
            TOKENS.to_vec()
        } else {
            sel.tokens.clone()
        };
        let models = MODELS
            .iter()
            .filter(|m| sel.models.is_empty() || sel.models.iter().any(|k| k == m.key))
            .map(|m| (m.act, m.norm, m.intermediate, m.hidden, tokens.clone()));
        let odd = if sel.odd_shapes && sel.models.is_empty() && sel.tokens.is_empty() {
            by_hand(&ODD_SHAPES)
        } else {
            Vec::new()
        };
        models.chain(odd).collect()
    } else {
        by_hand(&sel.shapes)
    };
    // (op, variant, cols) -> the rows to measure it at; the map orders and dedups both.
    let mut shapes: BTreeMap<(Op, Variant, usize), BTreeSet<usize>> = BTreeMap::new();
    for op in Op::ALL.into_iter().filter(|&op| op_selected(sel, op)) {
        for (act, kind, intermediate, hidden, rows) in &sources {
            if op == Op::GatedFwdFp8 {
                for &layout in layouts.iter().filter(|l| l.supports(op)) {
                    for scheme in Fp8Scheme::ALL {
                        let variant = Variant::GatedFp8 {
                            act: *act,
                            layout,
                            scheme,
                        };
                        let key = (op, variant, *intermediate);
                        shapes.entry(key).or_default().extend(rows);
                    }
                }
            } else if op == Op::AddRmsNormFwdFp8 {
                for scheme in Fp8Scheme::ALL {
                    let variant = Variant::NormFp8 {
                        kind: *kind,
                        scheme,
                    };
                    shapes
                        .entry((op, variant, *hidden))
                        .or_default()
                        .extend(rows);
                }
            } else if op.is_gated() {
                for &layout in layouts.iter().filter(|l| l.supports(op)) {
                    let variant = Variant::Gated { act: *act, layout };
                    let key = (op, variant, *intermediate);
                    shapes.entry(key).or_default().extend(rows);
                }
            } else {
                let key = (op, Variant::Norm { kind: *kind }, *hidden);
                shapes.entry(key).or_default().extend(rows);
            }
        }
    }

    let mut configs = Vec::new();
    for ((op, variant, cols), all_rows) in shapes {
        for &dtype in dtypes {
            for &rows in &all_rows {
                let modes: Vec<Mode> = modes
                    .iter()
                    .copied()
                    .filter(|&m| m == Mode::PerCall || rows <= sel.graph_max_rows)
                    .collect();
                if modes.is_empty() {
                    continue;
                }
                configs.push(Config {
                    op,
                    variant,
                    dtype,
                    rows,
                    cols,
                    modes,
                });
            }
        }
    }
    Ok(configs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_plan_covers_every_model_shape_once() {
        let configs = plan(&Selection::default()).unwrap();
        // Gated: silu at 11008, 14336, 18944, 28672 and gelu_tanh at 14336, two layouts each;
        // norm: rms at 3584, 4096, 8192 and gemma_rms at 3584. Eight token counts, bf16. Then
        // SwiGLU in two layouts and add + RMSNorm at each shape off the grid.
        assert_eq!(configs.len(), (5 * 2 + 4) * 8 + 3 * ODD_SHAPES.len());
        let models_only = Selection {
            odd_shapes: false,
            ..Selection::default()
        };
        assert_eq!(plan(&models_only).unwrap().len(), (5 * 2 + 4) * 8);
        assert!(configs.iter().all(|c| c.dtype == Dtype::Bf16));
        assert!(configs.iter().all(|c| !c.op.is_backward()));
        let mut keys: Vec<_> = configs
            .iter()
            .map(|c| (c.op, c.variant, c.rows, c.cols))
            .collect();
        keys.dedup();
        assert_eq!(keys.len(), configs.len(), "a shape appears twice");
        for m in &MODELS {
            for t in TOKENS {
                assert!(configs.iter().any(|c| c.op == Op::GatedFwd
                    && c.cols == m.intermediate
                    && c.rows == t
                    && c.variant
                        == Variant::Gated {
                            act: m.act,
                            layout: Layout::Interleaved
                        }));
                assert!(configs.iter().any(|c| c.op == Op::AddRmsNormFwd
                    && c.cols == m.hidden
                    && c.rows == t
                    && c.variant == Variant::Norm { kind: m.norm }));
            }
        }
    }

    #[test]
    fn odd_shapes_are_off_the_grid_and_plan_like_shapes_by_hand() {
        // Off the 16-byte grid of the 16-bit dtypes (8 elements), distinct, within 1..=16384
        // rows.
        for (i, s) in ODD_SHAPES.iter().enumerate() {
            assert!(!s.cols.is_multiple_of(8), "{s} is on the 16-bit grid");
            assert!((1..=16384).contains(&s.rows), "{s}");
            assert!(!ODD_SHAPES[..i].contains(s), "{s} twice");
        }
        let sel = Selection {
            shapes: ODD_SHAPES.to_vec(),
            ..Selection::default()
        };
        let configs = plan(&sel).unwrap();
        // SwiGLU in two layouts and add + RMSNorm at each shape.
        assert_eq!(configs.len(), 3 * ODD_SHAPES.len());
    }

    #[test]
    fn graph_mode_only_for_small_shapes() {
        let configs = plan(&Selection::default()).unwrap();
        for c in &configs {
            assert_eq!(c.modes.contains(&Mode::Graph), c.rows <= GRAPH_MAX_ROWS);
            assert!(c.modes.contains(&Mode::PerCall));
        }
        let sel = Selection {
            modes: vec![Mode::Graph],
            ..Selection::default()
        };
        let configs = plan(&sel).unwrap();
        assert!(configs.iter().all(|c| c.rows <= GRAPH_MAX_ROWS));
        assert!(configs.iter().all(|c| c.modes == vec![Mode::Graph]));
    }

    #[test]
    fn subset_selection() {
        let sel = Selection {
            models: vec!["gemma2-9b".into()],
            tokens: vec![16, 1],
            ops: vec!["gated".into()],
            layouts: vec![Layout::Split],
            dtypes: vec![Dtype::F32, Dtype::F16],
            backward: true,
            ..Selection::default()
        };
        let configs = plan(&sel).unwrap();
        // fwd + bwd, one variant, two dtypes, two token counts.
        assert_eq!(configs.len(), 2 * 2 * 2);
        assert!(configs.iter().all(|c| c.cols == 14336
            && c.variant
                == Variant::Gated {
                    act: Act::GeluTanh,
                    layout: Layout::Split
                }));
        assert_eq!(configs[0].rows, 1, "rows sorted");
        let only_bwd = Selection {
            backward_only: true,
            ..sel.clone()
        };
        assert!(plan(&only_bwd).unwrap().iter().all(|c| c.op.is_backward()));
        let exact = Selection {
            ops: vec!["add_rmsnorm_fwd".into()],
            ..Selection::default()
        };
        assert!(
            plan(&exact)
                .unwrap()
                .iter()
                .all(|c| c.op == Op::AddRmsNormFwd)
        );
    }

    #[test]
    fn rejects_unknown_names() {
        for sel in [
            Selection {
                models: vec!["gpt-5".into()],
                ..Selection::default()
            },
            Selection {
                ops: vec!["softmax".into()],
                ..Selection::default()
            },
            Selection {
                tokens: vec![0],
                ..Selection::default()
            },
        ] {
            assert!(plan(&sel).is_err());
        }
    }

    #[test]
    fn parses_shapes() {
        let shape = |s: &str| s.parse::<Shape>();
        assert_eq!(
            shape("7x18944"),
            Ok(Shape {
                rows: 7,
                cols: 18944
            })
        );
        assert_eq!(shape(" 3000 x 11001 ").unwrap().to_string(), "3000x11001");
        for (text, says) in [
            ("", "no 'x' between rows and cols"),
            ("7", "no 'x' between rows and cols"),
            ("7*18944", "no 'x' between rows and cols"),
            ("x18944", "rows \"\" is not a whole number"),
            ("7x", "cols \"\" is not a whole number"),
            ("-7x18944", "rows \"-7\" is not a whole number"),
            ("7x18944x2", "cols \"18944x2\" is not a whole number"),
            ("7.5x18944", "rows \"7.5\" is not a whole number"),
            ("0x18944", "rows must be at least 1"),
            ("7x0", "cols must be at least 1"),
            ("4294967296x4294967296", "too many elements"),
        ] {
            let err = shape(text).unwrap_err();
            assert!(err.contains(says), "{text:?}: {err}");
            assert!(err.contains("expected ROWSxCOLS"), "{text:?}: {err}");
        }
    }

    #[test]
    fn shapes_by_hand_replace_the_models() {
        let sel = Selection {
            shapes: vec!["7x18944".parse().unwrap(), "3000x11001".parse().unwrap()],
            ..Selection::default()
        };
        let configs = plan(&sel).unwrap();
        // Per shape: gated SiLU in both layouts (cols = I) and plain RMSNorm (cols = H).
        let got: Vec<(Op, String, usize, usize)> = configs
            .iter()
            .map(|c| (c.op, c.variant.name(), c.rows, c.cols))
            .collect();
        let want = [
            (Op::GatedFwd, "silu_split", 3000, 11001),
            (Op::GatedFwd, "silu_split", 7, 18944),
            (Op::GatedFwd, "silu_interleaved", 3000, 11001),
            (Op::GatedFwd, "silu_interleaved", 7, 18944),
            (Op::AddRmsNormFwd, "rms", 3000, 11001),
            (Op::AddRmsNormFwd, "rms", 7, 18944),
        ];
        let want: Vec<(Op, String, usize, usize)> = want
            .iter()
            .map(|&(op, v, r, c)| (op, v.to_string(), r, c))
            .collect();
        assert_eq!(got, want);
        // Graph mode only up to graph_max_rows, as for the models.
        assert!(
            configs
                .iter()
                .all(|c| c.modes.contains(&Mode::Graph) == (c.rows == 7))
        );
        // The other filters apply.
        let norm_only = Selection {
            ops: vec!["add_rmsnorm".into()],
            dtypes: vec![Dtype::F32],
            ..sel.clone()
        };
        let configs = plan(&norm_only).unwrap();
        assert_eq!(configs.len(), 2);
        assert!(
            configs
                .iter()
                .all(|c| c.dtype == Dtype::F32 && !c.op.is_gated())
        );
        // A shape fixes its rows: --models and --tokens would say something else.
        for sel in [
            Selection {
                models: vec!["llama3-8b".into()],
                ..sel.clone()
            },
            Selection {
                tokens: vec![16],
                ..sel.clone()
            },
        ] {
            let err = plan(&sel).unwrap_err();
            assert!(
                err.contains("does not combine with --models or --tokens"),
                "{err}"
            );
        }
    }

    #[test]
    fn byte_counts_are_the_minimal_traffic() {
        let c = |op, variant, dtype, rows, cols| Config {
            op,
            variant,
            dtype,
            rows,
            cols,
            modes: vec![Mode::PerCall],
        };
        let silu = Variant::Gated {
            act: Act::Silu,
            layout: Layout::Interleaved,
        };
        let rms = Variant::Norm {
            kind: NormKind::Rms,
        };
        // The anchors' numbers: 8192 x 14336 bf16 SiLU-mul moves 3 * 8192 * 14336 * 2 bytes.
        assert_eq!(
            c(Op::GatedFwd, silu, Dtype::Bf16, 8192, 14336).bytes(),
            704_643_072
        );
        assert_eq!(c(Op::GatedBwd, silu, Dtype::F32, 2, 10).bytes(), 400);
        // (4 * rows * H + H) * 2 for bf16 add+RMSNorm.
        assert_eq!(
            c(Op::AddRmsNormFwd, rms, Dtype::Bf16, 8192, 4096).bytes(),
            (4 * 8192 * 4096 + 4096) * 2
        );
        assert_eq!(
            c(Op::AddRmsNormBwd, rms, Dtype::F16, 3, 8).bytes(),
            (3 * 3 * 8 + 16) * 2 + 12
        );
    }

    #[test]
    fn models_share_shapes() {
        assert_eq!(
            models_for(Op::GatedFwd, "silu_split", 14336),
            ["LLaMA-3-8B", "Mistral-7B"]
        );
        assert_eq!(
            models_for(Op::GatedFwd, "gelu_tanh_interleaved", 14336),
            ["Gemma-2-9B"]
        );
        assert_eq!(
            models_for(Op::AddRmsNormFwd, "rms", 4096),
            ["LLaMA-3-8B", "Mistral-7B", "LLaMA-2-7B"]
        );
        assert_eq!(
            models_for(Op::AddRmsNormBwd, "gemma_rms", 3584),
            ["Gemma-2-9B"]
        );
    }
}
