//! What the sync engine reads and writes in the block. Everything that changes a synced
//! base goes through [`CounterAccess`], under the writer lock, which makes the engine the
//! only writer of bases.

use super::writer::Writer;
use super::{Estimator, Limiter};
use crate::quota::{Epoch, QuotaId};
use crate::units::{drain_once, drain_view, drained, Rate};
use crate::zone::roots::{Entry, Roots};
use crate::zone::slot::{Rates, Slot, ID, INFLIGHT, LIMIT, LOCAL, RATES, REJECTED};
use crate::zone::{hdr, SLOT_WORDS};
use std::sync::atomic::Ordering::*;

impl Limiter {
    /// Runs `f` with access to counters by quota id, under the writer lock.
    pub(crate) fn with_counters<R>(&self, f: impl FnOnce(&CounterAccess<'_>) -> R) -> R {
        self.with_counters_paced(no_pace, f)
    }

    /// [`with_counters`](Self::with_counters), calling `pace` once per chunk of a long loop
    /// (each [`CounterAccess::warm`]).
    pub(crate) fn with_counters_paced<R>(
        &self,
        pace: fn(),
        f: impl FnOnce(&CounterAccess<'_>) -> R,
    ) -> R {
        let w = self.writer();
        f(&CounterAccess { limiter: self, writer: &w, pace })
    }

    /// Slots with counts since the last call (their dirty bits cleared), in slot order.
    pub(crate) fn take_dirty(&self) -> Vec<u32> {
        let mut out = Vec::new();
        self.walk_dirty(0, true, |s| out.push(s));
        out
    }

    /// Key slots with counts since the last round, their dirty bits left for the round.
    pub(crate) fn dirty_key_slots(&self) -> Vec<u32> {
        let mut out = Vec::new();
        let first = self.layout.slot_cap;
        self.walk_dirty(first, false, |s| {
            if s >= first {
                out.push(s);
            }
        });
        out
    }

    /// Calls `f` with each slot from about `from` on whose dirty bit is set, in slot order,
    /// through the bitmap's summary so that only words with marks are read; with `clear`,
    /// the bits it reports are cleared (summary first: a bit set after that swap is seen by
    /// the next walk).
    fn walk_dirty(&self, from: u32, clear: bool, mut f: impl FnMut(u32)) {
        let words = self.words();
        let n = (self.layout.all_slots() as usize).div_ceil(64);
        let first = from as usize / 64 / 64;
        let sums = &words[self.layout.dirty_sum..self.layout.dirty_sum + n.div_ceil(64)];
        for (j, sum) in sums.iter().enumerate().skip(first) {
            if sum.load(Relaxed) == 0 {
                continue;
            }
            let mut marked = if clear { sum.swap(0, Relaxed) } else { sum.load(Relaxed) };
            while marked != 0 {
                let k = j * 64 + marked.trailing_zeros() as usize;
                marked &= marked - 1;
                let Some(cell) = words.get(self.layout.dirty + k) else { continue };
                let mut b = if clear { cell.swap(0, Relaxed) } else { cell.load(Relaxed) };
                while b != 0 {
                    f(k as u32 * 64 + b.trailing_zeros());
                    b &= b - 1;
                }
            }
        }
    }

    /// How many keys the key table holds at most.
    pub(crate) fn key_capacity(&self) -> u32 {
        self.key_table().cap()
    }

    /// Keys inserted since the block was made (a count that only grows).
    pub(crate) fn keys_inserted(&self) -> u64 {
        self.hdr(hdr::KEYS_INSERTED).load(Relaxed)
    }

    /// Counts keys given the roots' report of them on first sight.
    pub(crate) fn count_adopted(&self, n: usize) {
        if n > 0 {
            self.hdr(hdr::KEYS_ADOPTED).fetch_add(n as u64, Relaxed);
        }
    }

    /// Every live slot for which `keep` holds (a scan of all slots).
    pub(crate) fn scan_slots(&self, mut keep: impl FnMut(&Slot<'_>) -> bool) -> Vec<u32> {
        // The key table only when it holds keys (a walk of all of it otherwise for nothing).
        let keys = if self.hdr(hdr::KEYS_LIVE).load(Relaxed) > 0 { self.key_slots() } else { 0..0 };
        (0..self.used_slots())
            .chain(keys)
            .filter(|&i| self.live_slot(i).is_some_and(|s| keep(&s)))
            .collect()
    }

    /// `local` now only holds what was accounted since `t` (a round that began at `t` ended).
    pub(crate) fn set_local_since(&self, t: u64) {
        self.hdr(hdr::LOCAL_SINCE).store(t, Relaxed);
    }

    pub(crate) fn set_cluster_fresh(&self, fresh: bool) {
        self.hdr(hdr::FRESH).store(u64::from(fresh), Relaxed);
    }

    pub(crate) fn raise_epoch(&self, e: Epoch) {
        self.hdr(hdr::EPOCH).fetch_max(e, Relaxed);
        self.hdr(hdr::EPOCH_SEEN).fetch_max(e, Relaxed);
    }

    /// The highest quota epoch ever applied (not lowered by a refetch).
    pub(crate) fn seen_epoch(&self) -> Epoch {
        self.hdr(hdr::EPOCH_SEEN).load(Relaxed)
    }

    /// The version epoch of the quota in slot `s` (0 if free, and for keys: they have no
    /// version of their own).
    pub(crate) fn version_of(&self, s: u32) -> Epoch {
        if self.is_key_slot(s) {
            return 0;
        }
        self.live_slot(s).map_or(0, |_| self.cold(s).0.load(Relaxed))
    }

    /// Forgets every quota epoch so the next sync fetches every quota again (quotas already
    /// held are updated in place): how quotas that did not fit get a second chance.
    pub(crate) fn refetch_all(&self, now: u64) {
        let _w = self.writer();
        self.hdr(hdr::EPOCH).store(0, Relaxed);
        self.hdr(hdr::MISSING).store(0, Relaxed);
        self.hdr(hdr::LAST_REFETCH).store(now.max(1), Relaxed);
    }

    /// The next batch sequence number (persistent: a new agent continues it).
    pub(crate) fn next_seq(&self) -> u64 {
        self.hdr(hdr::NEXT_SEQ).fetch_add(1, Relaxed).max(1)
    }

    /// The sequence number of the batch a round took and did not finish (a sync agent died
    /// mid-round), 0 if none.
    pub(crate) fn inflight_seq(&self) -> u64 {
        self.hdr(hdr::INFLIGHT_SEQ).load(Relaxed)
    }

    pub(crate) fn set_inflight_seq(&self, seq: u64) {
        self.hdr(hdr::INFLIGHT_SEQ).store(seq, Relaxed);
    }

    pub(crate) fn count_round(&self, now: u64) {
        self.hdr(hdr::ROUNDS).fetch_add(1, Relaxed);
        self.hdr(hdr::LAST_ROUND_END).store(now.max(1), Relaxed);
    }

    pub(crate) fn roots_table(&self) -> Roots<'_> {
        Roots::new(self.words(), &self.layout)
    }

    pub(crate) fn root_entry(&self, i: usize) -> Entry<'_> {
        self.roots_table().entry(i)
    }

    /// When the current round began (0 before the first).
    pub(crate) fn round_began(&self) -> u64 {
        self.hdr(hdr::ROUND_BEGAN).load(Relaxed)
    }

    /// A round began at `now`: `local` counts from then.
    pub(crate) fn set_round_began(&self, now: u64) {
        self.hdr(hdr::ROUND_BEGAN).store(now, Relaxed);
    }

    /// Takes the early-sync flag a request path set (see `decide.rs`, `surge_threshold`).
    pub(crate) fn take_urgent(&self) -> bool {
        let u = self.hdr(hdr::URGENT);
        u.load(Relaxed) != 0 && u.swap(0, Relaxed) != 0
    }

    pub(crate) fn count_early_round(&self) {
        self.hdr(hdr::EARLY_ROUNDS).fetch_add(1, Relaxed);
    }

    /// Quotas that did not fit since the last refetch.
    pub(crate) fn missing_count(&self) -> u64 {
        self.hdr(hdr::MISSING).load(Relaxed)
    }

    pub(crate) fn last_refetch(&self) -> u64 {
        self.hdr(hdr::LAST_REFETCH).load(Relaxed)
    }
}

/// Counter operations for the sync engine, valid while the writer lock is held.
pub(crate) struct CounterAccess<'a> {
    limiter: &'a Limiter,
    writer: &'a Writer,
    pace: fn(),
}

impl CounterAccess<'_> {
    pub fn slot_of(&self, id: QuotaId) -> Option<u32> {
        self.limiter.find_id(self.writer, id)
    }

    /// Whether the writer knows key `id` in slot `s` by its id (see `Limiter::learn_keys`).
    #[inline]
    pub fn key_known(&self, s: u32, id: QuotaId) -> bool {
        self.limiter.key_known(self.writer, s, id)
    }

    fn slot(&self, s: u32) -> Option<Slot<'_>> {
        self.limiter.live_slot(s)
    }

    /// Called once per chunk of a long loop: gives the pacer its turn (see
    /// [`SyncEngine::set_pacer`](crate::SyncEngine::set_pacer)), then loads both cache
    /// lines of each of these slots ahead of the work on them. That work
    /// takes and adds with atomic read-modify-writes, and on x86 each of those waits for
    /// every load before it, so a round's misses on a million-slot zone would come one at a
    /// time (random keys: tens of thousands a round, most of the agent's time). Plain loads
    /// in a loop of their own overlap. Call it on a few hundred slots at a time: they must
    /// still be in the cache when the work reaches them.
    pub fn warm(&self, slots: impl Iterator<Item = u32>) {
        (self.pace)();
        let mut t = 0u64;
        for s in slots {
            if let Some(x) = self.limiter.slot(s) {
                // Words 0, 8 and 15: every line, even of a slot not aligned to one.
                t ^= x.get(ID) ^ x.get(LOCAL) ^ x.get(SLOT_WORDS - 1);
            }
        }
        std::hint::black_box(t);
    }

    /// Loads the quota versions of these slots (a region of its own, see `warm`) ahead of
    /// a loop that compares them.
    pub fn warm_versions(&self, slots: impl Iterator<Item = u32>) {
        let mut t = 0u64;
        for s in slots.filter(|&s| !self.limiter.is_key_slot(s)) {
            t ^= self.limiter.cold(s).0.load(Relaxed);
        }
        std::hint::black_box(t);
    }

    pub fn id_of(&self, s: u32) -> Option<QuotaId> {
        self.slot(s).map(|x| x.get(ID))
    }

    pub fn local(&self, s: u32) -> u64 {
        self.slot(s).map_or(0, |x| x.get(LOCAL))
    }

    /// Moves what was accounted since the last round into `inflight` and returns it.
    pub fn take_local(&self, s: u32) -> u64 {
        self.slot(s).map_or(0, |x| {
            let v = x.w(LOCAL).swap(0, Relaxed);
            super::decide::add_capped(x.w(INFLIGHT), v);
            v
        })
    }

    /// Of `v` of this limiter's own counts on `s`, what its own exact bucket (the synced
    /// view and its own counts, each drained from when it came, at the full rate) has
    /// drained by `now`, when `newer` units of its counts came after them. What the bucket
    /// still holds is taken as the newest counts (`newer`, then `v`), so older ones drain
    /// first: counts made at the end of a quiet span have drained nothing. `with_inflow`,
    /// the view extrapolates the others' inflow for a horizon after a sync as the request
    /// path's estimate does: a busy quota's own counts then drain only what the others
    /// leave of the limit. A view drained at the full rate emptied within the round and
    /// said they all had, which every batch says since: after both roots restarted, their
    /// new counters took a quota at 0.9 x for idle and the hosts read the others as adding
    /// too little (`a_quota_under_its_limit_is_not_refused_when_both_roots_come_back`).
    /// Without, near the start of a span it may say up to that inflow's worth more (a
    /// stalled agent's counts, which span the horizon).
    ///
    /// Nothing for a counter no root has reported yet (a key first seen since the last
    /// round) while other limiters live: the request path then holds its counts as every
    /// live limiter's ([`Peers::guess`](crate::zone::slot::Peers::guess)), so its time of
    /// meeting an empty bucket is not this bucket's.
    pub fn own_drained(&self, s: u32, v: u64, newer: u64, now: u64, with_inflow: bool) -> u64 {
        self.slot(s).map_or(0, |x| {
            if x.read_base().1 == 0 && !self.limiter.peers_cell().alone() {
                return 0;
            }
            let (fresh, horizon) = if with_inflow {
                let fresh = self.limiter.hdr(hdr::FRESH).load(Relaxed) != 0;
                (fresh, self.limiter.horizon_at(now))
            } else {
                (false, 0)
            };
            let held = x.estimate(now, fresh, horizon, crate::zone::slot::Peers::ALONE);
            let kept = (held - newer as f64).clamp(0.0, v as f64).ceil() as u64;
            // `v as f64` may round above `v` past 2^53.
            v.saturating_sub(kept)
        })
    }

    pub fn inflight(&self, s: u32) -> u64 {
        self.slot(s).map_or(0, |x| x.get(INFLIGHT))
    }

    /// Whether `s` has counts no round has taken yet.
    pub fn has_pending(&self, s: u32) -> bool {
        self.slot(s).is_some_and(|x| x.get(LOCAL) > 0 || x.get(REJECTED) > 0)
    }

    /// Lists `s` for the next round again.
    pub fn mark_dirty(&self, s: u32) {
        self.limiter.mark_dirty(s);
    }

    /// Takes the locally refused weight (it only feeds the roots' demand meters).
    pub fn take_rejected(&self, s: u32) -> u64 {
        self.slot(s).map_or(0, |x| x.w(REJECTED).swap(0, Relaxed))
    }

    /// Takes `v` out of `inflight` (a root's answer includes it now, or it was anchored).
    pub fn sub_inflight(&self, s: u32, v: u64) {
        if let Some(x) = self.slot(s) {
            // Never below zero, even if the slot was reset by a delete in between.
            let _ = x.w(INFLIGHT).fetch_update(Relaxed, Relaxed, |l| Some(l.saturating_sub(v)));
        }
    }

    /// Sets what the rest of the cluster is estimated to add and the cluster's attempted
    /// demand (both milli-units/s; 0, 0 for a cold counter).
    pub fn set_rates(&self, s: u32, inflow: f64, demand: f64) {
        self.update_rates(s, |r| Rates { inflow, demand, ..r });
    }

    /// Rewrites `s`'s rates word; only the engine writes it.
    fn update_rates(&self, s: u32, f: impl Fn(Rates) -> Rates) {
        if let Some(x) = self.slot(s) {
            let _ = x.w(RATES).fetch_update(Relaxed, Relaxed, |w| Some(f(Rates::unpack(w)).pack()));
        }
    }

    /// The synced fill drained to `now` at the full rate (no extrapolation): what this
    /// limiter knows the cluster has counted.
    pub fn synced(&self, s: u32, now: u64) -> u64 {
        self.slot(s).map_or(0, |x| {
            let (base, at) = x.read_base();
            drain_once(
                base,
                Rate::from_word(x.get(LIMIT)).unwrap_or_default(),
                now.saturating_sub(at),
            )
        })
    }

    /// Merges a root's report: `base = max(drained base, reported)`. Every root sums every
    /// limiter's deltas, so the largest report is the most complete; max is also idempotent.
    /// `batch`: this limiter's batch of the round, which the report holds and which
    /// leaves `inflight` next.
    ///
    /// With `keep` (a root of the shard restarted lately), a report below the view and the
    /// batch tells nothing new (a restarted root that lacks the cluster's counts): the view
    /// takes the batch and keeps what the request path extrapolates from it
    /// ([`rebase`](Self::rebase)). Moved to `now` at the full drain, a view held while both
    /// roots restarted (see [`anchor_held`](Self::anchor_held)) lost what the others added
    /// while held as soon as the second root took its hints: every host read the bucket
    /// nearly empty and passed its whole demand. Not otherwise: reports lag the view by a
    /// reply's latency now and then, and kept so on the keys of a Zipf load, the
    /// extrapolation refused cold keys (docs/accuracy.md: 4 against 1).
    pub fn merge_report(&self, s: u32, fill: u64, batch: u64, keep: bool, now: u64) {
        if let Some(x) = self.slot(s) {
            let (base, at) = x.read_base();
            let rate = Rate::from_word(x.get(LIMIT)).unwrap_or_default();
            let (synced, since) = drain_view(base, at, rate, now);
            let known = synced.saturating_add(batch);
            let fill = fill.min(report_ceiling(&x).saturating_add(known));
            if !keep || fill >= known {
                // The view kept, with the remainder of its drain (a slow quota's view moved
                // to `now` each round never drained while requests kept it reported).
                match fill >= synced {
                    true => x.write_base(fill, now),
                    false => x.write_base(synced, since),
                }
                return;
            }
            let own = x.get(LOCAL).saturating_add(x.get(INFLIGHT));
            self.rebase(&x, known, own.saturating_sub(batch), now);
        }
    }

    /// Sets `x`'s view so that it drains, at the full rate, to `synced` at `now` (what hints
    /// read), while the request path's estimate with `own` of this limiter's counts still in
    /// it stays what it is now (the rest of the cluster's inflow extrapolated from the
    /// view's time): the view's time goes back from `now` by as long as that inflow takes
    /// to add the difference, at most to where it was. With no inflow, `(synced, now)`.
    fn rebase(&self, x: &Slot<'_>, synced: u64, own: u64, now: u64) {
        let (_, at) = x.read_base();
        let rates = Rates::unpack(x.get(RATES));
        let fresh = self.limiter.hdr(hdr::FRESH).load(Relaxed) != 0;
        let rate = Rate::from_word(x.get(LIMIT)).unwrap_or_default();
        if at == 0 || at >= now || !fresh || rates.inflow <= 0.0 || rate.milli() == 0 {
            x.write_base(synced, now);
            return;
        }
        let horizon = self.limiter.horizon_at(now);
        let e = x.estimate(now, true, horizon, self.limiter.peers_cell());
        let gap = (e - own as f64 - synced as f64).max(0.0);
        let back = (gap / rates.inflow * 1e9).min((now - at) as f64) as u64;
        x.write_base(synced.saturating_add(drained(rate, back, 0).0), now - back);
    }

    /// Gives a key that no root has reported to this limiter yet (`at` still 0) the fill a
    /// root reported for it at `when`, before this limiter held it: from here it decides
    /// on the cluster's count, drained since `when`, instead of a guess. `false` if it had
    /// a report already.
    pub fn adopt(&self, s: u32, fill: u64, when: u64) -> bool {
        let Some(x) = self.slot(s) else { return false };
        if x.read_base().1 != 0 {
            return false;
        }
        x.write_base(fill.min(report_ceiling(&x)), when.max(1));
        true
    }

    /// The raw (`base`, `at`) pair.
    pub fn base(&self, s: u32) -> Option<(u64, u64)> {
        self.slot(s).map(|x| x.read_base())
    }

    /// The quota's limit, milli-units/s (a windowed quota's per-second share).
    pub fn limit(&self, s: u32) -> f64 {
        self.slot(s).map_or(0.0, |x| Rate::per_sec_of(x.get(LIMIT)))
    }

    /// The current inflow estimate, milli-units/s.
    pub fn inflow(&self, s: u32) -> f64 {
        self.slot(s).map_or(0.0, |x| Rates::unpack(x.get(RATES)).inflow)
    }

    /// The cluster's demand as last recorded, milli-units/s.
    pub fn demand(&self, s: u32) -> f64 {
        self.slot(s).map_or(0.0, |x| Rates::unpack(x.get(RATES)).demand)
    }

    /// The estimator configured on the limiter.
    pub fn estimator(&self) -> Estimator {
        self.limiter.estimator
    }

    /// Folds `v` counted locally into the base when no root took it this round: the new
    /// base is what the bucket holds now by this limiter's own count (its requests drained
    /// from when they were counted, at the full rate) less what stays in `local` for the
    /// next round.
    pub fn anchor(&self, s: u32, v: u64, now: u64) {
        if let Some(x) = self.slot(s) {
            debug_assert!(x.get(INFLIGHT) >= v);
            let exact = x.estimate(now, false, 0, crate::zone::slot::Peers::ALONE);
            let fill = exact.ceil();
            // What the ceiling adds is drain still to come, kept as time: stored at `now`,
            // each round added up to a milli-unit, and a quota draining less than that a
            // round (1 an hour at a 1 s interval) never drained on a host without roots.
            let limit = Rate::per_sec_of(x.get(LIMIT));
            let back = if limit > 0.0 { ((fill - exact) / limit * 1e9) as u64 } else { 0 };
            x.write_base(
                (fill as u64).saturating_sub(x.get(LOCAL)),
                now - back.min(now.saturating_sub(1)),
            );
        }
    }

    /// [`anchor`](Self::anchor) for a round whose answers all stayed out of the view (a
    /// root of the counter's shard restarted and the view is held), or that no root answered
    /// within a horizon of the last view. The rest of the cluster goes on adding, which the
    /// request path extrapolates from the view's time (its horizon stretched meanwhile, see
    /// `hdr::HELD_UNTIL`). Moved to
    /// `now` at the full drain, as `anchor` does, every held round dropped what the others
    /// added since the last view, and each host read the bucket emptying and admitted its
    /// whole demand (`make chaos`, both roots killed: every nginx passed all of `hot`, 3 x
    /// its limit, for a second). So hints (read at the full drain) see what `anchor` would
    /// leave, and the request path what it saw before the batch left `inflight`
    /// ([`rebase`](Self::rebase)).
    pub fn anchor_held(&self, s: u32, v: u64, now: u64) {
        let Some(x) = self.slot(s) else { return };
        debug_assert!(x.get(INFLIGHT) >= v);
        let fill = x.estimate(now, false, 0, crate::zone::slot::Peers::ALONE).ceil() as u64;
        let local = x.get(LOCAL);
        // Once `v` leaves `inflight`, what stays of this limiter's own counts is `local`.
        self.rebase(&x, fill.saturating_sub(local), local, now);
    }

    /// Records this limiter's own rate on `s` in its last round (milli-units per second),
    /// what the request path compares its count with to ask for an early round.
    pub fn set_own_rate(&self, s: u32, rate: f64) {
        self.update_rates(s, |r| Rates { own: rate, ..r });
    }

    /// Whether `s` has a synced fill or counts of its own (a hint candidate).
    pub fn is_active(&self, s: u32, now: u64) -> bool {
        self.synced(s, now) > 0 || self.local(s) > 0 || self.inflight(s) > 0
    }
}

/// What a root's report may set a counter to here beyond what this limiter knows of it
/// (its view and its batch of the round): `high_burst` and a second of the limit, four
/// times the slack within which an honest root keeps a counter (its ceiling; beyond it, it
/// parks a session's claims and answers that session its own parked part, which this
/// limiter knows, having sent it). A report above it (a root that lies, or a man in the
/// middle on an `http://` root) would otherwise close the quota until it drained, at
/// `u64::MAX` for ever, and the view merges by max, so honest reports could not lower it.
fn report_ceiling(x: &Slot<'_>) -> u64 {
    let rate = Rate::from_word(x.get(LIMIT)).unwrap_or_default();
    x.high_burst().saturating_add(rate.over(crate::units::NANOS_PER_SEC))
}

/// The pacer of callers that have none.
pub(crate) fn no_pace() {}
