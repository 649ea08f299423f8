//! What the engine reports of itself: each root's health, kept in the block's root entries
//! so any process sharing the block can show it, and the limiter's state as a whole.

use super::SyncEngine;
use crate::quota::Epoch;
use crate::zone::roots as zroots;
use serde::Serialize;
use std::time::Duration;

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
    /// Upper bounds (µs) of the latency histogram's buckets.
    #[serde(skip)]
    pub latency_buckets_us: Vec<u64>,
    /// Successful calls per latency bucket (not cumulative); one more than the bounds: the
    /// last counts calls above every bound.
    #[serde(skip)]
    pub latency_counts: Vec<u64>,
    /// Sum of the latencies counted in the histogram, µs.
    #[serde(skip)]
    pub latency_sum_us: u64,
}

/// The limiter's state as a whole, for `yarl_stats` and metrics.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SyncStatus {
    /// This limiter's printed id (the public half of its wire id).
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

impl SyncEngine {
    /// A snapshot of the state for stats pages.
    pub fn status(&self, now: u64) -> SyncStatus {
        let z = self.limiter.zone_status();
        SyncStatus {
            // The printed half: the wire id's secret half stays in the engine.
            limiter_id: self.limiter.limiter_id(),
            roots: self
                .roots
                .iter()
                .map(|l| {
                    self.limiter.root_status(&l.url).unwrap_or_else(|| RootStatus {
                        url: l.url.clone(),
                        ..RootStatus::default()
                    })
                })
                .collect(),
            epoch: z.epoch,
            quotas: z.usage.quotas,
            rejections: z.rejections,
            rounds: z.rounds,
            cluster_fresh: z.cluster_fresh,
            now_ns: now,
        }
    }
}

/// Records a successful call of `latency` at `now` in the root's entry; `pending` batches
/// still wait for its acknowledgement.
pub(super) fn record_success(e: zroots::Entry<'_>, latency: Duration, now: u64, pending: usize) {
    let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
    e.set(zroots::OK, 1);
    e.set(zroots::ERR_LEN, 0);
    e.set(zroots::LAST_SUCCESS, now.max(1));
    e.set(zroots::LATENCY_US, us);
    e.add(zroots::SUCCESSES, 1);
    e.set(zroots::CONSECUTIVE, 0);
    e.set(zroots::PENDING, pending as u64);
    e.observe_latency(us);
}

/// Records a failed call in the root's entry; returns how many calls failed in a row.
pub(super) fn record_failure(e: zroots::Entry<'_>, error: &str) -> u64 {
    e.set(zroots::OK, 2);
    e.set_error(error);
    e.add(zroots::FAILURES, 1);
    let consecutive = e.get(zroots::CONSECUTIVE).saturating_add(1);
    e.set(zroots::CONSECUTIVE, consecutive);
    consecutive
}
