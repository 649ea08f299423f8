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
//! * rates (`limit`) are a [`Rate`]: `u64` milli-units per **window** of 1 s to 30 days, so
//!   "1,000 a day" is exactly 1,000,000 milli-units per 86,400 s (not 0.012/s rounded), and
//!   the smallest, 0.001 per window, is `1`;
//! * time is `u64` nanoseconds since the limiter or root started (584 years before wrapping).
//!
//! The bounds make the arithmetic overflow-free:
//!
//! * `limit <= 1e12` units per window is `<= 1e15` milli-units (< 2^50) and a time step of up
//!   to 2^64 ns makes the drain product `< 2^114`, computed in `u128` and divided by the
//!   window in ns (at most 30 days, `< 2^52`), whose remainder is the carry;
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

/// Longest window of a [`Rate`], seconds: 30 days (a month, as quotas count one).
pub const MAX_WINDOW_SECS: u64 = 30 * 86_400;

/// Bits of a [`Rate`] word that hold the milli-units per window.
const RATE_MILLI_BITS: u32 = 50;
const RATE_MILLI_MASK: u64 = (1 << RATE_MILLI_BITS) - 1;
/// Seconds in each unit a window code counts in: `s`, `m`, `h`, `d`.
const WINDOW_UNITS: [u64; 4] = [1, 60, 3_600, 86_400];
/// Most units a window code counts.
const WINDOW_MAX_COUNT: u64 = 4_095;

/// A drain rate: milli-units per window, exact. One `u64` (a zone word, a counter field,
/// the wire's `limit`): the low 50 bits hold the milli-units per window (at most 1e15), the
/// top 14 the window, 0 for one second (so a per-second rate's word is its milli-units/s,
/// as it always was), else a unit (2 bits: s, m, h, d) and a count of them from 1 to 4095
/// (12 bits): every window up to 4095 s, whole minutes up to 4095 min, whole hours or days
/// up to 30 days.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Rate(u64);

/// Why a window cannot be a [`Rate`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WindowError {
    /// Not from 1 s to 30 days.
    #[error("the window must be from 1s to 30d, got {0} s")]
    OutOfRange(u64),
    /// Longer than 4095 s and not whole minutes, or longer than 4095 min and not whole hours.
    #[error(
        "a window of {0} s cannot be stored: above 4095s it must be whole minutes, above \
         4095m whole hours"
    )]
    Inexact(u64),
}

impl Rate {
    /// `milli` milli-units (1 to 1e15, checked by [`crate::Limits`]) per `window_secs`.
    pub fn new(milli: u64, window_secs: u64) -> Result<Rate, WindowError> {
        Ok(Rate(milli & RATE_MILLI_MASK | Self::window_code(window_secs)? << RATE_MILLI_BITS))
    }

    /// `milli` milli-units per second.
    pub const fn per_second(milli: u64) -> Rate {
        Rate(milli & RATE_MILLI_MASK)
    }

    fn window_code(secs: u64) -> Result<u64, WindowError> {
        if !(1..=MAX_WINDOW_SECS).contains(&secs) {
            return Err(WindowError::OutOfRange(secs));
        }
        if secs == 1 {
            return Ok(0);
        }
        // The largest unit that counts the window exactly.
        (0..4)
            .rev()
            .find(|&u| {
                secs.is_multiple_of(WINDOW_UNITS[u]) && secs / WINDOW_UNITS[u] <= WINDOW_MAX_COUNT
            })
            .map(|u| ((u as u64) << 12) | (secs / WINDOW_UNITS[u]))
            .ok_or(WindowError::Inexact(secs))
    }

    /// The rate a word holds, as [`Rate::word`] made it (zone words, counters, the wire);
    /// `None` for a window code no rate has.
    pub fn from_word(word: u64) -> Option<Rate> {
        // Canonical codes only, so that one rate has one word (rates compare by word).
        let code = word >> RATE_MILLI_BITS;
        (code == 0 || Self::window_code(Self::window_of(code)) == Ok(code)).then_some(Rate(word))
    }

    /// The word that stores it.
    #[inline]
    pub const fn word(self) -> u64 {
        self.0
    }

    /// Milli-units per window.
    #[inline]
    pub const fn milli(self) -> u64 {
        self.0 & RATE_MILLI_MASK
    }

    #[inline]
    const fn window_of(code: u64) -> u64 {
        WINDOW_UNITS[(code >> 12 & 3) as usize] * (code & 0xFFF)
    }

    /// The window, seconds.
    #[inline]
    pub const fn window_secs(self) -> u64 {
        let code = self.0 >> RATE_MILLI_BITS;
        if code == 0 {
            1
        } else {
            Self::window_of(code)
        }
    }

    /// Milli-units per second, for estimates (which are floats anyway).
    #[inline(always)]
    pub fn per_sec(self) -> f64 {
        let code = self.0 >> RATE_MILLI_BITS;
        let m = self.milli() as f64;
        if code == 0 {
            m
        } else {
            m / Self::window_of(code) as f64
        }
    }

    /// [`per_sec`](Self::per_sec) of a zone word.
    #[inline(always)]
    pub fn per_sec_of(word: u64) -> f64 {
        Rate(word).per_sec()
    }

    /// Milli-units per second, rounded up (at least 1): for bounds and caps.
    pub fn per_sec_ceil(self) -> u64 {
        self.milli().div_ceil(self.window_secs()).max(1)
    }

    /// What it drains over `ns`, saturating.
    pub fn over(self, ns: u64) -> u64 {
        drained(self, ns, 0).0
    }

    /// The ns it takes to drain `amount` milli-units, saturating.
    pub fn time_to_drain(self, amount: u64) -> u64 {
        let ns = u128::from(amount) * u128::from(self.window_secs() * NANOS_PER_SEC);
        u64::try_from(ns / u128::from(self.milli().max(1))).unwrap_or(u64::MAX)
    }

    /// The window as the admin API writes it: the largest of `d`, `h`, `m`, `s` that counts
    /// it whole (`"1h"`, `"30d"`, `"90s"`).
    pub fn window_text(self) -> String {
        window_text(self.window_secs())
    }
}

/// `secs` as the admin API writes a window: the largest of `d`, `h`, `m`, `s` that counts it
/// whole.
pub fn window_text(secs: u64) -> String {
    let (u, name) = [(86_400, 'd'), (3_600, 'h'), (60, 'm'), (1, 's')]
        .into_iter()
        .find(|(u, _)| secs.is_multiple_of(*u) && secs > 0)
        .unwrap_or((1, 's'));
    format!("{}{name}", secs / u)
}

/// Parses a window as the admin API takes it: a whole number and a unit, `s`, `m`, `h` or
/// `d` (`"1h"`, `"30d"` for a month); seconds, checked against [`Rate::new`]'s rules.
pub fn parse_window(text: &str) -> Result<u64, String> {
    let bad = || {
        format!(
            "per must be a whole number and a unit (s, m, h or d; a month is 30d) from 1s to \
             30d, got {text:?}"
        )
    };
    let unit = match text.as_bytes().last() {
        Some(b's') => 1,
        Some(b'm') => 60,
        Some(b'h') => 3_600,
        Some(b'd') => 86_400,
        _ => return Err(bad()),
    };
    let digits = &text[..text.len() - 1];
    if digits.is_empty() || digits.len() > 9 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let secs = n * unit;
    if !(1..=MAX_WINDOW_SECS).contains(&secs) {
        return Err(bad());
    }
    Rate::window_code(secs).map_err(|e| format!("per: {e}"))?;
    Ok(secs)
}

/// Converts a non-negative, finite number of units to milli-units, rounding to nearest.
/// Callers validate the range first.
pub(crate) fn units_to_milli(units: f64) -> u64 {
    (units * MILLI as f64).round() as u64
}

/// Converts milli-units to units for display and JSON.
pub fn milli_to_units(milli: u64) -> f64 {
    milli as f64 / MILLI as f64
}

/// How much a bucket draining at `rate` drains in `dt` ns, plus the remainder in
/// milli-unit·ns (always `<` the window in ns).
#[inline]
pub fn drained(rate: Rate, dt: u64, carry: u64) -> (u64, u64) {
    let milli = rate.milli();
    if rate.0 >> RATE_MILLI_BITS == 0 {
        // Per second, the common case: most products fit in u64 (1e6 milli/s over 10 s is
        // 1e16), and the divisor is a constant.
        if let Some(p) = milli.checked_mul(dt).and_then(|p| p.checked_add(carry)) {
            return (p / NANOS_PER_SEC, p % NANOS_PER_SEC);
        }
    }
    let window = u128::from(rate.window_secs() * NANOS_PER_SEC);
    let p = milli as u128 * dt as u128 + carry as u128;
    (u64::try_from(p / window).unwrap_or(u64::MAX), (p % window) as u64)
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
    /// Drains the bucket up to `now`; returns the drain that found it empty (milli-units,
    /// saturating): what it could have taken meanwhile without rising. Time that goes
    /// backwards is ignored (the fill is kept, 0 is returned).
    pub fn advance(&mut self, now: u64, rate: Rate) -> u64 {
        if now <= self.at {
            return 0;
        }
        let (whole, rem) = drained(rate, now - self.at, self.carry);
        let wasted = whole.saturating_sub(self.fill);
        if whole >= self.fill {
            // An empty bucket wastes the rest of the drain: that is the leaky bucket's floor.
            self.fill = 0;
            self.carry = 0;
        } else {
            self.fill -= whole;
            self.carry = rem;
        }
        self.at = now;
        wasted
    }

    /// The fill at `now` without changing the bucket.
    pub fn fill_at(&self, now: u64, rate: Rate) -> u64 {
        let mut b = *self;
        b.advance(now, rate);
        b.fill
    }

    /// Drains the bucket up to `now` at the rate `was`, which becomes `will` there: the
    /// remainder, a fraction of a milli-unit in milli-unit·ns of `was`'s window, is made
    /// one of `will`'s (read in a shorter window as it stood, it drained up to the ratio
    /// of the two at once: 30 days to 1 s, 2,592 units).
    pub fn edit(&mut self, now: u64, was: Rate, will: Rate) {
        self.advance(now, was);
        let (from, to) = (was.window_secs(), will.window_secs());
        if from != to {
            self.carry = (u128::from(self.carry) * u128::from(to) / u128::from(from.max(1))) as u64;
        }
    }

    /// Adds `amount` milli-units (saturating: a fill can stick at `u64::MAX`, never wrap).
    pub fn add(&mut self, amount: u64) {
        self.fill = self.fill.saturating_add(amount);
    }
}

/// Drains `fill` (milli-units) by `rate` over `dt` ns without keeping the remainder.
#[inline]
pub fn drain_once(fill: u64, rate: Rate, dt: u64) -> u64 {
    fill.saturating_sub(drained(rate, dt, 0).0)
}

/// A view of `fill` milli-units at `at` ns, drained at `rate` to `now`, as a new
/// (`fill`, `at`) pair that keeps the remainder: the time whose drain is less than a
/// milli-unit stays in it (`at` moves to `now` less that time). Stored back round after
/// round, a view drained with [`drain_once`] and moved to `now` lost up to a milli-unit
/// each time: a quota of 1 an hour drains 0.28 milli-units a second, so at a 1 s sync
/// interval it never drained, and one of 20 an hour drained 10 % slow. Time going
/// backwards keeps the pair.
pub fn drain_view(fill: u64, at: u64, rate: Rate, now: u64) -> (u64, u64) {
    if now <= at {
        return (fill, at);
    }
    let (d, carry) = drained(rate, now - at, 0);
    if d >= fill {
        return (0, now);
    }
    match rate.milli() {
        0 => (fill, at),
        milli => (fill - d, now - carry / milli),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_view_drained_round_after_round_keeps_its_remainder() {
        // 1 an hour (0.28 milli-units a second), drained every second for an hour: the
        // whole unit goes, as it would in one step; so for 20 an hour over three minutes.
        for (per_hour, secs, fill) in [(1u64, 3_600u64, 1_000u64), (20, 180, 1_000)] {
            let rate = Rate::new(per_hour * MILLI, 3_600).unwrap();
            let (mut f, mut at) = (fill * 2, NANOS_PER_SEC);
            for s in 1..=secs {
                (f, at) = drain_view(f, at, rate, (s + 1) * NANOS_PER_SEC);
            }
            let once = drain_once(fill * 2, rate, secs * NANOS_PER_SEC);
            assert!(f.abs_diff(once) <= 1, "{per_hour}/h: {f} against {once}");
            assert!(f <= fill + 1, "{per_hour}/h: {f}");
        }
        let rate = Rate::per_second(4_000);
        assert_eq!(drain_view(10_000, 9, rate, 5), (10_000, 9), "time going back");
        assert_eq!(drain_view(1_000, 1, rate, 2 * NANOS_PER_SEC), (0, 2 * NANOS_PER_SEC));
    }

    #[test]
    fn drains_at_rate_and_floors_at_zero() {
        let mut b = LeakyBucket { fill: 10_000, at: 0, carry: 0 };
        b.advance(NANOS_PER_SEC, Rate::per_second(4_000)); // 4 units/s for 1 s
        assert_eq!(b.fill, 6_000);
        b.advance(3 * NANOS_PER_SEC, Rate::per_second(4_000));
        assert_eq!(b.fill, 0);
        assert_eq!(b.carry, 0);
    }

    #[test]
    fn advance_returns_the_drain_that_found_the_bucket_empty() {
        let rate = Rate::per_second(4_000);
        let mut b = LeakyBucket { fill: 10_000, at: 0, carry: 0 };
        assert_eq!(b.advance(2 * NANOS_PER_SEC, rate), 0);
        // 2,000 left, 8,000 drained over the next 2 s: 6,000 of it at zero.
        assert_eq!(b.advance(4 * NANOS_PER_SEC, rate), 6_000);
        assert_eq!(b.advance(5 * NANOS_PER_SEC, rate), 4_000);
        assert_eq!(b.advance(NANOS_PER_SEC, rate), 0);
    }

    #[test]
    fn time_going_backwards_changes_nothing() {
        let mut b = LeakyBucket { fill: 500, at: 10, carry: 0 };
        b.advance(5, Rate::per_second(1_000_000));
        assert_eq!(b, LeakyBucket { fill: 500, at: 10, carry: 0 });
    }

    #[test]
    fn slow_rate_in_many_small_steps_is_exact() {
        // 0.001 units/s = 1 milli-unit/s; 1000 steps of 1 ms must drain exactly 1 milli-unit.
        let mut b = LeakyBucket { fill: 5, at: 0, carry: 0 };
        for i in 1..=1000 {
            b.advance(i * 1_000_000, Rate::per_second(1));
        }
        assert_eq!(b.fill, 4);
        assert_eq!(b.carry, 0);
    }

    #[test]
    fn ten_years_at_max_rate_does_not_overflow() {
        let ten_years_s: u64 = 10 * 365 * 86_400;
        let ten_years = ten_years_s * NANOS_PER_SEC;
        // 1e6 units/s for ten years: exact, in the u128 path.
        let (whole, rem) = drained(Rate::per_second(units_to_milli(1e6)), ten_years, 0);
        assert_eq!(whole, 1_000_000_000 * ten_years_s);
        assert_eq!(rem, 0);
        // The maximal rate drains more than any fill can hold: saturates, empties the bucket.
        let rate = Rate::per_second(units_to_milli(MAX_LIMIT_UNITS));
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
    fn windows_are_exact() {
        // 1,000 a day: exactly 1,000 units over 86,400 s, in any steps.
        let day = Rate::new(1_000_000, 86_400).unwrap();
        assert_eq!(
            (day.milli(), day.window_secs(), day.window_text()),
            (1_000_000, 86_400, "1d".into())
        );
        let mut b = LeakyBucket { fill: 2_000_000, at: 0, carry: 0 };
        for i in 1..=86_400u64 {
            b.advance(i * NANOS_PER_SEC, day);
        }
        assert_eq!((b.fill, b.carry), (1_000_000, 0));
        // 1 per 30 days: one unit drains over exactly 30 days.
        let month = Rate::new(1_000, MAX_WINDOW_SECS).unwrap();
        assert_eq!(month.window_text(), "30d");
        assert_eq!(month.time_to_drain(1_000), MAX_WINDOW_SECS * NANOS_PER_SEC);
        let mut b = LeakyBucket { fill: 1_000, at: 0, carry: 0 };
        b.advance(MAX_WINDOW_SECS * NANOS_PER_SEC - 1, month);
        assert_eq!(b.fill, 1);
        b.advance(MAX_WINDOW_SECS * NANOS_PER_SEC, month);
        assert_eq!(b.fill, 0);
        // A per-second rate's word is its milli-units per second, as before windows.
        assert_eq!(Rate::new(2_500, 1).unwrap().word(), 2_500);
        assert_eq!(Rate::new(2_500, 1).unwrap(), Rate::per_second(2_500));
        assert_eq!(Rate::new(1_000, 3_600).unwrap().per_sec_ceil(), 1);
        assert_eq!(Rate::new(7_200_000, 3_600).unwrap().per_sec(), 2_000.0);
    }

    #[test]
    fn window_codes() {
        for secs in [1, 2, 59, 60, 90, 4_095, 4_140, 3_600, 86_400, 7 * 86_400, MAX_WINDOW_SECS] {
            let r = Rate::new(1, secs).unwrap();
            assert_eq!(r.window_secs(), secs, "{secs}");
            assert_eq!(Rate::from_word(r.word()), Some(r));
            assert_eq!(parse_window(&r.window_text()), Ok(secs));
        }
        assert_eq!(Rate::new(1, 0), Err(WindowError::OutOfRange(0)));
        assert_eq!(
            Rate::new(1, MAX_WINDOW_SECS + 1),
            Err(WindowError::OutOfRange(MAX_WINDOW_SECS + 1))
        );
        assert_eq!(Rate::new(1, 4_097), Err(WindowError::Inexact(4_097)));
        assert_eq!(Rate::new(1, 4_097 * 60), Err(WindowError::Inexact(4_097 * 60)));
        assert!(Rate::from_word(1 << 62).is_none(), "a count of 0");
        assert!(Rate::from_word(1 << 50).is_none(), "1 s is code 0");
        assert!(Rate::from_word(60 << 50).is_none(), "60 s is 1m");
        assert!(Rate::from_word(3 << 62 | 31 << 50).is_none(), "31 days");
        assert_eq!(parse_window("1h"), Ok(3_600));
        assert_eq!(parse_window("30d"), Ok(MAX_WINDOW_SECS));
        assert_eq!(parse_window("90s"), Ok(90));
        for bad in ["", "h", "1", "1w", "31d", "0s", "-1s", "1.5h", "+1h", " 1h", "99999999999s"] {
            assert!(parse_window(bad).is_err(), "{bad:?}");
        }
        assert!(parse_window("4097s").unwrap_err().contains("whole minutes"));
    }

    #[test]
    fn unit_conversions_round_to_milli() {
        assert_eq!(units_to_milli(0.001), 1);
        assert_eq!(units_to_milli(1e12), 1_000_000_000_000_000);
        assert_eq!(units_to_milli(2.0004), 2_000);
        assert_eq!(milli_to_units(1_500), 1.5);
    }
}
