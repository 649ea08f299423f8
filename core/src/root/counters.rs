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

use super::RootCounter;
use crate::quota::QuotaId;

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
