//! The arithmetic of the timing method, kept apart from the GPU so it is tested on the CPU.
//!
//! It follows `triton.testing.do_bench` (per call) and `do_bench_cudagraph` (graph) of Triton
//! 3.6, so both sides of the comparison count the same way:
//! - estimate one call from 5 calls (per call: each after an L2 flush, the flush included);
//! - per call: `max(1, warmup / estimate)` untimed calls, then `max(1, rep / estimate)` timed
//!   calls, each after an L2 flush, each between its own pair of events;
//! - graph: `max(1, rep / estimate)` calls captured back to back into one graph, replayed 10
//!   times between a pair of events, each replay's time divided by the number of calls;
//! - report the median (`statistics.median`, which Triton 3.6 uses: the mean of the two middle
//!   values for an even count).

/// Replays of the captured graph in graph mode (do_bench_cudagraph's `n_retries`).
pub const GRAPH_REPLAYS: usize = 10;

/// Calls used to estimate one call's time before choosing the counts.
pub const ESTIMATE_CALLS: usize = 5;

/// Largest number of calls captured in one graph: bounds capture time and memory when the
/// estimate is tiny (do_bench_cudagraph has no bound; at the default budgets it stays below).
pub const MAX_GRAPH_CALLS: usize = 20_000;

/// Largest number of timed calls per call mode (two events each).
pub const MAX_TIMED_CALLS: usize = 20_000;

/// How many calls fit in `budget_ms` at `estimate_ms` each, at least 1 (`int(budget / est)`
/// in do_bench, which divides by zero for a zero estimate; 1000 then, as do_bench_cudagraph).
pub fn calls_for(budget_ms: f64, estimate_ms: f64, max: usize) -> usize {
    if estimate_ms <= 0.0 || !estimate_ms.is_finite() {
        return 1000.min(max);
    }
    let n = (budget_ms / estimate_ms).floor();
    if n < 1.0 { 1 } else { (n as usize).min(max) }
}

/// The median as Python's `statistics.median` computes it: the middle value, or the mean of
/// the two middle values for an even count. NaNs sort last. `None` for an empty slice.
pub fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// `YYYY-MM-DDTHH:MM:SSZ` for `secs` seconds after the Unix epoch (UTC).
pub fn iso8601_utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Howard Hinnant's `civil_from_days`: days since 1970-01-01 to (year, month, day).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Relative L2 error `||out - ref|| / ||ref||`; NaN (never passes a `<` check) if any output
/// is not finite while its reference is.
pub fn rel_l2_error(out: &[f64], reference: &[f64]) -> f64 {
    assert_eq!(out.len(), reference.len());
    let mut num = 0.0;
    let mut den = 0.0;
    for (&o, &r) in out.iter().zip(reference) {
        if !o.is_finite() && r.is_finite() {
            return f64::NAN;
        }
        num += (o - r) * (o - r);
        den += r * r;
    }
    if den == 0.0 {
        return num.sqrt();
    }
    (num / den).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_do_bench() {
        // int(100 / 0.08) = 1250 timed calls for an 80 us flush + call.
        assert_eq!(calls_for(100.0, 0.08, MAX_TIMED_CALLS), 1250);
        assert_eq!(calls_for(25.0, 0.08, MAX_TIMED_CALLS), 312);
        // Slower than the budget: still one call.
        assert_eq!(calls_for(100.0, 250.0, MAX_TIMED_CALLS), 1);
        assert_eq!(calls_for(20.0, 0.0, MAX_GRAPH_CALLS), 1000);
        assert_eq!(calls_for(20.0, 1e-6, MAX_GRAPH_CALLS), MAX_GRAPH_CALLS);
    }

    #[test]
    fn median_is_statistics_median() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0]), Some(3.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[5.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median(&[1.0, f64::NAN, 2.0]), Some(2.0));
    }

    #[test]
    fn dates() {
        assert_eq!(iso8601_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(iso8601_utc(951_782_400), "2000-02-29T00:00:00Z");
        // 2026-11-29 12:34:56 UTC
        assert_eq!(iso8601_utc(1_795_955_696), "2026-11-29T12:34:56Z");
    }

    #[test]
    fn relative_error() {
        assert_eq!(rel_l2_error(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        let e = rel_l2_error(&[3.0, 4.1], &[3.0, 4.0]);
        assert!((e - 0.02).abs() < 1e-12);
        assert!(rel_l2_error(&[f64::NAN], &[1.0]).is_nan());
        assert!(rel_l2_error(&[f64::INFINITY], &[1.0]).is_nan());
    }
}
