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
//!
//! # Where things are
//!
//! This file holds the engine's state machine. Beside it: the inflow estimate, a pure
//! function of one counter's numbers (`inflow.rs`); one round's batch and what the answers
//! said of it (`round.rs`); each root's session, its pending batches, backoff and hints
//! (`session.rs`); and what the engine reports of itself (`status.rs`).

use crate::limiter::Limiter;
use crate::proto::{DeltaBatch, SyncRequest, SyncResponse, PROTOCOL_VERSION};
use crate::quota::{Epoch, QuotaId};
use crate::root::demand::DEMAND_WINDOW_NS;
use crate::shard::Shard;
use crate::zone::keys::is_key_id;
use crate::zone::roots as zroots;
use foldhash::HashSet;
pub use round::RoundReport;
use round::{Entry, RoundState};
use session::RootLink;
use slot_set::SlotSet;
pub use status::{RootStatus, SyncStatus};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Longest an answer stays out of the view after a root of its shard restarted, in
/// intervals (see [`SyncEngine::holds_view`]).
const VIEW_HOLD_INTERVALS: u64 = 4;

/// How a limiter syncs.
#[derive(Debug, Clone)]
pub struct SyncConfig {
    /// Time between rounds (default 1 s).
    pub interval: Duration,
    /// Timeout of one call to one root (default 500 ms).
    pub timeout: Duration,
    /// Unacknowledged batches kept per failing root before falling back to hints (default 30).
    pub max_pending_batches: usize,
    /// Longest backoff for a failing root, in intervals (default 1: no round is skipped).
    /// Kept short: while a limiter backs off from every root it decides on its own count,
    /// so a healed cut is only over once it calls again (8 let a cut-off nginx admit alone
    /// for up to 4 s after the heal in `make chaos`; 2 converged in 0.8–1.5 s, 1 in
    /// 0.4–0.9 s). Calling a failing root every round adds no load: one call per interval
    /// is the normal rate, and a call to a root that is down is refused at once or times
    /// out beside the calls to the other roots.
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
    /// Most entries (deltas, batches, hints, watched ids) one call carries (default
    /// 1,000,000, half what a root takes by default). Batches that root has not taken go
    /// oldest first up to it, the rest at the next rounds: after an outage a busy limiter's
    /// backlog (30 batches of every quota it serves) would otherwise make every call larger
    /// than a root accepts (`413`), and the limiter would never catch up.
    pub max_call_entries: usize,
}

impl Default for SyncConfig {
    fn default() -> Self {
        SyncConfig {
            interval: Duration::from_secs(1),
            timeout: Duration::from_millis(500),
            max_pending_batches: 30,
            max_backoff_intervals: 1,
            early: true,
            interest: false,
            max_call_entries: 1_000_000,
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
    /// The interval or timeout is zero or longer than [`MAX_SYNC_TIME`].
    #[error("sync interval and timeout must be positive and at most an hour")]
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

/// Slots brought into the cache at a time before a loop works on them
/// (`CounterAccess::warm`): 16 KiB, well inside a core's first-level cache.
const WARM_CHUNK: usize = 128;

/// Early rounds start at least `interval / EARLY_GAP` after the previous round: a surge
/// reaches the roots in slices of a sixteenth of an interval, where coarser slices let a
/// step run further past the limit before the roots hear of it.
pub const EARLY_GAP: u64 = 16;

/// The longest sync interval or timeout an engine takes: far beyond any useful one, and
/// far from where adding it to a clock's reading overflows (a panic in the sync task).
pub const MAX_SYNC_TIME: Duration = Duration::from_secs(3_600);
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
    /// Per slot, in slot order: what of its `local` counts had drained when this engine
    /// began by resending a batch left in flight (see [`Self::recover`]); spent by the next
    /// cut.
    drained_before: Vec<(u32, QuotaId, u64)>,
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
    /// Keys reset lately (wire id, the reset's epoch): a root that has not read the reset
    /// yet may still answer the fill it counted before, which a max-merge would bring
    /// back. A quota's slot holds its version for that check; a key's slot has no room for
    /// one, so its reset waits here until every root's answers are past it.
    key_resets: HashMap<QuotaId, Epoch>,
    /// Each root's latest `root_epoch` (0: none yet, or a root that sends none).
    root_epochs: Vec<Epoch>,
    /// Keys the roots reported (answers of every change) while this limiter did not hold
    /// them by id: their fill, demand and when. A key a request path meets here for the
    /// first time takes them at the agent's next poll, between rounds or while one waits
    /// for its roots ([`Self::adopt_keys`]), so a client already
    /// known to the cluster is decided on the cluster's count and rate, not on the guess a
    /// key new to every host needs (see `Slot::estimate`).
    reported_keys: HashMap<QuotaId, Reported>,
    /// Per batch still pending at some root (by `seq` and shard: each shard's roots get
    /// their part of a round's batch under the same `seq`): the templates of its keys,
    /// found when it was first sent. A root that does not answer gets every pending batch
    /// again each round (up to `max_pending_batches`), and looking their keys up again
    /// each time cost a probe of the writer's id index per key per round.
    batch_templates: HashMap<(u64, u32), Templates>,
    /// The block's count of keys inserted when [`Self::adopt_keys`] last looked
    /// (`u64::MAX`: look at the next call).
    keys_seen: u64,
    /// Concurrency counters: the roots' grants, the reports (`sync/in_flight.rs`).
    in_flight: in_flight::InFlight,
    /// A share shrank in an answer: report again at the next poll.
    in_flight_ack: bool,
    /// Per shard: when an answer's fills were last merged into this limiter's view (0:
    /// not since this engine began). Hints are read from that view, so a root that started
    /// after it knows they hold none of the batches it sums (`SyncRequest::view_age_ns`).
    view_at: Vec<u64>,
    /// An answer showed a root that restarted and got no hints: it lacks every count but
    /// what it summed since, until the next request brings them, so that one goes early.
    restart_seen: bool,
    /// Per shard: when an answer last showed a root of it restarted (0: never). Until
    /// every root of the shard has answered since and taken its hints, or
    /// [`VIEW_HOLD_INTERVALS`] have passed, answers stay out of the view
    /// ([`Self::holds_view`]).
    restart_at: Vec<u64>,
    /// Per shard, this round: some answer was kept out of the view (a restarted root, or
    /// held), and some answer was merged into it. A shard with the first and not the
    /// second is *held*: nothing new is known of the cluster, so its counters keep their
    /// rates (what the others add). Taken as news, the answers of a restarted root (an
    /// empty demand meter) zeroed them, and every host admitted the whole limit alone
    /// while the view was held (`make chaos`, both roots killed: 2.4 x the limit for a
    /// second).
    kept_out: Vec<bool>,
    merged: Vec<bool>,
    /// Per shard: no root of it answered the last round. This host then decided on its
    /// own count, and its batches reach the roots late, past their meters: what it counted
    /// meanwhile is no share of a cluster-wide rate.
    silent: Vec<bool>,
}

/// How an answer's counters reach the view ([`SyncEngine::merge_counters`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Merge {
    /// Not at all: the answer is kept out.
    No,
    /// By max.
    Yes,
    /// By max, but a report below the view keeps what the request path extrapolates from
    /// it: a root of the shard restarted lately.
    KeepingExtrapolation,
}

/// A key a root reported while this limiter did not hold it ([`SyncEngine::adopt_keys`]).
#[derive(Debug, Default, Clone, Copy)]
struct Reported {
    fill: u64,
    demand: u64,
    /// When the latest report came.
    when: u64,
    /// When the first came: a key reported for less than an interval is new to the roots.
    since: u64,
}

/// Keys reset lately that [`SyncEngine`] remembers at most (the oldest go first): roots
/// read a reset within a poll, so more than this many in a few seconds is a bulk job whose
/// oldest resets have long reached every root.
const MAX_KEY_RESETS: usize = 4096;

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
        let bad = |t: Duration| t.is_zero() || t > MAX_SYNC_TIME;
        if bad(config.interval) || bad(config.timeout) {
            return Err(EngineError::BadConfig);
        }
        // Roots refuse a request with more.
        let config = SyncConfig {
            max_pending_batches: config.max_pending_batches.min(crate::proto::MAX_BATCHES),
            ..config
        };
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
                RootLink::resume(url, shard, entry, limiter.root_entry(entry))
            })
            .collect();
        Ok(SyncEngine {
            limiter_id: limiter.wire_id(),
            limiter,
            config,
            roots,
            active: SlotSet::default(),
            started: false,
            drained_before: Vec::new(),
            round: RoundState::default(),
            shards,
            last_began: None,
            early_next: false,
            early_budget: (EARLY_BUDGET, 0),
            pacer: crate::limiter::no_pace,
            key_resets: HashMap::new(),
            root_epochs: Vec::new(),
            reported_keys: HashMap::new(),
            batch_templates: HashMap::new(),
            keys_seen: u64::MAX,
            in_flight: in_flight::InFlight::default(),
            in_flight_ack: false,
            view_at: vec![0; shards as usize],
            restart_seen: false,
            restart_at: vec![0; shards as usize],
            kept_out: vec![false; shards as usize],
            merged: vec![false; shards as usize],
            silent: vec![false; shards as usize],
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

    /// The sync interval in clock nanoseconds.
    fn interval_ns(&self) -> u64 {
        u64::try_from(self.config.interval.as_nanos()).unwrap_or(u64::MAX)
    }

    /// Whether `shard`'s view was merged, or held, within a horizon before `began` (a
    /// round's start: judged at its end, a round of an interval that had waited for its
    /// timeouts would be past a horizon as long as the interval).
    fn recent_view(&self, shard: u32, began: u64) -> bool {
        let t = self.view_at[shard as usize];
        (t != 0 && began.saturating_sub(t) <= self.limiter.horizon_ns())
            || self.lately_held(shard, began)
    }

    /// Whether a root of `shard` restarted lately enough that views may still be held, or
    /// extrapolated from a held view's time (see `CounterAccess::merge_report`).
    fn lately_held(&self, shard: u32, now: u64) -> bool {
        let t = self.restart_at[shard as usize];
        let span = self.interval_ns().saturating_mul(2 * VIEW_HOLD_INTERVALS + 1);
        t != 0 && now.saturating_sub(t) <= span
    }

    /// Whether root `root`'s answer stays out of the view, though the root did not restart:
    /// a root of its shard restarted lately, and another root of the shard has not answered
    /// since, or still waits for hints. Hints are read from the view; once it holds what a
    /// restarted root summed since its start, it is newer than that start, and a root that
    /// restarted too and gets its hints from it merges them by max: whatever it summed that
    /// the view lacked (the batches other limiters sent it and not the first root, or not
    /// yet) would be lost. Held, the view stays as it was before the restarts, each root
    /// adds the hints to what it summed, and this limiter's batches fold in as in a round no
    /// root answered (and stay pending). For at most [`VIEW_HOLD_INTERVALS`], and only for
    /// roots that answered within as long before the restart: a root that stays down must
    /// not keep this host from the cluster's counts.
    fn holds_view(&self, root: usize, now: u64) -> bool {
        let Some(link) = self.roots.get(root) else { return false };
        let shard = link.shard;
        let t = self.restart_at[shard as usize];
        let window = self.interval_ns().saturating_mul(VIEW_HOLD_INTERVALS);
        if t == 0 || now.saturating_sub(t) > window {
            return false;
        }
        // A root that had not answered for as long before the restart is down, not coming
        // back with it: when it does, it either started after this view (its hints add)
        // or knows this limiter (they are skipped). Waiting for it gains nothing.
        self.roots.iter().enumerate().any(|(j, l)| {
            j != root
                && l.shard == shard
                && l.answered_at.saturating_add(window) >= t
                && (l.answered_at < t
                    || l.wants_hints(self.limiter.root_entry(l.entry), &self.active))
        })
    }

    /// The root URLs, in the order `RootCall::root` indexes them.
    pub fn root_urls(&self) -> impl Iterator<Item = &str> {
        self.roots.iter().map(|r| r.url.as_str())
    }

    /// The batch a previous engine left in flight, rebuilt from the slots' `inflight`.
    fn recover(&mut self, now: u64) -> Option<(u64, Vec<Entry>)> {
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
        // This round's answer moves each view to now, from where the counts still in
        // `local` (made while the engine before this one stalled, maybe for seconds) drain
        // as if they came now; the next cut says what of them had drained before.
        let pending = l.scan_slots(|s| s.get(LOCAL) > 0);
        self.drained_before = l.with_counters(|c| {
            pending
                .into_iter()
                .filter_map(|s| Some((s, c.id_of(s)?, c.own_drained(s, c.local(s), 0, now, false))))
                .filter(|&(.., d)| d > 0)
                .collect()
        });
        Some((seq, entries))
    }

    /// Starts a round at `now`: returns the calls to make.
    pub fn begin_round(&mut self, now: u64) -> Vec<RootCall> {
        let recovered = if self.started {
            None
        } else {
            self.started = true;
            self.recover(now)
        };
        let early = std::mem::take(&mut self.early_next);
        let (seq, entries, drained, watched) = match recovered {
            Some((seq, entries)) => (seq, entries, Vec::new(), Vec::new()),
            None => {
                let (entries, drained, watched) = self.take_counts(now, early);
                self.drained_before = Vec::new();
                let seq = if entries.is_empty() { 0 } else { self.limiter.next_seq() };
                (seq, entries, drained, watched)
            }
        };
        let mut round = RoundState::new(now, early, entries, self.shards);
        round.drained = drained;
        self.limiter.set_round_began(now);
        if !round.entries.is_empty() {
            self.limiter.set_inflight_seq(seq);
        }
        let batches = round.batches(seq, self.limiter.seen_epoch(), self.shards);
        self.round = round;
        let mut watch: Vec<Vec<QuotaId>> = vec![Vec::new(); self.shards as usize];
        for id in watched {
            watch[Shard::of(id, self.shards) as usize].push(id);
        }
        for w in &mut watch {
            w.sort_unstable();
        }
        let shards: Vec<u32> = self.roots.iter().map(|l| l.shard).collect();
        // Half an interval: what an early round for a starving host waits at least.
        let min_span = self.interval_ns() / 2;
        let reports = self.in_flight.reports(&self.limiter, &shards, self.shards, now, min_span);
        self.root_calls(now, &batches, &watch, reports)
    }

    /// Takes what was counted since the last round out of the dirty slots: the batch, in
    /// slot order, what of each entry this limiter's own bucket drained (empty when none
    /// did), and the quotas that were only checked (named to the roots when answers go by
    /// interest).
    fn take_counts(&self, now: u64, early: bool) -> (Vec<Entry>, Vec<u64>, Vec<QuotaId>) {
        let interest = self.config.interest;
        let dirty = self.limiter.take_dirty();
        let since = match self.limiter.round_began() {
            0 => self.interval_ns(),
            b => now.saturating_sub(b).max(1),
        } as f64
            * 1e-9;
        // A root adds a batch's counts when it arrives, up to an interval after they were
        // made: to a counter that stood empty meanwhile, counts its exact bucket drained as
        // they came (a key under its limit) arrive whole, and every host read the key up to
        // an interval of its limit fuller than it was (false rejections of keys under their
        // limit in docs/accuracy.md's Zipf keys). Counts made over a long span (the agent's
        // worker stalled, or another took the role over) arrive whole the same way, a
        // span's worth (`make chaos`, the agent stopped: a quota at 0.9 x its limit
        // refused). Said with what had drained, the root credits that part with the drain
        // its counter wasted meanwhile.
        let mut drained = Vec::new();
        let (mut entries, mut watched, mut keys) = (Vec::new(), Vec::new(), Vec::new());
        let first_key = self.limiter.key_slots().start;
        self.limiter.with_counters_paced(self.pacer, |c| {
            for chunk in dirty.chunks(WARM_CHUNK) {
                c.warm(chunk.iter().copied());
                for &s in chunk {
                    let (v, r) = (c.take_local(s), c.take_rejected(s));
                    // What the request path compares its count with for an early round;
                    // early rounds leave it, so a surge that lasts keeps asking for them
                    // until the next regular round measures it.
                    if !early {
                        c.set_own_rate(s, v.saturating_add(r) as f64 / since);
                    }
                    let id = c.id_of(s);
                    // Keys new to the writer, told by their slot's mark: the slot is in the
                    // cache now, and the writer's map of a million ids is not.
                    if let Some(id) = id.filter(|&id| s >= first_key && !c.key_known(s, id)) {
                        keys.push((s, id));
                    }
                    match (v > 0 || r > 0, id) {
                        (true, Some(id)) => {
                            entries.push((s, id, v, r));
                            // Of the same counter still (a key's slot may go to another
                            // key).
                            let before = self
                                .drained_before
                                .binary_search_by_key(&s, |d| d.0)
                                .ok()
                                .map(|k| self.drained_before[k])
                                .filter(|d| d.1 == id)
                                .map_or(0, |d| d.2);
                            // Not the sum: after the recovered round's answer the view
                            // drains the stall's counts again from then, so what drained
                            // since may be the same drain.
                            let d =
                                if v > 0 { c.own_drained(s, v, c.local(s), now, true) } else { 0 };
                            drained.push(d.max(before).min(v));
                        }
                        // Only checked (answers by interest): named, not counted.
                        (false, Some(id)) if interest => watched.push(id),
                        _ => {}
                    }
                }
            }
        });
        self.limiter.learn_keys(&keys);
        if drained.iter().all(|&d| d == 0) {
            // Said only when something drained: a busy quota's counts seldom do.
            drained = Vec::new();
        }
        (entries, drained, watched)
    }

    /// The round's calls: one to each root that is not backing off, with every batch it
    /// has not acknowledged (its shard's of `batches` queued first), hints if it needs them
    /// and its shard's quotas of `watch`.
    fn root_calls(
        &mut self,
        now: u64,
        batches: &[Option<Arc<DeltaBatch>>],
        watch: &[Vec<QuotaId>],
        mut reports: Vec<Vec<crate::proto::InFlightReport>>,
    ) -> Vec<RootCall> {
        let epoch = self.limiter.epoch();
        let mut calls = Vec::new();
        // Per root: the highest `seq` another root of its shard acknowledged in an answer
        // merged into this limiter's view. Those batches are in the fills that root
        // answered, so in the view and its hints.
        let acked_elsewhere: Vec<u64> = (0..self.roots.len())
            .map(|i| {
                let shard = self.roots[i].shard;
                self.roots
                    .iter()
                    .enumerate()
                    .filter(|&(k, l)| k != i && l.shard == shard)
                    .map(|(_, l)| l.in_view)
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        for (i, link) in self.roots.iter_mut().enumerate() {
            let e = self.limiter.root_entry(link.entry);
            let batch = batches[link.shard as usize].as_ref();
            link.queue(e, batch, self.config.max_pending_batches);
            if session::backing_off(e) {
                continue;
            }
            let hints = if link.wants_hints(e, &self.active) {
                let mut hints = session::collect_hints(
                    &self.limiter,
                    &self.active,
                    now,
                    link.shard,
                    self.shards,
                );
                // The batches sent beside the hints that no other root took: a root that
                // restarted adds them to the hints, so the hints must not hold them. This
                // limiter's view holds those of earlier rounds (folded in when no root
                // answered them), not this round's, which is still in flight.
                let this_round = batch.map(|b| b.seq);
                // And those this root summed before an answer kept out of the view: the view
                // holds them as folded in.
                let unheld = link
                    .pending()
                    .filter(|b| b.seq > acked_elsewhere[i] && Some(b.seq) != this_round)
                    .chain(link.summed_unmerged.iter());
                session::without_batches(&mut hints, unheld);
                link.take_hints(hints)
            } else {
                Vec::new()
            };
            let hinted_seq =
                (!hints.is_empty() && acked_elsewhere[i] > 0).then_some(acked_elsewhere[i]);
            let view_at = self.view_at[link.shard as usize];
            // Sent with every request: with batches pending since, it is also how long
            // they were counted over (`RootState::apply_batches`).
            let view_age_ns = (view_at > 0).then(|| now.saturating_sub(view_at));
            let watch = watch[link.shard as usize].clone();
            // The oldest batches first, within the call's budget (at least one batch).
            let mut budget = self.config.max_call_entries.saturating_sub(hints.len() + watch.len());
            let batches: Vec<DeltaBatch> = link
                .pending()
                .enumerate()
                .take_while(|(k, b)| {
                    let n = b.deltas.len() + 1;
                    let fits = *k == 0 || n <= budget;
                    budget = budget.saturating_sub(n);
                    fits
                })
                .map(|(_, b)| (**b).clone())
                .collect();
            // A batch's keys are named with the templates they had when it was first sent;
            // where a key has two (a later batch, hints, watch), the latest.
            let (limiter, round, cache) = (&self.limiter, &self.round, &mut self.batch_templates);
            let mut at = 0;
            let mut parts: Vec<Templates> = vec![limiter
                .key_templates(hints.iter().map(|h| h.0).chain(watch.iter().copied()), |id| {
                    round.slot_of_id_from(&mut at, id)
                })
                .into()];
            parts.extend(batches.iter().rev().map(|b| {
                let mut at = 0;
                let ids = b.deltas.iter().map(|d| d.0);
                let t = cache.entry((b.seq, link.shard)).or_insert_with(|| {
                    limiter.key_templates(ids, |id| round.slot_of_id_from(&mut at, id)).into()
                });
                t.clone()
            }));
            let key_templates = merge_templates(&parts);
            // A key capped by its template may have nothing else to sync: the root learns
            // its template from its entry to grant it shares.
            let key_templates = self.limiter.with_permit_templates(key_templates, &reports[i]);
            calls.push(RootCall {
                root: i,
                url: link.url.clone(),
                request: SyncRequest {
                    v: PROTOCOL_VERSION,
                    limiter: self.limiter_id.clone(),
                    root_instance: Some(e.get(zroots::INSTANCE)).filter(|&i| i != 0),
                    since: e.get(zroots::SINCE),
                    epoch,
                    batches,
                    hints,
                    seen_epoch: Some(self.limiter.seen_epoch()),
                    interest: self.config.interest,
                    watch,
                    // Said only beside hints: a root that restarted takes the hints and
                    // skips these batches (see `SyncRequest::hinted_seq`).
                    hinted_seq,
                    key_templates,
                    in_flight: std::mem::take(&mut reports[i]),
                    view_age_ns,
                },
            });
            e.set(zroots::LAST_ATTEMPT, now.max(1));
        }
        self.forget_templates();
        calls
    }

    /// Drops the key templates of batches no root has pending any more.
    fn forget_templates(&mut self) {
        if self.batch_templates.is_empty() {
            return;
        }
        let pending: HashSet<(u64, u32)> =
            self.roots.iter().flat_map(|l| l.pending().map(|b| (b.seq, l.shard))).collect();
        self.batch_templates.retain(|k, _| pending.contains(k));
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
        let mut resp = match session::accept(result, want) {
            Ok(resp) => resp,
            Err(err) => {
                link.hints_lost();
                return session::fail(e, &err, max_backoff);
            }
        };
        // Nothing past the root's own epoch, the highest it applied from the database: a
        // root that lies (or a man in the middle) sending an epoch of u64::MAX stopped
        // every quota change for good, the limiter asking for changes after it; a quota
        // of such an epoch kept its numbers against every later edit, and the roots' fills
        // of it stayed out (they come from roots older than the version held).
        if let Some(re) = resp.root_epoch {
            resp.epoch = resp.epoch.min(re);
            resp.quotas.retain(|u| u.epoch <= re);
        }
        // A root met with another instance than last time (with hints from the first or
        // not): it restarted.
        let known = e.get(zroots::INSTANCE);
        if known != 0 && known != resp.root_instance {
            self.restart_at[link.shard as usize] = now;
        }
        let hold = self.holds_view(root, now);
        let link = &mut self.roots[root];
        let e = self.limiter.root_entry(link.entry);
        let (pending, restarted) = link.acknowledge(e, &resp, hold);
        link.answered_at = now;
        status::record_success(e, latency, now, pending);
        let shard = link.shard;
        if let Some(secret) = resp.key_secret {
            self.limiter.set_cluster_secret(secret, now);
        }
        if let Some(n) = resp.limiters {
            self.limiter.set_peers(n);
        }

        if !resp.quotas.is_empty() {
            // A quota changed, reset or gone may leave a slot to other counts: what drained
            // of the old ones says nothing of them (dropped: only less is credited).
            self.drained_before = Vec::new();
            let applied = self.limiter.apply_quotas_with_resets(&resp.quotas);
            for s in applied.resets {
                self.round.drop_reset(s);
            }
            self.note_key_resets(applied.key_resets);
        }
        if let Some(re) = resp.root_epoch {
            self.root_caught_up(root, re);
        }
        if !resp.more {
            self.limiter.raise_epoch(resp.epoch);
        }
        let merge = match (restarted || hold, self.lately_held(shard, now)) {
            (true, _) => Merge::No,
            (false, true) => Merge::KeepingExtrapolation,
            (false, false) => Merge::Yes,
        };
        self.merge_counters(&resp.counters, resp.root_epoch, shard, merge, now);
        let seen = if restarted || hold { &mut self.kept_out } else { &mut self.merged };
        seen[shard as usize] = true;
        if restarted {
            self.restart_seen = true;
        } else if !hold {
            self.view_at[shard as usize] = now;
        }
        if !resp.grants.is_empty() {
            self.in_flight_ack |= self.in_flight.apply(&self.limiter, root, &resp.grants, now);
        }
        self.round.answered(shard, resp.more);
    }

    /// Remembers keys just reset, for [`Self::merge_counters`].
    fn note_key_resets(&mut self, resets: Vec<(QuotaId, Epoch)>) {
        for (id, epoch) in resets {
            let e = self.key_resets.entry(id).or_default();
            *e = (*e).max(epoch);
        }
        if self.key_resets.len() > MAX_KEY_RESETS {
            // Keep the newest: one cut at the epoch that many from the top.
            let mut epochs: Vec<Epoch> = self.key_resets.values().copied().collect();
            let k = epochs.len() - MAX_KEY_RESETS;
            let (_, &mut cut, _) = epochs.select_nth_unstable(k);
            self.key_resets.retain(|_, e| *e >= cut);
        }
    }

    /// Root `root` answers from quota epoch `epoch`: key resets every root has read are
    /// forgotten.
    fn root_caught_up(&mut self, root: usize, epoch: Epoch) {
        if self.root_epochs.len() < self.roots.len() {
            self.root_epochs.resize(self.roots.len(), 0);
        }
        if let Some(e) = self.root_epochs.get_mut(root) {
            *e = (*e).max(epoch);
        }
        if !self.key_resets.is_empty() {
            let low = self.root_epochs.iter().copied().min().unwrap_or(0);
            self.key_resets.retain(|_, e| *e > low);
        }
    }

    /// Merges the counters a root of `shard` reported (`(id, fill, demand)`) into the block
    /// (their fills into the view only if `merge`) and records what the round learned of
    /// them.
    fn merge_counters(
        &mut self,
        counters: &[(QuotaId, u64, u64)],
        root_epoch: Option<Epoch>,
        shard: u32,
        merge: Merge,
        now: u64,
    ) {
        let (round, active, limiter, shards) =
            (&mut self.round, &mut self.active, &self.limiter, self.shards);
        let key_resets = &self.key_resets;
        let reported = &mut self.reported_keys;
        let mut missed = false;
        limiter.with_counters_paced(self.pacer, |c| {
            let mut slots = Vec::with_capacity(WARM_CHUNK);
            for chunk in counters.chunks(WARM_CHUNK) {
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
                    let Some((mut s, mut entry)) = slot else {
                        if is_key_id(id) && !key_resets.contains_key(&id) {
                            let e = reported
                                .entry(id)
                                .or_insert(Reported { since: now, ..Reported::default() });
                            (e.fill, e.demand, e.when) = (fill, demand, now);
                            missed = true;
                        }
                        continue;
                    };
                    if entry.is_some() && c.id_of(s) != Some(id) {
                        // The batch's slot no longer holds this quota (deleted, maybe reused,
                        // while the round was in flight): look it up where it is now, if
                        // anywhere, as for a counter outside the batch.
                        let Some(now_at) = c.slot_of(id) else { continue };
                        (s, entry) = (now_at, round.entry_of(now_at));
                    }
                    let version = || {
                        let v = limiter.version_of(s);
                        if key_resets.is_empty() {
                            return v;
                        }
                        v.max(key_resets.get(&id).copied().unwrap_or(0))
                    };
                    if root_epoch.is_some_and(|re| re < version()) {
                        // The root has not seen the version held here (maybe a reset): its
                        // fill may hold counts the reset dropped. Other roots have it.
                        continue;
                    }
                    let facts = round.facts_mut(s, entry);
                    if facts.seen.is_none() {
                        facts.seen = c.base(s);
                    }
                    facts.demand = facts.demand.max(demand);
                    active.insert(s);
                    if merge == Merge::No {
                        // Not in the view: this round's batch is folded in at the round's
                        // end unless another root reports it.
                        continue;
                    }
                    let batch = round.report(entry, id);
                    let keep = merge == Merge::KeepingExtrapolation;
                    c.merge_report(s, fill, batch.unwrap_or(0), keep, now);
                    if let Some(v) = batch {
                        // The root's fill includes this round's batch: take it out of
                        // `inflight` now, or the estimate counts it twice until the slowest
                        // root answers.
                        c.sub_inflight(s, v);
                    }
                }
            }
        });
        if missed {
            self.keys_seen = u64::MAX;
            self.bound_reported_keys(now);
        }
    }

    /// Keeps [`Self::reported_keys`] within the key table's size: reports older than a
    /// few intervals go first (the next round brings fresher ones), then all.
    fn bound_reported_keys(&mut self, now: u64) {
        let cap = (self.limiter.key_capacity() as usize).max(1024);
        if self.reported_keys.len() <= cap {
            return;
        }
        let recent = now.saturating_sub(self.interval_ns().saturating_mul(2));
        self.reported_keys.retain(|_, r| r.when >= recent);
        if self.reported_keys.len() > cap {
            self.reported_keys.clear();
        }
    }

    /// At the agent's poll, between rounds and while a round waits for its roots: gives each
    /// key that a request path inserted since the last cut (counted again since, if the
    /// round in flight carries it: the report excludes that batch, and the merge takes its
    /// counts out once), and that no root has reported to this limiter yet, the fill a root
    /// reported for it in an earlier answer, if any ([`CounterAccess::adopt`]), and the
    /// cluster's demand, up to the limit, as what the rest of the cluster adds: a hot key
    /// met on one more host must not look idle there until the next round. The demand as
    /// read, not at least as a round's static share takes it: the report is up to an
    /// interval old and what came since is not in it; taken at least, the simulator's Zipf
    /// keys had more false rejections (71 against 62 over 40 seeds, before the roots
    /// credited on-time batches with what drained). Cheap when no key was inserted since the
    /// last call. Returns the keys adopted.
    pub fn adopt_keys(&mut self, now: u64) -> usize {
        if self.reported_keys.is_empty() {
            return 0;
        }
        let inserted = self.limiter.keys_inserted();
        if inserted == self.keys_seen {
            return 0;
        }
        self.keys_seen = inserted;
        let slots = self.limiter.dirty_key_slots();
        if slots.is_empty() {
            return 0;
        }
        let interval = self.interval_ns();
        let reported = &mut self.reported_keys;
        let adopted = self.limiter.with_counters(|c| {
            let mut adopted = 0;
            for s in slots {
                let Some(id) = c.id_of(s) else { continue };
                let Some(&r) = reported.get(&id) else { continue };
                if r.when.saturating_sub(r.since) < interval {
                    // New to the roots too: a key every host meets at once (a client's first
                    // burst) keeps the guess until its own round.
                    continue;
                }
                reported.remove(&id);
                if c.adopt(s, r.fill, r.when.min(now)) {
                    let demand = r.demand as f64;
                    c.set_rates(s, demand.min(c.limit(s)), demand);
                    adopted += 1;
                }
            }
            adopted
        });
        self.limiter.count_adopted(adopted);
        adopted
    }

    /// Finishes the round at `now`.
    pub fn end_round(&mut self, now: u64) -> RoundReport {
        let mut round = std::mem::take(&mut self.round);
        round.merge_others();
        let last_began = self.last_began.replace(round.began);
        let interval = self.interval_ns();
        // How long this round's batch was counted over: since the previous round began, but
        // no less than the shortest gap between early rounds.
        let round_ns = last_began
            .map_or(interval, |b| round.began.saturating_sub(b).max(interval / EARLY_GAP));
        self.settle(&round, round_ns, now);
        for (shard, silent) in self.silent.iter_mut().enumerate() {
            *silent = !round.shard_answered(shard as u32);
        }
        self.kept_out.fill(false);
        self.merged.fill(false);
        self.limiter.sweep_keys(now);
        self.limiter.compact_key_ids(self.pacer);
        self.forget_templates();
        self.limiter.set_inflight_seq(0);
        self.limiter.set_local_since(round.began);
        // A round no root answered keeps the view fresh for a horizon after the last one
        // merged: what the rest of the cluster adds goes on for that long, and dropped at
        // once, every host whose round fell in a moment all roots were down (both killed
        // and restarted, 100 ms) decided alone for a whole interval: 3 x the limit
        // (`make chaos`, both roots killed, up to 1.87 x over the second after).
        let fresh =
            (0..self.shards).all(|s| round.shard_answered(s) || self.recent_view(s, round.began));
        self.limiter.set_cluster_fresh(fresh);
        self.limiter.count_round(now);
        if round.any_ok && !round.more {
            self.maybe_refetch(now);
        }
        RoundReport { any_ok: round.any_ok, more: round.more }
    }

    /// Brings the block up to date with the round, under one writer lock: folds the batch
    /// no root took into the local view, then refreshes every active counter's rates from
    /// what the roots reported, and lets counters with nothing left leave the active set.
    fn settle(&mut self, round: &RoundState, round_ns: u64, now: u64) {
        let (interval_ns, shards) = (self.interval_ns(), self.shards);
        let prune = self.limiter.zone_status().rounds.is_multiple_of(16);
        // Shards no root answered this round whose view is recent (see `end_round`): their
        // batches fold in as while held, the others' inflow still extrapolated.
        let recent: Vec<bool> = (0..shards)
            .map(|s| !round.shard_answered(s) && self.recent_view(s, round.began))
            .collect();
        if recent.contains(&true) {
            // Their views' time stays back (`anchor_held`): extrapolated up to the next
            // round, not only to a horizon after the last view.
            let stretch = interval_ns.saturating_mul(2);
            self.limiter.stretch_horizon(stretch, now.saturating_add(interval_ns), now);
        }
        let active = &mut self.active;
        // Which shards' counters count no own share this round (none, nearly always).
        let silent = Some(&self.silent).filter(|v| v.contains(&true));
        let held: Vec<bool> =
            self.kept_out.iter().zip(&self.merged).map(|(&k, &m)| k && !m).collect();
        let held = Some(&held).filter(|v| v.contains(&true));
        let held_shard = |id| held.is_some_and(|v| v[Shard::of(id, shards) as usize]);
        let recent_shard = |id| recent[Shard::of(id, shards) as usize];
        // A held shard's counters keep (close to) the time of their last view
        // (`anchor_held`), which may be this many intervals old before the hold ends, and
        // one more; and so for as long again after, until reports tell more than that view
        // (`merge_report`).
        if self.kept_out.contains(&true) {
            let stretch = interval_ns.saturating_mul(VIEW_HOLD_INTERVALS + 1);
            self.limiter.stretch_horizon(stretch, now.saturating_add(stretch), now);
        }
        let young: Vec<bool> = self
            .restart_at
            .iter()
            .map(|&t| t != 0 && now.saturating_sub(t) < DEMAND_WINDOW_NS)
            .collect();
        let young = Some(&young).filter(|v| v.contains(&true));
        self.limiter.with_counters_paced(self.pacer, |c| {
            let warm = |run: &[u32]| c.warm(run.iter().copied());
            for (k, &(s, id, v, _)) in round.entries.iter().enumerate() {
                if k % WARM_CHUNK == 0 {
                    c.warm(round.entries[k..].iter().take(WARM_CHUNK).map(|e| e.0));
                }
                // A slot deleted (and reused) while the round was in flight is not this entry's.
                if c.id_of(s) != Some(id) {
                    continue;
                }
                if !round.reported[k] {
                    // No root took it (none answered, or none knows the quota yet, or the
                    // answers were held): fold it into the local view so it keeps draining.
                    if held_shard(id) || recent_shard(id) {
                        c.anchor_held(s, v, now);
                    } else {
                        c.anchor(s, v, now);
                    }
                    c.sub_inflight(s, v);
                }
                if c.has_pending(s) {
                    c.mark_dirty(s);
                }
                active.insert(s);
            }
            // No root answered: nothing is known, and the rates stay as they were (estimates
            // do not extrapolate while the view is not fresh). Zeroed, they were still zero
            // in the next round if its answers were held (both roots restarted, one round
            // missed by the restart): that host read the others as adding nothing and passed
            // all of `hot`, the whole limit alone, for a second (`make chaos`).
            if round.any_ok {
                // What the rest of the cluster adds: reported counters are hot, the others
                // did not change at any root this round and are cold. A cold counter leaves
                // the set as soon as it has nothing left (no fill, no counts in flight), or
                // every round would visit every counter touched since the last prune: 100s
                // of ms of the agent's core under random-key traffic over a million slots.
                // It comes back when it is counted or reported.
                let (mut walk, estimator) = (round.walk(), c.estimator());
                active.retain_in_chunks(WARM_CHUNK, warm, |s| {
                    let Some(id) = c.id_of(s) else { return false };
                    let (own, facts) = walk.at(s, id);
                    if round.silent_shard(id, shards) || held_shard(id) {
                        // No root of its shard answered, or none into the view: nothing is
                        // known, keep the rates.
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
                    // The first answer after a round that reached no root of the counter's
                    // shard: this host counted its last round alone, admitting what its own
                    // view allowed, and the roots' demand and fills do not hold it (its
                    // batches are late). Taken as its share, it read the rest of the
                    // cluster as adding the limit less all of its own traffic, nothing at
                    // 1 x: healed, it went on admitting alone for a round while the others
                    // ran at the limit, and the counter then shut the quota for everyone
                    // (`make chaos`: the cluster at 0.60 x for half a second after a healed
                    // cut). Until its counts are metered again it counts as no share.
                    let alone = silent
                        .is_some_and(|v| v.get(Shard::of(id, shards) as usize) == Some(&true));
                    // A root younger than its demand window reads the cluster's demand
                    // as what came in since it started over the whole window: a quarter of
                    // it half a second in. Taken so, the static share read the rest of the
                    // cluster as adding nothing, and every host passed its whole demand
                    // (`make chaos`, both roots killed: 2 x the limit for half a second).
                    // Until the window is full, the demand held before stands as a floor.
                    let young = young.is_some_and(|v| v[Shard::of(id, shards) as usize]);
                    let demand = if young {
                        (facts.demand as f64).max(c.demand(s))
                    } else {
                        facts.demand as f64
                    };
                    let sample = inflow::Sample {
                        limit: c.limit(s),
                        before,
                        after: c.base(s).unwrap_or((0, now)),
                        own: if alone { 0 } else { own.unwrap_or(0) },
                        round_ns,
                        interval_ns,
                        inflow: c.inflow(s),
                        demand,
                    };
                    c.set_rates(s, inflow::estimate(estimator, &sample), demand);
                    true
                });
            }
            if prune {
                active.retain_in_chunks(WARM_CHUNK, warm, |s| c.is_active(s, now));
            }
        });
    }

    /// Whether to start a round now, before the interval is up: a request path saw this
    /// host's own traffic on a quota run well ahead of what it counted in its last regular
    /// round (a surge the roots should hear of now, not an interval later). Rounds stay at
    /// least `interval /` [`EARLY_GAP`] apart, and a budget of [`EARLY_BUDGET`] rounds,
    /// refilled by one every [`EARLY_REFILL`] intervals, caps what they can ever add to a
    /// root's load at a quarter of the regular rounds, whatever the traffic looks like.
    /// Poll it every few milliseconds.
    pub fn wants_early_round(&mut self, now: u64) -> bool {
        let interval = self.interval_ns();
        // Concurrency shares are published at every poll, so a lapsed lease stops
        // admissions on time; a host refusing requests on them (at most once in half an
        // interval), or one that applied a smaller share, reports now: shares move a round
        // sooner. Not from the early-round budget: these are bounded by the shares' moves.
        // A key met for the first time refuses until its first grant: a round brings it
        // sooner, from the budget (clients choose keys).
        let (due, fresh) =
            self.in_flight.poll(&self.limiter, now, interval / 2, interval / EARLY_GAP);
        if std::mem::take(&mut self.in_flight_ack) || due {
            self.early_next = true;
            return true;
        }
        // A root that restarted (`restart_seen`) gets its hints an interval sooner: the
        // cluster is back at its limit about then (`make chaos`, both roots killed).
        let restart = self.restart_seen;
        if !self.config.early && !fresh && !restart {
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
        if *tokens == 0 || !(fresh || restart || self.limiter.take_urgent()) {
            return false;
        }
        self.restart_seen = false;
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

mod in_flight;
mod inflow;
mod round;
mod session;
mod slot_set;
mod status;
/// Keys and their templates' ids, sorted by key.
type Templates = Arc<[(QuotaId, QuotaId)]>;

/// Key templates of several lists, each sorted by key, in one list sorted by key, each key
/// once, with the template of the first list that has it.
fn merge_templates(parts: &[Templates]) -> Vec<(QuotaId, QuotaId)> {
    let mut all: Vec<(QuotaId, QuotaId)> = parts.iter().flat_map(|p| p.iter().copied()).collect();
    // A stable sort merges the sorted runs it finds rather than sorting from scratch.
    all.sort_by_key(|t| t.0);
    all.dedup_by_key(|t| t.0);
    all
}

#[cfg(test)]
mod tests;
