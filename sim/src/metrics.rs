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
        let w = self.window(secs);
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

    /// Rejected weight over `secs`.
    pub fn rejected_in(&self, secs: Range<usize>) -> f64 {
        let end = secs.end.min(self.rejected.len());
        self.rejected[secs.start.min(end)..end].iter().sum()
    }
}
