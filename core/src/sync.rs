//! The limiter's side of sync: a pure state machine ([`SyncEngine`]). The background thread
//! and HTTP transport that drive it live in the `yarl-agent` crate, so this crate has no I/O.
//!
//! A round, once per interval:
//! 1. [`SyncEngine::begin_round`] moves what was accounted since the last round (`local`)
//!    into `inflight`, as a new numbered batch, and builds one request per root that is due;
//! 2. the caller sends them (in parallel, each with a timeout) and hands every answer or
//!    failure to [`SyncEngine::on_response`], which merges counters by max and applies quotas;
//!    a root's fill includes the batch, so its share leaves `inflight` at the first report;
//! 3. [`SyncEngine::end_round`] folds what no root reported (none answered, or none knew the
//!    quota yet) into the local base so it keeps draining at the quota's rate.
//!
//! A root that fails keeps its unacknowledged batches (up to `max_pending_batches`, resent
//! unchanged, applied once thanks to `seq`) and is retried with exponential backoff; if its
//! batches overflow or it restarts, the next request carries hints so it catches up at once.
//! `check`/`account` never wait for any of this.
//!
//! # State that outlives an engine
//!
//! The limiter's block keeps the limiter id, the next `seq`, the batch in flight and, per
//! root, its instance, `since`, acknowledged `seq`, backoff and health. An engine built on a
//! block an earlier engine used (the nginx sync agent moved to another worker) continues
//! every root session: no first contact, no refetch of quotas. It resends the batch in
//! flight with its `seq` (the roots apply it once), and sends hints to roots for which the
//! previous engine still held older unacknowledged batches (those lived in its memory).

use crate::limiter::Limiter;
use crate::proto::{DeltaBatch, SyncRequest, SyncResponse, PROTOCOL_VERSION};
use crate::quota::QuotaId;
use crate::shard::Shard;
use crate::zone::roots as zroots;
pub use round::RoundReport;
use round::{Entry, RoundState};
use slot_set::SlotSet;
pub use status::{RootStatus, SyncStatus};
// foldhash, not SipHash: these maps take 100,000s of inserts and lookups per round of
// integer keys the engine produced itself (no attacker chooses them), on the core of a
// worker that serves requests.
use foldhash::HashSet;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// How a limiter syncs.
#[derive(Debug, Clone)]
pub struct SyncConfig {
    /// Time between rounds (default 1 s).
    pub interval: Duration,
    /// Timeout of one call to one root (default 500 ms).
    pub timeout: Duration,
    /// Unacknowledged batches kept per failing root before falling back to hints (default 30).
    pub max_pending_batches: usize,
    /// Longest backoff for a failing root, in intervals (default 8).
    pub max_backoff_intervals: u32,
    /// Start a round early when a quota's traffic surges on this host
    /// ([`SyncEngine::wants_early_round`]; default on).
    pub early: bool,
    /// Ask the roots for answers by interest (default off): each answer carries only the
    /// counters this limiter counted or checked in the roots' interest time (10 s), not
    /// every counter changed in the cluster, so a root's work and an answer's size grow with
    /// what this limiter serves rather than with the cluster's churn. A counter this
    /// limiter meets for the first time is decided on what it knows (nothing, or its last
    /// view) until the next round brings its fill. Turns on
    /// [`LimiterBuilder::watch_checks`](crate::LimiterBuilder::watch_checks) for the
    /// engine's limiter handle.
    pub interest: bool,
}

impl Default for SyncConfig {
    fn default() -> Self {
        SyncConfig {
            interval: Duration::from_secs(1),
            timeout: Duration::from_millis(500),
            max_pending_batches: 30,
            max_backoff_intervals: 8,
            early: true,
            interest: false,
        }
    }
}

/// Why an engine could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// Another engine already drives this limiter; counters must have a single writer.
    #[error("this limiter already has a sync engine")]
    AlreadyAttached,
    /// The interval or timeout is zero.
    #[error("sync interval and timeout must be positive")]
    BadConfig,
    /// More roots than the block keeps sessions for.
    #[error("{0} roots, the most a limiter syncs with is {max}", max = crate::zone::MAX_ROOTS)]
    TooManyRoots(usize),
    /// A shard without roots, more shards than allowed, or a root listed twice.
    #[error("bad shard map: {0}")]
    BadShards(String),
}

/// A request to send to one root.
#[derive(Debug, Clone)]
pub struct RootCall {
    /// Index of the root, to pass back to [`SyncEngine::on_response`].
    pub root: usize,
    /// The root's base URL.
    pub url: String,
    /// The body.
    pub request: SyncRequest,
}

#[derive(Debug)]
struct RootLink {
    url: String,
    /// The shard this root aggregates (0 when unsharded).
    shard: u32,
    /// The root's entry in the block (instance, `since`, acknowledged `seq`, health).
    entry: usize,
    pending: VecDeque<Arc<DeltaBatch>>,
}

/// Slots brought into the cache at a time before a loop works on them
/// (`CounterAccess::warm`): 16 KiB, well inside a core's first-level cache.
const WARM_CHUNK: usize = 128;

/// Early rounds start at least `interval / EARLY_GAP` after the previous round: a surge
/// reaches the roots in slices of a sixteenth of an interval (a quarter made a 10x step
/// admit 2.71 times the limit over 2 s rather than 2.57 in the simulator).
pub const EARLY_GAP: u64 = 16;
/// Early rounds one engine may have in hand: a whole interval of them.
pub const EARLY_BUDGET: u64 = EARLY_GAP;
/// Intervals to earn one early round back.
pub const EARLY_REFILL: u64 = 4;

/// How long after a refetch for quotas that did not fit another may start.
const REFETCH_EVERY_NS: u64 = 300 * 1_000_000_000;

/// The sync state machine of one limiter; see the module docs.
#[derive(Debug)]
pub struct SyncEngine {
    limiter: Arc<Limiter>,
    config: SyncConfig,
    limiter_id: String,
    roots: Vec<RootLink>,
    /// Slots with a non-zero synced fill: hint candidates.
    active: SlotSet,
    /// The first round scanned the block (active slots, a batch left in flight).
    started: bool,
    round: RoundState,
    /// Shards of the counter space (1: unsharded).
    shards: u32,
    /// When the previous round began: this round's batch was counted since then.
    last_began: Option<u64>,
    /// The next round is an early one ([`Self::wants_early_round`]).
    early_next: bool,
    /// Early rounds in hand and when the budget was last refilled (ns, 0 before the first
    /// poll).
    early_budget: (u64, u64),
    /// Called between chunks of a round's long loops ([`Self::set_pacer`]).
    pacer: fn(),
}

impl Drop for SyncEngine {
    fn drop(&mut self) {
        self.limiter.engine_attached.store(false, Ordering::Release);
    }
}

impl SyncEngine {
    /// An engine for `limiter` syncing with `roots` (base URLs; may be empty: then the
    /// engine only anchors local counts so they drain). Only one engine may drive a limiter
    /// handle at a time, and only one handle of a shared block should run one (nginx elects
    /// it with [`Limiter::agent_lease`]).
    pub fn new(
        limiter: Arc<Limiter>,
        roots: Vec<String>,
        config: SyncConfig,
    ) -> Result<SyncEngine, EngineError> {
        Self::build(limiter, roots.into_iter().map(|u| (u, 0)).collect(), 1, config)
    }

    /// An engine for a sharded root tier: `shards[k]` are the roots of shard `k` (see
    /// [`crate::shard`]). Each counter's deltas and hints go to the roots of its shard only;
    /// quotas come from every root. At least one root per shard, at most
    /// [`crate::shard::MAX_SHARDS`] shards and [`crate::zone::MAX_ROOTS`] roots in all.
    pub fn sharded(
        limiter: Arc<Limiter>,
        shards: Vec<Vec<String>>,
        config: SyncConfig,
    ) -> Result<SyncEngine, EngineError> {
        let n = shards.len();
        if n == 0 || n > crate::shard::MAX_SHARDS as usize {
            return Err(EngineError::BadShards(format!(
                "{n} shards, from 1 to {} are possible",
                crate::shard::MAX_SHARDS
            )));
        }
        if let Some(k) = shards.iter().position(Vec::is_empty) {
            return Err(EngineError::BadShards(format!("shard {k}/{n} has no roots")));
        }
        let roots: Vec<(String, u32)> = shards
            .into_iter()
            .enumerate()
            .flat_map(|(k, urls)| urls.into_iter().map(move |u| (u, k as u32)))
            .collect();
        Self::build(limiter, roots, n as u32, config)
    }

    fn build(
        limiter: Arc<Limiter>,
        roots: Vec<(String, u32)>,
        shards: u32,
        config: SyncConfig,
    ) -> Result<SyncEngine, EngineError> {
        if config.interval.is_zero() || config.timeout.is_zero() {
            return Err(EngineError::BadConfig);
        }
        if roots.len() > crate::zone::MAX_ROOTS {
            return Err(EngineError::TooManyRoots(roots.len()));
        }
        let mut seen = HashSet::default();
        if let Some((u, _)) = roots.iter().find(|(u, _)| !seen.insert(zroots::url_hash(u))) {
            return Err(EngineError::BadShards(format!("root {u} is listed twice")));
        }
        if limiter.engine_attached.swap(true, Ordering::AcqRel) {
            return Err(EngineError::AlreadyAttached);
        }
        if config.interest {
            limiter.watch_checks.store(true, Ordering::Relaxed);
        }
        let now = limiter.clock().now_nanos();
        let urls: Vec<String> = roots.iter().map(|(u, _)| u.clone()).collect();
        let entries = limiter.roots_table().claim(&urls, now);
        let roots = roots
            .into_iter()
            .zip(entries)
            .map(|((url, shard), entry)| {
                let e = limiter.root_entry(entry);
                if e.get(zroots::PENDING) > 0 {
                    // The previous engine had batches this root never acknowledged; they
                    // were in its memory. Hints bring the root up to date instead.
                    e.set(zroots::FLAGS, e.get(zroots::FLAGS) | zroots::FLAG_HINTS);
                    e.set(zroots::PENDING, 0);
                }
                RootLink { url, shard, entry, pending: VecDeque::new() }
            })
            .collect();
        Ok(SyncEngine {
            limiter_id: limiter.limiter_id(),
            limiter,
            config,
            roots,
            active: SlotSet::default(),
            started: false,
            round: RoundState::default(),
            shards,
            last_began: None,
            early_next: false,
            early_budget: (EARLY_BUDGET, 0),
            pacer: crate::limiter::no_pace,
        })
    }

    /// The limiter this engine drives.
    pub fn limiter(&self) -> &Arc<Limiter> {
        &self.limiter
    }

    /// Sets what the engine calls between chunks of the long loops of a round (about 128
    /// counters each: tens of microseconds): the embedder's place to give the CPU away. The
    /// engine's work is pure computation on the block; a round with 100,000s of changed
    /// counters takes tens of milliseconds, and a thread that shares its CPU with the
    /// requests it limits (the nginx module's agent, on its worker's CPU) holds that CPU
    /// until the scheduler's next tick unless it yields (`yarl-agent` does, see its
    /// `pace`). Default: nothing.
    pub fn set_pacer(&mut self, pacer: fn()) {
        self.pacer = pacer;
    }

    /// The configuration.
    pub fn config(&self) -> &SyncConfig {
        &self.config
    }

    /// The root URLs, in the order `RootCall::root` indexes them.
    pub fn root_urls(&self) -> impl Iterator<Item = &str> {
        self.roots.iter().map(|r| r.url.as_str())
    }

    /// The batch a previous engine left in flight, rebuilt from the slots' `inflight`.
    fn recover(&mut self) -> Option<(u64, Vec<Entry>)> {
        use crate::zone::slot::{BASE, INFLIGHT, LOCAL};
        let l = &self.limiter;
        let active = l.scan_slots(|s| s.get(BASE) > 0 || s.get(LOCAL) > 0 || s.get(INFLIGHT) > 0);
        self.active.extend(active);
        let seq = l.inflight_seq();
        if seq == 0 {
            return None;
        }
        let slots = l.scan_slots(|s| s.get(INFLIGHT) > 0);
        let entries = l.with_counters(|c| {
            slots
                .into_iter()
                .filter_map(|s| Some((s, c.id_of(s)?, c.inflight(s), 0)))
                .collect::<Vec<_>>()
        });
        Some((seq, entries))
    }

    /// Starts a round at `now`: returns the calls to make.
    pub fn begin_round(&mut self, now: u64) -> Vec<RootCall> {
        let recovered = if self.started {
            None
        } else {
            self.started = true;
            self.recover()
        };
        let early = std::mem::take(&mut self.early_next);
        let interest = self.config.interest;
        let mut watched: Vec<QuotaId> = Vec::new();
        let mut entries = Vec::new();
        let seq = match recovered {
            Some((seq, recovered)) => {
                entries = recovered;
                seq
            }
            None => {
                let dirty = self.limiter.take_dirty();
                let interval = u64::try_from(self.config.interval.as_nanos()).unwrap_or(u64::MAX);
                let since = match self.limiter.round_began() {
                    0 => interval,
                    b => now.saturating_sub(b).max(1),
                } as f64
                    * 1e-9;
                self.limiter.with_counters_paced(self.pacer, |c| {
                    for chunk in dirty.chunks(WARM_CHUNK) {
                        c.warm(chunk.iter().copied());
                        for &s in chunk {
                            let (v, r) = (c.take_local(s), c.take_rejected(s));
                            // What the request path compares its count with for an early
                            // round; early rounds leave it, so a surge that lasts keeps
                            // asking for them until the next regular round measures it.
                            if !early {
                                c.set_own_rate(s, v.saturating_add(r) as f64 / since);
                            }
                            match (v > 0 || r > 0, c.id_of(s)) {
                                (true, Some(id)) => entries.push((s, id, v, r)),
                                // Only checked (answers by interest): named, not counted.
                                (false, Some(id)) if interest => watched.push(id),
                                _ => {}
                            }
                        }
                    }
                });
                if entries.is_empty() {
                    0
                } else {
                    self.limiter.next_seq()
                }
            }
        };
        let round = RoundState::new(now, early, entries, self.shards);
        self.limiter.set_round_began(now);
        let seen_epoch = self.limiter.seen_epoch();
        // One batch per shard, all with this round's `seq`: each shard's roots get only
        // their counters' deltas, and an empty batch where a shard has none, so every root
        // sees every `seq` (a root refuses a `seq` far ahead of what it acknowledged).
        // Sorted by id, which protocol v2 encodes in a byte or two.
        let batches: Vec<Option<Arc<DeltaBatch>>> = if round.entries.is_empty() {
            vec![None; self.shards as usize]
        } else {
            self.limiter.set_inflight_seq(seq);
            let mut per: Vec<Vec<(QuotaId, u64, u64)>> = vec![Vec::new(); self.shards as usize];
            for &(id, k) in &round.by_id {
                let (_, _, v, r) = round.entries[k as usize];
                per[Shard::of(id, self.shards) as usize].push((id, v, r));
            }
            per.into_iter()
                .map(|deltas| Some(Arc::new(DeltaBatch { seq, deltas, epoch: Some(seen_epoch) })))
                .collect()
        };
        self.round = round;
        let mut watch: Vec<Vec<QuotaId>> = vec![Vec::new(); self.shards as usize];
        for id in watched {
            watch[Shard::of(id, self.shards) as usize].push(id);
        }
        for w in &mut watch {
            w.sort_unstable();
        }

        let epoch = self.limiter.epoch();
        let mut calls = Vec::new();
        for (i, link) in self.roots.iter_mut().enumerate() {
            let e = self.limiter.root_entry(link.entry);
            if let Some(b) = &batches[link.shard as usize] {
                if e.get(zroots::ACKED) < b.seq {
                    link.pending.push_back(b.clone());
                }
                if link.pending.len() > self.config.max_pending_batches {
                    link.pending.pop_front();
                    e.set(zroots::FLAGS, e.get(zroots::FLAGS) | zroots::FLAG_HINTS);
                }
            }
            e.set(zroots::PENDING, link.pending.len() as u64);
            let skip = e.get(zroots::SKIP);
            if skip > 0 {
                e.set(zroots::SKIP, skip - 1);
                continue;
            }
            let instance = Some(e.get(zroots::INSTANCE)).filter(|&i| i != 0);
            let hints = if e.get(zroots::FLAGS) & zroots::FLAG_HINTS != 0
                || (instance.is_none() && !self.active.is_empty())
            {
                collect_hints(&self.limiter, &self.active, now, link.shard, self.shards)
            } else {
                Vec::new()
            };
            calls.push(RootCall {
                root: i,
                url: link.url.clone(),
                request: SyncRequest {
                    v: PROTOCOL_VERSION,
                    limiter: self.limiter_id.clone(),
                    root_instance: instance,
                    since: e.get(zroots::SINCE),
                    epoch,
                    batches: link.pending.iter().map(|b| (**b).clone()).collect(),
                    hints,
                    seen_epoch: Some(self.limiter.seen_epoch()),
                    interest,
                    watch: watch[link.shard as usize].clone(),
                },
            });
            e.set(zroots::LAST_ATTEMPT, now.max(1));
        }
        calls
    }

    /// Hands the result of the call to root `root` to the engine.
    pub fn on_response(
        &mut self,
        root: usize,
        result: Result<SyncResponse, String>,
        latency: Duration,
        now: u64,
    ) {
        let max_backoff = self.config.max_backoff_intervals.max(1);
        let shards = self.shards;
        let Some(link) = self.roots.get_mut(root) else { return };
        let e = self.limiter.root_entry(link.entry);
        let want = (shards > 1).then_some(Shard { index: link.shard, count: shards });
        let resp = match result {
            Ok(r) if r.v == PROTOCOL_VERSION && r.shard != want => {
                let show = |s: Option<Shard>| {
                    s.map_or("every counter".to_string(), |s| format!("shard {s}"))
                };
                let msg = format!("root serves {}, configured as {}", show(r.shard), show(want));
                return fail(e, &msg, max_backoff);
            }
            Ok(r) if r.v == PROTOCOL_VERSION => r,
            Ok(r) => return fail(e, &format!("root speaks protocol version {}", r.v), max_backoff),
            Err(err) => return fail(e, &err, max_backoff),
        };
        let known = e.get(zroots::INSTANCE);
        let flags = e.get(zroots::FLAGS) & !zroots::FLAG_HINTS;
        // A root that restarted lost its counters: tell it what we know next round.
        let restarted = known != 0 && known != resp.root_instance;
        e.set(zroots::FLAGS, flags | if restarted { zroots::FLAG_HINTS } else { 0 });
        e.set(zroots::INSTANCE, resp.root_instance);
        e.set(zroots::SINCE, resp.version);
        e.set(zroots::ACKED, resp.acked_seq);
        link.pending.retain(|b| b.seq > resp.acked_seq);
        e.set(zroots::SKIP, 0);
        status::record_success(e, latency, now, link.pending.len());

        if !resp.quotas.is_empty() {
            let (_, resets) = self.limiter.apply_quotas_with_resets(&resp.quotas);
            // Counts of this round's batch in a reset counter are gone with it: neither
            // take them out of `inflight` again nor fold them back in at the end.
            for s in resets {
                self.round.drop_reset(s);
            }
        }
        if !resp.more {
            self.limiter.raise_epoch(resp.epoch);
        }
        let round = &mut self.round;
        let active = &mut self.active;
        let root_epoch = resp.root_epoch;
        let limiter = &self.limiter;
        let shard = link.shard;
        self.limiter.with_counters_paced(self.pacer, |c| {
            let mut slots = Vec::with_capacity(WARM_CHUNK);
            for chunk in resp.counters.chunks(WARM_CHUNK) {
                // Each id's slot and entry first, all at once (see `CounterAccess::warm`).
                slots.clear();
                slots.extend(chunk.iter().map(|&(id, ..)| {
                    if shards > 1 && Shard::of(id, shards) != shard {
                        return None;
                    }
                    match round.entry_of_id(id) {
                        Some(k) => Some((round.entries[k].0, Some(k))),
                        None => c.slot_of(id).map(|s| (s, round.entry_of(s))),
                    }
                }));
                c.warm(slots.iter().flatten().map(|x| x.0));
                if root_epoch.is_some() {
                    c.warm_versions(slots.iter().flatten().map(|x| x.0));
                }
                for (&(id, fill, demand), &slot) in chunk.iter().zip(&slots) {
                    let Some((mut s, mut entry)) = slot else { continue };
                    if entry.is_some() && c.id_of(s) != Some(id) {
                        // The batch's slot no longer holds this quota (deleted, maybe reused,
                        // while the round was in flight): look it up where it is now, if
                        // anywhere, as for a counter outside the batch.
                        let Some(now_at) = c.slot_of(id) else { continue };
                        (s, entry) = (now_at, round.entry_of(now_at));
                    }
                    if root_epoch.is_some_and(|re| re < limiter.version_of(s)) {
                        // The root has not seen the version held here (maybe a reset): its
                        // fill may hold counts the reset dropped. Other roots have it.
                        continue;
                    }
                    let facts = round.facts_mut(s, entry);
                    if facts.seen.is_none() {
                        facts.seen = c.base(s);
                    }
                    c.merge_report(s, fill, now);
                    facts.demand = facts.demand.max(demand);
                    active.insert(s);
                    if let Some(v) = round.report(entry, id) {
                        // The root's fill includes this round's batch: take it out of
                        // `inflight` now, or the estimate counts it twice until the slowest
                        // root answers.
                        c.sub_inflight(s, v);
                    }
                }
            }
        });
        round.any_ok = true;
        if let Some(ok) = round.ok_shards.get_mut(shard as usize) {
            *ok = true;
        }
        round.more |= resp.more;
    }

    /// Finishes the round at `now`.
    pub fn end_round(&mut self, now: u64) -> RoundReport {
        let mut round = std::mem::take(&mut self.round);
        round.merge_others();
        let last_began = self.last_began.replace(round.began);
        let active = &mut self.active;
        let shards = self.shards;
        let interval = u64::try_from(self.config.interval.as_nanos()).unwrap_or(u64::MAX);
        // How long this round's batch was counted over: since the previous round began, but
        // no less than the shortest gap between early rounds.
        let round_ns = last_began
            .map_or(interval, |b| round.began.saturating_sub(b).max(interval / EARLY_GAP));
        let prune = self.limiter.zone_status().rounds % 16 == 0;
        self.limiter.with_counters_paced(self.pacer, |c| {
            let estimator = c.estimator();
            // Fold this round's batch into the local view.
            for (k, &(s, id, v, _)) in round.entries.iter().enumerate() {
                if k % WARM_CHUNK == 0 {
                    let next = round.entries[k..].iter().take(WARM_CHUNK);
                    c.warm(next.map(|e| e.0));
                }
                // A slot deleted (and reused) while the round was in flight is not this entry's.
                if c.id_of(s) != Some(id) {
                    continue;
                }
                if !round.reported[k] {
                    // No root took it (none answered, or none knows the quota yet): fold it
                    // into the local view so it keeps draining.
                    c.anchor(s, v, now);
                    c.sub_inflight(s, v);
                }
                if c.has_pending(s) {
                    c.mark_dirty(s);
                }
                active.insert(s);
            }
            if round.any_ok {
                // What the rest of the cluster adds: reported counters are hot, the others
                // did not change at any root this round and are cold.
                // A cold counter leaves the set as soon as it has nothing left (no fill, no
                // counts in flight): visiting every counter touched since the last prune,
                // each round, took 100s of ms per round of the agent's core under random-key
                // traffic (a million slots). It comes back when it is counted or reported.
                let mut walk = round.walk();
                active.retain_in_chunks(
                    WARM_CHUNK,
                    |run| c.warm(run.iter().copied()),
                    |s| {
                        let Some(id) = c.id_of(s) else { return false };
                        let (own, facts) = walk.at(s, id);
                        if round.silent_shard(id, shards) {
                            // No root of its shard answered: nothing is known, keep the rates.
                            return true;
                        }
                        if !round.early && own.is_none() {
                            // Nothing counted here in a whole interval: no rate to run ahead of.
                            c.set_own_rate(s, 0.0);
                        }
                        let Some(before) = facts.seen else {
                            c.set_rates(s, 0.0, 0.0);
                            return c.is_active(s, now);
                        };
                        let sample = inflow::Sample {
                            limit: c.limit(s),
                            before,
                            after: c.base(s).unwrap_or((0, now)),
                            own: own.unwrap_or(0),
                            round_ns,
                            interval_ns: interval,
                            inflow: c.inflow(s),
                        };
                        let inflow = inflow::estimate(estimator, &sample);
                        let demand = facts.demand as f64;
                        c.set_rates(s, inflow, demand);
                        true
                    },
                );
            } else {
                for &(s, ..) in &round.entries {
                    c.set_rates(s, 0.0, 0.0);
                }
            }
            if prune {
                active.retain_in_chunks(
                    WARM_CHUNK,
                    |run| c.warm(run.iter().copied()),
                    |s| c.is_active(s, now),
                );
            }
        });
        self.limiter.set_inflight_seq(0);
        self.limiter.set_local_since(round.began);
        // Fresh only if every shard answered: a counter of a silent shard is as stale as
        // when no root answers.
        self.limiter.set_cluster_fresh(round.ok_shards.iter().all(|&ok| ok) && round.any_ok);
        self.limiter.count_round(now);
        if round.any_ok && !round.more {
            self.maybe_refetch(now);
        }
        RoundReport { any_ok: round.any_ok, more: round.more }
    }

    /// Whether to start a round now, before the interval is up: a request path saw this
    /// host's own traffic on a quota run well ahead of what it counted in its last regular
    /// round (a surge the roots should hear of now, not an interval later). Rounds stay at
    /// least `interval /` [`EARLY_GAP`] apart, and a budget of [`EARLY_BUDGET`] rounds,
    /// refilled by one every [`EARLY_REFILL`] intervals, caps what they can ever add to a
    /// root's load at a quarter of the regular rounds, whatever the traffic looks like.
    /// Poll it every few milliseconds.
    pub fn wants_early_round(&mut self, now: u64) -> bool {
        let interval = u64::try_from(self.config.interval.as_nanos()).unwrap_or(u64::MAX);
        if !self.config.early {
            return false;
        }
        if self.last_began.is_some_and(|b| now.saturating_sub(b) < interval / EARLY_GAP) {
            return false;
        }
        let refill = interval.saturating_mul(EARLY_REFILL).max(1);
        let (tokens, at) = &mut self.early_budget;
        if *at == 0 {
            *at = now;
        }
        let earned = now.saturating_sub(*at) / refill;
        if earned > 0 {
            *tokens = (*tokens).saturating_add(earned).min(EARLY_BUDGET);
            *at = at.saturating_add(earned.saturating_mul(refill));
        }
        if *tokens == 0 || !self.limiter.take_urgent() {
            return false;
        }
        *tokens -= 1;
        self.limiter.count_early_round();
        self.early_next = true;
        true
    }

    /// Quotas that did not fit stay unlimited; once there is room for them (quotas were
    /// deleted), fetch everything again so they arrive, at most every five minutes.
    fn maybe_refetch(&self, now: u64) {
        let missing = self.limiter.missing_count();
        if missing == 0 {
            return;
        }
        let u = self.limiter.zone_usage();
        let room = u.capacity.saturating_sub(u.quotas);
        let last = self.limiter.last_refetch();
        if (room >= missing || room >= u.capacity / 10)
            && (last == 0 || now.saturating_sub(last) >= REFETCH_EVERY_NS)
        {
            self.limiter.refetch_all(now);
        }
    }
}

fn fail(e: zroots::Entry<'_>, error: &str, max_backoff: u32) {
    let consecutive = status::record_failure(e, error);
    let exp = consecutive.saturating_sub(1).min(16) as u32;
    e.set(zroots::SKIP, u64::from((1u32 << exp).min(max_backoff) - 1));
    // It may come back having lost what it had: it gets our view with its next request.
    e.set(zroots::FLAGS, e.get(zroots::FLAGS) | zroots::FLAG_HINTS);
}

fn collect_hints(
    limiter: &Limiter,
    active: &SlotSet,
    now: u64,
    shard: u32,
    shards: u32,
) -> Vec<(QuotaId, u64)> {
    // In slot order, which is close to id order for quotas loaded together.
    let mut hints: Vec<(QuotaId, u64)> = limiter.with_counters(|c| {
        active
            .iter()
            .filter_map(|s| {
                let v = c.synced(s, now);
                Some((c.id_of(s)?, v)).filter(|&(id, _)| v > 0 && Shard::of(id, shards) == shard)
            })
            .collect()
    });
    hints.sort_unstable_by_key(|h| h.0);
    hints
}

mod inflow;
mod round;
mod slot_set;
mod status;
#[cfg(test)]
mod tests;
