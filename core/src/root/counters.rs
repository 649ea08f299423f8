//! The root's live counters by quota id.
//!
//! Under random-key traffic a root's counters are born and die all the time: a delta makes
//! one, the sweep drops it once drained (one nginx at 60,000 requests a second across a
//! million quotas: 60,000 of each a second). In a hash map of whole counters (150 bytes
//! each) every birth wrote into a random slot of a table of tens of megabytes, a cache miss
//! that was most of the root's work per delta. Here the map holds only a 4-byte place per
//! id (a table a tenth of the size, much of it cache-resident) and the counters sit in a
//! dense slab whose freed places are reused last-freed first: a new counter lands where the
//! sweep just dropped one, a line the sweep has just read.

use super::{IdMap, RootCounter};
use crate::quota::QuotaId;

#[derive(Debug, Default)]
pub(super) struct Counters {
    place: IdMap<u32>,
    slab: Vec<(QuotaId, RootCounter)>,
    /// Whether each place of `slab` holds a counter.
    live: Vec<bool>,
    /// Free places of `slab`, the last freed at the end.
    free: Vec<u32>,
}

impl Counters {
    #[inline]
    pub fn get(&self, id: &QuotaId) -> Option<&RootCounter> {
        self.place.get(id).map(|&p| &self.slab[p as usize].1)
    }

    #[inline]
    pub fn get_mut(&mut self, id: &QuotaId) -> Option<&mut RootCounter> {
        self.place.get(id).map(|&p| &mut self.slab[p as usize].1)
    }

    pub fn contains_key(&self, id: &QuotaId) -> bool {
        self.place.contains_key(id)
    }

    pub fn len(&self) -> usize {
        self.place.len()
    }

    /// The counter of `id`, a new empty one if there is none.
    #[inline]
    pub fn get_or_default(&mut self, id: QuotaId) -> &mut RootCounter {
        let (slab, live, free) = (&mut self.slab, &mut self.live, &mut self.free);
        let p = *self.place.entry(id).or_insert_with(|| match free.pop() {
            Some(p) => {
                slab[p as usize] = (id, RootCounter::default());
                live[p as usize] = true;
                p
            }
            None => {
                slab.push((id, RootCounter::default()));
                live.push(true);
                // A place is a u32: a root holds at most one counter per quota, and quota
                // ids come from one database (far fewer than 4 billion live counters).
                u32::try_from(slab.len() - 1).expect("fewer than 2^32 live counters")
            }
        });
        &mut self.slab[p as usize].1
    }

    pub fn remove(&mut self, id: &QuotaId) -> Option<RootCounter> {
        let p = self.place.remove(id)?;
        self.free.push(p);
        self.live[p as usize] = false;
        Some(std::mem::take(&mut self.slab[p as usize].1))
    }

    /// The number of places, live or free: a walk over `0..places()` with [`at`](Self::at)
    /// sees every counter, reading the slab in order (which the CPU prefetches; looked up
    /// by id, every counter was a cache miss of its own, most of a sweep's time).
    pub fn places(&self) -> usize {
        self.slab.len()
    }

    /// The counter at place `p`, if one is there.
    #[inline]
    pub fn at(&self, p: usize) -> Option<(QuotaId, &RootCounter)> {
        self.live.get(p).filter(|&&l| l).map(|_| (self.slab[p].0, &self.slab[p].1))
    }

    /// Removes the counter at place `p`, if one is there.
    pub fn remove_at(&mut self, p: usize) -> Option<RootCounter> {
        let (id, _) = self.at(p)?;
        self.remove(&id)
    }

    /// Keeps the counters for which `keep` holds, looked at in the order of their places.
    pub fn retain(&mut self, mut keep: impl FnMut(QuotaId, &mut RootCounter) -> bool) {
        for (p, (id, c)) in self.slab.iter_mut().enumerate() {
            if self.live[p] && !keep(*id, c) {
                *c = RootCounter::default();
                self.live[p] = false;
                self.place.remove(id);
                self.free.push(p as u32);
            }
        }
        if self.place.is_empty() {
            // Nothing live: give the memory of a past peak back.
            *self = Counters::default();
        }
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
        for id in 1..=3 {
            c.get_or_default(id).version = id;
        }
        c.remove(&1);
        c.remove(&3);
        c.get_or_default(7).version = 70;
        assert_eq!(c.slab.len(), 3, "no new place while one is free");
        assert_eq!(c.slab[2].0, 7, "the place of 3, freed last");
        assert_eq!(c.get(&7).map(|x| x.version), Some(70));
        assert_eq!(c.get(&2).map(|x| x.version), Some(2));
        assert!(c.get(&3).is_none() && c.get(&1).is_none());
        let again = c.get_or_default(1);
        assert_eq!(again.version, 0, "a reused place starts empty");
        assert_eq!(c.at(0).map(|(id, _)| id), Some(1));
        assert_eq!(c.remove_at(0).map(|x| x.version), Some(0));
        assert!(c.at(0).is_none() && c.remove_at(0).is_none() && c.get(&1).is_none());
        assert!(c.at(99).is_none(), "past the slab");
    }

    #[derive(Debug, Clone)]
    enum Op {
        Upsert(QuotaId, u64),
        Remove(QuotaId),
        RetainOdd,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u64..40, any::<u64>()).prop_map(|(id, v)| Op::Upsert(id, v)),
            3 => (0u64..40).prop_map(Op::Remove),
            1 => Just(Op::RetainOdd),
        ]
    }

    proptest! {
        /// Whatever the sequence, the table holds exactly what a plain map would, and never
        /// more places than it held live counters at its peak.
        #[test]
        fn behaves_as_a_map(ops in proptest::collection::vec(op(), 0..300)) {
            let mut c = Counters::default();
            let mut model: HashMap<QuotaId, u64> = HashMap::new();
            let mut peak = 0;
            for o in ops {
                match o {
                    Op::Upsert(id, v) => {
                        let x = c.get_or_default(id);
                        prop_assert_eq!(x.version, model.get(&id).copied().unwrap_or(0));
                        x.version = v;
                        model.insert(id, v);
                    }
                    Op::Remove(id) => {
                        let got = c.remove(&id).map(|x| x.version);
                        prop_assert_eq!(got, model.remove(&id));
                    }
                    Op::RetainOdd => {
                        c.retain(|id, _| id % 2 == 1);
                        model.retain(|id, _| id % 2 == 1);
                    }
                }
                peak = peak.max(model.len());
                prop_assert_eq!(c.len(), model.len());
                prop_assert!(c.slab.len() <= peak);
                prop_assert_eq!(c.slab.len(), c.len() + c.free.len());
                prop_assert_eq!(c.live.iter().filter(|&&l| l).count(), c.len());
                for (id, v) in &model {
                    prop_assert_eq!(c.get(id).map(|x| x.version), Some(*v));
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
