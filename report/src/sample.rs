//! Test data: a ferrofuse file and a peers file, as the two programs write them.

use ferrofuse_bench_schema::schema::{self, IMPL_FERROFUSE, OP_EMPTY, PEER_IMPLS, Record, Report};

pub fn rec(
    op: &str,
    variant: &str,
    rows: usize,
    cols: usize,
    imp: &str,
    mode: &str,
    us: f64,
) -> Record {
    let bytes = (3 * rows * cols * 2) as u64;
    let gbs = schema::gbs(bytes, us);
    Record {
        op: op.into(),
        variant: variant.into(),
        dtype: "bf16".into(),
        rows,
        cols,
        imp: imp.into(),
        mode: mode.into(),
        median_us: us,
        gbs,
        pct_of_ceiling: 0.0,
    }
}

pub fn report(ceiling: f64, results: Vec<Record>) -> Report {
    Report {
        gpu: "NVIDIA H200".into(),
        driver: "580.95.05 (CUDA 13.0)".into(),
        date: "2026-11-29T12:00:00Z".into(),
        commit: "abc".into(),
        copy_ceiling_gbs: ceiling,
        device: Some(0),
        results,
        methods: Vec::new(),
    }
}

/// A ferrofuse file and a peers file, as the two programs write them.
pub fn sample() -> (Report, Report) {
    let mut ours = vec![rec(
        OP_EMPTY,
        "launch_floor",
        0,
        0,
        IMPL_FERROFUSE,
        "graph",
        0.5,
    )];
    let mut peers = vec![rec(OP_EMPTY, "launch_floor", 0, 0, "triton", "graph", 0.6)];
    for (rows, us, peer_us) in [(1, 2.0, 2.4), (16, 2.2, 2.3), (16384, 345.0, 340.0)] {
        ours.push(rec(
            "gated_fwd",
            "silu_split",
            rows,
            14336,
            IMPL_FERROFUSE,
            "per_call",
            us,
        ));
        for (k, p) in PEER_IMPLS.iter().enumerate() {
            peers.push(rec(
                "gated_fwd",
                "silu_split",
                rows,
                14336,
                p,
                "per_call",
                peer_us + k as f64,
            ));
        }
    }
    ours.push(rec(
        "gated_fwd",
        "silu_split",
        16,
        14336,
        IMPL_FERROFUSE,
        "graph",
        1.0,
    ));
    peers.push(rec(
        "gated_fwd",
        "silu_split",
        16,
        14336,
        "triton",
        "graph",
        1.5,
    ));
    (report(4240.0, ours), report(4100.0, peers))
}

/// The two files merged, as the report shows them.
pub fn merged() -> Report {
    let (ours, peers) = sample();
    crate::merge::merge(vec![ours, peers]).unwrap().0
}
