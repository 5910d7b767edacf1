//! Merging result files (ferrofuse-bench's and peers.py's) into one report.

use std::collections::BTreeMap;

use ferrofuse_bench_schema::schema::{IMPL_FERROFUSE, Key, OP_COPY, Report, pct_of};

/// Merges result files: the header (and the ceiling every percentage is recomputed against)
/// comes from the file with ferrofuse results, else the first. A record measured twice (same
/// shape, mode and impl) keeps the later file's.
pub fn merge(reports: Vec<Report>) -> Result<(Report, Vec<String>), String> {
    let mut warnings = Vec::new();
    let Some(main) = reports
        .iter()
        .position(|r| r.results.iter().any(|x| x.imp == IMPL_FERROFUSE))
        .or(if reports.is_empty() { None } else { Some(0) })
    else {
        return Err("nothing to merge".into());
    };
    let mut merged = Report {
        results: Vec::new(),
        methods: Vec::new(),
        ..reports[main].clone()
    };
    let mut seen: BTreeMap<(Key, String), usize> = BTreeMap::new();
    for r in &reports {
        if r.gpu != merged.gpu {
            warnings.push(format!(
                "results from different GPUs: {} and {}",
                merged.gpu, r.gpu
            ));
        }
        if r.commit != merged.commit {
            warnings.push(format!(
                "results from different commits: {} and {}",
                merged.commit, r.commit
            ));
        }
        if let (Some(a), Some(b)) = (merged.device, r.device)
            && a != b
        {
            warnings.push(format!("results from different devices: {a} and {b}"));
        }
        merged.methods.extend(r.methods.iter().cloned());
        for rec in &r.results {
            let id = (rec.key(), rec.imp.clone());
            match seen.get(&id) {
                Some(&i) => {
                    warnings.push(format!(
                        "{} {} {} {}x{} {} {} measured twice: keeping the later",
                        rec.op, rec.variant, rec.dtype, rec.rows, rec.cols, rec.mode, rec.imp
                    ));
                    merged.results[i] = rec.clone();
                }
                None => {
                    seen.insert(id, merged.results.len());
                    merged.results.push(rec.clone());
                }
            }
        }
    }
    let ceiling = merged.copy_ceiling_gbs;
    for rec in &mut merged.results {
        if rec.op != OP_COPY || rec.imp != IMPL_FERROFUSE {
            rec.pct_of_ceiling = pct_of(rec.gbs, ceiling);
        }
    }
    warnings.dedup();
    Ok((merged, warnings))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::sample;
    use ferrofuse_bench_schema::schema::PEER_IMPLS;

    #[test]
    fn merge_takes_the_ferrofuse_header_and_recomputes_percentages() {
        let (ours, peers) = sample();
        // The peers file first: the header still comes from the ferrofuse file.
        let (m, warnings) = merge(vec![peers, ours]).unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(m.copy_ceiling_gbs, 4240.0);
        // Three shapes, each for ferrofuse and every peer.
        assert_eq!(m.results.len(), 2 + 3 * (1 + PEER_IMPLS.len()) + 2);
        for r in &m.results {
            assert!((r.pct_of_ceiling - 100.0 * r.gbs / 4240.0).abs() < 1e-9);
        }
        // Round trip through the JSON schema.
        let text = serde_json::to_string(&m).unwrap();
        assert!(text.contains("\"impl\":\"torch_compile\""));
        let back: Report = serde_json::from_str(&text).unwrap();
        assert_eq!(back.results.len(), m.results.len());
        for (a, b) in back.results.iter().zip(&m.results) {
            assert_eq!((a.key(), &a.imp), (b.key(), &b.imp));
            assert!((a.median_us - b.median_us).abs() <= 1e-12 * b.median_us);
        }
    }

    #[test]
    fn merge_keeps_the_later_duplicate_and_warns() {
        let (ours, _) = sample();
        let mut again = ours.clone();
        again.results[1].median_us = 9.0;
        again.commit = "def".into();
        again.device = Some(1);
        let (m, warnings) = merge(vec![ours, again]).unwrap();
        assert_eq!(m.results.len(), 5);
        assert_eq!(m.results[1].median_us, 9.0);
        assert_eq!(m.device, Some(0));
        assert!(warnings.iter().any(|w| w.contains("measured twice")));
        assert!(warnings.iter().any(|w| w.contains("different commits")));
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("different devices: 0 and 1"))
        );
        assert!(merge(vec![]).is_err());
    }

    #[test]
    fn reads_files_without_the_optional_fields() {
        let text = r#"{"gpu": "g", "driver": "d", "date": "t", "commit": "c",
            "copy_ceiling_gbs": 4000.0,
            "results": [{"op": "gated_fwd", "variant": "silu_split", "dtype": "bf16",
              "rows": 1, "cols": 8, "impl": "triton", "mode": "graph", "median_us": 1.0,
              "gbs": 0.048, "pct_of_ceiling": 0.0012}]}"#;
        let r: Report = serde_json::from_str(text).unwrap();
        assert_eq!(r.results[0].imp, "triton");
        assert!(r.methods.is_empty());
        assert_eq!(r.device, None);
    }
}
