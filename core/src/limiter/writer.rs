//! Quota changes: inserts, updates, deletes and parent links, by one writer at a time.
//!
//! The block holds everything a reader needs; the writing handle also keeps two caches in
//! its own memory: quota id → slot, and the children whose parent has not arrived. Several
//! processes may take turns as the writer (nginx: the sync agent moves to another worker
//! after a reload or a crash), so the caches are stamped with a random token that the
//! writer also stores in the block: a handle that finds another token there rebuilds its
//! caches from the block before writing. The block itself keeps every fact the caches hold
//! (ids in slots, a waiting child's parent name in an arena record).
//!
//! Slots of deleted quotas wait [`SLOT_QUARANTINE_NS`] in a first-in first-out list before
//! reuse, so a reader that found a slot an instant before the delete never sees another
//! quota's numbers in it.

use super::{ApplyReport, Limiter};
use crate::quota::{is_template, raw_name, validate_name, Epoch, QuotaId, QuotaUpdate};
use crate::units::{drain_view, Rate};
use crate::zone::arena::name;
use crate::zone::keys::{is_key_id, key_id, TEMPLATE};
use crate::zone::slot::{Peers, Slot, HIGH, ID, LIMIT, LOW, NAME, SHADOW, TAG_PARENT};
use crate::zone::{hdr, TEMPLATE_STATS, TSTAT_WORDS};
use hashbrown::HashTable;
use parking_lot::MutexGuard;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering::*;

/// How long a claim in the key table stands, seen by the sweep, before the sweep frees it
/// as left by a request path that died: far longer than any insert takes (the claim,
/// writing one slot, the publish), whatever the pace of the sweep, so that a path only
/// descheduled for a while finds its claim standing when it publishes.
pub(crate) const CLAIM_STALE_NS: u64 = 10_000_000_000;

/// How long a deleted quota's slot waits before it is reused.
pub(crate) const SLOT_QUARANTINE_NS: u64 = 2_000_000_000;

/// The writing handle's caches (see the module docs).
#[derive(Default)]
pub(crate) struct Writer {
    pub(super) token: u64,
    /// Slot indices, found by the slot's id.
    by_id: HashTable<u32>,
    /// Children whose parent is not (yet) known: child slot → parent name.
    unresolved: HashMap<u32, Box<str>>,
    /// Slots of the templates held.
    templates: HashSet<u32>,
    /// Claims the sweep of the key table found (position → claim, when first seen): one
    /// still there [`CLAIM_STALE_NS`] later belonged to a request path that died before
    /// publishing its key.
    claims: HashMap<u32, (u64, u64)>,
    /// The quotas behind each bit of the override filter (empty until the first count).
    pub(super) overrides: Vec<u32>,
    /// Every bit of the filter is set until the batch's recount: counts wait for it.
    pub(super) overrides_saturated: bool,
    /// Quotas held (`by_id` holds the keys learned too).
    quotas: u64,
}

/// The writer, held. Another process's writer that took the block over meanwhile (this
/// one stopped past the write section's staleness, see `section.rs`) rebuilt its caches
/// before this one's last writes: on release the token is cleared, so that every writer,
/// this one too, rebuilds from the block before its next batch instead of trusting caches
/// (the override filter's counts among them) that miss the other's writes.
pub(crate) struct WriterGuard<'a> {
    limiter: &'a Limiter,
    w: MutexGuard<'a, Writer>,
}

impl std::ops::Deref for WriterGuard<'_> {
    type Target = Writer;
    fn deref(&self) -> &Writer {
        &self.w
    }
}

impl std::ops::DerefMut for WriterGuard<'_> {
    fn deref_mut(&mut self) -> &mut Writer {
        &mut self.w
    }
}

impl Drop for WriterGuard<'_> {
    fn drop(&mut self) {
        let token = self.limiter.hdr(hdr::WRITER);
        if token.load(Acquire) != self.w.token {
            token.store(0, Release);
        }
    }
}

#[cfg(test)]
type MidBatch = std::cell::RefCell<Option<Box<dyn Fn(&Limiter)>>>;

#[cfg(test)]
thread_local! {
    /// Called after each update of a batch, in tests: what a request path may see then.
    pub(super) static MID_BATCH: MidBatch = const { std::cell::RefCell::new(None) };
}

#[cfg(test)]
thread_local! {
    /// Lookups of the writer's id index, in tests: the probes a round should spare.
    pub(crate) static FIND_IDS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// What [`Limiter::apply_quotas_with_resets`] did beyond its report.
#[derive(Debug, Default)]
pub(crate) struct Applied {
    pub(crate) report: ApplyReport,
    /// Slots a reset emptied (the sync engine must not fold counts of its round in flight
    /// back into them).
    pub(crate) resets: Vec<u32>,
    /// Keys reset: wire id and the reset's epoch.
    pub(crate) key_resets: Vec<(QuotaId, Epoch)>,
}

/// What one call of [`Limiter::apply_quotas_with_resets`] gathers on its way through the
/// updates.
#[derive(Default)]
struct Applying<'u> {
    now: u64,
    report: ApplyReport,
    resets: Vec<u32>,
    /// Keys reset ([`QuotaUpdate::is_key_reset`]): their wire id and the reset's epoch.
    key_resets: Vec<(QuotaId, Epoch)>,
    /// The highest epoch applied before this call: a key's reset older than it was applied
    /// then (a refetch brings it again).
    seen: Epoch,
    max_epoch: u64,
    /// Slots whose parent link is (re)made after the last update: `(child, parent name)`.
    parent_jobs: Vec<(u32, Option<&'u str>)>,
    /// Slots freed or renamed, by their former name: their children wait for that name.
    deleted: HashMap<u32, Box<str>>,
    /// A template was created, changed or deleted: its keys follow (see `refresh_templates`).
    templates: bool,
}

/// Drains `x`'s view at its old rate up to `now` when its rate becomes `limit` (a rate
/// word): the new rate counts from the edit on, as at the roots. The view's time can be
/// hours old on an idle counter, and drained at the new rate all the way back a lower
/// rate left it fuller than the roots' (a day's quota used up, idle 23 h, halved: 521
/// units of 500 against 42), and the larger of the two is what a limiter keeps.
fn drain_to_edit(x: &Slot<'_>, limit: u64, now: u64) {
    let old = x.get(LIMIT);
    let (base, at) = x.read_base();
    if old == limit || at == 0 {
        return;
    }
    if let Some(rate) = Rate::from_word(old) {
        let (base, at) = drain_view(base, at, rate, now);
        x.write_base(base, at);
    }
}

pub(super) fn hash_id(id: QuotaId) -> u64 {
    // Ids are sequential; spread them over the table with a multiplicative hash.
    id.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// How long a key has had no news (no root report of it, nothing of its own anchored) before
/// the agent's sweep frees it to make room, while the table is not nearly full. Like
/// `limit_req`, which frees a state only once it has drained and been unused for a minute:
/// a client that comes back within it finds its bucket, and its cluster view, where it left
/// them, instead of being inserted again (and, on a cluster, guessed at again, see
/// `Slot::estimate`).
pub(crate) const KEY_IDLE: u64 = 60_000_000_000;

impl Limiter {
    /// This handle's writer, its caches in step with the block.
    pub(super) fn writer(&self) -> WriterGuard<'_> {
        let mut w = self.writer.lock();
        // A batch that saturated the override filter and never reached its recount (a
        // panic in this process) left it all ones: counted again from the block.
        if w.token == 0 || w.overrides_saturated || self.hdr(hdr::WRITER).load(Acquire) != w.token {
            self.rebuild_writer(&mut w);
        }
        WriterGuard { limiter: self, w }
    }

    fn rebuild_writer(&self, w: &mut Writer) {
        w.by_id.clear();
        w.unresolved.clear();
        w.templates.clear();
        w.quotas = 0;
        let n = self.used_slots();
        for i in 0..n {
            let Some(s) = self.live_slot(i) else { continue };
            w.quotas += 1;
            let id = s.get(ID);
            w.by_id.insert_unique(hash_id(id), i, |&j| self.id_at(j));
            if is_template(&self.slot_name(i)) {
                w.templates.insert(i);
            }
            let off = self.cold(i).1.load(Relaxed) as u32;
            if off != 0 {
                let arena = self.arena();
                let parent = name::decode(|k| arena.word(off, k));
                w.unresolved.insert(i, String::from_utf8_lossy(&parent).into());
            }
        }
        self.map_key_ids(w, super::no_pace);
        // A writer that stopped in the middle of a batch may have left the filter
        // saturated or the bitmaps behind its templates: both from the block again.
        let (prefixes, lens, firsts) = self.template_prefixes(w);
        self.recount_overrides(w, &prefixes);
        self.publish_template_bitmaps(&lens, &firsts);
        let token = fastrand::u64(1..);
        self.hdr(hdr::WRITER).store(token, Release);
        w.token = token;
    }

    /// The templates' prefixes (without the `*`), and the bitmaps of their lengths and
    /// first bytes the request path matches names with.
    fn template_prefixes(&self, w: &Writer) -> (HashSet<Vec<u8>>, [u64; 4], [u64; 4]) {
        let mut lens = [0u64; 4];
        let mut firsts = [0u64; 4];
        let mut prefixes = HashSet::new();
        for &t in &w.templates {
            let Some(s) = self.live_slot(t) else { continue };
            let mut prefix = s.name(&self.arena());
            prefix.pop();
            let len = prefix.len();
            lens[len / 64 % 4] |= 1 << (len % 64);
            if let Some(&b) = prefix.first() {
                firsts[usize::from(b / 64)] |= 1 << (b % 64);
                prefixes.insert(prefix);
            }
        }
        (prefixes, lens, firsts)
    }

    fn publish_template_bitmaps(&self, lens: &[u64; 4], firsts: &[u64; 4]) {
        for i in 0..4 {
            self.hdr(hdr::TEMPLATE_LENS + i).store(lens[i], Release);
            self.hdr(hdr::TEMPLATE_FIRST + i).store(firsts[i], Release);
        }
    }

    /// Slots ever allocated (live or free).
    pub(super) fn used_slots(&self) -> u32 {
        self.hdr(hdr::NEXT_SLOT).load(Relaxed).min(u64::from(self.layout.slot_cap)) as u32
    }

    fn id_at(&self, s: u32) -> u64 {
        hash_id(self.slot(s).map_or(0, |x| x.get(ID)))
    }

    pub(super) fn find_id(&self, w: &Writer, id: QuotaId) -> Option<u32> {
        #[cfg(test)]
        FIND_IDS.set(FIND_IDS.get() + 1);
        w.by_id.find(hash_id(id), |&i| self.slot(i).is_some_and(|s| s.get(ID) == id)).copied()
    }

    /// Whether `u` may change which templates the block holds (make, delete or rename one,
    /// or rename a quota to or from a template's name), so that the override filter is to
    /// be counted again. A change of a template's numbers does not, nor does a refetch
    /// that brings the templates held.
    fn may_change_templates(&self, w: &Writer, u: &QuotaUpdate) -> bool {
        let template = is_template(&u.name);
        if !template && w.templates.is_empty() {
            return false;
        }
        let existing = self.find_id(w, u.id);
        let was_template = existing.is_some_and(|s| w.templates.contains(&s));
        if !template {
            return was_template;
        }
        match existing {
            None => !u.deleted,
            Some(s) => {
                u.deleted
                    || !was_template
                    || self.slot(s).map(|x| x.name(&self.arena())) != Some(raw_name(&u.name))
            }
        }
    }

    pub(super) fn id_count(w: &Writer) -> usize {
        w.by_id.len()
    }

    fn epoch_of(&self, s: u32) -> u64 {
        self.cold(s).0.load(Relaxed)
    }

    fn rehash_slot(&self, s: u32) -> u64 {
        match self.slot(s) {
            Some(x) => self.hash(&x.name(&self.arena())),
            None => 0,
        }
    }

    /// Applies quota changes (from a root, or directly when embedding): inserts, changes,
    /// deletes and re-parents, in any order and idempotently; an update older than the
    /// version held is ignored. A new quota that does not fit in the block is counted as
    /// missing and stays unlimited.
    pub fn apply_quotas(&self, updates: &[QuotaUpdate]) -> ApplyReport {
        self.apply_quotas_with_resets(updates).report
    }

    /// [`apply_quotas`](Self::apply_quotas), also listing the slots a reset emptied (the
    /// sync engine must not fold counts of its round in flight back into them).
    pub(crate) fn apply_quotas_with_resets(&self, updates: &[QuotaUpdate]) -> Applied {
        if updates.is_empty() {
            return Applied::default();
        }
        let mut a = Applying {
            now: self.clock.now_nanos(),
            seen: self.seen_epoch(),
            ..Applying::default()
        };
        let mut guard = self.writer();
        let w = &mut *guard;
        let recount = updates.iter().any(|u| self.may_change_templates(w, u));
        if recount {
            // A template made in this batch is in the index (request paths may match names
            // to it) before the filter is counted for it at the end: until then every name
            // takes the index, as before there was a filter.
            self.saturate_overrides(w);
        }
        for u in updates {
            if validate_name(&u.name).is_err() || u.id == 0 {
                a.report.invalid += 1;
                continue;
            }
            a.max_epoch = a.max_epoch.max(u.epoch);
            a.templates |= is_template(&u.name);
            let existing = self.find_id(w, u.id);
            if u.is_key_reset() {
                self.apply_key_reset(&mut a, u);
            }
            if u.deleted {
                self.apply_tombstone(w, &mut a, u, existing);
            } else if let Some(s) = existing {
                self.apply_change(w, &mut a, u, s);
            } else {
                self.apply_new(w, &mut a, u);
            }
            #[cfg(test)]
            MID_BATCH.with(|h| {
                if let Some(f) = h.borrow().as_ref() {
                    f(self);
                }
            });
            // A quota that did not fit in the block is not limited here at all: no entry.
            let cap = u.limits.max_in_flight();
            let slot = (!u.deleted && cap > 0).then(|| self.find_id(w, u.id)).flatten();
            self.set_permit_entry(u.id, slot.map(|s| (s, cap)));
        }
        // Links are made once every update is in: a child may come before its parent.
        self.unlink_children_of(w, &a.deleted);
        self.link_parents(w, &a.parent_jobs);
        let linked = self.link_waiting_children(w);
        // Keys take their parent from their template: a parent deleted or re-created moves
        // them too, and so does one a template waited for.
        if recount
            || a.templates
            || (!w.templates.is_empty() && !a.deleted.is_empty())
            || linked.iter().any(|c| w.templates.contains(c))
        {
            self.refresh_templates(w, a.now, recount);
        }
        self.hdr(hdr::EPOCH).fetch_max(a.max_epoch, Relaxed);
        self.hdr(hdr::EPOCH_SEEN).fetch_max(a.max_epoch, Relaxed);
        // A writer another process took over meanwhile counted without the other's
        // changes: the count is left to the writer that holds the block.
        if self.hdr(hdr::WRITER).load(Acquire) == w.token {
            self.hdr(hdr::QUOTAS).store(w.quotas, Relaxed);
        }
        Applied { report: a.report, resets: a.resets, key_resets: a.key_resets }
    }

    /// A reset of the key `u` names: its counter here empties at once (if this block holds
    /// the key), and the sync engine learns its id so that it takes no fill for it from a
    /// root that has not read the reset yet. Applied once: a refetch of every quota brings
    /// it again, older than what this block had seen.
    fn apply_key_reset(&self, a: &mut Applying<'_>, u: &QuotaUpdate) {
        if u.reset_epoch <= a.seen {
            return;
        }
        let raw = raw_name(&u.name);
        if self.find(&raw).is_some() {
            // The name has a quota of its own here: it is no key.
            return;
        }
        a.key_resets.push((key_id(self.cluster_secret(), &raw), u.reset_epoch));
        if let Some((s, slot)) = self.lookup(&raw) {
            slot.clear_counters();
            slot.write_base(0, a.now);
            a.resets.push(s);
            a.report.reset += 1;
        }
    }

    fn apply_tombstone(
        &self,
        w: &mut Writer,
        a: &mut Applying<'_>,
        u: &QuotaUpdate,
        existing: Option<u32>,
    ) {
        match existing {
            Some(s) if self.epoch_of(s) <= u.epoch => {
                let name = self.slot_name(s);
                self.free_slot(w, s, a.now);
                a.deleted.insert(s, name.into());
                a.report.deleted += 1;
            }
            Some(_) => a.report.stale += 1,
            None => {}
        }
    }

    /// An update of the quota held in slot `s`.
    fn apply_change<'u>(&self, w: &mut Writer, a: &mut Applying<'u>, u: &'u QuotaUpdate, s: u32) {
        if self.epoch_of(s) > u.epoch {
            a.report.stale += 1;
            return;
        }
        let raw = raw_name(&u.name);
        let same_name = self.slot(s).is_some_and(|x| x.name_eq(&raw, &self.arena()));
        if !same_name && !self.follow_rename(w, a, u, s) {
            return;
        }
        if u.reset_epoch > self.epoch_of(s) {
            // A reset this limiter has not applied: everything counted before it goes.
            if let Some(slot) = self.slot(s) {
                slot.clear_counters();
                slot.write_base(0, a.now);
            }
            a.resets.push(s);
            a.report.reset += 1;
        }
        if let Some(x) = self.slot(s) {
            drain_to_edit(&x, u.limits.limit().word(), a.now);
        }
        self.store_limits(s, u);
        a.parent_jobs.push((s, u.parent.as_deref()));
        a.report.updated += 1;
    }

    /// Gives slot `s` the update's new name; `false` (counted) when the update is stale or
    /// the name does not fit, and the update goes no further.
    fn follow_rename(&self, w: &mut Writer, a: &mut Applying<'_>, u: &QuotaUpdate, s: u32) -> bool {
        // Ids keep their name in the database; follow a rename anyway, and, as for a new
        // id, the name's older holder is gone.
        if !self.evict_older_holder(w, a, u) {
            return false;
        }
        // Children link to a parent by name: those of the old name wait for it.
        let old = self.slot_name(s);
        let renamed = self.rename(w, s, &raw_name(&u.name), a.now);
        a.templates |= w.templates.remove(&s);
        if renamed && is_template(&u.name) {
            w.templates.insert(s);
        }
        a.deleted.insert(s, old.into());
        if !renamed {
            self.free_slot(w, s, a.now);
            self.count_missing(&mut a.report);
            return false;
        }
        true
    }

    /// A quota this limiter does not hold yet.
    fn apply_new<'u>(&self, w: &mut Writer, a: &mut Applying<'u>, u: &'u QuotaUpdate) {
        // If the name still points at an older quota, that one was deleted and re-created
        // while this limiter was not looking.
        if !self.evict_older_holder(w, a, u) {
            return;
        }
        match self.insert(w, u, a.now) {
            Some(s) => {
                a.parent_jobs.push((s, u.parent.as_deref()));
                a.report.inserted += 1;
            }
            None => self.count_missing(&mut a.report),
        }
    }

    /// Frees the slot that holds `u`'s name under another id, unless that quota is newer
    /// than `u` (then `false`, counted as stale).
    fn evict_older_holder(&self, w: &mut Writer, a: &mut Applying<'_>, u: &QuotaUpdate) -> bool {
        let Some((old, _)) = self.find(&raw_name(&u.name)) else { return true };
        if self.epoch_of(old) > u.epoch {
            a.report.stale += 1;
            return false;
        }
        self.free_slot(w, old, a.now);
        a.deleted.insert(old, u.name.as_str().into());
        true
    }

    /// Children of a deleted quota lose the link but remember the name, so a re-created
    /// parent is linked again.
    fn unlink_children_of(&self, w: &mut Writer, deleted: &HashMap<u32, Box<str>>) {
        if deleted.is_empty() {
            return;
        }
        // Deleting a parent with children is refused by the admin API, so this scan is rare.
        for i in 0..self.used_slots() {
            let Some(s) = self.live_slot(i) else { continue };
            let p = s.parent();
            if p == 0 {
                continue;
            }
            if let Some(name) = deleted.get(&(p - 1)) {
                s.set_parent(0);
                self.set_unresolved(w, i, name);
            }
        }
    }

    fn link_parents(&self, w: &mut Writer, jobs: &[(u32, Option<&str>)]) {
        for &(s, parent) in jobs {
            let Some(slot) = self.live_slot(s) else { continue };
            match parent {
                None => {
                    slot.set_parent(0);
                    self.clear_unresolved(w, s);
                }
                Some(p) => match self.find(&raw_name(p)) {
                    Some((pi, _)) if pi != s => {
                        slot.set_parent(pi + 1);
                        self.clear_unresolved(w, s);
                    }
                    _ => {
                        slot.set_parent(0);
                        self.set_unresolved(w, s, p);
                    }
                },
            }
        }
    }

    /// Links the children whose parent has arrived, in this call or an earlier one.
    /// Links children that waited for their parent, now there; returns their slots.
    fn link_waiting_children(&self, w: &mut Writer) -> Vec<u32> {
        let mut linked = Vec::new();
        if w.unresolved.is_empty() {
            return linked;
        }
        let waiting: Vec<(u32, Box<str>)> =
            w.unresolved.iter().map(|(&c, p)| (c, p.clone())).collect();
        for (child, parent) in waiting {
            let Some(c) = self.live_slot(child) else {
                w.unresolved.remove(&child);
                continue;
            };
            if let Some((p, _)) = self.find(&raw_name(&parent)) {
                if p != child {
                    c.set_parent(p + 1);
                    self.clear_unresolved(w, child);
                    linked.push(child);
                }
            }
        }
        linked
    }

    fn count_missing(&self, report: &mut ApplyReport) {
        report.missing += 1;
        self.hdr(hdr::MISSING).fetch_add(1, Relaxed);
    }

    fn store_limits(&self, s: u32, u: &QuotaUpdate) {
        if let Some(slot) = self.slot(s) {
            slot.w(LIMIT).store(u.limits.limit().word(), Relaxed);
            slot.w(LOW).store(u.limits.low_burst(), Relaxed);
            let shadow = if u.limits.dry_run() { SHADOW } else { 0 };
            slot.w(HIGH).store(u.limits.high_burst() | shadow, Relaxed);
        }
        self.cold(s).0.store(u.epoch, Relaxed);
    }

    /// Writes `n` as slot `s`'s name (inline words and an arena tail); `false` when the
    /// arena is full.
    fn write_name(&self, s: u32, n: &[u8]) -> bool {
        let Some(slot) = self.slot(s) else { return false };
        let arena = self.arena();
        let tail_words = name::tail_words(n);
        let tail = if tail_words > 0 {
            let Some(off) = arena.alloc(tail_words) else { return false };
            for i in 0..tail_words {
                arena.set(off, i, name::word(n, name::INLINE + i));
            }
            off
        } else {
            0
        };
        slot.set_inline_name(n);
        slot.set_tail_off(tail);
        true
    }

    /// Frees slot `s`'s arena tail.
    fn drop_name(&self, s: u32) {
        let Some(slot) = self.slot(s) else { return };
        let n = slot.name(&self.arena());
        self.arena().free(slot.tail_off(), name::tail_words(&n));
        slot.set_tail_off(0);
    }

    pub(super) fn insert(&self, w: &mut Writer, u: &QuotaUpdate, now: u64) -> Option<u32> {
        let raw = raw_name(&u.name);
        let n = &raw[..];
        let h = self.hash(n);
        let s = self.alloc_slot(now)?;
        let slot = self.slot(s)?;
        if !self.write_name(s, n) {
            self.return_slot(s);
            return None;
        }
        slot.set_tag_parent((h >> 32) as u32, 0);
        self.store_limits(s, u);
        slot.clear_counters();
        self.cold(s).1.store(0, Relaxed);
        if self.index().insert(h, s, now, &|x| self.rehash_slot(x)).is_err() {
            self.drop_name(s);
            self.return_slot(s);
            return None;
        }
        slot.w(ID).store(u.id, Release);
        w.quotas += 1;
        self.count_override(w, n, true);
        w.by_id.insert_unique(hash_id(u.id), s, |&j| self.id_at(j));
        if is_template(&u.name) {
            w.templates.insert(s);
        }
        Some(s)
    }

    fn rename(&self, w: &mut Writer, s: u32, n: &[u8], now: u64) -> bool {
        let Some(slot) = self.slot(s) else { return false };
        let old = slot.name(&self.arena());
        let rehash = |x: u32| self.rehash_slot(x);
        // Counted only if its index entry was made: uncounted only if there was one (a
        // rename that failed leaves none, and freeing the slot then must not uncount again).
        if self.index().remove(self.hash(&old), s, now, &rehash) {
            self.count_override(w, &old, false);
        }
        self.drop_name(s);
        if !self.write_name(s, n) {
            return false;
        }
        let h = self.hash(n);
        slot.set_tag_parent((h >> 32) as u32, slot.parent());
        let indexed = self.index().insert(h, s, now, &rehash).is_ok();
        if indexed {
            self.count_override(w, n, true);
        }
        indexed
    }

    fn alloc_slot(&self, now: u64) -> Option<u32> {
        let head = self.hdr(hdr::FREE_HEAD).load(Relaxed) as u32;
        if head != 0 {
            let s = head - 1;
            let (freed_at, next) = self.cold(s);
            if now.saturating_sub(freed_at.load(Relaxed)) >= SLOT_QUARANTINE_NS {
                let next = next.load(Relaxed);
                self.hdr(hdr::FREE_HEAD).store(next, Relaxed);
                if next == 0 {
                    self.hdr(hdr::FREE_TAIL).store(0, Relaxed);
                }
                self.hdr(hdr::FREE_COUNT).fetch_sub(1, Relaxed);
                return Some(s);
            }
        }
        let n = self.hdr(hdr::NEXT_SLOT).load(Relaxed);
        if n >= u64::from(self.layout.slot_cap) {
            return None;
        }
        self.hdr(hdr::NEXT_SLOT).store(n + 1, Relaxed);
        Some(n as u32)
    }

    /// Gives back a slot that was allocated but never published.
    fn return_slot(&self, s: u32) {
        let next = self.hdr(hdr::NEXT_SLOT);
        if u64::from(s) + 1 == next.load(Relaxed) {
            next.store(u64::from(s), Relaxed);
        } else {
            self.push_free(s, 0);
        }
    }

    fn push_free(&self, s: u32, at: u64) {
        let (t, next) = self.cold(s);
        t.store(at, Relaxed);
        next.store(0, Relaxed);
        let tail = self.hdr(hdr::FREE_TAIL).load(Relaxed) as u32;
        if tail != 0 {
            self.cold(tail - 1).1.store(u64::from(s) + 1, Relaxed);
        } else {
            self.hdr(hdr::FREE_HEAD).store(u64::from(s) + 1, Relaxed);
        }
        self.hdr(hdr::FREE_TAIL).store(u64::from(s) + 1, Relaxed);
        self.hdr(hdr::FREE_COUNT).fetch_add(1, Relaxed);
    }

    fn free_slot(&self, w: &mut Writer, s: u32, now: u64) {
        let Some(slot) = self.slot(s) else { return };
        let id = slot.get(ID);
        let n = slot.name(&self.arena());
        if self.index().remove(self.hash(&n), s, now, &|x| self.rehash_slot(x)) {
            self.count_override(w, &n, false);
        }
        slot.w(ID).store(0, Release);
        if id != 0 {
            w.quotas = w.quotas.saturating_sub(1);
        }
        slot.set_parent(0);
        if let Ok(e) = w.by_id.find_entry(hash_id(id), |&i| i == s) {
            e.remove();
        }
        w.templates.remove(&s);
        self.clear_unresolved(w, s);
        self.drop_name(s);
        slot.clear_counters();
        self.push_free(s, now.max(1));
    }

    /// Remembers that child `s` waits for a parent called `parent` (in the block too, so a
    /// later writer knows).
    fn set_unresolved(&self, w: &mut Writer, s: u32, parent: &str) {
        if w.unresolved.get(&s).is_some_and(|p| &**p == parent) {
            return;
        }
        self.clear_unresolved(w, s);
        let n = parent.as_bytes();
        let arena = self.arena();
        if let Some(off) = arena.alloc(name::words(n)) {
            for i in 0..name::words(n) {
                arena.set(off, i, name::word(n, i));
            }
            self.cold(s).1.store(u64::from(off), Relaxed);
        }
        w.unresolved.insert(s, parent.into());
    }

    fn clear_unresolved(&self, w: &mut Writer, s: u32) {
        let cell = self.cold(s).1;
        let off = cell.load(Relaxed) as u32;
        if off != 0 && w.unresolved.contains_key(&s) {
            let arena = self.arena();
            let len = (arena.word(off, 0) & 0xFF) as usize;
            arena.free(off, (len + 1).div_ceil(8));
            cell.store(0, Relaxed);
        }
        w.unresolved.remove(&s);
    }

    /// After templates changed: their count, prefix lengths and first bytes in the header
    /// (what the request path matches names with), each key with its template's numbers
    /// and parent, and the keys of templates that are gone freed. A walk of the key table,
    /// only when a template changed; with `recount` (a batch that may make, delete or
    /// rename a template, and saturated the override filter first), a walk of the quotas
    /// too, to count the filter again before the new bitmaps are published.
    fn refresh_templates(&self, w: &mut Writer, now: u64, recount: bool) {
        let mut held: HashMap<u32, (u64, u64, u64, u32)> = HashMap::new();
        w.templates.retain(|&t| self.live_slot(t).is_some());
        for &t in &w.templates {
            let Some(s) = self.live_slot(t) else { continue };
            held.insert(t, (s.get(LIMIT), s.get(LOW), s.get(HIGH), s.parent()));
        }
        let (prefixes, lens, firsts) = self.template_prefixes(w);
        if recount {
            self.recount_overrides(w, &prefixes);
        }
        let keys = self.key_table();
        let now_ms = now / 1_000_000;
        let positions = if self.begin_key_walk() { keys.cap() } else { 0 };
        let mut found: HashMap<u32, u64> = HashMap::new();
        for pos in 0..positions {
            let Some(k) = keys.slot(pos) else { continue };
            // The key is claimed while its numbers change: a request path could otherwise
            // evict it and publish another key here between the load of its id and the
            // stores, which would then carry this template's numbers. Its readers wait
            // a moment (a claim of their name) meanwhile.
            let Some((id, mine)) = (0..8).find_map(|_| {
                let id = k.id();
                let mine = crate::zone::keys::writer_claim(k.get(NAME));
                (!is_key_id(id) || keys.claim(pos, id, mine)).then_some((id, mine))
            }) else {
                continue;
            };
            if !is_key_id(id) {
                continue;
            }
            let t = k.get(TEMPLATE).wrapping_sub(1) as u32;
            match held.get(&t) {
                Some(&(limit, low, high, parent)) => {
                    drain_to_edit(&k, limit, now);
                    k.w(LIMIT).store(limit, Relaxed);
                    k.w(LOW).store(low, Relaxed);
                    k.w(HIGH).store(high, Relaxed);
                    k.set_parent(parent);
                    // Nobody else changes a claim of the writer's (none is stale to the
                    // sweep, which runs on this thread).
                    let _ = k.w(ID).compare_exchange(mine, id, Release, Relaxed);
                    *found.entry(t).or_default() += 1;
                }
                None => {
                    if keys.free(pos, mine, now_ms) {
                        self.hdr(hdr::KEYS_LIVE).fetch_sub(1, Relaxed);
                        let s = self.layout.slot_cap + pos;
                        if let Ok(e) = w.by_id.find_entry(hash_id(id), |&i| i == s) {
                            e.remove();
                        }
                    }
                }
            }
        }
        self.assign_template_counts(&held, &found);
        self.publish_template_bitmaps(&lens, &firsts);
        self.hdr(hdr::TEMPLATES).store(held.len() as u64, Release);
    }

    /// The per-template counts after templates changed: the entries of templates gone are
    /// cleared, templates without one take the free ones (by slot, so the first templates a
    /// block holds keep theirs), and every entry's key count, `_other`'s too, is set to
    /// what the walk of the key table `found` (request paths inserting meanwhile may be
    /// off by their few keys until the next change).
    fn assign_template_counts<V>(&self, held: &HashMap<u32, V>, found: &HashMap<u32, u64>) {
        let id_of = |e: usize| self.hdr(hdr::TSTAT_IDS + e);
        let clear = |e: usize| {
            for what in 0..TSTAT_WORDS {
                self.template_count_at(e, what).store(0, Relaxed);
            }
        };
        let mut has_entry = HashSet::new();
        for e in 0..TEMPLATE_STATS {
            let v = id_of(e).load(Relaxed);
            if v == 0 {
                continue;
            }
            if held.contains_key(&((v - 1) as u32)) {
                has_entry.insert((v - 1) as u32);
            } else {
                id_of(e).store(0, Release);
                clear(e);
            }
        }
        let mut new: Vec<u32> = held.keys().copied().filter(|t| !has_entry.contains(t)).collect();
        new.sort_unstable();
        let mut new = new.into_iter();
        for e in 0..TEMPLATE_STATS {
            if id_of(e).load(Relaxed) != 0 {
                continue;
            }
            let Some(t) = new.next() else { break };
            clear(e);
            id_of(e).store(u64::from(t) + 1, Release);
        }
        let mut other = found.values().sum::<u64>();
        for e in 0..TEMPLATE_STATS {
            let v = id_of(e).load(Relaxed);
            let n = if v == 0 { 0 } else { found.get(&((v - 1) as u32)).copied().unwrap_or(0) };
            other -= n;
            self.template_count_at(e, super::keys::TSTAT_KEYS).store(n, Relaxed);
        }
        self.template_count_at(TEMPLATE_STATS, super::keys::TSTAT_KEYS).store(other, Relaxed);
    }

    /// Lets the writer find keys the request paths inserted, by their wire id: they come to
    /// the sync engine as dirty slots, and answers name them by id. Each key learned is
    /// marked in its slot ([`key_known`](Self::key_known)), so that the rounds after pass it
    /// by.
    pub(crate) fn learn_keys(&self, keys: &[(u32, u64)]) {
        if keys.is_empty() {
            return;
        }
        let mut guard = self.writer();
        let w = &mut *guard;
        for &(s, id) in keys {
            let at = match self.find_id(w, id) {
                Some(t) => t,
                None => {
                    w.by_id.insert_unique(hash_id(id), s, |&j| self.id_at(j));
                    s
                }
            };
            // Marked only where the map finds the key: one live in two slots at once (first
            // sights in two workers that both published) is looked up again in the other
            // at each round, so that it is learned there once the first goes.
            if at != s {
                continue;
            }
            let Some(slot) = self.slot(s).filter(|x| x.id() == id) else { continue };
            // One read-modify-write: a request path publishing another key here meanwhile
            // rewrites the whole word, before (its key then bears this key's mark, not its
            // own) or after (no mark).
            let mark = u64::from(crate::zone::keys::known_mark(id, w.token));
            let _ = slot
                .w(TAG_PARENT)
                .fetch_update(Relaxed, Relaxed, |v| Some(v & !0xFFFF_FFFF | mark));
        }
    }

    /// Drops the ids of keys that are gone from the writer's map (the sync engine calls it
    /// at the end of a round, after the round's calls). A request path that gives a
    /// drained key's slot to a new key cannot tell the writer, so the old key's entry
    /// stays (its slot names another id now: never found again, but kept), one per
    /// eviction, without end under churn. Once stale entries may be as many as live ones
    /// (and a sixteenth of the key table), the key entries are made again from the block:
    /// a walk of the key table, calling `pace` between its chunks (150 ms of the agent's
    /// thread for a million keys in a table of 2.2 million, in a release build), at most
    /// once per as many evictions as there are quotas and keys (15 s of the churn bench's
    /// 70,000 new keys a second).
    pub(crate) fn compact_key_ids(&self, pace: fn()) {
        let mut guard = self.writer();
        let w = &mut *guard;
        let live = w.quotas + self.hdr(hdr::KEYS_LIVE).load(Relaxed);
        let slack = u64::from(self.key_table().cap() / 16).max(1024);
        if (w.by_id.len() as u64) <= live.saturating_mul(2).saturating_add(slack) {
            return;
        }
        // Quotas' entries leave with their quota (`free_slot`): only keys' can be stale.
        let first_key = self.layout.slot_cap;
        w.by_id.retain(|s| *s < first_key);
        self.map_key_ids(w, pace);
    }

    /// Before a walk of the key table that gives keys new template numbers or frees them
    /// (templates or the secret changed, and the header says so already): bumps the
    /// generation a request path's insert compares before and after its publish (see
    /// `Limiter::key_of`), so that an insert that read the old numbers either is met by the
    /// walk, published, or sees the bump and inserts its key again. Whether the table holds
    /// keys to walk: none, and no insert that read the old numbers can have been missed.
    fn begin_key_walk(&self) -> bool {
        self.hdr(hdr::KEY_GEN).fetch_add(1, SeqCst);
        std::sync::atomic::fence(SeqCst);
        self.hdr(hdr::KEYS_LIVE).load(Relaxed) != 0
    }

    /// Enters every key of the key table in the writer's map of ids, calling `pace` once
    /// per chunk of the walk.
    fn map_key_ids(&self, w: &mut Writer, pace: fn()) {
        let keys = self.key_table();
        // A walk of the whole table, only when it holds keys (a fresh block holds none).
        let positions = if self.hdr(hdr::KEYS_LIVE).load(Relaxed) > 0 { keys.cap() } else { 0 };
        for pos in 0..positions {
            if pos % 4096 == 0 {
                pace();
            }
            let Some(k) = keys.slot(pos) else { continue };
            let id = k.id();
            if is_key_id(id) {
                let s = self.layout.slot_cap + pos;
                w.by_id.insert_unique(hash_id(id), s, |&j| self.id_at(j));
            }
        }
    }

    /// Whether writer `w` knows key `id` in slot `s` by its id (its mark is there): marks
    /// are set only where its map finds the key, and a key leaves the map only when freed,
    /// before another's publish rewrites the mark. A writer that rebuilt (another process's
    /// took over meanwhile) has a new token, and learns each key again once.
    #[inline]
    pub(crate) fn key_known(&self, w: &Writer, s: u32, id: u64) -> bool {
        self.slot(s).is_some_and(|x| x.tag() == crate::zone::keys::known_mark(id, w.token))
    }

    /// Takes the cluster's secret for key ids from a root, the first time one gives it
    /// (every root of a cluster reads the same from its database; a block keeps the first
    /// for its life, so roots that disagree cannot make its keys change ids every round).
    /// Keys counted before, under the block's own secret, have other ids: they are freed,
    /// to be counted again under the cluster's.
    pub(crate) fn set_cluster_secret(&self, secret: (u64, u64), now: u64) {
        if self.hdr(hdr::CLUSTER_SECRET_SET).load(Acquire) != 0 {
            // The first stays: keys keep their ids for the zone's life. Another one means
            // some root's keys are not this host's (counted for the operator to see).
            let held = (
                self.hdr(hdr::CLUSTER_SECRET).load(Relaxed),
                self.hdr(hdr::CLUSTER_SECRET + 1).load(Relaxed),
            );
            if held != secret {
                self.hdr(hdr::KEY_SECRET_CONFLICTS).fetch_add(1, Relaxed);
            }
            return;
        }
        let mut guard = self.writer();
        let w = &mut *guard;
        // Publish "unset" first: a request path inserting a key meanwhile uses the block's
        // own secret, and its key is freed below with the others.
        self.hdr(hdr::CLUSTER_SECRET_SET).store(0, Release);
        self.hdr(hdr::CLUSTER_SECRET).store(secret.0, Relaxed);
        self.hdr(hdr::CLUSTER_SECRET + 1).store(secret.1, Relaxed);
        self.hdr(hdr::CLUSTER_SECRET_SET).store(1, Release);
        if !self.begin_key_walk() {
            return;
        }
        let keys = self.key_table();
        let now_ms = now / 1_000_000;
        for pos in 0..keys.cap() {
            let Some(k) = keys.slot(pos) else { continue };
            let id = k.id();
            let t = k.get(TEMPLATE).wrapping_sub(1) as u32;
            if is_key_id(id) && keys.free(pos, id, now_ms) {
                self.hdr(hdr::KEYS_LIVE).fetch_sub(1, Relaxed);
                self.key_gone(t, false);
                let s = self.layout.slot_cap + pos;
                if let Ok(e) = w.by_id.find_entry(hash_id(id), |&i| i == s) {
                    e.remove();
                }
            }
        }
    }

    /// For the keys among `ids` (in any order, repeated or not): their template's id, sorted
    /// by key, for a root that may meet them for the first time. `slot_hint` may tell where
    /// a key is (the round's batch knows its own keys' slots), asked in increasing order of
    /// id; a hint is checked, and a key without one is looked up among all the writer knows.
    pub(crate) fn key_templates(
        &self,
        ids: impl Iterator<Item = QuotaId>,
        mut slot_hint: impl FnMut(QuotaId) -> Option<u32>,
    ) -> Vec<(QuotaId, QuotaId)> {
        let mut keys: Vec<QuotaId> = ids.filter(|&id| is_key_id(id)).collect();
        if keys.is_empty() {
            return keys.into_iter().map(|k| (k, 0)).collect();
        }
        keys.sort_unstable();
        keys.dedup();
        let w = self.writer();
        keys.into_iter()
            .filter_map(|k| {
                let s = slot_hint(k)
                    .filter(|&s| self.slot(s).is_some_and(|x| x.id() == k))
                    .or_else(|| self.find_id(&w, k))?;
                let t = self.template_of_key(s)?;
                Some((k, self.live_slot(t)?.get(ID)))
            })
            .collect()
    }

    /// One step of the sweep of the key table, from where the last ended: while it is over
    /// half full, a sixteenth of it, freeing keys that are drained, have nothing counted,
    /// in flight or waiting for a round, and have had no news for [`KEY_IDLE`] (no root
    /// report, no count anchored; any idle key once the table is seven eighths full), and
    /// claims left by a request path that died (or that found its template gone). Below
    /// half full only those claims are looked for, rare leftovers that only take a place
    /// in a window, so a step reads a 256th of the table (at least 256 positions): a
    /// sixteenth was 2.2 ms of the agent's thread a round, and 17 MB of the caches, at
    /// 2.2 million keys. Freed keys rest before reuse (see `zone/keys.rs`). Returns the
    /// keys freed.
    pub(crate) fn sweep_keys(&self, now: u64) -> usize {
        let keys = self.key_table();
        let cap = keys.cap();
        let live = self.hdr(hdr::KEYS_LIVE).load(Relaxed);
        // Also with no key live: the only insert may have died (a claim, maybe over the
        // only key). A step reads at least 256 positions' first words then, some 10 µs.
        if cap == 0 {
            return 0;
        }
        let mut guard = self.writer();
        let w = &mut *guard;
        let crowded = live > u64::from(cap) / 2;
        let nearly_full = live > u64::from(cap) / 8 * 7;
        let (fresh, horizon, now_ms) =
            (self.hdr(hdr::FRESH).load(Relaxed) != 0, self.horizon_at(now), now / 1_000_000);
        let start = self.hdr(hdr::KEY_HAND).load(Relaxed) as u32 % cap;
        let budget = if crowded { cap.div_ceil(16) } else { cap.div_ceil(256).max(256).min(cap) };
        let mut freed = 0;
        for i in 0..budget {
            let pos = (start + i) % cap;
            let Some(k) = keys.slot(pos) else { continue };
            let id = k.id();
            let s = self.layout.slot_cap + pos;
            if crate::zone::keys::is_claim(id) {
                match w.claims.get(&pos) {
                    Some(&(c, seen)) if c == id => {
                        if now.saturating_sub(seen) >= CLAIM_STALE_NS && keys.free(pos, id, now_ms)
                        {
                            // A claim counts as the key it was to become; a writer's (an
                            // agent that died inside a template rewrite) was a key, whose
                            // template word is still right.
                            self.hdr(hdr::KEYS_LIVE).fetch_sub(1, Relaxed);
                            if crate::zone::keys::is_writer_claim(id) {
                                self.key_gone(k.get(TEMPLATE).wrapping_sub(1) as u32, true);
                            }
                            w.claims.remove(&pos);
                        }
                    }
                    _ => {
                        w.claims.insert(pos, (id, now));
                    }
                }
                continue;
            }
            w.claims.remove(&pos);
            if !crowded || !is_key_id(id) {
                continue;
            }
            let idle = k.get(crate::zone::slot::LOCAL) == 0
                && k.get(crate::zone::slot::INFLIGHT) == 0
                && k.get(crate::zone::slot::REJECTED) == 0
                && !self.is_dirty(s)
                && (nearly_full || now.saturating_sub(k.get(crate::zone::slot::AT)) >= KEY_IDLE)
                && k.estimate(now, fresh, horizon, Peers::ALONE) <= 0.0;
            let t = k.get(TEMPLATE).wrapping_sub(1) as u32;
            if idle && keys.free(pos, id, now_ms) {
                self.hdr(hdr::KEYS_LIVE).fetch_sub(1, Relaxed);
                self.hdr(hdr::KEY_EVICTIONS).fetch_add(1, Relaxed);
                self.key_gone(t, true);
                if let Ok(e) = w.by_id.find_entry(hash_id(id), |&j| j == s) {
                    e.remove();
                }
                freed += 1;
            }
        }
        self.hdr(hdr::KEY_HAND).store(u64::from((start + budget) % cap), Relaxed);
        freed
    }

    /// Names of the quotas currently held (for tests and debugging; walks every slot).
    #[doc(hidden)]
    pub fn names(&self) -> HashSet<String> {
        (0..self.used_slots())
            .filter(|&i| self.live_slot(i).is_some())
            .map(|i| self.slot_name(i))
            .collect()
    }
}
