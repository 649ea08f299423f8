//! Figures of merit computed from one run's per-second series.

use crate::cluster::RunResult;
use std::ops::Range;

impl RunResult {
    fn window(&self, secs: Range<usize>) -> &[f64] {
        let end = secs.end.min(self.admitted.len());
        &self.admitted[secs.start.min(end)..end]
    }

    /// Mean admitted per second over `secs`, as a multiple of the limit.
    pub fn mean_ratio(&self, secs: Range<usize>) -> f64 {
        let w = self.window(secs);
        if w.is_empty() {
            return 0.0;
        }
        w.iter().sum::<f64>() / w.len() as f64 / self.limit
    }

    /// Coefficient of variation of the admitted weight per second over `secs` (the "saw").
    pub fn cv(&self, secs: Range<usize>) -> f64 {
        cv_of(self.window(secs))
    }

    /// The same per `per` seconds (whole spans only): at a limit of a few per second the
    /// per-second figure is all Poisson noise.
    pub fn cv_per(&self, secs: Range<usize>, per: usize) -> f64 {
        let sums: Vec<f64> =
            self.window(secs).chunks_exact(per.max(1)).map(|c| c.iter().sum()).collect();
        cv_of(&sums)
    }

    /// Admitted during the 2 s from `step_s`, as a multiple of what the limit allows in 2 s.
    pub fn reaction(&self, step_s: usize) -> f64 {
        self.mean_ratio(step_s..step_s + 2)
    }

    /// Admitted above the limit, summed over the seconds of `secs`, in seconds of the limit.
    pub fn excess(&self, secs: Range<usize>) -> f64 {
        self.window(secs).iter().map(|a| (a - self.limit).max(0.0)).sum::<f64>() / self.limit
    }

    /// Seconds from `stop_s` to the last rejection after it (0 when none).
    pub fn echo(&self, stop_s: f64) -> f64 {
        self.rejection_times.last().map_or(0.0, |&t| (t - stop_s).max(0.0))
    }

    /// Admitted weight over `secs`.
    pub fn admitted_in(&self, secs: Range<usize>) -> f64 {
        self.window(secs).iter().sum()
    }

    /// The most weight admitted in any `len` consecutive whole seconds within `secs` (all
    /// of `secs` when it is shorter).
    pub fn max_admitted_in_any(&self, len: usize, secs: Range<usize>) -> f64 {
        let a = self.window(secs);
        let len = len.clamp(1, a.len().max(1));
        // Whole requests: the running sum stays exact.
        let mut sum: f64 = a.iter().take(len).sum();
        let mut best = sum;
        for i in len..a.len() {
            sum += a[i] - a[i - len];
            best = best.max(sum);
        }
        best
    }

    /// Rejected weight over `secs`.
    pub fn rejected_in(&self, secs: Range<usize>) -> f64 {
        let end = secs.end.min(self.rejected.len());
        self.rejected[secs.start.min(end)..end].iter().sum()
    }
}

/// The coefficient of variation of `w` (population), 0 when it is empty or its mean is 0.
fn cv_of(w: &[f64]) -> f64 {
    if w.is_empty() {
        return 0.0;
    }
    let n = w.len() as f64;
    let mean = w.iter().sum::<f64>() / n;
    if mean == 0.0 {
        return 0.0;
    }
    let var = w.iter().map(|a| (a - mean).powi(2)).sum::<f64>() / n;
    var.sqrt() / mean
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_in_any_window_slides_by_the_second_within_the_range() {
        let r = RunResult { admitted: vec![5.0, 0.0, 3.0, 4.0, 0.0, 9.0], ..Default::default() };
        assert_eq!(r.max_admitted_in_any(2, 0..6), 9.0);
        assert_eq!(r.max_admitted_in_any(3, 0..6), 13.0);
        assert_eq!(r.max_admitted_in_any(2, 0..5), 7.0);
        assert_eq!(r.max_admitted_in_any(10, 1..4), 7.0);
        assert_eq!(r.admitted_in(2..4), 7.0);
    }
}
