//! Claims and hints: what a sync's deltas and hints may do to a counter.
//!
//! # What a sync may claim
//!
//! Whoever holds the sync token can send any well-formed message, so the root only lets a
//! message move a counter as far as an honest limiter could have. What an honest limiter
//! admits: requests while its estimate of the fill is below `high_burst`, each adding its
//! weight, and one request of any weight (bytes: up to 1e12 units) whenever the estimate is
//! at or below `low_burst`. Several limiters add to one counter, each with a view up to an
//! interval old, so honest sums do overshoot `high_burst`, by up to one interval of the
//! limit per limiter plus the heaviest single request. Nothing honest is bounded by the
//! quota alone, so the root does not drop claims; it **parks** them:
//!
//! * A counter's **ceiling** is `high_burst + limit × claim_slack` (0.25 s by default). An
//!   admitted delta fills the counter up to the ceiling; the rest is parked with the session
//!   (limiter id) that claimed it, per quota.
//! * Each later sync of *that* session first moves its parked amounts into the counters, as
//!   far as the ceilings allow. The fills answered to that session include what it still
//!   has parked, so a limiter never forgets what it admitted itself (it would admit it
//!   again); other sessions see the counter at its ceiling. An honest limiter syncs every
//!   interval, so a heavy request or an overshoot keeps its quota at the ceiling for as long
//!   as its weight takes to drain at `limit`, as if the counter had taken it whole (it dips
//!   by at most one interval of the limit between two syncs of the limiter that claimed it).
//! * A client that **stops** sending stops feeding: its parked claims stay parked until its
//!   session is forgotten. From the ceiling the counter drains to `low_burst` in
//!   `(high_burst - low_burst) / limit + claim_slack`: with the recommended bursts
//!   (`low_burst` = 1.5 and `high_burst` = 3 intervals of the limit) that is 1.75 s at a 1 s
//!   interval, within two intervals, and less for shorter bursts. Below `low_burst` nothing
//!   is rejected, whatever the demand meter says. Limiters learn it at their next sync, so
//!   honest traffic sees it up to one of their intervals later: a stopped client leaves a
//!   quota where an honest burst to `high_burst` would, plus `claim_slack`.
//! * **Hints** merge by max (or, read from a view older than the root, add what they hold
//!   beyond the highest such hint: see `RootState::sync_from`) and are cut at the ceiling,
//!   added or not (a hint restores a restarted root; it never needs to exceed what the
//!   counter can hold), and a root takes them only in its
//!   first [`RootConfig::hint_window_ns`](super::RootConfig::hint_window_ns) (two minutes
//!   by default): the time a restarted or new root needs to hear from every limiter. Later
//!   a hint can only repeat what the root already has, while a forged one would hold a
//!   long window's counter (a day's quota) at its ceiling for a whole window.
//! * **Late batches**: a limiter that could not reach this root keeps its batches and sends
//!   them together once it can (up to 30). When a request brings three new batches or
//!   more (the limiter missed at least two rounds with this root; two at once happen with
//!   a slow answer or an early round), all of them are *late*: counted while this root did
//!   not hear from the limiter, possibly while it decided on its own count (cut off from
//!   every root), and met by the counter only now. Two rules keep such counts from being
//!   paid twice, once in the overshoot of the cut and again as a quota shut after the
//!   heal. A late amount is first **credited** with the counter's *spare* drain (the drain
//!   that found it empty, kept up to
//!   [`RootConfig::late_credit_ns`](super::RootConfig::late_credit_ns) of the limit, 30 s;
//!   each amount at most the limit over the time since the limiter last synced; at a
//!   first contact, since it last merged an answer from a root of this shard, as its request
//!   says, and nothing if it does not; a counter this root does not hold yet, made by a
//!   late amount, was empty over that time, and its spare is all of it, up to 30 s): what
//!   the amount would have used had it come on time. The rest fills
//!   the counter up to `low_burst` only, and what does not fit is **dropped**, not parked
//!   (`yarl_root_late_credited_total`, `yarl_root_late_dropped_total`): below `low_burst`
//!   nothing is refused, while counts of then added above it would shut the quota now for
//!   traffic of now. Late amounts do not feed the admitted-rate meter; the demand window
//!   takes their attempts at the rate they came over the gap (the limiter goes on with its
//!   clients once healed, and every limiter must suppress for them now). A counter
//!   that never reaches `low_burst` (a parent summing everything, with bursts above any
//!   total) has no spare and takes every late unit, so sums stay exact (made by a late
//!   amount after a restart, it gets spare, but the first hint from a view before the
//!   restart takes that credit back). Dropping only
//!   lowers counts, which whoever holds the sync token could do anyway by not sending
//!   them; the price is paid by honest limiters that miss rounds (a cut, a lossy link, a
//!   root stalled for two intervals): their late counts above `low_burst` go uncounted.
//! * **On-time and long batches**: a batch is added when it arrives, up to an interval after
//!   its counts were made, and a counter that stood empty meanwhile would take them whole:
//!   every limiter then read a client under its limit up to an interval of the limit
//!   fuller than its exact bucket was (refused with that bucket below `low_burst`). A batch
//!   says per delta what of it the limiter's own exact bucket had drained
//!   ([`DeltaBatch::drained`]); that much is credited with the counter's wasted drain and
//!   the rest counted. What drained up to the limit over the time since the limiter last
//!   synced here (at a first contact: since it last merged an answer, `view_age_ns`, and
//!   nothing without it) takes the drain wasted over that time (`fresh`: cut to it at each
//!   credit, so the batches of one span share one span's drain); more than that is a batch cut
//!   after a long span (the limiter's agent stalled, or another worker took its role
//!   over, and its counts span the stall), credited with the whole spare drain, as a late
//!   amount's is (a counter not held yet has all its spare). Only the limiter knows when
//!   within the span its counts came, so nothing else is credited; one that says more
//!   drops its own counts and the counter's spare.
//! * **Demand**: each delta entry adds at most `1024 × (high_burst + limit × 1 s)` attempted
//!   units to the demand meter: the suppressed share `1 - limit / demand` is already 99.9 %
//!   there, so honest floods show as before and a forged `u64::MAX` stays finite. The meter
//!   spans 2 s and only acts while the fill is above `low_burst`. A delta counted before
//!   its quota's reset is dropped, its attempts still shown (the reset forgave counts, not
//!   clients).
//! * **Sequence numbers**: a session that had a batch applied refuses a `seq` more than
//!   `seq_ahead_slack` (64) plus one per 25 ms since its last sync ahead of the acknowledged
//!   one (a limiter makes at most one batch per interval, intervals are 50 ms or more, and
//!   after an outage up to 30 pending batches arrive at once). A session without an applied
//!   batch takes any `seq`: limiters keep their numbering across nginx reloads, and a
//!   restarted root meets them mid-sequence.
//! * **Sessions** never lock anyone out: when the table or a peer address's budget is full,
//!   the least recently seen session (of that address) is forgotten. A live limiter syncs
//!   every interval and is never the oldest for long; a forgotten one is met again as a first
//!   contact. One address cannot hold more than `max_limiters_per_addr` sessions, so it
//!   cannot push the others out.

use super::counters::{place_of, NO_COUNTER, WARM_RUN};
use super::demand::{meter, DEMAND_BUCKETS, DEMAND_BUCKET_NS, DEMAND_CAP_FACTOR};
use super::sessions::Session;
use super::RootState;
use crate::proto::{DeltaBatch, SyncRequest};
use crate::quota::{Epoch, Limits, QuotaId};
use crate::units::LeakyBucket;
use crate::zone::keys::is_key_id;

/// New batches in one request from which they are late: see "Late batches".
pub(super) const LATE_BATCHES: usize = 3;

impl RootState {
    /// Applies the batches of `req` that were not applied before, in `seq` order, parking
    /// with `s` what its counters have no room for; the highest `seq` applied. Batches up
    /// to `covered` are taken as applied without their deltas: the hints applied before
    /// them hold their counts.
    pub(super) fn apply_batches(
        &mut self,
        req: &SyncRequest,
        s: &mut Session,
        covered: u64,
        now: u64,
    ) -> u64 {
        let mut acked = s.acked;
        let mut batches: Vec<_> = req.batches.iter().collect();
        batches.sort_by_key(|b| b.seq);
        // LATE_BATCHES new batches or more at once: the limiter missed rounds with this
        // root and is catching up, and all of them were counted while this root did not
        // hear from it (the newest too: it decided alone until this call went through),
        // over at most the time since it last did. Two at once is a slow answer or an
        // early round, not a cut. A session copied from another root (`copy.rs`) brings
        // the batches counted since the copy was taken, on time at that root: not late.
        let fresh = batches.iter().filter(|b| b.seq > acked && b.seq > covered).count();
        // At a first contact (this root restarted, or is new to the limiter) the batches
        // were counted since the limiter last merged an answer from a root of this shard, if it
        // says (`view_age_ns`); nothing known otherwise, no credit.
        let gap = match (s.acked, req.view_age_ns) {
            (0, Some(age)) => age.min(self.config.late_credit_ns),
            (0, None) => 0,
            _ => now.saturating_sub(s.last_seen),
        };
        let late = (fresh >= LATE_BATCHES && !s.copied).then_some(gap);
        // What an on-time batch's counts span: since the limiter last synced with this root,
        // or, met for the first time (this root restarted, the limiter is new, or its
        // session was copied), since it last merged an answer, if it says.
        let span = if s.serial != 0 && !s.copied {
            Some(now.saturating_sub(s.last_seen))
        } else {
            req.view_age_ns
        };
        for b in batches {
            if b.seq <= acked {
                self.stats.duplicate_batches += 1;
                continue;
            }
            if b.seq > covered {
                self.apply_batch(b, s, (late, span), now);
            }
            acked = b.seq;
        }
        acked
    }

    /// Applies batch `b`; `late` as for [`Self::claim_delta`].
    fn apply_batch(
        &mut self,
        b: &DeltaBatch,
        s: &mut Session,
        (late, span): (Option<u64>, Option<u64>),
        now: u64,
    ) {
        let stripe = self.stripe;
        // A late batch is credited by the root's own rule, which already covers its span.
        let credit = if late.is_none() { b.drained.as_slice() } else { &[] };
        for (k, run) in b.deltas.chunks(WARM_RUN).enumerate() {
            self.warm(run.iter().map(|d| d.0).filter(|&id| stripe.contains(id)));
            for (j, &(id, amount, rejected)) in run.iter().enumerate() {
                // Another stripe's are counted there.
                if !stripe.contains(id) {
                    continue;
                }
                let drained = credit.get(k * WARM_RUN + j).copied().unwrap_or(0);
                self.claim_delta(s, id, (amount, rejected), b.epoch, late, (drained, span), now);
            }
        }
    }

    /// Credits up to `drained` of a delta entry's admitted `amount` (what the limiter's own
    /// bucket drained of it: see [`DeltaBatch::drained`]) with counter `id`'s spare drain;
    /// returns the credit, which the counter does not take. Counted with the late credits:
    /// the same drain, spent once. `span` is the time since the limiter last synced with
    /// this root, or at a first contact since it last merged an answer (`None`: it did not
    /// say, and gets no credit).
    ///
    /// On time (what drained is at most the limit over the span): with the drain wasted
    /// over the span ([`RootCounter::fresh`](super::counters::RootCounter)), which the
    /// batches of that span share. A counter idle for a minute wasted a minute of drain,
    /// but counts made in the last second could only have used the last second's: fifty
    /// hosts that each drained their own part of a client's burst do not add up to fifty
    /// seconds of it.
    ///
    /// More than that (a batch cut long after the one before: a stalled agent's, or one a
    /// new agent resent for it, which synced an interval ago while its counts span the
    /// stall): with all the spare drain. The limiter's own bucket drained at most its limit
    /// over that span; one that says more lowers its own counts (not sending them would
    /// too) and spends spare drain other limiters' late batches would have had: no more
    /// than a delta up to the ceiling does to them.
    fn credit_drained(
        &mut self,
        id: QuotaId,
        l: Limits,
        amount: u64,
        (drained, span): (u64, Option<u64>),
        now: u64,
    ) -> u64 {
        // A limiter met with nothing to say how long its counts span gets no credit: taken
        // as long, every limiter's first batch at a root's start took the whole spare
        // (docs/accuracy.md's 3 x of 100/s over 50 hosts: 0.989 x with a CV of 0.059,
        // against 0.999 and 0.029).
        let Some(span) = span.filter(|_| drained > 0 && self.in_shard(id)) else { return 0 };
        let new = place_of(&self.quotas, id) == NO_COUNTER;
        let lends = new && self.in_hint_window(now) || self.lent.contains_key(&id);
        let most_spare = l.limit().over(self.config.late_credit_ns);
        let on_time = Some(l.limit().over(span)).filter(|&w| drained <= w);
        let Some(c) = self.counter_now(id, l.limit(), now) else { return 0 };
        if new {
            // Empty through the span (dropped once drained, or never made), as for a late
            // amount: all of it spare, up to the cap. After a restart, only lent.
            c.spare = most_spare;
            c.fresh = most_spare;
        }
        let credit = match on_time {
            Some(w) => {
                let fresh = c.fresh.min(w);
                let credit = drained.min(amount).min(fresh).min(c.spare);
                c.fresh = fresh - credit;
                credit
            }
            None => {
                let credit = drained.min(amount).min(c.spare);
                c.fresh = c.fresh.saturating_sub(credit);
                credit
            }
        };
        c.spare -= credit;
        self.stats.late_credited += credit;
        if lends && credit > 0 {
            *self.lent.entry(id).or_default() += credit;
        }
        credit
    }

    /// One delta entry (admitted, rejected) of a batch counted at quota epoch `epoch`,
    /// `late` if the batch is (with the time it may span), with what the limiter says had
    /// drained of it (`drained`): held if its quota may not have been
    /// read yet, dropped if counted before the quota's reset, else added, and what did not
    /// fit parked with `s`.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn claim_delta(
        &mut self,
        s: &mut Session,
        id: QuotaId,
        (amount, rejected): (u64, u64),
        epoch: Option<Epoch>,
        late: Option<u64>,
        (drained, span): (u64, Option<u64>),
        now: u64,
    ) {
        // One lookup of the quota for both the reset check and the delta: each is a probe
        // of a map of up to millions of entries, a cache miss on a busy root.
        let mut quota = self.quotas.get(&id).map(|q| (q.limits, q.reset_epoch, q.deleted));
        if quota.is_none() && self.key_entry(id) {
            quota = self.quotas.get(&id).map(|q| (q.limits, q.reset_epoch, q.deleted));
        }
        if quota.is_none() && !is_key_id(id) && id > self.highest_id && self.in_shard(id) {
            self.hold(id, amount, rejected, epoch, now);
            return;
        }
        let limits = quota.filter(|q| !q.2).map(|q| q.0);
        if epoch.is_some_and(|e| e < quota.map_or(0, |q| q.1)) {
            self.stats.dropped_before_reset += 1;
            self.add_demand_only(id, limits, amount.saturating_add(rejected), late, now);
            return;
        }
        let excess = match (late, limits) {
            (Some(gap), _) => self.add_late(id, limits, (amount, rejected), gap, now),
            (None, Some(l)) if drained > 0 => {
                let credit = self.credit_drained(id, l, amount, (drained, span), now);
                self.add_delta(id, limits, amount - credit, rejected, now)
            }
            (None, _) => self.add_delta(id, limits, amount, rejected, now),
        };
        if excess > 0 {
            self.park(s, id, excess);
        }
    }

    /// Counts `req`'s hints of this stripe's counters as not needed.
    pub(super) fn skip_hints(&mut self, req: &SyncRequest) {
        let here = req.hints.iter().filter(|h| self.stripe.contains(h.0)).count();
        self.stats.hints_redundant += here as u64;
    }

    /// Applies `req`'s hints of this stripe's counters, unless they predate a reset; read
    /// from a view older than this root if `pre_start`.
    pub(super) fn apply_hints(&mut self, req: &SyncRequest, pre_start: bool, now: u64) {
        if req.hints.is_empty() {
            return;
        }
        let born = self.born.unwrap_or(now);
        if now.saturating_sub(born) > self.config.hint_window_ns {
            let here = req.hints.iter().filter(|h| self.stripe.contains(h.0)).count();
            self.stats.hints_late += here as u64;
            self.pre_start = Default::default();
            return;
        }
        let hints_epoch = req.seen_epoch.unwrap_or(req.epoch);
        for &(id, fill) in &req.hints {
            if !self.stripe.contains(id) {
                continue;
            }
            if !self.in_shard(id) {
                self.stats.deltas_foreign += 1;
                continue;
            }
            // A key this root meets for the first time (after a restart, its limiters
            // hint what it had).
            self.key_entry(id);
            if hints_epoch < self.reset_epoch(id) {
                self.stats.dropped_before_reset += 1;
                self.forget_if_bare(id);
                continue;
            }
            self.apply_hint(id, fill, pre_start, now);
        }
    }

    /// The highest fill a claim may lift a counter of limits `l` to: `high_burst` plus
    /// [`RootConfig::claim_slack_ns`](super::RootConfig::claim_slack_ns) of the limit.
    pub(super) fn ceiling(&self, l: &Limits) -> u64 {
        l.high_burst().saturating_add(l.limit().over(self.config.claim_slack_ns))
    }

    /// Lifts counter `id` by up to `amount`, never past its ceiling; returns what did not
    /// fit, or `None` for a quota this root does not know.
    fn fill_up(&mut self, id: QuotaId, amount: u64, now: u64) -> Option<u64> {
        let l = self.live_limits(id)?;
        let ceiling = self.ceiling(&l);
        let c = self.counter_now(id, l.limit(), now)?;
        let room = ceiling.saturating_sub(c.bucket.fill);
        let taken = amount.min(room);
        c.bucket.add(taken);
        if taken > 0 {
            self.log_change(id, l.limit());
        }
        Some(amount - taken)
    }

    /// The limits a delta entry of `id` counts under: `limits` if this root's shard holds
    /// `id` and it has a live quota, else `None`, counted as foreign or unknown.
    #[inline]
    fn delta_limits(&mut self, id: QuotaId, limits: Option<Limits>) -> Option<Limits> {
        if !self.in_shard(id) {
            self.stats.deltas_foreign += 1;
            return None;
        }
        if limits.is_none() {
            self.stats.deltas_unknown += 1;
        }
        limits
    }

    /// Applies one delta entry to counter `id`, whose live quota has `limits` (`None`: no
    /// live quota of that id); returns the admitted amount the counter had no room for.
    pub(super) fn add_delta(
        &mut self,
        id: QuotaId,
        limits: Option<Limits>,
        amount: u64,
        rejected: u64,
        now: u64,
    ) -> u64 {
        // One look at the quota (the caller's) and one at the counter per delta: this runs
        // for every delta of every limiter, most of a busy root's work.
        let Some(l) = self.delta_limits(id, limits) else { return 0 };
        let ceiling = self.ceiling(&l);
        let cap = demand_cap(&l);
        let attempted = amount.saturating_add(rejected);
        if attempted > cap {
            self.stats.rejected_capped += 1;
        }
        let rate_tau = self.config.rate_tau_ns;
        let Some(c) = self.counter_now(id, l.limit(), now) else {
            // Not reached: `limits` came from this id's entry.
            self.stats.deltas_unknown += 1;
            return 0;
        };
        let taken = amount.min(ceiling.saturating_sub(c.bucket.fill));
        c.bucket.add(taken);
        meter(&mut c.rate, &mut c.rate_at, amount, now, rate_tau);
        c.demand.add(attempted.min(cap), now);
        self.stats.deltas_applied += 1;
        // A delta changes the demand even when the fill stayed at the ceiling.
        self.log_change(id, l.limit());
        amount - taken
    }

    /// A delta entry of a batch counted before its quota's reset: its counts go (the reset
    /// forgave them), its attempts stay: they are clients the limiter still has, and a
    /// limiter cut off while the quota was reset goes on with them once healed. Left out,
    /// every limiter suppressed too little for the window's 2 s after the heal, and the
    /// quota paid it back after (`make chaos`: 0.97-0.98 x of the limit in the 14 s after
    /// an edit and reset during a cut, 0.99-1.00 x without the reset). The demand window
    /// takes them as a delta's (at the rate they came over the gap, if the batch is late).
    fn add_demand_only(
        &mut self,
        id: QuotaId,
        limits: Option<Limits>,
        attempted: u64,
        late: Option<u64>,
        now: u64,
    ) {
        // The drop is counted: a delta of another shard or of a deleted quota adds nothing.
        let Some(l) = limits.filter(|_| self.in_shard(id)) else { return };
        let attempted = attempted.min(demand_cap(&l));
        let Some(c) = self.counter_now(id, l.limit(), now) else { return };
        match late {
            Some(gap) => {
                let part = late_demand(attempted, gap);
                if part == 0 {
                    return;
                }
                c.demand.add_spread(part, now);
            }
            None if attempted == 0 => return,
            None => c.demand.add(attempted, now),
        }
        self.log_change(id, l.limit());
    }

    /// Applies a late batch's delta entry (see "Late batches"): its admitted `amount`
    /// credited with the counter's spare drain, at most `gap` ns of its limit, and the rest
    /// added up to `low_burst`; nothing parked. The admitted-rate meter is left alone (the
    /// counts are of then); the demand window takes the entry's attempts at the rate they
    /// came over the gap, for the window's span. Returns 0 (for the caller, like
    /// [`Self::add_delta`]).
    fn add_late(
        &mut self,
        id: QuotaId,
        limits: Option<Limits>,
        (amount, rejected): (u64, u64),
        gap: u64,
        now: u64,
    ) -> u64 {
        let Some(l) = self.delta_limits(id, limits) else { return 0 };
        let cap = demand_cap(&l);
        let new = place_of(&self.quotas, id) == NO_COUNTER;
        let most_spare = gap.min(self.config.late_credit_ns);
        let lends = new && self.in_hint_window(now) || self.lent.contains_key(&id);
        let Some(c) = self.counter_now(id, l.limit(), now) else {
            self.stats.deltas_unknown += 1;
            return 0;
        };
        if new {
            // A counter this root does not hold was empty through the gap (idle, dropped
            // once drained), or was lost with a restart. Without this credit the limiters'
            // batches of a restart met a new, empty counter at once and filled it toward
            // `low_burst`: a quota at 0.9 x its limit refused for a second after both roots
            // were killed (`make chaos`, `sync::tests`). After a restart the credit is only
            // lent: a hint above zero (drained to now, as the limiters read them) says the
            // counter never emptied, and takes it back (`lent`).
            c.spare = l.limit().over(most_spare);
        }
        // A limiter that was cut off goes on with its clients once healed. Left out of the
        // window, its demand shows over the window's 2 s as its on-time batches come in,
        // and every limiter suppresses too little until then: in `make chaos` the cluster
        // admitted 1.34 x for a second after a healed cut, shut the quota at its ceiling
        // and paid it back at 0.64 x. Its attempts over the gap say what it brings: at that
        // rate, for as long as the window spans.
        let part = late_demand(amount.saturating_add(rejected).min(cap), gap);
        if part > 0 {
            c.demand.add_spread(part, now);
        }
        let shown = part > 0;
        let credit = amount.min(c.spare).min(l.limit().over(gap));
        c.spare -= credit;
        c.fresh = c.fresh.saturating_sub(credit);
        let rest = amount - credit;
        // Up to `low_burst` only: counts of then, added above it, would shut the quota now
        // for traffic of now (at `high_burst`, hot admitted 0.92 x its limit after a healed
        // cut in `make chaos`; here 1.01 x). Below it nothing is refused anyway.
        let taken = rest.min(l.low_burst().saturating_sub(c.bucket.fill));
        c.bucket.add(taken);
        self.stats.deltas_applied += 1;
        self.stats.late_credited += credit;
        self.stats.late_dropped += rest - taken;
        if lends && credit > 0 {
            *self.lent.entry(id).or_default() += credit;
        }
        if taken > 0 || shown {
            self.log_change(id, l.limit());
        }
        0
    }

    /// Raises counter `id` to a limiter's view of its fill, cut at the ceiling: by max, or,
    /// for a view older than this root (`pre_start`), by what it holds beyond the highest
    /// such view so far, on top of what this root summed (see `RootState::sync_from`).
    fn apply_hint(&mut self, id: QuotaId, fill: u64, pre_start: bool, now: u64) {
        let Some(l) = self.live_limits(id) else { return };
        let ceiling = self.ceiling(&l);
        if fill > ceiling {
            self.stats.hints_capped += 1;
        }
        let fill = fill.min(ceiling);
        // Read from a view older than this root, and still above zero drained to now: the
        // counter held it through the gap, no drain was spare, and the late batches
        // credited with it count whole. (A newer view holds this root's credited sums.)
        let back = if fill > 0 && pre_start { self.lent.remove(&id).unwrap_or(0) } else { 0 };
        let floor = if pre_start { self.pre_start_floor(id, fill, &l, now) } else { None };
        let mixed = self.in_hint_window(now);
        let Some(c) = self.counter_now(id, l.limit(), now) else { return };
        let mut changed = false;
        let mut taken_back = 0;
        if back > 0 {
            c.spare = 0;
            taken_back = back.min(ceiling.saturating_sub(c.bucket.fill));
            c.bucket.add(taken_back);
            changed = taken_back > 0;
        }
        if let Some(more) = floor {
            let taken = more.min(ceiling.saturating_sub(c.bucket.fill));
            if taken > 0 {
                c.bucket.add(taken);
                self.stats.hints_applied += 1;
                self.stats.hints_added += 1;
                changed = true;
            }
        } else if fill > c.bucket.fill {
            c.bucket.fill = fill;
            c.bucket.carry = 0;
            self.stats.hints_applied += 1;
            changed = true;
            // In the hint window, what the counter now holds of older views is unknown.
            if mixed {
                self.pre_start.insert(id, Floor::MIXED);
            }
        }
        self.stats.late_credit_taken_back += taken_back;
        if changed {
            self.log_change(id, l.limit());
        }
    }

    /// Whether this root, started without a copy, may still take hints.
    fn in_hint_window(&self, now: u64) -> bool {
        !self.copied_in
            && self.born.is_some_and(|b| now.saturating_sub(b) <= self.config.hint_window_ns)
    }

    /// For a hint `fill` of counter `id` read from a view older than this root: how much
    /// it holds beyond the highest such hint before (drained like the counter), which it
    /// replaces; `None` if a hint from a newer view lifted the counter first (merge by
    /// max then).
    fn pre_start_floor(&mut self, id: QuotaId, fill: u64, l: &Limits, now: u64) -> Option<u64> {
        let floor = self.pre_start.entry(id).or_insert(Floor { fill: 0, at: now });
        let more = fill.saturating_sub(floor.fill_at(now, l)?);
        if more > 0 {
            *floor = Floor { fill, at: now };
        }
        Some(more)
    }

    /// Parks what a claim could not put into a counter with the session that claimed it.
    pub(super) fn park(&mut self, s: &mut Session, id: QuotaId, excess: u64) {
        if let Some(p) = s.parked.get_mut(&id) {
            *p = p.saturating_add(excess);
        } else if s.parked.len() < self.config.max_parked_per_limiter
            && self.parked < self.config.max_parked
        {
            s.parked.insert(id, excess);
            self.parked += 1;
        } else {
            self.stats.claims_dropped += 1;
            return;
        }
        self.stats.claims_parked += 1;
    }

    /// Moves a session's parked claims into their counters as far as the ceilings allow.
    pub(super) fn feed_parked(&mut self, s: &mut Session, now: u64) {
        if s.parked.is_empty() {
            return;
        }
        let parked = std::mem::take(&mut s.parked);
        let before = parked.len();
        s.parked = parked
            .into_iter()
            .filter_map(|(id, p)| {
                let left = self.fill_up(id, p, now)?;
                (left > 0).then_some((id, left))
            })
            .collect();
        self.parked -= before - s.parked.len();
    }
}

/// The highest hint of a view older than the root a counter holds (see
/// `RootState::pre_start`): 16 bytes, since a restarted root may hold one for each of a
/// million keys for the hint window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Floor {
    /// Milli-units at `at`; [`Floor::MIXED`]'s `u64::MAX`: a hint of a newer view lifted the
    /// counter by max since.
    pub fill: u64,
    /// ns.
    pub at: u64,
}

impl Floor {
    pub const MIXED: Floor = Floor { fill: u64::MAX, at: 0 };

    /// The fill drained to `now` at `l`'s limit; `None` if [`Floor::MIXED`].
    pub fn fill_at(&self, now: u64, l: &Limits) -> Option<u64> {
        (self.fill != u64::MAX)
            .then(|| LeakyBucket { fill: self.fill, at: self.at, carry: 0 }.fill_at(now, l.limit()))
    }
}

/// What a late entry's `attempted` units, counted over `gap` ns, add to the demand window:
/// their rate over the gap, for as long as the window spans (nothing for a gap of 0).
fn late_demand(attempted: u64, gap: u64) -> u64 {
    if gap == 0 {
        return 0;
    }
    let span = DEMAND_BUCKETS * DEMAND_BUCKET_NS;
    (u128::from(attempted) * u128::from(span.min(gap)) / u128::from(gap)) as u64
}

/// The most one delta entry may add to the demand meter.
fn demand_cap(l: &Limits) -> u64 {
    l.high_burst().saturating_add(l.limit().per_sec_ceil()).saturating_mul(DEMAND_CAP_FACTOR)
}
