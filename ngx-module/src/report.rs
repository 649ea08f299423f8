//! The JSON document `yarl_stats` answers with, built without nginx so tests/report.rs can
//! check it.
//!
//! The page is the host's: every worker renders the same zone (quotas, counters, the sync
//! agent's roots), whichever answers. Ages are computed here, at request time, from the
//! zone's clock, so readers never do arithmetic against a clock they cannot see.

use serde::Serialize;
use yarl_core::sync::RootStatus;
use yarl_core::{ConcurrencyStatus, QuotaInfo, TemplateKeys, ZoneStatus};

/// What the access handlers of all workers decided so far.
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

/// Sync settings in force.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SyncSettings {
    /// `yarl_sync_interval`, ms.
    pub interval_ms: u64,
    /// `yarl_sync_timeout`, ms.
    pub timeout_ms: u64,
    /// `yarl_sync_early`.
    pub early: bool,
    /// `yarl_sync_answers`: `"all"` or `"touched"`.
    pub answers: &'static str,
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
    /// Units per `per`.
    limit: f64,
    /// The window as the admin API writes it (`"1s"` for a per-second quota).
    per: String,
    low_burst: f64,
    high_burst: f64,
    /// Shadow mode: its rejections are counted (`REJECTED_DRY_RUN`), not enforced.
    dry_run: bool,
    parent: Option<&'a str>,
    fill: f64,
    rejections: u64,
    /// For a key (a name under a template): the template.
    #[serde(skip_serializing_if = "Option::is_none")]
    template: Option<&'a str>,
}

#[derive(Serialize)]
struct Agent {
    /// The worker that holds the sync agent's lease.
    pid: Option<u32>,
    /// That worker answered this request.
    here: bool,
    /// Milliseconds since the agent last renewed its lease (it does before every round).
    lease_age_ms: u64,
    /// How many times a worker took the agent role.
    starts: u64,
    /// Rounds skipped because another live worker was inside the zone's write section (a
    /// former agent stopped mid-round).
    write_waits: u64,
    /// Write sections left after another worker had entered meanwhile: two writers of the
    /// zone at once; always 0 unless something is wrong.
    write_overlaps: u64,
}

#[derive(Serialize)]
struct Zone<'a> {
    bytes: u64,
    bytes_used: u64,
    capacity: u64,
    quotas: u64,
    missing: u64,
    slots_used: u64,
    arena_words: u64,
    arena_used: u64,
    index_rebuilds: u64,
    templates: u64,
    key_capacity: u64,
    keys: u64,
    keys_inserted: u64,
    /// Keys new here that took the roots' last report of them at once.
    keys_adopted: u64,
    key_evictions: u64,
    keys_refused: u64,
    /// Answers with another key secret than the zone's (see `yarl_key_secret_conflicts_total`).
    key_secret_conflicts: u64,
    /// Per template (the first the zone counts apart; `template: null` for the others).
    template_keys: Vec<TemplateRow<'a>>,
}

#[derive(Serialize)]
struct TemplateRow<'a> {
    template: Option<&'a str>,
    keys: u64,
    evictions: u64,
    refused: u64,
}

#[derive(Serialize)]
struct Page<'a> {
    pid: u32,
    limiter_id: &'a str,
    generation: u64,
    sync_running: bool,
    agent: Agent,
    sync: SyncSettings,
    epoch: u64,
    quotas: u64,
    rejections: u64,
    rounds: u64,
    early_rounds: u64,
    cluster_fresh: bool,
    cluster_limiters: u64,
    last_round_age_ms: Option<u64>,
    zone: Zone<'a>,
    requests: RequestCounters,
    roots: Vec<Root<'a>>,
    concurrency: Concurrency<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    quota: Option<Option<Quota<'a>>>,
}

/// The host's concurrency caps (`yarl_concurrency`).
#[derive(Serialize)]
struct Concurrency<'a> {
    /// Times a capped quota found no permit entry (not capped on this host).
    entries_refused: u64,
    /// Requests refused a slot (or that a cap in shadow mode would have refused), every
    /// quota together.
    refused: u64,
    /// Workers that found no ledger row.
    ledger_full: u64,
    /// Slots given back from workers that died holding them.
    reaped: u64,
    quotas: Vec<ConcurrencyRow<'a>>,
}

#[derive(Serialize)]
struct ConcurrencyRow<'a> {
    quota: &'a str,
    /// For a template: its keys with an entry here, whose figures the row adds up.
    #[serde(skip_serializing_if = "Option::is_none")]
    keys: Option<u32>,
    in_flight: u32,
    share: u32,
    refused: u64,
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
    /// The pid of the worker answering.
    pub pid: u32,
    /// The host's limiter (`None`: this worker has none, e.g. the zone was missing).
    pub zone: Option<&'a ZoneStatus>,
    /// Whether the agent's lease holder is alive and renewing.
    pub agent_alive: bool,
    /// The clock time the page is rendered at (ns, the zone's clock).
    pub now_ns: u64,
    /// The configured roots, with what the agent last recorded for each.
    pub roots: &'a [RootStatus],
    /// Settings in force.
    pub sync: SyncSettings,
    /// The host's handler counters.
    pub requests: RequestCounters,
    /// `Some` when the page was asked about one quota (`?quota=NAME`); the inner `None` means
    /// the zone does not hold it.
    pub quota: Option<(&'a str, Option<&'a QuotaInfo>)>,
    /// Keys per template ([`yarl_core::Limiter::template_keys`]).
    pub templates: &'a [TemplateKeys],
    /// Concurrency caps ([`yarl_core::Limiter::concurrency_status`]); `None`: no limiter.
    pub concurrency: Option<&'a ConcurrencyStatus>,
}

/// Renders the page (one JSON object and a newline).
pub fn render(input: &Input<'_>) -> String {
    let now = input.now_ns;
    let empty = ZoneStatus::default();
    let z = input.zone.unwrap_or(&empty);
    let u = &z.usage;
    let page = Page {
        pid: input.pid,
        limiter_id: &z.limiter_id,
        generation: z.generation,
        sync_running: input.agent_alive,
        agent: Agent {
            pid: z.agent,
            here: z.agent == Some(input.pid),
            lease_age_ms: z.agent_age_ms,
            starts: z.agent_starts,
            write_waits: z.write_waits,
            write_overlaps: z.write_overlaps,
        },
        sync: input.sync,
        epoch: z.epoch,
        quotas: u.quotas,
        rejections: z.rejections,
        rounds: z.rounds,
        early_rounds: z.early_rounds,
        cluster_fresh: z.cluster_fresh,
        cluster_limiters: z.cluster_limiters,
        last_round_age_ms: age_ms(now, Some(z.last_round_end_ns).filter(|&t| t != 0)),
        zone: Zone {
            bytes: u.bytes,
            bytes_used: u.bytes_used,
            capacity: u.capacity,
            quotas: u.quotas,
            missing: u.missing,
            slots_used: u.slots_used,
            arena_words: u.arena_words,
            arena_used: u.arena_used,
            index_rebuilds: u.index_rebuilds,
            templates: u.templates,
            key_capacity: u.key_capacity,
            keys: u.keys,
            keys_inserted: u.keys_inserted,
            keys_adopted: u.keys_adopted,
            key_evictions: u.key_evictions,
            keys_refused: u.keys_refused,
            key_secret_conflicts: u.key_secret_conflicts,
            template_keys: input
                .templates
                .iter()
                .map(|t| TemplateRow {
                    template: t.template.as_deref(),
                    keys: t.keys,
                    evictions: t.evictions,
                    refused: t.refused,
                })
                .collect(),
        },
        requests: input.requests,
        roots: input.roots.iter().map(|r| root(now, r)).collect(),
        concurrency: {
            let c = input.concurrency;
            Concurrency {
                entries_refused: c.map_or(0, |c| c.entries_refused),
                refused: c.map_or(0, |c| c.refused),
                ledger_full: c.map_or(0, |c| c.ledger_full),
                reaped: c.map_or(0, |c| c.reaped),
                quotas: c.map_or_else(Vec::new, |c| {
                    c.quotas
                        .iter()
                        .map(|q| ConcurrencyRow {
                            quota: &q.name,
                            keys: q.name.ends_with('*').then_some(q.keys),
                            in_flight: q.in_flight,
                            share: q.share,
                            refused: q.refused,
                        })
                        .collect()
                }),
            }
        },
        quota: input.quota.map(|(name, q)| {
            q.map(|q| Quota {
                name,
                id: q.id,
                epoch: q.epoch,
                limit: q.limit,
                per: yarl_core::units::window_text(q.window),
                low_burst: q.low_burst,
                high_burst: q.high_burst,
                dry_run: q.dry_run,
                parent: q.parent.as_deref(),
                fill: q.fill,
                rejections: q.rejections,
                template: q.template.as_deref(),
            })
        }),
    };
    let mut s = serde_json::to_string(&page).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"));
    s.push('\n');
    s
}
