//! One quota's verdict from its fill, and the random source behind the probabilistic zone.

use parking_lot::Mutex;

/// What a check or an account decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// No quota of that name: the request passes (creating the quota is how limiting starts).
    Unlimited,
    /// Every quota of the chain let it through.
    Passed,
    /// A quota of the chain rejected it ([`Decision::quota`] names which).
    Rejected,
    /// A quota of the chain in shadow mode ([`crate::Limits::dry_run`]) would have rejected
    /// it ([`Decision::quota`] names which); every enforced quota let it through, so it
    /// passes, counted on every quota of the chain but that one.
    RejectedDryRun,
}

/// The result of [`crate::Limiter::check`] or [`crate::Limiter::account`].
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Passed, rejected or unlimited.
    pub outcome: Outcome,
    /// The quota that rejected (or would have, in shadow mode); `None` on a pass (decided by
    /// the whole chain of the name the caller asked for).
    pub quota: Option<Box<str>>,
    /// Estimated fill of the deciding quota, in units (of the rejecting one when rejected, of
    /// the checked quota when passed).
    pub fill: f64,
    /// Seconds until the rejecting quota's estimated fill drops to `low_burst` (at least 1);
    /// `None` on a pass.
    pub retry_after: Option<u32>,
}

impl Decision {
    pub(crate) fn unlimited() -> Self {
        Decision { outcome: Outcome::Unlimited, quota: None, fill: 0.0, retry_after: None }
    }

    /// `true` when the request may go on (passed or unlimited).
    pub fn allowed(&self) -> bool {
        self.outcome != Outcome::Rejected
    }
}

/// The drop probability `(F - low) / (high - low)` clamped to [0, 1]. `F <= low` passes, also
/// when `low == high` (the hard cutoff): everything above rejects.
#[inline]
pub fn drop_probability(fill: f64, low: u64, high: u64) -> f64 {
    let (low, high) = (low as f64, high as f64);
    if fill <= low {
        0.0
    } else if fill >= high {
        1.0
    } else {
        (fill - low) / (high - low)
    }
}

/// How many standard deviations of a Poisson count of unit requests a measured rate is
/// taken below what was counted.
const CHANCE_Z: f64 = 3.0;

/// [`CHANCE_Z`] standard deviations of the number of unit requests (1000 milli-units each)
/// in `came` milli-units, in milli-units: the part of what came in that a steady stream may
/// have brought by chance, so that what is taken is what came in at least (the lower bound
/// of a 3-sigma interval). Small beside a surge of a busy quota (3 x of 1000/s over a
/// second: 164 units of 3000), most of one at 10/s (a clump of 15 units where 9 were
/// expected measures 3.4 units/s, under the limit).
#[inline]
pub(crate) fn chance(came: f64) -> f64 {
    CHANCE_Z * (1000.0 * came.max(0.0)).sqrt()
}

/// The cluster's attempted `demand` (milli-units/s, metered over `window_ns`), at least:
/// less [`chance`] of what the meter counted, per second.
#[inline]
pub(crate) fn demand_at_least(demand: f64, window_ns: u64) -> f64 {
    let secs = window_ns as f64 * 1e-9;
    demand - chance(demand * secs) / secs
}

/// The share of attempts to turn away when the cluster's attempted `demand` (milli-units/s,
/// metered over `window_ns`) is above `limit`: the part of it above the limit, once the
/// demand is above the limit by more than chance ([`chance`]). A key under its limit on
/// average sends clumps that a 2 s meter reads as up to twice its rate (8.3/s read as
/// 17.5/s in docs/accuracy.md's Zipf keys); taken as they read, they refused it near
/// `low_burst`. Above the test the share is the demand's as read: the lower bound would
/// loosen the steady state of every quota (3 x of 100/s: 0.62 turned away, not 0.67).
#[inline]
pub(crate) fn demand_excess_share(demand: f64, limit: f64, window_ns: u64) -> f64 {
    if demand <= limit {
        return 0.0;
    }
    if demand_at_least(demand, window_ns) > limit {
        1.0 - limit / demand
    } else {
        0.0
    }
}

/// Seconds (at least 1) until `fill` milli-units drain to `low` at `limit` milli-units/s.
///
/// Stable between consecutive calls (a client told to wait must not be told otherwise a moment
/// later): the estimate between syncs is a function
/// of the last synced value and elapsed time, so two requests a millisecond apart get the
/// same answer, and the value only steps down as time passes.
#[inline]
pub fn retry_after_secs(fill: f64, low: u64, limit: f64) -> u32 {
    let secs = ((fill - low as f64) / limit.max(1e-9)).ceil();
    if secs.is_nan() || secs < 1.0 {
        1
    } else if secs >= u32::MAX as f64 {
        u32::MAX
    } else {
        secs as u32
    }
}

/// Uniform numbers in [0, 1) for the probabilistic zone; injectable so tests are
/// deterministic.
pub trait Random: Send + Sync + 'static {
    /// A uniform sample from [0, 1).
    fn unit(&self) -> f64;
}

/// `fastrand`'s per-thread generator: no locking on the request path.
#[derive(Debug, Default, Clone, Copy)]
pub struct ThreadRandom;

impl Random for ThreadRandom {
    fn unit(&self) -> f64 {
        fastrand::f64()
    }
}

/// A seeded generator shared behind a lock: reproducible sequences for tests and simulations.
#[derive(Debug)]
pub struct SeededRandom(Mutex<fastrand::Rng>);

impl SeededRandom {
    /// A generator with this seed.
    pub fn new(seed: u64) -> Self {
        SeededRandom(Mutex::new(fastrand::Rng::with_seed(seed)))
    }
}

impl Random for SeededRandom {
    fn unit(&self) -> f64 {
        self.0.lock().f64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demand_counts_once_it_is_above_the_limit_by_more_than_chance() {
        const W: u64 = 2_000_000_000;
        assert_eq!(demand_excess_share(9_000.0, 10_000.0, W), 0.0);
        // 35 units in 2 s where 20 are the limit: less 3 sigma of a count of 35 (17.7), no
        // more than the limit.
        assert_eq!(demand_excess_share(17_500.0, 10_000.0, W), 0.0);
        // Then as read, not its lower bound.
        assert_eq!(demand_excess_share(25_000.0, 10_000.0, W), 0.6);
        assert_eq!(demand_excess_share(300_000.0, 100_000.0, W), 1.0 - 1.0 / 3.0);
        // A busy quota's demand is hardly discounted: 1.1 x of 1000/s is past chance.
        assert!(demand_excess_share(1_100_000.0, 1_000_000.0, W) > 0.09);
    }

    #[test]
    fn probability_zones() {
        assert_eq!(drop_probability(0.0, 100, 200), 0.0);
        assert_eq!(drop_probability(100.0, 100, 200), 0.0);
        assert_eq!(drop_probability(150.0, 100, 200), 0.5);
        assert_eq!(drop_probability(200.0, 100, 200), 1.0);
        assert_eq!(drop_probability(1e9, 100, 200), 1.0);
        // Hard cutoff.
        assert_eq!(drop_probability(100.0, 100, 100), 0.0);
        assert_eq!(drop_probability(100.001, 100, 100), 1.0);
        assert_eq!(drop_probability(0.0, 0, 0), 0.0);
        assert_eq!(drop_probability(1.0, 0, 0), 1.0);
    }

    #[test]
    fn retry_after_rounds_up_and_is_at_least_one() {
        assert_eq!(retry_after_secs(1_500.0, 1_000, 1_000.0), 1);
        assert_eq!(retry_after_secs(3_000.0, 1_000, 1_000.0), 2);
        assert_eq!(retry_after_secs(3_001.0, 1_000, 1_000.0), 3);
        assert_eq!(retry_after_secs(900.0, 1_000, 1_000.0), 1);
        assert_eq!(retry_after_secs(1e18, 0, 1.0), u32::MAX);
    }

    #[test]
    fn seeded_random_is_reproducible() {
        let a = SeededRandom::new(7);
        let b = SeededRandom::new(7);
        for _ in 0..10 {
            let x = a.unit();
            assert_eq!(x, b.unit());
            assert!((0.0..1.0).contains(&x));
        }
    }
}
