//! Percentiles and means of samples (milliseconds, bytes, anything `f64`),
//! one definition for tests and benches.
//!
//! Percentiles are nearest-rank (the smallest sample with at least `p` of the
//! samples at or below it); the median of an even count is the mean of the
//! middle two. Empty input gives NaN, which formats as "NaN" and compares false.

/// `v` sorted ascending (NaN last).
fn sorted(v: &[f64]) -> Vec<f64> {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v
}

/// The nearest-rank `p` percentile of `v`, `p` in 0.0..=1.0 (0.9 is p90).
pub fn percentile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let v = sorted(v);
    let rank = ((v.len() as f64 * p).ceil() as usize).saturating_sub(1);
    v[rank.min(v.len() - 1)]
}

/// The median of `v`.
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let v = sorted(v);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The arithmetic mean of `v`.
pub fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.iter().sum::<f64>() / v.len() as f64
}

/// The usual summary of a benchmark's samples.
#[derive(Clone, Copy, Debug)]
pub struct Summary {
    pub n: usize,
    pub min: f64,
    pub median: f64,
    pub p90: f64,
    pub max: f64,
    pub mean: f64,
}

/// Summarize `v` (NaN fields when it is empty).
pub fn summarize(v: &[f64]) -> Summary {
    let s = sorted(v);
    Summary {
        n: v.len(),
        min: s.first().copied().unwrap_or(f64::NAN),
        median: median(v),
        p90: percentile(v, 0.9),
        max: s.last().copied().unwrap_or(f64::NAN),
        mean: mean(v),
    }
}
