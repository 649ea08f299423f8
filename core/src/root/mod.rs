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
//! Roots don't know each other: a limiter syncs with every root and takes the max.
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
//!   again); other sessions see the counter at its ceiling. An honest limiter syncs every interval, so a heavy request or
//!   an overshoot keeps its quota at the ceiling for as long as its weight takes to drain at
//!   `limit`, as if the counter had taken it whole (it dips by at most one interval of the
//!   limit between two syncs of the limiter that claimed it).
//! * A client that **stops** sending stops feeding: its parked claims stay parked until its
//!   session is forgotten. From the ceiling the counter drains to `low_burst` in
//!   `(high_burst - low_burst) / limit + claim_slack`: with the recommended bursts
//!   (`low_burst` = 1.5 and `high_burst` = 3 intervals of the limit) that is 1.75 s at a 1 s
//!   interval, within two intervals, and less for shorter bursts. Below `low_burst` nothing
//!   is rejected, whatever the demand meter says. Limiters learn it at their next sync, so
//!   honest traffic sees it up to one of their intervals later: a stopped client leaves a
//!   quota where an honest burst to `high_burst` would, plus `claim_slack`.
//! * **Hints** merge by max and are cut at the ceiling (a hint restores a restarted root;
//!   it never needs to exceed what the counter can hold).
//! * **Demand**: each delta entry adds at most `1024 × (high_burst + limit × 1 s)` attempted
//!   units to the demand meter: the suppressed share `1 - limit / demand` is already 99.9 %
//!   there, so honest floods show as before and a forged `u64::MAX` stays finite. The meter
//!   spans 2 s and only acts while the fill is above `low_burst`.
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

use crate::proto::{SyncError, SyncRequest, SyncResponse, MAX_LIMITER_ID_LEN, PROTOCOL_VERSION};
use crate::quota::{Epoch, Limits, QuotaId, QuotaUpdate};
use crate::shard::Shard;
use crate::units::{milli_to_units, LeakyBucket, NANOS_PER_SEC};
use counters::{Counters, NO_COUNTER};
use serde::ser::{SerializeSeq, SerializeStruct};
use serde::{Serialize, Serializer};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

/// Maps keyed by quota id: the ids are the database's (a limiter can only name ones that
/// exist), and foldhash's per-process random seed keeps them from being steered into
/// collisions; SipHash cost a third of a busy root's time in lookups.
type IdMap<V> = foldhash::HashMap<QuotaId, V>;

/// Counter `id`'s place in the slab, kept in its quota's entry.
#[inline]
fn place_of(quotas: &IdMap<QuotaEntry>, id: QuotaId) -> u32 {
    quotas.get(&id).map_or(NO_COUNTER, |q| q.counter)
}

/// How long deltas of a quota this root has not read yet wait for it: a few of the
/// server's database polls (1 s).
pub const HOLD_NS: u64 = 10 * NANOS_PER_SEC;

/// Deltas held for one quota not read yet ([`RootStats::deltas_held`]).
#[derive(Debug, Clone, Copy)]
struct Held {
    admitted: u64,
    rejected: u64,
    /// The lowest quota epoch of the batches they came in (for the reset check).
    epoch: Epoch,
    /// When the first came.
    since: u64,
    /// Delta entries summed here.
    entries: u64,
}
type IdSet = foldhash::HashSet<QuotaId>;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

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
    /// sync may claim" in the module docs.
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
}

/// Width of one bucket of the demand window, ns.
const DEMAND_BUCKET_NS: u64 = 250_000_000;
/// Full buckets the demand rate is averaged over: 2 s, a whole number of 1 s, 500 ms, 250 ms
/// … sync intervals, so each limiter's once-per-interval batches count exactly as often
/// whenever the window is read (an exponential average read right after one's own batch
/// landed would be biased high, and suppress too much).
const DEMAND_BUCKETS: u64 = 8;
const DEMAND_SLOTS: usize = DEMAND_BUCKETS as usize + 1;

/// Attempted (admitted + refused) milli-units per 250 ms bucket, over the last 2 s.
#[derive(Debug, Clone, Copy, Default)]
struct DemandWindow {
    buckets: [u64; DEMAND_SLOTS],
    /// Index (time / bucket width) of the newest bucket.
    head: u64,
}

impl DemandWindow {
    fn add(&mut self, amount: u64, now: u64) {
        let b = now / DEMAND_BUCKET_NS;
        if b > self.head {
            for k in (self.head + 1)..=b.min(self.head + DEMAND_SLOTS as u64) {
                self.buckets[(k % DEMAND_SLOTS as u64) as usize] = 0;
            }
            self.head = b;
        }
        // A batch stamped in an older bucket (time never goes back here) lands in the newest.
        let slot = (self.head % DEMAND_SLOTS as u64) as usize;
        self.buckets[slot] = self.buckets[slot].saturating_add(amount);
    }

    /// Milli-units per second over the last [`DEMAND_BUCKETS`] full buckets before `now`.
    fn rate(&self, now: u64) -> f64 {
        let b = now / DEMAND_BUCKET_NS;
        // The full buckets before `now` the window still holds: from `first` (or the
        // oldest held, `head - DEMAND_SLOTS + 1`) up to `b` (or `head`), walked with one
        // remainder, not one per bucket (a division each: this runs for every counter of
        // every answer).
        let lo = b
            .saturating_sub(DEMAND_BUCKETS)
            .max((self.head + 1).saturating_sub(DEMAND_SLOTS as u64));
        let hi = b.min(self.head + 1);
        let mut sum = 0u64;
        let mut i = (lo % DEMAND_SLOTS as u64) as usize;
        for _ in lo..hi {
            sum = sum.saturating_add(self.buckets[i]);
            i = if i + 1 == DEMAND_SLOTS { 0 } else { i + 1 };
        }
        sum as f64 * NANOS_PER_SEC as f64 / (DEMAND_BUCKETS * DEMAND_BUCKET_NS) as f64
    }

    fn is_recent(&self, now: u64) -> bool {
        self.head + DEMAND_SLOTS as u64 > now / DEMAND_BUCKET_NS
            && self.buckets.iter().any(|&b| b > 0)
    }
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
            shard: None,
            interest_ttl_ns: 10 * NANOS_PER_SEC,
            // A limiter naming 25,000 counters a second; about 8 MiB.
            max_interest_per_limiter: 250_000,
            // About 128 MiB over all sessions.
            max_interest: 4_000_000,
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
    /// Admitted amounts that met a counter's ceiling and were parked with their session.
    pub claims_parked: u64,
    /// Parked amounts dropped because the session or the root held too many.
    pub claims_dropped: u64,
    /// Delta entries whose `rejected` (or whole attempted) amount was cut for the demand
    /// meter.
    pub rejected_capped: u64,
    /// Hints cut at a counter's ceiling.
    pub hints_capped: u64,
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
}

impl RootStats {
    /// Adds the counter-level totals of another stripe of the same root (`self` being the
    /// lead's): deltas, hints, claims and resets happen in one stripe each, while syncs,
    /// sessions and batches are seen by every stripe and counted once, by the lead.
    pub fn add_stripe(&mut self, o: &RootStats) {
        self.deltas_applied += o.deltas_applied;
        self.deltas_unknown += o.deltas_unknown;
        self.deltas_held += o.deltas_held;
        self.deltas_foreign += o.deltas_foreign;
        self.hints_applied += o.hints_applied;
        self.claims_parked += o.claims_parked;
        self.claims_dropped += o.claims_dropped;
        self.rejected_capped += o.rejected_capped;
        self.hints_capped += o.hints_capped;
        self.resets += o.resets;
        self.dropped_before_reset += o.dropped_before_reset;
        self.interest_full = self.interest_full.max(o.interest_full);
    }
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

/// A quota as the sync path needs it: what every delta reads (limits, reset epoch, whether
/// deleted) inline in the map's slot, one cache line with its key, and the stored update
/// behind it only for the answers' quota pages and the admin API. Reading the limits
/// through the `Arc` cost a second cache miss for every delta of every limiter.
#[derive(Debug)]
struct QuotaEntry {
    limits: Limits,
    reset_epoch: Epoch,
    deleted: bool,
    /// Its counter's place in the slab ([`NO_COUNTER`]: none), here because every delta
    /// reads this entry anyway: a map of its own was one more cache miss per new counter.
    counter: u32,
    update: Arc<QuotaUpdate>,
}

#[derive(Debug, Clone, Copy, Default)]
struct RootCounter {
    bucket: LeakyBucket,
    /// The rate it drains at: its quota's limit, kept here so that a sweep or an answer
    /// reads the counter alone (a second lookup, in a million-quota map, is a cache miss).
    limit: u64,
    version: u64,
    /// Where its latest change sits in the change log (valid while `version` is not 0).
    log_at: usize,
    /// Admitted inflow: milli-units per second as of `rate_at`.
    rate: f64,
    rate_at: u64,
    demand: DemandWindow,
}

impl RootCounter {
    /// Every word of it, folded: see [`Counters::touch`].
    fn touch(&self) -> u64 {
        let b = &self.bucket;
        let words = [b.fill, b.at, b.carry, self.limit, self.version, self.rate_at];
        let d = &self.demand;
        d.buckets.iter().chain(&words).fold(d.head ^ self.log_at as u64, |t, &w| t ^ w)
            ^ self.rate.to_bits()
    }
}

/// A counter as its latest change left it, kept in the change log so that an answer is
/// built by walking the log alone: each entry's fill (drained to the answer's time at
/// `limit`) and demand (its window read at that time) come out exactly as from the counter
/// itself, without a lookup per counter. Answers carry every counter that changed in the
/// cluster since the limiter's last sync, so this walk is most of a root's work per sync.
#[derive(Debug, Clone, Copy)]
struct Change {
    id: QuotaId,
    bucket: LeakyBucket,
    limit: u64,
    demand: DemandWindow,
}

/// Whether a root may drop a counter: drained, and without recent demand (dropping one that
/// still sees demand would restart its window from zero and let a burst through), or of a
/// quota that is gone (`limit` 0).
fn spent(c: &RootCounter, limit: u64, now: u64) -> bool {
    limit == 0 || (c.bucket.fill_at(now, limit) == 0 && !c.demand.is_recent(now))
}

/// Ids whose entries [`RootState::warm`] loads at once before they are worked on: enough
/// misses in flight to keep the memory busy, few enough that the first are still in the cache
/// when the work reaches them (a whole 50,000-delta sync warmed at once was not: its quota
/// probes still missed, a quarter of a busy root's samples).
const WARM_RUN: usize = 256;

/// Entries per chunk of the change log.
const LOG_CHUNK: usize = 4096;
/// A place in the change log: chunk number above these bits, offset in the chunk below.
const LOG_SHIFT: u32 = 16;
const LOG_OFFSET: usize = (1 << LOG_SHIFT) - 1;

/// The change log: each counter's latest change, in version order, in chunks of
/// [`LOG_CHUNK`]. A change replaces the counter's previous entry by a tombstone (O(1): the
/// counter knows the place) and is appended, where a `BTreeMap` by version took a removal
/// and an insertion deep in a tree of up to a million entries for every delta. A chunk is
/// compacted on its own once half of it is tombstones (a few thousand entries, not the whole
/// log: one pass over a million entries held every sync back for 50 ms every few seconds),
/// empty chunks leave from the front, and the few live entries of an old front chunk are
/// moved to the end so that it can leave too.
#[derive(Debug, Default)]
struct ChangeLog {
    chunks: VecDeque<LogChunk>,
    /// The number of `chunks[0]`; numbers only grow, so places stay valid when the front goes.
    first: usize,
    live: usize,
    /// Emptied buffers of a whole chunk's size, for the next new chunks: a fresh one is
    /// half a megabyte the allocator often maps anew, and the kernel zeroing those pages
    /// (under the root's lock) was 6 % of a busy root's time.
    spare: Vec<Vec<(u64, Option<Change>)>>,
}

/// Spare chunk buffers kept, at most.
const LOG_SPARE: usize = 2;

#[derive(Debug, Default)]
struct LogChunk {
    entries: Vec<(u64, Option<Change>)>,
    live: usize,
}

impl ChangeLog {
    /// Appends the change of version `v` (above every version in the log); its place.
    fn push(&mut self, v: u64, c: Change) -> usize {
        if self.chunks.back().map_or(true, |ch| ch.entries.len() >= LOG_CHUNK) {
            let entries = self.spare.pop().unwrap_or_else(|| Vec::with_capacity(LOG_CHUNK));
            self.chunks.push_back(LogChunk { entries, live: 0 });
        }
        let no = self.first + self.chunks.len() - 1;
        let ch = self.chunks.back_mut().expect("a chunk was pushed above");
        ch.entries.push((v, Some(c)));
        ch.live += 1;
        self.live += 1;
        no << LOG_SHIFT | (ch.entries.len() - 1)
    }

    /// The live change of version `v` at `at`, if it is still there (not replaced by a newer
    /// change of its counter, not moved by a compaction).
    fn get(&self, at: usize, v: u64) -> Option<&Change> {
        let ch = self.chunks.get((at >> LOG_SHIFT).checked_sub(self.first)?)?;
        ch.entries.get(at & LOG_OFFSET).filter(|e| e.0 == v)?.1.as_ref()
    }

    /// What the log holds of the change of version `v` recorded at `at`: `Some(None)` when
    /// it was tombstoned in place (a later change of its counter is further on), `None`
    /// when it is no longer at `at` (its chunk was compacted or left: look at the counter).
    fn find(&self, at: usize, v: u64) -> Option<Option<&Change>> {
        let ch = self.chunks.get((at >> LOG_SHIFT).checked_sub(self.first)?)?;
        ch.entries.get(at & LOG_OFFSET).filter(|e| e.0 == v).map(|e| e.1.as_ref())
    }

    fn chunk_mut(&mut self, at: usize) -> Option<&mut LogChunk> {
        self.chunks.get_mut((at >> LOG_SHIFT).checked_sub(self.first)?)
    }

    /// Tombstones the entry of version `v` at `at`; whether its chunk (not the newest) is
    /// now half tombstones and worth compacting.
    fn kill(&mut self, at: usize, v: u64) -> bool {
        let newest = self.first + self.chunks.len().saturating_sub(1);
        let Some(ch) = self.chunk_mut(at) else { return false };
        let Some(e) = ch.entries.get_mut(at & LOG_OFFSET).filter(|e| e.0 == v && e.1.is_some())
        else {
            return false;
        };
        e.1 = None;
        ch.live -= 1;
        let worth = at >> LOG_SHIFT != newest && ch.live * 2 < ch.entries.len();
        self.live -= 1;
        worth
    }

    /// Drops the tombstones of the chunk of `at`, calling `moved(id, new place)` for each
    /// live entry, then the empty chunks at the front.
    fn compact(&mut self, at: usize, mut moved: impl FnMut(QuotaId, usize)) {
        let no = at >> LOG_SHIFT;
        if let Some(ch) = self.chunk_mut(at) {
            // The live entries into a buffer of their size (memory follows what is live);
            // a whole chunk's buffer is kept for a new chunk.
            let live: Vec<_> = ch.entries.iter().filter(|e| e.1.is_some()).copied().collect();
            let old = std::mem::replace(&mut ch.entries, live);
            for (i, e) in ch.entries.iter().enumerate() {
                if let Some(c) = &e.1 {
                    moved(c.id, no << LOG_SHIFT | i);
                }
            }
            self.recycle(old);
        }
        while self.chunks.len() > 1 && self.chunks.front().is_some_and(|c| c.live == 0) {
            if let Some(ch) = self.chunks.pop_front() {
                self.recycle(ch.entries);
            }
            self.first += 1;
        }
    }

    /// Keeps a chunk's buffer for a new chunk, if it is a whole one and room is left.
    fn recycle(&mut self, mut buf: Vec<(u64, Option<Change>)>) {
        if buf.capacity() == LOG_CHUNK && self.spare.len() < LOG_SPARE {
            buf.clear();
            self.spare.push(buf);
        }
    }

    /// The live entries of the oldest chunk, when they are few and newer chunks follow:
    /// moving them to the end lets the chunk go (a counter left alone for long, draining a
    /// large fill slowly, would otherwise keep every chunk after it).
    fn stale_front(&self) -> Option<Vec<(usize, u64, Change)>> {
        let front = self.chunks.front()?;
        if self.chunks.len() < 3 || front.live == 0 || front.live > LOG_CHUNK / 8 {
            return None;
        }
        let no = self.first;
        Some(
            front
                .entries
                .iter()
                .enumerate()
                .filter_map(|(i, e)| Some((no << LOG_SHIFT | i, e.0, e.1?)))
                .collect(),
        )
    }

    /// The live changes after version `since`, in version order.
    fn since(&self, since: u64) -> impl Iterator<Item = &Change> {
        // The first chunk that may hold a version above `since`, looking back from the
        // newest: answers are mostly about the last interval.
        let mut k = self.chunks.len();
        while k > 0 {
            k -= 1;
            if self.chunks[k].entries.first().is_some_and(|e| e.0 <= since) {
                break;
            }
        }
        self.chunks
            .range(k..)
            .flat_map(|ch| ch.entries.iter())
            .filter(move |e| e.0 > since)
            .filter_map(|e| e.1.as_ref())
    }
}

/// An exponentially weighted rate: `amount` arriving at `now` on a meter reading `rate` at
/// `at` with time constant `tau` (all ns).
fn meter(rate: &mut f64, at: &mut u64, amount: u64, now: u64, tau: u64) {
    let tau = tau.max(1) as f64;
    let dt = now.saturating_sub(*at) as f64;
    *rate = *rate * (-dt / tau).exp() + amount as f64 * NANOS_PER_SEC as f64 / tau;
    *at = (*at).max(now);
}

fn meter_at(rate: f64, at: u64, now: u64, tau: u64) -> f64 {
    rate * (-(now.saturating_sub(at) as f64) / tau.max(1) as f64).exp()
}

/// `limit` milli-units/s over `ns`, saturating.
fn limit_over(limit: u64, ns: u64) -> u64 {
    u64::try_from(u128::from(limit) * u128::from(ns) / u128::from(NANOS_PER_SEC))
        .unwrap_or(u64::MAX)
}

/// Attempts one delta entry may report to the demand meter, as a multiple of what the
/// quota can take in a second (`high_burst + limit × 1 s`). The demand signal suppresses
/// `1 - limit / demand`: 1024 times the capacity is already 99.9 %, so the cap changes
/// nothing an honest flood shows and keeps a forged one finite.
const DEMAND_CAP_FACTOR: u64 = 1024;

/// Most stripes of one root ([`RootState::striped`]).
pub const MAX_STRIPES: u32 = 64;

/// The stripe (of `count`) that holds the counter of quota `id` within one root. Not
/// [`Shard::of`]: a root of shard `i/n` holds only ids whose shard hash is `i` mod `n`, and
/// striping it by the same hash would put all of them on one stripe. The high half of a
/// differently seeded splitmix64 spreads them evenly whatever the shard.
pub fn stripe_of(id: QuotaId, count: u32) -> u32 {
    if count <= 1 {
        return 0;
    }
    let mut z = id ^ 0x2545_f491_4f6c_dd1d;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    ((z >> 32) % u64::from(count)) as u32
}

fn in_stripe(stripe: Option<(u32, u32)>, id: QuotaId) -> bool {
    stripe.map_or(true, |(index, count)| stripe_of(id, count) == index)
}

/// The sessions (`sid`) watching one counter: about three at 300 limiters by interest over
/// a million counters, held in the map's slot. Six fit in the slot's 32 bytes (three did
/// as `u64`): with three on average, a third of the counters spilled to the heap, and that
/// list was a cache miss of its own for every delta (to notify) and for every id that left
/// an interest (to unwatch); with six, one in thirty spills.
type Watchers = smallvec::SmallVec<[Sid; 6]>;

/// A session's number: its index in [`RootState::inboxes`], reused once it is forgotten,
/// so it stays small (below `max_limiters`) and an inbox is found without a hash lookup.
type Sid = u32;

/// Records an inbox may hold beyond twice its session's interest.
const INBOX_SLACK: usize = 64;

/// The changes of one session's interest since its last answer (answers by interest).
#[derive(Debug, Default)]
struct Inbox {
    /// `(counter, version, place in the change log)` of each change, in the order they
    /// came: a push per change, where a set cost a lookup, and the answer reads each change
    /// from the log entry it names, which holds all it needs (fill, limit, demand), where
    /// looking up the counter and its quota cost two more misses. A counter that changed
    /// twice has two records; the older one no longer matches the log and is skipped.
    changes: Vec<(QuotaId, u64, usize)>,
    /// Records held at most (twice the interest, and some): a session that stops syncing
    /// stops growing its inbox here, and the whole interest it then answers with is at most
    /// half as long as the list it replaces.
    cap: usize,
    /// More changes came than `cap`: the next answer looks at the whole interest instead.
    overflow: bool,
}

impl Inbox {
    fn push(&mut self, id: QuotaId, v: u64, at: usize) {
        if self.overflow {
            return;
        }
        if self.changes.len() >= self.cap {
            self.overflow = true;
            self.changes = Vec::new();
            return;
        }
        self.changes.push((id, v, at));
    }
}

/// The key of a session in the recency index: last seen, then a serial for ties.
type Recency = (u64, u64);

#[derive(Debug, Default)]
struct Session {
    acked: u64,
    last_seen: u64,
    serial: u64,
    addr: Option<IpAddr>,
    /// Admitted amounts above a counter's ceiling, fed in as this session keeps syncing.
    parked: IdMap<u64>,
    /// A number for this session that never changes (`serial` does at every sync); another
    /// session gets it once this one is forgotten.
    sid: Sid,
    /// The counters this limiter named lately, with when each leaves (ns), if it asks for
    /// answers by interest.
    interest: IdMap<u64>,
    /// (leaves at, counter) in the order they were named: the front leaves first. A counter
    /// named again has a later record; the earlier one is then stale.
    expiry: VecDeque<(u64, QuotaId)>,
}

/// What one root answers: a [`SyncResponse`] whose quotas are shared with the root's table
/// rather than copied, so building it under the root's lock costs one reference count per
/// quota and the JSON is written after the lock is released. Serialises exactly as the
/// [`SyncResponse`] it converts into.
#[derive(Debug, Clone)]
pub struct SyncAnswer {
    /// Protocol version.
    pub v: u32,
    /// Random id of this root process.
    pub root_instance: u64,
    /// Highest batch `seq` of this limiter the root has applied.
    pub acked_seq: u64,
    /// The root's counter version now.
    pub version: u64,
    /// Counters changed since `since`: `[id, fill, demand]`, in no particular order, and
    /// an id may appear twice (with the same values) until [`SyncAnswer::tidy`] runs:
    /// that work is left for after the root's lock.
    pub counters: Vec<(QuotaId, u64, u64)>,
    /// Quotas and tombstones above the limiter's epoch, in epoch order.
    pub quotas: Vec<Arc<QuotaUpdate>>,
    /// The epoch the limiter holds once it applied `quotas`.
    pub epoch: Epoch,
    /// More quotas are waiting.
    pub more: bool,
    /// The highest epoch this root applied.
    pub root_epoch: Epoch,
    /// The shard this root aggregates.
    pub shard: Option<Shard>,
}

impl SyncAnswer {
    /// Sorts the counters by id and drops repeated ids (v2 encodes each id as the
    /// difference to the previous one).
    pub fn tidy(&mut self) {
        self.counters.sort_unstable_by_key(|c| c.0);
        self.counters.dedup_by_key(|c| c.0);
    }

    /// One answer from the answers of a root's stripes, in stripe order (the lead first),
    /// to a sync that read `version` ([`RootState::version`]) before it went to the first
    /// stripe: every change up to it is in the stripes' answers or was in an earlier one,
    /// where a version read afterwards could name a change a stripe logged after the sync
    /// had been there. `None` for no answers.
    pub fn join(parts: Vec<SyncAnswer>, version: u64) -> Option<SyncAnswer> {
        let mut parts = parts.into_iter();
        let mut lead = parts.next()?;
        let mut rest = parts.peekable();
        if rest.peek().is_none() {
            return Some(lead);
        }
        lead.version = version;
        for p in rest {
            lead.acked_seq = lead.acked_seq.min(p.acked_seq);
            lead.counters.extend(p.counters);
        }
        Some(lead)
    }

    /// The owned wire message, tidied.
    pub fn into_response(mut self) -> SyncResponse {
        self.tidy();
        SyncResponse {
            v: self.v,
            root_instance: self.root_instance,
            acked_seq: self.acked_seq,
            version: self.version,
            counters: self.counters,
            quotas: self.quotas.into_iter().map(|q| (*q).clone()).collect(),
            epoch: self.epoch,
            more: self.more,
            root_epoch: Some(self.root_epoch),
            shard: self.shard,
        }
    }
}

struct QuotaList<'a>(&'a [Arc<QuotaUpdate>]);

impl Serialize for QuotaList<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for q in self.0 {
            seq.serialize_element(&**q)?;
        }
        seq.end()
    }
}

impl Serialize for SyncAnswer {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Field for field what `#[derive(Serialize)]` writes for `SyncResponse`.
        let mut st = s.serialize_struct("SyncResponse", 9 + usize::from(self.shard.is_some()))?;
        st.serialize_field("v", &self.v)?;
        st.serialize_field("root_instance", &self.root_instance)?;
        st.serialize_field("acked_seq", &self.acked_seq)?;
        st.serialize_field("version", &self.version)?;
        st.serialize_field("counters", &self.counters)?;
        st.serialize_field("quotas", &QuotaList(&self.quotas))?;
        st.serialize_field("epoch", &self.epoch)?;
        st.serialize_field("more", &self.more)?;
        st.serialize_field("root_epoch", &self.root_epoch)?;
        if let Some(shard) = &self.shard {
            st.serialize_field("shard", &shard.to_string())?;
        }
        st.end()
    }
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
    /// `(index, count)` when this state is one stripe of a root: it holds the counters of
    /// [`stripe_of`] `index`, and only stripe 0 (the lead) keeps the quota pages.
    stripe: Option<(u32, u32)>,
    limiters: HashMap<Box<str>, Session>,
    /// Every session by recency, oldest first: who goes when room is needed.
    recency: BTreeMap<Recency, Box<str>>,
    /// Each peer address's sessions by recency.
    by_addr: HashMap<IpAddr, BTreeSet<Recency>>,
    next_serial: u64,
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
            stripe: None,
            limiters: HashMap::new(),
            recency: BTreeMap::new(),
            by_addr: HashMap::new(),
            next_serial: 0,
            parked: 0,
            held: IdMap::default(),
            highest_id: 0,
            held_swept: 0,
            interest: 0,
            sweep_left: 0,
            watchers: IdMap::default(),
            inboxes: Vec::new(),
            free_sids: Vec::new(),
            stats: RootStats::default(),
        }
    }

    /// One root's state split into `count` stripes (1 to [`MAX_STRIPES`]) by a hash of the
    /// counter's id, for a server that puts each behind a lock of its own so that syncs
    /// apply on several cores at once: each sync goes to every stripe in turn, and each
    /// stripe applies the deltas, hints and interest of its own counters. The stripes
    /// share the instance id and the version counter; stripe 0, the lead, also keeps every
    /// quota and answers the quota pages, the others keep only their counters' quotas.
    /// Each stripe holds every session, with `1/count` of the parked and interest budgets.
    /// Join the stripes' answers with [`SyncAnswer::join`]; apply quotas to the lead last
    /// (see [`RootState::apply_quota_arcs`]).
    pub fn striped(config: RootConfig, count: u32) -> Vec<RootState> {
        let count = count.clamp(1, MAX_STRIPES);
        if count == 1 {
            return vec![RootState::new(config)];
        }
        let share = |n: usize| n.div_ceil(count as usize);
        let mut part = config.clone();
        part.max_parked = share(config.max_parked);
        part.max_held = share(config.max_held);
        part.max_parked_per_limiter = share(config.max_parked_per_limiter);
        part.max_interest = share(config.max_interest);
        part.max_interest_per_limiter = share(config.max_interest_per_limiter);
        let lead = RootState::new(part.clone());
        (0..count)
            .map(|index| RootState {
                instance: lead.instance,
                version: Arc::clone(&lead.version),
                stripe: Some((index, count)),
                ..RootState::new(part.clone())
            })
            .collect()
    }

    /// The version of the latest change (of every stripe): read before a sync goes to the
    /// stripes, it is the version to answer (see [`SyncAnswer::join`]).
    pub fn version(&self) -> u64 {
        self.version.load(Relaxed)
    }

    /// Versions are taken and their changes logged under the one lock of their stripe: a
    /// version read before a sync visits a stripe therefore names only changes that the
    /// stripe's log holds by the time the sync gets there.
    fn next_version(&mut self) -> u64 {
        self.version.fetch_add(1, Relaxed) + 1
    }

    /// Whether this state holds the counter of `id` as a stripe (always when not striped).
    fn mine(&self, id: QuotaId) -> bool {
        in_stripe(self.stripe, id)
    }

    /// Whether this state keeps every quota and answers the quota pages.
    fn is_lead(&self) -> bool {
        self.stripe.map_or(true, |(index, _)| index == 0)
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
        let lead = self.is_lead();
        for u in updates {
            self.epoch = self.epoch.max(u.epoch);
            self.highest_id = self.highest_id.max(u.id);
            if !lead && !self.mine(u.id) {
                continue;
            }
            if let Some(old) = self.quotas.get(&u.id) {
                if old.update.epoch >= u.epoch {
                    continue;
                }
                self.by_epoch.remove(&old.update.epoch);
                if let Some(c) = self.counters.get_mut(old.counter) {
                    c.bucket.advance(now, old.limits.limit);
                }
                if u.reset_epoch > old.reset_epoch {
                    self.reset(u.id);
                }
            }
            if lead {
                self.by_epoch.insert(u.epoch, u.id);
            }
            if u.deleted {
                if let Some(c) = self.remove_counter(u.id) {
                    self.kill_change(c.log_at, c.version);
                }
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
                update: u,
            };
            self.quotas.insert(id, entry);
            if !deleted && counter != NO_COUNTER {
                // The change log holds the limit it drains at: record the new one.
                self.bump(id);
            }
            if let Some(h) = self.held.remove(&id) {
                self.release_held(id, h, (!deleted).then_some((limits, reset_epoch)), now);
            }
        }
    }

    /// Empties a counter (a cluster-wide reset): its fill, demand, rate and every claim
    /// parked for it. Deltas and hints counted before the reset are dropped as they come
    /// (`sync_from`).
    fn reset(&mut self, id: QuotaId) {
        if let Some(c) = self.remove_counter(id) {
            self.kill_change(c.log_at, c.version);
        }
        let mut dropped = 0;
        for s in self.limiters.values_mut() {
            if s.parked.remove(&id).is_some() {
                dropped += 1;
            }
        }
        self.parked -= dropped;
        // Limiters empty their own copy when they apply the same quota version. Counted by
        // the stripe that holds the counter.
        if self.mine(id) {
            self.stats.resets += 1;
        }
    }

    /// The epoch of quota `id`'s last reset (0 if none).
    fn reset_epoch(&self, id: QuotaId) -> Epoch {
        self.quotas.get(&id).map_or(0, |q| q.reset_epoch)
    }

    /// Whether this root aggregates the counter of `id` (see [`RootConfig::shard`]).
    fn holds(&self, id: QuotaId) -> bool {
        self.config.shard.map_or(true, |s| s.holds(id))
    }

    fn live_limit(&self, id: QuotaId) -> Option<u64> {
        self.quotas.get(&id).filter(|q| !q.deleted).map(|q| q.limits.limit)
    }

    /// The highest fill a claim may lift a counter to: `high_burst` plus
    /// [`RootConfig::claim_slack_ns`] of the limit. See "What a sync may claim".
    fn ceiling(&self, id: QuotaId) -> Option<u64> {
        let q = self.quotas.get(&id).filter(|q| !q.deleted)?;
        Some(self.ceiling_of(&q.limits))
    }

    fn ceiling_of(&self, l: &Limits) -> u64 {
        l.high_burst.saturating_add(limit_over(l.limit, self.config.claim_slack_ns))
    }

    fn bump(&mut self, id: QuotaId) {
        self.bump_at(id, self.live_limit(id).unwrap_or(0));
    }

    /// [`bump`](Self::bump) for a caller that has the quota's limit at hand.
    fn bump_at(&mut self, id: QuotaId, limit: u64) {
        let v = self.next_version();
        let Some(c) = self.counters.get_mut(place_of(&self.quotas, id)) else { return };
        let old = (c.version != 0).then_some((c.log_at, c.version));
        c.version = v;
        c.limit = limit;
        let at = self.changes.push(v, Change { id, bucket: c.bucket, limit, demand: c.demand });
        c.log_at = at;
        self.notify(id, v, at);
        if let Some((at, old_v)) = old {
            self.kill_change(at, old_v);
        }
        if let Some(stale) = self.changes.stale_front() {
            // Same content, a new version: classic answers send them once more.
            for (at, old_v, change) in stale {
                let v = self.next_version();
                let new_at = self.changes.push(v, change);
                if let Some(c) = self.counter_mut(change.id) {
                    c.version = v;
                    c.log_at = new_at;
                }
                // Its watchers' records name the old place and version, which no longer
                // match anything: they get the new one.
                self.notify(change.id, v, new_at);
                self.kill_change(at, old_v);
            }
        }
    }

    /// Counter `id`, if it has one.
    #[inline]
    fn counter_of(&self, id: QuotaId) -> Option<&RootCounter> {
        self.counters.get(place_of(&self.quotas, id))
    }

    #[inline]
    fn counter_mut(&mut self, id: QuotaId) -> Option<&mut RootCounter> {
        self.counters.get_mut(place_of(&self.quotas, id))
    }

    /// Counter `id`, a new empty one if it has none; `None` for an id with no quota entry
    /// (a counter lives only beside its quota).
    #[inline]
    fn counter_or_default(&mut self, id: QuotaId) -> Option<&mut RootCounter> {
        let q = self.quotas.get_mut(&id)?;
        if q.counter == NO_COUNTER {
            q.counter = self.counters.insert(id);
        }
        self.counters.get_mut(q.counter)
    }

    fn remove_counter(&mut self, id: QuotaId) -> Option<RootCounter> {
        let q = self.quotas.get_mut(&id)?;
        let place = std::mem::replace(&mut q.counter, NO_COUNTER);
        self.counters.remove(place).map(|(_, c)| c)
    }

    /// Removes the counter at slab place `p`, if one is there.
    fn remove_counter_at(&mut self, p: usize) -> Option<RootCounter> {
        let (id, c) = self.counters.remove(u32::try_from(p).ok()?)?;
        if let Some(q) = self.quotas.get_mut(&id) {
            q.counter = NO_COUNTER;
        }
        Some(c)
    }

    /// Brings the slots of these counters into the cache ahead of the work on them: the
    /// loads of this loop do not depend on one another, so the CPU has many misses in flight
    /// at once, where the work itself waits for each in turn.
    ///
    /// Callers warm runs of at most [`WARM_RUN`] ids, each just before working on it.
    fn warm(&self, ids: impl Iterator<Item = QuotaId> + Clone) {
        let (mut touched, mut fresh) = (0u64, 0);
        for id in ids.clone() {
            let q = self.quotas.get(&id);
            touched ^= q.map_or(0, |q| q.reset_epoch);
            let place = q.map_or(NO_COUNTER, |q| q.counter);
            fresh += usize::from(q.is_some() && place == NO_COUNTER);
            touched ^= self.counters.touch(place, 0);
            touched ^= self.watchers.get(&id).map_or(0, |w| w.len() as u64);
        }
        // The free places the new ones will take.
        touched ^= self.counters.touch(NO_COUNTER, fresh);
        // Then the change-log entries they replace (their counters are in the cache now).
        for id in ids {
            if let Some(c) = self.counter_of(id) {
                touched ^= self.changes.get(c.log_at, c.version).map_or(0, |e| e.limit);
            }
        }
        std::hint::black_box(touched);
    }

    /// Tells the sessions watching counter `id` that it changed (version `v`, at `at`).
    fn notify(&mut self, id: QuotaId, v: u64, at: usize) {
        if let Some(ws) = self.watchers.get(&id) {
            for &sid in ws {
                if let Some(inbox) = self.inboxes.get_mut(sid as usize) {
                    inbox.push(id, v, at);
                }
            }
        }
    }

    /// Tombstones a change-log entry, compacting its chunk when it is half tombstones.
    fn kill_change(&mut self, at: usize, v: u64) {
        if self.changes.kill(at, v) {
            let (quotas, counters) = (&self.quotas, &mut self.counters);
            self.changes.compact(at, |id, new_at| {
                if let Some(c) = counters.get_mut(place_of(quotas, id)) {
                    c.log_at = new_at;
                }
            });
        }
    }

    /// Lifts counter `id` by up to `amount`, never past its ceiling; returns what did not
    /// fit, or `None` for a quota this root does not know.
    fn fill_up(&mut self, id: QuotaId, amount: u64, now: u64) -> Option<u64> {
        let (limit, ceiling) = (self.live_limit(id)?, self.ceiling(id)?);
        let c = self.counter_or_default(id)?;
        c.limit = limit;
        c.bucket.advance(now, limit);
        let room = ceiling.saturating_sub(c.bucket.fill);
        let taken = amount.min(room);
        c.bucket.add(taken);
        if taken > 0 {
            self.bump(id);
        }
        Some(amount - taken)
    }

    /// Applies one delta entry to counter `id`, whose live quota has `limits` (`None`: no
    /// live quota of that id); returns the admitted amount the counter had no room for.
    fn add(
        &mut self,
        id: QuotaId,
        limits: Option<Limits>,
        amount: u64,
        rejected: u64,
        now: u64,
    ) -> u64 {
        if !self.holds(id) {
            self.stats.deltas_foreign += 1;
            return 0;
        }
        // One look at the quota (the caller's) and one at the counter per delta: this runs
        // for every delta of every limiter, most of a busy root's work.
        let Some(l) = limits else {
            self.stats.deltas_unknown += 1;
            return 0;
        };
        let ceiling = self.ceiling_of(&l);
        // The most one delta entry may add to the demand meter.
        let cap = l.high_burst.saturating_add(l.limit).saturating_mul(DEMAND_CAP_FACTOR);
        let attempted = amount.saturating_add(rejected);
        if attempted > cap {
            self.stats.rejected_capped += 1;
        }
        let rate_tau = self.config.rate_tau_ns;
        let Some(c) = self.counter_or_default(id) else {
            // Not reached: `limits` came from this id's entry.
            self.stats.deltas_unknown += 1;
            return 0;
        };
        c.limit = l.limit;
        c.bucket.advance(now, l.limit);
        let taken = amount.min(ceiling.saturating_sub(c.bucket.fill));
        c.bucket.add(taken);
        meter(&mut c.rate, &mut c.rate_at, amount, now, rate_tau);
        c.demand.add(attempted.min(cap), now);
        self.stats.deltas_applied += 1;
        // A delta changes the demand even when the fill stayed at the ceiling.
        self.bump_at(id, l.limit);
        amount - taken
    }

    fn hint(&mut self, id: QuotaId, fill: u64, now: u64) {
        let (Some(limit), Some(ceiling)) = (self.live_limit(id), self.ceiling(id)) else { return };
        if fill > ceiling {
            self.stats.hints_capped += 1;
        }
        let fill = fill.min(ceiling);
        let Some(c) = self.counter_or_default(id) else { return };
        c.limit = limit;
        c.bucket.advance(now, limit);
        if fill > c.bucket.fill {
            c.bucket.fill = fill;
            c.bucket.carry = 0;
            self.stats.hints_applied += 1;
            self.bump(id);
        }
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
            .fold(req.hints.len(), usize::saturating_add);
        if entries > self.config.max_entries {
            return Err(SyncError::TooLarge(entries, self.config.max_entries));
        }
        let mut session = match self.limiters.remove_entry(req.limiter.as_str()) {
            Some((name, s)) => {
                if let Err(e) = self.check_seq(req, &s, now) {
                    self.limiters.insert(name, s);
                    return Err(e);
                }
                self.unindex(&s);
                (name, s)
            }
            None => {
                self.make_room(peer);
                if self.config.max_limiters == 0 {
                    return Err(SyncError::TooManyLimiters(0));
                }
                let s = Session { addr: peer, sid: self.new_sid(), ..Session::default() };
                self.stats.sessions_created += 1;
                (Box::from(req.limiter.as_str()), s)
            }
        };
        let s = &mut session.1;
        self.feed_parked(s, now);
        // Batches up to here were applied, and named, by an earlier sync.
        let applied_before = s.acked;

        let stripe = self.stripe;
        let mut acked = s.acked;
        let mut batches: Vec<_> = req.batches.iter().collect();
        batches.sort_by_key(|b| b.seq);
        for b in batches {
            if b.seq <= acked {
                self.stats.duplicate_batches += 1;
                continue;
            }
            for run in b.deltas.chunks(WARM_RUN) {
                self.warm(run.iter().map(|d| d.0).filter(|&id| in_stripe(stripe, id)));
                for &(id, amount, rejected) in run {
                    if !in_stripe(stripe, id) {
                        // Another stripe's, and counted there.
                        continue;
                    }
                    // One lookup of the quota for both the reset check and the delta (a probe of
                    // a million-entry map each; the second was 1.5 % of a busy root's samples).
                    let quota = self.quotas.get(&id).map(|q| (q.limits, q.reset_epoch, q.deleted));
                    if quota.is_none() && id > self.highest_id && self.holds(id) {
                        self.hold(id, amount, rejected, b.epoch, now);
                        continue;
                    }
                    if b.epoch.is_some_and(|e| e < quota.map_or(0, |q| q.1)) {
                        self.stats.dropped_before_reset += 1;
                        continue;
                    }
                    let limits = quota.filter(|q| !q.2).map(|q| q.0);
                    let excess = self.add(id, limits, amount, rejected, now);
                    if excess > 0 {
                        self.park(s, id, excess);
                    }
                }
            }
            acked = b.seq;
        }
        let hints_epoch = req.seen_epoch.unwrap_or(req.epoch);
        for &(id, fill) in &req.hints {
            if !in_stripe(stripe, id) {
                continue;
            }
            if !self.holds(id) {
                self.stats.deltas_foreign += 1;
                continue;
            }
            if hints_epoch < self.reset_epoch(id) {
                self.stats.dropped_before_reset += 1;
                continue;
            }
            self.hint(id, fill, now);
        }
        s.acked = acked;
        s.last_seen = now;
        s.serial = self.next_serial;
        self.next_serial += 1;
        if peer.is_some() {
            s.addr = peer;
        }
        let (name, mut s) = session;
        let mut left = IdSet::default();
        let interest = if req.interest {
            self.note_interest(&mut s, req, applied_before, now, &mut left)
        } else {
            None
        };

        if !req.interest && !s.interest.is_empty() {
            // It stopped asking by interest (a reconfigured limiter): free what it named.
            self.drop_interest(&mut s);
        }
        // What this limiter admitted beyond a ceiling is parked, not lost: it sees it in the
        // fills it gets back, or it would admit that much again (others do not see it).
        let own_parked = (!s.parked.is_empty()).then(|| s.parked.clone());
        self.index(name.clone(), &s);
        self.limiters.insert(name.clone(), s);

        let since = if req.root_instance == Some(self.instance) {
            req.since
        } else {
            self.stats.first_contacts += 1;
            0
        };
        let parked_of = |id: QuotaId| own_parked.as_ref().and_then(|p| p.get(&id)).copied();
        let counters = match interest {
            Some(fresh) => {
                self.stats.interest_answers += 1;
                let s = self.limiters.get(&*name).expect("the session was just inserted");
                let inbox = self.inboxes.get_mut(s.sid as usize).map(|i| {
                    (std::mem::take(&mut i.changes), std::mem::replace(&mut i.overflow, false))
                });
                let (mut changed, overflow) = inbox.unwrap_or_default();
                let (quotas, counters) = (&self.quotas, &self.counters);
                // From the counter: for what the log does not hold as recorded.
                let current = |id: QuotaId| {
                    let c = counters.get(place_of(quotas, id))?;
                    Some((id, c.bucket.fill_at(now, c.limit), c.demand.rate(now) as u64))
                };
                let mut out: Vec<(QuotaId, u64, u64)> = if since == 0 || overflow {
                    // Its view is from another root, or none, or too much changed to list:
                    // everything it names.
                    s.interest.keys().filter_map(|&id| current(id)).collect()
                } else {
                    let mut out = Vec::with_capacity(changed.len() + fresh.len());
                    // The entries, all at once first (see `warm`).
                    let mut touched = 0u64;
                    for &(_, v, at) in &changed {
                        touched ^= self.changes.get(at, v).map_or(0, |e| e.limit);
                    }
                    std::hint::black_box(touched);
                    for &(id, v, at) in &changed {
                        // Changes queued before a counter left the interest (this sync) stay
                        // out. A small set: a lookup in the session's interest, thousands of
                        // ids, was a cache miss for every record.
                        if left.contains(&id) {
                            continue;
                        }
                        match self.changes.find(at, v) {
                            Some(Some(c)) => out.push((
                                id,
                                c.bucket.fill_at(now, c.limit),
                                c.demand.rate(now) as u64,
                            )),
                            // Tombstoned in place: a later change of it is further on (a
                            // counter that changed twice since the last answer), or it is
                            // gone. No lookup of the counter (a cache miss per record).
                            Some(None) => {}
                            None => {
                                let c = counters.get(place_of(quotas, id));
                                if c.is_some_and(|c| c.version == v) {
                                    // Moved by a compaction: still its latest change.
                                    out.extend(current(id));
                                }
                            }
                        }
                    }
                    out.extend(fresh.into_iter().filter_map(current));
                    out
                };
                if let Some(p) = &own_parked {
                    for c in &mut out {
                        if let Some(&parked) = p.get(&c.0) {
                            c.1 = c.1.saturating_add(parked);
                        }
                    }
                }
                // The list goes back to the inbox, emptied: grown anew every interval it
                // cost a dozen reallocations and copies of up to tens of kilobytes, on fresh
                // pages, under the lock. Not one far larger than the inbox may hold now.
                let sid = s.sid;
                if let Some(i) = self.inboxes.get_mut(sid as usize) {
                    if i.changes.is_empty() && changed.capacity() <= i.cap.saturating_mul(2) {
                        changed.clear();
                        i.changes = changed;
                    }
                }
                // Sorted and deduplicated by `SyncAnswer::tidy`, after the lock.
                out
            }
            None => self
                .changes
                .since(since)
                .map(|c| {
                    let mut fill = c.bucket.fill_at(now, c.limit);
                    if let Some(p) = parked_of(c.id) {
                        fill = fill.saturating_add(p);
                    }
                    (c.id, fill, c.demand.rate(now) as u64)
                })
                .collect(),
        };

        let mut quotas = Vec::new();
        let mut more = false;
        let mut epoch = self.epoch;
        // The other stripes keep no pages (`by_epoch` is empty there).
        for (&e, id) in self.by_epoch.range(req.epoch.saturating_add(1)..) {
            if quotas.len() == self.config.page_size {
                more = true;
                break;
            }
            quotas.push(Arc::clone(&self.quotas[id].update));
            epoch = e;
        }
        if !more {
            epoch = self.epoch.max(req.epoch);
        }
        self.stats.syncs += 1;
        self.stats.quotas_sent += quotas.len() as u64;
        Ok(SyncAnswer {
            v: PROTOCOL_VERSION,
            root_instance: self.instance,
            acked_seq: acked,
            version: self.version.load(Relaxed),
            counters,
            quotas,
            epoch,
            more,
            root_epoch: self.epoch,
            shard: self.config.shard,
        })
    }

    /// Adds the counters `req` names (its batches' deltas, hints and `watch`, those this root
    /// holds) to the session's interest until `now` + the interest time. Returns the ones
    /// new to it, which its answer carries even if unchanged; `None` when the session's or
    /// the root's interest is full, and the answer must carry every changed counter. Adds
    /// the ids that left the interest to `left`: since the session's last answer, only this
    /// call takes ids out, so these are the only ones its inbox may hold and must not.
    fn note_interest(
        &mut self,
        s: &mut Session,
        req: &SyncRequest,
        applied_before: u64,
        now: u64,
        left: &mut IdSet,
    ) -> Option<IdSet> {
        let stripe = self.stripe;
        let named = req
            .batches
            .iter()
            // A batch resent because its answer was lost was named when it was applied:
            // naming it again would make a slow root slower (a limiter resends up to
            // dozens of batches when answers time out).
            .filter(|b| b.seq > applied_before)
            .flat_map(|b| b.deltas.iter().map(|d| d.0))
            .chain(req.hints.iter().map(|h| h.0))
            .chain(req.watch.iter().copied())
            .filter(move |&id| in_stripe(stripe, id));
        // What left the interest: named last more than the interest time ago. Their slots
        // and the session's map slots of every named id, all at once first (see `warm`):
        // a session's interest is thousands of ids, rarely in the cache.
        let leaving = s.expiry.iter().take_while(|e| e.0 <= now);
        let mut touched = 0u64;
        for &(_, id) in leaving {
            touched ^= self.watchers.get(&id).map_or(0, |w| w.len() as u64);
        }
        for id in named.clone() {
            touched ^= s.interest.get(&id).copied().unwrap_or(0);
        }
        std::hint::black_box(touched);
        while let Some(&(until, id)) = s.expiry.front() {
            if until > now {
                break;
            }
            s.expiry.pop_front();
            if s.interest.get(&id) == Some(&until) {
                s.interest.remove(&id);
                self.interest -= 1;
                self.unwatch(id, s.sid);
                left.insert(id);
            }
        }
        let until = now.saturating_add(self.config.interest_ttl_ns.max(1));
        let mut fresh = IdSet::default();
        let mut full = false;
        for id in named {
            if !self.holds(id) || !self.quotas.get(&id).is_some_and(|q| !q.deleted) {
                continue;
            }
            if let Some(u) = s.interest.get_mut(&id) {
                // Renewed once past half its time, so an id named every round leaves at most
                // two records in `expiry`: it stays for between half the interest time and
                // the whole of it after it was last named.
                if *u < now.saturating_add(self.config.interest_ttl_ns / 2) {
                    *u = until;
                    s.expiry.push_back((until, id));
                }
                continue;
            }
            if s.interest.len() >= self.config.max_interest_per_limiter
                || self.interest >= self.config.max_interest
            {
                full = true;
                continue;
            }
            s.interest.insert(id, until);
            s.expiry.push_back((until, id));
            self.interest += 1;
            self.watchers.entry(id).or_default().push(s.sid);
            fresh.insert(id);
        }
        let inbox = &mut self.inboxes[s.sid as usize];
        inbox.cap = s.interest.len().saturating_mul(2).saturating_add(INBOX_SLACK);
        if full {
            self.stats.interest_full += 1;
            return None;
        }
        Some(fresh)
    }

    /// Takes session `sid` off counter `id`'s watchers.
    fn unwatch(&mut self, id: QuotaId, sid: Sid) {
        if let Some(ws) = self.watchers.get_mut(&id) {
            ws.retain(|w| *w != sid);
            if ws.is_empty() {
                self.watchers.remove(&id);
            }
        }
    }

    /// Empties a session's interest (forgotten, or no longer asking by interest).
    fn drop_interest(&mut self, s: &mut Session) {
        self.interest -= s.interest.len();
        let ids: Vec<QuotaId> = s.interest.keys().copied().collect();
        for id in ids {
            self.unwatch(id, s.sid);
        }
        s.interest = IdMap::default();
        s.expiry = VecDeque::new();
        if let Some(i) = self.inboxes.get_mut(s.sid as usize) {
            *i = Inbox::default();
        }
    }

    /// Refuses a batch `seq` further ahead of a known session's acknowledged one than that
    /// limiter could have counted since its last sync. A session that never had a batch
    /// applied takes any `seq`: a limiter keeps its numbering across nginx reloads, and this
    /// root may be meeting it for the first time after its own restart.
    fn check_seq(&self, req: &SyncRequest, s: &Session, now: u64) -> Result<(), SyncError> {
        if s.acked == 0 {
            return Ok(());
        }
        let Some(seq) = req.batches.iter().map(|b| b.seq).max() else { return Ok(()) };
        let elapsed = now.saturating_sub(s.last_seen);
        let max_ahead = self
            .config
            .seq_ahead_slack
            .saturating_add(elapsed / self.config.seq_min_interval_ns.max(1));
        if seq - s.acked.min(seq) > max_ahead {
            return Err(SyncError::SeqTooFarAhead { seq, acked: s.acked, max_ahead });
        }
        Ok(())
    }

    /// Parks what a claim could not put into a counter with the session that claimed it.
    /// Holds a delta of quota `id`, not read yet, until it is ([`RootStats::deltas_held`]).
    fn hold(&mut self, id: QuotaId, amount: u64, rejected: u64, epoch: Option<Epoch>, now: u64) {
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
                let excess = self.add(id, Some(limits), h.admitted, h.rejected, now);
                if excess > 0 {
                    self.stats.claims_dropped += 1;
                }
            }
            _ => self.stats.deltas_unknown += h.entries,
        }
    }

    fn park(&mut self, s: &mut Session, id: QuotaId, excess: u64) {
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
    fn feed_parked(&mut self, s: &mut Session, now: u64) {
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

    fn index(&mut self, name: Box<str>, s: &Session) {
        let key = (s.last_seen, s.serial);
        self.recency.insert(key, name);
        if let Some(a) = s.addr {
            self.by_addr.entry(a).or_default().insert(key);
        }
    }

    fn unindex(&mut self, s: &Session) {
        let key = (s.last_seen, s.serial);
        self.recency.remove(&key);
        if let Some(a) = s.addr {
            if let Some(set) = self.by_addr.get_mut(&a) {
                set.remove(&key);
                if set.is_empty() {
                    self.by_addr.remove(&a);
                }
            }
        }
    }

    fn forget(&mut self, key: Recency) {
        let Some(name) = self.recency.get(&key).cloned() else { return };
        if let Some(mut s) = self.limiters.remove(&name) {
            self.unindex(&s);
            self.parked -= s.parked.len();
            // No counter names it any more: its number may go to a new session.
            self.drop_interest(&mut s);
            self.free_sids.push(s.sid);
        }
    }

    /// A number for a new session, with an empty inbox.
    fn new_sid(&mut self) -> Sid {
        if let Some(sid) = self.free_sids.pop() {
            return sid;
        }
        self.inboxes.push(Inbox::default());
        // Below `max_limiters` sessions are held at once (`make_room` runs first), and a
        // `u32` limit far above any table size a root is configured with.
        Sid::try_from(self.inboxes.len() - 1).expect("fewer than 2^32 sessions at once")
    }

    /// Makes room for one more session from `peer`: the least recently seen session of that
    /// address goes if the address is at its budget, the least recently seen of all if the
    /// table is full. A live limiter syncs every interval, so what goes is whoever has been
    /// quiet longest; forgetting a live one costs little (its next batches count as a first
    /// contact: nothing is lost, a batch resent after a lost answer may count twice).
    fn make_room(&mut self, peer: Option<IpAddr>) {
        if let Some(a) = peer {
            while self.by_addr.get(&a).is_some_and(|s| s.len() >= self.config.max_limiters_per_addr)
            {
                let Some(&oldest) = self.by_addr.get(&a).and_then(|s| s.first()) else { break };
                self.forget(oldest);
                self.stats.limiters_evicted += 1;
            }
        }
        while self.limiters.len() >= self.config.max_limiters {
            let Some((&oldest, _)) = self.recency.first_key_value() else { break };
            self.forget(oldest);
            self.stats.limiters_evicted += 1;
        }
    }

    /// The live view of a quota's counter.
    pub fn counter(&self, id: QuotaId, now: u64) -> Option<CounterView> {
        let q = self.quotas.get(&id).filter(|q| !q.deleted)?;
        let (fill, rate) = match self.counters.get(q.counter) {
            Some(c) => (
                c.bucket.fill_at(now, q.limits.limit),
                meter_at(c.rate, c.rate_at, now, self.config.rate_tau_ns),
            ),
            None => (0, 0.0),
        };
        Some(CounterView {
            fill: milli_to_units(fill),
            rate: rate / 1000.0,
            drop_probability: crate::decision::drop_probability(
                fill as f64,
                q.limits.low_burst,
                q.limits.high_burst,
            ),
        })
    }

    /// Drops drained counters without recent demand, and forgotten limiters; call it now and then (e.g. every few
    /// seconds). Limiters drain their copies at the same rate, so nothing needs telling.
    pub fn sweep(&mut self, now: u64) {
        for p in 0..self.counters.places() {
            if self.counters.at(p).is_some_and(|(_, c)| spent(c, c.limit, now)) {
                if let Some(c) = self.remove_counter_at(p) {
                    self.kill_change(c.log_at, c.version);
                }
            }
        }
        self.sweep_left = 0;
        self.forget_idle_limiters(now);
    }

    /// [`sweep`](Self::sweep) in steps, for a server that must not stop answering syncs
    /// while a million counters are looked at (tens of milliseconds under its lock): each
    /// call looks at up to `max` counters; a pass starts with a list of every counter's id
    /// and ends, forgetting idle limiters, when the list is done. `true` when a pass ended.
    pub fn sweep_step(&mut self, now: u64, max: usize) -> bool {
        if self.sweep_left == 0 {
            self.sweep_left = self.counters.places();
        }
        let take = max.max(1).min(self.sweep_left);
        let lo = self.sweep_left - take;
        let mut dead = Vec::with_capacity(WARM_RUN);
        // By place, from the slab's end: its counters are read front to back within a run,
        // which the CPU prefetches. A place freed and reused since the pass began holds
        // another live counter, which may be looked at as well as the one it replaced.
        for run in (lo..self.sweep_left).step_by(WARM_RUN) {
            dead.clear();
            dead.extend((run..(run + WARM_RUN).min(self.sweep_left)).filter_map(|p| {
                let (id, c) = self.counters.at(p)?;
                spent(c, c.limit, now).then_some((p, id, c.log_at, c.version))
            }));
            // Their change-log and quota entries: the log is in version order and the
            // quotas by hash, the slab is neither, so each is a random place; all loaded at
            // once first (see `warm`).
            let mut touched = 0u64;
            for &(_, id, at, v) in &dead {
                touched ^= self.changes.get(at, v).map_or(0, |e| e.limit);
                touched ^= self.quotas.get(&id).map_or(0, |q| u64::from(q.counter));
            }
            std::hint::black_box(touched);
            for &(p, ..) in &dead {
                if let Some(c) = self.remove_counter_at(p) {
                    self.kill_change(c.log_at, c.version);
                }
            }
        }
        self.sweep_left = lo;
        if lo > 0 {
            return false;
        }
        self.forget_idle_limiters(now);
        true
    }

    fn forget_idle_limiters(&mut self, now: u64) {
        let idle = self.config.limiter_idle_ns;
        while let Some((&key, _)) = self.recency.first_key_value() {
            if now.saturating_sub(key.0) < idle {
                break;
            }
            self.forget(key);
        }
    }
}

mod counters;
#[cfg(test)]
mod tests;
