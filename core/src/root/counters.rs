//! The root's live counters, in a slab whose places the quota table keeps.
//!
//! Under random-key traffic a root's counters are born and die all the time: a delta makes
//! one, the sweep drops it once drained (one nginx at 60,000 requests a second across a
//! million quotas: 60,000 of each a second). In a hash map of whole counters (150 bytes
//! each) every birth wrote into a random slot of a table of tens of megabytes, a cache miss
//! that was most of the root's work per delta. A map from id to a place in a dense slab was
//! still one such miss per birth (a fifth of a busy root's samples). So the place lives in
//! the quota's own entry, which every delta reads anyway (see `QuotaEntry::counter`), and
//! the slab reuses freed places last-freed first: a new counter lands where the sweep just
//! dropped one, a line the sweep has just read.

use super::demand::{meter_at, DemandWindow};
use super::{CounterView, IdMap, QuotaEntry, RootState};
use crate::quota::QuotaId;
use crate::units::{milli_to_units, LeakyBucket, Rate};

/// The place of no counter.
pub(super) const NO_COUNTER: u32 = u32::MAX;

#[derive(Debug, Default)]
pub(super) struct Counters {
    slab: Vec<(QuotaId, RootCounter)>,
    /// Whether each place of `slab` holds a counter.
    live: Vec<bool>,
    /// Free places of `slab`, the last freed at the end.
    free: Vec<u32>,
}

impl Counters {
    /// The counter at `place`, if one is there ([`NO_COUNTER`]: none).
    #[inline]
    pub fn get(&self, place: u32) -> Option<&RootCounter> {
        self.at(place as usize).map(|(_, c)| c)
    }

    #[inline]
    pub fn get_mut(&mut self, place: u32) -> Option<&mut RootCounter> {
        let p = place as usize;
        match self.live.get(p) {
            Some(true) => Some(&mut self.slab[p].1),
            _ => None,
        }
    }

    /// Live counters.
    pub fn len(&self) -> usize {
        self.slab.len() - self.free.len()
    }

    /// A new empty counter for `id`; its place, for the caller to keep.
    #[inline]
    pub fn insert(&mut self, id: QuotaId) -> u32 {
        match self.free.pop() {
            Some(p) => {
                self.slab[p as usize] = (id, RootCounter::default());
                self.live[p as usize] = true;
                p
            }
            None => {
                self.slab.push((id, RootCounter::default()));
                self.live.push(true);
                // A root holds at most one counter per quota, and quota ids come from one
                // database: far fewer than 4 billion live counters.
                let p = u32::try_from(self.slab.len() - 1).expect("fewer than 2^32 counters");
                assert_ne!(p, NO_COUNTER, "fewer than 2^32 - 1 live counters");
                p
            }
        }
    }

    /// Reads every word of the counter at `place` (all the cache lines its 152 bytes span:
    /// the work on it reads most of them, and one line loaded ahead left the others to be
    /// missed one after another), and of the `fresh` places the next new counters will take.
    /// A value to feed `black_box`.
    pub fn touch(&self, place: u32, fresh: usize) -> u64 {
        let mut t = self.get(place).map_or(0, RootCounter::touch);
        for &p in self.free.iter().rev().take(fresh) {
            t ^= self.slab[p as usize].1.touch();
        }
        t
    }

    /// The number of places, live or free: a walk over `0..places()` with [`at`](Self::at)
    /// sees every counter, reading the slab in order (which the CPU prefetches; looked up
    /// by id, every counter was a cache miss of its own, most of a sweep's time).
    pub fn places(&self) -> usize {
        self.slab.len()
    }

    /// The counter at place `p` and its id, if one is there.
    #[inline]
    pub fn at(&self, p: usize) -> Option<(QuotaId, &RootCounter)> {
        match self.live.get(p) {
            Some(true) => Some((self.slab[p].0, &self.slab[p].1)),
            _ => None,
        }
    }

    /// Removes the counter at place `p`, if one is there: its id and what it held.
    pub fn remove(&mut self, place: u32) -> Option<(QuotaId, RootCounter)> {
        let p = place as usize;
        if self.live.get(p) != Some(&true) {
            return None;
        }
        self.live[p] = false;
        self.free.push(place);
        let id = self.slab[p].0;
        let c = std::mem::take(&mut self.slab[p].1);
        if self.free.len() == self.slab.len() {
            // Nothing live: give the memory of a past peak back.
            *self = Counters::default();
        }
        Some((id, c))
    }
}

/// Counter `id`'s place in the slab, kept in its quota's entry.
#[inline]
pub(super) fn place_of(quotas: &IdMap<QuotaEntry>, id: QuotaId) -> u32 {
    quotas.get(&id).map_or(NO_COUNTER, |q| q.counter)
}

#[derive(Debug, Clone, Copy, Default)]
pub(super) struct RootCounter {
    pub(super) bucket: LeakyBucket,
    /// The rate it drains at: its live quota's limit (set whenever the counter is worked on,
    /// and it leaves with its quota), kept here so that a sweep or an answer reads the
    /// counter alone (a second lookup, in a million-quota map, is a cache miss).
    pub(super) limit: Rate,
    pub(super) version: u64,
    /// Where its latest change sits in the change log (valid while `version` is not 0).
    pub(super) log_at: usize,
    /// Admitted inflow: milli-units per second as of `rate_at`.
    pub(super) rate: f64,
    pub(super) rate_at: u64,
    pub(super) demand: DemandWindow,
    /// Drain that found the bucket empty lately (milli-units, at most
    /// [`RootConfig::late_credit_ns`](super::RootConfig::late_credit_ns) of the limit): what
    /// counts that arrive late would have used had they come on time. See "Late batches" in
    /// `root/claims.rs`.
    pub(super) spare: u64,
    /// The same drain, spent by on-time batches: cut at each credit to the limit over the
    /// crediting batch's span, so that batches of one span share the drain of that span
    /// (never more than `spare`). See "On-time and long batches" in `root/claims.rs`.
    pub(super) fresh: u64,
}

impl RootCounter {
    /// Every word of it, folded: see [`Counters::touch`].
    pub(super) fn touch(&self) -> u64 {
        let b = &self.bucket;
        let words = [
            b.fill,
            b.at,
            b.carry,
            self.limit.word(),
            self.version,
            self.rate_at,
            self.spare,
            self.fresh,
        ];
        let d = &self.demand;
        d.buckets.iter().chain(&words).fold(d.head ^ self.log_at as u64, |t, &w| t ^ w)
            ^ self.rate.to_bits()
    }
}

/// Whether a root may drop a counter: drained, and without recent demand (dropping one that
/// still sees demand would restart its window from zero and let a burst through). The
/// counter of a quota that is gone is not asked: it left with its quota.
fn spent(c: &RootCounter, now: u64) -> bool {
    c.bucket.fill_at(now, c.limit) == 0 && !c.demand.is_recent(now)
}

/// Ids whose entries [`RootState::warm`] loads at once before they are worked on: enough
/// misses in flight to keep the memory busy, few enough that the first are still in the cache
/// when the work reaches them (a whole 50,000-delta sync warmed at once was not: its quota
/// probes still missed, a quarter of a busy root's samples).
pub(super) const WARM_RUN: usize = 256;

impl RootState {
    /// Counter `id`, if it has one.
    #[inline]
    pub(super) fn counter_of(&self, id: QuotaId) -> Option<&RootCounter> {
        self.counters.get(place_of(&self.quotas, id))
    }

    #[inline]
    pub(super) fn counter_mut(&mut self, id: QuotaId) -> Option<&mut RootCounter> {
        self.counters.get_mut(place_of(&self.quotas, id))
    }

    /// Counter `id` drained at `limit`, its live quota's, up to `now`; a new empty one if it
    /// has none. `None` for an id with no quota entry (a counter lives only beside its quota).
    #[inline]
    pub(super) fn counter_now(
        &mut self,
        id: QuotaId,
        limit: Rate,
        now: u64,
    ) -> Option<&mut RootCounter> {
        let q = self.quotas.get_mut(&id)?;
        let new = q.counter == NO_COUNTER;
        if new {
            q.counter = self.counters.insert(id);
        }
        let c = self.counters.get_mut(q.counter)?;
        if new {
            // Nothing was counted before it: no spare drain either (a late amount that
            // makes it sets its own, `RootState::add_late`).
            c.bucket.at = now;
        }
        c.limit = limit;
        let wasted = c.bucket.advance(now, limit);
        if wasted > 0 {
            let most = limit.over(self.config.late_credit_ns);
            c.spare = c.spare.saturating_add(wasted).min(most);
            c.fresh = c.fresh.saturating_add(wasted).min(most);
        }
        Some(c)
    }

    /// Drops counter `id`, if it has one, and its entry in the change log.
    pub(super) fn drop_counter(&mut self, id: QuotaId) {
        let Some(q) = self.quotas.get_mut(&id) else { return };
        let place = std::mem::replace(&mut q.counter, NO_COUNTER);
        if let Some((_, c)) = self.counters.remove(place) {
            self.kill_change(c.log_at, c.version);
        }
        self.lent.remove(&id);
    }

    /// Drops the counter at slab place `p`, if one is there, and its entry in the change
    /// log.
    fn drop_counter_at(&mut self, p: usize) {
        let Some((id, c)) = u32::try_from(p).ok().and_then(|p| self.counters.remove(p)) else {
            return;
        };
        if let Some(q) = self.quotas.get_mut(&id) {
            q.counter = NO_COUNTER;
        }
        self.lent.remove(&id);
        self.kill_change(c.log_at, c.version);
        // A key has nothing beside its counter and its escrow: it goes too, unless leases
        // of its concurrency cap still run (see `keys.rs`).
        self.forget_if_bare(id);
    }

    /// Brings the slots of these counters into the cache ahead of the work on them: the
    /// loads of this loop do not depend on one another, so the CPU has many misses in flight
    /// at once, where the work itself waits for each in turn.
    ///
    /// Callers warm runs of at most [`WARM_RUN`] ids, each just before working on it.
    pub(super) fn warm(&self, ids: impl Iterator<Item = QuotaId> + Clone) {
        let (mut touched, mut fresh) = (0u64, 0);
        for id in ids.clone() {
            let q = self.quotas.get(&id);
            touched ^= q.map_or(0, |q| q.reset_epoch);
            let place = q.map_or(NO_COUNTER, |q| q.counter);
            fresh += usize::from(q.is_some() && place == NO_COUNTER);
            touched ^= self.counters.touch(place, 0);
            touched ^= self.watchers.get(&id).map_or(0, |w| w.len() as u64);
        }
        // The free places the new ones will take.
        touched ^= self.counters.touch(NO_COUNTER, fresh);
        // Then the change-log entries they replace (their counters are in the cache now).
        for id in ids {
            if let Some(c) = self.counter_of(id) {
                touched ^= self.changes.get(c.log_at, c.version).map_or(0, |e| e.limit.word());
            }
        }
        std::hint::black_box(touched);
    }

    /// The live view of a quota's counter.
    pub fn counter(&self, id: QuotaId, now: u64) -> Option<CounterView> {
        let q = self.quotas.get(&id).filter(|q| !q.deleted)?;
        let (fill, rate) = match self.counters.get(q.counter) {
            Some(c) => (
                c.bucket.fill_at(now, q.limits.limit()),
                meter_at(c.rate, c.rate_at, now, self.config.rate_tau_ns),
            ),
            None => (0, 0.0),
        };
        Some(CounterView {
            fill: milli_to_units(fill),
            rate: rate / 1000.0,
            drop_probability: crate::decision::drop_probability(
                fill as f64,
                q.limits.low_burst(),
                q.limits.high_burst(),
            ),
        })
    }

    /// Drops drained counters without recent demand, and forgotten limiters; call it now and
    /// then (e.g. every few seconds). Limiters drain their copies at the same rate, so
    /// nothing needs telling.
    pub fn sweep(&mut self, now: u64) {
        for p in 0..self.counters.places() {
            if self.counters.at(p).is_some_and(|(_, c)| spent(c, now)) {
                self.drop_counter_at(p);
            }
        }
        self.sweep_left = 0;
        self.forget_idle_limiters(now);
        self.sweep_escrows(now, None);
    }

    /// [`sweep`](Self::sweep) in steps, for a server that must not stop answering syncs
    /// while a million counters are looked at (tens of milliseconds under its lock): each
    /// call looks at up to `max` counters; a pass starts with a list of every counter's id
    /// and ends, forgetting idle limiters, when the list is done. `true` when a pass ended.
    pub fn sweep_step(&mut self, now: u64, max: usize) -> bool {
        // Past the hint window no hint is taken: the floors of old views, and the credits
        // a hint would take back, are no use.
        if !(self.pre_start.is_empty() && self.lent.is_empty())
            && self.born.is_some_and(|b| now.saturating_sub(b) > self.config.hint_window_ns)
        {
            self.pre_start = Default::default();
            self.lent = Default::default();
        }
        if self.sweep_left == 0 {
            self.sweep_left = self.counters.places();
        }
        let take = max.max(1).min(self.sweep_left);
        let lo = self.sweep_left - take;
        let mut dead = Vec::with_capacity(WARM_RUN);
        // By place, from the slab's end: its counters are read front to back within a run,
        // which the CPU prefetches. A place freed and reused since the pass began holds
        // another live counter, which may be looked at as well as the one it replaced.
        for run in (lo..self.sweep_left).step_by(WARM_RUN) {
            dead.clear();
            dead.extend((run..(run + WARM_RUN).min(self.sweep_left)).filter_map(|p| {
                let (id, c) = self.counters.at(p)?;
                spent(c, now).then_some((p, id, c.log_at, c.version))
            }));
            // Their change-log and quota entries: the log is in version order and the
            // quotas by hash, the slab is neither, so each is a random place; all loaded at
            // once first (see `warm`).
            let mut touched = 0u64;
            for &(_, id, at, v) in &dead {
                touched ^= self.changes.get(at, v).map_or(0, |e| e.limit.word());
                touched ^= self.quotas.get(&id).map_or(0, |q| u64::from(q.counter));
            }
            std::hint::black_box(touched);
            for &(p, ..) in &dead {
                self.drop_counter_at(p);
            }
        }
        self.sweep_left = lo;
        // Escrows in steps of their own, whatever the counters' pass: a root whose keys
        // only cap concurrency has escrows and no counters.
        self.sweep_escrows(now, Some(max.max(1)));
        if lo > 0 {
            return false;
        }
        self.forget_idle_limiters(now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[test]
    fn a_freed_place_is_reused_last_freed_first() {
        let mut c = Counters::default();
        let places: Vec<u32> = (1..=3).map(|id| c.insert(id)).collect();
        assert_eq!(places, [0, 1, 2]);
        for &p in &places {
            c.get_mut(p).unwrap().version = u64::from(p) + 1;
        }
        assert_eq!(c.remove(0).map(|(id, x)| (id, x.version)), Some((1, 1)));
        assert_eq!(c.remove(2).map(|(id, x)| (id, x.version)), Some((3, 3)));
        assert!(c.remove(2).is_none(), "removed once");
        let p7 = c.insert(7);
        assert_eq!(p7, 2, "the place of 3, freed last");
        assert_eq!(c.places(), 3, "no new place while one is free");
        assert_eq!(c.get(p7).map(|x| x.version), Some(0), "a reused place starts empty");
        assert_eq!(c.at(2).map(|(id, _)| id), Some(7));
        assert_eq!(c.get(1).map(|x| x.version), Some(2));
        assert!(c.get(0).is_none() && c.get_mut(0).is_none());
        assert!(c.get(NO_COUNTER).is_none() && c.at(99).is_none(), "past the slab");
        assert_eq!(c.len(), 2);
        c.remove(1);
        c.remove(2);
        assert_eq!((c.len(), c.places()), (0, 0), "empty: the slab's memory goes back");
    }

    #[derive(Debug, Clone)]
    enum Op {
        Upsert(QuotaId, u64),
        Remove(QuotaId),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u64..40, any::<u64>()).prop_map(|(id, v)| Op::Upsert(id, v)),
            3 => (0u64..40).prop_map(Op::Remove),
        ]
    }

    proptest! {
        /// With its places kept by id (as the quota table does), the slab holds exactly what
        /// a plain map would, and never more places than it held live counters at its peak.
        #[test]
        fn behaves_as_a_map(ops in proptest::collection::vec(op(), 0..300)) {
            let mut c = Counters::default();
            let mut places: HashMap<QuotaId, u32> = HashMap::new();
            let mut model: HashMap<QuotaId, u64> = HashMap::new();
            let mut peak = 0;
            for o in ops {
                match o {
                    Op::Upsert(id, v) => {
                        let p = *places.entry(id).or_insert_with(|| c.insert(id));
                        let x = c.get_mut(p).expect("a live place");
                        prop_assert_eq!(x.version, model.get(&id).copied().unwrap_or(0));
                        x.version = v;
                        model.insert(id, v);
                    }
                    Op::Remove(id) => {
                        let p = places.remove(&id).unwrap_or(NO_COUNTER);
                        let got = c.remove(p).map(|(got_id, x)| {
                            assert_eq!(got_id, id);
                            x.version
                        });
                        prop_assert_eq!(got, model.remove(&id));
                    }
                }
                peak = peak.max(model.len());
                prop_assert_eq!(c.len(), model.len());
                prop_assert!(c.places() <= peak);
                prop_assert_eq!(c.live.iter().filter(|&&l| l).count(), c.len());
                for (id, v) in &model {
                    prop_assert_eq!(c.get(places[id]).map(|x| x.version), Some(*v));
                }
                let mut by_place: Vec<_> =
                    (0..c.places()).filter_map(|p| c.at(p).map(|(id, x)| (id, x.version))).collect();
                by_place.sort_unstable();
                let mut pairs: Vec<_> = model.iter().map(|(&id, &v)| (id, v)).collect();
                pairs.sort_unstable();
                prop_assert_eq!(by_place, pairs);
            }
        }
    }
}
