//! Fixed-point quantities and the exact leaky-bucket arithmetic.
//!
//! # Why integers, and why they cannot overflow
//!
//! The article's commenters asked whether float counters drift after months of uptime. They
//! would: adding and draining `f64`s loses low bits on every step, and the error accumulates.
//! So every *stored* quantity here is an integer:
//!
//! * amounts (fills, bursts, weights) are `u64` **milli-units** (1 unit = 1000), the same
//!   fixed-point scale nginx's `limit_req` uses for its rates;
//! * rates (`limit`) are `u64` milli-units per second, so the smallest limit, 0.001/s, is `1`;
//! * time is `u64` nanoseconds since the limiter or root started (584 years before wrapping).
//!
//! The bounds make the arithmetic overflow-free:
//!
//! * `limit <= 1e12` units/s is `<= 1e15` milli-units/s (< 2^50) and a time step of up to
//!   2^64 ns makes the drain product `< 2^114`, computed in `u128`;
//! * bursts are capped at `1e15` units (`1e18` milli-units, below `u64::MAX` ≈ 1.8e19) and a
//!   weight at `1e12` units, and fills add with saturation, so even a stream of maximal
//!   weights can only pin a fill at `u64::MAX`, never wrap it;
//! * the drain keeps the sub-milli-unit remainder ([`LeakyBucket::carry`]), so draining in a
//!   million small steps gives exactly the same fill as draining once over the whole span:
//!   nothing drifts, however long the process runs (see the `drain_is_step_independent`
//!   property test).
//!
//! Decisions *read* a fill through a float estimate (the extrapolation between syncs is a
//! guess anyway); they never write floats back into a counter.

/// Milli-units per unit.
pub const MILLI: u64 = 1_000;
/// Nanoseconds per second.
pub const NANOS_PER_SEC: u64 = 1_000_000_000;
/// Largest accepted `limit`, in units per second.
pub const MAX_LIMIT_UNITS: f64 = 1e12;
/// Smallest accepted `limit`, in units per second.
pub const MIN_LIMIT_UNITS: f64 = 0.001;
/// Largest accepted burst, in units.
pub const MAX_BURST_UNITS: f64 = 1e15;
/// Largest accepted weight of one accounted request, in units.
pub const MAX_WEIGHT_UNITS: u64 = 1_000_000_000_000;

/// Converts a non-negative, finite number of units to milli-units, rounding to nearest.
/// Callers validate the range first.
pub(crate) fn units_to_milli(units: f64) -> u64 {
    (units * MILLI as f64).round() as u64
}

/// Converts milli-units to units for display and JSON.
pub fn milli_to_units(milli: u64) -> f64 {
    milli as f64 / MILLI as f64
}

/// How much a bucket with `rate` milli-units/s drains in `dt` ns, plus the remainder in
/// milli-unit·ns (always `< NANOS_PER_SEC`).
#[inline]
pub fn drained(rate: u64, dt: u64, carry: u64) -> (u64, u64) {
    // Fast path: most products fit in u64 (e.g. 1e6 milli/s over 10 s is 1e16).
    if let Some(p) = rate.checked_mul(dt).and_then(|p| p.checked_add(carry)) {
        return (p / NANOS_PER_SEC, p % NANOS_PER_SEC);
    }
    let p = rate as u128 * dt as u128 + carry as u128;
    let whole = p / NANOS_PER_SEC as u128;
    (u64::try_from(whole).unwrap_or(u64::MAX), (p % NANOS_PER_SEC as u128) as u64)
}

/// A leaky bucket's fill, exact: `fill` milli-units at time `at` ns, draining at the rate
/// passed to [`LeakyBucket::advance`], never below zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeakyBucket {
    /// Current fill in milli-units as of `at`.
    pub fill: u64,
    /// Time of `fill`, ns.
    pub at: u64,
    /// Drain already elapsed but smaller than one milli-unit, in milli-unit·ns.
    pub carry: u64,
}

impl LeakyBucket {
    /// Drains the bucket up to `now`. Time that goes backwards is ignored (the fill is kept).
    pub fn advance(&mut self, now: u64, rate: u64) {
        if now <= self.at {
            return;
        }
        let (whole, rem) = drained(rate, now - self.at, self.carry);
        if whole >= self.fill {
            // An empty bucket wastes the rest of the drain: that is the leaky bucket's floor.
            self.fill = 0;
            self.carry = 0;
        } else {
            self.fill -= whole;
            self.carry = rem;
        }
        self.at = now;
    }

    /// The fill at `now` without changing the bucket.
    pub fn fill_at(&self, now: u64, rate: u64) -> u64 {
        let mut b = *self;
        b.advance(now, rate);
        b.fill
    }

    /// Adds `amount` milli-units (saturating: a fill can stick at `u64::MAX`, never wrap).
    pub fn add(&mut self, amount: u64) {
        self.fill = self.fill.saturating_add(amount);
    }
}

/// Drains `fill` (milli-units) by `rate` over `dt` ns without keeping the remainder.
#[inline]
pub fn drain_once(fill: u64, rate: u64, dt: u64) -> u64 {
    fill.saturating_sub(drained(rate, dt, 0).0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drains_at_rate_and_floors_at_zero() {
        let mut b = LeakyBucket { fill: 10_000, at: 0, carry: 0 };
        b.advance(NANOS_PER_SEC, 4_000); // 4 units/s for 1 s
        assert_eq!(b.fill, 6_000);
        b.advance(3 * NANOS_PER_SEC, 4_000);
        assert_eq!(b.fill, 0);
        assert_eq!(b.carry, 0);
    }

    #[test]
    fn time_going_backwards_changes_nothing() {
        let mut b = LeakyBucket { fill: 500, at: 10, carry: 0 };
        b.advance(5, 1_000_000);
        assert_eq!(b, LeakyBucket { fill: 500, at: 10, carry: 0 });
    }

    #[test]
    fn slow_rate_in_many_small_steps_is_exact() {
        // 0.001 units/s = 1 milli-unit/s; 1000 steps of 1 ms must drain exactly 1 milli-unit.
        let mut b = LeakyBucket { fill: 5, at: 0, carry: 0 };
        for i in 1..=1000 {
            b.advance(i * 1_000_000, 1);
        }
        assert_eq!(b.fill, 4);
        assert_eq!(b.carry, 0);
    }

    #[test]
    fn ten_years_at_max_rate_does_not_overflow() {
        let ten_years_s: u64 = 10 * 365 * 86_400;
        let ten_years = ten_years_s * NANOS_PER_SEC;
        // 1e6 units/s for ten years: exact, in the u128 path.
        let (whole, rem) = drained(units_to_milli(1e6), ten_years, 0);
        assert_eq!(whole, 1_000_000_000 * ten_years_s);
        assert_eq!(rem, 0);
        // The maximal rate drains more than any fill can hold: saturates, empties the bucket.
        let rate = units_to_milli(MAX_LIMIT_UNITS);
        let (whole, rem) = drained(rate, ten_years, NANOS_PER_SEC - 1);
        assert_eq!(whole, u64::MAX);
        assert!(rem < NANOS_PER_SEC);
        let mut b = LeakyBucket { fill: u64::MAX - 5, at: 0, carry: 0 };
        b.add(units_to_milli(MAX_WEIGHT_UNITS as f64));
        assert_eq!(b.fill, u64::MAX);
        b.advance(ten_years, rate);
        assert_eq!(b.fill, 0);
    }

    #[test]
    fn unit_conversions_round_to_milli() {
        assert_eq!(units_to_milli(0.001), 1);
        assert_eq!(units_to_milli(1e12), 1_000_000_000_000_000);
        assert_eq!(units_to_milli(2.0004), 2_000);
        assert_eq!(milli_to_units(1_500), 1.5);
    }
}
