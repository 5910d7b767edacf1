//! The per-op tables (terminal text or Markdown), the launch floor and ceiling lines, and how
//! the results stand against the targets set for this work.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use ferrofuse_bench_schema::schema::{
    IMPL_FERROFUSE, OP_COPY, OP_EMPTY, PEER_IMPLS, Record, Report,
};
use ferrofuse_bench_schema::shapes::{Op, models_for};

/// Whether the op (by name) is a backward one.
fn is_backward(op: &str) -> bool {
    Op::parse(op).is_some_and(|o| o.is_backward())
}

/// The ops' names in the order the report shows them (`Op::ALL`'s).
pub fn op_names() -> impl Iterator<Item = &'static str> {
    Op::ALL.iter().map(|o| o.name())
}

fn peer_label(imp: &str) -> &str {
    match imp {
        "torch_eager" => "eager",
        "torch_compile" => "compile",
        other => other,
    }
}

/// One line of a per-op table: a shape and mode, ours and the peers.
#[derive(Debug, PartialEq)]
struct Row {
    variant: String,
    dtype: String,
    rows: usize,
    cols: usize,
    mode: String,
    ours: Option<Record>,
    /// `median_us` per peer impl present.
    peers: BTreeMap<String, f64>,
}

impl Row {
    /// Best peer time over ours (> 1: we are faster).
    fn vs_best(&self) -> Option<f64> {
        let ours = self.ours.as_ref()?;
        let best = self.peers.values().copied().fold(f64::INFINITY, f64::min);
        best.is_finite().then(|| best / ours.median_us)
    }
}

fn rows_of(report: &Report, op: &str) -> Vec<Row> {
    let mut map: BTreeMap<(String, String, usize, bool, usize), Row> = BTreeMap::new();
    for r in report.results.iter().filter(|r| r.op == op) {
        // Order: variant, dtype, cols, per_call before graph, rows.
        let row = map
            .entry((
                r.variant.clone(),
                r.dtype.clone(),
                r.cols,
                r.mode != "per_call",
                r.rows,
            ))
            .or_insert_with(|| Row {
                variant: r.variant.clone(),
                dtype: r.dtype.clone(),
                rows: r.rows,
                cols: r.cols,
                mode: r.mode.clone(),
                ours: None,
                peers: BTreeMap::new(),
            });
        if r.imp == IMPL_FERROFUSE {
            row.ours = Some(r.clone());
        } else {
            row.peers.insert(r.imp.clone(), r.median_us);
        }
    }
    map.into_values().collect()
}

/// The models with this shape, by name (`LLaMA-3-8B, Mistral-7B`), or nothing.
pub fn models_label(op: &str, variant: &str, cols: usize) -> String {
    match Op::parse(op) {
        Some(o) => models_for(o, variant, cols).join(", "),
        None => String::new(),
    }
}

/// The per-op tables, the launch floor and ceiling lines, and the targets check, as aligned
/// text (or Markdown).
pub fn render_tables(report: &Report, markdown: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}ferrofuse benchmark on {}, driver {}, commit {}, {}",
        if markdown { "## " } else { "" },
        report.gpu,
        report.driver,
        report.commit,
        report.date
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "copy ceiling: {:.0} GB/s (device-to-device copy, bytes read + written); ratios are a peer's median time over ours (> 1: ferrofuse faster); `!` marks a peer more than 2% faster",
        report.copy_ceiling_gbs
    );
    for copy in report
        .results
        .iter()
        .filter(|r| r.op == OP_COPY && r.imp != IMPL_FERROFUSE)
    {
        let _ = writeln!(out, "copy measured by {}: {:.0} GB/s", copy.imp, copy.gbs);
    }
    let floor: Vec<String> = report
        .results
        .iter()
        .filter(|r| r.op == OP_EMPTY)
        .map(|r| format!("{} {} {:.2} us", r.imp, r.mode, r.median_us))
        .collect();
    if !floor.is_empty() {
        let _ = writeln!(out, "launch floor (empty kernel): {}", floor.join(", "));
    }
    let peers_present: Vec<&str> = PEER_IMPLS
        .iter()
        .copied()
        .filter(|p| {
            report
                .results
                .iter()
                .any(|r| r.imp == *p && op_names().any(|o| o == r.op))
        })
        .collect();
    for op in op_names() {
        let rows = rows_of(report, op);
        if rows.is_empty() {
            continue;
        }
        let mut header: Vec<String> = [
            "variant",
            "dtype",
            "rows x cols",
            "mode",
            "ours us",
            "GB/s",
            "%ceil",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        for p in &peers_present {
            header.push(format!("{} x", peer_label(p)));
        }
        header.push("best x".into());
        header.push("models".into());
        let mut table = vec![header];
        for r in &rows {
            let (us, g, pct) = match &r.ours {
                Some(o) => (
                    format!("{:.2}", o.median_us),
                    format!("{:.0}", o.gbs),
                    format!("{:.1}", o.pct_of_ceiling),
                ),
                None => ("-".into(), "-".into(), "-".into()),
            };
            let mut line = vec![
                r.variant.clone(),
                r.dtype.clone(),
                format!("{} x {}", r.rows, r.cols),
                r.mode.clone(),
                us,
                g,
                pct,
            ];
            for p in &peers_present {
                line.push(match (r.peers.get(*p), &r.ours) {
                    (Some(t), Some(o)) => format!("{:.2}", t / o.median_us),
                    (Some(t), None) => format!("({t:.2} us)"),
                    _ => "-".into(),
                });
            }
            line.push(match r.vs_best() {
                Some(x) if x < 0.98 => format!("{x:.2} !"),
                Some(x) => format!("{x:.2}"),
                None => "-".into(),
            });
            line.push(models_label(op, &r.variant, r.cols));
            table.push(line);
        }
        let _ = writeln!(out);
        let _ = writeln!(out, "{}{op}", if markdown { "### " } else { "== " });
        let _ = writeln!(out);
        out.push_str(&format_table(&table, markdown));
    }
    out.push_str(&render_targets(report, markdown));
    out
}

fn format_table(table: &[Vec<String>], markdown: bool) -> String {
    let cols = table.iter().map(|r| r.len()).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            table
                .iter()
                .map(|r| r.get(c).map_or(0, |s| s.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for (i, row) in table.iter().enumerate() {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(c, s)| {
                // Text columns left, numbers right.
                if c < 4 || c + 1 == row.len() {
                    format!("{s:<w$}", w = widths[c])
                } else {
                    format!("{s:>w$}", w = widths[c])
                }
            })
            .collect();
        if markdown {
            let _ = writeln!(out, "| {} |", cells.join(" | "));
            if i == 0 {
                let sep: Vec<String> = (0..cells.len())
                    .map(|c| {
                        if c < 4 || c + 1 == cells.len() {
                            "---".into()
                        } else {
                            "---:".into()
                        }
                    })
                    .collect();
                let _ = writeln!(out, "| {} |", sep.join(" | "));
            }
        } else {
            let _ = writeln!(out, "{}", cells.join("  ").trim_end());
        }
    }
    out
}

/// How the results stand against the targets set for this work (reported, never asserted).
fn render_targets(report: &Report, markdown: bool) -> String {
    struct Target {
        what: &'static str,
        met: usize,
        total: usize,
        misses: Vec<String>,
    }
    let mut targets = Vec::new();
    let all_rows: Vec<(String, Row)> = op_names()
        .flat_map(|op| rows_of(report, op).into_iter().map(|r| (op.to_string(), r)))
        .collect();
    let label = |op: &str, r: &Row| {
        format!(
            "{op} {} {} {}x{} {}",
            r.variant, r.dtype, r.rows, r.cols, r.mode
        )
    };
    let mut check = |what: &'static str,
                     applies: &dyn Fn(&str, &Row) -> bool,
                     value: &dyn Fn(&Row) -> Option<f64>,
                     min: f64,
                     fmt: &dyn Fn(f64) -> String| {
        let mut t = Target {
            what,
            met: 0,
            total: 0,
            misses: Vec::new(),
        };
        for (op, r) in &all_rows {
            if !applies(op, r) {
                continue;
            }
            let Some(v) = value(r) else { continue };
            t.total += 1;
            if v >= min {
                t.met += 1;
            } else {
                t.misses.push(format!("{} ({})", label(op, r), fmt(v)));
            }
        }
        if t.total > 0 {
            targets.push(t);
        }
    };
    let bf16_per_call = |r: &Row| r.dtype == "bf16" && r.mode == "per_call";
    check(
        "gated bf16 per_call at 16384 tokens >= 4100 GB/s",
        &|op, r| op == "gated_fwd" && bf16_per_call(r) && r.rows == 16384,
        &|r| r.ours.as_ref().map(|o| o.gbs),
        4100.0,
        &|v| format!("{v:.0} GB/s"),
    );
    check(
        "add+RMSNorm bf16 per_call at 16384 tokens >= 4050 GB/s",
        &|op, r| op == "add_rmsnorm_fwd" && bf16_per_call(r) && r.rows == 16384,
        &|r| r.ours.as_ref().map(|o| o.gbs),
        4050.0,
        &|v| format!("{v:.0} GB/s"),
    );
    check(
        "bf16 per_call at 4096 and 16384 tokens >= 0.98 x best peer",
        &|op, r| !is_backward(op) && bf16_per_call(r) && (r.rows == 4096 || r.rows == 16384),
        &|r| r.vs_best(),
        0.98,
        &|v| format!("{v:.2} x"),
    );
    check(
        "graph mode, 16 to 1024 tokens >= 1.10 x best peer",
        &|op, r| {
            !is_backward(op)
                && r.dtype == "bf16"
                && r.mode == "graph"
                && (16..=1024).contains(&r.rows)
        },
        &|r| r.vs_best(),
        1.10,
        &|v| format!("{v:.2} x"),
    );
    check(
        "1 and 4 tokens: no slower than the best peer",
        &|op, r| !is_backward(op) && r.dtype == "bf16" && r.rows <= 4,
        &|r| r.vs_best(),
        1.0,
        &|v| format!("{v:.2} x"),
    );
    check(
        "no shape where a peer is more than 2% faster",
        &|_, _| true,
        &|r| r.vs_best(),
        0.98,
        &|v| format!("{v:.2} x"),
    );
    let mut out = String::new();
    if targets.is_empty() {
        return out;
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{}targets (reported, not asserted)",
        if markdown { "### " } else { "== " }
    );
    let _ = writeln!(out);
    for t in targets {
        let _ = writeln!(
            out,
            "{}{}: {}/{} {}",
            if markdown { "- " } else { "" },
            t.what,
            t.met,
            t.total,
            if t.misses.is_empty() {
                "met"
            } else {
                "met; missed:"
            }
        );
        let indent = if markdown { "  - " } else { "    " };
        for m in t.misses.iter().take(12) {
            let _ = writeln!(out, "{indent}{m}");
        }
        if t.misses.len() > 12 {
            let _ = writeln!(out, "{indent}... and {} more", t.misses.len() - 12);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::merge::merge;
    use crate::sample::{merged, sample};

    #[test]
    fn tables_show_ratios_and_flag_slower_shapes() {
        let m = merged();
        let text = render_tables(&m, false);
        assert!(text.contains("== gated_fwd"));
        assert!(text.contains(
            "launch floor (empty kernel): ferrofuse graph 0.50 us, triton graph 0.60 us"
        ));
        // 1 token: eager 2.4 / 2.0 = 1.20; 16384 tokens: best peer 340 / 345 = 0.986, shown as
        // 0.99 and not flagged (the flag is for more than 2% slower).
        let line1 = text.lines().find(|l| l.contains("1 x 14336")).unwrap();
        assert!(line1.contains("1.20"), "{line1}");
        let big = text.lines().find(|l| l.contains("16384 x 14336")).unwrap();
        assert!(big.contains("0.99") && !big.contains('!'), "{big}");
        assert!(big.contains("LLaMA-3-8B, Mistral-7B"));
        // Graph mode at 16 tokens: triton 1.5 / 1.0.
        let graph = text
            .lines()
            .find(|l| l.contains("16 x 14336") && l.contains("graph"))
            .unwrap();
        assert!(graph.contains("1.50"), "{graph}");
        assert!(text.contains("graph mode, 16 to 1024 tokens >= 1.10 x best peer: 1/1 met"));
        assert!(
            text.contains("gated bf16 per_call at 16384 tokens >= 4100 GB/s: 0/1 met; missed:")
        );
        let md = render_tables(&m, true);
        assert!(md.contains("### gated_fwd"));
        assert!(md.contains("| --- |") || md.contains("| --- | ---"));
    }

    #[test]
    fn flags_a_faster_peer() {
        let (mut ours, peers) = sample();
        ours.results[1].median_us = 3.0; // 1 token: best peer 2.4 / 3.0 = 0.8
        let (m, _) = merge(vec![ours, peers]).unwrap();
        let text = render_tables(&m, false);
        let line1 = text.lines().find(|l| l.contains("1 x 14336")).unwrap();
        assert!(line1.contains("0.80 !"), "{line1}");
        assert!(text.contains("1 and 4 tokens: no slower than the best peer: 0/1 met; missed:"));
    }
}
