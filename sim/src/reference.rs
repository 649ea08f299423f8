//! Reference algorithms the report compares yarl-core with. They are not the product: they
//! exist to put its numbers next to what the usual alternatives give on the same traffic.

use yarl_core::Limits;

/// A token bucket refilled at `rate` per second up to `cap` (nginx `limit_req` with `burst`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenBucket {
    rate: f64,
    cap: f64,
    tokens: f64,
    at: f64,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(rate: f64, cap: f64) -> Self {
        TokenBucket { rate, cap, tokens: cap, at: 0.0 }
    }

    /// Takes `w` tokens at time `t` (seconds) if there are that many.
    pub fn take(&mut self, t: f64, w: f64) -> bool {
        self.tokens = (self.tokens + (t - self.at).max(0.0) * self.rate).min(self.cap);
        self.at = self.at.max(t);
        if self.tokens >= w {
            self.tokens -= w;
            true
        } else {
            false
        }
    }
}

/// At most `limit · window` per calendar window, counted exactly in one place.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FixedWindow {
    budget: f64,
    window: f64,
    index: i64,
    count: f64,
}

impl FixedWindow {
    /// `limit` per second, windows of `window` seconds.
    pub fn new(limit: f64, window: f64) -> Self {
        FixedWindow { budget: limit * window, window, index: -1, count: 0.0 }
    }

    /// `limits`' limit per window of its length, windows counted from `t = 0` (the
    /// bursts mean nothing to it). With `t = 0` at midnight and a window of a day, the
    /// classic "N per calendar day, reset at midnight".
    pub fn from_limits(limits: &Limits) -> Self {
        FixedWindow {
            budget: limits.limit_units(),
            window: limits.window_secs() as f64,
            index: -1,
            count: 0.0,
        }
    }

    /// Admits `w` at `t` if the current window has room.
    pub fn take(&mut self, t: f64, w: f64) -> bool {
        let i = (t / self.window).floor() as i64;
        if i != self.index {
            self.index = i;
            self.count = 0.0;
        }
        if self.count + w <= self.budget {
            self.count += w;
            true
        } else {
            false
        }
    }
}

/// The sliding-window approximation: the count of the last `window` seconds estimated from two fixed windows,
/// `previous · (1 - elapsed / window) + current`, counted exactly in one place.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlidingWindow {
    budget: f64,
    window: f64,
    index: i64,
    current: f64,
    previous: f64,
}

impl SlidingWindow {
    /// `limit` per second over a sliding `window` seconds.
    pub fn new(limit: f64, window: f64) -> Self {
        SlidingWindow { budget: limit * window, window, index: -1, current: 0.0, previous: 0.0 }
    }

    /// Admits `w` at `t` if the estimated count of the last window leaves room.
    pub fn take(&mut self, t: f64, w: f64) -> bool {
        let i = (t / self.window).floor() as i64;
        if i != self.index {
            self.previous = if i == self.index + 1 { self.current } else { 0.0 };
            self.current = 0.0;
            self.index = i;
        }
        let elapsed = t / self.window - i as f64;
        let estimate = self.previous * (1.0 - elapsed) + self.current;
        if estimate + w <= self.budget {
            self.current += w;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_bucket_holds_its_rate_after_the_burst() {
        let mut b = TokenBucket::new(10.0, 5.0);
        let passed = (0..1000).filter(|&i| b.take(i as f64 * 0.01, 1.0)).count();
        // 5 of burst plus 10/s over ~10 s.
        assert!((100..=106).contains(&passed), "{passed}");
    }

    #[test]
    fn fixed_window_resets_each_window() {
        let mut f = FixedWindow::new(3.0, 1.0);
        assert_eq!((0..5).filter(|_| f.take(0.5, 1.0)).count(), 3);
        assert!(f.take(1.0, 1.0));
    }

    /// The daily quota of the report: 1000 per day, with the windowed defaults.
    fn per_day() -> Limits {
        yarl_core::QuotaSpec {
            limit: Some(1000.0),
            per: Some("1d".into()),
            low_burst: None,
            high_burst: None,
            parent: None,
            dry_run: false,
            max_in_flight: None,
        }
        .validate("daily")
        .expect("valid spec")
    }

    #[test]
    fn daily_fixed_window_resets_at_midnight_and_not_before() {
        let mut f = FixedWindow::from_limits(&per_day());
        // 1000 at 09:00, and nothing more until the end of the day.
        assert_eq!((0..1500).filter(|_| f.take(9.0 * 3600.0, 1.0)).count(), 1000);
        assert!(!f.take(86_399.999, 1.0));
        // 00:00 of day 2: a fresh 1000, and again nothing more that day.
        assert_eq!((0..1500).filter(|_| f.take(86_400.0, 1.0)).count(), 1000);
        assert!(!f.take(2.0 * 86_400.0 - 0.001, 1.0));
        assert!(f.take(2.0 * 86_400.0, 1.0));
    }

    #[test]
    fn daily_ideal_bucket_admits_the_limit_at_once_then_one_per_window_over_limit() {
        let mut b = IdealBucket::from_limits(&per_day(), 1);
        // Idle: exactly `limit` at once (low_burst = 999 lets the 1000th in, high = 1000
        // stops the 1001st).
        assert_eq!((0..1500).filter(|_| b.take(0.0, 1.0)).count(), 1000);
        // Full; 86.4 s later it has drained one request's worth below `low_burst`.
        assert!(!b.take(0.0, 1.0));
        assert!(b.take(86.5, 1.0));
        // Asked every second, it passes one each 86.4 s on average (41.7 an hour: the fill
        // stays within a request of `low_burst`, in the drop zone).
        let hour = (0..3600).filter(|&s| b.take(100.0 + s as f64, 1.0)).count();
        assert!((40..=43).contains(&hour), "{hour} in an hour");
    }

    #[test]
    fn a_following_bucket_adds_past_its_bursts_and_drains() {
        // It follows another limiter's admissions: nothing is refused, even over `high`.
        let mut b = IdealBucket::new(10.0, 15.0, 30.0, 1);
        for _ in 0..40 {
            b.add(1.0, 1.0);
        }
        assert_eq!(b.fill_at(1.0), 40.0);
        assert_eq!(b.fill_at(3.0), 20.0);
        // A time before the latest does not refill it.
        b.add(0.5, 1.0);
        assert_eq!(b.fill_at(1.0), 41.0);
        assert_eq!(b.fill_at(10.0), 0.0);
    }

    #[test]
    fn sliding_window_weighs_the_previous_window() {
        let mut s = SlidingWindow::new(10.0, 1.0);
        assert_eq!((0..20).filter(|_| s.take(0.9, 1.0)).count(), 10);
        // A quarter into the next window 75% of the previous 10 still count: 2 more fit.
        assert_eq!((0..20).filter(|_| s.take(1.25, 1.0)).count(), 2);
    }
}

/// One exact leaky bucket for the whole cluster with yarl's drop zone: a request passes at
/// a fill at or below `low`, is refused at `high` or above, and in between is refused with
/// probability `(F - low) / (high - low)`. What yarl decides with perfect, instant
/// knowledge of every host's traffic; a round trip per request in practice.
#[derive(Debug, Clone)]
pub struct IdealBucket {
    limit: f64,
    low: f64,
    high: f64,
    fill: f64,
    at: f64,
    rng: fastrand::Rng,
}

impl IdealBucket {
    /// An empty bucket draining `limit` per second.
    pub fn new(limit: f64, low: f64, high: f64, seed: u64) -> Self {
        IdealBucket { limit, low, high, fill: 0.0, at: 0.0, rng: fastrand::Rng::with_seed(seed) }
    }

    /// An empty bucket with `limits`' numbers: the same drain (units per second, a window's
    /// limit spread over it) and bursts as yarl's.
    pub fn from_limits(limits: &Limits, seed: u64) -> Self {
        IdealBucket::new(
            limits.limit_units() / limits.window_secs() as f64,
            limits.low_burst_units(),
            limits.high_burst_units(),
            seed,
        )
    }

    /// The fill a request at `t` finds.
    pub fn fill_at(&self, t: f64) -> f64 {
        (self.fill - (t - self.at).max(0.0) * self.limit).max(0.0)
    }

    /// The chance that a request at `t` is refused: 0 up to `low`, rising to 1 at `high`.
    fn refusal_chance(&self, t: f64) -> f64 {
        let fill = self.fill_at(t);
        if fill <= self.low {
            0.0
        } else if fill >= self.high {
            1.0
        } else {
            (fill - self.low) / (self.high - self.low)
        }
    }

    /// Adds `w` at `t` undecided: a bucket that follows what another limiter admitted. Times
    /// come in order (the simulation's events); one before the latest drains nothing.
    pub fn add(&mut self, t: f64, w: f64) {
        self.fill = self.fill_at(t) + w;
        self.at = self.at.max(t);
    }

    /// Decides `w` at `t`, adding it when it passes.
    pub fn take(&mut self, t: f64, w: f64) -> bool {
        let p = self.refusal_chance(t);
        self.fill = (self.fill - (t - self.at).max(0.0) * self.limit).max(0.0);
        self.at = self.at.max(t);
        if p > 0.0 && (p >= 1.0 || self.rng.f64() < p) {
            return false;
        }
        self.fill += w;
        true
    }
}
