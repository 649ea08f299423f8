//! Prometheus text exposition, written by hand: a dozen series do not justify a metrics
//! framework, and atomics keep the sync path free of extra locks.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;
use yarl_core::concurrency::EscrowStats;
use yarl_core::root::RootStats;

/// Upper bounds (seconds) of the sync latency histogram buckets.
const BUCKETS: [f64; 12] =
    [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0];

/// A latency histogram over [`BUCKETS`]: a count per bucket of its own (the last past
/// every bound), made cumulative when rendered, so that a scrape during an observation
/// never shows a bucket above the next one or above the count.
#[derive(Debug, Default)]
struct Histogram {
    buckets: [AtomicU64; BUCKETS.len() + 1],
    sum_ns: AtomicU64,
}

impl Histogram {
    fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let at = BUCKETS.iter().position(|&le| secs <= le).unwrap_or(BUCKETS.len());
        self.buckets[at].fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX), Relaxed);
    }

    fn render(&self, o: &mut String, name: &str, help: &str) {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0u64;
        for (b, le) in self.buckets.iter().zip(BUCKETS) {
            cumulative = cumulative.saturating_add(b.load(Relaxed));
            let _ = writeln!(o, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
        }
        let count = cumulative.saturating_add(self.buckets[BUCKETS.len()].load(Relaxed));
        let _ = writeln!(o, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(o, "{name}_sum {}", self.sum_ns.load(Relaxed) as f64 / 1e9);
        let _ = writeln!(o, "{name}_count {count}");
    }
}

/// Counters the server keeps besides the root state's own.
#[derive(Debug, Default)]
pub struct Metrics {
    sync_ok: AtomicU64,
    sync_refused: AtomicU64,
    /// Decode, apply and encode of answered syncs.
    sync_work: Histogram,
    /// Arrival to the start of decoding (body read, then the memory and concurrency
    /// gates) of answered syncs: where the time goes when a root is near full.
    sync_wait: Histogram,
    /// Time spent waiting for, and holding, the root state's lock (every holder: syncs,
    /// sweeps, quota applies, scrapes).
    lock_wait_ns: AtomicU64,
    lock_held_ns: AtomicU64,
    pub(crate) db_errors: AtomicU64,
    pub(crate) db_down: AtomicBool,
    /// The database's epoch counter: read by a poll that found nothing new, at least the
    /// epoch of the rows a poll or a write of this root brought in.
    pub(crate) db_epoch: AtomicU64,
    /// Set once the database's epoch was seen below the root's, until the root restarts:
    /// writes made since may pass the root's epoch, and the changes below it stay unseen.
    pub(crate) db_went_back: AtomicBool,
    pub(crate) polls: AtomicU64,
    pub(crate) quota_writes: AtomicU64,
    pub(crate) admin_refused: AtomicU64,
    /// Refused requests by (route, reason, status); every key is a `'static` label from a
    /// fixed set, so the series stay bounded.
    refused: Mutex<BTreeMap<(&'static str, &'static str, u16), u64>>,
}

/// Connections closed at once because the server held its maximum.
static REFUSED_CONNECTIONS: AtomicU64 = AtomicU64::new(0);

pub(crate) fn note_refused_connection() {
    REFUSED_CONNECTIONS.fetch_add(1, Relaxed);
}

/// Gauges read from the root state at scrape time.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    pub stats: RootStats,
    pub limiters: usize,
    pub quotas: usize,
    pub counters: usize,
    pub parked: usize,
    /// Keys (counters of names under templates) held.
    pub keys: usize,
    /// Per live template: name, keys held, keys refused since the start.
    pub templates: Vec<(String, usize, u64)>,
    /// Per concurrency counter with a holder: the quota's name (`None` for a key) and its
    /// escrow's figures.
    pub in_flight: Vec<(Option<String>, EscrowStats)>,
    pub epoch: u64,
    /// States the counters are split into (`--stripes`).
    pub stripes: usize,
}

impl Metrics {
    /// Records one refused request.
    pub(crate) fn refused(&self, route: &'static str, reason: &'static str, status: u16) {
        *self.refused.lock().entry((route, reason, status)).or_default() += 1;
        match route {
            "sync" => &self.sync_refused,
            "batch" | "list" | "put" | "get" | "delete" => &self.admin_refused,
            _ => return,
        }
        .fetch_add(1, Relaxed);
    }

    /// Records one answered sync request: `waited` from its arrival to the start of its
    /// decoding, then `took` to decode, apply and encode it.
    pub(crate) fn sync_done(&self, waited: Duration, took: Duration) {
        self.sync_ok.fetch_add(1, Relaxed);
        self.sync_wait.observe(waited);
        self.sync_work.observe(took);
    }

    /// Records one hold of the root state's lock: `waited` for it, then `held` it.
    pub(crate) fn lock_used(&self, waited: Duration, held: Duration) {
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.lock_wait_ns.fetch_add(ns(waited), Relaxed);
        self.lock_held_ns.fetch_add(ns(held), Relaxed);
    }

    pub(crate) fn render(&self, s: &Snapshot, store: &str) -> String {
        let mut o = String::with_capacity(4096);
        let mut counter = |name: &str, help: &str, v: u64| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        };
        counter(
            "yarl_root_deltas_applied_total",
            "Delta entries added to counters.",
            s.stats.deltas_applied,
        );
        counter(
            "yarl_root_deltas_unknown_total",
            "Delta entries for quotas this root does not know (dropped).",
            s.stats.deltas_unknown,
        );
        counter(
            "yarl_root_deltas_held_total",
            "Delta entries held for a quota above every id this root has read (created \
             through another root moments ago): applied if it arrives within 10 s.",
            s.stats.deltas_held,
        );
        counter(
            "yarl_root_deltas_foreign_total",
            "Delta entries and hints for counters of another shard (skipped): a limiter with \
             another shard map.",
            s.stats.deltas_foreign,
        );
        counter(
            "yarl_root_duplicate_batches_total",
            "Delta batches skipped because they were applied before (retries).",
            s.stats.duplicate_batches,
        );
        counter(
            "yarl_root_resets_total",
            "Quota resets (POST /v1/quotas/NAME:reset) this root applied to its counters.",
            s.stats.resets,
        );
        counter(
            "yarl_root_dropped_before_reset_total",
            "Delta entries and hints dropped because they were counted before their quota's \
             last reset.",
            s.stats.dropped_before_reset,
        );
        counter(
            "yarl_root_interest_answers_total",
            "Answers by interest: only the counters the limiter named lately.",
            s.stats.interest_answers,
        );
        counter(
            "yarl_root_interest_full_total",
            "Syncs that asked for answers by interest but got every changed counter: the \
             session's or the root's interest was full.",
            s.stats.interest_full,
        );
        counter(
            "yarl_root_hints_applied_total",
            "Limiter hints that raised a counter.",
            s.stats.hints_applied,
        );
        counter(
            "yarl_root_hints_added_total",
            "Of those, hints from a limiter's view older than this root, added on top of what \
             it counted itself.",
            s.stats.hints_added,
        );
        counter(
            "yarl_root_claims_parked_total",
            "Admitted amounts above a counter's ceiling, parked with the limiter that sent them.",
            s.stats.claims_parked,
        );
        counter(
            "yarl_root_claims_dropped_total",
            "Parked amounts dropped: the limiter or the root held too many.",
            s.stats.claims_dropped,
        );
        counter(
            "yarl_root_demand_capped_total",
            "Delta entries whose attempted amount was cut for the demand meter.",
            s.stats.rejected_capped,
        );
        counter(
            "yarl_root_hints_capped_total",
            "Hints cut at a counter's ceiling.",
            s.stats.hints_capped,
        );
        counter(
            "yarl_root_hints_late_total",
            "Hints refused: sent more than the hint window after this root's first sync.",
            s.stats.hints_late,
        );
        counter(
            "yarl_root_hints_redundant_total",
            "Hints not taken: their limiter knows this root's instance and dropped none of its batches, so they could restore nothing.",
            s.stats.hints_redundant,
        );
        counter(
            "yarl_root_late_credited_total",
            "Units credited with drain their counter spent at zero: of late batches (counted while a limiter could not reach this root, or before a restart of this root), and of any batch whose limiter says they had drained before they arrived.",
            s.stats.late_credited / 1000,
        );
        counter(
            "yarl_root_late_credit_taken_back_total",
            "Units of that credit taken back by hints from views before this root's restart: their counter never emptied.",
            s.stats.late_credit_taken_back / 1000,
        );
        counter(
            "yarl_root_late_dropped_total",
            "Units of late batches dropped above their counter's low_burst instead of parked.",
            s.stats.late_dropped / 1000,
        );
        counter(
            "yarl_root_keys_created_total",
            "Keys (names under templates) this root started counting.",
            s.stats.keys_created,
        );
        counter(
            "yarl_root_keys_refused_total",
            "Keys refused because a template or the root held the most keys it may.",
            s.stats.keys_refused,
        );
        counter(
            "yarl_root_limiters_evicted_total",
            "Limiter sessions forgotten to make room (table or address budget full).",
            s.stats.limiters_evicted,
        );
        counter(
            "yarl_root_sessions_created_total",
            "Limiter sessions started (a limiter id this root did not know).",
            s.stats.sessions_created,
        );
        counter(
            "yarl_root_syncs_applied_total",
            "Syncs applied to the root's state, including those whose caller gave up before \
             the answer was written.",
            s.stats.syncs,
        );
        counter(
            "yarl_root_first_contacts_total",
            "Syncs without this root's current instance, answered with every counter.",
            s.stats.first_contacts,
        );
        counter(
            "yarl_root_quotas_sent_total",
            "Quotas and tombstones sent to limiters.",
            s.stats.quotas_sent,
        );
        counter(
            "yarl_root_db_errors_total",
            "Failed quota database operations.",
            self.db_errors.load(Relaxed),
        );
        counter(
            "yarl_root_db_polls_total",
            "Successful polls of the quota database.",
            self.polls.load(Relaxed),
        );
        counter(
            "yarl_root_quota_writes_total",
            "Quotas created, replaced or deleted through this root.",
            self.quota_writes.load(Relaxed),
        );
        counter(
            "yarl_root_admin_refused_total",
            "Admin requests answered with an error.",
            self.admin_refused.load(Relaxed),
        );

        let mut gauge = |name: &str, help: &str, v: u64| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        gauge("yarl_root_limiters", "Limiters currently tracked.", s.limiters as u64);
        gauge("yarl_root_quotas", "Live quotas held in memory.", s.quotas as u64);
        gauge("yarl_root_counters", "Non-empty counters held.", s.counters as u64);
        gauge("yarl_root_keys", "Keys (names under templates) held.", s.keys as u64);
        gauge("yarl_root_parked_claims", "Parked claims held.", s.parked as u64);
        gauge("yarl_root_epoch", "Highest quota epoch held.", s.epoch);
        gauge(
            "yarl_root_state_stripes",
            "States the counters are split into, each behind its own lock (--stripes).",
            s.stripes as u64,
        );
        gauge(
            "yarl_root_db_epoch",
            "The quota database's epoch as the root last saw it: below yarl_root_epoch, the database was recreated or restored to an earlier state, and changes made since are not polled.",
            self.db_epoch.load(Relaxed),
        );
        gauge(
            "yarl_root_db_went_back",
            "1 once the quota database's epoch was seen below this root's (recreated or restored to an earlier state), until the root restarts: changes made since may be unseen.",
            u64::from(self.db_went_back.load(Relaxed)),
        );
        gauge(
            "yarl_root_db_up",
            "1 if the last quota database operation succeeded.",
            u64::from(!self.db_down.load(Relaxed)),
        );

        render_templates(&mut o, &s.templates);
        render_in_flight(&mut o, &s.in_flight);

        let ok = self.sync_ok.load(Relaxed);
        let refused = self.sync_refused.load(Relaxed);
        let _ = writeln!(
            o,
            "# HELP yarl_root_sync_requests_total Sync requests, by result.\n\
             # TYPE yarl_root_sync_requests_total counter\n\
             yarl_root_sync_requests_total{{result=\"ok\"}} {ok}\n\
             yarl_root_sync_requests_total{{result=\"refused\"}} {refused}"
        );
        self.sync_work.render(
            &mut o,
            "yarl_root_sync_duration_seconds",
            "Time to decode, apply and encode an answered sync request (without its wait).",
        );
        self.sync_wait.render(
            &mut o,
            "yarl_root_sync_wait_seconds",
            "Time from an answered sync request's arrival to the start of its decoding: \
             reading its body and waiting for its turn. Grows first when a root is near full.",
        );
        let secs = |a: &AtomicU64| a.load(Relaxed) as f64 / 1e9;
        let _ = writeln!(
            o,
            "# HELP yarl_root_state_lock_held_seconds_total Time the root state's locks were \
             held (syncs, sweeps, quota applies, scrapes), summed over its stripes. Its rate \
             divided by yarl_root_state_stripes is the busy fraction of the root's serial \
             part: near 1, this root is at capacity however many cores it has (add stripes \
             up to its cores, then a shard).\n\
             # TYPE yarl_root_state_lock_held_seconds_total counter\n\
             yarl_root_state_lock_held_seconds_total {}\n\
             # HELP yarl_root_state_lock_wait_seconds_total Time spent waiting for the root \
             state's locks, summed over their holders.\n\
             # TYPE yarl_root_state_lock_wait_seconds_total counter\n\
             yarl_root_state_lock_wait_seconds_total {}",
            secs(&self.lock_held_ns),
            secs(&self.lock_wait_ns)
        );
        let _ = writeln!(
            o,
            "# HELP yarl_root_refused_total Requests refused, by route, reason and status.\n\
             # TYPE yarl_root_refused_total counter"
        );
        for ((route, reason, status), n) in self.refused.lock().iter() {
            let _ = writeln!(
                o,
                "yarl_root_refused_total{{route=\"{route}\",reason=\"{reason}\",status=\"{status}\"}} {n}"
            );
        }
        let _ = writeln!(
            o,
            "# HELP yarl_root_connections_refused_total Connections closed at once: the server, or the connection's address, held its maximum.\n\
             # TYPE yarl_root_connections_refused_total counter\n\
             yarl_root_connections_refused_total {}",
            REFUSED_CONNECTIONS.load(Relaxed)
        );
        let _ = writeln!(
            o,
            "# HELP yarl_root_info The database kind.\n# TYPE yarl_root_info gauge\nyarl_root_info{{db=\"{store}\"}} 1"
        );
        o
    }
}

/// Templates named in the per-template series; the rest are summed as `template="_other"`.
pub(crate) const TOP_TEMPLATES: usize = 20;

/// Keys held and refused per template, for the [`TOP_TEMPLATES`] templates holding most
/// keys and the rest together: a label per template, none per key, and a bounded number
/// whatever an operator creates. Template names need no escaping in a label (their
/// characters are `A-Za-z0-9._:@-%*`).
fn render_templates(o: &mut String, templates: &[(String, usize, u64)]) {
    let mut by_keys: Vec<&(String, usize, u64)> = templates.iter().collect();
    by_keys.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let (top, rest) = by_keys.split_at(by_keys.len().min(TOP_TEMPLATES));
    let other = (rest.iter().map(|t| t.1).sum::<usize>(), rest.iter().map(|t| t.2).sum::<u64>());
    let rows = top
        .iter()
        .map(|t| (t.0.as_str(), t.1, t.2))
        .chain((!rest.is_empty()).then_some(("_other", other.0, other.1)));
    let rows: Vec<(&str, usize, u64)> = rows.collect();
    let _ = writeln!(
        o,
        "# HELP yarl_root_template_keys Keys held per template ({TOP_TEMPLATES} templates with most, then _other).\n\
         # TYPE yarl_root_template_keys gauge"
    );
    for (name, held, _) in &rows {
        let _ = writeln!(o, "yarl_root_template_keys{{template=\"{name}\"}} {held}");
    }
    // A counter has no `_other`: which templates are named changes, and the rest would go
    // down whenever one joined them. The total is yarl_root_keys_refused_total.
    let _ = writeln!(
        o,
        "# HELP yarl_root_template_keys_refused_total Keys refused per template (a bound was reached), for the {TOP_TEMPLATES} templates with most keys (every template together: yarl_root_keys_refused_total).\n\
         # TYPE yarl_root_template_keys_refused_total counter"
    );
    for (name, _, refused) in &rows[..top.len()] {
        let _ =
            writeln!(o, "yarl_root_template_keys_refused_total{{template=\"{name}\"}} {refused}");
    }
}

/// Concurrency quotas named in the per-quota series; the rest, and every key, are summed
/// as `quota="_other"`.
pub(crate) const TOP_IN_FLIGHT: usize = 20;

/// This root's escrow of each concurrency quota (its part of `max_in_flight`, what it
/// counts as granted, the limiters holding a share, what they run and want), for the
/// [`TOP_IN_FLIGHT`] quotas with the largest parts and the rest together: a label per
/// quota, none per key. Nothing at all (not even the help) on a root no limiter has
/// reported a concurrency quota to: a family without series is noise to a scraper.
fn render_in_flight(o: &mut String, rows: &[(Option<String>, EscrowStats)]) {
    if rows.is_empty() {
        return;
    }
    let mut named: Vec<(&str, &EscrowStats)> =
        rows.iter().filter_map(|(n, s)| n.as_deref().map(|n| (n, s))).collect();
    named.sort_by(|a, b| b.1.part.cmp(&a.1.part).then_with(|| a.0.cmp(b.0)));
    let top = named.len().min(TOP_IN_FLIGHT);
    let mut other = EscrowStats::default();
    let mut others = 0;
    let shown: std::collections::HashSet<&str> = named[..top].iter().map(|r| r.0).collect();
    for (name, s) in rows {
        if name.as_deref().is_some_and(|n| shown.contains(n)) {
            continue;
        }
        others += 1;
        other.part += s.part;
        other.reserved += s.reserved;
        other.holders += s.holders;
        other.in_flight += s.in_flight;
        other.wanted += s.wanted;
    }
    let series: Vec<(&str, &EscrowStats)> =
        named[..top].iter().copied().chain((others > 0).then_some(("_other", &other))).collect();
    type Figure = fn(&EscrowStats) -> f64;
    let figures: [(&str, &str, Figure); 5] = [
        (
            "yarl_root_in_flight_part",
            "This root's part of the quota's max_in_flight (--replica).",
            |s| f64::from(s.part),
        ),
        (
            "yarl_root_in_flight_granted",
            "Slots of the part this root counts as granted to limiters.",
            |s| s.reserved as f64,
        ),
        ("yarl_root_in_flight_holders", "Limiters holding an unexpired share.", |s| {
            s.holders as f64
        }),
        ("yarl_root_in_flight", "Requests in flight, as the holders last reported.", |s| {
            s.in_flight as f64
        }),
        (
            "yarl_root_in_flight_demand",
            "Concurrency the holders were offered (slots), as last reported.",
            |s| s.wanted as f64 / 1000.0,
        ),
    ];
    for (metric, help, value) in figures {
        let _ = writeln!(
            o,
            "# HELP {metric} {help} Per concurrency quota ({TOP_IN_FLIGHT} with the largest parts, then _other, keys included).\n# TYPE {metric} gauge"
        );
        for (name, s) in &series {
            let _ = writeln!(o, "{metric}{{quota=\"{name}\"}} {}", value(s));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_histogram_is_cumulative_and_ends_at_its_count() {
        let h = Histogram::default();
        for us in [50, 50, 300, 2_000, 2_000_000] {
            h.observe(Duration::from_micros(us));
        }
        let mut o = String::new();
        h.render(&mut o, "x", "help");
        let values: Vec<u64> = o
            .lines()
            .filter(|l| l.starts_with("x_bucket"))
            .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
            .collect();
        assert_eq!(values, [2, 2, 3, 3, 4, 4, 4, 4, 4, 4, 4, 4, 5]);
        assert!(o.contains("x_count 5\n"));
        assert!(o.contains("x_sum 2.0024\n"), "{o}");
    }

    #[test]
    fn in_flight_quotas_beyond_the_top_and_keys_are_summed_as_other() {
        let stats =
            |part| EscrowStats { part, reserved: 2, holders: 1, in_flight: 1, wanted: 1500 };
        let mut rows: Vec<(Option<String>, EscrowStats)> = (0..TOP_IN_FLIGHT as u32 + 3)
            .map(|i| (Some(format!("q{i:02}")), stats(10 + i)))
            .collect();
        rows.push((None, stats(4)));
        rows.push((None, stats(4)));
        let mut o = String::new();
        render_in_flight(&mut o, &rows);
        let parts: Vec<&str> =
            o.lines().filter(|l| l.starts_with("yarl_root_in_flight_part{")).collect();
        assert_eq!(parts.len(), TOP_IN_FLIGHT + 1, "{o}");
        assert_eq!(parts[0], "yarl_root_in_flight_part{quota=\"q22\"} 32");
        // q00..q02 (10 + 11 + 12) and two keys (4 + 4).
        assert_eq!(parts[TOP_IN_FLIGHT], "yarl_root_in_flight_part{quota=\"_other\"} 41");
        assert!(o.contains("yarl_root_in_flight_demand{quota=\"_other\"} 7.5\n"), "{o}");
        let mut none = String::new();
        render_in_flight(&mut none, &[]);
        assert_eq!(none, "", "nothing without concurrency quotas");
    }

    #[test]
    fn templates_beyond_the_top_are_summed_as_other_in_gauges_only() {
        let many: Vec<(String, usize, u64)> =
            (0..TOP_TEMPLATES + 5).map(|i| (format!("t{i:02}_*"), i, 1)).collect();
        let mut o = String::new();
        render_templates(&mut o, &many);
        let keys: Vec<&str> =
            o.lines().filter(|l| l.starts_with("yarl_root_template_keys{")).collect();
        assert_eq!(keys.len(), TOP_TEMPLATES + 1, "{o}");
        assert_eq!(keys[0], format!("yarl_root_template_keys{{template=\"t24_*\"}} 24"));
        // t00..t04 hold the fewest: 0 + 1 + 2 + 3 + 4 keys, 5 refusals.
        assert_eq!(keys[TOP_TEMPLATES], "yarl_root_template_keys{template=\"_other\"} 10");
        assert!(!o.contains("yarl_root_template_keys_refused_total{template=\"_other\"}"), "{o}");
        let refused = o.lines().filter(|l| l.starts_with("yarl_root_template_keys_refused_total{"));
        assert_eq!(refused.count(), TOP_TEMPLATES);
        let mut none = String::new();
        render_templates(&mut none, &[]);
        assert!(!none.contains("{template="), "no series without templates: {none}");
    }
}
