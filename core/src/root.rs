//! Root-side aggregation: the cluster-wide counters one root server keeps in memory.
//!
//! # G-counter semantics, exactly once
//!
//! Each limiter only ever *adds* its own deltas and the root sums them, so there is nothing
//! to conflict. To count each delta exactly once although HTTP requests get retried and
//! answers get lost, a limiter numbers its delta batches (`seq`, increasing per limiter
//! process) and resends a batch unchanged until a root acknowledges it. The root remembers,
//! per limiter, the highest `seq` applied (`acked_seq`) and skips any batch at or below it.
//!
//! The summed value is a leaky bucket that drains at the quota's `limit`, so it stays bounded
//! however long the root runs. Hints (a limiter's view of a fill, sent after this root may
//! have lost state) merge by **max**, which is idempotent, so a hint applied twice is harmless.
//!
//! Roots don't know each other: a limiter syncs with every root and takes the max.

use crate::proto::{SyncError, SyncRequest, SyncResponse, MAX_LIMITER_ID_LEN, PROTOCOL_VERSION};
use crate::quota::{Epoch, QuotaId, QuotaUpdate};
use crate::units::{milli_to_units, LeakyBucket, NANOS_PER_SEC};
use std::collections::{BTreeMap, HashMap};

/// Limits of one root.
#[derive(Debug, Clone)]
pub struct RootConfig {
    /// Most quotas in one answer; the limiter asks again at once for the rest.
    pub page_size: usize,
    /// Most limiter sessions tracked at once.
    pub max_limiters: usize,
    /// A limiter not heard from for this long (ns) is forgotten.
    pub limiter_idle_ns: u64,
    /// Most deltas plus hints in one request.
    pub max_entries: usize,
    /// Time constant of the per-counter rate meter shown by the admin API (ns).
    pub rate_tau_ns: u64,
}

/// Width of one bucket of the demand window, ns.
const DEMAND_BUCKET_NS: u64 = 250_000_000;
/// Full buckets the demand rate is averaged over: 2 s, a whole number of 1 s, 500 ms, 250 ms
/// … sync intervals, so each limiter's once-per-interval batches count exactly as often
/// whenever the window is read (an exponential average read right after one's own batch
/// landed would be biased high, and suppress too much).
const DEMAND_BUCKETS: u64 = 8;
const DEMAND_SLOTS: usize = DEMAND_BUCKETS as usize + 1;

/// Attempted (admitted + refused) milli-units per 250 ms bucket, over the last 2 s.
#[derive(Debug, Clone, Copy, Default)]
struct DemandWindow {
    buckets: [u64; DEMAND_SLOTS],
    /// Index (time / bucket width) of the newest bucket.
    head: u64,
}

impl DemandWindow {
    fn add(&mut self, amount: u64, now: u64) {
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

    /// Milli-units per second over the last [`DEMAND_BUCKETS`] full buckets before `now`.
    fn rate(&self, now: u64) -> f64 {
        let b = now / DEMAND_BUCKET_NS;
        let first = b.saturating_sub(DEMAND_BUCKETS);
        let sum: u64 = (first..b)
            .filter(|&k| k <= self.head && k + (DEMAND_SLOTS as u64) > self.head)
            .map(|k| self.buckets[(k % DEMAND_SLOTS as u64) as usize])
            .fold(0u64, u64::saturating_add);
        sum as f64 * NANOS_PER_SEC as f64 / (DEMAND_BUCKETS * DEMAND_BUCKET_NS) as f64
    }

    fn is_recent(&self, now: u64) -> bool {
        self.head + DEMAND_SLOTS as u64 > now / DEMAND_BUCKET_NS
            && self.buckets.iter().any(|&b| b > 0)
    }
}

impl Default for RootConfig {
    fn default() -> Self {
        RootConfig {
            page_size: 50_000,
            max_limiters: 100_000,
            limiter_idle_ns: 600 * NANOS_PER_SEC,
            max_entries: 2_000_000,
            rate_tau_ns: 5 * NANOS_PER_SEC,
        }
    }
}

/// Running totals for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RootStats {
    /// Sync requests answered.
    pub syncs: u64,
    /// Delta entries added to counters.
    pub deltas_applied: u64,
    /// Delta entries for quotas this root does not know (dropped).
    pub deltas_unknown: u64,
    /// Batches skipped because they were applied before (retries).
    pub duplicate_batches: u64,
    /// Hints that raised a counter.
    pub hints_applied: u64,
}

/// A counter's live view for the admin API.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CounterView {
    /// Fill now, units.
    pub fill: f64,
    /// Recent inflow, units per second (exponentially weighted).
    pub rate: f64,
    /// Drop probability at this fill.
    pub drop_probability: f64,
}

#[derive(Debug, Clone, Copy, Default)]
struct RootCounter {
    bucket: LeakyBucket,
    version: u64,
    /// Admitted inflow: milli-units per second as of `rate_at`.
    rate: f64,
    rate_at: u64,
    demand: DemandWindow,
}

/// An exponentially weighted rate: `amount` arriving at `now` on a meter reading `rate` at
/// `at` with time constant `tau` (all ns).
fn meter(rate: &mut f64, at: &mut u64, amount: u64, now: u64, tau: u64) {
    let tau = tau.max(1) as f64;
    let dt = now.saturating_sub(*at) as f64;
    *rate = *rate * (-dt / tau).exp() + amount as f64 * NANOS_PER_SEC as f64 / tau;
    *at = (*at).max(now);
}

fn meter_at(rate: f64, at: u64, now: u64, tau: u64) -> f64 {
    rate * (-(now.saturating_sub(at) as f64) / tau.max(1) as f64).exp()
}

#[derive(Debug, Clone, Copy)]
struct Session {
    acked: u64,
    last_seen: u64,
}

/// One root's counters, quota table and limiter sessions. Not thread-safe on its own: the
/// server wraps it in a lock.
#[derive(Debug)]
pub struct RootState {
    config: RootConfig,
    instance: u64,
    quotas: HashMap<QuotaId, QuotaUpdate>,
    by_epoch: BTreeMap<Epoch, QuotaId>,
    /// Quotas in `quotas` that are not tombstones.
    live: usize,
    epoch: Epoch,
    counters: HashMap<QuotaId, RootCounter>,
    /// Latest version of each counter that changed → its id.
    changes: BTreeMap<u64, QuotaId>,
    version: u64,
    limiters: HashMap<String, Session>,
    stats: RootStats,
}

impl RootState {
    /// An empty root with a fresh random instance id.
    pub fn new(config: RootConfig) -> Self {
        RootState {
            config,
            instance: fastrand::u64(1..),
            quotas: HashMap::new(),
            by_epoch: BTreeMap::new(),
            live: 0,
            epoch: 0,
            counters: HashMap::new(),
            changes: BTreeMap::new(),
            version: 0,
            limiters: HashMap::new(),
            stats: RootStats::default(),
        }
    }

    /// This root process's instance id.
    pub fn instance(&self) -> u64 {
        self.instance
    }

    /// Highest epoch known.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// Live quotas (tombstones excluded).
    pub fn quota_count(&self) -> usize {
        self.live
    }

    /// Counters held (non-empty buckets, until swept).
    pub fn counter_count(&self) -> usize {
        self.counters.len()
    }

    /// Limiters currently tracked.
    pub fn limiter_count(&self) -> usize {
        self.limiters.len()
    }

    /// Running totals.
    pub fn stats(&self) -> RootStats {
        self.stats
    }

    /// The stored quota or tombstone with this id.
    pub fn quota(&self, id: QuotaId) -> Option<&QuotaUpdate> {
        self.quotas.get(&id)
    }

    /// Applies quotas and tombstones read from the database. Older versions than held are
    /// ignored; a deleted quota's counter is dropped; a changed limit drains the counter at
    /// the old rate up to `now` first.
    pub fn apply_quotas(&mut self, updates: impl IntoIterator<Item = QuotaUpdate>, now: u64) {
        for u in updates {
            if let Some(old) = self.quotas.get(&u.id) {
                if old.epoch >= u.epoch {
                    continue;
                }
                self.by_epoch.remove(&old.epoch);
                if let Some(c) = self.counters.get_mut(&u.id) {
                    c.bucket.advance(now, old.limits.limit);
                }
            }
            self.epoch = self.epoch.max(u.epoch);
            self.by_epoch.insert(u.epoch, u.id);
            if u.deleted {
                if let Some(c) = self.counters.remove(&u.id) {
                    self.changes.remove(&c.version);
                }
            }
            let was_live = self.quotas.get(&u.id).is_some_and(|q| !q.deleted);
            match (was_live, u.deleted) {
                (false, false) => self.live += 1,
                (true, true) => self.live -= 1,
                _ => {}
            }
            self.quotas.insert(u.id, u);
        }
    }

    fn live_limit(&self, id: QuotaId) -> Option<u64> {
        self.quotas.get(&id).filter(|q| !q.deleted).map(|q| q.limits.limit)
    }

    /// The most a counter may hold: twice `high_burst` plus a minute of the limit. Limiters
    /// stop adding once a fill passes `high_burst`, so only a hostile or broken sync request
    /// gets there; without a cap one hint of `u64::MAX` would pin a quota shut for years.
    fn fill_cap(&self, id: QuotaId) -> Option<u64> {
        let q = self.quotas.get(&id).filter(|q| !q.deleted)?;
        Some(
            q.limits.high_burst.saturating_mul(2).saturating_add(q.limits.limit.saturating_mul(60)),
        )
    }

    fn bump(&mut self, id: QuotaId) {
        self.version += 1;
        let v = self.version;
        if let Some(c) = self.counters.get_mut(&id) {
            if c.version != 0 {
                self.changes.remove(&c.version);
            }
            c.version = v;
            self.changes.insert(v, id);
        }
    }

    fn add(&mut self, id: QuotaId, amount: u64, rejected: u64, now: u64) {
        let Some(limit) = self.live_limit(id) else {
            self.stats.deltas_unknown += 1;
            return;
        };
        let rate_tau = self.config.rate_tau_ns;
        let cap = self.fill_cap(id).unwrap_or(u64::MAX);
        let c = self.counters.entry(id).or_default();
        c.bucket.advance(now, limit);
        c.bucket.add(amount);
        c.bucket.fill = c.bucket.fill.min(cap);
        meter(&mut c.rate, &mut c.rate_at, amount, now, rate_tau);
        c.demand.add(amount.saturating_add(rejected), now);
        self.stats.deltas_applied += 1;
        self.bump(id);
    }

    fn hint(&mut self, id: QuotaId, fill: u64, now: u64) {
        let (Some(limit), Some(cap)) = (self.live_limit(id), self.fill_cap(id)) else { return };
        let fill = fill.min(cap);
        let c = self.counters.entry(id).or_default();
        c.bucket.advance(now, limit);
        if fill > c.bucket.fill {
            c.bucket.fill = fill;
            c.bucket.carry = 0;
            self.stats.hints_applied += 1;
            self.bump(id);
        }
    }

    /// Answers one limiter's sync at time `now` (ns).
    pub fn sync(&mut self, req: &SyncRequest, now: u64) -> Result<SyncResponse, SyncError> {
        if req.v != PROTOCOL_VERSION {
            return Err(SyncError::UnsupportedVersion(req.v));
        }
        if req.limiter.is_empty() || req.limiter.len() > MAX_LIMITER_ID_LEN {
            return Err(SyncError::BadLimiterId);
        }
        let entries = req.hints.len() + req.batches.iter().map(|b| b.deltas.len()).sum::<usize>();
        if entries > self.config.max_entries {
            return Err(SyncError::TooLarge(entries, self.config.max_entries));
        }
        if !self.limiters.contains_key(&req.limiter) {
            if self.limiters.len() >= self.config.max_limiters {
                self.forget_idle_limiters(now);
            }
            if self.limiters.len() >= self.config.max_limiters {
                return Err(SyncError::TooManyLimiters(self.limiters.len()));
            }
            self.limiters.insert(req.limiter.clone(), Session { acked: 0, last_seen: now });
        }
        let mut acked = self.limiters[&req.limiter].acked;
        let mut batches: Vec<_> = req.batches.iter().collect();
        batches.sort_by_key(|b| b.seq);
        for b in batches {
            if b.seq <= acked {
                self.stats.duplicate_batches += 1;
                continue;
            }
            for &(id, amount, rejected) in &b.deltas {
                self.add(id, amount, rejected, now);
            }
            acked = b.seq;
        }
        for &(id, fill) in &req.hints {
            self.hint(id, fill, now);
        }
        if let Some(s) = self.limiters.get_mut(&req.limiter) {
            s.acked = acked;
            s.last_seen = now;
        }

        let since = if req.root_instance == Some(self.instance) { req.since } else { 0 };
        let counters = self
            .changes
            .range(since.saturating_add(1)..)
            .filter_map(|(_, id)| {
                let c = self.counters.get(id)?;
                let demand = c.demand.rate(now);
                Some((*id, c.bucket.fill_at(now, self.live_limit(*id)?), demand as u64))
            })
            .collect();

        let mut quotas = Vec::new();
        let mut more = false;
        let mut epoch = self.epoch;
        for (&e, id) in self.by_epoch.range(req.epoch.saturating_add(1)..) {
            if quotas.len() == self.config.page_size {
                more = true;
                break;
            }
            quotas.push(self.quotas[id].clone());
            epoch = e;
        }
        if !more {
            epoch = self.epoch.max(req.epoch);
        }
        self.stats.syncs += 1;
        Ok(SyncResponse {
            v: PROTOCOL_VERSION,
            root_instance: self.instance,
            acked_seq: acked,
            version: self.version,
            counters,
            quotas,
            epoch,
            more,
        })
    }

    /// The live view of a quota's counter.
    pub fn counter(&self, id: QuotaId, now: u64) -> Option<CounterView> {
        let q = self.quotas.get(&id).filter(|q| !q.deleted)?;
        let (fill, rate) = match self.counters.get(&id) {
            Some(c) => (
                c.bucket.fill_at(now, q.limits.limit),
                meter_at(c.rate, c.rate_at, now, self.config.rate_tau_ns),
            ),
            None => (0, 0.0),
        };
        Some(CounterView {
            fill: milli_to_units(fill),
            rate: rate / 1000.0,
            drop_probability: crate::decision::drop_probability(
                fill as f64,
                q.limits.low_burst,
                q.limits.high_burst,
            ),
        })
    }

    /// Drops drained counters without recent demand, and forgotten limiters; call it now and then (e.g. every few
    /// seconds). Limiters drain their copies at the same rate, so nothing needs telling.
    pub fn sweep(&mut self, now: u64) {
        let quotas = &self.quotas;
        let changes = &mut self.changes;
        self.counters.retain(|id, c| {
            let limit = quotas.get(id).map_or(0, |q| q.limits.limit);
            // A counter that drained but still sees demand keeps its window: dropping it would
            // restart the demand from zero and let a burst through.
            let keep = limit > 0 && (c.bucket.fill_at(now, limit) > 0 || c.demand.is_recent(now));
            if !keep {
                changes.remove(&c.version);
            }
            keep
        });
        self.forget_idle_limiters(now);
    }

    fn forget_idle_limiters(&mut self, now: u64) {
        let idle = self.config.limiter_idle_ns;
        self.limiters.retain(|_, s| now.saturating_sub(s.last_seen) < idle);
    }
}

#[cfg(test)]
mod tests;
