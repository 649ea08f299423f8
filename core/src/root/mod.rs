//! Root-side aggregation: the cluster-wide counters one root server keeps in memory.
//!
//! # G-counter semantics, exactly once
//!
//! Each limiter only ever *adds* its own deltas and the root sums them, so there is nothing
//! to conflict. To count each delta exactly once although HTTP requests get retried and
//! answers get lost, a limiter numbers its delta batches (`seq`, increasing per limiter
//! process) and resends a batch unchanged until a root acknowledges it. The root remembers,
//! per limiter, the highest `seq` applied (`acked_seq`) and skips any batch at or below it.
//!
//! The summed value is a leaky bucket that drains at the quota's `limit`, so it stays bounded
//! however long the root runs. Hints (a limiter's view of a fill, sent after this root may
//! have lost state) merge by **max**, which is idempotent, so a hint applied twice is harmless.
//!
//! Roots don't sync with each other: a limiter syncs with every root and takes the max. A
//! restarting root may start from a copy of a live one ([`RootCopy`]).
//!
//! # Where each part lives
//!
//! A sync ([`RootState::sync_from`]) is checked, finds its limiter's session (`sessions`:
//! the table, the sequence check, who is forgotten when room is needed), applies its
//! batches and hints (`claims`: how far a message may move a counter, and why; `quotas`:
//! the quota table, resets, and deltas held for quotas not read yet), brings the session's
//! interest up to date (`interest`), and is answered (`answer`) from the change log
//! (`changes`). Counters live in a slab (`counters`) and measure their demand (`demand`); a
//! root may be split into stripes, each under a lock of its own (`stripes`).

mod answer;
mod changes;
mod claims;
mod copy;
mod counters;
pub(crate) mod demand;
mod inflight;
mod interest;
mod keys;
mod quotas;
mod sessions;
mod stripes;
#[cfg(test)]
mod tests;

pub use answer::SyncAnswer;
pub use copy::{CopyError, CopyTaken, PreStartCopy, RootCopy, SessionCopy};
pub use quotas::HOLD_NS;
pub use stripes::{stripe_of, MAX_STRIPES};

use crate::proto::{SyncError, SyncRequest, SyncResponse, MAX_LIMITER_ID_LEN, PROTOCOL_VERSION};
use crate::quota::{Epoch, QuotaId};
use crate::shard::Shard;
use crate::units::NANOS_PER_SEC;
use changes::ChangeLog;
use counters::{place_of, Counters};
use interest::{Inbox, Watchers};
use quotas::{Held, QuotaEntry};
use sessions::{Recency, Session, Sid};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use stripes::Stripe;

/// Maps keyed by quota id: the ids are the database's (a limiter can only name ones that
/// exist), and foldhash's per-process random seed keeps them from being steered into
/// collisions; SipHash cost a third of a busy root's time in lookups.
type IdMap<V> = foldhash::HashMap<QuotaId, V>;
type IdSet = foldhash::HashSet<QuotaId>;

/// Limits of one root.
#[derive(Debug, Clone)]
pub struct RootConfig {
    /// Most quotas in one answer; the limiter asks again at once for the rest.
    pub page_size: usize,
    /// Most limiter sessions tracked at once; beyond it the least recently seen is forgotten.
    pub max_limiters: usize,
    /// Most sessions one peer address may hold; beyond it that address's least recently
    /// seen session is forgotten, so one address cannot push everyone else's out.
    pub max_limiters_per_addr: usize,
    /// A limiter not heard from for this long (ns) is forgotten.
    pub limiter_idle_ns: u64,
    /// Most deltas plus hints plus batches in one request.
    pub max_entries: usize,
    /// Time constant of the per-counter rate meter shown by the admin API (ns).
    pub rate_tau_ns: u64,
    /// How far above `high_burst` a claim may lift a counter, in time of the quota's limit
    /// (ns): the counter's ceiling is `high_burst + limit × claim_slack_ns`. See "What a
    /// sync may claim" in `root/claims.rs`.
    pub claim_slack_ns: u64,
    /// Most parked claims (quota, amount) one session may hold.
    pub max_parked_per_limiter: usize,
    /// Most parked claims over all sessions.
    pub max_parked: usize,
    /// Most quotas whose deltas are held until this root reads the quota (see
    /// [`RootStats::deltas_held`]).
    pub max_held: usize,
    /// A known session's batch `seq` may run ahead of its acknowledged one by this much plus
    /// one per [`RootConfig::seq_min_interval_ns`] since its last sync.
    pub seq_ahead_slack: u64,
    /// The shortest sync interval a limiter is assumed to use (ns); see `seq_ahead_slack`.
    pub seq_min_interval_ns: u64,
    /// How long after its first sync this root takes hints (ns). Hints restore a root that
    /// lost its counters (it restarted, or joins new), and limiters send them at their
    /// first call to it, within their interval plus any backoff; after that a hint only
    /// repeats what the root has, while a forged one could hold a long window's counter at
    /// its ceiling for the whole window. See "What a sync may claim" in `root/claims.rs`.
    pub hint_window_ns: u64,
    /// How much drain at zero a counter keeps to credit late batches with (ns of its
    /// limit): see "Late batches" in `root/claims.rs`.
    pub late_credit_ns: u64,
    /// The shard of the counter space this root aggregates (`None`: every counter). Deltas
    /// and hints for counters of other shards are skipped (and counted); answers name the
    /// shard so a limiter configured otherwise notices. See [`crate::shard`].
    pub shard: Option<Shard>,
    /// How long (ns) a counter a limiter named stays in its interest
    /// ([`SyncRequest::interest`]): a counter it stops deciding on leaves its answers then.
    pub interest_ttl_ns: u64,
    /// Most counters in one session's interest; past it (or past
    /// [`RootConfig::max_interest`]) that session gets every changed counter again, as
    /// without interest, until its interest shrinks.
    pub max_interest_per_limiter: usize,
    /// Most counters in the interest of all sessions together.
    pub max_interest: usize,
    /// Most keys (counters of names under templates, see `root/keys.rs`) held in all.
    pub max_keys: usize,
    /// Most keys of one template.
    pub max_keys_per_template: usize,
    /// Which replica of its shard's escrows this root is, and of how many roots of the
    /// shard: `(index, count)`, index from 0. Replica `i` grants its part of each
    /// concurrency counter's `max_in_flight` (see `root/inflight.rs`).
    pub replica: (u32, u32),
    /// How long a share of a concurrency counter holds after the report it answers (ns).
    pub lease_ns: u64,
    /// Most limiters holding a share of one concurrency counter (more are granted 0).
    pub max_holders: usize,
}

impl Default for RootConfig {
    fn default() -> Self {
        RootConfig {
            // 10,000 quotas are about 1 MB of JSON: a first contact costs the root little
            // per round, and a million quotas still arrive in 100 back-to-back rounds.
            page_size: 10_000,
            max_limiters: 100_000,
            max_limiters_per_addr: 4_096,
            limiter_idle_ns: 600 * NANOS_PER_SEC,
            max_entries: 2_000_000,
            rate_tau_ns: 5 * NANOS_PER_SEC,
            claim_slack_ns: NANOS_PER_SEC / 4,
            max_parked_per_limiter: 65_536,
            max_parked: 1_000_000,
            // A few seconds of new quotas' counts from every limiter; about 3 MiB.
            max_held: 65_536,
            // After a root outage a limiter resends up to 30 batches at once.
            seq_ahead_slack: 64,
            // Half the shortest interval anyone runs (50 ms): twice the honest rate.
            seq_min_interval_ns: 25_000_000,
            // Limiters back off up to 30 intervals from a root that is down, and come back
            // within a few after it answers: two minutes covers a 1 s interval with room.
            hint_window_ns: 120 * NANOS_PER_SEC,
            // A limiter keeps up to 30 intervals of batches for a root it cannot reach.
            late_credit_ns: 30 * NANOS_PER_SEC,
            shard: None,
            interest_ttl_ns: 10 * NANOS_PER_SEC,
            // A limiter naming 25,000 counters a second; about 8 MiB.
            max_interest_per_limiter: 250_000,
            // About 128 MiB over all sessions.
            max_interest: 4_000_000,
            // About 250 bytes each with their counter: 1 GiB in all.
            max_keys: 4_000_000,
            max_keys_per_template: 2_000_000,
            replica: (0, 1),
            // Three rounds at the default interval: a lost answer or two keeps the share.
            lease_ns: 3 * NANOS_PER_SEC,
            max_holders: 10_000,
        }
    }
}

/// Running totals for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RootStats {
    /// Sync requests answered.
    pub syncs: u64,
    /// Delta entries added to counters.
    pub deltas_applied: u64,
    /// Delta entries for quotas this root does not know (dropped), including held ones
    /// whose quota did not arrive in time.
    pub deltas_unknown: u64,
    /// Delta entries held for a quota this root has not read yet: an id above every id it
    /// knows, so most likely created through another root of the same database moments
    /// ago. Applied when the quota arrives within [`HOLD_NS`]; dropped (and counted
    /// unknown) after, or when [`RootConfig::max_held`] quotas are held already.
    pub deltas_held: u64,
    /// Delta entries and hints for counters of another shard (skipped): a limiter
    /// configured with another shard map.
    pub deltas_foreign: u64,
    /// Batches skipped because they were applied before (retries).
    pub duplicate_batches: u64,
    /// Hints that raised a counter.
    pub hints_applied: u64,
    /// Of those, hints read from a view older than this root that it added on top of what
    /// it summed itself, rather than merging by max (see [`RootState::sync_from`]).
    pub hints_added: u64,
    /// Admitted amounts that met a counter's ceiling and were parked with their session.
    pub claims_parked: u64,
    /// Parked amounts dropped because the session or the root held too many.
    pub claims_dropped: u64,
    /// Delta entries whose `rejected` (or whole attempted) amount was cut for the demand
    /// meter.
    pub rejected_capped: u64,
    /// Hints cut at a counter's ceiling.
    pub hints_capped: u64,
    /// Hints refused because they came later than [`RootConfig::hint_window_ns`] after
    /// this root's first sync.
    pub hints_late: u64,
    /// Hints not taken because they could restore nothing: their limiter knows this root's
    /// instance and dropped none of its batches.
    pub hints_redundant: u64,
    /// Late batches' admitted milli-units credited with drain their counter spent at zero
    /// meanwhile (see "Late batches" in `root/claims.rs`).
    pub late_credited: u64,
    /// Of [`late_credited`](Self::late_credited), what hints from views before a restart
    /// took back: the counter never emptied. Kept apart so that both stay monotonic.
    pub late_credit_taken_back: u64,
    /// Late batches' admitted milli-units dropped above a counter's `low_burst` instead of
    /// parked.
    pub late_dropped: u64,
    /// Sessions forgotten to make room (table or address budget full).
    pub limiters_evicted: u64,
    /// Sessions started: a limiter id this root did not know (a new limiter, or one it
    /// forgot, or any limiter after this root restarted).
    pub sessions_created: u64,
    /// Requests without this root's current instance: first contacts, answered with every
    /// counter instead of the changes.
    pub first_contacts: u64,
    /// Quotas and tombstones sent in answers.
    pub quotas_sent: u64,
    /// Counters emptied by a cluster-wide reset.
    pub resets: u64,
    /// Delta entries and hints dropped because they were counted before their quota's
    /// reset.
    pub dropped_before_reset: u64,
    /// Answers by interest ([`SyncRequest::interest`]).
    pub interest_answers: u64,
    /// Syncs that asked for interest but got every changed counter: the session's or the
    /// root's interest was full.
    pub interest_full: u64,
    /// Keys (names under templates) this root started counting.
    pub keys_created: u64,
    /// Keys refused: the template's or the root's bound on keys was reached (their deltas
    /// count as unknown).
    pub keys_refused: u64,
}

/// A counter's live view for the admin API.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CounterView {
    /// Fill now, units.
    pub fill: f64,
    /// Recent inflow, units per second (exponentially weighted).
    pub rate: f64,
    /// Drop probability at this fill.
    pub drop_probability: f64,
}

/// One root's counters, quota table and limiter sessions. Not thread-safe on its own: the
/// server wraps it in a lock.
#[derive(Debug)]
pub struct RootState {
    config: RootConfig,
    instance: u64,
    quotas: IdMap<QuotaEntry>,
    by_epoch: BTreeMap<Epoch, QuotaId>,
    /// Quotas in `quotas` that are not tombstones.
    live: usize,
    epoch: Epoch,
    counters: Counters,
    /// Latest version of each counter that changed → the counter as of that change.
    changes: ChangeLog,
    /// The version of the latest change, shared by the stripes of one root
    /// ([`RootState::striped`]): an answer's version must order changes of every stripe.
    version: Arc<AtomicU64>,
    /// The counters this state holds when it is one stripe of a root
    /// ([`RootState::striped`]); only the lead keeps the quota pages.
    stripe: Stripe,
    limiters: HashMap<Box<str>, Session>,
    /// Every session by recency, oldest first: who goes when room is needed.
    recency: BTreeMap<Recency, Box<str>>,
    /// Each peer address's sessions by recency.
    by_addr: HashMap<IpAddr, BTreeSet<Recency>>,
    next_serial: u64,
    /// Limiters heard from within [`LIVE_LIMITER_WINDOW`](crate::proto::LIVE_LIMITER_WINDOW),
    /// and when they were counted (ns; counted at most once a second).
    live_limiters: (u32, u64),
    /// Parked claims over all sessions.
    parked: usize,
    /// Deltas held for quotas not read yet, by quota id ([`RootStats::deltas_held`]).
    held: IdMap<Held>,
    /// The highest quota id read (live or deleted): deltas of a higher one are held.
    highest_id: QuotaId,
    /// When `held` was last cleared of expired entries.
    held_swept: u64,
    /// Interest entries over all sessions.
    interest: usize,
    /// Places of the counter slab the current incremental sweep has still to look at (the
    /// ones below this); 0 when no pass is under way.
    sweep_left: usize,
    /// Per counter, the sessions (`sid`) that have it in their interest.
    watchers: IdMap<Watchers>,
    /// Per session (by `sid`), the counters of its interest that changed since its last
    /// answer: filled as counters change, so an answer costs what it carries, not a look at
    /// every counter of the interest. Empty for a session not asking by interest.
    inboxes: Vec<Inbox>,
    /// Numbers of forgotten sessions, for the next new ones.
    free_sids: Vec<Sid>,
    /// The highest batch of sessions forgotten lately (see [`sessions::Forgotten`]).
    forgotten: sessions::Forgotten,
    /// Keys: counters of names under templates.
    keys: keys::Keys,
    /// Concurrency counters' escrows.
    escrows: inflight::Escrows,
    /// The cluster's secret for key ids, handed to limiters in answers.
    key_secret: Option<(u64, u64)>,
    /// The time of this root's first sync: hints count from it (see
    /// [`RootConfig::hint_window_ns`]).
    born: Option<u64>,
    /// When this root began to take syncs (before it listened; see [`RootState::start`]):
    /// a limiter's view answered before then holds none of the batches this root sums.
    /// Signed: a copied root's start ([`RootState::copy_in`]) may precede this process's
    /// clock.
    started: Option<i128>,
    /// Per counter, in the hint window, the highest hint read from such a view (drained
    /// like the counter): the part of the counter this root did not sum. `Floor::MIXED`
    /// once a hint from a newer view lifted the counter by max: what it holds of whose is
    /// then unknown, and later hints of that counter merge by max too.
    pre_start: IdMap<claims::Floor>,
    /// Per counter made by a late batch in the hint window: the credit late batches had
    /// from its spare since (drain assumed, not seen: see `RootState::add_late`); a hint
    /// above zero from a view older than this root takes it back. Goes with the counter,
    /// and all of it when the hint window ends.
    lent: IdMap<u64>,
    /// Whether this root took a copy of another ([`RootState::copy_in`]): the copy holds
    /// whatever an older view could add, so every hint merges by max.
    copied_in: bool,
    stats: RootStats,
}

impl RootState {
    /// An empty root with a fresh random instance id.
    pub fn new(config: RootConfig) -> Self {
        RootState {
            config,
            instance: fastrand::u64(1..),
            quotas: IdMap::default(),
            by_epoch: BTreeMap::new(),
            live: 0,
            epoch: 0,
            counters: Counters::default(),
            changes: ChangeLog::default(),
            version: Arc::new(AtomicU64::new(0)),
            stripe: Stripe::WHOLE,
            limiters: HashMap::new(),
            recency: BTreeMap::new(),
            by_addr: HashMap::new(),
            // 0 is a session never kept: one this root meets for the first time.
            next_serial: 1,
            live_limiters: (0, 0),
            parked: 0,
            held: IdMap::default(),
            highest_id: 0,
            held_swept: 0,
            interest: 0,
            sweep_left: 0,
            watchers: IdMap::default(),
            inboxes: Vec::new(),
            free_sids: Vec::new(),
            forgotten: sessions::Forgotten::default(),
            keys: keys::Keys::default(),
            escrows: inflight::Escrows::default(),
            key_secret: None,
            born: None,
            started: None,
            pre_start: IdMap::default(),
            lent: IdMap::default(),
            copied_in: false,
            stats: RootStats::default(),
        }
    }

    /// Marks the time from which this root may take syncs, before it listens (without it,
    /// its first sync's): a hint read from an answer older than this holds no batch this
    /// root counts itself, so such hints add to its sums (see [`RootState::sync_from`]).
    pub fn start(&mut self, now: u64) {
        self.started.get_or_insert(now as i128);
    }

    /// This root process's instance id.
    pub fn instance(&self) -> u64 {
        self.instance
    }

    /// Highest epoch known.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// Live quotas (tombstones excluded).
    pub fn quota_count(&self) -> usize {
        self.live
    }

    /// Counters held (non-empty buckets, until swept).
    pub fn counter_count(&self) -> usize {
        self.counters.len()
    }

    /// Limiters currently tracked.
    pub fn limiter_count(&self) -> usize {
        self.limiters.len()
    }

    /// Parked claims held over all sessions.
    pub fn parked_count(&self) -> usize {
        self.parked
    }

    /// Running totals.
    pub fn stats(&self) -> RootStats {
        self.stats
    }

    /// Sets the cluster's secret that key ids are derived with; answers carry it.
    pub fn set_key_secret(&mut self, secret: (u64, u64)) {
        self.key_secret = Some(secret);
    }

    /// The cluster's secret for key ids, once set.
    pub fn key_secret(&self) -> Option<(u64, u64)> {
        self.key_secret
    }

    /// Answers one limiter's sync at time `now` (ns). Same as [`RootState::sync_from`]
    /// without a peer address, with an owned answer.
    pub fn sync(&mut self, req: &SyncRequest, now: u64) -> Result<SyncResponse, SyncError> {
        self.sync_from(req, None, now).map(SyncAnswer::into_response)
    }

    /// Answers one limiter's sync at time `now` (ns), received from `peer` (the address
    /// budget of [`RootConfig::max_limiters_per_addr`] applies per peer).
    pub fn sync_from(
        &mut self,
        req: &SyncRequest,
        peer: Option<IpAddr>,
        now: u64,
    ) -> Result<SyncAnswer, SyncError> {
        self.check_request(req)?;
        self.born.get_or_insert(now);
        let (name, mut s) = self.admit_session(req, peer, now)?;
        self.feed_parked(&mut s, now);
        // Batches up to here were applied, and named, by an earlier sync.
        let applied_before = s.acked;
        self.note_key_templates(req);
        // A limiter that knows this instance sends the batches this root has not taken, and
        // hints only to catch up with batches it had to drop: sum, then max. One that does
        // not (this root restarted, or is new to it) may send batches other roots took and
        // other limiters' hints carry already: max first, then only the batches no hint
        // holds (`hinted_seq`), so nothing counts twice and a hint swallows no batch.
        // A copied session (`copy.rs`) is known until the limiter names this instance: a
        // retry after a lost answer still names the one this root replaced.
        s.copied &= req.root_instance != Some(self.instance);
        let known = req.root_instance == Some(self.instance) || s.copied;
        // A limiter that met this root after it restarted, without a failed call first,
        // learns of the restart from the answer and sends its hints in the next requests,
        // which name this instance: those catch up like hints to an unknown instance
        // (`Session::catch_up`); skipped, the restarted root kept only what was counted
        // since (`make chaos`: a ledger 14,000 units short at one root).
        // Hints that start over below where the last ones ended are not the rest of a
        // catch-up but the limiter's view sent again after a failed call to this root (in
        // case it lost what it had): taken again, from a view newer than this root's start
        // and so merged by max, they swallowed what this root summed that the view lacked
        // (a limiter that took its hints, then failed a call: `sync::tests`).
        // But a catch-up goes on after such hints: they may be a call this root took whose
        // answer was lost, sent again before the rest.
        let first_hint = req.hints.first().map(|h| h.0);
        let catching_up = known && s.catch_up && first_hint.is_some_and(|f| f >= s.hinted_to);
        let sent_again = known && s.catch_up && first_hint.is_some_and(|f| f < s.hinted_to);
        // Hints from a view answered before this root started hold only counts of before,
        // none of the batches it sums (those were sent to it, so after it started; the
        // ones another root took are skipped by `hinted_seq`). Merged by max, a hint that
        // came after this root summed some batches swallowed them: with both roots of a
        // shard killed at once, `make chaos` found a round of the cluster's traffic lost.
        // Such a hint lifts the counter by what it holds beyond the highest one before
        // (`pre_start`) instead. The answer time, in this root's clock, is at most
        // `now - view_age_ns` (the request took some time to come).
        let started = self.started.unwrap_or(self.born.unwrap_or(now) as i128);
        let pre_start = !self.copied_in
            && req.view_age_ns.is_some_and(|age| (now as i128) - (age as i128) < started);
        s.catch_up = !known || catching_up || sent_again;
        if !known {
            s.hinted_to = 0;
        }
        if s.catch_up {
            if let Some(last) = req.hints.last() {
                s.hinted_to = s.hinted_to.max(last.0.saturating_add(1));
            }
        }
        let acked = if known && !catching_up {
            // Hints to a root that never lost this limiter's session make up only for
            // batches the limiter dropped (its first batch then starts past the one after
            // the acknowledged one). Otherwise this root holds all they could restore, and a
            // view taken from a limiter that decided alone for a while (cut off from every
            // root) would lift the counter to what it counted by itself: in `make chaos`
            // the whole cluster then refused for a second after a cut healed.
            let first = req.batches.iter().map(|b| b.seq).min();
            let dropped = first.is_none_or(|f| f > s.acked.saturating_add(1));
            let acked = self.apply_batches(req, &mut s, 0, now);
            if dropped {
                // A root that knows the session has answered it since it started.
                self.apply_hints(req, false, now);
            } else {
                self.skip_hints(req);
            }
            acked
        } else {
            self.apply_hints(req, pre_start, now);
            self.apply_batches(req, &mut s, req.hinted_seq.unwrap_or(0), now)
        };
        let noted = self.update_interest(&mut s, req, applied_before, now);
        let mut answer = self.answer(req, &s, acked, noted, now);
        answer.grants = self.grant_shares(req, now);
        self.keep_session(name, s, acked, peer, now);
        Ok(answer)
    }

    /// Refuses what no sync may be: another protocol version, a limiter id out of bounds,
    /// more entries than [`RootConfig::max_entries`].
    fn check_request(&self, req: &SyncRequest) -> Result<(), SyncError> {
        if req.v != PROTOCOL_VERSION {
            return Err(SyncError::UnsupportedVersion(req.v));
        }
        if req.limiter.is_empty() || req.limiter.len() > MAX_LIMITER_ID_LEN {
            return Err(SyncError::BadLimiterId);
        }
        let entries = req
            .batches
            .iter()
            .map(|b| b.deltas.len() + 1)
            .fold(req.hints.len(), usize::saturating_add)
            .saturating_add(req.watch.len())
            .saturating_add(req.key_templates.len())
            .saturating_add(req.in_flight.len());
        if entries > self.config.max_entries {
            return Err(SyncError::TooLarge(entries, self.config.max_entries));
        }
        if req.batches.len() > crate::proto::MAX_BATCHES {
            return Err(SyncError::TooManyBatches(req.batches.len()));
        }
        for (index, b) in req.batches.iter().enumerate() {
            let (len, deltas) = (b.drained.len(), b.deltas.len());
            if len != 0 && len != deltas {
                return Err(SyncError::BadDrained { index, len, deltas });
            }
        }
        Ok(())
    }
}
