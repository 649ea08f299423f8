//! The JSON document `yarl_stats` answers with, built without nginx so tests/report.rs can
//! check it.
//!
//! Ages are computed here, at request time, from the limiter clock: the sync thread's status
//! snapshot is only refreshed once per round, so a raw timestamp would make readers do clock
//! arithmetic against a clock they cannot see.

use serde::Serialize;
use yarl_core::sync::RootStatus;
use yarl_core::{QuotaInfo, SyncStatus};

/// What this worker's access handler decided so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RequestCounters {
    /// Requests that went through at least one `yarl_check`/`yarl_account` rule.
    pub checked: u64,
    /// All matched quotas passed.
    pub passed: u64,
    /// No rule matched a quota.
    pub unlimited: u64,
    /// Rejected with `yarl_status`.
    pub rejected: u64,
    /// Would have been rejected, passed because of `yarl_dry_run on`.
    pub rejected_dry_run: u64,
}

/// Live values read from the limiter when the page is rendered.
#[derive(Debug, Clone, Copy, Default)]
pub struct Live {
    /// Clock time now (ns), the limiter's clock.
    pub now_ns: u64,
    /// Highest quota epoch held.
    pub epoch: u64,
    /// Quotas held.
    pub quotas: u64,
    /// Rejections counted by the limiter (dry-run ones included).
    pub rejections: u64,
}

/// Sync settings in force.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SyncSettings {
    /// `yarl_sync_interval`, ms.
    pub interval_ms: u64,
    /// `yarl_sync_timeout`, ms.
    pub timeout_ms: u64,
}

#[derive(Serialize)]
struct Root<'a> {
    url: &'a str,
    /// `null` before the first call.
    ok: Option<bool>,
    last_error: Option<&'a str>,
    last_attempt_age_ms: Option<u64>,
    last_success_age_ms: Option<u64>,
    last_latency_us: Option<u64>,
    successes: u64,
    failures: u64,
    consecutive_failures: u32,
    pending_batches: usize,
    instance: Option<u64>,
}

#[derive(Serialize)]
struct Quota<'a> {
    name: &'a str,
    id: u64,
    epoch: u64,
    limit: f64,
    low_burst: f64,
    high_burst: f64,
    parent: Option<&'a str>,
    fill: f64,
}

#[derive(Serialize)]
struct Page<'a> {
    pid: u32,
    limiter_id: &'a str,
    sync_running: bool,
    sync: SyncSettings,
    epoch: u64,
    quotas: u64,
    rejections: u64,
    rounds: u64,
    cluster_fresh: bool,
    requests: RequestCounters,
    roots: Vec<Root<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    quota: Option<Option<Quota<'a>>>,
}

fn age_ms(now_ns: u64, at: Option<u64>) -> Option<u64> {
    at.map(|t| now_ns.saturating_sub(t) / 1_000_000)
}

fn root(now_ns: u64, r: &RootStatus) -> Root<'_> {
    Root {
        url: &r.url,
        ok: r.ok,
        last_error: r.last_error.as_deref(),
        last_attempt_age_ms: age_ms(now_ns, r.last_attempt_ns),
        last_success_age_ms: age_ms(now_ns, r.last_success_ns),
        last_latency_us: r.last_latency_us,
        successes: r.successes,
        failures: r.failures,
        consecutive_failures: r.consecutive_failures,
        pending_batches: r.pending_batches,
        instance: r.instance,
    }
}

/// Everything the page shows.
#[derive(Debug)]
pub struct Input<'a> {
    /// This worker's pid.
    pub pid: u32,
    /// The sync thread's last snapshot (`None`: no thread runs in this worker).
    pub status: Option<&'a SyncStatus>,
    /// Live limiter values.
    pub live: Live,
    /// Settings in force.
    pub sync: SyncSettings,
    /// Handler counters.
    pub requests: RequestCounters,
    /// `Some` when the page was asked about one quota (`?quota=NAME`); the inner `None` means
    /// this worker does not hold it.
    pub quota: Option<(&'a str, Option<&'a QuotaInfo>)>,
}

/// Renders the page (one JSON object and a newline).
pub fn render(input: &Input<'_>) -> String {
    let now = input.live.now_ns;
    let empty = SyncStatus::default();
    let status = input.status.unwrap_or(&empty);
    let page = Page {
        pid: input.pid,
        limiter_id: &status.limiter_id,
        sync_running: input.status.is_some(),
        sync: input.sync,
        epoch: input.live.epoch.max(status.epoch),
        quotas: input.live.quotas,
        rejections: input.live.rejections,
        rounds: status.rounds,
        cluster_fresh: status.cluster_fresh,
        requests: input.requests,
        roots: status.roots.iter().map(|r| root(now, r)).collect(),
        quota: input.quota.map(|(name, q)| {
            q.map(|q| Quota {
                name,
                id: q.id,
                epoch: q.epoch,
                limit: q.limit,
                low_burst: q.low_burst,
                high_burst: q.high_burst,
                parent: q.parent.as_deref(),
                fill: q.fill,
            })
        }),
    };
    let mut s = serde_json::to_string(&page).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"));
    s.push('\n');
    s
}
