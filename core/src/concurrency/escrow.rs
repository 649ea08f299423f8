//! One root replica's part of one concurrency counter, and the shares it has granted.

use super::{Grant, Report};

/// Demand is capped (thousandths of a slot) so sums and products stay far from overflow.
const MAX_DEMAND: u32 = u32::MAX / 2;

/// A limiter as the root knows it (its session number).
pub type HolderId = u64;

#[derive(Clone, Copy, Debug, Default)]
struct Holder {
    /// The sequence of the last report taken: replays at or below it change nothing.
    seq: u64,
    /// The share last granted: the limiter may have applied it, so it counts.
    granted: u32,
    /// The share the limiter said, in its last report, it holds.
    acked: u32,
    /// What it runs above all its shares together (admitted before a share shrank).
    excess: u32,
    /// Its demand (thousandths of a slot), as a weight among the holders.
    want: u32,
    /// Its part of the part, as last split.
    target: u32,
    /// Its requests in flight, as last reported.
    in_flight: u32,
    /// When its lease ends on the root's clock (ns): from then on it counts nothing.
    until: u64,
}

impl Holder {
    /// What this root must assume the limiter may be using of its part.
    fn reserve(&self) -> u32 {
        self.granted.max(self.acked.saturating_add(self.excess))
    }
}

/// Figures for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EscrowStats {
    /// This replica's part of the counter's capacity.
    pub part: u32,
    /// What it counts as granted (at most `part` but for requests still running above
    /// shrunk shares).
    pub reserved: u64,
    /// Limiters holding a lease.
    pub holders: usize,
    /// Their requests in flight, as last reported.
    pub in_flight: u64,
    /// Their demand together, thousandths of a slot.
    pub wanted: u64,
}

/// One root replica's escrow of one concurrency counter: grants shares of its part to
/// limiters so that what it counts as granted never exceeds the part (see the module's
/// documentation for why that holds across lost, late and replayed messages).
#[derive(Debug)]
pub struct Escrow {
    /// `C`: demands are reported against the whole counter, whichever replica hears them.
    capacity: u32,
    part: u32,
    lease_ns: u64,
    max_holders: usize,
    holders: foldhash::HashMap<HolderId, Holder>,
    reserved: u64,
    wanted: u64,
    in_flight: u64,
    /// Reports since the split was last made ([`Escrow::retarget`]).
    stale: usize,
    /// The earliest lease end among the holders: nothing expires before it, so a report
    /// scans the holders only when one may have.
    next_expiry: u64,
}

impl Escrow {
    /// An escrow of `part` of a counter of `capacity`, granting leases of `lease_ns`, to
    /// at most `max_holders` limiters at once (a hostile limiter cannot grow it without
    /// bound; more are granted 0).
    pub fn new(capacity: u32, part: u32, lease_ns: u64, max_holders: usize) -> Self {
        Self {
            capacity,
            part,
            lease_ns,
            max_holders,
            holders: Default::default(),
            reserved: 0,
            wanted: 0,
            in_flight: 0,
            stale: 0,
            next_expiry: u64::MAX,
        }
    }

    /// The counter's `max_in_flight` this escrow has a part of.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// A new capacity (the quota was edited). Grants already made stay counted; a smaller
    /// part is reached as limiters report and their shares shrink.
    pub fn set_part(&mut self, capacity: u32, part: u32) {
        (self.capacity, self.part) = (capacity, part);
        self.stale = usize::MAX;
    }

    /// The current figures, after dropping leases ended by `now`.
    pub fn stats(&mut self, now: u64) -> EscrowStats {
        self.expire(now);
        EscrowStats {
            part: self.part,
            reserved: self.reserved,
            holders: self.holders.len(),
            in_flight: self.in_flight,
            wanted: self.wanted,
        }
    }

    /// Takes limiter `id`'s report received at `now` (ns, the root's clock) and answers
    /// with its share.
    pub fn report(&mut self, id: HolderId, now: u64, r: &Report) -> Grant {
        self.expire(now);
        let lease_ns = self.lease_ns;
        let mut h = match self.holders.get(&id) {
            Some(h) if r.seq <= h.seq => return Grant { share: h.granted, lease_ns },
            Some(h) => *h,
            None if self.holders.len() >= self.max_holders => {
                return Grant { share: 0, lease_ns };
            }
            None => {
                self.stale = usize::MAX;
                Holder::default()
            }
        };
        self.reserved -= u64::from(h.reserve());
        self.wanted -= u64::from(h.want);
        self.in_flight -= u64::from(h.in_flight);
        h.seq = r.seq;
        // A limiter cannot hold more than it was given: a claim above that is not believed.
        h.acked = r.held.min(h.granted.max(h.acked));
        h.excess = r.in_flight.saturating_sub(r.held_total).min(self.part);
        // What it runs is a floor of its demand, whatever it measured.
        h.want = r.demand.max(r.in_flight.saturating_mul(1000)).min(MAX_DEMAND);
        h.in_flight = r.in_flight;
        h.until = now.saturating_add(lease_ns);
        self.wanted += u64::from(h.want);
        self.in_flight += u64::from(h.in_flight);
        self.next_expiry = self.next_expiry.min(h.until);
        self.holders.insert(id, h);
        self.stale = self.stale.saturating_add(1);
        if self.stale > self.holders.len() / 4 {
            self.retarget();
        }
        let Some(h) = self.holders.get_mut(&id) else { return Grant { share: 0, lease_ns } };
        // Growth comes only out of what no other holder may be using.
        let free = u64::from(self.part).saturating_sub(self.reserved);
        h.granted = u64::from(h.target).min(free) as u32;
        self.reserved += u64::from(h.reserve());
        Grant { share: h.granted, lease_ns }
    }

    /// Splits the part among the holders by their demand: each gets its demand plus an even
    /// part of what nobody wants while the demands sum under the part (so a host whose
    /// traffic starts from nothing finds a slot ready), else a part in proportion to its
    /// demand; whole slots by largest remainders, so the targets sum to the part exactly
    /// (rounding each up would hand a slot to every host with a trickle, rounding down
    /// would leave up to one slot per host idle).
    ///
    /// It takes every holder, so it runs once a quarter of them have reported since the
    /// last time (and when one joins): demands move slowly against a round.
    fn retarget(&mut self) {
        self.stale = 0;
        let n = self.holders.len() as u128;
        if n == 0 {
            return;
        }
        let part = u128::from(self.part);
        let spare = (u128::from(self.capacity) * 1000).saturating_sub(u128::from(self.wanted));
        let weight = |w: u32| u128::from(w) * n + spare;
        let total: u128 = self.holders.values().map(|h| weight(h.want)).sum();
        if total == 0 {
            return;
        }
        let mut rest = part;
        let mut remainders: Vec<(u128, HolderId)> = Vec::with_capacity(self.holders.len());
        for (&id, h) in self.holders.iter_mut() {
            let exact = part * weight(h.want);
            h.target = (exact / total) as u32;
            rest -= u128::from(h.target);
            // A holder that has the slot keeps it unless another's claim is half a slot
            // stronger: moving a slot leaves it idle until its holder's requests end and it
            // says so, so slots must not follow the noise in the demand.
            let keeps = if h.granted > h.target { total / 2 } else { 0 };
            remainders.push((exact % total + keeps, id));
        }
        if rest > 0 {
            let k = (rest as usize).min(remainders.len());
            remainders.select_nth_unstable_by(k - 1, |a, b| b.cmp(a));
            for &(_, id) in &remainders[..k] {
                if let Some(h) = self.holders.get_mut(&id) {
                    h.target += 1;
                }
            }
        }
    }

    fn expire(&mut self, now: u64) {
        if now < self.next_expiry {
            return;
        }
        let before = self.holders.len();
        let (mut reserved, mut wanted, mut in_flight, mut next) = (0u64, 0u64, 0u64, u64::MAX);
        self.holders.retain(|_, h| {
            if h.until <= now {
                return false;
            }
            reserved += u64::from(h.reserve());
            wanted += u64::from(h.want);
            in_flight += u64::from(h.in_flight);
            next = next.min(h.until);
            true
        });
        if self.holders.len() != before {
            self.stale = usize::MAX;
        }
        (self.reserved, self.wanted, self.in_flight) = (reserved, wanted, in_flight);
        self.next_expiry = next;
    }
}
