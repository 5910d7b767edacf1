//! The ferrofuse benchmark: what it measures ([`shapes`]), how it times ([`stats`], [`gpu`]),
//! each op on the GPU ([`ops`]), and the JSON it writes ([`schema`]).
//!
//! The binary `ferrofuse-bench` runs on the GPU machine (shipped prebuilt in a gpu-bundle);
//! `bench/peers.py` measures torch eager, torch.compile and Triton on the same plan with the
//! same method; `ferrofuse-report` (`report/`) merges, tabulates and plots.

pub mod gpu;
pub mod ops;
pub mod stats;

// Shared with the report, which must not link the GPU crates; re-exported so that the modules
// here name them as before (`crate::shapes`).
pub use ferrofuse_bench_schema::{schema, shapes};

use schema::{Method, Plan, PlanConfig};
use shapes::{Config, NORM_EPS, Variant};

pub use schema::EXIT_NO_GPU;

/// The commit the binary was built from (`git describe --always --dirty`), or `unknown`.
pub const COMMIT: &str = env!("FERROFUSE_BENCH_COMMIT");

/// A configuration as the plan spells it out for the peers.
pub fn plan_config(c: &Config) -> PlanConfig {
    let (act, layout, norm, eps) = match c.variant {
        Variant::Gated { act, layout } | Variant::GatedFp8 { act, layout, .. } => (
            Some(act.name().to_string()),
            Some(layout.name().to_string()),
            None,
            None,
        ),
        Variant::Norm { kind } | Variant::NormFp8 { kind, .. } => {
            (None, None, Some(kind.name().to_string()), Some(NORM_EPS))
        }
    };
    let scaling = match c.variant {
        Variant::GatedFp8 { scheme, .. } | Variant::NormFp8 { scheme, .. } => {
            Some(scheme.name().to_string())
        }
        _ => None,
    };
    PlanConfig {
        op: c.op.name().into(),
        variant: c.variant.name(),
        dtype: c.dtype.name().into(),
        rows: c.rows,
        cols: c.cols,
        act,
        layout,
        norm,
        eps,
        scaling,
        bytes: c.bytes(),
        modes: c.modes.iter().map(|m| m.name().to_string()).collect(),
    }
}

pub fn plan_json(configs: &[Config], method: Method, device: usize) -> Plan {
    Plan {
        commit: COMMIT.into(),
        device,
        method,
        configs: configs.iter().map(plan_config).collect(),
    }
}

/// Rough wall time of a run, in seconds: `(ferrofuse-bench, peers.py)`. Per configuration and
/// implementation: the per-call budgets (warm-up + timed) plus ~20 ms of setup and checks;
/// graph mode: 10 replays of the graph budget plus ~25 ms of estimate, capture and
/// instantiation. peers.py times three implementations with ~30% more host overhead, and
/// pays one torch.compile per configuration (~1.5 s on an H200 host; the largest unknown).
pub fn estimated_seconds(configs: &[Config], b: &gpu::Budgets) -> (f64, f64) {
    let per_call = (b.warmup_ms + b.rep_ms + 20.0) / 1e3;
    let graph = (stats::GRAPH_REPLAYS as f64 * b.graph_rep_ms + 25.0) / 1e3;
    let one: f64 = configs
        .iter()
        .map(|c| {
            c.modes
                .iter()
                .map(|m| match m {
                    shapes::Mode::PerCall => per_call,
                    shapes::Mode::Graph => graph,
                })
                .sum::<f64>()
        })
        .sum();
    let setup = 5.0;
    (
        setup + one,
        20.0 + 3.0 * 1.3 * one + 1.5 * configs.len() as f64,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use shapes::{Selection, plan};

    #[test]
    fn default_run_fits_the_device_budget() {
        let configs = plan(&Selection::default()).unwrap();
        let (ours, peers) = estimated_seconds(&configs, &gpu::Budgets::default());
        // The whole default run, the shapes off the grid included, within one 10-minute
        // command on the GPU machine, with room for the estimate's error.
        assert!(ours + peers < 8.5 * 60.0, "{ours} + {peers}");
        assert!(ours > 10.0);
    }

    #[test]
    fn plan_round_trips_through_json() {
        let configs = plan(&Selection::default()).unwrap();
        let p = plan_json(&configs, Method::default(), 1);
        let text = serde_json::to_string(&p).unwrap();
        let back: Plan = serde_json::from_str(&text).unwrap();
        assert_eq!(back, p);
        assert_eq!(back.device, 1);
        let gated = &back.configs[0];
        assert_eq!(gated.op, "gated_fwd");
        assert!(gated.act.is_some() && gated.layout.is_some() && gated.norm.is_none());
        let norm = back
            .configs
            .iter()
            .find(|c| c.op == "add_rmsnorm_fwd")
            .unwrap();
        assert_eq!(norm.eps, Some(NORM_EPS));
        assert_eq!(
            norm.bytes,
            (4 * norm.rows * norm.cols + norm.cols) as u64 * 2
        );
    }
}
