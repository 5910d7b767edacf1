//! The JSON the benchmark writes and reads: the results report (written by `ferrofuse-bench`
//! and `bench/peers.py`, read by `ferrofuse-report`) and the plan (the configurations, handed
//! to `peers.py` so the peers measure exactly the same shapes with the same byte counts).
//!
//! ```json
//! {"gpu": "NVIDIA H200", "driver": "580.95.05 (CUDA 13.0)", "date": "2026-11-29T12:00:00Z",
//!  "commit": "852baca", "copy_ceiling_gbs": 4240.1,
//!  "results": [{"op": "gated_fwd", "variant": "silu_split", "dtype": "bf16", "rows": 16,
//!               "cols": 14336, "impl": "ferrofuse", "mode": "per_call", "median_us": 3.1,
//!               "gbs": 444.0, "pct_of_ceiling": 10.5}],
//!  "methods": [{"tool": "ferrofuse-bench 0.1.0", ...}]}
//! ```
//! `methods` and `device` are optional (absent in the first files): how each source measured,
//! and on which CUDA device.

use serde::{Deserialize, Serialize};

/// Exit code of `ferrofuse-bench` (and so of `cargo xtask bench` and `run.sh bench`) when
/// there is no CUDA driver or no device: `EX_UNAVAILABLE` from sysexits.h.
pub const EXIT_NO_GPU: u8 = 69;

/// What identifies a measurement: (op, variant, dtype, rows, cols, mode); see [`Record::key`].
pub type Key = (String, String, String, usize, usize, String);

/// `impl` of our kernels.
pub const IMPL_FERROFUSE: &str = "ferrofuse";
/// `impl` of the candle peer (candle's own ops, measured by ferrofuse-candle's
/// `candle_peer` program).
pub const IMPL_CANDLE: &str = "candle";
/// `impl` of the peers, in the order the tables show them.
pub const PEER_IMPLS: [&str; 4] = ["torch_eager", "torch_compile", "triton", IMPL_CANDLE];

/// `op` of the launch-floor records (an empty kernel, timed like every op; rows = cols = 0).
pub const OP_EMPTY: &str = "empty_kernel";
/// `op` of the copy-ceiling records (`cols` = bytes copied, `dtype` = `u8`).
pub const OP_COPY: &str = "copy";

/// One results file.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Report {
    /// Device name as the driver reports it.
    pub gpu: String,
    /// Driver version (and the CUDA version it supports).
    pub driver: String,
    /// When the run started, UTC, ISO 8601.
    pub date: String,
    /// The ferrofuse commit the binaries were built from.
    pub commit: String,
    /// Device-to-device copy bandwidth measured in the same run (bytes read + written).
    pub copy_ceiling_gbs: f64,
    /// The CUDA device ordinal the run used (for hosts with several GPUs; absent in files
    /// written before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<usize>,
    pub results: Vec<Record>,
    /// How each source measured (one entry per tool; several after a merge).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<Method>,
}

/// One measurement.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Record {
    pub op: String,
    pub variant: String,
    pub dtype: String,
    pub rows: usize,
    pub cols: usize,
    #[serde(rename = "impl")]
    pub imp: String,
    /// `per_call` (L2 flushed before each timed run) or `graph` (CUDA-graph replay).
    pub mode: String,
    pub median_us: f64,
    /// Minimal bytes (the plan's formula) over the median time.
    pub gbs: f64,
    /// `gbs` over the report's `copy_ceiling_gbs`, in percent.
    pub pct_of_ceiling: f64,
}

impl Record {
    /// The fields that identify a shape and method (everything but the numbers and `impl`).
    pub fn key(&self) -> Key {
        (
            self.op.clone(),
            self.variant.clone(),
            self.dtype.clone(),
            self.rows,
            self.cols,
            self.mode.clone(),
        )
    }
}

/// GB/s of `bytes` moved in `us` microseconds (0 when there are no bytes or no time).
pub fn gbs(bytes: u64, us: f64) -> f64 {
    if bytes == 0 || us <= 0.0 {
        return 0.0;
    }
    bytes as f64 / (us * 1e3)
}

/// `gbs` as a percentage of `ceiling_gbs` (0 without a ceiling).
pub fn pct_of(gbs: f64, ceiling_gbs: f64) -> f64 {
    if ceiling_gbs > 0.0 {
        100.0 * gbs / ceiling_gbs
    } else {
        0.0
    }
}

/// How a source measured: enough to reproduce the numbers.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct Method {
    /// Which program measured, with versions (`ferrofuse-bench 0.1.0`, `peers.py torch 2.11 ...`).
    pub tool: String,
    /// per_call: warm-up budget, then the timed budget (ms of GPU time, as do_bench counts).
    pub warmup_ms: f64,
    pub rep_ms: f64,
    /// graph: the budget for the launches captured in one graph (do_bench_cudagraph's `rep`).
    pub graph_rep_ms: f64,
    /// Bytes written before each per_call run to flush the L2.
    pub l2_flush_bytes: u64,
    /// Bytes of the device-to-device copy that gives the ceiling.
    pub copy_bytes: u64,
    /// Wall time of the whole run, seconds.
    #[serde(default)]
    pub elapsed_s: f64,
    /// Whether ferrofuse's kernels were launched with programmatic dependent launch (off with
    /// `--no-pdl` or below sm_90); absent for the peers and in older files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub programmatic_launch: Option<bool>,
    /// Which of ferrofuse's prebuilt code the device ran: `cubin` (the SASS ptxas built) or
    /// `ptx` (compiled by the driver); absent for the peers and in files written when only PTX
    /// was shipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loaded_code: Option<String>,
    /// Which of ferrofuse's modules ran (`sm_90`, `sm_80`): the device's own, or the one
    /// `--module` named; absent for the peers and in older files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
    /// Seconds `Kernels::for_device` took at the start of the run: the context and the module
    /// (a PTX module's first load on a machine includes the driver's JIT, unless its cache
    /// has it); absent for the peers and in older files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_s: Option<f64>,
    /// `ferrofuse-bench`'s command-line arguments (the kernel forms a run turned off or on
    /// among them); absent for the peers and in older files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<String>>,
}

/// The configurations of a run, as `ferrofuse-bench --plan-out` writes them for `peers.py`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Plan {
    /// The commit `ferrofuse-bench` was built from; the peers report it as theirs.
    #[serde(default)]
    pub commit: String,
    /// The device ordinal `ferrofuse-bench` measures on; `peers.py` uses the same one unless
    /// told otherwise.
    #[serde(default)]
    pub device: usize,
    pub method: Method,
    pub configs: Vec<PlanConfig>,
}

/// One configuration, with everything a peer needs spelled out.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct PlanConfig {
    pub op: String,
    pub variant: String,
    pub dtype: String,
    pub rows: usize,
    pub cols: usize,
    /// Gated ops: `silu` or `gelu_tanh`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub act: Option<String>,
    /// Gated ops: `split` or `interleaved`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<String>,
    /// Norm ops: `rms` or `gemma_rms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub norm: Option<String>,
    /// FP8 ops: `static`, `per_token` or `group128` (row-major scales).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaling: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eps: Option<f64>,
    /// Minimal bytes moved; GB/s = bytes / time on every side.
    pub bytes: u64,
    pub modes: Vec<String>,
}
