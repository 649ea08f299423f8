//! What a counter measures of its traffic besides its fill: the attempted units of the last
//! two seconds (the demand limiters suppress by) and the admitted rate the admin API shows.

use crate::units::NANOS_PER_SEC;

/// Width of one bucket of the demand window, ns.
pub(super) const DEMAND_BUCKET_NS: u64 = 250_000_000;
/// Full buckets the demand rate is averaged over: 2 s, a whole number of 1 s, 500 ms, 250 ms
/// … sync intervals, so each limiter's once-per-interval batches count exactly as often
/// whenever the window is read (an exponential average read right after one's own batch
/// landed would be biased high, and suppress too much).
pub(super) const DEMAND_BUCKETS: u64 = 8;
pub(super) const DEMAND_SLOTS: usize = DEMAND_BUCKETS as usize + 1;
/// The span of the demand window, ns: a root younger than this reads demand low.
pub(crate) const DEMAND_WINDOW_NS: u64 = DEMAND_BUCKETS * DEMAND_BUCKET_NS;

/// Attempted (admitted + refused) milli-units per 250 ms bucket, over the last 2 s.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct DemandWindow {
    pub(super) buckets: [u64; DEMAND_SLOTS],
    /// Index (time / bucket width) of the newest bucket.
    pub(super) head: u64,
}

impl DemandWindow {
    pub(super) fn add(&mut self, amount: u64, now: u64) {
        let b = now / DEMAND_BUCKET_NS;
        if b > self.head {
            for k in (self.head + 1)..=b.min(self.head + DEMAND_SLOTS as u64) {
                self.buckets[(k % DEMAND_SLOTS as u64) as usize] = 0;
            }
            self.head = b;
        }
        // A batch stamped in an older bucket (time never goes back here) lands in the newest.
        let slot = (self.head % DEMAND_SLOTS as u64) as usize;
        self.buckets[slot] = self.buckets[slot].saturating_add(amount);
    }

    /// Adds `amount` attempted over the last [`DEMAND_WINDOW_NS`] as the buckets would hold
    /// it had it come in over that time: read at once at its rate, and aged out bucket by
    /// bucket as newer attempts come in. Every held bucket, the current one too, gets an
    /// eighth: batches land a bucket after their counts, so the current bucket stands for
    /// the first one the sender's on-time batches will not fill (one bucket's worth more in
    /// all). A late limiter's attempts over a gap land so; added to the newest bucket alone,
    /// they stood for 2 s of its demand on top of its on-time batches, up to twice its
    /// demand, and every limiter suppressed too much after a healed cut (`make chaos`:
    /// `hot` at 0.97 x its limit after the heal).
    pub(super) fn add_spread(&mut self, amount: u64, now: u64) {
        self.add(0, now);
        let each = amount.div_ceil(DEMAND_BUCKETS);
        for slot in &mut self.buckets {
            *slot = slot.saturating_add(each);
        }
    }

    /// Milli-units per second over the last [`DEMAND_BUCKETS`] full buckets before `now`.
    pub(super) fn rate(&self, now: u64) -> f64 {
        let b = now / DEMAND_BUCKET_NS;
        // The full buckets before `now` the window still holds: from `first` (or the
        // oldest held, `head - DEMAND_SLOTS + 1`) up to `b` (or `head`), walked with one
        // remainder, not one per bucket (a division each: this runs for every counter of
        // every answer).
        let lo = b
            .saturating_sub(DEMAND_BUCKETS)
            .max((self.head + 1).saturating_sub(DEMAND_SLOTS as u64));
        let hi = b.min(self.head + 1);
        let mut sum = 0u64;
        let mut i = (lo % DEMAND_SLOTS as u64) as usize;
        for _ in lo..hi {
            sum = sum.saturating_add(self.buckets[i]);
            i = if i + 1 == DEMAND_SLOTS { 0 } else { i + 1 };
        }
        sum as f64 * NANOS_PER_SEC as f64 / (DEMAND_BUCKETS * DEMAND_BUCKET_NS) as f64
    }

    pub(super) fn is_recent(&self, now: u64) -> bool {
        self.head + DEMAND_SLOTS as u64 > now / DEMAND_BUCKET_NS
            && self.buckets.iter().any(|&b| b > 0)
    }
}

/// An exponentially weighted rate: `amount` arriving at `now` on a meter reading `rate` at
/// `at` with time constant `tau` (all ns).
pub(super) fn meter(rate: &mut f64, at: &mut u64, amount: u64, now: u64, tau: u64) {
    let tau = tau.max(1) as f64;
    let dt = now.saturating_sub(*at) as f64;
    *rate = *rate * (-dt / tau).exp() + amount as f64 * NANOS_PER_SEC as f64 / tau;
    *at = (*at).max(now);
}

pub(super) fn meter_at(rate: f64, at: u64, now: u64, tau: u64) -> f64 {
    rate * (-(now.saturating_sub(at) as f64) / tau.max(1) as f64).exp()
}

/// Attempts one delta entry may report to the demand meter, as a multiple of what the
/// quota can take in a second (`high_burst + limit × 1 s`). The demand signal suppresses
/// `1 - limit / demand`: 1024 times the capacity is already 99.9 %, so the cap changes
/// nothing an honest flood shows and keeps a forged one finite.
pub(super) const DEMAND_CAP_FACTOR: u64 = 1024;
