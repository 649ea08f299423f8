//! One round's bookkeeping: the batch it sends, what the roots' answers say of each slot,
//! and the walk that pairs both with the active slots at the end of the round.

use crate::proto::DeltaBatch;
use crate::quota::{Epoch, QuotaId};
use crate::shard::Shard;
use std::sync::Arc;

/// What a round achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RoundReport {
    /// At least one root answered.
    pub any_ok: bool,
    /// A root has more quotas for us: run the next round at once.
    pub more: bool,
}

/// One entry of a round's batch: (slot, id, admitted, rejected).
pub(super) type Entry = (u32, QuotaId, u64, u64);

/// What a round learned of one slot from the roots' answers.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Facts {
    /// Its (`base`, `at`) before the first report this round, if some root reported it:
    /// the measured estimators compare the two.
    pub seen: Option<(u64, u64)>,
    /// Highest demand any root reported for it this round.
    pub demand: u64,
}

/// One round's batch and what the roots said of it. No hashing: the batch comes from the
/// dirty bitmap in slot order, so a slot finds its entry by binary search over `keys`, and
/// the end of the round walks the active slots, the batch and `others` in slot order
/// together, where a hash map of slot → facts would cost three random probes per counter.
#[derive(Debug, Default)]
pub(super) struct RoundState {
    /// This round's batch, in increasing slot order, one entry per slot.
    pub entries: Vec<Entry>,
    /// The entries' slots (a dense copy for the binary search).
    keys: Vec<u32>,
    /// (quota id, entry) in id order: a root's answer names counters by id, and most of
    /// them are this round's batch; finding their slots here rather than in the writer's id
    /// index spares a cache miss in that index per counter.
    by_id: Vec<(QuotaId, u32)>,
    /// Per entry: what the roots reported of its slot.
    facts: Vec<Facts>,
    /// Per entry: some root's fill includes it.
    pub reported: Vec<bool>,
    /// Empty, or per entry: of its admitted count, what this limiter's own bucket had
    /// drained when it was cut ([`DeltaBatch::drained`]).
    pub drained: Vec<u64>,
    /// Slots reported by a root that have no entry, in the order the reports came.
    others: Vec<(u32, Facts)>,
    /// Per shard: some root of it answered.
    ok_shards: Vec<bool>,
    /// When the round began: once it ends, `local` only counts what came after.
    pub began: u64,
    /// Some root answered.
    pub any_ok: bool,
    /// Some root has more quotas for this limiter.
    pub more: bool,
    /// Started by [`SyncEngine::wants_early_round`](super::SyncEngine::wants_early_round).
    pub early: bool,
}

impl RoundState {
    /// A round that began at `began` sending `entries` (in increasing slot order) to the
    /// roots of `shards` shards.
    pub fn new(began: u64, early: bool, entries: Vec<Entry>, shards: u32) -> Self {
        debug_assert!(entries.windows(2).all(|w| w[0].0 < w[1].0));
        let keys = entries.iter().map(|e| e.0).collect();
        let mut by_id: Vec<_> = entries.iter().enumerate().map(|(k, e)| (e.1, k as u32)).collect();
        by_id.sort_unstable();
        RoundState {
            facts: vec![Facts::default(); entries.len()],
            reported: vec![false; entries.len()],
            keys,
            by_id,
            entries,
            ok_shards: vec![false; shards as usize],
            began,
            early,
            ..RoundState::default()
        }
    }

    /// The batch entry of slot `s`.
    pub fn entry_of(&self, s: u32) -> Option<usize> {
        self.keys.binary_search(&s).ok()
    }

    /// The batch entry that carries quota `id`.
    pub fn entry_of_id(&self, id: QuotaId) -> Option<usize> {
        let i = self.by_id.binary_search_by_key(&id, |e| e.0).ok()?;
        Some(self.by_id[i].1 as usize)
    }

    /// The slot of the batch entry that carries `id`, for ids asked in increasing order
    /// from cursor `at` (0 for the first): one pass over the round's ids for them all.
    pub fn slot_of_id_from(&self, at: &mut usize, id: QuotaId) -> Option<u32> {
        while self.by_id.get(*at).is_some_and(|e| e.0 < id) {
            *at += 1;
        }
        let &(_, k) = self.by_id.get(*at).filter(|e| e.0 == id)?;
        Some(self.entries[k as usize].0)
    }

    /// Where to record a report of slot `s`, whose batch entry is `entry`: that entry's
    /// facts, or new ones in `others`.
    pub fn facts_mut(&mut self, s: u32, entry: Option<usize>) -> &mut Facts {
        match entry {
            Some(k) => &mut self.facts[k],
            None => {
                self.others.push((s, Facts::default()));
                let i = self.others.len() - 1;
                &mut self.others[i].1
            }
        }
    }

    /// A root's fill of quota `id` includes batch entry `entry` (when it still is that
    /// quota's): the counts to take out of `inflight`, the first time only.
    pub fn report(&mut self, entry: Option<usize>, id: QuotaId) -> Option<u64> {
        let k = entry.filter(|&k| !self.reported[k] && self.entries[k].1 == id)?;
        self.reported[k] = true;
        Some(self.entries[k].2)
    }

    /// Slot `s` was reset: the counts of its batch entry are gone with it, neither to take
    /// out of `inflight` again nor to fold back in at the end.
    pub fn drop_reset(&mut self, s: u32) {
        if let Some(k) = self.entry_of(s) {
            self.entries[k].2 = 0;
            self.reported[k] = true;
        }
    }

    /// A root of `shard` answered; `more`: it has more quotas for this limiter.
    pub fn answered(&mut self, shard: u32, more: bool) {
        self.any_ok = true;
        if let Some(ok) = self.ok_shards.get_mut(shard as usize) {
            *ok = true;
        }
        self.more |= more;
    }

    /// The round's batch as each shard's roots get it, all with the round's `seq`: only
    /// their counters' deltas, and an empty batch where a shard has none, so every root
    /// sees every `seq` (a root refuses a `seq` far ahead of what it acknowledged). Sorted by
    /// id, which protocol v2 encodes in a byte or two. None when nothing was counted.
    pub fn batches(&self, seq: u64, epoch: Epoch, shards: u32) -> Vec<Option<Arc<DeltaBatch>>> {
        if self.entries.is_empty() {
            return vec![None; shards as usize];
        }
        let mut per: Vec<Vec<(QuotaId, u64, u64)>> = vec![Vec::new(); shards as usize];
        let mut drained: Vec<Vec<u64>> = vec![Vec::new(); shards as usize];
        for &(id, k) in &self.by_id {
            let (_, _, v, r) = self.entries[k as usize];
            let shard = Shard::of(id, shards) as usize;
            per[shard].push((id, v, r));
            if let Some(&d) = self.drained.get(k as usize) {
                drained[shard].push(d);
            }
        }
        per.into_iter()
            .zip(drained)
            .map(|(deltas, mut drained)| {
                // Said only where some count drained: nothing else changes a root's sums.
                if drained.iter().all(|&d| d == 0) {
                    drained = Vec::new();
                }
                Some(Arc::new(DeltaBatch { seq, deltas, epoch: Some(epoch), drained }))
            })
            .collect()
    }

    /// Makes the reports of one slot from several roots one: the first `seen`, the highest
    /// demand (a stable sort keeps them in the order they came).
    pub fn merge_others(&mut self) {
        self.others.sort_by_key(|o| o.0);
        self.others.dedup_by(|later, first| {
            if later.0 != first.0 {
                return false;
            }
            first.1.seen = first.1.seen.or(later.1.seen);
            first.1.demand = first.1.demand.max(later.1.demand);
            true
        });
    }

    /// Some root of `shard` answered.
    pub fn shard_answered(&self, shard: u32) -> bool {
        self.ok_shards.get(shard as usize).copied().unwrap_or(self.any_ok)
    }

    /// No root of quota `id`'s shard answered: nothing is known of it this round.
    pub fn silent_shard(&self, id: QuotaId, shards: u32) -> bool {
        shards > 1 && !self.ok_shards[Shard::of(id, shards) as usize]
    }

    /// A walk over the round's slots in increasing order (after [`Self::merge_others`]).
    pub fn walk(&self) -> Walk<'_> {
        Walk { round: self, batch: Cursor::new(&self.entries), others: Cursor::new(&self.others) }
    }
}

/// What a round knows of slot after slot, in increasing slot order.
pub(super) struct Walk<'a> {
    round: &'a RoundState,
    batch: Cursor<'a, Entry>,
    others: Cursor<'a, (u32, Facts)>,
}

impl Walk<'_> {
    /// What the round knows of slot `s`, which holds quota `id` now: this round's admitted
    /// count of that quota (not of a former one of the slot), and what the roots reported.
    /// `s` never decreases between calls.
    #[inline]
    pub fn at(&mut self, s: u32, id: QuotaId) -> (Option<u64>, Facts) {
        let r = self.round;
        let entry = self.batch.seek(s, |e| e.0);
        let facts = match entry {
            Some(k) => r.facts[k],
            None => self.others.seek(s, |o| o.0).map_or_else(Facts::default, |i| r.others[i].1),
        };
        let own = entry.map(|k| r.entries[k]).filter(|e| e.1 == id).map(|e| e.2);
        (own, facts)
    }
}

/// Walks sorted `(slot, …)` lists alongside an increasing sequence of slots.
struct Cursor<'a, T> {
    items: &'a [T],
    at: usize,
}

impl<'a, T> Cursor<'a, T> {
    fn new(items: &'a [T]) -> Self {
        Cursor { items, at: 0 }
    }

    /// The position of `s` in the items, given `slot_of` each; `s` never decreases between
    /// calls.
    fn seek(&mut self, s: u32, slot_of: impl Fn(&T) -> u32) -> Option<usize> {
        while self.items.get(self.at).is_some_and(|t| slot_of(t) < s) {
            self.at += 1;
        }
        self.items.get(self.at).filter(|t| slot_of(t) == s).map(|_| self.at)
    }
}
