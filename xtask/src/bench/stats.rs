//! Order statistics of latency samples in milliseconds (nearest rank, no interpolation).

#[derive(Clone, Copy, Debug)]
pub struct Summary {
    pub median: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Summary {
    pub fn of(samples: &[f64]) -> Summary {
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        Summary {
            median: percentile(&sorted, 0.5),
            p90: percentile(&sorted, 0.9),
            p99: percentile(&sorted, 0.99),
            max: sorted.last().copied().unwrap_or(f64::NAN),
        }
    }
}

/// The `q` quantile of already sorted samples; NaN when there are none.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[idx]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let s = Summary::of(&[5.0, 1.0, 3.0, 2.0, 4.0]);
        assert_eq!((s.median, s.max), (3.0, 5.0));
        assert_eq!(s.p90, 5.0);
        assert!(Summary::of(&[]).median.is_nan());
    }
}
