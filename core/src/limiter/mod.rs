//! The limiter: every quota and the cluster-wide counters in memory, decisions without any
//! network call.
//!
//! # The estimate between syncs
//!
//! A counter keeps `base`, the largest fill any root reported (roots' values merge by
//! **max**), the time `at` it was stored, `local`, what this process accounted since its
//! last sync round, and `inflow`, what the rest of the cluster is estimated to add per
//! second. The fill a decision uses is the article's extrapolation:
//!
//! ```text
//! F(now) = max(0, base + local + (inflow - limit)·min(dt, H) - limit·max(0, dt - H))
//! ```
//!
//! with `dt = now - at` and `H` the horizon (one sync interval by default): the bucket drains
//! at `limit`, and for one interval after a sync the others are assumed to keep adding
//! `inflow`. [`Estimator`] says where `inflow` comes from: the article's static
//! `correction_ratio · limit` for the whole cluster less this limiter's own last-interval
//! rate, or the rate measured between two syncs (the article's
//! "dynamic ratio"). A counter that no root reported as changed in the last round is cold:
//! nobody adds to it, `inflow` is 0 and it drains at once. While no root answers at all,
//! nothing is extrapolated: the limiter limits on what it knows locally (fail-open, SPEC §1).

mod table;

use crate::clock::{Clock, MonotonicClock};
use crate::decision::{
    drop_probability, retry_after_secs, Decision, Outcome, Random, ThreadRandom,
};
use crate::quota::{validate_name, Epoch, QuotaId, QuotaUpdate};
use crate::units::{drain_once, milli_to_units, MAX_WEIGHT_UNITS, MILLI};
use hashbrown::HashTable;
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::Arc;
use std::time::Duration;
use table::{Index, Shard, Slot, Slots, MAX_SLOTS};

/// Longest parent chain a decision walks. The admin API refuses cycles; this bounds the walk
/// if a limiter ever sees one while updates are half applied.
pub const MAX_CHAIN: usize = 16;

/// How long a deleted quota's slot waits before it is reused, so a reader that found it an
/// instant before the delete never sees another quota's numbers.
const SLOT_QUARANTINE_NS: u64 = 2_000_000_000;

/// A weight above [`MAX_WEIGHT_UNITS`] was passed to [`Limiter::account`].
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
}

/// A quota as the limiter holds it, with its live estimate.
#[derive(Debug, Clone, PartialEq)]
pub struct QuotaInfo {
    /// Database id.
    pub id: QuotaId,
    /// Epoch of the version held.
    pub epoch: Epoch,
    /// Units per second.
    pub limit: f64,
    /// Units.
    pub low_burst: f64,
    /// Units.
    pub high_burst: f64,
    /// Parent's name, when linked.
    pub parent: Option<String>,
    /// Estimated fill now, units.
    pub fill: f64,
}

/// Where a counter's `inflow` (what the rest of the cluster adds per second) comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Estimator {
    /// The article's constant: the cluster adds `correction_ratio · limit` per second while
    /// the counter is hot, of which this limiter's own rate in the last interval is counted
    /// exactly in `local`, so the others add the rest. Clamped to [0, 2].
    Static {
        /// The article's `correction_ratio`.
        correction_ratio: f64,
    },
    /// Measured from the change between two syncs minus this limiter's own share, smoothed
    /// over rounds.
    Measured,
}

impl Default for Estimator {
    /// The article's static ratio of 1.0: the steadiest in the simulator (`docs/accuracy.md`).
    fn default() -> Self {
        Estimator::Static { correction_ratio: 1.0 }
    }
}

/// The slots of one decision's parent chain.
#[derive(Default)]
struct Chain {
    slots: [u32; MAX_CHAIN],
    len: usize,
}

impl Chain {
    fn push(&mut self, s: u32) {
        if self.len < MAX_CHAIN {
            self.slots[self.len] = s;
            self.len += 1;
        }
    }

    fn slots(&self) -> &[u32] {
        &self.slots[..self.len]
    }
}

enum Walk {
    Unlimited,
    Passed(f64),
    Rejected(Decision),
}

/// Builder for a [`Limiter`].
pub struct LimiterBuilder {
    clock: Arc<dyn Clock>,
    random: Box<dyn Random>,
    estimator: Estimator,
    horizon: Duration,
    demand: bool,
    local_guard: bool,
}

impl LimiterBuilder {
    /// The time source (default: [`MonotonicClock`]).
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
            Estimator::Static { correction_ratio: r } => Estimator::Static {
                correction_ratio: if r.is_finite() { r.clamp(0.0, 2.0) } else { 1.0 },
            },
            m => m,
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

    /// Builds the limiter. It holds no quotas until [`Limiter::apply_quotas`] or a sync.
    pub fn build(self) -> Limiter {
        let now = self.clock.now_nanos();
        Limiter {
            slots: Slots::new(),
            index: Index::new(),
            hasher: foldhash::fast::FixedState::with_seed(fastrand::u64(..)),
            writer: Mutex::new(Writer::default()),
            dirty: Mutex::new(Vec::new()),
            clock: self.clock,
            random: self.random,
            estimator: self.estimator,
            demand: self.demand,
            local_guard: self.local_guard,
            local_since: AtomicU64::new(now),
            fresh: AtomicBool::new(false),
            horizon_ns: AtomicU64::new(u64::try_from(self.horizon.as_nanos()).unwrap_or(u64::MAX)),
            epoch: AtomicU64::new(0),
            quotas: AtomicU64::new(0),
            rejections: AtomicU64::new(0),
            engine_attached: AtomicBool::new(false),
        }
    }
}

#[derive(Default)]
struct Writer {
    /// Slot indices, found by the slot's `id`.
    by_id: HashTable<u32>,
    free: Vec<u32>,
    quarantine: VecDeque<(u64, u32)>,
    next_slot: u32,
    /// Children whose parent is not (yet) known: child slot → parent name.
    unresolved: HashMap<u32, Box<str>>,
}

/// The quota table and counters of one process; see the module docs for the estimate.
///
/// Thread-safe: [`check`](Self::check) and [`account`](Self::account) take no lock (an
/// `arc-swap` load of one index shard, then atomics), quota updates and sync results go
/// through one internal writer lock.
pub struct Limiter {
    slots: Slots,
    index: Index,
    hasher: foldhash::fast::FixedState,
    writer: Mutex<Writer>,
    /// Slots whose `local` went from zero to non-zero since the last sync round.
    dirty: Mutex<Vec<u32>>,
    clock: Arc<dyn Clock>,
    random: Box<dyn Random>,
    estimator: Estimator,
    demand: bool,
    local_guard: bool,
    /// Clock time from which `local` counts (the start of the last finished sync round):
    /// the local guard's `dt`.
    local_since: AtomicU64,
    fresh: AtomicBool,
    horizon_ns: AtomicU64,
    epoch: AtomicU64,
    quotas: AtomicU64,
    rejections: AtomicU64,
    pub(crate) engine_attached: AtomicBool,
}

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("quotas", &self.quota_count())
            .field("epoch", &self.epoch())
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
        }
    }

    /// Decides for `name` and its ancestors without counting anything (the nginx
    /// `yarl_check` role).
    #[inline]
    pub fn check(&self, name: &str) -> Decision {
        self.decide(name, 0)
    }

    /// Decides for `name` and its ancestors; if allowed, adds `weight` units to every counter
    /// of the chain, if rejected adds nothing (all-or-nothing, seed `002_…`).
    ///
    /// Two threads deciding at the same instant can both pass before either adds: decisions
    /// are local and the counters only approximate, by design.
    #[inline]
    pub fn account(&self, name: &str, weight: u64) -> Result<Decision, WeightError> {
        if weight > MAX_WEIGHT_UNITS {
            return Err(WeightError(weight));
        }
        Ok(self.decide(name, weight * MILLI))
    }

    #[inline]
    fn find(&self, name: &str) -> Option<(u32, &Slot)> {
        let h = self.hasher.hash_one(name.as_bytes());
        let idx = self.index.shards[Index::shard_of(h)].load().find(h, name.as_bytes())?;
        let slot = self.slots.get(idx)?;
        // A slot freed an instant ago (and not yet reused: quarantine) is not trusted.
        if slot.id.load(Acquire) == 0 || slot.name_tag.load(Relaxed) != (h >> 32) as u32 {
            return None;
        }
        Some((idx, slot))
    }

    fn decide(&self, name: &str, weight: u64) -> Decision {
        let now = self.clock.now_nanos();
        let mut chain = Chain::default();
        match self.walk(name, now, weight, &mut chain) {
            Walk::Unlimited => Decision::unlimited(),
            Walk::Rejected(d) => {
                if weight > 0 {
                    self.count_rejected(&chain, weight);
                }
                d
            }
            Walk::Passed(fill) => {
                self.add_local(&chain, weight);
                Decision { outcome: Outcome::Passed, quota: None, fill, retry_after: None }
            }
        }
    }

    /// Like [`account`](Self::account) for several names at once, all-or-nothing across all
    /// of them: if any chain rejects, nothing is added anywhere (the refused weights count as
    /// demand). The first rejection is returned; otherwise the pass of the last name that
    /// matched a quota (`Unlimited` if none did).
    pub fn account_many(&self, items: &[(&str, u64)]) -> Result<Decision, WeightError> {
        if let Some(&(_, w)) = items.iter().find(|(_, w)| *w > MAX_WEIGHT_UNITS) {
            return Err(WeightError(w));
        }
        let now = self.clock.now_nanos();
        let mut chains = Vec::with_capacity(items.len());
        let mut result = Decision::unlimited();
        for &(name, weight) in items {
            let mut chain = Chain::default();
            match self.walk(name, now, weight * MILLI, &mut chain) {
                Walk::Unlimited => {}
                Walk::Rejected(d) => {
                    self.count_rejected(&chain, weight * MILLI);
                    for (c, w) in &chains {
                        self.count_rejected(c, *w);
                    }
                    return Ok(d);
                }
                Walk::Passed(fill) => {
                    result =
                        Decision { outcome: Outcome::Passed, quota: None, fill, retry_after: None };
                    chains.push((chain, weight * MILLI));
                }
            }
        }
        for (c, w) in &chains {
            self.add_local(c, *w);
        }
        Ok(result)
    }

    /// Decides for `name`'s chain at `now`, recording the walked slots in `chain` (on a
    /// rejection: those that passed, then the rejecting one and its ancestors).
    fn walk(&self, name: &str, now: u64, weight: u64, chain: &mut Chain) -> Walk {
        let Some((mut idx, mut slot)) = self.find(name) else {
            return Walk::Unlimited;
        };
        let fresh = self.fresh.load(Relaxed);
        let horizon = self.horizon_ns.load(Relaxed);
        // Seconds `local` has been counting, for the local guard; only read when it is on.
        let guard_dt = if self.local_guard && weight > 0 {
            Some(now.saturating_sub(self.local_since.load(Relaxed)) as f64 * 1e-9)
        } else {
            None
        };
        let mut leaf_fill = 0.0;
        loop {
            let fill = slot.estimate(now, fresh, horizon);
            if chain.len == 0 {
                leaf_fill = fill;
            }
            let low = slot.low.load(Relaxed);
            let limit = slot.limit.load(Relaxed);
            let high = slot.high.load(Relaxed);
            let mut p = drop_probability(fill, low, high);
            if let Some(dt) = guard_dt {
                // One host alone may not outrun the whole quota; a tenth of an interval's
                // worth absorbs arrival noise. (Subtracting what the others were last seen
                // adding reacts faster but rejects a lone busy host under the limit:
                // docs/accuracy.md.)
                let room = limit as f64 * (dt + horizon as f64 * 1e-10);
                if slot.local.load(Relaxed).saturating_add(weight) as f64 > room {
                    p = 1.0;
                }
            }
            if self.demand && fill > low as f64 && fresh {
                // Seed 004: suppress exactly the share of the attempted demand above the
                // limit. Demand doesn't fall when we reject, so this does not oscillate.
                let (_, demand) = table::unpack_rates(slot.rates.load(Relaxed));
                if demand > limit as f64 {
                    p = p.max(1.0 - limit as f64 / demand);
                }
            }
            let rejected = p > 0.0 && (p >= 1.0 || self.random.unit() < p);
            if rejected || chain.len < MAX_CHAIN {
                chain.push(idx);
            }
            if rejected {
                self.rejections.fetch_add(1, Relaxed);
                // The ancestors above the rejecting quota also saw this attempt as demand.
                let mut cur = slot.parent.load(Relaxed);
                while cur != 0 && chain.len < MAX_CHAIN {
                    chain.push(cur - 1);
                    cur = self.slots.get(cur - 1).map_or(0, |s| s.parent.load(Relaxed));
                }
                return Walk::Rejected(Decision {
                    outcome: Outcome::Rejected,
                    quota: Some(self.slot_name(idx).into()),
                    fill: fill / MILLI as f64,
                    retry_after: Some(retry_after_secs(fill, low, limit)),
                });
            }
            let parent = slot.parent.load(Relaxed);
            if parent == 0 || chain.len == MAX_CHAIN {
                break;
            }
            match self.slots.get(parent - 1) {
                Some(p) if p.id.load(Relaxed) != 0 => {
                    idx = parent - 1;
                    slot = p;
                }
                _ => break,
            }
        }
        Walk::Passed(leaf_fill / MILLI as f64)
    }

    fn add_local(&self, chain: &Chain, weight: u64) {
        if weight == 0 {
            return;
        }
        for &i in chain.slots() {
            if let Some(s) = self.slots.get(i) {
                if s.local.fetch_add(weight, Relaxed) == 0 {
                    self.dirty.lock().push(i);
                }
            }
        }
    }

    /// A refused attempt still counts as demand on every quota of its chain.
    fn count_rejected(&self, chain: &Chain, weight: u64) {
        for &i in chain.slots() {
            if let Some(s) = self.slots.get(i) {
                if s.rejected.fetch_add(weight, Relaxed) == 0 && s.local.load(Relaxed) == 0 {
                    self.dirty.lock().push(i);
                }
            }
        }
    }

    fn slot_name(&self, idx: u32) -> String {
        let Some(slot) = self.slots.get(idx) else { return String::new() };
        let h = u64::from(slot.name_tag.load(Relaxed)) << 32;
        let shard = self.index.shards[Index::shard_of(h)].load();
        match shard.name_of_slot(idx) {
            Some(n) => String::from_utf8_lossy(n).into_owned(),
            None => format!("#{}", slot.id.load(Relaxed)),
        }
    }

    /// Whether a quota called `name` is held (an index lookup, nothing else).
    pub fn contains(&self, name: &str) -> bool {
        self.find(name).is_some()
    }

    /// The quota called `name`, with its estimated fill now.
    pub fn quota(&self, name: &str) -> Option<QuotaInfo> {
        let (_, slot) = self.find(name)?;
        let now = self.clock.now_nanos();
        let fresh = self.fresh.load(Relaxed);
        let parent = match slot.parent.load(Relaxed) {
            0 => None,
            p => Some(self.slot_name(p - 1)),
        };
        Some(QuotaInfo {
            id: slot.id.load(Relaxed),
            epoch: slot.epoch.load(Relaxed),
            limit: milli_to_units(slot.limit.load(Relaxed)),
            low_burst: milli_to_units(slot.low.load(Relaxed)),
            high_burst: milli_to_units(slot.high.load(Relaxed)),
            parent,
            fill: slot.estimate(now, fresh, self.horizon_ns.load(Relaxed)) / MILLI as f64,
        })
    }

    /// Highest quota epoch applied.
    pub fn epoch(&self) -> Epoch {
        self.epoch.load(Relaxed)
    }

    /// Number of quotas held.
    pub fn quota_count(&self) -> u64 {
        self.quotas.load(Relaxed)
    }

    /// Requests rejected so far.
    pub fn rejections(&self) -> u64 {
        self.rejections.load(Relaxed)
    }

    /// The estimator in use.
    pub fn estimator(&self) -> Estimator {
        self.estimator
    }

    /// Whether the last sync round reached a root (extrapolation is on).
    pub fn cluster_fresh(&self) -> bool {
        self.fresh.load(Relaxed)
    }

    /// The limiter's clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Approximate heap bytes of the quota table (slots, index, id table).
    pub fn memory_bytes(&self) -> usize {
        let index: usize = self.index.shards.iter().map(|s| s.load().heap_bytes()).sum();
        let w = self.writer.lock();
        self.slots.allocated_bytes()
            + index
            + w.by_id.allocation_size()
            + w.free.capacity() * 4
            + self.index.shards.len() * (size_of::<Shard>() + 16)
    }

    fn hash(&self, name: &[u8]) -> u64 {
        self.hasher.hash_one(name)
    }

    /// Applies quota changes (from a root, or directly when embedding): inserts, changes,
    /// deletes and re-parents, in any order and idempotently; an update older than the
    /// version held is ignored. Readers see each shard switch atomically.
    pub fn apply_quotas(&self, updates: &[QuotaUpdate]) -> ApplyReport {
        let mut report = ApplyReport::default();
        if updates.is_empty() {
            return report;
        }
        let now = self.clock.now_nanos();
        let mut w = self.writer.lock();
        let w = &mut *w;
        while let Some(&(at, s)) = w.quarantine.front() {
            if now.saturating_sub(at) < SLOT_QUARANTINE_NS {
                break;
            }
            w.quarantine.pop_front();
            w.free.push(s);
        }
        // Size every shard copy for what this batch adds to it, so a page of a bulk load
        // allocates each shard once instead of growing it step by step (the freed steps would
        // stay resident in the allocator).
        let mut growth: HashMap<usize, (usize, usize)> = HashMap::new();
        for u in updates.iter().filter(|u| !u.deleted) {
            let g = growth.entry(Index::shard_of(self.hash(u.name.as_bytes()))).or_default();
            g.0 += 1;
            g.1 += 1 + u.name.len();
        }
        let mut touched = Touched { shards: HashMap::new(), growth, hasher: &self.hasher };
        let mut parent_jobs: Vec<(u32, Option<String>)> = Vec::new();
        let mut deleted: HashMap<u32, Box<str>> = HashMap::new();
        let mut max_epoch = 0;
        let hasher = |n: &[u8]| self.hash(n);

        for u in updates {
            if validate_name(&u.name).is_err()
                || (!u.deleted && u.limits.validate().is_err())
                || u.id == 0
            {
                report.invalid += 1;
                continue;
            }
            max_epoch = max_epoch.max(u.epoch);
            let h = self.hash(u.name.as_bytes());
            let sh = Index::shard_of(h);
            let existing = self.find_id(&w.by_id, u.id);
            if u.deleted {
                match existing {
                    Some(s) if self.slots.ensure(s).epoch.load(Relaxed) <= u.epoch => {
                        let shard = shard_mut(&mut touched, &self.index, sh);
                        shard.remove(h, u.name.as_bytes());
                        self.free_slot(w, s, now);
                        deleted.insert(s, u.name.as_str().into());
                        report.deleted += 1;
                    }
                    Some(_) => report.stale += 1,
                    None => {}
                }
                continue;
            }
            if let Some(s) = existing {
                let slot = self.slots.ensure(s);
                if slot.epoch.load(Relaxed) > u.epoch {
                    report.stale += 1;
                    continue;
                }
                if slot.name_tag.load(Relaxed) != (h >> 32) as u32 {
                    // Ids keep their name in the database; repoint defensively if not.
                    let old = self.slot_name(s);
                    let oh = self.hash(old.as_bytes());
                    shard_mut(&mut touched, &self.index, Index::shard_of(oh))
                        .remove(oh, old.as_bytes());
                    shard_mut(&mut touched, &self.index, sh).insert(
                        h,
                        u.name.as_bytes(),
                        s,
                        &hasher,
                    );
                    slot.name_tag.store((h >> 32) as u32, Relaxed);
                }
                store_limits(slot, u);
                parent_jobs.push((s, u.parent.clone()));
                report.updated += 1;
                continue;
            }
            // A new id. If the name still points at an older quota, that one was deleted and
            // re-created while this limiter was not looking.
            let shard = shard_mut(&mut touched, &self.index, sh);
            if let Some(old) = shard.find(h, u.name.as_bytes()) {
                if self.slots.ensure(old).epoch.load(Relaxed) > u.epoch {
                    report.stale += 1;
                    continue;
                }
                shard.remove(h, u.name.as_bytes());
                self.free_slot(w, old, now);
                deleted.insert(old, u.name.as_str().into());
            }
            let Some(s) = self.alloc_slot(w) else {
                report.invalid += 1;
                continue;
            };
            let slot = self.slots.ensure(s);
            store_limits(slot, u);
            slot.name_tag.store((h >> 32) as u32, Relaxed);
            slot.parent.store(0, Relaxed);
            slot.write_base(0, 0);
            slot.local.store(0, Relaxed);
            slot.rejected.store(0, Relaxed);
            slot.rates.store(0, Relaxed);
            slot.id.store(u.id, Release);
            let slots = &self.slots;
            w.by_id.insert_unique(hash_id(u.id), s, |&i| {
                hash_id(slots.get(i).map_or(0, |x| x.id.load(Relaxed)))
            });
            shard_mut(&mut touched, &self.index, sh).insert(h, u.name.as_bytes(), s, &hasher);
            parent_jobs.push((s, u.parent.clone()));
            report.inserted += 1;
        }

        for (i, mut shard) in touched.shards {
            shard.compact_if_sparse(&hasher);
            self.index.publish(i, shard, &hasher);
        }
        if !deleted.is_empty() {
            // Children of a deleted quota lose the link but remember the name, so a re-created
            // parent is linked again. Deleting a parent with children is refused by the admin
            // API, so this scan is rare.
            for i in 0..w.next_slot {
                let Some(s) = self.slots.get(i) else { continue };
                let p = s.parent.load(Relaxed);
                if p != 0 && s.id.load(Relaxed) != 0 {
                    if let Some(name) = deleted.get(&(p - 1)) {
                        s.parent.store(0, Relaxed);
                        w.unresolved.insert(i, name.clone());
                    }
                }
            }
            for s in deleted.keys() {
                w.unresolved.remove(s);
            }
        }
        for (s, parent) in parent_jobs {
            match parent {
                None => {
                    self.slots.ensure(s).parent.store(0, Relaxed);
                    w.unresolved.remove(&s);
                }
                Some(p) => match self.find(&p) {
                    Some((pi, _)) if pi != s => {
                        self.slots.ensure(s).parent.store(pi + 1, Relaxed);
                        w.unresolved.remove(&s);
                    }
                    _ => {
                        self.slots.ensure(s).parent.store(0, Relaxed);
                        w.unresolved.insert(s, p.into());
                    }
                },
            }
        }
        let slots = &self.slots;
        w.unresolved.retain(|&child, parent| {
            let Some(c) = slots.get(child) else { return false };
            if c.id.load(Relaxed) == 0 {
                return false;
            }
            match self.find(parent) {
                Some((p, _)) if p != child => {
                    c.parent.store(p + 1, Relaxed);
                    false
                }
                _ => {
                    c.parent.store(0, Relaxed);
                    true
                }
            }
        });
        self.epoch.fetch_max(max_epoch, Relaxed);
        self.quotas.store(w.by_id.len() as u64, Relaxed);
        report
    }

    fn find_id(&self, by_id: &HashTable<u32>, id: QuotaId) -> Option<u32> {
        by_id
            .find(hash_id(id), |&i| self.slots.get(i).is_some_and(|s| s.id.load(Relaxed) == id))
            .copied()
    }

    fn alloc_slot(&self, w: &mut Writer) -> Option<u32> {
        if let Some(s) = w.free.pop() {
            return Some(s);
        }
        if w.next_slot >= MAX_SLOTS {
            return None;
        }
        w.next_slot += 1;
        Some(w.next_slot - 1)
    }

    fn free_slot(&self, w: &mut Writer, s: u32, now: u64) {
        let slot = self.slots.ensure(s);
        let id = slot.id.load(Relaxed);
        if let Ok(e) = w.by_id.find_entry(hash_id(id), |&i| i == s) {
            e.remove();
        }
        slot.id.store(0, Release);
        slot.parent.store(0, Relaxed);
        slot.local.store(0, Relaxed);
        slot.rejected.store(0, Relaxed);
        slot.rates.store(0, Relaxed);
        slot.write_base(0, 0);
        w.quarantine.push_back((now, s));
    }

    // ---- Used by the sync engine (crate::sync). All take the writer lock, which makes the
    // engine the only writer of counter bases. ----

    /// Runs `f` with a resolver from quota ids to slots, under the writer lock.
    pub(crate) fn with_counters<R>(&self, f: impl FnOnce(&CounterAccess<'_>) -> R) -> R {
        let w = self.writer.lock();
        f(&CounterAccess { limiter: self, by_id: &w.by_id })
    }

    /// Slots accounted since the last call, with their ids, deduplicated.
    pub(crate) fn take_dirty(&self) -> Vec<u32> {
        let mut v = std::mem::take(&mut *self.dirty.lock());
        v.sort_unstable();
        v.dedup();
        v
    }

    /// `local` now only holds what was accounted since `t` (a round that began at `t` ended).
    pub(crate) fn set_local_since(&self, t: u64) {
        self.local_since.store(t, Relaxed);
    }

    pub(crate) fn set_cluster_fresh(&self, fresh: bool) {
        self.fresh.store(fresh, Relaxed);
    }

    pub(crate) fn raise_epoch(&self, e: Epoch) {
        self.epoch.fetch_max(e, Relaxed);
    }
}

/// Counter operations for the sync engine, valid while the writer lock is held.
pub(crate) struct CounterAccess<'a> {
    limiter: &'a Limiter,
    by_id: &'a HashTable<u32>,
}

impl CounterAccess<'_> {
    pub fn slot_of(&self, id: QuotaId) -> Option<u32> {
        self.limiter.find_id(self.by_id, id)
    }

    fn slot(&self, s: u32) -> Option<&Slot> {
        self.limiter.slots.get(s).filter(|x| x.id.load(Relaxed) != 0)
    }

    pub fn id_of(&self, s: u32) -> Option<QuotaId> {
        self.slot(s).map(|x| x.id.load(Relaxed))
    }

    pub fn local(&self, s: u32) -> u64 {
        self.slot(s).map_or(0, |x| x.local.load(Relaxed))
    }

    /// Whether `s` has counts no round has taken yet.
    pub fn has_pending(&self, s: u32) -> bool {
        self.slot(s).is_some_and(|x| x.local.load(Relaxed) > 0 || x.rejected.load(Relaxed) > 0)
    }

    /// Lists `s` for the next round again.
    pub fn mark_dirty(&self, s: u32) {
        self.limiter.dirty.lock().push(s);
    }

    /// Takes the locally refused weight (it only feeds the roots' demand meters).
    pub fn take_rejected(&self, s: u32) -> u64 {
        self.slot(s).map_or(0, |x| x.rejected.swap(0, Relaxed))
    }

    pub fn sub_local(&self, s: u32, v: u64) {
        if let Some(x) = self.slot(s) {
            // Never below zero, even if the slot was reset by a delete in between.
            let _ = x.local.fetch_update(Relaxed, Relaxed, |l| Some(l.saturating_sub(v)));
        }
    }

    /// Sets what the rest of the cluster is estimated to add and the cluster's attempted
    /// demand (both milli-units/s; 0, 0 for a cold counter).
    pub fn set_rates(&self, s: u32, inflow: f64, demand: f64) {
        if let Some(x) = self.slot(s) {
            x.rates.store(table::pack_rates(inflow, demand), Relaxed);
        }
    }

    /// The synced fill drained to `now` at the full rate (no extrapolation): what this
    /// limiter knows the cluster has counted.
    pub fn synced(&self, s: u32, now: u64) -> u64 {
        self.slot(s).map_or(0, |x| {
            let (base, at) = x.read_base();
            drain_once(base, x.limit.load(Relaxed), now.saturating_sub(at))
        })
    }

    /// Merges a root's report: `base = max(drained base, reported)` (max of roots, SPEC §1).
    pub fn merge_report(&self, s: u32, fill: u64, now: u64) {
        if let Some(x) = self.slot(s) {
            let v = self.synced(s, now).max(fill);
            x.write_base(v, now);
        }
    }

    /// The raw (`base`, `at`) pair.
    pub fn base(&self, s: u32) -> Option<(u64, u64)> {
        self.slot(s).map(Slot::read_base)
    }

    /// The quota's limit, milli-units/s.
    pub fn limit(&self, s: u32) -> u64 {
        self.slot(s).map_or(0, |x| x.limit.load(Relaxed))
    }

    /// The current inflow estimate, milli-units/s.
    pub fn inflow(&self, s: u32) -> f64 {
        self.slot(s).map_or(0.0, |x| table::unpack_rates(x.rates.load(Relaxed)).0)
    }

    /// The estimator configured on the limiter.
    pub fn estimator(&self) -> Estimator {
        self.limiter.estimator
    }

    /// Folds `v` counted locally into the base when no root took it this round.
    pub fn anchor_local(&self, s: u32, v: u64, now: u64) {
        if let Some(x) = self.slot(s) {
            let b = self.synced(s, now).saturating_add(v);
            x.write_base(b, now);
        }
    }
}

fn hash_id(id: QuotaId) -> u64 {
    // Ids are sequential; spread them over the table with a multiplicative hash.
    id.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

fn store_limits(slot: &Slot, u: &QuotaUpdate) {
    slot.limit.store(u.limits.limit, Relaxed);
    slot.low.store(u.limits.low_burst, Relaxed);
    slot.high.store(u.limits.high_burst, Relaxed);
    slot.epoch.store(u.epoch, Relaxed);
}

/// Shard copies being edited by one [`Limiter::apply_quotas`] call.
struct Touched<'h> {
    shards: HashMap<usize, Shard>,
    /// Per shard: entries and name bytes the batch may add.
    growth: HashMap<usize, (usize, usize)>,
    hasher: &'h foldhash::fast::FixedState,
}

fn shard_mut<'a>(touched: &'a mut Touched<'_>, index: &Index, i: usize) -> &'a mut Shard {
    let (entries, bytes) = touched.growth.get(&i).copied().unwrap_or_default();
    let h = touched.hasher;
    touched.shards.entry(i).or_insert_with(|| {
        index.shards[i].load().copy_with_room(entries, bytes, &|n| h.hash_one(n))
    })
}

/// Names of the quotas currently held (for tests and debugging; walks the whole index).
impl Limiter {
    #[doc(hidden)]
    pub fn names(&self) -> HashSet<String> {
        let w = self.writer.lock();
        let mut out = HashSet::new();
        for i in 0..w.next_slot {
            if self.slots.get(i).is_some_and(|s| s.id.load(Relaxed) != 0) {
                out.insert(self.slot_name(i));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;
