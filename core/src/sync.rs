//! The limiter's side of sync: a pure state machine ([`SyncEngine`]) and, with the `http`
//! feature, the background thread that drives it ([`SyncThread`]).
//!
//! A round, once per interval:
//! 1. [`SyncEngine::begin_round`] takes the deltas accounted since the last round into a new
//!    numbered batch and builds one request per root that is due;
//! 2. the caller sends them (in parallel, each with a timeout) and hands every answer or
//!    failure to [`SyncEngine::on_response`], which merges counters by max and applies quotas;
//! 3. [`SyncEngine::end_round`] folds the batch into the local view: counters a root reported
//!    already include it; the rest (no root answered, or none knew the quota) are anchored
//!    locally so they keep draining at the quota's rate.
//!
//! A root that fails keeps its unacknowledged batches (up to `max_pending_batches`, resent
//! unchanged, applied once thanks to `seq`) and is retried with exponential backoff; if its
//! batches overflow or it restarts, the next request carries hints so it catches up at once.
//! `check`/`account` never wait for any of this.

use crate::limiter::{Estimator, Limiter};
use crate::proto::{DeltaBatch, SyncRequest, SyncResponse, PROTOCOL_VERSION};
use crate::quota::{Epoch, QuotaId};
use serde::Serialize;
use std::collections::{HashMap, HashSet, VecDeque};
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
}

impl Default for SyncConfig {
    fn default() -> Self {
        SyncConfig {
            interval: Duration::from_secs(1),
            timeout: Duration::from_millis(500),
            max_pending_batches: 30,
            max_backoff_intervals: 8,
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
}

/// One root's health as last seen.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RootStatus {
    /// The root's base URL.
    pub url: String,
    /// Result of the last call: `None` before the first.
    pub ok: Option<bool>,
    /// Error of the last failed call.
    pub last_error: Option<String>,
    /// Clock time (ns) of the last call.
    pub last_attempt_ns: Option<u64>,
    /// Clock time (ns) of the last successful call.
    pub last_success_ns: Option<u64>,
    /// Latency of the last successful call, µs.
    pub last_latency_us: Option<u64>,
    /// Successful calls.
    pub successes: u64,
    /// Failed calls.
    pub failures: u64,
    /// Failures since the last success.
    pub consecutive_failures: u32,
    /// Root instance id last seen.
    pub instance: Option<u64>,
    /// Batches waiting for this root's acknowledgement.
    pub pending_batches: usize,
}

/// The limiter's state as a whole, for `yarl_stats` and metrics.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SyncStatus {
    /// This limiter's id on the wire.
    pub limiter_id: String,
    /// Per root.
    pub roots: Vec<RootStatus>,
    /// Highest quota epoch held.
    pub epoch: Epoch,
    /// Quotas held.
    pub quotas: u64,
    /// Requests rejected so far.
    pub rejections: u64,
    /// Rounds completed.
    pub rounds: u64,
    /// Whether the last round reached at least one root.
    pub cluster_fresh: bool,
    /// Clock time (ns) the status was taken.
    pub now_ns: u64,
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

/// What a round achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RoundReport {
    /// At least one root answered.
    pub any_ok: bool,
    /// A root has more quotas for us: run the next round at once.
    pub more: bool,
}

#[derive(Debug)]
struct RootLink {
    status: RootStatus,
    instance: Option<u64>,
    since: u64,
    pending: VecDeque<Arc<DeltaBatch>>,
    send_hints: bool,
    skip_rounds: u32,
}

#[derive(Debug, Default)]
struct RoundState {
    /// (slot, id, admitted, rejected) of this round's batch.
    entries: Vec<(u32, QuotaId, u64, u64)>,
    /// Highest demand any root reported this round, per slot.
    demand: HashMap<u32, u64>,
    position: HashMap<QuotaId, usize>,
    reported: Vec<bool>,
    /// Every slot some root reported this round, with its (`base`, `at`) before the first
    /// report: the measured estimator compares the two.
    seen: HashMap<u32, (u64, u64)>,
    /// When the round began: once it ends, `local` only counts what came after.
    began: u64,
    any_ok: bool,
    more: bool,
}

/// The sync state machine of one limiter; see the module docs.
#[derive(Debug)]
pub struct SyncEngine {
    limiter: Arc<Limiter>,
    config: SyncConfig,
    limiter_id: String,
    roots: Vec<RootLink>,
    next_seq: u64,
    /// Slots with a non-zero synced fill: hint candidates.
    active: HashSet<u32>,
    round: RoundState,
    rounds: u64,
    cluster_fresh: bool,
    /// When the previous round began: this round's batch was counted since then.
    last_began: Option<u64>,
}

impl SyncEngine {
    /// An engine for `limiter` syncing with `roots` (base URLs; may be empty: then the
    /// engine only anchors local counts so they drain).
    pub fn new(
        limiter: Arc<Limiter>,
        roots: Vec<String>,
        config: SyncConfig,
    ) -> Result<SyncEngine, EngineError> {
        if config.interval.is_zero() || config.timeout.is_zero() {
            return Err(EngineError::BadConfig);
        }
        if limiter.engine_attached.swap(true, Ordering::AcqRel) {
            return Err(EngineError::AlreadyAttached);
        }
        let roots = roots
            .into_iter()
            .map(|url| RootLink {
                status: RootStatus { url, ..RootStatus::default() },
                instance: None,
                since: 0,
                pending: VecDeque::new(),
                send_hints: false,
                skip_rounds: 0,
            })
            .collect();
        Ok(SyncEngine {
            limiter,
            config,
            limiter_id: format!("{:016x}{:08x}", fastrand::u64(..), std::process::id()),
            roots,
            next_seq: 1,
            active: HashSet::new(),
            round: RoundState::default(),
            rounds: 0,
            cluster_fresh: false,
            last_began: None,
        })
    }

    /// The limiter this engine drives.
    pub fn limiter(&self) -> &Arc<Limiter> {
        &self.limiter
    }

    /// The configuration.
    pub fn config(&self) -> &SyncConfig {
        &self.config
    }

    /// Starts a round at `now`: returns the calls to make.
    pub fn begin_round(&mut self, now: u64) -> Vec<RootCall> {
        let dirty = self.limiter.take_dirty();
        let mut round = RoundState { began: now, ..RoundState::default() };
        self.limiter.with_counters(|c| {
            for s in dirty {
                let (v, r) = (c.local(s), c.take_rejected(s));
                if let (true, Some(id)) = (v > 0 || r > 0, c.id_of(s)) {
                    round.position.insert(id, round.entries.len());
                    round.entries.push((s, id, v, r));
                }
            }
        });
        round.reported = vec![false; round.entries.len()];
        let batch = (!round.entries.is_empty()).then(|| {
            let seq = self.next_seq;
            self.next_seq += 1;
            Arc::new(DeltaBatch {
                seq,
                deltas: round.entries.iter().map(|&(_, id, v, r)| (id, v, r)).collect(),
            })
        });
        self.round = round;

        let epoch = self.limiter.epoch();
        let mut calls = Vec::new();
        for (i, link) in self.roots.iter_mut().enumerate() {
            if let Some(b) = &batch {
                link.pending.push_back(b.clone());
                if link.pending.len() > self.config.max_pending_batches {
                    link.pending.pop_front();
                    link.send_hints = true;
                }
            }
            link.status.pending_batches = link.pending.len();
            if link.skip_rounds > 0 {
                link.skip_rounds -= 1;
                continue;
            }
            let hints = if link.send_hints || (link.instance.is_none() && !self.active.is_empty()) {
                collect_hints(&self.limiter, &self.active, now)
            } else {
                Vec::new()
            };
            calls.push(RootCall {
                root: i,
                url: link.status.url.clone(),
                request: SyncRequest {
                    v: PROTOCOL_VERSION,
                    limiter: self.limiter_id.clone(),
                    root_instance: link.instance,
                    since: link.since,
                    epoch,
                    batches: link.pending.iter().map(|b| (**b).clone()).collect(),
                    hints,
                },
            });
            link.status.last_attempt_ns = Some(now);
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
        let Some(link) = self.roots.get_mut(root) else { return };
        let resp = match result {
            Ok(r) if r.v == PROTOCOL_VERSION => r,
            Ok(r) => {
                return fail(link, format!("root speaks protocol version {}", r.v), max_backoff)
            }
            Err(e) => return fail(link, e, max_backoff),
        };
        if link.instance.is_some_and(|i| i != resp.root_instance) {
            // The root restarted: it lost its counters. Tell it what we know next round.
            link.send_hints = true;
        } else {
            link.send_hints = false;
        }
        link.instance = Some(resp.root_instance);
        link.since = resp.version;
        link.pending.retain(|b| b.seq > resp.acked_seq);
        link.skip_rounds = 0;
        let st = &mut link.status;
        st.ok = Some(true);
        st.last_error = None;
        st.last_success_ns = Some(now);
        st.last_latency_us = Some(u64::try_from(latency.as_micros()).unwrap_or(u64::MAX));
        st.successes += 1;
        st.consecutive_failures = 0;
        st.instance = Some(resp.root_instance);
        st.pending_batches = link.pending.len();

        if !resp.quotas.is_empty() {
            self.limiter.apply_quotas(&resp.quotas);
        }
        if !resp.more {
            self.limiter.raise_epoch(resp.epoch);
        }
        let round = &mut self.round;
        let active = &mut self.active;
        self.limiter.with_counters(|c| {
            for &(id, fill, demand) in &resp.counters {
                let Some(s) = c.slot_of(id) else { continue };
                if let (std::collections::hash_map::Entry::Vacant(e), Some(b)) =
                    (round.seen.entry(s), c.base(s))
                {
                    e.insert(b);
                }
                c.merge_report(s, fill, now);
                let d = round.demand.entry(s).or_default();
                *d = (*d).max(demand);
                active.insert(s);
                if let Some(&k) = round.position.get(&id) {
                    if !round.reported[k] && round.entries[k].0 == s {
                        // The root's fill includes this round's batch: take it out of `local`
                        // now, or the estimate counts it twice until the slowest root answers.
                        c.sub_local(s, round.entries[k].2);
                        round.reported[k] = true;
                    }
                }
            }
        });
        round.any_ok = true;
        round.more |= resp.more;
    }

    /// Finishes the round at `now`.
    pub fn end_round(&mut self, now: u64) -> RoundReport {
        let round = std::mem::take(&mut self.round);
        let last_began = self.last_began.replace(round.began);
        let active = &mut self.active;
        let rounds = self.rounds;
        let interval = u64::try_from(self.config.interval.as_nanos()).unwrap_or(u64::MAX);
        self.limiter.with_counters(|c| {
            // Fold this round's batch into the local view.
            for (k, &(s, id, v, _)) in round.entries.iter().enumerate() {
                // A slot deleted (and reused) while the round was in flight is not this entry's.
                if c.id_of(s) != Some(id) {
                    continue;
                }
                if !round.reported[k] {
                    // No root took it (none answered, or none knows the quota yet): fold it
                    // into the local view so it keeps draining.
                    c.anchor_local(s, v, now);
                    c.sub_local(s, v);
                }
                // Requests accounted while the round was in flight left the counter non-zero,
                // so no 0 -> non-zero transition will list it again: list it now.
                if c.has_pending(s) {
                    c.mark_dirty(s);
                }
                active.insert(s);
            }
            if round.any_ok {
                // What the rest of the cluster adds: reported counters are hot, the others
                // did not change at any root this round and are cold.
                for &s in active.iter() {
                    let Some(&(b1, t1)) = round.seen.get(&s) else {
                        c.set_rates(s, 0.0, 0.0);
                        continue;
                    };
                    let demand = round.demand.get(&s).copied().unwrap_or(0) as f64;
                    let limit = c.limit(s) as f64;
                    let inflow = match c.estimator() {
                        Estimator::Static { correction_ratio } => {
                            // The ratio is the whole cluster's inflow; this limiter's own
                            // share is counted exactly in `local`, so the others add the rest.
                            let own = c
                                .id_of(s)
                                .and_then(|id| round.position.get(&id))
                                .map_or(0, |&k| round.entries[k].2);
                            let secs = last_began.map_or(interval, |b| {
                                round.began.saturating_sub(b).max(interval / 2)
                            }) as f64
                                * 1e-9;
                            (correction_ratio * limit - own as f64 / secs).max(0.0)
                        }
                        Estimator::Measured => {
                            let (b2, t2) = c.base(s).unwrap_or((0, now));
                            let dt = if t1 == 0 { interval } else { t2.saturating_sub(t1) };
                            if dt == 0 {
                                c.set_rates(s, c.inflow(s), demand);
                                continue;
                            }
                            let own = c
                                .id_of(s)
                                .and_then(|id| round.position.get(&id))
                                .map_or(0, |&k| round.entries[k].2);
                            let secs = dt as f64 * 1e-9;
                            let total = (b2 as f64 - b1 as f64) / secs + limit;
                            let others = (total - own as f64 / secs).max(0.0);
                            let old = c.inflow(s);
                            if old > 0.0 {
                                0.5 * old + 0.5 * others
                            } else {
                                others
                            }
                        }
                    };
                    c.set_rates(s, inflow, demand);
                }
            } else {
                for &(s, ..) in &round.entries {
                    c.set_rates(s, 0.0, 0.0);
                }
            }
            if rounds % 16 == 0 {
                active.retain(|&s| c.synced(s, now) > 0 || c.local(s) > 0);
            }
        });
        self.limiter.set_local_since(round.began);
        self.rounds += 1;
        self.cluster_fresh = round.any_ok;
        self.limiter.set_cluster_fresh(round.any_ok);
        RoundReport { any_ok: round.any_ok, more: round.more }
    }

    /// A snapshot of the state for stats pages.
    pub fn status(&self, now: u64) -> SyncStatus {
        SyncStatus {
            limiter_id: self.limiter_id.clone(),
            roots: self.roots.iter().map(|l| l.status.clone()).collect(),
            epoch: self.limiter.epoch(),
            quotas: self.limiter.quota_count(),
            rejections: self.limiter.rejections(),
            rounds: self.rounds,
            cluster_fresh: self.cluster_fresh,
            now_ns: now,
        }
    }
}

fn fail(link: &mut RootLink, error: String, max_backoff: u32) {
    let st = &mut link.status;
    st.ok = Some(false);
    st.last_error = Some(error);
    st.failures += 1;
    st.consecutive_failures = st.consecutive_failures.saturating_add(1);
    let exp = st.consecutive_failures.saturating_sub(1).min(16);
    link.skip_rounds = (1u32 << exp).min(max_backoff) - 1;
    // It may come back having lost what it had: it gets our view with its next request.
    link.send_hints = true;
}

fn collect_hints(limiter: &Limiter, active: &HashSet<u32>, now: u64) -> Vec<(QuotaId, u64)> {
    limiter.with_counters(|c| {
        active
            .iter()
            .filter_map(|&s| {
                let v = c.synced(s, now);
                Some((c.id_of(s)?, v)).filter(|_| v > 0)
            })
            .collect()
    })
}

#[cfg(feature = "http")]
mod thread;
#[cfg(feature = "http")]
pub use thread::{HttpTransport, SyncThread, Transport};

#[cfg(test)]
mod tests;
