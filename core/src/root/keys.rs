//! Keys at a root: counters of names under templates, which have no row in the database.
//!
//! A limiter names a key by its wire id (derived from the name with the cluster's secret,
//! see [`crate::zone::keys::key_id`]) and says which template it belongs to
//! ([`SyncRequest::key_templates`]). The first delta or hint of a key id this root does not
//! know makes an entry for it with its template's limits, beside the quotas, and its counter
//! is summed and answered like any other. An entry leaves with its counter when the counter
//! is spent (drained, no recent demand), and with its template. Keys are bounded per template
//! and in all ([`RootConfig::max_keys`], [`RootConfig::max_keys_per_template`]): a limiter
//! naming more cannot grow a root, what is refused is counted and not summed.

use super::counters::NO_COUNTER;
use super::quotas::QuotaEntry;
use super::{IdMap, IdSet, RootState};
use crate::proto::SyncRequest;
use crate::quota::{is_template, raw_name, Epoch, QuotaId, QuotaUpdate};
use crate::zone::keys::{is_key_id, key_id};
use std::sync::Arc;

/// The keys a root holds, by template.
#[derive(Debug, Default)]
pub(super) struct Keys {
    /// The keys of each template.
    pub(super) of: IdMap<IdSet>,
    /// Keys held in all.
    pub(super) count: usize,
    /// This request's keys' templates ([`SyncRequest::key_templates`]).
    pub(super) asked: IdMap<QuotaId>,
    /// Live templates by their prefix (the bytes before `*`), for the admin API.
    pub(super) by_prefix: std::collections::BTreeMap<Vec<u8>, QuotaId>,
    /// Keys refused per template since the start (for metrics; one entry per template that
    /// ever refused, and templates are the operator's, so it stays small).
    pub(super) refused: IdMap<u64>,
    /// The epoch of each key's last reset ([`QuotaUpdate::is_key_reset`]), by key id, kept
    /// after the key's entry goes: a batch cut before the reset may come long after it
    /// (from a limiter cut off meanwhile) and must not bring its counts back. One pair per
    /// key ever reset, as the database holds a row per such key.
    pub(super) resets: IdMap<Epoch>,
}

impl RootState {
    /// Takes note of which template each key of `req` belongs to, for the deltas and hints
    /// that follow.
    pub(super) fn note_key_templates(&mut self, req: &SyncRequest) {
        self.keys.asked.clear();
        for &(key, template) in &req.key_templates {
            if is_key_id(key) && self.stripe.contains(key) {
                self.keys.asked.insert(key, template);
            }
        }
    }

    /// The entry of key `id`, made now from its template if this root holds none yet and
    /// the bounds allow; `false` when there is none.
    pub(super) fn key_entry(&mut self, id: QuotaId) -> bool {
        if self.quotas.contains_key(&id) {
            return true;
        }
        if !is_key_id(id) {
            return false;
        }
        let Some(&template) = self.keys.asked.get(&id) else { return false };
        let Some(t) = self.quotas.get(&template).filter(|t| !t.deleted) else { return false };
        if !is_template(&t.update.name) {
            return false;
        }
        let per_template = self.keys.of.get(&template).map_or(0, |k| k.len());
        if self.keys.count >= self.config.max_keys
            || per_template >= self.config.max_keys_per_template
        {
            self.stats.keys_refused += 1;
            *self.keys.refused.entry(template).or_default() += 1;
            return false;
        }
        let reset_epoch = t.reset_epoch.max(self.keys.resets.get(&id).copied().unwrap_or(0));
        let entry = QuotaEntry {
            limits: t.limits,
            reset_epoch,
            deleted: false,
            counter: NO_COUNTER,
            template: Some(template),
            update: Arc::clone(&t.update),
        };
        self.quotas.insert(id, entry);
        self.keys.of.entry(template).or_default().insert(id);
        self.keys.count += 1;
        self.stats.keys_created += 1;
        true
    }

    /// Applies a reset of one key (`u`, see [`QuotaUpdate::is_key_reset`]): its counter
    /// empties, and deltas and hints counted before the reset are dropped from now on, as
    /// for a quota's reset. Needs the cluster's secret to know the key's id.
    pub(super) fn reset_key(&mut self, u: &QuotaUpdate) {
        let Some(secret) = self.key_secret else { return };
        let id = key_id(secret, &raw_name(&u.name));
        if !self.stripe.contains(id) {
            return;
        }
        let at = self.keys.resets.entry(id).or_default();
        if *at >= u.reset_epoch {
            return;
        }
        *at = u.reset_epoch;
        let Some(q) = self.quotas.get_mut(&id).filter(|q| q.template.is_some()) else { return };
        q.reset_epoch = q.reset_epoch.max(u.reset_epoch);
        self.reset(id);
    }

    /// Removes key `id`'s entry (its counter is gone already, or goes now).
    pub(super) fn forget_key(&mut self, id: QuotaId) {
        let Some(q) = self.quotas.get(&id) else { return };
        let Some(template) = q.template else { return };
        self.drop_counter(id);
        self.quotas.remove(&id);
        if let Some(set) = self.keys.of.get_mut(&template) {
            set.remove(&id);
            if set.is_empty() {
                self.keys.of.remove(&template);
            }
        }
        self.keys.count -= 1;
    }

    /// Removes key `id`'s entry if it has neither a counter nor an escrow (its escrow's
    /// leases ended, its template lost its cap, a hint for it was older than a reset): an
    /// entry holds a place of the bounded keys, and nothing else would remove it before
    /// its template goes.
    pub(super) fn forget_if_bare(&mut self, id: QuotaId) {
        let bare =
            self.quotas.get(&id).is_some_and(|q| q.template.is_some() && q.counter == NO_COUNTER);
        if bare && !self.has_escrow(id) {
            self.forget_key(id);
        }
    }

    /// The live template whose prefix is the longest of the name `raw` (its bytes), if any:
    /// what limits `raw` when no quota has that name.
    pub fn template_for(&self, raw: &[u8]) -> Option<&QuotaUpdate> {
        (1..=raw.len()).rev().find_map(|len| {
            let id = self.keys.by_prefix.get(&raw[..len])?;
            self.quota(*id).filter(|q| !q.deleted)
        })
    }

    /// A template changed (`u`, applied already): its keys take its limits and reset, or
    /// go with it. Their counters drain at the old limit up to `now` first.
    pub(super) fn template_changed(&mut self, u: &Arc<QuotaUpdate>, now: u64) {
        if is_template(&u.name) {
            let prefix = crate::quota::raw_name(&u.name[..u.name.len() - 1]);
            if u.deleted {
                self.keys.by_prefix.remove(&prefix);
            } else {
                self.keys.by_prefix.insert(prefix, u.id);
            }
        }
        let Some(keys) = self.keys.of.get(&u.id) else { return };
        let keys: Vec<QuotaId> = keys.iter().copied().collect();
        if u.deleted || !is_template(&u.name) {
            for k in keys {
                self.forget_key(k);
            }
            return;
        }
        for k in keys {
            let Some(q) = self.quotas.get(&k) else { continue };
            let (old, counter, reset) = (q.limits, q.counter, u.reset_epoch > q.reset_epoch);
            if let Some(c) = self.counters.get_mut(counter) {
                c.bucket.edit(now, old.limit(), u.limits.limit());
            }
            if reset {
                self.reset(k);
            }
            if let Some(q) = self.quotas.get_mut(&k) {
                q.limits = u.limits;
                // A reset of this key alone may be newer than the template's.
                q.reset_epoch = q.reset_epoch.max(u.reset_epoch);
                q.update = Arc::clone(u);
            }
            if counter != NO_COUNTER && !reset {
                self.log_change(k, u.limits.limit());
            }
        }
    }

    /// Keys held, in all.
    pub fn key_count(&self) -> usize {
        self.keys.count
    }

    /// Keys held per template: (template id, keys), for metrics.
    pub fn keys_per_template(&self) -> Vec<(QuotaId, usize)> {
        self.keys.of.iter().map(|(&t, k)| (t, k.len())).collect()
    }

    /// Per live template, by name: keys held and keys refused since the start (this state's:
    /// a striped root sums its stripes').
    pub fn template_keys(&self) -> Vec<(String, usize, u64)> {
        self.keys
            .by_prefix
            .values()
            .filter_map(|&t| {
                let name = &self.quotas.get(&t)?.update.name;
                let held = self.keys.of.get(&t).map_or(0, |k| k.len());
                Some((name.clone(), held, self.keys.refused.get(&t).copied().unwrap_or(0)))
            })
            .collect()
    }
}
