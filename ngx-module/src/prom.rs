//! The `yarl_metrics` page: the host's limiter in the Prometheus text exposition format
//! (version 0.0.4), built without nginx so tests/prom.rs can check it.
//!
//! Cardinality is bounded whatever the number of quotas: per-quota series exist only for the
//! 20 quotas that rejected most in the last minute, and per-root series for the configured
//! roots (at most 64). Gauges add the rest up as `quota="_other"`; counters do not (which
//! rows are named changes, and a counter of "the rest" would go down when one joins the
//! named): each has a host-wide total of its own.

use crate::report::RequestCounters;
use std::fmt::Write;
use yarl_core::sync::RootStatus;
use yarl_core::{ConcurrencyInfo, ConcurrencyStatus, TemplateKeys, ZoneStatus};

/// Quotas named in `yarl_quota_rejections_total`.
pub const TOP_QUOTAS: usize = 20;
/// Templates named in the `yarl_template_*` series (those holding most keys).
pub const TOP_TEMPLATES: usize = 20;
/// The window that ranks them, seconds.
pub const TOP_WINDOW_SECS: u64 = 60;

/// Everything the page shows.
#[derive(Debug)]
pub struct Input<'a> {
    /// Handler outcomes of every worker.
    pub requests: RequestCounters,
    /// The host's limiter; `None` when this worker has none.
    pub zone: Option<&'a ZoneStatus>,
    /// `(quota, rejections in the window, rejections since it was loaded)`, most first.
    pub top: &'a [(String, u64, u64)],
    /// The configured roots as the agent last recorded them.
    pub roots: &'a [RootStatus],
    /// Keys per template ([`yarl_core::Limiter::template_keys`]).
    pub templates: &'a [TemplateKeys],
    /// Whether a worker runs the sync agent and renews its lease.
    pub agent_alive: bool,
    /// Clock time now, ns (the zone's clock).
    pub now_ns: u64,
    /// Concurrency caps ([`yarl_core::Limiter::concurrency_status`]); `None`: no limiter.
    pub concurrency: Option<&'a ConcurrencyStatus>,
}

/// A label value, escaped as the text format requires.
fn label(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

fn head(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Per concurrency quota: the [`TOP_QUOTAS`] with most requests in flight by name, the
/// others summed as `quota="_other"`.
fn concurrency_series(o: &mut String, c: Option<&ConcurrencyStatus>) {
    let empty = ConcurrencyStatus::default();
    let c = c.unwrap_or(&empty);
    let mut rows: Vec<&ConcurrencyInfo> = c.quotas.iter().collect();
    rows.sort_by(|a, b| b.in_flight.cmp(&a.in_flight).then_with(|| a.name.cmp(&b.name)));
    // A quota named `_other` goes with the rest (see `yarl_quota_rejections_total`).
    let (mut rows, mut rest): (Vec<_>, Vec<_>) = rows.into_iter().partition(|q| q.name != OTHER);
    rest.extend(rows.split_off(rows.len().min(TOP_QUOTAS)));
    let named: Vec<(String, &ConcurrencyInfo)> =
        rows.into_iter().map(|q| (label(&q.name), q)).collect();
    let series: [Series<ConcurrencyInfo>; 3] = [
        (
            "yarl_concurrency_in_flight",
            "gauge",
            "Requests holding a slot of the quota's max_in_flight on this host.",
            |q| u64::from(q.in_flight),
        ),
        (
            "yarl_concurrency_share",
            "gauge",
            "The share of the quota's max_in_flight the roots grant this host now (0 when the grants lapsed).",
            |q| u64::from(q.share),
        ),
        (
            "yarl_concurrency_refused_total",
            "counter",
            "Requests refused a slot on this host since the quota's cap arrived.",
            |q| q.refused,
        ),
    ];
    let scope = format!(
        "The {TOP_QUOTAS} concurrency quotas with most in flight; quota=\"_other\" is the rest."
    );
    let counter_scope = format!(
        "The {TOP_QUOTAS} concurrency quotas with most in flight (every quota together: yarl_concurrency_refusals_total)."
    );
    ranked(o, "quota", (&scope, &counter_scope), &series, &named, &rest);
    head(
        o,
        "yarl_concurrency_refusals_total",
        "counter",
        "Requests refused a slot on this host (or that a quota in shadow mode would have refused), every quota together.",
    );
    let _ = writeln!(o, "yarl_concurrency_refusals_total {}", c.refused);
    head(
        o,
        "yarl_concurrency_reaped_total",
        "counter",
        "Slots given back from workers that died holding them (killed with -9, crashed).",
    );
    let _ = writeln!(o, "yarl_concurrency_reaped_total {}", c.reaped);
    head(
        o,
        "yarl_concurrency_entries_refused_total",
        "counter",
        "Times a capped quota or a key under a capped template found no permit entry (the zone's table was full): such a quota is not capped on this host, such a key runs on its template's own counter.",
    );
    let _ = writeln!(o, "yarl_concurrency_entries_refused_total {}", c.entries_refused);
    head(
        o,
        "yarl_concurrency_ledger_full_total",
        "counter",
        "Worker processes that found no ledger row in the zone (more than 64 share it): their slots are not given back if they are killed.",
    );
    let _ = writeln!(o, "yarl_concurrency_ledger_full_total {}", c.ledger_full);
}

/// The label value of the aggregate of the rows not named.
const OTHER: &str = "_other";

/// Renders the page.
pub fn render(i: &Input<'_>) -> String {
    let mut o = String::with_capacity(4096);
    let empty = ZoneStatus::default();
    let z = i.zone.unwrap_or(&empty);

    head(
        &mut o,
        "yarl_requests_total",
        "counter",
        "Requests that went through a yarl_check or yarl_account rule, by $yarl_status.",
    );
    let r = &i.requests;
    for (status, v) in [
        ("passed", r.passed),
        ("rejected", r.rejected),
        ("rejected_dry_run", r.rejected_dry_run),
        ("unlimited", r.unlimited),
    ] {
        let _ = writeln!(o, "yarl_requests_total{{status=\"{status}\"}} {v}");
    }

    head(&mut o, "yarl_rejections_total", "counter", "Decisions that rejected, dry runs included.");
    let _ = writeln!(o, "yarl_rejections_total {}", z.rejections);
    let u = &z.usage;
    for (name, help, v) in [
        (
            "yarl_keys_inserted_total",
            "Keys (names under templates) first seen here.",
            u.keys_inserted,
        ),
        (
            "yarl_keys_adopted_total",
            "Keys first seen here that took the roots' last report of them at once.",
            u.keys_adopted,
        ),
        ("yarl_key_evictions_total", "Drained keys whose slot a new key took.", u.key_evictions),
        (
            "yarl_keys_refused_total",
            "New keys with no room in the key table: counted on their template's own bucket.",
            u.keys_refused,
        ),
        (
            "yarl_key_secret_conflicts_total",
            "Sync answers carrying another key secret than the one this zone took first: that root's keys are not this host's (a root of another quota database, or a man in the middle).",
            u.key_secret_conflicts,
        ),
    ] {
        head(&mut o, name, "counter", help);
        let _ = writeln!(o, "{name} {v}");
    }

    template_series(&mut o, i.templates);
    concurrency_series(&mut o, i.concurrency);

    head(
        &mut o,
        "yarl_quota_rejections_total",
        "counter",
        "Rejections since the quota was loaded or last reset (a template's include its keys'), for the 20 quotas that rejected most in the last minute (every quota together: yarl_rejections_total).",
    );
    for (name, _, lifetime) in i.top.iter().take(TOP_QUOTAS) {
        let _ = writeln!(o, "yarl_quota_rejections_total{{quota=\"{}\"}} {lifetime}", label(name));
    }

    head(
        &mut o,
        "yarl_sync_requests_total",
        "counter",
        "Sync requests of the sync agent to each root, by result.",
    );
    for root in i.roots {
        let u = label(&root.url);
        let _ = writeln!(
            o,
            "yarl_sync_requests_total{{root=\"{u}\",result=\"ok\"}} {}",
            root.successes
        );
        let _ = writeln!(
            o,
            "yarl_sync_requests_total{{root=\"{u}\",result=\"failed\"}} {}",
            root.failures
        );
    }

    head(
        &mut o,
        "yarl_sync_duration_seconds",
        "histogram",
        "Latency of successful sync requests, per root.",
    );
    for root in i.roots {
        let u = label(&root.url);
        let mut cumulative = 0u64;
        for (k, &ub) in root.latency_buckets_us.iter().enumerate() {
            cumulative =
                cumulative.saturating_add(root.latency_counts.get(k).copied().unwrap_or(0));
            let _ = writeln!(
                o,
                "yarl_sync_duration_seconds_bucket{{root=\"{u}\",le=\"{}\"}} {cumulative}",
                ub as f64 / 1e6
            );
        }
        let count: u64 = root.latency_counts.iter().fold(0, |a, &c| a.saturating_add(c));
        let _ =
            writeln!(o, "yarl_sync_duration_seconds_bucket{{root=\"{u}\",le=\"+Inf\"}} {count}");
        let _ = writeln!(
            o,
            "yarl_sync_duration_seconds_sum{{root=\"{u}\"}} {}",
            root.latency_sum_us as f64 / 1e6
        );
        let _ = writeln!(o, "yarl_sync_duration_seconds_count{{root=\"{u}\"}} {count}");
    }

    head(&mut o, "yarl_sync_root_up", "gauge", "1 if the last sync request to the root succeeded.");
    for root in i.roots {
        let _ = writeln!(
            o,
            "yarl_sync_root_up{{root=\"{}\"}} {}",
            label(&root.url),
            u8::from(root.ok == Some(true))
        );
    }

    let u = &z.usage;
    let gauges: [(&str, &str, String); 13] = [
        ("yarl_quotas", "Quotas held in the zone.", u.quotas.to_string()),
        ("yarl_templates", "Templates held in the zone.", u.templates.to_string()),
        ("yarl_keys", "Keys (names under templates) held in the zone.", u.keys.to_string()),
        (
            "yarl_zone_capacity_keys",
            "Keys the zone's key table holds at most (yarl_zone keys=).",
            u.key_capacity.to_string(),
        ),
        (
            "yarl_quotas_missing",
            "Quotas that did not fit in yarl_zone: not limited.",
            u.missing.to_string(),
        ),
        (
            "yarl_zone_capacity_quotas",
            "Quotas the zone holds at most (names up to 23 bytes).",
            u.capacity.to_string(),
        ),
        ("yarl_zone_used_bytes", "Bytes of the zone in use.", u.bytes_used.to_string()),
        ("yarl_zone_size_bytes", "Size of the zone (yarl_zone).", u.bytes.to_string()),
        ("yarl_epoch", "Highest quota epoch held.", z.epoch.to_string()),
        (
            "yarl_cluster_fresh",
            "1 if the last sync round reached a root of every shard, or one answered within a \
             horizon (a sync interval by default) before it (cluster-wide counts are current).",
            u8::from(z.cluster_fresh).to_string(),
        ),
        (
            "yarl_cluster_limiters",
            "Limiters the roots last said they heard from in the last 10 s (0 before any answer).",
            z.cluster_limiters.to_string(),
        ),
        (
            "yarl_sync_agent_up",
            "1 if a worker runs the sync agent and renews its lease.",
            u8::from(i.agent_alive).to_string(),
        ),
        (
            "yarl_sync_last_round_age_seconds",
            "Seconds since the last sync round ended (-1 before the first).",
            if z.last_round_end_ns == 0 {
                "-1".to_string()
            } else {
                format!("{:.3}", i.now_ns.saturating_sub(z.last_round_end_ns) as f64 / 1e9)
            },
        ),
    ];
    for (name, help, v) in gauges {
        head(&mut o, name, "gauge", help);
        let _ = writeln!(o, "{name} {v}");
    }
    head(
        &mut o,
        "yarl_sync_rounds_total",
        "counter",
        "Sync rounds completed by any sync agent of this nginx.",
    );
    let _ = writeln!(o, "yarl_sync_rounds_total {}", z.rounds);
    head(
        &mut o,
        "yarl_sync_early_rounds_total",
        "counter",
        "Of those, rounds started before the interval was up because a quota's traffic surged.",
    );
    let _ = writeln!(o, "yarl_sync_early_rounds_total {}", z.early_rounds);
    head(
        &mut o,
        "yarl_limiter_info",
        "gauge",
        "The limiter's identity at the roots and the zone's generation (reloads that kept it).",
    );
    let _ = writeln!(
        o,
        "yarl_limiter_info{{limiter_id=\"{}\",generation=\"{}\"}} 1",
        label(&z.limiter_id),
        z.generation
    );
    o
}

/// A family of series ranked by one label: name, type, help, and its value in a row.
type Series<T> = (&'static str, &'static str, &'static str, fn(&T) -> u64);

/// Each family of `series`: a sample per row of `named` (its label value, escaped), then,
/// for a gauge, the sum of the `rest` as `_other`. `scopes` end the help (which rows are
/// named), of gauges and of counters: a counter has no `_other` (it would go down whenever
/// a row joined the named ones), and its help names the host-wide total instead.
fn ranked<T>(
    o: &mut String,
    label_name: &str,
    scopes: (&str, &str),
    series: &[Series<T>],
    named: &[(String, &T)],
    rest: &[&T],
) {
    for (name, kind, help, get) in series {
        let counter = *kind == "counter";
        head(o, name, kind, &format!("{help} {}", if counter { scopes.1 } else { scopes.0 }));
        for (l, r) in named {
            let _ = writeln!(o, "{name}{{{label_name}=\"{l}\"}} {}", get(r));
        }
        if !counter {
            let other: u64 = rest.iter().map(|r| get(r)).sum();
            let _ = writeln!(o, "{name}{{{label_name}=\"{OTHER}\"}} {other}");
        }
    }
}

/// Keys held, evicted and refused per template: the [`TOP_TEMPLATES`] holding most keys by
/// name, every other (and those the zone counts together) as `template="_other"`.
fn template_series(o: &mut String, rows: &[TemplateKeys]) {
    let mut named: Vec<&TemplateKeys> = rows.iter().filter(|r| r.template.is_some()).collect();
    named.sort_by(|a, b| b.keys.cmp(&a.keys).then_with(|| a.template.cmp(&b.template)));
    let mut rest = named.split_off(named.len().min(TOP_TEMPLATES));
    rest.extend(rows.iter().filter(|r| r.template.is_none()));
    let named: Vec<(String, &TemplateKeys)> =
        named.into_iter().map(|r| (label(r.template.as_deref().unwrap_or_default()), r)).collect();
    let series: [Series<TemplateKeys>; 3] = [
        ("yarl_template_keys", "gauge", "Keys held in the zone per template.", |r| r.keys),
        (
            "yarl_template_key_evictions_total",
            "counter",
            "Keys of the template whose slot went to another key, or that the sweep freed.",
            |r| r.evictions,
        ),
        (
            "yarl_template_keys_refused_total",
            "counter",
            "New keys of the template with no room in the key table.",
            |r| r.refused,
        ),
    ];
    let scope = format!(
        "The {TOP_TEMPLATES} templates holding most keys; template=\"_other\" is the rest."
    );
    let counter_scope = format!(
        "The {TOP_TEMPLATES} templates holding most keys (every template together: yarl_key_evictions_total, yarl_keys_refused_total)."
    );
    ranked(o, "template", (&scope, &counter_scope), &series, &named, &rest);
}
