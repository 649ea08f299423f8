//! The request path: decide for a name's chain and, when accounting, count the weight.
//!
//! Nothing here takes a lock or waits: a hash probe, loads of the chain's slots, and atomic
//! adds on a pass. Two handles deciding at the same instant can both pass before either
//! adds: decisions are local and the counters only approximate, by design.

use super::{Limiter, WeightError, MAX_CHAIN};
use crate::decision::{demand_excess_share, drop_probability, retry_after_secs, Decision, Outcome};
use crate::root::demand::DEMAND_WINDOW_NS;
use crate::units::{Rate, MAX_WEIGHT_UNITS, MILLI};
use crate::zone::slot::Slot;
use crate::zone::slot::{
    Rates, AT, HIGH, INFLIGHT, LIMIT, LOCAL, LOW, ONE_REJECTION, RATES, REJECTED, REJECTS, SHADOW,
};
use crate::zone::{hdr, RECENT_REJECTIONS};
use std::sync::atomic::Ordering::*;

/// The slots of one decision's parent chain.
#[derive(Default)]
pub(super) struct Chain {
    slots: [u32; MAX_CHAIN],
    len: usize,
    /// Bit `k`: slot `k`'s bucket was empty when the chain was walked.
    empty: u16,
    /// Bit `k`: slot `k` is a quota in shadow mode that would have rejected: the request
    /// passes but is counted there as refused demand, as enforcing it would have.
    shadowed: u16,
}

const _: () = assert!(MAX_CHAIN <= u16::BITS as usize);

impl Chain {
    fn push(&mut self, s: u32) {
        if self.len < MAX_CHAIN {
            self.slots[self.len] = s;
            self.len += 1;
        }
    }

    /// Notes that the last slot pushed had an empty bucket.
    fn last_was_empty(&mut self) {
        if self.len > 0 {
            self.empty |= 1 << (self.len - 1);
        }
    }

    /// Notes that the last slot pushed would have rejected in shadow mode.
    fn last_was_shadowed(&mut self) {
        if self.len > 0 {
            self.shadowed |= 1 << (self.len - 1);
        }
    }

    fn slots(&self) -> &[u32] {
        &self.slots[..self.len]
    }
}

enum Walk {
    Unlimited,
    /// The leaf's fill.
    Passed(f64),
    /// Passed, but a quota in shadow mode would have rejected (the first one met).
    Shadowed(Shadowed),
    Rejected(Decision),
}

/// Where a quota in shadow mode would have rejected, and when: the walk keeps no more, so
/// that the common pass pays nothing for it; [`Limiter::shadow_decision`] reads the rest.
#[derive(Clone, Copy)]
struct Shadowed {
    idx: u32,
    now: u64,
}

impl Limiter {
    /// Decides for `name` and its ancestors without counting anything (the nginx
    /// `yarl_check` role).
    #[inline]
    pub fn check<N: AsRef<[u8]> + ?Sized>(&self, name: &N) -> Decision {
        self.decide(name.as_ref(), 0)
    }

    /// Decides for `name` and its ancestors; if allowed, adds `weight` units to every counter
    /// of the chain, if rejected adds nothing (all-or-nothing: a request refused by one limit takes nothing from the others).
    #[inline]
    pub fn account<N: AsRef<[u8]> + ?Sized>(
        &self,
        name: &N,
        weight: u64,
    ) -> Result<Decision, WeightError> {
        if weight > MAX_WEIGHT_UNITS {
            return Err(WeightError(weight));
        }
        Ok(self.decide(name.as_ref(), weight * MILLI))
    }

    /// Adds `weight` units to every counter of `name`'s chain without deciding: a cost known
    /// only once the request is done (response bytes, tokens) limits the next requests.
    /// `false` when no quota or template has that name.
    pub fn charge<N: AsRef<[u8]> + ?Sized>(
        &self,
        name: &N,
        weight: u64,
    ) -> Result<bool, WeightError> {
        if weight > MAX_WEIGHT_UNITS {
            return Err(WeightError(weight));
        }
        let now = self.clock.now_nanos();
        let Some((mut idx, mut slot)) = self.resolve(name.as_ref(), now) else {
            return Ok(false);
        };
        if weight == 0 {
            return Ok(true);
        }
        let mut chain = Chain::default();
        let (fresh, horizon) = (self.hdr(hdr::FRESH).load(Relaxed) != 0, self.horizon_at(now));
        let peers = self.peers_cell();
        loop {
            chain.push(idx);
            if slot.estimate(now, fresh, horizon, peers) <= 0.0 {
                chain.last_was_empty();
            }
            let p = slot.parent();
            if p == 0 || chain.len == MAX_CHAIN {
                break;
            }
            match self.live_slot(p - 1) {
                Some(next) => {
                    idx = p - 1;
                    slot = next;
                }
                None => break,
            }
        }
        self.add_local(&chain, weight * MILLI, now);
        Ok(true)
    }

    fn decide(&self, name: &[u8], weight: u64) -> Decision {
        let now = self.clock.now_nanos();
        let mut chain = Chain::default();
        // An unknown name (the common case where most names have no quota) returns before
        // the walk and its frame.
        let Some(leaf) = self.resolve(name, now) else { return Decision::unlimited() };
        let d = match self.walk(leaf, name, now, weight, &mut chain) {
            Walk::Unlimited => return Decision::unlimited(),
            Walk::Rejected(d) => {
                self.count_rejected(&chain, weight);
                d
            }
            Walk::Passed(fill) => {
                self.add_local(&chain, weight, now);
                Decision { outcome: Outcome::Passed, quota: None, fill, retry_after: None }
            }
            Walk::Shadowed(at) => {
                self.add_local(&chain, weight, now);
                self.shadow_decision(at, name)
            }
        };
        if weight == 0 && self.watch_checks.load(Relaxed) {
            // Nothing counted, but the next round names these counters to the roots, whose
            // answers then carry them (answers by interest).
            for &s in chain.slots() {
                self.mark_dirty(s);
            }
        }
        d
    }

    /// Like [`account`](Self::account) for several names at once, all-or-nothing across all
    /// of them: if any chain rejects, nothing is added anywhere (the refused weights count as
    /// demand). The first rejection is returned; otherwise the pass of the last name that
    /// matched a quota (`Unlimited` if none did).
    pub fn account_many<N: AsRef<[u8]>>(
        &self,
        items: &[(N, u64)],
    ) -> Result<Decision, WeightError> {
        self.account_many_matched(items).map(|(d, _)| d)
    }

    /// [`account_many`](Self::account_many), also saying which item decided: the rejecting
    /// one, else the first one a quota in shadow mode would have rejected, else the last one
    /// that matched a quota (`None` when none did).
    pub fn account_many_matched<N: AsRef<[u8]>>(
        &self,
        items: &[(N, u64)],
    ) -> Result<(Decision, Option<usize>), WeightError> {
        if let Some(&(_, w)) = items.iter().find(|(_, w)| *w > MAX_WEIGHT_UNITS) {
            return Err(WeightError(w));
        }
        let now = self.clock.now_nanos();
        // Chains that passed, to count once every item passed; a request rarely has more
        // than a few account lines, so they stay on the stack.
        let mut passed: [(Chain, u64); 4] = Default::default();
        let mut more: Vec<(Chain, u64)> = Vec::new();
        let mut n = 0;
        let mut result = (Decision::unlimited(), None);
        let mut shadowed = None;
        for (k, (name, weight)) in items.iter().enumerate() {
            let (name, weight) = (name.as_ref(), weight * MILLI);
            let mut chain = Chain::default();
            let walked = match self.resolve(name, now) {
                Some(leaf) => self.walk(leaf, name, now, weight, &mut chain),
                None => Walk::Unlimited,
            };
            match walked {
                Walk::Unlimited => {}
                Walk::Rejected(d) => {
                    self.count_rejected(&chain, weight);
                    for (c, w) in passed.iter().take(n).chain(&more) {
                        self.count_rejected(c, *w);
                    }
                    return Ok((d, Some(k)));
                }
                Walk::Passed(fill) => {
                    let d =
                        Decision { outcome: Outcome::Passed, quota: None, fill, retry_after: None };
                    result = (d, Some(k));
                    if n < passed.len() {
                        passed[n] = (chain, weight);
                        n += 1;
                    } else {
                        more.push((chain, weight));
                    }
                }
                Walk::Shadowed(at) => {
                    let d = self.shadow_decision(at, name);
                    shadowed.get_or_insert((d.clone(), Some(k)));
                    result = (d, Some(k));
                    if n < passed.len() {
                        passed[n] = (chain, weight);
                        n += 1;
                    } else {
                        more.push((chain, weight));
                    }
                }
            }
        }
        for (c, w) in passed.iter().take(n).chain(&more) {
            self.add_local(c, *w, now);
        }
        Ok(shadowed.unwrap_or(result))
    }

    /// Decides for the chain of `name`, found at `leaf`, at `now`, recording the walked
    /// slots in `chain` (on a rejection: those that passed, then the rejecting one and its
    /// ancestors).
    fn walk(
        &self,
        leaf: (u32, Slot<'_>),
        name: &[u8],
        now: u64,
        weight: u64,
        chain: &mut Chain,
    ) -> Walk {
        let (mut idx, mut slot) = leaf;
        let fresh = self.hdr(hdr::FRESH).load(Relaxed) != 0;
        let horizon = self.horizon_at(now);
        let peers = self.peers_cell();
        // Seconds `local` has been counting, for the local guard; only read when it is on.
        let guard_dt = if self.local_guard && weight > 0 {
            Some(now.saturating_sub(self.hdr(hdr::LOCAL_SINCE).load(Relaxed)) as f64 * 1e-9)
        } else {
            None
        };
        let mut leaf_fill = 0.0;
        // Slot + 1 of the first quota in shadow mode that would have rejected; 0: none.
        let mut shadowed = 0u32;
        loop {
            let fill = slot.estimate(now, fresh, horizon, peers);
            if chain.len == 0 {
                leaf_fill = fill;
            }
            let low = slot.get(LOW);
            let limit = Rate::per_sec_of(slot.get(LIMIT));
            let high = slot.get(HIGH) & !SHADOW;
            let mut p = drop_probability(fill, low, high);
            if let Some(dt) = guard_dt {
                // One host alone may not outrun the whole quota; a tenth of an interval's
                // worth absorbs arrival noise. (Subtracting what the others were last seen
                // adding reacts faster but rejects a lone busy host under the limit:
                // docs/accuracy.md.)
                let room = limit * (dt + self.horizon_ns() as f64 * 1e-10);
                let own = slot.get(LOCAL).saturating_add(slot.get(INFLIGHT));
                if own.saturating_add(weight) as f64 > room {
                    p = 1.0;
                }
            }
            if self.demand && fill > low as f64 && fresh {
                // Suppress exactly the share of the attempted demand above the
                // limit. Demand doesn't fall when we reject, so this does not feed back on
                // itself.
                let demand = Rates::demand_of(slot.get(RATES));
                p = p.max(demand_excess_share(demand, limit, DEMAND_WINDOW_NS));
            }
            let rejected = p > 0.0 && (p >= 1.0 || self.random.unit() < p);
            if rejected || chain.len < MAX_CHAIN {
                chain.push(idx);
                // Only an add needs to know (see `add_local`); a check adds nothing.
                if weight > 0 && fill <= 0.0 {
                    chain.last_was_empty();
                }
            }
            if rejected && slot.shadow() {
                // Counted as a rejection everywhere one is reported, but not enforced: the
                // walk goes on to the enforced quotas above, and this quota is not charged.
                chain.last_was_shadowed();
                self.note_shadow_rejection(idx, &slot, now, shadowed == 0);
                if shadowed == 0 {
                    shadowed = idx + 1;
                }
            } else if rejected {
                if slot.get(AT) == 0 && self.peers() > 1 {
                    // Refused on a guess (a counter no root has reported, scaled by the
                    // live limiters): the roots know better a round from now.
                    self.ask_early_round();
                }
                // The host counts a decision once: not again after a shadow rejection.
                self.count_rejection(idx, &slot, now, shadowed == 0);
                // The ancestors above the rejecting quota also saw this attempt as demand.
                let mut cur = slot.parent();
                while cur != 0 && chain.len < MAX_CHAIN {
                    chain.push(cur - 1);
                    cur = self.slot(cur - 1).map_or(0, |s| s.parent());
                }
                return Walk::Rejected(Decision {
                    outcome: Outcome::Rejected,
                    quota: Some(self.decision_name(idx, name)),
                    fill: fill / MILLI as f64,
                    retry_after: Some(retry_after_secs(fill, low, limit)),
                });
            }
            let parent = slot.parent();
            if parent == 0 || chain.len == MAX_CHAIN {
                break;
            }
            match self.live_slot(parent - 1) {
                Some(p) => {
                    idx = parent - 1;
                    slot = p;
                }
                None => break,
            }
        }
        match shadowed {
            0 => Walk::Passed(leaf_fill / MILLI as f64),
            s => Walk::Shadowed(Shadowed { idx: s - 1, now }),
        }
    }

    /// What a quota in shadow mode that would have rejected reports: the rejection, as
    /// [`Outcome::RejectedDryRun`].
    #[cold]
    #[inline(never)]
    fn shadow_decision(&self, at: Shadowed, name: &[u8]) -> Decision {
        let (fill, low, limit) = self.slot(at.idx).map_or((0.0, 0, 1.0), |s| {
            let fresh = self.hdr(hdr::FRESH).load(Relaxed) != 0;
            let fill = s.estimate(at.now, fresh, self.horizon_at(at.now), self.peers_cell());
            (fill, s.get(LOW), Rate::per_sec_of(s.get(LIMIT)))
        });
        Decision {
            outcome: Outcome::RejectedDryRun,
            quota: Some(self.decision_name(at.idx, name)),
            fill: fill / MILLI as f64,
            retry_after: Some(retry_after_secs(fill, low, limit)),
        }
    }

    /// Counts a shadow rejection wherever rejections are reported.
    #[cold]
    #[inline(never)]
    fn note_shadow_rejection(
        &self,
        idx: u32,
        slot: &crate::zone::slot::Slot<'_>,
        now: u64,
        first: bool,
    ) {
        self.count_rejection(idx, slot, now, first);
    }

    /// Counts a rejection by slot `idx`: the quota's and, for a key, its template's too
    /// (keys come and go; the template's count is the one that only grows, and what metrics
    /// name), in the ring of recent rejections, and with `host` the host's (one per
    /// decision, however many quotas of the chain rejected it).
    fn count_rejection(&self, idx: u32, slot: &crate::zone::slot::Slot<'_>, now: u64, host: bool) {
        if host {
            self.hdr(hdr::REJECTIONS).fetch_add(1, Relaxed);
        }
        slot.w(REJECTS).fetch_add(ONE_REJECTION, Relaxed);
        if let Some(t) = self.template_of_key(idx).and_then(|t| self.slot(t)) {
            t.w(REJECTS).fetch_add(ONE_REJECTION, Relaxed);
        }
        self.note_rejection(idx, now);
    }

    /// The name a decision by slot `idx` reports: a key keeps no name, it is the one the
    /// request gave.
    fn decision_name(&self, idx: u32, name: &[u8]) -> Box<str> {
        if self.is_key_slot(idx) {
            crate::quota::escape_name(name).into()
        } else {
            self.slot_name(idx).into()
        }
    }

    /// Records a rejection by slot `idx` in the ring of recent rejections (for ranking the
    /// quotas that reject most now, [`Limiter::top_rejections`]).
    fn note_rejection(&self, idx: u32, now: u64) {
        let i = self.hdr(hdr::RECENT_HEAD).fetch_add(1, Relaxed) as usize % RECENT_REJECTIONS;
        let at = (now / 1_000_000_000) as u32;
        self.words()[self.layout.recent + i]
            .store(u64::from(idx + 1) | u64::from(at) << 32, Relaxed);
    }

    fn add_local(&self, chain: &Chain, weight: u64, now: u64) {
        if weight == 0 {
            return;
        }
        for (k, &i) in chain.slots().iter().enumerate() {
            if let Some(s) = self.slot(i) {
                if chain.shadowed & 1 << k != 0 {
                    add_capped(s.w(REJECTED), weight);
                    self.mark_dirty(i);
                    continue;
                }
                let before = add_capped(s.w(LOCAL), weight);
                let local = before.saturating_add(weight);
                if chain.empty & 1 << k != 0 {
                    s.started_empty(before.saturating_add(s.get(INFLIGHT)), now, self.peers_cell());
                } else if before == 0 && s.get(INFLIGHT) == 0 {
                    // The first count since a round took the last: this limiter's counts
                    // drain from now, not from the last sync. From the sync, a synced fill
                    // that emptied before them lent them its idle drain, and a batch cut
                    // after a stalled agent said that much more of them had drained: the
                    // roots credited it and admitted past `low_burst` (core/tests/
                    // idle_credit.rs, 0.83 s of the limit).
                    s.started_empty(0, now, self.peers_cell());
                }
                self.mark_dirty(i);
                // Attempts, not admissions: under steady overload what a host admits swings
                // with the drop share, what it is asked for does not.
                let attempted = local.saturating_add(s.get(REJECTED));
                if k == 0 && attempted as f64 > self.surge_threshold(&s, now) {
                    self.ask_early_round();
                } else if k == 0 && before > 0 && s.get(AT) == 0 && self.peers() > 1 {
                    // A counter no root has reported, counted again: from here its counts
                    // stand for every live limiter (`Peers::guess`) until the roots tell
                    // the truth, so ask them now (the early-round budget bounds it, as for
                    // a refusal on the guess). Without it a client new to every host had
                    // a second request on each pass in the first round, 0.966 x its limit
                    // left for the hot keys of docs/accuracy.md's Zipf case, against 0.986.
                    self.ask_early_round();
                }
            }
        }
    }

    /// Asks the sync agent for a round now (it keeps early rounds apart and on a budget).
    #[inline]
    fn ask_early_round(&self) {
        let urgent = self.hdr(hdr::URGENT);
        if urgent.load(Relaxed) == 0 {
            urgent.store(1, Relaxed);
        }
    }

    /// What this limiter may count on a quota since its current round began before its
    /// agent syncs early: [`EARLY_FACTOR`] times what its last regular round's rate predicts
    /// for that time, plus a hundredth of `low_burst` so arrival noise never trips it.
    /// Steady traffic stays under it; a surge on this host crosses it within a fraction of
    /// an interval (at 20 times its previous rate, within a few percent of it). A quota
    /// this host counted nothing on in its last interval never trips it: new keys appear
    /// all the time on real hosts (a quota per client), and each would otherwise ask for a
    /// round, while the roots already learn of them at the next regular one.
    #[inline]
    fn surge_threshold(&self, s: &crate::zone::slot::Slot<'_>, now: u64) -> f64 {
        let rate = Rates::own_of(s.get(RATES));
        if rate <= 0.0 {
            return f64::INFINITY;
        }
        let began = self.hdr(hdr::ROUND_BEGAN).load(Relaxed);
        let elapsed = now.saturating_sub(began) as f64 * 1e-9;
        EARLY_FACTOR * rate * elapsed + (s.get(LOW) as f64 / 100.0).max(MILLI as f64)
    }

    /// A refused attempt still counts as demand on every quota of its chain (a check, with
    /// weight 0, has nothing to count).
    fn count_rejected(&self, chain: &Chain, weight: u64) {
        if weight == 0 {
            return;
        }
        for &i in chain.slots() {
            if let Some(s) = self.slot(i) {
                add_capped(s.w(REJECTED), weight);
                self.mark_dirty(i);
            }
        }
    }
}
/// Most a host's count of one interval holds, milli-units (a quarter of `u64`): sync rounds
/// take counts long before, but charges of any size from request data (a backend's cost
/// header: 18,000 of 1e12 units) must not wrap a count to near zero and free the quota.
pub(crate) const COUNT_CAP: u64 = u64::MAX / 4;

/// Adds `w` to a count, which stays at [`COUNT_CAP`] once there; returns the count before.
/// Racing adders that all pass the check together go past the cap by their weights at most
/// (a request's weight is at most 1e15 milli-units), far below `u64::MAX`.
#[inline]
pub(crate) fn add_capped(cell: &std::sync::atomic::AtomicU64, w: u64) -> u64 {
    let v = cell.load(Relaxed);
    if w <= COUNT_CAP && v <= COUNT_CAP - w {
        return cell.fetch_add(w, Relaxed);
    }
    match cell.fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_add(w).min(COUNT_CAP.max(v)))) {
        Ok(before) | Err(before) => before,
    }
}

/// How far ahead of its last round's rate a quota's traffic on this host must run to sync
/// early.
pub(crate) const EARLY_FACTOR: f64 = 2.0;
