//! The quota table as the sync path reads it, the quotas read from the database, resets,
//! and the deltas held for quotas not read yet.

use super::counters::NO_COUNTER;
use super::RootState;
use crate::quota::{is_template, Epoch, Limits, QuotaId, QuotaUpdate};
use crate::units::NANOS_PER_SEC;
use std::sync::Arc;

/// How long deltas of a quota this root has not read yet wait for it: a few of the
/// server's database polls (1 s).
pub const HOLD_NS: u64 = 10 * NANOS_PER_SEC;

/// Deltas held for one quota not read yet
/// ([`RootStats::deltas_held`](super::RootStats::deltas_held)).
#[derive(Debug, Clone, Copy)]
pub(super) struct Held {
    pub(super) admitted: u64,
    pub(super) rejected: u64,
    /// The lowest quota epoch of the batches they came in (for the reset check).
    pub(super) epoch: Epoch,
    /// When the first came.
    pub(super) since: u64,
    /// Delta entries summed here.
    pub(super) entries: u64,
}

/// A quota as the sync path needs it: what every delta reads (limits, reset epoch, whether
/// deleted) inline in the map's slot, one cache line with its key, and the stored update
/// behind it only for the answers' quota pages and the admin API. Reading the limits
/// through the `Arc` cost a second cache miss for every delta of every limiter.
#[derive(Debug)]
pub(super) struct QuotaEntry {
    pub(super) limits: Limits,
    pub(super) reset_epoch: Epoch,
    pub(super) deleted: bool,
    /// Its counter's place in the slab ([`NO_COUNTER`]: none), here because every delta
    /// reads this entry anyway: a map of its own was one more cache miss per new counter.
    pub(super) counter: u32,
    /// For a key's entry: its template's id (see `keys.rs`).
    pub(super) template: Option<QuotaId>,
    pub(super) update: Arc<QuotaUpdate>,
}

impl RootState {
    /// The stored quota or tombstone with this id.
    pub fn quota(&self, id: QuotaId) -> Option<&QuotaUpdate> {
        self.quotas.get(&id).map(|q| &*q.update)
    }

    /// Applies quotas and tombstones read from the database. Older versions than held are
    /// ignored; a deleted quota's counter is dropped; a changed limit drains the counter at
    /// the old rate up to `now` first.
    pub fn apply_quotas(&mut self, updates: impl IntoIterator<Item = QuotaUpdate>, now: u64) {
        self.apply_quota_arcs(updates.into_iter().map(Arc::new), now);
    }

    /// [`apply_quotas`](Self::apply_quotas) with updates shared between the stripes of a
    /// root. Apply them to every other stripe before the lead: a limiter learns a quota
    /// from the lead's pages, and its deltas must find the quota at their stripe.
    pub fn apply_quota_arcs(
        &mut self,
        updates: impl IntoIterator<Item = Arc<QuotaUpdate>>,
        now: u64,
    ) {
        let lead = self.stripe.is_lead();
        for u in updates {
            self.epoch = self.epoch.max(u.epoch);
            self.highest_id = self.highest_id.max(u.id);
            if u.is_key_reset() {
                // Every stripe looks: the key's counter may be in any.
                self.reset_key(&u);
            }
            // Every stripe holds every template: its keys may be anywhere.
            if !lead && !self.stripe.contains(u.id) && !is_template(&u.name) {
                continue;
            }
            if let Some(old) = self.quotas.get(&u.id) {
                if old.update.epoch >= u.epoch {
                    continue;
                }
                self.by_epoch.remove(&old.update.epoch);
                if let Some(c) = self.counters.get_mut(old.counter) {
                    c.bucket.edit(now, old.limits.limit(), u.limits.limit());
                }
                // A key's reset records itself in a row whose id has no counter.
                if u.reset_epoch > old.reset_epoch && !u.is_key_reset() {
                    self.reset(u.id);
                }
            }
            if lead {
                self.by_epoch.insert(u.epoch, u.id);
            }
            if u.deleted {
                self.drop_counter(u.id);
            }
            let was_live = self.quotas.get(&u.id).is_some_and(|q| !q.deleted);
            match (was_live, u.deleted) {
                (false, false) => self.live += 1,
                (true, true) => self.live -= 1,
                _ => {}
            }
            let (id, deleted, limits, reset_epoch) = (u.id, u.deleted, u.limits, u.reset_epoch);
            // The counter stays where it is (a deleted quota's is gone by now).
            let counter = self.quotas.get(&id).map_or(NO_COUNTER, |q| q.counter);
            let entry = QuotaEntry {
                limits: u.limits,
                reset_epoch: u.reset_epoch,
                deleted: u.deleted,
                counter,
                template: None,
                update: Arc::clone(&u),
            };
            self.quotas.insert(id, entry);
            self.template_changed(&u, now);
            if !deleted && counter != NO_COUNTER {
                // The change log holds the limit it drains at: record the new one.
                self.log_change(id, limits.limit());
            }
            if let Some(h) = self.held.remove(&id) {
                self.release_held(id, h, (!deleted).then_some((limits, reset_epoch)), now);
            }
        }
    }

    /// Empties a counter (a cluster-wide reset): its fill, demand, rate and every claim
    /// parked for it. Deltas and hints counted before the reset are dropped as they come
    /// (`claim_delta`, `apply_hints`).
    pub(super) fn reset(&mut self, id: QuotaId) {
        self.drop_counter(id);
        let mut dropped = 0;
        for s in self.limiters.values_mut() {
            if s.parked.remove(&id).is_some() {
                dropped += 1;
            }
        }
        self.parked -= dropped;
        // Limiters empty their own copy when they apply the same quota version. Counted by
        // the stripe that holds the counter.
        if self.stripe.contains(id) {
            self.stats.resets += 1;
        }
    }

    /// The epoch of quota `id`'s last reset (0 if none).
    pub(super) fn reset_epoch(&self, id: QuotaId) -> Epoch {
        self.quotas.get(&id).map_or(0, |q| q.reset_epoch)
    }

    /// The limits of quota `id`; `None` if this root has no live quota of that id.
    pub(super) fn live_limits(&self, id: QuotaId) -> Option<Limits> {
        self.quotas.get(&id).filter(|q| !q.deleted).map(|q| q.limits)
    }

    /// Holds a delta of quota `id`, not read yet, until it is
    /// ([`RootStats::deltas_held`](super::RootStats::deltas_held)).
    pub(super) fn hold(
        &mut self,
        id: QuotaId,
        amount: u64,
        rejected: u64,
        epoch: Option<Epoch>,
        now: u64,
    ) {
        if now.saturating_sub(self.held_swept) >= HOLD_NS / 4 {
            self.held_swept = now;
            let mut expired = 0;
            self.held.retain(|_, h| {
                let keep = now.saturating_sub(h.since) <= HOLD_NS;
                if !keep {
                    expired += h.entries;
                }
                keep
            });
            self.stats.deltas_unknown += expired;
        }
        let full = self.held.len() >= self.config.max_held;
        let h = match self.held.entry(id) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(_) if full => {
                self.stats.deltas_unknown += 1;
                return;
            }
            std::collections::hash_map::Entry::Vacant(e) => e.insert(Held {
                admitted: 0,
                rejected: 0,
                epoch: Epoch::MAX,
                since: now,
                entries: 0,
            }),
        };
        h.admitted = h.admitted.saturating_add(amount);
        h.rejected = h.rejected.saturating_add(rejected);
        h.epoch = h.epoch.min(epoch.unwrap_or(Epoch::MAX));
        h.entries += 1;
        self.stats.deltas_held += 1;
    }

    /// Applies what was held for quota `id` now that it was read (`quota`: its limits and
    /// reset epoch, `None` if it arrived deleted), unless it waited too long or predates
    /// a reset. Admitted counts beyond the ceiling are dropped: no session to park them
    /// with.
    fn release_held(&mut self, id: QuotaId, h: Held, quota: Option<(Limits, Epoch)>, now: u64) {
        match quota {
            Some((limits, reset_epoch))
                if now.saturating_sub(h.since) <= HOLD_NS && h.epoch >= reset_epoch =>
            {
                let excess = self.add_delta(id, Some(limits), h.admitted, h.rejected, now);
                if excess > 0 {
                    self.stats.claims_dropped += 1;
                }
            }
            _ => self.stats.deltas_unknown += h.entries,
        }
    }
}
