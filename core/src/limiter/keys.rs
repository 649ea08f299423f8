//! Names under templates: finding a name's template, and its key's slot, inserted on first
//! sight by whichever request path meets it (the table and its rules are in
//! `zone/keys.rs`).

use super::writer::Writer;
use super::{Limiter, MAX_CHAIN};
use crate::zone::keys::{self, is_key_id, KeyTable, Probe, TEMPLATE};
use crate::zone::slot::{Peers, Slot, HIGH, INFLIGHT, LIMIT, LOCAL, LOW, REJECTED};
use crate::zone::{hdr, OVERRIDE_BITS, TEMPLATE_STATS, TSTAT_WORDS};
use std::collections::{BTreeSet, HashSet};
use std::sync::atomic::Ordering::*;

/// Longest name a template can match: the length byte of a name.
const MAX_PREFIX: usize = 255;
/// Times a request path looks again for a key another is inserting right now.
const BUSY_TRIES: u32 = 64;
/// Times a request path inserts a key again because the writer changed templates or the
/// cluster's secret while it did.
const STALE_TRIES: u32 = 4;
/// The per-template counts: keys held, keys evicted for another, keys refused for want of
/// room (see `hdr::TSTAT_COUNTS`).
pub(super) const TSTAT_KEYS: usize = 0;
pub(super) const TSTAT_EVICTED: usize = 1;
pub(super) const TSTAT_REFUSED: usize = 2;

/// The writer changed templates or the cluster's secret while a key was inserted.
#[derive(Debug)]
pub(super) struct Stale;

/// What became of a publish.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Published {
    Yes,
    /// The claim no longer stood: look again.
    ClaimLost,
    /// Published with what may be stale numbers, and freed: start over.
    Stale,
}

/// An insert of a key between its claim and its publish: what it publishes.
pub(super) struct Insert {
    pos: u32,
    mine: u64,
    gen: u64,
    id: u64,
    t: u32,
    limits: (u64, u64, u64),
    parent: u32,
}

impl Limiter {
    #[inline]
    pub(super) fn key_table(&self) -> KeyTable<'_> {
        KeyTable::new(self.words(), &self.layout)
    }

    /// The slot deciding for `name`: its quota's, or its key's under the template with the
    /// longest prefix of it (inserted now if new). `None`: unlimited.
    ///
    /// A name a template covers looks for a quota of its own (an override) only when the
    /// override filter says one may exist: a key's request then costs one miss (its slot)
    /// rather than two (an index entry that finds nothing, then its slot).
    #[inline]
    pub(super) fn resolve(&self, name: &[u8], now: u64) -> Option<(u32, Slot<'_>)> {
        if self.hdr(hdr::TEMPLATES).load(Relaxed) == 0 {
            return self.find(name);
        }
        self.resolve_templated(name, now)
    }

    /// [`resolve`](Self::resolve) in a block with templates (apart, so that the path of
    /// blocks without stays as small as it was).
    #[inline(never)]
    fn resolve_templated(&self, name: &[u8], now: u64) -> Option<(u32, Slot<'_>)> {
        for _ in 0..STALE_TRIES {
            // Before the template is chosen and its numbers and the secret are read: a key
            // inserted with them is made again if the writer changed any meanwhile.
            let gen = self.hdr(hdr::KEY_GEN).load(Acquire);
            let Some(t) = self.template_for(name) else { return self.find(name) };
            let h = keys::name_hash(self.key_secret(), name);
            if self.may_have_quota(h) {
                if let Some(found) = self.own_quota(name) {
                    return Some(found);
                }
            }
            if let Ok(found) = self.key_of(t, name, h, now, gen) {
                return found;
            }
        }
        // Templates change without pause: this request takes its own quota's bucket if it
        // has one, else its template's.
        let Some(t) = self.template_for(name) else { return self.find(name) };
        self.own_quota(name).or_else(|| self.live_slot(t).map(|x| (t, x)))
    }

    /// The quota of a name a template covers, if it has one (an override). A name ending
    /// in `*` is a template's own and never an override: request data that spells one
    /// (`api_key_*` from `X-Api-Key: *`) is a key like any other, not the template's own
    /// bucket, which the keys that found no room share (and, with a cap, the keys new to
    /// the host).
    fn own_quota(&self, name: &[u8]) -> Option<(u32, Slot<'_>)> {
        if name.last() == Some(&b'*') {
            return None;
        }
        self.find(name)
    }

    /// The slot of `name` without creating anything: its quota's, or its key's if the key
    /// is in the table.
    pub(super) fn lookup(&self, name: &[u8]) -> Option<(u32, Slot<'_>)> {
        if let Some(found) = self.find(name) {
            return Some(found);
        }
        if self.hdr(hdr::TEMPLATES).load(Relaxed) == 0 {
            return None;
        }
        self.template_for(name)?;
        let h = keys::name_hash(self.key_secret(), name);
        match self.key_table().probe(h, 0) {
            Probe::Found(pos) => self.key_slot(pos),
            _ => None,
        }
    }

    /// The template slot whose prefix is the longest of `name`'s, if any.
    pub(super) fn template_for(&self, name: &[u8]) -> Option<u32> {
        let &first = name.first()?;
        let firsts = self.hdr(hdr::TEMPLATE_FIRST + usize::from(first / 64)).load(Relaxed);
        if firsts & 1 << (first % 64) == 0 {
            return None;
        }
        let mut buf = [0u8; MAX_PREFIX + 1];
        let longest = name.len().min(MAX_PREFIX - 1);
        for word in (0..4).rev() {
            let bits = self.hdr(hdr::TEMPLATE_LENS + word).load(Relaxed);
            let mut b = bits;
            while b != 0 {
                let top = 63 - b.leading_zeros() as usize;
                b &= !(1 << top);
                let len = word * 64 + top;
                if len == 0 || len > longest {
                    continue;
                }
                buf[..len].copy_from_slice(&name[..len]);
                buf[len] = b'*';
                if let Some((t, _)) = self.find(&buf[..=len]) {
                    return Some(t);
                }
            }
        }
        None
    }

    /// Which entry of the per-template counts counts template slot `t`'s keys: its own if
    /// it has one, else `_other` (the last). A scan of `TEMPLATE_STATS` words, on a key's
    /// insertion, eviction or refusal only.
    pub(super) fn template_entry(&self, t: u32) -> usize {
        let want = u64::from(t) + 1;
        let ids = &self.words()[hdr::TSTAT_IDS..hdr::TSTAT_IDS + TEMPLATE_STATS];
        ids.iter().position(|w| w.load(Relaxed) == want).unwrap_or(TEMPLATE_STATS)
    }

    /// Count `what` (a `TSTAT_*`) of entry `e` of the per-template counts.
    pub(super) fn template_count_at(&self, e: usize, what: usize) -> &std::sync::atomic::AtomicU64 {
        self.hdr(hdr::TSTAT_COUNTS + e * TSTAT_WORDS + what)
    }

    fn template_count(&self, t: u32, what: usize) -> &std::sync::atomic::AtomicU64 {
        self.template_count_at(self.template_entry(t), what)
    }

    /// A key of template slot `t` left the table (`evicted`: for another key).
    pub(super) fn key_gone(&self, t: u32, evicted: bool) {
        let e = self.template_entry(t);
        // Never below 0: a key counted under `_other` before its template had an entry
        // may leave from the entry (the writer recounts both when templates change).
        let _ = self
            .template_count_at(e, TSTAT_KEYS)
            .fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_sub(1)));
        if evicted {
            self.template_count_at(e, TSTAT_EVICTED).fetch_add(1, Relaxed);
        }
    }

    /// The template a key slot belongs to.
    pub(super) fn template_of_key(&self, s: u32) -> Option<u32> {
        if !self.is_key_slot(s) {
            return None;
        }
        let t = self.slot(s)?.get(TEMPLATE);
        (t != 0).then(|| t as u32 - 1)
    }

    /// The key slot of `name` under template slot `t`, found or inserted; the template's
    /// own slot when the key table has no room for it (the template's bucket then limits
    /// every key that did not fit together, rather than none of them). `Err` when the
    /// writer changed templates or the secret since the key generation `gen` was read,
    /// before `t` was chosen: an insert must start over from the template.
    pub(super) fn key_of(
        &self,
        t: u32,
        name: &[u8],
        h: (u64, u64),
        now: u64,
        gen: u64,
    ) -> Result<Option<(u32, Slot<'_>)>, Stale> {
        let table = self.key_table();
        let now_ms = now / 1_000_000;
        let shared = || Ok(self.live_slot(t).map(|x| (t, x)));
        for _ in 0..BUSY_TRIES {
            match table.probe(h, now_ms) {
                Probe::Found(pos) => match self.key_slot(pos) {
                    Some(found) => return Ok(Some(found)),
                    // Freed or taken over since the probe matched it: look again.
                    None => continue,
                },
                Probe::Busy => std::hint::spin_loop(),
                Probe::Absent(free) => {
                    let taken = free.or_else(|| self.evictable_in_window(&table, h.0, now));
                    let Some((pos, old)) = taken else {
                        self.hdr(hdr::KEYS_REFUSED).fetch_add(1, Relaxed);
                        self.template_count(t, TSTAT_REFUSED).fetch_add(1, Relaxed);
                        return shared();
                    };
                    let mine = keys::insert_claim(h.0, now_ms);
                    if !self.claim_place(&table, pos, old, mine) {
                        continue;
                    }
                    // The template went meanwhile (the place is given back): the name may
                    // fall under a shorter one, or be a quota's own.
                    let Some(ins) = self.prepare_key(&table, t, name, (pos, mine), gen, now_ms)
                    else {
                        return Err(Stale);
                    };
                    match self.publish_key(&table, &ins, h, now_ms) {
                        Published::Yes => {}
                        Published::ClaimLost => continue,
                        Published::Stale => return Err(Stale),
                    }
                    self.hdr(hdr::KEYS_INSERTED).fetch_add(1, Relaxed);
                    if let Some(found) = self.settle_duplicate(&table, h, (pos, ins.id), now_ms) {
                        return Ok(Some(found));
                    }
                }
            }
        }
        // Still being inserted (or its inserter died before publishing, which the agent
        // cleans up): this request shares the template's bucket.
        shared()
    }

    /// What an insert claimed at `(pos, mine)` publishes key `name` of template `t` with,
    /// read after the claim (and after the key generation `gen`, read before `t` was
    /// chosen); `None` when the template went meanwhile, and the place is freed rather than
    /// left for the sweep as a stale claim.
    pub(super) fn prepare_key(
        &self,
        table: &KeyTable<'_>,
        t: u32,
        name: &[u8],
        (pos, mine): (u32, u64),
        gen: u64,
        now_ms: u64,
    ) -> Option<Insert> {
        let Some(template) = self.live_slot(t) else {
            if table.free(pos, mine, now_ms) {
                self.hdr(hdr::KEYS_LIVE).fetch_sub(1, Relaxed);
            }
            return None;
        };
        Some(Insert {
            pos,
            mine,
            gen,
            id: keys::key_id(self.cluster_secret(), name),
            t,
            limits: (template.get(LIMIT), template.get(LOW), template.get(HIGH)),
            parent: template.parent(),
        })
    }

    /// Publishes the key of `ins` (named by hash `h`), unless its claim no longer stands
    /// (stopped so long that the sweep took it for a dead one's, and the place may be
    /// another key's now), or the writer changed templates or the secret since `ins.gen`
    /// and may have walked past it unpublished (the key is freed again).
    pub(super) fn publish_key(
        &self,
        table: &KeyTable<'_>,
        ins: &Insert,
        h: (u64, u64),
        now_ms: u64,
    ) -> Published {
        self.template_count(ins.t, TSTAT_KEYS).fetch_add(1, Relaxed);
        let published = table.publish(ins.pos, ins.mine, h, ins.id, ins.t, ins.limits, ins.parent);
        // The writer bumps the generation before it walks the key table to give keys new
        // template numbers, or to free those of a gone template or secret (a SeqCst
        // fence between), and skips the walk when `KEYS_LIVE` reads 0: either it reads
        // this claim's count (or the evicted key's, which passed to it) and its walk finds
        // this key published, or this sees the bump, and the numbers read may be stale.
        // The count, the publish and this load are SeqCst for that: on x86 the publish's
        // locked compare-and-swap is the barrier, with no fence after the slot's stores.
        let stale = self.hdr(hdr::KEY_GEN).load(SeqCst) != ins.gen;
        if !published {
            // The sweep that freed the claim uncounted it.
            self.key_gone(ins.t, false);
            return Published::ClaimLost;
        }
        if stale && table.free(ins.pos, ins.id, now_ms) {
            self.hdr(hdr::KEYS_LIVE).fetch_sub(1, Relaxed);
            self.key_gone(ins.t, false);
            return Published::Stale;
        }
        Published::Yes
    }

    /// Claims the key table's `pos` (holding `old`) with the claim word `mine`. A claim
    /// counts in `KEYS_LIVE` as the key it becomes: whoever frees it (its inserter, the
    /// sweep when its inserter died) uncounts it, so a count never waits on a process that
    /// may die, and it comes before anything that may free the key, so it never drops
    /// below what is held. A drained key evicted by the claim is gone from then on.
    pub(super) fn claim_place(&self, table: &KeyTable<'_>, pos: u32, old: u64, mine: u64) -> bool {
        let evicts = is_key_id(old);
        // Counted before the claim stands, so that the sweep, should this process stop
        // past its wait, never uncounts it first (SeqCst: see `publish_key`). An evicted
        // key's count passes to the claim.
        if !evicts {
            self.hdr(hdr::KEYS_LIVE).fetch_add(1, SeqCst);
        }
        if !table.claim(pos, old, mine) {
            if !evicts {
                self.hdr(hdr::KEYS_LIVE).fetch_sub(1, Relaxed);
            }
            return false;
        }
        // The evicted key's words are still there until the publish.
        if let Some(k) = table.slot(pos).filter(|_| evicts) {
            self.hdr(hdr::KEY_EVICTIONS).fetch_add(1, Relaxed);
            self.key_gone(k.get(TEMPLATE).wrapping_sub(1) as u32, true);
        }
        true
    }

    /// The id in a slot [`resolve`](Self::resolve) found, once the writer's claim over it
    /// (while it gives a key new numbers, some nanoseconds) is gone: bounded, as a writer
    /// that died there leaves a claim for the sweep.
    pub(super) fn settled_id(&self, slot: &Slot<'_>) -> u64 {
        let mut id = slot.id();
        for _ in 0..4096 {
            if !keys::is_claim(id) {
                break;
            }
            std::hint::spin_loop();
            id = slot.id();
        }
        id
    }

    fn key_slot(&self, pos: u32) -> Option<(u32, Slot<'_>)> {
        let s = self.layout.slot_cap + pos;
        self.live_slot(s).map(|x| (s, x))
    }

    /// Two request paths that inserted one name at two positions at once: the later gives
    /// what was counted on it to the earlier and frees itself. `None` when the key went
    /// meanwhile (another request path evicted it).
    fn settle_duplicate(
        &self,
        table: &KeyTable<'_>,
        h: (u64, u64),
        (pos, id): (u32, u64),
        now_ms: u64,
    ) -> Option<(u32, Slot<'_>)> {
        for earlier in table.before(h.0, pos) {
            if let Probe::Found(p) = table.probe(h, now_ms) {
                if p == earlier {
                    let mine = table.slot(pos)?;
                    let theirs = table.slot(p)?;
                    let t = mine.get(TEMPLATE).wrapping_sub(1) as u32;
                    if table.free(pos, id, now_ms) {
                        self.hdr(hdr::KEYS_LIVE).fetch_sub(1, Relaxed);
                        self.key_gone(t, false);
                        for w in [LOCAL, REJECTED] {
                            let v = mine.w(w).swap(0, Relaxed);
                            super::decide::add_capped(theirs.w(w), v);
                        }
                    }
                    return self.key_slot(p);
                }
            }
        }
        self.key_slot(pos).filter(|(_, x)| x.id() == id)
    }

    /// The key of `h`'s window closest to drained among those that limit no one (fill at or
    /// below `low_burst`) and have nothing to tell the roots (nothing counted, nothing in
    /// flight, not waiting for a round): a key being limited is never taken, so keys sprayed
    /// by a client cannot reset the bucket that limits it, and the sprayed ones go first.
    fn evictable_in_window(&self, table: &KeyTable<'_>, h0: u64, now: u64) -> Option<(u32, u64)> {
        let fresh = self.hdr(hdr::FRESH).load(Relaxed) != 0;
        let horizon = self.horizon_at(now);
        let mut best: Option<(u32, u64, f64)> = None;
        for pos in table.window(h0) {
            let Some(s) = table.slot(pos) else { continue };
            let id = s.id();
            if !is_key_id(id)
                || s.get(LOCAL) != 0
                || s.get(INFLIGHT) != 0
                || s.get(REJECTED) != 0
                || self.is_dirty(self.layout.slot_cap + pos)
            {
                continue;
            }
            let fill = s.estimate(now, fresh, horizon, Peers::ALONE);
            if fill <= s.get(LOW) as f64 && best.is_none_or(|b| fill < b.2) {
                best = Some((pos, id, fill));
                if fill <= 0.0 {
                    break;
                }
            }
        }
        best.map(|(pos, id, _)| (pos, id))
    }

    /// Whether a quota may be named by key hash `h`: false when no quota a template covers
    /// has `h`'s bit in the override filter.
    #[inline]
    pub(super) fn may_have_quota(&self, h: (u64, u64)) -> bool {
        let b = override_bit(h);
        self.hdr(hdr::OVERRIDES + b / 64).load(Acquire) >> (b % 64) & 1 != 0
    }

    /// The writer's count of a quota named `name` that came (`up`) or went, in the override
    /// filter if a template covers the name. Counted after the name is in the index and
    /// uncounted after it left: a bit is clear only while no quota it stands for is in the
    /// index (a new one's request paths may take its key until it is counted).
    pub(super) fn count_override(&self, w: &mut Writer, name: &[u8], up: bool) {
        // Every bit is set until the recount at the end of the batch.
        if w.overrides_saturated || self.template_for(name).is_none() {
            return;
        }
        let b = override_bit(keys::name_hash(self.key_secret(), name));
        let word = self.hdr(hdr::OVERRIDES + b / 64);
        let Some(c) = w.overrides.get_mut(b) else {
            // No counts (never so after a rebuild): a bit may be set, never cleared.
            if up {
                word.fetch_or(1 << (b % 64), Release);
            }
            return;
        };
        if up {
            *c += 1;
            if *c == 1 {
                word.fetch_or(1 << (b % 64), Release);
            }
        } else if *c > 0 {
            *c -= 1;
            if *c == 0 {
                word.fetch_and(!(1 << (b % 64)), Release);
            }
        }
    }

    /// The writer's mark, before a batch that may make, delete or rename a template, that
    /// any name may have a quota (every bit set) until [`recount_overrides`](Self::recount_overrides).
    pub(super) fn saturate_overrides(&self, w: &mut Writer) {
        w.overrides_saturated = true;
        for i in 0..OVERRIDE_BITS / 64 {
            self.hdr(hdr::OVERRIDES + i).store(u64::MAX, Release);
        }
    }

    /// The writer's count, from scratch, of every quota whose name one of `prefixes` (the
    /// templates', without the `*`) starts, into the override filter: when templates
    /// change, before the request paths see the new ones.
    pub(super) fn recount_overrides(&self, w: &mut Writer, prefixes: &HashSet<Vec<u8>>) {
        let mut counts = vec![0u32; OVERRIDE_BITS];
        let lens: BTreeSet<usize> = prefixes.iter().map(Vec::len).collect();
        if !prefixes.is_empty() {
            let arena = self.arena();
            let used = self.hdr(hdr::NEXT_SLOT).load(Relaxed).min(u64::from(self.layout.slot_cap));
            for s in 0..used as u32 {
                let Some(slot) = self.live_slot(s) else { continue };
                let n = slot.name(&arena);
                let covered = lens.iter().any(|&l| n.len() >= l && prefixes.contains(&n[..l]));
                if covered {
                    counts[override_bit(keys::name_hash(self.key_secret(), &n))] += 1;
                }
            }
        }
        for (i, c) in counts.chunks(64).enumerate() {
            let w = c.iter().enumerate().fold(0u64, |w, (j, &c)| w | u64::from(c > 0) << j);
            self.hdr(hdr::OVERRIDES + i).store(w, Release);
        }
        w.overrides = counts;
        w.overrides_saturated = false;
    }

    pub(super) fn key_secret(&self) -> (u64, u64) {
        (self.hdr(hdr::KEY_SECRET).load(Relaxed), self.hdr(hdr::KEY_SECRET + 1).load(Relaxed))
    }

    /// The secret key ids are derived with: the cluster's once a root gave it, the block's
    /// own before (a limiter that syncs with nobody).
    pub(super) fn cluster_secret(&self) -> (u64, u64) {
        if self.hdr(hdr::CLUSTER_SECRET_SET).load(Acquire) != 0 {
            (
                self.hdr(hdr::CLUSTER_SECRET).load(Relaxed),
                self.hdr(hdr::CLUSTER_SECRET + 1).load(Relaxed),
            )
        } else {
            self.key_secret()
        }
    }

    /// Whether slot `s`'s dirty bit is set.
    pub(super) fn is_dirty(&self, s: u32) -> bool {
        let w = &self.words()[self.layout.dirty + (s / 64) as usize];
        w.load(Relaxed) & 1 << (s % 64) != 0
    }
}

const _: () = assert!(MAX_CHAIN < MAX_PREFIX);

/// A key hash's bit in the override filter (bits the key table's position does not use).
#[inline]
pub(super) fn override_bit(h: (u64, u64)) -> usize {
    (h.1 >> 40) as usize % OVERRIDE_BITS
}
