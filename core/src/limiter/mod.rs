//! The limiter: every quota and the cluster-wide counters in one memory block, decisions
//! without any network call.
//!
//! # The estimate between syncs
//!
//! A counter keeps `base`, the largest fill any root reported (roots' values merge by
//! **max**), the time `at` it was stored, `local`, what was accounted here since the last
//! sync round took it, `inflight`, what the current round took and no root has reported back
//! yet, and `inflow`, what the rest of the cluster is estimated to add per second. The fill a
//! decision uses is the article's extrapolation, with the bucket's floor at 0 kept:
//!
//! ```text
//! B      = max(0, base - D(at, t0))
//! F(now) = max(0, B + local + inflight - D(t0, now))
//! D(a, b) = the drain over [a, b]: limit - inflow per second up to at + H, limit after
//! ```
//!
//! with `H` the horizon (one sync interval by default) and `t0` the time this limiter's own
//! counts started from an empty bucket (or `at`, when they did not since): the bucket
//! drains at `limit`, never below 0, so a bucket that emptied while nobody sent anything
//! gives the next requests no credit for the time it was empty; and for one interval after
//! a sync the others are assumed to keep adding `inflow`. [`Estimator`] says where `inflow` comes from: the article's static
//! `correction_ratio · limit` for the whole cluster less this limiter's own last-interval
//! rate, or the rate measured between two syncs (the article's "dynamic ratio"). A counter
//! that no root reported as changed in the last round is cold: nobody adds to it, `inflow`
//! is 0 and it drains at once. While no root answers at all, nothing is extrapolated: the
//! limiter limits on what it knows locally (fail-open: no decision waits for a root).
//!
//! # One limiter, many handles
//!
//! All state lives in a [`Block`] (see [`crate::zone`]). [`LimiterBuilder::build`] makes a
//! private heap block; [`LimiterBuilder::open`] attaches a handle to a block that other
//! threads or processes use too (an nginx shared-memory zone: every worker holds a handle,
//! and they all decide on the same counters). Handles keep only configuration and, for the
//! one that writes, a cache of the id → slot table.
//!
//! # Source map
//!
//! * `decide.rs`: the request path (`check`, `account`, `account_many`).
//! * `writer.rs`: quota changes (`apply_quotas`), slot and name allocation, parent links.
//! * `counters.rs`: what the sync engine reads and writes (dirty slots, bases, rates).
//! * `inspect.rs`: read-only views (one quota, statistics, roots, the agent lease).
//! * `permits.rs`, `ledger.rs`: concurrency slots (acquire, release) and who holds them.

mod counters;
mod decide;
mod inspect;
mod keys;
mod ledger;
mod permits;
mod section;
mod writer;
#[cfg(test)]
pub(crate) use writer::FIND_IDS;

pub(crate) use counters::no_pace;
pub use inspect::{AgentLease, ZoneStatus};
pub use permits::{Acquired, ConcurrencyInfo, ConcurrencyStatus, Permit, SlotLevel};
pub use section::{WriteSection, SECTION_STALE_NS};

use crate::clock::{Clock, MonotonicClock};
use crate::decision::{Random, ThreadRandom};
use crate::quota::{Epoch, QuotaId};
use crate::zone::arena::Arena;
use crate::zone::index::Index;
use crate::zone::slot::Slot;
use crate::zone::{self, hdr, Block, Layout, NameHasher, ZoneError, COLD_WORDS, SLOT_WORDS};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::Arc;
use std::time::Duration;
use writer::Writer;

/// Longest parent chain a decision walks. The admin API refuses cycles; this bounds the walk
/// if a limiter ever sees one while updates are half applied.
pub const MAX_CHAIN: usize = 16;

/// Quotas a limiter built with [`LimiterBuilder::build`] holds unless told otherwise: the
/// heap block is reserved for them, and pages are only backed by memory as they are used.
pub const DEFAULT_CAPACITY: u32 = 1 << 20;

/// Keys a limiter built with [`LimiterBuilder::build`] holds at once unless told otherwise;
/// like quotas, their memory is only backed as it is used.
pub const DEFAULT_KEYS: u32 = 1 << 20;

/// A weight above [`crate::units::MAX_WEIGHT_UNITS`] was passed to [`Limiter::account`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("weight {0} is above the maximum of 1e12 units")]
pub struct WeightError(pub u64);

/// What [`Limiter::apply_quotas`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ApplyReport {
    /// New quotas.
    pub inserted: usize,
    /// Changed quotas (numbers, parent or epoch).
    pub updated: usize,
    /// Deleted quotas.
    pub deleted: usize,
    /// Updates older than what the limiter has (ignored).
    pub stale: usize,
    /// Updates with an invalid name or numbers (ignored).
    pub invalid: usize,
    /// New quotas that did not fit in the memory block (they stay unlimited).
    pub missing: usize,
    /// Counters emptied by a cluster-wide reset (`reset_epoch` newer than the version held).
    pub reset: usize,
}

/// The keys of one template in a block, or of every template beyond the first
/// [`TEMPLATE_STATS`](crate::zone::TEMPLATE_STATS) together (`template: None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateKeys {
    /// The template's name (`api_key_*`); `None` for the others together.
    pub template: Option<String>,
    /// Keys held now.
    pub keys: u64,
    /// Keys evicted, for a new key or by the sweep of drained ones.
    pub evictions: u64,
    /// New keys refused for want of room (they shared the template's own bucket).
    pub refused: u64,
}

/// A quota as the limiter holds it, with its live estimate.
#[derive(Debug, Clone, PartialEq)]
pub struct QuotaInfo {
    /// Database id.
    pub id: QuotaId,
    /// Epoch of the version held.
    pub epoch: Epoch,
    /// Units per window.
    pub limit: f64,
    /// The window, seconds (1 for a per-second quota).
    pub window: u64,
    /// Units.
    pub low_burst: f64,
    /// Units.
    pub high_burst: f64,
    /// Shadow mode: its rejections are counted, never enforced.
    pub dry_run: bool,
    /// Parent's name, when linked.
    pub parent: Option<String>,
    /// Estimated fill now, units.
    pub fill: f64,
    /// Requests this quota rejected since it was loaded.
    pub rejections: u64,
    /// For a key (a name under a template): the template's name. Its `id` is the key's
    /// wire id and its `epoch` 0.
    pub template: Option<String>,
}

/// Where a counter's `inflow` (what the rest of the cluster adds per second) comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Estimator {
    /// The article's constant: the cluster adds `correction_ratio · limit` per second while
    /// the counter is hot (or times what the cluster's demand the roots metered says came
    /// in, at least, when that is less: a quota under its limit), of which this limiter's
    /// own rate in the last interval is counted exactly in `local`, so the others add the
    /// rest. Clamped to [0, 2].
    Static {
        /// The article's `correction_ratio`.
        correction_ratio: f64,
    },
    /// Measured from the change between two syncs minus this limiter's own share, smoothed
    /// over rounds.
    Measured,
    /// [`Static`](Self::Static), raised to what the fill's change between two syncs says
    /// came in, at least (less three standard deviations of a Poisson count of unit
    /// requests: the clumps a steady stream makes by chance), when that is more and the
    /// bucket cannot have emptied in between: during a surge the cluster adds far more than
    /// `limit` per second until the drops catch up, and the article's constant under-reads
    /// it for a whole interval. At steady state it is the static estimate (the drops hold
    /// the cluster at the limit).
    StaticOrMeasured {
        /// The floor's `correction_ratio`.
        correction_ratio: f64,
    },
}

fn clamp_ratio(r: f64) -> f64 {
    if r.is_finite() {
        r.clamp(0.0, 2.0)
    } else {
        1.0
    }
}

impl Default for Estimator {
    /// The static ratio of 1.0, raised by a measured surge: the steadiest in the simulator
    /// and the quickest to follow a step (`docs/accuracy.md`).
    fn default() -> Self {
        Estimator::StaticOrMeasured { correction_ratio: 1.0 }
    }
}

/// Builder for a [`Limiter`].
pub struct LimiterBuilder {
    clock: Arc<dyn Clock>,
    random: Box<dyn Random>,
    estimator: Estimator,
    horizon: Duration,
    demand: bool,
    local_guard: bool,
    watch_checks: bool,
    capacity: u32,
    keys: u32,
}

impl LimiterBuilder {
    /// The time source (default: [`MonotonicClock`]). Every handle of a shared block must
    /// use the same clock (nginx workers: the system's monotonic clock).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The random source of the probabilistic zone (default: [`ThreadRandom`]).
    pub fn random(mut self, random: impl Random) -> Self {
        self.random = Box::new(random);
        self
    }

    /// How counters are extrapolated between syncs (default: static ratio 1.0).
    pub fn estimator(mut self, e: Estimator) -> Self {
        self.estimator = match e {
            Estimator::Static { correction_ratio: r } => {
                Estimator::Static { correction_ratio: clamp_ratio(r) }
            }
            Estimator::StaticOrMeasured { correction_ratio: r } => {
                Estimator::StaticOrMeasured { correction_ratio: clamp_ratio(r) }
            }
            Estimator::Measured => Estimator::Measured,
        };
        self
    }

    /// Shorthand for `estimator(Estimator::Static { correction_ratio: r })`.
    pub fn correction_ratio(self, r: f64) -> Self {
        self.estimator(Estimator::Static { correction_ratio: r })
    }

    /// How long after a counter's last sync the extrapolation holds (default 1 s; set it to
    /// the sync interval).
    pub fn horizon(mut self, h: Duration) -> Self {
        self.horizon = h;
        self
    }

    /// Whether a counter above `low_burst` also drops the share `1 - limit / demand` of
    /// requests, with `demand` the cluster's attempted rate as the roots meter it (seed
    /// `004_…`; default on, see `docs/accuracy.md`). Off leaves only the fill-based zone.
    pub fn demand(mut self, on: bool) -> Self {
        self.demand = on;
        self
    }

    /// The local guard (default off, see `docs/accuracy.md`): reject at once when this
    /// limiter's own accounted weight since its last sync round would exceed
    /// `limit · (dt + horizon / 10)`, with `dt` the time since that round began. One host
    /// alone can never legitimately go faster than the whole quota, so this needs no news
    /// from the cluster, costs one atomic load and a multiply per decision, and caps a spike
    /// on a single host at the limit within the first interval, before any sync could report
    /// it (without it the host may admit up to `high_burst` per interval).
    pub fn local_guard(mut self, on: bool) -> Self {
        self.local_guard = on;
        self
    }

    /// Whether a [`check`](Limiter::check) marks its chain for the next sync round like an
    /// account does (default off), so a sync engine asking for answers by interest
    /// ([`crate::SyncConfig::interest`]) names the counters this limiter only checks.
    /// Every handle of a shared block should agree; [`crate::SyncEngine`] turns it on for
    /// its own handle when it asks by interest.
    pub fn watch_checks(mut self, on: bool) -> Self {
        self.watch_checks = on;
        self
    }

    /// How many quotas [`build`](Self::build)'s heap block holds (default
    /// [`DEFAULT_CAPACITY`]); quotas beyond it stay unlimited and are counted as missing.
    pub fn capacity(mut self, quotas: u32) -> Self {
        self.capacity = quotas;
        self
    }

    /// How many keys (names under templates, a bucket each) [`build`](Self::build)'s heap
    /// block holds at once (default [`DEFAULT_KEYS`]); drained keys make room for new ones.
    pub fn keys(mut self, keys: u32) -> Self {
        self.keys = keys;
        self
    }

    /// Builds a limiter over a new heap block. It holds no quotas until
    /// [`Limiter::apply_quotas`] or a sync.
    pub fn build(self) -> Limiter {
        let block = Block::for_capacity(self.capacity, self.keys);
        let layout = match zone::format_new(&block, self.keys) {
            Ok(l) => l,
            // for_quotas sizes the block for at least MIN_QUOTAS, which always fits.
            Err(e) => unreachable!("a block sized for its capacity did not fit: {e}"),
        };
        let now = self.clock.now_nanos();
        block.words()[hdr::LOCAL_SINCE].store(now, Relaxed);
        self.finish(block, layout)
    }

    /// Attaches to a block prepared with [`zone::prepare`], which other handles (threads,
    /// processes) may use at the same time.
    pub fn open(self, block: Block) -> Result<Limiter, ZoneError> {
        let layout = zone::validate(block.words()).map_err(ZoneError::NotPrepared)?;
        Ok(self.finish(block, layout))
    }

    fn finish(self, block: Block, layout: Layout) -> Limiter {
        let seed = block.words()[hdr::SEED].load(Relaxed);
        Limiter {
            hasher: NameHasher::with_seed(seed),
            block,
            layout,
            writer: Mutex::new(Writer::default()),
            clock: self.clock,
            random: self.random,
            estimator: self.estimator,
            demand: self.demand,
            local_guard: self.local_guard,
            watch_checks: AtomicBool::new(self.watch_checks),
            horizon_ns: AtomicU64::new(u64::try_from(self.horizon.as_nanos()).unwrap_or(u64::MAX)),
            engine_attached: AtomicBool::new(false),
            ledger_row: AtomicUsize::new(0),
            ledger_owner: AtomicU64::new(0),
        }
    }
}

/// The quota table and counters of one limiter; see the module docs for the estimate.
///
/// Thread-safe, and process-safe over a shared [`Block`]: [`check`](Self::check) and
/// [`account`](Self::account) take no lock (a hash probe, then atomics); quota updates and
/// sync results go through one writer at a time.
pub struct Limiter {
    block: Block,
    layout: Layout,
    hasher: NameHasher,
    writer: Mutex<Writer>,
    clock: Arc<dyn Clock>,
    random: Box<dyn Random>,
    estimator: Estimator,
    demand: bool,
    local_guard: bool,
    /// Checks mark their chain dirty (see [`LimiterBuilder::watch_checks`]).
    pub(crate) watch_checks: AtomicBool,
    horizon_ns: AtomicU64,
    pub(crate) engine_attached: AtomicBool,
    /// This handle's ledger row + 1 (0: none), see `ledger.rs`.
    ledger_row: AtomicUsize,
    /// The owner word this process wrote into that row (its pid, owned).
    ledger_owner: AtomicU64,
}

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("quotas", &self.quota_count())
            .field("epoch", &self.epoch())
            .field("block", &self.block)
            .finish_non_exhaustive()
    }
}

impl Default for Limiter {
    fn default() -> Self {
        Limiter::builder().build()
    }
}

impl Limiter {
    /// A builder with the defaults.
    pub fn builder() -> LimiterBuilder {
        LimiterBuilder {
            clock: Arc::new(MonotonicClock::new()),
            random: Box::new(ThreadRandom),
            estimator: Estimator::default(),
            horizon: Duration::from_secs(1),
            demand: true,
            local_guard: false,
            watch_checks: false,
            capacity: DEFAULT_CAPACITY,
            keys: DEFAULT_KEYS,
        }
    }

    /// The memory block this limiter lives in.
    pub fn block(&self) -> &Block {
        &self.block
    }

    #[inline]
    fn words(&self) -> &[AtomicU64] {
        self.block.words()
    }

    #[inline]
    fn hdr(&self, i: usize) -> &AtomicU64 {
        &self.words()[i]
    }

    /// Slot `i`: a quota's below the quota capacity, a key's above it (see `keys.rs`).
    #[inline]
    fn slot(&self, i: u32) -> Option<Slot<'_>> {
        if i >= self.layout.slot_cap {
            return self.key_table().slot(i - self.layout.slot_cap);
        }
        let at = self.layout.slots + i as usize * SLOT_WORDS;
        let words = self.words().get(at..at + SLOT_WORDS)?;
        Some(Slot(words.try_into().ok()?))
    }

    /// The slot `i` if it holds a quota or a key.
    #[inline]
    fn live_slot(&self, i: u32) -> Option<Slot<'_>> {
        if i >= self.layout.slot_cap {
            return self.slot(i).filter(|s| zone::keys::is_key_id(s.id()));
        }
        self.slot(i).filter(|s| s.id() != 0)
    }

    /// Whether slot `i` is in the key table.
    #[inline]
    fn is_key_slot(&self, i: u32) -> bool {
        i >= self.layout.slot_cap
    }

    /// The slot numbers of the key table.
    pub(crate) fn key_slots(&self) -> std::ops::Range<u32> {
        self.layout.slot_cap..self.layout.all_slots()
    }

    /// A quota slot's cold words: (epoch or time freed, parent-name record or next free
    /// slot). Key slots have none: callers check [`Self::is_key_slot`] first.
    fn cold(&self, i: u32) -> (&AtomicU64, &AtomicU64) {
        let at = self.layout.cold + (i % self.layout.slot_cap) as usize * COLD_WORDS;
        (&self.words()[at], &self.words()[at + 1])
    }

    #[inline]
    fn index(&self) -> Index<'_> {
        Index::new(self.words(), &self.layout)
    }

    #[inline]
    fn arena(&self) -> Arena<'_> {
        Arena::new(self.words(), &self.layout)
    }

    #[inline]
    fn hash(&self, name: &[u8]) -> u64 {
        self.hasher.hash(name)
    }

    /// Sets `s`'s dirty bit: it has counts for the next sync round.
    #[inline]
    fn mark_dirty(&self, s: u32) {
        let k = (s / 64) as usize;
        let w = &self.words()[self.layout.dirty + k];
        let bit = 1u64 << (s % 64);
        if w.load(Relaxed) & bit == 0 {
            w.fetch_or(bit, Relaxed);
            // After the bit: a round clears the summary first, then takes the words it names.
            let sum = &self.words()[self.layout.dirty_sum + k / 64];
            let sbit = 1u64 << (k % 64);
            if sum.load(Relaxed) & sbit == 0 {
                sum.fetch_or(sbit, Relaxed);
            }
        }
    }

    /// The slot of `name`, if a quota has it.
    #[inline]
    fn find<N: AsRef<[u8]> + ?Sized>(&self, n: &N) -> Option<(u32, Slot<'_>)> {
        let n = n.as_ref();
        let arena = self.arena();
        let s = self
            .index()
            .find(self.hash(n), |s| self.slot(s).is_some_and(|x| x.name_eq(n, &arena)))?;
        Some((s, self.live_slot(s)?))
    }

    /// A quota's name; for a key, its template's (keys keep no name, and their template is
    /// what an operator configured).
    fn slot_name(&self, i: u32) -> String {
        if let Some(t) = self.template_of_key(i) {
            return self.slot_name(t);
        }
        match self.slot(i) {
            Some(s) => {
                // A template's `*` is the template's mark, not a byte of a key to escape.
                let raw = s.name(&self.arena());
                match raw.strip_suffix(b"*") {
                    Some(prefix) => crate::quota::escape_name(prefix) + "*",
                    None => crate::quota::escape_name(&raw),
                }
            }
            None => String::new(),
        }
    }

    /// The limiter's clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The estimator in use.
    pub fn estimator(&self) -> Estimator {
        self.estimator
    }

    /// The horizon configured, ns.
    pub(crate) fn horizon_ns(&self) -> u64 {
        self.horizon_ns.load(Relaxed)
    }

    /// The horizon estimates extrapolate within at `now`, ns: the configured one, stretched
    /// while a view is held ([`Self::stretch_horizon`]).
    #[inline]
    pub(crate) fn horizon_at(&self, now: u64) -> u64 {
        let h = self.horizon_ns.load(Relaxed);
        if now < self.hdr(hdr::HELD_UNTIL).load(Relaxed) {
            return h.saturating_add(self.hdr(hdr::HELD_STRETCH).load(Relaxed));
        }
        h
    }

    /// Stretches the horizon by `ns` for every process on the block until `until`, or by
    /// more and longer if a stretch in force at `now` says so.
    pub(crate) fn stretch_horizon(&self, ns: u64, until: u64, now: u64) {
        let (old_ns, old_until) =
            (self.hdr(hdr::HELD_STRETCH).load(Relaxed), self.hdr(hdr::HELD_UNTIL).load(Relaxed));
        let (ns, until) =
            if now < old_until { (ns.max(old_ns), until.max(old_until)) } else { (ns, until) };
        self.hdr(hdr::HELD_STRETCH).store(ns, Relaxed);
        self.hdr(hdr::HELD_UNTIL).store(until, Relaxed);
    }

    /// Limiters the roots last counted as live (0 before any answer): see
    /// [`Slot::estimate`](crate::zone::slot::Slot::estimate).
    #[inline]
    pub(crate) fn peers(&self) -> u64 {
        self.hdr(hdr::PEERS).load(Relaxed)
    }

    /// [`peers`](Self::peers) as the estimate takes it: read only if a counter needs it.
    #[inline]
    pub(crate) fn peers_cell(&self) -> crate::zone::slot::Peers<'_> {
        crate::zone::slot::Peers::of(self.hdr(hdr::PEERS))
    }

    /// Records the roots' count of live limiters from an answer.
    pub(crate) fn set_peers(&self, n: u32) {
        self.hdr(hdr::PEERS).store(u64::from(n), Relaxed);
    }
}

#[cfg(test)]
mod tests;
